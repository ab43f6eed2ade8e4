/*
 * Growing a session's capacity: the same tokens in a file of more slots.
 *
 * Every global layer's runs are laid out at the capacity, so a new
 * capacity moves every run: the file is rewritten. The new file is written
 * aside (aside.c) from the old one's mapping, or by copy_file_range(),
 * which shares the blocks (a reflink) where the filesystem can and copies
 * in the kernel elsewhere; it is made durable, then renamed over the old
 * name. What each step leaves:
 *
 * - Until the rename, the old file is the session, untouched: a process
 *   killed meanwhile leaves it, and at most a "<file>.tmp-<pid>-<n>" (with
 *   O_TMPFILE, a "<file>.tmp-<pid>-grow", the unnamed file linked just
 *   before the rename) that a store's repair removes.
 * - The rename swaps one complete, synced file for another: a crash after
 *   it finds the grown file. The directory is synced before the call
 *   returns.
 *
 * The old file is held exclusively (both lock bytes) throughout, as by a
 * compaction: no handle in any process has it open, and none opens it
 * until the rename, after which an open finds the new file, write-locked
 * until the call has let go of it.
 *
 * Slots are positions as long as a session has not gone round its ring
 * (n_tokens <= capacity): the held slots are copied to the same slots of
 * the new runs. A windowed layer's ring (window + batch slots) does not
 * depend on the capacity and is copied whole, with its checksum table.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "aside.h"
#include "internal.h"
#include "lock.h"
#include "peek.h"
#include "platform.h"
#include "session_iface.h"
#include "syscall.h"

#ifdef CTXS_TEST_HOOKS
void (*ctxs__grow_hook)(int step);
#endif

static void hook(int step)
{
    CTXS__TEST_HOOK(ctxs__grow_hook, step);
}

/* Copies len bytes at off_in of s's file to off_out of fd: in the kernel
 * (shared blocks where the filesystem can) while copy_file_range() serves,
 * then from the mapping. */
static int copy_range(int fd, uint64_t off_out, const ctxs_session *s, uint64_t off_in,
                      uint64_t len, int *kernel)
{
    /* The page that the next slots share stays the new file's own: a block
     * shared with the old file would need new space when first written
     * through the mapping, where a full disk is a SIGBUS. */
    uint64_t end = off_out + len, shared = (end & ~(uint64_t)(CTXS__PAGE - 1));
    uint64_t tail = shared > off_out ? end - shared : len;
    len -= tail;
    while (len && *kernel) {
        loff_t in = (loff_t)off_in, out = (loff_t)off_out;
        ssize_t n = copy_file_range(s->fd, &in, fd, &out, (size_t)len, 0);
        if (n > 0) {
            off_in += (uint64_t)n;
            off_out += (uint64_t)n;
            len -= (uint64_t)n;
            continue;
        }
        if (n < 0 && (errno == ENOSPC || errno == EDQUOT))
            return CTXS_EFULL;
        if (n < 0 && errno != EXDEV && errno != EINVAL && errno != ENOSYS &&
            errno != EOPNOTSUPP && errno != EBADF)
            return -errno;
        *kernel = 0; /* not here: the mapping, for the rest */
    }
    len += tail;
    return len ? ctxs__write_exact(fd, s->map + off_in, (size_t)len, (off_t)off_out) : 0;
}

/* A windowed layer keeps its ring under both capacities, or is laid out
 * globally under both: else its slots would have to move between the two
 * kinds of run. */
static int same_rings(const ctxs__file_layout *a, const ctxs__file_layout *b)
{
    for (uint32_t j = 0; j < a->pat; j++)
        if ((a->group[j] < 0) != (b->group[j] < 0) || (a->group[j] >= 0 && a->len[j] != b->len[j]))
            return 0;
    return 1;
}

/* The largest capacity at which every windowed layer laid out over every
 * slot stays so (ctxs__layout_compute()'s rule). */
static uint64_t most_without_rings(const ctxs__file_layout *lay)
{
    uint64_t most = UINT64_MAX;
    for (uint32_t j = 0; j < lay->pat; j++) {
        if (!lay->window[j] || lay->group[j] >= 0 || !lay->batch)
            continue;
        uint64_t want = (uint64_t)lay->window[j] + lay->batch;
        uint64_t last = want + lay->n_sink > want ? want + lay->n_sink - 1 : want;
        most = last < most ? last : most;
    }
    return most;
}

static int write_new(int fd, const ctxs_session *s, const ctxs__file_layout *nl)
{
    const ctxs__file_layout *ol = &s->lay;
    const uint64_t n = s->st.n_tokens;
    /* Where blocks are written in place only while no other file shares
     * them (ctxs__file_in_place), every later write into a shared block
     * would need new space: such a file is copied from the mapping. */
    int kernel = !ctxs__file_in_place(fd), rc;
    ctxs__disk_header h;
    ctxs__header_init(&h, nl, &s->model, s->ring ? CTXS__FLAG_RING : 0, s->created_unix_ms);
    ctxs__disk_label label;
    memcpy(&label, s->map + CTXS__LABEL_OFF, sizeof(label));
    /* Nothing of the copy is known durable until the sync below; a power
     * loss before the rename leaves the old file, and one after it finds
     * this file synced. verified_from stays the old file's. */
    if ((rc = ctxs__new_file_size(fd, nl)) < 0 ||
        (rc = ctxs__new_file_first_page(fd, &h, &s->st, &label)) < 0 ||
        (rc = ctxs__write_exact(fd, ctxs__token_table(s), (size_t)n * 4,
                                (off_t)nl->tokens_off)) < 0 ||
        (rc = ctxs__write_exact(fd, ctxs__sum_table(s), (size_t)n * 8, (off_t)nl->sums_off)) < 0)
        return rc;
    for (uint32_t g = 0; g < ol->n_groups; g++)
        if ((rc = ctxs__write_exact(fd, ctxs__group_table(s, g),
                                    ol->groups[g].len * sizeof(ctxs__group_entry),
                                    (off_t)nl->groups[g].table_off)) < 0)
            return rc;
    const uint32_t runs = 2 * ol->n_layers * ol->n_kv_heads, per = 2 * ol->n_kv_heads;
    for (uint32_t run = 0; run < runs; run++) {
        /* A ring whole; a global run's slots below n, which are positions. */
        uint64_t slots = ctxs__layer_group(ol, run / per) >= 0 ? ctxs__layer_cap(ol, run / per) : n;
        if ((rc = copy_range(fd, nl->kv_off + ctxs__run_off(nl, run), s,
                             ol->kv_off + ctxs__run_off(ol, run), slots * ol->slot_bytes,
                             &kernel)) < 0)
            return rc;
        if (ol->scales_bytes &&
            (rc = ctxs__write_exact(fd, s->map + ol->scales_off + ctxs__run_scales_off(ol, run),
                                    (size_t)slots * 4,
                                    (off_t)(nl->scales_off + ctxs__run_scales_off(nl, run)))) < 0)
            return rc;
    }
    hook(CTXS__GROW_COPIED);
    return ctxs__sync_data(fd);
}

/* Gives the aside file path's name, replacing the old file: it is linked
 * under a temporary name first where it has none (O_TMPFILE). */
static int replace(ctxs__aside *a, const char *path)
{
    char *tmp = NULL;
    if (!a->tmp) {
        size_t len = strlen(path) + 48;
        if (!(tmp = malloc(len)))
            return CTXS_ENOMEM;
        snprintf(tmp, len, "%s.tmp-%ld-grow", path, (long)getpid());
        int rc = ctxs__aside_link(a, tmp);
        if (rc < 0) {
            free(tmp);
            return rc;
        }
        a->tmp = tmp;
    }
    hook(CTXS__GROW_LINKED);
    if (ctxs__rename(a->tmp, path) != 0)
        return -errno;
    free(a->tmp);
    a->tmp = NULL;
    hook(CTXS__GROW_RENAMED);
    return ctxs__sync_parent_dir(path);
}

int ctxs__session_grow(const char *path, uint32_t capacity, uint64_t *disk_bytes)
{
    *disk_bytes = 0;
    /* As a compaction: a look that changes nothing, then a writer's open
     * (recovery, if the file needs it), then everyone kept out. */
    ctxs_session *s;
    int rc = ctxs__session_open_alone(&s, path);
    if (!s && rc == CTXS_EBUSY)
        return ctxs__error(rc, "the session is open (a handle in this or another process): "
                           "close it before growing it");
    if (!s)
        return rc;
    struct stat sb;
    if (rc == CTXS_EBUSY)
        rc = ctxs__error(rc, "a reader has the session open: close it before growing it");
    ctxs__file_layout nl;
    if (rc == 0 && capacity <= s->lay.capacity)
        rc = ctxs__error(CTXS_EINVAL, "a capacity of %u slots does not grow the session, "
                         "which has %u", capacity, s->lay.capacity);
    if (rc == 0 && s->st.n_tokens > s->lay.capacity)
        rc = ctxs__error(CTXS_EINVAL, "the session's ring has gone round (%" PRIu64 " tokens "
                         "through %u slots): its slots are no longer its positions, and it "
                         "cannot grow", s->st.n_tokens, s->lay.capacity);
    if (rc == 0 && (rc = ctxs__layout_compute(&nl, &s->model.geometry, capacity, s->lay.n_sink,
                                              s->lay.batch)) < 0)
        ctxs__error_more(rc, "growing to %u slots", capacity);
    if (rc == 0 && !same_rings(&s->lay, &nl))
        rc = ctxs__error(CTXS_EINVAL, "at %u slots windowed layers laid out over every slot "
                         "would get rings of their own, which a grow does not convert: grow "
                         "to at most %" PRIu64 " slots", capacity, most_without_rings(&s->lay));
    if (rc == 0) {
        ctxs__aside a;
        if ((rc = ctxs__aside_open(&a, path, O_RDWR)) == 0) {
            if ((rc = write_new(a.fd, s, &nl)) == 0)
                rc = replace(&a, path);
            ctxs__aside_unname(&a);
            if (rc == 0 && ctxs__fstat(a.fd, &sb) == 0)
                *disk_bytes = (uint64_t)sb.st_blocks * 512u;
            close(a.fd);
        }
    }
    ctxs_session_close(s);
    return rc;
}

int ctxs_session_grow(const char *path, uint32_t capacity)
{
    ctxs__error_begin();
    CTXS__CHECK(path && *path);
    uint64_t bytes;
    return ctxs__session_grow(path, capacity, &bytes);
}
