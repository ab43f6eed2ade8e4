/*
 * The element types K and V are stored and handed over in (ctxs_dtype), and
 * the conversions between them: our own, so that rounding is the same on
 * every host and compiler (round to nearest, ties to even, as hardware
 * converters do), and the Q8 quantizer that ctxs_dtype describes.
 */
#ifndef CTXS_STORE_DTYPE_H
#define CTXS_STORE_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ctxstore.h"

/* Bytes of one element of a session dtype (F16, BF16, Q8), 0 otherwise. */
uint32_t ctxs__dtype_bytes(uint32_t dtype);

/* 1 when a session of dtype keeps a scale table (Q8). */
static inline int ctxs__dtype_has_scales(uint32_t dtype)
{
    return dtype == CTXS_DTYPE_Q8;
}

uint16_t ctxs__f32_to_f16(float f);
float ctxs__f16_to_f32(uint16_t h);
uint16_t ctxs__f32_to_bf16(float f);

static inline float ctxs__bf16_to_f32(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* Quantizes the n floats of one (token, head) into q and returns the scale
 * (see ctxs_dtype); -1 when one of them is not finite. */
float ctxs__q8_quantize(int8_t *q, const float *x, uint32_t n);

/* n elements of the float forms F32, F16 or BF16 (src_dtype) converted to
 * float32. */
void ctxs__widen(float *out, const void *in, uint32_t src_dtype, size_t n);

/* n floats converted to F32, F16 or BF16 (dst_dtype). */
void ctxs__narrow(void *out, const float *in, uint32_t dst_dtype, size_t n);

#endif
