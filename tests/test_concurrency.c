/*
 * Many threads and processes on one store at once: creating, appending,
 * rolling back, checkpointing, forking, deleting, renaming, finding
 * prefixes, collecting (gc), compacting, exporting and importing, listing;
 * readers checking other threads' sessions while they are written; a
 * maintenance thread repairing and compacting through a second handle.
 *
 * As the header documents: one ctxs_store handle per process, shared by its
 * threads (a second handle for the maintenance thread, since compacting
 * the whole store wants a handle no other thread uses); one session handle
 * per thread; children open their own store after fork().
 *
 * Every worker owns one session it keeps open read-write (so that gc never
 * takes it) and records every acknowledged token; afterwards the store must
 * open with nothing pending, files and index agree (nothing half created or
 * leaked, gc left no orphan), repair finds nothing to do, every owned
 * session holds exactly its acknowledged tokens with its checkpoints, every
 * session verifies, and prefix lookups are honest.
 *
 * The default run does a few seconds of it; CTXS_CONCURRENCY_LONG=1 (the
 * 'soak' suite's concurrency_soak) runs it 25 times longer, scaled again by
 * CTXS_SOAK_SCALE. Seeds: CTXS_TEST_SEED. Runs with --jobs 1.
 *
 * Under ThreadSanitizer (-Db_sanitize=thread) Criterion cannot run, so this
 * file is also built against tests/standalone/ as concurrency_tsan.
 * CTXS_CONCURRENCY_NO_PRESSURE=1 leaves out memory pressure.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ctxstore.h"
#include "index.h"
#include "support.h"

#define say(...) (fprintf(stderr, __VA_ARGS__), fputc('\n', stderr))

#define MODEL_SEED 31u
#define MAX_N 3000u        /* the owned session stays below (no ring wrap) */
#define OWN_CAPACITY 4096u
#define MAX_CPS 8
#define MAX_DISP 1024
#define MAX_WORKERS 16
#define NAME_LEN 40

TestSuite(concurrency, .init = ts_scratch_init, .fini = ts_scratch_fini);

static unsigned rounds(unsigned short_run)
{
    const char *lng = getenv("CTXS_CONCURRENCY_LONG");
    if (!lng || !*lng || strcmp(lng, "0") == 0)
        return short_run;
    const char *e = getenv("CTXS_SOAK_SCALE");
    double scale = e && *e ? strtod(e, NULL) : 1.0;
    double v = short_run * 25.0 * (scale > 0 ? scale : 1.0);
    return v < 1 ? 1u : (unsigned)v;
}

/* --- What a worker owns and reports ------------------------------------------ */

enum { DISP_LIVE = 1, DISP_DELETED, DISP_GONE };

typedef struct disp_rec {
    char name[NAME_LEN];
    uint64_t n;
    int state;
} disp_rec;

typedef struct cp_rec {
    char name[NAME_LEN];
    uint64_t n;
    uint32_t last_id;
} cp_rec;

/* Lives in shared memory in the process test: the parent reads it after
 * the children exit. */
typedef struct worker {
    int proc, thr, wid;
    unsigned rounds;
    uint64_t seed;
    char own[NAME_LEN];
    uint64_t n;               /* acknowledged tokens of own */
    uint32_t ids[MAX_N + 256];
    cp_rec cp[MAX_CPS];
    int n_cp;
    disp_rec disp[MAX_DISP];
    int n_disp;
    uint32_t counter;
    uint64_t ops[24];
    uint64_t acked_tokens, reader_checks, reader_void, prefix_found, prefix_missed, forks,
        fork_refused, gc_deleted, restores_refused, own_reopens;
    uint64_t failures;
    char failure[640];
} worker;

typedef struct maint {
    unsigned rounds;
    uint64_t seed;
    uint64_t repairs, compacts, gcs, gc_deleted, reopens, entries_removed, failures;
    char failure[640];
} maint;

__attribute__((format(printf, 4, 5))) static void w_fail(uint64_t *count, char *buf,
                                                        size_t len, const char *fmt, ...)
{
    if ((*count)++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, len, fmt, ap);
        va_end(ap);
    }
}

#define WFAIL(w, ...) w_fail(&(w)->failures, (w)->failure, sizeof((w)->failure), __VA_ARGS__)

enum {
    OP_APPEND, OP_ROLLBACK, OP_CP, OP_RESTORE, OP_CREATE, OP_DELETE, OP_FORK, OP_PREFIX,
    OP_READ, OP_LIST, OP_GC, OP_COMPACT, OP_EXPORT, OP_RENAME, OP_REOPEN, OP_STORE_OPEN,
    OP_PRESSURE, OP_N
};
static const char *const op_names[OP_N] = {
    "append", "rollback", "checkpoint", "restore", "create", "delete", "fork", "prefix",
    "read", "list", "gc", "compact", "export+import", "rename", "reopen", "store_open",
    "pressure",
};

typedef struct env {
    ctxs_store *st;         /* shared by the process's threads */
    const char *store_dir;
    const char *scratch;
    worker *all;            /* every worker of every process */
    int n_all;
    ctxs_model m;
    atomic_int *finished;   /* workers through their rounds */
    atomic_int *release;    /* set once nothing collects any more */
} env;

static ctxs_create_options own_opts(void)
{
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = OWN_CAPACITY;
    o.n_sink = 4;
    o.ring = 0;
    o.open.durability = CTXS_SYNC_ASYNC;
    return o;
}

static ctxs_create_options disp_opts(void)
{
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = 512;
    o.n_sink = 4;
    o.ring = 0;
    o.open.durability = CTXS_SYNC_NONE;
    return o;
}

/* Appends k tokens of a fresh generation to own, recording their ids. */
static int own_append(worker *w, ctxs_session *s, uint32_t k)
{
    uint32_t gen = ((uint32_t)w->wid << 20) | ++w->counter;
    uint64_t first = 0;
    int rc = ts_pat_append(s, k, gen, &first);
    if (rc != 0)
        return rc;
    if (first != w->n) {
        WFAIL(w, "%s: appended at %llu, acknowledged %llu", w->own, (unsigned long long)first,
              (unsigned long long)w->n);
        return CTXS_EINVAL;
    }
    for (uint32_t i = 0; i < k; i++)
        w->ids[w->n + i] = ts_pat_id(w->n + i, gen);
    w->n += k;
    w->acked_tokens += k;
    return 0;
}

static int cp_stale(const worker *w, const cp_rec *cp)
{
    return !(w->n >= cp->n && (cp->n == 0 || w->ids[cp->n - 1] == cp->last_id));
}

static disp_rec *disp_add(worker *w, const char *name, uint64_t n)
{
    if (w->n_disp == MAX_DISP)
        return NULL;
    disp_rec *d = &w->disp[w->n_disp++];
    snprintf(d->name, sizeof(d->name), "%s", name);
    d->n = n;
    d->state = DISP_LIVE;
    return d;
}

static disp_rec *disp_pick(worker *w, uint64_t r)
{
    int live = 0;
    for (int i = 0; i < w->n_disp; i++)
        live += w->disp[i].state == DISP_LIVE;
    if (!live)
        return NULL;
    int k = (int)(r % (uint64_t)live);
    for (int i = 0; i < w->n_disp; i++)
        if (w->disp[i].state == DISP_LIVE && k-- == 0)
            return &w->disp[i];
    return NULL;
}

/* A session of someone else (or one's own disposables), opened read-only
 * and checked as a reader checks: whole tokens, and verify. */
static void read_check(worker *w, ctxs_store *st, const char *name, uint64_t *rng)
{
    ctxs_session *s;
    int rc = ctxs_store_session_open(&s, st, name, NULL, CTXS_RDONLY, NULL);
    if (rc == CTXS_ENOTFOUND || rc == CTXS_EBUSY)
        return;
    if (rc != 0) {
        WFAIL(w, "read-only open of %s: %s", name, ctxs_err_name(rc));
        return;
    }
    unsigned k = 1 + (unsigned)(ts_rng_next(rng) % 4);
    for (unsigned i = 0; i < k; i++) {
        uint64_t n;
        uint32_t id;
        char why[512];
        rc = ts_pat_stable_check(s, i == 0, &n, &id, why, sizeof(why));
        if (rc < 0) {
            WFAIL(w, "reading %s: %s", name, why);
            break;
        }
        if (rc == 0)
            w->reader_void++;
        else
            w->reader_checks++;
    }
    ctxs_session_close(s);
}

/* A prefix of own's tokens, looked up: when found, the match must hold
 * those tokens (own is written only by this thread, and forks of it never
 * change, so what the file says now is what it said then). */
static void prefix_check(worker *w, ctxs_store *st, const ctxs_model *m)
{
    if (w->n < CTXS_PREFIX_CHUNK)
        return;
    ctxs_prefix_match pm;
    int rc = ctxs_prefix_find(&pm, st, m->model_hash, w->ids, w->n);
    if (rc == CTXS_ENOTFOUND) {
        w->prefix_missed++;
        return;
    }
    if (rc != 0) {
        WFAIL(w, "prefix_find: %s", ctxs_err_name(rc));
        return;
    }
    w->prefix_found++;
    if (pm.n_tokens < CTXS_PREFIX_CHUNK || pm.n_tokens > w->n) {
        WFAIL(w, "prefix_find of %llu tokens matched %llu", (unsigned long long)w->n,
              (unsigned long long)pm.n_tokens);
        return;
    }
    ctxs_session *s;
    rc = ctxs_store_session_open(&s, st, pm.session, NULL, CTXS_RDONLY, NULL);
    if (rc == CTXS_ENOTFOUND || rc == CTXS_EBUSY)
        return; /* deleted or collected since */
    if (rc != 0) {
        WFAIL(w, "the prefix match %s does not open: %s", pm.session, ctxs_err_name(rc));
        return;
    }
    ctxs_layout lay;
    ctxs_session_get_layout(&lay, s);
    for (uint64_t p = 0; p < pm.n_tokens; p++) {
        uint32_t slot;
        if (ctxs_session_get_slot(&slot, s, p) != 0 || lay.token_ids[slot] != w->ids[p]) {
            WFAIL(w, "prefix_find matched %llu tokens of %s, which differs at %llu",
                  (unsigned long long)pm.n_tokens, pm.session, (unsigned long long)p);
            break;
        }
    }
    ctxs_session_close(s);
}

/* One decode step of attention over the session's committed tokens, as an
 * engine does between commits (it reads the window, which memory pressure
 * changes from other threads). */
static int attend(ctxs_session *s)
{
    ctxs_attn_plan plan;
    ctxs_layout lay;
    int rc = ctxs_session_get_attn_plan(&plan, s, 0);
    if (rc == 0)
        rc = ctxs_session_get_layout(&lay, s);
    if (rc != 0)
        return rc;
    uint32_t heads = lay.geometry.n_kv_heads, dim = lay.geometry.head_dim;
    float q[64], out[64];
    if ((size_t)heads * dim > 64)
        return CTXS_EINVAL;
    for (uint32_t i = 0; i < heads * dim; i++)
        q[i] = (float)(i % 7) * 0.125f;
    ctxs_attn_query aq = {q, plan.n_tokens - 1, 1, heads, 0.0f};
    return ctxs_attention(out, &lay, &plan, lay.geometry.n_layers - 1, &aq);
}

static void worker_run(worker *w, const env *e)
{
    ctxs_store *st = e->st;
    uint64_t rng = w->seed;
    ctxs_create_options oo = own_opts(), dopt = disp_opts();
    ctxs_session *own;
    snprintf(w->own, sizeof(w->own), "P%d.%d", w->proc, w->thr);
    int rc = ctxs_store_session_create(&own, st, w->own, &e->m, &oo);
    if (rc != 0) {
        WFAIL(w, "create %s: %s", w->own, ctxs_err_name(rc));
        atomic_fetch_add(e->finished, 1);
        return;
    }
    char name[NAME_LEN], name2[NAME_LEN], path[4200];
    for (unsigned round = 0; round < w->rounds && w->failures == 0; round++) {
        uint64_t r = ts_rng_next(&rng), op = r % 100;
        int kind = op < 28   ? OP_APPEND
                   : op < 33 ? OP_ROLLBACK
                   : op < 38 ? OP_CP
                   : op < 42 ? OP_RESTORE
                   : op < 50 ? OP_CREATE
                   : op < 55 ? OP_DELETE
                   : op < 61 ? OP_FORK
                   : op < 67 ? OP_PREFIX
                   : op < 77 ? OP_READ
                   : op < 80 ? OP_LIST
                   : op < 82 ? OP_GC
                   : op < 85 ? OP_COMPACT
                   : op < 88 ? OP_EXPORT
                   : op < 91 ? OP_RENAME
                   : op < 94 ? OP_REOPEN
                   : op < 97 ? OP_STORE_OPEN
                             : OP_PRESSURE;
        w->ops[kind]++;
        switch (kind) {
        case OP_APPEND: {
            uint32_t k = 1 + (uint32_t)((r >> 8) % 120);
            if (w->n + k > MAX_N) {
                uint64_t t = (r >> 20) % (w->n + 1);
                if ((rc = ctxs_session_rollback(own, t)) != 0)
                    WFAIL(w, "rollback of %s to %llu: %s", w->own, (unsigned long long)t,
                          ctxs_err_name(rc));
                else
                    w->n = t;
                break;
            }
            if ((rc = own_append(w, own, k)) != 0) {
                WFAIL(w, "append to %s: %s", w->own, ctxs_err_name(rc));
                break;
            }
            if ((r >> 40) % 3 == 0 && (rc = attend(own)) != 0)
                WFAIL(w, "attention over %s: %s", w->own, ctxs_err_name(rc));
            break;
        }
        case OP_ROLLBACK: {
            if (w->n == 0)
                break;
            uint64_t t = w->n - 1 - (r >> 8) % (w->n < 60 ? w->n : 60);
            if ((rc = ctxs_session_rollback(own, t)) != 0)
                WFAIL(w, "rollback of %s to %llu: %s", w->own, (unsigned long long)t,
                      ctxs_err_name(rc));
            else
                w->n = t;
            break;
        }
        case OP_CP: {
            if (w->n == 0 || w->n_cp == MAX_CPS)
                break;
            snprintf(name, sizeof(name), "c%u", w->counter++);
            if ((rc = ctxs_checkpoint_create(own, name)) != 0) {
                WFAIL(w, "checkpoint %s of %s: %s", name, w->own, ctxs_err_name(rc));
                break;
            }
            cp_rec *cp = &w->cp[w->n_cp++];
            snprintf(cp->name, sizeof(cp->name), "%s", name);
            cp->n = w->n;
            cp->last_id = w->ids[w->n - 1];
            break;
        }
        case OP_RESTORE: {
            if (w->n_cp == 0)
                break;
            cp_rec *cp = &w->cp[(r >> 8) % (uint64_t)w->n_cp];
            int stale = cp_stale(w, cp);
            rc = ctxs_checkpoint_restore(own, cp->name);
            if (rc == 0 && !stale) {
                w->n = cp->n;
            } else if (rc == CTXS_ESTALE && stale) {
                w->restores_refused++;
            } else {
                WFAIL(w, "restore of %s to %s (%llu tokens of %llu, %s): %s", w->own, cp->name,
                      (unsigned long long)cp->n, (unsigned long long)w->n,
                      stale ? "stale" : "fresh", ctxs_err_name(rc));
            }
            if ((r >> 16) % 3 == 0) {
                /* Drop one now and then, so that there is room for more. */
                int k = (int)((r >> 24) % (uint64_t)w->n_cp);
                if ((rc = ts_checkpoint_delete(st, w->own, w->cp[k].name)) != 0)
                    WFAIL(w, "checkpoint_delete %s: %s", w->cp[k].name, ctxs_err_name(rc));
                w->cp[k] = w->cp[--w->n_cp];
            }
            break;
        }
        case OP_CREATE: {
            snprintf(name, sizeof(name), "d%d.%d.%u", w->proc, w->thr, w->counter++);
            ctxs_session *d;
            if ((rc = ctxs_store_session_create(&d, st, name, &e->m, &dopt)) != 0) {
                WFAIL(w, "create %s: %s", name, ctxs_err_name(rc));
                break;
            }
            uint32_t k = 1 + (uint32_t)((r >> 8) % 300);
            uint32_t gen = ((uint32_t)w->wid << 20) | w->counter++;
            if ((rc = ts_pat_append(d, k, gen, NULL)) != 0)
                WFAIL(w, "append to %s: %s", name, ctxs_err_name(rc));
            ctxs_session_close(d);
            disp_add(w, name, k);
            break;
        }
        case OP_DELETE: {
            disp_rec *d = disp_pick(w, r >> 8);
            if (!d)
                break;
            rc = ctxs_store_session_delete(st, d->name);
            if (rc == 0)
                d->state = DISP_DELETED;
            else if (rc == CTXS_ENOTFOUND)
                d->state = DISP_GONE; /* gc took it */
            else if (rc != CTXS_EBUSY)
                WFAIL(w, "delete %s: %s", d->name, ctxs_err_name(rc));
            break;
        }
        case OP_FORK: {
            const worker *o = &e->all[(r >> 8) % (uint64_t)e->n_all];
            snprintf(name, sizeof(name), "f%d.%d.%u", w->proc, w->thr, w->counter++);
            ctxs_session *f;
            char src[NAME_LEN];
            snprintf(src, sizeof(src), "P%d.%d", o->proc, o->thr);
            rc = ctxs_store_session_fork(&f, st, src, name, UINT64_MAX, &dopt.open);
            /* EBUSY: a compaction or a gc holds the source's exclusive
             * lock (undocumented for ctxs_store_session_fork). */
            if (rc == CTXS_ENOTFOUND || rc == CTXS_ESTALE || rc == CTXS_EBUSY) {
                w->fork_refused++;
                break;
            }
            if (rc != 0) {
                WFAIL(w, "fork %s from %s: %s", name, src, ctxs_err_name(rc));
                break;
            }
            ctxs_session_info info;
            uint64_t bad_pos = 0;
            ctxs_session_get_info(&info, f);
            uint64_t bad = ts_pat_check(f, &bad_pos);
            int vrc = ctxs_session_verify(NULL, f);
            if (bad || vrc)
                WFAIL(w, "fork %s of %s: %llu tokens wrong (first %llu), verify %s", name, src,
                      (unsigned long long)bad, (unsigned long long)bad_pos, ctxs_err_name(vrc));
            ctxs_session_close(f);
            disp_add(w, name, info.n_tokens);
            w->forks++;
            break;
        }
        case OP_PREFIX:
            prefix_check(w, st, &e->m);
            break;
        case OP_READ: {
            const worker *o = &e->all[(r >> 8) % (uint64_t)e->n_all];
            snprintf(name, sizeof(name), "P%d.%d", o->proc, o->thr);
            read_check(w, st, name, &rng);
            break;
        }
        case OP_LIST: {
            ctxs_session_entry *l;
            size_t n;
            if ((rc = ctxs_store_session_list(&l, &n, st)) != 0) {
                WFAIL(w, "list: %s", ctxs_err_name(rc));
                break;
            }
            int mine = 0;
            for (size_t i = 0; i < n; i++)
                mine += strcmp(l[i].name, w->own) == 0;
            ctxs_free(l);
            if (mine != 1)
                WFAIL(w, "list shows %s %d times", w->own, mine);
            ctxs_checkpoint_entry *cl;
            if ((rc = ts_checkpoint_list(&cl, &n, st, w->own)) != 0) {
                WFAIL(w, "checkpoint_list: %s", ctxs_err_name(rc));
                break;
            }
            if (n != (size_t)w->n_cp)
                WFAIL(w, "%s lists %zu checkpoints, %d made", w->own, n, w->n_cp);
            for (size_t i = 0; i < n; i++)
                for (int j = 0; j < w->n_cp; j++)
                    if (strcmp(cl[i].name, w->cp[j].name) == 0 &&
                        ((int)cl[i].stale != cp_stale(w, &w->cp[j]) || cl[i].n_tokens != w->cp[j].n))
                        WFAIL(w, "%s: checkpoint %s listed %s at %llu, made at %llu (%s)", w->own,
                              cl[i].name, cl[i].stale ? "stale" : "fresh",
                              (unsigned long long)cl[i].n_tokens, (unsigned long long)w->cp[j].n,
                              cp_stale(w, &w->cp[j]) ? "stale" : "fresh");
            ctxs_free(cl);
            break;
        }
        case OP_GC: {
            ctxs_store_gc_result g;
            uint64_t budget = (r >> 8) % (4u << 20);
            if ((rc = ctxs_store_gc(&g, st, budget, 0)) != 0) {
                WFAIL(w, "gc: %s", ctxs_err_name(rc));
                break;
            }
            w->gc_deleted += g.deleted;
            ctxs_free(g.sessions);
            ctxs_session_entry en;
            if ((rc = ctxs_store_session_get(&en, st, w->own)) != 0)
                WFAIL(w, "gc took %s, which is open: %s", w->own, ctxs_err_name(rc));
            break;
        }
        case OP_COMPACT: {
            disp_rec *d = disp_pick(w, r >> 8);
            rc = ctxs_store_compact(NULL, st, d ? d->name : w->own, NULL);
            if (rc == CTXS_ENOTFOUND && d)
                d->state = DISP_GONE;
            else if (rc != 0 && rc != CTXS_EBUSY)
                WFAIL(w, "compact %s: %s", d ? d->name : w->own, ctxs_err_name(rc));
            else if (!d && rc != CTXS_EBUSY)
                WFAIL(w, "compact of %s, which is open, returned %s", w->own, ctxs_err_name(rc));
            break;
        }
        case OP_EXPORT: {
            disp_rec *d = disp_pick(w, r >> 8);
            if (!d)
                break;
            snprintf(path, sizeof(path), "%s/x%d.%d.%u.ctxx", e->scratch, w->proc, w->thr,
                     w->counter++);
            rc = ctxs_store_session_export(st, d->name, path, NULL);
            if (rc == CTXS_ENOTFOUND) {
                d->state = DISP_GONE;
                break;
            }
            if (rc == CTXS_EBUSY) /* a compaction or gc has it (undocumented) */
                break;
            if (rc != 0) {
                WFAIL(w, "export %s: %s", d->name, ctxs_err_name(rc));
                break;
            }
            uint64_t n = d->n;
            snprintf(name, sizeof(name), "i%d.%d.%u", w->proc, w->thr, w->counter++);
            char got[256];
            if ((rc = ctxs_store_session_import(got, st, path, name, NULL)) != 0) {
                WFAIL(w, "import %s as %s: %s", path, name, ctxs_err_name(rc));
            } else
                disp_add(w, name, n);
            unlink(path);
            break;
        }
        case OP_RENAME: {
            disp_rec *d = disp_pick(w, r >> 8);
            if (!d)
                break;
            snprintf(name2, sizeof(name2), "r%d.%d.%u", w->proc, w->thr, w->counter++);
            rc = ctxs_store_session_rename(st, d->name, name2);
            if (rc == CTXS_ENOTFOUND)
                d->state = DISP_GONE;
            else if (rc != 0)
                WFAIL(w, "rename %s: %s", d->name, ctxs_err_name(rc));
            else
                snprintf(d->name, sizeof(d->name), "%s", name2);
            break;
        }
        case OP_REOPEN: {
            /* A read-only handle keeps gc off it while it is closed. */
            ctxs_session *guard;
            if ((rc = ctxs_store_session_open(&guard, st, w->own, NULL, CTXS_RDONLY,
                                              NULL)) != 0) {
                WFAIL(w, "read-only open of %s: %s", w->own, ctxs_err_name(rc));
                break;
            }
            ctxs_session_close(own);
            own = NULL;
            w->own_reopens++;
            rc = ctxs_store_session_open(&own, st, w->own, &e->m, 0, &oo.open);
            ctxs_session_close(guard);
            if (rc != 0) {
                WFAIL(w, "reopen %s: %s", w->own, ctxs_err_name(rc));
                atomic_fetch_add(e->finished, 1);
                return;
            }
            ctxs_session_info info;
            ctxs_session_get_info(&info, own);
            if (info.n_tokens != w->n)
                WFAIL(w, "%s reopened with %llu tokens, acknowledged %llu", w->own,
                      (unsigned long long)info.n_tokens, (unsigned long long)w->n);
            break;
        }
        case OP_PRESSURE:
            /* Documented as callable from any thread: it changes the
             * windows of every open session, other threads' included.
             * CTXS_CONCURRENCY_NO_PRESSURE=1 leaves it out (to look for
             * other races under TSan while this one stands: see
             * pressure_set_races_with_commits_in_other_threads). */
            if (!getenv("CTXS_CONCURRENCY_NO_PRESSURE"))
                ctxs_set_pressure((int)((r >> 8) & 1));
            break;
        case OP_STORE_OPEN: {
            /* Another handle of the store, in this process, opened and
             * closed while the others work. */
            ctxs_store *st2;
            if ((rc = ctxs_store_open(&st2, e->store_dir, CTXS_STORE_CREATE, NULL)) != 0) {
                WFAIL(w, "second store open: %s", ctxs_err_name(rc));
                break;
            }
            ctxs_session_entry en;
            if ((rc = ctxs_store_session_get(&en, st2, w->own)) != 0)
                WFAIL(w, "%s through a second handle: %s", w->own, ctxs_err_name(rc));
            ctxs_store_close(st2);
            break;
        }
        }
    }
    /* Own stays open (gc must not take it) until nothing collects. */
    atomic_fetch_add(e->finished, 1);
    while (!atomic_load(e->release))
        ts_sleep_us(1000);
    ctxs_session_close(own);
}

/* The maintenance thread: its own handle (compacting the whole store wants
 * one that no other thread uses), repair, gc, compaction. */
typedef struct maint_args {
    maint *m;
    const char *store_dir;
    atomic_int *stop;
} maint_args;

static void maint_run(maint_args *a)
{
    maint *m = a->m;
    uint64_t rng = m->seed;
    ctxs_store *st;
    int rc = ctxs_store_open(&st, a->store_dir, CTXS_STORE_CREATE, NULL);
    if (rc != 0) {
        w_fail(&m->failures, m->failure, sizeof(m->failure), "maintenance store open: %s",
               ctxs_err_name(rc));
        return;
    }
    /* The pressure watcher's thread runs meanwhile, polling often. */
    ctxs_watcher_options wo = CTXS_WATCHER_OPTIONS_INIT;
    wo.poll_ms = 5;
    int watching = ctxs_watcher_start(&wo) == 0;
    for (unsigned i = 0; i < m->rounds && !atomic_load(a->stop); i++) {
        uint64_t r = ts_rng_next(&rng);
        switch (r % 4) {
        case 0: {
            ctxs_store_repair_result rr;
            if ((rc = ctxs_store_repair(&rr, st)) != 0)
                w_fail(&m->failures, m->failure, sizeof(m->failure), "repair: %s",
                       ctxs_err_name(rc));
            else if (rr.files_adopted)
                w_fail(&m->failures, m->failure, sizeof(m->failure),
                       "repair in a live store adopted %llu files: it took creates in progress "
                       "for leftovers", (unsigned long long)rr.files_adopted);
            /* Nothing dies here, so whatever repair removes was a create's
             * file written aside, still open. */
            if (rc == 0 && rr.files_removed)
                w_fail(&m->failures, m->failure, sizeof(m->failure),
                       "repair in a live store removed %llu files written aside by creates in "
                       "progress", (unsigned long long)rr.files_removed);
            /* entries_removed also counts entries that a delete running at
             * the same time removed itself (drop_dangling() commits and
             * counts when session_unindex() finds nothing): reported, not
             * judged; a live entry wrongly dropped would show as a missing
             * session at the end. */
            if (rc == 0)
                m->entries_removed += rr.entries_removed;
            m->repairs++;
            break;
        }
        case 1: {
            ctxs_store_compact_result cr;
            if ((rc = ctxs_store_compact(&cr, st, NULL, NULL)) != 0)
                w_fail(&m->failures, m->failure, sizeof(m->failure), "compact: %s",
                       ctxs_err_name(rc));
            m->compacts++;
            break;
        }
        case 2: {
            ctxs_store_gc_result g;
            if ((rc = ctxs_store_gc(&g, st, (r >> 8) % (6u << 20), 0)) != 0)
                w_fail(&m->failures, m->failure, sizeof(m->failure), "gc: %s",
                       ctxs_err_name(rc));
            else
                m->gc_deleted += g.deleted;
            ctxs_free(g.sessions);
            m->gcs++;
            break;
        }
        default:
            ctxs_store_close(st);
            if ((rc = ctxs_store_open(&st, a->store_dir, CTXS_STORE_CREATE, NULL)) != 0) {
                w_fail(&m->failures, m->failure, sizeof(m->failure), "store reopen: %s",
                       ctxs_err_name(rc));
                return;
            }
            m->reopens++;
            break;
        }
        ts_sleep_us((r >> 16) % 3000);
    }
    if (watching)
        ctxs_watcher_stop();
    ctxs_set_pressure(0);
    ctxs_store_close(st);
}

/* --- Checking the store afterwards ---------------------------------------------- */

static const disp_rec *find_disp(const worker *all, int n_all, const char *name)
{
    for (int i = 0; i < n_all; i++)
        for (int j = 0; j < all[i].n_disp; j++)
            if (strcmp(all[i].disp[j].name, name) == 0)
                return &all[i].disp[j];
    return NULL;
}

typedef struct final_counts {
    size_t sessions, owned_tokens, disposables_present, disposables_gone;
} final_counts;

static final_counts check_store(const char *store_dir, const worker *all, int n_all,
                                const ctxs_model *m)
{
    final_counts fc = {0};
    ctxs_store *st;
    cr_assert_eq(ctxs_store_open(&st, store_dir, CTXS_STORE_CREATE, NULL), 0);
    cr_assert_eq(ts_pending_intents(st), 0, "intents left after every worker finished");
    ctxs_session_entry *l;
    size_t n;
    cr_assert_eq(ctxs_store_session_list(&l, &n, st), 0);
    fc.sessions = n;

    /* Files and entries agree: nothing half created, nothing leaked. */
    DIR *d = opendir(ts_path(store_dir, "sessions"));
    cr_assert_not_null(d);
    size_t files = 0;
    for (struct dirent *de; (de = readdir(d));) {
        if (de->d_name[0] == '.')
            continue;
        files++;
        char *end;
        uint64_t id = strtoull(de->d_name, &end, 16);
        int found = 0;
        for (size_t i = 0; i < n && !found; i++)
            found = l[i].id == id;
        cr_assert(found && strcmp(end, ".ctxs") == 0,
                  "sessions/%s belongs to no entry (half created, or an orphan gc left)",
                  de->d_name);
    }
    closedir(d);
    cr_assert_eq(files, n, "%zu files, %zu entries", files, n);

    for (size_t i = 0; i < n; i++) {
        const char *name = l[i].name;
        const worker *owner = NULL;
        for (int k = 0; k < n_all && !owner; k++)
            if (strcmp(all[k].own, name) == 0)
                owner = &all[k];
        const disp_rec *dr = owner ? NULL : find_disp(all, n_all, name);
        cr_assert(owner || dr, "the store lists %s, which no worker made", name);
        if (dr)
            cr_assert_eq(dr->state, DISP_LIVE, "%s was deleted (acknowledged), yet listed", name);
        ctxs_session *s;
        int rc = ctxs_store_session_open(&s, st, name, m, CTXS_OPEN_VERIFY, NULL);
        cr_assert_eq(rc, 0, "%s does not open: %s", name, ctxs_err_name(rc));
        ctxs_session_info info;
        cr_assert_eq(ctxs_session_get_info(&info, s), 0);
        uint64_t bad_pos = 0;
        cr_assert_eq(ctxs_session_verify(&bad_pos, s), 0, "%s does not verify (at %llu)", name,
                     (unsigned long long)bad_pos);
        cr_assert_eq(ts_pat_check(s, &bad_pos), 0, "%s: tokens read back wrong from %llu", name,
                     (unsigned long long)bad_pos);
        if (dr) {
            cr_assert_eq(info.n_tokens, dr->n, "%s holds %llu tokens, made with %llu", name,
                         (unsigned long long)info.n_tokens, (unsigned long long)dr->n);
            fc.disposables_present++;
        } else {
            cr_assert_eq(info.n_tokens, owner->n, "%s holds %llu tokens, %llu acknowledged",
                         name, (unsigned long long)info.n_tokens, (unsigned long long)owner->n);
            ctxs_layout lay;
            cr_assert_eq(ctxs_session_get_layout(&lay, s), 0);
            for (uint64_t p = 0; p < owner->n; p++) {
                uint32_t slot;
                cr_assert_eq(ctxs_session_get_slot(&slot, s, p), 0);
                cr_assert_eq(lay.token_ids[slot], owner->ids[p], "%s: token %llu is not the "
                             "acknowledged one", name, (unsigned long long)p);
            }
            fc.owned_tokens += owner->n;
            ctxs_checkpoint_entry *cl;
            size_t ncl;
            cr_assert_eq(ts_checkpoint_list(&cl, &ncl, st, name), 0);
            cr_assert_eq(ncl, (size_t)owner->n_cp, "%s: %zu checkpoints, %d made", name, ncl,
                         owner->n_cp);
            for (size_t c = 0; c < ncl; c++) {
                int found = 0;
                for (int j = 0; j < owner->n_cp; j++)
                    if (strcmp(cl[c].name, owner->cp[j].name) == 0) {
                        found = 1;
                        cr_assert_eq(cl[c].n_tokens, owner->cp[j].n);
                        cr_assert_eq((int)cl[c].stale, cp_stale(owner, &owner->cp[j]),
                                     "%s: checkpoint %s stale %u", name, cl[c].name,
                                     cl[c].stale);
                    }
                cr_assert(found, "%s: checkpoint %s nobody made", name, cl[c].name);
            }
            ctxs_free(cl);
        }
        ctxs_session_close(s);
    }
    /* Every owned session is there; every disposable is there, or was
     * deleted by its owner, or taken by a gc. */
    for (int k = 0; k < n_all; k++) {
        const worker *w = &all[k];
        int found = 0;
        for (size_t i = 0; i < n && !found; i++)
            found = strcmp(l[i].name, w->own) == 0;
        cr_assert(found, "%s (%llu tokens acknowledged) is gone", w->own,
                  (unsigned long long)w->n);
        for (int j = 0; j < w->n_disp; j++) {
            found = 0;
            for (size_t i = 0; i < n && !found; i++)
                found = strcmp(l[i].name, w->disp[j].name) == 0;
            fc.disposables_gone += !found;
        }
        /* Prefixes: everything is closed, so every whole chunk of an owned
         * session is indexed. */
        if (w->n >= CTXS_PREFIX_CHUNK) {
            ctxs_prefix_match pm;
            int rc = ctxs_prefix_find(&pm, st, m->model_hash, w->ids, w->n);
            cr_assert_eq(rc, 0, "prefix_find(%s): %s", w->own, ctxs_err_name(rc));
            cr_assert_geq(pm.n_tokens, w->n / CTXS_PREFIX_CHUNK * CTXS_PREFIX_CHUNK,
                          "prefix_find(%s, %llu tokens) matched %llu in %s", w->own,
                          (unsigned long long)w->n, (unsigned long long)pm.n_tokens, pm.session);
            ctxs_session *s;
            cr_assert_eq(ctxs_store_session_open(&s, st, pm.session, NULL, CTXS_RDONLY, NULL),
                         0);
            ctxs_layout lay;
            cr_assert_eq(ctxs_session_get_layout(&lay, s), 0);
            for (uint64_t p = 0; p < pm.n_tokens; p++) {
                uint32_t slot;
                cr_assert_eq(ctxs_session_get_slot(&slot, s, p), 0);
                cr_assert_eq(lay.token_ids[slot], w->ids[p], "prefix match %s of %s differs at "
                             "%llu", pm.session, w->own, (unsigned long long)p);
            }
            ctxs_session_close(s);
        }
    }
    ctxs_free(l);
    ctxs_store_repair_result rr;
    cr_assert_eq(ctxs_store_repair(&rr, st), 0);
    cr_assert(rr.files_adopted == 0 && rr.files_removed == 0 && rr.entries_removed == 0,
              "repair afterwards: %llu adopted, %llu removed, %llu entries removed",
              (unsigned long long)rr.files_adopted, (unsigned long long)rr.files_removed,
              (unsigned long long)rr.entries_removed);
    ctxs_store_close(st);
    return fc;
}

static void setup_store(const char *store_dir, const ctxs_model *m)
{
    ctxs_store *st;
    cr_assert_eq(ctxs_store_open(&st, store_dir, CTXS_STORE_CREATE, NULL), 0);
    cr_assert_eq(ctxs_model_register(st, m, "concurrency"), 0);
    ctxs_store_close(st);
}

static void report(const char *test, const worker *all, int n_all, const maint *mt, int n_maint,
                   final_counts fc, double secs)
{
    uint64_t ops[OP_N] = {0}, acked = 0, checks = 0, voids = 0, pf = 0, pm = 0, forks = 0,
             fref = 0, gcd = 0, refused = 0, failures = 0;
    for (int i = 0; i < n_all; i++) {
        const worker *w = &all[i];
        for (int k = 0; k < OP_N; k++)
            ops[k] += w->ops[k];
        acked += w->acked_tokens;
        checks += w->reader_checks;
        voids += w->reader_void;
        pf += w->prefix_found;
        pm += w->prefix_missed;
        forks += w->forks;
        fref += w->fork_refused;
        gcd += w->gc_deleted;
        refused += w->restores_refused;
        failures += w->failures;
        if (w->failures)
            say("  worker %s: %llu failures, the first: %s", w->own,
                (unsigned long long)w->failures, w->failure);
    }
    for (int i = 0; i < n_maint; i++) {
        gcd += mt[i].gc_deleted;
        failures += mt[i].failures;
        if (mt[i].failures)
            say("  maintenance: %llu failures, the first: %s", (unsigned long long)mt[i].failures,
                mt[i].failure);
    }
    char line[1024];
    size_t len = 0;
    for (int k = 0; k < OP_N; k++)
        len += (size_t)snprintf(line + len, sizeof(line) - len, " %s %llu", op_names[k],
                                (unsigned long long)ops[k]);
    say("%s: %d workers; %llu tokens acknowledged, %zu held by the owned sessions at the end, "
        "all there; %llu reader checks (%llu void); %llu prefix lookups found, %llu missed; "
        "%llu forks (%llu refused); %llu sessions taken by gc; %llu stale restores refused; "
        "maintenance: %llu repairs (entries_removed %llu), %llu compactions, %llu gcs; %zu "
        "sessions at the end "
        "(%zu disposables, %zu disposables gone); %llu failures; %.1f s",
        test, n_all, (unsigned long long)acked, fc.owned_tokens, (unsigned long long)checks,
        (unsigned long long)voids, (unsigned long long)pf, (unsigned long long)pm,
        (unsigned long long)forks, (unsigned long long)fref, (unsigned long long)gcd,
        (unsigned long long)refused, (unsigned long long)(n_maint ? mt[0].repairs : 0),
        (unsigned long long)(n_maint ? mt[0].entries_removed : 0),
        (unsigned long long)(n_maint ? mt[0].compacts : 0),
        (unsigned long long)(n_maint ? mt[0].gcs : 0), fc.sessions, fc.disposables_present,
        fc.disposables_gone, (unsigned long long)failures, secs);
    say("  calls:%s", line);
}

static int workers_ok(const worker *all, int n, const maint *mt)
{
    int ok = mt->failures == 0;
    for (int i = 0; i < n; i++)
        ok &= all[i].failures == 0;
    return ok;
}

/* --- Threads in one process -------------------------------------------------------- */

typedef struct thread_args {
    worker *w;
    const env *e;
} thread_args;

static void *worker_thread(void *p)
{
    thread_args *a = p;
    worker_run(a->w, a->e);
    return NULL;
}

static void *maint_thread(void *p)
{
    maint_run(p);
    return NULL;
}

#define THREADS 4

Test(concurrency, threads_share_one_store, .timeout = 3600)
{
    const char *test = "threads";
    uint64_t seed = ts_seed(test);
    uint64_t t0 = ts_now_us();
    char store_dir[4096];
    snprintf(store_dir, sizeof(store_dir), "%s/store", ts_scratch);
    ctxs_model m = ts_model(MODEL_SEED);
    setup_store(store_dir, &m);
    worker *all = calloc(THREADS, sizeof(*all));
    cr_assert_not_null(all);
    atomic_int finished = 0, release = 0;
    env e = {NULL, store_dir, ts_scratch, all, THREADS, m, &finished, &release};
    cr_assert_eq(ctxs_store_open(&e.st, store_dir, CTXS_STORE_CREATE, NULL), 0);
    unsigned n_rounds = rounds(60);
    for (int i = 0; i < THREADS; i++) {
        all[i].proc = 0;
        all[i].thr = i;
        all[i].wid = i + 1;
        all[i].rounds = n_rounds;
        all[i].seed = seed + (uint64_t)i * 0x9e3779b9u;
    }
    maint mt;
    memset(&mt, 0, sizeof(mt));
    mt.rounds = n_rounds;
    mt.seed = seed ^ 0x5555u;
    atomic_int stop = 0;
    maint_args ma = {&mt, store_dir, &stop};
    pthread_t th[THREADS], mth;
    thread_args ta[THREADS];
    for (int i = 0; i < THREADS; i++) {
        ta[i] = (thread_args){&all[i], &e};
        cr_assert_eq(pthread_create(&th[i], NULL, worker_thread, &ta[i]), 0);
    }
    cr_assert_eq(pthread_create(&mth, NULL, maint_thread, &ma), 0);
    while (atomic_load(&finished) < THREADS)
        ts_sleep_us(1000);
    atomic_store(&stop, 1);
    pthread_join(mth, NULL);
    atomic_store(&release, 1);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    ctxs_store_close(e.st);
    final_counts none = {0};
    if (!workers_ok(all, THREADS, &mt))
        report(test, all, THREADS, &mt, 1, none, (ts_now_us() - t0) / 1e6);
    for (int i = 0; i < THREADS; i++)
        cr_assert_eq(all[i].failures, 0, "worker %d: %s", i, all[i].failure);
    cr_assert_eq(mt.failures, 0, "maintenance: %s", mt.failure);
    final_counts fc = check_store(store_dir, all, THREADS, &m);
    report(test, all, THREADS, &mt, 1, fc, (ts_now_us() - t0) / 1e6);
    free(all);
}

/* --- Processes, each with threads ---------------------------------------------------- */

#define PROCS 3
#define PROC_THREADS 3

typedef struct shared {
    worker w[PROCS * PROC_THREADS];
    maint mt;
    atomic_int stop, finished, release;
} shared;

static void proc_main(shared *sh, int proc, const char *store_dir, const char *scratch)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    env e = {NULL, store_dir, scratch, sh->w, PROCS * PROC_THREADS, ts_model(MODEL_SEED),
             &sh->finished, &sh->release};
    int rc = ctxs_store_open(&e.st, store_dir, CTXS_STORE_CREATE, NULL);
    if (rc != 0) {
        fprintf(stderr, "process %d: store open: %s\n", proc, ctxs_err_name(rc));
        _exit(10);
    }
    pthread_t th[PROC_THREADS], mth;
    thread_args ta[PROC_THREADS];
    maint_args ma = {&sh->mt, store_dir, &sh->stop};
    for (int i = 0; i < PROC_THREADS; i++) {
        ta[i] = (thread_args){&sh->w[proc * PROC_THREADS + i], &e};
        if (pthread_create(&th[i], NULL, worker_thread, &ta[i]) != 0)
            _exit(11);
    }
    if (proc == 0 && pthread_create(&mth, NULL, maint_thread, &ma) != 0)
        _exit(11);
    if (proc == 0) {
        /* Maintenance goes on until every worker of every process is
         * through its rounds; then they may close what they own. */
        while (atomic_load(&sh->finished) < PROCS * PROC_THREADS)
            ts_sleep_us(2000);
        atomic_store(&sh->stop, 1);
        pthread_join(mth, NULL);
        atomic_store(&sh->release, 1);
    }
    for (int i = 0; i < PROC_THREADS; i++)
        pthread_join(th[i], NULL);
    ctxs_store_close(e.st);
    _exit(0);
}

Test(concurrency, processes_with_threads_share_one_store, .timeout = 3600)
{
    const char *test = "processes";
    uint64_t seed = ts_seed(test);
    uint64_t t0 = ts_now_us();
    char store_dir[4096];
    snprintf(store_dir, sizeof(store_dir), "%s/store", ts_scratch);
    ctxs_model m = ts_model(MODEL_SEED);
    setup_store(store_dir, &m);
    shared *sh = mmap(NULL, sizeof(shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                      -1, 0);
    cr_assert_neq(sh, MAP_FAILED);
    memset(sh, 0, sizeof(*sh));
    unsigned n_rounds = rounds(40);
    for (int p = 0; p < PROCS; p++)
        for (int t = 0; t < PROC_THREADS; t++) {
            worker *w = &sh->w[p * PROC_THREADS + t];
            w->proc = p;
            w->thr = t;
            w->wid = p * PROC_THREADS + t + 1;
            w->rounds = n_rounds;
            w->seed = seed + (uint64_t)w->wid * 0x9e3779b9u;
            snprintf(w->own, sizeof(w->own), "P%d.%d", p, t);
        }
    sh->mt.rounds = UINT32_MAX;
    sh->mt.seed = seed ^ 0x5555u;
    pid_t pids[PROCS];
    for (int p = 0; p < PROCS; p++) {
        fflush(NULL);
        pids[p] = fork();
        cr_assert_neq(pids[p], -1);
        if (pids[p] == 0)
            proc_main(sh, p, store_dir, ts_scratch);
    }
    for (int p = 0; p < PROCS; p++) {
        int status;
        cr_assert_eq(waitpid(pids[p], &status, 0), pids[p]);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "process %d ended with status %#x", p, status);
    }
    int n_all = PROCS * PROC_THREADS;
    final_counts none = {0};
    if (!workers_ok(sh->w, n_all, &sh->mt))
        report(test, sh->w, n_all, &sh->mt, 1, none, (ts_now_us() - t0) / 1e6);
    for (int i = 0; i < n_all; i++)
        cr_assert_eq(sh->w[i].failures, 0, "worker %s: %s", sh->w[i].own, sh->w[i].failure);
    cr_assert_eq(sh->mt.failures, 0, "maintenance: %s", sh->mt.failure);
    final_counts fc = check_store(store_dir, sh->w, n_all, &m);
    report(test, sh->w, n_all, &sh->mt, 1, fc, (ts_now_us() - t0) / 1e6);
    munmap(sh, sizeof(shared));
}

/* --- A minimal reproducer for ThreadSanitizer ------------------------------------
 *
 * ctxs_set_pressure() "may run on any thread": it walks every open session
 * and reads its committed state (window.c, release_outside_window() via
 * window_spans()) under the registry mutex, while each session's own thread
 * commits and rolls back (commit.c, ctxs__record_write(): s->st = *next)
 * without it. Nothing to assert in a plain build; under -Db_sanitize=thread
 * (concurrency_tsan) ThreadSanitizer reports the race. */

typedef struct churn {
    ctxs_session *s;
    atomic_int stop;
    int rc;
} churn;

static void *commit_churn(void *p)
{
    churn *c = p;
    for (uint32_t i = 0; !atomic_load(&c->stop) && c->rc == 0; i++) {
        c->rc = ts_pat_append(c->s, 8, i + 1, NULL);
        if (c->rc == 0 && i % 4 == 3)
            c->rc = ctxs_session_rollback(c->s, 0);
    }
    return NULL;
}

Test(concurrency, pressure_set_races_with_commits_in_other_threads)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/p.ctxs", ts_scratch);
    ctxs_model m = ts_model(MODEL_SEED);
    ctxs_create_options o = disp_opts();
    churn c = {NULL, 0, 0};
    cr_assert_eq(ctxs_session_create(&c.s, path, &m, &o), 0);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, commit_churn, &c), 0);
    for (int i = 0; i < 2000; i++)
        ctxs_set_pressure(i & 1);
    atomic_store(&c.stop, 1);
    pthread_join(th, NULL);
    ctxs_set_pressure(0);
    cr_assert_eq(c.rc, 0, "commit: %s", ctxs_err_name(c.rc));
    ctxs_session_close(c.s);
}
