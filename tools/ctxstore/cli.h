/*
 * What the subcommands of the ctxstore tool share: the parsed common
 * options, exit codes, error messages with advice, human-readable sizes and
 * times, a JSON writer and a progress bar.
 */
#ifndef CTXS_CLI_H
#define CTXS_CLI_H

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>

#include "ctxstore.h"

/* Exit codes, the same for every subcommand (documented in --help and
 * ctxstore.1). */
enum {
    CLI_OK = 0,
    CLI_EFAIL = 1,     /* the operation failed (I/O error, ...) */
    CLI_EUSAGE = 2,    /* bad command line */
    CLI_ENOTFOUND = 3, /* no such session, checkpoint, model, store or
                          file; no session holds the prompt's prefix */
    CLI_EBUSY = 4,     /* a writer or another process holds it */
    CLI_EDAMAGED = 5,  /* verify found damage; a file is corrupt, foreign or
                          from a newer version */
    CLI_EFULL = 6,     /* disk or index full */
    CLI_EEXIST = 7,    /* the name or file already exists */
    CLI_EINDEX = 8,    /* the store's index is damaged (not a session file) */
    CLI_EREMOTE_DOWN = 9, /* the remote cannot be reached, or it refused the
                             connection or the password */
    CLI_EREMOTE = 10,  /* the remote answered with an error (out of memory
                          under noeviction, not a Redis) or holds a damaged
                          session record */
};

typedef struct cli {
    const char *store_dir; /* --store, $CTXSTORE_DIR, or the default */
    int store_given;       /* --store or $CTXSTORE_DIR was given */
    int json;              /* --json */
    int json_later;        /* "--json" is among the arguments: a usage
                              error met before it is parsed is JSON too */
    int progress;          /* draw progress bars (stderr is a terminal) */
} cli;

/* A subcommand: argv[0] is its name. Returns an exit code. */
typedef int (*cli_command_fn)(cli *c, int argc, char **argv);

/* A command as the dispatcher knows it: each is defined beside its cmd_*
 * function, with its help. */
typedef struct cli_command {
    const char *name;
    cli_command_fn run;  /* NULL: a program of its own runs it (program) */
    const char *summary; /* one line, for `ctxstore --help` */
    const char *help;    /* usage and what it does, after "usage: ctxstore ";
                            NULL with run NULL (the program has it) */
    const char *program; /* with run NULL: the program's file name, looked
                            for beside the running program, then in the
                            install's libexecdir/ctxstore */
} cli_command;

/* The main() of a program of the tool: sets c up from the environment
 * ($CTXSTORE_DIR, ...), parses the options before the command, and runs
 * the command named, one of commands[0..n-1] ("help COMMAND" prints its
 * help); a command run by a program of its own is exec'd with the same
 * argv. Returns the exit code. commands stays the dispatcher's for help
 * and usage errors: one run per process, as the report state. */
int cli_main(const cli_command *const *commands, size_t n, int argc, char **argv);

/* demo and bench are programs of their own (they link an example engine
 * and run other programs): the tool names them, they run them. */
#define CLI_DEMO_PROGRAM "ctxstore-demo"
#define CLI_DEMO_SUMMARY "play a chat, save each turn, resume it (the main job)"
#define CLI_BENCH_PROGRAM "ctxstore-bench"
#define CLI_BENCH_SUMMARY "time ctxstore against the usual ways to keep a KV cache"

/* Options every subcommand accepts besides its own: --store DIR, --json,
 * --help. Put CLI_COMMON_LONGOPTS first in a getopt_long table and pass
 * each option to cli_common_option(), which returns 1 if it took it. */
enum { CLI_OPT_STORE = 0x1000, CLI_OPT_JSON, CLI_OPT_HELP };
#define CLI_COMMON_LONGOPTS                                                    \
    { "store", required_argument, NULL, CLI_OPT_STORE },                       \
    { "json", no_argument, NULL, CLI_OPT_JSON },                               \
    { "help", no_argument, NULL, CLI_OPT_HELP }
int cli_common_option(cli *c, int opt, const char *arg);

/* The usage error for what getopt_long() refused (opt '?' or ':'):
 * names the option, and says whether it is unknown, needs a value or
 * takes none. getopt itself says nothing (main() clears opterr). */
int cli_option_error(const char *command, int opt, char **argv);

/* The next option of argv (argv[0] the command, as getopt_long() with
 * shortopts and longopts, which start with CLI_COMMON_LONGOPTS) that is
 * the command's own: the common options are taken (cli_common_option()),
 * -h and --help print the command's help, and an option getopt refused
 * is a usage error (cli_option_error()); both return CLI_GETOPT_EXIT with
 * *ex the exit code. -1 at the end (optind at the first argument). */
enum { CLI_GETOPT_EXIT = -2 };
int cli_getopt(cli *c, int argc, char **argv, const char *shortopts,
               const struct option *longopts, int *ex);

/* Parses argv (argv[0] the command) for a command that has only the common
 * options: returns -1 with *first set to the first positional argument, or
 * an exit code (after --help, or a usage error). */
int cli_parse_common(cli *c, int argc, char **argv, int *first);

/* For a command on the one session NAME that argv holds after its options
 * (argv[optind]): a usage error unless there is exactly one, then missing
 * (an option the command needs and lacks, in words) as one unless NULL,
 * then the name checked, then c's store opened for writing into *st.
 * Returns CLI_OK, or the exit code (reported). */
int cli_one_session(cli *c, int argc, char **argv, const char *missing, ctxs_store **st);

/* As cli_parse_common(), for a command that takes [SESSION | --all]:
 * *only is the session, or NULL for all. */
int cli_parse_one_or_all(cli *c, int argc, char **argv, const char **only);

/* The directory of the running program (/proc/self/exe), into buf: 1, or
 * 0 where the system does not say. */
int cli_exe_dir(char *buf, size_t n);

/* Whether the argument arg names a session file by its path rather than a
 * session of the store: it has a '/' (which no name has) or ends in
 * ".ctxs", and a file is there. */
int cli_is_session_path(const char *arg);
/* As cli_check_name("session name", arg), for a command that also takes a
 * session file's path: a name with a '/' is said to be neither. */
int cli_check_session_or_path(const char *arg);

/* The path of a session's file in c's store (ctxs_store_session_get_path()). */
void cli_session_path(char *buf, size_t n, const cli *c, uint64_t id);
/* The directory of the session files of the store at store_dir, or with
 * store_dir NULL that directory's path inside the store ("sessions"). */
void cli_sessions_dir(char *buf, size_t n, const char *store_dir);

/* Prints usage (the command's help text, from the commands cli_main() was
 * given) to stdout for --help, or a short hint to stderr after a usage
 * error. */
int cli_usage_error(const char *command, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void cli_print_help(const char *command);

/* How a command opens the store: only a command that adds to a store
 * makes one where there is none. */
enum cli_store_mode {
    CLI_STORE_READ,    /* read-only (CTXS_RDONLY): reads a store the
                          user cannot write, and never changes one */
    CLI_STORE_WRITE,   /* read-write; no store is made */
    CLI_STORE_CREATE,  /* read-write; a store is made where there is none,
                          and stderr says so */
    CLI_STORE_REBUILD, /* read-write; an index is made only beside an
                          existing sessions/ (the index was lost) */
};

/* Opens c->store_dir as mode says, reporting a failure (a directory that
 * is not a store: exit 3, with what to do). Returns an exit code. */
int cli_store_open(const cli *c, ctxs_store **out, enum cli_store_mode mode);
/* After a CLI_STORE_CREATE command closed the store: when the open made
 * it, says so on stderr if the command succeeded (ok), and otherwise
 * removes it again (while it holds nothing), so that bad input leaves no
 * store behind. */
void cli_store_made(const cli *c, int ok);

/* The exit code for a library return code. */
int cli_exit_code(int rc);
/* 1 for a -errno of the network (-ECONNREFUSED, -ETIMEDOUT, ...): only
 * the remote tier returns those. */
int cli_is_network_error(int rc);

/* Why the library's last call on this thread failed with rc
 * (ctxs_get_last_error()), or NULL when it said nothing for rc. */
const char *cli_reason(int rc);

/* Reports rc to stderr: "ctxstore: <what>: <why> (<NAME>)" -- why is the
 * library's reason (cli_reason()), else rc's text -- then a
 * line of advice, hint, or cli_advice(rc) when hint is NULL, none when it
 * is CLI_NO_HINT. what names the session or file. The first failure of a
 * run is also kept for its JSON error object (cli_report_end()). Returns
 * cli_exit_code(rc). */
int cli_fail_hint(int rc, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define cli_fail(rc, ...) cli_fail_hint((rc), NULL, __VA_ARGS__)
/* As cli_fail_hint(), with fmt the whole message: for a code whose own
 * text would mislead (CTXS_EMODEL, "session belongs to another model",
 * where no session is involved). */
int cli_fail_said(int rc, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define CLI_NO_HINT ""

/* What to do about rc, in one line, or NULL. */
const char *cli_advice(int rc);
/* The way out of a damaged index of the store in dir (CTXS_EINDEX), with
 * its paths, into buf. */
void cli_index_hint(char *buf, size_t n, const char *dir);
/* The first of dir/index/data.mdb, lock.mdb and store.lock that is there
 * and is not a regular file: *name gets its name, what what it is in
 * words ("a FIFO (named pipe)", "a symbolic link to 'X'", ...). 1, or 0
 * when there is none. */
int cli_index_special(const char *dir, const char **name, char *what, size_t n);
/* The rule every session and checkpoint name must follow, in words. */
extern const char *const cli_name_rule;
/* Checks a name the user gave (what: "session name", "key", ...): -1 when
 * it is valid, else reports why not (ctxs_name_check()) with the rule as
 * the hint, and returns the exit code. */
int cli_check_name(const char *what, const char *name);

/* "ctxstore: " + message, to stderr. The last one is the message of the
 * JSON error object when a command fails without cli_fail(). */
void cli_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* --- One report per run -------------------------------------------------
 *
 * With --json, stdout gets exactly one JSON document whether the command
 * succeeded or failed. main() calls cli_report_begin() before it parses
 * anything and passes the exit code through cli_report_end(): when the
 * command failed (a nonzero exit code) without printing a document, that
 * prints {"error": {"code", "name", "message", "hint"}} for the first
 * failure reported (cli_fail(), cli_usage_error(), cli_note_error(), else
 * the last cli_say()). The state is process-wide, one run at a time; a
 * command that prints its own document after a failure puts the error in
 * it with json_error(). */
void cli_report_begin(const cli *c);
int cli_report_end(int exit_code);
/* Keeps rc, message and hint (may be NULL) as the run's error, unless one
 * is kept already; prints nothing. */
void cli_note_error(int rc, const char *message, const char *hint);

/* The files of c's store that no index entry of st names (every one with
 * st NULL) and that cannot be adopted (damaged, foreign, of a newer
 * version: ctxs_store_file_list()): reindex, repair and compact leave them
 * alone, so they stay until a person moves them. Into *out (ctxs_free()
 * it); returns how many, 0 on any failure to look. */
size_t cli_strays(ctxs_store_file **out, const cli *c, ctxs_store *st);

/* What to do with such a file, a way out of the loop: move it aside to
 * <store>/damaged/, or delete it. */
void cli_stray_hint(char *buf, size_t n, const cli *c, const char *file);

/* The current record of a file report, or NULL when neither is valid. */
const ctxs_record_report *cli_current_record(const ctxs_file_report *r);
/* Tokens a record holds in slots (the sinks and the recent run). */
uint64_t cli_held(const ctxs_file_report *r, const ctxs_record_report *rec);
/* A session's tokens now, from its file (the index's count may be older):
 * *positions committed since its start, *held in its slots (fewer once a
 * ring wrapped). Returns 0, or the library's code (nothing reported). */
int cli_session_tokens(const cli *c, uint64_t id, uint64_t *positions, uint64_t *held);
/* "N tokens" when every position is held, else "H tokens held of N
 * positions", into buf. */
const char *fmt_tokens(char buf[64], uint64_t positions, uint64_t held);
/* The model's display name in st, or the first 8 hex digits of its hash. */
const char *cli_model_name(char buf[CTXS_NAME_MAX + 1], ctxs_store *st, const uint8_t hash[CTXS_HASH_BYTES]);

/* The hash of the model named by arg, its 32 hex digits or its display
 * name, into out. Returns an exit code (reported). */
int cli_model_resolve(uint8_t out[CTXS_HASH_BYTES], ctxs_store *st, const char *arg);

/* --- Human-readable values ----------------------------------------------- */

/* The columns s takes on a terminal: UTF-8 decoded, East Asian wide and
 * fullwidth characters 2, combining marks and zero-width ones 0, any other
 * character (and a byte that is not UTF-8) 1. */
int cli_display_width(const char *s);

/* "0 B", "512 B", "1.5 KiB", "288 MiB", "1.2 GiB". */
const char *fmt_size(char buf[32], uint64_t bytes);
/* "850 ns", "12.3 us", "4.56 ms", "1.23 s", "2 min 5 s". */
const char *fmt_duration(char buf[32], double seconds);
/* How long ago a Unix time in ms was: "just now", "5 min ago", "3 days
 * ago"; "never" for 0. */
const char *fmt_age(char buf[32], uint64_t unix_ms);
/* ISO 8601 UTC: "2026-11-21T10:04:05Z". */
const char *fmt_time(char buf[32], uint64_t unix_ms);

/* A dtype as the tool names it: "fp16", "bf16", "q8", or "unknown". */
const char *fmt_dtype(uint32_t dtype);
/* The layer schedule in words ("every layer global", "repeating every 6
 * layers: window 512, ..., global") into buf; and as a JSON "schedule"
 * key: {"period": P, "window": [...]}. */
const char *fmt_schedule(char *buf, size_t size, const ctxs_geometry *g);

/* "fp16" (or "f16"), "bf16" or "q8" into a ctxs_dtype; -1 for anything
 * else. */
int parse_dtype(const char *s, uint32_t *out);
/* 32 lowercase hex digits. */
const char *fmt_hash(char buf[33], const uint8_t hash[CTXS_HASH_BYTES]);

/* Parses "1073741824", "512K", "100MiB", "1.5G", "2GB" (powers of 1024).
 * Returns 0 or -1. */
int parse_size(const char *s, uint64_t *out);
/* Parses 32 hex digits (either case), as fmt_hash() writes them. Returns
 * 0 or -1. */
int parse_hash(const char *s, uint8_t out[CTXS_HASH_BYTES]);
/* Parses a non-negative decimal count. Returns 0 or -1. */
int parse_u64(const char *s, uint64_t *out);

uint64_t cli_now_ms(void);
double cli_now_s(void); /* CLOCK_MONOTONIC */

/* --- JSON output (stdout) ------------------------------------------------
 *
 * A streaming writer: objects and arrays nest; keys and values are escaped.
 * Output is one document per command, ending with a newline. */
typedef struct json {
    FILE *f;
    int depth;
    int first[32]; /* 1 until the container at that depth has an item */
    int after_key; /* a key was written; the value follows without comma */
} json;

void json_init(json *j, FILE *f);
void json_object_begin(json *j);
void json_object_end(json *j);
void json_array_begin(json *j);
void json_array_end(json *j);
void json_key(json *j, const char *key);
void json_string(json *j, const char *s);
void json_u64(json *j, uint64_t v);
void json_i64(json *j, int64_t v);
void json_double(json *j, double v);
void json_bool(json *j, int v);
void json_null(json *j);
void json_hex(json *j, const uint8_t *p, size_t n);
/* A document on stdout, an object whose first member is "name": name. */
void json_begin_named(json *j, const char *name);
/* Ends the document with a newline. */
void json_finish(json *j);
/* "error": {code, name, message, hint} of the run's first failure, as a
 * member of the open object j; nothing when none was reported. */
void json_error(json *j);

/* key + value in one call. */
void json_kv_string(json *j, const char *key, const char *s);
void json_kv_u64(json *j, const char *key, uint64_t v);
void json_schedule(json *j, const ctxs_geometry *g);
void json_kv_i64(json *j, const char *key, int64_t v);
void json_kv_double(json *j, const char *key, double v);
void json_kv_bool(json *j, const char *key, int v);

/* --- Operations a crash interrupted -------------------------------------- */

/* An operation a crash interrupted (ctxs_store_intent_list()), in words,
 * into buf: what it was, its file, and what the next read-write open of
 * the store does with it; and the names a JSON report gives its kind
 * ("create", "delete") and action ("wait", "remove_file", "drop"). */
void cli_intent_sentence(char *buf, size_t n, const cli *c, const ctxs_intent_entry *e);
const char *cli_intent_kind(const ctxs_intent_entry *e);
const char *cli_intent_action(const ctxs_intent_entry *e);
/* The intents as the value of key in the open object j: an array of
 * {id, file, kind, pid, file_present, action, what}. */
void cli_intents_json(json *j, const char *key, const cli *c, const ctxs_intent_entry *list,
                      size_t n);

/* --- Progress bar (stderr) ------------------------------------------------
 *
 * Drawn only when c->progress (stderr is a terminal and --json is not
 * given) and the work is large; redrawn at most ten times a second. */
typedef struct progress {
    const char *label;
    uint64_t total;
    double started, last_draw;
    int enabled, drawn, bytes;
} progress;

/* bytes: 1 if done/total count bytes (shown as sizes), 0 for items. */
void progress_start(progress *p, const cli *c, const char *label, uint64_t total,
                    int bytes);
void progress_update(progress *p, uint64_t done);
void progress_end(progress *p);
/* A ctxs_progress_fn whose argument is a progress *. */
void progress_callback(void *arg, uint64_t done, uint64_t total);

/* A value's first line, shortened, or "(N bytes, binary)", into buf. */
void cli_meta_preview(char *buf, size_t cap, const void *value, size_t n);

/* --- Subcommands ------------------------------------------------------------ */

/* The tool's commands (commands.c), in the order its help lists them. */
extern const cli_command *const cli_tool_commands[];
extern const size_t cli_n_tool_commands;

/* Each beside its cmd_* function. */
extern const cli_command cli_cmd_ls, cli_cmd_create, cli_cmd_grow, cli_cmd_info, cli_cmd_verify,
    cli_cmd_compact, cli_cmd_gc, cli_cmd_rm, cli_cmd_rename, cli_cmd_pin, cli_cmd_unpin,
    cli_cmd_fork, cli_cmd_checkpoint, cli_cmd_meta, cli_cmd_models, cli_cmd_prefix,
    cli_cmd_reindex, cli_cmd_repair_index, cli_cmd_export, cli_cmd_import, cli_cmd_remote,
    cli_cmd_bench, cli_cmd_demo;


int cmd_ls(cli *c, int argc, char **argv);
int cmd_create(cli *c, int argc, char **argv);
int cmd_grow(cli *c, int argc, char **argv);
int cmd_info(cli *c, int argc, char **argv);
int cmd_verify(cli *c, int argc, char **argv);
int cmd_compact(cli *c, int argc, char **argv);
int cmd_gc(cli *c, int argc, char **argv);
int cmd_rm(cli *c, int argc, char **argv);
int cmd_rename(cli *c, int argc, char **argv);
int cmd_pin(cli *c, int argc, char **argv);
int cmd_fork(cli *c, int argc, char **argv);
int cmd_checkpoint(cli *c, int argc, char **argv);
int cmd_meta(cli *c, int argc, char **argv);
int cmd_models(cli *c, int argc, char **argv);
int cmd_prefix(cli *c, int argc, char **argv);
int cmd_reindex(cli *c, int argc, char **argv);
int cmd_repair_index(cli *c, int argc, char **argv);
int cmd_export(cli *c, int argc, char **argv);
int cmd_import(cli *c, int argc, char **argv);
int cmd_bench(cli *c, int argc, char **argv);
int cmd_demo(cli *c, int argc, char **argv);
int cmd_remote(cli *c, int argc, char **argv);

#endif
