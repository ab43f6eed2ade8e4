/*
 * The remote tier and layer schedules, against a real redis-server on
 * 127.0.0.1 (tests/redis_server.c), two stores in two directories as two
 * machines. A schedule of global layers and windowed layers of two
 * windows: its chunks carry the global layers, a window value the
 * windowed layers' state at the record's count; a pulled session is that
 * schedule's, verifies, and holds (and attends to) what the pushed one
 * does, in every dtype, shorter and longer than the windows.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "ctxstore.h"
#include "index.h"
#include "remote_format.h"
#include "remote_support.h"
#include "support.h"

TestSuite(remote_schedule, .init = ts_scratch_init, .fini = ts_scratch_fini, .timeout = 240);

/* 6 layers, pattern [global, window 80, window 150]: layers 0 and 3
 * global, 1 and 4 windowed at 80, 2 and 5 at 150. */
#define LAYERS 6
#define HEADS 2
#define DIM 16
#define CAP 512
#define BATCH 8
#define PER (LAYERS * HEADS * DIM)
#define FORM_SCHED "-6x2x16-w0.80.150:"

static const uint32_t dtypes[] = {CTXS_DTYPE_F16, CTXS_DTYPE_BF16, CTXS_DTYPE_Q8};
static const char *const dtype_names[] = {"f16", "bf16", "q8"};

static ctxs_model sched_model(uint32_t dtype)
{
    ctxs_model m = ts_model(11);
    m.geometry = (ctxs_geometry){LAYERS, HEADS, DIM, dtype, 3, {0, 80, 150}};
    return m;
}

static float value(uint64_t pos, uint32_t l, uint32_t kind, uint32_t h, uint32_t i)
{
    uint64_t x = ts_mix64(((pos * 8 + l) * 2 + kind) * 64 + h * 16 + i);
    return (float)((double)(x % 2001) / 1000.0 - 1.0);
}

static uint32_t token(uint64_t pos)
{
    return ts_token(pos) ^ 0x77u;
}

/* Appends n tokens, in commits of at most the batch. */
static void append(ctxs_session *s, uint64_t n)
{
    float k[PER], v[PER];
    while (n) {
        uint32_t c = n < BATCH ? (uint32_t)n : BATCH;
        ctxs_reservation r;
        int rc = ctxs_session_reserve(&r, s, c);
        cr_assert_eq(rc, 0, "reserve: %s", ctxs_get_last_error());
        uint32_t ids[BATCH];
        for (uint32_t i = 0; i < c; i++) {
            uint64_t pos = r.first_pos + i;
            for (uint32_t l = 0; l < LAYERS; l++)
                for (uint32_t h = 0; h < HEADS; h++)
                    for (uint32_t e = 0; e < DIM; e++) {
                        k[(l * HEADS + h) * DIM + e] = value(pos, l, 0, h, e);
                        v[(l * HEADS + h) * DIM + e] = value(pos, l, 1, h, e);
                    }
            ids[i] = token(pos);
            cr_assert_eq(ctxs_session_write_token(s, &r, i, k, v, CTXS_DTYPE_F32), 0);
        }
        rc = ctxs_session_commit(s, ids, c);
        cr_assert_eq(rc, 0, "commit: %s", ctxs_get_last_error());
        n -= c;
    }
}

static ctxs_session *make_session(ctxs_store *st, const char *name, const ctxs_model *m,
                                  uint64_t n, uint32_t capacity)
{
    ctxs_create_options o = ts_options(capacity, 4, 0, CTXS_SYNC_NONE);
    o.batch = BATCH;
    ctxs_model_entry known;
    if (ctxs_model_get(&known, st, m->model_hash) == CTXS_ENOTFOUND)
        cr_assert_eq(ctxs_model_register(st, m, NULL), 0);
    ctxs_session *s = NULL;
    int rc = ctxs_store_session_create(&s, st, name, m, &o);
    cr_assert_eq(rc, 0, "create %s: %s", name, ctxs_get_last_error());
    append(s, n);
    return s;
}

static void push(ctxs_remote *r, const char *name, uint64_t n)
{
    ctxs_remote_push_result pr;
    int rc = ctxs_remote_push(&pr, r, name, NULL);
    cr_assert_eq(rc, 0, "push %s: %s", name, ctxs_get_last_error());
    cr_assert_eq(pr.n_tokens, n);
}

/* b holds positions [0, n) of a: the same ids, every layer the same
 * stored bytes for what it holds (a windowed layer its window at n, read
 * as zeros below it), the same attention output per layer at the last
 * position, bit for bit; and b verifies, reopened with every token
 * checked. */
static void assert_same(ctxs_session *a, ctxs_store *bst, const char *bname, uint64_t n)
{
    ctxs_session *b = NULL;
    int rc = ctxs_store_session_open(&b, bst, bname, NULL, CTXS_RDONLY | CTXS_OPEN_VERIFY, NULL);
    cr_assert_eq(rc, 0, "open %s: %s", bname, ctxs_get_last_error());
    ctxs_session_info ia, ib;
    cr_assert_eq(ctxs_session_get_info(&ia, a), 0);
    cr_assert_eq(ctxs_session_get_info(&ib, b), 0);
    cr_assert_eq(ib.n_tokens, n);
    cr_assert_eq(ib.lost_tokens, 0);
    cr_assert(memcmp(&ia.model, &ib.model, sizeof(ia.model)) == 0, "the schedule travels");
    uint64_t bad = 0;
    rc = ctxs_session_verify(&bad, b);
    cr_assert_eq(rc, 0, "verify: %s at %llu", ctxs_err_name(rc), (unsigned long long)bad);
    /* a's windows are those of its own count: at another, the ids only. */
    ts_assert_same_stored(a, b, n, n >= ia.n_tokens);
    if (n == ia.n_tokens && n > 0) {
        enum { n_heads = 2 * HEADS };
        float q[n_heads * DIM], oa[n_heads * DIM], ob[n_heads * DIM];
        for (uint32_t i = 0; i < n_heads * DIM; i++)
            q[i] = value(999, 0, 0, 0, i % 16) * (float)(1 + i % 3);
        for (uint32_t l = 0; l < LAYERS; l++) {
            ctxs_layout la, lb;
            ctxs_attn_plan pa, pb;
            cr_assert_eq(ctxs_session_get_layer_attn(&la, &pa, a, l, 0), 0);
            cr_assert_eq(ctxs_session_get_layer_attn(&lb, &pb, b, l, 0), 0);
            ctxs_attn_query aq = {q, n - 1, 1, n_heads, 0};
            cr_assert_eq(ctxs_attention(oa, &la, &pa, 0, &aq), 0);
            cr_assert_eq(ctxs_attention(ob, &lb, &pb, 0, &aq), 0);
            cr_assert(memcmp(oa, ob, sizeof(oa)) == 0, "attention of layer %u at %llu", l,
                      (unsigned long long)n);
        }
    }
    ctxs_session_close(b);
}

/* The Redis key of a value of ids[0..at) under m: kind "chunk" or
 * "window", chain the last chunk's (whole or tail) ending at `at`. */
static void key_of(char *key, size_t cap, const char *kind, const ctxs_model *m,
                   const uint32_t *ids, uint64_t at)
{
    uint64_t whole = at / 64;
    uint8_t(*chain)[16] = malloc((whole + 1) * 16);
    static const uint8_t zero[16];
    ctxs__prefix_chains(chain, ids, whole);
    uint8_t c[16];
    if (at % 64)
        ctxs__prefix_chain_next(c, whole ? chain[whole - 1] : zero, ids + whole * 64,
                                (uint32_t)(at % 64));
    else
        memcpy(c, chain[whole - 1], 16);
    free(chain);
    char mh[33], ch[33], sched[64] = "";
    for (int i = 0; i < 16; i++) {
        snprintf(mh + 2 * i, 3, "%02x", m->model_hash[i]);
        snprintf(ch + 2 * i, 3, "%02x", c[i]);
    }
    const ctxs_geometry *g = &m->geometry;
    for (uint32_t j = 0; j < g->period; j++)
        snprintf(sched + strlen(sched), sizeof(sched) - strlen(sched), "%s%u", j ? "." : "-w",
                 g->window[j]);
    const char *dt = g->dtype == CTXS_DTYPE_F16 ? "f16" : g->dtype == CTXS_DTYPE_BF16 ? "bf16" : "q8";
    snprintf(key, cap, "ctxs:%s:%s:%s-%ux%ux%u%s:%s", kind, mh, dt, g->n_layers, g->n_kv_heads,
             g->head_dim, sched, ch);
}

/* `ctxstore --store dir verify --all` exits 0, where the tool is built
 * (CTXSTORE_BIN). */
static void cli_verify(const char *dir)
{
    const char *bin = getenv("CTXSTORE_BIN");
    if (!bin)
        return;
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        execl(bin, bin, "--store", dir, "verify", "--all", (char *)NULL);
        _exit(127);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "ctxstore verify: status 0x%x",
              status);
}

static uint32_t *ids_upto(uint64_t n)
{
    uint32_t *ids = malloc(n * 4 + 4);
    for (uint64_t p = 0; p < n; p++)
        ids[p] = token(p);
    return ids;
}

static void pull_into(ctxs_remote_pull_result *res, ctxs_remote *r, const char *remote,
                      const char *local)
{
    int rc = ctxs_remote_pull(NULL, res, r, remote, local, NULL, NULL);
    cr_assert_eq(rc, 0, "pull %s as %s: %s", remote, local, ctxs_get_last_error());
}

/* Pushed from A, pulled into B: sessions shorter than both windows (70),
 * between them (120: longer than 80 + the batch), longer than both (300),
 * in f16, bf16 and q8; the pulled session goes on committing. */
Test(remote_schedule, a_mixed_schedule_round_trips_in_every_dtype_and_length)
{
    ts_fleet f = ts_fleet_start(1, 0);
    static const uint64_t lengths[] = {70, 120, 300};
    for (size_t d = 0; d < 3; d++) {
        ctxs_model m = sched_model(dtypes[d]);
        for (size_t i = 0; i < 3; i++) {
            uint64_t n = lengths[i];
            char name[32], back[32];
            snprintf(name, sizeof(name), "chat-%s-%llu", dtype_names[d], (unsigned long long)n);
            snprintf(back, sizeof(back), "back-%s-%llu", dtype_names[d], (unsigned long long)n);
            /* Each length its own model hash: no chunk shared between them. */
            m.model_hash[14] = (uint8_t)i;
            m.model_hash[13] = (uint8_t)d; /* a store keeps one dtype per model */
            ctxs_session *s = make_session(f.a, name, &m, n, CAP);
            push(f.ra, name, n);
            ctxs_remote_pull_result res;
            pull_into(&res, f.rb, name, back);
            cr_assert_eq(res.n_tokens, n, "%s: %llu", name, (unsigned long long)res.n_tokens);
            cr_assert_eq(res.chunks_missing + res.chunks_refused + res.n_rest, 0);
            /* The whole chunks, the tail, and the window value. */
            cr_assert_eq(res.chunks_pulled, (n + 63) / 64 + 1);
            cr_assert(memcmp(&res.model, &m, sizeof(m)) == 0);
            assert_same(s, f.b, back, n);

            /* The keys name the schedule; a chunk is a 2.0 value carrying
             * the global layers (2 of 6) only. */
            uint32_t *ids = ids_upto(n);
            char key[512];
            key_of(key, sizeof(key), "chunk", &m, ids, n < 64 ? n : 64);
            cr_assert(strstr(key, FORM_SCHED), "%s", key);
            size_t len;
            uint8_t *v = ts_redis_get(&f.rs, key, &len);
            cr_assert_not_null(v, "%s", key);
            ctxs__rchunk_header h;
            memcpy(&h, v, sizeof(h));
            cr_assert_eq(h.version_major, 2);
            cr_assert_neq(h.schedule_crc32, 0);
            size_t slot = DIM * (dtypes[d] == CTXS_DTYPE_Q8 ? 1 : 2) +
                          (dtypes[d] == CTXS_DTYPE_Q8 ? 4 : 0);
            cr_assert_eq(h.raw_bytes, h.count * (12 + 2 * 2 * HEADS * slot));
            free(v);
            key_of(key, sizeof(key), "window", &m, ids, n);
            v = ts_redis_get(&f.rs, key, &len);
            cr_assert_not_null(v, "%s", key);
            ctxs__rwindow_header wh;
            memcpy(&wh, v, sizeof(wh));
            cr_assert_eq(wh.version_major, 2);
            cr_assert_eq(wh.n_tokens, n);
            cr_assert_eq(wh.n_groups, 2);
            uint64_t w80 = n < 80 ? n : 80, w150 = n < 150 ? n : 150;
            cr_assert_eq(wh.raw_bytes, (w80 + w150) * (12 + 2 * 2 * HEADS * slot));
            free(v);
            free(ids);

            /* The pulled session goes on: its rings turn as the source's. */
            ctxs_session *t = NULL;
            cr_assert_eq(ctxs_store_session_open(&t, f.b, back, &m, 0, NULL), 0);
            append(t, 90);
            append(s, 90);
            ctxs_session_close(t);
            assert_same(s, f.b, back, n + 90);
            ctxs_session_close(s);
        }
    }
    cli_verify(ts_path(ts_scratch, "b"));
    ts_fleet_stop(&f);
}

/* A pull of name as local gives no token, and says why. */
static void pull_gives_nothing(ctxs_remote *r, ctxs_store *st, const char *name,
                               const char *local, uint64_t n, int missing)
{
    ctxs_remote_pull_result res;
    pull_into(&res, r, name, local);
    cr_assert_eq(res.n_tokens, 0, "%s: %llu tokens", local, (unsigned long long)res.n_tokens);
    cr_assert_eq(res.chunks_missing, (uint64_t)missing, "%s", local);
    cr_assert_eq(res.chunks_refused, (uint64_t)!missing, "%s", local);
    cr_assert_eq(res.n_rest, n);
    cr_assert_eq(res.rest_ids[0], token(0));
    ctxs_free(res.rest_ids);
    ctxs_session *s = NULL;
    cr_assert_eq(ctxs_store_session_open(&s, st, local, NULL, CTXS_RDONLY | CTXS_OPEN_VERIFY, NULL), 0);
    cr_assert_eq(ts_n_tokens(s), 0);
    cr_assert_eq(ctxs_session_verify(NULL, s), 0);
    ctxs_session_close(s);
}

/* A window value damaged in Redis (a K/V byte, a checksum, an id, its
 * header with a good CRC, cut short, another count's value, a list) is
 * refused: a session longer than a window pulls no token then, since no
 * count below the record's has its windows. One within both windows
 * pulls what its chunks give when one is missing, its windows taken from
 * the value's first positions. */
Test(remote_schedule, a_damaged_window_value_is_refused_and_the_pull_is_shorter)
{
    ts_fleet f = ts_fleet_start(1, 0);
    ctxs_model m = sched_model(CTXS_DTYPE_Q8);
    ctxs_session *s = make_session(f.a, "long", &m, 300, CAP);
    push(f.ra, "long", 300);
    uint32_t *ids = ids_upto(300);
    char key[512];
    key_of(key, sizeof(key), "window", &m, ids, 300);
    size_t len;
    uint8_t *good = ts_redis_get(&f.rs, key, &len);
    cr_assert_not_null(good);
    uint8_t *bad = malloc(len);
    cr_assert_not_null(bad);

    /* A byte of each part of the first block: KV, checksum, id, and the
     * last byte of the value (a scale of the second group's last block). */
    const size_t offs[] = {CTXS__RWINDOW_HEADER_BYTES + 12 * 64 + 3,
                           CTXS__RWINDOW_HEADER_BYTES + 8 * 5 + 2,
                           CTXS__RWINDOW_HEADER_BYTES + 8 * 64 + 4 * 9, len - 1};
    for (size_t i = 0; i < 4; i++) {
        memcpy(bad, good, len);
        bad[offs[i]] ^= 0x21;
        ts_redis_set(&f.rs, key, bad, len);
        char local[32];
        snprintf(local, sizeof(local), "byte-%zu", i);
        pull_gives_nothing(f.rb, f.b, "long", local, 300, 0);
    }
    /* The header's count, its CRC made good. */
    memcpy(bad, good, len);
    ctxs__rwindow_header h;
    memcpy(&h, bad, sizeof(h));
    h.n_tokens = 299;
    h.crc32 = (uint32_t)crc32(0L, (const Bytef *)&h, offsetof(ctxs__rwindow_header, crc32));
    memcpy(bad, &h, sizeof(h));
    ts_redis_set(&f.rs, key, bad, len);
    pull_gives_nothing(f.rb, f.b, "long", "count", 300, 0);
    /* Cut short, and grown. */
    ts_redis_set(&f.rs, key, good, len - 1);
    pull_gives_nothing(f.rb, f.b, "long", "cut", 300, 0);
    uint8_t *grown = calloc(1, len + 7);
    memcpy(grown, good, len);
    ts_redis_set(&f.rs, key, grown, len + 7);
    free(grown);
    pull_gives_nothing(f.rb, f.b, "long", "grown", 300, 0);
    /* A list under the key. */
    free(ts_redis_cmd(&f.rs, "DEL", key, NULL));
    free(ts_redis_cmd(&f.rs, "RPUSH", key, "x", NULL));
    pull_gives_nothing(f.rb, f.b, "long", "list", 300, 0);
    /* None at all (evicted). */
    free(ts_redis_cmd(&f.rs, "DEL", key, NULL));
    pull_gives_nothing(f.rb, f.b, "long", "missing", 300, 1);
    /* Put back: the whole session again. */
    ts_redis_set(&f.rs, key, good, len);
    ctxs_remote_pull_result res;
    pull_into(&res, f.rb, "long", "whole");
    cr_assert_eq(res.n_tokens, 300);
    assert_same(s, f.b, "whole", 300);
    ctxs_session_close(s);

    /* Within both windows (70 < 80): the tail chunk gone, the pull keeps
     * the first whole chunk, its windows from the value's first 64
     * positions. */
    m.model_hash[14] ^= 1;
    s = make_session(f.a, "short", &m, 70, CAP);
    push(f.ra, "short", 70);
    key_of(key, sizeof(key), "chunk", &m, ids, 70);
    free(ts_redis_cmd(&f.rs, "DEL", key, NULL));
    pull_into(&res, f.rb, "short", "short");
    cr_assert_eq(res.n_tokens, 64);
    cr_assert_eq(res.chunks_missing, 1);
    cr_assert_eq(res.n_rest, 6);
    ctxs_free(res.rest_ids);
    assert_same(s, f.b, "short", 64);
    /* The pulled session is 64 tokens of that schedule: the rest prefilled,
     * it holds the source's. */
    ctxs_session *t = NULL;
    cr_assert_eq(ctxs_store_session_open(&t, f.b, "short", &m, 0, NULL), 0);
    append(t, 6);
    ctxs_session_close(t);
    assert_same(s, f.b, "short", 70);
    ctxs_session_close(s);

    free(bad);
    free(good);
    free(ids);
    ts_fleet_stop(&f);
}

/* A store that keeps the same weights with every layer global never takes
 * the scheduled session's values: its chunk keys differ (a prefix pull
 * finds nothing), a pull of the record is CTXS_EMODEL, and a scheduled
 * chunk put under its key is refused. */
Test(remote_schedule, a_global_only_store_of_the_same_weights_takes_none_of_it)
{
    ts_fleet f = ts_fleet_start(1, 0);
    ctxs_model m = sched_model(CTXS_DTYPE_F16);
    ctxs_session *s = make_session(f.a, "chat", &m, 200, CAP);
    push(f.ra, "chat", 200);
    ctxs_session_close(s);

    ctxs_model global = m;
    global.geometry.period = 0;
    memset(global.geometry.window, 0, sizeof(global.geometry.window));
    cr_assert_eq(ctxs_model_register(f.b, &global, NULL), 0);
    int rc = ctxs_remote_pull(NULL, NULL, f.rb, "chat", NULL, NULL, NULL);
    cr_assert_eq(rc, CTXS_EMODEL, "%s", ctxs_err_name(rc));
    uint32_t *ids = ids_upto(200);
    ctxs_remote_pull_result res;
    rc = ctxs_remote_pull_prefix(NULL, &res, f.rb, "p", &global, ids, 200, NULL, NULL);
    cr_assert_eq(rc, CTXS_ENOTFOUND, "%s", ctxs_err_name(rc));

    /* The scheduled chunk 0 copied under the global-only key: refused (a
     * 2.0 chunk, of a schedule, of 2 layers' runs). */
    char skey[512], gkey[512];
    key_of(skey, sizeof(skey), "chunk", &m, ids, 64);
    key_of(gkey, sizeof(gkey), "chunk", &global, ids, 64);
    cr_assert_str_neq(skey, gkey);
    size_t len;
    void *v = ts_redis_get(&f.rs, skey, &len);
    cr_assert_not_null(v);
    ts_redis_set(&f.rs, gkey, v, len);
    free(v);
    rc = ctxs_remote_pull_prefix(NULL, &res, f.rb, "p", &global, ids, 200, NULL, NULL);
    cr_assert_eq(rc, CTXS_ENOTFOUND, "%s", ctxs_err_name(rc));
    cr_assert_eq(ts_redis_count(&f.rs, "ctxs:chunk:*"), 5, "4 chunks, and the one copied");
    free(ids);
    ts_fleet_stop(&f);
}

/* The background push: chunks as commits complete them (global layers),
 * and the record only at the close, with the tail and the window value
 * of its count: no record names a count whose windows Redis lacks. */
Test(remote_schedule, the_background_push_sends_the_record_with_its_windows_at_close)
{
    ts_fleet f = ts_fleet_start(0, 0);
    f.ra = ts_remote_open(f.a, f.rs.url, 1, 0);
    ctxs_model m = sched_model(CTXS_DTYPE_BF16);
    ctxs_session *s = make_session(f.a, "chat", &m, 250, CAP);
    ctxs_remote_stats st;
    cr_assert_eq(ctxs_remote_flush(&st, f.ra, TS_FLUSH_MS), 0);
    cr_assert_eq(st.last_error, 0, "%s", ctxs_err_name(st.last_error));
    cr_assert_eq(ts_redis_count(&f.rs, "ctxs:chunk:*"), 3, "the whole chunks");
    cr_assert_eq(ts_redis_count(&f.rs, "ctxs:session:*"), 0, "no record before the close");
    cr_assert_eq(ts_redis_count(&f.rs, "ctxs:window:*"), 0);
    ctxs_session_close(s);
    cr_assert_eq(ctxs_remote_flush(&st, f.ra, TS_FLUSH_MS), 0);
    cr_assert_eq(st.last_error, 0, "%s", ctxs_err_name(st.last_error));
    cr_assert_eq(st.chunks_dropped, 0);
    cr_assert_eq(ts_redis_count(&f.rs, "ctxs:chunk:*"), 4, "and the tail");
    cr_assert_eq(ts_redis_count(&f.rs, "ctxs:window:*"), 1);
    cr_assert_eq(ts_redis_count(&f.rs, "ctxs:session:*"), 1);

    f.rb = ts_remote_open(f.b, f.rs.url, 0, 0);
    ctxs_remote_pull_result res;
    pull_into(&res, f.rb, "chat", "chat");
    cr_assert_eq(res.n_tokens, 250);
    s = NULL;
    cr_assert_eq(ctxs_store_session_open(&s, f.a, "chat", NULL, CTXS_RDONLY, NULL), 0);
    assert_same(s, f.b, "chat", 250);

    /* Listed as any record. */
    ctxs_remote_entry *e = NULL;
    size_t n_e = 0;
    cr_assert_eq(ctxs_remote_list(&e, &n_e, f.rb), 0);
    cr_assert_eq(n_e, 1);
    cr_assert_eq(e[0].status, 0);
    cr_assert_eq(e[0].n_tokens, 250);
    ctxs_free(e);
    ctxs_session_close(s);
    ts_fleet_stop(&f);
}

/* A prefix pull ends where a window value is: at the prompt's end when a
 * session of that count was pushed, else at the largest chunk boundary
 * that has one, else nowhere (CTXS_ENOTFOUND). */
Test(remote_schedule, a_prefix_pull_ends_where_a_window_value_is)
{
    ts_fleet f = ts_fleet_start(1, 0);
    ctxs_model m = sched_model(CTXS_DTYPE_F16);
    ctxs_session *s = make_session(f.a, "long", &m, 300, CAP);
    push(f.ra, "long", 300);
    uint32_t *ids = ids_upto(300);
    ctxs_remote_pull_result res;
    int rc = ctxs_remote_pull_prefix(NULL, &res, f.rb, "p300", &m, ids, 300, NULL, NULL);
    cr_assert_eq(rc, 0, "%s", ctxs_get_last_error());
    cr_assert_eq(res.n_tokens, 300);
    assert_same(s, f.b, "p300", 300);
    rc = ctxs_remote_pull_prefix(NULL, &res, f.rb, "p250", &m, ids, 250, NULL, NULL);
    cr_assert_eq(rc, CTXS_ENOTFOUND, "no window value below 300: %s", ctxs_err_name(rc));

    ctxs_session *t = make_session(f.a, "mid", &m, 192, CAP);
    push(f.ra, "mid", 192);
    rc = ctxs_remote_pull_prefix(NULL, &res, f.rb, "p250", &m, ids, 250, NULL, NULL);
    cr_assert_eq(rc, 0, "%s", ctxs_get_last_error());
    cr_assert_eq(res.n_tokens, 192);
    cr_assert_eq(res.chunks_pulled, 4, "3 chunks and the window value");
    assert_same(t, f.b, "p250", 192);
    ctxs_session_close(t);
    ctxs_session_close(s);
    free(ids);
    ts_fleet_stop(&f);
}

/* Slots that lay a windowed layer out without its ring: a push of such a
 * session and a pull into such slots are CTXS_EINVAL, saying so; a pull
 * that picks its own slots makes them hold every ring. */
Test(remote_schedule, slots_without_a_ring_are_refused_with_a_reason)
{
    ts_fleet f = ts_fleet_start(1, 0);
    ctxs_model m = sched_model(CTXS_DTYPE_F16);
    /* 160 slots: the 150 window's ring (158) would not fit beside the sinks. */
    ctxs_session *s = make_session(f.a, "narrow", &m, 100, 160);
    int rc = ctxs_remote_push(NULL, f.ra, "narrow", NULL);
    cr_assert_eq(rc, CTXS_EINVAL, "%s", ctxs_err_name(rc));
    cr_assert(strstr(ctxs_get_last_error(), "ring"), "%s", ctxs_get_last_error());
    ctxs_session_close(s);

    s = make_session(f.a, "chat", &m, 100, CAP);
    push(f.ra, "chat", 100);
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = 160;
    o.batch = BATCH;
    rc = ctxs_remote_pull(NULL, NULL, f.rb, "chat", "narrow", &o, NULL);
    cr_assert_eq(rc, CTXS_EINVAL, "%s", ctxs_err_name(rc));
    cr_assert(strstr(ctxs_get_last_error(), "ring"), "%s", ctxs_get_last_error());
    ctxs_session_entry e;
    cr_assert_eq(ctxs_store_session_get(&e, f.b, "narrow"), CTXS_ENOTFOUND);
    /* Asked for nothing: the default slots and batch, raised for the rings. */
    ctxs_remote_pull_result res;
    pull_into(&res, f.rb, "chat", "chat");
    cr_assert_eq(res.n_tokens, 100);
    assert_same(s, f.b, "chat", 100);
    ctxs_session_close(s);
    ts_fleet_stop(&f);
}

/* A session without a schedule writes the values of 1.0, as before 2.0:
 * old fleets read them. */
Test(remote_schedule, a_session_without_a_schedule_writes_1_0_values)
{
    ts_fleet f = ts_fleet_start(0, 0);
    f.ra = ts_remote_open(f.a, f.rs.url, 0, 0);
    ctxs_model m = sched_model(CTXS_DTYPE_F16);
    m.geometry.period = 0;
    memset(m.geometry.window, 0, sizeof(m.geometry.window));
    ctxs_session *s = make_session(f.a, "plain", &m, 100, CAP);
    push(f.ra, "plain", 100);
    ctxs_session_close(s);
    uint32_t *ids = ids_upto(100);
    char key[512];
    key_of(key, sizeof(key), "chunk", &m, ids, 64);
    cr_assert(strstr(key, ":f16-6x2x16:"), "%s", key);
    size_t len;
    uint8_t *v = ts_redis_get(&f.rs, key, &len);
    cr_assert_not_null(v, "%s", key);
    ctxs__rchunk_header h;
    memcpy(&h, v, sizeof(h));
    cr_assert_eq(h.version_major, 1);
    cr_assert_eq(h.schedule_crc32, 0);
    cr_assert_eq(h.raw_bytes, 64 * (12 + 2 * LAYERS * HEADS * DIM * 2));
    free(v);
    v = ts_redis_get(&f.rs, "ctxs:session:plain", &len);
    cr_assert_not_null(v);
    ctxs__rsession_header rh;
    memcpy(&rh, v, sizeof(rh));
    cr_assert_eq(rh.version_major, 1);
    cr_assert_eq(len, sizeof(rh) + 100 * 4 + rh.meta_bytes);
    free(v);
    cr_assert_eq(ts_redis_count(&f.rs, "ctxs:window:*"), 0);
    free(ids);
    ts_fleet_stop(&f);
}
