/*
 * ctxstore_llama.h — llama.cpp's conversations kept in ctxstore sessions.
 *
 * libctxstore_llama (pkg-config ctxstore-llama) binds one sequence of a
 * llama_context to a ctxstore session: what llama.cpp decodes into that
 * sequence is saved into the session, token by token as it is decoded, and a
 * session is put back into a sequence so that the next llama_decode()
 * continues exactly as if the process had never stopped.
 *
 *     ctxs_model model;                                   // from the GGUF
 *     ctxs_llama_model_init(&model, st, "SmolLM2.gguf", lmodel, &cparams);
 *     ctxs_model_register(st, &model, "SmolLM2-135M");
 *
 *     ctxs_llama *lc;                                     // resume "chat", or
 *     ctxs_llama_start_info info;                         // fork a stored
 *     ctxs_llama_start(&lc, st, "chat", lctx, &model,     // prompt's prefix,
 *                      prompt, n_prompt, NULL, &info);    // or start empty
 *     if (info.how != CTXS_LLAMA_RESUMED)                 // info.n_tokens of
 *         ctxs_llama_decode(lc, prompt + info.n_tokens,   // the prompt are in
 *                           n_prompt - info.n_tokens);    // the context
 *     for (;;) {                                          // generate
 *         llama_token t = llama_sampler_sample(smpl, lctx, -1);
 *         ctxs_llama_decode(lc, &t, 1);                   // decode + save
 *     }
 *     ctxs_llama_close(lc);
 *
 * What it relies on in llama.cpp (public C API only; no patched engine):
 *
 * - The context has a unified KV cache (llama_context_params.kv_unified =
 *   true) and room for one sequence more than the app uses (n_seq_max >= 2):
 *   the adapter tags the new tokens' cells with that spare sequence
 *   (llama_memory_seq_cp, which copies no K/V in a unified cache), reads
 *   that sequence's state (llama_state_seq_get_data: only the tagged cells'
 *   rows), and drops the tag (llama_memory_seq_rm).
 * - The byte layout of a sequence's state as llama.cpp writes it (magic,
 *   sequence, then per cache block: streams, cells with their positions,
 *   then per layer the K rows and the V rows or, with a transposed V cache,
 *   V by element). It is read and written by src/llama/seq_state.c and
 *   checked on every call: a layout it does not know is refused with
 *   CTXS_EENGINE and a message, never misread. Written against llama.cpp
 *   0c1e570 (vendored by llama-cpp-python 0.3.36).
 * - Positions: token i of the conversation is at position i of the
 *   sequence (no context shift; llama_memory_seq_add breaks the binding).
 * - Cache types: f16 or bf16 for both K and V (type_k == type_v), stored in
 *   the session as they are, bit for bit; quantized caches (q8_0, q4_0, ...)
 *   use llama.cpp's block formats, which a session does not hold, and are
 *   refused (CTXS_EINVAL).
 * - Sliding-window models (Gemma 2 and 3, ...; llama.cpp's iSWA cache): the
 *   session keeps what the context keeps. llama.cpp's API does not say
 *   whether a context's window layers keep every position (swa_full = true,
 *   llama.cpp's default) or only their window, so the app says it: the
 *   cparams given to ctxs_llama_model_init() are those the context was made
 *   with. With swa_full = true every layer of the session keeps the whole
 *   history. With swa_full = false the session's window layers are rings
 *   (a layer schedule: the GGUF's <arch>.attention.sliding_window and
 *   window pattern), of as many slots as llama.cpp's cache for those
 *   layers has cells: S = n_swa * n_seq_max + n_ubatch, rounded up to 256,
 *   at most n_ctx (llama_kv_cache_iswa's size, relied on). A restore lays
 *   that cache out cell for cell as an uninterrupted run leaves it
 *   (position p in cell p mod S, the next ubatch starting at cell n mod S:
 *   llama.cpp's search for free cells, relied on, and checked by the
 *   tests), so that a resumed chat continues bit for bit as with swa_full.
 *   The two are two models (see ctxs_llama_model_init()): a session is
 *   restored into a context of its kind, and another is refused. Exact
 *   continuation assumes the bound sequence is the only one in the cache
 *   besides the spare.
 *   New tokens must be saved while their window layers still hold them:
 *   ctxs_llama_decode() decodes in pieces of at most n_swa tokens; an app
 *   that calls llama_decode() itself with longer batches in a context with
 *   swa_full = false may find ctxs_llama_save() refusing them.
 *
 * Costs, per call:
 * - ctxs_llama_save() of n new tokens: llama.cpp serializes the n tagged
 *   cells (a scan of its cell table, n_ctx entries, and n tokens' rows), the
 *   rows are written into the session (ctxs_session_write_layer: no page
 *   faults on the caller's thread) and committed with their ids: O(n), not
 *   O(context). With the session's durability (ASYNC by default).
 * - ctxs_llama_restore(): the session's held tokens are read from the
 *   mapping in llama.cpp's state layout and handed to
 *   llama_state_seq_set_data(): O(context; for a windowed session, its
 *   global layers' tokens plus S per window layer), the copy into
 *   llama.cpp's own cache, which holds its own copy of K/V (see
 *   docs/LLAMA.md for what zero-copy would need from llama.cpp). Where
 *   the K/V are in memory, in pieces of about 2 MiB that stay in the
 *   processor's cache between the two copies, each restored into the spare
 *   sequence and then tagged with the bound one (relied on: llama.cpp
 *   places each piece from the cell after the last one it filled, so the
 *   cells lie as one state's would); where they are on the disk, in one
 *   buffer, gathered layer after layer as they come in. That buffer
 *   outlives the handle: the process keeps the largest one a handle gave
 *   back (marked MADV_FREE, so that the kernel may take its pages under
 *   memory pressure) for the next resume, which then faults no fresh
 *   memory in. The K/V come from the disk as the library's thread reads the
 *   window ahead after the open; where it does not (a session opened with
 *   background = 0, or a window smaller than what it holds), the restore
 *   asks the kernel to read what it gathers ahead first (MADV_WILLNEED;
 *   every held token, but only the window of the window layers), instead
 *   of faulting them in a page at a time.
 * - ctxs_llama_rollback(): llama_memory_seq_rm() and the session's
 *   rollback; a sliding-window model whose window layers no longer hold what
 *   the rolled-back state needs (a restore gives them zeros for the
 *   positions attention no longer reads then, which a rollback may bring
 *   back into the window), or (swa_full = false) whose dropped cells
 *   wrap past the end of llama.cpp's ring of cells, is restored from the
 *   session. A windowed session rolls back at most S - n_swa tokens (what
 *   its rings and llama.cpp's cache still hold); further is CTXS_EEVICTED,
 *   and nothing changes.
 *
 * Errors are the library's codes (ctxstore.h); ctxs_get_last_error() says
 * why in words, as for every call of ctxstore. A handle is used by one thread at a time, as the
 * llama_context is.
 */
#ifndef CTXSTORE_LLAMA_H
#define CTXSTORE_LLAMA_H

#include <stdint.h>

#include "ctxstore.h"

#ifdef __cplusplus
extern "C" {
#endif

struct llama_model;
struct llama_context;
struct llama_context_params;

typedef struct ctxs_llama ctxs_llama;

/* The identity of a GGUF model for sessions of a context made with cparams
 * (those the context was made with: swa_full in particular): geometry from
 * the model's metadata (llama_model_n_layer, n_head_kv, and the head dim
 * that <arch>.attention.key_length states, else n_embd / n_head), dtype
 * from cparams->type_k, the weights hash of the file at gguf_path (cached
 * in st, which may be NULL), and the tokenizer hash of the vocabulary's
 * token strings in id order (ctxs_tokenizer_hash_strings). For a
 * sliding-window model with cparams->swa_full false, the geometry carries
 * the layer schedule (period: the window pattern; window: n_swa for the
 * window layers, 0 for the global ones), and the model hash is not the
 * weights' but ctxs_tokenizer_hash_strings() of three strings: "ctxstore-
 * llama: window layers keep their window", the weights' hash (16 bytes),
 * and the schedule (u32 period, u32 window[8], little-endian): the store
 * keys models by hash, and one GGUF under two schedules is two models.
 * Errors: CTXS_EINVAL (NULL; a cache type other than f16 or bf16, or K and V
 * of different types; K and V head dims that differ, or per-layer KV heads;
 * a window pattern longer than CTXS_SCHEDULE_MAX with swa_full false),
 * -errno and CTXS_ENOMEM from hashing the file. */
CTXS_API int ctxs_llama_model_init(ctxs_model *out, ctxs_store *st, const char *gguf_path,
                                   const struct llama_model *model,
                                   const struct llama_context_params *cparams);

typedef struct ctxs_llama_options {
    uint32_t version;       /* CTXS_LLAMA_OPTIONS_VERSION */
    int32_t seq_id;         /* the app's sequence (default 0) */
    int32_t spare_seq_id;   /* a sequence the app never uses, for the
                               adapter's reads; -1: llama_n_seq_max() - 1 */
    uint32_t open_flags;    /* ctxs_llama_start()'s open of a stored session:
                               CTXS_OPEN_VERIFY checks every token not yet
                               durable, as after a power loss */
    const ctxs_create_options *create; /* for new sessions (ctxs_llama_start);
                               NULL: capacity llama_n_ctx(), no ring */
    /* Version 2: */
    const ctxs_open_options *open; /* the handle ctxs_llama_start() opens,
                               forks or (without `create`) creates:
                               durability, background; NULL: the defaults */
} ctxs_llama_options;

#define CTXS_LLAMA_OPTIONS_VERSION 2u
#define CTXS_LLAMA_OPTIONS_INIT { CTXS_LLAMA_OPTIONS_VERSION, 0, -1, 0, NULL, NULL }
/* The defaults above, for bindings that cannot use the macro: 0, or
 * CTXS_EINVAL for NULL or a version this library does not know. Version 1
 * (without `open`) is still taken here and by the calls below, and only
 * its fields are read and written. */
CTXS_API int ctxs_llama_options_init(ctxs_llama_options *opts, uint32_t version);

/* Binds the sequence opts->seq_id of ctx to the session s (read-write,
 * opened for the model of ctx). Nothing moves: see ctxs_llama_restore().
 * The handle keeps pointers to ctx and s; it closes neither, and both must
 * outlive it.
 * Errors: CTXS_EINVAL (NULL, an options version this library does not know,
 * sequences out of range or equal, n_seq_max < 2,
 * a context whose cache is not unified, a session of another geometry or
 * layer schedule than ctx's model), CTXS_EREADONLY (s read-only),
 * CTXS_EENGINE (llama.cpp's state layout not recognised), CTXS_ENOMEM. */
CTXS_API int ctxs_llama_attach(ctxs_llama **out, struct llama_context *ctx, ctxs_session *s,
                               const ctxs_llama_options *opts);

/* Releases the binding; the session and the context stay as they are.
 * Accepts NULL. */
CTXS_API void ctxs_llama_detach(ctxs_llama *lc);

/* ctxs_llama_detach() and ctxs_session_close() of the session that
 * ctxs_llama_start() opened. Accepts NULL. */
CTXS_API void ctxs_llama_close(ctxs_llama *lc);

/* The session of lc. */
CTXS_API ctxs_session *ctxs_llama_get_session(const ctxs_llama *lc);

/* Puts the session's committed tokens into the bound sequence, which is
 * cleared first: their positions, K and V (llama_state_seq_set_data). The
 * next llama_decode() of position n_tokens continues as the process that
 * saved them would have.
 * Errors: CTXS_EFULL (more tokens than the context holds), CTXS_EEVICTED (a
 * ring session that no longer holds its first tokens), CTXS_EENGINE
 * (llama.cpp refused the state: for a windowed session, a context whose
 * cache for the window layers is smaller than S), CTXS_ENOMEM. On error the
 * sequence is empty. */
CTXS_API int ctxs_llama_restore(ctxs_llama *lc);

/* Saves the n tokens that the sequence holds after the session's committed
 * ones (positions n_tokens .. n_tokens + n - 1, decoded by llama_decode()
 * since the last save), with their ids: their K/V rows as llama.cpp holds
 * them, bit for bit, written into the session and committed.
 * Errors: CTXS_EINVAL (NULL, n == 0; the sequence does not hold those
 * positions, or a window layer no longer does: see the header's note; a
 * windowed session in a context whose window layers hold more than S
 * positions, that is one made with swa_full = true),
 * CTXS_EFULL (the session is full: the context's n_ctx is reached, or no
 * disk space), CTXS_EENGINE, the errors of ctxs_session_commit(). Nothing
 * is committed on error. */
CTXS_API int ctxs_llama_save(ctxs_llama *lc, const int32_t *tokens, uint32_t n);

/* llama_decode() of tokens[0..n) at the sequence's next positions, in
 * batches the context allows (and, for a sliding-window model, of at most
 * n_swa tokens), each saved as it is decoded; logits are computed for the
 * last token only. Errors: those of ctxs_llama_save(); CTXS_EENGINE
 * (llama_decode failed: its status is in the message). On error, the tokens
 * saved before it stay saved and the sequence holds exactly those. */
CTXS_API int ctxs_llama_decode(ctxs_llama *lc, const int32_t *tokens, uint32_t n);

/* Rolls both the session and the sequence back to n_tokens (a regenerated
 * answer). Errors: those of ctxs_session_rollback() (CTXS_EEVICTED: a
 * windowed session's rings no longer hold the window of n_tokens; the
 * session and the sequence are then as they were), CTXS_EENGINE. */
CTXS_API int ctxs_llama_rollback(ctxs_llama *lc, uint64_t n_tokens);

/* ctxs_checkpoint_restore() of the session, then the sequence brought to
 * the same count. Errors: those of ctxs_checkpoint_restore(),
 * CTXS_EENGINE. */
CTXS_API int ctxs_llama_checkpoint_restore(ctxs_llama *lc, const char *name);

typedef struct ctxs_llama_start_info {
    uint64_t n_tokens;         /* tokens in the sequence after the start */
    uint32_t how;              /* CTXS_LLAMA_RESUMED, _FORKED or _CREATED */
    uint32_t reserved_;
    char from[CTXS_NAME_MAX + 1]; /* _FORKED: the session whose prefix it took */
} ctxs_llama_start_info;

#define CTXS_LLAMA_RESUMED 1u /* the session existed: restored */
#define CTXS_LLAMA_FORKED 2u  /* a new session forked from a stored prompt */
#define CTXS_LLAMA_CREATED 3u /* a new, empty session */

/* Sets the attention windows of *opts (attn_period, attn_window,
 * attn_global_mask; see ctxs_open_options) to those of ctx's model: its
 * window layers read their last n_swa positions. A session kept with
 * swa_full = true holds every position of every layer (a schedule of
 * period 0); opened with these options, only what a restore reads of it is
 * brought in after the open (of Gemma 3's 15 window layers of 18, their
 * last 512 positions), and under memory pressure only that is kept.
 * ctxs_llama_start() sets them itself where its open options, or the open
 * part of its create options, are of version 2 and leave them zero; an
 * app that opens the session itself and attaches it calls this first. A
 * model without window layers, or whose pattern is longer than
 * CTXS_SCHEDULE_MAX layers, gets none (zeros), and every position is
 * brought in.
 * Errors: CTXS_EINVAL (NULL, options of version 1, which have no such
 * fields; a model with window layers that neither its GGUF nor the adapter
 * places). */
CTXS_API int ctxs_llama_attention_windows(ctxs_open_options *opts,
                                          const struct llama_context *ctx);

/* Opens the conversation name of store st in the bound sequence of ctx:
 * - if st has a session of that name, it is opened and restored
 *   (CTXS_LLAMA_RESUMED; prompt is not looked at);
 * - else, where ctxs_prefix_find() finds a stored session that starts like
 *   prompt[0..n_prompt), name is forked from it at the shared tokens (never
 *   the whole prompt: its last token is left to decode, for its logits) and
 *   restored (CTXS_LLAMA_FORKED);
 * - else name is created empty (CTXS_LLAMA_CREATED), capacity llama_n_ctx()
 *   and no ring unless opts->create says otherwise (for a windowed model,
 *   batch S - n_swa: rings of llama.cpp's S cells).
 * The session is opened, forked or created with opts->open (or the
 * defaults), its attention windows set by ctxs_llama_attention_windows()
 * where those options (of version 2) leave them zero.
 * info->n_tokens of the conversation are then in the sequence; the app
 * decodes the rest. model must be what ctxs_llama_model_init() gave, and
 * registered in st.
 * Errors: those of ctxs_store_session_open() (CTXS_EMODEL, saying so, for
 * a session saved under the other swa_full), _create(), _fork(),
 * ctxs_llama_attach() and ctxs_llama_restore(). */
CTXS_API int ctxs_llama_start(ctxs_llama **out, ctxs_store *st, const char *name,
                              struct llama_context *ctx, const ctxs_model *model,
                              const int32_t *prompt, uint32_t n_prompt,
                              const ctxs_llama_options *opts, ctxs_llama_start_info *info);

#ifdef __cplusplus
}
#endif

#endif
