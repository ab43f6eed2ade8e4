/*
 * The registry of open sessions in this process, and the writeback thread.
 *
 * At ASYNC a commit must start writeback without waiting, but on Linux
 * sync_file_range(SYNC_FILE_RANGE_WRITE) submits the I/O in the caller's
 * context (block allocation, request queue), which costs about as much as
 * writing the turn did. So the commit only flags its session, and one thread
 * per process makes the call. An error it meets is handed back to the
 * session's owner, who fails the session at its next call.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "internal.h"
#include "sys.h"

pthread_mutex_t ctxs__registry_mutex = PTHREAD_MUTEX_INITIALIZER;
ctxs_session *ctxs__registry_head;

static pthread_cond_t writeback_done = PTHREAD_COND_INITIALIZER;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
/* Under the mutex: */
static int writeback_running;          /* the thread exists */
static int writeback_wanted;           /* some session is flagged */
static ctxs_session *writeback_busy;   /* the session in sync_file_range */

/* fork() while the writeback thread holds the mutex would leave the child a
 * locked mutex and no thread: hold it across fork, and forget the thread in
 * the child (threads are not inherited). */
static void before_fork(void)
{
    pthread_mutex_lock(&ctxs__registry_mutex);
}

static void after_fork_parent(void)
{
    pthread_mutex_unlock(&ctxs__registry_mutex);
}

static void after_fork_child(void)
{
    writeback_running = 0;
    writeback_wanted = 0;
    writeback_busy = NULL;
    pthread_mutex_unlock(&ctxs__registry_mutex);
}

static void register_atfork(void)
{
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

void ctxs__registry_set_state(ctxs_session *s, const ctxs__state *st, uint32_t cur_record)
{
    pthread_mutex_lock(&ctxs__registry_mutex);
    s->st = *st;
    s->cur_record = cur_record;
    pthread_mutex_unlock(&ctxs__registry_mutex);
}

void ctxs__registry_set_window(ctxs_session *s, uint32_t window)
{
    pthread_mutex_lock(&ctxs__registry_mutex);
    s->window = window;
    pthread_mutex_unlock(&ctxs__registry_mutex);
}

void ctxs__registry_add(ctxs_session *s)
{
    pthread_once(&atfork_once, register_atfork);
    pthread_mutex_lock(&ctxs__registry_mutex);
    s->prev = NULL;
    s->next = ctxs__registry_head;
    if (ctxs__registry_head)
        ctxs__registry_head->prev = s;
    ctxs__registry_head = s;
    pthread_mutex_unlock(&ctxs__registry_mutex);
}

void ctxs__registry_remove(ctxs_session *s)
{
    pthread_mutex_lock(&ctxs__registry_mutex);
    /* The writeback thread uses the session's descriptor and mapping
     * without the mutex: wait until it is done with them. */
    while (writeback_busy == s)
        pthread_cond_wait(&writeback_done, &ctxs__registry_mutex);
    if (s->prev)
        s->prev->next = s->next;
    else if (ctxs__registry_head == s)
        ctxs__registry_head = s->next;
    if (s->next)
        s->next->prev = s->prev;
    s->prev = s->next = NULL;
    pthread_mutex_unlock(&ctxs__registry_mutex);
}

/* Runs while any session wants writeback; exits when there is nothing to
 * do, so an idle process keeps no thread. The mutex is not held through
 * the system call, so commits never wait for it; close waits instead. */
static void *writeback_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&ctxs__registry_mutex);
    while (writeback_wanted) {
        writeback_wanted = 0;
        for (ctxs_session *s = ctxs__registry_head; s;) {
            if (!atomic_exchange(&s->writeback_wanted, 0)) {
                s = s->next;
                continue;
            }
            writeback_busy = s;
            pthread_mutex_unlock(&ctxs__registry_mutex);
            int rc = ctxs__start_writeback(s->fd, s->map, s->map_bytes);
            if (rc < 0)
                atomic_store(&s->writeback_error, rc);
            pthread_mutex_lock(&ctxs__registry_mutex);
            writeback_busy = NULL;
            pthread_cond_broadcast(&writeback_done);
            /* The list may have changed while unlocked: start over; flags
             * already taken are cleared, so this ends. */
            s = ctxs__registry_head;
        }
    }
    writeback_running = 0;
    pthread_mutex_unlock(&ctxs__registry_mutex);
    return NULL;
}

void ctxs__writeback_request(ctxs_session *s)
{
    atomic_store(&s->writeback_wanted, 1);
    pthread_mutex_lock(&ctxs__registry_mutex);
    writeback_wanted = 1;
    if (!writeback_running) {
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&thread, &attr, writeback_main, NULL) == 0)
            writeback_running = 1;
        pthread_attr_destroy(&attr);
    }
    int inline_writeback = !writeback_running;
    pthread_mutex_unlock(&ctxs__registry_mutex);
    if (inline_writeback && atomic_exchange(&s->writeback_wanted, 0)) {
        /* No thread to be had: start the writeback here, the slow way. */
        int rc = ctxs__start_writeback(s->fd, s->map, s->map_bytes);
        if (rc < 0)
            atomic_store(&s->writeback_error, rc);
    }
}
