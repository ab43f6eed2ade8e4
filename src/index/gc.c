/*
 * gc: deletes the least recently used sessions that no handle has open
 * until the store's session files fit a byte budget.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "index.h"
#include "syscall.h"

typedef struct gc_item {
    uint64_t id, last_used, bytes;
    const char *name;
} gc_item;

static int by_last_use(const void *a, const void *b)
{
    const gc_item *x = a, *y = b;
    if (x->last_used != y->last_used)
        return x->last_used < y->last_used ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

int ctxs_store_gc(ctxs_gc_result *out, ctxs_store *st, uint64_t budget_bytes)
{
    ctxs_gc_result res;
    memset(&res, 0, sizeof(res));
    if (out)
        *out = res;
    if (!st)
        return CTXS_EINVAL;
    ctxs_session_entry *list;
    size_t n;
    int rc = ctxs_store_session_list(&list, &n, st);
    if (rc < 0)
        return rc;
    gc_item *items = n ? ctxs__calloc(n, sizeof(*items)) : NULL;
    if (n && !items) {
        free(list);
        return CTXS_ENOMEM;
    }
    for (size_t i = 0; rc == 0 && i < n; i++) {
        char file[32];
        struct stat sb;
        ctxs__file_name(file, list[i].id);
        items[i] = (gc_item){list[i].id, list[i].last_used_unix_ms, 0, list[i].name};
        /* A size that cannot be read would be taken for 0 bytes: gc would
         * report success and free nothing. (ENOENT: deleted meanwhile.) */
        if (ctxs__fstatat(st->sessions_fd, file, &sb, AT_SYMLINK_NOFOLLOW) == 0)
            items[i].bytes = (uint64_t)sb.st_blocks * 512u;
        else if (errno != ENOENT)
            rc = -errno;
        res.bytes_before += items[i].bytes;
    }
    if (rc < 0) {
        free(items);
        free(list);
        return rc;
    }
    if (n)
        qsort(items, n, sizeof(*items), by_last_use);
    res.bytes_after = res.bytes_before;
    for (size_t i = 0; rc == 0 && i < n && res.bytes_after > budget_bytes; i++) {
        int r = ctxs__session_delete_id(st, items[i].id, items[i].name, strlen(items[i].name));
        if (r == CTXS_EBUSY) {
            res.skipped_open++;
        } else if (r == 0 || r == CTXS_ENOTFOUND) { /* or deleted meanwhile */
            res.deleted += r == 0;
            res.bytes_after -= items[i].bytes;
        } else {
            rc = r;
        }
    }
    free(items);
    free(list);
    if (out)
        *out = res;
    return rc;
}
