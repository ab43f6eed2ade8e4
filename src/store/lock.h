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

#endif
