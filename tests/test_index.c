/*
 * The store's index against real LMDB and real files: names, sessions,
 * models, the weights-file hash cache, checkpoints, forks, shared prefixes,
 * gc, repair, interrupted creates and deletes, reindex, and the index's
 * format record. Everything here runs in one process; the suites that kill
 * processes are in test_index_crash.c.
 *
 * Some tests reach into the index (src/index/index.h) to write what only a
 * crash or a foreign program could leave: an intent, a newer format, another
 * program's LMDB environment.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "ctxstore.h"
#include "format.h"
#include "index.h"
#include "support.h"
#include "syscall.h"

TestSuite(index, .init = ts_scratch_init, .fini = ts_scratch_fini, .timeout = 60);

/* --- Helpers ---------------------------------------------------------------- */

static void model_reg(ctxs_store *st, const ctxs_model *m)
{
    int rc = ctxs_model_register(st, m, NULL);
    cr_assert_eq(rc, 0, "ctxs_model_register: %s", ctxs_err_name(rc));
}

/* Creates name (capacity, n_sink) with n ts_append tokens; returns it open. */
/* The store of ts_store_dir(), open, with m registered. */
static ctxs_store *store_with(const ctxs_model *m)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    model_reg(st, m);
    return st;
}

static ctxs_session *mk(ctxs_store *st, const char *name, const ctxs_model *m, uint32_t capacity,
                        uint32_t n_sink, uint32_t n)
{
    ctxs_create_options o = ts_options(capacity, n_sink, 1, CTXS_SYNC_NONE);
    ctxs_session *s = NULL;
    int rc = ctxs_store_session_create(&s, st, name, m, &o);
    cr_assert_eq(rc, 0, "create %s: %s", name, ctxs_err_name(rc));
    cr_assert_not_null(s);
    while (n) {
        uint32_t k = n > 50 ? 50 : n;
        rc = ts_append(s, k);
        cr_assert_eq(rc, 0, "append to %s: %s", name, ctxs_err_name(rc));
        n -= k;
    }
    return s;
}

static ctxs_session *op(ctxs_store *st, const char *name, const ctxs_model *m, unsigned flags)
{
    ctxs_session *s = NULL;
    int rc = ctxs_store_session_open(&s, st, name, m, flags, NULL);
    cr_assert_eq(rc, 0, "open %s: %s", name, ctxs_err_name(rc));
    return s;
}

/* Contents of generation gen at position pos; generation 0 is what
 * ts_fill_kv()/ts_token() write, so ts_check_all() applies to it. */
static uint64_t vpos(uint64_t pos, uint32_t gen)
{
    return pos + ((uint64_t)gen << 40);
}

static void append_gen(ctxs_session *s, uint32_t n, uint32_t gen)
{
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    const ctxs_geometry *g = &info.model.geometry;
    uint16_t k[TS_KV_MAX], v[TS_KV_MAX];
    while (n) {
        uint32_t c = n > 50 ? 50 : n, ids[50];
        ctxs_reservation r;
        int rc = ctxs_session_reserve(&r, s, c);
        cr_assert_eq(rc, 0, "reserve: %s", ctxs_err_name(rc));
        for (uint32_t i = 0; i < c; i++) {
            ts_fill_kv(g, vpos(r.first_pos + i, gen), k, v);
            ids[i] = ts_token(vpos(r.first_pos + i, gen));
            cr_assert_eq(ctxs_session_write_token(s, &r, i, k, v, CTXS_DTYPE_F16), 0);
        }
        rc = ctxs_session_commit(s, ids, c);
        cr_assert_eq(rc, 0, "commit: %s", ctxs_err_name(rc));
        n -= c;
    }
}

/* Token ids of positions [0, n) of generation 0, from position `from` on of
 * generation gen. */
static uint32_t *prompt(uint64_t n, uint64_t from, uint32_t gen)
{
    uint32_t *t = malloc(n * 4 + 4);
    cr_assert_not_null(t);
    for (uint64_t p = 0; p < n; p++)
        t[p] = ts_token(p < from ? p : vpos(p, gen));
    return t;
}

static int find(ctxs_prefix_match *m, ctxs_store *st, const ctxs_model *model,
                const uint32_t *tokens, uint64_t n)
{
    return ctxs_prefix_find(m, st, model->model_hash, tokens, n);
}

static size_t count_entries(ctxs_store *st)
{
    ctxs_session_entry *list;
    size_t n;
    int rc = ctxs_store_session_list(&list, &n, st);
    cr_assert_eq(rc, 0, "list: %s", ctxs_err_name(rc));
    ctxs_free(list);
    return n;
}

static uint64_t file_bytes(const char *path)
{
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0, "stat %s: %s", path, strerror(errno));
    return (uint64_t)sb.st_blocks * 512u;
}

/* Raw LMDB on <store>/index, for what only another program writes. The
 * store must be closed: LMDB forbids two opens of one environment in one
 * process. */
static MDB_env *raw_env(void)
{
    return ts_raw_env(ts_store_dir(), 0);
}

static void raw_put(MDB_env *env, const char *db, const void *k, size_t kl, const void *v, size_t vl)
{
    MDB_txn *txn;
    MDB_dbi dbi;
    cr_assert_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
    int rc = mdb_dbi_open(txn, db, MDB_CREATE, &dbi);
    cr_assert_eq(rc, 0, "mdb_dbi_open(%s): %s", db ? db : "(main)", mdb_strerror(rc));
    MDB_val key = {kl, (void *)k}, val = {vl, (void *)v};
    cr_assert_eq(mdb_put(txn, dbi, &key, &val, 0), 0);
    cr_assert_eq(mdb_txn_commit(txn), 0);
}

/* The index's format record written as major.minor, after dropping table
 * drop (NULL: none): the index as an older version wrote it. */
static void raw_set_format(MDB_env *env, uint16_t major, uint16_t minor, const char *drop)
{
    if (drop) {
        MDB_txn *txn;
        MDB_dbi dbi;
        cr_assert_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
        cr_assert_eq(mdb_dbi_open(txn, drop, 0, &dbi), 0);
        cr_assert_eq(mdb_drop(txn, dbi, 1), 0);
        cr_assert_eq(mdb_txn_commit(txn), 0);
    }
    ctxs__index_format f;
    memset(&f, 0, sizeof(f));
    memcpy(f.magic, CTXS__INDEX_MAGIC, 8);
    f.major = major;
    f.minor = minor;
    raw_put(env, "meta", "format", 6, &f, sizeof(f));
}

/* --- The store ------------------------------------------------------------- */

Test(index, store_dir_is_created_0700_and_files_0600)
{
    mode_t old = umask(0);
    ctxs_store *st = ts_store_open(ts_store_dir());
    umask(old);
    ctxs_model m = ts_model(1);
    model_reg(st, &m);
    ctxs_session *s = mk(st, "chat", &m, 256, 4, 10);
    ctxs_session_entry e = ts_session_entry(st, "chat");
    struct stat sb;
    const char *dirs[] = {ts_store_dir(), ts_path(ts_store_dir(), "index"),
                          ts_path(ts_store_dir(), "sessions")};
    for (size_t i = 0; i < 3; i++) {
        cr_assert_eq(stat(dirs[i], &sb), 0, "%s: %s", dirs[i], strerror(errno));
        cr_assert(S_ISDIR(sb.st_mode));
        cr_assert_eq(sb.st_mode & 07777, 0700, "%s has mode %o", dirs[i], sb.st_mode & 07777);
    }
    const char *files[] = {ts_path(ts_store_dir(), "index/data.mdb"),
                           ts_path(ts_store_dir(), "index/lock.mdb"), ts_id_path(e.id)};
    for (size_t i = 0; i < 3; i++) {
        cr_assert_eq(stat(files[i], &sb), 0, "%s: %s", files[i], strerror(errno));
        cr_assert_eq(sb.st_mode & 07777, 0600, "%s has mode %o", files[i], sb.st_mode & 07777);
    }
    ctxs_session_close(s);
    ctxs_store_close(st);
}

Test(index, store_open_refuses_bad_arguments)
{
    ctxs_store *st = (ctxs_store *)1;
    cr_assert_eq(ctxs_store_open(&st, NULL, CTXS_STORE_CREATE, NULL), CTXS_EINVAL);
    cr_assert_null(st);
    cr_assert_eq(ctxs_store_open(&st, "", CTXS_STORE_CREATE, NULL), CTXS_EINVAL);
    cr_assert_eq(ctxs_store_open(NULL, ts_store_dir(), CTXS_STORE_CREATE, NULL), CTXS_EINVAL);
    ctxs_store_options o = CTXS_STORE_OPTIONS_INIT;
    o.reserved[3] = 1;
    cr_assert_eq(ctxs_store_open(&st, ts_store_dir(), CTXS_STORE_CREATE, &o), CTXS_EINVAL);
    o = (ctxs_store_options)CTXS_STORE_OPTIONS_INIT;
    o.version = 99;
    cr_assert_eq(ctxs_store_open(&st, ts_store_dir(), CTXS_STORE_CREATE, &o), CTXS_EINVAL);
    /* A regular file where the directory should be. */
    cr_assert_eq(ts_write_file(ts_store_dir(), "x", 1), 0);
    int rc = ctxs_store_open(&st, ts_store_dir(), CTXS_STORE_CREATE, NULL);
    cr_assert_lt(rc, 0);
    cr_assert_null(st);
    ctxs_store_close(NULL);
}

Test(index, store_open_twice_shares_one_environment)
{
    ctxs_store *a = ts_store_open(ts_store_dir()), *b = ts_store_open(ts_store_dir());
    cr_assert_eq(a->env, b->env, "two handles of one store must share one MDB_env");
    ctxs_model m = ts_model(1);
    model_reg(a, &m);
    ctxs_session_close(mk(a, "from-a", &m, 256, 4, 70));
    ctxs_session_close(mk(b, "from-b", &m, 256, 4, 70));
    cr_assert_eq(count_entries(a), 2);
    cr_assert_eq(count_entries(b), 2);
    ctxs_store_close(a);
    /* b still works: reads, writes, a session open through it. */
    cr_assert_eq(count_entries(b), 2);
    ctxs_session *s = op(b, "from-a", &m, 0);
    cr_assert_eq(ts_append(s, 5), 0);
    ctxs_session_close(s);
    ctxs_session_close(mk(b, "after-close", &m, 256, 4, 3));
    cr_assert_eq(ts_session_entry(b, "from-a").n_tokens, 75);
    cr_assert_eq(count_entries(b), 3);
    ctxs_store_close(b);
    /* And a later open finds everything. */
    ctxs_store *c = ts_store_open(ts_store_dir());
    cr_assert_eq(count_entries(c), 3);
    ctxs_store_close(c);
}

typedef struct thread_arg {
    ctxs_store *st;
    int which;
    int failures;
    char why[256];
} thread_arg;

#define T_FAIL(a, ...)                                                          \
    do {                                                                       \
        (a)->failures++;                                                       \
        snprintf((a)->why, sizeof((a)->why), __VA_ARGS__);                     \
        return NULL;                                                           \
    } while (0)

static void *thread_main(void *p)
{
    thread_arg *a = p;
    ctxs_model m = ts_model(1);
    ctxs_create_options o = ts_options(256, 4, 1, CTXS_SYNC_NONE);
    uint32_t *ids = prompt(130, 130, 0);
    for (int i = 0; i < 12; i++) {
        char name[64], prev[64];
        snprintf(name, sizeof(name), "t%d-%d", a->which, i);
        ctxs_session *s;
        int rc = ctxs_store_session_create(&s, a->st, name, &m, &o);
        if (rc != 0)
            T_FAIL(a, "create %s: %s", name, ctxs_err_name(rc));
        ctxs_reservation r;
        uint16_t k[TS_KV_MAX], v[TS_KV_MAX];
        uint32_t n = 70 + (uint32_t)i;
        if ((rc = ctxs_session_reserve(&r, s, n)) != 0)
            T_FAIL(a, "reserve: %s", ctxs_err_name(rc));
        uint32_t tids[100];
        for (uint32_t j = 0; j < n; j++) {
            ts_fill_kv(&m.geometry, j, k, v);
            tids[j] = ts_token(j);
            ctxs_session_write_token(s, &r, j, k, v, CTXS_DTYPE_F16);
        }
        if ((rc = ctxs_session_commit(s, tids, n)) != 0)
            T_FAIL(a, "commit: %s", ctxs_err_name(rc));
        ctxs_prefix_match pm;
        rc = ctxs_prefix_find(&pm, a->st, m.model_hash, ids, 130);
        if (rc != 0 || pm.n_tokens < 70)
            T_FAIL(a, "prefix_find: %s %llu", ctxs_err_name(rc), (unsigned long long)pm.n_tokens);
        ctxs_session_close(s);
        if (i % 3 == 2) {
            snprintf(prev, sizeof(prev), "t%d-%d", a->which, i - 1);
            if ((rc = ctxs_store_session_delete(a->st, prev)) != 0)
                T_FAIL(a, "delete %s: %s", prev, ctxs_err_name(rc));
        }
        ctxs_session_entry *list;
        size_t nl;
        if ((rc = ctxs_store_session_list(&list, &nl, a->st)) != 0)
            T_FAIL(a, "list: %s", ctxs_err_name(rc));
        ctxs_free(list);
    }
    free(ids);
    return NULL;
}

Test(index, one_store_by_two_paths_is_one_handle_and_two_stores_are_two)
{
    ctxs_store *a = ts_store_open(ts_store_dir());
    cr_assert_eq(chdir(ts_scratch), 0);
    ctxs_store *b;
    cr_assert_eq(ctxs_store_open(&b, "store", CTXS_STORE_CREATE, NULL), 0);
    cr_assert_eq(a->env, b->env, "a relative path to the same store must share its environment");
    char other[1100];
    snprintf(other, sizeof(other), "%s/other", ts_scratch);
    ctxs_store *c;
    cr_assert_eq(ctxs_store_open(&c, other, CTXS_STORE_CREATE, NULL), 0);
    cr_assert_neq(c->env, a->env);
    ctxs_model m = ts_model(1);
    model_reg(a, &m);
    ctxs_model_entry me;
    cr_assert_eq(ctxs_model_get(&me, c, m.model_hash), CTXS_ENOTFOUND, "stores must not mix");
    model_reg(c, &m);
    ctxs_session_close(mk(a, "same-name", &m, 256, 4, 10));
    ctxs_session_close(mk(c, "same-name", &m, 256, 4, 20));
    cr_assert_eq(ts_session_entry(b, "same-name").n_tokens, 10);
    cr_assert_eq(ts_session_entry(c, "same-name").n_tokens, 20);
    ctxs_store_close(a);
    ctxs_store_close(c);
    cr_assert_eq(count_entries(b), 1);
    ctxs_store_close(b);
}

Test(index, two_threads_of_one_process_use_one_store)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    thread_arg args[2] = {{st, 0, 0, ""}, {st, 1, 0, ""}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, thread_main, &args[i]), 0);
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(args[i].failures, 0, "thread %d: %s", i, args[i].why);
    }
    /* 12 created, 4 deleted, by each. */
    ctxs_session_entry *list;
    size_t n;
    cr_assert_eq(ctxs_store_session_list(&list, &n, st), 0);
    cr_assert_eq(n, 16);
    for (size_t i = 0; i < n; i++) {
        cr_assert(ts_exists(ts_id_path(list[i].id)), "%s has no file", list[i].name);
        for (size_t j = 0; j < i; j++)
            cr_assert_neq(list[i].id, list[j].id, "two sessions share id %llu",
                          (unsigned long long)list[i].id);
    }
    ctxs_free(list);
    ctxs_store_close(st);
}

/* --- Names ------------------------------------------------------------------- */

Test(index, hostile_names_are_einval_everywhere)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session *s = mk(st, "good", &m, 256, 4, 70);
    char long_name[300];
    memset(long_name, 'a', 256);
    long_name[256] = '\0';
    char long_utf8[300]; /* 254 bytes + a 2-byte character = 256 */
    memset(long_utf8, 'b', 254);
    memcpy(long_utf8 + 254, "\xc3\xa9", 3);
    const char *bad[] = {
        "",
        ".",
        "..",
        "/",
        "a/b",
        "../../etc/passwd",
        "/etc/passwd",
        "sessions/../x",
        "tab\there",
        "new\nline",
        "esc\x1b[31m",
        "del\x7f",
        "\x01",
        long_name,
        long_utf8,
        "\xff",
        "bad\xfe",
        "\xc0\xaf",         /* overlong '/' */
        "\xe0\x80\xaf",     /* overlong '/' */
        "\xed\xa0\x80",     /* surrogate */
        "\xf4\x90\x80\x80", /* past U+10FFFF */
        "\xe2\x82",         /* truncated */
        "\x80",             /* lone continuation */
    };
    ctxs_create_options o = ts_options(256, 4, 1, CTXS_SYNC_NONE);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char *n = bad[i];
        ctxs_session *x = (ctxs_session *)1;
        ctxs_session_entry e;
        cr_assert_eq(ctxs_store_session_create(&x, st, n, &m, &o), CTXS_EINVAL, "create bad[%zu]", i);
        cr_assert_null(x);
        cr_assert_eq(ctxs_store_session_open(&x, st, n, &m, 0, NULL), CTXS_EINVAL, "open bad[%zu]", i);
        cr_assert_eq(ctxs_store_session_get(&e, st, n), CTXS_EINVAL, "get bad[%zu]", i);
        cr_assert_eq(ctxs_store_session_delete(st, n), CTXS_EINVAL, "delete bad[%zu]", i);
        cr_assert_eq(ctxs_store_session_rename(st, "good", n), CTXS_EINVAL, "rename to bad[%zu]", i);
        cr_assert_eq(ctxs_store_session_rename(st, n, "other"), CTXS_EINVAL, "rename from bad[%zu]", i);
        cr_assert_eq(ctxs_checkpoint_create(s, n), CTXS_EINVAL, "checkpoint bad[%zu]", i);
        cr_assert_eq(ctxs_store_session_fork(NULL, st, "good", n, 10, NULL), CTXS_EINVAL, "fork to bad[%zu]", i);
        cr_assert_eq(ctxs_store_session_fork_checkpoint(NULL, st, "good", n, "f", NULL), CTXS_EINVAL,
                     "fork at checkpoint bad[%zu]", i);
        cr_assert_eq(ctxs_model_register(st, &m, n[0] ? n : "\x02"), CTXS_EINVAL,
                     "model name bad[%zu]", i);
        cr_assert_not_null(ctxs_name_check(n), "name_check bad[%zu]", i);
    }
    cr_assert_not_null(ctxs_name_check(NULL));
    cr_assert_eq(ctxs_store_session_create(NULL, st, "x", &m, &o), CTXS_EINVAL);
    ctxs_session *x = (ctxs_session *)1;
    cr_assert_eq(ctxs_store_session_create(&x, st, NULL, &m, &o), CTXS_EINVAL);
    cr_assert_null(x);
    /* Nothing was created, renamed or left behind. */
    cr_assert_eq(count_entries(st), 1);
    ctxs_session_close(s);
    cr_assert_eq(ts_session_entry(st, "good").n_tokens, 70);
    DIR *d = opendir(ts_path(ts_store_dir(), "sessions"));
    cr_assert_not_null(d);
    int files = 0;
    for (struct dirent *de; (de = readdir(d));)
        files += de->d_name[0] != '.';
    closedir(d);
    cr_assert_eq(files, 1);
    ctxs_store_close(st);
}

Test(index, utf8_names_up_to_255_bytes_are_accepted)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    char max_ascii[256], max_utf8[256];
    memset(max_ascii, 'a', 255);
    max_ascii[255] = '\0';
    memset(max_utf8, 'b', 251);
    memcpy(max_utf8 + 251, "\xf0\x9f\x98\x80", 5); /* U+1F600, 4 bytes: 255 in all */
    const char *good[] = {
        max_ascii,
        max_utf8,
        "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e", /* 日本語 */
        "caf\xc3\xa9 au lait",
        "with spaces and 'quotes' and \"double\"",
        "-rf",
        "~",
        ".hidden",
        "a.b",
        "\xef\xbf\xbf", /* U+FFFF */
        "\xf4\x8f\xbf\xbf", /* U+10FFFF */
    };
    ctxs_create_options o = ts_options(256, 4, 1, CTXS_SYNC_NONE);
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        ctxs_session *s;
        int rc = ctxs_store_session_create(&s, st, good[i], &m, &o);
        cr_assert_eq(rc, 0, "create good[%zu]: %s", i, ctxs_err_name(rc));
        cr_assert_eq(ctxs_checkpoint_create(s, good[i]), 0, "checkpoint good[%zu]", i);
        cr_assert_null(ctxs_name_check(good[i]), "name_check good[%zu]: %s", i,
                       ctxs_name_check(good[i]));
        ctxs_session_close(s);
        ctxs_session_entry e = ts_session_entry(st, good[i]);
        cr_assert_str_eq(e.name, good[i]);
        cr_assert(ts_exists(ts_id_path(e.id)));
    }
    cr_assert_eq(ctxs_model_register(st, &m, max_utf8), 0);
    ctxs_model_entry me;
    cr_assert_eq(ctxs_model_get(&me, st, m.model_hash), 0);
    cr_assert_str_eq(me.name, max_utf8);
    cr_assert_eq(count_entries(st), sizeof(good) / sizeof(good[0]));
    ctxs_store_close(st);
}

Test(index, the_name_check_says_why_a_name_is_refused)
{
    char long_name[300];
    memset(long_name, 'a', 256);
    long_name[256] = '\0';
    const struct {
        const char *name, *why;
    } cases[] = {
        {NULL, "is missing (NULL)"},
        {"", "is empty"},
        {long_name, "is longer than 255 bytes"},
        {"a/b", "contains '/'"},
        {"wait...", "contains '..'"},
        {".", "is '.'"},
        {"new\nline", "contains a control character"},
        {"del\x7f", "contains a control character"},
        {"bad\xfe", "is not valid UTF-8"},
        {"\xc0\xaf", "is not valid UTF-8"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *why = ctxs_name_check(cases[i].name);
        cr_assert_not_null(why, "case %zu accepted", i);
        cr_expect_str_eq(why, cases[i].why, "case %zu", i);
    }
    cr_assert_null(ctxs_name_check("chat 1"));
    /* The rule in words names the limits the check applies. */
    cr_assert(strstr(CTXS_NAME_RULE, "255") && strstr(CTXS_NAME_RULE, "'/'") &&
              strstr(CTXS_NAME_RULE, "'..'"));
}

Test(index, names_with_two_dots_anywhere_are_einval)
{
    /* The rule is "no '..' in a name", not only "not the name ..": tools
     * print and export names, and none of them should look like a step up
     * a path. Single dots are fine. */
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    const char *bad[] = {"wait...", "v1..v2", "..hidden", "trailing..", "..."};
    ctxs_create_options o = ts_options(256, 4, 1, CTXS_SYNC_NONE);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ctxs_session *s = NULL;
        int rc = ctxs_store_session_create(&s, st, bad[i], &m, &o);
        cr_expect_eq(rc, CTXS_EINVAL, "create \"%s\": %s", bad[i], ctxs_err_name(rc));
        cr_expect_null(s);
    }
    const char *good[] = {"v1.2", ".hidden", "a.b.c", "end."};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        ctxs_session *s = NULL;
        int rc = ctxs_store_session_create(&s, st, good[i], &m, &o);
        cr_expect_eq(rc, 0, "create \"%s\": %s", good[i], ctxs_err_name(rc));
        ctxs_session_close(s);
    }
    ctxs_session_entry *list;
    size_t n;
    cr_assert_eq(ctxs_store_session_list(&list, &n, st), 0);
    cr_expect_eq(n, 4);
    ctxs_free(list);
    ctxs_store_close(st);
}

Test(index, a_name_is_never_a_path)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    /* Names that look like the store's own files. */
    const char *names[] = {"0000000000000002.ctxs", "0000000000000001.ctxs", "index", "sessions",
                           "data.mdb", "0000000000000001.ctxs.tmp-1-0"};
    uint64_t ids[6];
    for (size_t i = 0; i < 6; i++) {
        ctxs_session *s = mk(st, names[i], &m, 256, 4, (uint32_t)(10 + i));
        ids[i] = ts_session_entry(st, names[i]).id;
        ctxs_session_close(s);
    }
    /* Every session still has its own file, named by its id, with its own
     * tokens; nothing named after a name appeared anywhere. */
    for (size_t i = 0; i < 6; i++) {
        ctxs_session_entry e = ts_session_entry(st, names[i]);
        cr_assert_eq(e.id, ids[i]);
        cr_assert_eq(e.n_tokens, 10 + i, "%s: %llu tokens", names[i], (unsigned long long)e.n_tokens);
        for (size_t j = 0; j < i; j++)
            cr_assert_neq(ids[i], ids[j]);
        ctxs_session *s = op(st, names[i], &m, CTXS_RDONLY);
        cr_assert_eq(ts_n_tokens(s), 10 + i);
        ctxs_session_close(s);
    }
    cr_assert(!ts_exists(ts_path(ts_store_dir(), "0000000000000002.ctxs")));
    cr_assert(!ts_exists(ts_path(ts_store_dir(), "data.mdb")));
    cr_assert(!ts_exists(ts_path(ts_store_dir(), "sessions/index")));
    cr_assert(!ts_exists(ts_path(ts_store_dir(), "sessions/0000000000000001.ctxs.tmp-1-0")));
    /* A repair must not take those names for leftovers. */
    ctxs_store_repair_result rr;
    cr_assert_eq(ctxs_store_repair(&rr, st), 0);
    cr_assert_eq(rr.files_removed, 0);
    cr_assert_eq(rr.files_adopted, 0);
    cr_assert_eq(rr.entries_removed, 0);
    cr_assert_eq(count_entries(st), 6);
    ctxs_store_close(st);
}

/* --- Sessions ---------------------------------------------------------------- */

Test(index, create_open_list_report_model_tokens_size_and_last_use)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_model m1 = ts_model(1), m2 = ts_model(2);
    model_reg(st, &m1);
    model_reg(st, &m2);
    uint64_t t0 = (uint64_t)time(NULL) * 1000u - 1000u;
    ctxs_session *b = mk(st, "bravo", &m1, 256, 4, 120);
    ctxs_session *a = mk(st, "alpha", &m2, 512, 4, 30);
    ctxs_session_close(b);
    ts_sleep_us(5000);
    ctxs_session_close(a);
    uint64_t t1 = (uint64_t)time(NULL) * 1000u + 1000u;

    ctxs_session_entry *list;
    size_t n;
    cr_assert_eq(ctxs_store_session_list(&list, &n, st), 0);
    cr_assert_eq(n, 2);
    cr_assert_str_eq(list[0].name, "alpha"); /* name order */
    cr_assert_str_eq(list[1].name, "bravo");
    cr_assert_eq(memcmp(list[0].model_hash, m2.model_hash, 16), 0);
    cr_assert_eq(memcmp(list[1].model_hash, m1.model_hash, 16), 0);
    cr_assert_eq(list[0].n_tokens, 30);
    cr_assert_eq(list[1].n_tokens, 120);
    for (size_t i = 0; i < 2; i++) {
        cr_assert_eq(list[i].disk_bytes, file_bytes(ts_id_path(list[i].id)), "%s: disk_bytes",
                     list[i].name);
        cr_assert_gt(list[i].disk_bytes, 0);
        cr_assert(list[i].created_unix_ms >= t0 && list[i].created_unix_ms <= t1);
        cr_assert(list[i].last_used_unix_ms >= list[i].created_unix_ms &&
                  list[i].last_used_unix_ms <= t1);
        cr_assert_eq(list[i].parent_id, 0);
        cr_assert_eq(list[i].fork_tokens, 0);
    }
    cr_assert_gt(list[0].last_used_unix_ms, list[1].last_used_unix_ms, "alpha was closed last");
    cr_assert_neq(list[0].id, list[1].id);
    ctxs_free(list);

    /* Open by name: read-write needs the model, read-only does not. */
    ctxs_session *s = NULL;
    cr_assert_eq(ctxs_store_session_open(&s, st, "bravo", NULL, 0, NULL), CTXS_EINVAL);
    cr_assert_null(s);
    s = op(st, "bravo", NULL, CTXS_RDONLY);
    cr_assert_eq(ts_check_all(s), 0);
    cr_assert_eq(ts_n_tokens(s), 120);
    ctxs_session_close(s);
    s = op(st, "bravo", &m1, 0);
    cr_assert_eq(ts_append(s, 7), 0);
    ctxs_session_close(s);
    cr_assert_eq(ts_session_entry(st, "bravo").n_tokens, 127);
    /* A model listing knows both. */
    ctxs_model_entry *models;
    cr_assert_eq(ctxs_model_list(&models, &n, st), 0);
    cr_assert_eq(n, 2);
    ctxs_free(models);
    ctxs_store_close(st);
}

Test(index, create_with_a_taken_name_is_eexist)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session_close(mk(st, "taken", &m, 256, 4, 5));
    ctxs_create_options o = ts_options(256, 4, 1, CTXS_SYNC_NONE);
    ctxs_session *s = (ctxs_session *)1;
    cr_assert_eq(ctxs_store_session_create(&s, st, "taken", &m, &o), CTXS_ETAKEN);
    cr_assert_null(s);
    cr_assert_eq(ts_session_entry(st, "taken").n_tokens, 5);
    cr_assert_eq(count_entries(st), 1);
    /* Invalid options: nothing left behind, the name stays free. */
    o.capacity = 1;
    cr_assert_eq(ctxs_store_session_create(&s, st, "free", &m, &o), CTXS_EINVAL);
    ctxs_session_entry e;
    cr_assert_eq(ctxs_store_session_get(&e, st, "free"), CTXS_ENOTFOUND);
    ctxs_store_repair_result rr;
    cr_assert_eq(ctxs_store_repair(&rr, st), 0);
    cr_assert_eq(rr.files_removed + rr.files_adopted, 0, "a failed create left a file");
    ctxs_store_close(st);
}

Test(index, a_second_writer_is_ebusy_and_readers_coexist)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session *w = mk(st, "one", &m, 256, 4, 20);
    ctxs_session *x = (ctxs_session *)1;
    cr_assert_eq(ctxs_store_session_open(&x, st, "one", &m, 0, NULL), CTXS_EBUSY);
    cr_assert_null(x);
    ctxs_session *r1 = op(st, "one", &m, CTXS_RDONLY);
    ctxs_session *r2 = op(st, "one", NULL, CTXS_RDONLY);
    cr_assert_eq(ts_append(w, 10), 0);
    cr_assert_eq(ctxs_session_refresh(r1), 0);
    cr_assert_eq(ts_n_tokens(r1), 30);
    ctxs_session_close(w);
    w = op(st, "one", &m, 0); /* free again */
    ctxs_session_close(w);
    ctxs_session_close(r1);
    ctxs_session_close(r2);
    ctxs_store_close(st);
}

Test(index, delete_of_an_open_session_is_ebusy)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session *w = mk(st, "doomed", &m, 256, 4, 70);
    cr_assert_eq(ctxs_checkpoint_create(w, "cp"), 0);
    uint64_t id = ts_session_entry(st, "doomed").id;
    cr_assert_eq(ctxs_store_session_delete(st, "doomed"), CTXS_EBUSY, "open by a writer");
    ctxs_session_close(w);
    ctxs_session *r = op(st, "doomed", NULL, CTXS_RDONLY);
    cr_assert_eq(ctxs_store_session_delete(st, "doomed"), CTXS_EBUSY, "open by a reader");
    /* Still intact after the refusals. */
    cr_assert_eq(ts_check_all(r), 0);
    cr_assert_eq(ts_session_entry(st, "doomed").n_tokens, 70);
    ctxs_session_close(r);
    cr_assert_eq(ctxs_store_session_delete(st, "doomed"), 0);
    cr_assert(!ts_exists(ts_id_path(id)));
    ctxs_session_entry e;
    cr_assert_eq(ctxs_store_session_get(&e, st, "doomed"), CTXS_ENOTFOUND);
    cr_assert_eq(ctxs_store_session_delete(st, "doomed"), CTXS_ENOTFOUND);
    ctxs_checkpoint_entry *cps;
    size_t n;
    cr_assert_eq(ts_checkpoint_list(&cps, &n, st, "doomed"), CTXS_ENOTFOUND);
    /* The name is free again, and the new session does not inherit the old
     * one's checkpoints. */
    ctxs_session *s = mk(st, "doomed", &m, 256, 4, 3);
    cr_assert_neq(ts_session_entry(st, "doomed").id, id);
    cr_assert_eq(ctxs_checkpoint_restore(s, "cp"), CTXS_ENOTFOUND);
    cr_assert_eq(ts_checkpoint_list(&cps, &n, st, "doomed"), 0);
    cr_assert_eq(n, 0);
    ctxs_free(cps);
    ctxs_session_close(s);
    ctxs_store_close(st);
}

Test(index, rename_moves_the_entry_and_open_handles_stay_valid)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session *s = mk(st, "before", &m, 256, 4, 70);
    cr_assert_eq(ctxs_checkpoint_create(s, "cp"), 0);
    ctxs_session_close(mk(st, "other", &m, 256, 4, 1));
    ctxs_session_entry e1 = ts_session_entry(st, "before");
    cr_assert_eq(ctxs_store_session_rename(st, "before", "after"), 0);
    ctxs_session_entry e;
    cr_assert_eq(ctxs_store_session_get(&e, st, "before"), CTXS_ENOTFOUND);
    e = ts_session_entry(st, "after");
    cr_assert_eq(e.id, e1.id);
    cr_assert_eq(e.created_unix_ms, e1.created_unix_ms);
    /* The open handle keeps working and its close updates the new name. */
    cr_assert_eq(ts_append(s, 10), 0);
    cr_assert_eq(ctxs_checkpoint_restore(s, "cp"), 0);
    cr_assert_eq(ts_n_tokens(s), 70);
    cr_assert_eq(ts_append(s, 5), 0);
    ctxs_session_close(s);
    cr_assert_eq(ts_session_entry(st, "after").n_tokens, 75);
    cr_assert_eq(ctxs_store_session_get(&e, st, "before"), CTXS_ENOTFOUND);
    /* Checkpoints follow the session. */
    ctxs_checkpoint_entry *cps;
    size_t n;
    cr_assert_eq(ts_checkpoint_list(&cps, &n, st, "after"), 0);
    cr_assert_eq(n, 1);
    ctxs_free(cps);
    cr_assert_eq(ctxs_store_session_rename(st, "after", "other"), CTXS_ETAKEN);
    cr_assert_eq(ctxs_store_session_rename(st, "missing", "new"), CTXS_ENOTFOUND);
    cr_assert_eq(ctxs_store_session_rename(st, "after", "after"), 0);
    cr_assert_eq(ts_session_entry(st, "other").n_tokens, 1);
    cr_assert_eq(count_entries(st), 2);
    s = op(st, "after", &m, 0);
    cr_assert_eq(ts_check_all(s), 0);
    ctxs_session_close(s);
    ctxs_store_close(st);
}

Test(index, open_of_a_missing_name_or_file_is_enotfound)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session *s = (ctxs_session *)1;
    cr_assert_eq(ctxs_store_session_open(&s, st, "nobody", &m, 0, NULL), CTXS_ENOTFOUND);
    cr_assert_null(s);
    ctxs_session_close(mk(st, "gone", &m, 256, 4, 5));
    cr_assert_eq(unlink(ts_id_path(ts_session_entry(st, "gone").id)), 0);
    cr_assert_eq(ctxs_store_session_open(&s, st, "gone", &m, 0, NULL), CTXS_ENOTFOUND);
    cr_assert_eq(ctxs_store_session_open(&s, st, "gone", NULL, CTXS_RDONLY, NULL),
                 CTXS_ENOTFOUND);
    cr_assert_eq(ctxs_store_session_fork(NULL, st, "gone", "child", 1, NULL), CTXS_ENOTFOUND);
    cr_assert_eq(ctxs_store_session_fork(NULL, st, "nobody", "child", 1, NULL), CTXS_ENOTFOUND);
    ctxs_session_entry e;
    cr_assert_eq(ctxs_store_session_get(&e, st, "child"), CTXS_ENOTFOUND);
    ctxs_store_close(st);
}

/* --- Models ------------------------------------------------------------------ */

Test(index, model_register_same_hash_other_geometry_is_emodel)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_model m = ts_model(1);
    cr_assert_eq(ctxs_model_register(st, &m, "tiny"), 0);
    ctxs_model other = m;
    other.geometry.n_layers = 3;
    cr_assert_eq(ctxs_model_register(st, &other, "tiny-3"), CTXS_EMODEL);
    other = m;
    other.tokenizer_hash[0] ^= 1;
    cr_assert_eq(ctxs_model_register(st, &other, NULL), CTXS_EMODEL);
    /* Again with the same model: the display name changes, nothing else. */
    ctxs_model_entry e1, e2;
    cr_assert_eq(ctxs_model_get(&e1, st, m.model_hash), 0);
    cr_assert_str_eq(e1.name, "tiny");
    ts_sleep_us(2000);
    cr_assert_eq(ctxs_model_register(st, &m, "renamed"), 0);
    cr_assert_eq(ctxs_model_get(&e2, st, m.model_hash), 0);
    cr_assert_str_eq(e2.name, "renamed");
    cr_assert_eq(e2.registered_unix_ms, e1.registered_unix_ms);
    cr_assert_eq(memcmp(&e2.model, &m, sizeof(m)), 0);
    /* Bad geometry is refused. */
    other = ts_model(9);
    other.geometry.head_dim = 0;
    cr_assert_eq(ctxs_model_register(st, &other, NULL), CTXS_EINVAL);
    other = ts_model(9);
    other.geometry.dtype = 77;
    cr_assert_eq(ctxs_model_register(st, &other, NULL), CTXS_EINVAL);
    uint8_t unknown[16] = {1, 2, 3};
    cr_assert_eq(ctxs_model_get(&e1, st, unknown), CTXS_ENOTFOUND);
    /* A session with the conflicting geometry is refused too. */
    other = m;
    other.geometry.n_kv_heads = 4;
    ctxs_create_options o = ts_options(256, 4, 1, CTXS_SYNC_NONE);
    ctxs_session *s = (ctxs_session *)1;
    cr_assert_eq(ctxs_store_session_create(&s, st, "s", &other, &o), CTXS_EMODEL);
    cr_assert_null(s);
    ctxs_model_entry *list;
    size_t n;
    cr_assert_eq(ctxs_model_list(&list, &n, st), 0);
    cr_assert_eq(n, 1);
    cr_assert_eq(memcmp(list[0].model.model_hash, m.model_hash, 16), 0);
    ctxs_free(list);
    ctxs_store_close(st);
}

Test(index, create_with_an_unregistered_model_is_enomodel_not_enotfound)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_model m = ts_model(1);
    ctxs_create_options o = ts_options(256, 4, 1, CTXS_SYNC_NONE);
    ctxs_session *s = (ctxs_session *)1;
    cr_assert_eq(ctxs_store_session_create(&s, st, "s", &m, &o), CTXS_ENOMODEL);
    cr_assert(strstr(ctxs_get_last_error(), "is not registered"), "%s", ctxs_get_last_error());
    cr_assert_null(s);
    cr_assert_eq(count_entries(st), 0);
    ctxs_model_entry *list;
    size_t n;
    cr_assert_eq(ctxs_model_list(&list, &n, st), 0);
    cr_assert_eq(n, 0, "a refused create must not register the model");
    cr_assert_null(list);
    ctxs_store_close(st);
}

Test(index, open_with_another_models_hash_is_emodel)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_model m1 = ts_model(1), m2 = ts_model(2);
    model_reg(st, &m1);
    model_reg(st, &m2);
    ctxs_session_close(mk(st, "s", &m1, 256, 4, 5));
    ctxs_session *s = (ctxs_session *)1;
    cr_assert_eq(ctxs_store_session_open(&s, st, "s", &m2, 0, NULL), CTXS_EMODEL);
    cr_assert_null(s);
    cr_assert_eq(ctxs_store_session_open(&s, st, "s", &m2, CTXS_RDONLY, NULL), CTXS_EMODEL);
    /* Same hash, other tokenizer: the file refuses it. */
    ctxs_model m3 = m1;
    m3.tokenizer_hash[5] ^= 0x40;
    cr_assert_eq(ctxs_store_session_open(&s, st, "s", &m3, 0, NULL), CTXS_EMODEL);
    s = op(st, "s", &m1, 0);
    ctxs_session_close(s);
    ctxs_store_close(st);
}

static void xxh3_128(uint8_t out[16], const void *data, size_t len)
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(data, len));
    memcpy(out, c.digest, 16);
}

static uint8_t *pattern(size_t len, uint64_t seed)
{
    uint8_t *b = malloc(len ? len : 1);
    cr_assert_not_null(b);
    for (size_t i = 0; i < len; i++)
        b[i] = (uint8_t)(ts_rng_next(&seed) >> 17);
    return b;
}

Test(index, model_hash_file_equals_xxh3_128_of_the_file)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    /* Sizes around the library's 1 MiB read. */
    const size_t sizes[] = {0, 1, 4096, (1u << 20) - 1, 1u << 20, (3u << 20) + 12345};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        const char *path = ts_path(ts_scratch, "weights.bin");
        uint8_t *data = pattern(sizes[i], i + 1);
        cr_assert_eq(ts_write_file(path, data, sizes[i]), 0);
        uint8_t want[16], got[16], got_nostore[16];
        xxh3_128(want, data, sizes[i]);
        cr_assert_eq(ctxs_model_hash_file(got, st, path), 0);
        cr_assert_eq(memcmp(got, want, 16), 0, "size %zu: not XXH3-128 of the file", sizes[i]);
        cr_assert_eq(ctxs_model_hash_file(got_nostore, NULL, path), 0);
        cr_assert_eq(memcmp(got_nostore, want, 16), 0);
        cr_assert_eq(unlink(path), 0); /* a new inode for the next size */
        free(data);
    }
    uint8_t out[16];
    cr_assert_eq(ctxs_model_hash_file(out, st, ts_path(ts_scratch, "missing")), -ENOENT);
    cr_assert_eq(ctxs_model_hash_file(out, st, ts_scratch), -EISDIR);
    cr_assert_eq(ctxs_model_hash_file(NULL, st, ts_scratch), CTXS_EINVAL);
    ctxs_store_close(st);
}

Test(index, model_hash_file_is_cached_until_size_or_mtime_changes)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    const char *path = ts_path(ts_scratch, "weights.bin");
    const size_t len = (1u << 20) + 777;
    uint8_t *data = pattern(len, 42);
    cr_assert_eq(ts_write_file(path, data, len), 0);
    uint8_t h_old[16], h_new[16], got[16];
    xxh3_128(h_old, data, len);
    cr_assert_eq(ctxs_model_hash_file(got, st, path), 0);
    cr_assert_eq(memcmp(got, h_old, 16), 0);

    /* Change a byte in place, same size, and put the mtime back: the cache
     * cannot tell, so the second call is served from it. */
    struct stat before;
    cr_assert_eq(stat(path, &before), 0);
    data[len / 2] ^= 0xff;
    xxh3_128(h_new, data, len);
    cr_assert_neq(memcmp(h_new, h_old, 16), 0);
    int fd = open(path, O_WRONLY);
    cr_assert_geq(fd, 0);
    cr_assert_eq(pwrite(fd, data + len / 2, 1, (off_t)(len / 2)), 1);
    struct timespec times[2] = {before.st_atim, before.st_mtim};
    cr_assert_eq(futimens(fd, times), 0);
    close(fd);
    struct stat after;
    cr_assert_eq(stat(path, &after), 0);
    cr_assert_eq(after.st_mtim.tv_sec, before.st_mtim.tv_sec);
    cr_assert_eq(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec);
    cr_assert_eq(ctxs_model_hash_file(got, st, path), 0);
    cr_assert_eq(memcmp(got, h_old, 16), 0, "the second call must come from the cache");
    /* Without a store there is no cache. */
    cr_assert_eq(ctxs_model_hash_file(got, NULL, path), 0);
    cr_assert_eq(memcmp(got, h_new, 16), 0);
    /* The cache lives in the index: a fresh handle still has it. */
    ctxs_store_close(st);
    st = ts_store_open(ts_store_dir());
    cr_assert_eq(ctxs_model_hash_file(got, st, path), 0);
    cr_assert_eq(memcmp(got, h_old, 16), 0, "the cache did not survive a reopen");

    /* Another mtime: hashed again. */
    struct timespec later[2] = {before.st_atim, before.st_mtim};
    later[1].tv_sec += 7;
    cr_assert_eq(utimensat(AT_FDCWD, path, later, 0), 0);
    cr_assert_eq(ctxs_model_hash_file(got, st, path), 0);
    cr_assert_eq(memcmp(got, h_new, 16), 0, "a changed mtime must re-hash");
    /* Another size: hashed again. */
    cr_assert_eq(ts_write_file(path, data, len - 1), 0);
    cr_assert_eq(utimensat(AT_FDCWD, path, later, 0), 0);
    xxh3_128(h_new, data, len - 1);
    cr_assert_eq(ctxs_model_hash_file(got, st, path), 0);
    cr_assert_eq(memcmp(got, h_new, 16), 0, "a changed size must re-hash");
    free(data);
    ctxs_store_close(st);
}

/* --- Tokenizer hashes ----------------------------------------------------- */

static void xxh3_128_seeded(uint8_t out[16], const void *data, size_t len, uint64_t seed)
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_withSeed(data, len, seed));
    memcpy(out, c.digest, 16);
}

Test(index, a_tokenizer_file_hashes_apart_from_weights_and_each_is_cached_apart)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    const char *path = ts_path(ts_scratch, "tokenizer.json");
    const size_t len = (1u << 20) + 99;
    uint8_t *data = pattern(len, 7);
    cr_assert_eq(ts_write_file(path, data, len), 0);
    uint8_t tok[16], weights[16], got[16];
    xxh3_128_seeded(tok, data, len, CTXS__TOKENIZER_FILE_SEED);
    xxh3_128(weights, data, len);
    cr_assert_neq(memcmp(tok, weights, 16), 0);
    /* Weights first: the tokenizer hash must not come from its row. */
    cr_assert_eq(ctxs_model_hash_file(got, st, path), 0);
    cr_assert_eq(memcmp(got, weights, 16), 0);
    cr_assert_eq(ctxs_tokenizer_hash_file(got, st, path), 0);
    cr_assert_eq(memcmp(got, tok, 16), 0, "a tokenizer hash is not the seeded XXH3-128");
    cr_assert_eq(ctxs_tokenizer_hash_file(got, NULL, path), 0);
    cr_assert_eq(memcmp(got, tok, 16), 0);
    cr_assert_eq(ctxs_model_hash_file(got, st, path), 0);
    cr_assert_eq(memcmp(got, weights, 16), 0, "the weights row was taken over");

    /* Change a byte and put the mtime back: both come from their own
     * rows, as they were. */
    struct stat before;
    cr_assert_eq(stat(path, &before), 0);
    data[3] ^= 0x5a;
    int fd = open(path, O_WRONLY);
    cr_assert_geq(fd, 0);
    cr_assert_eq(pwrite(fd, data + 3, 1, 3), 1);
    struct timespec times[2] = {before.st_atim, before.st_mtim};
    cr_assert_eq(futimens(fd, times), 0);
    close(fd);
    cr_assert_eq(ctxs_tokenizer_hash_file(got, st, path), 0);
    cr_assert_eq(memcmp(got, tok, 16), 0, "the tokenizer hash was not cached");
    cr_assert_eq(ctxs_model_hash_file(got, st, path), 0);
    cr_assert_eq(memcmp(got, weights, 16), 0, "the weights hash was not cached");
    /* Another mtime: both hashed again. */
    struct timespec later[2] = {before.st_atim, before.st_mtim};
    later[1].tv_sec += 3;
    cr_assert_eq(utimensat(AT_FDCWD, path, later, 0), 0);
    xxh3_128_seeded(tok, data, len, CTXS__TOKENIZER_FILE_SEED);
    cr_assert_eq(ctxs_tokenizer_hash_file(got, st, path), 0);
    cr_assert_eq(memcmp(got, tok, 16), 0, "a changed mtime must re-hash");

    uint8_t out[16];
    cr_assert_eq(ctxs_tokenizer_hash_file(out, st, ts_path(ts_scratch, "missing")), -ENOENT);
    cr_assert_eq(ctxs_tokenizer_hash_file(out, st, ts_scratch), -EISDIR);
    cr_assert_eq(ctxs_tokenizer_hash_file(NULL, st, path), CTXS_EINVAL);
    cr_assert_eq(ctxs_tokenizer_hash_file(out, st, NULL), CTXS_EINVAL);
    free(data);
    ctxs_store_close(st);
}

Test(index, tokenizer_strings_hash_with_their_lengths)
{
    const char *ab_c[] = {"ab", "c"}, *a_bc[] = {"a", "bc"}, *abc[] = {"abc"};
    const char *with_empty[] = {"abc", ""};
    uint8_t h1[16], h2[16], h3[16], h4[16], h5[16];
    cr_assert_eq(ctxs_tokenizer_hash_strings(h1, ab_c, NULL, 2), 0);
    cr_assert_eq(ctxs_tokenizer_hash_strings(h2, a_bc, NULL, 2), 0);
    cr_assert_eq(ctxs_tokenizer_hash_strings(h3, abc, NULL, 1), 0);
    cr_assert_eq(ctxs_tokenizer_hash_strings(h4, with_empty, NULL, 2), 0);
    cr_assert_neq(memcmp(h1, h2, 16), 0, "[ab, c] and [a, bc] must differ");
    cr_assert_neq(memcmp(h1, h3, 16), 0);
    cr_assert_neq(memcmp(h3, h4, 16), 0, "an empty token counts");
    /* Explicit lengths give the same; bytes after a NUL count with them. */
    const size_t lens[] = {2, 1};
    cr_assert_eq(ctxs_tokenizer_hash_strings(h5, ab_c, lens, 2), 0);
    cr_assert_eq(memcmp(h1, h5, 16), 0);
    const char *nul[] = {"a\0b"};
    const size_t nul_len[] = {3};
    cr_assert_eq(ctxs_tokenizer_hash_strings(h5, nul, nul_len, 1), 0);
    cr_assert_eq(ctxs_tokenizer_hash_strings(h2, nul, NULL, 1), 0);
    cr_assert_neq(memcmp(h5, h2, 16), 0);
    /* The stream is each length (u64 LE) then the bytes, seeded. */
    uint8_t stream[8 + 2 + 8 + 1] = {2, 0, 0, 0, 0, 0, 0, 0, 'a', 'b', 1, 0, 0, 0, 0, 0, 0, 0, 'c'};
    xxh3_128_seeded(h2, stream, sizeof(stream), CTXS__TOKENIZER_STRINGS_SEED);
    cr_assert_eq(memcmp(h1, h2, 16), 0);
    /* No list: still a hash, the seeded hash of nothing. */
    cr_assert_eq(ctxs_tokenizer_hash_strings(h1, NULL, NULL, 0), 0);
    xxh3_128_seeded(h2, "", 0, CTXS__TOKENIZER_STRINGS_SEED);
    cr_assert_eq(memcmp(h1, h2, 16), 0);
    const char *null_tok[] = {"a", NULL};
    const size_t zero_len[] = {1, 0};
    cr_assert_eq(ctxs_tokenizer_hash_strings(NULL, ab_c, NULL, 2), CTXS_EINVAL);
    cr_assert_eq(ctxs_tokenizer_hash_strings(h1, NULL, NULL, 2), CTXS_EINVAL);
    cr_assert_eq(ctxs_tokenizer_hash_strings(h1, null_tok, NULL, 2), CTXS_EINVAL);
    cr_assert_eq(ctxs_tokenizer_hash_strings(h1, null_tok, zero_len, 2), 0);
}

/* --- Checkpoints ------------------------------------------------------------- */

static ctxs_checkpoint_entry *cp_find(ctxs_checkpoint_entry *list, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(list[i].name, name) == 0)
            return &list[i];
    return NULL;
}

Test(index, checkpoint_create_list_restore_delete)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session *s = mk(st, "s", &m, 512, 4, 40);
    cr_assert_eq(ctxs_checkpoint_create(s, "at40"), 0);
    cr_assert_eq(ts_append(s, 60), 0);
    cr_assert_eq(ctxs_checkpoint_create(s, "at100"), 0);
    cr_assert_eq(ts_append(s, 50), 0);
    cr_assert_eq(ctxs_checkpoint_create(s, "at150"), 0);

    ctxs_checkpoint_entry *list;
    size_t n;
    cr_assert_eq(ts_checkpoint_list(&list, &n, st, "s"), 0);
    cr_assert_eq(n, 3);
    cr_assert_str_eq(list[0].name, "at100"); /* name order */
    cr_assert_str_eq(list[1].name, "at150");
    cr_assert_str_eq(list[2].name, "at40");
    cr_assert_eq(list[0].n_tokens, 100);
    cr_assert_eq(list[1].n_tokens, 150);
    cr_assert_eq(list[2].n_tokens, 40);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(list[i].stale, 0, "%s stale", list[i].name);
        cr_assert_gt(list[i].created_unix_ms, 0);
    }
    ctxs_free(list);

    /* Restore is a rollback: the count goes back, the tokens stay. */
    cr_assert_eq(ctxs_checkpoint_restore(s, "at100"), 0);
    cr_assert_eq(ts_n_tokens(s), 100);
    cr_assert_eq(ts_check_all(s), 0);
    /* Written again with the same tokens: at150 holds again. */
    cr_assert_eq(ts_append(s, 50), 0);
    cr_assert_eq(ctxs_checkpoint_restore(s, "at150"), 0);
    cr_assert_eq(ts_n_tokens(s), 150);
    cr_assert_eq(ctxs_checkpoint_restore(s, "at40"), 0);
    cr_assert_eq(ts_n_tokens(s), 40);
    cr_assert_eq(ctxs_checkpoint_restore(s, "nope"), CTXS_ENOTFOUND);

    cr_assert_eq(ts_checkpoint_delete(st, "s", "at150"), 0);
    cr_assert_eq(ts_checkpoint_delete(st, "s", "at150"), CTXS_ENOTFOUND);
    cr_assert_eq(ts_checkpoint_delete(st, "nobody", "at40"), CTXS_ENOTFOUND);
    cr_assert_eq(ctxs_checkpoint_restore(s, "at150"), CTXS_ENOTFOUND);
    cr_assert_eq(ts_checkpoint_list(&list, &n, st, "s"), 0);
    cr_assert_eq(n, 2);
    ctxs_free(list);
    cr_assert_eq(ts_checkpoint_list(&list, &n, st, "nobody"), CTXS_ENOTFOUND);

    /* A read-only handle cannot restore; a handle not from this store cannot
     * checkpoint. */
    ctxs_session_close(s);
    s = op(st, "s", &m, CTXS_RDONLY);
    cr_assert_eq(ctxs_checkpoint_restore(s, "at40"), CTXS_EREADONLY);
    ctxs_session_close(s);
    ctxs_session *plain;
    ctxs_create_options o = ts_options(256, 4, 1, CTXS_SYNC_NONE);
    cr_assert_eq(ctxs_session_create(&plain, ts_path(ts_scratch, "plain.ctxs"), &m, &o), 0);
    cr_assert_eq(ctxs_checkpoint_create(plain, "x"), CTXS_EINVAL);
    cr_assert_eq(ctxs_checkpoint_restore(plain, "at40"), CTXS_EINVAL);
    ctxs_session_close(plain);
    /* Checkpoints of two sessions do not mix. */
    ctxs_session *t = mk(st, "t", &m, 256, 4, 10);
    cr_assert_eq(ctxs_checkpoint_create(t, "at40"), 0); /* same name, other session */
    cr_assert_eq(ts_checkpoint_list(&list, &n, st, "t"), 0);
    cr_assert_eq(n, 1);
    cr_assert_eq(list[0].n_tokens, 10);
    ctxs_free(list);
    ctxs_session_close(t);
    ctxs_store_close(st);
}

Test(index, checkpoint_with_a_taken_name_is_eexist)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session *s = mk(st, "s", &m, 256, 4, 10);
    cr_assert_eq(ctxs_checkpoint_create(s, "cp"), 0);
    cr_assert_eq(ts_append(s, 10), 0);
    cr_assert_eq(ctxs_checkpoint_create(s, "cp"), CTXS_ETAKEN);
    ctxs_checkpoint_entry *list;
    size_t n;
    cr_assert_eq(ts_checkpoint_list(&list, &n, st, "s"), 0);
    cr_assert_eq(n, 1);
    cr_assert_eq(list[0].n_tokens, 10, "the first checkpoint must stand");
    ctxs_free(list);
    ctxs_session_close(s);
    ctxs_store_close(st);
}

Test(index, checkpoint_overwritten_by_the_ring_is_evicted_and_listed_stale)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session *s = mk(st, "s", &m, 128, 4, 100);
    cr_assert_eq(ctxs_checkpoint_create(s, "early"), 0);
    cr_assert_eq(ctxs_checkpoint_create(s, "sink"), 0);
    cr_assert_eq(ts_checkpoint_delete(st, "s", "sink"), 0);
    ctxs_session_close(s);
    s = op(st, "s", &m, 0);
    /* 4 sinks: a checkpoint inside them survives the ring. */
    cr_assert_eq(ctxs_session_rollback(s, 3), 0);
    cr_assert_eq(ctxs_checkpoint_create(s, "sink"), 0);
    cr_assert_eq(ts_append(s, 97), 0);
    cr_assert_eq(ctxs_checkpoint_create(s, "late"), 0); /* at 100 again */
    /* 150 more: the ring (124 slots) now starts at 126. */
    for (int i = 0; i < 3; i++)
        cr_assert_eq(ts_append(s, 50), 0);
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert(info.flags & CTXS_INFO_WRAPPED);
    cr_assert_eq(ctxs_checkpoint_restore(s, "early"), CTXS_EEVICTED);
    cr_assert_eq(ctxs_checkpoint_restore(s, "late"), CTXS_EEVICTED);
    cr_assert_eq(ts_n_tokens(s), 250, "a refused restore must not move the session");
    ctxs_checkpoint_entry *list;
    size_t n;
    cr_assert_eq(ts_checkpoint_list(&list, &n, st, "s"), 0);
    cr_assert_eq(n, 3);
    cr_assert_eq(cp_find(list, n, "early")->stale, 1);
    cr_assert_eq(cp_find(list, n, "late")->stale, 1);
    cr_assert_eq(cp_find(list, n, "sink")->stale, 0);
    ctxs_free(list);
    cr_assert_eq(ctxs_store_session_fork(NULL, st, "s", "f", 100, NULL), CTXS_EEVICTED);
    cr_assert_eq(ctxs_store_session_fork_checkpoint(NULL, st, "s", "late", "f", NULL), CTXS_EEVICTED);
    ctxs_session_entry e;
    cr_assert_eq(ctxs_store_session_get(&e, st, "f"), CTXS_ENOTFOUND);
    cr_assert_eq(ctxs_checkpoint_restore(s, "sink"), 0);
    cr_assert_eq(ts_n_tokens(s), 3);
    ctxs_session_close(s);
    ctxs_store_repair_result rr;
    cr_assert_eq(ctxs_store_repair(&rr, st), 0);
    cr_assert_eq(rr.files_removed + rr.files_adopted, 0, "a refused fork left a file");
    ctxs_store_close(st);
}

Test(index, checkpoint_rolled_back_and_rewritten_is_stale_and_listed_stale)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session *s = mk(st, "s", &m, 256, 4, 100);
    cr_assert_eq(ctxs_checkpoint_create(s, "cp"), 0);
    ctxs_session_close(s);
    s = op(st, "s", &m, 0);
    cr_assert_eq(ctxs_session_rollback(s, 40), 0);
    cr_assert_eq(ctxs_checkpoint_create(s, "early"), 0);
    /* Rolled back past it. */
    cr_assert_eq(ctxs_checkpoint_restore(s, "cp"), CTXS_ESTALE);
    ctxs_checkpoint_entry *list;
    size_t n;
    cr_assert_eq(ts_checkpoint_list(&list, &n, st, "s"), 0);
    cr_assert_eq(cp_find(list, n, "cp")->stale, 1);
    cr_assert_eq(cp_find(list, n, "early")->stale, 0);
    ctxs_free(list);
    /* Written again with other tokens, past the checkpoint's count. */
    append_gen(s, 70, 1);
    cr_assert_eq(ts_n_tokens(s), 110);
    cr_assert_eq(ctxs_checkpoint_restore(s, "cp"), CTXS_ESTALE);
    cr_assert_eq(ts_n_tokens(s), 110);
    cr_assert_eq(ts_checkpoint_list(&list, &n, st, "s"), 0);
    cr_assert_eq(cp_find(list, n, "cp")->stale, 1);
    cr_assert_eq(cp_find(list, n, "early")->stale, 0);
    ctxs_free(list);
    cr_assert_eq(ctxs_store_session_fork_checkpoint(NULL, st, "s", "cp", "f", NULL), CTXS_ESTALE);
    cr_assert_eq(ctxs_checkpoint_restore(s, "early"), 0);
    cr_assert_eq(ts_n_tokens(s), 40);
    cr_assert_eq(ts_check_all(s), 0);
    ctxs_session_close(s);
    ctxs_store_close(st);
}

/* --- Forks ------------------------------------------------------------------- */

Test(index, fork_at_a_count_at_a_checkpoint_and_in_full)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session *src = mk(st, "src", &m, 512, 4, 200);
    cr_assert_eq(ctxs_checkpoint_create(src, "cp"), 0);
    cr_assert_eq(ts_append(src, 100), 0);
    ctxs_session_close(src);
    src = op(st, "src", &m, CTXS_RDONLY);
    uint64_t src_id = ts_session_entry(st, "src").id;

    struct {
        const char *name;
        uint64_t want;
    } forks[] = {{"at130", 130}, {"at-cp", 200}, {"full", 300}, {"at0", 0}};
    ctxs_session *f;
    int rc = ctxs_store_session_fork(&f, st, "src", "at130", 130, NULL);
    cr_assert_eq(rc, 0, "fork at 130: %s", ctxs_err_name(rc));
    ctxs_session_close(f);
    rc = ctxs_store_session_fork_checkpoint(&f, st, "src", "cp", "at-cp", NULL);
    cr_assert_eq(rc, 0, "fork at cp: %s", ctxs_err_name(rc));
    ctxs_session_close(f);
    rc = ctxs_store_session_fork(NULL, st, "src", "full", UINT64_MAX, NULL); /* left closed */
    cr_assert_eq(rc, 0, "fork in full: %s", ctxs_err_name(rc));
    rc = ctxs_store_session_fork(NULL, st, "src", "at0", 0, NULL);
    cr_assert_eq(rc, 0, "fork at 0: %s", ctxs_err_name(rc));

    ctxs_session_info si;
    cr_assert_eq(ctxs_session_get_info(&si, src), 0);
    for (size_t i = 0; i < sizeof(forks) / sizeof(forks[0]); i++) {
        ctxs_session_entry e = ts_session_entry(st, forks[i].name);
        cr_assert_eq(e.parent_id, src_id, "%s: parent_id", forks[i].name);
        cr_assert_eq(e.fork_tokens, forks[i].want, "%s: fork_tokens %llu", forks[i].name,
                     (unsigned long long)e.fork_tokens);
        cr_assert_eq(memcmp(e.model_hash, m.model_hash, 16), 0);
        cr_assert_neq(e.id, src_id);
        f = op(st, forks[i].name, &m, 0);
        ctxs_session_info fi;
        cr_assert_eq(ctxs_session_get_info(&fi, f), 0);
        cr_assert_eq(fi.n_tokens, forks[i].want, "%s: %llu tokens", forks[i].name,
                     (unsigned long long)fi.n_tokens);
        cr_assert_eq(fi.capacity, si.capacity);
        cr_assert_eq(fi.n_sink, si.n_sink);
        cr_assert_eq(fi.flags & CTXS_INFO_RING, si.flags & CTXS_INFO_RING);
        ts_same_tokens(src, f, forks[i].want, "source and fork");
        cr_assert_eq(ctxs_session_verify(NULL, f), 0);
        /* A fork is a session of its own: it grows apart from the source. */
        append_gen(f, 20, 3);
        ctxs_session_close(f);
        cr_assert_eq(ts_session_entry(st, forks[i].name).n_tokens, forks[i].want + 20);
    }
    /* The source did not move. */
    ctxs_session_close(src);
    src = op(st, "src", &m, 0);
    cr_assert_eq(ts_n_tokens(src), 300);
    cr_assert_eq(ts_check_all(src), 0);
    ctxs_session_close(src);
    ctxs_store_close(st);
}

Test(index, fork_into_a_taken_name_is_eexist)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session_close(mk(st, "src", &m, 256, 4, 80));
    ctxs_session_close(mk(st, "taken", &m, 256, 4, 7));
    ctxs_session *f = (ctxs_session *)1;
    cr_assert_eq(ctxs_store_session_fork(&f, st, "src", "taken", 50, NULL), CTXS_ETAKEN);
    cr_assert_null(f);
    cr_assert_eq(ctxs_store_session_fork(&f, st, "src", "src", 50, NULL), CTXS_ETAKEN);
    cr_assert_eq(ctxs_store_session_fork(&f, st, "src", "new", 81, NULL), CTXS_EINVAL);
    cr_assert_eq(ctxs_store_session_fork_checkpoint(&f, st, "src", "nocp", "new", NULL), CTXS_ENOTFOUND);
    ctxs_session_entry e = ts_session_entry(st, "taken");
    cr_assert_eq(e.n_tokens, 7);
    cr_assert_eq(e.parent_id, 0);
    cr_assert_eq(ctxs_store_session_get(&e, st, "new"), CTXS_ENOTFOUND);
    cr_assert_eq(count_entries(st), 2);
    ctxs_store_repair_result rr;
    cr_assert_eq(ctxs_store_repair(&rr, st), 0);
    cr_assert_eq(rr.files_removed + rr.files_adopted, 0, "a refused fork left a file");
    ctxs_store_close(st);
}

Test(index, fork_from_a_session_open_by_a_writer_here)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session *w = mk(st, "live", &m, 512, 4, 100);
    ctxs_session *f;
    cr_assert_eq(ctxs_store_session_fork(&f, st, "live", "snap", UINT64_MAX, NULL), 0);
    cr_assert_eq(ts_n_tokens(f), 100, "a fork takes what is committed");
    ts_same_tokens(w, f, 100, "source and fork");
    cr_assert_eq(ts_append(w, 50), 0);
    cr_assert_eq(ts_n_tokens(f), 100);
    ctxs_session_close(f);
    cr_assert_eq(ctxs_store_session_fork(&f, st, "live", "snap2", 150, NULL), 0);
    ts_same_tokens(w, f, 150, "source and fork");
    ctxs_session_close(f);
    ctxs_session_close(w);
    ctxs_store_close(st);
}

/* --- Shared prefixes --------------------------------------------------------- */

Test(index, prefix_find_returns_whole_chunks_plus_the_matching_tail)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session_close(mk(st, "held", &m, 512, 4, 250));
    const uint64_t want = 3 * CTXS_PREFIX_CHUNK + 10;
    uint32_t *t = prompt(300, want, 1); /* diverges at 202 */
    cr_assert_neq(t[want], ts_token(want));
    ctxs_prefix_match pm;
    int rc = find(&pm, st, &m, t, 300);
    cr_assert_eq(rc, 0, "find: %s", ctxs_err_name(rc));
    cr_assert_str_eq(pm.session, "held");
    cr_assert_eq(pm.n_tokens, want, "matched %llu", (unsigned long long)pm.n_tokens);
    /* The prompt ends inside the session: all of it. */
    rc = find(&pm, st, &m, t, 150);
    cr_assert_eq(rc, 0);
    cr_assert_eq(pm.n_tokens, 150);
    /* The session ends inside the prompt: all of the session. */
    free(t);
    t = prompt(400, 400, 0);
    cr_assert_eq(find(&pm, st, &m, t, 400), 0);
    cr_assert_eq(pm.n_tokens, 250);
    /* Exactly one chunk. */
    cr_assert_eq(find(&pm, st, &m, t, 64), 0);
    cr_assert_eq(pm.n_tokens, 64);
    /* Diverging inside the first chunk: no whole chunk matches. */
    free(t);
    t = prompt(300, 63, 1);
    cr_assert_eq(find(&pm, st, &m, t, 300), CTXS_ENOTFOUND);
    free(t);
    /* The fork the match suggests holds exactly those tokens. */
    t = prompt(300, want, 1);
    cr_assert_eq(find(&pm, st, &m, t, 300), 0);
    ctxs_session *f, *src = op(st, "held", &m, CTXS_RDONLY);
    cr_assert_eq(ctxs_store_session_fork(&f, st, pm.session, "reuse", pm.n_tokens, NULL), 0);
    ts_same_tokens(src, f, want, "source and fork");
    ctxs_session_close(f);
    ctxs_session_close(src);
    free(t);
    ctxs_store_close(st);
}

Test(index, prefix_find_shorter_than_a_chunk_or_of_another_model_is_enotfound)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_model m = ts_model(1), other = ts_model(2);
    model_reg(st, &m);
    model_reg(st, &other);
    ctxs_session_close(mk(st, "held", &m, 512, 4, 250));
    uint32_t *t = prompt(250, 250, 0);
    ctxs_prefix_match pm;
    cr_assert_eq(find(&pm, st, &m, t, 63), CTXS_ENOTFOUND);
    cr_assert_eq(find(&pm, st, &m, t, 1), CTXS_ENOTFOUND);
    cr_assert_eq(find(&pm, st, &m, t, 0), CTXS_ENOTFOUND);
    cr_assert_eq(find(&pm, st, &other, t, 250), CTXS_ENOTFOUND);
    uint8_t unknown[16] = {0};
    cr_assert_eq(ctxs_prefix_find(&pm, st, unknown, t, 250), CTXS_ENOTFOUND);
    cr_assert_eq(ctxs_prefix_find(NULL, st, m.model_hash, t, 250), CTXS_EINVAL);
    cr_assert_eq(ctxs_prefix_find(&pm, st, m.model_hash, NULL, 250), CTXS_EINVAL);
    cr_assert_eq(find(&pm, st, &m, t, 250), 0);
    cr_assert_eq(pm.n_tokens, 250);
    /* The same tokens under the other model are another session's. */
    ctxs_session_close(mk(st, "other", &other, 512, 4, 130));
    cr_assert_eq(find(&pm, st, &other, t, 250), 0);
    cr_assert_str_eq(pm.session, "other");
    cr_assert_eq(pm.n_tokens, 130);
    cr_assert_eq(find(&pm, st, &m, t, 250), 0);
    cr_assert_str_eq(pm.session, "held");
    free(t);
    ctxs_store_close(st);
}

Test(index, prefix_find_picks_the_longest_of_several_sessions)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    /* Sessions sharing the first chunk, then going their own ways. */
    const uint32_t lens[] = {70, 300, 140, 200};
    for (int i = 0; i < 4; i++) {
        char name[16];
        snprintf(name, sizeof(name), "s%d", i);
        ctxs_session_close(mk(st, name, &m, 512, 4, lens[i]));
    }
    uint32_t *t = prompt(260, 260, 0);
    ctxs_prefix_match pm;
    cr_assert_eq(find(&pm, st, &m, t, 260), 0);
    cr_assert_str_eq(pm.session, "s1");
    cr_assert_eq(pm.n_tokens, 260);
    cr_assert_eq(find(&pm, st, &m, t, 180), 0);
    cr_assert_eq(pm.n_tokens, 180);
    cr_assert(strcmp(pm.session, "s1") == 0 || strcmp(pm.session, "s3") == 0);
    cr_assert_eq(ctxs_store_session_delete(st, "s1"), 0);
    cr_assert_eq(find(&pm, st, &m, t, 260), 0);
    cr_assert_str_eq(pm.session, "s3");
    cr_assert_eq(pm.n_tokens, 200);
    free(t);
    ctxs_store_close(st);
}

Test(index, prefix_find_after_a_rollback_never_returns_the_old_longer_prefix)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session *s = mk(st, "s", &m, 512, 4, 250);
    ctxs_session_close(s);
    uint32_t *old = prompt(250, 250, 0), *fresh = prompt(250, 100, 1);
    ctxs_prefix_match pm;
    cr_assert_eq(find(&pm, st, &m, old, 250), 0);
    cr_assert_eq(pm.n_tokens, 250);

    s = op(st, "s", &m, 0);
    cr_assert_eq(ctxs_session_rollback(s, 100), 0);
    /* Rolled back, nothing new yet: at most what the file holds. */
    cr_assert_eq(find(&pm, st, &m, old, 250), 0);
    cr_assert_eq(pm.n_tokens, 100, "after rollback to 100: %llu", (unsigned long long)pm.n_tokens);
    /* Other tokens after 100, as many as before (the same chunk count). */
    append_gen(s, 150, 1);
    uint64_t same = 100;
    while (same < 250 && fresh[same] == old[same])
        same++;
    cr_assert_eq(find(&pm, st, &m, old, 250), 0);
    cr_assert_eq(pm.n_tokens, same, "old prompt: %llu", (unsigned long long)pm.n_tokens);
    cr_assert_eq(find(&pm, st, &m, fresh, 250), 0);
    cr_assert_eq(pm.n_tokens, 250);
    ctxs_session_close(s);
    cr_assert_eq(find(&pm, st, &m, old, 250), 0);
    cr_assert_eq(pm.n_tokens, same);

    /* Below the first chunk, then other tokens. */
    s = op(st, "s", &m, 0);
    cr_assert_eq(ctxs_session_rollback(s, 30), 0);
    cr_assert_eq(find(&pm, st, &m, old, 250), CTXS_ENOTFOUND);
    cr_assert_eq(find(&pm, st, &m, fresh, 250), CTXS_ENOTFOUND);
    append_gen(s, 220, 2);
    cr_assert_eq(find(&pm, st, &m, old, 250), CTXS_ENOTFOUND);
    cr_assert_eq(find(&pm, st, &m, fresh, 250), CTXS_ENOTFOUND);
    ctxs_session_close(s);
    cr_assert_eq(find(&pm, st, &m, old, 250), CTXS_ENOTFOUND);
    uint32_t *now = prompt(250, 30, 2);
    cr_assert_eq(find(&pm, st, &m, now, 250), 0);
    cr_assert_eq(pm.n_tokens, 250);
    free(now);
    free(old);
    free(fresh);
    ctxs_store_close(st);
}

Test(index, prefix_find_after_delete_never_returns_the_session)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session_close(mk(st, "s", &m, 512, 4, 250));
    uint32_t *t = prompt(250, 250, 0);
    ctxs_prefix_match pm;
    cr_assert_eq(find(&pm, st, &m, t, 250), 0);
    cr_assert_eq(ctxs_store_session_delete(st, "s"), 0);
    cr_assert_eq(find(&pm, st, &m, t, 250), CTXS_ENOTFOUND);
    /* A new session under the same name with other tokens: not a match. */
    ctxs_session *s = mk(st, "s", &m, 512, 4, 0);
    append_gen(s, 250, 5);
    ctxs_session_close(s);
    cr_assert_eq(find(&pm, st, &m, t, 250), CTXS_ENOTFOUND);
    free(t);
    ctxs_store_close(st);
}

Test(index, prefix_find_after_the_ring_wraps_returns_only_what_is_held)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    uint32_t *t = prompt(400, 400, 0);
    ctxs_prefix_match pm;

    /* 4 sinks: once the ring wraps, no whole chunk from position 0 is held. */
    ctxs_session *s = mk(st, "small", &m, 256, 4, 200);
    cr_assert_eq(find(&pm, st, &m, t, 400), 0);
    cr_assert_eq(pm.n_tokens, 200);
    cr_assert_eq(ts_append(s, 50), 0);
    cr_assert_eq(ts_append(s, 50), 0); /* 300 > 256: wrapped */
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert(info.flags & CTXS_INFO_WRAPPED);
    cr_assert_eq(find(&pm, st, &m, t, 400), CTXS_ENOTFOUND, "wrapped, open: found %llu in %s",
                 (unsigned long long)pm.n_tokens, pm.session);
    ctxs_session_close(s);
    cr_assert_eq(find(&pm, st, &m, t, 400), CTXS_ENOTFOUND, "wrapped, closed: found %llu",
                 (unsigned long long)pm.n_tokens);

    /* 130 sinks: two whole chunks and two tokens stay held. */
    s = mk(st, "sinks", &m, 256, 130, 250);
    cr_assert_eq(find(&pm, st, &m, t, 400), 0);
    cr_assert_eq(pm.n_tokens, 250);
    cr_assert_eq(ts_append(s, 50), 0); /* 300: wrapped */
    cr_assert_eq(find(&pm, st, &m, t, 400), 0);
    cr_assert_str_eq(pm.session, "sinks");
    cr_assert_eq(pm.n_tokens, 130, "wrapped with 130 sinks: %llu", (unsigned long long)pm.n_tokens);
    ctxs_session_close(s);
    cr_assert_eq(find(&pm, st, &m, t, 400), 0);
    cr_assert_eq(pm.n_tokens, 130);
    /* The match can be forked: one token short of it, and all of it (the
     * header: "Fork the match (ctxs_store_session_fork() at out->n_tokens)"). */
    ctxs_session *f;
    int rc = ctxs_store_session_fork(&f, st, "sinks", "f-1", pm.n_tokens - 1, NULL);
    cr_assert_eq(rc, 0, "fork inside the sinks: %s", ctxs_err_name(rc));
    cr_assert_eq(ts_check_all(f), 0);
    ctxs_session_close(f);
    rc = ctxs_store_session_fork(&f, st, "sinks", "f", pm.n_tokens, NULL);
    cr_assert_eq(rc, 0, "fork of the held prefix: %s", ctxs_err_name(rc));
    cr_assert_eq(ts_n_tokens(f), 130);
    cr_assert_eq(ts_check_all(f), 0);
    ctxs_session_close(f);
    free(t);
    ctxs_store_close(st);
}

Test(index, prefix_entries_are_written_at_the_first_chunk_while_the_writer_has_it_open)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    uint32_t *t = prompt(2000, 2000, 0);
    ctxs_prefix_match pm;
    ctxs_session *s = mk(st, "w", &m, 2048, 4, 63);
    cr_assert_eq(find(&pm, st, &m, t, 2000), CTXS_ENOTFOUND);
    cr_assert_eq(ts_append(s, 1), 0); /* 64: the first chunk */
    cr_assert_eq(find(&pm, st, &m, t, 2000), 0, "the first chunk must be findable at once");
    cr_assert_str_eq(pm.session, "w");
    cr_assert_eq(pm.n_tokens, 64);
    /* Later chunks are indexed in batches; a find still sees every held
     * token after the indexed chunks. */
    for (int i = 0; i < 20; i++) {
        cr_assert_eq(ts_append(s, 50), 0);
        cr_assert_eq(find(&pm, st, &m, t, 2000), 0);
        cr_assert_eq(pm.n_tokens, 64 + 50 * (i + 1));
    }
    /* A prompt that leaves the session after 1000 tokens, open and closed. */
    uint32_t *late = prompt(2000, 1000, 3);
    cr_assert_eq(find(&pm, st, &m, late, 2000), 0);
    cr_assert_eq(pm.n_tokens, 1000);
    ctxs_session_close(s);
    cr_assert_eq(find(&pm, st, &m, late, 2000), 0);
    cr_assert_eq(pm.n_tokens, 1000);
    free(late);
    free(t);
    ctxs_store_close(st);
}

/* The writer's side of the power-loss test below, in a child booted as
 * "before": a session of 64 synced tokens and 6 more that are not, at
 * ASYNC, closed; what the index learned of it is written at once. */
static void power_loss_writer(void)
{
    setenv("CTXS_TEST_BOOT", "before", 1);
    ctxs_store *st;
    ctxs_model m = ts_model(1);
    ctxs_create_options o = ts_options(256, 4, 0, CTXS_SYNC_ASYNC);
    ctxs_session *s;
    if (ctxs_store_open(&st, ts_store_dir(), CTXS_STORE_CREATE, NULL) != 0 ||
        ctxs_model_register(st, &m, NULL) != 0 ||
        ctxs_store_session_create(&s, st, "chat", &m, &o) != 0)
        _exit(2);
    if (ts_append(s, 64) != 0 || ctxs_session_sync(s) != 0 || ts_append(s, 6) != 0)
        _exit(3);
    ctxs_session_close(s);
    ctxs_store_close(st);
    _exit(0);
}

/* The reader's side, booted as "after": exits with the match's token count
 * (255: no match), or 254 when a fork at the match fails. */
static void power_loss_reader(void)
{
    setenv("CTXS_TEST_BOOT", "after", 1);
    ctxs_store *st;
    ctxs_model m = ts_model(1);
    uint32_t t[70];
    for (uint32_t p = 0; p < 70; p++)
        t[p] = ts_token(p);
    ctxs_prefix_match pm;
    if (ctxs_store_open(&st, ts_store_dir(), 0, NULL) != 0)
        _exit(253);
    if (ctxs_prefix_find(&pm, st, m.model_hash, t, 70) != 0)
        _exit(255);
    ctxs_session *f;
    if (ctxs_store_session_fork(&f, st, pm.session, "fork", pm.n_tokens, NULL) != 0)
        _exit(254);
    ctxs_session_close(f);
    ctxs_store_close(st);
    _exit((int)pm.n_tokens);
}

static int run_child(void (*fn)(void))
{
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0)
        fn();
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status), "child status %d", status);
    return WEXITSTATUS(status);
}

Test(index, a_prefix_match_after_a_power_loss_counts_only_what_an_open_keeps)
{
    cr_assert_eq(run_child(power_loss_writer), 0);
    /* The power loss: the record claiming 70 tokens reached the disk, the
     * KV of the last 6 did not. */
    ctxs_model m = ts_model(1);
    ctxs__file_layout lay;
    cr_assert_eq(ctxs__layout_compute(&lay, &m.geometry, 256, 4, 0), 0);
    int fd = open(ts_id_path(1), O_RDWR);
    cr_assert_geq(fd, 0);
    uint8_t zeros[64] = {0};
    uint32_t runs = 2 * m.geometry.n_layers * m.geometry.n_kv_heads;
    for (uint32_t r = 0; r < runs; r++)
        for (uint64_t p = 64; p < 70; p++)
            cr_assert_eq(pwrite(fd, zeros, lay.slot_bytes,
                                (off_t)(lay.kv_off + r * lay.head_stride + p * lay.slot_bytes)),
                         (ssize_t)lay.slot_bytes);
    close(fd);
    /* The match stops where the session recovers, and forks. */
    int got = run_child(power_loss_reader);
    cr_assert_neq(got, 254, "the fork at the match failed");
    cr_assert_eq(got, 64, "the match counts %d tokens; an open keeps 64", got);
}

/* --- gc ---------------------------------------------------------------------- */

Test(index, gc_deletes_least_recently_used_first_and_never_an_open_session)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    /* Closed in order s0..s4; then s0 used again: s1 s2 s3 s4 s0. */
    ctxs_session *s[5];
    char names[5][8];
    for (int i = 0; i < 5; i++) {
        snprintf(names[i], sizeof(names[i]), "s%d", i);
        s[i] = mk(st, names[i], &m, 256, 4, (uint32_t)(100 + 20 * i));
    }
    for (int i = 0; i < 5; i++) {
        ts_sleep_us(3000);
        ctxs_session_close(s[i]);
    }
    ts_sleep_us(3000);
    ctxs_session_close(op(st, "s0", &m, 0));
    uint64_t bytes[5], total = 0, id[5];
    for (int i = 0; i < 5; i++) {
        ctxs_session_entry e = ts_session_entry(st, names[i]);
        id[i] = e.id;
        bytes[i] = file_bytes(ts_id_path(e.id));
        total += bytes[i];
    }
    for (int i = 1; i < 4; i++)
        cr_assert_lt(ts_session_entry(st, names[i]).last_used_unix_ms,
                     ts_session_entry(st, names[i + 1]).last_used_unix_ms);
    cr_assert_lt(ts_session_entry(st, "s4").last_used_unix_ms,
                 ts_session_entry(st, "s0").last_used_unix_ms);

    /* s1 open by a writer, s2 by a reader: gc passes them over. */
    ctxs_session *w = op(st, "s1", &m, 0), *r = op(st, "s2", NULL, CTXS_RDONLY);
    ctxs_store_gc_result g;
    cr_assert_eq(ctxs_store_gc(&g, st, total - bytes[3], 0), 0);
    cr_assert_eq(g.bytes_before, total);
    cr_assert_eq(g.deleted, 1);
    cr_assert_eq(g.skipped_open, 2);
    cr_assert_eq(g.bytes_after, total - bytes[3]);
    cr_assert_eq(g.n_sessions, 1);
    cr_assert_str_eq(g.sessions[0].name, "s3");
    ctxs_free(g.sessions);
    cr_assert(!ts_exists(ts_id_path(id[3])), "s3 was the least recently used closed session");
    for (int i = 0; i < 5; i++)
        if (i != 3)
            cr_assert(ts_exists(ts_id_path(id[i])), "%s must stay", names[i]);
    ctxs_session_entry e;
    cr_assert_eq(ctxs_store_session_get(&e, st, "s3"), CTXS_ENOTFOUND);

    /* Within budget: nothing happens. */
    cr_assert_eq(ctxs_store_gc(&g, st, total, 0), 0);
    cr_assert_eq(g.deleted, 0);
    cr_assert_eq(g.bytes_before, total - bytes[3]);
    cr_assert_eq(g.bytes_after, g.bytes_before);

    /* Budget 0: everything that is not open goes, s4 before s0. */
    cr_assert_eq(ctxs_store_gc(&g, st, 0, 0), 0);
    cr_assert_eq(g.deleted, 2);
    cr_assert_eq(g.skipped_open, 2);
    cr_assert_eq(g.bytes_before, total - bytes[3]);
    cr_assert_eq(g.bytes_after, bytes[1] + bytes[2]);
    cr_assert_eq(g.n_sessions, 2);
    cr_assert_str_eq(g.sessions[0].name, "s4");
    cr_assert_str_eq(g.sessions[1].name, "s0");
    ctxs_free(g.sessions);
    cr_assert(!ts_exists(ts_id_path(id[4])) && !ts_exists(ts_id_path(id[0])));
    cr_assert(ts_exists(ts_id_path(id[1])) && ts_exists(ts_id_path(id[2])));
    cr_assert_eq(ts_check_all(w), 0);
    cr_assert_eq(ts_append(w, 1), 0);
    ctxs_session_close(w);
    ctxs_session_close(r);
    cr_assert_eq(ctxs_store_gc(NULL, st, 0, 0), 0);
    cr_assert_eq(count_entries(st), 0);
    ctxs_store_close(st);
}

Test(index, gc_stops_at_the_budget_in_last_use_order)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    /* Created in one order, last used in another. */
    const int order[4] = {2, 0, 3, 1};
    ctxs_session *s[4];
    char names[4][8];
    for (int i = 0; i < 4; i++) {
        snprintf(names[i], sizeof(names[i]), "n%d", i);
        s[i] = mk(st, names[i], &m, 256, 4, 60);
    }
    for (int i = 0; i < 4; i++) {
        ts_sleep_us(3000);
        ctxs_session_close(s[order[i]]);
    }
    uint64_t b[4], total = 0;
    for (int i = 0; i < 4; i++)
        total += b[i] = file_bytes(ts_id_path(ts_session_entry(st, names[i]).id));
    ctxs_store_gc_result g;
    /* Room for two: the two used first go (n2, then n0). */
    cr_assert_eq(ctxs_store_gc(&g, st, b[3] + b[1], 0), 0);
    cr_assert_eq(g.deleted, 2);
    cr_assert_eq(g.skipped_open, 0);
    cr_assert_eq(g.bytes_before, total);
    cr_assert_eq(g.bytes_after, b[3] + b[1]);
    cr_assert_eq(g.n_sessions, 2);
    cr_assert_str_eq(g.sessions[0].name, "n2");
    cr_assert_str_eq(g.sessions[1].name, "n0");
    ctxs_free(g.sessions);
    ctxs_session_entry e;
    cr_assert_eq(ctxs_store_session_get(&e, st, "n2"), CTXS_ENOTFOUND);
    cr_assert_eq(ctxs_store_session_get(&e, st, "n0"), CTXS_ENOTFOUND);
    cr_assert_eq(ctxs_store_session_get(&e, st, "n3"), 0);
    cr_assert_eq(ctxs_store_session_get(&e, st, "n1"), 0);
    ctxs_store_close(st);
}

/* --- repair ------------------------------------------------------------------ */

Test(index, repair_adopts_strays_removes_leftovers_and_keeps_everything_else)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session_close(mk(st, "kept", &m, 256, 4, 70));
    ctxs_session_close(mk(st, "lost", &m, 256, 4, 70));
    ctxs_session *open_one = mk(st, "busy", &m, 256, 4, 10);
    uint64_t kept = ts_session_entry(st, "kept").id, lost = ts_session_entry(st, "lost").id;

    /* A session file no entry names (copied in by hand, no label). */
    ctxs_session *stray;
    ctxs_create_options o = ts_options(256, 4, 1, CTXS_SYNC_NONE);
    char stray_path[1100], stray_open_path[1100], junk_path[1100];
    snprintf(stray_path, sizeof(stray_path), "%s", ts_id_path(0x7f00));
    snprintf(stray_open_path, sizeof(stray_open_path), "%s", ts_id_path(0x7f01));
    snprintf(junk_path, sizeof(junk_path), "%s", ts_id_path(0x7f04));
    cr_assert_eq(ctxs_session_create(&stray, stray_path, &m, &o), 0);
    cr_assert_eq(ts_append(stray, 130), 0);
    ctxs_session_close(stray);
    /* A stray that someone has open is left for later. */
    cr_assert_eq(ctxs_session_create(&stray, stray_open_path, &m, &o), 0);
    /* Named like a session, but not one. */
    cr_assert_eq(ts_write_file(junk_path, "not a session", 13), 0);
    /* Leftovers of interrupted creates, by a process that is gone. */
    pid_t gone = fork();
    cr_assert_geq(gone, 0);
    if (gone == 0)
        _exit(0);
    cr_assert_eq(waitpid(gone, NULL, 0), gone);
    char tmp[1200], tmp2[1200], live[1200];
    snprintf(tmp, sizeof(tmp), "%s.tmp-%ld-0", ts_id_path(0x7f02), (long)gone);
    snprintf(tmp2, sizeof(tmp2), "%s.tmp-%ld-7", ts_id_path(kept), (long)gone);
    cr_assert_eq(ts_write_file(tmp, "half", 4), 0);
    cr_assert_eq(ts_write_file(tmp2, "half", 4), 0);
    /* One by a process that lives (the test runner): its create may be
     * under way, even before it locks the file. */
    snprintf(live, sizeof(live), "%s.tmp-%ld-3", ts_id_path(0x7f05), (long)getppid());
    cr_assert_eq(ts_write_file(live, "half", 4), 0);
    /* What is not ours. */
    char notes[1100], upper[1100], short_id[1100], sub[1100];
    snprintf(notes, sizeof(notes), "%s/sessions/notes.txt", ts_store_dir());
    snprintf(upper, sizeof(upper), "%s/sessions/00000000000000AA.ctxs", ts_store_dir());
    snprintf(short_id, sizeof(short_id), "%s/sessions/abc.ctxs", ts_store_dir());
    snprintf(sub, sizeof(sub), "%s/sessions/subdir", ts_store_dir());
    cr_assert_eq(ts_write_file(notes, "mine", 4), 0);
    cr_assert_eq(ts_write_file(upper, "mine", 4), 0);
    cr_assert_eq(ts_write_file(short_id, "mine", 4), 0);
    cr_assert_eq(mkdir(sub, 0700), 0);
    /* An entry whose file was deleted by hand. */
    cr_assert_eq(unlink(ts_id_path(lost)), 0);

    ctxs_store_repair_result rr;
    cr_assert_eq(ctxs_store_repair(&rr, st), 0);
    cr_assert_eq(rr.files_adopted, 1, "adopted %llu", (unsigned long long)rr.files_adopted);
    cr_assert_eq(rr.files_removed, 2, "2 tmp: %llu", (unsigned long long)rr.files_removed);
    cr_assert_eq(rr.entries_removed, 1);
    cr_assert(ts_exists(stray_path), "repair never deletes a session file");
    cr_assert(ts_exists(stray_open_path), "a stray with an open handle must stay");
    cr_assert(!ts_exists(tmp) && !ts_exists(tmp2));
    cr_assert(ts_exists(live), "the file of a live process's create must stay");
    cr_assert(ts_exists(notes) && ts_exists(upper) && ts_exists(short_id) && ts_exists(sub) &&
              ts_exists(junk_path));
    cr_assert(ts_exists(ts_id_path(kept)));
    ctxs_session_entry e;
    cr_assert_eq(ctxs_store_session_get(&e, st, "lost"), CTXS_ENOTFOUND);
    cr_assert_eq(ts_session_entry(st, "kept").n_tokens, 70);
    cr_assert(ts_exists(ts_id_path(ts_session_entry(st, "busy").id)));
    /* The stray has no label: it is indexed as session-<id>, with its
     * tokens and prefixes. */
    e = ts_session_entry(st, "session-0000000000007f00");
    cr_assert_eq(e.id, 0x7f00);
    cr_assert_eq(e.n_tokens, 130);
    cr_assert_eq(memcmp(e.model_hash, m.model_hash, 16), 0);
    uint32_t *t = prompt(200, 200, 0);
    ctxs_prefix_match pm;
    cr_assert_eq(find(&pm, st, &m, t, 200), 0);
    cr_assert_str_eq(pm.session, "session-0000000000007f00");
    cr_assert_eq(pm.n_tokens, 130);
    free(t);
    ctxs_session *s = op(st, "session-0000000000007f00", &m, 0);
    cr_assert_eq(ts_check_all(s), 0);
    ctxs_session_close(s);
    s = op(st, "kept", &m, 0);
    cr_assert_eq(ts_check_all(s), 0);
    ctxs_session_close(s);
    /* Once closed, the second stray is adopted too; a third repair finds
     * nothing to do. */
    ctxs_session_close(stray);
    cr_assert_eq(ctxs_store_repair(&rr, st), 0);
    cr_assert_eq(rr.files_adopted, 1);
    cr_assert_eq(rr.files_removed + rr.entries_removed, 0);
    cr_assert_eq(ts_session_entry(st, "session-0000000000007f01").id, 0x7f01);
    cr_assert_eq(ctxs_store_repair(&rr, st), 0);
    cr_assert_eq(rr.files_adopted + rr.files_removed + rr.entries_removed, 0);
    cr_assert_eq(count_entries(st), 4);
    cr_assert(ts_exists(junk_path));
    /* New sessions do not take the adopted ids. */
    ctxs_session_close(mk(st, "new", &m, 256, 4, 1));
    cr_assert_gt(ts_session_entry(st, "new").id, 0x7f01);
    ctxs_session_close(open_one);
    ctxs_store_close(st);
}

Test(index, create_is_not_refused_by_a_stray_file_at_the_next_id)
{
    /* A session file put into sessions/ by hand (or one repair could not
     * adopt because it was open) under the id the store would hand out
     * next: creating an unrelated, free name must still work (-EEXIST
     * means "the name is taken"), and the stray must stay as it was. */
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session_close(mk(st, "first", &m, 256, 4, 1));
    uint64_t first = ts_session_entry(st, "first").id;
    ctxs_session *stray;
    ctxs_create_options o = ts_options(256, 4, 1, CTXS_SYNC_NONE);
    char stray_path[1100];
    snprintf(stray_path, sizeof(stray_path), "%s", ts_id_path(first + 1));
    cr_assert_eq(ctxs_session_create(&stray, stray_path, &m, &o), 0);
    cr_assert_eq(ts_append(stray, 9), 0);
    ctxs_session_close(stray);
    ctxs_session *s = NULL;
    int rc = ctxs_store_session_create(&s, st, "second", &m, &o);
    cr_assert_eq(rc, 0, "create of a free name beside a stray file: %s", ctxs_err_name(rc));
    cr_assert_neq(ts_session_entry(st, "second").id, first + 1);
    ctxs_session_close(s);
    rc = ctxs_store_session_fork(NULL, st, "first", "third", 1, NULL);
    cr_assert_eq(rc, 0, "fork to a free name beside a stray file: %s", ctxs_err_name(rc));
    cr_assert(ts_exists(stray_path));
    cr_assert_eq(ctxs_session_open(&stray, stray_path, &m, CTXS_RDONLY, NULL), 0);
    cr_assert_eq(ts_n_tokens(stray), 9, "the stray was touched");
    ctxs_session_close(stray);
    ctxs_store_close(st);
}

Test(index, repair_drops_every_entry_of_a_session_whose_file_is_gone)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session *s = mk(st, "lost", &m, 256, 4, 200);
    cr_assert_eq(ctxs_checkpoint_create(s, "cp"), 0);
    ctxs_session_close(s);
    uint64_t id = ts_session_entry(st, "lost").id;
    cr_assert_eq(unlink(ts_id_path(id)), 0);
    ctxs_store_repair_result rr;
    cr_assert_eq(ctxs_store_repair(&rr, st), 0);
    cr_assert_eq(rr.entries_removed, 1);
    cr_assert_eq(count_entries(st), 0);
    /* Its prefixes and checkpoints went with it. */
    MDB_txn *txn;
    cr_assert_eq(mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn), 0);
    MDB_stat ms;
    cr_assert_eq(mdb_stat(txn, st->prefixes, &ms), 0);
    cr_assert_eq(ms.ms_entries, 0, "prefix entries left: %zu", ms.ms_entries);
    cr_assert_eq(mdb_stat(txn, st->chunks, &ms), 0);
    cr_assert_eq(ms.ms_entries, 0, "chunk entries left: %zu", ms.ms_entries);
    cr_assert_eq(mdb_stat(txn, st->checkpoints, &ms), 0);
    cr_assert_eq(ms.ms_entries, 0, "checkpoints left: %zu", ms.ms_entries);
    cr_assert_eq(mdb_stat(txn, st->ids, &ms), 0);
    cr_assert_eq(ms.ms_entries, 0);
    mdb_txn_abort(txn);
    /* The name is free. */
    ctxs_session_close(mk(st, "lost", &m, 256, 4, 1));
    ctxs_store_close(st);
}

/* --- Interrupted creates and deletes ---------------------------------------- */

/* pending[id] as index 1.0 wrote it: the one byte what. */
static void put_intent(ctxs_store *st, uint64_t id, char what)
{
    MDB_txn *txn;
    cr_assert_eq(mdb_txn_begin(st->env, NULL, 0, &txn), 0);
    uint8_t k[8];
    ctxs__id_key(k, id);
    MDB_val key = {8, k}, val = {1, &what};
    cr_assert_eq(mdb_put(txn, st->pending, &key, &val, 0), 0);
    cr_assert_eq(mdb_txn_commit(txn), 0);
}

/* pending[id] as index 1.1 writes it: what, then the creator's pid. */
static void put_intent_of(ctxs_store *st, uint64_t id, char what, pid_t pid)
{
    MDB_txn *txn;
    cr_assert_eq(mdb_txn_begin(st->env, NULL, 0, &txn), 0);
    uint8_t k[8];
    ctxs__id_key(k, id);
    uint32_t p = (uint32_t)pid;
    uint8_t v[5] = {(uint8_t)what, (uint8_t)p, (uint8_t)(p >> 8), (uint8_t)(p >> 16),
                    (uint8_t)(p >> 24)};
    MDB_val key = {8, k}, val = {5, v};
    cr_assert_eq(mdb_put(txn, st->pending, &key, &val, 0), 0);
    cr_assert_eq(mdb_txn_commit(txn), 0);
}

/* The pid of a process that has exited and been reaped. */
static pid_t gone_pid(void)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0)
        _exit(0);
    cr_assert_eq(waitpid(pid, NULL, 0), pid);
    return pid;
}

Test(index, store_open_removes_the_file_of_an_interrupted_create)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session_close(mk(st, "a", &m, 256, 4, 70));
    uint64_t a = ts_session_entry(st, "a").id;
    /* A create that died after its file was linked, before its entry. */
    const uint64_t dead = a + 1000;
    put_intent(st, dead, CTXS__INTENT_CREATE);
    ctxs_create_options o = ts_options(256, 4, 1, CTXS_SYNC_NONE);
    ctxs_session *s;
    cr_assert_eq(ctxs_session_create(&s, ts_id_path(dead), &m, &o), 0);
    ctxs_session_close(s);
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp-%ld-3", ts_id_path(dead), (long)gone_pid());
    cr_assert_eq(ts_write_file(tmp, "x", 1), 0);
    /* One that died before its file appeared. */
    put_intent(st, dead + 1, CTXS__INTENT_CREATE);
    /* And one that is still running: it holds its file's writer lock. */
    const uint64_t live = dead + 2;
    put_intent(st, live, CTXS__INTENT_CREATE);
    ctxs_session *running;
    cr_assert_eq(ctxs_session_create(&running, ts_id_path(live), &m, &o), 0);
    ctxs_store_close(st);

    st = ts_store_open(ts_store_dir());
    cr_assert(!ts_exists(ts_id_path(dead)), "the half-created file must go");
    cr_assert(!ts_exists(tmp), "the create's temporary file must go");
    cr_assert(ts_exists(ts_id_path(live)), "a create in progress must not lose its file");
    cr_assert(ts_exists(ts_id_path(a)));
    cr_assert_eq(ts_pending_intents(st), 1);
    cr_assert_eq(count_entries(st), 1);
    ctxs_store_close(st);

    ctxs_session_close(running);
    st = ts_store_open(ts_store_dir());
    cr_assert(!ts_exists(ts_id_path(live)));
    cr_assert_eq(ts_pending_intents(st), 0);
    /* Ids are not reused. */
    ctxs_session_close(mk(st, "b", &m, 256, 4, 1));
    cr_assert_gt(ts_session_entry(st, "b").id, a);
    ctxs_store_close(st);
}

/* The intent of a create of id by process creator, and the file it wrote
 * aside under a temporary name, whose path goes to tmp. */
static void create_left_aside(ctxs_store *st, uint64_t id, pid_t creator, char *tmp, size_t size)
{
    put_intent_of(st, id, CTXS__INTENT_CREATE, creator);
    snprintf(tmp, size, "%s.tmp-%ld-0", ts_id_path(id), (long)creator);
    cr_assert_eq(ts_write_file(tmp, "x", 1), 0);
}

Test(index, store_open_leaves_the_intent_of_a_live_creator)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session_close(mk(st, "a", &m, 256, 4, 10));
    uint64_t a = ts_session_entry(st, "a").id;
    /* A create whose intent is committed and whose file does not exist
     * yet, by a process that lives (the test runner): what a store open
     * elsewhere sees between the two. */
    const uint64_t live = a + 100, dead = a + 101;
    put_intent_of(st, live, CTXS__INTENT_CREATE, getppid());
    /* One by a process that is gone, which left its file aside. */
    char dead_tmp[4096];
    create_left_aside(st, dead, gone_pid(), dead_tmp, sizeof(dead_tmp));
    ctxs_store_close(st);

    st = ts_store_open(ts_store_dir());
    cr_assert_eq(ts_pending_intents(st), 1, "only the gone creator's intent is resolved");
    cr_assert(!ts_exists(dead_tmp), "a gone creator's file must go");
    cr_assert_eq(count_entries(st), 1);
    ctxs_store_close(st);
}

/* A child that has exited and is not yet reaped: a zombie. */
static pid_t zombie_pid(void)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0)
        _exit(0);
    siginfo_t info;
    cr_assert_eq(waitid(P_PID, (id_t)pid, &info, WEXITED | WNOWAIT), 0); /* reaps nothing */
    return pid;
}

Test(index, store_open_resolves_the_intent_of_a_creator_that_exited_unreaped)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session_close(mk(st, "a", &m, 256, 4, 10));
    const uint64_t id = ts_session_entry(st, "a").id + 100;
    pid_t zombie = zombie_pid();
    char tmp[4096];
    create_left_aside(st, id, zombie, tmp, sizeof(tmp));
    ctxs_store_close(st);

    st = ts_store_open(ts_store_dir());
    int pending = ts_pending_intents(st);
    ctxs_store_close(st);
    cr_assert_eq(waitpid(zombie, NULL, 0), zombie);
    cr_assert_eq(pending, 0, "the intent of a creator that exited waits for its reaping");
    cr_assert(!ts_exists(tmp), "the file of a creator that exited must go");
}

Test(index, store_open_finishes_an_interrupted_delete)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session *s = mk(st, "d", &m, 256, 4, 130);
    cr_assert_eq(ctxs_checkpoint_create(s, "cp"), 0);
    ctxs_session_close(s);
    ctxs_session_close(mk(st, "keep", &m, 256, 4, 10));
    uint64_t id = ts_session_entry(st, "d").id;
    /* A delete that died after its transaction, before the unlink. */
    MDB_txn *txn;
    cr_assert_eq(mdb_txn_begin(st->env, NULL, 0, &txn), 0);
    cr_assert_eq(ctxs__session_unindex(txn, st, id), 0);
    cr_assert_eq(mdb_txn_commit(txn), 0);
    put_intent(st, id, CTXS__INTENT_DELETE);
    ctxs_store_close(st);
    cr_assert(ts_exists(ts_id_path(id)));

    st = ts_store_open(ts_store_dir());
    cr_assert(!ts_exists(ts_id_path(id)), "the deleted session's file must go");
    cr_assert_eq(ts_pending_intents(st), 0);
    cr_assert_eq(count_entries(st), 1);
    uint32_t *t = prompt(130, 130, 0);
    ctxs_prefix_match pm;
    cr_assert_eq(find(&pm, st, &m, t, 130), CTXS_ENOTFOUND);
    free(t);
    /* One that died after the unlink: only the intent is left. */
    put_intent(st, id + 50, CTXS__INTENT_DELETE);
    ctxs_store_close(st);
    st = ts_store_open(ts_store_dir());
    cr_assert_eq(ts_pending_intents(st), 0);
    ctxs_session *k = op(st, "keep", &m, 0);
    cr_assert_eq(ts_check_all(k), 0);
    ctxs_session_close(k);
    ctxs_store_close(st);
}

/* Whether the call the fault hook failed last is the sync of sessions/
 * that an unlink in sessions.c needs before an intent may go. */
static int failed_the_directory_sync(void)
{
    const struct ctxs__fault_site *f = ctxs__fault_last_failed();
    return f && strcmp(f->call, "fsync") == 0 && strstr(f->file, "index/sessions.c");
}

/* A delete's intent goes only once its unlink is durable. An unlink is a
 * change to sessions/ that a power loss undoes until the directory is
 * synced, and the index's own syncs do not cover it: without the sync, a
 * deleted session's file comes back with neither an entry nor an intent
 * (and a repair adopts it). So where that sync fails, the intent stays
 * for the next open of the store to finish, for a delete and for the
 * open's own resolution of a delete that died. */
Test(index, an_intent_stays_until_the_unlink_it_stands_for_is_durable)
{
    ctxs_model m = ts_model(1);
    int found_delete = 0, found_resolve = 0;
    for (uint64_t nth = 1; nth < 200 && !(found_delete && found_resolve); nth++) {
        ctxs_store *st = ts_store_open(ts_store_dir());
        model_reg(st, &m);
        ctxs_session_close(mk(st, "d", &m, 256, 4, 10));
        uint64_t id = ts_session_entry(st, "d").id;
        if (!found_delete) {
            ctxs__fault_arm(nth, EIO, false);
            ctxs_store_session_delete(st, "d");
            ctxs__fault_disarm();
            if (failed_the_directory_sync()) {
                found_delete = 1;
                cr_assert(!ts_exists(ts_id_path(id)), "the delete unlinked the file");
                cr_assert_eq(ts_pending_intents(st), 1,
                             "the delete's intent must stay while its unlink is not durable");
            }
            ctxs_store_close(st);
        } else {
            /* A delete that died after its transaction, before the unlink:
             * the next open finishes it. */
            MDB_txn *txn;
            cr_assert_eq(mdb_txn_begin(st->env, NULL, 0, &txn), 0);
            cr_assert_eq(ctxs__session_unindex(txn, st, id), 0);
            cr_assert_eq(mdb_txn_commit(txn), 0);
            put_intent(st, id, CTXS__INTENT_DELETE);
            ctxs_store_close(st);
            ctxs__fault_arm(nth, EIO, false);
            int rc = ctxs_store_open(&st, ts_store_dir(), 0, NULL);
            ctxs__fault_disarm();
            if (rc == 0)
                ctxs_store_close(st);
            if (failed_the_directory_sync()) {
                found_resolve = 1;
                cr_assert(!ts_exists(ts_id_path(id)), "the open unlinked the file");
                cr_assert_eq(ctxs_store_open(&st, ts_store_dir(), CTXS_RDONLY, NULL), 0);
                cr_assert_eq(ts_pending_intents(st), 1,
                             "the intent must stay while the unlink is not durable");
                ctxs_store_close(st);
                st = ts_store_open(ts_store_dir());
                cr_assert_eq(ts_pending_intents(st), 0, "the next open finishes it");
                cr_assert_eq(count_entries(st), 0);
                ctxs_store_close(st);
            }
        }
        ts_rmtree(ts_store_dir());
    }
    cr_assert(found_delete, "a delete never synced sessions/ between its unlink and its intent's drop");
    cr_assert(found_resolve, "a store open never synced sessions/ before dropping a delete's intent");
}

/* --- reindex ------------------------------------------------------------------ */

Test(index, reindex_after_the_index_is_deleted_restores_sessions_from_their_files)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_model m1 = ts_model(1), m2 = ts_model(2);
    cr_assert_eq(ctxs_model_register(st, &m1, "one"), 0);
    model_reg(st, &m2);
    ctxs_session_close(mk(st, "alpha", &m1, 512, 4, 200));
    ctxs_session_close(mk(st, "beta", &m2, 256, 4, 70));
    ctxs_session_close(mk(st, "gamma", &m1, 256, 4, 30));
    cr_assert_eq(ctxs_store_session_rename(st, "gamma", "delta"), 0);
    cr_assert_eq(ctxs_store_session_fork(NULL, st, "alpha", "fork", 150, NULL), 0);
    ctxs_session_entry before[4];
    const char *names[4] = {"alpha", "beta", "delta", "fork"};
    const uint64_t tokens[4] = {200, 70, 30, 150};
    for (int i = 0; i < 4; i++)
        before[i] = ts_session_entry(st, names[i]);
    ctxs_store_close(st);

    ts_rmtree(ts_path(ts_store_dir(), "index"));
    /* The open sees a new index beside session files and rebuilds it. */
    st = ts_store_open(ts_store_dir());
    cr_assert_eq(count_entries(st), 4, "a lost index is rebuilt at open");
    ctxs_store_close(st);
    /* And an explicit reindex does the same. */
    ts_rmtree(ts_path(ts_store_dir(), "index"));
    st = ts_store_open(ts_store_dir());
    ctxs_store_reindex_result rr;
    int rc = ctxs_store_reindex(&rr, st);
    cr_assert_eq(rc, 0, "reindex: %s", ctxs_err_name(rc));
    cr_assert_eq(rr.sessions, 4);
    cr_assert_eq(rr.skipped, 0);
    cr_assert_eq(count_entries(st), 4);
    for (int i = 0; i < 4; i++) {
        ctxs_session_entry e;
        rc = ctxs_store_session_get(&e, st, names[i]);
        cr_assert_eq(rc, 0, "%s not back after reindex: %s", names[i], ctxs_err_name(rc));
        cr_assert_eq(e.id, before[i].id);
        cr_assert_eq(e.n_tokens, tokens[i], "%s: %llu tokens", names[i], (unsigned long long)e.n_tokens);
        cr_assert_eq(memcmp(e.model_hash, before[i].model_hash, 16), 0);
        cr_assert_eq(e.created_unix_ms, before[i].created_unix_ms);
        cr_assert_gt(e.disk_bytes, 0);
    }
    ctxs_session_entry e;
    cr_assert_eq(ctxs_store_session_get(&e, st, "gamma"), CTXS_ENOTFOUND,
                 "a renamed session comes back under its new name");
    /* Models are known again. */
    ctxs_model_entry me;
    cr_assert_eq(ctxs_model_get(&me, st, m1.model_hash), 0);
    cr_assert_eq(memcmp(&me.model, &m1, sizeof(m1)), 0);
    cr_assert_eq(ctxs_model_get(&me, st, m2.model_hash), 0);
    cr_assert_eq(memcmp(&me.model, &m2, sizeof(m2)), 0);
    /* Prefixes work again. */
    uint32_t *t = prompt(260, 260, 0);
    ctxs_prefix_match pm;
    cr_assert_eq(find(&pm, st, &m1, t, 260), 0);
    cr_assert_str_eq(pm.session, "alpha");
    cr_assert_eq(pm.n_tokens, 200);
    cr_assert_eq(find(&pm, st, &m2, t, 260), 0);
    cr_assert_str_eq(pm.session, "beta");
    cr_assert_eq(pm.n_tokens, 70);
    free(t);
    /* Sessions open and grow; new ones get new ids and files. */
    ctxs_session *s = op(st, "delta", &m1, 0);
    cr_assert_eq(ts_check_all(s), 0);
    cr_assert_eq(ts_append(s, 5), 0);
    ctxs_session_close(s);
    cr_assert_eq(ts_session_entry(st, "delta").n_tokens, 35);
    s = mk(st, "new", &m1, 256, 4, 3);
    ctxs_session_close(s);
    e = ts_session_entry(st, "new");
    for (int i = 0; i < 4; i++)
        cr_assert_neq(e.id, before[i].id, "a new session took the id of %s", names[i]);
    for (int i = 0; i < 4; i++)
        cr_assert(ts_exists(ts_id_path(before[i].id)));
    ctxs_store_close(st);
}

Test(index, reindex_keeps_checkpoints_and_skips_files_that_are_not_sessions)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_model m = ts_model(1);
    cr_assert_eq(ctxs_model_register(st, &m, "tiny"), 0);
    ctxs_session *s = mk(st, "a", &m, 256, 4, 100);
    cr_assert_eq(ctxs_checkpoint_create(s, "cp"), 0);
    ctxs_session_close(s);
    ctxs_session_close(mk(st, "b", &m, 256, 4, 10));
    const char *junk = ts_id_path(0x5000);
    cr_assert_eq(ts_write_file(junk, "not a session at all", 20), 0);
    const char *notes = ts_path(ts_store_dir(), "sessions/notes.txt");
    cr_assert_eq(ts_write_file(notes, "mine", 4), 0);
    /* b's file deleted by hand: it is not indexed again. */
    cr_assert_eq(unlink(ts_id_path(ts_session_entry(st, "b").id)), 0);

    ctxs_store_reindex_result rr;
    cr_assert_eq(ctxs_store_reindex(&rr, st), 0);
    cr_assert_eq(rr.sessions, 1);
    cr_assert_eq(rr.skipped, 1);
    cr_assert(ts_exists(junk), "reindex must leave files that are not sessions alone");
    cr_assert(ts_exists(notes));
    cr_assert_eq(count_entries(st), 1);
    ctxs_checkpoint_entry *list;
    size_t n;
    cr_assert_eq(ts_checkpoint_list(&list, &n, st, "a"), 0);
    cr_assert_eq(n, 1);
    cr_assert_str_eq(list[0].name, "cp");
    cr_assert_eq(list[0].n_tokens, 100);
    cr_assert_eq(list[0].stale, 0);
    ctxs_free(list);
    ctxs_model_entry me;
    cr_assert_eq(ctxs_model_get(&me, st, m.model_hash), 0);
    cr_assert_str_eq(me.name, "tiny", "reindex keeps models' display names");
    s = op(st, "a", &m, 0);
    cr_assert_eq(ts_append(s, 20), 0);
    cr_assert_eq(ctxs_checkpoint_restore(s, "cp"), 0);
    cr_assert_eq(ts_n_tokens(s), 100);
    ctxs_session_close(s);
    /* Reindexing twice changes nothing. */
    cr_assert_eq(ctxs_store_reindex(&rr, st), 0);
    cr_assert_eq(rr.sessions, 1);
    cr_assert_eq(ts_session_entry(st, "a").n_tokens, 100);
    ctxs_store_close(st);
}

Test(index, reindex_names_a_session_whose_label_is_taken_or_lost_by_its_id)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session_close(mk(st, "p", &m, 256, 4, 10));
    ctxs_session_close(mk(st, "q", &m, 256, 4, 20));
    ctxs_session_close(mk(st, "r", &m, 256, 4, 30));
    uint64_t p = ts_session_entry(st, "p").id, q = ts_session_entry(st, "q").id;
    uint64_t r = ts_session_entry(st, "r").id;
    ctxs_store_close(st);
    /* q's label says "p" (a rename that died between its label and its
     * transaction could leave that); r's label is damaged. */
    int fd = open(ts_id_path(q), O_RDWR);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ctxs__label_write(fd, q, "p", 1), 0);
    close(fd);
    fd = open(ts_id_path(r), O_RDWR);
    cr_assert_geq(fd, 0);
    cr_assert_eq(pwrite(fd, "garbage!", 8, CTXS__LABEL_OFF + 20), 8);
    close(fd);
    ts_rmtree(ts_path(ts_store_dir(), "index"));
    st = ts_store_open(ts_store_dir());
    ctxs_store_reindex_result rr;
    cr_assert_eq(ctxs_store_reindex(&rr, st), 0);
    cr_assert_eq(rr.sessions, 3);
    cr_assert_eq(rr.skipped, 0);
    cr_assert_eq(count_entries(st), 3);
    char qname[64], rname[64];
    snprintf(qname, sizeof(qname), "session-%016llx", (unsigned long long)q);
    snprintf(rname, sizeof(rname), "session-%016llx", (unsigned long long)r);
    cr_assert_eq(ts_session_entry(st, "p").id, p);
    cr_assert_eq(ts_session_entry(st, "p").n_tokens, 10);
    cr_assert_eq(ts_session_entry(st, qname).n_tokens, 20);
    cr_assert_eq(ts_session_entry(st, rname).n_tokens, 30);
    /* The fallback names are ordinary names: rename them back. */
    cr_assert_eq(ctxs_store_session_rename(st, qname, "q"), 0);
    cr_assert_eq(ctxs_store_session_rename(st, rname, "r"), 0);
    ctxs_store_close(st);
    ts_rmtree(ts_path(ts_store_dir(), "index"));
    st = ts_store_open(ts_store_dir());
    cr_assert_eq(ts_session_entry(st, "q").id, q, "a rename rewrites the label");
    cr_assert_eq(ts_session_entry(st, "r").id, r, "a rename rewrites a damaged label");
    ctxs_store_close(st);
}

/* --- The index's own format --------------------------------------------------- */

Test(index, an_index_of_a_newer_major_version_is_eversion)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_store_close(st);
    MDB_env *env = raw_env();
    raw_set_format(env, CTXS__INDEX_MAJOR + 1, 0, NULL);
    mdb_env_close(env);
    st = (ctxs_store *)1;
    cr_assert_eq(ctxs_store_open(&st, ts_store_dir(), CTXS_STORE_CREATE, NULL), CTXS_EVERSION);
    cr_assert_null(st);
    /* A newer minor is fine. */
    env = raw_env();
    raw_set_format(env, CTXS__INDEX_MAJOR, CTXS__INDEX_MINOR + 5, NULL);
    mdb_env_close(env);
    st = ts_store_open(ts_store_dir());
    ctxs_model_entry me;
    cr_assert_eq(ctxs_model_get(&me, st, m.model_hash), 0);
    ctxs_store_close(st);
    /* Someone else's magic in our record. */
    env = raw_env();
    ctxs__index_format f;
    memset(&f, 0, sizeof(f));
    memcpy(f.magic, "NOTCTXS!", 8);
    f.major = CTXS__INDEX_MAJOR;
    f.minor = CTXS__INDEX_MINOR + 5;
    raw_put(env, "meta", "format", 6, &f, sizeof(f));
    mdb_env_close(env);
    /* In our own tables, the record is damaged: the index is. */
    cr_assert_eq(ctxs_store_open(&st, ts_store_dir(), CTXS_STORE_CREATE, NULL), CTXS_EINDEX);
    /* A short record. */
    env = raw_env();
    raw_put(env, "meta", "format", 6, "CTXS", 4);
    mdb_env_close(env);
    int rc = ctxs_store_open(&st, ts_store_dir(), CTXS_STORE_CREATE, NULL);
    cr_assert_eq(rc, CTXS_EINDEX, "short format record: %s", ctxs_err_name(rc));
}

static ctxs__index_format raw_format(void)
{
    MDB_env *env = raw_env();
    MDB_txn *txn;
    MDB_dbi dbi;
    cr_assert_eq(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, "meta", 0, &dbi), 0);
    MDB_val key = {6, (void *)"format"}, val;
    cr_assert_eq(mdb_get(txn, dbi, &key, &val), 0);
    ctxs__index_format f;
    cr_assert_eq(val.mv_size, sizeof(f));
    memcpy(&f, val.mv_data, sizeof(f));
    mdb_txn_abort(txn);
    mdb_env_close(env);
    return f;
}

/* A 1.x build refuses a newer major and takes a model record with a
 * schedule for damage: an index gets the major that says so with its first
 * such record, and not before. */
Test(index, a_model_with_a_layer_schedule_makes_an_old_index_version_2)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_model plain = ts_model(1);
    model_reg(st, &plain);
    ctxs_session_close(mk(st, "chat", &plain, 256, 4, 70));
    ctxs_store_close(st);
    ctxs__index_format f = raw_format();
    cr_assert_eq(f.major, 2, "a new index is 2.0");
    cr_assert_eq(f.minor, 0);
    /* As 1.2 wrote it. */
    f.major = 1;
    f.minor = 2;
    MDB_env *env = raw_env();
    raw_put(env, "meta", "format", 6, &f, sizeof(f));
    mdb_env_close(env);

    /* Opened and written without a schedule, it stays 1.2. */
    st = ts_store_open(ts_store_dir());
    ctxs_model other = ts_model(2);
    model_reg(st, &other);
    ctxs_session_close(mk(st, "other", &other, 256, 4, 10));
    ctxs_store_close(st);
    f = raw_format();
    cr_assert(f.major == 1 && f.minor == 2, "index %u.%u", f.major, f.minor);

    /* A model with a schedule whose registration fails leaves it so. */
    ctxs_model sched = ts_model(3);
    sched.geometry.period = 2;
    sched.geometry.window[1] = 0xffffffffu;
    st = ts_store_open(ts_store_dir());
    cr_assert_eq(ctxs_model_register(st, &sched, "gemma"), CTXS_EINVAL);
    ctxs_store_close(st);
    f = raw_format();
    cr_assert(f.major == 1 && f.minor == 2, "index %u.%u", f.major, f.minor);

    /* The first record with a schedule makes it 2.0, in its transaction. */
    sched.geometry.window[1] = 16;
    st = ts_store_open(ts_store_dir());
    model_reg(st, &sched);
    ctxs_store_close(st);
    f = raw_format();
    cr_assert(f.major == 2 && f.minor == 0, "index %u.%u", f.major, f.minor);
    cr_assert_eq(memcmp(f.magic, CTXS__INDEX_MAGIC, 8), 0);

    /* And it keeps everything it held. */
    st = ts_store_open(ts_store_dir());
    ctxs_model_entry me;
    cr_assert_eq(ctxs_model_get(&me, st, sched.model_hash), 0);
    cr_assert_eq(me.model.geometry.period, 2);
    cr_assert_eq(me.model.geometry.window[1], 16);
    cr_assert_eq(ctxs_model_get(&me, st, plain.model_hash), 0);
    cr_assert_eq(ts_session_entry(st, "chat").n_tokens, 70);
    cr_assert_eq(ts_session_entry(st, "other").n_tokens, 10);
    ctxs_store_close(st);
}

Test(index, a_foreign_lmdb_environment_is_eforeign)
{
    cr_assert_eq(mkdir(ts_store_dir(), 0700), 0);
    cr_assert_eq(mkdir(ts_path(ts_store_dir(), "index"), 0700), 0);
    MDB_env *env = raw_env();
    raw_put(env, "users", "alice", 5, "1", 1);
    raw_put(env, "orders", "42", 2, "x", 1);
    mdb_env_close(env);
    ctxs_store *st = (ctxs_store *)1;
    int rc = ctxs_store_open(&st, ts_store_dir(), CTXS_STORE_CREATE, NULL);
    cr_assert_eq(rc, CTXS_EFOREIGN, "named databases of another program: %s", ctxs_err_name(rc));
    cr_assert_null(st);
    /* Its data is untouched. */
    env = raw_env();
    MDB_txn *txn;
    MDB_dbi dbi;
    cr_assert_eq(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, "meta", 0, &dbi), MDB_NOTFOUND, "a foreign index got our tables");
    mdb_txn_abort(txn);
    mdb_env_close(env);
}

Test(index, a_foreign_lmdb_environment_with_plain_keys_is_eforeign)
{
    cr_assert_eq(mkdir(ts_store_dir(), 0700), 0);
    cr_assert_eq(mkdir(ts_path(ts_store_dir(), "index"), 0700), 0);
    MDB_env *env = raw_env();
    raw_put(env, NULL, "config", 6, "{}", 2);
    mdb_env_close(env);
    ctxs_store *st = (ctxs_store *)1;
    int rc = ctxs_store_open(&st, ts_store_dir(), CTXS_STORE_CREATE, NULL);
    cr_assert_eq(rc, CTXS_EFOREIGN, "plain keys of another program: %s", ctxs_err_name(rc));
    cr_assert_null(st);
}

Test(index, a_foreign_lmdb_environment_named_like_ours_is_eforeign)
{
    /* Another program's databases that happen to be called "meta" and
     * "sessions", with data in them but no format record. */
    cr_assert_eq(mkdir(ts_store_dir(), 0700), 0);
    cr_assert_eq(mkdir(ts_path(ts_store_dir(), "index"), 0700), 0);
    MDB_env *env = raw_env();
    raw_put(env, "meta", "owner", 5, "someone", 7);
    raw_put(env, "sessions", "x", 1, "y", 1);
    mdb_env_close(env);
    ctxs_store *st = (ctxs_store *)1;
    int rc = ctxs_store_open(&st, ts_store_dir(), CTXS_STORE_CREATE, NULL);
    cr_assert(rc == CTXS_EFOREIGN || rc == CTXS_EINDEX, "%s", ctxs_err_name(rc));
    cr_assert_null(st);
}

Test(index, garbage_data_mdb_is_refused_without_a_crash)
{
    cr_assert_eq(mkdir(ts_store_dir(), 0700), 0);
    cr_assert_eq(mkdir(ts_path(ts_store_dir(), "index"), 0700), 0);
    const char *data = ts_path(ts_store_dir(), "index/data.mdb");
    const size_t sizes[] = {1, 100, 4096, 8192, 65536};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        uint8_t *junk = pattern(sizes[i], 1000 + i);
        cr_assert_eq(ts_write_file(data, junk, sizes[i]), 0);
        free(junk);
        unlink(ts_path(ts_store_dir(), "index/lock.mdb"));
        ctxs_store *st = (ctxs_store *)1;
        int rc = ctxs_store_open(&st, ts_store_dir(), CTXS_STORE_CREATE, NULL);
        cr_assert(rc == CTXS_EFOREIGN || rc == CTXS_ECORRUPT, "%zu bytes of garbage: %s",
                  sizes[i], ctxs_err_name(rc));
        cr_assert_null(st);
    }
    /* A text file. */
    const char *text = "this is not an LMDB environment, it is a grocery list\n";
    cr_assert_eq(ts_write_file(data, text, strlen(text)), 0);
    ctxs_store *st;
    int rc = ctxs_store_open(&st, ts_store_dir(), CTXS_STORE_CREATE, NULL);
    cr_assert(rc == CTXS_EFOREIGN || rc == CTXS_ECORRUPT, "text: %s", ctxs_err_name(rc));
}

Test(index, a_full_index_is_efull_and_loses_nothing)
{
    /* A 1 MiB index fills after some hundreds of sessions with prefixes. */
    ctxs_store_options so = CTXS_STORE_OPTIONS_INIT;
    so.map_bytes = 1u << 20;
    ctxs_store *st = NULL;
    cr_assert_eq(ctxs_store_open(&st, ts_store_dir(), CTXS_STORE_CREATE, &so), 0);
    ctxs_model m = ts_model(1);
    model_reg(st, &m);
    ctxs_create_options o = ts_options(1024, 4, 1, CTXS_SYNC_NONE);
    char name[64];
    int rc = 0, made = 0;
    /* Most of the map is filled fast with metadata (a session's 64 KiB
     * values, in sessions made for it), then some of it is given back, so
     * that the sessions below meet a full index after a few dozen creates
     * rather than hundreds. */
    static char value[CTXS_META_VALUE_MAX];
    memset(value, 'v', sizeof(value));
    for (; rc == 0; made++) {
        snprintf(name, sizeof(name), "filler %d", made);
        ctxs_session *s = NULL;
        if ((rc = ctxs_store_session_create(&s, st, name, &m, &o)) < 0)
            break;
        ctxs_session_close(s);
        for (int k = 0; k < 3 && rc == 0; k++) {
            char key[16];
            snprintf(key, sizeof(key), "k%d", k);
            rc = ctxs_store_session_set_meta(st, name, key, value, sizeof(value));
        }
    }
    cr_assert_eq(rc, CTXS_EFULL, "filling: %s", ctxs_err_name(rc));
    cr_assert_eq(ctxs_store_session_set_meta(st, "filler 0", "k0", NULL, 0), 0);
    cr_assert_eq(ctxs_store_session_set_meta(st, "filler 0", "k1", NULL, 0), 0);
    int fillers = made;
    for (; made < 5000; made++) {
        snprintf(name, sizeof(name), "session %d with a longish name to fill pages", made);
        ctxs_session *s = NULL;
        if ((rc = ctxs_store_session_create(&s, st, name, &m, &o)) < 0) {
            cr_assert_null(s);
            break;
        }
        cr_assert_eq(ts_append(s, 640), 0); /* 10 chunks of prefix entries */
        ctxs_session_close(s);
    }
    cr_assert_eq(rc, CTXS_EFULL, "after %d sessions: %s", made, ctxs_err_name(rc));
    cr_assert_gt(made, fillers, "no session was made before the index was full");
    ctxs_store_close(st);

    /* Reopened, with a bigger map: every session made is there and whole,
     * and no file is left without an entry. */
    so.map_bytes = 64u << 20;
    cr_assert_eq(ctxs_store_open(&st, ts_store_dir(), CTXS_STORE_CREATE, &so), 0);
    ctxs_session_entry *list;
    size_t n;
    cr_assert_eq(ctxs_store_session_list(&list, &n, st), 0);
    cr_assert_eq(n, (size_t)made);
    cr_assert_eq(ts_dir_entries(ts_path(ts_store_dir(), "sessions")), made);
    for (size_t i = 0; i < n; i++) {
        ctxs_session *s = NULL;
        cr_assert_eq(ctxs_store_session_open(&s, st, list[i].name, &m, CTXS_RDONLY, NULL), 0);
        cr_assert_eq(ts_check_all(s), 0);
        ctxs_session_close(s);
    }
    ctxs_free(list);
    ctxs_session *s = NULL;
    cr_assert_eq(ctxs_store_session_create(&s, st, "after the map grew", &m, &o), 0);
    ctxs_session_close(s);
    ctxs_store_close(st);
}

/* --- Metadata ------------------------------------------------------------------ */

static void meta_set(ctxs_store *st, const char *name, const char *key, const char *text)
{
    int rc = ctxs_store_session_set_meta(st, name, key, text, strlen(text));
    cr_assert_eq(rc, 0, "set %s.%s: %s", name, key, ctxs_err_name(rc));
}

/* The value of key as a string ("" with *rc set when it cannot be read). */
static const char *meta_str(ctxs_store *st, const char *name, const char *key, int *rc)
{
    static char buf[512];
    size_t n = sizeof(buf) - 1;
    *rc = ctxs_store_session_get_meta(buf, &n, st, name, key);
    buf[*rc == 0 ? n : 0] = '\0';
    return buf;
}

static size_t meta_count(ctxs_store *st, const char *name)
{
    ctxs_meta_entry *list;
    size_t n;
    int rc = ctxs_store_session_list_meta(&list, &n, st, name);
    cr_assert_eq(rc, 0, "list %s: %s", name, ctxs_err_name(rc));
    ctxs_free(list);
    return n;
}

Test(index, metadata_is_set_read_listed_and_deleted)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session *s = mk(st, "chat", &m, 256, 4, 10);
    /* Set while a writer has the session open. */
    meta_set(st, "chat", "title", "Trip to Lisbon");
    meta_set(st, "chat", "sampler", "{\"temperature\":0.7}");
    cr_assert_eq(ctxs_store_session_set_meta(st, "chat", "empty", "", 0), 0);
    cr_assert_eq(ctxs_store_session_set_meta(st, "chat", "bin", "a\0b", 3), 0);
    ctxs_session_close(s);
    int rc;
    cr_assert_str_eq(meta_str(st, "chat", "title", &rc), "Trip to Lisbon");
    meta_set(st, "chat", "title", "Lisbon, day 2");
    cr_assert_str_eq(meta_str(st, "chat", "title", &rc), "Lisbon, day 2");
    /* Sizing first, and a buffer too small. */
    size_t n = 0;
    cr_assert_eq(ctxs_store_session_get_meta(NULL, &n, st, "chat", "title"), 0);
    cr_assert_eq(n, 13);
    char small[4] = "xyz";
    n = 4;
    cr_assert_eq(ctxs_store_session_get_meta(small, &n, st, "chat", "title"), -ERANGE);
    cr_assert_eq(n, 13);
    cr_assert_str_eq(small, "xyz", "a buffer too small is left as it was");
    char bin[8];
    n = sizeof(bin);
    cr_assert_eq(ctxs_store_session_get_meta(bin, &n, st, "chat", "bin"), 0);
    cr_assert(n == 3 && memcmp(bin, "a\0b", 3) == 0);
    n = sizeof(bin);
    cr_assert_eq(ctxs_store_session_get_meta(bin, &n, st, "chat", "empty"), 0);
    cr_assert_eq(n, 0);
    /* The listing: key order, values NUL-terminated, one allocation. */
    ctxs_meta_entry *list;
    cr_assert_eq(ctxs_store_session_list_meta(&list, &n, st, "chat"), 0);
    cr_assert_eq(n, 4);
    const char *keys[] = {"bin", "empty", "sampler", "title"};
    for (size_t i = 0; i < 4; i++)
        cr_assert_str_eq(list[i].key, keys[i]);
    cr_assert_eq(list[0].value_bytes, 3);
    cr_assert(memcmp(list[0].value, "a\0b", 4) == 0);
    cr_assert_eq(list[1].value_bytes, 0);
    cr_assert_str_eq(list[1].value, "");
    cr_assert_str_eq(list[3].value, "Lisbon, day 2");
    ctxs_free(list);
    /* Delete. */
    cr_assert_eq(ctxs_store_session_set_meta(st, "chat", "sampler", NULL, 0), 0);
    cr_assert_eq(ctxs_store_session_set_meta(st, "chat", "sampler", NULL, 0), CTXS_ENOTFOUND);
    meta_str(st, "chat", "sampler", &rc);
    cr_assert_eq(rc, CTXS_ENOTFOUND);
    cr_assert_eq(meta_count(st, "chat"), 3);
    /* A session without any, and sessions that are not there. */
    ctxs_session_close(mk(st, "bare", &m, 256, 4, 0));
    cr_assert_eq(ctxs_store_session_list_meta(&list, &n, st, "bare"), 0);
    cr_assert(n == 0 && list == NULL);
    cr_assert_eq(ctxs_store_session_set_meta(st, "nope", "k", "v", 1), CTXS_ENOTFOUND);
    n = 8;
    cr_assert_eq(ctxs_store_session_get_meta(bin, &n, st, "nope", "k"), CTXS_ENOTFOUND);
    cr_assert_eq(ctxs_store_session_list_meta(&list, &n, st, "nope"), CTXS_ENOTFOUND);
    ctxs_store_close(st);
}

Test(index, metadata_refuses_bad_arguments_and_changes_nothing)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session_close(mk(st, "chat", &m, 256, 4, 0));
    meta_set(st, "chat", "title", "t");
    const char *bad[] = {"", ".", "a/b", "x..y", "new\nline", "\xff", NULL};
    char buf[8];
    size_t n = sizeof(buf);
    ctxs_meta_entry *list;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_eq(ctxs_store_session_set_meta(st, "chat", bad[i], "v", 1), CTXS_EINVAL, "%zu", i);
        cr_assert_eq(ctxs_store_session_set_meta(st, bad[i], "k", "v", 1), CTXS_EINVAL, "%zu", i);
        cr_assert_eq(ctxs_store_session_get_meta(buf, &n, st, "chat", bad[i]), CTXS_EINVAL, "%zu", i);
        cr_assert_eq(ctxs_store_session_get_meta(buf, &n, st, bad[i], "title"), CTXS_EINVAL, "%zu", i);
        cr_assert_eq(ctxs_store_session_list_meta(&list, &n, st, bad[i]), CTXS_EINVAL, "%zu", i);
    }
    cr_assert_eq(ctxs_store_session_set_meta(NULL, "chat", "k", "v", 1), CTXS_EINVAL);
    cr_assert_eq(ctxs_store_session_set_meta(st, "chat", "k", NULL, 1), CTXS_EINVAL);
    cr_assert_eq(ctxs_store_session_get_meta(buf, NULL, st, "chat", "title"), CTXS_EINVAL);
    cr_assert_eq(ctxs_store_session_list_meta(NULL, &n, st, "chat"), CTXS_EINVAL);
    cr_assert_eq(ctxs_store_session_list_meta(&list, NULL, st, "chat"), CTXS_EINVAL);
    cr_assert_eq(meta_count(st, "chat"), 1);
    ctxs_store_close(st);
}

Test(index, metadata_past_its_limits_is_etoobig_and_changes_nothing)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session_close(mk(st, "chat", &m, 256, 4, 0));
    uint8_t *big = calloc(1, CTXS_META_VALUE_MAX + 1);
    memset(big, 'x', CTXS_META_VALUE_MAX + 1);
    cr_assert_eq(ctxs_store_session_set_meta(st, "chat", "a", big, CTXS_META_VALUE_MAX + 1),
                 CTXS_ETOOBIG);
    cr_assert_eq(meta_count(st, "chat"), 0);
    /* Three whole values and their keys: 3 x (1 + 64 KiB). */
    cr_assert_eq(ctxs_store_session_set_meta(st, "chat", "a", big, CTXS_META_VALUE_MAX), 0);
    cr_assert_eq(ctxs_store_session_set_meta(st, "chat", "b", big, CTXS_META_VALUE_MAX), 0);
    cr_assert_eq(ctxs_store_session_set_meta(st, "chat", "c", big, CTXS_META_VALUE_MAX), 0);
    /* A fourth would pass 256 KiB by its key's bytes and more. */
    size_t room = CTXS_META_SESSION_MAX - 3 * (1 + CTXS_META_VALUE_MAX) - 1;
    cr_assert_eq(ctxs_store_session_set_meta(st, "chat", "d", big, room + 1), CTXS_ETOOBIG);
    cr_assert_eq(meta_count(st, "chat"), 3);
    cr_assert_eq(ctxs_store_session_set_meta(st, "chat", "d", big, room), 0);
    /* Full: replacing a value counts it once, not twice; a bigger one does
     * not fit. */
    cr_assert_eq(ctxs_store_session_set_meta(st, "chat", "a", big, CTXS_META_VALUE_MAX), 0);
    cr_assert_eq(ctxs_store_session_set_meta(st, "chat", "d", big, room + 1), CTXS_ETOOBIG);
    size_t n = 0;
    cr_assert_eq(ctxs_store_session_get_meta(NULL, &n, st, "chat", "d"), 0);
    cr_assert_eq(n, room, "a refused set changed the value");
    /* Another session has its own room. */
    ctxs_session_close(mk(st, "other", &m, 256, 4, 0));
    cr_assert_eq(ctxs_store_session_set_meta(st, "other", "a", big, CTXS_META_VALUE_MAX), 0);
    free(big);
    ctxs_store_close(st);
}

Test(index, metadata_goes_with_the_session)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session_close(mk(st, "chat", &m, 256, 4, 70));
    meta_set(st, "chat", "title", "first");
    int rc;
    /* A rename keeps it. */
    cr_assert_eq(ctxs_store_session_rename(st, "chat", "renamed"), 0);
    cr_assert_str_eq(meta_str(st, "renamed", "title", &rc), "first");
    /* A fork is a new conversation: none. */
    cr_assert_eq(ctxs_store_session_fork(NULL, st, "renamed", "fork", 64, NULL), 0);
    cr_assert_eq(meta_count(st, "fork"), 0);
    cr_assert_eq(meta_count(st, "renamed"), 1);
    /* A delete drops it, every key: a new session under the name starts
     * empty. */
    meta_set(st, "renamed", "a", "1");
    meta_set(st, "renamed", "z", "2");
    cr_assert_eq(ctxs_store_session_delete(st, "renamed"), 0);
    ctxs_session_close(mk(st, "renamed", &m, 256, 4, 0));
    cr_assert_eq(meta_count(st, "renamed"), 0);
    /* gc too. */
    meta_set(st, "fork", "title", "fork's");
    meta_set(st, "fork", "app", "{}");
    ctxs_session_entry fork_e = ts_session_entry(st, "fork");
    ctxs_store_gc_result res;
    cr_assert_eq(ctxs_store_gc(&res, st, 0, 0), 0);
    cr_assert_eq(res.deleted, 2);
    ctxs_free(res.sessions);
    ctxs_store_close(st);
    /* No row is left behind under the ids that are gone. */
    size_t rows = ts_raw_entries(ts_store_dir(), "metadata");
    cr_assert_eq(rows, 0, "%zu metadata rows left (fork id %llu)", rows,
                 (unsigned long long)fork_e.id);
}

Test(index, reindex_and_repair_keep_metadata_of_sessions_still_present)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session_close(mk(st, "keep", &m, 256, 4, 70));
    ctxs_session_close(mk(st, "lost", &m, 256, 4, 10));
    ctxs_session_close(mk(st, "gone", &m, 256, 4, 10));
    meta_set(st, "keep", "title", "kept");
    meta_set(st, "lost", "title", "lost");
    meta_set(st, "gone", "title", "gone");
    ctxs_session_entry lost = ts_session_entry(st, "lost"), gone = ts_session_entry(st, "gone");
    cr_assert_eq(unlink(ts_id_path(lost.id)), 0);
    ctxs_store_reindex_result rr;
    cr_assert_eq(ctxs_store_reindex(&rr, st), 0);
    cr_assert_eq(rr.sessions, 2);
    int rc;
    cr_assert_str_eq(meta_str(st, "keep", "title", &rc), "kept");
    cr_assert_str_eq(meta_str(st, "gone", "title", &rc), "gone");
    /* Repair drops an entry whose file is gone, with its metadata. */
    cr_assert_eq(unlink(ts_id_path(gone.id)), 0);
    ctxs_store_repair_result pr;
    cr_assert_eq(ctxs_store_repair(&pr, st), 0);
    cr_assert_eq(pr.entries_removed, 1);
    cr_assert_str_eq(meta_str(st, "keep", "title", &rc), "kept");
    ctxs_store_close(st);
    MDB_env *env = raw_env();
    MDB_txn *txn;
    MDB_dbi dbi;
    MDB_stat ms;
    cr_assert_eq(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, "metadata", 0, &dbi), 0);
    cr_assert_eq(mdb_stat(txn, dbi, &ms), 0);
    cr_assert_eq(ms.ms_entries, 1, "only keep's row is left");
    mdb_txn_abort(txn);
    mdb_env_close(env);
}

Test(index, an_index_from_before_metadata_opens_and_takes_it)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session_close(mk(st, "chat", &m, 256, 4, 70));
    ctxs_store_close(st);
    /* As index 1.1 wrote it: no metadata table, minor 1. */
    MDB_env *env = raw_env();
    raw_set_format(env, 1, 1, "metadata");
    MDB_txn *txn;
    MDB_dbi dbi;
    cr_assert_eq(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, "metadata", 0, &dbi), MDB_NOTFOUND);
    mdb_txn_abort(txn);
    mdb_env_close(env);
    /* Read-only, the index stays as it is and reads as one without
     * metadata. */
    cr_assert_eq(ctxs_store_open(&st, ts_store_dir(), CTXS_RDONLY, NULL), 0);
    ctxs_meta_entry *none = NULL;
    size_t n_none = 1;
    cr_assert_eq(ctxs_store_session_list_meta(&none, &n_none, st, "chat"), 0);
    cr_assert(n_none == 0 && none == NULL);
    size_t vb = 0;
    cr_assert_eq(ctxs_store_session_get_meta(NULL, &vb, st, "chat", "title"), CTXS_ENOTFOUND);
    cr_assert_eq(ctxs_store_session_set_meta(st, "chat", "title", "x", 1), CTXS_EREADONLY);
    ctxs_store_close(st);
    st = ts_store_open(ts_store_dir());
    cr_assert_eq(ts_session_entry(st, "chat").n_tokens, 70);
    cr_assert_eq(meta_count(st, "chat"), 0);
    meta_set(st, "chat", "title", "new");
    int rc;
    cr_assert_str_eq(meta_str(st, "chat", "title", &rc), "new");
    ctxs_store_close(st);
}

/* --- A store that protects itself ----------------------------------------- */

Test(index, open_without_create_makes_nothing_where_no_store_is)
{
    ctxs_store *st = (ctxs_store *)1;
    const char *missing = ts_path(ts_scratch, "missing");
    cr_assert_eq(ctxs_store_open(&st, missing, 0, NULL), -ENOENT);
    cr_assert_null(st);
    cr_assert_eq(ctxs_store_open(&st, missing, CTXS_RDONLY, NULL), -ENOENT);
    cr_assert(!ts_exists(missing));

    /* A directory of someone else's, read-write or read-only. */
    const char *other = ts_path(ts_scratch, "other");
    cr_assert_eq(mkdir(other, 0755), 0);
    cr_assert_eq(ts_write_file(ts_path(other, "notes.txt"), "hi", 2), 0);
    cr_assert_eq(ctxs_store_open(&st, other, 0, NULL), CTXS_EFOREIGN);
    cr_assert_eq(ctxs_store_open(&st, other, CTXS_RDONLY, NULL), CTXS_EFOREIGN);
    cr_assert_eq(ts_dir_entries(other), 1, "something was made in a directory that is no store");
    cr_assert_str_eq(ctxs_strerror(CTXS_EFOREIGN), "not a ctxstore file or store");

    /* An index/ of its own (no LMDB environment in it) is not ours. */
    cr_assert_eq(mkdir(ts_path(other, "index"), 0755), 0);
    cr_assert_eq(ctxs_store_open(&st, other, 0, NULL), CTXS_EFOREIGN);
    cr_assert_eq(ts_dir_entries(ts_path(other, "index")), 0);

    /* A file is no directory. */
    cr_assert_eq(ctxs_store_open(&st, ts_path(other, "notes.txt"), 0, NULL), -ENOTDIR);

    /* Bad flags. */
    cr_assert_eq(ctxs_store_open(&st, other, CTXS_STORE_CREATE | CTXS_RDONLY, NULL),
                 CTXS_EINVAL);
    cr_assert_eq(ctxs_store_open(&st, other, 0x80, NULL), CTXS_EINVAL);
    cr_assert_null(st);

    /* Asked to, it makes the store, in an existing directory too. */
    cr_assert_eq(ctxs_store_open(&st, other, CTXS_STORE_CREATE, NULL), 0);
    ctxs_store_close(st);
    cr_assert(ts_exists(ts_path(other, "sessions")) && ts_exists(ts_path(other, "index/data.mdb")));
    cr_assert(ts_exists(ts_path(other, "notes.txt")));
    cr_assert_eq(ctxs_store_open(&st, other, 0, NULL), 0);
    ctxs_store_close(st);
    cr_assert_eq(ctxs_store_open(&st, other, CTXS_RDONLY, NULL), 0);
    ctxs_store_close(st);
}

Test(index, a_half_made_store_is_completed_by_a_read_write_open_only)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_store_close(st);
    /* What a create that died after the index leaves. */
    cr_assert_eq(rmdir(ts_path(ts_store_dir(), "sessions")), 0);
    cr_assert_eq(ctxs_store_open(&st, ts_store_dir(), CTXS_RDONLY, NULL), -ENOENT);
    cr_assert(!ts_exists(ts_path(ts_store_dir(), "sessions")));
    cr_assert_eq(ctxs_store_open(&st, ts_store_dir(), 0, NULL), 0);
    ctxs_store_close(st);
    struct stat sb;
    cr_assert_eq(stat(ts_path(ts_store_dir(), "sessions"), &sb), 0);
    cr_assert(S_ISDIR(sb.st_mode));
    cr_assert_eq(sb.st_mode & 0777, 0700);
}

Test(index, a_lost_index_is_rebuilt_only_when_asked_to_create)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session_close(mk(st, "kept", &m, 256, 4, 70));
    ctxs_store_close(st);
    ts_rmtree(ts_path(ts_store_dir(), "index"));

    cr_assert_eq(ctxs_store_open(&st, ts_store_dir(), 0, NULL), CTXS_EFOREIGN);
    cr_assert_eq(ctxs_store_open(&st, ts_store_dir(), CTXS_RDONLY, NULL), CTXS_EFOREIGN);
    cr_assert(!ts_exists(ts_path(ts_store_dir(), "index")));
    cr_assert_eq(ctxs_store_open(&st, ts_store_dir(), CTXS_STORE_CREATE, NULL), 0);
    ctxs_session *s = op(st, "kept", &m, CTXS_RDONLY);
    cr_assert_eq(ts_n_tokens(s), 70);
    ctxs_session_close(s);
    ctxs_store_close(st);
}

/* The bytes of the store's index and the names and sizes of its files:
 * what a read-only store must leave as it found. lock.mdb is LMDB's, and
 * written by readers too. */
static char *store_snapshot(void)
{
    size_t len;
    uint8_t *data = ts_read_file(ts_path(ts_store_dir(), "index/data.mdb"), &len);
    cr_assert_not_null(data);
    XXH64_hash_t h = XXH3_64bits(data, len);
    free(data);
    char *out = malloc(8192);
    cr_assert_not_null(out);
    int n = snprintf(out, 8192, "data.mdb %zu %016llx;", len, (unsigned long long)h);
    DIR *d = opendir(ts_path(ts_store_dir(), "sessions"));
    cr_assert_not_null(d);
    struct dirent *de;
    char *names[64];
    int k = 0;
    while ((de = readdir(d)) && k < 64)
        if (de->d_name[0] != '.')
            names[k++] = strdup(de->d_name);
    closedir(d);
    for (int i = 0; i < k; i++)
        for (int j = i + 1; j < k; j++)
            if (strcmp(names[j], names[i]) < 0) {
                char *t = names[i];
                names[i] = names[j];
                names[j] = t;
            }
    for (int i = 0; i < k; i++) {
        struct stat sb;
        cr_assert_eq(stat(ts_path(ts_path(ts_store_dir(), "sessions"), names[i]), &sb), 0);
        n += snprintf(out + n, 8192 - (size_t)n, " %s %lld %lld;", names[i], (long long)sb.st_size,
                      (long long)sb.st_mtim.tv_nsec + (long long)sb.st_mtim.tv_sec * 1000000000ll);
        free(names[i]);
    }
    return out;
}

/* A store with two sessions (one pinned, one with a checkpoint), closed. */
static ctxs_model protect_store(void)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session *s = mk(st, "a", &m, 256, 4, 130);
    cr_assert_eq(ctxs_checkpoint_create(s, "cp"), 0);
    ctxs_session_close(s);
    ctxs_session_close(mk(st, "b", &m, 256, 4, 70));
    cr_assert_eq(ctxs_store_session_set_pinned(st, "b", 1), 0);
    ctxs_store_close(st);
    return m;
}

Test(index, a_read_only_store_reads_everything_and_refuses_every_write)
{
    ctxs_model m = protect_store();
    char *before = store_snapshot();
    ctxs_store *st;
    cr_assert_eq(ctxs_store_open(&st, ts_store_dir(), CTXS_RDONLY, NULL), 0);

    /* Reads. */
    ctxs_session_entry *list;
    size_t n;
    cr_assert_eq(ctxs_store_session_list(&list, &n, st), 0);
    cr_assert_eq(n, 2);
    cr_assert_eq(list[0].pinned, 0);
    cr_assert_eq(list[1].pinned, 1);
    ctxs_free(list);
    ctxs_model_entry me;
    cr_assert_eq(ctxs_model_get(&me, st, m.model_hash), 0);
    ctxs_store_gc_result g;
    cr_assert_eq(ctxs_store_gc(&g, st, 0, CTXS_GC_DRY_RUN), 0);
    cr_assert_eq(g.deleted, 1);
    cr_assert_eq(g.skipped_pinned, 1);
    cr_assert_eq(g.n_sessions, 1);
    cr_assert_str_eq(g.sessions[0].name, "a");
    ctxs_free(g.sessions);
    ctxs_session *s = op(st, "a", NULL, CTXS_RDONLY);
    cr_assert_eq(ts_check_all(s), 0);
    cr_assert_eq(ctxs_session_verify(NULL, s), 0);
    ctxs_checkpoint_entry *cps;
    cr_assert_eq(ctxs_checkpoint_list(&cps, &n, s), 0);
    cr_assert_eq(n, 1);
    ctxs_free(cps);
    uint32_t prompt[64];
    for (uint32_t i = 0; i < 64; i++)
        prompt[i] = ts_token(i);
    ctxs_prefix_match pm;
    cr_assert_eq(ctxs_prefix_find(&pm, st, m.model_hash, prompt, 64), 0);
    const char *exported = ts_path(ts_scratch, "a.export");
    cr_assert_eq(ctxs_store_session_export(st, "a", exported, NULL), 0);
    uint8_t hash[CTXS_HASH_BYTES];
    cr_assert_eq(ctxs_model_hash_file(hash, st, exported), 0); /* not cached */

    /* Writes, each refused. */
    ctxs_session *w = (ctxs_session *)1;
    cr_assert_eq(ctxs_store_session_open(&w, st, "a", &m, 0, NULL), CTXS_EREADONLY);
    cr_assert_null(w);
    cr_assert_eq(ctxs_store_session_create(&w, st, "new", &m, NULL), CTXS_EREADONLY);
    cr_assert_eq(ctxs_store_session_fork(&w, st, "a", "f", 64, NULL), CTXS_EREADONLY);
    cr_assert_eq(ctxs_store_session_fork_checkpoint(&w, st, "a", "cp", "f", NULL), CTXS_EREADONLY);
    cr_assert_eq(ctxs_checkpoint_create(s, "cp2"), CTXS_EREADONLY);
    cr_assert_eq(ctxs_checkpoint_delete(s, "cp"), CTXS_EREADONLY);
    cr_assert_eq(ctxs_store_session_rename(st, "a", "c"), CTXS_EREADONLY);
    cr_assert_eq(ctxs_store_session_delete(st, "a"), CTXS_EREADONLY);
    cr_assert_eq(ctxs_store_session_set_pinned(st, "a", 1), CTXS_EREADONLY);
    cr_assert_eq(ctxs_store_session_set_pinned(st, "b", 0), CTXS_EREADONLY);
    ctxs_model other = ts_model(2);
    cr_assert_eq(ctxs_model_register(st, &other, "other"), CTXS_EREADONLY);
    cr_assert_eq(ctxs_model_register(st, &m, "renamed"), CTXS_EREADONLY);
    cr_assert_eq(ctxs_store_gc(&g, st, 0, 0), CTXS_EREADONLY);
    cr_assert_eq(ctxs_store_repair(NULL, st), CTXS_EREADONLY);
    cr_assert_eq(ctxs_store_reindex(NULL, st), CTXS_EREADONLY);
    cr_assert_eq(ctxs_store_compact(NULL, st, NULL, NULL), CTXS_EREADONLY);
    cr_assert_eq(ctxs_store_compact(NULL, st, "a", NULL), CTXS_EREADONLY);
    char used[CTXS_NAME_MAX + 1];
    cr_assert_eq(ctxs_store_session_import(used, st, exported, "imported", NULL),
                 CTXS_EREADONLY);
    ctxs_session_close(s);
    ctxs_store_close(st);

    char *after = store_snapshot();
    cr_assert_str_eq(before, after, "a read-only store changed");
    free(before);
    free(after);
}

Test(index, a_read_only_open_leaves_a_crashed_create_for_a_writer)
{
    protect_store();
    /* A create whose process died: its intent and its file, no entry. */
    MDB_env *env = raw_env();
    uint8_t idk[8] = {0, 0, 0, 0, 0, 0, 0, 99};
    uint8_t intent[5] = {'C', 0xff, 0xff, 0xff, 0x7f}; /* a pid no process has */
    raw_put(env, "pending", idk, 8, intent, sizeof(intent));
    mdb_env_close(env);
    cr_assert_eq(ts_write_file(ts_id_path(99), "left by a crash", 15), 0);
    ctxs_store *st;
    cr_assert_eq(ctxs_store_open(&st, ts_store_dir(), CTXS_RDONLY, NULL), 0);
    ctxs_store_close(st);
    cr_assert(ts_exists(ts_id_path(99)), "a read-only open removed a file");
    st = ts_store_open(ts_store_dir());
    ctxs_store_close(st);
    cr_assert(!ts_exists(ts_id_path(99)), "a read-write open must finish what the crash left");
}

Test(index, a_read_only_handle_beside_a_read_write_one_shares_it_and_still_refuses_writes)
{
    ctxs_model m = protect_store();
    ctxs_store *rw = ts_store_open(ts_store_dir()), *ro;
    cr_assert_eq(ctxs_store_open(&ro, ts_store_dir(), CTXS_RDONLY, NULL), 0);
    cr_assert_neq(ro, rw);
    ctxs_session_close(mk(rw, "c", &m, 256, 4, 10));
    ctxs_session_entry e;
    cr_assert_eq(ctxs_store_session_get(&e, ro, "c"), 0, "the read-only handle sees the writes");
    cr_assert_eq(ctxs_store_session_delete(ro, "c"), CTXS_EREADONLY);
    cr_assert_eq(ctxs_store_session_set_pinned(ro, "c", 1), CTXS_EREADONLY);
    ctxs_session *s = (ctxs_session *)1;
    cr_assert_eq(ctxs_store_session_open(&s, ro, "c", &m, 0, NULL), CTXS_EREADONLY);
    s = op(ro, "c", NULL, CTXS_RDONLY);
    /* Either handle closes first. */
    ctxs_store_close(rw);
    cr_assert_eq(ts_n_tokens(s), 10);
    ctxs_session_close(s);
    ctxs_store_close(ro);

    /* Open read-only alone, the environment cannot write: a read-write
     * open in the same process is refused until it is closed. */
    cr_assert_eq(ctxs_store_open(&ro, ts_store_dir(), CTXS_RDONLY, NULL), 0);
    cr_assert_eq(ctxs_store_open(&rw, ts_store_dir(), 0, NULL), CTXS_EBUSY);
    ctxs_store *ro2;
    cr_assert_eq(ctxs_store_open(&ro2, ts_store_dir(), CTXS_RDONLY, NULL), 0);
    ctxs_store_close(ro2);
    ctxs_store_close(ro);
    rw = ts_store_open(ts_store_dir());
    ctxs_store_close(rw);
}

/* In a child that may read the store but not write it: what works. */
static void read_unwritable_store(const char *out_dir)
{
    TS_CHECK(chmod(out_dir, 0777) == 0, "chmod: %s", strerror(errno));
    TS_CHECK(ts_drop_privileges() == 0, "cannot drop privileges: %s", strerror(errno));
    ctxs_store *st = NULL;
    int rc = ctxs_store_open(&st, ts_store_dir(), 0, NULL);
    TS_CHECK(rc == -EACCES, "a read-write open: %s", ctxs_err_name(rc));
    rc = ctxs_store_open(&st, ts_store_dir(), CTXS_RDONLY, NULL);
    TS_CHECK(rc == 0, "a read-only open: %s", ctxs_err_name(rc));
    ctxs_session_entry *list;
    size_t n;
    rc = ctxs_store_session_list(&list, &n, st);
    TS_CHECK(rc == 0 && n == 2 && list[1].pinned, "list: %s, %zu", ctxs_err_name(rc), n);
    ctxs_free(list);
    ctxs_session *s = NULL;
    rc = ctxs_store_session_open(&s, st, "a", NULL, CTXS_RDONLY, NULL);
    TS_CHECK(rc == 0, "session open: %s", ctxs_err_name(rc));
    uint64_t bad = 0;
    rc = ctxs_session_verify(&bad, s);
    TS_CHECK(rc == 0, "verify: %s", ctxs_err_name(rc));
    ctxs_session_close(s);
    rc = ctxs_store_session_export(st, "a", ts_path(out_dir, "a.export"), NULL);
    TS_CHECK(rc == 0, "export: %s", ctxs_err_name(rc));
    rc = ctxs_store_session_set_pinned(st, "a", 1);
    TS_CHECK(rc == CTXS_EREADONLY, "pin: %s", ctxs_err_name(rc));
    ctxs_store_close(st);
    _exit(0);
}

Test(index, a_store_the_user_cannot_write_opens_read_only)
{
    protect_store();
    cr_assert_eq(ts_make_unwritable(ts_store_dir()), 0);
    char *before = store_snapshot();
    ts_run_child(read_unwritable_store, "a store the user may read but not write");
    char *after = store_snapshot();
    cr_assert_str_eq(before, after);
    free(before);
    free(after);
}

/* In a child that cannot write the store, while the parent has it open. */
static void open_unwritable_store_in_use(const char *unused)
{
    (void)unused;
    TS_CHECK(ts_drop_privileges() == 0, "cannot drop privileges: %s", strerror(errno));
    ctxs_store *st = NULL;
    int rc = ctxs_store_open(&st, ts_store_dir(), CTXS_RDONLY, NULL);
    TS_CHECK(rc == CTXS_EBUSY, "read without LMDB's locks beside a writer: %s",
             ctxs_err_name(rc));
    _exit(0);
}

Test(index, a_store_the_user_cannot_write_is_not_read_beside_a_process_using_it)
{
    protect_store();
    /* Opened before the permissions change, as a process that had it. */
    ctxs_store *st = ts_store_open(ts_store_dir());
    cr_assert_eq(ts_make_unwritable(ts_store_dir()), 0);
    ts_run_child(open_unwritable_store_in_use, "a store in use that the user cannot write");
    ctxs_store_close(st);
}

/* --- Pins and gc's report --------------------------------------------------- */

Test(index, gc_never_deletes_a_pinned_session_and_names_what_it_deleted)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    static const char *const names[] = {"old", "pinned", "mid", "new"};
    for (int i = 0; i < 4; i++) {
        ctxs_session_close(mk(st, names[i], &m, 256, 4, 40));
        ts_sleep_us(3000); /* distinct last-use times */
    }
    cr_assert_eq(ctxs_store_session_set_pinned(st, "pinned", 1), 0);
    cr_assert_eq(ctxs_store_session_set_pinned(st, "pinned", 1), 0, "pinning twice is no error");
    cr_assert_eq(ctxs_store_session_set_pinned(st, "new", 0), 0, "unpinning the unpinned is none");
    cr_assert_eq(ctxs_store_session_set_pinned(st, "none", 1), CTXS_ENOTFOUND);
    cr_assert_eq(ctxs_store_session_set_pinned(st, "old", 2), CTXS_EINVAL);
    cr_assert_eq(ctxs_store_session_set_pinned(st, "bad/name", 1), CTXS_EINVAL);
    cr_assert_eq(ctxs_store_session_set_pinned(NULL, "old", 1), CTXS_EINVAL);
    cr_assert(ts_session_entry(st, "pinned").pinned);
    cr_assert_not(ts_session_entry(st, "old").pinned);
    uint64_t pinned_id = ts_session_entry(st, "pinned").id;

    /* A dry run names what would go, least recently used first, and
     * deletes nothing. */
    ctxs_store_gc_result g;
    cr_assert_eq(ctxs_store_gc(&g, st, 0, CTXS_GC_DRY_RUN), 0);
    cr_assert_eq(g.deleted, 3);
    cr_assert_eq(g.n_sessions, 3);
    cr_assert_eq(g.skipped_pinned, 1);
    cr_assert_str_eq(g.sessions[0].name, "old");
    cr_assert_str_eq(g.sessions[1].name, "mid");
    cr_assert_str_eq(g.sessions[2].name, "new");
    cr_assert_eq(g.bytes_after, file_bytes(ts_id_path(pinned_id)));
    ctxs_free(g.sessions);
    cr_assert_eq(count_entries(st), 4);
    cr_assert_eq(ctxs_store_gc(&g, st, 0, 0x4), CTXS_EINVAL);

    /* The dry run counts an open session as gc would. */
    ctxs_session *held = op(st, "mid", NULL, CTXS_RDONLY);
    cr_assert_eq(ctxs_store_gc(&g, st, 0, CTXS_GC_DRY_RUN), 0);
    cr_assert_eq(g.deleted, 2);
    cr_assert_eq(g.skipped_open, 1);
    ctxs_free(g.sessions);
    ctxs_session_close(held);

    /* The pin stays through a rename, and gc says what it deleted. */
    cr_assert_eq(ctxs_store_session_rename(st, "pinned", "kept"), 0);
    cr_assert(ts_session_entry(st, "kept").pinned);
    cr_assert_eq(ctxs_store_gc(&g, st, 0, 0), 0);
    cr_assert_eq(g.deleted, 3);
    cr_assert_eq(g.n_sessions, 3);
    cr_assert_eq(g.skipped_pinned, 1);
    cr_assert_str_eq(g.sessions[0].name, "old");
    cr_assert_str_eq(g.sessions[2].name, "new");
    ctxs_free(g.sessions);
    cr_assert_eq(count_entries(st), 1);
    cr_assert(ts_exists(ts_id_path(pinned_id)));

    /* Unpinned, it goes; with out NULL too. */
    cr_assert_eq(ctxs_store_session_set_pinned(st, "kept", 0), 0);
    cr_assert_eq(ctxs_store_gc(NULL, st, 0, 0), 0);
    cr_assert_eq(count_entries(st), 0);
    cr_assert(!ts_exists(ts_id_path(pinned_id)));
    ctxs_store_close(st);
}

Test(index, a_pin_outlives_a_reindex_and_a_compaction_and_goes_with_its_session)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session_close(mk(st, "p", &m, 256, 4, 40));
    ctxs_session_close(mk(st, "q", &m, 256, 4, 40));
    cr_assert_eq(ctxs_store_session_set_pinned(st, "p", 1), 0);
    cr_assert_eq(ctxs_store_reindex(NULL, st), 0);
    cr_assert(ts_session_entry(st, "p").pinned);
    cr_assert_not(ts_session_entry(st, "q").pinned);
    ctxs_store_compact_result cr;
    cr_assert_eq(ctxs_store_compact(&cr, st, NULL, NULL), 0);
    cr_assert(ts_session_entry(st, "p").pinned);
    /* Deleted by name, pinned or not; a session made later with the name
     * is not pinned. */
    cr_assert_eq(ctxs_store_session_delete(st, "p"), 0);
    ctxs_session_close(mk(st, "p", &m, 256, 4, 10));
    cr_assert_not(ts_session_entry(st, "p").pinned);
    ctxs_store_close(st);
    /* No pin row is left without its session. */
    MDB_env *env = raw_env();
    MDB_txn *txn;
    MDB_dbi dbi;
    MDB_stat ms;
    cr_assert_eq(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, "pins", 0, &dbi), 0);
    cr_assert_eq(mdb_stat(txn, dbi, &ms), 0);
    cr_assert_eq(ms.ms_entries, 0);
    mdb_txn_abort(txn);
    mdb_env_close(env);
}

Test(index, an_index_from_before_pins_opens_read_only_and_read_write)
{
    ctxs_model m = protect_store();
    /* Index 1.1: no pins table, minor 1. */
    MDB_env *env = raw_env();
    raw_set_format(env, 1, 1, "pins");
    mdb_env_close(env);

    ctxs_store *st;
    cr_assert_eq(ctxs_store_open(&st, ts_store_dir(), CTXS_RDONLY, NULL), 0);
    ctxs_session_entry *list;
    size_t n;
    cr_assert_eq(ctxs_store_session_list(&list, &n, st), 0);
    cr_assert_eq(n, 2);
    cr_assert(!list[0].pinned && !list[1].pinned);
    ctxs_free(list);
    ctxs_store_gc_result g;
    cr_assert_eq(ctxs_store_gc(&g, st, 0, CTXS_GC_DRY_RUN), 0);
    cr_assert_eq(g.deleted, 2);
    ctxs_free(g.sessions);
    ctxs_store_close(st);

    st = ts_store_open(ts_store_dir());
    cr_assert_eq(ctxs_store_session_set_pinned(st, "a", 1), 0);
    cr_assert(ts_session_entry(st, "a").pinned);
    ctxs_session *s = op(st, "a", &m, 0);
    cr_assert_eq(ts_n_tokens(s), 130);
    ctxs_session_close(s);
    ctxs_store_close(st);
}

/* --- Ids never repeat ----------------------------------------- */

static void raw_del(MDB_env *env, const char *db, const void *k, size_t kl)
{
    MDB_txn *txn;
    MDB_dbi dbi;
    cr_assert_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, db, 0, &dbi), 0);
    MDB_val key = {kl, (void *)k};
    int rc = mdb_del(txn, dbi, &key, NULL);
    cr_assert(rc == 0 || rc == MDB_NOTFOUND, "mdb_del: %s", mdb_strerror(rc));
    cr_assert_eq(mdb_txn_commit(txn), 0);
}

/* The value of db[k] copied into out (at most size bytes); its size. */
static size_t raw_get(MDB_env *env, const char *db, const void *k, size_t kl, void *out,
                      size_t size)
{
    MDB_txn *txn;
    MDB_dbi dbi;
    cr_assert_eq(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, db, 0, &dbi), 0);
    MDB_val key = {kl, (void *)k}, val;
    int rc = mdb_get(txn, dbi, &key, &val);
    cr_assert_eq(rc, 0, "mdb_get(%s): %s", db, mdb_strerror(rc));
    memcpy(out, val.mv_data, val.mv_size < size ? val.mv_size : size);
    mdb_txn_abort(txn);
    return val.mv_size;
}

static void be_key(uint8_t out[8], uint64_t id)
{
    for (int i = 0; i < 8; i++)
        out[i] = (uint8_t)(id >> (56 - 8 * i));
}

/* Three sessions a, b, c (ids 1..3), then next_id set to the value
 * (size bytes of it) with the store closed. */
static ctxs_model three_then_next_id(const void *value, size_t size)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    const char *names[] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++)
        ctxs_session_close(mk(st, names[i], &m, 64, 4, 5));
    cr_assert_eq(ts_session_entry(st, "c").id, 3);
    ctxs_store_close(st);
    MDB_env *env = raw_env();
    raw_put(env, "meta", "next_id", 7, value, size);
    mdb_env_close(env);
    return m;
}

/* Creates and forks after the damage: every new id is above 3 and new. */
static void new_ids_are_fresh(const ctxs_model *m, uint64_t above)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_session_close(mk(st, "new", m, 64, 4, 2));
    cr_assert_eq(ctxs_store_session_fork(NULL, st, "a", "forked", 3, NULL), 0);
    uint64_t n1 = ts_session_entry(st, "new").id, n2 = ts_session_entry(st, "forked").id;
    cr_assert_gt(n1, above, "new id %llu", (unsigned long long)n1);
    cr_assert_gt(n2, above, "forked id %llu", (unsigned long long)n2);
    cr_assert_neq(n1, n2);
    cr_assert_leq(n1, (uint64_t)INT64_MAX);
    ctxs_session_entry *list;
    size_t n;
    cr_assert_eq(ctxs_store_session_list(&list, &n, st), 0);
    cr_assert_eq(n, 5);
    for (size_t i = 0; i < n; i++) {
        cr_assert_neq(list[i].id, 0, "%s has id 0", list[i].name);
        for (size_t j = 0; j < i; j++)
            cr_assert_neq(list[i].id, list[j].id, "%s and %s share an id", list[i].name,
                          list[j].name);
    }
    ctxs_free(list);
    ctxs_session *s = op(st, "a", m, CTXS_RDONLY);
    cr_assert_eq(ts_n_tokens(s), 5, "a new session took a's file");
    ctxs_session_close(s);
    ctxs_store_close(st);
}

Test(index, a_next_id_of_0_is_repaired_and_never_handed_out)
{
    uint64_t zero = 0;
    ctxs_model m = three_then_next_id(&zero, 8);
    new_ids_are_fresh(&m, 3);
}

Test(index, a_next_id_at_its_maximum_does_not_wrap)
{
    uint64_t top = UINT64_MAX;
    ctxs_model m = three_then_next_id(&top, 8);
    new_ids_are_fresh(&m, 3);
    /* And one just below the maximum: taken up to above the ids in use,
     * not handed out next to a wrap. */
    ts_rmtree(ts_store_dir());
    top = UINT64_MAX - 1;
    m = three_then_next_id(&top, 8);
    new_ids_are_fresh(&m, 3);
}

Test(index, a_next_id_below_an_existing_id_is_repaired)
{
    uint64_t one = 1;
    ctxs_model m = three_then_next_id(&one, 8);
    new_ids_are_fresh(&m, 3);
    /* Of another size: damaged too. */
    ts_rmtree(ts_store_dir());
    m = three_then_next_id("\x01\x00", 2);
    new_ids_are_fresh(&m, 3);
}

Test(index, no_new_session_takes_the_id_of_rows_left_behind)
{
    /* A checkpoint row of id 40 that nothing owns (an older build's
     * leftover, a restored index): a new session must not inherit it. */
    uint64_t one = 1;
    ctxs_model m = three_then_next_id(&one, 8);
    MDB_env *env = raw_env();
    uint8_t k[8 + 2];
    be_key(k, 40);
    memcpy(k + 8, "cp", 2);
    uint64_t cp[3] = {1, 0, 0};
    raw_put(env, "checkpoints", k, sizeof(k), cp, sizeof(cp));
    mdb_env_close(env);
    new_ids_are_fresh(&m, 40);
}

Test(index, repair_mends_next_id)
{
    uint64_t zero = 0;
    three_then_next_id(&zero, 8);
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_store_repair_result r;
    cr_assert_eq(ctxs_store_repair(&r, st), 0);
    cr_assert_eq(r.next_id_mended, 1);
    cr_assert_eq(r.next_id_was, 0);
    cr_assert_eq(r.next_id, 4);
    cr_assert_eq(r.files_renumbered, 0);
    /* Mended once: a second repair finds nothing to say. */
    cr_assert_eq(ctxs_store_repair(&r, st), 0);
    cr_assert_eq(r.next_id_mended, 0);
    cr_assert_eq(r.next_id_was, 0);
    cr_assert_eq(r.next_id, 4);
    ctxs_store_close(st);
    MDB_env *env = raw_env();
    uint64_t next = 0;
    cr_assert_eq(raw_get(env, "meta", "next_id", 7, &next, 8), 8);
    mdb_env_close(env);
    cr_assert_eq(next, 4, "next_id after repair: %llu", (unsigned long long)next);
}

Test(index, reindex_says_it_mended_next_id)
{
    uint64_t one = 1; /* at or below ids 1..3 in use */
    three_then_next_id(&one, 8);
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_store_reindex_result r;
    cr_assert_eq(ctxs_store_reindex(&r, st), 0);
    cr_assert_eq(r.sessions, 3);
    cr_assert_eq(r.next_id_mended, 1);
    cr_assert_eq(r.next_id_was, 1);
    cr_assert_eq(r.next_id, 4);
    cr_assert_eq(ctxs_store_reindex(&r, st), 0);
    cr_assert_eq(r.next_id_mended, 0, "a healthy next_id is not mended");
    cr_assert_eq(r.next_id, 4);
    ctxs_store_close(st);
}

/* Moves session name's file and index entries to id 0, as a store whose
 * next_id was 0 left them (its checkpoint too), with the store closed. */
static void move_to_id_0(const char *name, uint64_t id)
{
    char from[1100], to[1100];
    snprintf(from, sizeof(from), "%s", ts_id_path(id));
    snprintf(to, sizeof(to), "%s", ts_id_path(0));
    cr_assert_eq(rename(from, to), 0);
    MDB_env *env = raw_env();
    uint8_t rec[96];
    cr_assert_eq(raw_get(env, "sessions", name, strlen(name), rec, sizeof(rec)), 96);
    memset(rec, 0, 8);
    raw_put(env, "sessions", name, strlen(name), rec, sizeof(rec));
    uint8_t k[8], k0[8];
    be_key(k, id);
    be_key(k0, 0);
    raw_del(env, "ids", k, 8);
    raw_put(env, "ids", k0, 8, name, strlen(name));
    uint8_t ck[8 + 2], ck0[8 + 2];
    memcpy(ck, k, 8);
    memcpy(ck + 8, "cp", 2);
    memcpy(ck0, k0, 8);
    memcpy(ck0 + 8, "cp", 2);
    uint8_t cp[24];
    cr_assert_eq(raw_get(env, "checkpoints", ck, sizeof(ck), cp, sizeof(cp)), 24);
    raw_del(env, "checkpoints", ck, sizeof(ck));
    raw_put(env, "checkpoints", ck0, sizeof(ck0), cp, sizeof(cp));
    mdb_env_close(env);
}

/* b: 40 tokens and a checkpoint "cp" at 30, then moved to id 0. */
static ctxs_model b_at_id_0(void)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session_close(mk(st, "a", &m, 64, 4, 5));
    ctxs_session *s = mk(st, "b", &m, 256, 4, 30);
    cr_assert_eq(ctxs_checkpoint_create(s, "cp"), 0);
    cr_assert_eq(ts_append(s, 10), 0);
    ctxs_session_close(s);
    uint64_t id = ts_session_entry(st, "b").id;
    ctxs_store_close(st);
    move_to_id_0("b", id);
    return m;
}

/* b is back under an id of its own, whole, with its checkpoint. */
static void b_renumbered(const ctxs_model *m)
{
    cr_assert_not(ts_exists(ts_id_path(0)), "the file of id 0 is still there");
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_session_entry e = ts_session_entry(st, "b");
    cr_assert_gt(e.id, 2);
    cr_assert(ts_exists(ts_id_path(e.id)));
    ctxs_session *s = op(st, "b", m, 0);
    cr_assert_eq(ts_n_tokens(s), 40);
    uint64_t bad;
    cr_assert_eq(ctxs_session_verify(&bad, s), 0);
    cr_assert_eq(ctxs_checkpoint_restore(s, "cp"), 0, "the checkpoint was lost");
    cr_assert_eq(ts_n_tokens(s), 30);
    ctxs_session_close(s);
    ctxs_session_close(mk(st, "later", m, 64, 4, 1));
    cr_assert_gt(ts_session_entry(st, "later").id, e.id);
    ctxs_store_close(st);
}

Test(index, repair_gives_a_session_filed_under_id_0_an_id_of_its_own)
{
    ctxs_model m = b_at_id_0();
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_store_repair_result r;
    cr_assert_eq(ctxs_store_repair(&r, st), 0);
    cr_assert_eq(r.files_renumbered, 1);
    cr_assert_eq(r.next_id_mended, 0);
    cr_assert_gt(r.next_id, ts_session_entry(st, "b").id);
    ctxs_store_close(st);
    b_renumbered(&m);
}

Test(index, reindex_adopts_a_file_named_with_id_0_under_a_new_id)
{
    /* Reindex keeps checkpoints of sessions still present by id: the one
     * moved to id 0 moves with the file. */
    ctxs_model m = b_at_id_0();
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_store_reindex_result r;
    cr_assert_eq(ctxs_store_reindex(&r, st), 0);
    cr_assert_eq(r.sessions, 2);
    cr_assert_eq(r.skipped, 0);
    cr_assert_eq(r.files_renumbered, 1);
    ctxs_store_close(st);
    b_renumbered(&m);
}

Test(index, reindex_adopts_a_file_named_past_the_largest_id)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session_close(mk(st, "a", &m, 64, 4, 5));
    ctxs_session_close(mk(st, "b", &m, 64, 4, 7));
    uint64_t id = ts_session_entry(st, "b").id;
    ctxs_store_close(st);
    char from[1100], to[1100];
    snprintf(from, sizeof(from), "%s", ts_id_path(id));
    snprintf(to, sizeof(to), "%s", ts_id_path(UINT64_MAX));
    cr_assert_eq(rename(from, to), 0);
    st = ts_store_open(ts_store_dir());
    ctxs_store_reindex_result r;
    cr_assert_eq(ctxs_store_reindex(&r, st), 0);
    cr_assert_eq(r.sessions, 2);
    ctxs_session_entry e = ts_session_entry(st, "b");
    cr_assert(e.id > 0 && e.id <= (uint64_t)INT64_MAX);
    cr_assert_not(ts_exists(to));
    ctxs_session *s = op(st, "b", &m, CTXS_RDONLY);
    cr_assert_eq(ts_n_tokens(s), 7);
    ctxs_session_close(s);
    /* And new sessions go on from there. */
    ctxs_session_close(mk(st, "c", &m, 64, 4, 1));
    cr_assert_gt(ts_session_entry(st, "c").id, e.id);
    ctxs_store_close(st);
}

/* --- A damaged index ------------------------------------------------------ */

/* What every session file is, by name, size and content. */
static uint64_t sessions_digest(void)
{
    const char *dir = ts_path(ts_store_dir(), "sessions");
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    uint64_t sum = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        size_t len;
        uint8_t *bytes = ts_read_file(ts_path(dir, e->d_name), &len);
        cr_assert_not_null(bytes, "%s", e->d_name);
        /* Order-free: a sum of each file's hash. */
        sum += XXH3_64bits_withSeed(bytes, len, XXH3_64bits(e->d_name, strlen(e->d_name)));
        free(bytes);
    }
    closedir(d);
    return sum;
}

/* Opens the store with flags in a child and lists its sessions and their
 * metadata there: the first error, or 0. A signal (SIGBUS from a page
 * past the end of the file) fails the test instead of killing the suite. */
static int read_store(void *flags)
{
    return ts_store_read(*(const unsigned *)flags, 1);
}

static int open_in_child(unsigned flags, const char *what)
{
    return ts_in_child(read_store, &flags, what);
}

/* A store with sessions, checkpoints and metadata over a few dozen pages;
 * its data.mdb's bytes, and its page size and the bytes its newest meta
 * claims (LMDB's own word, through mdb_env_info). */
static uint8_t *damage_fixture(size_t *len, size_t *psize, size_t *needed)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    for (int i = 0; i < 6; i++) {
        char name[32];
        snprintf(name, sizeof(name), "chat-%d", i);
        ctxs_session *s = mk(st, name, &m, 512, 4, 130 + 40 * i);
        cr_assert_eq(ctxs_checkpoint_create(s, "turn"), 0);
        ctxs_session_close(s);
        char value[600];
        memset(value, 'a' + i, sizeof(value));
        cr_assert_eq(ctxs_store_session_set_meta(st, name, "title", value, sizeof(value)), 0);
    }
    ctxs_store_close(st);
    MDB_env *env = raw_env();
    MDB_envinfo info;
    MDB_stat ms;
    cr_assert_eq(mdb_env_info(env, &info), 0);
    cr_assert_eq(mdb_env_stat(env, &ms), 0);
    mdb_env_close(env);
    *psize = ms.ms_psize;
    *needed = (info.me_last_pgno + 1) * ms.ms_psize;
    uint8_t *bytes = ts_read_file(ts_path(ts_store_dir(), "index/data.mdb"), len);
    cr_assert_not_null(bytes);
    cr_assert_geq(*len, *needed);
    cr_assert_geq(*needed / *psize, 8, "too few pages to cut: %zu", *needed / *psize);
    return bytes;
}

static void put_index(const uint8_t *bytes, size_t len)
{
    cr_assert_eq(ts_write_file(ts_path(ts_store_dir(), "index/data.mdb"), bytes, len), 0);
}

Test(index, a_truncated_index_is_eindex_at_every_size_never_a_signal)
{
    size_t len, psize, needed;
    uint8_t *bytes = damage_fixture(&len, &psize, &needed);
    uint64_t before = sessions_digest();
    /* Every page boundary, and sizes inside the meta pages and pages. */
    size_t odd[] = {1, 15, 16, 100, 151, 152, psize - 1, psize + 1, psize + 100,
                    2 * psize + 7, needed - 1, needed - psize / 2, needed - 17};
    size_t n_cuts = needed / psize + sizeof(odd) / sizeof(odd[0]);
    for (size_t i = 0; i < n_cuts; i++) {
        size_t cut = i < needed / psize ? i * psize : odd[i - needed / psize];
        if (cut == 0)
            continue; /* below */
        put_index(bytes, cut);
        char what[64];
        snprintf(what, sizeof(what), "cut to %zu of %zu bytes", cut, needed);
        /* Cut before LMDB's magic (20 bytes in), nothing says the file was
         * ever an LMDB environment: someone else's. */
        int want = cut < 20 ? CTXS_EFOREIGN : CTXS_EINDEX;
        const unsigned flags[] = {0, CTXS_RDONLY, CTXS_STORE_CREATE};
        for (size_t k = 0; k < 3; k++) {
            int rc = open_in_child(flags[k], what);
            cr_assert_eq(rc, want, "%s (flags %u): %s", what, flags[k], ctxs_err_name(rc));
        }
        cr_assert_eq(sessions_digest(), before, "%s: sessions/ changed", what);
    }
    /* Cut to nothing beside session files: no new empty index in its place
     * (what LMDB would make of an empty file), which would lose the
     * checkpoints and metadata without a word. */
    put_index(bytes, 0);
    cr_assert_eq(open_in_child(0, "cut to 0"), CTXS_EINDEX);
    cr_assert_eq(open_in_child(CTXS_RDONLY, "cut to 0, read-only"), CTXS_EINDEX);
    cr_assert_eq(sessions_digest(), before);
    /* Whole again (longer is fine too: LMDB never shrinks its file). */
    put_index(bytes, len);
    cr_assert_eq(open_in_child(0, "whole"), 0);
    uint8_t *longer = calloc(1, len + 3 * psize);
    memcpy(longer, bytes, len);
    put_index(longer, len + 3 * psize);
    cr_assert_eq(open_in_child(CTXS_RDONLY, "longer"), 0);
    free(longer);
    free(bytes);
}

Test(index, a_lost_meta_page_is_eindex_and_sessions_are_untouched)
{
    size_t len, psize, needed;
    uint8_t *bytes = damage_fixture(&len, &psize, &needed);
    uint64_t before = sessions_digest();
    uint8_t *copy = malloc(len);
    const char *cases[] = {"meta page 0 zeroed", "meta page 1 zeroed", "both zeroed",
                           "meta page 0's magic flipped", "meta page 1's page size changed",
                           "meta page 0 claims pages past the end"};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        memcpy(copy, bytes, len);
        switch (c) {
        case 0: memset(copy, 0, psize); break;
        case 1: memset(copy + psize, 0, psize); break;
        case 2: memset(copy, 0, 2 * psize); break;
        case 3: copy[16] ^= 0xff; break;           /* MDB_meta.mm_magic */
        case 4: copy[psize + 16 + 24 + 1] ^= 0x30; break; /* mm_psize */
        case 5: {
            /* mm_last_pg of both, past the file: whichever LMDB picks. */
            size_t off = 16 + 120, far = len / psize + 10;
            memcpy(copy + off, &far, sizeof(far));
            memcpy(copy + psize + off, &far, sizeof(far));
            break;
        }
        }
        put_index(copy, len);
        for (int rd = 0; rd < 2; rd++) {
            int rc = open_in_child(rd ? CTXS_RDONLY : 0, cases[c]);
            cr_assert_eq(rc, CTXS_EINDEX, "%s%s: %s", cases[c], rd ? ", read-only" : "",
                         ctxs_err_name(rc));
        }
        cr_assert_eq(sessions_digest(), before, "%s: sessions/ changed", cases[c]);
    }
    free(copy);
    free(bytes);
}

Test(index, a_damaged_format_record_is_eindex)
{
    size_t len, psize, needed;
    free(damage_fixture(&len, &psize, &needed));
    uint64_t before = sessions_digest();
    ctxs__index_format f = {.major = CTXS__INDEX_MAJOR, .minor = CTXS__INDEX_MINOR};
    memcpy(f.magic, CTXS__INDEX_MAGIC, 8);
    uint8_t longer[sizeof(f) + 4] = {0};
    memcpy(longer, &f, sizeof(f));
    f.magic[3] ^= 0x20;
    MDB_env *env = raw_env();
    raw_put(env, "meta", "format", 6, &f, sizeof(f));
    mdb_env_close(env);
    cr_assert_eq(open_in_child(0, "magic"), CTXS_EINDEX);
    cr_assert_eq(open_in_child(CTXS_RDONLY, "magic, read-only"), CTXS_EINDEX);
    env = raw_env();
    raw_put(env, "meta", "format", 6, longer, sizeof(longer));
    mdb_env_close(env);
    cr_assert_eq(open_in_child(0, "lengthened"), CTXS_EINDEX);
    /* Gone, beside sessions: not a new index to fill in. */
    env = raw_env();
    MDB_txn *txn;
    MDB_dbi dbi;
    cr_assert_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, "meta", 0, &dbi), 0);
    MDB_val key = {6, (void *)"format"};
    cr_assert_eq(mdb_del(txn, dbi, &key, NULL), 0);
    cr_assert_eq(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
    cr_assert_eq(open_in_child(0, "missing"), CTXS_EINDEX);
    cr_assert_eq(sessions_digest(), before);
    cr_assert_str_eq(ctxs_err_name(CTXS_EINDEX), "CTXS_EINDEX");
    cr_assert_str_eq(ctxs_strerror(CTXS_EINDEX), "the store's index is damaged");
}

Test(index, a_damaged_index_moved_aside_is_rebuilt_from_the_files)
{
    size_t len, psize, needed;
    uint8_t *bytes = damage_fixture(&len, &psize, &needed);
    put_index(bytes, needed / 2);
    free(bytes);
    cr_assert_eq(open_in_child(0, "cut"), CTXS_EINDEX);
    /* The way out ctxs_store_open() documents. */
    cr_assert_eq(rename(ts_path(ts_store_dir(), "index"), ts_path(ts_store_dir(), "index.damaged")),
                 0);
    ctxs_store *st = NULL;
    cr_assert_eq(ctxs_store_open(&st, ts_store_dir(), CTXS_STORE_CREATE, NULL), 0);
    ctxs_session_entry *list;
    size_t n;
    cr_assert_eq(ctxs_store_session_list(&list, &n, st), 0);
    cr_assert_eq(n, 6);
    ctxs_session_entry e;
    cr_assert_eq(ctxs_store_session_get(&e, st, "chat-5"), 0);
    cr_assert_eq(e.n_tokens, 130 + 40 * 5);
    ctxs_free(list);
    ctxs_store_close(st);
}

/* --- ctxs_store_check ------------------------------------------ */

static int has_problem(const ctxs_store_check_result *r, const char *table, const char *key)
{
    for (size_t i = 0; i < r->n_listed; i++)
        if (strcmp(r->problems[i].table, table) == 0 && strcmp(r->problems[i].key, key) == 0)
            return 1;
    return 0;
}

Test(index, check_reports_every_malformed_record_of_every_table_and_goes_on)
{
    ctxs_model m = ts_model(1);
    ctxs_store *st = store_with(&m);
    ctxs_session *s = mk(st, "chat", &m, 256, 4, 70);
    cr_assert_eq(ctxs_checkpoint_create(s, "t1"), 0);
    ctxs_session_close(s);
    ctxs_session_close(mk(st, "notes", &m, 256, 4, 3));
    cr_assert_eq(ctxs_store_session_set_meta(st, "chat", "title", "hi", 2), 0);
    cr_assert_eq(ctxs_store_session_set_pinned(st, "chat", 1), 0);

    ctxs_store_check_result r;
    cr_assert_eq(ctxs_store_check(&r, st), 0);
    cr_assert_eq(r.n_problems, 0);
    cr_assert_null(r.problems);
    /* format, next_id, 2 sessions, 2 ids, a model, a checkpoint, a meta
     * row, a pin, a prefix and a chunk of chat's first 64 tokens */
    cr_assert_geq(r.records, 12, "%" PRIu64 " records", r.records);
    ctxs_store_close(st);

    /* One malformed record in every table, several in one. */
    MDB_env *env = raw_env();
    uint8_t id1[8], id9[8], big[96] = {0}, k[16];
    be_key(id1, 1);
    be_key(id9, 9);
    raw_put(env, "sessions", "chat", 4, big, 95);
    raw_put(env, "sessions", "a/b", 3, big, 96);           /* not a name, id 0 */
    raw_put(env, "ids", id9, 8, "ghost", 5);                 /* names no session */
    memset(k, 0xab, 16);
    raw_put(env, "models", k, 16, big, 47);
    raw_put(env, "filehash", k, 16, big, 16);
    uint8_t cpk[10];
    memcpy(cpk, id1, 8), memcpy(cpk + 8, "t1", 2);
    raw_put(env, "checkpoints", cpk, 10, big, 25);
    raw_put(env, "metadata", id1, 8, "v", 1);
    raw_put(env, "pins", id1, 8, "x", 1);
    raw_put(env, "chunks", id9, 8, big, 16);
    raw_put(env, "pending", id9, 8, "Z", 1);
    uint64_t zero = 0;
    raw_put(env, "meta", "next_id", 7, &zero, 8);
    mdb_env_close(env);

    cr_assert_eq(ctxs_store_open(&st, ts_store_dir(), CTXS_RDONLY, NULL), 0);
    cr_assert_eq(ctxs_store_check(&r, st), CTXS_EINDEX);
    const char *want[][2] = {
        {"sessions", "'chat'"}, {"sessions", "'a/b'"}, {"ids", "id 9"},
        {"models", "0xabababababababababababababababab"}, {"filehash", "0xabababababababababababababababab"},
        {"checkpoints", "id 1, 't1'"}, {"metadata", "id 1"}, {"pins", "id 1"},
        {"chunks", "id 9"}, {"pending", "id 9"}, {"meta", "'next_id'"},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        cr_expect(has_problem(&r, want[i][0], want[i][1]), "no problem in %s %s", want[i][0],
                  want[i][1]);
    for (size_t i = 0; i < r.n_listed; i++)
        cr_log_info("%s %s: %s", r.problems[i].table, r.problems[i].key, r.problems[i].what);
    cr_assert_eq(r.n_listed, r.n_problems);
    cr_assert_geq(r.n_problems, sizeof(want) / sizeof(want[0]));
    for (size_t i = 0; i < r.n_listed; i++)
        cr_assert_gt(strlen(r.problems[i].what), 0);
    ctxs_free(r.problems);
    /* What a reader of those records says. */
    ctxs_session_entry e;
    cr_assert_eq(ctxs_store_session_get(&e, st, "chat"), CTXS_EINDEX);
    ctxs_session_entry *list;
    size_t n;
    cr_assert_eq(ctxs_store_session_list(&list, &n, st), CTXS_EINDEX);
    cr_assert_eq(ctxs_store_check(NULL, st), CTXS_EINVAL);
    ctxs_store_close(st);
}

Test(index, check_lists_the_first_problems_and_counts_them_all)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_store_close(st);
    MDB_env *env = raw_env();
    MDB_txn *txn;
    MDB_dbi dbi;
    cr_assert_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, "pins", 0, &dbi), 0);
    size_t many = CTXS_CHECK_MAX_PROBLEMS + 100;
    for (size_t i = 1; i <= many; i++) {
        uint8_t idk[8];
        be_key(idk, i);
        MDB_val key = {8, idk}, val = {1, "x"};
        cr_assert_eq(mdb_put(txn, dbi, &key, &val, 0), 0);
    }
    cr_assert_eq(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
    st = ts_store_open(ts_store_dir());
    ctxs_store_check_result r;
    cr_assert_eq(ctxs_store_check(&r, st), CTXS_EINDEX);
    cr_assert_eq(r.n_problems, many + 1, "%" PRIu64, r.n_problems); /* and next_id */
    cr_assert_eq(r.n_listed, CTXS_CHECK_MAX_PROBLEMS);
    cr_assert_str_eq(r.problems[0].key, "'next_id'"); /* meta is read first */
    cr_assert_str_eq(r.problems[1].key, "id 1");
    ctxs_free(r.problems);
    ctxs_store_close(st);
}

/* --- A store reached through a symlink -------------------------- */

Test(index, a_store_through_a_symlink_or_two_is_the_store_and_a_dangling_one_is_enoent)
{
    ctxs_store *a = ts_store_open(ts_store_dir());
    ctxs_model m = ts_model(1);
    model_reg(a, &m);
    ctxs_session_close(mk(a, "chat", &m, 64, 4, 5));
    char l1[1100], l2[1100], dang[1100], loop[1100], target[1100], newdir[1100], l3[1100];
    snprintf(l1, sizeof(l1), "%s/link", ts_scratch);
    snprintf(l2, sizeof(l2), "%s/link2", ts_scratch);
    snprintf(dang, sizeof(dang), "%s/dangling", ts_scratch);
    snprintf(target, sizeof(target), "%s/nowhere", ts_scratch);
    snprintf(loop, sizeof(loop), "%s/loop", ts_scratch);
    snprintf(newdir, sizeof(newdir), "%s/empty", ts_scratch);
    snprintf(l3, sizeof(l3), "%s/link-to-empty", ts_scratch);
    cr_assert_eq(symlink(ts_store_dir(), l1), 0);
    cr_assert_eq(symlink(l1, l2), 0);
    cr_assert_eq(symlink(target, dang), 0);
    cr_assert_eq(symlink(loop, loop), 0);

    /* Through one link and through two, with and without CREATE: the same
     * store, one handle (one LMDB environment per store per process). */
    const char *paths[] = {l1, l2};
    for (int i = 0; i < 2; i++) {
        for (int create = 0; create < 2; create++) {
            ctxs_store *b;
            int rc = ctxs_store_open(&b, paths[i], create ? CTXS_STORE_CREATE : 0, NULL);
            cr_assert_eq(rc, 0, "%s%s: %s", paths[i], create ? " (create)" : "",
                         ctxs_err_name(rc));
            cr_assert_eq(b, a, "%s is another handle", paths[i]);
            cr_assert_eq(ts_session_entry(b, "chat").n_tokens, 5);
            ctxs_store_close(b);
        }
    }
    ctxs_store_close(a);
    /* The store closed: a handle through the link works on its own. */
    ctxs_store *b;
    cr_assert_eq(ctxs_store_open(&b, l2, 0, NULL), 0);
    ctxs_session_close(mk(b, "via-link", &m, 64, 4, 3));
    ctxs_store_close(b);
    a = ts_store_open(ts_store_dir());
    cr_assert_eq(ts_session_entry(a, "via-link").n_tokens, 3);
    ctxs_store_close(a);

    /* A new store through a link to an empty directory is made there. */
    cr_assert_eq(mkdir(newdir, 0700), 0);
    cr_assert_eq(symlink(newdir, l3), 0);
    cr_assert_eq(ctxs_store_open(&b, l3, CTXS_STORE_CREATE, NULL), 0);
    ctxs_store_close(b);
    cr_assert(ts_exists(ts_path(newdir, "index/data.mdb")));

    /* A dangling link: -ENOENT, and nothing is made at its far end. */
    cr_assert_eq(ctxs_store_open(&b, dang, 0, NULL), -ENOENT);
    cr_assert_null(b);
    cr_assert_eq(ctxs_store_open(&b, dang, CTXS_STORE_CREATE, NULL), -ENOENT);
    cr_assert_eq(ctxs_store_open(&b, dang, CTXS_RDONLY, NULL), -ENOENT);
    cr_assert_not(ts_exists(target), "a store was made at the end of a dangling link");
    /* A loop: -ELOOP. */
    cr_assert_eq(ctxs_store_open(&b, loop, 0, NULL), -ELOOP);
    cr_assert_eq(ctxs_store_open(&b, loop, CTXS_STORE_CREATE, NULL), -ELOOP);
}
