/*
 * The write path: K and V handed over by the engine, a layer of several
 * tokens (ctxs_session_write_layer()) or a token of every layer
 * (ctxs_session_write_token()), converted to the session's dtype and put
 * into their reserved slots, where the mapping shows them when the call
 * returns.
 *
 * Two ways there, chosen per call, neither of which write-faults the
 * mapping on the caller's thread (see runway.c for why a fault costs):
 *
 *   mapped   the slots' pages are mapped writable by this handle and no
 *            writeback has cleaned them since (ctxs__kv_writable()): the
 *            bytes are converted straight into the mapping. A turn after a
 *            short pause, whose runway the worker mapped after the last
 *            commit, goes this way at the speed of a memcpy.
 *   file     every other case: each run's slots are converted into a small
 *            buffer and written with one pwrite() per (layer, K|V, head)
 *            run, into the page cache that the mapping shows. The kernel
 *            copies the bytes into its pages without touching our page
 *            tables; its cost does not depend on what writeback did to
 *            them. Measured on Linux 6.18 ext4 for a 64-token turn of
 *            Qwen3-4B (576 runs of 16 KiB): 2.8-3.7 ms where a memcpy into
 *            mapped pages takes 1.0 ms, and the stores through the mapping
 *            take 6.4 ms once writeback has cleaned their pages (7.5-12 ms
 *            when the pages are not in the page cache at all).
 *
 * The runs of a layer are not contiguous in the file ([layers][2][heads]
 * [capacity][head_dim]), so one pwritev() cannot carry them: the system
 * calls are one per run, 2 * n_kv_heads per layer (a system call costs
 * about 0.3 us; the page cache's work per 4 KiB page about 0.9 us).
 *
 * A page written through the file is dirty without being mapped writable,
 * so after such a write the layers it touched go through the file until
 * the worker maps them again (file_written, runway.c).
 */
#include <inttypes.h>
#include <stdlib.h>

#include "dtype.h"
#include "internal.h"
#include "platform.h"
#include "syscall.h"

/* Bytes of slots the file path stages at a time: 128 tokens of a layer's
 * K (or V) for Qwen3-4B's 8 heads of 128 fp16 elements. */
#define BOUNCE_BYTES 262144u

/* Tokens the worker maps ahead of an engine that writes a few at a time. */
#define MAP_AHEAD 64u

/* A call of at most this many tokens asks for its slots' cache lines
 * before it stores (prefetch_slots()); a longer one's stores run along
 * each run, where the processor's own prefetching serves them. */
#define PREFETCH_TOKENS 4u

#ifdef CTXS_TEST_HOOKS
int ctxs__write_path_force;
#endif

static uint32_t src_elem_bytes(uint32_t dtype)
{
    return dtype == CTXS_DTYPE_F32 ? 4 : ctxs__dtype_bytes(dtype);
}

/* Head h of kind (K|V) of token t of the call's layer l (from its first). */
static const uint8_t *src_head(const ctxs_session *s, const ctxs__kv_src *src, uint32_t kind,
                               uint32_t l, uint32_t t, uint32_t h)
{
    size_t head_bytes = (size_t)s->lay.head_dim * src_elem_bytes(src->dtype);
    return (kind ? src->v : src->k) + l * src->layer_stride + t * src->token_stride +
           h * head_bytes;
}

static const uint8_t *src_scale(const ctxs__kv_src *src, uint32_t kind, uint32_t l, uint32_t t,
                                uint32_t h)
{
    const uint8_t *base = kind ? src->v_scales : src->k_scales;
    return base ? base + l * src->scale_layer_stride + t * src->scale_token_stride + h * 4u
                : NULL;
}

/* One slot of sb bytes. The common sizes get a copy of constant size,
 * which the compiler turns into a few vector moves: a call of memcpy() per
 * 256-byte slot cost twice the copy (36,864 of them in a 64-token turn of
 * Qwen3-4B). */
static inline void copy_slot(uint8_t *dst, const uint8_t *src, size_t sb)
{
    switch (sb) {
    case 128: memcpy(dst, src, 128); break;
    case 256: memcpy(dst, src, 256); break;
    case 512: memcpy(dst, src, 512); break;
    default: memcpy(dst, src, sb); break;
    }
}

/* Where put_tokens() puts head h's slot j: at base + h * stride + j * sb,
 * its scale at scales + h * scale_stride + j: a (layer, kind) of the
 * mapping, or the staging buffer. */
typedef struct slots_dst {
    uint8_t *base;
    size_t stride;
    float *scales; /* NULL without scales */
    size_t scale_stride;
} slots_dst;

/* Tokens t0 .. t0 + c - 1 of the call's layer rel and kind, every head,
 * into slots 0 .. c - 1 of d: converted, or copied as they are. Token by
 * token, every head of a token after the other, so that the engine's
 * [n][n_kv_heads][head_dim] is read in order (reading it a head at a time,
 * strided, cost 1.5x as much). */
static int put_tokens(const ctxs_session *s, const ctxs__kv_src *src, uint32_t kind, uint32_t rel,
                      uint32_t t0, uint32_t c, const slots_dst *d)
{
    const ctxs__file_layout *lay = &s->lay;
    const size_t sb = lay->slot_bytes;
    const int own = src->dtype == s->model.geometry.dtype;
    for (uint32_t j = 0; j < c; j++)
        for (uint32_t h = 0; h < lay->n_kv_heads; h++) {
            const uint8_t *from = src_head(s, src, kind, rel, t0 + j, h);
            uint8_t *to = d->base + h * d->stride + (size_t)j * sb;
            float *scale = d->scales ? d->scales + h * d->scale_stride + j : NULL;
            if (own) {
                copy_slot(to, from, sb);
                if (scale)
                    memcpy(scale, src_scale(src, kind, rel, t0 + j, h), 4);
                continue;
            }
            int rc = ctxs__head_encode(s, to, scale, from, src_scale(src, kind, rel, t0 + j, h),
                                       src->dtype);
            if (rc < 0)
                return rc;
        }
    return 0;
}

/* The slots of positions [pos, pos + n) in layer l (a windowed layer's
 * ring, or the session's slots), and in *t0 the first of the call's
 * tokens they hold. */
static uint32_t layer_spans(ctxs__span spans[2], uint32_t *t0, const ctxs_session *s, uint32_t l,
                            uint64_t pos, uint32_t n)
{
    uint32_t k = ctxs__layer_spans(spans, &s->lay, l, pos, n), got = 0;
    for (uint32_t i = 0; i < k; i++)
        got += spans[i].count;
    *t0 = n - got;
    return k;
}

/* Asks for the cache lines of the spans' slots in each run of layer l
 * (and their scales), to be written, before the first store into them. A
 * token's layer is 2 * n_kv_heads slots, each in a page of its own, and
 * when the engine's attention has read the rest of the context since the
 * last token, neither the pages' translations nor the lines are cached:
 * stored one after the other, each waits for its own (1.9 us a call for
 * Qwen3-4B's 16 slots of 256 bytes, with attention's reads between the
 * calls); asked for first, they arrive together (1.6 us). */
static void prefetch_slots(const ctxs_session *s, uint32_t l, const ctxs__span *spans,
                           uint32_t n_spans)
{
    const ctxs__file_layout *lay = &s->lay;
    const size_t cap = ctxs__layer_cap(lay, l);
    for (uint32_t kind = 0; kind < 2; kind++)
        for (uint32_t i = 0; i < n_spans; i++) {
            const uint8_t *p = ctxs__run(s, l, kind, 0) + (size_t)spans[i].slot * lay->slot_bytes;
            const size_t bytes = (size_t)spans[i].count * lay->slot_bytes;
            for (uint32_t h = 0; h < lay->n_kv_heads; h++, p += cap * lay->slot_bytes) {
                for (size_t o = 0; o < bytes; o += 64)
                    __builtin_prefetch(p + o, 1);
                if (lay->scales_bytes)
                    __builtin_prefetch(ctxs__scales_run(s, l, kind, h) + spans[i].slot, 1);
            }
        }
}

/* Straight into the mapping. */
static int put_mapped(ctxs_session *s, uint64_t pos, uint32_t n, uint32_t l0, uint32_t l1,
                      const ctxs__kv_src *src)
{
    const ctxs__file_layout *lay = &s->lay;
    for (uint32_t l = l0; l < l1; l++) {
        ctxs__span spans[2];
        uint32_t t0, n_spans = layer_spans(spans, &t0, s, l, pos, n);
        const size_t cap = ctxs__layer_cap(lay, l);
        if (n <= PREFETCH_TOKENS)
            prefetch_slots(s, l, spans, n_spans);
        for (uint32_t kind = 0; kind < 2; kind++)
            for (uint32_t i = 0, t = t0; i < n_spans; t += spans[i++].count) {
                const uint32_t slot = spans[i].slot;
                slots_dst d = {ctxs__run(s, l, kind, 0) + (size_t)slot * lay->slot_bytes,
                               cap * lay->slot_bytes, NULL, lay->scales_bytes ? cap : 0};
                if (lay->scales_bytes)
                    d.scales = ctxs__scales_run(s, l, kind, 0) + slot;
                int rc = put_tokens(s, src, kind, l - l0, t, spans[i].count, &d);
                if (rc < 0)
                    return rc;
            }
    }
    return 0;
}

/* The staging buffer of the file path: BOUNCE_BYTES of slots, [head][chunk]
 * of them, then the chunk's scales of each head. */
static uint32_t bounce_chunk(const ctxs_session *s)
{
    uint32_t c = BOUNCE_BYTES / ((uint32_t)s->lay.slot_bytes * s->lay.n_kv_heads);
    return c ? c : 1;
}

static int file_path_ready(ctxs_session *s)
{
    const size_t slots = (size_t)bounce_chunk(s) * s->lay.n_kv_heads;
    if (!s->bounce && !(s->bounce = ctxs__malloc(slots * (s->lay.slot_bytes + 4))))
        return CTXS_ENOMEM;
    return 0;
}

/* Tokens t .. t + c - 1 of the call's layer rel (the session's layer l)
 * and kind into slots [slot, slot + c) of each head's run in the file,
 * elements then (Q8) scales, one pwrite each: gathered and converted into
 * the staging buffer, or, for one token handed over in the session's own
 * dtype, written from where they are. */
static int put_chunk(ctxs_session *s, const ctxs__kv_src *src, uint32_t kind, uint32_t l,
                     uint32_t rel, uint32_t t, uint32_t slot, uint32_t c)
{
    const ctxs__file_layout *lay = &s->lay;
    const size_t sb = lay->slot_bytes;
    const uint32_t chunk = bounce_chunk(s), heads = lay->n_kv_heads;
    const int direct = c == 1 && src->dtype == s->model.geometry.dtype;
    const slots_dst d = {s->bounce, (size_t)chunk * sb,
                         lay->scales_bytes ? (float *)(void *)(s->bounce + (size_t)chunk * heads * sb)
                                           : NULL,
                         chunk};
    if (!direct) {
        int rc = put_tokens(s, src, kind, rel, t, c, &d);
        if (rc < 0)
            return rc;
    }
    for (uint32_t h = 0; h < heads; h++) {
        const uint64_t run = ((uint64_t)l * 2 + kind) * heads + h;
        const void *elems = direct ? (const void *)src_head(s, src, kind, rel, t, h)
                                   : (const void *)(d.base + h * d.stride);
        int rc = ctxs__write_exact(s->fd, elems, c * sb,
                                   (off_t)(lay->kv_off + ctxs__run_off(lay, (uint32_t)run) +
                                           (uint64_t)slot * sb));
        if (rc == 0 && d.scales) {
            const void *sc = direct ? (const void *)src_scale(src, kind, rel, t, h)
                                    : (const void *)(d.scales + h * d.scale_stride);
            rc = ctxs__write_exact(s->fd, sc, c * 4u,
                                   (off_t)(lay->scales_off +
                                           ctxs__run_scales_off(lay, (uint32_t)run) +
                                           (uint64_t)slot * 4u));
        }
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Through the file: a (layer, kind) at a time, in chunks of the staging
 * buffer, one pwrite per head and chunk. pending: the stamp of a pass under
 * way that will map these layers after this write, or 0. */
static int put_through_file(ctxs_session *s, uint64_t pos, uint32_t n, uint32_t l0, uint32_t l1,
                            const ctxs__kv_src *src, uint64_t pending)
{
    int rc = file_path_ready(s);
    if (rc < 0)
        return rc;
    const uint32_t chunk = bounce_chunk(s);
    /* Before the first write: a pass that begins after this stamp maps
     * these pages writable again, one that began before may not have (the
     * pass under way does: it has not reached these layers yet). */
    uint64_t stamp = pending ? pending - 1 : atomic_fetch_add(&s->stamp, 1) + 1;
    for (uint32_t l = l0; l < l1; l++)
        if (stamp > atomic_load_explicit(&s->file_written[l], memory_order_relaxed))
            atomic_store_explicit(&s->file_written[l], stamp, memory_order_relaxed);
    for (uint32_t l = l0; l < l1; l++) {
        ctxs__span spans[2];
        uint32_t t0, n_spans = layer_spans(spans, &t0, s, l, pos, n);
        for (uint32_t kind = 0; kind < 2; kind++)
            for (uint32_t i = 0, t = t0; i < n_spans; i++)
                for (uint32_t done = 0; done < spans[i].count;) {
                    uint32_t c = spans[i].count - done < chunk ? spans[i].count - done : chunk;
                    if ((rc = put_chunk(s, src, kind, l, l - l0, t, spans[i].slot + done, c)) < 0)
                        return rc;
                    done += c;
                    t += c;
                }
    }
    return 0;
}

int ctxs__kv_put(ctxs_session *s, uint64_t pos, uint32_t n, uint32_t l0, uint32_t l1,
                 const ctxs__kv_src *src)
{
    uint64_t pending = 0;
    int mapped = CTXS__WRITE_PATH_FORCE ? CTXS__WRITE_PATH_FORCE == 1
                                        : ctxs__kv_writable(s, pos, pos + n, l0, l1,
                                                            CTXS__ASK_OWNER, &pending);
    if (mapped)
        return put_mapped(s, pos, n, l0, l1, src);
    const uint64_t end = s->st.n_tokens + s->n_reserved;
    /* Written through the file, these layers are dirty without being
     * mapped writable. When more of the reservation will be written later,
     * a pass under way is trusted to map them after this write; when this
     * call writes the rest of it, nothing will store there again, and the
     * pass skips them: mapping pages beside the engine's writes into them
     * only slows those down (a 64-token turn of Qwen3-4B written a layer at
     * a time cost 11.5-13 ms beside the worker's pass, 4.6-6.7 ms alone, on
     * 2 cores). */
    int rc = put_through_file(s, pos, n, l0, l1, src, pos + n < end ? pending : 0);
    /* More tokens of this reservation to come, as when a reply is decoded
     * a token at a time: the worker maps the slots of the next ones, so
     * that the next calls store into them while the engine computes. A
     * token through the file costs 2 * n_layers * n_kv_heads small writes,
     * about 0.85 ms for Qwen3-4B, against 0.1 ms of faults through the
     * mapping. A bounded stretch, so that the next tokens find all their
     * layers mapped soon; the call that reaches its end asks for more. */
    if (rc == 0 && !pending && pos + n < end && !CTXS__WRITE_PATH_FORCE) {
        uint64_t ahead = end - (pos + n) < MAP_AHEAD ? end : pos + n + MAP_AHEAD;
        ctxs__background_map(s, pos + n, ahead);
    }
    return rc;
}

/* Checks that tokens [i, i + n) of r are reserved in s, and returns the
 * first one's position in *pos. */
static int reserved_range(uint64_t *pos, const ctxs_session *s, const ctxs_reservation *r,
                          uint32_t i, uint32_t n)
{
    const uint64_t committed = s->st.n_tokens;
    if (n == 0 || i >= r->n_tokens || n > r->n_tokens - i || r->first_pos < committed ||
        r->first_pos - committed > s->n_reserved ||
        (uint64_t)i + n > s->n_reserved - (r->first_pos - committed))
        return ctxs__error(CTXS_EINVAL, "tokens %u to %" PRIu64 " of a reservation of %u at "
                           "position %" PRIu64 " are not reserved now (reserved: %" PRIu32
                           " from position %" PRIu64 "): the reservation was committed, "
                           "rolled back or is another session's, or n is 0",
                           i, (uint64_t)i + n, r->n_tokens, r->first_pos, s->n_reserved,
                           committed);
    *pos = r->first_pos + i;
    return 0;
}

#define DTYPE_RULE \
    "K and V handed over as dtype %u: a session takes CTXS_DTYPE_F32, F16, BF16 or its own " \
    "dtype (%u)"

/* Tokens [i, i + n) of r, layers [l0, l1), from the engine's
 * [l1 - l0][n][n_kv_heads][head_dim] in dtype (Q8: each array's scales
 * after its elements, [l1 - l0][n][n_kv_heads]). */
static int write_engine_kv(ctxs_session *s, const ctxs_reservation *r, uint32_t i, uint32_t n,
                           uint32_t l0, uint32_t l1, const void *k, const void *v, uint32_t dtype)
{
    uint64_t pos = 0;
    int rc = reserved_range(&pos, s, r, i, n);
    if (rc < 0)
        return rc;
    if ((rc = ctxs__writable(s)) < 0)
        return rc;
    const ctxs__file_layout *lay = &s->lay;
    const size_t heads = lay->n_kv_heads, token_elems = heads * lay->head_dim;
    const size_t elems = (size_t)(l1 - l0) * n * token_elems;
    const int scales = dtype == CTXS_DTYPE_Q8; /* the session's own Q8 */
    const ctxs__kv_src src = {
        .k = k,
        .v = v,
        .k_scales = scales ? (const uint8_t *)k + elems : NULL,
        .v_scales = scales ? (const uint8_t *)v + elems : NULL,
        .dtype = dtype,
        .token_stride = token_elems * src_elem_bytes(dtype),
        .layer_stride = (size_t)n * token_elems * src_elem_bytes(dtype),
        .scale_token_stride = heads * 4,
        .scale_layer_stride = (size_t)n * heads * 4,
    };
    return ctxs__kv_put(s, pos, n, l0, l1, &src);
}

int ctxs_session_write_layer(ctxs_session *s, const ctxs_reservation *r, uint32_t layer,
                             uint32_t i, uint32_t n, const void *k, const void *v, uint32_t dtype)
{
    ctxs__error_begin();
    CTXS__CHECK(s && r && k && v);
    CTXS__REQUIRE(layer < s->lay.n_layers, "layer %u of a session of %u layers", layer,
                  s->lay.n_layers);
    CTXS__REQUIRE(ctxs__src_dtype_ok(dtype, s->model.geometry.dtype), DTYPE_RULE, dtype,
                  s->model.geometry.dtype);
    return write_engine_kv(s, r, i, n, layer, layer + 1, k, v, dtype);
}

int ctxs_session_write_token(ctxs_session *s, const ctxs_reservation *r, uint32_t i,
                             const void *k, const void *v, uint32_t dtype)
{
    ctxs__error_begin();
    CTXS__CHECK(s && r && k && v);
    CTXS__REQUIRE(ctxs__src_dtype_ok(dtype, s->model.geometry.dtype), DTYPE_RULE, dtype,
                  s->model.geometry.dtype);
    return write_engine_kv(s, r, i, 1, 0, s->lay.n_layers, k, v, dtype);
}
