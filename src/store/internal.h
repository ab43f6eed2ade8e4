/*
 * The session handle and the helpers its files share: src/store's own.
 * What code outside src/store may ask of a session is session_iface.h.
 */
#ifndef CTXS_STORE_INTERNAL_H
#define CTXS_STORE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "ctxstore.h"
#include "format.h"
#include "last_error.h"
#include "session_iface.h"

struct ctxs_session {
    int fd;
    int readonly;
    int ring;
    int verify_always;    /* opened with CTXS_OPEN_VERIFY */
    int failed;           /* a sync failed: every write call refuses */
    uint8_t *map;         /* the whole file, MAP_SHARED */
    size_t map_bytes;
    ctxs__file_layout lay;
    ctxs_model model;
    uint32_t format_major;
    uint32_t format_minor;
    uint64_t created_unix_ms;

    ctxs__state st;        /* what the current record says */
    uint32_t cur_record;  /* 0 or 1: the current record; commits write the other */

    uint32_t n_reserved;  /* positions st.n_tokens .. + n_reserved are reserved */
    /* A writer's: no record with fewer tokens can survive a power loss
     * (the count of the last record made durable, or at open the smaller
     * of the two). What the windowed rings' slots may reuse (commit.c). */
    uint64_t claim_floor;
    /* Slots [0, alloc_end) have disk blocks. Raised by reserve and by the
     * runway (runway.c); lowered only by the owner, with the worker
     * held off, when it punches the slots past the held positions
     * (ctxs__future_folios_check()). */
    _Atomic uint32_t alloc_end;

    uint32_t window;
    uint32_t pressure_window; /* 0: half of window */
    uint32_t attn_period, attn_window, attn_global_mask; /* ctxs_open_options */
    uint32_t durability;
    uint32_t open_flags;  /* CTXS_INFO_RECOVERED | CTXS_INFO_VERIFIED */
    uint64_t lost_tokens;

    /* Background work (background.c): what the owner asks of the worker
     * thread, and what the worker leaves for the owner. */
    uint32_t background;          /* the option: 0 = no worker, ever */
    atomic_uint jobs;             /* CTXS__JOB_* asked for, not yet taken */
    atomic_int closing;           /* close waits: stop at the next chunk */
    int held;                     /* the owner keeps the worker off the
                                     session (registry mutex) */
    atomic_int writeback_error;   /* -errno the worker met, for the owner */
    pthread_mutex_t record_mutex; /* a record written, or the records
                                     unvouched (ctxs__writeback_failed()) */
    _Atomic uint64_t writeback_rewind; /* a rollback's point: write back from
                                          there (UINT64_MAX: none) */
    /* At ASYNC a commit's writeback (the worker's, or the commit's own
     * without one) covers only the pages commits have filled; the rest
     * once commits have paused until this (monotonic ms; 0: nothing held
     * back), or when asked (writeback_whole), or at close. */
    _Atomic uint64_t writeback_settle_ms;
    atomic_int writeback_whole;
    /* What this handle has mapped writable (runway.c's passes: the runway,
     * a reservation's map job, or reserve itself without a worker), for
     * the write path (kv_write.c): positions [pop_from, pop_to) in every
     * layer below pop_layers, by the pass that began at stamp pop_stamp;
     * pop_to == 0: nothing known. Under the registry mutex; forgotten
     * (ctxs__populated_forget()) by a sync, a rollback and memory
     * pressure. The worker's writeback leaves it: the pages it cleans are
     * found clean (ctxs__kv_writable()). pop_stamp is also read without
     * the mutex: while it stays the same, so do pop_from and pop_to, and
     * pop_layers only grows. */
    uint64_t pop_from, pop_to;
    _Atomic uint64_t pop_stamp;
    uint32_t pop_layers;
    _Atomic uint64_t stamp;         /* counts passes and writes through the file */
    _Atomic uint64_t runway_at_ms;  /* when the last pass ended (monotonic) */
    _Atomic uint64_t runway_keep_until_ms; /* the worker keeps the runway
                                              writable until then */
    _Atomic uint32_t runway_tokens; /* how far ahead the runway reaches */
    uint64_t map_from, map_to;    /* CTXS__JOB_MAP's positions (mutex) */
    uint32_t recent_reserves[4];  /* owner: the last reservations' sizes */
    uint64_t folios_checked_ms;   /* owner: ctxs__future_folios_check() */
    int folios_given_up;          /* owner: a punch failed, no more checks */
    uint64_t worker_woken_at;     /* owner: tokens at the last ASYNC commit
                                     that woke the worker */
    uint32_t recent_next;
    /* Per layer, the stamp of the write path's last write through the file
     * (kv_write.c): set by the owner, read by the worker's passes, which
     * skip a layer written after they began. A writer's only. */
    _Atomic uint64_t *file_written;
    /* Owner only: per layer, the positions last found writable
     * (ctxs__kv_writable()); and the write path's staging buffer, made at
     * its first use. */
    struct ctxs__layer_seen *seen;
    uint8_t *bounce;
    /* Worker only. */
    uint64_t written_back_to;     /* positions below: writeback started */
    uint32_t warm_advised;        /* runs of the bring-in read ahead */
    uint32_t warm_mapped;         /* runs of the bring-in mapped */

    const ctxs__session_hooks *hooks; /* NULL unless opened through a store */
    void *hooks_arg;

    /* The registry of open sessions (registry.c). */
    struct ctxs_session *prev, *next;
};


/* 0, or CTXS_EINVAL naming the index out of range, for a run of s. */
static inline int ctxs__check_run(const ctxs_session *s, uint32_t layer, uint32_t kind,
                                  uint32_t head)
{
    if (!s)
        return ctxs__error(CTXS_EINVAL, "the session is NULL");
    if (layer >= s->lay.n_layers)
        return ctxs__error(CTXS_EINVAL, "layer %u is outside 0..%u", layer,
                           s->lay.n_layers - 1);
    if (kind > CTXS_V)
        return ctxs__error(CTXS_EINVAL, "kind %u is neither CTXS_K (0) nor CTXS_V (1)", kind);
    if (head >= s->lay.n_kv_heads)
        return ctxs__error(CTXS_EINVAL, "head %u is outside 0..%u", head,
                           s->lay.n_kv_heads - 1);
    return 0;
}

static inline uint64_t ctxs__ring_len(const ctxs_session *s)
{
    return (uint64_t)s->lay.capacity - s->lay.n_sink;
}

/* First position after the sinks that st holds. */
static inline uint64_t ctxs__first_recent(const ctxs_session *s,
                                          const ctxs__state *st)
{
    uint64_t ns = s->lay.n_sink;
    return st->ring_start > ns ? st->ring_start : ns;
}

/* 1 if st holds position p. */
static inline int ctxs__holds(const ctxs_session *s, const ctxs__state *st,
                              uint64_t p)
{
    if (p >= st->n_tokens)
        return 0;
    return p < s->lay.n_sink || p >= ctxs__first_recent(s, st);
}

static inline uint32_t ctxs__slot(const ctxs_session *s, uint64_t p)
{
    return ctxs__slot_of(p, s->lay.capacity, s->lay.n_sink);
}

/* The [slots][head_dim] run of (layer, kind, head): capacity slots, or a
 * windowed group's ring (ctxs__layer_cap()). */
static inline uint8_t *ctxs__run(const ctxs_session *s, uint32_t layer,
                                 uint32_t kind, uint32_t head)
{
    uint32_t run = (layer * 2 + kind) * s->lay.n_kv_heads + head;
    return s->map + s->lay.kv_off + ctxs__run_off(&s->lay, run);
}

/* The [slots] scales of a run, for a session with a scale table. */
static inline float *ctxs__scales_run(const ctxs_session *s, uint32_t layer,
                                      uint32_t kind, uint32_t head)
{
    uint32_t run = (layer * 2 + kind) * s->lay.n_kv_heads + head;
    return (float *)(void *)(s->map + s->lay.scales_off + ctxs__run_scales_off(&s->lay, run));
}

/* A windowed group's checksum table: ctxs__group_entry per slot of its
 * ring. */
static inline ctxs__group_entry *ctxs__group_table(const ctxs_session *s, uint32_t g)
{
    return (ctxs__group_entry *)(void *)(s->map + s->lay.groups[g].table_off);
}

/* The positions st's windowed group g holds: the last `window` positions,
 * [ctxs__group_from(), n_tokens). */
static inline uint64_t ctxs__group_from(const ctxs_session *s, const ctxs__state *st,
                                        uint32_t g)
{
    uint64_t w = s->lay.groups[g].window;
    return st->n_tokens > w ? st->n_tokens - w : 0;
}

static inline uint32_t *ctxs__token_table(const ctxs_session *s)
{
    return (uint32_t *)(void *)(s->map + s->lay.tokens_off);
}

static inline uint64_t *ctxs__sum_table(const ctxs_session *s)
{
    return (uint64_t *)(void *)(s->map + s->lay.sums_off);
}

/* The checksum of position pos in its slot with its token id: XXH3-64 of
 * (pos, token id), then chained over the slot's bytes in every (layer,
 * K|V, head) run, in file order. Computes n consecutive positions at once,
 * run by run, so that memory is read in long sequential stretches.
 * n <= CTXS__SUM_BATCH. */
#define CTXS__SUM_BATCH 256u
void ctxs__token_sums(const ctxs_session *s, uint64_t first_pos, uint32_t n,
                      uint64_t *out);

/* The checksums of positions [first_pos, first_pos + n) over windowed
 * group g's layers (n <= CTXS__SUM_BATCH), from their slots in its ring. */
void ctxs__group_sums(const ctxs_session *s, uint32_t g, uint64_t first_pos, uint32_t n,
                      uint64_t *out);

/* Verifies positions [from, to) of windowed group g: each slot's entry
 * names its position and its checksum holds. Returns the first that
 * fails, or to. */
uint64_t ctxs__group_first_bad(const ctxs_session *s, uint32_t g, uint64_t from, uint64_t to);

/* CTXS_EEVICTED for position pos, which the ring overwrote, saying what
 * the session holds (tokens.c). */
int ctxs__evicted(const ctxs_session *s, uint64_t pos);

/* Tokens st holds in slots. */
uint64_t ctxs__held(const ctxs_session *s, const ctxs__state *st);

/* Verifies held positions [from, to); returns the first that fails, or to. */
uint64_t ctxs__first_bad(const ctxs_session *s, uint64_t from, uint64_t to);

/* Reads both records from the mapping (ctxs__records_from_map) and returns
 * the newest valid one's state in *st and its index in *index. Returns 0,
 * or CTXS_ECORRUPT when neither holds. *other_valid says whether the other
 * record was valid too. */
int ctxs__records_read(const ctxs_session *s, ctxs__state *st, uint32_t *index,
                       int *other_valid, uint8_t boot_id[16]);

/* What recovery would keep of the leading positions [0, n) of a file
 * mapped read-only at map, with layout lay and state st (n at most the
 * leading positions st holds): the first at or above st->verified_from
 * whose checksum fails, or n. For the index's cheap checks (peek.c). */
uint64_t ctxs__leading_kept(const uint8_t *map, const ctxs__file_layout *lay, int ring,
                            const ctxs__state *st, uint64_t n);

/* Recovery at open: verifies held tokens at or above st->verified_from;
 * evicts failing tokens at the front of a wrapped ring, then cuts *st at
 * the first failing token. Returns the number of held tokens dropped. */
uint64_t ctxs__recover(const ctxs_session *s, ctxs__state *st);

/* Writes st as the next record (the one that is not current) and makes it
 * current. Does not sync. Returns 0 or -errno. */
int ctxs__record_write(ctxs_session *s, const ctxs__state *st);

/* Writes st into both records (seq + 1 and seq + 2), so that once synced no
 * record of an earlier state survives, even if a later one is torn. */
int ctxs__record_write_both(ctxs_session *s, const ctxs__state *st);

/* Makes everything before the KV region durable (records, tables). */
int ctxs__sync_meta(ctxs_session *s);

/* Zeroes the checksums of the slots the state does not hold: a commit
 * attempt that died before its record leaves checksums that match their
 * bytes, and a later record claiming those positions must never find them.
 * Returns whether any was set. */
int ctxs__forget_unheld(ctxs_session *s);

/* A sync failed: mark the session failed and make sure a later open in this
 * boot still verifies (the page cache can no longer be trusted). */
int ctxs__fail(ctxs_session *s);

/* Clears the records' boot id, so that any later open verifies (ctxs__fail()
 * and ctxs__writeback_failed()). */
void ctxs__unvouch(ctxs_session *s);

/* A writeback of the session's pages failed with rc (-errno), on any
 * thread: the owner's next call fails (ctxs__writable()), and the records
 * are unvouched now, so that a process killed before that call leaves a
 * file the next open verifies. A record written meanwhile is unvouched by
 * its writer (ctxs__record_write()). */
void ctxs__writeback_failed(ctxs_session *s, int rc);

/* The open sessions of this process (registry.c). Memory pressure walks
 * them under the mutex. */
extern pthread_mutex_t ctxs__registry_mutex;
extern ctxs_session *ctxs__registry_head;
void ctxs__registry_add(ctxs_session *s);
void ctxs__registry_remove(ctxs_session *s);
/* Sets s's state and current record, or its window, under the mutex: the
 * thread that sets memory pressure reads them for every open session. */
void ctxs__registry_set_state(ctxs_session *s, const ctxs__state *st, uint32_t cur_record);
void ctxs__registry_set_window(ctxs_session *s, uint32_t window);

/* --- The write path (kv_write.c, kv_io.c, runway.c) -------------------- */

/* Where the K and V of the tokens being written lie in the engine's memory:
 * head h of token t of layer l (counted from the call's first layer) at
 * k + l * layer_stride + t * token_stride + h * head_dim elements of
 * dtype (the same offsets into v); for Q8 handed over as Q8, its scale at
 * k_scales + l * scale_layer_stride + t * scale_token_stride + h * 4 (not
 * necessarily aligned). */
typedef struct ctxs__kv_src {
    const uint8_t *k, *v;
    const uint8_t *k_scales, *v_scales;
    uint32_t dtype;
    size_t token_stride, layer_stride;
    size_t scale_token_stride, scale_layer_stride;
} ctxs__kv_src;

/* 1 for the forms K/V may be handed over in to a session of dtype stored:
 * F32, F16, BF16, or stored itself. */
int ctxs__src_dtype_ok(uint32_t src_dtype, uint32_t stored);

/* One head of one token in the engine's form src_dtype (elements at src,
 * for Q8 its scale at src_scale) as the session stores it: head_dim
 * elements to dst and, for Q8, the scale to *dst_scale (kv_io.c).
 * Errors: CTXS_EINVAL (a value Q8 cannot hold). */
int ctxs__head_encode(const ctxs_session *s, uint8_t *dst, float *dst_scale,
                      const uint8_t *src, const uint8_t *src_scale, uint32_t src_dtype);

/* Stores tokens at positions [pos, pos + n), all reserved, of layers
 * [l0, l1) from src: into the mapping where its pages are mapped writable,
 * else through the file (kv_write.c). Errors: CTXS_EINVAL (a value Q8
 * cannot hold), CTXS_ENOMEM, CTXS_EFULL, -errno; the slots written are
 * then unspecified, and nothing else changed. */
int ctxs__kv_put(ctxs_session *s, uint64_t pos, uint32_t n, uint32_t l0, uint32_t l1,
                 const ctxs__kv_src *src);

/* Refuses writes to a session that is read-only, failed, or whose worker
 * met a writeback error (which fails it). Returns 0, CTXS_EREADONLY or
 * CTXS_EFAILED (commit.c). */
int ctxs__writable(ctxs_session *s);

/* A layer found writable: positions [from, to) of the pass of stamp, at
 * at_ms (monotonic), with `committed` tokens committed. */
typedef struct ctxs__layer_seen {
    uint64_t stamp, committed, from, to, at_ms;
} ctxs__layer_seen;

/* How ctxs__kv_writable() may judge. */
enum {
    CTXS__ASK_OWNER = 1u << 0,  /* the owner's thread: knows its writes */
    CTXS__ASK_BY_AGE = 1u << 1, /* where the page cache cannot be asked,
                                   trust a pass younger than the flusher's
                                   30 s (else: not writable) */
};

/* Whether positions [from, to) of layers [l0, l1) are mapped writable by
 * this handle: a pass mapped them, and their pages are still dirty, so no
 * writeback has write-protected them since (runway.c). When not yet, but a
 * pass under way will map them, *pending (if not NULL) gets its stamp,
 * else 0. */
int ctxs__kv_writable(ctxs_session *s, uint64_t from, uint64_t to, uint32_t l0, uint32_t l1,
                      unsigned how, uint64_t *pending);

/* Forgets what was mapped writable: before a sync write-protects every
 * page, or a rollback moves positions back. */
void ctxs__populated_forget(ctxs_session *s);

#ifdef CTXS_TEST_HOOKS
/* Tests only: 1 makes every write take the mapped way, 2 the file's;
 * 0 lets ctxs__kv_writable() choose (kv_write.c). */
extern int ctxs__write_path_force;
#define CTXS__WRITE_PATH_FORCE ctxs__write_path_force

/* Tests only: the questions ctxs__kv_writable() has asked the page cache,
 * process-wide (runway.c). */
extern _Atomic uint64_t ctxs__write_path_asks;
#define CTXS__COUNT_WRITE_PATH_ASK()                                                               \
    atomic_fetch_add_explicit(&ctxs__write_path_asks, 1, memory_order_relaxed)

/* Tests only: the times a commit split large folios, process-wide
 * (ctxs__future_folios_check()). */
extern _Atomic uint64_t ctxs__folio_splits;
#define CTXS__COUNT_FOLIO_SPLIT()                                                                  \
    atomic_fetch_add_explicit(&ctxs__folio_splits, 1, memory_order_relaxed)
#else
#define CTXS__WRITE_PATH_FORCE 0
#define CTXS__COUNT_WRITE_PATH_ASK() ((void)0)
#define CTXS__COUNT_FOLIO_SPLIT() ((void)0)
#endif

/* A pass older than this may have been cleaned by the flusher
 * (vm.dirty_expire_centisecs, 30 s by default, less some margin): where
 * the page cache cannot be asked, its pages are mapped again. */
#define CTXS__RUNWAY_FRESH_MS 25000u

/* While the user reads a reply and types the next turn, the flusher
 * writes the runway's pages back after 30 s and write-protects them: the
 * worker looks every CTXS__RUNWAY_CHECK_MS whether it did, and maps them
 * writable again, for CTXS__RUNWAY_KEEP_MS after each commit. Each time
 * costs the worker about a turn's page faults, and the disk a runway of
 * zeros written back again 30 s later; past the keep, the next turn writes
 * through the file instead (kv_write.c). */
#define CTXS__RUNWAY_CHECK_MS 500u
#define CTXS__RUNWAY_KEEP_MS 120000u

/* At ASYNC a commit's writeback leaves out the page each K/V run is still
 * filling, and the records and tables: a reply decoded token by token
 * writes them again at each token, and a page under writeback costs the
 * next store into it a fault and, where the disk keeps pages stable while
 * writing them, a wait for the I/O (measured: a 135M model decoding a
 * token each 16 ms, 6 ms more per token saved). They follow once commits
 * pause this long, or at close or ctxs_session_sync(). */
#define CTXS__WRITEBACK_SETTLE_MS 1000u

/* The runway's least length in tokens (runway.c). An ASYNC commit wakes
 * the worker at most every half of it (commit.c). */
#define CTXS__RUNWAY_MIN_TOKENS 64u

/* --- Background work (background.c) ------------------------------------ */

/* What the worker thread can be asked to do for a session, most urgent
 * first. */
enum {
    CTXS__JOB_MAP = 1u << 0,       /* map a reservation's slots writable */
    CTXS__JOB_WRITEBACK = 1u << 1, /* start writeback of what was committed */
    CTXS__JOB_RUNWAY = 1u << 2,    /* allocate and map the next slots */
    CTXS__JOB_WARM = 1u << 3,      /* bring the attention window in */
    CTXS__JOB_KEEP = 1u << 4,      /* map the runway again if it was cleaned */
};

/* The worker thread's name, as /proc and debuggers show it. */
#define CTXS__WORKER_NAME "ctxstore-worker"

/* Asks the worker for jobs on s. Without a worker (the background option
 * off, or no thread to be had) the writeback is started here and the rest
 * is skipped: they only save time. */
void ctxs__background_request(ctxs_session *s, unsigned jobs);

/* Asks the worker to map positions [from, to) writable, ahead of the
 * engine's writes into them (CTXS__JOB_MAP). Returns 0 when the worker
 * will, -1 when the caller must (no worker). */
int ctxs__background_map(ctxs_session *s, uint64_t from, uint64_t to);
/* Maps the runway writable again if writeback cleaned it since it was
 * mapped; nothing if it was forgotten (a sync, a rollback, pressure) or is
 * still writable. Makes no system call that the fault hook counts, so
 * that the fault suite's counts do not depend on when the worker wakes
 * (runway.c). */
void ctxs__runway_keep(ctxs_session *s);

/* Maps positions [from, to) writable, and records it (runway.c). */
void ctxs__map_positions(ctxs_session *s, uint64_t from, uint64_t to);

/* A session with the background option joins and leaves the worker's
 * care: the first starts the worker, close of the last stops and joins it.
 * leave() returns once the worker no longer touches s. */
void ctxs__background_join(ctxs_session *s);
void ctxs__background_leave(ctxs_session *s);

/* The owner keeps the worker off s: hold() returns once the worker is not
 * working on s, and s's jobs wait (none is lost) until release(). */
void ctxs__background_hold(ctxs_session *s);
void ctxs__background_release(ctxs_session *s);

#ifdef CTXS_TEST_HOOKS
/* Tests only: returns once the worker has nothing left to do. */
void ctxs__background_wait_idle(void);
#endif

/* fork(): the child has no worker; forget it (registry.c's handler). */
void ctxs__background_forget(void);

/* The worker's jobs (window.c, commit.c). Each returns 1 when it has more
 * to do, 0 when done. st and window are the session's as the worker last
 * saw them under the registry mutex. */
int ctxs__warm_step(ctxs_session *s, const ctxs__state *st, uint32_t window);
void ctxs__runway_prepare(ctxs_session *s, const ctxs__state *st);
/* The owner notes a reservation of n, which sizes the next runway. */
void ctxs__runway_adapt(ctxs_session *s, uint32_t n);
/* Starts writeback of what st commits beyond the last pass: whole = 0,
 * only the K/V pages it fills (CTXS__WRITEBACK_SETTLE_MS). */
void ctxs__writeback_committed(ctxs_session *s, const ctxs__state *st, int whole);

/* Punches slots [from, capacity) of every global layer's runs, and the
 * padding after the last run (session_compact.c). The caller holds the
 * slots unheld: no record claims them and nothing reserved writes them.
 * Returns 0, 1 where the filesystem cannot punch holes, or an error. */
int ctxs__punch_unheld(const ctxs_session *s, uint32_t from);

/* How often a commit asks whether large folios need splitting, at most
 * (ms). */
#define CTXS__FOLIO_CHECK_MS 1000u

/* In a commit of the positions below n, before its sync (owner): splits
 * the page cache's large folios over the slots from n on, where a reader
 * left some (runway.c). Returns 0, or -errno of the sync that this takes
 * first (the commit has then failed). */
int ctxs__future_folios_check(ctxs_session *s, uint64_t n);

/* Allocates disk blocks so that slots [0, end_slot) are all backed.
 * Thread-safe against the worker. Errors: CTXS_EFULL, -errno. */
int ctxs__allocate_slots(ctxs_session *s, uint32_t end_slot);

/* The window spans of st for window w. */
void ctxs__window_spans(const ctxs_session *s, const ctxs__state *st, uint32_t w,
                        ctxs_window *out);

/* The window in force for s now. */
uint32_t ctxs__effective_window(const ctxs_session *s);

/* The sliding window of layer l of s: its schedule's, else the open
 * options' attn_window where they name l a window layer; 0: global. */
uint32_t ctxs__attn_window(const ctxs_session *s, uint32_t l);

/* Releases from memory the KV pages of s outside the window in force
 * (window.c; memory pressure calls it). */
void ctxs__release_outside_window(ctxs_session *s);

/* --- New files: create and fork (session.c, fork.c) --------------------- */

/* Check options as create and open do and fill *out: the _INIT defaults
 * for NULL, the default windows for zeros. Errors: CTXS_EINVAL. */
int ctxs__open_options_resolve(const ctxs_open_options *in, ctxs_open_options *out);
int ctxs__create_options_resolve(const ctxs_create_options *in, ctxs_create_options *out);

/* o's capacity where it is 0: the context length, else
 * CTXS_DEFAULT_CAPACITY. */
void ctxs__create_capacity(ctxs_create_options *o);

/* The state a rollback of s to n gives (commit.c; forks share it).
 * Errors: CTXS_EINVAL (n above the count), CTXS_EEVICTED (n_sink < n <
 * the first recent position held). */
int ctxs__rollback_state(ctxs__state *out, const ctxs_session *s, uint64_t n);

/* ctxs_session_sync() of a writable s: the committed turns made durable and
 * the watermark raised to them. */
int ctxs__sync_turns(ctxs_session *s);

/* The hooks below exist only in the test build of the library
 * (CTXS_TEST_HOOKS, src/meson.build); CTXS__TEST_HOOK(hook, arg) calls one
 * where a test has set it, and is nothing in the library that is
 * installed. */
#ifdef CTXS_TEST_HOOKS
#define CTXS__TEST_HOOK(hook, arg) ((hook) ? (hook)(arg) : (void)0)
#else
#define CTXS__TEST_HOOK(hook, arg) ((void)(arg))
#endif

/* Tests only: called at the named steps of a fork, to change the source
 * under it. */
enum { CTXS__FORK_STARTED = 1, CTXS__FORK_TABLES_COPIED, CTXS__FORK_KV_COPIED };
#ifdef CTXS_TEST_HOOKS
extern void (*ctxs__fork_hook)(int step);
#endif

/* Tests only: called by an open between the open(2) of path and its lock,
 * to replace the file under it. */
#ifdef CTXS_TEST_HOOKS
extern void (*ctxs__open_hook)(const char *path);
#endif

/* Opens the session file at path as a writer that no other handle, in any
 * process, has open (session_compact.c, for compact and grow): a look
 * under the file's exclusive lock that changes nothing, then a writer's
 * open (recovery, if the file needs it), then the exclusive lock again.
 * *out is the open session (the caller closes it) from the open on, also
 * when the lock after it fails (CTXS_EBUSY: a reader) or the file was
 * deleted meanwhile (-ENOENT); NULL when nothing is open. */
int ctxs__session_open_alone(ctxs_session **out, const char *path);

/* Tests only: called at each step of a grow (grow.c). */
enum { CTXS__GROW_COPIED = 1, CTXS__GROW_LINKED, CTXS__GROW_RENAMED };
#ifdef CTXS_TEST_HOOKS
extern void (*ctxs__grow_hook)(int step);
#endif

#endif
