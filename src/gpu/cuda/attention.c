/*
 * ctxs_cuda_attention(): the arguments checked by ctxs_attention_check(),
 * as every kernel does; the plan turned into what the kernels take
 * (kernels.cu), and the choice between folding in the block and split-K.
 */
#include <stdint.h>
#include <string.h>

#include "cuda_internal.h"

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond))                                                           \
            return CTXS_EINVAL;                                                \
    } while (0)

/* Split-K when the blocks of one pass without it would leave the device
 * half idle, and its partial results fit in this much device memory. */
#define SPLIT_MAX_BYTES ((uint64_t)256 << 20)

/* The chunks (CTXS__CUDA_CHUNK positions, aligned) the plan's keys fall
 * in, ascending, as at most one run of consecutive chunk numbers per
 * span. */
static void chunk_list(ctxs__cuda_attn *a)
{
    uint64_t total = 0, last = 0;
    int have = 0;
    a->n_ranges = 0;
    for (uint32_t i = 0; i < a->n_spans; i++) {
        uint64_t c0 = a->span_pos[i] / CTXS__CUDA_CHUNK;
        uint64_t c1 = (a->span_pos[i] + a->span_count[i] - 1) / CTXS__CUDA_CHUNK;
        if (have && c0 <= last)
            c0 = last + 1; /* the previous span's last chunk holds its start */
        if (c0 > c1)
            continue;
        if (!have || c0 != last + 1) {
            a->range_first[a->n_ranges] = c0;
            a->range_start[a->n_ranges] = (uint32_t)total;
            a->n_ranges++;
        }
        total += c1 - c0 + 1;
        last = c1;
        have = 1;
    }
    a->n_chunks = (uint32_t)total;
}

int ctxs_cuda_attention(float *out, const ctxs_cuda_kv *kv, const ctxs_attn_plan *plan,
                        uint32_t layer, const ctxs_attn_query *q, void *stream)
{
    CHECK(out && kv && q && q->q);
    const ctxs_layout *l = &kv->host;
    float scale;
    int rc = ctxs_attention_check(&scale, l, plan, layer, q);
    if (rc < 0)
        return rc;
    const uint32_t n_kv = l->geometry.n_kv_heads, hd = l->geometry.head_dim;
    CHECK(hd <= CTXS_CUDA_MAX_HEAD_DIM);

    ctxs__cuda_attn a;
    memset(&a, 0, sizeof(a));
    a.k = kv->dev_kv + (size_t)layer * l->layer_stride;
    a.v = a.k + l->kv_stride;
    a.q = q->q;
    a.out = out;
    a.head_stride = l->head_stride;
    a.pos0 = q->pos;
    a.n = q->n;
    a.n_heads = q->n_heads;
    a.n_kv_heads = n_kv;
    a.group = q->n_heads / n_kv;
    a.head_dim = hd;
    a.dim_pad = (hd + 7) & ~7u;
    a.dtype = l->geometry.dtype;
    a.capacity = l->capacity;
    if (a.dtype == CTXS_DTYPE_Q8) {
        /* The layer's runs of scales, as its runs of K and V: K of head g
         * at run (layer*2 + 0)*n_kv + g, V at (layer*2 + 1)*n_kv + g. */
        CHECK(kv->dev_scales);
        a.k_scale = kv->dev_scales + (size_t)layer * 2 * n_kv * l->capacity;
        a.v_scale = a.k_scale + (size_t)n_kv * l->capacity;
    }
    a.n_sink = plan->n_sink;
    a.window = plan->window;
    a.scale_log2 = scale * 1.44269504088896341f;
    for (uint32_t i = 0; i < plan->n_spans; i++) {
        if (plan->spans[i].count == 0)
            continue;
        a.span_pos[a.n_spans] = plan->spans[i].pos;
        a.span_slot[a.n_spans] = plan->spans[i].slot;
        a.span_count[a.n_spans] = plan->spans[i].count;
        a.n_spans++;
    }
    chunk_list(&a);

    /* A block per pair tile (up to 8 (query, head) pairs of one KV head);
     * split-K when those are too few to fill the device. */
    const uint64_t pairs = (uint64_t)q->n * a.group;
    a.pairs_per_block = pairs < CTXS__CUDA_WARPS ? (uint32_t)pairs : CTXS__CUDA_WARPS;
    const uint64_t tiles = (pairs + a.pairs_per_block - 1) / a.pairs_per_block;
    CHECK(tiles <= INT32_MAX);
    a.n_pair_tiles = (uint32_t)tiles;
    const uint64_t ws_bytes =
        (uint64_t)q->n * q->n_heads * a.n_chunks * (hd + 2) * sizeof(float);
    a.split = a.n_chunks > 1 && a.n_chunks <= 65535 &&
              tiles * n_kv < 2 * (uint64_t)kv->sm_count && ws_bytes <= SPLIT_MAX_BYTES;

    int prev;
    if ((rc = ctxs__cuda_enter(kv->device, &prev)) < 0)
        return rc;
    cudaStream_t st = (cudaStream_t)stream;
    void *ws = NULL;
    if (a.split) {
        /* Stream-ordered: the pool hands the same memory back call after
         * call, and threads on other streams never share it. */
        rc = ctxs__cuda_err(kv->mem_pools ? cudaMallocAsync(&ws, ws_bytes, st)
                                          : cudaMalloc(&ws, ws_bytes));
        if (rc < 0)
            goto done;
        a.ws = ws;
    }
    rc = ctxs__cuda_err(ctxs__cuda_attn_launch(&a, st));
    if (ws) {
        if (kv->mem_pools) {
            cudaFreeAsync(ws, st);
        } else {
            cudaStreamSynchronize(st);
            cudaFree(ws);
        }
    }
done:
    ctxs__cuda_leave(prev, kv->device);
    return rc;
}
