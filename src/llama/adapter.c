/*
 * One sequence of a llama_context bound to a ctxstore session: save,
 * restore, decode, rollback and start (include/ctxstore_llama.h).
 *
 * The new tokens' K/V come out of llama.cpp through a spare sequence: their
 * cells are tagged with it (llama_memory_seq_cp, which in a unified cache
 * adds a sequence id to the cells and copies nothing), that sequence's state
 * is read (llama_state_seq_get_data writes only its cells' rows), and the
 * tag is dropped. So a save costs the new tokens' bytes plus a scan of
 * llama.cpp's cell table, never the context's bytes.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <llama.h>

#include "llama_internal.h"

struct ctxs_llama {
    struct llama_context *ctx;
    llama_memory_t mem;
    ctxs_session *s;
    int owns_session; /* ctxs_llama_start() opened it: ctxs_llama_close() closes it */
    int32_t seq, spare;
    uint32_t v_trans;  /* llama.cpp keeps V transposed (no flash attention) */
    uint32_t n_batch;  /* most tokens one llama_decode() takes */
    uint32_t capacity; /* the session's slots */
    uint32_t dtype;    /* the session's, and the cache's, element type */
    int window_cache_full; /* a restore may give window layers every
                              position (until llama.cpp says no room) */
    uint32_t swa_cells; /* a windowed session's: the cells of llama.cpp's
                           cache for the window layers */
    int64_t zeros_below; /* the last restore gave llama.cpp's window layers
                            zeros, not K/V, for the positions below this,
                            which attention no longer read then */
    ctxs__llama_shape shape;
    ctxs__seq_state parsed;
    uint8_t *buf; /* llama.cpp's state of a sequence (grow_state) */
    size_t buf_cap;
    uint8_t *rows; /* one layer's K then V rows, in position order */
    size_t rows_cap;
};

/* The bytes of options of a version: version 1 ends before `open`. 0 for
 * a version this library does not know. */
static size_t options_size(uint32_t version)
{
    return version == 1 ? offsetof(ctxs_llama_options, open)
           : version == CTXS_LLAMA_OPTIONS_VERSION ? sizeof(ctxs_llama_options)
                                                   : 0;
}

/* The defaults, overridden by what a caller's options of its version say. */
static int take_options(ctxs_llama_options *o, const ctxs_llama_options *opts, const char *call)
{
    *o = (ctxs_llama_options)CTXS_LLAMA_OPTIONS_INIT;
    if (!opts)
        return 0;
    const size_t size = options_size(opts->version);
    if (!size)
        return ctxs__llama_fail(CTXS_EINVAL,
                                "%s: ctxs_llama_options.version is %u; this library knows 1 "
                                "to %u",
                                call, opts->version, CTXS_LLAMA_OPTIONS_VERSION);
    memcpy(o, opts, size);
    return 0;
}

int ctxs_llama_options_init(ctxs_llama_options *opts, uint32_t version)
{
    ctxs__llama_clear_error();
    if (!opts)
        return ctxs__llama_fail(CTXS_EINVAL, "ctxs_llama_options_init(): opts is NULL");
    const size_t size = options_size(version);
    if (!size)
        return ctxs__llama_fail(CTXS_EINVAL,
                                "ctxs_llama_options_init(): options version %u is not known to "
                                "this library (it knows 1 to %u)",
                                version, CTXS_LLAMA_OPTIONS_VERSION);
    const ctxs_llama_options defaults = CTXS_LLAMA_OPTIONS_INIT;
    memcpy(opts, &defaults, size);
    opts->version = version;
    return 0;
}

static int grow(uint8_t **p, size_t *cap, size_t n)
{
    if (n <= *cap)
        return 0;
    uint8_t *q = realloc(*p, n);
    if (!q)
        return ctxs__llama_fail(CTXS_ENOMEM, "out of memory for %zu bytes of K/V", n);
    *p = q;
    *cap = n;
    return 0;
}

/* The buffer of llama.cpp's state of a sequence, at least n bytes. A
 * restore of K/V still on the disk writes the whole held conversation into
 * it (47 MB for SmolLM2 at 2048 tokens; of K/V in memory, 2 MiB at a
 * time), and the handle is new at each resume: faulting fresh memory in,
 * page by page, took 4 to 8 times as long as the copy into it
 * (bench_llama's resume). So a handle's buffer outlives it: the process
 * keeps the largest one a detach gave back, marked MADV_FREE (the kernel
 * takes its pages back under memory pressure, and they come back as zero
 * pages; untaken, they are written again with no fault), for the next
 * handle that needs one as large. Fresh buffers are faulted in by one call
 * (MADV_POPULATE_WRITE). What a buffer holds is scratch. */
typedef struct spare_buffer {
    uint8_t *buf;
    size_t cap;
} spare_buffer;

/* Taken and given by exchange, with no lock for a fork to catch held. */
static _Atomic(spare_buffer *) g_spare;

static void spare_free(spare_buffer *p)
{
    if (p) {
        munmap(p->buf, p->cap);
        free(p);
    }
}

/* Makes mine the spare unless the one there is larger; frees the other. */
static void keep_larger(spare_buffer *mine)
{
    spare_buffer *old = atomic_exchange(&g_spare, mine);
    if (old && old->cap > mine->cap)
        old = atomic_exchange(&g_spare, old); /* mine, or what came since */
    spare_free(old);
}

static void give_back(uint8_t *buf, size_t cap)
{
    if (!buf)
        return;
    spare_buffer *mine = malloc(sizeof *mine);
    if (!mine) {
        munmap(buf, cap);
        return;
    }
#ifdef MADV_FREE
    madvise(buf, cap, MADV_FREE);
#endif
    *mine = (spare_buffer){buf, cap};
    keep_larger(mine);
}

static int grow_state(ctxs_llama *lc, size_t n)
{
    if (n <= lc->buf_cap)
        return 0;
    uint8_t *at = NULL;
    size_t cap = 0;
    spare_buffer *spare = atomic_exchange(&g_spare, NULL);
    if (spare && spare->cap >= n) {
        at = spare->buf;
        cap = spare->cap;
        free(spare);
    } else if (spare) {
        keep_larger(spare); /* too small for this one: for the next */
    }
    if (!at) {
        const size_t unit = (size_t)64 << 10;
        cap = (n + unit - 1) / unit * unit;
        at = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (at == MAP_FAILED)
            return ctxs__llama_fail(CTXS_ENOMEM, "out of memory for %zu bytes of K/V", n);
#ifdef MADV_POPULATE_WRITE
        madvise(at, cap, MADV_POPULATE_WRITE); /* an older kernel faults as it goes */
#endif
    }
    give_back(lc->buf, lc->buf_cap);
    lc->buf = at;
    lc->buf_cap = cap;
    return 0;
}

/* --- The V layout of the context ----------------------------------------- */

/* Whether the context keeps V transposed is not in llama.cpp's API (it
 * follows flash attention, which "auto" decides at context creation): one
 * cell for the spare sequence is offered in each layout, and llama.cpp
 * accepts only its own. Its log is held back meanwhile: the refusal of the
 * other layout is expected. */
static void quiet_log(enum ggml_log_level level, const char *text, void *user)
{
    (void)level;
    (void)text;
    (void)user;
}

static int probe_v_layout(ctxs_llama *lc)
{
    const ctxs__seq_shape *shape = &lc->shape.seq;
    uint32_t cells[CTXS__SEQ_MAX_BLOCKS] = {1, 1};
    int32_t first[CTXS__SEQ_MAX_BLOCKS] = {0, 0};
    const size_t size = ctxs__seq_size(shape, cells);
    int rc = grow_state(lc, size);
    if (rc < 0)
        return rc;
    ggml_log_callback prev_cb;
    void *prev_user;
    llama_log_get(&prev_cb, &prev_user);
    llama_log_set(quiet_log, NULL);
    int found = -1;
    for (uint32_t trans = 0; trans < 2 && found < 0; trans++) {
        uint8_t *k[CTXS__SEQ_MAX_BLOCKS][CTXS__SEQ_MAX_LAYERS];
        uint8_t *v[CTXS__SEQ_MAX_BLOCKS][CTXS__SEQ_MAX_LAYERS];
        memset(lc->buf, 0, size);
        ctxs__seq_build(lc->buf, shape, lc->spare, cells, first, NULL, trans, k, v);
        if (llama_state_seq_set_data(lc->ctx, lc->buf, size, lc->spare) == size)
            found = (int)trans;
        llama_memory_seq_rm(lc->mem, lc->spare, -1, -1);
    }
    llama_log_set(prev_cb, prev_user);
    if (found < 0)
        return ctxs__llama_fail(CTXS_EENGINE,
                                "llama.cpp accepts a sequence state in neither V layout: its "
                                "state format is not the one this adapter knows, or the "
                                "context's cache is not unified");
    lc->v_trans = (uint32_t)found;
    return 0;
}

/* --- Attach --------------------------------------------------------------- */

/* The cells of llama.cpp's cache for the window layers of a context made
 * with swa_full = false (llama_kv_cache_iswa: n_swa for each sequence of a
 * unified cache, plus a ubatch, rounded up to 256, at most n_ctx). */
static uint32_t window_cells(struct llama_context *ctx, uint32_t n_swa)
{
    uint64_t want = (uint64_t)n_swa * llama_n_seq_max(ctx) + llama_n_ubatch(ctx);
    if (want > llama_n_ctx(ctx))
        want = llama_n_ctx(ctx);
    return (uint32_t)((want + 255) / 256 * 256);
}

int ctxs_llama_attach(ctxs_llama **out, struct llama_context *ctx, ctxs_session *s,
                      const ctxs_llama_options *opts)
{
    ctxs__llama_clear_error();
    if (!out)
        return ctxs__llama_fail(CTXS_EINVAL, "ctxs_llama_attach: out is NULL");
    *out = NULL;
    ctxs_llama_options o;
    int rc = take_options(&o, opts, "ctxs_llama_attach");
    if (rc < 0)
        return rc;
    if (!ctx || !s)
        return ctxs__llama_fail(CTXS_EINVAL, "ctxs_llama_attach: a NULL context or session");
    const int32_t n_seq = (int32_t)llama_n_seq_max(ctx);
    if (o.spare_seq_id < 0)
        o.spare_seq_id = n_seq - 1;
    if (n_seq < 2)
        return ctxs__llama_fail(CTXS_EINVAL,
                                "the context has n_seq_max = %d: the adapter needs one sequence "
                                "besides the app's (create it with n_seq_max >= 2 and "
                                "kv_unified = true)",
                                n_seq);
    if (o.seq_id < 0 || o.seq_id >= n_seq || o.spare_seq_id >= n_seq || o.seq_id == o.spare_seq_id)
        return ctxs__llama_fail(CTXS_EINVAL,
                                "sequences %d (the app's) and %d (spare) must differ and be "
                                "below n_seq_max = %d",
                                o.seq_id, o.spare_seq_id, n_seq);
    ctxs_session_info info;
    rc = ctxs_session_get_info(&info, s);
    if (rc < 0)
        return ctxs__llama_fail(rc, "the session: %s", ctxs_strerror(rc));
    if (info.flags & CTXS_INFO_READONLY)
        return ctxs__llama_fail(CTXS_EREADONLY, "the session is open read-only");

    ctxs_llama *lc = calloc(1, sizeof(*lc));
    if (!lc)
        return ctxs__llama_fail(CTXS_ENOMEM, "out of memory");
    lc->ctx = ctx;
    lc->mem = llama_get_memory(ctx);
    lc->s = s;
    lc->seq = o.seq_id;
    lc->spare = o.spare_seq_id;
    lc->n_batch = llama_n_batch(ctx);
    lc->capacity = info.capacity;
    lc->dtype = info.model.geometry.dtype;
    lc->window_cache_full = 1;
    if ((rc = ctxs__llama_shape_of(&lc->shape, llama_get_model(ctx), &info.model.geometry)) < 0 ||
        (rc = probe_v_layout(lc)) < 0) {
        ctxs_llama_detach(lc);
        return rc;
    }
    if (lc->shape.windowed)
        lc->swa_cells = window_cells(ctx, lc->shape.n_swa);
    *out = lc;
    return 0;
}

void ctxs_llama_detach(ctxs_llama *lc)
{
    if (!lc)
        return;
    give_back(lc->buf, lc->buf_cap);
    free(lc->rows);
    free(lc);
}

void ctxs_llama_close(ctxs_llama *lc)
{
    if (!lc)
        return;
    ctxs_session *s = lc->owns_session ? lc->s : NULL;
    ctxs_llama_detach(lc);
    ctxs_session_close(s);
}

ctxs_session *ctxs_llama_get_session(const ctxs_llama *lc)
{
    return lc ? lc->s : NULL;
}

/* --- Save ------------------------------------------------------------------ */

/* Gathers one layer's K and V rows of block b's cells into lc->rows, K
 * then V, each [n][n_kv_heads][head_dim] in position order: cell i holds
 * position first + order[i]. */
static void gather_layer(ctxs_llama *lc, const ctxs__seq_block *b, uint32_t j, int32_t first)
{
    const size_t row = lc->shape.seq.row_bytes, n = b->n_cells;
    uint8_t *k = lc->rows, *v = lc->rows + n * row;
    for (uint32_t i = 0; i < n; i++) {
        const size_t at = (size_t)(ctxs__seq_cell_pos(b, i) - first) * row;
        memcpy(k + at, b->k[j] + i * row, row);
        if (!b->v_trans) {
            memcpy(v + at, b->v[j] + i * row, row);
            continue;
        }
        /* transposed: element e of every cell is one run of n */
        for (size_t e = 0; e < row / 2; e++)
            memcpy(v + at + 2 * e, b->v[j] + (e * n + i) * 2, 2);
    }
}

/* Checks that every block holds positions first .. first + n - 1, each
 * once. */
static int check_cells(const ctxs_llama *lc, uint32_t n, int32_t first)
{
    for (uint32_t b = 0; b < lc->parsed.n_blocks; b++) {
        const ctxs__seq_block *blk = &lc->parsed.block[b];
        if (blk->n_cells != n)
            return ctxs__llama_fail(
                CTXS_EINVAL,
                "llama.cpp's %s layers hold %u of the %u positions %d..%d: %s",
                b ? "window" : "global", blk->n_cells, n, first, first + (int32_t)n - 1,
                b ? "decode at most n_swa tokens per llama_decode() (ctxs_llama_decode does) "
                    "or create the context with swa_full = true"
                  : "save the tokens right after decoding them, at the positions after the "
                    "session's");
        for (uint32_t i = 0; i < n; i++) {
            const int32_t pos = ctxs__seq_cell_pos(blk, i);
            if (pos < first || pos >= first + (int32_t)n)
                return ctxs__llama_fail(CTXS_EINVAL, "llama.cpp holds position %d among %d..%d",
                                        pos, first, first + (int32_t)n - 1);
        }
    }
    return 0;
}

/* Copies positions first .. first + n - 1 of the app's sequence into the
 * session as tokens i .. i + n - 1 of reservation r. */
static int save_piece(ctxs_llama *lc, const ctxs_reservation *r, uint32_t i, uint32_t n,
                      int32_t first)
{
    const ctxs__seq_shape *shape = &lc->shape.seq;
    uint32_t cells[CTXS__SEQ_MAX_BLOCKS] = {n, n};
    const size_t size = ctxs__seq_size(shape, cells);
    int rc = grow_state(lc, size);
    if (rc < 0 || (rc = grow(&lc->rows, &lc->rows_cap, 2 * (size_t)n * shape->row_bytes)) < 0)
        return rc;
    llama_memory_seq_cp(lc->mem, lc->seq, lc->spare, first, first + (int32_t)n);
    const size_t got = llama_state_seq_get_data(lc->ctx, lc->buf, lc->buf_cap, lc->spare);
    llama_memory_seq_rm(lc->mem, lc->spare, -1, -1);
    if (got == 0)
        return ctxs__llama_fail(CTXS_EINVAL,
                                "llama.cpp holds more than positions %d..%d for the sequence "
                                "(its state did not fit %zu bytes)",
                                first, first + (int32_t)n - 1, lc->buf_cap);
    const char *why;
    if (ctxs__seq_parse(&lc->parsed, lc->buf, got, shape, &why) < 0)
        return ctxs__llama_fail(CTXS_EENGINE, "llama.cpp's sequence state: %s", why);
    if ((rc = check_cells(lc, n, first)) < 0)
        return rc;
    for (uint32_t b = 0; b < lc->parsed.n_blocks; b++) {
        const ctxs__seq_block *blk = &lc->parsed.block[b];
        for (uint32_t j = 0; j < blk->n_layers; j++) {
            gather_layer(lc, blk, j, first);
            rc = ctxs_session_write_layer(lc->s, r, lc->shape.layer_of[b][j], i, n, lc->rows,
                                          lc->rows + (size_t)n * shape->row_bytes, lc->dtype);
            if (rc < 0)
                return ctxs__llama_fail(rc, "writing layer %u into the session: %s",
                                        lc->shape.layer_of[b][j], ctxs_strerror(rc));
        }
    }
    return 0;
}

int ctxs_llama_save(ctxs_llama *lc, const int32_t *tokens, uint32_t n)
{
    ctxs__llama_clear_error();
    if (!lc || !tokens || n == 0)
        return ctxs__llama_fail(CTXS_EINVAL, "ctxs_llama_save: NULL, or no tokens");
    ctxs_session_info info;
    int rc = ctxs_session_get_info(&info, lc->s);
    if (rc < 0)
        return ctxs__llama_fail(rc, "the session: %s", ctxs_strerror(rc));
    if (info.n_tokens + n > (uint64_t)INT32_MAX)
        return ctxs__llama_fail(CTXS_EINVAL, "positions past llama.cpp's range");
    const int32_t first = (int32_t)info.n_tokens;
    if (llama_memory_seq_pos_max(lc->mem, lc->seq) < first + (int32_t)n - 1)
        return ctxs__llama_fail(CTXS_EINVAL,
                                "the sequence ends at position %d; the session holds %d tokens, "
                                "so %u more need positions up to %d",
                                llama_memory_seq_pos_max(lc->mem, lc->seq), first, n,
                                first + (int32_t)n - 1);
    for (uint32_t i = 0; i < n; i++)
        if (tokens[i] < 0)
            return ctxs__llama_fail(CTXS_EINVAL, "token %u is %d", i, tokens[i]);
    if (lc->shape.windowed) {
        /* llama.cpp keeps a sequence's positions as one run: in a cache of
         * swa_cells cells for the window layers, at most that many. More
         * is a context that keeps every position (swa_full = true), whose
         * restores from windowed layers would not continue bit for bit. */
        const llama_pos lo = llama_memory_seq_pos_min(lc->mem, lc->seq);
        const llama_pos hi = llama_memory_seq_pos_max(lc->mem, lc->seq);
        if (hi - lo + 1 > (llama_pos)lc->swa_cells)
            return ctxs__llama_fail(
                CTXS_EINVAL,
                "llama.cpp's window layers hold positions %d..%d, more than the %u cells a "
                "context with swa_full = false keeps: the session's model (window layers "
                "that keep their window) was made for another kind of context; make it with "
                "this context's parameters (ctxs_llama_model_init)",
                lo, hi, lc->swa_cells);
    }
    ctxs_reservation r;
    if ((rc = ctxs_session_reserve(&r, lc->s, n)) < 0)
        return ctxs__llama_fail(rc,
                                rc == CTXS_EFULL
                                    ? "the session has no room for %u more tokens after %d "
                                      "(its capacity, the context's n_ctx, or the disk)"
                                    : "reserving %u tokens after %d: failed",
                                n, first);
    /* A window layer keeps its last n_swa positions: read them before a
     * later piece's cells push them out of what llama.cpp serializes. */
    const uint32_t step = lc->shape.n_swa ? lc->shape.n_swa : n;
    for (uint32_t i = 0; i < n && rc >= 0; i += step) {
        const uint32_t m = n - i < step ? n - i : step;
        rc = save_piece(lc, &r, i, m, first + (int32_t)i);
    }
    if (rc >= 0 && (rc = ctxs_session_commit(lc->s, (const uint32_t *)tokens, n)) < 0)
        return ctxs__llama_fail(rc, "committing %u tokens: %s", n, ctxs_strerror(rc));
    if (rc < 0)
        ctxs_session_rollback(lc->s, info.n_tokens); /* releases the reservation */
    return rc < 0 ? rc : 0;
}

static int follow_rollback(ctxs_llama *lc, uint64_t n);

/* After a failed decode or save: the sequence back to the n saved tokens,
 * as a rollback leaves it, the failure's reason kept. */
static void drop_unsaved(ctxs_llama *lc, uint64_t n)
{
    char why[512];
    const int rc = ctxs_get_last_error_code();
    snprintf(why, sizeof why, "%s", ctxs_get_last_error());
    follow_rollback(lc, n);
    ctxs__llama_fail(rc, "%s", why);
}

int ctxs_llama_decode(ctxs_llama *lc, const int32_t *tokens, uint32_t n)
{
    ctxs__llama_clear_error();
    if (!lc || (!tokens && n))
        return ctxs__llama_fail(CTXS_EINVAL, "ctxs_llama_decode: a NULL argument");
    ctxs_session_info info;
    int rc = ctxs_session_get_info(&info, lc->s);
    if (rc < 0)
        return ctxs__llama_fail(rc, "the session: %s", ctxs_strerror(rc));
    uint32_t step = lc->n_batch;
    if (lc->shape.n_swa && lc->shape.n_swa < step)
        step = lc->shape.n_swa;
    llama_batch batch = llama_batch_init((int32_t)step, 0, 1);
    for (uint32_t i = 0; i < n; i += step) {
        const uint32_t m = n - i < step ? n - i : step;
        batch.n_tokens = (int32_t)m;
        for (uint32_t t = 0; t < m; t++) {
            batch.token[t] = tokens[i + t];
            batch.pos[t] = (llama_pos)(info.n_tokens + i + t);
            batch.n_seq_id[t] = 1;
            batch.seq_id[t][0] = lc->seq;
            batch.logits[t] = i + t == n - 1;
        }
        const int32_t status = llama_decode(lc->ctx, batch);
        if (status != 0)
            rc = ctxs__llama_fail(CTXS_EENGINE, "llama_decode of %u tokens at position %llu: %d",
                                  m, (unsigned long long)(info.n_tokens + i), status);
        else
            rc = ctxs_llama_save(lc, tokens + i, m);
        if (rc < 0) {
            /* The sequence keeps exactly what was saved. */
            drop_unsaved(lc, info.n_tokens + i);
            break;
        }
    }
    llama_batch_free(batch);
    return rc < 0 ? rc : 0;
}

/* --- Restore ------------------------------------------------------------- */

/* The cells a restore gives one of llama.cpp's cache blocks: k cells, cell
 * i holding position first + (i - rot) mod k; positions below `from` are
 * ones the block keeps but attention no longer reads (a window layer's
 * oldest), given as zeros. */
typedef struct cells_plan {
    uint32_t k, rot;
    int32_t first;
    int64_t from;
} cells_plan;

/* A stretch of a plan's cells, from cell i on, whose positions and slots
 * both run on: len cells from slot `slot` of a run of `slots` slots, or,
 * if zeros, cells attention no longer reads. */
typedef struct cells_span {
    uint32_t len, slot;
    int zeros;
} cells_span;

static cells_span span_at(const cells_plan *c, uint32_t i, uint32_t slots)
{
    const int64_t p = c->first + (int64_t)((i + c->k - c->rot) % c->k);
    cells_span sp = {(i < c->rot ? c->rot : c->k) - i, 0, p < c->from};
    if (sp.zeros) {
        if ((int64_t)sp.len > c->from - p)
            sp.len = (uint32_t)(c->from - p);
    } else {
        sp.slot = (uint32_t)(p % slots);
        if (sp.len > slots - sp.slot)
            sp.len = slots - sp.slot;
    }
    return sp;
}

/* n rows of K or V, every head of each: row t's head h from slot t of run
 * h (runs head_stride apart, slots hd_bytes), each row written whole before
 * the next, so that the rows are stored once, in order, while the runs are
 * read along. Copied head by head, a row's lines were stored once per head,
 * far apart: in a program of its own, the gather of SmolLM2's 2048 tokens
 * (3 heads of 128 bytes) took 3.4-3.7 ms token by token against 5.0 head
 * by head, and 3.6 against 7.3 into a buffer marked MADV_FREE, as the
 * state buffer is kept. The sizes of real models' heads are copied as
 * constants, which the compiler turns into a few vector moves. */
static void copy_rows(uint8_t *dst, const uint8_t *run, size_t head_stride, uint32_t n_heads,
                      uint32_t n, size_t hd_bytes)
{
#define CTXS__ROWS(bytes)                                                                          \
    for (uint32_t t = 0; t < n; t++)                                                               \
        for (uint32_t h = 0; h < n_heads; h++)                                                     \
            memcpy(dst + ((size_t)t * n_heads + h) * (bytes),                                      \
                   run + h * head_stride + (size_t)t * (bytes), (bytes));                          \
    return
    switch (hd_bytes) {
    case 128: CTXS__ROWS(128);
    case 256: CTXS__ROWS(256);
    case 512: CTXS__ROWS(512);
    default: CTXS__ROWS(hd_bytes);
    }
#undef CTXS__ROWS
}

/* One layer's K, or V, into block rows: the cells of plan c from the
 * session's runs of the layer's heads at `run` (head h at h *
 * head_stride; `slots` slots each, position p in slot p mod slots: a
 * window layer's ring, or a global layer's positions). Rows of all heads
 * (row_bytes = n_kv_heads x head_dim elements), or transposed (element e
 * of head h is row h * head_dim + e of k elements, as llama.cpp keeps V
 * without flash attention). */
static void gather_session_layer(uint8_t *dst, const uint8_t *run, size_t head_stride,
                                 uint32_t slots, const cells_plan *c,
                                 const ctxs__llama_shape *shape, int trans)
{
    const size_t row = shape->seq.row_bytes, hd = shape->head_dim, hd_bytes = hd * 2;
    const uint32_t n_heads = shape->n_kv_heads;
    for (uint32_t i = 0; i < c->k;) {
        const cells_span sp = span_at(c, i, slots);
        if (!trans) {
            if (sp.zeros)
                memset(dst + (size_t)i * row, 0, (size_t)sp.len * row);
            else if (n_heads == 1) /* the rows are the run's slots */
                memcpy(dst + (size_t)i * row, run + (size_t)sp.slot * row, (size_t)sp.len * row);
            else
                copy_rows(dst + (size_t)i * row, run + (size_t)sp.slot * hd_bytes, head_stride,
                          n_heads, sp.len, hd_bytes);
            i += sp.len;
            continue;
        }
        for (uint32_t h = 0; h < n_heads; h++) {
            const uint8_t *src = run + h * head_stride + (size_t)sp.slot * hd_bytes;
            for (size_t e = 0; e < hd; e++) {
                uint8_t *d = dst + ((h * hd + e) * c->k + i) * 2;
                if (sp.zeros) {
                    memset(d, 0, (size_t)sp.len * 2);
                    continue;
                }
                for (uint32_t t = 0; t < sp.len; t++)
                    memcpy(d + 2 * t, src + t * hd_bytes + 2 * e, 2);
            }
        }
        i += sp.len;
    }
}

/* Bytes of llama.cpp's state handed over per call of a restore whose K/V
 * are in memory. Handed over whole, the held conversation was gathered
 * into a buffer larger than the processor's caches (47 MB for SmolLM2 at
 * 2048 tokens), written out to memory, and read back from it by
 * llama.cpp's copy into its cache; a piece of this size stays cached
 * between the two, as llama.cpp's own load of a state file reads a layer
 * at a time into a buffer it reuses. Inside a warm resume of SmolLM2 at
 * 2048 tokens (bench_llama, the two taking turns): the restore took
 * 15-17.5 ms in pieces (median 16.3) against 18-29 whole (median 20),
 * llama.cpp's copy 7-9 ms of it either way. A second
 * thread gathering the next piece while llama.cpp copied one gained
 * nothing measurable (14-18.7 ms) beside the library's thread bringing the
 * session in on the other core. */
#define RESTORE_PIECE_BYTES ((size_t)2 << 20)

/* The next piece of plan c from its cell `done` on: at most `most` cells,
 * never across the cell of the first position, so that the piece's
 * positions run on from its first cell. */
static cells_plan next_piece(const cells_plan *c, uint32_t done, uint32_t most)
{
    if (done >= c->k)
        return (cells_plan){0, 0, 0, c->from};
    const uint32_t end = done < c->rot ? c->rot : c->k;
    const uint32_t len = end - done < most ? end - done : most;
    const int32_t first = c->first + (int32_t)((done + c->k - c->rot) % c->k);
    return (cells_plan){len, 0, first, c->from};
}

/* Whether the session's K/V that a restore reads are in
 * memory, asked of the page of the first position attention reads in the
 * first run of the first layer and of the last one in the last run of the
 * last layer: the library's thread brings a session in run after run, in
 * file order, each run's positions as attention plans them (a window
 * layer's last n_swa), and a dropped cache loses both. */
static int held_in_memory(ctxs_llama *lc)
{
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uint32_t layers[2] = {0, lc->shape.n_layers - 1};
    for (uint32_t i = 0; i < 2; i++) {
        ctxs_layout one;
        ctxs_attn_plan plan;
        if (ctxs_session_get_layer_attn(&one, &plan, lc->s, layers[i], 0) < 0 || !plan.n_spans)
            return 0;
        const ctxs_attn_span *first = &plan.spans[0], *last = &plan.spans[plan.n_spans - 1];
        const uint8_t *at =
            i == 0 ? (const uint8_t *)one.kv + (size_t)first->slot * one.slot_bytes
                   : (const uint8_t *)one.kv + one.layer_stride -
                         (size_t)(one.capacity - (last->slot + last->count - 1)) * one.slot_bytes;
        unsigned char in = 0;
        if (mincore((void *)((uintptr_t)at & ~(page - 1)), 1, &in) != 0 || !(in & 1))
            return 0;
    }
    return 1;
}

/* Builds into buf the state that piece[b] gives each block, for the spare
 * sequence, from the session's K/V, and returns its size in *size. */
static int gather_piece(ctxs_llama *lc, const cells_plan *piece, uint8_t *buf, size_t *size)
{
    const ctxs__seq_shape *shape = &lc->shape.seq;
    uint32_t cells[CTXS__SEQ_MAX_BLOCKS];
    int32_t first[CTXS__SEQ_MAX_BLOCKS];
    for (uint32_t b = 0; b < shape->n_blocks; b++) {
        cells[b] = piece[b].k;
        first[b] = piece[b].first;
    }
    *size = ctxs__seq_size(shape, cells);
    uint8_t *k[CTXS__SEQ_MAX_BLOCKS][CTXS__SEQ_MAX_LAYERS];
    uint8_t *v[CTXS__SEQ_MAX_BLOCKS][CTXS__SEQ_MAX_LAYERS];
    ctxs__seq_build(buf, shape, lc->spare, cells, first, NULL, lc->v_trans, k, v);
    for (uint32_t b = 0; b < shape->n_blocks; b++) {
        if (!cells[b])
            continue;
        for (uint32_t j = 0; j < shape->n_layers[b]; j++) {
            const uint32_t il = lc->shape.layer_of[b][j];
            ctxs_layout one;
            ctxs_attn_plan unused;
            int rc = ctxs_session_get_layer_attn(&one, &unused, lc->s, il, 0);
            if (rc < 0)
                return ctxs__llama_fail(rc, "layer %u of the session: %s", il, ctxs_strerror(rc));
            const uint8_t *kr = (const uint8_t *)one.kv;
            gather_session_layer(k[b][j], kr, one.head_stride, one.capacity, &piece[b],
                                 &lc->shape, 0);
            gather_session_layer(v[b][j], kr + one.kv_stride, one.head_stride, one.capacity,
                                 &piece[b], &lc->shape, (int)lc->v_trans);
        }
    }
    return 0;
}

/* Hands a gathered piece to llama.cpp for the spare sequence, then tags
 * its cells with the bound sequence too (llama_memory_seq_cp: no copy).
 * Returns 0, or 1 if llama.cpp refused it. */
static int hand_piece(ctxs_llama *lc, const uint8_t *buf, size_t size, int quiet)
{
    ggml_log_callback prev_cb = NULL;
    void *prev_user = NULL;
    if (quiet) {
        llama_log_get(&prev_cb, &prev_user);
        llama_log_set(quiet_log, NULL);
    }
    const size_t got = llama_state_seq_set_data(lc->ctx, buf, size, lc->spare);
    if (quiet)
        llama_log_set(prev_cb, prev_user);
    if (got != size)
        return 1;
    llama_memory_seq_cp(lc->mem, lc->spare, lc->seq, -1, -1);
    return 0;
}

/* Gives the sequence the cells plan[b] gives each block. The state goes to
 * llama.cpp in pieces, each restored into the spare sequence (llama.cpp
 * empties the sequence a state is for before it places it, where the
 * bound sequence would lose what the pieces before gave it) and then
 * tagged with the bound sequence. llama.cpp places each piece from the
 * cell after the last one filled, so the cells lie as one state of them
 * all would lie. Where the K/V are in memory, pieces of about
 * RESTORE_PIECE_BYTES; where they are still coming from the disk, one
 * piece of them all, gathered layer after layer as the library's thread
 * reads them in (pieces across every layer would wait for most of the file
 * first: 39-42 ms against 33-37 cold, SmolLM2 at 2048 tokens). Returns 0,
 * 1 if llama.cpp refused a piece or placed the cells otherwise than the
 * plan (its cache for the window layers reuses the cells of positions its
 * window has passed, where one state of them all is refused), or an error;
 * on 1 or an error the sequence holds nothing. Records where the zeros the
 * plan gives end (lc->zeros_below). */
static int put_state(ctxs_llama *lc, const cells_plan *plan, int quiet)
{
    const ctxs__seq_shape *shape = &lc->shape.seq;
    const uint32_t blocks = shape->n_blocks;
    uint32_t most = UINT32_MAX;
    if (held_in_memory(lc)) {
        size_t cell_bytes = 0;
        for (uint32_t b = 0; b < blocks; b++)
            cell_bytes += 2 * (size_t)shape->n_layers[b] * shape->row_bytes;
        const size_t cells = RESTORE_PIECE_BYTES / cell_bytes;
        most = cells < 64 ? 64 : cells > UINT32_MAX ? UINT32_MAX : (uint32_t)cells;
    }
    uint32_t largest[CTXS__SEQ_MAX_BLOCKS], done[CTXS__SEQ_MAX_BLOCKS] = {0};
    for (uint32_t b = 0; b < blocks; b++)
        largest[b] = plan[b].k < most ? plan[b].k : most;
    int rc = grow_state(lc, ctxs__seq_size(shape, largest));
    if (rc < 0)
        return rc;
    llama_memory_seq_rm(lc->mem, lc->seq, -1, -1);
    llama_memory_seq_rm(lc->mem, lc->spare, -1, -1);
    for (;;) {
        cells_plan piece[CTXS__SEQ_MAX_BLOCKS];
        uint32_t any = 0;
        for (uint32_t b = 0; b < blocks; b++) {
            piece[b] = next_piece(&plan[b], done[b], most);
            done[b] += piece[b].k;
            any |= piece[b].k;
        }
        size_t size = 0;
        if (!any || (rc = gather_piece(lc, piece, lc->buf, &size)) != 0 ||
            (rc = hand_piece(lc, lc->buf, size, quiet)) != 0)
            break;
    }
    llama_memory_seq_rm(lc->mem, lc->spare, -1, -1);
    const cells_plan *last = &plan[blocks - 1];
    if (rc == 0 && last->k && llama_memory_seq_pos_min(lc->mem, lc->seq) != last->first)
        rc = 1;
    if (rc != 0)
        llama_memory_seq_rm(lc->mem, lc->seq, -1, -1);
    lc->zeros_below = 0;
    for (uint32_t b = 0; rc == 0 && b < blocks; b++)
        if (plan[b].from > lc->zeros_below)
            lc->zeros_below = plan[b].from;
    return rc;
}

/* Asks the kernel to read `count` slots from `slot` on in every run of
 * a layer (runs of its K and V heads at kv, one.kv_stride and
 * one.head_stride apart). */
static void advise_slots(const ctxs_layout *one, uint32_t n_heads, uint64_t slot, uint64_t count)
{
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (uint32_t kind = 0; kind < 2; kind++)
        for (uint32_t h = 0; h < n_heads; h++) {
            const uintptr_t at = (uintptr_t)one->kv + kind * one->kv_stride +
                                 h * one->head_stride + slot * one->slot_bytes;
            const uintptr_t from = at & ~(page - 1);
            madvise((void *)from, at + count * one->slot_bytes - from, MADV_WILLNEED);
        }
}

/* Asks the kernel to read the slots of the positions the restore reads
 * from the disk, ahead of the gather, where the library's thread does not
 * bring them in after the open (no background option, or a window smaller
 * than what the session holds): positions 0 .. n - 1 of the global
 * layers, and of the window layers those from window_from on (below, a
 * restore gives zeros; a ring's slots are positions mod its capacity).
 * The KV is mapped for random access, so the gather would otherwise fault
 * them in a page at a time: a cold restore of SmolLM2's 2048 tokens took
 * 0.7 s that way, and 53-67 ms read ahead (the state file: 34-38 ms).
 * Where the thread reads the window, asking again only slows the restore
 * (55 ms against 41). */
static void read_ahead(ctxs_llama *lc, uint64_t n, uint64_t window_from)
{
    for (uint32_t b = 0; b < lc->shape.seq.n_blocks; b++)
        for (uint32_t j = 0; j < lc->shape.seq.n_layers[b]; j++) {
            ctxs_layout one;
            ctxs_attn_plan unused;
            if (ctxs_session_get_layer_attn(&one, &unused, lc->s, lc->shape.layer_of[b][j], 0) < 0)
                return; /* the gather reports it */
            const uint64_t from = b == 1 && window_from < n ? window_from : 0;
            const uint64_t count = n - from, cap = one.capacity;
            if (count >= cap) {
                advise_slots(&one, lc->shape.n_kv_heads, 0, cap);
            } else {
                const uint64_t slot = from % cap, run_on = cap - slot;
                advise_slots(&one, lc->shape.n_kv_heads, slot, count < run_on ? count : run_on);
                if (count > run_on)
                    advise_slots(&one, lc->shape.n_kv_heads, 0, count - run_on);
            }
        }
}

/* Frees the cell of position p in llama.cpp's cache for the window layers
 * only: the global layers' cell of p is kept through the spare sequence
 * while p leaves the app's, and the spare leaves the window layers' cache
 * through a state that llama.cpp refuses right after dropping the
 * sequence it is for from that cache (LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY:
 * that cache alone; a cell naming two sequences is refused before
 * anything is placed). A freed cell below llama.cpp's search start
 * becomes the start. */
static int free_window_cell(ctxs_llama *lc, llama_pos p)
{
    const struct {
        uint32_t magic;
        int32_t seq;
        uint32_t n_stream, n_cells;
        int32_t pos;
        uint32_t n_seq;
        int32_t seq_ids[2];
    } refused = {CTXS__SEQ_MAGIC, lc->spare, 1, 1, p, 2, {lc->spare, lc->seq}};
    llama_memory_seq_cp(lc->mem, lc->seq, lc->spare, p, p + 1);
    llama_memory_seq_rm(lc->mem, lc->seq, p, p + 1);
    ggml_log_callback prev_cb;
    void *prev_user;
    llama_log_get(&prev_cb, &prev_user);
    llama_log_set(quiet_log, NULL);
    const size_t took = llama_state_seq_set_data_ext(lc->ctx, (const uint8_t *)&refused,
                                                     sizeof refused, lc->spare,
                                                     LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
    llama_log_set(prev_cb, prev_user);
    llama_memory_seq_cp(lc->mem, lc->spare, lc->seq, p, p + 1);
    llama_memory_seq_rm(lc->mem, lc->spare, -1, -1);
    if (took != 0 || llama_memory_seq_pos_min(lc->mem, lc->seq) != p + 1)
        return ctxs__llama_fail(CTXS_EENGINE,
                                "llama.cpp's cache for the window layers did not free the cell "
                                "of position %d as this adapter expects of it",
                                p);
    return 0;
}

/* A windowed session's n tokens as llama.cpp's caches hold them after an
 * uninterrupted run of a context with swa_full = false. Its global layers
 * hold cells 0 .. n - 1. Its window layers' cache of S cells is a ring:
 * llama.cpp takes the next free or masked cell from where the last ubatch
 * ended, so position p lies in cell p mod S, and the cache holds the last
 * S positions. llama.cpp sums attention over the cells in cell order, so
 * the same bits need the same cells; the cells attention no longer reads
 * (below n - window) are masked, their values never reach a sum, and are
 * given as zeros. After the restore the next ubatch must start at cell
 * n mod S, as it would have: llama.cpp starts its search at the cell after
 * the last one filled, or at the lowest cell a removal frees, so the
 * oldest position, whose cell that is, is removed from the window layers
 * (the uninterrupted run overwrites it with position n next; masked or
 * empty, it adds nothing). */
static int restore_windowed(ctxs_llama *lc, uint64_t n)
{
    const uint32_t S = lc->swa_cells;
    const cells_plan plan[CTXS__SEQ_MAX_BLOCKS] = {
        {(uint32_t)n, 0, 0, 0},
        {n < S ? (uint32_t)n : S, n > S ? (uint32_t)(n % S) : 0,
         (int32_t)(n < S ? 0 : n - S), (int64_t)n - lc->shape.n_swa},
    };
    int rc = put_state(lc, plan, 0);
    if (rc == 1)
        return ctxs__llama_fail(CTXS_EENGINE,
                                "llama.cpp refused the %llu tokens' state (its log says why; a "
                                "cache for the window layers of fewer than %u cells is not the "
                                "one of a context with swa_full = false)",
                                (unsigned long long)n, S);
    if (rc == 0 && n > S && n % S && (rc = free_window_cell(lc, (llama_pos)(n - S))) < 0)
        llama_memory_seq_rm(lc->mem, lc->seq, -1, -1);
    return rc;
}

int ctxs_llama_restore(ctxs_llama *lc)
{
    ctxs__llama_clear_error();
    if (!lc)
        return ctxs__llama_fail(CTXS_EINVAL, "ctxs_llama_restore: NULL");
    llama_memory_seq_rm(lc->mem, lc->seq, -1, -1);
    lc->zeros_below = 0;
    ctxs_session_info info;
    int rc = ctxs_session_get_info(&info, lc->s);
    if (rc < 0)
        return ctxs__llama_fail(rc, "the session: %s", ctxs_strerror(rc));
    const uint64_t n = info.n_tokens;
    if (n == 0)
        return 0;
    if (info.n_held < n)
        return ctxs__llama_fail(CTXS_EEVICTED,
                                "the session holds %u of its %llu tokens (a ring that wrapped): "
                                "llama.cpp needs them all",
                                info.n_held, (unsigned long long)n);
    if (n > llama_n_ctx(lc->ctx))
        return ctxs__llama_fail(CTXS_EFULL, "the session holds %llu tokens; the context, %u",
                                (unsigned long long)n, llama_n_ctx(lc->ctx));
    const uint32_t window = lc->shape.n_swa;
    const int64_t read_from = window && n > window ? (int64_t)(n - window) : 0;
    if (!(info.flags & CTXS_INFO_BACKGROUND) || (info.flags & CTXS_INFO_PARTIAL_WINDOW))
        read_ahead(lc, n, (uint64_t)read_from);
    if (lc->shape.windowed)
        return restore_windowed(lc, n);
    /* A session whose window layers keep every position, for a context
     * made with swa_full = true: they get a cell for every position where
     * their cache has room, their cells then lie as an uninterrupted run's
     * do, and llama.cpp computes what that run computes; the positions
     * attention no longer reads (below n - n_swa) get zeros, which it
     * masks as it masked the K/V, and which cost the gather no reads
     * (Gemma 3 at 2048 tokens: 15 of its 18 layers are window layers, and
     * three quarters of their positions lie below). Otherwise they get
     * what they read, the last n_swa. */
    const uint32_t all = (uint32_t)n;
    cells_plan plan[CTXS__SEQ_MAX_BLOCKS] = {{all, 0, 0, 0}, {all, 0, 0, read_from}};
    rc = 1;
    if (window && lc->window_cache_full && n > window) {
        rc = put_state(lc, plan, 1);
        if (rc == 1) /* "not enough cells": a cache of the window's size */
            lc->window_cache_full = 0;
    }
    if (rc == 1) {
        if (window && n > window)
            plan[1] = (cells_plan){window, 0, (int32_t)(n - window), (int64_t)(n - window)};
        rc = put_state(lc, plan, 0);
    }
    if (rc == 1)
        return ctxs__llama_fail(CTXS_EENGINE,
                                "llama.cpp refused the %llu tokens' state (its log says why)",
                                (unsigned long long)n);
    return rc;
}

/* --- Rollback -------------------------------------------------------------- */

/* After the session went back to n tokens: the sequence follows, from the
 * session where llama.cpp's window layers no longer hold what it needs, or
 * (a windowed session) where dropping the positions from n on would leave
 * the window layers' ring otherwise than an uninterrupted run to n leaves
 * it: when the freed cells wrap past the cache's last cell, llama.cpp
 * would start the next ubatch at cell 0, and its attention would span
 * fewer cells. */
static int follow_rollback(ctxs_llama *lc, uint64_t n)
{
    const llama_pos had = llama_memory_seq_pos_max(lc->mem, lc->seq) + 1;
    llama_memory_seq_rm(lc->mem, lc->seq, (llama_pos)n, -1);
    if (!lc->shape.n_swa || n == 0)
        return 0;
    const uint32_t S = lc->swa_cells;
    if (lc->shape.windowed && (uint64_t)had > S && (uint64_t)had > n &&
        n % S + ((uint64_t)had - n) >= S)
        return ctxs_llama_restore(lc);
    const llama_pos need = n > lc->shape.n_swa ? (llama_pos)(n - lc->shape.n_swa) : 0;
    const llama_pos have = llama_memory_seq_pos_min(lc->mem, lc->seq);
    if (have >= 0 && have <= need && need >= lc->zeros_below &&
        llama_memory_seq_pos_max(lc->mem, lc->seq) == (llama_pos)n - 1)
        return 0;
    return ctxs_llama_restore(lc);
}

int ctxs_llama_rollback(ctxs_llama *lc, uint64_t n_tokens)
{
    ctxs__llama_clear_error();
    if (!lc)
        return ctxs__llama_fail(CTXS_EINVAL, "ctxs_llama_rollback: NULL");
    int rc = ctxs_session_rollback(lc->s, n_tokens);
    if (rc < 0) /* the sequence stays as it was */
        return ctxs__llama_fail(rc, "rolling the session back to %llu tokens: %s",
                                (unsigned long long)n_tokens,
                                *ctxs_get_last_error() ? ctxs_get_last_error() : ctxs_strerror(rc));
    return follow_rollback(lc, n_tokens);
}

int ctxs_llama_checkpoint_restore(ctxs_llama *lc, const char *name)
{
    ctxs__llama_clear_error();
    if (!lc || !name)
        return ctxs__llama_fail(CTXS_EINVAL, "ctxs_llama_checkpoint_restore: a NULL argument");
    int rc = ctxs_checkpoint_restore(lc->s, name);
    if (rc < 0)
        return ctxs__llama_fail(rc, "checkpoint '%s': %s", name, ctxs_strerror(rc));
    ctxs_session_info info;
    if ((rc = ctxs_session_get_info(&info, lc->s)) < 0)
        return ctxs__llama_fail(rc, "the session: %s", ctxs_strerror(rc));
    return follow_rollback(lc, info.n_tokens);
}

/* --- Start ------------------------------------------------------------------ */

/* 1 if the session name of st belongs to the model of the same weights
 * and tokenizer as model under the other layer schedule. */
static int other_schedule(ctxs_store *st, const char *name, const ctxs_model *model)
{
    ctxs_session_entry e;
    ctxs_model_entry m;
    if (ctxs_store_session_get(&e, st, name) < 0 || ctxs_model_get(&m, st, e.model_hash) < 0)
        return 0;
    const ctxs_geometry *a = &m.model.geometry, *b = &model->geometry;
    return a->n_layers == b->n_layers && a->n_kv_heads == b->n_kv_heads &&
           a->head_dim == b->head_dim && a->dtype == b->dtype && !a->period != !b->period &&
           !memcmp(m.model.tokenizer_hash, model->tokenizer_hash, CTXS_HASH_BYTES);
}

/* The model's attention windows, where options of version 2 leave them
 * zero: the app's own choice stands, and version 1 has no such fields. */
static int attention_windows_unless_set(ctxs_open_options *o, const struct llama_context *ctx)
{
    if (o->version != CTXS_OPEN_OPTIONS_VERSION || o->attn_period)
        return 0;
    return ctxs_llama_attention_windows(o, ctx);
}

/* Opens, forks or creates the session of ctxs_llama_start(); *how says
 * which. */
static int open_conversation(ctxs_session **s, uint32_t *how, char *from, ctxs_store *st,
                             const char *name, struct llama_context *ctx,
                             const ctxs_model *model, const int32_t *prompt, uint32_t n_prompt,
                             const ctxs_llama_options *o)
{
    int rc = ctxs_store_session_open(s, st, name, model, o->open_flags & CTXS_OPEN_VERIFY,
                                     o->open);
    if (rc == CTXS_EMODEL && other_schedule(st, name, model))
        return ctxs__llama_fail(
            rc, "'%s' was saved for a context %s; this one %s: a session is restored into a "
            "context of its kind (llama_context_params.swa_full as when it was saved)", name,
            model->geometry.period ? "whose window layers keep every position (swa_full = true)"
                                   : "whose window layers keep only their window (swa_full = "
                                     "false)",
            model->geometry.period ? "keeps only their window" : "keeps every position");
    if (rc != CTXS_ENOTFOUND) {
        *how = CTXS_LLAMA_RESUMED;
        return rc < 0 ? ctxs__llama_fail(rc, "opening '%s': %s", name, ctxs_strerror(rc)) : 0;
    }
    ctxs_prefix_match m;
    if (n_prompt > 1 &&
        ctxs_prefix_find(&m, st, model->model_hash, (const uint32_t *)prompt, n_prompt) == 0) {
        /* The prompt's last token is decoded again: its logits start the
         * reply. */
        const uint64_t n = m.n_tokens < n_prompt ? m.n_tokens : n_prompt - 1u;
        rc = ctxs_store_session_fork(s, st, m.session, name, n, o->open);
        if (rc == 0) {
            *how = CTXS_LLAMA_FORKED;
            memcpy(from, m.session, sizeof m.session);
            return 0;
        }
        if (rc == CTXS_ETAKEN)
            return ctxs__llama_fail(rc, "'%s' appeared meanwhile", name);
        /* A match that cannot be forked is no reason to fail: prefill. */
    }
    ctxs_create_options co = CTXS_CREATE_OPTIONS_INIT;
    if (o->create) {
        co = *o->create;
        if ((rc = attention_windows_unless_set(&co.open, ctx)) < 0)
            return rc;
    } else {
        co.capacity = llama_n_ctx(ctx);
        co.ring = 0;
        co.n_sink = 0;
        /* A window layer's ring is as long as llama.cpp's cache for it:
         * the session keeps what the context keeps, and rolls back as far
         * as llama.cpp could. */
        const int32_t n_swa = llama_model_n_swa(llama_get_model(ctx));
        if (model->geometry.period && n_swa > 0)
            co.batch = window_cells(ctx, (uint32_t)n_swa) - (uint32_t)n_swa;
        if (o->open)
            co.open = *o->open;
    }
    *how = CTXS_LLAMA_CREATED;
    rc = ctxs_store_session_create(s, st, name, model, &co);
    return rc < 0 ? ctxs__llama_fail(rc, "creating '%s': %s", name,
                                     *ctxs_get_last_error() ? ctxs_get_last_error()
                                                            : ctxs_strerror(rc))
                  : 0;
}

int ctxs_llama_start(ctxs_llama **out, ctxs_store *st, const char *name,
                     struct llama_context *ctx, const ctxs_model *model,
                     const int32_t *prompt, uint32_t n_prompt,
                     const ctxs_llama_options *opts, ctxs_llama_start_info *info)
{
    ctxs__llama_clear_error();
    if (!out)
        return ctxs__llama_fail(CTXS_EINVAL, "ctxs_llama_start: out is NULL");
    *out = NULL;
    ctxs_llama_options o;
    int rc = take_options(&o, opts, "ctxs_llama_start");
    if (rc < 0)
        return rc;
    if (!st || !name || !ctx || !model || (!prompt && n_prompt))
        return ctxs__llama_fail(CTXS_EINVAL, "ctxs_llama_start: a NULL argument");
    ctxs_open_options open_options =
        o.open ? *o.open : (ctxs_open_options)CTXS_OPEN_OPTIONS_INIT;
    if ((rc = attention_windows_unless_set(&open_options, ctx)) < 0)
        return rc;
    o.open = &open_options;
    ctxs_llama_start_info local;
    if (!info)
        info = &local;
    memset(info, 0, sizeof(*info));
    ctxs_session *s = NULL;
    rc = open_conversation(&s, &info->how, info->from, st, name, ctx, model, prompt,
                               n_prompt, &o);
    if (rc < 0)
        return rc;
    ctxs_llama *lc;
    if ((rc = ctxs_llama_attach(&lc, ctx, s, &o)) < 0) {
        ctxs_session_close(s);
        return rc;
    }
    lc->owns_session = 1;
    if ((rc = ctxs_llama_restore(lc)) < 0) {
        ctxs_llama_close(lc);
        return rc;
    }
    ctxs_session_info si;
    ctxs_session_get_info(&si, s);
    info->n_tokens = si.n_tokens;
    *out = lc;
    return 0;
}
