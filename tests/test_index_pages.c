/*
 * The index's tree pages checked before LMDB maps them (index_pages.c):
 * single fields of a real index file edited -- a node's key or data size,
 * an overflow node's page and an overflow run's page count, a branch
 * child, a table's root, a page's bounds, a sub-page's header, a tree of
 * duplicates' record -- each refused as CTXS_EINDEX by an ordinary open
 * (in a child: a crash fails the test), and repair-index brings the store
 * back. An index of every shape the store makes (overflow values, a
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
    MDB_env *env;
    cr_assert_eq(mdb_env_create(&env), 0);
    cr_assert_eq(mdb_env_set_maxdbs(env, 16), 0);
    cr_assert_eq(mdb_env_open(env, index, MDB_RDONLY, 0600), 0);
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

/* Opens the store in a child and lists every session and its metadata:
 * the first error, or 0. A signal fails the test. */
static int open_in_child_ex(const char *what, int deep)
{
    int pfd[2];
    cr_assert_eq(pipe(pfd), 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(pfd[0]);
        ctxs_store *st = NULL;
        int rc = ctxs_store_open(&st, ts_store_dir(), 0, NULL);
        ctxs_session_entry *list = NULL;
        size_t n = 0;
        if (rc == 0)
            rc = ctxs_store_session_list(&list, &n, st);
        for (size_t i = 0; deep && rc == 0 && i < n; i++) {
            ctxs_meta_entry *meta = NULL;
            size_t k;
            rc = ctxs_store_session_list_meta(&meta, &k, st, list[i].name);
            ctxs_free(meta);
        }
        ctxs_free(list);
        ctxs_store_close(st);
        ssize_t w = write(pfd[1], &rc, sizeof(rc));
        _exit(w == (ssize_t)sizeof(rc) ? 0 : 1);
    }
    close(pfd[1]);
    int status, rc = 1;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status), "%s: the open was killed by signal %d", what,
              WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    cr_assert_eq(WEXITSTATUS(status), 0, "%s: the child failed (a fault under ASan?)", what);
    cr_assert_eq(read(pfd[0], &rc, sizeof(rc)), (ssize_t)sizeof(rc));
    close(pfd[0]);
    return rc;
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
    ctxs_salvage_result res;
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
