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
#include <stdlib.h>

#include "dtype.h"
#include "internal.h"
#include "platform.h"
#include "syscall.h"

/* The staging buffer for one run's slots: bytes of elements, then as many
 * scales as it holds slots. */
#define BOUNCE_BYTES 65536u

int ctxs__write_path_force;

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

/* n slots of sb bytes from src, stride apart, to dst, one after another.
 * The common slot sizes get a copy of constant size, which the compiler
 * turns into a few vector moves: a call of memcpy() per 256-byte slot cost
 * twice the copy (36,864 of them in a 64-token turn of Qwen3-4B). */
static void copy_slots(uint8_t *dst, const uint8_t *src, size_t stride, size_t sb, uint32_t n)
{
#define COPY_SLOTS(size)                                                                           \
    for (uint32_t t = 0; t < n; t++)                                                               \
        memcpy(dst + (size_t)t * (size), src + t * stride, (size));                                \
    return
    switch (sb) {
    case 64: COPY_SLOTS(64);
    case 128: COPY_SLOTS(128);
    case 256: COPY_SLOTS(256);
    case 512: COPY_SLOTS(512);
    default: COPY_SLOTS(sb);
    }
#undef COPY_SLOTS
}

/* Straight into the mapping, run by run. */
static int put_mapped(ctxs_session *s, const ctxs__span *spans, uint32_t n_spans, uint32_t l0,
                      uint32_t l1, const ctxs__kv_src *src)
{
    const ctxs__file_layout *lay = &s->lay;
    if (src->dtype == s->model.geometry.dtype) {
        /* As they are: elements and (Q8) scales copied. */
        for (uint32_t l = l0; l < l1; l++)
            for (uint32_t kind = 0; kind < 2; kind++)
                for (uint32_t h = 0; h < lay->n_kv_heads; h++) {
                    uint8_t *run = ctxs__run(s, l, kind, h);
                    float *scales = lay->scales_bytes ? ctxs__scales_run(s, l, kind, h) : NULL;
                    for (uint32_t i = 0, t = 0; i < n_spans; t += spans[i++].count) {
                        copy_slots(run + (size_t)spans[i].slot * lay->slot_bytes,
                                   src_head(s, src, kind, l - l0, t, h), src->token_stride,
                                   lay->slot_bytes, spans[i].count);
                        for (uint32_t j = 0; scales && j < spans[i].count; j++)
                            memcpy(scales + spans[i].slot + j, src_scale(src, kind, l - l0, t + j, h),
                                   4);
                    }
                }
        return 0;
    }
    for (uint32_t l = l0; l < l1; l++)
        for (uint32_t kind = 0; kind < 2; kind++)
            for (uint32_t h = 0; h < lay->n_kv_heads; h++) {
                uint8_t *run = ctxs__run(s, l, kind, h);
                float *scales = lay->scales_bytes ? ctxs__scales_run(s, l, kind, h) : NULL;
                uint32_t t = 0;
                for (uint32_t i = 0; i < n_spans; i++)
                    for (uint32_t j = 0; j < spans[i].count; j++, t++) {
                        uint32_t slot = spans[i].slot + j;
                        int rc = ctxs__head_encode(s, run + (size_t)slot * lay->slot_bytes,
                                                   scales ? scales + slot : NULL,
                                                   src_head(s, src, kind, l - l0, t, h),
                                                   src_scale(src, kind, l - l0, t, h), src->dtype);
                        if (rc < 0)
                            return rc;
                    }
            }
    return 0;
}

/* The buffers of the file path, made at its first use. */
static int file_path_ready(ctxs_session *s)
{
    if (!s->file_written &&
        !(s->file_written = ctxs__calloc(s->lay.n_layers, sizeof(*s->file_written))))
        return CTXS_ENOMEM;
    if (!s->bounce &&
        !(s->bounce = ctxs__malloc(BOUNCE_BYTES + BOUNCE_BYTES / s->lay.slot_bytes * 4)))
        return CTXS_ENOMEM;
    return 0;
}

/* Slots [slot, slot + c) of one run from tokens t.. of the source: into
 * the file at their offsets, elements then (Q8) scales. Where the engine's
 * bytes are the stored ones and lie contiguous, they are written from
 * where they are. */
static int put_run_chunk(ctxs_session *s, const ctxs__kv_src *src, uint32_t kind, uint32_t l,
                         uint32_t rel, uint32_t h, uint32_t t, uint32_t slot, uint32_t c)
{
    const ctxs__file_layout *lay = &s->lay;
    const size_t sb = lay->slot_bytes;
    const uint64_t run = ((uint64_t)l * 2 + kind) * lay->n_kv_heads + h;
    const int own = src->dtype == s->model.geometry.dtype;
    float *scales = (float *)(void *)(s->bounce + BOUNCE_BYTES);
    const uint8_t *elems = src_head(s, src, kind, rel, t, h);
    const uint8_t *scale_from = (const uint8_t *)scales;
    if (own && (c == 1 || src->token_stride == sb)) {
        /* Elements as they are; a Q8 token's scales beside them, gathered
         * where they are not contiguous. */
        const uint8_t *sc = src_scale(src, kind, rel, t, h);
        if (sc && (c == 1 || src->scale_token_stride == 4))
            scale_from = sc;
        else
            for (uint32_t j = 0; sc && j < c; j++)
                memcpy(scales + j, src_scale(src, kind, rel, t + j, h), 4);
    } else {
        for (uint32_t j = 0; j < c; j++) {
            int rc = ctxs__head_encode(s, s->bounce + j * sb, lay->scales_bytes ? scales + j : NULL,
                                       src_head(s, src, kind, rel, t + j, h),
                                       src_scale(src, kind, rel, t + j, h), src->dtype);
            if (rc < 0)
                return rc;
        }
        elems = s->bounce;
    }
    int rc = ctxs__write_exact(s->fd, elems, c * sb,
                               (off_t)(lay->kv_off + run * lay->head_stride + (uint64_t)slot * sb));
    if (rc == 0 && lay->scales_bytes)
        rc = ctxs__write_exact(s->fd, scale_from, c * 4u,
                               (off_t)(lay->scales_off + run * lay->scales_stride +
                                       (uint64_t)slot * 4u));
    return rc;
}

/* Through the file: a run at a time, in chunks of the staging buffer. */
static int put_through_file(ctxs_session *s, const ctxs__span *spans, uint32_t n_spans,
                            uint32_t l0, uint32_t l1, const ctxs__kv_src *src)
{
    int rc = file_path_ready(s);
    if (rc < 0)
        return rc;
    const ctxs__file_layout *lay = &s->lay;
    const uint32_t chunk = BOUNCE_BYTES / lay->slot_bytes;
    /* Before the first write: a pass that begins after this stamp maps
     * these pages writable again, one that began before may not have. */
    uint64_t stamp = atomic_fetch_add(&s->stamp, 1) + 1;
    for (uint32_t l = l0; l < l1; l++)
        s->file_written[l] = stamp;
    for (uint32_t l = l0; l < l1; l++)
        for (uint32_t kind = 0; kind < 2; kind++)
            for (uint32_t h = 0; h < lay->n_kv_heads; h++) {
                uint32_t t = 0;
                for (uint32_t i = 0; i < n_spans; i++)
                    for (uint32_t done = 0; done < spans[i].count;) {
                        uint32_t c = spans[i].count - done < chunk ? spans[i].count - done : chunk;
                        if ((rc = put_run_chunk(s, src, kind, l, l - l0, h, t, spans[i].slot + done,
                                                c)) < 0)
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
    ctxs__span spans[2];
    uint32_t n_spans = ctxs__slot_spans(spans, pos, n, s->lay.capacity, s->lay.n_sink);
    int mapped = ctxs__write_path_force ? ctxs__write_path_force == 1
                                        : ctxs__kv_writable(s, pos, pos + n, l0, l1,
                                                            CTXS__ASK_OWNER);
    return mapped ? put_mapped(s, spans, n_spans, l0, l1, src)
                  : put_through_file(s, spans, n_spans, l0, l1, src);
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
        return CTXS_EINVAL;
    *pos = r->first_pos + i;
    return 0;
}

int ctxs_session_write_layer(ctxs_session *s, const ctxs_reservation *r, uint32_t layer,
                             uint32_t i, uint32_t n, const void *k, const void *v, uint32_t dtype)
{
    CTXS__CHECK(s && r && k && v && layer < s->lay.n_layers &&
                ctxs__src_dtype_ok(dtype, s->model.geometry.dtype));
    uint64_t pos;
    int rc = reserved_range(&pos, s, r, i, n);
    if (rc < 0)
        return rc;
    if ((rc = ctxs__writable(s)) < 0)
        return rc;
    const ctxs__file_layout *lay = &s->lay;
    const size_t elems = (size_t)n * lay->n_kv_heads * lay->head_dim;
    const int scales = dtype == CTXS_DTYPE_Q8; /* the session's own Q8 */
    const ctxs__kv_src src = {
        .k = k,
        .v = v,
        .k_scales = scales ? (const uint8_t *)k + elems : NULL,
        .v_scales = scales ? (const uint8_t *)v + elems : NULL,
        .dtype = dtype,
        .token_stride = (size_t)lay->n_kv_heads * lay->head_dim * src_elem_bytes(dtype),
        .scale_token_stride = (size_t)lay->n_kv_heads * 4,
    };
    return ctxs__kv_put(s, pos, n, layer, layer + 1, &src);
}

int ctxs_session_write_token(ctxs_session *s, const ctxs_reservation *r, uint32_t i,
                             const void *k, const void *v, uint32_t dtype)
{
    CTXS__CHECK(s && r && k && v && ctxs__src_dtype_ok(dtype, s->model.geometry.dtype));
    uint64_t pos;
    int rc = reserved_range(&pos, s, r, i, 1);
    if (rc < 0)
        return rc;
    if ((rc = ctxs__writable(s)) < 0)
        return rc;
    const ctxs__file_layout *lay = &s->lay;
    const size_t elems = (size_t)lay->n_layers * lay->n_kv_heads * lay->head_dim;
    const int scales = dtype == CTXS_DTYPE_Q8;
    const ctxs__kv_src src = {
        .k = k,
        .v = v,
        .k_scales = scales ? (const uint8_t *)k + elems : NULL,
        .v_scales = scales ? (const uint8_t *)v + elems : NULL,
        .dtype = dtype,
        .layer_stride = (size_t)lay->n_kv_heads * lay->head_dim * src_elem_bytes(dtype),
        .scale_layer_stride = (size_t)lay->n_kv_heads * 4,
    };
    return ctxs__kv_put(s, pos, 1, 0, lay->n_layers, &src);
}
