#include "aside.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctxstore.h"
#include "lock.h"
#include "syscall.h"

#ifdef CTXS_TEST_HOOKS
static atomic_bool force_named;

void ctxs__aside_force_named(bool on)
{
    atomic_store(&force_named, on);
}
#define FORCE_NAMED atomic_load(&force_named)
#else
#define FORCE_NAMED false
#endif

#ifdef O_TMPFILE
/* Whether an unnamed file can be linked by its descriptor: linkat() with
 * AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH, /proc/self/fd needs /proc. */
static bool proc_fd_available(void)
{
    static atomic_int available; /* 0: not yet known, 1: yes, -1: no */
    int a = atomic_load_explicit(&available, memory_order_relaxed);
    if (a == 0) {
        a = access("/proc/self/fd", X_OK) == 0 ? 1 : -1;
        atomic_store_explicit(&available, a, memory_order_relaxed);
    }
    return a > 0;
}

/* An unnamed file in path's directory: 0, 1 where the filesystem or the
 * kernel has no O_TMPFILE (the caller names one instead), or -errno. */
static int open_unnamed(ctxs__aside *a, const char *path, int access_mode)
{
    if (FORCE_NAMED || !proc_fd_available())
        return 1;
    char *copy = ctxs__strdup(path);
    if (!copy)
        return CTXS_ENOMEM;
    int fd = ctxs__open(dirname(copy), access_mode | O_TMPFILE | O_CLOEXEC, 0600);
    int err = errno;
    free(copy);
    if (fd < 0)
        return err == EOPNOTSUPP || err == EISDIR || err == EINVAL ? 1 : -err;
    int rc = ctxs__lock(fd, CTXS__LOCK_WRITER); /* nobody else can see it */
    if (rc < 0) {
        close(fd);
        return rc;
    }
    a->fd = fd;
    return 0;
}
#endif

/* "<path>.tmp-<pid>-<n>". A cleaner of leftovers that cannot tell our
 * create is under way (one in another pid namespace, where our pid means
 * nothing) may take the file before our lock: we take another name then. */
static int open_named(ctxs__aside *a, const char *path, int access_mode)
{
    static atomic_uint counter;
    size_t size = strlen(path) + 32;
    char *tmp = ctxs__malloc(size);
    if (!tmp)
        return CTXS_ENOMEM;
    for (int attempt = 0;; attempt++) {
        snprintf(tmp, size, "%s.tmp-%ld-%u", path, (long)getpid(), atomic_fetch_add(&counter, 1));
        int fd = ctxs__open(tmp, access_mode | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0) {
            int rc = -errno;
            free(tmp);
            return rc;
        }
        struct stat sb;
        int rc = ctxs__lock(fd, CTXS__LOCK_WRITER);
        if (rc == 0 && ctxs__fstat(fd, &sb) != 0)
            rc = -errno;
        if (rc == 0 && sb.st_nlink > 0) {
            a->fd = fd;
            a->tmp = tmp;
            return 0;
        }
        close(fd);
        ctxs__unlink(tmp); /* if a cleaner has not yet */
        if ((rc < 0 && rc != CTXS_EBUSY) || attempt == 8) {
            free(tmp);
            return rc < 0 ? rc : CTXS_EBUSY;
        }
    }
}

int ctxs__aside_open(ctxs__aside *a, const char *path, int access_mode)
{
    a->fd = -1;
    a->tmp = NULL;
#ifdef O_TMPFILE
    int rc = open_unnamed(a, path, access_mode);
    if (rc <= 0)
        return rc;
#endif
    return open_named(a, path, access_mode);
}

int ctxs__aside_link(ctxs__aside *a, const char *path)
{
    if (a->tmp)
        return ctxs__link(a->tmp, path) == 0 ? 0 : -errno;
    char self[32];
    snprintf(self, sizeof(self), "/proc/self/fd/%d", a->fd);
    return ctxs__linkat(AT_FDCWD, self, AT_FDCWD, path, AT_SYMLINK_FOLLOW) == 0 ? 0 : -errno;
}

void ctxs__aside_unname(ctxs__aside *a)
{
    if (!a->tmp)
        return;
    ctxs__unlink(a->tmp);
    free(a->tmp);
    a->tmp = NULL;
}
