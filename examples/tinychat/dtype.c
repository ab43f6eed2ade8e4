/*
 * The forms K and V are stored in: IEEE binary16 and bfloat16 conversions,
 * our own so that the rounding is the same on every host and compiler (no
 * F16C or _Float16 needed): round to nearest, ties to even, as the hardware
 * converters do; and the Q8 quantizer of a head, as ctxstore.h's ctxs_dtype
 * spells it out, so that what tinychat stores in the mapping is what
 * ctxs_session_write_token() would store from the same floats.
 */
#include <math.h>
#include <string.h>

#include "tinychat.h"

uint16_t tinychat_f32_to_f16(float f)
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
        /* Subnormal half (or zero): the value is man' * 2^-24 with the
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

float tinychat_f16_to_f32(uint16_t h)
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

uint16_t tinychat_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it one, and quiet */
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u); /* ties to even; may carry to infinity */
    return (uint16_t)(x >> 16);
}

float tinychat_bf16_to_f32(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* x * (127 / amax) rather than x / scale: the header's formula, and one
 * rounding fewer. rintf rounds ties to even in the default rounding mode,
 * which nothing here changes; with -ffp-contract=off the product is
 * rounded to float before rintf sees it, as in the library. */
float tinychat_q8_quantize(int8_t *q, const float *x, uint32_t n)
{
    float amax = 0.0f;
    for (uint32_t i = 0; i < n; i++) {
        if (!isfinite(x[i]))
            return -1.0f;
        const float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    if (amax == 0.0f) {
        memset(q, 0, n);
        return 0.0f;
    }
    const float inv = 127.0f / amax;
    for (uint32_t i = 0; i < n; i++) {
        const float r = rintf(x[i] * inv);
        q[i] = (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : r);
    }
    return amax / 127.0f;
}
