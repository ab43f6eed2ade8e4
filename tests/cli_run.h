/*
 * Running the ctxstore binary from a test: its exit code, stdout and
 * stderr, and a failed test (never a hung one) when it dies of a signal or
 * a sanitizer reports. Used by the CLI suites (test_cli.c,
 * test_cli_remote.c).
 */
#ifndef CTXS_TEST_CLI_RUN_H
#define CTXS_TEST_CLI_RUN_H

#include <stddef.h>
#include <stdint.h>

/* Exit codes, as tools/ctxstore/cli.h and `ctxstore --help` document them. */
enum {
    EX_OK = 0,
    EX_FAIL = 1,
    EX_USAGE = 2,
    EX_NOTFOUND = 3,
    EX_BUSY = 4,
    EX_DAMAGED = 5,
    EX_FULL = 6,
    EX_EXIST = 7,
    EX_INDEX = 8,
    EX_REMOTE_DOWN = 9,
    EX_REMOTE = 10,
};

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

/* --- What a run said, checked: each fails the test, naming the command
 * and showing its output, where the run said otherwise. -------------- */

struct jc_value;

/* A 16-byte hash as the tool shows it: 32 lowercase hex digits. */
void cli_hex(char out[33], const uint8_t hash[16]);

/* That r exited with code (got, what the run returned). */
void cli_expect_exit(const cli_result *r, int got, int code);

/* That r's stdout (out = 1) or stderr contains s. */
void cli_contains(const cli_result *r, int out, const char *s);

/* r's stdout parsed as JSON (release with jc_free()), a document that
 * ends with a newline. */
struct jc_value *cli_json(const cli_result *r);

/* The value at path in v (jc_path()), a count there, a string there. */
const struct jc_value *cli_jget(const cli_result *r, const struct jc_value *v, const char *path);
uint64_t cli_ju(const cli_result *r, const struct jc_value *v, const char *path);
const char *cli_js(const cli_result *r, const struct jc_value *v, const char *path);

#endif
