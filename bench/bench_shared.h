/*
 * What the benchmarks share with the demo (tools/ctxstore/demo.c): small
 * helpers that neither exit nor keep state, so that a program that reports
 * its own errors links them too. bench_util.h includes this.
 */
#ifndef CTXS_BENCH_SHARED_H
#define CTXS_BENCH_SHARED_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The next number of a xorshift64 generator; *state must not be 0. */
uint64_t xorshift64(uint64_t *state);

/* For qsort() of doubles, ascending. */
int cmp_double(const void *a, const void *b);

/* Writes all n bytes, again after EINTR and short writes: returns n,
 * fewer when a write wrote nothing, or -errno. */
ssize_t write_full(int fd, const void *buf, size_t n);

/* 1 when dir is on a memory file system (tmpfs, ramfs), where fdatasync
 * costs nothing; 0 when not; -errno when statfs fails. */
int memory_fs(const char *dir);

#endif
