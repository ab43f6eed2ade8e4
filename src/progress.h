/*
 * The options of the long operations that report progress
 * (ctxs_store_compact, ctxs_store_session_export, _import): one struct per
 * call in the public header, each laid out alike, checked here once.
 */
#ifndef CTXS_PROGRESS_H
#define CTXS_PROGRESS_H

#include <stddef.h>
#include <stdint.h>

#include "ctxstore.h"

/* The progress callback an operation calls, from its options. */
typedef struct ctxs__progress {
    ctxs_progress_fn fn; /* NULL: none */
    void *arg;
} ctxs__progress;

/* Checks the fields of an options struct (what names it in messages, init
 * its _INIT macro) and sets *out from them. Errors: CTXS_EINVAL, with the
 * last error saying why (a version other than known, reserved bytes not
 * zero). */
int ctxs__progress_options(ctxs__progress *out, const char *what, const char *init,
                           uint32_t version, uint32_t known, uint32_t reserved0,
                           const uint8_t *reserved, size_t n_reserved, ctxs_progress_fn fn,
                           void *arg);

/* *out from opts, a pointer to one of those structs (NULL: the defaults,
 * no progress), VERSION and INIT its macros; returns the error from the
 * calling function when they do not hold. */
#define CTXS__PROGRESS_FROM(out, opts, VERSION, INIT, what)                               \
    do {                                                                                  \
        int rc_ = (opts) ? ctxs__progress_options((out), (what), #INIT, (opts)->version,   \
                                                  (VERSION), (opts)->reserved0,          \
                                                  (opts)->reserved,                      \
                                                  sizeof((opts)->reserved),              \
                                                  (opts)->progress, (opts)->progress_arg) \
                         : ((out)->fn = NULL, (out)->arg = NULL, 0);                     \
        if (rc_ < 0)                                                                      \
            return rc_;                                                                   \
    } while (0)

#endif
