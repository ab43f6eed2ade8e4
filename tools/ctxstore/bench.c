/*
 * ctxstore bench — runs the benchmark programs, bench_session (saving a
 * turn and resuming, against a state file and SQLite), bench_index
 * (prefix lookup, fork, the index's share of a commit), bench_attention
 * (the attention kernel through the mapping against a copy in memory) and
 * bench_tinychat (resuming examples/tinychat's next token from the store
 * against recomputing the prefill), one after the other, and passes their
 * output through.
 *
 * The programs are looked for in $CTXSTORE_BENCH_DIR, then next to the tool
 * in a build tree (<build>/tools/ctxstore/ctxstore finds <build>/bench/),
 * then in the directory the build names as CTXS_LIBEXECDIR.
 *
 * With --json each program prints one JSON object per measurement on its
 * stdout; the tool collects them into one document:
 *
 *     {"programs": [
 *        {"program": "bench_session", "path": "...", "args": ["--quick"],
 *         "exit_status": 0, "results": [{"op": ..., ...}, ...]},
 *        {"program": "bench_index", ...}]}
 *
 * exit_status is the program's exit status, or 128 + the signal that
 * killed it. Their headers and notes go to stderr, as the programs write
 * them.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"

extern char **environ;

typedef struct bench_program {
    const char *name;   /* "bench_session" */
    const char *option; /* its --only value */
    char path[PATH_MAX];
    int found;
    int exit_status;    /* as documented above */
    char *out;          /* --json: what it wrote to stdout */
    size_t out_len;
} bench_program;

/* --- Finding the programs ------------------------------------------------- */

static int is_executable(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode)
           && access(path, X_OK) == 0;
}

/* The directories to look in, in order; dirs[i] is "" when that place is
 * not known. */
enum { N_PLACES = 3 };

static void bench_dirs(char dirs[N_PLACES][PATH_MAX])
{
    for (int i = 0; i < N_PLACES; i++)
        dirs[i][0] = '\0';
    const char *env = getenv("CTXSTORE_BENCH_DIR");
    if (env && *env)
        snprintf(dirs[0], PATH_MAX, "%s", env);
#ifdef __linux__
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            if (snprintf(dirs[1], PATH_MAX, "%s/../../bench", exe) >= PATH_MAX)
                dirs[1][0] = '\0';
        }
    }
#endif
#ifdef CTXS_LIBEXECDIR
    snprintf(dirs[2], PATH_MAX, "%s", CTXS_LIBEXECDIR);
#endif
}

static int find_program(bench_program *p, char dirs[N_PLACES][PATH_MAX])
{
    for (int i = 0; i < N_PLACES; i++) {
        if (!dirs[i][0])
            continue;
        if (snprintf(p->path, sizeof p->path, "%s/%s", dirs[i], p->name)
            >= (int)sizeof p->path)
            continue;
        if (is_executable(p->path)) {
            char *real = realpath(p->path, NULL);
            if (real) {
                snprintf(p->path, sizeof p->path, "%s", real);
                free(real);
            }
            return p->found = 1;
        }
    }
    return 0;
}

static void report_missing(const bench_program *p,
                           char dirs[N_PLACES][PATH_MAX])
{
    static const char *const what[N_PLACES] = {
        "$CTXSTORE_BENCH_DIR", "beside the tool", "installed" };
    cli_say("%s not found; looked in:", p->name);
    for (int i = 0; i < N_PLACES; i++)
        if (dirs[i][0])
            fprintf(stderr, "  %s (%s)\n", dirs[i], what[i]);
}

static void advise_build(int need_sqlite)
{
    fprintf(stderr,
            "Build them with the library: meson setup build && ninja -C build "
            "puts them in\nbuild/bench/%s; then run "
            "build/tools/ctxstore/ctxstore bench, or set\n"
            "CTXSTORE_BENCH_DIR to the directory that holds them.\n",
            need_sqlite ? " (bench_session also needs SQLite's development "
                          "files,\ne.g. libsqlite3-dev)"
                        : "");
}

/* --- Running them --------------------------------------------------------- */

static int read_all(int fd, bench_program *p)
{
    size_t cap = 0;
    for (;;) {
        if (cap - p->out_len < 4096) {
            size_t ncap = cap ? cap * 2 : 65536;
            char *n = realloc(p->out, ncap);
            if (!n)
                return CTXS_ENOMEM;
            p->out = n;
            cap = ncap;
        }
        ssize_t r = read(fd, p->out + p->out_len, cap - p->out_len - 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            break;
        p->out_len += (size_t)r;
    }
    if (p->out)
        p->out[p->out_len] = '\0';
    return 0;
}

/* Runs one program and waits for it, with SIGINT and SIGQUIT ignored here
 * meanwhile (as system() does): Ctrl-C reaches the program, which removes
 * its scratch directory and dies; then so do we. Returns 0, or a negative
 * error when it could not be run. */
static int run_program(bench_program *p, char *const argv[], int capture)
{
    int pipefd[2] = { -1, -1 };
    if (capture && pipe(pipefd) < 0)
        return -errno;

    struct sigaction ign, old_int, old_quit;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGINT, &ign, &old_int);
    sigaction(SIGQUIT, &ign, &old_quit);

    /* The child gets back the dispositions we were started with. */
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t def;
    sigemptyset(&def);
    if (old_int.sa_handler != SIG_IGN)
        sigaddset(&def, SIGINT);
    if (old_quit.sa_handler != SIG_IGN)
        sigaddset(&def, SIGQUIT);
    posix_spawnattr_setsigdefault(&attr, &def);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (capture) {
        posix_spawn_file_actions_adddup2(&fa, pipefd[1], STDOUT_FILENO);
        posix_spawn_file_actions_addclose(&fa, pipefd[0]);
        posix_spawn_file_actions_addclose(&fa, pipefd[1]);
    }

    fflush(stdout);
    fflush(stderr);
    pid_t pid = -1;
    int rc = -posix_spawn(&pid, p->path, &fa, &attr, argv, environ);
    int spawned = rc == 0;
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    if (capture)
        close(pipefd[1]);
    if (spawned && capture)
        rc = read_all(pipefd[0], p);
    if (capture)
        close(pipefd[0]);

    /* Waited for even when reading its output failed. */
    int status = 0;
    while (spawned && waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            if (rc == 0)
                rc = -errno;
            break;
        }
    }
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGQUIT, &old_quit, NULL);
    if (rc < 0)
        return rc;
    p->exit_status = WIFEXITED(status)     ? WEXITSTATUS(status)
                     : WIFSIGNALED(status) ? 128 + WTERMSIG(status)
                                           : 1;
    return 0;
}

/* --- JSON ----------------------------------------------------------------- */

static void put_string(const char *s)
{
    putchar('"');
    for (const unsigned char *u = (const unsigned char *)s; *u; u++) {
        if (*u == '"' || *u == '\\')
            printf("\\%c", *u);
        else if (*u < 0x20)
            printf("\\u%04x", *u);
        else
            putchar(*u);
    }
    putchar('"');
}

/* The programs' own objects go in as they are, one per line; anything else
 * they wrote to stdout is passed to stderr. */
static void put_results(const bench_program *p)
{
    int first = 1;
    char *save = NULL;
    for (char *line = p->out ? strtok_r(p->out, "\n", &save) : NULL; line;
         line = strtok_r(NULL, "\n", &save)) {
        size_t n = strlen(line);
        while (n && (line[n - 1] == '\r' || line[n - 1] == ' '))
            line[--n] = '\0';
        if (n == 0)
            continue;
        if (line[0] != '{' || line[n - 1] != '}') {
            fprintf(stderr, "%s: %s\n", p->name, line);
            continue;
        }
        printf("%s\n    %s", first ? "" : ",", line);
        first = 0;
    }
    printf("%s]", first ? "" : "\n  ");
}

static void print_document(bench_program *const *run, int n_run,
                           char *const *args, int n_args)
{
    printf("{\"programs\": [");
    for (int i = 0; i < n_run; i++) {
        const bench_program *p = run[i];
        printf("%s\n {\"program\": ", i ? "," : "");
        put_string(p->name);
        printf(", \"path\": ");
        put_string(p->path);
        printf(", \"args\": [");
        for (int a = 0; a < n_args; a++) {
            printf("%s", a ? ", " : "");
            put_string(args[a]);
        }
        printf("], \"exit_status\": %d,\n  \"results\": [", p->exit_status);
        put_results(p);
        printf("}");
    }
    printf("]}\n");
    fflush(stdout);
}

/* --- The command ---------------------------------------------------------- */

typedef struct bench_options {
    const char *only; /* --only, or NULL for all */
    const char *dir;  /* --dir, or NULL */
    int quick;        /* --quick */
} bench_options;

/* Returns -1 with *o filled in to go on, or an exit code (after --help or
 * a usage error). */
static int parse_options(cli *c, int argc, char **argv, bench_options *o)
{
    enum { OPT_QUICK = 0x100, OPT_ONLY, OPT_DIR };
    static const struct option longopts[] = {
        CLI_COMMON_LONGOPTS,
        { "quick", no_argument, NULL, OPT_QUICK },
        { "only", required_argument, NULL, OPT_ONLY },
        { "dir", required_argument, NULL, OPT_DIR },
        { NULL, 0, NULL, 0 },
    };
    int opt;
    while ((opt = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        if (opt == CLI_OPT_HELP || opt == 'h') {
            cli_print_help("bench");
            return CLI_OK;
        }
        /* --store is accepted and means nothing here: the programs make
         * their own scratch stores (--dir says where). */
        if (cli_common_option(c, opt, optarg))
            continue;
        switch (opt) {
        case OPT_QUICK:
            o->quick = 1;
            break;
        case OPT_ONLY:
            o->only = optarg;
            break;
        case OPT_DIR:
            o->dir = optarg;
            break;
        default:
            return cli_option_error("bench", opt, argv);
        }
    }
    if (optind < argc)
        return cli_usage_error("bench", "unexpected argument %s", argv[optind]);
    return -1;
}

/* Finds every program of run[] before any runs: bench_session takes
 * minutes. Returns CLI_OK, or CLI_ENOTFOUND after saying what is missing
 * and how to build it. */
static int find_all(bench_program *const *run, int n_run)
{
    char dirs[N_PLACES][PATH_MAX];
    bench_dirs(dirs);
    int missing = 0, need_sqlite = 0;
    for (int i = 0; i < n_run; i++)
        if (!find_program(run[i], dirs)) {
            report_missing(run[i], dirs);
            if (!missing)
                missing = i + 1; /* the first, for the JSON error */
            need_sqlite |= !strcmp(run[i]->name, "bench_session");
        }
    if (!missing)
        return CLI_OK;
    advise_build(need_sqlite);
    char message[128];
    snprintf(message, sizeof message, "%s not found", run[missing - 1]->name);
    cli_note_error(CTXS_ENOTFOUND, message,
                   "build them with the library (meson setup build && ninja -C build), "
                   "or set CTXSTORE_BENCH_DIR to the directory that holds them");
    return CLI_ENOTFOUND;
}

/* The same options for every program, into args[8]; returns how many. */
static int program_args(char *args[8], const bench_options *o, const cli *c)
{
    int n_args = 0;
    if (o->quick)
        args[n_args++] = "--quick";
    if (c->json)
        args[n_args++] = "--json";
    if (o->dir) {
        args[n_args++] = "--dir";
        args[n_args++] = (char *)o->dir;
    }
    return n_args;
}

/* Runs the programs one after the other. Returns the exit code; a program
 * killed by Ctrl-C cleaned up and died, and the rest are not run then
 * (*interrupted = 1). */
static int run_all(const cli *c, bench_program *const *run, int n_run,
                   char *const *args, int n_args, int *interrupted)
{
    int ec = CLI_OK;
    for (int i = 0; i < n_run; i++) {
        bench_program *p = run[i];
        char *argv_child[10];
        argv_child[0] = (char *)p->name;
        memcpy(argv_child + 1, args, (size_t)n_args * sizeof args[0]);
        argv_child[n_args + 1] = NULL;
        if (c->progress)
            fprintf(stderr, "[%d/%d] %s\n", i + 1, n_run, p->name);
        int rc = run_program(p, argv_child, c->json);
        if (rc < 0) {
            p->exit_status = 127;
            ec = cli_fail(rc, "running %s", p->path);
            continue;
        }
        if (p->exit_status == 128 + SIGINT) {
            *interrupted = 1;
            return CLI_EFAIL;
        }
        if (p->exit_status != 0) {
            if (p->exit_status > 128)
                cli_say("%s was killed by signal %d", p->name,
                        p->exit_status - 128);
            else
                cli_say("%s failed (exit status %d)", p->name,
                        p->exit_status);
            ec = CLI_EFAIL;
        }
        if (!c->json && i + 1 < n_run)
            putchar('\n');
    }
    return ec;
}

int cmd_bench(cli *c, int argc, char **argv)
{
    bench_options o = { 0 };
    int ec = parse_options(c, argc, argv, &o);
    if (ec >= 0)
        return ec;

    bench_program programs[] = {
        { .name = "bench_session", .option = "session" },
        { .name = "bench_index", .option = "index" },
        { .name = "bench_attention", .option = "attention" },
        { .name = "bench_tinychat", .option = "tinychat" },
    };
    enum { N_PROGRAMS = sizeof programs / sizeof programs[0] };
    bench_program *run[N_PROGRAMS];
    int n_run = 0;
    for (int i = 0; i < N_PROGRAMS; i++)
        if (!o.only || !strcmp(o.only, programs[i].option))
            run[n_run++] = &programs[i];
    if (n_run == 0)
        return cli_usage_error("bench", "--only wants session, index, attention or "
                               "tinychat, not %s", o.only);
    if ((ec = find_all(run, n_run)) != CLI_OK)
        return ec;

    char *args[8];
    int n_args = program_args(args, &o, c);
    int interrupted = 0;
    ec = run_all(c, run, n_run, args, n_args, &interrupted);
    if (c->json && !interrupted)
        print_document(run, n_run, args, n_args);
    for (int i = 0; i < n_run; i++)
        free(run[i]->out);
    if (interrupted) {
        /* Ctrl-C: the program cleaned up; stop here, as it did. */
        raise(SIGINT);
        return CLI_EFAIL;
    }
    return ec;
}
