/*
 * The LMDB calls of the index that write, allocate or do I/O, through the
 * fault hook of src/store/syscall.h, as the system calls are. Each takes
 * the LMDB function's arguments and returns what it returns.
 */
#ifndef CTXS_INDEX_MDB_CALLS_H
#define CTXS_INDEX_MDB_CALLS_H

#include <lmdb.h>

#include "syscall.h"

/* A commit failed by the hook frees its transaction, as mdb_txn_commit
 * does. */
int ctxs__sys_mdb_env_open(CTXS__SITE_PARAMS, MDB_env *env, const char *path, unsigned flags,
                           mdb_mode_t mode);
int ctxs__sys_mdb_txn_begin(CTXS__SITE_PARAMS, MDB_env *env, MDB_txn *parent, unsigned flags,
                            MDB_txn **txn);
int ctxs__sys_mdb_txn_commit(CTXS__SITE_PARAMS, MDB_txn *txn);
int ctxs__sys_mdb_dbi_open(CTXS__SITE_PARAMS, MDB_txn *txn, const char *name, unsigned flags,
                           MDB_dbi *dbi);
int ctxs__sys_mdb_cursor_open(CTXS__SITE_PARAMS, MDB_txn *txn, MDB_dbi dbi, MDB_cursor **cursor);
int ctxs__sys_mdb_put(CTXS__SITE_PARAMS, MDB_txn *txn, MDB_dbi dbi, MDB_val *key, MDB_val *data,
                      unsigned flags);
int ctxs__sys_mdb_del(CTXS__SITE_PARAMS, MDB_txn *txn, MDB_dbi dbi, MDB_val *key, MDB_val *data);
int ctxs__sys_mdb_cursor_del(CTXS__SITE_PARAMS, MDB_cursor *cursor, unsigned flags);
int ctxs__sys_mdb_drop(CTXS__SITE_PARAMS, MDB_txn *txn, MDB_dbi dbi, int del);

#define ctxs__mdb_env_open(env, path, flags, mode)                                                 \
    ctxs__sys_mdb_env_open(CTXS__SITE, env, path, flags, mode)
#define ctxs__mdb_txn_begin(env, parent, flags, txn)                                               \
    ctxs__sys_mdb_txn_begin(CTXS__SITE, env, parent, flags, txn)
#define ctxs__mdb_txn_commit(txn) ctxs__sys_mdb_txn_commit(CTXS__SITE, txn)
#define ctxs__mdb_dbi_open(txn, name, flags, dbi)                                                  \
    ctxs__sys_mdb_dbi_open(CTXS__SITE, txn, name, flags, dbi)
#define ctxs__mdb_cursor_open(txn, dbi, cursor)                                                    \
    ctxs__sys_mdb_cursor_open(CTXS__SITE, txn, dbi, cursor)
#define ctxs__mdb_put(txn, dbi, key, data, flags)                                                  \
    ctxs__sys_mdb_put(CTXS__SITE, txn, dbi, key, data, flags)
#define ctxs__mdb_del(txn, dbi, key, data) ctxs__sys_mdb_del(CTXS__SITE, txn, dbi, key, data)
#define ctxs__mdb_cursor_del(cursor, flags) ctxs__sys_mdb_cursor_del(CTXS__SITE, cursor, flags)
#define ctxs__mdb_drop(txn, dbi, del) ctxs__sys_mdb_drop(CTXS__SITE, txn, dbi, del)

#endif
