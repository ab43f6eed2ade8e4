/*
 * Blocks of tokens outside a session file: a session's held tokens in
 * position order, cut into blocks of at most block_tokens, each block
 * packed as the "raw block" (docs/FORMAT.md, "Export file format",
 * "Blocks"): the checksums u64[count], the token ids u32[count], the KV
 * run by run ((layer, K|V, head) in file order, each run count *
 * slot_bytes), then for Q8 the scales run by run (count * 4 each).
 *
 * Export and import (transfer.c) and the remote tier (src/remote) move
 * tokens in this form: copied from a live session race-free, checked
 * against the tokens' own checksums, and written into a new file.
 */
#ifndef CTXS_TRANSFER_KV_BLOCK_H
#define CTXS_TRANSFER_KV_BLOCK_H

#include <stdint.h>

#include "ctxstore.h"
#include "session_iface.h"

/* Tokens per block at most, and raw bytes per block at most: no block
 * makes a reader allocate more than about 64 MiB. */
#define CTXS__KV_BLOCK_MAX_TOKENS 64u
#define CTXS__KV_BLOCK_MAX_RAW (64u << 20)

/* A run of consecutive held positions [start, end). */
typedef struct ctxs__kv_range {
    uint64_t start, end;
} ctxs__kv_range;

/* Everything the blocks of a session state must be, derived from checked
 * fields. A session whose windowed layers keep rings of their own (batch
 * above 0) has two kinds of block: the position blocks carry the layers
 * laid out in the session's slots, every held position; then, for each
 * group of windowed layers, its blocks carry that group's layers, the
 * positions of its window. A block's part is -1 for the first kind, the
 * group's number for the second. */
typedef struct ctxs__kv_plan {
    ctxs__file_layout lay;
    int ring;
    ctxs__state st;             /* n_tokens and ring_start */
    ctxs__kv_range ranges[2];   /* the held positions, maximal runs */
    uint32_t n_ranges;
    uint64_t n_held;
    uint32_t n_runs;            /* runs laid out in the slots: 2 * heads *
                                   those layers */
    uint32_t scale_bytes;       /* 4 with a scale table (Q8), else 0 */
    uint64_t token_raw;         /* raw bytes per token of a position block */
    uint32_t block_tokens;
    uint64_t n_blocks;          /* of both kinds */
    ctxs__kv_range window[8];   /* each group's window: the positions its
                                   blocks carry */
    uint32_t group_runs[8];     /* runs of each group's layers */
    uint64_t group_raw[8];      /* raw bytes per token of its blocks */
} ctxs__kv_plan;

/* Fills *p for a geometry, slots, batch and state; block_tokens 0 picks the
 * most that fit. A geometry with windowed layers needs the session's batch
 * (0: refused, CTXS_EINVAL: it sets the rings' lengths). Errors: CTXS_ECORRUPT (fields out of range or inconsistent, or
 * block_tokens tokens above CTXS__KV_BLOCK_MAX_RAW), CTXS_EINVAL
 * (block_tokens 0 and not even one token fits a block; windowed layers
 * without a batch). */
int ctxs__kv_plan_make(ctxs__kv_plan *p, const ctxs_geometry *g, uint32_t capacity,
                       uint32_t n_sink, uint32_t batch, int ring, uint64_t n_tokens,
                       uint64_t ring_start, uint32_t block_tokens);

/* Walks the blocks of a plan: the position blocks in position order, then
 * each group's. */
typedef struct ctxs__kv_walk {
    int32_t part;               /* -1, then each group */
    uint32_t range;
    uint64_t next;
} ctxs__kv_walk;
void ctxs__kv_walk_init(const ctxs__kv_plan *p, ctxs__kv_walk *w);
/* 1 and the next block's part and positions first .. first + count - 1,
 * or 0. */
int ctxs__kv_walk_next(const ctxs__kv_plan *p, ctxs__kv_walk *w, int32_t *part, uint64_t *first,
                       uint32_t *count);

/* Raw bytes of a block of part with count tokens. */
static inline uint64_t ctxs__kv_raw_bytes(const ctxs__kv_plan *p, int32_t part, uint32_t count)
{
    return count * (part < 0 ? p->token_raw : p->group_raw[part]);
}

/* The raw block's parts, for count tokens. */
static inline uint64_t *ctxs__raw_sums(uint8_t *raw)
{
    return (uint64_t *)(void *)raw;
}

static inline uint32_t *ctxs__raw_ids(uint8_t *raw, uint32_t count)
{
    return (uint32_t *)(void *)(raw + (size_t)count * 8);
}

/* 1 if the checksum of every token of the raw block of part (positions
 * first .. first + count - 1) is the one it carries. */
int ctxs__kv_raw_verifies(const ctxs__kv_plan *p, int32_t part, uint8_t *raw, uint64_t first,
                          uint32_t count);

/* Copies the raw block of positions first .. + count - 1 (within one
 * range of p, which s's state held when p was made) from s, a handle
 * opened read-only, by pread; and checks it. A token whose bytes do not
 * match its checksum was being rewritten under the copy (a rollback, the
 * ring moving on) or the file is damaged: the session, refreshed, tells
 * which, and a second copy covers a rewrite back to the same tokens.
 * Errors: CTXS_ESTALE (s no longer holds p's tokens, or holds others),
 * CTXS_ECORRUPT, the errors of ctxs_session_refresh(), -errno. */
int ctxs__kv_block_read(uint8_t *raw, const ctxs__kv_plan *p, int32_t part, ctxs_session *s,
                        uint64_t first, uint32_t count);

/* Refreshes s: CTXS_ESTALE unless it still holds every position p's state
 * holds. */
int ctxs__kv_still_holds(const ctxs__kv_plan *p, ctxs_session *s);

/* Writes a raw block's ids, checksums and KV into the slots of a new
 * session file laid out as p (pwrite); a group's block its KV into the
 * group's ring and its checksums into the group's table, its ids checked
 * against those the position blocks wrote (CTXS_ECORRUPT). Errors:
 * -errno. */
int ctxs__kv_block_store(int fd, const ctxs__kv_plan *p, int32_t part, uint8_t *raw,
                         uint64_t first, uint32_t count);

/* Sizes the new session file fd for p, writes its first page (header for
 * model, created_unix_ms; both records holding p's state; label) and
 * allocates the KV blocks of its held slots, for ctxs__kv_block_store().
 * Errors: CTXS_EFULL, CTXS_ENOMEM, -errno. */
int ctxs__kv_file_begin(int fd, const ctxs__kv_plan *p, const ctxs_model *model,
                        uint64_t created_unix_ms, const ctxs__disk_label *label);

/* --- meta_section.c ---------------------------------------------------- */

struct ctxs__meta_item; /* index.h */

/* The metadata section of export files and remote session records
 * (docs/FORMAT.md, "Metadata section"): the n entries of e (in key order)
 * into *out (malloc'd, NULL when empty), *bytes and *count set.
 * Errors: CTXS_ECORRUPT (more than a session may hold), CTXS_ENOMEM. */
int ctxs__meta_section_make(uint8_t **out, uint32_t *bytes, uint32_t *count,
                            const ctxs_meta_entry *e, size_t n);

/* Checks a metadata section of bytes bytes holding count entries, in the
 * order FORMAT.md gives, and lists them into *items (calloc'd, pointing
 * into buf; NULL when empty). Errors: CTXS_ECORRUPT, CTXS_ENOMEM. */
int ctxs__meta_section_parse(struct ctxs__meta_item **items, const uint8_t *buf, uint32_t bytes,
                             uint32_t count);

#endif
