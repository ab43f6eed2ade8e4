/*
 * One writer per session, any number of readers, within one process and
 * across processes; readers see only committed tokens; read-only handles
 * refuse every write.
 *
 * Children are forked processes that use only the public API (no Criterion
 * assertions, which belong to the test process) and report through pipes,
 * then _exit().
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "support.h"


TestSuite(lock, .init = ts_scratch_init, .fini = ts_scratch_fini, .timeout = 120);

/* --- helpers ---------------------------------------------------------- */

static const char *session_path(void)
{
    return ts_path(ts_scratch, "s.ctxs");
}

static void make_session(uint32_t capacity, uint32_t n_tokens)
{
    ctxs_model m = ts_model(1);
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = capacity;
    ctxs_session *s = NULL;
    int rc = ctxs_session_create(&s, session_path(), &m, &o);
    cr_assert_eq(rc, 0, "create: %s", ctxs_strerror(rc));
    if (n_tokens)
        cr_assert_eq(ts_append(s, n_tokens), 0);
    ctxs_session_close(s);
}

static ctxs_session *open_or_die(unsigned flags)
{
    ctxs_model m = ts_model(1);
    ctxs_session *s = NULL;
    int rc = ctxs_session_open(&s, session_path(), &m, flags, NULL);
    cr_assert_eq(rc, 0, "open (%s): %s", flags ? "read-only" : "read-write", ctxs_strerror(rc));
    cr_assert_not_null(s);
    return s;
}

/* Opens and closes; returns the open's result; checks *out is NULL on
 * failure. */
static int open_rc(unsigned flags)
{
    ctxs_model m = ts_model(1);
    ctxs_session *s = (ctxs_session *)(uintptr_t)0x1;
    int rc = ctxs_session_open(&s, session_path(), &m, flags, NULL);
    if (rc == 0)
        ctxs_session_close(s);
    else
        cr_assert_null(s, "failed open left *out set");
    return rc;
}

static int read_full(int fd, void *buf, size_t n)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static void write_int(int fd, int v)
{
    ssize_t w = write(fd, &v, sizeof(v));
    (void)w;
}

static void expect_clean_exit(pid_t pid)
{
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st), "child died by signal %d (%s)", WIFSIGNALED(st) ? WTERMSIG(st) : 0,
              WIFSIGNALED(st) ? strsignal(WTERMSIG(st)) : "?");
    cr_assert_eq(WEXITSTATUS(st), 0, "child exited %d", WEXITSTATUS(st));
}

static int child_open(void *arg)
{
    unsigned flags = *(unsigned *)arg;
    ctxs_model m = ts_model(1);
    ctxs_session *s = NULL;
    int rc = ctxs_session_open(&s, session_path(), &m, flags, NULL);
    if (rc == 0)
        ctxs_session_close(s);
    return rc;
}

static int child_open_and_append(void *arg)
{
    uint32_t n = *(uint32_t *)arg;
    ctxs_model m = ts_model(1);
    ctxs_session *s = NULL;
    int rc = ctxs_session_open(&s, session_path(), &m, 0, NULL);
    if (rc)
        return rc;
    rc = ts_try_append(s, n, NULL);
    ctxs_session_close(s);
    return rc;
}

/* A reader in a child: its n_tokens after open (or a negative error). */
static int child_reader_count(void *arg)
{
    (void)arg;
    ctxs_session *s = NULL;
    int rc = ctxs_session_open(&s, session_path(), NULL, CTXS_RDONLY, NULL);
    if (rc)
        return rc;
    ctxs_session_info info;
    rc = ctxs_session_get_info(&info, s);
    ctxs_session_close(s);
    return rc ? rc : (int)info.n_tokens;
}

static const unsigned RW = 0, RO = CTXS_RDONLY;

/* --- writers ---------------------------------------------------------- */

Test(lock, second_writer_in_the_same_process_is_busy)
{
    ctxs_model m = ts_model(1);
    ctxs_session *w = NULL;
    int rc = ctxs_session_create(&w, session_path(), &m, NULL);
    cr_assert_eq(rc, 0);
    /* The handle from create is a writer too. */
    cr_assert_eq(open_rc(RW), CTXS_EBUSY, "second writer while create's handle is open");
    cr_assert_eq(ts_append(w, 10), 0, "the first writer goes on after a refused open");
    cr_assert_eq(open_rc(RW), CTXS_EBUSY);
    ctxs_session_close(w);

    w = open_or_die(RW);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(open_rc(RW), CTXS_EBUSY, "attempt %d", i);
    cr_assert_eq(ts_append(w, 5), 0);
    cr_assert_eq(ts_n_tokens(w), 15);
    ctxs_session_close(w);

    /* Refused opens leak no lock: the next writer gets in. */
    w = open_or_die(RW);
    cr_assert_eq(ts_n_tokens(w), 15);
    cr_assert_eq(ts_check_all(w), 0);
    ctxs_session_close(w);
}

Test(lock, second_writer_in_another_process_is_busy)
{
    make_session(256, 7);
    ctxs_session *w = open_or_die(RW);
    unsigned flags = RW;
    cr_assert_eq(ts_in_child(child_open, &flags, "child_open"),
                 CTXS_EBUSY, "writer in a child while parent writes");
    flags = RO;
    cr_assert_eq(ts_in_child(child_open, &flags, "child_open"),
                 0, "reader in a child while parent writes");
    cr_assert_eq(ts_append(w, 3), 0);
    ctxs_session_close(w);

    uint32_t n = 4;
    cr_assert_eq(ts_in_child(child_open_and_append, &n, "child_open_and_append"),
                 0, "writer in a child after parent closed");
    w = open_or_die(RW);
    cr_assert_eq(ts_n_tokens(w), 14);
    cr_assert_eq(ts_check_all(w), 0);
    ctxs_session_close(w);
}

/* A child writer holds the session (with an uncommitted reservation) until
 * it is killed; the lock dies with it. */
Test(lock, writer_lock_is_released_when_its_process_dies)
{
    make_session(256, 5);
    int ready[2];
    cr_assert_eq(pipe(ready), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(ready[0]);
        ctxs_model m = ts_model(1);
        ctxs_session *s = NULL;
        int rc = ctxs_session_open(&s, session_path(), &m, 0, NULL);
        if (rc == 0)
            rc = ts_try_append(s, 6, NULL);
        ctxs_reservation r;
        if (rc == 0)
            rc = ctxs_session_reserve(&r, s, 9);
        write_int(ready[1], rc);
        for (;;)
            pause();
    }
    close(ready[1]);
    int rc = 1;
    cr_assert_eq(read_full(ready[0], &rc, sizeof(rc)), 0);
    close(ready[0]);
    if (rc != 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        cr_assert_fail("child writer failed: %s", ctxs_strerror(rc));
    }

    cr_assert_eq(open_rc(RW), CTXS_EBUSY, "writer while a live child holds it");
    ctxs_session *r = open_or_die(RO);
    cr_assert_eq(ts_n_tokens(r), 11, "a reader sees the child's commit, not its reservation");
    cr_assert_eq(ts_check_all(r), 0);

    cr_assert_eq(kill(pid, SIGKILL), 0);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);

    ctxs_session *w = open_or_die(RW);
    cr_assert_eq(ts_n_tokens(w), 11);
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, w), 0);
    cr_assert_eq(info.n_reserved, 0, "the dead writer's reservation survived");
    cr_assert_eq(ts_check_all(w), 0);
    cr_assert_eq(ts_append(w, 2), 0);
    cr_assert_eq(ctxs_session_refresh(r), 0);
    cr_assert_eq(ts_n_tokens(r), 13);
    ctxs_session_close(w);
    ctxs_session_close(r);
}

/* --- readers ---------------------------------------------------------- */

Test(lock, readers_coexist_with_the_writer_and_each_other)
{
    make_session(256, 8);

    /* Readers first, then a writer joins them. */
    ctxs_session *r1 = open_or_die(RO);
    ctxs_session *r2 = open_or_die(RO);
    cr_assert_eq(ts_in_child(child_reader_count, NULL, "child_reader_count"),
                 8, "reader in a child beside two readers");
    ctxs_session *w = open_or_die(RW);
    ctxs_session *r3 = open_or_die(RO);
    cr_assert_eq(ts_in_child(child_reader_count, NULL, "child_reader_count"),
                 8, "reader in a child beside a writer");
    unsigned flags = RW;
    cr_assert_eq(ts_in_child(child_open, &flags, "child_open"),
                 CTXS_EBUSY, "readers do not hide the writer");

    cr_assert_eq(ts_append(w, 12), 0);
    ctxs_session *readers[] = { r1, r2, r3 };
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(ctxs_session_refresh(readers[i]), 0);
        cr_assert_eq(ts_n_tokens(readers[i]), 20, "reader %d after refresh", i);
        cr_assert_eq(ts_check_all(readers[i]), 0);
    }
    cr_assert_eq(ts_in_child(child_reader_count, NULL, "child_reader_count"), 20);

    /* A reservation is invisible to readers. */
    ctxs_reservation res;
    cr_assert_eq(ctxs_session_reserve(&res, w, 4), 0);
    cr_assert_eq(ctxs_session_refresh(r1), 0);
    cr_assert_eq(ts_n_tokens(r1), 20);
    cr_assert_eq(ts_in_child(child_reader_count, NULL, "child_reader_count"), 20);

    /* Readers see a rollback too (closing drops the reservation). */
    ctxs_session_close(w);
    w = open_or_die(RW);
    cr_assert_eq(ctxs_session_rollback(w, 10), 0);
    cr_assert_eq(ctxs_session_refresh(r2), 0);
    cr_assert_eq(ts_n_tokens(r2), 10);
    cr_assert_eq(ts_check_all(r2), 0);

    ctxs_session_close(w);
    /* With the writer gone, readers still read. */
    cr_assert_eq(ctxs_session_refresh(r3), 0);
    cr_assert_eq(ts_n_tokens(r3), 10);
    cr_assert_eq(ts_check_all(r3), 0);
    ctxs_session_close(r1);
    ctxs_session_close(r2);
    ctxs_session_close(r3);
}

Test(lock, reader_in_a_child_does_not_block_a_writer)
{
    make_session(256, 3);
    int ready[2], go[2];
    cr_assert_eq(pipe(ready), 0);
    cr_assert_eq(pipe(go), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(ready[0]);
        close(go[1]);
        ctxs_session *s = NULL;
        int rc = ctxs_session_open(&s, session_path(), NULL, CTXS_RDONLY, NULL);
        write_int(ready[1], rc);
        int dummy;
        (void)read_full(go[0], &dummy, sizeof(dummy)); /* wait for the parent */
        ctxs_session_info info;
        if (rc == 0)
            rc = ctxs_session_refresh(s);
        if (rc == 0)
            rc = ctxs_session_get_info(&info, s);
        write_int(ready[1], rc ? rc : (int)info.n_tokens);
        ctxs_session_close(s);
        _exit(0);
    }
    close(ready[1]);
    close(go[0]);
    int rc = 1;
    cr_assert_eq(read_full(ready[0], &rc, sizeof(rc)), 0);
    cr_assert_eq(rc, 0, "child reader: %s", ctxs_strerror(rc));
    ctxs_session *w = open_or_die(RW);
    cr_assert_eq(ts_append(w, 6), 0);
    write_int(go[1], 1);
    cr_assert_eq(read_full(ready[0], &rc, sizeof(rc)), 0);
    cr_assert_eq(rc, 9, "child reader saw %d tokens after refresh, want 9", rc);
    expect_clean_exit(pid);
    ctxs_session_close(w);
    close(ready[0]);
    close(go[1]);
}

/* A child writer commits batches of known sizes and acknowledges each one
 * through a pipe; the parent reader refreshes as fast as it can. The token
 * count a reader sees never goes back (no rollbacks here), is always a commit
 * boundary, is at least what was acknowledged before the refresh and at most
 * one commit past what was acknowledged after it, and every position below
 * it reads back exactly as written. The capacity is large enough that the
 * ring never wraps, so committed slots are never rewritten. */
#define FOLLOW_COMMITS 800

static uint32_t batch_of(int i)
{
    return 1 + (uint32_t)((i * 7) % 13); /* 1..13 */
}

Test(lock, reader_in_another_process_sees_only_committed_tokens, .timeout = 300)
{
    static uint64_t cum[FOLLOW_COMMITS + 1];
    for (int i = 0; i < FOLLOW_COMMITS; i++)
        cum[i + 1] = cum[i] + batch_of(i);
    const uint32_t capacity = 8192;
    cr_assert_lt(cum[FOLLOW_COMMITS], capacity - 4, "the ring must not wrap in this test");
    make_session(capacity, 0);

    int acks[2];
    cr_assert_eq(pipe(acks), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(acks[0]);
        ctxs_model m = ts_model(1);
        ctxs_session *s = NULL;
        int rc = ctxs_session_open(&s, session_path(), &m, 0, NULL);
        if (rc) {
            write_int(acks[1], rc);
            _exit(1);
        }
        for (int i = 0; i < FOLLOW_COMMITS; i++) {
            rc = ts_try_append(s, batch_of(i), NULL);
            if (rc) {
                write_int(acks[1], rc);
                _exit(1);
            }
            write_int(acks[1], i + 1); /* commits done */
            if (i % 8 == 0) {
                struct timespec ts = { 0, 200000 };
                nanosleep(&ts, NULL);
            }
        }
        ctxs_session_close(s);
        _exit(0);
    }
    close(acks[1]);
    cr_assert_eq(fcntl(acks[0], F_SETFL, O_NONBLOCK), 0);

    ctxs_session *r = open_or_die(RO);
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, r), 0);
    const ctxs_geometry *g = &info.model.geometry;
    size_t per = (size_t)g->n_layers * g->n_kv_heads * g->head_dim;
    uint16_t *k = malloc(per * 2), *v = malloc(per * 2), *ek = malloc(per * 2), *ev = malloc(per * 2);
    ctxs_layout lay;
    cr_assert_eq(ctxs_session_get_layout(&lay, r), 0);

    int acked = 0, done = 0, j = 0;
    uint64_t last = 0, checked = 0, refreshes = 0, seen_mid = 0;
    uint64_t rng = 12345;
    while (!done) {
        uint64_t lower = cum[acked];
        int rc = ctxs_session_refresh(r);
        cr_assert_eq(rc, 0, "refresh: %s", ctxs_strerror(rc));
        refreshes++;
        cr_assert_eq(ctxs_session_get_info(&info, r), 0);
        uint64_t n = info.n_tokens;

        for (;;) {
            int a;
            ssize_t got = read(acks[0], &a, sizeof(a));
            if (got == 0) {
                done = 1;
                break;
            }
            if (got < 0) {
                cr_assert(errno == EAGAIN || errno == EINTR, "pipe: %s", strerror(errno));
                break;
            }
            cr_assert_eq(got, (ssize_t)sizeof(a));
            if (a < 0) {
                kill(pid, SIGKILL);
                waitpid(pid, NULL, 0);
                cr_assert_fail("child writer failed after %d commits: %s", acked, ctxs_strerror(a));
            }
            cr_assert_eq(a, acked + 1);
            acked = a;
        }

        cr_assert_geq(n, last, "n_tokens went back from %llu to %llu", (unsigned long long)last,
                      (unsigned long long)n);
        cr_assert_geq(n, lower, "refresh shows %llu tokens after %llu were acknowledged",
                      (unsigned long long)n, (unsigned long long)lower);
        int bound = acked + 1 < FOLLOW_COMMITS ? acked + 1 : FOLLOW_COMMITS;
        cr_assert_leq(n, cum[bound], "reader sees %llu tokens, writer acknowledged %llu (+ one commit)",
                      (unsigned long long)n, (unsigned long long)cum[acked]);
        while (j < FOLLOW_COMMITS && cum[j] < n)
            j++;
        cr_assert_eq(cum[j], n, "n_tokens %llu is not a commit boundary", (unsigned long long)n);
        if (n > 0 && n < cum[FOLLOW_COMMITS])
            seen_mid++;
        cr_assert_eq(info.n_held, (uint32_t)n);

        /* New positions, and one older one, read back exactly. */
        for (uint64_t p = checked; p < n; p++) {
            rc = ctxs_session_read_token(k, v, r, p, CTXS_DTYPE_F16);
            cr_assert_eq(rc, 0, "read_token(%llu) of %llu: %s", (unsigned long long)p,
                         (unsigned long long)n, ctxs_strerror(rc));
            uint32_t slot;
            cr_assert_eq(ctxs_session_get_slot(&slot, r, p), 0);
            cr_assert_eq(slot, (uint32_t)p);
            ts_fill_kv(g, p, ek, ev);
            cr_assert(memcmp(k, ek, per * 2) == 0 && memcmp(v, ev, per * 2) == 0,
                      "K/V of position %llu differ (reader at %llu tokens)", (unsigned long long)p,
                      (unsigned long long)n);
            cr_assert_eq(lay.token_ids[slot], ts_token(p), "token id of position %llu",
                         (unsigned long long)p);
        }
        if (n) {
            rng = rng * 6364136223846793005ull + 1;
            uint64_t p = (rng >> 33) % n;
            cr_assert_eq(ctxs_session_read_token(k, v, r, p, CTXS_DTYPE_F16), 0);
            ts_fill_kv(g, p, ek, ev);
            cr_assert(memcmp(k, ek, per * 2) == 0 && memcmp(v, ev, per * 2) == 0,
                      "old position %llu changed", (unsigned long long)p);
        }
        checked = n;
        last = n;
    }
    expect_clean_exit(pid);
    cr_assert_eq(acked, FOLLOW_COMMITS);
    cr_assert_eq(ctxs_session_refresh(r), 0);
    cr_assert_eq(ts_n_tokens(r), cum[FOLLOW_COMMITS]);
    cr_assert_eq(ts_check_all(r), 0);
    cr_log_info("%llu refreshes, %llu of them mid-stream", (unsigned long long)refreshes,
                (unsigned long long)seen_mid);
    cr_assert_gt(seen_mid, 0, "the reader never saw the writer mid-stream");
    ctxs_session_close(r);
    close(acks[0]);
    free(k);
    free(v);
    free(ek);
    free(ev);
}

/* --- read-only handles -------------------------------------------------- */

Test(lock, read_only_session_refuses_writes)
{
    make_session(128, 12);
    size_t len0, len1;
    uint8_t *before = ts_read_file(session_path(), &len0);

    ctxs_session *r = open_or_die(RO);
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, r), 0);
    cr_assert(info.flags & CTXS_INFO_READONLY);
    ctxs_reservation res;
    memset(&res, 0, sizeof(res));
    cr_assert_eq(ctxs_session_reserve(&res, r, 1), CTXS_EREADONLY);
    cr_assert_eq(ctxs_session_reserve(&res, r, 100), CTXS_EREADONLY);
    uint32_t ids[1] = { 5 };
    cr_assert_eq(ctxs_session_commit(r, ids, 1), CTXS_EREADONLY);
    cr_assert_eq(ctxs_session_rollback(r, 0), CTXS_EREADONLY);
    cr_assert_eq(ctxs_session_rollback(r, 12), CTXS_EREADONLY);
    cr_assert_eq(ctxs_session_sync(r), CTXS_EREADONLY);
    cr_assert_eq(ctxs_session_get_info(&info, r), 0);
    cr_assert_eq(info.n_tokens, 12);
    cr_assert_eq(info.n_reserved, 0);
    cr_assert_eq(ts_check_all(r), 0);
    /* Reading is fine. */
    cr_assert_eq(ctxs_session_verify(NULL, r), 0);
    cr_assert_eq(ctxs_session_refresh(r), 0);
    ctxs_session_close(r);

    uint8_t *after = ts_read_file(session_path(), &len1);
    cr_assert(len0 == len1 && memcmp(before, after, len0) == 0, "a read-only session changed the file");
    free(before);
    free(after);

    /* The same beside a writer: the refusals do not disturb it. */
    ctxs_session *w = open_or_die(RW);
    r = open_or_die(RO);
    cr_assert_eq(ctxs_session_reserve(&res, r, 1), CTXS_EREADONLY);
    cr_assert_eq(ctxs_session_rollback(r, 0), CTXS_EREADONLY);
    cr_assert_eq(ts_append(w, 3), 0);
    cr_assert_eq(ctxs_session_refresh(r), 0);
    cr_assert_eq(ts_n_tokens(r), 15);
    cr_assert_eq(ts_check_all(r), 0);
    ctxs_session_close(r);
    ctxs_session_close(w);
}
