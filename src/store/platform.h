/*
 * What the store asks of the operating system beyond one system call, each
 * platform's way (Linux, Apple, other POSIX) behind one function: disk
 * allocation, syncs, writeback hints, exact reads and writes, the clock and
 * the boot identity. They make their calls through the wrappers of
 * syscall.h, so that the fault hook reaches them too.
 */
#ifndef CTXS_STORE_PLATFORM_H
#define CTXS_STORE_PLATFORM_H

#include <stdint.h>
#include <stddef.h>
#include <sys/types.h>

/* The running boot's identity (Linux: /proc/sys/kernel/random/boot_id,
 * or with CTXS_TEST_BOOT set a hash of it and that text); all zero when
 * unknown. Read once per process. Thread-safe. */
void ctxs__boot_id(uint8_t out[16]);

/* 1 when a record written under record_boot was written in this boot, so
 * that the page cache still holds everything written before it (the boot
 * is known and the ids are equal); 0 when a power loss or a reboot may
 * have come between. Thread-safe. */
int ctxs__boot_vouches(const uint8_t record_boot[16]);

/* Wall-clock milliseconds since the Unix epoch: the clock of every
 * *_unix_ms field, in the session files, the index and export files. */
uint64_t ctxs__now_ms(void);

/* Milliseconds of a clock that never steps back (CLOCK_MONOTONIC): for
 * intervals within the process. */
uint64_t ctxs__monotonic_ms(void);

/* Allocates disk blocks for [off, off + len) of fd without changing its
 * size. Returns 0, CTXS_EFULL (no space, quota, file size limit) or -errno. */
int ctxs__allocate(int fd, uint64_t off, uint64_t len);

/* Asks the filesystem to write the blocks of fd, a new and still empty
 * file, in place rather than to new blocks (btrfs: the NOCOW flag), so
 * that blocks allocated once stay good for every later write. Returns 1
 * when the file is so, 0 where the filesystem does so anyway or cannot
 * (ext4, XFS, tmpfs) or the flag was refused. */
int ctxs__file_in_place(int fd);

/* Makes the file's data durable (fdatasync; F_FULLFSYNC on Apple).
 * Returns 0 or -errno. */
int ctxs__sync_data(int fd);

/* Makes [off, off + len) of the file durable without waiting for the rest
 * of its dirty pages (Linux: msync of a temporary mapping of the range,
 * which syncs that range only; elsewhere the whole file).
 * Returns 0 or -errno. */
int ctxs__sync_range(int fd, uint64_t off, uint64_t len);

/* "a/b", malloc'd; NULL when out of memory. */
char *ctxs__path_join(const char *a, const char *b);

/* fsync() of the directory at path: 0 or -errno. */
int ctxs__sync_dir(const char *path);
/* fsync()s the directory that holds path, so that a name just linked or
 * renamed there is durable. Returns 0, CTXS_ENOMEM or -errno. */
int ctxs__sync_parent_dir(const char *path);

/* Waits for the writeback in flight on fd and returns its error, 0 or
 * -errno (Linux; elsewhere 0: msync reports its own). */
int ctxs__writeback_wait(int fd);

/* Starts writeback of the dirty pages of [off, off + len), mapped at map,
 * without waiting (Linux: sync_file_range, since msync(MS_ASYNC) does
 * nothing there; elsewhere msync(MS_ASYNC)). Returns 0 or -errno. */
int ctxs__writeback_start(int fd, uint8_t *map, uint64_t off, uint64_t len);

/* Whether every page of [off, off + len) of fd is in the page cache and
 * dirty: 1, 0, or -1 where the system cannot tell (Linux before 6.5, which
 * has no cachestat(2); other systems; a sandbox that refuses the call).
 * A query, not an action: not a fault-hook site. Thread-safe. */
int ctxs__range_dirty(int fd, uint64_t off, uint64_t len);

/* Pages of [off, off + len) of fd that are dirty, or -1 where the system
 * cannot tell (as above). A query. Thread-safe. */
int64_t ctxs__range_pages_dirty(int fd, uint64_t off, uint64_t len);

/* pread/pwrite of exactly len bytes, retried across EINTR and short
 * transfers. Reading past the end is CTXS_ECORRUPT (the file is shorter
 * than its header says); writing into a full disk is CTXS_EFULL. */
int ctxs__read_exact(int fd, void *buf, size_t len, off_t off);
/* Reads up to len bytes at off, stopping early only at the end of the
 * file: the count read, or -errno. */
ssize_t ctxs__read_upto(int fd, void *buf, size_t len, off_t off);
int ctxs__write_exact(int fd, const void *buf, size_t len, off_t off);
/* len zero bytes at off, through ctxs__write_exact() (its errors). */
int ctxs__write_zeros(int fd, uint64_t off, uint64_t len);

/* The name of errno value e ("ENOENT") from a table of every name this
 * platform defines, or NULL: ctxs_err_name()'s where the C library cannot
 * name an errno (src/error.c). */
const char *ctxs__errno_name(int e);

#endif
