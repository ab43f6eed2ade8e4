/*
 * The remote tier against a real redis-server on 127.0.0.1
 * (tests/redis_server.c), with two stores in two directories as two
 * machines.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ctxstore.h"
#include "redis_server.h"
#include "support.h"

TestSuite(remote, .init = ts_scratch_init, .fini = ts_scratch_fini);

Test(remote, fixture_starts_and_restarts_a_server)
{
    ts_redis r;
    ts_redis_start(&r, NULL, 0);
    char *s = ts_redis_cmd(&r, "SET", "k", "v", NULL);
    cr_assert_str_eq(s, "OK");
    free(s);
    ts_redis_restart(&r);
    cr_assert_eq(ts_redis_count(&r, "*"), 0);
    ts_redis_stop(&r);
}
