#include "lock.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "ctxstore.h"
#include "last_error.h"
#include "syscall.h"

#ifdef F_OFD_SETLK
#define SETLK F_OFD_SETLK
#define GETLK F_OFD_GETLK
#else
/* Process-associated locks: correct across processes, but closing any
 * descriptor of the file in this process drops them. */
#define SETLK F_SETLK
#define GETLK F_GETLK
#endif

int ctxs__lock(int fd, enum ctxs__lock_kind kind)
{
    struct flock fl;
    memset(&fl, 0, sizeof(fl));
    fl.l_whence = SEEK_SET;
    switch (kind) {
    case CTXS__LOCK_WRITER:
        fl.l_type = F_WRLCK;
        fl.l_start = 0;
        fl.l_len = 1;
        break;
    case CTXS__LOCK_READER:
        fl.l_type = F_RDLCK;
        fl.l_start = 1;
        fl.l_len = 1;
        break;
    case CTXS__LOCK_EXCLUSIVE:
        fl.l_type = F_WRLCK;
        fl.l_start = 0;
        fl.l_len = 2;
        break;
    }
    if (ctxs__fcntl_lock(fd, SETLK, &fl) == 0)
        return 0;
    return (errno == EAGAIN || errno == EACCES) ? CTXS_EBUSY : -errno;
}

int ctxs__lock_probe(int fd, enum ctxs__lock_kind kind)
{
    /* Asking for the lock that conflicts with the one looked for: a read
     * lock on byte 0 meets only a writer, a write lock on byte 1 meets any
     * reader. */
    struct flock fl;
    memset(&fl, 0, sizeof(fl));
    fl.l_whence = SEEK_SET;
    fl.l_type = kind == CTXS__LOCK_WRITER ? F_RDLCK : F_WRLCK;
    fl.l_start = kind == CTXS__LOCK_WRITER ? 0 : 1;
    fl.l_len = 1;
    if (ctxs__fcntl_lock(fd, GETLK, &fl) != 0)
        return -errno;
    return fl.l_type != F_UNLCK;
}

#ifdef __linux__
/* Whether /proc/<pid>/fdinfo/<fd> shows a lock of kind on device dev,
 * inode ino: "lock:\t1: OFDLCK ADVISORY  WRITE -1 fe:00:10952740 0 0"
 * (the lock's type, then the file as major:minor:inode, then its first
 * and last byte). */
static int fdinfo_holds(const char *path, const char *file, enum ctxs__lock_kind kind)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    char line[256];
    int found = 0;
    while (!found && fgets(line, sizeof(line), f)) {
        if (strncmp(line, "lock:", 5) != 0 || !strstr(line, file))
            continue;
        const char *type = kind == CTXS__LOCK_READER ? " READ " : " WRITE ";
        const char *range = kind == CTXS__LOCK_WRITER   ? " 0 0"
                            : kind == CTXS__LOCK_READER ? " 1 1"
                                                        : " 0 1";
        const char *after = strstr(line, file) + strlen(file);
        found = strstr(line, type) && strncmp(after, range, strlen(range)) == 0;
    }
    fclose(f);
    return found;
}
#endif

int ctxs__lock_holder(int fd, enum ctxs__lock_kind kind, char *name, size_t n)
{
    if (n)
        name[0] = '\0';
#ifdef __linux__
    struct stat want;
    if (fstat(fd, &want) != 0)
        return 0;
    char file[64];
    snprintf(file, sizeof(file), " %02x:%02x:%lu", major(want.st_dev), minor(want.st_dev),
             (unsigned long)want.st_ino);
    DIR *proc = opendir("/proc");
    if (!proc)
        return 0;
    int holder = 0;
    struct dirent *p;
    while (!holder && (p = readdir(proc))) {
        if (!isdigit((unsigned char)p->d_name[0]))
            continue;
        char path[600];
        snprintf(path, sizeof(path), "/proc/%s/fd", p->d_name);
        DIR *fds = opendir(path);
        if (!fds)
            continue;
        struct dirent *e;
        while (!holder && (e = readdir(fds))) {
            struct stat sb;
            if (e->d_name[0] == '.')
                continue;
            snprintf(path, sizeof(path), "/proc/%s/fd/%s", p->d_name, e->d_name);
            if (stat(path, &sb) != 0 || sb.st_dev != want.st_dev || sb.st_ino != want.st_ino)
                continue;
            snprintf(path, sizeof(path), "/proc/%s/fdinfo/%s", p->d_name, e->d_name);
            if (fdinfo_holds(path, file, kind))
                holder = atoi(p->d_name);
        }
        closedir(fds);
    }
    closedir(proc);
    if (holder && n) {
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/comm", holder);
        FILE *f = fopen(path, "re");
        if (f) {
            if (fgets(name, (int)n, f))
                name[strcspn(name, "\n")] = '\0';
            fclose(f);
        }
    }
    return holder;
#else
    (void)fd;
    (void)kind;
    return 0;
#endif
}

int ctxs__lock_busy(int fd, const char *what, int readonly)
{
    char name[64];
    /* A reader is kept out only by a delete, gc or compact, which hold
     * both bytes; a writer by another writer (or by one of those). */
    enum ctxs__lock_kind kind = readonly ? CTXS__LOCK_EXCLUSIVE : CTXS__LOCK_WRITER;
    int pid = ctxs__lock_holder(fd, kind, name, sizeof(name));
    if (!pid && !readonly) {
        kind = CTXS__LOCK_EXCLUSIVE;
        pid = ctxs__lock_holder(fd, kind, name, sizeof(name));
    }
    const char *who = kind == CTXS__LOCK_WRITER ? "is open by another writer"
                                                : "is being deleted, compacted or collected";
    if (pid)
        return ctxs__error(CTXS_EBUSY, "%s %s: process %d (%s)%s", what, who, pid,
                           name[0] ? name : "?", pid == getpid() ? ", this one" : "");
    return ctxs__error(CTXS_EBUSY, "%s %s (a process this one cannot see into)", what, who);
}
