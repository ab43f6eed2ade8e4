/*
 * Keeping the store in shape: gc to a size budget, repairing what people
 * and crashes did to files and index, rebuilding the index from the
 * files, and compaction.
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
#include "internal.h"
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
    int dfd = ctxs__dup(st->sessions_fd);
    DIR *dir = dfd >= 0 ? ctxs__fdopendir(dfd) : NULL;
    if (!dir) {
        int rc = -errno;
        if (dfd >= 0)
            close(dfd);
        return rc;
    }
    rewinddir(dir);
    uint64_t *ids = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
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

/* --- gc ------------------------------------------------------------------ */

typedef struct gc_item {
    uint64_t id, last_used, bytes;
    const char *name;
} gc_item;

static int by_last_use(const void *a, const void *b)
{
    const gc_item *x = a, *y = b;
    if (x->last_used != y->last_used)
        return x->last_used < y->last_used ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

int ctxs_store_gc(ctxs_gc_result *out, ctxs_store *st, uint64_t budget_bytes)
{
    ctxs_gc_result res;
    memset(&res, 0, sizeof(res));
    if (out)
        *out = res;
    if (!st)
        return CTXS_EINVAL;
    ctxs_session_entry *list;
    size_t n;
    int rc = ctxs_store_session_list(&list, &n, st);
    if (rc < 0)
        return rc;
    gc_item *items = n ? ctxs__calloc(n, sizeof(*items)) : NULL;
    if (n && !items) {
        free(list);
        return CTXS_ENOMEM;
    }
    for (size_t i = 0; rc == 0 && i < n; i++) {
        char file[32];
        struct stat sb;
        ctxs__file_name(file, list[i].id);
        items[i] = (gc_item){list[i].id, list[i].last_used_unix_ms, 0, list[i].name};
        /* A size that cannot be read would be taken for 0 bytes: gc would
         * report success and free nothing. (ENOENT: deleted meanwhile.) */
        if (ctxs__fstatat(st->sessions_fd, file, &sb, AT_SYMLINK_NOFOLLOW) == 0)
            items[i].bytes = (uint64_t)sb.st_blocks * 512u;
        else if (errno != ENOENT)
            rc = -errno;
        res.bytes_before += items[i].bytes;
    }
    if (rc < 0) {
        free(items);
        free(list);
        return rc;
    }
    if (n)
        qsort(items, n, sizeof(*items), by_last_use);
    res.bytes_after = res.bytes_before;
    for (size_t i = 0; rc == 0 && i < n && res.bytes_after > budget_bytes; i++) {
        int r = ctxs__session_delete_id(st, items[i].id, items[i].name, strlen(items[i].name));
        if (r == CTXS_EBUSY) {
            res.skipped_open++;
        } else if (r == 0 || r == CTXS_ENOTFOUND) { /* or deleted meanwhile */
            res.deleted += r == 0;
            res.bytes_after -= items[i].bytes;
        } else {
            rc = r;
        }
    }
    free(items);
    free(list);
    if (out)
        *out = res;
    return rc;
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
        return CTXS_ECORRUPT;
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

static int drop_checkpoints_of_absent(MDB_txn *txn, ctxs_store *st, const uint64_t *ids,
                                      size_t n)
{
    MDB_cursor *cur;
    int rc = ctxs__mdb_cursor_open(txn, st->checkpoints, &cur);
    if (rc != 0)
        return ctxs__mdb_error(rc);
    MDB_val key, val;
    size_t at = 0;
    for (rc = mdb_cursor_get(cur, &key, &val, MDB_FIRST); rc == 0;) {
        uint64_t id = key.mv_size > 8 ? ctxs__id_from_key(key.mv_data) : 0;
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
            rc = drop_checkpoints_of_absent(txn, st, ids, kept);
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

/* --- compact --------------------------------------------------------------- */

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
static int compact_one(ctxs_compact_result *res, ctxs_store *st, uint64_t id, const char *name,
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

/* Sessions (id, model) that own rows in the other tables, sorted by id. */
typedef struct owner {
    uint64_t id;
    uint8_t model_hash[CTXS_HASH_BYTES];
} owner;

static int by_owner_id(const void *a, const void *b)
{
    return cmp_id(&((const owner *)a)->id, &((const owner *)b)->id);
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

/* The weights-hash cache is keyed by (device, inode, size, mtime); a file
 * is in one state at a time, so of the rows of one (device, inode) all but
 * one are stale: the newest is kept. Rows of files that are gone cannot be
 * told from the rest without their paths and stay (a row costs 56 bytes). */
static int drop_stale_filehash(MDB_txn *txn, ctxs_store *st, uint64_t *removed)
{
    MDB_cursor *cur;
    int rc = ctxs__mdb_cursor_open(txn, st->filehash, &cur);
    if (rc != 0)
        return ctxs__mdb_error(rc);
    MDB_val key, val;
    ctxs__filehash_key best;
    int have = 0;
    /* Rows of one (device, inode) are adjacent: the key starts with them. */
    for (int op = MDB_FIRST; (rc = mdb_cursor_get(cur, &key, &val, op)) == 0; op = MDB_NEXT) {
        ctxs__filehash_key k;
        if (key.mv_size != sizeof(k) || val.mv_size != 16) {
            if ((rc = drop_here(cur, removed)) != 0)
                break;
            continue;
        }
        memcpy(&k, key.mv_data, sizeof(k));
        if (!have || k.dev != best.dev || k.ino != best.ino) {
            best = k;
            have = 1;
            continue;
        }
        /* A second state of the same file: drop the older of the two. */
        if (newer_state(&k, &best)) {
            MDB_val old = {sizeof(best), &best};
            ctxs__filehash_key now = k;
            if ((rc = ctxs__mdb_del(txn, st->filehash, &old, NULL)) != 0)
                break;
            (*removed)++;
            best = now;
            /* The cursor is not moved by deleting another key's row: look
             * the current one up again to go on from it. */
            MDB_val here = {sizeof(best), &best};
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
    MDB_txn *txn;
    int rc = ctxs__txn_begin(&txn, st, 0);
    if (rc < 0)
        return rc;
    owner *own = NULL;
    size_t n = 0;
    uint64_t count = 0;
    if ((rc = mend_names(txn, st, &own, &n, &count)) == 0 &&
        (rc = drop_unowned(txn, st->checkpoints, SIZE_MAX, own, n, &count)) == 0 &&
        (rc = drop_unowned(txn, st->chunks, 4, own, n, &count)) == 0 &&
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
static int compact_all(ctxs_compact_result *res, ctxs_store *st, ctxs_progress_fn progress,
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
    ctxs_repair_result rr;
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

int ctxs_store_compact(ctxs_compact_result *out, ctxs_store *st, const char *name,
                       ctxs_progress_fn progress, void *progress_arg)
{
    ctxs_compact_result res;
    memset(&res, 0, sizeof(res));
    if (out)
        *out = res;
    size_t len = 0;
    if (!st || (name && ctxs__name_check(name, &len) < 0))
        return CTXS_EINVAL;
    int rc;
    if (name) {
        ctxs_session_entry e;
        if ((rc = ctxs_store_session_get(&e, st, name)) == 0 &&
            (rc = compact_one(&res, st, e.id, name, len)) == 0)
            report(progress, progress_arg, 1, 1);
    } else {
        rc = compact_all(&res, st, progress, progress_arg);
    }
    if (out)
        *out = res;
    return rc;
}
