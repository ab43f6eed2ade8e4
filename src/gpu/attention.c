/*
 * The CPU attention kernel: the reference the GPU kernels are checked
 * against, and a usable decode kernel where there is no GPU.
 *
 * ctxs_attention() checks its arguments once, then for each query cuts the
 * plan's spans down to the runs of slots that query reads (its sinks and its
 * window, up to itself) and hands them, one KV head and up to
 * CTXS__ATTN_TILE query heads of its GQA group at a time, to the kernel of
 * the instruction set chosen at the first call.
 *
 * Determinism. An engine that resumes a session recomputes the last token
 * with n == 1 on a plan of another shape than the prefill that first
 * computed it, and must get the same bits. So every kernel walks the keys a
 * query reads as one sequence in position order, in logical blocks of
 * CTXS__ATTN_BLOCK keys counted in that sequence (never per span), and keeps
 * a flash-style running max and sum that are updated once per block. Within
 * a block the scores, the exponentials and the V accumulation of each
 * output element go key by key in order. Nothing depends on the spans, on
 * the other queries of the call, or on which tile a head falls in.
 *
 * The SIMD kernels also follow the portable one's arithmetic: a dot product
 * sums into 16 lanes (element d into lane d % 16) reduced by the same tree,
 * exp() is the same polynomial, the sums of weights are scalar and in key
 * order. The portable kernel does not fuse multiply-adds, so its last bits
 * differ from theirs; the SIMD ones agree with each other.
 */
#include <math.h> /* INFINITY; no libm function is called */
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "attention.h"
#include "internal.h"

/* --- Portable kernel ------------------------------------------------------ */

/* IEEE binary16 to binary32, exact, by bits: no _Float16, no F16C. */
static inline float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        /* Zero or subnormal: man * 2^-24 is exact in a float. */
        float f = (float)man * 0x1p-24f;
        memcpy(&bits, &f, 4);
        bits |= sign;
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* floor() of t in [-127, 1], without libm (the library does not link it). */
static inline float floor_small(float t)
{
    int i = (int)t; /* toward zero */
    return (float)i > t ? (float)(i - 1) : (float)i;
}

/* See CTXS__EXP_* in attention.h; the SIMD kernels take the same steps
 * with fused multiply-adds. */
static inline float exp_le0(float x)
{
    if (!(x >= CTXS__EXP_MIN))
        return 0.0f; /* also -inf: a key that underflows weighs nothing */
    float n = floor_small(x * CTXS__EXP_LOG2E + 0.5f);
    float r = x - n * CTXS__EXP_C1;
    r = r - n * CTXS__EXP_C2;
    float y = CTXS__EXP_P0;
    y = y * r + CTXS__EXP_P1;
    y = y * r + CTXS__EXP_P2;
    y = y * r + CTXS__EXP_P3;
    y = y * r + CTXS__EXP_P4;
    y = y * r + CTXS__EXP_P5;
    y = y * (r * r) + r;
    y = y + 1.0f;
    /* n is in [-126, 0] here, so 2^n is a normal float. */
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float p2;
    memcpy(&p2, &bits, 4);
    return y * p2;
}

/* The 16-lane tree every kernel reduces a dot product with: lane i with
 * i + 8, then i + 4, i + 2, i + 1. */
static inline float reduce16(const float a[16])
{
    float s8[8], s4[4];
    for (int i = 0; i < 8; i++)
        s8[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; i++)
        s4[i] = s8[i] + s8[i + 4];
    float s2a = s4[0] + s4[2], s2b = s4[1] + s4[3];
    return s2a + s2b;
}

void ctxs__attn_portable(float *out, const float *q, uint32_t n_q, float scale,
                         const ctxs__attn_keys *keys)
{
    enum { B = CTXS__ATTN_BLOCK, T = CTXS__ATTN_TILE };
    const uint32_t hd = keys->head_dim;
    float s[T][B], m[T], l[T], c[T];
    const uint16_t *kr[B], *vr[B];
    ctxs__attn_cursor cur = { 0 };

    for (uint32_t g = 0; g < n_q; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    /* done: keys of the blocks before this one. */
    for (uint32_t done = 0, nb; (nb = ctxs__attn_next_block(keys, &cur, kr, vr)); done += nb) {

        /* Each K row is converted once, 16 elements at a time, for all the
         * heads of the tile; element d goes to lane d % 16 of its head. */
        for (uint32_t j = 0; j < nb; j++) {
            float lane[T][16] = {{0}};
            for (uint32_t d0 = 0; d0 < hd; d0 += 16) {
                uint32_t w = hd - d0 < 16 ? hd - d0 : 16;
                float k[16];
                for (uint32_t i = 0; i < w; i++)
                    k[i] = half_to_float(kr[j][d0 + i]);
                for (uint32_t g = 0; g < n_q; g++) {
                    const float *qg = q + (size_t)g * hd + d0;
                    for (uint32_t i = 0; i < w; i++)
                        lane[g][i] += qg[i] * k[i];
                }
            }
            for (uint32_t g = 0; g < n_q; g++)
                s[g][j] = reduce16(lane[g]) * scale;
        }

        for (uint32_t g = 0; g < n_q; g++) {
            float bm = s[g][0];
            for (uint32_t j = 1; j < nb; j++)
                bm = s[g][j] > bm ? s[g][j] : bm;
            float nm = bm > m[g] ? bm : m[g];
            /* done == 0: nothing to rescale, and -inf - -inf is NaN. */
            c[g] = done ? exp_le0(m[g] - nm) : 0.0f;
            m[g] = nm;
            l[g] *= c[g];
            for (uint32_t j = 0; j < nb; j++) {
                s[g][j] = exp_le0(s[g][j] - nm);
                l[g] += s[g][j];
            }
        }

        /* Each element: rescaled once, then plus weight times V key by key,
         * in order; V rows converted once for all the heads. */
        for (uint32_t g = 0; g < n_q; g++) {
            float *og = out + (size_t)g * hd;
            for (uint32_t d = 0; d < hd; d++)
                og[d] = done ? og[d] * c[g] : 0.0f;
        }
        for (uint32_t j = 0; j < nb; j++) {
            for (uint32_t d0 = 0; d0 < hd; d0 += 16) {
                uint32_t w = hd - d0 < 16 ? hd - d0 : 16;
                float v[16];
                for (uint32_t i = 0; i < w; i++)
                    v[i] = half_to_float(vr[j][d0 + i]);
                for (uint32_t g = 0; g < n_q; g++) {
                    float *og = out + (size_t)g * hd + d0;
                    for (uint32_t i = 0; i < w; i++)
                        og[i] += s[g][j] * v[i];
                }
            }
        }
    }

    for (uint32_t g = 0; g < n_q; g++) {
        /* l >= 1 (the max key weighs exp(0)) unless the scores are NaN. */
        float inv = 1.0f / l[g];
        float *og = out + (size_t)g * hd;
        for (uint32_t d = 0; d < hd; d++)
            og[d] *= inv;
    }
}

/* --- Dispatch --------------------------------------------------------------- */

typedef struct isa {
    const char *name;
    ctxs__attn_fn *fn;
} isa;

static const isa isa_portable = {"portable", ctxs__attn_portable};
#if defined(__x86_64__) || defined(__i386__)
static const isa isa_avx2 = {"avx2", ctxs__attn_avx2};
static const isa isa_avx512 = {"avx512", ctxs__attn_avx512};
#endif
#if defined(__aarch64__)
static const isa isa_neon = {"neon", ctxs__attn_neon};
#endif

static int isa_supported(const isa *i)
{
    if (i == &isa_portable)
        return 1;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    /* F16C has no __builtin_cpu_supports() name in clang 14, and GCC 12
     * answers 0 for it on CPUs that have it: ask CPUID (leaf 1, ECX bit 29).
     * The builtins check that the OS saves the ymm and zmm registers. */
    unsigned a, b, c, d;
    int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
    int avx2 = f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (i == &isa_avx2)
        return avx2;
    if (i == &isa_avx512)
        return avx2 && __builtin_cpu_supports("avx512f");
#endif
#if defined(__aarch64__)
    if (i == &isa_neon)
        return 1; /* Advanced SIMD with fp16 conversion is baseline AArch64 */
#endif
    return 0;
}

static const isa *const isas[] = {
#if defined(__x86_64__) || defined(__i386__)
    &isa_avx512,
    &isa_avx2,
#endif
#if defined(__aarch64__)
    &isa_neon,
#endif
    &isa_portable,
};

static _Atomic(const isa *) isa_auto;
static _Atomic(const isa *) isa_forced;
static pthread_once_t isa_once = PTHREAD_ONCE_INIT;

static void isa_choose(void)
{
    for (size_t i = 0; i < sizeof(isas) / sizeof(isas[0]); i++) {
        if (isa_supported(isas[i])) {
            atomic_store(&isa_auto, isas[i]);
            return;
        }
    }
}

static const isa *isa_current(void)
{
    const isa *f = atomic_load(&isa_forced);
    if (f)
        return f;
    pthread_once(&isa_once, isa_choose);
    return atomic_load(&isa_auto);
}

int ctxs__attention_force_isa(const char *name)
{
    if (!name) {
        atomic_store(&isa_forced, NULL);
        return 0;
    }
    for (size_t i = 0; i < sizeof(isas) / sizeof(isas[0]); i++) {
        if (strcmp(isas[i]->name, name) == 0) {
            if (!isa_supported(isas[i]))
                return CTXS_EINVAL;
            atomic_store(&isa_forced, isas[i]);
            return 0;
        }
    }
    return CTXS_EINVAL;
}

const char *ctxs_attention_isa(void)
{
    return isa_current()->name;
}

/* --- Entry ------------------------------------------------------------------ */

/* Checks the plan against the capacity: every slot it names is in
 * [0, capacity), spans go up in position without overlap, and n_keys is
 * their sum. All of it in 64-bit arithmetic that cannot wrap. */
static int plan_valid(const ctxs_attn_plan *plan, uint32_t capacity)
{
    CTXS__CHECK(plan->n_spans <= CTXS_ATTN_MAX_SPANS);
    uint64_t keys = 0, next = 0;
    for (uint32_t i = 0; i < plan->n_spans; i++) {
        const ctxs_attn_span *sp = &plan->spans[i];
        CTXS__CHECK(sp->count <= capacity && sp->slot <= capacity - sp->count);
        CTXS__CHECK(sp->pos <= UINT64_MAX - sp->count);
        CTXS__CHECK(i == 0 || sp->pos >= next);
        next = sp->pos + sp->count;
        keys += sp->count;
    }
    CTXS__CHECK(keys == plan->n_keys);
    return 0;
}

/* Checks that the bytes of layer `layer` that a pass may read lie inside
 * kv->kv_bytes, for a layout copied or built by the caller. */
static int layout_valid(const ctxs_layout *kv, uint32_t layer)
{
    const ctxs_geometry *g = &kv->geometry;
    CTXS__CHECK(kv->kv && g->dtype == CTXS_DTYPE_F16);
    CTXS__CHECK(layer < g->n_layers && g->n_kv_heads > 0 && g->head_dim > 0);
    CTXS__CHECK(kv->slot_bytes == (size_t)g->head_dim * 2);
    /* fp16 rows are read as uint16_t: every row must be 2-byte aligned. */
    CTXS__CHECK((((uintptr_t)kv->kv | kv->head_stride | kv->kv_stride |
                  kv->layer_stride) & 1) == 0);
    size_t a, b, end;
    CTXS__CHECK(!__builtin_mul_overflow((size_t)layer, kv->layer_stride, &a));
    CTXS__CHECK(!__builtin_mul_overflow((size_t)(g->n_kv_heads - 1), kv->head_stride, &b));
    CTXS__CHECK(!__builtin_add_overflow(a, b, &end));
    CTXS__CHECK(!__builtin_add_overflow(end, kv->kv_stride, &end));
    CTXS__CHECK(!__builtin_mul_overflow((size_t)kv->capacity, kv->slot_bytes, &b));
    CTXS__CHECK(!__builtin_add_overflow(end, b, &end));
    CTXS__CHECK(end <= kv->kv_bytes);
    return 0;
}

/* The runs of slots query position p reads, in position order: each span
 * cut to [0, p] and to the sinks plus the last `window` positions. */
static uint32_t query_runs(ctxs__attn_keys *keys, const ctxs_attn_plan *plan,
                           uint64_t p)
{
    uint64_t lo[2], hi[2];
    uint32_t n_iv;
    uint64_t recent = p + 1 > plan->window ? p + 1 - plan->window : 0;
    uint64_t sink_hi = plan->n_sink < p + 1 ? plan->n_sink : p + 1;
    if (recent <= sink_hi) {
        lo[0] = 0, hi[0] = p + 1, n_iv = 1;
    } else {
        lo[0] = 0, hi[0] = sink_hi;
        lo[1] = recent, hi[1] = p + 1;
        n_iv = 2;
    }
    keys->n_runs = 0;
    keys->n_keys = 0;
    for (uint32_t i = 0; i < plan->n_spans; i++) {
        const ctxs_attn_span *sp = &plan->spans[i];
        for (uint32_t v = 0; v < n_iv; v++) {
            uint64_t a = sp->pos > lo[v] ? sp->pos : lo[v];
            uint64_t b = sp->pos + sp->count < hi[v] ? sp->pos + sp->count : hi[v];
            if (a >= b)
                continue;
            keys->runs[keys->n_runs].slot = sp->slot + (uint32_t)(a - sp->pos);
            keys->runs[keys->n_runs].count = (uint32_t)(b - a);
            keys->n_runs++;
            keys->n_keys += (uint32_t)(b - a);
        }
    }
    return keys->n_keys;
}

/* 1 / sqrt(head_dim) without libm: Newton's iteration in double from
 * above converges to sqrt(hd) to the last bit or two of a double, well
 * past what rounding to float keeps. */
static float default_scale(uint32_t hd)
{
    double x = hd, r = hd > 1 ? hd : 1.0;
    for (int i = 0; i < 64; i++) {
        double next = 0.5 * (r + x / r);
        if (next >= r)
            break;
        r = next;
    }
    return (float)(1.0 / r);
}

int ctxs_attention_check(float *scale_out, const ctxs_layout *kv,
                         const ctxs_attn_plan *plan, uint32_t layer,
                         const ctxs_attn_query *q)
{
    CTXS__CHECK(scale_out && kv && plan && q);
    int rc = layout_valid(kv, layer);
    if (rc < 0)
        return rc;
    const uint32_t n_kv = kv->geometry.n_kv_heads;
    CTXS__CHECK(q->n >= 1 && q->n_heads > 0 && q->n_heads % n_kv == 0);
    CTXS__CHECK(q->pos >= plan->first_query && q->pos <= plan->n_tokens &&
                q->n <= plan->n_tokens - q->pos);
    rc = plan_valid(plan, kv->capacity);
    if (rc < 0)
        return rc;
    *scale_out = q->scale != 0.0f ? q->scale : default_scale(kv->geometry.head_dim);
    return 0;
}

int ctxs_attention(float *out, const ctxs_layout *kv, const ctxs_attn_plan *plan,
                   uint32_t layer, const ctxs_attn_query *q)
{
    float scale;
    CTXS__CHECK(out && q && q->q);
    int rc = ctxs_attention_check(&scale, kv, plan, layer, q);
    if (rc < 0)
        return rc;
    const uint32_t n_kv = kv->geometry.n_kv_heads, hd = kv->geometry.head_dim;

    ctxs__attn_fn *fn = isa_current()->fn;
    const uint32_t group = q->n_heads / n_kv;
    const size_t row = (size_t)q->n_heads * hd; /* floats per query */
    const uint8_t *base = (const uint8_t *)kv->kv + (size_t)layer * kv->layer_stride;

    ctxs__attn_keys keys;
    keys.slot_bytes = kv->slot_bytes;
    keys.head_dim = hd;
    for (uint32_t i = 0; i < q->n; i++) {
        const float *qi = q->q + (size_t)i * row;
        float *oi = out + (size_t)i * row;
        if (query_runs(&keys, plan, q->pos + i) == 0) {
            /* Only a plan built by hand can leave a query nothing to read
             * (a valid plan holds the query's own position): softmax over
             * no key is undefined, and zeros say "no contribution" without
             * the NaN that 0/0 would spread through the next layers. */
            memset(oi, 0, row * sizeof(float));
            continue;
        }
        for (uint32_t h = 0; h < n_kv; h++) {
            keys.k = base + (size_t)h * kv->head_stride;
            keys.v = keys.k + kv->kv_stride;
            for (uint32_t g = 0; g < group; g += CTXS__ATTN_TILE) {
                uint32_t n_q = group - g < CTXS__ATTN_TILE ? group - g : CTXS__ATTN_TILE;
                size_t at = ((size_t)h * group + g) * hd;
                fn(oi + at, qi + at, n_q, scale, &keys);
            }
        }
    }
    return 0;
}
