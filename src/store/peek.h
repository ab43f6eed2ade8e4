/*
 * Reading what a session file says without opening it as a session: no
 * lock, no state kept, and no mapping or verification but for
 * ctxs__peek_kept(). The index uses it to check prefix entries and
 * checkpoints and to size files cheaply; anything it finds is a hint that
 * a real open confirms before data is trusted.
 */
#ifndef CTXS_STORE_PEEK_H
#define CTXS_STORE_PEEK_H

#include "format.h"

typedef struct ctxs__peek {
    ctxs__file_layout lay;
    ctxs_model model;
    int ring;
    uint32_t format_minor;
    ctxs__state st;            /* the newest valid record's, unverified */
    uint64_t created_unix_ms;
    uint64_t written_unix_ms;  /* when that record was written */
    uint64_t disk_bytes;       /* blocks the file takes */
    uint8_t boot_id[16];       /* the boot that record was written in */
} ctxs__peek;

/* Reads the header and the newest valid record of the file open at fd.
 * Errors: CTXS_EFOREIGN, CTXS_EVERSION, CTXS_ECORRUPT, -errno. */
int ctxs__peek_fd(ctxs__peek *out, int fd);

/* The number of leading positions [0, n) that p's state holds, all in
 * slots 0..n-1: n_tokens until the ring wraps, then the sinks. */
uint64_t ctxs__peek_prefix_held(const ctxs__peek *p);

/* Token ids of positions [first, first + n), which must lie within
 * ctxs__peek_prefix_held(). Errors: CTXS_EINVAL, CTXS_ECORRUPT, -errno. */
int ctxs__peek_tokens(uint32_t *out, int fd, const ctxs__peek *p,
                      uint64_t first, uint64_t n);

/* The checksum of held position pos. Errors: CTXS_EVICTED (not held),
 * -errno. */
int ctxs__peek_sum(uint64_t *out, int fd, const ctxs__peek *p, uint64_t pos);

/* How many of the leading positions [0, n) an open of the file would keep
 * now (n at most ctxs__peek_prefix_held()): n when the record was written
 * in this boot, whose page cache holds what it claims; otherwise, as after
 * a power loss, the first of them at or above the record's watermark whose
 * checksum fails (ctxs__recover's rule), which costs a read of the KV of
 * the positions between the watermark and n. The one exception is the
 * file changing meanwhile: a hint, as everything here.
 * Errors: CTXS_ENOMEM, -errno. */
int ctxs__peek_kept(uint64_t *out, int fd, const ctxs__peek *p, uint64_t n);

#endif
