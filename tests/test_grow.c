/*
 * Growing a session's capacity: every token, checksum, checkpoint and
 * metadata value kept in a file of more slots, the old file replaced only
 * once the new one is complete, so that a process killed at any step
 * loses nothing.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctxstore.h"
#include "internal.h"
#include "support.h"

TestSuite(grow, .init = ts_scratch_init, .fini = ts_scratch_fini, .timeout = 120);

/* A store with "chat": capacity 64, no ring, 60 tokens, a checkpoint at 30
 * and a metadata value. */
static ctxs_store *full_chat(ctxs_model *m)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    *m = ts_model(4);
    cr_assert_eq(ctxs_model_register(st, m, "m"), 0);
    ctxs_create_options o = ts_options(64, 4, 0, CTXS_SYNC_ASYNC);
    ctxs_session *s;
    cr_assert_eq(ctxs_store_session_create(&s, st, "chat", m, &o), 0);
    cr_assert_eq(ts_append(s, 30), 0);
    cr_assert_eq(ctxs_checkpoint_create(s, "half"), 0);
    cr_assert_eq(ts_append(s, 30), 0);
    ctxs_reservation r;
    cr_assert_eq(ctxs_session_reserve(&r, s, 5), CTXS_EFULL);
    ctxs_session_close(s);
    cr_assert_eq(ctxs_store_session_set_meta(st, "chat", "title", "hello", 5), 0);
    return st;
}

/* "chat" holds its 60 tokens, as written, in capacity slots. */
static void holds_chat(ctxs_store *st, const ctxs_model *m, uint32_t capacity)
{
    ctxs_session *s;
    int rc = ctxs_store_session_open(&s, st, "chat", m, 0, NULL);
    cr_assert_eq(rc, 0, "open: %s", ctxs_get_last_error());
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(info.capacity, capacity);
    cr_assert_eq(info.n_tokens, 60);
    cr_assert_eq(ctxs_session_verify(NULL, s), 0);
    cr_assert_eq(ts_check_all(s), 0);
    ctxs_session_close(s);
}

Test(grow, a_full_session_grows_and_keeps_everything)
{
    ctxs_model m;
    ctxs_store *st = full_chat(&m);
    uint64_t id = ts_session_entry(st, "chat").id;
    int rc = ctxs_store_session_grow(st, "chat", 1000);
    cr_assert_eq(rc, 0, "grow: %s", ctxs_get_last_error());
    cr_assert_eq(ts_session_entry(st, "chat").id, id, "the same session, its file replaced");
    holds_chat(st, &m, 1000);

    ctxs_session *s;
    cr_assert_eq(ctxs_store_session_open(&s, st, "chat", &m, 0, NULL), 0);
    /* It takes more tokens now, and its checkpoint still restores. */
    cr_assert_eq(ts_append(s, 900), 0);
    cr_assert_eq(ts_n_tokens(s), 960);
    cr_assert_eq(ts_check_all(s), 0);
    cr_assert_eq(ctxs_checkpoint_restore(s, "half"), 0);
    cr_assert_eq(ts_n_tokens(s), 30);
    cr_assert_eq(ctxs_session_verify(NULL, s), 0);
    ctxs_session_close(s);
    char value[16] = {0};
    size_t len = sizeof(value);
    cr_assert_eq(ctxs_store_session_get_meta(value, &len, st, "chat", "title"), 0);
    cr_assert(len == 5 && memcmp(value, "hello", 5) == 0);
    /* The label still names it: an index rebuilt from the files finds it. */
    ctxs_store_close(st);
    ts_rmtree(ts_path(ts_store_dir(), "index"));
    st = ts_store_open(ts_store_dir());
    cr_assert_eq(ts_session_entry(st, "chat").id, id);
    ctxs_store_close(st);
}

Test(grow, what_cannot_grow_is_refused_and_left_as_it_was)
{
    ctxs_model m;
    ctxs_store *st = full_chat(&m);
    cr_assert_eq(ctxs_store_session_grow(st, "chat", 64), CTXS_EINVAL);
    cr_assert(strstr(ctxs_get_last_error(), "does not grow"), "%s", ctxs_get_last_error());
    cr_assert_eq(ctxs_store_session_grow(st, "chat", 32), CTXS_EINVAL);
    cr_assert_eq(ctxs_store_session_grow(st, "chat", (16u << 20) + 1), CTXS_EINVAL);
    cr_assert_eq(ctxs_store_session_grow(st, "nothing", 128), CTXS_ENOTFOUND);
    ctxs_session *s;
    cr_assert_eq(ctxs_store_session_open(&s, st, "chat", &m, CTXS_RDONLY, NULL), 0);
    cr_assert_eq(ctxs_store_session_grow(st, "chat", 128), CTXS_EBUSY);
    ctxs_session_close(s);
    cr_assert_eq(ctxs_store_session_open(&s, st, "chat", &m, 0, NULL), 0);
    cr_assert_eq(ctxs_store_session_grow(st, "chat", 128), CTXS_EBUSY);
    cr_assert(strstr(ctxs_get_last_error(), "close it"), "%s", ctxs_get_last_error());
    ctxs_session_close(s);
    holds_chat(st, &m, 64);

    /* A ring that went round: its slots are not its positions. */
    ctxs_create_options o = ts_options(16, 2, 1, CTXS_SYNC_ASYNC);
    cr_assert_eq(ctxs_store_session_create(&s, st, "ring", &m, &o), 0);
    cr_assert_eq(ts_append(s, 10), 0);
    cr_assert_eq(ts_append(s, 10), 0);
    ctxs_session_close(s);
    cr_assert_eq(ctxs_store_session_grow(st, "ring", 64), CTXS_EINVAL);
    cr_assert(strstr(ctxs_get_last_error(), "gone round"), "%s", ctxs_get_last_error());
    /* One that did not can grow, and stays a ring. */
    cr_assert_eq(ctxs_store_session_create(&s, st, "ring2", &m, &o), 0);
    cr_assert_eq(ts_append(s, 10), 0);
    ctxs_session_close(s);
    cr_assert_eq(ctxs_store_session_grow(st, "ring2", 64), 0);
    cr_assert_eq(ctxs_store_session_open(&s, st, "ring2", &m, 0, NULL), 0);
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert(info.flags & CTXS_INFO_RING);
    cr_assert_eq(info.capacity, 64);
    cr_assert_eq(ts_check_all(s), 0);
    ctxs_session_close(s);
    ctxs_store_close(st);

    cr_assert_eq(ctxs_store_open(&st, ts_store_dir(), CTXS_RDONLY, NULL), 0);
    cr_assert_eq(ctxs_store_session_grow(st, "chat", 128), CTXS_EREADONLY);
    ctxs_store_close(st);
}

/* A windowed layer that its session lays out over every slot (its window
 * and batch do not fit beside the sinks) would need a ring of its own in a
 * larger file, which a grow does not build: refused, with how far it can
 * grow, and a grow that far keeps every token. */
Test(grow, windowed_layers_over_every_slot_grow_only_as_far_as_they_stay_so)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_model m = ts_model(5);
    m.geometry.period = 2;
    m.geometry.window[0] = 40;
    cr_assert_eq(ctxs_model_register(st, &m, "w"), 0);
    ctxs_create_options o = ts_options(32, 2, 0, CTXS_SYNC_ASYNC);
    o.batch = 8;
    ctxs_session *s;
    cr_assert_eq(ctxs_store_session_create(&s, st, "w", &m, &o), 0);
    cr_assert_eq(ts_append(s, 30), 0);
    ctxs_session_close(s);

    /* A ring of 40 + 8 slots fits beside 2 sinks from 50 slots on. */
    cr_assert_eq(ctxs_store_session_grow(st, "w", 50), CTXS_EINVAL);
    cr_assert(strstr(ctxs_get_last_error(), "at most 49 slots"), "%s", ctxs_get_last_error());
    cr_assert_eq(ctxs_store_session_grow(st, "w", 49), 0, "%s", ctxs_get_last_error());
    cr_assert_eq(ctxs_store_session_open(&s, st, "w", &m, 0, NULL), 0);
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(info.capacity, 49);
    cr_assert_eq(info.n_tokens, 30);
    cr_assert_eq(ctxs_session_verify(NULL, s), 0);
    cr_assert_eq(ts_check_all(s), 0);
    ctxs_session_close(s);
    ctxs_store_close(st);
}

static int grows_under_the_open;

/* The open's hook: the first time, a grow replaces the file it found (the
 * grow's own open runs the hook too, and is left alone). */
static void grow_under_the_open(const char *path)
{
    uint64_t disk_bytes;
    if (grows_under_the_open++ == 0)
        cr_assert_eq(ctxs__session_grow(path, 128, &disk_bytes), 0, "grow: %s",
                     ctxs_get_last_error());
}

/* An open that found the file just before a grow renamed a new one over it,
 * and locks it after the grow let go: it must end up on the file the path
 * names, or every commit it makes goes into a file nobody finds again. */
Test(grow, an_open_that_found_the_replaced_file_holds_the_new_one)
{
    ctxs_model m = ts_model(6);
    ctxs_create_options o = ts_options(64, 4, 0, CTXS_SYNC_ASYNC);
    const char *path = ts_path(ts_scratch, "race.ctxs");
    ctxs_session *s;
    cr_assert_eq(ctxs_session_create(&s, path, &m, &o), 0);
    cr_assert_eq(ts_append(s, 20), 0);
    ctxs_session_close(s);

    ctxs__open_hook = grow_under_the_open;
    int rc = ctxs_session_open(&s, path, &m, 0, NULL);
    ctxs__open_hook = NULL;
    cr_assert_eq(rc, 0, "open: %s", ctxs_get_last_error());
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(info.capacity, 128, "the open holds the replaced file");
    cr_assert_eq(ts_append(s, 50), 0, "%s", ctxs_get_last_error());
    ctxs_session_close(s);

    cr_assert_eq(ctxs_session_open(&s, path, &m, 0, NULL), 0);
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(info.n_tokens, 70);
    cr_assert_eq(ctxs_session_verify(NULL, s), 0);
    cr_assert_eq(ts_check_all(s), 0);
    ctxs_session_close(s);
}

static void die(int step)
{
    static int at;
    if (!at)
        at = atoi(getenv("CTXS_GROW_DIE_AT"));
    if (step == at)
        raise(SIGKILL);
}

/* Files in sessions/ whose name has ".tmp-" in it. */
static int leftovers(void)
{
    DIR *d = opendir(ts_path(ts_store_dir(), "sessions"));
    cr_assert(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        n += strstr(de->d_name, ".tmp-") != NULL;
    closedir(d);
    return n;
}

/* Killed at each step, the grow leaves the old file or the new one, each
 * holding every token; the next repair removes what it wrote aside, and a
 * grow again succeeds. */
Test(grow, a_grow_killed_at_any_step_loses_nothing)
{
    const int steps[] = {CTXS__GROW_COPIED, CTXS__GROW_LINKED, CTXS__GROW_RENAMED};
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        ctxs_model m;
        ctxs_store *st = full_chat(&m);
        ctxs_store_close(st);
        pid_t pid = fork();
        cr_assert(pid >= 0);
        if (pid == 0) {
            /* The child calls no criterion: it only grows and dies. */
            char at[16];
            snprintf(at, sizeof(at), "%d", steps[i]);
            setenv("CTXS_GROW_DIE_AT", at, 1);
            ctxs__grow_hook = die;
            ctxs_store *cst;
            if (ctxs_store_open(&cst, ts_store_dir(), 0, NULL) != 0)
                _exit(2);
            ctxs_store_session_grow(cst, "chat", 512);
            _exit(3);
        }
        int status;
        cr_assert_eq(waitpid(pid, &status, 0), pid);
        cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "step %d: status %d",
                  steps[i], status);
        st = ts_store_open(ts_store_dir());
        holds_chat(st, &m, steps[i] == CTXS__GROW_RENAMED ? 512 : 64);
        ctxs_store_repair_result rr;
        cr_assert_eq(ctxs_store_repair(&rr, st), 0);
        cr_assert_eq(leftovers(), 0, "step %d", steps[i]);
        int rc = ctxs_store_session_grow(st, "chat", 1024);
        cr_assert_eq(rc, 0, "step %d: %s", steps[i], ctxs_get_last_error());
        holds_chat(st, &m, 1024);
        cr_assert_eq(ctxs_store_session_delete(st, "chat"), 0);
        ctxs_store_close(st);
        ts_rmtree(ts_store_dir());
    }
}
