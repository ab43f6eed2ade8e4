#include "bench_util.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef __linux__
#include <sys/vfs.h>
#endif

#include "ctxstore.h"

char g_dir[PATH_MAX];
int g_dir_fd = -1;

static int remove_entry(const char *path, const struct stat *st, int type,
                        struct FTW *ftw)
{
    (void)st, (void)type, (void)ftw;
    remove(path);
    return 0;
}

/* Removes the benchmark's directory: the store (thousands of session files
 * and the index) and the loose files. Only ever the directory this program
 * created. */
void cleanup(void)
{
    if (!g_dir[0])
        return;
    if (g_dir_fd >= 0)
        close(g_dir_fd);
    g_dir_fd = -1;
    nftw(g_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    g_dir[0] = '\0';
}

void die(const char *fmt, ...)
{
    va_list ap;
    fflush(stdout);
    fprintf(stderr, "%s: ", bench_program);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    cleanup();
    exit(1);
}

void check_ctxs(int rc, const char *what)
{
    if (rc < 0)
        die("%s failed: %s (%s)", what, ctxs_strerror(rc), ctxs_err_name(rc));
}

void check_sys(int rc, const char *what)
{
    if (rc < 0)
        die("%s failed: %s", what, strerror(errno));
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die("out of memory (%zu bytes)", n);
    return p;
}

/* fdatasync on tmpfs returns at once, which would flatter every method that
 * syncs (and the index, whose every write transaction syncs twice). */
int is_memory_fs(const char *dir)
{
#ifdef __linux__
    struct statfs sf;
    if (statfs(dir, &sf) < 0)
        die("statfs %s failed: %s", dir, strerror(errno));
    return (unsigned long)sf.f_type == 0x01021994ul    /* TMPFS_MAGIC */
           || (unsigned long)sf.f_type == 0x858458f6ul; /* RAMFS_MAGIC */
#else
    (void)dir;
    return 0;
#endif
}

const char *pick_parent_dir(const char *dir_option)
{
    if (dir_option) {
        if (is_memory_fs(dir_option))
            die("%s is a memory file system (tmpfs); fdatasync would cost "
                "nothing there: pass --dir on a real disk", dir_option);
        return dir_option;
    }
    const char *tmp = getenv("TMPDIR");
    if (tmp && *tmp && !is_memory_fs(tmp))
        return tmp;
    if (is_memory_fs("/var/tmp"))
        die("$TMPDIR and /var/tmp are memory file systems: pass --dir on a "
            "real disk");
    return "/var/tmp";
}

void make_scratch_dir(const char *dir_option, const char *prefix)
{
    const char *parent = pick_parent_dir(dir_option);
    if (snprintf(g_dir, sizeof g_dir, "%s/%s.XXXXXX", parent, prefix)
        >= (int)sizeof g_dir)
        die("--dir path too long");
    if (!mkdtemp(g_dir)) {
        int e = errno;
        g_dir[0] = '\0';
        die("mkdtemp under %s failed: %s", parent, strerror(e));
    }
    g_dir_fd = open(g_dir, O_RDONLY | O_DIRECTORY);
    check_sys(g_dir_fd, "open scratch directory");
}

void scratch_path(char *out, const char *name)
{
    if (snprintf(out, PATH_MAX, "%s/%s", g_dir, name) >= PATH_MAX)
        die("--dir path too long");
}

uint32_t parse_count(const char *value, const char *option, uint32_t lo,
                     uint32_t hi)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(value, &end, 10);
    if (errno || end == value || *end || v < lo || v > hi)
        die("%s wants a number from %u to %u", option, lo, hi);
    return (uint32_t)v;
}

/* Writes back everything dirty so that a timed block starts with a clean
 * page cache and pays only for its own writeback. */
void settle_disk(void)
{
#ifdef __linux__
    check_sys(syncfs(g_dir_fd), "syncfs");
#else
    sync();
#endif
}

void write_all(int fd, const uint8_t *p, size_t n, const char *what)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            die("write %s failed: %s", what, w < 0 ? strerror(errno) : "short");
        p += w;
        n -= (size_t)w;
    }
}

double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One line per measurement, the common fields first, so that ctxstore bench
 * passes the lines through and its readers find the same keys in every
 * program's results. */
void json_result_begin(const char *op, const char *method, uint32_t tokens,
                       double median_us, double min_us, double max_us)
{
    printf("{\"op\":\"%s\",\"method\":\"%s\",\"tokens\":%u,"
           "\"median_us\":%.1f,\"min_us\":%.1f,\"max_us\":%.1f",
           op, method, tokens, median_us, min_us, max_us);
}

uint64_t xorshift64(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *state = x;
}

/* Valid fp16 values in [1, 2), four halves per 64-bit draw; n a multiple
 * of 8. */
void fill_fp16(uint8_t *p, size_t n, uint64_t *seed)
{
    for (size_t i = 0; i + 8 <= n; i += 8) {
        uint64_t w = (xorshift64(seed) & 0x03ff03ff03ff03ffull)
                     | 0x3c003c003c003c00ull;
        memcpy(p + i, &w, 8);
    }
}
