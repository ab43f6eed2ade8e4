/*
 * The label of a session file (format 1.1, see ctxs__disk_label in
 * format.h): read and written by the store, by file descriptor, with or
 * without a session open on the file.
 */
#ifndef CTXS_STORE_LABEL_H
#define CTXS_STORE_LABEL_H

#include <stddef.h>
#include <stdint.h>

#include "format.h"

/* Fills *out with a sealed label. Errors: CTXS_EINVAL, as below. */
int ctxs__label_make(ctxs__disk_label *out, uint64_t store_id, const char *name, size_t len);

/* Writes the label (name: len bytes of UTF-8 without NUL) with one pwrite
 * of its 512 bytes, then makes it durable. Replaces any label there.
 * Errors: CTXS_EINVAL (len 0 or above 255, a NUL in name), CTXS_EFULL,
 * -errno. */
int ctxs__label_write(int fd, uint64_t store_id, const char *name, size_t len);

/* Reads the label: *store_id and name, NUL-terminated. Errors:
 * CTXS_ENOTFOUND (no label: the page does not start with the magic, as in
 * 1.0 files and files made outside a store), CTXS_ECORRUPT (the magic is
 * there but the CRC or the name does not hold, or the file is too short to
 * have the page), -errno. On error name is "" and *store_id 0. */
int ctxs__label_read(int fd, uint64_t *store_id, char name[CTXS_NAME_MAX + 1]);

#endif
