/*
 * The attention kernel for x86-64 with AVX2 + F16C + FMA, and with AVX-512F:
 * the template at the end of attention.h over a 16-lane vector, which is two
 * ymm registers for AVX2 and one zmm for AVX-512, with the conversions of
 * each element type: fp16 by F16C, bf16 by a zero extension and a 16-bit
 * shift, int8 by a sign extension and an exact int-to-float conversion. The functions carry
 * target attributes, so the file builds with the baseline flags and
 * attention.c picks a kernel at run time from what the CPU has.
 */
#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "attention.h"

/* --- AVX2 + F16C + FMA: a 16-lane vector is two ymm ---------------------- */

#define A2 static inline __attribute__((always_inline, target("avx2,fma,f16c")))

typedef struct {
    __m256 lo, hi; /* lanes 0-7, 8-15 */
} avx2_v16;

A2 avx2_v16 avx2_zero(void)
{
    return (avx2_v16){_mm256_setzero_ps(), _mm256_setzero_ps()};
}
A2 avx2_v16 avx2_set1(float x)
{
    return (avx2_v16){_mm256_set1_ps(x), _mm256_set1_ps(x)};
}
A2 avx2_v16 avx2_load(const float *p)
{
    return (avx2_v16){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
}
A2 void avx2_store(float *p, avx2_v16 v)
{
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
}
A2 avx2_v16 avx2_half(const uint16_t *p)
{
    return (avx2_v16){_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p)),
                      _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 8)))};
}
/* bfloat16 is the high half of a float32: widened by a 16-bit shift. */
A2 avx2_v16 avx2_bf16(const uint16_t *p)
{
    __m256i lo = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
    __m256i hi = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p + 8)));
    return (avx2_v16){_mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)),
                      _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16))};
}
/* int8 to float, exact. */
A2 avx2_v16 avx2_i8(const int8_t *p)
{
    __m128i x = _mm_loadu_si128((const __m128i *)(const void *)p);
    return (avx2_v16){_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x)),
                      _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(x, 8)))};
}
A2 avx2_v16 avx2_add(avx2_v16 a, avx2_v16 b)
{
    return (avx2_v16){_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)};
}
A2 avx2_v16 avx2_mul(avx2_v16 a, avx2_v16 b)
{
    return (avx2_v16){_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)};
}
/* a * b + c, one rounding */
A2 avx2_v16 avx2_fma(avx2_v16 a, avx2_v16 b, avx2_v16 c)
{
    return (avx2_v16){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
A2 avx2_v16 avx2_floor(avx2_v16 a)
{
    return (avx2_v16){_mm256_floor_ps(a.lo), _mm256_floor_ps(a.hi)};
}
/* 2^n for integral n in [-126, 127] */
A2 avx2_v16 avx2_pow2i(avx2_v16 n)
{
    const __m256i bias = _mm256_set1_epi32(127);
    return (avx2_v16){
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n.lo), bias), 23)),
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n.hi), bias), 23))};
}
/* y where x >= min (ordered), else 0 */
A2 avx2_v16 avx2_keep_ge(avx2_v16 x, float min, avx2_v16 y)
{
    const __m256 m = _mm256_set1_ps(min);
    return (avx2_v16){_mm256_and_ps(_mm256_cmp_ps(x.lo, m, _CMP_GE_OQ), y.lo),
                      _mm256_and_ps(_mm256_cmp_ps(x.hi, m, _CMP_GE_OQ), y.hi)};
}
/* The tree of reduce16() in attention.c: i + 8, i + 4, i + 2, i + 1. */
A2 float avx2_reduce(avx2_v16 v)
{
    __m256 s8 = _mm256_add_ps(v.lo, v.hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
/* reduce() of 4 vectors, bit for bit (each sum is still lane i with i + 8,
 * then i + 4, i + 2, i + 1), with the shuffles of one tree shared by four. */
A2 void avx2_reduce_chains(const avx2_v16 *v, float *out)
{
    __m256 s8[4];
    for (int i = 0; i < 4; i++)
        s8[i] = _mm256_add_ps(v[i].lo, v[i].hi);
    /* i + 4: [a lo128, b lo128] + [a hi128, b hi128] */
    __m256 q0 = _mm256_add_ps(_mm256_permute2f128_ps(s8[0], s8[1], 0x20),
                              _mm256_permute2f128_ps(s8[0], s8[1], 0x31));
    __m256 q1 = _mm256_add_ps(_mm256_permute2f128_ps(s8[2], s8[3], 0x20),
                              _mm256_permute2f128_ps(s8[2], s8[3], 0x31));
    /* i + 2: per 128 bits [q0 0, q0 1, q1 0, q1 1] + [q0 2, q0 3, q1 2, q1 3] */
    __m256 r = _mm256_add_ps(_mm256_shuffle_ps(q0, q1, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(q0, q1, _MM_SHUFFLE(3, 2, 3, 2)));
    /* i + 1 */
    __m256 t = _mm256_add_ps(_mm256_shuffle_ps(r, r, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm256_shuffle_ps(r, r, _MM_SHUFFLE(3, 1, 3, 1)));
    float f[8];
    _mm256_storeu_ps(f, t); /* a c a c | b d b d */
    out[0] = f[0];
    out[1] = f[4];
    out[2] = f[1];
    out[3] = f[5];
}
A2 avx2_v16 avx2_max(avx2_v16 a, avx2_v16 b)
{
    return (avx2_v16){_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)};
}
A2 float avx2_hmax(avx2_v16 v)
{
    __m256 m8 = _mm256_max_ps(v.lo, v.hi);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    return _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
}
A2 float avx2_lane0(avx2_v16 v)
{
    return _mm256_cvtss_f32(v.lo);
}

#define v16 avx2_v16
#define V(op) avx2_##op
#define CTXS__SIMD_ATTR __attribute__((target("avx2,fma,f16c")))
#define CTXS__SIMD_FN ctxs__attn_avx2
#define CTXS__SIMD_LOADN_COPY
/* 4 heads x 2 ymm accumulators + a converted row fit the 16 ymm registers. */
#define CTXS__SIMD_TILE 4
#define CTXS__SIMD_CHAINS 4
#include "attention.h"

/* --- AVX-512F (+ F16C, FMA): a 16-lane vector is one zmm ----------------- */

#define A5 static inline __attribute__((always_inline, target("avx512f,avx2,fma,f16c")))

typedef __m512 avx512_v16;

A5 __m512 avx512_zero(void)
{
    return _mm512_setzero_ps();
}
A5 __m512 avx512_set1(float x)
{
    return _mm512_set1_ps(x);
}
A5 __m512 avx512_load(const float *p)
{
    return _mm512_loadu_ps(p);
}
A5 void avx512_store(float *p, __m512 v)
{
    _mm512_storeu_ps(p, v);
}
A5 __m512 avx512_loadn(const float *p, uint32_t n)
{
    return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p);
}
A5 void avx512_storen(float *p, __m512 v, uint32_t n)
{
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), v);
}
A5 __m512 avx512_half(const uint16_t *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p));
}
A5 __m512 avx512_bf16(const uint16_t *p)
{
    __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
}
A5 __m512 avx512_i8(const int8_t *p)
{
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p)));
}
A5 __m512 avx512_add(__m512 a, __m512 b)
{
    return _mm512_add_ps(a, b);
}
A5 __m512 avx512_mul(__m512 a, __m512 b)
{
    return _mm512_mul_ps(a, b);
}
A5 __m512 avx512_fma(__m512 a, __m512 b, __m512 c)
{
    return _mm512_fmadd_ps(a, b, c);
}
A5 __m512 avx512_floor(__m512 a)
{
    return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
}
A5 __m512 avx512_pow2i(__m512 n)
{
    __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
}
A5 __m512 avx512_keep_ge(__m512 x, float min, __m512 y)
{
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(min), _CMP_GE_OQ), y);
}
A5 float avx512_reduce(__m512 v)
{
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    __m256 s8 = _mm256_add_ps(lo, hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
/* reduce() of 8 vectors, bit for bit (each sum is still lane i with i + 8,
 * then i + 4, i + 2, i + 1), with the shuffles of one tree shared by eight. */
A5 void avx512_reduce_chains(const __m512 *v, float *out)
{
    __m512 p[4], q[2];
    /* i + 8: [a lo256, b lo256] + [a hi256, b hi256] */
    for (int i = 0; i < 4; i++)
        p[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xee));
    /* i + 4: 128-bit blocks 0, 2 of each + blocks 1, 3 */
    for (int i = 0; i < 2; i++)
        q[i] = _mm512_add_ps(_mm512_shuffle_f32x4(p[2 * i], p[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(p[2 * i], p[2 * i + 1], 0xdd));
    /* i + 2, then i + 1, within each 128-bit block */
    __m512 r = _mm512_add_ps(_mm512_shuffle_ps(q[0], q[1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(q[0], q[1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 t = _mm512_add_ps(_mm512_shuffle_ps(r, r, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_ps(r, r, _MM_SHUFFLE(3, 1, 3, 1)));
    float f[16];
    _mm512_storeu_ps(f, t); /* per 128-bit block k: v[k], v[k + 4], twice */
    for (int k = 0; k < 4; k++) {
        out[k] = f[4 * k];
        out[k + 4] = f[4 * k + 1];
    }
}
A5 __m512 avx512_max(__m512 a, __m512 b)
{
    return _mm512_max_ps(a, b);
}
A5 float avx512_hmax(__m512 v)
{
    return _mm512_reduce_max_ps(v);
}
A5 float avx512_lane0(__m512 v)
{
    return _mm512_cvtss_f32(v);
}

#define v16 avx512_v16
#define V(op) avx512_##op
#define CTXS__SIMD_ATTR __attribute__((target("avx512f,avx2,fma,f16c")))
#define CTXS__SIMD_FN ctxs__attn_avx512
/* 8 heads' accumulators + a row: 9 of the 32 zmm registers. */
#define CTXS__SIMD_TILE 8
#define CTXS__SIMD_CHAINS 8
#include "attention.h"

#else
/* ISO C forbids an empty translation unit. */
typedef int ctxs__attention_x86_unused;
#endif
