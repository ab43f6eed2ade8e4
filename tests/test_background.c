/*
 * The background worker (src/store/background.c): the bring-in after an
 * open, the runway after a commit and ASYNC writeback never change a
 * result, bring in no more than the window, live exactly as long as a
 * session that uses them, and leave a forked child and a killed writer
 * with everything they had.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "support.h"

TestSuite(background, .init = ts_scratch_init, .fini = ts_scratch_fini, .timeout = 300);

/* Large enough that a window spans many pages of every run: 4 layers x
 * 4 KV heads x 64 dims, fp16 = 128 bytes a slot, 4 KiB a token. */
static ctxs_model big_model(void)
{
    ctxs_model m = ts_model(7);
    m.geometry = (ctxs_geometry){4, 4, 64, CTXS_DTYPE_F16, 0, {0}};
    return m;
}

/* The threads of this process that are ctxstore's worker (by name, so that
 * a sanitizer's own threads do not count), and in *tid one's thread id. */
static int worker_threads(pid_t *tid)
{
    DIR *d = opendir("/proc/self/task");
    cr_assert_not_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char path[300], name[32] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (f && fgets(name, sizeof name, f) &&
            strncmp(name, CTXS__WORKER_NAME "\n", sizeof CTXS__WORKER_NAME) == 0) {
            n++;
            if (tid)
                *tid = (pid_t)atol(e->d_name);
        }
        if (f)
            fclose(f);
    }
    closedir(d);
    return n;
}

static int thread_count(void)
{
    return worker_threads(NULL);
}

/* thread_count() once it has settled: a joined thread's task can stay in
 * /proc for a moment after pthread_join() returns (the kernel wakes the
 * joiner before it reaps the task). Gives up after two seconds. */
static int settled_thread_count(int want)
{
    int n = thread_count();
    for (int i = 0; i < 2000 && n != want; i++) {
        ts_sleep_us(1000);
        n = thread_count();
    }
    return n;
}

static ctxs_create_options options(uint32_t capacity, uint32_t background)
{
    ctxs_create_options o = ts_options(capacity, 4, 1, CTXS_SYNC_ASYNC);
    o.open.background = background;
    return o;
}

/* Appends n tokens in turns of 1 to max_turn tokens (a seeded draw). */
static void append_turns(ctxs_session *s, uint64_t n, uint32_t max_turn, uint64_t *rng)
{
    while (n) {
        uint32_t k = 1 + (uint32_t)(ts_rng_next(rng) % max_turn);
        k = k > n ? (uint32_t)n : k;
        int rc = ts_append(s, k);
        cr_assert_eq(rc, 0, "append %u: %s", k, ctxs_err_name(rc));
        n -= k;
    }
}

/* Attention of every layer for one query at the last position, into out
 * ([layers][n_heads][head_dim]); queries from a fixed seed. */
static void attend_last(float *out, ctxs_session *s)
{
    ctxs_layout lay;
    ctxs_attn_plan plan;
    cr_assert_eq(ctxs_session_get_layout(&lay, s), 0);
    cr_assert_eq(ctxs_session_get_attn_plan(&plan, s, 0), 0);
    const uint32_t n_heads = 2 * lay.geometry.n_kv_heads, hd = lay.geometry.head_dim;
    float *q = malloc((size_t)n_heads * hd * sizeof(float));
    uint64_t rng = 42;
    for (uint32_t i = 0; i < n_heads * hd; i++)
        q[i] = (float)(ts_rng_next(&rng) % 2001) / 1000.0f - 1.0f;
    ctxs_attn_query aq = {.q = q, .pos = plan.n_tokens - 1, .n = 1, .n_heads = n_heads};
    for (uint32_t l = 0; l < lay.geometry.n_layers; l++)
        cr_assert_eq(ctxs_attention(out + (size_t)l * n_heads * hd, &lay, &plan, l, &aq), 0);
    free(q);
}

Test(background, lives_while_a_session_uses_it_and_is_joined_by_the_last_close)
{
    ctxs_model m = big_model();
    ctxs_create_options on = options(512, 1), off = options(512, 0);
    const int base = thread_count();
    cr_assert_eq(base, 0);

    ctxs_session *a, *b, *c;
    cr_assert_eq(ctxs_session_create(&c, ts_path(ts_scratch, "off.ctxs"), &m, &off), 0);
    cr_assert_eq(ts_append(c, 100), 0);
    cr_assert_eq(thread_count(), base, "a session without background started a thread");

    cr_assert_eq(ctxs_session_create(&a, ts_path(ts_scratch, "a.ctxs"), &m, &on), 0);
    cr_assert_eq(ts_append(a, 100), 0);
    cr_assert_eq(thread_count(), base + 1, "the worker does not run after a commit");
    cr_assert_eq(ctxs_session_open(&b, ts_path(ts_scratch, "a.ctxs"), NULL, CTXS_RDONLY, &on.open), 0);
    cr_assert_eq(thread_count(), base + 1, "a second session started a second worker");
    ctxs_session_close(a);
    cr_assert_eq(thread_count(), base + 1, "the worker stopped while a session used it");
    ctxs_session_close(b);
    cr_assert_eq(settled_thread_count(base), base, "the worker outlived the last session");
    ctxs_session_close(c);

    /* And it comes back for the next session. */
    cr_assert_eq(ctxs_session_open(&a, ts_path(ts_scratch, "a.ctxs"), &m, 0, &on.open), 0);
    cr_assert_eq(thread_count(), base + 1);
    ctxs_session_close(a);
    cr_assert_eq(settled_thread_count(base), base);
}

/* Woken after a commit, the worker must not take the committing thread's
 * core from it: it runs as a batch thread, which a wake-up never lets
 * preempt another. */
Test(background, runs_as_a_batch_thread)
{
#ifndef SCHED_BATCH
    cr_skip_test("no SCHED_BATCH on this system");
#else
    ctxs_model m = big_model();
    ctxs_create_options on = options(512, 1);
    ctxs_session *s;
    cr_assert_eq(ctxs_session_create(&s, ts_path(ts_scratch, "a.ctxs"), &m, &on), 0);
    cr_assert_eq(ts_append(s, 100), 0);
    ctxs__background_wait_idle(); /* it has run */
    pid_t tid = 0;
    cr_assert_eq(worker_threads(&tid), 1);
    cr_expect_eq(sched_getscheduler(tid), SCHED_BATCH, "the worker's policy is %d",
                 sched_getscheduler(tid));
    ctxs_session_close(s);
#endif
}

/* Two sessions given the same turns, one with the background work and one
 * without, through ring wraps and a rollback: same tokens, same bytes,
 * same attention, and both verify. */
Test(background, never_changes_a_result)
{
    ctxs_model m = big_model();
    ctxs_create_options on = options(1024, 1), off = options(1024, 0);
    ctxs_session *a, *b;
    cr_assert_eq(ctxs_session_create(&a, ts_path(ts_scratch, "a.ctxs"), &m, &on), 0);
    cr_assert_eq(ctxs_session_create(&b, ts_path(ts_scratch, "b.ctxs"), &m, &off), 0);
    uint64_t seed = ts_seed("never_changes_a_result"), ra = seed, rb = seed;
    append_turns(a, 1500, 200, &ra);
    append_turns(b, 1500, 200, &rb);
    cr_assert_eq(ctxs_session_rollback(a, 1300), 0);
    cr_assert_eq(ctxs_session_rollback(b, 1300), 0);
    append_turns(a, 1900, 300, &ra); /* past two capacities: the ring wraps */
    append_turns(b, 1900, 300, &rb);

    ctxs_session_info ia, ib;
    cr_assert_eq(ctxs_session_get_info(&ia, a), 0);
    cr_assert_eq(ctxs_session_get_info(&ib, b), 0);
    cr_assert_eq(ia.n_tokens, ib.n_tokens);
    cr_assert_eq(ia.ring_start, ib.ring_start);
    cr_assert(ia.flags & CTXS_INFO_WRAPPED);
    cr_assert_eq(ts_check_all(a), 0, "wrong K/V with the background");
    cr_assert_eq(ts_check_all(b), 0);
    uint64_t bad = 0;
    cr_assert_eq(ctxs_session_verify(&bad, a), 0, "token %lu fails", (unsigned long)bad);

    const size_t floats = 4 * 8 * 64;
    float *oa = calloc(floats, sizeof(float)), *ob = calloc(floats, sizeof(float));
    attend_last(oa, a);
    attend_last(ob, b);
    cr_assert_eq(memcmp(oa, ob, floats * sizeof(float)), 0);

    /* Reopened, attention at once, while the bring-in runs beside it. */
    ctxs_session_close(a);
    cr_assert_eq(ctxs_session_open(&a, ts_path(ts_scratch, "a.ctxs"), &m, CTXS_OPEN_VERIFY, &on.open),
                 0);
    memset(oa, 0, floats * sizeof(float));
    attend_last(oa, a);
    cr_assert_eq(memcmp(oa, ob, floats * sizeof(float)), 0, "attention changed after a reopen");
    cr_assert_eq(ctxs_session_get_info(&ia, a), 0);
    cr_assert_eq(ia.n_tokens, ib.n_tokens, "the reopen verified fewer tokens");
    free(oa);
    free(ob);
    ctxs_session_close(a);
    ctxs_session_close(b);
}

/* The share of the slots [from, to) of run 0 that the page cache holds,
 * by whole pages inside the range. */
static double resident(const ctxs_layout *lay, uint32_t from, uint32_t to)
{
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)lay->kv + from * lay->slot_bytes + page - 1) & ~(page - 1);
    uintptr_t b = ((uintptr_t)lay->kv + to * lay->slot_bytes) & ~(page - 1);
    size_t n = (b - a) / page, in = 0;
    unsigned char *vec = malloc(n ? n : 1);
    cr_assert_eq(mincore((void *)a, b - a, vec), 0);
    for (size_t i = 0; i < n; i++)
        in += vec[i] & 1;
    free(vec);
    return n ? (double)in / (double)n : 1.0;
}

/* A session of 8192 tokens (32 MiB) synced and dropped from the page
 * cache; window layers get rings of their window and `batch`, or are laid
 * out as the session's slots where those would not be smaller. */
static const char *cold_session_batch(ctxs_model *m, uint32_t batch)
{
    const char *path = ts_path(ts_scratch, "cold.ctxs");
    unlink(path);
    ctxs_create_options o = options(8192, 0);
    o.ring = 0;
    o.batch = batch;
    ctxs_session *s;
    cr_assert_eq(ctxs_session_create(&s, path, m, &o), 0);
    const uint32_t turn = batch < 1024 ? batch : 1024; /* at most a batch reserved */
    for (uint32_t n = 0; n < 8192; n += turn)
        cr_assert_eq(ts_append(s, 8192 - n < turn ? 8192 - n : turn), 0);
    cr_assert_eq(ctxs_session_sync(s), 0);
    ctxs_session_close(s);
    int fd = open(path, O_RDONLY);
    cr_assert_geq(fd, 0);
    cr_assert_eq(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    close(fd);
    return path;
}

static const char *cold_session(ctxs_model *m)
{
    return cold_session_batch(m, CTXS_DEFAULT_BATCH);
}

Test(background, brings_in_the_window_and_no_more)
{
    ctxs_model m = big_model();
    const char *path = cold_session(&m);
    ctxs_create_options o = options(8192, 1);
    o.open.window = 1024;
    o.open.pressure_window = 512;
    ctxs_session *s;
    ctxs_layout lay;

    cr_assert_eq(ctxs_session_open(&s, path, &m, CTXS_RDONLY, &o.open), 0);
    cr_assert_eq(ctxs_session_get_layout(&lay, s), 0);
    if (resident(&lay, 2048, 6144) > 0.5)
        cr_skip_test("the page cache kept the file after POSIX_FADV_DONTNEED");
    ctxs__background_wait_idle();
    /* The window: 4 sinks and the last 1024 tokens. */
    cr_assert_eq(resident(&lay, 8192 - 1024, 8192), 1.0, "the window is not all in");
    cr_assert_lt(resident(&lay, 1024, 6144), 0.1, "more than the window came in");
    ctxs_session_close(s);

    /* Under memory pressure: the pressure window, however big the window. */
    cold_session(&m);
    ctxs_set_pressure(1);
    cr_assert_eq(ctxs_session_open(&s, path, &m, CTXS_RDONLY, &o.open), 0);
    cr_assert_eq(ctxs_session_get_layout(&lay, s), 0);
    ctxs__background_wait_idle();
    ctxs_set_pressure(0);
    cr_assert_eq(resident(&lay, 8192 - 512, 8192), 1.0);
    cr_assert_lt(resident(&lay, 1024, 8192 - 1024), 0.1, "more than the pressure window");
    ctxs_session_close(s);

    /* Without the worker nothing comes in until asked; prefetch waits. */
    cold_session(&m);
    o.open.background = 0;
    cr_assert_eq(ctxs_session_open(&s, path, &m, CTXS_RDONLY, &o.open), 0);
    cr_assert_eq(ctxs_session_get_layout(&lay, s), 0);
    cr_assert_lt(resident(&lay, 8192 - 1024, 8192), 0.1, "pages came in with background 0");
    cr_assert_eq(ctxs_session_prefetch(s), 0);
    cr_assert_eq(resident(&lay, 8192 - 1024, 8192), 1.0, "prefetch returned before the window was in");
    ctxs_session_close(s);
}

static const char *cold_session_kept_whole(ctxs_model *m)
{
    return cold_session_batch(m, 8192);
}

/* A session of m made cold by remake(), opened with `open` (window 2048),
 * layer 0 global and layer 1 a window layer of 256 laid out as the
 * session's slots: with the worker, and again with prefetch alone, the
 * global layer's window is brought in, and of the window layer its own
 * window only. */
static void expect_the_window_layer_brought_in_alone(ctxs_model *m,
                                                     const char *(*remake)(ctxs_model *),
                                                     ctxs_open_options open)
{
    for (int pass = 0; pass < 2; pass++) {
        const uint32_t background = pass == 0;
        const char *path = remake(m);
        open.window = 2048;
        open.background = background;
        ctxs_session *s;
        cr_assert_eq(ctxs_session_open(&s, path, m, CTXS_RDONLY, &open), 0);
        ctxs_layout global, windowed;
        ctxs_attn_plan plan;
        cr_assert_eq(ctxs_session_get_layer_attn(&global, &plan, s, 0, 0), 0);
        cr_assert_eq(ctxs_session_get_layer_attn(&windowed, &plan, s, 1, 0), 0);
        cr_assert_eq(windowed.capacity, 8192u,
                     "the window layer has a ring: the test measures nothing");
        if (background) {
            if (resident(&windowed, 2048, 6144) > 0.5)
                cr_skip_test("the page cache kept the file after POSIX_FADV_DONTNEED");
            ctxs__background_wait_idle();
        } else {
            cr_assert_eq(ctxs_session_prefetch(s), 0);
        }
        const char *by = background ? "the worker" : "prefetch";
        cr_assert_eq(resident(&global, 8192 - 2048, 8192), 1.0,
                     "%s: the global layer's window is not in", by);
        cr_assert_eq(resident(&windowed, 8192 - 256, 8192), 1.0,
                     "%s: the window layer's window is not in", by);
        cr_assert_lt(resident(&windowed, 8192 - 2048, 8192 - 256 - 16), 0.1,
                     "%s brought in the session's window for the window layer, not its own",
                     by);
        ctxs_session_close(s);
    }
}

/* A window layer laid out as the session's slots (every position kept,
 * as for llama.cpp's swa_full) is brought in as attention reads it: its
 * own window, where that is smaller than the window in force. */
Test(background, brings_in_a_window_layer_kept_whole_only_its_window)
{
    ctxs_model m = big_model();
    m.geometry.period = 2;
    m.geometry.window[1] = 256; /* layers 1 and 3 */
    expect_the_window_layer_brought_in_alone(&m, cold_session_kept_whole,
                                             (ctxs_open_options)CTXS_OPEN_OPTIONS_INIT);
}

/* A session of period 0 (every layer global, every position kept, as
 * for llama.cpp's swa_full) opened with the open options' attention
 * windows: the window layers are planned, and brought in, as their last
 * attn_window positions, without sinks; the global layers as before. */
Test(background, brings_in_only_the_windows_that_the_open_options_give)
{
    ctxs_model m = big_model();
    ctxs_open_options open = CTXS_OPEN_OPTIONS_INIT;
    open.window = 2048;
    open.background = 0;
    open.attn_period = 2;
    open.attn_window = 256;
    open.attn_global_mask = 0x1; /* layers 0 and 2 global, 1 and 3 windowed */
    ctxs_session *s;
    cr_assert_eq(ctxs_session_open(&s, cold_session(&m), &m, CTXS_RDONLY, &open), 0);
    ctxs_layout lay;
    ctxs_attn_plan global, plan;
    cr_assert_eq(ctxs_session_get_layer_attn(&lay, &global, s, 2, 0), 0);
    cr_assert_eq(ctxs_session_get_layer_attn(&lay, &plan, s, 3, 0), 0);
    ctxs_session_close(s);
    cr_assert_eq(global.n_sink, 4u);
    cr_assert_eq(global.window, 2048u);
    cr_assert_eq(plan.n_sink, 0u);
    cr_assert_eq(plan.window, 256u);
    cr_assert_eq(plan.n_spans, 1u);
    cr_assert_eq(plan.spans[0].pos, 8192u - 256);
    cr_assert_eq(plan.spans[0].slot, 8192u - 256);
    cr_assert_eq(plan.spans[0].count, 256u);
    expect_the_window_layer_brought_in_alone(&m, cold_session, open);
}

/* A window layer with a ring of its own that has wrapped: of the ring,
 * the slots of its window are brought in (positions mod the ring's
 * length, across its end), not the batch's slots between. */
Test(background, brings_in_of_a_wrapped_ring_only_its_window)
{
    ctxs_model m = big_model();
    m.geometry.period = 2;
    m.geometry.window[1] = 256; /* layers 1 and 3 */
    ctxs_open_options open = CTXS_OPEN_OPTIONS_INIT;
    open.window = 2048;
    for (int pass = 0; pass < 2; pass++) {
        const char *path = cold_session_batch(&m, 192);
        open.background = pass == 0;
        ctxs_session *s;
        cr_assert_eq(ctxs_session_open(&s, path, &m, CTXS_RDONLY, &open), 0);
        ctxs_layout ring;
        ctxs_attn_plan plan;
        cr_assert_eq(ctxs_session_get_layer_attn(&ring, &plan, s, 1, 0), 0);
        /* 448 slots; positions 7936 .. 8191 in slots 320 .. 447, 0 .. 127. */
        cr_assert_eq(ring.capacity, 448u);
        if (open.background) {
            if (resident(&ring, 0, 448) > 0.5)
                cr_skip_test("the page cache kept the file after POSIX_FADV_DONTNEED");
            ctxs__background_wait_idle();
        } else {
            cr_assert_eq(ctxs_session_prefetch(s), 0);
        }
        const char *by = open.background ? "the worker" : "prefetch";
        cr_assert_eq(resident(&ring, 320, 448), 1.0, "%s: the window's end is not in", by);
        cr_assert_eq(resident(&ring, 0, 128), 1.0, "%s: the window's start is not in", by);
        cr_assert_lt(resident(&ring, 128 + 32, 320 - 32), 0.1,
                     "%s brought in the ring's batch slots", by);
        ctxs_session_close(s);
    }
}

Test(background, close_during_the_bring_in_is_safe)
{
    ctxs_model m = big_model();
    const int base = thread_count();
    for (int i = 0; i < 20; i++) {
        const char *path = cold_session(&m);
        ctxs_create_options o = options(8192, 1);
        ctxs_session *s;
        cr_assert_eq(ctxs_session_open(&s, path, &m, i % 2 ? CTXS_RDONLY : 0, &o.open), 0);
        if (i % 4 == 3)
            ts_sleep_us(1000u * (uint64_t)i); /* somewhere in the middle */
        ctxs_session_close(s);
        cr_assert_eq(settled_thread_count(base), base);
    }
}

/* A session without the option, beside one with it: the worker never
 * touches it, not even to write back what its commits left once they
 * pause (it does that itself at its next commit and close), so that its
 * close need not wait for the worker. */
Test(background, leaves_a_session_without_the_option_alone)
{
    ctxs_model m = ts_model(7);
    ctxs_create_options with = options(256, 1), without = options(256, 0);
    ctxs_session *a, *b;
    cr_assert_eq(ctxs_session_create(&a, ts_path(ts_scratch, "with"), &m, &with), 0);
    cr_assert_eq(ctxs_session_create(&b, ts_path(ts_scratch, "without"), &m, &without), 0);
    cr_expect(ts_info(a).flags & CTXS_INFO_BACKGROUND, "info does not say a has the option");
    cr_expect_eq(ts_info(b).flags & CTXS_INFO_BACKGROUND, 0, "info says b has the option");
    cr_assert_eq(ts_append(a, 3), 0);
    cr_assert_eq(ts_append(b, 5), 0);
    cr_assert_neq(atomic_load(&b->writeback_settle_ms), 0, "b's commit left nothing for later: "
                  "the test checks nothing");
    /* Past the settle time of both: the worker settles a's, not b's. */
    ts_sleep_us((CTXS__WRITEBACK_SETTLE_MS + 300) * 1000u);
    ctxs__background_wait_idle();
    cr_expect_eq(atomic_load(&a->writeback_settle_ms), 0, "the worker did not settle a");
    cr_expect_neq(atomic_load(&b->writeback_settle_ms), 0, "the worker settled b");
    cr_expect_eq(atomic_load(&b->jobs), 0u, "the worker was asked to work on b");
    ctxs_session_close(b);
    cr_assert_eq(ts_append(a, 1), 0);
    ctxs_session_close(a);
}

/* CPU time of the whole process, in ms. */
static double process_cpu_ms(void)
{
    struct rusage u;
    cr_assert_eq(getrusage(RUSAGE_SELF, &u), 0);
    return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 +
           (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
}

/* A session being closed while its writeback's settle time is due: the
 * worker leaves it to the close, and waits for work instead of coming
 * back to it at every pass (it spun, holding the registry mutex, and the
 * close waited for it forever). The close's state is set by hand, as a
 * close that finds the worker in a job on the session leaves it. */
Test(background, a_due_settle_of_a_closing_session_does_not_spin_the_worker)
{
    ctxs_model m = ts_model(7);
    ctxs_create_options o = options(256, 1);
    ctxs_session *a, *b;
    cr_assert_eq(ctxs_session_create(&a, ts_path(ts_scratch, "a"), &m, &o), 0);
    cr_assert_eq(ctxs_session_create(&b, ts_path(ts_scratch, "b"), &m, &o), 0);
    cr_assert_eq(ts_append(a, 2), 0);
    ctxs__background_wait_idle();
    atomic_store(&a->closing, 1);
    atomic_store(&a->writeback_settle_ms, 1); /* long due */
    cr_assert_eq(ts_append(b, 1), 0); /* the worker wakes */
    const double before = process_cpu_ms();
    ts_sleep_us(500 * 1000);
    const double spent = process_cpu_ms() - before;
    atomic_store(&a->closing, 0); /* a spinning worker now settles a, and stops */
    cr_expect_lt(spent, 250, "%.0f ms of CPU in 500 ms of sleep: the worker spins", spent);
    ctxs_session_close(b);
    ctxs_session_close(a);
}

/* The child forked while the worker brings a session in and another one's
 * runway is prepared: the child can still open, write and close sessions,
 * its own worker comes and goes, and the parent goes on undisturbed. */
Test(background, survives_fork)
{
#ifdef __SANITIZE_THREAD__
    /* TSan keeps the parent's worker's thread id after fork() and aborts
     * the child when its own worker gets the same one ("dup thread"). */
    cr_skip_test("ThreadSanitizer cannot follow a thread created after fork()");
#endif
    ctxs_model m = big_model();
    const char *cold = cold_session(&m);
    ctxs_create_options o = options(2048, 1);
    ctxs_session *w, *r;
    cr_assert_eq(ctxs_session_create(&w, ts_path(ts_scratch, "w.ctxs"), &m, &o), 0);
    cr_assert_eq(ctxs_session_open(&r, cold, &m, CTXS_RDONLY, &o.open), 0);
    cr_assert_eq(ts_append(w, 300), 0);
    const int base = thread_count();

    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        if (thread_count() != 0)
            _exit(10);
        ctxs_session *c;
        ctxs_create_options co = options(2048, 1);
        if (ctxs_session_create(&c, ts_path(ts_scratch, "child.ctxs"), &m, &co) != 0)
            _exit(11);
        for (int i = 0; i < 10; i++)
            if (ts_append(c, 50) != 0)
                _exit(12);
        if (thread_count() != 1)
            _exit(13);
        /* The inherited handles close as any other: their worker was the
         * parent's. */
        ctxs_session_close(r);
        ctxs_session_close(w);
        ctxs_session_close(c);
        if (settled_thread_count(0) != 0)
            _exit(14);
        if (ctxs_session_open(&c, ts_path(ts_scratch, "child.ctxs"), &m, 0, &co.open) != 0)
            _exit(15);
        int bad = ts_check_all(c) != 0;
        ctxs_session_close(c);
        _exit(bad ? 16 : 0);
    }
    for (int i = 0; i < 10; i++)
        cr_assert_eq(ts_append(w, 30), 0);
    int status = ts_wait(pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %#x", status);
    cr_assert_eq(settled_thread_count(base), base);
    cr_assert_eq(ts_check_all(w), 0);
    ctxs_session_close(r);
    ctxs_session_close(w);
}

/* A writer killed while its worker writes back and prepares the runway
 * (turns back to back, ASYNC) loses no token it was told was committed. */
Test(background, a_kill_during_background_work_loses_nothing)
{
    ctxs_model m = big_model();
    uint64_t rng = ts_seed("a_kill_during_background_work_loses_nothing");
    for (int round = 0; round < 6; round++) {
        const char *path = ts_path(ts_scratch, "killed.ctxs");
        unlink(path);
        int fds[2];
        cr_assert_eq(pipe(fds), 0);
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
            close(fds[0]);
            ctxs_create_options o = options(4096, 1);
            ctxs_session *s;
            if (ctxs_session_create(&s, path, &m, &o) != 0)
                _exit(2);
            uint64_t child_rng = rng;
            for (;;) {
                uint32_t k = 1 + (uint32_t)(ts_rng_next(&child_rng) % 200);
                if (ts_append(s, k) != 0)
                    _exit(3);
                ctxs_session_info info;
                ctxs_session_get_info(&info, s);
                if (write(fds[1], &info.n_tokens, sizeof(info.n_tokens)) != sizeof(info.n_tokens))
                    _exit(4);
            }
        }
        close(fds[1]);
        uint64_t acked = 0, n;
        uint64_t want = 1 + ts_rng_next(&rng) % 40; /* commits before the kill */
        for (uint64_t i = 0; i < want && read(fds[0], &n, sizeof(n)) == sizeof(n); i++)
            acked = n;
        ts_sleep_us(ts_rng_next(&rng) % 3000);
        kill(pid, SIGKILL);
        int status = ts_wait(pid);
        cr_assert(WIFSIGNALED(status), "the writer exited on its own: %#x", status);
        while (read(fds[0], &n, sizeof(n)) == sizeof(n))
            acked = n;
        close(fds[0]);

        ctxs_create_options o = options(4096, 1);
        ctxs_session *s;
        cr_assert_eq(ctxs_session_open(&s, path, &m, CTXS_OPEN_VERIFY, &o.open), 0);
        ctxs_session_info info;
        cr_assert_eq(ctxs_session_get_info(&info, s), 0);
        cr_assert_geq(info.n_tokens, acked, "round %d: %lu tokens acknowledged, %lu found", round,
                      (unsigned long)acked, (unsigned long)info.n_tokens);
        cr_assert_eq(info.lost_tokens, 0);
        cr_assert_eq(ts_check_all(s), 0);
        ctxs_session_close(s);
    }
}
