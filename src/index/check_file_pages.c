/*
 * The index's B-trees walked with pread() before LMDB maps the file.
 *
 * LMDB checks a page number against the last page of its snapshot and
 * trusts everything inside a page: the node offsets, key and data sizes,
 * an overflow node's page and its page count, a sub-database's root, a
 * sub-page's header. A garbled one makes it (or the index code reading
 * what it returns) read past the page, the map or the file: SIGSEGV or
 * SIGBUS in an ordinary open and listing. So every page that the trees of
 * the meta LMDB will use reach is read here first and asked what LMDB's
 * reads of it will need:
 *
 * - it is reached once (a bitmap of pages: a page reached twice is a
 *   cycle or two trees sharing a page, which a copy-on-write snapshot
 *   never has), within the pages the meta claims, and numbers itself;
 * - it is of the kind its place calls for: branch pages above md_depth
 *   levels, leaf pages (LEAF2 where duplicates are fixed-size) at it, no
 *   deeper than a cursor's stack (32); and its flags are that kind's
 *   alone. A writer acts on the flags of its memory (P_DIRTY: "written
 *   in this transaction, change it in place") that LMDB clears before a
 *   page is written: a page of the file carrying one is written through
 *   the read-only map (SIGSEGV), or freed as the writer's own;
 * - its lower and upper bounds lie in the page, its node offsets between
 *   upper and the page's end, and each node's header, key and data (or
 *   overflow page number) inside the page;
 * - a node's flags are ones its tree may hold: a sub-database record
 *   (F_SUBDATA, 48 bytes) only in the main tree, duplicates (F_DUPDATA)
 *   only in a DUPSORT tree, as an inline sub-page (checked as a page, its
 *   size the node's data) or as a sub-tree (an MDB_db, walked);
 * - keys are no longer than LMDB writes them (511 bytes);
 * - each tree's flags are those LMDB and the store give it: the free
 *   tree's MDB_INTEGERKEY (a writer takes them from the meta, and a
 *   DUPSORT there sends it down a cursor without the sub-cursor the flag
 *   needs: an assertion); the main tree's none; a named table of the
 *   store's the flags it is opened with (mdb_dbi_open() takes a table's
 *   flags, and so its comparators, from the file, and the store's keys
 *   are not the integers MDB_INTEGERKEY would compare); a tree of
 *   duplicates the flags LMDB gives one;
 * - the duplicates of a DUPFIXED table are of its one size (a LEAF2
 *   sub-page's mp_pad, a sub-tree's md_pad): a writer copies that many
 *   bytes from the caller's value, 8 for the store's prefixes table,
 *   and one of 9 reads past it;
 * - an overflow run lies in the file's pages and its first page's count
 *   covers the data;
 * - the free tree's records are page lists whose count fits the record
 *   and whose pages are the file's (a writer merges them without asking),
 *   in descending order as LMDB keeps them (a writer takes a run of pages
 *   where a list says they follow each other), each page in one list
 *   once, keyed by a transaction no later than the meta's; and, once
 *   every tree is walked, no free page is one a tree reaches: a writer
 *   hands a free page out as new, and the tree using it is overwritten
 *   (LMDB asserts, or another table silently changes);
 * - a tree's depth (md_depth) is where all its leaves are, and at most 32.
 *
 * Entry and page counts (md_entries, ...) are not judged: LMDB 0.9.24
 * miscounts some duplicates (later releases fixed how a put counts them),
 * so a count that disagrees with the walk is no proof of damage, and no
 * read goes past a page for one.
 * Keys are not compared for order: a tree out of order finds the wrong
 * record, and still reads inside its pages.
 *
 * The walk reads the file while other processes may commit to it; the
 * caller (check_file.c) judges a failure only against a meta that stayed
 * the same while it ran.
 *
 * What the walk itself relies on, whatever the file holds:
 *
 * Invariant P1: a tree is descended at most its depth (level <= md_depth,
 *   which db_plausible() holds to LMDB_MAX_DEPTH): the recursion is
 *   bounded before any page is read.
 * Invariant P2: a page is read into the buffer of its nesting level (its
 *   level, plus a tree's levels for each tree above it: at most three
 *   trees deep, the main tree, a named table, its duplicates), so that
 *   the page whose nodes are being walked is never overwritten below it,
 *   and nest < MAX_NEST.
 * Invariant P3: a page is claimed (marked reached) before it is read, and
 *   a page reached twice is damage: the walk reads each page once, so its
 *   cost is bounded by the file's pages. Held by claim() itself, which
 *   refuses a page already marked (nothing to check beside it).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "index.h"
#include "invariant.h"
#include "lmdb_layout.h"
#include "platform.h"
#include "syscall.h"

/* Nesting of page buffers: the main tree, a named tree below one of its
 * leaves, a sub-tree of duplicates below one of those. */
#define MAX_NEST (3 * LMDB_MAX_DEPTH + 1)

typedef struct walker {
    int fd;
    uint32_t psize;
    uint64_t last_pg;
    uint64_t txnid;             /* the meta's */
    uint8_t *seen;              /* a bit per page a tree reaches */
    uint8_t *freed;             /* a bit per page a free list names */
    uint8_t *buf[MAX_NEST];     /* a page per nesting level, made on use */
} walker;

enum tree_kind { TREE_FREE, TREE_MAIN, TREE_NAMED, TREE_DUPS };

typedef struct tree {
    enum tree_kind kind;
    uint16_t flags;             /* LMDB_DB_* of the tree, or of the tree
                                   whose duplicates it holds (TREE_DUPS) */
    uint16_t depth;
    uint32_t ksize;             /* a LEAF2 page's key size */
    uint32_t dup_bytes;         /* the size every duplicate of a DUPFIXED
                                   table of the store's has; 0: any */
} tree;

#define DAMAGED CTXS_EINDEX

/* Marks pages [pgno, pgno + n) as reached; DAMAGED when one is outside
 * the snapshot's pages or was reached before. */
static int claim(walker *w, uint64_t pgno, uint64_t n)
{
    if (pgno < 2 || n == 0 || pgno > w->last_pg || n > w->last_pg - pgno + 1)
        return DAMAGED;
    for (uint64_t p = pgno; p < pgno + n; p++) {
        uint8_t bit = (uint8_t)(1u << (p & 7));
        if (w->seen[p >> 3] & bit)
            return DAMAGED;
        w->seen[p >> 3] |= bit;
    }
    return 0;
}

/* Reads page pgno into the buffer of nesting level nest. */
static int page_read(walker *w, uint64_t pgno, unsigned nest, uint8_t **out)
{
    CTXS__INVARIANT("P2", nest < MAX_NEST);
    if (nest >= MAX_NEST)
        return DAMAGED;
    int rc = claim(w, pgno, 1); /* P3 */
    if (rc < 0)
        return rc;
    if (!w->buf[nest] && !(w->buf[nest] = ctxs__malloc(w->psize)))
        return CTXS_ENOMEM;
    ssize_t n = ctxs__read_upto(w->fd, w->buf[nest], w->psize, pgno * w->psize);
    if (n < 0)
        return (int)n;
    if ((size_t)n != w->psize)
        return DAMAGED; /* shorter than the size the caller checked */
    lmdb_page_head h;
    memcpy(&h, w->buf[nest], sizeof(h));
    if (h.pgno != pgno)
        return DAMAGED;
    *out = w->buf[nest];
    return 0;
}

static uint16_t u16_at(const uint8_t *p, size_t off)
{
    uint16_t v;
    memcpy(&v, p + off, sizeof(v));
    return v;
}

/* The flags a page of kind (its LMDB_P_* kind bits) has on disk: the
 * kind alone, except that a sub-page may keep P_DIRTY. */
static int flags_ok(uint16_t flags, unsigned kind)
{
    if (kind & LMDB_P_SUBP)
        flags &= (uint16_t)~LMDB_P_DIRTY;
    return flags == kind;
}

/* Whether a DUPFIXED key size (a LEAF2 page's) is one a writer of tree t
 * can use: the table's size where the store knows it, else any that
 * LMDB writes. */
static int dup_size_ok(const tree *t, uint32_t ksize)
{
    if (t->dup_bytes)
        return ksize == t->dup_bytes;
    return ksize >= 1 && ksize <= LMDB_MAX_KEY;
}

/* The number of offsets (or LEAF2 keys) of the page p of size bytes (a
 * sub-page's size is its node's data size), from its bounds. */
static int page_count(const uint8_t *p, size_t size, unsigned *n)
{
    lmdb_page_head h;
    memcpy(&h, p, sizeof(h));
    if (h.u.b.lower < LMDB_PAGE_HEAD || h.u.b.lower > h.u.b.upper || h.u.b.upper > size ||
        (h.u.b.lower - LMDB_PAGE_HEAD) % 2 != 0)
        return DAMAGED;
    *n = (h.u.b.lower - (unsigned)LMDB_PAGE_HEAD) / 2;
    /* No page LMDB keeps is empty: a tree left empty has no root, a
     * last duplicate deleted takes its node. A cursor reads node 0 of a
     * page it lands on without counting first. */
    return *n == 0 ? DAMAGED : 0;
}

/* Node i of p: its header, and the offset of its key. Checks that the
 * header and the key lie in the page. */
static int node_at(const uint8_t *p, size_t size, unsigned i, lmdb_node_head *nh, size_t *key)
{
    lmdb_page_head h;
    memcpy(&h, p, sizeof(h));
    size_t off = u16_at(p, LMDB_PAGE_HEAD + 2 * (size_t)i);
    if (off < h.u.b.upper || off + LMDB_NODE_HEAD > size)
        return DAMAGED;
    memcpy(nh, p + off, sizeof(*nh));
    *key = off + LMDB_NODE_HEAD;
    return *key + nh->ksize > size || nh->ksize > LMDB_MAX_KEY ? DAMAGED : 0;
}

static int tree_walk(walker *w, const lmdb_db *db, tree t, unsigned nest);

/* A tree's MDB_db record, as a node's data or a meta's, before it is
 * walked: a root in the file's pages and a depth a cursor can follow. */
static int db_plausible(const walker *w, const lmdb_db *db)
{
    if (db->root == LMDB_P_INVALID)
        return 0;
    if (db->root < 2 || db->root > w->last_pg || db->depth < 1 || db->depth > LMDB_MAX_DEPTH)
        return DAMAGED;
    return 0;
}

/* The data of an overflow node of dsize bytes, whose run starts at
 * pgno: the run is in the file, unclaimed, and covers the data. */
static int overflow_check(walker *w, uint64_t pgno, uint32_t dsize)
{
    if (pgno < 2 || pgno > w->last_pg)
        return DAMAGED;
    lmdb_page_head h;
    ssize_t n = ctxs__read_upto(w->fd, &h, sizeof(h), pgno * w->psize);
    if (n < 0)
        return (int)n;
    uint64_t need = ((uint64_t)LMDB_PAGE_HEAD - 1 + dsize) / w->psize + 1; /* OVPAGES */
    if ((size_t)n != sizeof(h) || h.pgno != pgno || !flags_ok(h.flags, LMDB_P_OVERFLOW) ||
        h.u.pages < need)
        return DAMAGED;
    return claim(w, pgno, h.u.pages);
}

/* A free-tree record: a page list (MDB_IDL: a count, then the pages,
 * descending), inline at data or on the overflow run at pgno. A writer
 * merges it trusting its count and its order. Each page is marked in
 * w->freed, once. */
static int free_list_check(walker *w, const uint8_t *data, uint64_t pgno, uint32_t dsize)
{
    if (dsize < sizeof(size_t) || dsize % sizeof(size_t) != 0)
        return DAMAGED;
    size_t *ids = ctxs__malloc(dsize);
    if (!ids)
        return CTXS_ENOMEM;
    int rc = 0;
    if (data) {
        memcpy(ids, data, dsize);
    } else {
        ssize_t n = ctxs__read_upto(w->fd, ids, dsize, pgno * w->psize + LMDB_PAGE_HEAD);
        rc = n < 0 ? (int)n : (size_t)n != dsize ? DAMAGED : 0;
    }
    size_t count = dsize / sizeof(size_t) - 1;
    if (rc == 0 && ids[0] > count)
        rc = DAMAGED;
    for (size_t i = 1; rc == 0 && i <= ids[0]; i++) {
        size_t pg = ids[i];
        uint8_t bit = (uint8_t)(1u << (pg & 7));
        if (pg < 2 || pg > w->last_pg || (i > 1 && pg >= ids[i - 1]) ||
            (w->freed[pg >> 3] & bit))
            rc = DAMAGED;
        else
            w->freed[pg >> 3] |= bit;
    }
    free(ids);
    return rc;
}

/* The LEAF2 keys of p (size bytes, n keys of ksize bytes). */
static int leaf2_check(size_t size, unsigned n, uint32_t ksize)
{
    return LMDB_PAGE_HEAD + (uint64_t)n * ksize > size ? DAMAGED : 0;
}

/* An inline page of duplicates: the data of a leaf node of tree t
 * (DUPSORT), dsize bytes at sp. */
static int subpage_check(const tree *t, const uint8_t *sp, uint32_t dsize)
{
    if (dsize < LMDB_PAGE_HEAD)
        return DAMAGED;
    lmdb_page_head h;
    memcpy(&h, sp, sizeof(h));
    unsigned want = LMDB_P_LEAF | LMDB_P_SUBP | (t->flags & LMDB_DB_DUPFIXED ? LMDB_P_LEAF2 : 0);
    unsigned n;
    int rc = !flags_ok(h.flags, want) ? DAMAGED : page_count(sp, dsize, &n);
    if (rc < 0)
        return rc;
    if (want & LMDB_P_LEAF2) /* a sub-page keeps its key size */
        return dup_size_ok(t, h.pad) ? leaf2_check(dsize, n, h.pad) : DAMAGED;
    for (unsigned i = 0; i < n; i++) {
        lmdb_node_head nh;
        size_t key;
        if ((rc = node_at(sp, dsize, i, &nh, &key)) < 0)
            return rc;
        uint32_t ds = nh.lo | (uint32_t)nh.hi << 16;
        if (nh.flags != 0 || key + nh.ksize + (uint64_t)ds > dsize)
            return DAMAGED;
    }
    return 0;
}

/* A free-tree record's key: the id of the transaction that freed its
 * pages, 8 bytes, at most the meta's (a writer files what it frees
 * under its own id, one past the meta's). */
static int free_key_check(const walker *w, const uint8_t *key, uint16_t ksize)
{
    uint64_t txnid;
    if (ksize != sizeof(txnid))
        return DAMAGED;
    memcpy(&txnid, key, sizeof(txnid));
    return txnid >= 1 && txnid <= w->txnid ? 0 : DAMAGED;
}

/* A named table's record (db, under the name of nlen bytes at name): its
 * flags are ones a table may have, and those the store opens it with if
 * it is one of the store's. *dup_bytes gets the size of its duplicates
 * where the store fixes one. */
static int named_flags_check(const lmdb_db *db, const uint8_t *name, uint16_t nlen,
                             uint32_t *dup_bytes)
{
    if (db->flags & ~LMDB_DB_FLAGS)
        return DAMAGED;
    for (size_t i = 0; i < ctxs__n_tables; i++) {
        const ctxs__table *tb = &ctxs__tables[i];
        if (strlen(tb->name) == nlen && memcmp(tb->name, name, nlen) == 0) {
            *dup_bytes = tb->dup_bytes;
            return db->flags == tb->flags ? 0 : DAMAGED;
        }
    }
    return 0; /* not the store's: no handle opens it */
}

/* A tree of duplicates' record (db), below a node of tree t: the flags
 * LMDB gives one (mdb_cursor_put(): MDB_DUPFIXED, with MDB_INTEGERKEY
 * for MDB_INTEGERDUP, else none), which a writer's sub-cursor takes as
 * they are, and the key size of a DUPFIXED one. */
static int dups_db_check(const tree *t, const lmdb_db *db)
{
    uint16_t want = 0;
    if (t->flags & LMDB_DB_DUPFIXED)
        want = LMDB_DB_DUPFIXED | (t->flags & LMDB_DB_INTEGERDUP ? LMDB_DB_INTEGERKEY : 0);
    if (db->flags != want)
        return DAMAGED;
    return !(want & LMDB_DB_DUPFIXED) || dup_size_ok(t, db->pad) ? 0 : DAMAGED;
}

/* The nodes of leaf page p of tree t, n of them. */
static int leaf_check(walker *w, const tree *t, const uint8_t *p, unsigned n, unsigned nest)
{
    int rc = 0;
    for (unsigned i = 0; rc == 0 && i < n; i++) {
        lmdb_node_head nh;
        size_t key;
        if ((rc = node_at(p, w->psize, i, &nh, &key)) < 0)
            break;
        uint32_t dsize = nh.lo | (uint32_t)nh.hi << 16;
        size_t data = key + nh.ksize;
        unsigned f = nh.flags;
        int dupsort = t->kind != TREE_FREE && t->kind != TREE_DUPS &&
                      (t->flags & LMDB_DB_DUPSORT);
        if (f == LMDB_F_BIGDATA) {
            uint64_t pgno;
            if (data + sizeof(pgno) > w->psize || t->kind == TREE_DUPS)
                return DAMAGED;
            memcpy(&pgno, p + data, sizeof(pgno));
            if ((rc = overflow_check(w, pgno, dsize)) == 0 && t->kind == TREE_FREE &&
                (rc = free_key_check(w, p + key, nh.ksize)) == 0)
                rc = free_list_check(w, NULL, pgno, dsize);
            continue;
        }
        if (data + (uint64_t)dsize > w->psize)
            return DAMAGED;
        if (t->kind == TREE_FREE) {
            rc = f != 0 ? DAMAGED : free_key_check(w, p + key, nh.ksize);
            if (rc == 0)
                rc = free_list_check(w, p + data, 0, dsize);
        } else if (f == 0) {
            /* plain data, in the page */
        } else if (f == LMDB_F_SUBDATA && t->kind == TREE_MAIN && !dupsort) {
            lmdb_db db;
            if (dsize != sizeof(db))
                return DAMAGED;
            memcpy(&db, p + data, sizeof(db));
            uint32_t dup_bytes = 0;
            if ((rc = named_flags_check(&db, p + key, nh.ksize, &dup_bytes)) < 0)
                return rc;
            tree sub = {TREE_NAMED, db.flags, db.depth, db.pad, dup_bytes};
            rc = tree_walk(w, &db, sub, nest + 1);
        } else if (f == LMDB_F_DUPDATA && dupsort) {
            rc = subpage_check(t, p + data, dsize);
        } else if (f == (LMDB_F_DUPDATA | LMDB_F_SUBDATA) && dupsort) {
            lmdb_db db;
            if (dsize != sizeof(db))
                return DAMAGED;
            memcpy(&db, p + data, sizeof(db));
            if ((rc = dups_db_check(t, &db)) < 0)
                return rc;
            tree sub = {TREE_DUPS, t->flags, db.depth, db.pad, t->dup_bytes};
            rc = tree_walk(w, &db, sub, nest + 1);
        } else {
            return DAMAGED;
        }
    }
    return rc;
}

/* Page pgno of tree t at level (1: the root), its buffers at nest. */
static int page_walk(walker *w, const tree *t, uint64_t pgno, unsigned level, unsigned nest)
{
    CTXS__INVARIANT("P1", level >= 1 && level <= t->depth && t->depth <= LMDB_MAX_DEPTH);
    uint8_t *p;
    int rc = page_read(w, pgno, nest, &p); /* P2 */
    if (rc < 0)
        return rc;
    lmdb_page_head h;
    memcpy(&h, p, sizeof(h));
    unsigned want = level < t->depth ? LMDB_P_BRANCH
                    : LMDB_P_LEAF | (t->kind == TREE_DUPS && (t->flags & LMDB_DB_DUPFIXED)
                                         ? LMDB_P_LEAF2 : 0);
    unsigned n;
    if (!flags_ok(h.flags, want) || (rc = page_count(p, w->psize, &n)) < 0)
        return DAMAGED;
    if (want & LMDB_P_LEAF2)
        return leaf2_check(w->psize, n, t->ksize);
    if (want & LMDB_P_LEAF)
        return leaf_check(w, t, p, n, nest);
    for (unsigned i = 0; i < n; i++) {
        lmdb_node_head nh;
        size_t key;
        if ((rc = node_at(p, w->psize, i, &nh, &key)) < 0)
            return rc;
        uint64_t child = nh.lo | (uint64_t)nh.hi << 16 | (uint64_t)nh.flags << 32;
        /* The page under p's buffer is read into the next one: p stays. */
        if ((rc = page_walk(w, t, child, level + 1, nest + 1)) < 0)
            return rc;
    }
    return 0;
}

static int tree_walk(walker *w, const lmdb_db *db, tree t, unsigned nest)
{
    int rc = db_plausible(w, db);
    if (rc < 0 || db->root == LMDB_P_INVALID)
        return rc;
    return page_walk(w, &t, db->root, 1, nest);
}

int ctxs__index_pages_check(int fd, const lmdb_meta *meta)
{
    const lmdb_db *free_db = &meta->dbs[0], *main_db = &meta->dbs[1];
    walker w = {.fd = fd, .psize = free_db->pad, .last_pg = meta->last_pg, .txnid = meta->txnid};
    size_t bytes = meta->last_pg / 8 + 1;
    w.seen = ctxs__calloc(bytes, 1);
    w.freed = w.seen ? ctxs__calloc(bytes, 1) : NULL;
    if (!w.freed) {
        free(w.seen);
        return CTXS_ENOMEM;
    }
    tree ft = {TREE_FREE, 0, free_db->depth, 0, 0};
    tree mt = {TREE_MAIN, main_db->flags, main_db->depth, main_db->pad, 0};
    int rc = (free_db->flags & LMDB_DB_FLAGS) != LMDB_FREE_DB_FLAGS ||
                     (free_db->flags & ~(LMDB_DB_FLAGS | LMDB_FREE_ENV_FLAGS)) ||
                     main_db->flags != 0
                 ? DAMAGED
                 : tree_walk(&w, free_db, ft, 0);
    if (rc == 0)
        rc = tree_walk(&w, main_db, mt, 0);
    /* A page both free and reached by a tree. */
    for (size_t i = 0; rc == 0 && i < bytes; i++)
        if (w.seen[i] & w.freed[i])
            rc = DAMAGED;
    for (unsigned i = 0; i < MAX_NEST; i++)
        free(w.buf[i]);
    free(w.seen);
    free(w.freed);
    return rc;
}
