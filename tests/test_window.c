/*
 * The attention window: spans for sinks plus the last W tokens, through a
 * wrapping ring, and memory pressure that shrinks and restores it.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "support.h"

static char *dir;

static void setup(void)
{
    dir = ts_mkdtemp();
    ctxs_set_pressure(0);
}

static void teardown(void)
{
    ctxs_set_pressure(0);
    ts_rmtree(dir);
    free(dir);
}

TestSuite(window, .init = setup, .fini = teardown);

/* Sessions without the background worker: these tests look at the page
 * cache, which the worker's runway and bring-in would change under them
 * (test_background.c tests the worker). */
static ctxs_session *create(const char *name, uint32_t capacity, uint32_t n_sink,
                            uint32_t window, uint32_t pressure_window)
{
    ctxs_model m = ts_model(3);
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.open.background = 0;
    o.capacity = capacity;
    o.n_sink = n_sink;
    o.ring = 1;
    o.open.window = window;
    o.open.pressure_window = pressure_window;
    o.open.durability = CTXS_SYNC_NONE;
    ctxs_session *s = NULL;
    int rc = ctxs_session_create(&s, ts_path(dir, name), &m, &o);
    cr_assert_eq(rc, 0, "create: %s", ctxs_strerror(rc));
    return s;
}

static ctxs_window window_of(const ctxs_session *s)
{
    ctxs_window w;
    cr_assert_eq(ctxs_session_get_window(&w, s), 0);
    return w;
}

#define expect_spans(w, n, s0, c0, s1, c1)                                     \
    do {                                                                       \
        cr_expect_eq((w).n_spans, (n), "spans %u", (w).n_spans);               \
        if ((n) > 0) {                                                         \
            cr_expect_eq((w).spans[0].slot, (s0));                             \
            cr_expect_eq((w).spans[0].count, (c0));                            \
        }                                                                      \
        if ((n) > 1) {                                                         \
            cr_expect_eq((w).spans[1].slot, (s1));                             \
            cr_expect_eq((w).spans[1].count, (c1));                            \
        }                                                                      \
    } while (0)

Test(window, an_empty_session_has_no_spans)
{
    ctxs_session *s = create("a", 64, 4, 16, 8);
    ctxs_window w = window_of(s);
    expect_spans(w, 0, 0, 0, 0, 0);
    cr_expect_eq(w.n_tokens, 0);
    ctxs_session_close(s);
}

Test(window, short_contexts_are_one_span)
{
    ctxs_session *s = create("a", 64, 4, 16, 8);
    cr_assert_eq(ts_append(s, 3), 0);
    expect_spans(window_of(s), 1, 0, 3, 0, 0);
    cr_assert_eq(ts_append(s, 17), 0); /* 20 tokens: 4 sinks + 16 recent */
    ctxs_window w = window_of(s);
    expect_spans(w, 1, 0, 20, 0, 0);
    cr_expect_eq(w.n_tokens, 20);
    ctxs_session_close(s);
}

Test(window, sinks_and_recent_tokens_are_two_spans)
{
    ctxs_session *s = create("a", 64, 4, 16, 8);
    cr_assert_eq(ts_append(s, 40), 0);
    ctxs_window w = window_of(s);
    expect_spans(w, 2, 0, 4, 24, 16);
    cr_expect_eq(w.n_tokens, 20);
    ctxs_session_close(s);
}

Test(window, a_wrapped_ring_merges_its_head_with_the_sinks)
{
    ctxs_session *s = create("a", 64, 4, 16, 8);
    cr_assert_eq(ts_append(s, 60), 0);
    cr_assert_eq(ts_append(s, 10), 0); /* positions 64..69 in slots 4..9 */
    ctxs_window w = window_of(s);
    /* last 16: positions 54..69 = slots 54..63 and 4..9 */
    expect_spans(w, 2, 0, 10, 54, 10);
    cr_expect_eq(w.n_tokens, 20);
    ctxs_session_close(s);
}

Test(window, a_window_wider_than_the_ring_holds_everything)
{
    ctxs_session *s = create("a", 64, 4, 2048, 1024);
    for (int i = 0; i < 7; i++)
        cr_assert_eq(ts_append(s, 13), 0); /* 91 tokens, wrapped */
    ctxs_window w = window_of(s);
    cr_expect_eq(w.n_tokens, 64);
    uint32_t covered = 0;
    for (uint32_t i = 0; i < w.n_spans; i++)
        covered += w.spans[i].count;
    cr_expect_eq(covered, 64);
    ctxs_session_close(s);
}

Test(window, set_window_changes_the_recent_part)
{
    ctxs_session *s = create("a", 64, 4, 16, 8);
    cr_assert_eq(ts_append(s, 40), 0);
    cr_assert_eq(ctxs_session_set_window(s, 4), 0);
    expect_spans(window_of(s), 2, 0, 4, 36, 4);
    ctxs_session_close(s);
}

/* Pages of a run that are mapped in this process (mincore counts page-cache
 * residency for file mappings, so that is no use here); a read through the
 * mapping is what tells whether the data survived. */
Test(window, pressure_shrinks_windows_and_loses_nothing)
{
    ctxs_session *s = create("a", 4096, 4, 2048, 1024);
    for (int i = 0; i < 6; i++)
        cr_assert_eq(ts_append(s, 500), 0);
    ctxs_window w = window_of(s);
    expect_spans(w, 2, 0, 4, 3000 - 2048, 2048);

    ctxs_set_pressure(1);
    cr_expect_eq(ctxs_get_pressure(), 1);
    w = window_of(s);
    expect_spans(w, 2, 0, 4, 3000 - 1024, 1024);
    ctxs_session_info info;
    ctxs_session_get_info(&info, s);
    cr_expect_eq(info.window, 1024);
    cr_expect(info.flags & CTXS_INFO_PRESSURE);
    /* Every token is still there, including those whose pages were let go. */
    cr_expect_eq(ts_check_all(s), 0);
    cr_expect_eq(ctxs_session_verify(NULL, s), 0);

    /* A session opened under pressure starts small. */
    ctxs_session *t = create("b", 4096, 4, 2048, 1024);
    cr_assert_eq(ts_append(t, 3000), 0);
    expect_spans(window_of(t), 2, 0, 4, 3000 - 1024, 1024);

    ctxs_set_pressure(0);
    expect_spans(window_of(s), 2, 0, 4, 3000 - 2048, 2048);
    expect_spans(window_of(t), 2, 0, 4, 3000 - 2048, 2048);
    cr_expect_eq(ts_check_all(s), 0);
    ctxs_session_close(t);
    ctxs_session_close(s);

    s = NULL;
    ctxs_model m = ts_model(3);
    cr_assert_eq(ctxs_session_open(&s, ts_path(dir, "a"), &m, 0, NULL), 0);
    cr_expect_eq(ts_check_all(s), 0);
    ctxs_session_close(s);
}

/* Whether the page holding p is mapped in this process: the present bit
 * of its /proc/self/pagemap entry (mincore() would say whether the page
 * cache holds it, which an unmapped page of a shared mapping still is). */
static int mapped(const void *p)
{
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    int fd = open("/proc/self/pagemap", O_RDONLY);
    cr_assert_geq(fd, 0, "/proc/self/pagemap: %s", strerror(errno));
    uint64_t entry = 0;
    ssize_t n = pread(fd, &entry, sizeof(entry), (off_t)((uintptr_t)p / page * sizeof(entry)));
    close(fd);
    cr_assert_eq(n, (ssize_t)sizeof(entry));
    return (int)(entry >> 63);
}

Test(window, pressure_releases_a_window_layer_down_to_its_own_window)
{
    /* Layer 0 reads its last 512 positions, layer 1 the session's window;
     * both are laid out as the session's slots (no schedule). */
    ctxs_model m = ts_model(3);
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = 4096;
    o.open.background = 0;
    o.open.durability = CTXS_SYNC_NONE;
    o.open.window = 2048;
    o.open.pressure_window = 1024;
    o.open.attn_period = 2;
    o.open.attn_window = 512;
    o.open.attn_global_mask = 1u << 1;
    ctxs_session *s = NULL;
    cr_assert_eq(ctxs_session_create(&s, ts_path(dir, "w.ctxs"), &m, &o), 0);
    ts_append_many(s, 3000);
    ctxs_layout lay;
    cr_assert_eq(ctxs_session_get_layout(&lay, s), 0);
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (size_t off = 0; off < lay.kv_bytes; off += page)
        (void)*(volatile const uint8_t *)((const uint8_t *)lay.kv + off);

    /* Pressure: the window of 1024 for layer 1, 512 for layer 0. Every run
     * of each layer is let go alike; one of each is looked at. */
    ctxs_set_pressure(1);
    const uint8_t *window_run = lay.kv, *global_run = (const uint8_t *)lay.kv + lay.layer_stride;
    const uint32_t kept_by_both = 2900, kept_by_global = 2100, kept_by_none = 1000;
    cr_assert_gt(kept_by_global * lay.slot_bytes / page,
                 (3000 - 1024) * lay.slot_bytes / page, "a page wholly outside layer 0's window");
    cr_assert_lt((kept_by_global + 1) * lay.slot_bytes / page,
                 (3000 - 512) * lay.slot_bytes / page, "a page wholly outside layer 0's window");
    cr_expect(mapped(global_run + kept_by_both * lay.slot_bytes));
    cr_expect(mapped(window_run + kept_by_both * lay.slot_bytes));
    cr_expect(mapped(global_run + kept_by_global * lay.slot_bytes),
              "the global layer let go of its window");
    cr_expect_not(mapped(window_run + kept_by_global * lay.slot_bytes),
                  "the window layer kept the session's window");
    cr_expect_not(mapped(global_run + kept_by_none * lay.slot_bytes));
    cr_expect_not(mapped(window_run + kept_by_none * lay.slot_bytes));

    /* Nothing is lost: the pages come back on access. */
    ctxs_set_pressure(0);
    cr_expect_eq(ts_check_all(s), 0);
    ctxs_session_close(s);
}

Test(window, pressure_releases_a_rings_batch)
{
    /* Layer 1 a window layer of 256 in a ring of its own (its window and
     * a batch of 192: 448 slots of 256 bytes), layer 0 global. */
    ctxs_model m = ts_model(4);
    m.geometry.head_dim = 128;
    m.geometry.period = 2;
    m.geometry.window[1] = 256;
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = 4096;
    o.ring = 0;
    o.batch = 192;
    o.open.background = 0;
    o.open.durability = CTXS_SYNC_NONE;
    o.open.window = 2048;
    o.open.pressure_window = 1024;
    ctxs_session *s = NULL;
    cr_assert_eq(ctxs_session_create(&s, ts_path(dir, "r.ctxs"), &m, &o), 0);
    for (uint32_t n = 0; n < 3000; n += 150) /* a turn at most a batch */
        cr_assert_eq(ts_append(s, 150), 0);
    ctxs_layout global, ring;
    ctxs_attn_plan plan;
    cr_assert_eq(ctxs_session_get_layer_attn(&global, &plan, s, 0, 0), 0);
    cr_assert_eq(ctxs_session_get_layer_attn(&ring, &plan, s, 1, 0), 0);
    cr_assert_eq(ring.capacity, 448u);
    /* Positions 2744 .. 2999 in slots 56 .. 311. */
    cr_assert_eq(plan.n_spans, 1u);
    cr_assert_eq(plan.spans[0].slot, 56u);
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (const ctxs_layout *lay = &global; lay; lay = lay == &global ? &ring : NULL)
        for (size_t off = 0; off < lay->layer_stride; off += page)
            (void)*(volatile const uint8_t *)((const uint8_t *)lay->kv + off);

    ctxs_set_pressure(1);
    const uint8_t *r = ring.kv, *g = global.kv;
    cr_expect(mapped(r + 100 * ring.slot_bytes), "the ring let go of its window");
    cr_expect(mapped(r + 300 * ring.slot_bytes), "the ring let go of its window");
    cr_expect_not(mapped(r + 400 * ring.slot_bytes), "the ring kept its batch's slots");
    cr_expect_not(mapped(r + 16 * ring.slot_bytes), "the ring kept its batch's slots");
    cr_expect(mapped(g + 2900 * global.slot_bytes));
    cr_expect_not(mapped(g + 1000 * global.slot_bytes));

    /* Nothing is lost: every checksum the session holds still matches. */
    ctxs_set_pressure(0);
    cr_expect_eq(ctxs_session_verify(NULL, s), 0);
    ctxs_session_close(s);
}

Test(window, the_watcher_applies_pressure_from_meminfo)
{
    ctxs_session *s = create("a", 4096, 4, 2048, 1024);
    cr_assert_eq(ts_append(s, 3000), 0);

    /* A threshold above any machine's memory: the watcher must see pressure. */
    ctxs_watcher_options o = CTXS_WATCHER_OPTIONS_INIT;
    o.poll_ms = 10;
    o.min_available = 1ull << 60;
    int rc = ctxs_watcher_start(&o);
    if (rc == -ENOTSUP)
        cr_skip_test("no /proc/meminfo or PSI on this system");
    cr_assert_eq(rc, 0, "%s", ctxs_strerror(rc));
    cr_expect_eq(ctxs_watcher_start(&o), -EALREADY);
    for (int i = 0; i < 500 && !ctxs_get_pressure(); i++)
        usleep(2000);
    cr_expect_eq(ctxs_get_pressure(), 1);
    expect_spans(window_of(s), 2, 0, 4, 3000 - 1024, 1024);
    ctxs_watcher_stop();

    /* A threshold of zero bytes (and PSI off): the pressure goes away. */
    o.min_available = 0;
    o.psi_some_avg10 = 0;
    cr_assert_eq(ctxs_watcher_start(&o), 0);
    for (int i = 0; i < 500 && ctxs_get_pressure(); i++)
        usleep(2000);
    cr_expect_eq(ctxs_get_pressure(), 0);
    expect_spans(window_of(s), 2, 0, 4, 3000 - 2048, 2048);
    ctxs_watcher_stop();
    ctxs_watcher_stop(); /* harmless when none runs */
    cr_expect_eq(ts_check_all(s), 0);
    ctxs_session_close(s);
}

/* 1 if the page holding p is in the page cache. */
static int resident(const void *p)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    unsigned char v = 0;
    cr_assert_eq(mincore((void *)((uintptr_t)p & ~(page - 1)), page, &v), 0);
    return v & 1;
}

Test(window, prefetch_reads_the_window_of_a_cold_file)
{
    cr_assert_eq(ctxs_session_prefetch(NULL), CTXS_EINVAL);
    ctxs_session *s = create("cold.ctxs", 8192, 4, 64, 32);
    ts_append_many(s, 4000); /* window: slots 0..3 and 3936..3999 */
    ctxs_layout lay;
    cr_assert_eq(ctxs_session_get_layout(&lay, s), 0);
    const uint8_t *run = lay.kv; /* layer 0, K, head 0 */
    const uint8_t *recent = run + 3990 * lay.slot_bytes;
    const uint8_t *outside = run + 2048 * lay.slot_bytes;

    /* Make the file cold: written back, then dropped from the page cache
     * (which keeps pages a mapping has mapped, so unmap them first). */
    int fd = open(ts_path(dir, "cold.ctxs"), O_RDONLY);
    cr_assert_geq(fd, 0);
    cr_assert_eq(fsync(fd), 0);
    cr_assert_eq(madvise(lay.kv, lay.kv_bytes, MADV_DONTNEED), 0);
    cr_assert_eq(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    close(fd);
    if (resident(recent) || resident(outside))
        cr_skip_test("this file system keeps the pages cached (tmpfs?)");

    /* Synchronous: the window is in when it returns. */
    cr_assert_eq(ctxs_session_prefetch(s), 0);
    cr_assert(resident(recent), "the window's last page was not read");
    cr_assert(resident(run), "the sinks' page was not read");
    cr_expect_not(resident(outside), "a page outside the window was read");
    ctxs_session_close(s);
}
