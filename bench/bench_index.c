/*
 * bench_index — what the store's index buys and what it costs, side by side
 * with what an application without it would write.
 *
 *   find_prefix  ctxs_prefix_find of a 4096-token prompt in a store of
 *                10,000 sessions (1,000 with --quick), each holding 4096
 *                tokens that begin with one of 100 shared 1024-token system
 *                prompts. Cases: a full hit, a partial hit (the system
 *                prompt + 1000 tokens), a hit on the system prompt alone
 *                (shared by many sessions), a miss. Against it: a linear
 *                scan that reads every session file's token ids and keeps
 *                the longest common prefix. The store is built from files
 *                and one ctxs_store_reindex, then the last sessions are
 *                added through the store: what adding a session costs with
 *                the index and without it (add_session).
 *   fork         a 2048-token session of Qwen3-4B KV geometry (288 MiB of
 *                K/V) copied to a new session: ctxs_store_session_fork,
 *                ctxs_session_fork, a FULL-durability fork, against writing
 *                the same tokens again into a new session, a llama.cpp-style
 *                state file written and synced, and a cp-like
 *                copy_file_range of the session file.
 *   commit       what the prefix index adds to ctxs_session_commit: 64-token
 *                turns up to 2048 tokens in a store session and in a bare
 *                one.
 *
 * Lookups, scans and copies are timed over several iterations after one
 * untimed warm-up; sessions added and turns committed are timed each, the
 * first included. It reports median, min and max (and p99 where there are
 * hundreds of samples). Page caches cannot be dropped here, so
 * every method reads from a warm page cache, and the disk is settled
 * (syncfs) before each timed block (before each iteration where one
 * iteration writes hundreds of megabytes) so that no method pays for
 * another's writeback.
 *
 * Usage: bench_index [--quick] [--sessions N] [--dir DIR] [--gap-ms N] [--json]
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#ifdef __linux__
#include <sys/vfs.h>
#endif

#include "bench_util.h"
#include "ctxstore.h"
#include "peek.h" /* the naive scan reads token ids as the index's check does */
#include "rng.h"

const char *const bench_program = "bench_index";

/* --- Geometry and workload ------------------------------------------------- */

enum {
    VOCAB = 151936,            /* Qwen3's vocabulary */
    /* A token id no session holds: where a test prompt leaves them all. */
    DIVERGE = VOCAB + 7,
    PROMPT_TOKENS = 4096,
    SYS_TOKENS = 1024,         /* a "system prompt" */
    N_SYS = 100,               /* distinct system prompts */
    PARTIAL_TOKENS = SYS_TOKENS + 1000,
    FILLER_CAPACITY = 4096,
    FILLER_LAYERS = 1, FILLER_HEADS = 1, FILLER_DIM = 8,

    /* Qwen3-4B KV geometry, as bench_session. */
    N_LAYERS = 36,
    N_KV_HEADS = 8,
    HEAD_DIM = 128,
    ELEM_BYTES = 2,
    SLOT_BYTES = HEAD_DIM * ELEM_BYTES,
    N_RUNS = N_LAYERS * 2 * N_KV_HEADS,
    TOKEN_BYTES = N_RUNS * SLOT_BYTES, /* 147,456 */
    N_SINK = 4,
    FORK_TOKENS = 2048,
    FORK_CAPACITY = 4096,      /* room to go on after the fork */
    TURN_TOKENS = 64,
    CONV_TOKENS = 2048,
    CONV_CAPACITY = CONV_TOKENS + 256,
    /* The index's batching (src/index/index.h, CTXS__PREFIX_FLUSH_CHUNKS). */
    FLUSH_CHUNKS = 16,
    /* find_prefix checks at most this many sessions listed under one
     * prefix (src/index/prefix.c, MAX_CANDIDATES). */
    MAX_CANDIDATES = 8,
};

#define STATE_BYTES ((size_t)FORK_TOKENS * TOKEN_BYTES) /* 288 MiB */
#define TURN_BYTES ((size_t)TURN_TOKENS * TOKEN_BYTES)

/* --- Output ---------------------------------------------------------------- */

enum { SEC_BUILD = 1, SEC_PREFIX, SEC_FORK, SEC_COMMIT };

typedef struct result {
    int section;
    const char *op;     /* the case */
    const char *method;
    size_t n;
    double median_us, p99_us, min_us, max_us;
    char info[64];      /* a column of its own per section */
} result;

/* Not a result_table: rows are found by section, op and method ("close" is
 * an op of SEC_BUILD and of SEC_COMMIT), and hold no token counts. */
static result g_results[64];
static int g_n_results;

/* --- Files ----------------------------------------------------------------- */

static char g_store_dir[PATH_MAX];
static volatile sig_atomic_t g_signal;

/* Thousands of files cannot be removed from a signal handler: the handler
 * only notes the signal, and the next progress point cleans up and exits
 * (within a second: no step between two of them takes longer). */
static void on_signal(int sig)
{
    g_signal = sig;
}

static void check_signal(void)
{
    if (g_signal) {
        int sig = g_signal;
        fputs("\nbench_index: interrupted, removing the scratch directory\n",
              stderr);
        cleanup();
        signal(sig, SIG_DFL);
        raise(sig);
        exit(1);
    }
}

/* --- Options --------------------------------------------------------------- */

typedef struct options {
    int json;
    int quick;
    uint32_t sessions;    /* sessions in the find_prefix store */
    const char *dir;
    int progress;         /* stderr is a terminal */
    uint32_t gap_ms;
} options;

static void usage(FILE *f)
{
    fputs("usage: bench_index [--quick] [--sessions N] [--dir DIR] [--gap-ms N] [--json]\n"
          "  --quick       1,000 sessions, fewer iterations (about 30 s)\n"
          "  --sessions N  sessions in the find_prefix store (100..100000;\n"
          "                default 10000, 1000 with --quick)\n"
          "  --dir DIR     put the files in a new directory under DIR (a real\n"
          "                disk, not tmpfs; default $TMPDIR, else /var/tmp)\n"
          "  --gap-ms N    untimed pause before each timed commit, standing for\n"
          "                the time a turn takes to generate (default 50)\n"
          "  --json        one JSON object per measurement on stdout\n",
          f);
}

static options parse_options(int argc, char **argv)
{
    options o = { .gap_ms = 50 };
    for (int i = 1; i < argc; i++) {
        if (!flag_option(argv[i], "--json", &o.json)
            && !flag_option(argv[i], "--quick", &o.quick)
            && !string_option(argc, argv, &i, "--dir", &o.dir)
            && !count_option(argc, argv, &i, "--sessions", 100, 100000,
                             &o.sessions)
            && !count_option(argc, argv, &i, "--gap-ms", 0, 10000, &o.gap_ms))
            unknown_option(argv[i], usage);
    }
    if (!o.sessions)
        o.sessions = o.quick ? 1000 : 10000;
    o.progress = isatty(STDERR_FILENO);
    return o;
}

/* --- Scratch directory ----------------------------------------------------- */

/* The file system's name, for the header: whether a fork can share blocks
 * (FICLONE) depends on it. */
static const char *fs_name(const char *dir)
{
#ifdef __linux__
    struct statfs sf;
    if (statfs(dir, &sf) == 0) {
        switch ((unsigned long)sf.f_type) {
        case 0xef53ul: return "ext4 (no FICLONE: forks copy)";
        case 0x58465342ul: return "xfs";
        case 0x9123683eul: return "btrfs";
        case 0x2fc12fc1ul: return "zfs";
        case 0x794c7630ul: return "overlayfs";
        default: break;
        }
    }
#else
    (void)dir;
#endif
    return "unknown file system";
}

/* --- Timing and statistics ------------------------------------------------- */

static unsigned g_gap_ms;
static const options *g_opt;

/* The 99th percentile of s (not empty) as the sample below which 99% lie
 * (the maximum under 100 samples). */
static double p99_of(const samples *s)
{
    double *sorted = samples_sorted(s);
    int k = (int)((double)s->n * 0.99 + 0.5) - 1;
    double p99 = sorted[k < 0 ? 0 : (size_t)k >= s->n ? s->n - 1 : (size_t)k];
    free(sorted);
    return p99;
}

#if defined(__GNUC__)
__attribute__((format(printf, 5, 6)))
#endif
static result *record(int section, const char *op, const char *method,
                      const samples *s, const char *info_fmt, ...)
{
    if (g_n_results == (int)(sizeof g_results / sizeof g_results[0]))
        die("too many results");
    bench_result stats = summarize(op, method, 0, s);
    result *r = &g_results[g_n_results++];
    memset(r, 0, sizeof(*r));
    r->section = section;
    r->op = op;
    r->method = method;
    r->n = stats.n;
    r->median_us = stats.median_us;
    r->p99_us = p99_of(s);
    r->min_us = stats.min_us;
    r->max_us = stats.max_us;
    if (info_fmt) {
        va_list ap;
        va_start(ap, info_fmt);
        vsnprintf(r->info, sizeof r->info, info_fmt, ap);
        va_end(ap);
    }
    return r;
}

#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
static void progress(const char *fmt, ...)
{
    check_signal();
    if (!g_opt->progress)
        return;
    va_list ap;
    fputs("\r\033[K  ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

/* --- Random data ------------------------------------------------------------ */

static void random_ids(uint32_t *out, uint32_t n, uint64_t seed)
{
    uint64_t st = ts_rng_next(&seed) | 1;
    for (uint32_t i = 0; i < n; i++)
        out[i] = (uint32_t)(xorshift64(&st) % VOCAB);
}

/* Session i's prompt: system prompt i % N_SYS, then its own continuation. */
static void session_prompt(uint32_t *out, uint32_t i)
{
    random_ids(out, SYS_TOKENS, 0x5359530000ull + i % N_SYS);
    random_ids(out + SYS_TOKENS, PROMPT_TOKENS - SYS_TOKENS,
               0xc0417000000ull + i);
}

static uint64_t common_prefix(const uint32_t *a, const uint32_t *b, uint64_t n)
{
    uint64_t i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

/* ===========================================================================
 * 1. find_prefix
 */

typedef struct prefix_bench {
    ctxs_store *st;
    ctxs_model model;
    uint32_t n_sessions;
    uint32_t n_files;         /* written as files, then indexed by reindex */
    uint32_t target;          /* the session the hits are built from */
    char (*files)[32];        /* session files in id order */
    int sessions_fd;
    uint32_t *buf;            /* PROMPT_TOKENS ids, scratch for the scans */
} prefix_bench;

typedef struct prefix_case {
    const char *name;
    uint32_t prompt[PROMPT_TOKENS];
    uint64_t expect;          /* tokens the answer holds; 0 = a miss */
    uint64_t indexed_chunks;  /* the longest prefix in the index, in chunks */
    uint32_t listed;          /* sessions listed under that prefix */
} prefix_case;

/* Session i's name: the files written before the reindex are named by it
 * from their ids (i + 1); the ones added through the store have names of
 * their own. */
static void session_name(char out[32], const prefix_bench *pb, uint32_t i)
{
    if (i < pb->n_files)
        snprintf(out, 32, "session-%016llx", (unsigned long long)i + 1);
    else
        snprintf(out, 32, "conv-%06u", i);
}

/* The inverse of session_name(); UINT32_MAX for a name it does not give. */
static uint32_t session_index(const char *name)
{
    unsigned long long id;
    unsigned i;
    char end;
    if (sscanf(name, "session-%16llx%c", &id, &end) == 1 && id > 0)
        return (uint32_t)(id - 1);
    if (sscanf(name, "conv-%u%c", &i, &end) == 1)
        return i;
    return UINT32_MAX;
}

/* Sessions added through the store after the reindex. */
static uint32_t api_sessions(const options *o)
{
    return o->sessions / 10 < 200 ? o->sessions / 10 : 200;
}

static void filler_options(ctxs_create_options *o)
{
    *o = (ctxs_create_options)CTXS_CREATE_OPTIONS_INIT;
    o->capacity = FILLER_CAPACITY;
    o->n_sink = N_SINK;
    o->ring = 0;
    o->open.durability = CTXS_SYNC_NONE;
}

/* One reserve and one commit of session i's whole prompt. The K/V stay the
 * zeros fallocate gives: find_prefix never reads them. */
static void fill_filler(ctxs_session *s, uint32_t i, uint32_t *ids)
{
    ctxs_reservation r;
    check_ctxs(ctxs_session_reserve(&r, s, PROMPT_TOKENS),
               "ctxs_session_reserve");
    session_prompt(ids, i);
    check_ctxs(ctxs_session_commit(s, ids, PROMPT_TOKENS),
               "ctxs_session_commit");
}

typedef struct add_samples {
    samples create, commit, close;
} add_samples;

/* After a create of s that began at a (us): fills it with session i's
 * tokens and closes it, adding the create's, the fill's and the close's
 * times to t. */
static void fill_timed(ctxs_session *s, uint32_t i, uint32_t *ids, double a, add_samples *t)
{
    double b = now_us();
    fill_filler(s, i, ids);
    double c = now_us();
    ctxs_session_close(s);
    double d = now_us();
    samples_add(&t->create, b - a);
    samples_add(&t->commit, c - b);
    samples_add(&t->close, d - c);
}

/* Builds the store as a restore from files would, which is fast: all but
 * the last n_api sessions are written as files into sessions/ (named from
 * ids 1, 2, ...) with ctxs_session_create, and one ctxs_store_reindex
 * indexes them in a single transaction (they carry no name label, so it
 * names them session-<id>). Adding 10,000 sessions through the store
 * instead takes four durable index transactions each, 45 to 50 s on a
 * 2-core VM on ext4 (the cost per session grows with the index), and
 * writes gigabytes of index pages that would still be going to disk
 * during the later measurements. The last n_api sessions
 * are added through the store, as an app adds them, and timed step by
 * step; the files' steps are timed too, for comparison. */
static void build_prefix_store(prefix_bench *pb, uint32_t n_api)
{
    ctxs_create_options o;
    filler_options(&o);
    uint32_t *ids = xmalloc(PROMPT_TOKENS * sizeof(*ids));
    pb->n_files = pb->n_sessions - n_api;
    add_samples bare = { 0 }, store = { 0 };
    char path[PATH_MAX];
    double t0 = now_us();
    for (uint32_t i = 0; i < pb->n_files; i++) {
        if (i % 250 == 0)
            progress("find_prefix: writing session files, %u of %u", i,
                     pb->n_files);
        if (snprintf(path, sizeof path, "%s/sessions/%016llx.ctxs",
                     g_store_dir, (unsigned long long)i + 1) >= (int)sizeof path)
            die("--dir path too long");
        ctxs_session *s;
        double a = now_us();
        check_ctxs(ctxs_session_create(&s, path, &pb->model, &o),
                   "ctxs_session_create");
        fill_timed(s, i, ids, a, &bare);
    }
    double files_us = now_us() - t0;

    progress("find_prefix: ctxs_store_reindex of %u files", pb->n_files);
    settle_disk();
    ctxs_store_reindex_result res;
    t0 = now_us();
    check_ctxs(ctxs_store_reindex(&res, pb->st), "ctxs_store_reindex");
    double reindex_us = now_us() - t0;
    if (res.sessions != pb->n_files || res.skipped)
        die("ctxs_store_reindex indexed %" PRIu64 " sessions and skipped %"
            PRIu64 ", expected %u and 0", res.sessions, res.skipped,
            pb->n_files);

    for (uint32_t i = pb->n_files; i < pb->n_sessions; i++) {
        progress("find_prefix: adding sessions through the store, %u of %u",
                 i - pb->n_files, n_api);
        char name[32];
        session_name(name, pb, i);
        ctxs_session *s;
        double a = now_us();
        check_ctxs(ctxs_store_session_create(&s, pb->st, name, &pb->model, &o),
                   "ctxs_store_session_create");
        fill_timed(s, i, ids, a, &store);
    }
    free(ids);

    char mdb[PATH_MAX];
    if (snprintf(mdb, sizeof mdb, "%s/index/data.mdb", g_store_dir)
        >= (int)sizeof mdb)
        die("--dir path too long");
    struct stat sb;
    add_note("find_prefix store: %u session files written in %.1f s, then"
             " ctxs_store_reindex indexed them in %.2f s (one transaction);"
             " %u more added through the store; index file %.1f MiB",
             pb->n_files, files_us / 1e6, reindex_us / 1e6, n_api,
             stat(mdb, &sb) == 0 ? (double)sb.st_size / (1 << 20) : 0.0);
    static const char *const steps[3] = { "create", "commit_4096",
                                          "close" };
    add_samples *both[2] = { &store, &bare };
    static const char *const how[2] = { "store", "bare" };
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < 2; j++) {
            samples *sm = k == 0 ? &both[j]->create
                          : k == 1 ? &both[j]->commit : &both[j]->close;
            record(SEC_BUILD, steps[k], how[j], sm, "%s",
                   j == 1 ? "sessions before the reindex"
                          : k == 0 ? "2 index txns"
                          : k == 1 ? "+ 64 chunks indexed (1 txn)"
                                   : "+ 1 index txn");
        }
    for (int j = 0; j < 2; j++) {
        samples_free(&both[j]->create);
        samples_free(&both[j]->commit);
        samples_free(&both[j]->close);
    }
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The session files in id order, as a scan would meet them. */
static void list_session_files(prefix_bench *pb)
{
    ctxs_session_entry *list;
    size_t n;
    check_ctxs(ctxs_store_session_list(&list, &n, pb->st),
               "ctxs_store_session_list");
    pb->files = xmalloc(n * sizeof(*pb->files));
    uint64_t *ids = xmalloc(n * sizeof(*ids));
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!memcmp(list[i].model_hash, pb->model.model_hash, 16))
            ids[k++] = list[i].id;
    ctxs_free(list);
    if (k != pb->n_sessions)
        die("the store lists %zu sessions of the model, expected %u", k,
            pb->n_sessions);
    qsort(ids, k, sizeof(*ids), cmp_u64);
    for (size_t i = 0; i < k; i++)
        snprintf(pb->files[i], 32, "%016" PRIx64 ".ctxs", ids[i]);
    free(ids);
    char dir[PATH_MAX];
    if (snprintf(dir, sizeof dir, "%s/sessions", g_store_dir) >= (int)sizeof dir)
        die("--dir path too long");
    pb->sessions_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    check_sys(pb->sessions_fd, "open sessions directory");
}

/* Case c: the target's first keep tokens, then new ones from seed after a
 * token no session has; listed sessions hold that start. */
static void make_case(prefix_case *c, const char *name, const prefix_bench *pb, uint32_t keep,
                      uint64_t seed, uint32_t listed)
{
    c->name = name;
    session_prompt(c->prompt, pb->target);
    if (keep < PROMPT_TOKENS) {
        random_ids(c->prompt + keep, PROMPT_TOKENS - keep, seed);
        c->prompt[keep] = DIVERGE;
    }
    c->expect = keep;
    c->indexed_chunks = keep / CTXS_PREFIX_CHUNK;
    c->listed = listed;
}

static void make_cases(prefix_case *c, const prefix_bench *pb)
{
    uint32_t per_sys = pb->n_sessions / N_SYS
                       + (pb->target % N_SYS < pb->n_sessions % N_SYS);
    /* full: all 4096 tokens of the target. */
    make_case(&c[0], "full_hit", pb, PROMPT_TOKENS, 0, 1);
    /* partial: the target's first 2024 tokens, then new ones. */
    make_case(&c[1], "partial_hit", pb, PARTIAL_TOKENS, 0xbadc0ffeeull, 1);
    /* a new conversation after a known system prompt. */
    make_case(&c[2], "sysprompt_hit", pb, SYS_TOKENS, 0xfeedfaceull, per_sys);
    /* a miss: the first chunk is unknown. */
    make_case(&c[3], "miss", pb, 0, 0xdeadbeefull, 0);
}

/* The mdb_get calls of the binary search in ctxs_prefix_find for a prompt
 * of n_chunks chunks whose longest indexed prefix is k chunks. */
static int search_probes(uint64_t n_chunks, uint64_t k)
{
    uint64_t lo = 0, hi = n_chunks;
    int probes = 0;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo + 1) / 2;
        probes++;
        if (mid <= k)
            lo = mid;
        else
            hi = mid - 1;
    }
    return probes;
}

static void check_match(const prefix_bench *pb, const prefix_case *c, int rc,
                        const ctxs_prefix_match *m)
{
    if (c->expect == 0) {
        if (rc != CTXS_ENOTFOUND)
            die("ctxs_prefix_find(%s): expected CTXS_ENOTFOUND, got %s "
                "(%" PRIu64 " tokens of %s)", c->name, ctxs_err_name(rc),
                m->n_tokens, m->session);
        return;
    }
    check_ctxs(rc, "ctxs_prefix_find");
    if (m->n_tokens != c->expect)
        die("ctxs_prefix_find(%s): %" PRIu64 " tokens, expected %" PRIu64,
            c->name, m->n_tokens, c->expect);
    uint32_t idx = session_index(m->session);
    if (c->listed == 1 ? idx != pb->target
                       : idx >= pb->n_sessions || idx % N_SYS != pb->target % N_SYS)
        die("ctxs_prefix_find(%s): matched %s, which does not hold the "
            "prompt", c->name, m->session);
}

static samples time_find(const prefix_bench *pb, const prefix_case *c, int iters)
{
    samples sm = { 0 };
    for (int i = 0; i <= iters; i++) {
        ctxs_prefix_match m;
        double t0 = now_us();
        int rc = ctxs_prefix_find(&m, pb->st, pb->model.model_hash, c->prompt,
                                  PROMPT_TOKENS);
        double t = now_us() - t0;
        check_match(pb, c, rc, &m);
        if (i > 0) /* the first is the warm-up */
            samples_add(&sm, t);
    }
    return sm;
}

/* What an app without the index does: look at every session file, read its
 * token ids, keep the longest common prefix; stop early only when the whole
 * prompt matches. Reads files as the index's own check does (open, header
 * and records by pread, then the ids): no mapping, no lock. */
static uint64_t naive_peek_scan(const prefix_bench *pb, const uint32_t *prompt,
                                uint64_t n)
{
    uint64_t best = 0;
    for (uint32_t i = 0; i < pb->n_sessions && best < n; i++) {
        int fd = openat(pb->sessions_fd, pb->files[i], O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            die("open %s failed: %s", pb->files[i], strerror(errno));
        ctxs__peek p;
        if (ctxs__peek_fd(&p, fd) == 0 &&
            !memcmp(p.model.model_hash, pb->model.model_hash, 16)) {
            uint64_t held = ctxs__peek_prefix_held(&p);
            uint64_t len = held < n ? held : n;
            if (ctxs__peek_tokens(pb->buf, fd, &p, 0, len) == 0) {
                uint64_t m = common_prefix(pb->buf, prompt, len);
                if (m > best)
                    best = m;
            }
        }
        close(fd);
    }
    return best;
}

/* The same through the public API only: open each file read-only as a
 * session, read the ids through its layout. */
static uint64_t naive_open_scan(const prefix_bench *pb, const uint32_t *prompt,
                                uint64_t n)
{
    char path[PATH_MAX];
    uint64_t best = 0;
    for (uint32_t i = 0; i < pb->n_sessions && best < n; i++) {
        if (snprintf(path, sizeof path, "%s/sessions/%s", g_store_dir,
                     pb->files[i]) >= (int)sizeof path)
            die("--dir path too long");
        ctxs_session *s;
        check_ctxs(ctxs_session_open(&s, path, NULL, CTXS_RDONLY, NULL),
                   "ctxs_session_open");
        ctxs_session_info info;
        ctxs_layout lay;
        check_ctxs(ctxs_session_get_info(&info, s), "ctxs_session_get_info");
        check_ctxs(ctxs_session_get_layout(&lay, s), "ctxs_session_get_layout");
        if (!memcmp(info.model.model_hash, pb->model.model_hash, 16)) {
            uint64_t held = info.ring_start <= info.n_sink
                                ? info.n_tokens
                                : (info.n_tokens < info.n_sink ? info.n_tokens
                                                               : info.n_sink);
            uint64_t len = held < n ? held : n;
            uint64_t m = common_prefix(lay.token_ids, prompt, len);
            if (m > best)
                best = m;
        }
        ctxs_session_close(s);
    }
    return best;
}

typedef uint64_t (*scan_fn)(const prefix_bench *, const uint32_t *, uint64_t);

static samples time_scan(const prefix_bench *pb, const prefix_case *c,
                         scan_fn scan, const char *what, int iters)
{
    samples sm = { 0 };
    for (int i = 0; i <= iters; i++) {
        progress("find_prefix: %s %s, %d of %d", what, c->name, i, iters);
        double t0 = now_us();
        uint64_t got = scan(pb, c->prompt, PROMPT_TOKENS);
        double t = now_us() - t0;
        /* Like the index, a match must cover a whole chunk. */
        if (got < CTXS_PREFIX_CHUNK)
            got = 0;
        if (got != c->expect)
            die("%s(%s): %" PRIu64 " tokens, expected %" PRIu64, what, c->name,
                got, c->expect);
        if (i > 0)
            samples_add(&sm, t);
    }
    return sm;
}

static uint64_t file_size_at(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
}

static void run_find_prefix(ctxs_store *st, const options *o)
{
    prefix_bench pb = { .st = st, .n_sessions = o->sessions };
    pb.target = o->sessions / 2;
    pb.model.geometry = (ctxs_geometry){ FILLER_LAYERS, FILLER_HEADS,
                                         FILLER_DIM, CTXS_DTYPE_F16, 0, { 0 } };
    memcpy(pb.model.model_hash, "bench-tiny-model", 16);
    memcpy(pb.model.tokenizer_hash, "bench-tokenizer!", 16);
    check_ctxs(ctxs_model_register(st, &pb.model, "bench tiny (1x1x8)"),
               "ctxs_model_register");
    pb.buf = xmalloc(PROMPT_TOKENS * sizeof(*pb.buf));

    build_prefix_store(&pb, api_sessions(o));
    progress("find_prefix: settling the disk");
    settle_disk();
    list_session_files(&pb);

    static prefix_case cases[4];
    make_cases(cases, &pb);
    int iters = o->quick ? 200 : 1000;
    int scan_iters = o->quick ? 5 : 9;
    uint64_t n_chunks = PROMPT_TOKENS / CTXS_PREFIX_CHUNK;
    for (int c = 0; c < 4; c++) {
        progress("find_prefix: ctxs_prefix_find %s", cases[c].name);
        samples sm = time_find(&pb, &cases[c], iters);
        uint32_t files = cases[c].listed < MAX_CANDIDATES ? cases[c].listed
                                                          : MAX_CANDIDATES;
        int probes = search_probes(n_chunks, cases[c].indexed_chunks);
        record(SEC_PREFIX, cases[c].name, "ctxs_prefix_find", &sm,
               "%d gets%s, %u file%s", probes,
               cases[c].indexed_chunks ? " + 1 seek" : "", files,
               files == 1 ? "" : "s");
        samples_free(&sm);
    }
    for (int c = 0; c < 4; c++) {
        samples sm = time_scan(&pb, &cases[c], naive_peek_scan, "naive_scan",
                               scan_iters);
        uint32_t files = cases[c].expect == PROMPT_TOKENS ? pb.target + 1
                                                          : pb.n_sessions;
        record(SEC_PREFIX, cases[c].name, "naive_scan", &sm, "%u files", files);
        samples_free(&sm);
    }
    {
        samples sm = time_scan(&pb, &cases[3], naive_open_scan, "naive_open",
                               o->quick ? 3 : 5);
        record(SEC_PREFIX, cases[3].name, "naive_open", &sm, "%u opens",
               pb.n_sessions);
        samples_free(&sm);
    }
    close(pb.sessions_fd);
    free(pb.files);
    free(pb.buf);
}

/* ===========================================================================
 * 2. fork
 */

typedef struct fork_bench {
    ctxs_store *st;
    ctxs_model model;
    ctxs_session *src;       /* read-only handle on the source */
    ctxs_layout src_lay;
    uint8_t *state;          /* the engine's copy of the K/V, run by run */
    char src_path[PATH_MAX]; /* the source's file in the store */
    char bare_path[PATH_MAX];
    char state_path[PATH_MAX];
    char copy_path[PATH_MAX];
} fork_bench;

static void session_options(ctxs_create_options *o, uint32_t capacity,
                            uint32_t durability)
{
    *o = (ctxs_create_options)CTXS_CREATE_OPTIONS_INIT;
    o->capacity = capacity;
    o->n_sink = N_SINK;
    o->open.durability = durability;
}

/* FORK_TOKENS reserved in s, from slot 0, and its layout in *lay. */
static void reserve_fork_tokens(ctxs_layout *lay, ctxs_session *s)
{
    get_layout(lay, s, SLOT_BYTES);
    ctxs_reservation r;
    check_ctxs(ctxs_session_reserve(&r, s, FORK_TOKENS), "ctxs_session_reserve");
    if (r.n_spans != 1 || r.spans[0].slot != 0)
        die("ctxs_session_reserve: unexpected spans");
}

/* The source: 2048 tokens of random K/V, committed, synced, and an
 * untimed read-only handle that the file-level methods copy from. */
static void make_fork_source(fork_bench *fb)
{
    progress("fork: writing the 2048-token source");
    ctxs_create_options o;
    session_options(&o, FORK_CAPACITY, CTXS_SYNC_ASYNC);
    ctxs_session *s;
    check_ctxs(ctxs_store_session_create(&s, fb->st, "fork-source", &fb->model, &o),
               "ctxs_store_session_create");
    ctxs_layout lay;
    reserve_fork_tokens(&lay, s);
    uint64_t seed = 0x5eed5eed5eedull;
    for (uint32_t run = 0; run < N_RUNS; run++)
        fill_fp16(kv_run(&lay, N_KV_HEADS, run), (size_t)FORK_TOKENS * SLOT_BYTES, &seed);
    uint32_t *ids = xmalloc(FORK_TOKENS * sizeof(*ids));
    random_ids(ids, FORK_TOKENS, 0xf0f0f0ull);
    check_ctxs(ctxs_session_commit(s, ids, FORK_TOKENS), "ctxs_session_commit");
    check_ctxs(ctxs_session_sync(s), "ctxs_session_sync");
    ctxs_session_close(s);
    free(ids);

    ctxs_session_entry e;
    check_ctxs(ctxs_store_session_get(&e, fb->st, "fork-source"),
               "ctxs_store_session_get");
    if (snprintf(fb->src_path, PATH_MAX, "%s/sessions/%016" PRIx64 ".ctxs",
                 g_store_dir, e.id) >= PATH_MAX)
        die("--dir path too long");
    check_ctxs(ctxs_session_open(&fb->src, fb->src_path, &fb->model,
                                 CTXS_RDONLY, NULL),
               "ctxs_session_open");
    get_layout(&fb->src_lay, fb->src, SLOT_BYTES);
    /* The engine's copy, as a state file is written from. */
    fb->state = xmalloc(STATE_BYTES);
    for (uint32_t run = 0; run < N_RUNS; run++)
        memcpy(fb->state + (size_t)run * FORK_TOKENS * SLOT_BYTES,
               kv_run(&fb->src_lay, N_KV_HEADS, run), (size_t)FORK_TOKENS * SLOT_BYTES);
    scratch_path(fb->bare_path, "fork.ctxs");
    scratch_path(fb->state_path, "state.bin");
    scratch_path(fb->copy_path, "copy.ctxs");
    settle_disk();
}

/* A copy must hold the source's 2048 tokens, K/V and ids alike. */
static void check_copy(const fork_bench *fb, ctxs_session *s, const char *what)
{
    ctxs_session_info info;
    check_ctxs(ctxs_session_get_info(&info, s), "ctxs_session_get_info");
    if (info.n_tokens != FORK_TOKENS)
        die("%s holds %" PRIu64 " tokens, expected %d", what, info.n_tokens,
            FORK_TOKENS);
    ctxs_layout lay;
    get_layout(&lay, s, SLOT_BYTES);
    if (memcmp(lay.token_ids, fb->src_lay.token_ids, FORK_TOKENS * 4))
        die("%s: token ids differ from the source's", what);
    for (uint32_t run = 0; run < N_RUNS; run++)
        if (memcmp(kv_run(&lay, N_KV_HEADS, run), kv_run(&fb->src_lay, N_KV_HEADS, run),
                   (size_t)FORK_TOKENS * SLOT_BYTES))
            die("%s: K/V of run %u differ from the source's", what, run);
}

enum {
    M_STORE_FORK, M_SESSION_FORK, M_STORE_FORK_FULL, M_REWRITE_STORE,
    M_REWRITE_BARE, M_STATE_FILE, M_COPY_RANGE, N_FORK_METHODS
};

static const char *const k_fork_methods[N_FORK_METHODS] = {
    "ctxs_store_session_fork", "ctxs_session_fork", "store_fork_full",
    "rewrite_store", "rewrite_bare", "state_fdatasync", "copy_file_range",
};

/* What each method waits for; see the header printed above the table. */
static const char *const k_fork_syncs[N_FORK_METHODS] = {
    "ASYNC + index txns", "ASYNC", "FULL + index txns", "ASYNC + index txns",
    "ASYNC", "fdatasync", "none",
};

/* cp's way: the source's data extents only (SEEK_DATA/SEEK_HOLE), each by
 * copy_file_range, which ext4 serves by an in-kernel copy (a reflink on
 * Btrfs and XFS). No sync, as cp does none. */
static void copy_sparse(const char *from, const char *to)
{
    int in = open(from, O_RDONLY | O_CLOEXEC);
    check_sys(in, "open source file");
    int out = open(to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    check_sys(out, "open copy");
    struct stat sb;
    check_sys(fstat(in, &sb), "fstat source file");
    check_sys(ftruncate(out, sb.st_size), "ftruncate copy");
    off_t pos = 0;
    while (pos < sb.st_size) {
        off_t data = lseek(in, pos, SEEK_DATA);
        if (data < 0 && errno == ENXIO)
            break;
        check_sys((int)(data < 0 ? -1 : 0), "lseek SEEK_DATA");
        off_t hole = lseek(in, data, SEEK_HOLE);
        check_sys((int)(hole < 0 ? -1 : 0), "lseek SEEK_HOLE");
        off_t at_in = data, at_out = data;
        while (at_in < hole) {
            ssize_t n = copy_file_range(in, &at_in, out, &at_out,
                                        (size_t)(hole - at_in), 0);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                die("copy_file_range failed: %s", n < 0 ? strerror(errno)
                                                          : "short");
        }
        pos = hole;
    }
    check_sys(close(out), "close copy");
    check_sys(close(in), "close source file");
}

/* Copies the source's K/V from its mapping into a new session's
 * reservation and commits: what an app without fork does (it has the K/V,
 * it does not recompute them). */
static void rewrite_into(const fork_bench *fb, ctxs_session *s)
{
    ctxs_layout lay;
    reserve_fork_tokens(&lay, s);
    for (uint32_t run = 0; run < N_RUNS; run++)
        memcpy(kv_run(&lay, N_KV_HEADS, run), kv_run(&fb->src_lay, N_KV_HEADS, run),
               (size_t)FORK_TOKENS * SLOT_BYTES);
    check_ctxs(ctxs_session_commit(s, fb->src_lay.token_ids, FORK_TOKENS),
               "ctxs_session_commit");
}

/* One iteration of a method: the disk settled first, the copy checked
 * (warm-up only) and removed after, both untimed. */
static double fork_once(const fork_bench *fb, int method, int check)
{
    ctxs_create_options async_opts, full_opts;
    session_options(&async_opts, FORK_CAPACITY, CTXS_SYNC_ASYNC);
    session_options(&full_opts, FORK_CAPACITY, CTXS_SYNC_FULL);
    ctxs_session *s = NULL;
    int in_store = 0;
    settle_disk();
    double t0 = now_us(), t;
    switch (method) {
    case M_STORE_FORK:
        check_ctxs(ctxs_store_session_fork(&s, fb->st, "fork-source", "fork-copy",
                                           UINT64_MAX, &async_opts.open),
                   "ctxs_store_session_fork");
        t = now_us() - t0;
        in_store = 1;
        break;
    case M_SESSION_FORK:
        check_ctxs(ctxs_session_fork(&s, fb->src, fb->bare_path, UINT64_MAX,
                                     &async_opts.open),
                   "ctxs_session_fork");
        t = now_us() - t0;
        break;
    case M_STORE_FORK_FULL:
        check_ctxs(ctxs_store_session_fork(&s, fb->st, "fork-source", "fork-copy",
                                           UINT64_MAX, &full_opts.open),
                   "ctxs_store_session_fork");
        check_ctxs(ctxs_session_sync(s), "ctxs_session_sync");
        t = now_us() - t0;
        in_store = 1;
        break;
    case M_REWRITE_STORE:
        check_ctxs(ctxs_store_session_create(&s, fb->st, "fork-copy",
                                             &fb->model, &async_opts),
                   "ctxs_store_session_create");
        rewrite_into(fb, s);
        t = now_us() - t0;
        in_store = 1;
        break;
    case M_REWRITE_BARE:
        check_ctxs(ctxs_session_create(&s, fb->bare_path, &fb->model,
                                       &async_opts),
                   "ctxs_session_create");
        rewrite_into(fb, s);
        t = now_us() - t0;
        break;
    case M_STATE_FILE: {
        int fd = open(fb->state_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                      0600);
        check_sys(fd, "open state file");
        write_all(fd, fb->state, STATE_BYTES, fb->state_path);
        check_sys(fdatasync(fd), "fdatasync state file");
        check_sys(close(fd), "close state file");
        t = now_us() - t0;
        if (file_size_at(fb->state_path) != STATE_BYTES)
            die("state file has the wrong size");
        check_sys(unlink(fb->state_path), "unlink state file");
        return t;
    }
    default:
        copy_sparse(fb->src_path, fb->copy_path);
        t = now_us() - t0;
        if (check) {
            ctxs_session *c;
            check_ctxs(ctxs_session_open(&c, fb->copy_path, &fb->model,
                                         CTXS_RDONLY, NULL),
                       "ctxs_session_open (copy)");
            check_copy(fb, c, "copy_file_range copy");
            ctxs_session_close(c);
        }
        check_sys(unlink(fb->copy_path), "unlink copy");
        return t;
    }
    if (check)
        check_copy(fb, s, k_fork_methods[method]);
    ctxs_session_close(s);
    if (in_store)
        check_ctxs(ctxs_store_session_delete(fb->st, "fork-copy"),
                   "ctxs_store_session_delete");
    else
        check_sys(unlink(fb->bare_path), "unlink fork");
    return t;
}

static void run_fork(ctxs_store *st, const options *o)
{
    fork_bench fb = { .st = st };
    fb.model.geometry = (ctxs_geometry){ N_LAYERS, N_KV_HEADS, HEAD_DIM,
                                         CTXS_DTYPE_F16, 0, { 0 } };
    memcpy(fb.model.model_hash, "bench-qwen3-4b!!", 16);
    memcpy(fb.model.tokenizer_hash, "bench-tokenizer!", 16);
    check_ctxs(ctxs_model_register(st, &fb.model, "bench Qwen3-4B geometry"),
               "ctxs_model_register");
    make_fork_source(&fb);
    int iters = o->quick ? 3 : 7;
    for (int m = 0; m < N_FORK_METHODS; m++) {
        samples sm = { 0 };
        for (int i = 0; i <= iters; i++) {
            progress("fork: %s, %d of %d", k_fork_methods[m], i, iters);
            double t = fork_once(&fb, m, i == 0);
            if (i > 0)
                samples_add(&sm, t);
        }
        record(SEC_FORK, "fork_2048", k_fork_methods[m], &sm, "%s",
               k_fork_syncs[m]);
        samples_free(&sm);
    }
    ctxs_session_close(fb.src);
    free(fb.state);
    check_ctxs(ctxs_store_session_delete(st, "fork-source"),
               "ctxs_store_session_delete");
    settle_disk();
}

/* ===========================================================================
 * 3. commit: what the index adds
 */

/* Whether the commit that brings a store session to `chunks` whole chunks
 * updates the index, given `had` chunks indexed (src/index/sessions.c,
 * on_commit); updates *had like it. */
static int index_flushes(uint64_t chunks, uint64_t *had)
{
    if (chunks > *had && (*had == 0 || chunks - *had >= FLUSH_CHUNKS)) {
        *had = chunks;
        return 1;
    }
    return 0;
}

typedef struct conv_samples {
    samples all, flush, other, close;
} conv_samples;

/* One 2048-token conversation in s, 64 tokens a turn; only the commit is
 * timed. Turns that flush the prefix index (in the store) are told apart;
 * the bare session's same turns are recorded under the same heading.
 * turn holds one turn's K/V run after run. */
static void converse(ctxs_session *s, const ctxs_geometry *g,
                     const uint8_t *turn, const uint32_t *ids,
                     conv_samples *cs, const char *what)
{
    ctxs_layout lay;
    check_ctxs(ctxs_session_get_layout(&lay, s), "ctxs_session_get_layout");
    uint32_t runs = 2 * g->n_layers * g->n_kv_heads;
    size_t run_bytes = (size_t)TURN_TOKENS * lay.slot_bytes;
    uint64_t had = 0;
    for (uint32_t t = 0; t < CONV_TOKENS / TURN_TOKENS; t++) {
        progress("commit: %s, turn %u of %d", what, t + 1,
                 CONV_TOKENS / TURN_TOKENS);
        ctxs_reservation r;
        check_ctxs(ctxs_session_reserve(&r, s, TURN_TOKENS),
                   "ctxs_session_reserve");
        if (r.n_spans != 1)
            die("ctxs_session_reserve: unexpected spans");
        size_t off = (size_t)r.spans[0].slot * lay.slot_bytes;
        for (uint32_t run = 0; run < runs; run++)
            memcpy(kv_run(&lay, g->n_kv_heads, run) + off,
                   turn + run * run_bytes, run_bytes);
        pause_ms(g_gap_ms);
        double t0 = now_us();
        check_ctxs(ctxs_session_commit(s, ids + t * TURN_TOKENS, TURN_TOKENS),
                   "ctxs_session_commit");
        double us = now_us() - t0;
        samples_add(&cs->all, us);
        uint64_t chunks = (uint64_t)(t + 1) * TURN_TOKENS / CTXS_PREFIX_CHUNK;
        samples_add(index_flushes(chunks, &had) ? &cs->flush : &cs->other, us);
    }
    double t0 = now_us();
    ctxs_session_close(s);
    samples_add(&cs->close, now_us() - t0);
}

static void commit_geometry(ctxs_store *st, const ctxs_model *model,
                            int convs, const char *store_method,
                            const char *bare_method)
{
    const ctxs_geometry *g = &model->geometry;
    size_t turn_bytes = (size_t)TURN_TOKENS * 2 * g->n_layers * g->n_kv_heads
                        * g->head_dim * ELEM_BYTES;
    uint8_t *turn = xmalloc(turn_bytes);
    uint64_t seed = 0x7475726eull;
    fill_fp16(turn, turn_bytes, &seed);
    uint32_t *ids = xmalloc(CONV_TOKENS * sizeof(*ids));
    char bare_path[PATH_MAX];
    scratch_path(bare_path, "chat.ctxs");
    ctxs_create_options opts;
    session_options(&opts, CONV_CAPACITY, CTXS_SYNC_ASYNC);
    opts.ring = 0;

    conv_samples store = { 0 }, bare = { 0 };
    for (int c = 0; c < convs; c++) {
        random_ids(ids, CONV_TOKENS, 0xc0ffee00ull + (uint64_t)c);
        /* Alternate which goes first, so neither always meets the other's
         * leftover writeback. */
        for (int k = 0; k < 2; k++) {
            int in_store = (k + c) % 2 == 0;
            ctxs_session *s;
            if (in_store)
                check_ctxs(ctxs_store_session_create(&s, st, "chat", model,
                                                     &opts),
                           "ctxs_store_session_create");
            else
                check_ctxs(ctxs_session_create(&s, bare_path, model, &opts),
                           "ctxs_session_create");
            settle_disk();
            converse(s, g, turn, ids, in_store ? &store : &bare,
                     in_store ? store_method : bare_method);
            if (in_store)
                check_ctxs(ctxs_store_session_delete(st, "chat"),
                           "ctxs_store_session_delete");
            else
                check_sys(unlink(bare_path), "unlink session");
        }
    }
    uint64_t had = 0;
    char turns[64] = "";
    for (uint32_t t = 0; t < CONV_TOKENS / TURN_TOKENS; t++)
        if (index_flushes((uint64_t)(t + 1) * TURN_TOKENS / CTXS_PREFIX_CHUNK,
                          &had)) {
            size_t len = strlen(turns);
            snprintf(turns + len, sizeof turns - len, "%s%u", len ? "," : "",
                     t + 1);
        }
    const char *methods[2] = { store_method, bare_method };
    conv_samples *cs[2] = { &store, &bare };
    for (int i = 0; i < 2; i++)
        record(SEC_COMMIT, "all_turns", methods[i], &cs[i]->all, "turns 1-%d",
               CONV_TOKENS / TURN_TOKENS);
    for (int i = 0; i < 2; i++)
        record(SEC_COMMIT, "flush_turns", methods[i], &cs[i]->flush,
               "turns %s", turns);
    for (int i = 0; i < 2; i++)
        record(SEC_COMMIT, "other_turns", methods[i], &cs[i]->other,
               "the rest");
    for (int i = 0; i < 2; i++)
        record(SEC_COMMIT, "close", methods[i], &cs[i]->close, "%s",
               i == 0 ? "writes the index" : "-");
    for (int i = 0; i < 2; i++) {
        samples_free(&cs[i]->all);
        samples_free(&cs[i]->flush);
        samples_free(&cs[i]->other);
        samples_free(&cs[i]->close);
    }
    free(turn);
    free(ids);
}

static void run_commit(ctxs_store *st, const options *o)
{
    int convs = o->quick ? 1 : 3;
    ctxs_model qwen = { .geometry = { N_LAYERS, N_KV_HEADS, HEAD_DIM,
                                      CTXS_DTYPE_F16 } };
    memcpy(qwen.model_hash, "bench-qwen3-4b!!", 16);
    memcpy(qwen.tokenizer_hash, "bench-tokenizer!", 16);
    check_ctxs(ctxs_model_register(st, &qwen, "bench Qwen3-4B geometry"),
               "ctxs_model_register");
    commit_geometry(st, &qwen, convs, "store", "bare");
    /* The same with next to no K/V: the index's own cost, without the
     * session's writeback running beside it. */
    ctxs_model tiny = { .geometry = { FILLER_LAYERS, FILLER_HEADS, FILLER_DIM,
                                      CTXS_DTYPE_F16 } };
    memcpy(tiny.model_hash, "bench-tiny-model", 16);
    memcpy(tiny.tokenizer_hash, "bench-tokenizer!", 16);
    commit_geometry(st, &tiny, convs, "store_tiny", "bare_tiny");
}

/* --- Report ---------------------------------------------------------------- */

static const result *find_result(int section, const char *op,
                                 const char *method)
{
    for (int i = 0; i < g_n_results; i++)
        if (g_results[i].section == section && !strcmp(g_results[i].op, op) &&
            !strcmp(g_results[i].method, method))
            return &g_results[i];
    return NULL;
}

static double ratio_of(const result *a, const result *b)
{
    return a && b && b->median_us > 0 ? a->median_us / b->median_us : -1;
}

static void print_json(void)
{
    static const char *const sections[] = { "", "add_session", "find_prefix",
                                            "fork", "commit" };
    for (int i = 0; i < g_n_results; i++) {
        const result *r = &g_results[i];
        printf("{\"section\":\"%s\",\"op\":\"%s\",\"method\":\"%s\",\"n\":%zu,"
               "\"median_us\":%.1f,\"p99_us\":%.1f,\"min_us\":%.1f,"
               "\"max_us\":%.1f,\"info\":\"%s\"}\n",
               sections[r->section], r->op, r->method, r->n, r->median_us,
               r->p99_us, r->min_us, r->max_us, r->info);
    }
}

static void print_header(FILE *f, const options *o)
{
    fprintf(f,
        "ctxstore bench_index: files in %s, %s; page cache warm for every"
        " read (caches cannot be dropped); lookups, scans and copies get one"
        " untimed warm-up, added sessions and committed turns are each a"
        " sample, the first included; median/min/max over n samples\n"
        "\n"
        "1. find_prefix: a store of %u sessions of a tiny model (%d layer x"
        " %d head x dim %d, fp16: find_prefix reads token ids and never K/V,"
        " so its cost does not depend on the KV size), capacity %d, each"
        " holding %d tokens: one of %d system prompts of %d tokens (each"
        " shared by %u sessions), then its own random continuation, at"
        " durability NONE. All but the last %u were written as files and"
        " indexed by one ctxs_store_reindex, as a restore would (adding them"
        " all through the store would cost each what the store rows of 'add a"
        " session' say, in four durable index transactions); the last ones"
        " were added through the store. 'add a session' times the steps of"
        " both ways: store = ctxs_store_session_create, one reserve + commit"
        " of the 4096 ids, close; bare = the same with ctxs_session_create,"
        " as the files were written. The prompt looked up has %d tokens (%d"
        " chunks of %u):\n"
        "  full_hit: all of session %u's tokens. partial_hit: its first %d"
        " (system prompt + 1000), then new ones. sysprompt_hit: its system"
        " prompt, then new ones. miss: the first token is one no session"
        " holds.\n"
        "  ctxs_prefix_find: O(log n) index reads (the binary search's gets,"
        " then one cursor seek and one id->name get per listed session), then"
        " each listed session's file is opened and its ids read (at most %d"
        " per prefix); 'files' counts them. Times in us; p99: 99%% of the"
        " lookups took at most this.\n"
        "  naive_scan: what an app without the index writes: open every"
        " session file in id order, pread its header, records and token ids"
        " (the library's own peek code: no mapping, no lock), keep the"
        " longest common prefix, stop early only on a whole-prompt match"
        " (the full_hit target is in the middle of the scan). naive_open: the same"
        " through the public API (ctxs_session_open read-only + layout), miss"
        " only. Both exclude listing the files. ratio: vs ctxs_prefix_find.\n"
        "\n"
        "2. fork: Qwen3-4B KV geometry, %d layers x %d KV heads x %d dim,"
        " fp16 = %d bytes/token; a session of %d committed tokens (%zu MiB of"
        " K/V), capacity %d, copied whole. Each iteration starts on a settled"
        " disk (syncfs, untimed); the copy is removed after it (untimed), and"
        " checked against the source (K/V and ids) after the warm-up. Times"
        " in ms; ratio vs rewrite_store.\n"
        "  ctxs_store_session_fork: by name, at ASYNC, the handle returned open (its"
        " close, one more index transaction, untimed); includes the store's"
        " index transactions (each an fdatasync of the index and a"
        " synchronous write of its meta page). ctxs_session_fork: the file"
        " alone, at ASYNC, from a"
        " read-only handle opened beforehand; it syncs the new file's first"
        " page and tables before copying the K/V and the directory after"
        " linking it, and leaves the K/V to writeback. store_fork_full:"
        " ctxs_store_session_fork at FULL + ctxs_session_sync: the copy durable at"
        " return, the fair match for state_fdatasync. rewrite_store:"
        " ctxs_store_session_create + reserve + %d memcpys from the source's"
        " mapping + commit at ASYNC (which completes the first chunk, so the"
        " store indexes the 32 chunks in one more transaction). rewrite_bare: the same with ctxs_session_create."
        " state_fdatasync: open(O_TRUNC) + write() of the %zu MiB from memory"
        " + fdatasync, as llama.cpp state files. copy_file_range: the session"
        " file's data extents (SEEK_DATA/SEEK_HOLE) by copy_file_range, as cp"
        " does; no sync.\n"
        "  syncs: what each asks for. ASYNC = the K/V's writeback started,"
        " not waited for; index txns = durable LMDB transactions; FULL and"
        " fdatasync = the data on disk at return.\n"
        "\n"
        "3. commit: a %d-token conversation in %d-token turns, ASYNC,"
        " capacity %d, in a store session and in a bare one; reserve + copy"
        " untimed, then an untimed pause of %u ms (--gap-ms), then"
        " ctxs_session_commit timed. A store session writes its prefix"
        " entries (one durable index transaction) when its first chunk"
        " completes and then every %d chunks: the flush turns; a bare session"
        " never. close: the close that follows (a store session's writes its"
        " remaining entries and counters in one more transaction). Qwen3-4B geometry (store, bare), then the tiny"
        " one (store_tiny, bare_tiny: the index's cost without the turn's"
        " own 9 MiB of writeback beside it). %d conversation(s) of each,"
        " alternating which goes first. Times in us.\n\n",
        g_dir, fs_name(g_dir), o->sessions, FILLER_LAYERS, FILLER_HEADS, FILLER_DIM,
        FILLER_CAPACITY, PROMPT_TOKENS, N_SYS, SYS_TOKENS,
        (o->sessions + N_SYS - 1) / N_SYS,
        api_sessions(o), PROMPT_TOKENS,
        PROMPT_TOKENS / CTXS_PREFIX_CHUNK, CTXS_PREFIX_CHUNK, o->sessions / 2,
        PARTIAL_TOKENS, MAX_CANDIDATES,
        N_LAYERS, N_KV_HEADS, HEAD_DIM, TOKEN_BYTES, FORK_TOKENS,
        STATE_BYTES >> 20, FORK_CAPACITY, N_RUNS, STATE_BYTES >> 20,
        CONV_TOKENS, TURN_TOKENS, CONV_CAPACITY, g_gap_ms, FLUSH_CHUNKS,
        o->quick ? 1 : 3);
}

/* The rows of section in microseconds, each with its ratio (decimals
 * digits) to the row of its op by method base. */
static void print_section_us(int section, const char *base, int decimals)
{
    for (int i = 0; i < g_n_results; i++) {
        const result *r = &g_results[i];
        if (r->section != section)
            continue;
        printf("%-15s %-17s %11.1f %11.1f %11.1f %11.1f %5zu %8.*fx  %s\n", r->op, r->method,
               r->median_us, r->p99_us, r->min_us, r->max_us, r->n, decimals,
               ratio_of(r, find_result(section, r->op, base)), r->info);
    }
}

static void print_tables(void)
{
    printf("%-15s %-17s %11s %11s %11s %11s %5s %9s  %s\n", "add a session",
           "how", "median_us", "p99_us", "min_us", "max_us", "n", "vs bare",
           "");
    print_section_us(SEC_BUILD, "bare", 2);
    printf("\n%-15s %-17s %11s %11s %11s %11s %5s %9s  %s\n", "find_prefix",
           "method", "median_us", "p99_us", "min_us", "max_us", "n", "ratio",
           "index reads / files");
    print_section_us(SEC_PREFIX, "ctxs_prefix_find", 0);
    printf("\n%-15s %-17s %11s %11s %11s %5s %9s  %s\n", "fork 2048 tok",
           "method", "median_ms", "min_ms", "max_ms", "n", "ratio", "syncs");
    const result *rewrite = find_result(SEC_FORK, "fork_2048", "rewrite_store");
    for (int i = 0; i < g_n_results; i++) {
        const result *r = &g_results[i];
        if (r->section != SEC_FORK)
            continue;
        printf("%-15s %-17s %11.2f %11.2f %11.2f %5zu %8.2fx  %s\n", "",
               r->method, r->median_us / 1e3, r->min_us / 1e3,
               r->max_us / 1e3, r->n, ratio_of(r, rewrite), r->info);
    }
    printf("\n%-19s %-13s %11s %11s %11s %5s %9s  %s\n", "commit 64 tok",
           "session", "median_us", "min_us", "max_us", "n", "vs bare",
           "which");
    for (int i = 0; i < g_n_results; i++) {
        const result *r = &g_results[i];
        if (r->section != SEC_COMMIT)
            continue;
        const result *base = find_result(SEC_COMMIT, r->op,
                                         strstr(r->method, "tiny") ? "bare_tiny"
                                                                   : "bare");
        printf("%-19s %-13s %11.1f %11.1f %11.1f %5zu %8.2fx  %s\n", r->op,
               r->method, r->median_us, r->min_us, r->max_us, r->n,
               ratio_of(r, base), r->info);
    }
    print_notes(stdout);
}

static void print_headlines(void)
{
    putchar('\n');
    static const char *const cases[] = { "full_hit", "partial_hit",
                                         "sysprompt_hit", "miss" };
    for (int c = 0; c < 4; c++) {
        const result *f = find_result(SEC_PREFIX, cases[c], "ctxs_prefix_find");
        const result *n = find_result(SEC_PREFIX, cases[c], "naive_scan");
        if (f && n)
            printf("find_prefix %-13s: median %.1f us, p99 %.1f us, max %.1f"
                   " us (%s 1 ms); naive scan %.1f ms, %.0fx slower\n",
                   cases[c], f->median_us, f->p99_us, f->max_us,
                   f->max_us < 1000   ? "all under"
                   : f->p99_us < 1000 ? "p99 under"
                                      : "p99 NOT under",
                   n->median_us / 1e3, ratio_of(n, f));
    }
    const result *rw = find_result(SEC_FORK, "fork_2048", "rewrite_store");
    static const char *const forks[] = { "ctxs_store_session_fork", "ctxs_session_fork",
                                         "store_fork_full", "state_fdatasync",
                                         "copy_file_range" };
    for (size_t i = 0; i < sizeof forks / sizeof forks[0]; i++) {
        const result *r = find_result(SEC_FORK, "fork_2048", forks[i]);
        if (r && rw)
            printf("fork: %-17s %8.1f ms = %.2fx rewrite_store (%.1f ms)\n",
                   forks[i], r->median_us / 1e3, ratio_of(r, rw),
                   rw->median_us / 1e3);
    }
    static const char *const pairs[2][2] = { { "store", "bare" },
                                             { "store_tiny", "bare_tiny" } };
    for (int i = 0; i < 2; i++) {
        const result *sf = find_result(SEC_COMMIT, "flush_turns", pairs[i][0]);
        const result *bf = find_result(SEC_COMMIT, "flush_turns", pairs[i][1]);
        const result *so = find_result(SEC_COMMIT, "other_turns", pairs[i][0]);
        const result *bo = find_result(SEC_COMMIT, "other_turns", pairs[i][1]);
        if (sf && bf && so && bo)
            printf("commit (%s): the index adds %+.1f us at a flush turn"
                   " (median %.1f vs %.1f us) and %+.1f us at the others\n",
                   i ? "tiny geometry" : "Qwen3-4B", sf->median_us - bf->median_us,
                   sf->median_us, bf->median_us, so->median_us - bo->median_us);
    }
}

int main(int argc, char **argv)
{
    options o = parse_options(argc, argv);
    g_opt = &o;
    g_gap_ms = o.gap_ms;
    catch_signals(on_signal);
    make_scratch_dir(o.dir, "ctxstore-bench-index");
    scratch_path(g_store_dir, "store");

    print_header(o.json ? stderr : stdout, &o);
    fflush(stdout);
    double t0 = now_us();

    ctxs_store_options so = CTXS_STORE_OPTIONS_INIT;
    so.map_bytes = (uint64_t)4 << 30; /* room for --sessions 100000 */
    ctxs_store *st;
    check_ctxs(ctxs_store_open(&st, g_store_dir, CTXS_STORE_CREATE, &so), "ctxs_store_open");

    run_find_prefix(st, &o);
    /* The fork and the commits run in the same, populated store: their
     * index transactions meet an index of realistic size. */
    run_fork(st, &o);
    run_commit(st, &o);
    ctxs_store_close(st);
    if (o.progress)
        fputs("\r\033[K", stderr);

    if (o.json) {
        print_json();
        print_notes(stderr);
    } else {
        print_tables();
        print_headlines();
        printf("total run time: %.1f s\n", (now_us() - t0) / 1e6);
    }
    progress("removing the scratch directory");
    cleanup();
    if (o.progress)
        fputs("\r\033[K", stderr);
    return 0;
}
