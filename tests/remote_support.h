/*
 * What the suites of the remote tier share (test_remote.c,
 * test_remote_schedule.c): stores as machines in the scratch directory, a
 * remote opened with the tests' options, and a fleet: a real
 * redis-server (redis_server.h) and two machines, a and b, each with its
 * store and, where a test opens one, its remote.
 */
#ifndef CTXS_TESTS_REMOTE_SUPPORT_H
#define CTXS_TESTS_REMOTE_SUPPORT_H

#include <stdint.h>

#include "ctxstore.h"
#include "redis_server.h"

/* How long a test waits for a remote's queue to drain: a bound, not a
 * duration anything is judged by. */
#define TS_FLUSH_MS 20000u

/* The store <scratch>/<name>, created where missing. */
ctxs_store *ts_store_at(const char *name);

/* A remote to url for st with the tests' options (2 s timeouts, 3 tries,
 * 5 ms backoff), push_on_commit and pull_on_open as given; fails the test
 * where it does not open. */
ctxs_remote *ts_remote_open(ctxs_store *st, const char *url, uint32_t push_on_commit,
                            uint32_t pull_on_open);

/* A remote for the tests of failures: push_on_commit and pull_on_open
 * (the library's defaults), and the timeouts, tries, first backoff and
 * queue as given. */
ctxs_remote *ts_remote_open_tuned(ctxs_store *st, const char *url, uint32_t timeout_ms,
                                  uint32_t retries, uint32_t backoff_ms, uint32_t queue_max);

/* Positions [0, n) of a and b: the same ids and, with kv, the same
 * stored bytes in a's dtype (scales included for Q8). */
void ts_assert_same_stored(const ctxs_session *a, const ctxs_session *b, uint64_t n, int kv);

typedef struct ts_fleet {
    ts_redis rs;
    ctxs_store *a, *b;          /* <scratch>/a and <scratch>/b */
    ctxs_remote *ra, *rb;       /* their remotes, or NULL */
} ts_fleet;

/* A server started without a password or memory limit, both stores
 * opened; with remotes, both remotes too (push_on_commit 0, pull_on_open
 * as given), else none. */
ts_fleet ts_fleet_start(int remotes, uint32_t pull_on_open);

/* Closes the remotes still set (each flushed first, TS_FLUSH_MS at most),
 * both stores, and the server. A test that closes a remote itself sets
 * its field to NULL. */
void ts_fleet_stop(ts_fleet *f);

#endif
