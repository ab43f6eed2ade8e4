/*
 * XXH3-64 with a seed, four inputs at a time (xxh3_lanes.h).
 *
 * A commit hashes each token's slots one call at a time, each seeded with
 * that token's chain so far (docs/FORMAT.md, "Checksums"). Each call is a
 * short dependent sequence: the secret derived from the seed, then one
 * 64-byte stripe after another into the same accumulator, then the merge.
 * The chains of different tokens do not depend on each other, so advancing
 * four of them stripe by stripe keeps the vector units busy where one
 * waited on itself: for the 36,864 slots of 256 bytes of a 64-token turn of
 * Qwen3-4B, 0.54 ms with AVX-512 where xxHash's own call took 0.85 ms.
 *
 * The values are XXH3's (test format/xxh3_lanes_equal_xxhash checks every
 * length against the library): the long-input algorithm of xxHash 0.8 for
 * inputs of one block (241 to 1024 bytes, so no scramble step), with the
 * default secret taken from the library once. The functions carry target
 * attributes, so the file builds with the baseline flags and the kernel is
 * chosen at run time.
 */
#include "xxh3_lanes.h"

#include <pthread.h>
#include <string.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_generateSecret_fromSeed */
#include <xxhash.h>

#define SECRET_BYTES 192u
#define STRIPE 64u
#define LAST_STRIPE_KEY (SECRET_BYTES - STRIPE - 7u)
#define MERGE_KEY 11u

#define PRIME32_1 0x9E3779B1u
#define PRIME32_2 0x85EBCA77u
#define PRIME32_3 0xC2B2AE3Du
#define PRIME64_1 0x9E3779B185EBCA87ull
#define PRIME64_2 0xC2B2AE3D27D4EB4Full
#define PRIME64_3 0x165667B19E3779F9ull
#define PRIME64_4 0x85EBCA77C2B2AE63ull
#define PRIME64_5 0x27D4EB2F165667C5ull

static const uint64_t init_acc[8] = {PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3,
                                     PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1};

/* XXH3's default secret, the one a seed of 0 derives. */
static _Alignas(64) uint8_t default_secret[SECRET_BYTES];

static uint64_t read64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8); /* XXH3 reads little-endian; the kernels are x86 only */
    return v;
}

static uint64_t mul128_fold64(uint64_t a, uint64_t b)
{
    __uint128_t p = (__uint128_t)a * b;
    return (uint64_t)p ^ (uint64_t)(p >> 64);
}

/* The end of XXH3's long hash: the eight accumulators folded with the
 * secret, the length, and the final avalanche. */
static uint64_t merge(const uint64_t acc[8], const uint8_t *secret, size_t len)
{
    uint64_t h = (uint64_t)len * PRIME64_1;
    for (int i = 0; i < 4; i++)
        h += mul128_fold64(acc[2 * i] ^ read64(secret + 16 * i),
                           acc[2 * i + 1] ^ read64(secret + 16 * i + 8));
    h ^= h >> 37;
    h *= 0x165667919E3779F9ull;
    return h ^ (h >> 32);
}

#if defined(__x86_64__)
#include <immintrin.h>

/* A seed's secret is the default one with the seed added to its even
 * 64-bit words and subtracted from its odd ones. Stripe k reads the words
 * from k on, so its key is computed where it is used; the last stripe and
 * the merge read the secret at offsets that are not multiples of 8, from a
 * copy stored first. */

/* --- AVX-512: a lane's accumulators are one zmm ------------------------- */

#define A5 static inline __attribute__((always_inline, target("avx512f")))

A5 __m512i avx512_stripe(__m512i acc, const uint8_t *in, __m512i key)
{
    const __m512i data = _mm512_loadu_si512(in);
    const __m512i data_key = _mm512_xor_si512(data, key);
    const __m512i key_hi = _mm512_shuffle_epi32(data_key, (_MM_PERM_ENUM)_MM_SHUFFLE(0, 3, 0, 1));
    const __m512i product = _mm512_mul_epu32(data_key, key_hi);
    const __m512i swapped = _mm512_shuffle_epi32(data, (_MM_PERM_ENUM)_MM_SHUFFLE(1, 0, 3, 2));
    return _mm512_add_epi64(product, _mm512_add_epi64(acc, swapped));
}

__attribute__((target("avx512f"))) static void xxh3_lanes_avx512(uint64_t h[4],
                                                                  const uint8_t *const in[4],
                                                                  size_t len)
{
    _Alignas(64) uint8_t secret[4][SECRET_BYTES];
    _Alignas(64) uint64_t acc_out[8];
    __m512i acc[4], even[4], odd[4];
    const size_t n_stripes = (len - 1) / STRIPE;
    for (int j = 0; j < 4; j++) {
        const long long s = (long long)h[j], minus_s = (long long)(0 - h[j]);
        even[j] = _mm512_mask_set1_epi64(_mm512_set1_epi64(s), 0xAA, minus_s);
        odd[j] = _mm512_mask_set1_epi64(_mm512_set1_epi64(minus_s), 0xAA, s);
        for (unsigned i = 0; i < SECRET_BYTES; i += 64)
            _mm512_store_si512(secret[j] + i,
                               _mm512_add_epi64(_mm512_load_si512(default_secret + i), even[j]));
        acc[j] = _mm512_loadu_si512(init_acc);
    }
    for (size_t k = 0; k < n_stripes; k++) {
        const __m512i base = _mm512_loadu_si512(default_secret + 8 * k);
        for (int j = 0; j < 4; j++)
            acc[j] = avx512_stripe(acc[j], in[j] + STRIPE * k,
                                   _mm512_add_epi64(base, k % 2 ? odd[j] : even[j]));
    }
    for (int j = 0; j < 4; j++) {
        acc[j] = avx512_stripe(acc[j], in[j] + len - STRIPE,
                               _mm512_loadu_si512(secret[j] + LAST_STRIPE_KEY));
        _mm512_store_si512(acc_out, acc[j]);
        h[j] = merge(acc_out, secret[j] + MERGE_KEY, len);
    }
}

/* --- AVX2: a lane's accumulators are two ymm ---------------------------- */

#define A2 static inline __attribute__((always_inline, target("avx2")))

A2 __m256i avx2_stripe(__m256i acc, const uint8_t *in, __m256i key)
{
    const __m256i data = _mm256_loadu_si256((const __m256i *)(const void *)in);
    const __m256i data_key = _mm256_xor_si256(data, key);
    const __m256i key_hi = _mm256_shuffle_epi32(data_key, _MM_SHUFFLE(0, 3, 0, 1));
    const __m256i product = _mm256_mul_epu32(data_key, key_hi);
    const __m256i swapped = _mm256_shuffle_epi32(data, _MM_SHUFFLE(1, 0, 3, 2));
    return _mm256_add_epi64(product, _mm256_add_epi64(acc, swapped));
}

A2 __m256i avx2_load(const uint8_t *p)
{
    return _mm256_loadu_si256((const __m256i *)(const void *)p);
}

__attribute__((target("avx2"))) static void xxh3_lanes_avx2(uint64_t h[4],
                                                             const uint8_t *const in[4],
                                                             size_t len)
{
    _Alignas(32) uint8_t secret[4][SECRET_BYTES];
    _Alignas(32) uint64_t acc_out[8];
    __m256i lo[4], hi[4], even[4], odd[4];
    const size_t n_stripes = (len - 1) / STRIPE;
    for (int j = 0; j < 4; j++) {
        const long long s = (long long)h[j], minus_s = (long long)(0 - h[j]);
        even[j] = _mm256_set_epi64x(minus_s, s, minus_s, s);
        odd[j] = _mm256_set_epi64x(s, minus_s, s, minus_s);
        for (unsigned i = 0; i < SECRET_BYTES; i += 32)
            _mm256_store_si256((__m256i *)(void *)(secret[j] + i),
                               _mm256_add_epi64(avx2_load(default_secret + i), even[j]));
        lo[j] = avx2_load((const uint8_t *)init_acc);
        hi[j] = avx2_load((const uint8_t *)(init_acc + 4));
    }
    for (size_t k = 0; k < n_stripes; k++) {
        const __m256i base_lo = avx2_load(default_secret + 8 * k);
        const __m256i base_hi = avx2_load(default_secret + 8 * k + 32);
        for (int j = 0; j < 4; j++) {
            const __m256i seed = k % 2 ? odd[j] : even[j];
            lo[j] = avx2_stripe(lo[j], in[j] + STRIPE * k, _mm256_add_epi64(base_lo, seed));
            hi[j] = avx2_stripe(hi[j], in[j] + STRIPE * k + 32, _mm256_add_epi64(base_hi, seed));
        }
    }
    for (int j = 0; j < 4; j++) {
        const uint8_t *last = in[j] + len - STRIPE, *key = secret[j] + LAST_STRIPE_KEY;
        lo[j] = avx2_stripe(lo[j], last, avx2_load(key));
        hi[j] = avx2_stripe(hi[j], last + 32, avx2_load(key + 32));
        _mm256_store_si256((__m256i *)(void *)acc_out, lo[j]);
        _mm256_store_si256((__m256i *)(void *)(acc_out + 4), hi[j]);
        h[j] = merge(acc_out, secret[j] + MERGE_KEY, len);
    }
}
#endif /* __x86_64__ */

static pthread_once_t secret_once = PTHREAD_ONCE_INIT;

static void secret_init(void)
{
    XXH3_generateSecret_fromSeed(default_secret, 0);
}

ctxs__xxh3_lanes_fn ctxs__xxh3_lanes_named(const char *isa)
{
    (void)isa;
#if defined(__x86_64__)
    /* The builtins check that the OS saves the ymm and zmm registers. */
    __builtin_cpu_init();
    ctxs__xxh3_lanes_fn fn = NULL;
    if (!strcmp(isa, "avx512") && __builtin_cpu_supports("avx512f"))
        fn = xxh3_lanes_avx512;
    else if (!strcmp(isa, "avx2") && __builtin_cpu_supports("avx2"))
        fn = xxh3_lanes_avx2;
    if (fn)
        pthread_once(&secret_once, secret_init);
    return fn;
#else
    return NULL;
#endif
}

static ctxs__xxh3_lanes_fn chosen;
static pthread_once_t chosen_once = PTHREAD_ONCE_INIT;

static void choose(void)
{
    chosen = ctxs__xxh3_lanes_named("avx512");
    if (!chosen)
        chosen = ctxs__xxh3_lanes_named("avx2");
}

ctxs__xxh3_lanes_fn ctxs__xxh3_lanes(void)
{
    pthread_once(&chosen_once, choose);
    return chosen;
}
