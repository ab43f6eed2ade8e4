/*
 * XXH3-64 with a seed, of four inputs of one length at once (xxh3_lanes.c):
 * the checksum chain's inner step (recover.c), where each token's chain is
 * independent of the others'.
 */
#ifndef CTXS_XXH3_LANES_H
#define CTXS_XXH3_LANES_H

#include <stddef.h>
#include <stdint.h>

/* The lengths the kernels take: XXH3's long inputs that fit in one block
 * (more than 240 bytes, at most 1 KiB; a 128-dim fp16 slot is 256). */
#define CTXS__XXH3_LANES_MIN 241u
#define CTXS__XXH3_LANES_MAX 1024u

/* h[i] = XXH3_64bits_withSeed(in[i], len, h[i]) for i < 4, for len in
 * [CTXS__XXH3_LANES_MIN, CTXS__XXH3_LANES_MAX]. */
typedef void (*ctxs__xxh3_lanes_fn)(uint64_t h[4], const uint8_t *const in[4], size_t len);

/* The kernel for this CPU (AVX-512, else AVX2, chosen at the first call),
 * or NULL where it has neither: then the callers hash one input a call. */
ctxs__xxh3_lanes_fn ctxs__xxh3_lanes(void);

/* Each kernel, for the tests; NULL where this CPU or build lacks it. */
ctxs__xxh3_lanes_fn ctxs__xxh3_lanes_named(const char *isa);

#endif
