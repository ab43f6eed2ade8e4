/*
 * What the benchmarks share: their scratch directory on a real disk, dying
 * with a message (and the directory removed), timing, K/V-like data, and
 * the start of each --json line.
 */
#ifndef CTXS_BENCH_UTIL_H
#define CTXS_BENCH_UTIL_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

/* Each benchmark defines its name, for messages. */
extern const char *const bench_program;

/* The directory this run created (empty until then), and a descriptor of
 * it for syncfs. */
extern char g_dir[PATH_MAX];
extern int g_dir_fd;

/* Removes g_dir and everything in it; only ever the directory this program
 * created. */
void cleanup(void);

#if defined(__GNUC__)
__attribute__((noreturn, format(printf, 1, 2)))
#endif
void die(const char *fmt, ...);

/* die() unless rc >= 0, naming what failed. */
void check_ctxs(int rc, const char *what);
void check_sys(int rc, const char *what);

void *xmalloc(size_t n);

/* Where the scratch directory goes: --dir if given, else $TMPDIR, else
 * /var/tmp; never a memory file system, where fdatasync costs nothing. */
const char *pick_parent_dir(const char *dir_option);
int is_memory_fs(const char *dir);

/* Creates g_dir, <parent>/<prefix>.XXXXXX under pick_parent_dir(dir_option),
 * and opens g_dir_fd; dies on failure. */
void make_scratch_dir(const char *dir_option, const char *prefix);

/* out (PATH_MAX bytes) = g_dir/name, or die. */
void scratch_path(char *out, const char *name);

/* The value of a numeric option, in [lo, hi], or die naming the option. */
uint32_t parse_count(const char *value, const char *option, uint32_t lo,
                     uint32_t hi);

/* Writes back everything dirty, so that a timed block starts with a clean
 * page cache and pays only for its own writeback. */
void settle_disk(void);

void write_all(int fd, const uint8_t *p, size_t n, const char *what);

double now_us(void);
int cmp_double(const void *a, const void *b);

/* --json: starts one measurement's object, on stdout,
 *   {"op":"...","method":"...","tokens":N,"median_us":M,"min_us":A,"max_us":B
 * without its closing brace: each program adds its own fields, then "}\n".
 * op and method are the program's own identifiers and are not escaped. */
void json_result_begin(const char *op, const char *method, uint32_t tokens,
                       double median_us, double min_us, double max_us);

uint64_t xorshift64(uint64_t *state);
/* Valid fp16 values in [1, 2), random mantissas; n is a multiple of 8. */
void fill_fp16(uint8_t *p, size_t n, uint64_t *seed);

#endif
