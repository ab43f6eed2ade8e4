#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctxstore.h"
#include "last_error.h"
#include "platform.h"

/* The calling thread's last error (last_error.h). 512 bytes: a reason
 * names a path or two and a rule. */
static _Thread_local struct {
    int code;
    char text[512];
} g_last;

static int set_v(int rc, const char *fmt, va_list ap)
{
    g_last.code = rc;
    if (rc == 0 || !fmt) {
        g_last.text[0] = '\0';
        return rc;
    }
    char text[sizeof(g_last.text)];
    vsnprintf(text, sizeof(text), fmt, ap);
    memcpy(g_last.text, text, sizeof(text));
    return rc;
}

int ctxs__error(int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_v(rc, fmt, ap);
    va_end(ap);
    return rc;
}

void ctxs__error_begin(void)
{
    g_last.code = 0;
    g_last.text[0] = '\0';
}

int ctxs__error_code(void)
{
    return g_last.code;
}

int ctxs__error_more(int rc, const char *fmt, ...)
{
    char inner[sizeof(g_last.text)] = "";
    if (g_last.code != 0 && g_last.text[0])
        memcpy(inner, g_last.text, sizeof(inner));
    char text[sizeof(g_last.text)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    if (inner[0])
        return ctxs__error(rc, "%s: %s", text, inner);
    return ctxs__error(rc, "%s", text);
}

int ctxs__error_default(int rc, const char *fmt, ...)
{
    if (g_last.code == rc && g_last.text[0])
        return rc;
    va_list ap;
    va_start(ap, fmt);
    set_v(rc, fmt, ap);
    va_end(ap);
    return rc;
}

const char *ctxs_get_last_error(void)
{
    return g_last.text;
}

int ctxs_get_last_error_code(void)
{
    return g_last.code;
}

int ctxs_set_last_error(int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_v(rc, fmt, ap);
    va_end(ap);
    return rc;
}

/* Whatever the library allocated for the caller (lists, reports), from
 * any part of it: one allocator, so one release. */
void ctxs_free(void *p)
{
    free(p);
}

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

/* Every errno name of Linux (1..133), then those of the BSDs and Apple,
 * each where the platform has it. Aliases (EWOULDBLOCK, ENOTSUP where it is
 * EOPNOTSUPP, EDEADLOCK) come after the name glibc gives the value, and the
 * first match wins: a table, not a switch, where two names share a value. */
static const struct {
    int value;
    const char *name;
} k_errnos[] = {
#define E_(e) { e, #e },
#ifdef EPERM
    E_(EPERM)
#endif
#ifdef ENOENT
    E_(ENOENT)
#endif
#ifdef ESRCH
    E_(ESRCH)
#endif
#ifdef EINTR
    E_(EINTR)
#endif
#ifdef EIO
    E_(EIO)
#endif
#ifdef ENXIO
    E_(ENXIO)
#endif
#ifdef E2BIG
    E_(E2BIG)
#endif
#ifdef ENOEXEC
    E_(ENOEXEC)
#endif
#ifdef EBADF
    E_(EBADF)
#endif
#ifdef ECHILD
    E_(ECHILD)
#endif
#ifdef EAGAIN
    E_(EAGAIN)
#endif
#ifdef ENOMEM
    E_(ENOMEM)
#endif
#ifdef EACCES
    E_(EACCES)
#endif
#ifdef EFAULT
    E_(EFAULT)
#endif
#ifdef ENOTBLK
    E_(ENOTBLK)
#endif
#ifdef EBUSY
    E_(EBUSY)
#endif
#ifdef EEXIST
    E_(EEXIST)
#endif
#ifdef EXDEV
    E_(EXDEV)
#endif
#ifdef ENODEV
    E_(ENODEV)
#endif
#ifdef ENOTDIR
    E_(ENOTDIR)
#endif
#ifdef EISDIR
    E_(EISDIR)
#endif
#ifdef EINVAL
    E_(EINVAL)
#endif
#ifdef ENFILE
    E_(ENFILE)
#endif
#ifdef EMFILE
    E_(EMFILE)
#endif
#ifdef ENOTTY
    E_(ENOTTY)
#endif
#ifdef ETXTBSY
    E_(ETXTBSY)
#endif
#ifdef EFBIG
    E_(EFBIG)
#endif
#ifdef ENOSPC
    E_(ENOSPC)
#endif
#ifdef ESPIPE
    E_(ESPIPE)
#endif
#ifdef EROFS
    E_(EROFS)
#endif
#ifdef EMLINK
    E_(EMLINK)
#endif
#ifdef EPIPE
    E_(EPIPE)
#endif
#ifdef EDOM
    E_(EDOM)
#endif
#ifdef ERANGE
    E_(ERANGE)
#endif
#ifdef EDEADLK
    E_(EDEADLK)
#endif
#ifdef ENAMETOOLONG
    E_(ENAMETOOLONG)
#endif
#ifdef ENOLCK
    E_(ENOLCK)
#endif
#ifdef ENOSYS
    E_(ENOSYS)
#endif
#ifdef ENOTEMPTY
    E_(ENOTEMPTY)
#endif
#ifdef ELOOP
    E_(ELOOP)
#endif
#ifdef ENOMSG
    E_(ENOMSG)
#endif
#ifdef EIDRM
    E_(EIDRM)
#endif
#ifdef ECHRNG
    E_(ECHRNG)
#endif
#ifdef EL2NSYNC
    E_(EL2NSYNC)
#endif
#ifdef EL3HLT
    E_(EL3HLT)
#endif
#ifdef EL3RST
    E_(EL3RST)
#endif
#ifdef ELNRNG
    E_(ELNRNG)
#endif
#ifdef EUNATCH
    E_(EUNATCH)
#endif
#ifdef ENOCSI
    E_(ENOCSI)
#endif
#ifdef EL2HLT
    E_(EL2HLT)
#endif
#ifdef EBADE
    E_(EBADE)
#endif
#ifdef EBADR
    E_(EBADR)
#endif
#ifdef EXFULL
    E_(EXFULL)
#endif
#ifdef ENOANO
    E_(ENOANO)
#endif
#ifdef EBADRQC
    E_(EBADRQC)
#endif
#ifdef EBADSLT
    E_(EBADSLT)
#endif
#ifdef EBFONT
    E_(EBFONT)
#endif
#ifdef ENOSTR
    E_(ENOSTR)
#endif
#ifdef ENODATA
    E_(ENODATA)
#endif
#ifdef ETIME
    E_(ETIME)
#endif
#ifdef ENOSR
    E_(ENOSR)
#endif
#ifdef ENONET
    E_(ENONET)
#endif
#ifdef ENOPKG
    E_(ENOPKG)
#endif
#ifdef EREMOTE
    E_(EREMOTE)
#endif
#ifdef ENOLINK
    E_(ENOLINK)
#endif
#ifdef EADV
    E_(EADV)
#endif
#ifdef ESRMNT
    E_(ESRMNT)
#endif
#ifdef ECOMM
    E_(ECOMM)
#endif
#ifdef EPROTO
    E_(EPROTO)
#endif
#ifdef EMULTIHOP
    E_(EMULTIHOP)
#endif
#ifdef EDOTDOT
    E_(EDOTDOT)
#endif
#ifdef EBADMSG
    E_(EBADMSG)
#endif
#ifdef EOVERFLOW
    E_(EOVERFLOW)
#endif
#ifdef ENOTUNIQ
    E_(ENOTUNIQ)
#endif
#ifdef EBADFD
    E_(EBADFD)
#endif
#ifdef EREMCHG
    E_(EREMCHG)
#endif
#ifdef ELIBACC
    E_(ELIBACC)
#endif
#ifdef ELIBBAD
    E_(ELIBBAD)
#endif
#ifdef ELIBSCN
    E_(ELIBSCN)
#endif
#ifdef ELIBMAX
    E_(ELIBMAX)
#endif
#ifdef ELIBEXEC
    E_(ELIBEXEC)
#endif
#ifdef EILSEQ
    E_(EILSEQ)
#endif
#ifdef ERESTART
    E_(ERESTART)
#endif
#ifdef ESTRPIPE
    E_(ESTRPIPE)
#endif
#ifdef EUSERS
    E_(EUSERS)
#endif
#ifdef ENOTSOCK
    E_(ENOTSOCK)
#endif
#ifdef EDESTADDRREQ
    E_(EDESTADDRREQ)
#endif
#ifdef EMSGSIZE
    E_(EMSGSIZE)
#endif
#ifdef EPROTOTYPE
    E_(EPROTOTYPE)
#endif
#ifdef ENOPROTOOPT
    E_(ENOPROTOOPT)
#endif
#ifdef EPROTONOSUPPORT
    E_(EPROTONOSUPPORT)
#endif
#ifdef ESOCKTNOSUPPORT
    E_(ESOCKTNOSUPPORT)
#endif
#ifdef EOPNOTSUPP
    E_(EOPNOTSUPP)
#endif
#ifdef EPFNOSUPPORT
    E_(EPFNOSUPPORT)
#endif
#ifdef EAFNOSUPPORT
    E_(EAFNOSUPPORT)
#endif
#ifdef EADDRINUSE
    E_(EADDRINUSE)
#endif
#ifdef EADDRNOTAVAIL
    E_(EADDRNOTAVAIL)
#endif
#ifdef ENETDOWN
    E_(ENETDOWN)
#endif
#ifdef ENETUNREACH
    E_(ENETUNREACH)
#endif
#ifdef ENETRESET
    E_(ENETRESET)
#endif
#ifdef ECONNABORTED
    E_(ECONNABORTED)
#endif
#ifdef ECONNRESET
    E_(ECONNRESET)
#endif
#ifdef ENOBUFS
    E_(ENOBUFS)
#endif
#ifdef EISCONN
    E_(EISCONN)
#endif
#ifdef ENOTCONN
    E_(ENOTCONN)
#endif
#ifdef ESHUTDOWN
    E_(ESHUTDOWN)
#endif
#ifdef ETOOMANYREFS
    E_(ETOOMANYREFS)
#endif
#ifdef ETIMEDOUT
    E_(ETIMEDOUT)
#endif
#ifdef ECONNREFUSED
    E_(ECONNREFUSED)
#endif
#ifdef EHOSTDOWN
    E_(EHOSTDOWN)
#endif
#ifdef EHOSTUNREACH
    E_(EHOSTUNREACH)
#endif
#ifdef EALREADY
    E_(EALREADY)
#endif
#ifdef EINPROGRESS
    E_(EINPROGRESS)
#endif
#ifdef ESTALE
    E_(ESTALE)
#endif
#ifdef EUCLEAN
    E_(EUCLEAN)
#endif
#ifdef ENOTNAM
    E_(ENOTNAM)
#endif
#ifdef ENAVAIL
    E_(ENAVAIL)
#endif
#ifdef EISNAM
    E_(EISNAM)
#endif
#ifdef EREMOTEIO
    E_(EREMOTEIO)
#endif
#ifdef EDQUOT
    E_(EDQUOT)
#endif
#ifdef ENOMEDIUM
    E_(ENOMEDIUM)
#endif
#ifdef EMEDIUMTYPE
    E_(EMEDIUMTYPE)
#endif
#ifdef ECANCELED
    E_(ECANCELED)
#endif
#ifdef ENOKEY
    E_(ENOKEY)
#endif
#ifdef EKEYEXPIRED
    E_(EKEYEXPIRED)
#endif
#ifdef EKEYREVOKED
    E_(EKEYREVOKED)
#endif
#ifdef EKEYREJECTED
    E_(EKEYREJECTED)
#endif
#ifdef EOWNERDEAD
    E_(EOWNERDEAD)
#endif
#ifdef ENOTRECOVERABLE
    E_(ENOTRECOVERABLE)
#endif
#ifdef ERFKILL
    E_(ERFKILL)
#endif
#ifdef EHWPOISON
    E_(EHWPOISON)
#endif
#ifdef ENOTSUP
    E_(ENOTSUP)
#endif
#ifdef EWOULDBLOCK
    E_(EWOULDBLOCK)
#endif
#ifdef EDEADLOCK
    E_(EDEADLOCK)
#endif
#ifdef EAUTH
    E_(EAUTH)
#endif
#ifdef EBADARCH
    E_(EBADARCH)
#endif
#ifdef EBADEXEC
    E_(EBADEXEC)
#endif
#ifdef EBADMACHO
    E_(EBADMACHO)
#endif
#ifdef EBADRPC
    E_(EBADRPC)
#endif
#ifdef EDEVERR
    E_(EDEVERR)
#endif
#ifdef EFTYPE
    E_(EFTYPE)
#endif
#ifdef ENEEDAUTH
    E_(ENEEDAUTH)
#endif
#ifdef ENOATTR
    E_(ENOATTR)
#endif
#ifdef ENOPOLICY
    E_(ENOPOLICY)
#endif
#ifdef EPROCLIM
    E_(EPROCLIM)
#endif
#ifdef EPROCUNAVAIL
    E_(EPROCUNAVAIL)
#endif
#ifdef EPROGMISMATCH
    E_(EPROGMISMATCH)
#endif
#ifdef EPROGUNAVAIL
    E_(EPROGUNAVAIL)
#endif
#ifdef EPWROFF
    E_(EPWROFF)
#endif
#ifdef ESHLIBVERS
    E_(ESHLIBVERS)
#endif
#ifdef EQFULL
    E_(EQFULL)
#endif
#ifdef EINTEGRITY
    E_(EINTEGRITY)
#endif
#ifdef ECAPMODE
    E_(ECAPMODE)
#endif
#ifdef ENOTCAPABLE
    E_(ENOTCAPABLE)
#endif
#undef E_
};

const char *ctxs__errno_name(int e)
{
    for (size_t i = 0; i < sizeof(k_errnos) / sizeof(k_errnos[0]); i++)
        if (k_errnos[i].value == e)
            return k_errnos[i].name;
    return NULL;
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
        const char *name = NULL;
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
        name = strerrorname_np(-rc); /* static; NULL for a value of no errno */
#endif
        if (!name)
            name = ctxs__errno_name(-rc);
        return name ? name : "ERRNO";
    }
    return "UNKNOWN";
}
