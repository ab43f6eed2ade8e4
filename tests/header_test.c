/* The public header stands alone: included first, with -Werror -pedantic. */
#include "ctxstore.h"
#include "ctxstore.h"

int main(void)
{
    ctxs_session_options o;
    if (ctxs_session_options_init(&o) != 0 || o.version != CTXS_SESSION_OPTIONS_VERSION)
        return 1;
    return ctxs_strerror(CTXS_EBUSY)[0] ? 0 : 1;
}
