/*
 * What an app keeps beside a conversation's tokens (a title, the chat
 * template, sampler settings, its own JSON): a small map per session, in
 * the index under the session's id, so that a rename keeps it and a
 * delete, gc or repair that drops the session drops it in the same
 * transaction.
 *
 * Every write looks the session up and checks the session's total in the
 * transaction that writes: LMDB serializes writers, so no row can outlive
 * its session and no two writers can together pass the limit.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "index.h"
#include "mdb_calls.h"
#include "syscall.h"

static size_t meta_key(uint8_t out[8 + CTXS_NAME_MAX], uint64_t id, const char *key, size_t len)
{
    ctxs__id_key(out, id);
    memcpy(out + 8, key, len);
    return 8 + len;
}

/* Calls fn for every row of session id, in key order, until it returns
 * nonzero (which is returned) or the rows end (0). */
typedef int (*row_fn)(void *arg, MDB_cursor *cur, const MDB_val *key, const MDB_val *val);

static int each_row(MDB_txn *txn, ctxs_store *st, uint64_t id, row_fn fn, void *arg)
{
    if (!st->metadata)
        return 0; /* a read-only handle to an index from before 1.2 */
    MDB_cursor *cur;
    int rc = ctxs__mdb_cursor_open(txn, st->metadata, &cur);
    if (rc != 0)
        return ctxs__mdb_error(rc);
    uint8_t idk[8];
    ctxs__id_key(idk, id);
    MDB_val key = {8, idk}, val;
    int r = 0;
    for (rc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE); rc == 0 && r == 0;
         rc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
        if (key.mv_size < 8 || memcmp(key.mv_data, idk, 8) != 0)
            break;
        if (key.mv_size == 8 || key.mv_size > 8 + CTXS_NAME_MAX ||
            val.mv_size > CTXS_META_VALUE_MAX) {
            r = CTXS_EINDEX;
            break;
        }
        r = fn(arg, cur, &key, &val);
    }
    mdb_cursor_close(cur);
    if (r != 0)
        return r;
    return rc == 0 || rc == MDB_NOTFOUND ? 0 : ctxs__mdb_error(rc);
}

static int drop_row(void *arg, MDB_cursor *cur, const MDB_val *key, const MDB_val *val)
{
    (void)arg, (void)key, (void)val;
    int rc = ctxs__mdb_cursor_del(cur, 0);
    return rc == 0 ? 0 : ctxs__mdb_error(rc);
}

int ctxs__meta_drop(MDB_txn *txn, ctxs_store *st, uint64_t id)
{
    return each_row(txn, st, id, drop_row, NULL);
}

int ctxs__meta_put_all(MDB_txn *txn, ctxs_store *st, uint64_t id, const ctxs__meta_item *items,
                       size_t n)
{
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        uint8_t k[8 + CTXS_NAME_MAX];
        MDB_val key = {meta_key(k, id, items[i].key, items[i].key_len), k};
        MDB_val val = {items[i].value_bytes, (void *)items[i].value};
        rc = ctxs__mdb_error(ctxs__mdb_put(txn, st->metadata, &key, &val, 0));
    }
    return rc;
}

/* The session's bytes (keys and values) but for the row of one key. */
typedef struct total_arg {
    const uint8_t *skip;
    size_t skip_len;
    uint64_t bytes;
} total_arg;

static int add_row(void *arg, MDB_cursor *cur, const MDB_val *key, const MDB_val *val)
{
    (void)cur;
    total_arg *t = arg;
    if (key->mv_size != t->skip_len || memcmp(key->mv_data, t->skip, t->skip_len) != 0)
        t->bytes += (key->mv_size - 8) + val->mv_size;
    return 0;
}

/* Checks st, name and key; *id gets the session's id, looked up in txn. */
static int meta_target(MDB_txn *txn, ctxs_store *st, const char *name, uint64_t *id)
{
    size_t len;
    if (ctxs__name_check(name, &len) < 0)
        return CTXS_EINVAL;
    ctxs__session_rec rec;
    int rc = ctxs__session_get(&rec, txn, st, name, len);
    if (rc == 0)
        *id = rec.id;
    return rc == CTXS_ENOTFOUND ? ctxs__no_session(name) : rc;
}

/* A metadata call's transaction and the row key of its session's key. */
typedef struct meta_at {
    MDB_txn *txn;
    uint64_t id;
    MDB_val key;
    uint8_t k[8 + CTXS_NAME_MAX];
} meta_at;

/* Begins a transaction (read-only or not), looks session name up in it
 * (meta_target()) and makes the row key of key (len bytes). On error
 * nothing is left open. */
static int meta_begin(meta_at *m, ctxs_store *st, const char *name, const char *key, size_t len,
                      int readonly)
{
    m->id = 0;
    int rc = ctxs__txn_begin(&m->txn, st, readonly);
    if (rc == 0 && (rc = meta_target(m->txn, st, name, &m->id)) < 0)
        mdb_txn_abort(m->txn);
    m->key = (MDB_val){meta_key(m->k, m->id, key, len), m->k};
    return rc;
}

/* CTXS_ENOTFOUND for a key session name has not, said so. */
static int no_key(const char *name, const char *key)
{
    char n[80], k[80];
    ctxs__name_shown(n, name);
    ctxs__name_shown(k, key);
    return ctxs__error(CTXS_ENOTFOUND, "session '%s' has no metadata key '%s'", n, k);
}

int ctxs_store_session_set_meta(ctxs_store *st, const char *name, const char *key,
                                const void *value, size_t value_bytes)
{
    ctxs__error_begin();
    size_t key_len;
    CTXS__STORE_CHECK(st);
    if (ctxs__name_check(name, &key_len) < 0 || ctxs__name_check(key, &key_len) < 0)
        return CTXS_EINVAL;
    CTXS__REQUIRE(value || !value_bytes, "value is NULL with value_bytes %zu", value_bytes);
    if (value && value_bytes > CTXS_META_VALUE_MAX)
        return ctxs__error(CTXS_ETOOBIG, "a value of %zu bytes is above the %u a value may "
                           "hold", value_bytes, CTXS_META_VALUE_MAX);
    meta_at m;
    int rc = meta_begin(&m, st, name, key, key_len, 0);
    if (rc < 0)
        return rc;
    if (!value) {
        rc = ctxs__mdb_error(ctxs__mdb_del(m.txn, st->metadata, &m.key, NULL));
        if (rc == CTXS_ENOTFOUND)
            rc = no_key(name, key);
        return ctxs__txn_finish(m.txn, rc);
    }
    total_arg t = {m.k, m.key.mv_size, key_len + value_bytes};
    if ((rc = each_row(m.txn, st, m.id, add_row, &t)) == 0 && t.bytes > CTXS_META_SESSION_MAX)
        rc = ctxs__error(CTXS_ETOOBIG, "the session's keys and values would take %zu bytes, "
                         "above the %u a session may hold", (size_t)t.bytes,
                         CTXS_META_SESSION_MAX);
    MDB_val val = {value_bytes, (void *)value};
    if (rc == 0)
        rc = ctxs__mdb_error(ctxs__mdb_put(m.txn, st->metadata, &m.key, &val, 0));
    return ctxs__txn_finish(m.txn, rc);
}

int ctxs_store_session_get_meta(void *out, size_t *value_bytes, ctxs_store *st, const char *name,
                                const char *key)
{
    ctxs__error_begin();
    size_t key_len;
    CTXS__REQUIRE(value_bytes, "value_bytes is NULL");
    CTXS__STORE_CHECK(st);
    if (ctxs__name_check(key, &key_len) < 0)
        return CTXS_EINVAL;
    size_t cap = out ? *value_bytes : 0;
    meta_at m;
    int rc = meta_begin(&m, st, name, key, key_len, 1);
    if (rc < 0)
        return rc;
    MDB_val val;
    rc = st->metadata ? ctxs__mdb_error(mdb_get(m.txn, st->metadata, &m.key, &val)) : CTXS_ENOTFOUND;
    if (rc == CTXS_ENOTFOUND)
        rc = no_key(name, key);
    if (rc == 0 && val.mv_size > CTXS_META_VALUE_MAX)
        rc = CTXS_EINDEX;
    if (rc == 0) {
        *value_bytes = val.mv_size;
        if (out && val.mv_size > cap)
            rc = ctxs__error(-ERANGE, "the value is %zu bytes, more than the buffer's %zu",
                             (size_t)val.mv_size, cap);
        else if (out && val.mv_size)
            memcpy(out, val.mv_data, val.mv_size);
    }
    mdb_txn_abort(m.txn);
    return rc;
}

/* The listing: first its size, then the copy (one allocation: the
 * entries, then each value and a NUL). */
typedef struct list_arg {
    size_t n, bytes;
    ctxs_meta_entry *entries; /* NULL while sizing */
    uint8_t *at;
} list_arg;

static int list_row(void *arg, MDB_cursor *cur, const MDB_val *key, const MDB_val *val)
{
    (void)cur;
    list_arg *l = arg;
    if (l->entries) {
        ctxs_meta_entry *e = &l->entries[l->n];
        memset(e, 0, sizeof(*e));
        memcpy(e->key, (const char *)key->mv_data + 8, key->mv_size - 8);
        memcpy(l->at, val->mv_data, val->mv_size);
        l->at[val->mv_size] = '\0';
        e->value = l->at;
        e->value_bytes = val->mv_size;
        l->at += val->mv_size + 1;
    }
    l->n++;
    l->bytes += val->mv_size + 1;
    return 0;
}

int ctxs_store_session_list_meta(ctxs_meta_entry **out, size_t *n_out, ctxs_store *st,
                                 const char *name)
{
    ctxs__error_begin();
    MDB_txn *txn;
    int rc = ctxs__list_begin(&txn, (void **)out, n_out, st);
    if (rc < 0)
        return rc;
    uint64_t id = 0;
    list_arg l = {0};
    if ((rc = meta_target(txn, st, name, &id)) == 0)
        rc = each_row(txn, st, id, list_row, &l);
    size_t n = l.n;
    if (rc == 0 && n) {
        /* Bounded: n keys and values within the session's limit. */
        l.entries = ctxs__malloc(n * sizeof(*l.entries) + l.bytes);
        if (!l.entries)
            rc = CTXS_ENOMEM;
    }
    if (rc == 0 && n) {
        l.at = (uint8_t *)(l.entries + n);
        l.n = 0;
        l.bytes = 0;
        rc = each_row(txn, st, id, list_row, &l); /* the same snapshot */
    }
    mdb_txn_abort(txn);
    return ctxs__list_out((void **)out, n_out, l.entries, n, rc);
}
