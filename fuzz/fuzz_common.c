/*
 * Scratch directories, file helpers and the sample store (fuzz.h).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz.h"

/* --- Files ---------------------------------------------------------------- */

static char *scratch_dir;

static void scratch_remove(void)
{
    if (scratch_dir)
        fuzz_rmtree(scratch_dir);
}

static int usable_dir(const char *d)
{
    struct stat sb;
    return d && *d && stat(d, &sb) == 0 && S_ISDIR(sb.st_mode) && access(d, W_OK | X_OK) == 0;
}

const char *fuzz_scratch(const char *what)
{
    if (scratch_dir)
        return scratch_dir;
    const char *cands[] = { getenv("CTXS_FUZZ_TMPDIR"), "/dev/shm", getenv("TMPDIR"), "/tmp" };
    for (size_t i = 0; i < sizeof(cands) / sizeof(cands[0]); i++) {
        if (!usable_dir(cands[i]))
            continue;
        size_t n = strlen(cands[i]) + strlen(what) + 64;
        char *d = malloc(n);
        if (!d)
            abort();
        snprintf(d, n, "%s/ctxs-fuzz-%s-%ld-XXXXXX", cands[i], what, (long)getpid());
        if (mkdtemp(d)) {
            scratch_dir = d;
            atexit(scratch_remove);
            return d;
        }
        free(d);
    }
    fprintf(stderr, "fuzz: no scratch directory\n");
    abort();
}

char *fuzz_join(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = malloc(n);
    if (!p)
        abort();
    snprintf(p, n, "%s/%s", a, b);
    return p;
}

int fuzz_write_file(const char *path, const void *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return -errno;
    const uint8_t *p = data;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            int rc = -errno;
            close(fd);
            return rc;
        }
        p += w;
        len -= (size_t)w;
    }
    return close(fd) == 0 ? 0 : -errno;
}

static void rm_at(int at, const char *name)
{
    if (unlinkat(at, name, 0) == 0 || errno == ENOENT)
        return;
    int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            rm_at(dirfd(d), e->d_name);
    closedir(d);
    unlinkat(at, name, AT_REMOVEDIR);
}

void fuzz_rmtree(const char *path)
{
    rm_at(AT_FDCWD, path);
}

void fuzz_empty_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            rm_at(dirfd(d), e->d_name);
    closedir(d);
}

static int copy_file(const char *src, const char *dst, mode_t mode)
{
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return -errno;
    int out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode & 0777);
    if (out < 0) {
        int rc = -errno;
        close(in);
        return rc;
    }
    struct stat sb;
    int rc = fstat(in, &sb) == 0 ? 0 : -errno;
    /* Keep the file as sparse as it was: copy only the data, hole by hole. */
    off_t off = 0;
    uint8_t buf[65536];
    while (rc == 0 && off < sb.st_size) {
        off_t data = lseek(in, off, SEEK_DATA);
        if (data < 0)
            break; /* the rest is a hole */
        off_t hole = lseek(in, data, SEEK_HOLE);
        if (hole < 0)
            hole = sb.st_size;
        for (off_t at = data; rc == 0 && at < hole;) {
            size_t want = (size_t)(hole - at) < sizeof(buf) ? (size_t)(hole - at) : sizeof(buf);
            ssize_t r = pread(in, buf, want, at);
            if (r <= 0) {
                rc = r < 0 ? -errno : -EIO;
                break;
            }
            if (pwrite(out, buf, (size_t)r, at) != r)
                rc = -EIO;
            at += r;
        }
        off = hole;
    }
    if (rc == 0 && ftruncate(out, sb.st_size) != 0)
        rc = -errno;
    close(in);
    if (close(out) != 0 && rc == 0)
        rc = -errno;
    return rc;
}

int fuzz_copy_tree(const char *src, const char *dst, const char *skip)
{
    struct stat sb;
    if (lstat(src, &sb) != 0)
        return -errno;
    if (S_ISREG(sb.st_mode))
        return copy_file(src, dst, sb.st_mode);
    if (!S_ISDIR(sb.st_mode))
        return 0;
    if (mkdir(dst, sb.st_mode & 0777) != 0 && errno != EEXIST)
        return -errno;
    DIR *d = opendir(src);
    if (!d)
        return -errno;
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
            (skip && strcmp(e->d_name, skip) == 0))
            continue;
        char *s = fuzz_join(src, e->d_name), *t = fuzz_join(dst, e->d_name);
        rc = fuzz_copy_tree(s, t, skip);
        free(s);
        free(t);
    }
    closedir(d);
    return rc;
}

int fuzz_fd_count(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

void fuzz_check_fds(const char *what, int before)
{
    int after = fuzz_fd_count();
    if (before >= 0 && after > before) {
        fprintf(stderr, "fuzz %s: the input leaked %d file descriptor(s)\n", what,
                after - before);
        abort();
    }
}

static FILE *saved_out, *saved_err, *devnull;

void fuzz_silence(void)
{
    if (!devnull && !(devnull = fopen("/dev/null", "w")))
        return;
    fflush(stdout);
    fflush(stderr);
    saved_out = stdout;
    saved_err = stderr;
    stdout = devnull;
    stderr = devnull;
}

void fuzz_unsilence(void)
{
    if (!saved_out)
        return;
    fflush(devnull);
    stdout = saved_out;
    stderr = saved_err;
    saved_out = saved_err = NULL;
}

void fuzz_debug(const char *fmt, ...)
{
    static int on = -1;
    if (on < 0)
        on = getenv("CTXS_FUZZ_DEBUG") != NULL;
    if (!on)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* --- The sample store ---------------------------------------------------- */

ctxs_model fuzz_model(unsigned i)
{
    ctxs_model m;
    memset(&m, 0, sizeof(m));
    m.geometry = (ctxs_geometry){ 1, 2, 4, CTXS_DTYPE_F16, 0, {0} };
    for (unsigned b = 0; b < 16; b++) {
        m.model_hash[b] = (uint8_t)(0x40 + i * 16 + b);
        m.tokenizer_hash[b] = (uint8_t)(0x90 + b);
    }
    return m;
}

uint32_t fuzz_token(uint64_t pos)
{
    return (uint32_t)(pos * 2654435761u % 50000u) + 1;
}

ctxs_create_options fuzz_options(uint32_t capacity, uint32_t n_sink, uint32_t ring)
{
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = capacity;
    o.n_sink = n_sink;
    o.ring = ring;
    o.open.window = 32;
    o.open.pressure_window = 16;
    return o;
}

int fuzz_append(ctxs_session *s, uint64_t n)
{
    ctxs_session_info info;
    int rc = ctxs_session_get_info(&info, s);
    if (rc < 0)
        return rc;
    const ctxs_geometry *g = &info.model.geometry;
    size_t elems = (size_t)g->n_layers * g->n_kv_heads * g->head_dim;
    if (elems > 4096)
        return CTXS_EINVAL;
    uint16_t k[4096], v[4096];
    uint32_t ids[50];
    uint64_t pos = info.n_tokens;
    /* A reservation may not overwrite itself in the ring. */
    uint32_t most = info.capacity - info.n_sink < 50 ? info.capacity - info.n_sink : 50;
    while (n) {
        uint32_t step = n < most ? (uint32_t)n : most;
        ctxs_reservation r;
        if ((rc = ctxs_session_reserve(&r, s, step)) < 0)
            return rc;
        for (uint32_t i = 0; i < step; i++) {
            uint64_t p = pos + i;
            for (size_t e = 0; e < elems; e++) {
                /* fp16 values in [1, 2): exponent 15, a mantissa from p, e */
                k[e] = (uint16_t)(0x3c00 | ((p * 7 + e * 13) & 0x3ff));
                v[e] = (uint16_t)(0x3c00 | ((p * 11 + e * 5 + 3) & 0x3ff));
            }
            ids[i] = fuzz_token(p);
            if ((rc = ctxs_session_write_token(s, &r, i, k, v, CTXS_DTYPE_F16)) < 0)
                return rc;
        }
        if ((rc = ctxs_session_commit(s, ids, step)) < 0)
            return rc;
        pos += step;
        n -= step;
    }
    return 0;
}

void fuzz_sample_tokens(uint32_t *out, uint64_t n)
{
    for (uint64_t i = 0; i < n && i < 150; i++)
        out[i] = fuzz_token(i);
}

int fuzz_build_store(const char *dir)
{
    ctxs_store *st;
    int rc = ctxs_store_open(&st, dir, CTXS_STORE_CREATE, NULL);
    if (rc < 0)
        return rc;
    ctxs_model m0 = fuzz_model(0), m1 = fuzz_model(1);
    ctxs_session *s = NULL;
    ctxs_create_options oa = fuzz_options(256, 4, 1), ob = fuzz_options(16, 2, 1),
                         oc = fuzz_options(8, 1, 0);
    if ((rc = ctxs_model_register(st, &m0, "tiny")) < 0 ||
        (rc = ctxs_model_register(st, &m1, NULL)) < 0)
        goto out;
    if ((rc = ctxs_store_session_create(&s, st, "a", &m0, &oa)) < 0 ||
        (rc = fuzz_append(s, 70)) < 0 || (rc = ctxs_checkpoint_create(s, "cp0")) < 0 ||
        (rc = fuzz_append(s, 80)) < 0 || (rc = ctxs_checkpoint_create(s, "cp1")) < 0)
        goto out;
    ctxs_session_close(s);
    s = NULL;
    if ((rc = ctxs_store_session_create(&s, st, "b", &m0, &ob)) < 0 ||
        (rc = fuzz_append(s, 40)) < 0)
        goto out;
    ctxs_session_close(s);
    s = NULL;
    if ((rc = ctxs_store_session_create(&s, st, "c", &m1, &oc)) < 0)
        goto out;
    ctxs_session_close(s);
    s = NULL;
    if ((rc = ctxs_store_session_fork(&s, st, "a", "d", 64, NULL)) < 0 || (rc = fuzz_append(s, 10)) < 0)
        goto out;
out:
    ctxs_session_close(s);
    ctxs_store_close(st);
    return rc;
}

/* --- Session files as inputs ---------------------------------------------- */

int fuzz_session_encode(uint8_t **out, size_t *len, const char *path, uint8_t ctl)
{
    *out = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || sb.st_size < 16384) {
        close(fd);
        return -EINVAL;
    }
    size_t rest = (size_t)sb.st_size - 16384;
    size_t n = 1 + FUZZ_SESS_COMPACT_HEAD + rest;
    uint8_t *buf = calloc(1, n);
    if (!buf) {
        close(fd);
        return -ENOMEM;
    }
    buf[0] = ctl;
    static const struct { size_t at, off, len; } parts[] = {
        { 1, 0, 256 }, { 257, 4096, 128 }, { 385, 8192, 128 }, { 513, 12288, 512 },
    };
    int rc = 0;
    for (size_t i = 0; i < 4 && rc == 0; i++)
        if (pread(fd, buf + parts[i].at, parts[i].len, (off_t)parts[i].off) != (ssize_t)parts[i].len)
            rc = -EIO;
    if (rc == 0 && rest && pread(fd, buf + 1 + FUZZ_SESS_COMPACT_HEAD, rest, 16384) != (ssize_t)rest)
        rc = -EIO;
    close(fd);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    while (n > 1 + FUZZ_SESS_COMPACT_HEAD && buf[n - 1] == 0)
        n--;
    *out = buf;
    *len = n;
    return 0;
}
