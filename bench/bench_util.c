#include "bench_util.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef __linux__
#include <sys/vfs.h>
#endif

#include "ctxstore.h"

char g_dir[PATH_MAX];
int g_dir_fd = -1;

static int remove_entry(const char *path, const struct stat *st, int type,
                        struct FTW *ftw)
{
    (void)st, (void)type, (void)ftw;
    remove(path);
    return 0;
}

/* Removes the benchmark's directory: the store (thousands of session files
 * and the index) and the loose files. Only ever the directory this program
 * created. */
void cleanup(void)
{
    if (!g_dir[0])
        return;
    if (g_dir_fd >= 0)
        close(g_dir_fd);
    g_dir_fd = -1;
    nftw(g_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    g_dir[0] = '\0';
}

void die(const char *fmt, ...)
{
    va_list ap;
    fflush(stdout);
    fprintf(stderr, "%s: ", bench_program);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    cleanup();
    exit(1);
}

void check_ctxs(int rc, const char *what)
{
    if (rc < 0)
        die("%s failed: %s (%s)", what, ctxs_strerror(rc), ctxs_err_name(rc));
}

void check_sys(int rc, const char *what)
{
    if (rc < 0)
        die("%s failed: %s", what, strerror(errno));
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die("out of memory (%zu bytes)", n);
    return p;
}

/* fdatasync on tmpfs returns at once, which would flatter every method that
 * syncs (and the index, whose every write transaction syncs twice). */
int is_memory_fs(const char *dir)
{
    int rc = memory_fs(dir);
    if (rc < 0)
        die("statfs %s failed: %s", dir, strerror(-rc));
    return rc;
}

const char *pick_parent_dir(const char *dir_option)
{
    if (dir_option) {
        if (is_memory_fs(dir_option))
            die("%s is a memory file system (tmpfs); fdatasync would cost "
                "nothing there: pass --dir on a real disk", dir_option);
        return dir_option;
    }
    const char *tmp = getenv("TMPDIR");
    if (tmp && *tmp && !is_memory_fs(tmp))
        return tmp;
    if (is_memory_fs("/var/tmp"))
        die("$TMPDIR and /var/tmp are memory file systems: pass --dir on a "
            "real disk");
    return "/var/tmp";
}

void make_scratch_dir(const char *dir_option, const char *prefix)
{
    const char *parent = pick_parent_dir(dir_option);
    if (snprintf(g_dir, sizeof g_dir, "%s/%s.XXXXXX", parent, prefix)
        >= (int)sizeof g_dir)
        die("--dir path too long");
    if (!mkdtemp(g_dir)) {
        int e = errno;
        g_dir[0] = '\0';
        die("mkdtemp under %s failed: %s", parent, strerror(e));
    }
    g_dir_fd = open(g_dir, O_RDONLY | O_DIRECTORY);
    check_sys(g_dir_fd, "open scratch directory");
}

void scratch_path(char *out, const char *name)
{
    if (snprintf(out, PATH_MAX, "%s/%s", g_dir, name) >= PATH_MAX)
        die("--dir path too long");
}

/* The files remove_scratch_files() unlinks, which may run in a signal
 * handler at any moment: an entry is a whole path before the count takes
 * it in. */
static const char *g_scratch_files[16];
static volatile sig_atomic_t g_n_scratch_files;

void scratch_file(char *out, const char *name)
{
    sig_atomic_t n = g_n_scratch_files;
    if (n == (sig_atomic_t)(sizeof g_scratch_files / sizeof g_scratch_files[0]))
        die("too many scratch files");
    scratch_path(out, name);
    g_scratch_files[n] = out;
    /* Keeps the compiler from moving the path's and the entry's stores
     * after the count's. */
    atomic_signal_fence(memory_order_seq_cst);
    g_n_scratch_files = n + 1;
}

void remove_scratch_files(void)
{
    sig_atomic_t n = g_n_scratch_files;
    for (sig_atomic_t i = 0; i < n; i++)
        unlink(g_scratch_files[i]);
}

void catch_signals(void (*handler)(int sig))
{
    signal(SIGINT, handler);
    signal(SIGTERM, handler);
    signal(SIGHUP, handler);
}

void remove_scratch_on_signal(int sig)
{
    remove_scratch_files();
    if (g_dir[0])
        rmdir(g_dir);
    signal(sig, SIG_DFL);
    raise(sig);
}

int flag_option(const char *arg, const char *name, int *out)
{
    if (strcmp(arg, name))
        return 0;
    *out = 1;
    return 1;
}

int string_option(int argc, char **argv, int *i, const char *name,
                  const char **out)
{
    if (strcmp(argv[*i], name) || *i + 1 >= argc)
        return 0;
    *out = argv[++*i];
    return 1;
}

int count_option(int argc, char **argv, int *i, const char *name,
                 uint32_t lo, uint32_t hi, uint32_t *out)
{
    const char *value;
    if (!string_option(argc, argv, i, name, &value))
        return 0;
    *out = parse_count(value, name, lo, hi);
    return 1;
}

int pick_contexts(uint32_t *contexts, int n, uint32_t only_tokens)
{
    if (!only_tokens)
        return n;
    contexts[0] = only_tokens;
    return 1;
}

void unknown_option(const char *arg, void (*usage)(FILE *f))
{
    if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
        usage(stdout);
        exit(0);
    }
    usage(stderr);
    exit(2);
}

uint32_t parse_count(const char *value, const char *option, uint32_t lo,
                     uint32_t hi)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(value, &end, 10);
    if (errno || end == value || *end || v < lo || v > hi)
        die("%s wants a number from %u to %u", option, lo, hi);
    return (uint32_t)v;
}

/* Writes back everything dirty so that a timed block starts with a clean
 * page cache and pays only for its own writeback. */
void settle_disk(void)
{
#ifdef __linux__
    check_sys(syncfs(g_dir_fd), "syncfs");
#else
    sync();
#endif
}

void write_all(int fd, const uint8_t *p, size_t n, const char *what)
{
    ssize_t w = write_full(fd, p, n);
    if (w < 0 || (size_t)w < n)
        die("write %s failed: %s", what, w < 0 ? strerror((int)-w) : "short");
}

double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

void pause_ms(unsigned ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

void samples_add(samples *s, double us)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        double *bigger = realloc(s->us, cap * sizeof bigger[0]);
        if (!bigger)
            die("out of memory");
        s->us = bigger;
        s->cap = cap;
    }
    s->us[s->n++] = us;
}

void samples_free(samples *s)
{
    free(s->us);
    *s = (samples){ 0 };
}

double *samples_sorted(const samples *s)
{
    double *sorted = xmalloc(s->n * sizeof sorted[0]);
    memcpy(sorted, s->us, s->n * sizeof sorted[0]);
    qsort(sorted, s->n, sizeof sorted[0], cmp_double);
    return sorted;
}

double median_of_sorted(const double *v, size_t n)
{
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

bench_result summarize(const char *op, const char *method, uint32_t tokens,
                       const samples *s)
{
    if (s->n == 0)
        die("no samples for %s %s", op, method);
    double *sorted = samples_sorted(s);
    bench_result r = {
        .op = op,
        .method = method,
        .tokens = tokens,
        .n = s->n,
        .median_us = median_of_sorted(sorted, s->n),
        .min_us = sorted[0],
        .max_us = sorted[s->n - 1],
    };
    free(sorted);
    return r;
}

static bench_result *row_at(const result_table *t, size_t i)
{
    return (bench_result *)((unsigned char *)t->rows + i * t->row_size);
}

void *results_add(result_table *t, const char *op, const char *method,
                  uint32_t tokens, const samples *s)
{
    if (t->n == t->cap)
        die("too many results");
    bench_result *r = row_at(t, t->n);
    memset(r, 0, t->row_size);
    *r = summarize(op, method, tokens, s);
    t->n++;
    return r;
}

void *results_find(const result_table *t, const char *op,
                   const char *method, uint32_t tokens)
{
    for (size_t i = 0; i < t->n; i++) {
        bench_result *r = row_at(t, i);
        if (!strcmp(r->op, op) && !strcmp(r->method, method)
            && r->tokens == tokens)
            return r;
    }
    return NULL;
}

size_t list_rank(const char *const *list, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(list[i], name))
            return i;
    return n;
}

int order_rank(const char *const *list, size_t n, const char *a, const char *b)
{
    size_t x = list_rank(list, n, a), y = list_rank(list, n, b);
    return (x > y) - (x < y);
}

int order_u64(uint64_t a, uint64_t b)
{
    return (a > b) - (a < b);
}

/* The order of the sort in progress: qsort passes its comparison no
 * context. The programs sort once, on one thread. */
static const char *const *g_sort_ops, *const *g_sort_methods;
static size_t g_sort_n_ops, g_sort_n_methods;

static int cmp_result(const void *pa, const void *pb)
{
    const bench_result *a = pa, *b = pb;
    int d = order_rank(g_sort_ops, g_sort_n_ops, a->op, b->op);
    if (d || (d = order_u64(a->tokens, b->tokens)))
        return d;
    if (!g_sort_methods)
        return strcmp(a->method, b->method);
    return order_rank(g_sort_methods, g_sort_n_methods, a->method, b->method);
}

void results_sort(result_table *t, const char *const *ops, size_t n_ops,
                  const char *const *methods, size_t n_methods)
{
    g_sort_ops = ops;
    g_sort_n_ops = n_ops;
    g_sort_methods = methods;
    g_sort_n_methods = n_methods;
    qsort(t->rows, t->n, t->row_size, cmp_result);
}

static char g_notes[24][640];
static int g_n_notes;

void add_note(const char *fmt, ...)
{
    if (g_n_notes == (int)(sizeof g_notes / sizeof g_notes[0]))
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_notes[g_n_notes++], sizeof g_notes[0], fmt, ap);
    va_end(ap);
}

void print_notes(FILE *f)
{
    for (int i = 0; i < g_n_notes; i++)
        fprintf(f, "note: %s\n", g_notes[i]);
}

/* One line per measurement, the common fields first, so that ctxstore bench
 * passes the lines through and its readers find the same keys in every
 * program's results. */
void json_result_begin(const bench_result *r)
{
    printf("{\"op\":\"%s\",\"method\":\"%s\",\"tokens\":%u,"
           "\"median_us\":%.1f,\"min_us\":%.1f,\"max_us\":%.1f",
           r->op, r->method, r->tokens, r->median_us, r->min_us, r->max_us);
}

/* Valid fp16 values in [1, 2), four halves per 64-bit draw; n a multiple
 * of 8. */
void fill_fp16(uint8_t *p, size_t n, uint64_t *seed)
{
    for (size_t i = 0; i + 8 <= n; i += 8) {
        uint64_t w = (xorshift64(seed) & 0x03ff03ff03ff03ffull)
                     | 0x3c003c003c003c00ull;
        memcpy(p + i, &w, 8);
    }
}

void fill_fp16_signed(uint8_t *p, size_t n, uint64_t *seed)
{
    for (size_t i = 0; i + 8 <= n; i += 8) {
        uint64_t w = (xorshift64(seed) & 0x83ff83ff83ff83ffull)
                     | 0x3800380038003800ull;
        memcpy(p + i, &w, 8);
    }
}

uint8_t *kv_run(const ctxs_layout *lay, uint32_t n_kv_heads, uint32_t run)
{
    uint32_t layer = run / (2 * n_kv_heads);
    uint32_t kind = run / n_kv_heads % 2;
    uint32_t head = run % n_kv_heads;
    return (uint8_t *)lay->kv + layer * lay->layer_stride
           + kind * lay->kv_stride + head * lay->head_stride;
}

void get_layout(ctxs_layout *out, ctxs_session *s, size_t slot_bytes)
{
    check_ctxs(ctxs_session_get_layout(out, s), "ctxs_session_get_layout");
    if (out->slot_bytes != slot_bytes)
        die("ctxs_session_get_layout: slot_bytes %zu, expected %zu",
            out->slot_bytes, slot_bytes);
}

int finish_run(const run_end *e)
{
    if (e->progress)
        fputs("\r\033[K", stderr);
    qsort(e->rows, e->n, e->size, e->cmp);
    if (e->json) {
        e->print_json();
        print_notes(stderr);
    } else {
        e->print_text(e->contexts, e->n_contexts);
        printf("total run time: %.1f s\n", (now_us() - e->t0) / 1e6);
    }
    cleanup();
    return 0;
}
