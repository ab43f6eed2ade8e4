/*
 * Fault injection: every store operation, run again and again with its Nth
 * system call, allocation or LMDB write failing (EIO, ENOSPC, EINTR,
 * ENOMEM; once, or from then on), for N = 1, 2, ... until the operation
 * makes fewer calls than N and completes.
 *
 * After every run, with faults off: no descriptor and no heap byte is left
 * behind; the store opens; every session verifies and holds its
 * acknowledged tokens with their bytes; no file is left that the index
 * does not name. The operation either happened whole or not at all, and if
 * not, running it again succeeds. EINTR is retried inside the library: an
 * operation interrupted anywhere must succeed as if nothing happened.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctxstore.h"
#include "support.h"
#include "aside.h"
#include "internal.h"
#include "syscall.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifdef __SANITIZE_ADDRESS__
#define UNDER_ASAN 1
#endif
#ifdef UNDER_ASAN
#include <sanitizer/lsan_interface.h>
#endif

TestSuite(faults, .init = ts_scratch_init, .fini = ts_scratch_fini, .timeout = 600);

/* 60 + 10 tokens cross the first prefix chunk (CTXS_PREFIX_CHUNK, 64):
 * commits and rollbacks across it update the index. */
#define BASE_TOKENS 60u
#define MORE_TOKENS 10u
#define FORK_TOKENS 50u
#define MAX_RUNS 20000u

/* The store an operation runs on: session "a" holds `acked` tokens and is
 * open read-write (FULL durability) unless the operation closed it. */
typedef struct world {
    char dir[1024];
    char export_path[1100];
    ctxs_store *st;
    ctxs_session *a;
    uint64_t acked;
} world;

typedef struct fault_op {
    const char *name;
    /* Builds what the operation needs beyond session "a". */
    void (*prepare)(world *w);
    /* The operation; returns its first error, or 0. Closes what it opens. */
    int (*run)(world *w);
    /* After a reopen: whether the operation's effect is there, whole (it
     * asserts that a partial effect is not). */
    bool (*happened)(world *w);
    /* Tokens of "a" that are acknowledged once run returned 0. */
    uint64_t acked_after;
    /* K/V written into the file (one pwrite per run, the way a turn goes
     * after a long pause) rather than chosen by the page cache's state,
     * so that every run makes the same calls; and its writes also made
     * short. */
    bool file_writes;
} fault_op;

/* The run being checked, for every failure message (kept off the heap:
 * the test measures it). */
static char run_context[512];

static const ctxs_model *model(void)
{
    static ctxs_model m;
    m = ts_model(7);
    return &m;
}

static ctxs_create_options options(void)
{
    return ts_options(128, 0, 0, CTXS_SYNC_FULL);
}

static int open_session(ctxs_session **out, world *w, const char *name, unsigned flags)
{
    ctxs_create_options o = options();
    return ctxs_store_session_open(out, w->st, name, model(), flags, &o.open);
}

static uint64_t tokens_of(const ctxs_session *s)
{
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0, "[%s]", run_context);
    return info.n_tokens;
}

static int open_fds(void)
{
    return ts_dir_entries("/proc/self/fd");
}

/* Removes what an export left written aside beside its file, and returns
 * how many: only a failed unlink() of that name may leave one. */
static int export_leftovers(const world *w)
{
    int n = 0;
    DIR *dir = opendir(ts_scratch);
    cr_assert_not_null(dir);
    for (struct dirent *e; (e = readdir(dir));) {
        char path[2200];
        snprintf(path, sizeof(path), "%s/%s", ts_scratch, e->d_name);
        if (strncmp(path, w->export_path, strlen(w->export_path)) == 0 &&
            strstr(e->d_name, ".tmp-")) {
            unlink(path);
            n++;
        }
    }
    closedir(dir);
    return n;
}

/* Bytes of heap in use, or 0 where that cannot be measured exactly: glibc
 * counts the chunks its per-thread cache holds as in use, so the suite
 * runs with the cache off (GLIBC_TUNABLES, tests/meson.build); under ASan,
 * LeakSanitizer checks instead (check_no_leak). */
static size_t heap_in_use(void)
{
#if defined(__GLIBC__) && !defined(UNDER_ASAN)
    const char *tunables = getenv("GLIBC_TUNABLES");
    if (tunables && strstr(tunables, "glibc.malloc.tcache_count=0"))
        return mallinfo2().uordblks;
#endif
    return 0;
}

/* Opens the store and "a" (read-write), as a process starting would. */
static void world_open(world *w)
{
    int rc = ctxs_store_open(&w->st, w->dir, CTXS_STORE_CREATE, NULL);
    cr_assert_eq(rc, 0, "store open after a fault: %s [%s]", ctxs_err_name(rc), run_context);
    rc = open_session(&w->a, w, "a", 0);
    cr_assert_eq(rc, 0, "\"a\" open after a fault: %s [%s]", ctxs_err_name(rc), run_context);
}

static void world_close(world *w)
{
    ctxs_session_close(w->a);
    w->a = NULL;
    ctxs_store_close(w->st);
    w->st = NULL;
}

static void world_make(world *w, const fault_op *op)
{
    snprintf(w->dir, sizeof(w->dir), "%s/store", ts_scratch);
    snprintf(w->export_path, sizeof(w->export_path), "%s/a.ctxs-export", ts_scratch);
    ts_rmtree(w->dir);
    unlink(w->export_path);
    cr_assert_eq(ctxs_store_open(&w->st, w->dir, CTXS_STORE_CREATE, NULL), 0, "[%s]", run_context);
    cr_assert_eq(ctxs_model_register(w->st, model(), "faults"), 0, "[%s]", run_context);
    ctxs_create_options o = options();
    cr_assert_eq(ctxs_store_session_create(&w->a, w->st, "a", model(), &o), 0, "[%s]", run_context);
    ts_append_many(w->a, BASE_TOKENS);
    w->acked = BASE_TOKENS;
    if (op->prepare)
        op->prepare(w);
}

/* Session `name` verifies and reads back as written; returns its tokens. */
static uint64_t check_session(world *w, const char *name)
{
    ctxs_session *s = NULL;
    int rc = open_session(&s, w, name, CTXS_RDONLY);
    cr_assert_eq(rc, 0, "open \"%s\": %s [%s]", name, ctxs_err_name(rc), run_context);
    uint64_t bad = 0;
    rc = ctxs_session_verify(&bad, s);
    cr_assert_eq(rc, 0, "\"%s\" does not verify (%s at %llu) [%s]", name, ctxs_err_name(rc),
                 (unsigned long long)bad, run_context);
    cr_assert_eq(ts_check_all(s), 0, "\"%s\" reads back wrong [%s]", name, run_context);
    uint64_t n = tokens_of(s);
    ctxs_session_close(s);
    return n;
}

static bool session_exists(world *w, const char *name)
{
    ctxs_session_entry e;
    int rc = ctxs_store_session_get(&e, w->st, name);
    cr_assert(rc == 0 || rc == CTXS_ENOTFOUND, "get \"%s\": %s [%s]", name, ctxs_err_name(rc),
              run_context);
    return rc == 0;
}

/* Every session verifies, "a" holds every acknowledged token, and every
 * file in sessions/ is one the index names. */
static void check_store(world *w)
{
    ctxs_session_entry *list = NULL;
    size_t n = 0;
    cr_assert_eq(ctxs_store_session_list(&list, &n, w->st), 0, "[%s]", run_context);
    for (size_t i = 0; i < n; i++)
        check_session(w, list[i].name);
    ctxs_free(list);
    uint64_t held = check_session(w, "a");
    cr_assert_geq(held, w->acked, "\"a\" lost acknowledged tokens: holds %llu of %llu [%s]",
                  (unsigned long long)held, (unsigned long long)w->acked, run_context);
    /* Session files that no entry names would be sessions a failed
     * operation left half made. Files written aside (".tmp-") may stay
     * where their cleanup itself failed; repair removes them. */
    char sessions_dir[1100];
    snprintf(sessions_dir, sizeof(sessions_dir), "%s/sessions", w->dir);
    size_t files = 0, aside = 0;
    DIR *dir = opendir(sessions_dir);
    cr_assert_not_null(dir, "[%s]", run_context);
    for (struct dirent *e; (e = readdir(dir));) {
        files += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
        aside += strstr(e->d_name, ".tmp-") != NULL;
    }
    closedir(dir);
    cr_assert_eq(files - aside, n, "%zu session files for %zu sessions [%s]", files - aside, n,
                 run_context);
    ctxs_store_repair_result repaired;
    cr_assert_eq(ctxs_store_repair(&repaired, w->st), 0, "[%s]", run_context);
    cr_assert_eq(repaired.files_removed, aside, "[%s]", run_context);
    cr_assert_eq(repaired.files_adopted + repaired.entries_removed, 0,
                 "index and files disagree after a reopen [%s]", run_context);
    cr_assert_eq(ts_dir_entries(sessions_dir), (int)n, "[%s]", run_context);
}

/* --- The operations ------------------------------------------------------- */

static int run_create(world *w)
{
    ctxs_session *b = NULL;
    ctxs_create_options o = options();
    int rc = ctxs_store_session_create(&b, w->st, "b", model(), &o);
    ctxs_session_close(b);
    return rc;
}

static bool happened_create(world *w)
{
    if (!session_exists(w, "b"))
        return false;
    cr_assert_eq(check_session(w, "b"), 0, "[%s]", run_context);
    return true;
}

static int run_commit(world *w)
{
    return ts_append(w->a, MORE_TOKENS);
}

static int run_write_layer(world *w)
{
    return ts_append_layers(w->a, MORE_TOKENS);
}

/* Whether "a" holds the MORE_TOKENS past BASE_TOKENS; it holds one or the
 * other, never something between. */
static bool holds_more(world *w)
{
    uint64_t n = tokens_of(w->a);
    cr_assert(n == BASE_TOKENS || n == BASE_TOKENS + MORE_TOKENS, "\"a\" holds %llu tokens [%s]",
              (unsigned long long)n, run_context);
    return n == BASE_TOKENS + MORE_TOKENS;
}

static bool happened_commit(world *w)
{
    return holds_more(w);
}

/* The tokens past BASE_TOKENS are the ones the rollback is asked to drop:
 * acknowledged, but not lost if they go, whatever the rollback returns. */
static void prepare_rollback(world *w)
{
    ts_append_many(w->a, MORE_TOKENS);
}

static int run_rollback(world *w)
{
    return ctxs_session_rollback(w->a, BASE_TOKENS);
}

static bool happened_rollback(world *w)
{
    return !holds_more(w);
}

static int run_checkpoint(world *w)
{
    return ctxs_checkpoint_create(w->a, "cp");
}

static bool happened_checkpoint(world *w)
{
    ctxs_checkpoint_entry *list = NULL;
    size_t n = 0;
    cr_assert_eq(ts_checkpoint_list(&list, &n, w->st, "a"), 0, "[%s]", run_context);
    bool found = n == 1 && strcmp(list[0].name, "cp") == 0;
    if (found)
        cr_assert_eq(list[0].n_tokens, BASE_TOKENS, "[%s]", run_context);
    cr_assert_eq(n, found ? 1u : 0u, "a checkpoint that was not asked for [%s]", run_context);
    ctxs_free(list);
    if (found) {
        ctxs_session *f = NULL;
        int rc = ctxs_store_session_fork_checkpoint(&f, w->st, "a", "cp", "from-cp", NULL);
        cr_assert_eq(rc, 0, "fork of the checkpoint: %s [%s]", ctxs_err_name(rc), run_context);
        cr_assert_eq(tokens_of(f), BASE_TOKENS, "[%s]", run_context);
        cr_assert_eq(ts_check_all(f), 0, "[%s]", run_context);
        ctxs_session_close(f);
        cr_assert_eq(ctxs_store_session_delete(w->st, "from-cp"), 0, "[%s]", run_context);
    }
    return found;
}

static int run_fork(world *w)
{
    ctxs_session *f = NULL;
    int rc = ctxs_store_session_fork(&f, w->st, "a", "f", FORK_TOKENS, NULL);
    ctxs_session_close(f);
    return rc;
}

static bool happened_fork(world *w)
{
    if (!session_exists(w, "f"))
        return false;
    cr_assert_eq(check_session(w, "f"), FORK_TOKENS, "[%s]", run_context);
    return true;
}

static void prepare_gc(world *w)
{
    ctxs_create_options o = options();
    const char *names[] = {"b", "c"};
    for (int i = 0; i < 2; i++) {
        ctxs_session *s = NULL;
        cr_assert_eq(ctxs_store_session_create(&s, w->st, names[i], model(), &o), 0, "[%s]",
                     run_context);
        ts_append_many(s, 5 + 5 * (uint64_t)i);
        ctxs_session_close(s);
    }
}

static int run_gc(world *w)
{
    ctxs_store_gc_result r;
    int rc = ctxs_store_gc(&r, w->st, 0, 0);
    ctxs_free(r.sessions);
    return rc;
}

static bool happened_gc(world *w)
{
    /* A budget of 0 deletes every session no handle has open. Each delete
     * is its own transaction: one of the two may be gone already. */
    return !session_exists(w, "b") && !session_exists(w, "c");
}

static void prepare_compact(world *w)
{
    /* Rolled-back tokens leave blocks for compact to punch. */
    ts_append_many(w->a, 2 * MORE_TOKENS);
    cr_assert_eq(ctxs_session_rollback(w->a, BASE_TOKENS), 0, "[%s]", run_context);
    prepare_gc(w);
}

static int run_compact(world *w)
{
    /* With no session open through the store, the index is rewritten too. */
    ctxs_session_close(w->a);
    w->a = NULL;
    ctxs_store_compact_result r;
    return ctxs_store_compact(&r, w->st, NULL, NULL);
}

static bool happened_compact(world *w)
{
    (void)w;
    return true; /* what compact changes is not content: check_store has seen it whole */
}

static void prepare_import(world *w)
{
    cr_assert_eq(ctxs_store_session_export(w->st, "a", w->export_path, NULL), 0, "[%s]", run_context);
}

static int run_import(world *w)
{
    char name[256];
    return ctxs_store_session_import(name, w->st, w->export_path, "imported", NULL);
}

static bool happened_import(world *w)
{
    if (!session_exists(w, "imported"))
        return false;
    cr_assert_eq(check_session(w, "imported"), BASE_TOKENS, "[%s]", run_context);
    return true;
}

static int run_open(world *w)
{
    ctxs_session_close(w->a);
    w->a = NULL;
    return open_session(&w->a, w, "a", 0);
}

static bool happened_open(world *w)
{
    (void)w;
    return true; /* an open changes nothing a user asked for */
}

static int run_export(world *w)
{
    return ctxs_store_session_export(w->st, "a", w->export_path, NULL);
}

static bool happened_export(world *w)
{
    /* A failed export leaves no file, or one that imports whole. */
    if (access(w->export_path, F_OK) != 0)
        return false;
    char name[256];
    int rc = ctxs_store_session_import(name, w->st, w->export_path, "exported", NULL);
    cr_assert_eq(rc, 0, "the export does not import: %s [%s]", ctxs_err_name(rc), run_context);
    cr_assert_eq(check_session(w, "exported"), BASE_TOKENS, "[%s]", run_context);
    cr_assert_eq(ctxs_store_session_delete(w->st, "exported"), 0, "[%s]", run_context);
    return true;
}

/* A closed session "b" of B_TOKENS tokens, with a checkpoint. */
#define B_TOKENS 5u
static void prepare_b(world *w)
{
    ctxs_create_options o = options();
    ctxs_session *b = NULL;
    cr_assert_eq(ctxs_store_session_create(&b, w->st, "b", model(), &o), 0, "[%s]", run_context);
    ts_append_many(b, B_TOKENS);
    cr_assert_eq(ctxs_checkpoint_create(b, "b-cp"), 0, "[%s]", run_context);
    ctxs_session_close(b);
}

static int run_delete(world *w)
{
    return ctxs_store_session_delete(w->st, "b");
}

static bool happened_delete(world *w)
{
    if (session_exists(w, "b")) {
        cr_assert_eq(check_session(w, "b"), B_TOKENS, "[%s]", run_context);
        return false;
    }
    ctxs_checkpoint_entry *list = NULL;
    size_t n = 0;
    int rc = ts_checkpoint_list(&list, &n, w->st, "b");
    cr_assert_eq(rc, CTXS_ENOTFOUND, "checkpoints of a deleted session: %s [%s]",
                 ctxs_err_name(rc), run_context);
    return true;
}

static int run_rename(world *w)
{
    return ctxs_store_session_rename(w->st, "b", "renamed");
}

static bool happened_rename(world *w)
{
    bool from = session_exists(w, "b"), to = session_exists(w, "renamed");
    cr_assert(from != to, "\"b\" %s and \"renamed\" %s [%s]", from ? "exists" : "is gone",
              to ? "exists" : "is gone", run_context);
    cr_assert_eq(check_session(w, to ? "renamed" : "b"), B_TOKENS, "[%s]", run_context);
    ctxs_checkpoint_entry *list = NULL;
    size_t n = 0;
    cr_assert_eq(ts_checkpoint_list(&list, &n, w->st, to ? "renamed" : "b"), 0, "[%s]",
                 run_context);
    ctxs_free(list);
    cr_assert_eq(n, 1, "the checkpoint did not follow the rename [%s]", run_context);
    return to;
}

/* A checkpoint at BASE_TOKENS, then tokens that the restore drops. */
static void prepare_restore(world *w)
{
    cr_assert_eq(ctxs_checkpoint_create(w->a, "cp"), 0, "[%s]", run_context);
    ts_append_many(w->a, MORE_TOKENS);
}

static int run_restore(world *w)
{
    return ctxs_checkpoint_restore(w->a, "cp");
}

static bool happened_restore(world *w)
{
    return happened_rollback(w);
}

static void prepare_checkpoint_delete(world *w)
{
    cr_assert_eq(ctxs_checkpoint_create(w->a, "cp"), 0, "[%s]", run_context);
}

static int run_checkpoint_delete(world *w)
{
    return ts_checkpoint_delete(w->st, "a", "cp");
}

static bool happened_checkpoint_delete(world *w)
{
    ctxs_checkpoint_entry *list = NULL;
    size_t n = 0;
    cr_assert_eq(ts_checkpoint_list(&list, &n, w->st, "a"), 0, "[%s]", run_context);
    ctxs_free(list);
    return n == 0;
}

/* Rebuilding the index or repairing it changes nothing in a sound store:
 * what must hold is that "b" and its checkpoint are still there whole. */
static bool b_kept(world *w)
{
    cr_assert(session_exists(w, "b"), "\"b\" is gone [%s]", run_context);
    cr_assert_eq(check_session(w, "b"), B_TOKENS, "[%s]", run_context);
    ctxs_checkpoint_entry *list = NULL;
    size_t n = 0;
    cr_assert_eq(ts_checkpoint_list(&list, &n, w->st, "b"), 0, "[%s]", run_context);
    ctxs_free(list);
    cr_assert_eq(n, 1, "the checkpoint of \"b\" is gone [%s]", run_context);
    return true;
}

static int run_reindex(world *w)
{
    ctxs_session_close(w->a);
    w->a = NULL;
    ctxs_store_reindex_result r;
    return ctxs_store_reindex(&r, w->st);
}

static int run_repair(world *w)
{
    ctxs_store_repair_result r;
    return ctxs_store_repair(&r, w->st);
}

static int run_model_register(world *w)
{
    ctxs_model other = ts_model(8);
    return ctxs_model_register(w->st, &other, "other");
}

static bool happened_model_register(world *w)
{
    ctxs_model other = ts_model(8);
    ctxs_model_entry e;
    int rc = ctxs_model_get(&e, w->st, other.model_hash);
    cr_assert(rc == 0 || rc == CTXS_ENOTFOUND, "%s [%s]", ctxs_err_name(rc), run_context);
    if (rc == 0)
        cr_assert_str_eq(e.name, "other", "[%s]", run_context);
    return rc == 0;
}

static const fault_op ops[] = {
    {"create", NULL, run_create, happened_create, BASE_TOKENS, false},
    {"commit", NULL, run_commit, happened_commit, BASE_TOKENS + MORE_TOKENS, true},
    {"write_layer", NULL, run_write_layer, happened_commit, BASE_TOKENS + MORE_TOKENS, true},
    {"rollback", prepare_rollback, run_rollback, happened_rollback, BASE_TOKENS, false},
    {"checkpoint", NULL, run_checkpoint, happened_checkpoint, BASE_TOKENS, false},
    {"fork", NULL, run_fork, happened_fork, BASE_TOKENS, false},
    {"gc", prepare_gc, run_gc, happened_gc, BASE_TOKENS, false},
    {"compact", prepare_compact, run_compact, happened_compact, BASE_TOKENS, false},
    {"import", prepare_import, run_import, happened_import, BASE_TOKENS, false},
    {"open", NULL, run_open, happened_open, BASE_TOKENS, false},
    {"export", NULL, run_export, happened_export, BASE_TOKENS, false},
    {"delete", prepare_b, run_delete, happened_delete, BASE_TOKENS, false},
    {"rename", prepare_b, run_rename, happened_rename, BASE_TOKENS, false},
    {"restore", prepare_restore, run_restore, happened_restore, BASE_TOKENS, false},
    {"checkpoint_delete", prepare_checkpoint_delete, run_checkpoint_delete,
     happened_checkpoint_delete, BASE_TOKENS, false},
    {"reindex", prepare_b, run_reindex, b_kept, BASE_TOKENS, false},
    {"repair", prepare_b, run_repair, b_kept, BASE_TOKENS, false},
    {"model_register", NULL, run_model_register, happened_model_register, BASE_TOKENS, false},
};

static const fault_op *find_op(const char *name)
{
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
        if (strcmp(ops[i].name, name) == 0)
            return &ops[i];
    cr_assert_fail("no operation %s", name);
    return NULL;
}

/* --- The loop ----------------------------------------------------------------- */

typedef struct fault_mode {
    int error;
    bool persistent;
} fault_mode;

static const fault_mode modes[] = {
    {EIO, false},    {EIO, true},    {ENOSPC, false}, {ENOSPC, true},
    {ENOMEM, false}, {ENOMEM, true}, {EINTR, false}, /* retried inside: must change nothing */
    /* A write that moves half its bytes; from then on, every write fails
     * (only for the operations that write K/V: file_writes). */
    {CTXS__FAULT_SHORT, false}, {CTXS__FAULT_SHORT, true},
};

/* One run of op with the nth eligible call failing; returns whether a
 * fault was injected (false: op made fewer calls and ran clean). */
static bool run_once(const fault_op *op, const fault_mode *mode, uint64_t nth, int fds_before,
                     size_t heap_before)
{
    world w = {0};
    world_make(&w, op);

    ctxs__write_path_force = op->file_writes ? 2 : 0;
    ctxs__fault_arm(nth, mode->error, mode->persistent);
    int rc = op->run(&w);
    ctxs__fault_disarm();
    ctxs__write_path_force = 0;
    bool injected = ctxs__fault_failed() > 0;
    const struct ctxs__fault_site *site = ctxs__fault_last_failed();
    snprintf(run_context, sizeof(run_context), "%s, call %llu (%s:%d %s) failing with %s%s: %s",
             op->name, (unsigned long long)nth, site ? site->file : "-", site ? site->line : 0,
             site ? site->call : "none",
             mode->error == CTXS__FAULT_SHORT ? "a short write" : strerror(mode->error),
             mode->persistent ? " from then on" : "", ctxs_err_name(rc));

    if (!injected || mode->error == EINTR)
        cr_assert_eq(rc, 0, "failed [%s]", run_context);
    if (rc == 0)
        w.acked = op->acked_after;

    /* What a process restarting after the failure finds. */
    world_close(&w);
    cr_assert_eq(open_fds(), fds_before, "descriptors left open [%s]", run_context);
    world_open(&w);
    check_store(&w);
    bool happened = op->happened(&w);
    cr_assert(rc != 0 || happened, "returned 0 but did not happen [%s]", run_context);
    if (!happened) {
        int again = op->run(&w);
        cr_assert_eq(again, 0, "run again: %s [%s]", ctxs_err_name(again), run_context);
        w.acked = op->acked_after;
        if (w.a == NULL)
            cr_assert_eq(open_session(&w.a, &w, "a", 0), 0, "[%s]", run_context);
        cr_assert(op->happened(&w), "ran again and did not happen [%s]", run_context);
        check_store(&w);
    }
    world_close(&w);
    ts_rmtree(w.dir);
    unlink(w.export_path);
    bool unlink_failed = site && strcmp(site->call, "unlink") == 0;
    cr_assert_leq(export_leftovers(&w), unlink_failed ? 1 : 0,
                  "the export left a file written aside [%s]", run_context);
    cr_assert_eq(open_fds(), fds_before, "descriptors left open [%s]", run_context);
    if (heap_before)
        cr_assert_leq(heap_in_use(), heap_before, "heap leaked: %zu bytes in use, %zu before [%s]",
                      heap_in_use(), heap_before, run_context);
    return injected;
}

/* Under ASan: no allocation is unreachable. (A leak LeakSanitizer reports
 * at exit would not fail the test: Criterion ignores the worker's status.) */
static void check_no_leak(void)
{
#ifdef UNDER_ASAN
    cr_assert_eq(__lsan_do_recoverable_leak_check(), 0, "leaks: LeakSanitizer's report above");
#endif
}

static void print_sites(const char *op)
{
    const struct ctxs__fault_site *sites;
    size_t n = ctxs__fault_sites(&sites);
    size_t failed = 0;
    for (size_t i = 0; i < n; i++)
        failed += sites[i].failed > 0;
    fprintf(stderr, "faults %s: %zu call sites reached, %zu failed\n", op, n, failed);
    if (getenv("CTXS_FAULT_SITES"))
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, "fault site %s:%d %s reached %llu failed %llu\n", sites[i].file,
                    sites[i].line, sites[i].call, (unsigned long long)sites[i].reached,
                    (unsigned long long)sites[i].failed);
}

static void fault_loop(const char *name)
{
    const fault_op *op = find_op(name);
    /* Clean runs first warm what is made once per process (LMDB's and
     * libc's own state, tables that grow to their size), so that the heap
     * measured after them is the floor. */
    int fds = open_fds();
    for (int warm = 0; warm < 3; warm++)
        run_once(op, &(fault_mode){EIO, false}, UINT64_MAX, fds, 0);
    size_t heap = heap_in_use();
    uint64_t total = 0;
    for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
        if (modes[m].error == CTXS__FAULT_SHORT && !op->file_writes)
            continue;
        uint64_t nth = 1;
        while (run_once(op, &modes[m], nth, fds, heap)) {
            nth++;
            cr_assert_lt(nth, MAX_RUNS, "%s never completes under faults [%s]", name, run_context);
        }
        fprintf(stderr, "faults %s: %s %s: %llu runs\n", name,
                modes[m].error == CTXS__FAULT_SHORT ? "short write" : strerror(modes[m].error),
                modes[m].persistent ? "from then on" : "once", (unsigned long long)nth);
        total += nth;
    }
    fprintf(stderr, "faults %s: %llu runs in all\n", name, (unsigned long long)total);
    print_sites(name);
    check_no_leak();
}

Test(faults, create)
{
    fault_loop("create");
}
Test(faults, commit)
{
    fault_loop("commit");
}
Test(faults, write_layer)
{
    fault_loop("write_layer");
}
Test(faults, rollback)
{
    fault_loop("rollback");
}
Test(faults, checkpoint)
{
    fault_loop("checkpoint");
}
Test(faults, fork)
{
    fault_loop("fork");
}
Test(faults, gc)
{
    fault_loop("gc");
}
Test(faults, compact)
{
    fault_loop("compact");
}
Test(faults, import)
{
    fault_loop("import");
}
Test(faults, open)
{
    fault_loop("open");
}
Test(faults, export)
{
    fault_loop("export");
}
Test(faults, delete)
{
    fault_loop("delete");
}
Test(faults, rename)
{
    fault_loop("rename");
}
Test(faults, restore)
{
    fault_loop("restore");
}
Test(faults, checkpoint_delete)
{
    fault_loop("checkpoint_delete");
}
Test(faults, reindex)
{
    fault_loop("reindex");
}
Test(faults, repair)
{
    fault_loop("repair");
}
Test(faults, model_register)
{
    fault_loop("model_register");
}

/* Where the filesystem has no O_TMPFILE, new files are written aside under
 * a temporary name, which a failure must not leave behind either. */
Test(faults, create_written_aside_under_a_name)
{
    ctxs__aside_force_named(true);
    fault_loop("create");
}
Test(faults, fork_written_aside_under_a_name)
{
    ctxs__aside_force_named(true);
    fault_loop("fork");
}
Test(faults, import_written_aside_under_a_name)
{
    ctxs__aside_force_named(true);
    fault_loop("import");
}
Test(faults, export_written_aside_under_a_name)
{
    ctxs__aside_force_named(true);
    fault_loop("export");
}

/* The hook itself: it counts only the calls that can fail with its error,
 * fails the nth, and once means once. */
Test(faults, hook_counts_and_fails_the_nth_call)
{
    world w = {0};
    world_make(&w, find_op("commit"));
    ctxs__fault_arm(UINT64_MAX, EIO, false);
    cr_assert_eq(ts_append(w.a, 1), 0, "[%s]", run_context);
    uint64_t io_calls = ctxs__fault_calls();
    ctxs__fault_disarm();
    cr_assert_gt(io_calls, 0, "a FULL commit makes I/O calls [%s]", run_context);
    cr_assert_eq(ctxs__fault_failed(), 0, "[%s]", run_context);

    ctxs__fault_arm(1, EIO, false);
    int rc = ts_append(w.a, 1);
    ctxs__fault_disarm();
    cr_assert_eq(ctxs__fault_failed(), 1, "[%s]", run_context);
    cr_assert_neq(rc, 0, "a commit whose first I/O call failed succeeded [%s]", run_context);
    world_close(&w);
}
