/*
 * What the C side of the CUDA library (kv.c, attention.c) and the kernels
 * (kernels.cu) share. Plain C: nvcc compiles it as C++.
 */
#ifndef CTXS_CUDA_INTERNAL_H
#define CTXS_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "ctxstore_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Positions per split-K chunk, and per tile a block stages in shared
 * memory. Chunks and tiles are aligned on positions, not on the plan's
 * keys: that is what keeps the arithmetic independent of n and of spans.
 * 64- and 32-position chunks were tried on an H200 (a 36-layer decode step
 * of Qwen3-4B's geometry): no steady gain over 128 beyond the ±25% that the
 * same binary showed from one machine to the next, and 32 was slower at
 * 8192 tokens (3.05 ms against 2.43). */
#define CTXS__CUDA_CHUNK 128u
#define CTXS__CUDA_TILE 32u
#define CTXS__CUDA_THREADS 256u /* 8 warps; each owns one (query, head) */
#define CTXS__CUDA_WARPS (CTXS__CUDA_THREADS / 32u)

struct ctxs_cuda_kv {
    ctxs_session *s;
    int mode;
    int device;
    uint32_t flags;           /* CTXS_CUDA_* */
    ctxs_layout host;         /* the session's layout (host addresses) */
    uint8_t *host_region;     /* what the device reads of the mapping: the
                                 KV region and (Q8) the scale table before it */
    size_t region_bytes;      /* kv_bytes + scales_bytes in a session */
    uint8_t *dev_region;      /* its device address: mirror, alias or mapping */
    uint8_t *dev_kv;          /* what kernels read: dev_region's KV region */
    float *dev_scales;        /* and its scale table; NULL but for Q8 */
    int registered;           /* cudaHostRegister'ed host_region */
    int sm_count;
    int mem_pools;            /* cudaMallocAsync works on the device */
    size_t max_pitch;         /* cudaDevAttrMaxPitch */
};

/* One attention pass, as the kernels take it (by value). */
typedef struct ctxs__cuda_attn {
    const uint8_t *k;      /* the layer's K: KV head g's run at k + g*head_stride */
    const uint8_t *v;      /* the layer's V, likewise */
    const float *k_scale;  /* Q8: the layer's K scales, head g's run of
                              `capacity` at k_scale + g*capacity; else NULL */
    const float *v_scale;  /* Q8: the layer's V scales, likewise */
    const float *q;        /* [n][n_heads][head_dim] */
    float *out;            /* [n][n_heads][head_dim] */
    float *ws;             /* split: [n*n_heads][n_chunks] of {m, l}, then
                              [n*n_heads][n_chunks][head_dim] sums */
    uint64_t head_stride;  /* bytes */
    uint64_t pos0;         /* position of query 0 */
    uint64_t span_pos[CTXS_ATTN_MAX_SPANS];
    uint64_t range_first[CTXS_ATTN_MAX_SPANS]; /* first chunk number of a run */
    uint32_t range_start[CTXS_ATTN_MAX_SPANS]; /* its index in the chunk list */
    uint32_t span_slot[CTXS_ATTN_MAX_SPANS];
    uint32_t span_count[CTXS_ATTN_MAX_SPANS];
    uint32_t n_spans;
    uint32_t n_ranges;
    uint32_t n_chunks;     /* chunks holding the plan's keys, ascending */
    uint32_t n;            /* queries */
    uint32_t n_heads;
    uint32_t n_kv_heads;
    uint32_t group;        /* n_heads / n_kv_heads */
    uint32_t head_dim;
    uint32_t dim_pad;      /* head_dim rounded up to 8 */
    uint32_t n_sink;
    uint32_t window;
    uint32_t pairs_per_block; /* (query, head) pairs of one KV head a block owns */
    uint32_t n_pair_tiles;    /* blocks per KV head (and per chunk, split) */
    uint32_t split;        /* 1: one block per chunk, merged by a 2nd kernel */
    uint32_t dtype;        /* CTXS_DTYPE_F16, BF16 or Q8 */
    uint32_t capacity;     /* slots per run (of K, V and scales) */
    float scale_log2;      /* softmax scale times log2(e) */
} ctxs__cuda_attn;

/* Queues the attention kernel (and with a->split the merge kernel) on
 * stream. Returns the launch's cudaError_t. */
cudaError_t ctxs__cuda_attn_launch(const ctxs__cuda_attn *a, cudaStream_t stream);

/* --- errors and devices (kv.c) ---------------------------------------------- */

/* The code for a CUDA error, remembering it for ctxs_cuda_get_last_error(). */
int ctxs__cuda_err(cudaError_t e);

/* Makes device current for the calling thread and returns the device that
 * was in *prev; ctxs__cuda_leave(prev, device) puts it back. Returns 0 or
 * an error code. */
int ctxs__cuda_enter(int device, int *prev);
void ctxs__cuda_leave(int prev, int device);

#ifdef __cplusplus
}
#endif

#endif
