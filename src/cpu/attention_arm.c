/*
 * The attention kernel for AArch64 (Advanced SIMD, baseline there): the
 * template at the end of attention.h over a 16-lane vector of four q
 * registers, lanes 0-3, 4-7, 8-11, 12-15. fp16 to fp32 is vcvt_f32_f16,
 * bf16 a widening shift (vshll_n_u16 by 16), int8 two widenings and
 * vcvtq_f32_s32; multiply-adds are fused (vfmaq_f32). No target attribute
 * is needed: NEON and the conversions are part of every AArch64 CPU.
 */
#if defined(__aarch64__)

#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "attention.h"

#define AN static inline __attribute__((always_inline))

typedef struct {
    float32x4_t v[4];
} neon_v16;

AN neon_v16 neon_zero(void)
{
    neon_v16 r;
    for (int i = 0; i < 4; i++)
        r.v[i] = vdupq_n_f32(0.0f);
    return r;
}
AN neon_v16 neon_set1(float x)
{
    neon_v16 r;
    for (int i = 0; i < 4; i++)
        r.v[i] = vdupq_n_f32(x);
    return r;
}
AN neon_v16 neon_load(const float *p)
{
    neon_v16 r;
    for (int i = 0; i < 4; i++)
        r.v[i] = vld1q_f32(p + 4 * i);
    return r;
}
AN void neon_store(float *p, neon_v16 a)
{
    for (int i = 0; i < 4; i++)
        vst1q_f32(p + 4 * i, a.v[i]);
}
AN neon_v16 neon_half(const uint16_t *p)
{
    neon_v16 r;
    for (int i = 0; i < 4; i++)
        r.v[i] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + 4 * i)));
    return r;
}
/* bfloat16 is the high half of a float32: a widening shift by 16. */
AN neon_v16 neon_bf16(const uint16_t *p)
{
    neon_v16 r;
    for (int i = 0; i < 4; i++)
        r.v[i] = vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p + 4 * i), 16));
    return r;
}
/* int8 to float, exact: widened to 16, then 32 bits, then converted. */
AN neon_v16 neon_i8(const int8_t *p)
{
    int8x16_t x = vld1q_s8(p);
    int16x8_t lo = vmovl_s8(vget_low_s8(x)), hi = vmovl_s8(vget_high_s8(x));
    neon_v16 r;
    r.v[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)));
    r.v[1] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo)));
    r.v[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)));
    r.v[3] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi)));
    return r;
}
AN neon_v16 neon_add(neon_v16 a, neon_v16 b)
{
    for (int i = 0; i < 4; i++)
        a.v[i] = vaddq_f32(a.v[i], b.v[i]);
    return a;
}
AN neon_v16 neon_mul(neon_v16 a, neon_v16 b)
{
    for (int i = 0; i < 4; i++)
        a.v[i] = vmulq_f32(a.v[i], b.v[i]);
    return a;
}
/* a * b + c, one rounding; vfmaq_f32(acc, x, y) is acc + x * y */
AN neon_v16 neon_fma(neon_v16 a, neon_v16 b, neon_v16 c)
{
    for (int i = 0; i < 4; i++)
        c.v[i] = vfmaq_f32(c.v[i], a.v[i], b.v[i]);
    return c;
}
AN neon_v16 neon_floor(neon_v16 a)
{
    for (int i = 0; i < 4; i++)
        a.v[i] = vrndmq_f32(a.v[i]);
    return a;
}
AN neon_v16 neon_pow2i(neon_v16 n)
{
    neon_v16 r;
    for (int i = 0; i < 4; i++) {
        int32x4_t e = vaddq_s32(vcvtq_s32_f32(n.v[i]), vdupq_n_s32(127));
        r.v[i] = vreinterpretq_f32_s32(vshlq_n_s32(e, 23));
    }
    return r;
}
/* y where x >= min (false for NaN), else 0 */
AN neon_v16 neon_keep_ge(neon_v16 x, float min, neon_v16 y)
{
    neon_v16 r;
    for (int i = 0; i < 4; i++) {
        uint32x4_t k = vcgeq_f32(x.v[i], vdupq_n_f32(min));
        r.v[i] = vreinterpretq_f32_u32(vandq_u32(k, vreinterpretq_u32_f32(y.v[i])));
    }
    return r;
}
/* The tree of reduce16() in attention.c: i + 8, i + 4, i + 2, i + 1. */
AN float neon_reduce(neon_v16 a)
{
    float32x4_t s4 = vaddq_f32(vaddq_f32(a.v[0], a.v[2]), vaddq_f32(a.v[1], a.v[3]));
    float32x2_t s2 = vadd_f32(vget_low_f32(s4), vget_high_f32(s4));
    return vget_lane_f32(s2, 0) + vget_lane_f32(s2, 1);
}
AN void neon_reduce_chains(const neon_v16 *v, float *out)
{
    for (int i = 0; i < 4; i++)
        out[i] = neon_reduce(v[i]);
}
AN neon_v16 neon_max(neon_v16 a, neon_v16 b)
{
    for (int i = 0; i < 4; i++)
        a.v[i] = vmaxq_f32(a.v[i], b.v[i]);
    return a;
}
AN float neon_hmax(neon_v16 a)
{
    return vmaxvq_f32(vmaxq_f32(vmaxq_f32(a.v[0], a.v[1]), vmaxq_f32(a.v[2], a.v[3])));
}
AN float neon_lane0(neon_v16 a)
{
    return vgetq_lane_f32(a.v[0], 0);
}

#define v16 neon_v16
#define V(op) neon_##op
#define CTXS__SIMD_ATTR
#define CTXS__SIMD_FN ctxs__attn_neon
#define CTXS__SIMD_LOADN_COPY
/* 4 heads x 4 q accumulators + a row: 20 of the 32 q registers. */
#define CTXS__SIMD_TILE 4
#define CTXS__SIMD_CHAINS 4
#include "attention.h"

#else
/* ISO C forbids an empty translation unit. */
typedef int ctxs__attention_arm_unused;
#endif
