/*
 * Element conversions and the Q8 quantizer (see dtype.h).
 */
#include "dtype.h"

#include <math.h>

uint32_t ctxs__dtype_bytes(uint32_t dtype)
{
    switch (dtype) {
    case CTXS_DTYPE_F16:
    case CTXS_DTYPE_BF16:
        return 2;
    case CTXS_DTYPE_Q8:
        return 1;
    default:
        return 0;
    }
}

uint16_t ctxs__f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t exp = (x >> 23) & 0xffu;
    uint32_t man = x & 0x7fffffu;

    if (exp == 0xffu) /* infinity, or NaN kept quiet and non-zero */
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 31) /* too big even before rounding */
        return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {
        /* Subnormal half (or zero): the value is man * 2^-24 with the
         * implicit bit made explicit; shift it into place and round. */
        if (e < -10)
            return sign; /* below half the smallest subnormal: zero */
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - e); /* 14..24 */
        uint32_t h = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u)))
            h++; /* may carry into the smallest normal: still right */
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++; /* a carry into the exponent is right, up to infinity */
    return (uint16_t)(sign | h);
}

float ctxs__f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t x;
    if (exp == 0x1fu) {
        x = sign | 0x7f800000u | (man << 13);
    } else if (exp) {
        x = sign | ((exp - 15 + 127) << 23) | (man << 13);
    } else if (man) {
        /* Subnormal: normalize. */
        int e = -14;
        while (!(man & 0x400u)) {
            man <<= 1;
            e--;
        }
        x = sign | ((uint32_t)(e + 127) << 23) | ((man & 0x3ffu) << 13);
    } else {
        x = sign;
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

uint16_t ctxs__f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it one, quiet */
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u); /* ties to even; may carry to inf */
    return (uint16_t)(x >> 16);
}

float ctxs__q8_quantize(int8_t *q, const float *x, uint32_t n)
{
    float amax = 0.0f;
    for (uint32_t i = 0; i < n; i++) {
        if (!isfinite(x[i]))
            return -1.0f;
        float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    if (amax == 0.0f) {
        memset(q, 0, n);
        return 0.0f;
    }
    float inv = 127.0f / amax;
    int tiny = !isfinite(inv); /* amax below ~3.7e-37: 127 / amax overflows */
    for (uint32_t i = 0; i < n; i++) {
        /* The default rounding mode: ties to even. */
        float r = tiny ? rintf(x[i] / amax * 127.0f) : rintf(x[i] * inv);
        q[i] = (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : r);
    }
    return amax / 127.0f;
}

void ctxs__widen(float *out, const void *in, uint32_t src_dtype, size_t n)
{
    const uint16_t *h = in;
    switch (src_dtype) {
    case CTXS_DTYPE_F32:
        memcpy(out, in, n * sizeof(float));
        break;
    case CTXS_DTYPE_F16:
        for (size_t i = 0; i < n; i++)
            out[i] = ctxs__f16_to_f32(h[i]);
        break;
    case CTXS_DTYPE_BF16:
        for (size_t i = 0; i < n; i++)
            out[i] = ctxs__bf16_to_f32(h[i]);
        break;
    }
}

void ctxs__narrow(void *out, const float *in, uint32_t dst_dtype, size_t n)
{
    uint16_t *h = out;
    switch (dst_dtype) {
    case CTXS_DTYPE_F32:
        memcpy(out, in, n * sizeof(float));
        break;
    case CTXS_DTYPE_F16:
        for (size_t i = 0; i < n; i++)
            h[i] = ctxs__f32_to_f16(in[i]);
        break;
    case CTXS_DTYPE_BF16:
        for (size_t i = 0; i < n; i++)
            h[i] = ctxs__f32_to_bf16(in[i]);
        break;
    }
}
