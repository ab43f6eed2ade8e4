#include "syscall.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#ifdef __linux__
#include <linux/fs.h>
#endif

#include "ctxstore.h"

#ifdef CTXS_TEST_HOOKS
static atomic_int armed_error; /* 0: disarmed */
static atomic_bool armed_persistent;
static atomic_uint_fast64_t armed_nth;
static atomic_uint_fast64_t calls_counted;
static atomic_uint_fast64_t calls_failed;

static pthread_mutex_t sites_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ctxs__fault_site sites[CTXS__FAULT_MAX_SITES];
static size_t n_sites;
static const struct ctxs__fault_site *last_failed;

static unsigned error_bit(int error)
{
    switch (error) {
    case EIO:
        return CTXS__CAN_EIO;
    case ENOSPC:
        return CTXS__CAN_ENOSPC;
    case EINTR:
        return CTXS__CAN_EINTR;
    case ENOMEM:
        return CTXS__CAN_ENOMEM;
    case CTXS__FAULT_SHORT:
        return CTXS__CAN_SHORT;
    default:
        return 0;
    }
}

void ctxs__fault_arm(uint64_t nth, int error, bool persistent)
{
    atomic_store(&armed_error, 0);
    atomic_store(&armed_nth, nth);
    atomic_store(&armed_persistent, persistent && error != EINTR);
    atomic_store(&calls_counted, 0);
    atomic_store(&calls_failed, 0);
    pthread_mutex_lock(&sites_lock);
    last_failed = NULL;
    pthread_mutex_unlock(&sites_lock);
    atomic_store(&armed_error, error_bit(error) ? error : 0);
}

void ctxs__fault_disarm(void)
{
    atomic_store(&armed_error, 0);
}

uint64_t ctxs__fault_calls(void)
{
    return atomic_load(&calls_counted);
}

uint64_t ctxs__fault_failed(void)
{
    return atomic_load(&calls_failed);
}

const struct ctxs__fault_site *ctxs__fault_last_failed(void)
{
    pthread_mutex_lock(&sites_lock);
    const struct ctxs__fault_site *site = last_failed;
    pthread_mutex_unlock(&sites_lock);
    return site;
}

size_t ctxs__fault_sites(const struct ctxs__fault_site **out)
{
    pthread_mutex_lock(&sites_lock);
    size_t n = n_sites;
    pthread_mutex_unlock(&sites_lock);
    *out = sites;
    return n;
}

static void note_site(const char *file, int line, const char *call, bool failed)
{
    pthread_mutex_lock(&sites_lock);
    size_t i = 0;
    while (i < n_sites && !(sites[i].line == line && strcmp(sites[i].file, file) == 0))
        i++;
    if (i == n_sites && n_sites < CTXS__FAULT_MAX_SITES)
        sites[n_sites++] = (struct ctxs__fault_site){file, line, call, 0, 0};
    if (i < n_sites) {
        sites[i].reached++;
        sites[i].failed += failed;
        if (failed)
            last_failed = &sites[i];
    }
    pthread_mutex_unlock(&sites_lock);
}

int ctxs__fault(const char *file, int line, const char *call, unsigned can_fail)
{
    int error = atomic_load_explicit(&armed_error, memory_order_relaxed);
    if (!error)
        return 0;
    bool fail = false;
    if (can_fail & error_bit(error)) {
        uint64_t n = atomic_fetch_add(&calls_counted, 1) + 1;
        uint64_t nth = atomic_load(&armed_nth);
        fail = n == nth || (n > nth && atomic_load(&armed_persistent));
        if (fail)
            atomic_fetch_add(&calls_failed, 1);
        if (fail && n > nth && error == CTXS__FAULT_SHORT)
            error = EIO; /* after the short write, the disk is gone */
    }
    note_site(file, line, call, fail);
    return fail ? error : 0;
}
#endif /* CTXS_TEST_HOOKS */

/* The body of a wrapper for a call that returns -1 and sets errno:
 * fails it when the hook says so, retries it across EINTR. */
#define SYSCALL(type, name, can_fail, call)                                                        \
    for (;;) {                                                                                     \
        int injected_ = ctxs__fault(site_file, site_line, name, can_fail);                         \
        type r_;                                                                                   \
        if (injected_) {                                                                           \
            errno = injected_;                                                                     \
            r_ = (type)-1;                                                                         \
        } else {                                                                                   \
            r_ = call;                                                                             \
        }                                                                                          \
        if (r_ == (type)-1 && errno == EINTR && ((can_fail)&CTXS__CAN_EINTR))                      \
            continue;                                                                              \
        return r_;                                                                                 \
    }

static mode_t creation_mode(int flags, va_list args)
{
#ifdef O_TMPFILE
    if ((flags & O_TMPFILE) == O_TMPFILE)
        return (mode_t)va_arg(args, unsigned);
#endif
    return (flags & O_CREAT) ? (mode_t)va_arg(args, unsigned) : 0;
}

int ctxs__sys_open(CTXS__SITE_PARAMS, const char *path, int flags, ...)
{
    va_list args;
    va_start(args, flags);
    mode_t mode = creation_mode(flags, args);
    va_end(args);
    SYSCALL(int, "open", CTXS__CAN_EIO | CTXS__CAN_ENOSPC | CTXS__CAN_EINTR | CTXS__CAN_ENOMEM,
            open(path, flags, mode));
}

int ctxs__sys_openat(CTXS__SITE_PARAMS, int dirfd, const char *path, int flags, ...)
{
    va_list args;
    va_start(args, flags);
    mode_t mode = creation_mode(flags, args);
    va_end(args);
    SYSCALL(int, "openat", CTXS__CAN_EIO | CTXS__CAN_ENOSPC | CTXS__CAN_EINTR | CTXS__CAN_ENOMEM,
            openat(dirfd, path, flags, mode));
}

int ctxs__sys_dup(CTXS__SITE_PARAMS, int fd)
{
    /* EMFILE is the real failure; ENOMEM stands in for "out of a resource". */
    SYSCALL(int, "dup", CTXS__CAN_ENOMEM, fcntl(fd, F_DUPFD_CLOEXEC, 0));
}

DIR *ctxs__sys_fdopendir(CTXS__SITE_PARAMS, int fd)
{
    int injected = ctxs__fault(site_file, site_line, "fdopendir", CTXS__CAN_ENOMEM);
    if (injected) {
        errno = injected;
        return NULL;
    }
    return fdopendir(fd);
}

struct dirent *ctxs__sys_readdir(CTXS__SITE_PARAMS, DIR *dir)
{
    int injected = ctxs__fault(site_file, site_line, "readdir", CTXS__CAN_EIO);
    if (injected) {
        errno = injected;
        return NULL;
    }
    return readdir(dir);
}

int ctxs__sys_mkdir(CTXS__SITE_PARAMS, const char *path, mode_t mode)
{
    SYSCALL(int, "mkdir", CTXS__CAN_EIO | CTXS__CAN_ENOSPC | CTXS__CAN_ENOMEM, mkdir(path, mode));
}

int ctxs__sys_rename(CTXS__SITE_PARAMS, const char *from, const char *to)
{
    SYSCALL(int, "rename", CTXS__CAN_EIO | CTXS__CAN_ENOSPC | CTXS__CAN_ENOMEM, rename(from, to));
}

int ctxs__sys_link(CTXS__SITE_PARAMS, const char *from, const char *to)
{
    SYSCALL(int, "link", CTXS__CAN_EIO | CTXS__CAN_ENOSPC | CTXS__CAN_ENOMEM, link(from, to));
}

int ctxs__sys_linkat(CTXS__SITE_PARAMS, int from_dirfd, const char *from, int to_dirfd,
                     const char *to, int flags)
{
    SYSCALL(int, "linkat", CTXS__CAN_EIO | CTXS__CAN_ENOSPC | CTXS__CAN_ENOMEM,
            linkat(from_dirfd, from, to_dirfd, to, flags));
}

int ctxs__sys_unlink(CTXS__SITE_PARAMS, const char *path)
{
    SYSCALL(int, "unlink", CTXS__CAN_EIO | CTXS__CAN_ENOMEM, unlink(path));
}

int ctxs__sys_unlinkat(CTXS__SITE_PARAMS, int dirfd, const char *path, int flags)
{
    SYSCALL(int, "unlinkat", CTXS__CAN_EIO | CTXS__CAN_ENOMEM, unlinkat(dirfd, path, flags));
}

int ctxs__sys_fstat(CTXS__SITE_PARAMS, int fd, struct stat *st)
{
    SYSCALL(int, "fstat", CTXS__CAN_EIO | CTXS__CAN_ENOMEM, fstat(fd, st));
}

int ctxs__sys_stat(CTXS__SITE_PARAMS, const char *path, struct stat *st)
{
    SYSCALL(int, "stat", CTXS__CAN_EIO | CTXS__CAN_ENOMEM, stat(path, st));
}

int ctxs__sys_fstatat(CTXS__SITE_PARAMS, int dirfd, const char *path, struct stat *st, int flags)
{
    SYSCALL(int, "fstatat", CTXS__CAN_EIO | CTXS__CAN_ENOMEM, fstatat(dirfd, path, st, flags));
}

int ctxs__sys_fcntl_lock(CTXS__SITE_PARAMS, int fd, int cmd, struct flock *fl)
{
    for (;;) {
        int injected =
            ctxs__fault(site_file, site_line, "fcntl_lock", CTXS__CAN_EINTR | CTXS__CAN_ENOMEM);
        if (injected == EINTR)
            continue;
        if (injected) {
            errno = ENOLCK;
            return -1;
        }
        int r = fcntl(fd, cmd, fl);
        if (r == -1 && errno == EINTR)
            continue;
        return r;
    }
}

int ctxs__sys_ficlone(CTXS__SITE_PARAMS, int fd, int src_fd)
{
#ifdef FICLONE
    SYSCALL(int, "ficlone", CTXS__CAN_EIO | CTXS__CAN_ENOSPC | CTXS__CAN_ENOMEM,
            ioctl(fd, FICLONE, src_fd));
#else
    (void)site_file;
    (void)site_line;
    (void)fd;
    (void)src_fd;
    errno = EOPNOTSUPP;
    return -1;
#endif
}

ssize_t ctxs__sys_read(CTXS__SITE_PARAMS, int fd, void *buf, size_t len)
{
    SYSCALL(ssize_t, "read", CTXS__CAN_EIO | CTXS__CAN_EINTR | CTXS__CAN_ENOMEM,
            read(fd, buf, len));
}

ssize_t ctxs__sys_pread(CTXS__SITE_PARAMS, int fd, void *buf, size_t len, off_t off)
{
    SYSCALL(ssize_t, "pread", CTXS__CAN_EIO | CTXS__CAN_EINTR | CTXS__CAN_ENOMEM,
            pread(fd, buf, len, off));
}

ssize_t ctxs__sys_pwrite(CTXS__SITE_PARAMS, int fd, const void *buf, size_t len, off_t off)
{
    /* SYSCALL's body, and a short write when the hook asks for one. */
    for (;;) {
        int injected = ctxs__fault(site_file, site_line, "pwrite",
                                   CTXS__CAN_EIO | CTXS__CAN_ENOSPC | CTXS__CAN_EINTR |
                                       CTXS__CAN_SHORT);
        ssize_t r;
        if (injected == CTXS__FAULT_SHORT) {
            r = pwrite(fd, buf, len > 1 ? len / 2 : len, off);
        } else if (injected) {
            errno = injected;
            r = -1;
        } else {
            r = pwrite(fd, buf, len, off);
        }
        if (r == -1 && errno == EINTR)
            continue;
        return r;
    }
}

int ctxs__sys_ftruncate(CTXS__SITE_PARAMS, int fd, off_t len)
{
    SYSCALL(int, "ftruncate", CTXS__CAN_EIO | CTXS__CAN_ENOSPC | CTXS__CAN_EINTR,
            ftruncate(fd, len));
}

int ctxs__sys_fallocate(CTXS__SITE_PARAMS, int fd, int mode, off_t off, off_t len)
{
#ifdef __linux__
    SYSCALL(int, "fallocate", CTXS__CAN_EIO | CTXS__CAN_ENOSPC | CTXS__CAN_EINTR,
            fallocate(fd, mode, off, len));
#else
    (void)site_file;
    (void)site_line;
    (void)fd;
    (void)mode;
    (void)off;
    (void)len;
    errno = EOPNOTSUPP;
    return -1;
#endif
}

int ctxs__sys_fsync(CTXS__SITE_PARAMS, int fd)
{
    SYSCALL(int, "fsync", CTXS__CAN_EIO | CTXS__CAN_ENOSPC | CTXS__CAN_EINTR, fsync(fd));
}

int ctxs__sys_fdatasync(CTXS__SITE_PARAMS, int fd)
{
    SYSCALL(int, "fdatasync", CTXS__CAN_EIO | CTXS__CAN_ENOSPC | CTXS__CAN_EINTR, fdatasync(fd));
}

int ctxs__sys_sync_file_range(CTXS__SITE_PARAMS, int fd, off_t off, off_t len, unsigned flags)
{
#ifdef __linux__
    SYSCALL(int, "sync_file_range",
            CTXS__CAN_EIO | CTXS__CAN_ENOSPC | CTXS__CAN_EINTR | CTXS__CAN_ENOMEM,
            sync_file_range(fd, off, len, flags));
#else
    (void)site_file;
    (void)site_line;
    (void)fd;
    (void)off;
    (void)len;
    (void)flags;
    errno = ENOSYS;
    return -1;
#endif
}

void *ctxs__sys_mmap(CTXS__SITE_PARAMS, void *addr, size_t len, int prot, int flags, int fd,
                     off_t off)
{
    int injected = ctxs__fault(site_file, site_line, "mmap", CTXS__CAN_ENOMEM);
    if (injected) {
        errno = injected;
        return MAP_FAILED;
    }
    return mmap(addr, len, prot, flags, fd, off);
}

int ctxs__sys_msync(CTXS__SITE_PARAMS, void *addr, size_t len, int flags)
{
    SYSCALL(int, "msync", CTXS__CAN_EIO | CTXS__CAN_ENOSPC | CTXS__CAN_ENOMEM,
            msync(addr, len, flags));
}

ssize_t ctxs__sys_recv(CTXS__SITE_PARAMS, int fd, void *buf, size_t len)
{
    SYSCALL(ssize_t, "recv", CTXS__CAN_EIO | CTXS__CAN_EINTR | CTXS__CAN_ENOMEM,
            recv(fd, buf, len, 0));
}

ssize_t ctxs__sys_sendv(CTXS__SITE_PARAMS, int fd, const struct iovec *iov, int n)
{
    struct msghdr m = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n};
    SYSCALL(ssize_t, "sendmsg", CTXS__CAN_EIO | CTXS__CAN_EINTR | CTXS__CAN_ENOMEM,
            sendmsg(fd, &m, MSG_NOSIGNAL));
}

void *ctxs__sys_malloc(CTXS__SITE_PARAMS, size_t size)
{
    if (ctxs__fault(site_file, site_line, "malloc", CTXS__CAN_ENOMEM)) {
        errno = ENOMEM;
        return NULL;
    }
    return malloc(size);
}

void *ctxs__sys_calloc(CTXS__SITE_PARAMS, size_t n, size_t size)
{
    if (ctxs__fault(site_file, site_line, "calloc", CTXS__CAN_ENOMEM)) {
        errno = ENOMEM;
        return NULL;
    }
    return calloc(n, size);
}

void *ctxs__sys_realloc(CTXS__SITE_PARAMS, void *p, size_t size)
{
    if (ctxs__fault(site_file, site_line, "realloc", CTXS__CAN_ENOMEM)) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc(p, size);
}

int ctxs__sys_array_room(CTXS__SITE_PARAMS, void **items, size_t *cap, size_t n, size_t size,
                         size_t first)
{
    if (n < *cap)
        return 0;
    size_t grown = *cap ? *cap * 2 : first;
    void *bigger = ctxs__sys_realloc(site_file, site_line, *items, grown * size);
    if (!bigger)
        return CTXS_ENOMEM;
    *items = bigger;
    *cap = grown;
    return 0;
}

char *ctxs__sys_strdup(CTXS__SITE_PARAMS, const char *s)
{
    if (ctxs__fault(site_file, site_line, "strdup", CTXS__CAN_ENOMEM)) {
        errno = ENOMEM;
        return NULL;
    }
    return strdup(s);
}
