#include "platform.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/fs.h>    /* FS_IOC_GETFLAGS, FS_NOCOW_FL */
#include <linux/magic.h> /* BTRFS_SUPER_MAGIC */
#include <sys/ioctl.h>
#include <sys/vfs.h>
#endif
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "ctxstore.h"
#include "syscall.h"

static uint8_t boot_id[16];
static pthread_once_t boot_once = PTHREAD_ONCE_INIT;

static int hex_value(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static void read_boot_id(void)
{
#ifdef __linux__
    char text[64] = {0};
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (!f)
        return;
    size_t len = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    uint8_t id[16];
    int nibbles = 0;
    for (size_t i = 0; i < len && nibbles < 32; i++) {
        int v = hex_value(text[i]);
        if (v < 0)
            continue;
        if (nibbles % 2 == 0)
            id[nibbles / 2] = (uint8_t)(v << 4);
        else
            id[nibbles / 2] |= (uint8_t)v;
        nibbles++;
    }
    if (nibbles != 32)
        return;
    /* CTXS_TEST_BOOT makes the process a boot of its own, for tests of
     * power loss (ctxstore.h, "Caveats"): its boot id is a hash of the
     * machine's and the text. It can only add verification: records
     * written under any other id, the machine's included, are verified,
     * and an unknown machine boot id stays unknown. */
    const char *test_boot = getenv("CTXS_TEST_BOOT");
    if (test_boot && *test_boot) {
        XXH3_state_t state;
        XXH3_INITSTATE(&state);
        XXH3_128bits_reset(&state);
        XXH3_128bits_update(&state, id, 16);
        XXH3_128bits_update(&state, test_boot, strlen(test_boot));
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&state));
        memcpy(id, c.digest, 16);
    }
    memcpy(boot_id, id, 16);
#endif
}

void ctxs__boot_id(uint8_t out[16])
{
    pthread_once(&boot_once, read_boot_id);
    memcpy(out, boot_id, 16);
}

int ctxs__boot_vouches(const uint8_t record_boot[16])
{
    static const uint8_t unknown[16];
    uint8_t this_boot[16];
    ctxs__boot_id(this_boot);
    return memcmp(this_boot, unknown, 16) != 0 && memcmp(record_boot, this_boot, 16) == 0;
}

uint64_t ctxs__now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t ctxs__monotonic_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int space_error(int e)
{
    return (e == ENOSPC || e == EDQUOT || e == EFBIG) ? CTXS_EFULL : -e;
}

/* Where the filesystem cannot allocate without writing, write zeros: the
 * range is reserved and not yet written by the engine, so nothing is lost. */
static int allocate_by_writing(int fd, uint64_t off, uint64_t len)
{
    int rc = ctxs__write_zeros(fd, off, len);
    return rc == -EFBIG ? CTXS_EFULL : rc;
}

int ctxs__allocate(int fd, uint64_t off, uint64_t len)
{
#ifdef __linux__
    if (ctxs__fallocate(fd, FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len) == 0)
        return 0;
    if (errno == EOPNOTSUPP || errno == ENOSYS)
        return allocate_by_writing(fd, off, len);
    return space_error(errno);
#else
    return allocate_by_writing(fd, off, len);
#endif
}

int ctxs__file_in_place(int fd)
{
#if defined(__linux__) && defined(FS_NOCOW_FL) && defined(BTRFS_SUPER_MAGIC)
    /* Btrfs writes every block to a new place (copy on write), so a block
     * fallocate() allocated is only good for its first write: every later
     * write through a mapping takes new space at the write fault, where a
     * full disk is a SIGBUS. A NOCOW file's blocks are written in place
     * (while no other file shares them), which makes reserve's allocation
     * a promise; btrfs takes the flag only while the file is empty. The
     * file loses btrfs's data checksums, not ctxstore's own. Failures are
     * ignored: the file is then as any other. */
    struct statfs sfs;
    if (fstatfs(fd, &sfs) != 0 || (unsigned long)sfs.f_type != (unsigned long)BTRFS_SUPER_MAGIC)
        return 0;
    int flags = 0;
    if (ioctl(fd, FS_IOC_GETFLAGS, &flags) != 0)
        return 0;
    if (!(flags & FS_NOCOW_FL)) {
        flags |= FS_NOCOW_FL;
        if (ioctl(fd, FS_IOC_SETFLAGS, &flags) != 0 || ioctl(fd, FS_IOC_GETFLAGS, &flags) != 0)
            return 0;
    }
    return (flags & FS_NOCOW_FL) != 0;
#else
    (void)fd;
    return 0;
#endif
}

int ctxs__sync_data(int fd)
{
#if defined(__APPLE__) && defined(F_FULLFSYNC)
    /* fsync on Apple leaves data in the drive's cache. */
    if (fcntl(fd, F_FULLFSYNC) == 0)
        return 0;
#endif
#if defined(_POSIX_SYNCHRONIZED_IO) && _POSIX_SYNCHRONIZED_IO > 0 && !defined(__APPLE__)
    int rc = ctxs__fdatasync(fd);
#else
    int rc = ctxs__fsync(fd);
#endif
    return rc == 0 ? 0 : -errno;
}

int ctxs__sync_range(int fd, uint64_t off, uint64_t len)
{
#if defined(__linux__)
    /* fdatasync would wait for every dirty page of the file: a label
     * written beside a 288 MiB copy still in flight would wait for all of
     * it. msync(MS_SYNC) of a shared mapping syncs just its range (and the
     * metadata the range needs). */
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t start = off / page * page;
    size_t span = (size_t)(off + len - start);
    void *map = ctxs__mmap(NULL, span, PROT_READ, MAP_SHARED, fd, (off_t)start);
    if (map != MAP_FAILED) {
        int rc = ctxs__msync(map, span, MS_SYNC) == 0 ? 0 : -errno;
        munmap(map, span);
        return rc;
    }
#else
    (void)off;
    (void)len;
#endif
    return ctxs__sync_data(fd);
}

int ctxs__writeback_wait(int fd)
{
#ifdef __linux__
    /* Waiting for the writeback started last time is what reports its I/O
     * errors; the worker does the waiting, not the commit. */
    if (ctxs__sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WAIT_BEFORE) == 0)
        return 0;
    return errno == ENOSYS ? 0 : -errno;
#else
    (void)fd;
    return 0;
#endif
}

int ctxs__writeback_start(int fd, uint8_t *map, uint64_t off, uint64_t len)
{
#ifdef __linux__
    (void)map;
    if (ctxs__sync_file_range(fd, (off_t)off, (off_t)len, SYNC_FILE_RANGE_WRITE) == 0)
        return 0;
    return errno == ENOSYS ? 0 : -errno;
#else
    (void)fd;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)(map + off) & ~(page - 1);
    return ctxs__msync((void *)a, (size_t)((uintptr_t)(map + off + len) - a), MS_ASYNC) == 0
               ? 0
               : -errno;
#endif
}

#ifdef __linux__
#include <stdatomic.h>
#include <sys/syscall.h>
/* cachestat(2) is 451 on every architecture that numbers its calls from
 * the common table; the C library may not know it yet. */
#if !defined(SYS_cachestat) && (defined(__x86_64__) || defined(__i386__) ||                       \
                                defined(__aarch64__) || defined(__arm__) ||                       \
                                defined(__riscv) || defined(__loongarch__) ||                     \
                                defined(__powerpc__) || defined(__s390__))
#define SYS_cachestat 451
#endif
#endif

int64_t ctxs__range_pages_dirty(int fd, uint64_t off, uint64_t len)
{
#if defined(__linux__) && defined(SYS_cachestat)
    static atomic_int refused; /* ENOSYS once is ENOSYS for good */
    if (len == 0 || atomic_load_explicit(&refused, memory_order_relaxed))
        return -1;
    struct {
        uint64_t off, len;
    } range = {off, len};
    struct {
        uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
    } cs;
    if (syscall(SYS_cachestat, fd, &range, &cs, 0) != 0) {
        if (errno == ENOSYS || errno == EPERM)
            atomic_store_explicit(&refused, 1, memory_order_relaxed);
        return -1;
    }
    return (int64_t)cs.nr_dirty;
#else
    (void)fd, (void)off, (void)len;
    return -1;
#endif
}

int ctxs__range_dirty(int fd, uint64_t off, uint64_t len)
{
    const int64_t dirty = ctxs__range_pages_dirty(fd, off, len);
    if (dirty < 0)
        return -1;
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t pages = (off + len + page - 1) / page - off / page;
    return (uint64_t)dirty >= pages;
}

ssize_t ctxs__read_upto(int fd, void *buf, size_t len, off_t off)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = ctxs__pread(fd, (char *)buf + done, len - done, off + (off_t)done);
        if (n < 0)
            return -errno;
        if (n == 0)
            break;
        done += (size_t)n;
    }
    return (ssize_t)done;
}

int ctxs__read_exact(int fd, void *buf, size_t len, off_t off)
{
    ssize_t n = ctxs__read_upto(fd, buf, len, off);
    return n < 0 ? (int)n : (size_t)n < len ? CTXS_ECORRUPT : 0;
}

int ctxs__write_exact(int fd, const void *buf, size_t len, off_t off)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t w = ctxs__pwrite(fd, p, len, off);
        if (w < 0)
            return (errno == ENOSPC || errno == EDQUOT) ? CTXS_EFULL : -errno;
        p += w;
        len -= (size_t)w;
        off += w;
    }
    return 0;
}

int ctxs__write_zeros(int fd, uint64_t off, uint64_t len)
{
    static const uint8_t zeros[16384];
    while (len) {
        size_t n = len < sizeof(zeros) ? (size_t)len : sizeof(zeros);
        int rc = ctxs__write_exact(fd, zeros, n, (off_t)off);
        if (rc < 0)
            return rc;
        off += n;
        len -= n;
    }
    return 0;
}

char *ctxs__path_join(const char *a, const char *b)
{
    size_t len = strlen(a) + 1 + strlen(b) + 1;
    char *p = ctxs__malloc(len);
    if (p)
        snprintf(p, len, "%s/%s", a, b);
    return p;
}

int ctxs__sync_dir(const char *path)
{
    int fd = ctxs__open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = ctxs__fsync(fd) == 0 ? 0 : -errno;
    close(fd);
    return rc;
}

int ctxs__sync_parent_dir(const char *path)
{
    char *copy = ctxs__strdup(path);
    if (!copy)
        return CTXS_ENOMEM;
    int rc = ctxs__sync_dir(dirname(copy));
    free(copy);
    return rc;
}
