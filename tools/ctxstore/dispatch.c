/*
 * What every program of the ctxstore tool runs first: the options before
 * the command, the command's dispatch (in this process, or a program of
 * its own exec'd in its place), help texts and usage errors. The commands
 * and their help are each program's own (main.c, demo.c, bench.c).
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#define EXIT_CODES                                                             \
    "Exit codes:\n"                                                            \
    "  0  success (verify: no damage found)\n"                                 \
    "  1  the operation failed (an I/O error, ...)\n"                          \
    "  2  bad command line or argument\n"                                      \
    "  3  no such session, checkpoint, model, file or store (prefix: no\n"    \
    "     match)\n"                                                          \
    "  4  busy: a writer or another process holds it\n"                        \
    "  5  damaged: verify found damage, or a file is corrupt, foreign,\n"      \
    "     from a newer version or of another model\n"                         \
    "  6  no space: the disk or the index is full\n"                           \
    "  7  the name or file already exists\n"                                   \
    "  8  the store's index is damaged (not a session file); see the hint\n"    \
    "  9  remote: the server cannot be reached, or it refused the connection\n" \
    "     or the password\n"                                                  \
    "  10 remote: the server answered with an error (full under noeviction,\n" \
    "     not a Redis) or holds a damaged session record\n"

/* The commands cli_main() was given. */
static const cli_command *const *g_commands;
static size_t g_n_commands;

static const cli_command *find_command(const char *name)
{
    for (size_t i = 0; i < g_n_commands; i++)
        if (strcmp(g_commands[i]->name, name) == 0)
            return g_commands[i];
    return NULL;
}

static void print_main_help(FILE *f)
{
    fprintf(f, "usage: ctxstore [--store DIR] [--json] COMMAND [ARGS]\n\n"
               "A persistent, memory-mapped KV cache for LLM chats: look into a store,\n"
               "keep it healthy, see what it does.\n\nCommands:\n");
    for (size_t i = 0; i < g_n_commands; i++)
        fprintf(f, "  %-11s %s\n", g_commands[i]->name, g_commands[i]->summary);
    fprintf(f, "\nOptions (before or after the command):\n"
               "  --store DIR  the store (default: $CTXSTORE_DIR, else\n"
               "               $XDG_DATA_HOME/ctxstore, else ~/.local/share/ctxstore)\n"
               "  --json       machine-readable output; a failure is a JSON\n"
               "               {\"error\": {code, name, message, hint}} on stdout\n"
               "  --help       help for ctxstore or a command\n"
               "  --version    the version\n\n"
               "`ctxstore COMMAND --help` says more; `man ctxstore` says all.\n\n" EXIT_CODES);
}

void cli_print_help(const char *name)
{
    const cli_command *cmd = find_command(name);
    if (!cmd || !cmd->help) {
        print_main_help(stdout);
        return;
    }
    printf("usage: ctxstore %s\n"
           "Common options: --store DIR, --json, --help.\n\n" EXIT_CODES,
           cmd->help);
}

int cli_usage_error(const char *name, const char *fmt, ...)
{
    char message[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof(message), fmt, ap);
    va_end(ap);
    fprintf(stderr, "ctxstore: %s\n", message);
    const cli_command *cmd = find_command(name);
    char hint[64];
    if (cmd && cmd->help) {
        /* The usage lines only: up to the blank line. */
        const char *end = strstr(cmd->help, "\n\n");
        fprintf(stderr, "usage: ctxstore %.*s\n", (int)(end ? end - cmd->help : 0), cmd->help);
        snprintf(hint, sizeof(hint), "`ctxstore %s --help` says more", name);
    } else {
        fprintf(stderr, "usage: ctxstore [--store DIR] [--json] COMMAND [ARGS]\n");
        snprintf(hint, sizeof(hint), "`ctxstore --help` lists the commands");
    }
    fprintf(stderr, "%s.\n", hint);
    cli_note_error(CTXS_EINVAL, message, hint);
    return CLI_EUSAGE;
}

/* $CTXSTORE_DIR, else $XDG_DATA_HOME/ctxstore, else ~/.local/share/ctxstore. */
static const char *default_store_dir(int *given)
{
    static char buf[PATH_MAX];
    const char *env = getenv("CTXSTORE_DIR");
    if (env && *env) {
        *given = 1;
        return env;
    }
    *given = 0;
    const char *xdg = getenv("XDG_DATA_HOME");
    if (xdg && *xdg == '/') {
        snprintf(buf, sizeof(buf), "%s/ctxstore", xdg);
        return buf;
    }
    const char *home = getenv("HOME");
    if (!home || !*home) {
        struct passwd *pw = getpwuid(getuid());
        home = pw ? pw->pw_dir : NULL;
    }
    if (!home)
        return "ctxstore";
    snprintf(buf, sizeof(buf), "%s/.local/share/ctxstore", home);
    return buf;
}

/* Runs the program of cmd (cmd->run NULL) in this process's place, with
 * argv as this program was given it: the program parses it as this one
 * would. Looked for beside the running program (a build tree, where
 * meson puts them together), then in the install's libexecdir/ctxstore.
 * Returns only when neither runs, with the exit code (reported). */
static int exec_program(const cli_command *cmd, char **argv)
{
    char tried[2][PATH_MAX];
    int n = 0;
    char exe[PATH_MAX];
    if (cli_exe_dir(exe, sizeof exe) &&
        snprintf(tried[n], PATH_MAX, "%s/%s", exe, cmd->program) < PATH_MAX)
        n++;
#ifdef CTXS_LIBEXECDIR
    if (snprintf(tried[n], PATH_MAX, "%s/%s", CTXS_LIBEXECDIR, cmd->program) < PATH_MAX)
        n++;
#endif
    int err = ENOENT;
    fflush(stdout);
    fflush(stderr);
    for (int i = 0; i < n; i++) {
        argv[0] = tried[i];
        execv(tried[i], argv);
        if (errno != ENOENT && err == ENOENT)
            err = errno;
    }
    return cli_fail_said(-err, "build it with the tool (`ninja -C build`), or install ctxstore",
                         "`%s` is run by the program %s, which did not run from %s%s%s: %s", cmd->name,
                         cmd->program, n ? tried[0] : "anywhere", n > 1 ? " nor " : "",
                         n > 1 ? tried[1] : "", strerror(err));
}

/* Parses the options before the command and runs it. Returns the exit
 * code. */
static int run(cli *c, int argc, char **argv)
{
    static const struct option longopts[] = {
        CLI_COMMON_LONGOPTS,
        { "version", no_argument, NULL, 'V' },
        { NULL, 0, NULL, 0 },
    };
    int opt;
    /* "+": stop at the command; its own options are its to parse. */
    while ((opt = getopt_long(argc, argv, "+h", longopts, NULL)) != -1) {
        if (cli_common_option(c, opt, optarg))
            continue;
        switch (opt) {
        case 'h':
        case CLI_OPT_HELP:
            print_main_help(stdout);
            return CLI_OK;
        case 'V':
            /* --json may follow: getopt has not reached it yet. */
            if (c->json || c->json_later) {
                char v[32];
                snprintf(v, sizeof(v), "%d.%d.%d", CTXS_VERSION_MAJOR, CTXS_VERSION_MINOR,
                         CTXS_VERSION_PATCH);
                json j;
                json_init(&j, stdout);
                json_object_begin(&j);
                json_kv_string(&j, "version", v);
                json_kv_u64(&j, "major", CTXS_VERSION_MAJOR);
                json_kv_u64(&j, "minor", CTXS_VERSION_MINOR);
                json_kv_u64(&j, "patch", CTXS_VERSION_PATCH);
                json_object_end(&j);
                json_finish(&j);
            } else {
                printf("ctxstore %d.%d.%d\n", CTXS_VERSION_MAJOR, CTXS_VERSION_MINOR,
                       CTXS_VERSION_PATCH);
            }
            return CLI_OK;
        default:
            return cli_option_error("", opt, argv);
        }
    }
    if (optind >= argc) {
        print_main_help(stderr);
        cli_note_error(CTXS_EINVAL, "no command given", "`ctxstore --help` lists the commands");
        return CLI_EUSAGE;
    }
    const char *name = argv[optind];
    if (strcmp(name, "help") == 0) {
        const cli_command *about = optind + 1 < argc ? find_command(argv[optind + 1]) : NULL;
        if (about && !about->run)
            return exec_program(about, argv);
        if (optind + 1 < argc)
            cli_print_help(argv[optind + 1]);
        else
            print_main_help(stdout);
        return CLI_OK;
    }
    const cli_command *cmd = find_command(name);
    if (!cmd)
        return cli_usage_error(name, "'%s' is not a command", name);
    if (!cmd->run)
        return exec_program(cmd, argv);
    /* The command sees argv from its own name on. */
    int sub_argc = argc - optind;
    char **sub_argv = argv + optind;
#ifdef __GLIBC__
    optind = 0; /* 0 reinitializes glibc's getopt for the next scan */
#else
    optind = 1;
#endif
    return cmd->run(c, sub_argc, sub_argv);
}

int cli_main(const cli_command *const *commands, size_t n, int argc, char **argv)
{
    g_commands = commands;
    g_n_commands = n;
    cli c = { 0 };
    c.store_dir = default_store_dir(&c.store_given);
    c.progress = isatty(STDERR_FILENO);
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        c.json_later |= strcmp(argv[i], "--json") == 0;
    cli_report_begin(&c);
    /* Each command says what is wrong with an option itself
     * (cli_option_error()), once. */
    opterr = 0;
    return cli_report_end(run(&c, argc, argv));
}
