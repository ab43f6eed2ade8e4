/*
 * Running the ctxstore binary from a test: its exit code, stdout and
 * stderr, and a failed test (never a hung one) when it dies of a signal or
 * a sanitizer reports. Used by the CLI suites (test_cli.c,
 * test_cli_remote.c).
 */
#ifndef CTXS_TEST_CLI_RUN_H
#define CTXS_TEST_CLI_RUN_H

#include <stddef.h>

typedef struct cli_result {
    int code;
    char *out, *err;        /* NUL-terminated; the next run replaces them */
    size_t out_len, err_len;
    char what[1024];        /* the command line, for messages */
} cli_result;

/* $CTXSTORE_BIN, the binary under test (meson sets it); fails the test
 * when it is not set or not executable. */
const char *cli_bin(void);

/* Runs the binary at path with args (NULL-terminated, without argv[0])
 * and the environment of this process, except: $CTXSTORE_DIR is store
 * (removed when store is NULL), $HOME a directory in the scratch area (so
 * that nothing can reach the user's store), $XDG_DATA_HOME removed, and
 * then each entry of env (NULL-terminated, may be NULL): "NAME=value"
 * replaces or adds NAME, "NAME" alone removes it. stdin is /dev/null;
 * unprivileged: the child drops to an unprivileged user first
 * (ts_drop_privileges()). Fills *r and returns the exit code. */
int cli_run(cli_result *r, const char *path, const char *store, const char *const *env,
            const char *const *args, int unprivileged);

/* When not 0, a run still going after this many seconds is killed
 * (SIGKILL) and fails the test as one that would never have ended: for
 * the runs whose failure would be to block forever. 0 by default. */
extern unsigned cli_run_limit_s;

#endif
