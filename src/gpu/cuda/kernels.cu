/*
 * The CUDA attention kernels: split-K "flash decoding" over the plan's keys,
 * fp16, bf16 or Q8 K/V in, float32 arithmetic.
 *
 * Work. A block owns one KV head g and up to 8 (query, query head) pairs of
 * g's GQA group, one per warp (pairs_per_block), and walks the keys those
 * queries read in tiles of 32 positions: the tile's K and V rows are staged
 * in shared memory once for all the block's warps, then each warp scores its
 * query against the tile (a lane per key), updates its running max and sum
 * (online softmax, in base 2: q is prescaled by scale * log2(e)) and
 * accumulates the weighted V rows (a lane per 2, 4 or 8 elements). The next
 * tile's global loads are issued into registers before the current tile is
 * computed, so that memory and arithmetic overlap within a block.
 *
 * Determinism. Tiles (32) and chunks (128) are aligned on positions, not on
 * the plan's keys, and a query skips the keys it does not read (masked, or
 * not in the plan) exactly: a tile without one is not touched, a chunk
 * without one contributes nothing. Each chunk's partial result (max, sum,
 * weighted V) starts from nothing, and the partials are folded in position
 * order by fold(), the same function, with the same rounding (explicit _rn
 * intrinsics, so no contraction can differ), whether the block folds them
 * as it goes (enough queries to fill the device: one block per pair tile)
 * or one block per chunk writes them out and merge_kernel folds them (a
 * decode: split-K). So a query's bits depend only on the keys it reads and
 * their positions: not on n, the plan's spans, the split, or the block it
 * shares.
 *
 * Every thread of a block runs the same tile loop (the tile choice is the
 * same ballot in every warp), so the __syncthreads() are uniform; warps
 * without a pair only help to load.
 *
 * Element types. The kernel is one template over the session's dtype (DT):
 * tiles are staged in shared memory as the bytes they are in the session,
 * 8 elements to a piece (16 bytes of fp16 or bf16, 8 of Q8), and widened to
 * float where they are used, by widen() alone: fp16 exactly by the
 * hardware, bf16 by a shift, Q8's int8 exactly. A Q8 key's score is its
 * scale times the dot product with its int8 values, and a Q8 value row is
 * weighted by p times its scale: the scales of a tile's rows are staged
 * beside the rows (see ctxs_dtype in ctxstore.h for what they mean).
 */
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

#include "cuda_internal.h"

namespace {

constexpr unsigned FULL = 0xffffffffu;
constexpr uint32_t CHUNK = CTXS__CUDA_CHUNK;
constexpr uint32_t TILE = CTXS__CUDA_TILE;
constexpr uint32_t THREADS = CTXS__CUDA_THREADS;
constexpr uint32_t WARPS = CTXS__CUDA_WARPS;
constexpr uint32_t TILES_PER_CHUNK = CHUNK / TILE;
constexpr uint32_t MERGE_BATCH = 8;
static_assert(TILE == 32, "a lane per key of a tile");
static_assert(CHUNK % TILE == 0, "chunks are whole tiles");

/* Bytes of one element of a session dtype. */
__host__ __device__ constexpr uint32_t elem_bytes(uint32_t dt)
{
    return dt == CTXS_DTYPE_Q8 ? 1 : 2;
}

/* The unit of staging: 8 elements. */
template <uint32_t DT>
using piece_t = typename std::conditional<elem_bytes(DT) == 2, uint4, uint2>::type;

/* A block's shared memory, in bytes: the tile's K rows (kp apart), its V
 * rows (vp apart), the warps' prescaled queries ([WARPS][dim_pad] floats),
 * and for Q8 the scales of the tile's K rows, then V rows ([2][TILE]
 * floats). Every part starts 16-byte aligned. */
struct smem_layout {
    uint32_t kp, vp;
    uint32_t vs, qs, ss, total; /* offsets of V, queries, scales; the size */
};

__host__ __device__ inline smem_layout smem_of(uint32_t dim_pad, uint32_t dt)
{
    const uint32_t eb = elem_bytes(dt);
    smem_layout m;
    /* Lane j reads K row j a piece (8 * eb bytes) at a time; the lanes that
     * share a shared-memory wavefront (8 of them for 16-byte loads, 16 for
     * 8-byte ones) then start on distinct banks when the pitch is an odd
     * number of pieces. */
    m.kp = dim_pad * eb + ((dim_pad / 8) % 2 == 0 ? 8 * eb : 0);
    m.vp = dim_pad * eb;
    m.vs = TILE * m.kp;
    m.qs = m.vs + TILE * m.vp;
    m.ss = m.qs + WARPS * dim_pad * (uint32_t)sizeof(float);
    m.total = m.ss + (dt == CTXS_DTYPE_Q8 ? 2 * TILE * (uint32_t)sizeof(float) : 0);
    return m;
}

__device__ __forceinline__ float neg_inf()
{
    return __int_as_float(0xff800000);
}

/* The slot holding position kp, or -1 when the plan does not hold it. */
__device__ __forceinline__ int64_t plan_slot(const ctxs__cuda_attn &a, uint64_t kp)
{
    int64_t slot = -1;
#pragma unroll
    for (uint32_t i = 0; i < CTXS_ATTN_MAX_SPANS; i++)
        if (i < a.n_spans && kp >= a.span_pos[i] && kp - a.span_pos[i] < a.span_count[i])
            slot = (int64_t)a.span_slot[i] + (int64_t)(kp - a.span_pos[i]);
    return slot;
}

/* The chunk number of entry ci of the chunk list. */
__device__ __forceinline__ uint64_t chunk_number(const ctxs__cuda_attn &a, uint32_t ci)
{
    uint64_t c = a.range_first[0] + (ci - a.range_start[0]);
#pragma unroll
    for (uint32_t r = 1; r < CTXS_ATTN_MAX_SPANS; r++)
        if (r < a.n_ranges && ci >= a.range_start[r])
            c = a.range_first[r] + (ci - a.range_start[r]);
    return c;
}

struct tile_at {
    uint32_t ci;   /* entry of the chunk list */
    uint32_t t;    /* tile within the chunk */
    uint64_t pos;  /* position of the tile's row 0 */
    uint32_t rows; /* rows some query of the block reads (bit j: pos + j) */
    bool ok;
};

/* The first tile from (ci, t) on, before chunk list entry ci_end, that
 * holds a key one of the block's queries (positions p_lo .. p_hi) reads:
 * positions up to p_hi that are sinks or at least win_lo = p_lo + 1 -
 * window, and that the plan holds. Every thread of the block computes the
 * same answer. */
__device__ tile_at seek(const ctxs__cuda_attn &a, uint32_t ci, uint32_t t, uint32_t ci_end,
                        uint64_t p_hi, uint64_t win_lo, uint32_t lane)
{
    for (; ci < ci_end; ci++, t = 0) {
        const uint64_t c0 = chunk_number(a, ci) * CHUNK;
        if (c0 > p_hi)
            break; /* chunks ascend: none after it is read either */
        if (c0 >= a.n_sink && c0 + CHUNK <= win_lo)
            continue; /* wholly before every query's window */
        for (; t < TILES_PER_CHUNK; t++) {
            const uint64_t t0 = c0 + (uint64_t)t * TILE, kp = t0 + lane;
            const bool need = kp <= p_hi && (kp < a.n_sink || kp >= win_lo) &&
                              plan_slot(a, kp) >= 0;
            const uint32_t rows = __ballot_sync(FULL, need);
            if (rows)
                return tile_at{ci, t, t0, rows, true};
        }
    }
    return tile_at{0, 0, 0, 0, false};
}

/* Q8: the scale of row `row` of the tile's K (kind 0) or V (kind 1) run
 * of KV head g; 0 for a row no query of the block reads. */
__device__ __forceinline__ float scale_of(const ctxs__cuda_attn &a, const tile_at &tl,
                                          uint32_t g, uint32_t kind, uint32_t row)
{
    if (!((tl.rows >> row) & 1u))
        return 0.0f;
    const uint64_t slot = (uint64_t)plan_slot(a, tl.pos + row);
    return (kind ? a.v_scale : a.k_scale)[(size_t)g * a.capacity + slot];
}

/* Staging of one tile's K and V rows: pieces of 8 elements, piece i of a
 * thread is tid + i * THREADS over [K rows][V rows] x (dim_pad / 8); with
 * Q8, thread tid < 2 * TILE also takes the scale of row tid % TILE of K
 * (tid < TILE) or V. */
template <uint32_t DT, int DPL> struct stage {
    piece_t<DT> r[DPL];
    float scale;
};

/* Calls f(i, kind, row, col) for each of thread tid's DPL pieces that the
 * tile holds: its i-th, of K (kind 0) or V (1), row of the tile, col-th
 * piece of 8 elements. stage_load() and stage_store() walk the same pieces,
 * so that each thread stores the registers it loaded. */
template <int DPL, typename F>
__device__ __forceinline__ void each_piece(const ctxs__cuda_attn &a, const tile_at &tl,
                                           uint32_t tid, F f)
{
    const uint32_t per_row = a.dim_pad / 8, per_kind = TILE * per_row;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        const uint32_t pc = tid + (uint32_t)i * THREADS;
        if (pc >= 2 * per_kind)
            break;
        const uint32_t kind = pc >= per_kind, rem = pc - kind * per_kind;
        const uint32_t row = rem / per_row, col = rem % per_row;
        if ((tl.rows >> row) & 1u)
            f(i, kind, row, col);
    }
}

template <uint32_t DT, int DPL>
__device__ __forceinline__ void stage_load(stage<DT, DPL> &st, const ctxs__cuda_attn &a,
                                           const tile_at &tl, uint32_t g, uint32_t tid)
{
    constexpr uint32_t EB = elem_bytes(DT);
    const size_t slot_bytes = (size_t)a.head_dim * EB;
    if (DT == CTXS_DTYPE_Q8 && tid < 2 * TILE)
        st.scale = scale_of(a, tl, g, tid / TILE, tid % TILE);
    each_piece<DPL>(a, tl, tid, [&](int i, uint32_t kind, uint32_t row, uint32_t col) {
        const uint64_t slot = (uint64_t)plan_slot(a, tl.pos + row);
        const uint8_t *src = (kind ? a.v : a.k) + (size_t)g * a.head_stride +
                             slot * slot_bytes + (size_t)col * 8 * EB;
        st.r[i] = *reinterpret_cast<const piece_t<DT> *>(src);
    });
}

template <uint32_t DT, int DPL>
__device__ __forceinline__ void stage_store(const stage<DT, DPL> &st, const ctxs__cuda_attn &a,
                                            const tile_at &tl, uint32_t tid, uint8_t *ks,
                                            uint8_t *vs, float *ss, uint32_t kp_bytes,
                                            uint32_t vp_bytes)
{
    constexpr uint32_t EB = elem_bytes(DT);
    if (DT == CTXS_DTYPE_Q8 && tid < 2 * TILE)
        ss[tid] = st.scale;
    each_piece<DPL>(a, tl, tid, [&](int i, uint32_t kind, uint32_t row, uint32_t col) {
        uint8_t *dst = kind ? vs + row * vp_bytes : ks + row * kp_bytes;
        *reinterpret_cast<piece_t<DT> *>(dst + col * 8 * EB) = st.r[i];
    });
}

/* A head_dim that is not a multiple of 8 leaves rows unaligned for piece
 * loads: load them element by element, padding with zeros to dim_pad. */
template <uint32_t DT>
__device__ void stage_direct(const ctxs__cuda_attn &a, const tile_at &tl, uint32_t g,
                             uint32_t tid, uint8_t *ks, uint8_t *vs, float *ss,
                             uint32_t kp_bytes, uint32_t vp_bytes)
{
    /* One element, as bits: the widening is widen()'s. */
    using elem_t = typename std::conditional<elem_bytes(DT) == 2, unsigned short,
                                             unsigned char>::type;
    const uint32_t dp = a.dim_pad, hd = a.head_dim, per_kind = TILE * dp;
    if (DT == CTXS_DTYPE_Q8 && tid < 2 * TILE)
        ss[tid] = scale_of(a, tl, g, tid / TILE, tid % TILE);
    for (uint32_t e = tid; e < 2 * per_kind; e += THREADS) {
        const uint32_t kind = e >= per_kind, rem = e - kind * per_kind;
        const uint32_t row = rem / dp, d = rem % dp;
        if (!((tl.rows >> row) & 1u))
            continue;
        elem_t x = 0;
        if (d < hd) {
            const uint64_t slot = (uint64_t)plan_slot(a, tl.pos + row);
            const elem_t *src = reinterpret_cast<const elem_t *>(
                (kind ? a.v : a.k) + (size_t)g * a.head_stride);
            x = src[slot * hd + d];
        }
        uint8_t *dst = kind ? vs + row * vp_bytes : ks + row * kp_bytes;
        reinterpret_cast<elem_t *>(dst)[d] = x;
    }
}

__device__ __forceinline__ float warp_max(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        x = fmaxf(x, __shfl_xor_sync(FULL, x, o));
    return x;
}

/* A butterfly: every lane adds the same two values at every step
 * (commutatively), so all lanes end with the same bits. */
__device__ __forceinline__ float warp_sum(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        x = __fadd_rn(x, __shfl_xor_sync(FULL, x, o));
    return x;
}

__device__ __forceinline__ float2 h2f(uint32_t bits)
{
    return __half22float2(__halves2half2(__ushort_as_half((unsigned short)(bits & 0xffffu)),
                                         __ushort_as_half((unsigned short)(bits >> 16))));
}

/* The one place an element becomes a float: N (2, 4 or 8) elements of a
 * row in shared memory at p (aligned to their size), by one vector load.
 * Every conversion is exact. */
template <uint32_t DT, int N>
__device__ __forceinline__ void widen(const uint8_t *p, float (&f)[N])
{
    constexpr int BYTES = N * (int)elem_bytes(DT);
    uint32_t w[(BYTES + 3) / 4];
    if constexpr (BYTES == 16) {
        const uint4 r = *reinterpret_cast<const uint4 *>(p);
        w[0] = r.x, w[1] = r.y, w[2] = r.z, w[3] = r.w;
    } else if constexpr (BYTES == 8) {
        const uint2 r = *reinterpret_cast<const uint2 *>(p);
        w[0] = r.x, w[1] = r.y;
    } else if constexpr (BYTES == 4) {
        w[0] = *reinterpret_cast<const uint32_t *>(p);
    } else {
        w[0] = *reinterpret_cast<const unsigned short *>(p);
    }
#pragma unroll
    for (int i = 0; i < N; i += 2) {
        float2 x;
        if constexpr (DT == CTXS_DTYPE_F16) {
            x = h2f(w[i / 2]);
        } else if constexpr (DT == CTXS_DTYPE_BF16) {
            /* bf16 is the high half of a float32. */
            x = make_float2(__uint_as_float(w[i / 2] << 16),
                            __uint_as_float(w[i / 2] & 0xffff0000u));
        } else {
            const uint32_t b = w[i / 4] >> (8 * (i % 4));
            x = make_float2((float)(int8_t)(b & 0xffu), (float)(int8_t)((b >> 8) & 0xffu));
        }
        f[i] = x.x, f[i + 1] = x.y;
    }
}

/* Dot product of one K row (pieces in shared memory) with the warp's
 * prescaled query: four partial sums, element d into sum (d / 2) % 4,
 * combined as (s0 + s1) + (s2 + s3). For Q8 the row's scale is the
 * caller's to apply. */
template <uint32_t DT>
__device__ __forceinline__ float dot_row(const uint8_t *krow, const float *qw, uint32_t dp)
{
    constexpr uint32_t EB = elem_bytes(DT);
    const float4 *q4 = reinterpret_cast<const float4 *>(qw);
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    for (uint32_t c = 0; c < dp / 8; c++) {
        float k[8];
        widen<DT, 8>(krow + c * 8 * EB, k);
        const float4 qa = q4[2 * c], qb = q4[2 * c + 1];
        s0 = __fmaf_rn(qa.x, k[0], s0);
        s0 = __fmaf_rn(qa.y, k[1], s0);
        s1 = __fmaf_rn(qa.z, k[2], s1);
        s1 = __fmaf_rn(qa.w, k[3], s1);
        s2 = __fmaf_rn(qb.x, k[4], s2);
        s2 = __fmaf_rn(qb.y, k[5], s2);
        s3 = __fmaf_rn(qb.z, k[6], s3);
        s3 = __fmaf_rn(qb.w, k[7], s3);
    }
    return __fadd_rn(__fadd_rn(s0, s1), __fadd_rn(s2, s3));
}

/* Folds a chunk's partial (m, l, acc) into the running (rm, rl, racc). An
 * empty partial (m = -inf: no key read) changes nothing. */
template <int DPL>
__device__ __forceinline__ void fold(float &rm, float &rl, float (&racc)[DPL], float m, float l,
                                     const float (&acc)[DPL])
{
    if (m == neg_inf())
        return;
    if (rm == neg_inf()) {
        rm = m, rl = l;
#pragma unroll
        for (int k = 0; k < DPL; k++)
            racc[k] = acc[k];
        return;
    }
    const float mx = fmaxf(rm, m);
    const float x = exp2f(__fsub_rn(rm, mx)), y = exp2f(__fsub_rn(m, mx));
    rl = __fmaf_rn(rl, x, __fmul_rn(l, y));
#pragma unroll
    for (int k = 0; k < DPL; k++)
        racc[k] = __fmaf_rn(racc[k], x, __fmul_rn(acc[k], y));
    rm = mx;
}

/* out = acc / l, as the CPU kernel: times the reciprocal; zeros for a
 * query that read no key. */
template <int DPL>
__device__ __forceinline__ void write_out(float *o, uint32_t hd, uint32_t lane, float m, float l,
                                          const float (&acc)[DPL])
{
    const float inv = __frcp_rn(l);
#pragma unroll
    for (int k = 0; k < DPL; k++) {
        const uint32_t d = lane * DPL + k;
        if (d < hd)
            o[d] = m == neg_inf() ? 0.0f : __fmul_rn(acc[k], inv);
    }
}

template <uint32_t DT, int DPL>
__global__ void __launch_bounds__(THREADS) attn_kernel(const ctxs__cuda_attn a)
{
    constexpr uint32_t EB = elem_bytes(DT);
    constexpr bool Q8 = DT == CTXS_DTYPE_Q8;
    extern __shared__ __align__(16) uint8_t smem[];
    const uint32_t dp = a.dim_pad, hd = a.head_dim;
    const smem_layout sm = smem_of(dp, DT);
    const uint32_t kp_bytes = sm.kp, vp_bytes = sm.vp;
    uint8_t *ks = smem;
    uint8_t *vs = smem + sm.vs;
    float *qs = reinterpret_cast<float *>(smem + sm.qs);
    float *ss = reinterpret_cast<float *>(smem + sm.ss); /* Q8: [K rows][V rows] */
    const uint32_t tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const uint32_t g = blockIdx.y;

    /* The block's pairs, and the positions of its first and last query. */
    const uint64_t n_pairs = (uint64_t)a.n * a.group;
    const uint64_t pair0 = (uint64_t)blockIdx.x * a.pairs_per_block;
    const uint64_t pair_end = pair0 + a.pairs_per_block < n_pairs ? pair0 + a.pairs_per_block
                                                                   : n_pairs;
    const uint64_t pair = pair0 + warp;
    const bool active = pair < pair_end; /* uniform in the warp */
    const uint64_t qi = active ? pair / a.group : 0;
    const uint32_t h = active ? g * a.group + (uint32_t)(pair % a.group) : 0;
    const uint64_t qpos = a.pos0 + qi;
    const uint64_t p_lo = a.pos0 + pair0 / a.group, p_hi = a.pos0 + (pair_end - 1) / a.group;
    const uint64_t win_lo = p_lo + 1 > a.window ? p_lo + 1 - a.window : 0;

    float *qw = qs + (size_t)warp * dp;
    if (active) {
        const float *src = a.q + (qi * a.n_heads + h) * hd;
        for (uint32_t d = lane; d < dp; d += 32)
            qw[d] = d < hd ? __fmul_rn(src[d], a.scale_log2) : 0.0f;
    }

    const uint32_t ci_begin = a.split ? blockIdx.z : 0;
    const uint32_t ci_end = a.split ? blockIdx.z + 1 : a.n_chunks;
    const bool vec = hd % 8 == 0;

    /* The chunk's partial, and (folding in the block) the running result. */
    float m = neg_inf(), l = 0.0f, acc[DPL];
    float rm = neg_inf(), rl = 0.0f, racc[DPL];
#pragma unroll
    for (int k = 0; k < DPL; k++)
        acc[k] = 0.0f, racc[k] = 0.0f;

    stage<DT, DPL> st;
    tile_at cur = seek(a, ci_begin, 0, ci_end, p_hi, win_lo, lane);
    if (cur.ok && vec)
        stage_load(st, a, cur, g, tid);
    while (cur.ok) {
        if (vec)
            stage_store(st, a, cur, tid, ks, vs, ss, kp_bytes, vp_bytes);
        else
            stage_direct<DT>(a, cur, g, tid, ks, vs, ss, kp_bytes, vp_bytes);
        __syncthreads(); /* the tile (and at first the queries) in place */

        const tile_at next = seek(a, cur.ci, cur.t + 1, ci_end, p_hi, win_lo, lane);
        if (next.ok && vec)
            stage_load(st, a, next, g, tid); /* in flight during the math */

        if (active) {
            const uint64_t kp = cur.pos + lane;
            const bool read = ((cur.rows >> lane) & 1u) && kp <= qpos &&
                              (kp < a.n_sink || qpos - kp < a.window);
            const uint32_t keys = __ballot_sync(FULL, read);
            if (keys) {
                float s = neg_inf();
                if (read) {
                    s = dot_row<DT>(ks + lane * kp_bytes, qw, dp);
                    if (Q8)
                        s = __fmul_rn(ss[lane], s);
                }
                const float mx = fmaxf(m, warp_max(s));
                const float alpha = exp2f(__fsub_rn(m, mx));
                const float p = read ? exp2f(__fsub_rn(s, mx)) : 0.0f;
                l = __fmaf_rn(l, alpha, warp_sum(p));
#pragma unroll
                for (int k = 0; k < DPL; k++)
                    acc[k] = __fmul_rn(acc[k], alpha);
                const bool dims = lane * DPL < dp;
                for (uint32_t left = keys; left; left &= left - 1) {
                    const int j = __ffs(left) - 1;
                    float pj = __shfl_sync(FULL, p, j);
                    if (Q8)
                        pj = __fmul_rn(pj, ss[TILE + j]);
                    if (dims) {
                        float v[DPL];
                        widen<DT, DPL>(vs + j * vp_bytes + lane * DPL * EB, v);
#pragma unroll
                        for (int k = 0; k < DPL; k++)
                            acc[k] = __fmaf_rn(pj, v[k], acc[k]);
                    }
                }
                m = mx;
            }
        }
        if (!a.split && (!next.ok || next.ci != cur.ci)) {
            fold<DPL>(rm, rl, racc, m, l, acc);
            m = neg_inf(), l = 0.0f;
#pragma unroll
            for (int k = 0; k < DPL; k++)
                acc[k] = 0.0f;
        }
        __syncthreads(); /* everyone is done with the tile */
        cur = next;
    }

    if (!active)
        return;
    const uint64_t pg = qi * a.n_heads + h;
    if (!a.split) {
        write_out<DPL>(a.out + pg * hd, hd, lane, rm, rl, racc);
        return;
    }
    /* One chunk's partial, for merge_kernel. */
    const uint64_t at = pg * a.n_chunks + blockIdx.z;
    float *ml = a.ws + at * 2;
    float *sums = a.ws + (uint64_t)a.n * a.n_heads * a.n_chunks * 2 + at * hd;
    if (lane == 0)
        ml[0] = m, ml[1] = l;
#pragma unroll
    for (int k = 0; k < DPL; k++) {
        const uint32_t d = lane * DPL + k;
        if (d < hd)
            sums[d] = acc[k];
    }
}

/* Folds the chunks' partials of each (query, head), a warp each, in
 * position order. */
template <int DPL>
__global__ void __launch_bounds__(THREADS) merge_kernel(const ctxs__cuda_attn a)
{
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, hd = a.head_dim;
    const uint64_t pairs = (uint64_t)a.n * a.n_heads;
    const uint64_t pg = (uint64_t)blockIdx.x * WARPS + warp;
    if (pg >= pairs)
        return;
    const float *ml = a.ws + pg * a.n_chunks * 2;
    const float *sums = a.ws + pairs * a.n_chunks * 2 + pg * a.n_chunks * hd;
    float rm = neg_inf(), rl = 0.0f, racc[DPL];
#pragma unroll
    for (int k = 0; k < DPL; k++)
        racc[k] = 0.0f;
    /* MERGE_BATCH chunks' loads in flight at once, then folded one by one
     * in position order (the bits stay those of a fold chunk by chunk): a
     * fold waits on its loads, and one chunk at a time made the merge a
     * chain of memory latencies, 41 us beside the attention kernel's 66 at
     * 8192 tokens on an H200 (ncu). */
    for (uint32_t c0 = 0; c0 < a.n_chunks; c0 += MERGE_BATCH) {
        float m[MERGE_BATCH], l[MERGE_BATCH], acc[MERGE_BATCH][DPL];
#pragma unroll
        for (uint32_t j = 0; j < MERGE_BATCH; j++) {
            const uint32_t c = c0 + j;
            m[j] = c < a.n_chunks ? ml[2 * c] : neg_inf();
            l[j] = c < a.n_chunks ? ml[2 * c + 1] : 0.0f;
#pragma unroll
            for (int k = 0; k < DPL; k++) {
                const uint32_t d = lane * DPL + k;
                acc[j][k] = c < a.n_chunks && d < hd ? sums[(size_t)c * hd + d] : 0.0f;
            }
        }
#pragma unroll
        for (uint32_t j = 0; j < MERGE_BATCH; j++)
            fold<DPL>(rm, rl, racc, m[j], l[j], acc[j]); /* skips an empty chunk */
    }
    write_out<DPL>(a.out + pg * hd, hd, lane, rm, rl, racc);
}

template <uint32_t DT, int DPL> cudaError_t launch(const ctxs__cuda_attn &a, cudaStream_t stream)
{
    const dim3 grid(a.n_pair_tiles, a.n_kv_heads, a.split ? a.n_chunks : 1);
    /* A launch reports through the thread's last error, which an earlier
     * failed call (a refused registration) may still hold: clear it. */
    (void)cudaGetLastError();
    attn_kernel<DT, DPL><<<grid, THREADS, smem_of(a.dim_pad, DT).total, stream>>>(a);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || !a.split)
        return e;
    const uint64_t pairs = (uint64_t)a.n * a.n_heads;
    merge_kernel<DPL><<<(unsigned)((pairs + WARPS - 1) / WARPS), THREADS, 0, stream>>>(a);
    return cudaGetLastError();
}

template <uint32_t DT> cudaError_t launch_dtype(const ctxs__cuda_attn &a, cudaStream_t stream)
{
    if (a.dim_pad <= 64)
        return launch<DT, 2>(a, stream);
    if (a.dim_pad <= 128)
        return launch<DT, 4>(a, stream);
    return launch<DT, 8>(a, stream);
}

} // namespace

extern "C" cudaError_t ctxs__cuda_attn_launch(const ctxs__cuda_attn *a, cudaStream_t stream)
{
    switch (a->dtype) {
    case CTXS_DTYPE_BF16:
        return launch_dtype<CTXS_DTYPE_BF16>(*a, stream);
    case CTXS_DTYPE_Q8:
        return launch_dtype<CTXS_DTYPE_Q8>(*a, stream);
    default:
        return launch_dtype<CTXS_DTYPE_F16>(*a, stream);
    }
}
