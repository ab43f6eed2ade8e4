/*
 * The remote tier, inside: sessions pushed to a Redis server and pulled
 * back on another machine. remote_format.h has the values; docs/FORMAT.md,
 * "Remote values", their prose. This header is what the files of
 * src/remote share; nothing outside the folder includes it.
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
 * the store's session hook (index.h, ctxs__store_hooks), under the
 * queue's mutex; the thread opens the session file read-only by id
 * itself. The calls on the caller's thread (push, pull, list, info) each
 * open a connection of their own, so they are thread-safe and need no
 * lock beyond the counters'.
 */
#ifndef CTXS_REMOTE_H
#define CTXS_REMOTE_H

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "ctxstore.h"
#include "index.h"
#include "kv_block.h"
#include "remote_format.h"

/* Bytes of values asked for in one pipeline: bounds what the server
 * buffers for a pull's GETs (a chunk of a large model is ~20 MiB). This
 * side holds one chunk's value at a time either way. */
#define CTXS__PIPELINE_BYTES (64u << 20)

/* --- The handle (remote.c) ------------------------------------------------- */

enum ctxs__job_kind { CTXS__JOB_CHUNKS, CTXS__JOB_RECORD };

/* A background push: the chunks [from, to) of session id, or its record
 * (with its tail first when tail is set). */
typedef struct ctxs__job {
    enum ctxs__job_kind kind;
    int tail;
    uint64_t id;
    uint64_t from, to;
    struct ctxs__job *next;
} ctxs__job;

typedef struct ctxs__endpoint {
    int is_unix;
    char host[256];             /* or the socket's path */
    int port;
    int db;
    char user[256];             /* "" for none */
    char password[512];         /* "" for none */
} ctxs__endpoint;

struct ctxs_remote {
    ctxs_store *st;             /* referenced while r lives */
    ctxs_remote_options o;
    char prefix[CTXS_NAME_MAX + 1];
    ctxs__endpoint ep;
    ctxs__store_hooks hooks;    /* attached to st while r lives */

    pthread_mutex_t mu;         /* the queue, the counters */
    pthread_cond_t wake;        /* work or stop, for the thread */
    pthread_cond_t idle;        /* the queue drained, for flush */
    ctxs__job *head, *tail, *tail_prev;
    uint64_t n_jobs;
    int busy;                   /* the thread runs a job it took */
    int stop;
    int thread_started;
    pthread_t thread;
    ctxs_remote_stats stats;
};

/* Adds n to the counter field of r, under r->mu. */
void ctxs__remote_count(ctxs_remote *r, uint64_t *field, uint64_t n);

/* Whether r is closing (its thread's jobs end at the next batch). */
int ctxs__remote_stopping(ctxs_remote *r);

/* --- One call, the connection and its replies (connection.c) ---------------- */

/* Around every public call that may touch the network: the thread's
 * last error cleared, SIGPIPE blocked (a write to a closed connection
 * must return -EPIPE, not end the process), and at the end the mask as
 * it was and a failure that met a limit said in words. */
typedef struct ctxs__remote_call {
    sigset_t old;
    int was_pending;
} ctxs__remote_call;
void ctxs__remote_enter(ctxs__remote_call *call);
int ctxs__remote_leave(ctxs__remote_call *call, int rc);

/* What the calling thread's call met, in words: its reason when it fails
 * (ctxs_get_last_error()). */
void ctxs__rsay(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* "redis://[[user]:password@]host[:port][/db]" or "unix:///path[?db=N]"
 * into ep. CTXS_EINVAL for anything else (TLS, "rediss://", included). */
int ctxs__url_parse(ctxs__endpoint *ep, const char *url);

/* Connects to r's server, authenticates, selects the database and checks
 * that the server answers PING as Redis does; the call's deadline starts.
 * ctxs__redis_close() it. */
int ctxs__redis_open(redisContext **out, const ctxs_remote *r);
void ctxs__redis_close(redisContext *c);

/* Starts a call on c: its deadline is call_ms from now. */
void ctxs__redis_call_begin(redisContext *c);

/* What one command's reply may be. */
typedef struct ctxs__reply_cap {
    const char *what;       /* the command, in messages */
    uint64_t bulk;          /* a bulk string's length at most */
    uint64_t bytes;         /* an incomplete reply's bytes at most */
    long long elements;     /* an array's count at most */
} ctxs__reply_cap;

/* Statuses, integers, errors. */
extern const ctxs__reply_cap ctxs__cap_small;

/* Holds the replies read from now on to cap. */
void ctxs__redis_cap_set(redisContext *c, const ctxs__reply_cap *cap);

/* One command, and its reply held to cap. 0 with *out (which may be an
 * error reply), or an error with *out NULL. */
int ctxs__redis_command(redisReply **out, redisContext *c, const ctxs__reply_cap *cap, int argc,
                        const char **argv, const size_t *lens);

/* Reads the next pipelined reply into *out (freeReplyObject() it), held
 * to the cap last set, within the call's deadline. */
int ctxs__reply_next(redisReply **out, redisContext *c);

/* The result of one command's reply: 0, or an error (saved: errno after
 * the call that gave no reply). */
int ctxs__reply_check(redisContext *c, redisReply *rep, int saved);

/* What c's error means, as a ctxstore code (saved: errno after it). */
int ctxs__redis_error(const redisContext *c, int saved);

/* An error reply's text as a code: -EACCES (a password refused or
 * required), else CTXS_EREMOTE. */
int ctxs__redis_error_text(const char *str);

/* Waits until c's socket is ready for events (POLLIN, POLLOUT), at most
 * until the call's deadline and timeout_ms. 0, -ETIMEDOUT, -errno. */
int ctxs__redis_wait(redisContext *c, short events);

/* Sends hiredis's output buffer, within the call's deadline. */
int ctxs__redis_flush(redisContext *c);

/* --- Large values, around hiredis's buffers (bulk.c) ------------------------ */

/* Sends a SET of key to the value v[len], after what hiredis holds,
 * without copying v; its reply is read with ctxs__reply_next(). */
int ctxs__redis_send_set(redisContext *c, const char *key, const uint8_t *v, size_t len);

/* Reads pipelined bulk replies from c's socket: the lines through a small
 * buffer, a value's bytes straight into the caller's memory. */
typedef struct ctxs__bulk_in {
    redisContext *c;
    size_t at, len;             /* stage[at, len): read, not yet used */
    char stage[4096];
} ctxs__bulk_in;

/* An error reply of a key that holds a list, a hash, ...: no value. */
#define CTXS__WRONGTYPE 1

/* CTXS_EREMOTE if hiredis holds bytes it has not made replies of. */
int ctxs__bulk_begin(ctxs__bulk_in *in, redisContext *c);
/* The header of the next reply, a bulk string or an error: *len its
 * length, or -1 for nil or an error; *err 0, an error reply's code, or
 * CTXS__WRONGTYPE. */
int ctxs__bulk_head(ctxs__bulk_in *in, int64_t *len, int *err);
/* The value whose header said len (>= 0) into dst (NULL: dropped). */
int ctxs__bulk_body(ctxs__bulk_in *in, uint8_t *dst, int64_t len);
/* CTXS_EREMOTE if the server sent more than the replies read. */
int ctxs__bulk_end(ctxs__bulk_in *in);

/* --- Values and their keys (values.c) ------------------------------------- */

/* zlib's crc32 of p[0..n). */
uint32_t ctxs__rcrc(const void *p, size_t n);

/* The schedule as it travels: u32 period, u32 window[8] (36 bytes). */
void ctxs__rschedule_bytes(uint8_t out[CTXS__RSCHEDULE_BYTES], const ctxs_geometry *g);

/* The major version of the values of a model: 2.0 with a layer schedule. */
uint16_t ctxs__rmajor(const ctxs_model *m);

/* The schedule's distinct windows: the groups of a layout in which every
 * windowed layer keeps its ring. */
uint32_t ctxs__rn_windows(const ctxs_geometry *g);

/* "<prefix>:<kind>:<model hash>:<form>:<chain>" into
 * key[CTXS__RCHUNK_KEY_MAX], kind "chunk" or "window". */
#define CTXS__RCHUNK_KEY_MAX (CTXS_NAME_MAX + 256)
void ctxs__rvalue_key(char *key, const ctxs_remote *r, const char *kind, const ctxs_model *model,
                      const uint8_t chain[16]);
void ctxs__rchunk_key(char *key, const ctxs_remote *r, const ctxs_model *model,
                      const uint8_t chain[16]);
/* "<prefix>:session:<name>" into key[CTXS__RSESSION_KEY_MAX]. */
#define CTXS__RSESSION_KEY_MAX (2 * CTXS_NAME_MAX + 16)
void ctxs__rsession_key(char *key, const ctxs_remote *r, const char *name);

/* The bytes of a chunk value of count tokens. */
uint64_t ctxs__rchunk_bytes(const ctxs__kv_plan *p, uint32_t count);

/* A Redis string holds at most 512 MiB. */
#define CTXS__RWINDOW_VALUE_MAX (512ull << 20)

/* The positions of group gi's window at n tokens. */
ctxs__kv_range ctxs__rwindow_of(const ctxs__kv_plan *p, uint32_t gi, uint64_t n);

/* The raw bytes of a window value at n tokens. */
uint64_t ctxs__rwindow_raw_bytes(const ctxs__kv_plan *p, uint64_t n);

/* A chunk's header for model, its crc32 set. */
void ctxs__rchunk_header_make(ctxs__rchunk_header *h, const ctxs_model *model, uint64_t first,
                              uint32_t count, uint32_t raw_bytes, const uint8_t prev[16],
                              const uint8_t chain[16]);
/* 0 if h is the header ctxs__rchunk_header_make() makes of the same
 * arguments (reserved bytes zero), 1 if not. */
int ctxs__rchunk_header_check(const ctxs__rchunk_header *h, const ctxs_model *model,
                              uint64_t first, uint32_t count, uint32_t raw_bytes,
                              const uint8_t prev[16], const uint8_t chain[16]);

/* A window value's header for model (with a layer schedule), its crc32
 * set; and its check, as for a chunk's. */
void ctxs__rwindow_header_make(ctxs__rwindow_header *h, const ctxs_model *model,
                               uint32_t n_groups, uint64_t n_tokens, const uint8_t chain[16],
                               uint64_t raw_bytes);
int ctxs__rwindow_header_check(const ctxs__rwindow_header *h, const ctxs_model *model,
                               uint32_t n_groups, uint64_t n_tokens, const uint8_t chain[16],
                               uint64_t raw_bytes);

/* A session record's header: name, the model (model_name its display
 * name, "" for none), n_tokens ids, flags, the metadata section's size
 * and entries, the crc32 of the body; its crc32 set. */
void ctxs__rsession_header_make(ctxs__rsession_header *h, const ctxs_model *model,
                                const char *model_name, const char *name, uint64_t n_tokens,
                                uint32_t flags, uint32_t meta_bytes, uint32_t meta_count,
                                uint32_t body_crc32);
/* Checks a record's header (the first CTXS__RSESSION_HEADER_BYTES of v,
 * copied into *h). Errors: CTXS_EREMOTE. */
int ctxs__rsession_header_check(ctxs__rsession_header *h, const void *v, size_t len);

/* A session record, checked. */
typedef struct ctxs__record {
    ctxs__rsession_header h;
    ctxs_model model;
    char model_name[CTXS_NAME_MAX + 1];
    uint32_t *ids;              /* [h.n_tokens], malloc'd */
    uint8_t *meta;              /* the metadata section, malloc'd */
    ctxs__meta_item *items;     /* pointing into meta */
} ctxs__record;

/* The record v[len] of the session name, checked whole. Errors:
 * CTXS_EREMOTE, CTXS_ENOMEM. ctxs__record_free() it either way. */
int ctxs__record_parse(ctxs__record *rec, const void *v, size_t len, const char *name);
void ctxs__record_free(ctxs__record *rec);

/* --- Pushing (push.c) -------------------------------------------------- */

/* Runs one job of r's push thread on its connection *c (opened here when
 * NULL, and left open). */
int ctxs__push_job(ctxs_remote *r, redisContext **c, const ctxs__job *j);

/* --- Pulling (pull.c) -------------------------------------------------- */

/* The store's missing() hook (arg: the remote): pulls the session name
 * through ctxs_remote_pull(). 0 when the store now has it, else
 * CTXS_ENOTFOUND (no such remote session, or Redis out of reach: its
 * error is kept in the remote's last_error). */
int ctxs__remote_pull_missing(void *arg, const char *name);

#endif
