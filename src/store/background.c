/*
 * The background worker: what a session needs done off its owner's thread.
 *
 * What a chat app's user waits for is the first token after a resume and
 * the moment a turn is saved. Three jobs would sit on that path if the
 * caller's thread did them, and none of them changes a result:
 *
 *   writeback  at ASYNC a commit must start writeback without waiting, but
 *              on Linux sync_file_range(WRITE) submits the I/O in the
 *              caller's context (block allocation, request queue), which
 *              costs about as much as writing the turn did;
 *   runway     the next turn's slots allocated (fallocate) and mapped
 *              writable (page faults cost about as much as copying the
 *              page), so that reserve costs microseconds; and mapped
 *              again while the user reads, each time the flusher has
 *              written them back (for a while after each commit);
 *   warm       after an open, the attention window read ahead from the disk
 *              and mapped, so that the first attention step waits only for
 *              what is not there yet (a fault on a page whose read is in
 *              flight waits for that read, not for a read of its own).
 *
 * One thread per process does them, for every session opened with the
 * background option: started by the first such open, stopped and joined by
 * the close of the last, so that a process with no session open keeps no
 * thread. Jobs are taken most urgent first (writeback, runway, then warm),
 * and a warm is done in chunks of runs, so that a commit's writeback never
 * waits behind the bring-in of a long session, and close waits for at most
 * one chunk (it sets closing; the worker looks between chunks).
 *
 * The worker reads a session's state, window and flags under the registry
 * mutex, and its descriptor and mapping without it: close removes the
 * session from the registry, which waits until the worker is done with it.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#include "internal.h"
#include "invariant.h"
#include "platform.h"

/*
 * Invariant W1: jobs are taken most urgent first, and their bits are
 *   numbered in that order (CTXS__JOB_*): next_job() takes the lowest bit
 *   set on any session, one bit at a time.
 * Invariant W2: a commit's writeback is taken before its runway: the runway
 *   maps pages writable that a writeback started after it would
 *   write-protect again, and the commit's writeback must not wait behind
 *   the runway's page faults.
 * Invariant W3: the worker touches a session only while it is worker_busy,
 *   and close (ctxs__background_leave()) returns only once it is not: no
 *   job runs on a session that close has freed. Held by the wait in
 *   ctxs__background_leave() itself (nothing to check beside it).
 */
_Static_assert(CTXS__JOB_MAP < CTXS__JOB_WRITEBACK && CTXS__JOB_WRITEBACK < CTXS__JOB_RUNWAY &&
                   CTXS__JOB_RUNWAY < CTXS__JOB_WARM && CTXS__JOB_WARM < CTXS__JOB_KEEP,
               "W1, W2: the job bits in order of urgency");

/* Under the registry mutex: */
static pthread_t worker;
static int worker_running;         /* started, and not yet told to exit */
/* Each worker exits once the generation is no longer its own: close of the
 * last session moves it on, and an open right after may start the next
 * worker before the last one has seen that. */
static uintptr_t generation;
static unsigned members;           /* open sessions with the option */
static ctxs_session *worker_busy;  /* the session the worker works on */
static pthread_cond_t work_wanted = PTHREAD_COND_INITIALIZER;
static pthread_cond_t worker_idle = PTHREAD_COND_INITIALIZER;

/* What the worker saw of a session under the mutex, for one job. */
typedef struct job_view {
    ctxs__state st;
    uint32_t window;
    uint64_t map_from, map_to;
} job_view;

/* The session whose most urgent job is the most urgent of all, and that
 * job's bit; NULL when nothing is wanted. A held session's jobs wait. */
static ctxs_session *next_job(unsigned *job)
{
    for (unsigned bit = CTXS__JOB_MAP; bit <= CTXS__JOB_KEEP; bit <<= 1)
        for (ctxs_session *s = ctxs__registry_head; s; s = s->next)
            if (!s->held && (atomic_load(&s->jobs) & bit)) {
                *job = bit;
                return s;
            }
    return NULL;
}

/* Runs one job, or one chunk of a warm. The warm's bit stays set while it
 * has more to do, so that the loop comes back to it after anything more
 * urgent. */
static void run_job(ctxs_session *s, unsigned job, const job_view *v)
{
    if (job == CTXS__JOB_WARM) {
        if (atomic_load(&s->closing) || !ctxs__warm_step(s, &v->st, v->window))
            atomic_fetch_and(&s->jobs, ~(unsigned)CTXS__JOB_WARM);
        return;
    }
    if (job == CTXS__JOB_WRITEBACK)
        ctxs__writeback_committed(s, &v->st, atomic_exchange(&s->writeback_whole, 0));
    else if (atomic_load(&s->closing))
        return;
    else if (job == CTXS__JOB_MAP)
        ctxs__map_positions(s, v->map_from, v->map_to);
    else if (job == CTXS__JOB_KEEP)
        ctxs__runway_keep(s);
    else
        ctxs__runway_prepare(s, &v->st);
}

/* The settle time the worker acts on for s, or 0: none for a session
 * without the option (it settles its own, at its next commit) or one being
 * closed (its close starts that writeback). */
static uint64_t worker_settle_ms(ctxs_session *s)
{
    return s->background && !atomic_load(&s->closing) ? atomic_load(&s->writeback_settle_ms) : 0;
}

/* Under the mutex: asks for the whole writeback of each session in the
 * worker's care whose commits have paused until its settle time. */
static void settle_writeback(uint64_t now)
{
    for (ctxs_session *s = ctxs__registry_head; s; s = s->next) {
        uint64_t settle = worker_settle_ms(s);
        if (settle && settle <= now &&
            atomic_compare_exchange_strong(&s->writeback_settle_ms, &settle, 0)) {
            atomic_store(&s->writeback_whole, 1);
            atomic_fetch_or(&s->jobs, CTXS__JOB_WRITEBACK);
        }
    }
}

/* Under the mutex, with nothing to do: waits for a job, or until the
 * earliest settle time of a session's writeback, and while a session keeps
 * its runway, at most CTXS__RUNWAY_CHECK_MS, after which it asks for the
 * runway of each session that keeps one to be kept (ctxs__runway_keep()
 * maps it again only if the flusher cleaned it). Not under memory
 * pressure: the pages are the system's to take back then. */
static void wait_for_work(void)
{
    const uint64_t now = ctxs__monotonic_ms();
    const int pressure = ctxs_get_pressure();
    uint64_t wake = UINT64_MAX;
    int keeping = 0;
    for (ctxs_session *s = ctxs__registry_head; s; s = s->next) {
        /* Only the settle times settle_writeback() acts on: one it skips
         * would be due at every pass, and the worker would spin. */
        const uint64_t settle = worker_settle_ms(s);
        if (settle && settle < wake)
            wake = settle;
        keeping |= !pressure && s->background && atomic_load(&s->runway_keep_until_ms) > now;
    }
    if (keeping && now + CTXS__RUNWAY_CHECK_MS < wake)
        wake = now + CTXS__RUNWAY_CHECK_MS;
    if (wake == UINT64_MAX) {
        pthread_cond_wait(&work_wanted, &ctxs__registry_mutex);
        return;
    }
    if (wake > now) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        const uint64_t ms = wake - now;
        until.tv_sec += (time_t)(ms / 1000u);
        until.tv_nsec += (long)(ms % 1000u) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        if (pthread_cond_timedwait(&work_wanted, &ctxs__registry_mutex, &until) != ETIMEDOUT)
            return;
    }
    const uint64_t later = ctxs__monotonic_ms();
    settle_writeback(later);
    for (ctxs_session *s = ctxs__registry_head; keeping && s; s = s->next)
        if (s->background && !atomic_load(&s->closing) &&
            atomic_load(&s->runway_keep_until_ms) > later)
            atomic_fetch_or(&s->jobs, CTXS__JOB_KEEP);
}

static void *worker_main(void *arg)
{
    const uintptr_t mine = (uintptr_t)arg;
#ifdef SCHED_BATCH
    /* Never preempting the thread that wakes it: woken as an ordinary
     * thread after a commit, the worker ran its writeback on the
     * committing thread's core first wherever the engine's other threads
     * kept the rest busy (llama.cpp's decode of Gemma 3 on 2 cores: 70 us
     * a commit of one token, 20 us with this). Errors leave it ordinary. */
    struct sched_param batch = {0};
    (void)sched_setscheduler(0, SCHED_BATCH, &batch);
#endif
    pthread_mutex_lock(&ctxs__registry_mutex);
    while (mine == generation) {
        unsigned job = 0;
        ctxs_session *s = next_job(&job);
        if (!s) {
            wait_for_work();
            continue;
        }
        CTXS__INVARIANT("W1", job && (job & (job - 1)) == 0 && (atomic_load(&s->jobs) & job));
        job_view v = {.st = s->st, .window = ctxs__effective_window(s),
                      .map_from = s->map_from, .map_to = s->map_to};
        if (job != CTXS__JOB_WARM) /* taken; a warm stays until it is done */
            atomic_fetch_and(&s->jobs, ~job);
        worker_busy = s;
        pthread_mutex_unlock(&ctxs__registry_mutex);
        run_job(s, job, &v);
        pthread_mutex_lock(&ctxs__registry_mutex);
        worker_busy = NULL;
        pthread_cond_broadcast(&worker_idle);
    }
    pthread_mutex_unlock(&ctxs__registry_mutex);
    return NULL;
}

/* Under the mutex. Returns whether a worker runs. */
static int worker_ensure(void)
{
    if (worker_running)
        return 1;
    if (pthread_create(&worker, NULL, worker_main, (void *)generation) != 0)
        return 0;
#ifdef __linux__
    pthread_setname_np(worker, CTXS__WORKER_NAME); /* for top, gdb and /proc */
#endif
    worker_running = 1;
    return 1;
}

void ctxs__background_request(ctxs_session *s, unsigned jobs)
{
    int have_worker = 0;
    if (!jobs)
        return;
    if (s->background) {
        /* After a commit; at FULL the runway is only allocated. */
        if ((jobs & CTXS__JOB_RUNWAY) && s->durability != CTXS_SYNC_FULL)
            atomic_store(&s->runway_keep_until_ms,
                         ctxs__monotonic_ms() + CTXS__RUNWAY_KEEP_MS);
        atomic_fetch_or(&s->jobs, jobs);
        pthread_mutex_lock(&ctxs__registry_mutex);
        if ((have_worker = worker_ensure()))
            pthread_cond_broadcast(&work_wanted);
        pthread_mutex_unlock(&ctxs__registry_mutex);
    }
    if (!have_worker && (jobs & CTXS__JOB_WRITEBACK)) {
        /* No worker: start the writeback here, as far as asked. */
        atomic_fetch_and(&s->jobs, ~(unsigned)CTXS__JOB_WRITEBACK);
        ctxs__writeback_committed(s, &s->st, atomic_exchange(&s->writeback_whole, 0));
    }
}

int ctxs__background_map(ctxs_session *s, uint64_t from, uint64_t to)
{
    if (!s->background)
        return -1;
    pthread_mutex_lock(&ctxs__registry_mutex);
    int have_worker = worker_ensure();
    if (have_worker) {
        /* A reservation not yet mapped extends the range. */
        int pending = (atomic_load(&s->jobs) & CTXS__JOB_MAP) != 0;
        s->map_from = pending && s->map_from < from ? s->map_from : from;
        s->map_to = pending && s->map_to > to ? s->map_to : to;
        atomic_fetch_or(&s->jobs, CTXS__JOB_MAP);
        pthread_cond_broadcast(&work_wanted);
    }
    pthread_mutex_unlock(&ctxs__registry_mutex);
    return have_worker ? 0 : -1;
}

void ctxs__background_join(ctxs_session *s)
{
    if (!s->background)
        return;
    pthread_mutex_lock(&ctxs__registry_mutex);
    members++;
    pthread_mutex_unlock(&ctxs__registry_mutex);
}

/* Whether this handle mapped slots writable ahead of the engine (their
 * zeros are dirty until written back). */
static int runway_mapped(ctxs_session *s)
{
    pthread_mutex_lock(&ctxs__registry_mutex);
    const int mapped = s->pop_to != 0;
    pthread_mutex_unlock(&ctxs__registry_mutex);
    return mapped;
}

void ctxs__background_leave(ctxs_session *s)
{
    if (!s->background) {
        if (atomic_exchange(&s->writeback_settle_ms, 0) != 0 || runway_mapped(s)) /* as below */
            (void)ctxs__writeback_start(s->fd, s->map, 0, s->map_bytes);
        return;
    }
    atomic_store(&s->closing, 1);
    pthread_mutex_lock(&ctxs__registry_mutex);
    while (worker_busy == s)
        pthread_cond_wait(&worker_idle, &ctxs__registry_mutex);
    /* What the writeback left for later is started now. */
    const int settle = atomic_exchange(&s->writeback_settle_ms, 0) != 0 ||
                       (atomic_load(&s->jobs) & CTXS__JOB_WRITEBACK);
    atomic_store(&s->jobs, 0);
    pthread_t done = worker;
    int join = --members == 0 && worker_running;
    if (join) {
        generation++;
        worker_running = 0;
        pthread_cond_broadcast(&work_wanted);
    }
    pthread_mutex_unlock(&ctxs__registry_mutex);
    if (join)
        pthread_join(done, NULL);
    /* Without waiting for the last: no one is left to tell. The runway's
     * zeros too: left dirty past the count, the next handle's commits
     * would take them for a large folio's (runway.c), and the flusher
     * writes them within 30 s anyway. */
    if (settle || runway_mapped(s))
        (void)ctxs__writeback_start(s->fd, s->map, 0, s->map_bytes);
}

void ctxs__background_hold(ctxs_session *s)
{
    if (!s->background)
        return;
    pthread_mutex_lock(&ctxs__registry_mutex);
    s->held = 1;
    while (worker_busy == s)
        pthread_cond_wait(&worker_idle, &ctxs__registry_mutex);
    pthread_mutex_unlock(&ctxs__registry_mutex);
}

void ctxs__background_release(ctxs_session *s)
{
    if (!s->background)
        return;
    pthread_mutex_lock(&ctxs__registry_mutex);
    s->held = 0;
    pthread_cond_broadcast(&work_wanted);
    pthread_mutex_unlock(&ctxs__registry_mutex);
}

void ctxs__background_forget(void)
{
    worker_running = 0;
    worker_busy = NULL;
    generation++;
    /* The parent's worker may have been inside a wait on them at the
     * fork, and a condition variable counts its waiters: in the child,
     * where that thread does not exist, a broadcast could wait for it to
     * leave forever. Nothing else runs in the child yet. */
    pthread_cond_init(&work_wanted, NULL);
    pthread_cond_init(&worker_idle, NULL);
}

#ifdef CTXS_TEST_HOOKS
void ctxs__background_wait_idle(void)
{
    pthread_mutex_lock(&ctxs__registry_mutex);
    for (;;) {
        unsigned job;
        if (!worker_running || (!worker_busy && !next_job(&job)))
            break;
        pthread_cond_wait(&worker_idle, &ctxs__registry_mutex);
    }
    pthread_mutex_unlock(&ctxs__registry_mutex);
}
#endif
