/*
 * ctxs_cuda_attention(): the arguments checked as ctxs_attention() checks
 * them, the plan turned into what the kernels take (kernels.cu), and the
 * choice between folding in the block and split-K.
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

/* As ctxs_attention() (src/gpu/attention.c): every slot inside the
 * capacity, spans ascending without overlap, n_keys their sum. */
static int plan_valid(const ctxs_attn_plan *plan, uint32_t capacity)
{
    CHECK(plan->n_spans <= CTXS_ATTN_MAX_SPANS);
    uint64_t keys = 0, next = 0;
    for (uint32_t i = 0; i < plan->n_spans; i++) {
        const ctxs_attn_span *sp = &plan->spans[i];
        CHECK(sp->count <= capacity && sp->slot <= capacity - sp->count);
        CHECK(sp->pos <= UINT64_MAX - sp->count);
        CHECK(i == 0 || sp->pos >= next);
        next = sp->pos + sp->count;
        keys += sp->count;
    }
    CHECK(keys == plan->n_keys);
    return 0;
}

/* 1 / sqrt(head_dim) computed as the CPU kernel does, so that both use the
 * same float. */
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
    CHECK(out && kv && plan && q && q->q);
    const ctxs_layout *l = &kv->host;
    const ctxs_geometry *geo = &l->geometry;
    CHECK(geo->dtype == CTXS_DTYPE_F16 && layer < geo->n_layers);
    CHECK(geo->head_dim >= 1 && geo->head_dim <= CTXS_CUDA_MAX_HEAD_DIM);
    const uint32_t n_kv = geo->n_kv_heads, hd = geo->head_dim;
    CHECK(q->n >= 1 && q->n_heads > 0 && q->n_heads % n_kv == 0);
    CHECK(q->pos >= plan->first_query && q->pos <= plan->n_tokens &&
          q->n <= plan->n_tokens - q->pos);
    int rc = plan_valid(plan, l->capacity);
    if (rc < 0)
        return rc;

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
    a.n_sink = plan->n_sink;
    a.window = plan->window;
    const float scale = q->scale != 0.0f ? q->scale : default_scale(hd);
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
