/* What the benchmarks share with the demo: see bench_shared.h. */
#include "bench_shared.h"

#include <errno.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/vfs.h>
#endif

int memory_fs(const char *dir)
{
#ifdef __linux__
    struct statfs sf;
    if (statfs(dir, &sf) < 0)
        return -errno;
    return (unsigned long)sf.f_type == 0x01021994ul    /* TMPFS_MAGIC */
           || (unsigned long)sf.f_type == 0x858458f6ul; /* RAMFS_MAGIC */
#else
    (void)dir;
    return 0;
#endif
}

ssize_t write_full(int fd, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, p + done, n - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -errno;
        if (w == 0)
            break;
        done += (size_t)w;
    }
    return (ssize_t)done;
}

int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

uint64_t xorshift64(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *state = x;
}
