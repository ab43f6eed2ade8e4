/*
 * The remote tier against a server that is not Redis: a small server in
 * the test (a child process on the loopback) that speaks RESP from a
 * script, serving the values a real redis-server got from a real push
 * (the first connection of a call goes on as Redis would), then doing
 * one hostile thing: answering a byte a second, a bulk length of 2^40
 * followed by data, an array header of 2^31 - 1 elements, a SCAN cursor
 * that never comes back to 0, an INFO section of 50 MiB. Each call ends
 * within its deadline or at the reply's cap, with CTXS_EREMOTE or
 * -ETIMEDOUT and a message naming what happened; the memory the client
 * took at its peak (VmHWM, /proc/self/status) stays small; and a pull
 * leaves the store without the session, or with it complete and
 * verified. Where redis-server is missing the tests skip, saying so.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <inttypes.h>

#include "ctxstore.h"
#include "redis_server.h"
#include "support.h"

TestSuite(remote_hostile, .init = ts_scratch_init, .fini = ts_scratch_fini, .timeout = 240);

/* The deadline the hostile calls run under. */
#define CALL_MS 2000u

/* The peak memory a hostile call may add to this process: well below
 * what the server offers (2 GiB, 50 MiB, 2^31 slots) and above the
 * caps a reply may fill legitimately here. Under AddressSanitizer, what
 * is freed stays in its quarantine (256 MiB by default) instead of being
 * used again: a call that reads reply after reply (the endless SCAN)
 * holds that much more at its peak, and still far less than unbounded. */
#if defined(__SANITIZE_ADDRESS__)
#define PEAK_MAX ((24u << 20) + (256u << 20))
#else
#define PEAK_MAX (24u << 20)
#endif

enum scenario {
    S_REDIS,          /* answers as the real server did */
    S_TRICKLE_PING,   /* PING answered a byte a second */
    S_TRICKLE_RECORD, /* the session record a byte a second */
    S_TRICKLE_CHUNK,  /* the record at once, a chunk a byte a second */
    S_HUGE_RECORD,    /* the record: a bulk length of 2^40, then data */
    S_HUGE_CHUNK,     /* a chunk: likewise */
    S_HUGE_ARRAY,     /* SCAN: *2147483647, then elements */
    S_ENDLESS_SCAN,   /* SCAN: cursor 7 each time, the same key */
    S_HUGE_INFO,      /* INFO: a 50 MiB section */
};

/* The values the server serves for GET: what the real server held. */
typedef struct kv {
    char *key;
    uint8_t *val;
    size_t len;
} kv;
static kv *values;
static size_t n_values;

typedef struct fake {
    pid_t pid;
    int port;
    char url[64];
} fake;

/* --- the server ---------------------------------------------------------- */

static int put(int fd, const void *p, size_t n)
{
    for (size_t done = 0; done < n;) {
        ssize_t w = write(fd, (const char *)p + done, n - done);
        if (w <= 0)
            return -1;
        done += (size_t)w;
    }
    return 0;
}

/* A byte a second: what a server does that keeps every read of the
 * client within its timeout. */
static int trickle(int fd, const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (put(fd, (const char *)p + i, 1) < 0)
            return -1;
        sleep(1);
    }
    return 0;
}

static int put_bulk(int fd, const void *p, size_t n, int slow)
{
    char head[32];
    int hn = snprintf(head, sizeof(head), "$%zu\r\n", n);
    if (slow)
        return trickle(fd, head, (size_t)hn) || trickle(fd, p, n) || trickle(fd, "\r\n", 2);
    return put(fd, head, (size_t)hn) || put(fd, p, n) || put(fd, "\r\n", 2);
}

/* Reads one RESP command (an array of bulk strings) from fd into argv
 * (copies in cmd); what follows it (pipelined commands) is kept for the
 * next call in buf. The count, or -1 at the connection's end. */
static char buf[1 << 20];
static size_t buf_len;
static char cmd_copy[1 << 20];

static int read_command(int fd, char **argv, size_t *lens, int max)
{
    for (;;) {
        char *nl = buf_len ? memchr(buf, '\n', buf_len) : NULL;
        if (nl && buf[0] == '*') {
            int argc = atoi(buf + 1), got = 0;
            size_t at = (size_t)(nl - buf) + 1, out = 0;
            while (got < argc && got < max && at < buf_len) {
                char *l = memchr(buf + at, '\n', buf_len - at);
                if (!l || buf[at] != '$')
                    break;
                size_t n = (size_t)atol(buf + at + 1);
                size_t body = (size_t)(l - buf) + 1;
                if (body + n + 2 > buf_len)
                    break;
                memcpy(cmd_copy + out, buf + body, n);
                cmd_copy[out + n] = '\0';
                argv[got] = cmd_copy + out;
                lens[got] = n;
                out += n + 1;
                at = body + n + 2;
                got++;
            }
            if (got == argc) {
                memmove(buf, buf + at, buf_len - at);
                buf_len -= at;
                return argc;
            }
        }
        if (buf_len == sizeof(buf))
            return -1;
        ssize_t k = read(fd, buf + buf_len, sizeof(buf) - buf_len);
        if (k <= 0)
            return -1;
        buf_len += (size_t)k;
    }
}

static const kv *value_of(const char *key)
{
    for (size_t i = 0; i < n_values; i++)
        if (!strcmp(values[i].key, key))
            return &values[i];
    return NULL;
}

/* Answers the commands of one connection (conn: its number) as scenario
 * says, until the client closes it. */
static void serve(int fd, enum scenario sc, int conn)
{
    buf_len = 0;
    char *argv[8];
    size_t lens[8];
    static char block[1 << 20];
    memset(block, 'x', sizeof(block));
    int argc;
    while ((argc = read_command(fd, argv, lens, 8)) > 0) {
        const char *cmd = argv[0];
        int rc = 0;
        if (!strcasecmp(cmd, "PING")) {
            rc = sc == S_TRICKLE_PING && conn > 0 ? trickle(fd, "+PONG\r\n", 7)
                                                  : put(fd, "+PONG\r\n", 7);
        } else if (!strcasecmp(cmd, "AUTH") || !strcasecmp(cmd, "SELECT") ||
                   !strcasecmp(cmd, "SET")) {
            rc = put(fd, "+OK\r\n", 5);
        } else if (!strcasecmp(cmd, "EXISTS") || !strcasecmp(cmd, "DBSIZE")) {
            rc = put(fd, ":0\r\n", 4);
        } else if (!strcasecmp(cmd, "GET") && argc == 2) {
            const kv *v = value_of(argv[1]);
            int record = strstr(argv[1], ":session:") != NULL;
            if ((sc == S_HUGE_RECORD && record) || (sc == S_HUGE_CHUNK && !record)) {
                /* 2^40 announced; up to 2 GiB sent, until the client goes. */
                rc = put(fd, "$1099511627776\r\n", 16);
                for (int i = 0; rc == 0 && i < 2048; i++)
                    rc = put(fd, block, sizeof(block));
            } else if (!v) {
                rc = put(fd, "$-1\r\n", 5);
            } else {
                int slow = (sc == S_TRICKLE_RECORD && record) || (sc == S_TRICKLE_CHUNK && !record);
                rc = put_bulk(fd, v->val, v->len, slow);
            }
        } else if (!strcasecmp(cmd, "GETRANGE")) {
            rc = put(fd, "$3\r\nabc\r\n", 9); /* no record header: listed as damaged */
        } else if (!strcasecmp(cmd, "SCAN")) {
            if (sc == S_HUGE_ARRAY) {
                rc = put(fd, "*2147483647\r\n", 13);
                for (int i = 0; rc == 0 && i < 1000000; i++)
                    rc = put(fd, "$1\r\nx\r\n", 7);
            } else if (sc == S_ENDLESS_SCAN) {
                static const char r[] = "*2\r\n$1\r\n7\r\n*1\r\n$14\r\nctxs:session:a\r\n";
                rc = put(fd, r, sizeof(r) - 1);
            } else {
                rc = put(fd, "*2\r\n$1\r\n0\r\n*0\r\n", 15);
            }
        } else if (!strcasecmp(cmd, "INFO")) {
            if (sc == S_HUGE_INFO) {
                rc = put(fd, "$52428800\r\n", 11);
                for (int i = 0; rc == 0 && i < 50; i++)
                    rc = put(fd, block, sizeof(block));
                if (rc == 0)
                    rc = put(fd, "\r\n", 2);
            } else {
                static const char info[] = "redis_version:7.0.0\r\n";
                rc = put_bulk(fd, info, sizeof(info) - 1, 0);
            }
        } else {
            rc = put(fd, "-ERR unknown command\r\n", 22);
        }
        if (rc < 0)
            return;
    }
}

/* Starts the server (a child; it ends by itself after 64 connections or
 * 200 s, and dies with this process). */
static fake fake_start(enum scenario sc)
{
    int p[2];
    cr_assert_eq(pipe(p), 0);
    fflush(NULL);
    fake f = {0};
    f.pid = fork();
    cr_assert_geq(f.pid, 0);
    if (f.pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        signal(SIGPIPE, SIG_IGN);
        alarm(200);
        close(p[0]);
        int ls = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t al = sizeof(a);
        if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(ls, 8) != 0 ||
            getsockname(ls, (struct sockaddr *)&a, &al) != 0)
            _exit(1);
        int port = ntohs(a.sin_port);
        if (write(p[1], &port, sizeof(port)) != (ssize_t)sizeof(port))
            _exit(1);
        close(p[1]);
        for (int conn = 0; conn < 64; conn++) {
            int fd = accept(ls, NULL, NULL);
            if (fd < 0)
                _exit(1);
            serve(fd, sc, conn);
            close(fd);
        }
        _exit(0);
    }
    close(p[1]);
    cr_assert_eq(read(p[0], &f.port, sizeof(f.port)), (ssize_t)sizeof(f.port),
                 "the scripted server did not start");
    close(p[0]);
    snprintf(f.url, sizeof(f.url), "redis://127.0.0.1:%d", f.port);
    return f;
}

static void fake_stop(fake *f)
{
    kill(f->pid, SIGKILL);
    waitpid(f->pid, NULL, 0);
}

/* --- the client ------------------------------------------------------------ */

/* VmHWM of this process, in bytes. */
static uint64_t peak_bytes(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    cr_assert_not_null(f);
    char line[256];
    uint64_t kb = 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmHWM: %" SCNu64 " kB", &kb) == 1)
            break;
    fclose(f);
    cr_assert_neq(kb, 0);
    return kb * 1024;
}

/* A session "chat" of 150 tokens pushed to a real redis-server, whose
 * values become the scripted server's. */
static void values_from_a_real_push(void)
{
    ts_redis rs;
    ts_redis_start(&rs, NULL, 0);
    ctxs_store *st = ts_store_open(ts_path(ts_scratch, "source"));
    ctxs_model m = ts_model(3);
    cr_assert_eq(ctxs_model_register(st, &m, "m"), 0);
    ctxs_create_options o = ts_options(1024, 4, 0, CTXS_SYNC_NONE);
    ctxs_session *s = NULL;
    cr_assert_eq(ctxs_store_session_create(&s, st, "chat", &m, &o), 0);
    ts_append_many(s, 150);
    ctxs_session_close(s);
    ctxs_remote_options ro = CTXS_REMOTE_OPTIONS_INIT;
    ro.push_on_commit = 0;
    ctxs_remote *r = NULL;
    cr_assert_eq(ctxs_remote_open(&r, st, rs.url, &ro), 0);
    ctxs_remote_push_result pr;
    int rc = ctxs_remote_push(&pr, r, "chat", NULL);
    cr_assert_eq(rc, 0, "push: %s", ctxs_err_name(rc));
    ctxs_remote_close(NULL, r, 10000);
    ctxs_store_close(st);
    /* Every key the push made, and its value (KEYS: a handful). */
    redisContext *c = redisConnect("127.0.0.1", rs.port);
    cr_assert(c && !c->err, "connect to redis-server");
    redisReply *keys = redisCommand(c, "KEYS ctxs:*");
    cr_assert(keys && keys->type == REDIS_REPLY_ARRAY && keys->elements >= 3,
              "the record and chunks");
    n_values = keys->elements;
    values = calloc(n_values, sizeof(*values));
    for (size_t i = 0; i < n_values; i++) {
        values[i].key = strdup(keys->element[i]->str);
        values[i].val = ts_redis_get(&rs, values[i].key, &values[i].len);
        cr_assert_not_null(values[i].val, "%s", values[i].key);
    }
    freeReplyObject(keys);
    redisFree(c);
    ts_redis_stop(&rs);
}

/* The store pulls go into, and a remote on the scripted server. */
static ctxs_store *dest;

static ctxs_remote *remote_on(const fake *f)
{
    if (!dest) {
        dest = ts_store_open(ts_path(ts_scratch, "dest"));
        ctxs_model m = ts_model(3);
        cr_assert_eq(ctxs_model_register(dest, &m, "m"), 0);
    }
    ctxs_remote_options o = CTXS_REMOTE_OPTIONS_INIT;
    o.push_on_commit = 0;
    o.pull_on_open = 0;
    o.timeout_ms = 1500; /* each read: a byte a second keeps within it */
    o.call_ms = CALL_MS;
    ctxs_remote *r = NULL;
    int rc = ctxs_remote_open(&r, dest, f->url, &o);
    cr_assert_eq(rc, 0, "open on the scripted server: %s (%s)", ctxs_err_name(rc),
                 ctxs_get_last_error());
    return r;
}

/* Whether the destination holds "chat"; if so it must verify whole. */
static int chat_present(uint64_t *n_tokens)
{
    ctxs_session *s = NULL;
    int rc = ctxs_store_session_open(&s, dest, "chat", NULL, CTXS_RDONLY, NULL);
    if (rc == CTXS_ENOTFOUND)
        return 0;
    cr_assert_eq(rc, 0, "open of the pulled session: %s", ctxs_err_name(rc));
    uint64_t bad = 0;
    cr_assert_eq(ctxs_session_verify(&bad, s), 0, "the pulled session verifies");
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    *n_tokens = info.n_tokens;
    ctxs_session_close(s);
    return 1;
}

enum call { C_PULL, C_LIST, C_INFO };

/* Runs one call against the scripted server of sc: its code, with the
 * message, and checks the peak memory it took. */
static int hostile_call(enum scenario sc, enum call call, const char *want_message)
{
    values_from_a_real_push();
    fake f = fake_start(sc);
    ctxs_remote *r = remote_on(&f);
    uint64_t before = peak_bytes();
    int rc;
    if (call == C_PULL) {
        ctxs_remote_pull_result res;
        rc = ctxs_remote_pull(NULL, &res, r, "chat", NULL, NULL, NULL);
    } else if (call == C_LIST) {
        ctxs_remote_entry *list = NULL;
        size_t n = 0;
        rc = ctxs_remote_list(&list, &n, r);
        ctxs_free(list);
    } else {
        ctxs_remote_info info;
        rc = ctxs_remote_get_info(&info, r);
    }
    const char *msg = ctxs_get_last_error();
    uint64_t after = peak_bytes();
    cr_assert_lt(after - before, PEAK_MAX,
                 "the call's peak memory grew by %" PRIu64 " bytes (%s: %s)", after - before,
                 ctxs_err_name(rc), msg);
    if (want_message)
        cr_assert(strstr(msg, want_message), "the message \"%s\" does not say \"%s\"", msg,
                  want_message);
    ctxs_remote_close(NULL, r, 1000);
    fake_stop(&f);
    return rc;
}

/* --- the cases ------------------------------------------------------------- */

Test(remote_hostile, the_scripted_server_serves_a_pull_that_verifies)
{
    values_from_a_real_push();
    fake f = fake_start(S_REDIS);
    ctxs_remote *r = remote_on(&f);
    ctxs_remote_pull_result res;
    int rc = ctxs_remote_pull(NULL, &res, r, "chat", NULL, NULL, NULL);
    cr_assert_eq(rc, 0, "pull: %s (%s)", ctxs_err_name(rc), ctxs_get_last_error());
    uint64_t n = 0;
    cr_assert(chat_present(&n));
    cr_assert_eq(n, 150);
    ctxs_remote_close(NULL, r, 1000);
    fake_stop(&f);
}

Test(remote_hostile, a_ping_a_byte_a_second_ends_at_the_deadline)
{
    int rc = hostile_call(S_TRICKLE_PING, C_LIST, "deadline of 2000 ms");
    cr_assert_eq(rc, -ETIMEDOUT, "%s", ctxs_err_name(rc));
}

Test(remote_hostile, a_record_a_byte_a_second_ends_the_pull_at_the_deadline)
{
    int rc = hostile_call(S_TRICKLE_RECORD, C_PULL, "deadline of 2000 ms");
    cr_assert_eq(rc, -ETIMEDOUT, "%s", ctxs_err_name(rc));
    uint64_t n;
    cr_assert(!chat_present(&n), "a failed pull left a session");
}

Test(remote_hostile, a_chunk_a_byte_a_second_ends_the_pull_at_the_deadline)
{
    int rc = hostile_call(S_TRICKLE_CHUNK, C_PULL, "deadline of 2000 ms");
    cr_assert_eq(rc, -ETIMEDOUT, "%s", ctxs_err_name(rc));
    uint64_t n;
    cr_assert(!chat_present(&n), "a failed pull left a session");
}

Test(remote_hostile, a_record_of_2_to_the_40_bytes_is_refused_at_its_header)
{
    int rc = hostile_call(S_HUGE_RECORD, C_PULL, "session record of 1099511627776 bytes");
    cr_assert_eq(rc, CTXS_EREMOTE, "%s", ctxs_err_name(rc));
    uint64_t n;
    cr_assert(!chat_present(&n), "a failed pull left a session");
}

Test(remote_hostile, a_chunk_of_2_to_the_40_bytes_is_refused_at_its_header)
{
    int rc = hostile_call(S_HUGE_CHUNK, C_PULL, "1099511627776");
    cr_assert_eq(rc, CTXS_EREMOTE, "%s", ctxs_err_name(rc));
    uint64_t n;
    cr_assert(!chat_present(&n), "a failed pull left a session");
}

Test(remote_hostile, an_array_of_2_to_the_31_elements_is_refused_before_it_is_made)
{
    int rc = hostile_call(S_HUGE_ARRAY, C_LIST, "array of 2147483647 elements");
    cr_assert_eq(rc, CTXS_EREMOTE, "%s", ctxs_err_name(rc));
}

Test(remote_hostile, a_scan_that_never_ends_ends_at_the_deadline_in_bounded_memory)
{
    int rc = hostile_call(S_ENDLESS_SCAN, C_LIST, NULL);
    cr_assert(rc == -ETIMEDOUT || rc == CTXS_EREMOTE, "%s", ctxs_err_name(rc));
}

Test(remote_hostile, an_info_section_of_50_mib_is_refused_at_its_header)
{
    int rc = hostile_call(S_HUGE_INFO, C_INFO, "INFO reply of 52428800 bytes");
    cr_assert_eq(rc, CTXS_EREMOTE, "%s", ctxs_err_name(rc));
}
