/*
 * The session's current record (format.c reads the pair) and verifying
 * tokens: what open trusts, and why.
 */
/* Inlined: a commit hashes each token's 256-byte runs in their own call,
 * seeded with the chain so far (docs/FORMAT.md), and the library's calls
 * cost twice the inlined ones (measured: 2.4 ms against 1.25 ms for a
 * 64-token turn of Qwen3-4B, where one XXH3 over the same 9.4 MB takes
 * 0.65 ms). Slots of 241 bytes to 1 KiB go four tokens at a time through
 * xxh3_lanes.c where the CPU has AVX2 (the same turn: 0.52 ms against
 * 0.89 ms one call each, AVX-512). The values are XXH3's, whichever way
 * it is compiled. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "internal.h"
#include "xxh3_lanes.h"

/* The start of each token's checksum chain: its position and its id. */
static void sums_begin(uint64_t *out, uint64_t first_pos, uint32_t n, const uint32_t *ids)
{
    for (uint32_t i = 0; i < n; i++) {
        uint64_t pos = first_pos + i;
        uint8_t head[12];
        memcpy(head, &pos, 8);
        memcpy(head + 8, &ids[i], 4);
        out[i] = XXH3_64bits_withSeed(head, sizeof(head), CTXS__TOKEN_SEED);
    }
}

/* The kernel that hashes four tokens' slots of this size at once, or NULL. */
static ctxs__xxh3_lanes_fn lanes_for(size_t slot_bytes)
{
    if (slot_bytes < CTXS__XXH3_LANES_MIN || slot_bytes > CTXS__XXH3_LANES_MAX)
        return NULL;
    return ctxs__xxh3_lanes();
}

/* Asks for token i's slot in the run after this one (NULL: none). */
static void prefetch_slot(const uint8_t *next_run, const uint32_t *at, uint32_t i,
                          size_t slot_bytes)
{
    if (!next_run)
        return;
    const uint8_t *p = next_run + (size_t)at[i] * slot_bytes;
    for (size_t o = 0; o < slot_bytes; o += 64)
        __builtin_prefetch(p + o);
}

/* One run's step of n chains: out[i] = XXH3-64 of token i's slot, at
 * at[i] in the run, seeded with out[i]. The same tokens' slots in the next
 * run are asked for meanwhile: a run's slots of a turn are a few pages of
 * their own, which the processor's prefetcher reaches only after a miss,
 * and by the commit the worker's pass since the writes has evicted them
 * (a 64-token turn's chains in bench_session, Qwen3-4B's geometry: 0.68 ms
 * against 1.05-1.15 ms). */
static void chain_run(uint64_t *out, const uint8_t *run, const uint8_t *next_run,
                      const uint32_t *at, uint32_t n, size_t slot_bytes,
                      ctxs__xxh3_lanes_fn lanes)
{
    uint32_t i = 0;
    if (lanes)
        for (; i + 4 <= n; i += 4) {
            const uint8_t *in[4];
            for (int j = 0; j < 4; j++) {
                in[j] = run + (size_t)at[i + j] * slot_bytes;
                prefetch_slot(next_run, at, i + (uint32_t)j, slot_bytes);
            }
            lanes(out + i, in, slot_bytes);
        }
    for (; i < n; i++) {
        prefetch_slot(next_run, at, i, slot_bytes);
        out[i] = XXH3_64bits_withSeed(run + (size_t)at[i] * slot_bytes, slot_bytes, out[i]);
    }
}

/* The runs whose scales end a chain, in file order: every one of a table
 * whose runs lie `stride` apart, or, with a layout, those of one group's
 * layers (-1: the layers laid out as the session's slots), each at its
 * place in the session's table. */
typedef struct scale_runs {
    const uint8_t *table;
    size_t stride;
    const ctxs__file_layout *lay;
    int32_t group;
    uint32_t n_runs;
} scale_runs;

/* Where run r's scales begin, or NULL where the chain leaves the run out. */
static const uint8_t *scale_run(const scale_runs *sr, uint32_t r)
{
    if (!sr->lay)
        return sr->table + (size_t)r * sr->stride;
    if (ctxs__layer_group(sr->lay, r / (2 * sr->lay->n_kv_heads)) != sr->group)
        return NULL;
    return sr->table + ctxs__run_scales_off(sr->lay, r);
}

/* Tokens whose scales are gathered together, and the bytes of each
 * token's scales hashed per call. The scales of consecutive slots share
 * their run's lines, which gathered one token at a time are read once per
 * token: the scales of a 64-token turn of Qwen3-4B (576 runs) took 110 us
 * that way, in a program of its own, and 31-36 us eight tokens at a time
 * (the whole chain: 380 us against 460). */
#define SCALE_TOKENS 8u
#define SCALE_PIECE 1024u

/* The end of n chains: out[i] = XXH3-64 of token i's scales, one per run
 * of sr, concatenated (the scale of slot at[i]), seeded with out[i]. One
 * input, gathered a piece at a time: a hash call per 4-byte scale would
 * cost more than the token's KV. */
static void chain_scales(uint64_t *out, uint32_t n, const uint32_t *at, const scale_runs *sr)
{
    XXH3_state_t state[SCALE_TOKENS];
    uint8_t piece[SCALE_TOKENS][SCALE_PIECE];
    for (uint32_t first = 0; first < n; first += SCALE_TOKENS) {
        const uint32_t t = n - first < SCALE_TOKENS ? n - first : SCALE_TOKENS;
        for (uint32_t j = 0; j < t; j++) {
            XXH3_INITSTATE(&state[j]); /* reset reads the seed it had */
            XXH3_64bits_reset_withSeed(&state[j], out[first + j]);
        }
        for (uint32_t r = 0; r < sr->n_runs;) {
            size_t len = 0;
            for (; r < sr->n_runs && len < SCALE_PIECE; r++) {
                const uint8_t *run = scale_run(sr, r);
                if (!run)
                    continue;
                for (uint32_t j = 0; j < t; j++)
                    memcpy(piece[j] + len, run + (size_t)at[first + j] * 4, 4);
                len += 4;
            }
            for (uint32_t j = 0; j < t; j++)
                XXH3_64bits_update(&state[j], piece[j], len);
        }
        for (uint32_t j = 0; j < t; j++)
            out[first + j] = XXH3_64bits_digest(&state[j]);
    }
}

void ctxs__sums_chain(uint64_t *out, uint64_t first_pos, uint32_t n, const uint32_t *ids,
                      const ctxs__token_bytes *tb)
{
    sums_begin(out, first_pos, n, ids);
    /* Run by run: a run's slots for consecutive positions are contiguous
     * (two stretches where the ring wraps), so the KV is read sequentially. */
    const ctxs__xxh3_lanes_fn lanes = lanes_for(tb->slot_bytes);
    for (uint32_t r = 0; r < tb->n_runs; r++)
        chain_run(out, tb->kv + (size_t)r * tb->run_stride,
                  r + 1 < tb->n_runs ? tb->kv + (size_t)(r + 1) * tb->run_stride : NULL, tb->at,
                  n, tb->slot_bytes, lanes);
    if (!tb->scales)
        return;
    const scale_runs sr = {tb->scales, tb->scales_stride, NULL, -1, tb->n_runs};
    chain_scales(out, n, tb->at, &sr);
}

/* The chain of n consecutive positions over the layers of `group` (-1:
 * those laid out as the session's slots), each layer's token i at
 * slots[i] of its runs: as ctxs__sums_chain() over those runs, in file
 * order, then their scales. */
static void chain_layers(const ctxs_session *s, int32_t group, uint64_t first_pos, uint32_t n,
                         const uint32_t *ids, const uint32_t *slots, uint64_t *out)
{
    const ctxs__file_layout *lay = &s->lay;
    sums_begin(out, first_pos, n, ids);
    const uint32_t per = 2 * lay->n_kv_heads, n_runs = lay->n_layers * per;
    const ctxs__xxh3_lanes_fn lanes = lanes_for(lay->slot_bytes);
    const uint8_t *kv = s->map + lay->kv_off;
    for (uint32_t r = 0; r < n_runs; r++) {
        if (ctxs__layer_group(lay, r / per) != group)
            continue;
        uint32_t next = r + 1;
        while (next < n_runs && ctxs__layer_group(lay, next / per) != group)
            next++;
        chain_run(out, kv + ctxs__run_off(lay, r),
                  next < n_runs ? kv + ctxs__run_off(lay, next) : NULL, slots, n,
                  lay->slot_bytes, lanes);
    }
    if (!lay->scales_bytes)
        return;
    const scale_runs sr = {s->map + lay->scales_off, 0, lay, group, n_runs};
    chain_scales(out, n, slots, &sr);
}

void ctxs__token_sums(const ctxs_session *s, uint64_t first_pos, uint32_t n,
                      uint64_t *out)
{
    const ctxs__file_layout *lay = &s->lay;
    const uint32_t *tokens = ctxs__token_table(s);
    uint32_t ids[CTXS__SUM_BATCH];
    uint32_t slots[CTXS__SUM_BATCH];
    for (uint32_t i = 0; i < n; i++) {
        slots[i] = ctxs__slot(s, first_pos + i);
        ids[i] = tokens[slots[i]];
    }
    if (lay->n_groups) {
        chain_layers(s, -1, first_pos, n, ids, slots, out);
        return;
    }
    /* Run r of the mapping, (layer, kind, head) in file order, starts
     * r * head_stride into the KV region, its scales r * scales_stride into
     * the scale table. */
    ctxs__token_bytes tb = {
        .kv = s->map + lay->kv_off,
        .run_stride = lay->head_stride,
        .scales = lay->scales_bytes ? s->map + lay->scales_off : NULL,
        .scales_stride = lay->scales_stride,
        .n_runs = 2 * lay->n_layers * lay->n_kv_heads,
        .slot_bytes = lay->slot_bytes,
        .at = slots,
    };
    ctxs__sums_chain(out, first_pos, n, ids, &tb);
}

void ctxs__group_sums(const ctxs_session *s, uint32_t g, uint64_t first_pos, uint32_t n,
                      uint64_t *out)
{
    const uint32_t *tokens = ctxs__token_table(s);
    uint32_t ids[CTXS__SUM_BATCH];
    uint32_t slots[CTXS__SUM_BATCH];
    for (uint32_t i = 0; i < n; i++) {
        ids[i] = tokens[ctxs__slot(s, first_pos + i)];
        slots[i] = (uint32_t)((first_pos + i) % s->lay.groups[g].len);
    }
    chain_layers(s, (int32_t)g, first_pos, n, ids, slots, out);
}

uint64_t ctxs__group_first_bad(const ctxs_session *s, uint32_t g, uint64_t from, uint64_t to)
{
    const ctxs__group_entry *table = ctxs__group_table(s, g);
    const uint32_t len = s->lay.groups[g].len;
    uint64_t sums[CTXS__SUM_BATCH];
    for (uint64_t p = from; p < to; p += CTXS__SUM_BATCH) {
        uint32_t n = (uint32_t)(to - p < CTXS__SUM_BATCH ? to - p : CTXS__SUM_BATCH);
        /* The entry names its position: a slot reused by a later one, or
         * never written, fails without reading its KV. */
        for (uint32_t i = 0; i < n; i++) {
            const ctxs__group_entry *e = &table[(p + i) % len];
            if (e->pos != p + i || !e->sum)
                return p + i;
        }
        ctxs__group_sums(s, g, p, n, sums);
        for (uint32_t i = 0; i < n; i++)
            if (sums[i] != table[(p + i) % len].sum)
                return p + i;
    }
    return to;
}

int ctxs__records_read(const ctxs_session *s, ctxs__state *st, uint32_t *index,
                       int *other_valid, uint8_t boot_id[16])
{
    ctxs__records recs;
    int rc = ctxs__records_from_map(&recs, s->map, &s->lay, s->ring);
    if (rc < 0)
        return rc;
    *index = recs.newest;
    *other_valid = recs.valid[!recs.newest];
    *st = ctxs__record_state(&recs.r[recs.newest]);
    memcpy(boot_id, recs.r[recs.newest].boot_id, 16);
    return 0;
}

/* The first position in [from, to) whose checksum holds (want_good) or
 * fails (!want_good), or to. Its cost is to - from tokens: callers pass
 * held runs only (at most the capacity, see ctxs__record_valid), never a
 * range that starts at 0 or at verified_from below the ring's front. */
static uint64_t scan(const ctxs_session *s, uint64_t from, uint64_t to, int want_good)
{
    uint64_t sums[CTXS__SUM_BATCH];
    const uint64_t *table = ctxs__sum_table(s);
    for (uint64_t p = from; p < to; p += CTXS__SUM_BATCH) {
        uint32_t n = (uint32_t)(to - p < CTXS__SUM_BATCH ? to - p : CTXS__SUM_BATCH);
        ctxs__token_sums(s, p, n, sums);
        for (uint32_t i = 0; i < n; i++)
            if ((sums[i] == table[ctxs__slot(s, p + i)]) == want_good)
                return p + i;
    }
    return to;
}

uint64_t ctxs__first_bad(const ctxs_session *s, uint64_t from, uint64_t to)
{
    return scan(s, from, to, 0);
}

uint64_t ctxs__leading_kept(const uint8_t *map, const ctxs__file_layout *lay, int ring,
                            const ctxs__state *st, uint64_t n)
{
    /* A read-only view of the file, enough for the checksums: the same
     * code as recovery's, so that what this says an open keeps is what it
     * keeps. The leading positions are the sinks, then (until the ring
     * wraps) the recent run from n_sink on: ctxs__recover cuts the state
     * at the first of them at or above the watermark that fails. */
    ctxs_session view = {.fd = -1, .readonly = 1, .ring = ring, .map = (uint8_t *)map,
                         .lay = *lay, .st = *st};
    uint64_t from = st->verified_from;
    return from < n ? ctxs__first_bad(&view, from, n) : n;
}

uint64_t ctxs__held(const ctxs_session *s, const ctxs__state *st)
{
    uint64_t n = st->n_tokens, ns = s->lay.n_sink, first = ctxs__first_recent(s, st);
    return (n < ns ? n : ns) + (n > first ? n - first : 0);
}

/* Cuts st to its first n positions. */
static void cut(const ctxs_session *s, ctxs__state *st, uint64_t n)
{
    st->n_tokens = n;
    if (n <= s->lay.n_sink)
        st->ring_start = 0;
    else if (st->ring_start > n)
        st->ring_start = n;
    if (st->verified_from > n)
        st->verified_from = n;
}

/* The largest n <= y such that windowed group g holds every position of
 * the window a state of n tokens claims, [n - window, n). */
static uint64_t group_best(const ctxs_session *s, uint32_t g, uint64_t y)
{
    const ctxs__group_entry *table = ctxs__group_table(s, g);
    const uint32_t len = s->lay.groups[g].len, w = s->lay.groups[g].window;
    /* No slot holds a position below the oldest its entries name, or above
     * the newest; nor, as a ring of len slots, one len or more below the
     * newest (a damaged table may name any): a window that reaches below
     * them is there only if it is empty. This also bounds the walk below
     * by len positions. */
    uint64_t lowest = UINT64_MAX, highest = 0;
    for (uint32_t i = 0; i < len; i++) {
        if (!table[i].sum)
            continue;
        lowest = table[i].pos < lowest ? table[i].pos : lowest;
        highest = table[i].pos > highest ? table[i].pos : highest;
    }
    if (lowest == UINT64_MAX)
        return 0;
    if (highest - lowest >= len)
        lowest = highest - len + 1;
    if (y > highest + 1)
        y = highest + 1;
    while (y > 0) {
        uint64_t lo = y > w ? y - w : 0, p = y;
        if (y <= lowest)
            return 0;
        uint64_t floor = lo > lowest ? lo : lowest;
        while (p > floor && ctxs__group_first_bad(s, g, p - 1, p) == p)
            p--;
        if (p > floor) {
            y = p - 1; /* the window of any state past p - 1 needs it */
            continue;
        }
        return lo < lowest ? 0 : y;
    }
    return 0;
}

/* After the session's own layers were recovered to st from the record rec:
 * the largest count at most st's whose windows every windowed group still
 * holds. A window of st within rec's is checked from rec's watermark (below
 * it the slots were durable and untouched: reserve keeps the slots of the
 * window a surviving record claims); where st was cut below rec, the part
 * of its window below rec's was never vouched for and reserve may have
 * given its slots to later positions: checked whole, as are the windows of
 * every count below st's. */
static uint64_t groups_recover(const ctxs_session *s, const ctxs__state *st,
                               const ctxs__state *rec)
{
    uint64_t n = st->n_tokens, vf = rec->verified_from;
    int whole = 1;
    for (uint32_t g = 0; g < s->lay.n_groups; g++) {
        uint64_t from = ctxs__group_from(s, st, g);
        if (from >= ctxs__group_from(s, rec, g))
            from = from > vf ? from : vf;
        if (from < n && ctxs__group_first_bad(s, g, from, n) < n)
            whole = 0;
    }
    if (whole)
        return n;
    for (uint64_t y = n;; n = y) {
        for (uint32_t g = 0; g < s->lay.n_groups; g++)
            y = group_best(s, g, y);
        if (y == n)
            return n;
    }
}

uint64_t ctxs__recover(const ctxs_session *s, ctxs__state *st)
{
    const uint64_t ns = s->lay.n_sink, vf = st->verified_from, n = st->n_tokens;
    const uint64_t held_before = ctxs__held(s, st);
    const ctxs__state rec = *st;
    uint64_t sink_end = n < ns ? n : ns;
    uint64_t bad = n;

    /* Held positions at or above the watermark, in increasing order: the
     * sinks first, then the recent run. Those below it are trusted as they
     * are (Invariant C1, commit.c). */
    if (vf < sink_end && (bad = ctxs__first_bad(s, vf, sink_end)) == sink_end)
        bad = n;
    if (bad == n) {
        /* From the front of the recent run at the lowest: a watermark of
         * 0 under a claim of 2^62 still costs at most the ring's length. */
        uint64_t first = ctxs__first_recent(s, st);
        uint64_t from = vf > first ? vf : first;
        /* In a ring that has wrapped, reserve may have reused slots at the
         * front under eviction records that never reached the disk (at NONE
         * and ASYNC they are not synced once the watermark is below the
         * front), and a torn page can leave that front a mix of old and new
         * tokens. Those tokens were being evicted: keep the longest run that
         * verifies, evicting what lies before it as the ring would have. */
        if (s->ring && st->ring_start > ns && from == first && from < n) {
            uint64_t best_lo = from, best_hi = from;
            for (uint64_t lo = from; lo < n;) {
                uint64_t hi = ctxs__first_bad(s, lo, n);
                if (hi - lo >= best_hi - best_lo)
                    best_lo = lo, best_hi = hi;
                lo = hi < n ? scan(s, hi + 1, n, 1) : n;
            }
            st->ring_start = best_lo;
            bad = best_hi;
        } else if (from < n) {
            bad = ctxs__first_bad(s, from, n);
        }
    }

    /* The longest prefix that verifies: everything before `bad` is held and
     * checked (or durable below the watermark). */
    cut(s, st, bad);
    if (s->lay.n_groups)
        cut(s, st, groups_recover(s, st, &rec));
    return held_before - ctxs__held(s, st);
}
