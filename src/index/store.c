/*
 * Opening and closing a store: the directory, the LMDB environment, the
 * index's format version, and finishing what a crashed process left half
 * done; and rewriting the index compacted.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "index.h"
#include "mdb_calls.h"
#include "platform.h"

/* LMDB forbids opening one environment twice in a process (closing either
 * would drop the other's POSIX locks), so handles to the same store share
 * one. */
static pthread_mutex_t stores_mutex = PTHREAD_MUTEX_INITIALIZER;
static ctxs_store *stores_head;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* A child must not use its parent's environments (LMDB's rule); it opens
 * its own, so it must not find them in the list. They are leaked. */
static void forget_stores_in_child(void)
{
    pthread_mutex_init(&stores_mutex, NULL);
    stores_head = NULL;
}

static void install_atfork(void)
{
    pthread_atfork(NULL, NULL, forget_stores_in_child);
}

int ctxs__sessions_dir_open(DIR **out, ctxs_store *st)
{
    int dfd = ctxs__dup(st->sessions_fd);
    *out = dfd >= 0 ? ctxs__fdopendir(dfd) : NULL;
    if (*out)
        return 0;
    int rc = -errno;
    if (dfd >= 0)
        close(dfd);
    return rc;
}

int ctxs__record_get(void *out, size_t size, MDB_txn *txn, MDB_dbi dbi, MDB_val *key)
{
    MDB_val val;
    int rc = mdb_get(txn, dbi, key, &val);
    if (rc != 0)
        return ctxs__mdb_error(rc);
    if (val.mv_size != size)
        return CTXS_EINDEX;
    memcpy(out, val.mv_data, size);
    return 0;
}

int ctxs__mdb_error(int rc)
{
    switch (rc) {
    case MDB_SUCCESS:
        return 0;
    case MDB_NOTFOUND:
        return CTXS_ENOTFOUND;
    case MDB_KEYEXIST:
        return -EEXIST;
    case MDB_MAP_FULL:
    case MDB_TXN_FULL:
    case MDB_PAGE_FULL:
    case ENOSPC:
    case EDQUOT:
        return CTXS_EFULL;
    case MDB_INVALID:
        return CTXS_EFOREIGN;
    case MDB_VERSION_MISMATCH:
        return CTXS_EVERSION;
    /* Damage LMDB found in its own pages: the index's, never a session
     * file's. A transaction that an earlier failure spoiled (MDB_BAD_TXN)
     * is a failed operation, not damage. */
    case MDB_CORRUPTED:
    case MDB_PAGE_NOTFOUND:
    case MDB_PANIC:
        return CTXS_EINDEX;
    case MDB_BAD_TXN:
        return -EIO;
    case MDB_READERS_FULL:
    case MDB_DBS_FULL:
        return CTXS_EBUSY;
    case ENOMEM:
        return CTXS_ENOMEM;
    default:
        return rc > 0 ? -rc : -EIO;
    }
}

int ctxs__store_readonly(void)
{
    return ctxs__error(CTXS_EREADONLY, "the store was opened read-only (CTXS_RDONLY): "
                       "open it without that flag to change it");
}

int ctxs__txn_begin(MDB_txn **out, ctxs_store *st, int readonly)
{
    if (!st->env) { /* a compaction could not reopen it */
        *out = NULL;
        return ctxs__error(CTXS_EFAILED, "the store's index was rewritten by a compaction "
                           "but could not be opened again: close the store and open it anew");
    }
    /* Every write of the index begins here: a read-only store refuses them
     * all, whatever its environment would allow (a handle may share a
     * read-write one, see ctxs_store_open()). */
    if (!readonly && st->rdonly) {
        *out = NULL;
        return ctxs__store_readonly();
    }
    int rc = ctxs__mdb_txn_begin(st->env, NULL, readonly ? MDB_RDONLY : 0, out);
    if (rc == MDB_MAP_RESIZED) {
        /* Another process grew the map; adopt its size. */
        if ((rc = mdb_env_set_mapsize(st->env, 0)) == 0)
            rc = ctxs__mdb_txn_begin(st->env, NULL, readonly ? MDB_RDONLY : 0, out);
    }
    if (rc != 0)
        *out = NULL;
    return ctxs__mdb_error(rc);
}

int ctxs__txn_commit(MDB_txn *txn)
{
    return ctxs__mdb_error(ctxs__mdb_txn_commit(txn));
}

int ctxs__txn_finish(MDB_txn *txn, int rc)
{
    if (rc < 0) {
        mdb_txn_abort(txn);
        return rc;
    }
    return ctxs__txn_commit(txn);
}

int ctxs__list(void **out, size_t *n_out, ctxs_store *st, MDB_dbi dbi, size_t entry_size,
               ctxs__entry_fill fill)
{
    MDB_txn *txn;
    int rc = ctxs__list_begin(&txn, out, n_out, st);
    if (rc < 0)
        return rc;
    MDB_stat ms;
    MDB_cursor *cur = NULL;
    uint8_t *list = NULL;
    size_t n = 0;
    if ((rc = ctxs__mdb_error(mdb_stat(txn, dbi, &ms))) == 0 && ms.ms_entries &&
        !(list = ctxs__calloc(ms.ms_entries, entry_size)))
        rc = CTXS_ENOMEM;
    if (rc == 0 && list)
        rc = ctxs__mdb_error(ctxs__mdb_cursor_open(txn, dbi, &cur));
    MDB_val key, val;
    for (int op = MDB_FIRST; rc == 0 && list && n < ms.ms_entries &&
                             mdb_cursor_get(cur, &key, &val, op) == 0;
         op = MDB_NEXT)
        rc = fill(list + n++ * entry_size, &key, &val);
    if (cur)
        mdb_cursor_close(cur);
    mdb_txn_abort(txn);
    return ctxs__list_out(out, n_out, list, n, rc);
}

int ctxs__list_begin(MDB_txn **txn, void **out, size_t *n_out, ctxs_store *st)
{
    if (!out || !n_out)
        return CTXS_EINVAL;
    *out = NULL;
    *n_out = 0;
    if (!st)
        return CTXS_EINVAL;
    return ctxs__txn_begin(txn, st, 1);
}

int ctxs__list_out(void **out, size_t *n_out, void *list, size_t n, int rc)
{
    if (rc < 0) {
        free(list);
        return rc;
    }
    *out = list;
    *n_out = n;
    return 0;
}

void ctxs__file_name(char buf[32], uint64_t id)
{
    snprintf(buf, 32, "%016llx.ctxs", (unsigned long long)id);
}

char *ctxs__file_path(const ctxs_store *st, uint64_t id)
{
    char name[32];
    ctxs__file_name(name, id);
    size_t len = strlen(st->sessions_dir) + 1 + strlen(name) + 1;
    char *path = ctxs__malloc(len);
    if (path)
        snprintf(path, len, "%s/%s", st->sessions_dir, name);
    return path;
}

void ctxs__id_key(uint8_t out[8], uint64_t id)
{
    for (int i = 0; i < 8; i++)
        out[i] = (uint8_t)(id >> (56 - 8 * i));
}

uint64_t ctxs__id_from_key(const void *key)
{
    const uint8_t *k = key;
    uint64_t id = 0;
    for (int i = 0; i < 8; i++)
        id = id << 8 | k[i];
    return id;
}

static int options_valid(const ctxs_store_options *o)
{
    static const uint8_t zero[sizeof(o->reserved)];
    return o->version == CTXS_STORE_OPTIONS_VERSION && o->max_readers > 0 &&
           o->map_bytes >= (1u << 20) && o->map_bytes <= SIZE_MAX &&
           memcmp(o->reserved, zero, sizeof(zero)) == 0;
}

/* mkdir -m 0700 that accepts an existing directory: 1 when it made path,
 * 0 when a directory was there. */
static int make_dir(const char *path)
{
    if (ctxs__mkdir(path, 0700) == 0)
        return 1;
    if (errno == EEXIST) {
        struct stat sb;
        if (lstat(path, &sb) != 0)
            return -errno;
        return S_ISDIR(sb.st_mode) ? 0 : -ENOTDIR;
    }
    return -errno;
}

/* make_dir() for the store directory itself, which may be a symlink to a
 * directory: followed, where make_dir() refuses one. */
static int make_store_dir(const char *path)
{
    if (ctxs__mkdir(path, 0700) == 0)
        return 1;
    if (errno != EEXIST)
        return -errno;
    struct stat sb;
    if (ctxs__stat(path, &sb) != 0)
        return -errno; /* -ENOENT: a dangling symlink; -ELOOP: a loop */
    return S_ISDIR(sb.st_mode) ? 0 : -ENOTDIR;
}

static void store_free(ctxs_store *st)
{
    if (st->env && !st->owner) /* a view's belongs to its owner */
        mdb_env_close(st->env);
    if (st->lock_fd >= 0)
        close(st->lock_fd); /* after the environment: see "The store lock" */
    if (st->sessions_fd >= 0)
        close(st->sessions_fd);
    free(st->dir);
    free(st->sessions_dir);
    free(st);
}

const ctxs__table ctxs__tables[] = {
    {"meta", offsetof(ctxs_store, meta), 0, 0},
    {"sessions", offsetof(ctxs_store, sessions), 0, 0},
    {"ids", offsetof(ctxs_store, ids), 0, 0},
    {"models", offsetof(ctxs_store, models), 0, 0},
    {"filehash", offsetof(ctxs_store, filehash), 0, 0},
    {"checkpoints", offsetof(ctxs_store, checkpoints), 0, 0},
    {"prefixes", offsetof(ctxs_store, prefixes), MDB_DUPSORT | MDB_DUPFIXED, 8},
    {"chunks", offsetof(ctxs_store, chunks), 0, 0},
    {"pending", offsetof(ctxs_store, pending), 0, 0},
    {"metadata", offsetof(ctxs_store, metadata), 0, 0},
    {"pins", offsetof(ctxs_store, pins), 0, 0},
};
const size_t ctxs__n_tables = sizeof(ctxs__tables) / sizeof(ctxs__tables[0]);

/* The index's format record into *f: 0, MDB_NOTFOUND (there is none),
 * CTXS_EINDEX (not the size of one), or another error. */
static int format_get(ctxs__index_format *f, MDB_txn *txn, ctxs_store *st)
{
    MDB_val key = {6, (void *)"format"}, val;
    int rc = mdb_get(txn, st->meta, &key, &val);
    if (rc == MDB_NOTFOUND)
        return rc;
    if (rc != 0)
        return ctxs__mdb_error(rc);
    if (val.mv_size != sizeof(*f))
        return CTXS_EINDEX;
    memcpy(f, val.mv_data, sizeof(*f));
    return 0;
}

/* A new index gets its format record; an existing one must be ours and not
 * newer. An LMDB environment of someone else's is foreign (open_tables()
 * tells it by its tables); in ours, a format record that is missing beside
 * sessions, of another size, or without our magic is a damaged index. */
static int check_format(MDB_txn *txn, ctxs_store *st, int *fresh)
{
    ctxs__index_format f;
    int rc = format_get(&f, txn, st);
    if (rc == MDB_NOTFOUND) {
        MDB_stat ms;
        if ((rc = mdb_stat(txn, st->sessions, &ms)) != 0)
            return ctxs__mdb_error(rc);
        if (ms.ms_entries != 0)
            return CTXS_EINDEX;
        *fresh = 1;
        return 0;
    }
    if (rc != 0)
        return rc;
    if (memcmp(f.magic, CTXS__INDEX_MAGIC, 8) != 0)
        return CTXS_EINDEX;
    if (f.major > CTXS__INDEX_MAJOR)
        return CTXS_EVERSION;
    return 0;
}

static int write_format(MDB_txn *txn, ctxs_store *st)
{
    ctxs__index_format f = {.major = CTXS__INDEX_MAJOR, .minor = CTXS__INDEX_MINOR};
    memcpy(f.magic, CTXS__INDEX_MAGIC, 8);
    MDB_val key = {6, (void *)"format"}, val = {sizeof(f), &f};
    return ctxs__mdb_error(ctxs__mdb_put(txn, st->meta, &key, &val, 0));
}

int ctxs__index_format_raise(MDB_txn *txn, ctxs_store *st)
{
    ctxs__index_format f;
    int rc = format_get(&f, txn, st);
    if (rc != 0)
        return rc == MDB_NOTFOUND ? ctxs__mdb_error(rc) : rc;
    if (f.major >= CTXS__INDEX_MAJOR)
        return 0;
    return write_format(txn, st);
}

/* Opens (creating where missing) every table, in one transaction whose
 * handles then serve every later one. A read-only store creates nothing:
 * an index from before 1.2 has no pins and no metadata (st->pins and
 * st->metadata stay 0), and one whose
 * creation never wrote its first transaction is not finished (-ENOENT). */
static int open_tables(ctxs_store *st, int *fresh)
{
    MDB_txn *txn;
    int rc = ctxs__txn_begin(&txn, st, st->rdonly);
    if (rc < 0)
        return rc;
    /* Someone else's environment has tables, or data, of its own. */
    MDB_dbi main_dbi;
    MDB_stat ms;
    if ((rc = ctxs__mdb_error(ctxs__mdb_dbi_open(txn, NULL, 0, &main_dbi))) == 0 &&
        (rc = ctxs__mdb_error(mdb_stat(txn, main_dbi, &ms))) == 0 && ms.ms_entries > 0) {
        MDB_val key = {4, (void *)"meta"}, val;
        if (mdb_get(txn, main_dbi, &key, &val) != 0)
            rc = CTXS_EFOREIGN;
    }
    if (rc == 0 && st->rdonly && ms.ms_entries == 0)
        rc = -ENOENT;
    for (size_t i = 0; rc == 0 && i < ctxs__n_tables; i++) {
        MDB_dbi *dbi = (MDB_dbi *)(void *)((char *)st + ctxs__tables[i].offset);
        unsigned create = st->rdonly ? 0 : MDB_CREATE;
        rc = ctxs__mdb_dbi_open(txn, ctxs__tables[i].name, ctxs__tables[i].flags | create, dbi);
        if (rc == MDB_NOTFOUND && (dbi == &st->pins || dbi == &st->metadata)) {
            *dbi = 0;
            rc = 0;
        }
        rc = rc == MDB_INCOMPATIBLE ? CTXS_EFOREIGN : ctxs__mdb_error(rc);
    }
    if (rc == 0 && (rc = check_format(txn, st, fresh)) == 0 && *fresh)
        rc = st->rdonly ? -ENOENT : write_format(txn, st);
    return ctxs__txn_finish(txn, rc);
}

/*
 * The store lock. Compaction replaces data.mdb with a compacted copy; a
 * process that kept the old environment open would go on reading and
 * writing the replaced file, and its writes would be lost. So every
 * process that opens the environment holds a shared lock on byte 0 of
 * index/store.lock from before mdb_env_open() until after mdb_env_close()
 * (one per store per process: handles share the environment), taken
 * waiting, so that an open waits out a compaction; compaction converts it
 * to an exclusive lock without waiting, and leaves the index alone when
 * that fails.
 *
 * Open-file-description locks: they conflict between descriptions even
 * within one process, and closing some other descriptor of the file does
 * not drop them. The lock is on a file of its own, never replaced: one on
 * data.mdb would stay behind on the old inode after the rename, and LMDB's
 * POSIX locks on lock.mdb would be dropped by any close() of that file in
 * this process.
 */
#define STORE_LOCK_FILE "store.lock"
/* The compacted copy being written. LMDB opens only data.mdb and lock.mdb,
 * so the copy is never taken for the index; one left by a crash is removed
 * by the next open or compaction (both exclude compactions in progress). */
#define COMPACT_TMP_FILE "compact.tmp"

#ifdef F_OFD_SETLK
#define STORE_SETLK F_OFD_SETLK
#define STORE_SETLKW F_OFD_SETLKW
#else
/* Process-associated locks: enough across processes; within one, the
 * handle count decides (ctxs__index_compact). */
#define STORE_SETLK F_SETLK
#define STORE_SETLKW F_SETLKW
#endif

/* A lock of type on byte 0, for fcntl(). */
static struct flock byte0(short type)
{
    struct flock fl;
    memset(&fl, 0, sizeof(fl));
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = 0;
    fl.l_len = 1;
    return fl;
}

/* Sets the lock on byte 0 to type (F_RDLCK, F_WRLCK), waiting for it or
 * not. Returns 0, CTXS_EBUSY (not waiting), or -errno. */
static int store_lock(int fd, short type, int wait)
{
    struct flock fl = byte0(type);
    if (ctxs__fcntl_lock(fd, wait ? STORE_SETLKW : STORE_SETLK, &fl) == 0)
        return 0;
    return (errno == EAGAIN || errno == EACCES) ? CTXS_EBUSY : -errno;
}

int ctxs__store_lock_exclusive(int *fd, const char *index_dir, const struct stat *dir_sb)
{
    *fd = -1;
    pthread_mutex_lock(&stores_mutex);
    int rc = 0;
    for (ctxs_store *st = stores_head; st && rc == 0; st = st->next)
        if (st->dev == dir_sb->st_dev && st->ino == dir_sb->st_ino)
            rc = CTXS_EBUSY;
    pthread_mutex_unlock(&stores_mutex);
    char *path = rc == 0 ? ctxs__path_join(index_dir, STORE_LOCK_FILE) : NULL;
    if (rc == 0 && !path)
        rc = CTXS_ENOMEM;
    if (rc == 0 && (rc = ctxs__index_file_open(path, O_RDWR | O_CREAT)) >= 0) {
        *fd = rc;
        rc = 0;
    }
    free(path);
    if (rc == 0 && (rc = store_lock(*fd, F_WRLCK, 0)) < 0) {
        close(*fd);
        *fd = -1;
    }
    return rc;
}

void ctxs__store_lock_share(int fd)
{
    store_lock(fd, F_RDLCK, 0); /* the same description's: no conflict */
}

/* Opens index/store.lock and waits for the shared lock. A read-only
 * store opens it for reading, which a shared lock needs; where it is
 * missing, no process has ever opened the store read-write (each makes
 * it), so none can be compacting it: st->lock_fd stays -1. */
static int store_lock_take(ctxs_store *st, const char *index_dir)
{
    char *path = ctxs__path_join(index_dir, STORE_LOCK_FILE);
    if (!path)
        return CTXS_ENOMEM;
    int fd = ctxs__index_file_open(path, st->rdonly ? O_RDONLY : O_RDWR | O_CREAT);
    free(path);
    st->lock_fd = fd < 0 ? -1 : fd;
    if (fd < 0)
        return st->rdonly && fd == -ENOENT ? 0 : fd;
    return store_lock(st->lock_fd, F_RDLCK, 1);
}

/* Whether another process (another open file description) has the store
 * open: it holds the shared lock of index/store.lock. 1, 0 or -errno. */
static int store_in_use(const ctxs_store *st)
{
    if (st->lock_fd < 0)
        return 0;
    struct flock fl = byte0(F_WRLCK);
#ifdef F_OFD_GETLK
    int cmd = F_OFD_GETLK;
#else
    int cmd = F_GETLK;
#endif
    if (ctxs__fcntl_lock(st->lock_fd, cmd, &fl) != 0)
        return -errno;
    return fl.l_type != F_UNLCK;
}

/* Removes the copy a compaction that died left behind. Holding the shared
 * lock, no compaction is in progress. */
static int remove_compact_tmp(const char *index_dir)
{
    char *tmp = ctxs__path_join(index_dir, COMPACT_TMP_FILE);
    if (!tmp)
        return CTXS_ENOMEM;
    int rc = ctxs__unlink(tmp) == 0 || errno == ENOENT ? 0 : -errno;
    free(tmp);
    return rc;
}

/*
 * LMDB keeps its reader table in index/lock.mdb, a shared mapping that it
 * writes at every transaction, through the mapping: a page that needs a
 * block when written faults with SIGBUS on a full disk (a sparse file's
 * hole; on btrfs, any page once written back, since copy on write puts
 * every write in a new block). So its blocks are allocated before LMDB
 * maps it, and a new one is made to be written in place (btrfs NOCOW, only
 * while empty; a store's older lock file gets it when compaction removes
 * the file). A full disk is then CTXS_EFULL here. Where the file cannot be
 * opened for writing (a read-only store), LMDB decides what to do.
 */
static int lock_file_prepare(const char *index_dir, unsigned max_readers)
{
    char *path = ctxs__path_join(index_dir, "lock.mdb");
    if (!path)
        return CTXS_ENOMEM;
    int fd = ctxs__open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    free(path);
    if (fd < 0)
        return 0;
    struct stat sb;
    if (ctxs__fstat(fd, &sb) == 0 && sb.st_size == 0)
        ctxs__file_in_place(fd);
    /* LMDB's size for it: a header and one 64-byte slot per reader, each
     * on its own cache line; twice that, in whole pages, is room enough. */
    uint64_t bytes = ((uint64_t)max_readers + 4) * 128;
    bytes = (bytes + 4095) / 4096 * 4096;
    int rc = 0;
#ifdef __linux__
    if (ctxs__fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, (off_t)bytes) != 0)
        rc = errno == ENOSPC || errno == EDQUOT ? CTXS_EFULL : 0;
#endif
    close(fd);
    return rc;
}

/* Creates and opens an environment on index_dir with flags. */
static int env_open_flags(MDB_env **out, const char *index_dir, unsigned flags,
                          unsigned max_readers, size_t map_bytes)
{
    if (!(flags & MDB_NOLOCK)) {
        int prep = lock_file_prepare(index_dir, max_readers);
        if (prep < 0)
            return prep == CTXS_EFULL ? ENOSPC : ENOMEM;
    }
    MDB_env *env;
    int rc = mdb_env_create(&env);
    if (rc != 0)
        return rc;
    if ((rc = mdb_env_set_maxdbs(env, 16)) == 0 &&
        (rc = mdb_env_set_maxreaders(env, max_readers)) == 0 &&
        (rc = mdb_env_set_mapsize(env, map_bytes)) == 0)
        rc = ctxs__mdb_env_open(env, index_dir, flags, 0600);
    if (rc != 0)
        mdb_env_close(env);
    else
        *out = env;
    return rc;
}

/*
 * A read-only store. MDB_RDONLY still writes LMDB's lock file
 * (index/lock.mdb: the reader table through which writers know which
 * pages readers still use), opened read-write; LMDB skips it only on a
 * read-only filesystem, where nobody can write the index. A user who may
 * read the store but not write it gets EACCES there. The way around is
 * MDB_NOLOCK, and its danger is the reader table: a writer that does not
 * see this reader may reuse the pages it reads (LMDB's author: "using
 * NOLOCK here would allow this process to get corrupted reads"). So it is
 * taken only when no other process has the store open now, as the store
 * lock tells; a writer that comes later is the caveat ctxstore.h states.
 */
static int env_open_rdonly(ctxs_store *st, const char *index_dir, unsigned max_readers,
                           size_t map_bytes)
{
    MDB_env *env;
    int rc = env_open_flags(&env, index_dir, MDB_NOTLS | MDB_RDONLY, max_readers, map_bytes);
    if (rc == EACCES || rc == EPERM) {
        int busy = store_in_use(st);
        if (busy != 0)
            return busy > 0 ? CTXS_EBUSY : busy;
        rc = env_open_flags(&env, index_dir, MDB_NOTLS | MDB_RDONLY | MDB_NOLOCK, max_readers,
                            map_bytes);
    }
    if (rc != 0)
        return ctxs__mdb_error(rc);
    st->env = env;
    return 0;
}

/* Whether st's sessions/ holds no session file (or is missing): what a
 * store whose creation died before its index was written looks like
 * (the index is made first). 1, 0, or -errno. */
static int no_session_files(const ctxs_store *st)
{
    DIR *d = opendir(st->sessions_dir);
    if (!d)
        return errno == ENOENT ? 1 : -errno;
    int none = 1;
    for (struct dirent *e; none && (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        none = !(len > 5 && strcmp(e->d_name + len - 5, ".ctxs") == 0);
    }
    closedir(d);
    return none;
}

/* Creates and opens st->env on index_dir; st->env stays NULL on failure.
 * The data file is checked first (check_file.c): LMDB would read a page
 * past the end of one cut short, and die of SIGBUS. The store lock is
 * held, so no compaction replaces the file between the check and the
 * open. */
static int env_open(ctxs_store *st, const char *index_dir, unsigned max_readers,
                    size_t map_bytes)
{
    char *data = ctxs__path_join(index_dir, "data.mdb");
    if (!data)
        return CTXS_ENOMEM;
    int rc = no_session_files(st);
    if (rc >= 0)
        rc = ctxs__index_file_check(data, rc);
    free(data);
    if (rc < 0)
        return rc;
    if (st->rdonly)
        return env_open_rdonly(st, index_dir, max_readers, map_bytes);
    MDB_env *env;
    rc = env_open_flags(&env, index_dir, MDB_NOTLS, max_readers, map_bytes);
    if (rc != 0)
        return ctxs__mdb_error(rc);
    /* Reader slots of processes that died would pin old pages forever. */
    int dead;
    mdb_reader_check(env, &dead);
    st->env = env;
    return 0;
}

/* Whether path is a regular file (1), is not (0), or cannot be told. */
static int is_file(const char *path)
{
    struct stat sb;
    if (ctxs__stat(path, &sb) == 0)
        return S_ISREG(sb.st_mode);
    return errno == ENOENT || errno == ENOTDIR ? 0 : -errno;
}

/* Where no store is, without CTXS_STORE_CREATE: nothing is made. The index
 * is what makes a directory a store (a sessions/ alone could be anybody's,
 * and it is also what a lost index leaves; see ctxs_store_open()). */
static int check_is_store(const char *index_dir)
{
    char *data = ctxs__path_join(index_dir, "data.mdb");
    if (!data)
        return CTXS_ENOMEM;
    int rc = is_file(data);
    free(data);
    return rc < 0 ? rc : rc ? 0 : CTXS_EFOREIGN;
}

/* A store is made index first: a create that dies leaves a directory that
 * is either no store or one whose sessions/ a read-write open makes. */
static int store_init(ctxs_store *st, const char *dir, unsigned flags,
                      const ctxs_store_options *o)
{
    int rc, create = (flags & CTXS_STORE_CREATE) != 0;
    char *index_dir = NULL;
    st->rdonly = (flags & CTXS_RDONLY) != 0;
    /* The store directory may be a symlink (or a chain of them) to one:
     * it is followed here, once, and the handle knows the store by the
     * real path and by the target's device and inode, so two paths to one
     * store share a handle. A dangling link is refused (-ENOENT), even
     * with CTXS_STORE_CREATE: a store is never made at the far end of a
     * link. Inside the store, sessions/ is opened without following a link,
 * and a create refuses an index/ that is one (-ENOTDIR); an existing
 * store whose index/ was made a link by hand is opened through it. */
    /* What this open makes is durable before it returns: a store whose
     * directories a power loss took back would not open (index/) or would
     * not open read-only (sessions/), and the files in them would go with
     * them. made: 1 the store directory, 2 a directory in it. */
    int made = 0;
    if (create) {
        if ((rc = make_store_dir(dir)) < 0)
            return rc;
        made = rc;
    }
    if (!(st->dir = realpath(dir, NULL)))
        return -errno;
    struct stat sb;
    if (ctxs__stat(st->dir, &sb) != 0)
        return -errno;
    if (!S_ISDIR(sb.st_mode))
        return -ENOTDIR;
    if (!(st->sessions_dir = ctxs__path_join(st->dir, "sessions")) ||
        !(index_dir = ctxs__path_join(st->dir, "index")))
        rc = CTXS_ENOMEM;
    else if ((rc = ctxs__index_dir_check(index_dir)) == 0)
        rc = create ? make_dir(index_dir) : check_is_store(index_dir);
    made |= rc > 0 ? 2 : 0;
    rc = rc > 0 ? 0 : rc;
    if (rc == 0)
        rc = store_lock_take(st, index_dir);
    if (rc == 0)
        rc = env_open(st, index_dir, o->max_readers, (size_t)o->map_bytes);
    int fresh = 0;
    if (rc == 0)
        rc = open_tables(st, &fresh);
    /* Only once the index is known to be ours: the file is ours too. */
    if (rc == 0 && !st->rdonly)
        rc = remove_compact_tmp(index_dir);
    free(index_dir);
    /* Made here in a half-made store; a read-only one cannot. */
    if (rc == 0 && !st->rdonly && (rc = make_dir(st->sessions_dir)) > 0)
        made |= 2, rc = 0;
    if (rc == 0 && (made & 2))
        rc = ctxs__sync_dir(st->dir);
    if (rc == 0 && (made & 1))
        rc = ctxs__sync_parent_dir(st->dir);
    if (rc == 0) {
        st->sessions_fd =
            ctxs__open(st->sessions_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        if (st->sessions_fd < 0)
            rc = -errno;
    }
    /* What crashes left, and the index of a new store beside session files
     * (the old one was lost): only a store that may write mends. */
    if (rc == 0 && !st->rdonly)
        rc = ctxs__intents_resolve(st);
    if (rc == 0 && fresh)
        rc = ctxs_store_reindex(NULL, st);
    return rc;
}

/* A read-only handle to owner, which this process has open read-write:
 * LMDB allows one environment per file per process, so it shares owner's
 * and holds a reference on it. Called with stores_mutex held. */
static int view_new(ctxs_store **out, ctxs_store *owner)
{
    ctxs_store *v = ctxs__calloc(1, sizeof(*v));
    if (!v)
        return CTXS_ENOMEM;
    *v = *owner;
    v->dir = v->sessions_dir = NULL;
    v->lock_fd = -1;
    v->next = NULL;
    v->hooks = NULL;
    v->hooks_arg = NULL;
    v->hooks_users = 0;
    v->refs = 1;
    v->rdonly = 1;
    v->owner = owner;
    v->sessions_fd = ctxs__dup(owner->sessions_fd);
    if (v->sessions_fd < 0 || !(v->dir = strdup(owner->dir)) ||
        !(v->sessions_dir = strdup(owner->sessions_dir))) {
        int rc = v->sessions_fd < 0 ? -errno : CTXS_ENOMEM;
        v->owner = NULL;
        v->env = NULL;
        store_free(v);
        return rc;
    }
    owner->refs++;
    *out = v;
    return 0;
}

static int store_open(ctxs_store **out, const char *dir, unsigned flags,
                      const ctxs_store_options *opts);

/* What a failed open of the store at dir means, where the failure said
 * nothing itself. */
static int open_failed(int rc, const char *dir, unsigned flags)
{
    switch (rc) {
    case -ENOENT:
        return ctxs__error_default(rc, "%s: no such store%s", dir,
                                   flags & CTXS_STORE_CREATE
                                       ? " (a symbolic link that leads nowhere, or a "
                                         "missing parent directory)"
                                       : " (CTXS_STORE_CREATE makes one)");
    case -ENOTDIR:
        return ctxs__error_default(rc, "%s is not a directory: a store is a directory "
                                   "(index/ and sessions/)", dir);
    case CTXS_EFOREIGN:
        return ctxs__error_default(rc, "%s is a directory that is not a store: it has no "
                                   "index/data.mdb%s", dir,
                                   flags & CTXS_STORE_CREATE ? "" : " (CTXS_STORE_CREATE "
                                                                    "makes a store there)");
    case -EACCES:
    case -EPERM:
        return ctxs__error_default(rc, "%s: %s", dir, strerror(-rc));
    case CTXS_EBUSY:
        return ctxs__error_default(rc, "%s is open read-only in this process, whose "
                                   "environment cannot write: close that handle first",
                                   dir);
    default:
        return rc;
    }
}

int ctxs_store_open(ctxs_store **out, const char *dir, unsigned flags,
                    const ctxs_store_options *opts)
{
    ctxs__error_begin();
    int rc = store_open(out, dir, flags, opts);
    return rc < 0 && dir ? open_failed(rc, dir, flags) : rc;
}

static int store_open(ctxs_store **out, const char *dir, unsigned flags,
                      const ctxs_store_options *opts)
{
    CTXS__REQUIRE(out, "out is NULL");
    *out = NULL;
    CTXS__REQUIRE(dir && *dir, "the store's directory is %s", dir ? "an empty string" : "NULL");
    CTXS__REQUIRE(!(flags & ~(CTXS_STORE_CREATE | CTXS_RDONLY)),
                  "flags 0x%x: only CTXS_STORE_CREATE and CTXS_RDONLY are known", flags);
    CTXS__REQUIRE(!(flags & CTXS_STORE_CREATE && flags & CTXS_RDONLY),
                  "CTXS_STORE_CREATE with CTXS_RDONLY: a read-only open makes nothing");
    ctxs_store_options o = CTXS_STORE_OPTIONS_INIT;
    if (opts) {
        CTXS__REQUIRE(opts->version == CTXS_STORE_OPTIONS_VERSION,
                      "store options: version is %u, not %u: start from "
                      "CTXS_STORE_OPTIONS_INIT", opts->version, CTXS_STORE_OPTIONS_VERSION);
        if (!options_valid(opts))
            return ctxs__error(CTXS_EINVAL, "store options: max_readers or map_bytes out of "
                               "range, or reserved bytes not zero");
        o = *opts;
    }
    pthread_once(&atfork_once, install_atfork);

    int rdonly = (flags & CTXS_RDONLY) != 0;
    pthread_mutex_lock(&stores_mutex);
    struct stat sb;
    if (ctxs__stat(dir, &sb) == 0) {
        for (ctxs_store *st = stores_head; st; st = st->next)
            if (st->dev == sb.st_dev && st->ino == sb.st_ino) {
                int rc = 0;
                if (st->rdonly && !rdonly)
                    rc = CTXS_EBUSY; /* its environment cannot write */
                else if (rdonly && !st->rdonly)
                    rc = view_new(out, st);
                else
                    st->refs++, *out = st;
                pthread_mutex_unlock(&stores_mutex);
                return rc;
            }
    }
    ctxs_store *st = ctxs__calloc(1, sizeof(*st));
    int rc = st ? 0 : CTXS_ENOMEM;
    if (st) {
        st->sessions_fd = -1;
        st->lock_fd = -1;
        if ((rc = store_init(st, dir, flags, &o)) == 0 && ctxs__stat(st->dir, &sb) != 0)
            rc = -errno;
    }
    if (rc < 0) {
        if (st)
            store_free(st);
        pthread_mutex_unlock(&stores_mutex);
        return rc;
    }
    st->dev = sb.st_dev;
    st->ino = sb.st_ino;
    st->refs = 1;
    st->next = stores_head;
    stores_head = st;
    pthread_mutex_unlock(&stores_mutex);
    *out = st;
    return 0;
}

void ctxs__store_ref(ctxs_store *st)
{
    pthread_mutex_lock(&stores_mutex);
    st->refs++;
    pthread_mutex_unlock(&stores_mutex);
}

void ctxs__store_unref(ctxs_store *st)
{
    pthread_mutex_lock(&stores_mutex);
    if (--st->refs > 0) {
        pthread_mutex_unlock(&stores_mutex);
        return;
    }
    for (ctxs_store **p = &stores_head; *p; p = &(*p)->next)
        if (*p == st) {
            *p = st->next;
            break;
        }
    pthread_mutex_unlock(&stores_mutex);
    ctxs_store *owner = st->owner;
    store_free(st);
    if (owner)
        ctxs__store_unref(owner);
}

void ctxs_store_close(ctxs_store *st)
{
    if (st)
        ctxs__store_unref(st);
}

/* --- Compaction ----------------------------------------------------------- */

static uint64_t file_disk_bytes(const char *path)
{
    struct stat sb;
    return ctxs__stat(path, &sb) == 0 ? (uint64_t)sb.st_blocks * 512u : 0;
}

/* 0 if the copy at path opens as an environment whose tables hold as many
 * entries as st's (which nobody changes meanwhile), else -EIO. */
static int copy_matches(ctxs_store *st, const char *path, size_t map_bytes)
{
    MDB_env *env;
    MDB_txn *copy = NULL, *orig = NULL;
    if (mdb_env_create(&env) != 0)
        return -EIO;
    int rc;
    if ((rc = mdb_env_set_maxdbs(env, 16)) == 0 &&
        (rc = mdb_env_set_mapsize(env, map_bytes)) == 0 &&
        (rc = ctxs__mdb_env_open(env, path, MDB_NOSUBDIR | MDB_RDONLY | MDB_NOLOCK, 0600)) == 0 &&
        (rc = ctxs__mdb_txn_begin(env, NULL, MDB_RDONLY, &copy)) == 0)
        rc = ctxs__mdb_txn_begin(st->env, NULL, MDB_RDONLY, &orig);
    for (size_t i = 0; rc == 0 && i < ctxs__n_tables; i++) {
        const MDB_dbi *mine = (const MDB_dbi *)(const void *)((const char *)st + ctxs__tables[i].offset);
        MDB_dbi dbi;
        MDB_stat a, b;
        if ((rc = ctxs__mdb_dbi_open(copy, ctxs__tables[i].name, ctxs__tables[i].flags, &dbi)) == 0 &&
            (rc = mdb_stat(copy, dbi, &a)) == 0 && (rc = mdb_stat(orig, *mine, &b)) == 0 &&
            a.ms_entries != b.ms_entries)
            rc = EIO;
    }
    if (orig)
        mdb_txn_abort(orig);
    if (copy)
        mdb_txn_abort(copy);
    mdb_env_close(env);
    return rc == 0 ? 0 : -EIO;
}

/* Writes the compacted copy, checks it, and puts it in place of data.mdb;
 * st->env is reopened on whichever file is then in place. Called with the
 * store lock held exclusively and st the only handle. */
static int index_swap(ctxs_store *st, const char *index_dir, const char *data,
                      const char *lock_mdb, const char *tmp)
{
    MDB_envinfo info;
    unsigned readers;
    int rc;
    if ((rc = mdb_env_info(st->env, &info)) != 0 ||
        (rc = mdb_env_get_maxreaders(st->env, &readers)) != 0)
        return ctxs__mdb_error(rc);
    /* No other process has the environment open: reader slots still taken
     * belong to dead ones, and would only pin pages. */
    int dead;
    mdb_reader_check(st->env, &dead);
    if (ctxs__unlink(tmp) != 0 && errno != ENOENT)
        return -errno;
    int fd = ctxs__open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return -errno;
    rc = ctxs__mdb_error(mdb_env_copyfd2(st->env, fd, MDB_CP_COMPACT));
    if (rc == 0 && ctxs__fsync(fd) != 0)
        rc = errno == ENOSPC || errno == EDQUOT ? CTXS_EFULL : -errno;
    if (close(fd) != 0 && rc == 0)
        rc = -errno;
    if (rc == 0)
        rc = copy_matches(st, tmp, info.me_mapsize);
    if (rc < 0) {
        ctxs__unlink(tmp);
        return rc;
    }

    /* The copy is complete and durable. rename() puts it in place
     * atomically: a crash leaves either index whole. */
    mdb_env_close(st->env);
    st->env = NULL;
    if (ctxs__rename(tmp, data) != 0) {
        rc = -errno;
        ctxs__unlink(tmp);
    } else {
        /* The lock file describes the old data file (its last transaction
         * id, its readers). LMDB resets it when it opens it alone, as it
         * will; a fresh one makes sure of it even if a program that
         * ignores the store lock (mdb_stat) has the old one open. */
        ctxs__unlink(lock_mdb);
        rc = ctxs__sync_dir(index_dir);
    }
    int fresh = 0, r = env_open(st, index_dir, readers, info.me_mapsize);
    if (r == 0 && (r = open_tables(st, &fresh)) < 0) {
        mdb_env_close(st->env);
        st->env = NULL;
    }
    return r < 0 ? CTXS_EFAILED : rc;
}

int ctxs__index_compact(ctxs_store *st, uint64_t *bytes_before, uint64_t *bytes_after)
{
    char *index_dir = ctxs__path_join(st->dir, "index");
    char *data = index_dir ? ctxs__path_join(index_dir, "data.mdb") : NULL;
    char *lock_mdb = index_dir ? ctxs__path_join(index_dir, "lock.mdb") : NULL;
    char *tmp = index_dir ? ctxs__path_join(index_dir, COMPACT_TMP_FILE) : NULL;
    int rc = index_dir && data && lock_mdb && tmp ? 0 : CTXS_ENOMEM;
    *bytes_before = *bytes_after = rc == 0 ? file_disk_bytes(data) : 0;

    /* Held throughout: no handle of this process opens or takes a
     * reference on the store meanwhile. Other handles and the sessions
     * opened through the store share st->env: they count in refs. */
    pthread_mutex_lock(&stores_mutex);
    if (rc == 0 && st->refs != 1)
        rc = CTXS_EBUSY;
    int locked = 0;
    if (rc == 0 && (rc = store_lock(st->lock_fd, F_WRLCK, 0)) == 0)
        locked = 1;
    if (rc == 0)
        rc = index_swap(st, index_dir, data, lock_mdb, tmp);
    /* Back to shared: the same description's lock, so this cannot fail
     * for a conflict. */
    if (locked)
        store_lock(st->lock_fd, F_RDLCK, 0);
    pthread_mutex_unlock(&stores_mutex);

    if (rc == 0)
        *bytes_after = file_disk_bytes(data);
    free(index_dir);
    free(data);
    free(lock_mdb);
    free(tmp);
    return rc;
}
