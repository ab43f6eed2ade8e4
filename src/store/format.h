/*
 * The session file, byte by byte. docs/FORMAT.md is the prose version of
 * this file; keep the two identical.
 *
 * All integers are little-endian (the build refuses big-endian hosts, so the
 * structs below are the bytes on disk).
 */
#ifndef CTXS_STORE_FORMAT_H
#define CTXS_STORE_FORMAT_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ctxstore.h"
#include "dtype.h"

#define CTXS__FILE_MAGIC "CTXSSESS"   /* 8 bytes, no terminator on disk */
#define CTXS__FORMAT_MAJOR 3           /* 3.0: the layer schedule */
#define CTXS__FORMAT_MINOR 0           /* (1.1 added the label page; 2.0
                                          bf16, Q8 and the scale table) */

/* Every region starts on a 16 KiB boundary: Apple Silicon's page size, which
 * Metal's no-copy buffers need, and a multiple of the 4 KiB pages elsewhere. */
#define CTXS__PAGE 16384u

#define CTXS__HEADER_BYTES 256u
#define CTXS__RECORD_BYTES 128u
/* The two commit records live in separate 4 KiB pages of the first 16 KiB,
 * away from the header, so that writing one can never tear the other or the
 * header, whatever the device's atomic write unit. The label has the fourth
 * 4 KiB page to itself for the same reason. */
#define CTXS__RECORD0_OFF 4096u
#define CTXS__RECORD1_OFF 8192u
#define CTXS__LABEL_OFF 12288u

#define CTXS__MAX_DIM 4096u            /* layers, heads, head_dim: each */
#define CTXS__MAX_CAPACITY (1u << 24)  /* slots */

#define CTXS__FLAG_RING 0x1u           /* header.flags */
#define CTXS__MAX_POSITION (1ull << 62) /* n_tokens stays below */

/* The mapping's alignment (session.c); files leave room for it. */
#define CTXS__MAP_ALIGN (2u << 20)

static_assert(sizeof(off_t) == 8, "large-file offsets");

#define CTXS__RECORD_MAGIC "CREC"
#define CTXS__TOKEN_SEED 0x637478732d6b7631ull /* "ctxs-kv1" */

/*
 * The immutable header, at offset 0. Written once by create, CRC-checked by
 * every open.
 */
typedef struct ctxs__disk_header {
    char magic[8];            /* CTXS__FILE_MAGIC */
    uint16_t version_major;   /* readers refuse a newer major */
    uint16_t version_minor;   /* additions that old readers may ignore */
    uint32_t header_bytes;    /* CTXS__HEADER_BYTES */
    uint32_t page_bytes;      /* CTXS__PAGE: region alignment */
    uint32_t flags;           /* CTXS_FLAG_* */
    uint32_t dtype;           /* ctxs_dtype */
    uint32_t elem_bytes;      /* bytes per element of dtype */
    uint32_t n_layers;
    uint32_t n_kv_heads;
    uint32_t head_dim;
    uint32_t capacity;        /* slots */
    uint32_t n_sink;          /* slots 0..n_sink-1 are never overwritten */
    uint32_t record_bytes;    /* CTXS__RECORD_BYTES */
    uint64_t record_off[2];   /* CTXS__RECORD0_OFF, CTXS__RECORD1_OFF */
    uint64_t tokens_off;      /* token-id table: u32 per slot */
    uint64_t tokens_bytes;    /* capacity * 4, rounded up to CTXS__PAGE */
    uint64_t sums_off;        /* checksum table: u64 per slot */
    uint64_t sums_bytes;      /* capacity * 8, rounded up to CTXS__PAGE */
    uint64_t kv_off;          /* [layers][2][heads][capacity][head_dim] */
    uint64_t kv_bytes;        /* exact size, rounded up to CTXS__PAGE */
    uint64_t file_bytes;      /* kv_off + kv_bytes */
    uint8_t model_hash[16];
    uint8_t tokenizer_hash[16];
    uint64_t created_unix_ms;
    uint64_t scales_off;      /* 2.0, Q8 only: the scale table, f32 per
                                 (layer, kind, head, slot); else 0 */
    uint64_t scales_bytes;    /* 4 per slot of every run, rounded up to
                                 CTXS__PAGE; 0 without a table */
    uint32_t batch;           /* 3.0: slots a windowed layer keeps beyond
                                 its window (zero, ignored, before 3.0) */
    uint32_t period;          /* 3.0: the schedule's pattern, as in
                                 ctxs_geometry (zero before 3.0) */
    uint32_t window[8];       /* 3.0: its windows; 0 = global */
    uint64_t groups_off;      /* 3.0: the windowed layers' checksum tables;
                                 0 without a windowed ring */
    uint64_t groups_bytes;
    uint8_t reserved[12];     /* zero when written; ignored when read */
    uint32_t crc32;           /* zlib crc32 of bytes 0..251 */
} ctxs__disk_header;

static_assert(sizeof(ctxs__disk_header) == CTXS__HEADER_BYTES, "header size");
static_assert(offsetof(ctxs__disk_header, record_off) == 56, "header layout");
static_assert(offsetof(ctxs__disk_header, model_hash) == 128, "header layout");
static_assert(offsetof(ctxs__disk_header, scales_off) == 168, "header layout");
static_assert(offsetof(ctxs__disk_header, batch) == 184, "header layout");
static_assert(offsetof(ctxs__disk_header, window) == 192, "header layout");
static_assert(offsetof(ctxs__disk_header, groups_off) == 224, "header layout");
static_assert(offsetof(ctxs__disk_header, reserved) == 240, "header layout");
static_assert(CTXS_SCHEDULE_MAX == 8, "the header holds 8 windows");
static_assert(offsetof(ctxs__disk_header, crc32) == 252, "header layout");

/*
 * A commit record. Two of them, written alternately: a commit writes the one
 * that is not current, so a crash while writing it leaves the current one
 * intact (LMDB's two meta pages). The reader takes the valid record with the
 * higher seq.
 *
 * The tokens a record claims ("held") are positions
 *     [0, min(n_sink, n_tokens))  and  [max(ring_start, n_sink), n_tokens),
 * position p living in slot p for p < capacity and, once the ring wraps,
 * in slot n_sink + (p - n_sink) % (capacity - n_sink).
 *
 * verified_from is the durability watermark: every held position below it
 * was durable on disk when a record carrying it was made durable, and its
 * slot has not been written since. Recovery after a power loss verifies only
 * held positions at or above it. Any operation that would rewrite the slot
 * of a position below it first lowers it in a record that is made durable
 * (Invariants C1-C3, commit.c).
 */
typedef struct ctxs__disk_record {
    char magic[4];            /* CTXS__RECORD_MAGIC */
    uint32_t index;           /* 0 or 1: which of the two places it is in */
    uint64_t seq;             /* 1, 2, 3, ... ; both 0 in a fresh file */
    uint64_t n_tokens;        /* positions committed since the start */
    uint64_t ring_start;      /* first position after the sinks still held;
                                 <= n_sink until the ring evicts */
    uint64_t verified_from;   /* see above */
    uint8_t boot_id[16];      /* the machine's boot when written; zero if
                                 unknown. Same boot = page cache intact. */
    uint64_t written_unix_ms; /* wall clock of the write, for "last used" */
    uint8_t reserved[60];     /* zero when written; ignored when read */
    uint32_t crc32;           /* zlib crc32 of bytes 0..123 */
} ctxs__disk_record;

static_assert(sizeof(ctxs__disk_record) == CTXS__RECORD_BYTES, "record size");
static_assert(offsetof(ctxs__disk_record, boot_id) == 40, "record layout");
static_assert(offsetof(ctxs__disk_record, crc32) == 124, "record layout");

/* The committed state a commit record describes. */
typedef struct ctxs__state {
    uint64_t seq;
    uint64_t n_tokens;
    uint64_t ring_start;
    uint64_t verified_from;
} ctxs__state;

/* The state a (valid) record describes. */
static inline ctxs__state ctxs__record_state(const ctxs__disk_record *r)
{
    return (ctxs__state){r->seq, r->n_tokens, r->ring_start, r->verified_from};
}

/*
 * The label (format 1.1): the name a store gave the file and the id it files
 * it under, so that the store's index can be rebuilt from the files alone.
 * The store writes it after create or fork, and again on rename; nothing in
 * src/store reads it, and a session opens whatever this page holds. A file
 * without one (1.0, or made outside a store) has zeros here.
 *
 * Written with one pwrite of the 512 bytes and made durable; a label torn by
 * a power loss fails its CRC, and the store names such a file by its id.
 */
#define CTXS__LABEL_MAGIC "CLBL"
#define CTXS__LABEL_BYTES 512u
#define CTXS__LABEL_NAME_MAX 255u

typedef struct ctxs__disk_label {
    char magic[4];            /* CTXS__LABEL_MAGIC */
    uint16_t name_len;        /* 1..255 */
    uint16_t reserved0;       /* zero */
    uint64_t store_id;        /* the id the store gave this file */
    uint8_t name[256];        /* name_len bytes of UTF-8 without NUL, then
                                 zeros */
    uint8_t reserved[236];    /* zero when written; ignored when read */
    uint32_t crc32;           /* zlib crc32 of bytes 0..507 */
} ctxs__disk_label;

static_assert(sizeof(ctxs__disk_label) == CTXS__LABEL_BYTES, "label size");
static_assert(offsetof(ctxs__disk_label, store_id) == 8, "label layout");
static_assert(offsetof(ctxs__disk_label, name) == 16, "label layout");
static_assert(offsetof(ctxs__disk_label, reserved) == 272, "label layout");
static_assert(offsetof(ctxs__disk_label, crc32) == 508, "label layout");
static_assert(CTXS__LABEL_OFF + CTXS__LABEL_BYTES <= CTXS__PAGE, "label page");

/*
 * A windowed group's checksum table entry (3.0): the layers of one window
 * laid out as a ring keep, per slot of that ring, the position the slot
 * was last committed for and the checksum of that position over the
 * group's layers (docs/FORMAT.md "Checksums"). sum 0: none.
 */
typedef struct ctxs__group_entry {
    uint64_t pos;
    uint64_t sum;
} ctxs__group_entry;

static_assert(sizeof(ctxs__group_entry) == 16, "group entry");

/* A group of layers that share a window and are laid out as a ring of
 * len = window + batch slots. */
typedef struct ctxs__group {
    uint32_t window, len;
    uint64_t table_off;    /* its ctxs__group_entry[len] in the file */
} ctxs__group;

/* The geometry and region offsets of a file, derived from a header whose
 * fields were range-checked; every product here was overflow-checked.
 *
 * Layer l is pattern layer j = l % pat (pat = max(period, 1)). Its runs
 * hold len[j] slots each: the capacity for a layer laid out as the
 * session's slots (a global layer, or a windowed one whose ring would not
 * be smaller: group[j] < 0), else its group's ring. */
typedef struct ctxs__file_layout {
    uint32_t n_layers, n_kv_heads, head_dim, elem_bytes;
    uint32_t capacity, n_sink;
    uint32_t batch, period, pat;
    uint32_t window[8];    /* per pattern layer; 0 = global */
    uint32_t len[8];       /* slots of each run of a pattern layer */
    int32_t group[8];      /* its group, or -1: the session's slots */
    uint32_t n_groups;
    ctxs__group groups[8];
    uint64_t kv_prefix[9]; /* bytes from a pattern's first layer to layer j */
    uint64_t sc_prefix[9]; /* the same in the scale table */
    size_t slot_bytes;     /* head_dim * elem_bytes */
    size_t head_stride;    /* capacity * slot_bytes: a global run */
    size_t kv_stride;      /* n_kv_heads * head_stride */
    size_t layer_stride;   /* 2 * kv_stride */
    size_t scales_stride;  /* bytes from one global run's scales to the
                              next: capacity * 4, or 0 without a table */
    uint64_t tokens_off, tokens_bytes;
    uint64_t sums_off, sums_bytes;
    uint64_t scales_off, scales_bytes; /* 0, 0 without a table */
    uint64_t groups_off, groups_bytes; /* 0, 0 without a windowed ring */
    uint64_t kv_off, kv_bytes;
    uint64_t file_bytes;
} ctxs__file_layout;

/* Checks a schedule (period, windows) as ctxs_geometry documents it.
 * Returns 0 or CTXS_EINVAL. */
int ctxs__schedule_check(const ctxs_geometry *g);

/* Computes the layout for a geometry, capacity, sinks and batch. Returns
 * 0, or CTXS_EINVAL when a field is out of range or a size overflows. */
int ctxs__layout_compute(ctxs__file_layout *out, const ctxs_geometry *g,
                         uint32_t capacity, uint32_t n_sink, uint32_t batch);

/* Pattern layer of layer l. */
static inline uint32_t ctxs__pat_of(const ctxs__file_layout *lay, uint32_t l)
{
    return l % lay->pat;
}

/* Slots of each run of layer l, and the sinks of that slot space: the
 * session's (capacity, n_sink), or a group's ring (len, 0). */
static inline uint32_t ctxs__layer_cap(const ctxs__file_layout *lay, uint32_t l)
{
    return lay->len[ctxs__pat_of(lay, l)];
}
static inline uint32_t ctxs__layer_sinks(const ctxs__file_layout *lay, uint32_t l)
{
    return lay->group[ctxs__pat_of(lay, l)] < 0 ? lay->n_sink : 0;
}
static inline int32_t ctxs__layer_group(const ctxs__file_layout *lay, uint32_t l)
{
    return lay->group[ctxs__pat_of(lay, l)];
}

/* Bytes from kv_off to run `run` (file order: (layer * 2 + kind) *
 * n_kv_heads + head), and from scales_off to its scales. */
static inline uint64_t ctxs__run_off(const ctxs__file_layout *lay, uint32_t run)
{
    uint32_t per = 2 * lay->n_kv_heads, l = run / per, j = l % lay->pat;
    return (uint64_t)(l / lay->pat) * lay->kv_prefix[lay->pat] + lay->kv_prefix[j] +
           (uint64_t)(run % per) * lay->len[j] * lay->slot_bytes;
}
static inline uint64_t ctxs__run_scales_off(const ctxs__file_layout *lay, uint32_t run)
{
    uint32_t per = 2 * lay->n_kv_heads, l = run / per, j = l % lay->pat;
    return (uint64_t)(l / lay->pat) * lay->sc_prefix[lay->pat] + lay->sc_prefix[j] +
           (uint64_t)(run % per) * lay->len[j] * 4;
}

/* The window of layer l (0: global). */
static inline uint32_t ctxs__layer_window(const ctxs__file_layout *lay, uint32_t l)
{
    return lay->window[ctxs__pat_of(lay, l)];
}

/* Fills a header for a new file. */
void ctxs__header_init(ctxs__disk_header *h, const ctxs__file_layout *lay,
                       const ctxs_model *model, uint32_t flags,
                       uint64_t created_unix_ms);

/* Checks a header read from a file of file_size bytes and derives its
 * layout. Errors: CTXS_EFOREIGN, CTXS_EVERSION, CTXS_ECORRUPT. */
int ctxs__header_check(const ctxs__disk_header *h, uint64_t file_size,
                       ctxs__file_layout *out);

/* The model a header describes: its geometry and hashes. */
void ctxs__header_model(ctxs_model *out, const ctxs__disk_header *h);

/* The first way model a differs from model b, in words, into buf: "n_layers
 * is 36 here, 24 there", "the model hash is 0123abcd... here, 89ab... there",
 * "" when they are the same. */
void ctxs__model_diff(char *buf, size_t n, const ctxs_model *a, const ctxs_model *b);

/* g's layer schedule in words ("every layer global", "period 6: 512 512
 * 512 512 512 global"), into buf of n bytes. */
void ctxs__schedule_text(char *buf, size_t n, const ctxs_geometry *g);

/* A dtype's name ("fp16", "bf16", "q8", "f32"), or "unknown". */
const char *ctxs__dtype_name(uint32_t dtype);

/* Seals a record (sets magic, index and CRC). */
void ctxs__record_seal(ctxs__disk_record *r, uint32_t index);

/* 1 if the record's magic, index and CRC hold and its counters are
 * consistent with the layout (ring flag from the header), else 0. */
int ctxs__record_valid(const ctxs__disk_record *r, uint32_t index,
                       const ctxs__file_layout *lay, int ring);

/* Which of the pair r is the newest valid record, as valid[] judged them:
 * the higher seq, record 0 on a tie. Returns 0 or 1, or -1 when neither is
 * valid. */
int ctxs__records_newest(const ctxs__disk_record r[2], const int valid[2]);

/* The two records of a file as a reader found them: the bytes both had at
 * one moment (see format.c), each one's validity, and the newest valid. */
typedef struct ctxs__records {
    ctxs__disk_record r[2];
    int valid[2];
    uint32_t newest;          /* 0 or 1 */
} ctxs__records;

/* Reads the records of a file whose checked header gave lay and ring, from
 * map (the file mapped from offset 0) or by pread from fd, while a writer
 * may be committing, and finds the newest valid one. No lock is taken.
 * Errors: CTXS_ECORRUPT (neither record valid, or no two reads agreed), and
 * from fd: -errno, CTXS_ECORRUPT (the file is shorter). */
int ctxs__records_from_map(ctxs__records *out, const uint8_t *map,
                           const ctxs__file_layout *lay, int ring);
int ctxs__records_from_fd(ctxs__records *out, int fd, const ctxs__file_layout *lay,
                          int ring);

/* Where the bytes of n tokens lie, for ctxs__sums_chain(): token i's bytes
 * in run r (r = (layer * 2 + kind) * n_kv_heads + head, file order, n_runs
 * of them) are the slot_bytes at kv + r * run_stride + at[i] * slot_bytes,
 * and its scale, with a scale table, the 4 bytes at scales + r *
 * scales_stride + at[i] * 4. A session's mapping has run_stride =
 * head_stride and at[i] = its slot; an export block packs each run's tokens
 * one after the other. */
typedef struct ctxs__token_bytes {
    const uint8_t *kv;
    size_t run_stride;
    const uint8_t *scales;    /* NULL without a table */
    size_t scales_stride;
    uint32_t n_runs;
    size_t slot_bytes;
    const uint32_t *at;
} ctxs__token_bytes;

/* The checksum chain of docs/FORMAT.md "Checksums" (recover.c), for n
 * consecutive positions from first_pos; token i has id ids[i]. */
void ctxs__sums_chain(uint64_t *out, uint64_t first_pos, uint32_t n, const uint32_t *ids,
                      const ctxs__token_bytes *bytes);

/* The slot of position p (p must be held). */
static inline uint32_t ctxs__slot_of(uint64_t p, uint32_t capacity,
                                     uint32_t n_sink)
{
    if (p < capacity)
        return (uint32_t)p;
    return n_sink + (uint32_t)((p - n_sink) % (capacity - n_sink));
}

/* The slot of position p in layer l (p must be held there). */
static inline uint32_t ctxs__layer_slot(const ctxs__file_layout *lay, uint32_t l, uint64_t p)
{
    return ctxs__slot_of(p, ctxs__layer_cap(lay, l), ctxs__layer_sinks(lay, l));
}

/* A run of consecutive slots. */
typedef struct ctxs__span {
    uint32_t slot;
    uint32_t count;
} ctxs__span;

/* The slots of positions [first, first + n) as runs of consecutive slots:
 * positions below the capacity sit in their own slot, and past it the ring
 * continues after the sinks. At most two runs when the positions fit in the
 * slots they can take (n <= capacity - first if first < n_sink, else
 * n <= capacity - n_sink), which callers guarantee. Returns the number of
 * runs written to out. Whatever needs a range's slots asks here, the CUDA
 * library too: inline, since it cannot link the core's internal symbols. */
static inline uint32_t ctxs__slot_spans(ctxs__span out[2], uint64_t first,
                                        uint64_t n, uint32_t capacity,
                                        uint32_t n_sink)
{
    uint32_t k = 0;
    while (n && k < 2) {
        uint32_t slot = ctxs__slot_of(first, capacity, n_sink);
        uint32_t count = (uint32_t)(capacity - slot < n ? capacity - slot : n);
        out[k].slot = slot;
        out[k].count = count;
        k++;
        first += count;
        n -= count;
    }
    return k;
}

/* The slots in layer l of positions [first, first + n), as
 * ctxs__slot_spans() gives them; in a group's ring only the last `len` of
 * them, the slots of the earlier ones having been taken by later ones. */
static inline uint32_t ctxs__layer_spans(ctxs__span out[2], const ctxs__file_layout *lay,
                                         uint32_t l, uint64_t first, uint64_t n)
{
    uint32_t cap = ctxs__layer_cap(lay, l);
    if (ctxs__layer_group(lay, l) >= 0 && n > cap) {
        first += n - cap;
        n = cap;
    }
    return ctxs__slot_spans(out, first, n, cap, ctxs__layer_sinks(lay, l));
}

#endif
