/*
 * The write path: reserve, write in place, commit; rollback and sync.
 *
 * The invariants of the commit records, which recovery (recover.c) relies
 * on, checked where they must hold (CTXS__INVARIANT, invariant.h):
 *
 * Invariant C1: a slot whose position some surviving record may still
 *   claim below its watermark is never rewritten until a durable record
 *   stops claiming it (see verified_from in format.h). Within one boot the
 *   page cache makes every record consistent with the data written before
 *   it; across a power loss, positions at or above the watermark are
 *   verified and positions below it were durable and untouched. Checked
 *   at the end of reserve: the current state claims none of the slots
 *   handed out.
 * Invariant C2: every record written is one ctxs__record_valid() accepts
 *   (its watermark and ring start at most its count, its held runs within
 *   the capacity), in the slot that does not hold the current record and
 *   with the next sequence number, so that the current record stays whole
 *   until a newer one is (reserve keeps the count below the reader's
 *   limit). The exception: a sequence number at the limit a reader takes
 *   (at_a_limit()), which only a file that already claimed about as much
 *   reaches; the reader then keeps the record before it.
 * Invariant C3: a rollback makes both records claim the new count durably
 *   before it zeroes a dropped position's checksum: zeroed checksums under
 *   a surviving older record would fail tokens its watermark vouches for.
 */
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "invariant.h"
#include "platform.h"
#include "syscall.h"

/* Disk blocks are allocated ahead in steps of at least this many bytes of
 * each (layer, K|V, head) run, to keep the fallocate calls per token low. */
#define ALLOC_STEP_BYTES 65536u

/* A record past what a reader takes: a sequence number that follows
 * prev_seq at UINT64_MAX or wraps. Only a file that claimed about as much
 * already (a damaged or hostile one) leads a writer there, and such a
 * record is written as before (C2's exception). A count is held below the
 * reader's limit by reserve. */
static int at_a_limit(uint64_t prev_seq)
{
    return prev_seq >= UINT64_MAX - 1;
}

/* ctxs__unvouch(), the record mutex held. */
static void unvouch_records(ctxs_session *s)
{
    /* After a failed writeback Linux may have dropped the dirty pages and
     * marked them clean: the page cache no longer vouches for the records.
     * Clearing their boot id makes any later open verify, as after a power
     * loss. The non-current record first, so one stays valid throughout.
     * Written as a commit writes them (not torn by a kill), and by pwrite:
     * after a writeback error the file system may refuse a store into the
     * mapping, a SIGBUS, where a refused pwrite is only a failed attempt. */
    for (uint32_t k = 0; k < 2; k++) {
        uint32_t index = k == 0 ? s->cur_record ^ 1u : s->cur_record;
        const off_t off = index == 0 ? CTXS__RECORD0_OFF : CTXS__RECORD1_OFF;
        ctxs__disk_record r;
        memcpy(&r, s->map + off, sizeof(r));
        if (!ctxs__record_valid(&r, index, &s->lay, s->ring))
            continue;
        memset(r.boot_id, 0, sizeof(r.boot_id));
        ctxs__record_seal(&r, index);
        (void)ctxs__pwrite(s->fd, &r, sizeof(r), off);
    }
}

void ctxs__unvouch(ctxs_session *s)
{
    pthread_mutex_lock(&s->record_mutex);
    unvouch_records(s);
    pthread_mutex_unlock(&s->record_mutex);
}

void ctxs__writeback_failed(ctxs_session *s, int rc)
{
    atomic_store(&s->writeback_error, rc);
    ctxs__unvouch(s);
}

int ctxs__record_write(ctxs_session *s, const ctxs__state *next)
{
    uint32_t index = s->cur_record ^ 1u;
    ctxs__disk_record r;
    memset(&r, 0, sizeof(r));
    r.seq = s->st.seq + 1;
    r.n_tokens = next->n_tokens;
    r.ring_start = next->ring_start;
    r.verified_from = next->verified_from;
    ctxs__boot_id(r.boot_id);
    r.written_unix_ms = ctxs__now_ms();
    ctxs__record_seal(&r, index);
    CTXS__INVARIANT("C2", at_a_limit(s->st.seq) ||
                              (ctxs__record_valid(&r, index, &s->lay, s->ring) && r.seq > s->st.seq));

    /* Everything written before (K/V, token ids, checksums) must reach the
     * page cache, and other processes, before the record that claims it.
     * One pwrite rather than a copy into the mapping: a process killed while
     * copying could leave a torn record in the page cache, to be written
     * back; a system call is not interrupted halfway. */
    atomic_thread_fence(memory_order_release);
    off_t off = index == 0 ? CTXS__RECORD0_OFF : CTXS__RECORD1_OFF;
    pthread_mutex_lock(&s->record_mutex);
    ssize_t w = ctxs__pwrite(s->fd, &r, sizeof(r), off);
    if (w != (ssize_t)sizeof(r)) {
        const int rc = w < 0 ? -errno : -EIO;
        pthread_mutex_unlock(&s->record_mutex);
        return rc;
    }
    ctxs__state written = *next;
    written.seq = r.seq;
    ctxs__registry_set_state(s, &written, index);
    /* A writeback failed before this record was written, where the
     * records were unvouched without it: it vouches for nothing either. */
    if (atomic_load(&s->writeback_error) < 0)
        unvouch_records(s);
    pthread_mutex_unlock(&s->record_mutex);
    return 0;
}

int ctxs__record_write_both(ctxs_session *s, const ctxs__state *next)
{
    int rc = ctxs__record_write(s, next);
    return rc < 0 ? rc : ctxs__record_write(s, next);
}

/* Makes the metadata durable (header page, records, token and checksum
 * tables: everything before the KV region), and not the KV. */
int ctxs__sync_meta(ctxs_session *s)
{
#ifdef __APPLE__
    return ctxs__sync_data(s->fd);
#else
    return ctxs__msync(s->map, (size_t)s->lay.kv_off, MS_SYNC) == 0 ? 0 : -errno;
#endif
}

/* Zeroes the checksums of positions [from, to), which nothing will claim
 * any more. Returns whether any was set. */
static int forget_sums(ctxs_session *s, uint64_t from, uint64_t to)
{
    uint64_t *table = ctxs__sum_table(s);
    int changed = 0;
    for (uint64_t p = from; p < to; p++) {
        uint32_t slot = ctxs__slot(s, p);
        if (table[slot]) { /* never dirty a page for nothing */
            table[slot] = 0;
            changed = 1;
        }
    }
    return changed;
}

/* Zeroes the checksums of the positions at or above `from` that st holds
 * (at most the capacity, however far the ring has run). */
static int forget_held_from(ctxs_session *s, const ctxs__state *st, uint64_t from)
{
    uint64_t ns = s->lay.n_sink, n = st->n_tokens, first = ctxs__first_recent(s, st);
    int changed = 0;
    if (from < ns)
        changed |= forget_sums(s, from, n < ns ? n : ns);
    return forget_sums(s, from > first ? from : first, n) | changed;
}

/* Zeroes the entries of windowed groups' slots last committed for a
 * position at or above n: a commit that died before its record, or
 * positions a rollback dropped. The positions below n that a ring still
 * holds keep theirs: a rollback into them is exact. */
static int forget_groups_from(ctxs_session *s, uint64_t n)
{
    int changed = 0;
    for (uint32_t g = 0; g < s->lay.n_groups; g++) {
        ctxs__group_entry *t = ctxs__group_table(s, g);
        for (uint32_t i = 0; i < s->lay.groups[g].len; i++)
            if (t[i].sum && t[i].pos >= n) {
                t[i] = (ctxs__group_entry){0, 0};
                changed = 1;
            }
    }
    return changed;
}

int ctxs__forget_unheld(ctxs_session *s)
{
    /* The slots the next positions will take, up to a full ring: as many as
     * the state leaves free, from the next position on (below the capacity
     * positions are their own slots, sinks included). */
    uint64_t n = s->st.n_tokens;
    int changed = forget_sums(s, n, n + s->lay.capacity - ctxs__held(s, &s->st));
    return forget_groups_from(s, n) | changed;
}

int ctxs__fail(ctxs_session *s)
{
    s->failed = 1;
    ctxs__unvouch(s);
    return ctxs__error(CTXS_EFAILED, "a write or sync of the session failed; what was "
                       "committed before is safe: close the session and open it again");
}

int ctxs__writable(ctxs_session *s)
{
    if (s->readonly)
        return ctxs__error(CTXS_EREADONLY, "the session was opened read-only "
                           "(CTXS_RDONLY): open it without that flag to write");
    if (s->failed)
        return ctxs__error(CTXS_EFAILED, "an earlier write or sync of this handle failed: "
                           "close the session and open it again");
    /* Loaded first: the write path asks at every call, and an exchange
     * would take the line from the worker each time. */
    if (atomic_load_explicit(&s->writeback_error, memory_order_relaxed) < 0 &&
        atomic_exchange(&s->writeback_error, 0) < 0)
        return ctxs__fail(s);
    return 0;
}

/* Slots [from, to) of every run; a windowed group's ring, shorter, up to
 * its length. A Q8 session's scales of those slots too: the table is
 * allocated at create, but a split that failed to zero them in place may
 * have left holes (runway.c), in this handle or an earlier one; where
 * they are allocated, asking again changes nothing. */
static int allocate_range(ctxs_session *s, uint64_t from, uint64_t to)
{
    const ctxs__file_layout *lay = &s->lay;
    const uint32_t per = 2 * lay->n_kv_heads;
    for (uint32_t run = 0; run < lay->n_layers * per; run++) {
        uint64_t cap = ctxs__layer_cap(lay, run / per);
        uint64_t a = from < cap ? from : cap, b = to < cap ? to : cap;
        if (a == b)
            continue;
        uint64_t off = lay->kv_off + ctxs__run_off(lay, run) + a * lay->slot_bytes;
        int rc = ctxs__allocate(s->fd, off, (b - a) * lay->slot_bytes);
        if (rc == 0 && lay->scales_bytes)
            rc = ctxs__allocate(s->fd, lay->scales_off + ctxs__run_scales_off(lay, run) + a * 4,
                                (b - a) * 4);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Allocates disk blocks so that slots [0, end_slot) are all backed: a step
 * ahead when there is room, exactly what is needed when the disk is nearly
 * full. The owner (reserve) and the worker (the runway) may both call it:
 * allocating a range twice changes nothing, and here alloc_end only grows
 * (the owner lowers it only with the worker held off, runway.c). */
int ctxs__allocate_slots(ctxs_session *s, uint32_t end_slot)
{
    uint32_t have = atomic_load(&s->alloc_end);
    if (end_slot <= have)
        return 0;
    const ctxs__file_layout *lay = &s->lay;
    uint64_t step = (ALLOC_STEP_BYTES + lay->slot_bytes - 1) / lay->slot_bytes;
    uint64_t ahead = ((uint64_t)end_slot + step - 1) / step * step;
    if (ahead > lay->capacity)
        ahead = lay->capacity;
    int rc = allocate_range(s, have, ahead);
    if (rc == CTXS_EFULL && ahead > end_slot) {
        ahead = end_slot;
        rc = allocate_range(s, have, ahead);
    }
    if (rc < 0)
        return rc;
    while (have < ahead && !atomic_compare_exchange_weak(&s->alloc_end, &have, (uint32_t)ahead))
        ;
    return 0;
}

/* --- Writeback of what was committed (the worker's, at ASYNC) ------------- */

void ctxs__writeback_request_all(ctxs_session *s)
{
    atomic_store(&s->writeback_rewind, 0);
    atomic_store(&s->writeback_whole, 1);
    ctxs__background_request(s, CTXS__JOB_WRITEBACK);
}

/* The end of span sp of layer l's run at off, trimmed to the last whole
 * page when the span ends inside the ring with slots still to be filled:
 * that page is written again by the next tokens. */
static uint64_t span_end(const ctxs__file_layout *lay, uint32_t l, uint64_t off,
                         const ctxs__span *sp, uint64_t page)
{
    uint64_t end = off + ((uint64_t)sp->slot + sp->count) * lay->slot_bytes;
    if (sp->slot + sp->count < ctxs__layer_cap(lay, l))
        end &= ~(page - 1);
    return end;
}

void ctxs__writeback_committed(ctxs_session *s, const ctxs__state *st, int whole)
{
    /* Whole: everything committed, the records and tables too, and the
     * page each run's next slots share with the last ones; writeback
     * write-protects them (ctxs__kv_writable() then finds them clean, and
     * the runway maps them again; where it cannot ask the page cache it
     * judges by age: say the runway is old). Otherwise only the K/V pages
     * the committed tokens have filled: the next commits write the rest
     * again, and a page under writeback is one that the next store into
     * it faults on and, where pages must stay stable while written, waits
     * for. */
    if (whole)
        atomic_store(&s->runway_at_ms, 0);
    int rc = ctxs__writeback_wait(s->fd);
    const ctxs__file_layout *lay = &s->lay;
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t from = s->written_back_to, to = st->n_tokens;
    uint64_t rewind = atomic_exchange(&s->writeback_rewind, UINT64_MAX);
    from = rewind < from ? rewind : from;
    from = from > to ? to : from;
    if (rc == 0 && whole)
        rc = ctxs__writeback_start(s->fd, s->map, 0, lay->kv_off);
    if (to - from > ctxs__ring_len(s)) { /* the ring went round: all of it */
        if (rc == 0)
            rc = ctxs__writeback_start(s->fd, s->map, lay->kv_off, lay->kv_bytes);
    } else if (to > from) {
        const uint32_t per = 2 * lay->n_kv_heads;
        for (uint32_t run = 0; rc == 0 && run < lay->n_layers * per; run++) {
            ctxs__span spans[2];
            const uint32_t l = run / per;
            const uint64_t off = lay->kv_off + ctxs__run_off(lay, run);
            uint32_t n_spans = ctxs__layer_spans(spans, lay, l, from, to - from);
            for (uint32_t i = 0; rc == 0 && i < n_spans; i++) {
                uint64_t a = off + (uint64_t)spans[i].slot * lay->slot_bytes;
                uint64_t b = whole ? off + ((uint64_t)spans[i].slot + spans[i].count) *
                                               lay->slot_bytes
                                   : span_end(lay, l, off, &spans[i], page);
                if (b > a)
                    rc = ctxs__writeback_start(s->fd, s->map, a, b - a);
            }
        }
    }
    if (rc < 0)
        ctxs__writeback_failed(s, rc);
    /* Held back: the tokens that may share a page with the next ones. */
    const uint64_t held = whole ? 0 : page / lay->slot_bytes + 1;
    s->written_back_to = to - from > held ? to - held : from;
}

int ctxs_session_reserve(ctxs_reservation *out, ctxs_session *s, uint32_t n)
{
    ctxs__error_begin();
    CTXS__REQUIRE(out, "out is NULL");
    memset(out, 0, sizeof(*out));
    CTXS__REQUIRE(s, "the session is NULL");
    CTXS__REQUIRE(n > 0, "n is 0: reserve at least one slot");
    int rc = ctxs__writable(s);
    if (rc < 0)
        return rc;

    const uint64_t cap = s->lay.capacity, ns = s->lay.n_sink;
    const uint64_t committed = s->st.n_tokens;
    const uint64_t start = committed + s->n_reserved, end = start + n;
    if (end >= CTXS__MAX_POSITION) /* only a file that claims about as much */
        return ctxs__error(CTXS_EFULL,
                           "%u more tokens would reach position %" PRIu64 ", past the most "
                           "a session file counts (2^62 - 1): nothing was lost",
                           n, end);
    if (!s->ring) {
        if (end > cap)
            return ctxs__error(CTXS_EFULL,
                               "%u more slots would reach position %" PRIu64 ", past the "
                               "capacity of %" PRIu64 ", and the session is no ring (which "
                               "would overwrite its oldest tokens): nothing was lost; grow it "
                               "(ctxs_store_session_grow(), `ctxstore grow NAME --capacity "
                               "N`)",
                               n, end, cap);
    } else if (end > ns && end - (committed > ns ? committed : ns) > ctxs__ring_len(s)) {
        /* the reservation would overwrite itself */
        return ctxs__error(CTXS_EINVAL,
                           "%u slots (with %u reserved before) are more than the ring "
                           "holds: %" PRIu64 " slots after the %" PRIu64 " sinks",
                           n, s->n_reserved, ctxs__ring_len(s), ns);
    }
    /* A windowed layer's ring has room for its window and the batch: more
     * uncommitted tokens would overwrite the window the current record
     * claims. */
    if (s->lay.n_groups && end - committed > s->lay.batch)
        return ctxs__error(CTXS_EINVAL,
                           "%" PRIu64 " tokens reserved and not committed would be more than "
                           "the batch of %u the windowed layers' rings keep beyond their "
                           "windows: commit first, or create the session with a larger batch",
                           end - committed, s->lay.batch);

    ctxs__span spans[2];
    out->n_spans = ctxs__slot_spans(spans, start, n, s->lay.capacity, s->lay.n_sink);
    for (uint32_t i = 0; i < out->n_spans; i++) {
        out->spans[i].slot = spans[i].slot;
        out->spans[i].count = spans[i].count;
    }
    if ((rc = ctxs__allocate_slots(s, spans[0].slot + spans[0].count)) < 0) {
        memset(out, 0, sizeof(*out));
        return rc;
    }
    /* At ASYNC an open after a power loss keeps every token up to the
     * watermark, and so needs the window of every count from there on:
     * where the windowed rings' slots handed out held a position of the
     * watermark's window, the turns so far are made durable first
     * (ctxs_session_sync()), raising the watermark to the count, whose
     * window lies above those slots. Before the mapping: the sync
     * write-protects what it writes. */
    for (uint32_t g = 0; s->durability == CTXS_SYNC_ASYNC && g < s->lay.n_groups; g++) {
        const ctxs__group *gr = &s->lay.groups[g];
        uint64_t vf = s->st.verified_from, kept = vf > gr->window ? vf - gr->window : 0;
        if (end > gr->len && end - gr->len > kept && vf < s->st.n_tokens) {
            if ((rc = ctxs__sync_turns(s)) < 0) {
                memset(out, 0, sizeof(*out));
                return rc;
            }
            break;
        }
    }
    /* The runway has them mapped already, unless a writeback or the
     * flusher has cleaned its pages since. Else the worker maps them, layer
     * after layer, the order an engine writes them in: its faults then land
     * on the worker's thread while the engine computes, and the write path
     * stores into each layer mapped by then (one that overtakes the worker
     * stops it, see kv_write.c). */
    if (!ctxs__kv_writable(s, start, end, 0, s->lay.n_layers, CTXS__ASK_OWNER | CTXS__ASK_BY_AGE,
                           NULL) &&
        ctxs__background_map(s, start, end) < 0)
        ctxs__map_positions(s, start, end);
    ctxs__runway_adapt(s, n);

    /* The windowed rings' slots handed out held positions [end - len,
     * ...): a record that may survive a power loss, of at least
     * claim_floor tokens, claims the window below its count. Where such a
     * claim below the watermark (never verified) meets those slots, both
     * records take the current state, durably, first: its window lies
     * above them. */
    for (uint32_t g = 0; g < s->lay.n_groups; g++) {
        const ctxs__group *gr = &s->lay.groups[g];
        if (end <= gr->len)
            continue;
        uint64_t a = start > gr->len ? start - gr->len : 0;
        uint64_t b = end - gr->len;
        uint64_t claim = s->claim_floor > gr->window ? s->claim_floor - gr->window : 0;
        if (a < s->st.verified_from && b > claim) {
            if ((rc = ctxs__record_write_both(s, &s->st)) == 0 && (rc = ctxs__sync_meta(s)) == 0)
                s->claim_floor = s->st.n_tokens;
            if (rc < 0) {
                memset(out, 0, sizeof(*out));
                return ctxs__fail(s);
            }
            break;
        }
    }

    /* Evict, and commit the eviction, before the engine may overwrite. */
    uint64_t first = ctxs__first_recent(s, &s->st);
    if (s->ring && end > cap && end - ctxs__ring_len(s) > first) {
        ctxs__state next = s->st;
        next.ring_start = end - ctxs__ring_len(s);
        /* Evicting positions below the watermark: no surviving record may
         * claim them once their slots are rewritten, so both records take
         * the new state and are made durable. The watermark stays: the held
         * positions below it are still durable and untouched. */
        if (first < s->st.verified_from) {
            if ((rc = ctxs__record_write_both(s, &next)) == 0)
                rc = ctxs__sync_meta(s);
        } else {
            rc = ctxs__record_write(s, &next);
        }
        if (rc < 0) {
            memset(out, 0, sizeof(*out));
            return ctxs__fail(s);
        }
    }

    /* C1: in a ring, the positions whose slots were handed out are no
     * longer held; without one they are above the count. */
    CTXS__INVARIANT("C1", !s->ring || end <= cap ||
                              ctxs__first_recent(s, &s->st) >= end - ctxs__ring_len(s));
    out->first_pos = start;
    out->n_tokens = n;
    s->n_reserved += n;
    return 0;
}

static void notify_committed(ctxs_session *s)
{
    if (s->hooks)
        s->hooks->committed(s, s->hooks_arg);
}

/* ASYNC commits between two wake-ups of the worker: half the least
 * runway, so that the runway each wake-up extends stays ahead of a reply
 * decoded a token at a time. Each wake-up starts the writeback of the
 * pages filled since, one sync_file_range() per K/V run, whose cost is
 * mostly per call: Gemma 3 270M decoding a token at a time (36 runs of
 * 512-byte slots) cost the worker 0.96 ms a wake-up when it was woken at
 * each page of slots (8 tokens), 2.5-3 ms every 32 tokens; and the
 * committing thread half as much (69 us a token against 137, where
 * llama.cpp's threads kept the other core busy). */
#define WORKER_STRIDE (CTXS__RUNWAY_MIN_TOKENS / 2)

int ctxs_session_commit(ctxs_session *s, const uint32_t *token_ids, uint32_t n)
{
    ctxs__error_begin();
    CTXS__REQUIRE(s, "the session is NULL");
    CTXS__REQUIRE(token_ids, "token_ids is NULL");
    CTXS__REQUIRE(n > 0, "n is 0: commit at least one token");
    int rc = ctxs__writable(s);
    if (rc < 0)
        return rc;
    CTXS__REQUIRE(n <= s->n_reserved,
                  "a commit of %u tokens, but %u are reserved: reserve them first "
                  "(ctxs_session_reserve())", n, s->n_reserved);

    const uint64_t first = s->st.n_tokens;
    uint32_t *tokens = ctxs__token_table(s);
    uint64_t *table = ctxs__sum_table(s);
    uint64_t sums[CTXS__SUM_BATCH];
    for (uint32_t done = 0; done < n; done += CTXS__SUM_BATCH) {
        uint32_t batch = n - done < CTXS__SUM_BATCH ? n - done : CTXS__SUM_BATCH;
        for (uint32_t i = 0; i < batch; i++)
            tokens[ctxs__slot(s, first + done + i)] = token_ids[done + i];
        ctxs__token_sums(s, first + done, batch, sums);
        for (uint32_t i = 0; i < batch; i++)
            table[ctxs__slot(s, first + done + i)] = sums[i];
        for (uint32_t g = 0; g < s->lay.n_groups; g++) {
            ctxs__group_entry *t = ctxs__group_table(s, g);
            uint32_t len = s->lay.groups[g].len;
            ctxs__group_sums(s, g, first + done, batch, sums);
            for (uint32_t i = 0; i < batch; i++)
                t[(first + done + i) % len] = (ctxs__group_entry){first + done + i, sums[i]};
        }
    }
    s->n_reserved = 0;
    /* Before the sync that would clean what it looks for. */
    if ((rc = ctxs__future_folios_check(s, first + n)) < 0)
        return ctxs__fail(s);

    ctxs__state next = s->st;
    next.n_tokens = first + n;
    switch (s->durability) {
    case CTXS_SYNC_FULL:
        if ((rc = ctxs__sync_data(s->fd)) < 0)
            return ctxs__fail(s);
        next.verified_from = next.n_tokens;
        if ((rc = ctxs__record_write(s, &next)) < 0 || (rc = ctxs__sync_data(s->fd)) < 0)
            return ctxs__fail(s);
        s->claim_floor = next.n_tokens;
        break;
    case CTXS_SYNC_ASYNC:
        if ((rc = ctxs__record_write(s, &next)) < 0)
            return ctxs__fail(s);
        /* The index's batched update, when there is one, syncs first: its
         * syncs would otherwise queue behind the turn's writeback
         * (measured: 0.9 ms alone, 3.2 ms behind a 9 MiB turn). */
        notify_committed(s);
        const uint64_t now = ctxs__monotonic_ms();
        const uint64_t settled =
            atomic_exchange(&s->writeback_settle_ms, now + CTXS__WRITEBACK_SETTLE_MS);
        if (!s->background) {
            /* Here, without a timer: the pages this commit filled, and
             * after a pause what the commits before it left. */
            atomic_store(&s->writeback_whole, settled != 0 && settled <= now);
            ctxs__background_request(s, CTXS__JOB_WRITEBACK);
            return 0;
        }
        /* The worker is woken every WORKER_STRIDE tokens (the runway
         * reaches further), or when it has no settle time to wake for: a
         * token at a time, a wake-up for each is a context switch away
         * from the engine's threads. */
        if (settled == 0 || next.n_tokens < s->worker_woken_at ||
            next.n_tokens - s->worker_woken_at >= WORKER_STRIDE) {
            s->worker_woken_at = next.n_tokens;
            ctxs__background_request(s, CTXS__JOB_WRITEBACK | CTXS__JOB_RUNWAY);
        }
        return 0;
    default:
        if ((rc = ctxs__record_write(s, &next)) < 0)
            return ctxs__fail(s);
        break;
    }
    notify_committed(s);
    ctxs__background_request(s, CTXS__JOB_RUNWAY);
    return 0;
}

int ctxs_session_sync(ctxs_session *s)
{
    ctxs__error_begin();
    CTXS__CHECK(s);
    int rc = ctxs__writable(s);
    if (rc < 0)
        return rc;
    const int any = s->st.verified_from != s->st.n_tokens;
    if ((rc = ctxs__sync_turns(s)) < 0)
        return rc;
    /* The sync wrote the runway's zeros back with the turns, and
     * write-protected them: the worker maps them again. */
    if (any)
        ctxs__background_request(s, CTXS__JOB_RUNWAY);
    return 0;
}

int ctxs__sync_turns(ctxs_session *s)
{
    int rc;
    if (s->st.verified_from == s->st.n_tokens)
        return 0;
    ctxs__populated_forget(s); /* the sync write-protects its pages */
    if ((rc = ctxs__sync_data(s->fd)) < 0)
        return ctxs__fail(s);
    ctxs__state next = s->st;
    next.verified_from = next.n_tokens;
    if ((rc = ctxs__record_write(s, &next)) < 0 || (rc = ctxs__sync_data(s->fd)) < 0)
        return ctxs__fail(s);
    s->claim_floor = next.n_tokens;
    return 0;
}

int ctxs__rollback_state(ctxs__state *out, const ctxs_session *s, uint64_t n)
{
    const ctxs__state *st = &s->st;
    const uint64_t ns = s->lay.n_sink;
    if (n > st->n_tokens)
        return ctxs__error(CTXS_EINVAL, "%" PRIu64 " tokens is more than the %" PRIu64
                           " the session holds", n, st->n_tokens);
    /* n == n_sink needs only the sinks, which the ring never evicts. */
    if (n > ns && n < ctxs__first_recent(s, st))
        return ctxs__error(CTXS_EEVICTED,
                           "the ring overwrote the tokens before position %" PRIu64
                           ": a state of %" PRIu64 " tokens cannot be had again",
                           ctxs__first_recent(s, st), n);
    /* A windowed ring must still hold the window of n: the positions it
     * claims now, and below them those its slots still keep, unless a
     * later position or a reservation took their slots (the entries name
     * the position, the checksum finds a slot rewritten since). */
    for (uint32_t g = 0; g < s->lay.n_groups; g++) {
        uint64_t w = s->lay.groups[g].window, from = n > w ? n - w : 0;
        uint64_t claimed = ctxs__group_from(s, st, g), to = n < claimed ? n : claimed;
        uint64_t bad;
        if (from < to && (bad = ctxs__group_first_bad(s, g, from, to)) < to)
            return ctxs__error(CTXS_EEVICTED,
                               "the layers of window %" PRIu64 " no longer hold position %"
                               PRIu64 ", which a state of %" PRIu64 " tokens reads: their "
                               "ring of %u slots has overwritten it",
                               w, bad, n, s->lay.groups[g].len);
    }
    *out = *st;
    out->n_tokens = n;
    if (n <= ns)
        out->ring_start = 0;
    if (out->verified_from > n)
        out->verified_from = n;
    return 0;
}

/* Whether both records of s's mapping are valid and claim n tokens (C3). */
static int records_claim(const ctxs_session *s, uint64_t n)
{
    for (uint32_t index = 0; index < 2; index++) {
        ctxs__disk_record r;
        memcpy(&r, s->map + (index == 0 ? CTXS__RECORD0_OFF : CTXS__RECORD1_OFF), sizeof(r));
        if (!ctxs__record_valid(&r, index, &s->lay, s->ring) || r.n_tokens != n)
            return 0;
    }
    return 1;
}

int ctxs_session_rollback(ctxs_session *s, uint64_t n_tokens)
{
    ctxs__error_begin();
    CTXS__CHECK(s);
    int rc = ctxs__writable(s);
    if (rc < 0)
        return rc;
    ctxs__state next;
    if ((rc = ctxs__rollback_state(&next, s, n_tokens)) < 0)
        return rc;
    s->n_reserved = 0;
    if (n_tokens == s->st.n_tokens)
        return 0;
    /* The positions from n_tokens on will be committed again: the worker's
     * next writeback starts there, and their pages may be write-protected
     * by the last one. */
    ctxs__populated_forget(s);
    uint64_t rewind = atomic_load(&s->writeback_rewind);
    while (n_tokens < rewind &&
           !atomic_compare_exchange_weak(&s->writeback_rewind, &rewind, n_tokens))
        ;
    /* The dropped positions will be written again with other tokens, and
     * their old checksums still match their old bytes. Were a record that
     * claims them to survive a power loss, or a newer one to claim those
     * positions while their pages still held the old bytes, recovery would
     * splice two histories that both verify. So both records take the new
     * state and are made durable, then the dropped checksums are zeroed and
     * made durable, all before the slots can be rewritten. In that order:
     * zeroed checksums under a surviving old record would fail tokens its
     * watermark vouches for. Two syncs of the few metadata pages; rollbacks
     * are rare. */
    ctxs__state dropped = s->st;
    if ((rc = ctxs__record_write_both(s, &next)) < 0 || (rc = ctxs__sync_meta(s)) < 0)
        return ctxs__fail(s);
    /* (Two records written from a sequence number at the limit: C2's
     * exception.) */
    CTXS__INVARIANT("C3", dropped.seq >= UINT64_MAX - 2 || records_claim(s, n_tokens));
    s->claim_floor = n_tokens;
    if ((forget_held_from(s, &dropped, n_tokens) | forget_groups_from(s, n_tokens)) &&
        (rc = ctxs__sync_meta(s)) < 0)
        return ctxs__fail(s);
    if (s->hooks)
        s->hooks->rolled_back(s, n_tokens, s->hooks_arg);
    /* The runway was forgotten above: without a new one, each reservation
     * of the turn that follows (a regenerated reply, a token at a time)
     * would find its slots unmapped and ask the worker for them, a wake-up
     * and a pass of 2 * n_layers * n_kv_heads calls a token. */
    ctxs__background_request(s, CTXS__JOB_RUNWAY);
    return 0;
}
