/*
 * ctxstore — look into a store, keep it healthy, and see what ctxstore
 * does. git-style subcommands; every one takes --store DIR, --json (when it
 * reports) and --help. Each command is defined, with its help, beside its
 * cmd_* function; dispatch.c runs them. demo and bench are programs of
 * their own (demo.c, bench.c), which this one runs in its place.
 */
#include <stddef.h>

#include "cli.h"

static const cli_command k_bench = {
    "bench", NULL, CLI_BENCH_SUMMARY, NULL, CLI_BENCH_PROGRAM,
};

static const cli_command k_demo = {
    "demo", NULL, CLI_DEMO_SUMMARY, NULL, CLI_DEMO_PROGRAM,
};

/* In the order `ctxstore --help` lists them. */
static const cli_command *const k_commands[] = {
    &cli_cmd_ls,      &cli_cmd_create,  &cli_cmd_info,         &cli_cmd_verify,
    &cli_cmd_grow,    &cli_cmd_compact, &cli_cmd_gc,           &cli_cmd_pin,
    &cli_cmd_unpin,   &cli_cmd_rm,      &cli_cmd_rename,       &cli_cmd_fork,
    &cli_cmd_checkpoint, &cli_cmd_meta, &cli_cmd_models,       &cli_cmd_prefix,
    &cli_cmd_reindex, &cli_cmd_repair_index, &cli_cmd_export,  &cli_cmd_import,
    &cli_cmd_remote,  &k_bench,         &k_demo,
};

int main(int argc, char **argv)
{
    return cli_main(k_commands, sizeof(k_commands) / sizeof(k_commands[0]), argc, argv);
}
