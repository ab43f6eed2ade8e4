/*
 * Slots mapped writable ahead of the engine's writes, and what the write
 * path may assume about them.
 *
 * A store into a page of the shared mapping that is not mapped writable
 * costs a page fault (about 2.8 us a 4 KiB page on Linux 6.18 ext4, as
 * much as copying the page three times): ext4's page_mkwrite marks the
 * page dirty and makes the entry writable. So the worker maps the slots of
 * the next turn writable after each commit (the runway), and a reservation
 * beyond it as soon as it is made. The kernel undoes that whenever it
 * writes a page back: writeback write-protects every page it cleans, ours
 * after a commit, the flusher's for any dirty page of an inode dirty for
 * longer than vm.dirty_expire_centisecs (30 s) -- which the runway's own
 * zeros keep it. After a pause of half a minute the next turn's pages are
 * clean again, and every store into them faults.
 *
 * ctxs__populate() records which positions this handle mapped and when,
 * and ctxs__kv_writable() asks the page cache whether those pages are still
 * dirty (cachestat(2), Linux 6.5): a dirty page of a range this handle
 * mapped since it last wrote the range through the file is still mapped
 * writable, since writeback write-protects a page only as it cleans it.
 * The write path (kv_write.c) stores straight into such pages and writes
 * every other range through the file, where no fault can happen.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"
#include "invariant.h"
#include "platform.h"
#include "syscall.h"

/* --- What was mapped -------------------------------------------------------- */

/* How long a layer found writable is taken to stay so without asking the
 * page cache again (ctxs__kv_writable()). The flusher wakes every 5 s
 * (vm.dirty_writeback_centisecs); one that cleans the pages within this
 * costs the calls after it a page fault per page it cleaned, never a wrong
 * byte. Each question costs two cachestat calls of 5-9 us once attention
 * has evicted the kernel's lines too. In the demo's later turns, a token
 * of the reply takes 30-60 ms: at 50 ms a turn asked 150-200 times, and
 * the write path's checks took 3.1-3.4 ms of its writes (medians of three
 * runs); at 250 ms 20-70 times, 2.1-2.8 ms. */
#define SEEN_MS 250u

#ifdef CTXS_TEST_HOOKS
_Atomic uint64_t ctxs__write_path_asks;
_Atomic uint64_t ctxs__folio_splits;
#endif

void ctxs__populated_forget(ctxs_session *s)
{
    pthread_mutex_lock(&ctxs__registry_mutex);
    s->pop_from = s->pop_to = 0;
    atomic_store_explicit(&s->pop_stamp, 0, memory_order_release);
    s->pop_layers = 0;
    pthread_mutex_unlock(&ctxs__registry_mutex);
}

/* A pass over [from, to) begins: returns its stamp. */
static uint64_t pass_begin(ctxs_session *s, uint64_t from, uint64_t to)
{
    uint64_t stamp = atomic_fetch_add(&s->stamp, 1) + 1;
    pthread_mutex_lock(&ctxs__registry_mutex);
    s->pop_from = from;
    s->pop_to = to;
    s->pop_layers = 0;
    atomic_store_explicit(&s->pop_stamp, stamp, memory_order_release);
    pthread_mutex_unlock(&ctxs__registry_mutex);
    return stamp;
}

/* The pass of stamp has mapped the layers below `layers`; nothing, if the
 * record was forgotten or another pass began meanwhile. */
static void pass_progress(ctxs_session *s, uint64_t stamp, uint32_t layers)
{
    pthread_mutex_lock(&ctxs__registry_mutex);
    if (atomic_load_explicit(&s->pop_stamp, memory_order_relaxed) == stamp)
        s->pop_layers = layers;
    pthread_mutex_unlock(&ctxs__registry_mutex);
}

/* Whether every page holding [slot, slot + count) of run `run` (file order)
 * is dirty: 1, 0, or -1 when the system cannot tell. */
static int run_dirty(const ctxs_session *s, uint32_t run, uint32_t slot, uint32_t count)
{
    const ctxs__file_layout *lay = &s->lay;
    int d = ctxs__range_dirty(s->fd,
                              lay->kv_off + ctxs__run_off(lay, run) +
                                  (uint64_t)slot * lay->slot_bytes,
                              (uint64_t)count * lay->slot_bytes);
    if (d != 1 || !lay->scales_bytes)
        return d;
    return ctxs__range_dirty(s->fd,
                             lay->scales_off + ctxs__run_scales_off(lay, run) +
                                 (uint64_t)slot * 4,
                             (uint64_t)count * 4);
}

/* Whether every page holding positions [from, to) of layers [l0, l1) is
 * dirty: 1, 0, or -1 when the system cannot tell. The flusher cleans the
 * pages of an inode in file order, so the first and the last run of the
 * range tell for the runs between (a race with it costs some faults, never
 * a wrong byte). */
static int layers_dirty(const ctxs_session *s, uint64_t from, uint64_t to, uint32_t l0,
                        uint32_t l1)
{
    CTXS__COUNT_WRITE_PATH_ASK();
    const uint32_t heads = s->lay.n_kv_heads;
    const uint32_t first_run = l0 * 2 * heads, last_run = l1 * 2 * heads - 1;
    ctxs__span spans[2], last[2];
    uint32_t n_spans = ctxs__layer_spans(spans, &s->lay, l0, from, to - from);
    uint32_t n_last = ctxs__layer_spans(last, &s->lay, l1 - 1, from, to - from);
    for (uint32_t i = 0; i < n_spans || i < n_last; i++) {
        int a = i < n_spans ? run_dirty(s, first_run, spans[i].slot, spans[i].count) : 1;
        int b = a == 1 && i < n_last ? run_dirty(s, last_run, last[i].slot, last[i].count) : a;
        if (b != 1)
            return b;
    }
    return 1;
}

/* Whether layer l's positions [from, to) were found writable less than
 * SEEN_MS ago, by the pass still on record, with no commit and no write
 * through the file since. Without the registry mutex: the write path asks
 * this 2 * n_layers times a token, with its lines evicted by attention's
 * reads since the last time. */
static int seen_lately(const ctxs_session *s, const ctxs__layer_seen *seen, uint32_t l,
                       uint64_t from, uint64_t to, uint64_t now)
{
    const uint64_t stamp = atomic_load_explicit(&s->pop_stamp, memory_order_acquire);
    return stamp && seen->stamp == stamp && seen->committed == s->st.n_tokens &&
           seen->from <= from && to <= seen->to && now - seen->at_ms < SEEN_MS &&
           !(s->file_written &&
             atomic_load_explicit(&s->file_written[l], memory_order_relaxed) > stamp);
}

int ctxs__kv_writable(ctxs_session *s, uint64_t from, uint64_t to, uint32_t l0, uint32_t l1,
                      unsigned how, uint64_t *pending)
{
    if (pending)
        *pending = 0;
    /* One layer asked again soon after it was found writable, within what
     * the page cache was asked about then: a reply decoded a token at a
     * time asks 2 * n_layers times a token, and two cachestat calls each
     * would cost more than its copies. What the page cache is asked about
     * is the rest of what the pass mapped, where the next calls fall, in
     * this layer and in the mapped layers after it that the owner has not
     * written through the file since: the next layers of the same token.
     * A token takes longer than SEEN_MS once attention reads a long
     * context (tinychat, 36 layers over 1,000 tokens: 30-60 ms), and a
     * question per layer then cost each token 72 cachestat calls of 2-5 us
     * with the caches cold from attention (7-12 ms of a 170-token reply's
     * 25 ms of write_layer in the demo); one for the token's layers costs
     * it two. A commit since starts writeback, which cleans the page its
     * last slots share with the next ones. */
    ctxs__layer_seen *seen =
        (how & CTXS__ASK_OWNER) && s->seen && l1 == l0 + 1 ? &s->seen[l0] : NULL;
    const uint64_t now = seen ? ctxs__monotonic_ms() : 0;
    if (seen && seen_lately(s, seen, l0, from, to, now))
        return 1;
    pthread_mutex_lock(&ctxs__registry_mutex);
    uint64_t pop_from = s->pop_from, pop_to = s->pop_to, stamp = s->pop_stamp;
    uint32_t layers = s->pop_layers;
    pthread_mutex_unlock(&ctxs__registry_mutex);
    if (!(pop_to && pop_from <= from && to <= pop_to))
        return 0;
    /* A page written through the file after the pass mapped it may have
     * been cleaned in between, then dirtied by the write with its entry
     * still write-protected. */
    for (uint32_t l = l0; (how & CTXS__ASK_OWNER) && s->file_written && l < l1; l++)
        if (atomic_load_explicit(&s->file_written[l], memory_order_relaxed) > stamp)
            return 0;
    if (l1 > layers) {
        /* A pass on its way: it maps these layers after whatever the
         * caller writes now. */
        if (pending)
            *pending = stamp;
        return 0;
    }
    if (seen) {
        to = pop_to;
        while (l1 < layers && l1 < s->lay.n_layers &&
               !(s->file_written &&
                 atomic_load_explicit(&s->file_written[l1], memory_order_relaxed) > stamp))
            l1++;
    }
    int d = 1;
    if (how & CTXS__ASK_OWNER) {
        d = layers_dirty(s, from, to, l0, l1);
        /* A question widened above to the token's next layers, some of
         * them cleaned: the flusher may be on its way through the file;
         * the layer asked about may still be writable. A question about
         * several layers is answered for all of them. */
        if (d == 0 && seen && l1 > l0 + 1)
            d = layers_dirty(s, from, to, l0, l1 = l0 + 1);
    } else {
        /* The worker, deciding whether to map the runway again, asks
         * about every layer: the flusher writes an inode back in chunks,
         * each from where the last one stopped, so a pass may clean any
         * stretch of the layers. Asked about the first and last layer,
         * then the first alone, it left a runway cleaned after its first
         * layer unmapped for good, and every later turn went through the
         * file or faulted (the slow path that every turn of one cell in 18
         * of bench_session took, 10-16 ms against 2). Two cachestat calls
         * a layer, on its own thread, after a commit and twice a second
         * while it keeps the runway. */
        for (uint32_t l = l0; d == 1 && l < l1; l++)
            d = layers_dirty(s, from, to, l, l + 1);
    }
    if (d < 0)
        return (how & CTXS__ASK_BY_AGE) &&
               ctxs__monotonic_ms() - atomic_load(&s->runway_at_ms) < CTXS__RUNWAY_FRESH_MS;
    if (d == 0)
        return 0;
    for (uint32_t l = l0; seen && l < l1; l++)
        s->seen[l] = (ctxs__layer_seen){stamp, s->st.n_tokens, from, to, now};
    return 1;
}

/* --- Mapping ---------------------------------------------------------------- */

/* Maps the spans' pages of positions [from, to) writable, one call per run
 * and span, layer after layer (the order an engine writes in), publishing
 * each layer as it is done. Pages whose blocks hold data, such as the page
 * a turn shares with the last one, or slots written back after a runway,
 * are read ahead first: the KV is mapped MADV_RANDOM, and after a cold open
 * each of them would otherwise be its own 4 KiB read (measured: 1.2 s for
 * the first reserve of a resumed demo chat). Unwritten blocks read as
 * zeros, without I/O. Only an optimisation: errors are ignored. */
static void populate(ctxs_session *s, uint64_t from, uint64_t to)
{
#ifdef MADV_POPULATE_WRITE
    const ctxs__file_layout *lay = &s->lay;
    const uint32_t runs_per_layer = 2 * lay->n_kv_heads;
    ctxs__span spans[2];
    uint32_t n_spans;
    for (uint32_t run = 0; run < lay->n_layers * runs_per_layer; run++)
        for (uint32_t i = 0,
                      k = ctxs__layer_spans(spans, lay, run / runs_per_layer, from, to - from);
             i < k; i++)
            posix_fadvise(s->fd,
                          (off_t)(lay->kv_off + ctxs__run_off(lay, run) +
                                  (uint64_t)spans[i].slot * lay->slot_bytes),
                          (off_t)((uint64_t)spans[i].count * lay->slot_bytes), POSIX_FADV_WILLNEED);
    const uint64_t stamp = pass_begin(s, from, to);
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (uint32_t layer = 0; layer < lay->n_layers; layer++) {
        /* The engine has written this layer through the file since this
         * pass began, and nothing will store into it again (kv_write.c). */
        if (s->file_written && atomic_load(&s->file_written[layer]) > stamp) {
            pass_progress(s, stamp, layer + 1);
            continue;
        }
        n_spans = ctxs__layer_spans(spans, lay, layer, from, to - from);
        for (uint32_t run = layer * runs_per_layer; run < (layer + 1) * runs_per_layer; run++) {
            uintptr_t base = (uintptr_t)(s->map + lay->kv_off + ctxs__run_off(lay, run));
            for (uint32_t i = 0; i < n_spans; i++) {
                uintptr_t a = (base + (uintptr_t)spans[i].slot * lay->slot_bytes) & ~(page - 1);
                uintptr_t b = base + (uintptr_t)(spans[i].slot + spans[i].count) * lay->slot_bytes;
                if (madvise((void *)a, b - a, MADV_POPULATE_WRITE) != 0)
                    return; /* EINVAL before Linux 5.14: fault on access */
            }
            /* A Q8 session's scales of the same slots: a page of each run's
             * table, which would otherwise cost a write fault per run in
             * the turn (the table was allocated at create, and is read
             * ahead with the window). */
            base = (uintptr_t)(s->map + lay->scales_off + ctxs__run_scales_off(lay, run));
            for (uint32_t i = 0; lay->scales_bytes && i < n_spans; i++) {
                uintptr_t a = (base + (uintptr_t)spans[i].slot * 4) & ~(page - 1);
                uintptr_t b = base + (uintptr_t)(spans[i].slot + spans[i].count) * 4;
                if (madvise((void *)a, b - a, MADV_POPULATE_WRITE) != 0)
                    return;
            }
        }
        pass_progress(s, stamp, layer + 1);
    }
    atomic_store(&s->runway_at_ms, ctxs__monotonic_ms());
#else
    (void)s, (void)from, (void)to;
#endif
}

void ctxs__runway_keep(ctxs_session *s)
{
    pthread_mutex_lock(&ctxs__registry_mutex);
    const uint64_t from = s->pop_from, to = s->pop_to;
    pthread_mutex_unlock(&ctxs__registry_mutex);
    if (s->readonly || !to ||
        ctxs__kv_writable(s, from, to, 0, s->lay.n_layers, CTXS__ASK_BY_AGE, NULL))
        return;
    populate(s, from, to);
}

/* Whether every slot of positions [from, to) has disk blocks (R1). */
static int slots_allocated(ctxs_session *s, uint64_t from, uint64_t to)
{
    ctxs__span spans[2];
    uint32_t k = ctxs__slot_spans(spans, from, to - from, s->lay.capacity, s->lay.n_sink);
    uint32_t have = atomic_load(&s->alloc_end);
    for (uint32_t i = 0; i < k; i++)
        if (spans[i].slot + (uint64_t)spans[i].count > have)
            return 0;
    return 1;
}

void ctxs__map_positions(ctxs_session *s, uint64_t from, uint64_t to)
{
    CTXS__INVARIANT("R1", slots_allocated(s, from, to));
    populate(s, from, to);
}

/* --- The runway --------------------------------------------------------------
 *
 * After each commit the worker allocates and maps writable the slots of the
 * next positions, as many as twice the largest of the last reservations
 * (at least CTXS__RUNWAY_MIN_TOKENS, at most RUNWAY_MAX_BYTES of KV), so
 * that the next reserve finds them ready and costs microseconds. A reserve
 * beyond the runway does the work itself, as it always did, and a full
 * disk is still CTXS_EFULL from reserve: the runway gives up quietly and
 * maps only slots that have blocks. Mapping a page writable dirties it, so the
 * worker's writeback covers committed slots only (not the runway's zeros),
 * and at FULL, whose fdatasync would write those zeros on the commit's
 * path, the runway only allocates.
 *
 * Invariant R1: a slot is mapped writable ahead of the engine (the runway,
 *   a reservation's map job, ctxs__map_positions()) only once it has disk
 *   blocks (below alloc_end): a store into it then never needs new blocks,
 *   where a full disk would be a SIGBUS instead of CTXS_EFULL from reserve.
 * Invariant R2: the runway covers positions from the count on, at most
 *   the capacity without a ring and at most the ring's length with one, so
 *   that it never maps a slot that a held position still uses.
 */
#define RUNWAY_MAX_BYTES (128u << 20)

/* want tokens, within the bounds above. */
static uint32_t runway_clamp(const ctxs_session *s, uint64_t want)
{
    const ctxs__file_layout *lay = &s->lay;
    uint64_t most = RUNWAY_MAX_BYTES / ((uint64_t)lay->slot_bytes * 2 * lay->n_layers * lay->n_kv_heads);
    want = want < CTXS__RUNWAY_MIN_TOKENS ? CTXS__RUNWAY_MIN_TOKENS : want;
    want = want > most ? most : want;
    /* Never more than a ring can hold without overwriting itself. */
    uint64_t room = s->ring ? ctxs__ring_len(s) : lay->capacity;
    want = want > room ? room : want;
    return (uint32_t)(want ? want : 1);
}

void ctxs__runway_adapt(ctxs_session *s, uint32_t n)
{
    s->recent_reserves[s->recent_next++ % 4] = n;
    uint32_t most = 0;
    for (int i = 0; i < 4; i++)
        most = s->recent_reserves[i] > most ? s->recent_reserves[i] : most;
    atomic_store(&s->runway_tokens, runway_clamp(s, 2ull * most));
}

void ctxs__runway_prepare(ctxs_session *s, const ctxs__state *st)
{
    if (s->readonly)
        return;
    uint32_t len = atomic_load(&s->runway_tokens);
    uint64_t first = st->n_tokens, end = first + (len ? len : runway_clamp(s, 0));
    if (!s->ring && end > s->lay.capacity)
        end = s->lay.capacity;
    if (first >= end ||
        ctxs__kv_writable(s, first, end, 0, s->lay.n_layers, CTXS__ASK_BY_AGE, NULL))
        return;
    CTXS__INVARIANT("R2", end - first <= (s->ring ? ctxs__ring_len(s) : s->lay.capacity) &&
                              (s->ring || end <= s->lay.capacity));
    ctxs__span spans[2];
    ctxs__slot_spans(spans, first, end - first, s->lay.capacity, s->lay.n_sink);
    if (ctxs__allocate_slots(s, spans[0].slot + spans[0].count) < 0)
        return;
    if (s->durability == CTXS_SYNC_FULL)
        return;
    CTXS__INVARIANT("R1", slots_allocated(s, first, end));
    populate(s, first, end);
}

/* --- Large folios over the slots still to be written ------------------------ */

/*
 * Linux keeps a file's page cache in folios of up to 2 MiB where it reads
 * ahead (ext4 since 6.16, XFS since 5.18): a read() of a session file by
 * any process (a backup, cp, cat) leaves its pages, the empty slots
 * included, in such folios. The kernel marks a folio dirty, and writes it
 * back, as a whole: a turn's 16 KiB of a run stored into a 2 MiB folio
 * has all of it written. Measured on Linux 6.18 ext4, Qwen3-4B's geometry
 * at 1,024 of 2,048 tokens, after one read() of the file: each 64-token
 * turn (9 MiB of K/V) dirtied 271 MiB, turn after turn, as long as those
 * pages stayed cached. The library's own faults (the mapping is
 * MADV_RANDOM) and read-ahead (POSIX_FADV_WILLNEED) bring pages in a page
 * at a time, and make no such folios.
 *
 * The slots past the held positions are where every later turn writes,
 * and they hold nothing: punching them, as a compaction does, drops their
 * pages and splits each folio that reaches into them, and later turns
 * write into pages of their own size (the same turns then dirtied 9 MiB
 * each; the punch took 72 ms for the 576 runs). A Q8 session's scales of
 * those slots are zeroed in place instead (FALLOC_FL_ZERO_RANGE, which
 * splits the same way and keeps the blocks the table was created with;
 * where a file system zeroes by allocating anew and cannot, the next
 * reserve allocates them again before anything maps them).
 *
 * A commit asks, at most once a second, whether any page past the slots
 * this handle allocated is dirty, in the first and the last global run,
 * before the commit's sync: only a folio that reaches there from the
 * turn's slots is. Nothing of this handle's own is dirty there (its
 * runway maps only allocated slots, R1), and an earlier handle's runway
 * past the count is written back at its close (background.c); a process
 * that died with its runway dirty can cost its successor one needless
 * sync and punch. Where the system cannot tell (no cachestat), or once a
 * punch has failed, nothing is done. The sync's error fails the commit,
 * as the commit's own sync would; at NONE, which syncs nothing, it fails
 * the next call instead (the kernel reports it to one sync only).
 */

/* Dirty pages past slot `from` of run `run`, or -1: the pages wholly in
 * the run (a run that ends inside a page shares it with the next run's
 * first slots, which the runway maps and writes). */
static int64_t dirty_past(const ctxs_session *s, uint32_t run, uint32_t from)
{
    const ctxs__file_layout *lay = &s->lay;
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    const uint64_t base = lay->kv_off + ctxs__run_off(lay, run);
    const uint64_t lo = (base + (uint64_t)from * lay->slot_bytes + page - 1) / page * page;
    const uint64_t hi = (base + (uint64_t)lay->capacity * lay->slot_bytes) / page * page;
    return lo < hi ? ctxs__range_pages_dirty(s->fd, lo, hi - lo) : 0;
}

/* Dirty pages past what the handle allocated in the first or the last
 * global run (runs[]), or 0 where none or the system cannot tell. */
static int64_t future_dirty(const ctxs_session *s, const uint32_t runs[2])
{
    const uint32_t alloc_end = atomic_load(&s->alloc_end);
    int64_t dirty = 0;
    for (uint32_t i = 0; i < 2 && dirty == 0; i++)
        dirty = dirty_past(s, runs[i], alloc_end);
    return dirty > 0 ? dirty : 0;
}

/* Zeroes the scales of slots [from, capacity) of every global run in
 * place. Returns 0, or nonzero where it could not. A file system that
 * zeroes by freeing the blocks and allocating new ones (XFS) may leave
 * holes where that fails: alloc_end is set below them, and allocating
 * slots allocates their scales too (commit.c), before anything maps them,
 * in this handle or a later one. */
static int zero_unheld_scales(const ctxs_session *s, uint32_t from)
{
#ifdef FALLOC_FL_ZERO_RANGE
    const ctxs__file_layout *lay = &s->lay;
    const uint32_t runs = 2 * lay->n_layers * lay->n_kv_heads;
    for (uint32_t run = 0; run < runs; run++) {
        if (ctxs__layer_group(lay, run / (2 * lay->n_kv_heads)) >= 0)
            continue;
        const uint64_t off = lay->scales_off + ctxs__run_scales_off(lay, run) + (uint64_t)from * 4;
        const uint64_t len = (uint64_t)(lay->capacity - from) * 4;
        if (ctxs__fallocate(s->fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, (off_t)off,
                            (off_t)len) != 0)
            return 1;
    }
    return 0;
#else
    (void)s, (void)from;
    return 1;
#endif
}

int ctxs__future_folios_check(ctxs_session *s, uint64_t n)
{
    const ctxs__file_layout *lay = &s->lay;
    const uint64_t now = ctxs__monotonic_ms();
    if (s->folios_given_up || n >= lay->capacity ||
        now - s->folios_checked_ms < CTXS__FOLIO_CHECK_MS)
        return 0;
    s->folios_checked_ms = now;
    uint32_t first = lay->n_layers, last = 0;
    for (uint32_t l = 0; l < lay->n_layers; l++)
        if (ctxs__layer_group(lay, l) < 0) {
            first = first < l ? first : l;
            last = l;
        }
    if (first == lay->n_layers)
        return 0;
    const uint32_t heads = lay->n_kv_heads;
    const uint32_t runs[2] = {first * 2 * heads, (last * 2 + 2) * heads - 1};
    if (!future_dirty(s, runs))
        return 0;
    /* The worker is held off from here: its runway allocates and maps
     * (dirties) the slots about to be punched, and a map job still queued
     * for a reservation this commit released in part is cut at n. A folio
     * splits only once it is clean (ext4 cannot release the buffers of a
     * dirty one), so the pages written so far go to the disk first, as
     * they would have soon. The commit has released what it does not
     * commit, and no record claims a slot from n on: the runs' slots from
     * there are unheld. Whatever was punched is allocated again by the
     * next reserve. */
    const uint32_t from = (uint32_t)n;
    ctxs__background_hold(s);
    /* Asked again: the worker's runway may have allocated and mapped
     * further meanwhile, its own zeros then dirty past what was read. */
    if (!future_dirty(s, runs)) {
        ctxs__background_release(s);
        return 0;
    }
    CTXS__COUNT_FOLIO_SPLIT();
    pthread_mutex_lock(&ctxs__registry_mutex);
    if (s->map_to > from)
        s->map_to = from;
    if (s->map_from >= s->map_to)
        atomic_fetch_and(&s->jobs, ~(unsigned)CTXS__JOB_MAP);
    pthread_mutex_unlock(&ctxs__registry_mutex);
    int rc = ctxs__sync_data(s->fd);
    if (rc < 0) {
        ctxs__background_release(s);
        if (s->durability != CTXS_SYNC_NONE)
            return rc;
        /* At NONE this commit syncs nothing, so it does not fail; but the
         * kernel reports a writeback error to one sync only, and this one
         * took it: the next call fails instead (as for the worker's), so
         * that a ctxs_session_sync() never vouches for pages the disk
         * did not take. */
        ctxs__writeback_failed(s, rc);
        return 0;
    }
    int punched = ctxs__punch_unheld(s, from);
    if (punched == 0 && lay->scales_bytes)
        punched = zero_unheld_scales(s, from);
    atomic_store(&s->alloc_end, from); /* the committed slots have blocks */
    ctxs__populated_forget(s);
    ctxs__background_release(s);
    s->folios_given_up = punched != 0; /* it would fail, and sync, each second */
    return 0;
}
