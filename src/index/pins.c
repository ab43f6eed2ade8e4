/*
 * Pinned sessions: those gc never deletes. A pin is a row of its own,
 * pins[id], not a field of the session record, so that it follows the
 * session and not its name (a rename moves the record, a reindex rebuilds
 * it from the file) and an index from before 1.2 reads as one with no
 * pins.
 */
#include <string.h>

#include "index.h"
#include "mdb_calls.h"

int ctxs__pins_fill(ctxs_session_entry *entries, size_t n, MDB_txn *txn, ctxs_store *st)
{
    for (size_t i = 0; i < n; i++) {
        entries[i].pinned = 0;
        if (!st->pins)
            continue;
        uint8_t idk[8];
        ctxs__id_key(idk, entries[i].id);
        MDB_val key = {8, idk}, val;
        int rc = mdb_get(txn, st->pins, &key, &val);
        if (rc == 0 && val.mv_size != 0)
            return CTXS_EINDEX; /* a pin is an empty value (ctxs_store_check()) */
        if (rc == 0)
            entries[i].pinned = 1;
        else if (rc != MDB_NOTFOUND)
            return ctxs__mdb_error(rc);
    }
    return 0;
}

int ctxs__pin_drop(MDB_txn *txn, ctxs_store *st, uint64_t id)
{
    uint8_t idk[8];
    ctxs__id_key(idk, id);
    MDB_val key = {8, idk};
    int rc = ctxs__mdb_del(txn, st->pins, &key, NULL);
    return rc == MDB_NOTFOUND ? 0 : ctxs__mdb_error(rc);
}

int ctxs_store_session_set_pinned(ctxs_store *st, const char *name, int pinned)
{
    ctxs__error_begin();
    size_t len;
    if (!st || ctxs__name_check(name, &len) < 0 || (pinned != 0 && pinned != 1))
        return CTXS_EINVAL;
    MDB_txn *txn;
    int rc = ctxs__txn_begin(&txn, st, 0);
    if (rc < 0)
        return rc;
    /* In the transaction that finds the session: a delete cannot come
     * between, and leave a pin that no session owns. */
    ctxs__session_rec rec;
    if ((rc = ctxs__session_get(&rec, txn, st, name, len)) == 0) {
        if (pinned) {
            uint8_t idk[8];
            ctxs__id_key(idk, rec.id);
            MDB_val key = {8, idk}, val = {0, NULL};
            rc = ctxs__mdb_error(ctxs__mdb_put(txn, st->pins, &key, &val, 0));
        } else {
            rc = ctxs__pin_drop(txn, st, rec.id);
        }
    }
    return ctxs__txn_finish(txn, rc);
}
