/*
 * The write path (src/store/kv_write.c): ctxs_session_write_layer() and
 * ctxs_session_write_token(), both ways into the slots (stores into pages
 * still mapped writable, pwrite() through the file elsewhere): the bytes
 * each dtype and form give, what the mapping shows before the commit, the
 * arguments refused, the page faults never taken on the caller's thread,
 * and what a write into the file that fails leaves behind.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <signal.h>
#include <unistd.h>

#include "ctxstore.h"
#include "dtype.h"
#include "internal.h"
#include "platform.h"
#include "support.h"
#include "syscall.h"

TestSuite(write, .init = ts_scratch_init, .fini = ts_scratch_fini, .timeout = 300);

#define N_LAYERS 3u
#define N_HEADS 2u
#define HEAD_DIM 64u
#define HEADS (N_LAYERS * N_HEADS)
#define MAX_TOKENS 96u

static const uint32_t dtypes[] = { CTXS_DTYPE_F16, CTXS_DTYPE_BF16, CTXS_DTYPE_Q8 };

static ctxs_model model_of(uint32_t dtype)
{
    ctxs_model m = ts_model(11);
    m.geometry = (ctxs_geometry){ N_LAYERS, N_HEADS, HEAD_DIM, dtype, 0, {0} };
    return m;
}

static void path_reset(void)
{
    ctxs__write_path_force = 0;
}

/* The float32 K (kind 0) or V (kind 1) element the engine has for (pos,
 * layer, head, i): either sign, several orders of magnitude, now and then
 * a value fp16 rounds or a tiny one. */
static float value(uint64_t pos, uint32_t kind, uint32_t layer, uint32_t head, uint32_t i)
{
    uint64_t x = ts_mix64(((pos * 2 + kind) * N_LAYERS + layer) * 1000003u + head * 4099u + i);
    float a = (float)((int64_t)(x % 200001) - 100000) / 1000.0f;
    switch ((x >> 20) % 8) {
    case 0: return a * 1e-6f;
    case 1: return a * 37.0f;
    case 2: return a + 0.00048828125f; /* half an fp16 ulp at 1 */
    default: return a;
    }
}

/* One head of one token in the form `form` for a session of dtype: the
 * floats narrowed, or for the session's own Q8 encoded (into out, and the
 * scale into *scale). Returns the bytes of the elements. */
static size_t head_in_form(uint8_t *out, float *scale, uint64_t pos, uint32_t kind,
                           uint32_t layer, uint32_t head, uint32_t form)
{
    float x[HEAD_DIM];
    for (uint32_t i = 0; i < HEAD_DIM; i++)
        x[i] = value(pos, kind, layer, head, i);
    if (form == CTXS_DTYPE_Q8) {
        cr_assert_eq(ctxs_dtype_encode(out, scale, x, HEAD_DIM, form), 0);
        return HEAD_DIM;
    }
    ctxs__narrow(out, x, form, HEAD_DIM);
    return HEAD_DIM * (form == CTXS_DTYPE_F32 ? 4u : 2u);
}

/* Bytes of one head of one token handed over in form. */
static size_t head_bytes(uint32_t form)
{
    return HEAD_DIM * (form == CTXS_DTYPE_F32 ? 4u : form == CTXS_DTYPE_Q8 ? 1u : 2u);
}

/* Token pos as write_token takes it: [layers][heads][dim] of form, then for
 * Q8 the [layers][heads] scales. */
static void token_form(uint8_t *k, uint8_t *v, uint64_t pos, uint32_t form)
{
    const size_t eb = head_bytes(form);
    for (uint32_t kind = 0; kind < 2; kind++) {
        uint8_t *p = kind ? v : k;
        for (uint32_t l = 0; l < N_LAYERS; l++)
            for (uint32_t h = 0; h < N_HEADS; h++) {
                float sc = 0;
                head_in_form(p + (l * N_HEADS + h) * eb, &sc, pos, kind, l, h, form);
                if (form == CTXS_DTYPE_Q8)
                    memcpy(p + HEADS * eb + (l * N_HEADS + h) * 4, &sc, 4);
            }
    }
}

/* Tokens [first, first + n) of one layer as write_layer takes them:
 * [n][heads][dim] of form, then for Q8 the [n][heads] scales. */
static void layer_form(uint8_t *k, uint8_t *v, uint64_t first, uint32_t n, uint32_t layer,
                       uint32_t form)
{
    const size_t eb = head_bytes(form);
    for (uint32_t kind = 0; kind < 2; kind++) {
        uint8_t *p = kind ? v : k;
        for (uint32_t t = 0; t < n; t++)
            for (uint32_t h = 0; h < N_HEADS; h++) {
                float sc = 0;
                head_in_form(p + (t * N_HEADS + h) * eb, &sc, first + t, kind, layer, h, form);
                if (form == CTXS_DTYPE_Q8)
                    memcpy(p + (size_t)n * N_HEADS * eb + (t * N_HEADS + h) * 4, &sc, 4);
            }
    }
}

static uint8_t g_k[MAX_TOKENS * HEADS * HEAD_DIM * 4 + MAX_TOKENS * HEADS * 4];
static uint8_t g_v[sizeof(g_k)];

static ctxs_session *create(const char *name, uint32_t dtype, uint32_t capacity, uint32_t n_sink,
                            uint32_t ring, uint32_t background)
{
    ctxs_model m = model_of(dtype);
    ctxs_create_options o = ts_options(capacity, n_sink, ring, CTXS_SYNC_ASYNC);
    o.open.background = background;
    ctxs_session *s = NULL;
    int rc = ctxs_session_create(&s, ts_path(ts_scratch, name), &m, &o);
    cr_assert_eq(rc, 0, "create %s: %s", name, ctxs_err_name(rc));
    return s;
}

static uint32_t id_of(uint64_t pos)
{
    return ts_token(pos);
}

/* Reserves n, writes them with write_token in form, commits. */
static void append_tokens(ctxs_session *s, uint32_t n, uint32_t form)
{
    ctxs_reservation r;
    cr_assert_eq(ctxs_session_reserve(&r, s, n), 0);
    uint32_t ids[MAX_TOKENS];
    for (uint32_t i = 0; i < n; i++) {
        token_form(g_k, g_v, r.first_pos + i, form);
        int rc = ctxs_session_write_token(s, &r, i, g_k, g_v, form);
        cr_assert_eq(rc, 0, "write_token: %s", ctxs_err_name(rc));
        ids[i] = id_of(r.first_pos + i);
    }
    cr_assert_eq(ctxs_session_commit(s, ids, n), 0);
}

/* Writes tokens [i, i + n) of r for every layer, last layer first, with
 * write_layer in form. */
static void write_layers(ctxs_session *s, const ctxs_reservation *r, uint32_t i, uint32_t n,
                         uint32_t form)
{
    for (uint32_t l = N_LAYERS; l-- > 0;) {
        layer_form(g_k, g_v, r->first_pos + i, n, l, form);
        int rc = ctxs_session_write_layer(s, r, l, i, n, g_k, g_v, form);
        cr_assert_eq(rc, 0, "write_layer(%u, %u, %u): %s", l, i, n, ctxs_err_name(rc));
    }
}

/* Reserves n, writes them with write_layer in form, in two calls a layer
 * (split tokens apart), commits. */
static void append_layers(ctxs_session *s, uint32_t n, uint32_t split, uint32_t form)
{
    ctxs_reservation r;
    cr_assert_eq(ctxs_session_reserve(&r, s, n), 0);
    write_layers(s, &r, split, n - split, form);
    if (split)
        write_layers(s, &r, 0, split, form);
    uint32_t ids[MAX_TOKENS];
    for (uint32_t i = 0; i < n; i++)
        ids[i] = id_of(r.first_pos + i);
    cr_assert_eq(ctxs_session_commit(s, ids, n), 0);
}

/* Both sessions hold the same positions with the same stored bytes (K, V
 * and Q8 scales, as the session keeps them), and verify. */
static void same_bytes(const ctxs_session *a, const ctxs_session *b, uint32_t dtype,
                       const char *what)
{
    ctxs_session_info ia, ib;
    cr_assert_eq(ctxs_session_get_info(&ia, a), 0);
    cr_assert_eq(ctxs_session_get_info(&ib, b), 0);
    cr_assert_eq(ia.n_tokens, ib.n_tokens, "%s", what);
    static uint8_t ka[sizeof(g_k)], va[sizeof(g_k)], kb[sizeof(g_k)], vb[sizeof(g_k)];
    size_t bytes = ctxs_geometry_get_token_bytes(&ia.model.geometry, dtype);
    for (uint64_t p = 0; p < ia.n_tokens; p++) {
        int ra = ctxs_session_read_token(ka, va, a, p, dtype);
        int rb = ctxs_session_read_token(kb, vb, b, p, dtype);
        if (ra == CTXS_EEVICTED && rb == CTXS_EEVICTED)
            continue;
        cr_assert_eq(ra, 0, "%s: read %llu: %s", what, (unsigned long long)p, ctxs_err_name(ra));
        cr_assert_eq(rb, 0, "%s: read %llu: %s", what, (unsigned long long)p, ctxs_err_name(rb));
        cr_assert(memcmp(ka, kb, bytes) == 0 && memcmp(va, vb, bytes) == 0,
                  "%s: position %llu differs", what, (unsigned long long)p);
    }
    uint64_t bad = 0;
    cr_assert_eq(ctxs_session_verify(&bad, a), 0, "%s", what);
    cr_assert_eq(ctxs_session_verify(&bad, b), 0, "%s at %llu", what, (unsigned long long)bad);
}

Test(write, layer_stores_what_write_token_stores_in_every_dtype_form_and_way)
{
    static const uint32_t forms[] = { CTXS_DTYPE_F32, CTXS_DTYPE_F16, CTXS_DTYPE_BF16, 0 };
    static const char *const ways[] = { "chosen", "mapped", "file" };
    for (size_t d = 0; d < 3; d++)
        for (size_t f = 0; f < 4; f++)
            for (int way = 0; way < 3; way++) {
                uint32_t dtype = dtypes[d], form = forms[f] ? forms[f] : dtype;
                char what[128];
                snprintf(what, sizeof(what), "dtype %u, form %u, %s", dtype, form, ways[way]);
                ctxs__write_path_force = 0;
                ctxs_session *a = create("a", dtype, 256, 4, 0, 1);
                append_tokens(a, 50, form);
                append_tokens(a, 41, form);
                ctxs__write_path_force = way;
                ctxs_session *b = create("b", dtype, 256, 4, 0, 1);
                append_layers(b, 50, 17, form);
                append_layers(b, 41, 0, form);
                same_bytes(a, b, dtype, what);
                path_reset();
                ctxs_session_close(a);
                ctxs_session_close(b);
                unlink(ts_path(ts_scratch, "a"));
                unlink(ts_path(ts_scratch, "b"));
            }
}

/* A reservation across the end of a ring's slots has two spans; a call of
 * write_layer may straddle them. */
Test(write, layer_writes_across_the_wrap_of_a_ring)
{
    for (int way = 1; way <= 2; way++) {
        ctxs_session *a = create("a", CTXS_DTYPE_Q8, 64, 4, 1, 1);
        ctxs_session *b = create("b", CTXS_DTYPE_Q8, 64, 4, 1, 1);
        append_tokens(a, 50, CTXS_DTYPE_F32);
        append_tokens(b, 50, CTXS_DTYPE_F32);
        ctxs__write_path_force = way;
        append_tokens(a, 40, CTXS_DTYPE_F32);
        append_layers(b, 40, 9, CTXS_DTYPE_F32); /* slots 50..59, then 4.. */
        path_reset();
        same_bytes(a, b, CTXS_DTYPE_Q8, way == 1 ? "mapped" : "file");
        ctxs_session_close(a);
        ctxs_session_close(b);
        unlink(ts_path(ts_scratch, "a"));
        unlink(ts_path(ts_scratch, "b"));
    }
}

/* What a call writes is in the slots when it returns: the layout shows it,
 * and the attention plan of the pending tokens covers it. */
Test(write, layer_is_in_the_mapping_when_it_returns, .fini = path_reset)
{
    for (int way = 1; way <= 2; way++) {
        ctxs__write_path_force = way;
        ctxs_session *s = create("s", CTXS_DTYPE_F16, 256, 4, 0, 1);
        append_layers(s, 30, 0, CTXS_DTYPE_F32);
        ctxs_reservation r;
        cr_assert_eq(ctxs_session_reserve(&r, s, 20), 0);
        layer_form(g_k, g_v, r.first_pos, 20, 1, CTXS_DTYPE_F32);
        cr_assert_eq(ctxs_session_write_layer(s, &r, 1, 0, 20, g_k, g_v, CTXS_DTYPE_F32), 0);
        ctxs_attn_plan plan;
        cr_assert_eq(ctxs_session_get_attn_plan(&plan, s, 20), 0);
        cr_assert_eq(plan.n_tokens, 50);
        for (uint32_t kind = 0; kind < 2; kind++)
            for (uint32_t h = 0; h < N_HEADS; h++) {
                void *run;
                cr_assert_eq(ctxs_session_get_kv(&run, s, 1, kind, h), 0);
                for (uint32_t t = 0; t < 20; t++) {
                    uint16_t want[HEAD_DIM];
                    float x[HEAD_DIM];
                    for (uint32_t i = 0; i < HEAD_DIM; i++)
                        x[i] = value(r.first_pos + t, kind, 1, h, i);
                    ctxs__narrow(want, x, CTXS_DTYPE_F16, HEAD_DIM);
                    cr_assert(memcmp((uint8_t *)run + (r.spans[0].slot + t) * HEAD_DIM * 2, want,
                                     sizeof(want)) == 0,
                              "%s way: layer 1 kind %u head %u token %u not in the mapping",
                              way == 1 ? "mapped" : "file", kind, h, t);
                }
            }
        ctxs_session_close(s);
        unlink(ts_path(ts_scratch, "s"));
    }
}

Test(write, layer_refuses_what_it_cannot_store)
{
    ctxs_session *s = create("s", CTXS_DTYPE_Q8, 256, 4, 0, 1);
    append_tokens(s, 10, CTXS_DTYPE_F32);
    ctxs_reservation r;
    cr_assert_eq(ctxs_session_reserve(&r, s, 8), 0);
    layer_form(g_k, g_v, r.first_pos, 8, 0, CTXS_DTYPE_F32);
    cr_expect_eq(ctxs_session_write_layer(NULL, &r, 0, 0, 8, g_k, g_v, CTXS_DTYPE_F32), CTXS_EINVAL);
    cr_expect_eq(ctxs_session_write_layer(s, NULL, 0, 0, 8, g_k, g_v, CTXS_DTYPE_F32), CTXS_EINVAL);
    cr_expect_eq(ctxs_session_write_layer(s, &r, 0, 0, 8, NULL, g_v, CTXS_DTYPE_F32), CTXS_EINVAL);
    cr_expect_eq(ctxs_session_write_layer(s, &r, 0, 0, 8, g_k, NULL, CTXS_DTYPE_F32), CTXS_EINVAL);
    cr_expect_eq(ctxs_session_write_layer(s, &r, N_LAYERS, 0, 8, g_k, g_v, CTXS_DTYPE_F32),
                 CTXS_EINVAL, "a layer past the model's");
    cr_expect_eq(ctxs_session_write_layer(s, &r, 0, 0, 0, g_k, g_v, CTXS_DTYPE_F32), CTXS_EINVAL,
                 "no token");
    cr_expect_eq(ctxs_session_write_layer(s, &r, 0, 1, 8, g_k, g_v, CTXS_DTYPE_F32), CTXS_EINVAL,
                 "past the reservation");
    cr_expect_eq(ctxs_session_write_layer(s, &r, 0, 8, 1, g_k, g_v, CTXS_DTYPE_F32), CTXS_EINVAL,
                 "starting past the reservation");
    cr_expect_eq(ctxs_session_write_layer(s, &r, 0, UINT32_MAX, 2, g_k, g_v, CTXS_DTYPE_F32),
                 CTXS_EINVAL, "i + n wraps");
    cr_expect_eq(ctxs_session_write_layer(s, &r, 0, 0, 8, g_k, g_v, 5), CTXS_EINVAL, "dtype 5");
    ctxs_reservation forged = r;
    forged.first_pos = 2;
    cr_expect_eq(ctxs_session_write_layer(s, &forged, 0, 0, 8, g_k, g_v, CTXS_DTYPE_F32),
                 CTXS_EINVAL, "committed positions");
    forged.first_pos = UINT64_MAX - 3;
    cr_expect_eq(ctxs_session_write_layer(s, &forged, 0, 0, 8, g_k, g_v, CTXS_DTYPE_F32),
                 CTXS_EINVAL, "positions never reserved");
    /* Q8 cannot hold what is not finite: refused in both ways. */
    for (int way = 1; way <= 2; way++) {
        ctxs__write_path_force = way;
        ((float *)(void *)g_k)[5 * N_HEADS * HEAD_DIM + 3] = INFINITY;
        cr_expect_eq(ctxs_session_write_layer(s, &r, 0, 0, 8, g_k, g_v, CTXS_DTYPE_F32), CTXS_EINVAL,
                     "infinity into Q8");
        layer_form(g_k, g_v, r.first_pos, 8, 0, CTXS_DTYPE_F32);
        cr_expect_eq(ctxs_session_write_layer(s, &r, 0, 0, 8, g_k, g_v, CTXS_DTYPE_F32), 0);
    }
    path_reset();
    uint32_t ids[8];
    for (uint32_t i = 0; i < 8; i++)
        ids[i] = id_of(r.first_pos + i);
    for (uint32_t l = 1; l < N_LAYERS; l++) {
        layer_form(g_k, g_v, r.first_pos, 8, l, CTXS_DTYPE_F32);
        cr_assert_eq(ctxs_session_write_layer(s, &r, l, 0, 8, g_k, g_v, CTXS_DTYPE_F32), 0);
    }
    cr_assert_eq(ctxs_session_commit(s, ids, 8), 0);
    cr_expect_eq(ctxs_session_write_layer(s, &r, 0, 0, 8, g_k, g_v, CTXS_DTYPE_F32), CTXS_EINVAL,
                 "a reservation already committed");
    uint64_t bad;
    cr_assert_eq(ctxs_session_verify(&bad, s), 0);
    ctxs_session_close(s);

    ctxs_model m = model_of(CTXS_DTYPE_Q8);
    cr_assert_eq(ctxs_session_open(&s, ts_path(ts_scratch, "s"), &m, CTXS_RDONLY, NULL), 0);
    cr_expect_eq(ctxs_session_write_layer(s, &r, 0, 0, 8, g_k, g_v, CTXS_DTYPE_F32), CTXS_EINVAL,
                 "a reader has no reservation");
    ctxs_session_close(s);
}

#ifdef RUSAGE_THREAD
static long thread_faults(void)
{
    struct rusage ru;
    cr_assert_eq(getrusage(RUSAGE_THREAD, &ru), 0);
    return ru.ru_minflt + ru.ru_majflt;
}
#endif

/* Geometry large enough that a turn spans many pages: 4 layers x 4 heads
 * x 128 dims of fp16, a 64-token run 16 KiB. */
static ctxs_model big_model(void)
{
    ctxs_model m = ts_model(12);
    m.geometry = (ctxs_geometry){ 4, 4, 128, CTXS_DTYPE_F16, 0, {0} };
    return m;
}

static ctxs_session *create_big(uint32_t background)
{
    ctxs_model m = big_model();
    ctxs_create_options o = ts_options(1024, 4, 0, CTXS_SYNC_ASYNC);
    o.open.background = background;
    ctxs_session *s = NULL;
    cr_assert_eq(ctxs_session_create(&s, ts_path(ts_scratch, "big"), &m, &o), 0);
    return s;
}

/* A turn of create_big()'s session, [layer][K|V][token][head][dim] fp16
 * of values in [1, 2). */
static const uint16_t *big_turn(void)
{
    static uint16_t kv[8 * 64 * 4 * 128];
    for (size_t i = 0; i < sizeof(kv) / 2; i++)
        kv[i] = (uint16_t)(0x3c00u | (ts_mix64(i) & 0x3ffu));
    return kv;
}

/* How big_turn_write() writes a turn. */
enum { BY_LAYER, BY_TOKEN, THROUGH_MAPPING };

/* Writes a 64-token turn of create_big()'s session from kv: a layer of all
 * its tokens at a time, one token's layer at a time (a reply decoded token
 * by token), or through the mapping, one memcpy per run. */
static void big_turn_write(ctxs_session *s, const ctxs_reservation *r, const uint16_t *kv,
                           int how)
{
    const size_t per_kind = 64 * 4 * 128;
    if (how == BY_LAYER) {
        for (uint32_t l = 0; l < 4; l++)
            cr_assert_eq(ctxs_session_write_layer(s, r, l, 0, 64, kv + 2 * l * per_kind,
                                                  kv + (2 * l + 1) * per_kind, CTXS_DTYPE_F16),
                         0);
        return;
    }
    if (how == BY_TOKEN) {
        for (uint32_t t = 0; t < 64; t++)
            for (uint32_t l = 0; l < 4; l++) {
                const uint16_t *k = kv + 2 * l * per_kind + t * 4 * 128;
                cr_assert_eq(ctxs_session_write_layer(s, r, l, t, 1, k, k + per_kind,
                                                      CTXS_DTYPE_F16),
                             0);
            }
        return;
    }
    ctxs_layout lay;
    cr_assert_eq(ctxs_session_get_layout(&lay, s), 0);
    for (uint32_t run = 0; run < 32; run++) {
        uint8_t *dst = (uint8_t *)lay.kv + run * lay.head_stride + r->spans[0].slot * lay.slot_bytes;
        memcpy(dst, kv + run * 64 * 128, 64 * lay.slot_bytes);
    }
}

static void big_commit(ctxs_session *s, const ctxs_reservation *r)
{
    uint32_t ids[64];
    for (uint32_t i = 0; i < 64; i++)
        ids[i] = id_of(r->first_pos + i);
    cr_assert_eq(ctxs_session_commit(s, ids, 64), 0);
}

/* create_big()'s session with the background work and a first turn,
 * written a layer at a time and committed (the worker may still be making
 * the runway after it). */
static ctxs_session *big_with_a_turn(void)
{
    ctxs_session *s = create_big(1);
    ctxs_reservation r;
    cr_assert_eq(ctxs_session_reserve(&r, s, 64), 0);
    big_turn_write(s, &r, big_turn(), BY_LAYER);
    big_commit(s, &r);
    return s;
}

/* After a writeback cleaned every page (as the kernel's flusher does after
 * a pause of half a minute), stores through the mapping fault on the
 * caller's thread; write_layer takes none, there or after a short pause,
 * whatever way it chooses, a layer of the turn at a time or a token's
 * layer at a time (while the worker maps the tokens ahead). */
Test(write, layer_takes_no_page_fault_on_the_callers_thread)
{
#ifndef RUSAGE_THREAD
    cr_skip_test("no per-thread fault counts on this system");
#else
    const uint16_t *kv = big_turn();
    for (uint32_t background = 0; background <= 1; background++) {
        ctxs_session *s = create_big(background);
        ctxs_reservation r;
        cr_assert_eq(ctxs_session_reserve(&r, s, 64), 0);
        big_turn_write(s, &r, kv, BY_LAYER);
        big_commit(s, &r); /* a sync now has something to write back */
        for (int turn = 0; turn < 10; turn++) {
            /* Even turns: after a writeback of everything (the worker idle
             * first, so that nothing maps the pages again); odd ones: right
             * after the last commit, its runway mapped. The first two are a
             * warm-up (the write path's buffer is made once); from turn 6
             * on, a token at a time. */
            int cleaned = turn % 2 == 0, how = turn < 6 ? BY_LAYER : BY_TOKEN;
            ctxs__background_wait_idle();
            cr_assert_eq(ctxs_session_reserve(&r, s, 64), 0);
            if (cleaned) {
                ctxs__background_wait_idle();
                cr_assert_eq(ctxs_session_sync(s), 0);
            }
            long before = thread_faults();
            big_turn_write(s, &r, kv, how);
            long faults = thread_faults() - before;
            if (turn >= 2)
                cr_expect_eq(faults, 0, "background %u, turn %d (%s, %s): %ld page faults in"
                             " write_layer", background, turn,
                             cleaned ? "after a writeback" : "right after a commit",
                             how == BY_LAYER ? "by layer" : "by token", faults);
            big_commit(s, &r);
        }
        /* The measure counts faults: stores through the mapping after the
         * same writeback take them. Without the worker only: with it, the
         * sync has the runway mapped again, maybe before the stores. */
        if (!background) {
            cr_assert_eq(ctxs_session_reserve(&r, s, 64), 0);
            cr_assert_eq(ctxs_session_sync(s), 0);
            long before = thread_faults();
            big_turn_write(s, &r, kv, THROUGH_MAPPING);
            cr_expect_geq(thread_faults() - before, 32, "stores through the mapping after a "
                          "writeback took no fault: the count measures nothing");
            big_commit(s, &r);
        }
        uint64_t bad;
        cr_assert_eq(ctxs_session_verify(&bad, s), 0);
        ctxs_session_close(s);
        unlink(ts_path(ts_scratch, "big"));
    }
#endif
}

/* Whether the pages of 64 runway slots after position `from` in run `run`
 * are dirty: 1, 0, -1 where the page cache cannot tell. */
static int run_dirty(const ctxs_session *s, uint32_t run, uint64_t from)
{
    return ctxs__range_dirty(s->fd,
                             s->lay.kv_off + ctxs__run_off(&s->lay, run) +
                                 from * s->lay.slot_bytes,
                             64 * s->lay.slot_bytes);
}

/* The runway's first run (layer 0, K, head 0). */
static int runway_dirty(const ctxs_session *s, uint64_t from)
{
    return run_dirty(s, 0, from);
}

/* Waits at most `seconds` for the worker to map run `run` of the runway
 * after position 64 writable again (its pages dirty), then stores a turn
 * there through the mapping: no page fault, and it commits and verifies.
 * Closes s. */
static void expect_runway_mapped_again(ctxs_session *s, uint32_t run, int seconds,
                                       const char *what)
{
    int dirty = run_dirty(s, run, 64);
    for (int i = 0; i < seconds * 10 && dirty == 0; i++) {
        usleep(100 * 1000);
        dirty = run_dirty(s, run, 64);
    }
    cr_assert_eq(dirty, 1, "the worker did not map %s again", what);
    ctxs__background_wait_idle(); /* it maps the first layer first */
    ctxs_reservation r;
    cr_assert_eq(ctxs_session_reserve(&r, s, 64), 0);
    long before = thread_faults();
    big_turn_write(s, &r, big_turn(), THROUGH_MAPPING);
    long faults = thread_faults() - before;
#ifndef __SANITIZE_ADDRESS__
    /* (Under ASan the first stores into slots this thread never touched
     * fault on their shadow memory, one page a run.) */
    cr_expect_lt(faults, 32, "%ld page faults storing a turn into %s mapped again", faults,
                 what);
#else
    (void)faults;
#endif
    big_commit(s, &r);
    uint64_t bad;
    cr_assert_eq(ctxs_session_verify(&bad, s), 0);
    ctxs_session_close(s);
}

/* The kernel's flusher writes the runway back while the user reads (after
 * 30 s) and write-protects it; the worker maps it writable again, so that
 * the next turn's stores through the mapping take no page fault. The
 * writeback is done here as the flusher does it, from outside the
 * library. */
Test(write, the_runway_is_mapped_again_after_the_flusher_cleans_it)
{
#ifndef RUSAGE_THREAD
    cr_skip_test("no per-thread fault counts on this system");
#else
    ctxs_session *s = big_with_a_turn();
    ctxs__background_wait_idle(); /* the runway after the commit */
    int fd = open(ts_path(ts_scratch, "big"), O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    cr_assert_eq(fdatasync(fd), 0);
    close(fd);
    int dirty = runway_dirty(s, 64);
    if (dirty < 0) {
        ctxs_session_close(s);
        cr_skip_test("the page cache cannot be asked which pages are dirty (cachestat)");
    }
    cr_assert_eq(dirty, 0, "the writeback left the runway dirty: the test measures nothing");
    expect_runway_mapped_again(s, 0, 60, "the cleaned runway");
#endif
}

/* create_big()'s session with a turn, once the worker has mapped the
 * runway after it; skips the test where the page cache cannot tell. */
static ctxs_session *big_with_its_runway_mapped(void)
{
    ctxs_session *s = big_with_a_turn();
    ctxs__background_wait_idle(); /* the runway after the commit */
    if (runway_dirty(s, 64) < 0) {
        ctxs_session_close(s);
        cr_skip_test("the page cache cannot be asked which pages are dirty (cachestat)");
    }
    cr_assert_eq(runway_dirty(s, 64), 1, "the runway is not mapped: the test measures nothing");
    return s;
}

/* ctxs_session_sync() writes the runway back with the turns (its zeros
 * are dirty pages of the file) and write-protects it; the worker maps it
 * writable again, as after the flusher. */
Test(write, the_runway_is_mapped_again_after_a_sync)
{
#ifndef RUSAGE_THREAD
    cr_skip_test("no per-thread fault counts on this system");
#else
    ctxs_session *s = big_with_its_runway_mapped();
    cr_assert_eq(ctxs_session_sync(s), 0, "%s", ctxs_get_last_error());
    expect_runway_mapped_again(s, 0, 10, "the runway after a sync");
#endif
}

/* Writes back every layer of create_big()'s session after the first, as a
 * pass of the flusher that stopped short does (writeback write-protects
 * each page it cleans). */
static void clean_after_the_first_layer(const ctxs_session *s)
{
    const uint64_t layer_bytes = 2 * s->lay.n_kv_heads * s->lay.head_stride;
    int fd = open(ts_path(ts_scratch, "big"), O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    cr_assert_eq(sync_file_range(fd, (off_t)(s->lay.kv_off + layer_bytes),
                                 (off_t)((s->lay.n_layers - 1) * layer_bytes),
                                 SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                                     SYNC_FILE_RANGE_WAIT_AFTER),
                 0, "sync_file_range: %s", strerror(errno));
    close(fd);
}

/* Asked on the engine's thread about several layers, the write path
 * answers for all of them: with the layers after the first cleaned, the
 * slots are not writable as a whole (they go through the file), while the
 * first layer alone still is. No worker: the reservation maps its slots
 * on the caller's thread. The turn still commits and verifies. */
Test(write, a_question_about_several_layers_is_answered_for_all)
{
    ctxs_session *s = create_big(0);
    const uint32_t layers = s->lay.n_layers;
    ctxs_reservation r;
    cr_assert_eq(ctxs_session_reserve(&r, s, 64), 0);
    if (run_dirty(s, 0, 0) < 0) {
        ctxs_session_close(s);
        cr_skip_test("the page cache cannot be asked which pages are dirty (cachestat)");
    }
    cr_assert_eq(ctxs__kv_writable(s, 0, 64, 0, layers, CTXS__ASK_OWNER, NULL), 1,
                 "the reservation is not mapped: the test measures nothing");
    clean_after_the_first_layer(s);
    cr_expect_eq(ctxs__kv_writable(s, 0, 64, 0, 1, CTXS__ASK_OWNER, NULL), 1,
                 "the first layer, still dirty, is not found writable");
    cr_expect_eq(ctxs__kv_writable(s, 0, 64, 0, layers, CTXS__ASK_OWNER, NULL), 0,
                 "all the layers are found writable, the cleaned ones too");
    big_turn_write(s, &r, big_turn(), BY_TOKEN);
    big_commit(s, &r);
    uint64_t bad;
    cr_assert_eq(ctxs_session_verify(&bad, s), 0);
    ctxs_session_close(s);
}

/* The flusher writes an inode back in chunks, each from where the last one
 * stopped, so a pass may clean the runway's later layers and leave its
 * first one dirty. The worker asks about every layer before it decides
 * that the runway is still mapped, and maps it again; the next turn's
 * stores through the mapping take no page fault. */
Test(write, a_runway_cleaned_after_its_first_layer_is_mapped_again)
{
#ifndef RUSAGE_THREAD
    cr_skip_test("no per-thread fault counts on this system");
#else
    ctxs_session *s = big_with_its_runway_mapped();
    clean_after_the_first_layer(s);
    const uint32_t last_run = 2 * s->lay.n_layers * s->lay.n_kv_heads - 1;
    cr_assert_eq(runway_dirty(s, 64), 1, "the first layer's runway was cleaned too");
    cr_assert_eq(run_dirty(s, last_run, 64), 0,
                 "the writeback left the last layer's runway dirty");
    /* 10 s at most: 20 of the worker's looks. */
    expect_runway_mapped_again(s, last_run, 10, "the runway's cleaned layers");
#endif
}

/* A reply decoded a token at a time, each token taking longer than the
 * write path trusts what it last learnt of a layer (as when attention
 * reads a long context between the writes): the first layer of a token
 * asks the page cache whether the mapped slots are still writable, for all
 * the token's layers, and the others ask nothing. Every store still goes
 * into the mapping (no fault), and the turn commits and verifies. */
Test(write, a_tokens_layers_ask_the_page_cache_once)
{
#ifndef RUSAGE_THREAD
    cr_skip_test("no per-thread fault counts on this system");
#else
    enum { TOKENS = 12 };
    const uint16_t *kv = big_turn();
    const size_t per_kind = 64 * 4 * 128;
    ctxs_session *s = big_with_a_turn();
    ctxs_reservation r;
    ctxs__background_wait_idle(); /* the runway after the commit */
    if (runway_dirty(s, 64) < 0) {
        ctxs_session_close(s);
        cr_skip_test("the page cache cannot be asked which pages are dirty (cachestat)");
    }
    cr_assert_eq(ctxs_session_reserve(&r, s, 64), 0);
    ctxs__background_wait_idle();
    uint64_t asks = atomic_load(&ctxs__write_path_asks);
    long faults = 0;
    for (uint32_t t = 0; t < TOKENS; t++) {
        usleep(80 * 1000); /* the engine's compute, longer than a layer is trusted */
        long before = thread_faults();
        for (uint32_t l = 0; l < 4; l++) {
            const uint16_t *k = kv + 2 * l * per_kind + t * 4 * 128;
            cr_assert_eq(ctxs_session_write_layer(s, &r, l, t, 1, k, k + per_kind,
                                                  CTXS_DTYPE_F16),
                         0);
        }
        faults += thread_faults() - before;
    }
    asks = atomic_load(&ctxs__write_path_asks) - asks;
    /* One question a token, and a few of the worker's, which looks at the
     * runway twice a second. */
    cr_expect_leq(asks, TOKENS + 4, "%" PRIu64 " questions to the page cache for %d tokens "
                  "of 4 layers", asks, TOKENS);
#ifndef __SANITIZE_ADDRESS__
    cr_expect_eq(faults, 0, "%ld page faults in write_layer", faults);
#else
    (void)faults; /* ASan's shadow of slots this thread never touched faults */
#endif
    for (uint32_t t = TOKENS; t < 64; t++)
        for (uint32_t l = 0; l < 4; l++) {
            const uint16_t *k = kv + 2 * l * per_kind + t * 4 * 128;
            cr_assert_eq(ctxs_session_write_layer(s, &r, l, t, 1, k, k + per_kind,
                                                  CTXS_DTYPE_F16),
                         0);
        }
    ctxs_layout lay;
    cr_assert_eq(ctxs_session_get_layout(&lay, s), 0);
    for (uint32_t run = 0; run < 32; run++) /* (layer, K|V, head) */
        for (uint32_t t = 0; t < 64; t++)
            cr_assert_eq(memcmp((const uint8_t *)lay.kv + run * lay.head_stride +
                                    (r.spans[0].slot + t) * lay.slot_bytes,
                                kv + ((run / 4) * 64 + t) * 4 * 128 + (run % 4) * 128,
                                lay.slot_bytes),
                         0, "run %u, token %u differs in the mapping", run, t);
    big_commit(s, &r);
    uint64_t bad;
    cr_assert_eq(ctxs_session_verify(&bad, s), 0);
    ctxs_session_close(s);
#endif
}

/* Bytes this process has dirtied in the page cache so far (a page counts
 * each time it goes from clean to dirty); -1 where the kernel does not say. */
static long long dirtied_bytes(void)
{
    FILE *f = fopen("/proc/self/io", "r");
    if (!f)
        return -1;
    char line[128];
    long long bytes = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "write_bytes: %lld", &bytes) == 1)
            break;
    fclose(f);
    return bytes;
}

/* Tokens [from, to) of big_turn()'s, written and committed one at a time
 * (a reply decoded token by token). */
static void decode_tokens(ctxs_session *s, uint32_t from, uint32_t to)
{
    const uint16_t *kv = big_turn();
    const size_t per_kind = 64 * 4 * 128;
    for (uint32_t t = from; t < to; t++) {
        ctxs_reservation r;
        cr_assert_eq(ctxs_session_reserve(&r, s, 1), 0);
        for (uint32_t l = 0; l < 4; l++) {
            const uint16_t *k = kv + 2 * l * per_kind + t * 4 * 128;
            cr_assert_eq(ctxs_session_write_layer(s, &r, l, 0, 1, k, k + per_kind,
                                                  CTXS_DTYPE_F16),
                         0);
        }
        uint32_t id = id_of(t);
        cr_assert_eq(ctxs_session_commit(s, &id, 1), 0);
        ctxs__background_wait_idle(); /* what this commit asked of the worker */
    }
}

/* A reply decoded and committed a token at a time at ASYNC: the writeback
 * after the commits leaves out the page each run is still filling and the
 * records and tables, which the next token writes again; it would
 * otherwise write-protect them and the next token would dirty them anew
 * (32 runs' pages a token). Once commits pause they are written back too:
 * by the worker, or without one by the next commit; and a close starts the
 * writeback of everything. */
Test(write, a_reply_decoded_token_by_token_is_written_back_once)
{
    enum { TOKENS = 48 };
    for (uint32_t background = 0; background <= 1; background++) {
        ctxs_session *s = create_big(background);
        const uint8_t *tokens_page = (const uint8_t *)ctxs__token_table(s);
        const uint64_t tokens_off = (uint64_t)(tokens_page - s->map) & ~(uint64_t)4095;
        decode_tokens(s, 0, 16); /* the runway has reached its size */
        long long dirtied = dirtied_bytes();
        decode_tokens(s, 16, TOKENS);
        if (dirtied < 0) {
            ctxs_session_close(s);
            cr_skip_test("the kernel does not count the bytes a process dirties "
                         "(/proc/self/io)");
        }
        dirtied = dirtied_bytes() - dirtied;
        /* 32 tokens of 256 bytes fill two pages of each of the 32 runs, and
         * a third begun: 96 pages, and the runway's few; rewritten each
         * token, about 1000. */
        cr_expect_lt(dirtied, 200 * 4096, "background %u: %lld bytes dirtied by %d tokens",
                     background, dirtied, TOKENS - 16);
        /* Run 0's filled pages are under writeback or written; the one it
         * fills, and the token table, wait for commits to pause. */
        const int filled = ctxs__range_dirty(s->fd, s->lay.kv_off, 2 * 4096);
        if (filled < 0) {
            ctxs_session_close(s);
            cr_skip_test("the page cache cannot be asked which pages are dirty (cachestat)");
        }
        cr_expect_eq(filled, 0, "background %u: the pages the tokens filled were not written "
                     "back", background);
        cr_expect_eq(ctxs__range_dirty(s->fd, tokens_off, 4096), 1,
                     "background %u: the token table was written back while commits went on",
                     background);
        int table_dirty = 1;
        if (background) {
            for (int i = 0; i < 100 && table_dirty; i++) { /* 10 s at most */
                usleep(100 * 1000);
                table_dirty = ctxs__range_dirty(s->fd, tokens_off, 4096);
            }
            decode_tokens(s, TOKENS, TOKENS + 1);
        } else {
            usleep((CTXS__WRITEBACK_SETTLE_MS + 100) * 1000);
            decode_tokens(s, TOKENS, TOKENS + 1); /* the first after a pause */
            table_dirty = ctxs__range_dirty(s->fd, tokens_off, 4096);
        }
        cr_expect_eq(table_dirty, 0, "background %u: the token table was not written back "
                     "once commits paused", background);
        /* One more token, then a close right away. */
        decode_tokens(s, TOKENS + 1, TOKENS + 2);
        const uint64_t filling = s->lay.kv_off + ((TOKENS + 1) * 256 / 4096) * 4096;
        int fd = open(ts_path(ts_scratch, "big"), O_RDONLY | O_CLOEXEC);
        cr_assert_geq(fd, 0);
        cr_expect_eq(ctxs__range_dirty(fd, filling, 4096), 1,
                     "background %u: the page run 0 fills was written back at once",
                     background);
        ctxs_session_close(s);
        cr_expect_eq(ctxs__range_dirty(fd, tokens_off, 4096), 0,
                     "background %u: the close left the token table dirty", background);
        cr_expect_eq(ctxs__range_dirty(fd, filling, 4096), 0,
                     "background %u: the close left the page run 0 was filling dirty",
                     background);
        close(fd);
        ctxs_model m = big_model();
        cr_assert_eq(ctxs_session_open(&s, ts_path(ts_scratch, "big"), &m, CTXS_OPEN_VERIFY,
                                       NULL),
                     0);
        ctxs_session_info info;
        cr_assert_eq(ctxs_session_get_info(&info, s), 0);
        cr_expect_eq(info.n_tokens, TOKENS + 2);
        ctxs_session_close(s);
        unlink(ts_path(ts_scratch, "big"));
    }
}

/* A regenerated reply: the session rolled back to the end of the prompt,
 * and the reply decoded again a token at a time. The rollback forgets what
 * was mapped (a writeback may have write-protected it since); the worker
 * maps the slots after it again, so that the new reply's tokens find theirs
 * mapped instead of each asking the worker for its own. */
Test(write, a_rollback_leaves_the_next_slots_mapped)
{
    ctxs_session *s = big_with_a_turn();
    decode_tokens(s, 0, 16); /* the first reply */
    cr_assert_eq(ctxs_session_rollback(s, 64), 0);
    ctxs__background_wait_idle();
    if (runway_dirty(s, 64) < 0) {
        ctxs_session_close(s);
        cr_skip_test("the page cache cannot be asked which pages are dirty (cachestat)");
    }
    for (uint64_t pos = 64; pos < 80; pos++)
        cr_expect_eq(ctxs__kv_writable(s, pos, pos + 1, 0, s->lay.n_layers, CTXS__ASK_OWNER,
                                       NULL),
                     1, "position %" PRIu64 " after the rollback is not mapped writable", pos);
    decode_tokens(s, 16, 32); /* the reply again, other K/V */
    uint64_t bad;
    cr_assert_eq(ctxs_session_verify(&bad, s), 0);
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_expect_eq(info.n_tokens, 80);
    ctxs_session_close(s);
    unlink(ts_path(ts_scratch, "big"));
}

/* The bytes a turn of 64 tokens of big_model()'s (its K/V: 512 KiB)
 * dirties, written a layer at a time and committed; -1 where the kernel
 * does not count them. */
static long long turn_dirtied(ctxs_session *s)
{
    long long before = dirtied_bytes();
    ctxs_reservation r;
    cr_assert_eq(ctxs_session_reserve(&r, s, 64), 0);
    big_turn_write(s, &r, big_turn(), BY_LAYER);
    big_commit(s, &r);
    ctxs__background_wait_idle();
    return before < 0 ? -1 : dirtied_bytes() - before;
}

/* Creates the session at path with turns of 64 tokens, closes it, has its
 * file read as another program would after the page cache lost it (written
 * back, dropped, then read() whole; with read_it 0, only dropped), and
 * opens it again with co's open options. */
static ctxs_session *made_dropped_reopened(const char *path, const ctxs_model *m,
                                      const ctxs_create_options *co, int turns, int read_it)
{
    ctxs_session *s;
    cr_assert_eq(ctxs_session_create(&s, path, m, co), 0);
    for (int t = 0; t < turns; t++)
        turn_dirtied(s);
    ctxs_session_close(s);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    cr_assert_eq(fdatasync(fd), 0);
    cr_assert_eq(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    static char buf[1 << 20];
    ssize_t got = 0;
    while (read_it && (got = read(fd, buf, sizeof buf)) > 0)
        ;
    cr_assert_eq(got, 0);
    close(fd);
    cr_assert_eq(ctxs_session_open(&s, path, m, 0, &co->open), 0);
    return s;
}

/* Ends the test, skipped, where no commit split folios since the count was
 * `splits`: the read() left small ones on this kernel. */
static void skip_unless_split(ctxs_session *s, uint64_t splits)
{
    if (atomic_load(&ctxs__folio_splits) != splits)
        return;
    ctxs_session_close(s);
    cr_skip_test("a read() left this file's pages in small folios here: nothing to split");
}

/* s holds n tokens, each of them verified. */
static void expect_kept(const ctxs_session *s, uint64_t n, const char *what)
{
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_expect_eq(info.n_tokens, n, "%s: %" PRIu64 " tokens held, not %" PRIu64, what,
                 info.n_tokens, n);
    uint64_t bad = 0;
    cr_expect_eq(ctxs_session_verify(&bad, s), 0, "%s: position %" PRIu64 " fails", what, bad);
}

/* Opens the session at path again and expects that open to have verified
 * it (the page cache vouching for nothing: what happened is `after`),
 * keeping n tokens, each of which verifies; closes it and removes it. */
static void expect_the_next_open_verifies(const char *path, const ctxs_model *m,
                                          const ctxs_open_options *oo, uint64_t n,
                                          const char *after)
{
    ctxs_session *s;
    cr_assert_eq(ctxs_session_open(&s, path, m, 0, oo), 0, "%s", ctxs_get_last_error());
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_expect_neq(info.flags & CTXS_INFO_VERIFIED, 0, "the open %s trusted the page cache",
                  after);
    expect_kept(s, n, after);
    ctxs_session_close(s);
    unlink(path);
}

/* Ends the test, skipped, on a system without a boot id, where every open
 * verifies. */
static void skip_without_a_boot_id(void)
{
    if (access("/proc/sys/kernel/random/boot_id", R_OK) != 0)
        cr_skip_test("no boot id here: every open verifies");
}

/* A session file read with read() by another program (a backup, cp) has
 * its pages, the empty slots' included, cached in folios of up to 2 MiB,
 * which the kernel dirties and writes back whole: each turn after that
 * writes every run's folio (a run of this session is 2 MiB). The first
 * commit after such a read splits the folios over the slots to come; the
 * turns after it dirty their own pages and the runway's, at ASYNC and at
 * FULL, in f16 and in Q8 (whose scales of those slots are zeroed in
 * place), and every turn is kept. */
Test(write, a_file_read_by_another_program_costs_the_next_turns_only_their_pages)
{
    static const struct {
        uint32_t dtype, durability, capacity;
        long long turn_bytes; /* the K/V of a turn, Q8's scales included */
    } cases[] = {
        {CTXS_DTYPE_F16, CTXS_SYNC_ASYNC, 8192, 64 * 32 * 256},
        {CTXS_DTYPE_F16, CTXS_SYNC_FULL, 8192, 64 * 32 * 256},
        {CTXS_DTYPE_Q8, CTXS_SYNC_ASYNC, 8192, 64 * 32 * (128 + 4)},
        /* A scale table of 2 MiB, whose folios a turn's scales fall in. */
        {CTXS_DTYPE_Q8, CTXS_SYNC_FULL, 16384, 64 * 32 * (128 + 4)},
    };
    const char *path = ts_path(ts_scratch, "read");
    for (uint32_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ctxs_model m = big_model();
        m.geometry.dtype = cases[i].dtype;
        const long long turn = cases[i].turn_bytes;
        ctxs_create_options co = ts_options(cases[i].capacity, 4, 0, cases[i].durability);
        ctxs_session *s = made_dropped_reopened(path, &m, &co, 4, 1);
        const uint64_t splits = atomic_load(&ctxs__folio_splits);
        const long long first = turn_dirtied(s);
        if (first < 0) {
            ctxs_session_close(s);
            cr_skip_test("the kernel does not count the bytes a process dirties "
                         "(/proc/self/io)");
        }
        if (first < 8 * turn) {
            ctxs_session_close(s);
            cr_skip_test("a read() left this file's pages in small folios here (%lld bytes "
                         "dirtied by a turn of %lld): nothing to split", first, turn);
        }
        for (int t = 0; t < 3; t++) {
            const long long dirtied = turn_dirtied(s);
            /* The turn's pages, the runway's, the tables' and records'. */
            cr_expect_lt(dirtied, 3 * turn,
                         "case %u: turn %d after the read dirtied %lld bytes (the first %lld, "
                         "a turn's K/V %lld)", i, t + 2, dirtied, first, turn);
        }
        cr_expect_eq(atomic_load(&ctxs__folio_splits) - splits, 1,
                     "case %u: the folios were split %" PRIu64 " times", i,
                     atomic_load(&ctxs__folio_splits) - splits);
        ctxs_session_close(s);
        cr_assert_eq(ctxs_session_open(&s, path, &m, CTXS_OPEN_VERIFY, &co.open), 0);
        expect_kept(s, 8 * 64, "after the reads");
        ctxs_session_close(s);
        unlink(path);
    }
}

/* After a cold open, nothing brings the slots still to be written into
 * the page cache ahead of the writes: a fault on the token table (the
 * commit stores its ids there) read around itself, as far as the device's
 * read-ahead, into the first runs' empty slots, in large folios that the
 * next turns then dirtied whole. */
Test(write, a_cold_open_reads_no_slot_ahead_of_the_writes)
{
    const char *path = ts_path(ts_scratch, "big");
    ctxs_model m = big_model();
    ctxs_create_options co = ts_options(2048, 4, 0, CTXS_SYNC_FULL);
    ctxs_session *s = made_dropped_reopened(path, &m, &co, 16, 0);
    ctxs__background_wait_idle(); /* the window brought in */
    turn_dirtied(s);
    /* Run 0's pages past the slots allocated, which nothing has written. */
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const uintptr_t run = (uintptr_t)(s->map + s->lay.kv_off);
    const uintptr_t from = (run + (uintptr_t)atomic_load(&s->alloc_end) * 256 + page - 1) &
                           ~(uintptr_t)(page - 1);
    const uintptr_t to = run + (uintptr_t)s->lay.capacity * 256;
    cr_assert_lt(from, to);
    unsigned char in[256];
    const size_t pages = (to - from) / page;
    cr_assert_leq(pages, sizeof in);
    cr_assert_eq(mincore((void *)from, to - from, in), 0, "mincore: %s", strerror(errno));
    size_t cached = 0;
    for (size_t i = 0; i < pages; i++)
        cached += in[i] & 1;
    cr_expect_eq(cached, 0, "%zu of the %zu pages of run 0 past the allocated slots were "
                 "brought in", cached, pages);
    ctxs_session_close(s);
    unlink(path);
}

/* A session closed a while after its last commit and opened again at
 * once: the runway the first handle mapped past the count (dirty zeros,
 * here past what the next handle allocates) is written back at its close,
 * and the next commits take nothing for a large folio (which would cost
 * each reopen a sync and a punch). */
Test(write, a_reopened_session_splits_nothing_it_did_not_read)
{
    const char *path = ts_path(ts_scratch, "big");
    ctxs_model m = big_model();
    ctxs_create_options co = ts_options(8192, 4, 0, CTXS_SYNC_ASYNC);
    for (uint32_t background = 0; background <= 1; background++) {
        co.open.background = background;
        ctxs_session *s;
        cr_assert_eq(ctxs_session_create(&s, path, &m, &co), 0);
        /* A prompt of 512 tokens, whose runway reaches 1,024 slots on. */
        ctxs_reservation r;
        cr_assert_eq(ctxs_session_reserve(&r, s, 512), 0);
        const uint16_t *kv = big_turn();
        const size_t per_kind = 64 * 4 * 128;
        for (uint32_t c = 0; c < 8; c++)
            for (uint32_t l = 0; l < 4; l++)
                cr_assert_eq(ctxs_session_write_layer(s, &r, l, c * 64, 64, kv + 2 * l * per_kind,
                                                      kv + (2 * l + 1) * per_kind,
                                                      CTXS_DTYPE_F16),
                             0);
        uint32_t ids[512];
        for (uint32_t i = 0; i < 512; i++)
            ids[i] = id_of(i);
        cr_assert_eq(ctxs_session_commit(s, ids, 512), 0);
        ctxs__background_wait_idle();
        usleep((CTXS__WRITEBACK_SETTLE_MS + 500) * 1000); /* commits paused */
        ctxs_session_close(s);
        const uint64_t splits = atomic_load(&ctxs__folio_splits);
        cr_assert_eq(ctxs_session_open(&s, path, &m, 0, &co.open), 0);
        for (int t = 0; t < 3; t++) {
            turn_dirtied(s);
            usleep((CTXS__FOLIO_CHECK_MS + 100) * 1000); /* each commit asks */
        }
        cr_expect_eq(atomic_load(&ctxs__folio_splits), splits,
                     "background %u: a reopened session split folios no read made", background);
        ctxs_session_close(s);
        unlink(path);
    }
}

/* A capacity whose runs end inside a page (8,200 slots of 256 bytes): a
 * run's last page is shared with the next run's first slots, which every
 * turn writes; that page is no large folio over slots still to be
 * written, and no commit splits anything for it. */
Test(write, runs_that_end_inside_a_page_split_nothing)
{
    const char *path = ts_path(ts_scratch, "odd");
    ctxs_model m = big_model();
    ctxs_create_options co = ts_options(8200, 4, 0, CTXS_SYNC_ASYNC);
    for (uint32_t background = 0; background <= 1; background++) {
        co.open.background = background;
        ctxs_session *s;
        cr_assert_eq(ctxs_session_create(&s, path, &m, &co), 0);
        if (ctxs__range_pages_dirty(s->fd, 0, 4096) < 0) {
            ctxs_session_close(s);
            cr_skip_test("no cachestat here: no commit asks about folios");
        }
        const uint64_t splits = atomic_load(&ctxs__folio_splits);
        turn_dirtied(s);
        usleep((CTXS__FOLIO_CHECK_MS + 100) * 1000); /* each commit asks */
        turn_dirtied(s);
        cr_expect_eq(atomic_load(&ctxs__folio_splits), splits,
                     "background %u: a commit split folios no read made", background);
        expect_kept(s, 2 * 64, "after the turns");
        ctxs_session_close(s);
        unlink(path);
    }
}

/* A commit of fewer tokens than reserved, while a map job for the whole
 * reservation still waits for the worker, after a read() left large
 * folios: the split punches the released slots, and the map job must not
 * map them after it (invariant R1: a slot is mapped writable only once it
 * has disk blocks; checked in this build). */
Test(write, a_split_after_a_partial_commit_leaves_no_map_job_past_the_count)
{
    const char *path = ts_path(ts_scratch, "read");
    ctxs_model m = big_model();
    ctxs_create_options co = ts_options(8192, 4, 0, CTXS_SYNC_ASYNC);
    ctxs_session *s = made_dropped_reopened(path, &m, &co, 4, 1);
    ctxs__background_wait_idle();
    const uint64_t splits = atomic_load(&ctxs__folio_splits);
    /* The worker is kept off while the reservation's map job is queued. */
    ctxs__background_hold(s);
    ctxs_reservation r;
    cr_assert_eq(ctxs_session_reserve(&r, s, 64), 0);
    big_turn_write(s, &r, big_turn(), BY_LAYER);
    uint32_t ids[10];
    for (uint32_t i = 0; i < 10; i++)
        ids[i] = id_of(r.first_pos + i);
    cr_assert_eq(ctxs_session_commit(s, ids, 10), 0);
    ctxs__background_release(s);
    ctxs__background_wait_idle();
    skip_unless_split(s, splits);
    cr_expect_leq(s->map_to, r.first_pos + 10, "the map job reaches position %" PRIu64,
                  s->map_to);
    turn_dirtied(s); /* the next turn, over the punched slots */
    expect_kept(s, 4 * 64 + 10 + 64, "after the partial commit");
    ctxs_session_close(s);
    unlink(path);
}

/* A turn of big_model()'s written and committed with the fault hook armed
 * to fail the nth call that can fail with EIO; returns the commit's
 * result. The session has no background thread, so that the counts are
 * the commit's own. */
static int turn_with_a_fault(ctxs_session *s, uint64_t nth)
{
    ctxs_reservation r;
    cr_assert_eq(ctxs_session_reserve(&r, s, 64), 0);
    big_turn_write(s, &r, big_turn(), BY_LAYER);
    uint32_t ids[64];
    for (uint32_t i = 0; i < 64; i++)
        ids[i] = id_of(r.first_pos + i);
    ctxs__fault_arm(nth, EIO, false);
    int rc = ctxs_session_commit(s, ids, 64);
    ctxs__fault_disarm();
    cr_assert_eq(ctxs__fault_failed(), 1, "call %llu was not failed", (unsigned long long)nth);
    return rc;
}

/* The split's errors, after a read() left large folios. Its sync fails:
 * the commit fails as a failed sync does (the session is to be reopened),
 * except at NONE, which syncs nothing else and goes on, and whose next
 * call (a sync here) fails in its place; nothing committed is lost either
 * way. Its punch fails: the commit succeeds, and the handle
 * asks no more (each question would cost a sync). */
Test(write, a_failed_split_loses_nothing)
{
    const char *path = ts_path(ts_scratch, "read");
    ctxs_model m = big_model();
    const uint32_t levels[2] = {CTXS_SYNC_ASYNC, CTXS_SYNC_NONE};
    for (uint32_t i = 0; i < 2; i++) {
        ctxs_create_options co = ts_options(8192, 4, 0, levels[i]);
        co.open.background = 0;
        ctxs_session *s = made_dropped_reopened(path, &m, &co, 4, 1);
        const uint64_t splits = atomic_load(&ctxs__folio_splits);
        int rc = turn_with_a_fault(s, 1);
        skip_unless_split(s, splits);
        cr_expect_str_eq(ctxs__fault_last_failed()->call, "fdatasync");
        if (levels[i] == CTXS_SYNC_ASYNC) {
            cr_expect_eq(rc, CTXS_EFAILED, "the split's failed sync: %s", ctxs_err_name(rc));
            ctxs_session_close(s);
            cr_assert_eq(ctxs_session_open(&s, path, &m, 0, &co.open), 0);
            expect_kept(s, 4 * 64, "after the failed sync");
        } else {
            cr_expect_eq(rc, 0, "the split's failed sync at NONE: %s", ctxs_err_name(rc));
            rc = ctxs_session_sync(s);
            cr_expect_eq(rc, CTXS_EFAILED, "a sync after the split's failed one at NONE: %s",
                         ctxs_err_name(rc));
            ctxs_session_close(s);
            cr_assert_eq(ctxs_session_open(&s, path, &m, 0, &co.open), 0);
            expect_kept(s, 5 * 64, "after the failed sync at NONE");
        }
        ctxs_session_close(s);
        unlink(path);
    }

    ctxs_create_options co = ts_options(8192, 4, 0, CTXS_SYNC_ASYNC);
    co.open.background = 0;
    ctxs_session *s = made_dropped_reopened(path, &m, &co, 4, 1);
    const uint64_t splits = atomic_load(&ctxs__folio_splits);
    cr_expect_eq(turn_with_a_fault(s, 2), 0); /* the sync, then the first punch */
    cr_expect_str_eq(ctxs__fault_last_failed()->call, "fallocate");
    cr_expect_eq(atomic_load(&ctxs__folio_splits), splits + 1);
    usleep((CTXS__FOLIO_CHECK_MS + 100) * 1000);
    turn_dirtied(s);
    cr_expect_eq(atomic_load(&ctxs__folio_splits), splits + 1,
                 "the handle asked again after its punch failed");
    expect_kept(s, 6 * 64, "after the failed punch");
    ctxs_session_close(s);
    unlink(path);
}

/* A writeback error that no call has reported when the handle closes (the
 * split's failed sync at NONE, here) is not lost with it: the page cache
 * no longer vouches for the file, so the next open verifies it, as after a
 * power cut, where a clean close in the same boot is trusted as it is. */
Test(write, a_writeback_error_unreported_at_close_makes_the_next_open_verify)
{
    skip_without_a_boot_id();
    const char *path = ts_path(ts_scratch, "read");
    ctxs_model m = big_model();
    ctxs_create_options co = ts_options(8192, 4, 0, CTXS_SYNC_NONE);
    co.open.background = 0;
    ctxs_session *s = made_dropped_reopened(path, &m, &co, 4, 1);
    ctxs_session_info info;
    turn_dirtied(s);
    ctxs_session_close(s);
    cr_assert_eq(ctxs_session_open(&s, path, &m, 0, &co.open), 0);
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_expect_eq(info.flags & CTXS_INFO_VERIFIED, 0, "a clean close in this boot was not trusted");
    ctxs_session_close(s);
    unlink(path);

    s = made_dropped_reopened(path, &m, &co, 4, 1);
    const uint64_t splits = atomic_load(&ctxs__folio_splits);
    cr_expect_eq(turn_with_a_fault(s, 1), 0); /* the split's sync, at NONE */
    skip_unless_split(s, splits);
    ctxs_session_close(s);
    expect_the_next_open_verifies(path, &m, &co.open, 5 * 64,
                                  "after a close that held an unreported writeback error");
}

/* Reserves and writes n tokens of ts_model()'s K/V, without Criterion (a
 * child's). Returns the error of the reserve or a write, or 0. */
static int reserve_and_write(ctxs_session *s, uint32_t n, uint64_t *first)
{
    ctxs_session_info info;
    int rc = ctxs_session_get_info(&info, s);
    ctxs_reservation r;
    if (rc < 0 || (rc = ctxs_session_reserve(&r, s, n)) < 0)
        return rc;
    uint16_t k[TS_KV_MAX], v[TS_KV_MAX];
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        ts_fill_kv(&info.model.geometry, r.first_pos + i, k, v);
        rc = ctxs_session_write_token(s, &r, i, k, v, CTXS_DTYPE_F16);
    }
    *first = r.first_pos;
    return rc;
}

/* The commit of the n tokens written from first; with the fault hook armed
 * to fail its nth call with EIO (0: none). Returns the commit's result and
 * the calls the hook counted in *calls. */
static int commit_with_the_hook(ctxs_session *s, uint64_t first, uint32_t n, uint64_t nth,
                                uint64_t *calls)
{
    uint32_t ids[64];
    for (uint32_t i = 0; i < n; i++)
        ids[i] = ts_token(first + i);
    ctxs__fault_arm(nth ? nth : UINT64_MAX, EIO, false);
    int rc = ctxs_session_commit(s, ids, n);
    *calls = ctxs__fault_calls();
    ctxs__fault_disarm();
    return rc;
}

/* Waits for a child of the tests below, which kills itself once it has
 * done its part: fails the test where it exited instead, saying why, and
 * skips it where the child found nothing to split (exit 7). */
static void expect_killed(pid_t pid)
{
    static const char *const why[] = {
        [1] = "it could not open the session",
        [2] = "a turn's reserve or writes failed",
        [3] = "a commit without a fault failed",
        [4] = "the commit with a fault did not return 0",
        [5] = "the armed call was not the writeback's sync_file_range",
    };
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 7)
        cr_skip_test("a read() left this file's pages in small folios here: nothing to split");
    if (WIFEXITED(status)) {
        const int code = WEXITSTATUS(status);
        cr_assert_fail("the child exited (%d): %s", code,
                       code > 0 && code < 6 ? why[code] : "it was not killed");
    }
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

/* A writeback that fails after its commit wrote the record (the worker's;
 * here, without one, the commit's own, which starts it last) unvouches the
 * records there and then: a process killed before any call reports the
 * error leaves a file that the next open in the same boot verifies, as
 * after a power cut, rather than trusting pages the disk may not have
 * taken. The injected failure dropped nothing, so every token verifies. */
Test(write, a_writeback_error_no_call_reported_before_a_kill_makes_the_next_open_verify)
{
    skip_without_a_boot_id();
    const char *path = ts_path(ts_scratch, "killed");
    ctxs_model m = ts_model(3);
    ctxs_create_options co = ts_options(256, 4, 0, CTXS_SYNC_ASYNC);
    co.open.background = 0; /* the writeback in the commit: the hook's count is the same */
    ctxs_session *s;
    cr_assert_eq(ctxs_session_create(&s, path, &m, &co), 0, "%s", ctxs_get_last_error());
    cr_assert_eq(ts_append(s, 64), 0, "%s", ctxs_get_last_error());
    ctxs_session_close(s);

    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        /* Two turns alike: the first counts the commit's calls, whose last
         * is the writeback's, and the second fails that one. */
        uint64_t first, calls, armed_calls;
        if (ctxs_session_open(&s, path, &m, 0, &co.open) != 0)
            _exit(1);
        if (reserve_and_write(s, 16, &first) != 0)
            _exit(2);
        if (commit_with_the_hook(s, first, 16, 0, &calls) != 0)
            _exit(3);
        if (reserve_and_write(s, 16, &first) != 0)
            _exit(2);
        if (commit_with_the_hook(s, first, 16, calls, &armed_calls) != 0)
            _exit(4);
        const struct ctxs__fault_site *site = ctxs__fault_last_failed();
        if (ctxs__fault_failed() != 1 || !site || strcmp(site->call, "sync_file_range") != 0)
            _exit(5);
        raise(SIGKILL);
        _exit(6);
    }
    expect_killed(pid);
    expect_the_next_open_verifies(path, &m, &co.open, 96,
                                  "after a kill with a writeback error pending");
}

/* A writeback that fails before a commit writes its record (at NONE, the
 * sync of a split, which the commit does not report) leaves that record
 * vouching for nothing either: killed before any later call, the next open
 * verifies. */
Test(write, a_record_written_after_a_failed_writeback_vouches_for_nothing)
{
    skip_without_a_boot_id();
    const char *path = ts_path(ts_scratch, "read");
    ctxs_model m = big_model();
    ctxs_create_options co = ts_options(8192, 4, 0, CTXS_SYNC_NONE);
    co.open.background = 0;
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        ctxs_session *s = made_dropped_reopened(path, &m, &co, 4, 1);
        const uint64_t splits = atomic_load(&ctxs__folio_splits);
        const int rc = turn_with_a_fault(s, 1); /* the split's sync, before the record */
        if (atomic_load(&ctxs__folio_splits) == splits)
            _exit(7);
        if (rc != 0)
            _exit(4);
        raise(SIGKILL);
        _exit(6);
    }
    expect_killed(pid);
    expect_the_next_open_verifies(path, &m, &co.open, 5 * 64,
                                  "after a kill, its record written after a failed writeback");
}

/* The first byte of [off, off + len) of fd that no extent covers (written
 * or only allocated), or off + len: FIEMAP, where SEEK_HOLE would take the
 * allocated but unwritten extents of fallocate for holes. -1 where the file
 * system cannot tell. */
static off_t first_unallocated(int fd, off_t off, off_t len)
{
    struct {
        struct fiemap map;
        struct fiemap_extent extents[32];
    } q;
    off_t at = off;
    while (at < off + len) {
        memset(&q, 0, sizeof q);
        q.map.fm_start = (uint64_t)at;
        q.map.fm_length = (uint64_t)(off + len - at);
        q.map.fm_flags = FIEMAP_FLAG_SYNC;
        q.map.fm_extent_count = 32;
        if (ioctl(fd, FS_IOC_FIEMAP, &q.map) != 0)
            return -1;
        if (q.map.fm_mapped_extents == 0 || (off_t)q.extents[0].fe_logical > at)
            return at;
        for (uint32_t i = 0; i < q.map.fm_mapped_extents; i++) {
            const struct fiemap_extent *e = &q.extents[i];
            if ((off_t)e->fe_logical > at)
                return at;
            at = (off_t)(e->fe_logical + e->fe_length);
            if (e->fe_flags & FIEMAP_EXTENT_LAST)
                return at < off + len ? at : off + len;
        }
    }
    return off + len;
}

/* A Q8 session's split zeroes the scales of the punched slots in place. A
 * file system that zeroes by freeing the blocks and allocating new ones
 * (XFS) can leave holes there where that fails: the split then lowers the
 * allocated slots to the count all the same, and allocating slots again
 * (a reserve, or the runway ahead of the reservations) allocates their
 * scales too, so that no store through the mapping meets a hole (a SIGBUS
 * on a full disk). The holes are made here by a punch, after a zeroing
 * failed by the fault hook. */
Test(write, allocating_slots_again_allocates_the_scales_a_failed_split_may_have_freed)
{
    const char *path = ts_path(ts_scratch, "read");
    ctxs_model m = big_model();
    m.geometry.dtype = CTXS_DTYPE_Q8;
    ctxs_create_options co = ts_options(8192, 4, 0, CTXS_SYNC_ASYNC);
    co.open.background = 0;
    ctxs_session *s = made_dropped_reopened(path, &m, &co, 16, 1);
    const uint64_t splits = atomic_load(&ctxs__folio_splits);
    /* The sync, a punch for each of the 32 runs, then the first zeroing. */
    cr_expect_eq(turn_with_a_fault(s, 2 + 32), 0);
    skip_unless_split(s, splits);
    cr_expect_str_eq(ctxs__fault_last_failed()->call, "fallocate");
    cr_assert_eq(atomic_load(&ctxs__folio_splits), splits + 1);
    /* Run 0's scales from slot 2,048 on (a block of their own, past the
     * 1,088 tokens held) freed, as such a file system may have left them. */
    const off_t scales = (off_t)s->lay.scales_off, from = scales + 2048 * 4,
                end = scales + (off_t)s->lay.capacity * 4;
    cr_assert_eq(fallocate(s->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, from, end - from), 0,
                 "punch: %s", strerror(errno));
    const off_t left = first_unallocated(s->fd, from, end - from);
    if (left < 0) {
        ctxs_session_close(s);
        cr_skip_test("FIEMAP: %s: cannot tell what is allocated", strerror(errno));
    }
    cr_assert_eq(left, from, "the punch left no hole");
    /* What the runway does after a commit: slots allocated ahead of the
     * reservations, then mapped, their scales included. */
    cr_assert_eq(ctxs__allocate_slots(s, 4096), 0);
    const off_t hole = first_unallocated(s->fd, from, scales + 4096 * 4 - from);
    cr_expect_eq(hole, scales + 4096 * 4, "the scales of slots allocated are a hole from slot %lld on",
                 (long long)((hole - scales) / 4));
    ctxs_session_close(s);
    cr_assert_eq(ctxs_session_open(&s, path, &m, CTXS_OPEN_VERIFY, &co.open), 0);
    expect_kept(s, 17 * 64, "after the allocation");
    ctxs_session_close(s);
    unlink(path);
}

/* A write into the file that fails partway (an error, or a short write and
 * then an error) is reported; the slots are written again by the next call,
 * and nothing committed changes. */
Test(write, a_failed_write_into_the_file_is_reported_and_loses_nothing, .fini = path_reset)
{
    static const struct {
        int error;
        bool persistent;
    } faults[] = { { EIO, false }, { ENOSPC, false }, { CTXS__FAULT_SHORT, true } };
    for (size_t f = 0; f < sizeof(faults) / sizeof(faults[0]); f++)
        for (uint64_t nth = 1; nth <= 8; nth += 3) {
            ctxs_session *s = create("s", CTXS_DTYPE_Q8, 256, 4, 0, 0);
            append_layers(s, 40, 0, CTXS_DTYPE_F32);
            ctxs__write_path_force = 2;
            ctxs_reservation r;
            cr_assert_eq(ctxs_session_reserve(&r, s, 30), 0);
            layer_form(g_k, g_v, r.first_pos, 30, 1, CTXS_DTYPE_F32);
            ctxs__fault_arm(nth, faults[f].error, faults[f].persistent);
            int rc = ctxs_session_write_layer(s, &r, 1, 0, 30, g_k, g_v, CTXS_DTYPE_F32);
            ctxs__fault_disarm();
            cr_assert_eq(ctxs__fault_failed(), 1 + (faults[f].persistent ? 1 : 0),
                         "fault %zu, call %llu: not injected", f, (unsigned long long)nth);
            int want = faults[f].error == ENOSPC ? CTXS_EFULL : -EIO;
            cr_assert_eq(rc, want, "fault %zu, call %llu: %s", f, (unsigned long long)nth,
                         ctxs_err_name(rc));
            uint32_t ids[30];
            for (uint32_t i = 0; i < 30; i++)
                ids[i] = id_of(r.first_pos + i);
            write_layers(s, &r, 0, 30, CTXS_DTYPE_F32);
            cr_assert_eq(ctxs_session_commit(s, ids, 30), 0);
            path_reset();
            ctxs_session *a = create("a", CTXS_DTYPE_Q8, 256, 4, 0, 0);
            append_tokens(a, 40, CTXS_DTYPE_F32);
            append_tokens(a, 30, CTXS_DTYPE_F32);
            same_bytes(a, s, CTXS_DTYPE_Q8, "after a failed write");
            ctxs_session_close(a);
            ctxs_session_close(s);
            unlink(ts_path(ts_scratch, "a"));
            unlink(ts_path(ts_scratch, "s"));
        }
}
