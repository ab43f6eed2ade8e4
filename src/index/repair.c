/*
 * Repairing what people and crashes did to files and index, and
 * rebuilding the index from the files (reindex): both list the session
 * files and read what each says of itself.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format.h"
#include "index.h"
#include "lock.h"
#include "mdb_calls.h"
#include "peek.h"

/* Reads 16 lowercase hex digits; 0 if name does not start with them. */
static uint64_t hex16(const char *name)
{
    uint64_t id = 0;
    for (int i = 0; i < 16; i++) {
        char c = name[i];
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (v < 0)
            return 0;
        id = id << 4 | (uint64_t)v;
    }
    return id;
}

/* The id of a file named exactly "<id as 16 hex digits>.ctxs", or 0. */
static uint64_t file_id(const char *name)
{
    uint64_t id = hex16(name);
    return id && strcmp(name + 16, ".ctxs") == 0 ? id : 0;
}

/* 1 if name is a file written aside by a create or fork. */
static int is_tmp_file(const char *name)
{
    return hex16(name) && strncmp(name + 16, ".ctxs.tmp-", 10) == 0;
}

/* The ids of the session files in the sessions directory, sorted. */
static int list_files(ctxs_store *st, uint64_t **out, size_t *n_out, int remove_tmp,
                      uint64_t *removed)
{
    *out = NULL;
    *n_out = 0;
    DIR *dir;
    int rc = ctxs__sessions_dir_open(&dir, st);
    if (rc < 0)
        return rc;
    rewinddir(dir);
    uint64_t *ids = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while (rc == 0 && (errno = 0, de = ctxs__readdir(dir))) {
        uint64_t id = file_id(de->d_name);
        if (id == 0) {
            if (remove_tmp && is_tmp_file(de->d_name))
                *removed += ctxs__aside_remove(st, hex16(de->d_name), de->d_name) == 1;
            continue;
        }
        if (n == cap) {
            size_t grown = cap ? cap * 2 : 64;
            uint64_t *bigger = ctxs__realloc(ids, grown * sizeof(*ids));
            if (!bigger) {
                rc = CTXS_ENOMEM;
                break;
            }
            ids = bigger;
            cap = grown;
        }
        ids[n++] = id;
    }
    if (rc == 0 && errno != 0)
        rc = -errno;
    closedir(dir);
    if (rc < 0) {
        free(ids);
        return rc;
    }
    *out = ids;
    *n_out = n;
    return 0;
}

static int is_indexed(ctxs_store *st, uint64_t id, int *out)
{
    MDB_txn *txn;
    int rc = ctxs__txn_begin(&txn, st, 1);
    if (rc < 0)
        return rc;
    uint8_t idk[8];
    ctxs__id_key(idk, id);
    MDB_val key = {8, idk}, val;
    rc = mdb_get(txn, st->ids, &key, &val);
    mdb_txn_abort(txn);
    if (rc != 0 && rc != MDB_NOTFOUND)
        return ctxs__mdb_error(rc);
    *out = rc == 0;
    return 0;
}

/* --- repair --------------------------------------------------------------- */

typedef struct file_facts file_facts;
static int read_facts(ctxs_store *st, uint64_t id, file_facts *f);
static int reindex_one(MDB_txn *txn, ctxs_store *st, uint64_t id, const file_facts *f);

/* New ids must stay above every file's: a create whose file name is taken
 * fails. */
static int raise_next_id(MDB_txn *txn, ctxs_store *st, uint64_t at_least)
{
    MDB_val key = {7, (void *)"next_id"}, val;
    uint64_t have = 0;
    if (mdb_get(txn, st->meta, &key, &val) == 0 && val.mv_size == 8)
        memcpy(&have, val.mv_data, 8);
    if (have >= at_least)
        return 0;
    val = (MDB_val){8, &at_least};
    return ctxs__mdb_error(ctxs__mdb_put(txn, st->meta, &key, &val, 0));
}

static int id_fill(void *entry, const MDB_val *key, const MDB_val *val)
{
    (void)val;
    if (key->mv_size != 8)
        return CTXS_EINDEX;
    *(uint64_t *)entry = ctxs__id_from_key(key->mv_data);
    return 0;
}

static int indexed_ids(ctxs_store *st, uint64_t **out, size_t *n_out)
{
    return ctxs__list((void **)out, n_out, st, st->ids, sizeof(**out), id_fill);
}

static int drop_dangling(ctxs_store *st, uint64_t id, uint64_t *removed)
{
    MDB_txn *txn;
    int rc = ctxs__txn_begin(&txn, st, 0);
    if (rc < 0)
        return rc;
    /* Look again inside the transaction: the file may have been created
     * between the stat and now only by a create, which indexes after. */
    char file[32];
    struct stat sb;
    ctxs__file_name(file, id);
    if (ctxs__fstatat(st->sessions_fd, file, &sb, AT_SYMLINK_NOFOLLOW) == 0 || errno != ENOENT) {
        mdb_txn_abort(txn);
        return 0;
    }
    /* ENOTFOUND: a delete elsewhere removed the entry meanwhile. */
    if ((rc = ctxs__session_unindex(txn, st, id)) < 0) {
        mdb_txn_abort(txn);
        return rc == CTXS_ENOTFOUND ? 0 : rc;
    }
    if ((rc = ctxs__txn_commit(txn)) == 0)
        (*removed)++;
    return rc;
}

/* Reads what the index needs from the file of id: its state, label and
 * leading token ids (malloc'd into *ids). */
struct file_facts {
    ctxs__peek p;
    char name[CTXS_NAME_MAX + 1];
    int named;          /* the label holds a valid name for this id */
    uint32_t *ids;
    uint64_t n_ids;
};

/* Whether rc, from read_facts(), says the file is no session this store
 * can index (foreign, damaged, newer, not a regular file, gone meanwhile),
 * rather than that reading it failed (-EIO, CTXS_ENOMEM, -EACCES, ...):
 * the first kind is left alone, the second stops the caller, which must
 * not rebuild or repair the index without a session it could not read. */
static bool not_a_session(int rc)
{
    return rc == CTXS_EFOREIGN || rc == CTXS_EVERSION || rc == CTXS_ECORRUPT ||
           rc == -EISDIR || rc == -ELOOP || rc == -ENOENT;
}

static int read_facts(ctxs_store *st, uint64_t id, file_facts *f)
{
    memset(f, 0, sizeof(*f));
    char file[32];
    ctxs__file_name(file, id);
    int fd = ctxs__openat(st->sessions_fd, file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return -errno;
    int rc = ctxs__peek_fd(&f->p, fd);
    uint64_t label_id;
    if (rc == 0 && (rc = ctxs__label_read(fd, &label_id, f->name)) < 0 &&
        (rc == CTXS_ENOTFOUND || rc == CTXS_ECORRUPT))
        rc = 0; /* no label, or a damaged one: the file keeps no name */
    if (rc == 0) {
        size_t len;
        f->named = f->name[0] && label_id == id && ctxs__name_check(f->name, &len) == 0;
        f->n_ids = ctxs__peek_prefix_held(&f->p);
        if (!(f->ids = ctxs__malloc(f->n_ids ? f->n_ids * 4 : 1)))
            rc = CTXS_ENOMEM;
        else
            rc = ctxs__peek_tokens(f->ids, fd, &f->p, 0, f->n_ids);
    }
    close(fd);
    if (rc < 0) {
        free(f->ids);
        f->ids = NULL;
    }
    return rc;
}

/* Brings the prefix entries of one session up to its file. */
static int refresh_prefixes(ctxs_store *st, uint64_t id, uint64_t *updated)
{
    file_facts f;
    int rc = read_facts(st, id, &f);
    if (rc < 0)
        return not_a_session(rc) ? 0 : rc; /* the first: reported by open, not here */
    MDB_txn *txn;
    rc = ctxs__txn_begin(&txn, st, 0);
    if (rc < 0) {
        free(f.ids);
        return rc;
    }
    uint8_t idk[8];
    ctxs__id_key(idk, id);
    MDB_val key = {8, idk}, val;
    ctxs__session_rec rec;
    int changed = 0;
    if (mdb_get(txn, st->ids, &key, &val) == 0 && val.mv_size <= CTXS_NAME_MAX &&
        ctxs__session_get(&rec, txn, st, val.mv_data, val.mv_size) == 0 && rec.id == id) {
        char name[CTXS_NAME_MAX + 1];
        size_t len = val.mv_size;
        memcpy(name, val.mv_data, len);
        ctxs__session_rec before = rec;
        MDB_val skey = {len, name}, sval = {sizeof(rec), &rec};
        if ((rc = ctxs__prefix_update(txn, st, id, &rec, f.ids, f.n_ids)) == 0 &&
            memcmp(&before, &rec, sizeof(rec)) != 0) {
            changed = 1;
            rc = ctxs__mdb_error(ctxs__mdb_put(txn, st->sessions, &skey, &sval, 0));
        }
    }
    free(f.ids);
    if (rc < 0 || !changed) {
        mdb_txn_abort(txn);
        return rc;
    }
    if ((rc = ctxs__txn_commit(txn)) == 0)
        (*updated)++;
    return rc;
}

/* Indexes the file of id, which no entry names, unless a handle has it open
 * (a create in progress holds its lock until its entry is committed). */
static int adopt_orphan(ctxs_store *st, uint64_t id, uint64_t *adopted)
{
    char file[32];
    ctxs__file_name(file, id);
    int fd = ctxs__openat(st->sessions_fd, file, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return errno == ENOENT ? 0 : -errno;
    int rc = ctxs__lock(fd, CTXS__LOCK_EXCLUSIVE);
    file_facts f;
    if (rc == 0 && (rc = read_facts(st, id, &f)) < 0 && not_a_session(rc)) {
        rc = 0; /* left alone: repair never deletes a file it cannot read */
    } else if (rc == 0) {
        MDB_txn *txn;
        if ((rc = ctxs__txn_begin(&txn, st, 0)) == 0) {
            uint8_t idk[8];
            ctxs__id_key(idk, id);
            MDB_val key = {8, idk}, val;
            if (mdb_get(txn, st->ids, &key, &val) == 0) {
                mdb_txn_abort(txn); /* indexed meanwhile */
            } else if ((rc = reindex_one(txn, st, id, &f)) < 0 ||
                       (rc = raise_next_id(txn, st, id + 1)) < 0) {
                mdb_txn_abort(txn);
            } else if ((rc = ctxs__txn_commit(txn)) == 0) {
                (*adopted)++;
            }
        }
        free(f.ids);
    }
    close(fd);
    return rc == CTXS_EBUSY ? 0 : rc;
}

int ctxs_store_repair(ctxs_repair_result *out, ctxs_store *st)
{
    ctxs_repair_result res;
    memset(&res, 0, sizeof(res));
    if (out)
        *out = res;
    if (!st)
        return CTXS_EINVAL;
    if (st->rdonly)
        return CTXS_EREADONLY;
    uint64_t *files = NULL, *ids = NULL;
    size_t n_files, n_ids;
    int rc = list_files(st, &files, &n_files, 1, &res.files_removed);
    if (rc < 0)
        return rc;
    for (size_t i = 0; rc == 0 && i < n_files; i++) {
        int indexed = 1;
        if ((rc = is_indexed(st, files[i], &indexed)) == 0 && !indexed)
            rc = adopt_orphan(st, files[i], &res.files_adopted);
    }
    free(files);
    if (rc == 0)
        rc = indexed_ids(st, &ids, &n_ids);
    if (rc < 0)
        return rc;
    for (size_t i = 0; rc == 0 && i < n_ids; i++) {
        char file[32];
        struct stat sb;
        ctxs__file_name(file, ids[i]);
        if (ctxs__fstatat(st->sessions_fd, file, &sb, AT_SYMLINK_NOFOLLOW) != 0 && errno == ENOENT)
            rc = drop_dangling(st, ids[i], &res.entries_removed);
        else
            rc = refresh_prefixes(st, ids[i], &res.prefixes_updated);
    }
    free(ids);
    if (out)
        *out = res;
    return rc;
}

/* --- reindex ------------------------------------------------------------- */

/* Drops the rows of dbi (keyed by an id, then at least key_rest bytes)
 * whose id is not among ids[0..n), sorted: checkpoints and pins outlive a
 * rebuild only with their session. */
static int drop_rows_of_absent(MDB_txn *txn, MDB_dbi dbi, size_t key_rest, const uint64_t *ids,
                               size_t n)
{
    MDB_cursor *cur;
    int rc = ctxs__mdb_cursor_open(txn, dbi, &cur);
    if (rc != 0)
        return ctxs__mdb_error(rc);
    MDB_val key, val;
    size_t at = 0;
    for (rc = mdb_cursor_get(cur, &key, &val, MDB_FIRST); rc == 0;) {
        uint64_t id = key.mv_size >= 8 + key_rest ? ctxs__id_from_key(key.mv_data) : 0;
        while (at < n && ids[at] < id)
            at++;
        if (at < n && ids[at] == id) {
            rc = mdb_cursor_get(cur, &key, &val, MDB_NEXT);
        } else if ((rc = ctxs__mdb_cursor_del(cur, 0)) == 0) {
            rc = mdb_cursor_get(cur, &key, &val, MDB_NEXT);
        }
    }
    mdb_cursor_close(cur);
    return rc == MDB_NOTFOUND ? 0 : ctxs__mdb_error(rc);
}

static int cmp_id(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Indexes the file of id in txn (a rebuild in progress). */
static int reindex_one(MDB_txn *txn, ctxs_store *st, uint64_t id, const file_facts *f)
{
    char fallback[32];
    const char *name = f->name;
    size_t len = f->named ? strlen(f->name) : 0;
    ctxs__session_rec rec;
    if (!f->named || ctxs__session_get(&rec, txn, st, name, len) != CTXS_ENOTFOUND) {
        snprintf(fallback, sizeof(fallback), "session-%016llx", (unsigned long long)id);
        name = fallback;
        len = strlen(fallback);
    }
    memset(&rec, 0, sizeof(rec));
    rec.id = id;
    memcpy(rec.model_hash, f->p.model.model_hash, 16);
    rec.n_tokens = f->p.st.n_tokens;
    rec.disk_bytes = f->p.disk_bytes;
    rec.created_unix_ms = f->p.created_unix_ms;
    rec.last_used_unix_ms = f->p.written_unix_ms;
    int rc = ctxs__model_ensure(txn, st, &f->p.model);
    if (rc == CTXS_EMODEL)
        rc = 0; /* the registration stands; opening with the file's model fails */
    if (rc == 0)
        rc = ctxs__prefix_update(txn, st, id, &rec, f->ids, f->n_ids);
    MDB_val key = {len, (void *)name}, val = {sizeof(rec), &rec};
    uint8_t idk[8];
    ctxs__id_key(idk, id);
    MDB_val ikey = {8, idk}, ival = {len, (void *)name};
    if (rc == 0 && (rc = ctxs__mdb_put(txn, st->sessions, &key, &val, 0)) == 0)
        rc = ctxs__mdb_put(txn, st->ids, &ikey, &ival, 0);
    return rc > 0 ? ctxs__mdb_error(rc) : rc;
}

int ctxs_store_reindex(ctxs_reindex_result *out, ctxs_store *st)
{
    ctxs_reindex_result res;
    memset(&res, 0, sizeof(res));
    if (out)
        *out = res;
    if (!st)
        return CTXS_EINVAL;
    if (st->rdonly)
        return CTXS_EREADONLY;
    uint64_t *ids, removed = 0;
    size_t n;
    int rc = list_files(st, &ids, &n, 0, &removed);
    if (rc < 0)
        return rc;
    if (n)
        qsort(ids, n, sizeof(*ids), cmp_id);
    file_facts *facts = n ? ctxs__calloc(n, sizeof(*facts)) : NULL;
    if (n && !facts) {
        free(ids);
        return CTXS_ENOMEM;
    }
    /* Read every file before the write transaction, which serializes all
     * writers of the store. */
    size_t kept = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        if ((rc = read_facts(st, ids[i], &facts[kept])) < 0 && not_a_session(rc)) {
            res.skipped++;
            rc = 0;
        } else if (rc == 0) {
            ids[kept++] = ids[i];
        }
    }
    MDB_txn *txn;
    if (rc == 0 && (rc = ctxs__txn_begin(&txn, st, 0)) == 0) {
        MDB_dbi rebuilt[] = {st->sessions, st->ids, st->prefixes, st->chunks, st->pending};
        for (size_t i = 0; rc == 0 && i < sizeof(rebuilt) / sizeof(rebuilt[0]); i++)
            rc = ctxs__mdb_error(ctxs__mdb_drop(txn, rebuilt[i], 0));
        if (rc == 0)
            rc = drop_rows_of_absent(txn, st->checkpoints, 1, ids, kept);
        if (rc == 0)
            rc = drop_rows_of_absent(txn, st->metadata, 1, ids, kept);
        if (rc == 0)
            rc = drop_rows_of_absent(txn, st->pins, 0, ids, kept);
        for (size_t i = 0; rc == 0 && i < kept; i++)
            rc = reindex_one(txn, st, ids[i], &facts[i]);
        if (rc == 0 && kept)
            rc = raise_next_id(txn, st, ids[kept - 1] + 1);
        rc = ctxs__txn_finish(txn, rc);
    }
    for (size_t i = 0; i < kept; i++)
        free(facts[i].ids);
    free(facts);
    free(ids);
    res.sessions = rc == 0 ? kept : 0;
    if (out)
        *out = res;
    return rc;
}
