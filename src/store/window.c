/*
 * The attention window, and what memory pressure does to it.
 *
 * Attention reads the sinks plus the last W held tokens. In slot terms that
 * is at most two contiguous spans for every (layer, head): sinks and recent
 * tokens merge wherever they touch, and a wrapped ring splits the recent
 * tokens at the end of the capacity.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

uint32_t ctxs__effective_window(const ctxs_session *s)
{
    uint32_t small = s->pressure_window ? s->pressure_window
                                        : (s->window > 1 ? s->window / 2 : 1);
    if (ctxs_get_pressure() && small < s->window)
        return small;
    return s->window;
}

void ctxs__window_spans(const ctxs_session *s, const ctxs__state *st, uint32_t w,
                        ctxs_window *out)
{
    const uint64_t n = st->n_tokens, ns = s->lay.n_sink, cap = s->lay.capacity;
    memset(out, 0, sizeof(*out));
    uint64_t sink_end = n < ns ? n : ns;
    uint64_t lo = ctxs__first_recent(s, st);
    if (n > w && n - w > lo)
        lo = n - w;

    /* Candidate spans in slot order: [0, sink_end), then the recent run,
     * which wraps into [ns, b) and [a, cap) when its slots pass the end. */
    uint64_t spans[3][2];
    int k = 0;
    if (sink_end)
        spans[k][0] = 0, spans[k][1] = sink_end, k++;
    if (lo < n) {
        uint64_t a = ctxs__slot(s, lo), b = (uint64_t)ctxs__slot(s, n - 1) + 1;
        if (a < b) {
            spans[k][0] = a, spans[k][1] = b, k++;
        } else {
            spans[k][0] = ns, spans[k][1] = b, k++;
            spans[k][0] = a, spans[k][1] = cap, k++;
        }
    }
    for (int i = 0; i < k; i++) {
        if (out->n_spans && out->spans[out->n_spans - 1].slot +
                                    out->spans[out->n_spans - 1].count == spans[i][0]) {
            out->spans[out->n_spans - 1].count += (uint32_t)(spans[i][1] - spans[i][0]);
        } else {
            out->spans[out->n_spans].slot = (uint32_t)spans[i][0];
            out->spans[out->n_spans].count = (uint32_t)(spans[i][1] - spans[i][0]);
            out->n_spans++;
        }
        out->n_tokens += (uint32_t)(spans[i][1] - spans[i][0]);
    }
}

int ctxs_session_get_window(ctxs_window *out, const ctxs_session *s)
{
    ctxs__error_begin();
    CTXS__CHECK(s && out);
    ctxs__window_spans(s, &s->st, ctxs__effective_window(s), out);
    return 0;
}

int ctxs_session_set_window(ctxs_session *s, uint32_t window)
{
    ctxs__error_begin();
    CTXS__CHECK(s);
    ctxs__registry_set_window(s, window ? window : s->lay.capacity);
    return 0;
}

/* --- Bringing the window in ----------------------------------------------
 *
 * The KV region is mapped MADV_RANDOM (session.c), so a fault on a page that
 * is not cached reads that 4 KiB page alone: a cold first step over 288 MiB
 * took 5 s that way, against 0.2 s for the same bytes read sequentially.
 * So the window's runs are read ahead first (POSIX_FADV_WILLNEED, which
 * queues the reads and returns), then mapped (MADV_POPULATE_READ, which
 * waits for each page's read and fills the page tables): a fault on a page
 * whose read is in flight waits for that read instead of issuing its own.
 * Read-ahead this way brings 4 KiB pages, not the large folios that the
 * mapping's own readahead would (see session.c).
 *
 * When everything is cached, reading ahead costs a page cache lookup per
 * page and mapping costs what the faults would (measured ~40 ms for 288 MiB
 * on 2 cores); the worker pays it while the user reads and types.
 */

/* Background bring-in: how far reading ahead runs beyond what is mapped,
 * so that the disk always has work queued while the worker waits; and how
 * much is mapped between two looks at closing and at more urgent jobs. */
#define WARM_AHEAD_BYTES (64u << 20)
#define WARM_CHUNK_BYTES (8u << 20)

static uint32_t run_count(const ctxs_session *s)
{
    return 2 * s->lay.n_layers * s->lay.n_kv_heads;
}

/* What the bring-in reads: of each run, the spans attention reads (see
 * layer_plan()). */
typedef struct bring_in {
    const ctxs_session *s;
    const ctxs__state *st;
    uint32_t window; /* in force */
    ctxs_window w;   /* its spans in the session's slots */
} bring_in;

static void bring_in_init(bring_in *b, const ctxs_session *s, const ctxs__state *st,
                          uint32_t window)
{
    b->s = s;
    b->st = st;
    b->window = window;
    ctxs__window_spans(s, st, window, &b->w);
}

/* The spans of run `run` to bring in: the window in force; for a window
 * layer (ctxs__attn_window()), its own window where smaller (Gemma 3's 15
 * of 18 layers read 512 positions of thousands): in the session's slots
 * where it is laid out there (every position kept, as for llama.cpp's
 * swa_full), else in its ring, position p at slot p mod the ring's length
 * (the rest of the ring, the batch's slots, is written before it is
 * read). */
static const ctxs_window *run_window(const bring_in *b, uint32_t run, ctxs_window *own)
{
    const ctxs_session *s = b->s;
    const uint32_t l = run / (2 * s->lay.n_kv_heads);
    const uint32_t lw = ctxs__attn_window(s, l);
    if (!lw)
        return &b->w;
    const uint32_t w = lw < b->window ? lw : b->window;
    if (ctxs__layer_group(&s->lay, l) < 0) {
        if (w == b->window)
            return &b->w;
        ctxs__window_spans(s, b->st, w, own);
        return own;
    }
    const uint64_t n = b->st->n_tokens, lo = n > w ? n - w : 0;
    ctxs__span spans[2];
    memset(own, 0, sizeof(*own));
    own->n_tokens = (uint32_t)(n - lo);
    own->n_spans = ctxs__layer_spans(spans, &s->lay, l, lo, n - lo);
    for (uint32_t i = 0; i < own->n_spans; i++) {
        own->spans[i].slot = spans[i].slot;
        own->spans[i].count = spans[i].count;
    }
    return own;
}

static void advise_runs(const bring_in *b, uint32_t from, uint32_t to)
{
    const ctxs__file_layout *lay = &b->s->lay;
    for (uint32_t run = from; run < to; run++) {
        ctxs_window own;
        const ctxs_window *w = run_window(b, run, &own);
        for (uint32_t i = 0; i < w->n_spans; i++) {
            off_t at = (off_t)(lay->kv_off + ctxs__run_off(lay, run) +
                               (uint64_t)w->spans[i].slot * lay->slot_bytes);
            off_t len = (off_t)((uint64_t)w->spans[i].count * lay->slot_bytes);
            posix_fadvise(b->s->fd, at, len, POSIX_FADV_WILLNEED);
        }
    }
}

/* Returns the run it stopped before: to, or an earlier one when the
 * session is closing (the worker's bring-in looks between runs, so that
 * close waits for one run's pages at most). */
static uint32_t map_runs(const bring_in *b, uint32_t from, uint32_t to)
{
#ifdef MADV_POPULATE_READ
    const ctxs_session *s = b->s;
    const ctxs__file_layout *lay = &s->lay;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (uint32_t run = from; run < to; run++) {
        if (atomic_load(&s->closing))
            return run;
        ctxs_window own;
        const ctxs_window *w = run_window(b, run, &own);
        uintptr_t base = (uintptr_t)(s->map + lay->kv_off + ctxs__run_off(lay, run));
        for (uint32_t i = 0; i < w->n_spans; i++) {
            uintptr_t a = (base + (uintptr_t)w->spans[i].slot * lay->slot_bytes) & ~(page - 1);
            uintptr_t e = base + (uintptr_t)(w->spans[i].slot + w->spans[i].count) * lay->slot_bytes;
            /* EINVAL before Linux 5.14: the read-ahead alone still helps. */
            if (madvise((void *)a, e - a, MADV_POPULATE_READ) != 0)
                return to;
        }
    }
#else
    (void)b, (void)from;
#endif
    return to;
}

/* A Q8 session's scale table is read whole, ahead of the KV: it is small
 * (4 bytes a slot of each run: 1/32 of the KV at 128 dims) and every step
 * of attention reads the scales of its window. */
static void map_scales(const ctxs_session *s)
{
    const ctxs__file_layout *lay = &s->lay;
    if (!lay->scales_bytes)
        return;
    posix_fadvise(s->fd, (off_t)lay->scales_off, (off_t)lay->scales_bytes, POSIX_FADV_WILLNEED);
#ifdef MADV_POPULATE_READ
    madvise(s->map + lay->scales_off, (size_t)lay->scales_bytes, MADV_POPULATE_READ);
#endif
}

int ctxs__warm_step(ctxs_session *s, const ctxs__state *st, uint32_t window)
{
    bring_in b;
    bring_in_init(&b, s, st, window);
    const uint32_t n_runs = run_count(s);
    const uint64_t run_bytes = (uint64_t)b.w.n_tokens * s->lay.slot_bytes;
    if (run_bytes == 0 || s->warm_mapped >= n_runs)
        return 0;
    uint64_t chunk = WARM_CHUNK_BYTES / run_bytes, ahead = WARM_AHEAD_BYTES / run_bytes;
    chunk = chunk ? chunk : 1;
    ahead = ahead > chunk ? ahead : chunk;
    uint32_t to = (uint32_t)(n_runs - s->warm_mapped < chunk ? n_runs : s->warm_mapped + chunk);
    uint32_t advise_to =
        (uint32_t)(n_runs - s->warm_mapped < ahead ? n_runs : s->warm_mapped + ahead);
    if (s->warm_advised < advise_to) {
        if (s->warm_advised == 0)
            map_scales(s);
        advise_runs(&b, s->warm_advised, advise_to);
        s->warm_advised = advise_to;
    }
    s->warm_mapped = map_runs(&b, s->warm_mapped, to);
    return s->warm_mapped < n_runs;
}

int ctxs_session_prefetch(const ctxs_session *s)
{
    ctxs__error_begin();
    CTXS__CHECK(s);
    bring_in b;
    bring_in_init(&b, s, &s->st, ctxs__effective_window(s));
    map_scales(s);
    advise_runs(&b, 0, run_count(s));
    map_runs(&b, 0, run_count(s));
    return 0;
}

uint32_t ctxs__attn_window(const ctxs_session *s, uint32_t l)
{
    const uint32_t lw = ctxs__layer_window(&s->lay, l);
    if (lw || !s->attn_period || (s->attn_global_mask >> (l % s->attn_period) & 1))
        return lw;
    return s->attn_window;
}

/* Appends the run of positions [lo, hi) to plan, as slot runs of a slot
 * space of cap slots after ns sinks, merging with the last span where both
 * slots and positions continue it. */
static void plan_add(ctxs_attn_plan *plan, uint32_t cap, uint32_t ns, uint64_t lo, uint64_t hi)
{
    while (lo < hi) {
        uint32_t slot = ctxs__slot_of(lo, cap, ns);
        uint64_t room = (uint64_t)cap - slot;
        uint32_t count = (uint32_t)(hi - lo < room ? hi - lo : room);
        ctxs_attn_span *last = plan->n_spans ? &plan->spans[plan->n_spans - 1] : NULL;
        if (last && last->pos + last->count == lo && last->slot + last->count == slot) {
            last->count += count;
        } else {
            plan->spans[plan->n_spans].pos = lo;
            plan->spans[plan->n_spans].slot = slot;
            plan->spans[plan->n_spans].count = count;
            plan->n_spans++;
        }
        plan->n_keys += count;
        lo += count;
    }
}

/* The plan of layer l: the session's sinks and window for a global
 * layer; the layer's own window, without sinks, for a windowed one, in
 * its ring where it has one. */
static int layer_plan(ctxs_attn_plan *out, const ctxs_session *s, uint32_t l, uint32_t n_pending)
{
    memset(out, 0, sizeof(*out));
    CTXS__CHECK(n_pending <= s->n_reserved);
    const uint64_t n = s->st.n_tokens + n_pending;
    CTXS__CHECK(n > 0);
    const uint32_t lw = ctxs__attn_window(s, l);
    if (lw) {
        uint32_t w = ctxs__effective_window(s);
        w = w < lw ? w : lw;
        const uint64_t first_query = n_pending ? s->st.n_tokens : n - 1;
        uint64_t lo = first_query + 1 > w ? first_query + 1 - w : 0;
        /* In a session's slots, never below what its ring still holds. */
        if (ctxs__layer_group(&s->lay, l) < 0) {
            uint64_t first = ctxs__first_recent(s, &s->st);
            lo = lo < first && lo >= s->lay.n_sink ? first : lo;
            if (lo < s->lay.n_sink && first > s->lay.n_sink)
                lo = first;
        }
        out->n_tokens = n;
        out->first_query = first_query;
        out->n_sink = 0;
        out->window = w;
        plan_add(out, ctxs__layer_cap(&s->lay, l), ctxs__layer_sinks(&s->lay, l), lo, n);
        return 0;
    }
    return ctxs_session_get_attn_plan(out, s, n_pending);
}

int ctxs_session_get_layer_attn(ctxs_layout *kv, ctxs_attn_plan *plan, const ctxs_session *s,
                                uint32_t layer, uint32_t n_pending)
{
    CTXS__CHECK(kv && plan);
    memset(kv, 0, sizeof(*kv));
    memset(plan, 0, sizeof(*plan));
    CTXS__CHECK(s && layer < s->lay.n_layers);
    const ctxs__file_layout *lay = &s->lay;
    const uint32_t cap = ctxs__layer_cap(lay, layer);
    const uint32_t run = layer * 2 * lay->n_kv_heads;
    kv->kv = s->map + lay->kv_off + ctxs__run_off(lay, run);
    kv->slot_bytes = lay->slot_bytes;
    kv->head_stride = (size_t)cap * lay->slot_bytes;
    kv->kv_stride = lay->n_kv_heads * kv->head_stride;
    kv->layer_stride = 2 * kv->kv_stride;
    kv->kv_bytes = kv->layer_stride;
    if (lay->scales_bytes) {
        kv->scales = (float *)(void *)(s->map + lay->scales_off + ctxs__run_scales_off(lay, run));
        kv->scales_bytes = (size_t)2 * lay->n_kv_heads * cap * 4;
    }
    kv->token_ids = ctxs__layer_group(lay, layer) < 0 ? ctxs__token_table(s) : NULL;
    kv->capacity = cap;
    kv->n_sink = ctxs__layer_sinks(lay, layer);
    kv->geometry = s->model.geometry;
    kv->geometry.n_layers = 1;
    kv->geometry.period = 0;
    memset(kv->geometry.window, 0, sizeof(kv->geometry.window));
    return layer_plan(plan, s, layer, n_pending);
}

int ctxs_session_get_attn_plan(ctxs_attn_plan *out, const ctxs_session *s,
                               uint32_t n_pending)
{
    ctxs__error_begin();
    CTXS__CHECK(out);
    memset(out, 0, sizeof(*out));
    CTXS__CHECK(s && n_pending <= s->n_reserved);
    const uint64_t n = s->st.n_tokens + n_pending;
    CTXS__CHECK(n > 0);

    /* Pending positions sit where ctxs__slot() puts them: reserve() has
     * already committed the ring's eviction for them, so the held set of
     * the state with n_pending more tokens is what the kernels may read. */
    const uint64_t first_query = n_pending ? s->st.n_tokens : n - 1;
    const uint32_t w = ctxs__effective_window(s);
    const uint64_t ns = s->lay.n_sink;
    uint64_t lo = ctxs__first_recent(s, &s->st);
    if (first_query + 1 > w && first_query + 1 - w > lo)
        lo = first_query + 1 - w;

    out->n_tokens = n;
    out->first_query = first_query;
    out->n_sink = s->lay.n_sink;
    out->window = w;
    /* Sinks, then the recent run: at most three spans, since the recent run
     * is shorter than the ring and so wraps at most once. */
    plan_add(out, s->lay.capacity, s->lay.n_sink, 0, n < ns ? n : ns);
    if (lo < n)
        plan_add(out, s->lay.capacity, s->lay.n_sink, lo, n);
    return 0;
}

/* Releases the pages of slots [lo, hi) of run `run`, rounded inward to
 * whole pages so that no byte of a neighbouring slot is affected. */
static void release_slots(const ctxs_session *s, uint32_t run, uint32_t lo, uint32_t hi)
{
    const ctxs__file_layout *lay = &s->lay;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t base = (uintptr_t)(s->map + lay->kv_off + ctxs__run_off(lay, run));
    const uintptr_t a = (base + (uintptr_t)lo * lay->slot_bytes + page - 1) & ~(page - 1);
    const uintptr_t b = (base + (uintptr_t)hi * lay->slot_bytes) & ~(page - 1);
    if (a < b)
        madvise((void *)a, b - a, MADV_DONTNEED);
}

/* Releases the KV pages outside the current window: of each run, what the
 * bring-in would not read (run_window()), so that a window layer keeps
 * only its own window: laid out as the session's slots (Gemma 3's 15
 * window layers of 18, kept whole as llama.cpp's swa_full keeps them, hold
 * 512 positions each instead of the session's window), or in a ring of
 * its own, whose batch's slots hold positions attention no longer reads
 * until the next tokens take them. Pages of a shared file
 * mapping keep their data: MADV_DONTNEED only unmaps them, and dirty pages
 * stay in the page cache until written back; they come back on access.
 * (No MADV_WILLNEED when the pressure ends: its readahead would bring back
 * the large folios that session.c keeps out.) */
void ctxs__release_outside_window(ctxs_session *s)
{
    /* The reserved slots and the runway are outside too: their pages are
     * no longer mapped, writable or not. Under the registry mutex. */
    s->pop_from = s->pop_to = 0;
    atomic_store_explicit(&s->pop_stamp, 0, memory_order_release);
    s->pop_layers = 0;
    bring_in b;
    bring_in_init(&b, s, &s->st, ctxs__effective_window(s));
    const uint32_t per = 2 * s->lay.n_kv_heads;
    for (uint32_t run = 0; run < run_count(s); run++) {
        ctxs_window own;
        const ctxs_window *w = run_window(&b, run, &own);
        uint32_t at = 0;
        for (uint32_t i = 0; i < w->n_spans; i++) {
            release_slots(s, run, at, w->spans[i].slot);
            at = w->spans[i].slot + w->spans[i].count;
        }
        release_slots(s, run, at, ctxs__layer_cap(&s->lay, run / per));
    }
}
