/*
 * The calling thread's last error: the code a call returned and, in one
 * sentence, why (ctxs_get_last_error()). Every part of the library -- the
 * store, the index, the remote tier, the kernels -- says why through
 * ctxs__error(); a public call starts by clearing it (ctxs__error_begin()),
 * so that what a caller reads after a failure is that failure's reason and
 * never an older one's.
 */
#ifndef CTXS_LAST_ERROR_H
#define CTXS_LAST_ERROR_H

/* Records rc with the reason fmt says (printf-style), for the calling
 * thread, and returns rc, so that a failure reads
 *     return ctxs__error(CTXS_EINVAL, "n is 0: commit at least one token");
 * rc 0 clears. Never fails; a reason longer than the buffer is cut. */
int ctxs__error(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* At the start of every public call: the thread's last error is cleared.
 * One thread-local store. */
void ctxs__error_begin(void);

/* The code of the thread's last recorded error (0: none since the last
 * ctxs__error_begin()). For a caller that adds to a reason an inner call
 * gave (ctxs__error_more()). */
int ctxs__error_code(void);

/* As ctxs__error(), keeping the reason an inner call recorded (whatever
 * its code) after the new text: "<new>: <inner reason>"; just the new
 * text when there is none. */
int ctxs__error_more(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Where a call returns an error it got from an inner one that may have
 * said nothing (a -errno from deep down): when the thread holds no reason
 * for rc, records the one fmt says; otherwise keeps the inner reason.
 * Returns rc. */
int ctxs__error_default(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The argument checks at the API boundary, once (dav1d's validate.h): a
 * refused argument is CTXS_EINVAL, with the rule it broke said as fmt says
 * (CTXS__REQUIRE), or as the condition reads in the code (CTXS__CHECK:
 * "ctxs_session_get_kv(): the arguments break 'layer < n_layers'"). */
#define CTXS__REQUIRE(cond, ...)                                               \
    do {                                                                       \
        if (!(cond))                                                           \
            return ctxs__error(CTXS_EINVAL, __VA_ARGS__);                       \
    } while (0)
#define CTXS__CHECK(cond)                                                      \
    CTXS__REQUIRE(cond, "%s(): the arguments break '%s'", __func__, #cond)

#endif
