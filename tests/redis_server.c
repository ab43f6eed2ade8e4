#include "redis_server.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "support.h"

static const char *server_bin(void)
{
    const char *bin = getenv("REDIS_SERVER_BIN");
    return bin && *bin ? bin : "/usr/bin/redis-server";
}

/* A port nobody listens on now: the kernel's pick for a socket bound to
 * port 0 (another process may take it before the server does; the start
 * then fails and tries another). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert(fd >= 0, "socket: %s", strerror(errno));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    cr_assert(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0, "bind: %s", strerror(errno));
    cr_assert(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static redisContext *connect_to(ts_redis *r)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
    if (!c || c->err) {
        if (c)
            redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, (struct timeval){5, 0});
    if (r->password[0]) {
        redisReply *rep = redisCommand(c, "AUTH %s", r->password);
        int ok = rep && rep->type == REDIS_REPLY_STATUS;
        if (rep)
            freeReplyObject(rep);
        if (!ok) {
            redisFree(c);
            return NULL;
        }
    }
    return c;
}

/* 1 once the server answers PING, 0 if it exited (the port was taken). */
static int wait_ready(ts_redis *r)
{
    for (int waited = 0; waited < TS_REDIS_WAIT_MS; waited += 10) {
        int status;
        if (waitpid(r->pid, &status, WNOHANG) == r->pid) {
            r->pid = 0;
            return 0;
        }
        redisContext *c = connect_to(r);
        if (c) {
            redisReply *rep = redisCommand(c, "PING");
            int ok = rep && rep->type == REDIS_REPLY_STATUS;
            if (rep)
                freeReplyObject(rep);
            redisFree(c);
            if (ok)
                return 1;
        }
        sleep_ms(10);
    }
    cr_assert_fail("redis-server on port %d did not answer PING within %d ms", r->port,
                   TS_REDIS_WAIT_MS);
    return 0;
}

static int spawn(ts_redis *r)
{
    char port[16], maxmem[32];
    snprintf(port, sizeof(port), "%d", r->port);
    snprintf(maxmem, sizeof(maxmem), "%llu", (unsigned long long)r->maxmemory);
    const char *argv[32];
    int n = 0;
    argv[n++] = server_bin();
    argv[n++] = "--port";
    argv[n++] = port;
    argv[n++] = "--bind";
    argv[n++] = "127.0.0.1";
    argv[n++] = "--save";
    argv[n++] = "";
    argv[n++] = "--appendonly";
    argv[n++] = "no";
    argv[n++] = "--dir";
    argv[n++] = r->dir;
    argv[n++] = "--logfile";
    argv[n++] = "redis.log";
    argv[n++] = "--protected-mode";
    argv[n++] = "yes";
    if (r->password[0]) {
        argv[n++] = "--requirepass";
        argv[n++] = r->password;
    }
    if (r->maxmemory) {
        argv[n++] = "--maxmemory";
        argv[n++] = maxmem;
        argv[n++] = "--maxmemory-policy";
        argv[n++] = "allkeys-lru";
    }
    argv[n] = NULL;
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        /* The server goes with the test process, even one that failed an
         * assertion and exited; and it holds none of the test's output. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int null = open("/dev/null", O_RDWR);
        if (null >= 0) {
            dup2(null, 0);
            dup2(null, 1);
            dup2(null, 2);
        }
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    r->pid = pid;
    return wait_ready(r);
}

void ts_redis_start(ts_redis *r, const char *password, uint64_t maxmemory)
{
    memset(r, 0, sizeof(*r));
    if (access(server_bin(), X_OK) != 0)
        cr_skip_test("SKIPPED: no redis-server at %s (apt-get install redis-server, or set "
                     "REDIS_SERVER_BIN): the remote tier is untested here",
                     server_bin());
    r->dir = ts_mkdtemp();
    if (password)
        snprintf(r->password, sizeof(r->password), "%s", password);
    r->maxmemory = maxmemory;
    for (int tries = 0;; tries++) {
        r->port = free_port();
        if (spawn(r))
            break;
        cr_assert(tries < 5, "redis-server (%s) would not start; see %s/redis.log",
                  server_bin(), r->dir);
    }
    snprintf(r->url_nopass, sizeof(r->url_nopass), "redis://127.0.0.1:%d", r->port);
    if (r->password[0])
        snprintf(r->url, sizeof(r->url), "redis://:%s@127.0.0.1:%d", r->password, r->port);
    else
        snprintf(r->url, sizeof(r->url), "%s", r->url_nopass);
}

void ts_redis_kill(ts_redis *r)
{
    if (r->pid > 0) {
        kill(r->pid, SIGKILL);
        waitpid(r->pid, NULL, 0);
        r->pid = 0;
    }
}

void ts_redis_restart(ts_redis *r)
{
    ts_redis_kill(r);
    /* The port was ours a moment ago; a restart that loses it fails. */
    for (int waited = 0; !spawn(r); waited += 50) {
        cr_assert(waited < TS_REDIS_WAIT_MS, "redis-server would not restart on port %d",
                  r->port);
        sleep_ms(50);
    }
}

void ts_redis_stop(ts_redis *r)
{
    ts_redis_kill(r);
    if (r->dir) {
        ts_rmtree(r->dir);
        free(r->dir);
        r->dir = NULL;
    }
}

static char *reply_text(redisReply *rep)
{
    char *s = NULL;
    if (!rep)
        return strdup("ERR: no reply");
    switch (rep->type) {
    case REDIS_REPLY_INTEGER:
        if (asprintf(&s, "%lld", rep->integer) < 0)
            s = NULL;
        break;
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_STRING:
        s = malloc(rep->len + 1);
        if (s) {
            memcpy(s, rep->str, rep->len);
            s[rep->len] = '\0';
        }
        break;
    case REDIS_REPLY_ERROR:
        if (asprintf(&s, "ERR: %s", rep->str) < 0)
            s = NULL;
        break;
    case REDIS_REPLY_ARRAY:
        if (asprintf(&s, "[%zu]", rep->elements) < 0)
            s = NULL;
        break;
    default:
        s = strdup("(nil)");
    }
    cr_assert_not_null(s);
    return s;
}

char *ts_redis_cmd_argv(ts_redis *r, int n, const char **args, const size_t *lens)
{
    redisContext *c = connect_to(r);
    cr_assert_not_null(c, "cannot connect to redis-server on port %d", r->port);
    redisReply *rep = redisCommandArgv(c, n, args, lens);
    char *s = reply_text(rep);
    if (rep)
        freeReplyObject(rep);
    redisFree(c);
    return s;
}

char *ts_redis_cmd(ts_redis *r, const char *arg0, ...)
{
    const char *args[16];
    size_t lens[16];
    int n = 0;
    va_list ap;
    va_start(ap, arg0);
    for (const char *a = arg0; a && n < 16; a = va_arg(ap, const char *)) {
        args[n] = a;
        lens[n++] = strlen(a);
    }
    va_end(ap);
    return ts_redis_cmd_argv(r, n, args, lens);
}

void *ts_redis_get(ts_redis *r, const char *key, size_t *len)
{
    redisContext *c = connect_to(r);
    cr_assert_not_null(c, "cannot connect to redis-server on port %d", r->port);
    redisReply *rep = redisCommand(c, "GET %s", key);
    void *out = NULL;
    if (rep && rep->type == REDIS_REPLY_STRING) {
        out = malloc(rep->len ? rep->len : 1);
        cr_assert_not_null(out);
        memcpy(out, rep->str, rep->len);
        *len = rep->len;
    }
    if (rep)
        freeReplyObject(rep);
    redisFree(c);
    return out;
}

void ts_redis_set(ts_redis *r, const char *key, const void *v, size_t len)
{
    const char *set[] = {"SET", key, v};
    size_t lens[] = {3, strlen(key), len};
    free(ts_redis_cmd_argv(r, 3, set, lens));
}

uint64_t ts_redis_count(ts_redis *r, const char *pattern)
{
    redisContext *c = connect_to(r);
    cr_assert_not_null(c, "cannot connect to redis-server on port %d", r->port);
    uint64_t n = 0;
    char cursor[32] = "0";
    do {
        redisReply *rep = redisCommand(c, "SCAN %s MATCH %s COUNT 1000", cursor, pattern);
        cr_assert(rep && rep->type == REDIS_REPLY_ARRAY && rep->elements == 2, "SCAN failed");
        snprintf(cursor, sizeof(cursor), "%.*s", (int)rep->element[0]->len,
                 rep->element[0]->str);
        n += rep->element[1]->elements;
        freeReplyObject(rep);
    } while (strcmp(cursor, "0") != 0);
    redisFree(c);
    return n;
}
