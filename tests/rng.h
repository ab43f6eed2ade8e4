/*
 * The pseudo-random numbers of the tests and the benchmarks, in one place:
 * splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
 * generators", 2014). Header-only, so that the benchmarks, which do not
 * link the tests' support library, share it.
 */
#ifndef CTXS_TESTS_RNG_H
#define CTXS_TESTS_RNG_H

#include <stdint.h>

/* The next number of the splitmix64 sequence at *state, which it advances.
 * Every state is valid; a seed is a state. */
static inline uint64_t ts_rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

#endif
