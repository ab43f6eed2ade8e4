/*
 * The remote tier: sessions pushed to a Redis server and pulled back on
 * another machine. remote_format.h has the values; docs/FORMAT.md,
 * "Remote values", their prose.
 *
 * Two rules hold everything up:
 *
 * - A chunk value is a fact that never goes stale: "the KV of these 64
 *   token ids, after the prefix whose chain is prev_chain". It is keyed
 *   by its content (model hash, KV form, chain), so writing it twice, from two
 *   machines or two sessions that share a prompt, writes the same bytes,
 *   and a value is never updated in place. What is pushed must therefore
 *   be a consistent state of a session: the pusher takes the ids and
 *   checksums of a committed state (a snapshot), copies each block
 *   race-free (kv_block.c) and checks it against that snapshot, and
 *   before anything is sent checks that the session still holds the
 *   snapshot's tokens with the same checksums (a rollback and rewrite in
 *   between changes them). The session record, the one mutable value,
 *   only names token ids; a puller trusts nothing in it beyond that.
 *
 * - A puller uses no byte it has not verified: every chunk's header, its
 *   place in the chain, the ids against the record (or the prompt) and
 *   every token's checksum, before the block is written into the new
 *   file, which appears complete or not at all. The first
 *   chunk missing (evicted) or refused ends the pull: shorter, never
 *   wrong.
 *
 * Threads: ctxs_remote_open() starts one push thread per remote, with its
 * own connection. Sessions opened read-write through the store queue
 * small descriptors (a session id and a chunk range; never KV bytes) from
 * their commit and close hooks, under the queue's mutex; the thread opens
 * the session file read-only by id itself. The calls on the caller's
 * thread (push, pull, list, info) each open a connection of their own,
 * so they are thread-safe and need no lock beyond the counters'.
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
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "index.h"
#include "kv_block.h"
#include "label.h"
#include "platform.h"
#include "remote_format.h"
#include "session_iface.h"
#include "syscall.h"

static_assert(CTXS_PREFIX_CHUNK == CTXS__KV_BLOCK_MAX_TOKENS, "a chunk is one raw block");

/* Bytes of values asked for in one pipeline: bounds what the server
 * buffers for a pull's GETs (a chunk of a large model is ~20 MiB). This
 * side holds one chunk's value at a time either way. */
#define PIPELINE_BYTES (64u << 20)
#define BACKOFF_MAX_MS 2000u

static uint32_t crc_of(const void *p, size_t n)
{
    return (uint32_t)crc32(0L, (const Bytef *)p, (uInt)n);
}

/* --- The handle ------------------------------------------------------------ */

enum job_kind { JOB_CHUNKS, JOB_RECORD };

/* A background push: the chunks [from, to) of session id, or its record
 * (with its tail first when tail is set). */
typedef struct job {
    enum job_kind kind;
    int tail;
    uint64_t id;
    uint64_t from, to;
    struct job *next;
} job;

typedef struct endpoint {
    int is_unix;
    char host[256];             /* or the socket's path */
    int port;
    int db;
    char user[256];             /* "" for none */
    char password[512];         /* "" for none */
} endpoint;

struct ctxs_remote {
    ctxs_store *st;             /* referenced while r lives */
    ctxs_remote_options o;
    char prefix[CTXS_NAME_MAX + 1];
    endpoint ep;

    pthread_mutex_t mu;         /* the queue, the counters */
    pthread_cond_t wake;        /* work or stop, for the thread */
    pthread_cond_t idle;        /* the queue drained, for flush */
    job *head, *tail, *tail_prev;
    uint64_t n_jobs;
    int busy;                   /* the thread runs a job it took */
    int stop;
    int thread_started;
    pthread_t thread;
    ctxs_remote_stats stats;
    int users;                  /* opens pulling through r (attach_lock) */
};

/* The values a job would push, as chunks_dropped counts them: each chunk,
 * and for a record job the record and its tail. A record job without a
 * tail counted nothing, so a record dropped for a full queue left no
 * trace in the counters. */
static uint64_t job_values(const job *j)
{
    return j->kind == JOB_CHUNKS ? j->to - j->from : 1 + (uint64_t)(j->tail != 0);
}

/* Remotes attach to and detach from their stores under this lock, which
 * the hooks take to read st->remote: a remote is never freed under a hook
 * that found it. */
static pthread_mutex_t attach_lock = PTHREAD_MUTEX_INITIALIZER;
/* Signalled under attach_lock when the last pull of an open through a
 * remote ends (ctxs__remote_pull_missing()). */
static pthread_cond_t users_done = PTHREAD_COND_INITIALIZER;

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

static int context_error(const redisContext *c, int saved)
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
static int error_text(const char *str)
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
    return error_text(rep->str);
}

/* The result of one command's reply: 0, or an error. */
static int reply_check(redisContext *c, redisReply *rep, int saved)
{
    if (!rep)
        return context_error(c, saved);
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

/* What one command's reply may be. */
typedef struct reply_cap {
    const char *what;       /* the command, in messages */
    uint64_t bulk;          /* a bulk string's length at most */
    uint64_t bytes;         /* an incomplete reply's bytes at most */
    long long elements;     /* an array's count at most */
} reply_cap;

/* Statuses, integers, errors: "+OK", ":1", "-OOM command not allowed
 * when used memory > 'maxmemory'". */
static const reply_cap CAP_SMALL = {"reply", 4096, 65536, 0};
/* An INFO section: a few KiB from any Redis. */
static const reply_cap CAP_INFO = {"INFO reply", 1u << 20, (1u << 20) + 64, 0};
/* The first 640 bytes of a record (GETRANGE). */
static const reply_cap CAP_RECORD_HEAD = {"record header", CTXS__RSESSION_HEADER_BYTES,
                                          CTXS__RSESSION_HEADER_BYTES + 64, 0};
/* A session record: its header, (2.0) its schedule, 4 bytes an id for at most
 * CTXS__REMOTE_MAX_TOKENS ids, a metadata section of at most 9 x 256 KiB
 * (docs/FORMAT.md, "Metadata section"). */
#define RECORD_MAX                                                                   \
    ((uint64_t)CTXS__RSESSION_HEADER_BYTES + CTXS__RSCHEDULE_BYTES +                 \
     4ull * CTXS__REMOTE_MAX_TOKENS + 9ull * CTXS_META_SESSION_MAX)
static const reply_cap CAP_RECORD = {"session record", RECORD_MAX, RECORD_MAX + 64, 0};
/* A SCAN reply: the cursor and at most SCAN_KEYS_MAX keys (COUNT asks
 * for 100; Redis returns about as many, more for a bucket's chain). */
#define SCAN_KEYS_MAX 4096
#define SCAN_KEY_MAX 1024 /* above "<prefix>:session:<name>" of any name */
static const reply_cap CAP_SCAN = {"SCAN reply", SCAN_KEY_MAX,
                                   (uint64_t)SCAN_KEYS_MAX * (SCAN_KEY_MAX + 16) + 64,
                                   SCAN_KEYS_MAX};
/* A listing's bounds: SCAN rounds, and keys taken from them. */
#define SCAN_ROUNDS_MAX 1000000u
#define LIST_KEYS_MAX 100000u

/* A connection's state, in its reader's privdata (hiredis passes it to
 * the reply hooks): the call's deadline and the cap of the reply being
 * read. */
typedef struct conn_state {
    uint64_t deadline_ns;   /* CLOCK_MONOTONIC */
    uint32_t call_ms, read_ms;
    reply_cap cap;
    long long refused;      /* an array count the hook refused, or -1 */
} conn_state;

/* What the calling thread's remote call met, in words: the call's reason
 * when it fails (said_end()). */
static _Thread_local char message[256];

/* At the start of a public remote call. */
static void said_begin(void)
{
    ctxs__error_begin();
    message[0] = '\0';
}

/* At its end: a failure that met a limit says which. */
static int said_end(int rc)
{
    if (rc < 0 && message[0])
        return ctxs__error(rc, "%s", message);
    return rc;
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
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
static void call_begin(redisContext *c)
{
    conn_state *cs = state_of(c);
    cs->deadline_ns = now_ns() + (uint64_t)cs->call_ms * 1000000u;
}

static void cap_set(redisContext *c, const reply_cap *cap)
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
static int conn_wait(redisContext *c, short events)
{
    conn_state *cs = state_of(c);
    for (;;) {
        uint64_t now = now_ns();
        if (now >= cs->deadline_ns) {
            say("no %s within the call's deadline of %u ms", cs->cap.what, cs->call_ms);
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
            say("nothing for %u ms in a %s", cs->read_ms, cs->cap.what);
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
        say("a %s of more than %" PRIu64 " bytes", cs->cap.what, cs->cap.bytes);
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
            say("a %s of %s%" PRIu64 " bytes, above the %" PRIu64 " a valid one holds",
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
        say("a %s holding an array of %lld elements, above %lld", cs->cap.what, cs->refused,
            cs->cap.elements);
        return CTXS_EREMOTE;
    }
    return context_error(c, saved);
}

/* Sends hiredis's output buffer, within the call's deadline: a write
 * that did not take it all waits for the socket first. */
static int obuf_flush(redisContext *c)
{
    for (;;) {
        int done = 0;
        errno = 0;
        if (redisBufferWrite(c, &done) != REDIS_OK)
            return context_error(c, errno);
        if (done)
            return 0;
        int rc = conn_wait(c, POLLOUT);
        if (rc < 0)
            return rc;
    }
}

/* Reads the next pipelined reply into *out (freeReplyObject() it), held
 * to the cap last set, within the call's deadline. */
static int reply_next(redisReply **out, redisContext *c)
{
    void *rep = NULL;
    *out = NULL;
    int rc = obuf_flush(c);
    while (rc == 0) {
        errno = 0;
        if (redisGetReplyFromReader(c, &rep) != REDIS_OK)
            return reader_error(c, errno);
        if (rep)
            break;
        if ((rc = cap_check(c)) < 0 || (rc = conn_wait(c, POLLIN)) < 0)
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
static int command(redisReply **out, redisContext *c, const reply_cap *cap, int argc,
                   const char **argv, const size_t *lens)
{
    *out = NULL;
    cap_set(c, cap);
    if (redisAppendCommandArgv(c, argc, argv, lens) != REDIS_OK)
        return context_error(c, errno);
    return reply_next(out, c);
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
static int url_parse(endpoint *ep, const char *url)
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
typedef struct sigpipe_guard {
    sigset_t old;
    int was_pending;
} sigpipe_guard;

static void sigpipe_block(sigpipe_guard *g)
{
    sigset_t set, pending;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    sigpending(&pending);
    g->was_pending = sigismember(&pending, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, &g->old);
}

static void sigpipe_restore(sigpipe_guard *g)
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
}

/* One command with a status or integer reply expected. */
static int simple_cmd(redisContext *c, int argc, const char **argv)
{
    redisReply *rep;
    int rc = command(&rep, c, &CAP_SMALL, argc, argv, NULL);
    if (rc == 0)
        rc = reply_check(c, rep, 0);
    if (rep)
        freeReplyObject(rep);
    return rc;
}

/* Closes a connection conn_open() made. */
static void conn_close(redisContext *c)
{
    if (!c)
        return;
    free(c->reader->privdata);
    c->reader->privdata = NULL;
    redisFree(c);
}

/* Connects, authenticates, selects the database and checks that the
 * server answers PING as Redis does. */
static int conn_open(redisContext **out, const ctxs_remote *r)
{
    *out = NULL;
    const endpoint *ep = &r->ep;
    struct timeval tv = tv_ms(r->o.timeout_ms);
    errno = 0;
    redisContext *c = ep->is_unix ? redisConnectUnixWithTimeout(ep->host, tv)
                                  : redisConnectWithTimeout(ep->host, ep->port, tv);
    int saved = errno;
    if (!c || c->err) {
        int rc = context_error(c, saved);
        if (c)
            conn_close(c);
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
        call_begin(c);
    }
    free(cs);
    if (rc == 0)
        rc = redisSetTimeout(c, tv) == REDIS_OK ? 0 : context_error(c, errno);
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
        if ((rc = command(&rep, c, &CAP_SMALL, 1, ping, NULL)) == 0)
            rc = reply_check(c, rep, 0);
        if (rc == 0 && (rep->type != REDIS_REPLY_STATUS || strcmp(rep->str, "PONG"))) {
            say("PING answered otherwise than PONG: not a Redis");
            rc = CTXS_EREMOTE;
        }
        if (rep)
            freeReplyObject(rep);
    }
    if (rc < 0) {
        conn_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

/* --- Keys ------------------------------------------------------------------ */

static void hex32(char out[33], const uint8_t b[16])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[32] = '\0';
}

/* The schedule as it travels: u32 period, u32 window[8] (36 bytes). */
static void schedule_bytes(uint8_t out[CTXS__RSCHEDULE_BYTES], const ctxs_geometry *g)
{
    memcpy(out, &g->period, 4);
    memcpy(out + 4, g->window, 32);
}

static uint32_t schedule_crc(const ctxs_geometry *g)
{
    uint8_t b[CTXS__RSCHEDULE_BYTES];
    schedule_bytes(b, g);
    return crc_of(b, sizeof(b));
}

/* The major version of the values of a model: 2.0 with a layer schedule. */
static uint16_t major_of(const ctxs_model *m)
{
    return m->geometry.period ? CTXS__REMOTE_MAJOR_SCHED : CTXS__REMOTE_MAJOR;
}

/* The schedule's distinct windows: the groups of a layout in which every
 * windowed layer keeps its ring. */
static uint32_t n_windows(const ctxs_geometry *g)
{
    uint32_t n = 0;
    for (uint32_t j = 0; j < g->period; j++) {
        int seen = !g->window[j];
        for (uint32_t i = 0; i < j && !seen; i++)
            seen = g->window[i] == g->window[j];
        n += !seen;
    }
    return n;
}

/* "<prefix>:<kind>:<model hash>:<form>:<chain>" into key[CHUNK_KEY_MAX],
 * kind "chunk" or "window", the form "<dtype>-<layers>x<kv heads>x<head
 * dim>" ("f16-32x8x128"), and with a layer schedule "-w" and the
 * pattern's windows joined by '.' ("f16-6x2x16-w0.6.10"). The model hash
 * names the weights, not the form of their KV: an fp16 and a Q8 store of
 * one model compute the same chain for the same ids, and without the form
 * in the key each would find the other's chunks "present" and refuse
 * them at every pull, for good. The schedule is in it for the same
 * reason: a chunk of a scheduled session carries its global layers only. */
#define CHUNK_KEY_MAX (CTXS_NAME_MAX + 256)
static void value_key(char *key, const ctxs_remote *r, const char *kind, const ctxs_model *model,
                      const uint8_t chain[16])
{
    char m[33], c[33], sched[96] = "";
    hex32(m, model->model_hash);
    hex32(c, chain);
    const ctxs_geometry *g = &model->geometry;
    const char *dt = g->dtype == CTXS_DTYPE_F16    ? "f16"
                     : g->dtype == CTXS_DTYPE_BF16 ? "bf16"
                     : g->dtype == CTXS_DTYPE_Q8   ? "q8"
                                                   : "dtype?"; /* refused before */
    for (uint32_t j = 0, at = 0; j < g->period && j < CTXS_SCHEDULE_MAX; j++)
        at += (uint32_t)snprintf(sched + at, sizeof(sched) - at, "%s%" PRIu32, j ? "." : "-w",
                                 g->window[j]);
    snprintf(key, CHUNK_KEY_MAX, "%s:%s:%s:%s-%" PRIu32 "x%" PRIu32 "x%" PRIu32 "%s:%s",
             r->prefix, kind, m, dt, g->n_layers, g->n_kv_heads, g->head_dim, sched, c);
}

static void chunk_key(char *key, const ctxs_remote *r, const ctxs_model *model,
                      const uint8_t chain[16])
{
    value_key(key, r, "chunk", model, chain);
}

#define SESSION_KEY_MAX (2 * CTXS_NAME_MAX + 16)
static void session_key(char *key, const ctxs_remote *r, const char *name)
{
    snprintf(key, SESSION_KEY_MAX, "%s:session:%s", r->prefix, name);
}

/* --- Large values, around hiredis's buffers ------------------------------------ */

/* hiredis 0.14 reads 16 KiB at a time into a reader buffer (an sds that
 * grows by 1 MiB steps past 1 MiB, and is freed once empty), then copies
 * each bulk reply into a new allocation; it formats a command into a new
 * allocation, then appends that to its output buffer. A 9 MiB chunk thus
 * costs two copies each way, ~600 read calls and ~4,600 page faults of
 * fresh memory per value. The pull and the push move chunk values
 * themselves instead: GET replies read straight into one buffer that the
 * pull reuses, SET commands sent straight from the value the push built.
 * hiredis still sends the small commands (GET, EXISTS) and reads the
 * small replies (EXISTS, SET): each side starts with hiredis's buffers
 * empty and leaves them so, at a reply boundary. */

/* What a failed recv or send means: a socket timeout is EAGAIN. */
static int sock_error(ssize_t k)
{
    if (k == 0)
        return -ECONNRESET; /* the server closed the connection */
    return errno == EAGAIN || errno == EWOULDBLOCK ? -ETIMEDOUT : errno ? -errno : -EIO;
}

/* Sends a SET of key to the value v[len], after what hiredis holds,
 * without copying v. */
static int send_set(redisContext *c, const char *key, const uint8_t *v, size_t len)
{
    int rc = obuf_flush(c);
    if (rc < 0)
        return rc;
    char head[CHUNK_KEY_MAX + 64];
    size_t klen = strlen(key);
    int hn = snprintf(head, sizeof(head), "*3\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$%zu\r\n", klen, key,
                      len);
    if (hn < 0 || (size_t)hn >= sizeof(head))
        return CTXS_EINVAL;
    static const char crlf[2] = {'\r', '\n'};
    struct iovec iov[3] = {{head, (size_t)hn}, {(void *)v, len}, {(void *)crlf, 2}};
    struct iovec *at = iov;
    int n = 3;
    while (n > 0) {
        if ((rc = conn_wait(c, POLLOUT)) < 0)
            return rc;
        ssize_t k = ctxs__sendv(c->fd, at, n);
        if (k <= 0)
            return sock_error(k < 0 ? k : -1);
        while (n > 0 && (size_t)k >= at->iov_len) {
            k -= (ssize_t)at->iov_len;
            at++;
            n--;
        }
        if (n > 0) {
            at->iov_base = (uint8_t *)at->iov_base + k;
            at->iov_len -= (size_t)k;
        }
    }
    return 0;
}

/* Reads pipelined bulk replies from c's socket: the lines through a small
 * buffer, a value's bytes straight into the caller's memory. */
typedef struct bulk_in {
    redisContext *c;
    size_t at, len;             /* stage[at, len): read, not yet used */
    char stage[4096];
} bulk_in;

/* CTXS_EREMOTE if hiredis holds bytes it has not made replies of: the
 * server said more than it was asked. */
static int bulk_begin(bulk_in *in, redisContext *c)
{
    in->c = c;
    in->at = in->len = 0;
    return c->reader && c->reader->len != c->reader->pos ? CTXS_EREMOTE : 0;
}

static int bulk_fill(bulk_in *in)
{
    if (in->at == in->len)
        in->at = in->len = 0;
    if (in->len == sizeof(in->stage))
        return CTXS_EREMOTE; /* a line longer than any Redis sends here */
    int rc = conn_wait(in->c, POLLIN);
    if (rc < 0)
        return rc;
    ssize_t k = ctxs__recv(in->c->fd, in->stage + in->len, sizeof(in->stage) - in->len);
    if (k <= 0)
        return sock_error(k);
    in->len += (size_t)k;
    return 0;
}

/* Copies n bytes into dst (NULL: drops them): what the stage holds, then
 * straight from the socket. */
static int bulk_bytes(bulk_in *in, uint8_t *dst, size_t n)
{
    size_t have = in->len - in->at < n ? in->len - in->at : n;
    if (dst)
        memcpy(dst, in->stage + in->at, have);
    in->at += have;
    for (size_t got = have; got < n;) {
        ssize_t k;
        int rc = conn_wait(in->c, POLLIN);
        if (rc < 0)
            return rc;
        if (dst) {
            k = ctxs__recv(in->c->fd, dst + got, n - got);
        } else {
            size_t want = n - got < sizeof(in->stage) ? n - got : sizeof(in->stage);
            k = ctxs__recv(in->c->fd, in->stage, want);
            in->at = in->len = 0;
        }
        if (k <= 0)
            return sock_error(k);
        got += (size_t)k;
    }
    return 0;
}

/* The next reply's first line, without its CRLF, NUL-terminated. */
static int bulk_line(bulk_in *in, char **line)
{
    for (;;) {
        char *s = in->stage + in->at;
        char *nl = memchr(s, '\n', in->len - in->at);
        if (nl) {
            if (nl == s || nl[-1] != '\r')
                return CTXS_EREMOTE;
            nl[-1] = '\0';
            in->at = (size_t)(nl + 1 - in->stage);
            *line = s;
            return 0;
        }
        if (in->at > 0) { /* the partial line to the front */
            memmove(in->stage, s, in->len - in->at);
            in->len -= in->at;
            in->at = 0;
        }
        int rc = bulk_fill(in);
        if (rc < 0)
            return rc;
    }
}

/* The header of the next reply, which must be a bulk string or an
 * error: *len its length, or -1 for nil or an error. *err is 0, or for
 * an error reply (read whole: the connection stays in step) its error,
 * or WRONGTYPE where the key holds a list, a hash, ... */
#define WRONGTYPE 1
static int bulk_head(bulk_in *in, int64_t *len, int *err)
{
    char *line;
    *len = -1;
    *err = 0;
    int rc = bulk_line(in, &line);
    if (rc < 0)
        return rc;
    if (line[0] == '-') {
        *err = !strncmp(line + 1, "WRONGTYPE", 9) ? WRONGTYPE : error_text(line + 1);
        return 0;
    }
    if (line[0] != '$')
        return CTXS_EREMOTE;
    if (!strcmp(line + 1, "-1")) {
        *len = -1;
        return 0;
    }
    /* A Redis string is at most 512 MiB. */
    size_t n = strlen(line + 1);
    if (n == 0 || n > 10 || strspn(line + 1, "0123456789") != n ||
        (*len = strtoll(line + 1, NULL, 10)) > (int64_t)1 << 32) {
        say("a bulk reply of %.24s bytes, above any string Redis holds", line + 1);
        *len = -1;
        return CTXS_EREMOTE;
    }
    return 0;
}

/* The value of the bulk reply whose header said len (>= 0) into dst
 * (NULL: dropped), and its CRLF. */
static int bulk_body(bulk_in *in, uint8_t *dst, int64_t len)
{
    char crlf[2];
    int rc = bulk_bytes(in, dst, (size_t)len);
    if (rc == 0 && (rc = bulk_bytes(in, (uint8_t *)crlf, 2)) == 0 &&
        (crlf[0] != '\r' || crlf[1] != '\n'))
        rc = CTXS_EREMOTE;
    return rc;
}

/* CTXS_EREMOTE if the server sent more than the replies read. */
static int bulk_end(bulk_in *in)
{
    return in->at == in->len ? 0 : CTXS_EREMOTE;
}

/* --- Waits ------------------------------------------------------------------- */

/* The condition variables r waits on time out on CLOCK_MONOTONIC: a step
 * of the wall clock (NTP, an administrator) must neither stretch a
 * flush's wait nor a backoff by the step, nor cut them short. */
static int cond_init_monotonic(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    int rc = pthread_condattr_init(&a);
    if (rc == 0 && (rc = pthread_condattr_setclock(&a, CLOCK_MONOTONIC)) == 0)
        rc = pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
    return rc;
}

/* ms from now on CLOCK_MONOTONIC, for those condition variables. */
static struct timespec deadline_in(uint32_t ms)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += ms / 1000;
    until.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    return until;
}

/* --- Counters ---------------------------------------------------------------- */

static void count(ctxs_remote *r, uint64_t *field, uint64_t n)
{
    pthread_mutex_lock(&r->mu);
    *field += n;
    pthread_mutex_unlock(&r->mu);
}

static int stopping(ctxs_remote *r)
{
    pthread_mutex_lock(&r->mu);
    int stop = r->stop;
    pthread_mutex_unlock(&r->mu);
    return stop;
}

/* --- Pushing one session ----------------------------------------------------- */

/* A consistent committed state of a session being pushed: its plan in
 * chunks, and the ids, checksums and chains of its tokens as of one
 * refresh. Every block sent is checked against it, and it against the
 * session again before anything is sent. */
typedef struct snapshot {
    ctxs_session *s;            /* read-only; NULL between holds */
    ctxs_store *reopen;         /* non-NULL: s is opened by id for each hold */
    uint64_t id;
    ctxs_model model;
    ctxs__kv_plan plan;         /* n_tokens = n, 64-token blocks */
    uint64_t n;
    uint32_t *ids;              /* [n] */
    uint64_t *sums;             /* [n] */
    uint8_t (*chain)[16];       /* [n / 64 + 1]: whole chunks, then the tail */
} snapshot;

static int open_id(ctxs_session **out, ctxs_store *st, uint64_t id);

/* The push thread holds the session file only while it copies and
 * checks blocks, never while it waits on the network: a handle open for
 * a job held up a local delete or gc (CTXS_EBUSY) for as long as Redis
 * took to answer, seconds per job when Redis is slow or stopped. The
 * file reopened by id is the snapshot's if it has the plan's layout;
 * every block copied from it is then checked against the snapshot's
 * checksums, and the session against the snapshot, as with one handle.
 * A caller that keeps its handle (reopen NULL) holds it throughout. */
static int snapshot_hold(snapshot *sn)
{
    if (sn->s || !sn->reopen)
        return 0;
    int rc = open_id(&sn->s, sn->reopen, sn->id);
    if (rc < 0)
        return rc;
    ctxs_session_info info;
    ctxs_session_get_info(&info, sn->s);
    if (info.capacity != sn->plan.lay.capacity || info.n_sink != sn->plan.lay.n_sink ||
        ((info.flags & CTXS_INFO_RING) != 0) != (sn->plan.ring != 0) ||
        memcmp(&info.model, &sn->model, sizeof(info.model)))
        return CTXS_ESTALE; /* another file under the id (a compaction) */
    return 0;
}

static void snapshot_release(snapshot *sn)
{
    if (sn->reopen) {
        ctxs_session_close(sn->s);
        sn->s = NULL;
    }
}

static void snapshot_free(snapshot *sn)
{
    free(sn->ids);
    free(sn->sums);
    free(sn->chain);
    sn->ids = NULL;
    sn->sums = NULL;
    sn->chain = NULL;
}

/* Refreshes s and takes its state. Errors: CTXS_EEVICTED (a ring that
 * wrapped), CTXS_ENOMEM, refresh's. */
static int snapshot_take(snapshot *sn, ctxs_session *s, uint64_t id)
{
    memset(sn, 0, sizeof(*sn));
    sn->s = s;
    sn->id = id;
    int rc = ctxs_session_refresh(s);
    if (rc < 0)
        return rc;
    ctxs_session_info info;
    ctxs_session_get_info(&info, s);
    sn->model = info.model;
    /* Only a session that holds every token from position 0 pushes: a
     * chunk is keyed by the chain from the start. */
    if (ctxs__session_prefix_held(NULL, s) != info.n_tokens)
        return CTXS_EEVICTED;
    sn->n = info.n_tokens;
    const ctxs_geometry *g = &info.model.geometry;
    if ((rc = ctxs__kv_plan_make(&sn->plan, g, info.capacity, info.n_sink,
                                 g->period ? ctxs__session_batch(s) : 0,
                                 (info.flags & CTXS_INFO_RING) != 0, info.n_tokens,
                                 info.ring_start, CTXS_PREFIX_CHUNK)) < 0)
        return rc == CTXS_ECORRUPT ? CTXS_EINVAL : rc; /* 64 tokens above 64 MiB */
    /* A chunk carries the global layers, the window value each window's
     * layers from their rings: a windowed layer laid out in the session's
     * slots (its ring would not be smaller) is neither. */
    if (sn->plan.lay.n_groups != n_windows(g)) {
        say("the session's %" PRIu32 " slots (batch %" PRIu32 ") lay out a windowed layer "
            "without its ring; the remote tier needs every windowed layer's ring (export "
            "the session instead)", info.capacity, ctxs__session_batch(s));
        return CTXS_EINVAL;
    }
    uint64_t n_chunks = sn->n / CTXS_PREFIX_CHUNK;
    if (!(sn->ids = ctxs__malloc(sn->n * 4 + 4)) || !(sn->sums = ctxs__malloc(sn->n * 8 + 8)) ||
        !(sn->chain = ctxs__malloc((n_chunks + 1) * 16)))
        return CTXS_ENOMEM;
    ctxs__session_tokens(sn->ids, sn->sums, s, 0, sn->n);
    static const uint8_t zero[16];
    ctxs__prefix_chains(sn->chain, sn->ids, n_chunks);
    if (sn->n % CTXS_PREFIX_CHUNK)
        ctxs__prefix_chain_next(sn->chain[n_chunks], n_chunks ? sn->chain[n_chunks - 1] : zero,
                                sn->ids + n_chunks * CTXS_PREFIX_CHUNK,
                                (uint32_t)(sn->n % CTXS_PREFIX_CHUNK));
    return 0;
}

/* CTXS_ESTALE unless the session still holds the snapshot's tokens with
 * the same checksums: then every block checked against the snapshot is
 * part of one committed state (a held slot is never rewritten before a
 * record stops holding it). */
static int snapshot_still_held(snapshot *sn)
{
    int rc = ctxs__kv_still_holds(&sn->plan, sn->s);
    if (rc < 0)
        return rc;
    uint64_t now[CTXS_PREFIX_CHUNK];
    for (uint64_t at = 0; at < sn->n; at += CTXS_PREFIX_CHUNK) {
        uint32_t k = (uint32_t)(sn->n - at < CTXS_PREFIX_CHUNK ? sn->n - at : CTXS_PREFIX_CHUNK);
        ctxs__session_tokens(NULL, now, sn->s, at, k);
        if (memcmp(now, sn->sums + at, (size_t)k * 8))
            return CTXS_ESTALE;
    }
    return 0;
}

static uint64_t chunk_value_bytes(const ctxs__kv_plan *p, uint32_t count)
{
    return CTXS__RCHUNK_HEADER_BYTES + count * p->token_raw;
}

/* Builds chunk k's value (k = n / 64 is the tail) into v, which has
 * chunk_value_bytes() bytes: the block copied from the session and
 * checked against the snapshot. */
static int chunk_value(uint8_t *v, snapshot *sn, uint64_t k)
{
    uint64_t first = k * CTXS_PREFIX_CHUNK;
    uint32_t count = (uint32_t)(sn->n - first < CTXS_PREFIX_CHUNK ? sn->n - first
                                                                   : CTXS_PREFIX_CHUNK);
    uint8_t *raw = v + CTXS__RCHUNK_HEADER_BYTES;
    int rc = ctxs__kv_block_read(raw, &sn->plan, -1, sn->s, first, count);
    if (rc < 0)
        return rc;
    if (memcmp(ctxs__raw_ids(raw, count), sn->ids + first, (size_t)count * 4) ||
        memcmp(ctxs__raw_sums(raw), sn->sums + first, (size_t)count * 8))
        return CTXS_ESTALE;
    ctxs__rchunk_header h;
    memset(&h, 0, sizeof(h));
    memcpy(h.magic, CTXS__RCHUNK_MAGIC, 8);
    h.version_major = major_of(&sn->model);
    if (sn->model.geometry.period)
        h.schedule_crc32 = schedule_crc(&sn->model.geometry);
    h.version_minor = CTXS__REMOTE_MINOR;
    h.header_bytes = CTXS__RCHUNK_HEADER_BYTES;
    h.dtype = sn->model.geometry.dtype;
    h.n_layers = sn->model.geometry.n_layers;
    h.n_kv_heads = sn->model.geometry.n_kv_heads;
    h.head_dim = sn->model.geometry.head_dim;
    h.count = count;
    h.raw_bytes = (uint32_t)(count * sn->plan.token_raw);
    h.first_pos = first;
    memcpy(h.model_hash, sn->model.model_hash, 16);
    if (k)
        memcpy(h.prev_chain, sn->chain[k - 1], 16);
    memcpy(h.chain, sn->chain[k], 16);
    h.crc32 = crc_of(&h, offsetof(ctxs__rchunk_header, crc32));
    memcpy(v, &h, sizeof(h));
    return 0;
}

typedef struct push_counts {
    uint64_t sent, present, bytes, dropped;
} push_counts;

/* --- The windowed layers' state (2.0) --------------------------------------- */

/* A Redis string holds at most 512 MiB. */
#define WINDOW_VALUE_MAX (512ull << 20)

/* The positions of group gi's window at n tokens. */
static ctxs__kv_range window_of(const ctxs__kv_plan *p, uint32_t gi, uint64_t n)
{
    uint64_t w = p->lay.groups[gi].window;
    return (ctxs__kv_range){n > w ? n - w : 0, n};
}

/* The raw bytes of a window value at n tokens. */
static uint64_t window_raw_bytes(const ctxs__kv_plan *p, uint64_t n)
{
    uint64_t sum = 0;
    for (uint32_t gi = 0; gi < p->lay.n_groups; gi++) {
        ctxs__kv_range w = window_of(p, gi, n);
        sum += (w.end - w.start) * p->group_raw[gi];
    }
    return sum;
}

/* The chain at the snapshot's count: its last chunk's, whole or tail. */
static const uint8_t *chain_at_end(const snapshot *sn)
{
    return sn->chain[(sn->n - 1) / CTXS_PREFIX_CHUNK];
}

/* Builds the window value of a scheduled snapshot (n > 0) into *out
 * (malloc'd, *len bytes): each group's blocks copied from its ring and
 * checked against the group's table, their ids against the snapshot's,
 * and the session against the snapshot once all are copied. */
static int window_value(uint8_t **out, size_t *len, snapshot *sn)
{
    *out = NULL;
    const ctxs__kv_plan *p = &sn->plan;
    uint64_t raw_bytes = window_raw_bytes(p, sn->n);
    if (CTXS__RWINDOW_HEADER_BYTES + raw_bytes > WINDOW_VALUE_MAX) {
        say("the windowed layers' state of %" PRIu64 " tokens takes %" PRIu64
            " bytes, above the 512 MiB a Redis value holds", sn->n, raw_bytes);
        return CTXS_EINVAL;
    }
    uint8_t *v = ctxs__malloc(CTXS__RWINDOW_HEADER_BYTES + raw_bytes);
    if (!v)
        return CTXS_ENOMEM;
    int rc = snapshot_hold(sn);
    uint8_t *at = v + CTXS__RWINDOW_HEADER_BYTES;
    for (uint32_t gi = 0; rc == 0 && gi < p->lay.n_groups; gi++) {
        ctxs__kv_range w = window_of(p, gi, sn->n);
        for (uint64_t first = w.start; rc == 0 && first < w.end;) {
            uint32_t cnt = (uint32_t)(w.end - first < CTXS_PREFIX_CHUNK ? w.end - first
                                                                         : CTXS_PREFIX_CHUNK);
            rc = ctxs__kv_block_read(at, p, (int32_t)gi, sn->s, first, cnt);
            if (rc == 0 && memcmp(ctxs__raw_ids(at, cnt), sn->ids + first, (size_t)cnt * 4))
                rc = CTXS_ESTALE;
            at += ctxs__kv_raw_bytes(p, (int32_t)gi, cnt);
            first += cnt;
        }
    }
    if (rc == 0)
        rc = snapshot_still_held(sn);
    snapshot_release(sn);
    if (rc < 0) {
        free(v);
        return rc;
    }
    ctxs__rwindow_header h;
    memset(&h, 0, sizeof(h));
    memcpy(h.magic, CTXS__RWINDOW_MAGIC, 8);
    h.version_major = CTXS__REMOTE_MAJOR_SCHED;
    h.version_minor = CTXS__REMOTE_MINOR;
    h.header_bytes = CTXS__RWINDOW_HEADER_BYTES;
    h.dtype = sn->model.geometry.dtype;
    h.n_layers = sn->model.geometry.n_layers;
    h.n_kv_heads = sn->model.geometry.n_kv_heads;
    h.head_dim = sn->model.geometry.head_dim;
    h.schedule_crc32 = schedule_crc(&sn->model.geometry);
    h.n_groups = p->lay.n_groups;
    h.n_tokens = sn->n;
    memcpy(h.model_hash, sn->model.model_hash, 16);
    memcpy(h.chain, chain_at_end(sn), 16);
    h.raw_bytes = raw_bytes;
    h.crc32 = crc_of(&h, offsetof(ctxs__rwindow_header, crc32));
    memcpy(v, &h, sizeof(h));
    *out = v;
    *len = (size_t)(CTXS__RWINDOW_HEADER_BYTES + raw_bytes);
    return 0;
}

/* Pushes the window value of a scheduled snapshot unless Redis has it
 * (content-addressed, like a chunk: the same key never takes other
 * bytes). Counted as one more chunk. Nothing for a session without a
 * schedule, or without tokens. */
static int push_window(redisContext *c, ctxs_remote *r, snapshot *sn, push_counts *pc)
{
    if (!sn->model.geometry.period || sn->n == 0)
        return 0;
    char key[CHUNK_KEY_MAX];
    value_key(key, r, "window", &sn->model, chain_at_end(sn));
    const char *argv[] = {"EXISTS", key};
    redisReply *rep;
    int rc = command(&rep, c, &CAP_SMALL, 2, argv, NULL);
    if (rc == 0 && (rc = reply_check(c, rep, 0)) == 0 && rep->type != REDIS_REPLY_INTEGER)
        rc = CTXS_EREMOTE;
    int have = rc == 0 && rep->integer != 0;
    if (rep)
        freeReplyObject(rep);
    if (rc < 0)
        return rc;
    if (have) {
        pc->present++;
        return 0;
    }
    uint8_t *v;
    size_t len;
    if ((rc = window_value(&v, &len, sn)) < 0)
        return rc;
    rc = send_set(c, key, v, len);
    free(v);
    if (rc == 0 && (rc = reply_next(&rep, c)) == 0) {
        rc = reply_check(c, rep, 0);
        freeReplyObject(rep);
    }
    if (rc == 0) {
        pc->sent++;
        pc->bytes += len;
    }
    return rc;
}

/* Pushes chunks [from, to) of the snapshot (to = n / 64 + 1: the tail
 * too) that Redis lacks, a pipeline of at most PIPELINE_BYTES of values
 * at a time: EXISTS for the batch, then a SET of each one missing. Each
 * value is built in one buffer (copied from the session, checked against
 * the snapshot), the session checked to still hold the snapshot, and the
 * value sent from there (send_set) before the next is built: one chunk's
 * memory, whatever the batch. */
static int push_chunks(redisContext *c, ctxs_remote *r, snapshot *sn, uint64_t from, uint64_t to,
                       push_counts *pc, ctxs_progress_fn progress, void *progress_arg)
{
    uint64_t whole = sn->n / CTXS_PREFIX_CHUNK;
    if (to > whole + (sn->n % CTXS_PREFIX_CHUNK != 0))
        to = whole + (sn->n % CTXS_PREFIX_CHUNK != 0);
    uint64_t vbytes = chunk_value_bytes(&sn->plan, CTXS_PREFIX_CHUNK);
    uint64_t batch = PIPELINE_BYTES / vbytes ? PIPELINE_BYTES / vbytes : 1;
    uint8_t *value = NULL;
    uint8_t *missing = NULL;
    char(*keys)[CHUNK_KEY_MAX] = NULL;
    int rc = 0;
    if (from < to && (!(missing = ctxs__malloc((size_t)batch)) ||
                      !(keys = ctxs__malloc((size_t)batch * CHUNK_KEY_MAX))))
        rc = CTXS_ENOMEM;
    for (uint64_t b0 = from; rc == 0 && b0 < to; b0 += batch) {
        /* ctxs_remote_close() waits for the job under way: a job of many
         * batches ends at the next one, within one batch's timeouts. */
        if (stopping(r)) {
            rc = -ECANCELED;
            break;
        }
        uint64_t nb = to - b0 < batch ? to - b0 : batch;
        /* Every reply to what was appended is read, also after an error
         * reply: a connection left out of step would hand the next job
         * this one's replies. Only an I/O error (no reply) ends the
         * reading, and the caller then drops the connection. */
        uint64_t appended = 0;
        cap_set(c, &CAP_SMALL);
        for (uint64_t i = 0; i < nb && rc == 0; i++) {
            chunk_key(keys[i], r, &sn->model, sn->chain[b0 + i]);
            const char *argv[] = {"EXISTS", keys[i]};
            if (redisAppendCommandArgv(c, 2, argv, NULL) != REDIS_OK)
                rc = context_error(c, errno);
            else
                appended++;
        }
        uint64_t n_missing = 0;
        int io = 0;
        for (uint64_t i = 0; i < appended && !io; i++) {
            redisReply *rep;
            int r1 = reply_next(&rep, c);
            io = r1 < 0;
            if (r1 == 0)
                r1 = reply_check(c, rep, 0);
            if (r1 == 0 && rep->type != REDIS_REPLY_INTEGER)
                r1 = CTXS_EREMOTE;
            missing[i] = r1 == 0 && rep->integer == 0;
            n_missing += missing[i];
            if (rc == 0)
                rc = r1;
            if (rep)
                freeReplyObject(rep);
        }
        if (rc == 0 && n_missing && !value && !(value = ctxs__malloc((size_t)vbytes)))
            rc = CTXS_ENOMEM;
        /* Each value: copied and checked with the session file held, which
         * is closed again before the value goes out (a slow Redis must not
         * keep a local delete waiting), then sent. */
        uint64_t sent = 0, sent_bytes = 0;
        for (uint64_t i = 0; i < nb && rc == 0; i++) {
            if (!missing[i])
                continue;
            uint64_t first = (b0 + i) * CTXS_PREFIX_CHUNK;
            uint32_t cnt = (uint32_t)(sn->n - first < CTXS_PREFIX_CHUNK ? sn->n - first
                                                                         : CTXS_PREFIX_CHUNK);
            size_t len = (size_t)chunk_value_bytes(&sn->plan, cnt);
            if ((rc = snapshot_hold(sn)) == 0 && (rc = chunk_value(value, sn, b0 + i)) == 0)
                rc = snapshot_still_held(sn);
            snapshot_release(sn);
            if (rc == 0 && (rc = send_set(c, keys[i], value, len)) == 0) {
                sent++;
                sent_bytes += len;
            }
        }
        /* As above: every SET's reply, an error reply (OOM) included. */
        io = 0;
        for (uint64_t i = 0; i < sent && !io; i++) {
            redisReply *rep;
            int r1 = reply_next(&rep, c);
            io = r1 < 0;
            if (r1 == 0)
                r1 = reply_check(c, rep, 0);
            if (rc == 0)
                rc = r1;
            if (rep)
                freeReplyObject(rep);
        }
        if (rc == 0) {
            pc->sent += n_missing;
            pc->present += nb - n_missing;
            pc->bytes += sent_bytes;
            uint64_t done = (b0 + nb) * CTXS_PREFIX_CHUNK; /* a tail counts whole */
            if (progress && done < sn->n)
                progress(progress_arg, done, sn->n);
        }
    }
    free(value);
    free(missing);
    free(keys);
    return rc;
}

/* The session record of the snapshot, named name, into *out (malloc'd). */
static int record_make(uint8_t **out, size_t *len, ctxs_remote *r, snapshot *sn,
                       const char *name, int tail)
{
    *out = NULL;
    ctxs_meta_entry *meta = NULL;
    size_t n_meta = 0;
    uint8_t *section = NULL;
    uint32_t meta_bytes = 0, meta_count = 0;
    ctxs_model_entry me;
    int rc = ctxs_model_get(&me, r->st, sn->model.model_hash);
    if (rc == CTXS_ENOTFOUND) {
        me.name[0] = '\0';
        rc = 0;
    }
    if (rc == 0 && (rc = ctxs_store_session_list_meta(&meta, &n_meta, r->st, name)) == 0)
        rc = ctxs__meta_section_make(&section, &meta_bytes, &meta_count, meta, n_meta);
    ctxs_free(meta);
    if (rc < 0)
        return rc;
    if (sn->n > CTXS__REMOTE_MAX_TOKENS) {
        free(section);
        return CTXS_EINVAL;
    }
    ctxs__rsession_header h;
    memset(&h, 0, sizeof(h));
    memcpy(h.magic, CTXS__RSESSION_MAGIC, 8);
    h.version_major = major_of(&sn->model);
    h.version_minor = CTXS__REMOTE_MINOR;
    h.header_bytes = CTXS__RSESSION_HEADER_BYTES;
    h.dtype = sn->model.geometry.dtype;
    h.n_layers = sn->model.geometry.n_layers;
    h.n_kv_heads = sn->model.geometry.n_kv_heads;
    h.head_dim = sn->model.geometry.head_dim;
    memcpy(h.model_hash, sn->model.model_hash, 16);
    memcpy(h.tokenizer_hash, sn->model.tokenizer_hash, 16);
    h.n_tokens = sn->n;
    h.updated_unix_ms = ctxs__now_ms();
    h.flags = tail || sn->n % CTXS_PREFIX_CHUNK == 0 ? CTXS__RSESSION_FLAG_TAIL : 0;
    h.name_len = (uint16_t)strlen(name);
    memcpy(h.name, name, h.name_len);
    h.model_name_len = (uint16_t)strlen(me.name);
    memcpy(h.model_name, me.name, h.model_name_len);
    h.meta_bytes = meta_bytes;
    h.meta_count = meta_count;
    size_t sched = sn->model.geometry.period ? CTXS__RSCHEDULE_BYTES : 0;
    size_t total = sizeof(h) + sched + (size_t)sn->n * 4 + meta_bytes;
    uint8_t *v = ctxs__malloc(total);
    if (!v) {
        free(section);
        return CTXS_ENOMEM;
    }
    if (sched)
        schedule_bytes(v + sizeof(h), &sn->model.geometry);
    memcpy(v + sizeof(h) + sched, sn->ids, (size_t)sn->n * 4);
    if (meta_bytes)
        memcpy(v + sizeof(h) + sched + sn->n * 4, section, meta_bytes);
    free(section);
    h.body_crc32 = crc_of(v + sizeof(h), total - sizeof(h));
    h.crc32 = crc_of(&h, offsetof(ctxs__rsession_header, crc32));
    memcpy(v, &h, sizeof(h));
    *out = v;
    *len = total;
    return 0;
}

static int record_push(redisContext *c, ctxs_remote *r, snapshot *sn, const char *name,
                       int tail, push_counts *pc)
{
    uint8_t *v;
    size_t len;
    int rc = record_make(&v, &len, r, sn, name, tail);
    if (rc < 0)
        return rc;
    char key[SESSION_KEY_MAX];
    session_key(key, r, name);
    const char *argv[] = {"SET", key, (const char *)v};
    size_t lens[] = {3, strlen(key), len};
    redisReply *rep;
    if ((rc = command(&rep, c, &CAP_SMALL, 3, argv, lens)) == 0)
        rc = reply_check(c, rep, 0);
    if (rep)
        freeReplyObject(rep);
    free(v);
    if (rc == 0) {
        pc->bytes += len;
        count(r, &r->stats.records_pushed, 1);
    }
    return rc;
}

static ctxs_open_options push_open_options(void)
{
    ctxs_open_options o = CTXS_OPEN_OPTIONS_INIT;
    o.background = 0; /* the push reads what it needs by pread */
    return o;
}

/* Opens the file of session id read-only, if it is still the indexed one. */
static int open_id(ctxs_session **out, ctxs_store *st, uint64_t id)
{
    *out = NULL;
    char *path = ctxs__file_path(st, id);
    if (!path)
        return CTXS_ENOMEM;
    ctxs_open_options o = push_open_options();
    int rc = ctxs_session_open(out, path, NULL, CTXS_OPEN_RDONLY, &o);
    free(path);
    struct stat sb;
    if (rc == 0 && ctxs__fstat(ctxs__session_fd(*out), &sb) == 0 && sb.st_nlink == 0) {
        ctxs_session_close(*out); /* deleted meanwhile */
        *out = NULL;
        rc = CTXS_ENOTFOUND;
    }
    return rc == -ENOENT ? CTXS_ENOTFOUND : rc;
}

static int remote_push_impl(ctxs_remote_push_result *out, ctxs_remote *r, const char *name,
                             ctxs_progress_fn progress, void *progress_arg)
{
    if (out)
        memset(out, 0, sizeof(*out));
    size_t len;
    if (!r || !name || ctxs__name_check(name, &len) < 0)
        return CTXS_EINVAL;
    ctxs_session *s;
    ctxs_open_options o = push_open_options();
    int rc = ctxs_store_session_open(&s, r->st, name, NULL, CTXS_OPEN_RDONLY, &o);
    if (rc < 0)
        return rc;
    uint64_t id = 0;
    ctxs__session_store(s, &id);
    snapshot sn;
    push_counts pc = {0};
    redisContext *c = NULL;
    if ((rc = snapshot_take(&sn, s, id)) == 0 && (rc = conn_open(&c, r)) == 0) {
        uint64_t to = sn.n / CTXS_PREFIX_CHUNK + (sn.n % CTXS_PREFIX_CHUNK != 0);
        if ((rc = push_chunks(c, r, &sn, 0, to, &pc, progress, progress_arg)) == 0 &&
            (rc = push_window(c, r, &sn, &pc)) == 0)
            rc = record_push(c, r, &sn, name, 1, &pc);
    }
    if (c)
        conn_close(c);
    pthread_mutex_lock(&r->mu);
    r->stats.chunks_pushed += pc.sent;
    r->stats.chunks_present += pc.present;
    r->stats.bytes_pushed += pc.bytes;
    pthread_mutex_unlock(&r->mu);
    if (rc == 0 && out) {
        out->n_tokens = sn.n;
        out->chunks_sent = pc.sent;
        out->chunks_present = pc.present;
        out->bytes_sent = pc.bytes;
    }
    if (rc == 0 && progress)
        progress(progress_arg, sn.n, sn.n);
    snapshot_free(&sn);
    ctxs_session_close(s);
    return rc;
}

/* --- The push thread ---------------------------------------------------------- */

/* Queues j (r->mu held), merging it into the job before when both push
 * chunks of one session end to end, and keeping one record job per
 * session at the queue's end: a burst of commits costs one record. */
static void enqueue_locked(ctxs_remote *r, job *j)
{
    job *t = r->tail, *tp = r->tail_prev;
    if (j->kind == JOB_CHUNKS) {
        job *chunks = t && t->kind == JOB_RECORD && t->id == j->id ? tp : t;
        if (chunks && chunks->kind == JOB_CHUNKS && chunks->id == j->id && chunks->to == j->from) {
            chunks->to = j->to;
            free(j);
            return;
        }
    } else if (t && t->kind == JOB_RECORD && t->id == j->id) {
        t->tail |= j->tail;
        free(j);
        return;
    } else if (t && t->kind == JOB_CHUNKS && t->id == j->id && tp && tp->kind == JOB_RECORD &&
               tp->id == j->id) {
        /* [record, chunks] + record: the queued record serves, since a
         * record is made from the session as it is when the job runs. */
        tp->tail |= j->tail;
        free(j);
        j = NULL;
    }
    if (!j)
        return;
    if (r->n_jobs >= r->o.queue_max) {
        r->stats.chunks_dropped += job_values(j);
        r->stats.last_error = -ENOBUFS;
        free(j);
        return;
    }
    j->next = NULL;
    if (t)
        t->next = j;
    else
        r->head = j;
    r->tail_prev = t;
    r->tail = j;
    r->n_jobs++;
    pthread_cond_signal(&r->wake);
}

static void enqueue(ctxs_remote *r, enum job_kind kind, uint64_t id, uint64_t from, uint64_t to,
                    int tail)
{
    job *j = ctxs__calloc(1, sizeof(*j));
    if (!j) {
        job lost = {kind, tail, id, from, to, NULL};
        pthread_mutex_lock(&r->mu);
        r->stats.chunks_dropped += job_values(&lost);
        r->stats.last_error = CTXS_ENOMEM;
        pthread_mutex_unlock(&r->mu);
        return;
    }
    *j = (job){kind, tail, id, from, to, NULL};
    pthread_mutex_lock(&r->mu);
    enqueue_locked(r, j);
    pthread_mutex_unlock(&r->mu);
}

void ctxs__remote_note(ctxs_store *st, uint64_t id, uint64_t n_held, int event,
                       uint64_t *noted)
{
    /* Every commit of every session comes here: a store with no remote
     * must not take a process-wide lock for it. st->remote is written
     * under attach_lock with atomic stores; a NULL read here is a commit
     * that came before the attach, as if it had taken the lock first.
     * A remote found is read again under the lock, which keeps it from
     * being freed while it is used. */
    if (!__atomic_load_n(&st->remote, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&attach_lock);
    ctxs_remote *r = st->remote;
    if (r && r->o.push_on_commit) {
        uint64_t chunks = n_held / CTXS_PREFIX_CHUNK;
        /* The first note of a handle starts from chunk 0: the thread asks
         * Redis which of the session's chunks it has (one EXISTS each,
         * pipelined) and sends the others. A rollback lowered *noted to
         * the chunks it left whole (sessions.c, on_rollback), so the
         * chunks rewritten after it are queued here like new ones. */
        if (chunks > *noted)
            enqueue(r, JOB_CHUNKS, id, *noted, chunks, 0);
        /* A record only for a session that changed: one pulled and
         * closed untouched must not replace the fleet's longer record. */
        if ((event == CTXS__REMOTE_COMMIT && chunks != *noted) ||
            event == CTXS__REMOTE_CLOSE_CHANGED)
            enqueue(r, JOB_RECORD, id, 0, 0, event == CTXS__REMOTE_CLOSE_CHANGED);
        *noted = chunks;
    }
    pthread_mutex_unlock(&attach_lock);
}

/* Sleeps ms unless r is stopping; 1 if it is. */
static int backoff_wait(ctxs_remote *r, uint32_t ms)
{
    struct timespec until = deadline_in(ms);
    pthread_mutex_lock(&r->mu);
    while (!r->stop && pthread_cond_timedwait(&r->wake, &r->mu, &until) == 0)
        ;
    int stop = r->stop;
    pthread_mutex_unlock(&r->mu);
    return stop;
}

/* Whether rc is the network's (worth a reconnect and another try). */
static int network_error(int rc)
{
    return rc == -ECONNREFUSED || rc == -ETIMEDOUT || rc == -ECONNRESET || rc == -EPIPE ||
           rc == -EHOSTUNREACH || rc == -ENETUNREACH || rc == -EIO || rc == -ECONNABORTED ||
           rc == -ENOENT || rc == -EADDRNOTAVAIL;
}

/* The thread's state between jobs: its connection. */
typedef struct worker {
    ctxs_remote *r;
    redisContext *c;
} worker;

/* Drops w's connection (r->mu not held). */
static void worker_drop(worker *w)
{
    if (!w->c)
        return;
    conn_close(w->c);
    w->c = NULL;
    pthread_mutex_lock(&w->r->mu);
    w->r->stats.connected = 0;
    pthread_mutex_unlock(&w->r->mu);
}

static int run_job(worker *w, const job *j)
{
    ctxs_remote *r = w->r;
    char name[CTXS_NAME_MAX + 1];
    int rc = 0;
    if (j->kind == JOB_RECORD && (rc = ctxs__session_name_of(name, r->st, j->id)) < 0)
        return rc;
    ctxs_session *s;
    if ((rc = open_id(&s, r->st, j->id)) < 0)
        return rc;
    snapshot sn;
    push_counts pc = {0};
    rc = snapshot_take(&sn, s, j->id);
    /* Closed before any network traffic: see snapshot_hold(). */
    ctxs_session_close(s);
    sn.s = NULL;
    sn.reopen = r->st;
    if (rc == 0 && !w->c && (rc = conn_open(&w->c, r)) == 0) {
        pthread_mutex_lock(&r->mu);
        r->stats.connected = 1;
        pthread_mutex_unlock(&r->mu);
    }
    if (rc == 0)
        call_begin(w->c); /* a job is a call: its own deadline */
    if (rc == 0 && j->kind == JOB_CHUNKS) {
        rc = push_chunks(w->c, r, &sn, j->from, j->to, &pc, NULL, NULL);
    } else if (rc == 0 && (j->tail || !sn.model.geometry.period)) {
        /* A session with a layer schedule sends its record only with its
         * tail and its windowed layers' state at the count the record
         * names (a close after commits): a record sent at a commit would
         * name a count whose windows Redis does not hold, and a pull of it
         * would get nothing (the window value of every count a commit
         * reaches would cost the windows' bytes again and again). */
        uint64_t whole = sn.n / CTXS_PREFIX_CHUNK;
        if (j->tail && sn.n % CTXS_PREFIX_CHUNK)
            rc = push_chunks(w->c, r, &sn, whole, whole + 1, &pc, NULL, NULL);
        if (rc == 0)
            rc = push_window(w->c, r, &sn, &pc);
        if (rc == 0)
            rc = record_push(w->c, r, &sn, name, j->tail, &pc);
    }
    snapshot_free(&sn);
    pthread_mutex_lock(&r->mu);
    r->stats.chunks_pushed += pc.sent;
    r->stats.chunks_present += pc.present;
    r->stats.bytes_pushed += pc.bytes;
    pthread_mutex_unlock(&r->mu);
    return rc;
}

static void *push_thread(void *arg)
{
    worker w = {.r = arg};
    ctxs_remote *r = w.r;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->head && !r->stop) {
            pthread_cond_broadcast(&r->idle);
            pthread_cond_wait(&r->wake, &r->mu);
        }
        if (r->stop)
            break;
        job *j = r->head;
        r->head = j->next;
        if (!r->head)
            r->tail = r->tail_prev = NULL;
        else if (r->tail_prev == j)
            r->tail_prev = NULL;
        r->n_jobs--;
        r->busy = 1;
        pthread_mutex_unlock(&r->mu);

        /* Every wait at most BACKOFF_MAX_MS, the first one too, and the
         * doubling never overflows. */
        uint32_t wait = r->o.backoff_ms < BACKOFF_MAX_MS ? r->o.backoff_ms : BACKOFF_MAX_MS;
        int rc;
        for (uint32_t attempt = 1;; attempt++) {
            rc = run_job(&w, j);
            if (rc == 0 || !network_error(rc) || attempt >= r->o.retries)
                break;
            worker_drop(&w);
            count(r, &r->stats.retries, 1);
            if (backoff_wait(r, wait))
                break;
            wait = wait < BACKOFF_MAX_MS / 2 ? wait * 2 : BACKOFF_MAX_MS;
        }
        pthread_mutex_lock(&r->mu);
        if (rc < 0) {
            /* The local session is intact; ctxs_remote_push() or the next
             * open of the session sends what is missing. */
            r->stats.chunks_dropped += job_values(j);
            r->stats.last_error = rc;
            /* Whatever failed, the connection is dropped: after an error
             * midway through a pipeline (a reply not read, a command
             * left in hiredis's buffer) the next job would read this
             * one's replies as its own. A new connection costs little
             * next to a job that failed. */
            if (w.c) {
                conn_close(w.c);
                w.c = NULL;
            }
        }
        r->stats.connected = w.c != NULL;
        r->busy = 0;
        free(j);
    }
    r->busy = 0;
    pthread_cond_broadcast(&r->idle);
    pthread_mutex_unlock(&r->mu);
    if (w.c)
        conn_close(w.c);
    return NULL;
}

/* --- Open, flush, close --------------------------------------------------------- */

static int options_valid(const ctxs_remote_options *o)
{
    if (o->version != CTXS_REMOTE_OPTIONS_VERSION || o->timeout_ms == 0 || o->retries == 0 ||
        o->queue_max == 0 || o->push_on_commit > 1 || o->pull_on_open > 1)
        return 0;
    for (size_t i = 0; i < sizeof(o->reserved); i++)
        if (o->reserved[i])
            return 0;
    size_t len;
    /* Without ':': prefix "a" and session "b:session:c" would otherwise
     * share the key of prefix "a:session:b" and session "c". */
    return !o->key_prefix ||
           (ctxs__name_check(o->key_prefix, &len) == 0 && !strchr(o->key_prefix, ':'));
}

static int remote_open_impl(ctxs_remote **out, ctxs_store *st, const char *url,
                            const ctxs_remote_options *opts)
{
    if (!out)
        return CTXS_EINVAL;
    *out = NULL;
    ctxs_remote_options o = CTXS_REMOTE_OPTIONS_INIT;
    if (opts)
        o = *opts;
    if (!st || !url || !options_valid(&o))
        return CTXS_EINVAL;
    ctxs_remote *r = ctxs__calloc(1, sizeof(*r));
    if (!r)
        return CTXS_ENOMEM;
    r->o = o;
    r->o.key_prefix = NULL; /* copied: the caller's string may go */
    snprintf(r->prefix, sizeof(r->prefix), "%s", o.key_prefix ? o.key_prefix : "ctxs");
    int rc = url_parse(&r->ep, url);
    redisContext *c = NULL;
    if (rc == 0 && (rc = conn_open(&c, r)) == 0)
        conn_close(c);
    if (rc < 0) {
        free(r);
        return rc;
    }
    pthread_mutex_init(&r->mu, NULL);
    if (cond_init_monotonic(&r->wake) != 0) {
        pthread_mutex_destroy(&r->mu);
        free(r);
        return CTXS_ENOMEM;
    }
    if (cond_init_monotonic(&r->idle) != 0) {
        pthread_cond_destroy(&r->wake);
        pthread_mutex_destroy(&r->mu);
        free(r);
        return CTXS_ENOMEM;
    }
    r->st = st;
    pthread_mutex_lock(&attach_lock);
    if (st->remote)
        rc = CTXS_EBUSY;
    else {
        /* The thread takes no signal of the application's (SIGPIPE from
         * a dead server's socket included): it inherits a full mask. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        if (pthread_create(&r->thread, NULL, push_thread, r) != 0)
            rc = CTXS_ENOMEM;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    if (rc == 0) {
        r->thread_started = 1;
        __atomic_store_n(&st->remote, r, __ATOMIC_RELEASE); /* ctxs__remote_note() */
        ctxs__store_ref(st);
    }
    pthread_mutex_unlock(&attach_lock);
    if (rc < 0) {
        pthread_mutex_destroy(&r->mu);
        pthread_cond_destroy(&r->wake);
        pthread_cond_destroy(&r->idle);
        free(r);
        return rc;
    }
    *out = r;
    return 0;
}

int ctxs_remote_get_stats(ctxs_remote_stats *out, ctxs_remote *r)
{
    ctxs__error_begin();
    if (!out || !r)
        return CTXS_EINVAL;
    pthread_mutex_lock(&r->mu);
    *out = r->stats;
    out->jobs_queued = r->n_jobs + (uint64_t)r->busy;
    pthread_mutex_unlock(&r->mu);
    return 0;
}

int ctxs_remote_flush(ctxs_remote_stats *out, ctxs_remote *r, uint32_t timeout_ms)
{
    ctxs__error_begin();
    if (!r)
        return CTXS_EINVAL;
    struct timespec until = deadline_in(timeout_ms);
    int rc = 0;
    pthread_mutex_lock(&r->mu);
    while ((r->head || r->busy) && !r->stop && rc == 0)
        if (pthread_cond_timedwait(&r->idle, &r->mu, &until) == ETIMEDOUT)
            rc = -ETIMEDOUT;
    if (r->head || r->busy)
        rc = -ETIMEDOUT;
    if (out) {
        *out = r->stats;
        out->jobs_queued = r->n_jobs + (uint64_t)r->busy;
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

int ctxs_remote_close(ctxs_remote_stats *out, ctxs_remote *r, uint32_t timeout_ms)
{
    ctxs__error_begin();
    if (!r)
        return 0;
    /* Detached first: hooks queue nothing more. */
    pthread_mutex_lock(&attach_lock);
    if (r->st->remote == r)
        __atomic_store_n(&r->st->remote, NULL, __ATOMIC_RELEASE); /* ctxs__remote_note() */
    while (r->users > 0)
        pthread_cond_wait(&users_done, &attach_lock);
    pthread_mutex_unlock(&attach_lock);
    int rc = ctxs_remote_flush(NULL, r, timeout_ms);
    pthread_mutex_lock(&r->mu);
    r->stop = 1;
    pthread_cond_broadcast(&r->wake);
    pthread_mutex_unlock(&r->mu);
    /* The job under way ends within its commands' timeouts. */
    pthread_join(r->thread, NULL);
    for (job *j = r->head, *next; j; j = next) {
        next = j->next;
        r->stats.chunks_dropped += job_values(j);
        free(j);
    }
    r->head = r->tail = r->tail_prev = NULL;
    r->n_jobs = 0;
    r->stats.connected = 0;
    if (out) {
        *out = r->stats;
        out->jobs_queued = 0;
    }
    ctxs__store_unref(r->st);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->wake);
    pthread_cond_destroy(&r->idle);
    free(r);
    return rc;
}

/* --- Pulling ------------------------------------------------------------------ */

/* A session record, checked. */
typedef struct record {
    ctxs__rsession_header h;
    ctxs_model model;
    char model_name[CTXS_NAME_MAX + 1];
    uint32_t *ids;              /* [h.n_tokens], malloc'd */
    uint8_t *meta;              /* the metadata section, malloc'd */
    ctxs__meta_item *items;     /* pointing into meta */
} record;

static void record_free(record *rec)
{
    free(rec->ids);
    free(rec->meta);
    free(rec->items);
}

/* Checks a record's header (the first CTXS__RSESSION_HEADER_BYTES of v).
 * Errors: CTXS_EREMOTE. */
static int record_header_check(ctxs__rsession_header *h, const void *v, size_t len)
{
    if (len < sizeof(*h))
        return CTXS_EREMOTE;
    memcpy(h, v, sizeof(*h));
    char name[CTXS_NAME_MAX + 1];
    ctxs_geometry g = {h->n_layers, h->n_kv_heads, h->head_dim, h->dtype, 0, {0}};
    ctxs__file_layout lay;
    if (memcmp(h->magic, CTXS__RSESSION_MAGIC, 8) ||
        (h->version_major != CTXS__REMOTE_MAJOR && h->version_major != CTXS__REMOTE_MAJOR_SCHED) ||
        h->header_bytes != sizeof(*h) ||
        h->crc32 != crc_of(h, offsetof(ctxs__rsession_header, crc32)) ||
        (h->flags & ~CTXS__RSESSION_FLAG_TAIL) || h->n_tokens > CTXS__REMOTE_MAX_TOKENS ||
        ctxs__layout_compute(&lay, &g, CTXS_PREFIX_CHUNK, 0, 0) < 0 ||
        ctxs__name_field(name, h->name, h->name_len, 0) < 0 ||
        ctxs__name_field(name, h->model_name, h->model_name_len, 1) < 0)
        return CTXS_EREMOTE;
    return 0;
}

static int record_parse(record *rec, const void *v, size_t len, const char *name)
{
    memset(rec, 0, sizeof(*rec));
    ctxs__rsession_header *h = &rec->h;
    int rc = record_header_check(h, v, len);
    if (rc < 0)
        return rc;
    const uint8_t *body = (const uint8_t *)v + sizeof(*h);
    size_t sched = h->version_major == CTXS__REMOTE_MAJOR_SCHED ? CTXS__RSCHEDULE_BYTES : 0;
    if (len != sizeof(*h) + sched + h->n_tokens * 4 + h->meta_bytes ||
        crc_of(body, len - sizeof(*h)) != h->body_crc32 || h->name_len != strlen(name) ||
        memcmp(h->name, name, h->name_len))
        return CTXS_EREMOTE;
    rec->model.geometry = (ctxs_geometry){h->n_layers, h->n_kv_heads, h->head_dim, h->dtype, 0, {0}};
    if (sched) {
        /* A 2.0 record is a scheduled session's: a schedule of period 0
         * would be 1.0's, and one that breaks the rules is damage. */
        memcpy(&rec->model.geometry.period, body, 4);
        memcpy(rec->model.geometry.window, body + 4, 32);
        if (!rec->model.geometry.period || ctxs__schedule_check(&rec->model.geometry) < 0) {
            say("the session record's layer schedule is damaged");
            return CTXS_EREMOTE;
        }
        body += sched;
    }
    memcpy(rec->model.model_hash, h->model_hash, 16);
    memcpy(rec->model.tokenizer_hash, h->tokenizer_hash, 16);
    memcpy(rec->model_name, h->model_name, h->model_name_len);
    rec->model_name[h->model_name_len] = '\0';
    if (!(rec->ids = ctxs__malloc(h->n_tokens * 4 + 4)) ||
        (h->meta_bytes && !(rec->meta = ctxs__malloc(h->meta_bytes))))
        return CTXS_ENOMEM;
    memcpy(rec->ids, body, h->n_tokens * 4);
    if (h->meta_bytes)
        memcpy(rec->meta, body + h->n_tokens * 4, h->meta_bytes);
    rc = ctxs__meta_section_parse(&rec->items, rec->meta, h->meta_bytes, h->meta_count);
    return rc == CTXS_ECORRUPT ? CTXS_EREMOTE : rc;
}

/* What a pull writes: the chunks of ids[0..n) for model, into a new file
 * laid out for capacity slots. */
typedef struct pull_job {
    ctxs_remote *r;
    redisContext *c;
    ctxs_model model;
    const uint32_t *ids;
    uint64_t n;                 /* ids the pull may take */
    uint64_t n_ids;             /* ids: the record's count, or the prompt's */
    int try_tail;               /* also a tail chunk ending at n */
    int prefix;                 /* pull_prefix: no good chunk is ENOTFOUND */
    uint32_t capacity, n_sink;
    uint32_t batch;             /* with a layer schedule: the rings' batch */
    int ring;
    uint64_t created_unix_ms;
    /* results */
    uint64_t got;               /* tokens written */
    uint64_t chunks, missing, refused;
    ctxs_progress_fn progress;
    void *progress_arg;
} pull_job;

/* Checks one chunk value against where the chain puts it. 0: good, 1:
 * refused. */
static int chunk_check(const pull_job *pj, const ctxs__kv_plan *p, uint8_t *v, uint64_t len,
                       uint64_t first, uint32_t count, const uint8_t prev[16],
                       const uint8_t chain[16])
{
    uint64_t want = chunk_value_bytes(p, count);
    if (len != want)
        return 1;
    ctxs__rchunk_header h;
    memcpy(&h, v, sizeof(h));
    uint8_t *raw = v + sizeof(h);
    const ctxs_geometry *g = &pj->model.geometry;
    static const uint8_t zero[sizeof(h.reserved)];
    uint32_t sched = g->period ? schedule_crc(g) : 0;
    if (h.crc32 != crc_of(&h, offsetof(ctxs__rchunk_header, crc32)) ||
        memcmp(h.magic, CTXS__RCHUNK_MAGIC, 8) || h.version_major != major_of(&pj->model) ||
        h.schedule_crc32 != sched ||
        h.header_bytes != sizeof(h) || h.dtype != g->dtype || h.n_layers != g->n_layers ||
        h.n_kv_heads != g->n_kv_heads || h.head_dim != g->head_dim || h.count != count ||
        h.first_pos != first || h.raw_bytes != want - sizeof(h) ||
        memcmp(h.model_hash, pj->model.model_hash, 16) || memcmp(h.prev_chain, prev, 16) ||
        memcmp(h.chain, chain, 16) || memcmp(h.reserved, zero, sizeof(zero)))
        return 1;
    uint8_t again[16];
    ctxs__prefix_chain_next(again, prev, ctxs__raw_ids(raw, count), count);
    if (memcmp(again, chain, 16) ||
        memcmp(ctxs__raw_ids(raw, count), pj->ids + first, (size_t)count * 4) ||
        !ctxs__kv_raw_verifies(p, -1, raw, first, count))
        return 1;
    return 0;
}

/* Fetches and writes chunks in order, a pipeline of GETs of at most
 * PIPELINE_BYTES of values at a time, until the first one missing or
 * refused. No EXISTS, and no binary search over the chain: the GETs are
 * needed anyway for what is present, and LRU eviction can take a middle
 * chunk, so presence is not monotone in the chunk count (a binary search
 * would step over the hole). Each value is read into one buffer, checked
 * there and written from there (bulk_in). */
static int pull_chunks(pull_job *pj, const ctxs__kv_plan *p, int fd)
{
    uint64_t whole = pj->n / CTXS_PREFIX_CHUNK;
    uint64_t total = whole + (pj->try_tail && pj->n % CTXS_PREFIX_CHUNK != 0);
    uint64_t vbytes = chunk_value_bytes(p, CTXS_PREFIX_CHUNK);
    uint64_t batch = PIPELINE_BYTES / vbytes ? PIPELINE_BYTES / vbytes : 1;
    uint8_t prev[16] = {0}, chain[16];
    uint8_t(*chains)[16] = ctxs__malloc((size_t)(batch < total ? batch : total) * 16 + 16);
    uint8_t *value = total ? ctxs__malloc((size_t)vbytes) : NULL;
    bulk_in *in = ctxs__malloc(sizeof(*in));
    /* A chunk reply holds at most a whole chunk of this model. */
    reply_cap cap = {"chunk reply", vbytes, 4096, 0};
    cap_set(pj->c, &cap);
    int rc = chains && (value || !total) && in ? bulk_begin(in, pj->c) : CTXS_ENOMEM;
    int stopped = 0, failed = 0;
    for (uint64_t b0 = 0; rc == 0 && !stopped && b0 < total; b0 += batch) {
        uint64_t nb = total - b0 < batch ? total - b0 : batch;
        memcpy(chain, prev, 16);
        for (uint64_t i = 0; i < nb && rc == 0; i++) {
            uint64_t first = (b0 + i) * CTXS_PREFIX_CHUNK;
            uint32_t cnt = (uint32_t)(pj->n - first < CTXS_PREFIX_CHUNK ? pj->n - first
                                                                         : CTXS_PREFIX_CHUNK);
            ctxs__prefix_chain_next(chains[i], chain, pj->ids + first, cnt);
            memcpy(chain, chains[i], 16);
            char key[CHUNK_KEY_MAX];
            chunk_key(key, pj->r, &pj->model, chains[i]);
            const char *argv[] = {"GET", key};
            if (redisAppendCommandArgv(pj->c, 2, argv, NULL) != REDIS_OK)
                rc = context_error(pj->c, errno);
        }
        if (rc == 0)
            rc = obuf_flush(pj->c);
        /* Every reply is read, also after the pull stopped and after
         * an error reply: the connection must be left in step. */
        for (uint64_t i = 0; i < nb && rc == 0; i++) {
            int64_t len;
            int err;
            if ((rc = bulk_head(in, &len, &err)) < 0)
                break;
            if (len > (int64_t)vbytes) {
                say("a chunk reply of %" PRId64 " bytes, above the %" PRIu64
                    " a chunk of this model holds", len, vbytes);
                rc = CTXS_EREMOTE;
                break;
            }
            uint64_t first = (b0 + i) * CTXS_PREFIX_CHUNK;
            uint32_t cnt = (uint32_t)(pj->n - first < CTXS_PREFIX_CHUNK ? pj->n - first
                                                                         : CTXS_PREFIX_CHUNK);
            int take = !stopped && len == (int64_t)chunk_value_bytes(p, cnt);
            if (len >= 0 && (rc = bulk_body(in, take ? value : NULL, len)) < 0)
                break;
            if (stopped)
                continue;
            if (err == WRONGTYPE) {
                /* Not a string: whatever holds the key, it is no chunk. */
                pj->refused = 1;
                stopped = 1;
            } else if (err < 0) {
                /* The server's own error: the pull fails with it, once
                 * the replies after it are read. */
                failed = err;
                stopped = 1;
            } else if (len < 0) {
                pj->missing = 1;
                stopped = 1;
            } else if (!take || chunk_check(pj, p, value, (uint64_t)len, first, cnt, prev,
                                            chains[i])) {
                pj->refused = 1;
                stopped = 1;
            } else if ((rc = ctxs__kv_block_store(fd, p, -1, value + CTXS__RCHUNK_HEADER_BYTES, first,
                                                  cnt)) == 0) {
                memcpy(prev, chains[i], 16);
                pj->got = first + cnt;
                pj->chunks++;
                if (pj->progress)
                    pj->progress(pj->progress_arg, pj->got, pj->n);
            }
        }
    }
    if (rc == 0)
        rc = bulk_end(in);
    if (rc == 0)
        rc = failed;
    free(in);
    free(value);
    free(chains);
    return rc;
}

static int full_or(int rc)
{
    return rc == -ENOSPC || rc == -EDQUOT || rc == -EFBIG ? CTXS_EFULL : rc;
}

/* The chain of ids[0..at): its last chunk's, whole or tail (at > 0). */
static int chain_of(uint8_t out[16], const uint32_t *ids, uint64_t at)
{
    static const uint8_t zero[16];
    uint64_t whole = at / CTXS_PREFIX_CHUNK;
    uint8_t(*c)[16] = ctxs__malloc((size_t)whole * 16 + 16);
    if (!c)
        return CTXS_ENOMEM;
    ctxs__prefix_chains(c, ids, whole);
    const uint8_t *prev = whole ? c[whole - 1] : zero;
    if (at % CTXS_PREFIX_CHUNK)
        ctxs__prefix_chain_next(out, prev, ids + whole * CTXS_PREFIX_CHUNK,
                                (uint32_t)(at % CTXS_PREFIX_CHUNK));
    else
        memcpy(out, prev, 16);
    free(c);
    return 0;
}

/* 0 if v (len bytes) is the window value at `at` tokens of pj's ids,
 * whose chain is chain: its header, and every token of every group's
 * blocks (its id the record's, its checksum recomputed from its position,
 * id and bytes); 1: refused. */
static int window_check(const pull_job *pj, const ctxs__kv_plan *p, uint8_t *v, uint64_t len,
                        uint64_t at, const uint8_t chain[16])
{
    ctxs__rwindow_header h;
    if (len < sizeof(h))
        return 1;
    memcpy(&h, v, sizeof(h));
    const ctxs_geometry *g = &pj->model.geometry;
    static const uint8_t zero[sizeof(h.reserved)];
    if (len != sizeof(h) + window_raw_bytes(p, at) ||
        h.crc32 != crc_of(&h, offsetof(ctxs__rwindow_header, crc32)) ||
        memcmp(h.magic, CTXS__RWINDOW_MAGIC, 8) || h.version_major != CTXS__REMOTE_MAJOR_SCHED ||
        h.header_bytes != sizeof(h) || h.dtype != g->dtype || h.n_layers != g->n_layers ||
        h.n_kv_heads != g->n_kv_heads || h.head_dim != g->head_dim ||
        h.schedule_crc32 != schedule_crc(g) || h.n_groups != p->lay.n_groups ||
        h.n_tokens != at || memcmp(h.model_hash, pj->model.model_hash, 16) ||
        memcmp(h.chain, chain, 16) || h.raw_bytes != len - sizeof(h) ||
        memcmp(h.reserved, zero, sizeof(zero)))
        return 1;
    uint8_t *raw = v + sizeof(h);
    for (uint32_t gi = 0; gi < p->lay.n_groups; gi++) {
        ctxs__kv_range w = window_of(p, gi, at);
        for (uint64_t first = w.start; first < w.end;) {
            uint32_t cnt = (uint32_t)(w.end - first < CTXS_PREFIX_CHUNK ? w.end - first
                                                                         : CTXS_PREFIX_CHUNK);
            if (memcmp(ctxs__raw_ids(raw, cnt), pj->ids + first, (size_t)cnt * 4) ||
                !ctxs__kv_raw_verifies(p, (int32_t)gi, raw, first, cnt))
                return 1;
            raw += ctxs__kv_raw_bytes(p, (int32_t)gi, cnt);
            first += cnt;
        }
    }
    return 0;
}

/* Fetches the window value at `at` tokens (> 0) into *out (malloc'd) and
 * checks it: 0 good, 1 refused, 2 missing, or an error (the network's,
 * the server's). */
static int window_get(uint8_t **out, pull_job *pj, const ctxs__kv_plan *p, uint64_t at)
{
    *out = NULL;
    uint8_t chain[16];
    uint64_t want = CTXS__RWINDOW_HEADER_BYTES + window_raw_bytes(p, at);
    int rc = chain_of(chain, pj->ids, at);
    if (rc < 0)
        return rc;
    if (want > WINDOW_VALUE_MAX)
        return 2; /* never pushed */
    char key[CHUNK_KEY_MAX];
    value_key(key, pj->r, "window", &pj->model, chain);
    uint8_t *v = NULL;
    bulk_in *in = ctxs__malloc(sizeof(*in));
    reply_cap cap = {"window reply", want, 4096, 0};
    cap_set(pj->c, &cap);
    const char *argv[] = {"GET", key};
    if (!in)
        rc = CTXS_ENOMEM;
    else if (redisAppendCommandArgv(pj->c, 2, argv, NULL) != REDIS_OK)
        rc = context_error(pj->c, errno);
    else if ((rc = obuf_flush(pj->c)) == 0)
        rc = bulk_begin(in, pj->c);
    int64_t len = -1;
    int err = 0, got = 2;
    if (rc == 0 && (rc = bulk_head(in, &len, &err)) == 0 && len >= 0) {
        /* A value of another length is read and dropped: the connection
         * stays in step. */
        int take = len == (int64_t)want;
        if (take && !(v = ctxs__malloc((size_t)want)))
            rc = CTXS_ENOMEM; /* the connection is dropped with the call */
        else if ((rc = bulk_body(in, take ? v : NULL, len)) == 0)
            got = take && window_check(pj, p, v, (uint64_t)len, at, chain) == 0 ? 0 : 1;
    }
    if (rc == 0)
        rc = bulk_end(in);
    if (rc == 0 && err == WRONGTYPE)
        got = 1;
    else if (rc == 0 && err < 0)
        rc = err;
    free(in);
    if (rc < 0 || got) {
        free(v);
        return rc < 0 ? rc : got;
    }
    *out = v;
    return 0;
}

/* Copies tokens [from, from + keep) of a raw block of count tokens of
 * part into dst, as a raw block of keep tokens. */
static void raw_trim(uint8_t *dst, const uint8_t *src, const ctxs__kv_plan *p, int32_t part,
                     uint32_t count, uint32_t from, uint32_t keep)
{
    uint32_t runs = part < 0 ? p->n_runs : p->group_runs[part];
    size_t sb = p->lay.slot_bytes, scb = p->scale_bytes;
    memcpy(dst, src + (size_t)from * 8, (size_t)keep * 8);
    memcpy(dst + (size_t)keep * 8, src + (size_t)count * 8 + (size_t)from * 4, (size_t)keep * 4);
    const uint8_t *skv = src + (size_t)count * 12;
    uint8_t *dkv = dst + (size_t)keep * 12;
    for (uint32_t r = 0; r < runs; r++)
        memcpy(dkv + (size_t)r * keep * sb, skv + ((size_t)r * count + from) * sb,
               (size_t)keep * sb);
    const uint8_t *ssc = skv + (size_t)runs * count * sb;
    uint8_t *dsc = dkv + (size_t)runs * keep * sb;
    for (uint32_t r = 0; scb && r < runs; r++)
        memcpy(dsc + (size_t)r * keep * scb, ssc + ((size_t)r * count + from) * scb,
               (size_t)keep * scb);
}

/* Writes the blocks of the window value v at `at` tokens that the state
 * of m tokens claims (each group's [max(m - window, 0), m)) into the new
 * file, after the chunks (a group's ids are checked against theirs). */
static int window_store(int fd, const ctxs__kv_plan *p, uint8_t *v, uint64_t at, uint64_t m)
{
    uint8_t *raw = v + CTXS__RWINDOW_HEADER_BYTES, *trim = NULL;
    int rc = 0;
    for (uint32_t gi = 0; rc == 0 && gi < p->lay.n_groups; gi++) {
        ctxs__kv_range w = window_of(p, gi, at), keep = window_of(p, gi, m);
        for (uint64_t first = w.start; rc == 0 && first < w.end;) {
            uint32_t cnt = (uint32_t)(w.end - first < CTXS_PREFIX_CHUNK ? w.end - first
                                                                         : CTXS_PREFIX_CHUNK);
            uint64_t a = first > keep.start ? first : keep.start;
            uint64_t b = first + cnt < keep.end ? first + cnt : keep.end;
            if (a == first && b == first + cnt) {
                rc = ctxs__kv_block_store(fd, p, (int32_t)gi, raw, first, cnt);
            } else if (a < b) {
                if (!trim && !(trim = ctxs__malloc((size_t)ctxs__kv_raw_bytes(p, (int32_t)gi,
                                                                                CTXS_PREFIX_CHUNK))))
                    rc = CTXS_ENOMEM;
                if (rc == 0) {
                    raw_trim(trim, raw, p, (int32_t)gi, cnt, (uint32_t)(a - first),
                             (uint32_t)(b - a));
                    rc = ctxs__kv_block_store(fd, p, (int32_t)gi, trim, a, (uint32_t)(b - a));
                }
            }
            raw += ctxs__kv_raw_bytes(p, (int32_t)gi, cnt);
            first += cnt;
        }
    }
    free(trim);
    return rc;
}

/* With a layer schedule, after the chunks: the count the new session
 * holds, and its windowed rings. A state of m tokens needs each group's
 * window at m, which Redis holds as the window value of a count at: the
 * value's positions [max(at - window, 0), at) cover [max(m - window, 0),
 * m) when m = at, or when at is within every window (m at most at: the
 * value holds every position from 0). A pull looks at the record's count
 * only; a prefix pull at each chunk boundary it pulled, the largest first,
 * and takes the first value there. No good value: no tokens. */
static int pull_windows(pull_job *pj, const ctxs__kv_plan *p, int fd)
{
    uint64_t g = pj->got, m = 0;
    uint32_t wmin = UINT32_MAX;
    for (uint32_t gi = 0; gi < p->lay.n_groups; gi++)
        wmin = p->lay.groups[gi].window < wmin ? p->lay.groups[gi].window : wmin;
    uint8_t *v = NULL;
    uint64_t at = 0;
    int rc = 0;
    if (!pj->prefix) {
        at = pj->n_ids;
        if (g > 0 && (g == at || at <= wmin)) {
            if ((rc = window_get(&v, pj, p, at)) == 1)
                pj->refused = 1;
            else if (rc == 2)
                pj->missing = 1;
            else if (rc == 0)
                m = g;
        }
    } else {
        /* The counts a prefix pull can end at, the largest first: g
         * itself where a tail ends it, then each chunk boundary. */
        for (uint64_t k = g / CTXS_PREFIX_CHUNK + (g % CTXS_PREFIX_CHUNK != 0); k > 0 && !v; k--) {
            at = k * CTXS_PREFIX_CHUNK < g ? k * CTXS_PREFIX_CHUNK : g;
            if ((rc = window_get(&v, pj, p, at)) < 0)
                break;
            if (rc == 1) {
                pj->refused = 1;
                break;
            }
            if (rc == 0)
                m = at;
        }
        if (rc == 2)
            pj->missing = 1;
    }
    if (rc >= 0 && m)
        rc = window_store(fd, p, v, at, m);
    free(v);
    if (rc < 0)
        return rc;
    if (m < g) {
        pj->chunks = m ? (m + CTXS_PREFIX_CHUNK - 1) / CTXS_PREFIX_CHUNK : 0;
        pj->got = m;
    }
    if (m)
        pj->chunks++; /* the window value */
    return 0;
}

/* The new session file's fill: the verified chunks, then the first page
 * holding as many tokens as verified, then a sync. */
static int pull_fill(int fd, const ctxs__disk_label *label, void *arg)
{
    pull_job *pj = arg;
    ctxs__kv_plan p;
    /* The layout of every state the pull may end with is that of the
     * largest: the blocks are placed by it first. */
    int rc = ctxs__kv_plan_make(&p, &pj->model.geometry, pj->capacity, pj->n_sink, pj->batch,
                                pj->ring, pj->n, 0, CTXS_PREFIX_CHUNK);
    if (rc < 0)
        return rc == CTXS_ECORRUPT ? CTXS_EINVAL : rc;
    /* A block written into the new file may find the disk full: the
     * header promises CTXS_EFULL for that, as for an import. */
    if ((rc = full_or(ctxs__new_file_size(fd, &p.lay))) < 0 ||
        (rc = full_or(pull_chunks(pj, &p, fd))) < 0)
        return rc;
    if (pj->model.geometry.period && pj->got && (rc = full_or(pull_windows(pj, &p, fd))) < 0)
        return rc;
    if (pj->got == 0 && pj->prefix)
        return CTXS_ENOTFOUND;
    if ((rc = ctxs__kv_plan_make(&p, &pj->model.geometry, pj->capacity, pj->n_sink, pj->batch,
                                 pj->ring, pj->got, 0, CTXS_PREFIX_CHUNK)) < 0 ||
        (rc = ctxs__kv_file_begin(fd, &p, &pj->model, pj->created_unix_ms, label)) < 0)
        return rc;
    return full_or(ctxs__sync_data(fd));
}

/* The slots of the new session: opts's; where they leave the capacity 0
 * and give no context length, one raised to hold n tokens with room to go
 * on. The pull takes at most what fits. */
static int pull_layout(pull_job *pj, const ctxs_create_options *opts, uint64_t n)
{
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    if (opts) {
        if (opts->version != CTXS_CREATE_OPTIONS_VERSION)
            return CTXS_EINVAL;
        o = *opts;
    }
    int chosen = !o.capacity && !o.context_length; /* the pull picks the slots */
    if (!o.capacity && o.context_length) {
        o.capacity = o.context_length;
    } else if (!o.capacity) {
        uint64_t cap = n < CTXS_DEFAULT_CAPACITY
                           ? CTXS_DEFAULT_CAPACITY
                           : (n / CTXS_DEFAULT_CAPACITY + 1) * CTXS_DEFAULT_CAPACITY;
        o.capacity = (uint32_t)(cap < CTXS__REMOTE_MAX_TOKENS ? cap : CTXS__REMOTE_MAX_TOKENS);
    }
    const ctxs_geometry *g = &pj->model.geometry;
    uint32_t batch = g->period ? (o.batch ? o.batch : CTXS_DEFAULT_BATCH) : 0;
    if (g->period && chosen) {
        /* Slots enough for every windowed layer's ring: the window values
         * fill rings, and a layer laid out in the session's slots would
         * need every position's K/V, which no chunk carries. */
        uint64_t need = (uint64_t)batch + (o.n_sink ? o.n_sink : 1);
        uint32_t wmax = 0;
        for (uint32_t j = 0; j < g->period; j++)
            wmax = g->window[j] > wmax ? g->window[j] : wmax;
        need += wmax;
        if (need > o.capacity && need <= CTXS__REMOTE_MAX_TOKENS)
            o.capacity = (uint32_t)need;
    }
    ctxs__file_layout lay;
    if (ctxs__layout_compute(&lay, g, o.capacity, o.n_sink, batch) < 0 || o.ring > 1)
        return CTXS_EINVAL;
    if (lay.n_groups != n_windows(g)) {
        say("%" PRIu32 " slots with a batch of %" PRIu32 " lay out a windowed layer without "
            "its ring: a pull fills the rings from the windowed layers' state; ask for more "
            "slots", o.capacity, batch);
        return CTXS_EINVAL;
    }
    pj->batch = batch;
    pj->capacity = o.capacity;
    pj->n_sink = o.n_sink;
    pj->ring = (int)o.ring;
    if (pj->n > o.capacity) {
        pj->n = o.capacity / CTXS_PREFIX_CHUNK * CTXS_PREFIX_CHUNK;
        pj->try_tail = 0;
    }
    return 0;
}

/* Whether name is free locally, before any network traffic. */
static int local_name_free(ctxs_store *st, const char *name)
{
    ctxs_session_entry e;
    int rc = ctxs_store_session_get(&e, st, name);
    return rc == 0 ? ctxs__name_taken(name) : rc == CTXS_ENOTFOUND ? 0 : rc;
}

/* CTXS_EMODEL if st knows model's hash with another geometry or tokenizer:
 * found before the transfer, not after it. */
static int local_model_fits(ctxs_store *st, const ctxs_model *model)
{
    ctxs_model_entry known;
    int rc = ctxs_model_get(&known, st, model->model_hash);
    if (rc == CTXS_ENOTFOUND)
        return 0;
    if (rc < 0)
        return rc;
    return memcmp(&known.model.geometry, &model->geometry, sizeof(model->geometry)) ||
                   memcmp(known.model.tokenizer_hash, model->tokenizer_hash, 16)
               ? CTXS_EMODEL
               : 0;
}

static int remote_pull_impl(ctxs_session **out, ctxs_remote_pull_result *res, ctxs_remote *r,
                             const char *remote_name, const char *local_name,
                             const ctxs_create_options *opts, ctxs_progress_fn progress,
                             void *progress_arg)
{
    if (out)
        *out = NULL;
    if (res)
        memset(res, 0, sizeof(*res));
    size_t len, rlen;
    if (!local_name)
        local_name = remote_name;
    if (!r || !remote_name || ctxs__name_check(remote_name, &rlen) < 0 ||
        ctxs__name_check(local_name, &len) < 0)
        return CTXS_EINVAL;
    if (r->st->rdonly)
        return ctxs__store_readonly();
    int rc = local_name_free(r->st, local_name);
    if (rc < 0)
        return rc;
    redisContext *c;
    if ((rc = conn_open(&c, r)) < 0)
        return rc;
    char key[SESSION_KEY_MAX];
    session_key(key, r, remote_name);
    const char *argv[] = {"GET", key};
    redisReply *rep;
    record rec = {0};
    if ((rc = command(&rep, c, &CAP_RECORD, 2, argv, NULL)) == 0 &&
        (rc = reply_check(c, rep, 0)) == 0)
        rc = rep->type == REDIS_REPLY_NIL      ? CTXS_ENOTFOUND
             : rep->type != REDIS_REPLY_STRING ? CTXS_EREMOTE
                                               : record_parse(&rec, rep->str, rep->len,
                                                              remote_name);
    if (rep)
        freeReplyObject(rep);
    pull_job pj = {.r = r, .c = c, .model = rec.model, .ids = rec.ids, .n = rec.h.n_tokens,
                   .n_ids = rec.h.n_tokens, .try_tail = (rec.h.flags & CTXS__RSESSION_FLAG_TAIL) != 0,
                   .created_unix_ms = ctxs__now_ms(), .progress = progress,
                   .progress_arg = progress_arg};
    if (rc == 0)
        rc = local_model_fits(r->st, &rec.model);
    if (rc == 0)
        rc = pull_layout(&pj, opts, rec.h.n_tokens);
    ctxs_session *s = NULL;
    if (rc == 0)
        rc = ctxs__store_session_create_filled(&s, r->st, local_name, len, &rec.model,
                                               rec.model_name, rec.items, rec.h.meta_count,
                                               pull_fill, &pj);
    conn_close(c);
    if (rc == 0 && res) {
        res->n_tokens = pj.got;
        res->remote_tokens = rec.h.n_tokens;
        res->chunks_pulled = pj.chunks;
        res->chunks_missing = pj.missing;
        res->chunks_refused = pj.refused;
        res->model = rec.model;
        res->n_rest = rec.h.n_tokens - pj.got;
        if (res->n_rest && !(res->rest_ids = ctxs__malloc(res->n_rest * 4)))
            rc = CTXS_ENOMEM;
        else if (res->n_rest)
            memcpy(res->rest_ids, rec.ids + pj.got, res->n_rest * 4);
    }
    record_free(&rec);
    if (rc < 0) {
        ctxs_session_close(s);
        if (s)
            ctxs_store_session_delete(r->st, local_name);
        if (res)
            memset(res, 0, sizeof(*res));
        return rc;
    }
    if (out)
        *out = s;
    else
        ctxs_session_close(s);
    return 0;
}

static int remote_pull_prefix_impl(ctxs_session **out, ctxs_remote_pull_result *res,
                                   ctxs_remote *r, const char *local_name,
                                   const ctxs_model *model, const uint32_t *tokens, uint64_t n,
                                   const ctxs_create_options *opts)
{
    if (out)
        *out = NULL;
    if (res)
        memset(res, 0, sizeof(*res));
    size_t len;
    if (!r || !model || (!tokens && n) || !local_name || ctxs__name_check(local_name, &len) < 0 ||
        n > CTXS__REMOTE_MAX_TOKENS)
        return CTXS_EINVAL;
    if (r->st->rdonly)
        return ctxs__store_readonly();
    ctxs__file_layout lay;
    if (ctxs__layout_compute(&lay, &model->geometry, CTXS_PREFIX_CHUNK, 0, 0) < 0)
        return CTXS_EINVAL;
    int rc = local_name_free(r->st, local_name);
    if (rc == 0)
        rc = local_model_fits(r->st, model);
    if (rc < 0)
        return rc;
    if (n == 0)
        return CTXS_ENOTFOUND;
    redisContext *c;
    if ((rc = conn_open(&c, r)) < 0)
        return rc;
    pull_job pj = {.r = r, .c = c, .model = *model, .ids = tokens, .n = n, .n_ids = n,
                   .try_tail = 1,
                   .prefix = 1, .created_unix_ms = ctxs__now_ms()};
    rc = pull_layout(&pj, opts, n);
    ctxs_session *s = NULL;
    if (rc == 0)
        rc = ctxs__store_session_create_filled(&s, r->st, local_name, len, model, NULL, NULL, 0,
                                               pull_fill, &pj);
    conn_close(c);
    if (rc < 0)
        return rc;
    if (res) {
        res->n_tokens = pj.got;
        res->remote_tokens = n;
        res->chunks_pulled = pj.chunks;
        res->chunks_missing = pj.missing;
        res->chunks_refused = pj.refused;
        res->model = *model;
    }
    if (out)
        *out = s;
    else
        ctxs_session_close(s);
    return 0;
}

/* --- Listing and the server's own words ------------------------------------------ */

static int entry_cmp(const void *a, const void *b)
{
    return strcmp(((const ctxs_remote_entry *)a)->name, ((const ctxs_remote_entry *)b)->name);
}

static int remote_list_impl(ctxs_remote_entry **out, size_t *n_out, ctxs_remote *r)
{
    if (!out || !n_out)
        return CTXS_EINVAL;
    *out = NULL;
    *n_out = 0;
    if (!r)
        return CTXS_EINVAL;
    redisContext *c;
    int rc = conn_open(&c, r);
    if (rc < 0)
        return rc;
    /* A name may hold the glob characters * ? [ ] \ that MATCH reads as a
     * pattern: escaped, or the prefix "a*" would list "ab"'s records (as
     * damaged ones). Each key is still checked to start with exactly
     * "<prefix>:session:" below: what SCAN returns is the server's word. */
    char head[SESSION_KEY_MAX], pattern[2 * SESSION_KEY_MAX + 2];
    session_key(head, r, "");
    size_t plen = strlen(head), at = 0;
    for (const char *p = r->prefix; *p; p++) {
        if (strchr("*?[]\\", *p))
            pattern[at++] = '\\';
        pattern[at++] = *p;
    }
    snprintf(pattern + at, sizeof(pattern) - at, ":session:*");
    ctxs_remote_entry *v = NULL;
    size_t n = 0, cap = 0;
    char cursor[32] = "0";
    /* A server whose cursor never comes back to 0, or that returns keys
     * without end, meets the bounds (and the call's deadline). */
    uint64_t rounds = 0, keys = 0;
    do {
        const char *argv[] = {"SCAN", cursor, "MATCH", pattern, "COUNT", "100"};
        redisReply *rep;
        if ((rc = command(&rep, c, &CAP_SCAN, 6, argv, NULL)) == 0 &&
            (rc = reply_check(c, rep, 0)) == 0 &&
            (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
             rep->element[0]->type != REDIS_REPLY_STRING || rep->element[0]->len >= 32 ||
             rep->element[1]->type != REDIS_REPLY_ARRAY)) {
            say("a SCAN reply that is not a cursor and an array of keys");
            rc = CTXS_EREMOTE;
        }
        size_t got = rc == 0 ? rep->element[1]->elements : 0;
        if (rc == 0)
            snprintf(cursor, sizeof(cursor), "%s", rep->element[0]->str);
        if (rc == 0 && ++rounds > SCAN_ROUNDS_MAX) {
            say("SCAN's cursor still not back to 0 after %u rounds", SCAN_ROUNDS_MAX);
            rc = CTXS_EREMOTE;
        }
        if (rc == 0 && (keys += got) > LIST_KEYS_MAX) {
            say("SCAN returned more than %u keys", LIST_KEYS_MAX);
            rc = CTXS_EREMOTE;
        }
        /* The headers only (GETRANGE): a record's ids may be megabytes. */
        cap_set(c, &CAP_RECORD_HEAD);
        for (size_t i = 0; i < got && rc == 0; i++) {
            const redisReply *k = rep->element[1]->element[i];
            char end[16];
            snprintf(end, sizeof(end), "%u", CTXS__RSESSION_HEADER_BYTES - 1);
            const char *ga[] = {"GETRANGE", k->str, "0", end};
            size_t gl[] = {8, k->len, 1, strlen(end)};
            if (redisAppendCommandArgv(c, 4, ga, gl) != REDIS_OK)
                rc = context_error(c, errno);
        }
        for (size_t i = 0; i < got && rc == 0; i++) {
            const redisReply *k = rep->element[1]->element[i];
            redisReply *hr;
            /* A key of another type under the prefix (WRONGTYPE) is a
             * damaged record, listed as one. */
            int wrong_type = 0;
            if ((rc = reply_next(&hr, c)) == 0) {
                wrong_type = hr->type == REDIS_REPLY_ERROR && !strncmp(hr->str, "WRONGTYPE", 9);
                if (!wrong_type)
                    rc = reply_check(c, hr, 0);
            }
            if (rc == 0) {
                size_t nl = k->len - plen;
                if (k->len > plen && nl <= CTXS_NAME_MAX && !memcmp(k->str, head, plen) &&
                    (wrong_type || (hr->type == REDIS_REPLY_STRING &&
                                    hr->len > 0))) { /* a key deleted since SCAN reads as "" */
                    if (n == cap) {
                        cap = cap ? 2 * cap : 16;
                        ctxs_remote_entry *nv = ctxs__realloc(v, cap * sizeof(*v));
                        if (!nv)
                            rc = CTXS_ENOMEM;
                        else
                            v = nv;
                    }
                    if (rc == 0) {
                        ctxs_remote_entry *e = &v[n++];
                        memset(e, 0, sizeof(*e));
                        memcpy(e->name, k->str + plen, nl);
                        ctxs__rsession_header h;
                        if (wrong_type || record_header_check(&h, hr->str, hr->len) < 0 ||
                            h.name_len != nl || memcmp(h.name, e->name, nl)) {
                            e->status = CTXS_EREMOTE;
                        } else {
                            memcpy(e->model_hash, h.model_hash, 16);
                            e->n_tokens = h.n_tokens;
                            e->updated_unix_ms = h.updated_unix_ms;
                            e->tail_pushed = (h.flags & CTXS__RSESSION_FLAG_TAIL) != 0;
                        }
                    }
                }
            }
            if (hr)
                freeReplyObject(hr);
        }
        if (rep)
            freeReplyObject(rep);
    } while (rc == 0 && strcmp(cursor, "0") != 0);
    conn_close(c);
    if (rc < 0) {
        free(v);
        return rc;
    }
    /* SCAN may return a key twice: sorted, then the repeats dropped. */
    if (n)
        qsort(v, n, sizeof(*v), entry_cmp);
    size_t w = 0;
    for (size_t i = 0; i < n; i++)
        if (w == 0 || strcmp(v[w - 1].name, v[i].name))
            v[w++] = v[i];
    *out = v;
    *n_out = w;
    return 0;
}

/* The value of "field:" in an INFO reply, into out[cap] ("" if absent). */
static void info_field(char *out, size_t cap, const char *info, const char *field)
{
    out[0] = '\0';
    size_t fl = strlen(field);
    for (const char *at = info; at && *at; at = strchr(at, '\n') ? strchr(at, '\n') + 1 : NULL) {
        if (!strncmp(at, field, fl) && at[fl] == ':') {
            size_t n = strcspn(at + fl + 1, "\r\n");
            if (n >= cap)
                n = cap - 1;
            memcpy(out, at + fl + 1, n);
            out[n] = '\0';
            return;
        }
    }
}

static int remote_get_info_impl(ctxs_remote_info *out, ctxs_remote *r)
{
    if (!out || !r)
        return CTXS_EINVAL;
    memset(out, 0, sizeof(*out));
    redisContext *c;
    int rc = conn_open(&c, r);
    if (rc < 0)
        return rc;
    static const char *sections[] = {"server", "memory", "stats"};
    for (size_t i = 0; i < 3 && rc == 0; i++) {
        const char *argv[] = {"INFO", sections[i]};
        redisReply *rep;
        if ((rc = command(&rep, c, &CAP_INFO, 2, argv, NULL)) == 0 &&
            (rc = reply_check(c, rep, 0)) == 0 && rep->type != REDIS_REPLY_STRING &&
            rep->type != REDIS_REPLY_STATUS)
            rc = CTXS_EREMOTE;
        if (rc == 0) {
            char v[64];
            if (i == 0)
                info_field(out->server_version, sizeof(out->server_version), rep->str,
                           "redis_version");
            if (i == 1) {
                info_field(v, sizeof(v), rep->str, "used_memory");
                out->used_memory = strtoull(v, NULL, 10);
                info_field(v, sizeof(v), rep->str, "maxmemory");
                out->maxmemory = strtoull(v, NULL, 10);
                info_field(out->maxmemory_policy, sizeof(out->maxmemory_policy), rep->str,
                           "maxmemory_policy");
            }
            if (i == 2) {
                info_field(v, sizeof(v), rep->str, "evicted_keys");
                out->evicted_keys = strtoull(v, NULL, 10);
            }
        }
        if (rep)
            freeReplyObject(rep);
    }
    if (rc == 0) {
        const char *argv[] = {"DBSIZE"};
        redisReply *rep;
        if ((rc = command(&rep, c, &CAP_SMALL, 1, argv, NULL)) == 0 &&
            (rc = reply_check(c, rep, 0)) == 0 && rep->type != REDIS_REPLY_INTEGER)
            rc = CTXS_EREMOTE;
        if (rc == 0)
            out->keys = (uint64_t)rep->integer;
        if (rep)
            freeReplyObject(rep);
    }
    conn_close(c);
    return rc;
}

int ctxs_remote_push(ctxs_remote_push_result *out, ctxs_remote *r, const char *name,
                     ctxs_progress_fn progress, void *progress_arg)
{
    sigpipe_guard g;
    said_begin();
    sigpipe_block(&g);
    int rc = remote_push_impl(out, r, name, progress, progress_arg);
    sigpipe_restore(&g);
    return said_end(rc);
}

int ctxs_remote_pull(ctxs_session **out, ctxs_remote_pull_result *res, ctxs_remote *r,
                     const char *remote_name, const char *local_name,
                     const ctxs_create_options *opts, ctxs_progress_fn progress,
                     void *progress_arg)
{
    sigpipe_guard g;
    said_begin();
    sigpipe_block(&g);
    int rc = remote_pull_impl(out, res, r, remote_name, local_name, opts, progress, progress_arg);
    sigpipe_restore(&g);
    return said_end(rc);
}

int ctxs_remote_pull_prefix(ctxs_session **out, ctxs_remote_pull_result *res, ctxs_remote *r,
                            const char *local_name, const ctxs_model *model,
                            const uint32_t *tokens, uint64_t n, const ctxs_create_options *opts)
{
    sigpipe_guard g;
    said_begin();
    sigpipe_block(&g);
    int rc = remote_pull_prefix_impl(out, res, r, local_name, model, tokens, n, opts);
    sigpipe_restore(&g);
    return said_end(rc);
}

int ctxs_remote_list(ctxs_remote_entry **out, size_t *n_out, ctxs_remote *r)
{
    sigpipe_guard g;
    said_begin();
    sigpipe_block(&g);
    int rc = remote_list_impl(out, n_out, r);
    sigpipe_restore(&g);
    return said_end(rc);
}

int ctxs_remote_get_info(ctxs_remote_info *out, ctxs_remote *r)
{
    sigpipe_guard g;
    said_begin();
    sigpipe_block(&g);
    int rc = remote_get_info_impl(out, r);
    sigpipe_restore(&g);
    return said_end(rc);
}

int ctxs_remote_open(ctxs_remote **out, ctxs_store *st, const char *url,
                     const ctxs_remote_options *opts)
{
    sigpipe_guard g;
    said_begin();
    sigpipe_block(&g);
    int rc = remote_open_impl(out, st, url, opts);
    sigpipe_restore(&g);
    return said_end(rc);
}

/* --- Pulling on an open's miss ------------------------------------------------ */

int ctxs__remote_pull_missing(ctxs_store *st, const char *name)
{
    pthread_mutex_lock(&attach_lock);
    ctxs_remote *r = st->remote;
    if (r && r->o.pull_on_open)
        r->users++; /* ctxs_remote_close() waits for it */
    else
        r = NULL;
    pthread_mutex_unlock(&attach_lock);
    if (!r)
        return CTXS_ENOTFOUND;
    int rc = ctxs_remote_pull(NULL, NULL, r, name, NULL, NULL, NULL, NULL);
    if (rc < 0 && rc != CTXS_ENOTFOUND && rc != CTXS_ETAKEN) {
        pthread_mutex_lock(&r->mu);
        r->stats.last_error = rc;
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_lock(&attach_lock);
    if (--r->users == 0)
        pthread_cond_broadcast(&users_done);
    pthread_mutex_unlock(&attach_lock);
    /* CTXS_ETAKEN: another thread pulled or created it meanwhile. */
    return rc == 0 || rc == CTXS_ETAKEN ? 0 : CTXS_ENOTFOUND;
}
