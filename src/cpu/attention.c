/*
 * The CPU attention kernel: the reference the GPU kernels are checked
 * against, and a usable decode kernel where there is no GPU.
 *
 * ctxs_attention() checks its arguments once, then for each query cuts the
 * plan's spans down to the runs of slots that query reads (its sinks and its
 * window, up to itself), and walks them, one KV head at a time, for a block
 * of CTXS__ATTN_QBLOCK queries together (see "Blocks of queries" below):
 * each logical block of keys goes to the kernel of the instruction set
 * chosen at the first call, with up to CTXS__ATTN_TILE rows (query heads of
 * those queries) a call.
 *
 * Determinism. An engine that resumes a session recomputes the last token
 * with n == 1 on a plan of another shape than the prefill that first
 * computed it, and must get the same bits. So every kernel walks the keys a
 * query reads as one sequence in position order, in logical blocks of
 * CTXS__ATTN_BLOCK keys counted in that sequence (never per span), and keeps
 * a flash-style running max and sum that are updated once per block. Within
 * a block the scores, the exponentials and the V accumulation of each
 * output element go key by key in order. Nothing depends on the spans, on
 * the other queries of the call, or on which tile a head falls in: a row
 * that shares a tile with rows of later queries takes only its own keys of
 * the block, and skips the others rather than weighting them by 0.
 *
 * Element types. K and V are read in place as fp16, bf16 or int8 (Q8),
 * each widened to float exactly; the dtype is a constant inside each SIMD
 * instantiation (see the template in attention.h), so that the dtypes
 * share every line but the conversion. A Q8 scale multiplies a key's dot
 * product once, and a V row's weight once: never per element, which would
 * cost a multiply per element and round differently.
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
#include "dtype.h"
#include "last_error.h"

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

/* n (at most 16) elements of a K or V row from element d, as float: fp16,
 * bf16 (the high half of a float) or int8 (exact), each read as its own
 * type from the mapping. */
static inline void widen(float out[16], const uint8_t *row, uint32_t d, uint32_t n,
                         uint32_t dtype)
{
    if (dtype == CTXS_DTYPE_Q8) {
        const int8_t *q = (const int8_t *)(const void *)row + d;
        for (uint32_t i = 0; i < n; i++)
            out[i] = (float)q[i];
    } else if (dtype == CTXS_DTYPE_BF16) {
        const uint16_t *h = (const uint16_t *)(const void *)row + d;
        for (uint32_t i = 0; i < n; i++)
            out[i] = ctxs__bf16_to_f32(h[i]);
    } else {
        const uint16_t *h = (const uint16_t *)(const void *)row + d;
        for (uint32_t i = 0; i < n; i++)
            out[i] = half_to_float(h[i]);
    }
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

void ctxs__attn_portable(ctxs__attn_row *rows, uint32_t n_q, const ctxs__attn_block *blk)
{
    enum { B = CTXS__ATTN_BLOCK, T = CTXS__ATTN_TILE };
    const uint32_t hd = blk->head_dim, done = blk->done, dt = blk->dtype;
    const int q8 = dt == CTXS_DTYPE_Q8;
    float s[T][B], c[T];
    uint32_t nb[T], hi = 0;
    for (uint32_t g = 0; g < n_q; g++) {
        nb[g] = ctxs__attn_row_nb(&rows[g], blk);
        hi = nb[g] > hi ? nb[g] : hi;
    }

    /* Each K row is converted once, 16 elements at a time, for all the
     * rows of the tile; element d goes to lane d % 16 of its row. A row's
     * scores past its own keys are computed and never read. */
    for (uint32_t j = 0; j < hi; j++) {
        float lane[T][16] = {{0}};
        for (uint32_t d0 = 0; d0 < hd; d0 += 16) {
            uint32_t w = hd - d0 < 16 ? hd - d0 : 16;
            float k[16];
            widen(k, blk->k[j], d0, w, dt);
            for (uint32_t g = 0; g < n_q; g++) {
                const float *qg = rows[g].q + d0;
                for (uint32_t i = 0; i < w; i++)
                    lane[g][i] += qg[i] * k[i];
            }
        }
        for (uint32_t g = 0; g < n_q; g++)
            s[g][j] = ctxs__attn_score(reduce16(lane[g]), blk->ks, j, blk->scale, q8);
    }

    for (uint32_t g = 0; g < n_q; g++) {
        ctxs__attn_row *r = &rows[g];
        float bm = s[g][0];
        for (uint32_t j = 1; j < nb[g]; j++)
            bm = s[g][j] > bm ? s[g][j] : bm;
        float nm = bm > r->m ? bm : r->m;
        /* done == 0: nothing to rescale, and -inf - -inf is NaN. */
        c[g] = done ? exp_le0(r->m - nm) : 0.0f;
        r->m = nm;
        r->l *= c[g];
        for (uint32_t j = 0; j < nb[g]; j++) {
            s[g][j] = exp_le0(s[g][j] - nm);
            r->l += s[g][j];
        }
        /* Q8: V row j is added with the weight times its scale, once per
         * (key, row) rather than per element. */
        for (uint32_t j = 0; q8 && j < nb[g]; j++)
            s[g][j] *= blk->vs[j];
    }

    /* Each element: rescaled once, then plus weight times V key by key,
     * in order; V rows converted once for all the rows. */
    for (uint32_t g = 0; g < n_q; g++)
        for (uint32_t d = 0; d < hd; d++)
            rows[g].out[d] = done ? rows[g].out[d] * c[g] : 0.0f;
    for (uint32_t j = 0; j < hi; j++) {
        for (uint32_t d0 = 0; d0 < hd; d0 += 16) {
            uint32_t w = hd - d0 < 16 ? hd - d0 : 16;
            float v[16];
            widen(v, blk->v[j], d0, w, dt);
            for (uint32_t g = 0; g < n_q; g++) {
                float *og = rows[g].out + d0;
                for (uint32_t i = 0; i < w && j < nb[g]; i++)
                    og[i] += s[g][j] * v[i];
            }
        }
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

#ifdef CTXS_TEST_HOOKS
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
#endif

const char *ctxs_attention_get_isa(void)
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
 * kv->kv_bytes (and, for Q8, its scales inside scales_bytes), for a layout
 * copied or built by the caller. */
static int layout_valid(const ctxs_layout *kv, uint32_t layer)
{
    const ctxs_geometry *g = &kv->geometry;
    const uint32_t eb = ctxs__dtype_bytes(g->dtype); /* 0: not a session dtype */
    CTXS__CHECK(kv->kv && eb > 0);
    /* A scheduled session's layers each have their own slots: one layer at
     * a time (ctxs_session_get_layer_attn()). */
    CTXS__CHECK(g->period == 0);
    CTXS__CHECK(layer < g->n_layers && g->n_kv_heads > 0 && g->head_dim > 0);
    CTXS__CHECK(kv->slot_bytes == (size_t)g->head_dim * eb);
    /* Elements are read as their own type (uint16_t for fp16 and bf16):
     * every row must be aligned to the element. */
    CTXS__CHECK((((uintptr_t)kv->kv | kv->head_stride | kv->kv_stride |
                  kv->layer_stride) & (eb - 1)) == 0);
    size_t a, b, end;
    if (ctxs__dtype_has_scales(g->dtype)) {
        /* The layer's [2][n_kv_heads][capacity] floats, after those of the
         * layers before it. */
        CTXS__CHECK(kv->scales && ((uintptr_t)kv->scales & 3) == 0);
        CTXS__CHECK(!__builtin_mul_overflow((size_t)g->n_kv_heads * 2, (size_t)kv->capacity, &a));
        CTXS__CHECK(!__builtin_mul_overflow(a, (size_t)layer + 1, &end));
        CTXS__CHECK(!__builtin_mul_overflow(end, sizeof(float), &end));
        CTXS__CHECK(end <= kv->scales_bytes);
    }
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
 * cut to [0, p] and to the sinks plus the last `window` positions. *whole
 * says that the cut is [0, p] alone, which makes the sequence a prefix of
 * the next position's. */
static uint32_t query_runs(ctxs__attn_keys *keys, const ctxs_attn_plan *plan,
                           uint64_t p, int *whole)
{
    uint64_t lo[2], hi[2];
    uint32_t n_iv;
    uint64_t recent = p + 1 > plan->window ? p + 1 - plan->window : 0;
    uint64_t sink_hi = plan->n_sink < p + 1 ? plan->n_sink : p + 1;
    *whole = recent <= sink_hi;
    if (*whole) {
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
    ctxs__error_begin();
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

/* --- Blocks of queries ------------------------------------------------------ *
 *
 * A prefill of n queries would read every K/V row up to n times if each
 * query walked its keys alone. Instead CTXS__ATTN_QBLOCK consecutive queries
 * walk together, block index by block index: block b of each of them, for
 * every row (query head) of them, before any block b + 1. A query's own
 * blocks, and the order of its updates, are those it has alone; only the
 * interleaving with the other queries changes, which no output depends on.
 *
 * Queries whose windows hold all their keys (the window not smaller than
 * their positions) read nested prefixes of one sequence: they form one
 * group that walks the longest sequence, each row taking the first keys of
 * each block that are its own. Where the window cuts the keys off below,
 * each query's sequence starts one position after the last one's, so its
 * blocks are offset by one key from its neighbour's: such a query is a
 * group of its own. The groups still go through block b together, and as
 * their blocks b overlap in all but one key per query, a block's K/V rows
 * are read from memory once and from the cache for the other groups. What
 * the sliding case loses is only that a tile of rows holds one query's
 * heads, not several queries', so a converted K row serves fewer rows. */

typedef struct qgroup {
    ctxs__attn_keys keys;  /* the longest sequence of the group */
    ctxs__attn_cursor cur;
    uint32_t row, end;     /* its rows, in order of n_keys; row moves past
                              those that have read all their keys */
} qgroup;

typedef struct qblock {
    const float *q;        /* the block's first query, [n][n_heads][hd] */
    float *out;
    uint32_t n_keys[CTXS__ATTN_QBLOCK]; /* of each query; 0: none, zeros out */
    uint32_t group_end[CTXS__ATTN_QBLOCK]; /* queries [end of the last, this) */
    uint32_t n, n_groups;
    qgroup groups[CTXS__ATTN_QBLOCK];
} qblock;

/* Sorts queries pos .. pos + n - 1 into groups; zeros for those that see
 * no key. */
static void qblock_group(qblock *qb, const ctxs_attn_plan *plan, uint64_t pos, size_t row)
{
    int prev_whole = 0;
    qb->n_groups = 0;
    for (uint32_t i = 0; i < qb->n; i++) {
        ctxs__attn_keys keys;
        int whole;
        qb->n_keys[i] = query_runs(&keys, plan, pos + i, &whole);
        if (qb->n_keys[i] == 0) {
            /* Only a plan built by hand can leave a query nothing to read
             * (a valid plan holds the query's own position): softmax over
             * no key is undefined, and zeros say "no contribution" without
             * the NaN that 0/0 would spread through the next layers. */
            memset(qb->out + i * row, 0, row * sizeof(float));
            continue;
        }
        if (!(whole && prev_whole))
            qb->n_groups++;
        qb->groups[qb->n_groups - 1].keys = keys; /* the longest so far */
        qb->group_end[qb->n_groups - 1] = i + 1;
        prev_whole = whole;
    }
}

typedef struct pass {
    ctxs__attn_fn *fn;
    const ctxs_layout *kv;
    const uint8_t *base;   /* the layer's K/V */
    const float *scales;   /* Q8: the layer's [2][n_kv_heads][capacity]
                              scales; NULL for the other dtypes */
    size_t row;            /* floats per query */
    uint32_t group, hd;
    float scale;
} pass;

/* Rows of query heads g0 .. g0 + nh - 1 of KV head h, for the whole
 * query block; the groups' keys pointed at that head. */
static uint32_t qblock_rows(ctxs__attn_row *rows, qblock *qb, const pass *ps, uint32_t h,
                            uint32_t g0, uint32_t nh)
{
    uint32_t n = 0, i = 0;
    for (uint32_t gi = 0; gi < qb->n_groups; gi++) {
        qgroup *G = &qb->groups[gi];
        G->keys.k = ps->base + (size_t)h * ps->kv->head_stride;
        G->keys.v = G->keys.k + ps->kv->kv_stride;
        G->keys.slot_bytes = ps->kv->slot_bytes;
        G->keys.ks = G->keys.vs = NULL;
        if (ps->scales) {
            const uint32_t n_kv = ps->kv->geometry.n_kv_heads, cap = ps->kv->capacity;
            G->keys.ks = ps->scales + (size_t)h * cap;
            G->keys.vs = ps->scales + ((size_t)n_kv + h) * cap;
        }
        G->cur = (ctxs__attn_cursor){0};
        G->row = n;
        for (; i < qb->group_end[gi]; i++) {
            if (qb->n_keys[i] == 0)
                continue;
            size_t at = i * ps->row + ((size_t)h * ps->group + g0) * ps->hd;
            for (uint32_t t = 0; t < nh; t++, at += ps->hd)
                rows[n++] = (ctxs__attn_row){qb->out + at, qb->q + at, -INFINITY, 0.0f,
                                             qb->n_keys[i]};
        }
        G->end = n;
    }
    return n;
}

/* The online softmax of every row, block index by block index, then each
 * row divided by its sum. */
static void qblock_walk(qblock *qb, const pass *ps, uint32_t h, uint32_t g0, uint32_t nh)
{
    ctxs__attn_row rows[CTXS__ATTN_QBLOCK * CTXS__ATTN_TILE];
    const uint32_t n_rows = qblock_rows(rows, qb, ps, h, g0, nh);
    ctxs__attn_block blk;
    blk.head_dim = ps->hd;
    blk.dtype = ps->kv->geometry.dtype;
    blk.scale = ps->scale;
    for (int more = 1; more;) {
        more = 0;
        for (uint32_t gi = 0; gi < qb->n_groups; gi++) {
            qgroup *G = &qb->groups[gi];
            if (!ctxs__attn_next_block(&G->keys, &G->cur, &blk))
                continue;
            more = 1;
            /* The group's last row reads its whole sequence, so this
             * stops before G->end. */
            while (rows[G->row].n_keys <= blk.done)
                G->row++;
            for (uint32_t r = G->row; r < G->end; r += CTXS__ATTN_TILE)
                ps->fn(rows + r, G->end - r < CTXS__ATTN_TILE ? G->end - r : CTXS__ATTN_TILE,
                       &blk);
        }
    }
    for (uint32_t r = 0; r < n_rows; r++) {
        /* l >= 1 (the max key weighs exp(0)) unless the scores are NaN. */
        const float inv = 1.0f / rows[r].l;
        for (uint32_t d = 0; d < ps->hd; d++)
            rows[r].out[d] *= inv;
    }
}

int ctxs_attention(float *out, const ctxs_layout *kv, const ctxs_attn_plan *plan,
                   uint32_t layer, const ctxs_attn_query *q)
{
    ctxs__error_begin();
    float scale;
    CTXS__CHECK(out && q && q->q);
    int rc = ctxs_attention_check(&scale, kv, plan, layer, q);
    if (rc < 0)
        return rc;
    const uint32_t n_kv = kv->geometry.n_kv_heads, hd = kv->geometry.head_dim;
    const pass ps = {
        .fn = isa_current()->fn,
        .kv = kv,
        .base = (const uint8_t *)kv->kv + (size_t)layer * kv->layer_stride,
        .scales = ctxs__dtype_has_scales(kv->geometry.dtype)
                      ? kv->scales + (size_t)layer * 2 * n_kv * kv->capacity
                      : NULL,
        .row = (size_t)q->n_heads * hd,
        .group = q->n_heads / n_kv,
        .hd = hd,
        .scale = scale,
    };
    qblock qb;
    for (uint32_t i0 = 0; i0 < q->n; i0 += CTXS__ATTN_QBLOCK) {
        qb.q = q->q + (size_t)i0 * ps.row;
        qb.out = out + (size_t)i0 * ps.row;
        qb.n = q->n - i0 < CTXS__ATTN_QBLOCK ? q->n - i0 : CTXS__ATTN_QBLOCK;
        qblock_group(&qb, plan, q->pos + i0, ps.row);
        for (uint32_t h = 0; h < n_kv; h++)
            for (uint32_t g = 0; g < ps.group; g += CTXS__ATTN_TILE)
                qblock_walk(&qb, &ps, h, g,
                            ps.group - g < CTXS__ATTN_TILE ? ps.group - g : CTXS__ATTN_TILE);
    }
    return 0;
}
