/*
 * The values the remote tier keeps in Redis, versions 1.0 and 2.0: the one
 * definition values.c stamps and checks and the tests craft values with.
 * docs/FORMAT.md, "Remote values", is the prose version; the static
 * asserts pin every offset it gives.
 *
 * Little-endian, as the session files; every CRC is zlib's crc32. A
 * chunk's payload has no CRC of its own: the per-token checksums it
 * carries (XXH3 of position, id, K/V and scales) are each recomputed and
 * compared, and the chain covers the ids, so a damaged byte anywhere in
 * it is refused without a pass of crc32 over ~9 MiB (2.9 ms, against
 * 0.4 ms for the checksums, at Qwen3-4B's geometry).
 *
 *   <prefix>:chunk:<model hash, 32 hex>:<dtype>-<L>x<H>x<D>:<chain, 32 hex>
 *       a chunk: ctxs__rchunk_header, then raw_bytes of raw block
 *       (kv_block.h) holding count tokens from first_pos.
 *   <prefix>:session:<name>
 *       a session record: ctxs__rsession_header, then (2.0) the layer
 *       schedule, then u32 token ids [n_tokens], then the metadata section
 *       (meta_bytes, FORMAT.md "Metadata section").
 *   <prefix>:window:<model hash>:<form>:<chain at n, 32 hex>   (2.0)
 *       the windowed layers' state at n tokens: ctxs__rwindow_header, then
 *       each windowed group's raw blocks over its layers, for the positions
 *       of its window at n.
 *
 * A session with a layer schedule (geometry.period above 0) writes 2.0
 * values, its form "<dtype>-<L>x<H>x<D>-w<window[0]>.<window[1]>..." and
 * its chunks carrying its global layers only; any other writes 1.0 values,
 * as before 2.0. A 1.0 reader refuses 2.0 values (another major).
 */
#ifndef CTXS_REMOTE_FORMAT_H
#define CTXS_REMOTE_FORMAT_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include "ctxstore.h"

#define CTXS__RCHUNK_MAGIC "CTXSRCHK"
#define CTXS__RSESSION_MAGIC "CTXSRSES"
#define CTXS__RWINDOW_MAGIC "CTXSRWIN"
#define CTXS__REMOTE_MAJOR 1       /* values of sessions without a schedule */
#define CTXS__REMOTE_MAJOR_SCHED 2 /* values of sessions with one */
#define CTXS__REMOTE_MINOR 0
#define CTXS__RCHUNK_HEADER_BYTES 128u
#define CTXS__RSESSION_HEADER_BYTES 640u
#define CTXS__RWINDOW_HEADER_BYTES 128u
/* A 2.0 record's schedule, after its header: u32 period, u32 window[8]. */
#define CTXS__RSCHEDULE_BYTES 36u

/* A record lists at most this many tokens (the largest capacity): a
 * damaged record never makes a reader allocate more than 64 MiB of ids. */
#define CTXS__REMOTE_MAX_TOKENS (16u << 20)

#define CTXS__RSESSION_FLAG_TAIL 0x1u /* the tail chunk was pushed */

/* A chunk's header. chain = XXH3-128(prev_chain || the count token ids,
 * u32 LE), the chain of ctxs_prefix_find(); prev_chain is the previous
 * chunk's chain, 16 zero bytes for the chunk at position 0. A whole chunk
 * has count = CTXS_PREFIX_CHUNK; a tail, fewer. */
typedef struct ctxs__rchunk_header {
    char magic[8];              /* CTXS__RCHUNK_MAGIC */
    uint16_t version_major;     /* readers refuse another major */
    uint16_t version_minor;
    uint32_t header_bytes;      /* CTXS__RCHUNK_HEADER_BYTES */
    uint32_t dtype;             /* the model's geometry */
    uint32_t n_layers;
    uint32_t n_kv_heads;
    uint32_t head_dim;
    uint32_t count;             /* 1..CTXS_PREFIX_CHUNK tokens */
    uint32_t raw_bytes;         /* count * (12 + runs * (slot_bytes + 4 for
                                   Q8, else 0)) */
    uint64_t first_pos;         /* a multiple of CTXS_PREFIX_CHUNK */
    uint8_t model_hash[16];
    uint8_t prev_chain[16];
    uint8_t chain[16];          /* also in the key */
    uint32_t schedule_crc32;    /* 2.0: crc32 of the schedule's 36 bytes
                                   (u32 period, u32 window[8]); 1.0: zero */
    uint8_t reserved[24];       /* zero */
    uint32_t crc32;             /* of bytes 0..123 */
} ctxs__rchunk_header;

static_assert(sizeof(ctxs__rchunk_header) == CTXS__RCHUNK_HEADER_BYTES, "chunk header size");
static_assert(offsetof(ctxs__rchunk_header, version_major) == 8, "chunk header layout");
static_assert(offsetof(ctxs__rchunk_header, version_minor) == 10, "chunk header layout");
static_assert(offsetof(ctxs__rchunk_header, header_bytes) == 12, "chunk header layout");
static_assert(offsetof(ctxs__rchunk_header, dtype) == 16, "chunk header layout");
static_assert(offsetof(ctxs__rchunk_header, n_layers) == 20, "chunk header layout");
static_assert(offsetof(ctxs__rchunk_header, n_kv_heads) == 24, "chunk header layout");
static_assert(offsetof(ctxs__rchunk_header, head_dim) == 28, "chunk header layout");
static_assert(offsetof(ctxs__rchunk_header, count) == 32, "chunk header layout");
static_assert(offsetof(ctxs__rchunk_header, raw_bytes) == 36, "chunk header layout");
static_assert(offsetof(ctxs__rchunk_header, first_pos) == 40, "chunk header layout");
static_assert(offsetof(ctxs__rchunk_header, model_hash) == 48, "chunk header layout");
static_assert(offsetof(ctxs__rchunk_header, prev_chain) == 64, "chunk header layout");
static_assert(offsetof(ctxs__rchunk_header, chain) == 80, "chunk header layout");
static_assert(offsetof(ctxs__rchunk_header, schedule_crc32) == 96, "chunk header layout");
static_assert(offsetof(ctxs__rchunk_header, reserved) == 100, "chunk header layout");
static_assert(offsetof(ctxs__rchunk_header, crc32) == 124, "chunk header layout");

/* A session record's header. Names are UTF-8 without NUL, zero padded. */
typedef struct ctxs__rsession_header {
    char magic[8];              /* CTXS__RSESSION_MAGIC */
    uint16_t version_major;
    uint16_t version_minor;
    uint32_t header_bytes;      /* CTXS__RSESSION_HEADER_BYTES */
    uint32_t dtype;             /* the model */
    uint32_t n_layers;
    uint32_t n_kv_heads;
    uint32_t head_dim;
    uint8_t model_hash[16];
    uint8_t tokenizer_hash[16];
    uint64_t n_tokens;          /* ids that follow, <= CTXS__REMOTE_MAX_TOKENS */
    uint64_t updated_unix_ms;   /* when the record was pushed */
    uint32_t flags;             /* CTXS__RSESSION_FLAG_TAIL; others zero */
    uint16_t name_len;          /* 1..255, the key's name */
    uint16_t model_name_len;    /* 0..255, the model's display name */
    uint32_t meta_bytes;        /* the metadata section's size */
    uint32_t meta_count;        /* entries in it */
    char name[CTXS_NAME_MAX + 1];
    char model_name[CTXS_NAME_MAX + 1];
    uint32_t body_crc32;        /* of the ids and the metadata section */
    uint8_t reserved[24];       /* zero */
    uint32_t crc32;             /* of bytes 0..635 */
} ctxs__rsession_header;

static_assert(sizeof(ctxs__rsession_header) == CTXS__RSESSION_HEADER_BYTES, "record size");
static_assert(offsetof(ctxs__rsession_header, version_major) == 8, "record layout");
static_assert(offsetof(ctxs__rsession_header, version_minor) == 10, "record layout");
static_assert(offsetof(ctxs__rsession_header, header_bytes) == 12, "record layout");
static_assert(offsetof(ctxs__rsession_header, dtype) == 16, "record layout");
static_assert(offsetof(ctxs__rsession_header, n_layers) == 20, "record layout");
static_assert(offsetof(ctxs__rsession_header, n_kv_heads) == 24, "record layout");
static_assert(offsetof(ctxs__rsession_header, head_dim) == 28, "record layout");
static_assert(offsetof(ctxs__rsession_header, model_hash) == 32, "record layout");
static_assert(offsetof(ctxs__rsession_header, tokenizer_hash) == 48, "record layout");
static_assert(offsetof(ctxs__rsession_header, n_tokens) == 64, "record layout");
static_assert(offsetof(ctxs__rsession_header, updated_unix_ms) == 72, "record layout");
static_assert(offsetof(ctxs__rsession_header, flags) == 80, "record layout");
static_assert(offsetof(ctxs__rsession_header, name_len) == 84, "record layout");
static_assert(offsetof(ctxs__rsession_header, model_name_len) == 86, "record layout");
static_assert(offsetof(ctxs__rsession_header, meta_bytes) == 88, "record layout");
static_assert(offsetof(ctxs__rsession_header, meta_count) == 92, "record layout");
static_assert(offsetof(ctxs__rsession_header, name) == 96, "record layout");
static_assert(offsetof(ctxs__rsession_header, model_name) == 352, "record layout");
static_assert(offsetof(ctxs__rsession_header, body_crc32) == 608, "record layout");
static_assert(offsetof(ctxs__rsession_header, reserved) == 612, "record layout");
static_assert(offsetof(ctxs__rsession_header, crc32) == 636, "record layout");

/* A windowed state's header (2.0). Then, for each windowed group (the
 * layers of one window, numbered in the order of their first layer), the
 * positions [max(n_tokens - window, 0), n_tokens) cut into blocks of at
 * most CTXS_PREFIX_CHUNK from the first, each a raw block over the
 * group's layers; raw_bytes in all. */
typedef struct ctxs__rwindow_header {
    char magic[8];              /* CTXS__RWINDOW_MAGIC */
    uint16_t version_major;     /* CTXS__REMOTE_MAJOR_SCHED */
    uint16_t version_minor;
    uint32_t header_bytes;      /* CTXS__RWINDOW_HEADER_BYTES */
    uint32_t dtype;             /* the model's geometry */
    uint32_t n_layers;
    uint32_t n_kv_heads;
    uint32_t head_dim;
    uint32_t schedule_crc32;    /* as in a 2.0 chunk */
    uint32_t n_groups;          /* the schedule's distinct windows */
    uint64_t n_tokens;          /* the state's count */
    uint8_t model_hash[16];
    uint8_t chain[16];          /* the chain at n_tokens, also in the key */
    uint64_t raw_bytes;         /* the blocks, all groups together */
    uint8_t reserved[36];       /* zero */
    uint32_t crc32;             /* of bytes 0..123 */
} ctxs__rwindow_header;

static_assert(sizeof(ctxs__rwindow_header) == CTXS__RWINDOW_HEADER_BYTES, "window header size");
static_assert(offsetof(ctxs__rwindow_header, version_major) == 8, "window header layout");
static_assert(offsetof(ctxs__rwindow_header, header_bytes) == 12, "window header layout");
static_assert(offsetof(ctxs__rwindow_header, dtype) == 16, "window header layout");
static_assert(offsetof(ctxs__rwindow_header, head_dim) == 28, "window header layout");
static_assert(offsetof(ctxs__rwindow_header, schedule_crc32) == 32, "window header layout");
static_assert(offsetof(ctxs__rwindow_header, n_groups) == 36, "window header layout");
static_assert(offsetof(ctxs__rwindow_header, n_tokens) == 40, "window header layout");
static_assert(offsetof(ctxs__rwindow_header, model_hash) == 48, "window header layout");
static_assert(offsetof(ctxs__rwindow_header, chain) == 64, "window header layout");
static_assert(offsetof(ctxs__rwindow_header, raw_bytes) == 80, "window header layout");
static_assert(offsetof(ctxs__rwindow_header, reserved) == 88, "window header layout");
static_assert(offsetof(ctxs__rwindow_header, crc32) == 124, "window header layout");

#endif
