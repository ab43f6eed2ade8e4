/*
 * The index's data file checked before LMDB is let near it.
 *
 * LMDB maps index/data.mdb and trusts it: it reads the page that a meta
 * page or a branch page names without asking whether the file still
 * holds it. It bounds page numbers by the last page its meta claims
 * (mm_last_pg), not by the file's size, so a file cut short -- a backup
 * restored short, a copy onto a full disk -- is read past its end and the
 * process dies of SIGBUS in whatever call first touches a lost page,
 * reindex included. Nothing LMDB returns can be checked first; the file
 * can. So before mdb_env_open() this reads the two meta pages with
 * pread() and asks of them what LMDB would need to be true:
 *
 * - each is a meta page (P_META) with LMDB's magic and a data version;
 * - both agree on the page size, a power of two LMDB could have written;
 * - the one LMDB will use (the higher transaction id; page 0 on a tie,
 *   as mdb_env_read_header() picks) claims pages that the file holds:
 *   (mm_last_pg + 1) * mm_psize bytes at least, and roots of the free and
 *   main trees below that. This is the check that keeps LMDB's reads
 *   inside the file; a file may be longer (LMDB never shrinks it);
 * - its transaction id is one a writer can count on from (at most
 *   2^63 - 1: a writer's is one more, and 2^64 - 1 marks a free reader
 *   slot), and it sits on the page that id's parity names, where LMDB
 *   looks for it once the environment is open.
 *
 * Then the pages of the trees that meta reaches are walked
 * (check_file_pages.c): LMDB trusts what is inside a page as much as the file's
 * size, and a garbled node sends its reads past the page, the map or the
 * file. What neither sees -- records of the right shape with wrong
 * contents -- LMDB or the index's readers report as CTXS_EINDEX.
 *
 * The layout (lmdb's mdb.c, 0.9: MDB_page, MDB_meta, MDB_db) is mirrored
 * in lmdb_layout.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "index.h"
#include "lmdb_layout.h"
#include "platform.h"
#include "syscall.h"

/*
 * The files of index/ are regular files the store made: data.mdb,
 * lock.mdb, store.lock. Anything else there -- a FIFO, a socket, a device,
 * a directory, a symbolic link -- was put there by hand, and each kind
 * does harm of its own if opened as the file: a FIFO blocks the open
 * until someone writes to it (every command hangs), a link leads LMDB
 * out of the store (it would truncate and map the far file as its lock
 * table), a device is read as an index. So the names are looked at
 * without following a link before anything opens them, and every open
 * here is O_NOFOLLOW | O_NONBLOCK with the type checked on the
 * descriptor (a FIFO opened O_NONBLOCK returns at once). What to do is
 * ctxs_store_repair_index()'s: it replaces store.lock and lock.mdb (they
 * hold nothing) and moves a data.mdb that is not a file aside with the
 * damaged index.
 */
static const char *const index_files[] = {"data.mdb", "lock.mdb", "store.lock"};

int ctxs__index_file_open(const char *path, int flags)
{
    int fd = ctxs__open(path, flags | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
    if (fd < 0)
        return errno == ELOOP ? CTXS_EINDEX : -errno; /* ELOOP: a symbolic link */
    struct stat sb;
    int rc = ctxs__fstat(fd, &sb) != 0 ? -errno : S_ISREG(sb.st_mode) ? 0 : CTXS_EINDEX;
    if (rc < 0) {
        close(fd);
        return rc;
    }
    return fd;
}

int ctxs__index_dir_check(const char *index_dir)
{
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < sizeof(index_files) / sizeof(index_files[0]); i++) {
        size_t len = strlen(index_dir) + 1 + strlen(index_files[i]) + 1;
        char *path = ctxs__malloc(len);
        if (!path)
            return CTXS_ENOMEM;
        snprintf(path, len, "%s/%s", index_dir, index_files[i]);
        struct stat sb;
        if (ctxs__fstatat(AT_FDCWD, path, &sb, AT_SYMLINK_NOFOLLOW) == 0)
            rc = S_ISREG(sb.st_mode) ? 0 : CTXS_EINDEX;
        else if (errno != ENOENT && errno != ENOTDIR)
            rc = -errno;
        free(path);
    }
    return rc;
}

static int psize_valid(uint32_t psize)
{
    return psize >= LMDB_MIN_PSIZE && psize <= LMDB_MAX_PSIZE && (psize & (psize - 1)) == 0;
}

/* Whether the meta page p (n bytes of it were read) is one LMDB wrote. */
static int meta_page_ok(const lmdb_meta_page *p, ssize_t n, size_t pgno)
{
    return n == (ssize_t)sizeof(*p) && (p->head.flags & LMDB_P_META) && p->head.pgno == pgno &&
           p->meta.magic == LMDB_MAGIC && psize_valid(p->meta.dbs[0].pad);
}

/* Whether page 2 at page size psize is a tree page LMDB wrote: what is
 * left to tell a damaged index from someone else's file when both meta
 * pages are gone. A page numbers itself, so chance agreement of 8 bytes
 * and a flag is no worry. */
static int tree_page_at(int fd, uint32_t psize)
{
    lmdb_page_head h;
    if (ctxs__read_upto(fd, &h, sizeof(h), (off_t)2 * psize) != (ssize_t)sizeof(h))
        return 0;
    return h.pgno == 2 && !(h.flags & LMDB_P_META) &&
           (h.flags & (LMDB_P_BRANCH | LMDB_P_LEAF | LMDB_P_OVERFLOW));
}

static int root_ok(size_t root, size_t last_pg)
{
    return root == LMDB_P_INVALID || (root >= 2 && root <= last_pg);
}

/* One pass of the check over fd: the metas, the size, the trees. m gets
 * the two meta pages as read (zeros past what was), *p1_at where page 1
 * was read, for the caller to tell whether a writer committed meanwhile. */
static int check_once(int fd, int empty_ok, lmdb_meta_page m[2], uint32_t *p1_at)
{
    int rc = 0;
    struct stat sb;
    ssize_t n[2] = {0, 0};
    memset(m, 0, 2 * sizeof(*m));
    *p1_at = 0;
    if (ctxs__fstat(fd, &sb) != 0) {
        rc = -errno;
        goto leave;
    }
    /* An empty file is an environment whose creation wrote nothing yet,
     * which LMDB initialises as it does a missing one; or an index cut to
     * nothing, which would be silently replaced by an empty one. The
     * caller tells them apart. */
    if (sb.st_size == 0) {
        rc = empty_ok ? 0 : CTXS_EINDEX;
        goto leave;
    }
    if ((n[0] = ctxs__read_upto(fd, &m[0], sizeof(m[0]), 0)) < 0) {
        rc = (int)n[0];
        goto leave;
    }
    int ok0 = meta_page_ok(&m[0], n[0], 0);
    int lmdb_magic0 = n[0] >= (ssize_t)(offsetof(lmdb_meta_page, meta.magic) + 4) &&
                      (m[0].head.flags & LMDB_P_META) && m[0].meta.magic == LMDB_MAGIC;
    /* Page 1 sits one page in; without a page size from page 0, at each
     * size LMDB could have used. */
    int ok1 = 0;
    for (uint32_t ps = LMDB_MIN_PSIZE; ps <= LMDB_MAX_PSIZE && !ok1; ps *= 2) {
        if (ok0 && ps != m[0].meta.dbs[0].pad)
            continue;
        memset(&m[1], 0, sizeof(m[1]));
        *p1_at = ps;
        if ((n[1] = ctxs__read_upto(fd, &m[1], sizeof(m[1]), (off_t)ps)) < 0) {
            rc = (int)n[1];
            goto leave;
        }
        ok1 = meta_page_ok(&m[1], n[1], 1) && m[1].meta.dbs[0].pad == ps;
    }
    if (!ok0 || !ok1) {
        /* Nothing of LMDB's anywhere is a file of someone else's;
         * anything of it, an index that lost a meta page or was cut
         * inside them. */
        int ours = lmdb_magic0 || ok0 || ok1;
        for (uint32_t ps = 4096; ps <= LMDB_MAX_PSIZE && !ours; ps *= 2)
            ours = tree_page_at(fd, ps);
        rc = ours ? CTXS_EINDEX : CTXS_EFOREIGN;
        goto leave;
    }
    const lmdb_meta *a = &m[0].meta, *b = &m[1].meta;
    if (a->dbs[0].pad != b->dbs[0].pad) {
        rc = CTXS_EINDEX;
        goto leave;
    }
    if (a->version != b->version) {
        rc = CTXS_EINDEX;
        goto leave;
    }
    if (a->version != LMDB_DATA_VERSION) {
        rc = CTXS_EVERSION; /* what LMDB says of both: another LMDB's file */
        goto leave;
    }
    /* The size again, now: a writer may have grown the file and
     * committed a meta that claims the new pages between the first fstat
     * and the reads of the metas (the pass would then see a meta that
     * claims more than the file it measured, and the metas holding still
     * since would confirm damage that is not there). The file never
     * shrinks under a reader. */
    if (ctxs__fstat(fd, &sb) != 0) {
        rc = -errno;
        goto leave;
    }
    int use_page = b->txnid > a->txnid;
    const lmdb_meta *use = use_page ? b : a;
    uint64_t psize = use->dbs[0].pad;
    /* mm_last_pg is at least 1 (the meta pages) and its byte count must
     * not overflow before it is compared. The meta of transaction T is
     * written at page T & 1, and an environment with a lock file finds
     * it there again: a newest meta on the other page sends readers and
     * writers to the older one's trees, whose pages the newer may have
     * reused. */
    if (use->last_pg < 1 || use->last_pg >= (uint64_t)INT64_MAX / psize ||
        (use->last_pg + 1) * psize > (uint64_t)sb.st_size ||
        !root_ok(use->dbs[0].root, use->last_pg) || !root_ok(use->dbs[1].root, use->last_pg) ||
        use->txnid > LMDB_TXNID_MAX || (use->txnid & 1) != (uint64_t)use_page)
        rc = CTXS_EINDEX;
    else
        rc = ctxs__index_pages_check(fd, use);
leave:
    return rc;
}

/*
 * Other processes may commit while the file is read: we are no reader
 * LMDB knows of, so nothing holds the pages of the snapshot we walk. What
 * holds them is LMDB's own rule: a page the snapshot of transaction T
 * reaches is rewritten only after a later transaction has committed (it
 * first frees the page, and a writer reuses only pages freed before the
 * oldest snapshot still in use). So a pass that found damage is judged
 * again after reading both meta pages anew: if they are byte for byte
 * those the pass started from, no transaction committed while it ran and
 * what it read was the snapshot itself -- the damage is real. If a writer
 * did commit, the pass runs again on the new metas; after a few passes
 * that writers always overtook, LMDB is trusted as it was before this
 * check existed. A pass that finds nothing is not repeated: a commit
 * under it can only hide damage, never invent it.
 */
#define CHECK_PASSES 4

int ctxs__index_file_check(const char *data_path, int empty_ok)
{
    int fd = ctxs__index_file_open(data_path, O_RDONLY);
    if (fd < 0)
        return fd == -ENOENT ? 0 : fd; /* LMDB makes a missing one */
    lmdb_meta_page m[2], again[2];
    uint32_t p1_at = 0;
    int rc = check_once(fd, empty_ok, m, &p1_at);
    for (int pass = 1; rc == CTXS_EINDEX; pass++) {
        memset(again, 0, sizeof(again));
        ssize_t n0 = ctxs__read_upto(fd, &again[0], sizeof(again[0]), 0);
        ssize_t n1 = p1_at ? ctxs__read_upto(fd, &again[1], sizeof(again[1]), (off_t)p1_at) : 0;
        if (n0 < 0 || n1 < 0) {
            rc = (int)(n0 < 0 ? n0 : n1);
            break;
        }
        if (memcmp(&again[0], &m[0], sizeof(m[0])) == 0 &&
            memcmp(&again[1], &m[1], sizeof(m[1])) == 0)
            break; /* the metas held still: damaged */
        if (pass == CHECK_PASSES) {
            rc = 0; /* writers kept committing: LMDB as before */
            break;
        }
        rc = check_once(fd, empty_ok, m, &p1_at);
    }
    close(fd);
    return rc;
}

/*
 * A copy of a damaged data file that LMDB can be let read, for salvage
 * (repair_index.c). What LMDB needs of the file is what the check above asks;
 * here each failure is mended in the copy instead of refused:
 *
 * - a meta page lost (zeroed, overwritten) is given the other's contents:
 *   mdb_env_open() refuses a file with either meta page bad, though one
 *   suffices to find every tree. Both slots get the chosen meta, so LMDB
 *   cannot pick the other;
 * - a file cut short is extended with zeros to the pages its meta claims:
 *   a lost page then reads as a page of zeros, which LMDB reports as
 *   MDB_CORRUPTED where a read past the file's end would be SIGBUS;
 * - a block the disk cannot read is copied as zeros, likewise.
 *
 * The meta chosen is the newer if the file holds its pages, else the
 * older if the file holds its pages (the newer claims more than was ever
 * written: damaged), else the newer extended, as long as what it claims
 * is a plausible size for this file; a claim far past it (a damaged
 * mm_last_pg) would map terabytes of zeros. *mapsize gets the copy's size
 * in bytes. Errors: CTXS_EINDEX (no meta page left that LMDB could
 * use: nothing to salvage through it), -errno.
 */
#define SALVAGE_COPY_BLOCK (1u << 20)

/* Whether m could be the meta of a file of file_bytes: its own fields
 * agree, and the pages it claims are at most a plausible extension. */
static int meta_usable(const lmdb_meta_page *p, ssize_t n, size_t pgno, uint32_t psize)
{
    if (!meta_page_ok(p, n, pgno) || p->meta.dbs[0].pad != psize ||
        p->meta.version != LMDB_DATA_VERSION)
        return 0;
    const lmdb_meta *m = &p->meta;
    return m->last_pg >= 1 && m->last_pg < (uint64_t)INT64_MAX / psize &&
           root_ok(m->dbs[0].root, m->last_pg) && root_ok(m->dbs[1].root, m->last_pg);
}

static int copy_bytes(int in, int out, uint64_t size)
{
    uint8_t *buf = ctxs__malloc(SALVAGE_COPY_BLOCK);
    if (!buf)
        return CTXS_ENOMEM;
    int rc = 0;
    for (uint64_t off = 0; rc == 0 && off < size; off += SALVAGE_COPY_BLOCK) {
        size_t want = size - off < SALVAGE_COPY_BLOCK ? (size_t)(size - off) : SALVAGE_COPY_BLOCK;
        ssize_t got = ctxs__read_upto(in, buf, want, (off_t)off);
        if (got == -EIO)
            got = 0; /* unreadable: zeros, as a lost page */
        if (got < 0) {
            rc = (int)got;
            break;
        }
        memset(buf + got, 0, want - (size_t)got);
        for (size_t done = 0; rc == 0 && done < want;) {
            ssize_t w = ctxs__pwrite(out, buf + done, want - done, (off_t)(off + done));
            if (w < 0)
                rc = errno == ENOSPC || errno == EDQUOT ? CTXS_EFULL : -errno;
            else
                done += (size_t)w;
        }
    }
    free(buf);
    return rc;
}

int ctxs__index_salvage_copy(const char *data_path, const char *copy_path, uint64_t *mapsize,
                             uint32_t *metas)
{
    *mapsize = 0;
    *metas = 0;
    int in = ctxs__index_file_open(data_path, O_RDONLY);
    if (in < 0)
        return in;
    int out = -1, rc = 0;
    struct stat sb;
    lmdb_meta_page m[2];
    ssize_t n[2] = {0, 0};
    if (ctxs__fstat(in, &sb) != 0) {
        rc = -errno;
        goto leave;
    }
    uint64_t size = (uint64_t)sb.st_size;
    memset(m, 0, sizeof(m));
    if ((n[0] = ctxs__read_upto(in, &m[0], sizeof(m[0]), 0)) < 0)
        n[0] = 0;
    /* The page size: page 0's, else whichever page 1 is found at. */
    uint32_t psize = 0;
    int ok[2] = {0, 0};
    for (uint32_t ps = LMDB_MIN_PSIZE; ps <= LMDB_MAX_PSIZE && !psize; ps *= 2) {
        if (meta_page_ok(&m[0], n[0], 0) && ps != m[0].meta.dbs[0].pad)
            continue;
        if ((n[1] = ctxs__read_upto(in, &m[1], sizeof(m[1]), (off_t)ps)) < 0)
            n[1] = 0;
        ok[0] = meta_usable(&m[0], n[0], 0, ps);
        ok[1] = meta_usable(&m[1], n[1], 1, ps);
        if (ok[0] || ok[1])
            psize = ps;
    }
    if (!psize) {
        rc = CTXS_EINDEX;
        goto leave;
    }
    *metas = (uint32_t)(ok[0] + ok[1]);
    uint64_t claim[2];
    int fits[2], plausible[2];
    for (int i = 0; i < 2; i++) {
        claim[i] = ok[i] ? (m[i].meta.last_pg + 1) * psize : 0;
        fits[i] = ok[i] && claim[i] <= size;
        /* A file cut short claims what it held; far more is damage. */
        plausible[i] = ok[i] && claim[i] <= size * 8 + ((uint64_t)64 << 20);
    }
    int newer = ok[0] && ok[1] ? m[1].meta.txnid > m[0].meta.txnid : ok[1];
    int older = !newer;
    int use = fits[newer] ? newer : fits[older] ? older
            : plausible[newer] ? newer : plausible[older] ? older : -1;
    if (use < 0) {
        rc = CTXS_EINDEX;
        goto leave;
    }
    out = ctxs__open(copy_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (out < 0) {
        rc = -errno;
        goto leave;
    }
    if ((rc = copy_bytes(in, out, size)) < 0)
        goto leave;
    uint64_t copy_size = size < claim[use] ? claim[use] : size;
    if (copy_size < 2 * (uint64_t)psize)
        copy_size = 2 * (uint64_t)psize;
    if (ctxs__ftruncate(out, (off_t)copy_size) != 0) {
        rc = errno == ENOSPC || errno == EDQUOT ? CTXS_EFULL : -errno;
        goto leave;
    }
    for (size_t pg = 0; pg < 2 && rc == 0; pg++) {
        lmdb_meta_page page = m[use];
        page.head.pgno = pg;
        if (ctxs__pwrite(out, &page, sizeof(page), (off_t)(pg * psize)) != (ssize_t)sizeof(page))
            rc = -EIO;
    }
    if (rc == 0)
        *mapsize = copy_size;
leave:
    if (out >= 0)
        close(out);
    close(in);
    return rc;
}
