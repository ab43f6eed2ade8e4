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

#include "index.h"
#include "lock.h"
#include "mdb_calls.h"
#include "session_iface.h"

/* Reads 16 lowercase hex digits into *out; 0 if name does not start with
 * them. */
static int hex16_ok(const char *name, uint64_t *out)
{
    uint64_t id = 0;
    for (int i = 0; i < 16; i++) {
        char c = name[i];
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (v < 0)
            return 0;
        id = id << 4 | (uint64_t)v;
    }
    *out = id;
    return 1;
}

/* The id, 0 if name does not start with 16 hex digits. */
static uint64_t hex16(const char *name)
{
    uint64_t id = 0;
    return hex16_ok(name, &id) ? id : 0;
}

/* The id of a file named exactly "<id as 16 hex digits>.ctxs" with an id a
 * store hands out (1..CTXS__ID_MAX), or 0. */
static uint64_t file_id(const char *name)
{
    uint64_t id = hex16(name);
    return id && id <= CTXS__ID_MAX && strcmp(name + 16, ".ctxs") == 0 ? id : 0;
}

int ctxs__file_name_id(const char *name, uint64_t *id)
{
    return hex16_ok(name, id) && strcmp(name + 16, ".ctxs") == 0;
}

/* 1 if name is a session file's name with an id no store hands out: 0
 * (an index whose next_id was 0 handed it out) or above CTXS__ID_MAX (one
 * that wrapped, or a file named by hand). *id gets it. */
static int misnumbered(const char *name, uint64_t *id)
{
    return ctxs__file_name_id(name, id) && (*id == 0 || *id > CTXS__ID_MAX);
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
        if ((rc = ctxs__array_room((void **)&ids, &cap, n, sizeof(*ids), 64)) < 0)
            break;
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
 * fails. (ctxs__next_id_repair also mends a damaged next_id.) */
static int raise_next_id(MDB_txn *txn, ctxs_store *st, uint64_t at_least)
{
    return ctxs__next_id_repair(txn, st, at_least, NULL);
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

/* Whether the session file of id is gone from sessions/. */
static int file_missing(const ctxs_store *st, uint64_t id)
{
    char file[32];
    struct stat sb;
    ctxs__file_name(file, id);
    return ctxs__fstatat(st->sessions_fd, file, &sb, AT_SYMLINK_NOFOLLOW) != 0 && errno == ENOENT;
}

static int drop_dangling(ctxs_store *st, uint64_t id, uint64_t *removed)
{
    MDB_txn *txn;
    int rc = ctxs__txn_begin(&txn, st, 0);
    if (rc < 0)
        return rc;
    /* Look again inside the transaction: the file may have been created
     * between the stat and now only by a create, which indexes after. */
    if (!file_missing(st, id)) {
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
    int named;          /* the label holds a valid name */
    int own;            /* ... and this id: the file was not copied in
                           under another id */
    int moved;          /* the label names another id: rewritten when the
                           file is indexed */
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
    uint64_t label_id = 0;
    int labelled = 0;
    if (rc == 0) {
        rc = ctxs__label_read(fd, &label_id, f->name);
        labelled = rc == 0;
        if (rc == CTXS_ENOTFOUND || rc == CTXS_ECORRUPT)
            rc = 0; /* no label, or a damaged one: the file keeps no name */
    }
    if (rc == 0) {
        size_t len;
        f->named = f->name[0] && ctxs__name_check(f->name, &len) == 0;
        f->own = f->named && label_id == id;
        f->moved = labelled && label_id != id;
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

/* The name under which the index holds session id (ids[id], whose
 * session row names id back): its length, the name NUL-terminated into
 * name and the row into *rec; 0, name untouched, when it holds none. */
static size_t indexed_name(char name[CTXS_NAME_MAX + 1], ctxs__session_rec *rec, MDB_txn *txn,
                           ctxs_store *st, uint64_t id)
{
    uint8_t idk[8];
    ctxs__id_key(idk, id);
    MDB_val key = {8, idk}, val;
    if (mdb_get(txn, st->ids, &key, &val) != 0 || val.mv_size < 1 ||
        val.mv_size > CTXS_NAME_MAX ||
        ctxs__session_get(rec, txn, st, val.mv_data, val.mv_size) != 0 || rec->id != id)
        return 0;
    memcpy(name, val.mv_data, val.mv_size);
    name[val.mv_size] = '\0';
    return val.mv_size;
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
    ctxs__session_rec rec;
    char name[CTXS_NAME_MAX + 1];
    size_t len = indexed_name(name, &rec, txn, st, id);
    int changed = 0;
    if (len) {
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

/* --- files whose id no store hands out ------------------------------------ */

/* Moves the rows of dbi whose key starts with id `from` to id `to`, in
 * txn. Collected first: a put under an open cursor of the same table would
 * move it. */
static int move_rows(MDB_txn *txn, MDB_dbi dbi, uint64_t from, uint64_t to)
{
    if (!dbi)
        return 0;
    MDB_cursor *cur;
    int rc = ctxs__mdb_cursor_open(txn, dbi, &cur);
    if (rc != 0)
        return ctxs__mdb_error(rc);
    typedef struct row { MDB_val k, v; } row;
    row *rows = NULL;
    size_t n = 0, cap = 0;
    uint8_t start[8];
    ctxs__id_key(start, from);
    MDB_val key = {8, start}, val;
    for (rc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE); rc == 0;
         rc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
        if (key.mv_size < 8 || ctxs__id_from_key(key.mv_data) != from)
            break;
        if ((rc = ctxs__array_room((void **)&rows, &cap, n, sizeof(*rows), 16)) < 0)
            break;
        uint8_t *copy = ctxs__malloc(key.mv_size + val.mv_size + 1);
        if (!copy) {
            rc = CTXS_ENOMEM;
            break;
        }
        memcpy(copy, key.mv_data, key.mv_size);
        memcpy(copy + key.mv_size, val.mv_data, val.mv_size);
        rows[n++] = (row){{key.mv_size, copy}, {val.mv_size, copy + key.mv_size}};
    }
    mdb_cursor_close(cur);
    rc = rc == 0 || rc == MDB_NOTFOUND ? 0 : rc < 0 ? rc : ctxs__mdb_error(rc);
    for (size_t i = 0; i < n; i++) {
        if (rc == 0)
            rc = ctxs__mdb_error(ctxs__mdb_del(txn, dbi, &rows[i].k, NULL));
        if (rc == 0) {
            ctxs__id_key(rows[i].k.mv_data, to);
            rc = ctxs__mdb_error(ctxs__mdb_put(txn, dbi, &rows[i].k, &rows[i].v, 0));
        }
        free(rows[i].k.mv_data);
    }
    free(rows);
    return rc;
}

/* Gives the session file `fname` (id `old`, 0 or above CTXS__ID_MAX) a new
 * id: its label first (durable), then the new name linked to it, its index
 * rows moved, next_id raised, in one transaction, then the old name
 * unlinked. A run cut short after the link leaves the file under both
 * names with a label naming the new id: the next run finds it so and only
 * finishes the move. Files that are no readable session, and files a
 * handle has open, are left as they are. Sets *done to 1 when renumbered. */
static int renumber_one(ctxs_store *st, const char *fname, uint64_t old, int *done)
{
    *done = 0;
    int fd = ctxs__openat(st->sessions_fd, fname, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return errno == ENOENT || errno == ELOOP || errno == EISDIR ? 0 : -errno;
    ctxs__peek p;
    struct stat me;
    int rc = ctxs__lock(fd, CTXS__LOCK_EXCLUSIVE);
    if (rc == 0 && (rc = ctxs__peek_fd(&p, fd)) == 0 && ctxs__fstat(fd, &me) != 0)
        rc = -errno;
    if (rc == CTXS_EBUSY || not_a_session(rc)) {
        close(fd);
        return 0;
    }
    uint64_t label_id = 0;
    char name[CTXS_NAME_MAX + 1];
    size_t len = 0;
    if (rc == 0 && (ctxs__label_read(fd, &label_id, name) < 0 || ctxs__name_check(name, &len) < 0))
        name[0] = '\0', len = 0, label_id = 0;

    MDB_txn *txn;
    if (rc < 0 || (rc = ctxs__txn_begin(&txn, st, 0)) < 0) {
        close(fd);
        return rc;
    }
    /* The index's entry under the old id, if any: its name wins. */
    uint8_t idk[8];
    ctxs__id_key(idk, old);
    MDB_val key = {8, idk};
    ctxs__session_rec rec;
    size_t got = indexed_name(name, &rec, txn, st, old);
    int indexed = got > 0;
    if (indexed)
        len = got;
    uint64_t to = 0;
    char to_name[32];
    struct stat there;
    if (label_id && label_id <= CTXS__ID_MAX) {
        ctxs__file_name(to_name, label_id);
        if (ctxs__fstatat(st->sessions_fd, to_name, &there, AT_SYMLINK_NOFOLLOW) == 0 &&
            there.st_dev == me.st_dev && there.st_ino == me.st_ino)
            to = label_id; /* linked by a run cut short */
    }
    int linked = 0;
    if (to) {
        rc = raise_next_id(txn, st, to + 1);
    } else if ((rc = ctxs__id_take(txn, st, &to)) == 0) {
        ctxs__file_name(to_name, to);
        if (!len)
            len = (size_t)snprintf(name, sizeof(name), "session-%016llx", (unsigned long long)to);
        if ((rc = ctxs__label_write(fd, to, name, len)) == 0) {
            if (ctxs__linkat(st->sessions_fd, fname, st->sessions_fd, to_name, 0) == 0)
                linked = 1;
            else
                rc = -errno;
        }
    }
    if (rc == 0 && indexed) {
        MDB_val skey = {len, name}, sval = {sizeof(rec), &rec};
        /* Prefix entries go (repair and reindex write them again from the
         * file); everything else follows the session to its new id. */
        rc = ctxs__prefix_drop(txn, st, old, rec.model_hash);
        rec.id = to;
        rec.prefix_tokens = 0;
        memset(rec.prefix_chain, 0, sizeof(rec.prefix_chain));
        MDB_dbi moved[] = {st->ids, st->checkpoints, st->metadata, st->pins};
        for (size_t i = 0; rc == 0 && i < sizeof(moved) / sizeof(moved[0]); i++)
            rc = move_rows(txn, moved[i], old, to);
        if (rc == 0)
            rc = ctxs__mdb_error(ctxs__mdb_put(txn, st->sessions, &skey, &sval, 0));
    }
    if (rc == 0) {
        int r = ctxs__mdb_del(txn, st->pending, &key, NULL);
        rc = r == MDB_NOTFOUND ? 0 : ctxs__mdb_error(r);
    }
    rc = ctxs__txn_finish(txn, rc);
    if (rc == 0) {
        if (ctxs__unlinkat(st->sessions_fd, fname, 0) != 0 && errno != ENOENT)
            rc = -errno;
        else if (ctxs__fsync(st->sessions_fd) != 0)
            rc = -errno;
        *done = rc == 0;
    } else if (linked) {
        ctxs__unlinkat(st->sessions_fd, to_name, 0);
    }
    close(fd);
    return rc;
}

/* Renumbers every session file whose name carries an id no store hands
 * out (0, or above CTXS__ID_MAX), so that repair and reindex see it under
 * a real id: they would otherwise skip it, and verify would go on naming
 * it as a file the index does not know. */
static int renumber_misnumbered(ctxs_store *st, uint64_t *renumbered)
{
    DIR *dir;
    int rc = ctxs__sessions_dir_open(&dir, st);
    if (rc < 0)
        return rc;
    rewinddir(dir);
    char (*names)[32] = NULL;
    uint64_t *olds = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while (rc == 0 && (errno = 0, de = ctxs__readdir(dir))) {
        uint64_t id;
        if (strlen(de->d_name) != 21 || !misnumbered(de->d_name, &id))
            continue;
        if (n == cap) {
            size_t grown = cap ? cap * 2 : 4;
            char (*bn)[32] = ctxs__realloc(names, grown * sizeof(*names));
            if (bn)
                names = bn;
            uint64_t *bo = bn ? ctxs__realloc(olds, grown * sizeof(*olds)) : NULL;
            if (!bo) {
                rc = CTXS_ENOMEM;
                break;
            }
            olds = bo, cap = grown;
        }
        memcpy(names[n], de->d_name, 22);
        olds[n++] = id;
    }
    if (rc == 0 && errno != 0)
        rc = -errno;
    closedir(dir);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        int done;
        if ((rc = renumber_one(st, names[i], olds[i], &done)) == 0 && renumbered)
            *renumbered += (uint64_t)done;
    }
    free(names);
    free(olds);
    return rc;
}

/* Mends next_id (0, past the range, or not above an id in use). */
/* meta["next_id"] as ctxs__next_id_repair reads it: 1 when missing (a
 * store that never made a session), 0 when of another size (damage). */
static int next_id_value(MDB_txn *txn, ctxs_store *st, uint64_t *out)
{
    MDB_val key = {7, (void *)"next_id"}, val;
    int rc = mdb_get(txn, st->meta, &key, &val);
    *out = rc == MDB_NOTFOUND ? 1 : 0;
    if (rc == 0 && val.mv_size == 8)
        memcpy(out, val.mv_data, 8);
    return rc == 0 || rc == MDB_NOTFOUND ? 0 : ctxs__mdb_error(rc);
}

/* raise_next_id(), and what it did for the result: *mended set to 1 and
 * *was to the value before when it changed next_id, *now to the value
 * after. */
static int raise_next_id_said(MDB_txn *txn, ctxs_store *st, uint64_t at_least, uint64_t *was,
                              uint64_t *mended, uint64_t *now)
{
    uint64_t before;
    int rc = next_id_value(txn, st, &before);
    if (rc == 0)
        rc = ctxs__next_id_repair(txn, st, at_least, now);
    if (rc == 0 && *now != before && !*mended) {
        *mended = 1;
        *was = before;
    }
    return rc;
}

static int mend_next_id(ctxs_store *st, uint64_t *was, uint64_t *mended, uint64_t *now)
{
    MDB_txn *txn;
    int rc = ctxs__txn_begin(&txn, st, 0);
    if (rc < 0)
        return rc;
    return ctxs__txn_finish(txn, raise_next_id_said(txn, st, 1, was, mended, now));
}

/* The next id once repair is done, for its result. */
static int next_id_now(ctxs_store *st, uint64_t *out)
{
    MDB_txn *txn;
    int rc = ctxs__txn_begin(&txn, st, 1);
    if (rc < 0)
        return rc;
    rc = next_id_value(txn, st, out);
    mdb_txn_abort(txn);
    return rc;
}

/* How repair and reindex start: their result zeroed (*out too, if given,
 * so that it says nothing on failure), the store checked writable, then
 * the ids mended: next_id above every file's, a file named with id 0 (or
 * past the range) renumbered, so that it is then adopted, refreshed or
 * indexed as any other; skipped, it would stay a file that verify names
 * and nothing adopts. */
static int begin(void *res, void *out, size_t size, ctxs_store *st, uint64_t *next_id_was,
                 uint64_t *next_id_mended, uint64_t *next_id, uint64_t *renumbered)
{
    ctxs__error_begin();
    memset(res, 0, size);
    if (out)
        memset(out, 0, size);
    if (!st)
        return CTXS_EINVAL;
    if (st->rdonly)
        return ctxs__store_readonly();
    int rc = mend_next_id(st, next_id_was, next_id_mended, next_id);
    return rc == 0 ? renumber_misnumbered(st, renumbered) : rc;
}

int ctxs_store_repair(ctxs_store_repair_result *out, ctxs_store *st)
{
    ctxs_store_repair_result res;
    uint64_t *files = NULL, *ids = NULL;
    size_t n_files, n_ids;
    int rc = begin(&res, out, sizeof(res), st, &res.next_id_was, &res.next_id_mended,
                   &res.next_id, &res.files_renumbered);
    if (rc == 0)
        rc = list_files(st, &files, &n_files, 1, &res.files_removed);
    /* Entries whose file is gone go before files are adopted: a file
     * restored under another id then finds its name free. */
    if (rc == 0)
        rc = indexed_ids(st, &ids, &n_ids);
    for (size_t i = 0; rc == 0 && i < n_ids; i++)
        if (file_missing(st, ids[i]))
            rc = drop_dangling(st, ids[i], &res.entries_removed);
    free(ids);
    ids = NULL;
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
    for (size_t i = 0; rc == 0 && i < n_ids; i++)
        rc = file_missing(st, ids[i]) ? drop_dangling(st, ids[i], &res.entries_removed)
                                      : refresh_prefixes(st, ids[i], &res.prefixes_updated);
    free(ids);
    if (rc == 0)
        rc = next_id_now(st, &res.next_id);
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

/* Makes the label of the file of id name id and name (len bytes). */
static int relabel(ctxs_store *st, uint64_t id, const char *name, size_t len)
{
    char file[32];
    ctxs__file_name(file, id);
    int fd = ctxs__openat(st->sessions_fd, file, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return -errno;
    int rc = ctxs__label_write(fd, id, name, len);
    close(fd);
    return rc;
}

/* Indexes the file of id in txn (a rebuild in progress), under the name
 * its label gives when that name is free, else "session-<id>". A file
 * copied in by hand under another id (a backup restored beside the
 * session it came from, say) keeps its label's name where nothing else
 * holds it; its label is rewritten to name the id and name it is indexed
 * under, before the index names it, so that the label and the index agree
 * (verify compares them) and a later rebuild finds the same name. */
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
    int rc = f->moved ? relabel(st, id, name, len) : 0;
    if (rc == 0)
        rc = ctxs__model_ensure(txn, st, &f->p.model);
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

int ctxs_store_reindex(ctxs_store_reindex_result *out, ctxs_store *st)
{
    ctxs_store_reindex_result res;
    uint64_t *ids = NULL, removed = 0;
    size_t n = 0;
    int rc = begin(&res, out, sizeof(res), st, &res.next_id_was, &res.next_id_mended,
                   &res.next_id, &res.files_renumbered);
    if (rc == 0)
        rc = list_files(st, &ids, &n, 0, &removed);
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
        /* Files whose label names their own id first: a copy of one
         * under another id must not take its name. */
        for (int own = 1; own >= 0; own--)
            for (size_t i = 0; rc == 0 && i < kept; i++)
                if (facts[i].own == own)
                    rc = reindex_one(txn, st, ids[i], &facts[i]);
        if (rc == 0)
            rc = raise_next_id_said(txn, st, kept ? ids[kept - 1] + 1 : 1, &res.next_id_was,
                                    &res.next_id_mended, &res.next_id);
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
