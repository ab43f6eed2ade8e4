#include <errno.h>
#include <string.h>

#include "ctxstore.h"

const char *ctxs_strerror(int rc)
{
    if (rc == 0)
        return "success";
    switch (rc) {
#define CTXS_ERR_TEXT_(name, value, text) case value: return text;
        CTXS_ERRNO_MAP(CTXS_ERR_TEXT_)
#undef CTXS_ERR_TEXT_
    }
    if (rc < 0 && rc > -4096)
        return strerror(-rc); /* glibc and musl return static strings */
    return "unknown error";
}

const char *ctxs_err_name(int rc)
{
    if (rc == 0)
        return "OK";
    switch (rc) {
#define CTXS_ERR_NAME_(name, value, text) case value: return "CTXS_E" #name;
        CTXS_ERRNO_MAP(CTXS_ERR_NAME_)
#undef CTXS_ERR_NAME_
    }
    if (rc < 0 && rc > -4096) {
#define ERRNO_NAME_(e) case -e: return #e;
        switch (rc) {
            ERRNO_NAME_(EPERM) ERRNO_NAME_(ENOENT) ERRNO_NAME_(EINTR)
            ERRNO_NAME_(EIO) ERRNO_NAME_(EBADF) ERRNO_NAME_(EAGAIN)
            ERRNO_NAME_(ENOMEM) ERRNO_NAME_(EACCES) ERRNO_NAME_(EEXIST)
            ERRNO_NAME_(ENOTDIR) ERRNO_NAME_(EISDIR) ERRNO_NAME_(EINVAL)
            ERRNO_NAME_(EMFILE) ERRNO_NAME_(EFBIG) ERRNO_NAME_(ENOSPC)
            ERRNO_NAME_(EROFS) ERRNO_NAME_(ENAMETOOLONG) ERRNO_NAME_(ELOOP)
            ERRNO_NAME_(ENOTSUP) ERRNO_NAME_(EALREADY) ERRNO_NAME_(EDQUOT)
            ERRNO_NAME_(ERANGE)
        }
#undef ERRNO_NAME_
        return "ERRNO";
    }
    return "UNKNOWN";
}
