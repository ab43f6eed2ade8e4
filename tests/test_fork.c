/*
 * ctxs_session_fork: a new session holding a prefix of another's tokens.
 *
 * A fork must hold exactly the state ctxs_session_rollback() would give its
 * source, every token reading back as written and verifying, with no
 * checksum left for a slot it does not hold; it must be independent of its
 * source afterwards; and it must never hold bytes its source did not hold
 * at one moment: a source changed under the copy gives CTXS_ESTALE. The
 * source is changed under the copy deterministically through an internal
 * hook, and racily by another process. On this filesystem (ext4, tmpfs)
 * the copy path runs; on XFS or Btrfs the same tests run the clone path.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "label.h"
#include "support.h"

TestSuite(fork, .init = ts_scratch_init, .fini = ts_scratch_fini, .timeout = 300);

/* --- contents: generation g of position pos -------------------------------
 *
 * Generation 0 is what ts_append() writes; other generations are what a
 * writer writes after rolling back, different bytes and token ids at the
 * same positions. Nothing here asserts: child processes use it too. */

static uint32_t gen_token(uint64_t pos, uint32_t g)
{
    return ts_token(pos) + g * 65536u; /* ts_token() < 50000 */
}

static void gen_kv(const ctxs_geometry *geo, uint64_t pos, uint32_t g, uint16_t *k, uint16_t *v)
{
    ts_fill_kv(geo, pos + ((uint64_t)g << 32), k, v);
}

static size_t per_token(const ctxs_geometry *geo)
{
    return (size_t)geo->n_layers * geo->n_kv_heads * geo->head_dim;
}

/* Appends n tokens of generation g in one commit. */
static int append_gen(ctxs_session *s, uint32_t n, uint32_t g)
{
    ctxs_session_info info;
    int rc = ctxs_session_get_info(&info, s);
    if (rc < 0)
        return rc;
    size_t per = per_token(&info.model.geometry);
    uint16_t *k = malloc(per * 2), *v = malloc(per * 2);
    uint32_t *ids = malloc((size_t)n * 4);
    ctxs_reservation r;
    if (!k || !v || !ids)
        rc = CTXS_ENOMEM;
    else
        rc = ctxs_session_reserve(&r, s, n);
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        gen_kv(&info.model.geometry, r.first_pos + i, g, k, v);
        ids[i] = gen_token(r.first_pos + i, g);
        rc = ctxs_session_write_token(s, &r, i, k, v, CTXS_DTYPE_F16);
    }
    if (rc == 0)
        rc = ctxs_session_commit(s, ids, n);
    free(k);
    free(v);
    free(ids);
    return rc;
}

/* Rolls back to r and writes generation g up to n again. */
static int rewrite(ctxs_session *s, uint64_t r, uint64_t n, uint32_t g)
{
    int rc = ctxs_session_rollback(s, r);
    return rc < 0 ? rc : append_gen(s, (uint32_t)(n - r), g);
}

/* Held positions in [from, to) that do not read back as generation g. */
static uint64_t wrong_gen(const ctxs_session *s, uint64_t from, uint64_t to, uint32_t g)
{
    ctxs_session_info info;
    ctxs_layout lay;
    if (ctxs_session_get_info(&info, s) || ctxs_session_get_layout(&lay, s))
        return UINT64_MAX;
    size_t per = per_token(&info.model.geometry);
    uint16_t *k = malloc(per * 2), *v = malloc(per * 2), *ek = malloc(per * 2), *ev = malloc(per * 2);
    uint64_t bad = 0;
    for (uint64_t p = from; p < to; p++) {
        uint32_t slot;
        int rc = ctxs_session_get_slot(&slot, s, p);
        if (rc == CTXS_EEVICTED)
            continue;
        if (rc || ctxs_session_read_token(k, v, s, p, CTXS_DTYPE_F16)) {
            bad++;
            continue;
        }
        gen_kv(&info.model.geometry, p, g, ek, ev);
        if (memcmp(k, ek, per * 2) || memcmp(v, ev, per * 2) || lay.token_ids[slot] != gen_token(p, g))
            bad++;
    }
    free(k);
    free(v);
    free(ek);
    free(ev);
    return bad;
}

/* --- sessions ---------------------------------------------------------- */

static ctxs_geometry small_geometry(void)
{
    return ts_model(1).geometry; /* 2 x 2 x 8: 128 bytes of K and V a token */
}

/* 4 layers x 4 heads x 64: 4 KiB a token, so that a copy takes a while. */
static ctxs_geometry big_geometry(void)
{
    return (ctxs_geometry){ 4, 4, 64, CTXS_DTYPE_F16, 0, {0} };
}

static ctxs_model model_of(ctxs_geometry geo)
{
    ctxs_model m = ts_model(1);
    m.geometry = geo;
    return m;
}

static ctxs_create_options opts(uint32_t capacity, uint32_t n_sink, uint32_t ring)
{
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = capacity;
    o.n_sink = n_sink;
    o.ring = ring;
    return o;
}

/* A writer session of ts_model(1) with geometry geo at name, holding
 * n_tokens of generation 0 committed in steps of at most 50. */
static ctxs_session *source(const char *name, ctxs_geometry geo, uint32_t capacity,
                            uint32_t n_sink, uint32_t ring, uint64_t n_tokens)
{
    ctxs_model m = model_of(geo);
    ctxs_create_options o = opts(capacity, n_sink, ring);
    ctxs_session *s = NULL;
    int rc = ctxs_session_create(&s, ts_path(ts_scratch, name), &m, &o);
    cr_assert_eq(rc, 0, "create %s: %s", name, ctxs_strerror(rc));
    for (uint64_t done = 0; done < n_tokens;) {
        uint32_t n = n_tokens - done < 50 ? (uint32_t)(n_tokens - done) : 50;
        cr_assert_eq(append_gen(s, n, 0), 0);
        done += n;
    }
    return s;
}

static ctxs_session *open_at(const char *name, ctxs_geometry geo, unsigned flags,
                             uint32_t recovery)
{
    ctxs_model m = model_of(geo);
    ctxs_session *s = NULL;
    int rc = ctxs_session_open(&s, ts_path(ts_scratch, name), &m, flags | recovery, NULL);
    cr_assert_eq(rc, 0, "open %s: %s", name, ctxs_strerror(rc));
    return s;
}

static ctxs_session *fork_ok(ctxs_session *src, uint64_t n, const char *name,
                             const ctxs_create_options *o)
{
    ctxs_session *f = (ctxs_session *)(uintptr_t)0x1;
    int rc = ctxs_session_fork(&f, src, ts_path(ts_scratch, name), n, o ? &o->open : NULL);
    cr_assert_eq(rc, 0, "fork at %llu to %s: %s", (unsigned long long)n, name, ctxs_strerror(rc));
    cr_assert_not_null(f);
    return f;
}

static void fork_fails(ctxs_session *src, uint64_t n, const char *name, int want)
{
    ctxs_session *f = (ctxs_session *)(uintptr_t)0x1;
    int rc = ctxs_session_fork(&f, src, ts_path(ts_scratch, name), n, NULL);
    cr_assert_eq(rc, want, "fork at %llu: %d (%s), want %s", (unsigned long long)n, rc,
                 ctxs_err_name(rc), ctxs_err_name(want));
    cr_assert_null(f, "a failed fork set *out");
    struct stat st;
    cr_assert_neq(lstat(ts_path(ts_scratch, name), &st), 0, "a failed fork left %s", name);
}

/* Entries in the scratch directory (a fork must leave no temporary file). */
static int scratch_entries(void)
{
    DIR *d = opendir(ts_scratch);
    cr_assert_not_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

/* The checksums (and token ids) of the slots s does not hold are zero. */
static void expect_unheld_zero(const ctxs_session *s)
{
    const uint32_t cap = s->lay.capacity;
    uint8_t *held = calloc(cap, 1);
    cr_assert_not_null(held);
    uint64_t n = s->st.n_tokens;
    for (uint64_t p = 0; p < n && p < s->lay.n_sink; p++)
        held[ctxs__slot(s, p)] = 1;
    for (uint64_t p = ctxs__first_recent(s, &s->st); p < n; p++)
        held[ctxs__slot(s, p)] = 1;
    for (uint32_t slot = 0; slot < cap; slot++) {
        if (held[slot])
            continue;
        cr_assert_eq(ctxs__sum_table(s)[slot], 0, "unheld slot %u has a checksum", slot);
        cr_assert_eq(ctxs__token_table(s)[slot], 0, "unheld slot %u has a token id", slot);
    }
    free(held);
}

/* f is a fresh fork holding n_tokens from ring_start, all of generation 0,
 * verifying, with nothing else. */
static void expect_fork(const ctxs_session *f, uint64_t n_tokens, uint64_t ring_start)
{
    ctxs_session_info info = ts_info(f);
    cr_assert_eq(info.n_tokens, n_tokens, "n_tokens %llu, want %llu",
                 (unsigned long long)info.n_tokens, (unsigned long long)n_tokens);
    cr_assert_eq(info.ring_start, ring_start, "ring_start %llu, want %llu",
                 (unsigned long long)info.ring_start, (unsigned long long)ring_start);
    cr_assert_eq(info.verified_from, 0, "a fresh fork vouches for %llu tokens",
                 (unsigned long long)info.verified_from);
    cr_assert_eq(info.format_minor, CTXS__FORMAT_MINOR);
    cr_assert_eq(info.flags & (CTXS_INFO_RECOVERED | CTXS_INFO_FAILED), 0);
    cr_assert_eq(info.n_reserved, 0);
    cr_assert_eq(ts_check_all(f), 0, "tokens of the fork do not read back");
    uint64_t bad = 0;
    int rc = ctxs_session_verify(&bad, f);
    cr_assert_eq(rc, 0, "the fork does not verify at %llu", (unsigned long long)bad);
    expect_unheld_zero(f);
}

/* 1 on the filesystems where a fork clones (XFS, Btrfs). */
static int shares_blocks(const char *dir)
{
    struct statfs fs;
    cr_assert_eq(statfs(dir, &fs), 0);
    return fs.f_type == XFS_SUPER_MAGIC || fs.f_type == BTRFS_SUPER_MAGIC;
}

/* --- what a fork holds ---------------------------------------------------- */

Test(fork, a_full_fork_holds_every_token)
{
    ctxs_session *src = source("src", small_geometry(), 2048, 4, 1, 100);
    ctxs_session *f = fork_ok(src, UINT64_MAX, "all", NULL);
    expect_fork(f, 100, 0);
    ctxs_session_info si = ts_info(src), fi = ts_info(f);
    cr_assert(memcmp(&si.model, &fi.model, sizeof(si.model)) == 0, "model");
    cr_assert_eq(fi.capacity, 2048);
    cr_assert_eq(fi.n_sink, 4);
    cr_assert(fi.flags & CTXS_INFO_RING);
    cr_assert_eq(fi.durability, CTXS_SYNC_ASYNC);
    cr_assert_eq(fi.file_bytes, si.file_bytes);
    cr_assert_geq(fi.created_unix_ms, si.created_unix_ms);
    ctxs_session *g = fork_ok(src, 100, "hundred", NULL);
    expect_fork(g, 100, 0);

    struct stat st;
    cr_assert_eq(stat(ts_path(ts_scratch, "all"), &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0600, "mode %o", st.st_mode & 0777);
    /* A copy is sparse like any session: the KV of 100 of 2048 slots, not
     * of all. (A clone shares the source's blocks, and XFS counts space
     * it keeps for copying them on write.) */
    if (!shares_blocks(ts_scratch))
        cr_assert_lt((uint64_t)st.st_blocks * 512, si.file_bytes, "the fork is not sparse");
    ctxs_session_close(g);
    ctxs_session_close(f);
    ctxs_session_close(src);

    /* Without a ring, the fork has none either. */
    src = source("noring", small_geometry(), 64, 4, 0, 64);
    f = fork_ok(src, 60, "noring_f", NULL);
    expect_fork(f, 60, 0);
    cr_assert_eq(ts_info(f).flags & CTXS_INFO_RING, 0);
    cr_assert_eq(ts_append(f, 4), 0);
    cr_assert_eq(ts_append(f, 1), CTXS_EFULL);
    ctxs_session_close(f);
    ctxs_session_close(src);
    cr_assert_eq(scratch_entries(), 5);
}

Test(fork, a_fork_at_a_mid_count_holds_that_prefix)
{
    ctxs_session *src = source("src", small_geometry(), 256, 4, 1, 100);
    ctxs_session *f = fork_ok(src, 37, "mid", NULL);
    expect_fork(f, 37, 0);
    uint16_t k[32], v[32];
    cr_assert_eq(ctxs_session_read_token(k, v, f, 37, CTXS_DTYPE_F16), CTXS_ENOTFOUND);
    ctxs_session_close(f);
    f = fork_ok(src, 3, "in_sinks", NULL);
    expect_fork(f, 3, 0);
    ctxs_session_close(f);
    ctxs_session_close(src);
}

Test(fork, a_fork_at_zero_is_an_empty_session)
{
    ctxs_session *src = source("src", small_geometry(), 256, 4, 1, 100);
    ctxs_session *f = fork_ok(src, 0, "empty", NULL);
    expect_fork(f, 0, 0);
    cr_assert_eq(ts_info(f).n_held, 0);
    cr_assert_eq(ts_append(f, 20), 0);
    cr_assert_eq(ts_check_all(f), 0);
    ctxs_session_close(f);
    ctxs_session *e = source("src_empty", small_geometry(), 64, 4, 1, 0);
    f = fork_ok(e, UINT64_MAX, "empty2", NULL);
    expect_fork(f, 0, 0);
    ctxs_session_close(f);
    ctxs_session_close(e);
    ctxs_session_close(src);
}

Test(fork, a_fork_above_the_count_is_einval_and_leaves_nothing)
{
    ctxs_session *src = source("src", small_geometry(), 256, 4, 1, 100);
    fork_fails(src, 101, "above", CTXS_EINVAL);
    fork_fails(src, UINT64_MAX - 1, "above", CTXS_EINVAL);
    ctxs_session_close(src);
    ctxs_session *e = source("src_empty", small_geometry(), 64, 4, 1, 0);
    fork_fails(e, 1, "above", CTXS_EINVAL);
    ctxs_session_close(e);
    cr_assert_eq(scratch_entries(), 2);
}

Test(fork, checksums_of_slots_the_fork_does_not_hold_are_zero)
{
    /* The source has checksums in every slot; the forks must not. */
    ctxs_session *src = source("src", small_geometry(), 64, 4, 1, 64);
    ctxs_session *r = source("ring", small_geometry(), 64, 4, 1, 150);
    uint64_t counts[] = { 0, 2, 4, 30, 63 };
    for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
        char name[32];
        snprintf(name, sizeof(name), "f%zu", i);
        ctxs_session *f = fork_ok(src, counts[i], name, NULL);
        expect_unheld_zero(f);
        ctxs_session_close(f);
    }
    ctxs_session *f = fork_ok(r, 120, "ring_part", NULL);
    expect_unheld_zero(f);
    ctxs_session_close(f);
    ctxs_session_close(r);
    ctxs_session_close(src);
}

/* For a spread of counts, fork gives what rollback gives a copy of the
 * source: the same error, or the same state with the same tokens. (Not at
 * n_sink in a wrapped ring, which ctxs_session_rollback() refuses though it
 * needs only the sinks; a_wrapped_ring_forked_inside_the_sinks forks it.) */
Test(fork, a_fork_takes_the_state_rollback_would_give)
{
    struct {
        uint32_t capacity;
        uint64_t n_tokens;
        uint64_t counts[16];
        int n_counts;
    } cases[] = {
        { 256, 100, { 0, 1, 3, 4, 5, 50, 99, 100, 101 }, 9 },
        /* Wrapped: sinks 0..3, then 90..149 held. */
        { 64, 150, { 0, 1, 3, 5, 60, 89, 90, 91, 120, 149, 150, 151 }, 12 },
    };
    ctxs_model m = ts_model(1);
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        char src_name[16];
        snprintf(src_name, sizeof(src_name), "src%zu", c);
        ctxs_session *w = source(src_name, small_geometry(), cases[c].capacity, 4, 1,
                                 cases[c].n_tokens);
        ctxs_session_close(w);
        ctxs_session *src = open_at(src_name, small_geometry(), CTXS_RDONLY, 0);
        size_t len;
        uint8_t *bytes = ts_read_file(ts_path(ts_scratch, src_name), &len);
        for (int i = 0; i < cases[c].n_counts; i++) {
            uint64_t n = cases[c].counts[i];
            cr_assert_eq(ts_write_file(ts_path(ts_scratch, "copy"), bytes, len), 0);
            ctxs_session *rb = NULL;
            cr_assert_eq(ctxs_session_open(&rb, ts_path(ts_scratch, "copy"), &m, 0, NULL), 0);
            int want = ctxs_session_rollback(rb, n);
            ctxs_session *f = NULL;
            int rc = ctxs_session_fork(&f, src, ts_path(ts_scratch, "fork"), n, NULL);
            cr_assert_eq(rc, want, "%llu tokens, fork at %llu: %s, rollback: %s",
                         (unsigned long long)cases[c].n_tokens, (unsigned long long)n,
                         ctxs_err_name(rc), ctxs_err_name(want));
            if (rc == 0) {
                ctxs_session_info a = ts_info(f), b = ts_info(rb);
                cr_assert_eq(a.n_tokens, b.n_tokens);
                cr_assert_eq(a.ring_start, b.ring_start, "fork at %llu: ring_start %llu vs %llu",
                             (unsigned long long)n, (unsigned long long)a.ring_start,
                             (unsigned long long)b.ring_start);
                cr_assert_eq(a.n_held, b.n_held);
                expect_fork(f, b.n_tokens, b.ring_start);
                ctxs_session_close(f);
                cr_assert_eq(unlink(ts_path(ts_scratch, "fork")), 0);
            } else {
                cr_assert_null(f);
            }
            ctxs_session_close(rb);
        }
        free(bytes);
        ctxs_session_close(src);
    }
    cr_assert_eq(scratch_entries(), 3, "forks left files behind");
}

/* --- rings ------------------------------------------------------------------ */

/* capacity 64, 4 sinks, 150 tokens: positions 0..3 and 90..149 are held. */
Test(fork, a_wrapped_ring_forked_at_its_count)
{
    ctxs_session *src = source("src", small_geometry(), 64, 4, 1, 150);
    ctxs_session *f = fork_ok(src, UINT64_MAX, "f", NULL);
    expect_fork(f, 150, 90);
    cr_assert_eq(ts_info(f).n_held, 64);
    cr_assert(ts_info(f).flags & CTXS_INFO_WRAPPED);
    /* The fork's ring goes on as its own. */
    cr_assert_eq(append_gen(f, 40, 0), 0);
    cr_assert_eq(ts_check_all(f), 0);
    cr_assert_eq(ts_info(f).ring_start, 130);
    cr_assert_eq(ts_check_all(src), 0);
    ctxs_session_close(f);
    ctxs_session_close(src);
}

Test(fork, a_wrapped_ring_forked_inside_the_held_ring)
{
    ctxs_session *src = source("src", small_geometry(), 64, 4, 1, 150);
    uint64_t counts[] = { 90, 91, 120, 149 };
    for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
        char name[16];
        snprintf(name, sizeof(name), "f%zu", i);
        ctxs_session *f = fork_ok(src, counts[i], name, NULL);
        expect_fork(f, counts[i], 90);
        cr_assert_eq(ts_info(f).n_held, 4 + counts[i] - 90);
        /* Writing on fills the slots the fork dropped, then evicts. */
        cr_assert_eq(append_gen(f, 50, 0), 0);
        cr_assert_eq(ts_check_all(f), 0);
        cr_assert_eq(ctxs_session_verify(NULL, f), 0);
        ctxs_session_close(f);
        f = open_at(name, small_geometry(), CTXS_RDONLY, CTXS_OPEN_VERIFY);
        cr_assert_eq(ts_info(f).n_tokens, counts[i] + 50);
        cr_assert_eq(ts_check_all(f), 0);
        ctxs_session_close(f);
    }
    ctxs_session_close(src);
}

Test(fork, a_wrapped_ring_forked_inside_the_sinks)
{
    ctxs_session *src = source("src", small_geometry(), 64, 4, 1, 150);
    for (uint64_t n = 0; n <= 4; n++) { /* 4: exactly the sinks */
        char name[16];
        snprintf(name, sizeof(name), "f%llu", (unsigned long long)n);
        ctxs_session *f = fork_ok(src, n, name, NULL);
        expect_fork(f, n, 0);
        cr_assert_eq(ts_info(f).flags & CTXS_INFO_WRAPPED, 0);
        cr_assert_eq(append_gen(f, 50, 0), 0);
        cr_assert_eq(append_gen(f, 50, 0), 0);
        cr_assert_eq(ts_check_all(f), 0);
        ctxs_session_close(f);
    }
    ctxs_session_close(src);
}

Test(fork, a_wrapped_ring_forked_in_the_evicted_range_is_eevicted)
{
    ctxs_session *src = source("src", small_geometry(), 64, 4, 1, 150);
    uint64_t counts[] = { 5, 50, 89 };
    for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++)
        fork_fails(src, counts[i], "f", CTXS_EEVICTED);
    fork_fails(src, 151, "f", CTXS_EINVAL);
    ctxs_session_close(src);
    cr_assert_eq(scratch_entries(), 1);
}

/* --- independence ------------------------------------------------------- */

Test(fork, writing_to_the_fork_leaves_the_source_alone_and_back)
{
    ctxs_session *src = source("src", small_geometry(), 256, 4, 1, 100);
    ctxs_session *f = fork_ok(src, 50, "f", NULL);

    cr_assert_eq(append_gen(f, 30, 1), 0);
    cr_assert_eq(wrong_gen(f, 0, 50, 0), 0);
    cr_assert_eq(wrong_gen(f, 50, 80, 1), 0);
    cr_assert_eq(ts_info(src).n_tokens, 100);
    cr_assert_eq(wrong_gen(src, 0, 100, 0), 0, "writing the fork changed the source");

    cr_assert_eq(rewrite(src, 40, 90, 2), 0);
    cr_assert_eq(wrong_gen(src, 40, 90, 2), 0);
    cr_assert_eq(ts_info(f).n_tokens, 80);
    cr_assert_eq(wrong_gen(f, 0, 50, 0), 0, "writing the source changed the fork");
    cr_assert_eq(wrong_gen(f, 50, 80, 1), 0);
    ctxs_session_close(f);
    ctxs_session_close(src);

    src = open_at("src", small_geometry(), CTXS_RDONLY, CTXS_OPEN_VERIFY);
    f = open_at("f", small_geometry(), CTXS_RDONLY, CTXS_OPEN_VERIFY);
    cr_assert_eq(ts_info(src).n_tokens, 90);
    cr_assert_eq(ts_info(f).n_tokens, 80);
    cr_assert_eq(wrong_gen(src, 0, 40, 0) + wrong_gen(src, 40, 90, 2), 0);
    cr_assert_eq(wrong_gen(f, 0, 50, 0) + wrong_gen(f, 50, 80, 1), 0);
    ctxs_session_close(f);
    ctxs_session_close(src);
}

/* A writer forking itself: what it has reserved and not committed stays
 * out of the fork. */
Test(fork, a_writer_source_does_not_copy_its_reservations)
{
    ctxs_session *src = source("src", small_geometry(), 256, 4, 1, 100);
    ctxs_reservation r;
    cr_assert_eq(ctxs_session_reserve(&r, src, 10), 0);
    uint16_t k[32], v[32];
    ctxs_geometry geo = small_geometry();
    for (uint32_t i = 0; i < 10; i++) {
        gen_kv(&geo, 100 + i, 0, k, v);
        cr_assert_eq(ctxs_session_write_token(src, &r, i, k, v, CTXS_DTYPE_F16), 0);
    }
    ctxs_session *f = fork_ok(src, UINT64_MAX, "f", NULL);
    expect_fork(f, 100, 0);
    ctxs_layout lay;
    cr_assert_eq(ctxs_session_get_layout(&lay, f), 0);
    const uint8_t *kv = lay.kv;
    for (uint32_t run = 0; run < 8; run++)
        for (size_t b = 100 * lay.slot_bytes; b < 110 * lay.slot_bytes; b++)
            cr_assert_eq(kv[run * lay.head_stride + b], 0, "reserved bytes were copied");

    /* The source's reservation is still its own to commit. */
    uint32_t ids[10];
    for (uint32_t i = 0; i < 10; i++)
        ids[i] = gen_token(100 + i, 0);
    cr_assert_eq(ctxs_session_commit(src, ids, 10), 0);
    cr_assert_eq(ts_info(src).n_tokens, 110);
    cr_assert_eq(ts_check_all(src), 0);
    cr_assert_eq(ts_info(f).n_tokens, 100);
    ctxs_session_close(f);
    ctxs_session_close(src);
}

/* --- durability and reopening ------------------------------------------ */

/* f's open verified its tokens and kept n of them, lost_tokens lost
 * (recovered: some were); every kept token reads back. Closes f. */
static void expect_verified_and_close(ctxs_session *f, int recovered, uint64_t n, uint64_t lost)
{
    ctxs_session_info info = ts_info(f);
    cr_assert(info.flags & CTXS_INFO_VERIFIED);
    cr_assert_eq((info.flags & CTXS_INFO_RECOVERED) != 0, recovered != 0);
    cr_assert_eq(info.n_tokens, n);
    cr_assert_eq(info.lost_tokens, lost);
    cr_assert_eq(ts_check_all(f), 0);
    ctxs_session_close(f);
}

Test(fork, a_reopened_fork_holds_every_token)
{
    ctxs_session *src = source("src", small_geometry(), 64, 4, 1, 150);
    ctxs_session *f = fork_ok(src, 120, "f", NULL);
    ctxs_session_close(f);
    ctxs_session_close(src);

    f = open_at("f", small_geometry(), CTXS_RDONLY, 0);
    expect_fork(f, 120, 90);
    ctxs_session_close(f);

    /* verified_from is 0: a verifying open checks every token, keeps them
     * all, and a writer then vouches for them. */
    f = open_at("f", small_geometry(), 0, CTXS_OPEN_VERIFY);
    cr_assert_eq(ts_info(f).verified_from, 120);
    expect_verified_and_close(f, 0, 120, 0);
}

/* What a power loss before the copied KV reached the disk leaves: pages of
 * zeros under records that claim them. The next open from another boot
 * verifies from 0 and keeps the longest prefix that holds. */
Test(fork, a_fork_whose_kv_was_lost_keeps_its_longest_verifying_prefix)
{
    ctxs_session *src = source("src", small_geometry(), 256, 4, 1, 100);
    ctxs_session *f = fork_ok(src, 100, "f", NULL);
    ctxs_layout lay;
    cr_assert_eq(ctxs_session_get_layout(&lay, f), 0);
    size_t off = (size_t)((uint8_t *)lay.kv - (uint8_t *)f->map) + 3 * lay.head_stride +
                 60 * lay.slot_bytes;
    ctxs_session_close(f);
    ctxs_session_close(src);

    const char *p = ts_path(ts_scratch, "f");
    int fd = open(p, O_RDWR | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    uint8_t zeros[16] = { 0 };
    cr_assert_eq(pwrite(fd, zeros, sizeof(zeros), (off_t)off), (ssize_t)sizeof(zeros));
    /* As written under another boot. */
    for (int i = 0; i < 2; i++) {
        ctxs__disk_record r;
        off_t at = i ? CTXS__RECORD1_OFF : CTXS__RECORD0_OFF;
        cr_assert_eq(pread(fd, &r, sizeof(r), at), (ssize_t)sizeof(r));
        cr_assert_eq(r.verified_from, 0, "record %d vouches for %llu tokens", i,
                     (unsigned long long)r.verified_from);
        memset(r.boot_id, 0x42, sizeof(r.boot_id));
        ctxs__record_seal(&r, (uint32_t)i);
        cr_assert_eq(pwrite(fd, &r, sizeof(r), at), (ssize_t)sizeof(r));
    }
    close(fd);

    f = open_at("f", small_geometry(), 0, 0);
    expect_verified_and_close(f, 1, 60, 40);
}

Test(fork, a_full_durability_fork)
{
    ctxs_session *src = source("src", small_geometry(), 64, 4, 1, 150);
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.open.durability = CTXS_SYNC_FULL;
    o.open.window = 16;
    ctxs_session *f = fork_ok(src, 130, "f", &o);
    expect_fork(f, 130, 90);
    ctxs_session_info info = ts_info(f);
    cr_assert_eq(info.durability, CTXS_SYNC_FULL);
    cr_assert_eq(info.window, 16);
    /* Its first commit makes it all durable and says so. */
    cr_assert_eq(append_gen(f, 5, 0), 0);
    cr_assert_eq(ts_info(f).verified_from, 135);
    ctxs_session_close(f);
    f = open_at("f", small_geometry(), CTXS_RDONLY, CTXS_OPEN_VERIFY);
    cr_assert_eq(ts_info(f).n_tokens, 135);
    cr_assert_eq(ts_check_all(f), 0);
    ctxs_session_close(f);

    o.open.durability = CTXS_SYNC_NONE;
    f = fork_ok(src, 100, "none", &o);
    expect_fork(f, 100, 90);
    ctxs_session_close(f);
    ctxs_session_close(src);
}

/* --- the file system around the fork -------------------------------------- */

Test(fork, a_path_that_exists_is_eexist_and_left_untouched)
{
    ctxs_session *src = source("src", small_geometry(), 256, 4, 1, 100);
    ctxs_session *other = source("other", small_geometry(), 64, 4, 1, 10);
    ctxs_session_close(other);
    const char *p = ts_path(ts_scratch, "other");
    size_t len0, len1;
    uint8_t *before = ts_read_file(p, &len0);
    ctxs_session *f = (ctxs_session *)(uintptr_t)0x1;
    cr_assert_eq(ctxs_session_fork(&f, src, p, 50, NULL), -EEXIST);
    cr_assert_null(f);
    uint8_t *after = ts_read_file(p, &len1);
    cr_assert(len0 == len1 && memcmp(before, after, len0) == 0, "fork changed the file at its path");
    free(before);
    free(after);

    const char *t = ts_path(ts_scratch, "notes.txt");
    cr_assert_eq(ts_write_file(t, "keep me\n", 8), 0);
    cr_assert_eq(ctxs_session_fork(&f, src, t, 50, NULL), -EEXIST);
    const char *dangling = ts_path(ts_scratch, "dangling");
    cr_assert_eq(symlink(ts_path(ts_scratch, "nowhere"), dangling), 0);
    cr_assert_eq(ctxs_session_fork(&f, src, dangling, 50, NULL), -EEXIST);
    struct stat st;
    cr_assert_neq(lstat(ts_path(ts_scratch, "nowhere"), &st), 0, "fork followed a symlink");
    cr_assert_eq(ctxs_session_fork(&f, src, ts_path(ts_scratch, "no/such/dir"), 50, NULL), -ENOENT);
    cr_assert_eq(scratch_entries(), 4, "a refused fork left files behind");
    ctxs_session_close(src);
}

Test(fork, bad_arguments_are_einval)
{
    ctxs_session *src = source("src", small_geometry(), 256, 4, 1, 100);
    const char *p = ts_path(ts_scratch, "f");
    ctxs_session *f = (ctxs_session *)(uintptr_t)0x1;
    cr_assert_eq(ctxs_session_fork(NULL, src, p, 10, NULL), CTXS_EINVAL);
    cr_assert_eq(ctxs_session_fork(&f, NULL, p, 10, NULL), CTXS_EINVAL);
    cr_assert_null(f);
    f = (ctxs_session *)(uintptr_t)0x1;
    cr_assert_eq(ctxs_session_fork(&f, src, NULL, 10, NULL), CTXS_EINVAL);
    cr_assert_null(f);
    cr_assert_eq(ctxs_session_fork(&f, src, "", 10, NULL), CTXS_EINVAL);
    ctxs_open_options o = CTXS_OPEN_OPTIONS_INIT;
    o.version = 0;
    cr_assert_eq(ctxs_session_fork(&f, src, p, 10, &o), CTXS_EINVAL);
    o = (ctxs_open_options)CTXS_OPEN_OPTIONS_INIT;
    o.reserved[3] = 1;
    cr_assert_eq(ctxs_session_fork(&f, src, p, 10, &o), CTXS_EINVAL);
    o = (ctxs_open_options)CTXS_OPEN_OPTIONS_INIT;
    o.durability = 9;
    cr_assert_eq(ctxs_session_fork(&f, src, p, 10, &o), CTXS_EINVAL);
    cr_assert_null(f);
    cr_assert_eq(scratch_entries(), 1);
    ctxs_session_close(src);
}

/* The fork is a new file of this version with its source's label, which
 * the store then replaces. */
Test(fork, a_fork_is_a_new_file_with_its_sources_label)
{
    ctxs_session *src = source("src", small_geometry(), 256, 4, 1, 100);
    int fd = open(ts_path(ts_scratch, "src"), O_RDWR | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ctxs__label_write(fd, 11, "source", 6), 0);
    close(fd);
    ctxs_session *f = fork_ok(src, 60, "f", NULL);
    fd = open(ts_path(ts_scratch, "f"), O_RDONLY | O_CLOEXEC);
    uint64_t id;
    char name[256];
    cr_assert_eq(ctxs__label_read(fd, &id, name), 0);
    cr_assert_eq(id, 11);
    cr_assert_str_eq(name, "source");
    close(fd);
    ctxs_session_close(f);
    ctxs_session_close(src);

    /* A fork of a 1.0 file is a 1.1 file holding the same tokens. */
    const char *dir = getenv("CTXS_TEST_DATA");
    cr_assert(dir && *dir, "CTXS_TEST_DATA is not set: run the suite through meson test");
    size_t len;
    uint8_t *old = ts_read_file(ts_path(dir, "v1_0_ring.ctxs"), &len);
    cr_assert_eq(ts_write_file(ts_path(ts_scratch, "old"), old, len), 0);
    free(old);
    src = open_at("old", small_geometry(), CTXS_RDONLY, 0);
    cr_assert_eq(ts_info(src).format_minor, 0);
    f = fork_ok(src, UINT64_MAX, "from_old", NULL);
    expect_fork(f, 100, 40);
    fd = open(ts_path(ts_scratch, "from_old"), O_RDONLY | O_CLOEXEC);
    cr_assert_eq(ctxs__label_read(fd, &id, name), CTXS_ENOTFOUND);
    close(fd);
    ctxs_session_close(f);
    ctxs_session_close(src);
}

/* --- a source that changes under the copy: deterministic, via the hook ---- */

static ctxs_session *hook_writer;
static void (*hook_action[4])(void);

static void run_hook(int step)
{
    if (hook_action[step])
        hook_action[step]();
}

/* A writer and a read-only handle on one file of 200 tokens (no ring): the
 * read-only one is forked, the writer changes the file at a step. */
static ctxs_session *hooked_source(void)
{
    hook_writer = source("src", big_geometry(), 4096, 4, 1, 200);
    ctxs__fork_hook = run_hook;
    return open_at("src", big_geometry(), CTXS_RDONLY, 0);
}

static void rewrite_gen1_from_100(void)
{
    cr_assert_eq(rewrite(hook_writer, 100, 200, 1), 0);
}

static void rewrite_gen0_from_100(void)
{
    cr_assert_eq(rewrite(hook_writer, 100, 200, 0), 0);
}

static void roll_back_to_150(void)
{
    cr_assert_eq(ctxs_session_rollback(hook_writer, 150), 0);
}

static void append_50(void)
{
    cr_assert_eq(append_gen(hook_writer, 50, 0), 0);
}

Test(fork, tokens_rewritten_during_the_copy_give_estale)
{
    ctxs_session *src = hooked_source();
    hook_action[CTXS__FORK_KV_COPIED] = rewrite_gen1_from_100;
    fork_fails(src, 200, "f", CTXS_ESTALE);
    cr_assert_eq(scratch_entries(), 1, "an ESTALE fork left files behind");
    /* The fork refreshed the read-only handle, which follows the writer. */
    cr_assert_eq(wrong_gen(src, 100, 200, 1), 0);
    /* Tokens the writer did not touch still fork. */
    hook_action[CTXS__FORK_KV_COPIED] = NULL;
    ctxs_session *f = fork_ok(src, 100, "g", NULL);
    expect_fork(f, 100, 0);
    ctxs_session_close(f);
    ctxs_session_close(src);
    ctxs_session_close(hook_writer);
}

Test(fork, tokens_rolled_back_during_the_copy_give_estale)
{
    ctxs_session *src = hooked_source();
    hook_action[CTXS__FORK_TABLES_COPIED] = roll_back_to_150;
    fork_fails(src, 200, "f", CTXS_ESTALE);
    cr_assert_eq(scratch_entries(), 1);
    ctxs_session_close(src);
    ctxs_session_close(hook_writer);
}

/* A deterministic engine writes the same bytes again: the fork stands. */
Test(fork, the_same_tokens_written_again_during_the_copy_fork_exactly)
{
    ctxs_session *src = hooked_source();
    hook_action[CTXS__FORK_KV_COPIED] = rewrite_gen0_from_100;
    ctxs_session *f = fork_ok(src, 200, "f", NULL);
    expect_fork(f, 200, 0);
    ctxs_session_close(f);
    ctxs_session_close(src);
    ctxs_session_close(hook_writer);
}

Test(fork, appends_during_the_copy_fork_exactly)
{
    ctxs_session *src = hooked_source();
    hook_action[CTXS__FORK_TABLES_COPIED] = append_50;
    hook_action[CTXS__FORK_KV_COPIED] = append_50;
    ctxs_session *f = fork_ok(src, UINT64_MAX, "f", NULL);
    expect_fork(f, 200, 0);
    cr_assert_eq(ts_info(src).n_tokens, 300);
    ctxs_session_close(f);
    ctxs_session_close(src);
    ctxs_session_close(hook_writer);
}

/* Rolled back and written differently before the KV is copied, then back
 * to the original tokens before the check: the checksums the copy carries
 * are the source's again, but the copied bytes are the other tokens'. The
 * copy path must see it (ESTALE); the clone path copies the KV before the
 * source changes, and its fork is exact. Never a fork with wrong bytes. */
Test(fork, a_source_changed_and_changed_back_during_the_copy_is_never_forked_wrong)
{
    ctxs_session *src = hooked_source();
    hook_action[CTXS__FORK_TABLES_COPIED] = rewrite_gen1_from_100;
    hook_action[CTXS__FORK_KV_COPIED] = rewrite_gen0_from_100;
    ctxs_session *f = NULL;
    int rc = ctxs_session_fork(&f, src, ts_path(ts_scratch, "f"), 200, NULL);
    cr_assert(rc == 0 || rc == CTXS_ESTALE, "fork: %s", ctxs_err_name(rc));
    if (rc == 0) {
        cr_log_info("the fork was cloned before the source changed");
        expect_fork(f, 200, 0);
        ctxs_session_close(f);
    } else {
        cr_assert_null(f);
        cr_assert_eq(scratch_entries(), 1);
    }
    ctxs_session_close(src);
    ctxs_session_close(hook_writer);
}

/* Rolled back and written differently before anything is copied from the
 * source's mapping: a copy takes the new tokens and stands, a clone has the
 * old bytes under the new checksums and must not. */
Test(fork, tokens_rewritten_before_the_copy_fork_as_rewritten_or_give_estale)
{
    ctxs_session *src = hooked_source();
    hook_action[CTXS__FORK_STARTED] = rewrite_gen1_from_100;
    ctxs_session *f = NULL;
    int rc = ctxs_session_fork(&f, src, ts_path(ts_scratch, "f"), 200, NULL);
    cr_assert(rc == 0 || rc == CTXS_ESTALE, "fork: %s", ctxs_err_name(rc));
    if (rc == 0) {
        cr_assert_eq(ctxs_session_verify(NULL, f), 0);
        cr_assert_eq(wrong_gen(f, 0, 100, 0), 0);
        cr_assert_eq(wrong_gen(f, 100, 200, 1), 0, "the fork is not what the source holds");
        expect_unheld_zero(f);
        ctxs_session_close(f);
    } else {
        cr_log_info("the fork was cloned before the source changed");
        cr_assert_eq(scratch_entries(), 1);
    }
    ctxs_session_close(src);
    ctxs_session_close(hook_writer);
}

static void evict_10(void)
{
    cr_assert_eq(append_gen(hook_writer, 10, 0), 0);
}

Test(fork, ring_eviction_during_the_copy_gives_estale)
{
    hook_writer = source("src", small_geometry(), 64, 4, 1, 100); /* 0..3, 40..99 */
    ctxs__fork_hook = run_hook;
    ctxs_session *src = open_at("src", small_geometry(), CTXS_RDONLY, 0);
    hook_action[CTXS__FORK_KV_COPIED] = evict_10;
    fork_fails(src, 100, "f", CTXS_ESTALE);
    /* A fork that needs none of the evicted tokens stands. */
    ctxs_session *f = fork_ok(src, 3, "g", NULL);
    expect_fork(f, 3, 0);
    ctxs_session_close(f);
    ctxs_session_close(src);
    ctxs_session_close(hook_writer);
}

static void reserve_10(void)
{
    ctxs_reservation r;
    cr_assert_eq(ctxs_session_reserve(&r, hook_writer, 10), 0);
}

/* Reserve evicts, and commits the eviction, before the engine writes: the
 * evicted tokens' bytes and checksums are still there, and still agree,
 * but the source no longer holds them. */
Test(fork, tokens_evicted_but_not_yet_overwritten_during_the_copy_give_estale)
{
    hook_writer = source("src", small_geometry(), 64, 4, 1, 100);
    ctxs__fork_hook = run_hook;
    ctxs_session *src = open_at("src", small_geometry(), CTXS_RDONLY, 0);
    hook_action[CTXS__FORK_KV_COPIED] = reserve_10;
    fork_fails(src, 100, "f", CTXS_ESTALE);
    cr_assert_eq(ts_info(src).ring_start, 50);
    ctxs_session_close(src);
    ctxs_session_close(hook_writer);
}

/* --- a source written by another process --------------------------------- */

/* Tells a child to stop by closing the pipe; the child sees it without
 * blocking. */
static int told_to_stop(int fd)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };
    return poll(&p, 1, 0) > 0;
}

/* Child: appends to the session until told to stop or near the capacity. */
static int child_appends(const char *path, int stop_fd, int ready_fd)
{
    ctxs_model m = model_of(big_geometry());
    ctxs_session *w;
    if (ctxs_session_open(&w, path, &m, 0, NULL))
        return 1;
    char c = 1;
    if (write(ready_fd, &c, 1) != 1)
        return 1;
    ctxs_session_info info;
    while (!told_to_stop(stop_fd) && ctxs_session_get_info(&info, w) == 0 &&
           info.n_tokens + 16 <= 4000)
        if (append_gen(w, 16, 0))
            return 1;
    ctxs_session_close(w);
    return 0;
}

/* Child: rolls back to 100 and writes 100..200 again as a new generation,
 * over and over, until told to stop; it stays at 200 tokens for a while
 * each time, so that forks start there and meet the next rollback. */
static int child_rewrites(const char *path, int stop_fd, int ready_fd)
{
    ctxs_model m = model_of(big_geometry());
    ctxs_session *w;
    if (ctxs_session_open(&w, path, &m, 0, NULL))
        return 1;
    char c = 1;
    if (write(ready_fd, &c, 1) != 1)
        return 1;
    for (uint32_t g = 1; !told_to_stop(stop_fd); g++) {
        if (rewrite(w, 100, 200, g))
            return 1;
        usleep(500);
    }
    ctxs_session_close(w);
    return 0;
}

typedef struct child {
    pid_t pid;
    int stop_fd; /* the parent's end: close to stop */
} child;

static child start_child(int (*body)(const char *, int, int), const char *path)
{
    int stop[2], ready[2];
    cr_assert_eq(pipe(stop), 0);
    cr_assert_eq(pipe(ready), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(stop[1]);
        close(ready[0]);
        _exit(body(path, stop[0], ready[1]));
    }
    close(stop[0]);
    close(ready[1]);
    char c;
    cr_assert_eq(read(ready[0], &c, 1), 1, "the child did not start");
    close(ready[0]);
    return (child){ pid, stop[1] };
}

static void stop_child(child c)
{
    close(c.stop_fd);
    int st;
    cr_assert_eq(waitpid(c.pid, &st, 0), c.pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child failed (status %d)", st);
}

Test(fork, a_read_only_source_forks_exactly_while_another_process_commits)
{
    ctxs_session *w = source("src", big_geometry(), 4096, 4, 1, 100);
    ctxs_session_close(w);
    child c = start_child(child_appends, ts_path(ts_scratch, "src"));
    ctxs_session *src = open_at("src", big_geometry(), CTXS_RDONLY, 0);
    uint64_t last = 0;
    for (int i = 0; i < 40; i++) {
        ctxs_session *f = fork_ok(src, UINT64_MAX, "f", NULL);
        uint64_t n = ts_info(f).n_tokens;
        cr_assert_geq(n, last, "a later fork holds fewer tokens");
        last = n;
        expect_fork(f, n, 0);
        ctxs_session_close(f);
        cr_assert_eq(unlink(ts_path(ts_scratch, "f")), 0);
        /* And a fixed prefix, through the same handle. */
        f = fork_ok(src, 100, "g", NULL);
        expect_fork(f, 100, 0);
        ctxs_session_close(f);
        cr_assert_eq(unlink(ts_path(ts_scratch, "g")), 0);
    }
    stop_child(c);
    cr_log_info("the last fork held %llu tokens", (unsigned long long)last);
    ctxs_session_close(src);
}

Test(fork, a_source_rolled_back_by_another_process_gives_estale_or_an_exact_fork)
{
    ctxs_session *w = source("src", big_geometry(), 4096, 4, 1, 200);
    ctxs_session_close(w);
    child c = start_child(child_rewrites, ts_path(ts_scratch, "src"));
    ctxs_session *src = open_at("src", big_geometry(), CTXS_RDONLY, 0);
    int whole = 0, prefix = 0, stale = 0;
    for (int i = 0; i < 300; i++) {
        ctxs_session *f = NULL;
        int rc = ctxs_session_fork(&f, src, ts_path(ts_scratch, "f"), UINT64_MAX, NULL);
        if (rc == CTXS_ESTALE) {
            cr_assert_null(f);
            stale++;
            continue;
        }
        cr_assert_eq(rc, 0, "fork: %s", ctxs_err_name(rc));
        /* 100 tokens (forked between a rollback and its commit), or 200
         * with one generation throughout 100..200, as a commit left it. */
        uint64_t n = ts_info(f).n_tokens;
        cr_assert(n == 100 || n == 200, "a fork of %llu tokens", (unsigned long long)n);
        ctxs_layout lay;
        cr_assert_eq(ctxs_session_get_layout(&lay, f), 0);
        uint32_t g = n == 200 ? lay.token_ids[100] >> 16 : 0;
        cr_assert_eq(ctxs_session_verify(NULL, f), 0);
        cr_assert_eq(wrong_gen(f, 0, 100, 0), 0);
        cr_assert_eq(wrong_gen(f, 100, n, g), 0, "the fork mixes generations");
        expect_unheld_zero(f);
        ctxs_session_close(f);
        cr_assert_eq(unlink(ts_path(ts_scratch, "f")), 0);
        *(n == 200 ? &whole : &prefix) += 1;
    }
    stop_child(c);
    /* stderr: Criterion shows cr_log_info() only with --verbose. */
    fprintf(stderr, "forks of a source rolled back under them: %d of 200 tokens, %d of 100, "
            "%d ESTALE\n", whole, prefix, stale);
    cr_assert_eq(scratch_entries(), 1, "forks left files behind");
    ctxs_session_close(src);
}

/* --- a full disk ------------------------------------------------------------
 *
 * A small tmpfs in a private user + mount namespace, in a child
 * (ts_run_child); the source stays on the scratch directory, so the fork
 * cannot clone across and copies. */

static void body_full_disk(const char *mnt)
{
    /* 2000 tokens of 4 KiB (8 MiB of KV) and a 4096-slot ring of 1500. */
    char src_path[4096], ring_path[4096], dst[4096];
    snprintf(src_path, sizeof(src_path), "%s/src", ts_scratch);
    snprintf(ring_path, sizeof(ring_path), "%s/ring", ts_scratch);
    /* First: a process with threads (the writeback thread) cannot unshare
     * its user namespace. */
    ts_enter_small_disk(mnt, "2m");
    ctxs_model m = model_of(big_geometry());
    ctxs_create_options o = opts(4096, 4, 1);
    ctxs_session *w, *r;
    TS_CHECK(ctxs_session_create(&w, src_path, &m, &o) == 0, "create");
    o.capacity = 1024;
    TS_CHECK(ctxs_session_create(&r, ring_path, &m, &o) == 0, "create ring");
    for (int i = 0; i < 40; i++)
        TS_CHECK(append_gen(w, 50, 0) == 0 && append_gen(r, 50, 0) == 0, "append");
    snprintf(dst, sizeof(dst), "%s/f", mnt);
    uint64_t counts[] = { UINT64_MAX, 1000, 600 };
    for (int i = 0; i < 3; i++) {
        ctxs_session *f = (ctxs_session *)(uintptr_t)0x1;
        int rc = ctxs_session_fork(&f, i == 1 ? r : w, dst, counts[i], NULL);
        TS_CHECK(rc == CTXS_EFULL, "fork %d on a 2 MiB disk: %s, want CTXS_EFULL", i, ctxs_err_name(rc));
        TS_CHECK(f == NULL, "*out set on failure");
        TS_CHECK(ts_dir_entries(mnt) == 0, "a failed fork left %d files", ts_dir_entries(mnt));
    }

    /* What fits, forks; writing to it then fills the disk through
     * reserve, as in any session, never with a SIGBUS. */
    ctxs_session *f;
    int rc = ctxs_session_fork(&f, w, dst, 200, NULL);
    TS_CHECK(rc == 0, "fork of 800 KiB on a 2 MiB disk: %s", ctxs_err_name(rc));
    TS_CHECK(wrong_gen(f, 0, 200, 0) == 0, "the fork does not read back");
    for (;;) {
        rc = append_gen(f, 16, 0);
        if (rc)
            break;
    }
    TS_CHECK(rc == CTXS_EFULL, "appending to the fork: %s", ctxs_err_name(rc));
    ctxs_session_info info;
    TS_CHECK(ctxs_session_get_info(&info, f) == 0, "info");
    uint64_t n = info.n_tokens;
    TS_CHECK(n > 200, "nothing fitted after the fork");
    TS_CHECK(wrong_gen(f, 0, n, 0) == 0 && ctxs_session_verify(NULL, f) == 0, "after EFULL");
    ctxs_session_close(f);
    ts_say("ok: the fork took %llu tokens before the disk was full\n", (unsigned long long)n);
    ctxs_session_close(w);
    ctxs_session_close(r);
    _exit(0);
}

/* A disk too small even for the tables: capacity 1 Mi slots (12 MiB). */
static void body_no_room_for_tables(const char *mnt)
{
    char src_path[4096], dst[4096];
    snprintf(src_path, sizeof(src_path), "%s/src", ts_scratch);
    ts_enter_small_disk(mnt, "1m");
    ctxs_model m = model_of(small_geometry());
    ctxs_create_options o = opts(1u << 20, 4, 1);
    ctxs_session *w;
    TS_CHECK(ctxs_session_create(&w, src_path, &m, &o) == 0, "create");
    TS_CHECK(append_gen(w, 10, 0) == 0, "append");
    snprintf(dst, sizeof(dst), "%s/f", mnt);
    ctxs_session *f = (ctxs_session *)(uintptr_t)0x1;
    int rc = ctxs_session_fork(&f, w, dst, UINT64_MAX, NULL);
    TS_CHECK(rc == CTXS_EFULL, "fork: %s, want CTXS_EFULL", ctxs_err_name(rc));
    TS_CHECK(f == NULL && ts_dir_entries(mnt) == 0, "a failed fork left %d files", ts_dir_entries(mnt));
    ctxs_session_close(w);
    ts_say("ok\n");
    _exit(0);
}

Test(fork, a_full_disk_is_efull_and_leaves_no_file)
{
    ts_run_child(body_full_disk, "fork on a full disk");
}

Test(fork, a_disk_without_room_for_the_tables_is_efull)
{
    ts_run_child(body_no_room_for_tables, "fork without room for the tables");
}
