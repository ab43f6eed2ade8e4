/*
 * index_records: the records of the store's LMDB index (sessions, ids,
 * models, file hashes, checkpoints, prefixes, chunks, intents, meta) as
 * the fuzzer makes them. The decoders are file-static in src/index, so the
 * fuzzed bytes are written into a real index (the sample store of fuzz.h,
 * in a tmpfs) on top of its own records, and the store's read paths run
 * over them: list, get, open, prefix lookups, gc, repair, reindex,
 * compact, forks, checkpoints, export, and reopening the store (format
 * check, intents).
 *
 * Input: two bytes of operations (OP_* below, little-endian), then any
 * number of records: table (u8, modulo 9), key length (u8), value length
 * (u16 LE; 0xffff deletes the key), key, value.
 *
 * Every input meets the same store: the tables are reset to the sample's
 * records, and the session files are copied back after an input that
 * could have changed them.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"
#include "index.h"

enum {
    OP_LIST = 1 << 0,       /* list sessions, models, checkpoints; get each */
    OP_OPEN_RO = 1 << 1,    /* open every listed session read-only, verify */
    OP_OPEN_RW = 1 << 2,    /* open every listed session read-write */
    OP_PREFIX = 1 << 3,     /* prefix lookups */
    OP_GC_DRY = 1 << 4,     /* a dry-run gc: deletes nothing */
    OP_GC = 1 << 5,         /* gc that deletes */
    OP_REPAIR = 1 << 6,
    OP_REINDEX = 1 << 7,
    OP_COMPACT = 1 << 8,    /* one session, then the whole store */
    OP_FORK = 1 << 9,
    OP_RENAME_DELETE = 1 << 10,
    OP_CHECKPOINT = 1 << 11,/* restore, create, delete */
    OP_EXPORT = 1 << 12,
    OP_REOPEN = 1 << 13,    /* close and open the store again */
    OP_FORK_CHECKPOINTS = 1 << 14, /* fork at every listed checkpoint */
};
#define OPS_WRITING (OP_OPEN_RW | OP_GC | OP_REPAIR | OP_REINDEX | OP_COMPACT | OP_FORK | \
                     OP_RENAME_DELETE | OP_CHECKPOINT | OP_REOPEN | OP_FORK_CHECKPOINTS)

#define N_TABLES 9

static char *dir, *store_dir, *template_dir, *sessions_dir, *template_sessions, *export_path;
static ctxs_store *st;
static int files_dirty;

/* The sample's records, to put back before every input. */
typedef struct kv {
    int table;
    MDB_val key, val;
} kv;
static kv *baseline;
static size_t n_baseline;

static void fail(const char *what, int rc)
{
    fprintf(stderr, "index_records_fuzzer: %s (%d %s)\n", what, rc, ctxs_err_name(rc));
    abort();
}

static MDB_dbi table_dbi(int t)
{
    MDB_dbi d[N_TABLES] = { st->meta, st->sessions, st->ids, st->models, st->filehash,
                            st->checkpoints, st->prefixes, st->chunks, st->pending };
    return d[t];
}

static void *dup_bytes(const void *p, size_t n)
{
    void *q = malloc(n ? n : 1);
    if (!q)
        abort();
    memcpy(q, p, n);
    return q;
}

static void take_baseline(void)
{
    MDB_txn *txn;
    if (mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn) != 0)
        fail("a read transaction", 0);
    for (int t = 0; t < N_TABLES; t++) {
        MDB_cursor *cur;
        if (mdb_cursor_open(txn, table_dbi(t), &cur) != 0)
            fail("a cursor", 0);
        MDB_val k, v;
        for (int op = MDB_FIRST; mdb_cursor_get(cur, &k, &v, op) == 0; op = MDB_NEXT) {
            baseline = realloc(baseline, (n_baseline + 1) * sizeof(*baseline));
            if (!baseline)
                abort();
            kv *e = &baseline[n_baseline++];
            e->table = t;
            e->key = (MDB_val){ k.mv_size, dup_bytes(k.mv_data, k.mv_size) };
            e->val = (MDB_val){ v.mv_size, dup_bytes(v.mv_data, v.mv_size) };
        }
        mdb_cursor_close(cur);
    }
    mdb_txn_abort(txn);
}

static void open_store(void)
{
    int rc = ctxs_store_open(&st, store_dir, CTXS_STORE_CREATE, NULL);
    if (rc < 0)
        fail("opening the sample store", rc);
}

/* The store as the sample left it, index and files. */
static void restore_store(void)
{
    ctxs_store_close(st);
    st = NULL;
    fuzz_rmtree(store_dir);
    if (fuzz_copy_tree(template_dir, store_dir, "lock.mdb") < 0)
        fail("copying the sample store", 0);
    open_store();
    files_dirty = 0;
}

static void init(void)
{
    dir = (char *)fuzz_scratch("index_records");
    store_dir = fuzz_join(dir, "store");
    template_dir = fuzz_join(dir, "template");
    sessions_dir = fuzz_join(store_dir, "sessions");
    template_sessions = fuzz_join(template_dir, "sessions");
    export_path = fuzz_join(dir, "out.export");
    int rc = fuzz_build_store(template_dir);
    if (rc < 0)
        fail("building the sample store", rc);
    if (fuzz_copy_tree(template_dir, store_dir, "lock.mdb") < 0)
        fail("copying the sample store", 0);
    open_store();
    take_baseline();
}

/* Puts the sample's records back, then the input's. Returns 0, or -1 when
 * the records could not be written (the input is skipped). */
static int load(const uint8_t *data, size_t size)
{
    MDB_txn *txn;
    if (mdb_txn_begin(st->env, NULL, 0, &txn) != 0)
        fail("a write transaction", 0);
    for (int t = 0; t < N_TABLES; t++)
        if (mdb_drop(txn, table_dbi(t), 0) != 0)
            fail("emptying a table", 0);
    for (size_t i = 0; i < n_baseline; i++)
        if (mdb_put(txn, table_dbi(baseline[i].table), &baseline[i].key, &baseline[i].val, 0))
            fail("putting a sample record back", 0);
    while (size >= 4) {
        int t = data[0] % N_TABLES;
        size_t klen = data[1];
        uint16_t vlen;
        memcpy(&vlen, data + 2, 2);
        data += 4, size -= 4;
        size_t vbytes = vlen == 0xffff ? 0 : vlen;
        if (klen + vbytes > size)
            break;
        MDB_val k = { klen, (void *)data }, v = { vbytes, (void *)(data + klen) };
        int rc = vlen == 0xffff ? mdb_del(txn, table_dbi(t), &k, NULL)
                                : mdb_put(txn, table_dbi(t), &k, &v, 0);
        /* Sizes LMDB refuses leave the transaction usable; anything else
         * (it cannot happen on a map this small) skips the input. */
        if (rc != 0 && rc != MDB_NOTFOUND && rc != MDB_BAD_VALSIZE && rc != EINVAL &&
            rc != MDB_KEYEXIST) {
            mdb_txn_abort(txn);
            return -1;
        }
        data += klen + vbytes, size -= klen + vbytes;
    }
    if (mdb_txn_commit(txn) != 0)
        return -1;
    return 0;
}

static void restore_files(void)
{
    fuzz_empty_dir(sessions_dir);
    if (fuzz_copy_tree(template_sessions, sessions_dir, NULL) < 0)
        fail("copying the sample sessions", 0);
    files_dirty = 0;
}

static void prefix_lookups(void)
{
    uint32_t tokens[200];
    fuzz_sample_tokens(tokens, 150);
    for (int i = 150; i < 200; i++)
        tokens[i] = (uint32_t)i;
    ctxs_model_entry *models = NULL;
    size_t n_models = 0;
    ctxs_model_list(&models, &n_models, st);
    static const uint64_t lens[] = { 0, 63, 64, 100, 128, 150, 200 };
    ctxs_model m0 = fuzz_model(0);
    for (size_t m = 0; m <= n_models && m < 8; m++) {
        const uint8_t *hash = m < n_models ? models[m].model.model_hash : m0.model_hash;
        for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
            ctxs_prefix_match match;
            if (ctxs_prefix_find(&match, st, hash, tokens, lens[i]) == 0) {
                if (match.n_tokens > lens[i] || match.n_tokens < CTXS_PREFIX_CHUNK)
                    fail("a prefix match longer than the prompt or shorter than a chunk", 0);
                /* The name an inconsistent index gives need not be the
                 * file that was checked, so only open it. */
                ctxs_session *s = NULL;
                if (ctxs_store_session_open(&s, st, match.session, NULL, CTXS_RDONLY,
                                            NULL) == 0)
                    ctxs_session_close(s);
            }
        }
    }
    ctxs_free(models);
}

/* The checkpoints of the session named name, through a read-only handle. */
static int checkpoints_of(ctxs_checkpoint_entry **out, size_t *n_out, const char *name)
{
    ctxs_session *s = NULL;
    int rc = ctxs_store_session_open(&s, st, name, NULL, CTXS_RDONLY, NULL);
    if (rc == 0) {
        rc = ctxs_checkpoint_list(out, n_out, s);
        ctxs_session_close(s);
    }
    return rc;
}

static void run_ops(unsigned ops)
{
    ctxs_session_entry *list = NULL;
    size_t n = 0;
    ctxs_store_session_list(&list, &n, st);
    if (n > 16)
        n = 16;

    if (ops & OP_LIST) {
        for (size_t i = 0; i < n; i++) {
            ctxs_session_entry e;
            ctxs_store_session_get(&e, st, list[i].name);
            ctxs_checkpoint_entry *cps;
            size_t n_cps;
            if (checkpoints_of(&cps, &n_cps, list[i].name) == 0)
                ctxs_free(cps);
        }
        ctxs_model_entry *models;
        size_t n_models;
        if (ctxs_model_list(&models, &n_models, st) == 0) {
            for (size_t i = 0; i < n_models; i++) {
                ctxs_model_entry e;
                ctxs_model_get(&e, st, models[i].model.model_hash);
            }
            ctxs_free(models);
        }
    }
    for (size_t i = 0; i < n && (ops & (OP_OPEN_RO | OP_OPEN_RW)); i++) {
        ctxs_model_entry m;
        int have_model = ctxs_model_get(&m, st, list[i].model_hash) == 0;
        ctxs_session *s = NULL;
        if ((ops & OP_OPEN_RO) &&
            ctxs_store_session_open(&s, st, list[i].name, NULL, CTXS_RDONLY, NULL) == 0) {
            uint64_t bad;
            ctxs_session_verify(&bad, s);
            ctxs_session_close(s);
        }
        if ((ops & OP_OPEN_RW) && have_model &&
            ctxs_store_session_open(&s, st, list[i].name, &m.model, 0, NULL) == 0) {
            if (fuzz_append(s, 1) == 0)
                ctxs_checkpoint_create(s, "new");
            ctxs_session_close(s);
        }
    }
    if (ops & OP_PREFIX)
        prefix_lookups();
    ctxs_store_gc_result gc;
    if (ops & OP_GC_DRY) {
        ctxs_store_gc(&gc, st, 0, CTXS_GC_DRY_RUN);
        ctxs_free(gc.sessions);
    }
    if (ops & OP_GC) {
        ctxs_store_gc(&gc, st, 100000, 0);
        ctxs_free(gc.sessions);
    }
    if (ops & OP_REPAIR) {
        ctxs_store_repair_result r;
        ctxs_store_repair(&r, st);
    }
    if (ops & OP_REINDEX) {
        ctxs_store_reindex_result r;
        ctxs_store_reindex(&r, st);
    }
    if (ops & OP_COMPACT) {
        ctxs_store_compact_result r;
        ctxs_store_compact(&r, st, "a", NULL);
        int rc = ctxs_store_compact(&r, st, NULL, NULL);
        fuzz_debug("index_records: compact: %s", ctxs_err_name(rc));
    }
    if (ops & OP_FORK) {
        ctxs_store_session_fork(NULL, st, "a", "fork1", 64, NULL);
        ctxs_store_session_fork(NULL, st, "b", "fork2", UINT64_MAX, NULL);
        ctxs_store_session_fork_checkpoint(NULL, st, "a", "cp0", "fork3", NULL);
    }
    for (size_t i = 0; i < n && (ops & OP_FORK_CHECKPOINTS); i++) {
        ctxs_checkpoint_entry *cps;
        size_t n_cps;
        if (checkpoints_of(&cps, &n_cps, list[i].name) == 0) {
            for (size_t j = 0; j < n_cps && j < 4; j++)
                ctxs_store_session_fork_checkpoint(NULL, st, list[i].name, cps[j].name, "forked", NULL);
            ctxs_free(cps);
        }
    }
    if (ops & OP_CHECKPOINT) {
        ctxs_model m0 = fuzz_model(0);
        ctxs_session *s = NULL;
        if (ctxs_store_session_open(&s, st, "a", &m0, 0, NULL) == 0) {
            ctxs_checkpoint_restore(s, "cp1");
            ctxs_checkpoint_restore(s, "cp0");
            ctxs_checkpoint_create(s, "cpx");
            ctxs_checkpoint_delete(s, "cp1");
            ctxs_session_close(s);
        }
    }
    if (ops & OP_EXPORT) {
        for (size_t i = 0; i < n && i < 4; i++) {
            unlink(export_path);
            ctxs_store_session_export(st, list[i].name, export_path, NULL);
        }
        unlink(export_path);
    }
    if (ops & OP_RENAME_DELETE) {
        ctxs_store_session_rename(st, "a", "z");
        ctxs_store_session_delete(st, "b");
        for (size_t i = 0; i < n && i < 4; i++)
            ctxs_store_session_delete(st, list[i].name);
    }
    ctxs_free(list);
    if (ops & OP_REOPEN) {
        ctxs_store_close(st);
        st = NULL;
        if (ctxs_store_open(&st, store_dir, CTXS_STORE_CREATE, NULL) < 0)
            restore_store(); /* a hostile format record: start again */
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2 || size > 65536)
        return 0;
    if (!st)
        init();
    /* A compaction whose reopen met a hostile format record leaves st
     * without an environment (CTXS_EFAILED: close st), as documented. */
    if (!st->env)
        restore_store();
    int fds = fuzz_fd_count();
    unsigned ops = (unsigned)data[0] | (unsigned)data[1] << 8;
    if (files_dirty)
        restore_files();
    if (load(data + 2, size - 2) == 0) {
        if (ops & OPS_WRITING)
            files_dirty = 1;
        run_ops(ops);
    }
    if (!st->env)
        restore_store();
    unlink(export_path);
    fuzz_check_fds("index_records", fds);
    return 0;
}
