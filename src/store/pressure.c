/*
 * Memory pressure: the process-wide flag, and the optional watcher, a
 * thread that reads what Linux says about available memory and flips the
 * flag. Polling at a second costs two small reads; PSI triggers would need a
 * privileged write on older kernels.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

static atomic_int pressure;

void ctxs_set_pressure(int on)
{
    on = on != 0;
    if (atomic_exchange(&pressure, on) == on)
        return;
    /* Growing back needs nothing: the window is computed at each use. */
    pthread_mutex_lock(&ctxs__registry_mutex);
    if (on)
        for (ctxs_session *s = ctxs__registry_head; s; s = s->next)
            ctxs__release_outside_window(s);
    pthread_mutex_unlock(&ctxs__registry_mutex);
}

int ctxs_get_pressure(void)
{
    return atomic_load(&pressure);
}

static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t watch_cond = PTHREAD_COND_INITIALIZER;
static pthread_t watch_thread;
static int watch_running, watch_stop;
static ctxs_watcher_options watch_opts;

/* MemAvailable in bytes, or -1 when unknown. */
static long long mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "re");
    if (!f)
        return -1;
    char line[256];
    long long kib = -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "MemAvailable: %lld kB", &kib) == 1)
            break;
    fclose(f);
    return kib < 0 ? -1 : kib * 1024;
}

/* PSI memory "some avg10" in percent, or -1 when unknown. */
static double psi_some_avg10(void)
{
    FILE *f = fopen("/proc/pressure/memory", "re");
    if (!f)
        return -1;
    double avg10 = -1;
    if (fscanf(f, "some avg10=%lf", &avg10) != 1)
        avg10 = -1;
    fclose(f);
    return avg10;
}

/* The decision, with hysteresis so that a reading near the threshold does
 * not flap the windows: on below the threshold, off only above 1.25x. */
static int under_pressure(const ctxs_watcher_options *o, int now)
{
    long long avail = mem_available();
    double psi = o->psi_some_avg10 ? psi_some_avg10() : -1;
    int low = avail >= 0 && (unsigned long long)avail < o->min_available;
    int recovered = avail < 0 || (unsigned long long)avail >= o->min_available + o->min_available / 4;
    int stalled = psi >= 0 && psi >= o->psi_some_avg10;
    int calm = psi < 0 || psi < o->psi_some_avg10 / 2.0;
    if (low || stalled)
        return 1;
    if (now && !(recovered && calm))
        return 1;
    return 0;
}

static void *watch_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&watch_lock);
    int state = -1;
    while (!watch_stop) {
        int on = under_pressure(&watch_opts, state == 1);
        if (on != state) {
            pthread_mutex_unlock(&watch_lock);
            ctxs_set_pressure(on);
            pthread_mutex_lock(&watch_lock);
            state = on;
        }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += watch_opts.poll_ms / 1000;
        until.tv_nsec += (long)(watch_opts.poll_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        while (!watch_stop &&
               pthread_cond_timedwait(&watch_cond, &watch_lock, &until) != ETIMEDOUT)
            ;
    }
    pthread_mutex_unlock(&watch_lock);
    return NULL;
}

int ctxs_watcher_start(const ctxs_watcher_options *opts)
{
    ctxs__error_begin();
    ctxs_watcher_options o;
    if (opts) {
        for (size_t i = 0; i < sizeof(opts->reserved); i++)
            CTXS__CHECK(!opts->reserved[i]);
        CTXS__CHECK(opts->version == CTXS_WATCHER_OPTIONS_VERSION && opts->poll_ms > 0);
        o = *opts;
    } else {
        o = (ctxs_watcher_options)CTXS_WATCHER_OPTIONS_INIT;
    }
    if (mem_available() < 0 && psi_some_avg10() < 0)
        return -ENOTSUP;

    pthread_mutex_lock(&watch_lock);
    if (watch_running) {
        pthread_mutex_unlock(&watch_lock);
        return -EALREADY;
    }
    watch_opts = o;
    watch_stop = 0;
    int rc = pthread_create(&watch_thread, NULL, watch_main, NULL);
    if (rc == 0)
        watch_running = 1;
    pthread_mutex_unlock(&watch_lock);
    return -rc;
}

void ctxs_watcher_stop(void)
{
    pthread_mutex_lock(&watch_lock);
    if (!watch_running) {
        pthread_mutex_unlock(&watch_lock);
        return;
    }
    watch_stop = 1;
    pthread_cond_signal(&watch_cond);
    pthread_mutex_unlock(&watch_lock);
    pthread_join(watch_thread, NULL);
    pthread_mutex_lock(&watch_lock);
    watch_running = 0;
    pthread_mutex_unlock(&watch_lock);
}
