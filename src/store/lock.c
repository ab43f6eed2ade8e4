#include "lock.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>

#include "ctxstore.h"

#ifdef F_OFD_SETLK
#define SETLK F_OFD_SETLK
#else
/* Process-associated locks: correct across processes, but closing any
 * descriptor of the file in this process drops them. */
#define SETLK F_SETLK
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
    for (;;) {
        if (fcntl(fd, SETLK, &fl) == 0)
            return 0;
        if (errno == EINTR)
            continue;
        return (errno == EAGAIN || errno == EACCES) ? CTXS_EBUSY : -errno;
    }
}
