/*
 * Creating, opening and closing session files, and the read-side calls.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "aside.h"
#include "internal.h"
#include "lock.h"
#include "platform.h"
#include "syscall.h"

static int reserved_zero(const uint8_t *reserved, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (reserved[i])
            return 0;
    return 1;
}

int ctxs__open_options_resolve(const ctxs_open_options *in, ctxs_open_options *out)
{
    static const ctxs_open_options defaults = CTXS_OPEN_OPTIONS_INIT;
    if (!in) {
        *out = defaults;
        return 0;
    }
    if (in->version != 1 && in->version != CTXS_OPEN_OPTIONS_VERSION)
        return ctxs__error(CTXS_EINVAL,
                           "open options: version is %u, not %u: start from "
                           "CTXS_OPEN_OPTIONS_INIT", in->version, CTXS_OPEN_OPTIONS_VERSION);
    if (in->durability > CTXS_SYNC_FULL)
        return ctxs__error(CTXS_EINVAL,
                           "open options: durability %u is none of CTXS_SYNC_NONE, "
                           "CTXS_SYNC_ASYNC, CTXS_SYNC_FULL", in->durability);
    if (in->background > 1)
        return ctxs__error(CTXS_EINVAL, "open options: background is %u, not 0 or 1",
                           in->background);
    if (!reserved_zero(in->reserved, sizeof(in->reserved)) ||
        (in->version == 1 && (in->attn_period || in->attn_window || in->attn_global_mask)))
        return ctxs__error(CTXS_EINVAL, "open options: the reserved bytes must be zero");
    if (in->attn_period == 0 && (in->attn_window || in->attn_global_mask))
        return ctxs__error(CTXS_EINVAL,
                           "open options: attn_window or attn_global_mask without attn_period");
    if (in->attn_period > CTXS_SCHEDULE_MAX)
        return ctxs__error(CTXS_EINVAL, "open options: attn_period is %u, above %u",
                           in->attn_period, CTXS_SCHEDULE_MAX);
    if (in->attn_period && (in->attn_window == 0 || in->attn_window > CTXS__MAX_CAPACITY))
        return ctxs__error(CTXS_EINVAL, "open options: attn_window is %u, not 1..%u",
                           in->attn_window, CTXS__MAX_CAPACITY);
    const uint32_t every_layer = in->attn_period ? (1u << in->attn_period) - 1 : 0;
    if (in->attn_period && (in->attn_global_mask & ~every_layer))
        return ctxs__error(CTXS_EINVAL,
                           "open options: attn_global_mask 0x%x names layers past a pattern of %u",
                           in->attn_global_mask, in->attn_period);
    if (in->attn_period && in->attn_global_mask == every_layer)
        return ctxs__error(CTXS_EINVAL,
                           "open options: attn_global_mask makes every layer of the pattern "
                           "global (attn_period 0 says that)");
    *out = *in;
    return 0;
}

void ctxs__create_capacity(ctxs_create_options *o)
{
    if (!o->capacity)
        o->capacity = o->context_length ? o->context_length : CTXS_DEFAULT_CAPACITY;
}

int ctxs__create_options_resolve(const ctxs_create_options *in, ctxs_create_options *out)
{
    static const ctxs_create_options defaults = CTXS_CREATE_OPTIONS_INIT;
    if (!in) {
        *out = defaults;
        ctxs__create_capacity(out);
        return 0;
    }
    if (in->version != CTXS_CREATE_OPTIONS_VERSION)
        return ctxs__error(CTXS_EINVAL,
                           "create options: version is %u, not %u: start from "
                           "CTXS_CREATE_OPTIONS_INIT", in->version, CTXS_CREATE_OPTIONS_VERSION);
    if (in->ring > 1)
        return ctxs__error(CTXS_EINVAL, "create options: ring is %u, not 0 or 1", in->ring);
    if (!reserved_zero(in->reserved, sizeof(in->reserved)))
        return ctxs__error(CTXS_EINVAL, "create options: the reserved bytes must be zero");
    *out = *in;
    if (!out->batch)
        out->batch = CTXS_DEFAULT_BATCH;
    ctxs__create_capacity(out);
    return ctxs__open_options_resolve(&in->open, &out->open);
}

/* The schedule is the model's too: a session of another one holds other
 * layers' tokens. */
static int same_model(const ctxs_model *m, const ctxs__disk_header *h)
{
    ctxs_model file;
    ctxs__header_model(&file, h);
    const ctxs_geometry *a = &m->geometry, *b = &file.geometry;
    return a->n_layers == b->n_layers && a->n_kv_heads == b->n_kv_heads &&
           a->head_dim == b->head_dim && a->dtype == b->dtype && a->period == b->period &&
           memcmp(a->window, b->window, sizeof(a->window)) == 0 &&
           memcmp(m->model_hash, h->model_hash, 16) == 0 &&
           memcmp(m->tokenizer_hash, h->tokenizer_hash, 16) == 0;
}

/* Maps the file at an address aligned to 2 MiB: the 16 KiB-aligned regions
 * of the file are then 16 KiB aligned in memory too (Metal's no-copy buffers,
 * one layout everywhere), and the page cache's large folios line up with
 * the mapping. A merely 16 KiB-aligned shared mapping of a file with large
 * folios was measured 35x slower to fill on Linux 6.18 ext4: every write
 * fault re-ran page_mkwrite over the whole folio. */
#define MAP_ALIGN CTXS__MAP_ALIGN

static void *map_aligned(int fd, size_t len, int prot)
{
    size_t span = len + MAP_ALIGN;
    uint8_t *area =
        ctxs__mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (area == MAP_FAILED)
        return MAP_FAILED;
    uint8_t *at = (uint8_t *)(((uintptr_t)area + MAP_ALIGN - 1) & ~(uintptr_t)(MAP_ALIGN - 1));
    if (ctxs__mmap(at, len, prot, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
        int e = errno;
        munmap(area, span);
        errno = e;
        return MAP_FAILED;
    }
    if (at > area)
        munmap(area, (size_t)(at - area));
    if (area + span > at + len)
        munmap(at + len, (size_t)(area + span - (at + len)));
    return at;
}

static void session_free(ctxs_session *s)
{
    if (s->map)
        munmap(s->map, s->map_bytes);
    if (s->fd >= 0)
        close(s->fd);
    free(s->bounce);
    free((void *)s->file_written);
    free(s->seen);
    pthread_mutex_destroy(&s->record_mutex);
    free(s);
}

/* The same boot means the page cache still holds every write the record
 * was ordered after, whatever happened to the process: nothing to verify.
 * Another boot (or an unknown one) may have lost pages. */
static int needs_verify(const ctxs_session *s, const uint8_t record_boot[16])
{
    return s->verify_always || !ctxs__boot_vouches(record_boot);
}

/* CTXS_EMODEL for a model that is not the header's, saying how. */
static int model_mismatch(const ctxs_model *model, const ctxs__disk_header *h)
{
    ctxs_model file;
    char diff[160];
    ctxs__header_model(&file, h);
    ctxs__model_diff(diff, sizeof(diff), model, &file);
    return ctxs__error(CTXS_EMODEL, "the session belongs to another model: %s (here: the "
                       "model given; there: the file's)", diff);
}

/* The first bytes of a file too short for a header: a stub of ours is
 * corrupt, anything else is foreign. */
static int short_file(int fd, off_t size)
{
    char magic[8] = {0};
    size_t have = (size_t)size < 8 ? (size_t)size : 8;
    int rc = ctxs__read_exact(fd, magic, have, 0);
    if (rc < 0 && rc != CTXS_ECORRUPT)
        return rc;
    return have == 8 && memcmp(magic, CTXS__FILE_MAGIC, 8) == 0 ? CTXS_ECORRUPT
                                                              : CTXS_EFOREIGN;
}

/* Checks that s->fd is a regular file with a valid header (of model, when
 * given) and takes the layout and the model from it. */
static int attach_header(ctxs_session *s, const ctxs_model *model)
{
    struct stat st;
    if (ctxs__fstat(s->fd, &st) != 0)
        return -errno;
    if (S_ISDIR(st.st_mode))
        return ctxs__error(-EISDIR, "a directory, not a session file");
    if (!S_ISREG(st.st_mode))
        return ctxs__error(CTXS_EFOREIGN, "not a regular file, so not a session file");

    ctxs__disk_header h;
    int rc;
    if ((uint64_t)st.st_size < sizeof(h))
        return short_file(s->fd, st.st_size);
    if ((rc = ctxs__read_exact(s->fd, &h, sizeof(h), 0)) < 0 ||
        (rc = ctxs__header_check(&h, (uint64_t)st.st_size, &s->lay)) < 0)
        return rc;
    if (model && !same_model(model, &h))
        return model_mismatch(model, &h);
    ctxs__header_model(&s->model, &h);
    s->format_major = h.version_major;
    s->format_minor = h.version_minor;
    s->created_unix_ms = h.created_unix_ms;
    s->ring = (h.flags & CTXS__FLAG_RING) != 0;
    return 0;
}

static int attach_map(ctxs_session *s)
{
    s->map_bytes = (size_t)s->lay.file_bytes;
    void *map = map_aligned(s->fd, s->map_bytes, PROT_READ | (s->readonly ? 0 : PROT_WRITE));
    if (map == MAP_FAILED)
        return errno == ENOMEM ? CTXS_ENOMEM : -errno;
    s->map = map;
    /* No readahead anywhere in the mapping: it fills the page cache with
     * large folios, and a write fault dirties a whole folio, so that
     * writeback of a 9.4 MB turn was measured writing 386 MB (Linux 6.18,
     * ext4), and the first turn of a new 8k-token session read in its
     * whole file. Attention reads spans it knows; it gains nothing from
     * readahead's guesses. Not the KV alone: a fault on the tables reads
     * around itself, as far as the device's read-ahead (8 MiB on this
     * project's VM), into the KV's slots still to be written (a commit's
     * store of its token ids, after a cold open, brought in the next
     * turn's pages of the first runs in folios of 64 KiB). The tables are
     * asked for instead, in pages, without waiting. */
    madvise(s->map, s->map_bytes, MADV_RANDOM);
    const ctxs__file_layout *lay = &s->lay;
    posix_fadvise(s->fd, 0, (off_t)(lay->sums_off + lay->sums_bytes), POSIX_FADV_WILLNEED);
    if (lay->groups_bytes)
        posix_fadvise(s->fd, (off_t)lay->groups_off, (off_t)lay->groups_bytes,
                      POSIX_FADV_WILLNEED);
    return 0;
}

/* Takes the current record as the state, and verifies the tokens past its
 * watermark when this boot cannot vouch for them. */
static int attach_state(ctxs_session *s, unsigned flags)
{
    int other_valid;
    uint8_t record_boot[16];
    /* A reader may copy the records while the writer rewrites them: format.c
     * reads the pair until two reads agree. */
    int rc = ctxs__records_read(s, &s->st, &s->cur_record, &other_valid, record_boot);
    if (rc < 0)
        return rc;
    atomic_thread_fence(memory_order_acquire); /* the record, then the data */
    if (!other_valid)
        s->open_flags |= CTXS_INFO_RECOVERED;

    s->verify_always = (flags & CTXS_OPEN_VERIFY) != 0;
    if (needs_verify(s, record_boot)) {
        s->open_flags |= CTXS_INFO_VERIFIED;
        s->lost_tokens = ctxs__recover(s, &s->st);
        if (s->lost_tokens)
            s->open_flags |= CTXS_INFO_RECOVERED;
    }
    return 0;
}

/* A writer makes sure that no checksum outside the state can vouch for
 * bytes a later record will claim, and persists what recovery settled on,
 * durably, before it rewrites any slot. */
static int attach_settle(ctxs_session *s)
{
    int rc = 0;
    int stale = ctxs__forget_unheld(s);
    if (s->open_flags & (CTXS_INFO_RECOVERED | CTXS_INFO_VERIFIED)) {
        ctxs__state next = s->st;
        if ((rc = ctxs__sync_data(s->fd)) == 0) {
            next.verified_from = next.n_tokens;
            if ((rc = ctxs__record_write_both(s, &next)) == 0)
                rc = ctxs__sync_data(s->fd);
        }
    } else if (stale) {
        rc = ctxs__sync_meta(s);
    }
    if (rc < 0) {
        ctxs__fail(s); /* this boot's id must not vouch for it */
        return rc;
    }
    /* Either record may be what a power loss leaves: the smaller count. */
    ctxs__records recs;
    s->claim_floor = 0;
    if (ctxs__records_from_map(&recs, s->map, &s->lay, s->ring) == 0) {
        s->claim_floor = s->st.n_tokens;
        for (uint32_t i = 0; i < 2; i++)
            if (recs.valid[i] && recs.r[i].n_tokens < s->claim_floor)
                s->claim_floor = recs.r[i].n_tokens;
    }
    return 0;
}

/*
 * Maps an open, locked session file and brings it to a committed state it
 * can vouch for. Takes ownership of fd (closed on failure).
 */
static int session_attach(ctxs_session **out, int fd, unsigned flags,
                          const ctxs_model *model, const ctxs_open_options *opts)
{
    ctxs_session *s = ctxs__calloc(1, sizeof(*s));
    if (!s) {
        close(fd);
        return CTXS_ENOMEM;
    }
    s->fd = fd;
    s->readonly = (flags & CTXS_RDONLY) != 0;
    pthread_mutex_init(&s->record_mutex, NULL);

    int rc;
    if ((rc = attach_header(s, model)) < 0 || (rc = attach_map(s)) < 0 ||
        (rc = attach_state(s, flags)) < 0)
        goto fail;

    s->durability = opts->durability;
    s->background = opts->background;
    s->written_back_to = s->st.n_tokens;
    atomic_store(&s->writeback_rewind, UINT64_MAX);
    s->window = opts->window ? opts->window : s->lay.capacity;
    s->pressure_window = opts->pressure_window; /* 0: half the window */
    s->attn_period = opts->attn_period;
    s->attn_window = opts->attn_window;
    s->attn_global_mask = opts->attn_global_mask;
    s->alloc_end = s->st.n_tokens < s->lay.capacity ? (uint32_t)s->st.n_tokens
                                                    : s->lay.capacity;
    if (!s->readonly && (rc = attach_settle(s)) < 0)
        goto fail;
    if (!s->readonly &&
        (!(s->file_written = ctxs__calloc(s->lay.n_layers, sizeof(*s->file_written))) ||
         !(s->seen = ctxs__calloc(s->lay.n_layers, sizeof(*s->seen))))) {
        rc = CTXS_ENOMEM;
        goto fail;
    }

    ctxs__registry_add(s);
    ctxs__background_join(s);
    /* Off the caller's thread: the caller may attend right away, and waits
     * then only for the pages not yet in. (No runway yet: a file is sparse
     * until a turn is written, and the first reserve's size is unknown.) */
    if (s->st.n_tokens)
        ctxs__background_request(s, CTXS__JOB_WARM);
    *out = s;
    return 0;

fail:
    session_free(s);
    return rc;
}

int ctxs__new_file_size(int fd, const ctxs__file_layout *lay)
{
    /* Before any byte: btrfs takes NOCOW only on an empty file. */
    ctxs__file_in_place(fd);
    if (ctxs__ftruncate(fd, (off_t)lay->file_bytes) != 0)
        return (errno == EFBIG || errno == ENOSPC) ? CTXS_EFULL : -errno;
    /* The first page and the two tables take disk space now: commits write
     * the tables through the mapping, where a full disk would be a SIGBUS.
     * The KV region is allocated as slots are reserved. */
    return ctxs__allocate(fd, 0, lay->kv_off);
}

int ctxs__new_file_first_page(int fd, const ctxs__disk_header *h,
                              const ctxs__state *st, const ctxs__disk_label *label)
{
    uint8_t *page = ctxs__calloc(1, CTXS__PAGE);
    if (!page)
        return CTXS_ENOMEM;
    memcpy(page, h, sizeof(*h));
    /* Both records valid from the start and holding the same state (seq 1
     * current, seq 0 beside it), so that a damaged record is always news. */
    uint8_t boot[16];
    ctxs__boot_id(boot);
    for (uint32_t i = 0; i < 2; i++) {
        ctxs__disk_record r;
        memset(&r, 0, sizeof(r));
        r.seq = i == 0 ? 1 : 0;
        r.n_tokens = st->n_tokens;
        r.ring_start = st->ring_start;
        r.verified_from = st->verified_from;
        memcpy(r.boot_id, boot, 16);
        r.written_unix_ms = h->created_unix_ms;
        ctxs__record_seal(&r, i);
        memcpy(page + h->record_off[i], &r, sizeof(r));
    }
    if (label)
        memcpy(page + CTXS__LABEL_OFF, label, sizeof(*label));
    int rc = ctxs__write_exact(fd, page, CTXS__PAGE, 0);
    free(page);
    return rc;
}

typedef struct new_file {
    const ctxs__file_layout *lay;
    const ctxs__disk_header *h;
    const ctxs__disk_label *label; /* or NULL */
} new_file;

/* Writes a complete new, empty session file. */
static int write_new_file(int fd, void *arg)
{
    const new_file *nf = arg;
    static const ctxs__state empty;
    int rc;
    if ((rc = ctxs__new_file_size(fd, nf->lay)) < 0 ||
        (rc = ctxs__new_file_first_page(fd, nf->h, &empty, nf->label)) < 0)
        return rc;
    return ctxs__sync_data(fd);
}

int ctxs__create_file(ctxs_session **out, const char *path, const ctxs_model *model,
                      const ctxs_open_options *o, ctxs__fill_fn fill, void *arg)
{
    /* Written aside and linked into place: the name appears only with a
     * complete file behind it, and a link refuses to replace anything. */
    ctxs__aside a;
    int rc = ctxs__aside_open(&a, path, O_RDWR);
    if (rc < 0)
        return rc;
    int linked = 0;
    if ((rc = fill(a.fd, arg)) == 0 && (rc = ctxs__aside_link(&a, path)) == 0)
        linked = 1;
    ctxs__aside_unname(&a);
    if (rc == 0)
        rc = ctxs__sync_parent_dir(path);
    if (rc == 0)
        rc = session_attach(out, a.fd, 0, model, o); /* closes fd on failure */
    else
        close(a.fd);
    /* A create that fails leaves no file behind: a retry must not meet
     * -EEXIST. (Between the close and the unlink another process could
     * open the new session; it then holds an unlinked file.) */
    if (rc < 0 && linked)
        ctxs__unlink(path);
    return rc;
}

int ctxs_session_create(ctxs_session **out, const char *path,
                        const ctxs_model *model, const ctxs_create_options *opts)
{
    ctxs__error_begin();
    return ctxs__session_create_labeled(out, path, model, opts, NULL);
}

int ctxs__session_create_labeled(ctxs_session **out, const char *path,
                                 const ctxs_model *model, const ctxs_create_options *opts,
                                 const ctxs__disk_label *label)
{
    CTXS__REQUIRE(out, "out is NULL");
    *out = NULL;
    CTXS__REQUIRE(path && *path, "path is %s", path ? "empty" : "NULL");
    CTXS__REQUIRE(model, "model is NULL: a session is created for a model");
    ctxs_create_options o;
    int rc = ctxs__create_options_resolve(opts, &o);
    if (rc < 0)
        return rc;

    ctxs__file_layout lay;
    if ((rc = ctxs__layout_compute(&lay, &model->geometry, o.capacity, o.n_sink, o.batch)) < 0)
        return rc;
    ctxs__disk_header h;
    ctxs__header_init(&h, &lay, model, o.ring ? CTXS__FLAG_RING : 0, ctxs__now_ms());
    new_file nf = { &lay, &h, label };
    return ctxs__create_file(out, path, model, &o.open, write_new_file, &nf);
}

/* Opens and locks the file at path. A compaction or a grow renames a new
 * file over the path and then lets go of the old one: an open that found
 * the old file before the rename and locked it after would hold a file
 * nobody finds again, and lose every commit it makes. So the lock is kept
 * only on the file the path still names. */
#ifdef CTXS_TEST_HOOKS
void (*ctxs__open_hook)(const char *path);
#endif

static int open_locked(const char *path, int readonly, int *out_fd)
{
    for (int tries = 0; tries < 8; tries++) {
        /* O_NONBLOCK: a FIFO in place of the file must not hang the open;
         * the flag means nothing for the regular file attach insists on. */
        int fd = ctxs__open(path, (readonly ? O_RDONLY : O_RDWR) | O_CLOEXEC | O_NOFOLLOW |
                                      O_NONBLOCK);
        if (fd < 0) {
            int rc = -errno;
            return ctxs__error(rc, "%s: %s%s", path, strerror(-rc),
                               rc == -ELOOP ? " (a symbolic link in place of the file is refused)"
                                            : "");
        }
        CTXS__TEST_HOOK(ctxs__open_hook, path);
        int rc = ctxs__lock(fd, readonly ? CTXS__LOCK_READER : CTXS__LOCK_WRITER);
        if (rc < 0) {
            if (rc == CTXS_EBUSY)
                ctxs__lock_busy(fd, path, readonly);
            close(fd);
            return rc;
        }
        struct stat held, named;
        if (ctxs__fstat(fd, &held) < 0 ||
            ctxs__fstatat(AT_FDCWD, path, &named, AT_SYMLINK_NOFOLLOW) < 0) {
            rc = -errno;
            close(fd);
            if (rc == -ENOENT)
                continue; /* renamed away, or removed: the path decides */
            return ctxs__error(rc, "%s: %s", path, strerror(-rc));
        }
        if (held.st_dev == named.st_dev && held.st_ino == named.st_ino) {
            *out_fd = fd;
            return 0;
        }
        close(fd);
    }
    return ctxs__error(CTXS_EBUSY, "%s: replaced by another process at each of 8 opens "
                       "(a compaction or grow in a loop?)", path);
}

int ctxs_session_open(ctxs_session **out, const char *path, const ctxs_model *model,
                      unsigned flags, const ctxs_open_options *opts)
{
    ctxs__error_begin();
    CTXS__REQUIRE(out, "out is NULL");
    *out = NULL;
    CTXS__REQUIRE(path && *path, "path is %s", path ? "empty" : "NULL");
    CTXS__REQUIRE((flags & ~(CTXS_RDONLY | CTXS_OPEN_VERIFY)) == 0,
                  "flags 0x%x: only CTXS_RDONLY and CTXS_OPEN_VERIFY are known", flags);
    int readonly = (flags & CTXS_RDONLY) != 0;
    CTXS__REQUIRE(model || readonly,
                  "model is NULL: a read-write open needs the session's model "
                  "(only CTXS_RDONLY opens a file of any model)");
    ctxs_open_options o;
    int rc = ctxs__open_options_resolve(opts, &o);
    if (rc < 0)
        return rc;

    int fd = -1;
    if ((rc = open_locked(path, readonly, &fd)) < 0)
        return rc;
    rc = session_attach(out, fd, flags, model, &o);
    if (rc < 0 && ctxs__error_code() == rc)
        return ctxs__error_more(rc, "%s", path);
    return rc;
}

void ctxs_session_close(ctxs_session *s)
{
    if (!s)
        return;
    /* The background work is stopped and the close's writeback started
     * first: what the closing hook records of the file (its blocks, on a
     * file system that allocates them at writeback) is then what stays. */
    ctxs__background_leave(s);
    /* A writeback error no call has reported yet (the worker's, or a
     * split's at NONE) unvouched the records when it was met
     * (ctxs__writeback_failed()), so the next open verifies the file; the
     * closing hook records nothing of a handle it failed. */
    if (atomic_exchange(&s->writeback_error, 0) < 0)
        s->failed = 1;
    if (s->hooks)
        s->hooks->closing(s, s->hooks_arg);
    ctxs__registry_remove(s);
    session_free(s);
}

int ctxs_session_get_layout(ctxs_layout *out, const ctxs_session *s)
{
    ctxs__error_begin();
    CTXS__CHECK(s && out);
    out->kv = s->map + s->lay.kv_off;
    out->kv_bytes = (size_t)s->lay.kv_bytes;
    out->scales = s->lay.scales_bytes ? (float *)(void *)(s->map + s->lay.scales_off) : NULL;
    out->scales_bytes = (size_t)s->lay.scales_bytes;
    out->slot_bytes = s->lay.slot_bytes;
    out->head_stride = s->lay.head_stride;
    out->kv_stride = s->lay.kv_stride;
    out->layer_stride = s->lay.layer_stride;
    out->token_ids = ctxs__token_table(s);
    out->capacity = s->lay.capacity;
    out->n_sink = s->lay.n_sink;
    out->geometry = s->model.geometry;
    return 0;
}

int ctxs_session_get_layer_slots(uint32_t *out, const ctxs_session *s, uint32_t layer)
{
    ctxs__error_begin();
    CTXS__REQUIRE(out, "out is NULL");
    *out = 0;
    int rc = ctxs__check_run(s, layer, CTXS_K, 0);
    if (rc < 0)
        return rc;
    *out = ctxs__layer_cap(&s->lay, layer);
    return 0;
}

int ctxs_session_get_kv(void **out, ctxs_session *s, uint32_t layer, uint32_t kind, uint32_t head)
{
    ctxs__error_begin();
    CTXS__REQUIRE(out, "out is NULL");
    *out = NULL;
    int rc = ctxs__check_run(s, layer, kind, head);
    if (rc < 0)
        return rc;
    *out = ctxs__run(s, layer, kind, head);
    return 0;
}

int ctxs_session_get_slot(uint32_t *out, const ctxs_session *s, uint64_t pos)
{
    ctxs__error_begin();
    CTXS__CHECK(s && out);
    if (pos >= s->st.n_tokens)
        return ctxs__error(CTXS_ENOTFOUND, "position %" PRIu64 " is not committed: the "
                           "session holds positions below %" PRIu64, pos, s->st.n_tokens);
    if (!ctxs__holds(s, &s->st, pos))
        return ctxs__evicted(s, pos);
    *out = ctxs__slot(s, pos);
    return 0;
}

int ctxs_session_get_info(ctxs_session_info *out, const ctxs_session *s)
{
    ctxs__error_begin();
    CTXS__CHECK(s && out);
    memset(out, 0, sizeof(*out));
    out->model = s->model;
    out->format_major = s->format_major;
    out->format_minor = s->format_minor;
    out->capacity = s->lay.capacity;
    out->n_sink = s->lay.n_sink;
    out->n_tokens = s->st.n_tokens;
    out->ring_start = s->st.ring_start;
    out->n_held = (uint32_t)ctxs__held(s, &s->st);
    out->n_reserved = s->n_reserved;
    out->window = ctxs__effective_window(s);
    out->durability = s->durability;
    out->seq = s->st.seq;
    out->verified_from = s->st.verified_from;
    out->lost_tokens = s->lost_tokens;
    out->file_bytes = s->lay.file_bytes;
    out->created_unix_ms = s->created_unix_ms;
    out->flags = s->open_flags;
    if (s->readonly)
        out->flags |= CTXS_INFO_READONLY;
    if (s->st.ring_start > s->lay.n_sink)
        out->flags |= CTXS_INFO_WRAPPED;
    if (s->failed)
        out->flags |= CTXS_INFO_FAILED;
    if (ctxs_get_pressure())
        out->flags |= CTXS_INFO_PRESSURE;
    if (s->ring)
        out->flags |= CTXS_INFO_RING;
    if (s->background)
        out->flags |= CTXS_INFO_BACKGROUND;
    ctxs_window w;
    ctxs__window_spans(s, &s->st, out->window, &w);
    if (w.n_tokens < out->n_held)
        out->flags |= CTXS_INFO_PARTIAL_WINDOW;
    return 0;
}

int ctxs_session_refresh(ctxs_session *s)
{
    ctxs__error_begin();
    CTXS__CHECK(s);
    if (!s->readonly)
        return 0; /* a writer's state is always current */
    ctxs__state st;
    uint32_t index;
    int other_valid;
    uint8_t boot[16];
    int rc = ctxs__records_read(s, &st, &index, &other_valid, boot);
    if (rc < 0)
        return rc;
    atomic_thread_fence(memory_order_acquire);
    if (st.seq == s->st.seq)
        return 0;
    /* A record no writer of this boot wrote is trusted no more than at
     * open: a power loss may have kept it and lost the pages it claims. */
    if (needs_verify(s, boot)) {
        uint64_t lost = ctxs__recover(s, &st);
        if (lost) {
            s->lost_tokens = lost;
            s->open_flags |= CTXS_INFO_RECOVERED;
        }
    }
    ctxs__registry_set_state(s, &st, index);
    return 0;
}

int ctxs_session_verify(uint64_t *bad_pos, const ctxs_session *s)
{
    ctxs__error_begin();
    return ctxs_session_verify_range(bad_pos, s, 0, UINT64_MAX);
}

int ctxs_session_verify_range(uint64_t *bad_pos, const ctxs_session *s, uint64_t from,
                              uint64_t to)
{
    ctxs__error_begin();
    CTXS__CHECK(s);
    CTXS__REQUIRE(from <= to, "from %" PRIu64 " is above to %" PRIu64, from, to);
    uint64_t n = s->st.n_tokens;
    if (to > n)
        to = n;
    /* The held positions are two runs: the sinks, then the recent tokens. */
    uint64_t sink_end = n < s->lay.n_sink ? n : s->lay.n_sink;
    uint64_t first = ctxs__first_recent(s, &s->st);
    uint64_t runs[2][2] = { { from, sink_end < to ? sink_end : to },
                            { from > first ? from : first, to } };
    uint64_t worst = UINT64_MAX;
    for (int i = 0; i < 2 && worst == UINT64_MAX; i++) {
        uint64_t lo = runs[i][0], hi = runs[i][1];
        uint64_t bad = lo < hi ? ctxs__first_bad(s, lo, hi) : hi;
        if (bad < hi)
            worst = bad;
    }
    /* And the windowed layers' windows, over their own checksums. */
    uint32_t worst_window = 0;
    for (uint32_t g = 0; g < s->lay.n_groups; g++) {
        uint64_t lo = ctxs__group_from(s, &s->st, g);
        lo = lo > from ? lo : from;
        uint64_t bad = lo < to ? ctxs__group_first_bad(s, g, lo, to) : to;
        if (bad < to && bad < worst) {
            worst = bad;
            worst_window = s->lay.groups[g].window;
        }
    }
    if (worst == UINT64_MAX)
        return 0;
    if (bad_pos)
        *bad_pos = worst;
    if (worst_window)
        return ctxs__error(CTXS_ECORRUPT,
                           "the token at position %" PRIu64 " does not match its checksum "
                           "in the layers of window %u",
                           worst, worst_window);
    return ctxs__error(CTXS_ECORRUPT,
                       "the token at position %" PRIu64 " does not match its checksum", worst);
}
