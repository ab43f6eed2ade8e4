#include "lock.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>

#include "ctxstore.h"
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
