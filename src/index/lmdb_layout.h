/*
 * LMDB 0.9's on-disk layout, as mdb.c defines it (MDB_page, MDB_node,
 * MDB_db, MDB_meta), for the checks that read index/data.mdb with pread()
 * before LMDB maps it (check_file.c, check_file_pages.c). Mirrored with the
 * platform's word size and byte order, as LMDB writes them: an LMDB file
 * is not portable between word sizes or byte orders anyway.
 */
#ifndef CTXS_LMDB_LAYOUT_H
#define CTXS_LMDB_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#define LMDB_MAGIC 0xBEEFC0DEu  /* MDB_MAGIC */
#define LMDB_DATA_VERSION 1u    /* MDB_DATA_VERSION of every 0.9 release */
#define LMDB_MIN_PSIZE 512u
#define LMDB_MAX_PSIZE 65536u
#define LMDB_P_INVALID (~(size_t)0) /* the root of an empty tree */

/* Page kinds (mp_flags). The rest are states of a page in a writer's
 * memory, cleared before a page is written (mdb_page_flush()): a page of
 * the file that carries one is taken by a writer for one of its own (a
 * P_DIRTY page is written in place, through the read-only map). Only a
 * sub-page, which is no page of the file, keeps P_DIRTY: LMDB writes it
 * with it, and sets it again before it writes one. */
#define LMDB_P_BRANCH 0x01u
#define LMDB_P_LEAF 0x02u
#define LMDB_P_OVERFLOW 0x04u
#define LMDB_P_META 0x08u
#define LMDB_P_DIRTY 0x10u      /* in memory: written in this transaction */
#define LMDB_P_LEAF2 0x20u      /* a leaf of MDB_DUPFIXED duplicates */
#define LMDB_P_SUBP 0x40u       /* a page inline in a leaf node */
#define LMDB_P_LOOSE 0x4000u    /* in memory: freed again, reusable */
#define LMDB_P_KEEP 0x8000u     /* in memory: not to be spilled */

/* Node flags (mn_flags of a leaf node). */
#define LMDB_F_BIGDATA 0x01u    /* the data is on overflow pages */
#define LMDB_F_SUBDATA 0x02u    /* the data is an lmdb_db */
#define LMDB_F_DUPDATA 0x04u    /* the data holds duplicates */

/* A tree's flags (md_flags; mdb_dbi_open()'s that persist). */
#define LMDB_DB_REVERSEKEY 0x02u
#define LMDB_DB_DUPSORT 0x04u
#define LMDB_DB_INTEGERKEY 0x08u
#define LMDB_DB_DUPFIXED 0x10u
#define LMDB_DB_INTEGERDUP 0x20u
#define LMDB_DB_REVERSEDUP 0x40u
#define LMDB_DB_FLAGS 0x7eu

/* CURSOR_STACK: a cursor holds at most this many pages, root to leaf. */
#define LMDB_MAX_DEPTH 32u

/* MDB_MAXKEYSIZE: no key LMDB 0.9 writes is longer, nor any duplicate of
 * an MDB_DUPSORT tree (the key of its sub-tree). */
#define LMDB_MAX_KEY 511u

/* The free tree's flags: MDB_INTEGERKEY, and what the environment had of
 * MDB_FIXEDMAP (0x01) and MDB_NOSUBDIR (0x4000) when it was made
 * (mdb_env_init_meta0()). A writer takes them from the meta as they are:
 * MDB_DUPSORT there sends its first put down a cursor without the
 * sub-cursor that flag needs. */
#define LMDB_FREE_DB_FLAGS LMDB_DB_INTEGERKEY
#define LMDB_FREE_ENV_FLAGS 0x4001u

/* Transaction ids. A writer's is the meta's plus one, and (txnid_t)-1
 * marks a free reader slot, so a meta near 2^64 wraps a writer onto ids
 * LMDB takes for other things. No file reaches 2^63 commits (292,000
 * years at a million a second): a meta that claims more is damaged. */
#define LMDB_TXNID_MAX ((uint64_t)INT64_MAX)

/* MDB_page's header (PAGEHDRSZ bytes). In a branch or leaf page an array
 * of 16-bit node offsets (from the page's start) follows, growing up to
 * lower; the nodes sit between upper and the page's end. A LEAF2 page
 * holds its keys packed right after the header instead, lower and upper
 * counting them as if each had an offset. An overflow page's header is
 * followed by the data, over pages pages with no further header. */
typedef struct lmdb_page_head {
    size_t pgno;       /* the page's own number; any value in a sub-page */
    uint16_t pad;      /* in a LEAF2 sub-page: its keys' size */
    uint16_t flags;    /* LMDB_P_* */
    union {
        struct {
            uint16_t lower, upper; /* the free space between */
        } b;
        uint32_t pages; /* an overflow page's count of pages */
    } u;
} lmdb_page_head;
#define LMDB_PAGE_HEAD sizeof(lmdb_page_head)

/* MDB_node's header, 2-byte aligned in its page, then the key (ksize
 * bytes), then the data. In a branch node lo | hi << 16 | flags << 32 is
 * the child's page number (no flags); in a leaf node lo | hi << 16 is the
 * data's size, and an F_BIGDATA node holds the overflow page's number as
 * its data instead. */
typedef struct lmdb_node_head {
    uint16_t lo, hi;
    uint16_t flags;
    uint16_t ksize;
} lmdb_node_head;
#define LMDB_NODE_HEAD sizeof(lmdb_node_head)

/* MDB_db: one tree's root and counts. */
typedef struct lmdb_db {
    uint32_t pad;      /* in the free tree's: the page size (mm_psize);
                          in a DUPFIXED sub-tree: its keys' size */
    uint16_t flags;    /* LMDB_DB_*; the free tree's: the env's flags */
    uint16_t depth;    /* 1 for a root that is a leaf, 0 for none */
    size_t branch_pages, leaf_pages, overflow_pages, entries;
    size_t root;       /* LMDB_P_INVALID for an empty tree */
} lmdb_db;

/* MDB_meta. */
typedef struct lmdb_meta {
    uint32_t magic;
    uint32_t version;
    void *address;
    size_t mapsize;
    lmdb_db dbs[2];    /* the free pages' tree, the main tree */
    size_t last_pg;    /* the last page any tree uses: the file holds it */
    size_t txnid;      /* the transaction that wrote this meta, which is
                          written at page txnid & 1 (mdb_env_write_meta()) */
} lmdb_meta;

typedef struct lmdb_meta_page {
    lmdb_page_head head;
    lmdb_meta meta;
} lmdb_meta_page;

_Static_assert(LMDB_PAGE_HEAD == 16 || sizeof(size_t) != 8, "MDB_page header");
_Static_assert(LMDB_NODE_HEAD == 8, "MDB_node header");
_Static_assert(sizeof(lmdb_db) == 48 || sizeof(size_t) != 8, "MDB_db");

#endif
