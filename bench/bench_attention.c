/*
 * bench_attention — what zero-copy costs the attention kernel: decode
 * attention with ctxs_attention() reading K/V straight from the session's
 * mapping, side by side with the same bytes copied into anonymous memory,
 * which is what an engine that loads the cache into its own buffers reads.
 *
 * KV geometry of Qwen3-4B: 36 layers, 8 KV heads, head dim 128, fp16, with
 * 32 query heads (GQA 4:1). For each context (2048 and 8192 held tokens) a
 * real session file is created in a scratch directory with capacity for
 * the context, filled with random fp16 values (reserve, write through the
 * layout, commit, sync), and its window set to the whole context, so that a
 * query reads every held token. It measures:
 *
 *   decode_step   attention of all 36 layers for one query token (the last
 *                 position, as after a resume), one ctxs_attention() call
 *                 per layer, on the calling thread.
 *   layer         each of those calls alone (the median over every layer
 *                 of every timed step).
 *   first_step    the first decode step after the session is reopened:
 *                 "mapping_reopened" with the file still in the page cache
 *                 (every page is faulted into the new mapping), and
 *                 "mapping_uncached" after its pages were dropped from the
 *                 page cache (posix_fadvise DONTNEED, checked with
 *                 mincore): every page is read from the disk.
 *
 * Methods for decode_step and layer:
 *
 *   mapping         the session's own layout: the kernel reads the file's
 *                   pages where they are mapped.
 *   anonymous       a copy of the KV region in a private anonymous mapping,
 *                   as malloc would give it, and a copy of the layout whose
 *                   kv points there.
 *   anonymous_huge  the same with MADV_HUGEPAGE: what 2 MiB pages would
 *                   give (a diagnostic; ctxstore's mapping uses 4 KiB
 *                   pages, see docs/ARCHITECTURE.md).
 *
 * Every page of each copy is touched and one untimed step run on each
 * before timing, so all are resident. The timed steps are interleaved, the
 * order rotating every round, so that drift and noise fall on all methods
 * alike. The outputs through the mapping and the copies must be
 * bit-identical (same bytes, same kernel): checked.
 *
 * Usage: bench_attention [--quick] [--tokens N] [--dir DIR] [--cpu-time]
 *                        [--json]
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
};

enum { M_MAPPING, M_ANON, M_ANON_HUGE, N_METHODS };

static const char *const k_method_names[N_METHODS] = {
    "mapping", "anonymous", "anonymous_huge",
};

/* --- Results --------------------------------------------------------------- */

typedef struct result {
    bench_result base; /* first, for results_add() and results_find() */
    double bytes; /* KV bytes one operation reads */
    /* Against anonymous, measured in the same round (decode_step) or the
     * same layer of the same round (layer): the median of the per-pair
     * ratios and their middle half. 0 when not paired. */
    double paired, paired_lo, paired_hi;
} result;

static const char *const k_ops[] = { "decode_step", "layer", "first_step" };
static const char *const k_all_methods[] = {
    "mapping", "anonymous", "anonymous_huge", "mapping_reopened",
    "mapping_uncached",
};

static result g_result_rows[64];
static result_table g_results = RESULT_TABLE(g_result_rows);

static result *record(const char *op, const char *method, uint32_t tokens,
                      const samples *s, double bytes)
{
    result *r = results_add(&g_results, op, method, tokens, s);
    r->bytes = bytes;
    return r;
}

/* The ratios a[i] / b[i] of samples taken side by side: their median and
 * quartiles go into r (a's result). Drift and noise that hit a round hit
 * both of its samples, so these are steadier than the ratio of two
 * medians. */
static void record_paired(result *r, const samples *a, const samples *b)
{
    if (a->n != b->n || a->n == 0)
        die("unpaired samples for %s %s", r->base.op, r->base.method);
    double *q = xmalloc(a->n * sizeof q[0]);
    for (size_t i = 0; i < a->n; i++)
        q[i] = b->us[i] > 0 ? a->us[i] / b->us[i] : 1;
    qsort(q, a->n, sizeof q[0], cmp_double);
    r->paired = median_of_sorted(q, a->n);
    r->paired_lo = q[a->n / 4];
    r->paired_hi = q[(3 * a->n) / 4];
    free(q);
}

/* --- Files ----------------------------------------------------------------- */

/* The session file: a scratch file, removed on a signal. */
static char g_path[PATH_MAX];

/* --- Options --------------------------------------------------------------- */

typedef struct options {
    int json;
    int quick;
    uint32_t only_tokens; /* 0 = 2048 and 8192 */
    const char *dir;
    int progress;
    int cpu_time;         /* time warm steps in thread CPU time */
} options;

static void usage(FILE *f)
{
    fputs("usage: bench_attention [--quick] [--tokens N] [--dir DIR] [--cpu-time] [--json]\n"
          "  --quick     fewer timed steps (the same contexts)\n"
          "  --tokens N  one context of N tokens (16..32768)\n"
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
    for (int i = 1; i < argc; i++) {
        if (!flag_option(argv[i], "--json", &o.json)
            && !flag_option(argv[i], "--quick", &o.quick)
            && !flag_option(argv[i], "--cpu-time", &o.cpu_time)
            && !string_option(argc, argv, &i, "--dir", &o.dir)
            && !count_option(argc, argv, &i, "--tokens", MIN_TOKENS, MAX_TOKENS,
                             &o.only_tokens))
            unknown_option(argv[i], usage);
    }
    o.progress = isatty(STDERR_FILENO);
    return o;
}

/* --- One context ----------------------------------------------------------- */

typedef struct bench {
    const options *o;
    uint32_t tokens;
    int rounds;            /* timed decode steps per method */
    int cold_reps;         /* first steps after a reopen */
    int uncached_reps;     /* first steps after the page cache was dropped */
    ctxs_model model;
    ctxs_session *s;
    ctxs_layout lay[N_METHODS];
    uint8_t *area[N_METHODS]; /* anonymous mappings (not for M_MAPPING) */
    size_t area_bytes;
    ctxs_attn_plan plan;
    float *q;              /* [N_LAYERS][N_HEADS][HEAD_DIM] */
    float *out[N_METHODS]; /* [N_LAYERS][N_HEADS][HEAD_DIM] */
    double step_bytes;     /* KV bytes one decode step reads */
} bench;

static volatile uint64_t g_sink;

static void progress(const bench *b, const char *what)
{
    if (b->o->progress)
        fprintf(stderr, "\r\033[K%u tokens: %s", b->tokens, what);
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

/* The share of the KV region's pages that the page cache holds. */
static double resident_share(const ctxs_layout *lay)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t n = (lay->kv_bytes + page - 1) / page;
    unsigned char *vec = xmalloc(n);
    check_sys(mincore(lay->kv, lay->kv_bytes, vec), "mincore");
    size_t in = 0;
    for (size_t i = 0; i < n; i++)
        in += vec[i] & 1;
    free(vec);
    return (double)in / (double)n;
}

static void open_session(bench *b)
{
    ctxs_session_options o;
    check_ctxs(ctxs_session_options_init(&o), "ctxs_session_options_init");
    o.window = b->tokens;
    check_ctxs(ctxs_session_open(&b->s, g_path, &b->model, 0, &o),
               "ctxs_session_open");
    check_ctxs(ctxs_session_layout(&b->lay[M_MAPPING], b->s),
               "ctxs_session_layout");
    check_ctxs(ctxs_session_attn_plan(&b->plan, b->s, 0),
               "ctxs_session_attn_plan");
    if (b->plan.n_keys != b->tokens || b->plan.first_query != b->tokens - 1)
        die("ctxs_session_attn_plan: %u keys, first query %" PRIu64
            "; expected %u keys, query %u",
            b->plan.n_keys, b->plan.first_query, b->tokens, b->tokens - 1);
}

/* Creates the session file and fills every slot, untimed; then makes it
 * durable, so that its pages are clean (and can be dropped from the page
 * cache later) and no measurement meets its writeback. */
static void create_session(bench *b)
{
    progress(b, "filling the session");
    ctxs_session_options o;
    check_ctxs(ctxs_session_options_init(&o), "ctxs_session_options_init");
    o.capacity = b->tokens;
    o.n_sink = N_SINK;
    o.ring = 0;
    o.window = b->tokens; /* every held token is read */
    check_ctxs(ctxs_session_create(&b->s, g_path, &b->model, &o),
               "ctxs_session_create");
    ctxs_layout lay;
    get_layout(&lay, b->s, SLOT_BYTES);
    ctxs_reservation r;
    check_ctxs(ctxs_session_reserve(&r, b->s, b->tokens),
               "ctxs_session_reserve");
    if (r.n_spans != 1 || r.spans[0].slot != 0)
        die("ctxs_session_reserve: expected one span from slot 0");
    uint64_t seed = 0x9e3779b97f4a7c15ull ^ b->tokens;
    for (uint32_t run = 0; run < N_RUNS; run++)
        fill_fp16_signed(kv_run(&lay, N_KV_HEADS, run),
                         (size_t)b->tokens * SLOT_BYTES, &seed);
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
}

/* A copy of the mapping's KV region in a private anonymous mapping,
 * 2 MiB aligned (so that MADV_HUGEPAGE can take effect), and a layout
 * pointing there. */
static void make_copy(bench *b, int m, int huge)
{
    const size_t align = 2u << 20;
    const ctxs_layout *src = &b->lay[M_MAPPING];
    b->area_bytes = src->kv_bytes + align;
    uint8_t *a = mmap(NULL, b->area_bytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED)
        die("mmap %zu anonymous bytes failed: %s", b->area_bytes,
            strerror(errno));
    b->area[m] = a;
    uint8_t *p = (uint8_t *)(((uintptr_t)a + align - 1) & ~(uintptr_t)(align - 1));
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
}

/* One decode step: every layer's attention for one query token at the
 * plan's last position. Each call's time goes to layer_us (NULL: not
 * kept). Returns the step's time in microseconds. */
static double cpu_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static double decode_step(const bench *b, int m, double *layer_us)
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
        int rc = ctxs_attention(b->out[m] + (size_t)l * Q_FLOATS, &b->lay[m],
                                &b->plan, l, &aq);
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

static void measure_warm(bench *b)
{
    progress(b, "copying into anonymous memory");
    long long huge_before = anon_huge_bytes();
    make_copy(b, M_ANON, 0);
    make_copy(b, M_ANON_HUGE, 1);
    long long huge_after = anon_huge_bytes();
    if (huge_before >= 0 && huge_after >= 0)
        add_note("%u tokens: anonymous huge pages in the copies: %lld MiB"
                 " (a copy is %zu MiB)", b->tokens,
                 (huge_after - huge_before) >> 20,
                 b->lay[M_MAPPING].kv_bytes >> 20);

    progress(b, "warming up");
    for (int m = 0; m < N_METHODS; m++) {
        g_sink += touch_pages(b->lay[m].kv, b->lay[m].kv_bytes);
        decode_step(b, m, NULL);
    }
    /* Same bytes, same kernel, same plan: the outputs must not differ in a
     * single bit. */
    for (int m = 1; m < N_METHODS; m++)
        if (memcmp(b->out[M_MAPPING], b->out[m],
                   (size_t)N_LAYERS * Q_FLOATS * sizeof(float)))
            die("%u tokens: attention over %s differs from the mapping",
                b->tokens, k_method_names[m]);

    samples step[N_METHODS] = { { 0 } }, layer[N_METHODS] = { { 0 } };
    double layer_us[N_LAYERS];
    for (int round = 0; round < b->rounds; round++) {
        if (b->o->progress && round % 4 == 0) {
            char what[64];
            snprintf(what, sizeof what, "decode steps, round %d/%d", round + 1,
                     b->rounds);
            progress(b, what);
        }
        for (int i = 0; i < N_METHODS; i++) {
            int m = (round + i) % N_METHODS; /* the order rotates */
            samples_add(&step[m], decode_step(b, m, layer_us));
            for (int l = 0; l < N_LAYERS; l++)
                samples_add(&layer[m], layer_us[l]);
        }
    }
    for (int m = 0; m < N_METHODS; m++) {
        result *r = record("decode_step", k_method_names[m], b->tokens,
                           &step[m], b->step_bytes);
        if (m != M_ANON)
            record_paired(r, &step[m], &step[M_ANON]);
        r = record("layer", k_method_names[m], b->tokens, &layer[m],
                   b->step_bytes / N_LAYERS);
        if (m != M_ANON)
            record_paired(r, &layer[m], &layer[M_ANON]);
    }
    for (int m = 0; m < N_METHODS; m++) {
        samples_free(&step[m]);
        samples_free(&layer[m]);
    }
    for (int m = M_ANON; m < N_METHODS; m++) {
        check_sys(munmap(b->area[m], b->area_bytes), "munmap copy");
        b->area[m] = NULL;
    }
}

/* Drops the session file's pages from the page cache. They are clean (the
 * session was synced and has not been written since) and mapped nowhere
 * (the session is closed), so the kernel lets them go. */
static void drop_cached_pages(void)
{
    int fd = open(g_path, O_RDONLY | O_CLOEXEC);
    check_sys(fd, "open session file");
#ifdef POSIX_FADV_DONTNEED
    int rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    if (rc)
        die("posix_fadvise(DONTNEED) failed: %s", strerror(rc));
#endif
    check_sys(close(fd), "close session file");
}

/* The first step after a reopen, which faults the pages in. */
static void measure_first_step(bench *b, int uncached)
{
    const char *method = uncached ? "mapping_uncached" : "mapping_reopened";
    int reps = uncached ? b->uncached_reps : b->cold_reps;
    samples sm = { 0 };
    double resident = 0;
    for (int i = 0; i < reps; i++) {
        progress(b, method);
        ctxs_session_close(b->s);
        b->s = NULL;
        if (uncached)
            drop_cached_pages();
        open_session(b);
        double r = resident_share(&b->lay[M_MAPPING]);
        if (r > resident)
            resident = r;
        samples_add(&sm, decode_step(b, M_MAPPING, NULL));
    }
    record("first_step", method, b->tokens, &sm, b->step_bytes);
    samples_free(&sm);
    add_note("%u tokens, first_step %s: at most %.1f%% of the KV region was"
             " in the page cache before the step", b->tokens, method,
             resident * 100);
}

static void run_context(const options *o, uint32_t tokens)
{
    bench b = { .o = o, .tokens = tokens };
    /* A step over 8192 tokens reads 1.1 GiB, and each page read from the
     * disk is its own 4 KiB read (the KV is mapped MADV_RANDOM): fewer
     * repetitions for large contexts keep the run near a minute. */
    const int large = tokens > LARGE_TOKENS;
    b.rounds = o->quick ? 9 : large ? 21 : 31;
    b.cold_reps = o->quick ? 3 : 5;
    b.uncached_reps = o->quick ? (large ? 0 : 1) : (large ? 1 : 3);
    b.model.geometry = (ctxs_geometry){ N_LAYERS, N_KV_HEADS, HEAD_DIM,
                                        CTXS_DTYPE_F16 };
    memcpy(b.model.model_hash, "bench-qwen3-4b!!", 16);
    memcpy(b.model.tokenizer_hash, "bench-tokenizer!", 16);
    b.step_bytes = (double)N_RUNS * tokens * SLOT_BYTES;

    create_session(&b);
    open_session(&b);
    measure_warm(&b);
    measure_first_step(&b, 0);
    if (b.uncached_reps > 0)
        measure_first_step(&b, 1);
    else
        add_note("%u tokens: first_step mapping_uncached skipped with --quick"
                 " (each 4 KiB page is read from the disk on its own)",
                 tokens);

    ctxs_session_close(b.s);
    check_sys(unlink(g_path), "unlink session");
    free(b.q);
    for (int m = 0; m < N_METHODS; m++)
        free(b.out[m]);
}

/* --- Report ---------------------------------------------------------------- */

/* decode_step and layer against the anonymous copy; first_step against the
 * warm decode step through the mapping. */
static int g_cpu_time; /* --cpu-time: first_step has no warm baseline */

static const result *baseline_of(const result *r)
{
    if (!strcmp(r->base.op, "first_step"))
        return g_cpu_time ? NULL
                          : results_find(&g_results, "decode_step", "mapping",
                                         r->base.tokens);
    return results_find(&g_results, r->base.op, "anonymous", r->base.tokens);
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
    fprintf(f,
        "ctxstore bench_attention: decode attention, Qwen3-4B geometry: %d"
        " layers x %d KV heads x %d dim, fp16 = %d bytes/token; %d query"
        " heads (GQA %d:1); one query token at the last position, reading"
        " every held token (window = context, %d sinks)\n"
        "kernel: ctxs_attention, ISA \"%s\", one thread; page size %ld;"
        " transparent huge pages: %s; decode_step and layer timed in %s\n"
        "session file in %s (capacity = context, filled with random fp16,"
        " committed and synced, untimed); times in us\n"
        "decode_step: %d ctxs_attention calls, one per layer; layer: each"
        " call alone (median over all layers of all steps). Methods:"
        " mapping (the session's layout: the file's pages, MADV_RANDOM,"
        " 4 KiB), anonymous (the same bytes copied into a private anonymous"
        " mapping, default pages), anonymous_huge (the copy with"
        " MADV_HUGEPAGE). All resident (every page touched, one untimed"
        " step each); %s timed steps each, interleaved, the order rotating"
        " every round; outputs checked bit-identical.\n"
        "first_step: the first decode step after close + reopen;"
        " mapping_reopened: the file still in the page cache (page faults"
        " only); mapping_uncached: its pages dropped from the page cache"
        " first (posix_fadvise DONTNEED), read from the disk on fault,"
        " 4 KiB at a time. Repetitions: reopened %s; uncached %s.\n"
        "ratio: decode_step and layer vs anonymous (the bar: within 5%%);"
        " first_step vs the warm decode_step through the mapping (not with"
        " --cpu-time: wall vs CPU time). paired:"
        " the median of the ratios to anonymous of the same round (layer:"
        " same round and layer). GB/s: KV bytes read per second.\n\n",
        N_LAYERS, N_KV_HEADS, HEAD_DIM, TOKEN_BYTES, N_HEADS,
        N_HEADS / N_KV_HEADS, N_SINK, ctxs_attention_isa(),
        sysconf(_SC_PAGESIZE), thp,
        o->cpu_time ? "the thread's CPU time (--cpu-time)" : "wall time",
        g_dir, N_LAYERS,
        o->quick ? "9" : "31 (21 above 4096 tokens)",
        o->quick ? "3" : "5",
        o->quick ? "1 (none above 4096 tokens)" : "3 (1 above 4096 tokens)");
}

static void print_json(void)
{
    for (size_t i = 0; i < g_results.n; i++) {
        const result *r = &g_result_rows[i];
        json_result_begin(&r->base);
        printf(",\"n\":%zu,\"isa\":\"%s\"", r->base.n, ctxs_attention_isa());
        if (r->paired > 0)
            printf(",\"paired_ratio\":%.4f,\"paired_ratio_q1\":%.4f,"
                   "\"paired_ratio_q3\":%.4f",
                   r->paired, r->paired_lo, r->paired_hi);
        printf("}\n");
    }
}

static void print_table(void)
{
    printf("%-12s %6s  %-17s %11s %11s %11s %5s %8s %8s %7s\n", "op",
           "tokens", "method", "median_us", "min_us", "max_us", "n", "ratio",
           "paired", "GB/s");
    const char *last_op = "";
    for (size_t i = 0; i < g_results.n; i++) {
        const result *r = &g_result_rows[i];
        const bench_result *m = &r->base;
        if (strcmp(m->op, last_op) && *last_op)
            putchar('\n');
        last_op = m->op;
        const result *base = baseline_of(r);
        char ratio[32] = "";
        if (base && base != r && base->base.median_us > 0)
            snprintf(ratio, sizeof ratio, "%.3fx",
                     m->median_us / base->base.median_us);
        char paired[32] = "";
        if (r->paired > 0)
            snprintf(paired, sizeof paired, "%.3fx", r->paired);
        printf("%-12s %6u  %-17s %11.1f %11.1f %11.1f %5zu %8s %8s %7.2f\n",
               m->op, m->tokens, m->method, m->median_us, m->min_us,
               m->max_us, m->n, ratio, paired,
               m->median_us > 0 ? r->bytes / (m->median_us * 1e3) : 0.0);
    }
    print_notes(stdout);
}

static void print_headlines(const uint32_t *contexts, int n)
{
    putchar('\n');
    for (int i = 0; i < n; i++) {
        uint32_t t = contexts[i];
        static const char *const ops[] = { "decode_step", "layer" };
        for (int k = 0; k < 2; k++) {
            const result *a = results_find(&g_results, ops[k], "mapping", t);
            const result *b = results_find(&g_results, ops[k], "anonymous", t);
            if (a && b && b->base.median_us > 0)
                printf("%s mapping vs anonymous (%u tokens): %+.1f%% by"
                       " medians; paired: %+.1f%% (middle half %+.1f%% to"
                       " %+.1f%%)\n",
                       ops[k], t,
                       (a->base.median_us / b->base.median_us - 1) * 100,
                       (a->paired - 1) * 100, (a->paired_lo - 1) * 100,
                       (a->paired_hi - 1) * 100);
        }
        const bench_result *w = results_find(&g_results, "decode_step",
                                             "mapping", t);
        const bench_result *c = results_find(&g_results, "first_step",
                                             "mapping_reopened", t);
        const bench_result *u = results_find(&g_results, "first_step",
                                             "mapping_uncached", t);
        if (w && c && u && w->median_us > 0)
            printf("first step after reopen (%u tokens): %.1f ms page cache"
                   " warm, %.1f ms from disk; a warm step: %.1f ms%s\n",
                   t, c->median_us / 1e3, u->median_us / 1e3,
                   w->median_us / 1e3, g_cpu_time ? " (CPU time)" : "");
    }
}

int main(int argc, char **argv)
{
    options o = parse_options(argc, argv);
    g_cpu_time = o.cpu_time;
    catch_signals(remove_scratch_on_signal);
    make_scratch_dir(o.dir, "ctxstore-bench");
    scratch_file(g_path, "attention.ctxs");

    uint32_t contexts[2] = { 2048, 8192 };
    int n_contexts = pick_contexts(contexts, 2, o.only_tokens);

    print_header(o.json ? stderr : stdout, &o);
    fflush(stdout);
    double t0 = now_us();
    for (int i = 0; i < n_contexts; i++)
        run_context(&o, contexts[i]);
    if (o.progress)
        fputs("\r\033[K", stderr);

    results_sort(&g_results, k_ops, sizeof k_ops / sizeof k_ops[0],
                 k_all_methods, sizeof k_all_methods / sizeof k_all_methods[0]);
    if (o.json) {
        print_json();
        print_notes(stderr);
    } else {
        print_table();
        print_headlines(contexts, n_contexts);
        printf("total run time: %.1f s\n", (now_us() - t0) / 1e6);
    }
    cleanup();
    return 0;
}
