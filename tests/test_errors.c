/*
 * Why a call failed: the calling thread's last error (ctxs_get_last_error()),
 * for every refusal a program meets when it gets an argument or the store
 * wrong, and the codes a program branches on (a model the store does not
 * know, a taken name).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support.h"

TestSuite(errors, .init = ts_scratch_init, .fini = ts_scratch_fini, .timeout = 120);

/* rc is want, and the reason names every one of the words given. */
#define EXPECT_WHY(rc, want, ...)                                                         \
    do {                                                                                 \
        int rc_ = (rc);                                                                  \
        cr_assert_eq(rc_, (want), "%s: %s (%s)", #rc, ctxs_err_name(rc_),                \
                     ctxs_get_last_error());                                             \
        cr_assert_eq(ctxs_get_last_error_code(), rc_, "the reason's code, for %s: %s",  \
                     #rc, ctxs_get_last_error());                                        \
        const char *words_[] = { __VA_ARGS__, NULL };                                    \
        for (int w_ = 0; words_[w_]; w_++)                                               \
            cr_assert(strstr(ctxs_get_last_error(), words_[w_]), "%s: '%s' not in '%s'", \
                      #rc, words_[w_], ctxs_get_last_error());                           \
    } while (0)

static const char *session_path(void)
{
    return ts_path(ts_scratch, "s.ctxs");
}

static ctxs_session *create_session(uint32_t capacity, uint32_t n_tokens)
{
    ctxs_model m = ts_model(1);
    ctxs_create_options o = ts_options(capacity, 4, 0, CTXS_SYNC_NONE);
    ctxs_session *s = NULL;
    int rc = ctxs_session_create(&s, session_path(), &m, &o);
    cr_assert_eq(rc, 0, "create: %s", ctxs_get_last_error());
    if (n_tokens)
        cr_assert_eq(ts_append(s, n_tokens), 0);
    return s;
}

Test(errors, options_without_a_version_say_which_init_to_start_from)
{
    ctxs_session_close(create_session(64, 0));
    ctxs_model m = ts_model(1);
    ctxs_open_options oo;
    memset(&oo, 0, sizeof(oo));
    ctxs_session *s = (ctxs_session *)1;
    EXPECT_WHY(ctxs_session_open(&s, session_path(), &m, 0, &oo), CTXS_EINVAL,
               "version is 0", "CTXS_OPEN_OPTIONS_INIT");
    cr_assert_null(s);
    ctxs_create_options co;
    memset(&co, 0, sizeof(co));
    EXPECT_WHY(ctxs_session_create(&s, ts_path(ts_scratch, "t.ctxs"), &m, &co), CTXS_EINVAL,
               "create options", "CTXS_CREATE_OPTIONS_INIT");
    ctxs_store_options so;
    memset(&so, 0, sizeof(so));
    ctxs_store *st = (ctxs_store *)1;
    EXPECT_WHY(ctxs_store_open(&st, ts_store_dir(), CTXS_STORE_CREATE, &so), CTXS_EINVAL,
               "store options", "CTXS_STORE_OPTIONS_INIT");
    cr_assert_null(st);
}

Test(errors, a_read_write_open_without_a_model_says_it_needs_one)
{
    ctxs_session_close(create_session(64, 0));
    ctxs_session *s;
    EXPECT_WHY(ctxs_session_open(&s, session_path(), NULL, 0, NULL), CTXS_EINVAL,
               "model is NULL", "CTXS_RDONLY");
}

Test(errors, f32_as_a_session_dtype_says_what_a_session_stores)
{
    ctxs_model m = ts_model(1);
    m.geometry.dtype = CTXS_DTYPE_F32;
    ctxs_session *s;
    EXPECT_WHY(ctxs_session_create(&s, session_path(), &m, NULL), CTXS_EINVAL,
               "CTXS_DTYPE_F32", "F16, BF16 or Q8");
    cr_assert_not(ts_exists(session_path()));
    m = ts_model(1);
    m.geometry.n_layers = 0;
    EXPECT_WHY(ctxs_session_create(&s, session_path(), &m, NULL), CTXS_EINVAL,
               "n_layers 0 is outside 1..4096");
}

Test(errors, a_commit_of_more_than_was_reserved_says_both_counts)
{
    ctxs_session *s = create_session(64, 5);
    uint32_t ids[3] = { 1, 2, 3 };
    EXPECT_WHY(ctxs_session_commit(s, ids, 3), CTXS_EINVAL, "commit of 3 tokens",
               "0 are reserved", "ctxs_session_reserve");
    EXPECT_WHY(ctxs_session_commit(s, ids, 0), CTXS_EINVAL, "n is 0");
    cr_assert_eq(ts_n_tokens(s), 5);
    ctxs_session_close(s);
}

Test(errors, a_rollback_past_the_end_says_how_many_are_held)
{
    ctxs_session *s = create_session(64, 5);
    EXPECT_WHY(ctxs_session_rollback(s, 9), CTXS_EINVAL, "9 tokens", "the 5 the session holds");
    cr_assert_eq(ts_n_tokens(s), 5);
    ctxs_session_close(s);
}

Test(errors, a_full_session_without_a_ring_says_its_capacity)
{
    ctxs_session *s = create_session(16, 14);
    ctxs_reservation r;
    EXPECT_WHY(ctxs_session_reserve(&r, s, 5), CTXS_EFULL, "capacity of 16", "no ring");
    ctxs_session_close(s);
}

Test(errors, a_read_only_handle_says_so_where_it_is_written)
{
    ctxs_session_close(create_session(64, 2));
    ctxs_session *s;
    cr_assert_eq(ctxs_session_open(&s, session_path(), NULL, CTXS_RDONLY, NULL), 0);
    ctxs_reservation r;
    EXPECT_WHY(ctxs_session_reserve(&r, s, 1), CTXS_EREADONLY, "read-only");
    void *kv;
    EXPECT_WHY(ctxs_session_get_kv(&kv, s, 7, CTXS_K, 0), CTXS_EINVAL, "layer 7 is outside 0..1");
    uint32_t ids[4];
    EXPECT_WHY(ctxs_session_get_tokens(ids, s, 1, 4), CTXS_ENOTFOUND, "past the 2 committed");
    ctxs_session_close(s);
}

Test(errors, another_model_says_what_differs)
{
    ctxs_session_close(create_session(64, 0));
    ctxs_model m = ts_model(1);
    m.geometry.head_dim = 16;
    ctxs_session *s;
    EXPECT_WHY(ctxs_session_open(&s, session_path(), &m, CTXS_RDONLY, NULL), CTXS_EMODEL,
               "head_dim is 16 here, 8 there", "s.ctxs");
}

/* A child holds the writer lock until told to go; the parent's open names
 * it. */
Test(errors, a_busy_session_names_the_process_that_holds_it)
{
    ctxs_session_close(create_session(64, 0));
    int go[2], ready[2];
    cr_assert_eq(pipe(go), 0);
    cr_assert_eq(pipe(ready), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        ctxs_model m = ts_model(1);
        ctxs_session *s;
        char b = ctxs_session_open(&s, session_path(), &m, 0, NULL) == 0 ? 'y' : 'n';
        if (write(ready[1], &b, 1) != 1 || read(go[0], &b, 1) < 0)
            _exit(1);
        _exit(0);
    }
    char b;
    cr_assert_eq(read(ready[0], &b, 1), 1);
    cr_assert_eq(b, 'y');
    ctxs_model m = ts_model(1);
    ctxs_session *s;
    char pid_text[32];
    snprintf(pid_text, sizeof(pid_text), "process %d", (int)pid);
    EXPECT_WHY(ctxs_session_open(&s, session_path(), &m, 0, NULL), CTXS_EBUSY,
               "open by another writer", pid_text);
    cr_assert_eq(write(go[1], "x", 1), 1);
    cr_assert_eq(ts_wait(pid), 0);
    cr_assert_eq(ctxs_session_open(&s, session_path(), &m, 0, NULL), 0);
    ctxs_session_close(s);
}

Test(errors, an_unregistered_model_is_enomodel_and_a_missing_session_enotfound)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_model m = ts_model(1);
    ctxs_session *s;
    EXPECT_WHY(ctxs_store_session_create(&s, st, "chat", &m, NULL), CTXS_ENOMODEL,
               "is not registered", "ctxs_model_register");
    EXPECT_WHY(ctxs_store_session_open(&s, st, "chat", &m, 0, NULL), CTXS_ENOTFOUND,
               "no session named 'chat'");
    cr_assert_neq(CTXS_ENOMODEL, CTXS_ENOTFOUND);
    ctxs_store_close(st);
}

Test(errors, a_taken_name_is_etaken_and_names_it)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_model m = ts_model(1);
    cr_assert_eq(ctxs_model_register(st, &m, "tiny"), 0);
    ctxs_create_options o = ts_options(64, 4, 0, CTXS_SYNC_NONE);
    ctxs_session *s;
    cr_assert_eq(ctxs_store_session_create(&s, st, "chat", &m, &o), 0);
    cr_assert_eq(ctxs_checkpoint_create(s, "start"), 0);
    EXPECT_WHY(ctxs_checkpoint_create(s, "start"), CTXS_ETAKEN, "checkpoint named 'start'");
    ctxs_session_close(s);
    EXPECT_WHY(ctxs_store_session_create(&s, st, "chat", &m, &o), CTXS_ETAKEN,
               "a session named 'chat' exists already");
    cr_assert_eq(ctxs_store_session_create(&s, st, "other", &m, &o), 0);
    ctxs_session_close(s);
    EXPECT_WHY(ctxs_store_session_rename(st, "other", "chat"), CTXS_ETAKEN, "'chat'");
    EXPECT_WHY(ctxs_store_session_fork(NULL, st, "other", "chat", UINT64_MAX, NULL),
               CTXS_ETAKEN, "'chat'");
    EXPECT_WHY(ctxs_store_session_create(&s, st, "a/b", &m, &o), CTXS_EINVAL,
               "'a/b' contains '/'", CTXS_NAME_RULE);
    ctxs_store_close(st);
}

/* A store (*st) with model "tiny" and a session "chat" of capacity slots
 * holding n tokens, open read-write. */
static ctxs_session *stored_chat(ctxs_store **st, uint32_t capacity, uint32_t n)
{
    *st = ts_store_open(ts_store_dir());
    ctxs_model m = ts_model(1);
    cr_assert_eq(ctxs_model_register(*st, &m, "tiny"), 0);
    ctxs_create_options o = ts_options(capacity, 4, 0, CTXS_SYNC_NONE);
    ctxs_session *s;
    cr_assert_eq(ctxs_store_session_create(&s, *st, "chat", &m, &o), 0);
    cr_assert_eq(ts_append(s, n), 0);
    return s;
}

Test(errors, a_fork_past_the_end_says_how_many_the_source_holds)
{
    ctxs_store *st;
    ctxs_session_close(stored_chat(&st, 256, 156));
    EXPECT_WHY(ctxs_store_session_fork(NULL, st, "chat", "retry", 512, NULL), CTXS_EINVAL,
               "fork of 'chat'", "512 tokens", "156 the session holds");
    EXPECT_WHY(ctxs_store_session_fork_checkpoint(NULL, st, "chat", "nope", "retry", NULL),
               CTXS_ENOTFOUND, "'chat' has no checkpoint named 'nope'");
    /* The source comes first: the new session holds the source's tokens. */
    cr_assert_eq(ctxs_store_session_fork(NULL, st, "chat", "retry", 100, NULL), 0);
    cr_assert_eq(ts_session_entry(st, "retry").n_tokens, 100);
    ctxs_store_close(st);
}

Test(errors, a_checkpoint_call_without_a_name_is_refused)
{
    ctxs_store *st;
    ctxs_session *s = stored_chat(&st, 64, 10);
    EXPECT_WHY(ctxs_checkpoint_create(s, NULL), CTXS_EINVAL, "missing (NULL)");
    EXPECT_WHY(ctxs_checkpoint_restore(s, NULL), CTXS_EINVAL, "missing (NULL)");
    EXPECT_WHY(ctxs_checkpoint_delete(s, NULL), CTXS_EINVAL, "missing (NULL)");
    /* The list takes no name. */
    ctxs_checkpoint_entry *cps = NULL;
    size_t n = 1;
    cr_assert_eq(ctxs_checkpoint_list(&cps, &n, s), 0, "%s", ctxs_get_last_error());
    cr_assert_eq(n, 0);
    ctxs_free(cps);
    ctxs_session_close(s);
    ctxs_store_close(st);
}

Test(errors, a_missing_metadata_key_is_named)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_model m = ts_model(1);
    cr_assert_eq(ctxs_model_register(st, &m, "tiny"), 0);
    ctxs_session *s;
    cr_assert_eq(ctxs_store_session_create(&s, st, "chat", &m, NULL), 0);
    ctxs_session_close(s);
    char buf[16];
    size_t n = sizeof(buf);
    EXPECT_WHY(ctxs_store_session_get_meta(buf, &n, st, "chat", "title"), CTXS_ENOTFOUND,
               "'chat' has no metadata key 'title'");
    EXPECT_WHY(ctxs_store_session_get_meta(buf, &n, st, "nobody", "title"), CTXS_ENOTFOUND,
               "no session named 'nobody'");
    ctxs_store_close(st);
}

Test(errors, a_store_that_is_not_there_or_not_a_directory_says_which)
{
    ctxs_store *st;
    EXPECT_WHY(ctxs_store_open(&st, ts_store_dir(), 0, NULL), -ENOENT, "no such store",
               "CTXS_STORE_CREATE");
    EXPECT_WHY(ctxs_store_open(&st, "", 0, NULL), CTXS_EINVAL, "an empty string");
    const char *file = ts_path(ts_scratch, "plain");
    cr_assert_eq(ts_write_file(file, "x", 1), 0);
    EXPECT_WHY(ctxs_store_open(&st, file, 0, NULL), -ENOTDIR, "is not a directory");
}

/* Each call clears the reason when it starts: what is read after a
 * success is "", never an older failure's. */
Test(errors, a_call_that_succeeds_leaves_no_reason_behind)
{
    ctxs_session *s = create_session(64, 3);
    cr_assert_eq(ctxs_session_rollback(s, 9), CTXS_EINVAL);
    cr_assert_neq(ctxs_get_last_error()[0], '\0');
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_str_eq(ctxs_get_last_error(), "");
    cr_assert_eq(ctxs_get_last_error_code(), 0);
    ctxs_session_close(s);
}

static void *fail_on_a_thread(void *arg)
{
    (void)arg;
    ctxs_store *st;
    ctxs_store_open(&st, "", 0, NULL);
    return NULL;
}

Test(errors, the_reason_belongs_to_the_thread_that_failed)
{
    ctxs_session *s = create_session(64, 3);
    cr_assert_eq(ctxs_session_rollback(s, 9), CTXS_EINVAL);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, fail_on_a_thread, NULL), 0);
    cr_assert_eq(pthread_join(t, NULL), 0);
    cr_assert(strstr(ctxs_get_last_error(), "9 tokens"), "%s", ctxs_get_last_error());
    ctxs_session_close(s);
}

Test(errors, a_library_beside_this_one_says_why_in_the_same_place)
{
    cr_assert_eq(ctxs_set_last_error(CTXS_EENGINE, "the engine's %s", "cache is quantized"),
                 CTXS_EENGINE);
    cr_assert_str_eq(ctxs_get_last_error(), "the engine's cache is quantized");
    cr_assert_eq(ctxs_get_last_error_code(), CTXS_EENGINE);
    char long_text[2000];
    memset(long_text, 'x', sizeof(long_text) - 1);
    long_text[sizeof(long_text) - 1] = '\0';
    ctxs_set_last_error(CTXS_EINVAL, "%s", long_text);
    cr_assert_eq(strlen(ctxs_get_last_error()), 511);
    ctxs_set_last_error(0, NULL);
    cr_assert_str_eq(ctxs_get_last_error(), "");
    cr_assert_eq(ctxs_get_last_error_code(), 0);
}

/* Each ctxs_*_options_init() gives what its _INIT macro gives, byte for
 * byte, and refuses NULL and a version the library does not know, saying
 * why. */
#define EXPECT_OPTIONS_INIT(type, PREFIX)                                                 \
    do {                                                                                 \
        TS_OPTIONS_INIT_CHECK(type, type##_init, PREFIX##_INIT, PREFIX##_VERSION);       \
        EXPECT_WHY(type##_init(NULL, PREFIX##_VERSION), CTXS_EINVAL, "NULL");            \
        type o_;                                                                         \
        EXPECT_WHY(type##_init(&o_, PREFIX##_VERSION + 1), CTXS_EINVAL, "not known");    \
    } while (0)

Test(errors, options_init_gives_the_macros_defaults_and_refuses_unknown_versions)
{
    EXPECT_OPTIONS_INIT(ctxs_open_options, CTXS_OPEN_OPTIONS);
    EXPECT_OPTIONS_INIT(ctxs_create_options, CTXS_CREATE_OPTIONS);
    EXPECT_OPTIONS_INIT(ctxs_watcher_options, CTXS_WATCHER_OPTIONS);
    EXPECT_OPTIONS_INIT(ctxs_store_options, CTXS_STORE_OPTIONS);
    EXPECT_OPTIONS_INIT(ctxs_remote_options, CTXS_REMOTE_OPTIONS);
}
