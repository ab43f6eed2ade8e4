/*
 * Decode attention over a ctxstore KV region, with the semantics of
 * ctxs_attention() (include/ctxstore.h, src/cpu/attention.c).
 *
 * One threadgroup per (query head, query). Its threads walk the keys the
 * query reads as one sequence in position order, one block of nt keys at a
 * time (nt = threads per threadgroup), keeping a flash-style running max m
 * and sum l:
 *
 *   scores   each SIMD-group takes keys sg, sg + n_sg, ... of the block; its
 *            lanes split the dot product over head_dim and simd_sum it;
 *   softmax  block max, then m' = max(m, block max), c = exp(m - m'),
 *            weights exp(s - m'), l = l * c + their sum;
 *   values   thread t owns output elements t, t + nt, ...: acc = acc * c +
 *            sum of weight x V, key by key.
 *
 * K and V are read as the session stores them (ctxs_dtype in ctxstore.h),
 * one kernel per dtype around one body: fp16, bf16 (the high half of a
 * float), or Q8, int8 values with a float scale per (token, head) of K and
 * of V in a buffer of their own. A Q8 key's score is its K scale times the
 * dot product with its int8 values; its weight, once the block's sum has
 * been taken, is multiplied by its V scale before the V rows are added.
 *
 * Threadgroup memory, set by the host (metal.m):
 *   [[threadgroup(0)]] float: acc[head_dim], w[nt], red[2 * n_sg]
 *   [[threadgroup(1)]] uint:  slot[nt]
 *
 * No infinity is relied on (the first block sets m outright), so the
 * kernel is correct with fast math too; the host turns fast math off all
 * the same, for exp()'s precision.
 *
 * The host compiles this file at run time from a copy embedded in the
 * library (newLibraryWithSource), so it includes nothing but metal_stdlib.
 */
#include <metal_stdlib>
using namespace metal;

#define MAX_SPANS 4              /* CTXS_ATTN_MAX_SPANS */
#define MAX_RUNS (2 * MAX_SPANS) /* each span cut to sinks and recent */

/* ctxs_dtype */
#define DTYPE_F16 1u
#define DTYPE_BF16 2u
#define DTYPE_Q8 3u

/* The argument block; metal.m declares the same struct, field for field
 * (152 bytes, no padding). Byte offsets are into the KV buffer; scale
 * offsets count floats in the scale buffer (Q8 only, else 0). */
struct ctxs_params {
    ulong k_off;       /* K of (layer, KV head 0): layer * layer_stride */
    ulong kv_stride;   /* K to V of a layer */
    ulong head_stride; /* KV head h to h + 1 */
    ulong q_pos;       /* position of query 0 */
    ulong n_sink;
    ulong window;
    ulong span_pos[MAX_SPANS];
    ulong k_scale_off; /* scales of (layer, K, KV head 0): layer*2*n_kv*capacity */
    ulong v_scale_off; /* of (layer, V, KV head 0): k_scale_off + n_kv*capacity */
    uint span_slot[MAX_SPANS];
    uint span_count[MAX_SPANS];
    uint n_spans;
    uint head_dim;
    uint n_heads;      /* query heads */
    uint group;        /* query heads per KV head */
    float scale;
    uint capacity;     /* Q8: scales from KV head h to h + 1; else 0 */
};

/* Element i of a K or V run, as a float: fp16 exactly, bf16 by a shift,
 * Q8 its int8 value (the scale is the caller's). The only place where the
 * dtype of the elements matters. */
template <uint DT> inline float elem(device const uchar *run, ulong i);

template <> inline float elem<DTYPE_F16>(device const uchar *run, ulong i)
{
    return float(((device const half *)run)[i]);
}

template <> inline float elem<DTYPE_BF16>(device const uchar *run, ulong i)
{
    return as_type<float>(uint(((device const ushort *)run)[i]) << 16);
}

template <> inline float elem<DTYPE_Q8>(device const uchar *run, ulong i)
{
    return float(((device const int8_t *)run)[i]);
}

/* The kernel, for elements of dtype DT; scales is NULL but for Q8. */
template <uint DT>
inline void attention(device const uchar *kv, device const float *scales,
                      device const float *q, device float *out,
                      constant ctxs_params &p, threadgroup float *shm,
                      threadgroup uint *slot, uint2 tg, uint tid, uint nt,
                      uint sg, uint n_sg, uint lane, uint simd_w)
{
    const uint h = tg.x;
    const uint i = tg.y;
    const uint hd = p.head_dim;
    const ulong pos = p.q_pos + i;

    /* The runs of slots this query reads, in position order: each span cut
     * to [0, pos] and to the sinks plus the last `window` positions, as
     * query_runs() in attention.c. Every thread computes the same. */
    const ulong recent = pos + 1 > p.window ? pos + 1 - p.window : 0;
    const ulong sink_hi = p.n_sink < pos + 1 ? p.n_sink : pos + 1;
    ulong lo[2], hi[2];
    uint n_iv;
    if (recent <= sink_hi) {
        lo[0] = 0;
        hi[0] = pos + 1;
        n_iv = 1;
    } else {
        lo[0] = 0;
        hi[0] = sink_hi;
        lo[1] = recent;
        hi[1] = pos + 1;
        n_iv = 2;
    }
    uint run_slot[MAX_RUNS], run_count[MAX_RUNS];
    uint n_runs = 0, n_keys = 0;
    for (uint s = 0; s < p.n_spans; s++) {
        const ulong sp = p.span_pos[s], se = sp + p.span_count[s];
        for (uint v = 0; v < n_iv; v++) {
            const ulong a = sp > lo[v] ? sp : lo[v];
            const ulong b = se < hi[v] ? se : hi[v];
            if (a >= b)
                continue;
            run_slot[n_runs] = p.span_slot[s] + uint(a - sp);
            run_count[n_runs] = uint(b - a);
            n_keys += uint(b - a);
            n_runs++;
        }
    }

    device float *o = out + (ulong(i) * p.n_heads + h) * hd;
    if (n_keys == 0) {
        /* Only a plan built by hand leaves a query nothing to read: zeros,
         * as the CPU kernel gives. */
        for (uint d = tid; d < hd; d += nt)
            o[d] = 0.0f;
        return;
    }

    const uint kvh = h / p.group;
    const ulong head = p.k_off + ulong(kvh) * p.head_stride;
    device const uchar *K = kv + head;
    device const uchar *V = kv + head + p.kv_stride;
    device const float *qh = q + (ulong(i) * p.n_heads + h) * hd;
    /* Q8: the scales of this KV head's K and V runs. */
    device const float *ks = scales, *vs = scales;
    if (DT == DTYPE_Q8) {
        ks = scales + p.k_scale_off + ulong(kvh) * p.capacity;
        vs = scales + p.v_scale_off + ulong(kvh) * p.capacity;
    }

    threadgroup float *acc = shm;    /* [hd] */
    threadgroup float *w = acc + hd; /* [nt] scores, then weights */
    threadgroup float *red = w + nt; /* [2 * n_sg] block max, block sum */

    for (uint d = tid; d < hd; d += nt)
        acc[d] = 0.0f;
    float m = 0.0f, l = 0.0f;
    /* Lanes of this SIMD-group: the last one is partial when nt is not a
     * multiple of the SIMD width (the host avoids it; this stays right). */
    const uint lanes = min(simd_w, nt - sg * simd_w);

    for (uint base = 0; base < n_keys; base += nt) {
        const uint nb = min(nt, n_keys - base);

        for (uint j = sg; j < nb; j += n_sg) {
            /* Uniform across the SIMD-group, so simd_sum sees every lane. */
            uint k = base + j, r = 0;
            while (k >= run_count[r]) {
                k -= run_count[r];
                r++;
            }
            const uint s = run_slot[r] + k;
            const ulong kr = ulong(s) * hd;
            float dot = 0.0f;
            for (uint d = lane; d < hd; d += lanes)
                dot = fma(qh[d], elem<DT>(K, kr + d), dot);
            dot = simd_sum(dot);
            if (lane == 0) {
                w[j] = (DT == DTYPE_Q8 ? dot * ks[s] : dot) * p.scale;
                slot[j] = s;
            }
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);

        /* Threads past the block stand in with key 0's score: a max is
         * not changed by a repeat. */
        const float x = w[tid < nb ? tid : 0];
        float bm = simd_max(x);
        if (lane == 0)
            red[sg] = bm;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        bm = red[0];
        for (uint g = 1; g < n_sg; g++)
            bm = max(bm, red[g]);
        const float nm = base ? max(m, bm) : bm;
        const float c = base ? exp(m - nm) : 0.0f; /* rescales the past */
        m = nm;
        const float e = tid < nb ? exp(x - nm) : 0.0f;
        /* Every thread has read its score above (before the barrier), and
         * w[tid] is this thread's alone until the next one. A Q8 key's V
         * scale goes into its weight here, once, and not into the sum. */
        if (tid < nb)
            w[tid] = DT == DTYPE_Q8 ? e * vs[slot[tid]] : e;
        const float bs = simd_sum(e);
        if (lane == 0)
            red[n_sg + sg] = bs;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        float sum = 0.0f;
        for (uint g = 0; g < n_sg; g++)
            sum += red[n_sg + g];
        l = l * c + sum;

        for (uint d = tid; d < hd; d += nt) {
            float a = acc[d] * c;
            for (uint j = 0; j < nb; j++)
                a = fma(w[j], elem<DT>(V, ulong(slot[j]) * hd + d), a);
            acc[d] = a;
        }
        /* w, slot and red are written again by the next block. */
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }

    /* l >= 1: the block that set the max weighs exp(0) for that key. */
    const float inv = 1.0f / l;
    for (uint d = tid; d < hd; d += nt)
        o[d] = acc[d] * inv;
}

/* One kernel per dtype; metal.m picks the session's by name. */
kernel void ctxs_attention_f16(
    device const uchar *kv         [[buffer(0)]],
    device const float *q          [[buffer(1)]],
    device float *out              [[buffer(2)]],
    constant ctxs_params &p        [[buffer(3)]],
    threadgroup float *shm         [[threadgroup(0)]],
    threadgroup uint *slot         [[threadgroup(1)]],
    uint2 tg                       [[threadgroup_position_in_grid]],
    uint tid                       [[thread_index_in_threadgroup]],
    uint nt                        [[threads_per_threadgroup]],
    uint sg                        [[simdgroup_index_in_threadgroup]],
    uint n_sg                      [[simdgroups_per_threadgroup]],
    uint lane                      [[thread_index_in_simdgroup]],
    uint simd_w                    [[threads_per_simdgroup]])
{
    attention<DTYPE_F16>(kv, nullptr, q, out, p, shm, slot, tg, tid, nt, sg,
                         n_sg, lane, simd_w);
}

kernel void ctxs_attention_bf16(
    device const uchar *kv         [[buffer(0)]],
    device const float *q          [[buffer(1)]],
    device float *out              [[buffer(2)]],
    constant ctxs_params &p        [[buffer(3)]],
    threadgroup float *shm         [[threadgroup(0)]],
    threadgroup uint *slot         [[threadgroup(1)]],
    uint2 tg                       [[threadgroup_position_in_grid]],
    uint tid                       [[thread_index_in_threadgroup]],
    uint nt                        [[threads_per_threadgroup]],
    uint sg                        [[simdgroup_index_in_threadgroup]],
    uint n_sg                      [[simdgroups_per_threadgroup]],
    uint lane                      [[thread_index_in_simdgroup]],
    uint simd_w                    [[threads_per_simdgroup]])
{
    attention<DTYPE_BF16>(kv, nullptr, q, out, p, shm, slot, tg, tid, nt, sg,
                          n_sg, lane, simd_w);
}

kernel void ctxs_attention_q8(
    device const uchar *kv         [[buffer(0)]],
    device const float *q          [[buffer(1)]],
    device float *out              [[buffer(2)]],
    constant ctxs_params &p        [[buffer(3)]],
    device const float *scales     [[buffer(4)]],
    threadgroup float *shm         [[threadgroup(0)]],
    threadgroup uint *slot         [[threadgroup(1)]],
    uint2 tg                       [[threadgroup_position_in_grid]],
    uint tid                       [[thread_index_in_threadgroup]],
    uint nt                        [[threads_per_threadgroup]],
    uint sg                        [[simdgroup_index_in_threadgroup]],
    uint n_sg                      [[simdgroups_per_threadgroup]],
    uint lane                      [[thread_index_in_simdgroup]],
    uint simd_w                    [[threads_per_simdgroup]])
{
    attention<DTYPE_Q8>(kv, scales, q, out, p, shm, slot, tg, tid, nt, sg,
                        n_sg, lane, simd_w);
}
