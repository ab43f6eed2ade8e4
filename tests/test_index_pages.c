/*
 * The index's tree pages checked before LMDB maps them (check_file_pages.c):
 * single fields of a real index file edited -- a node's key or data size,
 * an overflow node's page and an overflow run's page count, a branch
 * child, a table's root, a page's bounds, a sub-page's header, a tree of
 * duplicates' record -- each refused as CTXS_EINDEX by an ordinary open
 * (in a child: a crash fails the test), and repair-index brings the store
 * back. Then damage that every read takes in its stride and a writer
 * does not (LMDB asserts, writes through its read-only map, or hands out
 * a page in use): page flags of a writer's memory (P_DIRTY, P_LOOSE,
 * P_KEEP), tree flags (the free tree claiming DUPSORT, a table of the
 * store's claiming other comparators), duplicates of another size than
 * the store writes (a LEAF2 sub-page of prefixes with 9-byte keys), a key
 * longer than LMDB writes, transaction ids (2^64 - 1, the other page's
 * parity), free lists naming pages in use, twice, out of order or under a
 * later transaction: each is refused by the check itself before LMDB maps
 * the file. An index of every shape the store makes (overflow values, a
 * DUPSORT table whose duplicates need a tree of their own) opens, and
 * opens while another process commits to it.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <lmdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "index.h"
#include "lmdb_layout.h"
#include "support.h"

TestSuite(index_pages, .init = ts_scratch_init, .fini = ts_scratch_fini, .timeout = 300);

/* Sessions sharing their first chunk: its prefix key gets this many
 * duplicates, more than a sub-page holds (about 250 ids at 4 KiB pages),
 * so they move to a tree of their own. */
#define N_SHARED 300
#define N_SESSIONS (N_SHARED + 2)
#define BIG_NAME "big"

/* --- the index --------------------------------------------------------- */

static void fixture_build(void)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_model m = ts_model(1);
    cr_assert_eq(ctxs_model_register(st, &m, "m"), 0);
    for (int i = 0; i < N_SHARED; i++) {
        char name[32];
        snprintf(name, sizeof(name), "s%03d", i);
        ctxs_create_options o = ts_options(128, 4, 1, CTXS_SYNC_NONE);
        ctxs_session *s = NULL;
        cr_assert_eq(ctxs_store_session_create(&s, st, name, &m, &o), 0, "%s", name);
        ts_append_many(s, CTXS_PREFIX_CHUNK);
        ctxs_session_close(s);
    }
    /* Two sessions sharing a second chunk: two duplicates, on a sub-page
     * of their node. */
    for (int i = 0; i < 2; i++) {
        ctxs_create_options o = ts_options(256, 4, 1, CTXS_SYNC_NONE);
        ctxs_session *s = NULL;
        cr_assert_eq(ctxs_store_session_create(&s, st, i ? "big2" : BIG_NAME, &m, &o), 0);
        ts_append_many(s, 130);
        cr_assert_eq(ctxs_checkpoint_create(s, "cp"), 0);
        ctxs_session_close(s);
    }
    /* A value of the largest size: on overflow pages. */
    char *value = malloc(CTXS_META_VALUE_MAX);
    memset(value, 'v', CTXS_META_VALUE_MAX);
    cr_assert_eq(ctxs_store_session_set_meta(st, BIG_NAME, "blob", value, CTXS_META_VALUE_MAX), 0);
    free(value);
    ctxs_store_close(st);
}

/* Rewrites the index compacted (LMDB's own copy): every page then belongs
 * to a tree of the current snapshot, so that an edit of any page is one
 * the open must see. */
static void compact_index(void)
{
    const char *index = ts_path(ts_store_dir(), "index");
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s/compact-copy", ts_store_dir());
    cr_assert_eq(mkdir(tmp, 0700), 0);
    MDB_env *env = ts_raw_env(ts_store_dir(), MDB_RDONLY);
    cr_assert_eq(mdb_env_copy2(env, tmp, MDB_CP_COMPACT), 0);
    mdb_env_close(env);
    char from[4200], to[4200];
    snprintf(from, sizeof(from), "%s/data.mdb", tmp);
    snprintf(to, sizeof(to), "%s/data.mdb", index);
    cr_assert_eq(rename(from, to), 0);
    cr_assert_eq(rmdir(tmp), 0);
}

/* The fixture's compacted data.mdb, built once per test. */
static uint8_t *fixture(size_t *len, size_t *psize)
{
    fixture_build();
    compact_index();
    uint8_t *bytes = ts_read_file(ts_path(ts_store_dir(), "index/data.mdb"), len);
    cr_assert_not_null(bytes);
    lmdb_meta_page m;
    memcpy(&m, bytes, sizeof(m));
    *psize = m.meta.dbs[0].pad;
    cr_assert_eq(*psize, 4096, "page size %zu", *psize);
    return bytes;
}

static void put_index(const uint8_t *bytes, size_t len)
{
    cr_assert_eq(ts_write_file(ts_path(ts_store_dir(), "index/data.mdb"), bytes, len), 0);
}

/* --- finding what to edit ------------------------------------------------ */

static lmdb_page_head head_at(const uint8_t *page)
{
    lmdb_page_head h;
    memcpy(&h, page, sizeof(h));
    return h;
}

static unsigned kind_of(const uint8_t *page)
{
    return head_at(page).flags & (LMDB_P_BRANCH | LMDB_P_LEAF | LMDB_P_OVERFLOW | LMDB_P_META |
                                  LMDB_P_LEAF2 | LMDB_P_SUBP);
}

static size_t node_off(const uint8_t *page, unsigned i)
{
    uint16_t off;
    memcpy(&off, page + LMDB_PAGE_HEAD + 2 * i, sizeof(off));
    return off;
}

static unsigned n_nodes(const uint8_t *page)
{
    return (head_at(page).u.b.lower - (unsigned)LMDB_PAGE_HEAD) / 2;
}

/* The first node, over the pages of the (compacted) file, in a page of
 * kind whose flags are node_flags: its offset in the file. 0 if none. */
static size_t find_node(const uint8_t *bytes, size_t len, size_t psize, unsigned kind,
                        unsigned node_flags)
{
    for (size_t pg = 2; pg < len / psize; pg++) {
        const uint8_t *p = bytes + pg * psize;
        if (head_at(p).pgno != pg || kind_of(p) != kind)
            continue;
        for (unsigned i = 0; i < n_nodes(p); i++) {
            lmdb_node_head nh;
            memcpy(&nh, p + node_off(p, i), sizeof(nh));
            if (kind == LMDB_P_BRANCH || nh.flags == node_flags)
                return pg * psize + node_off(p, i);
        }
    }
    return 0;
}

static size_t find_page(const uint8_t *bytes, size_t len, size_t psize, unsigned kind)
{
    for (size_t pg = 2; pg < len / psize; pg++)
        if (head_at(bytes + pg * psize).pgno == pg && kind_of(bytes + pg * psize) == kind)
            return pg;
    return 0;
}

static size_t last_pg(const uint8_t *bytes)
{
    lmdb_meta_page a, b;
    memcpy(&a, bytes, sizeof(a));
    memcpy(&b, bytes + a.meta.dbs[0].pad, sizeof(b));
    return (b.meta.txnid > a.meta.txnid ? b : a).meta.last_pg;
}

/* --- the open, in a child ------------------------------------------------ */

/* Opens the store in a child and lists every session and (deep) its
 * metadata: the first error, or 0. A signal fails the test. */
static int read_store(void *deep)
{
    return ts_store_read(0, *(const int *)deep);
}

static int open_in_child_ex(const char *what, int deep)
{
    return ts_in_child(read_store, &deep, what);
}

static int open_in_child(const char *what)
{
    return open_in_child_ex(what, 1);
}

/* The edited bytes in place: refused, then repaired; the repaired store
 * lists every session. */
static void damaged_case(const uint8_t *bytes, size_t len, const char *what)
{
    put_index(bytes, len);
    int rc = open_in_child(what);
    cr_assert_eq(rc, CTXS_EINDEX, "%s: %s", what, ctxs_err_name(rc));
    ctxs_store_repair_index_result res;
    memset(&res, 0, sizeof(res));
    rc = ctxs_store_repair_index(&res, ts_store_dir(), 0);
    cr_assert_eq(rc, 0, "%s: repair: %s", what, ctxs_err_name(rc));
    cr_assert_eq(res.sessions, N_SESSIONS, "%s: %llu sessions", what,
                 (unsigned long long)res.sessions);
    if (res.moved_to)
        ts_rmtree(res.moved_to);
    ctxs_free(res.moved_to);
    ctxs_free(res.renamed);
    ctxs_store *st = NULL;
    rc = ctxs_store_open(&st, ts_store_dir(), 0, NULL);
    cr_assert_eq(rc, 0, "%s: open after repair: %s", what, ctxs_err_name(rc));
    ctxs_session_entry *list;
    size_t n;
    cr_assert_eq(ctxs_store_session_list(&list, &n, st), 0);
    cr_assert_eq(n, N_SESSIONS, "%s: %zu sessions after repair", what, n);
    ctxs_free(list);
    ctxs_store_close(st);
}

/* --- the cases ------------------------------------------------------------ */

Test(index_pages, every_shape_the_store_makes_opens)
{
    size_t len, psize;
    uint8_t *bytes = fixture(&len, &psize);
    /* The shapes are there: a branch page, an overflow run, a named
     * table's record, duplicates on a sub-page and in a tree of their
     * own (LEAF2 pages: the prefixes table is DUPFIXED). */
    cr_assert_neq(find_page(bytes, len, psize, LMDB_P_BRANCH), 0);
    cr_assert_neq(find_page(bytes, len, psize, LMDB_P_OVERFLOW), 0);
    cr_assert_neq(find_page(bytes, len, psize, LMDB_P_LEAF | LMDB_P_LEAF2), 0);
    cr_assert_neq(find_node(bytes, len, psize, LMDB_P_LEAF, LMDB_F_SUBDATA), 0);
    cr_assert_neq(find_node(bytes, len, psize, LMDB_P_LEAF, LMDB_F_BIGDATA), 0);
    cr_assert_neq(find_node(bytes, len, psize, LMDB_P_LEAF, LMDB_F_DUPDATA | LMDB_F_SUBDATA), 0);
    cr_assert_eq(open_in_child("compacted"), 0);
    free(bytes);
}

Test(index_pages, the_uncompacted_index_opens_too)
{
    fixture_build();
    cr_assert_eq(open_in_child("as written"), 0);
}

/* Edits one node field of the first node found in a page of kind with
 * node flags nflags; field is an offset in the node's header, or past it
 * (the data of a key-less node). */
typedef struct edit {
    const char *what;
    unsigned kind, nflags;
    size_t at;          /* from the node's start */
    uint64_t value;
    size_t width;       /* bytes of value written */
    int key_relative;   /* at is counted from the node's data */
} edit;

static void node_edit_case(const uint8_t *bytes, size_t len, size_t psize, const edit *e)
{
    size_t node = find_node(bytes, len, psize, e->kind, e->nflags);
    cr_assert_neq(node, 0, "%s: no such node", e->what);
    uint8_t *copy = malloc(len);
    memcpy(copy, bytes, len);
    size_t at = node + e->at;
    if (e->key_relative) {
        lmdb_node_head nh;
        memcpy(&nh, copy + node, sizeof(nh));
        at += LMDB_NODE_HEAD + nh.ksize;
    }
    memcpy(copy + at, &e->value, e->width);
    damaged_case(copy, len, e->what);
    free(copy);
}

Test(index_pages, node_fields_edited)
{
    size_t len, psize;
    uint8_t *bytes = fixture(&len, &psize);
    uint64_t last = last_pg(bytes);
    const edit edits[] = {
        {"a key size past the page", LMDB_P_LEAF, 0, offsetof(lmdb_node_head, ksize), 0xfff0, 2, 0},
        {"a key size past the page (branch)", LMDB_P_BRANCH, 0, offsetof(lmdb_node_head, ksize),
         0xfff0, 2, 0},
        {"a data size past the page", LMDB_P_LEAF, 0, offsetof(lmdb_node_head, hi), 1, 2, 0},
        {"an overflow page beyond the last", LMDB_P_LEAF, LMDB_F_BIGDATA, 0, last + 1, 8, 1},
        {"an overflow page that is the meta", LMDB_P_LEAF, LMDB_F_BIGDATA, 0, 1, 8, 1},
        {"an overflow node's size beyond its run", LMDB_P_LEAF, LMDB_F_BIGDATA,
         offsetof(lmdb_node_head, hi), 0x7f, 2, 0},
        {"a named table's root beyond the last page", LMDB_P_LEAF, LMDB_F_SUBDATA,
         offsetof(lmdb_db, root), last + 1, 8, 1},
        {"a named table's root at a meta page", LMDB_P_LEAF, LMDB_F_SUBDATA,
         offsetof(lmdb_db, root), 0, 8, 1},
        {"a named table's depth of 0", LMDB_P_LEAF, LMDB_F_SUBDATA, offsetof(lmdb_db, depth), 0,
         2, 1},
        {"a named table's depth past a cursor's", LMDB_P_LEAF, LMDB_F_SUBDATA,
         offsetof(lmdb_db, depth), 40, 2, 1},
        {"a duplicates tree's root beyond the last page", LMDB_P_LEAF,
         LMDB_F_DUPDATA | LMDB_F_SUBDATA, offsetof(lmdb_db, root), last + 7, 8, 1},
        {"a duplicates tree's depth one too many", LMDB_P_LEAF,
         LMDB_F_DUPDATA | LMDB_F_SUBDATA, offsetof(lmdb_db, depth), 2, 2, 1},
        {"node flags no tree holds", LMDB_P_LEAF, 0, offsetof(lmdb_node_head, flags),
         LMDB_F_DUPDATA, 2, 0},
    };
    for (size_t i = 0; i < sizeof(edits) / sizeof(edits[0]); i++)
        node_edit_case(bytes, len, psize, &edits[i]);
    free(bytes);
}

/* A branch node's child: lo and hi are its low 32 bits, flags the next. */
static void set_child(uint8_t *node, uint64_t pgno)
{
    lmdb_node_head nh;
    memcpy(&nh, node, sizeof(nh));
    nh.lo = (uint16_t)pgno;
    nh.hi = (uint16_t)(pgno >> 16);
    nh.flags = (uint16_t)(pgno >> 32);
    memcpy(node, &nh, sizeof(nh));
}

Test(index_pages, branch_children_edited)
{
    size_t len, psize;
    uint8_t *bytes = fixture(&len, &psize);
    uint64_t last = last_pg(bytes);
    size_t node = find_node(bytes, len, psize, LMDB_P_BRANCH, 0);
    cr_assert_neq(node, 0);
    uint64_t self = node / psize;
    struct { const char *what; uint64_t to; } cases[] = {
        {"a child beyond the last page", last + 1},
        {"a child far beyond (high word)", 1ull << 40},
        {"a child that is a meta page", 1},
        {"a child that is its parent (a cycle)", self},
    };
    uint8_t *copy = malloc(len);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memcpy(copy, bytes, len);
        set_child(copy + node, cases[i].to);
        damaged_case(copy, len, cases[i].what);
    }
    /* Two children of one branch naming the same page. */
    const uint8_t *bp = bytes + self * psize;
    cr_assert_geq(n_nodes(bp), 2);
    memcpy(copy, bytes, len);
    lmdb_node_head first;
    memcpy(&first, bp + node_off(bp, 0), sizeof(first));
    set_child(copy + self * psize + node_off(bp, 1),
              first.lo | (uint64_t)first.hi << 16 | (uint64_t)first.flags << 32);
    damaged_case(copy, len, "two children naming one page");
    free(copy);
    free(bytes);
}

Test(index_pages, page_headers_edited)
{
    size_t len, psize;
    uint8_t *bytes = fixture(&len, &psize);
    uint64_t last = last_pg(bytes);
    size_t leaf = find_page(bytes, len, psize, LMDB_P_LEAF);
    size_t over = find_page(bytes, len, psize, LMDB_P_OVERFLOW);
    size_t leaf2 = find_page(bytes, len, psize, LMDB_P_LEAF | LMDB_P_LEAF2);
    cr_assert(leaf && over && leaf2);
    struct { const char *what; size_t pg, at; uint64_t value; size_t width; } cases[] = {
        {"a leaf's lower past its upper", leaf, offsetof(lmdb_page_head, u.b.lower), 0xfff0, 2},
        {"a leaf's upper past the page", leaf, offsetof(lmdb_page_head, u.b.upper), 0xfffe, 2},
        {"a leaf's upper below its nodes", leaf, offsetof(lmdb_page_head, u.b.upper), 0x0ffe, 2},
        {"a leaf with no nodes", leaf, offsetof(lmdb_page_head, u.b.lower), LMDB_PAGE_HEAD, 2},
        {"a leaf marked a branch", leaf, offsetof(lmdb_page_head, flags), LMDB_P_BRANCH, 2},
        {"a page numbering another", leaf, offsetof(lmdb_page_head, pgno), leaf + 1, 8},
        {"an overflow run of 1 page", over, offsetof(lmdb_page_head, u.pages), 1, 4},
        {"an overflow run past the file", over, offsetof(lmdb_page_head, u.pages),
         last + 100, 4},
        {"an overflow page marked a leaf", over, offsetof(lmdb_page_head, flags), LMDB_P_LEAF, 2},
        {"a LEAF2 page claiming more keys than fit", leaf2, offsetof(lmdb_page_head, u.b.lower),
         LMDB_PAGE_HEAD + 2 * 1000, 2},
    };
    uint8_t *copy = malloc(len);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memcpy(copy, bytes, len);
        memcpy(copy + cases[i].pg * psize + cases[i].at, &cases[i].value, cases[i].width);
        damaged_case(copy, len, cases[i].what);
    }
    free(copy);
    free(bytes);
}

Test(index_pages, sub_page_headers_edited)
{
    size_t len, psize;
    uint8_t *bytes = fixture(&len, &psize);
    /* The big session's own chunks past the first: one id each, on a
     * sub-page of its node. */
    size_t node = find_node(bytes, len, psize, LMDB_P_LEAF, LMDB_F_DUPDATA);
    cr_assert_neq(node, 0, "no sub-page");
    lmdb_node_head nh;
    memcpy(&nh, bytes + node, sizeof(nh));
    size_t sp = node + LMDB_NODE_HEAD + nh.ksize;
    struct { const char *what; size_t at; uint64_t value; size_t width; } cases[] = {
        {"a sub-page's lower past its size", offsetof(lmdb_page_head, u.b.lower), 0xfff0, 2},
        {"a sub-page's upper past its size", offsetof(lmdb_page_head, u.b.upper), 0xfff0, 2},
        {"a sub-page with no keys", offsetof(lmdb_page_head, u.b.lower), LMDB_PAGE_HEAD, 2},
        {"a sub-page marked a branch", offsetof(lmdb_page_head, flags),
         LMDB_P_BRANCH | LMDB_P_SUBP, 2},
        {"a sub-page's keys wider than it", offsetof(lmdb_page_head, pad), 0x4000, 2},
    };
    uint8_t *copy = malloc(len);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memcpy(copy, bytes, len);
        memcpy(copy + sp + cases[i].at, &cases[i].value, cases[i].width);
        damaged_case(copy, len, cases[i].what);
    }
    free(copy);
    free(bytes);
}

/* --- what a writer acts on ------------------------------------------------ */

/* Damage that reads fine and breaks a writer: the check before LMDB maps
 * the file (check_file.c) must be what refuses it, since nothing an
 * ordinary open reads would; then as damaged_case(). */
static void writer_case(const uint8_t *bytes, size_t len, const char *what)
{
    put_index(bytes, len);
    int rc = ctxs__index_file_check(ts_path(ts_store_dir(), "index/data.mdb"), 0);
    cr_assert_eq(rc, CTXS_EINDEX, "%s: the check says %s", what, ctxs_err_name(rc));
    damaged_case(bytes, len, what);
}

/* The meta LMDB will use in the image: its page (0 or 1) and contents. */
static int meta_current(const uint8_t *bytes, size_t psize, lmdb_meta *m)
{
    lmdb_meta_page a, b;
    memcpy(&a, bytes, sizeof(a));
    memcpy(&b, bytes + psize, sizeof(b));
    int page = b.meta.txnid > a.meta.txnid;
    *m = page ? b.meta : a.meta;
    return page;
}

static void meta_put(uint8_t *bytes, size_t psize, int page, const lmdb_meta *m)
{
    memcpy(bytes + (size_t)page * psize + offsetof(lmdb_meta_page, meta), m, sizeof(*m));
}

/* The leaf page a tree's first key is on: node 0 followed from its root. */
static size_t first_leaf(const uint8_t *bytes, size_t psize, const lmdb_db *db)
{
    size_t pg = db->root;
    for (unsigned level = 1; level < db->depth; level++) {
        const uint8_t *p = bytes + pg * psize;
        cr_assert_eq(kind_of(p), LMDB_P_BRANCH);
        lmdb_node_head nh;
        memcpy(&nh, p + node_off(p, 0), sizeof(nh));
        pg = nh.lo | (size_t)nh.hi << 16 | (size_t)nh.flags << 32;
    }
    return pg;
}

/* The offset in the image of the MDB_db record of the store's table
 * name, in the main tree of the current meta (one leaf: eleven tables). */
static size_t table_record(const uint8_t *bytes, size_t psize, const char *name)
{
    lmdb_meta m;
    meta_current(bytes, psize, &m);
    cr_assert_eq(m.dbs[1].depth, 1);
    const uint8_t *p = bytes + m.dbs[1].root * psize;
    for (unsigned i = 0; i < n_nodes(p); i++) {
        lmdb_node_head nh;
        memcpy(&nh, p + node_off(p, i), sizeof(nh));
        if (nh.flags == LMDB_F_SUBDATA && nh.ksize == strlen(name) &&
            memcmp(p + node_off(p, i) + LMDB_NODE_HEAD, name, nh.ksize) == 0)
            return m.dbs[1].root * psize + node_off(p, i) + LMDB_NODE_HEAD + nh.ksize;
    }
    cr_assert_fail("no table %s", name);
    return 0;
}

static lmdb_db db_at(const uint8_t *bytes, size_t off)
{
    lmdb_db db;
    memcpy(&db, bytes + off, sizeof(db));
    return db;
}

/* Sets flag bits in the header of page pg. */
static void page_flags_add(uint8_t *bytes, size_t psize, size_t pg, uint16_t bits)
{
    lmdb_page_head h = head_at(bytes + pg * psize);
    h.flags |= bits;
    memcpy(bytes + pg * psize, &h, sizeof(h));
}

Test(index_pages, page_flags_of_a_writers_memory_edited)
{
    size_t len, psize;
    uint8_t *bytes = fixture(&len, &psize);
    lmdb_db sessions = db_at(bytes, table_record(bytes, psize, "sessions"));
    cr_assert_geq(sessions.depth, 2, "the sessions table has a branch level");
    size_t leaf = first_leaf(bytes, psize, &sessions);
    size_t over = find_page(bytes, len, psize, LMDB_P_OVERFLOW);
    size_t leaf2 = find_page(bytes, len, psize, LMDB_P_LEAF | LMDB_P_LEAF2);
    cr_assert(over && leaf2);
    struct { const char *what; size_t pg; uint16_t bits; } cases[] = {
        {"P_DIRTY on a leaf page of sessions", leaf, LMDB_P_DIRTY},
        {"P_DIRTY on the root of sessions (a branch)", sessions.root, LMDB_P_DIRTY},
        {"P_DIRTY on an overflow page", over, LMDB_P_DIRTY},
        {"P_DIRTY on a LEAF2 page", leaf2, LMDB_P_DIRTY},
        {"P_LOOSE on a leaf page", leaf, LMDB_P_LOOSE},
        {"P_KEEP on a leaf page", leaf, LMDB_P_KEEP},
        {"P_SUBP on a leaf page", leaf, LMDB_P_SUBP},
    };
    uint8_t *copy = malloc(len);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memcpy(copy, bytes, len);
        page_flags_add(copy, psize, cases[i].pg, cases[i].bits);
        writer_case(copy, len, cases[i].what);
    }
    free(copy);
    free(bytes);
}

Test(index_pages, tree_flags_edited)
{
    size_t len, psize;
    uint8_t *bytes = fixture(&len, &psize);
    lmdb_meta m;
    int page = meta_current(bytes, psize, &m);
    uint8_t *copy = malloc(len);
    struct { const char *what; int tree; uint16_t flags; } metas[] = {
        {"the free tree's flags claim DUPSORT", 0, LMDB_DB_DUPSORT},
        {"the free tree's flags claim DUPFIXED", 0, LMDB_DB_DUPFIXED},
        {"the free tree without INTEGERKEY", 0, 0x8000},
        {"the main tree's flags claim REVERSEKEY", 1, LMDB_DB_REVERSEKEY},
        {"the main tree's flags claim DUPSORT", 1, LMDB_DB_DUPSORT},
    };
    for (size_t i = 0; i < sizeof(metas) / sizeof(metas[0]); i++) {
        memcpy(copy, bytes, len);
        lmdb_meta e = m;
        if (metas[i].tree == 0 && metas[i].flags == 0x8000)
            e.dbs[0].flags = 0;
        else
            e.dbs[metas[i].tree].flags |= metas[i].flags;
        meta_put(copy, psize, page, &e);
        writer_case(copy, len, metas[i].what);
    }
    struct { const char *what, *table; uint16_t flags; } tables[] = {
        {"sessions claiming INTEGERKEY", "sessions", LMDB_DB_INTEGERKEY},
        {"sessions claiming DUPSORT", "sessions", LMDB_DB_DUPSORT},
        {"prefixes without DUPFIXED", "prefixes", LMDB_DB_DUPSORT},
        {"prefixes claiming INTEGERDUP", "prefixes",
         LMDB_DB_DUPSORT | LMDB_DB_DUPFIXED | LMDB_DB_INTEGERDUP},
    };
    for (size_t i = 0; i < sizeof(tables) / sizeof(tables[0]); i++) {
        memcpy(copy, bytes, len);
        size_t at = table_record(copy, psize, tables[i].table) + offsetof(lmdb_db, flags);
        memcpy(copy + at, &tables[i].flags, 2);
        writer_case(copy, len, tables[i].what);
    }
    free(copy);
    free(bytes);
}

/* The first node of the first leaf of the prefixes table whose flags are
 * nflags: its offset in the image. */
static size_t prefixes_node(const uint8_t *bytes, size_t len, size_t psize, unsigned nflags)
{
    (void)len;
    lmdb_db db = db_at(bytes, table_record(bytes, psize, "prefixes"));
    /* Every leaf of the table, left to right, through the branch above. */
    size_t pgs[512], n = 0;
    if (db.depth == 1) {
        pgs[n++] = db.root;
    } else {
        cr_assert_eq(db.depth, 2);
        const uint8_t *b = bytes + db.root * psize;
        for (unsigned i = 0; i < n_nodes(b) && n < 512; i++) {
            lmdb_node_head nh;
            memcpy(&nh, b + node_off(b, i), sizeof(nh));
            pgs[n++] = nh.lo | (size_t)nh.hi << 16 | (size_t)nh.flags << 32;
        }
    }
    for (size_t k = 0; k < n; k++) {
        const uint8_t *p = bytes + pgs[k] * psize;
        for (unsigned i = 0; i < n_nodes(p); i++) {
            lmdb_node_head nh;
            memcpy(&nh, p + node_off(p, i), sizeof(nh));
            if (nh.flags == nflags)
                return pgs[k] * psize + node_off(p, i);
        }
    }
    cr_assert_fail("no prefixes node with flags %u", nflags);
    return 0;
}

Test(index_pages, duplicate_sizes_edited)
{
    size_t len, psize;
    uint8_t *bytes = fixture(&len, &psize);
    uint8_t *copy = malloc(len);
    /* A LEAF2 sub-page of prefixes: its keys are the 8-byte ids a writer
     * puts; a size of 9 makes mdb_put() read 9 bytes of the caller's 8. */
    size_t node = prefixes_node(bytes, len, psize, LMDB_F_DUPDATA);
    lmdb_node_head nh;
    memcpy(&nh, bytes + node, sizeof(nh));
    size_t sp = node + LMDB_NODE_HEAD + nh.ksize;
    cr_assert_eq(head_at(bytes + sp).pad, 8);
    struct { const char *what; uint16_t pad; } subs[] = {
        {"a LEAF2 sub-page of prefixes with keys of 9 bytes", 9},
        {"a LEAF2 sub-page of prefixes with keys of 7 bytes", 7},
        {"a LEAF2 sub-page of prefixes with keys of 0 bytes", 0},
    };
    for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++) {
        memcpy(copy, bytes, len);
        memcpy(copy + sp + offsetof(lmdb_page_head, pad), &subs[i].pad, 2);
        writer_case(copy, len, subs[i].what);
    }
    /* The tree of the shared chunk's 300 duplicates: its record. */
    node = prefixes_node(bytes, len, psize, LMDB_F_DUPDATA | LMDB_F_SUBDATA);
    memcpy(&nh, bytes + node, sizeof(nh));
    size_t rec = node + LMDB_NODE_HEAD + nh.ksize;
    cr_assert_eq(db_at(bytes, rec).pad, 8);
    cr_assert_eq(db_at(bytes, rec).flags, LMDB_DB_DUPFIXED);
    struct { const char *what; size_t at; uint32_t value; size_t width; } trees[] = {
        {"a tree of prefixes' duplicates with keys of 9 bytes", offsetof(lmdb_db, pad), 9, 4},
        {"a tree of duplicates claiming DUPSORT", offsetof(lmdb_db, flags),
         LMDB_DB_DUPFIXED | LMDB_DB_DUPSORT, 2},
        {"a tree of duplicates without DUPFIXED", offsetof(lmdb_db, flags), 0, 2},
    };
    for (size_t i = 0; i < sizeof(trees) / sizeof(trees[0]); i++) {
        memcpy(copy, bytes, len);
        memcpy(copy + rec + trees[i].at, &trees[i].value, trees[i].width);
        writer_case(copy, len, trees[i].what);
    }
    free(copy);
    free(bytes);
}

Test(index_pages, a_key_longer_than_lmdb_writes)
{
    size_t len, psize;
    uint8_t *bytes = fixture(&len, &psize);
    /* A leaf node of sessions with room for 600 bytes of key and its
     * data after it in its page: inside the page, and longer than any
     * key LMDB writes (511). */
    lmdb_db sessions = db_at(bytes, table_record(bytes, psize, "sessions"));
    size_t pg = first_leaf(bytes, psize, &sessions), node = 0;
    const uint8_t *p = bytes + pg * psize;
    for (unsigned i = 0; !node && i < n_nodes(p); i++) {
        lmdb_node_head nh;
        memcpy(&nh, p + node_off(p, i), sizeof(nh));
        if (node_off(p, i) + LMDB_NODE_HEAD + 600 + nh.lo <= psize)
            node = pg * psize + node_off(p, i);
    }
    cr_assert_neq(node, 0);
    uint8_t *copy = malloc(len);
    memcpy(copy, bytes, len);
    uint16_t ksize = 600;
    memcpy(copy + node + offsetof(lmdb_node_head, ksize), &ksize, 2);
    writer_case(copy, len, "a key of 600 bytes in sessions");
    free(copy);
    free(bytes);
}

Test(index_pages, transaction_ids_edited)
{
    size_t len, psize;
    uint8_t *bytes = fixture(&len, &psize);
    lmdb_meta m;
    int page = meta_current(bytes, psize, &m);
    cr_assert_eq(page, 1, "a compacted index's meta is on page 1");
    uint8_t *copy = malloc(len);
    struct { const char *what; uint64_t txnid; } cases[] = {
        {"the current meta's txnid 2^64 - 1", UINT64_MAX},
        {"the current meta's txnid 2^63 + 1", (1ull << 63) + 1},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memcpy(copy, bytes, len);
        lmdb_meta e = m;
        e.txnid = cases[i].txnid;
        meta_put(copy, psize, page, &e);
        writer_case(copy, len, cases[i].what);
    }
    /* The newest meta on the page of the other parity: page 0 says
     * transaction 3, where LMDB writes odd ones on page 1. */
    memcpy(copy, bytes, len);
    lmdb_meta other;
    memcpy(&other, bytes + offsetof(lmdb_meta_page, meta), sizeof(other));
    other = m;
    other.txnid = m.txnid + 2;
    meta_put(copy, psize, 0, &other);
    writer_case(copy, len, "the newest meta on the other parity's page");
    free(copy);
    free(bytes);
}

/* The free tree of an index as written (not compacted: the pages its
 * transactions freed are listed there). Its first leaf's nodes that hold
 * a list inline, up to max: their offsets in the image. */
static size_t free_records(const uint8_t *bytes, size_t psize, size_t *at, size_t max)
{
    lmdb_meta m;
    meta_current(bytes, psize, &m);
    cr_assert_neq(m.dbs[0].root, LMDB_P_INVALID, "nothing in the free tree");
    size_t pg = first_leaf(bytes, psize, &m.dbs[0]);
    const uint8_t *p = bytes + pg * psize;
    size_t n = 0;
    for (unsigned i = 0; i < n_nodes(p) && n < max; i++) {
        lmdb_node_head nh;
        memcpy(&nh, p + node_off(p, i), sizeof(nh));
        if (nh.flags == 0)
            at[n++] = pg * psize + node_off(p, i);
    }
    return n;
}

/* A free record's page list: where its count is in the image. */
static size_t free_list_at(const uint8_t *bytes, size_t rec)
{
    lmdb_node_head nh;
    memcpy(&nh, bytes + rec, sizeof(nh));
    return rec + LMDB_NODE_HEAD + nh.ksize;
}

static uint64_t u64_at(const uint8_t *bytes, size_t off)
{
    uint64_t v;
    memcpy(&v, bytes + off, 8);
    return v;
}

static void u64_put(uint8_t *bytes, size_t off, uint64_t v)
{
    memcpy(bytes + off, &v, 8);
}

Test(index_pages, free_lists_edited)
{
    fixture_build();
    size_t len;
    uint8_t *bytes = ts_read_file(ts_path(ts_store_dir(), "index/data.mdb"), &len);
    cr_assert_not_null(bytes);
    size_t psize = 4096;
    lmdb_meta m;
    meta_current(bytes, psize, &m);
    size_t recs[16];
    size_t n = free_records(bytes, psize, recs, 16);
    cr_assert_geq(n, 2, "%zu free records with their lists inline", n);
    size_t list0 = free_list_at(bytes, recs[0]), list1 = free_list_at(bytes, recs[1]);
    cr_assert_geq(u64_at(bytes, list0), 1);
    cr_assert_geq(u64_at(bytes, list1), 1);
    lmdb_db sessions = db_at(bytes, table_record(bytes, psize, "sessions"));
    size_t sessions_leaf = first_leaf(bytes, psize, &sessions);
    size_t over = 0; /* a page inside the overflow run of the big value */
    {
        size_t node = find_node(bytes, len, psize, LMDB_P_LEAF, LMDB_F_BIGDATA);
        cr_assert_neq(node, 0);
        lmdb_node_head nh;
        memcpy(&nh, bytes + node, sizeof(nh));
        over = u64_at(bytes, node + LMDB_NODE_HEAD + nh.ksize) + 1;
    }
    struct { const char *what; size_t page; } in_use[] = {
        {"a free list naming the main tree's root", m.dbs[1].root},
        {"a free list naming the root of sessions", sessions.root},
        {"a free list naming a leaf of sessions", sessions_leaf},
        {"a free list naming a page of an overflow run", over},
        {"a free list naming the free tree's root", m.dbs[0].root},
    };
    uint8_t *copy = malloc(len);
    for (size_t i = 0; i < sizeof(in_use) / sizeof(in_use[0]); i++) {
        memcpy(copy, bytes, len);
        /* A list of that page alone: count 1, in order. */
        u64_put(copy, list0, 1);
        u64_put(copy, list0 + 8, in_use[i].page);
        writer_case(copy, len, in_use[i].what);
    }
    /* A page in two lists. */
    memcpy(copy, bytes, len);
    u64_put(copy, list1, 1);
    u64_put(copy, list1 + 8, u64_at(bytes, list0 + 8));
    writer_case(copy, len, "a page in two free lists");
    /* A list out of LMDB's order (descending). */
    size_t longest = 0;
    for (size_t i = 0; i < n; i++)
        if (u64_at(bytes, free_list_at(bytes, recs[i])) >= 2)
            longest = free_list_at(bytes, recs[i]);
    cr_assert_neq(longest, 0, "no free list of two pages");
    memcpy(copy, bytes, len);
    uint64_t a = u64_at(bytes, longest + 8), b = u64_at(bytes, longest + 16);
    u64_put(copy, longest + 8, b);
    u64_put(copy, longest + 16, a);
    writer_case(copy, len, "a free list in ascending order");
    /* A record filed under a transaction after the meta's. */
    memcpy(copy, bytes, len);
    lmdb_node_head nh;
    memcpy(&nh, bytes + recs[n - 1], sizeof(nh));
    cr_assert_eq(nh.ksize, 8);
    u64_put(copy, recs[n - 1] + LMDB_NODE_HEAD, m.txnid + 1);
    writer_case(copy, len, "a free record of a later transaction");
    free(copy);
    free(bytes);
}

/* --- with a writer ---------------------------------------------------------- */

/* A process commits to the index in a loop (metadata of one session
 * rewritten, sessions created and deleted: pages freed and reused) while
 * this one opens the store again and again: every open sees a snapshot
 * in motion and must never call it damaged. */
static void writer_loop(int ready_fd)
{
    ctxs_store *st = NULL;
    if (ctxs_store_open(&st, ts_store_dir(), 0, NULL) != 0)
        _exit(2);
    ctxs_model m = ts_model(1);
    char value[2000];
    if (write(ready_fd, "r", 1) != 1)
        _exit(3);
    for (uint64_t i = 0;; i++) {
        memset(value, (int)('a' + i % 26), sizeof(value));
        int rc = ctxs_store_session_set_meta(st, BIG_NAME, "k", value, 100 + i % 1900);
        char name[32];
        snprintf(name, sizeof(name), "w%llu", (unsigned long long)(i % 8));
        ctxs_create_options o = ts_options(64, 4, 1, CTXS_SYNC_NONE);
        ctxs_session *s = NULL;
        if (rc == 0 && ctxs_store_session_create(&s, st, name, &m, &o) == 0) {
            ctxs_session_close(s);
            rc = ctxs_store_session_delete(st, name);
        }
        if (rc != 0)
            _exit(4);
    }
}

Test(index_pages, opens_beside_a_committing_writer_never_see_damage)
{
    fixture_build();
    int pfd[2];
    cr_assert_eq(pipe(pfd), 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(pfd[0]);
        writer_loop(pfd[1]);
    }
    close(pfd[1]);
    char c;
    cr_assert_eq(read(pfd[0], &c, 1), 1, "the writer did not start");
    int opens = 300;
    for (int i = 0; i < opens; i++) {
        int rc = open_in_child_ex("beside a writer", 0);
        cr_assert_eq(rc, 0, "open %d beside a writer: %s", i, ctxs_err_name(rc));
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, WNOHANG), 0, "the writer stopped early");
    kill(pid, SIGKILL);
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    close(pfd[0]);
}
