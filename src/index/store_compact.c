/*
 * ctxs_store_compact: compaction of a whole store, or of one session by
 * name; and ctxs_store_session_grow, which rewrites a session's file the
 * same way (src/store/grow.c) and notes its size. Each session file is
 * compacted by src/store/session_compact.c (the KV blocks of slots it
 * does not hold punched out); here the index's rows that nothing owns go,
 * repair runs, and the index itself is rewritten compacted.
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "index.h"
#include "mdb_calls.h"
#include "progress.h"
#include "session_iface.h"

/* Sets the index's disk_bytes of session id (named name) to bytes. A
 * session renamed or deleted meanwhile is left to its next update. */
static int note_disk_bytes(ctxs_store *st, uint64_t id, const char *name, size_t len,
                           uint64_t bytes)
{
    MDB_txn *txn;
    int rc = ctxs__txn_begin(&txn, st, 0);
    if (rc < 0)
        return rc;
    ctxs__session_rec rec;
    if ((rc = ctxs__session_get(&rec, txn, st, name, len)) < 0 || rec.id != id) {
        mdb_txn_abort(txn);
        return rc == CTXS_ENOTFOUND || rc == 0 ? 0 : rc;
    }
    rec.disk_bytes = bytes;
    MDB_val key = {len, (void *)name}, val = {sizeof(rec), &rec};
    return ctxs__txn_finish(txn, ctxs__mdb_error(ctxs__mdb_put(txn, st->sessions, &key, &val, 0)));
}

/* Compacts the file of session id and notes its new size. */
static int compact_one(ctxs_store_compact_result *res, ctxs_store *st, uint64_t id, const char *name,
                       size_t len)
{
    char *path = ctxs__file_path(st, id);
    if (!path)
        return CTXS_ENOMEM;
    uint64_t before, after;
    int rc = ctxs__session_compact(path, &before, &after);
    free(path);
    if (rc < 0)
        return rc == -ENOENT ? CTXS_ENOTFOUND : rc;
    res->sessions++;
    res->bytes_before += before;
    res->bytes_after += after;
    return note_disk_bytes(st, id, name, len, after);
}

int ctxs_store_session_grow(ctxs_store *st, const char *name, uint32_t capacity)
{
    ctxs__error_begin();
    CTXS__STORE_CHECK(st);
    size_t len;
    CTXS__REQUIRE(name && ctxs__name_check(name, &len) == 0, "the session name is not one: %s",
                  CTXS_NAME_RULE);
    if (st->rdonly)
        return ctxs__error(CTXS_EREADONLY, "the store is open read-only");
    ctxs_session_entry e;
    int rc = ctxs_store_session_get(&e, st, name);
    if (rc < 0)
        return rc;
    char *path = ctxs__file_path(st, e.id);
    if (!path)
        return CTXS_ENOMEM;
    uint64_t after;
    rc = ctxs__session_grow(path, capacity, &after);
    free(path);
    if (rc < 0)
        return rc == -ENOENT ? ctxs__error(CTXS_ENOTFOUND, "the file of '%s' is gone", name)
                             : rc;
    return note_disk_bytes(st, e.id, name, len, after);
}

/* Sessions (id, model) that own rows in the other tables, sorted by id. */
typedef struct owner {
    uint64_t id;
    uint8_t model_hash[CTXS_HASH_BYTES];
} owner;

static int by_owner_id(const void *a, const void *b)
{
    uint64_t x = ((const owner *)a)->id, y = ((const owner *)b)->id;
    return x < y ? -1 : x > y;
}

static const owner *owner_find(const owner *own, size_t n, uint64_t id)
{
    owner key = {.id = id};
    return n ? bsearch(&key, own, n, sizeof(*own), by_owner_id) : NULL;
}

/* Deletes the entry under cur and counts it. */
static int drop_here(MDB_cursor *cur, uint64_t *removed)
{
    int rc = ctxs__mdb_cursor_del(cur, 0);
    if (rc == 0)
        (*removed)++;
    return rc;
}

/* A session is its sessions[name] row and ids[id] naming it back. Rows
 * that only a bug or a hand could leave: a sessions row whose id has no ids
 * row gets one; a second sessions row for an id that ids names elsewhere
 * goes; an ids row whose name is not a session of that id goes. Then the
 * owners are the sessions. */
static int mend_names(MDB_txn *txn, ctxs_store *st, owner **out, size_t *n_out,
                      uint64_t *removed)
{
    *out = NULL;
    *n_out = 0;
    MDB_stat ms;
    int rc = mdb_stat(txn, st->sessions, &ms);
    owner *own = rc == 0 && ms.ms_entries ? ctxs__calloc(ms.ms_entries, sizeof(*own)) : NULL;
    if (rc == 0 && ms.ms_entries && !own)
        return CTXS_ENOMEM;
    size_t n = 0;
    MDB_cursor *cur = NULL;
    MDB_val key, val;
    if (rc == 0)
        rc = ctxs__mdb_cursor_open(txn, st->sessions, &cur);
    for (int op = MDB_FIRST; rc == 0 && (rc = mdb_cursor_get(cur, &key, &val, op)) == 0;
         op = MDB_NEXT) {
        ctxs__session_rec rec, other;
        if (val.mv_size != sizeof(rec) || key.mv_size == 0 || key.mv_size > CTXS_NAME_MAX)
            continue; /* not ours to judge: listing reports it */
        memcpy(&rec, val.mv_data, sizeof(rec));
        char name[CTXS_NAME_MAX + 1];
        size_t len = key.mv_size;
        memcpy(name, key.mv_data, len);
        uint8_t idk[8];
        ctxs__id_key(idk, rec.id);
        MDB_val ikey = {8, idk}, ival, nval = {len, name};
        int r = mdb_get(txn, st->ids, &ikey, &ival);
        if (r != 0 && r != MDB_NOTFOUND) {
            rc = r;
            break;
        }
        int named_here = r == 0 && ival.mv_size == len && memcmp(ival.mv_data, name, len) == 0;
        int named_elsewhere = !named_here && r == 0 && ival.mv_size &&
                              ival.mv_size <= CTXS_NAME_MAX &&
                              ctxs__session_get(&other, txn, st, ival.mv_data, ival.mv_size) == 0 &&
                              other.id == rec.id;
        if (named_elsewhere) { /* a duplicate of the row ids names */
            if ((rc = drop_here(cur, removed)) != 0)
                break;
            continue;
        }
        if (!named_here && (rc = ctxs__mdb_put(txn, st->ids, &ikey, &nval, 0)) != 0)
            break;
        own[n].id = rec.id;
        memcpy(own[n].model_hash, rec.model_hash, 16);
        n++;
    }
    if (cur)
        mdb_cursor_close(cur);
    cur = NULL;
    if (rc == MDB_NOTFOUND)
        rc = ctxs__mdb_cursor_open(txn, st->ids, &cur);
    for (int op = MDB_FIRST; rc == 0 && (rc = mdb_cursor_get(cur, &key, &val, op)) == 0;
         op = MDB_NEXT) {
        ctxs__session_rec rec;
        int r = CTXS_ENOTFOUND;
        if (key.mv_size == 8 && val.mv_size && val.mv_size <= CTXS_NAME_MAX)
            r = ctxs__session_get(&rec, txn, st, val.mv_data, val.mv_size);
        /* A session row of the wrong size is left as it is, as above. */
        if (r != CTXS_ENOTFOUND && (r != 0 || rec.id == ctxs__id_from_key(key.mv_data)))
            continue;
        if ((rc = drop_here(cur, removed)) != 0)
            break;
    }
    if (cur)
        mdb_cursor_close(cur);
    if (rc != MDB_NOTFOUND) {
        free(own);
        return ctxs__mdb_error(rc);
    }
    if (n)
        qsort(own, n, sizeof(*own), by_owner_id);
    *out = own;
    *n_out = n;
    return 0;
}

/* Deletes the rows of dbi (keyed by an id, then key_rest more bytes; any
 * length when key_rest is SIZE_MAX) whose id no session has. */
static int drop_unowned(MDB_txn *txn, MDB_dbi dbi, size_t key_rest, const owner *own, size_t n,
                        uint64_t *removed)
{
    MDB_cursor *cur;
    int rc = ctxs__mdb_cursor_open(txn, dbi, &cur);
    if (rc != 0)
        return ctxs__mdb_error(rc);
    MDB_val key, val;
    for (int op = MDB_FIRST; (rc = mdb_cursor_get(cur, &key, &val, op)) == 0; op = MDB_NEXT) {
        int well_formed = key_rest == SIZE_MAX ? key.mv_size > 8 : key.mv_size == 8 + key_rest;
        if (well_formed && owner_find(own, n, ctxs__id_from_key(key.mv_data)))
            continue;
        if ((rc = drop_here(cur, removed)) != 0)
            break;
    }
    mdb_cursor_close(cur);
    return rc == MDB_NOTFOUND ? 0 : ctxs__mdb_error(rc);
}

/* Deletes prefix entries of sessions that are gone, or that are of another
 * model than the entry. */
static int drop_unowned_prefixes(MDB_txn *txn, ctxs_store *st, const owner *own, size_t n,
                                 uint64_t *removed)
{
    MDB_cursor *cur;
    int rc = ctxs__mdb_cursor_open(txn, st->prefixes, &cur);
    if (rc != 0)
        return ctxs__mdb_error(rc);
    MDB_val key, val;
    for (int op = MDB_FIRST; (rc = mdb_cursor_get(cur, &key, &val, op)) == 0; op = MDB_NEXT) {
        const owner *o = key.mv_size == 32 && val.mv_size == 8
                             ? owner_find(own, n, ctxs__id_from_key(val.mv_data))
                             : NULL;
        if (o && memcmp(o->model_hash, key.mv_data, 16) == 0)
            continue;
        if ((rc = drop_here(cur, removed)) != 0)
            break;
    }
    mdb_cursor_close(cur);
    return rc == MDB_NOTFOUND ? 0 : ctxs__mdb_error(rc);
}

/* 1 if filehash key a names a later state of its file than b. */
static int newer_state(const ctxs__filehash_key *a, const ctxs__filehash_key *b)
{
    if (a->mtime_sec != b->mtime_sec)
        return a->mtime_sec > b->mtime_sec;
    if (a->mtime_nsec != b->mtime_nsec)
        return a->mtime_nsec > b->mtime_nsec;
    return a->size > b->size;
}

/* The kind of a file-hash row: 0 a weights hash, 1 a tokenizer hash, -1
 * neither (dropped). */
static int filehash_kind(const MDB_val *key, const MDB_val *val)
{
    if (val->mv_size != 16)
        return -1;
    if (key->mv_size == sizeof(ctxs__filehash_key))
        return 0;
    if (key->mv_size == sizeof(ctxs__tokhash_key) &&
        memcmp((const char *)key->mv_data + offsetof(ctxs__tokhash_key, kind), CTXS__TOKHASH_KIND,
               8) == 0)
        return 1;
    return -1;
}

/* The file-hash cache is keyed by (device, inode, size, mtime) and the
 * kind of hash; a file is in one state at a time, so of the rows of one
 * (device, inode) and kind all but one are stale: the newest is kept. Rows
 * of files that are gone cannot be told from the rest without their paths
 * and stay (a row costs 56 bytes). */
static int drop_stale_filehash(MDB_txn *txn, ctxs_store *st, uint64_t *removed)
{
    MDB_cursor *cur;
    int rc = ctxs__mdb_cursor_open(txn, st->filehash, &cur);
    if (rc != 0)
        return ctxs__mdb_error(rc);
    MDB_val key, val;
    ctxs__tokhash_key best[2]; /* a weights key uses .file only */
    int have[2] = {0, 0};
    uint64_t dev = 0, ino = 0;
    /* Rows of one (device, inode) are adjacent, whatever their kind: the
     * key starts with them. */
    for (int op = MDB_FIRST; (rc = mdb_cursor_get(cur, &key, &val, op)) == 0; op = MDB_NEXT) {
        int kind = filehash_kind(&key, &val);
        if (kind < 0) {
            if ((rc = drop_here(cur, removed)) != 0)
                break;
            continue;
        }
        ctxs__tokhash_key k;
        memset(&k, 0, sizeof(k));
        memcpy(&k, key.mv_data, key.mv_size);
        if (k.file.dev != dev || k.file.ino != ino) {
            dev = k.file.dev;
            ino = k.file.ino;
            have[0] = have[1] = 0;
        }
        if (!have[kind]) {
            best[kind] = k;
            have[kind] = 1;
            continue;
        }
        /* A second state of the same file: drop the older of the two. */
        if (newer_state(&k.file, &best[kind].file)) {
            size_t len = key.mv_size;
            MDB_val old = {len, &best[kind]};
            if ((rc = ctxs__mdb_del(txn, st->filehash, &old, NULL)) != 0)
                break;
            (*removed)++;
            best[kind] = k;
            /* The cursor is not moved by deleting another key's row: look
             * the current one up again to go on from it. */
            MDB_val here = {len, &best[kind]};
            if ((rc = mdb_cursor_get(cur, &here, &val, MDB_SET)) != 0)
                break;
        } else if ((rc = drop_here(cur, removed)) != 0) {
            break;
        }
    }
    mdb_cursor_close(cur);
    return rc == MDB_NOTFOUND ? 0 : ctxs__mdb_error(rc);
}

/* Removes index rows that nothing owns, in one transaction. Intents
 * (pending) are left to the resolution at open: a create in progress has
 * one and no session row yet. */
static int remove_orphan_rows(ctxs_store *st, uint64_t *removed)
{
    owner *own = NULL;
    size_t n = 0;
    uint64_t count = 0;
    MDB_txn *txn;
    int rc = ctxs__txn_begin(&txn, st, 0);
    if (rc < 0)
        return rc;
    if ((rc = mend_names(txn, st, &own, &n, &count)) == 0 &&
        (rc = drop_unowned(txn, st->checkpoints, SIZE_MAX, own, n, &count)) == 0 &&
        (rc = drop_unowned(txn, st->metadata, SIZE_MAX, own, n, &count)) == 0 &&
        (rc = drop_unowned(txn, st->chunks, 4, own, n, &count)) == 0 &&
        (rc = drop_unowned(txn, st->pins, 0, own, n, &count)) == 0 &&
        (rc = drop_unowned_prefixes(txn, st, own, n, &count)) == 0)
        rc = drop_stale_filehash(txn, st, &count);
    free(own);
    if (rc == 0 && count == 0) {
        mdb_txn_abort(txn); /* nothing to make durable */
        return 0;
    }
    if ((rc = ctxs__txn_finish(txn, rc)) == 0)
        *removed += count;
    return rc;
}

static void report(ctxs_progress_fn progress, void *arg, uint64_t done, uint64_t total)
{
    if (progress)
        progress(arg, done, total);
}

/* Every session, then the orphans, then the index. */
static int compact_all(ctxs_store_compact_result *res, ctxs_store *st, ctxs_progress_fn progress,
                       void *arg)
{
    ctxs_session_entry *list;
    size_t n;
    int rc = ctxs_store_session_list(&list, &n, st);
    if (rc < 0)
        return rc;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        int r = compact_one(res, st, list[i].id, list[i].name, strlen(list[i].name));
        switch (r) {
        case 0:
        case CTXS_ENOTFOUND: /* deleted meanwhile, or its file is gone:
                                repair drops the entry below */
            break;
        case CTXS_EBUSY:
            res->skipped_busy++;
            break;
        case CTXS_ECORRUPT: /* not a session that opens: left as it is, */
        case CTXS_EFOREIGN: /* for repair or a person to look at */
        case CTXS_EVERSION:
        case CTXS_EMODEL:
        case -ELOOP:
            break;
        default:
            rc = r;
        }
        if (rc == 0)
            report(progress, arg, i + 1, n);
    }
    free(list);
    if (rc == 0 && n == 0)
        report(progress, arg, 0, 0);
    if (rc < 0)
        return rc;

    /* Rows first: a session row that lost its id row is mended before
     * repair would take its file for one that no entry names. */
    if ((rc = remove_orphan_rows(st, &res->orphans_removed)) < 0)
        return rc;
    ctxs_store_repair_result rr;
    if ((rc = ctxs_store_repair(&rr, st)) < 0)
        return rc;
    res->orphans_removed += rr.files_removed + rr.entries_removed;

    rc = ctxs__index_compact(st, &res->index_bytes_before, &res->index_bytes_after);
    if (rc == 0)
        res->index_compacted = 1;
    else if (rc == CTXS_EBUSY)
        res->index_busy = 1;
    return rc == CTXS_EBUSY ? 0 : rc;
}

int ctxs_store_compact(ctxs_store_compact_result *out, ctxs_store *st, const char *name,
                       const ctxs_store_compact_options *opts)
{
    ctxs__error_begin();
    ctxs_store_compact_result res;
    memset(&res, 0, sizeof(res));
    if (out)
        *out = res;
    ctxs__progress pr;
    CTXS__PROGRESS_FROM(&pr, opts, CTXS_STORE_COMPACT_OPTIONS_VERSION,
                        CTXS_STORE_COMPACT_OPTIONS_INIT, "compact options");
    int rc;
    size_t len = 0;
    if (!st || (name && ctxs__name_check(name, &len) < 0))
        return CTXS_EINVAL;
    if (st->rdonly)
        return ctxs__store_readonly();
    if (name) {
        ctxs_session_entry e;
        if ((rc = ctxs_store_session_get(&e, st, name)) == 0 &&
            (rc = compact_one(&res, st, e.id, name, len)) == 0)
            report(pr.fn, pr.arg, 1, 1);
    } else {
        rc = compact_all(&res, st, pr.fn, pr.arg);
    }
    if (out)
        *out = res;
    return rc;
}
