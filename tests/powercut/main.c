/*
 * powercut: power cuts under the store, on a disk that drops what no flush
 * covered (disk.c), with ext4, XFS and btrfs on it.
 *
 *   powercut calibrate          the disk drops what it should, and only that
 *   powercut run FS [CUTS]      CUTS power cuts (default $CTXS_POWERCUT_CUTS,
 *                               else 72) under the workload on FS, at each
 *                               durability level and dtype in turn; one in
 *                               four cut again while the next boot recovers
 *   powercut scenario NAME FS   one cut at a chosen moment (see scenarios)
 *   powercut scenarios          every scenario on ext4, XFS and btrfs
 *   powercut check FS IMAGE LOG LEVEL DTYPE
 *                               checks a crash image a failed run kept
 *
 * Exit 0: every claim held; 1: a violation (each printed, the crash image
 * kept); 77: this machine cannot run it (why, on stderr). Seeds come from
 * $CTXS_POWERCUT_SEED when set, else from the clock; the seed is printed.
 * Scratch files go to $TMPDIR (else /tmp).
 */
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "powercut.h"
#include "rng.h"

static char scratch[PATH_MAX];

/* scratch/name, in a static buffer that rotates over 8: a path kept
 * longer is copied. */
static const char *at(const char *name)
{
    static char bufs[8][PATH_MAX + 64];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof(bufs[0]), "%s/%s", scratch, name);
    return b;
}

static int make_scratch(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(scratch, sizeof(scratch), "%s/powercut-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(scratch)) {
        fprintf(stderr, "powercut: mkdtemp %s: %s\n", scratch, strerror(errno));
        return -1;
    }
    return 0;
}

static void remove_scratch(void)
{
    char *argv[] = {"rm", "-rf", scratch, NULL};
    pc_run(argv);
}

/* --- Calibration: the disk drops exactly what no flush covered ------------------ */

static int failures;
#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("CALIBRATION FAILED: ");                                                        \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

static void fill(uint8_t *p, size_t n, uint8_t v)
{
    memset(p, v, n);
}

/* Writes through the block device with O_DIRECT: each write reaches the
 * disk as one write, and fdatasync() as a flush. */
static int dev_write(int fd, uint64_t off, uint8_t v, size_t n)
{
    void *buf;
    if (posix_memalign(&buf, 4096, n) != 0)
        return -1;
    fill(buf, n, v);
    int rc = pwrite(fd, buf, n, (off_t)off) == (ssize_t)n ? 0 : -1;
    free(buf);
    return rc;
}

/* What the image holds at [off, off + n): v everywhere (1), zeros
 * everywhere (0), or a mix (-1), counted per 512-byte sector into
 * *sectors_v. */
static int image_holds(const char *image, uint64_t off, size_t n, uint8_t v, int *sectors_v)
{
    int fd = open(image, O_RDONLY | O_CLOEXEC);
    uint8_t *buf = malloc(n);
    int all_v = 1, all_zero = 1;
    *sectors_v = 0;
    if (fd < 0 || !buf || pread(fd, buf, n, (off_t)off) != (ssize_t)n) {
        free(buf);
        if (fd >= 0)
            close(fd);
        return -2;
    }
    for (size_t s = 0; s < n; s += 512) {
        int sv = 1, sz = 1;
        for (size_t i = s; i < s + 512; i++)
            sv &= buf[i] == v, sz &= buf[i] == 0;
        *sectors_v += sv;
        all_v &= sv, all_zero &= sz;
        if (!sv && !sz)
            all_v = all_zero = 0, *sectors_v = -1000000; /* torn inside a sector */
    }
    free(buf);
    close(fd);
    return all_v ? 1 : all_zero ? 0 : -1;
}

/* One block-level round: A flushed, B and C (eight 512-byte sectors) not,
 * then a cut keeping what c says. */
static void block_round(const pc_cut *c, int cut_at_flush)
{
    char image[PATH_MAX + 64];
    snprintf(image, sizeof(image), "%s", at("block.img"));
    int fd = open(image, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, 16 << 20) != 0) {
        EXPECT(0, "%s: %s", image, strerror(errno));
        return;
    }
    close(fd);
    pc_disk d;
    char dev[32];
    if (pc_disk_start(&d, image, at("fuse")) != 0) {
        EXPECT(0, "the disk did not start");
        return;
    }
    int loop = pc_loop_attach(d.file, 1, dev);
    EXPECT(loop >= 0, "no loop device over the disk");
    int bd = loop >= 0 ? open(dev, O_RDWR | O_DIRECT | O_CLOEXEC) : -1;
    EXPECT(bd >= 0, "%s: %s", dev, strerror(errno));
    if (bd >= 0) {
        if (cut_at_flush)
            pc_disk_arm(&d, 0, 2, c);
        EXPECT(dev_write(bd, 0, 'A', 4096) == 0 && fdatasync(bd) == 0, "the flushed write");
        EXPECT(dev_write(bd, 1 << 20, 'B', 4096) == 0, "the unflushed write");
        for (int s = 0; s < 8; s++)
            EXPECT(dev_write(bd, (2 << 20) + 512 * s, 'C', 512) == 0, "an unflushed sector");
        if (cut_at_flush)
            EXPECT(fdatasync(bd) != 0, "the flush at which the disk was cut succeeded");
        close(bd);
    }
    pc_disk_stats st;
    EXPECT(pc_disk_cut(&d, c, &st) == 0, "the cut");
    if (loop >= 0)
        close(loop);
    pc_disk_stop(&d);

    int sv;
    const char *how = pc_keep_name[c->keep];
    EXPECT(image_holds(image, 0, 4096, 'A', &sv) == 1, "keep %s: a flushed write is not on the disk",
           how);
    int b = image_holds(image, 1 << 20, 4096, 'B', &sv);
    int cs;
    int cc = image_holds(image, 2 << 20, 4096, 'C', &cs);
    EXPECT(cs >= 0, "keep %s: a 512-byte sector was torn", how);
    EXPECT(st.pending_writes == 9, "keep %s: %" PRIu64 " writes were pending at the cut, want 9",
           how, st.pending_writes);
    switch (c->keep) {
    case PC_KEEP_NONE:
        EXPECT(b == 0 && cc == 0, "keep none: an unflushed write survived (%d, %d)", b, cc);
        break;
    case PC_KEEP_ALL:
        EXPECT(b == 1 && cc == 1, "keep all: an unflushed write was lost (%d, %d)", b, cc);
        break;
    case PC_KEEP_PREFIX: {
        /* B came first: C's sectors can survive only after all of B. */
        int b_pieces;
        image_holds(image, 1 << 20, 4096, 'B', &b_pieces);
        EXPECT(cs == 0 || b_pieces == 8, "keep prefix: a later write survived an earlier one");
        break;
    }
    default:
        break;
    }
    printf("calibration: keep %-6s pieces %4u%s: %" PRIu64 " of %" PRIu64 " pieces kept\n", how,
           c->piece, cut_at_flush ? ", cut at a flush" : "", st.kept, st.pieces);
}

/* A filesystem on the disk: a file synced survives a cut, one not synced
 * does not. */
static void fs_round(void)
{
    char image[PATH_MAX + 64];
    snprintf(image, sizeof(image), "%s", at("fs.img"));
    if (pc_mkfs("ext4", image) != 0) {
        EXPECT(0, "mkfs.ext4");
        return;
    }
    pc_disk d;
    char dev[32];
    if (pc_disk_start(&d, image, at("fuse")) != 0) {
        EXPECT(0, "the disk did not start");
        return;
    }
    int loop = pc_loop_attach(d.file, 1, dev);
    mkdir(at("mnt"), 0700);
    int mounted = loop >= 0 && pc_mount(dev, "ext4", at("mnt")) == 0;
    EXPECT(mounted, "mount ext4 over the disk: %s", strerror(errno));
    if (loop >= 0)
        close(loop);
    if (mounted) {
        int a = open(at("mnt/synced"), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        int b = open(at("mnt/unsynced"), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        EXPECT(a >= 0 && write(a, "synced", 6) == 6 && fsync(a) == 0, "the synced file");
        EXPECT(b >= 0 && write(b, "unsynced", 8) == 8, "the unsynced file");
        close(a);
        close(b);
    }
    pc_cut c = {PC_KEEP_NONE, 4096, 0};
    pc_disk_stats st;
    pc_disk_cut(&d, &c, &st);
    if (mounted)
        pc_umount(at("mnt"));
    pc_disk_stop(&d);

    /* As a reboot finds it: the image alone, the journal replayed. */
    loop = pc_loop_attach(image, 0, dev);
    mounted = loop >= 0 && pc_mount(dev, "ext4", at("mnt")) == 0;
    EXPECT(mounted, "mount of the crash image: %s", strerror(errno));
    if (loop >= 0)
        close(loop);
    if (!mounted)
        return;
    char buf[16] = {0};
    int a = open(at("mnt/synced"), O_RDONLY | O_CLOEXEC);
    EXPECT(a >= 0 && read(a, buf, sizeof(buf)) == 6 && memcmp(buf, "synced", 6) == 0,
           "a file written and fsync()ed was lost");
    if (a >= 0)
        close(a);
    struct stat sb;
    int b = stat(at("mnt/unsynced"), &sb);
    EXPECT(b != 0 || sb.st_size == 0, "a file never synced survived with its data");
    printf("calibration: ext4 on the disk: the synced file survives, the unsynced one %s\n",
           b != 0 ? "is gone" : "is empty");
    pc_umount(at("mnt"));
}

static int calibrate(void)
{
    const char *why = pc_cannot_run("ext4");
    if (why) {
        fprintf(stderr, "SKIP: powercut calibrate: %s\n", why);
        return 77;
    }
    if (pc_private_mounts() != 0 || make_scratch() != 0)
        return 1;
    mkdir(at("fuse"), 0700);
    for (uint32_t keep = 0; keep < PC_KEEP_KINDS; keep++)
        for (uint32_t piece = 512; piece <= 4096; piece *= 8) {
            pc_cut c = {keep, piece, 0x5eed + keep * 31 + piece};
            block_round(&c, 0);
        }
    pc_cut none = {PC_KEEP_NONE, 4096, 0};
    block_round(&none, 1);
    fs_round();
    remove_scratch();
    printf("calibration: %s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}

/* --- Cuts under the workload ---------------------------------------------------- */

static const char *const level_name[3] = {"none", "async", "full"};
static const uint32_t dtypes[3] = {CTXS_DTYPE_F16, CTXS_DTYPE_BF16, CTXS_DTYPE_Q8};
static const char *const dtype_name[3] = {"f16", "bf16", "q8"};
enum { MODE_TIME, MODE_WRITE, MODE_FLUSH, MODE_END, MODES };
static const char *const mode_name[MODES] = {"at a time", "at a write", "at a flush",
                                             "after the last step"};

typedef struct one {
    const char *fs;
    uint32_t level, dtype_i;
    uint64_t seed;
    uint32_t mode;        /* MODE_* */
    uint64_t at;          /* ms, or the write's or flush's number */
    pc_cut cut;
    const char *script;   /* a scenario's, or NULL */
    const char *bin;      /* the ctxstore tool for the checker, or NULL */
    int twice;            /* cut again while the next boot recovers */
    uint32_t mode2;       /* that cut: MODE_TIME, _WRITE or _FLUSH */
    uint64_t at2;
    pc_cut cut2;
} one;

typedef struct outcome {
    int violations;       /* -1: the rig failed */
    pc_disk_stats st;
    uint64_t ms;
    uint64_t acks[PC_OP_KINDS]; /* what the workload was told, by kind */
    pc_disk_stats st2;    /* the second cut's, when there is one */
} outcome;

/* Counts the acknowledgements in the log, by kind. */
static void count_acks(const char *log, uint64_t acks[PC_OP_KINDS])
{
    int fd = open(log, O_RDONLY | O_CLOEXEC);
    pc_rec r;
    while (fd >= 0 && read(fd, &r, sizeof(r)) == (ssize_t)sizeof(r))
        if (r.phase == PC_ACK && r.op < PC_OP_KINDS)
            acks[r.op]++;
    if (fd >= 0)
        close(fd);
}

/* Runs the workload in a child on store, logging to log. */
static pid_t start_workload(const one *o, const char *store, const char *log)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    pc_workload w = {.store = store, .log = log, .level = o->level,
                     .dtype = dtypes[o->dtype_i], .seed = o->seed, .max_ops = 1000000,
                     .script = o->script};
    _exit(pc_workload_run(&w));
}

/* The checker's exit status: its violations (at most 100), or this when
 * it could not check (the log unreadable). */
enum { CHECKER_FAILED = 200 };

/* A checker that crashes says where. */
static void on_fault(int sig)
{
    void *frames[64];
    int n = backtrace(frames, 64);
    dprintf(1, "the checker got signal %d at:\n", sig);
    backtrace_symbols_fd(frames, n, 1);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Checks the crash image in a child booted as a new boot. */
static int run_checker(const one *o, const char *store, const char *log, uint64_t boot)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        signal(SIGSEGV, on_fault);
        signal(SIGBUS, on_fault);
        signal(SIGABRT, on_fault);
        char b[64];
        snprintf(b, sizeof(b), "after-cut-%" PRIu64, boot);
        setenv("CTXS_TEST_BOOT", b, 1);
        pc_check c = {.store = store, .log = log, .bin = o->bin, .level = o->level,
                      .dtype = dtypes[o->dtype_i]};
        int v = pc_check_run(&c);
        fflush(NULL);
        _exit(v < 0 ? CHECKER_FAILED : v > 100 ? 100 : v);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(st)) {
        printf("VIOLATION: the checker died of signal %d\n", WTERMSIG(st));
        return 1;
    }
    return WEXITSTATUS(st) == CHECKER_FAILED ? -1 : WEXITSTATUS(st);
}

/* The next boot's first steps: the store opened read-write (what the cut
 * left resolved), every session opened read-write (recovered, and its
 * state written back) and closed. */
static _Noreturn void recover(const one *o, const char *store, uint64_t boot)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    char b[64];
    snprintf(b, sizeof(b), "recovery-%" PRIu64, boot);
    setenv("CTXS_TEST_BOOT", b, 1);
    ctxs_store *st;
    ctxs_session_entry *list;
    size_t n;
    ctxs_model m = pc_model(dtypes[o->dtype_i]);
    if (ctxs_store_open(&st, store, 0, NULL) != 0)
        _exit(0); /* a store the first cut left unmade */
    if (ctxs_store_session_list(&list, &n, st) == 0) {
        for (size_t i = 0; i < n; i++) {
            ctxs_session *s;
            if (ctxs_store_session_open(&s, st, list[i].name, &m, 0, NULL) == 0)
                ctxs_session_close(s);
        }
        ctxs_free(list);
    }
    ctxs_store_close(st);
    _exit(0);
}

/* A second cut, while the next boot recovers from the first: the image is
 * served again, recover() runs on it, and the power goes as o says. */
static int cut_recovery(const one *o, const char *image, uint64_t n, pc_disk_stats *st)
{
    pc_disk d;
    char dev[32], store[PATH_MAX + 64];
    snprintf(store, sizeof(store), "%s/store", at("live"));
    if (pc_disk_start(&d, image, at("fuse")) != 0)
        return -1;
    int loop = pc_loop_attach(d.file, 1, dev);
    int mounted = loop >= 0 && pc_mount(dev, o->fs, at("live")) == 0;
    if (loop >= 0)
        close(loop);
    if (!mounted) {
        /* The first cut's image must mount: the checker says so. */
        pc_disk_stop(&d);
        return 0;
    }
    if (o->mode2 != MODE_TIME)
        pc_disk_arm(&d, o->mode2 == MODE_WRITE ? o->at2 : 0, o->mode2 == MODE_FLUSH ? o->at2 : 0,
                    &o->cut2);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0)
        recover(o, store, n);
    uint64_t deadline = pc_now_ms() + (o->mode2 == MODE_TIME ? o->at2 : 4000);
    int cut = 0, exited = 0, status;
    while (!cut && !exited && pc_now_ms() < deadline) {
        cut = pc_disk_wait_cut(&d, 5, st) == 1;
        exited = waitpid(pid, &status, WNOHANG) == pid;
    }
    pc_disk_cut(&d, &o->cut2, st);
    if (!exited) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    pc_umount(at("live"));
    pc_disk_stop(&d);
    return 0;
}

static outcome cut_once(const one *o, const char *template, uint64_t n)
{
    outcome out = {0};
    uint64_t t0 = pc_now_ms();
    char image[PATH_MAX + 64], log[PATH_MAX + 64];
    snprintf(image, sizeof(image), "%s", at("disk.img"));
    snprintf(log, sizeof(log), "%s", at("cut.log"));
    unlink(log);
    if (pc_copy_sparse(template, image) != 0) {
        out.violations = -1;
        return out;
    }
    pc_disk d;
    char dev[32], store[PATH_MAX + 64];
    snprintf(store, sizeof(store), "%s/store", at("live"));
    if (pc_disk_start(&d, image, at("fuse")) != 0) {
        out.violations = -1;
        return out;
    }
    int loop = pc_loop_attach(d.file, 1, dev);
    int mounted = loop >= 0 && pc_mount(dev, o->fs, at("live")) == 0;
    if (!mounted)
        fprintf(stderr, "powercut: mount %s over the disk: %s\n", o->fs, strerror(errno));
    if (loop >= 0)
        close(loop);
    if (!mounted) {
        pc_disk_stop(&d);
        out.violations = -1;
        return out;
    }
    if (o->mode == MODE_WRITE || o->mode == MODE_FLUSH)
        pc_disk_arm(&d, o->mode == MODE_WRITE ? o->at : 0, o->mode == MODE_FLUSH ? o->at : 0,
                    &o->cut);
    pid_t w = start_workload(o, store, log);
    /* The cut: when its time comes, at the armed write or flush, or when
     * the workload ends (a script's last step; a failure, which the log
     * and the checker tell apart from a cut's). */
    uint64_t deadline = pc_now_ms() + (o->mode == MODE_TIME ? o->at : 4000);
    int cut = 0, status = 0, exited = 0;
    while (!cut && !exited) {
        uint64_t now = pc_now_ms();
        if (now >= deadline)
            break;
        int step = (int)(deadline - now < 5 ? deadline - now : 5);
        cut = pc_disk_wait_cut(&d, step, &out.st) == 1;
        exited = waitpid(w, &status, WNOHANG) == w;
    }
    pc_disk_cut(&d, &o->cut, &out.st);
    if (!exited) {
        kill(w, SIGKILL);
        waitpid(w, &status, 0);
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == 1 && out.st.reason == PC_CUT_ASKED &&
               o->mode != MODE_END) {
        /* It failed before the power went: the log says which call. */
        printf("VIOLATION: the workload failed before the cut\n");
        out.violations++;
    }
    pc_umount(at("live"));
    pc_disk_stop(&d);
    count_acks(log, out.acks);
    if (o->twice && cut_recovery(o, image, n, &out.st2) != 0) {
        out.violations = -1;
        return out;
    }

    /* As a reboot finds the disk: the image alone. The checker writes (a
     * read-write open settles what the cut left): it works on a copy, and
     * a failure keeps the image as the cut left it. */
    char checked[PATH_MAX + 64];
    snprintf(checked, sizeof(checked), "%s", at("check.img"));
    if (pc_copy_sparse(image, checked) != 0) {
        out.violations = -1;
        return out;
    }
    loop = pc_loop_attach(checked, 0, dev);
    mounted = loop >= 0 && pc_mount(dev, o->fs, at("check")) == 0;
    if (!mounted)
        printf("VIOLATION: the crash image does not mount as %s: %s\n", o->fs, strerror(errno));
    if (loop >= 0)
        close(loop);
    if (mounted) {
        snprintf(store, sizeof(store), "%s/store", at("check"));
        int v = run_checker(o, store, log, n);
        if (v < 0)
            out.violations = -1;
        else
            out.violations += v;
        pc_umount(at("check"));
    } else {
        out.violations++;
    }
    if (out.violations != 0) {
        char keep[PATH_MAX + 64], keep_log[PATH_MAX + 64];
        snprintf(keep, sizeof(keep), "%s/failed-%" PRIu64 ".img", scratch, n);
        snprintf(keep_log, sizeof(keep_log), "%s/failed-%" PRIu64 ".log", scratch, n);
        rename(image, keep);
        rename(log, keep_log);
        printf("  kept: %s and %s\n", keep, keep_log);
    }
    out.ms = pc_now_ms() - t0;
    return out;
}

static uint64_t seed_from_env(void)
{
    const char *e = getenv("CTXS_POWERCUT_SEED");
    if (e && *e)
        return strtoull(e, NULL, 0);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec ^ (uint64_t)getpid() << 32;
}

static int prepare(const char *fs, char *template, size_t n)
{
    if (pc_private_mounts() != 0 || make_scratch() != 0)
        return -1;
    mkdir(at("fuse"), 0700);
    mkdir(at("live"), 0700);
    mkdir(at("check"), 0700);
    snprintf(template, n, "%s", at("template.img"));
    return pc_mkfs(fs, template);
}

static const char *tool_bin(void)
{
    const char *b = getenv("CTXSTORE_BIN");
    return b && *b && access(b, X_OK) == 0 ? b : NULL;
}

static int run(const char *fs, uint64_t cuts)
{
    const char *why = pc_cannot_run(fs);
    if (why) {
        fprintf(stderr, "SKIP: powercut run %s: %s\n", fs, why);
        printf("SKIP: %s\n", why);
        return 77;
    }
    char template[PATH_MAX + 64];
    if (prepare(fs, template, sizeof(template)) != 0)
        return 1;
    uint64_t seed = seed_from_env(), rng = seed;
    printf("powercut %s: %" PRIu64 " cuts, seed %" PRIu64 " (CTXS_POWERCUT_SEED)\n", fs, cuts, seed);
    uint64_t tally[3][3][2] = {{{0}}}, by_mode[MODES] = {0}, by_keep[PC_KEEP_KINDS] = {0};
    uint64_t writes_seen = 400, flushes_seen = 60, total_ms = 0, acks[PC_OP_KINDS] = {0};
    int bad = 0, rig_failed = 0;
    uint64_t doubles = 0;
    for (uint64_t i = 0; i < cuts; i++) {
        one o = {.fs = fs, .level = (uint32_t)(i % 3), .dtype_i = (uint32_t)(i / 3 % 3),
                 .seed = ts_rng_next(&rng), .bin = tool_bin()};
        o.mode = (uint32_t)(ts_rng_next(&rng) % 3);
        o.at = o.mode == MODE_TIME    ? 5 + ts_rng_next(&rng) % 600
               : o.mode == MODE_WRITE ? 1 + ts_rng_next(&rng) % writes_seen
                                      : 1 + ts_rng_next(&rng) % flushes_seen;
        o.cut.keep = (uint32_t)(ts_rng_next(&rng) % PC_KEEP_KINDS);
        o.cut.piece = ts_rng_next(&rng) % 2 ? 4096 : 512;
        o.cut.seed = ts_rng_next(&rng);
        /* One cut in four is a double one: the power goes again while the
         * next boot recovers. */
        o.twice = ts_rng_next(&rng) % 4 == 0;
        o.mode2 = (uint32_t)(ts_rng_next(&rng) % 3);
        o.at2 = o.mode2 == MODE_TIME    ? 1 + ts_rng_next(&rng) % 150
                : o.mode2 == MODE_WRITE ? 1 + ts_rng_next(&rng) % 150
                                        : 1 + ts_rng_next(&rng) % 12;
        o.cut2.keep = (uint32_t)(ts_rng_next(&rng) % PC_KEEP_KINDS);
        o.cut2.piece = ts_rng_next(&rng) % 2 ? 4096 : 512;
        o.cut2.seed = ts_rng_next(&rng);
        outcome r = cut_once(&o, template, i);
        if (r.violations < 0) {
            printf("cut %" PRIu64 ": the rig failed\n", i);
            rig_failed = 1;
            break;
        }
        if (o.mode == MODE_TIME && r.st.writes > writes_seen)
            writes_seen = r.st.writes, flushes_seen = r.st.flushes > 2 ? r.st.flushes : 2;
        tally[o.level][o.dtype_i][0]++;
        tally[o.level][o.dtype_i][1] += r.violations > 0;
        by_mode[r.st.reason == PC_CUT_AT_WRITE   ? MODE_WRITE
                : r.st.reason == PC_CUT_AT_FLUSH ? MODE_FLUSH
                                                 : MODE_TIME]++;
        by_keep[o.cut.keep]++;
        doubles += o.twice;
        total_ms += r.ms;
        for (int k = 0; k < PC_OP_KINDS; k++)
            acks[k] += r.acks[k];
        if (r.violations) {
            bad++;
            printf("cut %" PRIu64 " (%s, %s, %s, %s %" PRIu64 ", keep %s of %" PRIu64
                   " pieces of %u bytes, seed %" PRIu64 "): %d violations\n",
                   i, fs, level_name[o.level], dtype_name[o.dtype_i], mode_name[o.mode], o.at,
                   pc_keep_name[o.cut.keep], r.st.pieces, o.cut.piece, o.seed, r.violations);
            if (o.twice)
                printf("  then cut again while recovering, %s %" PRIu64 ", keep %s of %" PRIu64
                       " pieces of %u bytes\n",
                       mode_name[o.mode2], o.at2, pc_keep_name[o.cut2.keep], r.st2.pieces,
                       o.cut2.piece);
        }
    }
    printf("powercut %s: tallies (cuts, cuts with a violation):\n", fs);
    for (int l = 0; l < 3; l++)
        printf("  %-5s  f16 %3" PRIu64 " %" PRIu64 "   bf16 %3" PRIu64 " %" PRIu64
               "   q8 %3" PRIu64 " %" PRIu64 "\n",
               level_name[l], tally[l][0][0], tally[l][0][1], tally[l][1][0], tally[l][1][1],
               tally[l][2][0], tally[l][2][1]);
    printf("  cut %s %" PRIu64 ", %s %" PRIu64 ", %s %" PRIu64 "; kept none %" PRIu64
           ", all %" PRIu64 ", a prefix %" PRIu64 ", a random subset %" PRIu64 "\n",
           mode_name[MODE_TIME], by_mode[MODE_TIME], mode_name[MODE_WRITE], by_mode[MODE_WRITE],
           mode_name[MODE_FLUSH], by_mode[MODE_FLUSH], by_keep[PC_KEEP_NONE], by_keep[PC_KEEP_ALL],
           by_keep[PC_KEEP_PREFIX], by_keep[PC_KEEP_RANDOM]);
    printf("  %" PRIu64 " of them cut again while the next boot recovered\n", doubles);
    printf("  acknowledged before the cuts:");
    for (int k = PC_OP_CREATE; k < PC_OP_KINDS; k++)
        printf(" %s %" PRIu64 "%s", pc_op_name[k], acks[k], k + 1 < PC_OP_KINDS ? "," : "\n");
    printf("powercut %s: %d of %" PRIu64 " cuts violated a claim; %.0f ms a cut\n", fs, bad, cuts,
           cuts ? (double)total_ms / (double)cuts : 0.0);
    if (!bad && !rig_failed)
        remove_scratch();
    else
        printf("powercut %s: crash images and logs kept in %s\n", fs, scratch);
    return bad || rig_failed ? 1 : 0;
}

/* --- Scenarios: one cut at a chosen moment ------------------------------------ */

/* An acknowledged delete, then the power goes at once: the unlink is in the
 * filesystem's journal or log, not on the disk, unless the delete made it
 * durable before it dropped its intent. */
static const char delete_script[] = "create,commit,sync,reopen,delete";

/* A store made (and its model registered), then the power goes: its
 * directories, made in a directory nothing synced, are gone unless the
 * open made them durable. */
static const char store_script[] = "";

static int scenario(const char *name, const char *fs);

/* Every scenario on every filesystem this machine can make. */
static int scenarios(void)
{
    static const char *const names[] = {"delete", "store"};
    static const char *const fss[] = {"ext4", "xfs", "btrfs"};
    int ran = 0, bad = 0;
    const char *why = NULL;
    for (size_t f = 0; f < 3; f++) {
        if ((why = pc_cannot_run(fss[f]))) {
            printf("scenarios on %s skipped: %s\n", fss[f], why);
            continue;
        }
        for (size_t n = 0; n < sizeof(names) / sizeof(names[0]); n++) {
            pid_t pid = fork(); /* each in its own mount namespace */
            if (pid == 0)
                _exit(scenario(names[n], fss[f]));
            int st;
            waitpid(pid, &st, 0);
            ran++;
            bad += !WIFEXITED(st) || WEXITSTATUS(st) != 0;
        }
    }
    if (!ran) {
        fprintf(stderr, "SKIP: powercut scenarios: %s\n", why);
        return 77;
    }
    printf("scenarios: %d of %d failed\n", bad, ran);
    return bad ? 1 : 0;
}

static int scenario(const char *name, const char *fs)
{
    const char *script = strcmp(name, "delete") == 0  ? delete_script
                         : strcmp(name, "store") == 0 ? store_script
                                                      : NULL;
    if (!script) {
        fprintf(stderr, "powercut: no scenario '%s' (there are: delete, store)\n", name);
        return 2;
    }
    const char *why = pc_cannot_run(fs);
    if (why) {
        fprintf(stderr, "SKIP: powercut scenario %s %s: %s\n", name, fs, why);
        printf("SKIP: %s\n", why);
        return 77;
    }
    char template[PATH_MAX + 64];
    if (prepare(fs, template, sizeof(template)) != 0)
        return 1;
    int bad = 0;
    for (uint32_t level = 0; level < 3; level++) {
        one o = {.fs = fs, .level = level, .dtype_i = 0, .seed = 1, .mode = MODE_END,
                 .cut = {PC_KEEP_NONE, 4096, 0}, .script = script};
        outcome r = cut_once(&o, template, level);
        if (r.violations < 0)
            return 1;
        printf("scenario %s on %s at %s: the cut kept none of %" PRIu64 " pending writes: %s\n",
               name, fs, level_name[level], r.st.pending_writes,
               r.violations ? "VIOLATED" : "held");
        bad += r.violations != 0;
    }
    if (!bad)
        remove_scratch();
    return bad ? 1 : 0;
}

/* Checks a kept crash image again (what a failed run printed). */
static int check_kept(const char *fs, const char *image, const char *log, const char *level,
                      const char *dtype)
{
    if (pc_private_mounts() != 0 || make_scratch() != 0)
        return 1;
    mkdir(at("check"), 0700);
    one o = {.fs = fs, .bin = tool_bin()};
    for (uint32_t i = 0; i < 3; i++) {
        if (strcmp(level, level_name[i]) == 0)
            o.level = i;
        if (strcmp(dtype, dtype_name[i]) == 0)
            o.dtype_i = i;
    }
    char dev[32], store[PATH_MAX + 64], checked[PATH_MAX + 64];
    snprintf(checked, sizeof(checked), "%s", at("check.img"));
    if (pc_copy_sparse(image, checked) != 0) /* the checker writes */
        return 1;
    int loop = pc_loop_attach(checked, 0, dev);
    if (loop < 0 || pc_mount(dev, fs, at("check")) != 0) {
        fprintf(stderr, "powercut: mount %s: %s\n", image, strerror(errno));
        return 1;
    }
    close(loop);
    snprintf(store, sizeof(store), "%s/store", at("check"));
    int v = run_checker(&o, store, log, 0);
    pc_umount(at("check"));
    remove_scratch();
    printf("%d violations\n", v);
    return v ? 1 : 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 2 && strcmp(argv[1], "calibrate") == 0)
        return calibrate();
    if (argc >= 3 && strcmp(argv[1], "run") == 0) {
        const char *e = getenv("CTXS_POWERCUT_CUTS");
        uint64_t cuts = argc >= 4 ? strtoull(argv[3], NULL, 10) : e && *e ? strtoull(e, NULL, 10) : 72;
        return run(argv[2], cuts);
    }
    if (argc >= 4 && strcmp(argv[1], "scenario") == 0)
        return scenario(argv[2], argv[3]);
    if (argc >= 2 && strcmp(argv[1], "scenarios") == 0)
        return scenarios();
    if (argc >= 7 && strcmp(argv[1], "check") == 0)
        return check_kept(argv[2], argv[3], argv[4], argv[5], argv[6]);
    fprintf(stderr, "usage: powercut calibrate | run FS [CUTS] | scenario NAME FS | scenarios | "
                    "check FS IMAGE LOG LEVEL DTYPE\n");
    return 2;
}
