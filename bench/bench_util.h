/*
 * What the benchmarks share: their scratch directory on a real disk and its
 * removal on a signal, dying with a message (and the directory removed),
 * command-line options, timing, samples and their summary, the table of
 * results and its notes, K/V-like data, and the start of each --json line.
 */
#ifndef CTXS_BENCH_UTIL_H
#define CTXS_BENCH_UTIL_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "bench_shared.h"
#include "ctxstore.h"

/* Each benchmark defines its name, for messages. */
extern const char *const bench_program;

/* --- Scratch directory and signals ---------------------------------------- */

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
/* memory_fs(), or die() when statfs fails. */
int is_memory_fs(const char *dir);

/* Creates g_dir, <parent>/<prefix>.XXXXXX under pick_parent_dir(dir_option),
 * and opens g_dir_fd; dies on failure. */
void make_scratch_dir(const char *dir_option, const char *prefix);

/* out (PATH_MAX bytes) = g_dir/name, or die. */
void scratch_path(char *out, const char *name);

/* scratch_path(), and out becomes one of the files that
 * remove_scratch_files() removes. out must live until the program exits (a
 * static buffer), at most 16 of them. */
void scratch_file(char *out, const char *name);

/* Unlinks every file given to scratch_file(); one that is not there is
 * skipped. Async-signal-safe. */
void remove_scratch_files(void);

/* Sends SIGINT, SIGTERM and SIGHUP to handler. */
void catch_signals(void (*handler)(int sig));

/* A handler for catch_signals(): remove_scratch_files(), rmdir(g_dir), then
 * the signal again with its default action, so that the program dies of it.
 * It calls only unlink, rmdir, signal and raise, which are async-signal-safe
 * (cleanup() is not: nftw allocates); so g_dir is left behind if it holds
 * files other than the scratch files. */
void remove_scratch_on_signal(int sig);

/* --- Options --------------------------------------------------------------- */

/* A program's parse loop tries each of its options on argv[i] in turn. Each
 * returns 1 when argv[i] is the option named, with its value in *out (and
 * *i moved past the value), else 0. An option whose value is missing is not
 * taken, so that it ends in unknown_option(). */
int flag_option(const char *arg, const char *name, int *out);
int string_option(int argc, char **argv, int *i, const char *name,
                  const char **out);
/* The value as parse_count() reads it: dies unless it is in [lo, hi]. */
int count_option(int argc, char **argv, int *i, const char *name,
                 uint32_t lo, uint32_t hi, uint32_t *out);

/* The contexts (token counts) to measure: the first n of contexts, or only
 * --tokens N where it was given (only_tokens, then put in contexts[0]).
 * Returns how many. */
int pick_contexts(uint32_t *contexts, int n, uint32_t only_tokens);

/* arg is none of the program's options: --help or -h prints usage on
 * stdout and exits 0, anything else prints it on stderr and exits 2. */
_Noreturn void unknown_option(const char *arg, void (*usage)(FILE *f));

/* The value of a numeric option, in [lo, hi], or die naming the option. */
uint32_t parse_count(const char *value, const char *option, uint32_t lo,
                     uint32_t hi);

/* --- Timing ---------------------------------------------------------------- */

/* Writes back everything dirty, so that a timed block starts with a clean
 * page cache and pays only for its own writeback. */
void settle_disk(void);

/* write_full(), or die() naming what. */
void write_all(int fd, const uint8_t *p, size_t n, const char *what);

double now_us(void);

/* Sleeps ms milliseconds, through interruptions by signals. */
void pause_ms(unsigned ms);

/* --- Samples and results --------------------------------------------------- */

/* The timings of one measurement, in microseconds; it grows as they come.
 * { 0 } is empty. */
typedef struct samples {
    double *us;
    size_t n, cap;
} samples;

void samples_add(samples *s, double us);
/* Frees the timings and leaves s empty, ready for more. */
void samples_free(samples *s);
/* A sorted copy of the timings of s (not empty), which the caller frees. */
double *samples_sorted(const samples *s);

/* The median of n sorted values (n > 0): the mean of the middle two when n
 * is even. */
double median_of_sorted(const double *v, size_t n);

/* One measurement: what the row of every program's table begins with. */
typedef struct bench_result {
    const char *op;
    const char *method;
    uint32_t tokens;
    size_t n; /* samples */
    double median_us, min_us, max_us;
} bench_result;

/* op, method and tokens, with the median, min and max of s; dies when s is
 * empty. */
bench_result summarize(const char *op, const char *method, uint32_t tokens,
                       const samples *s);

/* A program's results, in an array of its own row type. Each row begins with
 * a bench_result, the program's own fields after it, so that one add, find
 * and sort serve every program. */
typedef struct result_table {
    void *rows;
    size_t row_size;
    size_t n, cap;
} result_table;

/* A result_table over the array rows[], empty. */
#define RESULT_TABLE(rows) \
    { (rows), sizeof (rows)[0], 0, sizeof (rows) / sizeof (rows)[0] }

/* Appends a row: summarize(op, method, tokens, s), the program's fields
 * zero. Returns the row; dies when the table is full. */
void *results_add(result_table *t, const char *op, const char *method,
                  uint32_t tokens, const samples *s);

/* The row of op, method and tokens; NULL if there is none. */
void *results_find(const result_table *t, const char *op,
                   const char *method, uint32_t tokens);

/* Sorts the rows by op in the order of ops, then by tokens, then by method
 * in the order of methods (by name where methods is NULL); a name not
 * listed goes after those listed. */
/* name's place in list (n when it is not there), and the order of a and b
 * by their places (-1, 0, 1); the order of two counts. For qsort()
 * comparisons of rows by several keys. */
size_t list_rank(const char *const *list, size_t n, const char *name);
int order_rank(const char *const *list, size_t n, const char *a, const char *b);
int order_u64(uint64_t a, uint64_t b);

void results_sort(result_table *t, const char *const *ops, size_t n_ops,
                  const char *const *methods, size_t n_methods);

/* Notes for under the table (or stderr, with --json): what was skipped, or
 * what the numbers depend on. Past 24 of them, more are dropped. */
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
void add_note(const char *fmt, ...);

/* Each note on its own line, "note: " first. */
void print_notes(FILE *f);

/* --json: starts one measurement's object, on stdout,
 *   {"op":"...","method":"...","tokens":N,"median_us":M,"min_us":A,"max_us":B
 * without its closing brace: each program adds its own fields, then "}\n".
 * op and method are the program's own identifiers and are not escaped. */
void json_result_begin(const bench_result *r);

/* --- K/V-like data --------------------------------------------------------- */

/* Valid fp16 values in [1, 2), random mantissas; n is a multiple of 8. */
void fill_fp16(uint8_t *p, size_t n, uint64_t *seed);
/* Valid fp16 values of either sign in [0.5, 1), random mantissas; n is a
 * multiple of 8. */
void fill_fp16_signed(uint8_t *p, size_t n, uint64_t *seed);

/* Where the K or V of one (layer, head) begins in lay: run number
 * (layer * 2 + kind) * n_kv_heads + head, kind 0 for K and 1 for V, the
 * order in which the benchmarks keep and fill their K/V. */
uint8_t *kv_run(const ctxs_layout *lay, uint32_t n_kv_heads, uint32_t run);

/* ctxs_session_get_layout(), or die; dies also unless its slots are slot_bytes
 * wide (the geometry the program was written for). */
void get_layout(ctxs_layout *out, ctxs_session *s, size_t slot_bytes);

/* --- The end of a run ----------------------------------------------------- */

typedef struct run_end {
    int progress, json;
    void *rows;           /* n rows of size bytes, in cmp's order once sorted */
    size_t n, size;
    int (*cmp)(const void *a, const void *b);
    void (*print_json)(void);
    void (*print_text)(const uint32_t *contexts, int n_contexts);
    const uint32_t *contexts;
    int n_contexts;
    double t0;            /* now_us() when the measurements began */
} run_end;

/* The end of main(): the progress line cleared (e->progress), the rows
 * sorted, then printed as JSON lines with the notes on stderr (e->json),
 * or as text with the total run time; the scratch files removed. Returns
 * main's exit status, 0. */
int finish_run(const run_end *e);

#endif
