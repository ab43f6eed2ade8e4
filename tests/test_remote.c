/*
 * The remote tier against a real redis-server on 127.0.0.1
 * (tests/redis_server.c), with two stores in two directories as two
 * machines. No timing assertions: every wait is a bounded flush, and
 * what a test checks is what was stored and what came back.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "ctxstore.h"
#include "index.h"
#include "remote_format.h"
#include "remote_support.h"
#include "support.h"

TestSuite(remote, .init = ts_scratch_init, .fini = ts_scratch_fini, .timeout = 120);

/* Commits n tokens from the session's end in commits of step: those of
 * ts_append() below fork_at, and from fork_at on, where seed is set,
 * ts_pat_append()'s of generation seed (other ids and K/V), so that
 * sessions built with another seed share exactly their first fork_at
 * tokens. */
static void append_seeded(ctxs_session *s, uint64_t n, uint32_t step, uint64_t fork_at,
                          uint32_t seed)
{
    for (uint64_t done = 0; done < n;) {
        uint64_t pos = ts_n_tokens(s);
        uint32_t m = (uint32_t)(n - done < step ? n - done : step);
        if (seed && pos < fork_at && pos + m > fork_at)
            m = (uint32_t)(fork_at - pos); /* one kind of token a commit */
        int rc = seed && pos >= fork_at ? ts_pat_append(s, m, seed, NULL) : ts_append(s, m);
        cr_assert_eq(rc, 0, "commit: %s", ctxs_err_name(rc));
        done += m;
    }
}

static ctxs_session *make_session(ctxs_store *st, const char *name, const ctxs_model *m,
                                  uint64_t n, uint32_t step, uint64_t fork_at, uint32_t seed)
{
    ctxs_create_options o = ts_options(8192, 4, 0, CTXS_SYNC_NONE);
    ctxs_session *s = NULL;
    ctxs_model_entry known;
    if (ctxs_model_get(&known, st, m->model_hash) == CTXS_ENOTFOUND)
        cr_assert_eq(ctxs_model_register(st, m, NULL), 0);
    int rc = ctxs_store_session_create(&s, st, name, m, &o);
    cr_assert_eq(rc, 0, "create %s: %s", name, ctxs_err_name(rc));
    append_seeded(s, n, step, fork_at, seed);
    return s;
}

static ctxs_session *open_ro(ctxs_store *st, const char *name)
{
    ctxs_session *s = NULL;
    int rc = ctxs_store_session_open(&s, st, name, NULL, CTXS_RDONLY, NULL);
    cr_assert_eq(rc, 0, "open %s: %s", name, ctxs_err_name(rc));
    return s;
}

/* The Redis key of chunk k (0-based) of ids under model m. */
static void key_of_chunk(char *key, size_t cap, const ctxs_model *m, const uint32_t *ids,
                         uint64_t k)
{
    uint8_t(*chain)[16] = malloc((k + 1) * 16);
    ctxs__prefix_chains(chain, ids, k + 1);
    char mh[33], ch[33];
    for (int i = 0; i < 16; i++) {
        snprintf(mh + 2 * i, 3, "%02x", m->model_hash[i]);
        snprintf(ch + 2 * i, 3, "%02x", chain[k][i]);
    }
    static const char *dt[] = {"", "f16", "bf16", "q8"};
    snprintf(key, cap, "ctxs:chunk:%s:%s-%ux%ux%u:%s", mh, dt[m->geometry.dtype],
             m->geometry.n_layers, m->geometry.n_kv_heads, m->geometry.head_dim, ch);
    free(chain);
}

static uint32_t *ids_of(const ctxs_session *s, uint64_t n)
{
    uint32_t *ids = malloc(n * 4 + 4);
    cr_assert_eq(ctxs_session_get_tokens(ids, s, 0, (uint32_t)n), 0);
    return ids;
}

/* A session pushed by its commits and close in store A comes back
 * bit-identical in store B, tail included. */
static void round_trip(uint32_t dtype)
{
    ts_fleet f = ts_fleet_start(0, 1);
    ctxs_model m = ts_model(1);
    m.geometry.dtype = dtype;
    f.ra = ts_remote_open(f.a, f.rs.url, 1, 1);
    ctxs_session *s = make_session(f.a, "chat", &m, 200, 50, 0, 0);
    ctxs_session_close(s);
    ctxs_remote_stats stats;
    cr_assert_eq(ctxs_remote_close(&stats, f.ra, TS_FLUSH_MS), 0);
    f.ra = NULL;
    f.ra = NULL;
    cr_assert_eq(stats.chunks_dropped, 0);
    cr_assert_eq(stats.chunks_pushed, 4, "3 whole chunks and the tail: %llu",
                 (unsigned long long)stats.chunks_pushed);
    cr_assert_geq(stats.records_pushed, 1);

    f.rb = ts_remote_open(f.b, f.rs.url, 0, 1);
    ctxs_remote_pull_result res;
    ctxs_session *got = NULL;
    int rc = ctxs_remote_pull(&got, &res, f.rb, "chat", NULL, NULL, NULL);
    cr_assert_eq(rc, 0, "pull: %s", ctxs_err_name(rc));
    cr_assert_eq(res.n_tokens, 200);
    cr_assert_eq(res.remote_tokens, 200);
    cr_assert_eq(res.chunks_pulled, 4);
    cr_assert_eq(res.chunks_missing + res.chunks_refused + res.n_rest, 0);
    cr_assert_null(res.rest_ids);
    cr_assert(memcmp(&res.model, &m, sizeof(m)) == 0);
    cr_assert_eq(ts_n_tokens(got), 200);
    ctxs_session *src = open_ro(f.a, "chat");
    ts_assert_same_stored(src, got, 200, 1);
    if (dtype == CTXS_DTYPE_F16)
        cr_assert_eq(ts_check_all(got), 0);
    ctxs_session_close(src);
    ctxs_session_close(got);
    ts_fleet_stop(&f);
}

Test(remote, a_session_pushed_on_commit_resumes_bit_identical_elsewhere_f16)
{
    round_trip(CTXS_DTYPE_F16);
}

Test(remote, a_session_pushed_on_commit_resumes_bit_identical_elsewhere_q8)
{
    round_trip(CTXS_DTYPE_Q8);
}

Test(remote, a_session_made_before_the_remote_pushes_on_demand)
{
    ts_fleet f = ts_fleet_start(0, 1);
    ctxs_model m = ts_model(2);
    m.geometry.dtype = CTXS_DTYPE_BF16;
    ctxs_session_close(make_session(f.a, "old", &m, 150, 150, 0, 0));
    cr_assert_eq(ctxs_store_session_set_meta(f.a, "old", "title", "hello", 5), 0);
    f.ra = ts_remote_open(f.a, f.rs.url, 0, 1);
    ctxs_remote_push_result pr;
    cr_assert_eq(ctxs_remote_push(&pr, f.ra, "old", NULL), 0);
    cr_assert_eq(pr.n_tokens, 150);
    cr_assert_eq(pr.chunks_sent, 3);
    cr_assert_eq(pr.chunks_present, 0);
    /* Again: everything is there already. */
    cr_assert_eq(ctxs_remote_push(&pr, f.ra, "old", NULL), 0);
    cr_assert_eq(pr.chunks_sent, 0);
    cr_assert_eq(pr.chunks_present, 3);

    f.rb = ts_remote_open(f.b, f.rs.url, 0, 1);
    ctxs_remote_pull_result res;
    cr_assert_eq(ctxs_remote_pull(NULL, &res, f.rb, "old", "new", NULL, NULL), 0);
    cr_assert_eq(res.n_tokens, 150);
    ctxs_session *src = open_ro(f.a, "old"), *got = open_ro(f.b, "new");
    ts_assert_same_stored(src, got, 150, 1);
    static char value[CTXS_META_VALUE_MAX];
    size_t vlen = sizeof(value);
    cr_assert_eq(ctxs_store_session_get_meta(value, &vlen, f.b, "new", "title"), 0);
    cr_assert_eq(vlen, 5);
    cr_assert(memcmp(value, "hello", 5) == 0);
    ctxs_session_close(src);
    ctxs_session_close(got);

    ctxs_remote_entry *e;
    size_t n;
    cr_assert_eq(ctxs_remote_list(&e, &n, f.rb), 0);
    cr_assert_eq(n, 1);
    cr_assert_str_eq(e[0].name, "old");
    cr_assert_eq(e[0].n_tokens, 150);
    cr_assert_eq(e[0].tail_pushed, 1);
    cr_assert_eq(e[0].status, 0);
    ctxs_free(e);
    ctxs_remote_info info;
    cr_assert_eq(ctxs_remote_get_info(&info, f.rb), 0);
    cr_assert_eq(info.keys, 4); /* 2 chunks, a tail, a record */
    cr_assert(info.server_version[0]);

    ts_fleet_stop(&f);
}

Test(remote, a_shared_system_prompt_is_stored_once)
{
    ts_fleet f = ts_fleet_start(0, 1);
    ctxs_model m = ts_model(3);
    ctxs_session_close(make_session(f.a, "x", &m, 192, 64, 128, 1));
    ctxs_session_close(make_session(f.a, "y", &m, 192, 64, 128, 2));
    f.ra = ts_remote_open(f.a, f.rs.url, 0, 1);
    ctxs_remote_push_result pr;
    cr_assert_eq(ctxs_remote_push(&pr, f.ra, "x", NULL), 0);
    cr_assert_eq(pr.chunks_sent, 3);
    cr_assert_eq(ctxs_remote_push(&pr, f.ra, "y", NULL), 0);
    cr_assert_eq(pr.chunks_sent, 1);
    cr_assert_eq(pr.chunks_present, 2);
    cr_assert_eq(ts_redis_count(&f.rs, "ctxs:chunk:*"), 4);
    cr_assert_eq(ts_redis_count(&f.rs, "ctxs:session:*"), 2);

    /* A prompt that shares the 2 chunks, then goes its own way. */
    ctxs_session *x = open_ro(f.a, "x");
    uint32_t whole[192], prompt[300];
    cr_assert_eq(ctxs_session_get_tokens(whole, x, 0, 192), 0);
    memcpy(prompt, whole, 128 * 4);
    for (int i = 128; i < 300; i++)
        prompt[i] = 7000000u + (uint32_t)i;
    f.rb = ts_remote_open(f.b, f.rs.url, 0, 1);
    ctxs_remote_pull_result res;
    ctxs_session *got;
    cr_assert_eq(ctxs_remote_pull_prefix(&got, &res, f.rb, "hit", &m, prompt, 300, NULL, NULL), 0);
    cr_assert_eq(res.n_tokens, 128);
    cr_assert_eq(res.remote_tokens, 300);
    cr_assert_eq(res.chunks_pulled, 2);
    cr_assert_eq(res.chunks_missing, 1);
    ts_assert_same_stored(x, got, 128, 1);
    ctxs_session_close(got);
    /* The whole of x, its tail-less end exactly at 192. */
    cr_assert_eq(ctxs_remote_pull_prefix(NULL, &res, f.rb, "all", &m, whole, 192, NULL, NULL), 0);
    cr_assert_eq(res.n_tokens, 192);
    /* Taken locally: CTXS_ETAKEN, before any traffic. */
    cr_assert_eq(ctxs_remote_pull_prefix(NULL, &res, f.rb, "all", &m, whole, 192, NULL, NULL),
                 CTXS_ETAKEN);
    cr_assert_eq(ctxs_remote_pull(NULL, &res, f.rb, "x", "all", NULL, NULL), CTXS_ETAKEN);
    /* Nothing shared: no session. */
    uint32_t other[64];
    for (int i = 0; i < 64; i++)
        other[i] = 9000000u + (uint32_t)i;
    cr_assert_eq(ctxs_remote_pull_prefix(NULL, &res, f.rb, "none", &m, other, 64, NULL, NULL),
                 CTXS_ENOTFOUND);
    ctxs_session_entry e;
    cr_assert_eq(ctxs_store_session_get(&e, f.b, "none"), CTXS_ENOTFOUND);
    cr_assert_eq(ctxs_remote_pull(NULL, &res, f.rb, "nobody", NULL, NULL, NULL),
                 CTXS_ENOTFOUND);
    ctxs_session_close(x);
    ts_fleet_stop(&f);
}

/* Pushes "c" (320 tokens: 5 chunks) and returns its ids. */
static uint32_t *pushed_session(ts_fleet *f, const ctxs_model *m)
{
    ctxs_session_close(make_session(f->a, "c", m, 320, 320, 0, 0));
    ctxs_remote *ra = ts_remote_open(f->a, f->rs.url, 0, 1);
    cr_assert_eq(ctxs_remote_push(NULL, ra, "c", NULL), 0);
    ctxs_remote_close(NULL, ra, TS_FLUSH_MS);
    ctxs_session *s = open_ro(f->a, "c");
    uint32_t *ids = ids_of(s, 320);
    ctxs_session_close(s);
    return ids;
}

/* Pulls "c" as local, expecting it to stop before chunk 2 (refused). */
static void pull_stops_at_chunk_2(ts_fleet *f, const char *local, const uint32_t *ids)
{
    ctxs_remote *rb = ts_remote_open(f->b, f->rs.url, 0, 1);
    ctxs_remote_pull_result res;
    ctxs_session *got;
    int rc = ctxs_remote_pull(&got, &res, rb, "c", local, NULL, NULL);
    cr_assert_eq(rc, 0, "pull: %s", ctxs_err_name(rc));
    cr_assert_eq(res.n_tokens, 128);
    cr_assert_eq(res.chunks_pulled, 2);
    cr_assert_eq(res.chunks_refused, 1);
    cr_assert_eq(res.chunks_missing, 0);
    cr_assert_eq(res.n_rest, 320 - 128);
    cr_assert(memcmp(res.rest_ids, ids + 128, (320 - 128) * 4) == 0);
    ctxs_free(res.rest_ids);
    cr_assert_eq(ts_n_tokens(got), 128);
    ctxs_session *src = open_ro(f->a, "c");
    ts_assert_same_stored(src, got, 128, 1);
    ctxs_session_close(src);
    ctxs_session_close(got);
    ctxs_remote_close(NULL, rb, TS_FLUSH_MS);
}

Test(remote, a_chunk_damaged_in_redis_is_refused)
{
    ts_fleet f = ts_fleet_start(0, 1);
    ctxs_model m = ts_model(4);
    uint32_t *ids = pushed_session(&f, &m);
    char key[256];
    key_of_chunk(key, sizeof(key), &m, ids, 2);
    size_t len;
    void *good = ts_redis_get(&f.rs, key, &len);
    cr_assert_not_null(good, "chunk 2 is not in Redis");

    /* One byte of the KV. */
    char off[16];
    snprintf(off, sizeof(off), "%u", CTXS__RCHUNK_HEADER_BYTES + 12 * 64 + 5);
    free(ts_redis_cmd(&f.rs, "SETRANGE", key, off, "\x7f", NULL));
    pull_stops_at_chunk_2(&f, "kv", ids);

    /* One byte of the header (first_pos). */
    ts_redis_set(&f.rs, key, good, len);
    free(ts_redis_cmd(&f.rs, "SETRANGE", key, "40", "\x01", NULL));
    pull_stops_at_chunk_2(&f, "header", ids);

    /* One byte of a token's checksum, then of a token id: the payload
     * has no CRC, the checksums and the chain catch these. */
    snprintf(off, sizeof(off), "%u", CTXS__RCHUNK_HEADER_BYTES + 8 * 17 + 3);
    ts_redis_set(&f.rs, key, good, len);
    free(ts_redis_cmd(&f.rs, "SETRANGE", key, off, "\x5a", NULL));
    pull_stops_at_chunk_2(&f, "sum", ids);
    snprintf(off, sizeof(off), "%u", CTXS__RCHUNK_HEADER_BYTES + 8 * 64 + 4 * 40 + 1);
    ts_redis_set(&f.rs, key, good, len);
    free(ts_redis_cmd(&f.rs, "SETRANGE", key, off, "\x5a", NULL));
    pull_stops_at_chunk_2(&f, "id", ids);

    /* A reserved byte of the header, its CRC made good again. */
    {
        uint8_t *bad = malloc(len);
        cr_assert_not_null(bad);
        memcpy(bad, good, len);
        ctxs__rchunk_header h;
        memcpy(&h, bad, sizeof(h));
        h.reserved[0] = 1;
        h.crc32 = (uint32_t)crc32(0L, (const Bytef *)&h, offsetof(ctxs__rchunk_header, crc32));
        memcpy(bad, &h, sizeof(h));
        ts_redis_set(&f.rs, key, bad, len);
        pull_stops_at_chunk_2(&f, "reserved", ids);
        free(bad);
    }

    /* Cut short by a byte. */
    ts_redis_set(&f.rs, key, good, len - 1);
    pull_stops_at_chunk_2(&f, "short", ids);

    /* Another chunk's value under this key (chunk 3's bytes: valid in
     * themselves, in the wrong place). */
    char key3[256];
    key_of_chunk(key3, sizeof(key3), &m, ids, 3);
    size_t len3;
    void *v3 = ts_redis_get(&f.rs, key3, &len3);
    cr_assert_not_null(v3);
    ts_redis_set(&f.rs, key, v3, len3);
    pull_stops_at_chunk_2(&f, "moved", ids);
    free(v3);
    free(good);
    free(ids);
    ts_fleet_stop(&f);
}

Test(remote, a_damaged_session_record_is_eremote)
{
    ts_fleet f = ts_fleet_start(0, 1);
    ctxs_model m = ts_model(5);
    free(pushed_session(&f, &m));
    f.rb = ts_remote_open(f.b, f.rs.url, 0, 1);
    /* In the ids (body CRC), then in the header (header CRC). */
    const char *offs[] = {"700", "70"};
    for (int i = 0; i < 2; i++) {
        free(ts_redis_cmd(&f.rs, "SETRANGE", "ctxs:session:c", offs[i], "\x55", NULL));
        ctxs_remote_pull_result res;
        cr_assert_eq(ctxs_remote_pull(NULL, &res, f.rb, "c", NULL, NULL, NULL), CTXS_EREMOTE);
        ctxs_session_entry e;
        cr_assert_eq(ctxs_store_session_get(&e, f.b, "c"), CTXS_ENOTFOUND);
    }
    ctxs_remote_entry *e;
    size_t n;
    cr_assert_eq(ctxs_remote_list(&e, &n, f.rb), 0);
    cr_assert_eq(n, 1);
    cr_assert_eq(e[0].status, CTXS_EREMOTE);
    ctxs_free(e);
    /* A key of another type under the prefix: listed as damaged, beside
     * the others, and its pull is a clear error. */
    free(ts_redis_cmd(&f.rs, "RPUSH", "ctxs:session:a list", "x", NULL));
    cr_assert_eq(ctxs_remote_list(&e, &n, f.rb), 0);
    cr_assert_eq(n, 2);
    cr_assert_str_eq(e[0].name, "a list");
    cr_assert_eq(e[0].status, CTXS_EREMOTE);
    cr_assert_str_eq(e[1].name, "c");
    ctxs_free(e);
    cr_assert_eq(ctxs_remote_pull(NULL, NULL, f.rb, "a list", NULL, NULL, NULL), CTXS_EREMOTE);
    /* Cut to a few bytes: still a clear error, no allocation from it. */
    free(ts_redis_cmd(&f.rs, "SET", "ctxs:session:c", "CTXSRSES", NULL));
    cr_assert_eq(ctxs_remote_pull(NULL, NULL, f.rb, "c", NULL, NULL, NULL), CTXS_EREMOTE);
    ts_fleet_stop(&f);
}

Test(remote, redis_killed_mid_push_loses_nothing_locally_and_never_a_partial_chunk)
{
    ts_fleet f = ts_fleet_start(0, 1);
    ctxs_model m = ts_model(6);
    m.geometry.head_dim = 128; /* chunks of 132 KiB */
    f.ra = ts_remote_open_tuned(f.a, f.rs.url, 500, 2, 1, CTXS_DEFAULT_REMOTE_QUEUE_MAX);
    ctxs_session *s = make_session(f.a, "big", &m, 1024, 64, 0, 0);
    ts_redis_kill(&f.rs); /* the queue is likely still pushing */
    append_seeded(s, 1024, 64, 0, 0); /* commits succeed all the same */
    ts_redis_restart(&f.rs);
    append_seeded(s, 1024, 64, 0, 0);
    cr_assert_eq(ts_check_all(s), 0);
    cr_assert_eq(ts_n_tokens(s), 3072);
    ctxs_session_close(s);
    ctxs_remote_stats st;
    ctxs_remote_flush(&st, f.ra, TS_FLUSH_MS);

    /* Whatever Redis holds now pulls as a verified prefix. */
    f.rb = ts_remote_open(f.b, f.rs.url, 0, 1);
    ctxs_remote_pull_result res;
    ctxs_session *got = NULL;
    int rc = ctxs_remote_pull(&got, &res, f.rb, "big", NULL, NULL, NULL);
    cr_assert(rc == 0 || rc == CTXS_ENOTFOUND, "pull: %s", ctxs_err_name(rc));
    ctxs_session *src = open_ro(f.a, "big");
    if (rc == 0) {
        cr_assert_eq(res.chunks_refused, 0);
        cr_assert_eq(res.n_tokens + res.n_rest, 3072);
        cr_assert_eq(ts_n_tokens(got), res.n_tokens);
        ts_assert_same_stored(src, got, res.n_tokens, 1);
        ctxs_free(res.rest_ids);
        ctxs_session_close(got);
        cr_assert_eq(ctxs_store_session_delete(f.b, "big"), 0);
    }
    /* A push completes it. */
    ctxs_remote_push_result pr;
    cr_assert_eq(ctxs_remote_push(&pr, f.ra, "big", NULL), 0);
    cr_assert_eq(pr.chunks_sent + pr.chunks_present, 48);
    cr_assert_eq(ctxs_remote_pull(&got, &res, f.rb, "big", NULL, NULL, NULL), 0);
    cr_assert_eq(res.n_tokens, 3072);
    ts_assert_same_stored(src, got, 3072, 1);
    ctxs_session_close(got);
    ctxs_session_close(src);
    ts_fleet_stop(&f);
}

Test(remote, commits_while_redis_is_down_succeed_and_count_what_was_dropped)
{
    ts_fleet f = ts_fleet_start(0, 1);
    ctxs_model m = ts_model(7);
    f.ra = ts_remote_open_tuned(f.a, f.rs.url, 200, 2, 1, CTXS_DEFAULT_REMOTE_QUEUE_MAX);
    ts_redis_kill(&f.rs);
    ctxs_session *s = make_session(f.a, "down", &m, 640, 64, 0, 0);
    ctxs_session_close(s);
    ctxs_remote_stats st;
    cr_assert_eq(ctxs_remote_flush(&st, f.ra, TS_FLUSH_MS), 0);
    cr_assert_gt(st.chunks_dropped, 0);
    cr_assert_gt(st.retries, 0);
    cr_assert_neq(st.last_error, 0);
    cr_assert_eq(st.chunks_pushed, 0);
    cr_assert_eq(st.connected, 0);
    s = open_ro(f.a, "down");
    cr_assert_eq(ts_check_all(s), 0);
    cr_assert_eq(ts_n_tokens(s), 640);
    ctxs_session_close(s);
    cr_assert_eq(ctxs_remote_close(&st, f.ra, TS_FLUSH_MS), 0);
    f.ra = NULL;
    ts_fleet_stop(&f);
}

Test(remote, eviction_gives_a_shorter_prefix_not_an_error)
{
    ts_fleet f = ts_fleet_start(0, 1);
    ctxs_model m = ts_model(8);
    m.geometry.head_dim = 128;
    ctxs_session_close(make_session(f.a, "e", &m, 4096, 512, 0, 0));
    free(ts_redis_cmd(&f.rs, "CONFIG", "SET", "maxmemory", "4mb", NULL));
    free(ts_redis_cmd(&f.rs, "CONFIG", "SET", "maxmemory-policy", "allkeys-lru", NULL));
    f.ra = ts_remote_open(f.a, f.rs.url, 0, 1);
    /* 64 chunks of 132 KiB: twice what fits. Redis evicts as it goes. */
    int rc = ctxs_remote_push(NULL, f.ra, "e", NULL);
    cr_assert_eq(rc, 0, "push: %s", ctxs_err_name(rc));
    ctxs_remote_info info;
    cr_assert_eq(ctxs_remote_get_info(&info, f.ra), 0);
    cr_assert_gt(info.evicted_keys, 0);
    cr_assert_str_eq(info.maxmemory_policy, "allkeys-lru");

    ctxs_session *src = open_ro(f.a, "e");
    uint32_t *ids = ids_of(src, 4096);
    f.rb = ts_remote_open(f.b, f.rs.url, 0, 1);
    ctxs_remote_pull_result res;
    ctxs_session *got = NULL;
    /* The record (written last) may survive or not; either way, no
     * error beyond "not found", and never a wrong token. */
    rc = ctxs_remote_pull(&got, &res, f.rb, "e", NULL, NULL, NULL);
    cr_assert(rc == 0 || rc == CTXS_ENOTFOUND, "pull: %s", ctxs_err_name(rc));
    if (rc == 0) {
        cr_assert_lt(res.n_tokens, 4096);
        cr_assert_eq(res.chunks_missing, 1);
        cr_assert_eq(res.chunks_refused, 0);
        ts_assert_same_stored(src, got, res.n_tokens, 1);
        ctxs_free(res.rest_ids);
        ctxs_session_close(got);
    }
    rc = ctxs_remote_pull_prefix(&got, &res, f.rb, "p", &m, ids, 4096, NULL, NULL);
    cr_assert(rc == 0 || rc == CTXS_ENOTFOUND, "pull_prefix: %s", ctxs_err_name(rc));
    if (rc == 0) {
        cr_assert_lt(res.n_tokens, 4096);
        ts_assert_same_stored(src, got, res.n_tokens, 1);
        ctxs_session_close(got);
    }
    free(ids);
    ctxs_session_close(src);
    ts_fleet_stop(&f);
}

Test(remote, a_wrong_or_missing_password_is_eacces)
{
    ts_redis rs;
    ts_redis_start(&rs, "s3cret", 0);
    ctxs_store *a = ts_store_at("a");
    ctxs_remote *r = NULL;
    char url[200];
    snprintf(url, sizeof(url), "redis://:wrong@127.0.0.1:%d", rs.port);
    cr_assert_eq(ctxs_remote_open(&r, a, url, NULL), -EACCES);
    cr_assert_null(r);
    cr_assert_eq(ctxs_remote_open(&r, a, rs.url_nopass, NULL), -EACCES);
    /* Percent-encoded, and as user "default". */
    snprintf(url, sizeof(url), "redis://default:s3%%63ret@127.0.0.1:%d/0", rs.port);
    cr_assert_eq(ctxs_remote_open(&r, a, url, NULL), 0);
    ctxs_remote *again;
    cr_assert_eq(ctxs_remote_open(&again, a, rs.url, NULL), CTXS_EBUSY);
    ctxs_remote_close(NULL, r, TS_FLUSH_MS);
    ctxs_store_close(a);
    ts_redis_stop(&rs);
}

/* A password sent to a server that has none is a configuration error of
 * the same kind as a wrong one (Redis 7: "ERR AUTH <password> called
 * without any password configured for the default user"). */
Test(remote, a_password_for_a_server_without_one_is_eacces)
{
    ts_fleet f = ts_fleet_start(0, 1);
    ctxs_remote *r = NULL;
    char url[200];
    snprintf(url, sizeof(url), "redis://:unneeded@127.0.0.1:%d", f.rs.port);
    cr_assert_eq(ctxs_remote_open(&r, f.a, url, NULL), -EACCES);
    cr_assert_null(r);
    ts_fleet_stop(&f);
}

Test(remote, an_unreachable_server_and_bad_urls_are_clear_errors)
{
    ts_redis rs;
    ts_redis_start(&rs, NULL, 0);
    ts_redis_kill(&rs); /* its port: nobody listens there now */
    ctxs_store *a = ts_store_at("a");
    ctxs_remote *r = NULL;
    cr_assert_eq(ctxs_remote_open(&r, a, rs.url, NULL), -ECONNREFUSED);
    const char *bad[] = {"rediss://127.0.0.1:6379", "http://x", "redis://", "redis://h:0",
                         "redis://h:99999", "redis://h/x", "unix://relative", "redis://:%zz@h"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_assert_eq(ctxs_remote_open(&r, a, bad[i], NULL), CTXS_EINVAL, "%s", bad[i]);
    ctxs_remote_options o = CTXS_REMOTE_OPTIONS_INIT;
    o.key_prefix = "a/b";
    cr_assert_eq(ctxs_remote_open(&r, a, rs.url, &o), CTXS_EINVAL);
    o.key_prefix = "a:session:b"; /* would share keys with prefix "a" */
    cr_assert_eq(ctxs_remote_open(&r, a, rs.url, &o), CTXS_EINVAL);
    ctxs_store_close(a);
    ts_redis_stop(&rs);
}

Test(remote, the_fixture_starts_and_restarts_a_server)
{
    ts_redis r;
    ts_redis_start(&r, NULL, 0);
    char *s = ts_redis_cmd(&r, "SET", "k", "v", NULL);
    cr_assert_str_eq(s, "OK");
    free(s);
    ts_redis_restart(&r);
    cr_assert_eq(ts_redis_count(&r, "*"), 0);
    ts_redis_stop(&r);
}

/* With a remote attached, opening a name the store lacks pulls it: the
 * conversation begun in store A opens in store B as it was; a name Redis
 * lacks, or a remote without pull_on_open, is CTXS_ENOTFOUND as without
 * a remote, and nothing is made. */
Test(remote, an_open_of_a_name_the_store_lacks_pulls_it)
{
    ts_fleet f = ts_fleet_start(0, 1);
    ctxs_model m = ts_model(1);
    f.ra = ts_remote_open(f.a, f.rs.url, 1, 1);
    ctxs_session_close(make_session(f.a, "chat", &m, 150, 40, 0, 0));
    cr_assert_eq(ctxs_remote_close(NULL, f.ra, TS_FLUSH_MS), 0);
    f.ra = NULL;

    ctxs_remote_options o = CTXS_REMOTE_OPTIONS_INIT;
    o.pull_on_open = 0;
    f.rb = NULL;
    cr_assert_eq(ctxs_remote_open(&f.rb, f.b, f.rs.url, &o), 0);
    ctxs_session *got = NULL;
    cr_assert_eq(ctxs_store_session_open(&got, f.b, "chat", &m, 0, NULL), CTXS_ENOTFOUND);
    cr_assert_eq(ctxs_remote_close(NULL, f.rb, TS_FLUSH_MS), 0);
    f.rb = NULL;

    f.rb = ts_remote_open(f.b, f.rs.url, 0, 1);
    cr_assert_eq(ctxs_store_session_open(&got, f.b, "no such chat", &m, 0, NULL), CTXS_ENOTFOUND);
    ctxs_session_entry e;
    cr_assert_eq(ctxs_store_session_get(&e, f.b, "no such chat"), CTXS_ENOTFOUND);
    int rc = ctxs_store_session_open(&got, f.b, "chat", &m, 0, NULL);
    cr_assert_eq(rc, 0, "open pulling: %s", ctxs_err_name(rc));
    cr_assert_eq(ts_n_tokens(got), 150);
    ctxs_session *src = open_ro(f.a, "chat");
    ts_assert_same_stored(src, got, 150, 1);
    ctxs_session_close(src);
    /* The pulled session is local now: it goes on as any other. */
    append_seeded(got, 10, 10, 0, 0);
    cr_assert_eq(ts_n_tokens(got), 160);
    ctxs_session_close(got);
    cr_assert_eq(ctxs_remote_close(NULL, f.rb, TS_FLUSH_MS), 0);
    f.rb = NULL;
    ts_fleet_stop(&f);
}

/* Pulls remote name from b's remote rb as local and checks it is the
 * whole of name in a: n tokens, each one's id and KV the same. */
static void assert_pulls_whole(ctxs_remote *rb, ctxs_store *a, const char *name,
                               const char *local, uint64_t n)
{
    ctxs_remote_pull_result res;
    ctxs_session *got = NULL;
    int rc = ctxs_remote_pull(&got, &res, rb, name, local, NULL, NULL);
    cr_assert_eq(rc, 0, "pull %s: %s", name, ctxs_err_name(rc));
    cr_assert_eq(res.n_tokens, n, "pull %s: %llu of %llu tokens (missing %llu, refused %llu)",
                 name, (unsigned long long)res.n_tokens, (unsigned long long)n,
                 (unsigned long long)res.chunks_missing, (unsigned long long)res.chunks_refused);
    cr_assert_eq(res.remote_tokens, n);
    ctxs_session *src = open_ro(a, name);
    ts_assert_same_stored(src, got, n, 1);
    ctxs_session_close(src);
    ctxs_session_close(got);
}

/* Redis out of memory answers every SET with an error reply: the push
 * thread must leave its connection in step (every pipelined reply read,
 * or the connection dropped), or the jobs after it read stale replies
 * and fail, or take an old reply as their answer, for good. */
Test(remote, error_replies_leave_the_push_thread_in_step)
{
    ts_fleet f = ts_fleet_start(0, 1);
    ctxs_model m = ts_model(9);
    free(ts_redis_cmd(&f.rs, "CONFIG", "SET", "maxmemory-policy", "noeviction", NULL));
    free(ts_redis_cmd(&f.rs, "CONFIG", "SET", "maxmemory", "1", NULL));
    f.ra = ts_remote_open(f.a, f.rs.url, 1, 1);
    ctxs_session_close(make_session(f.a, "oom", &m, 512, 512, 0, 0));
    ctxs_remote_stats st;
    cr_assert_eq(ctxs_remote_flush(&st, f.ra, TS_FLUSH_MS), 0);
    cr_assert_eq(st.chunks_pushed, 0);
    cr_assert_geq(st.chunks_dropped, 8, "dropped: %llu", (unsigned long long)st.chunks_dropped);
    cr_assert_eq(st.last_error, CTXS_EREMOTE);
    free(ts_redis_cmd(&f.rs, "CONFIG", "SET", "maxmemory", "0", NULL));

    ctxs_session_close(make_session(f.a, "after", &m, 256, 64, 0, 7));
    uint64_t dropped = st.chunks_dropped;
    cr_assert_eq(ctxs_remote_flush(&st, f.ra, TS_FLUSH_MS), 0);
    cr_assert_eq(st.chunks_dropped, dropped, "the new session's chunks were dropped too");
    cr_assert_eq(st.chunks_pushed, 4);
    f.rb = ts_remote_open(f.b, f.rs.url, 0, 1);
    assert_pulls_whole(f.rb, f.a, "after", NULL, 256);
    ts_fleet_stop(&f);
}

/* A rollback into a pushed chunk, then commits of other tokens that
 * regain the chunk count: the rewritten chunks are pushed again, and the
 * remote copy is the session as it now is, not cut at the rollback. */
Test(remote, a_rollback_and_rewrite_is_pushed_whole)
{
    ts_fleet f = ts_fleet_start(0, 1);
    ctxs_model m = ts_model(10);
    f.ra = ts_remote_open(f.a, f.rs.url, 1, 1);
    ctxs_session *s = make_session(f.a, "rw", &m, 640, 64, 0, 0);
    ctxs_remote_stats st;
    cr_assert_eq(ctxs_remote_flush(&st, f.ra, TS_FLUSH_MS), 0);
    cr_assert_eq(st.chunks_pushed, 10);
    cr_assert_eq(ctxs_session_rollback(s, 600), 0);
    append_seeded(s, 200, 50, 600, 3);
    cr_assert_eq(ts_n_tokens(s), 800);
    ctxs_session_close(s);
    cr_assert_eq(ctxs_remote_flush(&st, f.ra, TS_FLUSH_MS), 0);
    cr_assert_eq(st.chunks_dropped, 0);
    f.rb = ts_remote_open(f.b, f.rs.url, 0, 1);
    assert_pulls_whole(f.rb, f.a, "rw", NULL, 800);
    ts_fleet_stop(&f);
}

/* One model (one model hash) kept as fp16 in one store and as Q8 in
 * another: the same ids make the same chain, yet other bytes. Each
 * store's chunks must be its own, or the second push finds the first's
 * "present" and every pull of it refuses them. */
Test(remote, one_model_in_two_dtypes_keeps_two_sets_of_chunks)
{
    ts_fleet f = ts_fleet_start(0, 1);
    ctxs_store *c = ts_store_at("c");
    ctxs_model f16 = ts_model(11), q8 = f16;
    q8.geometry.dtype = CTXS_DTYPE_Q8;
    ctxs_session_close(make_session(f.a, "as-f16", &f16, 200, 50, 0, 0));
    ctxs_session_close(make_session(c, "as-q8", &q8, 200, 50, 0, 0));
    f.ra = ts_remote_open(f.a, f.rs.url, 0, 1);
    ctxs_remote *rc_ = ts_remote_open(c, f.rs.url, 0, 1);
    ctxs_remote_push_result pr;
    cr_assert_eq(ctxs_remote_push(&pr, f.ra, "as-f16", NULL), 0);
    cr_assert_eq(pr.chunks_sent, 4);
    cr_assert_eq(ctxs_remote_push(&pr, rc_, "as-q8", NULL), 0);
    cr_assert_eq(pr.chunks_sent, 4, "Q8 chunks taken for present: %llu sent",
                 (unsigned long long)pr.chunks_sent);
    cr_assert_eq(ts_redis_count(&f.rs, "ctxs:chunk:*"), 8);
    char key[256];
    ctxs_session *s = open_ro(c, "as-q8");
    uint32_t *ids = ids_of(s, 200);
    ctxs_session_close(s);
    key_of_chunk(key, sizeof(key), &q8, ids, 1);
    char *exists = ts_redis_cmd(&f.rs, "EXISTS", key, NULL);
    cr_assert_str_eq(exists, "1", "%s", key);
    free(exists);
    free(ids);
    /* Two pulling stores: a store registers a model hash with one form. */
    ctxs_store *d = ts_store_at("d");
    f.rb = ts_remote_open(f.b, f.rs.url, 0, 1);
    ctxs_remote *rd = ts_remote_open(d, f.rs.url, 0, 1);
    assert_pulls_whole(f.rb, f.a, "as-f16", NULL, 200);
    assert_pulls_whole(rd, c, "as-q8", NULL, 200);
    ctxs_remote_close(NULL, rc_, TS_FLUSH_MS);
    ctxs_remote_close(NULL, rd, TS_FLUSH_MS);
    ctxs_store_close(c);
    ctxs_store_close(d);
    ts_fleet_stop(&f);
}

/* Redis stopped (SIGSTOP: connections hang rather than fail): the push
 * thread waits on the network for a job of a session, and meanwhile the
 * session can be deleted; the thread holds its file only while it copies
 * blocks. Before, the thread kept it open for the whole job, and the
 * delete was CTXS_EBUSY until the job gave up. */
Test(remote, a_slow_redis_does_not_hold_up_a_local_delete)
{
    ts_fleet f = ts_fleet_start(0, 1);
    ctxs_model m = ts_model(12);
    f.ra = ts_remote_open_tuned(f.a, f.rs.url, 5000, 1, CTXS_DEFAULT_REMOTE_BACKOFF_MS,
                                CTXS_DEFAULT_REMOTE_QUEUE_MAX);
    cr_assert_eq(kill(f.rs.pid, SIGSTOP), 0);
    ctxs_session_close(make_session(f.a, "gone", &m, 256, 64, 0, 0));
    /* Until the thread has taken its snapshot the file is open: the
     * delete may be CTXS_EBUSY, but not for as long as the job runs. */
    int rc;
    for (;;) {
        ctxs_remote_stats st;
        cr_assert_eq(ctxs_remote_get_stats(&st, f.ra), 0);
        cr_assert_gt(st.jobs_queued, 0, "the jobs ended before the delete could run");
        if ((rc = ctxs_store_session_delete(f.a, "gone")) != CTXS_EBUSY)
            break;
        usleep(1000);
    }
    cr_assert_eq(rc, 0, "delete: %s", ctxs_err_name(rc));
    cr_assert_eq(kill(f.rs.pid, SIGCONT), 0);
    ctxs_remote_stats st;
    cr_assert_eq(ctxs_remote_close(&st, f.ra, TS_FLUSH_MS), 0);
    f.ra = NULL;
    ctxs_session_entry e;
    cr_assert_eq(ctxs_store_session_get(&e, f.a, "gone"), CTXS_ENOTFOUND);
    ts_fleet_stop(&f);
}

/* Counts the sockets this process has open and those among them without
 * FD_CLOEXEC, from /proc/self/fd. */
static void count_sockets(void *arg, uint64_t done, uint64_t total)
{
    (void)done;
    (void)total;
    int *counts = arg; /* [0] sockets, [1] inheritable ones */
    DIR *d = opendir("/proc/self/fd");
    cr_assert_not_null(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[300], target[64];
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, target, sizeof(target) - 1);
        if (n <= 0)
            continue;
        target[n] = '\0';
        if (strncmp(target, "socket:", 7))
            continue;
        int flags = fcntl(atoi(e->d_name), F_GETFD);
        counts[0]++;
        counts[1] += flags >= 0 && !(flags & FD_CLOEXEC);
    }
    closedir(d);
}

/* A child the application forks and execs must not inherit a connection
 * to Redis (hiredis 0.14 opens its sockets without SOCK_CLOEXEC). The
 * progress callback runs while the push's connection is open. */
Test(remote, connections_are_close_on_exec)
{
    ts_fleet f = ts_fleet_start(0, 1);
    ctxs_model m = ts_model(13);
    ctxs_session_close(make_session(f.a, "fd", &m, 128, 128, 0, 0));
    f.ra = ts_remote_open(f.a, f.rs.url, 0, 1);
    int counts[2] = {0, 0};
    ctxs_remote_push_options po = CTXS_REMOTE_PUSH_OPTIONS_INIT;
    po.progress = count_sockets;
    po.progress_arg = counts;
    cr_assert_eq(ctxs_remote_push(NULL, f.ra, "fd", &po), 0);
    cr_assert_gt(counts[0], 0, "no socket open during the push");
    cr_assert_eq(counts[1], 0, "%d of %d sockets without FD_CLOEXEC", counts[1], counts[0]);
    ts_fleet_stop(&f);
}

static ctxs_remote *remote_open_prefixed(ctxs_store *st, const char *url, const char *prefix)
{
    ctxs_remote_options o = CTXS_REMOTE_OPTIONS_INIT;
    o.push_on_commit = 0;
    o.timeout_ms = 1000;
    o.key_prefix = prefix;
    ctxs_remote *r = NULL;
    int rc = ctxs_remote_open(&r, st, url, &o);
    cr_assert_eq(rc, 0, "ctxs_remote_open(%s): %s", prefix, ctxs_err_name(rc));
    return r;
}

/* A key prefix is a name, and a name may hold the characters SCAN's
 * MATCH reads as a glob: "a*" must not list "ab"'s records (it did, as
 * damaged ones), nor "a?" or "[ab]" theirs. */
Test(remote, a_key_prefix_with_glob_characters_lists_only_its_own)
{
    ts_redis rs;
    ts_redis_start(&rs, NULL, 0);
    static const char *prefixes[] = {"a*", "ab", "a?", "[ab]", "a\\"};
    enum { N = sizeof(prefixes) / sizeof(prefixes[0]) };
    ctxs_model m = ts_model(14);
    ctxs_store *st[N];
    ctxs_remote *r[N];
    for (int i = 0; i < N; i++) {
        char dir[8], name[8];
        snprintf(dir, sizeof(dir), "s%d", i);
        snprintf(name, sizeof(name), "n%d", i);
        st[i] = ts_store_at(dir);
        r[i] = remote_open_prefixed(st[i], rs.url, prefixes[i]);
        ctxs_session_close(make_session(st[i], name, &m, 64, 64, 0, 0));
        int rc = ctxs_remote_push(NULL, r[i], name, NULL);
        cr_assert_eq(rc, 0, "push %s: %s", name, ctxs_err_name(rc));
    }
    for (int i = 0; i < N; i++) {
        ctxs_remote_entry *e;
        size_t n;
        char name[8];
        snprintf(name, sizeof(name), "n%d", i);
        cr_assert_eq(ctxs_remote_list(&e, &n, r[i]), 0);
        cr_assert_eq(n, 1, "prefix %s lists %zu records", prefixes[i], n);
        cr_assert_str_eq(e[0].name, name);
        cr_assert_eq(e[0].status, 0);
        cr_assert_eq(e[0].n_tokens, 64);
        ctxs_free(e);
    }
    for (int i = 0; i < N; i++) {
        ctxs_remote_close(NULL, r[i], TS_FLUSH_MS);
        ctxs_store_close(st[i]);
    }
    ts_redis_stop(&rs);
}

/* A chunk's key that holds a list (another client's, or a damaged
 * server's) answers GET with a WRONGTYPE error: the pull stops there as
 * at a damaged chunk, with the chunks before it, rather than failing
 * whole. */
Test(remote, a_chunk_key_of_another_type_is_refused)
{
    ts_fleet f = ts_fleet_start(0, 1);
    ctxs_model m = ts_model(15);
    uint32_t *ids = pushed_session(&f, &m);
    char key[256];
    key_of_chunk(key, sizeof(key), &m, ids, 2);
    free(ts_redis_cmd(&f.rs, "DEL", key, NULL));
    char *n = ts_redis_cmd(&f.rs, "RPUSH", key, "x", NULL);
    cr_assert_str_eq(n, "1");
    free(n);
    pull_stops_at_chunk_2(&f, "list", ids);
    free(ids);
    ts_fleet_stop(&f);
}

/* The header promises waits "doubled each time up to 2 s": a first wait
 * above that was taken as given (UINT32_MAX ms, seven weeks), and its
 * doubling overflowed. With every wait capped, jobs against a dead
 * server give up within a few seconds: well inside the flush's bound. */
Test(remote, every_backoff_wait_is_capped_at_two_seconds)
{
    ts_fleet f = ts_fleet_start(0, 1);
    ctxs_model m = ts_model(16);
    f.ra = ts_remote_open_tuned(f.a, f.rs.url, 200, 2, UINT32_MAX, CTXS_DEFAULT_REMOTE_QUEUE_MAX);
    ts_redis_kill(&f.rs);
    ctxs_session *s = make_session(f.a, "wait", &m, 64, 64, 0, 0);
    ctxs_remote_stats st;
    int rc = ctxs_remote_flush(&st, f.ra, TS_FLUSH_MS);
    cr_assert_eq(rc, 0, "flush: %s (a wait was not capped)", ctxs_err_name(rc));
    cr_assert_gt(st.retries, 0);
    cr_assert_gt(st.chunks_dropped, 0);
    ctxs_session_close(s);
    ctxs_remote_close(NULL, f.ra, 0);
    f.ra = NULL;
    ts_fleet_stop(&f);
}

/* With room for one job, a commit's record job finds the queue full
 * (behind the commit's own chunk job, or another session's job) while
 * the thread waits on a stopped Redis. A record job with no tail counted
 * nothing when dropped: no counter and no last_error said it was lost.
 * Whatever order the thread takes the jobs in, two sessions' commits
 * drop at least two values here (see the cases below). */
Test(remote, a_record_dropped_for_a_full_queue_is_counted)
{
    ts_fleet f = ts_fleet_start(0, 1);
    ctxs_model m = ts_model(17);
    /* 20 s timeouts: the thread's first job waits on Redis throughout. */
    f.ra = ts_remote_open_tuned(f.a, f.rs.url, 20000, 1, CTXS_DEFAULT_REMOTE_BACKOFF_MS, 1);
    cr_assert_eq(kill(f.rs.pid, SIGSTOP), 0);
    /* Each commit queues [chunks 0..1) then the record. x's record is
     * dropped behind x's chunks unless the thread took them first; then
     * x's record waits in the queue and y's chunks are dropped behind
     * it. y's record is dropped in every case. */
    ctxs_session *x = make_session(f.a, "x", &m, 64, 64, 0, 0);
    ctxs_session *y = make_session(f.a, "y", &m, 64, 64, 0, 1);
    ctxs_remote_stats st;
    cr_assert_eq(ctxs_remote_get_stats(&st, f.ra), 0);
    cr_assert_geq(st.chunks_dropped, 2, "dropped: %llu", (unsigned long long)st.chunks_dropped);
    cr_assert_eq(st.last_error, -ENOBUFS, "last_error: %s", ctxs_err_name(st.last_error));
    cr_assert_eq(kill(f.rs.pid, SIGCONT), 0);
    ctxs_session_close(x);
    ctxs_session_close(y);
    ts_fleet_stop(&f);
}

/* connected says whether the push thread holds a connection: none until
 * its first job (it was 1 from the open on), one after a job, none once
 * the server is gone. */
Test(remote, connected_follows_the_push_threads_connection)
{
    ts_fleet f = ts_fleet_start(0, 1);
    ctxs_model m = ts_model(18);
    f.ra = ts_remote_open_tuned(f.a, f.rs.url, 1000, 2, 1, CTXS_DEFAULT_REMOTE_QUEUE_MAX);
    ctxs_remote_stats st;
    cr_assert_eq(ctxs_remote_flush(&st, f.ra, TS_FLUSH_MS), 0);
    cr_assert_eq(st.connected, 0, "connected before the thread connected");
    ctxs_session *s = make_session(f.a, "up", &m, 64, 64, 0, 0);
    cr_assert_eq(ctxs_remote_flush(&st, f.ra, TS_FLUSH_MS), 0);
    cr_assert_eq(st.chunks_pushed, 1);
    cr_assert_eq(st.connected, 1);
    ts_redis_kill(&f.rs);
    append_seeded(s, 64, 64, 0, 0);
    cr_assert_eq(ctxs_remote_flush(&st, f.ra, TS_FLUSH_MS), 0);
    cr_assert_gt(st.chunks_dropped, 0);
    cr_assert_eq(st.connected, 0);
    ctxs_session_close(s);
    ctxs_remote_close(&st, f.ra, 0);
    f.ra = NULL;
    cr_assert_eq(st.connected, 0);
    ts_fleet_stop(&f);
}

/* The bytes the server has sent to its clients so far (INFO stats). */
static uint64_t net_output_bytes(ts_redis *rs)
{
    char *info = ts_redis_cmd(rs, "INFO", "stats", NULL);
    const char *at = info ? strstr(info, "total_net_output_bytes:") : NULL;
    cr_assert_not_null(at, "INFO stats: %s", info ? info : "(none)");
    uint64_t n = strtoull(at + strlen("total_net_output_bytes:"), NULL, 10);
    free(info);
    return n;
}

/* A store that knows the model's hash with another form refuses the pull
 * before any chunk is fetched, and makes nothing. */
Test(remote, a_pull_into_a_store_with_another_form_of_the_model_is_emodel)
{
    ts_fleet f = ts_fleet_start(0, 1);
    ctxs_model m = ts_model(21);
    m.geometry.dtype = CTXS_DTYPE_Q8;
    f.ra = ts_remote_open(f.a, f.rs.url, 1, 1);
    ctxs_session_close(make_session(f.a, "c", &m, 130, 65, 0, 0));
    cr_assert_eq(ctxs_remote_close(NULL, f.ra, TS_FLUSH_MS), 0);
    f.ra = NULL;

    ctxs_model other = m;
    other.geometry.dtype = CTXS_DTYPE_F16;
    cr_assert_eq(ctxs_model_register(f.b, &other, NULL), 0);
    f.rb = ts_remote_open(f.b, f.rs.url, 0, 1);
    ctxs_remote_pull_result res;
    uint64_t sent_before = net_output_bytes(&f.rs);
    cr_assert_eq(ctxs_remote_pull(NULL, &res, f.rb, "c", NULL, NULL, NULL), CTXS_EMODEL);
    /* The record (and an INFO reply) only: less than one chunk's KV. */
    uint64_t sent = net_output_bytes(&f.rs) - sent_before;
    uint64_t chunk_kv = 2 * CTXS_PREFIX_CHUNK * ctxs_geometry_get_token_bytes(&m.geometry,
                                                                             CTXS_DTYPE_Q8);
    cr_assert_lt(sent, chunk_kv, "%llu bytes sent, a chunk's KV is %llu",
                 (unsigned long long)sent, (unsigned long long)chunk_kv);
    uint32_t *ids = NULL;
    ctxs_session *src = open_ro(f.a, "c");
    ids = ids_of(src, 128);
    ctxs_session_close(src);
    cr_assert_eq(ctxs_remote_pull_prefix(NULL, &res, f.rb, "p", &m, ids, 128, NULL, NULL),
                 CTXS_EMODEL);
    ctxs_session_entry e;
    cr_assert_eq(ctxs_store_session_get(&e, f.b, "c"), CTXS_ENOTFOUND);
    cr_assert_eq(ctxs_store_session_get(&e, f.b, "p"), CTXS_ENOTFOUND);
    free(ids);
    ts_fleet_stop(&f);
}

/* What the progress callbacks of push and pull were told. */
typedef struct progress_log {
    int calls;
    int backwards;              /* done fell, or rose above total */
    uint64_t done, total;       /* the last call's */
} progress_log;

static void progress_note(void *arg, uint64_t done, uint64_t total)
{
    progress_log *l = arg;
    if ((l->calls && done < l->done) || done > total)
        l->backwards = 1;
    l->calls++;
    l->done = done;
    l->total = total;
}

/* Makes "c" in f's store a (n tokens, in commits of step), opens a's
 * remote (push_on_commit 0), and returns c's ids. */
static uint32_t *session_c(ts_fleet *f, const ctxs_model *m, uint64_t n, uint32_t step)
{
    ctxs_session *s = make_session(f->a, "c", m, n, step, 0, 0);
    uint32_t *ids = ids_of(s, n);
    ctxs_session_close(s);
    f->ra = ts_remote_open(f->a, f->rs.url, 0, 1);
    return ids;
}

/* Options of another version, or with a reserved byte set, are refused
 * with CTXS_EINVAL and a reason before anything moves: nothing pushed,
 * no local session made. */
Test(remote, push_and_pull_options_of_another_version_or_reserved_bytes_are_refused)
{
    ts_fleet f = ts_fleet_start(0, 1);
    ctxs_model m = ts_model(21);
    uint32_t *ids = session_c(&f, &m, 130, 65);

    ctxs_remote_push_options po = CTXS_REMOTE_PUSH_OPTIONS_INIT;
    po.version = CTXS_REMOTE_PUSH_OPTIONS_VERSION + 1;
    cr_assert_eq(ctxs_remote_push(NULL, f.ra, "c", &po), CTXS_EINVAL);
    cr_assert(strstr(ctxs_get_last_error(), "version"), "%s", ctxs_get_last_error());
    po = (ctxs_remote_push_options)CTXS_REMOTE_PUSH_OPTIONS_INIT;
    po.reserved0 = 1;
    cr_assert_eq(ctxs_remote_push(NULL, f.ra, "c", &po), CTXS_EINVAL);
    cr_assert(strstr(ctxs_get_last_error(), "reserved"), "%s", ctxs_get_last_error());
    po = (ctxs_remote_push_options)CTXS_REMOTE_PUSH_OPTIONS_INIT;
    po.reserved[31] = 1;
    cr_assert_eq(ctxs_remote_push(NULL, f.ra, "c", &po), CTXS_EINVAL);
    cr_assert_eq(ts_redis_count(&f.rs, "ctxs:*"), 0);

    cr_assert_eq(ctxs_remote_push_options_init(NULL, CTXS_REMOTE_PUSH_OPTIONS_VERSION),
                 CTXS_EINVAL);
    cr_assert_eq(ctxs_remote_push_options_init(&po, CTXS_REMOTE_PUSH_OPTIONS_VERSION + 1),
                 CTXS_EINVAL);
    cr_assert(strstr(ctxs_get_last_error(), "version"), "%s", ctxs_get_last_error());
    memset(&po, 0xa5, sizeof(po));
    cr_assert_eq(ctxs_remote_push_options_init(&po, CTXS_REMOTE_PUSH_OPTIONS_VERSION), 0);
    const ctxs_remote_push_options push_init = CTXS_REMOTE_PUSH_OPTIONS_INIT;
    cr_assert(memcmp(&po, &push_init, sizeof(po)) == 0);
    cr_assert_eq(ctxs_remote_push(NULL, f.ra, "c", &po), 0);

    f.rb = ts_remote_open(f.b, f.rs.url, 0, 1);
    ctxs_remote_pull_options lo = CTXS_REMOTE_PULL_OPTIONS_INIT;
    lo.version = 0;
    cr_assert_eq(ctxs_remote_pull(NULL, NULL, f.rb, "c", NULL, NULL, &lo), CTXS_EINVAL);
    cr_assert(strstr(ctxs_get_last_error(), "version"), "%s", ctxs_get_last_error());
    lo = (ctxs_remote_pull_options)CTXS_REMOTE_PULL_OPTIONS_INIT;
    lo.reserved[0] = 1;
    cr_assert_eq(ctxs_remote_pull(NULL, NULL, f.rb, "c", NULL, NULL, &lo), CTXS_EINVAL);
    cr_assert(strstr(ctxs_get_last_error(), "reserved"), "%s", ctxs_get_last_error());
    lo = (ctxs_remote_pull_options)CTXS_REMOTE_PULL_OPTIONS_INIT;
    lo.reserved0 = 7;
    cr_assert_eq(ctxs_remote_pull_prefix(NULL, NULL, f.rb, "p", &m, ids, 130, NULL, &lo),
                 CTXS_EINVAL);
    ctxs_session_entry e;
    cr_assert_eq(ctxs_store_session_get(&e, f.b, "c"), CTXS_ENOTFOUND);
    cr_assert_eq(ctxs_store_session_get(&e, f.b, "p"), CTXS_ENOTFOUND);

    cr_assert_eq(ctxs_remote_pull_options_init(NULL, CTXS_REMOTE_PULL_OPTIONS_VERSION),
                 CTXS_EINVAL);
    cr_assert_eq(ctxs_remote_pull_options_init(&lo, 0), CTXS_EINVAL);
    memset(&lo, 0x5a, sizeof(lo));
    cr_assert_eq(ctxs_remote_pull_options_init(&lo, CTXS_REMOTE_PULL_OPTIONS_VERSION), 0);
    const ctxs_remote_pull_options pull_init = CTXS_REMOTE_PULL_OPTIONS_INIT;
    cr_assert(memcmp(&lo, &pull_init, sizeof(lo)) == 0);
    cr_assert_eq(ctxs_remote_pull(NULL, NULL, f.rb, "c", NULL, NULL, &lo), 0);
    cr_assert_eq(ctxs_store_session_get(&e, f.b, "c"), 0);
    cr_assert_eq(e.n_tokens, 130);

    free(ids);
    ts_fleet_stop(&f);
}

/* The progress callbacks in the options: push, pull and pull_prefix
 * count tokens up to the session's, never backwards. */
Test(remote, push_pull_and_pull_prefix_report_progress_through_their_options)
{
    ts_fleet f = ts_fleet_start(0, 1);
    ctxs_model m = ts_model(22);
    uint32_t *ids = session_c(&f, &m, 200, 50);

    progress_log pushed = {0};
    ctxs_remote_push_options po = CTXS_REMOTE_PUSH_OPTIONS_INIT;
    po.progress = progress_note;
    po.progress_arg = &pushed;
    cr_assert_eq(ctxs_remote_push(NULL, f.ra, "c", &po), 0);
    cr_assert_geq(pushed.calls, 1);
    cr_assert_eq(pushed.backwards, 0);
    cr_assert_eq(pushed.done, 200);
    cr_assert_eq(pushed.total, 200);

    f.rb = ts_remote_open(f.b, f.rs.url, 0, 1);
    progress_log pulled = {0};
    ctxs_remote_pull_options lo = CTXS_REMOTE_PULL_OPTIONS_INIT;
    lo.progress = progress_note;
    lo.progress_arg = &pulled;
    ctxs_remote_pull_result res;
    cr_assert_eq(ctxs_remote_pull(NULL, &res, f.rb, "c", NULL, NULL, &lo), 0);
    cr_assert_eq(res.chunks_pulled, 4);
    cr_assert_eq(pulled.calls, 4, "one call a chunk: %d", pulled.calls);
    cr_assert_eq(pulled.backwards, 0);
    cr_assert_eq(pulled.done, 200);
    cr_assert_eq(pulled.total, 200);

    progress_log prefixed = {0};
    lo.progress_arg = &prefixed;
    cr_assert_eq(ctxs_remote_pull_prefix(NULL, &res, f.rb, "p", &m, ids, 200, NULL, &lo), 0);
    cr_assert_eq(res.n_tokens, 200);
    cr_assert_eq(prefixed.calls, 4, "one call a chunk: %d", prefixed.calls);
    cr_assert_eq(prefixed.backwards, 0);
    cr_assert_eq(prefixed.done, 200);
    cr_assert_eq(prefixed.total, 200);

    free(ids);
    ts_fleet_stop(&f);
}
