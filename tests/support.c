#include "support.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "index.h"

char *ts_mkdtemp(void)
{
    const char *base = getenv("TMPDIR");
    char tmpl[4096];
    snprintf(tmpl, sizeof(tmpl), "%s/ctxs-test-XXXXXX", base && *base ? base : "/tmp");
    char *dir = strdup(tmpl);
    cr_assert_not_null(dir);
    cr_assert_not_null(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    return dir;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static int chmod_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)ftw;
    if (flag == FTW_D)
        chmod(path, (sb->st_mode & 07777) | S_IRWXU);
    else if (flag == FTW_F)
        chmod(path, (sb->st_mode & 07777) | S_IRUSR | S_IWUSR);
    return 0;
}

void ts_rmtree(const char *dir)
{
    if (!dir)
        return;
    /* Directories a test made unwritable (ts_make_unwritable()) first take
     * their owner's rights back, before the walk that needs them. */
    nftw(dir, chmod_one, 16, FTW_PHYS);
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static int unwritable_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)ftw;
    if (flag != FTW_D && flag != FTW_DP && flag != FTW_F)
        return 0;
    mode_t mode = S_ISDIR(sb->st_mode) ? 0555 : 0444;
    return chmod(path, mode) == 0 ? 0 : -1;
}

int ts_make_unwritable(const char *dir)
{
    /* Depth first: a directory loses its write bit after what it holds. */
    if (chmod(ts_scratch, 0755) != 0 || nftw(dir, unwritable_one, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return -errno;
    return 0;
}

int ts_drop_privileges(void)
{
    if (geteuid() != 0)
        return 0;
    if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0)
        return -errno;
    return 0;
}

char *ts_scratch;

void ts_scratch_init(void)
{
    ts_scratch = ts_mkdtemp();
}

void ts_scratch_fini(void)
{
    ts_rmtree(ts_scratch);
    free(ts_scratch);
    ts_scratch = NULL;
}

const char *ts_path(const char *dir, const char *name)
{
    static char bufs[8][4096];
    static unsigned next;
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof(bufs[0]), "%s/%s", dir, name);
    return b;
}

int ts_exists(const char *path)
{
    struct stat sb;
    return lstat(path, &sb) == 0;
}

const char *ts_store_dir(void)
{
    static char buf[4096];
    snprintf(buf, sizeof(buf), "%s/store", ts_scratch);
    return buf;
}

ctxs_store *ts_store_open(const char *dir)
{
    ctxs_store *st = NULL;
    int rc = ctxs_store_open(&st, dir, CTXS_STORE_CREATE, NULL);
    cr_assert_eq(rc, 0, "ctxs_store_open(%s): %s", dir, ctxs_err_name(rc));
    cr_assert_not_null(st);
    return st;
}

const char *ts_id_path(uint64_t id)
{
    static char bufs[16][4200];
    static unsigned next;
    char *b = bufs[next++ % 16];
    snprintf(b, sizeof(bufs[0]), "%s/sessions/%016llx.ctxs", ts_store_dir(),
             (unsigned long long)id);
    return b;
}

ctxs_session_entry ts_session_entry(ctxs_store *st, const char *name)
{
    ctxs_session_entry e;
    int rc = ctxs_store_session_get(&e, st, name);
    cr_assert_eq(rc, 0, "get %s: %s", name, ctxs_err_name(rc));
    return e;
}

ctxs_session_info ts_info(const ctxs_session *s)
{
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    return info;
}

uint64_t ts_n_tokens(const ctxs_session *s)
{
    return ts_info(s).n_tokens;
}

uint64_t ts_mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

ctxs_model ts_model(uint32_t seed)
{
    ctxs_model m;
    memset(&m, 0, sizeof(m));
    m.geometry.n_layers = TS_N_LAYERS;
    m.geometry.n_kv_heads = TS_N_KV_HEADS;
    m.geometry.head_dim = TS_HEAD_DIM;
    m.geometry.dtype = CTXS_DTYPE_F16;
    for (int i = 0; i < 16; i++) {
        m.model_hash[i] = (uint8_t)ts_mix64(seed * 32u + (uint32_t)i);
        m.tokenizer_hash[i] = (uint8_t)ts_mix64(seed * 32u + 16u + (uint32_t)i);
    }
    return m;
}

uint32_t ts_token(uint64_t pos)
{
    return (uint32_t)(ts_mix64(pos + 7) % 50000u);
}

void ts_fill_kv(const ctxs_geometry *g, uint64_t pos, uint16_t *k, uint16_t *v)
{
    size_t n = (size_t)g->n_layers * g->n_kv_heads * g->head_dim;
    for (size_t i = 0; i < n; i++) {
        uint64_t h = ts_mix64(pos * 0x9e3779b97f4a7c15ull + i);
        k[i] = (uint16_t)(0x3c00u | (h & 0x3ffu));
        v[i] = (uint16_t)(0x3c00u | ((h >> 10) & 0x3ffu));
    }
}

int ts_try_append(ctxs_session *s, uint32_t n, int *stage)
{
    int at = 0;
    ctxs_session_info info;
    int rc = ctxs_session_get_info(&info, s);
    if (stage)
        *stage = 0;
    if (rc)
        return rc;
    const ctxs_geometry *g = &info.model.geometry;
    size_t per = (size_t)g->n_layers * g->n_kv_heads * g->head_dim;
    uint16_t *k = malloc(per * 2), *v = malloc(per * 2);
    uint32_t *ids = malloc((size_t)n * 4);
    ctxs_reservation r;
    if (!k || !v || !ids) {
        rc = CTXS_ENOMEM;
    } else {
        at = TS_AT_RESERVE;
        rc = ctxs_session_reserve(&r, s, n);
    }
    if (rc == 0)
        at = TS_AT_WRITE;
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        ts_fill_kv(g, r.first_pos + i, k, v);
        ids[i] = ts_token(r.first_pos + i);
        rc = ctxs_session_write_token(s, &r, i, k, v, CTXS_DTYPE_F16);
    }
    if (rc == 0) {
        at = TS_AT_COMMIT;
        rc = ctxs_session_commit(s, ids, n);
    }
    free(k);
    free(v);
    free(ids);
    if (stage)
        *stage = at;
    return rc;
}

int ts_append(ctxs_session *s, uint32_t n)
{
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    int stage, rc = ts_try_append(s, n, &stage);
    cr_assert(rc == 0 || stage != 0, "ts_append: out of memory");
    return rc;
}

int ts_append_layers(ctxs_session *s, uint32_t n)
{
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    const ctxs_geometry *g = &info.model.geometry;
    size_t per = (size_t)g->n_layers * g->n_kv_heads * g->head_dim;
    size_t layer = (size_t)g->n_kv_heads * g->head_dim;
    uint16_t *k = malloc(per * 2), *v = malloc(per * 2);
    uint16_t *lk = malloc((size_t)n * layer * 2), *lv = malloc((size_t)n * layer * 2);
    uint32_t *ids = malloc((size_t)n * 4);
    cr_assert(k && v && lk && lv && ids);
    ctxs_reservation r;
    int rc = ctxs_session_reserve(&r, s, n);
    for (uint32_t l = 0; rc == 0 && l < g->n_layers; l++) {
        for (uint32_t i = 0; i < n; i++) {
            ts_fill_kv(g, r.first_pos + i, k, v);
            memcpy(lk + i * layer, k + l * layer, layer * 2);
            memcpy(lv + i * layer, v + l * layer, layer * 2);
            ids[i] = ts_token(r.first_pos + i);
        }
        rc = ctxs_session_write_layer(s, &r, l, 0, n, lk, lv, CTXS_DTYPE_F16);
    }
    if (rc == 0)
        rc = ctxs_session_commit(s, ids, n);
    free(k);
    free(v);
    free(lk);
    free(lv);
    free(ids);
    return rc;
}

uint64_t ts_check_all(const ctxs_session *s)
{
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    const ctxs_geometry *g = &info.model.geometry;
    size_t per = (size_t)g->n_layers * g->n_kv_heads * g->head_dim;
    uint16_t *k = malloc(per * 2), *v = malloc(per * 2);
    uint16_t *ek = malloc(per * 2), *ev = malloc(per * 2);
    ctxs_layout lay;
    cr_assert_eq(ctxs_session_get_layout(&lay, s), 0);
    uint64_t bad = 0;
    for (uint64_t p = 0; p < info.n_tokens; p++) {
        int rc = ctxs_session_read_token(k, v, s, p, CTXS_DTYPE_F16);
        if (rc == CTXS_EEVICTED)
            continue;
        cr_assert_eq(rc, 0, "read_token(%llu): %s", (unsigned long long)p, ctxs_strerror(rc));
        uint32_t slot;
        cr_assert_eq(ctxs_session_get_slot(&slot, s, p), 0);
        ts_fill_kv(g, p, ek, ev);
        if (memcmp(k, ek, per * 2) || memcmp(v, ev, per * 2) || lay.token_ids[slot] != ts_token(p))
            bad++;
    }
    free(k);
    free(v);
    free(ek);
    free(ev);
    return bad;
}

void ts_same_tokens(const ctxs_session *a, const ctxs_session *b, uint64_t n, const char *what)
{
    uint16_t ka[TS_KV_MAX] = {0}, va[TS_KV_MAX] = {0}, kb[TS_KV_MAX] = {0}, vb[TS_KV_MAX] = {0};
    ctxs_layout la, lb;
    cr_assert_eq(ctxs_session_get_layout(&la, a), 0);
    cr_assert_eq(ctxs_session_get_layout(&lb, b), 0);
    for (uint64_t p = 0; p < n; p++) {
        int ra = ctxs_session_read_token(ka, va, a, p, CTXS_DTYPE_F16);
        int rb = ctxs_session_read_token(kb, vb, b, p, CTXS_DTYPE_F16);
        cr_assert_eq(ra, 0, "%s: source read_token(%llu): %s", what, (unsigned long long)p,
                     ctxs_err_name(ra));
        cr_assert_eq(rb, 0, "%s: fork read_token(%llu): %s", what, (unsigned long long)p,
                     ctxs_err_name(rb));
        cr_assert(memcmp(ka, kb, sizeof(ka)) == 0 && memcmp(va, vb, sizeof(va)) == 0,
                  "%s: position %llu differs", what, (unsigned long long)p);
        uint32_t sa, sb;
        cr_assert_eq(ctxs_session_get_slot(&sa, a, p), 0);
        cr_assert_eq(ctxs_session_get_slot(&sb, b, p), 0);
        cr_assert_eq(la.token_ids[sa], lb.token_ids[sb], "%s: token id at %llu", what,
                     (unsigned long long)p);
    }
}

uint8_t *ts_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "open %s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(size > 0 ? (size_t)size : 1);
    cr_assert_not_null(buf);
    cr_assert_eq(fread(buf, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    *len = (size_t)size;
    return buf;
}

int ts_write_file(const char *path, const void *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    const uint8_t *p = data;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            int e = errno;
            close(fd);
            return -e;
        }
        p += w;
        len -= (size_t)w;
    }
    close(fd);
    return 0;
}

uint64_t ts_seed(const char *test)
{
    const char *e = getenv("CTXS_TEST_SEED");
    uint64_t seed;
    if (e && *e) {
        seed = strtoull(e, NULL, 0);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 24) ^ ((uint64_t)getpid() << 44);
    }
    /* stderr: Criterion shows cr_log_info() only with --verbose. */
    fprintf(stderr, "%s: seed %llu (CTXS_TEST_SEED=%llu replays it)\n", test,
            (unsigned long long)seed, (unsigned long long)seed);
    return seed;
}

int ts_dir_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

/* --- Scenarios in a child process --------------------------------------- */

int ts_child_log_fd = -1;

void ts_say(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (n > (int)sizeof(buf) - 1)
        n = (int)sizeof(buf) - 1;
    if (n > 0 && write(ts_child_log_fd, buf, (size_t)n) < 0)
        return; /* the log is best effort; the exit status decides */
}

static int write_str(const char *path, const char *s)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, s, strlen(s));
    int e = errno;
    close(fd);
    errno = e;
    return n == (ssize_t)strlen(s) ? 0 : -1;
}

void ts_enter_small_disk(const char *mnt, const char *size)
{
    char uid_map[64], gid_map[64], opts[64];
    snprintf(uid_map, sizeof(uid_map), "0 %u 1\n", (unsigned)getuid());
    snprintf(gid_map, sizeof(gid_map), "0 %u 1\n", (unsigned)getgid());
    snprintf(opts, sizeof(opts), "size=%s,mode=0700", size);
    const char *step;
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0)
        step = "unshare(CLONE_NEWUSER|CLONE_NEWNS)";
    else if (write_str("/proc/self/setgroups", "deny") != 0 && errno != ENOENT)
        step = "write /proc/self/setgroups";
    else if (write_str("/proc/self/uid_map", uid_map) != 0)
        step = "write /proc/self/uid_map";
    else if (write_str("/proc/self/gid_map", gid_map) != 0)
        step = "write /proc/self/gid_map";
    else if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
        step = "make / private";
    else if (mount("ctxs-test", mnt, "tmpfs", MS_NOSUID | MS_NODEV, opts) != 0)
        step = "mount a tmpfs";
    else
        return;
    ts_say("%s: %s", step, strerror(errno));
    _exit(77);
}

pid_t ts_fork_pipe(int *fd)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    close(fds[pid == 0 ? 0 : 1]);
    *fd = fds[pid == 0 ? 1 : 0];
    return pid;
}

int ts_in_child(int (*body)(void *arg), void *arg, const char *what)
{
    int fd;
    pid_t pid = ts_fork_pipe(&fd);
    if (pid == 0) {
        int rc = body(arg);
        ssize_t w = write(fd, &rc, sizeof(rc));
        _exit(w == (ssize_t)sizeof(rc) ? 0 : 1);
    }
    int rc = 0;
    ssize_t got;
    do
        got = read(fd, &rc, sizeof(rc));
    while (got < 0 && errno == EINTR);
    close(fd);
    int status = ts_wait(pid);
    cr_assert(!WIFSIGNALED(status), "%s: the child was killed by signal %d (%s)", what,
              WIFSIGNALED(status) ? WTERMSIG(status) : 0,
              WIFSIGNALED(status) ? strsignal(WTERMSIG(status)) : "?");
    cr_assert_eq(WEXITSTATUS(status), 0, "%s: the child exited %d (a fault under ASan?)", what,
                 WEXITSTATUS(status));
    cr_assert_eq(got, (ssize_t)sizeof(rc), "%s: the child sent no result", what);
    return rc;
}

int ts_store_read(unsigned flags, int deep)
{
    ctxs_store *st = NULL;
    int rc = ctxs_store_open(&st, ts_store_dir(), flags, NULL);
    ctxs_session_entry *list = NULL;
    size_t n = 0;
    if (rc == 0)
        rc = ctxs_store_session_list(&list, &n, st);
    for (size_t i = 0; deep && rc == 0 && i < n; i++) {
        ctxs_meta_entry *meta = NULL;
        size_t n_meta = 0;
        rc = ctxs_store_session_list_meta(&meta, &n_meta, st, list[i].name);
        ctxs_free(meta);
    }
    ctxs_free(list);
    ctxs_store_close(st);
    return rc;
}

void ts_run_child(void (*body)(const char *mnt), const char *what)
{
    const char *mnt = ts_path(ts_scratch, "mnt");
    cr_assert_eq(mkdir(mnt, 0700), 0);
    int fd;
    pid_t pid = ts_fork_pipe(&fd);
    if (pid == 0) {
        ts_child_log_fd = fd;
        body(mnt);
        _exit(1);
    }
    static char msg[16384];
    size_t len = 0;
    for (;;) {
        ssize_t r = read(fd, msg + len, sizeof(msg) - 1 - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        len += (size_t)r;
        if (len == sizeof(msg) - 1)
            break;
    }
    msg[len] = '\0';
    close(fd);
    int st = ts_wait(pid);
    if (WIFSIGNALED(st))
        cr_assert_fail("%s: the child died of signal %d (%s). Its log:\n%s", what, WTERMSIG(st),
                       strsignal(WTERMSIG(st)), msg);
    cr_assert(WIFEXITED(st));
    if (WEXITSTATUS(st) == 77) {
        cr_log_info("SKIPPED %s: the small disk it needs cannot be made here: %s", what, msg);
        cr_skip_test("SKIPPED %s: the small disk it needs cannot be made here (%s)", what, msg);
    }
    cr_assert_eq(WEXITSTATUS(st), 0, "%s: %s", what, msg);
    cr_log_info("%s: %s", what, msg);
}

ctxs_create_options ts_options(uint32_t capacity, uint32_t n_sink, uint32_t ring,
                                uint32_t durability)
{
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = capacity;
    o.n_sink = n_sink;
    o.ring = ring;
    o.open.durability = durability;
    return o;
}

/* Opens the session named session read-only, lets fn use the handle, and
 * closes it. */
static int with_session(ctxs_store *st, const char *session,
                        int (*fn)(ctxs_session *s, void *arg), void *arg)
{
    ctxs_session *s = NULL;
    int rc = ctxs_store_session_open(&s, st, session, NULL, CTXS_RDONLY, NULL);
    if (rc == 0) {
        rc = fn(s, arg);
        ctxs_session_close(s);
    }
    return rc;
}

typedef struct listing {
    ctxs_checkpoint_entry **out;
    size_t *n_out;
} listing;

static int list_of(ctxs_session *s, void *arg)
{
    listing *l = arg;
    return ctxs_checkpoint_list(l->out, l->n_out, s);
}

int ts_checkpoint_list(ctxs_checkpoint_entry **out, size_t *n_out, ctxs_store *st,
                       const char *session)
{
    *out = NULL;
    *n_out = 0;
    listing l = {out, n_out};
    return with_session(st, session, list_of, &l);
}

static int delete_of(ctxs_session *s, void *arg)
{
    return ctxs_checkpoint_delete(s, arg);
}

int ts_checkpoint_delete(ctxs_store *st, const char *session, const char *name)
{
    return with_session(st, session, delete_of, (void *)name);
}

void ts_append_many(ctxs_session *s, uint64_t n)
{
    while (n) {
        uint32_t k = n > 50 ? 50 : (uint32_t)n;
        int rc = ts_append(s, k);
        cr_assert_eq(rc, 0, "append: %s", ctxs_err_name(rc));
        n -= k;
    }
}

uint64_t ts_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

int ts_wait(pid_t pid)
{
    int status;
    pid_t w;
    do
        w = waitpid(pid, &status, 0);
    while (w < 0 && errno == EINTR);
    cr_assert_eq(w, pid, "waitpid: %s", strerror(errno));
    return status;
}

void ts_sleep_us(uint64_t us)
{
    struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* --- Self-describing tokens --------------------------------------------- */

uint32_t ts_pat_id(uint64_t pos, uint32_t gen)
{
    return (uint32_t)ts_mix64(pos * 0x100000001b3ull + ((uint64_t)gen << 1) + 0x5bd1e995u);
}

void ts_pat_kv(const ctxs_geometry *g, uint64_t pos, uint32_t id, uint16_t *k, uint16_t *v)
{
    ts_fill_kv(g, ((uint64_t)id << 32) ^ (pos & 0xffffffffu), k, v);
}

static size_t pat_per(const ctxs_geometry *g)
{
    return (size_t)g->n_layers * g->n_kv_heads * g->head_dim;
}

int ts_pat_append(ctxs_session *s, uint32_t n, uint32_t gen, uint64_t *first_pos)
{
    ctxs_session_info info;
    int rc = ctxs_session_get_info(&info, s);
    if (rc != 0)
        return rc;
    const ctxs_geometry *g = &info.model.geometry;
    if (pat_per(g) > TS_PAT_KV_MAX || n == 0)
        return CTXS_EINVAL;
    uint16_t k[TS_PAT_KV_MAX], v[TS_PAT_KV_MAX];
    uint32_t *ids = malloc((size_t)n * sizeof(*ids));
    if (!ids)
        return CTXS_ENOMEM;
    ctxs_reservation r;
    if ((rc = ctxs_session_reserve(&r, s, n)) == 0) {
        if (first_pos)
            *first_pos = r.first_pos;
        for (uint32_t i = 0; i < n && rc == 0; i++) {
            ids[i] = ts_pat_id(r.first_pos + i, gen);
            ts_pat_kv(g, r.first_pos + i, ids[i], k, v);
            rc = ctxs_session_write_token(s, &r, i, k, v, CTXS_DTYPE_F16);
        }
        if (rc == 0)
            rc = ctxs_session_commit(s, ids, n);
    }
    free(ids);
    return rc;
}

uint64_t ts_pat_check(const ctxs_session *s, uint64_t *bad_pos)
{
    ctxs_session_info info;
    ctxs_layout lay;
    if (ctxs_session_get_info(&info, s) != 0 || ctxs_session_get_layout(&lay, s) != 0) {
        if (bad_pos)
            *bad_pos = 0;
        return 1;
    }
    const ctxs_geometry *g = &info.model.geometry;
    size_t per = pat_per(g);
    if (per > TS_PAT_KV_MAX)
        return 1;
    uint16_t k[TS_PAT_KV_MAX], v[TS_PAT_KV_MAX], ek[TS_PAT_KV_MAX], ev[TS_PAT_KV_MAX];
    uint64_t n = info.n_tokens, bad = 0;
    uint64_t first_recent = info.ring_start > info.n_sink ? info.ring_start : info.n_sink;
    for (uint64_t p = 0; p < n; p++) {
        if (p >= info.n_sink && p < first_recent) {
            p = first_recent - 1; /* evicted */
            continue;
        }
        uint32_t slot;
        int rc = ctxs_session_get_slot(&slot, s, p);
        if (rc == 0)
            rc = ctxs_session_read_token(k, v, s, p, CTXS_DTYPE_F16);
        if (rc == 0) {
            ts_pat_kv(g, p, lay.token_ids[slot], ek, ev);
            rc = memcmp(k, ek, per * 2) || memcmp(v, ev, per * 2);
        }
        if (rc != 0 && bad++ == 0 && bad_pos)
            *bad_pos = p;
    }
    return bad;
}

int ts_pat_stable_check(ctxs_session *s, int verify, uint64_t *n_out, uint32_t *last_id,
                        char *why, size_t why_len)
{
    ctxs_session_info a, b;
    ctxs_layout lay;
    int rc = ctxs_session_get_info(&a, s);
    if (rc == 0)
        rc = ctxs_session_get_layout(&lay, s);
    if (rc != 0) {
        snprintf(why, why_len, "info/layout: %s", ctxs_err_name(rc));
        return -1;
    }
    uint64_t bad_pos = 0, vbad = 0;
    uint64_t bad = ts_pat_check(s, &bad_pos);
    int vrc = verify ? ctxs_session_verify(&vbad, s) : 0;
    uint32_t id = 0, slot;
    if (a.n_tokens > 0 && ctxs_session_get_slot(&slot, s, a.n_tokens - 1) == 0)
        id = lay.token_ids[slot];
    if ((rc = ctxs_session_refresh(s)) != 0 || (rc = ctxs_session_get_info(&b, s)) != 0) {
        snprintf(why, why_len, "refresh: %s", ctxs_err_name(rc));
        return -1;
    }
    if (b.seq != a.seq)
        return 0;
    if (bad || vrc) {
        snprintf(why, why_len,
                 "state seq %llu, %llu tokens (ring_start %llu): %llu positions read back "
                 "wrong (first %llu); verify %s at %llu",
                 (unsigned long long)a.seq, (unsigned long long)a.n_tokens,
                 (unsigned long long)a.ring_start, (unsigned long long)bad,
                 (unsigned long long)bad_pos, ctxs_err_name(vrc), (unsigned long long)vbad);
        return -1;
    }
    *n_out = a.n_tokens;
    *last_id = id;
    return 1;
}

size_t ts_pending_intents(ctxs_store *st)
{
    MDB_txn *txn;
    MDB_stat ms;
    cr_assert_eq(mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn), 0);
    cr_assert_eq(mdb_stat(txn, st->pending, &ms), 0);
    mdb_txn_abort(txn);
    return ms.ms_entries;
}

MDB_env *ts_raw_env(const char *dir, unsigned flags)
{
    MDB_env *env;
    cr_assert_eq(mdb_env_create(&env), 0);
    cr_assert_eq(mdb_env_set_maxdbs(env, 16), 0);
    cr_assert_eq(mdb_env_set_mapsize(env, (size_t)1 << 30), 0);
    int rc = mdb_env_open(env, ts_path(dir, "index"), flags, 0600);
    cr_assert_eq(rc, 0, "mdb_env_open: %s", mdb_strerror(rc));
    return env;
}

size_t ts_raw_entries(const char *dir, const char *db)
{
    MDB_env *env = ts_raw_env(dir, MDB_RDONLY);
    MDB_txn *txn;
    MDB_dbi dbi;
    MDB_stat ms;
    cr_assert_eq(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, db, 0, &dbi), 0, "no table %s", db);
    cr_assert_eq(mdb_stat(txn, dbi, &ms), 0);
    mdb_txn_abort(txn);
    mdb_env_close(env);
    return ms.ms_entries;
}

void ts_raw_put(const char *dir, const char *db, const void *key, size_t key_len,
                const void *val, size_t val_len)
{
    MDB_env *env = ts_raw_env(dir, 0);
    MDB_txn *txn;
    MDB_dbi dbi;
    cr_assert_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
    int rc = mdb_dbi_open(txn, db, MDB_CREATE, &dbi);
    cr_assert_eq(rc, 0, "mdb_dbi_open(%s): %s", db, mdb_strerror(rc));
    MDB_val k = {key_len, (void *)key}, v = {val_len, (void *)val};
    rc = val ? mdb_put(txn, dbi, &k, &v, 0) : mdb_del(txn, dbi, &k, NULL);
    cr_assert(rc == 0 || (!val && rc == MDB_NOTFOUND), "raw %s: %s", db, mdb_strerror(rc));
    cr_assert_eq(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
}

void ts_gens_set(ts_gens *gs, uint64_t a, uint64_t b, uint32_t gen)
{
    if (b > gs->cap) {
        size_t cap = gs->cap ? gs->cap : 4096;
        while (cap < b)
            cap *= 2;
        gs->v = realloc(gs->v, cap * sizeof(*gs->v));
        cr_assert_not_null(gs->v);
        memset(gs->v + gs->cap, 0, (cap - gs->cap) * sizeof(*gs->v));
        gs->cap = cap;
    }
    for (uint64_t p = a; p < b; p++)
        gs->v[p] = gen;
    if (gen > gs->hi)
        gs->hi = gen;
}

uint32_t ts_gens_get(const ts_gens *gs, uint64_t p)
{
    return p < gs->cap ? gs->v[p] : 0;
}
