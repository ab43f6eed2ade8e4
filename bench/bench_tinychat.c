/*
 * bench_tinychat — what resuming a conversation costs with its KV cache in
 * ctxstore, against recomputing it from the token ids, with a real (tiny,
 * random) transformer: examples/tinychat.
 *
 * For each context length (256, 1024, 2000 tokens) one session is prefilled
 * (untimed) and closed; then, in the same run:
 *
 *   resume     ctxs_session_open + tinychat_resume: map the file, check the
 *              header, recompute the last token's forward pass (attention
 *              reads the window in the mapping) and predict the next token.
 *   recompute  what an app without a saved cache does: ctxs_session_create
 *              of a fresh file + tinychat_prefill of every token id, to the
 *              same prediction.
 *
 * Both end with the next token and its logits in hand, and the benchmark
 * checks that they agree bit for bit. Close and unlink are outside the
 * timings. Median, min and max of several repetitions, after one untimed
 * warm-up each; page cache warm (the session was just written).
 *
 * The model, by default: 8 layers of Qwen3-4B's KV shape (16 query heads,
 * 8 KV heads, head_dim 128: 32,768 bytes of KV per token per 8 layers, the
 * real model's per layer) around a small residual stream (d_model 64, ffn
 * 128), so attention, which is what grows with the context, dominates a
 * prefill as it does in a real model at these lengths, while the run stays
 * near a minute on one core. --config qwen3-4b-kv runs all 36 layers (the
 * real model's 147,456 bytes per token; several minutes, try --quick);
 * --config default runs tinychat's small default model.
 *
 * Then the attention kernel alone, on the same model's KV shape, 2048
 * tokens in a fresh session (random fp16 K/V, window 2048):
 *
 *   prefill    one ctxs_attention call per layer for all 2048 queries (the
 *              causal prefill of the whole context).
 *   decode     one ctxs_attention call per layer for the query at 2047,
 *              which reads all 2048 keys: a decode step.
 *
 * Each is given as GB/s of K/V read: the bytes that must be read at least
 * once, 2048 tokens x the K/V bytes per token of all the layers, over the
 * time. A decode step reads each of those bytes once; a prefill reads them
 * many times (query p reads keys 0..p), so its GB/s says how close the
 * kernel comes to reading the KV cache once: at the decode step's figure,
 * a prefill of 2048 queries would cost what one decode step does.
 *
 * With --json, stdout carries one object per measurement and nothing else
 * (the header goes to stderr), as the other benchmarks write them for
 * ctxstore bench: op "next_token", method "resume" or "recompute", tokens,
 * median_us, min_us, max_us, n, config, isa, same; the recompute object
 * also has ratio, recompute median / resume median, as the table prints it.
 * The attention objects: op "attention", method "prefill" or "decode",
 * tokens 2048, the timings, n, config, isa, kv_bytes (the distinct bytes)
 * and gb_s.
 *
 * Usage: bench_tinychat [--quick] [--tokens N] [--config mid|qwen3-4b-kv|default]
 *                       [--dir DIR] [--json] [--attention]
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "ctxstore.h"
#include "tinychat.h"

const char *const bench_program = "bench_tinychat";

enum {
    MAX_TOKENS = 16384,
    WINDOW = 2048, /* ctxstore's default window; every context fits in it */
    ATTN_TOKENS = 2048, /* the attention-alone measurement's context */
};

typedef struct options {
    int json;
    int quick;
    int attention_only;
    uint32_t only_tokens;
    const char *config;
    const char *dir;
} options;

static void usage(FILE *f)
{
    fputs("usage: bench_tinychat [--quick] [--tokens N] [--config mid|qwen3-4b-kv|default]\n"
          "                      [--dir DIR] [--json] [--attention]\n"
          "  --quick     contexts 256 and 1024 only, fewer repetitions; the\n"
          "              attention kernel alone over 2 layers\n"
          "  --tokens N  one context of N tokens (2..16384)\n"
          "  --config    the model: mid (default: 8 layers of Qwen3-4B's KV shape),\n"
          "              qwen3-4b-kv (all 36 layers; minutes), or default\n"
          "              (tinychat's small default)\n"
          "  --dir DIR   put the files in a new directory under DIR (default\n"
          "              $TMPDIR, else /var/tmp)\n"
          "  --json      one JSON object per measurement on stdout\n"
          "  --attention only the attention kernel alone: prefill vs decode\n",
          f);
}

static options parse_options(int argc, char **argv)
{
    options o = {.config = "mid"};
    for (int i = 1; i < argc; i++) {
        if (string_option(argc, argv, &i, "--config", &o.config)) {
            if (strcmp(o.config, "mid") && strcmp(o.config, "qwen3-4b-kv") &&
                strcmp(o.config, "default"))
                die("--config wants mid, qwen3-4b-kv or default");
        } else if (!flag_option(argv[i], "--json", &o.json) &&
                   !flag_option(argv[i], "--quick", &o.quick) &&
                   !flag_option(argv[i], "--attention", &o.attention_only) &&
                   !string_option(argc, argv, &i, "--dir", &o.dir) &&
                   !count_option(argc, argv, &i, "--tokens", 2, MAX_TOKENS, &o.only_tokens)) {
            unknown_option(argv[i], usage);
        }
    }
    return o;
}

/* --- Files ------------------------------------------------------------------ */

/* Scratch files, removed on a signal. */
static char g_saved[PATH_MAX], g_fresh[PATH_MAX];

/* --- Measurements ------------------------------------------------------------- */

typedef struct bench {
    tinychat_model *m;
    ctxs_model cm;
    uint32_t vocab;
    float *logits_resume, *logits_prefill;
} bench;

static ctxs_create_options session_options(uint32_t tokens)
{
    /* Room for the context and no wrap, and a window that holds it all:
     * every query reads every key before it. */
    ctxs_create_options so;
    tinychat_session_options(&so, tokens + 64, WINDOW);
    return so;
}

/* open + resume of the saved session; the prediction in *next. */
static double time_resume(bench *b, uint32_t tokens, uint32_t *next)
{
    ctxs_create_options so = session_options(tokens);
    ctxs_session *s;
    double t0 = now_us();
    check_ctxs(ctxs_session_open(&s, g_saved, &b->cm, 0, &so.open), "open");
    check_ctxs(tinychat_resume(b->m, s, next), "tinychat_resume");
    double t = now_us() - t0;
    memcpy(b->logits_resume, tinychat_logits(b->m), b->vocab * sizeof(float));
    ctxs_session_close(s);
    return t;
}

/* create + prefill of all ids into path; the prediction in *next. Leaves
 * the file when keep, else removes it. */
static double time_prefill(bench *b, const uint32_t *ids, uint32_t tokens, const char *path,
                           int keep, uint32_t *next)
{
    ctxs_create_options so = session_options(tokens);
    ctxs_session *s;
    double t0 = now_us();
    check_ctxs(ctxs_session_create(&s, path, &b->cm, &so), "create");
    check_ctxs(tinychat_prefill(b->m, s, ids, tokens, next), "tinychat_prefill");
    double t = now_us() - t0;
    memcpy(b->logits_prefill, tinychat_logits(b->m), b->vocab * sizeof(float));
    ctxs_session_close(s);
    if (!keep)
        check_sys(unlink(path), "unlink");
    return t;
}

/* One context: op "next_token", methods "resume" and "recompute". */
typedef struct row {
    bench_result resume, recompute;
    int same;
} row;

static row run_context(bench *b, uint32_t tokens, int resume_iters, int prefill_iters)
{
    uint32_t *ids = xmalloc(tokens * sizeof(*ids));
    uint64_t st = 0x7c0ffee ^ tokens;
    for (uint32_t i = 0; i < tokens; i++)
        ids[i] = (uint32_t)(xorshift64(&st) % b->vocab);

    /* The saved conversation (untimed; also the prefill's warm-up). */
    uint32_t want, got;
    (void)time_prefill(b, ids, tokens, g_saved, 1, &want);
    settle_disk();

    samples us = {0};
    row r = {.same = 1};
    (void)time_resume(b, tokens, &got); /* warm-up */
    for (int i = 0; i < resume_iters; i++) {
        samples_add(&us, time_resume(b, tokens, &got));
        r.same &= got == want;
    }
    r.resume = summarize("next_token", "resume", tokens, &us);
    samples_free(&us);
    for (int i = 0; i < prefill_iters; i++) {
        samples_add(&us, time_prefill(b, ids, tokens, g_fresh, 0, &got));
        r.same &= got == want;
        r.same &= !memcmp(b->logits_prefill, b->logits_resume, b->vocab * sizeof(float));
    }
    r.recompute = summarize("next_token", "recompute", tokens, &us);
    samples_free(&us);
    check_sys(unlink(g_saved), "unlink");
    free(ids);
    return r;
}

/* --- The attention kernel alone ----------------------------------------------- */

typedef struct attn_row {
    bench_result prefill, decode;
    size_t kv_bytes; /* distinct K/V bytes: ATTN_TOKENS x bytes per token */
} attn_row;

/* Every layer's attention for q: one ctxs_attention call per layer. */
static double time_layers(const ctxs_layout *lay, const ctxs_attn_plan *plan,
                          const ctxs_attn_query *q, float *out, uint32_t n_layers)
{
    double t0 = now_us();
    for (uint32_t l = 0; l < n_layers; l++)
        check_ctxs(ctxs_attention(out, lay, plan, l, q), "ctxs_attention");
    return now_us() - t0;
}

/* Prefill and decode attention over ATTN_TOKENS tokens of random K/V in a
 * fresh session (reserved, never committed: the plan of every token
 * pending serves all the queries), over the first n_layers layers. */
static attn_row run_attention(const bench *b, uint32_t n_layers, int prefill_iters,
                              int decode_iters)
{
    const tinychat_config *cfg = tinychat_model_config(b->m);
    ctxs_create_options so = session_options(ATTN_TOKENS);
    ctxs_session *s;
    check_ctxs(ctxs_session_create(&s, g_fresh, &b->cm, &so), "create");
    ctxs_reservation r;
    check_ctxs(ctxs_session_reserve(&r, s, ATTN_TOKENS), "reserve");
    ctxs_layout lay;
    get_layout(&lay, s, (size_t)cfg->head_dim * 2);
    uint64_t seed = 0x5eed;
    for (uint32_t run = 0; run < cfg->n_layers * 2 * cfg->n_kv_heads; run++)
        fill_fp16_signed(kv_run(&lay, cfg->n_kv_heads, run), lay.capacity * lay.slot_bytes, &seed);
    ctxs_attn_plan plan;
    check_ctxs(ctxs_session_get_attn_plan(&plan, s, ATTN_TOKENS), "plan");

    const size_t per_q = (size_t)cfg->n_heads * cfg->head_dim;
    float *q = xmalloc(ATTN_TOKENS * per_q * sizeof(float));
    float *out = xmalloc(ATTN_TOKENS * per_q * sizeof(float));
    for (size_t i = 0; i < ATTN_TOKENS * per_q; i++)
        q[i] = (float)(xorshift64(&seed) % 2001) / 1000.0f - 1.0f;
    const ctxs_attn_query pre = {.q = q, .pos = 0, .n = ATTN_TOKENS, .n_heads = cfg->n_heads};
    const ctxs_attn_query dec = {
        .q = q + (ATTN_TOKENS - 1) * per_q, .pos = ATTN_TOKENS - 1, .n = 1, .n_heads = cfg->n_heads};

    attn_row a = {.kv_bytes = (size_t)ATTN_TOKENS * n_layers * 2 * cfg->n_kv_heads *
                              cfg->head_dim * 2};
    samples us = {0};
    (void)time_layers(&lay, &plan, &dec, out, n_layers); /* warm-up */
    for (int i = 0; i < decode_iters; i++)
        samples_add(&us, time_layers(&lay, &plan, &dec, out, n_layers));
    a.decode = summarize("attention", "decode", ATTN_TOKENS, &us);
    samples_free(&us);
    for (int i = 0; i < prefill_iters; i++)
        samples_add(&us, time_layers(&lay, &plan, &pre, out, n_layers));
    a.prefill = summarize("attention", "prefill", ATTN_TOKENS, &us);
    samples_free(&us);
    free(q);
    free(out);
    ctxs_session_close(s);
    check_sys(unlink(g_fresh), "unlink");
    return a;
}

static double gb_s(size_t bytes, const bench_result *t)
{
    return t->median_us > 0 ? bytes / (t->median_us * 1e3) : 0.0;
}

static void print_attention(const attn_row *a, const options *o)
{
    const bench_result *t[] = {&a->prefill, &a->decode};
    for (int m = 0; m < 2; m++) {
        if (o->json) {
            json_result_begin(t[m]);
            printf(",\"n\":%zu,\"config\":\"%s\",\"isa\":\"%s\",\"kv_bytes\":%zu,"
                   "\"gb_s\":%.4f}\n",
                   t[m]->n, o->config, ctxs_attention_get_isa(), a->kv_bytes, gb_s(a->kv_bytes, t[m]));
        } else {
            printf("attention %-7s of %u tokens: %10.3f ms [%.3f, %.3f] n=%zu  %8.4f GB/s of "
                   "K/V (%zu distinct bytes)\n",
                   t[m]->method, t[m]->tokens, t[m]->median_us / 1e3, t[m]->min_us / 1e3,
                   t[m]->max_us / 1e3, t[m]->n, gb_s(a->kv_bytes, t[m]), a->kv_bytes);
        }
    }
    fflush(stdout);
}

/* --- Report ------------------------------------------------------------------- */

static void print_header(FILE *f, const options *o, const tinychat_config *cfg)
{
    const size_t token_bytes = (size_t)cfg->n_layers * 2 * cfg->n_kv_heads * cfg->head_dim * 2;
    fprintf(f,
            "ctxstore bench_tinychat: tinychat model (%s): %u layers, %u query heads, %u KV "
            "heads x %u dim (fp16, %zu bytes/token), d_model %u, ffn %u, vocab %u; attention "
            "kernel %s\n"
            "files in %s; window %d (every context fits), no ring wrap; page cache warm; "
            "times in ms, median [min, max] of n repetitions after one untimed warm-up\n"
            "resume: ctxs_session_open + tinychat_resume (one token's forward pass). "
            "recompute: ctxs_session_create + tinychat_prefill of every token id (chunks of up "
            "to 512 tokens, one ctxs_attention call per layer per chunk). same: both give the "
            "same next token and bit-identical logits.\n\n",
            o->config, cfg->n_layers, cfg->n_heads, cfg->n_kv_heads, cfg->head_dim, token_bytes,
            cfg->d_model, cfg->ffn, cfg->vocab, ctxs_attention_get_isa(), g_dir, WINDOW);
}

static void print_table_row(const row *r)
{
    char a[64], p[64];
    snprintf(a, sizeof a, "%.3f [%.3f, %.3f] n=%zu", r->resume.median_us / 1e3,
             r->resume.min_us / 1e3, r->resume.max_us / 1e3, r->resume.n);
    snprintf(p, sizeof p, "%.1f [%.1f, %.1f] n=%zu", r->recompute.median_us / 1e3,
             r->recompute.min_us / 1e3, r->recompute.max_us / 1e3, r->recompute.n);
    printf("%7u  %-31s %-31s %6.0fx %5s\n", r->resume.tokens, a, p,
           r->recompute.median_us / r->resume.median_us, r->same ? "yes" : "NO");
}

/* The table's row as two objects, one per method. ratio goes with
 * recompute, the method it measures against resume; same is the whole
 * row's, so that a reader of either object sees it. */
static void print_json_row(const row *r, const char *config)
{
    const bench_result *timings[] = {&r->resume, &r->recompute};
    for (int m = 0; m < 2; m++) {
        const bench_result *t = timings[m];
        json_result_begin(t);
        printf(",\"n\":%zu,\"config\":\"%s\",\"isa\":\"%s\",\"same\":%s", t->n, config,
               ctxs_attention_get_isa(), r->same ? "true" : "false");
        if (t == &r->recompute && r->resume.median_us > 0)
            printf(",\"ratio\":%.2f", r->recompute.median_us / r->resume.median_us);
        printf("}\n");
    }
}

int main(int argc, char **argv)
{
    options o = parse_options(argc, argv);
    catch_signals(remove_scratch_on_signal);
    make_scratch_dir(o.dir, "ctxstore-bench");
    scratch_file(g_saved, "saved.ctxs");
    scratch_file(g_fresh, "fresh.ctxs");

    tinychat_config cfg;
    if (!strcmp(o.config, "default")) {
        tinychat_config_default(&cfg);
    } else {
        tinychat_config_qwen3_4b_kv(&cfg);
        if (!strcmp(o.config, "mid"))
            cfg.n_layers = 8;
    }
    bench b = {0};
    check_ctxs(tinychat_model_create(&b.m, &cfg), "tinychat_model_create");
    tinychat_model_ctxs(&b.cm, b.m);
    b.vocab = cfg.vocab;
    b.logits_resume = xmalloc(b.vocab * sizeof(float));
    b.logits_prefill = xmalloc(b.vocab * sizeof(float));

    uint32_t contexts[3] = {256, 1024, 2000};
    int n_contexts = pick_contexts(contexts, o.quick ? 2 : 3, o.only_tokens);
    /* With --json, stdout carries only the objects; the text goes to stderr. */
    FILE *text = o.json ? stderr : stdout;
    print_header(text, &o, &cfg);
    if (!o.json && !o.attention_only)
        printf("%7s  %-31s %-31s %7s %5s\n", "tokens", "resume (open+resume)",
               "recompute (prefill)", "ratio", "same");
    fflush(stdout);

    double t0 = now_us();
    int all_same = 1;
    for (int i = 0; i < n_contexts && !o.attention_only; i++) {
        uint32_t n = contexts[i];
        int resume_iters = o.quick ? 5 : 11;
        /* A prefill costs O(n^2) in attention: fewer repetitions of the
         * long ones keep the run near a minute. */
        int prefill_iters = o.quick ? 3 : n <= 1024 ? 5 : 3;
        row r = run_context(&b, n, resume_iters, prefill_iters);
        if (o.json)
            print_json_row(&r, o.config);
        else
            print_table_row(&r);
        fflush(stdout);
        all_same &= r.same;
    }
    if (!o.json && !o.attention_only)
        printf("\n");
    /* --quick: two layers, so that the run stays short under sanitizers. */
    const uint32_t all_layers = tinychat_model_config(b.m)->n_layers;
    attn_row a = run_attention(&b, o.quick && all_layers > 2 ? 2 : all_layers, o.quick ? 1 : 3,
                               o.quick ? 5 : 21);
    print_attention(&a, &o);
    /* The blank line parts the footer from the table; stderr has none. */
    fprintf(text, "%sratio = recompute median / resume median. total run time: %.1f s\n",
            o.json ? "" : "\n", (now_us() - t0) / 1e6);
    free(b.logits_resume);
    free(b.logits_prefill);
    tinychat_model_destroy(b.m);
    cleanup();
    if (!all_same) {
        fprintf(stderr, "%s: resume and recompute disagree\n", bench_program);
        return 1;
    }
    return 0;
}
