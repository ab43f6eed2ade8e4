/*
 * bench_attention — what zero-copy costs the attention kernel: decode
 * attention with ctxs_attention() reading K/V straight from the session's
 * mapping, side by side with the same bytes copied into anonymous memory,
 * which is what an engine that loads the cache into its own buffers reads;
 * and what the first token after a resume waits for, against loading a
 * state file.
 *
 * KV geometry of Qwen3-4B: 36 layers, 8 KV heads, head dim 128, with 32
 * query heads (GQA 4:1). For each context (2048 and 8192 held tokens) and
 * each session dtype (f16, bf16, q8: int8 with a float32 scale per token
 * and head, half the bytes) a real session file is created in a scratch
 * directory with capacity for the context, filled with random values
 * (reserve, write through the layout, commit, sync), and its window set to
 * the whole context, so that a query reads every held token. It measures:
 *
 *   decode_step   attention of all 36 layers for one query token (the last
 *                 position, as after a resume), one ctxs_attention() call
 *                 per layer, on the calling thread, everything resident;
 *                 per dtype, all dtypes and methods interleaved in the same
 *                 rounds. GB/s counts K, V and q8's scales. bf16 and q8
 *                 rows carry speedup_vs_f16: the median of the per-round
 *                 ratios of f16's time to theirs, same method (target:
 *                 q8 >= 1.6x at 8192 tokens; each dtype through
 *                 the mapping within 5% of anonymous).
 *   layer         each of those calls alone (the median over every layer
 *                 of every timed step).
 *   first_step    the first decode step after a resume: the session is
 *                 closed, then timed from the start of the open to the end
 *                 of the step, with the think time (a sleep between the
 *                 open and the step, 0 or 1000 ms: the user reading and
 *                 typing) taken out: what is left to wait after the user
 *                 hits enter. The sleep's measured length is subtracted,
 *                 so the time is the open's plus the step's. Each row has
 *                 a cache: warm (the file wholly in the page cache, read
 *                 through first) or cold (its pages dropped with
 *                 posix_fadvise DONTNEED; both checked with mincore on a
 *                 mapping of the whole file made before the open).
 *
 * Methods for decode_step and layer:
 *
 *   mapping         the session's own layout: the kernel reads the file's
 *                   pages where they are mapped.
 *   anonymous       a copy of the KV region in a private anonymous mapping,
 *                   as malloc would give it, and a copy of the layout whose
 *                   kv points there.
 *   anonymous       (with q8's scale table copied after the KV bytes)
 *   anonymous_huge  the same with MADV_HUGEPAGE: what 2 MiB pages would
 *                   give (a diagnostic, f16 only; ctxstore's mapping uses
 *                   4 KiB pages, see docs/ARCHITECTURE.md).
 *
 * Every page of each copy is touched and one untimed step run on each
 * before timing, so all are resident. The timed steps are interleaved, the
 * order rotating every round, so that drift and noise fall on all methods
 * alike.
 *
 * Methods for first_step (f16 sessions; think 0 unless said):
 *
 *   mapping                open with the default options: the window is
 *                          brought in on a background thread (readahead
 *                          when its pages are not cached, page tables when
 *                          they are) while the step runs or the user
 *                          thinks; think 0 and 1000 ms.
 *   mapping_no_background  options.background = 0: the step faults every
 *                          page in itself, 4 KiB at a time (MADV_RANDOM).
 *   mapping_prefetch       default options, then ctxs_session_prefetch(),
 *                          which returns once the window is resident and
 *                          mapped, then the step: all three timed.
 *   read_file              the baseline, an engine that loads a state file:
 *   read_file_cold         open() + read() of the KV region's bytes, from a
 *                          plain file written once with the same bytes,
 *                          into a buffer allocated and touched beforehand
 *                          (as an engine's KV cache is), close(), then the
 *                          same step through a copy of the layout whose kv
 *                          points at the buffer. read_file_cold drops the
 *                          file's pages from the page cache first.
 *
 * The cases run interleaved, the order rotating every round. After each
 * first step the same step runs once more over the same mapping or buffer,
 * now warm: each first step is paired with it, so that the ratio to a warm
 * step is not moved by what the machine did minutes before. The page
 * faults the timed thread took itself (getrusage RUSAGE_THREAD) show what
 * the background work spared it. The targets: cold, think 0,
 * at 2048 and 8192 tokens, mapping within 1.2x read_file_cold (medians);
 * think 1000 ms at 2048 tokens, warm or cold, within 1.1x a warm step
 * (paired; at 8192: reported).
 *
 * The outputs of every step, of every method, must be bit-identical to the
 * warm decode step's through the mapping (same bytes, same kernel):
 * checked, and the program dies if one is not.
 *
 * --errors measures accuracy instead of time: see "Accuracy" below.
 *
 * Usage: bench_attention [--quick] [--tokens N] [--dtype D] [--dir DIR]
 *                        [--cpu-time] [--json]
 *        bench_attention --errors [--json]
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "ctxstore.h"

const char *const bench_program = "bench_attention";

/* --- Geometry -------------------------------------------------------------- */

enum {
    N_LAYERS = 36,
    N_KV_HEADS = 8,
    HEAD_DIM = 128,
    N_HEADS = 32, /* query heads: GQA, 4 per KV head */
    ELEM_BYTES = 2, /* fp16 */
    SLOT_BYTES = HEAD_DIM * ELEM_BYTES,
    N_RUNS = N_LAYERS * 2 * N_KV_HEADS, /* (layer, K/V, head) */
    TOKEN_BYTES = N_RUNS * SLOT_BYTES,  /* 147,456 */
    Q_FLOATS = N_HEADS * HEAD_DIM,      /* one token's query, one layer */
    N_SINK = 4,
    MIN_TOKENS = 16,
    LARGE_TOKENS = 4096, /* above: fewer repetitions */
    MAX_TOKENS = 32768,
    THINK_MS = 1000,     /* the first_step rows' think time, where not 0 */
};

enum { M_MAPPING, M_ANON, M_ANON_HUGE, N_METHODS };

/* The session dtypes of the decode rows. first_step rows are fp16. */
enum { D_F16, D_BF16, D_Q8, N_DTYPES };

static const struct {
    const char *name;
    uint32_t dtype;
    size_t slot_bytes;   /* one slot of one head */
    size_t scale_bytes;  /* per slot of one head: Q8's float32 scale */
} k_dtypes[N_DTYPES] = {
    { "f16", CTXS_DTYPE_F16, HEAD_DIM * 2, 0 },
    { "bf16", CTXS_DTYPE_BF16, HEAD_DIM * 2, 0 },
    { "q8", CTXS_DTYPE_Q8, HEAD_DIM, 4 },
};

/* The methods each dtype's decode rows have: anonymous_huge (a
 * diagnostic) for fp16 only, which keeps the 8192-token run within memory
 * (each copy of an fp16 context is 1.2 GB). */
static int dtype_methods(int d)
{
    return d == D_F16 ? N_METHODS : M_ANON_HUGE;
}

static const char *const k_method_names[N_METHODS] = {
    "mapping", "anonymous", "anonymous_huge",
};

/* --- Results --------------------------------------------------------------- */

typedef struct result {
    bench_result base; /* first, for results_add() */
    const char *dtype; /* the session's: "f16", "bf16", "q8" */
    double bytes; /* KV bytes one operation reads (with Q8's scales) */
    /* decode_step and layer of bf16 and q8: how many times faster than
     * f16 by the same method in the same round (same layer for layer): the
     * median of the per-round ratios f16 / this, and their middle half. */
    double speedup, speedup_lo, speedup_hi;
    /* Against anonymous, measured in the same round (decode_step) or the
     * same layer of the same round (layer): the median of the per-pair
     * ratios and their middle half. 0 when not paired. */
    double paired, paired_lo, paired_hi;
    /* first_step only: the sleep between the open and the step, and
     * whether the file was in the page cache ("warm", "cold"); NULL for the
     * other ops. With op, method and tokens they name a row. */
    uint32_t think_ms;
    const char *cache;
    /* first_step: the page faults the timed thread took (median), minor
     * and major; what background work did not spare it. -1: unknown. */
    double faults_minor, faults_major;
} result;

static const char *const k_ops[] = { "decode_step", "layer", "first_step" };
static const char *const k_dtype_names[] = { "f16", "bf16", "q8" };
static const char *const k_all_methods[] = {
    "mapping", "anonymous", "anonymous_huge", "mapping_no_background",
    "mapping_prefetch", "read_file", "read_file_cold",
};

static result g_result_rows[128];
static result_table g_results = RESULT_TABLE(g_result_rows);

static result *record(const char *op, const char *method, uint32_t tokens,
                      const char *dtype, const samples *s, double bytes)
{
    result *r = results_add(&g_results, op, method, tokens, s);
    r->dtype = dtype;
    r->bytes = bytes;
    return r;
}

/* results_find() with the dtype and the first_step key: think_ms and cache
 * (NULL for the ops that have none). */
static const result *find(const char *op, const char *method,
                          uint32_t tokens, const char *dtype,
                          uint32_t think_ms, const char *cache)
{
    for (size_t i = 0; i < g_results.n; i++) {
        const result *r = &g_result_rows[i];
        if (!strcmp(r->base.op, op) && !strcmp(r->base.method, method)
            && r->base.tokens == tokens && !strcmp(r->dtype, dtype)
            && r->think_ms == think_ms
            && (r->cache == cache
                || (r->cache && cache && !strcmp(r->cache, cache))))
            return r;
    }
    return NULL;
}

/* results_sort()'s order (op, tokens, method) with the dtype and the cache
 * (warm first) after tokens and the think time after the method, so that
 * each context's warm first steps come together, then its cold ones. */
static int cmp_rows(const void *pa, const void *pb)
{
    const result *a = pa, *b = pb;
    const size_t n_ops = sizeof k_ops / sizeof k_ops[0];
    const size_t n_methods = sizeof k_all_methods / sizeof k_all_methods[0];
    int ca = a->cache && !strcmp(a->cache, "cold");
    int cb = b->cache && !strcmp(b->cache, "cold");
    int d = order_rank(k_ops, n_ops, a->base.op, b->base.op);
    if (d || (d = order_u64(a->base.tokens, b->base.tokens)) ||
        (d = order_rank(k_dtype_names, N_DTYPES, a->dtype, b->dtype)) || (d = ca - cb) ||
        (d = order_rank(k_all_methods, n_methods, a->base.method, b->base.method)))
        return d;
    return order_u64(a->think_ms, b->think_ms);
}

/* The ratios a[i] / b[i] of samples taken side by side: their median and
 * quartiles go into r (a's result). Drift and noise that hit a round hit
 * both of its samples, so these are steadier than the ratio of two
 * medians. */
static void paired_ratios(double *med, double *lo, double *hi, const result *r,
                          const samples *a, const samples *b)
{
    if (a->n != b->n || a->n == 0)
        die("unpaired samples for %s %s", r->base.op, r->base.method);
    double *q = xmalloc(a->n * sizeof q[0]);
    for (size_t i = 0; i < a->n; i++)
        q[i] = b->us[i] > 0 ? a->us[i] / b->us[i] : 1;
    qsort(q, a->n, sizeof q[0], cmp_double);
    *med = median_of_sorted(q, a->n);
    *lo = q[a->n / 4];
    *hi = q[(3 * a->n) / 4];
    free(q);
}

static void record_paired(result *r, const samples *a, const samples *b)
{
    paired_ratios(&r->paired, &r->paired_lo, &r->paired_hi, r, a, b);
}

/* r's speedup over f16: the per-round ratios f16 / r. */
static void record_speedup(result *r, const samples *self, const samples *f16)
{
    paired_ratios(&r->speedup, &r->speedup_lo, &r->speedup_hi, r, f16, self);
}

/* --- Files ----------------------------------------------------------------- */

/* The session file, and the state file that read_file loads: scratch
 * files, removed on a signal. */
static char g_path[N_DTYPES][PATH_MAX]; /* one session file per dtype */
static char g_state_path[PATH_MAX];

/* --- Options --------------------------------------------------------------- */

typedef struct options {
    int json;
    int quick;
    uint32_t only_tokens; /* 0 = 2048 and 8192 */
    const char *dir;
    int progress;
    int cpu_time;         /* time warm steps in thread CPU time */
    int dtype[N_DTYPES];  /* the dtypes whose decode rows run */
    int errors;           /* --errors: the accuracy table instead */
} options;

static void usage(FILE *f)
{
    fputs("usage: bench_attention [--quick] [--tokens N] [--dtype D] [--dir DIR]\n"
          "                       [--cpu-time] [--json]\n"
          "       bench_attention --errors [--json]\n"
          "  --quick     fewer timed steps (the same contexts; no cold first\n"
          "              steps above 4096 tokens)\n"
          "  --tokens N  one context of N tokens (16..32768)\n"
          "  --dtype D   decode rows of one session dtype: f16, bf16, q8 or all\n"
          "              (default all); first_step rows run with f16\n"
          "  --errors    no timing: attention-output error against fp64 of\n"
          "              the original floats for f16, bf16, q8 (one scale per\n"
          "              token and head) and q8 with one scale per 32 elements,\n"
          "              on keys with outlier channels\n"
          "  --dir DIR   put the session file in a new directory under DIR\n"
          "              (a real disk, not tmpfs; default $TMPDIR, else /var/tmp)\n"
          "  --cpu-time  time decode_step and layer in the thread's CPU time\n"
          "              (user + system, page faults included), not wall time:\n"
          "              steadier on a busy machine; first_step stays wall time\n"
          "  --json      one JSON object per measurement on stdout\n",
          f);
}

static options parse_options(int argc, char **argv)
{
    options o = { 0 };
    const char *dtype = "all";
    for (int i = 1; i < argc; i++) {
        if (!flag_option(argv[i], "--json", &o.json)
            && !flag_option(argv[i], "--quick", &o.quick)
            && !flag_option(argv[i], "--cpu-time", &o.cpu_time)
            && !flag_option(argv[i], "--errors", &o.errors)
            && !string_option(argc, argv, &i, "--dir", &o.dir)
            && !string_option(argc, argv, &i, "--dtype", &dtype)
            && !count_option(argc, argv, &i, "--tokens", MIN_TOKENS, MAX_TOKENS,
                             &o.only_tokens))
            unknown_option(argv[i], usage);
    }
    int any = 0;
    for (int d = 0; d < N_DTYPES; d++)
        any |= o.dtype[d] = !strcmp(dtype, "all") || !strcmp(dtype, k_dtypes[d].name);
    if (!any) {
        fprintf(stderr, "bench_attention: --dtype %s: not f16, bf16, q8 or all\n", dtype);
        usage(stderr);
        exit(2);
    }
    o.progress = isatty(STDERR_FILENO);
    return o;
}

/* Repetitions, which the header prints too. A cold first step without
 * background work reads each 4 KiB page on its own (about 8 s for 2048
 * tokens on a VM's disk, 30 s for 8192), and a think time costs its sleep:
 * few of them keep the default run within a few minutes. */
typedef struct rep_counts {
    int rounds;      /* timed decode steps per method */
    int warm;        /* warm first steps, think 0 */
    int think;       /* warm first steps with a think time */
    int cold;        /* cold first steps, think 0 and with a think time */
} rep_counts;

static rep_counts reps_for(const options *o, uint32_t tokens)
{
    const int large = tokens > LARGE_TOKENS;
    rep_counts r;
    r.rounds = o->quick ? 9 : large ? 21 : 31;
    r.warm = o->quick ? 3 : 5;
    r.think = o->quick ? 2 : 3;
    r.cold = o->quick ? (large ? 0 : 1) : (large ? 1 : 3);
    return r;
}

/* --- One context ----------------------------------------------------------- */

typedef struct bench {
    const options *o;
    uint32_t tokens;
    int d;                 /* D_F16, D_BF16, D_Q8 */
    const char *path;      /* the session file */
    rep_counts n;
    ctxs_model model;
    ctxs_session *s;
    ctxs_layout lay[N_METHODS];
    uint8_t *area[N_METHODS]; /* anonymous mappings (not for M_MAPPING) */
    size_t area_bytes;
    ctxs_layout file_lay;  /* read_file: kv = file_buf */
    uint8_t *file_buf;     /* an anonymous mapping of file_buf_bytes */
    size_t file_buf_bytes;
    ctxs_attn_plan plan;
    float *q;              /* [N_LAYERS][N_HEADS][HEAD_DIM] */
    float *out[N_METHODS]; /* [N_LAYERS][N_HEADS][HEAD_DIM] */
    float *out_first;      /* a first step's, against out[M_MAPPING] */
    double step_bytes;     /* KV bytes one decode step reads */
    /* What mincore saw before the timed opens: the least share of a file
     * in the page cache before a warm one, the most before a cold one. */
    double warm_min[2], cold_max[2]; /* [0] session file, [1] state file */
} bench;

static volatile uint64_t g_sink;

static void progress(const bench *b, const char *what)
{
    if (b->o->progress)
        fprintf(stderr, "\r\033[K%u tokens, %s: %s", b->tokens, k_dtypes[b->d].name, what);
}

/* Reads one byte of every page, so that the region is resident and mapped
 * before anything is timed. */
static uint64_t touch_pages(const void *p, size_t n)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const volatile uint8_t *u = p;
    uint64_t acc = 0;
    for (size_t off = 0; off < n; off += page)
        acc += u[off];
    return acc;
}

/* The share of path's pages that the page cache holds, through a mapping
 * of its own (so that it can be asked before an open, and sees the file,
 * not what a session has mapped). */
static double file_resident_share(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    check_sys(fd, "open file for mincore");
    struct stat st;
    check_sys(fstat(fd, &st), "fstat");
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t len = (size_t)st.st_size, n = (len + page - 1) / page;
    double share = 1;
    if (n > 0) {
        void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
            die("mmap %s failed: %s", path, strerror(errno));
        unsigned char *vec = xmalloc(n);
        check_sys(mincore(p, len, vec), "mincore");
        size_t in = 0;
        for (size_t i = 0; i < n; i++)
            in += vec[i] & 1;
        free(vec);
        check_sys(munmap(p, len), "munmap");
        share = (double)in / (double)n;
    }
    check_sys(close(fd), "close");
    return share;
}

/* Drops path's pages from the page cache. They are clean (the file was
 * synced and has not been written since) and mapped nowhere (the session
 * is closed), so the kernel lets them go. */
static void drop_cached_pages(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    check_sys(fd, "open file to drop its pages");
#ifdef POSIX_FADV_DONTNEED
    int rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    if (rc)
        die("posix_fadvise(DONTNEED) failed: %s", strerror(rc));
#endif
    check_sys(close(fd), "close");
}

/* Reads fd to n bytes into p, or dies. */
static void read_all(int fd, uint8_t *p, size_t n, const char *what)
{
    while (n > 0) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            die("read %s failed: %s", what, r < 0 ? strerror(errno) : "short");
        p += r;
        n -= (size_t)r;
    }
}

/* Brings all of path into the page cache by reading it, untimed: a warm
 * first step then starts from the whole file cached, whatever ran
 * before. */
static void cache_file(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    check_sys(fd, "open file to cache it");
    static uint8_t chunk[1 << 20];
    for (;;) {
        ssize_t r = read(fd, chunk, sizeof chunk);
        if (r < 0 && errno == EINTR)
            continue;
        check_sys((int)r, "read file to cache it");
        if (r == 0)
            break;
    }
    check_sys(close(fd), "close");
}

/* Random K/V of magnitude below 1 in the first `tokens` slots of one run
 * (layer, K/V, head), written through the layout: fp16 and bf16 values
 * +-[0.5, 1), int8 in [-127, 127] with the scale 1/127. */
static void fill_run(int d, const ctxs_layout *lay, uint32_t run, uint32_t tokens,
                     uint64_t *seed)
{
    uint8_t *p = kv_run(lay, N_KV_HEADS, run);
    const size_t n = (size_t)tokens * k_dtypes[d].slot_bytes;
    if (d == D_F16) {
        fill_fp16_signed(p, n, seed);
    } else if (d == D_BF16) {
        for (size_t i = 0; i + 8 <= n; i += 8) {
            uint64_t w = (xorshift64(seed) & 0x807f807f807f807full)
                         | 0x3f003f003f003f00ull;
            memcpy(p + i, &w, 8);
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            uint8_t x = (uint8_t)xorshift64(seed);
            p[i] = x == 0x80 ? 0x81 : x; /* -128 is not a Q8 value */
        }
        /* The run's scales: run * capacity in the table (see
         * ctxs_session_get_layout()). */
        for (uint32_t t = 0; t < tokens; t++)
            lay->scales[(size_t)run * lay->capacity + t] = 1.0f / 127;
    }
}

static void open_session(bench *b, int background)
{
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.open.window = b->tokens;
    if (!background)
        o.open.background = 0;
    check_ctxs(ctxs_session_open(&b->s, b->path, &b->model, 0, &o.open),
               "ctxs_session_open");
    check_ctxs(ctxs_session_get_layout(&b->lay[M_MAPPING], b->s),
               "ctxs_session_get_layout");
    check_ctxs(ctxs_session_get_attn_plan(&b->plan, b->s, 0),
               "ctxs_session_get_attn_plan");
    if (b->plan.n_keys != b->tokens || b->plan.first_query != b->tokens - 1)
        die("ctxs_session_get_attn_plan: %u keys, first query %" PRIu64
            "; expected %u keys, query %u",
            b->plan.n_keys, b->plan.first_query, b->tokens, b->tokens - 1);
}

/* Creates the session file and fills every slot, untimed; then makes it
 * durable, so that its pages are clean (and can be dropped from the page
 * cache later) and no measurement meets its writeback. */
static void create_session(bench *b)
{
    progress(b, "filling the session");
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = b->tokens;
    o.n_sink = N_SINK;
    o.ring = 0;
    o.open.window = b->tokens; /* every held token is read */
    check_ctxs(ctxs_session_create(&b->s, b->path, &b->model, &o),
               "ctxs_session_create");
    ctxs_layout lay;
    get_layout(&lay, b->s, k_dtypes[b->d].slot_bytes);
    ctxs_reservation r;
    check_ctxs(ctxs_session_reserve(&r, b->s, b->tokens),
               "ctxs_session_reserve");
    if (r.n_spans != 1 || r.spans[0].slot != 0)
        die("ctxs_session_reserve: expected one span from slot 0");
    uint64_t seed = 0x9e3779b97f4a7c15ull ^ b->tokens;
    for (uint32_t run = 0; run < N_RUNS; run++)
        fill_run(b->d, &lay, run, b->tokens, &seed);
    uint32_t *ids = xmalloc((size_t)b->tokens * sizeof ids[0]);
    for (uint32_t i = 0; i < b->tokens; i++)
        ids[i] = (uint32_t)(xorshift64(&seed) % 151936); /* Qwen3 vocab */
    check_ctxs(ctxs_session_commit(b->s, ids, b->tokens),
               "ctxs_session_commit");
    free(ids);
    check_ctxs(ctxs_session_sync(b->s), "ctxs_session_sync");
    ctxs_session_close(b->s);
    b->s = NULL;
    settle_disk();

    /* Queries in [-1, 1). */
    b->q = xmalloc((size_t)N_LAYERS * Q_FLOATS * sizeof(float));
    for (size_t i = 0; i < (size_t)N_LAYERS * Q_FLOATS; i++)
        b->q[i] = (float)((double)(xorshift64(&seed) >> 11) / 0x1p52 - 1.0);
    for (int m = 0; m < N_METHODS; m++)
        b->out[m] = xmalloc((size_t)N_LAYERS * Q_FLOATS * sizeof(float));
    b->out_first = xmalloc((size_t)N_LAYERS * Q_FLOATS * sizeof(float));
}

/* A private anonymous mapping of at least n bytes, 2 MiB aligned (so that
 * MADV_HUGEPAGE can take effect): *base and *base_bytes are what to unmap.
 * Returns the aligned start. */
static uint8_t *map_anonymous(size_t n, uint8_t **base, size_t *base_bytes)
{
    const size_t align = 2u << 20;
    *base_bytes = n + align;
    uint8_t *a = mmap(NULL, *base_bytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED)
        die("mmap %zu anonymous bytes failed: %s", *base_bytes,
            strerror(errno));
    *base = a;
    return (uint8_t *)(((uintptr_t)a + align - 1) & ~(uintptr_t)(align - 1));
}

/* A copy of the mapping's KV region in anonymous memory and a layout
 * pointing there. */
static void make_copy(bench *b, int m, int huge)
{
    const ctxs_layout *src = &b->lay[M_MAPPING];
    /* Q8's scales after the KV bytes, on a page of their own. */
    const size_t scales_at = (src->kv_bytes + 4095) & ~(size_t)4095;
    const size_t total = src->scales ? scales_at + src->scales_bytes : src->kv_bytes;
    uint8_t *p = map_anonymous(total, &b->area[m], &b->area_bytes);
    if (huge) {
#ifdef MADV_HUGEPAGE
        if (madvise(p, src->kv_bytes, MADV_HUGEPAGE) < 0)
            add_note("madvise(MADV_HUGEPAGE) failed: %s; anonymous_huge has"
                     " the default pages", strerror(errno));
#else
        add_note("no MADV_HUGEPAGE here; anonymous_huge has the default pages");
#endif
    }
    memcpy(p, src->kv, src->kv_bytes);
    b->lay[m] = *src;
    b->lay[m].kv = p;
    if (src->scales) {
        memcpy(p + scales_at, src->scales, src->scales_bytes);
        b->lay[m].scales = (float *)(void *)(p + scales_at);
    }
}

static double cpu_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* One decode step over lay into out: every layer's attention for one query
 * token at the plan's last position. Each call's time goes to layer_us
 * (NULL: not kept). Returns the step's time in microseconds. */
static double decode_step(const bench *b, const ctxs_layout *lay, float *out,
                          double *layer_us)
{
    /* First steps wait for the disk, which only wall time sees. */
    double (*clock)(void) = b->o->cpu_time && layer_us ? cpu_us : now_us;
    ctxs_attn_query aq = {
        .pos = b->plan.first_query,
        .n = 1,
        .n_heads = N_HEADS,
        .scale = 0,
    };
    double t0 = clock(), t = t0;
    for (uint32_t l = 0; l < N_LAYERS; l++) {
        aq.q = b->q + (size_t)l * Q_FLOATS;
        int rc = ctxs_attention(out + (size_t)l * Q_FLOATS, lay, &b->plan, l,
                                &aq);
        double t1 = clock();
        check_ctxs(rc, "ctxs_attention");
        if (layer_us)
            layer_us[l] = t1 - t;
        t = t1;
    }
    return t - t0;
}

/* Anonymous huge pages the process holds, from /proc (Linux), in bytes;
 * -1 when unknown. */
static long long anon_huge_bytes(void)
{
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f)
        return -1;
    char line[256];
    long long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "AnonHugePages: %lld kB", &kb) == 1)
            break;
    fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

/* The decode steps of every dtype's session, each through the mapping and
 * its anonymous copies: all of them in every round, the order rotating,
 * so that drift and noise fall on every dtype and method alike, and the
 * ratios between dtypes are taken within a round too. */
static void measure_warm(bench *bs, int nb)
{
    typedef struct wcase {
        bench *b;
        int m;
        samples step, layer;
    } wcase;
    wcase cs[N_DTYPES * N_METHODS];
    int nc = 0;
    for (int i = 0; i < nb; i++) {
        bench *b = &bs[i];
        progress(b, "copying into anonymous memory");
        long long huge_before = anon_huge_bytes();
        make_copy(b, M_ANON, 0);
        if (dtype_methods(b->d) > M_ANON_HUGE)
            make_copy(b, M_ANON_HUGE, 1);
        long long huge_after = anon_huge_bytes();
        if (dtype_methods(b->d) > M_ANON_HUGE && huge_before >= 0 && huge_after >= 0)
            add_note("%u tokens, %s: anonymous huge pages in the copies: %lld MiB"
                     " (a copy is %zu MiB)", b->tokens, k_dtypes[b->d].name,
                     (huge_after - huge_before) >> 20,
                     b->lay[M_MAPPING].kv_bytes >> 20);

        progress(b, "warming up");
        for (int m = 0; m < dtype_methods(b->d); m++) {
            g_sink += touch_pages(b->lay[m].kv, b->lay[m].kv_bytes);
            if (b->lay[m].scales)
                g_sink += touch_pages(b->lay[m].scales, b->lay[m].scales_bytes);
            decode_step(b, &b->lay[m], b->out[m], NULL);
            cs[nc++] = (wcase){ b, m, { 0 }, { 0 } };
        }
        /* Same bytes, same kernel, same plan: the outputs must not differ
         * in a single bit. */
        for (int m = 1; m < dtype_methods(b->d); m++)
            if (memcmp(b->out[M_MAPPING], b->out[m],
                       (size_t)N_LAYERS * Q_FLOATS * sizeof(float)))
                die("%u tokens, %s: attention over %s differs from the mapping",
                    b->tokens, k_dtypes[b->d].name, k_method_names[m]);
    }

    double layer_us[N_LAYERS];
    const int rounds = bs[0].n.rounds;
    for (int round = 0; round < rounds; round++) {
        if (bs[0].o->progress && round % 4 == 0) {
            char what[64];
            snprintf(what, sizeof what, "decode steps, round %d/%d", round + 1, rounds);
            progress(&bs[0], what);
        }
        for (int i = 0; i < nc; i++) {
            wcase *c = &cs[(round + i) % nc]; /* the order rotates */
            samples_add(&c->step, decode_step(c->b, &c->b->lay[c->m], c->b->out[c->m],
                                              layer_us));
            for (int l = 0; l < N_LAYERS; l++)
                samples_add(&c->layer, layer_us[l]);
        }
    }
    for (int i = 0; i < nc; i++) {
        wcase *c = &cs[i];
        const char *dt = k_dtypes[c->b->d].name;
        /* the anonymous copy of the same dtype, and f16 by the same method */
        const wcase *anon = NULL, *f16 = NULL;
        for (int j = 0; j < nc; j++) {
            if (cs[j].b == c->b && cs[j].m == M_ANON)
                anon = &cs[j];
            if (cs[j].b->d == D_F16 && cs[j].m == c->m)
                f16 = &cs[j];
        }
        result *r = record("decode_step", k_method_names[c->m], c->b->tokens, dt,
                           &c->step, c->b->step_bytes);
        if (c->m != M_ANON)
            record_paired(r, &c->step, &anon->step);
        if (f16 && f16 != c)
            record_speedup(r, &c->step, &f16->step);
        r = record("layer", k_method_names[c->m], c->b->tokens, dt, &c->layer,
                   c->b->step_bytes / N_LAYERS);
        if (c->m != M_ANON)
            record_paired(r, &c->layer, &anon->layer);
        if (f16 && f16 != c)
            record_speedup(r, &c->layer, &f16->layer);
    }
    for (int i = 0; i < nc; i++) {
        samples_free(&cs[i].step);
        samples_free(&cs[i].layer);
    }
    for (int i = 0; i < nb; i++)
        for (int m = M_ANON; m < dtype_methods(bs[i].d); m++) {
            check_sys(munmap(bs[i].area[m], bs[i].area_bytes), "munmap copy");
            bs[i].area[m] = NULL;
        }
}

/* --- First steps ----------------------------------------------------------- */

typedef enum fs_kind {
    FS_MAPPING,       /* default options: background bring-in */
    FS_NO_BACKGROUND, /* options.background = 0 */
    FS_PREFETCH,      /* default options, then ctxs_session_prefetch() */
    FS_READ_FILE,     /* open + read the state file, step from the buffer */
} fs_kind;

typedef struct fs_case {
    const char *method;
    fs_kind kind;
    int cold;
    uint32_t think_ms;
    int reps;
    samples s;
    samples warm; /* the same step again, right after each first step */
    samples minflt, majflt; /* the timed thread's page faults */
} fs_case;

/* The state file that read_file loads: the KV region's bytes, written once
 * and synced (clean, so that its pages can be dropped), and the buffer it
 * is read into, allocated and touched once, as an engine allocates its KV
 * cache when it starts and loads a state into it. */
static void make_state_file(bench *b)
{
    progress(b, "writing the state file");
    const ctxs_layout *src = &b->lay[M_MAPPING];
    int fd = open(g_state_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    check_sys(fd, "create state file");
    write_all(fd, src->kv, src->kv_bytes, "state file");
    check_sys(fdatasync(fd), "fdatasync state file");
    check_sys(close(fd), "close state file");
    uint8_t *p = map_anonymous(src->kv_bytes, &b->file_buf,
                               &b->file_buf_bytes);
    memset(p, 0, src->kv_bytes);
    b->file_lay = *src;
    b->file_lay.kv = p;
    b->file_lay.token_ids = NULL; /* the session's, which closes */
    settle_disk();
}

/* Dies unless the step just run into b->out_first gave the warm decode
 * step's output bit for bit (same bytes, same kernel, same plan). */
static void check_output(const bench *b, const fs_case *c, const char *which)
{
    if (memcmp(b->out[M_MAPPING], b->out_first,
               (size_t)N_LAYERS * Q_FLOATS * sizeof(float)))
        die("%u tokens: %s of first_step %s (%s, think %u ms) differs from"
            " the warm decode step", b->tokens, which, c->method,
            c->cold ? "cold" : "warm", c->think_ms);
}

/* The page faults the calling thread has taken, minor and major; -1 where
 * the system does not count them per thread. */
static void thread_faults(double *minor, double *major)
{
#ifdef RUSAGE_THREAD
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru) == 0) {
        *minor = (double)ru.ru_minflt;
        *major = (double)ru.ru_majflt;
        return;
    }
#endif
    *minor = *major = -1;
}

/* The median of s, or -1 if any of its values is -1 (unknown). */
static double median_or_unknown(const samples *s)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->us[i] < 0)
            return -1;
    double *v = samples_sorted(s);
    double m = median_of_sorted(v, s->n);
    free(v);
    return m;
}

/* One first step of c: untimed, the file put in or dropped from the page
 * cache and checked with mincore; timed, the open to the end of the step,
 * less the think time's sleep. Its output must be the warm step's. Then
 * the same step once more over the same mapping or buffer, all of it now
 * resident: a warm step taken beside this one, into *warm_us, so that the
 * ratio to it is not moved by what the machine did minutes before. */
static double first_step(bench *b, fs_case *c, double *warm_us)
{
    const int file = c->kind == FS_READ_FILE;
    const char *path = file ? g_state_path : b->path;
    if (c->cold)
        drop_cached_pages(path);
    else
        cache_file(path);
    double share = file_resident_share(path);
    if (c->cold && share > b->cold_max[file])
        b->cold_max[file] = share;
    if (!c->cold && share < b->warm_min[file])
        b->warm_min[file] = share;

    double min0, maj0, min1, maj1;
    thread_faults(&min0, &maj0);
    double slept = 0, t0 = now_us();
    if (file) {
        int fd = open(g_state_path, O_RDONLY | O_CLOEXEC);
        check_sys(fd, "open state file");
        read_all(fd, b->file_lay.kv, b->file_lay.kv_bytes, "state file");
        check_sys(close(fd), "close state file");
        decode_step(b, &b->file_lay, b->out_first, NULL);
    } else {
        open_session(b, c->kind != FS_NO_BACKGROUND);
        if (c->kind == FS_PREFETCH)
            check_ctxs(ctxs_session_prefetch(b->s), "ctxs_session_prefetch");
        if (c->think_ms) {
            double ts = now_us();
            pause_ms(c->think_ms);
            slept = now_us() - ts;
        }
        decode_step(b, &b->lay[M_MAPPING], b->out_first, NULL);
    }
    double us = now_us() - t0 - slept;
    thread_faults(&min1, &maj1);
    samples_add(&c->minflt, min0 < 0 ? -1 : min1 - min0);
    samples_add(&c->majflt, maj0 < 0 ? -1 : maj1 - maj0);
    check_output(b, c, "the step");

    *warm_us = decode_step(b, file ? &b->file_lay : &b->lay[M_MAPPING],
                           b->out_first, NULL);
    check_output(b, c, "the warm step after");
    if (b->s) {
        ctxs_session_close(b->s);
        b->s = NULL;
    }
    return us;
}

static void measure_first_steps(bench *b)
{
    make_state_file(b);
    ctxs_session_close(b->s);
    b->s = NULL;

    fs_case cases[10];
    int n = 0, max_reps = 0;
    for (int cold = 0; cold <= 1; cold++) {
        int reps = cold ? b->n.cold : b->n.warm;
        int think_reps = cold ? b->n.cold : b->n.think;
        if (cold && !b->n.cold)
            break;
        cases[n++] = (fs_case){ .method = "mapping", .kind = FS_MAPPING,
                                .cold = cold, .reps = reps };
        cases[n++] = (fs_case){ .method = "mapping", .kind = FS_MAPPING,
                                .cold = cold, .think_ms = THINK_MS,
                                .reps = think_reps };
        cases[n++] = (fs_case){ .method = "mapping_no_background",
                                .kind = FS_NO_BACKGROUND, .cold = cold,
                                .reps = reps };
        cases[n++] = (fs_case){ .method = "mapping_prefetch",
                                .kind = FS_PREFETCH, .cold = cold,
                                .reps = reps };
        cases[n++] = (fs_case){ .method = cold ? "read_file_cold" : "read_file",
                                .kind = FS_READ_FILE, .cold = cold,
                                .reps = reps };
        if (reps > max_reps)
            max_reps = reps;
        if (think_reps > max_reps)
            max_reps = think_reps;
    }
    b->warm_min[0] = b->warm_min[1] = 1;
    b->cold_max[0] = b->cold_max[1] = 0;
    /* Round by round, each case that still has repetitions to run once,
     * the order rotating, so that drift falls on all alike. */
    for (int round = 0; round < max_reps; round++)
        for (int i = 0; i < n; i++) {
            fs_case *c = &cases[(round + i) % n];
            if (round >= c->reps)
                continue;
            if (b->o->progress) {
                char what[96];
                snprintf(what, sizeof what, "first_step %s, %s, think %u ms,"
                         " round %d/%d", c->method, c->cold ? "cold" : "warm",
                         c->think_ms, round + 1, c->reps);
                progress(b, what);
            }
            double warm_us;
            samples_add(&c->s, first_step(b, c, &warm_us));
            samples_add(&c->warm, warm_us);
        }
    for (int i = 0; i < n; i++) {
        result *r = record("first_step", cases[i].method, b->tokens, "f16",
                           &cases[i].s, b->step_bytes);
        r->think_ms = cases[i].think_ms;
        r->cache = cases[i].cold ? "cold" : "warm";
        record_paired(r, &cases[i].s, &cases[i].warm);
        r->faults_minor = median_or_unknown(&cases[i].minflt);
        r->faults_major = median_or_unknown(&cases[i].majflt);
        samples_free(&cases[i].s);
        samples_free(&cases[i].warm);
        samples_free(&cases[i].minflt);
        samples_free(&cases[i].majflt);
    }

    add_note("%u tokens, first_step: in the page cache before each open:"
             " warm at least %.1f%% of the session file, %.1f%% of the"
             " state file%s", b->tokens, b->warm_min[0] * 100,
             b->warm_min[1] * 100, b->n.cold ? "" : " (no cold rows)");
    if (b->n.cold)
        add_note("%u tokens, first_step: cold at most %.1f%% of the session"
                 " file, %.1f%% of the state file", b->tokens,
                 b->cold_max[0] * 100, b->cold_max[1] * 100);
    if (b->n.cold && (b->cold_max[0] > 0.05 || b->cold_max[1] > 0.05))
        add_note("%u tokens: dropping the page cache (posix_fadvise DONTNEED)"
                 " did not work: the cold rows were partly warm", b->tokens);
    if (b->warm_min[0] < 0.95 || b->warm_min[1] < 0.95)
        add_note("%u tokens: a file read through was not wholly in the page"
                 " cache before a warm row (memory pressure?)", b->tokens);

    check_sys(munmap(b->file_buf, b->file_buf_bytes), "munmap buffer");
    b->file_buf = NULL;
    check_sys(unlink(g_state_path), "unlink state file");
}

static void run_context(const options *o, uint32_t tokens)
{
    bench bs[N_DTYPES];
    int nb = 0;
    for (int d = 0; d < N_DTYPES; d++) {
        if (!o->dtype[d])
            continue;
        bench *b = &bs[nb++];
        *b = (bench){ .o = o, .tokens = tokens, .n = reps_for(o, tokens), .d = d,
                      .path = g_path[d] };
        b->model.geometry = (ctxs_geometry){ N_LAYERS, N_KV_HEADS, HEAD_DIM,
                                             k_dtypes[d].dtype, 0, { 0 } };
        memcpy(b->model.model_hash, "bench-qwen3-4b!!", 16);
        memcpy(b->model.tokenizer_hash, "bench-tokenizer!", 16);
        /* what a step reads: K and V of every held token, and Q8's scales */
        b->step_bytes = (double)N_RUNS * tokens
                        * (double)(k_dtypes[d].slot_bytes + k_dtypes[d].scale_bytes);
        create_session(b);
        open_session(b, 1);
    }
    measure_warm(bs, nb);
    for (int i = 0; i < nb; i++) {
        bench *b = &bs[i];
        if (b->d == D_F16) {
            measure_first_steps(b);
            if (!b->n.cold)
                add_note("%u tokens: cold first_step rows skipped with --quick (above"
                         " %d tokens: mapping_no_background alone reads the window"
                         " from the disk 4 KiB at a time, half a minute and more)",
                         tokens, LARGE_TOKENS);
        } else {
            ctxs_session_close(b->s);
            b->s = NULL;
        }
        check_sys(unlink(b->path), "unlink session");
        free(b->q);
        for (int m = 0; m < N_METHODS; m++)
            free(b->out[m]);
        free(b->out_first);
    }
}

/* --- Report ---------------------------------------------------------------- */

static int g_cpu_time; /* --cpu-time: first_step has no warm baseline */

/* decode_step and layer against the anonymous copy; first_step against the
 * warm decode step through the mapping (none with --cpu-time: wall time
 * against CPU time). */
static const result *baseline_of(const result *r)
{
    if (!strcmp(r->base.op, "first_step"))
        return g_cpu_time ? NULL
                          : find("decode_step", "mapping", r->base.tokens,
                                 r->dtype, 0, NULL);
    return find(r->base.op, "anonymous", r->base.tokens, r->dtype, 0, NULL);
}

/* A first step against loading the state file with the same cache,
 * think 0: read_file (warm) or read_file_cold. */
static const result *file_baseline_of(const result *r)
{
    if (!r->cache)
        return NULL;
    int cold = !strcmp(r->cache, "cold");
    return find("first_step", cold ? "read_file_cold" : "read_file",
                r->base.tokens, r->dtype, 0, r->cache);
}

static double ratio_to(const result *r, const result *base)
{
    return base && base != r && base->base.median_us > 0
               ? r->base.median_us / base->base.median_us
               : 0;
}

static void thp_mode(char *buf, size_t n)
{
    snprintf(buf, n, "unknown");
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f)
        return;
    char line[128];
    if (fgets(line, sizeof line, f)) {
        char *a = strchr(line, '['), *z = a ? strchr(a, ']') : NULL;
        if (a && z) {
            *z = '\0';
            snprintf(buf, n, "%s", a + 1);
        }
    }
    fclose(f);
}

static void print_header(FILE *f, const options *o)
{
    char thp[32];
    thp_mode(thp, sizeof thp);
    rep_counts small = reps_for(o, LARGE_TOKENS);
    rep_counts large = reps_for(o, MAX_TOKENS);
    fprintf(f,
        "ctxstore bench_attention: decode attention, Qwen3-4B geometry: %d"
        " layers x %d KV heads x %d dim, fp16 = %d bytes/token (bf16 the same,"
        " q8 half plus a float32 scale per token and head); %d query"
        " heads (GQA %d:1); one query token at the last position, reading"
        " every held token (window = context, %d sinks)\n"
        "kernel: ctxs_attention, ISA \"%s\", one thread; page size %ld;"
        " transparent huge pages: %s; decode_step and layer timed in %s\n"
        "session file in %s (capacity = context, filled with random values,"
        " committed and synced, untimed); times in us\n"
        "decode_step and layer: a row per session dtype (f16, bf16, q8), all"
        " interleaved in the same rounds; vs_f16: bf16 and q8, the median of"
        " the per-round ratios f16 time / theirs, same method (target:"
        " q8 >= 1.6x at 8192 tokens). first_step rows: f16.\n"
        "decode_step: %d ctxs_attention calls, one per layer; layer: each"
        " call alone (median over all layers of all steps). Methods:"
        " mapping (the session's layout: the file's pages, MADV_RANDOM,"
        " 4 KiB), anonymous (the same bytes copied into a private anonymous"
        " mapping, default pages; q8's scales copied after them),"
        " anonymous_huge (the copy with MADV_HUGEPAGE; f16 only). All resident (every page touched, one untimed"
        " step each); %d timed steps each (%d above %d tokens), interleaved,"
        " the order rotating every round.\n"
        "first_step: the first decode step after a resume, in wall time,"
        " from the start of the open to the end of the step, less the think"
        " time: the session is closed, then opened, the user thinks"
        " (think_ms, a sleep between the open and the step: 0 or %d), then"
        " the step runs; the sleep's measured length is subtracted, so the"
        " time is what is left to wait after the user hits enter (the"
        " open's time plus the step's). cache: warm (the file read through"
        " first, wholly in the page cache) or cold (its pages dropped with"
        " posix_fadvise DONTNEED); mincore on the file before each open,"
        " see the notes. Methods: mapping (default options: the window"
        " brought in on a background thread, readahead or page tables),"
        " mapping_no_background (options.background = 0: the step faults"
        " each 4 KiB page in itself), mapping_prefetch (default options,"
        " then the synchronous ctxs_session_prefetch(), then the step, all"
        " timed), read_file / read_file_cold (the same KV bytes as one"
        " plain state file: open + read() into a buffer allocated and"
        " touched beforehand + close, then the same step from the buffer;"
        " cold drops the file's pages first). The cases run interleaved,"
        " the order rotating every round; after each first step the same step"
        " runs once more, warm (same open, same buffer), for paired."
        " Repetitions (in parentheses: above"
        " %d tokens): warm, think 0: %d (%d); warm, think %d: %d (%d); cold,"
        " think 0 and %d: %d (%d).\n"
        "Every step's output is checked bit-identical to the warm decode"
        " step through the mapping.\n"
        "ratio: decode_step and layer vs anonymous (the bar: within 5%%);"
        " first_step vs the warm decode_step through the mapping (not with"
        " --cpu-time: wall vs CPU time). vs_file: first_step vs read_file"
        " (warm) or read_file_cold (cold) of its context. paired: decode_step"
        " and layer, the median of the ratios to anonymous of the same round"
        " (layer: same round and layer); first_step, the median of the"
        " ratios of each first step to the warm step right after it (wall"
        " time). GB/s: KV bytes read per second. faults: first_step, the page"
        " faults the timed thread took itself, minor/major (median; the"
        " KV of 2048 tokens is %zu pages of 4 KiB). Targets:"
        " cold, think 0, mapping <= 1.2x read_file_cold at 2048 and 8192"
        " tokens (by medians); think %d, warm or cold, <= 1.1x a warm step at"
        " 2048 tokens (at 8192: reported), judged by paired; the ratio to"
        " the decode_step row is printed beside it.\n\n",
        N_LAYERS, N_KV_HEADS, HEAD_DIM, TOKEN_BYTES, N_HEADS,
        N_HEADS / N_KV_HEADS, N_SINK, ctxs_attention_get_isa(),
        sysconf(_SC_PAGESIZE), thp,
        o->cpu_time ? "the thread's CPU time (--cpu-time)" : "wall time",
        g_dir, N_LAYERS, small.rounds, large.rounds, LARGE_TOKENS, THINK_MS,
        LARGE_TOKENS, small.warm, large.warm, THINK_MS, small.think,
        large.think, THINK_MS, small.cold, large.cold,
        (size_t)2048 * TOKEN_BYTES / 4096, THINK_MS);
}

static void print_json(void)
{
    for (size_t i = 0; i < g_results.n; i++) {
        const result *r = &g_result_rows[i];
        json_result_begin(&r->base);
        printf(",\"dtype\":\"%s\",\"n\":%zu,\"isa\":\"%s\",\"bytes\":%.0f",
               r->dtype, r->base.n, ctxs_attention_get_isa(), r->bytes);
        if (r->base.median_us > 0)
            printf(",\"gb_per_s\":%.3f", r->bytes / (r->base.median_us * 1e3));
        if (r->speedup > 0)
            printf(",\"speedup_vs_f16\":%.4f,\"speedup_vs_f16_q1\":%.4f,"
                   "\"speedup_vs_f16_q3\":%.4f",
                   r->speedup, r->speedup_lo, r->speedup_hi);
        if (r->cache) {
            printf(",\"think_ms\":%u,\"cache\":\"%s\"", r->think_ms, r->cache);
            double w = ratio_to(r, baseline_of(r));
            double f = ratio_to(r, file_baseline_of(r));
            if (w > 0)
                printf(",\"ratio_warm_step\":%.4f", w);
            if (f > 0)
                printf(",\"ratio_read_file\":%.4f", f);
            if (r->faults_minor >= 0)
                printf(",\"faults_minor\":%.0f,\"faults_major\":%.0f",
                       r->faults_minor, r->faults_major);
        }
        if (r->paired > 0)
            printf(",\"paired_ratio\":%.4f,\"paired_ratio_q1\":%.4f,"
                   "\"paired_ratio_q3\":%.4f",
                   r->paired, r->paired_lo, r->paired_hi);
        printf("}\n");
    }
}

static void print_table(void)
{
    printf("%-12s %6s %-5s %-22s %-5s %5s %11s %11s %11s %5s %8s %8s %8s %7s"
           " %8s %13s\n", "op", "tokens", "dtype", "method", "cache", "think",
           "median_us", "min_us", "max_us", "n", "ratio", "vs_file", "paired",
           "GB/s", "vs_f16", "faults");
    const char *last_op = "";
    for (size_t i = 0; i < g_results.n; i++) {
        const result *r = &g_result_rows[i];
        const bench_result *m = &r->base;
        if (strcmp(m->op, last_op) && *last_op)
            putchar('\n');
        last_op = m->op;
        char ratio[32] = "", vs_file[32] = "", paired[32] = "", think[16] = "";
        char faults[48] = "", vs_f16[32] = "";
        if (r->speedup > 0)
            snprintf(vs_f16, sizeof vs_f16, "%.3fx", r->speedup);
        double x = ratio_to(r, baseline_of(r));
        if (x > 0)
            snprintf(ratio, sizeof ratio, "%.3fx", x);
        x = ratio_to(r, file_baseline_of(r));
        if (x > 0)
            snprintf(vs_file, sizeof vs_file, "%.3fx", x);
        if (r->paired > 0)
            snprintf(paired, sizeof paired, "%.3fx", r->paired);
        if (r->cache)
            snprintf(think, sizeof think, "%u", r->think_ms);
        if (r->cache && r->faults_minor >= 0)
            snprintf(faults, sizeof faults, "%.0f/%.0f", r->faults_minor,
                     r->faults_major);
        printf("%-12s %6u %-5s %-22s %-5s %5s %11.1f %11.1f %11.1f %5zu %8s %8s"
               " %8s %7.2f %8s %13s\n",
               m->op, m->tokens, r->dtype, m->method, r->cache ? r->cache : "",
               think, m->median_us, m->min_us, m->max_us, m->n, ratio, vs_file,
               paired, m->median_us > 0 ? r->bytes / (m->median_us * 1e3) : 0.0,
               vs_f16, faults);
    }
    print_notes(stdout);
}

/* "1.040x (target <= 1.2x: met)"; target 0: the context has no target
 * (the targets name 2048 and 8192 tokens for the cold step, 2048 for
 * the think time), the ratio is reported. */
static const char *verdict(char *buf, size_t n, double x, double target)
{
    if (target > 0)
        snprintf(buf, n, "%.3fx (target <= %.1fx: %s)", x, target,
                 x <= target ? "met" : "NOT met");
    else
        snprintf(buf, n, "%.3fx (reported, no target)", x);
    return buf;
}

static void print_headlines(const uint32_t *contexts, int n)
{
    putchar('\n');
    for (int i = 0; i < n; i++) {
        uint32_t t = contexts[i];
        static const char *const ops[] = { "decode_step", "layer" };
        for (int d = 0; d < N_DTYPES; d++)
            for (int k = 0; k < 2; k++) {
                const char *dt = k_dtypes[d].name;
                const result *a = find(ops[k], "mapping", t, dt, 0, NULL);
                const result *b = find(ops[k], "anonymous", t, dt, 0, NULL);
                if (a && b && b->base.median_us > 0)
                    printf("%s %s mapping vs anonymous (%u tokens): %+.1f%% by"
                           " medians; paired: %+.1f%% (middle half %+.1f%% to"
                           " %+.1f%%) (target: within 5%%)\n",
                           ops[k], dt, t,
                           (a->base.median_us / b->base.median_us - 1) * 100,
                           (a->paired - 1) * 100, (a->paired_lo - 1) * 100,
                           (a->paired_hi - 1) * 100);
            }
        for (int d = D_BF16; d < N_DTYPES; d++) {
            const result *a = find("decode_step", "mapping", t, k_dtypes[d].name, 0, NULL);
            const result *f = find("decode_step", "mapping", t, "f16", 0, NULL);
            if (a && f && a->speedup > 0)
                printf("decode_step %s vs f16, mapping (%u tokens): %.1f vs %.1f ms,"
                       " %.2f vs %.2f GB/s; %.3fx faster by medians, paired %.3fx"
                       " (middle half %.3fx to %.3fx)%s\n",
                       k_dtypes[d].name, t, a->base.median_us / 1e3,
                       f->base.median_us / 1e3, a->bytes / (a->base.median_us * 1e3),
                       f->bytes / (f->base.median_us * 1e3),
                       f->base.median_us / a->base.median_us, a->speedup,
                       a->speedup_lo, a->speedup_hi,
                       d == D_Q8 && t == 8192
                           ? (a->speedup >= 1.6 ? " (target >= 1.6x: met)"
                                                : " (target >= 1.6x: NOT met)")
                           : "");
        }
        char v[96];
        const result *w = find("decode_step", "mapping", t, "f16", 0, NULL);
        const result *c0 = find("first_step", "mapping", t, "f16", 0, "cold");
        const result *rf = find("first_step", "read_file_cold", t, "f16", 0, "cold");
        if (c0 && rf)
            printf("first_step cold, think 0 (%u tokens): mapping %.1f ms vs"
                   " read_file_cold %.1f ms: %s\n", t, c0->base.median_us / 1e3,
                   rf->base.median_us / 1e3,
                   verdict(v, sizeof v, ratio_to(c0, rf),
                           t == 2048 || t == 8192 ? 1.2 : 0));
        for (int cold = 0; cold <= 1 && w; cold++) {
            const result *th = find("first_step", "mapping", t, "f16", THINK_MS,
                                    cold ? "cold" : "warm");
            if (th)
                printf("first_step %s, think %d ms (%u tokens): mapping %.1f"
                       " ms after the think time; vs the warm step right"
                       " after it: %s; vs the decode_step row (%.1f ms%s):"
                       " %.3fx\n", cold ? "cold" : "warm", THINK_MS, t,
                       th->base.median_us / 1e3,
                       verdict(v, sizeof v, th->paired, t == 2048 ? 1.1 : 0),
                       w->base.median_us / 1e3,
                       g_cpu_time ? ", CPU time" : "", ratio_to(th, w));
        }
        for (int cold = 0; cold <= 1; cold++) {
            const char *cache = cold ? "cold" : "warm";
            const result *nb = find("first_step", "mapping_no_background", t,
                                    "f16", 0, cache);
            const result *mp = find("first_step", "mapping", t, "f16", 0, cache);
            const result *pf = find("first_step", "mapping_prefetch", t, "f16", 0,
                                    cache);
            const result *file = find("first_step",
                                      cold ? "read_file_cold" : "read_file",
                                      t, "f16", 0, cache);
            if (nb && mp && pf && file)
                printf("first_step %s, think 0 (%u tokens): mapping %.1f ms;"
                       " mapping_no_background %.1f ms = %.3fx mapping;"
                       " mapping_prefetch %.1f ms; %s %.1f ms\n", cache, t,
                       mp->base.median_us / 1e3, nb->base.median_us / 1e3,
                       ratio_to(nb, mp), pf->base.median_us / 1e3,
                       file->base.method, file->base.median_us / 1e3);
        }
    }
}

/* --- Accuracy (--errors) ------------------------------------------------- *
 *
 * Why Q8 keeps one scale per (token, head) rather than one per block of 32
 * elements: the attention output of each form against fp64 attention over
 * the original floats, on data shaped like a real model's: keys with a few
 * outlier channels (4 of 128, 20x the rest, the same channels in every
 * token, as trained models' keys have), values without. f16, bf16 and q8
 * go through a real session (ctxs_session_write_token() of the floats,
 * which rounds or quantizes them), and are measured twice: fp64 attention
 * over what the session holds (the error of the form alone) and
 * ctxs_attention() over the mapping (what an engine gets). q8 with one
 * scale per 32 elements exists only here, in fp64. */

enum { E_TOKENS = 2048, E_QUERIES = 8, E_OUTLIERS = 4, E_BLOCK = 32 };

static double e_uniform(uint64_t *seed)
{
    return (double)(xorshift64(seed) >> 11) / 0x1p53;
}

/* Close to a standard normal (Irwin-Hall, 12 uniforms): no libm here. */
static double e_normal(uint64_t *seed)
{
    double x = -6;
    for (int i = 0; i < 12; i++)
        x += e_uniform(seed);
    return x;
}

static double e_sqrt(double x)
{
    double r = x > 1 ? x : 1;
    for (int i = 0; i < 100 && x > 0; i++)
        r = 0.5 * (r + x / r);
    return x > 0 ? r : 0;
}

/* e^x for x <= 0 to double precision (Taylor after a reduction by ln 2). */
static double e_exp(double x)
{
    if (x < -700)
        return 0;
    const double ln2 = 0.693147180559945309417;
    int k = (int)(x / ln2 - 0.5);
    double r = x - k * ln2, term = 1, sum = 1;
    for (int i = 1; i < 30; i++) {
        term *= r / i;
        sum += term;
    }
    for (; k < 0; k++)
        sum *= 0.5;
    return sum;
}

/* fp64 attention of query q (N_HEADS x HEAD_DIM) over T tokens of k, v
 * ([T][N_KV_HEADS][HEAD_DIM] doubles) into out. */
static void e_attend(double *out, const float *q, const double *k, const double *v, uint32_t T)
{
    const double c = 1 / e_sqrt(HEAD_DIM);
    double *w = xmalloc(T * sizeof w[0]);
    for (uint32_t h = 0; h < N_HEADS; h++) {
        const uint32_t kh = h / (N_HEADS / N_KV_HEADS);
        double mx = -1e300, sum = 0;
        for (uint32_t t = 0; t < T; t++) {
            const double *kr = k + ((size_t)t * N_KV_HEADS + kh) * HEAD_DIM;
            double d = 0;
            for (uint32_t i = 0; i < HEAD_DIM; i++)
                d += (double)q[h * HEAD_DIM + i] * kr[i];
            w[t] = d * c;
            mx = w[t] > mx ? w[t] : mx;
        }
        for (uint32_t t = 0; t < T; t++)
            sum += (w[t] = e_exp(w[t] - mx));
        for (uint32_t i = 0; i < HEAD_DIM; i++) {
            double o = 0;
            for (uint32_t t = 0; t < T; t++)
                o += w[t] * v[((size_t)t * N_KV_HEADS + kh) * HEAD_DIM + i];
            out[h * HEAD_DIM + i] = o / sum;
        }
    }
    free(w);
}

/* Q8 with one scale per block of n elements: amax / 127, round half away. */
static void e_q8_blocks(double *out, const float *x, size_t len, uint32_t n)
{
    for (size_t b = 0; b < len; b += n) {
        double amax = 0;
        for (uint32_t i = 0; i < n; i++)
            amax = x[b + i] < 0 ? (-x[b + i] > amax ? -x[b + i] : amax)
                                : (x[b + i] > amax ? x[b + i] : amax);
        const double scale = (float)(amax / 127);
        for (uint32_t i = 0; i < n; i++) {
            double r = amax > 0 ? x[b + i] * 127 / amax : 0;
            out[b + i] = scale * (double)(long)(r + (r < 0 ? -0.5 : 0.5));
        }
    }
}

typedef struct e_err {
    double se, sref, max; /* sum of squared errors, of squared references */
} e_err;

static void e_add(e_err *e, const double *got, const double *want, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double d = got[i] - want[i];
        e->se += d * d;
        e->sref += want[i] * want[i];
        d = d < 0 ? -d : d;
        e->max = d > e->max ? d : e->max;
    }
}

/* One data set: K's outlier channels `gain` times the rest (1: none). */
static void measure_errors_at(const options *o, double gain)
{
    const size_t per = (size_t)N_KV_HEADS * HEAD_DIM; /* one token, one layer */
    const size_t len = (size_t)E_TOKENS * per;
    uint64_t seed = 0x2545f4914f6cdd1dull;
    float *k = xmalloc(len * sizeof(float)), *v = xmalloc(len * sizeof(float));
    int outlier[HEAD_DIM] = { 0 };
    for (int i = 0; i < E_OUTLIERS; i++)
        outlier[(17 + 37 * i) % HEAD_DIM] = 1;
    for (size_t i = 0; i < len; i++) {
        k[i] = (float)(e_normal(&seed) * (outlier[i % HEAD_DIM] ? gain : 1));
        v[i] = (float)e_normal(&seed);
    }
    float *q = xmalloc((size_t)E_QUERIES * Q_FLOATS * sizeof(float));
    for (size_t i = 0; i < (size_t)E_QUERIES * Q_FLOATS; i++)
        q[i] = (float)e_normal(&seed);

    double *dk = xmalloc(len * sizeof(double)), *dv = xmalloc(len * sizeof(double));
    double *want = xmalloc((size_t)E_QUERIES * Q_FLOATS * sizeof(double));
    double *got = xmalloc(Q_FLOATS * sizeof(double));
    float *out = xmalloc(Q_FLOATS * sizeof(float));
    for (size_t i = 0; i < len; i++)
        dk[i] = k[i], dv[i] = v[i];
    for (int j = 0; j < E_QUERIES; j++)
        e_attend(want + (size_t)j * Q_FLOATS, q + (size_t)j * Q_FLOATS, dk, dv, E_TOKENS);

    /* f16, bf16, q8 per (token, head): through a session; then q8 per block */
    static const char *const names[] = { "f16", "bf16", "q8", "q8" };
    static const char *const scales[] = { "none", "none", "token_head", "block32" };
    const double bytes[] = { HEAD_DIM * 2, HEAD_DIM * 2, HEAD_DIM + 4,
                             HEAD_DIM + 4.0 * HEAD_DIM / E_BLOCK };
    if (!o->json)
        printf("attention-output error against fp64 of the original floats: %d tokens,"
               " %d KV heads x %d dim, %d query heads, %d decode queries; K has %d"
               " outlier channels of %gx, V none\n"
               "%-5s %-11s %15s %14s %12s %14s %12s\n", E_TOKENS, N_KV_HEADS, HEAD_DIM,
               N_HEADS, E_QUERIES, E_OUTLIERS, gain, "dtype", "scales", "bytes/tok/head",
               "rel_rms_fp64", "max_fp64", "rel_rms_kernel", "max_kernel");
    for (int f = 0; f < 4; f++) {
        e_err form = { 0, 0, 0 }, kern = { 0, 0, 0 };
        if (f < 3) {
            ctxs_model m = { .geometry = { 1, N_KV_HEADS, HEAD_DIM, k_dtypes[f].dtype } };
            ctxs_create_options co = CTXS_CREATE_OPTIONS_INIT;
            co.capacity = E_TOKENS;
            co.ring = 0;
            co.open.durability = CTXS_SYNC_NONE;
            co.open.window = E_TOKENS;
            ctxs_session *s;
            check_ctxs(ctxs_session_create(&s, g_path[f], &m, &co), "ctxs_session_create");
            ctxs_reservation r;
            check_ctxs(ctxs_session_reserve(&r, s, E_TOKENS), "ctxs_session_reserve");
            float *tk = xmalloc(per * sizeof(float)), *tv = xmalloc(per * sizeof(float));
            uint32_t *ids = xmalloc(E_TOKENS * sizeof ids[0]);
            for (uint32_t t = 0; t < E_TOKENS; t++) {
                check_ctxs(ctxs_session_write_token(s, &r, t, k + t * per, v + t * per,
                                                    CTXS_DTYPE_F32), "ctxs_session_write_token");
                ids[t] = t;
            }
            check_ctxs(ctxs_session_commit(s, ids, E_TOKENS), "ctxs_session_commit");
            for (uint32_t t = 0; t < E_TOKENS; t++) {
                /* float32 is exact for every session dtype */
                check_ctxs(ctxs_session_read_token(tk, tv, s, t, CTXS_DTYPE_F32),
                           "ctxs_session_read_token");
                for (size_t i = 0; i < per; i++)
                    dk[t * per + i] = tk[i], dv[t * per + i] = tv[i];
            }
            ctxs_layout lay;
            ctxs_attn_plan plan;
            check_ctxs(ctxs_session_get_layout(&lay, s), "ctxs_session_get_layout");
            check_ctxs(ctxs_session_get_attn_plan(&plan, s, 0), "ctxs_session_get_attn_plan");
            for (int j = 0; j < E_QUERIES; j++) {
                ctxs_attn_query aq = { q + (size_t)j * Q_FLOATS, E_TOKENS - 1, 1, N_HEADS, 0 };
                check_ctxs(ctxs_attention(out, &lay, &plan, 0, &aq), "ctxs_attention");
                for (size_t i = 0; i < Q_FLOATS; i++)
                    got[i] = out[i];
                e_add(&kern, got, want + (size_t)j * Q_FLOATS, Q_FLOATS);
            }
            ctxs_session_close(s);
            check_sys(unlink(g_path[f]), "unlink session");
            free(tk);
            free(tv);
            free(ids);
        } else {
            e_q8_blocks(dk, k, len, E_BLOCK);
            e_q8_blocks(dv, v, len, E_BLOCK);
        }
        for (int j = 0; j < E_QUERIES; j++) {
            e_attend(got, q + (size_t)j * Q_FLOATS, dk, dv, E_TOKENS);
            e_add(&form, got, want + (size_t)j * Q_FLOATS, Q_FLOATS);
        }
        const double rf = e_sqrt(form.se / form.sref);
        const double rk = kern.sref > 0 ? e_sqrt(kern.se / kern.sref) : -1;
        if (o->json) {
            printf("{\"op\":\"attention_error\",\"dtype\":\"%s\",\"scales\":\"%s\","
                   "\"tokens\":%d,\"k_outlier_gain\":%g,\"bytes_per_token_head\":%.0f,"
                   "\"rel_rms_fp64\":%.4g,\"max_abs_fp64\":%.4g", names[f], scales[f],
                   E_TOKENS, gain, bytes[f], rf, form.max);
            if (rk >= 0)
                printf(",\"rel_rms_kernel\":%.4g,\"max_abs_kernel\":%.4g", rk, kern.max);
            printf("}\n");
        } else {
            char a[32] = "-", b[32] = "-";
            if (rk >= 0) {
                snprintf(a, sizeof a, "%.3g", rk);
                snprintf(b, sizeof b, "%.3g", kern.max);
            }
            printf("%-5s %-11s %15.0f %14.3g %12.3g %14s %12s\n", names[f], scales[f],
                   bytes[f], rf, form.max, a, b);
        }
    }
    free(k);
    free(v);
    free(q);
    free(dk);
    free(dv);
    free(want);
    free(got);
    free(out);
}

static void measure_errors(const options *o)
{
    measure_errors_at(o, 20);
    if (!o->json)
        putchar('\n');
    measure_errors_at(o, 1);
}

/* The rows as a table, then the headlines. */
static void print_text(const uint32_t *contexts, int n)
{
    print_table();
    print_headlines(contexts, n);
}

int main(int argc, char **argv)
{
    options o = parse_options(argc, argv);
    g_cpu_time = o.cpu_time;
    catch_signals(remove_scratch_on_signal);
    make_scratch_dir(o.dir, "ctxstore-bench");
    for (int d = 0; d < N_DTYPES; d++) {
        char name[32];
        snprintf(name, sizeof name, "attention-%s.ctxs", k_dtypes[d].name);
        scratch_file(g_path[d], name);
    }
    scratch_file(g_state_path, "attention.state");
    if (o.errors) {
        measure_errors(&o);
        cleanup();
        return 0;
    }

    uint32_t contexts[2] = { 2048, 8192 };
    int n_contexts = pick_contexts(contexts, 2, o.only_tokens);

    print_header(o.json ? stderr : stdout, &o);
    fflush(stdout);
    double t0 = now_us();
    for (int i = 0; i < n_contexts; i++)
        run_context(&o, contexts[i]);
    return finish_run(&(run_end){ o.progress, o.json, g_result_rows, g_results.n,
                                  sizeof g_result_rows[0], cmp_rows, print_json, print_text,
                                  contexts, n_contexts, t0 });
}
