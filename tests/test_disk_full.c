/*
 * A full disk is an error from ctxs_session_reserve() (CTXS_EFULL), never a
 * SIGBUS, and leaves the session open and consistent.
 *
 * The full disk is a small tmpfs mounted in a private user + mount namespace
 * (no root needed where unprivileged user namespaces are allowed; the test
 * is skipped, loudly, where they are not). The session file is sparse and
 * larger than the tmpfs, so create succeeds and reserve runs out. A small
 * btrfs on a loop device (root, btrfs-progs; skipped loudly without them)
 * is the copy-on-write case.
 *
 * The namespace work happens in a forked child, which uses only the public
 * API (no Criterion assertions), writes its log to a pipe and exits 0 (pass),
 * 1 (fail) or 77 (skip). A child killed by a signal fails the test.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <dirent.h>
#include <unistd.h>

#include "support.h"


TestSuite(disk_full, .init = ts_scratch_init, .fini = ts_scratch_fini, .timeout = 180);

/* --- the child's side ------------------------------------------------- */

/* A failure that lets the rest of the scenario run; the child still fails. */
static int soft_failed;
#define SOFT_CHECK(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            ts_say("FAIL at line %d: ", __LINE__);                                                 \
            ts_say(__VA_ARGS__);                                                                   \
            ts_say("\n");                                                                          \
            soft_failed = 1;                                                                       \
        }                                                                                          \
    } while (0)

static const char *const stage_name[] = { "?", "reserve", "write_token", "commit" };

/* Appends steps of n until the disk is full, which must show as CTXS_EFULL
 * from reserve (blocks the library allocated ahead may take a few more
 * steps first). Adds the tokens committed to *committed. */
static void append_until_full(ctxs_session *s, uint32_t n, uint64_t *committed, const char *when)
{
    int stage = 0, rc = 0;
    int i;
    for (i = 0; i < 100000; i++) {
        rc = ts_try_append(s, n, &stage);
        if (rc)
            break;
        *committed += n;
    }
    TS_CHECK(rc != 0, "%s: committed %llu tokens and never ran out of space", when,
          (unsigned long long)*committed);
    TS_CHECK(stage == TS_AT_RESERVE, "%s: the full disk surfaced in %s (%s), want reserve", when,
          stage_name[stage], ctxs_err_name(rc));
    TS_CHECK(rc == CTXS_EFULL, "%s: reserve on a full disk returned %d (%s), want CTXS_EFULL", when,
          rc, ctxs_err_name(rc));
    ts_say("%s: EFULL from reserve after %d more appends of %u (%llu tokens)\n", when, i, n,
        (unsigned long long)*committed);
}

/* ts_check_all without Criterion: wrong positions, or a negative error. */
static int64_t check_all(const ctxs_session *s)
{
    ctxs_session_info info;
    int rc = ctxs_session_get_info(&info, s);
    if (rc)
        return rc;
    const ctxs_geometry *g = &info.model.geometry;
    size_t per = (size_t)g->n_layers * g->n_kv_heads * g->head_dim;
    uint16_t k[2 * 2 * 8], v[2 * 2 * 8], ek[2 * 2 * 8], ev[2 * 2 * 8];
    if (per > 2 * 2 * 8)
        return CTXS_EINVAL;
    ctxs_layout lay;
    if ((rc = ctxs_session_get_layout(&lay, s)) != 0)
        return rc;
    int64_t bad = 0;
    for (uint64_t p = 0; p < info.n_tokens; p++) {
        rc = ctxs_session_read_token(k, v, s, p, CTXS_DTYPE_F16);
        if (rc == CTXS_EEVICTED)
            continue;
        if (rc)
            return rc;
        uint32_t slot;
        if ((rc = ctxs_session_get_slot(&slot, s, p)) != 0)
            return rc;
        ts_fill_kv(g, p, ek, ev);
        if (memcmp(k, ek, per * 2) || memcmp(v, ev, per * 2) || lay.token_ids[slot] != ts_token(p))
            bad++;
    }
    return bad;
}

static ctxs_session *create_in(const char *path, uint32_t capacity, uint32_t ring)
{
    ctxs_model m = ts_model(1);
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = capacity;
    o.ring = ring;
    ctxs_session *s = NULL;
    int rc = ctxs_session_create(&s, path, &m, &o);
    TS_CHECK(rc == 0, "create %s: %s", path, ctxs_strerror(rc));
    return s;
}

static ctxs_session *reopen(const char *path, unsigned flags)
{
    ctxs_model m = ts_model(1);
    ctxs_session *s = NULL;
    int rc = ctxs_session_open(&s, path, &m, flags, NULL);
    TS_CHECK(rc == 0, "reopen %s (%s): %s", path, flags ? "read-only" : "read-write", ctxs_strerror(rc));
    return s;
}

static void expect_state(ctxs_session *s, uint64_t n_tokens, const char *when)
{
    ctxs_session_info info;
    TS_CHECK(ctxs_session_get_info(&info, s) == 0, "info_get");
    TS_CHECK(info.n_tokens == n_tokens, "%s: n_tokens %llu, want %llu", when,
          (unsigned long long)info.n_tokens, (unsigned long long)n_tokens);
    TS_CHECK(info.n_reserved == 0, "%s: %u slots still reserved", when, info.n_reserved);
    TS_CHECK(!(info.flags & CTXS_INFO_FAILED), "%s: session marked failed", when);
    int64_t bad = check_all(s);
    TS_CHECK(bad == 0, "%s: %lld positions read back wrong (or error %lld: %s)", when,
          (long long)(bad > 0 ? bad : 0), (long long)(bad < 0 ? bad : 0),
          bad < 0 ? ctxs_strerror((int)bad) : "");
    uint64_t bad_pos = 0;
    int rc = ctxs_session_verify(&bad_pos, s);
    TS_CHECK(rc == 0, "%s: verify: %s at %llu", when, ctxs_strerror(rc), (unsigned long long)bad_pos);
}

/* Writes a file in dir until the disk is full. Returns bytes written. */
static uint64_t fill_disk(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    TS_CHECK(fd >= 0, "open filler: %s", strerror(errno));
    static uint8_t buf[4096];
    memset(buf, 0x77, sizeof(buf));
    uint64_t total = 0;
    size_t chunk = sizeof(buf);
    for (;;) {
        ssize_t w = write(fd, buf, chunk);
        if (w > 0) {
            total += (uint64_t)w;
            continue;
        }
        TS_CHECK(w < 0 && (errno == ENOSPC || errno == EINTR), "filler write: %s", strerror(errno));
        if (errno == ENOSPC && chunk == 1)
            break;
        if (errno == ENOSPC)
            chunk = 1;
    }
    close(fd);
    return total;
}

/* The main scenario: fill a 2 MiB disk through the session. */
static void body_fill_through_reserve(const char *mnt)
{
    ts_enter_small_disk(mnt, "2m");
    char path[4096], filler[4096], other[4096];
    snprintf(path, sizeof(path), "%s/s.ctxs", mnt);
    snprintf(filler, sizeof(filler), "%s/filler", mnt);
    snprintf(other, sizeof(other), "%s/other.ctxs", mnt);

    /* 64 Ki slots of 128 bytes: 8 MiB of KV on a 2 MiB disk. */
    ctxs_session *s = create_in(path, 65536, 1);
    struct stat st;
    TS_CHECK(stat(path, &st) == 0, "stat");
    TS_CHECK((uint64_t)st.st_size > (4u << 20), "the session (%lld bytes) is not larger than the disk",
          (long long)st.st_size);
    ts_say("session file: %lld bytes logical, %lld allocated\n", (long long)st.st_size,
        (long long)st.st_blocks * 512);

    uint64_t committed = 0;
    int stage = 0, rc = 0;
    const uint32_t step = 64;
    append_until_full(s, step, &committed, "filling the disk");
    TS_CHECK(committed >= 1024, "only %llu tokens fit in 2 MiB", (unsigned long long)committed);

    /* Not full yet if one more token fits: it needs one 4 KiB page in each
     * of the 8 (layer, K|V, head) runs. */
    struct statvfs vfs;
    TS_CHECK(statvfs(mnt, &vfs) == 0, "statvfs");
    uint64_t free_bytes = (uint64_t)vfs.f_bavail * vfs.f_frsize;
    ts_say("%llu bytes free after EFULL\n", (unsigned long long)free_bytes);
    if (free_bytes >= 8 * 4096) {
        rc = ts_try_append(s, 1, &stage);
        SOFT_CHECK(rc == 0,
                   "reserve(1) gave %s although %llu bytes are free and one token needs 8 pages "
                   "of 4 KiB: reserve allocates whole steps ahead and does not fall back to what "
                   "the reservation needs",
                   ctxs_err_name(rc), (unsigned long long)free_bytes);
        if (rc == 0)
            committed++;
    }
    expect_state(s, committed, "after EFULL");

    /* EFULL again, and no leak of reserved slots across failures. */
    for (int i = 0; i < 3; i++) {
        rc = ts_try_append(s, step, &stage);
        TS_CHECK(rc == CTXS_EFULL && stage == TS_AT_RESERVE, "retry %d: %s in %s", i, ctxs_err_name(rc),
              stage_name[stage]);
    }

    /* A smaller reserve: fits in what is left or is EFULL too. */
    for (uint32_t n = 16; n >= 1; n /= 2) {
        rc = ts_try_append(s, n, &stage);
        if (rc == 0) {
            committed += n;
            ts_say("a later reserve of %u fitted\n", n);
        } else {
            TS_CHECK(rc == CTXS_EFULL && stage == TS_AT_RESERVE, "reserve(%u) after EFULL: %s in %s", n,
                  ctxs_err_name(rc), stage_name[stage]);
        }
    }
    expect_state(s, committed, "after smaller reserves");

    /* Roll back 4 steps: those slots keep their blocks, so reserving them
     * again needs no new space. */
    uint64_t back = committed - 4 * step;
    rc = ctxs_session_rollback(s, back);
    TS_CHECK(rc == 0, "rollback to %llu on a full disk: %s", (unsigned long long)back, ctxs_strerror(rc));
    committed = back;
    expect_state(s, committed, "after rollback");
    for (int i = 0; i < 3; i++) {
        rc = ts_try_append(s, step, &stage);
        TS_CHECK(rc == 0, "re-reserving rolled-back slots (%d of 3) on a full disk: %s in %s", i + 1,
              ctxs_err_name(rc), stage_name[stage]);
        committed += step;
    }
    expect_state(s, committed, "after re-reserving");
    rc = ctxs_session_sync(s);
    TS_CHECK(rc == 0, "sync on a full disk: %s", ctxs_strerror(rc));

    /* Take the last bytes, then close and reopen on the full disk. */
    uint64_t filled = fill_disk(filler);
    ts_say("filler took the last %llu bytes\n", (unsigned long long)filled);
    append_until_full(s, step, &committed, "after the filler");
    ctxs_session_close(s);
    s = reopen(path, 0);
    expect_state(s, committed, "reopened read-write on a full disk");
    append_until_full(s, step, &committed, "after reopen");
    ctxs_session_close(s);
    s = reopen(path, CTXS_RDONLY);
    expect_state(s, committed, "reopened read-only");
    ctxs_session_close(s);

    /* A new session on the full disk: EFULL, nothing left behind. */
    ctxs_model m = ts_model(1);
    s = (ctxs_session *)(uintptr_t)0x1;
    rc = ctxs_session_create(&s, other, &m, NULL);
    TS_CHECK(rc == CTXS_EFULL, "create on a full disk: %d (%s), want CTXS_EFULL", rc, ctxs_err_name(rc));
    TS_CHECK(s == NULL, "create failed but *out is set");
    TS_CHECK(ts_dir_entries(mnt) == 2, "a failed create left %d files (want the session and the filler)",
          ts_dir_entries(mnt));
    ts_say("%s: %llu tokens committed, all read back\n", soft_failed ? "done" : "ok",
        (unsigned long long)committed);
    _exit(soft_failed);
}

/* Blocks are allocated by reserve: a commit after the disk filled up (by
 * another file) between reserve and commit still succeeds. The reservation
 * crosses 4 KiB pages of the token-id and checksum tables (slot 1024), so a
 * table that was left sparse would show here as a SIGBUS. */
static void body_commit_after_disk_fills(const char *mnt)
{
    ts_enter_small_disk(mnt, "4m");
    char path[4096], filler[4096];
    snprintf(path, sizeof(path), "%s/s.ctxs", mnt);
    snprintf(filler, sizeof(filler), "%s/filler", mnt);
    ctxs_session *s = create_in(path, 131072, 1);

    int stage = 0;
    int rc = ts_try_append(s, 1000, &stage);
    TS_CHECK(rc == 0, "append 1000: %s in %s", ctxs_err_name(rc), stage_name[stage]);

    ctxs_session_info info;
    ctxs_session_get_info(&info, s);
    const ctxs_geometry *g = &info.model.geometry;
    uint16_t k[2 * 2 * 8], v[2 * 2 * 8];
    uint32_t ids[600];
    ctxs_reservation r;
    rc = ctxs_session_reserve(&r, s, 600);
    TS_CHECK(rc == 0, "reserve 600: %s", ctxs_strerror(rc));
    TS_CHECK(r.first_pos == 1000, "first_pos %llu", (unsigned long long)r.first_pos);

    uint64_t filled = fill_disk(filler);
    ts_say("filler took %llu bytes\n", (unsigned long long)filled);
    struct statvfs vfs;
    TS_CHECK(statvfs(mnt, &vfs) == 0, "statvfs");
    TS_CHECK(vfs.f_bavail == 0, "disk not full: %llu blocks free", (unsigned long long)vfs.f_bavail);

    for (uint32_t i = 0; i < 600; i++) {
        ts_fill_kv(g, 1000 + i, k, v);
        ids[i] = ts_token(1000 + i);
        rc = ctxs_session_write_token(s, &r, i, k, v, CTXS_DTYPE_F16);
        TS_CHECK(rc == 0, "write_token %u: %s", i, ctxs_strerror(rc));
    }
    /* Writing straight into the mapping too, as an engine does (the same
     * bytes again: V of layer 1, head 1). */
    void *kv;
    rc = ctxs_session_get_kv(&kv, s, 1, CTXS_V, 1);
    TS_CHECK(rc == 0, "ctxs_session_get_kv: %s", ctxs_strerror(rc));
    for (uint32_t i = 0; i < 600; i++) {
        ts_fill_kv(g, 1000 + i, k, v);
        memcpy((uint8_t *)kv + (size_t)(1000 + i) * 16, v + (1 * 2 + 1) * 8, 16);
    }
    rc = ctxs_session_commit(s, ids, 600);
    TS_CHECK(rc == 0, "commit of reserved slots after the disk filled: %s", ctxs_strerror(rc));
    expect_state(s, 1600, "after commit on a full disk");

    uint64_t committed = 1600;
    append_until_full(s, 600, &committed, "after the commit");
    ctxs_session_close(s);
    s = reopen(path, 0);
    expect_state(s, committed, "reopened");
    ctxs_session_close(s);
    ts_say("ok\n");
    _exit(0);
}

/* --- a full btrfs ------------------------------------------------------ */

/* Runs argv (found in PATH, /sbin and /usr/sbin) with its output to the
 * log; returns its exit status, 127 when it is not there. */
static int run_quiet(char *const argv[])
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(ts_child_log_fd, 1);
        dup2(ts_child_log_fd, 2);
        setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 1);
        execvp(argv[0], argv);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* In the child: a private mount namespace with a new 256 MiB btrfs on mnt
 * (a loop device over a sparse file beside it). Exits 77, saying why,
 * where that cannot be had: not root, no loop devices, no btrfs-progs, no
 * btrfs in the kernel. */
static void enter_small_btrfs(const char *mnt)
{
    if (geteuid() != 0) {
        ts_say("not root: a btrfs on a loop device needs it");
        _exit(77);
    }
    if (access("/dev/loop-control", R_OK | W_OK) != 0) {
        ts_say("/dev/loop-control: %s", strerror(errno));
        _exit(77);
    }
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
        ts_say("a private mount namespace: %s", strerror(errno));
        _exit(77);
    }
    char img[4096];
    snprintf(img, sizeof(img), "%s.img", mnt);
    int fd = open(img, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    TS_CHECK(fd >= 0 && ftruncate(fd, 256 << 20) == 0, "%s: %s", img, strerror(errno));
    close(fd);
    char *mkfs[] = {"mkfs.btrfs", "-q", "-f", "-K", img, NULL};
    int rc = run_quiet(mkfs);
    if (rc == 127) {
        ts_say("mkfs.btrfs is not installed (btrfs-progs)");
        _exit(77);
    }
    TS_CHECK(rc == 0, "mkfs.btrfs exited %d", rc);
    char *mnt_argv[] = {"mount", "-t", "btrfs", "-o", "loop,nodiscard", img, (char *)mnt, NULL};
    rc = run_quiet(mnt_argv);
    if (rc != 0) {
        ts_say("mount -t btrfs -o loop exited %d (no btrfs in this kernel?)", rc);
        _exit(77);
    }
}

/* Writes every dirty page of the filesystem back: pages the library wrote
 * are clean afterwards, so that writing them again faults, which is where
 * a copy-on-write filesystem takes new space. */
static void clean_pages(const char *mnt)
{
    int fd = open(mnt, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    TS_CHECK(fd >= 0 && syncfs(fd) == 0, "syncfs: %s", strerror(errno));
    close(fd);
}

/* Btrfs writes every block to a new place, so a block fallocate() gave is
 * good for one write: a write fault into a page written before takes new
 * space, and on a full disk faults with SIGBUS. The header's promise
 * (CTXS_EFULL from reserve, never a signal) holds there because session
 * files and LMDB's lock file are written in place (NOCOW). Every step
 * below rewrites pages already written back, on a disk with no byte free:
 * the store's reopen (LMDB's reader table), a read-write open as after a
 * reboot (the records and checksums), a ring going round, a rollback and
 * the turns after it; and a session growing past the disk is CTXS_EFULL
 * from reserve. */
static void body_full_btrfs(const char *mnt)
{
    enter_small_btrfs(mnt);
    char dir[4096], filler[4096];
    snprintf(dir, sizeof(dir), "%s/store", mnt);
    snprintf(filler, sizeof(filler), "%s/filler", mnt);
    ctxs_model m = ts_model(1);
    ctxs_store *st;
    int rc = ctxs_store_open(&st, dir, CTXS_STORE_CREATE, NULL);
    TS_CHECK(rc == 0, "store open: %s", ctxs_strerror(rc));
    TS_CHECK(ctxs_model_register(st, &m, NULL) == 0, "model register");
    ctxs_create_options ro = ts_options(4096, 4, 1, CTXS_SYNC_ASYNC);
    /* Without a runway, nothing is allocated ahead of grow's first
     * reserve, which is then the one that meets the full disk. */
    ctxs_create_options flat = ts_options(1u << 20, 4, 0, CTXS_SYNC_ASYNC);
    flat.open.background = 0;
    ctxs_session *ring, *grow;
    TS_CHECK(ctxs_store_session_create(&ring, st, "ring", &m, &ro) == 0, "create ring");
    TS_CHECK(ctxs_store_session_create(&grow, st, "grow", &m, &flat) == 0, "create grow");
    int stage;
    uint64_t n_ring = 0, n_grow = 0;
    for (int i = 0; i < 80; i++, n_ring += 64) /* 5120 > 4096: wrapped */
        TS_CHECK(ts_try_append(ring, 64, &stage) == 0, "ring append %d", i);
    ctxs_session_close(ring);

    uint64_t filled = fill_disk(filler);
    clean_pages(mnt);
    ts_say("the filler took %llu MiB\n", (unsigned long long)(filled >> 20));

    /* A write fault on a btrfs without a free byte is slow (it first tries
     * to free space, then writes in place): a few turns a round. */
    for (int round = 0; round < 2; round++) {
        ctxs_store_close(st);
        rc = ctxs_store_open(&st, dir, 0, NULL);
        TS_CHECK(rc == 0, "round %d: store reopen on a full disk: %s", round, ctxs_strerror(rc));
        rc = ctxs_store_session_open(&ring, st, "ring", &m, CTXS_OPEN_VERIFY, NULL);
        TS_CHECK(rc == 0, "round %d: open as after a reboot: %s", round, ctxs_strerror(rc));
        for (int i = 0; i < 6; i++, n_ring += 64) {
            rc = ts_try_append(ring, 64, &stage);
            TS_CHECK(rc == 0, "round %d: ring turn %d on a full disk: %s in %s", round, i,
                     ctxs_err_name(rc), stage_name[stage]);
            if (i % 3 == 2)
                clean_pages(mnt);
        }
        TS_CHECK(ctxs_session_rollback(ring, n_ring - 100) == 0, "round %d: rollback", round);
        n_ring -= 100;
        clean_pages(mnt);
        for (int i = 0; i < 2; i++, n_ring += 50)
            TS_CHECK(ts_try_append(ring, 50, &stage) == 0, "round %d: a turn after the rollback", round);
        TS_CHECK(ctxs_session_sync(ring) == 0, "round %d: sync", round);
        ctxs_session_close(ring);
        clean_pages(mnt);
    }
    append_until_full(grow, 64, &n_grow, "growing on a full btrfs");
    ctxs_session_close(grow);
    ctxs_session *f = NULL;
    rc = ctxs_store_session_fork(&f, st, "grow", "fork", UINT64_MAX, NULL);
    TS_CHECK(rc == CTXS_EFULL, "a fork on a full btrfs: %s, want CTXS_EFULL", ctxs_err_name(rc));
    ctxs_store_close(st);

    /* What was committed reads back, after the store opens once more. */
    TS_CHECK(ctxs_store_open(&st, dir, 0, NULL) == 0, "last store open");
    TS_CHECK(ctxs_store_session_open(&grow, st, "grow", &m, CTXS_OPEN_VERIFY, NULL) == 0,
             "last open of grow");
    expect_state(grow, n_grow, "grow after the disk filled");
    ctxs_session_close(grow);
    TS_CHECK(ctxs_store_session_open(&ring, st, "ring", &m, CTXS_OPEN_VERIFY, NULL) == 0,
             "last open of ring");
    ctxs_session_info info;
    TS_CHECK(ctxs_session_get_info(&info, ring) == 0 && info.n_tokens == n_ring,
             "ring holds %llu tokens, want %llu", (unsigned long long)info.n_tokens,
             (unsigned long long)n_ring);
    uint64_t bad_pos;
    TS_CHECK(ctxs_session_verify(&bad_pos, ring) == 0, "ring verify: bad at %llu",
             (unsigned long long)bad_pos);
    ctxs_session_close(ring);
    ctxs_store_close(st);
    ts_say("ok: %llu tokens in grow, %llu in ring\n", (unsigned long long)n_grow,
           (unsigned long long)n_ring);
    _exit(0);
}

/* --- the parent's side -------------------------------------------------- */

Test(disk_full, full_disk_is_efull_from_reserve_and_the_session_survives)
{
    ts_run_child(body_fill_through_reserve, "full disk");
}

Test(disk_full, commit_after_the_disk_fills_up_uses_the_reserved_blocks)
{
    ts_run_child(body_commit_after_disk_fills, "commit on a full disk");
}

Test(disk_full, a_full_btrfs_is_efull_from_reserve_and_never_a_signal)
{
    ts_run_child(body_full_btrfs, "full btrfs");
}

/* Capacity reached without a ring: CTXS_EFULL, tokens kept. */
Test(disk_full, capacity_reached_without_ring_is_efull)
{
    const char *p = ts_path(ts_scratch, "noring.ctxs");
    ctxs_model m = ts_model(1);
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = 64;
    o.n_sink = 4;
    o.ring = 0;
    ctxs_session *s = NULL;
    cr_assert_eq(ctxs_session_create(&s, p, &m, &o), 0);
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(info.flags & CTXS_INFO_RING, 0);

    cr_assert_eq(ts_append(s, 60), 0);
    ctxs_reservation r;
    memset(&r, 0, sizeof(r));
    cr_assert_eq(ctxs_session_reserve(&r, s, 5), CTXS_EFULL, "reserve past the capacity");
    cr_assert_eq(ctxs_session_reserve(&r, s, 0), CTXS_EINVAL);
    int rc = ctxs_session_reserve(&r, s, 1000);
    cr_assert(rc == CTXS_EFULL || rc == CTXS_EINVAL, "reserve(1000): %s", ctxs_err_name(rc));
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(info.n_reserved, 0, "a failed reserve reserved %u", info.n_reserved);
    cr_assert_eq(info.n_tokens, 60);

    cr_assert_eq(ts_append(s, 4), 0, "the last 4 slots");
    cr_assert_eq(ctxs_session_reserve(&r, s, 1), CTXS_EFULL, "reserve in a full session");
    cr_assert_eq(ts_append(s, 1), CTXS_EFULL);
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(info.n_tokens, 64);
    cr_assert_eq(info.n_held, 64);
    cr_assert_eq(info.n_reserved, 0);
    cr_assert_eq(info.flags & CTXS_INFO_WRAPPED, 0);
    cr_assert_eq(ts_check_all(s), 0);
    ctxs_session_close(s);

    cr_assert_eq(ctxs_session_open(&s, p, &m, 0, NULL), 0);
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(info.n_tokens, 64);
    cr_assert_eq(ts_check_all(s), 0);
    cr_assert_eq(ctxs_session_reserve(&r, s, 1), CTXS_EFULL, "still full after reopen");

    /* A rollback frees slots again. */
    cr_assert_eq(ctxs_session_rollback(s, 50), 0);
    cr_assert_eq(ctxs_session_reserve(&r, s, 15), CTXS_EFULL);
    cr_assert_eq(ts_append(s, 14), 0);
    cr_assert_eq(ctxs_session_reserve(&r, s, 1), CTXS_EFULL);
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(info.n_tokens, 64);
    cr_assert_eq(ts_check_all(s), 0);
    ctxs_session_close(s);

    /* Two reservations in a row count together against the capacity. */
    cr_assert_eq(ctxs_session_open(&s, p, &m, 0, NULL), 0);
    cr_assert_eq(ctxs_session_rollback(s, 60), 0);
    cr_assert_eq(ctxs_session_reserve(&r, s, 3), 0);
    ctxs_reservation r2;
    cr_assert_eq(ctxs_session_reserve(&r2, s, 2), CTXS_EFULL, "3 + 2 reserved past 64 slots");
    cr_assert_eq(ctxs_session_reserve(&r2, s, 1), 0);
    cr_assert_eq(r2.first_pos, 63);
    ctxs_session_close(s); /* drops both */
    cr_assert_eq(ctxs_session_open(&s, p, &m, CTXS_RDONLY, NULL), 0);
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(info.n_tokens, 60);
    cr_assert_eq(ts_check_all(s), 0);
    ctxs_session_close(s);
}

/* A file size limit (RLIMIT_FSIZE) below the session's size: create fails
 * cleanly (with SIGXFSZ ignored, as the caller must), leaving nothing. In a
 * child: the limit is the process's. */
static void create_beyond_the_file_size_limit(const char *d)
{
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = { 1u << 20, 1u << 20 };
    TS_CHECK(setrlimit(RLIMIT_FSIZE, &rl) == 0, "setrlimit: %s", strerror(errno));
    char path[4096];
    snprintf(path, sizeof(path), "%s/big.ctxs", d);
    ctxs_model m = ts_model(1);
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = 65536; /* 8 MiB of KV */
    ctxs_session *s = (ctxs_session *)(uintptr_t)0x1;
    int rc = ctxs_session_create(&s, path, &m, &o);
    TS_CHECK(rc < 0, "create of an 8 MiB file under a 1 MiB RLIMIT_FSIZE succeeded");
    TS_CHECK(s == NULL, "*out set on failure");
    ts_say("create: %s\n", ctxs_err_name(rc));
    TS_CHECK(rc == -EFBIG || rc == CTXS_EFULL, "create returned %d (%s), want -EFBIG or CTXS_EFULL",
          rc, ctxs_err_name(rc));
    TS_CHECK(ts_dir_entries(d) == 0, "the failed create left %d files", ts_dir_entries(d));
    /* A session that fits still works under the limit. */
    o.capacity = 1024;
    rc = ctxs_session_create(&s, path, &m, &o);
    TS_CHECK(rc == 0, "create of a small session: %s", ctxs_strerror(rc));
    int stage;
    rc = ts_try_append(s, 500, &stage);
    TS_CHECK(rc == 0, "append: %s in %s", ctxs_err_name(rc), stage_name[stage]);
    expect_state(s, 500, "small session under RLIMIT_FSIZE");
    ctxs_session_close(s);
    _exit(0);
}

Test(disk_full, create_beyond_the_file_size_limit_fails_cleanly)
{
    ts_run_child(create_beyond_the_file_size_limit, "a create beyond RLIMIT_FSIZE");
}
