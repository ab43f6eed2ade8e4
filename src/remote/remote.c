/*
 * A remote: its handle (open, flush, close, counters), attached to its
 * store through the store's hooks, and its push thread, fed by the
 * session hook with small jobs that it runs (push.c) with retries and a
 * backoff.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "remote.h"
#include "syscall.h"

#define BACKOFF_MAX_MS 2000u

/* The values a job would push, as chunks_dropped counts them: each chunk,
 * and for a record job the record and its tail. A record job without a
 * tail counted nothing, so a record dropped for a full queue left no
 * trace in the counters. */
static uint64_t job_values(const ctxs__job *j)
{
    return j->kind == CTXS__JOB_CHUNKS ? j->to - j->from : 1 + (uint64_t)(j->tail != 0);
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

void ctxs__remote_count(ctxs_remote *r, uint64_t *field, uint64_t n)
{
    pthread_mutex_lock(&r->mu);
    *field += n;
    pthread_mutex_unlock(&r->mu);
}

int ctxs__remote_stopping(ctxs_remote *r)
{
    pthread_mutex_lock(&r->mu);
    int stop = r->stop;
    pthread_mutex_unlock(&r->mu);
    return stop;
}

/* --- The push thread ---------------------------------------------------------- */

/* Queues j (r->mu held), merging it into the job before when both push
 * chunks of one session end to end, and keeping one record job per
 * session at the queue's end: a burst of commits costs one record. */
static void enqueue_locked(ctxs_remote *r, ctxs__job *j)
{
    ctxs__job *t = r->tail, *tp = r->tail_prev;
    if (j->kind == CTXS__JOB_CHUNKS) {
        ctxs__job *chunks = t && t->kind == CTXS__JOB_RECORD && t->id == j->id ? tp : t;
        if (chunks && chunks->kind == CTXS__JOB_CHUNKS && chunks->id == j->id &&
            chunks->to == j->from) {
            chunks->to = j->to;
            free(j);
            return;
        }
    } else if (t && t->kind == CTXS__JOB_RECORD && t->id == j->id) {
        t->tail |= j->tail;
        free(j);
        return;
    } else if (t && t->kind == CTXS__JOB_CHUNKS && t->id == j->id && tp &&
               tp->kind == CTXS__JOB_RECORD && tp->id == j->id) {
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

static void enqueue(ctxs_remote *r, enum ctxs__job_kind kind, uint64_t id, uint64_t from,
                    uint64_t to, int tail)
{
    ctxs__job *j = ctxs__calloc(1, sizeof(*j));
    if (!j) {
        ctxs__job lost = {kind, tail, id, from, to, NULL};
        pthread_mutex_lock(&r->mu);
        r->stats.chunks_dropped += job_values(&lost);
        r->stats.last_error = CTXS_ENOMEM;
        pthread_mutex_unlock(&r->mu);
        return;
    }
    *j = (ctxs__job){kind, tail, id, from, to, NULL};
    pthread_mutex_lock(&r->mu);
    enqueue_locked(r, j);
    pthread_mutex_unlock(&r->mu);
}

/* The store's session hook (index.h, ctxs__store_hooks): runs under the
 * hooks' lock, which keeps r from being freed meanwhile, and only queues. */
static void on_session(void *arg, uint64_t id, uint64_t n_held, int event, uint64_t *noted)
{
    ctxs_remote *r = arg;
    uint64_t chunks = n_held / CTXS_PREFIX_CHUNK;
    /* The first note of a handle starts from chunk 0: the thread asks
     * Redis which of the session's chunks it has (one EXISTS each,
     * pipelined) and sends the others. A rollback lowered *noted to the
     * chunks it left whole (the index does, src/index/sessions.c), so the
     * chunks rewritten after it are queued here like new ones. */
    if (chunks > *noted)
        enqueue(r, CTXS__JOB_CHUNKS, id, *noted, chunks, 0);
    /* A record only for a session that changed: one pulled and
     * closed untouched must not replace the fleet's longer record. */
    if ((event == CTXS__EVENT_COMMIT && chunks != *noted) || event == CTXS__EVENT_CLOSE_CHANGED)
        enqueue(r, CTXS__JOB_RECORD, id, 0, 0, event == CTXS__EVENT_CLOSE_CHANGED);
    *noted = chunks;
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
    ctxs__redis_close(w->c);
    w->c = NULL;
    pthread_mutex_lock(&w->r->mu);
    w->r->stats.connected = 0;
    pthread_mutex_unlock(&w->r->mu);
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
        ctxs__job *j = r->head;
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
            rc = ctxs__push_job(r, &w.c, j);
            if (rc == 0 || !network_error(rc) || attempt >= r->o.retries)
                break;
            worker_drop(&w);
            ctxs__remote_count(r, &r->stats.retries, 1);
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
                ctxs__redis_close(w.c);
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
        ctxs__redis_close(w.c);
    return NULL;
}

/* --- Open, flush, close --------------------------------------------------------- */

/* Drops the jobs still queued (the thread stopped or never ran), counted. */
static void jobs_drop(ctxs_remote *r)
{
    for (ctxs__job *j = r->head, *next; j; j = next) {
        next = j->next;
        r->stats.chunks_dropped += job_values(j);
        free(j);
    }
    r->head = r->tail = r->tail_prev = NULL;
    r->n_jobs = 0;
}

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
    int rc = ctxs__url_parse(&r->ep, url);
    redisContext *c = NULL;
    if (rc == 0 && (rc = ctxs__redis_open(&c, r)) == 0)
        ctxs__redis_close(c);
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
    r->hooks.session = o.push_on_commit ? on_session : NULL;
    r->hooks.missing = o.pull_on_open ? ctxs__remote_pull_missing : NULL;
    /* Attached before the thread starts: a commit meanwhile queues a job
     * that the thread takes once it runs. */
    if ((rc = ctxs__store_hooks_attach(st, &r->hooks, r)) == 0) {
        /* The thread takes no signal of the application's (SIGPIPE from
         * a dead server's socket included): it inherits a full mask. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        if (pthread_create(&r->thread, NULL, push_thread, r) != 0)
            rc = CTXS_ENOMEM;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (rc < 0) {
            ctxs__store_hooks_detach(st, &r->hooks);
            jobs_drop(r);
        }
    }
    if (rc == 0) {
        r->thread_started = 1;
        ctxs__store_ref(st);
    }
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

int ctxs_remote_open(ctxs_remote **out, ctxs_store *st, const char *url,
                     const ctxs_remote_options *opts)
{
    ctxs__remote_call call;
    ctxs__remote_enter(&call);
    int rc = remote_open_impl(out, st, url, opts);
    return ctxs__remote_leave(&call, rc);
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
    /* Detached first: hooks queue nothing more, and no pull of an open
     * runs through r. */
    ctxs__store_hooks_detach(r->st, &r->hooks);
    int rc = ctxs_remote_flush(NULL, r, timeout_ms);
    pthread_mutex_lock(&r->mu);
    r->stop = 1;
    pthread_cond_broadcast(&r->wake);
    pthread_mutex_unlock(&r->mu);
    /* The job under way ends within its commands' timeouts. */
    pthread_join(r->thread, NULL);
    jobs_drop(r);
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

