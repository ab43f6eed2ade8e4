/*
 * Checkpoints: a named token count of a session, kept with the checksum of
 * its last token. Restoring is a rollback, O(1), as long as the session
 * still holds that token as it was: the checksum covers its position, id
 * and K/V, and a token written again after a rollback gets another K/V from
 * another context.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "index.h"
#include "mdb_calls.h"
#include "platform.h"
#include "session_iface.h"

static void checkpoint_key(uint8_t *out, uint64_t id, const char *name, size_t len)
{
    ctxs__id_key(out, id);
    memcpy(out + 8, name, len);
}

int ctxs__checkpoint_get(ctxs__checkpoint_rec *out, MDB_txn *txn, ctxs_store *st,
                         uint64_t id, const char *name, size_t len)
{
    uint8_t k[8 + CTXS_NAME_MAX];
    checkpoint_key(k, id, name, len);
    MDB_val key = {8 + len, k};
    return ctxs__record_get(out, sizeof(*out), txn, st->checkpoints, &key);
}

int ctxs__checkpoint_check(const ctxs_session *s, const ctxs__checkpoint_rec *cp)
{
    uint64_t n = cp->n_tokens, sum;
    if (n == 0)
        return 0;
    /* Its last token beyond the count: rolled back past it. Not held: the
     * ring overwrote it. (A rollback to n refuses only then: n_sink < n <
     * the first recent position leaves n - 1 unheld.) */
    uint32_t slot;
    int rc = ctxs_session_get_slot(&slot, s, n - 1);
    if (rc == CTXS_ENOTFOUND)
        return ctxs__error(CTXS_ESTALE, "the checkpoint is at %" PRIu64 " tokens, and the "
                           "session was rolled back below that", n);
    if (rc < 0)
        return rc;
    ctxs__session_tokens(NULL, &sum, s, n - 1, 1);
    if (sum != cp->last_sum)
        return ctxs__error(CTXS_ESTALE, "the session was rolled back past the checkpoint (%"
                           PRIu64 " tokens) and written again since", n);
    /* Windowed layers keep fewer positions than the session's own slots. */
    return ctxs__session_can_roll_back(s, n);
}

/* What a checkpoint call works on: the session's store and id, the
 * checkpoint name's length, and the session's info. */
typedef struct target {
    ctxs_store *st;
    uint64_t id;
    size_t len;
    ctxs_session_info info;
} target;

/* Fills *t for s. CTXS_EINVAL, said so, when s was not opened through a
 * store. */
static int checkpoint_session(target *t, const ctxs_session *s)
{
    ctxs__error_begin();
    t->st = s ? ctxs__session_store(s, &t->id) : NULL;
    if (!t->st)
        return ctxs__error(CTXS_EINVAL, s ? "the session was not opened through a store: "
                                            "checkpoints are kept in a store's index"
                                          : "the session is NULL");
    ctxs_session_get_info(&t->info, s);
    return 0;
}

/* checkpoint_session(), and name checked against the rule (a NULL name
 * breaks it). */
static int checkpoint_target(target *t, const ctxs_session *s, const char *name)
{
    int rc = checkpoint_session(t, s);
    if (rc < 0)
        return rc;
    return ctxs__name_check(name, &t->len) < 0 ? CTXS_EINVAL : 0;
}

/* CTXS_ENOTFOUND for a checkpoint name the session has not, said so. */
static int no_checkpoint(const char *name)
{
    char shown[80];
    ctxs__name_shown(shown, name);
    return ctxs__error(CTXS_ENOTFOUND, "the session has no checkpoint named '%s'", shown);
}

int ctxs__no_checkpoint(const char *session, const char *name)
{
    char shown[80], cp[80];
    ctxs__name_shown(shown, session);
    ctxs__name_shown(cp, name);
    return ctxs__error(CTXS_ENOTFOUND, "session '%s' has no checkpoint named '%s'", shown, cp);
}

int ctxs_checkpoint_create(ctxs_session *s, const char *name)
{
    target t;
    int rc = checkpoint_target(&t, s, name);
    if (rc < 0)
        return rc;
    ctxs__checkpoint_rec cp = {.n_tokens = t.info.n_tokens,
                               .created_unix_ms = ctxs__now_ms()};
    if (cp.n_tokens > 0)
        ctxs__session_tokens(NULL, &cp.last_sum, s, cp.n_tokens - 1, 1);
    MDB_txn *txn;
    if ((rc = ctxs__txn_begin(&txn, t.st, 0)) < 0)
        return rc;
    uint8_t k[8 + CTXS_NAME_MAX];
    checkpoint_key(k, t.id, name, t.len);
    MDB_val key = {8 + t.len, k}, val = {sizeof(cp), &cp};
    rc = ctxs__mdb_error(ctxs__mdb_put(txn, t.st->checkpoints, &key, &val, MDB_NOOVERWRITE));
    if (rc == -EEXIST) {
        char shown[80];
        ctxs__name_shown(shown, name);
        rc = ctxs__error(CTXS_ETAKEN, "the session has a checkpoint named '%s' already: "
                         "delete it first, or choose another name", shown);
    }
    return ctxs__txn_finish(txn, rc);
}

int ctxs_checkpoint_restore(ctxs_session *s, const char *name)
{
    target t;
    int rc = checkpoint_target(&t, s, name);
    if (rc < 0)
        return rc;
    if (t.info.flags & CTXS_INFO_READONLY)
        return ctxs__error(CTXS_EREADONLY, "the session was opened read-only: a restore "
                           "rolls it back, which needs a read-write handle");
    MDB_txn *txn;
    if ((rc = ctxs__txn_begin(&txn, t.st, 1)) < 0)
        return rc;
    ctxs__checkpoint_rec cp;
    rc = ctxs__checkpoint_get(&cp, txn, t.st, t.id, name, t.len);
    mdb_txn_abort(txn);
    if (rc == CTXS_ENOTFOUND)
        rc = no_checkpoint(name);
    if (rc == 0)
        rc = ctxs__checkpoint_check(s, &cp);
    if (rc == 0)
        rc = ctxs_session_rollback(s, cp.n_tokens);
    return rc;
}

int ctxs_checkpoint_delete(ctxs_session *s, const char *name)
{
    target t;
    int rc = checkpoint_target(&t, s, name);
    MDB_txn *txn;
    if (rc < 0 || (rc = ctxs__txn_begin(&txn, t.st, 0)) < 0)
        return rc;
    uint8_t k[8 + CTXS_NAME_MAX];
    checkpoint_key(k, t.id, name, t.len);
    MDB_val key = {8 + t.len, k};
    rc = ctxs__mdb_error(ctxs__mdb_del(txn, t.st->checkpoints, &key, NULL));
    if (rc == CTXS_ENOTFOUND)
        rc = no_checkpoint(name);
    return ctxs__txn_finish(txn, rc);
}

int ctxs_checkpoint_list(ctxs_checkpoint_entry **out, size_t *n_out, const ctxs_session *s)
{
    ctxs__error_begin();
    if (!out || !n_out)
        return CTXS_EINVAL;
    *out = NULL;
    *n_out = 0;
    target t;
    int rc = checkpoint_session(&t, s);
    MDB_txn *txn;
    if (rc < 0 || (rc = ctxs__txn_begin(&txn, t.st, 1)) < 0)
        return rc;
    ctxs_checkpoint_entry *list = NULL;
    size_t n = 0, cap = 0;
    MDB_cursor *cur;
    uint8_t idk[8];
    ctxs__id_key(idk, t.id);
    if ((rc = ctxs__mdb_error(ctxs__mdb_cursor_open(txn, t.st->checkpoints, &cur))) == 0) {
        MDB_val key = {8, idk}, val;
        for (int r = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE); r == 0 && rc == 0;
             r = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
            if (key.mv_size <= 8 || memcmp(key.mv_data, idk, 8) != 0)
                break;
            if (key.mv_size > 8 + CTXS_NAME_MAX || val.mv_size != sizeof(ctxs__checkpoint_rec)) {
                rc = CTXS_EINDEX;
                break;
            }
            if ((rc = ctxs__array_room((void **)&list, &cap, n, sizeof(*list), 8)) < 0)
                break;
            ctxs__checkpoint_rec cp;
            memcpy(&cp, val.mv_data, sizeof(cp));
            ctxs_checkpoint_entry *e = &list[n++];
            memset(e, 0, sizeof(*e));
            memcpy(e->name, (const char *)key.mv_data + 8, key.mv_size - 8);
            e->n_tokens = cp.n_tokens;
            e->created_unix_ms = cp.created_unix_ms;
            e->stale = ctxs__checkpoint_check(s, &cp) != 0;
        }
        mdb_cursor_close(cur);
    }
    mdb_txn_abort(txn);
    return ctxs__list_out((void **)out, n_out, list, n, rc);
}
