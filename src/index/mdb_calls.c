#include "mdb_calls.h"

#include <errno.h>

/* The body of an LMDB wrapper: LMDB returns errno values itself. */
#define MDBCALL(name, can_fail, call)                                                              \
    do {                                                                                           \
        int injected_ = ctxs__fault(site_file, site_line, name, can_fail);                         \
        return injected_ ? injected_ : (call);                                                     \
    } while (0)

int ctxs__sys_mdb_env_open(CTXS__SITE_PARAMS, MDB_env *env, const char *path, unsigned flags,
                           mdb_mode_t mode)
{
    MDBCALL("mdb_env_open", CTXS__CAN_EIO | CTXS__CAN_ENOSPC | CTXS__CAN_ENOMEM,
            mdb_env_open(env, path, flags, mode));
}

int ctxs__sys_mdb_txn_begin(CTXS__SITE_PARAMS, MDB_env *env, MDB_txn *parent, unsigned flags,
                            MDB_txn **txn)
{
    MDBCALL("mdb_txn_begin", CTXS__CAN_EIO | CTXS__CAN_ENOMEM,
            mdb_txn_begin(env, parent, flags, txn));
}

int ctxs__sys_mdb_txn_commit(CTXS__SITE_PARAMS, MDB_txn *txn)
{
    int injected = ctxs__fault(site_file, site_line, "mdb_txn_commit",
                               CTXS__CAN_EIO | CTXS__CAN_ENOSPC | CTXS__CAN_ENOMEM);
    if (injected) {
        mdb_txn_abort(txn);
        return injected;
    }
    return mdb_txn_commit(txn);
}

int ctxs__sys_mdb_dbi_open(CTXS__SITE_PARAMS, MDB_txn *txn, const char *name, unsigned flags,
                           MDB_dbi *dbi)
{
    MDBCALL("mdb_dbi_open", CTXS__CAN_ENOMEM, mdb_dbi_open(txn, name, flags, dbi));
}

int ctxs__sys_mdb_cursor_open(CTXS__SITE_PARAMS, MDB_txn *txn, MDB_dbi dbi, MDB_cursor **cursor)
{
    MDBCALL("mdb_cursor_open", CTXS__CAN_ENOMEM, mdb_cursor_open(txn, dbi, cursor));
}

int ctxs__sys_mdb_put(CTXS__SITE_PARAMS, MDB_txn *txn, MDB_dbi dbi, MDB_val *key, MDB_val *data,
                      unsigned flags)
{
    /* Out of space, LMDB says its map is full. */
    int injected =
        ctxs__fault(site_file, site_line, "mdb_put", CTXS__CAN_ENOSPC | CTXS__CAN_ENOMEM);
    if (injected)
        return injected == ENOSPC ? MDB_MAP_FULL : injected;
    return mdb_put(txn, dbi, key, data, flags);
}

int ctxs__sys_mdb_del(CTXS__SITE_PARAMS, MDB_txn *txn, MDB_dbi dbi, MDB_val *key, MDB_val *data)
{
    MDBCALL("mdb_del", CTXS__CAN_ENOMEM, mdb_del(txn, dbi, key, data));
}

int ctxs__sys_mdb_cursor_del(CTXS__SITE_PARAMS, MDB_cursor *cursor, unsigned flags)
{
    MDBCALL("mdb_cursor_del", CTXS__CAN_ENOMEM, mdb_cursor_del(cursor, flags));
}

int ctxs__sys_mdb_drop(CTXS__SITE_PARAMS, MDB_txn *txn, MDB_dbi dbi, int del)
{
    MDBCALL("mdb_drop", CTXS__CAN_ENOMEM, mdb_drop(txn, dbi, del));
}
