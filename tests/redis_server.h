/*
 * A real redis-server for the tests of the remote tier (and the CLI's):
 * started on 127.0.0.1 on a free port, in a scratch directory, with no
 * persistence (--save "" --appendonly no), killed or shut down by the
 * test, and restarted on the same port. Where /usr/bin/redis-server (or
 * $REDIS_SERVER_BIN) is missing, the test is skipped, saying so loudly.
 * Every wait is bounded (TS_REDIS_WAIT_MS); nothing leaves the loopback.
 */
#ifndef CTXS_TESTS_REDIS_SERVER_H
#define CTXS_TESTS_REDIS_SERVER_H

#include <stdint.h>
#include <sys/types.h>

/* How long a start or restart may take before the test fails. */
#define TS_REDIS_WAIT_MS 10000

typedef struct ts_redis {
    pid_t pid;                  /* 0: not running */
    int port;
    char *dir;                  /* the server's --dir, a ts_mkdtemp() */
    char password[64];          /* "" for none */
    uint64_t maxmemory;         /* 0 for none */
    char url[160];              /* "redis://[:password@]127.0.0.1:port" */
    char url_nopass[96];        /* "redis://127.0.0.1:port" */
} ts_redis;

/* Starts a server (password NULL or "": none; maxmemory 0: none, else
 * with allkeys-lru), waits until it answers PING. Skips the test if the
 * binary is missing; fails it if the server does not come up. */
void ts_redis_start(ts_redis *r, const char *password, uint64_t maxmemory);

/* SIGKILLs the server and reaps it (no SHUTDOWN: as if the machine died). */
void ts_redis_kill(ts_redis *r);

/* Starts it again on the same port (empty: nothing was saved). */
void ts_redis_restart(ts_redis *r);

/* Kills the server if it runs and removes its directory. */
void ts_redis_stop(ts_redis *r);

/* Runs one command (argv-style, NUL-terminated strings, NULL-terminated
 * list) on a connection of its own; returns the reply as a malloc'd
 * string: an integer as decimal, a status or string as is, an error as
 * "ERR: <text>", an array's length as "[n]", nil as "(nil)". */
char *ts_redis_cmd(ts_redis *r, const char *arg0, ...);

/* The same with binary-safe arguments: n of them, lengths in lens. */
char *ts_redis_cmd_argv(ts_redis *r, int n, const char **args, const size_t *lens);

/* The value of key (malloc'd, *len its length), or NULL if there is none. */
void *ts_redis_get(ts_redis *r, const char *key, size_t *len);

/* Sets key to v[len] (binary-safe). */
void ts_redis_set(ts_redis *r, const char *key, const void *v, size_t len);

/* How many keys match pattern (SCAN: every key, each once). */
uint64_t ts_redis_count(ts_redis *r, const char *pattern);

#endif
