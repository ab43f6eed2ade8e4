/*
 * ctxs_store_repair_index(): a damaged index, damaged for real in its
 * file, is repaired keeping what still reads. Each case checks that the
 * damage is refused as CTXS_EINDEX (in a child: a signal fails the test),
 * that the repair itself never faults (it runs here), and that afterwards
 * the store opens, every session verifies, and everything the result
 * reports as kept is there, as it was.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "index.h"
#include "label.h"
#include "support.h"

TestSuite(salvage, .init = ts_scratch_init, .fini = ts_scratch_fini, .timeout = 120);

/* --- the store before the damage ----------------------------------------- */

typedef struct want_session {
    const char *name;   /* in the index */
    const char *label;  /* in its file's label: another where a rename's
                           label write was lost (written so below) */
    uint32_t tokens;
    const char *cp[2];  /* checkpoints, at tokens / 2 and tokens */
    const char *meta_key;
    char meta_byte;     /* the value: 300 of these */
    int pinned;
    uint64_t id;        /* filled in */
} want_session;

static want_session want[] = {
    {"alpha", "alpha", 130, {"turn-1", "turn-2"}, "title", 'a', 1, 0},
    {"beta", "beta-old", 70, {"cp", NULL}, "template", 'b', 0, 0},
    {"gamma", "gamma", 20, {NULL, NULL}, NULL, 0, 1, 0},
    {"delta", "delta", 200, {"d1", "d2"}, "title", 'd', 0, 0},
    {"eps", "alpha", 90, {"e", NULL}, "notes", 'e', 1, 0},
    {"zeta", "zeta", 40, {NULL, "z"}, "title", 'z', 0, 0},
};
#define N_WANT (sizeof(want) / sizeof(want[0]))
#define MODEL_NAME "tiny-llama"
#define OTHER_NAME "unused-model"

static size_t want_checkpoints(void)
{
    size_t n = 0;
    for (size_t i = 0; i < N_WANT; i++)
        n += (want[i].cp[0] != NULL) + (want[i].cp[1] != NULL);
    return n;
}

static size_t want_meta(void)
{
    size_t n = 0;
    for (size_t i = 0; i < N_WANT; i++)
        n += want[i].meta_key != NULL;
    return n;
}

static size_t want_pins(void)
{
    size_t n = 0;
    for (size_t i = 0; i < N_WANT; i++)
        n += want[i].pinned;
    return n;
}

static const want_session *want_by_id(uint64_t id)
{
    for (size_t i = 0; i < N_WANT; i++)
        if (want[i].id == id)
            return &want[i];
    return NULL;
}

/* Builds the store; returns its data.mdb's bytes and page size. */
static uint8_t *fixture(size_t *len, size_t *psize)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_model m = ts_model(1), other = ts_model(2);
    cr_assert_eq(ctxs_model_register(st, &m, MODEL_NAME), 0);
    cr_assert_eq(ctxs_model_register(st, &other, OTHER_NAME), 0);
    for (size_t i = 0; i < N_WANT; i++) {
        const want_session *w = &want[i];
        ctxs_create_options o = ts_options(256, 4, 1, CTXS_SYNC_NONE);
        ctxs_session *s = NULL;
        cr_assert_eq(ctxs_store_session_create(&s, st, w->name, &m, &o), 0, "%s", w->name);
        ts_append_many(s, w->tokens / 2);
        if (w->cp[0])
            cr_assert_eq(ctxs_checkpoint_create(s, w->cp[0]), 0);
        ts_append_many(s, w->tokens - w->tokens / 2);
        if (w->cp[1])
            cr_assert_eq(ctxs_checkpoint_create(s, w->cp[1]), 0);
        ctxs_session_close(s);
        if (w->meta_key) {
            char value[300];
            memset(value, w->meta_byte, sizeof(value));
            cr_assert_eq(ctxs_store_session_set_meta(st, w->name, w->meta_key, value,
                                                     sizeof(value)), 0);
        }
        if (w->pinned)
            cr_assert_eq(ctxs_store_session_set_pinned(st, w->name, 1), 0);
        want[i].id = ts_session_entry(st, w->name).id;
        if (strcmp(w->name, w->label) != 0) {
            int fd = open(ts_id_path(want[i].id), O_RDWR);
            cr_assert_geq(fd, 0);
            cr_assert_eq(ctxs__label_write(fd, want[i].id, w->label, strlen(w->label)), 0);
            close(fd);
        }
    }
    ctxs_store_close(st);
    MDB_env *env = ts_raw_env(ts_store_dir(), MDB_RDONLY);
    MDB_stat ms;
    cr_assert_eq(mdb_env_stat(env, &ms), 0);
    mdb_env_close(env);
    *psize = ms.ms_psize;
    uint8_t *bytes = ts_read_file(ts_path(ts_store_dir(), "index/data.mdb"), len);
    cr_assert_not_null(bytes);
    return bytes;
}

static void put_index(const uint8_t *bytes, size_t len)
{
    cr_assert_eq(ts_write_file(ts_path(ts_store_dir(), "index/data.mdb"), bytes, len), 0);
}

/* Raw LMDB writes, for records of the wrong shape (the store is closed). */
static void raw_put(const char *db, const void *k, size_t kl, const void *v, size_t vl)
{
    MDB_env *env = ts_raw_env(ts_store_dir(), 0);
    MDB_txn *txn;
    MDB_dbi dbi;
    cr_assert_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, db, 0, &dbi), 0);
    MDB_val key = {kl, (void *)k}, val = {vl, (void *)v};
    cr_assert_eq(mdb_put(txn, dbi, &key, &val, 0), 0);
    cr_assert_eq(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
}

/* The pages the trees of the current snapshot use, by LMDB's counts: the
 * free tree, the main tree and every named table. (A table's duplicates
 * on pages of their own are counted by their own records, not here: this
 * is at most the number a walk reaches.) */
static size_t tree_pages(void)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_cursor *cur;
    MDB_stat ms;
    MDB_val key, val;
    size_t n = 0;
    env = ts_raw_env(ts_store_dir(), MDB_RDONLY);
    cr_assert_eq(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), 0);
    for (MDB_dbi dbi = 0; dbi < 2; dbi++) {
        cr_assert_eq(mdb_stat(txn, dbi, &ms), 0);
        n += ms.ms_branch_pages + ms.ms_leaf_pages + ms.ms_overflow_pages;
    }
    cr_assert_eq(mdb_cursor_open(txn, 1, &cur), 0);
    for (int op = MDB_FIRST; mdb_cursor_get(cur, &key, &val, op) == 0; op = MDB_NEXT) {
        char name[64];
        MDB_dbi dbi;
        cr_assert_lt(key.mv_size, sizeof(name));
        memcpy(name, key.mv_data, key.mv_size);
        name[key.mv_size] = 0;
        cr_assert_eq(mdb_dbi_open(txn, name, 0, &dbi), 0, "%s", name);
        cr_assert_eq(mdb_stat(txn, dbi, &ms), 0);
        n += ms.ms_branch_pages + ms.ms_leaf_pages + ms.ms_overflow_pages;
    }
    mdb_cursor_close(cur);
    mdb_txn_abort(txn);
    mdb_env_close(env);
    return n;
}

/* --- before the repair: refused, never a signal --------------------------- */

/* Opens the store and reads everything through it: the first error, or 0.
 * In a child (read_all_in_child()). */
static int read_all(void *arg)
{
    (void)arg;
    ctxs_store *st = NULL;
    int rc = ctxs_store_open(&st, ts_store_dir(), 0, NULL);
    ctxs_session_entry *list = NULL;
    size_t n = 0;
    if (rc == 0)
        rc = ctxs_store_session_list(&list, &n, st);
    ctxs_model m = ts_model(1);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        ctxs_meta_entry *meta = NULL;
        ctxs_checkpoint_entry *cps = NULL;
        size_t k;
        if ((rc = ctxs_store_session_list_meta(&meta, &k, st, list[i].name)) == 0)
            rc = ts_checkpoint_list(&cps, &k, st, list[i].name);
        ctxs_session *s = NULL;
        if (rc == 0 && (rc = ctxs_store_session_open(&s, st, list[i].name, &m, 0, NULL)) == 0)
            ctxs_session_close(s);
        ctxs_free(meta);
        ctxs_free(cps);
    }
    ctxs_model_entry *models = NULL;
    if (rc == 0)
        rc = ctxs_model_list(&models, &n, st);
    ctxs_free(models);
    ctxs_free(list);
    ctxs_store_close(st);
    return rc;
}

/* read_all() in a child: a signal fails the test. */
static int read_all_in_child(const char *what)
{
    return ts_in_child(read_all, NULL, what);
}

/* --- the repair and what it must leave ------------------------------------ */

static int is_kept(const ctxs_store_repair_index_count *c, size_t total)
{
    return c->kept == total && c->dropped == 0 && c->unread == 0 && c->whole;
}

/* Checks the repaired store against want[] and res: it opens, every
 * session verifies, every name, checkpoint, metadata row, pin and model
 * name the result counts as kept is there and right, and nothing is there
 * that was not. */
static void check_repaired(const ctxs_store_repair_index_result *res, const char *what)
{
    cr_assert_eq(res->sessions, N_WANT, "%s: %llu sessions", what,
                 (unsigned long long)res->sessions);
    cr_assert_eq(res->names.kept + res->n_renamed, N_WANT, "%s: names", what);
    cr_assert_eq(res->names.unread, res->n_renamed, "%s", what);
    if (res->moved_to) {
        struct stat sb;
        cr_assert_eq(stat(ts_path(res->moved_to, "data.mdb"), &sb), 0, "%s: %s", what,
                     res->moved_to);
    }
    ctxs_store *st = NULL;
    int rc = ctxs_store_open(&st, ts_store_dir(), 0, NULL);
    cr_assert_eq(rc, 0, "%s: open after repair: %s", what, ctxs_err_name(rc));
    ctxs_session_entry *list;
    size_t n;
    cr_assert_eq(ctxs_store_session_list(&list, &n, st), 0);
    cr_assert_eq(n, N_WANT, "%s: %zu sessions listed", what, n);
    ctxs_model m = ts_model(1);
    uint64_t names = 0, cps = 0, metas = 0, pins = 0;
    for (size_t i = 0; i < n; i++) {
        const want_session *w = want_by_id(list[i].id);
        cr_assert_not_null(w, "%s: unknown id %llu", what, (unsigned long long)list[i].id);
        int renamed = 0;
        for (size_t r = 0; r < res->n_renamed; r++)
            if (res->renamed[r].id == w->id) {
                renamed = 1;
                cr_assert_str_eq(res->renamed[r].name, list[i].name, "%s", what);
            }
        if (!renamed) {
            cr_assert_str_eq(list[i].name, w->name, "%s: id %llu", what,
                             (unsigned long long)w->id);
            names++;
        }
        ctxs_session *s = NULL;
        rc = ctxs_store_session_open(&s, st, list[i].name, &m, CTXS_RDONLY | CTXS_OPEN_VERIFY,
                                     NULL);
        cr_assert_eq(rc, 0, "%s: open %s: %s", what, list[i].name, ctxs_err_name(rc));
        uint64_t bad = 0;
        cr_assert_eq(ctxs_session_verify(&bad, s), 0, "%s: %s", what, list[i].name);
        cr_assert_eq(ts_n_tokens(s), w->tokens, "%s: %s", what, list[i].name);
        cr_assert_eq(ts_check_all(s), 0, "%s: %s", what, list[i].name);
        ctxs_checkpoint_entry *cp;
        size_t n_cp;
        cr_assert_eq(ctxs_checkpoint_list(&cp, &n_cp, s), 0, "%s", what);
        for (size_t k = 0; k < n_cp; k++) {
            int known = 0;
            for (int j = 0; j < 2; j++)
                if (w->cp[j] && strcmp(w->cp[j], cp[k].name) == 0) {
                    known = 1;
                    cr_assert_eq(cp[k].n_tokens, j ? w->tokens : w->tokens / 2, "%s", what);
                    cr_assert_eq(cp[k].stale, 0, "%s: %s is stale", what, cp[k].name);
                }
            cr_assert(known, "%s: checkpoint %s of %s was never made", what, cp[k].name, w->name);
        }
        cps += n_cp;
        ctxs_free(cp);
        ctxs_session_close(s);
        ctxs_meta_entry *meta;
        size_t n_meta;
        cr_assert_eq(ctxs_store_session_list_meta(&meta, &n_meta, st, list[i].name), 0);
        for (size_t k = 0; k < n_meta; k++) {
            cr_assert(w->meta_key && strcmp(meta[k].key, w->meta_key) == 0, "%s: key %s", what,
                      meta[k].key);
            char value[CTXS_META_VALUE_MAX], expect[300];
            size_t bytes = sizeof(value);
            memset(expect, w->meta_byte, sizeof(expect));
            cr_assert_eq(ctxs_store_session_get_meta(value, &bytes, st, list[i].name,
                                                     w->meta_key), 0);
            cr_assert_eq(bytes, sizeof(expect), "%s", what);
            cr_assert_eq(memcmp(value, expect, bytes), 0, "%s: %s's value", what, w->name);
        }
        metas += n_meta;
        ctxs_free(meta);
        if (list[i].pinned) {
            cr_assert(w->pinned, "%s: %s pinned", what, w->name);
            pins++;
        }
    }
    ctxs_free(list);
    cr_assert_eq(names, res->names.kept, "%s: names", what);
    cr_assert_eq(cps, res->checkpoints.kept, "%s: checkpoints %llu, said %llu", what,
                 (unsigned long long)cps, (unsigned long long)res->checkpoints.kept);
    cr_assert_eq(metas, res->metadata.kept, "%s: metadata", what);
    cr_assert_eq(pins, res->pins.kept, "%s: pins", what);
    ctxs_model_entry *models;
    cr_assert_eq(ctxs_model_list(&models, &n, st), 0);
    uint64_t named = 0;
    for (size_t i = 0; i < n; i++) {
        if (!models[i].name[0])
            continue;
        named++;
        const char *expect = memcmp(models[i].model.model_hash, m.model_hash, 16) == 0
                                 ? MODEL_NAME : OTHER_NAME;
        cr_assert_str_eq(models[i].name, expect, "%s", what);
    }
    ctxs_free(models);
    cr_assert_eq(named, res->models.kept, "%s: models named %llu, said kept %llu", what,
                 (unsigned long long)named, (unsigned long long)res->models.kept);
    /* Usable: a new session gets a new id. */
    ctxs_create_options o = ts_options(64, 4, 1, CTXS_SYNC_NONE);
    ctxs_session *s = NULL;
    rc = ctxs_store_session_create(&s, st, "after-repair", &m, &o);
    cr_assert_eq(rc, 0, "%s: create after repair: %s", what, ctxs_err_name(rc));
    cr_assert_eq(ts_append(s, 3), 0);
    ctxs_session_close(s);
    uint64_t id = ts_session_entry(st, "after-repair").id;
    cr_assert_null(want_by_id(id), "%s: a new session took id %llu", what,
                   (unsigned long long)id);
    cr_assert_eq(ctxs_store_session_delete(st, "after-repair"), 0);
    ctxs_store_close(st);
}

static void result_free(ctxs_store_repair_index_result *res)
{
    if (res->moved_to)
        ts_rmtree(res->moved_to);
    ctxs_free(res->moved_to);
    ctxs_free(res->renamed);
    memset(res, 0, sizeof(*res));
}

/* Repairs the store (here: the repair must not fault), checks it, and
 * leaves res for the caller's own checks. */
static void repair_and_check(ctxs_store_repair_index_result *res, const char *what)
{
    int rc = ctxs_store_repair_index(res, ts_store_dir(), 0);
    cr_assert_eq(rc, 0, "%s: repair: %s", what, ctxs_err_name(rc));
    check_repaired(res, what);
}

/* The damaged bytes in place: refused before, whole after. */
static void damaged_case(const uint8_t *bytes, size_t len, const char *what,
                         ctxs_store_repair_index_result *res)
{
    put_index(bytes, len);
    int rc = read_all_in_child(what);
    cr_assert_eq(rc, CTXS_EINDEX, "%s: before repair: %s", what, ctxs_err_name(rc));
    repair_and_check(res, what);
}

/* --- the cases ------------------------------------------------------------ */

Test(salvage, an_intact_index_comes_back_whole)
{
    size_t len, psize;
    free(fixture(&len, &psize));
    ctxs_store_repair_index_result res;
    repair_and_check(&res, "intact");
    cr_assert_eq(res.meta_pages, 2);
    cr_assert_eq(res.tables_failed, 0);
    cr_assert(is_kept(&res.names, N_WANT));
    cr_assert(is_kept(&res.checkpoints, want_checkpoints()), "checkpoints kept %llu",
              (unsigned long long)res.checkpoints.kept);
    cr_assert(is_kept(&res.metadata, want_meta()));
    cr_assert(is_kept(&res.pins, want_pins()));
    cr_assert(is_kept(&res.models, 2));
    cr_assert_not_null(res.moved_to);
    cr_assert_not_null(strstr(res.moved_to, "/index.damaged-"), "%s", res.moved_to);
    /* The index's names win over the labels': beta (labelled beta-old)
     * and eps (labelled alpha, which alpha holds). */
    ctxs_store *st = ts_store_open(ts_store_dir());
    cr_assert_eq(ts_session_entry(st, "beta").id, want[1].id);
    cr_assert_eq(ts_session_entry(st, "eps").id, want[4].id);
    cr_assert_eq(ts_session_entry(st, "alpha").id, want[0].id);
    ctxs_store_close(st);
    result_free(&res);
}

Test(salvage, a_truncated_index_at_every_page_boundary)
{
    size_t len, psize;
    uint8_t *bytes = fixture(&len, &psize);
    size_t pages = len / psize;
    cr_assert_geq(pages, 6, "too few pages: %zu", pages);
    for (size_t k = 0; k < pages; k++) {
        char what[64];
        snprintf(what, sizeof(what), "cut to %zu of %zu pages", k, pages);
        ctxs_store_repair_index_result res;
        damaged_case(bytes, k * psize, what, &res);
        if (k < 2)
            cr_assert_eq(res.meta_pages, k, "%s", what);
        result_free(&res);
    }
    free(bytes);
}

Test(salvage, lost_meta_pages)
{
    size_t len, psize;
    uint8_t *bytes = fixture(&len, &psize);
    uint8_t *copy = malloc(len);
    for (int c = 0; c < 3; c++) {
        memcpy(copy, bytes, len);
        memset(copy + (c == 1 ? psize : 0), 0, c == 2 ? 2 * psize : psize);
        const char *what = c == 0 ? "meta 0 zeroed" : c == 1 ? "meta 1 zeroed" : "both zeroed";
        ctxs_store_repair_index_result res;
        damaged_case(copy, len, what, &res);
        cr_log_info("%s: cp %llu/%llu/%llu/%u meta %llu/%llu/%llu/%u", what,
                    (unsigned long long)res.checkpoints.kept, (unsigned long long)res.checkpoints.dropped,
                    (unsigned long long)res.checkpoints.unread, res.checkpoints.whole,
                    (unsigned long long)res.metadata.kept, (unsigned long long)res.metadata.dropped,
                    (unsigned long long)res.metadata.unread, res.metadata.whole);
        if (c < 2) {
            /* One meta page finds every tree. Where the newer was lost,
             * the trees are those of the transaction before the last
             * (LMDB keeps its pages until the next commit): the fixture's
             * last transaction wrote one metadata row. */
            cr_assert_eq(res.meta_pages, 1, "%s", what);
            cr_assert(is_kept(&res.names, N_WANT), "%s", what);
            cr_assert(is_kept(&res.checkpoints, want_checkpoints()), "%s", what);
            cr_assert(res.metadata.whole && res.metadata.kept >= want_meta() - 1, "%s", what);
            cr_assert(is_kept(&res.pins, want_pins()), "%s", what);
            cr_assert(is_kept(&res.models, 2), "%s", what);
        } else {
            /* Nothing reads: the files give back sessions and labels. */
            cr_assert_eq(res.meta_pages, 0);
            cr_assert_eq(res.checkpoints.kept + res.metadata.kept + res.pins.kept, 0);
            cr_assert_eq(res.n_renamed, N_WANT);
            int beta_old = 0;
            for (size_t i = 0; i < res.n_renamed; i++)
                beta_old |= res.renamed[i].id == want[1].id &&
                            strcmp(res.renamed[i].name, "beta-old") == 0;
            cr_assert(beta_old, "beta came back under its label's name");
        }
        result_free(&res);
    }
    free(copy);
    free(bytes);
}

/* Garbage over each page in turn: refused cleanly before the repair
 * (never a signal: the open walks every tree page first, check_file_pages.c),
 * and the repair ends and keeps the rest. A page no tree of the current
 * snapshot reaches (free, or the older snapshot's) may be garbage: LMDB
 * never reads it, so the store opens. */
Test(salvage, garbage_over_each_page)
{
    size_t len, psize;
    uint8_t *bytes = fixture(&len, &psize);
    uint8_t *copy = malloc(len);
    size_t pages = len / psize, refused = 0, used = tree_pages();
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t k = 2; k < pages; k++) {
        memcpy(copy, bytes, len);
        /* The page's own number stays (LMDB would otherwise catch it at
         * once): the header's flags and bounds and the rest are noise. */
        for (size_t i = 8; i < psize; i++) {
            x = ts_mix64(x + i);
            copy[k * psize + i] = (uint8_t)x;
        }
        char what[64];
        snprintf(what, sizeof(what), "garbage over page %zu of %zu", k, pages);
        put_index(copy, len);
        int rc = read_all_in_child(what);
        cr_assert(rc == 0 || rc == CTXS_EINDEX, "%s: %s", what, ctxs_err_name(rc));
        refused += rc == CTXS_EINDEX;
        ctxs_store_repair_index_result res;
        repair_and_check(&res, what);
        result_free(&res);
    }
    /* Each page a tree reaches is refused: garbage in its header is
     * nothing LMDB could have written. */
    cr_log_info("garbage: %zu of %zu pages refused, %zu in the trees", refused, pages - 2, used);
    cr_assert_geq(refused, used, "%zu pages refused, the trees use %zu", refused, used);
    free(copy);
    free(bytes);
}

/* A record of each table cut short and lengthened, through LMDB itself:
 * what the index sees of a record whose size is wrong. */
Test(salvage, records_cut_and_lengthened)
{
    size_t len, psize;
    uint8_t *bytes = fixture(&len, &psize);
    uint8_t idk[8], cpkey[8 + 6], mkey[8 + 5], big[CTXS_META_VALUE_MAX + 8];
    ctxs__id_key(idk, want[0].id);
    memcpy(cpkey, idk, 8);
    memcpy(cpkey + 8, "turn-2", 6);
    memcpy(mkey, idk, 8);
    memcpy(mkey + 8, "title", 5);
    memset(big, 'x', sizeof(big));
    ctxs_model m = ts_model(1);
    uint8_t model_val[sizeof(ctxs__model_rec) + 16] = {0};
    ctxs__model_rec mr;
    memset(&mr, 0, sizeof(mr));
    mr.n_layers = m.geometry.n_layers;
    mr.n_kv_heads = m.geometry.n_kv_heads;
    mr.head_dim = m.geometry.head_dim;
    mr.dtype = m.geometry.dtype;
    mr.name_len = 10;
    memcpy(model_val, &mr, sizeof(mr));
    memcpy(model_val + sizeof(mr), MODEL_NAME "xxxxxx", 16);
    struct {
        const char *what, *db;
        const void *k;
        size_t kl;
        const void *v;
        size_t vl;
    } cases[] = {
        {"session record cut", "sessions", "alpha", 5, big, 50},
        {"session record lengthened", "sessions", "alpha", 5, big, 200},
        {"checkpoint cut", "checkpoints", cpkey, sizeof(cpkey), big, 23},
        {"checkpoint lengthened", "checkpoints", cpkey, sizeof(cpkey), big, 25},
        {"metadata lengthened", "metadata", mkey, sizeof(mkey), big, sizeof(big)},
        {"metadata key cut", "metadata", idk, 8, "v", 1},
        {"model cut", "models", m.model_hash, 16, model_val, 40},
        {"model lengthened", "models", m.model_hash, 16, model_val, sizeof(model_val)},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        put_index(bytes, len);
        raw_put(cases[c].db, cases[c].k, cases[c].kl, cases[c].v, cases[c].vl);
        int rc = read_all_in_child(cases[c].what);
        cr_assert_eq(rc, CTXS_EINDEX, "%s: before repair: %s", cases[c].what,
                     ctxs_err_name(rc));
        ctxs_store_repair_index_result res;
        repair_and_check(&res, cases[c].what);
        /* The one record is dropped, everything else kept. */
        uint64_t dropped = res.names.dropped + res.checkpoints.dropped + res.metadata.dropped +
                           res.models.dropped + res.pins.dropped;
        cr_assert_eq(dropped, 1, "%s: %llu dropped", cases[c].what,
                     (unsigned long long)dropped);
        result_free(&res);
    }
    free(bytes);
}

/* A pin of the wrong shape, and a row of a session that is gone: dropped,
 * counted, the rest kept. */
Test(salvage, rows_of_no_session_are_dropped)
{
    size_t len, psize;
    free(fixture(&len, &psize));
    uint8_t idk[8];
    ctxs__id_key(idk, 999);
    raw_put("pins", idk, 8, "", 0);
    raw_put("pins", idk, 7, "", 0);
    uint8_t cp[8 + 1];
    memcpy(cp, idk, 8);
    cp[8] = 'c';
    uint8_t rec[24] = {0};
    raw_put("checkpoints", cp, sizeof(cp), rec, sizeof(rec));
    ctxs_store_repair_index_result res;
    repair_and_check(&res, "rows of no session");
    cr_assert_eq(res.pins.kept, want_pins());
    cr_assert_eq(res.pins.dropped, 2);
    cr_assert_eq(res.checkpoints.kept, want_checkpoints());
    cr_assert_eq(res.checkpoints.dropped, 1);
    result_free(&res);
}

/* Bytes of one checkpoint's node edited in the file: its data size
 * field (the two bytes before its flags and key size) made smaller and
 * larger. */
Test(salvage, a_checkpoint_node_edited_in_the_file)
{
    size_t len, psize;
    uint8_t *bytes = fixture(&len, &psize);
    uint8_t *at = memmem(bytes, len, "turn-2", 6);
    cr_assert_not_null(at);
    size_t key_off = (size_t)(at - bytes) - 8, node = key_off - 8;
    uint16_t ksize;
    memcpy(&ksize, bytes + node + 6, 2);
    cr_assert_eq(ksize, 14, "not a checkpoint node: key size %u", ksize);
    const uint16_t sizes[] = {10, 200};
    for (size_t c = 0; c < 2; c++) {
        uint8_t *copy = malloc(len);
        memcpy(copy, bytes, len);
        memcpy(copy + node, &sizes[c], 2);
        char what[64];
        snprintf(what, sizeof(what), "checkpoint node's size %u", sizes[c]);
        ctxs_store_repair_index_result res;
        damaged_case(copy, len, what, &res);
        cr_assert_eq(res.checkpoints.kept, want_checkpoints() - 1, "%s", what);
        cr_assert_eq(res.checkpoints.dropped, 1, "%s", what);
        result_free(&res);
        free(copy);
    }
    free(bytes);
}

static void next_id_case(uint64_t value, const char *what)
{
    size_t len, psize;
    free(fixture(&len, &psize));
    raw_put("meta", "next_id", 7, &value, 8);
    ctxs_store_repair_index_result res;
    repair_and_check(&res, what);
    cr_assert(is_kept(&res.checkpoints, want_checkpoints()), "%s", what);
    result_free(&res);
}

Test(salvage, next_id_at_0)
{
    next_id_case(0, "next_id 0");
}

Test(salvage, next_id_at_its_maximum)
{
    next_id_case(UINT64_MAX, "next_id 2^64-1");
}

Test(salvage, refused_while_the_store_is_open)
{
    size_t len, psize;
    free(fixture(&len, &psize));
    ctxs_store_repair_index_result res;
    ctxs_store *st = ts_store_open(ts_store_dir());
    cr_assert_eq(ctxs_store_repair_index(&res, ts_store_dir(), 0), CTXS_EBUSY);
    ctxs_store_close(st);
    cr_assert_null(res.moved_to);
    /* Another process. */
    int go[2], done[2];
    cr_assert_eq(pipe(go), 0);
    cr_assert_eq(pipe(done), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        ctxs_store *cst = NULL;
        int rc = ctxs_store_open(&cst, ts_store_dir(), 0, NULL);
        char c = rc == 0 ? 'y' : 'n';
        if (write(go[1], &c, 1) != 1 || read(done[0], &c, 1) != 1)
            _exit(1);
        ctxs_store_close(cst);
        _exit(0);
    }
    char c;
    cr_assert_eq(read(go[0], &c, 1), 1);
    cr_assert_eq(c, 'y');
    cr_assert_eq(ctxs_store_repair_index(&res, ts_store_dir(), 0), CTXS_EBUSY);
    cr_assert_eq(write(done[1], "x", 1), 1);
    cr_assert_eq(ts_wait(pid), 0);
    /* Nothing moved: the store is as it was. */
    cr_assert(ts_exists(ts_path(ts_store_dir(), "index/data.mdb")));
    cr_assert_eq(ts_dir_entries(ts_store_dir()), 2);
    repair_and_check(&res, "after the others closed");
    result_free(&res);
}

Test(salvage, refuses_what_is_no_store)
{
    ctxs_store_repair_index_result res;
    cr_assert_eq(ctxs_store_repair_index(&res, ts_scratch, 0), CTXS_EFOREIGN);
    cr_assert_eq(ctxs_store_repair_index(&res, ts_path(ts_scratch, "nothing"), 0), -ENOENT);
    cr_assert_eq(ctxs_store_repair_index(&res, ts_scratch, 1), CTXS_EINVAL);
    cr_assert_eq(ctxs_store_repair_index(&res, NULL, 0), CTXS_EINVAL);
    cr_assert_null(res.moved_to);
}

/* index/ removed by hand: the files give everything back. */
Test(salvage, no_index_at_all)
{
    size_t len, psize;
    free(fixture(&len, &psize));
    ts_rmtree(ts_path(ts_store_dir(), "index"));
    ctxs_store_repair_index_result res;
    repair_and_check(&res, "no index");
    cr_assert_null(res.moved_to);
    cr_assert_eq(res.n_renamed, N_WANT);
    result_free(&res);
}

/* A metadata value may be empty (ctxs_store_session_set_meta() takes 0
 * bytes): the repair keeps it as it keeps any other. */
Test(salvage, an_empty_metadata_value_is_kept)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_model m = ts_model(1);
    cr_assert_eq(ctxs_model_register(st, &m, NULL), 0);
    ctxs_create_options o = ts_options(256, 4, 0, CTXS_SYNC_NONE);
    ctxs_session *s = NULL;
    cr_assert_eq(ctxs_store_session_create(&s, st, "chat", &m, &o), 0);
    ctxs_session_close(s);
    cr_assert_eq(ctxs_store_session_set_meta(st, "chat", "empty", "", 0), 0);
    cr_assert_eq(ctxs_store_session_set_meta(st, "chat", "title", "hello", 5), 0);
    ctxs_store_close(st);

    ctxs_store_repair_index_result res;
    cr_assert_eq(ctxs_store_repair_index(&res, ts_store_dir(), 0), 0);
    cr_assert_eq(res.metadata.kept, 2, "kept %llu, dropped %llu",
                 (unsigned long long)res.metadata.kept, (unsigned long long)res.metadata.dropped);
    cr_assert_eq(res.metadata.dropped, 0);
    result_free(&res);
    st = ts_store_open(ts_store_dir());
    char buf[16];
    size_t n = sizeof(buf);
    cr_assert_eq(ctxs_store_session_get_meta(buf, &n, st, "chat", "empty"), 0);
    cr_assert_eq(n, 0);
    ctxs_store_close(st);
}
