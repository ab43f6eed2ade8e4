/*
 * Sessions by name: create, open, fork, rename, delete, list; and what the
 * index learns from the sessions it opened.
 *
 * The order of operations keeps files and index reconcilable after a crash
 * at any point. A create or fork first records its intent (pending[id]), then
 * writes the file, then indexes it and drops the intent in one transaction.
 * A delete drops the entries and records its intent in one transaction, then
 * unlinks the file, then drops the intent. Opening a store resolves what
 * intents remain (ctxs__intents_resolve): a file with no entry goes.
 *
 * An intent is dropped only once what it stands for is durable: an unlink
 * is a change to sessions/, which a power loss undoes until the directory
 * is synced (the index's own syncs cover data.mdb, not it), so the
 * directory is synced between the unlink and the transaction that drops
 * the intent. Otherwise a deleted session's file could come back with
 * neither an entry nor an intent, for a repair or reindex to adopt.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "index.h"
#include "lock.h"
#include "mdb_calls.h"
#include "platform.h"
#include "session_iface.h"

/* What a session handle opened through a store carries (hooks_arg). */
typedef struct store_link {
    ctxs_store *st;
    uint64_t id;
    uint64_t indexed_chunks; /* prefix chunks as of the last index update */
    uint64_t hook_chunks;    /* whole chunks the store's hooks were told of */
    int committed;           /* a commit since the open */
} store_link;

/* The link of a session to its store entry; ctxs__store_ref()s st. */
static store_link *link_new(ctxs_store *st, uint64_t id, const ctxs__session_rec *rec)
{
    store_link *link = ctxs__calloc(1, sizeof(*link));
    if (!link)
        return NULL;
    link->st = st;
    link->id = id;
    link->indexed_chunks = rec->prefix_tokens / CTXS_PREFIX_CHUNK;
    ctxs__store_ref(st);
    return link;
}

static void link_free(store_link *link)
{
    if (link) {
        ctxs__store_unref(link->st);
        free(link);
    }
}

static void on_commit(ctxs_session *s, void *arg);
static void on_close(ctxs_session *s, void *arg);
static void on_rollback(ctxs_session *s, uint64_t n_tokens, void *arg);
static const ctxs__session_hooks store_hooks = {on_commit, on_close, on_rollback};

/* --- Records ------------------------------------------------------------ */

int ctxs__session_get(ctxs__session_rec *out, MDB_txn *txn, ctxs_store *st,
                      const char *name, size_t len)
{
    MDB_val key = {len, (void *)name};
    return ctxs__record_get(out, sizeof(*out), txn, st->sessions, &key);
}

static int session_put(MDB_txn *txn, ctxs_store *st, const char *name, size_t len,
                       const ctxs__session_rec *rec)
{
    MDB_val key = {len, (void *)name}, val = {sizeof(*rec), (void *)rec};
    int rc = ctxs__mdb_put(txn, st->sessions, &key, &val, 0);
    uint8_t idk[8];
    ctxs__id_key(idk, rec->id);
    MDB_val ikey = {8, idk}, ival = {len, (void *)name};
    if (rc == 0)
        rc = ctxs__mdb_put(txn, st->ids, &ikey, &ival, 0);
    return ctxs__mdb_error(rc);
}

/* The name (into name[CTXS_NAME_MAX + 1]) and record of session id. */
static int session_by_id(MDB_txn *txn, ctxs_store *st, uint64_t id, char name[CTXS_NAME_MAX + 1],
                         ctxs__session_rec *rec)
{
    uint8_t idk[8];
    ctxs__id_key(idk, id);
    MDB_val key = {8, idk}, val;
    int rc = mdb_get(txn, st->ids, &key, &val);
    if (rc != 0)
        return ctxs__mdb_error(rc);
    if (val.mv_size == 0 || val.mv_size > CTXS_NAME_MAX)
        return CTXS_EINDEX;
    memcpy(name, val.mv_data, val.mv_size);
    name[val.mv_size] = '\0';
    if ((rc = ctxs__session_get(rec, txn, st, name, val.mv_size)) == 0 && rec->id != id)
        rc = CTXS_EINDEX;
    return rc;
}

int ctxs__session_name_of(char *name, ctxs_store *st, uint64_t id)
{
    MDB_txn *txn;
    int rc = ctxs__txn_begin(&txn, st, 1);
    if (rc < 0)
        return rc;
    ctxs__session_rec rec;
    rc = session_by_id(txn, st, id, name, &rec);
    mdb_txn_abort(txn);
    return rc;
}

/* sessions[name], in a read transaction of its own. */
int ctxs__no_session(const char *name)
{
    char shown[80];
    ctxs__name_shown(shown, name);
    return ctxs__error(CTXS_ENOTFOUND, "no session named '%s' in this store", shown);
}

int ctxs__name_taken(const char *name)
{
    char shown[80];
    ctxs__name_shown(shown, name);
    return ctxs__error(CTXS_ETAKEN, "a session named '%s' exists already: choose another "
                       "name, or rename or delete that session first", shown);
}

static int session_lookup(ctxs__session_rec *out, ctxs_store *st, const char *name, size_t len)
{
    MDB_txn *txn;
    int rc = ctxs__txn_begin(&txn, st, 1);
    if (rc < 0)
        return rc;
    rc = ctxs__session_get(out, txn, st, name, len);
    mdb_txn_abort(txn);
    return rc == CTXS_ENOTFOUND ? ctxs__no_session(name) : rc;
}

/* The ids this process is creating now (begin_create to adopt_new or
 * abandon_create): its own intents that a store open must leave alone. */
typedef struct creating {
    uint64_t id;
    struct creating *next;
} creating;
static pthread_mutex_t creating_lock = PTHREAD_MUTEX_INITIALIZER;
static creating *creating_head;

static void creating_enter(creating *c, uint64_t id)
{
    c->id = id;
    pthread_mutex_lock(&creating_lock);
    c->next = creating_head;
    creating_head = c;
    pthread_mutex_unlock(&creating_lock);
}

static void creating_leave(uint64_t id)
{
    pthread_mutex_lock(&creating_lock);
    for (creating **at = &creating_head; *at; at = &(*at)->next)
        if ((*at)->id == id) {
            creating *c = *at;
            *at = c->next;
            free(c);
            break;
        }
    pthread_mutex_unlock(&creating_lock);
}

/* Whether process pid exists and has not exited: a zombie (exited, not yet
 * reaped by its parent) will never write again. Where that cannot be told
 * (no /proc), a process that exists counts as running. These probes fail
 * safe (a creator taken for running keeps its intent a while longer), so
 * they bypass the fault-injection layer. */
static int process_running(pid_t pid)
{
    if (kill(pid, 0) != 0 && errno != EPERM)
        return 0;
#ifdef __linux__
    char path[32], line[512];
    snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno != ENOENT; /* gone since kill() */
    ssize_t n = read(fd, line, sizeof(line) - 1);
    close(fd);
    if (n <= 0)
        return 1;
    line[n] = '\0';
    /* "pid (comm) S ...": comm may itself hold ") ". */
    const char *comm_end = strrchr(line, ')');
    if (comm_end && comm_end[1] == ' ' && (comm_end[2] == 'Z' || comm_end[2] == 'X'))
        return 0;
#endif
    return 1;
}

/* Whether the create of id by process pid may be under way. */
static int creator_alive(uint32_t pid, uint64_t id)
{
    if ((pid_t)pid != getpid())
        return process_running((pid_t)pid);
    int found = 0;
    pthread_mutex_lock(&creating_lock);
    for (const creating *c = creating_head; c && !found; c = c->next)
        found = c->id == id;
    pthread_mutex_unlock(&creating_lock);
    return found;
}

/* Whether the file written aside for id named name belongs to a create
 * that may be under way, even before it locks the file: its process (the
 * pid in the name) is alive, or is this one and is creating id now. */
static int create_under_way(uint64_t id, const char *name)
{
    const char *at = strstr(name, ".tmp-");
    if (!at)
        return 0;
    char *end;
    errno = 0;
    long pid = strtol(at + 5, &end, 10);
    if (errno || end == at + 5 || *end != '-' || pid <= 0 || pid != (pid_t)pid)
        return 0;
    return creator_alive((uint32_t)pid, id);
}

int ctxs__aside_remove(ctxs_store *st, uint64_t id, const char *name)
{
    if (create_under_way(id, name))
        return CTXS_EBUSY;
    int fd = ctxs__openat(st->sessions_fd, name, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return 0; /* gone meanwhile, or not ours to open */
    int rc = ctxs__lock(fd, CTXS__LOCK_EXCLUSIVE);
    if (rc == 0)
        rc = ctxs__unlinkat(st->sessions_fd, name, 0) == 0;
    close(fd);
    return rc;
}

/* pending[id] = what, then the pid of this process (u32 LE). */
static int intent_put(MDB_txn *txn, ctxs_store *st, uint64_t id, enum ctxs__intent what)
{
    uint8_t idk[8];
    ctxs__id_key(idk, id);
    uint32_t pid = (uint32_t)getpid();
    uint8_t intent[5] = {(uint8_t)what, (uint8_t)pid, (uint8_t)(pid >> 8), (uint8_t)(pid >> 16),
                         (uint8_t)(pid >> 24)};
    MDB_val key = {8, idk}, val = {sizeof(intent), intent};
    return ctxs__mdb_error(ctxs__mdb_put(txn, st->pending, &key, &val, 0));
}

static int intent_drop(MDB_txn *txn, ctxs_store *st, uint64_t id)
{
    uint8_t idk[8];
    ctxs__id_key(idk, id);
    MDB_val key = {8, idk};
    int rc = ctxs__mdb_del(txn, st->pending, &key, NULL);
    return rc == MDB_NOTFOUND ? 0 : ctxs__mdb_error(rc);
}

/* The largest id key of dbi at or below CTXS__ID_MAX, or 0. */
static int largest_id(MDB_txn *txn, MDB_dbi dbi, uint64_t *out)
{
    *out = 0;
    MDB_cursor *cur;
    int rc = ctxs__mdb_cursor_open(txn, dbi, &cur);
    if (rc != 0)
        return ctxs__mdb_error(rc);
    uint8_t above[8];
    ctxs__id_key(above, CTXS__ID_MAX + 1);
    MDB_val key = {8, above}, val;
    /* Keys sort by id (big-endian first): the last key before the first
     * one past the range. */
    rc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE);
    rc = rc == 0 ? mdb_cursor_get(cur, &key, &val, MDB_PREV)
                 : rc == MDB_NOTFOUND ? mdb_cursor_get(cur, &key, &val, MDB_LAST) : rc;
    if (rc == 0 && key.mv_size >= 8)
        *out = ctxs__id_from_key(key.mv_data);
    mdb_cursor_close(cur);
    return rc == 0 || rc == MDB_NOTFOUND ? 0 : ctxs__mdb_error(rc);
}

int ctxs__ids_floor(MDB_txn *txn, ctxs_store *st, uint64_t *out)
{
    /* One read per table: keys lead with the id in big-endian, so the
     * largest is found at the end (O(log n) pages). pins and metadata are
     * 0 only in a read-only handle, which takes no ids. */
    MDB_dbi dbis[] = {st->ids, st->pending, st->checkpoints, st->chunks, st->metadata, st->pins};
    uint64_t top = 0;
    for (size_t i = 0; i < sizeof(dbis) / sizeof(dbis[0]); i++) {
        uint64_t id;
        int rc = dbis[i] ? largest_id(txn, dbis[i], &id) : 0;
        if (rc < 0)
            return rc;
        if (dbis[i] && id > top)
            top = id;
    }
    *out = top + 1; /* at most CTXS__ID_MAX + 1: no wrap */
    return 0;
}

int ctxs__next_id_repair(MDB_txn *txn, ctxs_store *st, uint64_t at_least, uint64_t *out)
{
    MDB_val key = {7, (void *)"next_id"}, val;
    uint64_t have = 1, floor;
    int rc = mdb_get(txn, st->meta, &key, &val);
    int whole = rc == 0 && val.mv_size == 8; /* present, of its size */
    if (whole)
        memcpy(&have, val.mv_data, 8);
    else if (rc == 0)
        have = 0; /* a value of another size: damaged */
    else if (rc != MDB_NOTFOUND)
        return ctxs__mdb_error(rc);
    if ((rc = ctxs__ids_floor(txn, st, &floor)) < 0)
        return rc;
    /* next_id only grows, and stays above every id in use. A value of 0
     * (an index written by hand, or a count that wrapped), one past the
     * largest id, or one at or below an id some row names (an index
     * restored from an old copy) is damage: it is taken up to just above
     * the largest id in use. That may give a deleted session's id again,
     * but only one no row of the index remembers. */
    uint64_t want = have;
    if (want == 0 || want > CTXS__ID_MAX || want < floor)
        want = floor;
    if (want < at_least)
        want = at_least;
    if (want > CTXS__ID_MAX)
        return CTXS_EFULL;
    if (out)
        *out = want;
    if (!whole || want != have) {
        val = (MDB_val){8, &want};
        return ctxs__mdb_error(ctxs__mdb_put(txn, st->meta, &key, &val, 0));
    }
    return 0;
}

int ctxs__id_take(MDB_txn *txn, ctxs_store *st, uint64_t *out)
{
    /* A file someone put at the next id (or an index restored from an old
     * copy) must not make creates fail: such ids are skipped. */
    int rc;
    for (int tries = 0;; tries++) {
        uint64_t id;
        if ((rc = ctxs__next_id_repair(txn, st, 1, &id)) < 0)
            return rc;
        if (id == CTXS__ID_MAX)
            return CTXS_EFULL; /* next_id would pass the range */
        uint64_t after = id + 1;
        MDB_val key = {7, (void *)"next_id"}, val = {8, &after};
        if ((rc = ctxs__mdb_error(ctxs__mdb_put(txn, st->meta, &key, &val, 0))) < 0)
            return rc;
        *out = id;
        char file[32];
        ctxs__file_name(file, id);
        if (faccessat(st->sessions_fd, file, F_OK, AT_SYMLINK_NOFOLLOW) != 0 || tries == 1000)
            return 0;
    }
}

int ctxs__session_unindex(MDB_txn *txn, ctxs_store *st, uint64_t id)
{
    char name[CTXS_NAME_MAX + 1];
    ctxs__session_rec rec;
    int rc = session_by_id(txn, st, id, name, &rec);
    if (rc < 0)
        return rc;
    MDB_val key = {strlen(name), name};
    uint8_t idk[8];
    ctxs__id_key(idk, id);
    MDB_val ikey = {8, idk};
    if ((rc = ctxs__mdb_error(ctxs__mdb_del(txn, st->sessions, &key, NULL))) < 0 ||
        (rc = ctxs__mdb_error(ctxs__mdb_del(txn, st->ids, &ikey, NULL))) < 0 ||
        (rc = ctxs__pin_drop(txn, st, id)) < 0 ||
        (rc = ctxs__prefix_drop(txn, st, id, rec.model_hash)) < 0)
        return rc;
    /* Its checkpoints: every key that starts with the id. */
    MDB_cursor *cur;
    if ((rc = ctxs__mdb_cursor_open(txn, st->checkpoints, &cur)) != 0)
        return ctxs__mdb_error(rc);
    MDB_val k = {8, idk}, v;
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE); rc == 0;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        if (k.mv_size < 8 || memcmp(k.mv_data, idk, 8) != 0)
            break;
        if ((rc = ctxs__mdb_cursor_del(cur, 0)) != 0)
            break;
    }
    mdb_cursor_close(cur);
    if (rc != 0 && rc != MDB_NOTFOUND)
        return ctxs__mdb_error(rc);
    return ctxs__meta_drop(txn, st, id);
}

/* --- What open sessions tell the index ------------------------------------ */

/* Updates the session's prefix entries and, at close, its counters and
 * last use. A failure here only delays what find_prefix can find: the
 * next update, open or reindex catches up. */
static int index_update(store_link *link, ctxs_session *s, int closing)
{
    ctxs_store *st = link->st;
    MDB_txn *txn;
    int rc = ctxs__txn_begin(&txn, st, 0);
    if (rc < 0)
        return rc;
    char name[CTXS_NAME_MAX + 1];
    ctxs__session_rec rec;
    const uint32_t *ids;
    uint64_t n_held = ctxs__session_prefix_held(&ids, s);
    if ((rc = session_by_id(txn, st, link->id, name, &rec)) == 0)
        rc = ctxs__prefix_update(txn, st, link->id, &rec, ids, n_held);
    if (rc == 0) {
        struct stat sb;
        ctxs_session_info info;
        ctxs_session_get_info(&info, s);
        rec.n_tokens = info.n_tokens;
        if (ctxs__fstat(ctxs__session_fd(s), &sb) == 0)
            rec.disk_bytes = (uint64_t)sb.st_blocks * 512u;
        if (closing)
            rec.last_used_unix_ms = ctxs__now_ms();
    }
    if (rc == 0)
        rc = session_put(txn, st, name, strlen(name), &rec);
    if ((rc = ctxs__txn_finish(txn, rc)) == 0)
        link->indexed_chunks = rec.prefix_tokens / CTXS_PREFIX_CHUNK;
    return rc;
}

static void on_commit(ctxs_session *s, void *arg)
{
    store_link *link = arg;
    uint64_t chunks = ctxs__session_prefix_held(NULL, s) / CTXS_PREFIX_CHUNK;
    uint64_t had = link->indexed_chunks;
    /* A new conversation's first chunk (a system prompt) is worth finding at
     * once; after that the index is brought up to date in batches, so that
     * an LMDB transaction is not on every commit's path. */
    if (chunks < had || (chunks > had && (had == 0 || chunks - had >= CTXS__PREFIX_FLUSH_CHUNKS)))
        index_update(link, s, 0);
    link->committed = 1;
    ctxs__store_hooks_session(link->st, link->id, ctxs__session_prefix_held(NULL, s),
                              CTXS__EVENT_COMMIT, &link->hook_chunks);
}

/* The chunks from the rollback point on will hold other tokens: the
 * count of chunks the hooks were told of comes down to it, so that the
 * next commit tells them of the rewritten chunks again. Without it a
 * commit that only regains the chunk count tells them nothing new, and
 * a copy they keep (the remote tier's) stays cut at the rollback. */
static void on_rollback(ctxs_session *s, uint64_t n_tokens, void *arg)
{
    (void)s;
    store_link *link = arg;
    if (link->hook_chunks > n_tokens / CTXS_PREFIX_CHUNK)
        link->hook_chunks = n_tokens / CTXS_PREFIX_CHUNK;
}

static void on_close(ctxs_session *s, void *arg)
{
    store_link *link = arg;
    ctxs_session_info info;
    ctxs_session_get_info(&info, s);
    if (!(info.flags & (CTXS_INFO_READONLY | CTXS_INFO_FAILED))) {
        index_update(link, s, 1);
        ctxs__store_hooks_session(link->st, link->id, ctxs__session_prefix_held(NULL, s),
                                  link->committed ? CTXS__EVENT_CLOSE_CHANGED
                                                  : CTXS__EVENT_CLOSE_UNCHANGED,
                                  &link->hook_chunks);
    }
    ctxs__session_set_hooks(s, NULL, NULL);
    link_free(link);
}

/* Cannot fail: whatever needs memory was done by link_new(). */
static void link_attach(ctxs_session *s, store_link *link)
{
    ctxs__session_set_hooks(s, &store_hooks, link);
}

ctxs_store *ctxs__session_store(const ctxs_session *s, uint64_t *id)
{
    void *arg;
    if (!s || ctxs__session_get_hooks(s, &arg) != &store_hooks)
        return NULL;
    const store_link *link = arg;
    *id = link->id;
    return link->st;
}

/* Whether the index's entries for s differ from what s holds (after a
 * crash, entries written in a batch may be missing). */
static int prefix_behind(const ctxs_session *s, const ctxs__session_rec *rec)
{
    const uint32_t *ids;
    uint64_t chunks = ctxs__session_prefix_held(&ids, s) / CTXS_PREFIX_CHUNK;
    uint64_t had = rec->prefix_tokens / CTXS_PREFIX_CHUNK;
    if (chunks != had)
        return 1;
    if (had == 0)
        return 0;
    uint8_t (*chain)[16] = ctxs__malloc(had * 16);
    if (!chain)
        return 1;
    ctxs__prefix_chains(chain, ids, had);
    int behind = memcmp(chain[had - 1], rec->prefix_chain, 16) != 0;
    free(chain);
    return behind;
}

/* --- Create, open, fork -------------------------------------------------- */

/* Step one of a create or fork: the name must be free, and the intent
 * comes first. */
static int begin_create(ctxs_store *st, const char *name, size_t len,
                        const ctxs_model *model, uint64_t *id)
{
    MDB_txn *txn;
    int rc = ctxs__txn_begin(&txn, st, 0);
    if (rc < 0)
        return rc;
    ctxs__session_rec rec;
    if (model)
        rc = ctxs__model_check(txn, st, model);
    if (rc == 0) {
        rc = ctxs__session_get(&rec, txn, st, name, len);
        rc = rc == 0 ? ctxs__name_taken(name) : rc == CTXS_ENOTFOUND ? 0 : rc;
    }
    if (rc == 0)
        rc = ctxs__id_take(txn, st, id);
    /* Known here as being created before any store open can see the
     * intent, and until it is adopted or abandoned. */
    creating *c = NULL;
    if (rc == 0 && !(c = ctxs__malloc(sizeof(*c))))
        rc = CTXS_ENOMEM;
    if (rc == 0) {
        creating_enter(c, *id);
        rc = intent_put(txn, st, *id, CTXS__INTENT_CREATE);
    }
    if ((rc = ctxs__txn_finish(txn, rc)) < 0 && c)
        creating_leave(*id);
    return rc;
}

/* Last step: index the new file under name, with its metadata (n_meta
 * entries of meta), and drop the intent, in one transaction. */
static int finish_create(ctxs_store *st, const char *name, size_t len,
                         ctxs__session_rec *rec, ctxs_session *s,
                         const ctxs__meta_item *meta, size_t n_meta)
{
    char parent[CTXS_NAME_MAX + 1];
    ctxs__session_rec from;
    MDB_txn *txn;
    int rc = ctxs__txn_begin(&txn, st, 0);
    if (rc < 0)
        return rc;
    ctxs__session_rec other;
    rc = ctxs__session_get(&other, txn, st, name, len);
    rc = rc == 0 ? ctxs__name_taken(name) : rc == CTXS_ENOTFOUND ? 0 : rc;
    const uint32_t *ids;
    uint64_t n_held = ctxs__session_prefix_held(&ids, s);
    if (rc == 0)
        rc = ctxs__prefix_update(txn, st, rec->id, rec, ids, n_held);
    if (rc == 0 && (rc = session_put(txn, st, name, len, rec)) == 0)
        rc = intent_drop(txn, st, rec->id);
    if (rc == 0 && n_meta)
        rc = ctxs__meta_put_all(txn, st, rec->id, meta, n_meta);
    /* A fork uses its source: gc must not take a prompt that is forked from
     * often for one nobody wants. (The source may be gone by now.) */
    if (rc == 0 && rec->parent_id && session_by_id(txn, st, rec->parent_id, parent, &from) == 0) {
        from.last_used_unix_ms = rec->last_used_unix_ms;
        rc = session_put(txn, st, parent, strlen(parent), &from);
    }
    return ctxs__txn_finish(txn, rc);
}

/* Undoes a create that failed after begin_create(). The intent goes only
 * once the unlink is durable: a file that came back without it would be
 * adopted by the next repair as a session nobody created. */
static void abandon_create(ctxs_store *st, uint64_t id, ctxs_session *s)
{
    char file[32];
    ctxs__file_name(file, id);
    int gone = 1;
    if (s) {
        gone = (ctxs__unlinkat(st->sessions_fd, file, 0) == 0 || errno == ENOENT) &&
               ctxs__fsync(st->sessions_fd) == 0;
        ctxs_session_close(s);
    }
    MDB_txn *txn;
    if (gone && ctxs__txn_begin(&txn, st, 0) == 0) {
        if (intent_drop(txn, st, id) == 0)
            ctxs__txn_commit(txn);
        else
            mdb_txn_abort(txn);
    }
    creating_leave(id); /* an intent left now is any store open's to resolve */
}

/* Indexes and links a session file just created as id (with its label);
 * on failure undoes it all. */
static int adopt_new(ctxs_store *st, const char *name, size_t len, ctxs__session_rec *rec,
                     ctxs_session *s, const ctxs__meta_item *meta, size_t n_meta)
{
    /* Nothing may fail once the entry is committed: the link is made first. */
    store_link *link = link_new(st, rec->id, rec);
    int rc = link ? finish_create(st, name, len, rec, s, meta, n_meta) : CTXS_ENOMEM;
    if (rc == 0) {
        link_attach(s, link);
        creating_leave(rec->id);
    } else {
        link_free(link);
        abandon_create(st, rec->id, s);
    }
    return rc;
}

int ctxs_store_session_create(ctxs_session **out, ctxs_store *st, const char *name,
                              const ctxs_model *model, const ctxs_create_options *opts)
{
    ctxs__error_begin();
    CTXS__REQUIRE(out, "out is NULL");
    *out = NULL;
    size_t len;
    CTXS__STORE_CHECK(st);
    CTXS__REQUIRE(model, "model is NULL: a session is created for a registered model");
    if (ctxs__name_check(name, &len) < 0)
        return CTXS_EINVAL;
    uint64_t id;
    int rc = begin_create(st, name, len, model, &id);
    if (rc < 0)
        return rc;
    char *path = ctxs__file_path(st, id);
    ctxs_session *s = NULL;
    ctxs__disk_label label;
    ctxs__label_make(&label, id, name, len);
    rc = path ? ctxs__session_create_labeled(&s, path, model, opts, &label) : CTXS_ENOMEM;
    free(path);
    if (rc < 0) {
        abandon_create(st, id, NULL);
        return rc;
    }
    uint64_t now = ctxs__now_ms();
    ctxs_session_info info;
    ctxs_session_get_info(&info, s);
    ctxs__session_rec rec = {.id = id, .created_unix_ms = info.created_unix_ms,
                             .last_used_unix_ms = now};
    memcpy(rec.model_hash, model->model_hash, 16);
    if ((rc = adopt_new(st, name, len, &rec, s, NULL, 0)) == 0)
        *out = s;
    return rc;
}

/* ctxs__store_session_create_filled's fill, with the label made for the
 * id begin_create() took. */
typedef struct label_fill {
    ctxs__label_fill_fn fill;
    void *arg;
    ctxs__disk_label label;
} label_fill;

static int fill_labeled(int fd, void *arg)
{
    label_fill *lf = arg;
    return lf->fill(fd, &lf->label, lf->arg);
}

int ctxs__store_session_create_filled(ctxs_session **out, ctxs_store *st, const char *name,
                                      size_t len, const ctxs_model *model,
                                      const char *model_name, const ctxs__meta_item *meta,
                                      size_t n_meta, ctxs__label_fill_fn fill, void *arg)
{
    *out = NULL;
    uint64_t id;
    int rc = begin_create(st, name, len, NULL, &id);
    if (rc < 0)
        return rc;
    char *path = ctxs__file_path(st, id);
    label_fill lf = {.fill = fill, .arg = arg};
    ctxs__label_make(&lf.label, id, name, len);
    ctxs_open_options o = CTXS_OPEN_OPTIONS_INIT;
    ctxs_session *s = NULL;
    rc = path ? ctxs__create_file(&s, path, model, &o, fill_labeled, &lf) : CTXS_ENOMEM;
    free(path);
    /* The model is registered only once the file stands, so that a fill
     * that fails leaves the store as it was. */
    ctxs_model_entry known;
    if (rc == 0 && (rc = ctxs_model_get(&known, st, model->model_hash)) == CTXS_ENOTFOUND)
        rc = ctxs_model_register(st, model, model_name && *model_name ? model_name : NULL);
    else if (rc == 0 && (memcmp(&known.model.geometry, &model->geometry, sizeof(model->geometry)) ||
                         memcmp(known.model.tokenizer_hash, model->tokenizer_hash, 16))) {
        rc = ctxs__model_differs(&known.model, model);
    }
    if (rc < 0) {
        abandon_create(st, id, s);
        return rc;
    }
    ctxs_session_info info;
    ctxs_session_get_info(&info, s);
    ctxs__session_rec rec = {.id = id, .n_tokens = info.n_tokens,
                             .created_unix_ms = info.created_unix_ms,
                             .last_used_unix_ms = ctxs__now_ms()};
    memcpy(rec.model_hash, model->model_hash, 16);
    if ((rc = adopt_new(st, name, len, &rec, s, meta, n_meta)) == 0)
        *out = s;
    return rc;
}

/* Opens the file of id as ctxs_session_open() does, and makes sure it is
 * still the indexed one: a delete may have unlinked it meanwhile. */
static int open_file(ctxs_session **out, ctxs_store *st, uint64_t id,
                     const ctxs_model *model, unsigned flags,
                     const ctxs_open_options *opts)
{
    char *path = ctxs__file_path(st, id);
    if (!path)
        return CTXS_ENOMEM;
    int rc = ctxs_session_open(out, path, model, flags, opts);
    if (rc == -ENOENT)
        rc = ctxs__error(CTXS_ENOTFOUND, "the session's file %s is gone (`ctxstore "
                         "repair` drops its entry)", path);
    free(path);
    if (rc < 0)
        return rc;
    struct stat sb;
    if (rc == 0 && ctxs__fstat(ctxs__session_fd(*out), &sb) == 0 && sb.st_nlink == 0) {
        ctxs_session_close(*out);
        *out = NULL;
        rc = CTXS_ENOTFOUND;
    }
    return rc;
}

int ctxs_store_session_open(ctxs_session **out, ctxs_store *st, const char *name,
                            const ctxs_model *model, unsigned flags,
                            const ctxs_open_options *opts)
{
    ctxs__error_begin();
    CTXS__REQUIRE(out, "out is NULL");
    *out = NULL;
    size_t len;
    CTXS__STORE_CHECK(st);
    if (ctxs__name_check(name, &len) < 0)
        return CTXS_EINVAL;
    if (st->rdonly && !(flags & CTXS_RDONLY))
        return ctxs__store_readonly();
    ctxs__session_rec rec;
    int rc = session_lookup(&rec, st, name, len);
    if (rc == CTXS_ENOTFOUND && !st->rdonly)
        rc = ctxs__store_hooks_missing(st, name) == 0 ? session_lookup(&rec, st, name, len)
                                                      : ctxs__no_session(name);
    if (rc < 0)
        return rc;
    if (model && memcmp(model->model_hash, rec.model_hash, 16) != 0) {
        char shown[80];
        ctxs__name_shown(shown, name);
        return ctxs__error(CTXS_EMODEL, "session '%s' belongs to another model (its model "
                           "hash differs from the one given)", shown);
    }
    ctxs_session *s;
    if ((rc = open_file(&s, st, rec.id, model, flags, opts)) < 0)
        return rc;
    store_link *link = link_new(st, rec.id, &rec);
    if (!link) {
        ctxs_session_close(s);
        return CTXS_ENOMEM;
    }
    link_attach(s, link);
    ctxs_session_info info;
    ctxs_session_get_info(&info, s);
    if (!(info.flags & CTXS_INFO_READONLY) && prefix_behind(s, &rec))
        index_update(link, s, 0);
    *out = s;
    return 0;
}

static int fork_at(ctxs_session **out, ctxs_store *st, const char *src, uint64_t n_tokens,
                   const char *checkpoint, const char *dst, const ctxs_open_options *opts)
{
    if (out)
        *out = NULL;
    size_t src_len, dst_len, cp_len = 0;
    CTXS__STORE_CHECK(st);
    if (ctxs__name_check(src, &src_len) < 0 || ctxs__name_check(dst, &dst_len) < 0 ||
        (checkpoint && ctxs__name_check(checkpoint, &cp_len) < 0))
        return CTXS_EINVAL;
    MDB_txn *txn;
    int rc = ctxs__txn_begin(&txn, st, 1);
    if (rc < 0)
        return rc;
    ctxs__session_rec src_rec = {0};
    ctxs__checkpoint_rec cp = {0};
    if ((rc = ctxs__session_get(&src_rec, txn, st, src, src_len)) == CTXS_ENOTFOUND)
        rc = ctxs__no_session(src);
    else if (rc == 0 && checkpoint &&
             (rc = ctxs__checkpoint_get(&cp, txn, st, src_rec.id, checkpoint, cp_len)) ==
                 CTXS_ENOTFOUND)
        rc = ctxs__no_checkpoint(src, checkpoint);
    mdb_txn_abort(txn);
    if (rc < 0)
        return rc;
    if (checkpoint)
        n_tokens = cp.n_tokens;

    ctxs_session *from;
    if ((rc = open_file(&from, st, src_rec.id, NULL, CTXS_RDONLY, NULL)) < 0)
        return rc;
    if (checkpoint && (rc = ctxs__checkpoint_check(from, &cp)) < 0) {
        ctxs_session_close(from);
        return rc;
    }
    uint64_t id;
    if ((rc = begin_create(st, dst, dst_len, NULL, &id)) < 0) {
        ctxs_session_close(from);
        return rc;
    }
    char *path = ctxs__file_path(st, id);
    ctxs_session *s = NULL;
    ctxs__disk_label label;
    ctxs__label_make(&label, id, dst, dst_len);
    rc = path ? ctxs__session_fork_labeled(&s, from, path, n_tokens, opts, &label) : CTXS_ENOMEM;
    free(path);
    ctxs_session_close(from);
    if (rc < 0 && ctxs__error_code() == rc) {
        char shown[80];
        ctxs__name_shown(shown, src);
        ctxs__error_more(rc, "fork of '%s'", shown);
    }
    /* The checkpoint was checked before the copy; the copy is checked
     * against it too, in case the source moved in between. */
    if (rc == 0 && checkpoint && ctxs__checkpoint_check(s, &cp) < 0)
        rc = CTXS_ESTALE;
    if (rc < 0) {
        abandon_create(st, id, s);
        return rc;
    }
    /* All tokens: what the source held when the fork read it. */
    ctxs_session_info info;
    ctxs_session_get_info(&info, s);
    if (n_tokens == UINT64_MAX)
        n_tokens = info.n_tokens;
    uint64_t now = ctxs__now_ms();
    ctxs__session_rec rec = {.id = id, .n_tokens = n_tokens,
                             .created_unix_ms = info.created_unix_ms,
                             .last_used_unix_ms = now, .parent_id = src_rec.id,
                             .fork_tokens = n_tokens};
    memcpy(rec.model_hash, src_rec.model_hash, 16);
    /* The copy's writeback starts once the index is durable: its
     * transaction does not then wait for 288 MiB of new blocks. */
    /* No metadata: a fork is a new conversation (ctxstore.h, "Metadata"). */
    if ((rc = adopt_new(st, dst, dst_len, &rec, s, NULL, 0)) < 0)
        return rc;
    if (info.durability == CTXS_SYNC_ASYNC)
        ctxs__writeback_request_all(s);
    if (out)
        *out = s;
    else
        ctxs_session_close(s);
    return 0;
}

int ctxs_store_session_fork(ctxs_session **out, ctxs_store *st, const char *src,
                            const char *name, uint64_t n_tokens, const ctxs_open_options *opts)
{
    ctxs__error_begin();
    return fork_at(out, st, src, n_tokens, NULL, name, opts);
}

int ctxs_store_session_fork_checkpoint(ctxs_session **out, ctxs_store *st, const char *src,
                                       const char *checkpoint, const char *name,
                                       const ctxs_open_options *opts)
{
    ctxs__error_begin();
    CTXS__REQUIRE(checkpoint, "checkpoint is NULL");
    return fork_at(out, st, src, 0, checkpoint, name, opts);
}

/* --- Listing, renaming, deleting ----------------------------------------- */

static void entry_fill(ctxs_session_entry *out, const char *name, size_t len,
                       const ctxs__session_rec *rec)
{
    memset(out, 0, sizeof(*out));
    memcpy(out->name, name, len);
    out->id = rec->id;
    memcpy(out->model_hash, rec->model_hash, 16);
    out->n_tokens = rec->n_tokens;
    out->disk_bytes = rec->disk_bytes;
    out->created_unix_ms = rec->created_unix_ms;
    out->last_used_unix_ms = rec->last_used_unix_ms;
    out->parent_id = rec->parent_id;
    out->fork_tokens = rec->fork_tokens;
}

int ctxs_store_session_get(ctxs_session_entry *out, ctxs_store *st, const char *name)
{
    ctxs__error_begin();
    size_t len;
    CTXS__REQUIRE(out, "out is NULL");
    CTXS__STORE_CHECK(st);
    if (ctxs__name_check(name, &len) < 0)
        return CTXS_EINVAL;
    MDB_txn *txn;
    int rc = ctxs__txn_begin(&txn, st, 1);
    if (rc < 0)
        return rc;
    ctxs__session_rec rec;
    if ((rc = ctxs__session_get(&rec, txn, st, name, len)) == 0) {
        entry_fill(out, name, len, &rec);
        rc = ctxs__pins_fill(out, 1, txn, st);
    }
    mdb_txn_abort(txn);
    return rc == CTXS_ENOTFOUND ? ctxs__no_session(name) : rc;
}

static int session_entry_fill(void *entry, const MDB_val *key, const MDB_val *val)
{
    ctxs__session_rec rec;
    if (key->mv_size == 0 || key->mv_size > CTXS_NAME_MAX || val->mv_size != sizeof(rec))
        return CTXS_EINDEX;
    memcpy(&rec, val->mv_data, sizeof(rec));
    entry_fill(entry, key->mv_data, key->mv_size, &rec);
    return 0;
}

int ctxs_store_session_list(ctxs_session_entry **out, size_t *n_out, ctxs_store *st)
{
    ctxs__error_begin();
    if (!out || !n_out)
        return CTXS_EINVAL;
    *out = NULL;
    *n_out = 0;
    if (!st)
        return CTXS_EINVAL;
    int rc = ctxs__list((void **)out, n_out, st, st->sessions, sizeof(**out), session_entry_fill);
    /* The pins in a transaction of their own: a pin or unpin in between
     * shows one way or the other, as it would a moment later. */
    MDB_txn *txn;
    if (rc == 0 && *n_out && (rc = ctxs__txn_begin(&txn, st, 1)) == 0) {
        rc = ctxs__pins_fill(*out, *n_out, txn, st);
        mdb_txn_abort(txn);
    }
    if (rc < 0) {
        free(*out);
        *out = NULL;
        *n_out = 0;
    }
    return rc;
}

int ctxs_store_session_rename(ctxs_store *st, const char *from, const char *to)
{
    ctxs__error_begin();
    size_t from_len, to_len;
    CTXS__STORE_CHECK(st);
    if (ctxs__name_check(from, &from_len) < 0 || ctxs__name_check(to, &to_len) < 0)
        return CTXS_EINVAL;
    if (st->rdonly)
        return ctxs__store_readonly();
    MDB_txn *txn;
    int rc = ctxs__txn_begin(&txn, st, 0);
    if (rc < 0)
        return rc;
    ctxs__session_rec rec, other;
    if ((rc = ctxs__session_get(&rec, txn, st, from, from_len)) == 0) {
        rc = ctxs__session_get(&other, txn, st, to, to_len);
        rc = rc == 0                ? (other.id == rec.id ? 1 : ctxs__name_taken(to))
             : rc == CTXS_ENOTFOUND ? 0
                                    : rc;
    } else if (rc == CTXS_ENOTFOUND) {
        rc = ctxs__no_session(from);
    }
    /* The file's label first, inside the transaction that serializes
     * renames: reindex takes names from the labels. */
    if (rc == 0) {
        char file[32];
        ctxs__file_name(file, rec.id);
        int fd = ctxs__openat(st->sessions_fd, file, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd >= 0) {
            rc = ctxs__label_write(fd, rec.id, to, to_len);
            close(fd);
        } else if (errno != ENOENT) {
            rc = -errno;
        }
    }
    MDB_val key = {from_len, (void *)from};
    if (rc == 0 && (rc = ctxs__mdb_error(ctxs__mdb_del(txn, st->sessions, &key, NULL))) == 0)
        rc = session_put(txn, st, to, to_len, &rec);
    if (rc != 0) {
        mdb_txn_abort(txn);
        return rc > 0 ? 0 : rc;
    }
    return ctxs__txn_commit(txn);
}

int ctxs__session_delete_id(ctxs_store *st, uint64_t id, const char *expect_name,
                            size_t expect_len, int keep_pinned)
{
    char file[32];
    ctxs__file_name(file, id);
    int fd = ctxs__openat(st->sessions_fd, file, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0 && errno != ENOENT)
        return -errno;
    int rc = fd >= 0 ? ctxs__lock(fd, CTXS__LOCK_EXCLUSIVE) : 0;
    MDB_txn *txn = NULL;
    if (rc == 0)
        rc = ctxs__txn_begin(&txn, st, 0);
    if (rc == 0 && expect_name) {
        ctxs__session_rec rec;
        if ((rc = ctxs__session_get(&rec, txn, st, expect_name, expect_len)) == 0 &&
            rec.id != id)
            rc = CTXS_ENOTFOUND;
    }
    /* Asked in the transaction that deletes: a pin taken since the caller
     * looked is seen. */
    if (rc == 0 && keep_pinned) {
        ctxs_session_entry e = {.id = id};
        if ((rc = ctxs__pins_fill(&e, 1, txn, st)) == 0 && e.pinned)
            rc = 1;
    }
    if (rc == 0 && (rc = ctxs__session_unindex(txn, st, id)) == 0 && fd >= 0)
        rc = intent_put(txn, st, id, CTXS__INTENT_DELETE);
    if (txn && rc == 1)
        mdb_txn_abort(txn);
    else if (txn)
        rc = ctxs__txn_finish(txn, rc);
    if (rc == 0 && fd >= 0) {
        /* Unlinked before the lock goes with the descriptor: whoever opened
         * the file meanwhile finds it unlinked (open_file). Where the unlink
         * or the directory's sync fails, the intent stays: the next open of
         * the store finishes it. */
        if ((ctxs__unlinkat(st->sessions_fd, file, 0) == 0 || errno == ENOENT) &&
            ctxs__fsync(st->sessions_fd) == 0 && ctxs__txn_begin(&txn, st, 0) == 0) {
            if (intent_drop(txn, st, id) == 0)
                ctxs__txn_commit(txn);
            else
                mdb_txn_abort(txn);
        }
    }
    if (fd >= 0)
        close(fd);
    return rc;
}

int ctxs_store_session_delete(ctxs_store *st, const char *name)
{
    ctxs__error_begin();
    size_t len;
    CTXS__STORE_CHECK(st);
    if (ctxs__name_check(name, &len) < 0)
        return CTXS_EINVAL;
    if (st->rdonly)
        return ctxs__store_readonly();
    ctxs__session_rec rec;
    int rc = session_lookup(&rec, st, name, len);
    if (rc < 0)
        return rc;
    rc = ctxs__session_delete_id(st, rec.id, name, len, 0);
    if (rc == CTXS_EBUSY) {
        char shown[80];
        ctxs__name_shown(shown, name);
        return ctxs__error(rc, "session '%s' is open (a writer or a reader, in some "
                           "process): close it first", shown);
    }
    return rc == CTXS_ENOTFOUND ? ctxs__no_session(name) : rc;
}

/* Removes the leftovers of interrupted creates of id: files written aside
 * (<file>.tmp-<pid>-<n>) that no live process holds. Returns how many a
 * live process holds (a create of id in progress), or -errno. The caller
 * syncs the directory. */
static int remove_tmp_files(ctxs_store *st, uint64_t id)
{
    char file[32];
    ctxs__file_name(file, id);
    DIR *dir;
    int rc = ctxs__sessions_dir_open(&dir, st);
    if (rc < 0)
        return rc;
    size_t len = strlen(file);
    int held = 0;
    struct dirent *de;
    while ((de = ctxs__readdir(dir))) {
        if (strncmp(de->d_name, file, len) != 0 || strncmp(de->d_name + len, ".tmp-", 5) != 0)
            continue;
        held += ctxs__aside_remove(st, id, de->d_name) == CTXS_EBUSY;
    }
    closedir(dir);
    return held;
}

/* The pid in an intent's value (index 1.1), or 0 (1.0 wrote none). */
static uint32_t intent_pid(const MDB_val *intent)
{
    const uint8_t *v = intent->mv_data;
    return intent->mv_size >= 5 ? (uint32_t)v[1] | (uint32_t)v[2] << 8 | (uint32_t)v[3] << 16 |
                                      (uint32_t)v[4] << 24
                                : 0;
}

/* Removes the file of an interrupted create or delete of id, unless a
 * handle has it open (a create holds its writer lock) or the create is
 * still under way: intent is the pending value, whose creator pid (index
 * 1.1) is alive. Returns 0, CTXS_EBUSY (left for later) or an error. */
static int intent_resolve(ctxs_store *st, uint64_t id, const MDB_val *intent)
{
    const uint8_t *v = intent->mv_data;
    uint32_t pid = intent_pid(intent);
    if (pid && v[0] == CTXS__INTENT_CREATE && creator_alive(pid, id))
        return CTXS_EBUSY;
    char file[32];
    ctxs__file_name(file, id);
    int fd = ctxs__openat(st->sessions_fd, file, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0 && errno != ENOENT)
        return -errno;
    /* A create in progress holds its file's writer lock from the start:
     * the one written aside until the link, then the linked one. Either
     * way its intent stays until it finishes or dies. */
    int rc = fd >= 0 ? ctxs__lock(fd, CTXS__LOCK_EXCLUSIVE) : remove_tmp_files(st, id);
    if (rc > 0)
        return CTXS_EBUSY;
    MDB_txn *txn = NULL;
    if (rc == 0)
        rc = ctxs__txn_begin(&txn, st, 0);
    if (rc == 0) {
        uint8_t idk[8];
        ctxs__id_key(idk, id);
        MDB_val key = {8, idk}, val;
        int indexed = mdb_get(txn, st->ids, &key, &val) == 0;
        if (!indexed && fd >= 0 && ctxs__unlinkat(st->sessions_fd, file, 0) != 0)
            rc = -errno;
        if (rc == 0 && fd >= 0)
            remove_tmp_files(st, id);
        /* What was unlinked is durable before the intent goes (see the
         * top of this file). */
        if (rc == 0 && ctxs__fsync(st->sessions_fd) != 0)
            rc = -errno;
        if (rc == 0)
            rc = intent_drop(txn, st, id);
        rc = ctxs__txn_finish(txn, rc);
    }
    if (fd >= 0)
        close(fd);
    return rc;
}

int ctxs__intents_resolve(ctxs_store *st)
{
    MDB_txn *txn;
    int rc = ctxs__txn_begin(&txn, st, 1);
    if (rc < 0)
        return rc;
    uint64_t ids[64];
    uint8_t intents[64][8]; /* the first bytes of each value (5 in 1.1, 1 in 1.0) */
    size_t lens[64];
    size_t n = 0;
    MDB_cursor *cur;
    if ((rc = ctxs__mdb_error(ctxs__mdb_cursor_open(txn, st->pending, &cur))) == 0) {
        MDB_val key, val;
        int op = MDB_FIRST;
        while (n < 64 && mdb_cursor_get(cur, &key, &val, op) == 0) {
            op = MDB_NEXT;
            if (key.mv_size != 8)
                continue;
            ids[n] = ctxs__id_from_key(key.mv_data);
            lens[n] = val.mv_size < sizeof(intents[n]) ? val.mv_size : sizeof(intents[n]);
            memcpy(intents[n], val.mv_data, lens[n]);
            n++;
        }
        mdb_cursor_close(cur);
    }
    mdb_txn_abort(txn);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        MDB_val intent = {lens[i], intents[i]};
        int r = intent_resolve(st, ids[i], &intent);
        if (r < 0 && r != CTXS_EBUSY)
            rc = r;
    }
    return rc;
}

/* --- Listing intents (what a read-write open would do) --------------------- */

/* Whether a file written aside for id is held by a create that may be under
 * way: what keeps remove_tmp_files() from removing it. */
static int aside_held(ctxs_store *st, uint64_t id)
{
    char file[32];
    ctxs__file_name(file, id);
    size_t len = strlen(file);
    DIR *dir;
    if (ctxs__sessions_dir_open(&dir, st) < 0)
        return 0;
    int held = 0;
    struct dirent *de;
    while (!held && (de = ctxs__readdir(dir))) {
        if (strncmp(de->d_name, file, len) != 0 || strncmp(de->d_name + len, ".tmp-", 5) != 0)
            continue;
        held = create_under_way(id, de->d_name);
        int fd = held ? -1 : ctxs__openat(st->sessions_fd, de->d_name,
                                          O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd >= 0) {
            held = ctxs__lock_probe(fd, CTXS__LOCK_WRITER) > 0;
            close(fd);
        }
    }
    closedir(dir);
    return held;
}

/* Fills e with what intent_resolve() would do with the intent of id
 * now, taking nothing and changing nothing. */
static void intent_judge(ctxs_intent_entry *e, ctxs_store *st, MDB_txn *txn, uint64_t id,
                         const MDB_val *intent)
{
    const uint8_t *v = intent->mv_data;
    memset(e, 0, sizeof(*e));
    e->id = id;
    e->kind = v[0] == CTXS__INTENT_CREATE ? CTXS_INTENT_CREATE : CTXS_INTENT_DELETE;
    e->pid = intent_pid(intent);
    uint8_t idk[8];
    ctxs__id_key(idk, id);
    MDB_val key = {8, idk}, val;
    e->indexed = mdb_get(txn, st->ids, &key, &val) == 0;
    char file[32];
    ctxs__file_name(file, id);
    int fd = ctxs__openat(st->sessions_fd, file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    e->file_present = fd >= 0 || errno != ENOENT;
    int busy = 0;
    if (e->kind == CTXS_INTENT_CREATE && e->pid && creator_alive(e->pid, id))
        busy = 1;
    else if (fd >= 0)
        busy = ctxs__lock_probe(fd, CTXS__LOCK_WRITER) > 0 ||
               ctxs__lock_probe(fd, CTXS__LOCK_READER) > 0;
    else
        busy = aside_held(st, id);
    if (fd >= 0)
        close(fd);
    e->action = busy ? CTXS_INTENT_WAIT
                     : e->file_present && !e->indexed ? CTXS_INTENT_REMOVE_FILE : CTXS_INTENT_DROP;
}

int ctxs_store_intent_list(ctxs_intent_entry **out, size_t *n_out, ctxs_store *st)
{
    MDB_txn *txn;
    int rc = ctxs__list_begin(&txn, (void **)out, n_out, st);
    if (rc < 0)
        return rc;
    MDB_cursor *cur;
    ctxs_intent_entry *list = NULL;
    size_t n = 0, cap = 0;
    if ((rc = ctxs__mdb_error(ctxs__mdb_cursor_open(txn, st->pending, &cur))) == 0) {
        MDB_val key, val;
        int r;
        for (r = mdb_cursor_get(cur, &key, &val, MDB_FIRST); r == 0 && rc == 0;
             r = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
            const uint8_t *v = val.mv_data;
            /* Malformed ones are ctxs_store_check()'s to report. */
            if (key.mv_size != 8 || val.mv_size == 0 ||
                (v[0] != CTXS__INTENT_CREATE && v[0] != CTXS__INTENT_DELETE))
                continue;
            if ((rc = ctxs__array_room((void **)&list, &cap, n, sizeof(*list), 8)) < 0)
                break;
            intent_judge(&list[n++], st, txn, ctxs__id_from_key(key.mv_data), &val);
        }
        if (rc == 0 && r != 0 && r != MDB_NOTFOUND)
            rc = ctxs__mdb_error(r);
        mdb_cursor_close(cur);
    }
    mdb_txn_abort(txn);
    return ctxs__list_out((void **)out, n_out, list, n, rc);
}
