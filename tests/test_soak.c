/*
 * Crash soaks (suite 'soak', not in the default run:
 * `meson test -C build --setup soak --suite soak`).
 *
 * Writers in child processes are SIGKILLed thousands of times, at random
 * moments (the parent kills them after a random delay) and at seeded points
 * right inside operations: this file interposes the calls that write or
 * sync (pwrite, fdatasync, msync, sync_file_range, fallocate, rename, link,
 * unlink, LMDB's mdb_put/mdb_del/mdb_txn_commit/mdb_env_copyfd2, ...) and a
 * child armed with a countdown kills itself with a real SIGKILL just before
 * or just after the Nth of them. Each writer tells the parent through a
 * pipe what it is about to do and what each call returned, before it goes
 * on; after every kill the parent opens the crash image the dead writer
 * left and checks that no acknowledged token is lost and every token reads
 * back as it was written (the contents of a token are a function of its
 * position and its generation: tests/support.h, "Self-describing tokens").
 * Meanwhile reader processes open the sessions read-only over and over and
 * check that they only ever see committed, whole tokens: each state a
 * reader saw must be one a writer announced.
 *
 * Every test prints what it did: kills (and how many at kill points),
 * crash images checked, acknowledged tokens, lost tokens (must be 0),
 * reader checks. CTXS_SOAK_SCALE (default 1) multiplies the number of
 * kills; CTXS_TEST_SEED replays a run. The short tests at the end
 * reproduce, exactly, each bug these soaks found, stopping a writer at one
 * call instead of killing it at a random one.
 *
 * Runs with --jobs 1.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ctxstore.h"
#include "aside.h"
#include "index.h"
#include "support.h"

#define say(...) (fprintf(stderr, __VA_ARGS__), fputc('\n', stderr))

#define MODEL_SEED 23u

TestSuite(soak, .init = ts_scratch_init, .fini = ts_scratch_fini);

static double soak_scale(void)
{
    const char *e = getenv("CTXS_SOAK_SCALE");
    double v = e && *e ? strtod(e, NULL) : 1.0;
    return v > 0 ? v : 1.0;
}

static unsigned scaled(unsigned n)
{
    double v = n * soak_scale();
    return v < 1 ? 1u : (unsigned)v;
}

/* --- Messages from a child ---------------------------------------------------
 *
 * One write() each, below PIPE_BUF: a kill never leaves half a message. */

struct msg {
    uint32_t type;
    int32_t rc;
    uint32_t gen;
    uint32_t flag;
    uint64_t a, b;
    char s1[24], s2[24];
};

enum {
    M_KILLPOINT = 1, /* the child kills itself now: gen = call, flag = after */
    M_ACK,           /* the call announced last returned rc */
    M_HELD,          /* the child stopped at its kill point, to be killed */
    /* the session soak */
    M_APPEND,   /* about to append [a, b) in generation gen */
    M_ROLLBACK, /* about to roll back from b to a */
    M_SYNC,
    M_FORK,     /* about to fork a tokens into fork file number b */
    M_REOPEN,
    M_WRITTEN,  /* reserved and wrote [a, b); will not commit */
    /* the store soak: s1 (and s2) name sessions, checkpoints, exports */
    B_OPEN,
    B_CLOSE,
    B_CREATE,
    B_APPEND,     /* s1: [a, b) in generation gen */
    B_ROLLBACK,   /* s1: from b to a */
    B_CP_CREATE,  /* s1, checkpoint s2 at a */
    B_CP_RESTORE, /* s1 to checkpoint s2 (a tokens), from b */
    B_CP_DELETE,
    B_FORK,       /* s1 -> s2 at a tokens (flag: through a checkpoint) */
    B_DELETE,
    B_RENAME,     /* s1 -> s2 */
    B_GC,         /* budget a */
    B_GONE,       /* gc deleted s1 */
    B_COMPACT,    /* s1, or all when empty; ack a: index rewritten */
    B_EXPORT,     /* s1 (a tokens) to export s2 */
    B_IMPORT,     /* export s2 as s1 */
    B_REPAIR,     /* ack a: what it found to do */
    B_VERIFY,
};

static int child_msg_fd = -1;

/* Straight to the kernel: the interposed write() below is a kill point. */
static void child_send(const struct msg *m)
{
    long w;
    do
        w = syscall(SYS_write, child_msg_fd, m, sizeof(*m));
    while (w < 0 && errno == EINTR);
    if (w != (long)sizeof(*m))
        _exit(3);
}

static void child_say(uint32_t type, int32_t rc, uint32_t gen, uint64_t a, uint64_t b,
                      const char *s1, const char *s2)
{
    struct msg m;
    memset(&m, 0, sizeof(m));
    m.type = type;
    m.rc = rc;
    m.gen = gen;
    m.a = a;
    m.b = b;
    if (s1)
        snprintf(m.s1, sizeof(m.s1), "%s", s1);
    if (s2)
        snprintf(m.s2, sizeof(m.s2), "%s", s2);
    child_send(&m);
}

static _Noreturn void child_fail(const char *what, int rc, uint64_t a, uint64_t b)
{
    fprintf(stderr, "soak child %ld: %s: %d %s (%llu, %llu)\n", (long)getpid(), what, rc,
            ctxs_err_name(rc), (unsigned long long)a, (unsigned long long)b);
    _exit(10);
}

/* --- Kill points -------------------------------------------------------------
 *
 * The calls below are interposed for the whole test program (the library is
 * linked in statically, and LMDB's shared library binds to the program's
 * definitions first). Disarmed (the parent, the readers) they only pass the
 * call on. */

enum {
    KP_PWRITE,
    KP_WRITE,
    KP_WRITEV,
    KP_FSYNC,
    KP_FDATASYNC,
    KP_MSYNC,
    KP_SYNC_FILE_RANGE,
    KP_FTRUNCATE,
    KP_FALLOCATE,
    KP_RENAME,
    KP_LINK,
    KP_UNLINK,
    KP_MDB_PUT,
    KP_MDB_DEL,
    KP_MDB_COMMIT,
    KP_MDB_COPY,
    KP_OPEN_TMP, /* open() of a file written aside (".tmp-" in its name, or O_TMPFILE) */
    KP_N
};

static const char *const kp_names[KP_N] = {
    "pwrite", "write", "writev", "fsync", "fdatasync", "msync", "sync_file_range",
    "ftruncate", "fallocate", "rename", "link", "unlink", "mdb_put", "mdb_del",
    "mdb_txn_commit", "mdb_env_copyfd2", "open(.tmp-)",
};

static atomic_long kp_left;    /* calls until the kill; 0: disarmed */
static atomic_int kp_after;    /* 1: kill right after the call returns */
static atomic_int kp_only = -1; /* >= 0: count only this call */
static atomic_int kp_hold;     /* 1: stop there (M_HELD) instead, to be killed */
static int kp_release_fd = -1; /* held: a byte here lets it go on */

static void kp_arm(long countdown, int after)
{
    atomic_store(&kp_after, after);
    atomic_store(&kp_left, countdown);
}

static void kp_at(int call, int after)
{
    if (atomic_load_explicit(&kp_left, memory_order_relaxed) <= 0 ||
        atomic_load_explicit(&kp_after, memory_order_relaxed) != after)
        return;
    int only = atomic_load_explicit(&kp_only, memory_order_relaxed);
    if (only >= 0 && only != call)
        return;
    if (atomic_fetch_sub(&kp_left, 1) != 1)
        return;
    struct msg m;
    memset(&m, 0, sizeof(m));
    m.type = atomic_load(&kp_hold) ? M_HELD : M_KILLPOINT;
    m.gen = (uint32_t)call;
    m.flag = (uint32_t)after;
    child_send(&m);
    if (m.type == M_KILLPOINT)
        kill(getpid(), SIGKILL);
    uint8_t next;
    if (kp_release_fd >= 0 && syscall(SYS_read, kp_release_fd, &next, 1) == 1) {
        /* Released: go on, and stop again at the next call of that kind. */
        atomic_store(&kp_only, next);
        atomic_store(&kp_left, 1);
        return;
    }
    for (;;)
        pause();
}

static void *kp_real(void **slot, const char *sym)
{
    void *f = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (!f) {
        f = dlsym(RTLD_NEXT, sym);
        if (!f)
            abort();
        __atomic_store_n(slot, f, __ATOMIC_RELEASE);
    }
    return f;
}

/* The body of an interposer: a kill point before and after the real call,
 * errno kept. */
#define KP_CALL(call, sym, rtype, ftype, args)                                                     \
    static void *real_;                                                                            \
    __typeof__(ftype) f_;                                                                        \
    void *p_ = kp_real(&real_, sym);                                                               \
    memcpy(&f_, &p_, sizeof(f_));                                                                  \
    kp_at(call, 0);                                                                                \
    rtype r_ = f_ args;                                                                            \
    int e_ = errno;                                                                                \
    kp_at(call, 1);                                                                                \
    errno = e_;                                                                                    \
    return r_

/* Symbol names are given explicitly: the headers map some of these names to
 * their 64-bit variants, and both are interposed. */
ssize_t kp_pwrite(int fd, const void *b, size_t n, off_t off) __asm__("pwrite");
ssize_t kp_pwrite(int fd, const void *b, size_t n, off_t off)
{
    KP_CALL(KP_PWRITE, "pwrite", ssize_t, ssize_t (*)(int, const void *, size_t, off_t),
            (fd, b, n, off));
}
ssize_t kp_pwrite64(int fd, const void *b, size_t n, off_t off) __asm__("pwrite64");
ssize_t kp_pwrite64(int fd, const void *b, size_t n, off_t off)
{
    KP_CALL(KP_PWRITE, "pwrite64", ssize_t, ssize_t (*)(int, const void *, size_t, off_t),
            (fd, b, n, off));
}
ssize_t kp_write(int fd, const void *b, size_t n) __asm__("write");
ssize_t kp_write(int fd, const void *b, size_t n)
{
    KP_CALL(KP_WRITE, "write", ssize_t, ssize_t (*)(int, const void *, size_t), (fd, b, n));
}
ssize_t kp_writev(int fd, const struct iovec *iov, int n) __asm__("writev");
ssize_t kp_writev(int fd, const struct iovec *iov, int n)
{
    KP_CALL(KP_WRITEV, "writev", ssize_t, ssize_t (*)(int, const struct iovec *, int),
            (fd, iov, n));
}
int kp_fsync(int fd) __asm__("fsync");
int kp_fsync(int fd)
{
    KP_CALL(KP_FSYNC, "fsync", int, int (*)(int), (fd));
}
int kp_fdatasync(int fd) __asm__("fdatasync");
int kp_fdatasync(int fd)
{
    KP_CALL(KP_FDATASYNC, "fdatasync", int, int (*)(int), (fd));
}
int kp_msync(void *addr, size_t len, int flags) __asm__("msync");
int kp_msync(void *addr, size_t len, int flags)
{
    KP_CALL(KP_MSYNC, "msync", int, int (*)(void *, size_t, int), (addr, len, flags));
}
int kp_sync_file_range(int fd, off_t off, off_t len, unsigned flags) __asm__("sync_file_range");
int kp_sync_file_range(int fd, off_t off, off_t len, unsigned flags)
{
    KP_CALL(KP_SYNC_FILE_RANGE, "sync_file_range", int, int (*)(int, off_t, off_t, unsigned),
            (fd, off, len, flags));
}
int kp_ftruncate(int fd, off_t len) __asm__("ftruncate");
int kp_ftruncate(int fd, off_t len)
{
    KP_CALL(KP_FTRUNCATE, "ftruncate", int, int (*)(int, off_t), (fd, len));
}
int kp_ftruncate64(int fd, off_t len) __asm__("ftruncate64");
int kp_ftruncate64(int fd, off_t len)
{
    KP_CALL(KP_FTRUNCATE, "ftruncate64", int, int (*)(int, off_t), (fd, len));
}
int kp_fallocate(int fd, int mode, off_t off, off_t len) __asm__("fallocate");
int kp_fallocate(int fd, int mode, off_t off, off_t len)
{
    KP_CALL(KP_FALLOCATE, "fallocate", int, int (*)(int, int, off_t, off_t),
            (fd, mode, off, len));
}
int kp_fallocate64(int fd, int mode, off_t off, off_t len) __asm__("fallocate64");
int kp_fallocate64(int fd, int mode, off_t off, off_t len)
{
    KP_CALL(KP_FALLOCATE, "fallocate64", int, int (*)(int, int, off_t, off_t),
            (fd, mode, off, len));
}
int kp_rename(const char *from, const char *to) __asm__("rename");
int kp_rename(const char *from, const char *to)
{
    KP_CALL(KP_RENAME, "rename", int, int (*)(const char *, const char *), (from, to));
}
int kp_link(const char *from, const char *to) __asm__("link");
int kp_link(const char *from, const char *to)
{
    KP_CALL(KP_LINK, "link", int, int (*)(const char *, const char *), (from, to));
}
int kp_linkat(int from_dirfd, const char *from, int to_dirfd, const char *to, int flags)
    __asm__("linkat");
int kp_linkat(int from_dirfd, const char *from, int to_dirfd, const char *to, int flags)
{
    KP_CALL(KP_LINK, "linkat", int, int (*)(int, const char *, int, const char *, int),
            (from_dirfd, from, to_dirfd, to, flags));
}
int kp_unlink(const char *path) __asm__("unlink");
int kp_unlink(const char *path)
{
    KP_CALL(KP_UNLINK, "unlink", int, int (*)(const char *), (path));
}
int kp_unlinkat(int dirfd, const char *path, int flags) __asm__("unlinkat");
int kp_unlinkat(int dirfd, const char *path, int flags)
{
    KP_CALL(KP_UNLINK, "unlinkat", int, int (*)(int, const char *, int), (dirfd, path, flags));
}
int kp_open64(const char *path, int flags, ...) __asm__("open64");
int kp_open64(const char *path, int flags, ...)
{
    mode_t mode = 0;
    if (flags & (O_CREAT | __O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, unsigned);
        va_end(ap);
    }
    static void *real_;
    int (*f)(const char *, int, ...);
    void *p = kp_real(&real_, "open64");
    memcpy(&f, &p, sizeof(f));
    int tmp = strstr(path, ".tmp-") != NULL || (flags & __O_TMPFILE);
    if (tmp)
        kp_at(KP_OPEN_TMP, 0);
    int r = f(path, flags, mode);
    int e = errno;
    if (tmp)
        kp_at(KP_OPEN_TMP, 1);
    errno = e;
    return r;
}
int mdb_put(MDB_txn *txn, MDB_dbi dbi, MDB_val *key, MDB_val *data, unsigned flags)
{
    KP_CALL(KP_MDB_PUT, "mdb_put", int,
            int (*)(MDB_txn *, MDB_dbi, MDB_val *, MDB_val *, unsigned),
            (txn, dbi, key, data, flags));
}
int mdb_del(MDB_txn *txn, MDB_dbi dbi, MDB_val *key, MDB_val *data)
{
    KP_CALL(KP_MDB_DEL, "mdb_del", int, int (*)(MDB_txn *, MDB_dbi, MDB_val *, MDB_val *),
            (txn, dbi, key, data));
}
int mdb_txn_commit(MDB_txn *txn)
{
    KP_CALL(KP_MDB_COMMIT, "mdb_txn_commit", int, int (*)(MDB_txn *), (txn));
}
int mdb_env_copyfd2(MDB_env *env, mdb_filehandle_t fd, unsigned flags)
{
    KP_CALL(KP_MDB_COPY, "mdb_env_copyfd2", int, int (*)(MDB_env *, mdb_filehandle_t, unsigned),
            (env, fd, flags));
}

/* --- Running a child to its death -------------------------------------------- */

typedef struct kill_plan {
    long countdown;    /* > 0: the child dies at this kill point */
    int after;         /* ... right after the call returns */
    uint64_t delay_us; /* the parent kills it after this long (for a kill
                          point: if it has not died by then) */
    bool named;        /* new files written aside get a temporary name, as
                          where there is no O_TMPFILE */
} kill_plan;

typedef struct death {
    int at_point;     /* died at its kill point */
    int call, after;  /* which */
    int exit_code;    /* >= 0: it exited on its own (a failure) */
    int by_request;   /* the message handler asked for the kill */
} death;

/* Handles one message; returns 1 to have the child killed now. */
typedef int (*msg_fn)(void *ctx, const struct msg *m);

static _Noreturn void child_start(void (*body)(void *), void *arg, int fd, const kill_plan *kp)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    child_msg_fd = fd;
    ctxs__aside_force_named(kp->named);
    if (kp->countdown > 0)
        kp_arm(kp->countdown, kp->after);
    body(arg);
    _exit(0);
}

static void run_to_death(void (*body)(void *), void *arg, const kill_plan *kp, msg_fn fn,
                         void *ctx, death *out)
{
    int p[2];
    cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
    (void)fcntl(p[1], F_SETPIPE_SZ, 1 << 20);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_neq(pid, -1, "fork: %s", strerror(errno));
    if (pid == 0) {
        close(p[0]);
        child_start(body, arg, p[1], kp);
    }
    close(p[1]);
    memset(out, 0, sizeof(*out));
    out->exit_code = -1;
    uint64_t deadline = ts_now_us() + kp->delay_us;
    int killed = 0;
    char buf[8192];
    size_t have = 0;
    for (;;) {
        int timeout = -1;
        if (!killed) {
            uint64_t now = ts_now_us();
            if (now >= deadline) {
                kill(pid, SIGKILL);
                killed = 1;
            } else {
                timeout = (int)((deadline - now + 999) / 1000);
            }
        }
        struct pollfd pfd = {p[0], POLLIN, 0};
        int pr = poll(&pfd, 1, timeout);
        if (pr < 0 && errno == EINTR)
            continue;
        cr_assert_geq(pr, 0, "poll: %s", strerror(errno));
        if (pr == 0)
            continue;
        ssize_t r = read(p[0], buf + have, sizeof(buf) - have);
        if (r < 0 && errno == EINTR)
            continue;
        cr_assert_geq(r, 0, "read: %s", strerror(errno));
        if (r == 0)
            break;
        have += (size_t)r;
        size_t off = 0;
        while (have - off >= sizeof(struct msg)) {
            struct msg m;
            memcpy(&m, buf + off, sizeof(m));
            off += sizeof(m);
            if (m.type == M_KILLPOINT) {
                out->at_point = 1;
                out->call = (int)m.gen;
                out->after = (int)m.flag;
            } else if (fn(ctx, &m) && !killed) {
                kill(pid, SIGKILL);
                killed = 1;
                out->by_request = 1;
            }
        }
        memmove(buf, buf + off, have - off);
        have -= off;
    }
    cr_assert_eq(have, 0, "a torn message from the child");
    close(p[0]);
    int status = ts_wait(pid);
    if (WIFEXITED(status))
        out->exit_code = WEXITSTATUS(status);
    else
        cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
                  "the child died of signal %d", WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

/* --- States writers announced ------------------------------------------------ */

/* A set of (token count, id of the last token): every state a reader sees
 * must be in it. Generations are unique in a test, so the pair names one
 * committed state. */
typedef struct keyset {
    uint64_t *v;
    size_t cap, n;
} keyset;

static uint64_t state_key(uint64_t n, uint32_t last_id)
{
    return ts_mix64(n * 0x9e3779b97f4a7c15ull ^ ((uint64_t)last_id << 7)) | 1u;
}

static void ks_add_key(keyset *ks, uint64_t key)
{
    if (2 * (ks->n + 1) > ks->cap) {
        size_t nc = ks->cap ? ks->cap * 2 : 1u << 14;
        uint64_t *nv = calloc(nc, sizeof(*nv));
        cr_assert_not_null(nv);
        for (size_t i = 0; i < ks->cap; i++)
            if (ks->v[i]) {
                size_t j = ks->v[i] & (nc - 1);
                while (nv[j])
                    j = (j + 1) & (nc - 1);
                nv[j] = ks->v[i];
            }
        free(ks->v);
        ks->v = nv;
        ks->cap = nc;
    }
    size_t j = key & (ks->cap - 1);
    while (ks->v[j] && ks->v[j] != key)
        j = (j + 1) & (ks->cap - 1);
    if (!ks->v[j]) {
        ks->v[j] = key;
        ks->n++;
    }
}

static void ks_add(keyset *ks, uint64_t n, uint32_t last_id)
{
    if (n > 0)
        ks_add_key(ks, state_key(n, last_id));
}

static int ks_has(const keyset *ks, uint64_t n, uint32_t last_id)
{
    if (!ks->cap)
        return 0;
    uint64_t key = state_key(n, last_id);
    size_t j = key & (ks->cap - 1);
    while (ks->v[j]) {
        if (ks->v[j] == key)
            return 1;
        j = (j + 1) & (ks->cap - 1);
    }
    return 0;
}

/* --- Readers ------------------------------------------------------------------- */

#define MAX_READERS 4

typedef struct reader_slot {
    atomic_ullong checks;      /* stable checks that passed */
    atomic_ullong void_checks; /* discarded: the writer moved meanwhile */
    atomic_ullong opens;
    atomic_ullong refused;     /* opens refused as allowed (deleted, busy) */
    atomic_ullong violations;
    atomic_ullong obs_dropped; /* states seen but not sent (pipe full) */
    char first[768];
} reader_slot;

typedef struct reader_shm {
    atomic_int stop;
    reader_slot r[MAX_READERS];
} reader_shm;

typedef struct readers {
    reader_shm *shm;
    int n;
    pid_t pid[MAX_READERS];
    int obs_fd[MAX_READERS];
    uint64_t observed, unannounced;
    char first_unannounced[256];
} readers;

typedef struct reader_args {
    int idx;
    int obs_fd;
    uint64_t seed;
    const char *path;      /* a session file, or */
    const char *store_dir; /* a store */
    reader_slot *slot;
    atomic_int *stop;
} reader_args;

struct obs {
    uint64_t n;
    uint32_t last_id, pad;
};

__attribute__((format(printf, 2, 3))) static void reader_violation(reader_slot *sl,
                                                                  const char *fmt, ...)
{
    if (atomic_fetch_add(&sl->violations, 1) == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(sl->first, sizeof(sl->first), fmt, ap);
        va_end(ap);
    }
}

static void reader_observe(const reader_args *a, uint64_t n, uint32_t id, struct obs *last)
{
    if (n == 0 || (last->n == n && last->last_id == id))
        return;
    struct obs o = {n, id, 0};
    if (write(a->obs_fd, &o, sizeof(o)) != (ssize_t)sizeof(o))
        atomic_fetch_add(&a->slot->obs_dropped, 1);
    *last = o;
}

/* Stable checks on one open session; returns 0, or -1 after a violation. */
static int reader_checks(const reader_args *a, ctxs_session *s, uint64_t *rng, const char *name,
                         struct obs *last)
{
    unsigned rounds = 1 + (unsigned)(ts_rng_next(rng) % 8);
    for (unsigned j = 0; j < rounds && !atomic_load(a->stop); j++) {
        uint64_t n;
        uint32_t id;
        char why[512];
        int rc = ts_pat_stable_check(s, j % 3 == 0, &n, &id, why, sizeof(why));
        if (rc < 0) {
            reader_violation(a->slot, "reader %d, %s: %s", a->idx, name, why);
            return -1;
        }
        if (rc == 0) {
            atomic_fetch_add(&a->slot->void_checks, 1);
            continue;
        }
        atomic_fetch_add(&a->slot->checks, 1);
        reader_observe(a, n, id, last);
        ts_sleep_us(ts_rng_next(rng) % 1500);
    }
    return 0;
}

static void reader_file(const reader_args *a)
{
    ctxs_model m = ts_model(MODEL_SEED);
    uint64_t rng = a->seed;
    struct obs last = {0, 0, 0};
    while (!atomic_load(a->stop)) {
        unsigned verify = ts_rng_next(&rng) % 4 == 0 ? CTXS_OPEN_VERIFY : 0;
        ctxs_session *s;
        int rc = ctxs_session_open(&s, a->path, &m, CTXS_RDONLY | verify, NULL);
        atomic_fetch_add(&a->slot->opens, 1);
        if (rc != 0) {
            reader_violation(a->slot, "reader %d: read-only open: %s", a->idx, ctxs_err_name(rc));
            ts_sleep_us(10000);
            continue;
        }
        rc = reader_checks(a, s, &rng, "session", &last);
        ctxs_session_close(s);
        if (rc < 0)
            ts_sleep_us(10000);
    }
}

static void reader_store(const reader_args *a)
{
    uint64_t rng = a->seed;
    struct obs last = {0, 0, 0};
    while (!atomic_load(a->stop)) {
        ctxs_store *st;
        int rc = ctxs_store_open(&st, a->store_dir, CTXS_STORE_CREATE, NULL);
        atomic_fetch_add(&a->slot->opens, 1);
        if (rc != 0) {
            reader_violation(a->slot, "reader %d: store open: %s", a->idx, ctxs_err_name(rc));
            ts_sleep_us(20000);
            continue;
        }
        unsigned visits = 4 + (unsigned)(ts_rng_next(&rng) % 12);
        for (unsigned v = 0; v < visits && !atomic_load(a->stop); v++) {
            ctxs_session_entry *list;
            size_t n;
            if ((rc = ctxs_store_session_list(&list, &n, st)) != 0) {
                reader_violation(a->slot, "reader %d: list: %s", a->idx, ctxs_err_name(rc));
                break;
            }
            if (n == 0) {
                ctxs_free(list);
                ts_sleep_us(2000);
                continue;
            }
            char name[256];
            snprintf(name, sizeof(name), "%s", list[ts_rng_next(&rng) % n].name);
            ctxs_free(list);
            ctxs_session *s;
            rc = ctxs_store_session_open(&s, st, name, NULL, CTXS_RDONLY, NULL);
            if (rc == CTXS_ENOTFOUND || rc == CTXS_EBUSY) {
                atomic_fetch_add(&a->slot->refused, 1);
                continue;
            }
            if (rc != 0) {
                reader_violation(a->slot, "reader %d: open %s: %s", a->idx, name,
                                 ctxs_err_name(rc));
                continue;
            }
            rc = reader_checks(a, s, &rng, name, &last);
            if (rc == 0 && ts_rng_next(&rng) % 4 == 0) {
                /* Look its prompt up while writers work: found or not, never
                 * an error (whether a match is honest, the parent checks
                 * after each kill, with the writer dead). */
                ctxs_session_info info;
                ctxs_layout lay;
                if (ctxs_session_get_info(&info, s) == 0 && ctxs_session_get_layout(&lay, s) == 0 &&
                    info.n_tokens >= CTXS_PREFIX_CHUNK && info.ring_start <= info.n_sink) {
                    uint32_t *prompt = malloc(info.n_tokens * 4);
                    for (uint64_t p = 0; prompt && p < info.n_tokens; p++) {
                        uint32_t slot;
                        prompt[p] = ctxs_session_get_slot(&slot, s, p) == 0 ? lay.token_ids[slot] : 0;
                    }
                    ctxs_prefix_match pm;
                    int frc = prompt ? ctxs_prefix_find(&pm, st, info.model.model_hash, prompt,
                                                        info.n_tokens)
                                     : 0;
                    if (frc != 0 && frc != CTXS_ENOTFOUND)
                        reader_violation(a->slot, "reader %d: prefix_find: %s", a->idx,
                                         ctxs_err_name(frc));
                    free(prompt);
                }
            }
            ctxs_session_close(s);
        }
        ctxs_store_close(st);
        /* Now and then nobody else has the store open, so that a compaction
         * can rewrite the index. */
        uint64_t r = ts_rng_next(&rng);
        ts_sleep_us(r % 4 == 0 ? 50000 + r % 100000 : 5000 + r % 30000);
    }
}

static void readers_start(readers *rd, int n, const char *path, const char *store_dir,
                          uint64_t seed)
{
    memset(rd, 0, sizeof(*rd));
    rd->shm = mmap(NULL, sizeof(reader_shm), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                   -1, 0);
    cr_assert_neq(rd->shm, MAP_FAILED);
    memset(rd->shm, 0, sizeof(*rd->shm));
    rd->n = n;
    for (int i = 0; i < n; i++) {
        int p[2];
        cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
        (void)fcntl(p[1], F_SETPIPE_SZ, 1 << 20);
        cr_assert_eq(fcntl(p[1], F_SETFL, O_NONBLOCK), 0);
        cr_assert_eq(fcntl(p[0], F_SETFL, O_NONBLOCK), 0);
        fflush(NULL);
        pid_t pid = fork();
        cr_assert_neq(pid, -1);
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            close(p[0]);
            for (int j = 0; j < i; j++)
                close(rd->obs_fd[j]);
            reader_args a = {i, p[1], seed + (uint64_t)i * 0x9e37u, path, store_dir,
                             &rd->shm->r[i], &rd->shm->stop};
            if (path)
                reader_file(&a);
            else
                reader_store(&a);
            _exit(0);
        }
        close(p[1]);
        rd->pid[i] = pid;
        rd->obs_fd[i] = p[0];
    }
}

/* Reads what the readers saw so far and checks it against the states the
 * writers announced (all of which are in ks by now: a writer announces a
 * state before it makes it). */
static void readers_drain(readers *rd, const keyset *ks)
{
    for (int i = 0; i < rd->n; i++) {
        struct obs o[256];
        for (;;) {
            ssize_t r = read(rd->obs_fd[i], o, sizeof(o));
            if (r <= 0)
                break;
            for (size_t j = 0; j < (size_t)r / sizeof(o[0]); j++) {
                rd->observed++;
                if (!ks_has(ks, o[j].n, o[j].last_id) && rd->unannounced++ == 0)
                    snprintf(rd->first_unannounced, sizeof(rd->first_unannounced),
                             "reader %d saw %llu tokens ending in id %08x, a state no writer "
                             "announced",
                             i, (unsigned long long)o[j].n, o[j].last_id);
            }
        }
    }
}

static void readers_stop(readers *rd, const keyset *ks)
{
    atomic_store(&rd->shm->stop, 1);
    for (int i = 0; i < rd->n; i++) {
        int status;
        cr_assert_eq(waitpid(rd->pid[i], &status, 0), rd->pid[i]);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "reader %d died (status %#x)", i, status);
    }
    readers_drain(rd, ks);
    for (int i = 0; i < rd->n; i++)
        close(rd->obs_fd[i]);
}

typedef struct reader_totals {
    uint64_t checks, void_checks, opens, refused, violations, dropped;
} reader_totals;

static reader_totals readers_sum(const readers *rd)
{
    reader_totals t = {0};
    for (int i = 0; i < rd->n; i++) {
        const reader_slot *sl = &rd->shm->r[i];
        t.checks += atomic_load(&sl->checks);
        t.void_checks += atomic_load(&sl->void_checks);
        t.opens += atomic_load(&sl->opens);
        t.refused += atomic_load(&sl->refused);
        t.violations += atomic_load(&sl->violations);
        t.dropped += atomic_load(&sl->obs_dropped);
        if (atomic_load(&sl->violations))
            say("  reader %d: %llu violations, the first: %s", i,
                (unsigned long long)atomic_load(&sl->violations), sl->first);
    }
    return t;
}

static void readers_free(readers *rd)
{
    munmap(rd->shm, sizeof(reader_shm));
}

/* --- Counting ------------------------------------------------------------------- */

typedef struct soak_stats {
    uint64_t kills, at_points, by_parent, on_request, child_failures;
    uint64_t point_calls[KP_N][2];
    uint64_t images;      /* crash images opened and checked */
    uint64_t acked_ops, acked_tokens;
    uint64_t lost;        /* acknowledged tokens missing or wrong */
    uint64_t failures;    /* invariants broken (each logged) */
} soak_stats;

__attribute__((format(printf, 2, 3))) static void soak_fail(soak_stats *st, const char *fmt,
                                                           ...)
{
    if (st->failures++ < 12) {
        char buf[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof(buf), fmt, ap);
        va_end(ap);
        say("  FAILURE: %s", buf);
    }
}

static void count_death(soak_stats *st, const death *d)
{
    st->kills += d->exit_code < 0;
    st->child_failures += d->exit_code >= 0;
    if (d->at_point) {
        st->at_points++;
        st->point_calls[d->call][d->after]++;
    } else if (d->by_request) {
        st->on_request++;
    } else if (d->exit_code < 0) {
        st->by_parent++;
    }
}

static void print_points(const soak_stats *st)
{
    char line[1024];
    size_t len = 0;
    for (int c = 0; c < KP_N; c++)
        if (st->point_calls[c][0] + st->point_calls[c][1])
            len += (size_t)snprintf(line + len, sizeof(line) - len, " %s %llu/%llu", kp_names[c],
                                    (unsigned long long)st->point_calls[c][0],
                                    (unsigned long long)st->point_calls[c][1]);
    say("  kill points hit (before/after the call):%s", len ? line : " none");
}

/* Prints the kill points reached and what readers saw that no writer
 * announced, frees the readers, and fails the test on what must be zero. */
static void soak_finish(soak_stats *st, readers *rd, const reader_totals *rt)
{
    print_points(st);
    if (rd->unannounced)
        say("  %s", rd->first_unannounced);
    uint64_t unannounced = rd->unannounced;
    readers_free(rd);
    cr_assert_eq(st->lost, 0, "acknowledged tokens lost");
    cr_assert_eq(st->failures, 0, "invariants broken: see the log");
    cr_assert_eq(st->child_failures, 0);
    cr_assert_eq(rt->violations, 0, "readers saw bad data: see the log");
    cr_assert_eq(unannounced, 0, "readers saw states no writer committed");
    cr_assert_gt(rt->checks, 0, "the readers never checked anything");
    cr_assert_gt(st->at_points, 0, "no kill point was ever reached");
}

static kill_plan pick_plan(uint64_t *rng, uint64_t max_delay_us, long max_countdown,
                           uint64_t fallback_us)
{
    uint64_t r = ts_rng_next(rng);
    kill_plan kp = {.named = r >> 63};
    if (r % 2) {
        kp.countdown = 1 + (long)((r >> 8) % (uint64_t)max_countdown);
        kp.after = (int)((r >> 40) & 1);
        kp.delay_us = fallback_us / 2 + (r >> 20) % fallback_us;
    } else {
        kp.delay_us = (r >> 8) % max_delay_us;
    }
    return kp;
}

/* =================================================================================
 * 1. One session file: commit, rollback, sync, fork, reopen, dangling
 *    reservations, at NONE, ASYNC and FULL, in a ring that wraps.
 * ================================================================================= */

#define A_CAPACITY 512u
#define A_SINK 4u
#define A_MAX_TURN 40u

typedef struct a_args {
    const char *path;
    const char *dir;
    uint32_t level;
    uint64_t seed;
    uint32_t gen;        /* generation of the first writes */
    uint64_t fork_base;  /* fork files fork-<n>.ctxs from here */
    int dangle_after;    /* >= 0: after this many appends, reserve, write and wait */
} a_args;

static void a_fork_path(char *buf, size_t len, const char *dir, uint64_t n)
{
    snprintf(buf, len, "%s/fork-%llu.ctxs", dir, (unsigned long long)n);
}

static void a_child(void *p)
{
    const a_args *a = p;
    ctxs_model m = ts_model(MODEL_SEED);
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.open.durability = a->level;
    ctxs_session *s;
    int rc = ctxs_session_open(&s, a->path, &m, 0, &o.open);
    if (rc != 0)
        child_fail("open", rc, 0, 0);
    ctxs_session_info info;
    if ((rc = ctxs_session_get_info(&info, s)) != 0)
        child_fail("info", rc, 0, 0);
    uint64_t n = info.n_tokens, rng = a->seed, forks = a->fork_base;
    uint32_t gen = a->gen;
    int appends = 0;
    for (;;) {
        uint64_t r = ts_rng_next(&rng), pick = r % 100;
        if (a->dangle_after >= 0 && appends == a->dangle_after) {
            /* Reserved and written (the right bytes of a new generation,
             * or nothing), never committed. */
            uint32_t k = 1 + (uint32_t)((r >> 8) % A_MAX_TURN);
            ctxs_reservation res;
            if ((rc = ctxs_session_reserve(&res, s, k)) != 0)
                child_fail("dangling reserve", rc, n, k);
            uint16_t kk[TS_KV_MAX], vv[TS_KV_MAX];
            for (uint32_t i = 0; i < k && (r >> 20) % 2; i++) {
                ts_pat_kv(&m.geometry, res.first_pos + i, ts_pat_id(res.first_pos + i, gen + 1),
                          kk, vv);
                if ((rc = ctxs_session_write_token(s, &res, i, kk, vv, CTXS_DTYPE_F16)) != 0)
                    child_fail("dangling write", rc, n, i);
            }
            child_say(M_WRITTEN, 0, gen, n, n + k, NULL, NULL);
            for (;;)
                pause();
        }
        if (pick < 9 && n > 1) {
            uint64_t back = 1 + (r >> 8) % 30, target = n > back ? n - back : 0;
            child_say(M_ROLLBACK, 0, gen, target, n, NULL, NULL);
            rc = ctxs_session_rollback(s, target);
            if (rc == 0) {
                n = target;
                gen++; /* what is written at target.. from now on differs */
            } else if (!(rc == CTXS_EEVICTED && info.ring_start > A_SINK)) {
                child_fail("rollback", rc, target, n);
            }
            child_say(M_ACK, rc, gen, n, n, NULL, NULL);
        } else if (pick < 13) {
            child_say(M_SYNC, 0, gen, n, n, NULL, NULL);
            if ((rc = ctxs_session_sync(s)) != 0)
                child_fail("sync", rc, n, 0);
            child_say(M_ACK, 0, gen, n, n, NULL, NULL);
        } else if (pick < 17 && n > 0) {
            uint64_t at = (r >> 8) % 2 ? n : n - (r >> 16) % (n < 50 ? n : 50);
            char fp[4096];
            a_fork_path(fp, sizeof(fp), a->dir, forks);
            child_say(M_FORK, 0, gen, at, forks, NULL, NULL);
            ctxs_session *f;
            rc = ctxs_session_fork(&f, s, fp, at, &o.open);
            if (rc == 0)
                ctxs_session_close(f);
            else if (rc != CTXS_EEVICTED)
                child_fail("fork", rc, at, n);
            forks++;
            child_say(M_ACK, rc, gen, n, n, NULL, NULL);
        } else if (pick < 20) {
            child_say(M_REOPEN, 0, gen, n, n, NULL, NULL);
            ctxs_session_close(s);
            if ((rc = ctxs_session_open(&s, a->path, &m, 0, &o.open)) != 0)
                child_fail("reopen", rc, n, 0);
            if ((rc = ctxs_session_get_info(&info, s)) != 0 || info.n_tokens != n)
                child_fail("reopen count", rc, info.n_tokens, n);
            child_say(M_ACK, 0, gen, n, n, NULL, NULL);
        } else {
            uint32_t k = 1 + (uint32_t)((r >> 8) % A_MAX_TURN);
            uint64_t first = 0;
            child_say(M_APPEND, 0, gen, n, n + k, NULL, NULL);
            if ((rc = ts_pat_append(s, k, gen, &first)) != 0)
                child_fail("append", rc, n, k);
            if ((rc = ctxs_session_get_info(&info, s)) != 0 || first != n ||
                info.n_tokens != n + k)
                child_fail("append count", rc, info.n_tokens, n + k);
            n += k;
            appends++;
            child_say(M_ACK, 0, gen, n, n, NULL, NULL);
        }
    }
}

typedef struct a_fork {
    uint64_t serial, at;
    int acked;
    uint32_t sinks[A_SINK];
    uint64_t base; /* g[i] is the generation of position base + i */
    uint32_t g[A_CAPACITY];
} a_fork;

typedef struct a_ctx {
    ts_gens gs;
    uint32_t gen_hi;
    uint64_t lo, hi;   /* the state is one of these */
    uint64_t acks, acked_tokens;
    uint32_t last;         /* the last message's type */
    keyset valid;
    a_fork *forks;
    size_t n_forks, cap_forks;
} a_ctx;

static int a_on_msg(void *p, const struct msg *m)
{
    a_ctx *c = p;
    uint32_t prev = c->last;
    c->last = m->type;
    if (m->gen > c->gen_hi)
        c->gen_hi = m->gen;
    switch (m->type) {
    case M_APPEND:
        cr_assert_eq(m->a, c->hi, "append from %llu, acknowledged %llu", (unsigned long long)m->a,
                     (unsigned long long)c->hi);
        ts_gens_set(&c->gs, m->a, m->b, m->gen);
        ks_add(&c->valid, m->b, ts_pat_id(m->b - 1, m->gen));
        c->lo = m->a;
        c->hi = m->b;
        return 0;
    case M_ROLLBACK:
        if (m->a > 0)
            ks_add(&c->valid, m->a, ts_pat_id(m->a - 1, ts_gens_get(&c->gs, m->a - 1)));
        c->lo = m->a;
        c->hi = m->b;
        return 0;
    case M_SYNC:
    case M_REOPEN:
        return 0;
    case M_FORK: {
        if (c->n_forks == c->cap_forks) {
            c->cap_forks = c->cap_forks ? c->cap_forks * 2 : 8;
            c->forks = realloc(c->forks, c->cap_forks * sizeof(*c->forks));
            cr_assert_not_null(c->forks);
        }
        a_fork *f = &c->forks[c->n_forks++];
        f->serial = m->b;
        f->at = m->a;
        f->acked = 0;
        for (uint32_t i = 0; i < A_SINK; i++)
            f->sinks[i] = ts_gens_get(&c->gs, i);
        f->base = m->a > A_CAPACITY ? m->a - A_CAPACITY : 0;
        for (uint64_t q = f->base; q < m->a; q++)
            f->g[q - f->base] = ts_gens_get(&c->gs, q);
        return 0;
    }
    case M_WRITTEN:
        /* Its bytes were of the next generation: nobody else uses it. */
        if (m->gen + 1 > c->gen_hi)
            c->gen_hi = m->gen + 1;
        c->lo = c->hi = m->a;
        return 1; /* killed between reserve and commit */
    case M_ACK:
        if (prev == M_FORK && m->rc == 0)
            c->forks[c->n_forks - 1].acked = 1;
        if (prev == M_APPEND)
            c->acked_tokens += m->a - c->lo;
        c->lo = c->hi = m->a;
        c->acks++;
        return 0;
    default:
        cr_assert_fail("unknown message %u", m->type);
        return 0;
    }
}

/* Checks the held positions of s against the generations (or, for a fork,
 * its snapshot); returns the number of wrong ones. */
static uint64_t a_check_exact(const ctxs_session *s, const ts_gens *gs, const a_fork *f)
{
    ctxs_session_info info;
    ctxs_layout lay;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(ctxs_session_get_layout(&lay, s), 0);
    uint16_t k[TS_KV_MAX], v[TS_KV_MAX], ek[TS_KV_MAX], ev[TS_KV_MAX];
    const ctxs_geometry *g = &info.model.geometry;
    size_t per = (size_t)g->n_layers * g->n_kv_heads * g->head_dim;
    cr_assert_leq(per, TS_KV_MAX);
    uint64_t bad = 0, first_recent = info.ring_start > A_SINK ? info.ring_start : A_SINK;
    for (uint64_t p = 0; p < info.n_tokens; p++) {
        if (p >= A_SINK && p < first_recent) {
            p = first_recent - 1;
            continue;
        }
        uint32_t gen, slot;
        if (!f)
            gen = ts_gens_get(gs, p);
        else if (p < A_SINK)
            gen = f->sinks[p];
        else if (p >= f->base && p - f->base < A_CAPACITY)
            gen = f->g[p - f->base];
        else {
            bad++;
            continue;
        }
        uint32_t id = ts_pat_id(p, gen);
        ts_pat_kv(&info.model.geometry, p, id, ek, ev);
        if (ctxs_session_get_slot(&slot, s, p) != 0 || ctxs_session_read_token(k, v, s, p, CTXS_DTYPE_F16) != 0 ||
            lay.token_ids[slot] != id || memcmp(k, ek, per * 2) || memcmp(v, ev, per * 2))
            bad++;
    }
    return bad;
}

/* Opens a crash image read-only (VERIFY) and read-write (recovery), checks
 * it, and returns the token count found. */
static uint64_t a_check_image(const char *path, const a_ctx *c, uint32_t recovery, soak_stats *st,
                              const char *what)
{
    ctxs_model m = ts_model(MODEL_SEED);
    ctxs_session *s;
    ctxs_session_info a, b;
    uint64_t bad_pos = 0;
    int rc = ctxs_session_open(&s, path, &m, CTXS_RDONLY | CTXS_OPEN_VERIFY, NULL);
    cr_assert_eq(rc, 0, "%s: read-only open: %s", what, ctxs_err_name(rc));
    cr_assert_eq(ctxs_session_get_info(&a, s), 0);
    st->images++;
    if (a.n_tokens != c->lo && a.n_tokens != c->hi)
        soak_fail(st, "%s: %llu tokens; the writer left %llu or %llu", what,
                  (unsigned long long)a.n_tokens, (unsigned long long)c->lo,
                  (unsigned long long)c->hi);
    if (a.n_tokens < c->lo)
        st->lost += c->lo - a.n_tokens;
    if (a.lost_tokens)
        soak_fail(st, "%s: recovery after a process crash dropped %llu tokens", what,
                  (unsigned long long)a.lost_tokens);
    uint64_t bad = a_check_exact(s, &c->gs, NULL);
    if (bad) {
        st->lost += bad;
        soak_fail(st, "%s: %llu positions read back wrong (read-only)", what,
                  (unsigned long long)bad);
    }
    if ((rc = ctxs_session_verify(&bad_pos, s)) != 0)
        soak_fail(st, "%s: verify: %s at %llu", what, ctxs_err_name(rc),
                  (unsigned long long)bad_pos);
    ctxs_session_close(s);

    rc = ctxs_session_open(&s, path, &m, recovery, NULL);
    cr_assert_eq(rc, 0, "%s: read-write open: %s", what, ctxs_err_name(rc));
    cr_assert_eq(ctxs_session_get_info(&b, s), 0);
    if (b.n_tokens != a.n_tokens || b.ring_start != a.ring_start || b.n_reserved || b.lost_tokens)
        soak_fail(st, "%s: read-write open sees %llu tokens (ring_start %llu, %u reserved, "
                  "%llu lost), read-only %llu (%llu)", what, (unsigned long long)b.n_tokens,
                  (unsigned long long)b.ring_start, b.n_reserved,
                  (unsigned long long)b.lost_tokens, (unsigned long long)a.n_tokens,
                  (unsigned long long)a.ring_start);
    if ((bad = a_check_exact(s, &c->gs, NULL)) != 0)
        soak_fail(st, "%s: %llu positions read back wrong (read-write)", what,
                  (unsigned long long)bad);
    if ((rc = ctxs_session_verify(&bad_pos, s)) != 0)
        soak_fail(st, "%s: verify (read-write): %s at %llu", what, ctxs_err_name(rc),
                  (unsigned long long)bad_pos);
    ctxs_session_close(s);
    return a.n_tokens;
}

/* The fork files the dead writer made, each whole or absent; then they go,
 * with whatever a killed fork wrote aside. Returns the number checked. */
static uint64_t a_check_forks(const char *dir, a_ctx *c, soak_stats *st, const char *what)
{
    ctxs_model m = ts_model(MODEL_SEED);
    uint64_t checked = 0;
    for (size_t i = 0; i < c->n_forks; i++) {
        const a_fork *f = &c->forks[i];
        char fp[4096];
        a_fork_path(fp, sizeof(fp), dir, f->serial);
        ctxs_session *s;
        int rc = ctxs_session_open(&s, fp, &m, CTXS_RDONLY | CTXS_OPEN_VERIFY, NULL);
        if (rc == -ENOENT) {
            if (f->acked)
                soak_fail(st, "%s: acknowledged fork %llu is missing", what,
                          (unsigned long long)f->serial);
            continue;
        }
        if (rc != 0) {
            soak_fail(st, "%s: fork %llu does not open: %s", what, (unsigned long long)f->serial,
                      ctxs_err_name(rc));
            unlink(fp);
            continue;
        }
        ctxs_session_info info;
        cr_assert_eq(ctxs_session_get_info(&info, s), 0);
        st->images++;
        checked++;
        uint64_t bad = a_check_exact(s, NULL, f), bad_pos = 0;
        if (info.n_tokens != f->at || info.lost_tokens || bad)
            soak_fail(st, "%s: fork %llu holds %llu tokens (%llu lost, %llu wrong), forked at "
                      "%llu", what, (unsigned long long)f->serial,
                      (unsigned long long)info.n_tokens, (unsigned long long)info.lost_tokens,
                      (unsigned long long)bad, (unsigned long long)f->at);
        if ((rc = ctxs_session_verify(&bad_pos, s)) != 0)
            soak_fail(st, "%s: fork %llu: verify: %s", what, (unsigned long long)f->serial,
                      ctxs_err_name(rc));
        ctxs_session_close(s);
        unlink(fp);
    }
    c->n_forks = 0;
    return checked;
}

/* Files in dir other than the session: what killed forks left written
 * aside (they are never linked in place), which only a file with a
 * temporary name (named) can be. Removed; returns how many. */
static uint64_t a_sweep(const char *dir, soak_stats *st, const char *what, bool named)
{
    uint64_t n = 0;
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    for (struct dirent *de; (de = readdir(d));) {
        if (de->d_name[0] == '.' || strcmp(de->d_name, "soak.ctxs") == 0)
            continue;
        if (!strstr(de->d_name, ".tmp-"))
            soak_fail(st, "%s: a stray file %s", what, de->d_name);
        else if (!named)
            soak_fail(st, "%s: %s was left by a fork that wrote its file unnamed", what,
                      de->d_name);
        unlink(ts_path(dir, de->d_name));
        n++;
    }
    closedir(d);
    return n;
}

Test(soak, session_writers_killed_during_commit_rollback_sync_and_fork, .timeout = 3600)
{
    const char *test = "soak session";
    uint64_t rng = ts_seed(test);
    unsigned kills = scaled(4000);
    const char *dir = ts_scratch; /* removed by the suite's fini, pass or fail */
    char path[4096];
    snprintf(path, sizeof(path), "%s/soak.ctxs", dir);
    {
        ctxs_model m = ts_model(MODEL_SEED);
        ctxs_create_options o = ts_options(A_CAPACITY, A_SINK, 1, CTXS_SYNC_NONE);
        ctxs_session *s;
        cr_assert_eq(ctxs_session_create(&s, path, &m, &o), 0);
        ctxs_session_close(s);
    }
    uint64_t t0 = ts_now_us();
    readers rd;
    readers_start(&rd, 2, path, NULL, ts_rng_next(&rng));

    a_ctx c;
    memset(&c, 0, sizeof(c));
    soak_stats st;
    memset(&st, 0, sizeof(st));
    uint64_t n = 0, leftovers = 0, fork_images = 0, wrapped_at = 0;
    for (unsigned i = 0; i < kills; i++) {
        uint64_t r = ts_rng_next(&rng);
        uint32_t level = r % 20 < 7 ? CTXS_SYNC_NONE : r % 20 < 15 ? CTXS_SYNC_ASYNC : CTXS_SYNC_FULL;
        kill_plan kp = pick_plan(&rng, level == CTXS_SYNC_FULL ? 40000 : 6000,
                                 level == CTXS_SYNC_FULL ? 80 : 30, 30000);
        a_args a = {path, dir, level, ts_rng_next(&rng), c.gen_hi + 1, (uint64_t)i << 16,
                    (r >> 32) % 25 == 0 ? (int)((r >> 40) % 6) : -1};
        c.lo = c.hi = n;
        c.last = 0;
        death d;
        run_to_death(a_child, &a, &kp, a_on_msg, &c, &d);
        count_death(&st, &d);
        if (d.exit_code >= 0)
            soak_fail(&st, "kill %u: the writer exited with %d before it was killed (its "
                      "stderr says why)", i, d.exit_code);
        char what[160];
        snprintf(what, sizeof(what), "kill %u (level %u, %s %s)", i, level,
                 d.at_point ? "at" : "after", d.at_point ? kp_names[d.call] : "a delay");
        n = a_check_image(path, &c, i % 2 ? CTXS_OPEN_VERIFY : 0, &st, what);
        c.lo = c.hi = n;
        fork_images += a_check_forks(dir, &c, &st, what);
        leftovers += a_sweep(dir, &st, what, kp.named);
        readers_drain(&rd, &c.valid);
        if (!wrapped_at && n > A_CAPACITY)
            wrapped_at = i;
    }
    readers_stop(&rd, &c.valid);
    st.acked_ops = c.acks;
    st.acked_tokens = c.acked_tokens;
    reader_totals rt = readers_sum(&rd);
    say("%s: %llu kills (%llu at kill points, %llu after a random delay, %llu between reserve "
        "and commit), %llu writers failed on their own; %llu crash images checked (%llu of them "
        "forks; %llu files a killed fork left aside removed); %llu operations and %llu tokens "
        "acknowledged, %llu lost; %llu positions at the end (ring wrapped from kill %llu); "
        "readers: %llu opens, %llu checks passed, %llu void (the writer moved), %llu states "
        "seen, %llu never announced, %llu violations; %llu failures; %.1f s",
        test, (unsigned long long)st.kills, (unsigned long long)st.at_points,
        (unsigned long long)st.by_parent, (unsigned long long)st.on_request,
        (unsigned long long)st.child_failures, (unsigned long long)st.images,
        (unsigned long long)fork_images, (unsigned long long)leftovers,
        (unsigned long long)st.acked_ops, (unsigned long long)st.acked_tokens,
        (unsigned long long)st.lost, (unsigned long long)n, (unsigned long long)wrapped_at,
        (unsigned long long)rt.opens, (unsigned long long)rt.checks,
        (unsigned long long)rt.void_checks, (unsigned long long)rd.observed,
        (unsigned long long)rd.unannounced, (unsigned long long)rt.violations,
        (unsigned long long)st.failures, (ts_now_us() - t0) / 1e6);
    soak_finish(&st, &rd, &rt);
    cr_assert(wrapped_at > 0, "the ring never wrapped");
    free(c.gs.v);
    free(c.valid.v);
    free(c.forks);
}

/* =================================================================================
 * 2. A store: sessions created, appended to, rolled back, checkpointed,
 *    restored, forked, renamed, deleted, collected, compacted, exported and
 *    imported; every LMDB transaction and every file step a kill point.
 * ================================================================================= */

#define B_MAX_SESS 10
#define B_NAMES 64
#define B_CAPACITY 4096u
#define B_MAX_N 1800u
#define B_MAX_CPS 6

typedef struct b_args {
    const char *store_dir;
    const char *exports;
    uint64_t seed;
    uint32_t gen;    /* generations from here */
    uint64_t serial; /* names from here */
} b_args;

typedef struct b_child {
    const b_args *a;
    ctxs_store *st;
    ctxs_model m;
    uint64_t rng, serial;
    uint32_t gen;
    int n;
    char name[B_NAMES][24];
    ctxs_session *h[B_NAMES];
} b_child;

static void b_new_name(b_child *c, char prefix, char out[24])
{
    snprintf(out, 24, "%c%llx", prefix, (unsigned long long)c->serial++);
}

static ctxs_create_options b_opts(b_child *c)
{
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = B_CAPACITY;
    o.n_sink = 4;
    o.ring = 1;
    uint64_t r = ts_rng_next(&c->rng) % 10;
    o.open.durability = r < 4 ? CTXS_SYNC_NONE : r < 9 ? CTXS_SYNC_ASYNC : CTXS_SYNC_FULL;
    return o;
}

static void b_ack(int rc, uint64_t a, uint64_t b)
{
    child_say(M_ACK, rc, 0, a, b, NULL, NULL);
}

static ctxs_session *b_open(b_child *c, int i)
{
    if (c->h[i])
        return c->h[i];
    ctxs_create_options o = b_opts(c);
    child_say(B_OPEN, 0, 0, 0, 0, c->name[i], NULL);
    int rc = ctxs_store_session_open(&c->h[i], c->st, c->name[i], &c->m, 0, &o.open);
    if (rc != 0)
        child_fail(c->name[i], rc, 0, 0);
    b_ack(0, 0, 0);
    return c->h[i];
}

static void b_close(b_child *c, int i)
{
    if (!c->h[i])
        return;
    child_say(B_CLOSE, 0, 0, 0, 0, c->name[i], NULL);
    ctxs_session_close(c->h[i]);
    c->h[i] = NULL;
    b_ack(0, 0, 0);
}

static void b_drop(b_child *c, int i)
{
    c->n--;
    memcpy(c->name[i], c->name[c->n], 24);
    c->h[i] = c->h[c->n];
    c->h[c->n] = NULL;
}

static int b_add(b_child *c, const char *name, ctxs_session *h)
{
    if (c->n == B_NAMES)
        child_fail("too many sessions", 0, (uint64_t)c->n, 0);
    snprintf(c->name[c->n], 24, "%.23s", name);
    c->h[c->n] = h;
    return c->n++;
}

static uint64_t b_count(ctxs_session *s)
{
    ctxs_session_info info;
    int rc = ctxs_session_get_info(&info, s);
    if (rc != 0)
        child_fail("info", rc, 0, 0);
    return info.n_tokens;
}

/* One of the session's checkpoints (stale ones too, unless fresh_only);
 * returns 0 when it has none. */
static int b_pick_cp(b_child *c, int i, int fresh_only, ctxs_checkpoint_entry *out, size_t *count)
{
    ctxs_checkpoint_entry *l;
    size_t k;
    int rc = ts_checkpoint_list(&l, &k, c->st, c->name[i]);
    if (rc != 0)
        child_fail("checkpoint_list", rc, 0, 0);
    if (count)
        *count = k;
    size_t fresh = 0;
    for (size_t j = 0; j < k; j++)
        fresh += !l[j].stale;
    size_t want = fresh_only ? fresh : k;
    int found = 0;
    if (want) {
        size_t pick = ts_rng_next(&c->rng) % want;
        for (size_t j = 0; j < k && !found; j++) {
            if (fresh_only && l[j].stale)
                continue;
            if (pick-- == 0) {
                *out = l[j];
                found = 1;
            }
        }
    }
    ctxs_free(l);
    return found;
}

static void b_child_main(void *p)
{
    const b_args *a = p;
    b_child *c = calloc(1, sizeof(*c));
    if (!c)
        child_fail("calloc", CTXS_ENOMEM, 0, 0);
    c->a = a;
    c->m = ts_model(MODEL_SEED);
    c->rng = a->seed;
    c->gen = a->gen;
    c->serial = a->serial;
    int rc = ctxs_store_open(&c->st, a->store_dir, CTXS_STORE_CREATE, NULL);
    if (rc != 0)
        child_fail("store open", rc, 0, 0);
    ctxs_session_entry *list;
    size_t n;
    if ((rc = ctxs_store_session_list(&list, &n, c->st)) != 0)
        child_fail("list", rc, 0, 0);
    for (size_t i = 0; i < n; i++)
        b_add(c, list[i].name, NULL);
    ctxs_free(list);
    char nm[24], nm2[24], path[4096];
    for (;;) {
        uint64_t r = ts_rng_next(&c->rng), op = r % 90;
        int i = c->n ? (int)((r >> 8) % (uint64_t)c->n) : -1;
        int room = c->n < B_MAX_SESS;
        if (i < 0 || (op < 8 && room)) {
            if (!room)
                continue;
            b_new_name(c, 's', nm);
            ctxs_create_options o = b_opts(c);
            child_say(B_CREATE, 0, 0, 0, 0, nm, NULL);
            ctxs_session *s;
            rc = ctxs_store_session_create(&s, c->st, nm, &c->m, &o);
            if (rc != 0)
                child_fail("create", rc, 0, 0);
            b_add(c, nm, s);
            b_ack(0, 0, 0);
        } else if (op < 38) {
            ctxs_session *s = b_open(c, i);
            uint64_t have = b_count(s);
            uint32_t k = 1 + (uint32_t)((r >> 16) % 150);
            if (have + k > B_MAX_N) {
                uint64_t t = (r >> 24) % (have + 1);
                child_say(B_ROLLBACK, 0, 0, t, have, c->name[i], NULL);
                if ((rc = ctxs_session_rollback(s, t)) != 0)
                    child_fail("rollback", rc, t, have);
                b_ack(0, t, 0);
                continue;
            }
            uint32_t gen = ++c->gen;
            uint64_t first = 0;
            child_say(B_APPEND, 0, gen, have, have + k, c->name[i], NULL);
            if ((rc = ts_pat_append(s, k, gen, &first)) != 0 || first != have)
                child_fail("append", rc, first, have);
            b_ack(0, have + k, 0);
        } else if (op < 43) {
            ctxs_session *s = b_open(c, i);
            uint64_t have = b_count(s);
            if (have == 0)
                continue;
            uint64_t t = (r >> 16) % have;
            child_say(B_ROLLBACK, 0, 0, t, have, c->name[i], NULL);
            if ((rc = ctxs_session_rollback(s, t)) != 0)
                child_fail("rollback", rc, t, have);
            b_ack(0, t, 0);
        } else if (op < 48) {
            ctxs_session *s = b_open(c, i);
            uint64_t have = b_count(s);
            ctxs_checkpoint_entry e;
            size_t cps;
            b_pick_cp(c, i, 0, &e, &cps);
            if (have == 0 || cps >= B_MAX_CPS)
                continue;
            b_new_name(c, 'c', nm);
            child_say(B_CP_CREATE, 0, 0, have, 0, c->name[i], nm);
            if ((rc = ctxs_checkpoint_create(s, nm)) != 0)
                child_fail("checkpoint_create", rc, have, 0);
            b_ack(0, 0, 0);
        } else if (op < 52) {
            ctxs_session *s = b_open(c, i);
            ctxs_checkpoint_entry e;
            if (!b_pick_cp(c, i, 0, &e, NULL))
                continue;
            uint64_t have = b_count(s);
            struct msg m;
            memset(&m, 0, sizeof(m));
            m.type = B_CP_RESTORE;
            m.flag = e.stale;
            m.a = e.n_tokens;
            m.b = have;
            snprintf(m.s1, sizeof(m.s1), "%s", c->name[i]);
            snprintf(m.s2, sizeof(m.s2), "%.23s", e.name);
            child_send(&m);
            rc = ctxs_checkpoint_restore(s, e.name);
            if (rc != 0 && rc != CTXS_ESTALE)
                child_fail("checkpoint_restore", rc, e.n_tokens, have);
            b_ack(rc, b_count(s), 0);
        } else if (op < 54) {
            ctxs_checkpoint_entry e;
            if (!b_pick_cp(c, i, 0, &e, NULL))
                continue;
            child_say(B_CP_DELETE, 0, 0, 0, 0, c->name[i], e.name);
            if ((rc = ts_checkpoint_delete(c->st, c->name[i], e.name)) != 0)
                child_fail("checkpoint_delete", rc, 0, 0);
            b_ack(0, 0, 0);
        } else if (op < 61) {
            if (!room)
                continue;
            ctxs_session *s = b_open(c, i);
            uint64_t have = b_count(s), at = have;
            ctxs_checkpoint_entry e;
            int via_cp = (r >> 16) % 4 == 0 && b_pick_cp(c, i, 1, &e, NULL);
            if (via_cp)
                at = e.n_tokens;
            else if ((r >> 20) % 2 && have > 0)
                at = 1 + (r >> 24) % have;
            int keep = (int)((r >> 40) % 2);
            b_new_name(c, 's', nm);
            struct msg m;
            memset(&m, 0, sizeof(m));
            m.type = B_FORK;
            m.flag = (uint32_t)via_cp | (uint32_t)keep << 1;
            m.a = at;
            snprintf(m.s1, sizeof(m.s1), "%s", c->name[i]);
            snprintf(m.s2, sizeof(m.s2), "%s", nm);
            child_send(&m);
            ctxs_create_options o = b_opts(c);
            ctxs_session *f = NULL;
            if (via_cp)
                rc = ctxs_store_session_fork_checkpoint(keep ? &f : NULL, c->st, c->name[i], e.name, nm, &o.open);
            else
                rc = ctxs_store_session_fork(keep ? &f : NULL, c->st, c->name[i],
                                             nm, (r >> 20) % 2 ? at : UINT64_MAX, &o.open);
            if (rc != 0)
                child_fail("fork", rc, at, have);
            b_add(c, nm, f);
            b_ack(0, 0, 0);
        } else if (op < 66) {
            if (c->n <= 3)
                continue;
            b_close(c, i);
            child_say(B_DELETE, 0, 0, 0, 0, c->name[i], NULL);
            rc = ctxs_store_session_delete(c->st, c->name[i]);
            if (rc != 0 && rc != CTXS_EBUSY)
                child_fail("delete", rc, 0, 0);
            if (rc == 0)
                b_drop(c, i);
            b_ack(rc, 0, 0);
        } else if (op < 69) {
            b_new_name(c, 's', nm);
            child_say(B_RENAME, 0, 0, 0, 0, c->name[i], nm);
            if ((rc = ctxs_store_session_rename(c->st, c->name[i], nm)) != 0)
                child_fail("rename", rc, 0, 0);
            snprintf(c->name[i], 24, "%s", nm);
            b_ack(0, 0, 0);
        } else if (op < 74) {
            b_close(c, i);
        } else if (op < 76) {
            uint64_t budget = (r >> 16) % (3u << 20);
            child_say(B_GC, 0, 0, budget, 0, NULL, NULL);
            ctxs_store_gc_result g;
            if ((rc = ctxs_store_gc(&g, c->st, budget, 0)) != 0)
                child_fail("gc", rc, budget, 0);
            ctxs_free(g.sessions);
            uint64_t gone = 0;
            for (int j = 0; j < c->n; j++) {
                ctxs_session_entry e;
                rc = ctxs_store_session_get(&e, c->st, c->name[j]);
                if (rc == 0)
                    continue;
                if (rc != CTXS_ENOTFOUND || c->h[j])
                    child_fail("gc took an open session, or get failed", rc, 0, 0);
                child_say(B_GONE, 0, 0, 0, 0, c->name[j], NULL);
                b_drop(c, j--);
                gone++;
            }
            if (gone != g.deleted)
                child_fail("gc deleted a count it did not say", 0, gone, g.deleted);
            b_ack(0, g.deleted, 0);
        } else if (op < 78) {
            if ((r >> 16) % 2)
                b_close(c, i);
            child_say(B_COMPACT, 0, 0, 0, 0, c->name[i], NULL);
            rc = ctxs_store_compact(NULL, c->st, c->name[i], NULL);
            if (rc != 0 && rc != CTXS_EBUSY)
                child_fail("compact", rc, 0, 0);
            b_ack(rc, 0, 0);
        } else if (op < 80) {
            if ((r >> 16) % 2)
                for (int j = 0; j < c->n; j++)
                    b_close(c, j);
            child_say(B_COMPACT, 0, 0, 0, 0, NULL, NULL);
            ctxs_store_compact_result cr;
            if ((rc = ctxs_store_compact(&cr, c->st, NULL, NULL)) != 0)
                child_fail("compact all", rc, 0, 0);
            b_ack(0, cr.index_compacted, cr.orphans_removed);
        } else if (op < 83) {
            ctxs_session *s = b_open(c, i);
            uint64_t have = b_count(s);
            b_new_name(c, 'x', nm);
            snprintf(path, sizeof(path), "%s/%s.ctxx", a->exports, nm);
            child_say(B_EXPORT, 0, 0, have, 0, c->name[i], nm);
            if ((rc = ctxs_store_session_export(c->st, c->name[i], path, NULL)) != 0)
                child_fail("export", rc, have, 0);
            b_ack(0, 0, 0);
        } else if (op < 86) {
            if (!room)
                continue;
            DIR *d = opendir(a->exports);
            if (!d)
                child_fail("opendir", -errno, 0, 0);
            int k = 0, pick = (int)((r >> 16) % 16);
            nm2[0] = '\0';
            for (struct dirent *de; (de = readdir(d));) {
                size_t len = strlen(de->d_name);
                if (de->d_name[0] != 'x' || len < 6 || len >= 24 ||
                    strcmp(de->d_name + len - 5, ".ctxx") != 0)
                    continue;
                if (k++ <= pick)
                    snprintf(nm2, sizeof(nm2), "%.*s", (int)(len - 5), de->d_name);
            }
            closedir(d);
            if (!nm2[0])
                continue;
            b_new_name(c, 's', nm);
            snprintf(path, sizeof(path), "%s/%s.ctxx", a->exports, nm2);
            child_say(B_IMPORT, 0, 0, 0, 0, nm, nm2);
            rc = ctxs_store_session_import(NULL, c->st, path, nm, NULL);
            if (rc != 0)
                child_fail("import", rc, 0, 0);
            b_add(c, nm, NULL);
            b_ack(0, 0, 0);
        } else if (op < 87) {
            child_say(B_REPAIR, 0, 0, 0, 0, NULL, NULL);
            ctxs_store_repair_result rr;
            if ((rc = ctxs_store_repair(&rr, c->st)) != 0)
                child_fail("repair", rc, 0, 0);
            b_ack(0, rr.files_adopted + rr.files_removed + rr.entries_removed,
                  rr.prefixes_updated);
        } else {
            if (!c->h[i])
                continue;
            uint64_t bad = 0;
            child_say(B_VERIFY, 0, 0, 0, 0, c->name[i], NULL);
            if ((rc = ctxs_session_verify(&bad, c->h[i])) != 0)
                child_fail("verify", rc, bad, 0);
            b_ack(0, 0, 0);
        }
    }
}

/* --- The parent's model of the store ------------------------------------------- */

typedef struct b_cp {
    char name[24];
    uint64_t n;
    uint32_t last_gen;
} b_cp;

typedef struct b_sess {
    char name[24];
    ts_gens g;
    uint64_t n;
    b_cp cp[B_MAX_CPS + 2];
    int n_cp;
    int open;     /* the writer holds it open */
    int gc_maybe; /* a gc in flight may have taken it */
} b_sess;

typedef struct b_export {
    char name[24];
    uint64_t n;
    uint32_t *g;
    int acked;
} b_export;

typedef struct b_ctx {
    b_sess *s[2 * B_NAMES];
    int n;
    b_export *x;
    size_t nx, capx;
    struct msg fl; /* the call in flight */
    int in_flight;
    uint32_t gen_hi;
    keyset valid;
    soak_stats *st;
    uint64_t acks, acked_tokens, gc_deleted, index_rewrites, orphans, restores_refused;
    uint64_t ops[B_VERIFY + 1];
} b_ctx;

static b_sess *b_find(b_ctx *c, const char *name)
{
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->s[i]->name, name) == 0)
            return c->s[i];
    return NULL;
}

static b_sess *b_new(b_ctx *c, const char *name)
{
    cr_assert_lt(c->n, 2 * B_NAMES);
    cr_assert_null(b_find(c, name), "session %s twice", name);
    b_sess *s = calloc(1, sizeof(*s));
    cr_assert_not_null(s);
    snprintf(s->name, sizeof(s->name), "%s", name);
    c->s[c->n++] = s;
    return s;
}

static void b_del(b_ctx *c, const char *name)
{
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->s[i]->name, name) == 0) {
            free(c->s[i]->g.v);
            free(c->s[i]);
            c->s[i] = c->s[--c->n];
            return;
        }
    cr_assert_fail("no session %s to delete", name);
}

static void b_copy_gens(b_sess *dst, const uint32_t *g, uint64_t n)
{
    ts_gens_set(&dst->g, 0, n, 0);
    if (n)
        memcpy(dst->g.v, g, n * sizeof(*g));
    dst->n = n;
}

static b_export *b_find_export(b_ctx *c, const char *name)
{
    for (size_t i = 0; i < c->nx; i++)
        if (strcmp(c->x[i].name, name) == 0)
            return &c->x[i];
    return NULL;
}

static int b_cp_index(const b_sess *s, const char *name)
{
    for (int i = 0; i < s->n_cp; i++)
        if (strcmp(s->cp[i].name, name) == 0)
            return i;
    return -1;
}

static int b_cp_stale(const b_sess *s, const b_cp *cp)
{
    return !(s->n >= cp->n && (cp->n == 0 || ts_gens_get(&s->g, cp->n - 1) == cp->last_gen));
}

static b_sess *b_must(b_ctx *c, const char *name)
{
    b_sess *s = b_find(c, name);
    cr_assert_not_null(s, "the writer names %s, which the model does not know", name);
    return s;
}

static void b_key_at(b_ctx *c, const ts_gens *g, uint64_t n)
{
    if (n > 0)
        ks_add(&c->valid, n, ts_pat_id(n - 1, ts_gens_get(g, n - 1)));
}

static int b_on_msg(void *p, const struct msg *m)
{
    b_ctx *c = p;
    if (m->gen > c->gen_hi)
        c->gen_hi = m->gen;
    if (m->type == B_GONE) {
        b_sess *s = b_must(c, m->s1);
        if (!s->gc_maybe)
            soak_fail(c->st, "gc deleted %s, which the writer had open", m->s1);
        c->gc_deleted++;
        b_del(c, m->s1);
        return 0;
    }
    if (m->type != M_ACK) {
        cr_assert(!c->in_flight, "message %u while %u is in flight", m->type, c->fl.type);
        c->fl = *m;
        c->in_flight = 1;
        c->ops[m->type]++;
        switch (m->type) {
        case B_APPEND: {
            b_sess *s = b_must(c, m->s1);
            ts_gens_set(&s->g, m->a, m->b, m->gen);
            ks_add(&c->valid, m->b, ts_pat_id(m->b - 1, m->gen));
            break;
        }
        case B_ROLLBACK:
        case B_CP_RESTORE:
            b_key_at(c, &b_must(c, m->s1)->g, m->a);
            break;
        case B_FORK:
            b_key_at(c, &b_must(c, m->s1)->g, m->a);
            break;
        case B_EXPORT: {
            b_sess *s = b_must(c, m->s1);
            if (c->nx == c->capx) {
                c->capx = c->capx ? 2 * c->capx : 16;
                c->x = realloc(c->x, c->capx * sizeof(*c->x));
                cr_assert_not_null(c->x);
            }
            b_export *x = &c->x[c->nx++];
            memset(x, 0, sizeof(*x));
            snprintf(x->name, sizeof(x->name), "%s", m->s2);
            x->n = m->a;
            x->g = malloc((m->a + 1) * sizeof(*x->g));
            cr_assert_not_null(x->g);
            for (uint64_t q = 0; q < m->a; q++)
                x->g[q] = ts_gens_get(&s->g, q);
            break;
        }
        case B_IMPORT: {
            b_export *x = b_find_export(c, m->s2);
            cr_assert_not_null(x, "import of an unknown export %s", m->s2);
            if (x->n)
                ks_add(&c->valid, x->n, ts_pat_id(x->n - 1, x->g[x->n - 1]));
            break;
        }
        case B_GC:
            for (int i = 0; i < c->n; i++)
                c->s[i]->gc_maybe = !c->s[i]->open;
            break;
        default:
            break;
        }
        return 0;
    }
    cr_assert(c->in_flight, "an acknowledgement of nothing");
    const struct msg *f = &c->fl;
    c->in_flight = 0;
    c->acks++;
    switch (f->type) {
    case B_OPEN:
        b_must(c, f->s1)->open = 1;
        break;
    case B_CLOSE:
        b_must(c, f->s1)->open = 0;
        break;
    case B_CREATE:
        b_new(c, f->s1)->open = 1;
        break;
    case B_APPEND:
        b_must(c, f->s1)->n = f->b;
        c->acked_tokens += f->b - f->a;
        break;
    case B_ROLLBACK:
        b_must(c, f->s1)->n = f->a;
        break;
    case B_CP_CREATE: {
        b_sess *s = b_must(c, f->s1);
        cr_assert_lt(s->n_cp, B_MAX_CPS + 2);
        b_cp *cp = &s->cp[s->n_cp++];
        snprintf(cp->name, sizeof(cp->name), "%s", f->s2);
        cp->n = f->a;
        cp->last_gen = ts_gens_get(&s->g, f->a - 1);
        break;
    }
    case B_CP_RESTORE: {
        b_sess *s = b_must(c, f->s1);
        int k = b_cp_index(s, f->s2);
        if (k < 0) {
            soak_fail(c->st, "%s: restored checkpoint %s, which the model does not know",
                      f->s1, f->s2);
            break;
        }
        int stale = b_cp_stale(s, &s->cp[k]);
        if ((int)f->flag != stale || (m->rc == 0) == stale)
            soak_fail(c->st, "%s: checkpoint %s (%llu tokens of %llu) listed %s, restore says "
                      "%s; the model says %s", f->s1, f->s2, (unsigned long long)s->cp[k].n,
                      (unsigned long long)s->n, f->flag ? "stale" : "fresh",
                      ctxs_err_name(m->rc), stale ? "stale" : "fresh");
        if (m->rc == 0)
            s->n = s->cp[k].n;
        else
            c->restores_refused++;
        if (m->a != s->n)
            soak_fail(c->st, "%s: %llu tokens after the restore, the model says %llu", f->s1,
                      (unsigned long long)m->a, (unsigned long long)s->n);
        break;
    }
    case B_CP_DELETE: {
        b_sess *s = b_must(c, f->s1);
        int k = b_cp_index(s, f->s2);
        if (k >= 0)
            s->cp[k] = s->cp[--s->n_cp];
        break;
    }
    case B_FORK: {
        b_sess *src = b_must(c, f->s1);
        if (f->a > src->n)
            soak_fail(c->st, "fork of %llu tokens from %s, which holds %llu",
                      (unsigned long long)f->a, f->s1, (unsigned long long)src->n);
        b_sess *d = b_new(c, f->s2);
        b_copy_gens(d, src->g.v, f->a);
        d->open = (f->flag & 2) != 0;
        break;
    }
    case B_DELETE:
        if (m->rc == 0)
            b_del(c, f->s1);
        break;
    case B_RENAME:
        snprintf(b_must(c, f->s1)->name, 24, "%s", f->s2);
        break;
    case B_GC:
        for (int i = 0; i < c->n; i++)
            c->s[i]->gc_maybe = 0;
        break;
    case B_COMPACT:
        if (!f->s1[0]) {
            c->index_rewrites += m->a;
            c->orphans += m->b;
        }
        break;
    case B_EXPORT:
        b_find_export(c, f->s2)->acked = 1;
        break;
    case B_IMPORT: {
        b_export *x = b_find_export(c, f->s2);
        b_copy_gens(b_new(c, f->s1), x->g, x->n);
        break;
    }
    case B_REPAIR:
        if (m->a)
            soak_fail(c->st, "repair mended %llu files or entries in a store the writer had "
                      "open (after its own open had resolved everything)", (unsigned long long)m->a);
        break;
    default:
        break;
    }
    return 0;
}

/* --- The parent's checks after a kill ---------------------------------------- */

/* What the dead writer left, before a store open resolves it: intents in
 * the index (read with raw LMDB, no store handle open here) and files
 * written aside. */
static void b_leftovers(const char *store_dir, uint64_t *intents, uint64_t *aside)
{
    MDB_env *env;
    cr_assert_eq(mdb_env_create(&env), 0);
    cr_assert_eq(mdb_env_set_maxdbs(env, 16), 0);
    cr_assert_eq(mdb_env_set_mapsize(env, (size_t)1 << 30), 0);
    int rc = mdb_env_open(env, ts_path(store_dir, "index"), MDB_RDONLY, 0600);
    if (rc == 0) {
        MDB_txn *txn;
        MDB_dbi dbi;
        MDB_stat ms;
        cr_assert_eq(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), 0);
        if (mdb_dbi_open(txn, "pending", 0, &dbi) == 0 && mdb_stat(txn, dbi, &ms) == 0)
            *intents += ms.ms_entries;
        mdb_txn_abort(txn);
    }
    mdb_env_close(env);
    DIR *d = opendir(ts_path(store_dir, "sessions"));
    if (!d)
        return;
    for (struct dirent *de; (de = readdir(d));)
        *aside += strstr(de->d_name, ".tmp-") != NULL;
    closedir(d);
}

static int b_listed(const ctxs_session_entry *l, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(l[i].name, name) == 0)
            return 1;
    return 0;
}

/* Held tokens of s that differ from what generations g say; all of [0, n)
 * must be held (no ring wraps here). */
static uint64_t b_check_exact(const ctxs_session *s, const ts_gens *g)
{
    ctxs_session_info info;
    ctxs_layout lay;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(ctxs_session_get_layout(&lay, s), 0);
    uint16_t k[TS_KV_MAX], v[TS_KV_MAX], ek[TS_KV_MAX], ev[TS_KV_MAX];
    const ctxs_geometry *geo = &info.model.geometry;
    size_t per = (size_t)geo->n_layers * geo->n_kv_heads * geo->head_dim;
    uint64_t bad = 0;
    for (uint64_t p = 0; p < info.n_tokens; p++) {
        uint32_t id = ts_pat_id(p, ts_gens_get(g, p)), slot;
        ts_pat_kv(geo, p, id, ek, ev);
        if (ctxs_session_get_slot(&slot, s, p) != 0 || ctxs_session_read_token(k, v, s, p, CTXS_DTYPE_F16) != 0 ||
            lay.token_ids[slot] != id || memcmp(k, ek, per * 2) || memcmp(v, ev, per * 2))
            bad++;
    }
    return bad;
}

static uint32_t *b_prompt(const b_sess *s)
{
    uint32_t *t = malloc((s->n + 1) * sizeof(*t));
    cr_assert_not_null(t);
    for (uint64_t p = 0; p < s->n; p++)
        t[p] = ts_pat_id(p, ts_gens_get(&s->g, p));
    return t;
}

/* The longest cached prefix of s's tokens: honest always, and at least its
 * whole chunks once s has been opened read-write since it was written. */
static void b_check_prefix(ctxs_store *st, const b_sess *s, int caught_up, soak_stats *sst,
                           const char *what)
{
    if (s->n < CTXS_PREFIX_CHUNK)
        return;
    ctxs_model m = ts_model(MODEL_SEED);
    uint32_t *prompt = b_prompt(s);
    ctxs_prefix_match pm;
    int rc = ctxs_prefix_find(&pm, st, m.model_hash, prompt, s->n);
    uint64_t whole = s->n / CTXS_PREFIX_CHUNK * CTXS_PREFIX_CHUNK;
    if (rc == CTXS_ENOTFOUND) {
        if (caught_up)
            soak_fail(sst, "%s: %s holds %llu tokens, opened read-write, but prefix_find finds "
                      "none", what, s->name, (unsigned long long)s->n);
        free(prompt);
        return;
    }
    if (rc != 0) {
        soak_fail(sst, "%s: prefix_find(%s): %s", what, s->name, ctxs_err_name(rc));
        free(prompt);
        return;
    }
    if (caught_up && pm.n_tokens < whole)
        soak_fail(sst, "%s: prefix_find(%s) matched %llu tokens in %s; it holds %llu", what,
                  s->name, (unsigned long long)pm.n_tokens, pm.session, (unsigned long long)s->n);
    ctxs_session *h;
    rc = ctxs_store_session_open(&h, st, pm.session, NULL, CTXS_RDONLY, NULL);
    if (rc != 0) {
        soak_fail(sst, "%s: the match %s of %s does not open: %s", what, pm.session, s->name,
                  ctxs_err_name(rc));
        free(prompt);
        return;
    }
    ctxs_layout lay;
    cr_assert_eq(ctxs_session_get_layout(&lay, h), 0);
    for (uint64_t p = 0; p < pm.n_tokens && p < s->n; p++) {
        uint32_t slot;
        if (ctxs_session_get_slot(&slot, h, p) != 0 || lay.token_ids[slot] != prompt[p]) {
            soak_fail(sst, "%s: prefix_find(%s) matched %llu tokens of %s, which differs at %llu",
                      what, s->name, (unsigned long long)pm.n_tokens, pm.session,
                      (unsigned long long)p);
            break;
        }
    }
    ctxs_session_close(h);
    free(prompt);
}

/* Files in sessions/ that no entry names: leftovers of a create (written
 * aside, or linked but never indexed). */
static size_t b_strays(const char *store_dir, const ctxs_session_entry *l, size_t n,
                       char names[][64], size_t max)
{
    DIR *d = opendir(ts_path(store_dir, "sessions"));
    cr_assert_not_null(d);
    size_t k = 0;
    for (struct dirent *de; (de = readdir(d));) {
        if (de->d_name[0] == '.')
            continue;
        char *end;
        uint64_t id = strtoull(de->d_name, &end, 16);
        int found = 0;
        for (size_t i = 0; i < n && !found; i++)
            found = l[i].id == id;
        if ((!found || strcmp(end, ".ctxs") != 0) && k < max)
            snprintf(names[k++], 64, "%.63s", de->d_name);
    }
    closedir(d);
    return k;
}

/* Files in sessions/ and index entries agree, and nothing is left aside.
 * A reader's store open may be removing what the dead writer left right
 * now: what is still there a moment later stays. Those are counted (as
 * failures), then removed, so that the next checks start clean. */
static uint64_t b_check_agree(const char *store_dir, const ctxs_session_entry *l, size_t n,
                              soak_stats *sst, const char *what)
{
    char names[8][64];
    size_t k = b_strays(store_dir, l, n, names, 8);
    for (int tries = 0; k && tries < 20; tries++) {
        ts_sleep_us(10000);
        k = b_strays(store_dir, l, n, names, 8);
    }
    for (size_t i = 0; i < k; i++) {
        /* A file no entry, intent or open will ever account for. */
        soak_fail(sst, "%s: sessions/%s is left over", what, names[i]);
        char p[4200];
        snprintf(p, sizeof(p), "%s/sessions/%s", store_dir, names[i]);
        unlink(p);
    }
    return k;
}

/* Checks the exports: every acknowledged one is there and nothing else
 * but what a killed export left aside under a temporary name (named;
 * removed, and counted). */
static uint64_t b_check_exports(b_ctx *c, const char *exports, soak_stats *sst, const char *what,
                                bool named)
{
    uint64_t aside = 0;
    DIR *d = opendir(exports);
    cr_assert_not_null(d);
    for (struct dirent *de; (de = readdir(d));) {
        if (de->d_name[0] == '.')
            continue;
        if (strstr(de->d_name, ".tmp-")) {
            if (!named)
                soak_fail(sst, "%s: exports/%s was left by an export that wrote its file unnamed",
                          what, de->d_name);
            unlink(ts_path(exports, de->d_name));
            aside++;
            continue;
        }
        char nm[24];
        size_t len = strlen(de->d_name);
        snprintf(nm, sizeof(nm), "%.*s", (int)(len > 5 ? len - 5 : 0), de->d_name);
        b_export *x = b_find_export(c, nm);
        if (!x || !x->acked)
            soak_fail(sst, "%s: exports/%s is no acknowledged export", what, de->d_name);
    }
    closedir(d);
    for (size_t i = 0; i < c->nx; i++) {
        struct stat sb;
        char p[4200];
        snprintf(p, sizeof(p), "%s/%s.ctxx", exports, c->x[i].name);
        if (c->x[i].acked && stat(p, &sb) != 0)
            soak_fail(sst, "%s: acknowledged export %s is missing", what, c->x[i].name);
    }
    return aside;
}

typedef struct b_totals {
    uint64_t intents, aside, exports_aside, sessions_checked, tokens_checked, prefix_checks,
        repairs, strays;
    size_t most_sessions;
} b_totals;

static void b_check_store(b_ctx *c, const char *store_dir, const char *exports, unsigned iter,
                          uint64_t *rng, b_totals *tot, const char *what, bool named)
{
    soak_stats *sst = c->st;
    b_leftovers(store_dir, &tot->intents, &tot->aside);
    ctxs_store *st;
    int rc = ctxs_store_open(&st, store_dir, CTXS_STORE_CREATE, NULL);
    cr_assert_eq(rc, 0, "%s: store open: %s", what, ctxs_err_name(rc));
    sst->images++;
    /* An intent stays while another process holds its file: a reader that
     * looked a session up before gc deleted it may open the file after the
     * deleting writer was killed. What stays once readers let go fails. */
    for (int tries = 0; ts_pending_intents(st) != 0 && tries < 20; tries++) {
        ctxs_store_close(st);
        ts_sleep_us(10000);
        rc = ctxs_store_open(&st, store_dir, CTXS_STORE_CREATE, NULL);
        cr_assert_eq(rc, 0, "%s: store open: %s", what, ctxs_err_name(rc));
    }
    if (ts_pending_intents(st) != 0)
        soak_fail(sst, "%s: intents left after the store was opened", what);
    ctxs_session_entry *l;
    size_t n;
    cr_assert_eq(ctxs_store_session_list(&l, &n, st), 0);

    /* What the call in flight did, seen from here. */
    const struct msg *f = c->in_flight ? &c->fl : NULL;
    if (f) {
        switch (f->type) {
        case B_CREATE:
            if (b_listed(l, n, f->s1))
                b_new(c, f->s1);
            break;
        case B_FORK:
            if (b_listed(l, n, f->s2)) {
                b_sess *src = b_must(c, f->s1);
                b_copy_gens(b_new(c, f->s2), src->g.v, f->a);
            }
            break;
        case B_DELETE:
            if (!b_listed(l, n, f->s1))
                b_del(c, f->s1);
            break;
        case B_RENAME:
            if (b_listed(l, n, f->s2))
                snprintf(b_must(c, f->s1)->name, 24, "%s", f->s2);
            break;
        case B_GC:
            for (int i = 0; i < c->n; i++)
                if (c->s[i]->gc_maybe && !b_listed(l, n, c->s[i]->name)) {
                    c->gc_deleted++;
                    b_del(c, c->s[i--]->name);
                }
            break;
        case B_EXPORT: {
            struct stat sb;
            char p[4200];
            snprintf(p, sizeof(p), "%s/%s.ctxx", exports, f->s2);
            if (stat(p, &sb) == 0)
                b_find_export(c, f->s2)->acked = 1;
            break;
        }
        case B_IMPORT:
            if (b_listed(l, n, f->s1)) {
                b_export *x = b_find_export(c, f->s2);
                b_copy_gens(b_new(c, f->s1), x->g, x->n);
            }
            break;
        default:
            break;
        }
    }
    for (int i = 0; i < c->n; i++) {
        c->s[i]->gc_maybe = 0;
        c->s[i]->open = 0;
    }
    tot->strays += b_check_agree(store_dir, l, n, sst, what);
    for (size_t i = 0; i < n; i++)
        if (!b_find(c, l[i].name))
            soak_fail(sst, "%s: the store lists %s, which no acknowledged or interrupted call "
                      "made (half created, leaked or resurrected)", what, l[i].name);
    if ((size_t)c->n > tot->most_sessions)
        tot->most_sessions = (size_t)c->n;

    ctxs_model m = ts_model(MODEL_SEED);
    int all_rw = iter % 16 == 0;
    for (int i = 0; i < c->n; i++) {
        b_sess *s = c->s[i];
        if (!b_listed(l, n, s->name)) {
            soak_fail(sst, "%s: session %s (%llu tokens acknowledged) is gone", what, s->name,
                      (unsigned long long)s->n);
            sst->lost += s->n;
            b_del(c, s->name);
            i--;
            continue;
        }
        uint64_t lo = s->n, hi = s->n;
        int touched = f && strcmp(f->s1, s->name) == 0;
        if (touched && (f->type == B_APPEND || f->type == B_ROLLBACK || f->type == B_CP_RESTORE)) {
            lo = f->a < f->b ? f->a : f->b;
            hi = f->a < f->b ? f->b : f->a;
        }
        /* Read-only first: what the writer left, before anyone writes. */
        ctxs_session *h;
        rc = ctxs_store_session_open(&h, st, s->name, &m, CTXS_RDONLY | CTXS_OPEN_VERIFY, NULL);
        if (rc != 0) {
            soak_fail(sst, "%s: %s does not open read-only: %s", what, s->name, ctxs_err_name(rc));
            continue;
        }
        ctxs_session_info info;
        cr_assert_eq(ctxs_session_get_info(&info, h), 0);
        uint64_t acked_lo = touched && f->type == B_APPEND ? f->a : lo;
        if (info.n_tokens != lo && info.n_tokens != hi) {
            soak_fail(sst, "%s: %s holds %llu tokens; the writer left %llu or %llu", what,
                      s->name, (unsigned long long)info.n_tokens, (unsigned long long)lo,
                      (unsigned long long)hi);
        }
        if (info.n_tokens < acked_lo)
            sst->lost += acked_lo - info.n_tokens;
        if (info.lost_tokens)
            soak_fail(sst, "%s: %s: recovery dropped %llu tokens after a process crash", what,
                      s->name, (unsigned long long)info.lost_tokens);
        s->n = info.n_tokens;
        uint64_t bad = b_check_exact(h, &s->g), bad_pos = 0;
        if (bad) {
            sst->lost += bad;
            soak_fail(sst, "%s: %s: %llu of %llu tokens read back wrong", what, s->name,
                      (unsigned long long)bad, (unsigned long long)s->n);
        }
        if ((rc = ctxs_session_verify(&bad_pos, h)) != 0)
            soak_fail(sst, "%s: %s: verify: %s at %llu", what, s->name, ctxs_err_name(rc),
                      (unsigned long long)bad_pos);
        tot->sessions_checked++;
        tot->tokens_checked += s->n;
        ctxs_session_close(h);

        /* Checkpoints: the acknowledged ones (and the one in flight, or
         * not), each as stale as the model says. */
        ctxs_checkpoint_entry *cl;
        size_t ncl;
        if ((rc = ts_checkpoint_list(&cl, &ncl, st, s->name)) != 0) {
            soak_fail(sst, "%s: checkpoint_list(%s): %s", what, s->name, ctxs_err_name(rc));
            continue;
        }
        if (touched && f->type == B_CP_CREATE) {
            for (size_t j = 0; j < ncl; j++)
                if (strcmp(cl[j].name, f->s2) == 0 && b_cp_index(s, f->s2) < 0) {
                    b_cp *cp = &s->cp[s->n_cp++];
                    snprintf(cp->name, sizeof(cp->name), "%s", f->s2);
                    cp->n = f->a;
                    cp->last_gen = ts_gens_get(&s->g, f->a - 1);
                }
        }
        if (touched && f->type == B_CP_DELETE) {
            int found = 0;
            for (size_t j = 0; j < ncl; j++)
                found |= strcmp(cl[j].name, f->s2) == 0;
            int k = b_cp_index(s, f->s2);
            if (!found && k >= 0)
                s->cp[k] = s->cp[--s->n_cp];
        }
        if (ncl != (size_t)s->n_cp)
            soak_fail(sst, "%s: %s has %zu checkpoints, the model %d", what, s->name, ncl,
                      s->n_cp);
        for (size_t j = 0; j < ncl; j++) {
            int k = b_cp_index(s, cl[j].name);
            if (k < 0)
                soak_fail(sst, "%s: %s has checkpoint %s, which nobody made", what, s->name,
                          cl[j].name);
            else if ((int)cl[j].stale != b_cp_stale(s, &s->cp[k]) || cl[j].n_tokens != s->cp[k].n)
                soak_fail(sst, "%s: %s: checkpoint %s at %llu is listed %s; the model says %s "
                          "at %llu", what, s->name, cl[j].name,
                          (unsigned long long)cl[j].n_tokens, cl[j].stale ? "stale" : "fresh",
                          b_cp_stale(s, &s->cp[k]) ? "stale" : "fresh",
                          (unsigned long long)s->cp[k].n);
        }
        ctxs_free(cl);

        /* A read-write open brings the prefix entries up to date. */
        int rw = all_rw || touched || ts_rng_next(rng) % 6 == 0;
        if (rw) {
            rc = ctxs_store_session_open(&h, st, s->name, &m, CTXS_OPEN_VERIFY, NULL);
            if (rc != 0) {
                soak_fail(sst, "%s: %s does not open read-write: %s", what, s->name,
                          ctxs_err_name(rc));
                continue;
            }
            cr_assert_eq(ctxs_session_get_info(&info, h), 0);
            if (info.n_tokens != s->n || info.n_reserved)
                soak_fail(sst, "%s: %s read-write: %llu tokens, %u reserved; read-only %llu",
                          what, s->name, (unsigned long long)info.n_tokens, info.n_reserved,
                          (unsigned long long)s->n);
            ctxs_session_close(h);
        }
        b_check_prefix(st, s, rw, sst, what);
        tot->prefix_checks += s->n >= CTXS_PREFIX_CHUNK;
    }
    ctxs_free(l);
    if (iter % 10 == 9) {
        ctxs_store_repair_result rr;
        cr_assert_eq(ctxs_store_repair(&rr, st), 0);
        tot->repairs++;
        if (rr.files_adopted || rr.files_removed || rr.entries_removed)
            soak_fail(sst, "%s: repair after the open: %llu adopted, %llu removed, %llu entries "
                      "removed", what, (unsigned long long)rr.files_adopted,
                      (unsigned long long)rr.files_removed, (unsigned long long)rr.entries_removed);
    }
    ctxs_store_close(st);
    tot->exports_aside += b_check_exports(c, exports, sst, what, named);
    c->in_flight = 0;
}

Test(soak, store_writers_killed_during_index_transactions_and_maintenance, .timeout = 3600)
{
    const char *test = "soak store";
    uint64_t rng = ts_seed(test);
    unsigned kills = scaled(1200);
    const char *dir = ts_scratch; /* removed by the suite's fini, pass or fail */
    char store_dir[4096], exports[4096];
    snprintf(store_dir, sizeof(store_dir), "%s/store", dir);
    snprintf(exports, sizeof(exports), "%s/exports", dir);
    cr_assert_eq(mkdir(exports, 0700), 0);
    {
        ctxs_store *st;
        cr_assert_eq(ctxs_store_open(&st, store_dir, CTXS_STORE_CREATE, NULL), 0);
        ctxs_model m = ts_model(MODEL_SEED);
        cr_assert_eq(ctxs_model_register(st, &m, "soak"), 0);
        ctxs_store_close(st);
    }
    uint64_t t0 = ts_now_us();
    readers rd;
    readers_start(&rd, 2, NULL, store_dir, ts_rng_next(&rng));

    soak_stats st;
    memset(&st, 0, sizeof(st));
    b_ctx *c = calloc(1, sizeof(*c));
    cr_assert_not_null(c);
    c->st = &st;
    b_totals tot;
    memset(&tot, 0, sizeof(tot));
    for (unsigned i = 0; i < kills; i++) {
        kill_plan kp = pick_plan(&rng, 250000, 600, 400000);
        b_args a = {store_dir, exports, ts_rng_next(&rng), c->gen_hi + 1, (uint64_t)i << 16};
        death d;
        run_to_death(b_child_main, &a, &kp, b_on_msg, c, &d);
        count_death(&st, &d);
        if (d.exit_code >= 0)
            soak_fail(&st, "kill %u: the writer exited with %d before it was killed (its "
                      "stderr says why)", i, d.exit_code);
        char what[200];
        snprintf(what, sizeof(what), "kill %u (%s %s, in flight: %u %s %s)", i,
                 d.at_point ? "at" : "after", d.at_point ? kp_names[d.call] : "a delay",
                 c->in_flight ? c->fl.type : 0, c->in_flight ? c->fl.s1 : "",
                 c->in_flight ? c->fl.s2 : "");
        b_check_store(c, store_dir, exports, i, &rng, &tot, what, kp.named);
        readers_drain(&rd, &c->valid);
    }
    readers_stop(&rd, &c->valid);
    st.acked_ops = c->acks;
    st.acked_tokens = c->acked_tokens;
    reader_totals rt = readers_sum(&rd);
    say("%s: %llu kills (%llu at kill points, %llu after a random delay), %llu writers failed "
        "on their own; %llu crash images checked (store opens after a kill: %llu sessions, "
        "%llu tokens, %llu prefix lookups checked; %llu kills left intents, %llu left files "
        "aside in sessions/ (%llu of them never removed), %llu in exports/); %llu calls and %llu tokens acknowledged, %llu "
        "lost; up to %zu sessions; %llu deleted by gc, %llu index rewrites, %llu orphans "
        "removed, %llu restores of stale checkpoints refused; readers: %llu store opens, "
        "%llu checks passed, %llu void, %llu opens refused (deleted or busy), %llu states "
        "seen, %llu never announced, %llu violations; %llu failures; %.1f s",
        test, (unsigned long long)st.kills, (unsigned long long)st.at_points,
        (unsigned long long)st.by_parent, (unsigned long long)st.child_failures,
        (unsigned long long)st.images, (unsigned long long)tot.sessions_checked,
        (unsigned long long)tot.tokens_checked, (unsigned long long)tot.prefix_checks,
        (unsigned long long)tot.intents, (unsigned long long)tot.aside,
        (unsigned long long)tot.strays, (unsigned long long)tot.exports_aside, (unsigned long long)st.acked_ops,
        (unsigned long long)st.acked_tokens, (unsigned long long)st.lost, tot.most_sessions,
        (unsigned long long)c->gc_deleted, (unsigned long long)c->index_rewrites,
        (unsigned long long)c->orphans, (unsigned long long)c->restores_refused,
        (unsigned long long)rt.opens, (unsigned long long)rt.checks,
        (unsigned long long)rt.void_checks, (unsigned long long)rt.refused,
        (unsigned long long)rd.observed, (unsigned long long)rd.unannounced,
        (unsigned long long)rt.violations, (unsigned long long)st.failures,
        (ts_now_us() - t0) / 1e6);
    char ops[1024];
    size_t len = 0;
    static const char *const op_names[] = {
        [B_OPEN] = "open", [B_CLOSE] = "close", [B_CREATE] = "create", [B_APPEND] = "append",
        [B_ROLLBACK] = "rollback", [B_CP_CREATE] = "checkpoint", [B_CP_RESTORE] = "restore",
        [B_CP_DELETE] = "checkpoint_delete", [B_FORK] = "fork", [B_DELETE] = "delete",
        [B_RENAME] = "rename", [B_GC] = "gc", [B_COMPACT] = "compact", [B_EXPORT] = "export",
        [B_IMPORT] = "import", [B_REPAIR] = "repair", [B_VERIFY] = "verify",
    };
    for (int t = B_OPEN; t <= B_VERIFY; t++)
        if (op_names[t])
            len += (size_t)snprintf(ops + len, sizeof(ops) - len, " %s %llu", op_names[t],
                                    (unsigned long long)c->ops[t]);
    say("  calls announced:%s", ops);
    soak_finish(&st, &rd, &rt);
    for (int i = 0; i < c->n; i++) {
        free(c->s[i]->g.v);
        free(c->s[i]);
    }
    for (size_t i = 0; i < c->nx; i++)
        free(c->x[i].g);
    free(c->x);
    free(c->valid.v);
    free(c);
}

/* =================================================================================
 * 3. Reproducers of what the soaks found (each stops a writer at an exact
 *    call instead of at a random one).
 * ================================================================================= */

typedef struct held {
    pid_t pid;
    int fd; /* its messages */
    int go;  /* releases it */
} held;

typedef struct held_args {
    const char *store_dir;
    int what; /* 0: create, 1: fork, 2: import */
    const char *export_path;
    int call, after; /* where to stop first */
    bool named;      /* its file written aside has a temporary name */
} held_args;

/* In the child: opens the store, arms the kill point (a stop), makes the
 * call and sends what it returned. */
static void held_body(void *p)
{
    const held_args *a = p;
    ctxs_store *st;
    int rc = ctxs_store_open(&st, a->store_dir, CTXS_STORE_CREATE, NULL);
    if (rc != 0)
        child_fail("store open", rc, 0, 0);
    atomic_store(&kp_only, a->call);
    atomic_store(&kp_hold, 1);
    kp_arm(1, a->after);
    ctxs_model m = ts_model(MODEL_SEED);
    ctxs_session *s = NULL;
    if (a->what == 0)
        rc = ctxs_store_session_create(&s, st, "new", &m, NULL);
    else if (a->what == 1)
        rc = ctxs_store_session_fork(&s, st, "base", "new", UINT64_MAX, NULL);
    else
        rc = ctxs_store_session_import(NULL, st, a->export_path, "new", NULL);
    kp_arm(0, 0);
    child_say(M_ACK, rc, 0, 0, 0, NULL, NULL);
    ctxs_session_close(s);
    ctxs_store_close(st);
    _exit(0);
}

static void held_wait(held *h, const char *call)
{
    struct msg m;
    ssize_t r;
    do
        r = read(h->fd, &m, sizeof(m));
    while (r < 0 && errno == EINTR);
    cr_assert_eq(r, (ssize_t)sizeof(m), "the child never reached %s", call);
    cr_assert_eq(m.type, M_HELD);
}

/* Runs held_body in a child that stops right before (a->after == 0) or
 * after its first call of kind a->call; returns once it has stopped there. */
static held held_start(held_args *a)
{
    int p[2], go[2];
    cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
    cr_assert_eq(pipe2(go, O_CLOEXEC), 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        close(p[0]);
        close(go[1]);
        kp_release_fd = go[0];
        kill_plan kp = {.named = a->named};
        child_start(held_body, a, p[1], &kp);
    }
    close(p[1]);
    close(go[0]);
    held h = {pid, p[0], go[1]};
    held_wait(&h, kp_names[a->call]);
    return h;
}

/* Lets the held child finish its call; returns what the call returned. */
static int held_finish(held *h)
{
    uint8_t b = KP_N; /* stop nowhere */
    cr_assert_eq(write(h->go, &b, 1), 1);
    struct msg m;
    ssize_t r;
    do
        r = read(h->fd, &m, sizeof(m));
    while (r < 0 && errno == EINTR);
    cr_assert_eq(r, (ssize_t)sizeof(m), "the child died before its call returned");
    cr_assert_eq(m.type, M_ACK);
    int status;
    cr_assert_eq(waitpid(h->pid, &status, 0), h->pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child: status %#x", status);
    close(h->fd);
    close(h->go);
    return m.rc;
}

/* Lets the held child go on to the next call of kind `call`, where it
 * stops again. */
static void held_next(held *h, int call)
{
    uint8_t b = (uint8_t)call;
    cr_assert_eq(write(h->go, &b, 1), 1);
    held_wait(h, kp_names[call]);
}

static void held_kill(held *h)
{
    kill(h->pid, SIGKILL);
    int status;
    cr_assert_eq(waitpid(h->pid, &status, 0), h->pid);
    cr_assert(WIFSIGNALED(status));
    close(h->fd);
    close(h->go);
}

/* Files in sessions/; *extra gets one that is not base's (id 1). */
static int sessions_dir_entries(const char *store_dir, char *extra, size_t len)
{
    DIR *d = opendir(ts_path(store_dir, "sessions"));
    cr_assert_not_null(d);
    int n = 0;
    snprintf(extra, len, "none");
    for (struct dirent *de; (de = readdir(d));) {
        if (de->d_name[0] == '.')
            continue;
        n++;
        if (strcmp(de->d_name, "0000000000000001.ctxs") != 0)
            snprintf(extra, len, "%s", de->d_name);
    }
    closedir(d);
    return n;
}

/* A store opened while another process's create (or fork, or import) is
 * writing its file aside, before link() puts it in place: the open must
 * leave that create's intent alone, so that when the creating process then
 * dies, the next open still removes what it left. */
static void intent_of_a_create_in_progress_as(int what, int after, int then, bool named)
{
    const char *dir = ts_scratch; /* removed by the suite's fini, pass or fail */
    const char *as = named ? "named" : "unnamed";
    char store_dir[4096], export_path[4200];
    snprintf(store_dir, sizeof(store_dir), "%s/store-%s", dir, as);
    snprintf(export_path, sizeof(export_path), "%s/base-%s.ctxx", dir, as);
    ctxs_model m = ts_model(MODEL_SEED);
    ctxs_store *st;
    cr_assert_eq(ctxs_store_open(&st, store_dir, CTXS_STORE_CREATE, NULL), 0);
    cr_assert_eq(ctxs_model_register(st, &m, NULL), 0);
    ctxs_session *s;
    cr_assert_eq(ctxs_store_session_create(&s, st, "base", &m, NULL), 0);
    cr_assert_eq(ts_pat_append(s, 100, 1, NULL), 0);
    ctxs_session_close(s);
    cr_assert_eq(ctxs_store_session_export(st, "base", export_path, NULL), 0);
    ctxs_store_close(st);

    held_args a = {store_dir, what, export_path, KP_LINK, after, named};
    held h = held_start(&a);
    /* Another process (this one) opens the store meanwhile. */
    cr_assert_eq(ctxs_store_open(&st, store_dir, CTXS_STORE_CREATE, NULL), 0);
    size_t pending = ts_pending_intents(st);
    ctxs_store_close(st);
    if (then >= 0)
        held_next(&h, then);
    held_kill(&h);

    cr_assert_eq(ctxs_store_open(&st, store_dir, CTXS_STORE_CREATE, NULL), 0);
    ctxs_session_entry *l;
    size_t n;
    cr_assert_eq(ctxs_store_session_list(&l, &n, st), 0);
    ctxs_free(l);
    size_t pending_after = ts_pending_intents(st);
    ctxs_store_close(st);
    char first[256];
    int files = sessions_dir_entries(store_dir, first, sizeof(first));
    ctxs_store_repair_result rr = {0};
    if ((size_t)files != n) {
        cr_assert_eq(ctxs_store_open(&st, store_dir, CTXS_STORE_CREATE, NULL), 0);
        cr_assert_eq(ctxs_store_repair(&rr, st), 0);
        ctxs_store_close(st);
    }
    say("%s (its file %s) stopped %s link()%s%s, the store opened elsewhere meanwhile (it saw "
        "%zu intents), then killed; after a new open: %zu entries, %d files in sessions/ (the "
        "new one: %s), "
        "%zu intents; repair then adopted %llu files, removed %llu",
        what == 0 ? "create" : what == 1 ? "fork" : "import", as, after ? "after" : "before",
        then >= 0 ? ", let go on to its next " : "", then >= 0 ? kp_names[then] : "", pending,
        n, files, first, pending_after, (unsigned long long)rr.files_adopted,
        (unsigned long long)rr.files_removed);
    cr_expect_eq(pending, 1, "the store open dropped the intent of a create in progress");
    cr_assert_eq((size_t)files, n, "a file the killed create left stays in sessions/ after a "
                 "store open (%d files, %zu entries; %s)", files, n, first);
}

static void intent_of_a_create_in_progress(int what, int after, int then)
{
    intent_of_a_create_in_progress_as(what, after, then, false);
    intent_of_a_create_in_progress_as(what, after, then, true);
}

Test(soak, a_store_open_elsewhere_keeps_the_intent_of_a_create_writing_aside)
{
    intent_of_a_create_in_progress(0, 0, -1);
}

Test(soak, a_store_open_elsewhere_keeps_the_intent_of_a_create_that_links_after_it)
{
    /* Opened before the link, killed after it, before the create indexed
     * its file: a whole session file nobody owns. */
    intent_of_a_create_in_progress(0, 0, KP_MDB_PUT);
}

Test(soak, a_store_open_elsewhere_keeps_the_intent_of_a_create_just_linked)
{
    intent_of_a_create_in_progress(0, 1, -1);
}

Test(soak, a_store_open_elsewhere_keeps_the_intent_of_a_fork_writing_aside)
{
    intent_of_a_create_in_progress(1, 0, -1);
}

Test(soak, a_store_open_elsewhere_keeps_the_intent_of_an_import_writing_aside)
{
    intent_of_a_create_in_progress(2, 0, -1);
}

/* A create's file written aside is opened, then locked: between the two, a
 * repair (or a store open resolving intents) elsewhere finds it unlocked,
 * takes it for a dead create's leftover and removes it, and the live create
 * fails at link() with -ENOENT. */
static void create_file_removed_before_its_lock(int by_repair)
{
    const char *dir = ts_scratch; /* removed by the suite's fini, pass or fail */
    char store_dir[4096];
    snprintf(store_dir, sizeof(store_dir), "%s/store", dir);
    ctxs_model m = ts_model(MODEL_SEED);
    ctxs_store *st;
    cr_assert_eq(ctxs_store_open(&st, store_dir, CTXS_STORE_CREATE, NULL), 0);
    cr_assert_eq(ctxs_model_register(st, &m, NULL), 0);
    if (!by_repair)
        ctxs_store_close(st); /* else kept open: a later open resolves nothing */

    /* Only a file with a name can be found before its lock. */
    held_args a = {store_dir, 0, NULL, KP_OPEN_TMP, 1, true};
    held h = held_start(&a); /* its file is open, not yet locked */
    ctxs_store_repair_result rr = {0};
    if (by_repair)
        cr_assert_eq(ctxs_store_repair(&rr, st), 0);
    else
        cr_assert_eq(ctxs_store_open(&st, store_dir, CTXS_STORE_CREATE, NULL), 0);
    ctxs_store_close(st);
    int rc = held_finish(&h);
    say("a create stopped between open() and the lock of its file; %s elsewhere meanwhile "
        "(repair: %llu files removed); then the create returned %s",
        by_repair ? "a repair ran" : "the store was opened",
        (unsigned long long)rr.files_removed, ctxs_err_name(rc));
    cr_expect_eq(rr.files_removed, 0, "repair removed the file of a create in progress");
    cr_assert_eq(rc, 0, "the create failed: %s", ctxs_err_name(rc));
}

Test(soak, a_repair_elsewhere_leaves_the_file_of_a_create_before_its_lock)
{
    create_file_removed_before_its_lock(1);
}

Test(soak, a_store_open_elsewhere_leaves_the_file_of_a_create_before_its_lock)
{
    create_file_removed_before_its_lock(0);
}

/* ctxs_store_session_fork(..., UINT64_MAX, ...) takes the source's count when it
 * looks the source up, and checks it against the source again when it
 * copies: a rollback by the source's writer in between makes the fork fail
 * with CTXS_EINVAL (an argument error) instead of CTXS_ESTALE, or instead
 * of forking what the source holds. */
Test(soak, a_fork_of_all_tokens_while_the_writer_rolls_back_is_not_einval)
{
    const char *dir = ts_scratch; /* removed by the suite's fini, pass or fail */
    char store_dir[4096];
    snprintf(store_dir, sizeof(store_dir), "%s/store", dir);
    ctxs_model m = ts_model(MODEL_SEED);
    ctxs_store *st;
    ctxs_session *s;
    cr_assert_eq(ctxs_store_open(&st, store_dir, CTXS_STORE_CREATE, NULL), 0);
    cr_assert_eq(ctxs_model_register(st, &m, NULL), 0);
    cr_assert_eq(ctxs_store_session_create(&s, st, "base", &m, NULL), 0);
    cr_assert_eq(ts_pat_append(s, 200, 1, NULL), 0);
    ctxs_session_close(s);
    ctxs_store_close(st);

    /* Stopped right after its first index transaction (the intent of its
     * new file), after it looked "base" up. */
    held_args a = {store_dir, 1, NULL, KP_MDB_COMMIT, 1, false};
    held h = held_start(&a);
    cr_assert_eq(ctxs_store_open(&st, store_dir, CTXS_STORE_CREATE, NULL), 0);
    cr_assert_eq(ctxs_store_session_open(&s, st, "base", &m, 0, NULL), 0);
    cr_assert_eq(ctxs_session_rollback(s, 150), 0);
    ctxs_session_close(s);
    ctxs_store_close(st);
    int rc = held_finish(&h);
    say("fork of all of \"base\" (200 tokens when looked up, rolled back to 150 before the "
        "copy): %s", ctxs_err_name(rc));
    cr_assert_neq(rc, CTXS_EINVAL, "the fork failed with CTXS_EINVAL, an argument error; the "
                  "header promises CTXS_ESTALE for a source rolled back during the copy");
}
