/*
 * Large values, around hiredis's buffers: chunk values sent and read by
 * the remote tier itself, straight between the socket and one buffer.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "remote.h"
#include "syscall.h"

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
int ctxs__redis_send_set(redisContext *c, const char *key, const uint8_t *v, size_t len)
{
    int rc = ctxs__redis_flush(c);
    if (rc < 0)
        return rc;
    char head[CTXS__RCHUNK_KEY_MAX + 64];
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
        if ((rc = ctxs__redis_wait(c, POLLOUT)) < 0)
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

/* CTXS_EREMOTE if hiredis holds bytes it has not made replies of: the
 * server said more than it was asked. */
int ctxs__bulk_begin(ctxs__bulk_in *in, redisContext *c)
{
    in->c = c;
    in->at = in->len = 0;
    return c->reader && c->reader->len != c->reader->pos ? CTXS_EREMOTE : 0;
}

static int bulk_fill(ctxs__bulk_in *in)
{
    if (in->at == in->len)
        in->at = in->len = 0;
    if (in->len == sizeof(in->stage))
        return CTXS_EREMOTE; /* a line longer than any Redis sends here */
    int rc = ctxs__redis_wait(in->c, POLLIN);
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
static int bulk_bytes(ctxs__bulk_in *in, uint8_t *dst, size_t n)
{
    size_t have = in->len - in->at < n ? in->len - in->at : n;
    if (dst)
        memcpy(dst, in->stage + in->at, have);
    in->at += have;
    for (size_t got = have; got < n;) {
        ssize_t k;
        int rc = ctxs__redis_wait(in->c, POLLIN);
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
static int bulk_line(ctxs__bulk_in *in, char **line)
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
 * or CTXS__WRONGTYPE where the key holds a list, a hash, ... */
int ctxs__bulk_head(ctxs__bulk_in *in, int64_t *len, int *err)
{
    char *line;
    *len = -1;
    *err = 0;
    int rc = bulk_line(in, &line);
    if (rc < 0)
        return rc;
    if (line[0] == '-') {
        *err = !strncmp(line + 1, "WRONGTYPE", 9) ? CTXS__WRONGTYPE
                                                    : ctxs__redis_error_text(line + 1);
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
        ctxs__rsay("a bulk reply of %.24s bytes, above any string Redis holds", line + 1);
        *len = -1;
        return CTXS_EREMOTE;
    }
    return 0;
}

/* The value of the bulk reply whose header said len (>= 0) into dst
 * (NULL: dropped), and its CRLF. */
int ctxs__bulk_body(ctxs__bulk_in *in, uint8_t *dst, int64_t len)
{
    char crlf[2];
    int rc = bulk_bytes(in, dst, (size_t)len);
    if (rc == 0 && (rc = bulk_bytes(in, (uint8_t *)crlf, 2)) == 0 &&
        (crlf[0] != '\r' || crlf[1] != '\n'))
        rc = CTXS_EREMOTE;
    return rc;
}

/* CTXS_EREMOTE if the server sent more than the replies read. */
int ctxs__bulk_end(ctxs__bulk_in *in)
{
    return in->at == in->len ? 0 : CTXS_EREMOTE;
}

