/*
 * ctxstore — look into a store, keep it healthy, and see what ctxstore
 * does. git-style subcommands; every one takes --store DIR, --json (when it
 * reports) and --help.
 */
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

typedef struct command {
    const char *name;
    cli_command_fn run;
    const char *summary;
    const char *help; /* usage and options, after "usage: ctxstore " */
} command;

static const command k_commands[] = {
    { "ls", cmd_ls, "list sessions",
      "ls [--json]\n\n"
      "Lists the sessions: model, HELD (tokens in the session's slots now),\n"
      "POSITIONS (tokens committed since its start: more than it holds once a\n"
      "ring has wrapped), capacity (slots), size on disk, last used, and flags:\n"
      "  pinned    gc never deletes it (`ctxstore pin`)\n"
      "  ring      the session overwrites its oldest tokens once full\n"
      "  wrapped   the ring has overwritten tokens\n"
      "  rolled-back  the index remembers more tokens than the file holds\n"
      "  writer    a process has it open for writing now\n"
      "  failed    the file does not open (damaged, missing); see `verify`\n" },
    { "create", cmd_create, "create an empty session for a registered model",
      "create NAME --model MODEL [--capacity N] [--ring] [--dtype fp16|bf16|q8]\n"
      "       [--json]\n\n"
      "Creates the session NAME for MODEL (a name or a 32-digit hash, as\n"
      "`ctxstore models` lists them), empty, with N token slots (default 2048;\n"
      "5 to 16777216). Once full it refuses more tokens, losing none (`ctxstore\n"
      "grow` gives it more slots); with --ring it overwrites its oldest tokens\n"
      "after the first 4 instead. The session holds K and V as the model was registered\n"
      "(--dtype, when given, must be that one: a store keeps one form of a\n"
      "model's KV). The store must exist (`ctxstore models register` makes\n"
      "one). Refuses (exit 7) a NAME that another session has.\n" },
    { "info", cmd_info, "show a session in detail",
      "info SESSION | FILE [--json]\n\n"
      "Shows a session's header, geometry, both commit records, durability\n"
      "watermark, attention window, checkpoints, metadata keys (values\n"
      "shortened), checksum state, and who has it open (a writer by its\n"
      "process id and command name, where /proc tells). FILE, a path with a\n"
      "'/' or ending in .ctxs, is a session file read by its path (one made\n"
      "outside a store, e.g. by ctxs_session_create()); no store is needed.\n" },
    { "verify", cmd_verify, "check sessions and the index",
      "verify [SESSION | FILE | --all] [--json]\n\n"
      "Checks every held token's checksum, the header and commit record CRCs,\n"
      "and (with --all, the default) every record of the index and the index\n"
      "against the session files. Reads every KV byte. Exits 0 when nothing is\n"
      "wrong, 8 when a record of the index is malformed (each one named by\n"
      "table and key; the other commands refuse the same records with 8), 5\n"
      "when a session file is damaged, naming the session, the tokens and what\n"
      "to do. FILE (a path, as for info) checks that session file alone.\n" },
    { "grow", cmd_grow, "give a session more token slots",
      "grow NAME --capacity N [--json]\n\n"
      "Gives the session NAME N token slots (more than it has: up to\n"
      "16777216), keeping every token, checkpoint and metadata value: the way\n"
      "on for a session that is full and refuses tokens. Its file is written\n"
      "anew beside the old one and takes its place once complete; a crash\n"
      "leaves one or the other, whole. Refuses (exit 4) a session that a\n"
      "process has open, and a ring that has overwritten tokens.\n" },
    { "compact", cmd_compact, "give back unused disk space",
      "compact [SESSION | --all] [--json]\n\n"
      "Punches out the KV blocks of slots that hold no token (after rollbacks\n"
      "and recoveries). With --all (the default), every session, then removes\n"
      "orphaned index rows and leftover files, and rewrites the index\n"
      "compacted when no other process has the store open. Refuses (exit 4) a\n"
      "session that a process has open.\n" },
    { "gc", cmd_gc, "delete least recently used sessions",
      "gc --max-size SIZE [--dry-run] [--json]\n\n"
      "Deletes sessions, least recently used first, until the session files\n"
      "take at most SIZE on disk (e.g. 10G, 512MiB), and names each session it\n"
      "deleted. Pinned sessions (`ctxstore pin`) and those that a process has\n"
      "open are kept. With --dry-run nothing is deleted: it names the sessions\n"
      "gc would delete now (and works on a store you cannot write).\n" },
    { "pin", cmd_pin, "keep sessions from gc",
      "pin SESSION... [--json]\n\n"
      "Pins sessions: gc never deletes a pinned session. The pin stays when the\n"
      "session is renamed; `ctxstore rm` still deletes it. `ctxstore ls` shows\n"
      "pins.\n" },
    { "unpin", cmd_pin, "let gc delete sessions again",
      "unpin SESSION... [--json]\n\n"
      "Takes the pin off sessions, so that gc may delete them again.\n" },
    { "rm", cmd_rm, "delete sessions",
      "rm SESSION... [--json]\n\n"
      "Deletes sessions with their checkpoints and prefixes, and names each\n"
      "with its tokens. Refuses (exit 4) a session that a process has open.\n" },
    { "rename", cmd_rename, "rename a session",
      "rename OLD NEW [--json]\n\n"
      "Renames the session OLD to NEW. Its file, tokens and checkpoints stay as\n"
      "they are, and a process that has it open keeps using it. Refuses (exit 7)\n"
      "a NEW that another session has.\n" },
    { "fork", cmd_fork, "copy a session's first tokens into a new session",
      "fork SRC DST [--at N | --checkpoint NAME]\n\n"
      "Creates DST holding the first N tokens of SRC (all of them by\n"
      "default), or those of SRC's checkpoint NAME. Shares blocks where the\n"
      "file system can (Btrfs, XFS).\n" },
    { "checkpoint", cmd_checkpoint, "create, list, restore or remove checkpoints",
      "checkpoint create SESSION NAME [--json]\n"
      "       ctxstore checkpoint ls SESSION [--json]\n"
      "       ctxstore checkpoint restore SESSION NAME [--json]\n"
      "       ctxstore checkpoint rm SESSION NAME [--json]\n\n"
      "A checkpoint names a session's current token count; restore rolls the\n"
      "session back to it (the session must not be open by a writer).\n" },
    { "meta", cmd_meta, "show or change what an app keeps with a session",
      "meta SESSION [--json]\n"
      "       ctxstore meta SESSION KEY [--json]\n"
      "       ctxstore meta SESSION KEY VALUE | --file FILE [--json]\n"
      "       ctxstore meta SESSION KEY --delete [--json]\n\n"
      "A session's metadata: what an app keeps beside its tokens (a title, the\n"
      "chat template, sampler settings, its own JSON), as keys (named like\n"
      "sessions) and values (any bytes). With SESSION alone, lists the keys and\n"
      "the start of each value; with KEY, prints its value as it is; with VALUE,\n"
      "or the bytes of FILE (- for standard input), sets it; --delete removes\n"
      "it. A value holds at most 64 KiB, a session's keys and values together\n"
      "256 KiB (exit 2 past either). Renames keep it, deletes take it, forks\n"
      "start without it, export and import carry it.\n" },
    { "models", cmd_models, "list the models, or register one",
      "models [ls] [--json]\n"
      "       ctxstore models register FILE --name NAME --layers L --kv-heads H\n"
      "                --head-dim D [--dtype fp16|bf16|q8]\n"
      "                [--tokenizer TFILE | --tokenizer-hash HEX] [--json]\n\n"
      "Lists the registered models: hash, display name, geometry, dtype,\n"
      "tokenizer hash and when each was registered. A session can be created\n"
      "only for a registered model.\n\n"
      "register hashes the weights file FILE (XXH3-128; the store remembers the\n"
      "hash of a file that has not changed) and registers that hash with the\n"
      "geometry of its KV cache: layers, KV heads per layer (after GQA) and\n"
      "elements per head, each 1 to 4096. The tokenizer hash is TFILE's (the\n"
      "vocabulary file: tokenizer.json, tokenizer.model; hashed apart from\n"
      "weights), or HEX (32 hex digits), or zero. Registering a hash again changes its name; with\n"
      "another geometry or tokenizer it is refused (exit 5). Prints the hash.\n" },
    { "prefix", cmd_prefix, "find the session holding a prompt's first tokens",
      "prefix --model MODEL TOKEN... [--json]\n"
      "       ctxstore prefix --model MODEL --tokens-file FILE [--json]\n\n"
      "Finds the session of MODEL (a name or a 32-digit hash, as `models`\n"
      "lists them) that holds the longest start of a prompt, and prints it\n"
      "with how many of the prompt's tokens it holds: fork it there (`ctxstore\n"
      "fork SESSION NEW --at N`) and prefill only the rest. The prompt is its\n"
      "token ids in decimal, separated by whitespace, in the arguments (one may\n"
      "hold several) or in FILE (- for standard input). Prefixes match in whole\n"
      "chunks of 64 tokens and are indexed every 1024 tokens a session commits\n"
      "and when it is closed. Exits 3 when no session holds the first 64.\n" },
    { "reindex", cmd_reindex, "rebuild the index from the session files",
      "reindex [--json]\n\n"
      "Rebuilds the index from the session files: names, models, token counts\n"
      "and prefixes. Checkpoints and model names are kept.\n" },
    { "repair-index", cmd_repair_index, "repair a damaged index, keeping what still reads",
      "repair-index [--json]\n\n"
      "The way out when the index is damaged (exit 8). Moves index/data.mdb to\n"
      "index.damaged-TIME/ (never deletes it), rebuilds the index from the\n"
      "session files, and puts back what of the damaged one still reads:\n"
      "sessions' names, checkpoints, metadata, pins and models' display names.\n"
      "The damaged index is read in child processes, so damage that would crash\n"
      "a reader costs what it holds, never the repair. Prints, kind by kind,\n"
      "what was kept, dropped (malformed, or of a session whose file is gone)\n"
      "and lost to the damage, and the sessions that came back under another\n"
      "name. Refused (exit 4) while any process has the store open.\n" },
    { "export", cmd_export, "write a session to a portable file",
      "export SESSION FILE\n\n"
      "Writes SESSION's committed tokens to FILE: a self-checking file\n"
      "(zlib-compressed blocks, each with a CRC-32) with the model and\n"
      "geometry, to carry the session to another machine.\n" },
    { "import", cmd_import, "read a session from an export file",
      "import FILE [NAME] [--json]\n\n"
      "Checks all of FILE, then creates the session NAME (by default the name\n"
      "it was exported under). A damaged, truncated or foreign file is refused\n"
      "(exit 5) and the store is left unchanged.\n" },
    { "remote", cmd_remote, "push sessions to Redis, pull them back, list them",
      "remote push SESSION... [--remote URL] [--json]\n"
      "       ctxstore remote pull SESSION [--as LOCAL] [--remote URL] [--json]\n"
      "       ctxstore remote ls [--remote URL] [--json]\n"
      "       ctxstore remote stat [--remote URL] [--json]\n\n"
      "The remote tier: a Redis server that the machines of a fleet share, so\n"
      "that a conversation saved on one resumes on another. URL is\n"
      "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB] or\n"
      "unix:///PATH/TO/redis.sock[?db=N]; without --remote, $CTXSTORE_REMOTE.\n"
      "Messages show it without its password.\n\n"
      "push sends each session's chunks of 64 tokens that Redis lacks (chunks\n"
      "are keyed by their content: shared prefixes are stored once), its last\n"
      "partial chunk and its record, and says how many chunks it sent, how many\n"
      "were there already and the bytes. It only reads the store. A ring that\n"
      "has overwritten its first tokens is refused (exit 5).\n\n"
      "pull creates the local session LOCAL (default: SESSION) from the remote\n"
      "one, every chunk verified before it is written. Redis may have evicted\n"
      "a chunk: the pull then stops there, and says how many tokens it pulled\n"
      "and how many are left to prefill (in JSON, their ids). It makes the\n"
      "store if there is none.\n\n"
      "ls lists the remote sessions: model, tokens, whether the partial last\n"
      "chunk is there, when pushed. stat shows the server: version, memory used\n"
      "and maxmemory, eviction policy, keys evicted, keys held. Neither needs\n"
      "a local store.\n" },
    { "bench", cmd_bench, "time ctxstore against the usual ways to keep a KV cache",
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
      "\"exit_status\", \"results\": [...]}]}.\n" },
    { "demo", cmd_demo, "play a chat, save each turn, resume it (the main job)",
      "demo [--store DIR] [--quick] [--keep] [--engine llama|tinychat|synthetic]\n"
      "     [--turns N] [--json]\n\n"
      "Plays a chat of several turns, saving each turn into a session, quits,\n"
      "resumes and continues, and prints each save and the resume beside what\n"
      "the ways people save a KV cache today cost on the same conversation.\n"
      "The engine is llama.cpp with SmolLM2-135M where scripts/bootstrap.sh\n"
      "built them (the default there): the model's real replies, against\n"
      "llama.cpp's own state files and a re-prefill. --engine tinychat is a\n"
      "tiny transformer with random weights and Qwen3-4B's KV geometry whose\n"
      "attention reads the session, against a state file and a SQLite blob;\n"
      "--engine synthetic writes made-up K/V, with no model; --turns and\n"
      "--json are theirs. Without --store (or CTXSTORE_DIR) it works in a\n"
      "temporary directory, removed at the end unless --keep. With --store\n"
      "it works in that store and deletes its session at the end unless\n"
      "--keep (the store and its other sessions are left as they were).\n" },
};

enum { N_COMMANDS = sizeof(k_commands) / sizeof(k_commands[0]) };

static const command *find_command(const char *name)
{
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (strcmp(k_commands[i].name, name) == 0)
            return &k_commands[i];
    return NULL;
}

static void print_main_help(FILE *f)
{
    fprintf(f, "usage: ctxstore [--store DIR] [--json] COMMAND [ARGS]\n\n"
               "A persistent, memory-mapped KV cache for LLM chats: look into a store,\n"
               "keep it healthy, see what it does.\n\nCommands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-11s %s\n", k_commands[i].name, k_commands[i].summary);
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
    const command *cmd = find_command(name);
    if (!cmd) {
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
    const command *cmd = find_command(name);
    char hint[64];
    if (cmd) {
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
        if (optind + 1 < argc)
            cli_print_help(argv[optind + 1]);
        else
            print_main_help(stdout);
        return CLI_OK;
    }
    const command *cmd = find_command(name);
    if (!cmd)
        return cli_usage_error(name, "'%s' is not a command", name);
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

int main(int argc, char **argv)
{
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
