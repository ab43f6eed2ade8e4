/*
 * The store's files by path (src/index/files.c): where a session's file
 * is, and the files of sessions/ that no index entry names, each with
 * whether compact and reindex would adopt it, on real stores and files.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctxstore.h"
#include "support.h"

TestSuite(files, .init = ts_scratch_init, .fini = ts_scratch_fini, .timeout = 60);

/* Creates name with n tokens in st and closes it; returns its id. */
static uint64_t mk(ctxs_store *st, const char *name, const ctxs_model *m, uint32_t n)
{
    ctxs_create_options o = ts_options(256, 4, 0, CTXS_SYNC_NONE);
    ctxs_session *s = NULL;
    int rc = ctxs_store_session_create(&s, st, name, m, &o);
    cr_assert_eq(rc, 0, "create %s: %s", name, ctxs_err_name(rc));
    if (n)
        cr_assert_eq(ts_append(s, n), 0);
    ctxs_session_close(s);
    return ts_session_entry(st, name).id;
}

static const ctxs_store_file *find(const ctxs_store_file *l, size_t n, const char *file)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(l[i].file, file) == 0)
            return &l[i];
    return NULL;
}

Test(files, session_path_is_the_file_the_session_lives_in)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_model m = ts_model(1);
    cr_assert_eq(ctxs_model_register(st, &m, NULL), 0);
    uint64_t id = mk(st, "chat", &m, 10);
    char path[4096];
    cr_assert_eq(ctxs_store_session_get_path(path, sizeof(path), ts_store_dir(), id), 0);
    cr_assert_str_eq(path, ts_id_path(id));
    ctxs_session *s = NULL;
    cr_assert_eq(ctxs_session_open(&s, path, &m, CTXS_RDONLY, NULL), 0,
                 "the path opens as the session");
    cr_assert_eq(ts_n_tokens(s), 10);
    ctxs_session_close(s);
    /* As dir is given: a relative dir stays relative. */
    cr_assert_eq(ctxs_store_session_get_path(path, sizeof(path), "rel/store", 0xabcULL), 0);
    cr_assert_str_eq(path, "rel/store/sessions/0000000000000abc.ctxs");
    ctxs_store_close(st);
}

Test(files, session_path_refuses_what_does_not_fit)
{
    char path[40];
    cr_assert_eq(ctxs_store_session_get_path(path, sizeof(path), "/a/store/that/is/long", 1),
                 -ENAMETOOLONG);
    cr_assert_str_eq(path, "");
    cr_assert_eq(ctxs_store_session_get_path(NULL, 10, "d", 1), CTXS_EINVAL);
    cr_assert_eq(ctxs_store_session_get_path(path, 0, "d", 1), CTXS_EINVAL);
    /* Without dir: the path inside the store. */
    cr_assert_eq(ctxs_store_session_get_path(path, sizeof(path), NULL, 0x1f), 0);
    cr_assert_str_eq(path, "sessions/000000000000001f.ctxs");
}

Test(files, lists_only_what_the_index_does_not_name)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_model m = ts_model(2);
    cr_assert_eq(ctxs_model_register(st, &m, NULL), 0);
    uint64_t a = mk(st, "a", &m, 20);
    uint64_t b = mk(st, "b", &m, 5);
    ctxs_store_file *l = NULL;
    size_t n = 99;
    cr_assert_eq(ctxs_store_file_list(&l, &n, ts_store_dir(), st), 0);
    cr_assert_eq(n, 0, "every file is indexed");
    cr_assert_null(l);

    /* Without a store handle: every session file, each adoptable. */
    cr_assert_eq(ctxs_store_file_list(&l, &n, ts_store_dir(), NULL), 0);
    cr_assert_eq(n, 2);
    char fa[32], fb[32];
    snprintf(fa, sizeof(fa), "%016llx.ctxs", (unsigned long long)a);
    snprintf(fb, sizeof(fb), "%016llx.ctxs", (unsigned long long)b);
    const ctxs_store_file *ea = find(l, n, fa), *eb = find(l, n, fb);
    cr_assert(ea && eb);
    cr_assert_eq(ea->id, a);
    cr_assert_eq(ea->status, 0);
    cr_assert_eq(ea->regular, 1);
    cr_assert_gt(ea->disk_bytes, 0);
    cr_assert_eq(eb->status, 0);
    ctxs_free(l);

    /* A session file copied in under an id no entry has: adoptable. Text
     * named like one: not. A directory so named: not regular. Names that
     * are not a session file's are not listed. */
    size_t len;
    uint8_t *bytes = ts_read_file(ts_id_path(a), &len);
    cr_assert_not_null(bytes);
    cr_assert_eq(ts_write_file(ts_id_path(0x77), bytes, len), 0);
    free(bytes);
    const char *text = "not a session file";
    cr_assert_eq(ts_write_file(ts_id_path(0xff), text, strlen(text)), 0);
    cr_assert_eq(mkdir(ts_id_path(0x1ff), 0700), 0);
    cr_assert_eq(ts_write_file(ts_path(ts_store_dir(), "sessions/notes.txt"), "x", 1), 0);
    cr_assert_eq(ts_write_file(ts_path(ts_store_dir(), "sessions/00000000000000zz.ctxs"), "x", 1),
                 0);
    /* Upper-case hex, or a sign: a name the store never writes, and no
     * repair adopts. */
    cr_assert_eq(ts_write_file(ts_path(ts_store_dir(), "sessions/00000000000000AB.ctxs"), "x", 1),
                 0);
    cr_assert_eq(ts_write_file(ts_path(ts_store_dir(), "sessions/+00000000000000a.ctxs"), "x", 1),
                 0);

    cr_assert_eq(ctxs_store_file_list(&l, &n, ts_store_dir(), st), 0);
    cr_assert_eq(n, 3, "the copy, the text and the directory, not %zu", n);
    const ctxs_store_file *copy = find(l, n, "0000000000000077.ctxs");
    const ctxs_store_file *junk = find(l, n, "00000000000000ff.ctxs");
    const ctxs_store_file *dir = find(l, n, "00000000000001ff.ctxs");
    cr_assert(copy && junk && dir);
    cr_assert_eq(copy->id, 0x77);
    cr_assert_eq(copy->status, 0, "a whole session file is adopted");
    cr_assert_eq(junk->id, 0xff);
    cr_assert_eq(junk->regular, 1);
    cr_assert_lt(junk->status, 0, "text does not open");
    ctxs_file_report rep;
    cr_assert_eq(ctxs_file_inspect(&rep, ts_id_path(0xff)), 0);
    cr_assert_eq(junk->status, rep.status, "the status inspect gives");
    cr_assert_eq(dir->regular, 0);
    cr_assert_eq(dir->disk_bytes, 0);
    cr_assert_eq(dir->status, -EISDIR);
    ctxs_free(l);

    ctxs_store_close(st);
}

Test(files, a_store_without_sessions_dir_has_none)
{
    ctxs_store_file *l = (ctxs_store_file *)1;
    size_t n = 5;
    cr_assert_eq(ctxs_store_file_list(&l, &n, ts_path(ts_scratch, "nothing-here"), NULL), 0);
    cr_assert_eq(n, 0);
    cr_assert_null(l);
    cr_assert_eq(ctxs_store_file_list(NULL, &n, ts_scratch, NULL), CTXS_EINVAL);
    cr_assert_eq(ctxs_store_file_list(&l, &n, NULL, NULL), CTXS_EINVAL);
}
