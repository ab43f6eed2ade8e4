/*
 * Repairing a damaged index while keeping what it still holds
 * (ctxs_store_repair_index): the session files give back every session,
 * as reindex does; the damaged index gives back what only it had --
 * names given by renames, checkpoints, metadata, pins, models' display
 * names -- as far as it still reads.
 *
 * LMDB trusts its pages. A page that damage left plausible enough can
 * send it reading outside its map, or around in circles; no check before
 * the fact (check_file.c) can see inside every page. So the damaged file
 * is never opened in this process: each table is read by a child of its
 * own, from a private copy made readable (ctxs__index_salvage_copy()),
 * under alarm(). The child sends each row down a pipe as it reads it, so a
 * child that dies at row k has given rows 0..k-1; what it sends is checked
 * again here as if hostile, for the parent trusts the damaged bytes no
 * more than LMDB should have. One table's fault loses the rest of that
 * table only: the names are in two tables (sessions and ids), so either
 * gives them back.
 *
 * The order keeps every step undoable: nothing is changed until all is
 * read; the damaged file is moved aside, never deleted; the new index is
 * what opening a store without one makes (a rebuild from the files), and
 * what was salvaged goes into it in one transaction.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "index.h"
#include "mdb_calls.h"
#include "platform.h"
#include "syscall.h"

#define SALVAGE_SECONDS 60            /* one table's reader, at most */
#define SALVAGE_COPY "salvage.tmp"    /* in index/; LMDB never opens it */
#define ROW_KEY_MAX 511               /* LMDB's largest key */
#define ROW_VALUE_MAX (1u << 20)      /* above every value we write */

/* What a child sends: a header, then klen + vlen bytes. */
enum { MSG_COUNT = 1, MSG_ROW, MSG_BIG, MSG_END };
typedef struct msg {
    uint32_t kind;
    uint32_t klen, vlen;
    int32_t rc;         /* MSG_END: LMDB's code (0: read to the end) */
    uint64_t count;     /* MSG_COUNT: the table's entries, as it says */
} msg;

typedef struct row {
    uint8_t *key, *val; /* one allocation: the key, then the value */
    uint32_t klen, vlen;
} row;

/* Everything one child read of one table. */
typedef struct table {
    const char *name;
    row *rows;
    size_t n, cap;
    uint64_t count;     /* what the table said it holds */
    int counted;
    uint64_t big;       /* rows the child would not send: too large */
    int whole;          /* read to the end, and the child exited cleanly */
} table;

enum { T_META, T_SESSIONS, T_IDS, T_MODELS, T_CHECKPOINTS, T_METADATA, T_PINS, N_TABLES };
static const char *const table_names[N_TABLES] = {
    "meta", "sessions", "ids", "models", "checkpoints", "metadata", "pins",
};

/* --- the child ------------------------------------------------------------ */

/* LMDB computes a value's address from offsets in its page, and a damaged
 * page can put it outside the map: the bytes are handed to the kernel by
 * the system call itself, which fails with EFAULT where nothing is mapped
 * (and is not checked by a sanitizer's interceptor, which would report
 * the child's read of its own memory). The parent checks every row. */
static int send_all(int fd, const void *buf, size_t len)
{
    for (size_t done = 0; done < len;) {
        ssize_t w = syscall(SYS_write, fd, (const char *)buf + done, len - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        done += (size_t)w;
    }
    return 0;
}

static int send_msg(int fd, uint32_t kind, const MDB_val *k, const MDB_val *v, int rc,
                    uint64_t count)
{
    msg m = {kind, k ? (uint32_t)k->mv_size : 0, v ? (uint32_t)v->mv_size : 0, rc, count};
    if (send_all(fd, &m, sizeof(m)) != 0)
        return -1;
    if (k && k->mv_size && send_all(fd, k->mv_data, k->mv_size) != 0)
        return -1;
    return v && v->mv_size ? send_all(fd, v->mv_data, v->mv_size) : 0;
}

/* A fault inside LMDB on a damaged page ends the child at once, with a
 * status of its own: no core dump, and no sanitizer report of a fault the
 * child is there to take. */
static void child_faulted(int sig)
{
    (void)sig;
    _exit(3);
}

/* Reads one table of the copy and sends it; never returns. Only LMDB,
 * write() and _exit(): nothing of the caller's runs here. */
static void child_read(int fd, const char *copy, uint64_t mapsize, const char *name)
{
    signal(SIGALRM, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    struct sigaction fault = {.sa_handler = child_faulted};
    sigaction(SIGSEGV, &fault, NULL);
    sigaction(SIGBUS, &fault, NULL);
    sigset_t all;
    sigemptyset(&all);
    sigaddset(&all, SIGALRM);
    sigaddset(&all, SIGSEGV);
    sigaddset(&all, SIGBUS);
    sigprocmask(SIG_UNBLOCK, &all, NULL);
    alarm(SALVAGE_SECONDS);
    MDB_env *env = NULL;
    MDB_txn *txn = NULL;
    MDB_cursor *cur = NULL;
    MDB_dbi dbi;
    MDB_stat ms;
    int rc = mdb_env_create(&env);
    if (rc == 0 && (rc = mdb_env_set_maxdbs(env, 16)) == 0 &&
        (rc = mdb_env_set_mapsize(env, (size_t)mapsize)) == 0)
        rc = mdb_env_open(env, copy, MDB_RDONLY | MDB_NOLOCK | MDB_NOSUBDIR | MDB_NORDAHEAD,
                          0600);
    if (rc == 0 && (rc = mdb_txn_begin(env, NULL, MDB_RDONLY, &txn)) == 0 &&
        (rc = mdb_dbi_open(txn, name, 0, &dbi)) == 0 && mdb_stat(txn, dbi, &ms) == 0 &&
        send_msg(fd, MSG_COUNT, NULL, NULL, 0, ms.ms_entries) != 0)
        _exit(2);
    if (rc == 0)
        rc = mdb_cursor_open(txn, dbi, &cur);
    MDB_val k, v;
    for (int op = MDB_FIRST; rc == 0 && (rc = mdb_cursor_get(cur, &k, &v, op)) == 0;
         op = MDB_NEXT) {
        int big = k.mv_size > ROW_KEY_MAX || v.mv_size > ROW_VALUE_MAX;
        if (send_msg(fd, big ? MSG_BIG : MSG_ROW, big ? NULL : &k, big ? NULL : &v, 0, 0) != 0)
            _exit(2);
    }
    if (rc == MDB_NOTFOUND)
        rc = 0;
    _exit(send_msg(fd, MSG_END, NULL, NULL, rc, 0) == 0 ? 0 : 2);
}

/* --- the parent ----------------------------------------------------------- */

static int recv_all(int fd, void *buf, size_t len)
{
    for (size_t done = 0; done < len;) {
        ssize_t r = read(fd, (char *)buf + done, len - done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1; /* the child ended, cleanly or not */
        done += (size_t)r;
    }
    return 0;
}

static void table_free(table *t)
{
    for (size_t i = 0; i < t->n; i++)
        free(t->rows[i].key);
    free(t->rows);
    t->rows = NULL;
    t->n = t->cap = 0;
}

static int table_add(table *t, const msg *m, int fd, int *eof)
{
    if (ctxs__array_room((void **)&t->rows, &t->cap, t->n, sizeof(*t->rows), 64) < 0)
        return CTXS_ENOMEM;
    row r = {ctxs__malloc((size_t)m->klen + m->vlen + 1), NULL, m->klen, m->vlen};
    if (!r.key)
        return CTXS_ENOMEM;
    r.val = r.key + m->klen;
    if (recv_all(fd, r.key, (size_t)m->klen + m->vlen) != 0) {
        free(r.key);
        *eof = 1;
        return 0;
    }
    t->rows[t->n++] = r;
    return 0;
}

/* Reads one table of the copy through a child. Only a failure of this
 * process (memory, fork) is an error; whatever the child does is
 * recorded in t. */
static int table_read(table *t, const char *copy, uint64_t mapsize)
{
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0)
        return -errno;
    pid_t pid = fork();
    if (pid < 0) {
        int rc = -errno;
        close(pfd[0]);
        close(pfd[1]);
        return rc;
    }
    if (pid == 0) {
        close(pfd[0]);
        child_read(pfd[1], copy, mapsize, t->name);
    }
    close(pfd[1]);
    int rc = 0, eof = 0, ended = 0;
    while (rc == 0 && !eof && !ended) {
        msg m;
        if (recv_all(pfd[0], &m, sizeof(m)) != 0)
            break;
        switch (m.kind) {
        case MSG_COUNT:
            t->count = m.count;
            t->counted = 1;
            break;
        case MSG_ROW:
            if (m.klen > ROW_KEY_MAX || m.vlen > ROW_VALUE_MAX)
                eof = 1; /* not what our child sends: stop listening */
            else
                rc = table_add(t, &m, pfd[0], &eof);
            break;
        case MSG_BIG:
            t->big++;
            break;
        case MSG_END:
            ended = 1;
            t->whole = m.rc == 0;
            break;
        default:
            eof = 1;
        }
    }
    /* Unblocks a child still writing (it dies of SIGPIPE), then reaps it. */
    close(pfd[0]);
    int status = 0;
    pid_t w;
    while ((w = waitpid(pid, &status, 0)) < 0 && errno == EINTR)
        ;
    if (w == pid && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
        t->whole = 0;
    return rc;
}

/* --- checking what came back ---------------------------------------------- */

/* Whether bytes[0..len) is a valid name; copied, NUL-terminated, into out. */
static int name_ok(char out[CTXS_NAME_MAX + 1], const void *bytes, size_t len)
{
    if (len < 1 || len > CTXS_NAME_MAX || memchr(bytes, 0, len))
        return 0;
    memcpy(out, bytes, len);
    out[len] = '\0';
    size_t l;
    return ctxs__name_check(out, &l) == 0;
}

/* A salvaged name for a session: from sessions[name] (rec set) or, where
 * that table lost it, from ids[id]. */
typedef struct salvaged_name {
    uint64_t id;
    const char *name;   /* into a row's bytes; len of them */
    size_t len;
    const ctxs__session_rec *rec; /* NULL: from the ids table */
    int used;
} salvaged_name;

static int cmp_salvaged(const void *a, const void *b)
{
    const salvaged_name *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* The name of id among n, sorted by id; NULL if none. */
static salvaged_name *salvaged_find(salvaged_name *names, size_t n, uint64_t id)
{
    salvaged_name key = {.id = id};
    return n ? bsearch(&key, names, n, sizeof(*names), cmp_salvaged) : NULL;
}

/* A session of the new index (indexed from its file). */
typedef struct live {
    uint64_t id;
    char name[CTXS_NAME_MAX + 1];
    ctxs__session_rec rec;
} live;

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Whether id is among the n live sessions (sorted by id, id first). */
static int is_live(const live *l, size_t n, uint64_t id)
{
    return n && bsearch(&id, l, n, sizeof(*l), cmp_u64) != NULL;
}

/* Every (id, name) of the new index, with its record, by id. */
static int live_list(live **out, size_t *n_out, MDB_txn *txn, ctxs_store *st)
{
    *out = NULL;
    *n_out = 0;
    MDB_stat ms;
    int rc = ctxs__mdb_error(mdb_stat(txn, st->ids, &ms));
    if (rc < 0 || ms.ms_entries == 0)
        return rc;
    live *l = ctxs__calloc(ms.ms_entries, sizeof(*l));
    if (!l)
        return CTXS_ENOMEM;
    MDB_cursor *cur;
    if ((rc = ctxs__mdb_error(ctxs__mdb_cursor_open(txn, st->ids, &cur))) < 0) {
        free(l);
        return rc;
    }
    size_t n = 0;
    MDB_val k, v;
    for (int op = MDB_FIRST; rc == 0 && n < ms.ms_entries &&
                             mdb_cursor_get(cur, &k, &v, op) == 0;
         op = MDB_NEXT) {
        /* Written by reindex a moment ago: anything else is a bug. */
        if (k.mv_size != 8 || !name_ok(l[n].name, v.mv_data, v.mv_size)) {
            rc = CTXS_EINDEX;
            break;
        }
        l[n].id = ctxs__id_from_key(k.mv_data);
        rc = ctxs__session_get(&l[n].rec, txn, st, l[n].name, v.mv_size);
        n++;
    }
    mdb_cursor_close(cur);
    if (rc < 0) {
        free(l);
        return rc;
    }
    *out = l;
    *n_out = n;
    return 0;
}

/* --- putting it back ------------------------------------------------------ */

typedef struct salvage {
    table t[N_TABLES];
    salvaged_name *names;
    size_t n_names;
    ctxs_store_repair_index_result *res;
} salvage;

/* The names the damaged index gave, at most one per session and one
 * session per name: the sessions table's first, then the ids table's
 * for the sessions it has none for. Rows that do not check out are
 * counted as dropped. */
static int names_collect(salvage *sv)
{
    table *s = &sv->t[T_SESSIONS], *ids = &sv->t[T_IDS];
    sv->names = ctxs__calloc(s->n + ids->n + 1, sizeof(*sv->names));
    if (!sv->names)
        return CTXS_ENOMEM;
    size_t n = 0;
    char buf[CTXS_NAME_MAX + 1];
    for (size_t i = 0; i < s->n; i++) {
        const row *r = &s->rows[i];
        ctxs__session_rec rec;
        if (r->vlen != sizeof(rec) || !name_ok(buf, r->key, r->klen)) {
            sv->res->names.dropped++;
            continue;
        }
        memcpy(&rec, r->val, sizeof(rec));
        if (rec.id == 0 || rec.id > CTXS__ID_MAX) {
            sv->res->names.dropped++;
            continue;
        }
        /* The record is copied into the row's bytes' place: aligned. */
        ctxs__session_rec *keep = ctxs__malloc(sizeof(*keep));
        if (!keep)
            return CTXS_ENOMEM;
        *keep = rec;
        sv->names[n++] = (salvaged_name){rec.id, (const char *)r->key, r->klen, keep, 0};
    }
    qsort(sv->names, n, sizeof(*sv->names), cmp_salvaged);
    /* Two names for one id (a damaged record): the first by name stays. */
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        if (kept && sv->names[kept - 1].id == sv->names[i].id) {
            free((void *)sv->names[i].rec);
            sv->res->names.dropped++;
            continue;
        }
        sv->names[kept++] = sv->names[i];
    }
    n = kept;
    size_t from_sessions = n;
    for (size_t i = 0; i < ids->n; i++) {
        const row *r = &ids->rows[i];
        if (r->klen != 8 || !name_ok(buf, r->val, r->vlen))
            continue; /* counted by the sessions table's rows, if at all */
        uint64_t id = ctxs__id_from_key(r->key);
        if (id == 0 || id > CTXS__ID_MAX || salvaged_find(sv->names, from_sessions, id))
            continue;
        int taken = 0;
        for (size_t j = 0; j < n && !taken; j++)
            taken = sv->names[j].len == r->vlen && memcmp(sv->names[j].name, r->val, r->vlen) == 0;
        if (!taken)
            sv->names[n++] = (salvaged_name){id, (const char *)r->val, r->vlen, NULL, 0};
    }
    qsort(sv->names, n, sizeof(*sv->names), cmp_salvaged);
    sv->n_names = n;
    return 0;
}

static int put(MDB_txn *txn, MDB_dbi dbi, const void *k, size_t kl, const void *v, size_t vl,
               unsigned flags)
{
    MDB_val key = {kl, (void *)k}, val = {vl, (void *)v};
    int rc = ctxs__mdb_put(txn, dbi, &key, &val, flags);
    return rc == MDB_KEYEXIST ? -EEXIST : ctxs__mdb_error(rc);
}

/* Gives every session of the new index its salvaged name, or keeps its
 * label's where no salvaged name claims that, or "session-<id>". The
 * names go out of the sessions table first and come back in, with
 * MDB_NOOVERWRITE: LMDB is the set of names taken. */
static int names_apply(salvage *sv, MDB_txn *txn, ctxs_store *st, live *l, size_t n)
{
    ctxs_store_repair_index_result *res = sv->res;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        MDB_val key = {strlen(l[i].name), l[i].name};
        rc = ctxs__mdb_error(ctxs__mdb_del(txn, st->sessions, &key, NULL));
    }
    /* The salvaged names first: they are what the user last called them. */
    size_t n_unnamed = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        salvaged_name *s = salvaged_find(sv->names, sv->n_names, l[i].id);
        if (!s) {
            n_unnamed++;
            continue;
        }
        ctxs__session_rec rec = l[i].rec;
        if (s->rec && memcmp(s->rec->model_hash, rec.model_hash, 16) == 0) {
            rec.created_unix_ms = s->rec->created_unix_ms;
            rec.last_used_unix_ms = s->rec->last_used_unix_ms;
            rec.parent_id = s->rec->parent_id <= CTXS__ID_MAX ? s->rec->parent_id : 0;
            rec.fork_tokens = s->rec->fork_tokens;
        }
        rc = put(txn, st->sessions, s->name, s->len, &rec, sizeof(rec), MDB_NOOVERWRITE);
        if (rc == -EEXIST) { /* cannot be: names are unique; leave it unnamed */
            rc = 0;
            n_unnamed++;
            continue;
        }
        uint8_t idk[8];
        ctxs__id_key(idk, l[i].id);
        if (rc == 0)
            rc = put(txn, st->ids, idk, 8, s->name, s->len, 0);
        s->used = 1;
        res->names.kept++;
        memcpy(l[i].name, s->name, s->len);
        l[i].name[s->len] = '\0';
    }
    if (rc == 0 && n_unnamed && !(res->renamed = ctxs__calloc(n_unnamed, sizeof(*res->renamed))))
        rc = CTXS_ENOMEM;
    /* Then the rest: their label's name where it is free. */
    for (size_t i = 0; rc == 0 && i < n; i++) {
        salvaged_name *s = salvaged_find(sv->names, sv->n_names, l[i].id);
        if (s && s->used)
            continue;
        char name[CTXS_NAME_MAX + 1];
        snprintf(name, sizeof(name), "%s", l[i].name);
        for (int tries = 0;; tries++) {
            rc = put(txn, st->sessions, name, strlen(name), &l[i].rec, sizeof(l[i].rec),
                     MDB_NOOVERWRITE);
            if (rc != -EEXIST || tries == 100)
                break;
            if (tries == 0)
                snprintf(name, sizeof(name), "session-%016llx", (unsigned long long)l[i].id);
            else
                snprintf(name, sizeof(name), "session-%016llx-%d", (unsigned long long)l[i].id,
                         tries + 1);
        }
        uint8_t idk[8];
        ctxs__id_key(idk, l[i].id);
        if (rc == 0)
            rc = put(txn, st->ids, idk, 8, name, strlen(name), 0);
        if (rc == 0) {
            ctxs_store_repair_index_renamed *r = &res->renamed[res->n_renamed++];
            r->id = l[i].id;
            snprintf(r->name, sizeof(r->name), "%s", name);
            res->names.unread++;
        }
    }
    /* Names of sessions whose file is gone. */
    for (size_t i = 0; i < sv->n_names; i++)
        if (!sv->names[i].used && !is_live(l, n, sv->names[i].id))
            res->names.dropped++;
    return rc;
}

static int checkpoints_apply(salvage *sv, MDB_txn *txn, ctxs_store *st, const live *l, size_t n)
{
    const table *t = &sv->t[T_CHECKPOINTS];
    ctxs_store_repair_index_count *c = &sv->res->checkpoints;
    char name[CTXS_NAME_MAX + 1];
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < t->n; i++) {
        const row *r = &t->rows[i];
        if (r->klen < 9 || r->vlen != sizeof(ctxs__checkpoint_rec) ||
            !name_ok(name, r->key + 8, r->klen - 8) ||
            !is_live(l, n, ctxs__id_from_key(r->key))) {
            c->dropped++;
            continue;
        }
        if ((rc = put(txn, st->checkpoints, r->key, r->klen, r->val, r->vlen, 0)) == 0)
            c->kept++;
    }
    return rc;
}

static int metadata_apply(salvage *sv, MDB_txn *txn, ctxs_store *st, const live *l, size_t n)
{
    const table *t = &sv->t[T_METADATA];
    ctxs_store_repair_index_count *c = &sv->res->metadata;
    char key[CTXS_NAME_MAX + 1];
    uint64_t id_at = 0, total = 0;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < t->n; i++) {
        const row *r = &t->rows[i];
        uint64_t id = r->klen >= 8 ? ctxs__id_from_key(r->key) : 0;
        if (id != id_at)
            id_at = id, total = 0;
        /* Rows come in key order, so a session's rows in a row: the limit
         * keeps the first that fit, as the writes that made them did. */
        if (r->klen < 9 || r->vlen > CTXS_META_VALUE_MAX ||
            !name_ok(key, r->key + 8, r->klen - 8) || !is_live(l, n, id) ||
            total + (r->klen - 8) + r->vlen > CTXS_META_SESSION_MAX) {
            c->dropped++;
            continue;
        }
        total += (r->klen - 8) + r->vlen;
        if ((rc = put(txn, st->metadata, r->key, r->klen, r->val, r->vlen, 0)) == 0)
            c->kept++;
    }
    return rc;
}

static int pins_apply(salvage *sv, MDB_txn *txn, ctxs_store *st, const live *l, size_t n)
{
    const table *t = &sv->t[T_PINS];
    ctxs_store_repair_index_count *c = &sv->res->pins;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < t->n; i++) {
        const row *r = &t->rows[i];
        if (r->klen != 8 || r->vlen != 0 || !is_live(l, n, ctxs__id_from_key(r->key))) {
            c->dropped++;
            continue;
        }
        if ((rc = put(txn, st->pins, r->key, 8, "", 0, 0)) == 0)
            c->kept++;
    }
    return rc;
}

/* A registration comes back whole (display name, time) unless a session
 * file registered its hash with another geometry or tokenizer: the files
 * are the truth. */
static int models_apply(salvage *sv, MDB_txn *txn, ctxs_store *st)
{
    const table *t = &sv->t[T_MODELS];
    ctxs_store_repair_index_count *c = &sv->res->models;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < t->n; i++) {
        const row *r = &t->rows[i];
        ctxs__model_rec rec;
        char name[CTXS_NAME_MAX + 1];
        if (r->klen != 16 || r->vlen < sizeof(rec)) {
            c->dropped++;
            continue;
        }
        ctxs_model m;
        memset(&m, 0, sizeof(m));
        int decoded = ctxs__model_decode(r->val, r->vlen, &rec, &m.geometry, NULL) == 0;
        memcpy(m.model_hash, r->key, 16);
        memcpy(m.tokenizer_hash, rec.tokenizer_hash, 16);
        int ok = decoded &&
                 (rec.name_len == 0 || name_ok(name, r->val + sizeof(rec), rec.name_len)) &&
                 ctxs__model_geometry_valid(&m.geometry);
        if (ok) {
            int have = ctxs__model_check(txn, st, &m);
            ok = have == 0 || have == CTXS_ENOMODEL;
            if (have < 0 && have != CTXS_ENOMODEL && have != CTXS_EMODEL)
                rc = have;
        }
        if (rc == 0 && !ok) {
            c->dropped++;
            continue;
        }
        if (rc == 0 && (rc = put(txn, st->models, r->key, 16, r->val, r->vlen, 0)) == 0)
            c->kept++;
    }
    return rc;
}

/* next_id never goes down: ids the damaged index handed out stay spent. */
static int next_id_apply(salvage *sv, MDB_txn *txn, ctxs_store *st)
{
    const table *t = &sv->t[T_META];
    for (size_t i = 0; i < t->n; i++) {
        const row *r = &t->rows[i];
        uint64_t v;
        if (r->klen == 7 && memcmp(r->key, "next_id", 7) == 0 && r->vlen == 8) {
            memcpy(&v, r->val, 8);
            if (v >= 1 && v <= CTXS__ID_MAX)
                return ctxs__next_id_repair(txn, st, v, NULL);
        }
    }
    return 0;
}

/* The format record, if the damaged index still has it whole: one of a
 * newer major is not ours to rebuild. */
static int format_check(const salvage *sv)
{
    const table *t = &sv->t[T_META];
    for (size_t i = 0; i < t->n; i++) {
        const row *r = &t->rows[i];
        ctxs__index_format f;
        if (r->klen == 6 && memcmp(r->key, "format", 6) == 0 && r->vlen == sizeof(f)) {
            memcpy(&f, r->val, sizeof(f));
            if (memcmp(f.magic, CTXS__INDEX_MAGIC, 8) == 0 && f.major > CTXS__INDEX_MAJOR)
                return CTXS_EVERSION;
        }
    }
    return 0;
}

static void counts_finish(salvage *sv)
{
    struct { int t; ctxs_store_repair_index_count *c; } kinds[] = {
        {T_CHECKPOINTS, &sv->res->checkpoints},
        {T_METADATA, &sv->res->metadata},
        {T_PINS, &sv->res->pins},
        {T_MODELS, &sv->res->models},
    };
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        const table *t = &sv->t[kinds[i].t];
        kinds[i].c->whole = (uint32_t)t->whole;
        kinds[i].c->dropped += t->big;
        if (t->counted && t->count > t->n + t->big)
            kinds[i].c->unread = t->count - t->n - t->big;
    }
    sv->res->names.whole = (uint32_t)(sv->t[T_SESSIONS].whole || sv->t[T_IDS].whole);
    for (int i = 0; i < N_TABLES; i++)
        sv->res->tables_failed += !sv->t[i].whole;
}

static int salvage_apply(salvage *sv, ctxs_store *st)
{
    MDB_txn *txn;
    int rc = ctxs__txn_begin(&txn, st, 0);
    if (rc < 0)
        return rc;
    live *l = NULL;
    size_t n = 0;
    if ((rc = live_list(&l, &n, txn, st)) == 0)
        rc = names_apply(sv, txn, st, l, n);
    if (rc == 0)
        rc = checkpoints_apply(sv, txn, st, l, n);
    if (rc == 0)
        rc = metadata_apply(sv, txn, st, l, n);
    if (rc == 0)
        rc = pins_apply(sv, txn, st, l, n);
    if (rc == 0)
        rc = models_apply(sv, txn, st);
    if (rc == 0)
        rc = next_id_apply(sv, txn, st);
    free(l);
    return ctxs__txn_finish(txn, rc);
}

/* --- the directory -------------------------------------------------------- */

/* Moves index/data.mdb and index/lock.mdb into a new
 * <dir>/index.damaged-<unix seconds>[-n]; *moved_to gets its path. */
static int move_aside(char **moved_to, const char *dir, const char *index_dir)
{
    *moved_to = NULL;
    char name[64], *aside = NULL;
    int rc = -EEXIST;
    long long now = (long long)time(NULL);
    for (int n = 1; rc == -EEXIST && n < 100; n++) {
        if (n == 1)
            snprintf(name, sizeof(name), "index.damaged-%lld", now);
        else
            snprintf(name, sizeof(name), "index.damaged-%lld-%d", now, n);
        free(aside);
        if (!(aside = ctxs__path_join(dir, name)))
            return CTXS_ENOMEM;
        rc = ctxs__mkdir(aside, 0700) == 0 ? 0 : -errno;
    }
    const char *files[] = {"data.mdb", "lock.mdb"};
    for (size_t i = 0; rc == 0 && i < 2; i++) {
        char *from = ctxs__path_join(index_dir, files[i]), *to = ctxs__path_join(aside, files[i]);
        if (!from || !to)
            rc = CTXS_ENOMEM;
        else if (ctxs__rename(from, to) != 0 && errno != ENOENT)
            rc = -errno;
        free(from);
        free(to);
    }
    if (rc == 0 && (rc = ctxs__sync_dir(aside)) == 0 && (rc = ctxs__sync_dir(index_dir)) == 0)
        rc = ctxs__sync_dir(dir);
    if (rc < 0 && rc != -EEXIST) {
        /* Put back what moved: the store stays as it was. */
        for (size_t i = 0; aside && i < 2; i++) {
            char *from = ctxs__path_join(aside, files[i]), *to = ctxs__path_join(index_dir, files[i]);
            if (from && to)
                rename(from, to);
            free(from);
            free(to);
        }
        if (aside)
            rmdir(aside);
    }
    if (rc == 0)
        *moved_to = aside;
    else
        free(aside);
    return rc;
}

/* Removes index_dir/name when it is there and is no regular file (a FIFO,
 * a socket, a device, a symbolic link, an empty directory): store.lock and
 * lock.mdb hold nothing the store needs, and are made again by the next
 * open. No process can have the store open through one of those (an open
 * refuses them), so nothing is taken from under anyone. 0, CTXS_EINDEX
 * (a directory that is not empty: left for the user), -errno. */
static int special_remove(const char *index_dir, const char *name)
{
    char *path = ctxs__path_join(index_dir, name);
    if (!path)
        return CTXS_ENOMEM;
    struct stat sb;
    int rc = 0;
    if (ctxs__fstatat(AT_FDCWD, path, &sb, AT_SYMLINK_NOFOLLOW) != 0)
        rc = errno == ENOENT ? 0 : -errno;
    else if (S_ISDIR(sb.st_mode))
        rc = rmdir(path) == 0 ? 0 : errno == ENOTEMPTY || errno == EEXIST ? CTXS_EINDEX : -errno;
    else if (!S_ISREG(sb.st_mode))
        rc = ctxs__unlink(path) == 0 ? 0 : -errno;
    free(path);
    return rc;
}

/* Whether path is a directory (1), is not or is missing (0), or -errno. */
static int is_dir(const char *path)
{
    struct stat sb;
    if (ctxs__stat(path, &sb) == 0)
        return S_ISDIR(sb.st_mode);
    return errno == ENOENT ? 0 : -errno;
}

int ctxs_store_repair_index(ctxs_store_repair_index_result *out, const char *dir, unsigned flags)
{
    ctxs__error_begin();
    ctxs_store_repair_index_result res;
    memset(&res, 0, sizeof(res));
    if (out)
        *out = res;
    if (!dir || !*dir || flags)
        return CTXS_EINVAL;
    salvage sv;
    memset(&sv, 0, sizeof(sv));
    sv.res = &res;
    for (int i = 0; i < N_TABLES; i++)
        sv.t[i].name = table_names[i];
    char *abs = realpath(dir, NULL), *index_dir = NULL, *data = NULL, *copy = NULL;
    int lock_fd = -1, rc = abs ? 0 : -errno;
    struct stat sb;
    if (rc == 0 && ctxs__stat(abs, &sb) != 0)
        rc = -errno;
    if (rc == 0 && !S_ISDIR(sb.st_mode))
        rc = -ENOTDIR;
    if (rc == 0 && (!(index_dir = ctxs__path_join(abs, "index")) || !(data = ctxs__path_join(index_dir, "data.mdb")) ||
                    !(copy = ctxs__path_join(index_dir, SALVAGE_COPY))))
        rc = CTXS_ENOMEM;
    /* A store has index/ (made first), or at least sessions/ (an index
     * removed by hand): anything else is not ours to make an index in. */
    int has_index = rc == 0 ? is_dir(index_dir) : 0;
    if (has_index < 0)
        rc = has_index;
    if (rc == 0 && !has_index) {
        char *sessions = ctxs__path_join(abs, "sessions");
        int has_sessions = sessions ? is_dir(sessions) : CTXS_ENOMEM;
        free(sessions);
        if (has_sessions < 0)
            rc = has_sessions;
        else if (!has_sessions)
            rc = CTXS_EFOREIGN;
        else if (ctxs__mkdir(index_dir, 0700) != 0 && errno != EEXIST)
            rc = -errno;
    }
    if (rc == 0)
        rc = special_remove(index_dir, "store.lock");
    if (rc == 0)
        rc = ctxs__store_lock_exclusive(&lock_fd, index_dir, &sb);
    if (rc == 0)
        rc = special_remove(index_dir, "lock.mdb");

    /* Read everything before changing anything. */
    uint64_t mapsize = 0;
    int found = 0;
    if (rc == 0) {
        struct stat db; /* the name, whatever it is: moved aside below */
        found = ctxs__fstatat(AT_FDCWD, data, &db, AT_SYMLINK_NOFOLLOW) == 0;
        ctxs__unlink(copy);
        int r = found ? ctxs__index_salvage_copy(data, copy, &mapsize, &res.meta_pages)
                      : CTXS_EINDEX;
        if (r == 0) {
            for (int i = 0; rc == 0 && i < N_TABLES; i++)
                rc = table_read(&sv.t[i], copy, mapsize);
        } else if (r != CTXS_EINDEX && r != -EIO) {
            rc = r; /* this process failed (space, memory): stop here */
        }
        ctxs__unlink(copy);
    }
    if (rc == 0)
        rc = format_check(&sv);
    if (rc == 0)
        rc = names_collect(&sv);
    if (rc == 0 && found)
        rc = move_aside(&res.moved_to, abs, index_dir);

    /* The new index: what an open makes where there is none, a rebuild
     * from the files; then what was salvaged. The lock turns shared so
     * that this process may open the store; compactions stay out. */
    ctxs_store *st = NULL;
    if (rc == 0) {
        ctxs__store_lock_share(lock_fd);
        rc = ctxs_store_open(&st, abs, CTXS_STORE_CREATE, NULL);
    }
    ctxs_store_reindex_result rr;
    if (rc == 0 && (rc = ctxs_store_reindex(&rr, st)) == 0) {
        res.sessions = rr.sessions;
        res.skipped = rr.skipped;
        rc = salvage_apply(&sv, st);
    }
    ctxs_store_close(st);
    if (lock_fd >= 0)
        close(lock_fd);
    counts_finish(&sv);

    for (int i = 0; i < N_TABLES; i++)
        table_free(&sv.t[i]);
    for (size_t i = 0; i < sv.n_names; i++)
        free((void *)sv.names[i].rec);
    free(sv.names);
    free(abs);
    free(index_dir);
    free(data);
    free(copy);
    if (rc < 0) {
        /* Where the damaged index went is worth knowing even now. */
        free(res.renamed);
        res.renamed = NULL;
        res.n_renamed = 0;
        if (!out)
            free(res.moved_to);
    }
    if (out)
        *out = res;
    else if (rc == 0) {
        free(res.moved_to);
        free(res.renamed);
    }
    return rc;
}
