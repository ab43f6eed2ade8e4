/*
 * tinychat — a tiny decoder-only transformer whose KV cache lives in a
 * ctxstore session.
 *
 * The weights are random, drawn from a seed, so the model says nothing
 * worth reading; what it shows is the engine side of ctxstore: K and V are
 * written straight into the session's mapping, attention reads them there
 * (ctxs_attention()), every generated token is committed, and a process that
 * is killed, or a session that is closed, resumes with one token's forward
 * pass, whatever the length of the conversation, to exactly the logits the
 * uninterrupted run had.
 *
 *     tinychat_config cfg;
 *     tinychat_config_default(&cfg);
 *     tinychat_model *m;
 *     tinychat_model_create(&m, &cfg);
 *     ctxs_model cm;
 *     tinychat_model_ctxs(&cm, m);
 *     ctxs_create_options o;
 *     tinychat_session_options(&o, 0, 0);
 *     ctxs_session_create(&s, "chat.ctxs", &cm, &o);
 *
 *     uint32_t next;
 *     tinychat_prefill(m, s, prompt, n_prompt, &next);
 *     for (int i = 0; i < 200; i++)
 *         tinychat_step(m, s, next, &next);    // commits `next`, predicts
 *                                              // the one after it
 *     // later, after a close or a kill:
 *     ctxs_session_open(&s, "chat.ctxs", &cm, 0, &o);
 *     tinychat_resume(m, s, &next);            // the token to feed next
 *
 * Model. Byte-level by default (vocab 256). Token embedding; per layer:
 * RMSNorm, Q/K/V projections, rotary position encoding (NeoX halves, by
 * absolute position) on Q and K, attention over the session (K stored after
 * the rotation, K and V in the session's dtype: fp16 by default, bf16 or
 * Q8, see cfg.dtype), output projection, residual, RMSNorm,
 * SwiGLU MLP, residual; final RMSNorm, an untied unembedding; greedy
 * decoding (ties go to the lowest id). Weights are float32, in memory,
 * drawn from splitmix64 streams of cfg.seed: matrices uniform in
 * +-1/sqrt(fan_in), the embedding in +-1, norm gains 1. Nothing is read
 * from disk.
 *
 * Bit-identity. The logits of position p depend only on the token ids up to
 * p and on the keys each query reads. Every per-token operation runs the same
 * code for one token (step, resume) as for many (prefill): a matrix product
 * sums each output over its input index in ascending order, whatever the
 * number of rows, and the library is built with -ffp-contract=off so that no
 * copy of a loop fuses a multiply and an add where another does not. The
 * library kernel guarantees that its output depends only on the keys a query
 * reads, in position order. So a token recomputed by tinychat_resume(), and
 * a prompt prefilled in chunks, give the logits that stepping token by
 * token gives, bit for bit, on the same machine and build, provided
 *  - the session is opened with the same window every time (ctxstore does
 *    not store it; memory pressure narrows it to the pressure window, 1024
 *    by default, so keep it at most that), and
 *  - the window is shorter than the ring (capacity - n_sink - 1 at most, see
 *    tinychat_session_options()): then a ring eviction made by a
 *    reservation whose commit was lost to a kill never removes a key the
 *    window reads.
 * tinychat_resume() checks the result: it recomputes the last token's K and
 * V and refuses (CTXS_ECORRUPT) a session whose stored ones differ.
 *
 * Dtypes. The K and V of a layer go into the session as the layer computes
 * them, before its attention call reads them (a token's own key is among
 * those its query reads): tinychat encodes them into the session's dtype
 * with ctxs_dtype_encode() and hands them over with
 * ctxs_session_write_layer(), which never faults the mapping, whatever the
 * pause since the last turn. The bytes, and the Q8 scales, are those that
 * ctxs_session_write_token() would store from the same float32 K/V. The
 * stored form is a function of the float32 K/V alone, so resumes are exact
 * in every dtype, as in fp16.
 *
 * Threads: a model is used by one thread at a time (it owns scratch
 * buffers); sessions are ctxstore's rules.
 */
#ifndef TINYCHAT_H
#define TINYCHAT_H

#include <stdint.h>

#include "ctxstore.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tinychat_config {
    uint32_t vocab;      /* token ids 0 .. vocab - 1 (256: bytes) */
    uint32_t d_model;    /* residual stream width */
    uint32_t n_layers;
    uint32_t n_heads;    /* query heads, a multiple of n_kv_heads */
    uint32_t n_kv_heads; /* KV heads (GQA) */
    uint32_t head_dim;   /* even (rotary pairs) */
    uint32_t ffn;        /* SwiGLU hidden width */
    float rope_theta;    /* rotary base, 10000 */
    uint64_t seed;       /* the weights */
    uint32_t dtype;      /* how the session keeps K/V: CTXS_DTYPE_F16,
                            BF16 or Q8 */
    uint32_t swa_every;  /* 0: every layer global; 2..8: of each swa_every
                            layers the last is global and the others
                            attend to the last swa_window tokens only */
    uint32_t swa_window; /* with swa_every: the sliding window, 1..16 Mi */
} tinychat_config;

/* The most tokens a pass computes at once in a session with sliding-window
 * layers, and so the batch such a session is created with
 * (ctxs_create_options.batch): a windowed layer keeps its window and this
 * many slots more. */
#define TINYCHAT_SWA_BATCH 32u

typedef struct tinychat_model tinychat_model;

/* The default geometry: vocab 256, d_model 64, 4 layers, 4 query heads,
 * 2 KV heads, head_dim 16, ffn 128, theta 10000, seed 1, K/V in fp16. */
void tinychat_config_default(tinychat_config *cfg);

/* Qwen3-4B's KV shape (36 layers, 8 KV heads, head_dim 128, 16 query
 * heads) around the default's small d_model and ffn: a session as big as a
 * real one per token, with a model cheap enough to run anywhere. */
void tinychat_config_qwen3_4b_kv(tinychat_config *cfg);

/* Draws the weights of cfg (copied). Errors: CTXS_EINVAL (a zero size,
 * n_heads not a multiple of n_kv_heads, an odd head_dim, a geometry
 * ctxstore refuses, weights above 2^31 floats per matrix, a dtype other
 * than F16, BF16 and Q8), CTXS_ENOMEM.
 * *out is NULL on failure. */
int tinychat_model_create(tinychat_model **out, const tinychat_config *cfg);

/* Accepts NULL. */
void tinychat_model_destroy(tinychat_model *m);

/* The model's configuration. */
const tinychat_config *tinychat_model_config(const tinychat_model *m);

/* What a session of this model is: geometry {n_layers, n_kv_heads,
 * head_dim, cfg.dtype} with the schedule of swa_every and swa_window;
 * model_hash = XXH3-128 of "tinychat-model-v1" and
 * the config's fields (little-endian u32s, theta's bits, the u64 seed, then
 * the dtype unless it is F16, then swa_every and swa_window unless
 * swa_every is 0), so two configs or seeds never share a
 * session, and each dtype is a model of its own in a store (whose registry
 * gives a hash one geometry), while fp16's hash is the one it had before
 * dtypes; tokenizer_hash = XXH3-128 of "tinychat-bytes-v1" and the vocab. */
void tinychat_model_ctxs(ctxs_model *out, const tinychat_model *m);

/* Options for a tinychat session: a ring of `capacity` slots (0: 128) with
 * 4 sinks (capacity / 8 below 32 slots), a batch of TINYCHAT_SWA_BATCH (the
 * slots a sliding-window layer keeps beyond its window), and the window
 * tinychat_window(capacity, n_sink). window != 0 overrides it; it must stay
 * below capacity - n_sink for exact resumes. Pass the same window to create
 * and to every open (or ctxs_session_set_window() after it): ctxstore does
 * not store the window. */
void tinychat_session_options(ctxs_create_options *opts, uint32_t capacity,
                              uint32_t window);

/* The default window of a ring: three quarters of its length,
 * (capacity - n_sink) * 3 / 4 (at least 1). Below the ring length, so
 * resumes are exact, and a quarter short of it, so that a prefill past the
 * capacity goes in chunks of a quarter of the ring. */
uint32_t tinychat_window(uint32_t capacity, uint32_t n_sink);

/* Feeds ids[0 .. n) after the session's committed tokens, commits them, and
 * sets *next_id to the greedy prediction after the last one. Computes the
 * tokens layer by layer, all of a chunk at once (one ctxs_attention() call
 * per layer per chunk); a chunk is at most 512 tokens, and once the ring is
 * full at most as long as the ring allows without evicting a key that one
 * of its queries reads, so the result (logits, and every byte written to
 * the session) is the one tinychat_step() on each id would give. One
 * commit per chunk.
 * Errors: CTXS_EINVAL (n == 0, an id >= vocab, NULL, or the session holds
 * a reservation not committed), CTXS_EREADONLY, CTXS_ENOMEM, the errors of
 * ctxs_session_reserve(), ctxs_session_commit(), ctxs_attention(). On
 * error, chunks already committed stay committed; a chunk that failed after
 * its reservation leaves it in place, so close and reopen the session
 * before going on. */
int tinychat_prefill(tinychat_model *m, ctxs_session *s, const uint32_t *ids,
                     uint32_t n, uint32_t *next_id);

/* Feeds one token: reserve 1, forward, commit. A kill loses at most this
 * token. Errors as tinychat_prefill(). */
int tinychat_step(tinychat_model *m, ctxs_session *s, uint32_t id,
                  uint32_t *next_id);

/* Recomputes the prediction after the last committed token, writing
 * nothing: its K and V are in the session already, so this costs one
 * token's forward pass. The K and V it recomputes on the way must match the
 * stored ones bit for bit, or the session was not written by this model
 * with this window: CTXS_ECORRUPT. A session open read-only is fine.
 * Errors: CTXS_EINVAL (no committed token, NULL), CTXS_ECORRUPT,
 * CTXS_EMODEL (a session of another geometry or dtype), the errors
 * of ctxs_session_get_attn_plan(), ctxs_attention(). */
int tinychat_resume(tinychat_model *m, ctxs_session *s, uint32_t *next_id);

/* For engines that reserve and commit themselves (the ctxstore tool's
 * demo): computes the tokens of reservation r, which must be the newest
 * reservation of s (other uncommitted ones may come before it), and writes
 * their K and V into its slots; nothing is committed. ids is indexed by
 * position: ids[r->first_pos .. + r->n_tokens) are the new tokens, given
 * (generate == 0: a prompt, computed in chunks as by tinychat_prefill()),
 * or chosen here one after another, greedily, and stored there (generate
 * != 0: a reply; the first is the prediction after the token before r,
 * whose id ids[r->first_pos - 1] is read and whose K/V, in the session, are
 * checked as tinychat_resume() does). *next_id (may be NULL) gets the
 * prediction after the last new token. Without a ring wrap in between, the
 * tokens and bytes are those of tinychat_prefill() and tinychat_step();
 * where r made the ring evict, its first tokens read fewer keys.
 * Errors: CTXS_EINVAL (r not the newest reservation, an id >= vocab, a
 * reply with no token before it), CTXS_ECORRUPT, CTXS_ENOMEM, the errors of
 * ctxs_session_get_attn_plan() and ctxs_attention(). */
int tinychat_write(tinychat_model *m, ctxs_session *s, const ctxs_reservation *r,
                   uint32_t *ids, int generate, uint32_t *next_id);

/* Seconds the model has spent in ctxs_session_write_layer() since it was
 * created: what handing its K/V to the session cost, apart from computing
 * and encoding them (the ctxstore tool's demo times a save with it). */
double tinychat_kv_write_seconds(const tinychat_model *m);

/* The logits ([vocab] floats) behind the last *next_id the model returned;
 * valid until the next call on m. */
const float *tinychat_logits(const tinychat_model *m);

#ifdef __cplusplus
}
#endif

#endif
