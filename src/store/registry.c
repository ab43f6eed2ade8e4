/*
 * The registry of open sessions in this process, and its fork safety.
 *
 * Memory pressure walks every open session, and the background worker
 * (background.c) finds its jobs here; both under one mutex.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "internal.h"

pthread_mutex_t ctxs__registry_mutex = PTHREAD_MUTEX_INITIALIZER;
ctxs_session *ctxs__registry_head;

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* fork() while the worker holds the mutex would leave the child a locked
 * mutex and no thread: hold it across fork, and forget the worker in the
 * child (threads are not inherited; the next request there starts one). */
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
    ctxs__background_forget();
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
    if (s->prev)
        s->prev->next = s->next;
    else if (ctxs__registry_head == s)
        ctxs__registry_head = s->next;
    if (s->next)
        s->next->prev = s->prev;
    s->prev = s->next = NULL;
    pthread_mutex_unlock(&ctxs__registry_mutex);
}

