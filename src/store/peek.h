/*
 * Reading what a session file says without opening it as a session: no
 * mapping, no lock, no verification. The index uses it to check prefix
 * entries and checkpoints and to size files cheaply; anything it finds is a
 * hint that a real open confirms before data is trusted.
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

#endif
