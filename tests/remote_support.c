/*
 * The remote suites' shared fixtures (remote_support.h).
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "remote_support.h"
#include "support.h"

ctxs_store *ts_store_at(const char *name)
{
    return ts_store_open(ts_path(ts_scratch, name));
}

static ctxs_remote *remote_open(ctxs_store *st, const char *url, const ctxs_remote_options *o)
{
    ctxs_remote *r = NULL;
    int rc = ctxs_remote_open(&r, st, url, o);
    cr_assert_eq(rc, 0, "ctxs_remote_open(%s): %s (%s)", url, ctxs_err_name(rc),
                 ctxs_get_last_error());
    return r;
}

ctxs_remote *ts_remote_open(ctxs_store *st, const char *url, uint32_t push_on_commit,
                            uint32_t pull_on_open)
{
    ctxs_remote_options o = CTXS_REMOTE_OPTIONS_INIT;
    o.push_on_commit = push_on_commit;
    o.pull_on_open = pull_on_open;
    o.timeout_ms = 2000;
    o.retries = 3;
    o.backoff_ms = 5;
    return remote_open(st, url, &o);
}

ctxs_remote *ts_remote_open_tuned(ctxs_store *st, const char *url, uint32_t timeout_ms,
                                  uint32_t retries, uint32_t backoff_ms, uint32_t queue_max)
{
    ctxs_remote_options o = CTXS_REMOTE_OPTIONS_INIT;
    o.timeout_ms = timeout_ms;
    o.retries = retries;
    o.backoff_ms = backoff_ms;
    o.queue_max = queue_max;
    return remote_open(st, url, &o);
}

void ts_assert_same_stored(const ctxs_session *a, const ctxs_session *b, uint64_t n, int kv)
{
    ctxs_session_info ia;
    cr_assert_eq(ctxs_session_get_info(&ia, a), 0);
    uint32_t dt = ia.model.geometry.dtype;
    size_t tb = ctxs_geometry_get_token_bytes(&ia.model.geometry, dt);
    cr_assert(tb > 0);
    uint8_t *ka = malloc(tb), *va = malloc(tb), *kb = malloc(tb), *vb = malloc(tb);
    cr_assert(ka && va && kb && vb);
    for (uint64_t p = 0; p < n; p++) {
        uint32_t ida, idb;
        cr_assert_eq(ctxs_session_get_tokens(&ida, a, p, 1), 0);
        cr_assert_eq(ctxs_session_get_tokens(&idb, b, p, 1), 0);
        cr_assert_eq(ida, idb, "id at %llu", (unsigned long long)p);
        if (!kv)
            continue;
        cr_assert_eq(ctxs_session_read_token(ka, va, a, p, dt), 0);
        cr_assert_eq(ctxs_session_read_token(kb, vb, b, p, dt), 0);
        cr_assert(memcmp(ka, kb, tb) == 0 && memcmp(va, vb, tb) == 0, "KV at %llu of %llu",
                  (unsigned long long)p, (unsigned long long)n);
    }
    free(ka);
    free(va);
    free(kb);
    free(vb);
}

ts_fleet ts_fleet_start(int remotes, uint32_t pull_on_open)
{
    ts_fleet f;
    memset(&f, 0, sizeof(f));
    ts_redis_start(&f.rs, NULL, 0);
    f.a = ts_store_at("a");
    f.b = ts_store_at("b");
    if (remotes) {
        f.ra = ts_remote_open(f.a, f.rs.url, 0, pull_on_open);
        f.rb = ts_remote_open(f.b, f.rs.url, 0, pull_on_open);
    }
    return f;
}

void ts_fleet_stop(ts_fleet *f)
{
    ctxs_remote_close(NULL, f->ra, TS_FLUSH_MS);
    ctxs_remote_close(NULL, f->rb, TS_FLUSH_MS);
    ctxs_store_close(f->a);
    ctxs_store_close(f->b);
    ts_redis_stop(&f->rs);
    memset(f, 0, sizeof(*f));
}
