/*
 * ctxs_store_check(): every record of every table of the index read and
 * judged by the rules its readers apply, so that a record one call would
 * refuse with CTXS_EINDEX is found here too, and every one of them, not the
 * first. The rules below are those readers' rules, kept in step with them:
 * a record is reported here exactly when some call that reads it fails
 * (sessions.c, models.c, checkpoints.c, metadata.c, pins.c, prefix.c,
 * store.c), plus meta["next_id"], which no reader refuses but the next
 * create mends (docs/FORMAT.md).
 *
 * One read transaction: the walk judges one state of the index. Damage LMDB
 * finds in its own pages ends that table's walk (its cursor cannot go on)
 * and is reported as a problem of the table; the other tables are still
 * read.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "index.h"
#include "mdb_calls.h"
#include "platform.h"

typedef struct walk {
    ctxs_store_check_result *out;
    MDB_txn *txn;
    ctxs_store *st;
    size_t cap;                 /* problems allocated */
    int rc;                     /* CTXS_ENOMEM once a problem could not be kept */
} walk;

/* Text when every byte is printable ASCII (a name, "next_id"), else hex:
 * keys that are names print as the user typed them, the rest as bytes. */
static size_t key_text(char *buf, size_t cap, const uint8_t *k, size_t n)
{
    int text = n > 0;
    for (size_t i = 0; i < n && text; i++)
        text = k[i] >= 0x20 && k[i] < 0x7f;
    size_t at = 0;
    if (text) {
        at = (size_t)snprintf(buf, cap, "'%.*s'", (int)n, (const char *)k);
    } else {
        at = (size_t)snprintf(buf, cap, "0x");
        for (size_t i = 0; i < n && at + 3 < cap; i++)
            at += (size_t)snprintf(buf + at, cap - at, "%02x", k[i]);
        if (n == 0)
            at = (size_t)snprintf(buf, cap, "(empty)");
    }
    return at < cap ? at : cap - 1;
}

/* Keys that lead with a big-endian id print as "id N" and the rest as
 * key_text(): "id 3, 'draft'". */
static void key_print(char *buf, size_t cap, const MDB_val *key, int id_first)
{
    const uint8_t *k = key->mv_data;
    if (id_first && key->mv_size >= 8) {
        int at = snprintf(buf, cap, "id %" PRIu64, ctxs__id_from_key(k));
        if (key->mv_size > 8 && (size_t)at + 2 < cap) {
            memcpy(buf + at, ", ", 2);
            key_text(buf + at + 2, cap - (size_t)at - 2, k + 8, key->mv_size - 8);
        }
        return;
    }
    key_text(buf, cap, k, key->mv_size);
}

static void problem(walk *w, const char *table, const MDB_val *key, int id_first,
                    const char *fmt, ...)
{
    ctxs_store_check_result *out = w->out;
    uint64_t i = out->n_problems++;
    if (i >= CTXS_CHECK_MAX_PROBLEMS)
        return;
    if (out->n_listed == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 8;
        ctxs_index_problem *grown = ctxs__realloc(out->problems, cap * sizeof(*grown));
        if (!grown) {
            w->rc = CTXS_ENOMEM;
            out->n_problems--;
            return;
        }
        out->problems = grown;
        w->cap = cap;
    }
    ctxs_index_problem *p = &out->problems[out->n_listed++];
    memset(p, 0, sizeof(*p));
    snprintf(p->table, sizeof(p->table), "%s", table);
    if (key)
        key_print(p->key, sizeof(p->key), key, id_first);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->what, sizeof(p->what), fmt, ap);
    va_end(ap);
}

/* Judges one record: a problem for each thing wrong with it. */
typedef void (*judge_fn)(walk *w, const MDB_val *key, const MDB_val *val);

static int name_ok(const MDB_val *v)
{
    char name[CTXS_NAME_MAX + 1];
    if (v->mv_size == 0 || v->mv_size > CTXS_NAME_MAX)
        return 0;
    memcpy(name, v->mv_data, v->mv_size);
    name[v->mv_size] = '\0';
    size_t len;
    return ctxs__name_check(name, &len) == 0 && len == v->mv_size;
}

static void judge_meta(walk *w, const MDB_val *key, const MDB_val *val)
{
    if (key->mv_size == 6 && memcmp(key->mv_data, "format", 6) == 0) {
        ctxs__index_format f;
        if (val->mv_size != sizeof(f)) {
            problem(w, "meta", key, 0, "the format record has %zu bytes, not %zu",
                    val->mv_size, sizeof(f));
            return;
        }
        memcpy(&f, val->mv_data, sizeof(f));
        if (memcmp(f.magic, CTXS__INDEX_MAGIC, 8) != 0)
            problem(w, "meta", key, 0, "the format record lacks the magic " CTXS__INDEX_MAGIC);
    } else if (key->mv_size == 7 && memcmp(key->mv_data, "next_id", 7) == 0) {
        uint64_t next = 0;
        if (val->mv_size != 8) {
            problem(w, "meta", key, 0,
                    "next_id has %zu bytes, not 8 (the next create or repair mends it)",
                    val->mv_size);
            return;
        }
        memcpy(&next, val->mv_data, 8);
        uint64_t floor;
        if (ctxs__ids_floor(w->txn, w->st, &floor) < 0)
            return; /* the table at fault is reported by its own walk */
        if (next == 0 || next > CTXS__ID_MAX)
            problem(w, "meta", key, 0,
                    "next_id is %" PRIu64 ", outside 1..2^63-1 (the next create or repair "
                    "mends it)", next);
        else if (next < floor)
            problem(w, "meta", key, 0,
                    "next_id is %" PRIu64 ", not above id %" PRIu64 " in use (the next create "
                    "or repair mends it)", next, floor - 1);
    }
    /* Other keys: a later minor version's; readers ignore them. */
}

static void judge_sessions(walk *w, const MDB_val *key, const MDB_val *val)
{
    if (!name_ok(key))
        problem(w, "sessions", key, 0, "the key is not a valid session name");
    ctxs__session_rec rec;
    if (val->mv_size != sizeof(rec)) {
        problem(w, "sessions", key, 0, "the session record has %zu bytes, not %zu",
                val->mv_size, sizeof(rec));
        return;
    }
    memcpy(&rec, val->mv_data, sizeof(rec));
    if (rec.id == 0 || rec.id > CTXS__ID_MAX) {
        problem(w, "sessions", key, 0, "the record's id %" PRIu64 " is outside 1..2^63-1",
                rec.id);
        return;
    }
    /* ids[id] must name this entry back: lookups by id (forks' parents,
     * repair) refuse an entry the two tables disagree on. */
    uint8_t idk[8];
    ctxs__id_key(idk, rec.id);
    MDB_val ik = {8, idk}, iv;
    int rc = mdb_get(w->txn, w->st->ids, &ik, &iv);
    if (rc == MDB_NOTFOUND)
        problem(w, "sessions", key, 0, "no ids row names its id %" PRIu64, rec.id);
    else if (rc == 0 && (iv.mv_size != key->mv_size ||
                         memcmp(iv.mv_data, key->mv_data, key->mv_size) != 0))
        problem(w, "sessions", key, 0, "ids[%" PRIu64 "] names another session", rec.id);
}

static void judge_ids(walk *w, const MDB_val *key, const MDB_val *val)
{
    if (key->mv_size != 8) {
        problem(w, "ids", key, 0, "the key has %zu bytes, not an 8-byte id", key->mv_size);
        return;
    }
    if (!name_ok(val)) {
        problem(w, "ids", key, 1, "the value (%zu bytes) is not a valid session name",
                val->mv_size);
        return;
    }
    ctxs__session_rec rec;
    MDB_val sk = *val;
    int rc = ctxs__record_get(&rec, sizeof(rec), w->txn, w->st->sessions, &sk);
    if (rc == CTXS_ENOTFOUND)
        problem(w, "ids", key, 1, "names '%.*s', which has no sessions row", (int)val->mv_size,
                (const char *)val->mv_data);
    else if (rc == 0 && rec.id != ctxs__id_from_key(key->mv_data))
        problem(w, "ids", key, 1, "names '%.*s', whose record has id %" PRIu64,
                (int)val->mv_size, (const char *)val->mv_data, rec.id);
    /* CTXS_EINDEX: the sessions row is malformed, and reported there. */
}

static void judge_models(walk *w, const MDB_val *key, const MDB_val *val)
{
    if (key->mv_size != 16)
        problem(w, "models", key, 0, "the key has %zu bytes, not a 16-byte model hash",
                key->mv_size);
    ctxs__model_rec rec;
    if (val->mv_size < sizeof(rec)) {
        problem(w, "models", key, 0, "the model record has %zu bytes, fewer than %zu",
                val->mv_size, sizeof(rec));
        return;
    }
    memcpy(&rec, val->mv_data, sizeof(rec));
    ctxs_geometry g;
    if (ctxs__model_decode(val->mv_data, val->mv_size, &rec, &g, NULL) < 0)
        problem(w, "models", key, 0,
                "the record's name length %u and schedule do not fit its %zu bytes",
                rec.name_len, val->mv_size);
}

static void judge_filehash(walk *w, const MDB_val *key, const MDB_val *val)
{
    if (key->mv_size != sizeof(ctxs__filehash_key) && key->mv_size != sizeof(ctxs__tokhash_key))
        problem(w, "filehash", key, 0, "the key has %zu bytes, not 40 or 48", key->mv_size);
    else if (val->mv_size != 16)
        problem(w, "filehash", key, 0, "the hash has %zu bytes, not 16", val->mv_size);
}

/* checkpoints and metadata: id || name keys. */
static int id_name_key_ok(walk *w, const char *table, const MDB_val *key)
{
    if (key->mv_size <= 8 || key->mv_size > 8 + CTXS_NAME_MAX) {
        problem(w, table, key, key->mv_size >= 8,
                "the key has %zu bytes: not an id and a name of 1 to %d bytes", key->mv_size,
                CTXS_NAME_MAX);
        return 0;
    }
    return 1;
}

static void judge_checkpoints(walk *w, const MDB_val *key, const MDB_val *val)
{
    if (!id_name_key_ok(w, "checkpoints", key))
        return;
    if (val->mv_size != sizeof(ctxs__checkpoint_rec))
        problem(w, "checkpoints", key, 1, "the checkpoint record has %zu bytes, not %zu",
                val->mv_size, sizeof(ctxs__checkpoint_rec));
}

static void judge_metadata(walk *w, const MDB_val *key, const MDB_val *val)
{
    if (!id_name_key_ok(w, "metadata", key))
        return;
    if (val->mv_size > CTXS_META_VALUE_MAX)
        problem(w, "metadata", key, 1, "the value has %zu bytes, above the limit of %d",
                val->mv_size, CTXS_META_VALUE_MAX);
}

static void judge_pins(walk *w, const MDB_val *key, const MDB_val *val)
{
    if (key->mv_size != 8)
        problem(w, "pins", key, 0, "the key has %zu bytes, not an 8-byte id", key->mv_size);
    else if (val->mv_size != 0)
        problem(w, "pins", key, 1, "a pin's value is empty, this one has %zu bytes",
                val->mv_size);
}

static void judge_prefixes(walk *w, const MDB_val *key, const MDB_val *val)
{
    if (key->mv_size != 32)
        problem(w, "prefixes", key, 0, "the key has %zu bytes, not a model and a chain hash (32)",
                key->mv_size);
    else if (val->mv_size != 8)
        problem(w, "prefixes", key, 0, "the value has %zu bytes, not an 8-byte id",
                val->mv_size);
}

static void judge_chunks(walk *w, const MDB_val *key, const MDB_val *val)
{
    if (key->mv_size != 12)
        problem(w, "chunks", key, key->mv_size >= 8,
                "the key has %zu bytes, not an id and a chunk number (12)",
                key->mv_size);
    else if (val->mv_size != 16)
        problem(w, "chunks", key, 1, "the chain hash has %zu bytes, not 16", val->mv_size);
}

static void judge_pending(walk *w, const MDB_val *key, const MDB_val *val)
{
    const uint8_t *v = val->mv_data;
    if (key->mv_size != 8)
        problem(w, "pending", key, 0, "the key has %zu bytes, not an 8-byte id", key->mv_size);
    else if (val->mv_size == 0 || (v[0] != CTXS__INTENT_CREATE && v[0] != CTXS__INTENT_DELETE))
        problem(w, "pending", key, 1, "the intent is neither a create ('C') nor a delete ('D')");
}

static void walk_table(walk *w, const char *table, MDB_dbi dbi, judge_fn judge)
{
    if (!dbi) /* pins or metadata in a read-only handle to an index before 1.2 */
        return;
    MDB_cursor *cur;
    int rc = ctxs__mdb_cursor_open(w->txn, dbi, &cur);
    MDB_val key, val;
    if (rc == 0) {
        for (rc = mdb_cursor_get(cur, &key, &val, MDB_FIRST); rc == 0 && w->rc == 0;
             rc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
            w->out->records++;
            judge(w, &key, &val);
        }
        mdb_cursor_close(cur);
    }
    if (rc == MDB_NOTFOUND || rc == 0)
        return;
    if (ctxs__mdb_error(rc) == CTXS_EINDEX)
        problem(w, table, NULL, 0, "LMDB cannot read the table on: %s", mdb_strerror(rc));
    else if (w->rc == 0)
        w->rc = ctxs__mdb_error(rc);
}

int ctxs_store_check(ctxs_store_check_result *out, ctxs_store *st)
{
    ctxs__error_begin();
    if (!out)
        return CTXS_EINVAL;
    memset(out, 0, sizeof(*out));
    if (!st)
        return CTXS_EINVAL;
    walk w = {.out = out, .st = st};
    int rc = ctxs__txn_begin(&w.txn, st, 1);
    if (rc < 0)
        return rc;
    const struct {
        const char *name;
        MDB_dbi dbi;
        judge_fn judge;
    } tables[] = {
        {"meta", st->meta, judge_meta},
        {"sessions", st->sessions, judge_sessions},
        {"ids", st->ids, judge_ids},
        {"models", st->models, judge_models},
        {"filehash", st->filehash, judge_filehash},
        {"checkpoints", st->checkpoints, judge_checkpoints},
        {"metadata", st->metadata, judge_metadata},
        {"pins", st->pins, judge_pins},
        {"prefixes", st->prefixes, judge_prefixes},
        {"chunks", st->chunks, judge_chunks},
        {"pending", st->pending, judge_pending},
    };
    for (size_t i = 0; i < sizeof(tables) / sizeof(tables[0]) && w.rc == 0; i++)
        walk_table(&w, tables[i].name, tables[i].dbi, tables[i].judge);
    mdb_txn_abort(w.txn);
    if (w.rc < 0) {
        ctxs_free(out->problems);
        memset(out, 0, sizeof(*out));
        return w.rc;
    }
    return out->n_problems ? CTXS_EINDEX : 0;
}
