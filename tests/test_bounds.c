/*
 * Work bounded by the file, whatever its records claim: records
 * with extreme but CRC-valid fields (n_tokens near 2^62, a ring_start far
 * past the sinks with a small held range, verified_from 0) are opened,
 * verified (the library and `ctxstore verify`), forked, exported,
 * imported, rolled back and compacted. Each operation runs in a forked
 * child under alarm(): a hang is a failure, a slow walk over the claimed
 * positions would take months. Durations are not otherwise asserted.
 *
 * The checksums of the held positions can be recomputed for the claimed
 * positions (fix_sums), so that verify and recovery walk all of them
 * rather than stopping at the first token.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctxstore.h"
#include "format.h"
#include "support.h"

TestSuite(bounds, .init = ts_scratch_init, .fini = ts_scratch_fini, .timeout = 300);

/* Seconds one operation may take: far above what a walk over the held
 * tokens costs (milliseconds), far below a walk over the claim. */
#define BUDGET_S 20

#define CAP 64u
#define SINK 4u

static const uint64_t HUGE_N = CTXS__MAX_POSITION - 1;

/* The claims tried: n_tokens, ring_start, verified_from, ring flag. */
typedef struct claim {
    const char *what;
    uint64_t n_tokens, ring_start, verified_from;
    int ring;
    int fix_sums;
} claim;

static const claim claims[] = {
    { "a full ring at 2^62 - 1, watermark 0, every held token verifies",
      CTXS__MAX_POSITION - 1, CTXS__MAX_POSITION - 1 - (CAP - SINK), 0, 1, 1 },
    { "a full ring at 2^62 - 1, watermark 0, checksums of other positions",
      CTXS__MAX_POSITION - 1, CTXS__MAX_POSITION - 1 - (CAP - SINK), 0, 1, 0 },
    { "three recent tokens held at 2^62 - 1, watermark 0",
      CTXS__MAX_POSITION - 1, CTXS__MAX_POSITION - 4, 0, 1, 1 },
    { "no recent token held at 2^62 - 1 (ring_start = n_tokens)",
      CTXS__MAX_POSITION - 1, CTXS__MAX_POSITION - 1, 0, 1, 1 },
    { "a full ring at 2^62 - 1, watermark at the top (nothing verified at open)",
      CTXS__MAX_POSITION - 1, CTXS__MAX_POSITION - 1 - (CAP - SINK), CTXS__MAX_POSITION - 1, 1, 0 },
    { "a full ring at 2^40 + 7, watermark in the evicted gap",
      (1ull << 40) + 7, (1ull << 40) + 7 - (CAP - SINK), 1ull << 20, 1, 1 },
    { "no ring, full, watermark 0", CAP, 0, 0, 0, 1 },
};

/* Recomputes the checksums of the positions rec holds in the file at path,
 * as a writer that had committed them would have. */
static void fix_sums(const char *path, const ctxs__disk_record *rec)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    cr_assert_geq(fd, 0, "open %s: %s", path, strerror(errno));
    struct stat sb;
    cr_assert_eq(fstat(fd, &sb), 0);
    uint8_t *map = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    cr_assert_neq(map, MAP_FAILED);
    ctxs__disk_header h;
    memcpy(&h, map, sizeof(h));
    ctxs__file_layout lay;
    cr_assert_eq(ctxs__header_check(&h, (uint64_t)sb.st_size, &lay), 0);
    uint64_t n = rec->n_tokens, ns = lay.n_sink;
    uint64_t first = rec->ring_start > ns ? rec->ring_start : ns;
    uint64_t runs[2][2] = { { 0, n < ns ? n : ns }, { first, n } };
    uint32_t *ids = (uint32_t *)(void *)(map + lay.tokens_off);
    uint64_t *sums = (uint64_t *)(void *)(map + lay.sums_off);
    for (int k = 0; k < 2; k++)
        for (uint64_t p = runs[k][0]; p < runs[k][1]; p++) {
            uint32_t slot = ctxs__slot_of(p, lay.capacity, lay.n_sink);
            ctxs__token_bytes tb = {
                .kv = map + lay.kv_off,
                .run_stride = lay.head_stride,
                .scales = lay.scales_bytes ? map + lay.scales_off : NULL,
                .scales_stride = lay.scales_stride,
                .n_runs = 2 * lay.n_layers * lay.n_kv_heads,
                .slot_bytes = lay.slot_bytes,
                .at = &slot,
            };
            ctxs__sums_chain(&sums[slot], p, 1, &ids[slot], &tb);
        }
    cr_assert_eq(msync(map, (size_t)sb.st_size, MS_SYNC), 0);
    munmap(map, (size_t)sb.st_size);
    close(fd);
}

/* Writes the claim into both records of the file at path (seq 7 and 6,
 * an unknown boot), CRCs sealed, so that it is what an open reads. */
static void write_claim(const char *path, const claim *c)
{
    ctxs__disk_record r;
    memset(&r, 0, sizeof(r));
    r.n_tokens = c->n_tokens;
    r.ring_start = c->ring_start;
    r.verified_from = c->verified_from;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    for (uint32_t i = 0; i < 2; i++) {
        r.seq = 7 - i;
        ctxs__record_seal(&r, i);
        cr_assert_eq(pwrite(fd, &r, sizeof(r), i ? CTXS__RECORD1_OFF : CTXS__RECORD0_OFF),
                     (ssize_t)sizeof(r));
    }
    close(fd);
    if (c->fix_sums)
        fix_sums(path, &r);
}

/* The session "s" of a fresh store with CAP slots written in full, then
 * the claim written over its records. */
static void make_claimed(const claim *c, ctxs_model *m)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    *m = ts_model(1);
    cr_assert_eq(ctxs_model_register(st, m, NULL), 0);
    ctxs_create_options o = ts_options(CAP, SINK, (uint32_t)c->ring, CTXS_SYNC_NONE);
    ctxs_session *s;
    cr_assert_eq(ctxs_store_session_create(&s, st, "s", m, &o), 0);
    cr_assert_eq(ts_append(s, CAP), 0);
    uint64_t id = ts_session_entry(st, "s").id;
    ctxs_session_close(s);
    ctxs_store_close(st);
    write_claim(ts_id_path(id), c);
}

/* The claim the children work on. */
static const claim *cur;

/* Runs body in a child under alarm(BUDGET_S); fails on a hang or a crash. */
static void bounded(const claim *c, const char *op, void (*body)(const ctxs_model *m),
                    const ctxs_model *m)
{
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        alarm(BUDGET_S);
        body(m);
        _exit(0);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(!(WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM),
              "%s: %s did not finish in %d s", c->what, op, BUDGET_S);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "%s: %s failed (status 0x%x)", c->what, op, status);
}

/* In the children: an unexpected result exits 1 after saying why (the
 * claims are all valid, so every operation is expected to work). */
static void expect(int ok, const char *what, int rc)
{
    if (!ok) {
        fprintf(stderr, "%s: %s\n", what, ctxs_err_name(rc));
        _exit(1);
    }
}

static void op_open_verify(const ctxs_model *m)
{
    ctxs_store *st;
    int rc = ctxs_store_open(&st, ts_store_dir(), 0, NULL);
    expect(rc == 0, "store open", rc);
    for (int flags = 0; flags < 2; flags++) {
        ctxs_session *s;
        rc = ctxs_store_session_open(&s, st, "s", m,
                                     CTXS_RDONLY | (flags ? CTXS_OPEN_VERIFY : 0), NULL);
        expect(rc == 0, "open", rc);
        ctxs_session_info info;
        ctxs_session_get_info(&info, s);
        expect(info.n_held <= CAP, "held within the capacity", 0);
        uint64_t bad;
        rc = ctxs_session_verify(&bad, s);
        expect(rc == 0 || rc == CTXS_ECORRUPT, "verify", rc);
        /* With the checksums right for the claim, all of it holds. */
        if (cur->fix_sums) {
            expect(rc == 0, "verify of a claim whose checksums hold", rc);
            expect(info.n_tokens == cur->n_tokens, "the claim kept whole", 0);
        }
        rc = ctxs_session_verify_range(&bad, s, 0, info.n_tokens / 2);
        expect(rc == 0 || rc == CTXS_ECORRUPT, "verify_range", rc);
        ctxs_session_close(s);
    }
    ctxs_store_close(st);
}

static void op_write_open(const ctxs_model *m)
{
    /* A writer's open: recovery written back, stale checksums zeroed;
     * then a rollback to the front and a commit past the claim. */
    ctxs_store *st;
    int rc = ctxs_store_open(&st, ts_store_dir(), 0, NULL);
    expect(rc == 0, "store open", rc);
    ctxs_session *s;
    rc = ctxs_store_session_open(&s, st, "s", m, CTXS_OPEN_VERIFY, NULL);
    expect(rc == 0, "open read-write", rc);
    ctxs_session_info info;
    ctxs_session_get_info(&info, s);
    if (info.n_tokens > info.ring_start && info.ring_start > info.n_sink) {
        rc = ctxs_session_rollback(s, info.ring_start + 1);
        expect(rc == 0, "rollback", rc);
    } else if (!(info.flags & CTXS_INFO_RING) && info.n_tokens >= 3) {
        rc = ctxs_session_rollback(s, info.n_tokens - 3); /* room for 3 */
        expect(rc == 0, "rollback", rc);
    }
    ctxs_session_get_info(&info, s);
    rc = ts_append(s, 3);
    if (info.n_tokens + 3 >= CTXS__MAX_POSITION) {
        /* Past the most a file counts: refused, nothing lost. */
        expect(rc == CTXS_EFULL, "append past the position limit", rc);
        ctxs_session_info after;
        ctxs_session_get_info(&after, s);
        expect(after.n_tokens == info.n_tokens, "the count kept", 0);
        ctxs_session_close(s);
        ctxs_store_close(st);
        return;
    }
    expect(rc == 0, "append", rc);
    /* The new tokens verify; the old ones do where the claim had their
     * checksums right (a watermark at the top vouches for bytes that do
     * not match: damage that verify reports). */
    ctxs_session_get_info(&info, s);
    uint64_t bad;
    rc = ctxs_session_verify_range(&bad, s, info.n_tokens - 3, info.n_tokens);
    expect(rc == 0, "verify of the new tokens", rc);
    rc = ctxs_session_verify(&bad, s);
    expect(rc == 0 || rc == CTXS_ECORRUPT, "verify after append", rc);
    ctxs_session_close(s);
    ctxs_store_close(st);
}

static void op_fork(const ctxs_model *m)
{
    (void)m;
    ctxs_store *st;
    int rc = ctxs_store_open(&st, ts_store_dir(), 0, NULL);
    expect(rc == 0, "store open", rc);
    rc = ctxs_store_session_fork(NULL, st, "s", "f", UINT64_MAX, NULL);
    expect(rc == 0 || rc == CTXS_ECORRUPT, "fork", rc);
    ctxs_store_close(st);
}

static void op_export_import(const ctxs_model *m)
{
    (void)m;
    ctxs_store *st;
    int rc = ctxs_store_open(&st, ts_store_dir(), 0, NULL);
    expect(rc == 0, "store open", rc);
    const char *path = ts_path(ts_store_dir(), "../s.export");
    unlink(path);
    rc = ctxs_store_session_export(st, "s", path, NULL);
    expect(rc == 0 || rc == CTXS_ECORRUPT, "export", rc);
    if (rc == 0) {
        char name[CTXS_NAME_MAX + 1];
        rc = ctxs_store_session_import(name, st, path, "imported", NULL);
        expect(rc == 0, "import", rc);
    }
    ctxs_store_close(st);
}

static void op_compact_repair(const ctxs_model *m)
{
    (void)m;
    ctxs_store *st;
    int rc = ctxs_store_open(&st, ts_store_dir(), 0, NULL);
    expect(rc == 0, "store open", rc);
    ctxs_store_compact_result cres;
    rc = ctxs_store_compact(&cres, st, "s", NULL);
    expect(rc == 0, "compact", rc);
    ctxs_store_repair_result rres;
    rc = ctxs_store_repair(&rres, st);
    expect(rc == 0, "repair", rc);
    ctxs_store_reindex_result ires;
    rc = ctxs_store_reindex(&ires, st);
    expect(rc == 0, "reindex", rc);
    ctxs_store_close(st);
}

static void op_cli_verify(void)
{
    const char *bin = getenv("CTXSTORE_BIN");
    if (!bin)
        _exit(0);
    int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    /* The alarm outlives exec. Exit 0 (all good) or 5 (damage found) both
     * say the walk ended. */
    execl(bin, bin, "--store", ts_store_dir(), "verify", "--all", (char *)NULL);
    _exit(127);
}

static void cli_verify(const claim *c)
{
    if (!getenv("CTXSTORE_BIN"))
        return;
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        alarm(BUDGET_S);
        op_cli_verify();
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(!(WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM),
              "%s: ctxstore verify did not finish in %d s", c->what, BUDGET_S);
    cr_assert(WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 5),
              "%s: ctxstore verify: status 0x%x", c->what, status);
}

static void run_claim(const claim *c)
{
    ctxs_model m;
    cur = c;
    make_claimed(c, &m);
    cli_verify(c);
    bounded(c, "open and verify", op_open_verify, &m);
    bounded(c, "fork", op_fork, &m);
    bounded(c, "export and import", op_export_import, &m);
    bounded(c, "compact, repair and reindex", op_compact_repair, &m);
    bounded(c, "a writer's open, rollback and commit", op_write_open, &m);
    cli_verify(c);
}

Test(bounds, a_record_that_claims_2_62_positions_costs_what_the_file_holds)
{
    for (size_t i = 0; i < sizeof(claims) / sizeof(claims[0]); i++) {
        ts_say("claim: %s", claims[i].what);
        ts_rmtree(ts_store_dir());
        run_claim(&claims[i]);
    }
}

Test(bounds, records_whose_claims_do_not_fit_the_file_are_refused_when_read)
{
    /* More recent tokens than the ring has slots, a ring_start past
     * n_tokens, a watermark past n_tokens, n_tokens at 2^62, no ring and
     * more tokens than slots: each is refused, whichever record it is in. */
    ctxs_create_options o = ts_options(CAP, SINK, 1, CTXS_SYNC_NONE);
    ctxs_model m = ts_model(1);
    mkdir(ts_store_dir(), 0700);
    const char *path = ts_path(ts_store_dir(), "../r.ctxs");
    unlink(path);
    ctxs_session *s;
    cr_assert_eq(ctxs_session_create(&s, path, &m, &o), 0);
    ctxs_session_close(s);
    ctxs__disk_header h;
    int fd = open(path, O_RDONLY);
    cr_assert_eq(pread(fd, &h, sizeof(h), 0), (ssize_t)sizeof(h));
    close(fd);
    ctxs__file_layout lay;
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0);
    cr_assert_eq(ctxs__header_check(&h, (uint64_t)sb.st_size, &lay), 0);
    const struct { uint64_t n, rs, vf; int ring; } bad[] = {
        { HUGE_N, HUGE_N - (CAP - SINK) - 1, 0, 1 },
        { HUGE_N, 0, 0, 1 },
        { 100, 101, 0, 1 },
        { 100, 100 - 8, 101, 1 },
        { CTXS__MAX_POSITION, CTXS__MAX_POSITION - 8, 0, 1 },
        { UINT64_MAX, UINT64_MAX - 8, 0, 1 },
        { CAP + 1, 0, 0, 0 },
        { CAP, SINK + 1, 0, 0 },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        for (uint32_t idx = 0; idx < 2; idx++) {
            ctxs__disk_record r;
            memset(&r, 0, sizeof(r));
            r.seq = 9;
            r.n_tokens = bad[i].n;
            r.ring_start = bad[i].rs;
            r.verified_from = bad[i].vf;
            ctxs__record_seal(&r, idx);
            cr_assert_not(ctxs__record_valid(&r, idx, &lay, bad[i].ring),
                          "case %zu accepted (n %llu, ring_start %llu)", i,
                          (unsigned long long)bad[i].n, (unsigned long long)bad[i].rs);
        }
}
