/*
 * The attention window and memory pressure.
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

static atomic_int pressure;

uint32_t ctxs__effective_window(const ctxs_session *s)
{
    if (atomic_load(&pressure) && s->pressure_window < s->window)
        return s->pressure_window;
    return s->window;
}

/* The window of st for a given W. */
static void window_spans(const ctxs_session *s, const ctxs__state *st, uint32_t w,
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

int ctxs_session_window(ctxs_window *out, const ctxs_session *s)
{
    CTXS__CHECK(s && out);
    window_spans(s, &s->st, ctxs__effective_window(s), out);
    return 0;
}

int ctxs_session_set_window(ctxs_session *s, uint32_t window)
{
    CTXS__CHECK(s);
    ctxs__registry_set_window(s, window ? window : CTXS__DEFAULT_WINDOW);
    return 0;
}

int ctxs_session_prefetch(const ctxs_session *s)
{
    CTXS__CHECK(s);
    ctxs_window w;
    window_spans(s, &s->st, ctxs__effective_window(s), &w);
    const ctxs__file_layout *lay = &s->lay;
    for (uint32_t run = 0; run < 2 * lay->n_layers * lay->n_kv_heads; run++) {
        for (uint32_t i = 0; i < w.n_spans; i++) {
            off_t at = (off_t)(lay->kv_off + (uint64_t)run * lay->head_stride
                               + (uint64_t)w.spans[i].slot * lay->slot_bytes);
            off_t len = (off_t)((uint64_t)w.spans[i].count * lay->slot_bytes);
            int rc = posix_fadvise(s->fd, at, len, POSIX_FADV_WILLNEED);
            if (rc)
                return -rc;
        }
    }
    return 0;
}

/* Appends the run of positions [lo, hi) to plan, as slot runs, merging with
 * the last span where both slots and positions continue it. */
static void plan_add(ctxs_attn_plan *plan, const ctxs_session *s, uint64_t lo,
                     uint64_t hi)
{
    while (lo < hi) {
        uint32_t slot = ctxs__slot(s, lo);
        uint64_t room = (uint64_t)s->lay.capacity - slot;
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

int ctxs_session_attn_plan(ctxs_attn_plan *out, const ctxs_session *s,
                           uint32_t n_pending)
{
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
    plan_add(out, s, 0, n < ns ? n : ns);
    if (lo < n)
        plan_add(out, s, lo, n);
    return 0;
}

/* Releases the pages of [lo, hi) slots in every run, rounded inward to
 * whole pages so that no byte of a neighbouring slot is affected. */
static void release_slots(const ctxs_session *s, uint32_t lo, uint32_t hi)
{
    const ctxs__file_layout *lay = &s->lay;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (uint32_t run = 0; run < 2 * lay->n_layers * lay->n_kv_heads; run++) {
        uintptr_t base = (uintptr_t)(s->map + lay->kv_off + (size_t)run * lay->head_stride);
        uintptr_t a = (base + (uintptr_t)lo * lay->slot_bytes + page - 1) & ~(page - 1);
        uintptr_t b = (base + (uintptr_t)hi * lay->slot_bytes) & ~(page - 1);
        if (a < b)
            madvise((void *)a, b - a, MADV_DONTNEED);
    }
}

/* Releases the KV pages outside the current window. Pages of a shared file
 * mapping keep their data: MADV_DONTNEED only unmaps them, and dirty pages
 * stay in the page cache until written back; they come back on access.
 * (No MADV_WILLNEED when the pressure ends: its readahead would bring back
 * the large folios that session.c keeps out.) */
static void release_outside_window(const ctxs_session *s)
{
    ctxs_window w;
    window_spans(s, &s->st, ctxs__effective_window(s), &w);
    uint32_t at = 0;
    for (uint32_t i = 0; i < w.n_spans; i++) {
        release_slots(s, at, w.spans[i].slot);
        at = w.spans[i].slot + w.spans[i].count;
    }
    release_slots(s, at, s->lay.capacity);
}

int ctxs_pressure_set(int on)
{
    on = on != 0;
    if (atomic_exchange(&pressure, on) == on)
        return 0;
    pthread_mutex_lock(&ctxs__registry_mutex);
    if (on)
        for (ctxs_session *s = ctxs__registry_head; s; s = s->next)
            release_outside_window(s);
    pthread_mutex_unlock(&ctxs__registry_mutex);
    return 0;
}

int ctxs_pressure_get(void)
{
    return atomic_load(&pressure);
}
