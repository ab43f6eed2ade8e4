/*
 * Pushing: a session's chunks (those Redis lacks), the windowed layers'
 * state of a session with a layer schedule, then its record, each value
 * copied race-free from the session and checked against one snapshot of
 * it; on the caller's thread (ctxs_remote_push()) or as a job of the
 * push thread (remote.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "platform.h"
#include "progress.h"
#include "remote.h"
#include "session_iface.h"
#include "syscall.h"

static_assert(CTXS_PREFIX_CHUNK == CTXS__KV_BLOCK_MAX_TOKENS, "a chunk is one raw block");

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
    if (sn->plan.lay.n_groups != ctxs__rn_windows(g)) {
        ctxs__rsay("the session's %" PRIu32 " slots (batch %" PRIu32 ") lay out a windowed "
                   "layer without its ring; the remote tier needs every windowed layer's ring "
                   "(export the session instead)", info.capacity, ctxs__session_batch(s));
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

/* Builds chunk k's value (k = n / 64 is the tail) into v, which has
 * ctxs__rchunk_bytes() bytes: the block copied from the session and
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
    static const uint8_t zero[16];
    ctxs__rchunk_header h;
    ctxs__rchunk_header_make(&h, &sn->model, first, count, (uint32_t)(count * sn->plan.token_raw),
                             k ? sn->chain[k - 1] : zero, sn->chain[k]);
    memcpy(v, &h, sizeof(h));
    return 0;
}

typedef struct push_counts {
    uint64_t sent, present, bytes, dropped;
} push_counts;

/* What a push sent, into r's counters. */
static void counts_add(ctxs_remote *r, const push_counts *pc)
{
    pthread_mutex_lock(&r->mu);
    r->stats.chunks_pushed += pc->sent;
    r->stats.chunks_present += pc->present;
    r->stats.bytes_pushed += pc->bytes;
    pthread_mutex_unlock(&r->mu);
}

/* --- The windowed layers' state (2.0) --------------------------------------- */

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
    uint64_t raw_bytes = ctxs__rwindow_raw_bytes(p, sn->n);
    if (CTXS__RWINDOW_HEADER_BYTES + raw_bytes > CTXS__RWINDOW_VALUE_MAX) {
        ctxs__rsay("the windowed layers' state of %" PRIu64 " tokens takes %" PRIu64
                   " bytes, above the 512 MiB a Redis value holds", sn->n, raw_bytes);
        return CTXS_EINVAL;
    }
    uint8_t *v = ctxs__malloc(CTXS__RWINDOW_HEADER_BYTES + raw_bytes);
    if (!v)
        return CTXS_ENOMEM;
    int rc = snapshot_hold(sn);
    uint8_t *at = v + CTXS__RWINDOW_HEADER_BYTES;
    for (uint32_t gi = 0; rc == 0 && gi < p->lay.n_groups; gi++) {
        ctxs__kv_range w = ctxs__rwindow_of(p, gi, sn->n);
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
    ctxs__rwindow_header_make(&h, &sn->model, p->lay.n_groups, sn->n, chain_at_end(sn), raw_bytes);
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
    char key[CTXS__RCHUNK_KEY_MAX];
    ctxs__rvalue_key(key, r, "window", &sn->model, chain_at_end(sn));
    const char *argv[] = {"EXISTS", key};
    redisReply *rep;
    int rc = ctxs__redis_command(&rep, c, &ctxs__cap_small, 2, argv, NULL);
    if (rc == 0 && (rc = ctxs__reply_check(c, rep, 0)) == 0 && rep->type != REDIS_REPLY_INTEGER)
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
    rc = ctxs__redis_send_set(c, key, v, len);
    free(v);
    if (rc == 0 && (rc = ctxs__reply_next(&rep, c)) == 0) {
        rc = ctxs__reply_check(c, rep, 0);
        freeReplyObject(rep);
    }
    if (rc == 0) {
        pc->sent++;
        pc->bytes += len;
    }
    return rc;
}

/* Reads the replies to n pipelined commands: every one, also after an
 * error reply, since a connection left out of step would hand the next
 * job this one's replies. Only an I/O error (no reply) ends the reading,
 * and the caller then drops the connection. With missing, the commands
 * were EXISTS: missing[i] says whether the i-th key is absent, and
 * *n_missing counts those. rc if it is an error already, else the first
 * error met. */
static int replies_read(redisContext *c, uint64_t n, uint8_t *missing, uint64_t *n_missing, int rc)
{
    int io = 0;
    for (uint64_t i = 0; i < n && !io; i++) {
        redisReply *rep;
        int r1 = ctxs__reply_next(&rep, c);
        io = r1 < 0;
        if (r1 == 0)
            r1 = ctxs__reply_check(c, rep, 0);
        if (missing) {
            if (r1 == 0 && rep->type != REDIS_REPLY_INTEGER)
                r1 = CTXS_EREMOTE;
            missing[i] = r1 == 0 && rep->integer == 0;
            *n_missing += missing[i];
        }
        if (rc == 0)
            rc = r1;
        if (rep)
            freeReplyObject(rep);
    }
    return rc;
}

/* Pushes chunks [from, to) of the snapshot (to = n / 64 + 1: the tail
 * too) that Redis lacks, a pipeline of at most CTXS__PIPELINE_BYTES of values
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
    uint64_t vbytes = ctxs__rchunk_bytes(&sn->plan, CTXS_PREFIX_CHUNK);
    uint64_t batch = CTXS__PIPELINE_BYTES / vbytes ? CTXS__PIPELINE_BYTES / vbytes : 1;
    uint8_t *value = NULL;
    uint8_t *missing = NULL;
    char(*keys)[CTXS__RCHUNK_KEY_MAX] = NULL;
    int rc = 0;
    if (from < to && (!(missing = ctxs__malloc((size_t)batch)) ||
                      !(keys = ctxs__malloc((size_t)batch * CTXS__RCHUNK_KEY_MAX))))
        rc = CTXS_ENOMEM;
    for (uint64_t b0 = from; rc == 0 && b0 < to; b0 += batch) {
        /* ctxs_remote_close() waits for the job under way: a job of many
         * batches ends at the next one, within one batch's timeouts. */
        if (ctxs__remote_stopping(r)) {
            rc = -ECANCELED;
            break;
        }
        uint64_t nb = to - b0 < batch ? to - b0 : batch;
        /* Every reply to what was appended is read (replies_read()). */
        uint64_t appended = 0;
        ctxs__redis_cap_set(c, &ctxs__cap_small);
        for (uint64_t i = 0; i < nb && rc == 0; i++) {
            ctxs__rchunk_key(keys[i], r, &sn->model, sn->chain[b0 + i]);
            const char *argv[] = {"EXISTS", keys[i]};
            if (redisAppendCommandArgv(c, 2, argv, NULL) != REDIS_OK)
                rc = ctxs__redis_error(c, errno);
            else
                appended++;
        }
        uint64_t n_missing = 0;
        rc = replies_read(c, appended, missing, &n_missing, rc);
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
            size_t len = (size_t)ctxs__rchunk_bytes(&sn->plan, cnt);
            if ((rc = snapshot_hold(sn)) == 0 && (rc = chunk_value(value, sn, b0 + i)) == 0)
                rc = snapshot_still_held(sn);
            snapshot_release(sn);
            if (rc == 0 && (rc = ctxs__redis_send_set(c, keys[i], value, len)) == 0) {
                sent++;
                sent_bytes += len;
            }
        }
        /* Every SET's reply, an error reply (OOM) included. */
        rc = replies_read(c, sent, NULL, NULL, rc);
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
    size_t sched = sn->model.geometry.period ? CTXS__RSCHEDULE_BYTES : 0;
    size_t total = sizeof(h) + sched + (size_t)sn->n * 4 + meta_bytes;
    uint8_t *v = ctxs__malloc(total);
    if (!v) {
        free(section);
        return CTXS_ENOMEM;
    }
    if (sched)
        ctxs__rschedule_bytes(v + sizeof(h), &sn->model.geometry);
    memcpy(v + sizeof(h) + sched, sn->ids, (size_t)sn->n * 4);
    if (meta_bytes)
        memcpy(v + sizeof(h) + sched + sn->n * 4, section, meta_bytes);
    free(section);
    uint32_t flags = tail || sn->n % CTXS_PREFIX_CHUNK == 0 ? CTXS__RSESSION_FLAG_TAIL : 0;
    ctxs__rsession_header_make(&h, &sn->model, me.name, name, sn->n, flags, meta_bytes, meta_count,
                               ctxs__rcrc(v + sizeof(h), total - sizeof(h)));
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
    char key[CTXS__RSESSION_KEY_MAX];
    ctxs__rsession_key(key, r, name);
    const char *argv[] = {"SET", key, (const char *)v};
    size_t lens[] = {3, strlen(key), len};
    redisReply *rep;
    if ((rc = ctxs__redis_command(&rep, c, &ctxs__cap_small, 3, argv, lens)) == 0)
        rc = ctxs__reply_check(c, rep, 0);
    if (rep)
        freeReplyObject(rep);
    free(v);
    if (rc == 0) {
        pc->bytes += len;
        ctxs__remote_count(r, &r->stats.records_pushed, 1);
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
    int rc = ctxs_session_open(out, path, NULL, CTXS_RDONLY, &o);
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
                            const ctxs_remote_push_options *opts)
{
    if (out)
        memset(out, 0, sizeof(*out));
    size_t len;
    if (!r || !name || ctxs__name_check(name, &len) < 0)
        return CTXS_EINVAL;
    ctxs__progress p;
    CTXS__PROGRESS_FROM(&p, opts, CTXS_REMOTE_PUSH_OPTIONS_VERSION, CTXS_REMOTE_PUSH_OPTIONS_INIT,
                        "remote push options");
    ctxs_progress_fn progress = p.fn;
    void *progress_arg = p.arg;
    ctxs_session *s;
    ctxs_open_options o = push_open_options();
    int rc = ctxs_store_session_open(&s, r->st, name, NULL, CTXS_RDONLY, &o);
    if (rc < 0)
        return rc;
    uint64_t id = 0;
    ctxs__session_store(s, &id);
    snapshot sn;
    push_counts pc = {0};
    redisContext *c = NULL;
    if ((rc = snapshot_take(&sn, s, id)) == 0 && (rc = ctxs__redis_open(&c, r)) == 0) {
        uint64_t to = sn.n / CTXS_PREFIX_CHUNK + (sn.n % CTXS_PREFIX_CHUNK != 0);
        if ((rc = push_chunks(c, r, &sn, 0, to, &pc, progress, progress_arg)) == 0 &&
            (rc = push_window(c, r, &sn, &pc)) == 0)
            rc = record_push(c, r, &sn, name, 1, &pc);
    }
    if (c)
        ctxs__redis_close(c);
    counts_add(r, &pc);
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

int ctxs_remote_push(ctxs_remote_push_result *out, ctxs_remote *r, const char *name,
                     const ctxs_remote_push_options *opts)
{
    ctxs__remote_call call;
    ctxs__remote_enter(&call);
    int rc = remote_push_impl(out, r, name, opts);
    return ctxs__remote_leave(&call, rc);
}

/* --- The push thread's jobs ----------------------------------------------- */

int ctxs__push_job(ctxs_remote *r, redisContext **c, const ctxs__job *j)
{
    char name[CTXS_NAME_MAX + 1];
    int rc = 0;
    if (j->kind == CTXS__JOB_RECORD && (rc = ctxs__session_name_of(name, r->st, j->id)) < 0)
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
    if (rc == 0 && !*c && (rc = ctxs__redis_open(c, r)) == 0) {
        pthread_mutex_lock(&r->mu);
        r->stats.connected = 1;
        pthread_mutex_unlock(&r->mu);
    }
    if (rc == 0)
        ctxs__redis_call_begin(*c); /* a job is a call: its own deadline */
    if (rc == 0 && j->kind == CTXS__JOB_CHUNKS) {
        rc = push_chunks(*c, r, &sn, j->from, j->to, &pc, NULL, NULL);
    } else if (rc == 0 && (j->tail || !sn.model.geometry.period)) {
        /* A session with a layer schedule sends its record only with its
         * tail and its windowed layers' state at the count the record
         * names (a close after commits): a record sent at a commit would
         * name a count whose windows Redis does not hold, and a pull of it
         * would get nothing (the window value of every count a commit
         * reaches would cost the windows' bytes again and again). */
        uint64_t whole = sn.n / CTXS_PREFIX_CHUNK;
        if (j->tail && sn.n % CTXS_PREFIX_CHUNK)
            rc = push_chunks(*c, r, &sn, whole, whole + 1, &pc, NULL, NULL);
        if (rc == 0)
            rc = push_window(*c, r, &sn, &pc);
        if (rc == 0)
            rc = record_push(*c, r, &sn, name, j->tail, &pc);
    }
    snapshot_free(&sn);
    counts_add(r, &pc);
    return rc;
}

