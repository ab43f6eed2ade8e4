/*
 * ctxstore demo — what ctxstore is for, in one command: a chat is saved
 * into a session turn by turn, the program "quits" (session and store
 * closed), the conversation is resumed and goes on for two more turns.
 * Every save and the resume are timed side by side with what the same
 * bytes cost the ways people save a KV cache today: the whole state
 * rewritten as a file (llama.cpp) and as one SQLite BLOB row (the
 * comparison bench/bench_session makes, one sample per turn here).
 *
 * A turn's save counts all that ctxstore costs the app: reserve, the
 * engine's stores of the new K/V into the mapping (timed apart from the
 * model's compute) and the commit. The resume counts the open and the
 * model's first prediction from the file, with the page cache as the chat
 * left it (warm) and with the files' pages dropped from it (cold).
 *
 * The K/V come from an engine (demo_engine below). The default one is
 * examples/tinychat: a tiny transformer with random weights and Qwen3-4B's
 * KV shape, which writes K and V into the session, reads them back through
 * ctxs_attention() and chooses each reply token greedily; after the resume
 * it recomputes its last token from the session (one forward pass) and must
 * find the K/V it had written. --engine synthetic writes K/V values that
 * are a function of (position, token id, layer, K/V, head), with no model,
 * for the save and resume timings alone. Prompt token ids come from a fixed
 * seeded script in both.
 *
 * At the end, the conversation's held tokens are written into a new
 * session file of each dtype (fp16, bf16, Q8), converted by the library,
 * to show what each takes on disk; untimed, after the last turn.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef __linux__
#include <sys/vfs.h>
#endif

#ifdef CTXS_HAVE_SQLITE
#include <sqlite3.h>
#endif

#include "bench_shared.h"
#include "cli.h"
#include "tinychat.h"

/* --- The conversation ----------------------------------------------------- */

enum {
    VOCAB = 151936, /* Qwen3's vocabulary */
    MORE_TURNS = 2, /* turns after the resume */
    MAX_TURNS = 1000,
};

/* What the demo plays: a model geometry and the lengths of the messages. */
typedef struct demo_config {
    const char *model_name; /* display name registered in the store */
    ctxs_geometry geometry;
    const char *model_hash; /* 16 bytes: the model's made-up hash */
    uint32_t capacity;
    uint32_t system_tokens;
    uint32_t user_min, user_max;   /* a user message, before the resume */
    uint32_t reply_min, reply_max; /* an assistant reply, before the resume */
    /* Follow-ups after the resume are shorter, so that the default chat of
     * 6 + 2 turns still fits in the capacity: no slot is reused by the
     * ring, and the session holds the whole conversation. (With more
     * --turns the ring overwrites the oldest tokens after the sinks, and
     * the comparisons save the tokens held.) */
    uint32_t more_user_min, more_user_max;
    uint32_t more_reply_min, more_reply_max;
    uint32_t turns; /* before the resume */
} demo_config;

/* Qwen3-4B: 36 layers x 8 KV heads x 128 dims, fp16 = 144 KiB a token; a
 * 2048-slot session is a 288 MiB file. 6 turns come to ~1,700 tokens. */
static const demo_config k_full = {
    .model_name = "Qwen3-4B (synthetic KV)",
    .geometry = { 36, 8, 128, CTXS_DTYPE_F16 },
    .model_hash = "ctxs-demo-qwen34",
    .capacity = 2048,
    .system_tokens = 200,
    .user_min = 50, .user_max = 110,
    .reply_min = 130, .reply_max = 210,
    .more_user_min = 20, .more_user_max = 60,
    .more_reply_min = 80, .more_reply_max = 140,
    .turns = 6,
};

/* --quick: 2 KiB a token, for tests. */
static const demo_config k_quick = {
    .model_name = "tiny (synthetic KV, demo --quick)",
    .geometry = { 4, 2, 64, CTXS_DTYPE_F16 },
    .model_hash = "ctxs-demo-tiny!!",
    .capacity = 256,
    .system_tokens = 24,
    .user_min = 8, .user_max = 16,
    .reply_min = 16, .reply_max = 32,
    .more_user_min = 4, .more_user_max = 8,
    .more_reply_min = 8, .more_reply_max = 16,
    .turns = 3,
};

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The token ids of the prompts (system prompt, user messages): the text a
 * chat app keeps and would tokenize again. */
static uint32_t script_token(uint64_t pos, uint32_t vocab)
{
    return (uint32_t)(splitmix64(0x5eed0000ull ^ pos) % vocab);
}

/* --- Engines -------------------------------------------------------------- */

typedef struct demo_engine demo_engine;

/* What produces the K/V of new tokens. The demo reserves slots for each
 * message and the engine's K/V go into them through
 * ctxs_session_write_layer(), a layer at a time, as a forward pass makes
 * them; the demo then commits.
 * Token ids live in one array indexed by position (the conversation so
 * far), which is all an engine gets after a resume besides the session. */
struct demo_engine {
    const char *name;        /* "tinychat", "synthetic" */
    const char *description; /* one line for the header */
    const char *model_name;  /* registered in the store */
    /* Computes the K/V of tokens r->first_pos .. + r->n_tokens - 1 of
     * reservation r of session s. An engine that stages (stages = 1) puts
     * them into kv, [layer][K|V][token][head][head_dim], and the demo hands
     * them over; one that does not (tinychat) hands them over itself, each
     * layer before its attention reads it, and ignores kv. ids[0 .. first_pos)
     * is the conversation so far. For a prompt (generate == 0) the ids of
     * the new tokens are given in ids[first_pos ..]; for a reply the engine
     * chooses them, one after another, and stores them there. Returns 0 or
     * a negative ctxstore error. */
    int (*write)(demo_engine *e, ctxs_session *s, const ctxs_reservation *r,
                 uint32_t *ids, int generate, uint8_t *kv);
    int stages;
    /* The K and V ([n_layers][n_kv_heads][head_dim] each, the session's
     * dtype) that token pos must hold, given ids[0 .. pos], for the check
     * after the resume; NULL for an engine that cannot tell without
     * recomputing the whole prefix. */
    void (*expect)(demo_engine *e, const uint32_t *ids, uint64_t pos, void *k,
                   void *v);
    /* After the resume: recomputes the prediction after the last committed
     * token from the session alone, checking that token's K/V against the
     * stored ones (CTXS_ECORRUPT if they differ); NULL if the engine has no
     * model to predict with. */
    int (*resume)(demo_engine *e, ctxs_session *s, uint32_t *next_id);
    /* For an engine that hands its K/V over itself: seconds it has spent
     * doing so, ever. */
    double (*write_seconds)(demo_engine *e);
    void (*destroy)(demo_engine *e);
    ctxs_model model;        /* geometry and hashes */
    uint32_t vocab;          /* token ids 0 .. vocab - 1 */
    void *impl;
};

/* The synthetic engine: every head of K or V is a stream of valid fp16
 * values (+-[0.125, 0.5), no NaN or infinity) seeded by (position, token
 * id, layer, K/V, head); a reply's token follows from the token before it.
 * Deterministic, so that the check after the resume can recompute any
 * token's K/V. */
static void synth_head(uint8_t *dst, size_t bytes, uint64_t pos, uint32_t id,
                       uint32_t run)
{
    uint64_t st = splitmix64(pos * 0x100000001b3ull ^ ((uint64_t)id << 32)
                             ^ run) | 1;
    size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
        uint64_t w = (xorshift64(&st) & 0x87ff87ff87ff87ffull)
                     | 0x3000300030003000ull;
        memcpy(dst + i, &w, 8);
    }
    for (; i + 2 <= bytes; i += 2) {
        uint16_t h = (uint16_t)((xorshift64(&st) & 0x87ffu) | 0x3000u);
        memcpy(dst + i, &h, 2);
    }
}

static uint32_t synth_next(uint32_t prev, uint64_t pos)
{
    return (uint32_t)(splitmix64(((uint64_t)prev << 32) ^ pos ^ 0xa55a)
                      % VOCAB);
}

/* Runs are numbered as the KV region orders them: layer, then K/V, then
 * head. */
static uint8_t *run_base(const ctxs_layout *lay, const ctxs_geometry *g,
                         uint32_t run)
{
    uint32_t layer = run / (2 * g->n_kv_heads);
    uint32_t kind = run / g->n_kv_heads % 2;
    uint32_t head = run % g->n_kv_heads;
    return (uint8_t *)lay->kv + layer * lay->layer_stride
           + kind * lay->kv_stride + head * lay->head_stride;
}

/* Token i of n's K/V, as the synthetic engine stages them: head h of run
 * (layer, kind) at ((layer * 2 + kind) * n + i) * n_kv_heads + h heads
 * into kv, the layout ctxs_session_write_layer() takes a layer's K (or V)
 * in. */
static void synth_token(const ctxs_geometry *g, const uint32_t *ids,
                        uint64_t pos, uint8_t *kv, uint32_t i, uint32_t n)
{
    size_t head_bytes = (size_t)g->head_dim * 2;
    uint32_t n_runs = g->n_layers * 2 * g->n_kv_heads;
    for (uint32_t run = 0; run < n_runs; run++) {
        uint32_t lk = run / g->n_kv_heads, h = run % g->n_kv_heads;
        size_t at = ((size_t)lk * n + i) * g->n_kv_heads + h;
        synth_head(kv + at * head_bytes, head_bytes, pos, ids[pos], run);
    }
}

static int synth_write(demo_engine *e, ctxs_session *s,
                       const ctxs_reservation *r, uint32_t *ids, int generate,
                       uint8_t *kv)
{
    (void)s;
    const ctxs_geometry *g = &e->model.geometry;
    uint64_t pos = r->first_pos;
    for (uint32_t i = 0; i < r->n_tokens; i++) {
        if (generate)
            ids[pos + i] = synth_next(pos + i ? ids[pos + i - 1] : 0, pos + i);
        synth_token(g, ids, pos + i, kv, i, r->n_tokens);
    }
    return 0;
}

static void synth_expect(demo_engine *e, const uint32_t *ids, uint64_t pos,
                         void *k, void *v)
{
    const ctxs_geometry *g = &e->model.geometry;
    size_t head_bytes = (size_t)g->head_dim * 2;
    for (uint32_t layer = 0; layer < g->n_layers; layer++)
        for (uint32_t kind = 0; kind < 2; kind++)
            for (uint32_t head = 0; head < g->n_kv_heads; head++) {
                uint32_t run = (layer * 2 + kind) * g->n_kv_heads + head;
                uint8_t *dst = (uint8_t *)(kind ? v : k)
                               + ((size_t)layer * g->n_kv_heads + head)
                                     * head_bytes;
                synth_head(dst, head_bytes, pos, ids[pos], run);
            }
}

static const char k_tokenizer_hash[] = "qwen3-tokenizer!"; /* 16 bytes */

static int synthetic_engine(demo_engine *e, const demo_config *cfg)
{
    *e = (demo_engine){
        .name = "synthetic",
        .description = "synthetic K/V from (position, token id, layer, "
                       "head); no model",
        .model_name = cfg->model_name,
        .write = synth_write,
        .stages = 1,
        .expect = synth_expect,
        .vocab = VOCAB,
    };
    e->model.geometry = cfg->geometry;
    memcpy(e->model.model_hash, cfg->model_hash, 16);
    memcpy(e->model.tokenizer_hash, k_tokenizer_hash, 16);
    return 0;
}

/* examples/tinychat: the K/V of a real forward pass, written into the
 * reservation; the demo commits. */
static int tiny_write(demo_engine *e, ctxs_session *s,
                      const ctxs_reservation *r, uint32_t *ids, int generate,
                      uint8_t *kv)
{
    (void)kv;
    return tinychat_write(e->impl, s, r, ids, generate, NULL);
}

static int tiny_resume(demo_engine *e, ctxs_session *s, uint32_t *next_id)
{
    return tinychat_resume(e->impl, s, next_id);
}

static double tiny_write_seconds(demo_engine *e)
{
    return tinychat_kv_write_seconds(e->impl);
}

static void tiny_destroy(demo_engine *e)
{
    tinychat_model_destroy(e->impl);
    e->impl = NULL;
}

/* Qwen3-4B's KV shape for the full demo, tinychat's own small one for
 * --quick. */
static int tinychat_engine(demo_engine *e, int quick)
{
    tinychat_config tc;
    if (quick)
        tinychat_config_default(&tc);
    else
        tinychat_config_qwen3_4b_kv(&tc);
    tinychat_model *m;
    int rc = tinychat_model_create(&m, &tc);
    if (rc < 0)
        return rc;
    *e = (demo_engine){
        .name = "tinychat",
        .description = "examples/tinychat, random weights; attention reads "
                       "the session",
        .model_name = quick ? "tinychat (demo --quick)"
                            : "tinychat with Qwen3-4B's KV shape",
        .write = tiny_write,
        .resume = tiny_resume,
        .write_seconds = tiny_write_seconds,
        .destroy = tiny_destroy,
        .vocab = tc.vocab,
        .impl = m,
    };
    tinychat_model_ctxs(&e->model, m);
    return 0;
}

/* --- Interruption ---------------------------------------------------------
 *
 * The demo may leave a gigabyte of files behind, so Ctrl-C must not skip
 * the cleanup. The handler only notes the signal (SA_RESTART lets the
 * current write or sync finish); the demo stops at the next step, removes
 * its files and dies of the signal. */

static volatile sig_atomic_t g_signal;

static void on_signal(int sig)
{
    g_signal = sig;
}

static const int k_signals[] = { SIGINT, SIGTERM, SIGHUP, SIGPIPE };
#define N_SIGNALS (sizeof k_signals / sizeof k_signals[0])

static void signals_catch(struct sigaction old[N_SIGNALS])
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < N_SIGNALS; i++) {
        sigaction(k_signals[i], NULL, &old[i]);
        /* A signal ignored by whoever started us stays ignored (nohup, a
         * background job of a script). */
        if (old[i].sa_handler != SIG_IGN)
            sigaction(k_signals[i], &sa, NULL);
    }
}

static void signals_restore(const struct sigaction old[N_SIGNALS])
{
    for (size_t i = 0; i < N_SIGNALS; i++)
        sigaction(k_signals[i], &old[i], NULL);
}

/* --- State ---------------------------------------------------------------- */

typedef struct turn_plan {
    uint32_t user, reply; /* tokens; turn 1 also carries the system prompt */
} turn_plan;

typedef struct turn_result {
    uint32_t turn;         /* 1-based */
    int resumed;           /* played after the resume */
    uint32_t new_tokens;
    uint64_t n_tokens;     /* positions committed after the turn */
    uint32_t n_held;
    uint64_t state_bytes;  /* the K/V of the held tokens */
    double reserve_s;      /* ctxs_session_reserve, before the engine wrote */
    double write_s;        /* the new K/V handed over (write_layer) */
    double copy_s;         /* the same bytes copied in memory: the copies
                              alone */
    double commit_s;       /* ctxs_session_commit alone */
    double save_s;         /* reserve + write + commit: ctxstore's headline */
    double state_file_s;
    double sqlite_s;       /* < 0: not measured */
} turn_result;

/* One reopen after the close, timed to the first token, and the state
 * file read beside it, with the page cache warm or cold. */
typedef struct resume_pass {
    double open_s;       /* ctxs_store_open + session open + info */
    double first_s;      /* then the engine's next token (tinychat), or a
                            byte of every held page read (synthetic) */
    double ctxstore_s;   /* open_s + first_s: the headline */
    double state_file_s; /* open + read() of the whole state file */
    uint32_t next_token;
} resume_pass;

typedef struct resume_result {
    uint64_t n_tokens;
    uint32_t n_held;         /* fewer than n_tokens once the ring wrapped */
    uint64_t state_bytes;
    resume_pass warm;        /* the page cache as the chat left it */
    resume_pass cold;        /* after the files' pages were dropped */
    int drop_rc;             /* 0, or why the pages could not be dropped */
    int64_t ctxstore_cached; /* bytes of the session file and the index
                                still cached after the drop; < 0: unknown */
    int64_t state_cached;    /* the same for the state file */
    int dropped;             /* the cold pass started cold */
    double sqlite_s;         /* warm; < 0: not measured */
    uint32_t tokens_checked; /* K/V compared with the engine's */
    int predicted;           /* the engine's model made the first tokens */
} resume_result;

/* The same conversation as a session file of one dtype (size_dtypes()). */
typedef struct dtype_size {
    uint32_t dtype;
    const char *name;     /* "f16", "bf16", "q8" */
    uint64_t token_bytes; /* one token's K and V, Q8's scales included */
    uint64_t kv_bytes;    /* token_bytes x the tokens held */
    uint64_t file_bytes;  /* the file's size, sparse */
    uint64_t disk_bytes;  /* blocks it takes on disk */
} dtype_size;

static const struct {
    uint32_t dtype;
    const char *name;
} k_size_dtypes[] = {
    { CTXS_DTYPE_F16, "f16" },
    { CTXS_DTYPE_BF16, "bf16" },
    { CTXS_DTYPE_Q8, "q8" },
};
#define N_SIZE_DTYPES (sizeof k_size_dtypes / sizeof k_size_dtypes[0])

typedef struct demo {
    const cli *c;
    demo_config cfg;
    demo_engine engine;
    ctxs_model model;
    int quick, keep;

    /* The directory this run made: the temporary store's parent, or, with
     * a given store, a scratch directory inside it. */
    char base[PATH_MAX];
    int base_fd;
    char store_dir[PATH_MAX];
    int store_temporary;
    char state_path[PATH_MAX], state_tmp[PATH_MAX], db_path[PATH_MAX];
    int memory_fs; /* the files are on tmpfs: syncs cost nothing */

    ctxs_store *st;
    ctxs_session *s;
    char name[64];
    uint64_t session_id; /* its file is sessions/<id>.ctxs */
    int session_created;
    ctxs_layout lay;
    uint64_t file_bytes;
    size_t token_bytes;
    uint32_t n_runs;

    turn_plan *plan;
    uint32_t n_plan;
    uint32_t *ids;      /* by position */
    uint64_t n_ids;     /* room */
    uint64_t n_tokens;  /* committed */
    uint8_t *state;     /* the held K/V packed, as an engine would hold it */
    size_t state_cap;
    uint8_t *staging;   /* a message's K/V in the engine's memory */
    uint8_t *copy_to;   /* as large, for the copies alone */

#ifdef CTXS_HAVE_SQLITE
    sqlite3 *db;
    sqlite3_stmt *upsert;
#endif

    turn_result *results;
    uint32_t n_results;
    resume_result resume;
    dtype_size sizes[N_SIZE_DTYPES];
    uint32_t sizes_held; /* the tokens each of them holds */
    double sizes_s;      /* seconds the three files took, after the chat */
} demo;

/* --- Files ---------------------------------------------------------------- */

static int remove_entry(const char *path, const struct stat *sb, int type,
                        struct FTW *ftw)
{
    (void)sb, (void)type, (void)ftw;
    remove(path);
    return 0;
}

/* Removes a directory this run created, and everything in it. */
static void remove_tree(const char *dir)
{
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* As the benchmarks choose (bench/bench_util.c): $TMPDIR, else /var/tmp,
 * never a memory file system, where fdatasync costs nothing and the state
 * file and SQLite would look as cheap as a mapping. NULL when both are. */
static const char *temp_parent(void)
{
    const char *tmp = getenv("TMPDIR");
    if (tmp && *tmp && memory_fs(tmp) <= 0)
        return tmp;
    return memory_fs("/var/tmp") > 0 ? NULL : "/var/tmp";
}

static int join(char *out, const char *dir, const char *name)
{
    if (snprintf(out, PATH_MAX, "%s/%s", dir, name) >= PATH_MAX)
        return cli_fail(-ENAMETOOLONG, "%s/%s", dir, name);
    return CLI_OK;
}

/* Makes the directories and names the files; opens (creating) the store. */
static int demo_setup_dirs(demo *d)
{
    int ec;
    if (d->c->store_given) {
        snprintf(d->store_dir, sizeof d->store_dir, "%s", d->c->store_dir);
        int rc = ctxs_store_open(&d->st, d->store_dir, CTXS_STORE_CREATE, NULL);
        if (rc < 0)
            return cli_fail(rc, "%s", d->store_dir);
        /* The comparison files go beside the sessions, on the same disk;
         * the store ignores what is not in index/ or sessions/. */
        if ((ec = join(d->base, d->store_dir, ".demo-scratch.XXXXXX")))
            return ec;
    } else {
        const char *parent = temp_parent();
        if (!parent) {
            cli_say("$TMPDIR and /var/tmp are memory file systems (tmpfs), "
                    "where syncs cost nothing: pass --store DIR on a disk");
            return CLI_EUSAGE;
        }
        if ((ec = join(d->base, parent, "ctxstore-demo.XXXXXX")))
            return ec;
    }
    if (!mkdtemp(d->base)) {
        int rc = -errno;
        char tried[PATH_MAX];
        snprintf(tried, sizeof tried, "%s", d->base);
        d->base[0] = '\0';
        return cli_fail(rc, "cannot make a directory %s", tried);
    }
    d->base_fd = open(d->base, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d->base_fd < 0)
        return cli_fail(-errno, "%s", d->base);
    if ((ec = join(d->state_path, d->base, "state.bin"))
        || (ec = join(d->state_tmp, d->base, "state.bin.tmp"))
        || (ec = join(d->db_path, d->base, "kv.sqlite")))
        return ec;
    d->memory_fs = memory_fs(d->base) > 0;
    if (!d->c->store_given) {
        d->store_temporary = 1;
        if ((ec = join(d->store_dir, d->base, "store")))
            return ec;
        int rc = ctxs_store_open(&d->st, d->store_dir, CTXS_STORE_CREATE, NULL);
        if (rc < 0)
            return cli_fail(rc, "%s", d->store_dir);
    }
    return CLI_OK;
}

/* Writes back everything dirty, so that a timed block pays only for its
 * own writeback (bench_session does the same). --quick does without: its
 * numbers mean nothing, and a sync of a file system others are writing
 * could take longer than the whole demo. */
static void settle_dir(const demo *d)
{
    if (d->quick)
        return;
#ifdef __linux__
    (void)syncfs(d->base_fd);
#else
    sync();
#endif
}

/* --- The comparisons ------------------------------------------------------ */

/* Copies the K/V of the held tokens out of the mapping, run after run, into
 * d->state: the bytes an engine that keeps its KV cache in its own memory
 * would save. The held tokens are slots 0 .. n_held - 1 (the slots fill in
 * order, and a wrapped ring holds all of them). Untimed. */
static int pack_state(demo *d, uint32_t n_held, size_t *bytes)
{
    size_t run_bytes = (size_t)n_held * d->lay.slot_bytes;
    *bytes = run_bytes * d->n_runs;
    if (*bytes > d->state_cap) {
        free(d->state);
        d->state_cap = (size_t)d->cfg.capacity * d->token_bytes;
        if (!(d->state = malloc(d->state_cap))) {
            d->state_cap = 0;
            return cli_fail(CTXS_ENOMEM, "%zu bytes", *bytes);
        }
    }
    for (uint32_t run = 0; run < d->n_runs; run++)
        memcpy(d->state + run * run_bytes,
               run_base(&d->lay, &d->engine.model.geometry, run), run_bytes);
    return CLI_OK;
}

/* llama.cpp's way, made crash-safe: the whole state into a new file,
 * fdatasync, rename over the old one. */
static int save_state_file(demo *d, size_t bytes, double *secs)
{
    double t0 = cli_now_s();
    int fd = open(d->state_tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return cli_fail(-errno, "%s", d->state_tmp);
    ssize_t w = write_full(fd, d->state, bytes);
    int rc = w < 0 ? (int)w : (size_t)w < bytes ? -EIO : 0;
    if (rc == 0 && fdatasync(fd) < 0)
        rc = -errno;
    if (close(fd) < 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(d->state_tmp, d->state_path) < 0)
        rc = -errno;
    *secs = cli_now_s() - t0;
    if (rc < 0)
        return cli_fail(rc, "writing %s", d->state_tmp);
    return CLI_OK;
}

static int read_state_file(demo *d, uint8_t **out, size_t *n, double *secs)
{
    double t0 = cli_now_s();
    *out = NULL;
    int fd = open(d->state_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return cli_fail(-errno, "%s", d->state_path);
    struct stat sb;
    int rc = fstat(fd, &sb) < 0 ? -errno : 0;
    uint8_t *p = NULL;
    size_t got = 0;
    if (rc == 0 && !(p = malloc(sb.st_size ? (size_t)sb.st_size : 1)))
        rc = CTXS_ENOMEM;
    while (rc == 0 && got < (size_t)sb.st_size) {
        ssize_t r = read(fd, p + got, (size_t)sb.st_size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            rc = r < 0 ? -errno : -EIO;
        else
            got += (size_t)r;
    }
    close(fd);
    *secs = cli_now_s() - t0;
    if (rc < 0) {
        free(p);
        return cli_fail(rc, "reading %s", d->state_path);
    }
    *out = p;
    *n = got;
    return CLI_OK;
}

#ifdef CTXS_HAVE_SQLITE
static int sqlite_fail(sqlite3 *db, int rc, const char *what)
{
    cli_say("SQLite: %s: %s", what,
            db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
    return CLI_EFAIL;
}

/* As bench_session opens it: WAL with synchronous=NORMAL, the usual
 * setting for an app database and the kindest to SQLite. The app keeps
 * its connection and its prepared statement. */
static int db_open_for_writing(demo *d)
{
    int rc = sqlite3_open_v2(d->db_path, &d->db,
                             SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
    if (rc != SQLITE_OK)
        return sqlite_fail(d->db, rc, "open");
    rc = sqlite3_exec(d->db,
                      "PRAGMA journal_mode=WAL;"
                      "PRAGMA synchronous=NORMAL;"
                      "CREATE TABLE IF NOT EXISTS sessions("
                      " id INTEGER PRIMARY KEY, kv BLOB NOT NULL);",
                      NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        return sqlite_fail(d->db, rc, "schema");
    rc = sqlite3_prepare_v2(d->db,
                            "INSERT OR REPLACE INTO sessions(id, kv) "
                            "VALUES (1, ?1)",
                            -1, &d->upsert, NULL);
    if (rc != SQLITE_OK)
        return sqlite_fail(d->db, rc, "prepare");
    return CLI_OK;
}

static void db_close(demo *d)
{
    sqlite3_finalize(d->upsert);
    d->upsert = NULL;
    sqlite3_close(d->db);
    d->db = NULL;
}

/* *secs < 0 when the state is longer than SQLite's largest blob
 * (SQLITE_MAX_LENGTH, 1,000,000,000 bytes by default). */
static int save_sqlite(demo *d, size_t bytes, double *secs)
{
    *secs = -1;
    if (!d->db) {
        int ec = db_open_for_writing(d);
        if (ec)
            return ec;
    }
    if (bytes > (size_t)sqlite3_limit(d->db, SQLITE_LIMIT_LENGTH, -1))
        return CLI_OK;
    double t0 = cli_now_s();
    int rc = sqlite3_bind_blob64(d->upsert, 1, d->state, bytes, SQLITE_STATIC);
    if (rc == SQLITE_OK && (rc = sqlite3_step(d->upsert)) == SQLITE_DONE)
        rc = sqlite3_reset(d->upsert);
    *secs = cli_now_s() - t0;
    if (rc != SQLITE_OK) {
        sqlite3_reset(d->upsert);
        return sqlite_fail(d->db, rc, "INSERT OR REPLACE");
    }
    return CLI_OK;
}

/* A resumed app: open the database, select the row, copy it into its own
 * buffer, close. */
static int select_sqlite(demo *d, uint8_t **out, size_t *n, double *secs)
{
    *out = NULL;
    *n = 0;
    sqlite3 *db = NULL;
    sqlite3_stmt *stmt = NULL;
    double t0 = cli_now_s();
    int rc = sqlite3_open_v2(d->db_path, &db, SQLITE_OPEN_READONLY, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v2(db, "SELECT kv FROM sessions WHERE id = 1",
                                -1, &stmt, NULL);
    if (rc == SQLITE_OK && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
        const void *blob = sqlite3_column_blob(stmt, 0);
        *n = (size_t)sqlite3_column_bytes(stmt, 0);
        if (blob && (*out = malloc(*n ? *n : 1)))
            memcpy(*out, blob, *n);
        rc = SQLITE_OK;
    }
    int ec = rc == SQLITE_OK ? CLI_OK : sqlite_fail(db, rc, "SELECT");
    sqlite3_finalize(stmt);
    sqlite3_close(db);
    *secs = cli_now_s() - t0;
    if (ec == CLI_OK && !*out)
        ec = cli_fail(CTXS_ENOMEM, "SQLite blob of %zu bytes", *n);
    return ec;
}
#endif

/* --- Turns ---------------------------------------------------------------- */

/* Lengths of every message, from a fixed seed: the same chat every run. */
static int plan_conversation(demo *d, uint32_t turns)
{
    const demo_config *f = &d->cfg;
    d->n_plan = turns + MORE_TURNS;
    if (!(d->plan = calloc(d->n_plan, sizeof d->plan[0]))
        || !(d->results = calloc(d->n_plan, sizeof d->results[0])))
        return cli_fail(CTXS_ENOMEM, "planning %u turns", d->n_plan);
    uint64_t rng = 0x2545f4914f6cdd1dull;
    uint64_t total = f->system_tokens;
    uint32_t longest = f->system_tokens;
    for (uint32_t t = 0; t < d->n_plan; t++) {
        int more = t >= turns;
        uint32_t ulo = more ? f->more_user_min : f->user_min;
        uint32_t uhi = more ? f->more_user_max : f->user_max;
        uint32_t rlo = more ? f->more_reply_min : f->reply_min;
        uint32_t rhi = more ? f->more_reply_max : f->reply_max;
        d->plan[t].user = ulo + (uint32_t)(xorshift64(&rng) % (uhi - ulo + 1));
        d->plan[t].reply = rlo + (uint32_t)(xorshift64(&rng) % (rhi - rlo + 1));
        total += d->plan[t].user + d->plan[t].reply;
        longest = longest > d->plan[t].user ? longest : d->plan[t].user;
        longest = longest > d->plan[t].reply ? longest : d->plan[t].reply;
    }
    d->n_ids = total;
    if (!(d->ids = calloc(total, sizeof d->ids[0])))
        return cli_fail(CTXS_ENOMEM, "%" PRIu64 " token ids", total);
    size_t staging = (size_t)longest * d->token_bytes;
    if (!(d->staging = malloc(staging)) || !(d->copy_to = malloc(staging)))
        return cli_fail(CTXS_ENOMEM, "the K/V of %u tokens", longest);
    /* Faulted in now, so that a timed store reads from memory the engine
     * has, as its own buffers would be. */
    memset(d->staging, 0, staging);
    memset(d->copy_to, 0, staging);
    return CLI_OK;
}

/* What the writes of a message's K/V cost beside copying the same bytes
 * in memory: a layer's K and V at a time, from the engine's buffer into
 * another already faulted in. What no store can beat. */
static double copies_alone(demo *d, uint32_t n)
{
    size_t layer = (size_t)n * d->token_bytes / d->engine.model.geometry.n_layers;
    double t0 = cli_now_s();
    for (uint32_t l = 0; l < d->engine.model.geometry.n_layers; l++)
        memcpy(d->copy_to + l * layer, d->staging + l * layer, layer);
    return cli_now_s() - t0;
}

/* Hands a staged message's K/V, [layer][K|V][token][head][head_dim], to
 * the session a layer at a time. */
static int hand_over(demo *d, const ctxs_reservation *r)
{
    const ctxs_geometry *g = &d->engine.model.geometry;
    size_t kind = (size_t)r->n_tokens * g->n_kv_heads * g->head_dim * 2;
    for (uint32_t l = 0; l < g->n_layers; l++) {
        const uint8_t *k = d->staging + (size_t)l * 2 * kind;
        int rc = ctxs_session_write_layer(d->s, r, l, 0, r->n_tokens, k, k + kind,
                                          g->dtype);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Reserves n slots and has the engine write its K/V there. */
static int append_message(demo *d, uint32_t n, int generate,
                          turn_result *res)
{
    double *reserve_s = &res->reserve_s;
    ctxs_reservation r;
    double t0 = cli_now_s();
    int rc = ctxs_session_reserve(&r, d->s, n);
    *reserve_s += cli_now_s() - t0;
    if (rc < 0)
        return cli_fail(rc, "session %s: reserving %u slots", d->name, n);
    if (r.n_tokens != n || r.first_pos + n > d->n_ids) {
        cli_say("session %s: reserved %u tokens at %" PRIu64 ", asked %u at"
                " the end of %" PRIu64, d->name, r.n_tokens, r.first_pos, n,
                d->n_ids);
        return CLI_EFAIL;
    }
    if (!generate)
        for (uint32_t i = 0; i < n; i++)
            d->ids[r.first_pos + i] = script_token(r.first_pos + i, d->engine.vocab);
    double engine_s = d->engine.write_seconds ? d->engine.write_seconds(&d->engine) : 0;
    rc = d->engine.write(&d->engine, d->s, &r, d->ids, generate, d->staging);
    if (rc < 0)
        return cli_fail(rc, "session %s: the %s engine", d->name,
                        d->engine.name);
    if (d->engine.stages) {
        t0 = cli_now_s();
        rc = hand_over(d, &r);
        res->write_s += cli_now_s() - t0;
        if (rc < 0)
            return cli_fail(rc, "session %s: writing the K/V of %u tokens", d->name, n);
    } else {
        res->write_s += d->engine.write_seconds(&d->engine) - engine_s;
    }
    res->copy_s += copies_alone(d, n);
    return CLI_OK;
}

static int session_info(demo *d, ctxs_session_info *info)
{
    int rc = ctxs_session_get_info(info, d->s);
    return rc < 0 ? cli_fail(rc, "session %s", d->name) : CLI_OK;
}

/* One turn: the user's message and the reply are written, then the turn is
 * saved three ways: committed (timed), the held K/V rewritten as a state
 * file (timed), and as a SQLite row (timed). */
static int play_turn(demo *d, uint32_t t, int resumed)
{
    turn_result *res = &d->results[d->n_results];
    memset(res, 0, sizeof *res);
    res->turn = t + 1;
    res->resumed = resumed;
    res->sqlite_s = -1;
    uint32_t n = d->plan[t].user + d->plan[t].reply;
    int ec;

    /* Writeback of the previous turn's comparisons is not this turn's. */
    settle_dir(d);
    if (t == 0) {
        if ((ec = append_message(d, d->cfg.system_tokens, 0, res)))
            return ec;
        n += d->cfg.system_tokens;
    }
    if ((ec = append_message(d, d->plan[t].user, 0, res))
        || (ec = append_message(d, d->plan[t].reply, 1, res)))
        return ec;

    double t0 = cli_now_s();
    int rc = ctxs_session_commit(d->s, d->ids + d->n_tokens, n);
    res->commit_s = cli_now_s() - t0;
    res->save_s = res->reserve_s + res->write_s + res->commit_s;
    if (rc < 0)
        return cli_fail(rc, "session %s: commit", d->name);
    d->n_tokens += n;

    ctxs_session_info info;
    if ((ec = session_info(d, &info)))
        return ec;
    if (info.n_tokens != d->n_tokens) {
        cli_say("session %s holds %" PRIu64 " tokens after the commit, "
                "expected %" PRIu64, d->name, info.n_tokens, d->n_tokens);
        return CLI_EFAIL;
    }
    res->new_tokens = n;
    res->n_tokens = info.n_tokens;
    res->n_held = info.n_held;

    size_t bytes;
    if ((ec = pack_state(d, info.n_held, &bytes)))
        return ec;
    res->state_bytes = bytes;
    settle_dir(d);
    if ((ec = save_state_file(d, bytes, &res->state_file_s)))
        return ec;
#ifdef CTXS_HAVE_SQLITE
    /* Seconds a turn at full size, growing with the conversation: measured
     * before the resume only, to keep the demo short. */
    if (!resumed) {
        settle_dir(d);
        if ((ec = save_sqlite(d, bytes, &res->sqlite_s)))
            return ec;
    }
#endif
    d->n_results++;
    return CLI_OK;
}

/* --- Resume --------------------------------------------------------------- */

static int open_session(demo *d)
{
    ctxs_open_options o = CTXS_OPEN_OPTIONS_INIT;
    o.durability = CTXS_SYNC_ASYNC;
    int rc = ctxs_store_session_open(&d->s, d->st, d->name, &d->model, 0, &o);
    if (rc < 0)
        return cli_fail(rc, "session %s", d->name);
    rc = ctxs_session_get_layout(&d->lay, d->s);
    if (rc < 0)
        return cli_fail(rc, "session %s", d->name);
    return CLI_OK;
}

/* Maps in every page of the held K/V by reading a byte of each, as the
 * first attention pass over the whole context would. */
static uint64_t touch_held(const demo *d, uint32_t n_held)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t run_bytes = (size_t)n_held * d->lay.slot_bytes;
    uint64_t acc = 0;
    for (uint32_t run = 0; run < d->n_runs; run++) {
        const uint8_t *p = run_base(&d->lay, &d->engine.model.geometry, run);
        for (size_t off = 0; off < run_bytes; off += page)
            acc += *(const volatile uint8_t *)(p + off);
    }
    return acc;
}

/* Whether a state read back (file or SQLite) holds the session's K/V. */
static int same_as_session(const demo *d, const uint8_t *p, size_t n,
                           uint32_t n_held)
{
    size_t run_bytes = (size_t)n_held * d->lay.slot_bytes;
    if (n != run_bytes * d->n_runs)
        return 0;
    for (uint32_t run = 0; run < d->n_runs; run++)
        if (memcmp(p + run * run_bytes,
                   run_base(&d->lay, &d->engine.model.geometry, run), run_bytes))
            return 0;
    return 1;
}

/* The resumed session must hold exactly what was committed: every token's
 * checksum, every token id, and the K/V of a few tokens recomputed by the
 * engine (tinychat recomputed its last one in first_token()). */
static int check_resumed(demo *d, const ctxs_session_info *info)
{
    uint64_t bad = 0;
    int rc = ctxs_session_verify(&bad, d->s);
    if (rc == CTXS_ECORRUPT) {
        cli_say("session %s: token %" PRIu64 " does not verify after the "
                "resume", d->name, bad);
        return CLI_EDAMAGED;
    }
    if (rc < 0)
        return cli_fail(rc, "session %s: verify", d->name);
    if (info->n_tokens != d->n_tokens) {
        cli_say("session %s: resumed %" PRIu64 " tokens, %" PRIu64
                " were committed", d->name, info->n_tokens, d->n_tokens);
        return CLI_EDAMAGED;
    }
    for (uint64_t pos = 0; pos < d->n_tokens; pos++) {
        uint32_t slot;
        rc = ctxs_session_get_slot(&slot, d->s, pos);
        if (rc == CTXS_EEVICTED)
            continue;
        if (rc < 0)
            return cli_fail(rc, "session %s: token %" PRIu64, d->name, pos);
        if (d->lay.token_ids[slot] != d->ids[pos]) {
            cli_say("session %s: token %" PRIu64 " is id %u after the resume, "
                    "%u was committed", d->name, pos, d->lay.token_ids[slot],
                    d->ids[pos]);
            return CLI_EDAMAGED;
        }
    }
    if (!d->engine.expect)
        return CLI_OK;

    size_t half = d->token_bytes / 2;
    uint8_t *buf = malloc(d->token_bytes * 2);
    if (!buf)
        return cli_fail(CTXS_ENOMEM, "checking the resumed K/V");
    /* The first token (a sink), and seven spread over the rest that is
     * held, the last included. */
    uint64_t lo = info->ring_start > 1 ? info->ring_start : 1;
    uint64_t hi = d->n_tokens - 1;
    int ec = CLI_OK;
    for (uint32_t i = 0; i < 8 && ec == CLI_OK; i++) {
        uint64_t pos = i == 0 ? 0 : lo + (hi - lo) * (i - 1) / 6;
        uint8_t *k = buf, *v = buf + half;
        uint8_t *ek = buf + d->token_bytes, *ev = ek + half;
        rc = ctxs_session_read_token(k, v, d->s, pos, CTXS_DTYPE_F16);
        if (rc == CTXS_EEVICTED)
            continue;
        if (rc < 0) {
            ec = cli_fail(rc, "session %s: token %" PRIu64, d->name, pos);
            break;
        }
        d->engine.expect(&d->engine, d->ids, pos, ek, ev);
        if (memcmp(k, ek, half) || memcmp(v, ev, half)) {
            cli_say("session %s: the K/V of token %" PRIu64 " differ from what"
                    " the engine wrote", d->name, pos);
            ec = CLI_EDAMAGED;
        }
        d->resume.tokens_checked++;
    }
    free(buf);
    return ec;
}

/* What a chat app does first after it comes back: predict from the session
 * alone. tinychat recomputes the last token on the way (one forward pass,
 * attention over every held token) and compares its K/V with the stored
 * ones. An engine without a model reads a byte of every page of the held
 * K/V instead, as a first attention pass would. */
static int first_token(demo *d, uint32_t n_held, uint32_t *next_id)
{
    if (!d->engine.resume) {
        *next_id = (uint32_t)touch_held(d, n_held);
        return CLI_OK;
    }
    int rc = d->engine.resume(&d->engine, d->s, next_id);
    if (rc == CTXS_ECORRUPT) {
        cli_say("session %s: the model recomputed token %" PRIu64 " and its "
                "K/V differ from the stored ones", d->name, d->n_tokens - 1);
        return CLI_EDAMAGED;
    }
    if (rc < 0)
        return cli_fail(rc, "session %s: the %s engine's resume", d->name,
                        d->engine.name);
    return CLI_OK;
}

/* The app comes back: the store and the session opened, and the first
 * token predicted from them, timed as one. */
static int reopen(demo *d, resume_pass *pass, ctxs_session_info *info)
{
    double t0 = cli_now_s();
    int rc = ctxs_store_open(&d->st, d->store_dir, CTXS_STORE_CREATE, NULL);
    if (rc < 0)
        return cli_fail(rc, "%s", d->store_dir);
    int ec = open_session(d);
    if (ec == CLI_OK)
        ec = session_info(d, info);
    pass->open_s = cli_now_s() - t0;
    if (ec == CLI_OK)
        ec = first_token(d, info->n_held, &pass->next_token);
    pass->ctxstore_s = cli_now_s() - t0;
    pass->first_s = pass->ctxstore_s - pass->open_s;
    return ec;
}

/* The app quits: session, store and database closed, the engine's copy of
 * the K/V gone. The session is synced first, so that none of its pages is
 * dirty and a drop from the page cache can take them all. */
static int close_all(demo *d)
{
#ifdef CTXS_HAVE_SQLITE
    db_close(d);
#endif
    int rc = d->s ? ctxs_session_sync(d->s) : 0;
    ctxs_session_close(d->s);
    d->s = NULL;
    ctxs_store_close(d->st);
    d->st = NULL;
    return rc < 0 ? cli_fail(rc, "session %s: sync", d->name) : CLI_OK;
}

/* Bytes of the file at fd cached in the page cache (mincore), or -errno. */
static int64_t cached_bytes(int fd, size_t size)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t n = (size + page - 1) / page;
    if (n == 0)
        return 0;
    void *p = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return -errno;
    unsigned char *vec = malloc(n);
    int64_t rc = vec ? 0 : -ENOMEM;
    if (rc == 0 && mincore(p, size, (void *)vec) < 0)
        rc = -errno;
    for (size_t i = 0; rc >= 0 && i < n; i++)
        rc += vec[i] & 1 ? (int64_t)page : 0;
    free(vec);
    munmap(p, size);
    return rc;
}

/* Drops a closed file's pages from the page cache. DONTNEED leaves dirty
 * pages and pages under writeback where they are, so the file is synced
 * first. Adds the bytes still cached after it to *cached; returns 0 or
 * -errno. */
static int drop_file(const char *path, int64_t *cached)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat sb;
    int rc = fstat(fd, &sb) < 0 || fdatasync(fd) < 0 ? -errno : 0;
#ifdef POSIX_FADV_DONTNEED
    if (rc == 0)
        rc = -posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
#else
    rc = rc ? rc : -ENOSYS;
#endif
    int64_t left = rc == 0 ? cached_bytes(fd, (size_t)sb.st_size) : -1;
    close(fd);
    if (left < 0 || *cached < 0)
        *cached = -1;
    else
        *cached += left;
    return rc ? rc : left < 0 ? (int)left : 0;
}

/* Makes the next pass cold: the session file, the index and the state
 * file out of the page cache, as after a reboot. The pass counts as cold
 * when less than 1% of the state stayed cached in either. */
static void drop_caches(demo *d)
{
    resume_result *res = &d->resume;
    char path[PATH_MAX + 64];
    res->ctxstore_cached = res->state_cached = 0;
    ctxs_store_session_get_path(path, sizeof path, d->store_dir, d->session_id);
    int rc = drop_file(path, &res->ctxstore_cached);
    snprintf(path, sizeof path, "%s/index/data.mdb", d->store_dir);
    int rc2 = drop_file(path, &res->ctxstore_cached);
    int rc3 = drop_file(d->state_path, &res->state_cached);
    res->drop_rc = rc ? rc : rc2 ? rc2 : rc3;
    uint64_t limit = res->state_bytes / 100;
    res->dropped = res->drop_rc == 0 && res->ctxstore_cached >= 0
                   && res->state_cached >= 0
                   && (uint64_t)res->ctxstore_cached <= limit
                   && (uint64_t)res->state_cached <= limit;
}

/* The state file read back, warm or cold, must hold the session's K/V; the
 * session is open when it is compared, so *p is kept until then. */
static int check_state(const demo *d, uint8_t *p, size_t n, const char *what)
{
    int same = same_as_session(d, p, n, d->resume.n_held);
    free(p);
    if (same)
        return CLI_OK;
    cli_say("the %s read back differs from the session's K/V", what);
    return CLI_EFAIL;
}

/* Warm: the app quits and comes back at once, to the page cache as the
 * chat left it. ctxstore reopens to its first token; the state file and
 * SQLite are read back, and checked against the open session. */
static int resume_warm(demo *d, ctxs_session_info *info)
{
    resume_result *res = &d->resume;
    int ec = reopen(d, &res->warm, info);
    if (ec)
        return ec;
    res->n_tokens = info->n_tokens;
    res->n_held = info->n_held;
    res->state_bytes = (uint64_t)info->n_held * d->token_bytes;
    uint8_t *p;
    size_t n;
    if ((ec = read_state_file(d, &p, &n, &res->warm.state_file_s))
        || (ec = check_state(d, p, n, "state file")))
        return ec;
#ifdef CTXS_HAVE_SQLITE
    if (d->n_results && d->results[d->n_results - 1].sqlite_s >= 0) {
        if ((ec = select_sqlite(d, &p, &n, &res->sqlite_s))
            || (ec = check_state(d, p, n, "SQLite blob")))
            return ec;
    }
#endif
    return CLI_OK;
}

/* Cold: the files' pages dropped, the state file read, then ctxstore
 * reopened to its first token, which must be the warm pass's. The session
 * stays open for the rest of the chat. */
static int resume_cold(demo *d, ctxs_session_info *info)
{
    resume_result *res = &d->resume;
    drop_caches(d);
    uint8_t *p = NULL;
    size_t n = 0;
    int ec = read_state_file(d, &p, &n, &res->cold.state_file_s);
    if (ec == CLI_OK)
        ec = reopen(d, &res->cold, info);
    if (ec == CLI_OK)
        ec = check_state(d, p, n, "state file");
    else
        free(p);
    if (ec == CLI_OK && d->engine.resume
        && res->cold.next_token != res->warm.next_token) {
        cli_say("session %s: the cold resume predicted token %u, the warm one"
                " %u", d->name, res->cold.next_token, res->warm.next_token);
        ec = CLI_EDAMAGED;
    }
    return ec;
}

/* The app quits and comes back twice: warm, then cold. Each time ctxstore
 * opens the store and the session (a map and a header check) and predicts
 * the next token; the others read the whole state. */
static int restart(demo *d)
{
    resume_result *res = &d->resume;
    res->sqlite_s = -1;
    res->predicted = d->engine.resume != NULL;
    free(d->state);
    d->state = NULL;
    d->state_cap = 0;
    ctxs_session_info info;
    int ec = close_all(d);
    if (ec == CLI_OK) {
        settle_dir(d);
        ec = resume_warm(d, &info);
    }
    if (ec == CLI_OK)
        ec = close_all(d);
    if (ec == CLI_OK)
        ec = resume_cold(d, &info);
    if (ec == CLI_OK) {
        if (res->predicted)
            res->tokens_checked = 1;
        ec = check_resumed(d, &info);
    }
    return ec;
}

/* --- The session in each dtype ------------------------------------------- */

/* A session file of d's model with another dtype, beside the store (in
 * the run's scratch directory, not in the store: a store gives a model
 * hash one geometry). Durability NONE and no background thread: the file
 * lives for the measurement only, and no runway allocates slots past its
 * tokens. */
static int size_create(demo *d, ctxs_session **out, char path[PATH_MAX],
                       uint32_t i)
{
    char name[32];
    snprintf(name, sizeof name, "dtype-%s.ctxs", k_size_dtypes[i].name);
    int ec = join(path, d->base, name);
    if (ec) {
        path[0] = '\0';
        return ec;
    }
    ctxs_model m = d->model;
    m.geometry.dtype = k_size_dtypes[i].dtype;
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = d->cfg.capacity;
    o.open.durability = CTXS_SYNC_NONE;
    o.open.background = 0;
    int rc = ctxs_session_create(out, path, &m, &o);
    if (rc < 0) {
        ec = cli_fail(rc, "%s", path);
        path[0] = '\0'; /* nothing was made there */
    }
    return ec;
}

/* Writes the tokens the session holds, in position order, into a new
 * session file of each dtype and notes what each takes, then removes
 * them. Each token is read from the session once, as float32, and handed
 * to ctxs_session_write_token() of each file, which converts it (a Q8 file
 * quantizes): the files an engine keeping that dtype would have saved. The
 * fp16 file holds the session's own bytes, written the same way as the
 * others so that the three compare. */
static int size_dtypes(demo *d)
{
    ctxs_session_info info;
    int ec = session_info(d, &info);
    if (ec)
        return ec;
    double t0 = cli_now_s();
    const ctxs_geometry *g = &d->model.geometry;
    size_t f32 = ctxs_geometry_get_token_bytes(g, CTXS_DTYPE_F32);
    ctxs_session *out[N_SIZE_DTYPES] = { NULL };
    char paths[N_SIZE_DTYPES][PATH_MAX];
    uint64_t *pos = malloc((size_t)info.n_held * sizeof *pos);
    uint32_t *ids = malloc((size_t)info.n_held * sizeof *ids);
    float *k = malloc(2 * f32), *v = k ? k + f32 / sizeof *k : NULL;
    if (!pos || !ids || !k)
        ec = cli_fail(CTXS_ENOMEM, "the session in each dtype");
    for (uint32_t i = 0; i < N_SIZE_DTYPES; i++)
        paths[i][0] = '\0';
    for (uint32_t i = 0; ec == CLI_OK && i < N_SIZE_DTYPES; i++)
        ec = size_create(d, &out[i], paths[i], i);

    /* The held positions: the sinks, then the ring's oldest to newest. */
    uint32_t n = 0;
    for (uint64_t p = 0; ec == CLI_OK && p < info.n_tokens && n < info.n_held; p++) {
        uint32_t slot;
        int rc = ctxs_session_get_slot(&slot, d->s, p);
        if (rc == CTXS_EEVICTED)
            continue;
        if (rc < 0) {
            ec = cli_fail(rc, "session %s: token %" PRIu64, d->name, p);
        } else {
            pos[n] = p;
            ids[n++] = d->lay.token_ids[slot];
        }
    }
    /* As few reservations as the ring allows (one, unless it wrapped):
     * each allocates a block range in every run, and a file of fewer,
     * longer ranges is quicker to delete. Measured on ext4 mounted with
     * discard, on a virtual disk: deleting the three files of 2,019
     * tokens took 22 s with a reservation per 256 tokens, 0.4 s with one. */
    const uint32_t chunk = info.capacity - info.n_sink;
    for (uint32_t c = 0; ec == CLI_OK && c < n; c += chunk) {
        uint32_t m = n - c < chunk ? n - c : chunk;
        ctxs_reservation r[N_SIZE_DTYPES];
        int rc = 0;
        for (uint32_t i = 0; rc == 0 && i < N_SIZE_DTYPES; i++)
            rc = ctxs_session_reserve(&r[i], out[i], m);
        for (uint32_t t = 0; rc == 0 && t < m; t++) {
            rc = ctxs_session_read_token(k, v, d->s, pos[c + t], CTXS_DTYPE_F32);
            for (uint32_t i = 0; rc == 0 && i < N_SIZE_DTYPES; i++)
                rc = ctxs_session_write_token(out[i], &r[i], t, k, v,
                                              CTXS_DTYPE_F32);
        }
        for (uint32_t i = 0; rc == 0 && i < N_SIZE_DTYPES; i++)
            rc = ctxs_session_commit(out[i], ids + c, m);
        if (rc < 0)
            ec = cli_fail(rc, "the session in each dtype, tokens %u to %u", c,
                          c + m);
    }
    for (uint32_t i = 0; i < N_SIZE_DTYPES; i++) {
        ctxs_session_close(out[i]);
        struct stat sb;
        if (ec == CLI_OK && stat(paths[i], &sb) < 0)
            ec = cli_fail(-errno, "%s", paths[i]);
        if (ec == CLI_OK) {
            dtype_size *z = &d->sizes[i];
            ctxs_geometry gi = *g;
            gi.dtype = k_size_dtypes[i].dtype;
            z->dtype = gi.dtype;
            z->name = k_size_dtypes[i].name;
            z->token_bytes = 2 * (uint64_t)ctxs_geometry_get_token_bytes(&gi, gi.dtype);
            z->kv_bytes = z->token_bytes * n;
            z->file_bytes = (uint64_t)sb.st_size;
            z->disk_bytes = (uint64_t)sb.st_blocks * 512;
        }
        if (paths[i][0])
            unlink(paths[i]);
    }
    d->sizes_held = n;
    d->sizes_s = cli_now_s() - t0;
    free(pos);
    free(ids);
    free(k);
    return ec;
}

/* --- Output --------------------------------------------------------------- */

static const char *fmt_ratio(char buf[32], double num, double den)
{
    if (num < 0 || den <= 0)
        snprintf(buf, 32, "n/a");
    else if (num / den >= 9.95)
        snprintf(buf, 32, "%.0fx", num / den);
    else
        snprintf(buf, 32, "%.1fx", num / den);
    return buf;
}

static const char *fmt_secs(char buf[32], double secs)
{
    if (secs < 0)
        return strcpy(buf, "n/a");
    return fmt_duration(buf, secs);
}

static void print_header(const demo *d)
{
    const ctxs_geometry *g = &d->engine.model.geometry;
    char a[32], b[32];
    printf("ctxstore demo: a chat saved turn by turn, closed, resumed and "
           "continued\n\n");
    printf("  store    %s%s\n", d->store_dir,
           !d->store_temporary ? (d->keep ? " (the demo's session is kept)"
                                          : " (the demo's session is deleted at the end; "
                                            "--keep keeps it)")
           : d->keep           ? " (temporary, kept)"
                               : " (temporary, removed at the end; --keep keeps it)");
    printf("  model    %s: %u layers x %u KV heads\n"
           "           x %u dims, fp16 = %s a token\n",
           d->engine.model_name, g->n_layers, g->n_kv_heads, g->head_dim,
           fmt_size(a, d->token_bytes));
    printf("  session  %s: %u slots, a %s file (sparse), ASYNC\n", d->name,
           d->cfg.capacity, fmt_size(b, d->file_bytes));
    printf("  engine   %s\n", d->engine.description);
    if (d->memory_fs)
        printf("  note     a memory file system (tmpfs): syncs cost nothing "
               "here, so the\n           state file and SQLite look cheaper "
               "than on a disk\n");
    if (d->quick)
        printf("  note     --quick is a test run: a tiny model (%s a token, where\n"
               "           Qwen3-4B's geometry takes 144 KiB) and a short chat. At\n"
               "           this size each save moves a few KiB, fixed costs (a\n"
               "           commit record, the index) dominate, and ctxstore may\n"
               "           look slower than a state file or SQLite; without\n"
               "           --quick the demo measures the real geometry\n",
               fmt_size(a, d->token_bytes));
    printf("\n");
}

/* 79 columns: turn, tokens, new, KV | ctxstore, the part of it that the
 * commit (a save) or the open (a resume) took, state file, SQLite | the two
 * ratios. */
#define ROW_FMT "%-4s %6s %4s %8s  %8s %8s %10s %8s  %6s %6s\n"

static void print_table_head(int resume)
{
    printf("%27s%s ctxstore faster\n", "",
           resume ? "---- resume, to the first token ----"
                  : "----------- save a turn ------------");
    printf(ROW_FMT, resume ? "" : "turn", "tokens", resume ? "" : "new", "KV",
           "ctxstore", resume ? "open" : "commit", "state file", "SQLite",
           "file", "SQLite");
}

static void print_turn(const turn_result *r)
{
    char turn[16], tokens[32], fresh[16], kv[32], c1[32], c2[32], c3[32],
        c4[32], r1[32], r2[32];
    int no_sqlite = r->resumed && r->sqlite_s < 0;
    snprintf(turn, sizeof turn, "%u", r->turn);
    snprintf(tokens, sizeof tokens, "%" PRIu64, r->n_tokens);
    snprintf(fresh, sizeof fresh, "%u", r->new_tokens);
    printf(ROW_FMT, turn, tokens, fresh, fmt_size(kv, r->state_bytes),
           fmt_secs(c1, r->save_s), fmt_secs(c2, r->commit_s),
           fmt_secs(c3, r->state_file_s),
           no_sqlite ? "-" : fmt_secs(c4, r->sqlite_s),
           fmt_ratio(r1, r->state_file_s, r->save_s),
           no_sqlite ? "-" : fmt_ratio(r2, r->sqlite_s, r->save_s));
    fflush(stdout);
}

/* A row of the resume table; SQLite is read warm only (sqlite_s < 0). */
static void print_pass(const demo *d, const char *label, const resume_pass *p,
                       double sqlite_s)
{
    const resume_result *r = &d->resume;
    char tokens[32], kv[32], c1[32], c2[32], c3[32], c4[32], r1[32], r2[32];
    snprintf(tokens, sizeof tokens, "%" PRIu64, r->n_tokens);
    printf(ROW_FMT, label, tokens, "", fmt_size(kv, r->state_bytes),
           fmt_secs(c1, p->ctxstore_s), fmt_secs(c2, p->open_s),
           fmt_secs(c3, p->state_file_s),
           sqlite_s < 0 ? "-" : fmt_secs(c4, sqlite_s),
           fmt_ratio(r1, p->state_file_s, p->ctxstore_s),
           sqlite_s < 0 ? "-" : fmt_ratio(r2, sqlite_s, p->ctxstore_s));
}

/* Whether the cold row was cold, in mincore's words. */
static void print_drop(const resume_result *r)
{
    char a[32], b[32];
    if (r->ctxstore_cached < 0 || r->state_cached < 0)
        printf("cold: the page cache could not be dropped (%s): the cold row"
               " may be\npartly warm\n", ctxs_strerror(r->drop_rc));
    else if (!r->dropped)
        printf("cold: the page cache could not be dropped%s%s: %s of the "
               "session file and\nthe index and %s of the state file stayed "
               "cached (mincore); the cold\nrow is partly warm\n",
               r->drop_rc ? ", " : "", r->drop_rc ? ctxs_strerror(r->drop_rc)
                                                  : "",
               fmt_size(a, (uint64_t)r->ctxstore_cached),
               fmt_size(b, (uint64_t)r->state_cached));
    else
        printf("cold: after ctxs_session_sync, close and posix_fadvise("
               "DONTNEED), mincore\nfinds %s of the session file and the "
               "index and %s of the state file cached\n",
               fmt_size(a, (uint64_t)r->ctxstore_cached),
               fmt_size(b, (uint64_t)r->state_cached));
}

static void print_resume(const demo *d)
{
    const resume_result *r = &d->resume;
    printf("\nsession, store and database closed; reopened with the page "
           "cache as the chat\nleft it (warm), then again with the files' "
           "pages dropped from it (cold):\n\n");
    print_table_head(1);
    print_pass(d, "warm", &r->warm, r->sqlite_s);
    print_pass(d, "cold", &r->cold, -1);
    char held[64] = "";
    if (r->n_held < r->n_tokens)
        snprintf(held, sizeof held, " (the ring wrapped: %u held)", r->n_held);
    if (r->predicted) {
        printf("\nresumed %" PRIu64 " tokens, identical: every held token's "
               "checksum and id%s;\nthe model recomputed its last token from "
               "the session alone (one forward\npass, its K/V bit-identical "
               "to the stored ones): next token %u, warm and cold\n",
               r->n_tokens, held, r->warm.next_token);
    } else {
        printf("\nresumed %" PRIu64 " tokens, identical: every held token's "
               "checksum and id,\nand the K/V of %u tokens recomputed by the "
               "engine%s\n", r->n_tokens, r->tokens_checked, held);
    }
    print_drop(r);
    printf("\n");
    print_table_head(0);
    fflush(stdout);
}

/* The same conversation as a file of each dtype, against fp16's. */
static void print_sizes(const demo *d)
{
    const dtype_size *f16 = &d->sizes[0];
    printf("\nthe same conversation as a session file of each dtype (%u tokens "
           "held, written\nthrough ctxs_session_write_token, which converts "
           "and quantizes):\n\n", d->sizes_held);
    printf("%-6s %10s %10s %14s %10s %8s\n", "dtype", "a token", "K/V held",
           "file (sparse)", "on disk", "vs f16");
    for (uint32_t i = 0; i < N_SIZE_DTYPES; i++) {
        const dtype_size *z = &d->sizes[i];
        char a[32], b[32], c[32], e[32], r[32];
        printf("%-6s %10s %10s %14s %10s %8s\n", z->name,
               fmt_size(a, z->token_bytes), fmt_size(b, z->kv_bytes),
               fmt_size(c, z->file_bytes), fmt_size(e, z->disk_bytes),
               fmt_ratio(r, (double)z->disk_bytes, (double)f16->disk_bytes));
    }
}

/* The median of one field over the turns that measured it; -1 if none. */
static double median_of(const demo *d, size_t offset)
{
    double v[MAX_TURNS + MORE_TURNS];
    uint32_t n = 0;
    for (uint32_t i = 0; i < d->n_results; i++) {
        double x;
        memcpy(&x, (const char *)&d->results[i] + offset, sizeof x);
        if (x >= 0)
            v[n++] = x;
    }
    if (n == 0)
        return -1;
    qsort(v, n, sizeof v[0], cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#define MEDIAN(d, field) median_of(d, offsetof(turn_result, field))

/* Prints text wrapped to 78 columns: with a label, in a column 12 wide
 * after it (a note); with none (NULL), from the margin. */
static void print_note(const char *label, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void print_note(const char *label, const char *fmt, ...)
{
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    int indent = label ? 12 : 0;
    int col = printf("%-*s", indent, label ? label : "");
    for (const char *w = text; *w;) {
        size_t n = strcspn(w, " ");
        /* A number stays on the line of its unit. */
        while (n && w[n - 1] >= '0' && w[n - 1] <= '9' && w[n] == ' '
               && w[n + 1])
            n += 1 + strcspn(w + n + 1, " ");
        if (col > indent && col + 1 + (int)n > 78)
            col = printf("\n%*s", indent, "") - 1;
        else if (col > indent)
            col += printf(" ");
        col += printf("%.*s", (int)n, w);
        w += n;
        w += strspn(w, " ");
    }
    printf("\n");
}

/* The first turn played after the resume, or NULL. */
static const turn_result *resumed_turn(const demo *d)
{
    for (uint32_t i = 0; i < d->n_results; i++)
        if (d->results[i].resumed)
            return &d->results[i];
    return NULL;
}

/* What each figure counts. */
static void print_demo_notes(const demo *d)
{
    const resume_result *r = &d->resume;
    char a[32], b[32], c[32];
    char e[32];
    print_note("ctxstore", "all of a save, medians: reserve (%s), the writes "
               "of the new K/V, a layer at a time with ctxs_session_write_layer"
               " (%s, where copying the same bytes in memory takes %s) and "
               "ctxs_session_commit (%s, the commit column). ASYNC: checksums"
               " the new tokens, writes a 128-byte record, starts writeback; "
               "survives a process crash, and after a power loss the open "
               "keeps what verifies. reserve takes slots that the background "
               "thread allocated and mapped after the last commit; the writes "
               "go into them where they are still mapped writable, else "
               "through the file (the demo writes the disk back before each "
               "turn, as the kernel does after a pause of 30 s).%s",
               fmt_secs(a, MEDIAN(d, reserve_s)),
               fmt_secs(b, MEDIAN(d, write_s)), fmt_secs(e, MEDIAN(d, copy_s)),
               fmt_secs(c, MEDIAN(d, commit_s)),
               d->engine.stages ? "" : " tinychat hands each layer over inside "
               "its forward pass, before its attention reads it: the time in "
               "those calls, apart from the model.");
    const turn_result *next = resumed_turn(d);
    if (next && next->reserve_s > 10 * MEDIAN(d, reserve_s)
        && next->reserve_s > 0.01)
        print_note("", "Turn %u, the first after the cold resume, spent %s "
                   "in reserve: the slots it maps were cold too.", next->turn,
                   fmt_secs(a, next->reserve_s));
    print_note("state file", "the held K/V to a new file, fdatasync, rename "
               "(llama.cpp's state file, made crash-safe). Survives power "
               "loss.");
#ifdef CTXS_HAVE_SQLITE
    print_note("SQLite", "%s, INSERT OR REPLACE of the held K/V as one BLOB, "
               "WAL, synchronous=NORMAL, as bench_session. Survives a process"
               " crash; durable at the next checkpoint. Not repeated after "
               "the resume.", sqlite3_libversion());
#else
    print_note("SQLite", "n/a: this ctxstore was built without SQLite.");
#endif
    if (r->predicted)
        print_note("resume", "ctxs_store_open + ctxs_store_session_open (the"
                   " open column) + the model's next token from the file "
                   "alone (a forward pass over every held token: %s warm), vs"
                   " open + read() (state file) and open + SELECT + copy "
                   "(SQLite, warm only), which leave that pass out.",
                   fmt_secs(a, r->warm.first_s));
    else
        print_note("resume", "ctxs_store_open + ctxs_store_session_open (the"
                   " open column) + a byte of every page of the held K/V, as"
                   " a first attention pass, vs open + read() (state file) "
                   "and open + SELECT + copy (SQLite, warm only).");
    print_note("", "warm: the page cache as the chat left it; cold: the "
               "session file's, the index's and the state file's pages "
               "dropped first%s.", d->quick ? "" : "; the disk settled "
               "before each timed step");
}

static void print_summary(const demo *d)
{
    const resume_result *r = &d->resume;
    char a[32], b[32], e[32], f[32], g[32], h[32], i[32];
    printf("\n");
    print_note(NULL, "Saving a turn: %s with ctxstore, %s as a state file, %s "
               "as a SQLite row (medians). Resuming %" PRIu64 " tokens %s: "
               "%s cold, %s warm; reading the state file alone: %s cold, %s "
               "warm.%s",
               fmt_secs(a, MEDIAN(d, save_s)),
               fmt_secs(b, MEDIAN(d, state_file_s)),
               fmt_secs(e, MEDIAN(d, sqlite_s)), r->n_tokens,
               r->predicted ? "to the next token" : "and reading them",
               fmt_secs(f, r->cold.ctxstore_s),
               fmt_secs(g, r->warm.ctxstore_s),
               fmt_secs(h, r->cold.state_file_s),
               fmt_secs(i, r->warm.state_file_s),
               r->dropped ? "" : " (The cold figures are partly warm: the "
               "page cache could not be dropped.)");
    printf("\n");
    print_demo_notes(d);
}

static void json_secs(json *j, const char *key, double secs)
{
    json_key(j, key);
    if (secs < 0)
        json_null(j);
    else
        json_double(j, secs);
}

static void json_ratio(json *j, const char *key, double num, double den)
{
    json_key(j, key);
    if (num < 0 || den <= 0)
        json_null(j);
    else
        json_double(j, num / den);
}

static void json_header(json *j, const demo *d)
{
    const ctxs_geometry *g = &d->engine.model.geometry;
    json_kv_string(j, "store", d->store_dir);
    json_kv_bool(j, "temporary", d->store_temporary);
    json_kv_bool(j, "kept", d->keep);
    json_kv_bool(j, "quick", d->quick);
    json_kv_bool(j, "memory_fs", d->memory_fs);
    json_kv_string(j, "engine", d->engine.name);

    json_key(j, "model");
    json_object_begin(j);
    json_kv_string(j, "name", d->engine.model_name);
    json_kv_u64(j, "n_layers", g->n_layers);
    json_kv_u64(j, "n_kv_heads", g->n_kv_heads);
    json_kv_u64(j, "head_dim", g->head_dim);
    json_kv_string(j, "dtype", "f16");
    json_kv_u64(j, "token_bytes", d->token_bytes);
    json_object_end(j);

    json_key(j, "session");
    json_object_begin(j);
    json_kv_string(j, "name", d->name);
    json_kv_u64(j, "capacity", d->cfg.capacity);
    json_kv_u64(j, "file_bytes", d->file_bytes);
    json_kv_string(j, "durability", "async");
    json_object_end(j);

    json_key(j, "sqlite");
#ifdef CTXS_HAVE_SQLITE
    json_string(j, sqlite3_libversion());
#else
    json_null(j);
#endif
    /* SQLite saves are timed before the resume only. */
    json_kv_bool(j, "sqlite_after_resume", 0);
}

/* save_s is ctxstore's whole save; the ratios are against it. */
static void json_turns(json *j, const demo *d)
{
    json_key(j, "turns");
    json_array_begin(j);
    for (uint32_t i = 0; i < d->n_results; i++) {
        const turn_result *t = &d->results[i];
        json_object_begin(j);
        json_kv_u64(j, "turn", t->turn);
        json_kv_bool(j, "resumed", t->resumed);
        json_kv_u64(j, "tokens", t->n_tokens);
        json_kv_u64(j, "new_tokens", t->new_tokens);
        json_kv_u64(j, "held_tokens", t->n_held);
        json_kv_u64(j, "state_bytes", t->state_bytes);
        json_secs(j, "save_s", t->save_s);
        json_secs(j, "reserve_s", t->reserve_s);
        json_secs(j, "write_s", t->write_s);
        json_secs(j, "write_copy_s", t->copy_s);
        json_secs(j, "commit_s", t->commit_s);
        json_secs(j, "state_file_s", t->state_file_s);
        json_secs(j, "sqlite_s", t->sqlite_s);
        json_ratio(j, "state_file_ratio", t->state_file_s, t->save_s);
        json_ratio(j, "sqlite_ratio", t->sqlite_s, t->save_s);
        json_object_end(j);
    }
    json_array_end(j);
}

/* ctxstore_s is the open and the first token; the ratios are against it. */
static void json_pass(json *j, const char *key, const resume_pass *p,
                      double sqlite_s)
{
    json_key(j, key);
    json_object_begin(j);
    json_secs(j, "ctxstore_s", p->ctxstore_s);
    json_secs(j, "open_s", p->open_s);
    json_secs(j, "first_token_s", p->first_s);
    json_secs(j, "state_file_s", p->state_file_s);
    json_ratio(j, "state_file_ratio", p->state_file_s, p->ctxstore_s);
    json_secs(j, "sqlite_s", sqlite_s);
    json_ratio(j, "sqlite_ratio", sqlite_s, p->ctxstore_s);
    json_object_end(j);
}

static void json_resume(json *j, const demo *d)
{
    const resume_result *r = &d->resume;
    json_key(j, "resume");
    json_object_begin(j);
    json_kv_u64(j, "tokens", r->n_tokens);
    json_kv_u64(j, "held_tokens", r->n_held);
    json_kv_u64(j, "state_bytes", r->state_bytes);
    json_kv_string(j, "ctxstore_measures",
                   r->predicted ? "open + next token" : "open + held pages");
    json_pass(j, "warm", &r->warm, r->sqlite_s);
    json_pass(j, "cold", &r->cold, -1);
    json_kv_bool(j, "cold_dropped", r->dropped);
    json_kv_i64(j, "cold_ctxstore_cached_bytes", r->ctxstore_cached);
    json_kv_i64(j, "cold_state_file_cached_bytes", r->state_cached);
    /* As before the cold pass: warm, the open alone, and the reads. */
    json_secs(j, "ctxstore_open_s", r->warm.open_s);
    json_secs(j, "state_file_s", r->warm.state_file_s);
    json_secs(j, "sqlite_s", r->sqlite_s);
    json_kv_bool(j, "identical", 1);
    json_kv_u64(j, "tokens_checked", r->tokens_checked);
    if (r->predicted) {
        json_secs(j, "next_token_s", r->warm.first_s);
        json_kv_u64(j, "next_token", r->warm.next_token);
    }
    json_object_end(j);
}

static void json_sizes(json *j, const demo *d)
{
    json_key(j, "dtype_sizes");
    json_object_begin(j);
    json_kv_u64(j, "held_tokens", d->sizes_held);
    json_secs(j, "written_s", d->sizes_s);
    json_key(j, "files");
    json_array_begin(j);
    for (uint32_t i = 0; i < N_SIZE_DTYPES; i++) {
        const dtype_size *z = &d->sizes[i];
        json_object_begin(j);
        json_kv_string(j, "dtype", z->name);
        json_kv_u64(j, "token_bytes", z->token_bytes);
        json_kv_u64(j, "kv_bytes", z->kv_bytes);
        json_kv_u64(j, "file_bytes", z->file_bytes);
        json_kv_u64(j, "disk_bytes", z->disk_bytes);
        json_ratio(j, "disk_ratio_to_f16", (double)z->disk_bytes,
                   (double)d->sizes[0].disk_bytes);
        json_object_end(j);
    }
    json_array_end(j);
    json_object_end(j);
}

static void print_json(const demo *d)
{
    const resume_result *r = &d->resume;
    json j;
    json_init(&j, stdout);
    json_object_begin(&j);
    json_header(&j, d);
    json_turns(&j, d);
    json_resume(&j, d);
    json_sizes(&j, d);

    json_key(&j, "summary");
    json_object_begin(&j);
    json_secs(&j, "save_median_s", MEDIAN(d, save_s));
    json_secs(&j, "reserve_median_s", MEDIAN(d, reserve_s));
    json_secs(&j, "write_median_s", MEDIAN(d, write_s));
    json_secs(&j, "write_copy_median_s", MEDIAN(d, copy_s));
    json_secs(&j, "commit_median_s", MEDIAN(d, commit_s));
    json_secs(&j, "state_file_median_s", MEDIAN(d, state_file_s));
    json_secs(&j, "sqlite_median_s", MEDIAN(d, sqlite_s));
    json_secs(&j, "resume_cold_s", r->cold.ctxstore_s);
    json_secs(&j, "resume_warm_s", r->warm.ctxstore_s);
    json_secs(&j, "state_file_cold_s", r->cold.state_file_s);
    json_secs(&j, "state_file_warm_s", r->warm.state_file_s);
    json_object_end(&j);

    json_object_end(&j);
    json_finish(&j);
}

/* --- The demo ------------------------------------------------------------- */

static int create_session(demo *d)
{
    int rc = ctxs_model_register(d->st, &d->model, d->engine.model_name);
    if (rc < 0)
        return cli_fail(rc, "registering the model %s", d->engine.model_name);
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = d->cfg.capacity;
    o.open.durability = CTXS_SYNC_ASYNC;
    uint64_t ms = cli_now_ms();
    for (int i = 0;; i++) {
        if (i == 0)
            snprintf(d->name, sizeof d->name, "demo-%" PRIu64, ms);
        else
            snprintf(d->name, sizeof d->name, "demo-%" PRIu64 "-%d", ms, i);
        rc = ctxs_store_session_create(&d->s, d->st, d->name, &d->model, &o);
        if (rc != -EEXIST || i == 100)
            break;
    }
    if (rc < 0)
        return cli_fail(rc, "creating session %s", d->name);
    d->session_created = 1;
    ctxs_session_entry entry;
    if ((rc = ctxs_store_session_get(&entry, d->st, d->name)) < 0)
        return cli_fail(rc, "session %s", d->name);
    d->session_id = entry.id;
    ctxs_session_info info;
    int ec;
    if ((ec = session_info(d, &info)))
        return ec;
    d->file_bytes = info.file_bytes;
    rc = ctxs_session_get_layout(&d->lay, d->s);
    if (rc < 0)
        return cli_fail(rc, "session %s", d->name);
    if (d->lay.slot_bytes != (size_t)d->engine.model.geometry.head_dim * 2) {
        cli_say("session %s: %zu bytes a slot, expected %u", d->name,
                d->lay.slot_bytes, d->engine.model.geometry.head_dim * 2);
        return CLI_EFAIL;
    }
    return CLI_OK;
}

static int play(demo *d, uint32_t turns)
{
    int ec;
    if ((ec = create_session(d)))
        return ec;
    if (!d->c->json) {
        print_header(d);
        print_table_head(0);
    }
    for (uint32_t t = 0; t < turns; t++) {
        if (g_signal)
            return CLI_EFAIL;
        if ((ec = play_turn(d, t, 0)))
            return ec;
        if (!d->c->json)
            print_turn(&d->results[d->n_results - 1]);
    }
    if (g_signal)
        return CLI_EFAIL;
    if ((ec = restart(d)))
        return ec;
    if (!d->c->json)
        print_resume(d);
    for (uint32_t t = turns; t < d->n_plan; t++) {
        if (g_signal)
            return CLI_EFAIL;
        if ((ec = play_turn(d, t, 1)))
            return ec;
        if (!d->c->json)
            print_turn(&d->results[d->n_results - 1]);
    }
    if (g_signal)
        return CLI_EFAIL;
    if ((ec = size_dtypes(d)))
        return ec;
    if (d->c->json) {
        print_json(d);
    } else {
        print_sizes(d);
        print_summary(d);
    }
    return CLI_OK;
}

/* Closes everything; removes what this run made, but keeps the store with
 * --keep (a temporary one) or the demo session (a given one). */
static void teardown(demo *d)
{
#ifdef CTXS_HAVE_SQLITE
    db_close(d);
#endif
    ctxs_session_close(d->s);
    d->s = NULL;
    if (d->st && d->session_created && !d->store_temporary && !d->keep) {
        int rc = ctxs_store_session_delete(d->st, d->name);
        if (rc < 0)
            cli_fail(rc, "deleting the demo session %s", d->name);
        else if (!d->c->json && !g_signal)
            printf("\ndeleted the demo's session '%s' from %s (--keep keeps it)\n", d->name,
                   d->store_dir);
    } else if (d->st && d->session_created && !d->store_temporary && !d->c->json) {
        printf("\nkept: ctxstore --store %s info %s\n", d->store_dir, d->name);
    }
    ctxs_store_close(d->st);
    d->st = NULL;
    if (d->base_fd >= 0)
        close(d->base_fd);
    if (d->base[0]) {
        if (d->store_temporary && d->keep && !g_signal) {
            unlink(d->state_path);
            unlink(d->state_tmp);
            unlink(d->db_path);
            char p[PATH_MAX + 8];
            snprintf(p, sizeof p, "%s-wal", d->db_path);
            unlink(p);
            snprintf(p, sizeof p, "%s-shm", d->db_path);
            unlink(p);
            if (!d->c->json)
                printf("\nkept: ctxstore --store %s ls\n", d->store_dir);
        } else {
            remove_tree(d->base);
        }
    }
    free(d->plan);
    free(d->results);
    free(d->ids);
    free(d->state);
    free(d->staging);
    free(d->copy_to);
}

typedef struct demo_options {
    uint64_t turns; /* --turns, or 0 for the configuration's */
    int quick;      /* --quick */
    int keep;       /* --keep */
    int synthetic;  /* --engine synthetic */
    int engine;     /* --engine given */
    int llama;      /* --engine llama */
} demo_options;

/* Returns -1 with *o filled in to go on, or an exit code (after --help or
 * a usage error). */
static int parse_options(cli *c, int argc, char **argv, demo_options *o)
{
    enum { OPT_TURNS = 0x100, OPT_QUICK, OPT_KEEP, OPT_ENGINE };
    static const struct option longopts[] = {
        CLI_COMMON_LONGOPTS,
        { "engine", required_argument, NULL, OPT_ENGINE },
        { "turns", required_argument, NULL, OPT_TURNS },
        { "quick", no_argument, NULL, OPT_QUICK },
        { "keep", no_argument, NULL, OPT_KEEP },
        { NULL, 0, NULL, 0 },
    };
    int opt, ex;
    while ((opt = cli_getopt(c, argc, argv, ":h", longopts, &ex)) > 0) {
        switch (opt) {
        case OPT_TURNS:
            if (parse_u64(optarg, &o->turns) < 0 || o->turns < 1
                || o->turns > MAX_TURNS)
                return cli_usage_error("demo", "--turns wants a number from "
                                       "1 to %d", MAX_TURNS);
            break;
        case OPT_QUICK:
            o->quick = 1;
            break;
        case OPT_KEEP:
            o->keep = 1;
            break;
        default: /* OPT_ENGINE */
            o->engine = 1;
            if (!strcmp(optarg, "synthetic") || !strcmp(optarg, "tinychat") ||
                !strcmp(optarg, "llama")) {
                o->synthetic = !strcmp(optarg, "synthetic");
                o->llama = !strcmp(optarg, "llama");
            } else {
                return cli_usage_error("demo", "--engine is llama, tinychat or "
                                       "synthetic, not %s", optarg);
            }
            break;
        }
    }
    if (opt == CLI_GETOPT_EXIT)
        return ex;
    if (optind < argc)
        return cli_usage_error("demo", "unexpected argument %s", argv[optind]);
    return -1;
}

/* The llama.cpp demo (tools/demo-llama/demo_llama.c): a program of its
 * own, so that this tool never links llama.cpp, found beside the tool in a
 * build tree (where scripts/build-llama.sh put llama.cpp and the model). */
static int find_llama_demo(char *out, size_t len)
{
    char exe[PATH_MAX];
    return cli_exe_dir(exe, sizeof exe) &&
           snprintf(out, len, "%s/../demo-llama/ctxstore-demo-llama", exe) < (int)len &&
           access(out, X_OK) == 0;
}

/* Runs the llama.cpp demo in this process's place. */
static int exec_llama_demo(cli *c, const demo_options *o, const char *path)
{
    char *args[8];
    int n = 0;
    args[n++] = (char *)path;
    if (c->store_given) {
        args[n++] = "--store";
        args[n++] = (char *)c->store_dir;
    }
    if (o->keep)
        args[n++] = "--keep";
    if (o->quick)
        args[n++] = "--quick";
    args[n] = NULL;
    fflush(stdout);
    execv(path, args);
    return cli_fail(-errno, "%s", path);
}

const cli_command cli_cmd_demo = {
    .name = "demo",
    .run = cmd_demo,
    .summary = CLI_DEMO_SUMMARY,
    .help =
        "demo [--store DIR] [--quick] [--keep] [--engine llama|tinychat|synthetic]\n"
        "     [--turns N] [--json]\n\n"
        "Plays a chat of several turns, saving each turn into a session, quits,\n"
        "resumes and continues, and prints each save and the resume beside what\n"
        "the ways people save a KV cache today cost on the same conversation.\n"
        "The engine is llama.cpp with SmolLM2-135M where scripts/bootstrap.sh\n"
        "built them (the default there): the model's real replies, against\n"
        "llama.cpp's own state files and a re-prefill. --engine tinychat is a\n"
        "tiny transformer with random weights and Qwen3-4B's KV geometry whose\n"
        "attention reads the session, against a state file and a SQLite blob;\n"
        "--engine synthetic writes made-up K/V, with no model; --turns and\n"
        "--json are theirs. Without --store (or CTXSTORE_DIR) it works in a\n"
        "temporary directory, removed at the end unless --keep. With --store\n"
        "it works in that store and deletes its session at the end unless\n"
        "--keep (the store and its other sessions are left as they were).\n",
};

int cmd_demo(cli *c, int argc, char **argv)
{
    demo_options o = { 0 };
    int ec = parse_options(c, argc, argv, &o);
    if (ec >= 0)
        return ec;
    char llama_demo[PATH_MAX];
    const int have_llama = find_llama_demo(llama_demo, sizeof llama_demo);
    if (o.llama && !have_llama) {
        cli_say("the llama.cpp demo is not built here (scripts/bootstrap.sh builds "
                "llama.cpp and fetches the model)");
        return CLI_EUSAGE;
    }
    if (o.llama && (o.turns || c->json))
        return cli_usage_error("demo", "--turns and --json are for --engine tinychat or "
                               "synthetic");
    /* A real model where there is one; tinychat for --turns and --json. */
    if (o.llama || (!o.engine && have_llama && !o.turns && !c->json))
        return exec_llama_demo(c, &o, llama_demo);

    demo d;
    memset(&d, 0, sizeof d);
    d.c = c;
    d.cfg = o.quick ? k_quick : k_full;
    d.quick = o.quick;
    d.keep = o.keep;
    d.base_fd = -1;
    int rc = o.synthetic ? synthetic_engine(&d.engine, &d.cfg)
                         : tinychat_engine(&d.engine, o.quick);
    if (rc < 0)
        return cli_fail(rc, "the %s engine", o.synthetic ? "synthetic" : "tinychat");
    d.model = d.engine.model;
    const ctxs_geometry *g = &d.engine.model.geometry;
    d.n_runs = g->n_layers * 2 * g->n_kv_heads;
    d.token_bytes = (size_t)d.n_runs * g->head_dim * 2;

    uint32_t turns = o.turns ? (uint32_t)o.turns : d.cfg.turns;
    struct sigaction old[N_SIGNALS];
    g_signal = 0;
    signals_catch(old);
    ec = plan_conversation(&d, turns);
    if (ec == CLI_OK)
        ec = demo_setup_dirs(&d);
    if (ec == CLI_OK)
        ec = play(&d, turns);
    teardown(&d);
    if (d.engine.destroy)
        d.engine.destroy(&d.engine);
    signals_restore(old);
    if (g_signal) {
        fflush(stdout);
        raise(g_signal);
        return CLI_EFAIL;
    }
    return ec;
}

/* The program ctxstore-demo, which `ctxstore demo` runs in its place with the
 * tool's own argv (dispatch.c). */
int main(int argc, char **argv)
{
    static const cli_command *const commands[] = { &cli_cmd_demo };
    return cli_main(commands, 1, argc, argv);
}
