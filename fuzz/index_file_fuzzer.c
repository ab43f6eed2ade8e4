/*
 * index_file: the input becomes the store's index/data.mdb, beside the
 * sample store's session files, and the store is then used as an app
 * would: opened, read, written. The check before LMDB maps the file
 * (check_file.c, check_file_pages.c) runs here, in this process, where the
 * fuzzer sees its coverage; everything after it runs in a child, under
 * alarm(), because what the check lets through is handed to LMDB, which
 * trusts it: a child killed by a signal (LMDB's assertions abort, a page
 * read outside the map faults), a sanitizer's report, or a child still
 * running at the alarm is a finding, and this process aborts naming it.
 *
 * Input: a control byte (FUZZ_INDEX_* in fuzz.h), then the file, as is.
 *
 * In the child: the store opened read-write (read-only with
 * FUZZ_INDEX_RDONLY), every session listed with its metadata, the models,
 * each session opened read-only with its checkpoints, a prefix lookup,
 * the whole index checked (ctxs_store_check); with FUZZ_INDEX_WRITE, a
 * session created and filled past two prefix chunks (the prefixes
 * table's duplicates), metadata set, a fork, a rename, a delete, a gc
 * dry run, and the store reopened and listed.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fuzz.h"
#include "index.h"

/* A child still running after this long is a finding (the replay's
 * budget per input is 30 s). */
#define CHILD_SECONDS 20

#define MAX_FILE (1u << 20)

static char *store_dir, *template_sessions, *sessions_dir, *data_path, *lock_path;

static void init(void)
{
    const char *dir = fuzz_scratch("index_file");
    char *template_dir = fuzz_join(dir, "template");
    store_dir = fuzz_join(dir, "store");
    template_sessions = fuzz_join(template_dir, "sessions");
    sessions_dir = fuzz_join(store_dir, "sessions");
    char *index_dir = fuzz_join(store_dir, "index");
    data_path = fuzz_join(index_dir, "data.mdb");
    lock_path = fuzz_join(index_dir, "lock.mdb");
    int rc = fuzz_build_store(template_dir);
    if (rc < 0) {
        fprintf(stderr, "index_file_fuzzer: building the sample store: %s\n", ctxs_err_name(rc));
        abort();
    }
    if (fuzz_copy_tree(template_dir, store_dir, "lock.mdb") < 0)
        abort();
    free(index_dir);
    free(template_dir);
}

/* What an app does with the store, read and (if writes) written. */
static void use_store(unsigned ctl)
{
    int writes = (ctl & FUZZ_INDEX_WRITE) && !(ctl & FUZZ_INDEX_RDONLY);
    ctxs_store *st = NULL;
    int rc = ctxs_store_open(&st, store_dir, ctl & FUZZ_INDEX_RDONLY ? CTXS_RDONLY : 0,
                             NULL);
    fuzz_debug("index_file: open: %s", ctxs_err_name(rc));
    if (rc < 0)
        return;
    ctxs_session_entry *list = NULL;
    size_t n = 0;
    ctxs_store_session_list(&list, &n, st);
    for (size_t i = 0; i < n && i < 16; i++) {
        ctxs_meta_entry *meta = NULL;
        size_t k;
        if (ctxs_store_session_list_meta(&meta, &k, st, list[i].name) == 0)
            ctxs_free(meta);
        ctxs_session *s = NULL;
        if (ctxs_store_session_open(&s, st, list[i].name, NULL, CTXS_RDONLY, NULL) == 0) {
            ctxs_checkpoint_entry *cps = NULL;
            size_t n_cps;
            if (ctxs_checkpoint_list(&cps, &n_cps, s) == 0)
                ctxs_free(cps);
            ctxs_session_close(s);
        }
    }
    ctxs_model_entry *models = NULL;
    size_t n_models;
    if (ctxs_model_list(&models, &n_models, st) == 0)
        ctxs_free(models);
    uint32_t tokens[150];
    fuzz_sample_tokens(tokens, 150);
    ctxs_model m0 = fuzz_model(0);
    ctxs_prefix_match match;
    ctxs_prefix_find(&match, st, m0.model_hash, tokens, 150);
    ctxs_store_check_result check;
    memset(&check, 0, sizeof(check));
    ctxs_store_check(&check, st);
    ctxs_free(check.problems);

    if (writes) {
        ctxs_create_options o = fuzz_options(256, 4, 0);
        ctxs_session *s = NULL;
        rc = ctxs_store_session_create(&s, st, "fz", &m0, &o);
        fuzz_debug("index_file: create: %s", ctxs_err_name(rc));
        if (rc == 0) {
            fuzz_append(s, 140);
            ctxs_checkpoint_create(s, "cp");
            ctxs_session_close(s);
        }
        ctxs_store_session_set_meta(st, "fz", "title", "x", 1);
        for (size_t i = 0; i < n && i < 4; i++)
            ctxs_store_session_set_meta(st, list[i].name, "k", "value", 5);
        ctxs_store_session_fork(NULL, st, "a", "fz2", 64, NULL);
        ctxs_store_session_rename(st, "fz2", "fz3");
        ctxs_store_session_delete(st, "b");
        ctxs_store_gc_result gc;
        if (ctxs_store_gc(&gc, st, 0, CTXS_GC_DRY_RUN) == 0)
            ctxs_free(gc.sessions);
    }
    ctxs_free(list);
    ctxs_store_close(st);
    if (writes && ctxs_store_open(&st, store_dir, 0, NULL) == 0) {
        if (ctxs_store_session_list(&list, &n, st) == 0)
            ctxs_free(list);
        ctxs_store_close(st);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > MAX_FILE + 1)
        return 0;
    if (!store_dir)
        init();
    int fds = fuzz_fd_count();
    unsigned ctl = data[0];
    /* The sample's session files, as every input meets them. */
    fuzz_empty_dir(sessions_dir);
    if (fuzz_copy_tree(template_sessions, sessions_dir, NULL) < 0)
        abort();
    unlink(lock_path);
    if (fuzz_write_file(data_path, data + 1, size - 1) < 0)
        abort();

    int rc = ctxs__index_file_check(data_path, 0);
    fuzz_debug("index_file: check: %s", ctxs_err_name(rc));
    if (rc == 0) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0)
            abort();
        if (pid == 0) {
            alarm(CHILD_SECONDS);
            if (!getenv("CTXS_FUZZ_DEBUG"))
                fuzz_silence();
            use_store(ctl);
            _exit(0);
        }
        int status;
        while (waitpid(pid, &status, 0) < 0)
            if (errno != EINTR)
                abort();
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr,
                    "index_file_fuzzer: the index passed the check, and the store's use %s %d\n",
                    WIFSIGNALED(status) ? "died of signal" : "exited with",
                    WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
            abort();
        }
    }
    fuzz_check_fds("index_file", fds);
    return 0;
}
