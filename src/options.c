/*
 * The ctxs_*_options_init() calls: the defaults of the _INIT macros, for
 * bindings that cannot use macros (include/ctxstore.h, "Conventions").
 */
#include <string.h>

#include "ctxstore.h"
#include "last_error.h"

/* One definition per options struct: the struct's name and its macros'
 * prefix. A version other than the header's is refused, as the calls that
 * take the struct refuse it. */
#define CTXS__OPTIONS_INIT_FN(type, PREFIX)                                      \
    int type##_init(type *opts, uint32_t version)                             \
    {                                                                         \
        ctxs__error_begin();                                                  \
        CTXS__REQUIRE(opts, "%s(): opts is NULL", __func__);                  \
        CTXS__REQUIRE(version == PREFIX##_VERSION,                            \
                      "%s(): options version %u is not known to this "        \
                      "library (it knows %u)",                                \
                      __func__, (unsigned)version, (unsigned)PREFIX##_VERSION); \
        memset(opts, 0, sizeof(*opts)); /* padding too, for memcmp */         \
        *opts = (type)PREFIX##_INIT;                                          \
        return 0;                                                             \
    }

/* Version 1's bytes are version 2's, its last 28 reserved and zero. */
int ctxs_open_options_init(ctxs_open_options *opts, uint32_t version)
{
    ctxs__error_begin();
    CTXS__REQUIRE(opts, "%s(): opts is NULL", __func__);
    CTXS__REQUIRE(version == 1 || version == CTXS_OPEN_OPTIONS_VERSION,
                  "%s(): options version %u is not known to this library (it knows 1 and %u)",
                  __func__, (unsigned)version, (unsigned)CTXS_OPEN_OPTIONS_VERSION);
    memset(opts, 0, sizeof(*opts));
    *opts = (ctxs_open_options)CTXS_OPEN_OPTIONS_INIT;
    opts->version = version;
    return 0;
}

CTXS__OPTIONS_INIT_FN(ctxs_create_options, CTXS_CREATE_OPTIONS)
CTXS__OPTIONS_INIT_FN(ctxs_watcher_options, CTXS_WATCHER_OPTIONS)
CTXS__OPTIONS_INIT_FN(ctxs_store_options, CTXS_STORE_OPTIONS)
CTXS__OPTIONS_INIT_FN(ctxs_remote_options, CTXS_REMOTE_OPTIONS)
CTXS__OPTIONS_INIT_FN(ctxs_remote_push_options, CTXS_REMOTE_PUSH_OPTIONS)
CTXS__OPTIONS_INIT_FN(ctxs_remote_pull_options, CTXS_REMOTE_PULL_OPTIONS)
CTXS__OPTIONS_INIT_FN(ctxs_store_compact_options, CTXS_STORE_COMPACT_OPTIONS)
CTXS__OPTIONS_INIT_FN(ctxs_store_session_export_options, CTXS_STORE_SESSION_EXPORT_OPTIONS)
CTXS__OPTIONS_INIT_FN(ctxs_store_session_import_options, CTXS_STORE_SESSION_IMPORT_OPTIONS)
