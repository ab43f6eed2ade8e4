/*
 * Sessions: round trips through close, reopen and other processes; the ring;
 * rollback; reservations; the write path's argument checks.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "format.h"
#include "support.h"

TestSuite(session, .init = ts_scratch_init, .fini = ts_scratch_fini);

static ctxs_session *create(const char *name, uint32_t capacity, uint32_t n_sink,
                            uint32_t ring, uint32_t durability)
{
    ctxs_model m = ts_model(1);
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = capacity;
    o.n_sink = n_sink;
    o.ring = ring;
    o.open.durability = durability;
    ctxs_session *s = NULL;
    int rc = ctxs_session_create(&s, ts_path(ts_scratch, name), &m, &o);
    cr_assert_eq(rc, 0, "create: %s", ctxs_strerror(rc));
    return s;
}

static ctxs_session *reopen(const char *name, unsigned flags)
{
    ctxs_model m = ts_model(1);
    ctxs_session *s = NULL;
    int rc = ctxs_session_open(&s, ts_path(ts_scratch, name), &m, flags, NULL);
    cr_assert_eq(rc, 0, "open: %s", ctxs_strerror(rc));
    return s;
}

/* name opens again read-write with n tokens, each reading back. */
static void expect_reopens_whole(const char *name, uint64_t n)
{
    ctxs_session *s = reopen(name, 0);
    cr_expect_eq(ts_info(s).n_tokens, n);
    cr_expect_eq(ts_check_all(s), 0);
    ctxs_session_close(s);
}

Test(session, a_new_session_is_empty_sparse_and_private)
{
    ctxs_session *s = create("a", 2048, 4, 1, CTXS_SYNC_ASYNC);
    ctxs_session_info info = ts_info(s);
    cr_expect_eq(info.n_tokens, 0);
    cr_expect_eq(info.n_held, 0);
    cr_expect_eq(info.capacity, 2048);
    cr_expect_eq(info.window, 2048);
    cr_expect_eq(info.durability, CTXS_SYNC_ASYNC);
    cr_expect(info.flags & CTXS_INFO_RING);
    cr_expect_eq(info.flags & (CTXS_INFO_RECOVERED | CTXS_INFO_WRAPPED), 0);
    ctxs_session_close(s);

    struct stat st;
    cr_assert_eq(stat(ts_path(ts_scratch, "a"), &st), 0);
    cr_expect_eq(st.st_mode & 0777, 0600);
    cr_expect_eq((uint64_t)st.st_size, info.file_bytes);
    /* Only the first page and the two tables take space before a reserve. */
    cr_expect_lt((uint64_t)st.st_blocks * 512, info.file_bytes);
}

Test(session, tokens_survive_close_and_reopen)
{
    ctxs_session *s = create("a", 512, 4, 1, CTXS_SYNC_ASYNC);
    for (int turn = 0; turn < 5; turn++)
        cr_assert_eq(ts_append(s, 37), 0);
    ctxs_session_close(s);

    s = reopen("a", 0);
    ctxs_session_info info = ts_info(s);
    cr_expect_eq(info.n_tokens, 185);
    cr_expect_eq(info.flags & (CTXS_INFO_RECOVERED | CTXS_INFO_VERIFIED), 0,
                 "a clean reopen in the same boot verifies nothing");
    cr_expect_eq(ts_check_all(s), 0);
    cr_expect_eq(ctxs_session_verify(NULL, s), 0);
    cr_assert_eq(ts_append(s, 10), 0);
    ctxs_session_close(s);

    s = reopen("a", CTXS_RDONLY);
    cr_expect_eq(ts_info(s).n_tokens, 195);
    cr_expect_eq(ts_check_all(s), 0);
    ctxs_session_close(s);
}

Test(session, every_durability_level_round_trips)
{
    const uint32_t levels[] = {CTXS_SYNC_NONE, CTXS_SYNC_ASYNC, CTXS_SYNC_FULL};
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof(name), "s%d", i);
        ctxs_session *s = create(name, 256, 4, 1, levels[i]);
        cr_assert_eq(ts_append(s, 20), 0);
        cr_assert_eq(ts_append(s, 1), 0);
        ctxs_session_info info = ts_info(s);
        if (levels[i] == CTXS_SYNC_FULL)
            cr_expect_eq(info.verified_from, 21, "FULL moves the watermark");
        else
            cr_expect_eq(info.verified_from, 0, "only FULL and sync move it");
        ctxs_session_close(s);
        s = reopen(name, 0);
        cr_expect_eq(ts_info(s).n_tokens, 21);
        cr_expect_eq(ts_check_all(s), 0);
        cr_expect_eq(ctxs_session_sync(s), 0);
        cr_expect_eq(ts_info(s).verified_from, 21);
        ctxs_session_close(s);
    }
}

Test(session, another_process_reads_what_was_committed)
{
    ctxs_session *s = create("a", 256, 4, 1, CTXS_SYNC_NONE);
    cr_assert_eq(ts_append(s, 100), 0);
    ctxs_session_close(s);

    pid_t child = fork();
    cr_assert_neq(child, -1);
    if (child == 0) {
        ctxs_model m = ts_model(1);
        ctxs_session *c;
        if (ctxs_session_open(&c, ts_path(ts_scratch, "a"), &m, 0, NULL) != 0)
            _exit(2);
        ctxs_session_info info;
        ctxs_session_get_info(&info, c);
        if (info.n_tokens != 100 || ts_check_all(c) != 0)
            _exit(3);
        if (ts_append(c, 50) != 0)
            _exit(4);
        ctxs_session_close(c);
        _exit(0);
    }
    int status;
    cr_assert_eq(waitpid(child, &status, 0), child);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);

    expect_reopens_whole("a", 150);
}

Test(session, the_ring_keeps_sinks_and_the_newest_tokens)
{
    ctxs_session *s = create("a", 64, 4, 1, CTXS_SYNC_ASYNC);
    for (int turn = 0; turn < 20; turn++)
        cr_assert_eq(ts_append(s, 7), 0);
    ctxs_session_info info = ts_info(s);
    cr_expect_eq(info.n_tokens, 140);
    cr_expect_eq(info.n_held, 64);
    cr_expect_eq(info.ring_start, 140 - 60);
    cr_expect(info.flags & CTXS_INFO_WRAPPED);

    uint32_t slot;
    for (uint64_t p = 0; p < 4; p++) {
        cr_expect_eq(ctxs_session_get_slot(&slot, s, p), 0, "sink %llu is kept", (unsigned long long)p);
        cr_expect_eq(slot, p);
    }
    cr_expect_eq(ctxs_session_get_slot(&slot, s, 79), CTXS_EEVICTED);
    cr_expect_eq(ctxs_session_get_slot(&slot, s, 80), 0);
    cr_expect_eq(ctxs_session_get_slot(&slot, s, 140), CTXS_ENOTFOUND);
    cr_expect_eq(ts_check_all(s), 0);
    ctxs_session_close(s);

    s = reopen("a", 0);
    cr_expect_eq(ts_info(s).ring_start, 80);
    cr_expect_eq(ts_check_all(s), 0);
    cr_expect_eq(ctxs_session_verify(NULL, s), 0);
    ctxs_session_close(s);
}

Test(session, a_reservation_wraps_in_two_spans)
{
    ctxs_session *s = create("a", 32, 2, 1, CTXS_SYNC_NONE);
    cr_assert_eq(ts_append(s, 28), 0);
    ctxs_reservation r;
    cr_assert_eq(ctxs_session_reserve(&r, s, 10), 0);
    cr_expect_eq(r.first_pos, 28);
    cr_expect_eq(r.n_spans, 2);
    cr_expect_eq(r.spans[0].slot, 28);
    cr_expect_eq(r.spans[0].count, 4);
    cr_expect_eq(r.spans[1].slot, 2);
    cr_expect_eq(r.spans[1].count, 6);
    /* The eviction is committed before the slots are handed out. */
    ctxs_session_info info = ts_info(s);
    cr_expect_eq(info.ring_start, 8);
    cr_expect_eq(info.n_reserved, 10);
    cr_expect_eq(ctxs_session_commit(s, (uint32_t[10]){0}, 11), CTXS_EINVAL,
                 "more than reserved");
    ctxs_session_close(s);
}

Test(session, a_reservation_larger_than_the_ring_is_refused)
{
    ctxs_session *s = create("a", 32, 4, 1, CTXS_SYNC_NONE);
    ctxs_reservation r;
    cr_expect_eq(ctxs_session_reserve(&r, s, 33), CTXS_EINVAL);
    cr_expect_eq(ctxs_session_reserve(&r, s, 0), CTXS_EINVAL);
    cr_expect_eq(ctxs_session_reserve(&r, s, 32), 0, "a fresh session fills all slots");
    cr_expect_eq(ctxs_session_reserve(&r, s, 1), CTXS_EINVAL, "and no more at once");
    cr_assert_eq(ctxs_session_commit(s, (uint32_t[32]){0}, 32), 0);
    cr_expect_eq(ctxs_session_reserve(&r, s, 28), 0, "then a whole ring");
    ctxs_session_close(s);
}

Test(session, without_a_ring_a_full_session_says_full)
{
    ctxs_session *s = create("a", 40, 4, 0, CTXS_SYNC_NONE);
    cr_assert_eq(ts_append(s, 40), 0);
    ctxs_reservation r;
    cr_expect_eq(ctxs_session_reserve(&r, s, 1), CTXS_EFULL);
    cr_expect_eq(ts_info(s).n_tokens, 40);
    cr_expect_eq(ts_check_all(s), 0);
    cr_assert_eq(ctxs_session_rollback(s, 30), 0);
    cr_expect_eq(ts_append(s, 10), 0);
    ctxs_session_close(s);
}

Test(session, rollback_returns_to_an_earlier_count)
{
    ctxs_session *s = create("a", 128, 4, 1, CTXS_SYNC_ASYNC);
    cr_assert_eq(ts_append(s, 50), 0);
    cr_assert_eq(ctxs_session_rollback(s, 20), 0);
    cr_expect_eq(ts_info(s).n_tokens, 20);
    cr_expect_eq(ctxs_session_rollback(s, 21), CTXS_EINVAL);
    cr_assert_eq(ts_append(s, 5), 0);
    ctxs_session_close(s);

    expect_reopens_whole("a", 25);
}

Test(session, rollback_respects_the_ring)
{
    ctxs_session *s = create("a", 32, 4, 1, CTXS_SYNC_NONE);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(ts_append(s, 10), 0);
    ctxs_session_info info = ts_info(s);
    cr_assert_eq(info.ring_start, 22);
    cr_expect_eq(ctxs_session_rollback(s, 21), CTXS_EEVICTED);
    cr_expect_eq(ctxs_session_rollback(s, 30), 0);
    cr_expect_eq(ts_check_all(s), 0);
    cr_expect_eq(ctxs_session_rollback(s, 3), 0, "back into the sinks");
    info = ts_info(s);
    cr_expect_eq(info.n_tokens, 3);
    cr_expect_eq(info.n_held, 3);
    cr_expect_eq(ts_append(s, 40), CTXS_EINVAL, "more than the ring holds");
    cr_assert_eq(ts_append(s, 29), 0);
    cr_expect_eq(ts_check_all(s), 0);
    ctxs_session_close(s);
}

Test(session, write_token_and_read_token_use_the_engine_layout)
{
    ctxs_session *s = create("a", 64, 4, 1, CTXS_SYNC_NONE);
    ctxs_session_info info = ts_info(s);
    const ctxs_geometry *g = &info.model.geometry;
    enum { PER = 2 * 2 * 8 }; /* ts_model: layers * heads * head_dim */
    cr_assert_eq((size_t)g->n_layers * g->n_kv_heads * g->head_dim, PER);
    uint16_t k[PER], v[PER], k2[PER], v2[PER];
    ctxs_reservation r;
    cr_assert_eq(ctxs_session_reserve(&r, s, 3), 0);
    ts_fill_kv(g, 1, k, v);
    cr_assert_eq(ctxs_session_write_token(s, &r, 1, k, v, CTXS_DTYPE_F16), 0);
    cr_expect_eq(ctxs_session_write_token(s, &r, 3, k, v, CTXS_DTYPE_F16), CTXS_EINVAL);

    /* The same bytes are where the layout says. */
    ctxs_layout lay;
    cr_assert_eq(ctxs_session_get_layout(&lay, s), 0);
    uint16_t *run;
    cr_assert_eq(ctxs_session_get_kv((void **)&run, s, 1, CTXS_V, 1), 0);
    cr_expect_eq((uint8_t *)run, (uint8_t *)lay.kv + lay.layer_stride + lay.kv_stride + lay.head_stride);
    cr_expect_eq(memcmp(run + 1 * g->head_dim, v + (1 * g->n_kv_heads + 1) * g->head_dim,
                        g->head_dim * 2), 0);
    cr_expect_eq(((uintptr_t)lay.kv) % 16384, 0, "the KV region is page aligned");
    cr_expect_eq(ctxs_session_get_kv((void **)&run, s, 2, CTXS_K, 0), CTXS_EINVAL);

    cr_expect_eq(ctxs_session_read_token(k2, v2, s, 1, CTXS_DTYPE_F16), CTXS_ENOTFOUND, "not committed");
    cr_assert_eq(ctxs_session_commit(s, (uint32_t[]){7, 8, 9}, 3), 0);
    cr_assert_eq(ctxs_session_read_token(k2, v2, s, 1, CTXS_DTYPE_F16), 0);
    cr_expect_eq(memcmp(k, k2, sizeof(k)), 0);
    cr_expect_eq(memcmp(v, v2, sizeof(v)), 0);
    cr_expect_eq(lay.token_ids[1], 8);
    ctxs_session_close(s);
}

Test(session, a_bad_byte_in_the_kv_is_found_by_verify)
{
    ctxs_session *s = create("a", 64, 4, 1, CTXS_SYNC_NONE);
    cr_assert_eq(ts_append(s, 30), 0);
    ctxs_session_close(s);

    ctxs_model m = ts_model(1);
    cr_assert_eq(ctxs_session_open(&s, ts_path(ts_scratch, "a"), &m, 0, NULL), 0);
    uint8_t *run;
    cr_assert_eq(ctxs_session_get_kv((void **)&run, s, 1, CTXS_K, 1), 0);
    run[17 * 16 + 3] ^= 0x40; /* position 17, head_dim 8 fp16 = 16 bytes a slot */
    uint64_t bad = 0;
    cr_expect_eq(ctxs_session_verify(&bad, s), CTXS_ECORRUPT);
    cr_expect_eq(bad, 17);
    ctxs_session_close(s);

    /* After a reboot (forced here) recovery keeps the tokens before it. */
    cr_assert_eq(ctxs_session_open(&s, ts_path(ts_scratch, "a"), &m, CTXS_OPEN_VERIFY, NULL), 0);
    ctxs_session_info info = ts_info(s);
    cr_expect_eq(info.n_tokens, 17, "n_tokens %llu", (unsigned long long)info.n_tokens);
    cr_expect_eq(info.lost_tokens, 13, "lost %llu", (unsigned long long)info.lost_tokens);
    cr_expect(info.flags & CTXS_INFO_RECOVERED);
    cr_expect(info.flags & CTXS_INFO_VERIFIED);
    cr_expect_eq(ts_check_all(s), 0);
    ctxs_session_close(s);

    /* The recovered state was written back: the next open is clean. */
    s = reopen("a", 0);
    info = ts_info(s);
    cr_expect_eq(info.n_tokens, 17);
    cr_expect_eq(info.flags & CTXS_INFO_RECOVERED, 0);
    ctxs_session_close(s);
}

Test(session, read_only_sessions_refuse_writes)
{
    ctxs_session *s = create("a", 64, 4, 1, CTXS_SYNC_NONE);
    cr_assert_eq(ts_append(s, 5), 0);
    ctxs_session_close(s);
    ctxs_session *r;
    cr_assert_eq(ctxs_session_open(&r, ts_path(ts_scratch, "a"), NULL, CTXS_RDONLY, NULL), 0);
    ctxs_reservation res;
    cr_expect_eq(ctxs_session_reserve(&res, r, 1), CTXS_EREADONLY);
    cr_expect_eq(ctxs_session_commit(r, (uint32_t[]){1}, 1), CTXS_EREADONLY);
    cr_expect_eq(ctxs_session_rollback(r, 1), CTXS_EREADONLY);
    cr_expect_eq(ctxs_session_sync(r), CTXS_EREADONLY);
    cr_expect(ts_info(r).flags & CTXS_INFO_READONLY);
    ctxs_session_close(r);
}

Test(session, null_and_bad_arguments_are_invalid)
{
    ctxs_session *s = (ctxs_session *)1;
    ctxs_model m = ts_model(1);
    cr_expect_eq(ctxs_session_create(&s, NULL, &m, NULL), CTXS_EINVAL);
    cr_expect_null(s);
    cr_expect_eq(ctxs_session_open(&s, ts_path(ts_scratch, "a"), NULL, 0, NULL), CTXS_EINVAL,
                 "a writer must name its model");
    cr_expect_eq(ctxs_session_open(&s, ts_path(ts_scratch, "none"), &m, 0, NULL), -ENOENT);
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.version = 99;
    cr_expect_eq(ctxs_session_create(&s, ts_path(ts_scratch, "b"), &m, &o), CTXS_EINVAL);
    o = (ctxs_create_options)CTXS_CREATE_OPTIONS_INIT;
    o.reserved[3] = 1;
    cr_expect_eq(ctxs_session_create(&s, ts_path(ts_scratch, "b"), &m, &o), CTXS_EINVAL);
    cr_expect_eq(ctxs_session_get_info(NULL, NULL), CTXS_EINVAL);
    ctxs_session_close(NULL);
}

/* The open options' attention windows are checked, each refusal saying
 * why; version 1 options (whose last 28 bytes are reserved) still open. */
Test(session, attention_windows_of_the_open_options_are_checked)
{
    ctxs_model m = ts_model(1);
    const char *path = ts_path(ts_scratch, "attn");
    ctxs_session *s;
    cr_assert_eq(ctxs_session_create(&s, path, &m, NULL), 0);
    ctxs_session_close(s);
    static const struct {
        uint32_t version, period, window, global;
        const char *why;
    } bad[] = {
        {2, 0, 512, 0, "without attn_period"},
        {2, 0, 0, 1, "without attn_period"},
        {2, 9, 512, 1, "above 8"},
        {2, 2, 0, 1, "not 1..16777216"},
        {2, 2, (1u << 24) + 1, 1, "not 1..16777216"},
        {2, 2, 512, 4, "past a pattern of 2"},
        {2, 2, 512, 3, "every layer of the pattern global"},
        {1, 2, 512, 1, "reserved bytes"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ctxs_open_options o = CTXS_OPEN_OPTIONS_INIT;
        o.version = bad[i].version;
        o.attn_period = bad[i].period;
        o.attn_window = bad[i].window;
        o.attn_global_mask = bad[i].global;
        s = (ctxs_session *)1;
        cr_expect_eq(ctxs_session_open(&s, path, &m, 0, &o), CTXS_EINVAL, "case %zu", i);
        cr_expect_null(s);
        cr_expect(strstr(ctxs_get_last_error(), bad[i].why), "case %zu: %s", i,
                  ctxs_get_last_error());
    }
    ctxs_open_options o;
    cr_assert_eq(ctxs_open_options_init(&o, 1), 0);
    cr_expect_eq(o.version, 1u);
    cr_expect_eq(ctxs_session_open(&s, path, &m, 0, &o), 0, "%s", ctxs_get_last_error());
    ctxs_session_close(s);
    o = (ctxs_open_options)CTXS_OPEN_OPTIONS_INIT;
    o.attn_period = 6;
    o.attn_window = 512;
    o.attn_global_mask = 1u << 5;
    cr_expect_eq(ctxs_session_open(&s, path, &m, 0, &o), 0, "%s", ctxs_get_last_error());
    ctxs_session_close(s);
}

/* Every range [from, from + n) of s against what was committed: ids from
 * ts_token() where every position is held (sinks below n_sink, and from
 * first_recent on), CTXS_EEVICTED where one is not, CTXS_ENOTFOUND past the
 * count; out untouched on error. */
static void check_token_ranges(const ctxs_session *s, uint64_t n_sink, uint64_t first_recent)
{
    uint64_t count = ts_info(s).n_tokens;
    uint32_t out[128];
    for (uint64_t from = 0; from <= count + 1; from++) {
        for (uint64_t n = 0; n <= count + 1 - from && n <= 128; n++) {
            int want = 0;
            if (from + n > count)
                want = CTXS_ENOTFOUND;
            for (uint64_t p = from; want == 0 && p < from + n; p++)
                if (p >= n_sink && p < first_recent)
                    want = CTXS_EEVICTED;
            memset(out, 0xab, sizeof(out));
            int rc = ctxs_session_get_tokens(out, s, from, (uint32_t)n);
            cr_assert_eq(rc, want, "[%llu, +%llu): %s, want %s", (unsigned long long)from,
                         (unsigned long long)n, ctxs_err_name(rc), ctxs_err_name(want));
            for (uint64_t i = 0; i < 128; i++) {
                uint32_t expect = rc == 0 && i < n ? ts_token(from + i) : 0xababababu;
                cr_assert_eq(out[i], expect, "[%llu, +%llu): out[%llu]", (unsigned long long)from,
                             (unsigned long long)n, (unsigned long long)i);
            }
        }
    }
}

Test(session, token_ids_by_position_follow_the_ring)
{
    ctxs_session *s = create("a", 16, 4, 1, CTXS_SYNC_NONE);
    cr_assert_eq(ctxs_session_get_tokens(NULL, s, 0, 0), 0);
    cr_assert_eq(ts_append(s, 10), 0);
    check_token_ranges(s, 4, 4);
    /* 40 tokens in 16 slots: the sinks 0..3 and the last 12, 28..39, in
     * two slot runs. */
    for (int i = 0; i < 3; i++)
        cr_assert_eq(ts_append(s, 10), 0);
    check_token_ranges(s, 4, 28);
    /* Many times around. */
    for (int i = 0; i < 6; i++)
        cr_assert_eq(ts_append(s, 10), 0);
    check_token_ranges(s, 4, 88);
    ctxs_session_close(s);
    /* A reader sees the same. */
    s = reopen("a", CTXS_RDONLY);
    check_token_ranges(s, 4, 88);
    uint32_t id;
    cr_assert_eq(ctxs_session_get_tokens(&id, NULL, 0, 1), CTXS_EINVAL);
    cr_assert_eq(ctxs_session_get_tokens(NULL, s, 0, 1), CTXS_EINVAL);
    cr_assert_eq(ctxs_session_get_tokens(&id, s, UINT64_MAX, 1), CTXS_ENOTFOUND);
    cr_assert_eq(ctxs_session_get_tokens(&id, s, 99, UINT32_MAX), CTXS_ENOTFOUND);
    ctxs_session_close(s);
}

Test(session, token_ids_without_sinks_or_ring)
{
    ctxs_session *s = create("a", 16, 0, 1, CTXS_SYNC_NONE);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(ts_append(s, 10), 0);
    cr_assert_eq(ts_append(s, 7), 0);
    check_token_ranges(s, 0, 21);
    ctxs_session_close(s);
    s = create("b", 16, 4, 0, CTXS_SYNC_NONE);
    cr_assert_eq(ts_append(s, 16), 0);
    check_token_ranges(s, 4, 4);
    /* A rollback takes the later ids away. */
    cr_assert_eq(ctxs_session_rollback(s, 9), 0);
    check_token_ranges(s, 4, 4);
    ctxs_session_close(s);
}

/* Opens a's file in a child whose CTXS_TEST_BOOT is boot (NULL: unset),
 * read-only, and exits with its token count, or 255 when it does not
 * open; 254 when the open verified nothing although boot differs from
 * the writer's, 253 when it verified although boot is the writer's. */
static int tokens_seen_as_boot(const char *boot, int same_boot_as_writer)
{
    pid_t child = fork();
    cr_assert_neq(child, -1);
    if (child == 0) {
        if (boot)
            setenv("CTXS_TEST_BOOT", boot, 1);
        else
            unsetenv("CTXS_TEST_BOOT");
        ctxs_session *c;
        if (ctxs_session_open(&c, ts_path(ts_scratch, "a"), NULL, CTXS_RDONLY, NULL) != 0)
            _exit(255);
        ctxs_session_info info;
        ctxs_session_get_info(&info, c);
        int verified = (info.flags & CTXS_INFO_VERIFIED) != 0;
        ctxs_session_close(c);
        if (verified == same_boot_as_writer)
            _exit(same_boot_as_writer ? 253 : 254);
        _exit((int)info.n_tokens);
    }
    int status;
    cr_assert_eq(waitpid(child, &status, 0), child);
    cr_assert(WIFEXITED(status), "child status %d", status);
    return WEXITSTATUS(status);
}

/* A test of power loss runs its checker as a new boot: the page cache of
 * this machine's boot would otherwise vouch for pages that the simulated
 * power loss dropped. */
Test(session, a_process_of_another_test_boot_verifies_as_after_a_power_loss)
{
    /* Written by a process booted as "first", at NONE: nothing is durable
     * and the records trust the page cache of that boot. */
    pid_t child = fork();
    cr_assert_neq(child, -1);
    if (child == 0) {
        setenv("CTXS_TEST_BOOT", "first", 1);
        ctxs_session *s = NULL;
        ctxs_model m = ts_model(1);
        ctxs_create_options o = ts_options(64, 4, 0, CTXS_SYNC_NONE);
        if (ctxs_session_create(&s, ts_path(ts_scratch, "a"), &m, &o) != 0)
            _exit(2);
        for (int i = 0; i < 10; i++)
            if (ts_append(s, 1) != 0)
                _exit(3);
        ctxs_session_close(s);
        _exit(0);
    }
    int status;
    cr_assert_eq(waitpid(child, &status, 0), child);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "writer: status %d", status);

    /* The last token's KV as a power loss may leave it: never written. */
    ctxs_model m = ts_model(1);
    ctxs__file_layout lay;
    cr_assert_eq(ctxs__layout_compute(&lay, &m.geometry, 64, 4, 0), 0);
    int fd = open(ts_path(ts_scratch, "a"), O_RDWR);
    cr_assert_geq(fd, 0);
    uint8_t junk[16];
    memset(junk, 0x5a, sizeof(junk));
    cr_assert_eq(pwrite(fd, junk, lay.slot_bytes, (off_t)(lay.kv_off + 9 * lay.slot_bytes)),
                 (ssize_t)lay.slot_bytes);
    close(fd);

    cr_expect_eq(tokens_seen_as_boot("first", 1), 10,
                 "the writer's own boot trusts its page cache");
    cr_expect_eq(tokens_seen_as_boot("second", 0), 9,
                 "another test boot verifies and drops the unwritten token");
    cr_expect_eq(tokens_seen_as_boot(NULL, 0), 9,
                 "the machine's own boot is another boot than a test boot");
}
