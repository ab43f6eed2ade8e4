/*
 * bench_session — what saving a turn and resuming a conversation cost with
 * ctxstore, side by side with the ways people save a KV cache today.
 *
 * KV geometry of Qwen3-4B: 36 layers, 8 KV heads, head dim 128, fp16, that
 * is 147,456 bytes per token; a turn is 64 new tokens (9 MiB). For each
 * context length (512, 2048, 8192 tokens) it measures:
 *
 *   save_turn     ctxstore reserve + write through the layout + commit, at
 *                 durability NONE, ASYNC and FULL, and ASYNC without the
 *                 background thread (what reserve and commit cost on the
 *                 caller's thread alone); at ASYNC, the same with the K/V
 *                 handed over a layer at a time (ctxs_session_write_layer,
 *                 from [token][head][dim] as a forward pass makes them),
 *                 both after pauses of 50 ms, 2.5 s and 35 s (the last
 *                 stood for by the session file written back at the start
 *                 of a 2.5 s pause, as the kernel's flusher does after
 *                 30 s);
 *                 rewriting the whole state with
 *                 write() + fdatasync (what llama.cpp state files do); the
 *                 whole state as one SQLite BLOB row; and two floors: the
 *                 same bytes copied into fresh pages of a plain mapped file
 *                 (floor), and into pages already faulted in
 *                 (memcpy_resident: what no store can beat).
 *   commit        ctxs_session_commit alone, the turn already written; and
 *                 xxh3: one XXH3-64 over the turn's bytes, the hashing floor.
 *   resume_open   open + header check + close, vs reading a state file or
 *                 selecting the blob into memory.
 *   resume_ready  open + touch every page of the attention window, vs the
 *                 same read_file / sqlite_select (ready once read).
 *   scan          summing all K/V of the context through the mapping vs the
 *                 same bytes in anonymous memory.
 *
 * All of that with K/V in fp16. With bf16 and Q8 sessions (--dtype, all
 * three by default) it measures save_turn (ctxstore_async, and
 * memcpy_resident of that dtype's bytes) and resume_ready (ctxstore_async)
 * again: the engine hands the turn over in the session's own form (bf16
 * elements; Q8's int8 elements and, per (token, head), a float32 scale into
 * the layout's scale table), one memcpy per run, as with fp16. Every row
 * carries its dtype.
 *
 * Every measurement is several timed iterations after one untimed warm-up
 * (sqlite_blob's is the row that sqlite_select stored just before);
 * it reports median, min and max in microseconds. Page caches cannot be
 * dropped here, so every method reads from a warm page cache, and the disk
 * is settled (syncfs) before each timed block so that no method pays for
 * another's writeback.
 *
 * Usage: bench_session [--quick] [--tokens N] [--dir DIR] [--dtype D] [--json]
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
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>
#include <xxhash.h>

#include "bench_util.h"
#include "ctxstore.h"

const char *const bench_program = "bench_session";

/* --- Geometry -------------------------------------------------------------- */

enum {
    N_LAYERS = 36,
    N_KV_HEADS = 8,
    HEAD_DIM = 128,
    ELEM_BYTES = 2, /* fp16, bf16; Q8 has 1 and a scale per run */
    SLOT_BYTES = HEAD_DIM * ELEM_BYTES,
    /* One run = the [seq][dim] K or V of one (layer, head). */
    N_RUNS = N_LAYERS * 2 * N_KV_HEADS,
    TOKEN_BYTES = N_RUNS * SLOT_BYTES, /* 147,456 in fp16 */
    TURN_TOKENS = 64,
    N_SINK = 4,
    /* Slots past what the benchmark appends, as an app would leave some. */
    ROOM_TOKENS = 256,
    MAX_ITERS = 15,
    MAX_TOKENS = 32768,
};

#define TURN_BYTES ((size_t)TURN_TOKENS * TOKEN_BYTES)

/* --- Output ---------------------------------------------------------------- */

static const char *const k_ops[] = {
    "save_turn", "commit", "resume_open", "resume_ready", "scan",
};

static const char *const k_methods[] = {
    "ctxstore_none", "ctxstore_async", "ctxstore_layer", "ctxstore_async_nobg", "ctxstore_full",
    "rewrite_fdatasync", "sqlite_blob", "floor", "memcpy_resident", "xxh3",
    "read_file", "sqlite_select", "mapping", "anonymous",
};

static const char *const k_dtype_names[] = { "f16", "bf16", "q8" };
static const uint32_t k_dtypes[] = { CTXS_DTYPE_F16, CTXS_DTYPE_BF16, CTXS_DTYPE_Q8 };
#define N_DTYPES (sizeof k_dtypes / sizeof k_dtypes[0])

/* A row: the measurement, the dtype of the K/V it moved, and the pause
 * before each timed iteration (the one it stands for, see k_pauses). */
typedef struct session_row {
    bench_result r;
    const char *dtype; /* k_dtype_names[] */
    uint32_t pause_ms;
} session_row;

static session_row g_result_rows[256];
static result_table g_results = RESULT_TABLE(g_result_rows);

static const char *dtype_name(uint32_t dtype)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if (k_dtypes[i] == dtype)
            return k_dtype_names[i];
    return "?";
}

/* The row of op, method, tokens, dtype and pause; NULL if there is none. */
static const session_row *find_row_at(const char *op, const char *method,
                                      uint32_t tokens, const char *dtype,
                                      uint32_t pause_ms)
{
    for (size_t i = 0; i < g_results.n; i++) {
        const session_row *r = &g_result_rows[i];
        if (!strcmp(r->r.op, op) && !strcmp(r->r.method, method)
            && r->r.tokens == tokens && !strcmp(r->dtype, dtype)
            && r->pause_ms == pause_ms)
            return r;
    }
    return NULL;
}

static unsigned g_gap_ms;

/* The row of op, method, tokens and dtype at the --gap-ms pause. */
static const session_row *find_row(const char *op, const char *method,
                                   uint32_t tokens, const char *dtype)
{
    return find_row_at(op, method, tokens, dtype, g_gap_ms);
}

/* --- Files ----------------------------------------------------------------- */

enum {
    F_SESSION, F_STATE, F_REWRITE, F_FLOOR,
    F_DB, F_DB_WAL, F_DB_SHM, F_DB_JOURNAL,
    N_FILES
};

static const char *const k_file_names[N_FILES] = {
    "session.ctxs", "state.bin", "rewrite.bin", "floor.bin",
    "kv.sqlite", "kv.sqlite-wal", "kv.sqlite-shm", "kv.sqlite-journal",
};

/* Scratch files, removed on a signal. */
static char g_paths[N_FILES][PATH_MAX];

static void check_sqlite(sqlite3 *db, int rc, int want, const char *what)
{
    if (rc != want)
        die("%s failed: %s", what, db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
}

/* --- Options --------------------------------------------------------------- */

typedef struct options {
    int json;
    int quick;
    uint32_t only_tokens; /* 0 = the default list */
    const char *dir;      /* parent of our temporary directory */
    int progress;         /* stderr is a terminal */
    uint32_t gap_ms;      /* untimed pause before each timed save */
    int dtypes[N_DTYPES]; /* 1: measure K/V of k_dtypes[i] */
    int save_only;        /* save_turn at every pause, nothing else */
    int gemma3;           /* the Gemma-3-shaped comparison, nothing else */
} options;

static void usage(FILE *f)
{
    fputs("usage: bench_session [--quick] [--tokens N] [--dir DIR] [--gap-ms N]\n"
          "                     [--dtype f16|bf16|q8|all] [--save-only] [--gemma3]\n"
          "                     [--json]\n"
          "  --quick     contexts 512 and 2048 only, fewer iterations, save_turn\n"
          "              after the --gap-ms pause only\n"
          "  --save-only save_turn after each pause (50 ms, 2.5 s, 35 s), per layer,\n"
          "              through the mapping and memcpy_resident; nothing else\n"
          "  --tokens N  one context of N tokens (64..32768)\n"
          "  --dir DIR   put the files in a new directory under DIR (a real\n"
          "              disk, not tmpfs; default $TMPDIR, else /var/tmp)\n"
          "  --gap-ms N  untimed pause before each timed save, standing for\n"
          "              the time a turn takes to generate (default 50; 0 runs\n"
          "              saves back to back, each meeting the last one's writeback)\n"
          "  --dtype D   the K/V's dtype: every measurement in f16, save_turn and\n"
          "              resume_ready in bf16 and q8; all (default) is the three\n"
          "  --gemma3    Gemma 3's geometry (18 layers, 1 KV head x 256, 15\n"
          "              windowed at 512) against it with every layer global, at\n"
          "              8192 and 32768 tokens (windowed with the default batch,\n"
          "              512, and with one of 64): bytes on disk, save_turn and\n"
          "              resume_ready; nothing else\n"
          "  --json      one JSON object per measurement on stdout\n",
          f);
}

static options parse_options(int argc, char **argv)
{
    options o = { .gap_ms = 50 };
    const char *dtype = "all";
    for (int i = 1; i < argc; i++) {
        if (!flag_option(argv[i], "--json", &o.json)
            && !string_option(argc, argv, &i, "--dtype", &dtype)
            && !flag_option(argv[i], "--quick", &o.quick)
            && !flag_option(argv[i], "--save-only", &o.save_only)
            && !flag_option(argv[i], "--gemma3", &o.gemma3)
            && !count_option(argc, argv, &i, "--gap-ms", 0, 10000, &o.gap_ms)
            && !string_option(argc, argv, &i, "--dir", &o.dir)
            && !count_option(argc, argv, &i, "--tokens", TURN_TOKENS, MAX_TOKENS,
                             &o.only_tokens))
            unknown_option(argv[i], usage);
    }
    const int all = !strcmp(dtype, "all");
    int known = all;
    for (size_t i = 0; i < N_DTYPES; i++) {
        o.dtypes[i] = all || !strcmp(dtype, k_dtype_names[i]);
        known |= o.dtypes[i];
    }
    if (!known) {
        fprintf(stderr, "bench_session: --dtype takes f16, bf16, q8 or all, not %s\n", dtype);
        usage(stderr);
        exit(2);
    }
    o.progress = isatty(STDERR_FILENO);
    return o;
}

/* --- Timing and statistics ------------------------------------------------- */

/* The pause before each timed iteration, and the pause the rows say it
 * stands for (see k_pauses): --gap-ms, unless a measurement of save_turn at
 * another pause is running. */
static unsigned g_pause_ms, g_pause_label_ms;

/* A chat app saves a turn after generating it, which takes far longer than
 * the pause here: writeback started by one save has had time to run before
 * the next. Every save method gets the same pause. */
static void think(void)
{
    pause_ms(g_pause_ms);
}

/* One measurement into the table, with the dtype it moved and the pause it
 * followed; the samples are kept (results_add() copies what it needs). */
static void add_row(const char *op, const char *method, uint32_t tokens,
                    uint32_t dtype, const samples *s)
{
    session_row *r = results_add(&g_results, op, method, tokens, s);
    r->dtype = dtype_name(dtype);
    r->pause_ms = g_pause_label_ms;
}

/* --- K/V data -------------------------------------------------------------- */

/* Sums bytes as 64-bit words; the result is kept so that the reads cannot
 * be optimized away. Runs start on slot boundaries, so p is 8-byte aligned. */
static uint64_t sum_words(const uint8_t *p, size_t n)
{
    const uint64_t *w = (const uint64_t *)(const void *)p;
    size_t k = n / 8;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    size_t i = 0;
    for (; i + 4 <= k; i += 4) {
        a += w[i];
        b += w[i + 1];
        c += w[i + 2];
        d += w[i + 3];
    }
    for (; i < k; i++)
        a += w[i];
    return a + b + c + d;
}

/* Reads one byte in every page of [p, p + n), so that each page is mapped
 * into the process, as an attention pass over the span would. */
static uint64_t touch_pages(const uint8_t *p, size_t n, size_t page)
{
    if (n == 0)
        return 0;
    uint64_t acc = *(const volatile uint8_t *)p;
    uintptr_t end = (uintptr_t)p + n;
    for (uintptr_t a = ((uintptr_t)p / page + 1) * page; a < end; a += page)
        acc += *(const volatile uint8_t *)a;
    return acc;
}

static volatile uint64_t g_sink; /* where sums go so they are computed */

/* --- One context length ---------------------------------------------------- */

typedef struct bench {
    const options *opt;
    uint32_t tokens;       /* context length */
    uint32_t dtype;        /* the K/V's: F16, BF16 or Q8 */
    size_t slot_bytes;     /* one head of one token: HEAD_DIM elements */
    size_t token_bytes;    /* a token's elements, N_RUNS slots (not Q8's
                              scales) */
    int iters;             /* timed iterations of the cheap measurements */
    uint32_t capacity;     /* session slots */
    /* The engine's copy of the whole state, context + one turn of tokens,
     * laid out as the session's runs: [layer][K/V][head][tok][dim], run
     * after run state_run_stride bytes apart. Written to the state file and
     * the SQLite row, copied into the session, scanned as "anonymous". */
    uint8_t *state;
    size_t state_run_stride;
    size_t state_bytes;
    /* One turn of new K/V in the same layout, TURN_TOKENS per run. */
    uint8_t *turn;
    /* Q8: the scales of state and turn, [run][token] as the session's
     * scale table keeps them (runs tokens + TURN_TOKENS and TURN_TOKENS
     * apart); NULL for other dtypes. */
    float *state_scales;
    float *turn_scales;
    /* The same turn as an engine's forward pass hands it over, a layer at a
     * time (ctxs_session_write_layer()): for each layer, K then V, each
     * [TURN_TOKENS][N_KV_HEADS][HEAD_DIM] and, for Q8, then its
     * [TURN_TOKENS][N_KV_HEADS] scales; kind_bytes apart. */
    uint8_t *turn_layers;
    size_t kind_bytes;
    uint32_t *ids;         /* token ids, tokens + TURN_TOKENS */
    ctxs_model model;
    size_t page;
} bench;

/* One measurement of b into the table; the samples are spent. */
static void record(const bench *b, const char *op, const char *method,
                   samples *s)
{
    add_row(op, method, b->tokens, b->dtype, s);
    samples_free(s);
}

/* Bytes a context of n fp16 tokens holds. */
static size_t context_bytes(uint32_t n)
{
    return (size_t)n * TOKEN_BYTES;
}

/* Fewer iterations where one iteration moves hundreds of megabytes; never
 * fewer than five. */
static int iters_for_bytes(const bench *b, size_t bytes)
{
    if (bytes <= (size_t)64 << 20)
        return b->iters;
    if (bytes <= (size_t)512 << 20)
        return b->iters / 2 > 5 ? b->iters / 2 : 5;
    return 5;
}

static void progress(const bench *b, const char *op, const char *method)
{
    if (b->opt->progress)
        fprintf(stderr, "\r\033[K  %5u tokens, %s: %s %s ...", b->tokens,
                dtype_name(b->dtype), op, method);
}

/* Q8 values: int8 in [-127, 127] (n a multiple of 8), and scales of
 * about what a real model's K/V give, 0.01 to 0.05. */
static void fill_q8(uint8_t *p, size_t n, float *scales, size_t n_scales,
                    uint64_t *seed)
{
    for (size_t i = 0; i + 8 <= n; i += 8) {
        uint64_t w = xorshift64(seed);
        for (int j = 0; j < 8; j++) {
            uint8_t q = (uint8_t)(w >> (8 * j));
            p[i + j] = q == 0x80 ? 0x81 : q; /* -128 is not a Q8 value */
        }
    }
    for (size_t i = 0; i < n_scales; i++)
        scales[i] = 0.01f + (float)(xorshift64(seed) >> 40) * 0x1p-24f * 0.04f;
}

static void bench_init(bench *b, const options *o, uint32_t tokens, int iters,
                       uint32_t dtype)
{
    memset(b, 0, sizeof *b);
    b->opt = o;
    b->tokens = tokens;
    b->dtype = dtype;
    b->slot_bytes = dtype == CTXS_DTYPE_Q8 ? HEAD_DIM : SLOT_BYTES;
    b->token_bytes = N_RUNS * b->slot_bytes;
    b->iters = iters;
    b->page = (size_t)sysconf(_SC_PAGESIZE);
    /* Each ctxstore measurement gets its own freshly prefilled session with
     * room for its turns (warm-up included): every timed turn lands in
     * slots never written before, and no rollback reuses them. */
    b->capacity = tokens + (uint32_t)(iters + 1) * TURN_TOKENS + ROOM_TOKENS;
    b->state_run_stride = (size_t)(tokens + TURN_TOKENS) * b->slot_bytes;
    b->state_bytes = (size_t)(tokens + TURN_TOKENS) * b->token_bytes;
    b->state = xmalloc(b->state_bytes);
    b->turn = xmalloc((size_t)TURN_TOKENS * b->token_bytes);
    b->ids = xmalloc((tokens + TURN_TOKENS) * sizeof b->ids[0]);

    uint64_t seed = 0x9e3779b97f4a7c15ull ^ tokens;
    if (dtype == CTXS_DTYPE_Q8) {
        size_t n_state = (size_t)N_RUNS * (tokens + TURN_TOKENS);
        b->state_scales = xmalloc(n_state * sizeof(float));
        b->turn_scales = xmalloc((size_t)N_RUNS * TURN_TOKENS * sizeof(float));
        fill_q8(b->state, b->state_bytes, b->state_scales, n_state, &seed);
        fill_q8(b->turn, (size_t)TURN_TOKENS * b->token_bytes, b->turn_scales,
                (size_t)N_RUNS * TURN_TOKENS, &seed);
    } else {
        /* fp16 in [1, 2): as bf16 bits, finite values too. */
        fill_fp16(b->state, b->state_bytes, &seed); /* also pre-faults it */
        fill_fp16(b->turn, (size_t)TURN_TOKENS * b->token_bytes, &seed);
    }
    for (uint32_t i = 0; i < tokens + TURN_TOKENS; i++)
        b->ids[i] = (uint32_t)(xorshift64(&seed) % 151936); /* Qwen3 vocab */

    /* The layer form of the turn: the same bytes, transposed. */
    size_t elems = (size_t)TURN_TOKENS * N_KV_HEADS * b->slot_bytes;
    b->kind_bytes = elems + (b->turn_scales ? (size_t)TURN_TOKENS * N_KV_HEADS * 4 : 0);
    b->turn_layers = xmalloc((size_t)N_LAYERS * 2 * b->kind_bytes);
    for (uint32_t run = 0; run < N_RUNS; run++) {
        uint8_t *kind = b->turn_layers + (size_t)(run / N_KV_HEADS) * b->kind_bytes;
        uint32_t h = run % N_KV_HEADS;
        for (uint32_t t = 0; t < TURN_TOKENS; t++) {
            memcpy(kind + ((size_t)t * N_KV_HEADS + h) * b->slot_bytes,
                   b->turn + ((size_t)run * TURN_TOKENS + t) * b->slot_bytes, b->slot_bytes);
            if (b->turn_scales)
                memcpy(kind + elems + ((size_t)t * N_KV_HEADS + h) * 4,
                       b->turn_scales + (size_t)run * TURN_TOKENS + t, 4);
        }
    }

    b->model.geometry = (ctxs_geometry){ N_LAYERS, N_KV_HEADS, HEAD_DIM, dtype, 0, { 0 } };
    memcpy(b->model.model_hash, "bench-qwen3-4b!!", 16);
    memcpy(b->model.tokenizer_hash, "bench-tokenizer!", 16);
}

static void bench_free(bench *b)
{
    free(b->state);
    free(b->turn);
    free(b->state_scales);
    free(b->turn_scales);
    free(b->turn_layers);
    free(b->ids);
    remove_scratch_files();
}

/* --- ctxstore helpers ------------------------------------------------------ */

/* Copies src (runs src_run_stride bytes apart, starting at token src_tok)
 * into the slots of reservation r, one memcpy per span and run: the way an
 * engine that keeps its new K/V per (layer, head) hands them over. For Q8,
 * src_scales ([run][token], runs src_run_tokens apart) go into the scale
 * table the same way, one memcpy per span and run. */
static void copy_into_reservation(const ctxs_layout *lay,
                                  const ctxs_reservation *r,
                                  const uint8_t *src, size_t src_run_stride,
                                  const float *src_scales,
                                  size_t src_run_tokens, uint32_t src_tok)
{
    const size_t sb = lay->slot_bytes;
    for (uint32_t j = 0; j < r->n_spans; j++) {
        size_t bytes = (size_t)r->spans[j].count * sb;
        size_t dst_off = (size_t)r->spans[j].slot * sb;
        for (uint32_t run = 0; run < N_RUNS; run++)
            memcpy(kv_run(lay, N_KV_HEADS, run) + dst_off,
                   src + run * src_run_stride + (size_t)src_tok * sb,
                   bytes);
        /* The table is [layer][K/V][head][capacity]: run after run. */
        for (uint32_t run = 0; src_scales && run < N_RUNS; run++)
            memcpy(lay->scales + (size_t)run * lay->capacity + r->spans[j].slot,
                   src_scales + run * src_run_tokens + src_tok,
                   (size_t)r->spans[j].count * sizeof(float));
        src_tok += r->spans[j].count;
    }
}

static ctxs_session *open_session(const bench *b, uint32_t durability, int background)
{
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.open.durability = durability;
    o.open.background = (uint32_t)background;
    ctxs_session *s;
    check_ctxs(ctxs_session_open(&s, g_paths[F_SESSION], &b->model, 0, &o.open),
               "ctxs_session_open");
    return s;
}

/* Reserves one turn and writes its K/V; the commit is the caller's. */
static void write_turn(ctxs_session *s, const ctxs_layout *lay,
                       const bench *b)
{
    ctxs_reservation r;
    check_ctxs(ctxs_session_reserve(&r, s, TURN_TOKENS),
               "ctxs_session_reserve");
    if (r.n_tokens != TURN_TOKENS)
        die("ctxs_session_reserve: %u tokens reserved, asked %d", r.n_tokens,
            TURN_TOKENS);
    copy_into_reservation(lay, &r, b->turn, (size_t)TURN_TOKENS * b->slot_bytes,
                          b->turn_scales, TURN_TOKENS, 0);
}

/* Reserves one turn and hands its K/V over a layer at a time, as a
 * forward pass would; the commit is the caller's. */
static void write_turn_layers(ctxs_session *s, const bench *b)
{
    ctxs_reservation r;
    check_ctxs(ctxs_session_reserve(&r, s, TURN_TOKENS), "ctxs_session_reserve");
    for (uint32_t l = 0; l < N_LAYERS; l++) {
        const uint8_t *k = b->turn_layers + (size_t)l * 2 * b->kind_bytes;
        check_ctxs(ctxs_session_write_layer(s, &r, l, 0, TURN_TOKENS, k, k + b->kind_bytes,
                                            b->dtype),
                   "ctxs_session_write_layer");
    }
}

static void commit_turn(ctxs_session *s, const bench *b)
{
    check_ctxs(ctxs_session_commit(s, b->ids, TURN_TOKENS),
               "ctxs_session_commit");
}

/* Creates the session and fills it to the context length, untimed, then
 * makes it durable so that no measurement pays for the prefill's
 * writeback. */
static void prefill_session(const bench *b)
{
    progress(b, "prefill", "");
    unlink(g_paths[F_SESSION]); /* the previous measurement's */
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = b->capacity;
    o.n_sink = N_SINK;
    o.ring = 0; /* a wrap would reuse slots; fail loudly instead */
    ctxs_session *s;
    check_ctxs(ctxs_session_create(&s, g_paths[F_SESSION], &b->model, &o),
               "ctxs_session_create");
    ctxs_layout lay;
    get_layout(&lay, s, b->slot_bytes);
    ctxs_reservation r;
    check_ctxs(ctxs_session_reserve(&r, s, b->tokens), "ctxs_session_reserve");
    copy_into_reservation(&lay, &r, b->state, b->state_run_stride,
                          b->state_scales, (size_t)b->tokens + TURN_TOKENS, 0);
    check_ctxs(ctxs_session_commit(s, b->ids, b->tokens),
               "ctxs_session_commit");
    check_ctxs(ctxs_session_sync(s), "ctxs_session_sync");
    ctxs_session_close(s);
    settle_disk();
}

static void remove_session(void)
{
    check_sys(unlink(g_paths[F_SESSION]), "unlink session");
}

/* --- save_turn and commit -------------------------------------------------- */

static const char *durability_method(uint32_t durability)
{
    switch (durability) {
    case CTXS_SYNC_NONE: return "ctxstore_none";
    case CTXS_SYNC_ASYNC: return "ctxstore_async";
    default: return "ctxstore_full";
    }
}

static double cpu_us(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* What the kernel's flusher does to a file left alone for 30 s: every
 * dirty page written back, clean and write-protected (see k_pauses_ms). */
static void write_back_session(void)
{
    int fd = open(g_paths[F_SESSION], O_RDONLY | O_CLOEXEC);
    check_sys(fd, "open session for writeback");
    check_sys(fdatasync(fd), "fdatasync session");
    check_sys(close(fd), "close session");
}

/* Pages of the file at path dirty in the page cache (cachestat(2), Linux
 * 6.5); -1 where that cannot be asked. */
static long dirty_pages(const char *path)
{
#if defined(__linux__) && (defined(__x86_64__) || defined(__aarch64__))
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct { uint64_t off, len; } range = { 0, 0 }; /* 0: to the end */
    struct { uint64_t cache, dirty, writeback, evicted, recently_evicted; } cs;
    long rc = syscall(451 /* cachestat */, fd, &range, &cs, 0);
    close(fd);
    return rc == 0 ? (long)cs.dirty : -1;
#else
    (void)path;
    return -1;
#endif
}

/* A turn written and committed through s (a warm-up), then the disk
 * settled; *lay the layout of s. */
static void warm_up(ctxs_session *s, ctxs_layout *lay, const bench *b)
{
    get_layout(lay, s, b->slot_bytes);
    write_turn(s, lay, b);
    commit_turn(s, b);
    settle_disk();
}

/* Each iteration appends a turn into never-written slots; the context grows
 * by one turn per iteration (commit cost does not depend on it). A turn is
 * stored through the mapping (one memcpy per run), or with layers, handed
 * over with ctxs_session_write_layer() a layer at a time. The CPU time the
 * process spent beside this thread over the turns (the background thread's
 * writeback and runway: this program runs no other thread) is noted per
 * turn, and where the pause stands for a longer one, the dirty pages of the
 * session file before each turn (the flusher should have left none). */
static void measure_save_turn_ctxstore(const bench *b, uint32_t durability, int background,
                                       int layers)
{
    const char *method = layers ? "ctxstore_layer"
                         : background ? durability_method(durability) : "ctxstore_async_nobg";
    progress(b, "save_turn", method);
    ctxs_session *s = open_session(b, durability, background);
    ctxs_layout lay;
    warm_up(s, &lay, b);
    samples sm = { 0 };
    long dirty_max = -1;
    double beside0 = cpu_us(CLOCK_PROCESS_CPUTIME_ID) - cpu_us(CLOCK_THREAD_CPUTIME_ID);
    for (int i = 0; i < b->iters; i++) {
        if (g_pause_label_ms != g_pause_ms) {
            write_back_session();
            long d = dirty_pages(g_paths[F_SESSION]);
            dirty_max = d > dirty_max ? d : dirty_max;
        }
        think();
        double t0 = now_us();
        if (layers)
            write_turn_layers(s, b);
        else
            write_turn(s, &lay, b);
        commit_turn(s, b);
        samples_add(&sm, now_us() - t0);
    }
    think(); /* the last turn's background work */
    double beside = cpu_us(CLOCK_PROCESS_CPUTIME_ID) - cpu_us(CLOCK_THREAD_CPUTIME_ID) - beside0;
    ctxs_session_close(s);
    if (background)
        add_note("save_turn %s %s at %u tokens after %u ms: background thread CPU %.0f us per"
                 " turn", method, dtype_name(b->dtype), b->tokens, g_pause_label_ms,
                 beside / b->iters);
    if (g_pause_label_ms != g_pause_ms && dirty_max >= 0)
        add_note("save_turn %s %s at %u tokens after %u ms (stood for): at most %ld dirty pages"
                 " in the session file after its writeback", method, dtype_name(b->dtype), b->tokens,
                 g_pause_label_ms, dirty_max);
    record(b, "save_turn", method, &sm);
}

static void measure_commit_ctxstore(const bench *b, uint32_t durability)
{
    const char *method = durability_method(durability);
    progress(b, "commit", method);
    ctxs_session *s = open_session(b, durability, 1);
    ctxs_layout lay;
    warm_up(s, &lay, b);
    samples sm = { 0 };
    for (int i = 0; i < b->iters; i++) {
        write_turn(s, &lay, b);
        think();
        double t0 = now_us();
        commit_turn(s, b);
        samples_add(&sm, now_us() - t0);
    }
    ctxs_session_close(s);
    record(b, "commit", method, &sm);
}

/* The least any mapped store can cost: the turn's bytes copied, run by run,
 * into pages of a mapped file that were never touched (sized with ftruncate;
 * each iteration gets its own region). No sync. Its blocks are allocated
 * beforehand, untimed, so that it is a lower bound (ctxstore allocates its
 * blocks in reserve, timed); in a sparse file, writes into holes also pay
 * ext4's delayed allocation, in irregular stalls.
 *
 * With small_pages the mapping is MADV_RANDOM, as ctxstore maps its KV: no
 * readahead, so no large folios, one fault per 4 KiB page. With readahead's
 * large folios a write dirties a whole folio and writeback of scattered
 * turns rewrites far more than the turn, which a store cannot afford. */
static samples floor_samples(const bench *b, int small_pages)
{
    size_t bytes = (size_t)(b->iters + 1) * TURN_BYTES;
    int fd = open(g_paths[F_FLOOR], O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC,
                  0600);
    check_sys(fd, "open floor file");
    check_sys(ftruncate(fd, (off_t)bytes), "ftruncate floor file");
#ifdef __linux__
    check_sys(fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, (off_t)bytes),
              "fallocate floor file");
#endif
    uint8_t *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED)
        die("mmap floor file failed: %s", strerror(errno));
    if (small_pages)
        check_sys(madvise(map, bytes, MADV_RANDOM), "madvise floor file");
    const size_t run_bytes = (size_t)TURN_TOKENS * SLOT_BYTES;
    samples sm = { 0 };
    for (int i = 0; i <= b->iters; i++) {
        uint8_t *dst = map + (size_t)i * TURN_BYTES;
        if (i > 0)
            think();
        double t0 = now_us();
        for (uint32_t run = 0; run < N_RUNS; run++)
            memcpy(dst + run * run_bytes, b->turn + run * run_bytes,
                   run_bytes);
        double t = now_us() - t0;
        if (i == 0)
            settle_disk(); /* after the warm-up */
        else
            samples_add(&sm, t);
    }
    check_sys(munmap(map, bytes), "munmap floor file");
    check_sys(close(fd), "close floor file");
    check_sys(unlink(g_paths[F_FLOOR]), "unlink floor file");
    return sm;
}

/* The floor of floors: the turn copied run by run into pages already
 * faulted in and writable (written once, untimed), as a store's runway
 * leaves them (for Q8, then the scales run by run, as into the scale
 * table); each iteration gets its own region. Then, as a commit meets
 * the turn it checksums (written, then a pause), the hashing floor: one
 * XXH3-64 over the turn's bytes, after the same pause (fp16 only, where
 * the commit is measured). */
static void measure_memcpy_resident_and_xxh3(const bench *b)
{
    progress(b, "save_turn", "memcpy_resident");
    const size_t turn_bytes = (size_t)TURN_TOKENS * b->token_bytes;
    const size_t scale_bytes = b->turn_scales ? (size_t)N_RUNS * TURN_TOKENS * sizeof(float) : 0;
    const size_t stride = turn_bytes + scale_bytes;
    size_t bytes = (size_t)(b->iters + 1) * stride;
    uint8_t *area = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (area == MAP_FAILED)
        die("mmap %zu anonymous bytes failed: %s", bytes, strerror(errno));
    memset(area, 1, bytes);
    const size_t run_bytes = (size_t)TURN_TOKENS * b->slot_bytes;
    const size_t run_scales = (size_t)TURN_TOKENS * sizeof(float);
    samples sm = { 0 }, hash = { 0 };
    for (int i = 0; i < b->iters; i++) {
        uint8_t *dst = area + (size_t)i * stride;
        think();
        double t0 = now_us();
        for (uint32_t run = 0; run < N_RUNS; run++)
            memcpy(dst + run * run_bytes, b->turn + run * run_bytes, run_bytes);
        for (uint32_t run = 0; scale_bytes && run < N_RUNS; run++)
            memcpy(dst + turn_bytes + run * run_scales,
                   (const uint8_t *)b->turn_scales + run * run_scales, run_scales);
        samples_add(&sm, now_us() - t0);
        think();
        t0 = now_us();
        g_sink += XXH3_64bits(dst, stride);
        samples_add(&hash, now_us() - t0);
    }
    g_sink += area[bytes - 1];
    check_sys(munmap(area, bytes), "munmap memcpy_resident");
    record(b, "save_turn", "memcpy_resident", &sm);
    if (b->dtype == CTXS_DTYPE_F16 && g_pause_label_ms == g_gap_ms)
        record(b, "commit", "xxh3", &hash);
    else
        samples_free(&hash);
}

static void measure_floor(const bench *b)
{
    progress(b, "save_turn", "floor");
    samples sm = floor_samples(b, 0);
    record(b, "save_turn", "floor", &sm);
    samples small = floor_samples(b, 1);
    bench_result r = summarize("save_turn", "floor (4 KiB pages)", b->tokens,
                               &small);
    samples_free(&small);
    add_note("floor with 4 KiB pages (MADV_RANDOM, as ctxstore maps its KV) at %u"
             " tokens: median %.1f us", b->tokens, r.median_us);
}

/* Replaces a file with n bytes, durably: what llama.cpp's state files do on
 * every save (fopen "wb" truncates, then the whole KV is written). */
static void rewrite_file(const char *path, const uint8_t *p, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    check_sys(fd, "open state file");
    write_all(fd, p, n, path);
    check_sys(fdatasync(fd), "fdatasync state file");
    check_sys(close(fd), "close state file");
}

static void measure_rewrite(const bench *b)
{
    progress(b, "save_turn", "rewrite_fdatasync");
    int iters = iters_for_bytes(b, b->state_bytes);
    rewrite_file(g_paths[F_REWRITE], b->state, b->state_bytes); /* warm-up */
    settle_disk();
    samples sm = { 0 };
    for (int i = 0; i < iters; i++) {
        think();
        double t0 = now_us();
        rewrite_file(g_paths[F_REWRITE], b->state, b->state_bytes);
        samples_add(&sm, now_us() - t0);
    }
    check_sys(unlink(g_paths[F_REWRITE]), "unlink state file");
    record(b, "save_turn", "rewrite_fdatasync", &sm);
}

/* --- SQLite ---------------------------------------------------------------- */

static sqlite3 *open_db(void)
{
    sqlite3 *db = NULL;
    int rc = sqlite3_open_v2(g_paths[F_DB], &db,
                             SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
    check_sqlite(db, rc, SQLITE_OK, "sqlite3_open_v2");
    return db;
}

/* WAL with synchronous=NORMAL: the usual setting for an app database, and
 * the kindest to SQLite (the WAL is synced only at checkpoints). */
static sqlite3 *open_db_for_writing(void)
{
    sqlite3 *db = open_db();
    check_sqlite(db,
                 sqlite3_exec(db,
                              "PRAGMA journal_mode=WAL;"
                              "PRAGMA synchronous=NORMAL;"
                              "CREATE TABLE IF NOT EXISTS sessions("
                              " id INTEGER PRIMARY KEY, kv BLOB NOT NULL);",
                              NULL, NULL, NULL),
                 SQLITE_OK, "sqlite3 schema");
    return db;
}

/* 1 if a blob of n bytes fits in one row under this SQLite's length limit
 * (SQLITE_MAX_LENGTH, 1,000,000,000 by default, cannot be raised at run
 * time); otherwise notes why the measurement is skipped. */
static int blob_fits(sqlite3 *db, size_t n, const char *op, uint32_t tokens)
{
    int limit = sqlite3_limit(db, SQLITE_LIMIT_LENGTH, -1);
    if (n <= (size_t)limit)
        return 1;
    add_note("%s sqlite_%s at %u tokens skipped: the state (%zu bytes) "
             "exceeds SQLite's maximum blob length (%d bytes)",
             op, strcmp(op, "save_turn") ? "select" : "blob", tokens, n, limit);
    return 0;
}

static void upsert_blob(sqlite3 *db, sqlite3_stmt *st, const uint8_t *p,
                        size_t n)
{
    check_sqlite(db, sqlite3_bind_blob64(st, 1, p, n, SQLITE_STATIC),
                 SQLITE_OK, "sqlite3_bind_blob64");
    check_sqlite(db, sqlite3_step(st), SQLITE_DONE, "INSERT OR REPLACE");
    check_sqlite(db, sqlite3_reset(st), SQLITE_OK, "sqlite3_reset");
}

/* The database open for writing with its upsert statement in *st, or
 * NULL (closed) when a row of n bytes does not fit (blob_fits()). */
static sqlite3 *open_upsert(sqlite3_stmt **st, size_t n, const char *op, uint32_t tokens)
{
    sqlite3 *db = open_db_for_writing();
    if (!blob_fits(db, n, op, tokens)) {
        sqlite3_close(db);
        return NULL;
    }
    check_sqlite(db,
                 sqlite3_prepare_v2(db, "INSERT OR REPLACE INTO sessions"
                                        "(id, kv) VALUES (1, ?1)",
                                    -1, st, NULL),
                 SQLITE_OK, "sqlite3_prepare_v2");
    return db;
}

/* Stores n bytes of the state as the session's row; untimed when called
 * outside a measurement. Returns 0 when the blob does not fit. */
static int store_blob(const uint8_t *p, size_t n, const char *op,
                      uint32_t tokens)
{
    sqlite3_stmt *st;
    sqlite3 *db = open_upsert(&st, n, op, tokens);
    if (!db)
        return 0;
    upsert_blob(db, st, p, n);
    sqlite3_finalize(st);
    check_sqlite(db, sqlite3_close(db), SQLITE_OK, "sqlite3_close");
    return 1;
}

/* The app keeps its connection and statement: only bind + step is timed,
 * which includes the automatic checkpoint (WAL into the database, synced)
 * that SQLite runs after a commit that grew the WAL past 1000 pages. */
static void measure_sqlite_blob(const bench *b)
{
    progress(b, "save_turn", "sqlite_blob");
    sqlite3_stmt *st;
    sqlite3 *db = open_upsert(&st, b->state_bytes, "save_turn", b->tokens);
    if (!db)
        return;
    int iters = iters_for_bytes(b, b->state_bytes);
    /* No warm-up of its own: run_context() calls this right after
     * measure_sqlite_select(), whose row of nearly the same size leaves the
     * database in the steady state where every statement replaces a row,
     * and saves a write of hundreds of megabytes. */
    settle_disk();
    samples sm = { 0 };
    for (int i = 0; i < iters; i++) {
        think();
        double t0 = now_us();
        upsert_blob(db, st, b->state, b->state_bytes);
        samples_add(&sm, now_us() - t0);
    }
    sqlite3_finalize(st);
    check_sqlite(db, sqlite3_close(db), SQLITE_OK, "sqlite3_close");
    record(b, "save_turn", "sqlite_blob", &sm);
}

/* A resumed app: open the database, select the row, copy it into its own
 * buffer (the statement's memory is gone at finalize), close. */
static uint8_t *select_blob(size_t *n)
{
    sqlite3 *db = open_db();
    sqlite3_stmt *st;
    check_sqlite(db,
                 sqlite3_prepare_v2(db, "SELECT kv FROM sessions WHERE id = 1",
                                    -1, &st, NULL),
                 SQLITE_OK, "sqlite3_prepare_v2");
    check_sqlite(db, sqlite3_step(st), SQLITE_ROW, "SELECT");
    const void *blob = sqlite3_column_blob(st, 0);
    *n = (size_t)sqlite3_column_bytes(st, 0);
    if (!blob)
        die("SELECT returned no blob: %s", sqlite3_errmsg(db));
    uint8_t *copy = xmalloc(*n);
    memcpy(copy, blob, *n);
    sqlite3_finalize(st);
    check_sqlite(db, sqlite3_close(db), SQLITE_OK, "sqlite3_close");
    return copy;
}

/* --- resume ---------------------------------------------------------------- */

static void check_info(ctxs_session *s, const bench *b)
{
    ctxs_session_info info;
    check_ctxs(ctxs_session_get_info(&info, s), "ctxs_session_get_info");
    if (info.n_tokens != b->tokens)
        die("resumed session holds %" PRIu64 " tokens, expected %u",
            info.n_tokens, b->tokens);
}

/* op with ctxstore: the open of the session (ASYNC) and use(s, b) on it,
 * then its close, timed b->iters times after a warm-up. */
static void measure_resume(const bench *b, const char *op,
                           uint64_t (*use)(ctxs_session *s, const bench *b))
{
    progress(b, op, "ctxstore_async");
    samples sm = { 0 };
    for (int i = 0; i <= b->iters; i++) {
        double t0 = now_us();
        ctxs_session *s = open_session(b, CTXS_SYNC_ASYNC, 1);
        g_sink += use(s, b);
        ctxs_session_close(s);
        if (i > 0) /* the first is the warm-up */
            samples_add(&sm, now_us() - t0);
    }
    record(b, op, "ctxstore_async", &sm);
}

/* resume_open's use: the session's info, checked. */
static uint64_t info_checked(ctxs_session *s, const bench *b)
{
    check_info(s, b);
    return 0;
}

/* Ready for attention: every page of the window's spans, in every run, is
 * mapped in, as the first decode step would need. */
static uint64_t touch_window(ctxs_session *s, const bench *b)
{
    ctxs_window w;
    ctxs_layout lay;
    check_ctxs(ctxs_session_get_window(&w, s), "ctxs_session_get_window");
    get_layout(&lay, s, b->slot_bytes);
    uint64_t acc = 0;
    for (uint32_t run = 0; run < N_RUNS; run++) {
        const uint8_t *base = kv_run(&lay, N_KV_HEADS, run);
        for (uint32_t j = 0; j < w.n_spans; j++)
            acc += touch_pages(base + (size_t)w.spans[j].slot * b->slot_bytes,
                               (size_t)w.spans[j].count * b->slot_bytes, b->page);
    }
    /* Q8: attention reads the scales of the same slots. */
    for (uint32_t run = 0; lay.scales && run < N_RUNS; run++)
        for (uint32_t j = 0; j < w.n_spans; j++)
            acc += touch_pages((const uint8_t *)(lay.scales + (size_t)run * lay.capacity
                                                 + w.spans[j].slot),
                               (size_t)w.spans[j].count * sizeof(float), b->page);
    return acc;
}


static uint8_t *read_whole_file(const char *path, size_t *n)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    check_sys(fd, "open state file");
    struct stat st;
    check_sys(fstat(fd, &st), "fstat state file");
    *n = (size_t)st.st_size;
    uint8_t *p = xmalloc(*n);
    size_t got = 0;
    while (got < *n) {
        ssize_t r = read(fd, p + got, *n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            die("read %s failed: %s", path, r < 0 ? strerror(errno) : "short");
        got += (size_t)r;
    }
    check_sys(close(fd), "close state file");
    return p;
}

/* A state file and a SQLite row are ready once read: the same measurement
 * stands for resume_open and resume_ready. */
static void record_both_resumes(const char *method, const bench *b,
                                samples *sm)
{
    add_row("resume_open", method, b->tokens, b->dtype, sm);
    record(b, "resume_ready", method, sm);
}

static void measure_read_file(const bench *b)
{
    progress(b, "resume", "read_file");
    size_t bytes = context_bytes(b->tokens);
    rewrite_file(g_paths[F_STATE], b->state, bytes);
    samples sm = { 0 };
    int iters = iters_for_bytes(b, bytes);
    for (int i = 0; i <= iters; i++) {
        size_t n;
        double t0 = now_us();
        uint8_t *p = read_whole_file(g_paths[F_STATE], &n);
        double t = now_us() - t0;
        if (n != bytes)
            die("state file holds %zu bytes, expected %zu", n, bytes);
        free(p);
        if (i > 0)
            samples_add(&sm, t);
    }
    check_sys(unlink(g_paths[F_STATE]), "unlink state file");
    record_both_resumes("read_file", b, &sm);
}

static void measure_sqlite_select(const bench *b)
{
    progress(b, "resume", "sqlite_select");
    size_t bytes = context_bytes(b->tokens);
    if (!store_blob(b->state, bytes, "resume", b->tokens))
        return;
    settle_disk();
    samples sm = { 0 };
    int iters = iters_for_bytes(b, bytes);
    for (int i = 0; i <= iters; i++) {
        size_t n;
        double t0 = now_us();
        uint8_t *p = select_blob(&n);
        double t = now_us() - t0;
        if (n != bytes)
            die("SELECT returned %zu bytes, expected %zu", n, bytes);
        free(p);
        if (i > 0)
            samples_add(&sm, t);
    }
    record_both_resumes("sqlite_select", b, &sm);
}

/* --- scan ------------------------------------------------------------------ */

static uint64_t scan_mapping(const ctxs_layout *lay, uint32_t tokens)
{
    uint64_t acc = 0;
    for (uint32_t run = 0; run < N_RUNS; run++)
        acc += sum_words(kv_run(lay, N_KV_HEADS, run), (size_t)tokens * SLOT_BYTES);
    return acc;
}

static uint64_t scan_anonymous(const bench *b)
{
    uint64_t acc = 0;
    for (uint32_t run = 0; run < N_RUNS; run++)
        acc += sum_words(b->state + run * b->state_run_stride,
                         (size_t)b->tokens * SLOT_BYTES);
    return acc;
}

/* Both scans read the same bytes in the same order, so their sums must
 * agree: a cheap end-to-end check that the session returns what was
 * written. */
static void measure_scan(const bench *b)
{
    progress(b, "scan", "mapping");
    ctxs_session *s = open_session(b, CTXS_SYNC_ASYNC, 1);
    ctxs_layout lay;
    get_layout(&lay, s, b->slot_bytes);
    uint64_t mapped_sum = scan_mapping(&lay, b->tokens); /* warm-up */
    samples sm = { 0 };
    for (int i = 0; i < b->iters; i++) {
        double t0 = now_us();
        g_sink += scan_mapping(&lay, b->tokens);
        samples_add(&sm, now_us() - t0);
    }
    ctxs_session_close(s);
    record(b, "scan", "mapping", &sm);

    progress(b, "scan", "anonymous");
    uint64_t anon_sum = scan_anonymous(b); /* warm-up */
    for (int i = 0; i < b->iters; i++) {
        double t0 = now_us();
        g_sink += scan_anonymous(b);
        samples_add(&sm, now_us() - t0);
    }
    record(b, "scan", "anonymous", &sm);
    if (mapped_sum != anon_sum)
        die("the session's K/V differ from what was written (sum %016" PRIx64
            " through the mapping, %016" PRIx64 " written)",
            mapped_sum, anon_sum);
}

/* Untimed: the library's own check that every held token verifies, after
 * all the appends. */
static void verify_session(const bench *b)
{
    progress(b, "verify", "");
    ctxs_session *s = open_session(b, CTXS_SYNC_ASYNC, 1);
    uint64_t bad = 0;
    int rc = ctxs_session_verify(&bad, s);
    if (rc == CTXS_ECORRUPT)
        die("ctxs_session_verify: token %" PRIu64 " does not verify", bad);
    check_ctxs(rc, "ctxs_session_verify");
    ctxs_session_close(s);
}

/* --- Pauses ---------------------------------------------------------------- */

/* save_turn through the mapping and with ctxs_session_write_layer(), and
 * memcpy_resident, after each of these pauses: a turn's generation, a user
 * who types the next message, one who reads for longer than the kernel's
 * flusher waits (vm.dirty_expire_centisecs, 30 s) before it writes back
 * the runway, and with it write-protects its pages. */
static const uint32_t k_pauses_ms[] = { 50, 2500, 35000 };

/* The last stands for its length: the session file is written back
 * (fdatasync) and a pause of 2.5 s follows, as the kernel's flusher writes
 * back a file whose pages have been dirty for vm.dirty_expire_centisecs
 * (30 s), waking every 5 s: every page clean and write-protected, the
 * runway's too, 0-5 s before the user's next turn. (Lowering that sysctl
 * for the run instead makes the flusher write back everything of every
 * process on the machine every second; on the shared 2-core VM that
 * scattered these timings 2-4x.) A note says how many pages of the file
 * were dirty right after each writeback: the runway's, where the worker
 * has already mapped it again. */
#define LONG_PAUSE_MS 35000u
#define STAND_IN_PAUSE_MS 2500u

/* save_turn at every pause: per layer, through the mapping, and the
 * memcpy floor, each turn after the pause (at LONG_PAUSE_MS, as it stands
 * for it). At the --gap-ms pause too, when it is not one of them; at that
 * one alone with --quick. */
static void measure_pauses(bench *b)
{
    uint32_t pauses[4];
    size_t n = 0;
    int gap_listed = 0;
    for (size_t i = 0; !b->opt->quick && i < sizeof k_pauses_ms / sizeof k_pauses_ms[0]; i++)
        gap_listed |= k_pauses_ms[i] == g_gap_ms;
    if (!gap_listed)
        pauses[n++] = g_gap_ms;
    for (size_t i = 0; !b->opt->quick && i < sizeof k_pauses_ms / sizeof k_pauses_ms[0]; i++)
        pauses[n++] = k_pauses_ms[i];
    for (size_t i = 0; i < n; i++) {
        int stand_in = pauses[i] == LONG_PAUSE_MS && pauses[i] != g_gap_ms;
        g_pause_label_ms = pauses[i];
        g_pause_ms = stand_in ? STAND_IN_PAUSE_MS : pauses[i];
        int iters = b->iters;
        if (g_pause_ms >= 1000 && b->iters > 7)
            b->iters = 7; /* a minute a row is enough */
        for (int layers = 1; layers >= 0; layers--) {
            prefill_session(b);
            measure_save_turn_ctxstore(b, CTXS_SYNC_ASYNC, 1, layers);
            verify_session(b);
            remove_session();
        }
        measure_memcpy_resident_and_xxh3(b);
        b->iters = iters;
    }
    g_pause_ms = g_pause_label_ms = g_gap_ms;
}

/* --- Driver ---------------------------------------------------------------- */

/* Everything, with fp16 K/V. */
static void run_context(const options *o, uint32_t tokens, int iters)
{
    bench b;
    bench_init(&b, o, tokens, iters, CTXS_DTYPE_F16);
    static const uint32_t levels[] = { CTXS_SYNC_NONE, CTXS_SYNC_ASYNC,
                                       CTXS_SYNC_FULL };

    measure_pauses(&b);
    if (o->save_only) {
        bench_free(&b);
        settle_disk();
        return;
    }
    prefill_session(&b);
    measure_resume(&b, "resume_open", info_checked);
    measure_resume(&b, "resume_ready", touch_window);
    measure_scan(&b);
    remove_session();
    measure_read_file(&b);

    for (int i = 0; i < 3; i++) {
        uint32_t level = i < 2 ? levels[2 * i] : CTXS_SYNC_ASYNC; /* NONE, FULL */
        prefill_session(&b);
        measure_save_turn_ctxstore(&b, level, i < 2, 0);
        verify_session(&b);
        remove_session();
    }
    measure_floor(&b);
    measure_rewrite(&b);
    measure_sqlite_select(&b); /* then sqlite_blob replaces its row */
    measure_sqlite_blob(&b);

    for (int i = 0; i < 3; i++) {
        prefill_session(&b);
        measure_commit_ctxstore(&b, levels[i]);
        verify_session(&b);
        remove_session();
    }

    bench_free(&b);
    settle_disk();
}

/* A turn saved and a resume made ready with K/V of another dtype. */
static void run_context_dtype(const options *o, uint32_t tokens, int iters,
                              uint32_t dtype)
{
    bench b;
    bench_init(&b, o, tokens, iters, dtype);
    if (!o->save_only) {
        prefill_session(&b);
        measure_resume(&b, "resume_ready", touch_window);
        remove_session();
    }
    measure_pauses(&b);
    bench_free(&b);
    settle_disk();
}

/* --- Gemma-3-shaped sessions ------------------------------------------------ */

/*
 * Gemma 3's KV geometry (18 layers, 1 KV head x 256, fp16; 5 of every 6
 * layers attend to the last 512 tokens only), against the same geometry
 * with every layer global: the file's bytes on disk next to the bytes the
 * model's layers can read, a turn's save, and a resume made ready (every
 * page each layer's attention reads mapped in).
 */
enum { G3_LAYERS = 18, G3_HEAD_DIM = 256, G3_WINDOW = 512, G3_PERIOD = 6 };

/* The three sessions compared: every layer global; windowed, with the
 * default batch (512: each windowed layer keeps 512 + 512 slots); windowed
 * with a batch of one turn (64: 512 + 64 slots), an engine that writes at
 * most a turn at a time, prefill included. */
enum { G3_GLOBAL, G3_WINDOWED, G3_WINDOWED_B64 };
static const char *const k_g3_methods[] = { "gemma3_global", "gemma3_windowed",
                                            "gemma3_windowed_b64" };

typedef struct g3_file {
    uint32_t tokens;
    int windowed;
    uint64_t disk_bytes, readable_bytes;
} g3_file;

static g3_file g_g3_files[12];
static size_t g_g3_n;

static ctxs_model g3_model(int windowed)
{
    ctxs_model m;
    memset(&m, 0, sizeof m);
    m.geometry = (ctxs_geometry){ G3_LAYERS, 1, G3_HEAD_DIM, CTXS_DTYPE_F16, 0, { 0 } };
    if (windowed) {
        m.geometry.period = G3_PERIOD;
        for (uint32_t j = 0; j + 1 < G3_PERIOD; j++)
            m.geometry.window[j] = G3_WINDOW;
    }
    memset(m.model_hash, 0x33, sizeof m.model_hash);
    memset(m.tokenizer_hash, 0x44, sizeof m.tokenizer_hash);
    return m;
}

/* Appends n tokens of K/V (k and v: one token's, fp16) in turns of at most
 * batch, each committed. */
static void g3_append(ctxs_session *s, uint32_t n, uint32_t batch, const uint16_t *k,
                      const uint16_t *v, uint32_t *ids)
{
    while (n) {
        uint32_t c = n < batch ? n : batch;
        ctxs_reservation r;
        check_ctxs(ctxs_session_reserve(&r, s, c), "ctxs_session_reserve");
        for (uint32_t i = 0; i < c; i++)
            check_ctxs(ctxs_session_write_token(s, &r, i, k, v, CTXS_DTYPE_F16),
                       "ctxs_session_write_token");
        check_ctxs(ctxs_session_commit(s, ids, c), "ctxs_session_commit");
        n -= c;
    }
}

/* Every page attention reads in every layer, as the first decode step. */
static uint64_t g3_touch(ctxs_session *s)
{
    uint64_t acc = 0;
    for (uint32_t l = 0; l < G3_LAYERS; l++) {
        ctxs_layout lay;
        ctxs_attn_plan plan;
        check_ctxs(ctxs_session_get_layer_attn(&lay, &plan, s, l, 0),
                   "ctxs_session_get_layer_attn");
        for (uint32_t kind = 0; kind < 2; kind++) {
            const uint8_t *base = (const uint8_t *)lay.kv + kind * lay.kv_stride;
            for (uint32_t j = 0; j < plan.n_spans; j++)
                acc += touch_pages(base + (size_t)plan.spans[j].slot * lay.slot_bytes,
                                   (size_t)plan.spans[j].count * lay.slot_bytes, 4096);
        }
    }
    return acc;
}

static void g3_run(const options *o, uint32_t tokens, int windowed)
{
    const char *method = k_g3_methods[windowed];
    const uint32_t batch = windowed == G3_WINDOWED_B64 ? TURN_TOKENS : 512;
    const int iters = o->quick ? 5 : 15;
    const size_t token_elems = (size_t)G3_LAYERS * G3_HEAD_DIM;
    uint16_t *k = xmalloc(token_elems * 2), *v = xmalloc(token_elems * 2);
    uint64_t seed = 0x9e3779b97f4a7c15ull ^ tokens;
    for (size_t i = 0; i < token_elems; i++) {
        k[i] = (uint16_t)(0x3000 + (xorshift64(&seed) & 0x7ff)); /* small normals */
        v[i] = (uint16_t)(0x3000 + (xorshift64(&seed) & 0x7ff));
    }
    uint32_t *ids = xmalloc(512 * sizeof *ids);
    for (uint32_t i = 0; i < 512; i++)
        ids[i] = i;
    ctxs_model m = g3_model(windowed);
    ctxs_create_options co = CTXS_CREATE_OPTIONS_INIT;
    co.capacity = tokens + (uint32_t)(iters + 1) * TURN_TOKENS;
    co.batch = batch;
    co.open.durability = CTXS_SYNC_ASYNC;
    unlink(g_paths[F_SESSION]);
    ctxs_session *s;
    check_ctxs(ctxs_session_create(&s, g_paths[F_SESSION], &m, &co), "ctxs_session_create");
    if (o->progress)
        fprintf(stderr, "\r\033[K%s %u tokens: prefill", method, tokens);
    g3_append(s, tokens, batch, k, v, ids);
    check_ctxs(ctxs_session_sync(s), "ctxs_session_sync");
    struct stat sb;
    if (stat(g_paths[F_SESSION], &sb) != 0)
        die("stat %s: %s", g_paths[F_SESSION], strerror(errno));
    /* What the layers can read: a global layer every token, a windowed one
     * its window; K and V. */
    uint64_t readable = 0;
    for (uint32_t l = 0; l < G3_LAYERS; l++) {
        uint32_t w = ctxs_geometry_get_window(&m.geometry, l);
        readable += (uint64_t)(w && w < tokens ? w : tokens) * 2 * G3_HEAD_DIM * 2;
    }
    if (g_g3_n < sizeof g_g3_files / sizeof g_g3_files[0])
        g_g3_files[g_g3_n++] = (g3_file){ tokens, windowed, (uint64_t)sb.st_blocks * 512,
                                          readable };

    /* A turn: TURN_TOKENS written and committed (ASYNC), after a pause. */
    samples sm = { 0 };
    for (int i = 0; i <= iters; i++) {
        pause_ms(g_gap_ms);
        double t0 = now_us();
        g3_append(s, TURN_TOKENS, batch, k, v, ids);
        if (i > 0)
            samples_add(&sm, now_us() - t0);
    }
    add_row("save_turn", method, tokens, CTXS_DTYPE_F16, &sm);
    samples_free(&sm);
    check_ctxs(ctxs_session_sync(s), "ctxs_session_sync");
    ctxs_session_close(s);

    /* A resume: open, and every page the layers read mapped in. */
    for (int i = 0; i <= iters; i++) {
        double t0 = now_us();
        check_ctxs(ctxs_session_open(&s, g_paths[F_SESSION], &m, 0, NULL), "ctxs_session_open");
        g_sink += g3_touch(s);
        ctxs_session_close(s);
        if (i > 0)
            samples_add(&sm, now_us() - t0);
    }
    add_row("resume_ready", method, tokens, CTXS_DTYPE_F16, &sm);
    samples_free(&sm);
    unlink(g_paths[F_SESSION]);
    free(k);
    free(v);
    free(ids);
}

static void g3_print_files(FILE *f, int json)
{
    for (size_t i = 0; i < g_g3_n; i++) {
        const g3_file *g = &g_g3_files[i];
        double ratio = (double)g->disk_bytes / (double)g->readable_bytes;
        if (json)
            printf("{\"op\":\"file_bytes\",\"method\":\"%s\",\"tokens\":%u,"
                   "\"disk_bytes\":%" PRIu64 ",\"readable_bytes\":%" PRIu64
                   ",\"ratio\":%.3f}\n",
                   k_g3_methods[g->windowed], g->tokens, g->disk_bytes, g->readable_bytes,
                   ratio);
        else
            fprintf(f, "%-20s %6u tokens: %10.1f MiB on disk, %10.1f MiB the layers can "
                       "read (%.3fx)\n",
                    k_g3_methods[g->windowed], g->tokens, g->disk_bytes / 1048576.0,
                    g->readable_bytes / 1048576.0, ratio);
    }
}

/* --- Report ---------------------------------------------------------------- */

/* What each op's ratio column divides by: a row of the same dtype and
 * pause. */
static const bench_result *baseline_of(const session_row *r)
{
    const char *op = r->r.op, *method = "ctxstore_async";
    if (!strcmp(op, "save_turn"))
        method = "memcpy_resident";
    else if (!strcmp(op, "commit"))
        method = "xxh3";
    else if (!strcmp(op, "scan"))
        method = "anonymous";
    const session_row *base = find_row_at(op, method, r->r.tokens, r->dtype, r->pause_ms);
    return base ? &base->r : NULL;
}

/* Rows by op, tokens, method, then dtype, in the orders of k_ops,
 * k_methods and k_dtype_names. */
static int cmp_rows(const void *pa, const void *pb)
{
    const session_row *a = pa, *b = pb;
    const size_t n_ops = sizeof k_ops / sizeof k_ops[0];
    const size_t n_methods = sizeof k_methods / sizeof k_methods[0];
    int d = order_rank(k_ops, n_ops, a->r.op, b->r.op);
    if (d || (d = order_u64(a->r.tokens, b->r.tokens)) ||
        (d = order_rank(k_methods, n_methods, a->r.method, b->r.method)) ||
        (d = order_rank(k_dtype_names, N_DTYPES, a->dtype, b->dtype)))
        return d;
    return order_u64(a->pause_ms, b->pause_ms);
}

static void print_json(void)
{
    for (size_t i = 0; i < g_results.n; i++) {
        json_result_begin(&g_result_rows[i].r);
        printf(",\"dtype\":\"%s\",\"pause_ms\":%u}\n", g_result_rows[i].dtype,
               g_result_rows[i].pause_ms);
    }
}

static void print_header(FILE *f, const char *dir)
{
    fprintf(f,
        "ctxstore bench_session: Qwen3-4B KV geometry, %d layers x %d KV heads"
        " x %d dim, fp16 = %d bytes/token; turn = %d tokens (%zu bytes)\n"
        "files in %s (page cache warm for every read: caches cannot be"
        " dropped; the disk is settled with syncfs before each timed"
        " block); one untimed warm-up per measurement (for sqlite_blob,"
        " the row stored for sqlite_select); times in us\n"
        "save_turn: every timed turn lands in never-written slots/pages."
        " Each ctxstore measurement gets its own session prefilled to the"
        " context (untimed, synced), capacity = context + (iterations+1) x"
        " %d + %d, ring off, n_sink %d; a turn = reserve + one memcpy per"
        " (layer,K/V,head) through ctxs_session_get_layout + commit; no"
        " rollback, so the context grows by %d per turn from the listed"
        " size. ctxstore_async_nobg: ASYNC with options.background = 0"
        " (reserve allocates and faults, commit starts writeback, on the"
        " caller's thread). ctxstore_layer: ASYNC, the turn handed over with"
        " ctxs_session_write_layer, a layer at a time from [token][head][dim]"
        " (the session's dtype; Q8's scales after the elements); it and"
        " ctxstore_async and memcpy_resident after pauses of 50, 2500 and 35000 ms (the"
        " pause_ms column; 35000 stood for by an fdatasync of the session file"
        " and a %u ms pause before the turn, untimed: every page written"
        " back and write-protected, the runway's too, as the kernel's"
        " flusher leaves them after 30 s). floor: the same %d memcpys into a fresh"
        " contiguous region of a mapped file (ftruncate + fallocate"
        " untimed, MAP_SHARED), no sync. memcpy_resident: the same memcpys"
        " into anonymous pages already written once (no fault). Every save"
        " (all methods) follows an untimed pause of %u ms, standing for the"
        " turn's generation (--gap-ms); the background thread's CPU time"
        " over the turns is noted.\n"
        "  rewrite_fdatasync: open(O_TRUNC) + write() + fdatasync of the"
        " whole context+turn state, as llama.cpp state files. sqlite_blob:"
        " INSERT OR REPLACE of that state as one BLOB row, prepared"
        " statement kept, journal_mode=WAL, synchronous=NORMAL, SQLite %s"
        " defaults otherwise (the autocheckpoint runs inside the timed"
        " step).\n"
        "commit: ctxs_session_commit alone, reserve + write untimed, after the"
        " pause; xxh3: XXH3_64bits over the turn's bytes in one call, the turn"
        " written (memcpy_resident's copy) and the same pause before it.\n"
        "resume_open: ctxs_session_open (read-write, ASYNC) +"
        " ctxs_session_get_info + close. resume_ready: open +"
        " ctxs_session_get_window + read one byte of every page of the window"
        " spans of all %d runs + close. read_file (open + malloc + read) and"
        " sqlite_select (open db + SELECT + copy) of the context's state are"
        " ready once read: the same measurement is listed under both.\n"
        "scan: sum of the context's K/V as uint64 words through the"
        " session mapping vs a pre-faulted malloc'ed copy; both resident.\n"
        "ratio: save_turn vs memcpy_resident; commit vs xxh3; resume_* vs"
        " ctxstore_async;"
        " scan vs anonymous; each against the row of its own dtype.\n"
        "dtype: all of the above in f16; in bf16 (as many bytes) and q8 (int8"
        " elements, half the bytes, and a float32 scale per (token, head) of"
        " K and of V, one more memcpy per run into the scale table),"
        " save_turn ctxstore_async and memcpy_resident, and resume_ready"
        " ctxstore_async (q8: the window's scales are touched too), each in a"
        " session of that dtype prefilled as above (--dtype).\n\n",
        N_LAYERS, N_KV_HEADS, HEAD_DIM, TOKEN_BYTES, TURN_TOKENS, TURN_BYTES,
        dir, TURN_TOKENS, ROOM_TOKENS, N_SINK, TURN_TOKENS,
        STAND_IN_PAUSE_MS, N_RUNS, g_gap_ms, sqlite3_libversion(), N_RUNS);
}

static void print_table(void)
{
    printf("%-13s %6s  %-19s %-5s %8s %12s %12s %12s %3s %9s\n", "op", "tokens",
           "method", "dtype", "pause_ms", "median_us", "min_us", "max_us", "n", "ratio");
    const char *last_op = "";
    for (size_t i = 0; i < g_results.n; i++) {
        const session_row *row = &g_result_rows[i];
        const bench_result *r = &row->r;
        if (strcmp(r->op, last_op) && *last_op)
            putchar('\n');
        last_op = r->op;
        const bench_result *base = baseline_of(row);
        char ratio[32] = "";
        if (base && base->median_us > 0)
            snprintf(ratio, sizeof ratio, "%.2fx",
                     r->median_us / base->median_us);
        printf("%-13s %6u  %-19s %-5s %8u %12.1f %12.1f %12.1f %3zu %9s\n", r->op,
               r->tokens, r->method, row->dtype, row->pause_ms, r->median_us, r->min_us,
               r->max_us, r->n, ratio);
    }
    print_notes(stdout);
}

/* The context the headlines quote: 2048 when measured, else the largest. */
static uint32_t headline_tokens(const uint32_t *contexts, int n)
{
    for (int i = 0; i < n; i++)
        if (contexts[i] == 2048)
            return 2048;
    return contexts[n - 1];
}

static double ratio_of(const session_row *a, const session_row *b)
{
    return a && b && b->r.median_us > 0 ? a->r.median_us / b->r.median_us : -1;
}

/* The fp16 row of op, method and tokens, or NULL. */
static const session_row *f16_row(const char *op, const char *method, uint32_t tokens)
{
    return find_row(op, method, tokens, "f16");
}

static void print_ratio_line(const char *label, double ratio)
{
    if (ratio < 0)
        printf("%s: n/a\n", label);
    else
        printf("%s: %.2fx\n", label, ratio);
}

static void print_headlines(const uint32_t *contexts, int n)
{
    uint32_t t = headline_tokens(contexts, n);
    uint32_t lo = contexts[0], hi = contexts[n - 1];
    char label[128];
    putchar('\n');
    for (int i = 0; i < n; i++) {
        uint32_t c = contexts[i];
        snprintf(label, sizeof label, "save_turn ASYNC vs memcpy_resident (%u tokens)", c);
        print_ratio_line(label,
                         ratio_of(f16_row("save_turn", "ctxstore_async", c),
                                  f16_row("save_turn", "memcpy_resident", c)));
    }
    /* Per layer and through the mapping, vs the floor, after each pause. */
    for (int i = 0; i < n; i++)
        for (size_t d = 0; d < N_DTYPES; d++)
            for (size_t p = 0; p < sizeof k_pauses_ms / sizeof k_pauses_ms[0]; p++) {
                const char *dt = k_dtype_names[d];
                uint32_t c = contexts[i], ms = k_pauses_ms[p];
                const session_row *base = find_row_at("save_turn", "memcpy_resident", c, dt, ms);
                if (!base)
                    continue;
                snprintf(label, sizeof label,
                         "save_turn per layer | mapping vs memcpy_resident (%u tokens, %s,"
                         " %u ms)", c, dt, ms);
                double a = ratio_of(find_row_at("save_turn", "ctxstore_layer", c, dt, ms), base);
                double m = ratio_of(find_row_at("save_turn", "ctxstore_async", c, dt, ms), base);
                printf("%s: %.2fx | %.2fx\n", label, a, m);
            }
    snprintf(label, sizeof label, "save_turn ASYNC without vs with the background (%u tokens)", t);
    print_ratio_line(label, ratio_of(f16_row("save_turn", "ctxstore_async_nobg", t),
                                     f16_row("save_turn", "ctxstore_async", t)));
    snprintf(label, sizeof label, "commit ASYNC vs xxh3 of the turn (%u tokens)", t);
    print_ratio_line(label, ratio_of(f16_row("commit", "ctxstore_async", t),
                                     f16_row("commit", "xxh3", t)));
    snprintf(label, sizeof label, "rewrite vs ctxstore_async at %u", t);
    print_ratio_line(label,
                     ratio_of(f16_row("save_turn", "rewrite_fdatasync", t),
                              f16_row("save_turn", "ctxstore_async", t)));
    snprintf(label, sizeof label, "resume_open %u vs %u", hi, lo);
    print_ratio_line(label,
                     n > 1 ? ratio_of(f16_row("resume_open", "ctxstore_async", hi),
                                      f16_row("resume_open", "ctxstore_async", lo))
                           : -1);
    double scan = ratio_of(f16_row("scan", "mapping", hi),
                           f16_row("scan", "anonymous", hi));
    if (scan < 0)
        printf("scan mapping vs anonymous (%u tokens): n/a\n", hi);
    else
        printf("scan mapping vs anonymous (%u tokens): %+.1f%%\n", hi,
               (scan - 1) * 100);
    for (size_t d = 1; d < N_DTYPES; d++) {
        const char *dt = k_dtype_names[d];
        if (!find_row("save_turn", "ctxstore_async", t, dt))
            continue;
        snprintf(label, sizeof label, "save_turn ASYNC %s vs f16 (%u tokens)", dt, t);
        print_ratio_line(label, ratio_of(find_row("save_turn", "ctxstore_async", t, dt),
                                         f16_row("save_turn", "ctxstore_async", t)));
        snprintf(label, sizeof label, "resume_ready %s vs f16 (%u tokens)", dt, t);
        print_ratio_line(label, ratio_of(find_row("resume_ready", "ctxstore_async", t, dt),
                                         f16_row("resume_ready", "ctxstore_async", t)));
    }
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
    g_gap_ms = g_pause_ms = g_pause_label_ms = o.gap_ms;
    catch_signals(remove_scratch_on_signal);
    make_scratch_dir(o.dir, "ctxstore-bench");
    for (int i = 0; i < N_FILES; i++)
        scratch_file(g_paths[i], k_file_names[i]);

    uint32_t contexts[3] = { 512, 2048, 8192 };
    int n_contexts = pick_contexts(contexts, o.quick ? 2 : 3, o.only_tokens);
    int iters = o.quick ? 7 : MAX_ITERS;

    if (o.gemma3) {
        fprintf(o.json ? stderr : stdout,
                "ctxstore bench_session --gemma3: Gemma 3's KV geometry (18 layers, 1 KV "
                "head x 256, fp16, 15 layers windowed at 512, with a batch of 512 and of "
                "64) against it with every layer global; save_turn: %d tokens written and "
                "committed (ASYNC) after a %u ms pause; resume_ready: open and every page "
                "each layer's attention reads "
                "mapped in (warm page cache); files in %s\n\n",
                TURN_TOKENS, g_gap_ms, g_dir);
        uint32_t g3_tokens[2] = { 8192, 32768 };
        int n_g3 = o.only_tokens ? 1 : 2;
        if (o.only_tokens)
            g3_tokens[0] = o.only_tokens;
        for (int i = 0; i < n_g3; i++)
            for (int mode = G3_GLOBAL; mode <= G3_WINDOWED_B64; mode++)
                g3_run(&o, g3_tokens[i], mode);
        if (o.progress)
            fputs("\r\033[K", stderr);
        qsort(g_result_rows, g_results.n, sizeof g_result_rows[0], cmp_rows);
        if (o.json)
            print_json();
        else
            print_table();
        g3_print_files(stdout, o.json);
        cleanup();
        return 0;
    }
    /* With --json, stdout carries only the objects. */
    print_header(o.json ? stderr : stdout, g_dir);
    fflush(stdout);
    double t0 = now_us();
    for (int i = 0; i < n_contexts; i++) {
        if (o.dtypes[0])
            run_context(&o, contexts[i], iters);
        for (size_t d = 1; d < N_DTYPES; d++)
            if (o.dtypes[d])
                run_context_dtype(&o, contexts[i], iters, k_dtypes[d]);
    }
    return finish_run(&(run_end){ o.progress, o.json, g_result_rows, g_results.n,
                                  sizeof g_result_rows[0], cmp_rows, print_json, print_text,
                                  contexts, n_contexts, t0 });
}
