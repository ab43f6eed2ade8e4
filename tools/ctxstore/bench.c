/*
 * ctxstore bench — runs the benchmark programs and prints what they found
 * as a short table: for each step of a chat's life (saving a turn,
 * resuming, finding a prompt's session, forking, the first token after a
 * reopen, the next token of the example transformer, and with --remote
 * pushing to and pulling from Redis), the time ctxstore took, the time of
 * the usual alternative (a state file, a SQLite blob, a scan of the
 * files, a recomputed prefill, raw SET/GET), and how many times faster or
 * slower ctxstore was. Each program runs with --json; its own notes and
 * headers (stderr) are kept back and shown only when it fails. Run a
 * program by itself for its whole table and notes.
 *
 * The programs are looked for in $CTXSTORE_BENCH_DIR, then next to the tool
 * in a build tree (<build>/tools/ctxstore/ctxstore finds <build>/bench/),
 * then in the directory the build names as CTXS_LIBEXECDIR.
 *
 * With --json the tool prints one document: the comparisons of the table,
 * and every program's own rows:
 *
 *     {"comparisons": [{"part": "session", "step": ..., "tokens": N,
 *                       "ctxstore_us": M, "alternative": ...,
 *                       "alternative_us": A, "ratio": A / M}, ...],
 *      "skipped": [{"part": "remote", "why": ...}],
 *      "programs": [
 *        {"program": "bench_session", "path": "...", "args": ["--quick"],
 *         "exit_status": 0, "results": [{"op": ..., ...}, ...]}, ...]}
 *
 * exit_status is the program's exit status, or 128 + the signal that
 * killed it.
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
    char *out;          /* what it wrote to stdout: one JSON object a line */
    size_t out_len;
    FILE *err;          /* what it wrote to stderr, kept back */
    char *argv[16];     /* how it was run, NULL-terminated */
    int argc;
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
    char exe[PATH_MAX];
    if (cli_exe_dir(exe, sizeof exe) && snprintf(dirs[1], PATH_MAX, "%s/../../bench", exe) >= PATH_MAX)
        dirs[1][0] = '\0';
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
    if (p->err)
        posix_spawn_file_actions_adddup2(&fa, fileno(p->err), STDERR_FILENO);

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

/* --- What the table compares ------------------------------------------------ */

/* One row of the table: the median of ctxstore's row against the median of
 * the alternative's, both from the same program and of the same op (and the
 * same tokens, the most both have). */
typedef struct comparison {
    const char *part;        /* the program's --only name */
    const char *step;        /* what is timed, in words */
    const char *op;          /* the rows' "op" */
    const char *method;      /* ctxstore's row */
    const char *alternative; /* the alternative's row */
    const char *words;       /* the alternative, in words */
    const char *where[2];    /* "key=value": fields both rows must hold, or NULL */
    const char *slower_why;  /* said under the table when ctxstore is slower */
} comparison;

static const comparison k_comparisons[] = {
    { "session", "save a turn of 64 tokens", "save_turn", "ctxstore_async", "rewrite_fdatasync",
      "rewrite a state file + fdatasync", { "dtype=f16", "pause_ms=50" }, NULL },
    { "session", "save a turn of 64 tokens", "save_turn", "ctxstore_async", "sqlite_blob",
      "one SQLite BLOB row", { "dtype=f16", "pause_ms=50" }, NULL },
    { "session", "resume, ready to attend", "resume_ready", "ctxstore_async", "read_file",
      "read a state file", { "dtype=f16", NULL }, NULL },
    { "session", "resume, ready to attend", "resume_ready", "ctxstore_async", "sqlite_select",
      "SELECT the SQLite BLOB", { "dtype=f16", NULL }, NULL },
    { "index", "find the session of a prompt", "full_hit", "ctxs_prefix_find", "naive_scan",
      "read every session file", { NULL, NULL }, NULL },
    { "index", "fork a session of 2048 tokens", "fork_2048", "ctxs_store_session_fork",
      "state_fdatasync", "write a state file + fdatasync", { NULL, NULL }, NULL },
    { "attention", "first token after a reopen, cold", "first_step", "mapping", "read_file_cold",
      "read a state file, then the step", { "cache=cold", "think_ms=0" },
      "the step right after a cold open waits for each page it reads;\n"
      "  a second's pause before it (a user typing) lets the background read them first" },
    { "attention", "first token after a reopen, warm", "first_step", "mapping", "read_file",
      "read a state file, then the step", { "cache=warm", "think_ms=0" }, NULL },
    { "tinychat", "next token after a reopen", "next_token", "resume", "recompute",
      "recompute the prefill", { NULL, NULL }, NULL },
    { "remote", "push a whole session to Redis", "push_session", "ctxstore", "raw_set",
      "SET of the same bytes", { NULL, NULL }, NULL },
    { "remote", "pull a session from Redis", "pull_session", "ctxstore", "raw_get_sync",
      "GET, write + fdatasync", { NULL, NULL },
      "a pull checks every token's checksum and writes each chunk's runs\n"
      "  to their places in the session file; the raw GET keeps one blob" },
    { "remote", "resume on another machine", "resume", "remote", "state_file",
      "GET a state file + fdatasync", { NULL, NULL }, NULL },
};
enum { N_COMPARISONS = sizeof k_comparisons / sizeof k_comparisons[0] };

/* The number after "key": in a row, or -1. */
static double row_number(const char *row, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *at = strstr(row, pat);
    if (!at)
        return -1;
    char *end;
    double v = strtod(at + strlen(pat), &end);
    return end == at + strlen(pat) ? -1 : v;
}

/* Whether the value of key in row (a string without its quotes, or a
 * number as written) is value. */
static int row_has(const char *row, const char *key, size_t key_len, const char *value)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%.*s\":", (int)key_len, key);
    const char *at = strstr(row, pat);
    if (!at)
        return 0;
    at += strlen(pat);
    if (*at == '"')
        at++;
    size_t n = strcspn(at, "\",}");
    return n == strlen(value) && strncmp(at, value, n) == 0;
}

/* Whether row is of op and method and holds where[]. */
static int row_is(const char *row, const char *op, const char *method,
                  const char *const where[2])
{
    if (!row_has(row, "op", 2, op) || !row_has(row, "method", 6, method))
        return 0;
    for (int i = 0; i < 2; i++)
        if (where[i] && !row_has(row, where[i], strcspn(where[i], "="),
                                 where[i] + strcspn(where[i], "=") + 1))
            return 0;
    return 1;
}

/* The median of the row of op and method with tokens (-1: the most tokens
 * any such row has; *tokens gets them, 0 for rows without a count), or
 * -1 when there is none. */
static double find_median(const bench_program *p, const comparison *k, const char *method,
                          double want_tokens, double *tokens)
{
    double best = -1, best_tokens = -1;
    for (const char *line = p->out; line && *line;) {
        const char *nl = strchr(line, '\n');
        size_t n = nl ? (size_t)(nl - line) : strlen(line);
        char row[2048];
        if (n < sizeof row) {
            memcpy(row, line, n);
            row[n] = '\0';
            if (row_is(row, k->op, method, k->where)) {
                double t = row_number(row, "tokens"), m = row_number(row, "median_us");
                if (t < 0)
                    t = 0;
                if (m > 0 && (want_tokens < 0 ? t > best_tokens : t == want_tokens))
                    best = m, best_tokens = t;
            }
        }
        line = nl ? nl + 1 : NULL;
    }
    *tokens = best_tokens;
    return best;
}

typedef struct measured {
    const comparison *k;
    double tokens, ctxstore_us, alternative_us; /* -1: not measured */
} measured;

static int measure(measured *out, bench_program *const *run, int n_run)
{
    int n = 0;
    for (size_t i = 0; i < N_COMPARISONS; i++) {
        const comparison *k = &k_comparisons[i];
        const bench_program *p = NULL;
        for (int r = 0; r < n_run && !p; r++)
            if (!strcmp(run[r]->option, k->part) && run[r]->exit_status == 0)
                p = run[r];
        if (!p)
            continue;
        measured *m = &out[n++];
        m->k = k;
        m->alternative_us = -1;
        m->ctxstore_us = find_median(p, k, k->method, -1, &m->tokens);
        if (m->ctxstore_us > 0) {
            double t;
            m->alternative_us = find_median(p, k, k->alternative, m->tokens, &t);
        }
    }
    return n;
}

static void print_table(const measured *m, int n)
{
    if (n == 0)
        return;
    printf("\n%-34s %6s %10s   %-33s %10s  %s\n", "STEP", "TOKENS", "CTXSTORE", "ALTERNATIVE",
           "ITS TIME", "CTXSTORE IS");
    for (int i = 0; i < n; i++) {
        char a[32], b[32], tok[16] = "-";
        const measured *r = &m[i];
        if (r->tokens > 0)
            snprintf(tok, sizeof tok, "%.0f", r->tokens);
        if (r->ctxstore_us <= 0 || r->alternative_us <= 0) {
            printf("%-34s %6s %10s   %-33s %10s  not measured\n", r->k->step, tok, "-",
                   r->k->words, "-");
            continue;
        }
        double x = r->alternative_us / r->ctxstore_us;
        char verdict[48];
        if (x >= 1)
            snprintf(verdict, sizeof verdict, "%.*fx faster", x < 10 ? 1 : 0, x);
        else
            snprintf(verdict, sizeof verdict, "%.*fx slower", 1 / x < 10 ? 1 : 0, 1 / x);
        printf("%-34s %6s %10s   %-33s %10s  %s\n", r->k->step, tok,
               fmt_duration(a, r->ctxstore_us / 1e6), r->k->words,
               fmt_duration(b, r->alternative_us / 1e6), verdict);
    }
    putchar('\n');
    for (int i = 0; i < n; i++)
        if (m[i].k->slower_why && m[i].ctxstore_us > m[i].alternative_us &&
            m[i].alternative_us > 0)
            printf("%s: %s.\n", m[i].k->step, m[i].k->slower_why);
    printf("Medians of several runs each; on a shared machine a run moves by tens of "
           "percent.\n`ctxstore bench --json` gives every program's rows; a program run by "
           "itself\n(bench_session, bench_index, ...) prints its whole table and notes.\n");
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

static void put_number(double v)
{
    if (v < 0)
        printf("null");
    else
        printf("%.1f", v);
}

static void print_document(const measured *m, int n_measured, const char *skipped,
                           const char *skipped_why, bench_program *const *run, int n_run)
{
    printf("{\"comparisons\": [");
    for (int i = 0; i < n_measured; i++) {
        const measured *r = &m[i];
        printf("%s\n  {\"part\": ", i ? "," : "");
        put_string(r->k->part);
        printf(", \"step\": ");
        put_string(r->k->step);
        printf(", \"tokens\": %.0f, \"ctxstore\": ", r->tokens > 0 ? r->tokens : 0);
        put_string(r->k->method);
        printf(", \"ctxstore_us\": ");
        put_number(r->ctxstore_us);
        printf(", \"alternative\": ");
        put_string(r->k->alternative);
        printf(", \"alternative_words\": ");
        put_string(r->k->words);
        printf(", \"alternative_us\": ");
        put_number(r->alternative_us);
        printf(", \"ratio\": ");
        if (r->ctxstore_us > 0 && r->alternative_us > 0)
            printf("%.3f", r->alternative_us / r->ctxstore_us);
        else
            printf("null");
        printf("}");
    }
    printf("],\n \"skipped\": [");
    if (skipped) {
        printf("{\"part\": ");
        put_string(skipped);
        printf(", \"why\": ");
        put_string(skipped_why);
        printf("}");
    }
    printf("],\n \"programs\": [");
    for (int i = 0; i < n_run; i++) {
        const bench_program *p = run[i];
        printf("%s\n {\"program\": ", i ? "," : "");
        put_string(p->name);
        printf(", \"path\": ");
        put_string(p->path);
        printf(", \"args\": [");
        for (int a = 1; a < p->argc; a++) {
            printf("%s", a > 1 ? ", " : "");
            put_string(p->argv[a]);
        }
        printf("], \"exit_status\": %d,\n  \"results\": [", p->exit_status);
        put_results(p);
        printf("}");
    }
    printf("]}\n");
    fflush(stdout);
}

/* --- The command ---------------------------------------------------------- */

typedef struct bench_part {
    bench_program prog;
    const char *what;       /* in words, for the line before it runs */
    const char *quick_args[4]; /* more options with --quick, NULL-terminated */
    int quick_s, full_s;    /* about how long it runs on the project's 2-core
                               VM (measured), for the first line */
} bench_part;

typedef struct bench_options {
    const char *only; /* --only, or NULL for all */
    const char *dir;  /* --dir, or NULL */
    int quick;        /* --quick */
    int remote;       /* --remote */
} bench_options;

/* Returns -1 with *o filled in to go on, or an exit code (after --help or
 * a usage error). */
static int parse_options(cli *c, int argc, char **argv, bench_options *o)
{
    enum { OPT_QUICK = 0x100, OPT_ONLY, OPT_DIR, OPT_REMOTE };
    static const struct option longopts[] = {
        CLI_COMMON_LONGOPTS,
        { "quick", no_argument, NULL, OPT_QUICK },
        { "only", required_argument, NULL, OPT_ONLY },
        { "dir", required_argument, NULL, OPT_DIR },
        { "remote", no_argument, NULL, OPT_REMOTE },
        { NULL, 0, NULL, 0 },
    };
    /* --store is accepted and means nothing here: the programs make their
     * own scratch stores (--dir says where). */
    int opt, ex;
    while ((opt = cli_getopt(c, argc, argv, ":h", longopts, &ex)) > 0) {
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
        default: /* OPT_REMOTE */
            o->remote = 1;
            break;
        }
    }
    if (opt == CLI_GETOPT_EXIT)
        return ex;
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

/* Whether a redis-server can be started, as bench_remote starts it:
 * $REDIS_SERVER_BIN, else redis-server on $PATH. If not, why into why. */
static int have_redis_server(char *why, size_t n)
{
    const char *bin = getenv("REDIS_SERVER_BIN");
    if (bin && *bin) {
        if (strchr(bin, '/') && is_executable(bin))
            return 1;
        snprintf(why, n, "$REDIS_SERVER_BIN (%s) is not the path of a program", bin);
        return 0;
    }
    snprintf(why, n, "no redis-server on $PATH (install it, e.g. the redis-server package, "
                     "or name one with $REDIS_SERVER_BIN)");
    const char *path = getenv("PATH");
    if (!path)
        return 0;
    char dir[PATH_MAX], file[PATH_MAX + 16];
    for (const char *p = path; *p;) {
        size_t len = strcspn(p, ":");
        if (len && len < sizeof dir) {
            memcpy(dir, p, len);
            dir[len] = '\0';
            snprintf(file, sizeof file, "%s/redis-server", dir);
            if (is_executable(file))
                return 1;
        }
        p += len + (p[len] == ':');
    }
    return 0;
}

/* p->argv: the program, --quick and quick_args, --json, --dir. */
static void program_args(bench_part *part, const bench_options *o)
{
    bench_program *p = &part->prog;
    p->argc = 0;
    p->argv[p->argc++] = (char *)p->name;
    if (o->quick) {
        p->argv[p->argc++] = "--quick";
        for (int k = 0; k < 4 && part->quick_args[k]; k++)
            p->argv[p->argc++] = (char *)part->quick_args[k];
    }
    p->argv[p->argc++] = "--json";
    if (o->dir) {
        p->argv[p->argc++] = "--dir";
        p->argv[p->argc++] = (char *)o->dir;
    }
    p->argv[p->argc] = NULL;
}

/* Shows the end of what p wrote to stderr: why it failed. */
static void show_its_words(bench_program *p)
{
    if (!p->err || fseek(p->err, 0, SEEK_END) != 0)
        return;
    long size = ftell(p->err), from = size > 4096 ? size - 4096 : 0;
    if (size <= 0 || fseek(p->err, from, SEEK_SET) != 0)
        return;
    char buf[4097];
    size_t n = fread(buf, 1, sizeof buf - 1, p->err);
    buf[n] = '\0';
    const char *text = buf;
    if (from > 0 && strchr(text, '\n'))
        text = strchr(text, '\n') + 1;
    fprintf(stderr, "%s said:\n%s%s", p->name, text, n && buf[n - 1] != '\n' ? "\n" : "");
}

/* Runs the parts one after the other. Returns the exit code; a program
 * killed by Ctrl-C cleaned up and died, and the rest are not run then
 * (*interrupted = 1). */
static int run_all(const cli *c, bench_part *const *run, int n_run, int *interrupted)
{
    int ec = CLI_OK;
    for (int i = 0; i < n_run; i++) {
        bench_program *p = &run[i]->prog;
        if (c->progress)
            fprintf(stderr, "[%d/%d] %s: %s\n", i + 1, n_run, p->option, run[i]->what);
        p->err = tmpfile();
        int rc = run_program(p, p->argv, 1);
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
                cli_say("%s was killed by signal %d", p->name, p->exit_status - 128);
            else
                cli_say("%s failed (exit status %d)", p->name, p->exit_status);
            show_its_words(p);
            ec = CLI_EFAIL;
        }
    }
    return ec;
}

/* "40 s", "3 min": about how long, rounded. */
static const char *about_time(char buf[32], int seconds)
{
    if (seconds < 90)
        snprintf(buf, 32, "%d s", (seconds + 5) / 10 * 10);
    else
        snprintf(buf, 32, "%d min", (seconds + 30) / 60);
    return buf;
}

const cli_command cli_cmd_bench = {
    .name = "bench",
    .run = cmd_bench,
    .summary = CLI_BENCH_SUMMARY,
    .help =
        "bench [--quick] [--remote] [--only session|index|attention|tinychat|remote]\n"
        "      [--dir DIR] [--json]\n\n"
        "Times each step of a chat's life with ctxstore and with the usual\n"
        "alternative, on Qwen3-4B's KV geometry, and prints one table: saving a\n"
        "turn and resuming (against a state file and a SQLite blob), finding a\n"
        "prompt's session and forking (against reading every file, writing a\n"
        "state file), the first token after a reopen, the example transformer's\n"
        "next token (against recomputing the prefill) and, with --remote, pushing\n"
        "to and pulling from Redis (against SET and GET; it starts its own\n"
        "redis-server, and is skipped, saying so, where there is none). The\n"
        "first line says about how long it takes: --quick, about 2 min on 2\n"
        "cores, measures what the table shows; without it, many minutes.\n"
        "The programs (bench_session, bench_index, bench_attention,\n"
        "bench_tinychat, bench_remote) work in DIR (default $TMPDIR, else\n"
        "/var/tmp) and are found in $CTXSTORE_BENCH_DIR, beside the tool in a\n"
        "build tree, or where they are installed; run one by itself for its\n"
        "whole table and notes. With --json, one document: {\"comparisons\":\n"
        "[{\"part\", \"step\", \"tokens\", \"ctxstore_us\", \"alternative_us\",\n"
        "\"ratio\"}], \"skipped\": [...], \"programs\": [{\"program\", \"args\",\n"
        "\"exit_status\", \"results\": [...]}]}.\n",
};

int cmd_bench(cli *c, int argc, char **argv)
{
    bench_options o = { 0 };
    int ec = parse_options(c, argc, argv, &o);
    if (ec >= 0)
        return ec;

    /* quick_args keep each program's ratios and cut what the table does
     * not show (bench_session's other contexts and dtypes). */
    bench_part parts[] = {
        { { .name = "bench_session", .option = "session" },
          "saving a turn and resuming, against a state file and SQLite",
          { "--tokens", "2048", "--dtype", "f16" }, 45, 600 },
        { { .name = "bench_index", .option = "index" },
          "finding a prompt's session and forking, against reading the files", { NULL }, 25, 180 },
        { { .name = "bench_attention", .option = "attention" },
          "the first token after a reopen, against reading a state file",
          { "--tokens", "2048", "--dtype", "f16" }, 30, 300 },
        { { .name = "bench_tinychat", .option = "tinychat" },
          "the example transformer's next token, against recomputing the prefill", { NULL }, 30,
          240 },
        { { .name = "bench_remote", .option = "remote" },
          "pushing to and pulling from Redis, against SET and GET of the same bytes", { NULL }, 60,
          180 },
    };
    enum { N_PARTS = sizeof parts / sizeof parts[0] };
    bench_part *run[N_PARTS];
    bench_program *progs[N_PARTS];
    int n_run = 0, known = 0;
    const char *skipped = NULL;
    char skipped_why[PATH_MAX + 64] = "";
    for (int i = 0; i < N_PARTS; i++) {
        int remote = !strcmp(parts[i].prog.option, "remote");
        int want = o.only ? !strcmp(o.only, parts[i].prog.option) : !remote || o.remote;
        known |= want;
        if (want && remote && !have_redis_server(skipped_why, sizeof skipped_why)) {
            skipped = "remote";
            continue;
        }
        if (want)
            progs[n_run] = &parts[i].prog, run[n_run++] = &parts[i];
    }
    if (!known)
        return cli_usage_error("bench", "--only wants session, index, attention, tinychat or "
                               "remote, not %s", o.only);
    if ((ec = find_all(progs, n_run)) != CLI_OK)
        return ec;

    int quick_s = 0, full_s = 0;
    for (int i = 0; i < n_run; i++) {
        quick_s += run[i]->quick_s;
        full_s += run[i]->full_s;
        program_args(run[i], &o);
    }
    char about[32], about_quick[48] = "";
    about_time(about, o.quick ? quick_s : full_s);
    if (!o.quick) {
        char q[32];
        snprintf(about_quick, sizeof about_quick, " (--quick: %s)", about_time(q, quick_s));
    }
    FILE *say = c->json ? stderr : stdout;
    if (n_run)
        fprintf(say, "Timing ctxstore step by step against the usual ways to keep a KV cache "
                 "(a state file, SQLite, reading every file, recomputing%s), on Qwen3-4B's "
                 "KV geometry: about %s on 2 cores%s.\n",
            o.remote || (o.only && !strcmp(o.only, "remote")) ? ", Redis SET/GET" : "", about,
            about_quick);
    if (skipped)
        fprintf(say, "%s: skipped: %s\n", skipped, skipped_why);
    fflush(say);

    int interrupted = 0;
    ec = n_run ? run_all(c, run, n_run, &interrupted) : CLI_OK;
    if (!interrupted) {
        measured m[N_COMPARISONS];
        int n_measured = measure(m, progs, n_run);
        if (c->json)
            print_document(m, n_measured, skipped, skipped_why, progs, n_run);
        else
            print_table(m, n_measured);
    }
    for (int i = 0; i < n_run; i++) {
        free(progs[i]->out);
        if (progs[i]->err)
            fclose(progs[i]->err);
    }
    if (interrupted) {
        /* Ctrl-C: the program cleaned up; stop here, as it did. */
        raise(SIGINT);
        return CLI_EFAIL;
    }
    return ec;
}

/* The program ctxstore-bench, which `ctxstore bench` runs in its place with the
 * tool's own argv (dispatch.c). */
int main(int argc, char **argv)
{
    static const cli_command *const commands[] = { &cli_cmd_bench };
    return cli_main(commands, 1, argc, argv);
}
