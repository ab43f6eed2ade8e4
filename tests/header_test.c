/* The public header stands alone: included first, with -Werror -pedantic. */
#include "ctxstore.h"
#include "ctxstore.h"

int main(void)
{
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    ctxs_store_options so = CTXS_STORE_OPTIONS_INIT;
    ctxs_watcher_options wo = CTXS_WATCHER_OPTIONS_INIT;
    if (o.version != CTXS_CREATE_OPTIONS_VERSION || o.open.version != CTXS_OPEN_OPTIONS_VERSION ||
        so.version != CTXS_STORE_OPTIONS_VERSION || wo.version != CTXS_WATCHER_OPTIONS_VERSION)
        return 1;
    return ctxs_strerror(CTXS_EBUSY)[0] ? 0 : 1;
}
