/*
 * Compaction: session files give back the blocks of slots that hold no
 * token and keep every token they hold; the store removes rows and files
 * that nothing owns and rewrites its index compacted, only while nothing
 * else has it open.
 *
 * Some tests reach into the index (src/index/index.h) to write rows that
 * only a bug or a person could leave.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctxstore.h"
#include "index.h"
#include "internal.h"
#include "support.h"

TestSuite(compact, .init = ts_scratch_init, .fini = ts_scratch_fini, .timeout = 120);

/* --- Helpers ---------------------------------------------------------------- */

/* Creates name in st with n tokens, rolled back to keep (keep <= n); returns
 * it open. */
static ctxs_session *mk(ctxs_store *st, const char *name, const ctxs_model *m,
                        uint32_t capacity, uint32_t n, uint64_t keep)
{
    ctxs_create_options o = ts_options(capacity, 4, 1, CTXS_SYNC_NONE);
    ctxs_session *s = NULL;
    int rc = ctxs_store_session_create(&s, st, name, m, &o);
    cr_assert_eq(rc, 0, "create %s: %s", name, ctxs_err_name(rc));
    ts_append_many(s, n);
    if (keep < n)
        cr_assert_eq(ctxs_session_rollback(s, keep), 0);
    return s;
}

static const char *session_path(ctxs_store *st, const char *name)
{
    return ts_id_path(ts_session_entry(st, name).id);
}

/* Disk space of a file: blocks x 512. */
static uint64_t disk_bytes(const char *path)
{
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0, "stat %s: %s", path, strerror(errno));
    return (uint64_t)sb.st_blocks * 512u;
}

static uint64_t file_size(const char *path)
{
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0, "stat %s: %s", path, strerror(errno));
    return (uint64_t)sb.st_size;
}

/* Whether the filesystem of the scratch directory gives blocks back when a
 * hole is punched; the tests that measure it are skipped where not. */
static void need_punch(void)
{
    const char *path = ts_path(ts_scratch, "punch-probe");
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    cr_assert_geq(fd, 0);
    struct stat a, b;
    int ok = fallocate(fd, 0, 0, 1 << 20) == 0 && fstat(fd, &a) == 0 &&
             fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 1 << 20) == 0 &&
             fstat(fd, &b) == 0 && b.st_blocks < a.st_blocks;
    close(fd);
    unlink(path);
    if (!ok)
        cr_skip_test("the filesystem of %s does not punch holes", ts_scratch);
}

/* Opens the file at path read-write, verifying every token as after a power
 * loss, and checks that it holds n tokens, all as ts_append wrote them. */
static ctxs_session *open_verified(const char *path, const ctxs_model *m, uint64_t n)
{
    ctxs_open_options o = CTXS_OPEN_OPTIONS_INIT;
    o.durability = CTXS_SYNC_NONE;
    ctxs_session *s = NULL;
    int rc = ctxs_session_open(&s, path, m, CTXS_OPEN_VERIFY, &o);
    cr_assert_eq(rc, 0, "open %s: %s", path, ctxs_err_name(rc));
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(info.lost_tokens, 0, "recovery dropped %llu tokens",
                 (unsigned long long)info.lost_tokens);
    cr_assert_eq(info.n_tokens, n, "n_tokens %llu, want %llu", (unsigned long long)info.n_tokens,
                 (unsigned long long)n);
    uint64_t bad = 0;
    rc = ctxs_session_verify(&bad, s);
    cr_assert_eq(rc, 0, "verify: %s at %llu", ctxs_err_name(rc), (unsigned long long)bad);
    cr_assert_eq(ts_check_all(s), 0, "tokens read back wrong");
    return s;
}

/* A whole file's bytes and disk space, to show it was not touched. */
typedef struct snapshot {
    uint8_t *bytes;
    size_t len;
    uint64_t disk;
} snapshot;

static snapshot snap(const char *path)
{
    snapshot sn;
    sn.bytes = ts_read_file(path, &sn.len);
    sn.disk = disk_bytes(path);
    return sn;
}

static void assert_unchanged(const char *path, snapshot *before)
{
    snapshot now = snap(path);
    cr_assert_eq(now.len, before->len);
    cr_assert_eq(memcmp(now.bytes, before->bytes, now.len), 0, "%s was changed", path);
    cr_assert_eq(now.disk, before->disk, "%s: disk bytes %llu, were %llu", path,
                 (unsigned long long)now.disk, (unsigned long long)before->disk);
    free(now.bytes);
    free(before->bytes);
}

static ctxs_store_compact_result compact(ctxs_store *st, const char *name, int want)
{
    ctxs_store_compact_result res;
    int rc = ctxs_store_compact(&res, st, name, NULL);
    cr_assert_eq(rc, want, "compact %s: %s", name ? name : "(all)", ctxs_err_name(rc));
    return res;
}

typedef struct progress_log {
    uint64_t calls, last_done, last_total;
    int backwards;
} progress_log;

static void on_progress(void *arg, uint64_t done, uint64_t total)
{
    progress_log *p = arg;
    if (p->calls && done < p->last_done)
        p->backwards = 1;
    p->calls++;
    p->last_done = done;
    p->last_total = total;
}

/* --- Session files ------------------------------------------------------------ */

Test(compact, a_rolled_back_session_gives_back_its_blocks_and_keeps_its_tokens)
{
    need_punch();
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_model m = ts_model(1);
    cr_assert_eq(ctxs_model_register(st, &m, NULL), 0);
    ctxs_session *s = mk(st, "chat", &m, 2048, 1800, 100);
    ctxs_session_close(s);
    const char *path = session_path(st, "chat");
    uint64_t before = disk_bytes(path);

    ctxs_store_compact_result res = compact(st, "chat", 0);
    cr_assert_eq(res.sessions, 1);
    cr_assert_eq(res.skipped_busy, 0);
    cr_assert_eq(res.bytes_before, before);
    cr_assert_eq(res.bytes_after, disk_bytes(path));
    cr_assert_lt(res.bytes_after, before);
    cr_assert_eq(ts_session_entry(st, "chat").disk_bytes, res.bytes_after,
                 "the index has the new size");
    cr_assert_eq(res.index_compacted, 0, "a named compaction leaves the index alone");

    /* Every held token is intact; new tokens land in the punched slots,
     * whose blocks reserve allocates again (before anything is written
     * through the mapping), and survive a close and a verifying open. */
    s = open_verified(path, &m, 100);
    uint64_t punched = disk_bytes(path);
    ctxs_reservation r;
    cr_assert_eq(ctxs_session_reserve(&r, s, 1700), 0);
    cr_assert_geq(disk_bytes(path), before,
                  "reserve did not allocate the punched slots: %llu -> %llu bytes, %llu before",
                  (unsigned long long)punched, (unsigned long long)disk_bytes(path),
                  (unsigned long long)before);
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    const ctxs_geometry *g = &info.model.geometry;
    uint16_t k[TS_KV_MAX], v[TS_KV_MAX];
    uint32_t *ids = malloc(1700 * sizeof(*ids));
    cr_assert_not_null(ids);
    for (uint32_t i = 0; i < r.n_tokens; i++) {
        ts_fill_kv(g, r.first_pos + i, k, v);
        ids[i] = ts_token(r.first_pos + i);
        cr_assert_eq(ctxs_session_write_token(s, &r, i, k, v, CTXS_DTYPE_F16), 0);
    }
    cr_assert_eq(ctxs_session_commit(s, ids, r.n_tokens), 0);
    cr_assert_eq(ctxs_session_sync(s), 0);
    free(ids);
    ctxs_session_close(s);
    s = open_verified(path, &m, 1800);
    ctxs_session_close(s);
    ctxs_store_close(st);
}

Test(compact, uncommitted_reservations_are_given_back)
{
    need_punch();
    ctxs_model m = ts_model(2);
    const char *path = ts_path(ts_scratch, "loose.ctxs");
    ctxs_create_options o = ts_options(1024, 4, 0, CTXS_SYNC_NONE);
    ctxs_session *s;
    cr_assert_eq(ctxs_session_create(&s, path, &m, &o), 0);
    ts_append_many(s, 10);
    ctxs_reservation r;
    cr_assert_eq(ctxs_session_reserve(&r, s, 900), 0);
    uint16_t k[TS_KV_MAX], v[TS_KV_MAX];
    for (uint32_t i = 0; i < r.n_tokens; i++) {
        ts_fill_kv(&m.geometry, r.first_pos + i, k, v);
        cr_assert_eq(ctxs_session_write_token(s, &r, i, k, v, CTXS_DTYPE_F16), 0);
    }
    ctxs_session_close(s); /* never committed */

    uint64_t before, after;
    cr_assert_eq(ctxs__session_compact(path, &before, &after), 0);
    cr_assert_eq(after, disk_bytes(path));
    cr_assert_lt(after, before);
    s = open_verified(path, &m, 10);
    ts_append_many(s, 1014); /* to the last slot of a session without a ring */
    ctxs_session_close(s);
    s = open_verified(path, &m, 1024);
    ctxs_session_close(s);

    /* Full: nothing to give back, and nothing changes. */
    snapshot sn = snap(path);
    cr_assert_eq(ctxs__session_compact(path, &before, &after), 0);
    cr_assert_eq(before, after);
    assert_unchanged(path, &sn);
}

Test(compact, a_wrapped_ring_keeps_every_slot_it_may_write)
{
    need_punch();
    /* After the ring wraps every slot is taken to have blocks (reserve
     * allocates nothing more), so none may be punched, not even those a
     * rollback emptied. */
    ctxs_model m = ts_model(3);
    const char *path = ts_path(ts_scratch, "ring.ctxs");
    ctxs_create_options o = ts_options(256, 4, 1, CTXS_SYNC_NONE);
    ctxs_session *s;
    cr_assert_eq(ctxs_session_create(&s, path, &m, &o), 0);
    ts_append_many(s, 600); /* held: 0..3, 348..599 */
    cr_assert_eq(ctxs_session_rollback(s, 500), 0);
    ctxs_session_close(s);
    /* Writeback turns fallocated extents into written ones and may add an
     * extent-tree block to st_blocks; let it finish before measuring. */
    int fd = open(path, O_RDONLY);
    cr_assert_geq(fd, 0);
    cr_assert_eq(fsync(fd), 0);
    close(fd);

    uint64_t before, after;
    cr_assert_eq(ctxs__session_compact(path, &before, &after), 0);
    cr_assert_eq(after, before, "a wrapped ring lost blocks: %llu -> %llu",
                 (unsigned long long)before, (unsigned long long)after);
    s = open_verified(path, &m, 500);
    ts_append_many(s, 300); /* through the emptied slots and around again */
    ctxs_session_close(s);
    s = open_verified(path, &m, 800);
    ctxs_session_close(s);

    /* A ring that has not wrapped is compacted like any session. */
    const char *young = ts_path(ts_scratch, "young.ctxs");
    o.capacity = 1024; /* runs of 4 blocks */
    cr_assert_eq(ctxs_session_create(&s, young, &m, &o), 0);
    ts_append_many(s, 200);
    cr_assert_eq(ctxs_session_rollback(s, 3), 0);
    ctxs_session_close(s);
    cr_assert_eq(ctxs__session_compact(young, &before, &after), 0);
    cr_assert_lt(after, before);
    s = open_verified(young, &m, 3);
    ts_append_many(s, 1500); /* and around the ring */
    ctxs_session_close(s);
    s = open_verified(young, &m, 1503);
    ctxs_session_close(s);
}

Test(compact, a_session_open_anywhere_is_ebusy_and_left_unchanged)
{
    need_punch();
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_model m = ts_model(4);
    cr_assert_eq(ctxs_model_register(st, &m, NULL), 0);
    ctxs_session *s = mk(st, "busy", &m, 1024, 900, 50);
    const char *path = session_path(st, "busy");

    /* A writer through the store. */
    snapshot sn = snap(path);
    ctxs_store_compact_result res = compact(st, "busy", CTXS_EBUSY);
    cr_assert_eq(res.sessions, 0);
    assert_unchanged(path, &sn);
    ctxs_session_close(s);

    /* A reader, and a writer opened by path, in this process. */
    const unsigned flags[2] = {CTXS_RDONLY, 0};
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(ctxs_session_open(&s, path, &m, flags[i], NULL), 0);
        sn = snap(path);
        compact(st, "busy", CTXS_EBUSY);
        assert_unchanged(path, &sn);
        ctxs_session_close(s);
    }

    /* A reader in another process. */
    int ready[2], done[2];
    cr_assert_eq(pipe(ready), 0);
    cr_assert_eq(pipe(done), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        ctxs_session *r = NULL;
        char c = ctxs_session_open(&r, path, NULL, CTXS_RDONLY, NULL) == 0 ? 'r' : 'x';
        if (write(ready[1], &c, 1) != 1 || read(done[0], &c, 1) < 0)
            _exit(1);
        ctxs_session_close(r);
        _exit(0);
    }
    char c = 0;
    cr_assert_eq(read(ready[0], &c, 1), 1);
    cr_assert_eq(c, 'r', "the child could not open the session");
    sn = snap(path);
    compact(st, "busy", CTXS_EBUSY);
    assert_unchanged(path, &sn);
    cr_assert_eq(write(done[1], "x", 1), 1);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    /* Closed everywhere: compacted. */
    res = compact(st, "busy", 0);
    cr_assert_eq(res.sessions, 1);
    cr_assert_lt(res.bytes_after, res.bytes_before);
    s = open_verified(path, &m, 50);
    ctxs_session_close(s);
    ctxs_store_close(st);
    for (int i = 0; i < 2; i++) {
        close(ready[i]);
        close(done[i]);
    }
}

Test(compact, bad_arguments_and_unknown_names)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_store_compact_result res;
    memset(&res, 0xff, sizeof(res));
    cr_assert_eq(ctxs_store_compact(&res, st, "nobody", NULL), CTXS_ENOTFOUND);
    cr_assert_eq(res.sessions, 0, "out is zeroed on failure");
    cr_assert_eq(ctxs_store_compact(NULL, NULL, NULL, NULL), CTXS_EINVAL);
    cr_assert_eq(ctxs_store_compact(NULL, st, "a/b", NULL), CTXS_EINVAL);
    cr_assert_eq(ctxs_store_compact(NULL, st, "", NULL), CTXS_EINVAL);

    /* A name whose file is gone. */
    ctxs_model m = ts_model(5);
    cr_assert_eq(ctxs_model_register(st, &m, NULL), 0);
    ctxs_session_close(mk(st, "lost", &m, 256, 10, 10));
    cr_assert_eq(unlink(session_path(st, "lost")), 0);
    cr_assert_eq(ctxs_store_compact(NULL, st, "lost", NULL), CTXS_ENOTFOUND);
    ctxs_store_close(st);
}

/* The options of compact: a version the library does not know, or a
 * reserved byte set, is CTXS_EINVAL, named, and nothing is compacted. */
Test(compact, options_with_an_unknown_version_or_reserved_bytes_are_einval)
{
    TS_OPTIONS_INIT_CHECK(ctxs_store_compact_options, ctxs_store_compact_options_init,
                          CTXS_STORE_COMPACT_OPTIONS_INIT, CTXS_STORE_COMPACT_OPTIONS_VERSION);
    ctxs_store_compact_options co;
    cr_assert_eq(ctxs_store_compact_options_init(&co, CTXS_STORE_COMPACT_OPTIONS_VERSION), 0);

    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_model m = ts_model(5);
    cr_assert_eq(ctxs_model_register(st, &m, NULL), 0);
    ctxs_session_close(mk(st, "a", &m, 256, 10, 10));
    progress_log p = {0};
    co.progress = on_progress;
    co.progress_arg = &p;
    ctxs_store_compact_result res;
    co.version = 7;
    cr_assert_eq(ctxs_store_compact(&res, st, NULL, &co), CTXS_EINVAL);
    cr_assert(strstr(ctxs_get_last_error(), "version is 7") &&
                  strstr(ctxs_get_last_error(), "CTXS_STORE_COMPACT_OPTIONS_INIT"),
              "%s", ctxs_get_last_error());
    co.version = CTXS_STORE_COMPACT_OPTIONS_VERSION;
    co.reserved[16] = 1;
    cr_assert_eq(ctxs_store_compact(&res, st, "a", &co), CTXS_EINVAL);
    cr_assert(strstr(ctxs_get_last_error(), "reserved"), "%s", ctxs_get_last_error());
    cr_assert_eq(res.sessions, 0);
    cr_assert_eq(p.calls, 0);
    co.reserved[16] = 0;
    cr_assert_eq(ctxs_store_compact(&res, st, "a", &co), 0);
    cr_assert_eq(res.sessions, 1);
    cr_assert_eq(p.calls, 1);
    ctxs_store_close(st);
}

/* --- The whole store -------------------------------------------------------- */

Test(compact, all_skips_busy_sessions_and_compacts_the_rest)
{
    need_punch();
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_model m = ts_model(6);
    cr_assert_eq(ctxs_model_register(st, &m, NULL), 0);
    const char *names[3] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++)
        ctxs_session_close(mk(st, names[i], &m, 1024, 800, 20 + (uint64_t)i));
    const char *busy = session_path(st, "b");
    ctxs_session *w;
    cr_assert_eq(ctxs_session_open(&w, busy, &m, 0, NULL), 0);
    snapshot sn = snap(busy);

    progress_log p = {0};
    ctxs_store_compact_result res;
    ctxs_store_compact_options co = CTXS_STORE_COMPACT_OPTIONS_INIT;
    co.progress = on_progress;
    co.progress_arg = &p;
    int rc = ctxs_store_compact(&res, st, NULL, &co);
    cr_assert_eq(rc, 0, "%s", ctxs_err_name(rc));
    cr_assert_eq(res.sessions, 2);
    cr_assert_eq(res.skipped_busy, 1);
    cr_assert_lt(res.bytes_after, res.bytes_before);
    cr_assert_eq(p.calls, 3);
    cr_assert_eq(p.last_done, 3);
    cr_assert_eq(p.last_total, 3);
    cr_assert_not(p.backwards);
    /* Opened by path, not through the store: the index was free. */
    cr_assert_eq(res.index_compacted, 1);
    cr_assert_eq(res.index_busy, 0);
    assert_unchanged(busy, &sn);
    ctxs_session_close(w);

    for (int i = 0; i < 3; i++) {
        ctxs_session *s = open_verified(session_path(st, names[i]), &m, 20 + (uint64_t)i);
        ctxs_session_close(s);
        if (i != 1)
            cr_assert_eq(ts_session_entry(st, names[i]).disk_bytes,
                         disk_bytes(session_path(st, names[i])));
    }

    /* A session open through the store shares the index: skipped, and the
     * index is left as it is. */
    ctxs_session *r;
    cr_assert_eq(ctxs_store_session_open(&r, st, "a", NULL, CTXS_RDONLY, NULL), 0);
    const char *data = ts_path(ts_store_dir(), "index/data.mdb");
    struct stat sb_before, sb_after;
    cr_assert_eq(stat(data, &sb_before), 0);
    res = compact(st, NULL, 0);
    cr_assert_eq(res.sessions, 2);
    cr_assert_eq(res.skipped_busy, 1);
    cr_assert_eq(res.index_busy, 1);
    cr_assert_eq(res.index_compacted, 0);
    cr_assert_eq(res.index_bytes_after, res.index_bytes_before);
    cr_assert_eq(stat(data, &sb_after), 0);
    cr_assert_eq(sb_after.st_ino, sb_before.st_ino, "data.mdb was replaced");
    ctxs_session_close(r);

    /* So is a second handle to the store. */
    ctxs_store *again = ts_store_open(ts_store_dir());
    res = compact(st, NULL, 0);
    cr_assert_eq(res.index_busy, 1);
    ctxs_store_close(again);
    res = compact(st, NULL, 0);
    cr_assert_eq(res.index_busy, 0);
    cr_assert_eq(res.index_compacted, 1);

    /* No sessions at all: one progress call, 0 of 0. */
    for (int i = 0; i < 3; i++)
        cr_assert_eq(ctxs_store_session_delete(st, names[i]), 0);
    memset(&p, 0, sizeof(p));
    cr_assert_eq(ctxs_store_compact(&res, st, NULL, &co), 0);
    cr_assert_eq(p.calls, 1);
    cr_assert_eq(p.last_total, 0);
    ctxs_store_close(st);
}

static void put_raw(ctxs_store *st, MDB_dbi dbi, const void *k, size_t klen, const void *v,
                    size_t vlen)
{
    MDB_txn *txn;
    cr_assert_eq(ctxs__txn_begin(&txn, st, 0), 0);
    MDB_val key = {klen, (void *)k}, val = {vlen, (void *)v};
    cr_assert_eq(mdb_put(txn, dbi, &key, &val, 0), 0);
    cr_assert_eq(ctxs__txn_commit(txn), 0);
}

static int has_raw(ctxs_store *st, MDB_dbi dbi, const void *k, size_t klen, const void *v,
                   size_t vlen)
{
    MDB_txn *txn;
    cr_assert_eq(ctxs__txn_begin(&txn, st, 1), 0);
    MDB_val key = {klen, (void *)k}, val;
    int rc = mdb_get(txn, dbi, &key, &val);
    int found = rc == 0 && (!v || (val.mv_size == vlen && memcmp(val.mv_data, v, vlen) == 0));
    mdb_txn_abort(txn);
    return found;
}

static uint64_t entries(ctxs_store *st, MDB_dbi dbi)
{
    MDB_txn *txn;
    cr_assert_eq(ctxs__txn_begin(&txn, st, 1), 0);
    MDB_stat ms;
    cr_assert_eq(mdb_stat(txn, dbi, &ms), 0);
    mdb_txn_abort(txn);
    return ms.ms_entries;
}

Test(compact, rows_and_files_that_nothing_owns_are_removed)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_model m = ts_model(7), other = ts_model(8);
    cr_assert_eq(ctxs_model_register(st, &m, NULL), 0);
    ctxs_session *s = mk(st, "keep", &m, 512, 200, 200);
    cr_assert_eq(ctxs_checkpoint_create(s, "cp"), 0);
    ctxs_session_close(s);
    ctxs_session_close(mk(st, "gone", &m, 512, 130, 130));
    uint64_t keep_id = ts_session_entry(st, "keep").id, gone_id = ts_session_entry(st, "gone").id;
    /* Both hold the same tokens: keep is under 3 chain hashes, gone under
     * the first 2. */
    cr_assert_eq(entries(st, st->prefixes), 5);
    cr_assert_eq(unlink(ts_id_path(gone_id)), 0); /* by hand */

    /* A create that died after writing aside. */
    char tmp[1200];
    snprintf(tmp, sizeof(tmp), "%s.tmp-99999-0", ts_id_path(gone_id + 100));
    cr_assert_eq(ts_write_file(tmp, "partial", 7), 0);

    /* Rows of a session id that never was (or whose delete lost them). */
    const uint64_t dead = 999;
    uint8_t k[64], v[16];
    ctxs__id_key(k, dead);
    memcpy(k + 8, "cp", 2);
    ctxs__checkpoint_rec cp = {10, 1, 1};
    put_raw(st, st->checkpoints, k, 10, &cp, sizeof(cp));
    memset(k + 8, 0, 4);
    k[11] = 1;
    memset(v, 0xab, 16);
    put_raw(st, st->chunks, k, 12, v, 16);
    uint8_t pk[32], idk[8];
    memcpy(pk, m.model_hash, 16);
    memset(pk + 16, 0xcd, 16);
    ctxs__id_key(idk, dead);
    put_raw(st, st->prefixes, pk, 32, idk, 8);
    /* keep's id under a model keep is not of. */
    memcpy(pk, other.model_hash, 16);
    ctxs__id_key(idk, keep_id);
    put_raw(st, st->prefixes, pk, 32, idk, 8);
    /* An id naming a session that is not there. */
    ctxs__id_key(idk, dead + 1);
    put_raw(st, st->ids, idk, 8, "ghost", 5);
    /* Metadata of the session gone (an older library's delete leaves it). */
    uint8_t mk_[10];
    ctxs__id_key(mk_, dead);
    memcpy(mk_ + 8, "ti", 2);
    put_raw(st, st->metadata, mk_, 10, "x", 1);
    /* keep's own id row lost: mended, not removed. */
    ctxs__id_key(idk, keep_id);
    MDB_txn *txn;
    cr_assert_eq(ctxs__txn_begin(&txn, st, 0), 0);
    MDB_val key = {8, idk};
    cr_assert_eq(mdb_del(txn, st->ids, &key, NULL), 0);
    cr_assert_eq(ctxs__txn_commit(txn), 0);
    /* Two states of one weights file: the older is stale. Another file's
     * row stays. */
    ctxs__filehash_key fk = {.dev = 1, .ino = 2, .size = 10, .mtime_sec = 100};
    put_raw(st, st->filehash, &fk, sizeof(fk), v, 16);
    ctxs__filehash_key fk_new = fk;
    fk_new.size = 5; /* sorts first */
    fk_new.mtime_sec = 200;
    put_raw(st, st->filehash, &fk_new, sizeof(fk_new), v, 16);
    ctxs__filehash_key fk_other = {.dev = 1, .ino = 3, .size = 1, .mtime_sec = 50};
    put_raw(st, st->filehash, &fk_other, sizeof(fk_other), v, 16);
    /* And a file whose newer state sorts after the older. */
    ctxs__filehash_key fk_a = {.dev = 1, .ino = 4, .size = 1, .mtime_sec = 100};
    ctxs__filehash_key fk_b = {.dev = 1, .ino = 4, .size = 2, .mtime_sec = 300};
    put_raw(st, st->filehash, &fk_a, sizeof(fk_a), v, 16);
    put_raw(st, st->filehash, &fk_b, sizeof(fk_b), v, 16);
    /* Tokenizer hashes of the same files: a kind of their own, so one is
     * kept beside the newest weights row, and of two states the older
     * goes. */
    ctxs__tokhash_key tk = {.file = fk}, tk_a = {.file = fk_a}, tk_b = {.file = fk_b};
    memcpy(tk.kind, CTXS__TOKHASH_KIND, 8);
    memcpy(tk_a.kind, CTXS__TOKHASH_KIND, 8);
    memcpy(tk_b.kind, CTXS__TOKHASH_KIND, 8);
    put_raw(st, st->filehash, &tk, sizeof(tk), v, 16);
    put_raw(st, st->filehash, &tk_a, sizeof(tk_a), v, 16);
    put_raw(st, st->filehash, &tk_b, sizeof(tk_b), v, 16);

    ctxs_store_compact_result res = compact(st, NULL, 0);
    /* gone's entries, the leftover, a checkpoint, a chunk, two prefix
     * entries, the ghost id, a metadata row, three stale hashes. */
    cr_assert_eq(res.orphans_removed, 11, "removed %llu", (unsigned long long)res.orphans_removed);
    cr_assert_eq(res.sessions, 1);
    cr_assert_not(ts_exists(tmp));
    ctxs_session_entry e;
    cr_assert_eq(ctxs_store_session_get(&e, st, "gone"), CTXS_ENOTFOUND);
    ctxs__id_key(k, dead);
    memcpy(k + 8, "cp", 2);
    cr_assert_not(has_raw(st, st->checkpoints, k, 10, NULL, 0));
    cr_assert_not(has_raw(st, st->metadata, mk_, 10, NULL, 0));
    cr_assert_eq(entries(st, st->chunks), 3, "keep's 3 chunks stay");
    cr_assert_eq(entries(st, st->prefixes), 3);
    ctxs__id_key(idk, dead + 1);
    cr_assert_not(has_raw(st, st->ids, idk, 8, NULL, 0));
    ctxs__id_key(idk, keep_id);
    cr_assert(has_raw(st, st->ids, idk, 8, "keep", 4), "keep's id row is back");
    cr_assert_not(has_raw(st, st->filehash, &fk, sizeof(fk), NULL, 0));
    cr_assert(has_raw(st, st->filehash, &fk_new, sizeof(fk_new), NULL, 0));
    cr_assert(has_raw(st, st->filehash, &fk_other, sizeof(fk_other), NULL, 0));
    cr_assert_not(has_raw(st, st->filehash, &fk_a, sizeof(fk_a), NULL, 0));
    cr_assert(has_raw(st, st->filehash, &fk_b, sizeof(fk_b), NULL, 0));
    cr_assert(has_raw(st, st->filehash, &tk, sizeof(tk), NULL, 0));
    cr_assert_not(has_raw(st, st->filehash, &tk_a, sizeof(tk_a), NULL, 0));
    cr_assert(has_raw(st, st->filehash, &tk_b, sizeof(tk_b), NULL, 0));

    /* What keep owns still works. */
    ctxs_checkpoint_entry *cps;
    size_t n;
    cr_assert_eq(ts_checkpoint_list(&cps, &n, st, "keep"), 0);
    cr_assert_eq(n, 1);
    ctxs_free(cps);
    uint32_t prompt[200];
    for (uint32_t i = 0; i < 200; i++)
        prompt[i] = ts_token(i);
    ctxs_prefix_match pm;
    cr_assert_eq(ctxs_prefix_find(&pm, st, m.model_hash, prompt, 200), 0);
    cr_assert_str_eq(pm.session, "keep");

    /* Nothing left: a second pass removes nothing. */
    res = compact(st, NULL, 0);
    cr_assert_eq(res.orphans_removed, 0);
    cr_assert_eq(ctxs_store_session_delete(st, "keep"), 0);
    ctxs_store_close(st);
}

Test(compact, the_index_shrinks_after_many_sessions_are_deleted)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_model m = ts_model(9);
    cr_assert_eq(ctxs_model_register(st, &m, "model"), 0);
    enum { N = 120 };
    char name[256];
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof(name), "%0200d", i);
        ctxs_session *s = mk(st, name, &m, 512, 256, 256);
        cr_assert_eq(ctxs_checkpoint_create(s, "half"), 0);
        ctxs_session_close(s);
    }
    ctxs_session_close(mk(st, "survivor", &m, 512, 200, 200));
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof(name), "%0200d", i);
        cr_assert_eq(ctxs_store_session_delete(st, name), 0);
    }
    const char *data = ts_path(ts_store_dir(), "index/data.mdb");
    uint64_t size_before = file_size(data);

    ctxs_store_compact_result res = compact(st, NULL, 0);
    cr_assert_eq(res.index_compacted, 1);
    cr_assert_eq(res.index_busy, 0);
    cr_assert_lt(res.index_bytes_after, res.index_bytes_before);
    cr_assert_eq(res.index_bytes_after, disk_bytes(data));
    cr_assert_lt(file_size(data) * 4, size_before, "data.mdb %llu -> %llu bytes",
                 (unsigned long long)size_before, (unsigned long long)file_size(data));
    cr_assert_not(ts_exists(ts_path(ts_store_dir(), "index/compact.tmp")));

    /* The handle goes on working: reads, writes, new sessions. */
    ctxs_session_entry *list;
    size_t n;
    cr_assert_eq(ctxs_store_session_list(&list, &n, st), 0);
    cr_assert_eq(n, 1);
    cr_assert_str_eq(list[0].name, "survivor");
    ctxs_free(list);
    ctxs_model_entry me;
    cr_assert_eq(ctxs_model_get(&me, st, m.model_hash), 0);
    cr_assert_str_eq(me.name, "model");
    ctxs_session *s = mk(st, "newcomer", &m, 512, 300, 300);
    cr_assert_eq(ctxs_checkpoint_create(s, "cp"), 0);
    ctxs_session_close(s);
    uint32_t prompt[300];
    for (uint32_t i = 0; i < 300; i++)
        prompt[i] = ts_token(i);
    ctxs_prefix_match pm;
    cr_assert_eq(ctxs_prefix_find(&pm, st, m.model_hash, prompt, 300), 0);
    cr_assert_eq(pm.n_tokens, 300);
    cr_assert_str_eq(pm.session, "newcomer");
    ctxs_store_close(st);

    /* And after a reopen. */
    st = ts_store_open(ts_store_dir());
    cr_assert_eq(ctxs_store_session_list(&list, &n, st), 0);
    cr_assert_eq(n, 2);
    ctxs_free(list);
    ctxs_checkpoint_entry *cps;
    cr_assert_eq(ts_checkpoint_list(&cps, &n, st, "newcomer"), 0);
    cr_assert_eq(n, 1);
    ctxs_free(cps);
    s = NULL;
    cr_assert_eq(ctxs_store_session_open(&s, st, "survivor", &m, 0, NULL), 0);
    cr_assert_eq(ctxs_session_verify(NULL, s), 0);
    cr_assert_eq(ts_check_all(s), 0);
    ts_append_many(s, 100);
    ctxs_session_close(s);
    cr_assert_eq(ts_session_entry(st, "survivor").n_tokens, 300);
    ctxs_store_close(st);
}

Test(compact, the_index_is_left_alone_while_another_process_has_the_store_open)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_model m = ts_model(10);
    cr_assert_eq(ctxs_model_register(st, &m, NULL), 0);
    for (int i = 0; i < 20; i++) {
        char name[32];
        snprintf(name, sizeof(name), "s%d", i);
        ctxs_session_close(mk(st, name, &m, 256, 130, 70));
        if (i % 2)
            cr_assert_eq(ctxs_store_session_delete(st, name), 0);
    }
    int ready[2], done[2];
    cr_assert_eq(pipe(ready), 0);
    cr_assert_eq(pipe(done), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        /* Its own handle (the parent's is not for a child). */
        ctxs_store *mine = NULL;
        char c = ctxs_store_open(&mine, ts_store_dir(), CTXS_STORE_CREATE, NULL) == 0 ? 'r' : 'x';
        if (write(ready[1], &c, 1) != 1 || read(done[0], &c, 1) < 0)
            _exit(1);
        /* After the parent's attempt: its view of the index still holds. */
        ctxs_session_entry e;
        int rc = ctxs_store_session_get(&e, mine, "s0");
        ctxs_store_close(mine);
        _exit(rc == 0 ? 0 : 2);
    }
    char c = 0;
    cr_assert_eq(read(ready[0], &c, 1), 1);
    cr_assert_eq(c, 'r', "the child could not open the store");
    const char *data = ts_path(ts_store_dir(), "index/data.mdb");
    struct stat sb_before, sb_after;
    cr_assert_eq(stat(data, &sb_before), 0);

    ctxs_store_compact_result res = compact(st, NULL, 0);
    cr_assert_eq(res.index_busy, 1);
    cr_assert_eq(res.index_compacted, 0);
    cr_assert_eq(res.index_bytes_after, res.index_bytes_before);
    cr_assert_eq(res.sessions, 10, "sessions are compacted all the same");
    cr_assert_eq(stat(data, &sb_after), 0);
    cr_assert_eq(sb_after.st_ino, sb_before.st_ino, "data.mdb was replaced");

    cr_assert_eq(write(done[1], "x", 1), 1);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: %d", status);

    res = compact(st, NULL, 0);
    cr_assert_eq(res.index_busy, 0);
    cr_assert_eq(res.index_compacted, 1);
    cr_assert_eq(stat(data, &sb_after), 0);
    cr_assert_neq(sb_after.st_ino, sb_before.st_ino);
    ctxs_session_entry *list;
    size_t n;
    cr_assert_eq(ctxs_store_session_list(&list, &n, st), 0);
    cr_assert_eq(n, 10);
    ctxs_free(list);
    ctxs_store_close(st);
    for (int i = 0; i < 2; i++) {
        close(ready[i]);
        close(done[i]);
    }
}

Test(compact, an_open_waits_while_the_store_lock_is_held_exclusively)
{
    /* What a compaction in another process looks like to an open: the
     * store lock held exclusively. The open waits, then goes on. */
    ctxs_store_close(ts_store_open(ts_store_dir()));
    int fd = open(ts_path(ts_store_dir(), "index/store.lock"), O_RDWR | O_CLOEXEC);
    cr_assert_geq(fd, 0, "index/store.lock: %s", strerror(errno));
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    cr_assert_eq(fcntl(fd, F_OFD_SETLK, &fl), 0, "%s", strerror(errno));
    int opened[2];
    cr_assert_eq(pipe(opened), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        ctxs_store *st = NULL;
        char c = ctxs_store_open(&st, ts_store_dir(), CTXS_STORE_CREATE, NULL) == 0 ? 'o' : 'x';
        ctxs_store_close(st);
        _exit(write(opened[1], &c, 1) == 1 ? 0 : 1);
    }
    struct pollfd pfd = {.fd = opened[0], .events = POLLIN};
    cr_assert_eq(poll(&pfd, 1, 300), 0, "the store opened while the lock was held");
    fl.l_type = F_UNLCK;
    cr_assert_eq(fcntl(fd, F_OFD_SETLK, &fl), 0);
    char c = 0;
    cr_assert_eq(read(opened[0], &c, 1), 1);
    cr_assert_eq(c, 'o');
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(fd);
    close(opened[0]);
    close(opened[1]);
}

Test(compact, a_copy_left_by_a_crash_is_removed_and_never_read)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_model m = ts_model(11);
    cr_assert_eq(ctxs_model_register(st, &m, NULL), 0);
    ctxs_session_close(mk(st, "early", &m, 256, 70, 70));
    ctxs_store_close(st);
    /* A complete copy of an older index, as a compaction killed before its
     * rename leaves it. */
    const char *data = ts_path(ts_store_dir(), "index/data.mdb");
    const char *tmp = ts_path(ts_store_dir(), "index/compact.tmp");
    size_t len;
    uint8_t *old = ts_read_file(data, &len);
    cr_assert_eq(ts_write_file(tmp, old, len), 0);
    free(old);

    st = ts_store_open(ts_store_dir());
    cr_assert_not(ts_exists(tmp), "open left the copy");
    ctxs_session_close(mk(st, "late", &m, 256, 70, 70));
    /* Another one, garbage, while the store is open: compaction clears it
     * before writing its own. */
    cr_assert_eq(ts_write_file(tmp, "garbage", 7), 0);
    ctxs_store_compact_result res = compact(st, NULL, 0);
    cr_assert_eq(res.index_compacted, 1);
    cr_assert_not(ts_exists(tmp));
    ctxs_store_close(st);

    st = ts_store_open(ts_store_dir());
    ctxs_session_entry *list;
    size_t n;
    cr_assert_eq(ctxs_store_session_list(&list, &n, st), 0);
    cr_assert_eq(n, 2, "the index is the newest, not the copy");
    ctxs_free(list);
    ctxs_store_close(st);
}
