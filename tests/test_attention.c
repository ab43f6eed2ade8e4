/*
 * The CPU attention kernel against a plain double-precision reference,
 * computed here from the raw bytes of real session files (fp16, bf16 and
 * Q8, each decoded here by its definition) and of layouts built by hand,
 * for every instruction set this CPU has; Q8 also against the float32 K/V
 * it was quantized from, within the bound derived below; the determinism that a resume relies on
 * (bit-identical output whatever the plan's shape and the call's n); the
 * argument checks; and the plans ctxs_session_get_attn_plan() builds.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "attention.h"
#include "support.h"

static void setup(void)
{
    ts_scratch_init();
    ctxs_set_pressure(0);
}

static void teardown(void)
{
    ctxs__attention_force_isa(NULL);
    ctxs_set_pressure(0);
    ts_scratch_fini();
}

TestSuite(attention, .init = setup, .fini = teardown);

/* --- Sessions with random K/V ------------------------------------------- */

static uint64_t rng;

static float frand(float lo, float hi)
{
    return lo + (hi - lo) * (float)(ts_rng_next(&rng) >> 40) / (float)(1u << 24);
}

/* A random fp16 of magnitude in [2^-5, 2), either sign; now and then zero. */
static uint16_t rand_half(void)
{
    uint64_t r = ts_rng_next(&rng);
    if (r % 97 == 0)
        return 0;
    uint16_t e = (uint16_t)(10 + (r >> 8) % 6);
    return (uint16_t)(((r >> 16) & 1) << 15 | e << 10 | ((r >> 20) & 0x3ff));
}

/* The same for bf16 (exponent bias 127, 7 mantissa bits). */
static uint16_t rand_bf16(void)
{
    uint64_t r = ts_rng_next(&rng);
    if (r % 97 == 0)
        return 0;
    uint16_t e = (uint16_t)(122 + (r >> 8) % 6);
    return (uint16_t)(((r >> 16) & 1) << 15 | e << 7 | ((r >> 20) & 0x7f));
}

/* Sessions of the dtype that g_dtype names; the tests that cover every
 * dtype set it in FOR_EACH_DTYPE (each test runs in its own process). */
static uint32_t g_dtype = CTXS_DTYPE_F16;
static const uint32_t all_dtypes[] = {CTXS_DTYPE_F16, CTXS_DTYPE_BF16, CTXS_DTYPE_Q8};
#define N_DTYPES (sizeof(all_dtypes) / sizeof(all_dtypes[0]))
#define FOR_EACH_DTYPE                                                          \
    for (size_t dti_ = 0; dti_ < N_DTYPES && (g_dtype = all_dtypes[dti_], 1); dti_++)

/* Test(attention, name) for every dtype: the body that follows the macro
 * runs once with g_dtype set to each. */
#define DTYPE_TEST(name)                                                                           \
    static void name##_in(void);                                                                   \
    Test(attention, name)                                                                          \
    {                                                                                              \
        FOR_EACH_DTYPE                                                                             \
            name##_in();                                                                           \
    }                                                                                              \
    static void name##_in(void)

static const char *dtype_name(uint32_t dt)
{
    return dt == CTXS_DTYPE_F16 ? "f16" : dt == CTXS_DTYPE_BF16 ? "bf16" : dt == CTXS_DTYPE_Q8 ? "q8" : "?";
}

static size_t elem_bytes(uint32_t dt)
{
    return dt == CTXS_DTYPE_Q8 ? 1 : 2;
}

/* Random elements of dtype dt, n of them, and for Q8 a random scale: values
 * of magnitude up to 2 in every dtype. */
static void rand_row(uint8_t *row, uint32_t n, uint32_t dt)
{
    for (uint32_t i = 0; i < n; i++) {
        if (dt == CTXS_DTYPE_Q8) {
            ((int8_t *)row)[i] = (int8_t)((int)(ts_rng_next(&rng) % 255) - 127);
        } else {
            uint16_t h = dt == CTXS_DTYPE_BF16 ? rand_bf16() : rand_half();
            memcpy(row + 2 * (size_t)i, &h, 2);
        }
    }
}

static float rand_scale(void)
{
    return frand(1.0f / 32, 2.0f) / 127.0f;
}

/* The scratch file `name` of a session of g_dtype. */
static const char *dtype_path(const char *name)
{
    char buf[64];
    snprintf(buf, sizeof(buf), "%s-%s", dtype_name(g_dtype), name);
    return ts_path(ts_scratch, buf);
}

static ctxs_session *create(const char *name, uint32_t n_layers, uint32_t n_kv,
                            uint32_t head_dim, ctxs_create_options o)
{
    ctxs_model m = ts_model(7);
    m.geometry.dtype = g_dtype;
    m.geometry.n_layers = n_layers;
    m.geometry.n_kv_heads = n_kv;
    m.geometry.head_dim = head_dim;
    ctxs_session *s = NULL;
    int rc = ctxs_session_create(&s, dtype_path(name), &m, &o);
    cr_assert_eq(rc, 0, "create: %s", ctxs_strerror(rc));
    return s;
}

static ctxs_layout layout_of(const ctxs_session *s)
{
    ctxs_layout lay;
    cr_assert_eq(ctxs_session_get_layout(&lay, s), 0);
    return lay;
}

static ctxs_session *create_plain(const char *name, uint32_t n_layers, uint32_t n_kv,
                                  uint32_t head_dim)
{
    return create(name, n_layers, n_kv, head_dim, ts_options(1024, 4, 1, CTXS_SYNC_NONE));
}

/* Reserves n slots and writes random K/V into them through ctxs_session_get_kv
 * (and their scales through ctxs_session_get_scales for Q8). */
static ctxs_reservation reserve_random(ctxs_session *s, uint32_t n)
{
    ctxs_layout lay = layout_of(s);
    const ctxs_geometry *g = &lay.geometry;
    ctxs_reservation r;
    int rc = ctxs_session_reserve(&r, s, n);
    cr_assert_eq(rc, 0, "reserve: %s", ctxs_strerror(rc));
    for (uint32_t l = 0; l < g->n_layers; l++)
        for (uint32_t kind = 0; kind < 2; kind++)
            for (uint32_t h = 0; h < g->n_kv_heads; h++) {
                void *p;
                float *sc = NULL;
                cr_assert_eq(ctxs_session_get_kv(&p, s, l, kind, h), 0);
                if (g->dtype == CTXS_DTYPE_Q8)
                    cr_assert_eq(ctxs_session_get_scales(&sc, s, l, kind, h), 0);
                for (uint32_t sp = 0; sp < r.n_spans; sp++) {
                    for (uint32_t t = 0; t < r.spans[sp].count; t++) {
                        const size_t slot = (size_t)r.spans[sp].slot + t;
                        rand_row((uint8_t *)p + slot * lay.slot_bytes, g->head_dim, g->dtype);
                        if (sc)
                            sc[slot] = rand_scale();
                    }
                }
            }
    return r;
}

static void commit(ctxs_session *s, const ctxs_reservation *r, uint32_t n)
{
    uint32_t *ids = malloc((size_t)n * 4);
    cr_assert(ids);
    for (uint32_t i = 0; i < n; i++)
        ids[i] = ts_token(r->first_pos + i);
    int rc = ctxs_session_commit(s, ids, n);
    cr_assert_eq(rc, 0, "commit: %s", ctxs_strerror(rc));
    free(ids);
}

/* Appends n random tokens in commits of at most 50. */
static void append_random(ctxs_session *s, uint64_t n)
{
    while (n) {
        uint32_t k = n > 50 ? 50 : (uint32_t)n;
        ctxs_reservation r = reserve_random(s, k);
        commit(s, &r, k);
        n -= k;
    }
}

/* create_plain() with n random tokens committed. */
static ctxs_session *plain_of(const char *name, uint32_t n_layers, uint32_t n_kv, uint32_t head_dim,
                              uint64_t n)
{
    ctxs_session *s = create_plain(name, n_layers, n_kv, head_dim);
    append_random(s, n);
    return s;
}

static float *rand_q(uint32_t n, uint32_t n_heads, uint32_t hd, float amp)
{
    size_t len = (size_t)n * n_heads * hd;
    float *q = malloc(len * sizeof(float));
    cr_assert(q);
    for (size_t i = 0; i < len; i++)
        q[i] = frand(-amp, amp);
    return q;
}

/* --- The reference ------------------------------------------------------- */

/* The test binaries do not link libm, so the reference brings its own
 * double-precision pieces: plain, slow and far more exact than the float
 * kernel needs (none of them is the kernel's code). */

/* 2^k, exactly, for k in [-1074, 1023]. */
static double pow2(int k)
{
    double r = 1.0;
    for (; k > 0; k--)
        r *= 2.0;
    for (; k < 0; k++)
        r *= 0.5;
    return r;
}

/* e^x for x <= 0: x = k ln 2 + r with |r| <= ln 2 / 2, e^r by its Taylor
 * series to double precision. */
static double ref_exp(double x)
{
    if (x < -745.0)
        return 0.0;
    const double ln2 = 0.693147180559945309417;
    int k = (int)(x / ln2 - 0.5);
    double r = x - k * ln2, term = 1.0, sum = 1.0;
    for (int i = 1; i < 30; i++) {
        term *= r / i;
        sum += term;
    }
    return sum * pow2(k);
}

static double ref_sqrt(double x)
{
    double r = x > 1 ? x : 1.0;
    for (int i = 0; i < 200; i++)
        r = 0.5 * (r + x / r);
    return r;
}

/* fp16 to double by the definition of binary16 (no bit tricks shared with
 * the kernel). */
static double half_value(uint16_t h)
{
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v;
    if (e == 0)
        v = m * pow2(-24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = (1024 + m) * pow2(e - 25);
    return (h & 0x8000) ? -v : v;
}

/* bfloat16 to double by its definition: 8 exponent bits (bias 127), 7
 * mantissa bits. */
static double bf16_value(uint16_t h)
{
    int e = (h >> 7) & 0xff, m = h & 0x7f;
    double v;
    if (e == 0)
        v = m * pow2(-133);
    else if (e == 255)
        v = m ? NAN : INFINITY;
    else
        v = (128 + m) * pow2(e - 134);
    return (h & 0x8000) ? -v : v;
}

/* Element e of a row of dtype dt; scale is the row's Q8 scale. */
static double elem_value(const uint8_t *row, uint32_t e, uint32_t dt, float scale)
{
    if (dt == CTXS_DTYPE_Q8)
        return (double)scale * ((const int8_t *)row)[e];
    uint16_t h;
    memcpy(&h, row + 2 * (size_t)e, 2);
    return dt == CTXS_DTYPE_BF16 ? bf16_value(h) : half_value(h);
}

/* The scale of (layer, kind, head, slot) in a Q8 layout, by the header's
 * formula; 0 for the other dtypes (unused). */
static float scale_at(const ctxs_layout *lay, uint32_t layer, uint32_t kind, uint32_t h,
                      uint32_t slot)
{
    if (lay->geometry.dtype != CTXS_DTYPE_Q8)
        return 0.0f;
    return lay->scales[((size_t)(layer * 2 + kind) * lay->geometry.n_kv_heads + h) *
                           lay->capacity + slot];
}

/* The keys a query reads, gathered by the test and decoded to double. */
typedef struct keyset {
    uint32_t n;
    uint32_t n_kv, hd;
    double *k, *v; /* [n][n_kv][hd] */
} keyset;

static void keyset_free(keyset *ks)
{
    free(ks->k);
    free(ks->v);
}

/* Where the test believes a position lives: committed ones by
 * ctxs_session_get_slot(), pending ones by the reservation's spans. */
static int slot_of(uint32_t *slot, const ctxs_session *s, const ctxs_reservation *pend,
                   uint64_t pos)
{
    if (pend && pos >= pend->first_pos && pos < pend->first_pos + pend->n_tokens) {
        uint32_t i = (uint32_t)(pos - pend->first_pos);
        if (i < pend->spans[0].count)
            *slot = pend->spans[0].slot + i;
        else
            *slot = pend->spans[1].slot + (i - pend->spans[0].count);
        return 0;
    }
    return ctxs_session_get_slot(slot, s, pos);
}

/* The keys query position p reads by the contract, in position order:
 * held, at most p, and a sink or among the last `window` positions. With
 * via_read_token the rows come from ctxs_session_read_token() (committed
 * positions only), else from the layout at the slot. */
static keyset visible(const ctxs_session *s, const ctxs_reservation *pend, uint32_t layer,
                      uint64_t p, uint32_t window, uint32_t n_sink, int via_read_token)
{
    ctxs_layout lay = layout_of(s);
    const ctxs_geometry *g = &lay.geometry;
    keyset ks = {0, g->n_kv_heads, g->head_dim, NULL, NULL};
    size_t row = (size_t)g->n_kv_heads * g->head_dim;
    ks.k = malloc((p + 1) * row * sizeof(double));
    ks.v = malloc((p + 1) * row * sizeof(double));
    size_t tok = (size_t)g->n_layers * row;
    float *tk = malloc(tok * sizeof(float)), *tv = malloc(tok * sizeof(float));
    cr_assert(ks.k && ks.v && tk && tv);
    for (uint64_t k = 0; k <= p; k++) {
        if (!(k < n_sink || k + window > p))
            continue;
        uint32_t slot;
        if (slot_of(&slot, s, pend, k) != 0)
            continue; /* evicted by the ring */
        double *dk = ks.k + ks.n * row, *dv = ks.v + ks.n * row;
        if (via_read_token) {
            /* float32 is exact for every session dtype */
            cr_assert_eq(ctxs_session_read_token(tk, tv, s, k, CTXS_DTYPE_F32), 0);
            for (size_t i = 0; i < row; i++) {
                dk[i] = tk[layer * row + i];
                dv[i] = tv[layer * row + i];
            }
        } else {
            for (uint32_t h = 0; h < g->n_kv_heads; h++) {
                const uint8_t *base = (const uint8_t *)lay.kv + layer * lay.layer_stride +
                                      h * lay.head_stride + slot * lay.slot_bytes;
                const float sk = scale_at(&lay, layer, CTXS_K, h, slot);
                const float sv = scale_at(&lay, layer, CTXS_V, h, slot);
                for (uint32_t e = 0; e < g->head_dim; e++) {
                    dk[h * g->head_dim + e] = elem_value(base, e, g->dtype, sk);
                    dv[h * g->head_dim + e] = elem_value(base + lay.kv_stride, e, g->dtype, sv);
                }
            }
        }
        ks.n++;
    }
    free(tk);
    free(tv);
    return ks;
}

/* Softmax attention of one query position in double: out[n_heads][hd]. */
static void reference(double *out, const float *q, uint32_t n_heads, double scale,
                      const keyset *ks)
{
    const uint32_t hd = ks->hd, group = n_heads / ks->n_kv;
    double *w = malloc((ks->n + 1) * sizeof(double));
    cr_assert(w);
    for (uint32_t h = 0; h < n_heads; h++) {
        const uint32_t kvh = h / group;
        double mx = -INFINITY, sum = 0;
        for (uint32_t j = 0; j < ks->n; j++) {
            const double *k = ks->k + ((size_t)j * ks->n_kv + kvh) * hd;
            double d = 0;
            for (uint32_t e = 0; e < hd; e++)
                d += (double)q[(size_t)h * hd + e] * k[e];
            w[j] = d * scale;
            if (w[j] > mx)
                mx = w[j];
        }
        for (uint32_t j = 0; j < ks->n; j++)
            sum += (w[j] = ref_exp(w[j] - mx));
        for (uint32_t e = 0; e < hd; e++) {
            double o = 0;
            for (uint32_t j = 0; j < ks->n; j++)
                o += w[j] * ks->v[((size_t)j * ks->n_kv + kvh) * hd + e];
            out[(size_t)h * hd + e] = ks->n ? o / sum : 0.0;
        }
    }
    free(w);
}

/* |got - want| <= 1e-4 (1 + |want|) everywhere, else a failure naming the
 * first element off. */
static void expect_close(const float *got, const double *want, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]);
        if (!(err <= 1e-4 * (1.0 + fabs(want[i])))) {
            cr_expect_fail("%s: element %zu is %.9g, reference %.9g", what, i,
                           (double)got[i], want[i]);
            return;
        }
    }
}

/* Checks queries q->pos .. q->pos + q->n - 1 of `out` against the reference
 * with the session's own window and sinks, not the plan's. */
static void expect_reference(const float *out, const ctxs_session *s,
                             const ctxs_reservation *pend, uint32_t layer,
                             const ctxs_attn_query *q, int via_read_token, const char *what)
{
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    const uint32_t hd = info.model.geometry.head_dim;
    const size_t row = (size_t)q->n_heads * hd;
    double scale = q->scale != 0.0f ? q->scale : 1.0 / ref_sqrt(hd);
    double *want = malloc(row * sizeof(double));
    cr_assert(want);
    for (uint32_t i = 0; i < q->n; i++) {
        keyset ks = visible(s, pend, layer, q->pos + i, info.window, info.n_sink, via_read_token);
        reference(want, q->q + i * row, q->n_heads, scale, &ks);
        char buf[160];
        snprintf(buf, sizeof(buf), "%s, query at %llu (%u keys), %s, isa %s", what,
                 (unsigned long long)(q->pos + i), ks.n, dtype_name(info.model.geometry.dtype),
                 ctxs_attention_get_isa());
        expect_close(out + i * row, want, row, buf);
        keyset_free(&ks);
    }
    free(want);
}

/* --- Instruction sets ---------------------------------------------------- */

static const char *const all_isas[] = {"portable", "avx2", "avx512", "neon"};
#define N_ISAS (sizeof(all_isas) / sizeof(all_isas[0]))

/* Forces instruction set i; false (and says so) where this CPU lacks it. */
static int use_isa(size_t i)
{
    static int said[N_ISAS]; /* per test: Criterion runs each in a process */
    if (ctxs__attention_force_isa(all_isas[i]) != 0) {
        if (!said[i]++)
            cr_log_info("isa %s: not supported on this CPU or build, skipped", all_isas[i]);
        return 0;
    }
    cr_assert_str_eq(ctxs_attention_get_isa(), all_isas[i]);
    return 1;
}

#define FOR_EACH_ISA(i)                                                        \
    for (size_t i = 0; i < N_ISAS; i++)                                        \
        if (use_isa(i))

/* out with room for a canary after it, that no call may touch. */
static float *alloc_out(size_t n)
{
    float *o = malloc((n + 16) * sizeof(float));
    cr_assert(o);
    for (size_t i = 0; i < n + 16; i++)
        o[i] = -12345.0f;
    return o;
}

static void expect_canary(const float *o, size_t n)
{
    for (size_t i = n; i < n + 16; i++)
        cr_expect_eq(o[i], -12345.0f, "write past the output at %zu", i - n);
}

static ctxs_attn_plan plan_of(const ctxs_session *s, uint32_t n_pending)
{
    ctxs_attn_plan p;
    int rc = ctxs_session_get_attn_plan(&p, s, n_pending);
    cr_assert_eq(rc, 0, "plan: %s", ctxs_strerror(rc));
    return p;
}

static void expect_plan_sane(const ctxs_attn_plan *p)
{
    uint64_t sum = 0;
    for (uint32_t i = 0; i < p->n_spans; i++) {
        sum += p->spans[i].count;
        cr_expect_gt(p->spans[i].count, 0);
        if (i)
            cr_expect_leq(p->spans[i - 1].pos + p->spans[i - 1].count, p->spans[i].pos,
                          "span %u not after span %u", i, i - 1);
    }
    cr_expect_eq(sum, p->n_keys, "n_keys %u, spans hold %llu", p->n_keys,
                 (unsigned long long)sum);
}

/* --- Decode ---------------------------------------------------------------- */

DTYPE_TEST(decode_matches_the_reference_for_every_head_dim_and_gqa_ratio)
{
    rng = ts_seed("decode_matches_the_reference");
    static const uint32_t dims[] = {1, 40, 64, 128, 256};
    static const uint32_t ratios[] = {1, 2, 3, 4, 8, 12};
    for (size_t di = 0; di < sizeof(dims) / sizeof(dims[0]); di++) {
        const uint32_t hd = dims[di], n_kv = 2;
        char name[32];
        snprintf(name, sizeof(name), "d%u", hd);
        ctxs_session *s = create_plain(name, 2, n_kv, hd);
        /* 200 keys: three whole blocks and a part, so the running max and
         * sum are rescaled between blocks. */
        append_random(s, 200);
        ctxs_attn_plan plan = plan_of(s, 0);
        ctxs_layout lay = layout_of(s);
        for (size_t ri = 0; ri < sizeof(ratios) / sizeof(ratios[0]); ri++) {
            const uint32_t n_heads = n_kv * ratios[ri];
            float *q = rand_q(1, n_heads, hd, 2.0f);
            const size_t len = (size_t)n_heads * hd;
            float *out = alloc_out(len);
            FOR_EACH_ISA(isa)
            {
                ctxs_attn_query qq = {q, 199, 1, n_heads, 0.0f};
                int rc = ctxs_attention(out, &lay, &plan, 1, &qq);
                cr_assert_eq(rc, 0, "%s", ctxs_strerror(rc));
                char what[64];
                snprintf(what, sizeof(what), "head_dim %u, %u heads on %u", hd, n_heads, n_kv);
                expect_reference(out, s, NULL, 1, &qq, 0, what);
                expect_canary(out, len);
            }
            free(q);
            free(out);
        }
        ctxs_session_close(s);
    }
}

DTYPE_TEST(one_kv_head_per_query_head_and_an_explicit_scale)
{
    rng = ts_seed("explicit_scale");
    ctxs_session *s = plain_of("a", 3, 4, 72, 130);
    ctxs_attn_plan plan = plan_of(s, 0);
    ctxs_layout lay = layout_of(s);
    float *q = rand_q(1, 4, 72, 1.0f);
    float *out = alloc_out(4 * 72), *out0 = alloc_out(4 * 72);
    FOR_EACH_ISA(isa)
    {
        for (uint32_t layer = 0; layer < 3; layer++) {
            ctxs_attn_query qq = {q, 129, 1, 4, 0.37f};
            cr_assert_eq(ctxs_attention(out, &lay, &plan, layer, &qq), 0);
            expect_reference(out, s, NULL, layer, &qq, 0, "scale 0.37");
            /* Another scale gives another answer: the scale is used. */
            qq.scale = 0.0f;
            cr_assert_eq(ctxs_attention(out0, &lay, &plan, layer, &qq), 0);
            expect_reference(out0, s, NULL, layer, &qq, 0, "scale 0");
            cr_expect_neq(memcmp(out, out0, 4 * 72 * sizeof(float)), 0);
        }
    }
    free(q);
    free(out);
    free(out0);
    ctxs_session_close(s);
}

/* --- Windows, sinks, rings, pressure ------------------------------------- */

DTYPE_TEST(sinks_and_a_small_window_skip_the_keys_between)
{
    rng = ts_seed("small_window");
    ctxs_session *s = create_plain("a", 2, 2, 64);
    cr_assert_eq(ctxs_session_set_window(s, 100), 0);
    append_random(s, 300);
    ctxs_attn_plan plan = plan_of(s, 0);
    cr_expect_eq(plan.n_spans, 2);
    cr_expect_eq(plan.spans[0].pos, 0);
    cr_expect_eq(plan.spans[0].count, 4);
    cr_expect_eq(plan.spans[1].pos, 200);
    cr_expect_eq(plan.spans[1].count, 100);
    cr_expect_eq(plan.window, 100);
    expect_plan_sane(&plan);
    ctxs_layout lay = layout_of(s);
    float *q = rand_q(1, 8, 64, 2.0f);
    float *out = alloc_out(8 * 64);
    FOR_EACH_ISA(isa)
    {
        ctxs_attn_query qq = {q, 299, 1, 8, 0.0f};
        cr_assert_eq(ctxs_attention(out, &lay, &plan, 0, &qq), 0);
        expect_reference(out, s, NULL, 0, &qq, 0, "window 100 + 4 sinks");

        /* The skipped keys would have changed the answer: against all 300
         * the output must be off somewhere (else this test proves nothing). */
        keyset all = visible(s, NULL, 0, 299, 1000, 4, 0);
        double want[8 * 64];
        reference(want, q, 8, 1.0 / 8.0, &all);
        double worst = 0;
        for (int i = 0; i < 8 * 64; i++)
            if (fabs(out[i] - want[i]) > worst)
                worst = fabs(out[i] - want[i]);
        cr_expect_gt(worst, 1e-3, "the window made no difference");
        keyset_free(&all);
    }
    free(q);
    free(out);
    ctxs_session_close(s);
}

DTYPE_TEST(a_wrapped_ring_reads_its_spans_in_position_order)
{
    rng = ts_seed("wrapped_ring");
    ctxs_session *s = create("a", 2, 2, 48, ts_options(128, 4, 1, CTXS_SYNC_NONE));
    append_random(s, 300);
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert(info.flags & CTXS_INFO_WRAPPED);
    ctxs_attn_plan plan = plan_of(s, 0);
    cr_expect(plan.n_spans >= 2 && plan.n_spans <= 3, "%u spans", plan.n_spans);
    cr_expect_eq(plan.n_keys, 128);
    expect_plan_sane(&plan);
    ctxs_layout lay = layout_of(s);
    float *q = rand_q(1, 4, 48, 2.0f);
    float *out = alloc_out(4 * 48);
    FOR_EACH_ISA(isa)
    {
        ctxs_attn_query qq = {q, 299, 1, 4, 0.0f};
        cr_assert_eq(ctxs_attention(out, &lay, &plan, 1, &qq), 0);
        /* Rows through ctxs_session_read_token(): no slot arithmetic. */
        expect_reference(out, s, NULL, 1, &qq, 1, "wrapped ring");
    }
    /* A ring wrapped so that its recent run is in two slot runs. */
    append_random(s, 70);
    plan = plan_of(s, 0);
    cr_expect_eq(plan.n_spans, 3, "%u spans", plan.n_spans);
    expect_plan_sane(&plan);
    FOR_EACH_ISA(isa)
    {
        ctxs_attn_query qq = {q, 369, 1, 4, 0.0f};
        cr_assert_eq(ctxs_attention(out, &lay, &plan, 0, &qq), 0);
        expect_reference(out, s, NULL, 0, &qq, 1, "wrapped ring, 3 spans");
    }
    free(q);
    free(out);
    ctxs_session_close(s);
}

DTYPE_TEST(memory_pressure_shrinks_the_plan_and_the_keys_read)
{
    rng = ts_seed("pressure");
    ctxs_create_options o = ts_options(1024, 4, 1, CTXS_SYNC_NONE);
    o.open.window = 200;
    o.open.pressure_window = 80;
    ctxs_session *s = create("a", 1, 2, 64, o);
    append_random(s, 300);
    cr_expect_eq(plan_of(s, 0).n_keys, 204);

    ctxs_set_pressure(1);
    ctxs_attn_plan plan = plan_of(s, 0);
    cr_expect_eq(plan.window, 80);
    cr_expect_eq(plan.n_keys, 84);
    expect_plan_sane(&plan);
    ctxs_layout lay = layout_of(s);
    float *q = rand_q(1, 4, 64, 2.0f);
    float *out = alloc_out(4 * 64);
    FOR_EACH_ISA(isa)
    {
        ctxs_attn_query qq = {q, 299, 1, 4, 0.0f};
        cr_assert_eq(ctxs_attention(out, &lay, &plan, 0, &qq), 0);
        /* The session reports the pressure window; the reference uses it. */
        expect_reference(out, s, NULL, 0, &qq, 0, "pressure window");
    }
    ctxs_set_pressure(0);
    cr_expect_eq(plan_of(s, 0).n_keys, 204);
    free(q);
    free(out);
    ctxs_session_close(s);
}

/* --- Prefill, determinism, resume ----------------------------------------- */

/* Prefill of n pending tokens after `committed` ones, with a window that
 * leaves the early tokens out of the later queries' view. */
static void prefill_case(uint32_t capacity, uint32_t n_sink, uint32_t window,
                         uint32_t committed, uint32_t n, uint32_t n_kv, uint32_t group,
                         uint32_t hd)
{
    ctxs_session *s = create("a", 2, n_kv, hd, ts_options(capacity, n_sink, 1, CTXS_SYNC_NONE));
    cr_assert_eq(ctxs_session_set_window(s, window), 0);
    append_random(s, committed);
    ctxs_reservation r = reserve_random(s, n);
    ctxs_attn_plan plan = plan_of(s, n);
    cr_expect_eq(plan.first_query, committed);
    cr_expect_eq(plan.n_tokens, (uint64_t)committed + n);
    expect_plan_sane(&plan);
    ctxs_layout lay = layout_of(s);

    const uint32_t n_heads = n_kv * group;
    const size_t row = (size_t)n_heads * hd;
    float *q = rand_q(n, n_heads, hd, 2.0f);
    size_t n_isas = 0;
    float *pre[N_ISAS] = {0};
    float *one = alloc_out(row);
    FOR_EACH_ISA(isa)
    {
        pre[isa] = alloc_out(n * row);
        ctxs_attn_query qq = {q, committed, n, n_heads, 0.0f};
        int rc = ctxs_attention(pre[isa], &lay, &plan, 1, &qq);
        cr_assert_eq(rc, 0, "%s", ctxs_strerror(rc));
        expect_reference(pre[isa], s, &r, 1, &qq, 0, "causal prefill");
        expect_canary(pre[isa], n * row);

        /* The same queries one by one, and in uneven chunks. */
        for (uint32_t i = 0; i < n; i++) {
            ctxs_attn_query q1 = {q + i * row, committed + i, 1, n_heads, 0.0f};
            cr_assert_eq(ctxs_attention(one, &lay, &plan, 1, &q1), 0);
            cr_expect_eq(memcmp(one, pre[isa] + i * row, row * sizeof(float)), 0,
                         "isa %s: decode of %u differs from its prefill", all_isas[isa],
                         committed + i);
        }
        float *chunked = alloc_out(n * row);
        for (uint32_t i = 0, step = 1; i < n; i += step, step = step * 2 + 1) {
            uint32_t k = n - i < step ? n - i : step;
            ctxs_attn_query qc = {q + i * row, committed + i, k, n_heads, 0.0f};
            cr_assert_eq(ctxs_attention(chunked + i * row, &lay, &plan, 1, &qc), 0);
        }
        cr_expect_eq(memcmp(chunked, pre[isa], n * row * sizeof(float)), 0,
                     "isa %s: a prefill in chunks differs", all_isas[isa]);
        free(chunked);
        n_isas++;
    }
    cr_assert_gt(n_isas, 0);

    /* A plan with fewer pending tokens: other spans, same keys per query. */
    ctxs_attn_plan shorter = plan_of(s, n / 2);
    FOR_EACH_ISA(isa)
    {
        for (uint32_t i = 0; i < n / 2; i++) {
            ctxs_attn_query q1 = {q + i * row, committed + i, 1, n_heads, 0.0f};
            cr_assert_eq(ctxs_attention(one, &lay, &shorter, 1, &q1), 0);
            cr_expect_eq(memcmp(one, pre[isa] + i * row, row * sizeof(float)), 0,
                         "isa %s: query %u differs with %u pending", all_isas[isa],
                         committed + i, n / 2);
        }
    }

    /* The resume case: commit, and recompute the last token alone on the
     * plan of the committed state (n_pending 0, first_query the last). */
    commit(s, &r, n);
    ctxs_attn_plan after = plan_of(s, 0);
    cr_expect_eq(after.first_query, (uint64_t)committed + n - 1);
    cr_expect_leq(after.n_keys, plan.n_keys);
    FOR_EACH_ISA(isa)
    {
        ctxs_attn_query q1 = {q + (n - 1) * row, committed + n - 1, 1, n_heads, 0.0f};
        cr_assert_eq(ctxs_attention(one, &lay, &after, 1, &q1), 0);
        cr_expect_eq(memcmp(one, pre[isa] + (n - 1) * row, row * sizeof(float)), 0,
                     "isa %s: the resumed token differs from its prefill", all_isas[isa]);
        /* Earlier positions are below first_query now. */
        q1.pos--;
        cr_expect_eq(ctxs_attention(one, &lay, &after, 1, &q1), CTXS_EINVAL);
        free(pre[isa]);
    }
    free(one);
    free(q);
    ctxs_session_close(s);
    /* so that a test may run several cases */
    cr_assert_eq(remove(dtype_path("a")), 0);
}

DTYPE_TEST(prefill_matches_the_reference_and_each_decode_bit_for_bit)
{
    rng = ts_seed("prefill");
    /* 200 committed, 70 pending, window 150: the first query reads keys
     * 51..200, the last 121..269 plus the sinks; the plan after commit
     * starts at 120, the prefill plan at 51. */
    prefill_case(1024, 4, 150, 200, 70, 2, 4, 64);
}

DTYPE_TEST(prefill_in_a_wrapped_ring_with_odd_sizes_is_deterministic)
{
    rng = ts_seed("prefill_ring");
    /* The pending tokens wrap the ring; head_dim and the group size are not
     * multiples of a vector or a tile. */
    prefill_case(160, 3, 2048, 230, 40, 3, 5, 37);
}

/* Prefills that cross the kernel's blocks of queries (CTXS__ATTN_QBLOCK)
 * every way: their sizes not a multiple of it and several of them, GQA
 * groups wider than a tile, windows that cut every query's keys (each
 * query walks alone, its blocks offset from its neighbour's) or only the
 * later queries' (the switch inside a block of queries), a wrapped ring. */
DTYPE_TEST(blocked_prefill_of_many_queries_equals_each_decode)
{
    rng = ts_seed("blocked_prefill");
    const uint32_t QB = CTXS__ATTN_QBLOCK, T = CTXS__ATTN_TILE;
    /* Window above every position: one group per block of queries. */
    prefill_case(1024, 4, 2048, 37, 5 * QB + 3, 2, T + 3, 40);
    /* Window below every position: every query alone. */
    prefill_case(1024, 4, 50, 120, 3 * QB + 5, 1, 2 * T + 1, 24);
    /* Window 64 + 4 sinks: queries up to position 67 read all before
     * them, later ones are cut; the switch falls inside a block. */
    prefill_case(1024, 4, 64, 30, 4 * QB + 7, 2, 3, 16);
}

DTYPE_TEST(blocked_prefill_in_a_wrapped_ring_with_sinks_equals_each_decode)
{
    rng = ts_seed("blocked_prefill_ring");
    /* The pending tokens wrap the ring; the plan's spans are the sinks and
     * the ring's two halves, cut at no block boundary. */
    prefill_case(200, 4, 2048, 311, 3 * CTXS__ATTN_QBLOCK + 9, 2, CTXS__ATTN_TILE + 1, 32);
}

/* A query of a prefill rides along in the blocks of the later queries of
 * its block, whose keys it must not read: not even as a weight of 0, which
 * an inf or NaN in V would turn into NaN. */
Test(attention, keys_after_a_query_never_touch_its_output_in_a_prefill)
{
    rng = ts_seed("later_keys");
    const uint32_t hd = 32, n_heads = 4, n = 2 * CTXS__ATTN_QBLOCK + 5;
    ctxs_session *s = plain_of("a", 1, 2, hd, 90);
    ctxs_reservation r = reserve_random(s, n);
    /* The last pending token: K that would win every softmax, V inf and
     * NaN. Only the last query reads it. */
    const uint32_t last = r.n_spans == 1 ? r.spans[0].slot + n - 1
                                         : r.spans[1].slot + r.spans[1].count - 1;
    for (uint32_t h = 0; h < 2; h++) {
        void *k, *v;
        cr_assert_eq(ctxs_session_get_kv(&k, s, 0, CTXS_K, h), 0);
        cr_assert_eq(ctxs_session_get_kv(&v, s, 0, CTXS_V, h), 0);
        for (uint32_t e = 0; e < hd; e++) {
            ((uint16_t *)k)[(size_t)last * hd + e] = 0x7bff; /* 65504 */
            ((uint16_t *)v)[(size_t)last * hd + e] = e % 2 ? 0x7c00 : 0x7e00;
        }
    }
    ctxs_attn_plan plan = plan_of(s, n);
    ctxs_layout lay = layout_of(s);
    const size_t row = (size_t)n_heads * hd;
    float *q = rand_q(n, n_heads, hd, 1.0f);
    float *pre = alloc_out(n * row), *one = alloc_out(row);
    FOR_EACH_ISA(isa)
    {
        ctxs_attn_query qq = {q, 90, n, n_heads, 0.0f};
        cr_assert_eq(ctxs_attention(pre, &lay, &plan, 0, &qq), 0);
        for (uint32_t i = 0; i + 1 < n; i++) {
            for (size_t e = 0; e < row; e++)
                cr_assert(isfinite(pre[i * row + e]), "isa %s: query %u element %zu is %g",
                          all_isas[isa], i, e, pre[i * row + e]);
            ctxs_attn_query q1 = {q + i * row, 90 + i, 1, n_heads, 0.0f};
            cr_assert_eq(ctxs_attention(one, &lay, &plan, 0, &q1), 0);
            cr_expect_eq(memcmp(one, pre + i * row, row * sizeof(float)), 0,
                         "isa %s: query %u differs from its decode", all_isas[isa], 90 + i);
        }
        expect_canary(pre, n * row);
    }
    free(q);
    free(pre);
    free(one);
    ctxs_session_close(s);
}

DTYPE_TEST(splitting_a_span_does_not_change_a_bit)
{
    rng = ts_seed("split");
    ctxs_session *s = plain_of("a", 1, 2, 64, 250);
    ctxs_attn_plan plan = plan_of(s, 0);
    cr_assert_eq(plan.n_spans, 1);
    /* The same keys as four spans, cut off the 64-key block boundaries. */
    ctxs_attn_plan cut = plan;
    static const uint32_t at[] = {0, 7, 70, 201, 250};
    cut.n_spans = 4;
    for (int i = 0; i < 4; i++) {
        cut.spans[i].pos = at[i];
        cut.spans[i].slot = plan.spans[0].slot + at[i];
        cut.spans[i].count = at[i + 1] - at[i];
    }
    ctxs_layout lay = layout_of(s);
    float *q = rand_q(1, 8, 64, 2.0f);
    float *a = alloc_out(8 * 64), *b = alloc_out(8 * 64);
    FOR_EACH_ISA(isa)
    {
        ctxs_attn_query qq = {q, 249, 1, 8, 0.0f};
        cr_assert_eq(ctxs_attention(a, &lay, &plan, 0, &qq), 0);
        cr_assert_eq(ctxs_attention(b, &lay, &cut, 0, &qq), 0);
        cr_expect_eq(memcmp(a, b, 8 * 64 * sizeof(float)), 0, "isa %s", all_isas[isa]);
    }
    free(q);
    free(a);
    free(b);
    ctxs_session_close(s);
}

DTYPE_TEST(a_copy_of_the_kv_region_in_anonymous_memory_gives_the_same_bits)
{
    rng = ts_seed("anon_copy");
    ctxs_session *s = plain_of("a", 2, 2, 40, 120);
    ctxs_attn_plan plan = plan_of(s, 0);
    ctxs_layout lay = layout_of(s);
    void *anon = mmap(NULL, lay.kv_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
    cr_assert_neq(anon, MAP_FAILED);
    memcpy(anon, lay.kv, lay.kv_bytes);
    ctxs_layout copy = lay;
    copy.kv = anon;
    float *scales = NULL;
    if (g_dtype == CTXS_DTYPE_Q8) {
        /* the scales too: the copy reads nothing of the session's */
        scales = malloc(lay.scales_bytes);
        cr_assert(scales);
        memcpy(scales, lay.scales, lay.scales_bytes);
        copy.scales = scales;
    }
    float *q = rand_q(1, 4, 40, 2.0f);
    float *a = alloc_out(4 * 40), *b = alloc_out(4 * 40);
    FOR_EACH_ISA(isa)
    {
        ctxs_attn_query qq = {q, 119, 1, 4, 0.0f};
        cr_assert_eq(ctxs_attention(a, &lay, &plan, 1, &qq), 0);
        cr_assert_eq(ctxs_attention(b, &copy, &plan, 1, &qq), 0);
        cr_expect_eq(memcmp(a, b, 4 * 40 * sizeof(float)), 0, "isa %s", all_isas[isa]);
        /* and the copy is what is read: change it, the answer changes
         * (byte 11 of layer 1's first K row: an exponent bit of fp16 and
         * bf16 element 5, bit 6 of int8 element 11) */
        ((uint8_t *)anon)[lay.layer_stride + 11] ^= 0x40;
        cr_assert_eq(ctxs_attention(b, &copy, &plan, 1, &qq), 0);
        cr_expect_neq(memcmp(a, b, 4 * 40 * sizeof(float)), 0, "isa %s", all_isas[isa]);
        ((uint8_t *)anon)[lay.layer_stride + 11] ^= 0x40;
        if (scales) {
            /* layer 1's first V scale, slot 0 */
            float *sv = &scales[(size_t)(1 * 2 + 1) * 2 * lay.capacity];
            const float keep = *sv;
            *sv *= 2;
            cr_assert_eq(ctxs_attention(b, &copy, &plan, 1, &qq), 0);
            cr_expect_neq(memcmp(a, b, 4 * 40 * sizeof(float)), 0, "isa %s: V scale",
                          all_isas[isa]);
            *sv = keep;
            cr_assert_eq(ctxs_attention(b, &copy, &plan, 1, &qq), 0);
            cr_expect_eq(memcmp(a, b, 4 * 40 * sizeof(float)), 0, "isa %s", all_isas[isa]);
        }
    }
    free(scales);
    munmap(anon, lay.kv_bytes);
    free(q);
    free(a);
    free(b);
    ctxs_session_close(s);
}

DTYPE_TEST(the_kernels_of_different_isas_agree_closely)
{
    rng = ts_seed("isas_agree");
    ctxs_session *s = plain_of("a", 1, 2, 128, 400);
    ctxs_attn_plan plan = plan_of(s, 0);
    ctxs_layout lay = layout_of(s);
    float *q = rand_q(1, 8, 128, 2.0f);
    float *first = alloc_out(8 * 128), *out = alloc_out(8 * 128);
    int have = 0;
    FOR_EACH_ISA(isa)
    {
        ctxs_attn_query qq = {q, 399, 1, 8, 0.0f};
        cr_assert_eq(ctxs_attention(have ? out : first, &lay, &plan, 0, &qq), 0);
        if (have) {
            for (int i = 0; i < 8 * 128; i++)
                cr_expect(fabsf(out[i] - first[i]) <= 2e-5f * (1 + fabsf(first[i])),
                          "isa %s, element %d: %.9g vs %.9g", all_isas[isa], i, out[i],
                          first[i]);
        }
        have = 1;
    }
    free(q);
    free(first);
    free(out);
    ctxs_session_close(s);
}

DTYPE_TEST(avx2_and_avx512_give_the_same_bits)
{
    /* Not promised by the header, but by design: both sum each dot product
     * in 16 lanes with one tree and take the same exp() steps, so a
     * difference here means one of them strayed from the plan. */
    if (ctxs__attention_force_isa("avx2") != 0 || ctxs__attention_force_isa("avx512") != 0) {
        cr_log_info("needs both avx2 and avx512, skipped");
        return;
    }
    rng = ts_seed("avx2_avx512");
    static const uint32_t dims[] = {1, 13, 16, 40, 128};
    for (size_t di = 0; di < sizeof(dims) / sizeof(dims[0]); di++) {
        char name[16];
        snprintf(name, sizeof(name), "d%u", dims[di]);
        ctxs_session *s = plain_of(name, 1, 2, dims[di], 150);
        ctxs_attn_plan plan = plan_of(s, 0);
        ctxs_layout lay = layout_of(s);
        for (uint32_t group = 1; group <= 12; group++) {
            const size_t len = (size_t)2 * group * dims[di];
            float *q = rand_q(1, 2 * group, dims[di], 2.0f);
            float *a = alloc_out(len), *b = alloc_out(len);
            ctxs_attn_query qq = {q, 149, 1, 2 * group, 0.0f};
            cr_assert_eq(ctxs__attention_force_isa("avx2"), 0);
            cr_assert_eq(ctxs_attention(a, &lay, &plan, 0, &qq), 0);
            cr_assert_eq(ctxs__attention_force_isa("avx512"), 0);
            cr_assert_eq(ctxs_attention(b, &lay, &plan, 0, &qq), 0);
            cr_expect_eq(memcmp(a, b, len * sizeof(float)), 0, "head_dim %u, group %u",
                         dims[di], group);
            free(q);
            free(a);
            free(b);
        }
        ctxs_session_close(s);
    }
}

typedef struct thread_pass {
    const ctxs_layout *lay;
    const ctxs_attn_plan *plan;
    ctxs_attn_query q;
    float *out;
    int rc;
} thread_pass;

static void *run_pass(void *arg)
{
    thread_pass *p = arg;
    for (int i = 0; i < 20 && p->rc == 0; i++)
        p->rc = ctxs_attention(p->out, p->lay, p->plan, 0, &p->q);
    return NULL;
}

DTYPE_TEST(threads_may_run_passes_over_one_mapping_at_once)
{
    rng = ts_seed("threads");
    ctxs_session *s = plain_of("a", 1, 2, 64, 300);
    ctxs_attn_plan plan = plan_of(s, 0);
    ctxs_layout lay = layout_of(s);
    float *q = rand_q(1, 8, 64, 2.0f);
    float *want = alloc_out(8 * 64);
    ctxs_attn_query qq = {q, 299, 1, 8, 0.0f};
    cr_assert_eq(ctxs_attention(want, &lay, &plan, 0, &qq), 0);
    thread_pass p[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
        p[i] = (thread_pass){&lay, &plan, qq, alloc_out(8 * 64), 0};
        cr_assert_eq(pthread_create(&t[i], NULL, run_pass, &p[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        cr_expect_eq(p[i].rc, 0);
        cr_expect_eq(memcmp(p[i].out, want, 8 * 64 * sizeof(float)), 0, "thread %d", i);
        free(p[i].out);
    }
    free(q);
    free(want);
    ctxs_session_close(s);
}

/* --- Large scores ---------------------------------------------------------- */

Test(attention, scores_near_plus_minus_6e4_stay_finite_and_match)
{
    rng = ts_seed("large_scores");
    const uint32_t hd = 64, n_heads = 4;
    ctxs_session *s = create_plain("a", 1, 2, hd);
    ctxs_reservation r = reserve_random(s, 150);
    /* q = +-40 with fixed signs; K rows of +-24 with the same signs score
     * 64 * 40 * 24 = 61440, with the opposite signs -61440; the rest are
     * +-[16, 32) at random. Positions 30 and 140 hold the same top row, so
     * the answer is the mean of their V rows, and exp(score) in float would
     * overflow long before. */
    int8_t sign[64];
    for (uint32_t e = 0; e < hd; e++)
        sign[e] = (ts_rng_next(&rng) & 1) ? 1 : -1;
    float *q = malloc(n_heads * hd * sizeof(float));
    for (uint32_t h = 0; h < n_heads; h++)
        for (uint32_t e = 0; e < hd; e++)
            q[h * hd + e] = 40.0f * sign[e];
    for (uint32_t h = 0; h < 2; h++) {
        void *p;
        cr_assert_eq(ctxs_session_get_kv(&p, s, 0, CTXS_K, h), 0);
        uint16_t *k = (uint16_t *)p + (size_t)r.spans[0].slot * hd;
        for (uint32_t t = 0; t < 150; t++) {
            for (uint32_t e = 0; e < hd; e++) {
                uint16_t mag = (uint16_t)(0x4c00 | (ts_rng_next(&rng) & 0x3ff)); /* [16, 32) */
                if (t == 30 || t == 140)
                    k[t * hd + e] = (uint16_t)((sign[e] < 0 ? 0x8000 : 0) | 0x4e00); /* 24 */
                else if (t % 17 == 0)
                    k[t * hd + e] = (uint16_t)((sign[e] < 0 ? 0 : 0x8000) | 0x4e00);
                else
                    k[t * hd + e] = (uint16_t)((ts_rng_next(&rng) & 1) << 15 | mag);
            }
        }
    }
    commit(s, &r, 150);
    ctxs_attn_plan plan = plan_of(s, 0);
    ctxs_layout lay = layout_of(s);
    float *out = alloc_out(n_heads * hd);
    FOR_EACH_ISA(isa)
    {
        for (int pass = 0; pass < 2; pass++) {
            ctxs_attn_query qq = {q, 149, 1, n_heads, pass ? 1.0f : 0.0f};
            cr_assert_eq(ctxs_attention(out, &lay, &plan, 0, &qq), 0);
            for (uint32_t i = 0; i < n_heads * hd; i++)
                cr_assert(isfinite(out[i]), "isa %s: element %u is %g", all_isas[isa], i,
                          out[i]);
            expect_reference(out, s, NULL, 0, &qq, 0, "scores of 6e4");
            /* and it is the mean of the two top rows' V */
            for (uint32_t h = 0; h < n_heads; h++) {
                const uint8_t *v = (const uint8_t *)lay.kv + lay.kv_stride +
                                   (h / 2) * lay.head_stride;
                const uint16_t *v30 = (const uint16_t *)(v + 30 * lay.slot_bytes);
                const uint16_t *v140 = (const uint16_t *)(v + 140 * lay.slot_bytes);
                for (uint32_t e = 0; e < hd; e++) {
                    double want = (half_value(v30[e]) + half_value(v140[e])) / 2;
                    cr_expect(fabs(out[h * hd + e] - want) <= 1e-5, "head %u elem %u", h, e);
                }
            }
        }
    }
    free(q);
    free(out);
    ctxs_session_close(s);
}

/* --- Element types through float32 ---------------------------------------- */

/* Appends n tokens of random float32 K/V through ctxs_session_write_token(),
 * which stores them in the session's dtype, in commits of at most 50; the
 * floats are kept in ok and ov ([position][n_layers][n_kv][hd]). K has
 * `outliers` channels (the same in every head) `outlier_gain` times larger
 * than the rest, as real models' keys have; V has none. */
static void append_floats(ctxs_session *s, float *ok, float *ov, uint32_t n, uint32_t outliers,
                          float outlier_gain)
{
    ctxs_layout lay = layout_of(s);
    const ctxs_geometry *g = &lay.geometry;
    const size_t tok = (size_t)g->n_layers * g->n_kv_heads * g->head_dim;
    for (uint32_t done = 0; done < n;) {
        uint32_t k = n - done > 50 ? 50 : n - done;
        ctxs_reservation r;
        cr_assert_eq(ctxs_session_reserve(&r, s, k), 0);
        for (uint32_t i = 0; i < k; i++) {
            const uint64_t pos = r.first_pos + i;
            float *kt = ok + pos * tok, *vt = ov + pos * tok;
            for (size_t e = 0; e < tok; e++) {
                const uint32_t ch = (uint32_t)(e % g->head_dim);
                kt[e] = frand(-1.0f, 1.0f) * (ch * 7 % g->head_dim < outliers ? outlier_gain : 1.0f);
                vt[e] = frand(-1.0f, 1.0f);
            }
            int rc = ctxs_session_write_token(s, &r, i, kt, vt, CTXS_DTYPE_F32);
            cr_assert_eq(rc, 0, "write_token: %s", ctxs_strerror(rc));
        }
        commit(s, &r, k);
        done += k;
    }
}

/* bf16 by the definition of round to nearest, ties to even: the two bf16
 * values around f, the nearer (the even one on a tie). Not the library's
 * bit trick. */
static uint16_t bf16_round(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t lo = (uint16_t)(x >> 16), hi = (uint16_t)(lo + 1);
    double dl = fabs(bf16_value(lo) - f), dh = fabs(bf16_value(hi) - f);
    return dl < dh ? lo : dh < dl ? hi : (lo & 1) ? hi : lo;
}

/* What the Q8 error bound is made of, for one query head against the
 * original float K/V of its keys:
 *
 *   Each element is off by at most half a step: |x - scale*q| <= scale/2 =
 *   amax/254 of its (token, head) (a little more for the float rounding of
 *   x * (127 / amax) and of the scale: 1e-4 of a step, covered by the
 *   factor (1 + 1e-3) below). With c the softmax scale, key j's logit
 *   c * q.k_j is then off by at most
 *       d_j = c * sum_i |q_i| * amax_kj / 254,   d = max_j d_j.
 *   Shifting every logit by at most d changes each softmax weight by a
 *   factor in [e^-2d, e^2d], so |p'_j - p_j| <= (e^2d - 1) p_j, and output
 *   element i, o_i = sum_j p_j v_ji, moves by
 *       |o'_i - o_i| <= sum_j |p'_j - p_j| |v_ji| + sum_j p'_j |v'_ji - v_ji|
 *                    <= (e^2d - 1) sum_j p_j |v_ji|  +  max_j amax_vj / 254.
 *   Float32 accumulation adds what the fp16 tests allow, 1e-4 (1 + |o_i|).
 *
 * The bound is a worst case (every element's error of one sign, aligned
 * with q): random rounding errors cancel, and the measured error is well
 * below it. */
typedef struct q8_bound {
    double worst_ratio; /* the largest error / bound seen */
    double worst_err;   /* the largest error seen */
} q8_bound;

/* Checks out (one query, [n_heads][hd]) against the reference from the
 * original floats of positions 0 .. p (all visible), within the bound. */
static void expect_q8_bound(const float *out, const float *q, uint32_t n_heads, double c,
                            const float *ok, const float *ov, const ctxs_geometry *g,
                            uint32_t layer, uint64_t p, q8_bound *b, const char *what)
{
    const uint32_t hd = g->head_dim, n_kv = g->n_kv_heads, group = n_heads / n_kv;
    const size_t tok = (size_t)g->n_layers * n_kv * hd;
    const uint64_t n = p + 1;
    double *w = malloc(n * sizeof(double));
    cr_assert(w);
    for (uint32_t h = 0; h < n_heads; h++) {
        const uint32_t kvh = h / group;
        const float *qh = q + (size_t)h * hd;
        double qabs = 0;
        for (uint32_t e = 0; e < hd; e++)
            qabs += fabs(qh[e]);
        double mx = -INFINITY, sum = 0, d = 0, ev = 0;
        for (uint64_t j = 0; j < n; j++) {
            const float *k = ok + j * tok + ((size_t)layer * n_kv + kvh) * hd;
            const float *v = ov + j * tok + ((size_t)layer * n_kv + kvh) * hd;
            double dot = 0, ak = 0, av = 0;
            for (uint32_t e = 0; e < hd; e++) {
                dot += (double)qh[e] * k[e];
                ak = fabs(k[e]) > ak ? fabs(k[e]) : ak;
                av = fabs(v[e]) > av ? fabs(v[e]) : av;
            }
            w[j] = dot * c;
            mx = w[j] > mx ? w[j] : mx;
            const double dj = c * qabs * ak / 254 * (1 + 1e-3);
            d = dj > d ? dj : d;
            ev = av / 254 * (1 + 1e-3) > ev ? av / 254 * (1 + 1e-3) : ev;
        }
        for (uint64_t j = 0; j < n; j++)
            sum += (w[j] = ref_exp(w[j] - mx));
        const double grow = ref_exp(-2 * d) > 0 ? 1 / ref_exp(-2 * d) - 1 : INFINITY;
        for (uint32_t e = 0; e < hd; e++) {
            double o = 0, pv = 0;
            for (uint64_t j = 0; j < n; j++) {
                const double v = ov[j * tok + ((size_t)layer * n_kv + kvh) * hd + e];
                o += w[j] * v;
                pv += w[j] * fabs(v);
            }
            o /= sum;
            pv /= sum;
            const double bound = grow * pv + ev + 1e-4 * (1 + fabs(o));
            const double err = fabs((double)out[(size_t)h * hd + e] - o);
            if (err / bound > b->worst_ratio)
                b->worst_ratio = err / bound;
            if (err > b->worst_err)
                b->worst_err = err;
            if (!(err <= bound)) {
                cr_expect_fail("%s: head %u element %u is %.9g, from the original floats %.9g:"
                               " off by %.3g, bound %.3g (isa %s)",
                               what, h, e, (double)out[(size_t)h * hd + e], o, err, bound,
                               ctxs_attention_get_isa());
                free(w);
                return;
            }
        }
    }
    free(w);
}

Test(attention, bf16_written_as_float32_matches_the_reference_of_its_rounding)
{
    rng = ts_seed("bf16_float32");
    g_dtype = CTXS_DTYPE_BF16;
    const uint32_t n_layers = 2, n_kv = 2, hd = 96, n = 230, n_heads = 6;
    ctxs_session *s = create_plain("a", n_layers, n_kv, hd);
    const size_t tok = (size_t)n_layers * n_kv * hd;
    float *ok = malloc(n * tok * sizeof(float)), *ov = malloc(n * tok * sizeof(float));
    cr_assert(ok && ov);
    append_floats(s, ok, ov, n, 4, 20.0f);

    /* What the session holds is each float rounded to nearest even. */
    ctxs_layout lay = layout_of(s);
    for (uint32_t p = 0; p < n; p++)
        for (uint32_t l = 0; l < n_layers; l++)
            for (uint32_t h = 0; h < n_kv; h++) {
                uint32_t slot;
                cr_assert_eq(ctxs_session_get_slot(&slot, s, p), 0);
                const uint16_t *k =
                    (const uint16_t *)(const void *)((const uint8_t *)lay.kv +
                                                     l * lay.layer_stride + h * lay.head_stride +
                                                     slot * lay.slot_bytes);
                for (uint32_t e = 0; e < hd; e += 7)
                    cr_assert_eq(k[e], bf16_round(ok[p * tok + (l * n_kv + h) * hd + e]),
                                 "position %u layer %u head %u element %u", p, l, h, e);
            }

    ctxs_attn_plan plan = plan_of(s, 0);
    float *q = rand_q(1, n_heads, hd, 2.0f);
    float *out = alloc_out(n_heads * hd);
    double worst = 0;
    FOR_EACH_ISA(isa)
    {
        ctxs_attn_query qq = {q, n - 1, 1, n_heads, 0.0f};
        cr_assert_eq(ctxs_attention(out, &lay, &plan, 1, &qq), 0);
        /* exact to the rounding: the reference from the bf16 values */
        expect_reference(out, s, NULL, 1, &qq, 0, "bf16 from float32");
        expect_reference(out, s, NULL, 1, &qq, 1, "bf16 from float32, read_token");
        expect_canary(out, n_heads * hd);
        keyset ks = visible(s, NULL, 1, n - 1, n, 0, 0);
        double want[6 * 96];
        reference(want, q, n_heads, 1.0 / ref_sqrt(hd), &ks);
        keyset_free(&ks);
        for (uint32_t i = 0; i < n_heads * hd; i++)
            worst = fabs(out[i] - want[i]) > worst ? fabs(out[i] - want[i]) : worst;
    }
    cr_log_info("bf16: largest error against the fp64 reference of the stored values: %.3g",
                worst);
    free(q);
    free(out);
    free(ok);
    free(ov);
    ctxs_session_close(s);
}

/* Q8 through a real session: the engine's float32 K/V quantized by
 * ctxs_session_write_token(), then decode and a prefill of n > 1 against
 * two references: the stored values (int8 times scale, decoded here), to
 * float32 accumulation; and the original floats, within the bound above.
 * GQA, a head_dim that is not a multiple of 16, K with outlier channels. */
Test(attention, q8_written_as_float32_stays_within_the_derived_bound)
{
    rng = ts_seed("q8_float32");
    g_dtype = CTXS_DTYPE_Q8;
    static const struct {
        uint32_t hd, group, outliers;
        float gain;
    } cases[] = {{128, 4, 0, 1.0f}, {128, 4, 4, 20.0f}, {40, 3, 2, 8.0f}, {1, 2, 0, 1.0f}};
    q8_bound b = {0, 0};
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        const uint32_t n_layers = 2, n_kv = 2, hd = cases[ci].hd;
        const uint32_t n_heads = n_kv * cases[ci].group, committed = 150, n = 40;
        char name[16];
        snprintf(name, sizeof(name), "c%zu", ci);
        ctxs_session *s = create_plain(name, n_layers, n_kv, hd);
        const size_t tok = (size_t)n_layers * n_kv * hd, row = (size_t)n_heads * hd;
        float *ok = malloc((committed + n) * tok * sizeof(float));
        float *ov = malloc((committed + n) * tok * sizeof(float));
        cr_assert(ok && ov);
        append_floats(s, ok, ov, committed + n, cases[ci].outliers, cases[ci].gain);
        ctxs_layout lay = layout_of(s);
        /* Every query of the last n as one prefill (the plan of the
         * committed state serves the last query only, so a hand-made plan
         * with first_query lowered: the same single span). */
        ctxs_attn_plan plan = plan_of(s, 0);
        cr_assert_eq(plan.n_spans, 1);
        plan.first_query = committed;
        float *q = rand_q(n, n_heads, hd, 2.0f);
        float *pre = alloc_out(n * row), *one = alloc_out(row);
        char what[96];
        FOR_EACH_ISA(isa)
        {
            ctxs_attn_query qq = {q, committed, n, n_heads, 0.0f};
            cr_assert_eq(ctxs_attention(pre, &lay, &plan, 1, &qq), 0);
            expect_canary(pre, n * row);
            snprintf(what, sizeof(what), "q8 case %zu (head_dim %u, %u outliers x%g)", ci, hd,
                     cases[ci].outliers, (double)cases[ci].gain);
            expect_reference(pre, s, NULL, 1, &qq, 0, what);
            for (uint32_t i = 0; i < n; i++) {
                expect_q8_bound(pre + i * row, q + i * row, n_heads, 1.0 / ref_sqrt(hd), ok, ov,
                                &lay.geometry, 1, committed + i, &b, what);
                ctxs_attn_query q1 = {q + i * row, committed + i, 1, n_heads, 0.0f};
                cr_assert_eq(ctxs_attention(one, &lay, &plan, 1, &q1), 0);
                cr_expect_eq(memcmp(one, pre + i * row, row * sizeof(float)), 0,
                             "%s, isa %s: decode of %u differs from its prefill", what,
                             all_isas[isa], committed + i);
            }
        }
        free(q);
        free(pre);
        free(one);
        free(ok);
        free(ov);
        ctxs_session_close(s);
    }
    /* The bound must be met, and must not be so loose that a broken scale
     * would pass it: the error is a real fraction of it. */
    cr_log_info("q8: largest error against the original floats %.3g, %.3f of the bound",
                b.worst_err, b.worst_ratio);
    cr_expect_gt(b.worst_ratio, 0.005, "the quantization left no trace: was it Q8?");
}

/* --- Layouts built by hand -------------------------------------------------- */

/* A layout of dtype dt in anonymous memory, not a session's: its own
 * strides (heads, K/V and layers apart by gaps), Q8 at an odd address, the
 * scale table elsewhere; K/V quantized or rounded here from random floats
 * by the test's own code. */
typedef struct hand_layout {
    ctxs_layout lay;
    void *map;
    size_t map_bytes;
    float *scales;
    float *ok, *ov; /* the floats: [layer][kind][head][slot][hd] as ok/ov */
} hand_layout;

static hand_layout hand_build(uint32_t dt, uint32_t n_layers, uint32_t n_kv, uint32_t hd,
                              uint32_t cap)
{
    hand_layout hl = {0};
    const size_t eb = elem_bytes(dt), slot = hd * eb;
    ctxs_layout *l = &hl.lay;
    l->geometry = (ctxs_geometry){n_layers, n_kv, hd, dt, 0, {0}};
    l->capacity = cap;
    l->slot_bytes = slot;
    l->head_stride = cap * slot + 6 * eb;       /* a gap after each head */
    l->kv_stride = n_kv * l->head_stride + 10 * eb;
    l->layer_stride = 2 * l->kv_stride + 4 * eb;
    l->kv_bytes = n_layers * l->layer_stride;
    hl.map_bytes = l->kv_bytes + 64;
    hl.map = mmap(NULL, hl.map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(hl.map, MAP_FAILED);
    memset(hl.map, 0x5a, hl.map_bytes); /* the gaps hold garbage */
    l->kv = (uint8_t *)hl.map + (dt == CTXS_DTYPE_Q8 ? 3 : 2);
    const size_t n_elem = (size_t)n_layers * 2 * n_kv * cap * hd;
    hl.ok = malloc(n_elem * sizeof(float));
    cr_assert(hl.ok);
    if (dt == CTXS_DTYPE_Q8) {
        l->scales_bytes = (size_t)n_layers * 2 * n_kv * cap * sizeof(float);
        hl.scales = malloc(l->scales_bytes);
        cr_assert(hl.scales);
        l->scales = hl.scales;
    }
    for (uint32_t ly = 0; ly < n_layers; ly++)
        for (uint32_t kind = 0; kind < 2; kind++)
            for (uint32_t h = 0; h < n_kv; h++)
                for (uint32_t t = 0; t < cap; t++) {
                    const size_t run = ((size_t)ly * 2 + kind) * n_kv + h;
                    float *x = hl.ok + (run * cap + t) * hd;
                    uint8_t *row = (uint8_t *)l->kv + ly * l->layer_stride + kind * l->kv_stride +
                                   h * l->head_stride + t * slot;
                    double amax = 0;
                    for (uint32_t e = 0; e < hd; e++) {
                        /* K: channel 3 an outlier */
                        x[e] = frand(-1.0f, 1.0f) * (kind == 0 && e == 3 ? 12.0f : 1.0f);
                        amax = fabs(x[e]) > amax ? fabs(x[e]) : amax;
                    }
                    for (uint32_t e = 0; e < hd; e++) {
                        if (dt == CTXS_DTYPE_Q8) {
                            double r = x[e] * 127.0 / amax;
                            int qi = (int)(r + (r >= 0 ? 0.5 : -0.5)); /* ties away: any rounding
                                                                          is a valid Q8 */
                            ((int8_t *)row)[e] = (int8_t)(qi > 127 ? 127 : qi < -127 ? -127 : qi);
                        } else {
                            uint16_t b16 = dt == CTXS_DTYPE_BF16 ? bf16_round(x[e]) : 0;
                            if (dt == CTXS_DTYPE_F16) {
                                /* nearest fp16 by search over the two around it */
                                uint16_t lo = 0;
                                for (int bit = 14; bit >= 0; bit--)
                                    if (half_value((uint16_t)(lo | 1u << bit)) <= fabs(x[e]))
                                        lo |= (uint16_t)(1u << bit);
                                uint16_t hi = (uint16_t)(lo + 1);
                                b16 = fabs(x[e]) - half_value(lo) <= half_value(hi) - fabs(x[e])
                                          ? lo : hi;
                                if (x[e] < 0)
                                    b16 |= 0x8000;
                            }
                            memcpy(row + 2 * (size_t)e, &b16, 2);
                        }
                    }
                    if (hl.scales)
                        hl.scales[run * cap + t] = (float)(amax / 127.0);
                }
    return hl;
}

static void hand_free(hand_layout *hl)
{
    munmap(hl->map, hl->map_bytes);
    free(hl->scales);
    free(hl->ok);
}

/* The reference from the stored values of a hand-built layout, for query
 * position p over a plan of one span from slot 0 (position = slot). */
static void hand_reference(double *want, const hand_layout *hl, uint32_t layer, const float *q,
                           uint32_t n_heads, uint64_t p, int from_floats)
{
    const ctxs_layout *l = &hl->lay;
    const uint32_t hd = l->geometry.head_dim, n_kv = l->geometry.n_kv_heads;
    keyset ks = {(uint32_t)(p + 1), n_kv, hd, NULL, NULL};
    const size_t row = (size_t)n_kv * hd;
    ks.k = malloc(ks.n * row * sizeof(double));
    ks.v = malloc(ks.n * row * sizeof(double));
    cr_assert(ks.k && ks.v);
    for (uint32_t t = 0; t < ks.n; t++)
        for (uint32_t h = 0; h < n_kv; h++)
            for (uint32_t kind = 0; kind < 2; kind++) {
                const size_t run = ((size_t)layer * 2 + kind) * n_kv + h;
                const uint8_t *r = (const uint8_t *)l->kv + layer * l->layer_stride +
                                   kind * l->kv_stride + h * l->head_stride + t * l->slot_bytes;
                double *dst = (kind ? ks.v : ks.k) + t * row + (size_t)h * hd;
                for (uint32_t e = 0; e < hd; e++)
                    dst[e] = from_floats ? hl->ok[(run * l->capacity + t) * hd + e]
                                         : elem_value(r, e, l->geometry.dtype,
                                                      hl->scales ? hl->scales[run * l->capacity + t]
                                                                 : 0.0f);
            }
    reference(want, q, n_heads, 1.0 / ref_sqrt(hd), &ks);
    keyset_free(&ks);
}

Test(attention, hand_built_layouts_of_every_dtype_in_anonymous_memory)
{
    rng = ts_seed("hand_built");
    const uint32_t n_layers = 2, n_kv = 3, hd = 72, cap = 150, group = 5;
    const uint32_t n_heads = n_kv * group, n = 20;
    const size_t row = (size_t)n_heads * hd;
    for (size_t di = 0; di < N_DTYPES; di++) {
        const uint32_t dt = all_dtypes[di];
        hand_layout hl = hand_build(dt, n_layers, n_kv, hd, cap);
        /* positions = slots, 0 .. cap - 1; the last n queries */
        ctxs_attn_plan plan = {0};
        plan.n_tokens = cap;
        plan.first_query = cap - n;
        plan.window = cap;
        plan.n_spans = 1;
        plan.spans[0] = (ctxs_attn_span){0, 0, cap};
        plan.n_keys = cap;
        /* and the same keys cut in three spans, off the block boundaries */
        ctxs_attn_plan cut = plan;
        cut.n_spans = 3;
        cut.spans[0] = (ctxs_attn_span){0, 0, 33};
        cut.spans[1] = (ctxs_attn_span){33, 33, 100};
        cut.spans[2] = (ctxs_attn_span){133, 133, cap - 133};
        float *q = rand_q(n, n_heads, hd, 1.5f);
        float *a = alloc_out(n * row), *b = alloc_out(n * row);
        double *want = malloc(row * sizeof(double)), *orig = malloc(row * sizeof(double));
        cr_assert(want && orig);
        double worst = 0;
        FOR_EACH_ISA(isa)
        {
            ctxs_attn_query qq = {q, cap - n, n, n_heads, 0.0f};
            cr_assert_eq(ctxs_attention(a, &hl.lay, &plan, 1, &qq), 0);
            cr_assert_eq(ctxs_attention(b, &hl.lay, &cut, 1, &qq), 0);
            cr_expect_eq(memcmp(a, b, n * row * sizeof(float)), 0, "%s, isa %s: spans",
                         dtype_name(dt), all_isas[isa]);
            expect_canary(a, n * row);
            for (uint32_t i = 0; i < n; i += 3) {
                char what[64];
                snprintf(what, sizeof(what), "hand-built %s, query %u, isa %s", dtype_name(dt),
                         cap - n + i, all_isas[isa]);
                hand_reference(want, &hl, 1, q + i * row, n_heads, cap - n + i, 0);
                expect_close(a + i * row, want, row, what);
                hand_reference(orig, &hl, 1, q + i * row, n_heads, cap - n + i, 1);
                for (size_t e = 0; e < row; e++)
                    worst = fabs(a[i * row + e] - orig[e]) > worst ? fabs(a[i * row + e] - orig[e])
                                                                  : worst;
            }
        }
        cr_log_info("hand-built %s: largest error against the original floats: %.3g",
                    dtype_name(dt), worst);
        free(q);
        free(a);
        free(b);
        free(want);
        free(orig);
        hand_free(&hl);
    }
}

Test(attention, q8_and_bf16_layouts_are_checked_for_their_elements_and_scales)
{
    rng = ts_seed("dtype_einval");
    for (size_t di = 1; di < N_DTYPES; di++) {
        g_dtype = all_dtypes[di];
        ctxs_session *s = plain_of("a", 2, 2, 16, 50);
        ctxs_attn_plan plan = plan_of(s, 0);
        ctxs_layout lay = layout_of(s);
        float *q = rand_q(1, 4, 16, 1.0f);
        float *out = alloc_out(4 * 16);
        const ctxs_attn_query good = {q, 49, 1, 4, 0.0f};
        float scale;
#define EXPECT_BOTH(l, layer, want)                                                  \
    do {                                                                             \
        cr_expect_eq(ctxs_attention(out, l, &plan, layer, &good), want, "%s, line %d", \
                     dtype_name(g_dtype), __LINE__);                                \
        cr_expect_eq(ctxs_attention_check(&scale, l, &plan, layer, &good), want,     \
                     "%s, line %d", dtype_name(g_dtype), __LINE__);                  \
    } while (0)
        FOR_EACH_ISA(isa)
        {
            EXPECT_BOTH(&lay, 1, 0);
            ctxs_layout l = lay;
            l.slot_bytes = g_dtype == CTXS_DTYPE_Q8 ? 32 : 16;  /* another element size */
            EXPECT_BOTH(&l, 0, CTXS_EINVAL);
            l = lay, l.geometry.dtype = CTXS_DTYPE_F16 + CTXS_DTYPE_Q8 - g_dtype; /* q8<->f16 */
            if (g_dtype == CTXS_DTYPE_Q8)
                EXPECT_BOTH(&l, 0, CTXS_EINVAL);
            if (g_dtype == CTXS_DTYPE_BF16) {
                l = lay, l.kv = (uint8_t *)lay.kv + 1, l.kv_bytes -= 2;
                EXPECT_BOTH(&l, 0, CTXS_EINVAL);              /* a bf16 row at an odd address */
                l = lay, l.head_stride += 1;
                EXPECT_BOTH(&l, 0, CTXS_EINVAL);
                l = lay, l.scales = NULL, l.scales_bytes = 0; /* bf16 has none */
                EXPECT_BOTH(&l, 1, 0);
            } else {
                l = lay, l.scales = NULL;
                EXPECT_BOTH(&l, 0, CTXS_EINVAL);
                l = lay, l.scales = (float *)(void *)((uint8_t *)lay.scales + 2);
                EXPECT_BOTH(&l, 0, CTXS_EINVAL);               /* not 4-byte aligned */
                /* layer 1's scales cut by one float: layer 0 still reads */
                l = lay, l.scales_bytes = (size_t)2 * 2 * 2 * lay.capacity * sizeof(float) - 4;
                EXPECT_BOTH(&l, 1, CTXS_EINVAL);
                EXPECT_BOTH(&l, 0, 0);
                l.scales_bytes += 4;
                EXPECT_BOTH(&l, 1, 0);
                l = lay, l.kv = (uint8_t *)lay.kv + 1, l.kv_bytes -= 1;
                EXPECT_BOTH(&l, 0, 0);                          /* int8 needs no alignment */
            }
        }
#undef EXPECT_BOTH
        free(q);
        free(out);
        ctxs_session_close(s);
    }
}

/* --- Argument checks -------------------------------------------------------- */

Test(attention, bad_arguments_are_einval_and_leave_out_alone)
{
    rng = ts_seed("einval");
    ctxs_session *s = plain_of("a", 2, 2, 16, 50);
    ctxs_attn_plan plan = plan_of(s, 0);
    ctxs_layout lay = layout_of(s);
    float *q = rand_q(4, 4, 16, 1.0f);
    float *out = alloc_out(4 * 4 * 16);
    const ctxs_attn_query good = {q, 49, 1, 4, 0.0f};
    cr_assert_eq(ctxs_attention(out, &lay, &plan, 1, &good), 0);

#define EXPECT_EINVAL(o, l, p, layer, qq)                                      \
    do {                                                                       \
        for (int i_ = 0; i_ < 4 * 4 * 16; i_++)                                \
            out[i_] = 7.0f;                                                    \
        cr_expect_eq(ctxs_attention(o, l, p, layer, qq), CTXS_EINVAL, "line %d", __LINE__); \
        for (int i_ = 0; i_ < 4 * 4 * 16; i_++)                                \
            if (out[i_] != 7.0f) {                                             \
                cr_expect_fail("line %d: out written on error", __LINE__);     \
                break;                                                         \
            }                                                                  \
    } while (0)

    FOR_EACH_ISA(isa)
    {
        EXPECT_EINVAL(NULL, &lay, &plan, 1, &good);
        EXPECT_EINVAL(out, NULL, &plan, 1, &good);
        EXPECT_EINVAL(out, &lay, NULL, 1, &good);
        EXPECT_EINVAL(out, &lay, &plan, 1, NULL);
        EXPECT_EINVAL(out, &lay, &plan, 2, &good);          /* layer */
        EXPECT_EINVAL(out, &lay, &plan, UINT32_MAX, &good);

        ctxs_attn_query bad = good;
        bad.q = NULL;
        EXPECT_EINVAL(out, &lay, &plan, 0, &bad);
        bad = good, bad.n = 0;
        EXPECT_EINVAL(out, &lay, &plan, 0, &bad);
        bad = good, bad.n_heads = 0;
        EXPECT_EINVAL(out, &lay, &plan, 0, &bad);
        bad = good, bad.n_heads = 3;                        /* not a multiple of 2 */
        EXPECT_EINVAL(out, &lay, &plan, 0, &bad);
        bad = good, bad.pos = 48;                           /* below first_query */
        EXPECT_EINVAL(out, &lay, &plan, 0, &bad);
        bad = good, bad.pos = 50;                           /* beyond n_tokens */
        EXPECT_EINVAL(out, &lay, &plan, 0, &bad);
        bad = good, bad.n = 2;                              /* 49 + 2 > 50 */
        EXPECT_EINVAL(out, &lay, &plan, 0, &bad);
        bad = good, bad.pos = UINT64_MAX, bad.n = 2;        /* wraps */
        EXPECT_EINVAL(out, &lay, &plan, 0, &bad);
        bad = good, bad.n = UINT32_MAX;
        EXPECT_EINVAL(out, &lay, &plan, 0, &bad);

        /* Hostile plans. */
        ctxs_attn_plan p = plan;
        p.n_spans = CTXS_ATTN_MAX_SPANS + 1;
        EXPECT_EINVAL(out, &lay, &p, 0, &good);
        p = plan, p.spans[0].count = lay.capacity + 1;      /* beyond capacity */
        EXPECT_EINVAL(out, &lay, &p, 0, &good);
        p = plan, p.spans[0].slot = lay.capacity - 10;      /* slot + count beyond */
        EXPECT_EINVAL(out, &lay, &p, 0, &good);
        p = plan, p.spans[0].slot = UINT32_MAX, p.spans[0].count = 2; /* wraps */
        EXPECT_EINVAL(out, &lay, &p, 0, &good);
        p = plan, p.spans[0].slot = 2, p.spans[0].count = UINT32_MAX - 1;
        EXPECT_EINVAL(out, &lay, &p, 0, &good);
        p = plan, p.spans[0].pos = UINT64_MAX - 3;          /* pos + count wraps */
        EXPECT_EINVAL(out, &lay, &p, 0, &good);
        p = plan, p.n_keys++;                               /* disagrees with the spans */
        EXPECT_EINVAL(out, &lay, &p, 0, &good);
        /* Descending and overlapping positions. */
        p = plan;
        p.n_spans = 2;
        p.spans[0] = (ctxs_attn_span){25, 25, 25};
        p.spans[1] = (ctxs_attn_span){0, 0, 25};
        EXPECT_EINVAL(out, &lay, &p, 0, &good);
        p.spans[0] = (ctxs_attn_span){0, 0, 26};
        p.spans[1] = (ctxs_attn_span){25, 25, 25};
        p.n_keys = 51;
        EXPECT_EINVAL(out, &lay, &p, 0, &good);
        p.spans[0] = (ctxs_attn_span){0, 0, 25};            /* and the fix is fine */
        p.n_keys = 50;
        cr_expect_eq(ctxs_attention(out, &lay, &p, 0, &good), 0);

        /* Layouts that are not a session's. */
        ctxs_layout l = lay;
        static const uint32_t not_session_dtypes[] = {0, CTXS_DTYPE_F32, 5, UINT32_MAX};
        for (size_t i = 0; i < sizeof(not_session_dtypes) / sizeof(not_session_dtypes[0]); i++) {
            l.geometry.dtype = not_session_dtypes[i];
            EXPECT_EINVAL(out, &l, &plan, 0, &good);
        }
        l = lay, l.geometry.dtype = CTXS_DTYPE_Q8;          /* slot_bytes is 2 * head_dim */
        EXPECT_EINVAL(out, &l, &plan, 0, &good);
        l = lay, l.kv = NULL;
        EXPECT_EINVAL(out, &l, &plan, 0, &good);
        l = lay, l.slot_bytes += 2;
        EXPECT_EINVAL(out, &l, &plan, 0, &good);
        l = lay, l.kv_bytes = lay.layer_stride + lay.kv_stride; /* layer 1's V cut */
        EXPECT_EINVAL(out, &l, &plan, 1, &good);
        cr_expect_eq(ctxs_attention(out, &l, &plan, 0, &good), 0);
        l = lay, l.geometry.n_kv_heads = 0;
        EXPECT_EINVAL(out, &l, &plan, 0, &good);
        l = lay, l.layer_stride = SIZE_MAX / 2;
        EXPECT_EINVAL(out, &l, &plan, 1, &good);
    }
#undef EXPECT_EINVAL
    free(q);
    free(out);
    ctxs_session_close(s);
}

Test(attention, the_shared_check_agrees_with_the_kernel_and_gives_its_scale)
{
    /* ctxs_attention_check() is what the CUDA and Metal kernels call. */
    rng = ts_seed("check");
    ctxs_session *s = plain_of("a", 2, 2, 16, 50);
    ctxs_attn_plan plan = plan_of(s, 0);
    ctxs_layout lay = layout_of(s);
    float *q = rand_q(1, 4, 16, 1.0f);
    float *out = alloc_out(4 * 16);
    float scale = -1.0f;
    ctxs_attn_query qq = {q, 49, 1, 4, 0.0f};
    cr_assert_eq(ctxs_attention_check(&scale, &lay, &plan, 1, &qq), 0);
    cr_expect_eq(scale, 0.25f, "1/sqrt(16) is %a", (double)scale);
    qq.scale = 0.37f;
    cr_assert_eq(ctxs_attention_check(&scale, &lay, &plan, 1, &qq), 0);
    cr_expect_eq(scale, 0.37f);
    cr_expect_eq(ctxs_attention_check(NULL, &lay, &plan, 1, &qq), CTXS_EINVAL);

    /* A GPU kernel may take q from its own buffer; the CPU kernel may not. */
    qq.q = NULL;
    cr_expect_eq(ctxs_attention_check(&scale, &lay, &plan, 1, &qq), 0);
    cr_expect_eq(ctxs_attention(out, &lay, &plan, 1, &qq), CTXS_EINVAL);
    qq.q = q;

    /* What one refuses the other refuses. */
    ctxs_attn_query bad = qq;
    bad.n_heads = 3;
    cr_expect_eq(ctxs_attention_check(&scale, &lay, &plan, 1, &bad), CTXS_EINVAL);
    cr_expect_eq(ctxs_attention(out, &lay, &plan, 1, &bad), CTXS_EINVAL);
    bad = qq;
    bad.pos = 50;
    cr_expect_eq(ctxs_attention_check(&scale, &lay, &plan, 1, &bad), CTXS_EINVAL);
    cr_expect_eq(ctxs_attention(out, &lay, &plan, 1, &bad), CTXS_EINVAL);
    cr_expect_eq(ctxs_attention_check(&scale, &lay, &plan, 2, &qq), CTXS_EINVAL);
    ctxs_attn_plan hostile = plan;
    hostile.n_keys++;
    cr_expect_eq(ctxs_attention_check(&scale, &lay, &hostile, 1, &qq), CTXS_EINVAL);
    cr_expect_eq(ctxs_attention(out, &lay, &hostile, 1, &qq), CTXS_EINVAL);
    free(q);
    free(out);
    ctxs_session_close(s);
}

Test(attention, a_query_that_sees_no_key_gets_zeros_not_nan)
{
    rng = ts_seed("no_key");
    ctxs_session *s = plain_of("a", 1, 1, 16, 30);
    ctxs_layout lay = layout_of(s);
    /* A hand-built plan without sinks, a window of 1, and keys that stop
     * before the query: nothing is visible to it. */
    ctxs_attn_plan p = {0};
    p.n_tokens = 30;
    p.first_query = 20;
    p.n_sink = 0;
    p.window = 1;
    p.n_spans = 1;
    p.spans[0] = (ctxs_attn_span){0, 0, 10};
    p.n_keys = 10;
    float *q = rand_q(2, 2, 16, 1.0f);
    float *out = alloc_out(2 * 2 * 16);
    FOR_EACH_ISA(isa)
    {
        ctxs_attn_query qq = {q, 25, 2, 2, 0.0f};
        cr_assert_eq(ctxs_attention(out, &lay, &p, 0, &qq), 0);
        for (int i = 0; i < 2 * 2 * 16; i++)
            cr_expect_eq(out[i], 0.0f, "isa %s, element %d: %g", all_isas[isa], i, out[i]);
        expect_canary(out, 2 * 2 * 16);
    }
    free(q);
    free(out);
    ctxs_session_close(s);
}

Test(attention, the_isa_can_be_forced_only_to_what_the_cpu_has)
{
    const char *isa = ctxs_attention_get_isa();
    cr_expect(strcmp(isa, "avx512") == 0 || strcmp(isa, "avx2") == 0 ||
                  strcmp(isa, "neon") == 0 || strcmp(isa, "portable") == 0,
              "%s", isa);
    cr_expect_eq(ctxs__attention_force_isa("bogus"), CTXS_EINVAL);
    cr_expect_eq(ctxs__attention_force_isa("portable"), 0);
    cr_expect_str_eq(ctxs_attention_get_isa(), "portable");
#if defined(__x86_64__)
    cr_expect_eq(ctxs__attention_force_isa("neon"), CTXS_EINVAL);
#endif
    cr_expect_eq(ctxs__attention_force_isa(NULL), 0);
    cr_expect_str_eq(ctxs_attention_get_isa(), isa);
}

/* --- ctxs_session_get_attn_plan -------------------------------------------------- */

Test(attention, plan_of_an_empty_session_or_too_many_pending_is_einval)
{
    rng = ts_seed("plan_einval");
    ctxs_session *s = create_plain("a", 1, 1, 8);
    ctxs_attn_plan p;
    cr_expect_eq(ctxs_session_get_attn_plan(&p, s, 0), CTXS_EINVAL);
    cr_expect_eq(ctxs_session_get_attn_plan(NULL, s, 0), CTXS_EINVAL);
    cr_expect_eq(ctxs_session_get_attn_plan(&p, NULL, 0), CTXS_EINVAL);
    cr_expect_eq(ctxs_session_get_attn_plan(&p, s, 1), CTXS_EINVAL);
    ctxs_reservation r = reserve_random(s, 5);
    cr_expect_eq(ctxs_session_get_attn_plan(&p, s, 6), CTXS_EINVAL);
    cr_expect_eq(ctxs_session_get_attn_plan(&p, s, 0), CTXS_EINVAL); /* nothing committed */
    cr_assert_eq(ctxs_session_get_attn_plan(&p, s, 5), 0);
    cr_expect_eq(p.first_query, 0);
    cr_expect_eq(p.n_tokens, 5);
    cr_expect_eq(p.n_keys, 5);
    commit(s, &r, 5);
    cr_expect_eq(ctxs_session_get_attn_plan(&p, s, 1), CTXS_EINVAL); /* none reserved now */
    ctxs_session_close(s);
}

Test(attention, plan_first_query_and_key_counts)
{
    rng = ts_seed("plan_counts");
    ctxs_session *s = create("a", 1, 1, 8, ts_options(64, 4, 1, CTXS_SYNC_NONE));
    append_random(s, 10);
    ctxs_attn_plan p = plan_of(s, 0);
    cr_expect_eq(p.first_query, 9);
    cr_expect_eq(p.n_tokens, 10);
    cr_expect_eq(p.n_sink, 4);
    cr_expect_eq(p.n_keys, 10);
    expect_plan_sane(&p);
    ctxs_reservation r = reserve_random(s, 3);
    p = plan_of(s, 3);
    cr_expect_eq(p.first_query, 10);
    cr_expect_eq(p.n_tokens, 13);
    cr_expect_eq(p.n_keys, 13);
    expect_plan_sane(&p);
    p = plan_of(s, 1);
    cr_expect_eq(p.n_tokens, 11);
    cr_expect_eq(p.n_keys, 11);
    commit(s, &r, 3);
    /* Past the capacity: the ring holds 64, sinks included. */
    append_random(s, 100);
    p = plan_of(s, 0);
    cr_expect_eq(p.first_query, 112);
    cr_expect_eq(p.n_keys, 64);
    expect_plan_sane(&p);
    cr_expect_eq(p.spans[0].pos, 0);
    cr_expect_eq(p.spans[p.n_spans - 1].pos + p.spans[p.n_spans - 1].count, 113);
    ctxs_session_close(s);
}
