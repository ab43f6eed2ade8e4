/*
 * The store's index with real processes: two processes creating, forking and
 * deleting at once; processes SIGKILLed inside LMDB transactions and at
 * random moments of creates, deletes, forks, renames and commits; a fork
 * taken while another process writes the source; prefix entries that a
 * killed writer left behind.
 *
 * Children open their own store after fork() (the header's rule) and never
 * call Criterion: they report through their exit status and pipes. After
 * every kill the parent opens the store afresh (which resolves what the dead
 * process left half done) and checks that the files and the index agree,
 * and that every session opens and verifies.
 *
 * Runs with --jobs 1. Seeds come from CTXS_TEST_SEED when set, else from the
 * clock; each randomized test logs its seed.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ctxstore.h"
#include "index.h"
#include "support.h"

#define MODEL_SEED 11u

#define say(...) (fprintf(stderr, __VA_ARGS__), fputc('\n', stderr))

TestSuite(index_crash, .init = ts_scratch_init, .fini = ts_scratch_fini, .timeout = 120);

/* --- Helpers for both sides ------------------------------------------------ */

static uint64_t vpos(uint64_t pos, uint32_t gen)
{
    return pos + ((uint64_t)gen << 40);
}

/* Appends n tokens of generation gen in turns of at most 50; no Criterion
 * calls, so that children may use it. */
static int c_append_gen(ctxs_session *s, uint32_t n, uint32_t gen)
{
    ctxs_session_info info;
    int rc = ctxs_session_get_info(&info, s);
    if (rc != 0)
        return rc;
    const ctxs_geometry *g = &info.model.geometry;
    uint16_t k[TS_KV_MAX], v[TS_KV_MAX];
    while (n) {
        uint32_t c = n > 50 ? 50 : n, ids[50];
        ctxs_reservation r;
        if ((rc = ctxs_session_reserve(&r, s, c)) != 0)
            return rc;
        for (uint32_t i = 0; i < c; i++) {
            ts_fill_kv(g, vpos(r.first_pos + i, gen), k, v);
            ids[i] = ts_token(vpos(r.first_pos + i, gen));
            if ((rc = ctxs_session_write_token(s, &r, i, k, v, CTXS_DTYPE_F16)) != 0)
                return rc;
        }
        if ((rc = ctxs_session_commit(s, ids, c)) != 0)
            return rc;
        n -= c;
    }
    return 0;
}

static int c_append(ctxs_session *s, uint32_t n)
{
    return c_append_gen(s, n, 0);
}

static uint64_t c_tokens(const ctxs_session *s)
{
    ctxs_session_info info;
    return ctxs_session_get_info(&info, s) == 0 ? info.n_tokens : 0;
}

static void write_all(int fd, const void *p, size_t n)
{
    ssize_t w;
    do
        w = write(fd, p, n);
    while (w < 0 && errno == EINTR);
}

static int read_byte(int fd, char *c)
{
    ssize_t r;
    do
        r = read(fd, c, 1);
    while (r < 0 && errno == EINTR);
    return (int)r;
}

/* Child exit codes. */
enum {
    CHILD_OK = 0,
    CHILD_EOPEN = 10,
    CHILD_EMODEL,
    CHILD_ECREATE,
    CHILD_EAPPEND,
    CHILD_EFORK,
    CHILD_EDELETE,
    CHILD_ERENAME,
    CHILD_ELIST,
    CHILD_ESESSION,
    CHILD_ECHECKPOINT,
    CHILD_EMDB,
    CHILD_EGC,
    CHILD_EREPAIR,
};

static _Noreturn void child_fail(int code, const char *what, int rc)
{
    fprintf(stderr, "index child %ld: %s: %d %s\n", (long)getpid(), what, rc, ctxs_err_name(rc));
    _exit(code);
}

static ctxs_store *child_store(const ctxs_store_options *o)
{
    ctxs_store *st;
    int rc = ctxs_store_open(&st, ts_store_dir(), CTXS_STORE_CREATE, o);
    if (rc != 0)
        child_fail(CHILD_EOPEN, "ctxs_store_open", rc);
    return st;
}

static pid_t spawn(void (*fn)(void *), void *arg)
{
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_neq(pid, -1, "fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        fn(arg);
        _exit(CHILD_OK);
    }
    return pid;
}

/* Waits for pid; returns its exit code, or 128 + signal. */
static int reap(pid_t pid)
{
    int status = ts_wait(pid);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
}

static void kill_and_reap(pid_t pid)
{
    kill(pid, SIGKILL);
    int code = reap(pid);
    cr_assert(code == 128 + SIGKILL || code == 0, "child %ld failed on its own: exit %d",
              (long)pid, code);
}

/* --- The parent's checks ------------------------------------------------------ */

/* Token ids of positions [0, n): generation 0 below `from`, gen above. */
static uint32_t *make_prompt(uint64_t n, uint64_t from, uint32_t gen)
{
    uint32_t *t = malloc(n * 4);
    cr_assert_not_null(t);
    for (uint64_t p = 0; p < n; p++)
        t[p] = ts_token(p < from ? p : vpos(p, gen));
    return t;
}

static int is_hex16(const char *s)
{
    for (int i = 0; i < 16; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}

/* Files and entries agree: every entry has its file, every session file
 * (and nothing else like one) has an entry, no leftover of a create. */
static void check_agree(ctxs_store *st, const char *what)
{
    ctxs_session_entry *list;
    size_t n;
    int rc = ctxs_store_session_list(&list, &n, st);
    cr_assert_eq(rc, 0, "%s: list: %s", what, ctxs_err_name(rc));
    for (size_t i = 0; i < n; i++) {
        struct stat sb;
        cr_assert_eq(lstat(ts_id_path(list[i].id), &sb), 0, "%s: entry %s (id %llx) has no file",
                     what, list[i].name, (unsigned long long)list[i].id);
        for (size_t j = 0; j < i; j++)
            cr_assert_neq(list[i].id, list[j].id, "%s: %s and %s share an id", what, list[i].name,
                          list[j].name);
    }
    DIR *d = opendir(ts_path(ts_store_dir(), "sessions"));
    cr_assert_not_null(d);
    for (struct dirent *de; (de = readdir(d));) {
        const char *f = de->d_name;
        if (f[0] == '.')
            continue;
        cr_assert(strlen(f) >= 21 && is_hex16(f) && strncmp(f + 16, ".ctxs", 5) == 0,
                  "%s: a stranger in sessions/: %s", what, f);
        cr_assert(strcmp(f + 16, ".ctxs") == 0, "%s: leftover %s after the store was opened", what, f);
        uint64_t id = strtoull(f, NULL, 16);
        int found = 0;
        for (size_t i = 0; i < n && !found; i++)
            found = list[i].id == id;
        cr_assert(found, "%s: file %s has no entry", what, f);
    }
    closedir(d);
    ctxs_free(list);
}

/* Every prefix match holds what it claims. */
static void check_prefix_honest(ctxs_store *st, const ctxs_model *m, const uint32_t *prompt,
                                uint64_t n, const char *what)
{
    ctxs_prefix_match pm;
    int rc = ctxs_prefix_find(&pm, st, m->model_hash, prompt, n);
    if (rc == CTXS_ENOTFOUND)
        return;
    cr_assert_eq(rc, 0, "%s: prefix_find: %s", what, ctxs_err_name(rc));
    cr_assert(pm.n_tokens >= CTXS_PREFIX_CHUNK && pm.n_tokens <= n, "%s: match of %llu", what,
              (unsigned long long)pm.n_tokens);
    ctxs_session *s;
    rc = ctxs_store_session_open(&s, st, pm.session, NULL, CTXS_RDONLY, NULL);
    cr_assert_eq(rc, 0, "%s: the match %s does not open: %s", what, pm.session, ctxs_err_name(rc));
    ctxs_layout lay;
    cr_assert_eq(ctxs_session_get_layout(&lay, s), 0);
    for (uint64_t p = 0; p < pm.n_tokens; p++) {
        uint32_t slot;
        rc = ctxs_session_get_slot(&slot, s, p);
        cr_assert_eq(rc, 0, "%s: %s claims %llu tokens but does not hold position %llu (%s)", what,
                     pm.session, (unsigned long long)pm.n_tokens, (unsigned long long)p,
                     ctxs_err_name(rc));
        cr_assert_eq(lay.token_ids[slot], prompt[p], "%s: %s claims %llu tokens, differs at %llu",
                     what, pm.session, (unsigned long long)pm.n_tokens, (unsigned long long)p);
    }
    ctxs_session_close(s);
}

/* Opens the store afresh (this process must hold no handle), then checks
 * that files and index agree before and after a repair, that no intent is
 * left, and that every session opens read-write and verifies (and, with
 * gen0, holds the contents ts_fill_kv() gives). Returns the number of
 * sessions. */
static size_t check_store_as(const ctxs_model *m, const char *what, int gen0)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    cr_assert_eq(ts_pending_intents(st), 0, "%s: intents left after the store was opened", what);
    check_agree(st, what);
    ctxs_session_entry *list;
    size_t n;
    cr_assert_eq(ctxs_store_session_list(&list, &n, st), 0);
    uint32_t *prompt = malloc(512 * 4);
    cr_assert_not_null(prompt);
    for (uint64_t p = 0; p < 512; p++)
        prompt[p] = ts_token(p);
    for (size_t i = 0; i < n; i++) {
        ctxs_session *s;
        int rc = ctxs_store_session_open(&s, st, list[i].name, m, 0, NULL);
        cr_assert_eq(rc, 0, "%s: session %s does not open: %s", what, list[i].name, ctxs_err_name(rc));
        uint64_t bad = 0;
        rc = ctxs_session_verify(&bad, s);
        cr_assert_eq(rc, 0, "%s: %s does not verify (%s at %llu)", what, list[i].name,
                     ctxs_err_name(rc), (unsigned long long)bad);
        if (gen0)
            cr_assert_eq(ts_check_all(s), 0, "%s: %s reads back wrong", what, list[i].name);
        ctxs_session_close(s);
    }
    check_prefix_honest(st, m, prompt, 512, what);
    check_prefix_honest(st, m, prompt, 100, what);
    free(prompt);
    ctxs_free(list);
    ctxs_store_repair_result rr;
    int rc = ctxs_store_repair(&rr, st);
    cr_assert_eq(rc, 0, "%s: repair: %s", what, ctxs_err_name(rc));
    cr_assert_eq(rr.files_removed, 0, "%s: repair removed %llu files the open left", what,
                 (unsigned long long)rr.files_removed);
    cr_assert_eq(rr.files_adopted, 0, "%s: repair adopted %llu files the open left", what,
                 (unsigned long long)rr.files_adopted);
    cr_assert_eq(rr.entries_removed, 0, "%s: repair removed %llu entries the open left", what,
                 (unsigned long long)rr.entries_removed);
    check_agree(st, what);
    ctxs_store_close(st);
    return n;
}

static size_t check_store(const ctxs_model *m, const char *what)
{
    return check_store_as(m, what, 1);
}

static void setup_store(const ctxs_model *m)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    cr_assert_eq(ctxs_model_register(st, m, "tiny"), 0);
    ctxs_store_close(st);
}

/* --- Two processes at once ------------------------------------------------------ */

#define SHARED_NAMES 10

typedef struct duo_args {
    int who;
    int go_fd;   /* read end: one byte starts both */
    int win_fd;  /* write end: one byte per shared name won */
    uint64_t seed;
} duo_args;

static void duo_child(void *p)
{
    const duo_args *a = p;
    ctxs_store *st = child_store(NULL);
    ctxs_model m = ts_model(MODEL_SEED);
    ctxs_create_options o = ts_options(512, 4, 1, CTXS_SYNC_NONE);
    uint64_t rng = a->seed;
    char c;
    if (read_byte(a->go_fd, &c) != 1)
        child_fail(CHILD_EOPEN, "go", -EPIPE);
    int mine = 0;
    for (int i = 0; i < 30; i++) {
        char name[64], other[64], dst[64];
        int rc;
        ctxs_session *s;
        /* Our own session: must always work. */
        snprintf(name, sizeof(name), "p%d-%d", a->who, i);
        if ((rc = ctxs_store_session_create(&s, st, name, &m, &o)) != 0)
            child_fail(CHILD_ECREATE, name, rc);
        if ((rc = c_append(s, 40 + (uint32_t)(ts_rng_next(&rng) % 200))) != 0)
            child_fail(CHILD_EAPPEND, name, rc);
        if (i % 4 == 0 && (rc = ctxs_checkpoint_create(s, "cp")) != 0)
            child_fail(CHILD_ECHECKPOINT, name, rc);
        ctxs_session_close(s);
        mine++;
        /* A name both want: one wins. */
        if (i < SHARED_NAMES) {
            snprintf(name, sizeof(name), "shared-%d", i);
            rc = ctxs_store_session_create(&s, st, name, &m, &o);
            if (rc == 0) {
                if ((rc = c_append(s, 70)) != 0)
                    child_fail(CHILD_EAPPEND, name, rc);
                ctxs_session_close(s);
                char b = (char)i;
                write_all(a->win_fd, &b, 1);
            } else if (rc != CTXS_ETAKEN) {
                child_fail(CHILD_ECREATE, name, rc);
            }
        }
        /* Fork from the other's sessions, which it may be deleting. */
        int j = (int)(ts_rng_next(&rng) % (uint64_t)(i + 1));
        snprintf(other, sizeof(other), "p%d-%d", 1 - a->who, j);
        snprintf(dst, sizeof(dst), "f%d-%d", a->who, i);
        uint64_t at = ts_rng_next(&rng) % 3 == 0 ? UINT64_MAX : 20;
        rc = ctxs_store_session_fork(NULL, st, other, dst, at, NULL);
        /* EINVAL: the other has created it and not yet written 20 tokens. */
        if (rc != 0 && rc != CTXS_ENOTFOUND && rc != CTXS_EBUSY && !(rc == CTXS_EINVAL && at == 20))
            child_fail(CHILD_EFORK, other, rc);
        if (i % 4 == 1) {
            rc = ctxs_store_session_fork_checkpoint(NULL, st, other, "cp", dst, NULL);
            if (rc != 0 && rc != CTXS_ENOTFOUND && rc != CTXS_EBUSY && rc != CTXS_ETAKEN)
                child_fail(CHILD_EFORK, "fork at checkpoint", rc);
        }
        /* Open the other's session read-only now and then. */
        rc = ctxs_store_session_open(&s, st, other, NULL, CTXS_RDONLY, NULL);
        if (rc == 0)
            ctxs_session_close(s);
        else if (rc != CTXS_ENOTFOUND && rc != CTXS_EBUSY)
            child_fail(CHILD_ESESSION, other, rc);
        /* Delete some of our own, and some forks of ours. */
        if (i % 3 == 2) {
            snprintf(name, sizeof(name), "p%d-%d", a->who, i - 1);
            rc = ctxs_store_session_delete(st, name);
            if (rc != 0 && rc != CTXS_EBUSY)
                child_fail(CHILD_EDELETE, name, rc);
            snprintf(name, sizeof(name), "f%d-%d", a->who, i - 2);
            rc = ctxs_store_session_delete(st, name);
            if (rc != 0 && rc != CTXS_EBUSY && rc != CTXS_ENOTFOUND)
                child_fail(CHILD_EDELETE, name, rc);
        }
        ctxs_session_entry *list;
        size_t n;
        if ((rc = ctxs_store_session_list(&list, &n, st)) != 0)
            child_fail(CHILD_ELIST, "list", rc);
        ctxs_free(list);
    }
    ctxs_store_close(st);
    (void)mine;
}

Test(index_crash, two_processes_create_fork_and_delete_at_once)
{
    ctxs_model m = ts_model(MODEL_SEED);
    setup_store(&m);
    uint64_t seed = ts_seed("two_processes_create_fork_and_delete_at_once");
    int go[2], win[2];
    cr_assert_eq(pipe2(go, O_CLOEXEC), 0);
    cr_assert_eq(pipe2(win, O_CLOEXEC), 0);
    duo_args args[2];
    pid_t pids[2];
    for (int i = 0; i < 2; i++) {
        args[i] = (duo_args){i, go[0], win[1], seed + (uint64_t)i * 7919u};
        pids[i] = spawn(duo_child, &args[i]);
    }
    close(win[1]);
    write_all(go[1], "gg", 2);
    close(go[1]);
    for (int i = 0; i < 2; i++) {
        int code = reap(pids[i]);
        cr_assert_eq(code, 0, "child %d failed: exit %d", i, code);
    }
    int wins[SHARED_NAMES] = {0};
    char b;
    while (read_byte(win[0], &b) == 1) {
        cr_assert(b >= 0 && b < SHARED_NAMES);
        wins[(int)b]++;
    }
    close(win[0]);
    close(go[0]);
    for (int i = 0; i < SHARED_NAMES; i++)
        cr_assert_eq(wins[i], 1, "shared-%d was created %d times", i, wins[i]);

    size_t n = check_store(&m, "after two processes");
    ctxs_store *st = ts_store_open(ts_store_dir());
    for (int i = 0; i < SHARED_NAMES; i++) {
        char name[32];
        snprintf(name, sizeof(name), "shared-%d", i);
        ctxs_session_entry e;
        cr_assert_eq(ctxs_store_session_get(&e, st, name), 0, "%s is missing", name);
        cr_assert_eq(e.n_tokens, 70);
    }
    /* Forks name their parent, and hold what they say. */
    ctxs_session_entry *list;
    cr_assert_eq(ctxs_store_session_list(&list, &n, st), 0);
    size_t forks = 0;
    for (size_t i = 0; i < n; i++) {
        if (list[i].name[0] != 'f')
            continue;
        forks++;
        cr_assert_neq(list[i].parent_id, 0, "%s has no parent", list[i].name);
        ctxs_session *s;
        cr_assert_eq(ctxs_store_session_open(&s, st, list[i].name, NULL, CTXS_RDONLY, NULL), 0);
        ctxs_session_info info;
        cr_assert_eq(ctxs_session_get_info(&info, s), 0);
        cr_assert_eq(info.n_tokens, list[i].fork_tokens, "%s: %llu tokens, fork_tokens %llu",
                     list[i].name, (unsigned long long)info.n_tokens,
                     (unsigned long long)list[i].fork_tokens);
        ctxs_session_close(s);
    }
    say("two processes: %zu sessions, %zu forks", n, forks);
    cr_assert_gt(forks, 0, "no fork succeeded");
    ctxs_free(list);
    ctxs_store_close(st);
}

/* --- Killed inside an LMDB write transaction ------------------------------------ */

typedef struct txn_args {
    int fd;          /* write end: one byte once the transaction holds data */
    int self_kill;   /* 1: raise(SIGKILL) at once; 0: wait to be killed */
} txn_args;

static void txn_child(void *p)
{
    const txn_args *a = p;
    ctxs_store *st = child_store(NULL);
    MDB_txn *txn;
    int rc = mdb_txn_begin(st->env, NULL, 0, &txn);
    if (rc != 0)
        child_fail(CHILD_EMDB, "mdb_txn_begin", rc);
    /* Real work inside the transaction: a ghost session entry and a meta
     * record, so that dirty pages exist when the process dies. */
    MDB_val key = {5, (void *)"ghost"}, val = {5, (void *)"boo!!"};
    if ((rc = mdb_put(txn, st->meta, &key, &val, 0)) != 0)
        child_fail(CHILD_EMDB, "mdb_put", rc);
    ctxs__session_rec rec;
    memset(&rec, 0, sizeof(rec));
    rec.id = 0xdead;
    MDB_val skey = {5, (void *)"ghost"}, sval = {sizeof(rec), &rec};
    if ((rc = mdb_put(txn, st->sessions, &skey, &sval, 0)) != 0)
        child_fail(CHILD_EMDB, "mdb_put", rc);
    write_all(a->fd, "t", 1);
    if (a->self_kill)
        raise(SIGKILL);
    for (;;)
        pause();
}

typedef struct writer_thread {
    ctxs_store *st;
    const ctxs_model *m;
    atomic_int done;
    int rc;
} writer_thread;

static void *writer_main(void *p)
{
    writer_thread *w = p;
    ctxs_create_options o = ts_options(256, 4, 1, CTXS_SYNC_NONE);
    ctxs_session *s = NULL;
    w->rc = ctxs_store_session_create(&s, w->st, "waited", w->m, &o);
    if (w->rc == 0) {
        w->rc = c_append(s, 70);
        ctxs_session_close(s);
    }
    atomic_store(&w->done, 1);
    return NULL;
}

static void check_no_ghost(ctxs_store *st)
{
    ctxs_session_entry e;
    cr_assert_eq(ctxs_store_session_get(&e, st, "ghost"), CTXS_ENOTFOUND,
                 "the dead process's uncommitted entry is visible");
    MDB_txn *txn;
    cr_assert_eq(mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn), 0);
    MDB_val key = {5, (void *)"ghost"}, val;
    cr_assert_eq(mdb_get(txn, st->meta, &key, &val), MDB_NOTFOUND);
    mdb_txn_abort(txn);
}

Test(index_crash, a_process_killed_inside_a_write_transaction_does_not_block_the_next)
{
    ctxs_model m = ts_model(MODEL_SEED);
    setup_store(&m);
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_create_options o = ts_options(256, 4, 1, CTXS_SYNC_NONE);
    ctxs_session *s;
    cr_assert_eq(ctxs_store_session_create(&s, st, "before", &m, &o), 0);
    cr_assert_eq(c_append(s, 70), 0);
    ctxs_session_close(s);

    /* 1. The child kills itself inside its transaction; then we write. */
    int p[2];
    cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
    txn_args a = {p[1], 1};
    pid_t pid = spawn(txn_child, &a);
    close(p[1]);
    char c;
    cr_assert_eq(read_byte(p[0], &c), 1, "the child did not reach its transaction");
    close(p[0]);
    cr_assert_eq(reap(pid), 128 + SIGKILL);
    cr_assert_eq(ctxs_store_session_create(&s, st, "after", &m, &o), 0,
                 "a write after the kill must proceed");
    cr_assert_eq(c_append(s, 130), 0);
    ctxs_session_close(s);
    check_no_ghost(st);

    /* 2. We wait on the lock the child holds; the child is killed; our write
     * goes through. */
    cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
    a = (txn_args){p[1], 0};
    pid = spawn(txn_child, &a);
    close(p[1]);
    cr_assert_eq(read_byte(p[0], &c), 1);
    close(p[0]);
    writer_thread w = {st, &m, 0, -1};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, writer_main, &w), 0);
    ts_sleep_us(200000);
    cr_assert_eq(atomic_load(&w.done), 0, "the write did not wait for the child's transaction");
    kill(pid, SIGKILL);
    cr_assert_eq(reap(pid), 128 + SIGKILL);
    for (int i = 0; i < 1000 && !atomic_load(&w.done); i++)
        ts_sleep_us(10000);
    cr_assert_eq(atomic_load(&w.done), 1, "the write is still blocked 10 s after the kill");
    pthread_join(th, NULL);
    cr_assert_eq(w.rc, 0, "the waiting write failed: %s", ctxs_err_name(w.rc));
    check_no_ghost(st);
    ctxs_store_close(st);

    /* 3. A fresh open, and a fresh process, work too. */
    size_t n = check_store(&m, "after kills inside write transactions");
    cr_assert_eq(n, 3);
    st = ts_store_open(ts_store_dir());
    check_no_ghost(st);
    ctxs_store_close(st);
}

/* --- Killed inside read transactions ---------------------------------------------- */

static void reader_child(void *p)
{
    const txn_args *a = p;
    ctxs_store_options o = CTXS_STORE_OPTIONS_INIT;
    o.max_readers = 8;
    ctxs_store *st = child_store(&o);
    MDB_txn *txn;
    int rc = mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn);
    if (rc != 0)
        child_fail(CHILD_EMDB, "mdb_txn_begin(RDONLY)", rc);
    write_all(a->fd, "r", 1);
    raise(SIGKILL);
}

Test(index_crash, processes_killed_inside_read_transactions_do_not_use_up_the_readers)
{
    /* The reader table is shared by every process of the store. A process
     * that dies inside a read transaction leaves its slot marked with its
     * pid; a store that lives longer than many such deaths must still find
     * a slot. */
    ctxs_model m = ts_model(MODEL_SEED);
    ctxs_store_options o = CTXS_STORE_OPTIONS_INIT;
    o.max_readers = 8;
    ctxs_store *st;
    cr_assert_eq(ctxs_store_open(&st, ts_store_dir(), CTXS_STORE_CREATE, &o), 0);
    cr_assert_eq(ctxs_model_register(st, &m, NULL), 0);
    for (int i = 0; i < 12; i++) {
        int p[2];
        cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
        txn_args a = {p[1], 1};
        pid_t pid = spawn(reader_child, &a);
        close(p[1]);
        char c;
        int got = read_byte(p[0], &c);
        close(p[0]);
        int code = reap(pid);
        cr_assert_eq(got, 1, "child %d never got a read transaction (exit %d)", i, code);
        cr_assert_eq(code, 128 + SIGKILL);
        /* The long-lived process keeps working. */
        ctxs_model_entry me;
        int rc = ctxs_model_get(&me, st, m.model_hash);
        cr_assert_eq(rc, 0, "after %d dead readers: model_get: %s", i + 1, ctxs_err_name(rc));
    }
    ctxs_create_options so = ts_options(256, 4, 1, CTXS_SYNC_NONE);
    ctxs_session *s;
    int rc = ctxs_store_session_create(&s, st, "still-works", &m, &so);
    cr_assert_eq(rc, 0, "after 12 dead readers: create: %s", ctxs_err_name(rc));
    ctxs_session_close(s);
    ctxs_store_close(st);
}

/* --- Killed at random moments ------------------------------------------------------- */

typedef struct chaos_args {
    uint64_t seed;
} chaos_args;

/* Creates, appends, rolls back, checkpoints, forks, renames, deletes and
 * collects, forever; every token written is ts_fill_kv()'s for its
 * position, so that every session, fork or not, reads back as
 * ts_check_all() expects. */
static void chaos_child(void *p)
{
    const chaos_args *a = p;
    ctxs_store *st = child_store(NULL);
    ctxs_model m = ts_model(MODEL_SEED);
    ctxs_create_options o = ts_options(256, 4, 1, CTXS_SYNC_NONE);
    uint64_t rng = a->seed;
    for (unsigned iter = 0;; iter++) {
        ctxs_session_entry *list;
        size_t n;
        int rc = ctxs_store_session_list(&list, &n, st);
        if (rc != 0)
            child_fail(CHILD_ELIST, "list", rc);
        uint64_t r = ts_rng_next(&rng);
        char pick[256] = "";
        if (n)
            memcpy(pick, list[r % n].name, sizeof(pick));
        ctxs_free(list);
        char name[64];
        snprintf(name, sizeof(name), "c%llx-%u", (unsigned long long)(a->seed & 0xffffff), iter);
        ctxs_session *s;
        unsigned what = (unsigned)((r >> 8) % 10);
        if (n < 2)
            what = 0;
        else if (n > 6 && what < 3)
            what = 6;
        switch (what) {
        case 0:
        case 1:
            if ((rc = ctxs_store_session_create(&s, st, name, &m, &o)) != 0)
                child_fail(CHILD_ECREATE, name, rc);
            if ((rc = c_append(s, 1 + (uint32_t)((r >> 16) % 150))) != 0)
                child_fail(CHILD_EAPPEND, name, rc);
            if ((r >> 24) % 2 && (rc = ctxs_checkpoint_create(s, "cp")) != 0)
                child_fail(CHILD_ECHECKPOINT, name, rc);
            ctxs_session_close(s);
            break;
        case 2:
        case 3:
            if ((rc = ctxs_store_session_open(&s, st, pick, &m, 0, NULL)) != 0)
                child_fail(CHILD_ESESSION, pick, rc);
            if ((r >> 16) % 3 == 0) {
                uint64_t nt = c_tokens(s);
                rc = ctxs_session_rollback(s, nt / 2);
                if (rc != 0 && rc != CTXS_EEVICTED)
                    child_fail(CHILD_EAPPEND, "rollback", rc);
            } else if ((r >> 16) % 3 == 1) {
                rc = ctxs_checkpoint_restore(s, "cp");
                if (rc != 0 && rc != CTXS_ENOTFOUND && rc != CTXS_EEVICTED && rc != CTXS_ESTALE)
                    child_fail(CHILD_ECHECKPOINT, "restore", rc);
            }
            if ((rc = c_append(s, 1 + (uint32_t)((r >> 24) % 120))) != 0)
                child_fail(CHILD_EAPPEND, pick, rc);
            ctxs_session_close(s);
            break;
        case 4:
            rc = ctxs_store_session_fork(NULL, st, pick, name, (r >> 16) % 2 ? UINT64_MAX : 0, NULL);
            if (rc != 0 && rc != CTXS_EEVICTED)
                child_fail(CHILD_EFORK, pick, rc);
            break;
        case 5:
            rc = ctxs_store_session_fork_checkpoint(NULL, st, pick, "cp", name, NULL);
            if (rc != 0 && rc != CTXS_ENOTFOUND && rc != CTXS_EEVICTED && rc != CTXS_ESTALE)
                child_fail(CHILD_EFORK, "fork at checkpoint", rc);
            break;
        case 6:
        case 7:
            if ((rc = ctxs_store_session_delete(st, pick)) != 0)
                child_fail(CHILD_EDELETE, pick, rc);
            break;
        case 8:
            if ((rc = ctxs_store_session_rename(st, pick, name)) != 0)
                child_fail(CHILD_ERENAME, pick, rc);
            break;
        case 9:
            if ((r >> 16) % 2) {
                if ((rc = ctxs_store_repair(NULL, st)) != 0)
                    child_fail(CHILD_EREPAIR, "repair", rc);
            } else if ((rc = ctxs_store_gc(NULL, st, 200000, 0)) != 0) {
                child_fail(CHILD_EGC, "gc", rc);
            }
            break;
        }
    }
}

/* What a dead process left, read before any store open resolves it: intents
 * in the index (raw LMDB; this process holds no store handle) and files
 * written aside. */
static void count_leftovers(size_t *intents, size_t *tmp_files)
{
    *intents += ts_raw_entries(ts_store_dir(), "pending");
    DIR *d = opendir(ts_path(ts_store_dir(), "sessions"));
    cr_assert_not_null(d);
    for (struct dirent *de; (de = readdir(d));)
        *tmp_files += strstr(de->d_name, ".tmp-") != NULL;
    closedir(d);
}

Test(index_crash, kills_at_random_moments_leave_files_and_index_in_agreement)
{
    ctxs_model m = ts_model(MODEL_SEED);
    setup_store(&m);
    uint64_t seed = ts_seed("kills_at_random_moments_leave_files_and_index_in_agreement");
    uint64_t rng = seed;
    size_t most = 0, intents = 0, tmp_files = 0;
    for (int i = 0; i < 100; i++) {
        chaos_args a = {ts_rng_next(&rng)};
        pid_t pid = spawn(chaos_child, &a);
        /* Mostly early kills, some late ones: the first operations and
         * whatever comes later. */
        uint64_t r = ts_rng_next(&rng);
        long us = (long)(r % 4 == 0 ? r % 200000 : r % 40000);
        ts_sleep_us(us);
        kill(pid, SIGKILL);
        int code = reap(pid);
        cr_assert(code == 128 + SIGKILL, "iteration %d: the child failed on its own: exit %d "
                  "(seed %llu)", i, code, (unsigned long long)seed);
        count_leftovers(&intents, &tmp_files);
        char what[64];
        snprintf(what, sizeof(what), "kill %d after %ld us", i, us);
        size_t n = check_store(&m, what);
        if (n > most)
            most = n;
    }
    say("random kills: up to %zu sessions; %zu intents and %zu files written aside left by the "
        "dead", most, intents, tmp_files);
    cr_assert_gt(most, 0, "no child ever created a session");
    /* About one kill in three lands inside a create, fork or delete. */
    cr_assert_gt(intents, 0, "no kill landed inside a create or a delete");
}

/* --- A fork while another process writes the source ------------------------------ */

typedef struct live_args {
    int fd; /* write end: 's' once writing, 'd' when done */
    uint32_t until;
} live_args;

static void live_writer(void *p)
{
    const live_args *a = p;
    ctxs_store *st = child_store(NULL);
    ctxs_model m = ts_model(MODEL_SEED);
    ctxs_session *s;
    int rc = ctxs_store_session_open(&s, st, "live", &m, 0, NULL);
    if (rc != 0)
        child_fail(CHILD_ESESSION, "open live", rc);
    write_all(a->fd, "s", 1);
    while (c_tokens(s) < a->until) {
        if ((rc = c_append(s, 5)) != 0)
            child_fail(CHILD_EAPPEND, "live", rc);
        ts_sleep_us(1000);
    }
    ctxs_session_close(s);
    ctxs_store_close(st);
    write_all(a->fd, "d", 1);
}

Test(index_crash, fork_from_a_session_another_process_is_writing)
{
    ctxs_model m = ts_model(MODEL_SEED);
    setup_store(&m);
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_create_options o = ts_options(2048, 4, 1, CTXS_SYNC_NONE);
    ctxs_session *s;
    cr_assert_eq(ctxs_store_session_create(&s, st, "live", &m, &o), 0);
    cr_assert_eq(c_append(s, 100), 0);
    cr_assert_eq(ctxs_checkpoint_create(s, "cp"), 0);
    ctxs_session_close(s);
    uint64_t live_id;
    {
        ctxs_session_entry e;
        cr_assert_eq(ctxs_store_session_get(&e, st, "live"), 0);
        live_id = e.id;
    }
    ctxs_store_close(st); /* the child opens its own; we reopen after */

    int p[2];
    cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
    live_args a = {p[1], 1800};
    pid_t pid = spawn(live_writer, &a);
    close(p[1]);
    char c;
    cr_assert_eq(read_byte(p[0], &c), 1);
    cr_assert_eq(c, 's');
    st = ts_store_open(ts_store_dir());
    cr_assert_eq(ctxs_store_session_delete(st, "live"), CTXS_EBUSY,
                 "delete while another process writes it");
    ctxs_session *x;
    cr_assert_eq(ctxs_store_session_open(&x, st, "live", &m, 0, NULL), CTXS_EBUSY);
    /* gc never takes a session another process has open. */
    ctxs_store_gc_result g;
    cr_assert_eq(ctxs_store_gc(&g, st, 0, 0), 0);
    cr_assert_eq(g.deleted, 0);
    cr_assert_eq(g.skipped_open, 1);
    cr_assert_gt(g.bytes_before, 0);
    cr_assert_eq(g.bytes_after, g.bytes_before);
    cr_assert_null(g.sessions);
    /* Its prefixes are found from here while it is being written. */
    uint32_t *prompt = make_prompt(2000, 2000, 0);
    ctxs_prefix_match pm;
    int frc = ctxs_prefix_find(&pm, st, m.model_hash, prompt, 2000);
    cr_assert_eq(frc, 0, "prefix_find while another process writes: %s", ctxs_err_name(frc));
    cr_assert_str_eq(pm.session, "live");
    cr_assert_geq(pm.n_tokens, 100);
    check_prefix_honest(st, &m, prompt, 2000, "while writing");
    int forks = 0;
    uint64_t last = 0;
    for (int i = 0; i < 24; i++) {
        char name[32];
        snprintf(name, sizeof(name), "snap-%d", i);
        ctxs_session *f;
        int rc;
        uint64_t want = UINT64_MAX;
        if (i % 3 == 1)
            want = 100;
        if (i % 3 == 2)
            rc = ctxs_store_session_fork_checkpoint(&f, st, "live", "cp", name, NULL);
        else
            rc = ctxs_store_session_fork(&f, st, "live", name, want, NULL);
        cr_assert_eq(rc, 0, "%s: fork: %s", name, ctxs_err_name(rc));
        uint64_t n = c_tokens(f);
        if (want == 100 || i % 3 == 2)
            cr_assert_eq(n, 100, "%s: %llu tokens", name, (unsigned long long)n);
        else
            cr_assert_geq(n, last, "%s: a later full fork holds fewer tokens", name);
        if (want == UINT64_MAX && i % 3 == 0)
            last = n;
        cr_assert_eq(ctxs_session_verify(NULL, f), 0, "%s does not verify", name);
        cr_assert_eq(ts_check_all(f), 0, "%s reads back wrong", name);
        ctxs_session *src;
        cr_assert_eq(ctxs_store_session_open(&src, st, "live", NULL, CTXS_RDONLY, NULL), 0);
        cr_assert_geq(c_tokens(src), n);
        ts_same_tokens(src, f, n, name);
        ctxs_session_close(src);
        ctxs_session_close(f);
        ctxs_session_entry e;
        cr_assert_eq(ctxs_store_session_get(&e, st, name), 0);
        cr_assert_eq(e.parent_id, live_id);
        cr_assert_eq(e.fork_tokens, n, "%s: fork_tokens %llu, holds %llu", name,
                     (unsigned long long)e.fork_tokens, (unsigned long long)n);
        forks++;
        ts_sleep_us(2000);
    }
    cr_assert_eq(read_byte(p[0], &c), 1);
    cr_assert_eq(c, 'd');
    close(p[0]);
    cr_assert_eq(reap(pid), 0);
    frc = ctxs_prefix_find(&pm, st, m.model_hash, prompt, 2000);
    cr_assert_eq(frc, 0);
    cr_assert_eq(pm.n_tokens, 1800, "after the writer closed: %llu", (unsigned long long)pm.n_tokens);
    free(prompt);
    say("fork while writing: the last full fork held %llu tokens", (unsigned long long)last);
    cr_assert_gt(last, 100, "no fork saw the writer's commits");
    ctxs_store_close(st);
    cr_assert_eq(check_store(&m, "after forks of a live session"), 1 + (size_t)forks);
}

/* --- Prefix entries a killed writer left behind ------------------------------------ */

typedef struct prefix_args {
    int fd;
    int mode; /* 0: many chunks after the first; 1: other tokens after a rollback */
} prefix_args;

static void prefix_writer(void *p)
{
    const prefix_args *a = p;
    ctxs_store *st = child_store(NULL);
    ctxs_model m = ts_model(MODEL_SEED);
    ctxs_create_options o = ts_options(2048, 4, 1, CTXS_SYNC_NONE);
    ctxs_session *s;
    int rc = ctxs_store_session_create(&s, st, "k", &m, &o);
    if (rc != 0)
        child_fail(CHILD_ECREATE, "k", rc);
    /* The first chunk is indexed at once. */
    if ((rc = c_append(s, 64)) != 0)
        child_fail(CHILD_EAPPEND, "k", rc);
    if (a->mode == 0) {
        /* Ten more chunks: fewer than a batch, not indexed yet. */
        if ((rc = c_append(s, 640)) != 0)
            child_fail(CHILD_EAPPEND, "k", rc);
    } else {
        /* Back to 10 tokens, then five chunks' worth of other tokens in one
         * commit: the index still lists the old first chunk. */
        if ((rc = ctxs_session_rollback(s, 10)) != 0)
            child_fail(CHILD_EAPPEND, "rollback", rc);
        ctxs_reservation r;
        uint16_t k[TS_KV_MAX], v[TS_KV_MAX];
        uint32_t ids[310];
        if ((rc = ctxs_session_reserve(&r, s, 310)) != 0)
            child_fail(CHILD_EAPPEND, "reserve", rc);
        for (uint32_t i = 0; i < 310; i++) {
            ts_fill_kv(&m.geometry, vpos(r.first_pos + i, 1), k, v);
            ids[i] = ts_token(vpos(r.first_pos + i, 1));
            if ((rc = ctxs_session_write_token(s, &r, i, k, v, CTXS_DTYPE_F16)) != 0)
                child_fail(CHILD_EAPPEND, "write", rc);
        }
        if ((rc = ctxs_session_commit(s, ids, 310)) != 0)
            child_fail(CHILD_EAPPEND, "commit", rc);
    }
    write_all(a->fd, "k", 1);
    for (;;)
        pause(); /* never closed: killed */
}

static void prefix_after_kill(int mode)
{
    ctxs_model m = ts_model(MODEL_SEED);
    setup_store(&m);
    int p[2];
    cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
    prefix_args a = {p[1], mode};
    pid_t pid = spawn(prefix_writer, &a);
    close(p[1]);
    char c;
    int got = read_byte(p[0], &c);
    close(p[0]);
    if (got != 1)
        cr_assert_fail("the writer failed: exit %d", reap(pid));
    kill_and_reap(pid);

    uint64_t held = mode == 0 ? 704 : 320;
    uint32_t *now = mode == 0 ? make_prompt(800, 800, 0) : make_prompt(400, 10, 1);
    uint32_t *old = make_prompt(800, 800, 0);
    /* Before anyone opens the session: a miss is allowed, a wrong match is
     * not. */
    ctxs_store *st = ts_store_open(ts_store_dir());
    check_prefix_honest(st, &m, now, held, "before the reopen");
    check_prefix_honest(st, &m, now, mode == 0 ? 800 : 400, "before the reopen");
    check_prefix_honest(st, &m, old, 800, "before the reopen (old tokens)");
    ctxs_prefix_match pm;
    if (mode == 1)
        cr_assert_eq(ctxs_prefix_find(&pm, st, m.model_hash, old, 800), CTXS_ENOTFOUND,
                     "the old first chunk matched %llu tokens", (unsigned long long)pm.n_tokens);
    /* A read-write open catches up at once. */
    ctxs_session *s;
    cr_assert_eq(ctxs_store_session_open(&s, st, "k", &m, 0, NULL), 0);
    cr_assert_eq(c_tokens(s), held);
    int rc = ctxs_prefix_find(&pm, st, m.model_hash, now, held);
    cr_assert_eq(rc, 0, "after the reopen: %s", ctxs_err_name(rc));
    cr_assert_str_eq(pm.session, "k");
    cr_assert_eq(pm.n_tokens, held);
    /* Every whole chunk is indexed, not only the first. */
    MDB_txn *txn;
    MDB_stat ms;
    cr_assert_eq(mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn), 0);
    cr_assert_eq(mdb_stat(txn, st->chunks, &ms), 0);
    mdb_txn_abort(txn);
    cr_assert_eq(ms.ms_entries, held / CTXS_PREFIX_CHUNK, "%zu chunk entries for %llu tokens",
                 ms.ms_entries, (unsigned long long)held);
    if (mode == 1) {
        cr_assert_eq(ctxs_prefix_find(&pm, st, m.model_hash, old, 800), CTXS_ENOTFOUND);
        cr_assert_eq(mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn), 0);
        cr_assert_eq(mdb_stat(txn, st->prefixes, &ms), 0);
        mdb_txn_abort(txn);
        cr_assert_eq(ms.ms_entries, held / CTXS_PREFIX_CHUNK, "stale prefix entries remain");
    }
    ctxs_session_close(s);
    rc = ctxs_prefix_find(&pm, st, m.model_hash, now, held);
    cr_assert_eq(rc, 0);
    cr_assert_eq(pm.n_tokens, held);
    free(now);
    free(old);
    ctxs_store_close(st);
    check_store_as(&m, "prefix after a kill", mode == 0);
}

Test(index_crash, prefix_entries_catch_up_after_a_writer_is_killed_before_close)
{
    prefix_after_kill(0);
}

Test(index_crash, prefix_entries_of_rewritten_tokens_catch_up_after_a_kill)
{
    prefix_after_kill(1);
}

Test(index_crash, repair_after_a_kill_also_catches_up_prefixes)
{
    ctxs_model m = ts_model(MODEL_SEED);
    setup_store(&m);
    int p[2];
    cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
    prefix_args a = {p[1], 1};
    pid_t pid = spawn(prefix_writer, &a);
    close(p[1]);
    char c;
    cr_assert_eq(read_byte(p[0], &c), 1);
    close(p[0]);
    kill_and_reap(pid);
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_store_repair_result rr;
    cr_assert_eq(ctxs_store_repair(&rr, st), 0);
    cr_assert_eq(rr.prefixes_updated, 1);
    cr_assert_eq(rr.files_removed + rr.files_adopted + rr.entries_removed, 0);
    uint32_t *now = make_prompt(400, 10, 1);
    ctxs_prefix_match pm;
    cr_assert_eq(ctxs_prefix_find(&pm, st, m.model_hash, now, 400), 0);
    cr_assert_eq(pm.n_tokens, 320);
    free(now);
    ctxs_store_close(st);
}
