/*
 * Simulated power loss. A scenario runs real commits (NONE, ASYNC, FULL,
 * syncs, rollbacks, ring wraps) on a session, with or without a layer
 * schedule whose windowed layer keeps a ring of its own, and copies the
 * file after every call: snapshot 0 is a durable point (a sync), and the
 * library's own promises say which later snapshots are durable too (a FULL
 * commit or a sync: all of the file; a reserve that hands out a slot whose
 * position a durable record still claims below its verified_from: that
 * record's page, which the format requires to be made durable first).
 *
 * A crash image is what a disk may hold after the power fails during call
 * t+1: each 4 KiB page holds one of the versions it had between its last
 * durable snapshot and snapshot t+1: the oldest, the newest, any, torn (a
 * prefix of its 512-byte sectors from a newer version, the rest from an
 * older one) or mixed sector by sector. Every image is opened with
 * CTXS_OPEN_VERIFY and must
 *   - open (the header page never changes; records sit in sectors of their
 *     own, so one of them is always whole);
 *   - take the newest valid record and keep a prefix of it no shorter than
 *     its verified_from, reporting what it dropped;
 *   - hold no fewer tokens than the fewest any state had since the last
 *     durable point (so at FULL no acknowledged token is lost);
 *   - hold a prefix of a state committed in that interval: every held token
 *     reads back exactly as it was written (K, V and token id; tokens
 *     rewritten after a rollback carry other bytes, so old and new are told
 *     apart), and ctxs_session_verify() agrees.
 * Some images are also opened read-write (recover, then commit more, then
 * reopen), and some with AUTO after their records were resealed with another
 * boot's id, which must verify as VERIFY does.
 *
 * Seeds come from CTXS_TEST_SEED when set, else from the clock.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "ctxstore.h"
#include "format.h"
#include "internal.h"
#include "support.h"

#define MODEL_SEED 11u
#define PG 4096u
#define SECTOR 512u
#define N_SINK 4u
#define MAX_TURN 40u
#define NO_POS UINT64_MAX
#define GEN_BAD UINT32_MAX
#define GEN_EVICTED (UINT32_MAX - 1)
#define GEN_AFTER 0xfff00u /* what the read-write checks append */

static uint64_t vpos(uint64_t pos, uint32_t gen)
{
    return pos + ((uint64_t)gen << 40);
}

/* What read_token gives for position p of generation gen in a state of n
 * tokens: with a schedule, layer 1 keeps its window only and reads as
 * zeros below it. */
static void expect_kv(const ctxs_geometry *g, uint32_t window, uint64_t n, uint64_t p,
                      uint32_t gen, uint16_t *k, uint16_t *v)
{
    ts_fill_kv(g, vpos(p, gen), k, v);
    if (window && p + window < n) {
        size_t per_layer = (size_t)g->n_kv_heads * g->head_dim;
        memset(k + per_layer, 0, per_layer * sizeof(*k));
        memset(v + per_layer, 0, per_layer * sizeof(*v));
    }
}

/* Seeds and counts go to stderr: Criterion shows cr_log_info() only with
 * --verbose, and a failure's seed must reach the default test log. */
#define say(...) (fprintf(stderr, __VA_ARGS__), fputc('\n', stderr))


static uint64_t max_u64(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

/* --- Records as they lie on disk ---------------------------------------- */

static int record_at(const uint8_t *img, uint32_t i, ctxs__disk_record *r)
{
    memcpy(r, img + (i ? CTXS__RECORD1_OFF : CTXS__RECORD0_OFF), sizeof(*r));
    return memcmp(r->magic, CTXS__RECORD_MAGIC, 4) == 0 && r->index == i &&
           (uint32_t)crc32(0, (const Bytef *)r, offsetof(ctxs__disk_record, crc32)) == r->crc32;
}

/* The index of the newest valid record, or -1. */
static int newest_record(const uint8_t *img, ctxs__disk_record *out)
{
    ctxs__disk_record r[2];
    int v0 = record_at(img, 0, &r[0]), v1 = record_at(img, 1, &r[1]);
    if (!v0 && !v1)
        return -1;
    int pick = !v0 || (v1 && r[1].seq > r[0].seq);
    *out = r[pick];
    return pick;
}

/* --- Committed states ------------------------------------------------------ */

typedef struct state {
    uint64_t n, rs, vf;
} state;

static int st_holds(const state *st, uint64_t p)
{
    return p < st->n && (p < N_SINK || p >= max_u64(st->rs, N_SINK));
}

/* How many tokens st holds in slots. */
static uint64_t st_held(const state *st)
{
    uint64_t lo = max_u64(st->rs, N_SINK);
    return (st->n < N_SINK ? st->n : N_SINK) + (st->n > lo ? st->n - lo : 0);
}

/* The position st holds in slot, or NO_POS. */
static uint64_t st_pos_in_slot(const state *st, uint32_t slot, uint32_t capacity)
{
    if (slot < N_SINK)
        return slot < st->n ? slot : NO_POS;
    uint64_t lo = max_u64(st->rs, N_SINK), len = capacity - N_SINK;
    if (lo >= st->n || st->n - 1 < slot)
        return NO_POS;
    uint64_t p = st->n - 1 - ((st->n - 1 - slot) % len); /* the newest with this slot */
    return p >= lo ? p : NO_POS;
}

/* --- Scenarios ------------------------------------------------------------- */

typedef struct snap {
    uint8_t *img;
    state st;
    uint32_t *gen;   /* generation of positions [0, st.n) */
    int durable_all; /* the whole file was durable when this was taken */
    int meta_durable; /* the records and tables were made durable here */
    const char *what;
} snap;

typedef struct scen {
    const char *name;
    char *dir;
    char path[4096], img_path[4096], rw_path[4096];
    ctxs_session *s;
    ctxs_model model;
    uint32_t level, capacity;
    uint32_t window, batch; /* layer 1's window and the batch (0: no schedule) */
    uint32_t max_turn;      /* the most tokens one append reserves */
    uint64_t ring_last[64]; /* the windowed ring: the position last written to each slot + 1 */
    size_t file_len;
    uint8_t first_page[PG];
    size_t kv_off; /* pages before it are metadata: records and tables */
    snap *snaps;
    size_t n_snaps, cap_snaps;
    uint32_t *gen; /* running: generation last written at each position */
    size_t gen_cap;
    uint32_t cur_gen;
    state dur;     /* the newest record known durable */
    uint64_t prev_vf;
    int recording;
    uint64_t rng;
    /* what the crash images did */
    uint64_t images, dirty_pages, torn_pages, truncated, lost, rw, auto_boot;
    uint64_t evictions_needing_sync;
    uint64_t ring_claim_syncs; /* reserves that made a record durable over
                                  a windowed ring's claimed slots */
} scen;

static void gen_set(scen *sc, uint64_t p, uint32_t g)
{
    if (p >= sc->gen_cap) {
        size_t nc = sc->gen_cap ? sc->gen_cap * 2 : 4096;
        while (nc <= p)
            nc *= 2;
        sc->gen = realloc(sc->gen, nc * sizeof(*sc->gen));
        cr_assert_not_null(sc->gen);
        memset(sc->gen + sc->gen_cap, 0, (nc - sc->gen_cap) * sizeof(*sc->gen));
        sc->gen_cap = nc;
    }
    sc->gen[p] = g;
}

/* Records the session's state after a call: checks the file against it, keeps
 * track of what is durable, and stores a snapshot when recording. */
static void note_state(scen *sc, const char *what, int durable_all, int need_durable_record)
{
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, sc->s), 0);
    size_t len;
    uint8_t *img = ts_read_file(sc->path, &len);
    cr_assert_eq(len, sc->file_len, "%s: after %s the file is %zu bytes, was %zu", sc->name, what,
                 len, sc->file_len);
    cr_assert(memcmp(img, sc->first_page, PG) == 0,
              "%s: after %s the header page changed; it is immutable", sc->name, what);

    ctxs__disk_record r;
    int idx = newest_record(img, &r);
    cr_assert_geq(idx, 0, "%s: after %s no record in the file is valid", sc->name, what);
    cr_assert(r.seq == info.seq && r.n_tokens == info.n_tokens &&
                  r.ring_start == info.ring_start && r.verified_from == info.verified_from,
              "%s: after %s the newest record on disk (seq %llu, n %llu, rs %llu, vf %llu) is not "
              "the session's state (seq %llu, n %llu, rs %llu, vf %llu)",
              sc->name, what, (unsigned long long)r.seq, (unsigned long long)r.n_tokens,
              (unsigned long long)r.ring_start, (unsigned long long)r.verified_from,
              (unsigned long long)info.seq, (unsigned long long)info.n_tokens,
              (unsigned long long)info.ring_start, (unsigned long long)info.verified_from);

    state cur = {info.n_tokens, info.ring_start, info.verified_from};
    /* A raised watermark says everything below it was made durable. */
    if (info.verified_from > sc->prev_vf)
        durable_all = 1;
    sc->prev_vf = info.verified_from;
    if (durable_all || need_durable_record)
        sc->dur = cur;

    if (!sc->recording) {
        free(img);
        return;
    }
    if (sc->n_snaps == sc->cap_snaps) {
        sc->cap_snaps = sc->cap_snaps ? sc->cap_snaps * 2 : 64;
        sc->snaps = realloc(sc->snaps, sc->cap_snaps * sizeof(*sc->snaps));
        cr_assert_not_null(sc->snaps);
    }
    snap *sn = &sc->snaps[sc->n_snaps++];
    sn->img = img;
    sn->st = cur;
    sn->gen = malloc((cur.n ? cur.n : 1) * sizeof(*sn->gen));
    cr_assert_not_null(sn->gen);
    for (uint64_t p = 0; p < cur.n; p++)
        sn->gen[p] = p < sc->gen_cap ? sc->gen[p] : 0;
    sn->durable_all = durable_all;
    sn->meta_durable = !durable_all && need_durable_record;
    (void)idx;
    sn->what = what;
}

static void op_append(scen *sc, uint32_t k)
{
    ctxs_session_info before, cur, after;
    cr_assert_eq(ctxs_session_get_info(&before, sc->s), 0);
    ctxs_reservation r;
    int rc = ctxs_session_reserve(&r, sc->s, k);
    cr_assert_eq(rc, 0, "%s: reserve(%u) at %llu: %s", sc->name, k,
                 (unsigned long long)before.n_tokens, ctxs_err_name(rc));
    cr_assert_eq(r.first_pos, before.n_tokens);
    cr_assert_eq(r.n_tokens, k);
    cr_assert(r.n_spans >= 1 && r.n_spans <= 2);
    uint32_t covered = 0;
    for (uint32_t sp = 0; sp < r.n_spans; sp++)
        for (uint32_t j = 0; j < r.spans[sp].count; j++, covered++)
            cr_assert_eq(r.spans[sp].slot + j,
                         ctxs__slot_of(r.first_pos + covered, sc->capacity, N_SINK),
                         "%s: reservation span %u does not follow the slot mapping", sc->name, sp);
    cr_assert_eq(covered, k);

    /* The slots handed out must be free in the current record (the eviction
     * is committed before reserve returns). If a durable record still claims
     * one below its watermark, the format requires a record that does not
     * to be made durable first: from here on that record page is durable. */
    cr_assert_eq(ctxs_session_get_info(&cur, sc->s), 0);
    state cs = {cur.n_tokens, cur.ring_start, cur.verified_from};
    int need = 0;
    /* With windowed rings, a reserve whose slots held positions a record
     * that may survive claims below its watermark writes both records and
     * makes them durable first: two records (seq up by two or more) are
     * what that leaves, and from here on those pages are durable. The
     * harness takes the library at its word only where it did write them:
     * where it did not, the crash images may keep the older record. */
    if (sc->window && cur.seq >= before.seq + 2) {
        need = 1;
        sc->ring_claim_syncs++;
    }
    for (uint32_t i = 0; i < k; i++) {
        uint64_t p = r.first_pos + i;
        uint32_t slot = ctxs__slot_of(p, sc->capacity, N_SINK);
        uint64_t q = st_pos_in_slot(&cs, slot, sc->capacity);
        cr_assert_eq(q, NO_POS,
                     "%s: reserve handed out slot %u for position %llu, but the current record "
                     "(n %llu, ring_start %llu) still holds position %llu there",
                     sc->name, slot, (unsigned long long)p, (unsigned long long)cs.n,
                     (unsigned long long)cs.rs, (unsigned long long)q);
        uint64_t qd = st_pos_in_slot(&sc->dur, slot, sc->capacity);
        if (qd != NO_POS && qd < sc->dur.vf)
            need = 1;
    }
    sc->evictions_needing_sync += need;
    note_state(sc, "reserve", 0, need);

    uint16_t kk[TS_KV_MAX], vv[TS_KV_MAX];
    uint32_t ids[MAX_TURN];
    cr_assert(k <= sc->max_turn);
    for (uint32_t i = 0; i < k; i++) {
        uint64_t p = r.first_pos + i;
        gen_set(sc, p, sc->cur_gen);
        ts_fill_kv(&sc->model.geometry, vpos(p, sc->cur_gen), kk, vv);
        ids[i] = ts_token(vpos(p, sc->cur_gen));
        cr_assert_eq(ctxs_session_write_token(sc->s, &r, i, kk, vv, CTXS_DTYPE_F16), 0);
    }
    for (uint32_t i = 0; sc->window && i < k; i++)
        sc->ring_last[(r.first_pos + i) % (sc->window + sc->batch)] = r.first_pos + i + 1;
    note_state(sc, "write", 0, 0);

    rc = ctxs_session_commit(sc->s, ids, k);
    cr_assert_eq(rc, 0, "%s: commit(%u): %s", sc->name, k, ctxs_err_name(rc));
    cr_assert_eq(ctxs_session_get_info(&after, sc->s), 0);
    cr_assert_eq(after.n_tokens, before.n_tokens + k);
    if (sc->level == CTXS_SYNC_FULL)
        cr_assert_eq(after.verified_from, after.n_tokens,
                     "%s: after a FULL commit verified_from is %llu, n_tokens %llu", sc->name,
                     (unsigned long long)after.verified_from, (unsigned long long)after.n_tokens);
    else
        cr_assert(after.verified_from <= r.first_pos && after.verified_from <= cur.verified_from,
                  "%s: a commit at level %u (no sync) moved verified_from from %llu to %llu over "
                  "positions from %llu that are not durable",
                  sc->name, sc->level, (unsigned long long)cur.verified_from,
                  (unsigned long long)after.verified_from, (unsigned long long)r.first_pos);
    note_state(sc, "commit", sc->level == CTXS_SYNC_FULL, 0);
}

static void op_rollback(scen *sc, uint64_t target)
{
    ctxs_session_info before, after;
    cr_assert_eq(ctxs_session_get_info(&before, sc->s), 0);
    int rc = ctxs_session_rollback(sc->s, target);
    cr_assert_eq(ctxs_session_get_info(&after, sc->s), 0);
    if (rc == CTXS_EEVICTED) {
        /* The main ring evicted, or the windowed ring no longer holds the
         * window of target: a later position took one of its slots. */
        int taken = 0;
        for (uint64_t q = target > sc->window ? target - sc->window : 0; sc->window && q < target;
             q++)
            taken |= sc->ring_last[q % (sc->window + sc->batch)] != q + 1;
        cr_assert(before.ring_start > N_SINK || taken,
                  "%s: rollback from %llu to %llu refused, but no ring overwrote what it needs",
                  sc->name, (unsigned long long)before.n_tokens, (unsigned long long)target);
        cr_assert_eq(after.n_tokens, before.n_tokens);
        return;
    }
    cr_assert_eq(rc, 0, "%s: rollback(%llu) from %llu: %s", sc->name, (unsigned long long)target,
                 (unsigned long long)before.n_tokens, ctxs_err_name(rc));
    cr_assert_eq(after.n_tokens, target);
    sc->cur_gen++; /* what is written from target on now differs */
    /* A rollback makes its record durable before the dropped slots can be
     * rewritten (else a surviving older record would splice histories). */
    note_state(sc, "rollback", 0, target < before.n_tokens);
}

static void op_sync(scen *sc)
{
    int rc = ctxs_session_sync(sc->s);
    cr_assert_eq(rc, 0, "%s: sync: %s", sc->name, ctxs_err_name(rc));
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, sc->s), 0);
    cr_assert_eq(info.verified_from, info.n_tokens, "%s: after sync verified_from is %llu of %llu",
                 sc->name, (unsigned long long)info.verified_from,
                 (unsigned long long)info.n_tokens);
    note_state(sc, "sync", 1, 0);
}

static void scen_init_schedule(scen *sc, const char *name, uint32_t level, uint32_t capacity,
                               uint64_t seed, uint32_t window, uint32_t batch)
{
    memset(sc, 0, sizeof(*sc));
    sc->name = name;
    sc->level = level;
    sc->capacity = capacity;
    sc->rng = seed;
    sc->window = window;
    sc->batch = batch;
    sc->max_turn = window ? batch : MAX_TURN;
    cr_assert(sc->max_turn <= MAX_TURN && window + batch <= 64);
    sc->model = ts_model(MODEL_SEED);
    if (window) { /* layer 0 global, layer 1 windowed */
        sc->model.geometry.period = 2;
        sc->model.geometry.window[1] = window;
    }
    sc->dir = ts_mkdtemp();
    snprintf(sc->path, sizeof(sc->path), "%s/live.ctxs", sc->dir);
    snprintf(sc->img_path, sizeof(sc->img_path), "%s/image.ctxs", sc->dir);
    snprintf(sc->rw_path, sizeof(sc->rw_path), "%s/image-rw.ctxs", sc->dir);
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = capacity;
    o.n_sink = N_SINK;
    o.ring = 1;
    o.open.durability = level;
    if (window)
        o.batch = batch;
    int rc = ctxs_session_create(&sc->s, sc->path, &sc->model, &o);
    cr_assert_eq(rc, 0, "create: %s", ctxs_err_name(rc));
    uint8_t *img = ts_read_file(sc->path, &sc->file_len);
    cr_assert_eq(sc->file_len % PG, 0);
    memcpy(sc->first_page, img, PG);
    sc->kv_off = (size_t)((const ctxs__disk_header *)(const void *)img)->kv_off;
    free(img);
    if (window) {
        cr_assert_eq(sc->s->lay.n_groups, 1, "%s: the windowed layer has no ring of its own",
                     name);
        cr_assert_eq(sc->s->lay.groups[0].len, window + batch);
    }
}

static void scen_init(scen *sc, const char *name, uint32_t level, uint32_t capacity, uint64_t seed)
{
    scen_init_schedule(sc, name, level, capacity, seed, 0, 0);
}

static void scen_free(scen *sc)
{
    ctxs_session_close(sc->s);
    for (size_t i = 0; i < sc->n_snaps; i++) {
        free(sc->snaps[i].img);
        free(sc->snaps[i].gen);
    }
    free(sc->snaps);
    free(sc->gen);
    ts_rmtree(sc->dir);
    free(sc->dir);
}

/* --- Crash images ------------------------------------------------------------ */

typedef struct window {
    size_t t;  /* the crash happens during call t + 1 (or after the last) */
    size_t lo; /* the last snapshot at which everything was durable */
    size_t hi; /* the newest snapshot any page may show */
    /* The versions each kind of page may show: [0] the KV pages, [1] and
     * [2] the pages of records 0 and 1, [3] the token and checksum tables. */
    size_t page_lo[4], page_hi[4];
    const char *phase;
} window;

static window crash_window(scen *sc, size_t t)
{
    window w = {t, 0, t + 1 < sc->n_snaps ? t + 1 : t, {0, 0, 0, 0}, {0, 0, 0, 0}, ""};
    size_t rec_lo[2] = {0, 0}, meta_lo = 0;
    cr_assert(sc->snaps[0].durable_all);
    for (size_t j = 0; j <= t; j++) {
        if (sc->snaps[j].durable_all)
            w.lo = rec_lo[0] = rec_lo[1] = meta_lo = j;
        else if (sc->snaps[j].meta_durable)
            rec_lo[0] = rec_lo[1] = meta_lo = j;
    }
    for (int i = 0; i < 4; i++)
        w.page_hi[i] = w.hi;
    w.page_lo[0] = w.lo;
    w.page_lo[1] = rec_lo[0];
    w.page_lo[2] = rec_lo[1];
    w.page_lo[3] = meta_lo;
    if (w.hi > t && sc->snaps[w.hi].meta_durable && strcmp(sc->snaps[w.hi].what, "rollback") == 0) {
        /* A rollback makes its record durable, then zeroes the dropped
         * checksums and makes them durable: the power failed before the
         * record was durable, and the tables are as before the call, or
         * after, and the records are final. */
        if (ts_rng_next(&sc->rng) & 1) {
            w.page_hi[3] = t;
            w.phase = " before its record sync";
        } else {
            w.page_lo[1] = w.page_lo[2] = w.hi;
            w.phase = " after its record sync";
        }
    } else if (w.hi > t && sc->snaps[w.hi].durable_all) {
        /* A call that makes the data durable and then writes a record that
         * says so (a sync, a FULL commit): either the power failed before
         * the data was durable, and that record never reached the disk, or
         * after, and every data page holds its final version. */
        if (ts_rng_next(&sc->rng) & 1) {
            w.page_hi[1] = w.page_hi[2] = t;
            w.phase = " before its data sync";
        } else {
            w.page_lo[0] = w.page_lo[3] = w.hi;
            w.phase = " after its data sync";
        }
    }
    return w;
}

static void copy_sectors(uint8_t *out, const uint8_t *from, size_t first, size_t count)
{
    memcpy(out + first * SECTOR, from + first * SECTOR, count * SECTOR);
}

/* Builds one image for window w into out. */
static void make_image(scen *sc, const window *w, uint8_t *out)
{
    for (size_t off = 0; off < sc->file_len; off += PG) {
        int kind = off == CTXS__RECORD0_OFF ? 1 : off == CTXS__RECORD1_OFF ? 2 : off < sc->kv_off ? 3 : 0;
        size_t lo = w->page_lo[kind], hi = w->page_hi[kind];
        int dirty = 0;
        for (size_t j = lo + 1; j <= hi && !dirty; j++)
            dirty = memcmp(sc->snaps[j].img + off, sc->snaps[lo].img + off, PG) != 0;
        uint8_t *pg = out + off;
        if (!dirty) {
            memcpy(pg, sc->snaps[lo].img + off, PG);
            continue;
        }
        sc->dirty_pages++;
        size_t span = hi - lo + 1;
        switch (ts_rng_next(&sc->rng) % 5) {
        case 0: /* never written back */
            memcpy(pg, sc->snaps[lo].img + off, PG);
            break;
        case 1: /* written back last */
            memcpy(pg, sc->snaps[hi].img + off, PG);
            break;
        case 2: /* written back at some point */
            memcpy(pg, sc->snaps[lo + ts_rng_next(&sc->rng) % span].img + off, PG);
            break;
        case 3: { /* torn: the first sectors of a newer version reached the disk */
            size_t vn = lo + 1 + ts_rng_next(&sc->rng) % (span - 1);
            size_t vo = lo + ts_rng_next(&sc->rng) % (vn - lo);
            size_t cut = 1 + ts_rng_next(&sc->rng) % (PG / SECTOR - 1);
            memcpy(pg, sc->snaps[vo].img + off, PG);
            copy_sectors(pg, sc->snaps[vn].img + off, 0, cut);
            sc->torn_pages++;
            break;
        }
        default: /* sectors written in any order */
            for (size_t sct = 0; sct < PG / SECTOR; sct++)
                copy_sectors(pg, sc->snaps[lo + ts_rng_next(&sc->rng) % span].img + off, sct, 1);
            sc->torn_pages++;
            break;
        }
    }
}

static ctxs_session *open_image(const char *path, const ctxs_model *m, unsigned flags,
                                uint32_t recovery, uint32_t level, int *rc_out)
{
    ctxs_open_options o = CTXS_OPEN_OPTIONS_INIT;
    o.durability = level;
    ctxs_session *s = NULL;
    *rc_out = ctxs_session_open(&s, path, m, flags | recovery, &o);
    return s;
}

/* The generation that position p of s holds (GEN_BAD if none of those
 * committed there in the window matches, GEN_EVICTED if not held). */
static uint32_t actual_gen(const scen *sc, const window *w, const ctxs_session *s,
                           const ctxs_layout *lay, const ctxs_session_info *info, uint64_t p,
                           const char *tag)
{
    const ctxs_geometry *g = &sc->model.geometry;
    size_t per = (size_t)g->n_layers * g->n_kv_heads * g->head_dim;
    uint16_t k[TS_KV_MAX], v[TS_KV_MAX], ek[TS_KV_MAX], ev[TS_KV_MAX];
    state rec = {info->n_tokens, info->ring_start, 0};
    int rc = ctxs_session_read_token(k, v, s, p, CTXS_DTYPE_F16);
    if (!st_holds(&rec, p)) {
        cr_assert_eq(rc, CTXS_EEVICTED, "%s: position %llu is not held but read_token says %s", tag,
                     (unsigned long long)p, ctxs_err_name(rc));
        return GEN_EVICTED;
    }
    cr_assert_eq(rc, 0, "%s: read_token(%llu): %s", tag, (unsigned long long)p, ctxs_err_name(rc));
    uint32_t slot;
    cr_assert_eq(ctxs_session_get_slot(&slot, s, p), 0);
    cr_assert_eq(slot, ctxs__slot_of(p, sc->capacity, N_SINK));
    uint32_t tried[8];
    unsigned n_tried = 0;
    for (size_t j = w->hi + 1; j-- > w->lo;) {
        const snap *sn = &sc->snaps[j];
        if (p >= sn->st.n)
            continue;
        uint32_t gen = sn->gen[p];
        int seen = 0;
        for (unsigned i = 0; i < n_tried; i++)
            seen |= tried[i] == gen;
        if (seen)
            continue;
        if (n_tried < 8)
            tried[n_tried++] = gen;
        expect_kv(g, sc->window, info->n_tokens, p, gen, ek, ev);
        if (!memcmp(k, ek, per * 2) && !memcmp(v, ev, per * 2) &&
            lay->token_ids[slot] == ts_token(vpos(p, gen)))
            return gen;
    }
    return GEN_BAD;
}

/* Checks that s holds a prefix of a state committed in the window and that
 * every token it holds reads back as written. Returns that state's index. */
static size_t check_prefix(const scen *sc, const window *w, const ctxs_session *s, const char *tag)
{
    ctxs_session_info info;
    ctxs_layout lay;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(ctxs_session_get_layout(&lay, s), 0);
    uint64_t n = info.n_tokens;
    uint32_t *act = malloc((n ? n : 1) * sizeof(*act));
    cr_assert_not_null(act);
    for (uint64_t p = 0; p < n; p++) {
        act[p] = actual_gen(sc, w, s, &lay, &info, p, tag);
        cr_assert_neq(act[p], GEN_BAD,
                      "%s: held position %llu (of %llu, ring_start %llu) reads back as nothing "
                      "that was ever committed there: a wrong state was accepted",
                      tag, (unsigned long long)p, (unsigned long long)n,
                      (unsigned long long)info.ring_start);
    }
    size_t match = SIZE_MAX;
    for (size_t j = w->hi + 1; j-- > w->lo && match == SIZE_MAX;) {
        const snap *sn = &sc->snaps[j];
        int ok = n <= sn->st.n;
        for (uint64_t p = 0; ok && p < n; p++)
            if (act[p] != GEN_EVICTED)
                ok = st_holds(&sn->st, p) && sn->gen[p] == act[p];
        if (ok)
            match = j;
    }
    if (match == SIZE_MAX) {
        /* Say what was recovered, run by run of generations, and what the
         * states in the window were. */
        char runs[512], states[512];
        size_t at = 0;
        for (uint64_t p = 0; p < n && at < sizeof(runs) - 48;) {
            uint64_t q = p;
            while (q < n && act[q] == act[p])
                q++;
            if (act[p] == GEN_EVICTED)
                at += (size_t)snprintf(runs + at, sizeof(runs) - at, " [%llu,%llu) evicted",
                                       (unsigned long long)p, (unsigned long long)q);
            else
                at += (size_t)snprintf(runs + at, sizeof(runs) - at, " [%llu,%llu) gen %u",
                                       (unsigned long long)p, (unsigned long long)q, act[p]);
            p = q;
        }
        at = 0;
        for (size_t j = w->lo; j <= w->hi && at < sizeof(states) - 64; j++)
            at += (size_t)snprintf(states + at, sizeof(states) - at, " %zu:%s n %llu rs %llu", j,
                                   sc->snaps[j].what, (unsigned long long)sc->snaps[j].st.n,
                                   (unsigned long long)sc->snaps[j].st.rs);
        cr_assert_fail("%s: the recovered state (n %llu, ring_start %llu) is no prefix of any "
                       "state committed between snapshots %zu and %zu: a state spliced from "
                       "tokens of different histories was accepted.\n  recovered:%s\n  states:%s",
                       tag, (unsigned long long)n, (unsigned long long)info.ring_start, w->lo,
                       w->hi, runs, states);
    }
    free(act);
    uint64_t bad_pos = 0;
    int rc = ctxs_session_verify(&bad_pos, s);
    cr_assert_eq(rc, 0, "%s: verify: %s at %llu", tag, ctxs_err_name(rc),
                 (unsigned long long)bad_pos);
    if (sc->cur_gen == 0 && !sc->window)
        cr_assert_eq(ts_check_all(s), 0, "%s: ts_check_all", tag);
    return match;
}

/* Every held position of s reads back as generation exp[p]. */
static void check_exact(const scen *sc, const ctxs_session *s, const uint32_t *exp, const char *tag)
{
    ctxs_session_info info;
    ctxs_layout lay;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(ctxs_session_get_layout(&lay, s), 0);
    const ctxs_geometry *g = &sc->model.geometry;
    size_t per = (size_t)g->n_layers * g->n_kv_heads * g->head_dim;
    uint16_t k[TS_KV_MAX], v[TS_KV_MAX], ek[TS_KV_MAX], ev[TS_KV_MAX];
    state rec = {info.n_tokens, info.ring_start, 0};
    for (uint64_t p = 0; p < info.n_tokens; p++) {
        int rc = ctxs_session_read_token(k, v, s, p, CTXS_DTYPE_F16);
        if (!st_holds(&rec, p)) {
            cr_assert_eq(rc, CTXS_EEVICTED);
            continue;
        }
        cr_assert_eq(rc, 0, "%s: read_token(%llu): %s", tag, (unsigned long long)p,
                     ctxs_err_name(rc));
        uint32_t slot;
        cr_assert_eq(ctxs_session_get_slot(&slot, s, p), 0);
        expect_kv(g, sc->window, info.n_tokens, p, exp[p], ek, ev);
        cr_assert(!memcmp(k, ek, per * 2) && !memcmp(v, ev, per * 2) &&
                      lay.token_ids[slot] == ts_token(vpos(p, exp[p])),
                  "%s: position %llu (gen %u) reads back wrong", tag, (unsigned long long)p,
                  exp[p]);
    }
    uint64_t bad_pos = 0;
    int rc = ctxs_session_verify(&bad_pos, s);
    cr_assert_eq(rc, 0, "%s: verify: %s at %llu", tag, ctxs_err_name(rc),
                 (unsigned long long)bad_pos);
}

/* Opens the image read-write: recovery must come to the same state, write it
 * back, and take further commits that survive a reopen. */
static void check_read_write(scen *sc, const window *w, const uint8_t *img,
                             const ctxs_session_info *ro, size_t match, const char *tag)
{
    cr_assert_eq(ts_write_file(sc->rw_path, img, sc->file_len), 0);
    int rc;
    ctxs_session *s = open_image(sc->rw_path, &sc->model, 0, CTXS_OPEN_VERIFY, sc->level, &rc);
    cr_assert_eq(rc, 0, "%s: read-write open: %s", tag, ctxs_err_name(rc));
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert(info.n_tokens == ro->n_tokens && info.ring_start == ro->ring_start &&
                  info.lost_tokens == ro->lost_tokens,
              "%s: read-write recovery (n %llu, rs %llu, lost %llu) differs from read-only "
              "(n %llu, rs %llu, lost %llu)",
              tag, (unsigned long long)info.n_tokens, (unsigned long long)info.ring_start,
              (unsigned long long)info.lost_tokens, (unsigned long long)ro->n_tokens,
              (unsigned long long)ro->ring_start, (unsigned long long)ro->lost_tokens);
    check_prefix(sc, w, s, tag);

    uint64_t n0 = info.n_tokens;
    uint32_t most = sc->max_turn < 12 ? sc->max_turn : 12;
    uint32_t more = 1 + (uint32_t)(ts_rng_next(&sc->rng) % most);
    uint32_t *exp = malloc((size_t)(n0 + more) * sizeof(*exp));
    cr_assert_not_null(exp);
    for (uint64_t p = 0; p < n0; p++)
        exp[p] = p < sc->snaps[match].st.n ? sc->snaps[match].gen[p] : 0;
    ctxs_reservation r;
    uint16_t kk[TS_KV_MAX], vv[TS_KV_MAX];
    uint32_t ids[MAX_TURN];
    rc = ctxs_session_reserve(&r, s, more);
    cr_assert_eq(rc, 0, "%s: reserve after recovery: %s", tag, ctxs_err_name(rc));
    cr_assert_eq(r.first_pos, n0);
    for (uint32_t i = 0; i < more; i++) {
        exp[n0 + i] = GEN_AFTER;
        ts_fill_kv(&sc->model.geometry, vpos(n0 + i, GEN_AFTER), kk, vv);
        ids[i] = ts_token(vpos(n0 + i, GEN_AFTER));
        cr_assert_eq(ctxs_session_write_token(s, &r, i, kk, vv, CTXS_DTYPE_F16), 0);
    }
    rc = ctxs_session_commit(s, ids, more);
    cr_assert_eq(rc, 0, "%s: commit after recovery: %s", tag, ctxs_err_name(rc));
    ctxs_session_close(s);

    s = open_image(sc->rw_path, &sc->model, CTXS_RDONLY, CTXS_OPEN_VERIFY, sc->level, &rc);
    cr_assert_eq(rc, 0, "%s: reopen after recovery and commit: %s", tag, ctxs_err_name(rc));
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert(info.n_tokens == n0 + more && info.lost_tokens == 0,
              "%s: after recovery to %llu and a commit of %u, reopen holds %llu (lost %llu)", tag,
              (unsigned long long)n0, more, (unsigned long long)info.n_tokens,
              (unsigned long long)info.lost_tokens);
    check_exact(sc, s, exp, tag);
    ctxs_session_close(s);
    free(exp);
    sc->rw++;
}

/* Reseals every valid record with another boot's id: AUTO must then verify
 * and come to the state VERIFY came to. */
static void check_foreign_boot(scen *sc, const window *w, uint8_t *img,
                               const ctxs_session_info *ro, const char *tag)
{
    for (uint32_t i = 0; i < 2; i++) {
        ctxs__disk_record r;
        if (!record_at(img, i, &r))
            continue;
        for (int b = 0; b < 16; b++)
            r.boot_id[b] ^= (uint8_t)(0xa5 + b);
        r.crc32 = (uint32_t)crc32(0, (const Bytef *)&r, offsetof(ctxs__disk_record, crc32));
        memcpy(img + (i ? CTXS__RECORD1_OFF : CTXS__RECORD0_OFF), &r, sizeof(r));
    }
    cr_assert_eq(ts_write_file(sc->img_path, img, sc->file_len), 0);
    int rc;
    ctxs_session *s = open_image(sc->img_path, &sc->model, CTXS_RDONLY, 0,
                                 sc->level, &rc);
    cr_assert_eq(rc, 0, "%s: AUTO open of another boot's file: %s", tag, ctxs_err_name(rc));
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert(info.n_tokens == ro->n_tokens && info.ring_start == ro->ring_start,
              "%s: AUTO on a file from another boot recovered n %llu (rs %llu), VERIFY n %llu "
              "(rs %llu)",
              tag, (unsigned long long)info.n_tokens, (unsigned long long)info.ring_start,
              (unsigned long long)ro->n_tokens, (unsigned long long)ro->ring_start);
    check_prefix(sc, w, s, tag);
    ctxs_session_close(s);
    sc->auto_boot++;
}

/* Opens one crash image and checks it (see the top of the file); c numbers
 * it, and picks which also get the read-write and foreign-boot checks. */
static void check_image(scen *sc, const window *w, uint8_t *img, unsigned c)
{
    char tag[512];
    snprintf(tag, sizeof(tag), "%s: image %u (power lost during call %zu '%s'%s; durable at %zu; "
             "image in %.200s)",
             sc->name, c, w->hi, sc->snaps[w->hi].what, w->phase, w->lo, sc->img_path);

    ctxs__disk_record R;
    int ridx = newest_record(img, &R);
    cr_assert_geq(ridx, 0, "%s: the model made an image without a valid record", tag);
    /* The fewest tokens a state since the durable point held bounds what
     * recovery may keep from below: tokens below the watermark are durable,
     * and those above it that a rollback did not take back verify. Except in
     * a ring that evicted without a durable record (NONE, ASYNC): the disk
     * may hold an old record and data pages from several wraps later, and
     * then no state the record describes is left to keep. */
    uint64_t lb = UINT64_MAX;
    int evicted = 0;
    for (size_t j = w->lo; j <= w->hi; j++) {
        if (sc->snaps[j].st.n < lb)
            lb = sc->snaps[j].st.n;
        evicted |= sc->snaps[j].st.rs != sc->snaps[w->lo].st.rs;
    }
    if (evicted && sc->level != CTXS_SYNC_FULL)
        lb = 0;
    /* Likewise windowed rings at NONE, which never syncs: a reserve reuses
     * the slots of positions below the current record's window (a record
     * that may survive keeps its own window), so a count cut below the
     * record's, whose window reaches lower, may find its oldest slots taken
     * by newer tokens whose pages reached the disk while others did not.
     * No count from the watermark up is then whole, and recovery goes below
     * it. ASYNC syncs before a reserve reuses a slot of the watermark's
     * window, and keeps the watermark. */
    int window_floor = !(sc->window && sc->level == CTXS_SYNC_NONE);
    if (!window_floor)
        lb = 0;

    cr_assert_eq(ts_write_file(sc->img_path, img, sc->file_len), 0);
    int rc;
    ctxs_session *s = open_image(sc->img_path, &sc->model, CTXS_RDONLY, CTXS_OPEN_VERIFY,
                                 sc->level, &rc);
    cr_assert_eq(rc, 0, "%s: open: %s", tag, ctxs_err_name(rc));
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    uint64_t n = info.n_tokens;
    cr_assert(n <= R.n_tokens &&
                  (!window_floor ||
                   n >= (R.verified_from < R.n_tokens ? R.verified_from : R.n_tokens)),
              "%s: recovered %llu tokens from the newest valid record (seq %llu, n %llu, "
              "verified_from %llu)",
              tag, (unsigned long long)n, (unsigned long long)R.seq,
              (unsigned long long)R.n_tokens, (unsigned long long)R.verified_from);
    /* lost_tokens counts held tokens: those cut from the end and those
     * evicted from the front of the ring. */
    state rs_held = {R.n_tokens, R.ring_start, R.verified_from};
    uint64_t held_before = st_held(&rs_held);
    cr_assert_geq(info.ring_start, R.ring_start, "%s: recovery moved the ring back", tag);
    cr_assert_eq(info.lost_tokens, held_before - info.n_held,
                 "%s: lost_tokens %llu, held %llu then %u", tag,
                 (unsigned long long)info.lost_tokens, (unsigned long long)held_before,
                 info.n_held);
    if (info.lost_tokens)
        cr_assert(info.flags & CTXS_INFO_RECOVERED, "%s: dropped tokens without saying so", tag);
    else
        cr_assert_eq(info.ring_start, R.ring_start);
    cr_assert_geq(n, lb,
                  "%s: recovered %llu tokens, but every state since the durable point held at "
                  "least %llu",
                  tag, (unsigned long long)n, (unsigned long long)lb);
    size_t match = check_prefix(sc, w, s, tag);
    ctxs_session_close(s);

    sc->images++;
    sc->truncated += n < R.n_tokens;
    sc->lost += R.n_tokens - n;
    if (c % 8 == 3)
        check_read_write(sc, w, img, &info, match, tag);
    if (c % 6 == 1)
        check_foreign_boot(sc, w, img, &info, tag);
}

static void crash_images(scen *sc, unsigned count)
{
    uint8_t *img = malloc(sc->file_len);
    cr_assert_not_null(img);
    for (unsigned c = 0; c < count; c++) {
        size_t t = (size_t)(ts_rng_next(&sc->rng) % sc->n_snaps);
        window w = crash_window(sc, t);
        make_image(sc, &w, img);
        check_image(sc, &w, img, c);
    }
    free(img);
}

/* --- Scripts ---------------------------------------------------------------- */

typedef struct script {
    uint32_t level, capacity, initial;
    uint32_t window, batch; /* a schedule: layer 1's window (0: none) */
    unsigned ops, pct_rollback, pct_sync, max_back;
    int rollback_first; /* the first call after the durable point rolls back below it */
    int must_wrap;
    unsigned images;
} script;

typedef struct totals {
    uint64_t images, snaps, dirty, torn, truncated, lost, rw, auto_boot, sync_evictions;
    uint64_t ring_claim_syncs;
} totals;

static void run_script(const char *name, const script *d, uint64_t seed, totals *tot)
{
    scen sc;
    scen_init_schedule(&sc, name, d->level, d->capacity, seed, d->window, d->batch);
    ctxs_session_info info;
    for (;;) {
        cr_assert_eq(ctxs_session_get_info(&info, sc.s), 0);
        if (info.n_tokens >= d->initial)
            break;
        uint64_t left = d->initial - info.n_tokens;
        op_append(&sc, (uint32_t)(left < sc.max_turn ? left : sc.max_turn));
    }
    sc.recording = 1;
    op_sync(&sc); /* snapshot 0: the durable point */

    for (unsigned i = 0; i < d->ops; i++) {
        cr_assert_eq(ctxs_session_get_info(&info, sc.s), 0);
        unsigned r = (unsigned)(ts_rng_next(&sc.rng) % 100);
        if ((i == 0 && d->rollback_first) || (r < d->pct_rollback && info.n_tokens > 1)) {
            uint64_t back = 1 + ts_rng_next(&sc.rng) % d->max_back;
            op_rollback(&sc, info.n_tokens > back ? info.n_tokens - back : 0);
        } else if (r < d->pct_rollback + d->pct_sync) {
            op_sync(&sc);
        } else {
            op_append(&sc, 1 + (uint32_t)(ts_rng_next(&sc.rng) % sc.max_turn));
        }
    }
    cr_assert_eq(ctxs_session_get_info(&info, sc.s), 0);
    if (d->must_wrap)
        cr_assert_gt(info.ring_start, N_SINK, "%s: the ring never wrapped", name);

    crash_images(&sc, d->images);
    say("%s: %zu snapshots, %llu crash images (%llu dirty pages, %llu torn), %llu "
                "recovered short (%llu tokens dropped), %llu reopened read-write, %llu with a "
                "foreign boot id, %llu reserves that needed a durable record",
                name, sc.n_snaps, (unsigned long long)sc.images,
                (unsigned long long)sc.dirty_pages, (unsigned long long)sc.torn_pages,
                (unsigned long long)sc.truncated, (unsigned long long)sc.lost,
                (unsigned long long)sc.rw, (unsigned long long)sc.auto_boot,
                (unsigned long long)sc.evictions_needing_sync);
    tot->images += sc.images;
    tot->snaps += sc.n_snaps;
    tot->dirty += sc.dirty_pages;
    tot->torn += sc.torn_pages;
    tot->truncated += sc.truncated;
    tot->lost += sc.lost;
    tot->rw += sc.rw;
    tot->auto_boot += sc.auto_boot;
    tot->sync_evictions += sc.evictions_needing_sync;
    tot->ring_claim_syncs += sc.ring_claim_syncs;
    scen_free(&sc);
}

static void log_totals(const char *test, const totals *t)
{
    say("%s: %llu crash images tried from %llu snapshots; %llu recovered short",
                test, (unsigned long long)t->images, (unsigned long long)t->snaps,
                (unsigned long long)t->truncated);
}

static const char *level_name(uint32_t level)
{
    return level == CTXS_SYNC_NONE ? "NONE" : level == CTXS_SYNC_ASYNC ? "ASYNC" : "FULL";
}

Test(torn, power_loss_after_commits_at_none_keeps_a_verified_prefix, .timeout = 300)
{
    totals t = {0};
    script d = {.level = CTXS_SYNC_NONE, .capacity = 1024, .initial = 100, .ops = 16,
                .pct_sync = 10, .images = 400};
    run_script("torn NONE", &d, ts_seed("torn NONE"), &t);
    log_totals("none", &t);
}

Test(torn, power_loss_after_commits_at_async_keeps_a_verified_prefix, .timeout = 300)
{
    totals t = {0};
    script d = {.level = CTXS_SYNC_ASYNC, .capacity = 1024, .initial = 100, .ops = 16,
                .pct_sync = 10, .images = 400};
    run_script("torn ASYNC", &d, ts_seed("torn ASYNC"), &t);
    log_totals("async", &t);
}

Test(torn, power_loss_after_full_commits_loses_no_acknowledged_token, .timeout = 300)
{
    totals t = {0};
    script d = {.level = CTXS_SYNC_FULL, .capacity = 1024, .initial = 100, .ops = 12,
                .images = 400};
    run_script("torn FULL", &d, ts_seed("torn FULL"), &t);
    log_totals("full", &t);
}

Test(torn, power_loss_while_the_ring_wraps_keeps_a_verified_prefix, .timeout = 300)
{
    totals t = {0};
    uint64_t seed = ts_seed("torn ring");
    for (uint32_t level = CTXS_SYNC_NONE; level <= CTXS_SYNC_FULL; level++) {
        char name[32];
        snprintf(name, sizeof(name), "torn ring %s", level_name(level));
        script d = {.level = level, .capacity = 256, .initial = 230, .ops = 14, .pct_sync = 5,
                    .must_wrap = 1, .images = 300};
        run_script(name, &d, seed + level, &t);
    }
    log_totals("ring", &t);
    cr_assert_gt(t.sync_evictions, 0, "no eviction overwrote a durable token: the test lost its point");
}

Test(torn, power_loss_around_rollbacks_keeps_a_verified_prefix, .timeout = 300)
{
    totals t = {0};
    uint64_t seed = ts_seed("torn rollback");
    for (uint32_t level = CTXS_SYNC_NONE; level <= CTXS_SYNC_FULL; level++) {
        char name[40];
        snprintf(name, sizeof(name), "torn rollback %s", level_name(level));
        script d = {.level = level, .capacity = 256, .initial = 120, .ops = 18,
                    .pct_rollback = 30, .pct_sync = 5, .max_back = 30, .rollback_first = 1,
                    .images = 400};
        run_script(name, &d, seed + level, &t);
    }
    log_totals("rollback", &t);
}

/* A schedule of a global and a windowed layer (window 16, batch 8: a ring
 * of 24 slots that wraps every few turns, in a session that never does).
 * The windowed ring reuses slots of positions the durable record claims
 * below its watermark, which recovery trusts unread: reserve must make a
 * record that does not claim them durable first, or an image with the old
 * record and the new slot's page holds a wrong window. A writer that opens
 * after a commit that died before its record must likewise zero the dead
 * positions' group entries durably (tested below). */
Test(torn, power_loss_over_windowed_rings_keeps_a_verified_prefix, .timeout = 300)
{
    totals t = {0};
    uint64_t seed = ts_seed("torn windowed");
    for (uint32_t level = CTXS_SYNC_NONE; level <= CTXS_SYNC_FULL; level++) {
        char name[40];
        snprintf(name, sizeof(name), "torn windowed %s", level_name(level));
        script d = {.level = level, .capacity = 1024, .initial = 60, .window = 16, .batch = 8,
                    .ops = 40, .pct_rollback = 10, .pct_sync = 8, .max_back = 12,
                    .images = 400};
        run_script(name, &d, seed + level, &t);
    }
    log_totals("windowed", &t);
    say("windowed: %llu reserves made a record durable over the ring's claimed slots",
        (unsigned long long)t.ring_claim_syncs);
    cr_assert_gt(t.ring_claim_syncs, 0,
                 "no reserve reused a slot a durable record claims: the test lost its point");
}

/* The crash image a rollback most exposes: every data page written back
 * after the rollback and the rewrite, but neither record page since the
 * commit before the rollback (the commit after it overwrote that record in
 * the page cache). The record on disk claims old-history tokens past the
 * rewritten ones; each token verifies on its own, so only a check that
 * binds tokens to one history refuses the splice. */
Test(torn, a_record_from_before_a_rollback_never_splices_two_histories, .timeout = 120)
{
    for (uint32_t level = CTXS_SYNC_NONE; level <= CTXS_SYNC_FULL; level++) {
        char name[48];
        snprintf(name, sizeof(name), "splice %s", level_name(level));
        scen sc;
        scen_init(&sc, name, level, 256, 1);
        op_append(&sc, 40);
        op_append(&sc, 40);
        op_append(&sc, 20);
        sc.recording = 1;
        op_sync(&sc);               /* durable: n 100 */
        op_append(&sc, 20);         /* n 120, old history */
        size_t before = sc.n_snaps - 1;
        op_rollback(&sc, 110);      /* above the watermark, yet made durable */
        op_append(&sc, 5);          /* n 115: 110..114 rewritten */
        size_t last = sc.n_snaps - 1;

        window w = crash_window(&sc, last);
        cr_assert_eq(w.lo, sc.level == CTXS_SYNC_FULL ? last : 0);
        uint8_t *img = malloc(sc.file_len);
        cr_assert_not_null(img);
        memcpy(img, sc.snaps[last].img, sc.file_len);
        /* Both record pages as they were after the commit of 120, where the
         * model allows it (not made durable since). */
        int used = 0;
        for (int i = 0; i < 2; i++) {
            size_t off = i ? CTXS__RECORD1_OFF : CTXS__RECORD0_OFF;
            if (w.page_lo[1 + i] <= before) {
                memcpy(img + off, sc.snaps[before].img + off, PG);
                used = 1;
            }
        }
        if (used)
            check_image(&sc, &w, img, 0);
        say("%s: %s", name, used ? "checked the spliced image" : "records were durable");
        free(img);
        scen_free(&sc);
    }
}

/* --- Bit flips in the first page --------------------------------------------- */

static void flip_bit(int fd, size_t bit)
{
    uint8_t b;
    cr_assert_eq(pread(fd, &b, 1, (off_t)(bit / 8)), 1);
    b ^= (uint8_t)(1u << (bit % 8));
    cr_assert_eq(pwrite(fd, &b, 1, (off_t)(bit / 8)), 1);
}

static void flip_in(uint8_t *img, size_t bit)
{
    img[bit / 8] ^= (uint8_t)(1u << (bit % 8));
}

/* Every single-bit flip of the header is refused; every single-bit flip of
 * one commit record falls back to the other, exactly; flips of both records
 * are refused; flips of the unused rest of the first 16 KiB either change
 * nothing or are refused. */
Test(torn, every_bit_flip_in_the_header_or_a_record_is_caught_or_falls_back, .timeout = 300)
{
    uint64_t rng = ts_seed("bit flips");
    char *dir = ts_mkdtemp();
    char path[4096], rw_path[4096];
    snprintf(path, sizeof(path), "%s/flip.ctxs", dir);
    snprintf(rw_path, sizeof(rw_path), "%s/flip-rw.ctxs", dir);
    ctxs_model m = ts_model(MODEL_SEED);
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = 256;
    o.n_sink = N_SINK;
    o.open.durability = CTXS_SYNC_ASYNC;
    ctxs_session *s;
    cr_assert_eq(ctxs_session_create(&s, path, &m, &o), 0);
    cr_assert_eq(ts_append(s, 30), 0);
    cr_assert_eq(ts_append(s, 21), 0);
    ctxs_session_close(s);

    size_t len;
    uint8_t *img = ts_read_file(path, &len);
    ctxs__disk_record rec[2];
    cr_assert(record_at(img, 0, &rec[0]) && record_at(img, 1, &rec[1]),
              "after two commits both records should be valid");
    cr_assert_neq(rec[0].seq, rec[1].seq);
    cr_assert_neq(rec[0].n_tokens, rec[1].n_tokens);
    int newer = rec[1].seq > rec[0].seq;
    cr_assert_eq(rec[newer].n_tokens, 51);
    cr_assert_eq(rec[!newer].n_tokens, 30);

    int fd = open(path, O_RDWR | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    int rc;
    unsigned opens = 0;

    for (size_t bit = 0; bit < CTXS__HEADER_BYTES * 8; bit++) {
        flip_bit(fd, bit);
        s = open_image(path, NULL, CTXS_RDONLY, CTXS_OPEN_VERIFY, CTXS_SYNC_ASYNC, &rc);
        cr_assert(rc == CTXS_ECORRUPT || rc == CTXS_EFOREIGN || rc == CTXS_EVERSION,
                  "header byte %zu bit %zu flipped: open gives %s", bit / 8, bit % 8,
                  ctxs_err_name(rc));
        cr_assert_null(s);
        flip_bit(fd, bit);
        opens++;
    }

    unsigned rw_checks = 0;
    for (uint32_t i = 0; i < 2; i++) {
        const ctxs__disk_record *other = &rec[!i];
        size_t base = (size_t)(i ? CTXS__RECORD1_OFF : CTXS__RECORD0_OFF) * 8;
        for (size_t b = 0; b < CTXS__RECORD_BYTES * 8; b++) {
            flip_bit(fd, base + b);
            s = open_image(path, &m, CTXS_RDONLY, CTXS_OPEN_VERIFY, CTXS_SYNC_ASYNC, &rc);
            cr_assert_eq(rc, 0, "record %u byte %zu bit %zu flipped: open gives %s", i, b / 8,
                         b % 8, ctxs_err_name(rc));
            ctxs_session_info info;
            cr_assert_eq(ctxs_session_get_info(&info, s), 0);
            cr_assert(info.n_tokens == other->n_tokens && info.seq == other->seq,
                      "record %u byte %zu bit %zu flipped: state n %llu seq %llu, the other "
                      "record says n %llu seq %llu",
                      i, b / 8, b % 8, (unsigned long long)info.n_tokens,
                      (unsigned long long)info.seq, (unsigned long long)other->n_tokens,
                      (unsigned long long)other->seq);
            cr_assert_eq(ts_check_all(s), 0);
            cr_assert_eq(ctxs_session_verify(NULL, s), 0);
            ctxs_session_close(s);
            flip_bit(fd, base + b);
            opens++;

            if (b % 61 == 7) {
                /* Read-write: the next commits go to the damaged record's
                 * place, never over the only good one. */
                uint8_t *copy = malloc(len);
                memcpy(copy, img, len);
                flip_in(copy, base + b);
                cr_assert_eq(ts_write_file(rw_path, copy, len), 0);
                s = open_image(rw_path, &m, 0, CTXS_OPEN_VERIFY, CTXS_SYNC_ASYNC, &rc);
                cr_assert_eq(rc, 0, "record %u bit %zu flipped: read-write open: %s", i, b,
                             ctxs_err_name(rc));
                cr_assert_eq(ts_append(s, 5), 0);
                ctxs_session_close(s);
                free(copy);
                copy = ts_read_file(rw_path, &len);
                ctxs__disk_record a, c;
                int ia = newest_record(copy, &a);
                cr_assert_geq(ia, 0);
                cr_assert(record_at(copy, (uint32_t)!ia, &c),
                          "record %u bit %zu flipped: after reopen and a commit the other "
                          "record is not valid: the commit overwrote the only good one",
                          i, b);
                cr_assert_eq(a.n_tokens, other->n_tokens + 5);
                cr_assert_eq(c.n_tokens, other->n_tokens);
                free(copy);
                s = open_image(rw_path, &m, CTXS_RDONLY, CTXS_OPEN_VERIFY,
                               CTXS_SYNC_ASYNC, &rc);
                cr_assert_eq(rc, 0);
                cr_assert_eq(ctxs_session_get_info(&info, s), 0);
                cr_assert_eq(info.n_tokens, other->n_tokens + 5);
                cr_assert_eq(ts_check_all(s), 0);
                ctxs_session_close(s);
                rw_checks++;
            }
        }
    }

    unsigned both = 0;
    for (; both < 128; both++) {
        size_t b0 = (size_t)CTXS__RECORD0_OFF * 8 + ts_rng_next(&rng) % (CTXS__RECORD_BYTES * 8);
        size_t b1 = (size_t)CTXS__RECORD1_OFF * 8 + ts_rng_next(&rng) % (CTXS__RECORD_BYTES * 8);
        flip_bit(fd, b0);
        flip_bit(fd, b1);
        s = open_image(path, &m, CTXS_RDONLY, CTXS_OPEN_VERIFY, CTXS_SYNC_ASYNC, &rc);
        cr_assert_eq(rc, CTXS_ECORRUPT, "both records flipped (bits %zu, %zu): open gives %s",
                     b0, b1, ctxs_err_name(rc));
        flip_bit(fd, b0);
        flip_bit(fd, b1);
        opens++;
    }

    /* The unused bytes of the first page. */
    static const size_t gaps[3][2] = {
        {CTXS__HEADER_BYTES, CTXS__RECORD0_OFF},
        {CTXS__RECORD0_OFF + CTXS__RECORD_BYTES, CTXS__RECORD1_OFF},
        {CTXS__RECORD1_OFF + CTXS__RECORD_BYTES, CTXS__PAGE},
    };
    unsigned gap_flips = 0;
    for (; gap_flips < 384; gap_flips++) {
        const size_t *g = gaps[gap_flips % 3];
        size_t bit = g[0] * 8 + ts_rng_next(&rng) % ((g[1] - g[0]) * 8);
        flip_bit(fd, bit);
        s = open_image(path, &m, CTXS_RDONLY, CTXS_OPEN_VERIFY, CTXS_SYNC_ASYNC, &rc);
        cr_assert(rc == 0 || rc == CTXS_ECORRUPT, "unused byte %zu flipped: open gives %s",
                  bit / 8, ctxs_err_name(rc));
        if (rc == 0) {
            ctxs_session_info info;
            cr_assert_eq(ctxs_session_get_info(&info, s), 0);
            cr_assert_eq(info.n_tokens, rec[newer].n_tokens,
                         "unused byte %zu flipped: the state changed", bit / 8);
            cr_assert_eq(ts_check_all(s), 0);
            ctxs_session_close(s);
        }
        flip_bit(fd, bit);
        opens++;
    }
    close(fd);

    /* Untouched, the file still opens to the newer state. */
    s = open_image(path, &m, CTXS_RDONLY, CTXS_OPEN_VERIFY, CTXS_SYNC_ASYNC, &rc);
    cr_assert_eq(rc, 0);
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(info.n_tokens, rec[newer].n_tokens);
    ctxs_session_close(s);

    say("bit flips: %u opens (%u header bits, %u record bits, %u read-write, %u with both "
                "records flipped, %u in unused bytes)",
                opens, CTXS__HEADER_BYTES * 8, 2 * CTXS__RECORD_BYTES * 8, rw_checks, both,
                gap_flips);
    free(img);
    ts_rmtree(dir);
    free(dir);
}

/* --- A commit that died before its record -------------------------------- */

/* A writer killed inside commit leaves checksums past the committed count
 * that match the bytes it wrote. If a later record claimed those positions
 * while a power loss kept the old pages, they would verify: the next writer
 * must zero them, durably, before it writes. */
Test(torn, a_commit_that_died_before_its_record_leaves_nothing_to_splice)
{
    char *dir = ts_mkdtemp();
    const char *path = ts_path(dir, "dead.ctxs");
    ctxs_model m = ts_model(1);
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = 256;
    o.n_sink = N_SINK;
    o.open.durability = CTXS_SYNC_NONE;
    ctxs_session *s;
    cr_assert_eq(ctxs_session_create(&s, path, &m, &o), 0);
    cr_assert_eq(ts_append(s, 100), 0);
    cr_assert_eq(ctxs_session_sync(s), 0);

    /* The dead attempt: positions 100..109 written, their token ids and
     * checksums stored, no record. Its contents are those of positions
     * 1100.., so that they cannot pass for what is appended later. */
    enum { DEAD = 10, PER = 2 * 2 * 8 };
    ctxs_reservation r;
    cr_assert_eq(ctxs_session_reserve(&r, s, DEAD), 0);
    uint16_t k[PER], v[PER];
    for (uint32_t i = 0; i < DEAD; i++) {
        ts_fill_kv(&m.geometry, 1100 + i, k, v);
        cr_assert_eq(ctxs_session_write_token(s, &r, i, k, v, CTXS_DTYPE_F16), 0);
        ctxs__token_table(s)[100 + i] = ts_token(1100 + i);
    }
    uint64_t sums[DEAD];
    ctxs__token_sums(s, 100, DEAD, sums);
    memcpy(ctxs__sum_table(s) + 100, sums, sizeof(sums));
    ctxs_session_close(s);
    size_t len;
    uint8_t *dead = ts_read_file(path, &len); /* as if all written back */

    /* The next writer appends 5 other tokens at NONE. */
    o = (ctxs_create_options)CTXS_CREATE_OPTIONS_INIT;
    o.open.durability = CTXS_SYNC_NONE;
    cr_assert_eq(ctxs_session_open(&s, path, &m, 0, &o.open), 0);
    for (uint32_t i = 0; i < DEAD; i++)
        cr_expect_eq(ctxs__sum_table(s)[100 + i], 0, "open left a stale checksum at %u", 100 + i);
    uint64_t kv_off = s->lay.kv_off, tokens_off = s->lay.tokens_off;
    uint8_t *opened = ts_read_file(path, &len); /* its tables were synced */
    cr_assert_eq(ts_append(s, 5), 0);
    ctxs_session_close(s);
    uint8_t *img = ts_read_file(path, &len);

    /* Power loss: the new record reached the disk, the tables as the open
     * made them durable, the KV pages as the dead attempt left them. */
    memcpy(img + tokens_off, opened + tokens_off, kv_off - tokens_off);
    memcpy(img + kv_off, dead + kv_off, len - kv_off);
    const char *image = ts_path(dir, "image.ctxs");
    cr_assert_eq(ts_write_file(image, img, len), 0);
    cr_assert_eq(ctxs_session_open(&s, image, &m, CTXS_RDONLY | CTXS_OPEN_VERIFY, NULL), 0);
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_expect_eq(info.n_tokens, 100, "recovered %llu tokens", (unsigned long long)info.n_tokens);
    cr_expect_eq(ts_check_all(s), 0, "a wrong state was accepted");
    ctxs_session_close(s);
    free(dead);
    free(opened);
    free(img);
    ts_rmtree(dir);
    free(dir);
}

/* The same with a windowed layer, whose positions its group's entries
 * vouch for rather than the session's checksums. The retry commits the
 * same token ids with other K/V, as an engine would that recomputed the
 * turn. Power loss: the new record, token ids, checksums and global
 * layer's K/V reached the disk, the group's table as the open made it
 * durable, the windowed layer's K/V as the dead attempt left it. Had the
 * open kept the dead entries, they would vouch for the dead K/V under the
 * new record. */
Test(torn, a_commit_that_died_before_its_record_leaves_no_group_entry_to_splice)
{
    enum { W = 16, BATCH = 16, DEAD = 10, PER = 2 * 2 * 8 };
    char *dir = ts_mkdtemp();
    const char *path = ts_path(dir, "dead-window.ctxs");
    ctxs_model m = ts_model(1);
    m.geometry.period = 2; /* layer 0 global, layer 1 windowed */
    m.geometry.window[1] = W;
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = 256;
    o.n_sink = N_SINK;
    o.batch = BATCH;
    o.open.durability = CTXS_SYNC_NONE;
    ctxs_session *s;
    cr_assert_eq(ctxs_session_create(&s, path, &m, &o), 0);
    cr_assert_eq(s->lay.n_groups, 1);
    const uint32_t len = s->lay.groups[0].len;
    cr_assert_eq(len, W + BATCH);
    for (int i = 0; i < 10; i++)
        cr_assert_eq(ts_append(s, 10), 0);
    cr_assert_eq(ctxs_session_sync(s), 0);

    /* The dead attempt: positions 100..109 with the K/V of 1100.., their
     * token ids, checksums and group entries stored, no record. */
    ctxs_reservation r;
    cr_assert_eq(ctxs_session_reserve(&r, s, DEAD), 0);
    uint16_t k[PER], v[PER];
    for (uint32_t i = 0; i < DEAD; i++) {
        ts_fill_kv(&m.geometry, 1100 + i, k, v);
        cr_assert_eq(ctxs_session_write_token(s, &r, i, k, v, CTXS_DTYPE_F16), 0);
        ctxs__token_table(s)[100 + i] = ts_token(100 + i);
    }
    uint64_t sums[DEAD];
    ctxs__token_sums(s, 100, DEAD, sums);
    memcpy(ctxs__sum_table(s) + 100, sums, sizeof(sums));
    ctxs__group_sums(s, 0, 100, DEAD, sums);
    for (uint32_t i = 0; i < DEAD; i++)
        ctxs__group_table(s, 0)[(100 + i) % len] = (ctxs__group_entry){100 + i, sums[i]};
    /* The windowed layer's runs: layer 1's, after layer 0's. */
    const uint64_t wkv_from = s->lay.kv_off + ctxs__run_off(&s->lay, 2 * 2);
    const uint64_t wkv_to = wkv_from + 2 * 2 * (uint64_t)len * s->lay.slot_bytes;
    const uint64_t table_off = s->lay.groups[0].table_off;
    const uint64_t table_bytes = (uint64_t)len * sizeof(ctxs__group_entry);
    ctxs_session_close(s);
    size_t flen;
    uint8_t *dead = ts_read_file(path, &flen); /* as if all written back */
    cr_assert_leq(wkv_to, flen);

    /* The next writer retries 5 of them at NONE. */
    cr_assert_eq(ctxs_session_open(&s, path, &m, 0, &o.open), 0);
    for (uint32_t i = 0; i < DEAD; i++) {
        const ctxs__group_entry *e = &ctxs__group_table(s, 0)[(100 + i) % len];
        cr_expect(e->sum == 0 && e->pos == 0,
                  "open left the group entry of position %u (pos %llu, sum %016llx)", 100 + i,
                  (unsigned long long)e->pos, (unsigned long long)e->sum);
    }
    uint8_t *opened = ts_read_file(path, &flen); /* its tables were synced */
    cr_assert_eq(ts_append(s, 5), 0);
    ctxs_session_close(s);
    uint8_t *img = ts_read_file(path, &flen);

    memcpy(img + table_off, opened + table_off, table_bytes);
    memcpy(img + wkv_from, dead + wkv_from, wkv_to - wkv_from);
    const char *image = ts_path(dir, "image.ctxs");
    cr_assert_eq(ts_write_file(image, img, flen), 0);
    cr_assert_eq(ctxs_session_open(&s, image, &m, CTXS_RDONLY | CTXS_OPEN_VERIFY, NULL), 0);
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_expect_eq(info.n_tokens, 100,
                 "recovered %llu tokens: the windowed layer's positions from 100 hold the dead "
                 "attempt's K/V, and its group entries vouched for them",
                 (unsigned long long)info.n_tokens);
    /* Whatever was kept reads back as written: the windowed layer over the
     * window, the global layer everywhere. */
    uint16_t rk[PER], rv[PER];
    for (uint64_t p = 0; p < info.n_tokens; p++) {
        cr_assert_eq(ctxs_session_read_token(rk, rv, s, p, CTXS_DTYPE_F16), 0);
        expect_kv(&m.geometry, W, info.n_tokens, p, 0, k, v);
        cr_expect(!memcmp(rk, k, sizeof(k)) && !memcmp(rv, v, sizeof(v)),
                  "position %llu of %llu reads back other K/V than was committed",
                  (unsigned long long)p, (unsigned long long)info.n_tokens);
    }
    cr_expect_eq(ctxs_session_verify(NULL, s), 0);
    ctxs_session_close(s);
    free(dead);
    free(opened);
    free(img);
    ts_rmtree(dir);
    free(dir);
}

/* --- Recovery beyond open ------------------------------------------------- */

/* Overwrites the K/V bytes of a slot in every run, as a page that never
 * reached the disk would leave them. */
static void lose_slot(const char *path, uint32_t slot)
{
    int fd = open(path, O_RDWR);
    cr_assert_geq(fd, 0);
    ctxs__disk_header h;
    cr_assert_eq(pread(fd, &h, sizeof(h), 0), (ssize_t)sizeof(h));
    uint8_t junk[4096];
    memset(junk, 0x55, sizeof(junk));
    size_t sb = (size_t)h.head_dim * h.elem_bytes;
    for (uint64_t run = 0; run < 2ull * h.n_layers * h.n_kv_heads; run++)
        cr_assert_eq(pwrite(fd, junk, sb, (off_t)(h.kv_off + (run * h.capacity + slot) * sb)),
                     (ssize_t)sb);
    close(fd);
}

/* A reader that verified at open must not take back, at refresh, the tokens
 * its recovery dropped: a new record that no writer of this boot wrote is
 * verified like one found at open. */
Test(torn, a_reader_refresh_verifies_like_its_open)
{
    char *dir = ts_mkdtemp();
    const char *path = ts_path(dir, "reader.ctxs");
    ctxs_model m = ts_model(1);
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = 256;
    ctxs_session *s;
    cr_assert_eq(ctxs_session_create(&s, path, &m, &o), 0);
    cr_assert_eq(ts_append(s, 100), 0);
    ctxs_session_close(s);
    for (uint32_t slot = 60; slot < 64; slot++)
        lose_slot(path, slot);

    cr_assert_eq(ctxs_session_open(&s, path, NULL, CTXS_RDONLY | CTXS_OPEN_VERIFY, NULL), 0);
    cr_expect_eq(ts_info(s).n_tokens, 60);
    cr_assert_eq(ctxs_session_refresh(s), 0);
    cr_expect_eq(ts_info(s).n_tokens, 60, "refresh of the same record");

    /* A newer record (as a writer of another boot would leave). */
    int fd = open(path, O_RDWR);
    ctxs__disk_record r[2];
    cr_assert_eq(pread(fd, &r[0], sizeof(r[0]), CTXS__RECORD0_OFF), (ssize_t)sizeof(r[0]));
    cr_assert_eq(pread(fd, &r[1], sizeof(r[1]), CTXS__RECORD1_OFF), (ssize_t)sizeof(r[1]));
    int newer = r[1].seq > r[0].seq;
    ctxs__disk_record next = r[newer];
    next.seq++;
    memset(next.boot_id, 0xb0, sizeof(next.boot_id));
    ctxs__record_seal(&next, (uint32_t)!newer);
    cr_assert_eq(pwrite(fd, &next, sizeof(next), !newer ? CTXS__RECORD1_OFF : CTXS__RECORD0_OFF),
                 (ssize_t)sizeof(next));
    close(fd);

    cr_assert_eq(ctxs_session_refresh(s), 0);
    ctxs_session_info info = ts_info(s);
    cr_expect_eq(info.n_tokens, 60, "refresh took back %llu unverified tokens",
                 (unsigned long long)info.n_tokens);
    cr_expect(info.flags & CTXS_INFO_RECOVERED);
    cr_expect_eq(ts_check_all(s), 0);
    cr_expect_eq(ctxs_session_verify(NULL, s), 0);
    ctxs_session_close(s);
    ts_rmtree(dir);
    free(dir);
}

/* Tokens a sync made durable survive a power loss that loses later ones,
 * even after the ring has evicted past them: the eviction keeps the
 * watermark, and recovery cuts at the first lost token after it. */
Test(torn, tokens_a_sync_made_durable_survive_a_later_loss_in_a_ring)
{
    char *dir = ts_mkdtemp();
    const char *path = ts_path(dir, "ring.ctxs");
    ctxs_model m = ts_model(1);
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = 64;
    o.n_sink = N_SINK;
    o.ring = 1;
    ctxs_session *s;
    cr_assert_eq(ctxs_session_create(&s, path, &m, &o), 0);
    for (int i = 0; i < 25; i++)
        cr_assert_eq(ts_append(s, 4), 0);
    cr_assert_eq(ctxs_session_sync(s), 0); /* n 100, held 40..99 durable */
    for (int i = 0; i < 10; i++)
        cr_assert_eq(ts_append(s, 4), 0);
    ctxs_session_close(s);
    for (uint64_t p = 104; p < 108; p++)
        lose_slot(path, ctxs__slot_of(p, 64, N_SINK));

    cr_assert_eq(ctxs_session_open(&s, path, &m, CTXS_OPEN_VERIFY, NULL), 0);
    ctxs_session_info info = ts_info(s);
    cr_expect_eq(info.n_tokens, 104, "recovered %llu", (unsigned long long)info.n_tokens);
    uint32_t slot;
    cr_expect_eq(ctxs_session_get_slot(&slot, s, 99), 0, "a synced token was dropped");
    cr_expect_eq(ts_check_all(s), 0);
    ctxs_session_close(s);
    ts_rmtree(dir);
    free(dir);
}
