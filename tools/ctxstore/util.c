/*
 * The helpers the subcommands share: errors with advice, exit codes,
 * human-readable values, the JSON writer and the progress bar.
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

/* --- Errors --------------------------------------------------------------- */

int cli_exit_code(int rc)
{
    switch (rc) {
    case 0:
        return CLI_OK;
    case CTXS_ENOTFOUND:
    case CTXS_ENOMODEL:
    case -ENOENT:
        return CLI_ENOTFOUND;
    case CTXS_EBUSY:
    case -EBUSY:
        return CLI_EBUSY;
    case CTXS_ECORRUPT:
    case CTXS_EFOREIGN:
    case CTXS_EVERSION:
    case CTXS_EMODEL:
    case CTXS_ESTALE:
    case CTXS_EEVICTED:
        return CLI_EDAMAGED;
    case CTXS_EFULL:
    case -ENOSPC:
    case -EDQUOT:
        return CLI_EFULL;
    case -EEXIST:
    case CTXS_ETAKEN:
        return CLI_EEXIST;
    case CTXS_EINVAL:
    case CTXS_ETOOBIG:
        return CLI_EUSAGE;
    case CTXS_EINDEX:
        return CLI_EINDEX;
    case CTXS_EREMOTE:
        return CLI_EREMOTE;
    default:
        return cli_is_network_error(rc) ? CLI_EREMOTE_DOWN : CLI_EFAIL;
    }
}

int cli_is_network_error(int rc)
{
    switch (rc) {
    case -ECONNREFUSED:
    case -ECONNRESET:
    case -ECONNABORTED:
    case -ETIMEDOUT:
    case -EHOSTUNREACH:
    case -EHOSTDOWN:
    case -ENETUNREACH:
    case -ENETDOWN:
    case -ENETRESET:
    case -ENOTCONN:
    case -EPIPE:
        return 1;
    default:
        return 0;
    }
}

/* The rule names.c applies to every session and checkpoint name. */
#define NAME_RULE CTXS_NAME_RULE

/* A damaged index: the session files are fine, and the index is rebuilt
 * from them once the damaged one is out of the way (what a read-write
 * open does where sessions/ has no index beside it). */
#define INDEX_HINT                                                             \
    "the session files are not at fault: `ctxstore repair-index` moves the "  \
    "damaged index aside, rebuilds it from them and keeps what of it still "  \
    "reads (names, checkpoints, metadata, pins, model names)"

void cli_index_hint(char *buf, size_t n, const char *dir)
{
    snprintf(buf, n,
             "the session files are not at fault: `ctxstore --store %s repair-index` "
             "moves the damaged index aside, rebuilds it from them and keeps what of it "
             "still reads (names, checkpoints, metadata, pins, model names)",
             dir);
}

const char *cli_advice(int rc)
{
    switch (rc) {
    case CTXS_EINDEX:
        return INDEX_HINT;
    case CTXS_ECORRUPT:
        return "run `ctxstore verify` to see what is damaged; restore the session from an export, or delete it with `ctxstore rm`";
    case CTXS_EFOREIGN:
        return "the file is not what ctxstore writes; check the path";
    case CTXS_EVERSION:
        return "it was written by a newer ctxstore; upgrade this one to read it";
    case CTXS_EMODEL:
        return "the session belongs to another model; use that model, or import under the right one";
    case CTXS_EBUSY:
        return "a process has it open; close the app that uses it and try again";
    case CTXS_EFULL:
    case -ENOSPC:
        return "free disk space, e.g. with `ctxstore gc --max-size SIZE`";
    case CTXS_ENOTFOUND:
        return "`ctxstore ls` lists the sessions";
    case CTXS_EINVAL:
        /* Each command checks its own arguments before the library sees
         * them, so what the library refuses is a name (fork --at and import
         * say more). */
        return NAME_RULE;
    case CTXS_ESTALE:
    case CTXS_EEVICTED:
        return "the session no longer holds those tokens; pick a later point or another checkpoint";
    case CTXS_EFAILED:
        return "reopen the session";
    case CTXS_ETOOBIG:
        return "a value holds at most 64 KiB, and a session's keys and values together 256 KiB";
    case -EACCES:
    case -EPERM:
        return "check the permissions of the store directory";
    case -EEXIST:
        return "choose another path, or move the existing file away first";
    case CTXS_ETAKEN:
        return "choose another name, or rename or remove the session that has it";
    case CTXS_ENOMODEL:
        return "`ctxstore models` lists the registered models; `ctxstore models register` "
               "adds one";
    case CTXS_EREMOTE:
        return "the server refused a command (full under maxmemory-policy noeviction? see "
               "`ctxstore remote stat`) or holds a damaged record";
    default:
        if (cli_is_network_error(rc))
            return "check that the Redis server runs there and that this machine reaches it "
                   "(host, port, firewall); `ctxstore remote stat` tries the connection";
        return NULL;
    }
}

const char *const cli_name_rule = NAME_RULE;

int cli_check_name(const char *what, const char *name)
{
    const char *why = ctxs_name_check(name);
    if (!why)
        return -1;
    /* The name as typed, but a control character would garble the
     * terminal: shown as '?'. */
    char shown[300];
    size_t i = 0;
    for (; name[i] && i < sizeof(shown) - 4; i++)
        shown[i] = (unsigned char)name[i] < 0x20 || name[i] == 0x7f ? '?' : name[i];
    if (name[i])
        memcpy(shown + i, "...", 3), i += 3;
    shown[i] = '\0';
    return cli_fail_said(CTXS_EINVAL, NAME_RULE, "%s '%s' %s", what, shown, why);
}

/* What this run reported, for the one JSON document that --json promises
 * on stdout (see cli_report_begin() in cli.h). Process-wide because every
 * failure, wherever it is met, goes through cli_fail() and friends, which
 * do not take the cli; one command runs per process (per ctxs_cli_main()
 * call in the fuzzer, which main resets it for). */
static struct {
    const cli *c;
    int documents;     /* JSON documents written to stdout */
    int failed;        /* the first failure is below; later ones are not */
    int code;          /* a library return code */
    char message[4608]; /* paths are up to PATH_MAX */
    char hint[512];    /* "" for none */
    char said[512];    /* the last cli_say(): the message of a failure
                          that had no cli_fail() */
} g_report;

void cli_report_begin(const cli *c)
{
    memset(&g_report, 0, sizeof(g_report));
    g_report.c = c;
}

void cli_note_error(int rc, const char *message, const char *hint)
{
    if (g_report.failed)
        return;
    g_report.failed = 1;
    g_report.code = rc;
    snprintf(g_report.message, sizeof(g_report.message), "%s", message);
    snprintf(g_report.hint, sizeof(g_report.hint), "%s", hint ? hint : "");
}

void json_error(json *j)
{
    if (!g_report.failed)
        return;
    json_key(j, "error");
    json_object_begin(j);
    json_kv_i64(j, "code", g_report.code);
    json_kv_string(j, "name", ctxs_err_name(g_report.code));
    json_kv_string(j, "message", g_report.message);
    json_key(j, "hint");
    if (g_report.hint[0])
        json_string(j, g_report.hint);
    else
        json_null(j);
    json_object_end(j);
}

/* The library code that stands for an exit code, for a failure that was
 * only said in words. */
static int code_of_exit(int ex)
{
    switch (ex) {
    case CLI_EUSAGE:
        return CTXS_EINVAL;
    case CLI_ENOTFOUND:
        return CTXS_ENOTFOUND;
    case CLI_EBUSY:
        return CTXS_EBUSY;
    case CLI_EDAMAGED:
        return CTXS_ECORRUPT;
    case CLI_EFULL:
        return CTXS_EFULL;
    case CLI_EEXIST:
        return -EEXIST;
    case CLI_EINDEX:
        return CTXS_EINDEX;
    case CLI_EREMOTE_DOWN:
        return -ECONNREFUSED;
    case CLI_EREMOTE:
        return CTXS_EREMOTE;
    default:
        return CTXS_EFAILED;
    }
}

int cli_report_end(int ex)
{
    const cli *c = g_report.c;
    /* A command that printed its result said what it did, and any failure
     * in it; one that failed before printing gets the error document. */
    if (ex != CLI_OK && c && (c->json || c->json_later) && g_report.documents == 0) {
        if (!g_report.failed)
            cli_note_error(code_of_exit(ex), g_report.said[0] ? g_report.said : "the command failed",
                           NULL);
        json j;
        json_init(&j, stdout);
        json_object_begin(&j);
        json_error(&j);
        json_object_end(&j);
        json_finish(&j);
    }
    memset(&g_report, 0, sizeof(g_report));
    return ex;
}

void cli_say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_report.said, sizeof(g_report.said), fmt, ap);
    va_end(ap);
    fprintf(stderr, "ctxstore: %s\n", g_report.said);
}

/* Says message and rc's name, then the hint (see cli_fail_hint()). */
static int report_failure(int rc, const char *hint, const char *message)
{
    if (!hint)
        hint = cli_advice(rc);
    else if (!hint[0])
        hint = NULL;
    fprintf(stderr, "ctxstore: %s (%s)\n", message, ctxs_err_name(rc));
    if (hint)
        fprintf(stderr, "  hint: %s\n", hint);
    cli_note_error(rc, message, hint);
    return cli_exit_code(rc);
}

const char *cli_reason(int rc)
{
    const char *why = ctxs_get_last_error();
    return rc != 0 && ctxs_get_last_error_code() == rc && why[0] ? why : NULL;
}

int cli_fail_hint(int rc, const char *hint, const char *fmt, ...)
{
    char what[4480];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    /* The library's reason says more than the code's text: it names the
     * argument and the rule (a name's rule included, so the generic hint
     * of CTXS_EINVAL would only repeat or mislead). */
    const char *why = cli_reason(rc);
    /* A taken name's reason names it and says what to do, which every
     * caller here says already (the name in what, the way out in the
     * hint): the code's text is enough. */
    if (rc == CTXS_ETAKEN)
        why = NULL;
    if (why && rc == CTXS_EINVAL && !hint)
        hint = CLI_NO_HINT;
    char message[sizeof(g_report.message)];
    snprintf(message, sizeof(message), "%s: %s", what, why ? why : ctxs_strerror(rc));
    return report_failure(rc, hint, message);
}

int cli_fail_said(int rc, const char *hint, const char *fmt, ...)
{
    char message[sizeof(g_report.message)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof(message), fmt, ap);
    va_end(ap);
    return report_failure(rc, hint, message);
}

/* What the last cli_store_open() made: 0 nothing, 1 a store in an existing
 * directory, 2 the directory too. */
static int g_made;

void cli_store_made(const cli *c, int ok)
{
    static const char *const made[] = { "index/data.mdb", "index/lock.mdb", "index/store.lock",
                                        "index", "sessions" };
    if (!g_made)
        return;
    if (ok) {
        fprintf(stderr, "ctxstore: created store %s\n", c->store_dir);
        return;
    }
    /* Only what the open made, and only while the store holds nothing. */
    for (size_t i = 0; i < sizeof(made) / sizeof(made[0]); i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof(path), "%s/%s", c->store_dir, made[i]);
        if (i < 3)
            unlink(path);
        else if (rmdir(path) != 0)
            return;
    }
    if (g_made == 2)
        rmdir(c->store_dir);
}

/* Whether dir/name exists, as a directory (want_dir) or a regular file. */
static int store_has(const char *dir, const char *name, int want_dir)
{
    char path[PATH_MAX];
    struct stat sb;
    if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, name) >= sizeof(path) ||
        stat(path, &sb) != 0)
        return 0;
    return want_dir ? S_ISDIR(sb.st_mode) : S_ISREG(sb.st_mode);
}

int cli_index_special(const char *dir, const char **name, char *what, size_t n)
{
    static const char *const files[] = { "data.mdb", "lock.mdb", "store.lock" };
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        char path[PATH_MAX];
        struct stat sb;
        if ((size_t)snprintf(path, sizeof(path), "%s/index/%s", dir, files[i]) >= sizeof(path) ||
            lstat(path, &sb) != 0 || S_ISREG(sb.st_mode))
            continue;
        *name = files[i];
        if (S_ISLNK(sb.st_mode)) {
            char target[PATH_MAX];
            ssize_t k = readlink(path, target, sizeof(target) - 1);
            target[k > 0 ? k : 0] = '\0';
            snprintf(what, n, "a symbolic link to '%s'", target);
        } else {
            snprintf(what, n, "%s",
                     S_ISFIFO(sb.st_mode)  ? "a FIFO (named pipe)"
                     : S_ISSOCK(sb.st_mode) ? "a socket"
                     : S_ISCHR(sb.st_mode)  ? "a character device"
                     : S_ISBLK(sb.st_mode)  ? "a block device"
                     : S_ISDIR(sb.st_mode)  ? "a directory"
                                            : "not a regular file");
        }
        return 1;
    }
    return 0;
}

/* A file of DIR/index that is not a regular file: what it is, and the
 * way out. Returns the exit code, or -1 when there is none. */
static int index_special_fail(int rc, const char *dir)
{
    const char *name;
    char what[PATH_MAX + 64], hint[PATH_MAX * 3 + 256];
    if (!cli_index_special(dir, &name, what, sizeof(what)))
        return -1;
    if (strcmp(what, "a directory") == 0 && strcmp(name, "data.mdb") != 0)
        snprintf(hint, sizeof(hint),
                 "remove it (`rm -r %s/index/%s`: it holds nothing the store needs), and the "
                 "next command makes the file again", dir, name);
    else if (strcmp(name, "data.mdb") != 0)
        snprintf(hint, sizeof(hint),
                 "`ctxstore --store %s repair-index` removes it "
                 "(it holds nothing the store needs) and the store makes it anew; or remove it, and the next command "
                 "makes it again", dir);
    else if (strncmp(what, "a symbolic link", 15) == 0)
        snprintf(hint, sizeof(hint),
                 "if the link's target is this store's index, move that file into its place "
                 "(`mv TARGET %s/index/data.mdb`); else `ctxstore --store %s repair-index` "
                 "moves the link aside and rebuilds the index from the session files", dir, dir);
    else
        snprintf(hint, sizeof(hint),
                 "`ctxstore --store %s repair-index` moves it aside and rebuilds the index "
                 "from the session files", dir);
    return cli_fail_said(rc, hint,
                         "%s/index/%s is %s, where ctxstore keeps a regular file (it never "
                         "opens anything else there, nor follows a link out of the store)",
                         dir, name, what);
}

#define MAKE_STORE_HINT                                                        \
    "give the store with --store DIR (or $CTXSTORE_DIR); `ctxstore import` "  \
    "and `ctxstore models register` make a new one"

int cli_store_open(const cli *c, ctxs_store **out, enum cli_store_mode mode)
{
    const char *dir = c->store_dir;
    if (!dir[0])
        return cli_fail_said(CTXS_EINVAL, "give the store's directory: --store DIR",
                             "--store is empty: it takes the store's directory");
    /* A file given as the store: most likely a session file meant for a
     * command that reads one. */
    struct stat fsb;
    if (stat(dir, &fsb) == 0 && !S_ISDIR(fsb.st_mode)) {
        cli_fail_said(-ENOTDIR, "--store takes the store's directory (index/ and sessions/); "
                                "`ctxstore info FILE` and `ctxstore verify FILE` read a "
                                "session file by its path",
                      "no store at %s: it is a file, not a directory", dir);
        return CLI_ENOTFOUND;
    }
    int had_dir = store_has(dir, ".", 1);
    int had_index = store_has(dir, "index/data.mdb", 0);
    char sessions[64];
    cli_sessions_dir(sessions, sizeof(sessions), NULL);
    int had_sessions = store_has(dir, sessions, 1);
    g_made = 0;
    unsigned flags = 0;
    if (mode == CLI_STORE_READ)
        flags = CTXS_RDONLY;
    else if (mode == CLI_STORE_CREATE || (mode == CLI_STORE_REBUILD && had_sessions))
        flags = CTXS_STORE_CREATE;
    int rc = ctxs_store_open(out, dir, flags, NULL);
    if (rc == 0) {
        if ((flags & CTXS_STORE_CREATE) && !had_index && had_sessions)
            fprintf(stderr, "ctxstore: %s had no index; made a new one\n", dir);
        else if ((flags & CTXS_STORE_CREATE) && !had_index)
            g_made = had_dir ? 1 : 2;
        return CLI_OK;
    }
    /* A store given as a symlink is followed (ctxs_store_open()); one that
     * leads nowhere is said as such, never made at its far end. */
    struct stat lsb;
    if ((rc == -ENOENT || rc == -ELOOP) && lstat(dir, &lsb) == 0 && S_ISLNK(lsb.st_mode)) {
        char target[PATH_MAX];
        ssize_t n = readlink(dir, target, sizeof(target) - 1);
        target[n > 0 ? n : 0] = '\0';
        cli_fail_said(rc, "point the link at a store's directory, or give the store's own path",
                      rc == -ELOOP ? "no store at %s: it is a symbolic link in a loop (to '%s')"
                                   : "no store at %s: it is a symbolic link to '%s', which "
                                     "does not exist (a dangling link is never followed to "
                                     "make a store)",
                      dir, target);
        return CLI_ENOTFOUND;
    }
    if (rc == -ENOENT && !had_dir && mode == CLI_STORE_CREATE) {
        /* This command makes a store, but only in a directory that is
         * there or whose parent is. */
        char parent[PATH_MAX], hint[PATH_MAX + 128];
        snprintf(parent, sizeof(parent), "%s", dir);
        char *slash = strrchr(parent, '/');
        while (slash && slash > parent && slash[1] == '\0') /* trailing '/' */
            *slash = '\0', slash = strrchr(parent, '/');
        if (slash)
            slash[slash == parent] = '\0';
        snprintf(hint, sizeof(hint), "make its parent first (`mkdir -p %s`), or give "
                 "another --store", slash ? parent : ".");
        cli_fail_said(rc, hint, "cannot make a store at %s: its parent directory %s does not "
                      "exist", dir, slash ? parent : ".");
        return CLI_ENOTFOUND;
    }
    if (rc == -ENOENT && !had_dir) {
        cli_fail_said(rc, MAKE_STORE_HINT, "no store at %s: the directory does not exist", dir);
        return CLI_ENOTFOUND;
    }
    if (rc == CTXS_EFOREIGN && !had_index) {
        if (had_sessions)
            cli_fail_said(rc, "`ctxstore reindex` rebuilds it from the session files",
                          "%s is not a store: it has sessions/ but no index", dir);
        else
            cli_fail_said(rc, MAKE_STORE_HINT, "%s is not a ctxstore store", dir);
        return CLI_ENOTFOUND;
    }
    if (rc == CTXS_EFOREIGN)
        return cli_fail_said(rc, "check the path; ctxstore leaves it alone",
                             "%s/index holds something that is not a ctxstore index", dir);
    int special = rc == CTXS_EINDEX ? index_special_fail(rc, dir) : -1;
    if (special >= 0)
        return special;
    if (rc == CTXS_EINDEX) {
        char hint[PATH_MAX * 3 + 256];
        cli_index_hint(hint, sizeof(hint), dir);
        return cli_fail_said(rc, hint,
                             "the index of store %s (%s/index/data.mdb) is damaged: cut short, "
                             "or a page or record of it is unreadable", dir, dir);
    }
    if (rc == -ENOENT && mode == CLI_STORE_READ)
        return cli_fail_said(rc, "a command that writes (e.g. `ctxstore reindex`) completes it",
                             "the store %s is not complete: its creation did not finish, "
                             "or sessions/ is gone", dir);
    if (rc == CTXS_EBUSY && mode == CLI_STORE_READ)
        return cli_fail_hint(rc, "you may read this store but not write it, and another "
                                 "process has it open; try again once it is closed",
                             "store %s", dir);
    return cli_fail(rc, "store %s", dir);
}

int cli_common_option(cli *c, int opt, const char *arg)
{
    switch (opt) {
    case CLI_OPT_STORE:
        c->store_dir = arg;
        c->store_given = 1;
        return 1;
    case CLI_OPT_JSON:
        c->json = 1;
        c->progress = 0;
        return 1;
    default:
        return 0;
    }
}

int cli_option_error(const char *command, int opt, char **argv)
{
    const char *arg = optind > 0 ? argv[optind - 1] : "";
    if (strncmp(arg, "--", 2) == 0) {
        int n = (int)strcspn(arg, "=");
        if (optopt != 0 && arg[n] == '=')
            return cli_usage_error(command, "%.*s takes no value", n, arg);
        if (optopt != 0 || opt == ':')
            return cli_usage_error(command, "%.*s needs a value", n, arg);
        return cli_usage_error(command, "unknown option '%.*s'", n, arg);
    }
    if (opt == ':')
        return cli_usage_error(command, "-%c needs a value", optopt);
    return cli_usage_error(command, "unknown option '-%c'", optopt ? optopt : '?');
}

int cli_getopt(cli *c, int argc, char **argv, const char *shortopts,
               const struct option *longopts, int *ex)
{
    int opt;
    while ((opt = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        if (cli_common_option(c, opt, optarg))
            continue;
        if (opt == 'h' || opt == CLI_OPT_HELP) {
            cli_print_help(argv[0]);
            *ex = CLI_OK;
            return CLI_GETOPT_EXIT;
        }
        if (opt == '?' || opt == ':') {
            *ex = cli_option_error(argv[0], opt, argv);
            return CLI_GETOPT_EXIT;
        }
        return opt;
    }
    return -1;
}

int cli_parse_common(cli *c, int argc, char **argv, int *first)
{
    static const struct option longopts[] = { CLI_COMMON_LONGOPTS, { NULL, 0, NULL, 0 } };
    int ex;
    if (cli_getopt(c, argc, argv, "h", longopts, &ex) == CLI_GETOPT_EXIT)
        return ex;
    *first = optind;
    return -1;
}

int cli_one_session(cli *c, int argc, char **argv, const char *missing, ctxs_store **st)
{
    if (argc - optind != 1)
        return cli_usage_error(argv[0], "%s takes one NAME", argv[0]);
    if (missing)
        return cli_usage_error(argv[0], "%s", missing);
    int ex = cli_check_name("session name", argv[optind]);
    return ex >= 0 ? ex : cli_store_open(c, st, CLI_STORE_WRITE);
}

int cli_parse_one_or_all(cli *c, int argc, char **argv, const char **only)
{
    static const struct option longopts[] = {
        CLI_COMMON_LONGOPTS,
        { "all", no_argument, NULL, 'a' },
        { NULL, 0, NULL, 0 },
    };
    int opt, all = 0, ex;
    while ((opt = cli_getopt(c, argc, argv, "ah", longopts, &ex)) != -1) {
        if (opt == CLI_GETOPT_EXIT)
            return ex;
        all = 1; /* 'a', the one option of its own */
    }
    if (argc - optind > 1 || (all && argc - optind == 1))
        return cli_usage_error(argv[0], "%s takes one session, or --all", argv[0]);
    *only = optind < argc ? argv[optind] : NULL;
    return -1;
}


int cli_exe_dir(char *buf, size_t n)
{
#ifdef __linux__
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0)
        return 0;
    exe[len] = '\0';
    char *slash = strrchr(exe, '/');
    return slash && snprintf(buf, n, "%.*s", (int)(slash - exe), exe) < (int)n;
#else
    (void)buf;
    (void)n;
    return 0;
#endif
}

int cli_is_session_path(const char *arg)
{
    size_t n = strlen(arg);
    struct stat sb;
    return (strchr(arg, '/') != NULL || (n > 5 && strcmp(arg + n - 5, ".ctxs") == 0)) &&
           stat(arg, &sb) == 0 && !S_ISDIR(sb.st_mode);
}

int cli_check_session_or_path(const char *arg)
{
    const char *why = ctxs_name_check(arg);
    if (!why || !strchr(arg, '/'))
        return cli_check_name("session name", arg);
    char shown[300];
    snprintf(shown, sizeof(shown), "%s", arg);
    for (char *p = shown; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
    return cli_fail_said(CTXS_EINVAL, NAME_RULE,
                         "no session file at '%s', and as a session name it %s", shown, why);
}

void cli_session_path(char *buf, size_t n, const cli *c, uint64_t id)
{
    ctxs_store_session_get_path(buf, n, c->store_dir, id);
}

void cli_sessions_dir(char *buf, size_t n, const char *store_dir)
{
    ctxs_store_session_get_path(buf, n, store_dir, 0);
    char *slash = strrchr(buf, '/');
    if (slash)
        *slash = '\0';
}

const char *cli_intent_kind(const ctxs_intent_entry *e)
{
    return e->kind == CTXS_INTENT_CREATE ? "create" : "delete";
}

const char *cli_intent_action(const ctxs_intent_entry *e)
{
    return e->action == CTXS_INTENT_WAIT          ? "wait"
           : e->action == CTXS_INTENT_REMOVE_FILE ? "remove_file"
                                                  : "drop";
}

void cli_intent_sentence(char *buf, size_t n, const cli *c, const ctxs_intent_entry *e)
{
    char path[4096], pid[48] = "";
    cli_session_path(path, sizeof(path), c, e->id);
    if (e->pid)
        snprintf(pid, sizeof(pid), " by process %" PRIu32, e->pid);
    const char *what = e->kind == CTXS_INTENT_CREATE
                           ? "a create, fork or import"
                           : "a delete";
    switch (e->action) {
    case CTXS_INTENT_WAIT:
        snprintf(buf, n, "%s of %s%s is under way (its process is running, or a handle has the "
                 "file open); the next read-write open of the store leaves it alone",
                 what, path, pid);
        break;
    case CTXS_INTENT_REMOVE_FILE:
        snprintf(buf, n, "%s of %s%s was interrupted by a crash before %s; the next read-write "
                 "open of the store (any command that writes, `ctxstore compact` among them) "
                 "removes the file, which no session owns",
                 what, path, pid,
                 e->kind == CTXS_INTENT_CREATE ? "the index named the file"
                                               : "the file was removed");
        break;
    default:
        snprintf(buf, n, "%s of %s%s was interrupted by a crash %s; the next read-write open "
                 "of the store drops the index's record of it",
                 what, path, pid,
                 e->file_present                  ? "when it was done but for that record"
                 : e->kind == CTXS_INTENT_CREATE ? "before its file was in place"
                                                 : "after its file was removed");
        break;
    }
}

void cli_intents_json(json *j, const char *key, const cli *c, const ctxs_intent_entry *list,
                      size_t n)
{
    json_key(j, key);
    json_array_begin(j);
    for (size_t i = 0; i < n; i++) {
        char path[4096], what[4096 + 512];
        cli_session_path(path, sizeof(path), c, list[i].id);
        cli_intent_sentence(what, sizeof(what), c, &list[i]);
        json_object_begin(j);
        json_kv_u64(j, "id", list[i].id);
        json_kv_string(j, "file", path);
        json_kv_string(j, "kind", cli_intent_kind(&list[i]));
        json_kv_u64(j, "pid", list[i].pid);
        json_kv_bool(j, "file_present", (int)list[i].file_present);
        json_kv_string(j, "action", cli_intent_action(&list[i]));
        json_kv_string(j, "what", what);
        json_object_end(j);
    }
    json_array_end(j);
}

size_t cli_strays(ctxs_store_file **out, const cli *c, ctxs_store *st)
{
    ctxs_store_file *files = NULL;
    size_t n = 0, k = 0;
    if (ctxs_store_file_list(&files, &n, c->store_dir, st) < 0)
        n = 0;
    for (size_t i = 0; i < n; i++)
        if (files[i].regular && files[i].status != 0) /* else adopted */
            files[k++] = files[i];
    *out = files;
    return k;
}

void cli_stray_hint(char *buf, size_t n, const cli *c, const char *file)
{
    char dir[PATH_MAX];
    cli_sessions_dir(dir, sizeof(dir), c->store_dir);
    snprintf(buf, n,
             "it cannot be adopted, so compact and reindex leave it: keep it aside with "
             "`mkdir -p %s/damaged && mv %s/%s %s/damaged/`, or delete it with "
             "`rm %s/%s`",
             c->store_dir, dir, file, c->store_dir, dir, file);
}

const ctxs_record_report *cli_current_record(const ctxs_file_report *r)
{
    for (int i = 0; i < 2; i++)
        if (r->records[i].status == 0 && r->records[i].current)
            return &r->records[i];
    return NULL;
}

uint64_t cli_held(const ctxs_file_report *r, const ctxs_record_report *rec)
{
    uint64_t n = rec->n_tokens, ns = r->n_sink;
    uint64_t first = rec->ring_start > ns ? rec->ring_start : ns;
    return (n < ns ? n : ns) + (n > first ? n - first : 0);
}

int cli_session_tokens(const cli *c, uint64_t id, uint64_t *positions, uint64_t *held)
{
    char path[PATH_MAX];
    ctxs_file_report rep;
    cli_session_path(path, sizeof(path), c, id);
    int rc = ctxs_file_inspect(&rep, path);
    const ctxs_record_report *cur = rc == 0 && rep.status == 0 ? cli_current_record(&rep) : NULL;
    if (!cur)
        return rc < 0 ? rc : rep.status < 0 ? rep.status : CTXS_ECORRUPT;
    *positions = cur->n_tokens;
    *held = cli_held(&rep, cur);
    return 0;
}

const char *fmt_tokens(char buf[64], uint64_t positions, uint64_t held)
{
    if (held == positions)
        snprintf(buf, 64, "%" PRIu64 " token%s", held, held == 1 ? "" : "s");
    else
        snprintf(buf, 64, "%" PRIu64 " tokens held of %" PRIu64 " positions", held, positions);
    return buf;
}

const char *cli_model_name(char buf[256], ctxs_store *st, const uint8_t hash[16])
{
    ctxs_model_entry e;
    if (st && ctxs_model_get(&e, st, hash) == 0 && e.name[0]) {
        snprintf(buf, 256, "%s", e.name);
    } else {
        char hex[33];
        snprintf(buf, 256, "%.8s", fmt_hash(hex, hash));
    }
    return buf;
}

/* --- Human-readable values ------------------------------------------------- */

/* Whether code point cp takes two columns: the East Asian Wide and
 * Fullwidth blocks of Unicode's EastAsianWidth.txt, by block. */
static int is_wide(uint32_t cp)
{
    return (cp >= 0x1100 && cp <= 0x115f) || (cp >= 0x2e80 && cp <= 0x303e) ||
           (cp >= 0x3041 && cp <= 0x33ff) || (cp >= 0x3400 && cp <= 0x4dbf) ||
           (cp >= 0x4e00 && cp <= 0x9fff) || (cp >= 0xa000 && cp <= 0xa4cf) ||
           (cp >= 0xac00 && cp <= 0xd7a3) || (cp >= 0xf900 && cp <= 0xfaff) ||
           (cp >= 0xfe30 && cp <= 0xfe4f) || (cp >= 0xff00 && cp <= 0xff60) ||
           (cp >= 0xffe0 && cp <= 0xffe6) || (cp >= 0x1f300 && cp <= 0x1f64f) ||
           (cp >= 0x1f900 && cp <= 0x1f9ff) || (cp >= 0x20000 && cp <= 0x3fffd);
}

/* Combining marks and zero-width characters: no column of their own. */
static int is_zero_width(uint32_t cp)
{
    return (cp >= 0x0300 && cp <= 0x036f) || (cp >= 0x1ab0 && cp <= 0x1aff) ||
           (cp >= 0x1dc0 && cp <= 0x1dff) || (cp >= 0x200b && cp <= 0x200f) ||
           (cp >= 0x20d0 && cp <= 0x20ff) || (cp >= 0xfe00 && cp <= 0xfe0f) ||
           (cp >= 0xfe20 && cp <= 0xfe2f);
}

int cli_display_width(const char *s)
{
    int w = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        uint32_t cp = *p;
        size_t n = cp < 0x80 ? 1 : cp >= 0xf0 ? 4 : cp >= 0xe0 ? 3 : cp >= 0xc0 ? 2 : 0;
        size_t k = 1;
        if (n > 1) {
            cp &= 0x3fu >> (n - 1);
            for (; k < n && (p[k] & 0xc0) == 0x80; k++)
                cp = cp << 6 | (p[k] & 0x3fu);
        }
        if (n == 0 || k < n) /* not UTF-8: a byte, a column */
            w++, p += n == 0 ? 1 : k;
        else
            w += is_wide(cp) ? 2 : is_zero_width(cp) ? 0 : 1, p += n;
    }
    return w;
}

const char *fmt_size(char buf[32], uint64_t bytes)
{
    static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
    if (bytes < 1024) {
        snprintf(buf, 32, "%" PRIu64 " B", bytes);
        return buf;
    }
    double v = (double)bytes;
    int u = 0;
    while (v >= 1023.5 && u < 6) /* as rounded: not "1024 KiB" */
        v /= 1024, u++;
    snprintf(buf, 32, v < 9.995 ? "%.2f %s" : v < 99.95 ? "%.1f %s" : "%.0f %s", v, units[u]);
    return buf;
}

const char *fmt_duration(char buf[32], double s)
{
    /* Three digits in the smallest unit that holds the value below 1000
     * once rounded: 0.9996 s is "1 s", not "1e+03 ms". */
    static const struct {
        double scale;
        const char *name;
    } units[] = {{1e-9, "ns"}, {1e-6, "us"}, {1e-3, "ms"}, {1, "s"}};
    if (s < 0)
        s = 0;
    if (s >= 60) {
        snprintf(buf, 32, "%d min %d s", (int)(s / 60), (int)fmod(s, 60));
        return buf;
    }
    uint32_t u = 0;
    while (u < 3 && s / units[u].scale >= 999.5)
        u++;
    if (u == 0)
        snprintf(buf, 32, "%.0f ns", s * 1e9);
    else
        snprintf(buf, 32, "%.3g %s", s / units[u].scale, units[u].name);
    return buf;
}

const char *fmt_age(char buf[32], uint64_t unix_ms)
{
    if (unix_ms == 0) {
        snprintf(buf, 32, "never");
        return buf;
    }
    uint64_t now = cli_now_ms();
    if (unix_ms > now + 60000) {
        snprintf(buf, 32, "in the future");
        return buf;
    }
    uint64_t s = now > unix_ms ? (now - unix_ms) / 1000 : 0;
    if (s < 60)
        snprintf(buf, 32, "just now");
    else if (s < 3600)
        snprintf(buf, 32, "%" PRIu64 " min ago", s / 60);
    else if (s < 86400)
        snprintf(buf, 32, "%" PRIu64 " h ago", s / 3600);
    else
        snprintf(buf, 32, "%" PRIu64 " days ago", s / 86400);
    return buf;
}

const char *fmt_schedule(char *buf, size_t size, const ctxs_geometry *g)
{
    if (!g->period) {
        snprintf(buf, size, "every layer global");
        return buf;
    }
    size_t at = (size_t)snprintf(buf, size, "repeating every %" PRIu32 " layer%s:", g->period,
                                 g->period == 1 ? "" : "s");
    for (uint32_t j = 0; j < g->period && j < CTXS_SCHEDULE_MAX && at < size; j++) {
        if (g->window[j])
            at += (size_t)snprintf(buf + at, size - at, "%s window %" PRIu32, j ? "," : "",
                                   g->window[j]);
        else
            at += (size_t)snprintf(buf + at, size - at, "%s global", j ? "," : "");
    }
    return buf;
}

void json_schedule(json *j, const ctxs_geometry *g)
{
    json_key(j, "schedule");
    json_object_begin(j);
    json_kv_u64(j, "period", g->period);
    json_key(j, "window");
    json_array_begin(j);
    for (uint32_t k = 0; k < g->period && k < CTXS_SCHEDULE_MAX; k++)
        json_u64(j, g->window[k]);
    json_array_end(j);
    json_object_end(j);
}

const char *fmt_dtype(uint32_t dtype)
{
    switch (dtype) {
    case CTXS_DTYPE_F16:
        return "fp16";
    case CTXS_DTYPE_BF16:
        return "bf16";
    case CTXS_DTYPE_Q8:
        return "q8";
    default:
        return "unknown";
    }
}

int parse_dtype(const char *s, uint32_t *out)
{
    if (strcmp(s, "fp16") == 0 || strcmp(s, "f16") == 0)
        *out = CTXS_DTYPE_F16;
    else if (strcmp(s, "bf16") == 0)
        *out = CTXS_DTYPE_BF16;
    else if (strcmp(s, "q8") == 0)
        *out = CTXS_DTYPE_Q8;
    else
        return -1;
    return 0;
}

const char *fmt_time(char buf[32], uint64_t unix_ms)
{
    time_t t = (time_t)(unix_ms / 1000);
    struct tm tm;
    if (unix_ms == 0 || !gmtime_r(&t, &tm) ||
        strftime(buf, 32, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
        snprintf(buf, 32, "-");
    return buf;
}

const char *fmt_hash(char buf[33], const uint8_t hash[16])
{
    for (int i = 0; i < 16; i++)
        snprintf(buf + 2 * i, 3, "%02x", hash[i]);
    return buf;
}

int parse_hash(const char *s, uint8_t out[16])
{
    if (!s || strlen(s) != 32)
        return -1;
    for (int i = 0; i < 32; i++) {
        char ch = s[i];
        int v = ch >= '0' && ch <= '9'   ? ch - '0'
                : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                                         : -1;
        if (v < 0)
            return -1;
        if (i % 2 == 0)
            out[i / 2] = (uint8_t)(v << 4);
        else
            out[i / 2] |= (uint8_t)v;
    }
    return 0;
}

int parse_u64(const char *s, uint64_t *out)
{
    if (!s || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return -1;
    *out = v;
    return 0;
}

int parse_size(const char *s, uint64_t *out)
{
    if (!s || !((*s >= '0' && *s <= '9') || *s == '.'))
        return -1;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || !(v >= 0))
        return -1;
    static const struct {
        const char *suffix;
        double scale;
    } units[] = {
        { "", 1 },        { "B", 1 },
        { "K", 0x1p10 },  { "KB", 0x1p10 }, { "KiB", 0x1p10 },
        { "M", 0x1p20 },  { "MB", 0x1p20 }, { "MiB", 0x1p20 },
        { "G", 0x1p30 },  { "GB", 0x1p30 }, { "GiB", 0x1p30 },
        { "T", 0x1p40 },  { "TB", 0x1p40 }, { "TiB", 0x1p40 },
    };
    while (*end == ' ')
        end++;
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcasecmp(end, units[i].suffix) == 0) {
            double bytes = v * units[i].scale;
            if (bytes >= 0x1p64)
                return -1;
            *out = (uint64_t)bytes;
            return 0;
        }
    }
    return -1;
}

uint64_t cli_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

double cli_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* --- JSON ------------------------------------------------------------------ */

void json_init(json *j, FILE *f)
{
    memset(j, 0, sizeof(*j));
    j->f = f;
    j->first[0] = 1;
}

static void json_item(json *j)
{
    if (j->after_key) {
        j->after_key = 0;
        return;
    }
    if (!j->first[j->depth])
        fputc(',', j->f);
    j->first[j->depth] = 0;
}

static void json_open(json *j, char ch)
{
    json_item(j);
    fputc(ch, j->f);
    if (j->depth < 31)
        j->depth++;
    j->first[j->depth] = 1;
}

static void json_close(json *j, char ch)
{
    if (j->depth > 0)
        j->depth--;
    fputc(ch, j->f);
}

void json_object_begin(json *j) { json_open(j, '{'); }
void json_object_end(json *j) { json_close(j, '}'); }
void json_array_begin(json *j) { json_open(j, '['); }
void json_array_end(json *j) { json_close(j, ']'); }

/* Length of the well-formed UTF-8 sequence at p, or 0. */
static size_t utf8_length(const unsigned char *p)
{
    unsigned c = p[0], min, cp;
    size_t n;
    if (c >= 0xc2 && c <= 0xdf)
        n = 2, min = 0x80, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef)
        n = 3, min = 0x800, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4)
        n = 4, min = 0x10000, cp = c & 0x07;
    else
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80) /* the NUL ends it here too */
            return 0;
        cp = cp << 6 | (p[i] & 0x3fu);
    }
    return cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) ? 0 : n;
}

/* Error messages echo what the user typed, which need not be text: a byte
 * that is not UTF-8 becomes U+FFFD, so that the document stays JSON. */
static void json_quoted(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p >= 0x80) {
            size_t n = utf8_length(p);
            if (n == 0)
                fputs("\\ufffd", f);
            else
                fwrite(p, 1, n, f), p += n - 1;
            continue;
        }
        switch (*p) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (*p < 0x20 || *p == 0x7f)
                fprintf(f, "\\u%04x", *p);
            else
                fputc(*p, f);
        }
    }
    fputc('"', f);
}

void json_key(json *j, const char *key)
{
    json_item(j);
    json_quoted(j->f, key);
    fputc(':', j->f);
    j->after_key = 1;
}

void json_string(json *j, const char *s)
{
    json_item(j);
    json_quoted(j->f, s);
}

void json_u64(json *j, uint64_t v)
{
    json_item(j);
    fprintf(j->f, "%" PRIu64, v);
}

void json_i64(json *j, int64_t v)
{
    json_item(j);
    fprintf(j->f, "%" PRId64, v);
}

void json_double(json *j, double v)
{
    json_item(j);
    if (isfinite(v))
        fprintf(j->f, "%.9g", v);
    else
        fputs("null", j->f);
}

void json_bool(json *j, int v)
{
    json_item(j);
    fputs(v ? "true" : "false", j->f);
}

void json_null(json *j)
{
    json_item(j);
    fputs("null", j->f);
}

void json_hex(json *j, const uint8_t *p, size_t n)
{
    json_item(j);
    fputc('"', j->f);
    for (size_t i = 0; i < n; i++)
        fprintf(j->f, "%02x", p[i]);
    fputc('"', j->f);
}

void json_begin_named(json *j, const char *name)
{
    json_init(j, stdout);
    json_object_begin(j);
    json_kv_string(j, "name", name);
}

void json_finish(json *j)
{
    if (j->f == stdout)
        g_report.documents++;
    fputc('\n', j->f);
    fflush(j->f);
}

void json_kv_string(json *j, const char *key, const char *s) { json_key(j, key); json_string(j, s); }
void json_kv_u64(json *j, const char *key, uint64_t v) { json_key(j, key); json_u64(j, v); }
void json_kv_i64(json *j, const char *key, int64_t v) { json_key(j, key); json_i64(j, v); }
void json_kv_double(json *j, const char *key, double v) { json_key(j, key); json_double(j, v); }
void json_kv_bool(json *j, const char *key, int v) { json_key(j, key); json_bool(j, v); }

/* --- Progress ---------------------------------------------------------------- */

void progress_start(progress *p, const cli *c, const char *label, uint64_t total, int bytes)
{
    memset(p, 0, sizeof(*p));
    p->label = label;
    p->total = total;
    p->bytes = bytes;
    p->enabled = c->progress;
    p->started = cli_now_s();
}

static void progress_draw(progress *p, uint64_t done)
{
    enum { WIDTH = 30 };
    double frac = p->total ? (double)done / (double)p->total : 1;
    if (frac > 1)
        frac = 1;
    int fill = (int)(frac * WIDTH);
    char bar[WIDTH + 1];
    for (int i = 0; i < WIDTH; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[WIDTH] = '\0';
    char a[32], b[32];
    if (p->bytes)
        fprintf(stderr, "\r%s [%s] %3d%% %s / %s ", p->label, bar, (int)(frac * 100),
                fmt_size(a, done), fmt_size(b, p->total));
    else
        fprintf(stderr, "\r%s [%s] %3d%% %" PRIu64 " / %" PRIu64 " ", p->label, bar,
                (int)(frac * 100), done, p->total);
    fflush(stderr);
    p->drawn = 1;
}

void progress_update(progress *p, uint64_t done)
{
    if (!p->enabled)
        return;
    double now = cli_now_s();
    /* Nothing for work that ends quickly; then ten frames a second. */
    if (now - p->started < 0.3 || now - p->last_draw < 0.1)
        return;
    p->last_draw = now;
    progress_draw(p, done);
}

void progress_end(progress *p)
{
    if (p->enabled && p->drawn) {
        progress_draw(p, p->total);
        fputc('\n', stderr);
    }
    p->drawn = 0;
}

void progress_callback(void *arg, uint64_t done, uint64_t total)
{
    progress *p = arg;
    p->total = total;
    progress_update(p, done);
}
