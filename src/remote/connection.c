/*
 * The remote tier's connection to Redis: one call's deadline and the caps
 * on its replies, commands and their replies read through hiredis
 * without its blocking reads, what an error means, the server's URL,
 * and opening a connection (AUTH, SELECT, PING).
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "platform.h"
#include "remote.h"
#include "syscall.h"

/* --- Errors -------------------------------------------------------------- */

/* hiredis 0.14 reports an I/O error as REDIS_ERR_IO with errno set and
 * its text in errstr; errno may not survive the calls after it, so the
 * text decides where errno was lost. */
static int errno_of(const char *errstr, int saved)
{
    static const int known[] = {ECONNREFUSED, ETIMEDOUT, ECONNRESET, EHOSTUNREACH, ENETUNREACH,
                                ENOENT, EACCES, EPIPE, EADDRNOTAVAIL, ECONNABORTED};
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
        if (strstr(errstr, strerror(known[i])))
            return -known[i];
    if (strstr(errstr, "timed out") || strstr(errstr, "Timeout"))
        return -ETIMEDOUT;
    if (saved == EAGAIN || saved == EWOULDBLOCK || saved == EINPROGRESS)
        return -ETIMEDOUT; /* a read or write that the socket timeout ended */
    return saved > 0 ? -saved : -EIO;
}

int ctxs__redis_error(const redisContext *c, int saved)
{
    if (!c)
        return CTXS_ENOMEM;
    switch (c->err) {
    case REDIS_ERR_IO:
        return errno_of(c->errstr, saved);
    case REDIS_ERR_EOF:
        return -ECONNRESET;
    case REDIS_ERR_OOM:
        return CTXS_ENOMEM;
    case REDIS_ERR_PROTOCOL:
        return CTXS_EREMOTE; /* not a Redis */
    default:
        return strstr(c->errstr, "imed out") ? -ETIMEDOUT : -EIO;
    }
}

/* An error reply: a password refused or required is -EACCES (Redis 6+
 * "WRONGPASS", older "ERR invalid password", "NOAUTH" without AUTH), and
 * so is a password given to a server that has none (Redis < 6 "ERR
 * Client sent AUTH, but no password is set", Redis 6+ "ERR AUTH
 * <password> called without any password configured for the default
 * user"); the rest CTXS_EREMOTE. */
int ctxs__redis_error_text(const char *str)
{
    if (!strncmp(str, "WRONGPASS", 9) || !strncmp(str, "NOAUTH", 6) ||
        strstr(str, "invalid password") || strstr(str, "no password is set") ||
        strstr(str, "called without any password configured") ||
        strstr(str, "invalid username-password"))
        return -EACCES;
    return CTXS_EREMOTE;
}

static int reply_error(const redisReply *rep)
{
    return ctxs__redis_error_text(rep->str);
}

/* The result of one command's reply: 0, or an error. */
int ctxs__reply_check(redisContext *c, redisReply *rep, int saved)
{
    if (!rep)
        return ctxs__redis_error(c, saved);
    if (rep->type == REDIS_REPLY_ERROR)
        return reply_error(rep);
    return 0;
}

/* --- Deadlines and caps ------------------------------------------------------
 *
 * A server is trusted with nothing but its data, which is verified. What
 * it could still do is take its time and send too much: hiredis 0.14
 * waits for a reply as long as bytes keep coming (SO_RCVTIMEO bounds one
 * read, not a reply), buffers a bulk string whole before it looks at it,
 * and allocates an array's slots from the count in its header. So no
 * reply is read through redisGetReply(): every wait for the socket is a
 * poll() bounded by the call's deadline (call_ms, from the start of the
 * call or background job) and by timeout_ms, and before each read the
 * reply so far is held to the cap of the command it answers -- a bulk
 * string's length from its header, the bytes of a reply still
 * incomplete, an array's count, through hiredis's createArray hook,
 * before it allocates. The caps come from what a valid value can be
 * (remote_format.h): a reply past one is no server of ours, and ends the
 * call with CTXS_EREMOTE before the memory is spent. Each violation is
 * said in words, as the call's reason (ctxs_get_last_error()).
 */

/* Statuses, integers, errors: "+OK", ":1", "-OOM command not allowed
 * when used memory > 'maxmemory'". */
const ctxs__reply_cap ctxs__cap_small = {"reply", 4096, 65536, 0};

/* A connection's state, in its reader's privdata (hiredis passes it to
 * the reply hooks): the call's deadline and the cap of the reply being
 * read. */
typedef struct conn_state {
    uint64_t deadline_ns;   /* CLOCK_MONOTONIC */
    uint32_t call_ms, read_ms;
    ctxs__reply_cap cap;
    long long refused;      /* an array count the hook refused, or -1 */
} conn_state;

/* What the calling thread's remote call met, in words: the call's reason
 * when it fails (ctxs__remote_leave()). */
static _Thread_local char message[256];

void ctxs__rsay(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof(message), fmt, ap);
    va_end(ap);
}

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static conn_state *state_of(redisContext *c)
{
    return c->reader->privdata;
}

/* Starts a call on c: its deadline is call_ms from now. */
void ctxs__redis_call_begin(redisContext *c)
{
    conn_state *cs = state_of(c);
    cs->deadline_ns = now_ns() + (uint64_t)cs->call_ms * 1000000u;
}

void ctxs__redis_cap_set(redisContext *c, const ctxs__reply_cap *cap)
{
    state_of(c)->cap = *cap;
    state_of(c)->refused = -1;
}

/* hiredis's own reply hooks, and ours: its createArray, after the count
 * is held to the cap. */
static redisReplyObjectFunctions hiredis_fn, capped_fn;
static pthread_once_t capped_once = PTHREAD_ONCE_INIT;

static void *capped_array(const redisReadTask *task, int elements)
{
    conn_state *cs = task->privdata;
    if (cs && elements > cs->cap.elements) {
        cs->refused = elements;
        return NULL; /* hiredis: out of memory; the reply ends there */
    }
    return hiredis_fn.createArray(task, elements);
}

static void capped_init(void)
{
    redisReader *rd = redisReaderCreate();
    if (!rd)
        return;
    hiredis_fn = *rd->fn;
    redisReaderFree(rd);
    capped_fn = hiredis_fn;
    capped_fn.createArray = capped_array;
}

/* Waits until c's socket is ready for events (POLLIN, POLLOUT), at most
 * until the call's deadline and timeout_ms. 0, -ETIMEDOUT, -errno. */
int ctxs__redis_wait(redisContext *c, short events)
{
    conn_state *cs = state_of(c);
    for (;;) {
        uint64_t now = now_ns();
        if (now >= cs->deadline_ns) {
            ctxs__rsay("no %s within the call's deadline of %u ms", cs->cap.what, cs->call_ms);
            return -ETIMEDOUT;
        }
        uint64_t left_ms = (cs->deadline_ns - now) / 1000000u + 1;
        int wait_ms = left_ms < cs->read_ms ? (int)left_ms : (int)cs->read_ms;
        struct pollfd p = {c->fd, events, 0};
        int n = poll(&p, 1, wait_ms);
        if (n > 0)
            return 0;
        if (n < 0 && errno != EINTR)
            return -errno;
        if (n == 0 && (uint64_t)wait_ms < left_ms) {
            ctxs__rsay("nothing for %u ms in a %s", cs->read_ms, cs->cap.what);
            return -ETIMEDOUT;
        }
    }
}

/* The reply hiredis holds part of, against its cap: its bytes so far,
 * and a bulk string's length as soon as its header is there. */
static int cap_check(redisContext *c)
{
    conn_state *cs = state_of(c);
    const redisReader *rd = c->reader;
    size_t have = rd->len - rd->pos;
    if (have > cs->cap.bytes) {
        ctxs__rsay("a %s of more than %" PRIu64 " bytes", cs->cap.what, cs->cap.bytes);
        return CTXS_EREMOTE;
    }
    /* hiredis takes a reply's type byte when it starts the reply, and its
     * length line with the whole bulk: a bulk under way is its digits
     * at pos, one not started its '$'. */
    const char *p = rd->buf + rd->pos;
    int started = rd->ridx >= 0 && rd->rstack[rd->ridx].type == REDIS_REPLY_STRING;
    if (have > 0 && !started && p[0] == '$')
        p++, have--;
    else if (!started)
        have = 0;
    if (have > 0) {
        const char *nl = memchr(p, '\r', have);
        uint64_t len = 0;
        int digits = 0;
        for (const char *d = p; (nl ? d < nl : d < p + have) && *d >= '0' && *d <= '9';
             d++, digits++)
            len = digits < 20 ? len * 10 + (uint64_t)(*d - '0') : UINT64_MAX;
        if (len > cs->cap.bulk) {
            ctxs__rsay("a %s of %s%" PRIu64 " bytes, above the %" PRIu64 " a valid one holds",
                       cs->cap.what, nl ? "" : "at least ", len, cs->cap.bulk);
            return CTXS_EREMOTE;
        }
    }
    return 0;
}

/* What a failed hiredis read means, the array hook's refusal first. */
static int reader_error(redisContext *c, int saved)
{
    conn_state *cs = state_of(c);
    if (cs->refused >= 0) {
        ctxs__rsay("a %s holding an array of %lld elements, above %lld", cs->cap.what,
                   cs->refused, cs->cap.elements);
        return CTXS_EREMOTE;
    }
    return ctxs__redis_error(c, saved);
}

/* Sends hiredis's output buffer, within the call's deadline: a write
 * that did not take it all waits for the socket first. */
int ctxs__redis_flush(redisContext *c)
{
    for (;;) {
        int done = 0;
        errno = 0;
        if (redisBufferWrite(c, &done) != REDIS_OK)
            return ctxs__redis_error(c, errno);
        if (done)
            return 0;
        int rc = ctxs__redis_wait(c, POLLOUT);
        if (rc < 0)
            return rc;
    }
}

/* Reads the next pipelined reply into *out (freeReplyObject() it), held
 * to the cap last set, within the call's deadline. */
int ctxs__reply_next(redisReply **out, redisContext *c)
{
    void *rep = NULL;
    *out = NULL;
    int rc = ctxs__redis_flush(c);
    while (rc == 0) {
        errno = 0;
        if (redisGetReplyFromReader(c, &rep) != REDIS_OK)
            return reader_error(c, errno);
        if (rep)
            break;
        if ((rc = cap_check(c)) < 0 || (rc = ctxs__redis_wait(c, POLLIN)) < 0)
            break;
        errno = 0;
        if (redisBufferRead(c) != REDIS_OK)
            rc = reader_error(c, errno);
    }
    if (rc < 0)
        return rc;
    *out = rep;
    return 0;
}

/* One command, and its reply held to cap. 0 with *out (which may be an
 * error reply), or an error with *out NULL. */
int ctxs__redis_command(redisReply **out, redisContext *c, const ctxs__reply_cap *cap, int argc,
                        const char **argv, const size_t *lens)
{
    *out = NULL;
    ctxs__redis_cap_set(c, cap);
    if (redisAppendCommandArgv(c, argc, argv, lens) != REDIS_OK)
        return ctxs__redis_error(c, errno);
    return ctxs__reply_next(out, c);
}

/* --- URLs -------------------------------------------------------------- */

static int hex_val(int ch)
{
    return isdigit(ch) ? ch - '0' : isxdigit(ch) ? (tolower(ch) - 'a' + 10) : -1;
}

/* Copies [s, s + n) percent-decoded into out[cap]. CTXS_EINVAL if it does
 * not fit or a %xx is malformed. */
static int decode(char *out, size_t cap, const char *s, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int ch = (unsigned char)s[i];
        if (ch == '%') {
            if (i + 2 >= n)
                return CTXS_EINVAL;
            int hi = hex_val((unsigned char)s[i + 1]), lo = hex_val((unsigned char)s[i + 2]);
            if (hi < 0 || lo < 0)
                return CTXS_EINVAL;
            ch = hi * 16 + lo;
            i += 2;
        }
        if (ch == 0 || o + 1 >= cap)
            return CTXS_EINVAL;
        out[o++] = (char)ch;
    }
    out[o] = '\0';
    return 0;
}

static int parse_uint(const char *s, size_t n, long max, long *out)
{
    if (n == 0 || n > 9)
        return CTXS_EINVAL;
    long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i]))
            return CTXS_EINVAL;
        v = v * 10 + (s[i] - '0');
    }
    if (v > max)
        return CTXS_EINVAL;
    *out = v;
    return 0;
}

/* "redis://[[user]:password@]host[:port][/db]" or
 * "unix:///path[?db=N]". TLS ("rediss://") is refused: Debian 12's
 * hiredis 0.14 has none. */
int ctxs__url_parse(ctxs__endpoint *ep, const char *url)
{
    memset(ep, 0, sizeof(*ep));
    ep->port = 6379;
    long v;
    if (!strncmp(url, "unix://", 7)) {
        const char *path = url + 7, *q = strchr(path, '?');
        size_t n = q ? (size_t)(q - path) : strlen(path);
        if (n == 0 || path[0] != '/' || decode(ep->host, sizeof(ep->host), path, n) < 0)
            return CTXS_EINVAL;
        ep->is_unix = 1;
        if (q) {
            if (strncmp(q, "?db=", 4) || parse_uint(q + 4, strlen(q + 4), INT_MAX, &v) < 0)
                return CTXS_EINVAL;
            ep->db = (int)v;
        }
        return 0;
    }
    if (strncmp(url, "redis://", 8))
        return CTXS_EINVAL; /* rediss:// included */
    const char *s = url + 8, *end = s + strlen(s);
    const char *at = memchr(s, '@', (size_t)(end - s));
    if (at) {
        /* user:password or :password or password (the Redis CLI's form) */
        const char *colon = memchr(s, ':', (size_t)(at - s));
        if (colon) {
            if (decode(ep->user, sizeof(ep->user), s, (size_t)(colon - s)) < 0 ||
                decode(ep->password, sizeof(ep->password), colon + 1,
                       (size_t)(at - colon - 1)) < 0)
                return CTXS_EINVAL;
        } else if (decode(ep->password, sizeof(ep->password), s, (size_t)(at - s)) < 0) {
            return CTXS_EINVAL;
        }
        s = at + 1;
    }
    const char *slash = memchr(s, '/', (size_t)(end - s));
    const char *hend = slash ? slash : end;
    const char *colon = NULL;
    if (*s == '[') { /* [IPv6]:port */
        const char *rb = memchr(s, ']', (size_t)(hend - s));
        if (!rb)
            return CTXS_EINVAL;
        if (decode(ep->host, sizeof(ep->host), s + 1, (size_t)(rb - s - 1)) < 0)
            return CTXS_EINVAL;
        colon = rb + 1 < hend && rb[1] == ':' ? rb + 1 : NULL;
        if (rb + 1 != hend && !colon)
            return CTXS_EINVAL;
    } else {
        colon = memchr(s, ':', (size_t)(hend - s));
        if (decode(ep->host, sizeof(ep->host), s, (size_t)((colon ? colon : hend) - s)) < 0)
            return CTXS_EINVAL;
    }
    if (!ep->host[0])
        return CTXS_EINVAL;
    if (colon) {
        if (parse_uint(colon + 1, (size_t)(hend - colon - 1), 65535, &v) < 0 || v == 0)
            return CTXS_EINVAL;
        ep->port = (int)v;
    }
    if (slash && slash + 1 < end) {
        if (parse_uint(slash + 1, (size_t)(end - slash - 1), INT_MAX, &v) < 0)
            return CTXS_EINVAL;
        ep->db = (int)v;
    }
    return 0;
}

/* --- Connections ----------------------------------------------------------- */

static struct timeval tv_ms(uint32_t ms)
{
    return (struct timeval){(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
}

/* A write to a connection the server closed raises SIGPIPE, whose default
 * action ends the process: a library call must return -EPIPE instead.
 * Linux has no SO_NOSIGPIPE and hiredis 0.14 writes without MSG_NOSIGNAL,
 * so the calls on the caller's thread block SIGPIPE around their
 * network traffic and take back a SIGPIPE they caused (the pending signal
 * is per thread: one raised by a write is this thread's), leaving the
 * application's disposition and mask as they were; the push thread
 * blocks every signal from its start. */
void ctxs__remote_enter(ctxs__remote_call *g)
{
    ctxs__error_begin();
    message[0] = '\0';
    sigset_t set, pending;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    sigpending(&pending);
    g->was_pending = sigismember(&pending, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, &g->old);
}

/* A failure that met a limit says which. */
int ctxs__remote_leave(ctxs__remote_call *g, int rc)
{
    sigset_t set, pending;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    sigpending(&pending);
    if (!g->was_pending && sigismember(&pending, SIGPIPE)) {
        struct timespec zero = {0, 0};
        while (sigtimedwait(&set, NULL, &zero) < 0 && errno == EINTR)
            ;
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
    if (rc < 0 && message[0])
        return ctxs__error(rc, "%s", message);
    return rc;
}

/* One command with a status or integer reply expected. */
static int simple_cmd(redisContext *c, int argc, const char **argv)
{
    redisReply *rep;
    int rc = ctxs__redis_command(&rep, c, &ctxs__cap_small, argc, argv, NULL);
    if (rc == 0)
        rc = ctxs__reply_check(c, rep, 0);
    if (rep)
        freeReplyObject(rep);
    return rc;
}

/* Closes a connection ctxs__redis_open() made. */
void ctxs__redis_close(redisContext *c)
{
    if (!c)
        return;
    free(c->reader->privdata);
    c->reader->privdata = NULL;
    redisFree(c);
}

/* Connects, authenticates, selects the database and checks that the
 * server answers PING as Redis does. */
int ctxs__redis_open(redisContext **out, const ctxs_remote *r)
{
    *out = NULL;
    const ctxs__endpoint *ep = &r->ep;
    struct timeval tv = tv_ms(r->o.timeout_ms);
    errno = 0;
    redisContext *c = ep->is_unix ? redisConnectUnixWithTimeout(ep->host, tv)
                                  : redisConnectWithTimeout(ep->host, ep->port, tv);
    int saved = errno;
    if (!c || c->err) {
        int rc = ctxs__redis_error(c, saved);
        if (c)
            ctxs__redis_close(c);
        return rc;
    }
    /* hiredis 0.14 opens its socket without SOCK_CLOEXEC: a child the
     * application forks and execs would inherit the connection (and keep
     * it up after we close it). Set before the first byte is sent. */
    int rc = fcntl(c->fd, F_SETFD, FD_CLOEXEC) == 0 ? 0 : -errno;
    pthread_once(&capped_once, capped_init);
    conn_state *cs = rc == 0 ? ctxs__calloc(1, sizeof(*cs)) : NULL;
    if (rc == 0 && (!cs || !capped_fn.createArray))
        rc = CTXS_ENOMEM;
    if (rc == 0) {
        cs->call_ms = r->o.call_ms ? r->o.call_ms : CTXS_DEFAULT_REMOTE_CALL_MS;
        cs->read_ms = r->o.timeout_ms;
        c->reader->privdata = cs;
        c->reader->fn = &capped_fn;
        cs = NULL;
        ctxs__redis_call_begin(c);
    }
    free(cs);
    if (rc == 0)
        rc = redisSetTimeout(c, tv) == REDIS_OK ? 0 : ctxs__redis_error(c, errno);
    if (rc == 0 && ep->password[0]) {
        const char *auth_user[] = {"AUTH", ep->user, ep->password};
        const char *auth[] = {"AUTH", ep->password};
        rc = ep->user[0] ? simple_cmd(c, 3, auth_user) : simple_cmd(c, 2, auth);
    }
    if (rc == 0 && ep->db) {
        char db[16];
        snprintf(db, sizeof(db), "%d", ep->db);
        const char *sel[] = {"SELECT", db};
        rc = simple_cmd(c, 2, sel);
    }
    if (rc == 0) {
        const char *ping[] = {"PING"};
        redisReply *rep;
        if ((rc = ctxs__redis_command(&rep, c, &ctxs__cap_small, 1, ping, NULL)) == 0)
            rc = ctxs__reply_check(c, rep, 0);
        if (rc == 0 && (rep->type != REDIS_REPLY_STATUS || strcmp(rep->str, "PONG"))) {
            ctxs__rsay("PING answered otherwise than PONG: not a Redis");
            rc = CTXS_EREMOTE;
        }
        if (rep)
            freeReplyObject(rep);
    }
    if (rc < 0) {
        ctxs__redis_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

