/*
 * Every system call and allocation the store and the index make goes
 * through this one thin layer (and every LMDB write, src/index/mdb_calls.h),
 * so that a test can fail any of them on purpose (SQLite's "syscall" table
 * and its fault simulator are the model).
 *
 * Each wrapper takes the libc or LMDB function's arguments and returns what
 * it returns, with errno set the same way, with one difference: calls that
 * may be interrupted (EINTR) are retried here, so no caller sees EINTR.
 * The wrappers are macros that add the call site (file, line), which the
 * fault hook records.
 *
 * The fault hook exists only in the test build of the library (compiled
 * with CTXS_TEST_HOOKS, src/meson.build), which the tests and fuzzers
 * link; in the library that is installed ctxs__fault() is the constant 0
 * and no call fails on purpose.
 *
 * Releases (close, munmap, free, mdb_txn_abort, mdb_cursor_close) and hints
 * whose failure is ignored (madvise, posix_fadvise) are not wrapped: they
 * have no failure a caller could handle.
 */
#ifndef CTXS_STORE_SYSCALL_H
#define CTXS_STORE_SYSCALL_H

#include <dirent.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#define CTXS__SITE __FILE__, __LINE__
#define CTXS__SITE_PARAMS const char *site_file, int site_line

/* Files and directories. */
/* open and openat take a mode after the flags when creating, as in libc. */
int ctxs__sys_open(CTXS__SITE_PARAMS, const char *path, int flags, ...);
int ctxs__sys_openat(CTXS__SITE_PARAMS, int dirfd, const char *path, int flags, ...);
int ctxs__sys_dup(CTXS__SITE_PARAMS, int fd);
DIR *ctxs__sys_fdopendir(CTXS__SITE_PARAMS, int fd);
struct dirent *ctxs__sys_readdir(CTXS__SITE_PARAMS, DIR *dir);
int ctxs__sys_mkdir(CTXS__SITE_PARAMS, const char *path, mode_t mode);
int ctxs__sys_rename(CTXS__SITE_PARAMS, const char *from, const char *to);
int ctxs__sys_link(CTXS__SITE_PARAMS, const char *from, const char *to);
int ctxs__sys_linkat(CTXS__SITE_PARAMS, int from_dirfd, const char *from, int to_dirfd,
                     const char *to, int flags);
int ctxs__sys_unlink(CTXS__SITE_PARAMS, const char *path);
int ctxs__sys_unlinkat(CTXS__SITE_PARAMS, int dirfd, const char *path, int flags);
int ctxs__sys_fstat(CTXS__SITE_PARAMS, int fd, struct stat *st);
int ctxs__sys_stat(CTXS__SITE_PARAMS, const char *path, struct stat *st);
int ctxs__sys_fstatat(CTXS__SITE_PARAMS, int dirfd, const char *path, struct stat *st, int flags);
int ctxs__sys_fcntl_lock(CTXS__SITE_PARAMS, int fd, int cmd, struct flock *fl);
int ctxs__sys_ficlone(CTXS__SITE_PARAMS, int fd, int src_fd);

#define ctxs__open(...) ctxs__sys_open(CTXS__SITE, __VA_ARGS__)
#define ctxs__openat(...) ctxs__sys_openat(CTXS__SITE, __VA_ARGS__)
#define ctxs__dup(fd) ctxs__sys_dup(CTXS__SITE, fd)
#define ctxs__fdopendir(fd) ctxs__sys_fdopendir(CTXS__SITE, fd)
#define ctxs__readdir(dir) ctxs__sys_readdir(CTXS__SITE, dir)
#define ctxs__mkdir(path, mode) ctxs__sys_mkdir(CTXS__SITE, path, mode)
#define ctxs__rename(from, to) ctxs__sys_rename(CTXS__SITE, from, to)
#define ctxs__link(from, to) ctxs__sys_link(CTXS__SITE, from, to)
#define ctxs__linkat(from_dirfd, from, to_dirfd, to, flags)                                        \
    ctxs__sys_linkat(CTXS__SITE, from_dirfd, from, to_dirfd, to, flags)
#define ctxs__unlink(path) ctxs__sys_unlink(CTXS__SITE, path)
#define ctxs__unlinkat(dirfd, path, flags) ctxs__sys_unlinkat(CTXS__SITE, dirfd, path, flags)
#define ctxs__fstat(fd, st) ctxs__sys_fstat(CTXS__SITE, fd, st)
#define ctxs__stat(path, st) ctxs__sys_stat(CTXS__SITE, path, st)
#define ctxs__fstatat(dirfd, path, st, flags) ctxs__sys_fstatat(CTXS__SITE, dirfd, path, st, flags)
#define ctxs__fcntl_lock(fd, cmd, fl) ctxs__sys_fcntl_lock(CTXS__SITE, fd, cmd, fl)
#define ctxs__ficlone(fd, src_fd) ctxs__sys_ficlone(CTXS__SITE, fd, src_fd)

/* Data and durability. */
ssize_t ctxs__sys_read(CTXS__SITE_PARAMS, int fd, void *buf, size_t len);
ssize_t ctxs__sys_pread(CTXS__SITE_PARAMS, int fd, void *buf, size_t len, off_t off);
ssize_t ctxs__sys_pwrite(CTXS__SITE_PARAMS, int fd, const void *buf, size_t len, off_t off);
int ctxs__sys_ftruncate(CTXS__SITE_PARAMS, int fd, off_t len);
int ctxs__sys_fallocate(CTXS__SITE_PARAMS, int fd, int mode, off_t off, off_t len);
int ctxs__sys_fsync(CTXS__SITE_PARAMS, int fd);
int ctxs__sys_fdatasync(CTXS__SITE_PARAMS, int fd);
int ctxs__sys_sync_file_range(CTXS__SITE_PARAMS, int fd, off_t off, off_t len, unsigned flags);
void *ctxs__sys_mmap(CTXS__SITE_PARAMS, void *addr, size_t len, int prot, int flags, int fd,
                     off_t off);
int ctxs__sys_msync(CTXS__SITE_PARAMS, void *addr, size_t len, int flags);

#define ctxs__read(fd, buf, len) ctxs__sys_read(CTXS__SITE, fd, buf, len)
#define ctxs__pread(fd, buf, len, off) ctxs__sys_pread(CTXS__SITE, fd, buf, len, off)
#define ctxs__pwrite(fd, buf, len, off) ctxs__sys_pwrite(CTXS__SITE, fd, buf, len, off)
#define ctxs__ftruncate(fd, len) ctxs__sys_ftruncate(CTXS__SITE, fd, len)
#define ctxs__fallocate(fd, mode, off, len) ctxs__sys_fallocate(CTXS__SITE, fd, mode, off, len)
#define ctxs__fsync(fd) ctxs__sys_fsync(CTXS__SITE, fd)
#define ctxs__fdatasync(fd) ctxs__sys_fdatasync(CTXS__SITE, fd)
#define ctxs__sync_file_range(fd, off, len, flags)                                                 \
    ctxs__sys_sync_file_range(CTXS__SITE, fd, off, len, flags)
#define ctxs__mmap(addr, len, prot, flags, fd, off)                                                \
    ctxs__sys_mmap(CTXS__SITE, addr, len, prot, flags, fd, off)
#define ctxs__msync(addr, len, flags) ctxs__sys_msync(CTXS__SITE, addr, len, flags)

/* Sockets: the remote tier's large values, which it moves itself rather
 * than through hiredis's buffers (src/remote/bulk.c). */
struct iovec;
ssize_t ctxs__sys_recv(CTXS__SITE_PARAMS, int fd, void *buf, size_t len);
ssize_t ctxs__sys_sendv(CTXS__SITE_PARAMS, int fd, const struct iovec *iov, int n);

#define ctxs__recv(fd, buf, len) ctxs__sys_recv(CTXS__SITE, fd, buf, len)
/* sendmsg with MSG_NOSIGNAL: a closed peer is EPIPE, never SIGPIPE. */
#define ctxs__sendv(fd, iov, n) ctxs__sys_sendv(CTXS__SITE, fd, iov, n)

/* Memory. */
void *ctxs__sys_malloc(CTXS__SITE_PARAMS, size_t size);
void *ctxs__sys_calloc(CTXS__SITE_PARAMS, size_t n, size_t size);
void *ctxs__sys_realloc(CTXS__SITE_PARAMS, void *p, size_t size);
char *ctxs__sys_strdup(CTXS__SITE_PARAMS, const char *s);

#define ctxs__malloc(size) ctxs__sys_malloc(CTXS__SITE, size)
#define ctxs__calloc(n, size) ctxs__sys_calloc(CTXS__SITE, n, size)
#define ctxs__realloc(p, size) ctxs__sys_realloc(CTXS__SITE, p, size)
#define ctxs__strdup(s) ctxs__sys_strdup(CTXS__SITE, s)

/* Room for one more item in a growing array: when n has reached *cap,
 * *items (of size bytes each) is reallocated to twice *cap (first when
 * *cap is 0). 0, or CTXS_ENOMEM with *items as it was. */
int ctxs__sys_array_room(CTXS__SITE_PARAMS, void **items, size_t *cap, size_t n, size_t size,
                         size_t first);
#define ctxs__array_room(items, cap, n, size, first)                                    \
    ctxs__sys_array_room(CTXS__SITE, items, cap, n, size, first)

/* What a call can fail with, for ctxs__fault(). */
enum {
    CTXS__CAN_EIO = 1u << 0,
    CTXS__CAN_ENOSPC = 1u << 1,
    CTXS__CAN_EINTR = 1u << 2,
    CTXS__CAN_ENOMEM = 1u << 3,
    CTXS__CAN_SHORT = 1u << 4, /* a write that may move fewer bytes than asked */
};

/* Not an errno: what ctxs__fault_arm() takes to make the nth write short
 * (half its bytes written, the rest left to the caller's next call);
 * persistent, every eligible call after it then fails with EIO, as writes
 * do once a disk has given out partway. */
#define CTXS__FAULT_SHORT 0x7fff

#ifdef CTXS_TEST_HOOKS
/* For a wrapper: the error the call at this site must fail with, or 0 to
 * make it. can_fail: the CTXS__CAN_ errors it can fail with. One relaxed
 * load when the hook is disarmed. */
int ctxs__fault(CTXS__SITE_PARAMS, const char *call, unsigned can_fail);

/*
 * The fault hook, for tests. Armed with an error (EIO, ENOSPC, EINTR,
 * ENOMEM, or CTXS__FAULT_SHORT for writes), it counts the calls that can
 * fail with that error and fails the
 * nth of them (1-based); persistent, also every one after it (not EINTR: a
 * signal interrupts one call). What each call fails with is what the
 * system would say: an allocation returns NULL (ENOMEM), an LMDB call
 * returns the error code, a lock ENOLCK for ENOMEM. Counting is
 * process-wide and thread-safe; a test that wants the same count every run
 * keeps other threads (ASYNC writeback) quiet.
 */
void ctxs__fault_arm(uint64_t nth, int error, bool persistent);
void ctxs__fault_disarm(void);
/* Calls counted since arming (eligible for the armed error). */
uint64_t ctxs__fault_calls(void);
/* Calls failed since arming. */
uint64_t ctxs__fault_failed(void);

/* A call site, and whether the hook reached it and failed it (ever, in
 * this process). */
struct ctxs__fault_site {
    const char *file;
    int line;
    const char *call;
    uint64_t reached;
    uint64_t failed;
};
/* The site of the last call the hook failed, or NULL. */
const struct ctxs__fault_site *ctxs__fault_last_failed(void);
/* The sites reached while the hook was armed, in the order first reached;
 * returns their number (at most CTXS__FAULT_MAX_SITES). */
#define CTXS__FAULT_MAX_SITES 1024
size_t ctxs__fault_sites(const struct ctxs__fault_site **sites);
#else
/* The release library: every call is made. */
#define ctxs__fault(site_file, site_line, call, can_fail)                                          \
    ((void)(site_file), (void)(site_line), (void)(call), (void)(can_fail), 0)
#endif

#endif
