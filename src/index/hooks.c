/*
 * The store's hooks: one subscriber per store hears of the commits and
 * closes of sessions opened through it, and is asked for a session the
 * store lacks (index.h, ctxs__store_hooks). sessions.c calls them here
 * without knowing who listens.
 */
#include <pthread.h>

#include "index.h"

/* Hooks attach to and detach from their stores under this lock, which
 * the calls take to read st->hooks: a subscriber is never freed under a
 * hook that found it. One for the process: attaching is rare, and a
 * store without hooks never takes it. */
static pthread_mutex_t hooks_lock = PTHREAD_MUTEX_INITIALIZER;
/* Signalled under hooks_lock when the last missing() call of a store
 * ends. */
static pthread_cond_t hooks_idle = PTHREAD_COND_INITIALIZER;

int ctxs__store_hooks_attach(ctxs_store *st, const ctxs__store_hooks *h, void *arg)
{
    int rc = 0;
    pthread_mutex_lock(&hooks_lock);
    if (st->hooks) {
        rc = CTXS_EBUSY;
    } else {
        st->hooks_arg = arg;
        __atomic_store_n(&st->hooks, h, __ATOMIC_RELEASE); /* ctxs__store_hooks_session() */
    }
    pthread_mutex_unlock(&hooks_lock);
    return rc;
}

void ctxs__store_hooks_detach(ctxs_store *st, const ctxs__store_hooks *h)
{
    pthread_mutex_lock(&hooks_lock);
    if (st->hooks == h)
        __atomic_store_n(&st->hooks, NULL, __ATOMIC_RELEASE); /* ctxs__store_hooks_session() */
    while (st->hooks_users > 0)
        pthread_cond_wait(&hooks_idle, &hooks_lock);
    pthread_mutex_unlock(&hooks_lock);
}

void ctxs__store_hooks_session(ctxs_store *st, uint64_t id, uint64_t n_held, int event,
                               uint64_t *told)
{
    /* Every commit of every session comes here: a store without hooks
     * must not take a process-wide lock for it. st->hooks is written
     * under hooks_lock with atomic stores; a NULL read here is a commit
     * that came before the attach, as if it had taken the lock first.
     * Hooks found are read again under the lock, which keeps their
     * subscriber from being freed while they run. */
    if (!__atomic_load_n(&st->hooks, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&hooks_lock);
    const ctxs__store_hooks *h = st->hooks;
    if (h && h->session)
        h->session(st->hooks_arg, id, n_held, event, told);
    pthread_mutex_unlock(&hooks_lock);
}

int ctxs__store_hooks_missing(ctxs_store *st, const char *name)
{
    pthread_mutex_lock(&hooks_lock);
    const ctxs__store_hooks *h = st->hooks;
    void *arg = st->hooks_arg;
    int (*missing)(void *, const char *) = h ? h->missing : NULL;
    if (missing)
        st->hooks_users++; /* ctxs__store_hooks_detach() waits for it */
    pthread_mutex_unlock(&hooks_lock);
    if (!missing)
        return CTXS_ENOTFOUND;
    /* Without the lock: bringing a session in takes the network's time,
     * and commits of other sessions go on meanwhile. */
    int rc = missing(arg, name);
    pthread_mutex_lock(&hooks_lock);
    if (--st->hooks_users == 0)
        pthread_cond_broadcast(&hooks_idle);
    pthread_mutex_unlock(&hooks_lock);
    return rc;
}
