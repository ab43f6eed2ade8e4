/*
 * The CPU attention kernel's private parts: what ctxs_attention() hands to
 * the per-ISA kernels (attention.c, attention_x86.c, attention_arm.c), and
 * a hook for tests.
 */
#ifndef CTXS_CPU_ATTENTION_H
#define CTXS_CPU_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "ctxstore.h"

/* Keys per softmax block, counted in the sequence of keys one query reads
 * (not per span): the running max and sum are updated once per block. Every
 * ISA uses the same blocks, and a query's blocks do not depend on the plan's
 * spans or on the other queries of the call, which is what makes a token's
 * output the same in a prefill and in a decode after a resume. Changing it
 * changes the bits of every output. */
#define CTXS__ATTN_BLOCK 64

/* Query heads processed together per pass over a block's K and V rows. A
 * GQA group larger than this is processed in tiles; a head's result does
 * not depend on the tile it falls in. */
#define CTXS__ATTN_TILE 8

/* Consecutive queries of a prefill that walk their keys together: block b
 * of every query's sequence is done for all of them before block b + 1, so
 * a K/V block comes from memory once per this many queries and from the
 * cache for the rest, and a tile of rows can hold several queries' heads.
 * CPU time of one layer's prefill of Qwen3-4B's KV shape (8 KV heads, 16
 * query heads, head_dim 128), AVX2 on an AMD EPYC: 2048 queries, window
 * above them, 622 ms query by query, 469 in blocks of 8, 365 of 16, 348 of
 * 32; 3072 queries, window 1024 (every query its own group), 828, 676,
 * 545, 613. 16 is the best or near it in both. */
#define CTXS__ATTN_QBLOCK 16

/* The keys one query reads from one KV head: runs of consecutive slots, in
 * position order (a plan span cut to the query's sinks and window gives at
 * most two runs). */
typedef struct ctxs__attn_keys {
    const uint8_t *k;    /* slot 0 of the head's K run */
    const uint8_t *v;    /* slot 0 of the head's V run */
    const float *ks;     /* CTXS_DTYPE_Q8: slot 0's scale of the head's K */
    const float *vs;     /*   and of its V; NULL for the other dtypes */
    size_t slot_bytes;   /* head_dim * element size */
    uint32_t n_runs;
    uint32_t n_keys;     /* sum of the runs' counts */
    struct {
        uint32_t slot;
        uint32_t count;
    } runs[2 * CTXS_ATTN_MAX_SPANS];
} ctxs__attn_keys;

/* A cursor over the keys of an ctxs__attn_keys, in sequence order. */
typedef struct ctxs__attn_cursor {
    uint32_t run;  /* the run the next key is in */
    uint32_t at;   /* keys of that run already taken */
    uint32_t done; /* keys taken in all */
} ctxs__attn_cursor;

/* One logical block of a key sequence, as the kernels take it. The rows
 * are head_dim elements of dtype: IEEE binary16, bfloat16 (widened by a
 * 16-bit shift) or, for CTXS_DTYPE_Q8, int8 that the scales ks[] and vs[]
 * multiply. A Q8 scale is applied once per (key, row), never per element:
 * the score is (sum of q[i] * k[i]) * ks[j] * scale, and V row j is added
 * with the weight p[j] * vs[j], so that the int8 rows convert to float
 * exactly and the dot products and V sums are the same code as for the
 * other dtypes. */
typedef struct ctxs__attn_block {
    const uint8_t *k[CTXS__ATTN_BLOCK]; /* the K rows, in sequence order */
    const uint8_t *v[CTXS__ATTN_BLOCK];
    float ks[CTXS__ATTN_BLOCK]; /* CTXS_DTYPE_Q8: the rows' scales; unset */
    float vs[CTXS__ATTN_BLOCK]; /*   for the other dtypes */
    uint32_t nb;       /* rows in k[] and v[]: 1 .. CTXS__ATTN_BLOCK */
    uint32_t done;     /* keys of the sequence before this block */
    uint32_t head_dim;
    uint32_t dtype;    /* CTXS_DTYPE_F16, BF16 or Q8 */
    float scale;
} ctxs__attn_block;

/* One query head of one query, and its softmax state between blocks. Rows
 * that share a block read a prefix of its keys each: the first
 * min(nb, n_keys - done), so that a query whose sequence is a prefix of
 * another's (the queries of a causal prefill, when the window holds them
 * all) rides along in the other's blocks with its own blocks unchanged. */
typedef struct ctxs__attn_row {
    float *out;       /* [head_dim]; the running accumulator until the end */
    const float *q;   /* [head_dim] */
    float m, l;       /* running max and sum of weights */
    uint32_t n_keys;  /* length of the row's sequence */
} ctxs__attn_row;

/* Points blk->k[] and blk->v[] at the rows of the next logical block: up to
 * CTXS__ATTN_BLOCK keys of the sequence, across runs. Blocks are counted
 * along the sequence, never per run: this is what makes a query's output
 * independent of how its keys are split. Returns the block's size, 0 at
 * the end. */
static inline uint32_t ctxs__attn_next_block(const ctxs__attn_keys *keys,
                                             ctxs__attn_cursor *c,
                                             ctxs__attn_block *blk)
{
    uint32_t nb = 0;
    blk->done = c->done;
    while (nb < CTXS__ATTN_BLOCK && c->done < keys->n_keys) {
        const uint32_t slot = keys->runs[c->run].slot + c->at;
        const size_t off = (size_t)slot * keys->slot_bytes;
        blk->k[nb] = keys->k + off;
        blk->v[nb] = keys->v + off;
        if (keys->ks) {
            blk->ks[nb] = keys->ks[slot];
            blk->vs[nb] = keys->vs[slot];
        }
        nb++;
        c->done++;
        if (++c->at == keys->runs[c->run].count) {
            c->run++;
            c->at = 0;
        }
    }
    blk->nb = nb;
    return nb;
}

/* Keys of blk that row r reads. */
static inline uint32_t ctxs__attn_row_nb(const ctxs__attn_row *r,
                                         const ctxs__attn_block *blk)
{
    uint32_t left = r->n_keys - blk->done;
    return left < blk->nb ? left : blk->nb;
}

/* One block of the online softmax for n_q (1 .. CTXS__ATTN_TILE) rows, each
 * with n_keys > blk->done: their scores against the block's keys, the
 * running max and sum rescaled once, the weighted V rows added into out
 * (which blk->done == 0 starts afresh). ctxs_attention() divides by the
 * sum after the last block, in scalar code that every ISA shares: a
 * product is correctly rounded whatever computes it. */
typedef void ctxs__attn_fn(ctxs__attn_row *rows, uint32_t n_q,
                           const ctxs__attn_block *blk);

ctxs__attn_fn ctxs__attn_portable;
#if defined(__x86_64__) || defined(__i386__)
ctxs__attn_fn ctxs__attn_avx2;
ctxs__attn_fn ctxs__attn_avx512;
#endif
#if defined(__aarch64__)
ctxs__attn_fn ctxs__attn_neon;
#endif

/* A score from the dot product of a query and a key: times the key's Q8
 * scale (q8), then times the softmax scale. Every kernel rounds these two
 * products in this order. */
static inline float ctxs__attn_score(float dot, const float *ks, uint32_t j, float scale,
                                     int q8)
{
    return q8 ? dot * ks[j] * scale : dot * scale;
}

/* The exp() every kernel uses, on x <= 0 (a score minus the running max):
 * Cephes' expf reduction and polynomial, 0 below -87 (where expf would go
 * subnormal). Written out rather than taken from libm so that the result
 * does not change with the C library, and so that the SIMD kernels can use
 * the same steps lane by lane. */
#define CTXS__EXP_MIN (-87.0f)
#define CTXS__EXP_LOG2E 1.44269504088896341f
#define CTXS__EXP_C1 0.693359375f
#define CTXS__EXP_C2 (-2.12194440e-4f)
#define CTXS__EXP_P0 1.9875691500e-4f
#define CTXS__EXP_P1 1.3981999507e-3f
#define CTXS__EXP_P2 8.3334519073e-3f
#define CTXS__EXP_P3 4.1665795894e-2f
#define CTXS__EXP_P4 1.6666665459e-1f
#define CTXS__EXP_P5 5.0000001201e-1f

/* Forces the kernel of one instruction set ("portable", "avx2", "avx512",
 * "neon"), or back to the automatic choice with NULL; ctxs_attention_get_isa()
 * then names it. In the test build only (CTXS_TEST_HOOKS): it changes what
 * every thread's next call uses (atomically; a call in flight finishes
 * with its kernel). Errors: CTXS_EINVAL (unknown, or not supported by this
 * CPU or this build). */
#ifdef CTXS_TEST_HOOKS
int ctxs__attention_force_isa(const char *name);
#endif

#endif

/* ---------------------------------------------------------------------------
 * The SIMD kernel, written once over a 16-lane float vector and instantiated
 * per instruction set: attention_x86.c includes this header twice (AVX2,
 * AVX-512), attention_arm.c once (NEON), each time after defining
 *
 *   CTXS__SIMD_ATTR      the function attribute, e.g. target("avx2,fma,f16c")
 *   CTXS__SIMD_FN        the ctxs__attn_fn to define
 *   CTXS__SIMD_TILE      most query heads per pass (by vector registers)
 *   CTXS__SIMD_CHAINS    independent accumulators (v16) a loop should keep
 *                        in flight to cover the FMA latency
 *   V(op)                the name of the ISA's helper `op` (see the x86 file
 *                        for the list: a v16 type and zero, set1, load,
 *                        loadn, store, storen, half, bf16, i8, add, mul, fma,
 *                        max, hmax, floor, pow2i, keep_ge, reduce,
 *                        reduce_chains, lane0)
 *   CTXS__SIMD_LOADN_COPY  defined where the ISA has no masked load and store:
 *                        loadn and storen are then made here, through a
 *                        16-float buffer
 *
 * The header undefines all of these at its end, ready for the next.
 * It follows ctxs__attn_portable() step by step, with fused multiply-adds;
 * see the notes at the top of attention.c on why every step is where it is.
 * The element type is a constant argument (DT) of every function below, so
 * that each dtype gets its own copy of the loops with its conversion in
 * them, and nothing else differs between dtypes.
 */
#ifdef CTXS__SIMD_FN

#define CTXS__SIMD_INLINE static inline __attribute__((always_inline)) CTXS__SIMD_ATTR

#ifdef CTXS__SIMD_LOADN_COPY
/* n < 16 elements; the rest of the lanes are zero. */
CTXS__SIMD_INLINE v16 V(loadn)(const float *p, uint32_t n)
{
    float t[16] = {0};
    memcpy(t, p, n * sizeof(float));
    return V(load)(t);
}
CTXS__SIMD_INLINE void V(storen)(float *p, v16 a, uint32_t n)
{
    float t[16];
    V(store)(t, a);
    memcpy(p, t, n * sizeof(float));
}
#endif

/* The same steps as exp_le0() in attention.c, lane by lane. */
CTXS__SIMD_INLINE v16 V(exp)(v16 x)
{
    v16 n = V(floor)(V(add)(V(mul)(x, V(set1)(CTXS__EXP_LOG2E)), V(set1)(0.5f)));
    v16 r = V(fma)(n, V(set1)(-CTXS__EXP_C1), x);
    r = V(fma)(n, V(set1)(-CTXS__EXP_C2), r);
    v16 y = V(fma)(V(set1)(CTXS__EXP_P0), r, V(set1)(CTXS__EXP_P1));
    y = V(fma)(y, r, V(set1)(CTXS__EXP_P2));
    y = V(fma)(y, r, V(set1)(CTXS__EXP_P3));
    y = V(fma)(y, r, V(set1)(CTXS__EXP_P4));
    y = V(fma)(y, r, V(set1)(CTXS__EXP_P5));
    y = V(fma)(y, V(mul)(r, r), r);
    y = V(add)(y, V(set1)(1.0f));
    /* Lanes below the cut (and NaN, -inf) are 0 whatever pow2i made of n. */
    return V(keep_ge)(x, CTXS__EXP_MIN, V(mul)(y, V(pow2i)(n)));
}

/* 16 elements of a K or V row from element d, as float. */
CTXS__SIMD_INLINE v16 V(row)(const uint8_t *r, uint32_t d, const uint32_t DT)
{
    if (DT == CTXS_DTYPE_Q8)
        return V(i8)((const int8_t *)(const void *)r + d);
    if (DT == CTXS_DTYPE_BF16)
        return V(bf16)((const uint16_t *)(const void *)(r + 2 * (size_t)d));
    return V(half)((const uint16_t *)(const void *)(r + 2 * (size_t)d));
}

/* n < 16 elements of a row from element d, the other lanes 0. Through a
 * copy: a whole vector's load could run past the row into an unmapped
 * page. */
CTXS__SIMD_INLINE v16 V(rown)(const uint8_t *r, uint32_t d, uint32_t n, const uint32_t DT)
{
    const size_t eb = DT == CTXS_DTYPE_Q8 ? 1 : 2;
    uint8_t t[32] __attribute__((aligned(16))) = {0};
    memcpy(t, r + d * eb, n * eb);
    return V(row)(t, 0, DT);
}

/* Scores of KJ keys (kr[0 .. KJ-1]) against NQ rows. KJ > 1 only gives
 * the CPU independent chains to overlap: each (key, row) has its own
 * accumulator, summed in the same order whatever KJ is. */
CTXS__SIMD_INLINE void V(scores)(float *s, size_t s_stride,
                                 const uint8_t *const *kr, const float *ks,
                                 const float *const *q, uint32_t hd, float scale,
                                 const uint32_t NQ, const uint32_t KJ, const uint32_t DT)
{
    v16 acc[CTXS__SIMD_CHAINS][CTXS__SIMD_TILE];
    for (uint32_t kj = 0; kj < KJ; kj++)
        for (uint32_t g = 0; g < NQ; g++)
            acc[kj][g] = V(zero)();
    uint32_t d = 0;
    for (; d + 16 <= hd; d += 16) {
        for (uint32_t kj = 0; kj < KJ; kj++) {
            v16 k = V(row)(kr[kj], d, DT);
            for (uint32_t g = 0; g < NQ; g++)
                acc[kj][g] = V(fma)(V(load)(q[g] + d), k, acc[kj][g]);
        }
    }
    if (d < hd) {
        /* Zeros in the missing lanes add +0 to their partial sums. */
        for (uint32_t kj = 0; kj < KJ; kj++) {
            v16 k = V(rown)(kr[kj], d, hd - d, DT);
            for (uint32_t g = 0; g < NQ; g++)
                acc[kj][g] = V(fma)(V(loadn)(q[g] + d, hd - d), k, acc[kj][g]);
        }
    }
    if (KJ * NQ == CTXS__SIMD_CHAINS) {
        /* All chains at once: the same tree per vector as reduce, with the
         * shuffles shared (see reduce_chains). */
        v16 flat[CTXS__SIMD_CHAINS];
        float sum[CTXS__SIMD_CHAINS];
        for (uint32_t kj = 0; kj < KJ; kj++)
            for (uint32_t g = 0; g < NQ; g++)
                flat[kj * NQ + g] = acc[kj][g];
        V(reduce_chains)(flat, sum);
        for (uint32_t kj = 0; kj < KJ; kj++)
            for (uint32_t g = 0; g < NQ; g++)
                s[g * s_stride + kj] =
                    ctxs__attn_score(sum[kj * NQ + g], ks, kj, scale, DT == CTXS_DTYPE_Q8);
    } else {
        for (uint32_t kj = 0; kj < KJ; kj++)
            for (uint32_t g = 0; g < NQ; g++)
                s[g * s_stride + kj] =
                    ctxs__attn_score(V(reduce)(acc[kj][g]), ks, kj, scale, DT == CTXS_DTYPE_Q8);
    }
}

/* The keys of a block that NQ rows read: every row the first `lo`, row g
 * the first nb[g], none past `hi`. */
typedef struct V(span) {
    uint32_t lo, hi, nb[CTXS__SIMD_TILE];
} V(span);

/* Adds the block's weighted V rows into CH chunks of 16 elements of NQ
 * rows' accumulators, from element d. Each element goes key by key, as in
 * the portable kernel; CH > 1 only gives the CPU independent chains. Keys
 * past a row's own are skipped, not weighted by 0: 0 * inf would be NaN. */
CTXS__SIMD_INLINE void V(vacc)(float *const *out, uint32_t d,
                               const uint8_t *const *vr, const V(span) *sp,
                               const float (*p)[CTXS__ATTN_BLOCK],
                               const float *c, int first, const uint32_t NQ,
                               const uint32_t CH, uint32_t tail, const uint32_t DT)
{
    v16 a[CTXS__SIMD_CHAINS][CTXS__SIMD_TILE];
    for (uint32_t ch = 0; ch < CH; ch++) {
        for (uint32_t g = 0; g < NQ; g++) {
            const float *o = out[g] + d + 16 * ch;
            if (first)
                a[ch][g] = V(zero)();
            else if (c[g] == 1.0f) /* x * 1 is x: skip the load's multiply */
                a[ch][g] = tail ? V(loadn)(o, tail) : V(load)(o);
            else
                a[ch][g] = V(mul)(tail ? V(loadn)(o, tail) : V(load)(o), V(set1)(c[g]));
        }
    }
    for (uint32_t j = 0; j < sp->lo; j++) {
        for (uint32_t ch = 0; ch < CH; ch++) {
            v16 v = tail ? V(rown)(vr[j], d, tail, DT) : V(row)(vr[j], d + 16 * ch, DT);
            for (uint32_t g = 0; g < NQ; g++)
                a[ch][g] = V(fma)(V(set1)(p[g][j]), v, a[ch][g]);
        }
    }
    for (uint32_t j = sp->lo; j < sp->hi; j++) {
        for (uint32_t ch = 0; ch < CH; ch++) {
            v16 v = tail ? V(rown)(vr[j], d, tail, DT) : V(row)(vr[j], d + 16 * ch, DT);
            for (uint32_t g = 0; g < NQ; g++)
                if (j < sp->nb[g])
                    a[ch][g] = V(fma)(V(set1)(p[g][j]), v, a[ch][g]);
        }
    }
    for (uint32_t ch = 0; ch < CH; ch++) {
        for (uint32_t g = 0; g < NQ; g++) {
            float *o = out[g] + d + 16 * ch;
            if (tail)
                V(storen)(o, a[ch][g], tail);
            else
                V(store)(o, a[ch][g]);
        }
    }
}

/* Row g's scores s[0 .. sp->nb[g]) become weights: the running max and
 * sum rescaled by c[g], the max taken over the same whole vectors as when
 * the row is alone in its block (padding -inf), so that not even a NaN
 * score is treated otherwise. */
CTXS__SIMD_INLINE void V(weights)(float *s, ctxs__attn_row *row, float *c,
                                  uint32_t nb, int first)
{
    const uint32_t nv = (nb + 15) & ~15u;
    for (uint32_t j = nb; j < nv; j++)
        s[j] = -INFINITY;
    /* A max is exact in any order (the padding is -inf). */
    v16 vm = V(load)(&s[0]);
    for (uint32_t j = 16; j < nv; j += 16)
        vm = V(max)(vm, V(load)(&s[j]));
    float bm = V(hmax)(vm);
    float nm = bm > row->m ? bm : row->m;
    *c = first ? 0.0f : V(lane0)(V(exp)(V(set1)(row->m - nm)));
    row->m = nm;
    row->l *= *c;
    for (uint32_t j = 0; j < nv; j += 16)
        V(store)(&s[j], V(exp)(V(add)(V(load)(&s[j]), V(set1)(-nm))));
}

CTXS__SIMD_INLINE void V(tile)(ctxs__attn_row *rows, const ctxs__attn_block *blk,
                               const uint32_t NQ, const uint32_t DT)
{
    enum { B = CTXS__ATTN_BLOCK };
    const uint32_t hd = blk->head_dim;
    const int first = blk->done == 0;
    /* Independent chains per step: more keys or chunks when fewer rows. */
    const uint32_t KJ = NQ >= CTXS__SIMD_CHAINS ? 1 : CTXS__SIMD_CHAINS / NQ;
    const uint32_t CH = KJ;
    float s[CTXS__SIMD_TILE][B] __attribute__((aligned(64)));
    float c[CTXS__SIMD_TILE];
    const float *q[CTXS__SIMD_TILE];
    float *out[CTXS__SIMD_TILE];
    V(span) sp = {blk->nb, 0, {0}};
    for (uint32_t g = 0; g < NQ; g++) {
        q[g] = rows[g].q;
        out[g] = rows[g].out;
        sp.nb[g] = ctxs__attn_row_nb(&rows[g], blk);
        sp.lo = sp.nb[g] < sp.lo ? sp.nb[g] : sp.lo;
        sp.hi = sp.nb[g] > sp.hi ? sp.nb[g] : sp.hi;
    }

    /* Scores of keys past a row's own are computed with the others' and
     * then dropped: V(weights) pads over them. */
    uint32_t j = 0;
    for (; j + KJ <= sp.hi; j += KJ)
        V(scores)(&s[0][j], B, blk->k + j, blk->ks + j, q, hd, blk->scale, NQ, KJ, DT);
    for (; j < sp.hi; j++)
        V(scores)(&s[0][j], B, blk->k + j, blk->ks + j, q, hd, blk->scale, NQ, 1, DT);
    for (uint32_t g = 0; g < NQ; g++)
        V(weights)(s[g], &rows[g], &c[g], sp.nb[g], first);
    /* The sums of weights stay scalar and in key order, as in the portable
     * kernel; rows inner so that their chains overlap. */
    for (j = 0; j < sp.lo; j++)
        for (uint32_t g = 0; g < NQ; g++)
            rows[g].l += s[g][j];
    for (; j < sp.hi; j++)
        for (uint32_t g = 0; g < NQ; g++)
            if (j < sp.nb[g])
                rows[g].l += s[g][j];
    /* Q8: V row j is added with the weight times its scale. */
    if (DT == CTXS_DTYPE_Q8)
        for (uint32_t g = 0; g < NQ; g++)
            for (j = 0; j < sp.nb[g]; j++)
                s[g][j] *= blk->vs[j];

    const float(*p)[B] = (const float(*)[B])s;
    uint32_t d = 0;
    for (; d + 16 * CH <= hd; d += 16 * CH)
        V(vacc)(out, d, blk->v, &sp, p, c, first, NQ, CH, 0, DT);
    for (; d + 16 <= hd; d += 16)
        V(vacc)(out, d, blk->v, &sp, p, c, first, NQ, 1, 0, DT);
    if (d < hd)
        V(vacc)(out, d, blk->v, &sp, p, c, first, NQ, 1, hd - d, DT);
}

CTXS__SIMD_INLINE void V(tiles)(ctxs__attn_row *rows, uint32_t n_q,
                                const ctxs__attn_block *blk, const uint32_t DT)
{
    /* Tiles of fixed sizes, so that each is compiled with its loops over
     * rows unrolled and its accumulators in registers. */
    while (n_q > 0) {
        uint32_t t;
        if (n_q >= 8 && CTXS__SIMD_TILE >= 8) {
            t = 8;
            V(tile)(rows, blk, CTXS__SIMD_TILE >= 8 ? 8 : 1, DT);
        } else if (n_q >= 4) {
            t = 4;
            V(tile)(rows, blk, 4, DT);
        } else if (n_q == 3) {
            t = 3;
            V(tile)(rows, blk, 3, DT);
        } else if (n_q == 2) {
            t = 2;
            V(tile)(rows, blk, 2, DT);
        } else {
            t = 1;
            V(tile)(rows, blk, 1, DT);
        }
        rows += t;
        n_q -= t;
    }
}

CTXS__SIMD_ATTR void CTXS__SIMD_FN(ctxs__attn_row *rows, uint32_t n_q,
                                   const ctxs__attn_block *blk)
{
    /* One instantiation per dtype, the dtype a constant inside each. */
    switch (blk->dtype) {
    case CTXS_DTYPE_Q8:
        V(tiles)(rows, n_q, blk, CTXS_DTYPE_Q8);
        break;
    case CTXS_DTYPE_BF16:
        V(tiles)(rows, n_q, blk, CTXS_DTYPE_BF16);
        break;
    default:
        V(tiles)(rows, n_q, blk, CTXS_DTYPE_F16);
        break;
    }
}

#undef CTXS__SIMD_INLINE
#undef CTXS__SIMD_LOADN_COPY
#undef v16
#undef V
#undef CTXS__SIMD_ATTR
#undef CTXS__SIMD_FN
#undef CTXS__SIMD_TILE
#undef CTXS__SIMD_CHAINS
#endif /* CTXS__SIMD_FN */
