/*
 * llama-chat — a chat on stdin with a GGUF model through llama.cpp, kept in
 * a ctxstore store: every batch llama.cpp decodes is saved as it is decoded,
 * so the process may be killed at any moment and run again to continue.
 *
 *     llama-chat --model SmolLM2-135M-Instruct.Q4_1.gguf --store chats trip
 *
 * Each line of stdin is a user message; the reply (greedy: the most likely
 * token each time) goes to stdout. Run again with the same name and the
 * chat resumes where the session ends: with the same lines on stdin, the
 * lines it has already answered are checked against the session and
 * skipped, a prefill or a reply cut short is finished, and the chat goes
 * on. A new name whose first message starts like a stored chat (the same
 * system prompt, say) forks that chat's shared tokens instead of decoding
 * them again.
 *
 * What a chat app copies from here is main()'s shape: model and context,
 * ctxs_llama_model_init() and ctxs_model_register(), ctxs_llama_start(),
 * then ctxs_llama_decode() for every batch.
 *
 * --verify checks every token of a stored chat that is not yet durable (as
 * after a power loss) and resumes from the longest part that verifies.
 * --swa-full off makes a sliding-window model's (Gemma 3's) window layers
 * keep only their window in llama.cpp, and so in the session (on, the
 * default: every position); a chat is resumed with the setting it was
 * saved with. --rollback-to N rolls a resumed chat back to N tokens before
 * it goes on (event "rolled back N"). --background off opens the session
 * without the library's thread (see ctxstore.h, "Background work").
 * Options for tests and measurements: --break-at N (decode so that a batch
 * ends at token N, as a run killed there does when it resumes),
 * --dump-state-at N:FILE (llama.cpp's own state of the sequence when the
 * chat holds N tokens), --dump-resumed FILE (the same, right after a
 * resume), --tokens-out FILE (the conversation's token ids at exit), and
 * events on stderr ("saved N", "resumed N",
 * "forked N from NAME", "reply done N", "batch break N").
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llama.h>

#include "ctxstore.h"
#include "ctxstore_llama.h"

#define MAX_MARKS 32

typedef struct options {
    const char *model_path, *store_dir, *name, *system;
    uint32_t max_tokens, n_ctx, n_batch, n_threads;
    uint32_t breaks[MAX_MARKS];
    size_t n_breaks;
    struct {
        uint32_t at;
        const char *path;
    } dumps[MAX_MARKS];
    size_t n_dumps;
    const char *dump_resumed, *tokens_out;
    int flash_attn; /* llama_flash_attn_type */
    int swa_full;   /* window layers keep every position */
    int background; /* the session's background option */
    int64_t rollback_to; /* after the start, back to this many tokens; -1: no */
    int verbose, verify;
} options;

typedef struct chat {
    options o;
    struct llama_model *model;
    struct llama_context *ctx;
    struct llama_context_params cparams; /* ctx's */
    const struct llama_vocab *vocab;
    struct llama_sampler *sampler;
    ctxs_store *st;
    ctxs_llama *lc;
    uint32_t n; /* tokens in the conversation (saved) */
    uint32_t *history; /* its token ids, n of them */
    uint32_t history_cap;
    int have_logits; /* the context holds the last token's logits */
} chat;

#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
static void die(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "llama-chat: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

static void check(int rc, const char *what)
{
    if (rc < 0) {
        const char *why = ctxs_get_last_error();
        fprintf(stderr, "llama-chat: %s: %s%s%s\n", what, ctxs_strerror(rc), *why ? ": " : "", why);
        exit(1);
    }
}

static uint32_t number(const char *s, const char *flag)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || end == s || *end || v > UINT32_MAX)
        die("%s wants a number", flag);
    return (uint32_t)v;
}

static void usage(void)
{
    fputs("usage: llama-chat --model GGUF --store DIR [--system TEXT] [--max-tokens N]\n"
          "                  [--ctx N] [--batch N] [--threads N] [--break-at N]...\n"
          "                  [--flash-attn on|off] [--swa-full on|off] [--rollback-to N]\n"
          "                  [--background on|off]\n"
          "                  [--dump-state-at N:FILE]...\n"
          "                  [--dump-resumed FILE] [--tokens-out FILE] [--verify]\n"
          "                  [--verbose] NAME\n",
          stderr);
    exit(2);
}

static options parse(int argc, char **argv)
{
    options o = {.max_tokens = 96, .n_ctx = 2048, .n_batch = 512, .n_threads = 2,
                 .flash_attn = LLAMA_FLASH_ATTN_TYPE_AUTO, .swa_full = 1, .background = 1,
                 .rollback_to = -1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--verbose")) {
            o.verbose = 1;
            continue;
        }
        if (!strcmp(a, "--verify")) {
            o.verify = 1;
            continue;
        }
        if (a[0] != '-') {
            if (o.name)
                usage();
            o.name = a;
            continue;
        }
        if (!v)
            usage();
        i++;
        if (!strcmp(a, "--model"))
            o.model_path = v;
        else if (!strcmp(a, "--store"))
            o.store_dir = v;
        else if (!strcmp(a, "--system"))
            o.system = v;
        else if (!strcmp(a, "--max-tokens"))
            o.max_tokens = number(v, a);
        else if (!strcmp(a, "--ctx"))
            o.n_ctx = number(v, a);
        else if (!strcmp(a, "--batch"))
            o.n_batch = number(v, a);
        else if (!strcmp(a, "--threads"))
            o.n_threads = number(v, a);
        else if (!strcmp(a, "--dump-resumed"))
            o.dump_resumed = v;
        else if (!strcmp(a, "--tokens-out"))
            o.tokens_out = v;
        else if (!strcmp(a, "--flash-attn") && (!strcmp(v, "on") || !strcmp(v, "off")))
            o.flash_attn = !strcmp(v, "on") ? LLAMA_FLASH_ATTN_TYPE_ENABLED
                                            : LLAMA_FLASH_ATTN_TYPE_DISABLED;
        else if (!strcmp(a, "--swa-full") && (!strcmp(v, "on") || !strcmp(v, "off")))
            o.swa_full = !strcmp(v, "on");
        else if (!strcmp(a, "--background") && (!strcmp(v, "on") || !strcmp(v, "off")))
            o.background = !strcmp(v, "on");
        else if (!strcmp(a, "--rollback-to"))
            o.rollback_to = number(v, a);
        else if (!strcmp(a, "--break-at") && o.n_breaks < MAX_MARKS)
            o.breaks[o.n_breaks++] = number(v, a);
        else if (!strcmp(a, "--dump-state-at") && o.n_dumps < MAX_MARKS && strchr(v, ':')) {
            char num[16];
            size_t len = (size_t)(strchr(v, ':') - v);
            if (len >= sizeof num)
                usage();
            memcpy(num, v, len);
            num[len] = '\0';
            o.dumps[o.n_dumps].at = number(num, a);
            o.dumps[o.n_dumps++].path = strchr(v, ':') + 1;
        } else
            usage();
    }
    if (!o.model_path || !o.store_dir || !o.name || !o.n_batch || o.n_ctx < 16)
        usage();
    return o;
}

static void quiet(enum ggml_log_level level, const char *text, void *user)
{
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR)
        fputs(text, stderr);
}

/* --- The conversation's tokens --------------------------------------------- */

static void remember(chat *c, const int32_t *t, uint32_t n)
{
    if (c->n + n > c->history_cap) {
        c->history_cap = (c->n + n) * 2;
        if (!(c->history = realloc(c->history, c->history_cap * sizeof(uint32_t))))
            die("%s", "out of memory");
    }
    for (uint32_t i = 0; i < n; i++)
        c->history[c->n + i] = (uint32_t)t[i];
    c->n += n;
}

/* llama.cpp's own state of the chat's sequence, to path. */
static void dump_to(chat *c, const char *path)
{
    size_t size = llama_state_seq_get_size(c->ctx, 0);
    uint8_t *buf = malloc(size);
    FILE *f = fopen(path, "wb");
    if (!buf || !f || llama_state_seq_get_data(c->ctx, buf, size, 0) != size ||
        fwrite(buf, 1, size, f) != size || fclose(f) != 0)
        die("cannot dump the state to %s", path);
    free(buf);
}

static void dump_state(chat *c)
{
    for (size_t i = 0; i < c->o.n_dumps; i++)
        if (c->o.dumps[i].at == c->n)
            dump_to(c, c->o.dumps[i].path);
}

/* Decodes and saves tokens, ending a batch at every --break-at count and
 * stopping at every --dump-state-at count to dump. */
static void decode(chat *c, const int32_t *t, uint32_t n)
{
    while (n > 0) {
        uint32_t m = n < c->o.n_batch ? n : c->o.n_batch; /* a batch, an event */
        for (size_t i = 0; i < c->o.n_breaks; i++)
            if (c->o.breaks[i] > c->n && c->o.breaks[i] - c->n < m)
                m = c->o.breaks[i] - c->n;
        for (size_t i = 0; i < c->o.n_dumps; i++)
            if (c->o.dumps[i].at > c->n && c->o.dumps[i].at - c->n < m)
                m = c->o.dumps[i].at - c->n;
        check(ctxs_llama_decode(c->lc, t, m), "decode");
        c->have_logits = 1;
        remember(c, t, m);
        fprintf(stderr, "saved %u\n", c->n);
        dump_state(c);
        t += m;
        n -= m;
    }
}

/* --- Turns ----------------------------------------------------------------- */

/* The tokens of turn k: the chat template of the system prompt (first turn)
 * and the user's message, up to the assistant's turn. */
static int32_t *turn_tokens(chat *c, const char *message, int first, uint32_t *n_out)
{
    struct llama_chat_message msgs[2];
    size_t n_msgs = 0;
    if (first && c->o.system)
        msgs[n_msgs++] = (struct llama_chat_message){"system", c->o.system};
    msgs[n_msgs++] = (struct llama_chat_message){"user", message};
    /* A GGUF without a template (a base model) gets llama.cpp's built-in
     * one of its family. */
    const char *tmpl = llama_model_chat_template(c->model, NULL);
    char arch[32] = "";
    llama_model_meta_val_str(c->model, "general.architecture", arch, sizeof arch);
    if (!tmpl)
        tmpl = !strncmp(arch, "gemma", 5) ? "gemma" : "chatml";
    int32_t len = llama_chat_apply_template(tmpl, msgs, n_msgs, true, NULL, 0);
    if (len < 0)
        die("%s", "the model's chat template is not one llama.cpp knows");
    char *text = malloc((size_t)len + 1);
    llama_chat_apply_template(tmpl, msgs, n_msgs, true, text, len + 1);
    int32_t cap = len + 16;
    int32_t *toks = malloc((size_t)cap * sizeof(int32_t));
    int32_t n = llama_tokenize(c->vocab, text, len, toks, cap, first, true);
    if (n < 0)
        die("%s", "cannot tokenize a message");
    free(text);
    *n_out = (uint32_t)n;
    return toks;
}

static void print_token(chat *c, int32_t t)
{
    char piece[256];
    int32_t len = llama_token_to_piece(c->vocab, t, piece, sizeof piece, 0, false);
    if (len > 0)
        fwrite(piece, 1, (size_t)len, stdout);
    fflush(stdout);
}

/* Generates the reply after position *at, of which `have` tokens are
 * already in the conversation (a reply cut short), to an end-of-turn token
 * or max_tokens. */
static void reply(chat *c, uint32_t have)
{
    for (uint32_t i = 0; i < have; i++)
        print_token(c, (int32_t)c->history[c->n - have + i]);
    int32_t last = (int32_t)c->history[c->n - 1];
    if (have && (llama_vocab_is_eog(c->vocab, last) || have >= c->o.max_tokens))
        goto done;
    if (!c->have_logits) {
        /* Resumed: a session holds K/V, not logits, so the last token is
         * decoded again, alone (as it was if it was generated). */
        check(ctxs_llama_rollback(c->lc, c->n - 1), "rollback");
        c->n--;
        fprintf(stderr, "batch break %u\n", c->n);
        decode(c, &last, 1);
    }
    for (uint32_t i = have; i < c->o.max_tokens; i++) {
        int32_t t = llama_sampler_sample(c->sampler, c->ctx, -1);
        decode(c, &t, 1);
        print_token(c, t);
        if (llama_vocab_is_eog(c->vocab, t))
            break;
    }
done:
    fputc('\n', stdout);
    fflush(stdout);
    fprintf(stderr, "reply done %u\n", c->n);
}

/* One user message: its tokens checked against what the session holds
 * (*pos: where the session's tokens are matched so far), the rest decoded,
 * then the reply. */
static void turn(chat *c, const char *message, int first, uint32_t held, uint32_t *pos)
{
    uint32_t n;
    int32_t *toks = turn_tokens(c, message, first, &n);
    uint32_t done = 0;
    while (done < n && *pos < held) {
        if (c->history[*pos] != (uint32_t)toks[done])
            die("the session '%s' holds another conversation than these messages", c->o.name);
        done++, (*pos)++;
    }
    if (done < n) {
        if (done > 0) /* resumed within the message's prefill */
            fprintf(stderr, "batch break %u\n", c->n);
        decode(c, toks + done, n - done);
        *pos = c->n;
    }
    free(toks);
    /* The reply: the tokens the session holds after the message, up to an
     * end of turn. */
    uint32_t have = 0;
    while (*pos < held && have < c->o.max_tokens) {
        uint32_t t = c->history[(*pos)++];
        have++;
        if (llama_vocab_is_eog(c->vocab, (int32_t)t))
            break;
    }
    if (*pos < held && have == 0)
        die("%s", "the session's conversation does not follow the messages");
    if (*pos < held) { /* a whole reply the session holds: show it */
        for (uint32_t i = 0; i < have; i++)
            print_token(c, (int32_t)c->history[*pos - have + i]);
        fputc('\n', stdout);
        return;
    }
    /* The session ends within this reply (or right before it): write on,
     * with the reply's tokens so far at the end of the history. */
    reply(c, have);
    *pos = c->n;
}

static void start(chat *c, const char *first_message)
{
    uint32_t n_prompt;
    int32_t *prompt = turn_tokens(c, first_message, 1, &n_prompt);
    ctxs_model model;
    check(ctxs_llama_model_init(&model, c->st, c->o.model_path, c->model, &c->cparams), "model");
    check(ctxs_model_register(c->st, &model, "llama-chat"), "registering the model");
    ctxs_llama_start_info info;
    ctxs_llama_options lo = CTXS_LLAMA_OPTIONS_INIT;
    lo.open_flags = c->o.verify ? CTXS_OPEN_VERIFY : 0;
    ctxs_open_options open_options = CTXS_OPEN_OPTIONS_INIT;
    open_options.background = (uint32_t)c->o.background;
    lo.open = &open_options;
    check(ctxs_llama_start(&c->lc, c->st, c->o.name, c->ctx, &model, prompt, n_prompt, &lo,
                           &info),
          c->o.name);
    free(prompt);
    c->n = 0;
    if (info.n_tokens) {
        uint32_t n = (uint32_t)info.n_tokens;
        c->history = malloc(n * sizeof(uint32_t));
        c->history_cap = n;
        check(ctxs_session_get_tokens(c->history, ctxs_llama_get_session(c->lc), 0, n), "tokens");
        c->n = n;
    }
    if (info.how == CTXS_LLAMA_RESUMED) {
        fprintf(stderr, "resumed %u\n", c->n);
        if (c->o.dump_resumed)
            dump_to(c, c->o.dump_resumed);
    }
    if (c->o.rollback_to >= 0 && (uint64_t)c->o.rollback_to < c->n) {
        check(ctxs_llama_rollback(c->lc, (uint64_t)c->o.rollback_to), "rollback");
        c->n = (uint32_t)c->o.rollback_to;
        c->have_logits = 0;
        fprintf(stderr, "rolled back %u\n", c->n);
    }
    else if (info.how == CTXS_LLAMA_FORKED)
        fprintf(stderr, "forked %u from %s\n", c->n, info.from);
    dump_state(c);
}

int main(int argc, char **argv)
{
    chat c = {.o = parse(argc, argv)};
    if (!c.o.verbose)
        llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    if (!(c.model = llama_model_load_from_file(c.o.model_path, mp)))
        die("cannot load %s", c.o.model_path);
    c.vocab = llama_model_get_vocab(c.model);
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = c.o.n_ctx;
    cp.n_batch = cp.n_ubatch = c.o.n_batch;
    cp.n_threads = cp.n_threads_batch = (int32_t)c.o.n_threads;
    cp.n_seq_max = 2;      /* the chat's sequence and the adapter's spare */
    cp.kv_unified = true;
    /* Sliding-window layers keep every position (the default), or their
     * window only: the session keeps what the context keeps. */
    cp.swa_full = c.o.swa_full;
    cp.type_k = cp.type_v = GGML_TYPE_F16;
    cp.flash_attn_type = (enum llama_flash_attn_type)c.o.flash_attn;
    if (!(c.ctx = llama_init_from_model(c.model, cp)))
        die("%s", "cannot create the context");
    c.cparams = cp;
    c.sampler = llama_sampler_chain_init(llama_sampler_chain_default_params());
    llama_sampler_chain_add(c.sampler, llama_sampler_init_greedy());
    int rc = ctxs_store_open(&c.st, c.o.store_dir, CTXS_STORE_CREATE, NULL);
    check(rc, c.o.store_dir);

    char line[8192];
    uint32_t pos = 0, held = 0;
    for (int first = 1; fgets(line, sizeof line, stdin); first = 0) {
        line[strcspn(line, "\n")] = '\0';
        if (first) {
            start(&c, line);
            held = c.n;
        }
        turn(&c, line, first, held, &pos);
    }
    if (c.o.tokens_out) {
        FILE *f = fopen(c.o.tokens_out, "w");
        for (uint32_t i = 0; f && i < c.n; i++)
            fprintf(f, "%u\n", c.history[i]);
        if (!f || fclose(f) != 0)
            die("cannot write %s", c.o.tokens_out);
    }
    ctxs_llama_close(c.lc);
    ctxs_store_close(c.st);
    llama_sampler_free(c.sampler);
    llama_free(c.ctx);
    llama_model_free(c.model);
    free(c.history);
    return 0;
}
