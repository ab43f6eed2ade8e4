/*
 * tinychat — generate with a tiny random transformer whose KV cache is a
 * ctxstore session; stop it any way you like and run it again to continue.
 *
 *   tinychat --session FILE [--prompt TEXT] [--generate N] [--reopen-every K]
 *            [--seed S] [--config default|qwen3-4b-kv] [--capacity N]
 *            [--window W] [--swa-every N] [--dtype f16|bf16|q8]
 *            [--sync none|async|full] [--text]
 *
 * A new FILE is created (a ring of --capacity slots, 128 by default, K/V
 * kept as --dtype, f16 by default) and needs --prompt. --swa-every N gives
 * the model sliding-window layers: of each N layers (2..8) the last is
 * global and the others attend to the last W tokens only (--window W,
 * which then sets that window, not the session's), each keeping a ring of
 * W + 32 slots in the file. An existing FILE keeps the schedule it was
 * created with unless --swa-every says otherwise. An existing FILE is
 * opened and continued, in the dtype it was created with (--dtype, if
 * given, must name it): with --prompt the prompt is appended, without it
 * the prediction after its last token is recomputed (tinychat_resume())
 * and generation goes on from there, the same tokens an uninterrupted run
 * would have produced.
 *
 * Each generated token is committed, then printed to stdout: its id, one
 * per line (--text: the byte itself). So after a kill the output stops at
 * the last committed token and a new run prints the next one.
 * --reopen-every K closes and reopens the session every K tokens and checks
 * that the resumed prediction is the one it had.
 *
 * Exit status: 0, 1 on an error (with ctxstore's message), 2 on bad usage.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctxstore.h"
#include "tinychat.h"

static const char *const usage_text =
    "usage: tinychat --session FILE [--prompt TEXT] [--generate N]\n"
    "                [--reopen-every K] [--seed S] [--config default|qwen3-4b-kv]\n"
    "                [--capacity N] [--window W] [--swa-every N]\n"
    "                [--dtype f16|bf16|q8] [--sync none|async|full] [--text]\n";

#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
static _Noreturn void usage(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "tinychat: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fputs(usage_text, stderr);
    exit(2);
}

static _Noreturn void fail_hint(int rc, const char *what, const char *path, const char *hint)
{
    fflush(stdout);
    fprintf(stderr, "tinychat: %s%s%s: %s (%s)%s%s\n", what, path ? " " : "", path ? path : "",
            ctxs_strerror(rc), ctxs_err_name(rc), hint ? "; " : "", hint ? hint : "");
    exit(1);
}

static _Noreturn void fail(int rc, const char *what, const char *path)
{
    fail_hint(rc, what, path, NULL);
}

static uint64_t parse_u64(const char *s, const char *opt, uint64_t max)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end || s[0] == '-' || v > max)
        usage("bad number for %s", opt);
    return v;
}

typedef struct options {
    const char *path;
    const char *prompt;
    uint64_t generate;
    uint64_t reopen_every;
    uint64_t seed;
    const char *config;
    uint32_t capacity;
    uint32_t window;
    uint32_t sync;
    uint32_t dtype; /* 0: the file's, or f16 for a new one */
    uint32_t swa_every; /* 0: the file's, or none for a new one */
    int text;
} options;

static void parse(options *o, int argc, char **argv)
{
    *o = (options){.generate = 200, .seed = 1, .config = "default", .sync = CTXS_SYNC_ASYNC};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage_text, stdout);
            exit(0);
        }
        if (!strcmp(a, "--text")) {
            o->text = 1;
            continue;
        }
        static const char *const with_value[] = {
            "--session", "--prompt", "--generate", "--reopen-every", "--seed",
            "--config", "--capacity", "--window", "--sync", "--dtype", "--swa-every",
        };
        int known = 0;
        for (size_t k = 0; k < sizeof(with_value) / sizeof(with_value[0]); k++)
            known |= !strcmp(a, with_value[k]);
        if (!known)
            usage("unknown option %s", a);
        if (i + 1 >= argc)
            usage("%s needs a value", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--session"))
            o->path = v;
        else if (!strcmp(a, "--prompt"))
            o->prompt = v;
        else if (!strcmp(a, "--generate"))
            o->generate = parse_u64(v, a, UINT64_MAX);
        else if (!strcmp(a, "--reopen-every"))
            o->reopen_every = parse_u64(v, a, UINT64_MAX);
        else if (!strcmp(a, "--seed"))
            o->seed = parse_u64(v, a, UINT64_MAX);
        else if (!strcmp(a, "--config"))
            o->config = v;
        else if (!strcmp(a, "--capacity"))
            o->capacity = (uint32_t)parse_u64(v, a, 1u << 24);
        else if (!strcmp(a, "--window"))
            o->window = (uint32_t)parse_u64(v, a, UINT32_MAX);
        else if (!strcmp(a, "--swa-every"))
            o->swa_every = (uint32_t)parse_u64(v, a, CTXS_SCHEDULE_MAX);
        else if (!strcmp(a, "--dtype")) {
            if (!strcmp(v, "f16"))
                o->dtype = CTXS_DTYPE_F16;
            else if (!strcmp(v, "bf16"))
                o->dtype = CTXS_DTYPE_BF16;
            else if (!strcmp(v, "q8"))
                o->dtype = CTXS_DTYPE_Q8;
            else
                usage("--dtype takes f16, bf16 or q8, not %s", v);
        } else if (!strcmp(a, "--sync")) {
            if (!strcmp(v, "none"))
                o->sync = CTXS_SYNC_NONE;
            else if (!strcmp(v, "async"))
                o->sync = CTXS_SYNC_ASYNC;
            else if (!strcmp(v, "full"))
                o->sync = CTXS_SYNC_FULL;
            else
                usage("--sync takes none, async or full, not %s", v);
        }
    }
    if (!o->path)
        usage("--session is required");
    if (strcmp(o->config, "default") && strcmp(o->config, "qwen3-4b-kv"))
        usage("--config takes default or qwen3-4b-kv, not %s", o->config);
    if (o->prompt && !o->prompt[0])
        usage("--prompt is empty");
    if (o->swa_every == 1)
        usage("--swa-every takes 2 to %d: with 1 every layer would be windowed", CTXS_SCHEDULE_MAX);
    if (o->swa_every && !o->window)
        usage("--swa-every needs --window W, the sliding window");
}

/* --window: the session's window, unless it is the sliding window of a
 * schedule. */
static uint32_t session_window(const options *o)
{
    return o->swa_every ? 0 : o->window;
}

/* Opens path read-write with the window the session was created for
 * (--window, else the default for its capacity and sinks). */
static ctxs_session *open_session(const options *o, const ctxs_model *cm)
{
    ctxs_create_options so;
    tinychat_session_options(&so, o->capacity, session_window(o));
    so.open.durability = o->sync;
    ctxs_session *s;
    int rc = ctxs_session_open(&s, o->path, cm, 0, &so.open);
    if (rc == CTXS_EMODEL)
        fail_hint(rc, "open", o->path,
                  o->dtype ? "was it written with another --config, --seed, --dtype or "
                             "--swa-every/--window?"
                           : "was it written with another --config, --seed or "
                             "--swa-every/--window?");
    if (rc < 0)
        fail(rc, "open", o->path);
    ctxs_session_info info;
    if ((rc = ctxs_session_get_info(&info, s)) < 0)
        fail(rc, "info", o->path);
    uint32_t w = session_window(o) ? session_window(o)
                                   : tinychat_window(info.capacity, info.n_sink);
    if ((rc = ctxs_session_set_window(s, w)) < 0)
        fail(rc, "set window", o->path);
    /* After a reboot the file is cold: start reading the window now, so
     * that the first forward pass does not fault it in page by page. */
    if ((rc = ctxs_session_prefetch(s)) < 0)
        fail(rc, "prefetch", o->path);
    return s;
}

/* The dtype an existing session file keeps its K/V in, so that a run
 * without --dtype continues it; a file that does not describe itself is
 * left for the open to refuse, with its own error. */
static uint32_t file_dtype(const char *path)
{
    ctxs_file_report rep;
    int rc = ctxs_file_inspect(&rep, path);
    if (rc < 0)
        fail(rc, "inspect", path);
    return rep.header_status == 0 ? rep.model.geometry.dtype : CTXS_DTYPE_F16;
}

/* The schedule an existing session file was created with, where it is one
 * tinychat makes (else none: the open refuses the file as another model's). */
static void file_schedule(tinychat_config *cfg, const char *path)
{
    ctxs_file_report rep;
    if (ctxs_file_inspect(&rep, path) < 0 || rep.header_status != 0 || !rep.model.geometry.period)
        return;
    const ctxs_geometry *g = &rep.model.geometry;
    for (uint32_t j = 0; j < g->period; j++)
        if (g->window[j] != (j + 1 < g->period ? g->window[0] : 0))
            return;
    cfg->swa_every = g->period;
    cfg->swa_window = g->window[0];
}

static void print_token(const options *o, uint32_t id)
{
    if (o->text) {
        putchar((int)(id & 0xff));
        fflush(stdout);
    } else {
        printf("%" PRIu32 "\n", id);
    }
}

int main(int argc, char **argv)
{
    options o;
    parse(&o, argc, argv);
    setvbuf(stdout, NULL, _IOLBF, 0); /* a line per committed token */

    tinychat_config cfg;
    if (!strcmp(o.config, "qwen3-4b-kv"))
        tinychat_config_qwen3_4b_kv(&cfg);
    else
        tinychat_config_default(&cfg);
    cfg.seed = o.seed;
    const int exists = access(o.path, F_OK) == 0;
    if (!exists && errno != ENOENT)
        fail(-errno, "access", o.path);
    cfg.dtype = o.dtype ? o.dtype : exists ? file_dtype(o.path) : CTXS_DTYPE_F16;
    if (o.swa_every) {
        cfg.swa_every = o.swa_every;
        cfg.swa_window = o.window;
    } else if (exists) {
        file_schedule(&cfg, o.path);
        o.swa_every = cfg.swa_every; /* --window is not the session's then */
        if (o.swa_every && !o.window)
            o.window = cfg.swa_window;
    }
    tinychat_model *m;
    int rc = tinychat_model_create(&m, &cfg);
    if (rc < 0)
        fail(rc, "model", NULL);
    ctxs_model cm;
    tinychat_model_ctxs(&cm, m);

    ctxs_session *s = NULL;
    uint32_t next;
    if (!exists) {
        if (!o.prompt)
            usage("%s does not exist: a new session needs --prompt", o.path);
        ctxs_create_options so;
        tinychat_session_options(&so, o.capacity, session_window(&o));
        so.open.durability = o.sync;
        if (so.open.window >= so.capacity - so.n_sink)
            fprintf(stderr, "tinychat: warning: a window of %u is not below the ring (%u "
                            "slots): a resume after a kill may differ\n",
                    so.open.window, so.capacity - so.n_sink);
        if ((rc = ctxs_session_create(&s, o.path, &cm, &so)) < 0)
            fail(rc, "create", o.path);
    } else {
        s = open_session(&o, &cm);
    }

    if (o.prompt) {
        size_t n = strlen(o.prompt);
        if (n > UINT32_MAX)
            usage("--prompt is too long");
        uint32_t *ids = malloc(n * sizeof(*ids));
        if (!ids)
            fail(CTXS_ENOMEM, "prompt", NULL);
        for (size_t i = 0; i < n; i++)
            ids[i] = (uint8_t)o.prompt[i] % cfg.vocab;
        rc = tinychat_prefill(m, s, ids, (uint32_t)n, &next);
        free(ids);
        if (rc < 0)
            fail(rc, "prefill", o.path);
    } else if ((rc = tinychat_resume(m, s, &next)) < 0) {
        fail_hint(rc, "resume", o.path,
                  rc == CTXS_ECORRUPT ? "its last token does not recompute to the K/V it holds: "
                                        "written with another --window, or not by tinychat?"
                                      : NULL);
    }

    for (uint64_t i = 0; i < o.generate; i++) {
        uint32_t id = next;
        if ((rc = tinychat_step(m, s, id, &next)) < 0)
            fail(rc, "step", o.path);
        print_token(&o, id);
        if (o.reopen_every && (i + 1) % o.reopen_every == 0 && i + 1 < o.generate) {
            ctxs_session_close(s);
            s = open_session(&o, &cm);
            uint32_t again;
            if ((rc = tinychat_resume(m, s, &again)) < 0)
                fail(rc, "resume", o.path);
            if (again != next) {
                fprintf(stderr, "tinychat: resume predicted %" PRIu32 ", the run had %" PRIu32
                                "\n", again, next);
                return 1;
            }
        }
    }

    ctxs_session_info info;
    if ((rc = ctxs_session_get_info(&info, s)) < 0)
        fail(rc, "info", o.path);
    fprintf(stderr, "tinychat: %s: %" PRIu64 " tokens (%u held, window %u%s), next %" PRIu32
                    "\n", o.path, info.n_tokens, info.n_held, info.window,
            info.flags & CTXS_INFO_WRAPPED ? ", ring wrapped" : "", next);
    ctxs_session_close(s);
    tinychat_model_destroy(m);
    return 0;
}
