/*
 * Every session dtype (fp16, bf16, Q8) through the paths a session's bytes
 * take: write in every form an engine hands K/V over in, commit, read back,
 * reopen, recovery after a writer killed for real, verify (which must see a
 * damaged scale), fork, and export/import through a store.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctxstore.h"
#include "dtype.h"
#include "format.h"
#include "rng.h"
#include "support.h"

TestSuite(dtype, .init = ts_scratch_init, .fini = ts_scratch_fini, .timeout = 120);

#define N_LAYERS 2u
#define N_HEADS 2u
#define HEAD_DIM 16u
#define ELEMS (N_LAYERS * N_HEADS * HEAD_DIM)

static const uint32_t dtypes[] = { CTXS_DTYPE_F16, CTXS_DTYPE_BF16, CTXS_DTYPE_Q8 };
static const char *const dtype_names[] = { "f16", "bf16", "q8" };
#define N_DTYPES 3

static ctxs_model model_of(uint32_t dtype)
{
    ctxs_model m = ts_model(7);
    m.geometry = (ctxs_geometry){ N_LAYERS, N_HEADS, HEAD_DIM, dtype, 0, {0} };
    return m;
}

/* K and V of position pos as an engine holds them in float32: values of
 * either sign over a few orders of magnitude, head 1 with larger ones. */
static void fill_f32(uint64_t pos, float *k, float *v)
{
    uint64_t x = ts_mix64(pos * 0x9e3779b97f4a7c15ull + 1);
    for (uint32_t i = 0; i < ELEMS; i++) {
        x = ts_mix64(x);
        float a = (float)((int64_t)(x >> 11) % 20001 - 10000) / 10000.0f;
        float head_gain = ((i / HEAD_DIM) % N_HEADS) ? 8.0f : 1.0f;
        k[i] = a * head_gain;
        v[i] = (float)((int64_t)(x >> 40) % 2001 - 1000) / 1000.0f;
    }
}

/* The float a dtype stores for x, as write_token converts it. */
static void expected_f32(uint32_t dtype, const float *x, float *out)
{
    for (uint32_t h = 0; h < ELEMS / HEAD_DIM; h++) {
        const float *in = x + h * HEAD_DIM;
        float *o = out + h * HEAD_DIM;
        if (dtype == CTXS_DTYPE_Q8) {
            int8_t q[HEAD_DIM];
            float scale = ctxs__q8_quantize(q, in, HEAD_DIM);
            for (uint32_t i = 0; i < HEAD_DIM; i++)
                o[i] = scale * (float)q[i];
            continue;
        }
        for (uint32_t i = 0; i < HEAD_DIM; i++)
            o[i] = dtype == CTXS_DTYPE_F16 ? ctxs__f16_to_f32(ctxs__f32_to_f16(in[i]))
                                           : ctxs__bf16_to_f32(ctxs__f32_to_bf16(in[i]));
    }
}

static int append_f32(ctxs_session *s, uint32_t n)
{
    ctxs_reservation r;
    int rc = ctxs_session_reserve(&r, s, n);
    if (rc)
        return rc;
    uint32_t ids[64];
    for (uint32_t i = 0; i < n; i++) {
        float k[ELEMS], v[ELEMS];
        fill_f32(r.first_pos + i, k, v);
        if ((rc = ctxs_session_write_token(s, &r, i, k, v, CTXS_DTYPE_F32)) != 0)
            return rc;
        ids[i] = ts_token(r.first_pos + i);
    }
    return ctxs_session_commit(s, ids, n);
}

/* Every held position of s reads back, as float32, as its dtype stores
 * fill_f32's values, bit for bit. */
static void check_f32(const ctxs_session *s, uint32_t dtype, uint64_t from, uint64_t to)
{
    for (uint64_t p = from; p < to; p++) {
        float k[ELEMS], v[ELEMS], ek[ELEMS], ev[ELEMS], fk[ELEMS], fv[ELEMS];
        int rc = ctxs_session_read_token(k, v, s, p, CTXS_DTYPE_F32);
        cr_assert_eq(rc, 0, "position %llu: %s", (unsigned long long)p, ctxs_err_name(rc));
        fill_f32(p, fk, fv);
        expected_f32(dtype, fk, ek);
        expected_f32(dtype, fv, ev);
        cr_assert(memcmp(k, ek, sizeof(k)) == 0 && memcmp(v, ev, sizeof(v)) == 0,
                  "dtype %u position %llu does not read back", dtype, (unsigned long long)p);
    }
}

static ctxs_session *create(const char *name, uint32_t dtype, uint32_t capacity)
{
    ctxs_model m = model_of(dtype);
    ctxs_create_options o = ts_options(capacity, 4, 1, CTXS_SYNC_NONE);
    ctxs_session *s = NULL;
    int rc = ctxs_session_create(&s, ts_path(ts_scratch, name), &m, &o);
    cr_assert_eq(rc, 0, "create %s: %s", name, ctxs_err_name(rc));
    return s;
}

Test(dtype, token_bytes_size_every_form)
{
    ctxs_geometry g = { N_LAYERS, N_HEADS, HEAD_DIM, CTXS_DTYPE_Q8, 0, {0} };
    cr_assert_eq(ctxs_geometry_get_token_bytes(&g, CTXS_DTYPE_F32), ELEMS * 4);
    cr_assert_eq(ctxs_geometry_get_token_bytes(&g, CTXS_DTYPE_F16), ELEMS * 2);
    cr_assert_eq(ctxs_geometry_get_token_bytes(&g, CTXS_DTYPE_BF16), ELEMS * 2);
    cr_assert_eq(ctxs_geometry_get_token_bytes(&g, CTXS_DTYPE_Q8), ELEMS + N_LAYERS * N_HEADS * 4);
    cr_assert_eq(ctxs_geometry_get_token_bytes(&g, 0), 0);
    cr_assert_eq(ctxs_geometry_get_token_bytes(&g, 5), 0);
    cr_assert_eq(ctxs_geometry_get_token_bytes(NULL, CTXS_DTYPE_F16), 0);
    g.head_dim = 0;
    cr_assert_eq(ctxs_geometry_get_token_bytes(&g, CTXS_DTYPE_F16), 0);
}

Test(dtype, conversions_round_to_nearest_even)
{
    /* 1 + 2^-8 lies halfway between two bf16 values: to even, down. */
    cr_assert_eq(ctxs__f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);
    /* 1 + 3 * 2^-8: halfway again, to even, up. */
    cr_assert_eq(ctxs__f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
    cr_assert_eq(ctxs__f32_to_bf16(INFINITY), 0x7f80);
    cr_assert_eq(ctxs__f32_to_bf16(3.4e38f), 0x7f80, "rounds up to infinity");
    uint16_t nan = ctxs__f32_to_bf16(NAN);
    cr_assert(isnan(ctxs__bf16_to_f32(nan)), "NaN stays NaN");
    cr_assert_eq(ctxs__f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);
    cr_assert_eq(ctxs__f32_to_f16(65520.0f), 0x7c00, "rounds up to infinity");
    cr_assert_eq(ctxs__f16_to_f32(0x0001), 0x1p-24f, "smallest subnormal");
}

Test(dtype, q8_quantizes_within_half_a_step)
{
    float x[HEAD_DIM];
    int8_t q[HEAD_DIM];
    for (uint32_t i = 0; i < HEAD_DIM; i++)
        x[i] = (float)i * 0.37f - 2.0f;
    float scale = ctxs__q8_quantize(q, x, HEAD_DIM);
    cr_assert_float_eq(scale, 3.55f / 127, 1e-7);
    int saw_127 = 0;
    for (uint32_t i = 0; i < HEAD_DIM; i++) {
        cr_assert_leq(fabsf(x[i] - scale * (float)q[i]), scale / 2 * 1.0001f, "element %u", i);
        saw_127 |= q[i] == 127 || q[i] == -127;
    }
    cr_assert(saw_127, "the largest magnitude maps to +-127");
    memset(x, 0, sizeof(x));
    cr_assert_eq(ctxs__q8_quantize(q, x, HEAD_DIM), 0.0f);
    for (uint32_t i = 0; i < HEAD_DIM; i++)
        cr_assert_eq(q[i], 0);
    x[3] = NAN;
    cr_assert_lt(ctxs__q8_quantize(q, x, HEAD_DIM), 0.0f);

    /* A head so small that 127 / amax overflows a float keeps the bound. */
    float tiny[4] = { 1e-37f, 5e-39f, 0.0f, -2e-38f };
    scale = ctxs__q8_quantize(q, tiny, 4);
    cr_assert_gt(scale, 0.0f);
    for (uint32_t i = 0; i < 4; i++)
        cr_assert_leq(fabsf(tiny[i] - scale * (float)q[i]), scale / 2 * 1.0001f + 1e-45f,
                      "element %u: %d", i, q[i]);
    cr_assert_eq(q[0], 127);
    cr_assert_eq(q[2], 0);
}

Test(dtype, every_dtype_writes_commits_reopens_and_verifies)
{
    for (int d = 0; d < N_DTYPES; d++) {
        char name[32];
        snprintf(name, sizeof(name), "s-%s.ctxs", dtype_names[d]);
        ctxs_session *s = create(name, dtypes[d], 64);
        cr_assert_eq(append_f32(s, 10), 0);
        cr_assert_eq(append_f32(s, 30), 0);
        check_f32(s, dtypes[d], 0, 40);
        ctxs_session_info info;
        cr_assert_eq(ctxs_session_get_info(&info, s), 0);
        cr_assert_eq(info.model.geometry.dtype, dtypes[d]);
        cr_assert_eq(info.format_major, 3);
        ctxs_layout lay;
        cr_assert_eq(ctxs_session_get_layout(&lay, s), 0);
        cr_assert_eq(lay.slot_bytes, HEAD_DIM * ctxs__dtype_bytes(dtypes[d]));
        cr_assert_eq(lay.scales != NULL, dtypes[d] == CTXS_DTYPE_Q8);
        float *scales = NULL;
        int rc = ctxs_session_get_scales(&scales, s, 1, CTXS_V, 1);
        if (dtypes[d] == CTXS_DTYPE_Q8) {
            cr_assert_eq(rc, 0);
            cr_assert_eq(scales, lay.scales + ((1 * 2 + CTXS_V) * N_HEADS + 1) * lay.capacity);
            cr_assert_gt(scales[5], 0.0f);
        } else {
            cr_assert_eq(rc, CTXS_EINVAL);
            cr_assert_null(scales);
        }
        ctxs_session_close(s);

        /* Reopened, and verified as after a power loss. */
        ctxs_model m = model_of(dtypes[d]);
        cr_assert_eq(ctxs_session_open(&s, ts_path(ts_scratch, name), &m, CTXS_OPEN_VERIFY, NULL),
                     0);
        cr_assert_eq(ctxs_session_get_info(&info, s), 0);
        cr_assert_eq(info.n_tokens, 40);
        cr_assert_eq(info.lost_tokens, 0);
        cr_assert_eq(ctxs_session_verify(NULL, s), 0);
        check_f32(s, dtypes[d], 0, 40);
        ctxs_session_close(s);

        /* Another dtype is another model. */
        m.geometry.dtype = dtypes[(d + 1) % N_DTYPES];
        cr_assert_eq(ctxs_session_open(&s, ts_path(ts_scratch, name), &m, 0, NULL), CTXS_EMODEL);
    }
}

/* Every form an engine may hand tokens over in stores what converting its
 * values gives, and the session's own form round-trips bit for bit. */
Test(dtype, write_and_read_in_every_form)
{
    for (int d = 0; d < N_DTYPES; d++) {
        char name[32];
        snprintf(name, sizeof(name), "forms-%s.ctxs", dtype_names[d]);
        ctxs_session *s = create(name, dtypes[d], 64);
        ctxs_model m = model_of(dtypes[d]);
        size_t own = ctxs_geometry_get_token_bytes(&m.geometry, dtypes[d]);
        static const uint32_t forms[] = { CTXS_DTYPE_F32, CTXS_DTYPE_F16, CTXS_DTYPE_BF16 };
        ctxs_reservation r;
        cr_assert_eq(ctxs_session_reserve(&r, s, 4), 0);
        float k[ELEMS], v[ELEMS];
        for (uint32_t f = 0; f < 3; f++) {
            fill_f32(f, k, v);
            uint16_t hk[ELEMS], hv[ELEMS];
            const void *ink = k, *inv = v;
            if (forms[f] != CTXS_DTYPE_F32) {
                ctxs__narrow(hk, k, forms[f], ELEMS);
                ctxs__narrow(hv, v, forms[f], ELEMS);
                ctxs__widen(k, hk, forms[f], ELEMS); /* what the engine meant */
                ctxs__widen(v, hv, forms[f], ELEMS);
                ink = hk, inv = hv;
            }
            cr_assert_eq(ctxs_session_write_token(s, &r, f, ink, inv, forms[f]), 0);
        }
        /* Token 3: the stored form of token 0, copied as it is. */
        uint8_t sk[ELEMS * 4], sv[ELEMS * 4];
        cr_assert_eq(ctxs_session_write_token(s, &r, 0, k, v, 5), CTXS_EINVAL);
        uint32_t ids[4] = { 1, 2, 3, 4 };
        cr_assert_eq(ctxs_session_commit(s, ids, 3), 0);
        cr_assert_eq(ctxs_session_read_token(sk, sv, s, 0, dtypes[d]), 0);
        cr_assert_eq(ctxs_session_reserve(&r, s, 1), 0);
        cr_assert_eq(ctxs_session_write_token(s, &r, 0, sk, sv, dtypes[d]), 0);
        cr_assert_eq(ctxs_session_commit(s, ids + 3, 1), 0);
        uint8_t sk3[ELEMS * 4], sv3[ELEMS * 4];
        cr_assert_eq(ctxs_session_read_token(sk3, sv3, s, 3, dtypes[d]), 0);
        cr_assert(memcmp(sk, sk3, own) == 0 && memcmp(sv, sv3, own) == 0,
                  "%s: the stored form does not round-trip", dtype_names[d]);

        for (uint32_t f = 0; f < 3; f++) {
            float ek[ELEMS], got_k[ELEMS], got_v[ELEMS];
            fill_f32(f, k, v);
            if (forms[f] != CTXS_DTYPE_F32) {
                uint16_t h[ELEMS];
                ctxs__narrow(h, k, forms[f], ELEMS);
                ctxs__widen(k, h, forms[f], ELEMS);
            }
            expected_f32(dtypes[d], k, ek);
            cr_assert_eq(ctxs_session_read_token(got_k, got_v, s, f, CTXS_DTYPE_F32), 0);
            cr_assert(memcmp(got_k, ek, sizeof(ek)) == 0, "%s: token written as form %u",
                      dtype_names[d], forms[f]);
        }
        /* Float forms out of a float session; Q8 gives float32 or itself. */
        uint16_t h16[ELEMS], v16[ELEMS];
        int rc = ctxs_session_read_token(h16, v16, s, 0, CTXS_DTYPE_BF16);
        cr_assert_eq(rc, dtypes[d] == CTXS_DTYPE_Q8 ? CTXS_EINVAL : 0, "%s", dtype_names[d]);
        if (dtypes[d] != CTXS_DTYPE_Q8)
            cr_assert_eq(ctxs_session_read_token(sk, sv, s, 0, CTXS_DTYPE_Q8), CTXS_EINVAL);
        ctxs_session_close(s);
    }
}

Test(dtype, q8_refuses_values_that_are_not_finite)
{
    ctxs_session *s = create("nan.ctxs", CTXS_DTYPE_Q8, 64);
    ctxs_reservation r;
    cr_assert_eq(ctxs_session_reserve(&r, s, 1), 0);
    float k[ELEMS], v[ELEMS];
    fill_f32(0, k, v);
    v[ELEMS - 1] = INFINITY;
    cr_assert_eq(ctxs_session_write_token(s, &r, 0, k, v, CTXS_DTYPE_F32), CTXS_EINVAL);
    fill_f32(0, k, v);
    cr_assert_eq(ctxs_session_write_token(s, &r, 0, k, v, CTXS_DTYPE_F32), 0);
    uint32_t id = 9;
    cr_assert_eq(ctxs_session_commit(s, &id, 1), 0);
    check_f32(s, CTXS_DTYPE_Q8, 0, 1);
    ctxs_session_close(s);
}

/* A scale is part of its token's checksum: a damaged one is found. */
Test(dtype, verify_sees_a_damaged_scale)
{
    ctxs_session *s = create("scale.ctxs", CTXS_DTYPE_Q8, 64);
    cr_assert_eq(append_f32(s, 20), 0);
    float *scales;
    cr_assert_eq(ctxs_session_get_scales(&scales, s, 1, CTXS_K, 0), 0);
    float saved = scales[13];
    scales[13] *= 1.5f;
    uint64_t bad = 0;
    cr_assert_eq(ctxs_session_verify(&bad, s), CTXS_ECORRUPT);
    cr_assert_eq(bad, 13);
    scales[13] = saved;
    cr_assert_eq(ctxs_session_verify(NULL, s), 0);
    ctxs_session_close(s);

    /* On disk: an open that verifies rolls back to before the damage. */
    const char *p = ts_path(ts_scratch, "scale.ctxs");
    ctxs__file_layout lay;
    ctxs_model m = model_of(CTXS_DTYPE_Q8);
    cr_assert_eq(ctxs__layout_compute(&lay, &m.geometry, 64, 4, 0), 0);
    size_t len;
    uint8_t *file = ts_read_file(p, &len);
    cr_assert_not_null(file);
    size_t at = lay.scales_off + 3 * lay.scales_stride + 17 * 4;
    file[at] ^= 0x40;
    cr_assert_eq(ts_write_file(p, file, len), 0);
    free(file);
    cr_assert_eq(ctxs_session_open(&s, p, &m, CTXS_OPEN_VERIFY, NULL), 0);
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(info.n_tokens, 17);
    cr_assert(info.flags & CTXS_INFO_RECOVERED);
    check_f32(s, CTXS_DTYPE_Q8, 0, 17);
    ctxs_session_close(s);
}

/* A writer killed for real between commits loses nothing committed, in
 * every dtype, and the next writer goes on. */
Test(dtype, a_killed_writer_loses_nothing_committed)
{
    for (int d = 0; d < N_DTYPES; d++) {
        char name[32];
        snprintf(name, sizeof(name), "kill-%s.ctxs", dtype_names[d]);
        const char *p = ts_path(ts_scratch, name);
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
            ctxs_model m = model_of(dtypes[d]);
            ctxs_create_options o = ts_options(64, 4, 1, CTXS_SYNC_ASYNC);
            ctxs_session *s = NULL;
            if (ctxs_session_create(&s, p, &m, &o) != 0 || append_f32(s, 25) != 0)
                _exit(1);
            /* Reserved and written, never committed: must not survive. */
            ctxs_reservation r;
            float k[ELEMS], v[ELEMS];
            fill_f32(1000, k, v);
            if (ctxs_session_reserve(&r, s, 1) != 0 ||
                ctxs_session_write_token(s, &r, 0, k, v, CTXS_DTYPE_F32) != 0)
                _exit(1);
            kill(getpid(), SIGKILL);
            _exit(1);
        }
        int status;
        cr_assert_eq(waitpid(pid, &status, 0), pid);
        cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "%s: the child failed",
                  dtype_names[d]);
        ctxs_model m = model_of(dtypes[d]);
        ctxs_session *s = NULL;
        cr_assert_eq(ctxs_session_open(&s, p, &m, CTXS_OPEN_VERIFY, NULL), 0);
        ctxs_session_info info;
        cr_assert_eq(ctxs_session_get_info(&info, s), 0);
        cr_assert_eq(info.n_tokens, 25);
        check_f32(s, dtypes[d], 0, 25);
        cr_assert_eq(append_f32(s, 5), 0);
        check_f32(s, dtypes[d], 0, 30);
        ctxs_session_close(s);
    }
}

/* Fork copies the held slots with their scales, also past a wrapped ring. */
Test(dtype, fork_keeps_every_dtype)
{
    for (int d = 0; d < N_DTYPES; d++) {
        char name[32], fork_name[32];
        snprintf(name, sizeof(name), "src-%s.ctxs", dtype_names[d]);
        snprintf(fork_name, sizeof(fork_name), "fork-%s.ctxs", dtype_names[d]);
        ctxs_session *s = create(name, dtypes[d], 32);
        for (int i = 0; i < 3; i++)
            cr_assert_eq(append_f32(s, 20), 0); /* 60 tokens in 32 slots */
        ctxs_session *f = NULL;
        cr_assert_eq(ctxs_session_fork(&f, s, ts_path(ts_scratch, fork_name), 50, NULL), 0);
        ctxs_session_info info;
        cr_assert_eq(ctxs_session_get_info(&info, f), 0);
        cr_assert_eq(info.n_tokens, 50);
        cr_assert_eq(info.model.geometry.dtype, dtypes[d]);
        cr_assert_eq(ctxs_session_verify(NULL, f), 0);
        check_f32(f, dtypes[d], 0, 4);
        check_f32(f, dtypes[d], info.ring_start, 50);
        ctxs_session_close(f);
        ctxs_session_close(s);
    }
}

Test(dtype, export_and_import_carry_every_dtype)
{
    ctxs_store *a = ts_store_open(ts_path(ts_scratch, "a"));
    ctxs_store *b = ts_store_open(ts_path(ts_scratch, "b"));
    for (int d = 0; d < N_DTYPES; d++) {
        ctxs_model m = model_of(dtypes[d]);
        m.model_hash[0] ^= (uint8_t)d; /* a model per dtype */
        ctxs_create_options o = ts_options(32, 4, 1, CTXS_SYNC_NONE);
        ctxs_session *s = NULL;
        cr_assert_eq(ctxs_model_register(a, &m, dtype_names[d]), 0);
        int rc = ctxs_store_session_create(&s, a, dtype_names[d], &m, &o);
        cr_assert_eq(rc, 0, "create %s: %s", dtype_names[d], ctxs_err_name(rc));
        for (int i = 0; i < 3; i++)
            cr_assert_eq(append_f32(s, 15), 0); /* 45 tokens in 32 slots */
        ctxs_session_close(s);
        char file[32];
        snprintf(file, sizeof(file), "%s.ctxx", dtype_names[d]);
        const char *path = ts_path(ts_scratch, file);
        rc = ctxs_store_session_export(a, dtype_names[d], path, NULL);
        cr_assert_eq(rc, 0, "export %s: %s", dtype_names[d], ctxs_err_name(rc));
        rc = ctxs_store_session_import(NULL, b, path, NULL, NULL);
        cr_assert_eq(rc, 0, "import %s: %s", dtype_names[d], ctxs_err_name(rc));

        ctxs_session *x = NULL, *y = NULL;
        cr_assert_eq(ctxs_store_session_open(&x, a, dtype_names[d], NULL, CTXS_RDONLY, NULL),
                     0);
        cr_assert_eq(ctxs_store_session_open(&y, b, dtype_names[d], &m, CTXS_OPEN_VERIFY, NULL),
                     0);
        ctxs_session_info ix, iy;
        ctxs_session_get_info(&ix, x);
        ctxs_session_get_info(&iy, y);
        cr_assert_eq(iy.n_tokens, 45);
        cr_assert_eq(iy.ring_start, ix.ring_start);
        cr_assert_eq(iy.model.geometry.dtype, dtypes[d]);
        size_t own = ctxs_geometry_get_token_bytes(&m.geometry, dtypes[d]);
        for (uint64_t p = 0; p < 45; p++) {
            uint8_t kx[ELEMS * 4], vx[ELEMS * 4], ky[ELEMS * 4], vy[ELEMS * 4];
            int rx = ctxs_session_read_token(kx, vx, x, p, dtypes[d]);
            int ry = ctxs_session_read_token(ky, vy, y, p, dtypes[d]);
            cr_assert_eq(rx, ry, "position %llu", (unsigned long long)p);
            if (rx == 0)
                cr_assert(memcmp(kx, ky, own) == 0 && memcmp(vx, vy, own) == 0,
                          "%s position %llu differs after import", dtype_names[d],
                          (unsigned long long)p);
        }
        cr_assert_eq(ctxs_session_verify(NULL, y), 0);
        /* The imported session goes on. */
        cr_assert_eq(append_f32(y, 3), 0);
        check_f32(y, dtypes[d], 40, 48);
        ctxs_session_close(x);
        ctxs_session_close(y);
    }
    ctxs_store_close(a);
    ctxs_store_close(b);
}

/* The default window is the capacity: attention reads all a session holds,
 * and the pressure window is half of it. */
Test(dtype, full_attention_by_default_and_half_under_pressure)
{
    ctxs_session *s = create("window.ctxs", CTXS_DTYPE_BF16, 64);
    cr_assert_eq(append_f32(s, 60), 0);
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(info.window, 64);
    cr_assert_eq(info.flags & CTXS_INFO_PARTIAL_WINDOW, 0);
    ctxs_attn_plan plan;
    cr_assert_eq(ctxs_session_get_attn_plan(&plan, s, 0), 0);
    cr_assert_eq(plan.n_keys, 60);

    ctxs_set_pressure(1);
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(info.window, 32);
    cr_assert(info.flags & CTXS_INFO_PARTIAL_WINDOW);
    ctxs_set_pressure(0);

    cr_assert_eq(ctxs_session_set_window(s, 16), 0);
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(info.window, 16);
    cr_assert(info.flags & CTXS_INFO_PARTIAL_WINDOW, "a short window says so");
    cr_assert_eq(ctxs_session_set_window(s, 0), 0);
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(info.window, 64);
    cr_assert_eq(info.flags & CTXS_INFO_PARTIAL_WINDOW, 0);
    ctxs_session_close(s);

    /* An explicit pressure window stays as given. */
    ctxs_model m = model_of(CTXS_DTYPE_BF16);
    ctxs_open_options o = CTXS_OPEN_OPTIONS_INIT;
    o.pressure_window = 10;
    cr_assert_eq(ctxs_session_open(&s, ts_path(ts_scratch, "window.ctxs"), &m, 0, &o), 0);
    ctxs_set_pressure(1);
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    ctxs_set_pressure(0);
    cr_assert_eq(info.window, 10);
    ctxs_session_close(s);
}

Test(dtype, f16_conversion_is_exact_and_rounds_to_even)
{
    /* Every binary16 value survives the round trip. */
    for (uint32_t h = 0; h < 0x10000u; h++) {
        float f = ctxs__f16_to_f32((uint16_t)h);
        uint16_t back = ctxs__f32_to_f16(f);
        if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu))
            cr_assert(isnan(f) && (back & 0x7c00u) == 0x7c00u && (back & 0x3ffu),
                      "NaN %04x came back as %04x", h, back);
        else
            cr_assert_eq(back, h, "%04x -> %a -> %04x", h, (double)f, back);
    }
    /* Halfway cases go to the even neighbour; overflow and underflow. */
    cr_assert_eq(ctxs__f32_to_f16(1.0f + 0x1p-11f), 0x3c00u);
    cr_assert_eq(ctxs__f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02u);
    cr_assert_eq(ctxs__f32_to_f16(65504.0f), 0x7bffu);
    cr_assert_eq(ctxs__f32_to_f16(65519.0f), 0x7bffu);
    cr_assert_eq(ctxs__f32_to_f16(-1e9f), 0xfc00u);
    cr_assert_eq(ctxs__f32_to_f16(0x1p-25f), 0x0000u);     /* tie: even (zero) */
    cr_assert_eq(ctxs__f32_to_f16(0x1.8p-25f), 0x0001u);
    cr_assert_eq(ctxs__f32_to_f16(3 * 0x1p-25f), 0x0002u); /* tie: even */
    cr_assert_eq(ctxs__f32_to_f16(-0.0f), 0x8000u);
#if defined(__FLT16_MAX__) && !defined(__clang__)
    /* Against the compiler's own conversion, on random floats around the
     * binary16 range. */
    uint64_t st = 42;
    for (int i = 0; i < 1000000; i++) {
        uint32_t bits = (uint32_t)ts_rng_next(&st);
        bits = (bits & 0x807fffffu) | ((100u + (bits >> 23) % 60u) << 23);
        float f;
        memcpy(&f, &bits, 4);
        _Float16 ref = (_Float16)f;
        uint16_t rb;
        memcpy(&rb, &ref, 2);
        cr_assert_eq(ctxs__f32_to_f16(f), rb, "%a: %04x, the compiler says %04x", (double)f,
                     ctxs__f32_to_f16(f), rb);
    }
#endif
    /* bf16 round trips, and a NaN stays one. */
    for (uint32_t h = 0; h < 0x10000u; h++) {
        float f = ctxs__bf16_to_f32((uint16_t)h);
        if (isnan(f))
            cr_assert(isnan(ctxs__bf16_to_f32(ctxs__f32_to_bf16(f))));
        else
            cr_assert_eq(ctxs__f32_to_bf16(f), h);
    }
}

/* An engine that writes the mapping itself encodes with ctxs_dtype_encode():
 * it must give the bytes (and scales) that ctxs_session_write_token()
 * stores from the same floats, on values of every size, ties, zeros and a
 * head that is all zero. */
Test(dtype, encode_gives_what_write_token_stores)
{
    enum { HD = 64, TOKENS = 400 };
    uint64_t st = 99;
    for (int d = 0; d < N_DTYPES; d++) {
        const uint32_t dtype = dtypes[d];
        ctxs_model cm = { .geometry = { 1, 1, HD, dtype } };
        memcpy(cm.model_hash, "ctxs-encode-test", 16);
        ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
        o.capacity = TOKENS;
        o.open.background = 0;
        char name[64];
        snprintf(name, sizeof(name), "encode-%s.ctxs", dtype_names[d]);
        ctxs_session *s;
        cr_assert_eq(ctxs_session_create(&s, ts_path(ts_scratch, name), &cm, &o), 0);
        ctxs_reservation r;
        cr_assert_eq(ctxs_session_reserve(&r, s, TOKENS), 0);
        static float k[TOKENS][HD], v[TOKENS][HD];
        static uint32_t ids[TOKENS];
        for (uint32_t t = 0; t < TOKENS; t++) {
            ids[t] = t;
            for (uint32_t i = 0; i < HD; i++) {
                uint64_t x = ts_rng_next(&st);
                /* Magnitudes from 2^-30 to 2^10, some exact halves of the
                 * target's last place, some equal to the head's max. */
                float f = ldexpf((float)(x & 0xffffff) * 0x1p-24f + 0.5f, (int)(x >> 32) % 41 - 30);
                if (x >> 60 == 1)
                    f = 1.0f + 0x1p-9f; /* a bf16 tie: rounds to even */
                if (x >> 60 == 2)
                    f = 0.0f;
                k[t][i] = x >> 59 & 1 ? -f : f;
                v[t][i] = t % 50 == 0 ? 0.0f : (float)((int)(x % 255) - 127) * 0.25f;
            }
            cr_assert_eq(ctxs_session_write_token(s, &r, t, k[t], v[t], CTXS_DTYPE_F32), 0);
        }
        cr_assert_eq(ctxs_session_commit(s, ids, TOKENS), 0);
        for (uint32_t t = 0; t < TOKENS; t++) {
            /* The session's own form: the elements, then (Q8) the scale. */
            uint8_t sk[HD * 2 + 4], sv[HD * 2 + 4], want[HD * 2 + 4];
            cr_assert_eq(ctxs_session_read_token(sk, sv, s, t, dtype), 0);
            for (int kind = 0; kind < 2; kind++) {
                float scale = -1.0f;
                cr_assert_eq(ctxs_dtype_encode(want, &scale, kind ? v[t] : k[t], HD, dtype), 0);
                size_t n = (size_t)HD * ctxs__dtype_bytes(dtype);
                if (dtype == CTXS_DTYPE_Q8)
                    memcpy(want + n, &scale, 4), n += 4;
                cr_assert(memcmp(kind ? sv : sk, want, n) == 0,
                          "%s: token %u's %c differs from the library's", dtype_names[d], t,
                          kind ? 'V' : 'K');
            }
        }
        ctxs_session_close(s);
    }
    float x[4] = { 1.0f, NAN, 2.0f, 3.0f }, scale;
    uint8_t out[8];
    cr_assert_eq(ctxs_dtype_encode(out, &scale, x, 4, CTXS_DTYPE_Q8), CTXS_EINVAL, "Q8 and a NaN");
    x[1] = 0.5f;
    cr_assert_eq(ctxs_dtype_encode(out, NULL, x, 4, CTXS_DTYPE_Q8), CTXS_EINVAL, "no scale");
    cr_assert_eq(ctxs_dtype_encode(out, NULL, x, 4, CTXS_DTYPE_F32), CTXS_EINVAL, "f32");
    cr_assert_eq(ctxs_dtype_encode(out, NULL, x, 0, CTXS_DTYPE_F16), CTXS_EINVAL, "n == 0");
    cr_assert_eq(ctxs_dtype_encode(out, NULL, x, 4, CTXS_DTYPE_BF16), 0, "bf16 needs no scale");
}
