/*
 * New files written aside: a file that gets its name only once it is
 * complete, so that no reader (and no crash) ever sees it half written.
 *
 * Where the filesystem can (Linux O_TMPFILE, and /proc to name the file
 * by its descriptor), the file has no name at all until it is linked: a
 * process killed while writing leaves nothing behind. Elsewhere it is
 * "<path>.tmp-<pid>-<n>", which a crash can leave; inside a store the
 * create's intent and repair remove those (sessions.c, repair.c).
 *
 * Either way the file is write-locked (CTXS__LOCK_WRITER) from the start,
 * which is how a cleaner tells a live create's file from a dead one's.
 */
#ifndef CTXS_STORE_ASIDE_H
#define CTXS_STORE_ASIDE_H

#include <stdbool.h>

typedef struct ctxs__aside {
    int fd;    /* the new file, open with the access asked for, locked */
    char *tmp; /* its temporary name, or NULL while it has none */
} ctxs__aside;

/* Creates the file that will become path, open O_RDWR or O_WRONLY
 * (access_mode). Returns 0, CTXS_ENOMEM, CTXS_EBUSY or -errno; on failure
 * nothing is left to release. */
int ctxs__aside_open(ctxs__aside *a, const char *path, int access_mode);

/* Gives the complete file its name, path, which must not exist: 0 or
 * -errno (-EEXIST when it does). Making the name durable is the caller's
 * (ctxs__sync_parent_dir). */
int ctxs__aside_link(ctxs__aside *a, const char *path);

/* Removes the temporary name, if the file has one, whether it was linked
 * or not. The descriptor stays open: it is the caller's to close. */
void ctxs__aside_unname(ctxs__aside *a);

#ifdef CTXS_TEST_HOOKS
/* Tests only: true makes every new file take a temporary name, the way it
 * does where O_TMPFILE is missing. */
void ctxs__aside_force_named(bool on);
#endif

#endif
