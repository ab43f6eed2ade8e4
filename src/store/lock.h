/*
 * Session locks. flock() cannot express "one writer beside any number of
 * readers" on one file (an exclusive flock excludes shared ones), so the
 * store uses open-file-description byte-range locks on two bytes that are
 * never written (locks beyond or inside the file do not touch its data):
 *   byte 0: the writer lock, exclusive;
 *   byte 1: the reader lock, shared by readers.
 * Maintenance that must exclude everyone (delete, gc) takes both
 * exclusively. Locks live with the descriptor: a crashed process's locks
 * vanish with it.
 */
#ifndef CTXS_STORE_LOCK_H
#define CTXS_STORE_LOCK_H

#include <stddef.h>

enum ctxs__lock_kind {
    CTXS__LOCK_WRITER,     /* byte 0 exclusive */
    CTXS__LOCK_READER,     /* byte 1 shared */
    CTXS__LOCK_EXCLUSIVE,  /* bytes 0 and 1 exclusive: no handle is open */
};

/* Takes the lock without waiting. Returns 0, CTXS_EBUSY, or -errno. */
int ctxs__lock(int fd, enum ctxs__lock_kind kind);

/* Whether another open file description holds the writer lock (kind
 * CTXS__LOCK_WRITER) or a reader lock (CTXS__LOCK_READER), without taking
 * anything: 1 or 0, or -errno. */
int ctxs__lock_probe(int fd, enum ctxs__lock_kind kind);

/* The process that holds the lock of kind on the file open at fd (for
 * CTXS__LOCK_WRITER the writer, for CTXS__LOCK_EXCLUSIVE a delete, gc or
 * compact), where the system says: Linux, a process whose descriptors
 * this one may read (the same user's); its name (comm) into name. 0 when
 * none is found. Reads /proc: for messages, never on a fast path. */
int ctxs__lock_holder(int fd, enum ctxs__lock_kind kind, char *name, size_t n);

/* Says why a lock of the open at fd was refused (CTXS_EBUSY, the last
 * error), with the holder when ctxs__lock_holder() finds it. what names
 * the file. Returns CTXS_EBUSY. */
int ctxs__lock_busy(int fd, const char *what, int readonly);

#endif
