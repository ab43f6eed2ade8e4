/*
 * The CPU attention kernel's private parts: what ctxs_attention() hands to
 * the per-ISA kernels (attention.c, attention_x86.c, attention_arm.c), and
 * a hook for tests.
 */
#ifndef CTXS_GPU_ATTENTION_H
#define CTXS_GPU_ATTENTION_H

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

/* The keys one query reads from one KV head: runs of consecutive slots, in
 * position order (a plan span cut to the query's sinks and window gives at
 * most two runs). */
typedef struct ctxs__attn_keys {
    const uint8_t *k;    /* slot 0 of the head's K run */
    const uint8_t *v;    /* slot 0 of the head's V run */
    size_t slot_bytes;   /* head_dim * 2 */
    uint32_t head_dim;
    uint32_t n_runs;
    uint32_t n_keys;     /* sum of the runs' counts, at least 1 */
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

/* Points kr[] and vr[] at the rows of the next logical block: up to
 * CTXS__ATTN_BLOCK keys of the sequence, across runs. Blocks are counted
 * along the sequence, never per run: this is what makes a query's output
 * independent of how its keys are split. Returns the block's size, 0 at
 * the end. */
static inline uint32_t ctxs__attn_next_block(const ctxs__attn_keys *keys,
                                             ctxs__attn_cursor *c,
                                             const uint16_t **kr,
                                             const uint16_t **vr)
{
    uint32_t nb = 0;
    while (nb < CTXS__ATTN_BLOCK && c->done < keys->n_keys) {
        size_t off = (size_t)(keys->runs[c->run].slot + c->at) * keys->slot_bytes;
        kr[nb] = (const uint16_t *)(const void *)(keys->k + off);
        vr[nb] = (const uint16_t *)(const void *)(keys->v + off);
        nb++;
        c->done++;
        if (++c->at == keys->runs[c->run].count) {
            c->run++;
            c->at = 0;
        }
    }
    return nb;
}

/* Attention of n_q (1 .. CTXS__ATTN_TILE) query heads that share one KV
 * head: q and out are [n_q][head_dim]. out is also the running
 * accumulator, so that no per-call scratch grows with head_dim. */
typedef void ctxs__attn_fn(float *out, const float *q, uint32_t n_q,
                           float scale, const ctxs__attn_keys *keys);

ctxs__attn_fn ctxs__attn_portable;
#if defined(__x86_64__) || defined(__i386__)
ctxs__attn_fn ctxs__attn_avx2;
ctxs__attn_fn ctxs__attn_avx512;
#endif
#if defined(__aarch64__)
ctxs__attn_fn ctxs__attn_neon;
#endif

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
 * "neon"), or back to the automatic choice with NULL; ctxs_attention_isa()
 * then names it. For tests and benchmarks: it changes what every thread's
 * next call uses (atomically; a call in flight finishes with its kernel).
 * Errors: CTXS_EINVAL (unknown, or not supported by this CPU or this
 * build). */
int ctxs__attention_force_isa(const char *name);

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
 *                        loadn, store, storen, half, halfn, add, mul, fma,
 *                        max, hmax, floor, pow2i, keep_ge, reduce,
 *                        reduce_chains, lane0)
 *
 * It follows ctxs__attn_portable() step by step, with fused multiply-adds;
 * see the notes at the top of attention.c on why every step is where it is.
 */
#ifdef CTXS__SIMD_FN

#define CTXS__SIMD_INLINE static inline __attribute__((always_inline)) CTXS__SIMD_ATTR

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

/* Scores of KJ keys (kr[0 .. KJ-1]) against NQ query heads. KJ > 1 only
 * gives the CPU independent chains to overlap: each (key, head) has its own
 * accumulator, summed in the same order whatever KJ is. */
CTXS__SIMD_INLINE void V(scores)(float *s, size_t s_stride,
                                 const uint16_t *const *kr, const float *q,
                                 uint32_t hd, float scale, const uint32_t NQ,
                                 const uint32_t KJ)
{
    v16 acc[CTXS__SIMD_CHAINS][CTXS__SIMD_TILE];
    for (uint32_t kj = 0; kj < KJ; kj++)
        for (uint32_t g = 0; g < NQ; g++)
            acc[kj][g] = V(zero)();
    uint32_t d = 0;
    for (; d + 16 <= hd; d += 16) {
        for (uint32_t kj = 0; kj < KJ; kj++) {
            v16 k = V(half)(kr[kj] + d);
            for (uint32_t g = 0; g < NQ; g++)
                acc[kj][g] = V(fma)(V(load)(q + (size_t)g * hd + d), k, acc[kj][g]);
        }
    }
    if (d < hd) {
        /* Zeros in the missing lanes add +0 to their partial sums. */
        for (uint32_t kj = 0; kj < KJ; kj++) {
            v16 k = V(halfn)(kr[kj] + d, hd - d);
            for (uint32_t g = 0; g < NQ; g++)
                acc[kj][g] = V(fma)(V(loadn)(q + (size_t)g * hd + d, hd - d), k, acc[kj][g]);
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
                s[g * s_stride + kj] = sum[kj * NQ + g] * scale;
    } else {
        for (uint32_t kj = 0; kj < KJ; kj++)
            for (uint32_t g = 0; g < NQ; g++)
                s[g * s_stride + kj] = V(reduce)(acc[kj][g]) * scale;
    }
}

/* Adds the block's weighted V rows into CH chunks of 16 elements of NQ
 * heads' accumulators, from element d. Each element goes key by key, as
 * in the portable kernel; CH > 1 only gives the CPU independent chains. */
CTXS__SIMD_INLINE void V(vacc)(float *out, uint32_t hd, uint32_t d,
                               const uint16_t *const *vr, uint32_t nb,
                               const float (*p)[CTXS__ATTN_BLOCK],
                               const float *c, int first, const uint32_t NQ,
                               const uint32_t CH, uint32_t tail)
{
    v16 a[CTXS__SIMD_CHAINS][CTXS__SIMD_TILE];
    for (uint32_t ch = 0; ch < CH; ch++) {
        for (uint32_t g = 0; g < NQ; g++) {
            const float *o = out + (size_t)g * hd + d + 16 * ch;
            if (first)
                a[ch][g] = V(zero)();
            else if (c[g] == 1.0f) /* x * 1 is x: skip the load's multiply */
                a[ch][g] = tail ? V(loadn)(o, tail) : V(load)(o);
            else
                a[ch][g] = V(mul)(tail ? V(loadn)(o, tail) : V(load)(o), V(set1)(c[g]));
        }
    }
    for (uint32_t j = 0; j < nb; j++) {
        for (uint32_t ch = 0; ch < CH; ch++) {
            v16 v = tail ? V(halfn)(vr[j] + d, tail) : V(half)(vr[j] + d + 16 * ch);
            for (uint32_t g = 0; g < NQ; g++)
                a[ch][g] = V(fma)(V(set1)(p[g][j]), v, a[ch][g]);
        }
    }
    for (uint32_t ch = 0; ch < CH; ch++) {
        for (uint32_t g = 0; g < NQ; g++) {
            float *o = out + (size_t)g * hd + d + 16 * ch;
            if (tail)
                V(storen)(o, a[ch][g], tail);
            else
                V(store)(o, a[ch][g]);
        }
    }
}

CTXS__SIMD_INLINE void V(tile)(float *out, const float *q, float scale,
                               const ctxs__attn_keys *keys, const uint32_t NQ)
{
    enum { B = CTXS__ATTN_BLOCK };
    const uint32_t hd = keys->head_dim;
    /* Independent chains per step: more keys or chunks when fewer heads. */
    const uint32_t KJ = NQ >= CTXS__SIMD_CHAINS ? 1 : CTXS__SIMD_CHAINS / NQ;
    const uint32_t CH = KJ;
    float s[CTXS__SIMD_TILE][B] __attribute__((aligned(64)));
    float m[CTXS__SIMD_TILE], l[CTXS__SIMD_TILE], c[CTXS__SIMD_TILE];
    const uint16_t *kr[B], *vr[B];
    ctxs__attn_cursor cur = { 0 };

    for (uint32_t g = 0; g < NQ; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    /* done: keys of the blocks before this one. */
    for (uint32_t done = 0, nb; (nb = ctxs__attn_next_block(keys, &cur, kr, vr)); done += nb) {

        uint32_t j = 0;
        for (; j + KJ <= nb; j += KJ)
            V(scores)(&s[0][j], B, kr + j, q, hd, scale, NQ, KJ);
        for (; j < nb; j++)
            V(scores)(&s[0][j], B, kr + j, q, hd, scale, NQ, 1);
        /* Pad to whole vectors with keys that weigh exp(-inf) = 0. */
        const uint32_t nv = (nb + 15) & ~15u;
        for (uint32_t g = 0; g < NQ; g++)
            for (j = nb; j < nv; j++)
                s[g][j] = -INFINITY;

        for (uint32_t g = 0; g < NQ; g++) {
            /* A max is exact in any order (the padding is -inf). */
            v16 vm = V(load)(&s[g][0]);
            for (j = 16; j < nv; j += 16)
                vm = V(max)(vm, V(load)(&s[g][j]));
            float bm = V(hmax)(vm);
            float nm = bm > m[g] ? bm : m[g];
            c[g] = done ? V(lane0)(V(exp)(V(set1)(m[g] - nm))) : 0.0f;
            m[g] = nm;
            l[g] *= c[g];
            for (j = 0; j < nv; j += 16)
                V(store)(&s[g][j], V(exp)(V(add)(V(load)(&s[g][j]), V(set1)(-nm))));
        }
        /* The sums of weights stay scalar and in key order, as in the
         * portable kernel; heads inner so that their chains overlap. */
        for (j = 0; j < nb; j++)
            for (uint32_t g = 0; g < NQ; g++)
                l[g] += s[g][j];

        uint32_t d = 0;
        for (; d + 16 * CH <= hd; d += 16 * CH)
            V(vacc)(out, hd, d, vr, nb, (const float(*)[B])s, c, done == 0, NQ, CH, 0);
        for (; d + 16 <= hd; d += 16)
            V(vacc)(out, hd, d, vr, nb, (const float(*)[B])s, c, done == 0, NQ, 1, 0);
        if (d < hd)
            V(vacc)(out, hd, d, vr, nb, (const float(*)[B])s, c, done == 0, NQ, 1, hd - d);
    }

    for (uint32_t g = 0; g < NQ; g++) {
        const float inv = 1.0f / l[g];
        float *o = out + (size_t)g * hd;
        uint32_t d = 0;
        for (; d + 16 <= hd; d += 16)
            V(store)(o + d, V(mul)(V(load)(o + d), V(set1)(inv)));
        if (d < hd)
            V(storen)(o + d, V(mul)(V(loadn)(o + d, hd - d), V(set1)(inv)), hd - d);
    }
}

CTXS__SIMD_ATTR void CTXS__SIMD_FN(float *out, const float *q, uint32_t n_q,
                                   float scale, const ctxs__attn_keys *keys)
{
    /* Tiles of fixed sizes, so that each is compiled with its loops over
     * heads unrolled and its accumulators in registers. */
    const uint32_t hd = keys->head_dim;
    while (n_q > 0) {
        uint32_t t;
        if (n_q >= 8 && CTXS__SIMD_TILE >= 8) {
            t = 8;
            V(tile)(out, q, scale, keys, CTXS__SIMD_TILE >= 8 ? 8 : 1);
        } else if (n_q >= 4) {
            t = 4;
            V(tile)(out, q, scale, keys, 4);
        } else if (n_q == 3) {
            t = 3;
            V(tile)(out, q, scale, keys, 3);
        } else if (n_q == 2) {
            t = 2;
            V(tile)(out, q, scale, keys, 2);
        } else {
            t = 1;
            V(tile)(out, q, scale, keys, 1);
        }
        out += (size_t)t * hd;
        q += (size_t)t * hd;
        n_q -= t;
    }
}

#undef CTXS__SIMD_INLINE
#endif /* CTXS__SIMD_FN */
