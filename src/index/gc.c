/*
 * gc: deletes the least recently used sessions that are not pinned and
 * that no handle has open, until the store's session files fit a byte
 * budget, and says which it deleted; or, as a dry run, which it would.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "index.h"
#include "lock.h"
#include "syscall.h"

typedef struct gc_item {
    uint64_t bytes;
    const ctxs_session_entry *e;
} gc_item;

static int by_last_use(const void *a, const void *b)
{
    const ctxs_session_entry *x = ((const gc_item *)a)->e, *y = ((const gc_item *)b)->e;
    if (x->last_used_unix_ms != y->last_used_unix_ms)
        return x->last_used_unix_ms < y->last_used_unix_ms ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* What a delete of id would meet now, without taking anything: CTXS_EBUSY
 * when a handle has the file open, CTXS_ENOTFOUND when it is gone, else
 * 0 (or -errno). */
static int would_delete(ctxs_store *st, uint64_t id)
{
    char file[32];
    ctxs__file_name(file, id);
    int fd = ctxs__openat(st->sessions_fd, file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return errno == ENOENT ? CTXS_ENOTFOUND : -errno;
    int rc = ctxs__lock_probe(fd, CTXS__LOCK_WRITER);
    if (rc == 0)
        rc = ctxs__lock_probe(fd, CTXS__LOCK_READER);
    close(fd);
    return rc > 0 ? CTXS_EBUSY : rc;
}

int ctxs_store_gc(ctxs_store_gc_result *out, ctxs_store *st, uint64_t budget_bytes, unsigned flags)
{
    ctxs__error_begin();
    ctxs_store_gc_result res;
    memset(&res, 0, sizeof(res));
    if (out)
        *out = res;
    if (!st || (flags & ~CTXS_GC_DRY_RUN))
        return CTXS_EINVAL;
    int dry = (flags & CTXS_GC_DRY_RUN) != 0;
    if (st->rdonly && !dry)
        return ctxs__store_readonly();
    ctxs_session_entry *list;
    size_t n;
    int rc = ctxs_store_session_list(&list, &n, st);
    if (rc < 0)
        return rc;
    gc_item *items = n ? ctxs__calloc(n, sizeof(*items)) : NULL;
    if (n && out && !(res.sessions = ctxs__calloc(n, sizeof(*res.sessions))))
        rc = CTXS_ENOMEM;
    if (n && !items)
        rc = CTXS_ENOMEM;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        char file[32];
        struct stat sb;
        ctxs__file_name(file, list[i].id);
        items[i] = (gc_item){0, &list[i]};
        /* A size that cannot be read would be taken for 0 bytes: gc would
         * report success and free nothing. (ENOENT: deleted meanwhile.) */
        if (ctxs__fstatat(st->sessions_fd, file, &sb, AT_SYMLINK_NOFOLLOW) == 0)
            items[i].bytes = (uint64_t)sb.st_blocks * 512u;
        else if (errno != ENOENT)
            rc = -errno;
        res.bytes_before += items[i].bytes;
    }
    if (rc == 0 && n)
        qsort(items, n, sizeof(*items), by_last_use);
    res.bytes_after = res.bytes_before;
    for (size_t i = 0; rc == 0 && i < n && res.bytes_after > budget_bytes; i++) {
        const ctxs_session_entry *e = items[i].e;
        int r;
        if (e->pinned)
            r = 1;
        else if (dry)
            r = would_delete(st, e->id);
        else
            r = ctxs__session_delete_id(st, e->id, e->name, strlen(e->name), 1);
        if (r == 1) {
            res.skipped_pinned++;
        } else if (r == CTXS_EBUSY) {
            res.skipped_open++;
        } else if (r == 0 || r == CTXS_ENOTFOUND) { /* or deleted meanwhile */
            if (r == 0) {
                res.deleted++;
                /* The size gc counted, not the index's older note of
                 * it: the lines a caller prints add up to the total. */
                if (res.sessions) {
                    res.sessions[res.n_sessions] = *e;
                    res.sessions[res.n_sessions++].disk_bytes = items[i].bytes;
                }
            }
            res.bytes_after -= items[i].bytes;
        } else {
            rc = r;
        }
    }
    free(items);
    free(list);
    if (!res.n_sessions) {
        free(res.sessions);
        res.sessions = NULL;
    }
    if (out)
        *out = res;
    else
        free(res.sessions);
    return rc;
}
