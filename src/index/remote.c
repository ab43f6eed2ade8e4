/*
 * The remote tier: sessions pushed to and pulled from a Redis server
 * (docs/FORMAT.md, "Remote values"). Skeleton: every call refuses.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "index.h"

int ctxs_remote_open(ctxs_remote **out, ctxs_store *st, const char *url,
                     const ctxs_remote_options *opts)
{
    if (out)
        *out = NULL;
    (void)st;
    (void)url;
    (void)opts;
    return -ENOSYS;
}

int ctxs_remote_get_stats(ctxs_remote_stats *out, ctxs_remote *r)
{
    (void)out;
    (void)r;
    return CTXS_EINVAL;
}

int ctxs_remote_flush(ctxs_remote_stats *out, ctxs_remote *r, uint32_t timeout_ms)
{
    (void)out;
    (void)r;
    (void)timeout_ms;
    return CTXS_EINVAL;
}

int ctxs_remote_close(ctxs_remote_stats *out, ctxs_remote *r, uint32_t timeout_ms)
{
    (void)out;
    (void)r;
    (void)timeout_ms;
    return 0;
}

int ctxs_remote_push(ctxs_remote_push_result *out, ctxs_remote *r, const char *name,
                     ctxs_progress_fn progress, void *progress_arg)
{
    (void)out;
    (void)r;
    (void)name;
    (void)progress;
    (void)progress_arg;
    return -ENOSYS;
}

int ctxs_remote_pull(ctxs_session **out, ctxs_remote_pull_result *res, ctxs_remote *r,
                     const char *remote_name, const char *local_name,
                     const ctxs_create_options *opts, ctxs_progress_fn progress,
                     void *progress_arg)
{
    if (out)
        *out = NULL;
    if (res)
        memset(res, 0, sizeof(*res));
    (void)r;
    (void)remote_name;
    (void)local_name;
    (void)opts;
    (void)progress;
    (void)progress_arg;
    return -ENOSYS;
}

int ctxs_remote_pull_prefix(ctxs_session **out, ctxs_remote_pull_result *res, ctxs_remote *r,
                            const char *local_name, const ctxs_model *model,
                            const uint32_t *tokens, uint64_t n, const ctxs_create_options *opts)
{
    if (out)
        *out = NULL;
    if (res)
        memset(res, 0, sizeof(*res));
    (void)r;
    (void)local_name;
    (void)model;
    (void)tokens;
    (void)n;
    (void)opts;
    return -ENOSYS;
}

int ctxs_remote_list(ctxs_remote_entry **out, size_t *n_out, ctxs_remote *r)
{
    if (out)
        *out = NULL;
    if (n_out)
        *n_out = 0;
    (void)r;
    return -ENOSYS;
}

int ctxs_remote_get_info(ctxs_remote_info *out, ctxs_remote *r)
{
    (void)out;
    (void)r;
    return -ENOSYS;
}
