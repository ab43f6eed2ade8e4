/*
 * The disk that a power cut can hit: one file, served by a FUSE server in a
 * child process, which a loop device with direct I/O turns into a block
 * device. Direct I/O sends each of the block device's writes to the server
 * as it is written, and each of its flushes as an fsync, in the order the
 * device sees them; the server answers them one at a time.
 *
 * It models a drive with a volatile write cache. The image file holds what
 * the medium holds. A write is kept aside (and reads see it), in the order
 * it came; a flush puts every write kept aside onto the image: after a
 * flush, all that came before it is durable, which is all a flush promises.
 * At a cut the writes kept aside, torn into pieces of 4 KiB or 512 bytes,
 * reach the image as the cut says: none, all, the first k pieces, or any
 * subset (a drive may reorder its cache); then every read, write and flush
 * fails with EIO, and the image is what a reboot would find.
 *
 * Discards and zeroing (fallocate) are writes of zeros, kept aside the same
 * way.
 */
#define FUSE_USE_VERSION 34
#include <fuse_lowlevel.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "powercut.h"
#include "rng.h"

const char *const pc_keep_name[PC_KEEP_KINDS] = {"none", "all", "prefix", "random"};

enum { INO_DISK = 2 };

/* The control protocol: the rig's requests, the server's replies. */
enum { REQ_ARM = 1, REQ_CUT, REQ_STATS, REQ_STOP };
typedef struct req {
    uint32_t op;
    uint32_t reserved_;
    uint64_t writes, flushes; /* ARM */
    pc_cut cut;               /* ARM, CUT */
} req;
enum { MSG_READY = 1, MSG_CUT, MSG_STATS };
typedef struct msg {
    uint32_t type;
    uint32_t reserved_;
    pc_disk_stats st;
} msg;

/* --- The server's side -------------------------------------------------------- */

typedef struct pending {
    uint64_t off, len;
    uint8_t *data;
} pending;

static struct server {
    int image;
    uint64_t size;
    int ctl;
    pending *log;
    size_t n_log, cap_log;
    pc_disk_stats st;
    uint64_t arm_writes, arm_flushes; /* cut at these counts (0: not) */
    pc_cut armed;
    int cut;                          /* 1: everything fails with EIO */
} S;

static void die(const char *what)
{
    fprintf(stderr, "powercut disk: %s: %s\n", what, strerror(errno));
    _exit(3);
}

static void write_image(uint64_t off, const uint8_t *p, uint64_t len)
{
    while (len) {
        ssize_t w = pwrite(S.image, p, len, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            die("writing the image");
        off += (uint64_t)w, p += w, len -= (uint64_t)w;
    }
}

static void send_msg(uint32_t type)
{
    msg m = {.type = type, .st = S.st};
    if (write(S.ctl, &m, sizeof(m)) != (ssize_t)sizeof(m))
        die("the control socket");
}

static void log_clear(void)
{
    for (size_t i = 0; i < S.n_log; i++)
        free(S.log[i].data);
    S.n_log = 0;
}

/* The cut: what the drive's cache had reaches the medium as c says. */
static void cut_now(const pc_cut *c, uint32_t reason)
{
    if (S.cut)
        return;
    uint64_t piece = c->piece == 512 ? 512 : 4096, rng = c->seed;
    uint64_t total = 0;
    for (size_t i = 0; i < S.n_log; i++) {
        const pending *p = &S.log[i];
        total += (p->off + p->len + piece - 1) / piece - p->off / piece;
        S.st.pending_bytes += p->len;
    }
    S.st.pending_writes = S.n_log;
    S.st.pieces = total;
    uint64_t prefix = c->keep == PC_KEEP_ALL     ? total
                      : c->keep == PC_KEEP_PREFIX ? ts_rng_next(&rng) % (total + 1)
                                                  : 0;
    /* A random subset keeps each piece with a probability of its own cut. */
    uint64_t odds = ts_rng_next(&rng) % 7 + 1; /* in 8ths */
    uint64_t k = 0;
    for (size_t i = 0; i < S.n_log; i++) {
        const pending *p = &S.log[i];
        for (uint64_t at = p->off; at < p->off + p->len; k++) {
            uint64_t end = (at / piece + 1) * piece;
            if (end > p->off + p->len)
                end = p->off + p->len;
            int keep = c->keep == PC_KEEP_RANDOM ? ts_rng_next(&rng) % 8 < odds : k < prefix;
            if (keep) {
                write_image(at, p->data + (at - p->off), end - at);
                S.st.kept++;
            }
            at = end;
        }
    }
    log_clear();
    if (fsync(S.image) != 0)
        die("syncing the image");
    S.cut = 1;
    S.st.reason = reason;
    send_msg(MSG_CUT);
}

static void flush_now(void)
{
    for (size_t i = 0; i < S.n_log; i++)
        write_image(S.log[i].off, S.log[i].data, S.log[i].len);
    log_clear();
}

/* A write (or zeros, data NULL) kept aside. 0 or EIO. */
static int keep_aside(uint64_t off, const void *data, uint64_t len)
{
    if (S.cut)
        return EIO;
    S.st.writes++;
    if (S.arm_writes && S.st.writes >= S.arm_writes) {
        cut_now(&S.armed, PC_CUT_AT_WRITE); /* this write is not taken */
        return EIO;
    }
    if (S.n_log == S.cap_log) {
        S.cap_log = S.cap_log ? 2 * S.cap_log : 1024;
        if (!(S.log = realloc(S.log, S.cap_log * sizeof(*S.log))))
            die("memory");
    }
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy)
        die("memory");
    if (data)
        memcpy(copy, data, len);
    else
        memset(copy, 0, len);
    S.log[S.n_log++] = (pending){off, len, copy};
    return 0;
}

static void attr_of(struct stat *st, fuse_ino_t ino)
{
    memset(st, 0, sizeof(*st));
    st->st_ino = ino;
    if (ino == FUSE_ROOT_ID) {
        st->st_mode = S_IFDIR | 0700;
        st->st_nlink = 2;
    } else {
        st->st_mode = S_IFREG | 0600;
        st->st_nlink = 1;
        st->st_size = (off_t)S.size;
        st->st_blksize = 4096;
        st->st_blocks = (blkcnt_t)(S.size / 512);
    }
}

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
    (void)userdata;
    /* Writes go to the server as they are made, never cached by FUSE. */
    conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
    conn->max_write = 1u << 20;
}

static void op_lookup(fuse_req_t r, fuse_ino_t parent, const char *name)
{
    if (parent != FUSE_ROOT_ID || strcmp(name, "disk") != 0) {
        fuse_reply_err(r, ENOENT);
        return;
    }
    struct fuse_entry_param e = {.ino = INO_DISK, .attr_timeout = 3600, .entry_timeout = 3600};
    attr_of(&e.attr, INO_DISK);
    fuse_reply_entry(r, &e);
}

static void op_getattr(fuse_req_t r, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)fi;
    struct stat st;
    attr_of(&st, ino);
    fuse_reply_attr(r, &st, 3600);
}

static void op_open(fuse_req_t r, fuse_ino_t ino, struct fuse_file_info *fi)
{
    if (ino != INO_DISK) {
        fuse_reply_err(r, EISDIR);
        return;
    }
    fi->direct_io = 1; /* no page cache of FUSE's between device and server */
    fi->keep_cache = 0;
    fuse_reply_open(r, fi);
}

static void op_read(fuse_req_t r, fuse_ino_t ino, size_t size, off_t off,
                    struct fuse_file_info *fi)
{
    (void)ino, (void)fi;
    if (S.cut) {
        fuse_reply_err(r, EIO);
        return;
    }
    uint64_t o = (uint64_t)off;
    if (o >= S.size)
        size = 0;
    else if (size > S.size - o)
        size = (size_t)(S.size - o);
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        die("memory");
    for (size_t done = 0; done < size;) {
        ssize_t n = pread(S.image, buf + done, size - done, (off_t)(o + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            die("reading the image");
        if (n == 0) {
            memset(buf + done, 0, size - done);
            break;
        }
        done += (size_t)n;
    }
    /* What the cache holds over the medium, the later over the earlier. */
    for (size_t i = 0; i < S.n_log; i++) {
        const pending *p = &S.log[i];
        uint64_t a = p->off > o ? p->off : o, b = p->off + p->len < o + size ? p->off + p->len : o + size;
        if (a < b)
            memcpy(buf + (a - o), p->data + (a - p->off), b - a);
    }
    fuse_reply_buf(r, (const char *)buf, size);
    free(buf);
}

static void op_write(fuse_req_t r, fuse_ino_t ino, const char *data, size_t size, off_t off,
                     struct fuse_file_info *fi)
{
    (void)ino, (void)fi;
    uint64_t o = (uint64_t)off;
    if (o >= S.size || size > S.size - o) {
        fuse_reply_err(r, ENOSPC);
        return;
    }
    int err = keep_aside(o, data, size);
    if (err)
        fuse_reply_err(r, err);
    else
        fuse_reply_write(r, size);
}

static void op_fsync(fuse_req_t r, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
    (void)ino, (void)datasync, (void)fi;
    if (S.cut) {
        fuse_reply_err(r, EIO);
        return;
    }
    S.st.flushes++;
    if (S.arm_flushes && S.st.flushes >= S.arm_flushes) {
        cut_now(&S.armed, PC_CUT_AT_FLUSH); /* the flush does not happen */
        fuse_reply_err(r, EIO);
        return;
    }
    flush_now();
    fuse_reply_err(r, 0);
}

static void op_fallocate(fuse_req_t r, fuse_ino_t ino, int mode, off_t off, off_t len,
                         struct fuse_file_info *fi)
{
    (void)ino, (void)fi;
    uint64_t o = (uint64_t)off, n = (uint64_t)len;
    if (!(mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE))) {
        fuse_reply_err(r, 0); /* allocating: the image has every block */
        return;
    }
    if (o >= S.size)
        n = 0;
    else if (n > S.size - o)
        n = S.size - o;
    int err = n ? keep_aside(o, NULL, n) : 0;
    fuse_reply_err(r, err);
}

static void op_flush(fuse_req_t r, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)ino, (void)fi;
    fuse_reply_err(r, 0); /* a close, not a cache flush */
}

static void op_release(fuse_req_t r, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)ino, (void)fi;
    fuse_reply_err(r, 0);
}

static const struct fuse_lowlevel_ops ops = {
    .init = op_init,
    .lookup = op_lookup,
    .getattr = op_getattr,
    .open = op_open,
    .read = op_read,
    .write = op_write,
    .fsync = op_fsync,
    .fallocate = op_fallocate,
    .flush = op_flush,
    .release = op_release,
};

static void handle(struct fuse_session *se, const req *q)
{
    switch (q->op) {
    case REQ_ARM:
        S.arm_writes = q->writes ? S.st.writes + q->writes : 0;
        S.arm_flushes = q->flushes ? S.st.flushes + q->flushes : 0;
        S.armed = q->cut;
        send_msg(MSG_STATS);
        break;
    case REQ_CUT:
        if (S.cut)
            send_msg(MSG_CUT);
        else
            cut_now(&q->cut, PC_CUT_ASKED);
        break;
    case REQ_STATS:
        send_msg(MSG_STATS);
        break;
    case REQ_STOP:
        fuse_session_exit(se);
        break;
    }
}

static _Noreturn void serve(const char *image, const char *dir, int ctl)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    S.ctl = ctl;
    if ((S.image = open(image, O_RDWR | O_CLOEXEC)) < 0)
        die(image);
    struct stat sb;
    if (fstat(S.image, &sb) != 0)
        die(image);
    S.size = (uint64_t)sb.st_size;
    char *argv[] = {"powercut-disk", "-o", "fsname=powercut,subtype=powercut", NULL};
    struct fuse_args args = FUSE_ARGS_INIT(3, argv);
    struct fuse_session *se = fuse_session_new(&args, &ops, sizeof(ops), NULL);
    if (!se || fuse_session_mount(se, dir) != 0)
        die("mounting the disk's filesystem");
    send_msg(MSG_READY);
    struct fuse_buf buf = {.mem = NULL};
    struct pollfd pf[2] = {{fuse_session_fd(se), POLLIN, 0}, {ctl, POLLIN, 0}};
    while (!fuse_session_exited(se)) {
        if (poll(pf, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            die("poll");
        }
        if (pf[1].revents & (POLLIN | POLLHUP)) {
            req q;
            ssize_t n = read(ctl, &q, sizeof(q));
            if (n == 0)
                break; /* the rig is gone */
            if (n != (ssize_t)sizeof(q))
                die("the control socket");
            handle(se, &q);
            continue; /* requests before I/O: a cut asked for comes first */
        }
        if (pf[0].revents & POLLIN) {
            int n = fuse_session_receive_buf(se, &buf);
            if (n == -EINTR || n == -EAGAIN)
                continue;
            if (n <= 0)
                break;
            fuse_session_process_buf(se, &buf);
        }
    }
    free(buf.mem);
    fuse_session_unmount(se);
    fuse_session_destroy(se);
    _exit(0);
}

/* --- The rig's side ----------------------------------------------------------- */

static int read_msg(pc_disk *d, msg *m, int timeout_ms)
{
    struct pollfd pf = {d->ctl, POLLIN, 0};
    int n;
    while ((n = poll(&pf, 1, timeout_ms)) < 0 && errno == EINTR)
        ;
    if (n == 0)
        return 0;
    if (n < 0 || read(d->ctl, m, sizeof(*m)) != (ssize_t)sizeof(*m)) {
        fprintf(stderr, "powercut: the disk server is gone\n");
        return -1;
    }
    return 1;
}

static int send_req(pc_disk *d, const req *q)
{
    if (write(d->ctl, q, sizeof(*q)) != (ssize_t)sizeof(*q)) {
        fprintf(stderr, "powercut: the disk server is gone\n");
        return -1;
    }
    return 0;
}

int pc_disk_start(pc_disk *d, const char *image, const char *dir)
{
    memset(d, 0, sizeof(*d));
    snprintf(d->dir, sizeof(d->dir), "%s", dir);
    snprintf(d->file, sizeof(d->file), "%s/disk", dir);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        return -1;
    fflush(NULL);
    d->pid = fork();
    if (d->pid < 0)
        return -1;
    if (d->pid == 0) {
        close(sv[0]);
        serve(image, dir, sv[1]);
    }
    close(sv[1]);
    d->ctl = sv[0];
    msg m;
    if (read_msg(d, &m, 10000) != 1 || m.type != MSG_READY) {
        fprintf(stderr, "powercut: the disk server did not start\n");
        pc_disk_stop(d);
        return -1;
    }
    return 0;
}

int pc_disk_arm(pc_disk *d, uint64_t writes, uint64_t flushes, const pc_cut *c)
{
    req q = {.op = REQ_ARM, .writes = writes, .flushes = flushes, .cut = *c};
    msg m;
    if (send_req(d, &q) < 0)
        return -1;
    /* A cut cannot come before the reply: nothing was armed. */
    return read_msg(d, &m, 10000) == 1 && m.type == MSG_STATS ? 0 : -1;
}

int pc_disk_wait_cut(pc_disk *d, int timeout_ms, pc_disk_stats *st)
{
    msg m;
    int n = read_msg(d, &m, timeout_ms);
    if (n == 1 && m.type != MSG_CUT)
        return -1;
    if (n == 1)
        *st = m.st;
    return n;
}

int pc_disk_cut(pc_disk *d, const pc_cut *c, pc_disk_stats *st)
{
    req q = {.op = REQ_CUT, .cut = *c};
    msg m;
    if (send_req(d, &q) < 0)
        return -1;
    /* An armed cut may have come meanwhile: its message first, then the
     * reply to this request, which says the same. */
    for (;;) {
        if (read_msg(d, &m, 30000) != 1)
            return -1;
        if (m.type == MSG_CUT)
            break;
    }
    *st = m.st;
    struct pollfd pf = {d->ctl, POLLIN, 0};
    if (poll(&pf, 1, 0) == 1)
        read_msg(d, &m, 0);
    return 0;
}

int pc_disk_stats_now(pc_disk *d, pc_disk_stats *st)
{
    req q = {.op = REQ_STATS};
    msg m;
    if (send_req(d, &q) < 0 || read_msg(d, &m, 10000) != 1)
        return -1;
    *st = m.st;
    return 0;
}

void pc_disk_stop(pc_disk *d)
{
    if (d->pid <= 0)
        return;
    req q = {.op = REQ_STOP};
    if (send_req(d, &q) == 0) {
        /* It leaves once its next request (or none) is done. A lazy
         * unmount of its filesystem wakes it. */
        for (int i = 0; i < 200; i++) {
            if (waitpid(d->pid, NULL, WNOHANG) == d->pid) {
                d->pid = 0;
                break;
            }
            if (i == 20)
                umount2(d->dir, MNT_DETACH);
            usleep(10000);
        }
    }
    if (d->pid > 0) {
        kill(d->pid, SIGKILL);
        waitpid(d->pid, NULL, 0);
        umount2(d->dir, MNT_DETACH);
    }
    close(d->ctl);
    d->pid = 0;
}
