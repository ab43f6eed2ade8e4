/*
 * bench_remote — what the remote tier costs against moving the same bytes
 * through Redis by hand, with the same client (hiredis) on the same
 * loopback, and what resuming from Redis costs against resuming from the
 * local disk.
 *
 * One conversation of 2048 tokens of Qwen3-4B's KV geometry (36 layers, 8
 * KV heads, head_dim 128, fp16: 147,456 bytes a token, 288 MiB in all, 32
 * chunks of 64 tokens), random K/V, in a store. Against a redis-server it
 * starts on a free loopback port (no persistence), or the one --remote
 * names (its keys are FLUSHALLed: give it a server of its own):
 *
 *   push_turn     ctxs_remote_push of the conversation when Redis holds
 *                 all but its last chunk (pushed from a fork of its first
 *                 1984 tokens, untimed): one chunk of 64 tokens sent, 31
 *                 found there, the record  vs  raw_set: one SET of those
 *                 64 tokens' K/V (9 MiB).
 *   push_session  ctxs_remote_push into an empty Redis: 32 chunks and the
 *                 record  vs  raw_set: 32 SETs of 9 MiB, pipelined.
 *                 Both with a raw_set_direct row: the same SETs sent from
 *                 the bytes by sendmsg, around hiredis's output buffer, as
 *                 ctxstore sends its chunks (the wire's floor; second
 *                 ratio).
 *   pull_session  ctxs_remote_pull into a new local session (created,
 *                 every chunk verified, written, the file synced and
 *                 linked, the session closed)  vs
 *                 raw_get_sync: 32 GETs, pipelined, each value written to
 *                 a file, then fdatasync: the same durability (the ratio
 *                 is against this row); raw_get_sync_direct: the same,
 *                 each reply read by recv into one buffer, around
 *                 hiredis's reader, as ctxstore reads its chunks (the
 *                 second ratio); and, to show what durability costs,
 *                 raw_get_write: raw_get_sync without the fdatasync, and
 *                 raw_get: into memory only.
 *   resume        what a resume on a machine costs before the first token:
 *                 remote: ctxs_remote_pull, session left open  vs
 *                 local_warm / local_cold: ctxs_store_session_open of the
 *                 session on disk, its file in the page cache or dropped
 *                 from it (posix_fadvise DONTNEED; open reads no KV page,
 *                 the worker brings the window in behind it)  vs
 *                 state_file: one GET of the whole KV as one value (the
 *                 way a llama.cpp state file would be kept in Redis),
 *                 written to a file and fdatasynced.
 *
 * A pull's new session file appears complete or not at all: written
 * aside, fdatasynced, then linked. The raw rows that write a file give it
 * the same fdatasync, so that both columns wait for the disk; the
 * raw_get_write row, without it, shows what that wait costs.
 *
 * Medians of several runs, the methods of a comparison taking turns run
 * by run; the untimed cleanup between runs (FLUSHALL, deleting the pulled
 * session, syncing the disk) is outside the timings.
 * ratio = ctxstore median / raw median (push and pull), or the resume's
 * median over local_warm's.
 *
 * With --json, stdout carries one object per measurement, as the other
 * benchmarks write them: op, method, tokens, median_us, min_us, max_us,
 * n, bytes (what moved), and ratio on the ctxstore rows (against the raw
 * row named by "vs").
 *
 * Usage: bench_remote [--quick] [--remote URL] [--dir DIR] [--json]
 */
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "ctxstore.h"

const char *const bench_program = "bench_remote";

enum {
    N_LAYERS = 36,
    N_KV_HEADS = 8,
    HEAD_DIM = 128,
    N_RUNS = N_LAYERS * 2 * N_KV_HEADS,
    TOKENS = 2048,
    CHUNK = 64,
    N_CHUNKS = TOKENS / CHUNK,
    SLOT_BYTES = HEAD_DIM * 2,
    TOKEN_BYTES = N_RUNS * SLOT_BYTES, /* 147,456 */
};
#define CHUNK_BYTES ((size_t)CHUNK * TOKEN_BYTES)
#define STATE_BYTES ((size_t)TOKENS * TOKEN_BYTES)

typedef struct options {
    int json, quick;
    const char *remote;
    const char *dir;
} options;

static void usage(FILE *f)
{
    fputs("usage: bench_remote [--quick] [--remote URL] [--dir DIR] [--json]\n"
          "  --quick       fewer repetitions\n"
          "  --remote URL  a redis:// server of its own (it is FLUSHALLed), instead\n"
          "                of a redis-server started on a free loopback port\n"
          "  --dir DIR     put the files in a new directory under DIR (default\n"
          "                $TMPDIR, else /var/tmp)\n"
          "  --json        one JSON object per measurement on stdout\n",
          f);
}

static options parse_options(int argc, char **argv)
{
    options o = { 0 };
    for (int i = 1; i < argc; i++)
        if (!flag_option(argv[i], "--json", &o.json) && !flag_option(argv[i], "--quick", &o.quick) &&
            !string_option(argc, argv, &i, "--remote", &o.remote) &&
            !string_option(argc, argv, &i, "--dir", &o.dir))
            unknown_option(argv[i], usage);
    return o;
}

/* --- The server ------------------------------------------------------------- */

static pid_t g_redis_pid;
static char g_url[256], g_host[128] = "127.0.0.1";
static int g_port;

static void stop_redis(void)
{
    if (g_redis_pid > 0) {
        kill(g_redis_pid, SIGKILL);
        waitpid(g_redis_pid, NULL, 0);
        g_redis_pid = 0;
    }
}

static void on_signal(int sig)
{
    if (g_redis_pid > 0)
        kill(g_redis_pid, SIGKILL);
    remove_scratch_on_signal(sig);
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    check_sys(fd, "socket");
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    check_sys(bind(fd, (struct sockaddr *)&a, sizeof(a)), "bind");
    socklen_t len = sizeof(a);
    check_sys(getsockname(fd, (struct sockaddr *)&a, &len), "getsockname");
    close(fd);
    return ntohs(a.sin_port);
}

static redisContext *connect_raw(void)
{
    struct timeval tv = { 10, 0 };
    redisContext *c = redisConnectWithTimeout(g_host, g_port, tv);
    if (!c || c->err)
        return c ? (redisFree(c), NULL) : NULL;
    redisSetTimeout(c, (struct timeval){ 60, 0 });
    return c;
}

/* redis-server on 127.0.0.1:<free port>, no persistence, no memory limit
 * (the benchmark holds about 1 GiB); waits until it answers. */
static void start_redis(void)
{
    g_port = free_port();
    char port[16];
    snprintf(port, sizeof(port), "%d", g_port);
    const char *bin = getenv("REDIS_SERVER_BIN");
    if (!bin || !*bin)
        bin = "redis-server";
    g_redis_pid = fork();
    check_sys(g_redis_pid, "fork");
    if (g_redis_pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0)
            dup2(null, 1), dup2(null, 2);
        execlp(bin, bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly",
               "no", "--dir", g_dir, "--protected-mode", "yes", (char *)NULL);
        _exit(127);
    }
    atexit(stop_redis);
    for (int i = 0; i < 200; i++) {
        redisContext *c = connect_raw();
        if (c) {
            redisReply *r = redisCommand(c, "PING");
            int ok = r && r->type == REDIS_REPLY_STATUS;
            freeReplyObject(r);
            redisFree(c);
            if (ok) {
                snprintf(g_url, sizeof(g_url), "redis://127.0.0.1:%d", g_port);
                return;
            }
        }
        int st;
        if (waitpid(g_redis_pid, &st, WNOHANG) == g_redis_pid) {
            g_redis_pid = 0;
            die("%s did not start (is redis-server installed? REDIS_SERVER_BIN names another)",
                bin);
        }
        pause_ms(50);
    }
    die("redis-server did not answer on port %d within 10 s", g_port);
}

/* host and port of a redis://host:port URL without a password (the raw
 * side connects with them). */
static void parse_remote(const char *url)
{
    if (strncmp(url, "redis://", 8) != 0 || strchr(url, '@'))
        die("--remote takes redis://HOST[:PORT] (no password, database 0)");
    const char *h = url + 8;
    size_t n = strcspn(h, ":/");
    if (n == 0 || n >= sizeof(g_host))
        die("--remote: no host in %s", url);
    memcpy(g_host, h, n);
    g_host[n] = '\0';
    g_port = h[n] == ':' ? atoi(h + n + 1) : 6379;
    snprintf(g_url, sizeof(g_url), "%s", url);
}

static void raw_ok(redisReply *r, const char *what)
{
    if (!r)
        die("%s: no reply", what);
    if (r->type == REDIS_REPLY_ERROR)
        die("%s: %s", what, r->str);
    freeReplyObject(r);
}

static void flushall(redisContext *c)
{
    raw_ok(redisCommand(c, "FLUSHALL"), "FLUSHALL");
}

/* --- The conversation --------------------------------------------------------- */

typedef struct bench {
    ctxs_store *st;
    ctxs_remote *r;
    redisContext *raw;
    ctxs_model model;
    uint8_t *chunks;    /* the K/V of every chunk, [chunk][run][64 tokens] */
    uint8_t *buf;       /* a reply's bytes copied out, CHUNK_BYTES */
    char session_path[PATH_MAX];
    char out_path[PATH_MAX];
    options o;
} bench;

static void make_conversation(bench *b)
{
    b->model = (ctxs_model){ 0 };
    b->model.geometry.n_layers = N_LAYERS;
    b->model.geometry.n_kv_heads = N_KV_HEADS;
    b->model.geometry.head_dim = HEAD_DIM;
    b->model.geometry.dtype = CTXS_DTYPE_F16;
    for (int i = 0; i < CTXS_HASH_BYTES; i++) {
        b->model.model_hash[i] = (uint8_t)(0xb0 + i);
        b->model.tokenizer_hash[i] = (uint8_t)(0x70 + i);
    }
    check_ctxs(ctxs_model_register(b->st, &b->model, "qwen3-4b-geometry"), "ctxs_model_register");
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = TOKENS;
    o.ring = 0;
    ctxs_session *s;
    check_ctxs(ctxs_store_session_create(&s, b->st, "conv", &b->model, &o), "create");
    ctxs_reservation res;
    check_ctxs(ctxs_session_reserve(&res, s, TOKENS), "reserve");
    if (res.n_spans != 1 || res.spans[0].slot != 0 || res.spans[0].count != TOKENS)
        die("reserve: not one run of %d slots from 0", TOKENS);
    ctxs_layout lay;
    get_layout(&lay, s, SLOT_BYTES);
    uint64_t seed = 0x2e3073;
    b->chunks = xmalloc(STATE_BYTES);
    for (uint32_t run = 0; run < N_RUNS; run++) {
        uint8_t *dst = kv_run(&lay, N_KV_HEADS, run);
        fill_fp16(dst, (size_t)TOKENS * SLOT_BYTES, &seed);
        /* The raw side's bytes: the same K/V, a chunk's runs together. */
        for (int c = 0; c < N_CHUNKS; c++)
            memcpy(b->chunks + c * CHUNK_BYTES + (size_t)run * CHUNK * SLOT_BYTES,
                   dst + (size_t)c * CHUNK * SLOT_BYTES, (size_t)CHUNK * SLOT_BYTES);
    }
    uint32_t *ids = xmalloc(TOKENS * sizeof(*ids));
    for (uint32_t i = 0; i < TOKENS; i++)
        ids[i] = (uint32_t)(xorshift64(&seed) % 151936);
    check_ctxs(ctxs_session_commit(s, ids, TOKENS), "commit");
    check_ctxs(ctxs_session_sync(s), "sync");
    ctxs_session_close(s);
    free(ids);
    /* The turn's base: the first 1984 tokens, the same chunks. */
    check_ctxs(ctxs_store_session_fork(&s, b->st, "conv", "base", TOKENS - CHUNK, NULL), "fork");
    ctxs_session_close(s);
    ctxs_session_entry e;
    check_ctxs(ctxs_store_session_get(&e, b->st, "conv"), "session_get");
    char sessions[PATH_MAX];
    scratch_path(sessions, "store/sessions");
    if ((size_t)snprintf(b->session_path, sizeof(b->session_path), "%s/%016" PRIx64 ".ctxs",
                         sessions, e.id) >= sizeof(b->session_path))
        die("path too long");
    settle_disk();
}

/* --- Measurements ------------------------------------------------------------- */

static double time_push(bench *b, const char *name, uint64_t want_sent)
{
    ctxs_remote_push_result res;
    double t0 = now_us();
    check_ctxs(ctxs_remote_push(&res, b->r, name, NULL), "ctxs_remote_push");
    double t = now_us() - t0;
    if (res.chunks_sent < want_sent)
        die("push of %s sent %" PRIu64 " chunks, expected %" PRIu64, name, res.chunks_sent,
            want_sent);
    return t;
}

/* The replies of n pipelined SETs, each checked. */
static void read_set_replies(bench *b, int n)
{
    for (int c = 0; c < n; c++) {
        redisReply *r;
        if (redisGetReply(b->raw, (void **)&r) != REDIS_OK)
            die("SET: %s", b->raw->errstr);
        raw_ok(r, "SET");
    }
}

/* n SETs of CHUNK_BYTES, pipelined. */
static double time_raw_set(bench *b, int n)
{
    double t0 = now_us();
    for (int c = 0; c < n; c++) {
        char key[32];
        snprintf(key, sizeof(key), "raw:%d", c);
        redisAppendCommand(b->raw, "SET %s %b", key, b->chunks + (size_t)(N_CHUNKS - n + c) *
                                                          CHUNK_BYTES, CHUNK_BYTES);
    }
    read_set_replies(b, n);
    return now_us() - t0;
}

/* hiredis copies a large value twice each way (a SET formatted into a new
 * allocation, then appended to its output buffer; a reply read 16 KiB at
 * a time into a growing buffer, then copied into the reply object), and
 * ctxstore's push and pull move chunk values around those buffers. The
 * _direct rows move the raw bytes the same way, on the same connection:
 * the floor of the wire, against which ctxstore's own work shows. */
static void send_all(int fd, struct iovec *iov, int n)
{
    while (n > 0) {
        struct msghdr m = { .msg_iov = iov, .msg_iovlen = (size_t)n };
        ssize_t k = sendmsg(fd, &m, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        check_sys(k, "sendmsg");
        while (n > 0 && (size_t)k >= iov->iov_len) {
            k -= (ssize_t)iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (uint8_t *)iov->iov_base + k;
            iov->iov_len -= (size_t)k;
        }
    }
}

static void recv_all(int fd, uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t k = recv(fd, p, n, 0);
        if (k < 0 && errno == EINTR)
            continue;
        check_sys(k, "recv");
        if (k == 0)
            die("recv: the server closed the connection");
        p += k;
        n -= (size_t)k;
    }
}

/* n SETs of CHUNK_BYTES, pipelined, each sent from the chunk's bytes. */
static double time_raw_set_direct(bench *b, int n)
{
    double t0 = now_us();
    for (int c = 0; c < n; c++) {
        char head[96];
        int hn = snprintf(head, sizeof(head), "*3\r\n$3\r\nSET\r\n$%d\r\nraw:%d\r\n$%zu\r\n",
                          snprintf(NULL, 0, "raw:%d", c), c, CHUNK_BYTES);
        struct iovec iov[3] = {
            { head, (size_t)hn },
            { b->chunks + (size_t)(N_CHUNKS - n + c) * CHUNK_BYTES, CHUNK_BYTES },
            { (void *)"\r\n", 2 },
        };
        send_all(b->raw->fd, iov, 3);
    }
    read_set_replies(b, n);
    return now_us() - t0;
}

/* N_CHUNKS GETs, pipelined (hiredis sends them); each reply read into one
 * buffer by recv, written to a file at its offset, then fdatasync. */
static double time_raw_get_direct(bench *b)
{
    double t0 = now_us();
    int fd;
    check_sys(fd = open(b->out_path, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600), "open");
    for (int c = 0; c < N_CHUNKS; c++)
        redisAppendCommand(b->raw, "GET raw:%d", c);
    int done = 0;
    while (!done)
        if (redisBufferWrite(b->raw, &done) != REDIS_OK)
            die("GET: %s", b->raw->errstr);
    char head[32];
    int hn = snprintf(head, sizeof(head), "$%zu\r\n", CHUNK_BYTES);
    for (int c = 0; c < N_CHUNKS; c++) {
        uint8_t got[32];
        recv_all(b->raw->fd, got, (size_t)hn);
        if (memcmp(got, head, (size_t)hn))
            die("GET raw:%d: not the value SET", c);
        recv_all(b->raw->fd, b->buf, CHUNK_BYTES);
        recv_all(b->raw->fd, got, 2);
        write_all(fd, b->buf, CHUNK_BYTES, "write");
    }
    check_sys(fdatasync(fd), "fdatasync");
    close(fd);
    double t = now_us() - t0;
    check_sys(unlink(b->out_path), "unlink");
    return t;
}

/* N_CHUNKS GETs, pipelined; each value copied out (memory), or written
 * to a file at its offset (to_file), then fdatasynced (sync). */
static double time_raw_get(bench *b, int to_file, int sync)
{
    double t0 = now_us();
    int fd = -1;
    if (to_file)
        check_sys(fd = open(b->out_path, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600), "open");
    for (int c = 0; c < N_CHUNKS; c++)
        redisAppendCommand(b->raw, "GET raw:%d", c);
    for (int c = 0; c < N_CHUNKS; c++) {
        redisReply *r;
        if (redisGetReply(b->raw, (void **)&r) != REDIS_OK)
            die("GET: %s", b->raw->errstr);
        if (!r || r->type != REDIS_REPLY_STRING || r->len != CHUNK_BYTES)
            die("GET raw:%d: not the value SET", c);
        if (fd >= 0)
            write_all(fd, (const uint8_t *)r->str, CHUNK_BYTES, "write");
        else
            memcpy(b->buf, r->str, CHUNK_BYTES);
        freeReplyObject(r);
    }
    if (sync)
        check_sys(fdatasync(fd), "fdatasync");
    if (fd >= 0)
        close(fd);
    double t = now_us() - t0;
    if (fd >= 0)
        check_sys(unlink(b->out_path), "unlink");
    return t;
}

/* One GET of the whole KV as one value, written to a file. */
static double time_state_file(bench *b)
{
    double t0 = now_us();
    int fd;
    check_sys(fd = open(b->out_path, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600), "open");
    redisReply *r = redisCommand(b->raw, "GET raw:state");
    if (!r || r->type != REDIS_REPLY_STRING || (size_t)r->len != STATE_BYTES)
        die("GET raw:state: not the value SET");
    write_all(fd, (const uint8_t *)r->str, STATE_BYTES, "write");
    freeReplyObject(r);
    check_sys(fdatasync(fd), "fdatasync");
    close(fd);
    double t = now_us() - t0;
    check_sys(unlink(b->out_path), "unlink");
    return t;
}

/* ctxs_remote_pull of conv into "pulled"; left open for the resume
 * (keep_open), closed otherwise; deleted after, untimed. */
static double time_pull(bench *b, int keep_open)
{
    ctxs_session *s = NULL;
    ctxs_remote_pull_result res;
    double t0 = now_us();
    check_ctxs(ctxs_remote_pull(keep_open ? &s : NULL, &res, b->r, "conv", "pulled", NULL, NULL),
               "ctxs_remote_pull");
    double t = now_us() - t0;
    if (res.n_tokens != TOKENS)
        die("pull: %" PRIu64 " tokens of %d", res.n_tokens, TOKENS);
    ctxs_free(res.rest_ids);
    ctxs_session_close(s);
    check_ctxs(ctxs_store_session_delete(b->st, "pulled"), "delete pulled");
    settle_disk();
    return t;
}

static void drop_cached(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    check_sys(fd, "open");
    int rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    if (rc != 0)
        die("posix_fadvise(DONTNEED): %s", strerror(rc));
}

static double time_local_open(bench *b, int cold)
{
    if (cold)
        drop_cached(b->session_path);
    ctxs_session *s;
    double t0 = now_us();
    check_ctxs(ctxs_store_session_open(&s, b->st, "conv", &b->model, 0, NULL), "open");
    double t = now_us() - t0;
    ctxs_session_close(s);
    return t;
}

/* --- Report ------------------------------------------------------------------- */

static result_table g_table;
static bench_result g_rows[16];

static bench_result *add(const char *op, const char *method, samples *s)
{
    bench_result *r = results_add(&g_table, op, method, TOKENS, s);
    samples_free(s);
    return r;
}

/* A row; vs (may be NULL) is what its ratio is against, vs2 (may be
 * NULL) a second comparison ("ratio_<method>" in JSON). */
static void print_row(const options *o, const bench_result *r, size_t bytes,
                      const bench_result *vs, const bench_result *vs2)
{
    double ratio = vs && vs->median_us > 0 ? r->median_us / vs->median_us : 0;
    if (o->json) {
        json_result_begin(r);
        printf(",\"n\":%zu,\"bytes\":%zu", r->n, bytes);
        if (vs)
            printf(",\"vs\":\"%s\",\"ratio\":%.3f", vs->method, ratio);
        if (vs2 && vs2->median_us > 0)
            printf(",\"ratio_%s\":%.3f", vs2->method, r->median_us / vs2->median_us);
        printf("}\n");
    } else {
        char ms[64];
        snprintf(ms, sizeof(ms), "%.2f [%.2f, %.2f]", r->median_us / 1e3, r->min_us / 1e3,
                 r->max_us / 1e3);
        printf("%-13s %-14s %-28s %3zu %9.1f MiB", r->op, r->method, ms, r->n,
               bytes / 1048576.0);
        if (vs)
            printf("  %.2fx %s", ratio, vs->method);
        if (vs2 && vs2->median_us > 0)
            printf(", %.2fx %s", r->median_us / vs2->median_us, vs2->method);
        printf("\n");
    }
    fflush(stdout);
}

/* op: the push of the last n chunks of the session "conv" (after those
 * before them, in "base", which shares them), beside as many raw SETs
 * through hiredis and written directly to the socket, alternating run by
 * run, iters times after a warm-up; their rows of bytes, printed. */
static void time_pushes(bench *b, const options *o, int iters, const char *op, int n,
                        size_t bytes)
{
    samples s = { 0 }, s2 = { 0 }, s3 = { 0 };
    for (int i = 0; i < iters + 1; i++) {
        flushall(b->raw);
        if (n < N_CHUNKS)
            (void)time_push(b, "base", N_CHUNKS - n);
        double t = time_push(b, "conv", (uint64_t)n);
        flushall(b->raw);
        double t2 = time_raw_set(b, n);
        flushall(b->raw);
        double t3 = time_raw_set_direct(b, n);
        if (i > 0) { /* the first is a warm-up */
            samples_add(&s, t);
            samples_add(&s2, t2);
            samples_add(&s3, t3);
        }
    }
    bench_result *r = add(op, "ctxstore", &s);
    bench_result *raw = add(op, "raw_set", &s2);
    bench_result *direct = add(op, "raw_set_direct", &s3);
    print_row(o, raw, bytes, NULL, NULL);
    print_row(o, direct, bytes, NULL, NULL);
    print_row(o, r, bytes, raw, direct);
}

int main(int argc, char **argv)
{
    bench b = { 0 };
    b.o = parse_options(argc, argv);
    const options *o = &b.o;
    g_table = (result_table)RESULT_TABLE(g_rows);
    catch_signals(on_signal);
    make_scratch_dir(o->dir, "ctxstore-bench-remote");
    if (o->remote)
        parse_remote(o->remote);
    else
        start_redis();
    if (!(b.raw = connect_raw()))
        die("cannot connect to %s:%d", g_host, g_port);
    flushall(b.raw);

    char store[PATH_MAX];
    scratch_path(store, "store");
    check_ctxs(ctxs_store_open(&b.st, store, CTXS_STORE_CREATE, NULL), "ctxs_store_open");
    scratch_path(b.out_path, "raw.out");
    b.buf = xmalloc(CHUNK_BYTES);
    make_conversation(&b);
    ctxs_remote_options ro = CTXS_REMOTE_OPTIONS_INIT;
    ro.push_on_commit = 0;
    ro.timeout_ms = 60000;
    check_ctxs(ctxs_remote_open(&b.r, b.st, g_url, &ro), "ctxs_remote_open");

    FILE *text = o->json ? stderr : stdout;
    fprintf(text,
            "ctxstore bench_remote: %d tokens of Qwen3-4B's KV geometry (%d layers, %d KV heads "
            "x %d, fp16: %d bytes/token, %.0f MiB), %d chunks of %d tokens; Redis at %s "
            "(%s); files in %s\n"
            "times in ms, median [min, max] of n; ratio = ctxstore / the raw method named\n\n",
            TOKENS, N_LAYERS, N_KV_HEADS, HEAD_DIM, TOKEN_BYTES, STATE_BYTES / 1048576.0,
            N_CHUNKS, CHUNK, g_url, o->remote ? "given" : "started for this run", g_dir);
    if (!o->json)
        printf("%-13s %-14s %-28s %3s %13s  %s\n", "op", "method", "ms", "n", "bytes", "ratio");

    const int iters = o->quick ? 3 : 7;
    samples s = { 0 };

    /* Each comparison alternates its methods run by run, so that a slow
     * spell of a shared machine falls on both columns alike. */
    /* (a) a turn: one chunk. */
    samples s2 = { 0 }, s3 = { 0 }, s4 = { 0 }, s5 = { 0 };
    time_pushes(&b, o, iters, "push_turn", 1, CHUNK_BYTES);

    /* (b) the whole session. */
    time_pushes(&b, o, iters, "push_session", N_CHUNKS, STATE_BYTES);

    /* (c) pull of the whole session; Redis holds both copies now. */
    (void)time_push(&b, "conv", 0);
    for (int i = 0; i < iters + 1; i++) {
        double t = time_pull(&b, 0);
        double t2 = time_raw_get(&b, 0, 0);
        double t3 = time_raw_get(&b, 1, 0);
        settle_disk();
        double t4 = time_raw_get(&b, 1, 1);
        settle_disk();
        double t5 = time_raw_get_direct(&b);
        settle_disk();
        if (i > 0) {
            samples_add(&s, t);
            samples_add(&s2, t2);
            samples_add(&s3, t3);
            samples_add(&s4, t4);
            samples_add(&s5, t5);
        }
    }
    bench_result *pull = add("pull_session", "ctxstore", &s);
    bench_result *pull_raw = add("pull_session", "raw_get", &s2);
    bench_result *pull_raw_w = add("pull_session", "raw_get_write", &s3);
    bench_result *pull_raw_ws = add("pull_session", "raw_get_sync", &s4);
    bench_result *pull_direct = add("pull_session", "raw_get_sync_direct", &s5);
    print_row(o, pull_raw, STATE_BYTES, NULL, NULL);
    print_row(o, pull_raw_w, STATE_BYTES, NULL, NULL);
    print_row(o, pull_raw_ws, STATE_BYTES, NULL, NULL);
    print_row(o, pull_direct, STATE_BYTES, NULL, NULL);
    print_row(o, pull, STATE_BYTES, pull_raw_ws, pull_direct);

    /* (d) resume. */
    for (int i = 0; i < iters + 1; i++) {
        double t = time_pull(&b, 1);
        if (i > 0)
            samples_add(&s, t);
    }
    bench_result *res_remote = add("resume", "remote", &s);
    for (int i = 0; i < iters * 3 + 1; i++) {
        double t = time_local_open(&b, 0);
        if (i > 0)
            samples_add(&s, t);
    }
    bench_result *res_warm = add("resume", "local_warm", &s);
    for (int i = 0; i < iters * 3 + 1; i++) {
        double t = time_local_open(&b, 1);
        if (i > 0)
            samples_add(&s, t);
    }
    bench_result *res_cold = add("resume", "local_cold", &s);
    /* The state file: the whole KV as one value. */
    {
        redisReply *r = redisCommand(b.raw, "SET raw:state %b", b.chunks, STATE_BYTES);
        raw_ok(r, "SET raw:state");
    }
    for (int i = 0; i < iters + 1; i++) {
        double t = time_state_file(&b);
        settle_disk();
        if (i > 0)
            samples_add(&s, t);
    }
    bench_result *res_state = add("resume", "state_file", &s);
    print_row(o, res_warm, 0, NULL, NULL);
    print_row(o, res_cold, 0, NULL, NULL);
    print_row(o, res_state, STATE_BYTES, res_warm, NULL);
    print_row(o, res_remote, STATE_BYTES, res_warm, res_state);

    fprintf(text, "%starget: push and pull within 1.3x of raw Redis on the same bytes\n",
            o->json ? "" : "\n");
    ctxs_remote_stats stats;
    ctxs_remote_close(&stats, b.r, 10000);
    ctxs_store_close(b.st);
    redisFree(b.raw);
    stop_redis();
    free(b.chunks);
    free(b.buf);
    cleanup();
    return 0;
}
