/*
 * The options of the long operations that report progress (progress.h);
 * their _options_init() functions are in options.c.
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
