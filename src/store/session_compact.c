/*
 * Compacting one session file: the KV blocks of slots that hold no token
 * (after a rollback, a recovery, or reservations never committed) go back
 * to the filesystem. The file keeps its size, its tokens and its format.
 *
 * Which slots may be punched is set by reserve, not by the held positions
 * alone: an open takes every slot below min(n_tokens, capacity) to have
 * disk blocks (alloc_end in session.c) and reserve allocates only past
 * that (commit.c), so that writing a reserved slot through the mapping
 * never needs new blocks, where a full disk is a SIGBUS. So only the slots
 * from min(n_tokens, capacity) on are punched: every one of them is
 * unheld, and the next reserve allocates them again. The unheld slots
 * below (the front of a ring that wrapped and was rolled back) keep their
 * blocks.
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "lock.h"
#include "peek.h"
#include "platform.h"
#include "syscall.h"

static uint64_t disk_bytes(int fd)
{
    struct stat sb;
    return ctxs__fstat(fd, &sb) == 0 ? (uint64_t)sb.st_blocks * 512u : 0;
}

/* Punches [off, off + len). Within the range, partial blocks are zeroed
 * and whole blocks freed; nothing outside it is touched. Returns 0, 1
 * where the filesystem cannot punch holes, or an error. */
static int punch(int fd, uint64_t off, uint64_t len)
{
#ifdef FALLOC_FL_PUNCH_HOLE
    if (ctxs__fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off,
                        (off_t)len) == 0)
        return 0;
    if (errno == EOPNOTSUPP || errno == ENOSYS)
        return 1;
    /* Splitting an extent can need a block. */
    return (errno == ENOSPC || errno == EDQUOT) ? CTXS_EFULL : -errno;
#else
    (void)fd;
    (void)off;
    (void)len;
    return 1;
#endif
}

/* Ranges that touch are punched as one (all of the KV region when from is
 * 0). */
int ctxs__punch_unheld(const ctxs_session *s, uint32_t from)
{
    const ctxs__file_layout *lay = &s->lay;
    if (from >= lay->capacity)
        return 0;
    const uint64_t runs = 2ull * lay->n_layers * lay->n_kv_heads;
    const uint64_t end = lay->kv_off + lay->kv_bytes;
    uint64_t at = 0, len = 0; /* the range gathered so far */
    for (uint64_t run = 0; run < runs; run++) {
        /* A windowed layer's ring keeps its window and what a rollback may
         * still take: none of it is punched. */
        uint32_t l = (uint32_t)(run / (2ull * lay->n_kv_heads));
        uint64_t base = lay->kv_off + ctxs__run_off(lay, (uint32_t)run);
        uint64_t run_bytes = (uint64_t)ctxs__layer_cap(lay, l) * lay->slot_bytes;
        uint64_t lo = base + (ctxs__layer_group(lay, l) >= 0 ? run_bytes
                                                            : (uint64_t)from * lay->slot_bytes);
        uint64_t hi = base + run_bytes;
        if (run == runs - 1)
            hi = end;
        if (lo >= hi)
            continue;
        if (len && at + len == lo) {
            len += hi - lo;
            continue;
        }
        if (len) {
            int rc = punch(s->fd, at, len);
            if (rc != 0)
                return rc;
        }
        at = lo;
        len = hi - lo;
    }
    return len ? punch(s->fd, at, len) : 0;
}

int ctxs__session_open_alone(ctxs_session **out, const char *path)
{
    *out = NULL;
    /* A look that changes nothing first: a file any handle has open is
     * left exactly as it is. The header gives the model to open with. */
    int fd = ctxs__open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return -errno;
    ctxs__peek p;
    int rc = ctxs__lock(fd, CTXS__LOCK_EXCLUSIVE);
    if (rc == 0)
        rc = ctxs__peek_fd(&p, fd);
    close(fd);
    if (rc < 0)
        return rc;

    /* A writer's open brings the file to a state it vouches for, durably:
     * recovery if the file needs it, and no checksum left in a slot the
     * state does not hold. Then no record, surviving or next, claims a slot
     * from min(n_tokens, capacity) on (a rollback writes its state into
     * both records and makes them durable before it returns). */
    ctxs_session *s;
    ctxs_open_options o = CTXS_OPEN_OPTIONS_INIT;
    o.background = 0; /* the caller's work alone: no window brought in */
    if ((rc = ctxs_session_open(&s, path, &p.model, 0, &o)) < 0)
        return rc;
    *out = s;
    /* Readers are kept out too, as by a delete: a reader that opened since
     * the look would see, say, the punched slots of a record it read
     * earlier. */
    struct stat sb;
    if ((rc = ctxs__lock(s->fd, CTXS__LOCK_EXCLUSIVE)) == 0 && ctxs__fstat(s->fd, &sb) == 0 &&
        sb.st_nlink == 0)
        rc = -ENOENT; /* deleted meanwhile */
    return rc;
}

int ctxs__session_compact(const char *path, uint64_t *bytes_before, uint64_t *bytes_after)
{
    *bytes_before = *bytes_after = 0;
    ctxs_session *s;
    int rc = ctxs__session_open_alone(&s, path);
    if (!s)
        return rc;
    if (rc == 0) {
        *bytes_before = disk_bytes(s->fd);
        uint64_t n = s->st.n_tokens;
        uint32_t from = n < s->lay.capacity ? (uint32_t)n : s->lay.capacity;
        rc = ctxs__punch_unheld(s, from);
        /* A punch lost to a power loss costs space, nothing else: those
         * slots are unheld and their checksums already zero. */
        if (rc == 0)
            rc = ctxs__sync_data(s->fd);
        else if (rc == 1)
            rc = 0; /* no hole punching here: nothing to give back */
        *bytes_after = disk_bytes(s->fd);
    }
    ctxs_session_close(s);
    return rc;
}
