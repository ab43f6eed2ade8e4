/*
 * The power-cut rig: a disk whose writes since its last flush a power cut
 * drops, wholly or in part, with ext4, XFS and btrfs on it; a workload that
 * uses the store through the public API and logs what it was told; and a
 * checker that mounts what the cut left, opens the store as a new boot
 * would, and holds every durability claim of the README against the log.
 *
 *   disk.c      the disk: a FUSE server of one file, which a loop device
 *               with direct I/O turns into a block device; it keeps the
 *               writes since the last flush aside and, at a cut, keeps
 *               none, all, a prefix or a random subset of them
 *   rig.c       loop devices, filesystem images, mounts, children, the
 *               reasons to skip
 *   workload.c  creates, commits, syncs, reopens, rollbacks, forks,
 *               renames, deletes, imports, metadata; each acknowledgement
 *               logged outside the disk
 *   check.c     the claims, checked token by token
 *   main.c      `powercut calibrate`, `powercut run FS`, `powercut
 *               scenario NAME FS`
 */
#ifndef CTXS_POWERCUT_H
#define CTXS_POWERCUT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ctxstore.h"

/* --- The disk (disk.c) ------------------------------------------------------ */

/* What a cut keeps of the writes that no flush has covered. */
enum pc_keep {
    PC_KEEP_NONE = 0,   /* the drive's cache is lost */
    PC_KEEP_ALL = 1,    /* all reached the medium */
    PC_KEEP_PREFIX = 2, /* the first k pieces, in the order they came */
    PC_KEEP_RANDOM = 3, /* any subset: reordered, torn */
    PC_KEEP_KINDS
};
extern const char *const pc_keep_name[PC_KEEP_KINDS];

typedef struct pc_cut {
    uint32_t keep;  /* enum pc_keep */
    uint32_t piece; /* the unit a write is torn into: 4096 or 512 bytes */
    uint64_t seed;  /* of the prefix's length, or of the subset */
} pc_cut;

/* Why the disk was cut. */
enum pc_reason { PC_CUT_ASKED = 1, PC_CUT_AT_WRITE, PC_CUT_AT_FLUSH };

typedef struct pc_disk_stats {
    uint64_t writes, flushes;  /* since the server started */
    uint64_t pending_writes;   /* writes no flush had covered at the cut */
    uint64_t pending_bytes;
    uint64_t pieces, kept;     /* the pieces of those writes, and those kept */
    uint32_t reason;           /* enum pc_reason; 0 until cut */
    uint32_t reserved_;
} pc_disk_stats;

typedef struct pc_disk {
    pid_t pid;            /* the server */
    int ctl;              /* its control socket */
    char dir[4096];       /* where its filesystem is mounted */
    char file[4200];      /* dir/disk: the one file it serves */
} pc_disk;

/* Serves image (its content is what the disk holds, durably) as the file
 * dir/disk, from a child process, in this mount namespace. Returns once
 * the file can be opened: 0, or -1 (a message on stderr). */
int pc_disk_start(pc_disk *d, const char *image, const char *dir);

/* Cuts the power after `writes` more writes, or `flushes` more flushes,
 * whichever comes first (0: not on that count), keeping what c says. */
int pc_disk_arm(pc_disk *d, uint64_t writes, uint64_t flushes, const pc_cut *c);

/* Waits up to timeout_ms for an armed cut; 1 and *st when it came, 0 when
 * not (yet), -1 on error. */
int pc_disk_wait_cut(pc_disk *d, int timeout_ms, pc_disk_stats *st);

/* Cuts the power now, keeping what c says, unless an armed cut came first;
 * *st describes the cut that happened. From the cut on, every read, write
 * and flush fails with EIO, and image holds what the disk kept. */
int pc_disk_cut(pc_disk *d, const pc_cut *c, pc_disk_stats *st);

/* Writes counted so far (the server's), without a cut. */
int pc_disk_stats_now(pc_disk *d, pc_disk_stats *st);

/* Unmounts the server's filesystem and reaps it. The loop device over the
 * file must be gone first. */
void pc_disk_stop(pc_disk *d);

/* --- The rig (rig.c) -------------------------------------------------------- */

/* Why this machine cannot run the rig, or NULL when it can, for fs (NULL:
 * the disk alone). */
const char *pc_cannot_run(const char *fs);

/* A private mount namespace for this process, so that every mount it makes
 * goes with it. 0 or -1. */
int pc_private_mounts(void);

/* A new filesystem of type fs ("ext4", "xfs", "btrfs") in a new sparse file
 * at image, of its size. 0 or -1. */
int pc_mkfs(const char *fs, const char *image);

/* Copies the sparse file from into a new file to, data only. 0 or -1. */
int pc_copy_sparse(const char *from, const char *to);

/* A loop device over file (direct I/O when direct), cleared when the last
 * user closes it; its path into dev[32]. Returns an open descriptor of it,
 * or -1. */
int pc_loop_attach(const char *file, int direct, char dev[32]);

/* mount(2) of dev as fs on dir, with the options the rig uses for fs (no
 * discard, so that every change is a write). 0 or -1 with errno. */
int pc_mount(const char *dev, const char *fs, const char *dir);

/* Unmounts dir, lazily when it will not go at once (a filesystem whose
 * disk was cut). 0 or -1. */
int pc_umount(const char *dir);

/* Runs argv quietly (its output to /dev/null unless it fails, then to
 * stderr); its exit status, 127 when it is not installed. */
int pc_run(char *const argv[]);

/* Milliseconds on CLOCK_MONOTONIC. */
uint64_t pc_now_ms(void);

/* --- The model the workload and checker use ------------------------------- */

#define PC_LAYERS 2u
#define PC_HEADS 2u
#define PC_DIM 32u
#define PC_ELEMS (PC_LAYERS * PC_HEADS * PC_DIM) /* K (or V) of one token */
#define PC_CAPACITY 640u
#define PC_CHUNK CTXS_PREFIX_CHUNK

ctxs_model pc_model(uint32_t dtype);

/* The K and V of position pos in generation gen, as the engine hands them
 * over (float32), and its token id. */
void pc_token_kv(float *k, float *v, uint64_t gen, uint64_t pos);
uint32_t pc_token_id(uint64_t gen, uint64_t pos);

/* --- The log of what the workload was told (workload.c) -------------------- */

enum pc_op {
    PC_OP_STORE = 1, /* the store made, the model registered */
    PC_OP_CREATE,    /* sess */
    PC_OP_COMMIT,    /* sess: a = first position, b = count, gen */
    PC_OP_SYNC,      /* sess */
    PC_OP_ROLLBACK,  /* sess: a = the new count */
    PC_OP_REOPEN,    /* sess: closed and opened read-write again */
    PC_OP_FORK,      /* sess (new) from other at a tokens */
    PC_OP_RENAME,    /* sess: to name number a */
    PC_OP_DELETE,    /* sess */
    PC_OP_IMPORT,    /* sess (new) from an export of other, a tokens */
    PC_OP_META,      /* sess: key "k<a>" set to value "v<b>" */
    PC_OP_KINDS
};
extern const char *const pc_op_name[PC_OP_KINDS];

enum pc_phase { PC_BEGIN = 1, PC_ACK, PC_FAIL };

/* One line of the log: written with one write() to a file outside the
 * disk, before the call (BEGIN) and after it returned (ACK or FAIL). */
typedef struct pc_rec {
    uint32_t op;     /* enum pc_op */
    uint32_t phase;  /* enum pc_phase */
    int32_t rc;      /* FAIL: what the call returned */
    uint32_t sess;   /* the session's key: its name is s<key>-<name number> */
    uint32_t other;  /* FORK, IMPORT: the source's key */
    uint32_t reserved_;
    uint64_t a, b, gen;
    uint64_t id;     /* ACK of CREATE, FORK, IMPORT: the session's id */
} pc_rec;

typedef struct pc_workload {
    const char *store;  /* the store's directory, on the disk */
    const char *log;    /* the log, off the disk */
    uint32_t level;     /* ctxs_durability of every session */
    uint32_t dtype;     /* of the model */
    uint64_t seed;
    uint32_t max_ops;   /* then it returns */
    const char *script; /* instead of random operations: these, in order,
                           on one session ("create,commit,sync,delete"),
                           or NULL */
} pc_workload;

/* Runs the workload in this process; returns 0 after max_ops operations,
 * or 1 when a call failed (logged as FAIL; with the disk cut, every call
 * fails). */
int pc_workload_run(const pc_workload *w);

/* The session's name for key and name number. */
void pc_name(char out[32], uint32_t key, uint64_t name_no);

/* --- The checker (check.c) -------------------------------------------------- */

typedef struct pc_check {
    const char *store;  /* the store's directory on the mounted crash image */
    const char *log;
    const char *bin;    /* the ctxstore tool, or NULL: not run */
    uint32_t level, dtype;
} pc_check;

/* Checks the store against the log, as a new boot (CTXS_TEST_BOOT must be
 * set before the library first runs in this process). Prints each
 * violation to stdout, one line each. Returns the number of violations,
 * or -1 when the log cannot be read. */
int pc_check_run(const pc_check *c);

#endif
