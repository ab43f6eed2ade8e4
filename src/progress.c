/*
 * The options of the long operations that report progress (progress.h),
 * and their _options_init() functions.
 */
#include <stddef.h>
#include <string.h>

#include "last_error.h"
#include "progress.h"

int ctxs__progress_options(ctxs__progress *out, const char *what, const char *init,
                           uint32_t version, uint32_t known, uint32_t reserved0,
                           const uint8_t *reserved, size_t n_reserved, ctxs_progress_fn fn,
                           void *arg)
{
    out->fn = NULL;
    out->arg = NULL;
    if (version != known)
        return ctxs__error(CTXS_EINVAL, "%s: version is %u, not %u: start from %s", what,
                           version, known, init);
    int zero = reserved0 == 0;
    for (size_t i = 0; i < n_reserved; i++)
        zero &= reserved[i] == 0;
    if (!zero)
        return ctxs__error(CTXS_EINVAL, "%s: the reserved bytes must be zero", what);
    out->fn = fn;
    out->arg = arg;
    return 0;
}

int ctxs__progress_options_init(void *opts, size_t size, uint32_t version, uint32_t known,
                                const char *what)
{
    ctxs__error_begin();
    CTXS__REQUIRE(opts, "%s: NULL to fill", what);
    CTXS__REQUIRE(version == known, "%s: version %u is unknown; this library knows %u", what,
                  version, known);
    memset(opts, 0, size);
    memcpy(opts, &version, sizeof(version));
    return 0;
}

/* Each struct starts with its version, which ctxs__progress_options_init()
 * writes at offset 0. */
_Static_assert(offsetof(ctxs_store_compact_options, version) == 0, "version first");
_Static_assert(offsetof(ctxs_store_session_export_options, version) == 0, "version first");
_Static_assert(offsetof(ctxs_store_session_import_options, version) == 0, "version first");

int ctxs_store_compact_options_init(ctxs_store_compact_options *opts, uint32_t version)
{
    return ctxs__progress_options_init(opts, sizeof(*opts), version,
                                       CTXS_STORE_COMPACT_OPTIONS_VERSION, "compact options");
}

int ctxs_store_session_export_options_init(ctxs_store_session_export_options *opts,
                                           uint32_t version)
{
    return ctxs__progress_options_init(opts, sizeof(*opts), version,
                                       CTXS_STORE_SESSION_EXPORT_OPTIONS_VERSION,
                                       "export options");
}

int ctxs_store_session_import_options_init(ctxs_store_session_import_options *opts,
                                           uint32_t version)
{
    return ctxs__progress_options_init(opts, sizeof(*opts), version,
                                       CTXS_STORE_SESSION_IMPORT_OPTIONS_VERSION,
                                       "import options");
}
