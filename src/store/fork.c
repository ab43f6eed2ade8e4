/*
 * ctxs_session_fork: a new session file holding a prefix of another's tokens.
 *
 * The new file is made like any new file (ctxs__create_file: written aside,
 * linked into place) and holds the state ctxs_session_rollback(n) would give
 * the source, with verified_from 0: nothing of the copy is known durable, so
 * after a power loss an open verifies every token and keeps the longest
 * prefix that verifies. Its bytes come from a clone of the whole source file
 * (FICLONE) where the filesystem can share blocks, and are otherwise copied
 * from the source's mapping, held slots only.
 *
 * The source may be a read-only handle while another process writes the
 * file. What makes a copy taken under a live writer exact is the writer's
 * own rule: a slot a record holds is never rewritten until a record that
 * stops holding it has been written (rollback, eviction), and every record
 * write raises seq. So the source's committed state is taken before the
 * copy and again after it, and the copy stands only if the later state
 * still holds every position of the fork with the checksums that were
 * copied. When seq did not move, nothing the fork holds can have changed.
 * When it did, the positions may have been dropped and written again in
 * between, possibly twice, back to the same checksums while the copy saw
 * the other bytes: the copy is then also verified against the checksums
 * it carries. A fork that fails either check is CTXS_ESTALE.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/fs.h> /* FICLONE */
#endif

#include "internal.h"
#include "platform.h"
#include "syscall.h"

#ifdef CTXS_TEST_HOOKS
void (*ctxs__fork_hook)(int step);
#endif

static void hook(int step)
{
    CTXS__TEST_HOOK(ctxs__fork_hook, step);
}

typedef struct fork_job {
    ctxs_session *src;
    const ctxs__disk_label *label; /* the new file's, or NULL for src's */
    ctxs__state before;   /* src's committed state when the copy began */
    ctxs__state st;       /* the new file's state */
    uint32_t durability;
} fork_job;

/* The slots st holds, in at most three runs: the sinks, then the recent
 * positions' one or two (a run that continues the one before is merged). */
static uint32_t held_spans(ctxs__span out[3], const ctxs_session *s, const ctxs__state *st)
{
    const uint64_t n = st->n_tokens, ns = s->lay.n_sink;
    const uint64_t first = ctxs__first_recent(s, st);
    uint32_t k = 0;
    if (n && ns)
        out[k++] = (ctxs__span){ 0, (uint32_t)(n < ns ? n : ns) };
    if (first < n) {
        ctxs__span r[2];
        uint32_t m = ctxs__slot_spans(r, first, n - first, s->lay.capacity, s->lay.n_sink);
        for (uint32_t i = 0; i < m; i++) {
            if (k && out[k - 1].slot + out[k - 1].count == r[i].slot)
                out[k - 1].count += r[i].count;
            else
                out[k++] = r[i];
        }
    }
    return k;
}

/* The slots st does not hold: those the next positions will take, as in
 * ctxs__forget_unheld(). */
static uint32_t unheld_spans(ctxs__span out[2], const ctxs_session *s, const ctxs__state *st)
{
    uint64_t free_slots = s->lay.capacity - ctxs__held(s, st);
    return ctxs__slot_spans(out, st->n_tokens, free_slots, s->lay.capacity, s->lay.n_sink);
}

/* 1 if now holds every position want holds. */
static int holds_all(const ctxs_session *s, const ctxs__state *now, const ctxs__state *want)
{
    uint64_t first = ctxs__first_recent(s, want);
    return want->n_tokens <= now->n_tokens &&
           (first >= want->n_tokens || first >= ctxs__first_recent(s, now));
}

/* Clones the whole source file into fd. Returns 1, 0 where the filesystem
 * cannot share blocks (or not across these two files), or an error. */
static int try_clone(int fd, const ctxs_session *src)
{
#ifdef FICLONE
    if (ctxs__ficlone(fd, src->fd) == 0)
        return 1;
    switch (errno) {
    case EOPNOTSUPP:
    case EXDEV:
    case EINVAL:
    case ENOTTY:
        return 0;
    case ENOSPC:
    case EDQUOT:
        return CTXS_EFULL;
    default:
        return -errno;
    }
#else
    (void)fd;
    (void)src;
    return 0;
#endif
}

/* A fresh header rather than src's: the new file is written by this
 * version and created now (a fork of a 1.0 file is a 1.1 file). The label
 * is the one asked for, else src's, byte for byte. */
static int write_first_page(int fd, const fork_job *job)
{
    const ctxs_session *src = job->src;
    ctxs__disk_header h;
    ctxs__header_init(&h, &src->lay, &src->model, src->ring ? CTXS__FLAG_RING : 0,
                      ctxs__now_ms());
    ctxs__disk_label label;
    if (job->label)
        label = *job->label;
    else
        memcpy(&label, src->map + CTXS__LABEL_OFF, sizeof(label));
    return ctxs__new_file_first_page(fd, &h, &job->st, &label);
}

/* Token ids, checksums and (Q8) scales of the held slots, from src's
 * mapping. After a clone, the other slots' entries are zeroed too: the
 * clone brought src's checksums of slots the fork does not hold, which must
 * not survive (a later record of the fork could claim their positions while
 * the pages still hold src's bytes), and so every entry is rewritten and
 * the table pages become the fork's own blocks rather than src's shared
 * ones, which commits (and an engine's Q8 scales) write through the mapping
 * with no allocation to report a full disk. */
static int write_tables(int fd, const ctxs_session *src, const ctxs__state *st, int cloned)
{
    const ctxs__file_layout *lay = &src->lay;
    ctxs__span held[3], unheld[2];
    uint32_t n_held = held_spans(held, src, st);
    int rc;
    for (uint32_t i = 0; i < n_held; i++) {
        uint64_t slot = held[i].slot, count = held[i].count;
        if ((rc = ctxs__write_exact(fd, ctxs__token_table(src) + slot, count * 4,
                                    (off_t)(lay->tokens_off + slot * 4))) < 0 ||
            (rc = ctxs__write_exact(fd, ctxs__sum_table(src) + slot, count * 8,
                                    (off_t)(lay->sums_off + slot * 8))) < 0)
            return rc;
        for (uint32_t run = 0; lay->scales_bytes && run < 2u * lay->n_layers * lay->n_kv_heads;
             run++) {
            if (ctxs__layer_group(lay, run / (2 * lay->n_kv_heads)) >= 0)
                continue; /* a ring of its own: write_rings() */
            uint64_t off = lay->scales_off + ctxs__run_scales_off(lay, run) + slot * 4;
            if ((rc = ctxs__write_exact(fd, src->map + off, count * 4, (off_t)off)) < 0)
                return rc;
        }
    }
    uint32_t n_unheld = cloned ? unheld_spans(unheld, src, st) : 0;
    for (uint32_t i = 0; i < n_unheld; i++) {
        uint64_t slot = unheld[i].slot, count = unheld[i].count;
        if ((rc = ctxs__write_zeros(fd, lay->tokens_off + slot * 4, count * 4)) < 0 ||
            (rc = ctxs__write_zeros(fd, lay->sums_off + slot * 8, count * 8)) < 0)
            return rc;
        for (uint32_t run = 0; lay->scales_bytes && run < 2u * lay->n_layers * lay->n_kv_heads;
             run++)
            if (ctxs__layer_group(lay, run / (2 * lay->n_kv_heads)) < 0 &&
                (rc = ctxs__write_zeros(fd, lay->scales_off + ctxs__run_scales_off(lay, run) + slot * 4,
                                  count * 4)) < 0)
                return rc;
    }
    return 0;
}

/* The windowed layers' rings, whole (their window and what they still keep
 * below it, for a rollback: a window and a batch, small), with their
 * scales, unless cloned; and their checksum tables, without the entries
 * of positions the fork does not have. */
static int write_rings(int fd, const ctxs_session *src, const ctxs__state *st, int cloned)
{
    const ctxs__file_layout *lay = &src->lay;
    const uint32_t per = 2 * lay->n_kv_heads;
    int rc;
    for (uint32_t run = 0; !cloned && run < lay->n_layers * per; run++) {
        if (ctxs__layer_group(lay, run / per) < 0)
            continue;
        uint64_t len = ctxs__layer_cap(lay, run / per);
        uint64_t off = lay->kv_off + ctxs__run_off(lay, run);
        posix_fadvise(src->fd, (off_t)off, (off_t)(len * lay->slot_bytes), POSIX_FADV_WILLNEED);
        if ((rc = ctxs__write_exact(fd, src->map + off, (size_t)(len * lay->slot_bytes),
                                    (off_t)off)) < 0)
            return rc;
        off = lay->scales_off + ctxs__run_scales_off(lay, run);
        if (lay->scales_bytes &&
            (rc = ctxs__write_exact(fd, src->map + off, (size_t)len * 4, (off_t)off)) < 0)
            return rc;
    }
    ctxs__group_entry buf[256];
    for (uint32_t g = 0; g < lay->n_groups; g++) {
        const ctxs__group_entry *t = ctxs__group_table(src, g);
        for (uint32_t i = 0; i < lay->groups[g].len;) {
            uint32_t n = lay->groups[g].len - i < 256 ? lay->groups[g].len - i : 256;
            for (uint32_t j = 0; j < n; j++)
                buf[j] = t[i + j].pos < st->n_tokens ? t[i + j] : (ctxs__group_entry){0, 0};
            if ((rc = ctxs__write_exact(fd, buf, n * sizeof(*buf),
                                        (off_t)(lay->groups[g].table_off + i * sizeof(*buf)))) < 0)
                return rc;
            i += n;
        }
    }
    return 0;
}

/* Copies the held slots of every (layer, K|V, head) run with pwrite, so that
 * their blocks are allocated here and a full disk is an error, not a SIGBUS.
 * Slots [0, min(n_tokens, capacity)) get blocks even where not held (the
 * front of a ring that had wrapped): a session takes every slot below that
 * to be allocated and reserve allocates only past it. Offsets stay within
 * file_bytes, which ctxs__layout_compute() checked. */
static int copy_kv(int fd, const ctxs_session *src, const ctxs__state *st)
{
    const ctxs__file_layout *lay = &src->lay;
    ctxs__span held[3];
    uint32_t n_held = held_spans(held, src, st);
    uint64_t alloc = st->n_tokens < lay->capacity ? st->n_tokens : lay->capacity;
    uint32_t runs = 2 * lay->n_layers * lay->n_kv_heads;
    for (uint32_t run = 0; run < runs; run++) {
        if (ctxs__layer_group(lay, run / (2 * lay->n_kv_heads)) >= 0)
            continue; /* write_rings() */
        uint64_t base = lay->kv_off + ctxs__run_off(lay, run);
        int rc = alloc ? ctxs__allocate(fd, base, alloc * lay->slot_bytes) : 0;
        if (rc < 0)
            return rc;
        for (uint32_t i = 0; i < n_held; i++) {
            uint64_t off = base + (uint64_t)held[i].slot * lay->slot_bytes;
            uint64_t len = (uint64_t)held[i].count * lay->slot_bytes;
            /* src's mapping reads no ahead (MADV_RANDOM); a cold source is
             * read in large requests rather than a fault per page. */
            posix_fadvise(src->fd, (off_t)off, (off_t)len, POSIX_FADV_WILLNEED);
            if ((rc = ctxs__write_exact(fd, src->map + off, (size_t)len, (off_t)off)) < 0)
                return rc;
        }
    }
    return 0;
}

/* After a clone, the slots from min(n_tokens, capacity) on hold whatever
 * src had there: tokens it dropped, reservations it has not committed.
 * They are punched out, so that the fork carries none of it, and so that
 * its next tokens go to blocks reserve allocates for it alone: a block
 * shared with src needs new space when first written, through the mapping,
 * where a full disk is a SIGBUS. (The slots below stay: a session takes
 * them to be allocated.) */
static int punch_tail(int fd, const ctxs__file_layout *lay, const ctxs__state *st)
{
#ifdef FALLOC_FL_PUNCH_HOLE
    if (st->n_tokens >= lay->capacity)
        return 0;
    uint64_t from = st->n_tokens * lay->slot_bytes;
    uint64_t len = (uint64_t)lay->head_stride - from;
    uint32_t runs = 2 * lay->n_layers * lay->n_kv_heads;
    for (uint32_t run = 0; run < runs; run++) {
        if (ctxs__layer_group(lay, run / (2 * lay->n_kv_heads)) >= 0)
            continue; /* a ring keeps what it holds below the window */
        off_t off = (off_t)(lay->kv_off + ctxs__run_off(lay, run) + from);
        if (ctxs__fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, (off_t)len) != 0) {
            if (errno == EOPNOTSUPP)
                return 0; /* nothing carried over is ever read */
            return (errno == ENOSPC || errno == EDQUOT) ? CTXS_EFULL : -errno;
        }
    }
#else
    (void)fd;
    (void)lay;
    (void)st;
#endif
    return 0;
}

/* CTXS_ESTALE unless the checksums the new file holds for st's slots are
 * those src holds now. */
static int same_sums(int fd, const ctxs_session *src, const ctxs__state *st)
{
    const uint64_t *now = ctxs__sum_table(src);
    ctxs__span held[3];
    uint32_t n_held = held_spans(held, src, st);
    uint64_t copied[512];
    for (uint32_t i = 0; i < n_held; i++) {
        for (uint64_t slot = held[i].slot, end = slot + held[i].count; slot < end;) {
            size_t n = end - slot < 512 ? (size_t)(end - slot) : 512;
            int rc = ctxs__read_exact(fd, copied, n * 8, (off_t)(src->lay.sums_off + slot * 8));
            if (rc < 0)
                return rc;
            if (memcmp(copied, now + slot, n * 8) != 0)
                return CTXS_ESTALE;
            slot += n;
        }
    }
    return 0;
}

/* CTXS_ESTALE unless every token st holds in the new file (or, with
 * windows_only, in its windowed layers) matches the checksum the new file
 * carries for it. */
static int copy_verifies(int fd, const ctxs_session *src, const ctxs__state *st,
                         int windows_only)
{
    ctxs_session view;
    memset(&view, 0, sizeof(view));
    view.fd = -1;
    view.lay = src->lay;
    view.st = *st;
    void *map = ctxs__mmap(NULL, (size_t)src->lay.file_bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED)
        return errno == ENOMEM ? CTXS_ENOMEM : -errno;
    view.map = map;
    int rc = 0;
    if (!windows_only)
        rc = ctxs_session_verify(NULL, &view);
    for (uint32_t g = 0; windows_only && g < view.lay.n_groups && rc == 0; g++) {
        uint64_t from = ctxs__group_from(&view, st, g);
        if (from < st->n_tokens &&
            ctxs__group_first_bad(&view, g, from, st->n_tokens) < st->n_tokens)
            rc = CTXS_ECORRUPT;
    }
    munmap(map, (size_t)src->lay.file_bytes);
    return rc == CTXS_ECORRUPT ? CTXS_ESTALE : rc;
}

/* After the copy: does src still hold what was copied? (See the top.) */
static int check_still_held(int fd, const fork_job *job)
{
    ctxs_session *src = job->src;
    int rc = ctxs_session_refresh(src); /* nothing to do for a writer */
    if (rc < 0)
        return rc;
    if (!holds_all(src, &src->st, &job->st))
        return CTXS_ESTALE;
    if ((rc = same_sums(fd, src, &job->st)) < 0)
        return rc;
    if (src->st.seq != job->before.seq)
        return copy_verifies(fd, src, &job->st, 0);
    /* A writer's turn rewrites the ring slots of positions below its
     * windows before it commits anything: with no new record, the copy of
     * a windowed layer may still be another position's. */
    return src->lay.n_groups ? copy_verifies(fd, src, &job->st, 1) : 0;
}

/*
 * Writes the new file aside; ctxs__create_file() links it into place only
 * if this returns 0, and removes it otherwise. What each step leaves:
 *
 * - Until link(), the file has no name but the temporary one: a SIGKILL or a
 *   power loss leaves at most that stray temporary file, never a session.
 * - The first page, the tables and both records are durable before link():
 *   whatever of the rest a power loss drops, a file that has its name has
 *   its header and records. With a copy that is not FULL they are synced
 *   before the KV is written, so that this sync does not force the KV out
 *   too; the KV reaches the disk by writeback (started after link at ASYNC).
 *   A power loss before it does leaves records claiming KV that may be
 *   zeros or partly written; verified_from 0 makes the next open verify
 *   every token, from another boot, and keep the longest prefix that holds.
 * - At FULL everything is synced once, after the check, before link().
 * - A clone has no KV to write: one sync, at the end, makes the file and
 *   its shared blocks durable.
 * - After link() and until the fork returns, a SIGKILL leaves a complete
 *   file (the page cache holds all of it, and the records' boot id says so).
 */
static int fork_fill(int fd, void *arg)
{
    const fork_job *job = arg;
    const ctxs_session *src = job->src;
    /* Where blocks are written in place only while no other file shares
     * them (btrfs NOCOW, ctxs__file_in_place), a clone would make every
     * later write into the shared blocks need new space at the write
     * fault, where a full disk is a SIGBUS: such a fork copies. */
    int cloned = ctxs__file_in_place(fd) ? 0 : try_clone(fd, src);
    if (cloned < 0)
        return cloned;
    int sync_before_kv = !cloned && job->durability != CTXS_SYNC_FULL;
    int rc;
    hook(CTXS__FORK_STARTED);
    if ((rc = ctxs__new_file_size(fd, &src->lay)) < 0 ||
        (rc = write_first_page(fd, job)) < 0 ||
        (rc = write_tables(fd, src, &job->st, cloned)) < 0 ||
        (rc = write_rings(fd, src, &job->st, cloned)) < 0)
        return rc;
    hook(CTXS__FORK_TABLES_COPIED);
    if (sync_before_kv && (rc = ctxs__sync_data(fd)) < 0)
        return rc;
    if ((rc = cloned ? punch_tail(fd, &src->lay, &job->st) : copy_kv(fd, src, &job->st)) < 0)
        return rc;
    hook(CTXS__FORK_KV_COPIED);
    if ((rc = check_still_held(fd, job)) < 0)
        return rc;
    return sync_before_kv ? 0 : ctxs__sync_data(fd);
}

int ctxs_session_fork(ctxs_session **out, ctxs_session *src, const char *path,
                      uint64_t n_tokens, const ctxs_open_options *opts)
{
    ctxs__error_begin();
    int rc = ctxs__session_fork_labeled(out, src, path, n_tokens, opts, NULL);
    if (rc == 0 && (*out)->durability == CTXS_SYNC_ASYNC)
        ctxs__writeback_request_all(*out);
    return rc;
}

int ctxs__session_fork_labeled(ctxs_session **out, ctxs_session *src, const char *path,
                               uint64_t n_tokens, const ctxs_open_options *opts,
                               const ctxs__disk_label *label)
{
    CTXS__CHECK(out);
    *out = NULL;
    CTXS__CHECK(src && path && *path);
    ctxs_open_options o;
    int rc = ctxs__open_options_resolve(opts, &o);
    if (rc < 0)
        return rc;
    if (src->failed)
        return CTXS_EFAILED; /* its mapping may no longer match its records */
    /* Saves a copy that link() would refuse; link() alone decides. */
    struct stat sb;
    if (lstat(path, &sb) == 0)
        return -EEXIST;

    fork_job job = { .src = src, .label = label, .durability = o.durability };
    if ((rc = ctxs_session_refresh(src)) < 0)
        return rc;
    job.before = src->st;
    if (n_tokens == UINT64_MAX)
        n_tokens = src->st.n_tokens;
    if ((rc = ctxs__rollback_state(&job.st, src, n_tokens)) < 0)
        return rc;
    job.st.verified_from = 0;

    ctxs_session *s;
    if ((rc = ctxs__create_file(&s, path, &src->model, &o, fork_fill, &job)) < 0)
        return rc;
    *out = s;
    return 0;
}
