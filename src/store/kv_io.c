/*
 * K and V in the form the engine hands them over in, and back: converted
 * element by element, or quantized to Q8 with a scale per (token, head).
 * Where the converted bytes go is the write path's (kv_write.c);
 * ctxs_session_read_token() reads a token back from the mapping.
 */
#include <math.h>

#include "internal.h"

/* One (layer, head) of a token's K or V array as the engine lays it out:
 * [n_layers][n_kv_heads][head_dim] elements of dtype, then for Q8 the
 * [n_layers][n_kv_heads] scales. */
typedef struct engine_head {
    uint8_t *elems;
    uint8_t *scale; /* Q8 only; not aligned */
} engine_head;

static engine_head engine_head_at(const void *base, const ctxs__file_layout *lay,
                                  uint32_t dtype, uint32_t layer, uint32_t head)
{
    size_t elem = dtype == CTXS_DTYPE_F32 ? 4 : ctxs__dtype_bytes(dtype);
    size_t i = (size_t)layer * lay->n_kv_heads + head;
    size_t heads = (size_t)lay->n_layers * lay->n_kv_heads;
    uint8_t *b = (uint8_t *)(uintptr_t)base;
    return (engine_head){b + i * lay->head_dim * elem,
                         b + heads * lay->head_dim * elem + i * 4};
}

static int is_float_form(uint32_t dtype)
{
    return dtype == CTXS_DTYPE_F32 || dtype == CTXS_DTYPE_F16 || dtype == CTXS_DTYPE_BF16;
}

size_t ctxs_geometry_get_token_bytes(const ctxs_geometry *g, uint32_t dtype)
{
    if (!g || g->n_layers == 0 || g->n_layers > CTXS__MAX_DIM || g->n_kv_heads == 0 ||
        g->n_kv_heads > CTXS__MAX_DIM || g->head_dim == 0 || g->head_dim > CTXS__MAX_DIM)
        return 0;
    size_t elem = dtype == CTXS_DTYPE_F32 ? 4 : ctxs__dtype_bytes(dtype);
    size_t heads = (size_t)g->n_layers * g->n_kv_heads; /* < 2^24: no overflow */
    size_t bytes = heads * g->head_dim * elem;
    return ctxs__dtype_has_scales(dtype) ? bytes + heads * 4 : bytes;
}

uint32_t ctxs_geometry_get_window(const ctxs_geometry *g, uint32_t layer)
{
    if (!g || !g->period || g->period > CTXS_SCHEDULE_MAX)
        return 0;
    return g->window[layer % g->period];
}

int ctxs_dtype_encode(void *out, float *scale, const float *in, uint32_t n, uint32_t dtype)
{
    ctxs__error_begin();
    CTXS__REQUIRE(out && in, "%s is NULL", out ? "in" : "out");
    CTXS__REQUIRE(n && n <= CTXS__MAX_DIM, "n %u is outside 1..%u", n, CTXS__MAX_DIM);
    CTXS__REQUIRE(ctxs__dtype_bytes(dtype), "dtype %u is none of CTXS_DTYPE_F16, BF16 and Q8",
                  dtype);
    CTXS__REQUIRE(scale || dtype != CTXS_DTYPE_Q8, "scale is NULL: Q8 needs somewhere to "
                  "put the head's scale");
    if (dtype != CTXS_DTYPE_Q8) {
        ctxs__narrow(out, in, dtype, n);
        return 0;
    }
    float sc = ctxs__q8_quantize(out, in, n);
    if (sc < 0.0f)
        return ctxs__error(CTXS_EINVAL, "a value is not finite: Q8 cannot quantize it");
    *scale = sc;
    return 0;
}

int ctxs__src_dtype_ok(uint32_t src_dtype, uint32_t stored)
{
    return src_dtype == stored || is_float_form(src_dtype);
}

int ctxs__head_encode(const ctxs_session *s, uint8_t *dst, float *dst_scale,
                      const uint8_t *src, const uint8_t *src_scale, uint32_t src_dtype)
{
    const ctxs__file_layout *lay = &s->lay;
    const uint32_t dtype = s->model.geometry.dtype;
    if (src_dtype == dtype) {
        memcpy(dst, src, lay->slot_bytes);
        if (ctxs__dtype_has_scales(dtype))
            memcpy(dst_scale, src_scale, 4);
        return 0;
    }
    float x[CTXS__MAX_DIM];
    ctxs__widen(x, src, src_dtype, lay->head_dim);
    return ctxs_dtype_encode(dst, dst_scale, x, lay->head_dim, dtype);
}

/* Loads one head of slot `slot` of a run into the engine's form dst_dtype. */
static void load_head(const ctxs_session *s, uint32_t layer, uint32_t kind, uint32_t head,
                      uint32_t slot, engine_head out, uint32_t dst_dtype)
{
    const ctxs__file_layout *lay = &s->lay;
    const uint32_t dtype = s->model.geometry.dtype;
    const uint8_t *src = ctxs__run(s, layer, kind, head) + (size_t)slot * lay->slot_bytes;
    if (dst_dtype == dtype) {
        memcpy(out.elems, src, lay->slot_bytes);
        if (ctxs__dtype_has_scales(dtype))
            memcpy(out.scale, ctxs__scales_run(s, layer, kind, head) + slot, 4);
        return;
    }
    float x[CTXS__MAX_DIM];
    if (dtype == CTXS_DTYPE_Q8) {
        const int8_t *q = (const int8_t *)src;
        float scale = ctxs__scales_run(s, layer, kind, head)[slot];
        for (uint32_t i = 0; i < lay->head_dim; i++)
            x[i] = scale * (float)q[i];
    } else {
        ctxs__widen(x, src, dtype, lay->head_dim);
    }
    ctxs__narrow(out.elems, x, dst_dtype, lay->head_dim);
}

int ctxs_session_read_token(void *k, void *v, const ctxs_session *s, uint64_t pos,
                            uint32_t dtype)
{
    ctxs__error_begin();
    CTXS__REQUIRE(s, "the session is NULL");
    CTXS__REQUIRE(k && v, "%s is NULL", k ? "v" : "k");
    const uint32_t stored = s->model.geometry.dtype;
    CTXS__REQUIRE(dtype == stored || dtype == CTXS_DTYPE_F32 ||
                      (is_float_form(dtype) && stored != CTXS_DTYPE_Q8),
                  "a session of %s gives K and V as CTXS_DTYPE_F32%s or its own dtype, "
                  "not as %s", ctxs__dtype_name(stored),
                  stored != CTXS_DTYPE_Q8 ? ", F16, BF16" : "", ctxs__dtype_name(dtype));
    uint32_t slot;
    int rc = ctxs_session_get_slot(&slot, s, pos);
    if (rc < 0)
        return rc;
    const ctxs__file_layout *lay = &s->lay;
    for (uint32_t l = 0; l < lay->n_layers; l++) {
        int32_t g = ctxs__layer_group(lay, l);
        /* A windowed layer keeps the window only: older positions read as
         * zeros there (their scales too). */
        if (g >= 0 && pos < ctxs__group_from(s, &s->st, (uint32_t)g)) {
            size_t elem = dtype == CTXS_DTYPE_F32 ? 4 : ctxs__dtype_bytes(dtype);
            for (uint32_t h = 0; h < lay->n_kv_heads; h++) {
                engine_head ek = engine_head_at(k, lay, dtype, l, h);
                engine_head ev = engine_head_at(v, lay, dtype, l, h);
                memset(ek.elems, 0, lay->head_dim * elem);
                memset(ev.elems, 0, lay->head_dim * elem);
                if (ctxs__dtype_has_scales(dtype)) {
                    memset(ek.scale, 0, 4);
                    memset(ev.scale, 0, 4);
                }
            }
            continue;
        }
        uint32_t ls = ctxs__layer_slot(lay, l, pos);
        for (uint32_t h = 0; h < lay->n_kv_heads; h++) {
            load_head(s, l, CTXS_K, h, ls, engine_head_at(k, lay, dtype, l, h), dtype);
            load_head(s, l, CTXS_V, h, ls, engine_head_at(v, lay, dtype, l, h), dtype);
        }
    }
    (void)slot;
    return 0;
}

int ctxs_session_get_scales(float **out, ctxs_session *s, uint32_t layer, uint32_t kind,
                            uint32_t head)
{
    ctxs__error_begin();
    CTXS__REQUIRE(out, "out is NULL");
    *out = NULL;
    int rc = ctxs__check_run(s, layer, kind, head);
    if (rc < 0)
        return rc;
    CTXS__REQUIRE(s->lay.scales_bytes, "a session of %s has no scales (only Q8 has)",
                  ctxs__dtype_name(s->model.geometry.dtype));
    *out = ctxs__scales_run(s, layer, kind, head);
    return 0;
}
