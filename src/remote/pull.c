/*
 * Pulling: a session by name (its record, then its chunks in order), the
 * longest prefix of a prompt that Redis holds, and with a layer schedule
 * the windowed layers' state; every value verified before a byte of it
 * is written into the new session file, which appears complete or not at
 * all. Also the pull of a session an open misses (the store's missing()
 * hook).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "platform.h"
#include "progress.h"
#include "remote.h"
#include "session_iface.h"
#include "syscall.h"

/* A session record: its header, (2.0) its schedule, 4 bytes an id for at most
 * CTXS__REMOTE_MAX_TOKENS ids, a metadata section of at most 9 x 256 KiB
 * (docs/FORMAT.md, "Metadata section"). */
#define RECORD_MAX                                                                   \
    ((uint64_t)CTXS__RSESSION_HEADER_BYTES + CTXS__RSCHEDULE_BYTES +                 \
     4ull * CTXS__REMOTE_MAX_TOKENS + 9ull * CTXS_META_SESSION_MAX)
static const ctxs__reply_cap CAP_RECORD = {"session record", RECORD_MAX, RECORD_MAX + 64, 0};
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
    uint64_t want = ctxs__rchunk_bytes(p, count);
    if (len != want)
        return 1;
    ctxs__rchunk_header h;
    memcpy(&h, v, sizeof(h));
    uint8_t *raw = v + sizeof(h);
    if (ctxs__rchunk_header_check(&h, &pj->model, first, count, (uint32_t)(want - sizeof(h)), prev,
                                  chain))
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
 * CTXS__PIPELINE_BYTES of values at a time, until the first one missing or
 * refused. No EXISTS, and no binary search over the chain: the GETs are
 * needed anyway for what is present, and LRU eviction can take a middle
 * chunk, so presence is not monotone in the chunk count (a binary search
 * would step over the hole). Each value is read into one buffer, checked
 * there and written from there (ctxs__bulk_in). */
static int pull_chunks(pull_job *pj, const ctxs__kv_plan *p, int fd)
{
    uint64_t whole = pj->n / CTXS_PREFIX_CHUNK;
    uint64_t total = whole + (pj->try_tail && pj->n % CTXS_PREFIX_CHUNK != 0);
    uint64_t vbytes = ctxs__rchunk_bytes(p, CTXS_PREFIX_CHUNK);
    uint64_t batch = CTXS__PIPELINE_BYTES / vbytes ? CTXS__PIPELINE_BYTES / vbytes : 1;
    uint8_t prev[16] = {0}, chain[16];
    uint8_t(*chains)[16] = ctxs__malloc((size_t)(batch < total ? batch : total) * 16 + 16);
    uint8_t *value = total ? ctxs__malloc((size_t)vbytes) : NULL;
    ctxs__bulk_in *in = ctxs__malloc(sizeof(*in));
    /* A chunk reply holds at most a whole chunk of this model. */
    ctxs__reply_cap cap = {"chunk reply", vbytes, 4096, 0};
    ctxs__redis_cap_set(pj->c, &cap);
    int rc = chains && (value || !total) && in ? ctxs__bulk_begin(in, pj->c) : CTXS_ENOMEM;
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
            char key[CTXS__RCHUNK_KEY_MAX];
            ctxs__rchunk_key(key, pj->r, &pj->model, chains[i]);
            const char *argv[] = {"GET", key};
            if (redisAppendCommandArgv(pj->c, 2, argv, NULL) != REDIS_OK)
                rc = ctxs__redis_error(pj->c, errno);
        }
        if (rc == 0)
            rc = ctxs__redis_flush(pj->c);
        /* Every reply is read, also after the pull stopped and after
         * an error reply: the connection must be left in step. */
        for (uint64_t i = 0; i < nb && rc == 0; i++) {
            int64_t len;
            int err;
            if ((rc = ctxs__bulk_head(in, &len, &err)) < 0)
                break;
            if (len > (int64_t)vbytes) {
                ctxs__rsay("a chunk reply of %" PRId64 " bytes, above the %" PRIu64
                           " a chunk of this model holds", len, vbytes);
                rc = CTXS_EREMOTE;
                break;
            }
            uint64_t first = (b0 + i) * CTXS_PREFIX_CHUNK;
            uint32_t cnt = (uint32_t)(pj->n - first < CTXS_PREFIX_CHUNK ? pj->n - first
                                                                         : CTXS_PREFIX_CHUNK);
            int take = !stopped && len == (int64_t)ctxs__rchunk_bytes(p, cnt);
            if (len >= 0 && (rc = ctxs__bulk_body(in, take ? value : NULL, len)) < 0)
                break;
            if (stopped)
                continue;
            if (err == CTXS__WRONGTYPE) {
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
        rc = ctxs__bulk_end(in);
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
    if (len != sizeof(h) + ctxs__rwindow_raw_bytes(p, at) ||
        ctxs__rwindow_header_check(&h, &pj->model, p->lay.n_groups, at, chain, len - sizeof(h)))
        return 1;
    uint8_t *raw = v + sizeof(h);
    for (uint32_t gi = 0; gi < p->lay.n_groups; gi++) {
        ctxs__kv_range w = ctxs__rwindow_of(p, gi, at);
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
    uint64_t want = CTXS__RWINDOW_HEADER_BYTES + ctxs__rwindow_raw_bytes(p, at);
    int rc = chain_of(chain, pj->ids, at);
    if (rc < 0)
        return rc;
    if (want > CTXS__RWINDOW_VALUE_MAX)
        return 2; /* never pushed */
    char key[CTXS__RCHUNK_KEY_MAX];
    ctxs__rvalue_key(key, pj->r, "window", &pj->model, chain);
    uint8_t *v = NULL;
    ctxs__bulk_in *in = ctxs__malloc(sizeof(*in));
    ctxs__reply_cap cap = {"window reply", want, 4096, 0};
    ctxs__redis_cap_set(pj->c, &cap);
    const char *argv[] = {"GET", key};
    if (!in)
        rc = CTXS_ENOMEM;
    else if (redisAppendCommandArgv(pj->c, 2, argv, NULL) != REDIS_OK)
        rc = ctxs__redis_error(pj->c, errno);
    else if ((rc = ctxs__redis_flush(pj->c)) == 0)
        rc = ctxs__bulk_begin(in, pj->c);
    int64_t len = -1;
    int err = 0, got = 2;
    if (rc == 0 && (rc = ctxs__bulk_head(in, &len, &err)) == 0 && len >= 0) {
        /* A value of another length is read and dropped: the connection
         * stays in step. */
        int take = len == (int64_t)want;
        if (take && !(v = ctxs__malloc((size_t)want)))
            rc = CTXS_ENOMEM; /* the connection is dropped with the call */
        else if ((rc = ctxs__bulk_body(in, take ? v : NULL, len)) == 0)
            got = take && window_check(pj, p, v, (uint64_t)len, at, chain) == 0 ? 0 : 1;
    }
    if (rc == 0)
        rc = ctxs__bulk_end(in);
    if (rc == 0 && err == CTXS__WRONGTYPE)
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
        ctxs__kv_range w = ctxs__rwindow_of(p, gi, at), keep = ctxs__rwindow_of(p, gi, m);
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
    if (lay.n_groups != ctxs__rn_windows(g)) {
        ctxs__rsay("%" PRIu32 " slots with a batch of %" PRIu32 " lay out a windowed layer "
                   "without its ring: a pull fills the rings from the windowed layers' state; "
                   "ask for more slots", o.capacity, batch);
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

/* opts, or the defaults where NULL: CTXS_EINVAL, said, for another
 * version or reserved bytes set. */
static int pull_options(const ctxs_remote_pull_options **opts)
{
    static const ctxs_remote_pull_options defaults = CTXS_REMOTE_PULL_OPTIONS_INIT;
    const ctxs_remote_pull_options *o = *opts;
    if (!o) {
        *opts = &defaults;
        return 0;
    }
    ctxs__progress checked;
    return ctxs__progress_options(&checked, "remote pull options", "CTXS_REMOTE_PULL_OPTIONS_INIT",
                                  o->version, CTXS_REMOTE_PULL_OPTIONS_VERSION, o->reserved0,
                                  o->reserved, sizeof(o->reserved), o->progress, o->progress_arg);
}

static int remote_pull_impl(ctxs_session **out, ctxs_remote_pull_result *res, ctxs_remote *r,
                            const char *remote_name, const char *local_name,
                            const ctxs_create_options *create, const ctxs_remote_pull_options *opts)
{
    if (out)
        *out = NULL;
    if (res)
        memset(res, 0, sizeof(*res));
    size_t len, rlen;
    if (!local_name)
        local_name = remote_name;
    if (!r || !remote_name || ctxs__name_check(remote_name, &rlen) < 0 ||
        ctxs__name_check(local_name, &len) < 0 || pull_options(&opts) < 0)
        return CTXS_EINVAL;
    if (r->st->rdonly)
        return ctxs__store_readonly();
    int rc = local_name_free(r->st, local_name);
    if (rc < 0)
        return rc;
    redisContext *c;
    if ((rc = ctxs__redis_open(&c, r)) < 0)
        return rc;
    char key[CTXS__RSESSION_KEY_MAX];
    ctxs__rsession_key(key, r, remote_name);
    const char *argv[] = {"GET", key};
    redisReply *rep;
    ctxs__record rec = {0};
    if ((rc = ctxs__redis_command(&rep, c, &CAP_RECORD, 2, argv, NULL)) == 0 &&
        (rc = ctxs__reply_check(c, rep, 0)) == 0)
        rc = rep->type == REDIS_REPLY_NIL      ? CTXS_ENOTFOUND
             : rep->type != REDIS_REPLY_STRING ? CTXS_EREMOTE
                                               : ctxs__record_parse(&rec, rep->str, rep->len,
                                                                    remote_name);
    if (rep)
        freeReplyObject(rep);
    pull_job pj = {.r = r, .c = c, .model = rec.model, .ids = rec.ids, .n = rec.h.n_tokens,
                   .n_ids = rec.h.n_tokens, .try_tail = (rec.h.flags & CTXS__RSESSION_FLAG_TAIL) != 0,
                   .created_unix_ms = ctxs__now_ms(), .progress = opts->progress,
                   .progress_arg = opts->progress_arg};
    if (rc == 0)
        rc = local_model_fits(r->st, &rec.model);
    if (rc == 0)
        rc = pull_layout(&pj, create, rec.h.n_tokens);
    ctxs_session *s = NULL;
    if (rc == 0)
        rc = ctxs__store_session_create_filled(&s, r->st, local_name, len, &rec.model,
                                               rec.model_name, rec.items, rec.h.meta_count,
                                               pull_fill, &pj);
    ctxs__redis_close(c);
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
    ctxs__record_free(&rec);
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
                                   const ctxs_create_options *create,
                                   const ctxs_remote_pull_options *opts)
{
    if (out)
        *out = NULL;
    if (res)
        memset(res, 0, sizeof(*res));
    size_t len;
    if (!r || !model || (!tokens && n) || !local_name || ctxs__name_check(local_name, &len) < 0 ||
        n > CTXS__REMOTE_MAX_TOKENS || pull_options(&opts) < 0)
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
    if ((rc = ctxs__redis_open(&c, r)) < 0)
        return rc;
    pull_job pj = {.r = r, .c = c, .model = *model, .ids = tokens, .n = n, .n_ids = n,
                   .try_tail = 1, .prefix = 1, .created_unix_ms = ctxs__now_ms(),
                   .progress = opts->progress, .progress_arg = opts->progress_arg};
    rc = pull_layout(&pj, create, n);
    ctxs_session *s = NULL;
    if (rc == 0)
        rc = ctxs__store_session_create_filled(&s, r->st, local_name, len, model, NULL, NULL, 0,
                                               pull_fill, &pj);
    ctxs__redis_close(c);
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

int ctxs_remote_pull(ctxs_session **out, ctxs_remote_pull_result *res, ctxs_remote *r,
                     const char *remote_name, const char *local_name,
                     const ctxs_create_options *create, const ctxs_remote_pull_options *opts)
{
    ctxs__remote_call call;
    ctxs__remote_enter(&call);
    int rc = remote_pull_impl(out, res, r, remote_name, local_name, create, opts);
    return ctxs__remote_leave(&call, rc);
}

int ctxs_remote_pull_prefix(ctxs_session **out, ctxs_remote_pull_result *res, ctxs_remote *r,
                            const char *local_name, const ctxs_model *model,
                            const uint32_t *tokens, uint64_t n, const ctxs_create_options *create,
                            const ctxs_remote_pull_options *opts)
{
    ctxs__remote_call call;
    ctxs__remote_enter(&call);
    int rc = remote_pull_prefix_impl(out, res, r, local_name, model, tokens, n, create, opts);
    return ctxs__remote_leave(&call, rc);
}

/* --- Pulling on an open's miss ------------------------------------------------ */

int ctxs__remote_pull_missing(void *arg, const char *name)
{
    ctxs_remote *r = arg;
    int rc = ctxs_remote_pull(NULL, NULL, r, name, NULL, NULL, NULL);
    if (rc < 0 && rc != CTXS_ENOTFOUND && rc != CTXS_ETAKEN) {
        pthread_mutex_lock(&r->mu);
        r->stats.last_error = rc;
        pthread_mutex_unlock(&r->mu);
    }
    /* CTXS_ETAKEN: another thread pulled or created it meanwhile. */
    return rc == 0 || rc == CTXS_ETAKEN ? 0 : CTXS_ENOTFOUND;
}
