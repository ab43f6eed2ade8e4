/*
 * tinychat: a real (tiny) transformer generating into a session. The same
 * 200 tokens must come out whether the run is uninterrupted, closed and
 * reopened every few tokens, or SIGKILLed mid-way (in real child processes)
 * and resumed; a prompt prefilled in chunks must give the bits that stepping
 * it token by token gives; and the streams must be varied enough, and
 * depend on the seed, for those comparisons to mean something.
 *
 * The session is a ring of 128 slots with 4 sinks and a window of 93, so a
 * 44-token prompt and 200 tokens wrap the ring and read through the window.
 * The streams, the kills and the program run for each dtype a session can
 * keep K/V in (fp16, bf16, Q8); tinychat's conversions are checked against
 * what the library's ctxs_session_write_token() stores.
 *
 * Runs with --jobs 1 (the kill test forks). Seeds of the kill points come
 * from CTXS_TEST_SEED when set, else from the clock, and are logged.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ctxstore.h"
#include "support.h"
#include "tinychat.h"

#define N_GEN 200u
#define CAPACITY 128u
#define MODEL_SEED 1u

static const char k_prompt[] = "The quick brown fox jumps over the lazy dog.";
#define N_PROMPT ((uint32_t)(sizeof(k_prompt) - 1))

TestSuite(tinychat, .init = ts_scratch_init, .fini = ts_scratch_fini);

#define say(...) (fprintf(stderr, __VA_ARGS__), fputc('\n', stderr))

static const uint32_t k_dtypes[] = {CTXS_DTYPE_F16, CTXS_DTYPE_BF16, CTXS_DTYPE_Q8};
#define N_DTYPES (sizeof(k_dtypes) / sizeof(k_dtypes[0]))

static const char *dtype_name(uint32_t dtype)
{
    return dtype == CTXS_DTYPE_Q8 ? "q8" : dtype == CTXS_DTYPE_BF16 ? "bf16" : "f16";
}

/* --- Helpers ------------------------------------------------------------------ */

static void prompt_ids(uint32_t *ids)
{
    for (uint32_t i = 0; i < N_PROMPT; i++)
        ids[i] = (uint8_t)k_prompt[i];
}

static tinychat_model *model_new_dtype(uint64_t seed, uint32_t dtype)
{
    tinychat_config cfg;
    tinychat_config_default(&cfg);
    cfg.seed = seed;
    cfg.dtype = dtype;
    tinychat_model *m = NULL;
    int rc = tinychat_model_create(&m, &cfg);
    cr_assert_eq(rc, 0, "model_create: %s", ctxs_err_name(rc));
    return m;
}

static tinychat_model *model_new(uint64_t seed)
{
    return model_new_dtype(seed, CTXS_DTYPE_F16);
}

static ctxs_session *session_create(tinychat_model *m, const char *path, uint32_t capacity)
{
    ctxs_model cm;
    ctxs_create_options o;
    tinychat_model_ctxs(&cm, m);
    tinychat_session_options(&o, capacity, 0);
    ctxs_session *s = NULL;
    int rc = ctxs_session_create(&s, path, &cm, &o);
    cr_assert_eq(rc, 0, "create %s: %s", path, ctxs_err_name(rc));
    return s;
}

/* Opens read-write with tinychat's window; returns the code. */
static int session_open(ctxs_session **s, tinychat_model *m, const char *path, unsigned flags,
                        uint32_t window)
{
    ctxs_model cm;
    ctxs_create_options o;
    tinychat_model_ctxs(&cm, m);
    tinychat_session_options(&o, CAPACITY, window);
    return ctxs_session_open(s, path, &cm, flags, &o.open);
}

#define VOCAB 256u

/* The logits behind each prediction of a run: logits[i] are those that
 * chose out[i] (out[0] from the prefill, out[i + 1] from step i). */
typedef float logit_row[VOCAB];

/* The prompt, then n_gen tokens, each committed by tinychat_step();
 * out[i] is the i-th token committed after the prompt, logits (may be NULL,
 * else n_gen + 1 rows) the logits behind each prediction. With
 * reopen_every, the session is closed and reopened every that many tokens
 * and the resumed prediction is checked against the one the run had, token
 * and logits bit for bit. */
static void generate_n(uint32_t *out, logit_row *logits, uint32_t n_gen, uint64_t seed,
                       uint32_t dtype, const char *path, uint32_t reopen_every)
{
    tinychat_model *m = model_new_dtype(seed, dtype);
    cr_assert_eq(tinychat_model_config(m)->vocab, VOCAB);
    ctxs_session *s = session_create(m, path, CAPACITY);
    uint32_t ids[N_PROMPT], next;
    logit_row last;
    prompt_ids(ids);
    int rc = tinychat_prefill(m, s, ids, N_PROMPT, &next);
    cr_assert_eq(rc, 0, "prefill: %s", ctxs_err_name(rc));
    if (logits)
        memcpy(logits[0], tinychat_logits(m), sizeof(logit_row));
    for (uint32_t i = 0; i < n_gen; i++) {
        out[i] = next;
        rc = tinychat_step(m, s, next, &next);
        cr_assert_eq(rc, 0, "step %u: %s", i, ctxs_err_name(rc));
        memcpy(last, tinychat_logits(m), sizeof(logit_row));
        if (logits)
            memcpy(logits[i + 1], last, sizeof(logit_row));
        if (reopen_every && (i + 1) % reopen_every == 0) {
            ctxs_session_close(s);
            rc = session_open(&s, m, path, 0, 0);
            cr_assert_eq(rc, 0, "reopen: %s", ctxs_err_name(rc));
            uint32_t again;
            rc = tinychat_resume(m, s, &again);
            cr_assert_eq(rc, 0, "resume after %u: %s", i + 1, ctxs_err_name(rc));
            cr_assert_eq(again, next, "resume after %u tokens predicts %u, the run had %u", i + 1,
                         again, next);
            cr_assert(memcmp(tinychat_logits(m), last, sizeof(logit_row)) == 0,
                      "resume after %u tokens: the logits differ in their bits", i + 1);
        }
    }
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(info.n_tokens, N_PROMPT + n_gen);
    if (N_PROMPT + n_gen > CAPACITY)
        cr_assert(info.flags & CTXS_INFO_WRAPPED, "the run did not wrap the ring");
    uint64_t bad = 0;
    rc = ctxs_session_verify(&bad, s);
    cr_assert_eq(rc, 0, "verify: %s at %llu", ctxs_err_name(rc), (unsigned long long)bad);
    ctxs_session_close(s);
    tinychat_model_destroy(m);
}

static void generate(uint32_t *out, uint64_t seed, const char *path, uint32_t reopen_every)
{
    generate_n(out, NULL, N_GEN, seed, CTXS_DTYPE_F16, path, reopen_every);
}

static uint32_t distinct(const uint32_t *v, uint32_t n)
{
    uint8_t seen[256] = {0};
    uint32_t d = 0;
    for (uint32_t i = 0; i < n; i++)
        if (v[i] < 256 && !seen[v[i]]++)
            d++;
    return d;
}

static void assert_same_stream(const uint32_t *want, const uint32_t *got, const char *what)
{
    for (uint32_t i = 0; i < N_GEN; i++)
        cr_assert_eq(got[i], want[i], "%s: token %u is %u, the uninterrupted run had %u", what, i,
                     got[i], want[i]);
}

/* --- Streams --------------------------------------------------------------------- */

Test(tinychat, uninterrupted_run_is_varied_and_seeded)
{
    uint32_t a[N_GEN], b[N_GEN], c[N_GEN];
    generate(a, MODEL_SEED, ts_path(ts_scratch, "a.ctxs"), 0);
    generate(b, MODEL_SEED, ts_path(ts_scratch, "b.ctxs"), 0);
    generate(c, MODEL_SEED + 1, ts_path(ts_scratch, "c.ctxs"), 0);
    /* Deterministic... */
    assert_same_stream(a, b, "a second uninterrupted run");
    /* ...not trivially constant, so that the identity tests can fail... */
    uint32_t da = distinct(a, N_GEN);
    say("tinychat: seed %u: %u distinct tokens in %u", MODEL_SEED, da, N_GEN);
    cr_assert_geq(da, 20, "only %u distinct tokens in %u", da, N_GEN);
    /* ...and another seed is another model. */
    uint32_t same = 0;
    for (uint32_t i = 0; i < N_GEN; i++)
        same += a[i] == c[i];
    cr_assert_lt(same, N_GEN / 4, "seeds %u and %u agree on %u of %u tokens", MODEL_SEED,
                 MODEL_SEED + 1, same, N_GEN);
}

Test(tinychat, close_and_reopen_every_7_tokens_gives_the_same_stream)
{
    uint32_t want[N_GEN], got[N_GEN];
    generate(want, MODEL_SEED, ts_path(ts_scratch, "a.ctxs"), 0);
    generate(got, MODEL_SEED, ts_path(ts_scratch, "b.ctxs"), 7);
    assert_same_stream(want, got, "reopened every 7 tokens");
    generate(got, MODEL_SEED, ts_path(ts_scratch, "c.ctxs"), 1);
    assert_same_stream(want, got, "reopened after every token");
}

/* In bf16 and Q8 the stream is another (the K/V keep fewer bits), but as
 * deterministic, and a reopened session resumes it bit for bit. */
Test(tinychat, every_dtype_resumes_to_the_same_stream)
{
    uint32_t want[N_DTYPES][N_GEN], got[N_GEN];
    logit_row *logits = malloc(N_DTYPES * (N_GEN + 1) * sizeof(logit_row));
    cr_assert_not_null(logits);
    for (size_t d = 0; d < N_DTYPES; d++) {
        char a[32], b[32], what[64];
        snprintf(a, sizeof(a), "%s-a.ctxs", dtype_name(k_dtypes[d]));
        snprintf(b, sizeof(b), "%s-b.ctxs", dtype_name(k_dtypes[d]));
        logit_row *mine = logits + d * (N_GEN + 1);
        generate_n(want[d], mine, N_GEN, MODEL_SEED, k_dtypes[d], ts_path(ts_scratch, a), 0);
        generate_n(got, NULL, N_GEN, MODEL_SEED, k_dtypes[d], ts_path(ts_scratch, b), 5);
        snprintf(what, sizeof(what), "%s, reopened every 5 tokens", dtype_name(k_dtypes[d]));
        assert_same_stream(want[d], got, what);
        uint32_t dd = distinct(want[d], N_GEN), same = 0;
        for (uint32_t i = 0; i < N_GEN; i++)
            same += want[d][i] == want[0][i];
        float most = 0.0f; /* the largest logit difference from fp16's */
        for (uint32_t i = 0; i <= N_GEN; i++)
            for (uint32_t j = 0; j < VOCAB; j++)
                most = fmaxf(most, fabsf(mine[i][j] - logits[i][j]));
        say("tinychat: %s: %u distinct tokens in %u, %u the same as fp16's (logits within %g)",
            dtype_name(k_dtypes[d]), dd, N_GEN, same, (double)most);
        cr_assert_geq(dd, 20, "%s: only %u distinct tokens in %u", dtype_name(k_dtypes[d]), dd,
                      N_GEN);
        /* The greedy choices of this random model rarely flip, but the
         * logits show that attention read K/V of fewer bits. */
        if (d > 0)
            cr_assert(memcmp(mine, logits, (N_GEN + 1) * sizeof(logit_row)) != 0,
                      "%s: the logits are fp16's, bit for bit", dtype_name(k_dtypes[d]));
    }
    free(logits);
}

/* A session keeps its dtype: the same weights with another dtype are
 * another model, refused at open, and each dtype's file is sized by it. */
Test(tinychat, a_session_opens_only_with_its_dtype)
{
    ctxs_layout lay[N_DTYPES];
    for (size_t d = 0; d < N_DTYPES; d++) {
        tinychat_model *m = model_new_dtype(MODEL_SEED, k_dtypes[d]);
        char name[32];
        snprintf(name, sizeof(name), "%s.ctxs", dtype_name(k_dtypes[d]));
        ctxs_session *s = session_create(m, ts_path(ts_scratch, name), CAPACITY);
        cr_assert_eq(ctxs_session_get_layout(&lay[d], s), 0);
        cr_assert_eq(lay[d].geometry.dtype, k_dtypes[d]);
        cr_assert_eq(lay[d].scales != NULL, k_dtypes[d] == CTXS_DTYPE_Q8);
        uint32_t ids[N_PROMPT], next;
        prompt_ids(ids);
        int rc = tinychat_prefill(m, s, ids, N_PROMPT, &next);
        cr_assert_eq(rc, 0, "%s: prefill: %s", dtype_name(k_dtypes[d]), ctxs_err_name(rc));
        ctxs_session_close(s);
        for (size_t e = 0; e < N_DTYPES; e++) {
            if (e == d)
                continue;
            tinychat_model *other = model_new_dtype(MODEL_SEED, k_dtypes[e]);
            rc = session_open(&s, other, ts_path(ts_scratch, name), 0, 0);
            cr_assert_eq(rc, CTXS_EMODEL, "a %s session opened as %s: %s",
                         dtype_name(k_dtypes[d]), dtype_name(k_dtypes[e]), ctxs_err_name(rc));
            /* Read-only without a model it opens; tinychat refuses it. */
            cr_assert_eq(ctxs_session_open(&s, ts_path(ts_scratch, name), NULL, CTXS_RDONLY,
                                           NULL), 0);
            rc = tinychat_resume(other, s, &next);
            cr_assert_eq(rc, CTXS_EMODEL, "a %s session resumed as %s: %s",
                         dtype_name(k_dtypes[d]), dtype_name(k_dtypes[e]), ctxs_err_name(rc));
            ctxs_session_close(s);
            tinychat_model_destroy(other);
        }
        tinychat_model_destroy(m);
    }
    cr_assert_eq(lay[1].slot_bytes, lay[0].slot_bytes, "bf16 is as wide as fp16");
    cr_assert_eq(lay[2].slot_bytes * 2, lay[0].slot_bytes, "Q8 is half of fp16");
}

Test(tinychat, another_model_does_not_open_the_session)
{
    tinychat_model *m = model_new(MODEL_SEED), *other = model_new(MODEL_SEED + 1);
    const char *path = ts_path(ts_scratch, "a.ctxs");
    ctxs_session *s = session_create(m, path, CAPACITY);
    uint32_t ids[N_PROMPT], next;
    prompt_ids(ids);
    cr_assert_eq(tinychat_prefill(m, s, ids, N_PROMPT, &next), 0);
    ctxs_session_close(s);
    s = NULL;
    int rc = session_open(&s, other, path, 0, 0);
    cr_assert_eq(rc, CTXS_EMODEL, "a model of another seed opened the session: %s",
                 ctxs_err_name(rc));
    cr_assert_null(s);
    tinychat_model_destroy(other);
    tinychat_model_destroy(m);
}

/* Resume recomputes the last token's K and V and compares them with the
 * stored ones: a session read through another window (or written by
 * something else) is refused rather than continued with other logits. */
Test(tinychat, resume_refuses_a_session_it_cannot_reproduce)
{
    uint32_t a[N_GEN];
    const char *path = ts_path(ts_scratch, "a.ctxs");
    generate(a, MODEL_SEED, path, 0);
    tinychat_model *m = model_new(MODEL_SEED);
    ctxs_session *s;
    uint32_t next;
    cr_assert_eq(session_open(&s, m, path, CTXS_RDONLY, 0), 0);
    cr_assert_eq(tinychat_resume(m, s, &next), 0, "a read-only handle resumes");
    ctxs_session_close(s);

    cr_assert_eq(session_open(&s, m, path, 0, 40), 0);
    int rc = tinychat_resume(m, s, &next);
    cr_assert_eq(rc, CTXS_ECORRUPT, "resume through a window of 40 instead of 93: %s",
                 ctxs_err_name(rc));
    ctxs_session_close(s);

    /* One flipped bit of the last token's V in the last layer. */
    cr_assert_eq(session_open(&s, m, path, 0, 0), 0);
    ctxs_layout lay;
    uint32_t slot;
    cr_assert_eq(ctxs_session_get_layout(&lay, s), 0);
    cr_assert_eq(ctxs_session_get_slot(&slot, s, N_PROMPT + N_GEN - 1), 0);
    void *run;
    cr_assert_eq(ctxs_session_get_kv(&run, s, lay.geometry.n_layers - 1, CTXS_V, 0), 0);
    ((uint8_t *)run)[(size_t)slot * lay.slot_bytes] ^= 1;
    rc = tinychat_resume(m, s, &next);
    cr_assert_eq(rc, CTXS_ECORRUPT, "resume over a changed V: %s", ctxs_err_name(rc));
    ctxs_session_close(s);
    tinychat_model_destroy(m);
}

/* In Q8 the scales are part of what resume checks: one flipped bit of the
 * last token's K scale is refused, as a flipped element is. */
Test(tinychat, resume_refuses_a_changed_q8_scale)
{
    uint32_t a[N_GEN];
    const char *path = ts_path(ts_scratch, "q8.ctxs");
    generate_n(a, NULL, N_GEN, MODEL_SEED, CTXS_DTYPE_Q8, path, 0);
    tinychat_model *m = model_new_dtype(MODEL_SEED, CTXS_DTYPE_Q8);
    ctxs_session *s;
    uint32_t next, slot;
    cr_assert_eq(session_open(&s, m, path, 0, 0), 0);
    cr_assert_eq(tinychat_resume(m, s, &next), 0);
    cr_assert_eq(ctxs_session_get_slot(&slot, s, N_PROMPT + N_GEN - 1), 0);
    float *scales;
    cr_assert_eq(ctxs_session_get_scales(&scales, s, 0, CTXS_K, 1), 0);
    uint32_t bits;
    memcpy(&bits, &scales[slot], 4);
    bits ^= 1;
    memcpy(&scales[slot], &bits, 4);
    int rc = tinychat_resume(m, s, &next);
    cr_assert_eq(rc, CTXS_ECORRUPT, "resume over a changed scale: %s", ctxs_err_name(rc));
    ctxs_session_close(s);
    tinychat_model_destroy(m);
}

/* A prompt longer than the ring is prefilled in chunks; every chunk, and
 * every position of the result, must be what one token at a time gives. */
static void prefill_equals_steps(uint32_t dtype)
{
    enum { N = 300 };
    uint32_t ids[N];
    uint64_t st = 7;
    for (uint32_t i = 0; i < N; i++)
        ids[i] = (uint32_t)(ts_rng_next(&st) % 256);
    tinychat_model *m = model_new_dtype(MODEL_SEED, dtype);
    const uint32_t vocab = tinychat_model_config(m)->vocab;
    char pa[32], pb[32];
    snprintf(pa, sizeof(pa), "prefill-%s.ctxs", dtype_name(dtype));
    snprintf(pb, sizeof(pb), "steps-%s.ctxs", dtype_name(dtype));
    ctxs_session *a = session_create(m, ts_path(ts_scratch, pa), CAPACITY);
    ctxs_session *b = session_create(m, ts_path(ts_scratch, pb), CAPACITY);

    uint32_t na, nb;
    float la[256], lb[256];
    cr_assert_eq(tinychat_prefill(m, a, ids, N, &na), 0);
    memcpy(la, tinychat_logits(m), vocab * sizeof(float));
    for (uint32_t i = 0; i < N; i++)
        cr_assert_eq(tinychat_step(m, b, ids[i], &nb), 0);
    memcpy(lb, tinychat_logits(m), vocab * sizeof(float));
    cr_assert_eq(na, nb, "%s: prefill predicts %u, stepping %u", dtype_name(dtype), na, nb);
    cr_assert(memcmp(la, lb, vocab * sizeof(float)) == 0, "%s: the logits differ in their bits",
              dtype_name(dtype));

    /* The sessions hold the same bytes, token ids and all. */
    ctxs_session_info ia, ib;
    ctxs_layout ya, yb;
    cr_assert_eq(ctxs_session_get_info(&ia, a), 0);
    cr_assert_eq(ctxs_session_get_info(&ib, b), 0);
    cr_assert_eq(ia.n_tokens, N);
    cr_assert_eq(ib.n_tokens, N);
    cr_assert_eq(ia.ring_start, ib.ring_start);
    cr_assert_eq(ctxs_session_get_layout(&ya, a), 0);
    cr_assert_eq(ctxs_session_get_layout(&yb, b), 0);
    cr_assert(memcmp(ya.kv, yb.kv, ya.kv_bytes) == 0, "%s: the KV regions differ",
              dtype_name(dtype));
    cr_assert_eq(ya.scales_bytes, yb.scales_bytes);
    cr_assert_eq(ya.scales_bytes != 0, dtype == CTXS_DTYPE_Q8);
    cr_assert(ya.scales_bytes == 0 || memcmp(ya.scales, yb.scales, ya.scales_bytes) == 0,
              "%s: the scales differ", dtype_name(dtype));
    cr_assert(memcmp(ya.token_ids, yb.token_ids, CAPACITY * sizeof(uint32_t)) == 0);

    /* And a resume of either gives the same again. */
    cr_assert_eq(tinychat_resume(m, a, &na), 0);
    cr_assert_eq(na, nb);
    cr_assert(memcmp(tinychat_logits(m), lb, vocab * sizeof(float)) == 0);
    ctxs_session_close(a);
    ctxs_session_close(b);
    tinychat_model_destroy(m);
}

Test(tinychat, prefill_in_chunks_equals_stepping_token_by_token)
{
    for (size_t d = 0; d < N_DTYPES; d++)
        prefill_equals_steps(k_dtypes[d]);
}

/* The engine interface of the ctxstore tool's demo: the caller reserves a
 * prompt and a reply, tinychat_write() fills them, one commit saves both;
 * then another reply after the commit. Without a ring wrap this is the
 * stream, and the bytes, that tinychat_prefill() and tinychat_step() give. */
Test(tinychat, write_into_reservations_matches_prefill_and_step)
{
    enum { CAP = 512, REPLY1 = 100, REPLY2 = 50, TOTAL = N_PROMPT + REPLY1 + REPLY2 };
    tinychat_model *m = model_new(MODEL_SEED);
    ctxs_session *a = session_create(m, ts_path(ts_scratch, "steps.ctxs"), CAP);
    ctxs_session *b = session_create(m, ts_path(ts_scratch, "write.ctxs"), CAP);
    uint32_t want[TOTAL], ids[TOTAL], na, nb;
    prompt_ids(want);
    cr_assert_eq(tinychat_prefill(m, a, want, N_PROMPT, &na), 0);
    for (uint32_t i = N_PROMPT; i < TOTAL; i++) {
        want[i] = na;
        cr_assert_eq(tinychat_step(m, a, na, &na), 0);
    }

    ctxs_reservation r;
    prompt_ids(ids);
    cr_assert_eq(ctxs_session_reserve(&r, b, N_PROMPT), 0);
    cr_assert_eq(tinychat_write(m, b, &r, ids, 0, NULL), 0);
    cr_assert_eq(ctxs_session_reserve(&r, b, REPLY1), 0);
    int rc = tinychat_write(m, b, &r, ids, 1, NULL);
    cr_assert_eq(rc, 0, "reply after a pending prompt: %s", ctxs_err_name(rc));
    cr_assert_eq(ctxs_session_commit(b, ids, N_PROMPT + REPLY1), 0);
    cr_assert_eq(ctxs_session_reserve(&r, b, REPLY2), 0);
    rc = tinychat_write(m, b, &r, ids, 1, &nb);
    cr_assert_eq(rc, 0, "reply after a commit: %s", ctxs_err_name(rc));
    cr_assert_eq(ctxs_session_commit(b, ids + N_PROMPT + REPLY1, REPLY2), 0);

    for (uint32_t i = N_PROMPT; i < TOTAL; i++)
        cr_assert_eq(ids[i], want[i], "token %u", i);
    cr_assert_eq(nb, na);
    ctxs_layout ya, yb;
    cr_assert_eq(ctxs_session_get_layout(&ya, a), 0);
    cr_assert_eq(ctxs_session_get_layout(&yb, b), 0);
    cr_assert(memcmp(ya.kv, yb.kv, ya.kv_bytes) == 0, "the KV regions differ");

    /* Not the newest reservation: refused. */
    ctxs_reservation r1, r2;
    cr_assert_eq(ctxs_session_reserve(&r1, b, 3), 0);
    cr_assert_eq(ctxs_session_reserve(&r2, b, 3), 0);
    uint32_t more[TOTAL + 6];
    memcpy(more, ids, sizeof(ids));
    cr_assert_eq(tinychat_write(m, b, &r1, more, 1, NULL), CTXS_EINVAL);
    ctxs_session_close(a);
    ctxs_session_close(b);
    tinychat_model_destroy(m);
}

/* Qwen3-4B's KV shape (36 layers, 8 KV heads of 128, 16 query heads):
 * the code is not tied to the small geometry. A ring of 32 slots, so that
 * 16 prompt tokens and 24 more wrap it. */
Test(tinychat, qwen3_4b_kv_geometry_resumes_exactly)
{
    tinychat_config cfg;
    tinychat_config_qwen3_4b_kv(&cfg);
    tinychat_model *m = NULL;
    cr_assert_eq(tinychat_model_create(&m, &cfg), 0);
    ctxs_model cm;
    tinychat_model_ctxs(&cm, m);
    cr_assert_eq(cm.geometry.n_layers, 36);
    cr_assert_eq(cm.geometry.n_kv_heads, 8);
    cr_assert_eq(cm.geometry.head_dim, 128);
    const char *path = ts_path(ts_scratch, "qwen.ctxs");
    ctxs_create_options o;
    tinychat_session_options(&o, 32, 0);
    ctxs_session *s;
    cr_assert_eq(ctxs_session_create(&s, path, &cm, &o), 0);
    enum { PROMPT = 16, GEN = 24 };
    uint32_t ids[N_PROMPT], next, stream[GEN];
    logit_row last;
    prompt_ids(ids);
    cr_assert_eq(tinychat_prefill(m, s, ids, PROMPT, &next), 0);
    for (uint32_t i = 0; i < GEN; i++) {
        stream[i] = next;
        cr_assert_eq(tinychat_step(m, s, next, &next), 0);
        memcpy(last, tinychat_logits(m), sizeof(last));
        if (i % 7 == 6) {
            ctxs_session_close(s);
            cr_assert_eq(ctxs_session_open(&s, path, &cm, 0, &o.open), 0);
            uint32_t again;
            int rc = tinychat_resume(m, s, &again);
            cr_assert_eq(rc, 0, "resume: %s", ctxs_err_name(rc));
            cr_assert_eq(again, next);
            cr_assert(memcmp(tinychat_logits(m), last, sizeof(last)) == 0);
        }
    }
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert(info.flags & CTXS_INFO_WRAPPED);
    cr_assert_geq(distinct(stream, GEN), 4);
    ctxs_session_close(s);
    tinychat_model_destroy(m);
}

Test(tinychat, bad_arguments)
{
    tinychat_config cfg;
    tinychat_model *m = (tinychat_model *)1;
    tinychat_config_default(&cfg);
    cfg.n_heads = 3; /* not a multiple of 2 KV heads */
    cr_assert_eq(tinychat_model_create(&m, &cfg), CTXS_EINVAL);
    cr_assert_null(m);
    tinychat_config_default(&cfg);
    cfg.head_dim = 15;
    cr_assert_eq(tinychat_model_create(&m, &cfg), CTXS_EINVAL);

    m = model_new(MODEL_SEED);
    ctxs_session *s = session_create(m, ts_path(ts_scratch, "a.ctxs"), CAPACITY);
    uint32_t next, bad = 256;
    cr_assert_eq(tinychat_resume(m, s, &next), CTXS_EINVAL, "nothing to resume");
    cr_assert_eq(tinychat_step(m, s, bad, &next), CTXS_EINVAL, "id beyond the vocab");
    cr_assert_eq(tinychat_prefill(m, s, &bad, 0, &next), CTXS_EINVAL);
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(info.n_tokens, 0);
    cr_assert_eq(info.n_reserved, 0);
    ctxs_session_close(s);
    tinychat_model_destroy(m);
}

/* --- Kills --------------------------------------------------------------------------
 *
 * A child process generates, committing every token, and writes each
 * committed token id to a pipe. It takes one byte from a second pipe before
 * each token, so the parent decides how far it may go: the parent lets it
 * run up to a seeded random point, watches the session's committed count
 * (ctxs_file_inspect(), as another process would) until the child is on
 * its last permitted token, waits a random fraction of a token's time and
 * SIGKILLs it: mid-forward with a reservation outstanding (and a ring
 * eviction committed), or just after the commit. The next child opens the
 * file, resumes and goes on; after the last kill the parent finishes the
 * 200 tokens itself. */

enum { CHILD_EOPEN = 10, CHILD_ESTART, CHILD_ESTEP, CHILD_EPIPE };

/* Committed tokens per the current record, or -1 if the file is not
 * there yet. */
static int64_t committed(const char *path)
{
    ctxs_file_report rep;
    if (ctxs_file_inspect(&rep, path) != 0 || rep.status != 0)
        return -1;
    for (int i = 0; i < 2; i++)
        if (rep.records[i].current)
            return (int64_t)rep.records[i].n_tokens;
    return -1;
}

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, us % 1000000 * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* No Criterion here: the child reports by its exit code and stderr. */
static _Noreturn void child_main(const char *path, uint32_t dtype, int create, int go_fd,
                                 int out_fd)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    tinychat_config cfg;
    tinychat_config_default(&cfg);
    cfg.seed = MODEL_SEED;
    cfg.dtype = dtype;
    tinychat_model *m;
    if (tinychat_model_create(&m, &cfg) != 0)
        _exit(CHILD_EOPEN);
    ctxs_model cm;
    ctxs_create_options o;
    tinychat_model_ctxs(&cm, m);
    tinychat_session_options(&o, CAPACITY, 0);
    ctxs_session *s;
    uint32_t next;
    int rc;
    if (create) {
        uint32_t ids[N_PROMPT];
        prompt_ids(ids);
        if ((rc = ctxs_session_create(&s, path, &cm, &o)) != 0)
            _exit(CHILD_EOPEN);
        rc = tinychat_prefill(m, s, ids, N_PROMPT, &next);
    } else {
        if ((rc = ctxs_session_open(&s, path, &cm, 0, &o.open)) != 0)
            _exit(CHILD_EOPEN);
        rc = tinychat_resume(m, s, &next);
    }
    if (rc != 0) {
        fprintf(stderr, "tinychat child: start: %s\n", ctxs_err_name(rc));
        _exit(CHILD_ESTART);
    }
    for (;;) {
        char go;
        ssize_t r = read(go_fd, &go, 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r != 1)
            _exit(CHILD_EPIPE);
        uint32_t id = next;
        if ((rc = tinychat_step(m, s, id, &next)) != 0) {
            fprintf(stderr, "tinychat child: step: %s\n", ctxs_err_name(rc));
            _exit(CHILD_ESTEP);
        }
        if (write(out_fd, &id, sizeof(id)) != (ssize_t)sizeof(id))
            _exit(CHILD_EPIPE);
    }
}

/* Lets a child generate into path up to `at` committed tokens and kills it
 * delay_us after it was allowed its last token; appends
 * the ids it reported to stream (*n_stream of them so far, counted from the
 * end of the prompt). Returns the committed count after the kill. */
static uint64_t run_and_kill(const char *path, uint32_t dtype, int create, uint64_t at,
                             long delay_us, uint32_t *stream, uint32_t *n_stream)
{
    int go[2], out[2];
    cr_assert_eq(pipe2(go, O_CLOEXEC), 0);
    cr_assert_eq(pipe2(out, O_CLOEXEC), 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_neq(pid, -1, "fork: %s", strerror(errno));
    if (pid == 0) {
        close(go[1]);
        close(out[0]);
        child_main(path, dtype, create, go[0], out[1]);
    }
    close(go[0]);
    close(out[1]);
    /* Permission for the tokens up to `at`: the count after the prompt (or
     * the last kill) is known once the file is there. */
    int64_t n;
    int st = 0;
    while ((n = committed(path)) < (create ? (int64_t)N_PROMPT : 1)) {
        cr_assert_eq(waitpid(pid, &st, WNOHANG), 0, "the child died (exit %d)",
                     WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        sleep_us(100);
    }
    cr_assert_lt(n, (int64_t)at);
    for (int64_t i = n; i + 1 < (int64_t)at; i++)
        cr_assert_eq(write(go[1], "g", 1), 1);
    /* Once it waits for the last one: let it start, and kill it a while
     * into it. */
    while (committed(path) < (int64_t)at - 1) {
        cr_assert_eq(waitpid(pid, &st, WNOHANG), 0, "the child died (exit %d)",
                     WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        sleep_us(20);
    }
    cr_assert_eq(write(go[1], "g", 1), 1);
    sleep_us(delay_us);
    kill(pid, SIGKILL);
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the child exited with %d",
              WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    close(go[1]);
    uint32_t id;
    ssize_t r;
    while ((r = read(out[0], &id, sizeof(id))) == (ssize_t)sizeof(id)) {
        cr_assert_lt(*n_stream, N_GEN);
        stream[(*n_stream)++] = id;
    }
    cr_assert_eq(r, 0, "a torn id from the child");
    close(out[0]);
    n = committed(path);
    cr_assert(n == (int64_t)at - 1 || n == (int64_t)at, "killed at %lld tokens, allowed %llu",
              (long long)n, (unsigned long long)at);
    cr_assert_geq(n, N_PROMPT + *n_stream);
    return (uint64_t)n;
}

/* After a kill: the session opens without loss, verifies, and holds the
 * ids the child reported (the one it may have committed without reporting
 * is taken from the session). */
static void check_after_kill(tinychat_model *m, const char *path, uint64_t n, uint32_t *stream,
                             uint32_t *n_stream, const logit_row *ref, int kill_no)
{
    ctxs_session *s;
    int rc = session_open(&s, m, path, 0, 0);
    cr_assert_eq(rc, 0, "kill %d: reopen: %s", kill_no, ctxs_err_name(rc));
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(info.n_tokens, n);
    cr_assert_eq(info.lost_tokens, 0, "kill %d: the open lost %llu tokens", kill_no,
                 (unsigned long long)info.lost_tokens);
    uint64_t bad = 0;
    rc = ctxs_session_verify(&bad, s);
    cr_assert_eq(rc, 0, "kill %d: verify: %s at %llu", kill_no, ctxs_err_name(rc),
                 (unsigned long long)bad);
    ctxs_layout lay;
    cr_assert_eq(ctxs_session_get_layout(&lay, s), 0);
    for (uint64_t pos = N_PROMPT; pos < n; pos++) {
        uint32_t slot, i = (uint32_t)(pos - N_PROMPT);
        rc = ctxs_session_get_slot(&slot, s, pos);
        if (rc == CTXS_EEVICTED)
            continue;
        cr_assert_eq(rc, 0);
        if (i < *n_stream)
            cr_assert_eq(lay.token_ids[slot], stream[i], "kill %d: position %llu", kill_no,
                         (unsigned long long)pos);
        else
            stream[(*n_stream)++] = lay.token_ids[slot]; /* committed, not yet reported */
    }
    cr_assert_eq(N_PROMPT + *n_stream, n, "kill %d: a committed token is missing", kill_no);
    /* The resumed prediction has the uninterrupted run's logits, bit for
     * bit (the parent's own resume; the next child makes its own). */
    uint32_t next;
    rc = tinychat_resume(m, s, &next);
    cr_assert_eq(rc, 0, "kill %d: resume: %s", kill_no, ctxs_err_name(rc));
    cr_assert(memcmp(tinychat_logits(m), ref[n - N_PROMPT], sizeof(logit_row)) == 0,
              "kill %d: the resumed logits differ from the uninterrupted run's", kill_no);
    ctxs_session_close(s);
}

static void sigkill_then_resume(uint32_t dtype)
{
    uint32_t want[N_GEN], got[N_GEN], n_got = 0;
    logit_row *ref = malloc((N_GEN + 1) * sizeof(logit_row));
    cr_assert_not_null(ref);
    generate_n(want, ref, N_GEN, MODEL_SEED, dtype, ts_path(ts_scratch, "ref.ctxs"), 0);

    /* How long one token takes here, to aim the kills inside one. */
    tinychat_model *m = model_new_dtype(MODEL_SEED, dtype);
    ctxs_session *s = session_create(m, ts_path(ts_scratch, "time.ctxs"), CAPACITY);
    uint32_t next = 'a';
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < 20; i++)
        cr_assert_eq(tinychat_step(m, s, next, &next), 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ctxs_session_close(s);
    long token_us = ((t1.tv_sec - t0.tv_sec) * 1000000L + (t1.tv_nsec - t0.tv_nsec) / 1000) / 20;

    /* Five kill points in the 200 tokens, seeded, increasing, each after a
     * random part of a token's time (+50%: some land after the commit). */
    enum { KILLS = 5 };
    char seed_name[64];
    snprintf(seed_name, sizeof(seed_name), "tinychat sigkill %s", dtype_name(dtype));
    uint64_t rng = ts_seed(seed_name);
    uint64_t at[KILLS];
    long delay[KILLS];
    for (int i = 0; i < KILLS; i++) {
        at[i] = N_PROMPT + 2 + (uint64_t)i * (N_GEN / KILLS) + ts_rng_next(&rng) % (N_GEN / KILLS - 4);
        delay[i] = (long)(ts_rng_next(&rng) % (uint64_t)(token_us * 3 / 2 + 1));
    }

    char path[4096];
    snprintf(path, sizeof(path), "%s", ts_path(ts_scratch, "killed.ctxs"));
    uint32_t mid_token = 0;
    for (int i = 0; i < KILLS; i++) {
        uint64_t n = run_and_kill(path, dtype, i == 0, at[i], delay[i], got, &n_got);
        check_after_kill(m, path, n, got, &n_got, ref, i);
        mid_token += n + 1 == at[i];
        say("tinychat sigkill %s: kill %d: allowed %llu tokens, %ld us into the last (a token "
            "takes %ld us): %llu committed",
            dtype_name(dtype), i, (unsigned long long)at[i], delay[i], token_us,
            (unsigned long long)n);
    }
    say("tinychat sigkill %s: %u of %d kills landed inside a token", dtype_name(dtype),
        mid_token, KILLS);

    /* The parent finishes the run. */
    cr_assert_eq(session_open(&s, m, path, 0, 0), 0);
    int rc = tinychat_resume(m, s, &next);
    cr_assert_eq(rc, 0, "resume: %s", ctxs_err_name(rc));
    cr_assert(memcmp(tinychat_logits(m), ref[n_got], sizeof(logit_row)) == 0);
    while (n_got < N_GEN) {
        got[n_got++] = next;
        cr_assert_eq(tinychat_step(m, s, next, &next), 0);
    }
    uint64_t bad = 0;
    rc = ctxs_session_verify(&bad, s);
    cr_assert_eq(rc, 0, "verify: %s at %llu", ctxs_err_name(rc), (unsigned long long)bad);
    ctxs_session_close(s);
    tinychat_model_destroy(m);
    char what[64];
    snprintf(what, sizeof(what), "%s, killed and resumed", dtype_name(dtype));
    assert_same_stream(want, got, what);
    free(ref);
}

Test(tinychat, sigkill_mid_generation_then_resume_gives_the_same_stream, .timeout = 120)
{
    sigkill_then_resume(CTXS_DTYPE_F16);
}

Test(tinychat, sigkill_then_resume_gives_the_same_stream_in_bf16, .timeout = 120)
{
    sigkill_then_resume(CTXS_DTYPE_BF16);
}

Test(tinychat, sigkill_then_resume_gives_the_same_stream_in_q8, .timeout = 120)
{
    sigkill_then_resume(CTXS_DTYPE_Q8);
}

/* --- The program -------------------------------------------------------------------- */

/* Runs the tinychat program with args, its stdout into out (ids, up to
 * max); returns how many it printed. */
static uint32_t run_program(const char *const *args, uint32_t *out, uint32_t max, int kill_at,
                            const char *path)
{
    const char *bin = getenv("TINYCHAT_BIN");
    cr_assert_not_null(bin, "TINYCHAT_BIN is not set");
    char outpath[4096];
    snprintf(outpath, sizeof(outpath), "%s/prog.out", ts_scratch);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        int fd = open(outpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || dup2(fd, 1) < 0)
            _exit(127);
        char *argv[32];
        int k = 0;
        argv[k++] = (char *)bin;
        for (; args[k - 1] && k < 31; k++)
            argv[k] = (char *)args[k - 1];
        argv[k] = NULL;
        execv(bin, argv);
        _exit(127);
    }
    int st = 0;
    if (kill_at > 0) {
        while (committed(path) < kill_at) {
            cr_assert_eq(waitpid(pid, &st, WNOHANG), 0, "tinychat ended before the kill");
            sleep_us(50);
        }
        kill(pid, SIGKILL);
    }
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (kill_at > 0)
        cr_assert(WIFSIGNALED(st), "tinychat was not killed");
    else
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tinychat failed (status %d)", st);
    FILE *f = fopen(outpath, "r");
    cr_assert_not_null(f);
    uint32_t n = 0, id;
    while (n < max && fscanf(f, "%u", &id) == 1)
        out[n++] = id;
    fclose(f);
    return n;
}

/* The exit status of the tinychat program run with args, its output
 * discarded. */
static int program_status(const char *const *args)
{
    const char *bin = getenv("TINYCHAT_BIN");
    cr_assert_not_null(bin, "TINYCHAT_BIN is not set");
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
            _exit(127);
        char *argv[32];
        int k = 0;
        argv[k++] = (char *)bin;
        for (; args[k - 1] && k < 31; k++)
            argv[k] = (char *)args[k - 1];
        argv[k] = NULL;
        execv(bin, argv);
        _exit(127);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    cr_assert(WIFEXITED(st), "tinychat died (status %d)", st);
    return WEXITSTATUS(st);
}

/* The program created with --dtype (NULL: none, fp16), killed, then
 * continued without --dtype: it takes the file's. */
static void program_continues(uint32_t dtype, const char *dtype_arg)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s", ts_path(ts_scratch, "prog.ctxs"));
    enum { MAX = 20000, MORE = 50 };
    uint32_t *got = malloc((MAX + MORE) * sizeof(uint32_t));
    cr_assert_not_null(got);

    /* Killed somewhere past 30 tokens; it cannot be held back, so the
     * reference is generated afterwards, as long as it needs to be. */
    const char *first[] = {"--session", path, "--prompt", k_prompt, "--generate", "20000",
                           dtype_arg ? "--dtype" : NULL, dtype_arg, NULL};
    uint32_t printed = run_program(first, got, MAX, N_PROMPT + 30, path);
    int64_t n = committed(path);
    cr_assert_geq(n, N_PROMPT + 30);
    uint32_t done = (uint32_t)(n - N_PROMPT);
    say("tinychat program: killed after %u tokens", done);
    uint32_t *want = malloc((done + MORE) * sizeof(uint32_t));
    cr_assert_not_null(want);
    generate_n(want, NULL, done + MORE, MODEL_SEED, dtype, ts_path(ts_scratch, "ref.ctxs"), 0);

    /* Printed after each commit: what it printed is a prefix of the
     * stream, at most one token short of what it committed. */
    cr_assert(printed == done || printed + 1 == done, "printed %u, committed %u", printed, done);
    for (uint32_t i = 0; i < printed; i++)
        cr_assert_eq(got[i], want[i], "token %u", i);

    /* Continued for 50 more, reopening now and then. */
    char more[16];
    snprintf(more, sizeof(more), "%d", MORE);
    const char *second[] = {"--session", path, "--generate", more, "--reopen-every", "11", NULL};
    cr_assert_eq(run_program(second, got + done, MORE, 0, path), MORE);
    for (uint32_t i = done; i < done + MORE; i++)
        cr_assert_eq(got[i], want[i], "token %u after the restart", i);

    /* Another --dtype is another model: refused, the file untouched. */
    const char *other = dtype == CTXS_DTYPE_Q8 ? "f16" : "q8";
    const char *third[] = {"--session", path, "--generate", "1", "--dtype", other, NULL};
    cr_assert_eq(program_status(third), 1, "a %s session continued as %s",
                 dtype_name(dtype), other);
    cr_assert_eq(committed(path), n + MORE);
    free(want);
    free(got);
}

Test(tinychat, program_continues_a_killed_run)
{
    program_continues(CTXS_DTYPE_F16, NULL);
}

Test(tinychat, program_continues_a_killed_run_in_bf16)
{
    program_continues(CTXS_DTYPE_BF16, "bf16");
}

Test(tinychat, program_continues_a_killed_run_in_q8)
{
    program_continues(CTXS_DTYPE_Q8, "q8");
}

/* A model with sliding-window layers (--swa-every 2 --window 16: layers 0
 * and 2 read the last 16 tokens from rings of their own): killed three
 * times, the ring wrapping in between, and continued each time without
 * the flags (the file's schedule), it prints the stream an uninterrupted
 * run prints. */
Test(tinychat, program_with_sliding_window_layers_continues_killed_runs, .timeout = 120)
{
    char path[4096], ref_path[4096];
    snprintf(path, sizeof(path), "%s", ts_path(ts_scratch, "swa.ctxs"));
    snprintf(ref_path, sizeof(ref_path), "%s", ts_path(ts_scratch, "swa-ref.ctxs"));
    enum { MAX = 20000, MORE = 50 };
    uint32_t *got = malloc((MAX + MORE) * sizeof(uint32_t));
    cr_assert_not_null(got);

    const char *first[] = {"--session", path, "--prompt", k_prompt, "--generate", "20000",
                           "--swa-every", "2", "--window", "16", NULL};
    const char *again[] = {"--session", path, "--generate", "20000", NULL};
    /* Each kill a hundred tokens (the first, 30) past what the last run
     * left: the ring (128 slots) wraps by the second. */
    const int more_at[] = {N_PROMPT + 30, 100, 100};
    /* Each run prints from the first token not yet committed; one that
     * was committed and not printed before a kill is never printed. */
    uint8_t *seen = calloc(MAX + MORE, 1);
    cr_assert_not_null(seen);
    uint32_t start = 0;
    for (int k = 0; k < 3; k++) {
        int kill_at = (k ? (int)(start + N_PROMPT) : 0) + more_at[k];
        uint32_t printed = run_program(k ? again : first, got + start, MAX - start, kill_at,
                                       path);
        uint32_t now = (uint32_t)(committed(path) - N_PROMPT);
        cr_assert_geq(now + N_PROMPT, (uint32_t)kill_at);
        cr_assert(start + printed == now || start + printed + 1 == now,
                  "kill %d: printed up to %u, committed %u", k, start + printed, now);
        memset(seen + start, 1, printed);
        say("tinychat program with sliding-window layers: kill %d after %u tokens", k, now);
        start = now;
    }
    int64_t n = committed(path);
    uint32_t total = (uint32_t)(n - N_PROMPT);
    char more[16];
    snprintf(more, sizeof(more), "%d", MORE);
    const char *last[] = {"--session", path, "--generate", more, "--reopen-every", "11", NULL};
    uint32_t tail = run_program(last, got + total, MORE, 0, path);
    cr_assert_eq(tail, MORE);

    /* The uninterrupted run. */
    uint32_t *want = malloc((total + MORE) * sizeof(uint32_t));
    cr_assert_not_null(want);
    char all[16];
    snprintf(all, sizeof(all), "%u", total + MORE);
    const char *ref[] = {"--session", ref_path, "--prompt", k_prompt, "--generate", all,
                         "--swa-every", "2", "--window", "16", NULL};
    cr_assert_eq(run_program(ref, want, total + MORE, 0, ref_path), total + MORE);
    for (uint32_t i = 0; i < total; i++)
        if (seen[i])
            cr_assert_eq(got[i], want[i], "token %u, printed before a kill", i);
    for (uint32_t i = total; i < total + MORE; i++)
        cr_assert_eq(got[i], want[i], "token %u, after the last restart", i);
    /* A run without the schedule differs: the windows are read. */
    const char *plain[] = {"--session", ts_path(ts_scratch, "plain.ctxs"), "--prompt", k_prompt,
                           "--generate", all, NULL};
    uint32_t *global = malloc((total + MORE) * sizeof(uint32_t));
    cr_assert_not_null(global);
    cr_assert_eq(run_program(plain, global, total + MORE, 0, ts_path(ts_scratch, "plain.ctxs")),
                 total + MORE);
    cr_assert(memcmp(global, want, (total + MORE) * sizeof(uint32_t)) != 0,
              "the sliding windows changed nothing");

    /* Another window is another model: refused, the file untouched. */
    const char *other[] = {"--session", path, "--generate", "1", "--swa-every", "2", "--window",
                           "20", NULL};
    cr_assert_eq(program_status(other), 1);
    cr_assert_eq(committed(path), n + MORE);
    ctxs_file_report rep;
    cr_assert_eq(ctxs_file_inspect(&rep, path), 0);
    cr_assert_eq(rep.model.geometry.period, 2);
    cr_assert_eq(rep.model.geometry.window[0], 16);
    cr_assert_eq(rep.model.geometry.window[1], 0);
    free(global);
    free(seen);
    free(want);
    free(got);
}
