/*
 * What the rig needs of the machine: loop devices, filesystems made in
 * image files, mounts in a private namespace, programs run quietly, and the
 * reasons why it cannot run here.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/loop.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "powercut.h"

#define SBIN_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

uint64_t pc_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Whether the program is in SBIN_PATH. */
static int have_program(const char *name)
{
    char path[256], dirs[] = SBIN_PATH, *save = NULL;
    for (char *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(path, sizeof(path), "%s/%s", d, name);
        if (access(path, X_OK) == 0)
            return 1;
    }
    return 0;
}

/* Whether the kernel has fs, or can load it (a module it lists). */
static int have_fs(const char *fs)
{
    FILE *f = fopen("/proc/filesystems", "re");
    char line[256];
    int found = 0;
    while (f && !found && fgets(line, sizeof(line), f)) {
        char *t = strrchr(line, '\t');
        t = t ? t + 1 : line;
        t[strcspn(t, "\n")] = '\0';
        found = strcmp(t, fs) == 0;
    }
    if (f)
        fclose(f);
    if (!found) {
        char mod[128];
        snprintf(mod, sizeof(mod), "/sys/module/%s", fs);
        found = access(mod, F_OK) == 0;
    }
    return found;
}

const char *pc_cannot_run(const char *fs)
{
    static char why[256];
    if (geteuid() != 0)
        return "not root: loop devices and mounts need it";
    if (access("/dev/fuse", R_OK | W_OK) != 0) {
        snprintf(why, sizeof(why), "no /dev/fuse (%s): the disk is a FUSE server", strerror(errno));
        return why;
    }
    if (access("/dev/loop-control", R_OK | W_OK) != 0) {
        snprintf(why, sizeof(why), "no /dev/loop-control (%s): the disk is a loop device",
                 strerror(errno));
        return why;
    }
    if (!have_fs("fuse"))
        return "the kernel has no FUSE";
    if (!fs)
        return NULL;
    const char *mkfs = strcmp(fs, "ext4") == 0  ? "mkfs.ext4"
                       : strcmp(fs, "xfs") == 0 ? "mkfs.xfs"
                                                : "mkfs.btrfs";
    if (!have_program(mkfs)) {
        snprintf(why, sizeof(why), "%s is not installed (%s)", mkfs,
                 strcmp(fs, "ext4") == 0  ? "e2fsprogs"
                 : strcmp(fs, "xfs") == 0 ? "xfsprogs"
                                          : "btrfs-progs");
        return why;
    }
    if (!have_fs(fs)) {
        snprintf(why, sizeof(why), "the kernel has no %s", fs);
        return why;
    }
    return NULL;
}

int pc_private_mounts(void)
{
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
        fprintf(stderr, "powercut: a private mount namespace: %s\n", strerror(errno));
        return -1;
    }
    return 0;
}

int pc_run(char *const argv[])
{
    char out[4200];
    const char *tmp = getenv("TMPDIR");
    snprintf(out, sizeof(out), "%s/powercut-run-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    int log = mkstemp(out);
    if (log >= 0)
        unlink(out);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int null = open("/dev/null", O_RDONLY);
        dup2(null, 0);
        if (log >= 0) {
            dup2(log, 1);
            dup2(log, 2);
        }
        setenv("PATH", SBIN_PATH, 1);
        execvp(argv[0], argv);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (rc != 0 && rc != 127 && log >= 0) {
        char buf[4096];
        ssize_t n = pread(log, buf, sizeof(buf) - 1, 0);
        buf[n > 0 ? n : 0] = '\0';
        fprintf(stderr, "powercut: `%s` exited %d:\n%s\n", argv[0], rc, buf);
    }
    if (log >= 0)
        close(log);
    return rc;
}

int pc_mkfs(const char *fs, const char *image)
{
    /* The smallest each will make (xfsprogs 5.19 on refuse less than
     * 300 MiB); sparse, so only what mkfs writes takes space. */
    uint64_t size = strcmp(fs, "xfs") == 0 ? 300ull << 20 : strcmp(fs, "btrfs") == 0 ? 256ull << 20
                                                                                    : 128ull << 20;
    int fd = open(image, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        fprintf(stderr, "powercut: %s: %s\n", image, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    char img[4096];
    snprintf(img, sizeof(img), "%s", image);
    int rc;
    if (strcmp(fs, "ext4") == 0) {
        char *argv[] = {"mkfs.ext4", "-q", "-F", "-E", "nodiscard", "-b", "4096", img, NULL};
        rc = pc_run(argv);
    } else if (strcmp(fs, "xfs") == 0) {
        char *argv[] = {"mkfs.xfs", "-q", "-f", "-K", img, NULL};
        rc = pc_run(argv);
    } else {
        char *argv[] = {"mkfs.btrfs", "-q", "-f", "-K", img, NULL};
        rc = pc_run(argv);
    }
    return rc == 0 ? 0 : -1;
}

int pc_copy_sparse(const char *from, const char *to)
{
    int in = open(from, O_RDONLY | O_CLOEXEC);
    int out = open(to, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    struct stat sb;
    int rc = in >= 0 && out >= 0 && fstat(in, &sb) == 0 && ftruncate(out, sb.st_size) == 0 ? 0 : -1;
    static char buf[1 << 20];
    for (off_t at = 0; rc == 0;) {
        off_t data = lseek(in, at, SEEK_DATA);
        if (data < 0)
            break; /* ENXIO: no data after at */
        off_t hole = lseek(in, data, SEEK_HOLE);
        for (off_t p = data; rc == 0 && p < hole;) {
            size_t n = (size_t)(hole - p) < sizeof(buf) ? (size_t)(hole - p) : sizeof(buf);
            ssize_t r = pread(in, buf, n, p);
            if (r <= 0 || pwrite(out, buf, (size_t)r, p) != r)
                rc = -1;
            p += r > 0 ? r : 0;
        }
        at = hole;
    }
    if (rc != 0)
        fprintf(stderr, "powercut: copying %s to %s: %s\n", from, to, strerror(errno));
    if (in >= 0)
        close(in);
    if (out >= 0)
        close(out);
    return rc;
}

int pc_loop_attach(const char *file, int direct, char dev[32])
{
    int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
    int back = open(file, O_RDWR | O_CLOEXEC | (direct ? O_DIRECT : 0));
    if (ctl < 0 || back < 0) {
        fprintf(stderr, "powercut: %s: %s\n", ctl < 0 ? "/dev/loop-control" : file,
                strerror(errno));
        goto fail;
    }
    /* Others may take a free device between GET_FREE and CONFIGURE. */
    for (int tries = 0; tries < 50; tries++) {
        int n = ioctl(ctl, LOOP_CTL_GET_FREE);
        if (n < 0)
            break;
        snprintf(dev, 32, "/dev/loop%d", n);
        int fd = open(dev, O_RDWR | O_CLOEXEC);
        if (fd < 0)
            continue;
        struct loop_config cfg;
        memset(&cfg, 0, sizeof(cfg));
        cfg.fd = (uint32_t)back;
        cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR | (direct ? LO_FLAGS_DIRECT_IO : 0);
        snprintf((char *)cfg.info.lo_file_name, sizeof(cfg.info.lo_file_name), "powercut");
        if (ioctl(fd, LOOP_CONFIGURE, &cfg) == 0) {
            close(back);
            close(ctl);
            return fd;
        }
        int e = errno;
        close(fd);
        if (e != EBUSY) {
            errno = e;
            fprintf(stderr, "powercut: LOOP_CONFIGURE of %s: %s\n", dev, strerror(e));
            goto fail;
        }
    }
    fprintf(stderr, "powercut: no free loop device: %s\n", strerror(errno));
fail:
    if (ctl >= 0)
        close(ctl);
    if (back >= 0)
        close(back);
    return -1;
}

int pc_mount(const char *dev, const char *fs, const char *dir)
{
    /* No discard: every change the filesystem makes is a write. */
    const char *opts = strcmp(fs, "btrfs") == 0 ? "nodiscard" : NULL;
    return mount(dev, dir, fs, MS_NOATIME, opts);
}

int pc_umount(const char *dir)
{
    for (int i = 0; i < 50; i++) {
        if (umount2(dir, 0) == 0)
            return 0;
        if (errno != EBUSY)
            break;
        usleep(20000);
    }
    return umount2(dir, MNT_DETACH);
}
