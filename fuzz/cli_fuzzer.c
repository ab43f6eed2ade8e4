/*
 * cli: what a user hands the ctxstore tool. The input is its command line,
 * split on NUL bytes, and the tool's own code (tools/ctxstore, compiled in
 * without its main) runs it against a real small store (the sample
 * store of fuzz.h, with an export file and a file that is not one beside
 * it) in a scratch directory that is copied fresh for every input. Output
 * goes to /dev/null. `demo` and `bench` are left out (programs of their
 * own, slow), and `remote` (it would connect to whatever host an input
 * names).
 *
 * Arguments are confined to the scratch directory: an absolute path, or
 * one that climbs with "..", is turned into a name inside it.
 */
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "fuzz.h"

/* The tool's commands (cli_tool_commands) but demo and bench (programs of
 * their own, slow) and remote (it would connect to whatever host an input
 * names). */
static const cli_command *k_commands[32];
static size_t k_n_commands;

#define MAX_ARGS 24

static char *template_dir, *work_dir;
static int home_fd = -1;

static void fail(const char *what, int rc)
{
    fprintf(stderr, "cli_fuzzer: %s (%d)\n", what, rc);
    abort();
}

static void init(void)
{
    for (size_t i = 0; i < cli_n_tool_commands; i++) {
        const cli_command *cmd = cli_tool_commands[i];
        if (cmd->run && strcmp(cmd->name, "remote") != 0 &&
            k_n_commands < sizeof(k_commands) / sizeof(k_commands[0]))
            k_commands[k_n_commands++] = cmd;
    }
    const char *dir = fuzz_scratch("cli");
    template_dir = fuzz_join(dir, "template");
    work_dir = fuzz_join(dir, "w");
    char *store = fuzz_join(template_dir, "store");
    char *exp = fuzz_join(template_dir, "x.exp");
    char *junk = fuzz_join(template_dir, "junk");
    if (mkdir(template_dir, 0700) != 0)
        fail("making the template directory", 0);
    int rc = fuzz_build_store(store);
    if (rc < 0)
        fail("building the sample store", rc);
    ctxs_store *st;
    if ((rc = ctxs_store_open(&st, store, CTXS_STORE_CREATE, NULL)) < 0 ||
        (rc = ctxs_store_session_export(st, "b", exp, NULL)) < 0)
        fail("exporting a sample session", rc);
    ctxs_store_close(st);
    if (fuzz_write_file(junk, "not an export\n", 14) < 0)
        fail("writing a file", 0);
    free(store);
    free(exp);
    free(junk);
    if (mkdir(work_dir, 0700) != 0)
        fail("making the work directory", 0);
    char *work_store = fuzz_join(work_dir, "store");
    setenv("CTXSTORE_DIR", work_store, 1);
    free(work_store);
    /* `prefix --tokens-file -` reads standard input: an empty one. */
    int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null_fd < 0 || dup2(null_fd, STDIN_FILENO) < 0)
        fail("opening /dev/null", 0);
    close(null_fd);
    fuzz_silence(); /* opens /dev/null once, before fds are counted */
    fuzz_unsilence();
    home_fd = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (home_fd < 0)
        fail("opening the current directory", 0);
}

/* An argument that cannot leave the current directory: no leading '/',
 * none after '=' (--store=/x), no "..". */
static void confine(char *a)
{
    for (char *p = a; *p; p++) {
        if (*p == '/' && (p == a || p[-1] == '='))
            *p = '_';
        if (p[0] == '.' && p[1] == '.')
            p[1] = '_';
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096)
        return 0;
    if (!template_dir)
        init();
    int fds = fuzz_fd_count();

    /* argv: "ctxstore", then the input's NUL-separated pieces. */
    char *buf = malloc(size + 1);
    if (!buf)
        abort();
    memcpy(buf, data, size);
    buf[size] = '\0';
    char *argv[MAX_ARGS + 2];
    int argc = 0;
    argv[argc++] = (char *)"ctxstore";
    for (size_t i = 0; i < size && argc <= MAX_ARGS;) {
        argv[argc++] = buf + i;
        confine(buf + i);
        i += strlen(buf + i) + 1;
    }
    argv[argc] = NULL;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "demo") == 0 || strcmp(argv[i], "bench") == 0) {
            free(buf);
            return 0;
        }

    fuzz_empty_dir(work_dir);
    if (fuzz_copy_tree(template_dir, work_dir, "lock.mdb") < 0)
        fail("copying the sample store", 0);
    if (chdir(work_dir) != 0)
        fail("entering the work directory", 0);
    optind = 0; /* a fresh getopt scan */
    fuzz_silence();
    int rc = cli_main(k_commands, k_n_commands, argc, argv);
    fuzz_unsilence();
    if (fchdir(home_fd) != 0)
        fail("leaving the work directory", 0);
    fuzz_debug("cli: %s ... -> %d", argc > 1 ? argv[1] : "", rc);
    if (rc < 0 || rc > CLI_EEXIST)
        fail("an exit code outside the documented ones", rc);
    free(buf);
    fuzz_check_fds("cli", fds);
    return 0;
}
