/*
 * The export file's layout, version 3.0: the one definition that
 * transfer.c writes and reads, and that the tests and the fuzzers craft
 * files with. docs/FORMAT.md, "Export file format", is the prose version;
 * the static asserts below pin every offset it gives, so the two cannot
 * drift apart silently.
 *
 * All integers are little-endian (the build refuses big-endian hosts, so
 * the structs are written as they lie in memory); every CRC is zlib's
 * crc32. The file is the header, then the metadata section (meta_bytes,
 * 2.0), then n_blocks blocks (a block header, then comp_bytes of zlib
 * stream), then the trailer. A 1.0 file has no metadata section: its
 * meta_* fields lie in bytes 1.0 reserved, and are read as zero.
 */
#ifndef CTXS_TRANSFER_EXPORT_FORMAT_H
#define CTXS_TRANSFER_EXPORT_FORMAT_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include "ctxstore.h"

#define CTXS__EXPORT_MAGIC "CTXSEXPT"   /* 8 bytes, no terminator on disk */
/* 3.0: the layer schedule and the windowed rings' blocks. A session
 * without windowed layers is still written as 2.0, which 2.0 readers
 * read. */
#define CTXS__EXPORT_MAJOR 3
#define CTXS__EXPORT_MINOR 0
#define CTXS__EXPORT_HEADER_BYTES 1024u
#define CTXS__EXPORT_BLOCK_MAGIC "CXBK"
#define CTXS__EXPORT_TRAILER_MAGIC "CXEN"

/* Tokens per block: at most this many, and at most what fits in
 * CTXS__EXPORT_MAX_RAW bytes uncompressed, so that no block makes a reader
 * allocate more than about 2 x 64 MiB. */
#define CTXS__EXPORT_MAX_BLOCK_TOKENS 64u
#define CTXS__EXPORT_MAX_RAW (64u << 20)

#define CTXS__EXPORT_FLAG_RING 0x1u

/*
 * The header, at offset 0. Names are UTF-8 without NUL, zero padded.
 */
typedef struct ctxs__export_header {
    char magic[8];              /* CTXS__EXPORT_MAGIC */
    uint16_t version_major;     /* readers refuse a newer major */
    uint16_t version_minor;     /* additions older readers may ignore */
    uint32_t header_bytes;      /* CTXS__EXPORT_HEADER_BYTES */
    uint32_t flags;             /* CTXS__EXPORT_FLAG_RING; other bits zero */
    uint32_t dtype;             /* the session's geometry and slots */
    uint32_t n_layers;
    uint32_t n_kv_heads;
    uint32_t head_dim;
    uint32_t capacity;
    uint32_t n_sink;
    uint32_t block_tokens;      /* tokens per full block */
    uint64_t n_tokens;          /* the committed state exported */
    uint64_t ring_start;
    uint64_t n_held;            /* tokens in the blocks */
    uint64_t n_blocks;
    uint64_t created_unix_ms;   /* the session's (its file header's) */
    uint64_t exported_unix_ms;
    uint8_t model_hash[16];
    uint8_t tokenizer_hash[16];
    uint16_t model_name_len;    /* 0..255: the display name, if registered */
    uint16_t name_len;          /* 1..255: the session's name */
    uint32_t reserved0;         /* zero when written; ignored when read */
    char model_name[CTXS_NAME_MAX + 1];
    char name[CTXS_NAME_MAX + 1];
    uint32_t meta_bytes;        /* 2.0: the metadata section's size */
    uint32_t meta_crc32;        /* 2.0: zlib crc32 of its meta_bytes */
    uint32_t meta_count;        /* 2.0: entries in it */
    uint32_t period;            /* 3.0: the layer schedule, as in the */
    uint32_t window[8];         /* session header; zero before 3.0 */
    uint32_t batch;             /* 3.0: the slots a windowed layer keeps
                                   beyond its window; zero before 3.0 */
    uint8_t reserved[320];      /* zero when written; ignored when read */
    uint32_t crc32;             /* zlib crc32 of bytes 0..1019 */
} ctxs__export_header;

static_assert(sizeof(ctxs__export_header) == CTXS__EXPORT_HEADER_BYTES, "export header size");
static_assert(offsetof(ctxs__export_header, version_major) == 8, "export header layout");
static_assert(offsetof(ctxs__export_header, version_minor) == 10, "export header layout");
static_assert(offsetof(ctxs__export_header, header_bytes) == 12, "export header layout");
static_assert(offsetof(ctxs__export_header, flags) == 16, "export header layout");
static_assert(offsetof(ctxs__export_header, dtype) == 20, "export header layout");
static_assert(offsetof(ctxs__export_header, n_layers) == 24, "export header layout");
static_assert(offsetof(ctxs__export_header, n_kv_heads) == 28, "export header layout");
static_assert(offsetof(ctxs__export_header, head_dim) == 32, "export header layout");
static_assert(offsetof(ctxs__export_header, capacity) == 36, "export header layout");
static_assert(offsetof(ctxs__export_header, n_sink) == 40, "export header layout");
static_assert(offsetof(ctxs__export_header, block_tokens) == 44, "export header layout");
static_assert(offsetof(ctxs__export_header, n_tokens) == 48, "export header layout");
static_assert(offsetof(ctxs__export_header, ring_start) == 56, "export header layout");
static_assert(offsetof(ctxs__export_header, n_held) == 64, "export header layout");
static_assert(offsetof(ctxs__export_header, n_blocks) == 72, "export header layout");
static_assert(offsetof(ctxs__export_header, created_unix_ms) == 80, "export header layout");
static_assert(offsetof(ctxs__export_header, exported_unix_ms) == 88, "export header layout");
static_assert(offsetof(ctxs__export_header, model_hash) == 96, "export header layout");
static_assert(offsetof(ctxs__export_header, tokenizer_hash) == 112, "export header layout");
static_assert(offsetof(ctxs__export_header, model_name_len) == 128, "export header layout");
static_assert(offsetof(ctxs__export_header, name_len) == 130, "export header layout");
static_assert(offsetof(ctxs__export_header, reserved0) == 132, "export header layout");
static_assert(offsetof(ctxs__export_header, model_name) == 136, "export header layout");
static_assert(offsetof(ctxs__export_header, name) == 392, "export header layout");
static_assert(offsetof(ctxs__export_header, meta_bytes) == 648, "export header layout");
static_assert(offsetof(ctxs__export_header, meta_crc32) == 652, "export header layout");
static_assert(offsetof(ctxs__export_header, meta_count) == 656, "export header layout");
static_assert(offsetof(ctxs__export_header, period) == 660, "export header layout");
static_assert(offsetof(ctxs__export_header, window) == 664, "export header layout");
static_assert(offsetof(ctxs__export_header, batch) == 696, "export header layout");
static_assert(offsetof(ctxs__export_header, reserved) == 700, "export header layout");
static_assert(offsetof(ctxs__export_header, crc32) == 1020, "export header layout");

/*
 * The metadata section (2.0), right after the header: meta_count entries
 * in ascending key order (bytewise, a shorter key first where one is the
 * start of another), each this, then key_len bytes of key (a valid name),
 * then value_bytes bytes of value. Keys and values together are at most
 * CTXS_META_SESSION_MAX bytes, each value at most CTXS_META_VALUE_MAX; with
 * every key at least a byte, the section is at most
 * CTXS__EXPORT_MAX_META bytes.
 */
typedef struct ctxs__export_meta {
    uint16_t key_len;           /* 1..255 */
    uint16_t reserved0;         /* zero */
    uint32_t value_bytes;       /* 0..CTXS_META_VALUE_MAX */
} ctxs__export_meta;

static_assert(sizeof(ctxs__export_meta) == 8, "export metadata entry size");
static_assert(offsetof(ctxs__export_meta, reserved0) == 2, "export metadata entry layout");
static_assert(offsetof(ctxs__export_meta, value_bytes) == 4, "export metadata entry layout");

#define CTXS__EXPORT_MAX_META                                                  \
    ((uint32_t)CTXS_META_SESSION_MAX * (1 + sizeof(ctxs__export_meta)))

/*
 * A block: this header, then comp_bytes of zlib stream. Uncompressed, the
 * block is the checksums (u64[count]), the token ids (u32[count]), then
 * the KV of its tokens run by run, (layer, K|V, head) in file order, each
 * run count * slot_bytes long, then for Q8 (2.0) their scales run by run,
 * each run count * 4 bytes.
 */
typedef struct ctxs__export_block {
    char magic[4];              /* CTXS__EXPORT_BLOCK_MAGIC */
    uint32_t index;             /* 0, 1, 2, ... */
    uint64_t first_pos;         /* positions first_pos .. + count - 1 */
    uint32_t count;
    uint32_t raw_bytes;         /* count * (12 + runs * (slot_bytes + 4 for
                                   Q8, else 0)) */
    uint32_t comp_bytes;
    uint32_t data_crc32;        /* zlib crc32 of the comp_bytes */
    uint32_t raw_crc32;         /* zlib crc32 of the raw_bytes */
    uint32_t crc32;             /* zlib crc32 of bytes 0..35 */
} ctxs__export_block;

static_assert(sizeof(ctxs__export_block) == 40, "export block header size");
static_assert(offsetof(ctxs__export_block, index) == 4, "export block header layout");
static_assert(offsetof(ctxs__export_block, first_pos) == 8, "export block header layout");
static_assert(offsetof(ctxs__export_block, count) == 16, "export block header layout");
static_assert(offsetof(ctxs__export_block, raw_bytes) == 20, "export block header layout");
static_assert(offsetof(ctxs__export_block, comp_bytes) == 24, "export block header layout");
static_assert(offsetof(ctxs__export_block, data_crc32) == 28, "export block header layout");
static_assert(offsetof(ctxs__export_block, raw_crc32) == 32, "export block header layout");
static_assert(offsetof(ctxs__export_block, crc32) == 36, "export block header layout");

/* The trailer, the file's last 40 bytes. */
typedef struct ctxs__export_trailer {
    char magic[4];              /* CTXS__EXPORT_TRAILER_MAGIC */
    uint32_t reserved0;         /* zero when written; ignored when read */
    uint64_t n_blocks;
    uint64_t n_held;
    uint64_t body_bytes;        /* offset of the trailer */
    uint32_t body_crc32;        /* zlib crc32 of bytes [0, body_bytes) */
    uint32_t crc32;             /* zlib crc32 of bytes 0..35 */
} ctxs__export_trailer;

static_assert(sizeof(ctxs__export_trailer) == 40, "export trailer size");
static_assert(offsetof(ctxs__export_trailer, reserved0) == 4, "export trailer layout");
static_assert(offsetof(ctxs__export_trailer, n_blocks) == 8, "export trailer layout");
static_assert(offsetof(ctxs__export_trailer, n_held) == 16, "export trailer layout");
static_assert(offsetof(ctxs__export_trailer, body_bytes) == 24, "export trailer layout");
static_assert(offsetof(ctxs__export_trailer, body_crc32) == 32, "export trailer layout");
static_assert(offsetof(ctxs__export_trailer, crc32) == 36, "export trailer layout");

#endif
