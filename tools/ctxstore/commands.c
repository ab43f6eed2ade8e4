/*
 * The commands of the ctxstore tool, in the order `ctxstore --help` lists
 * them. Each is defined, with its help, beside its cmd_* function; demo
 * and bench are programs of their own (demo.c, bench.c), which the tool
 * runs in its place. The fuzzer takes its commands from here too.
 */
#include <stddef.h>

#include "cli.h"

static const cli_command k_bench = {
    "bench", NULL, CLI_BENCH_SUMMARY, NULL, CLI_BENCH_PROGRAM,
};

static const cli_command k_demo = {
    "demo", NULL, CLI_DEMO_SUMMARY, NULL, CLI_DEMO_PROGRAM,
};

const cli_command *const cli_tool_commands[] = {
    &cli_cmd_ls,      &cli_cmd_create,  &cli_cmd_info,         &cli_cmd_verify,
    &cli_cmd_grow,    &cli_cmd_compact, &cli_cmd_gc,           &cli_cmd_pin,
    &cli_cmd_unpin,   &cli_cmd_rm,      &cli_cmd_rename,       &cli_cmd_fork,
    &cli_cmd_checkpoint, &cli_cmd_meta, &cli_cmd_models,       &cli_cmd_prefix,
    &cli_cmd_reindex, &cli_cmd_repair_index, &cli_cmd_export,  &cli_cmd_import,
    &cli_cmd_remote,  &k_bench,         &k_demo,
};

const size_t cli_n_tool_commands = sizeof(cli_tool_commands) / sizeof(cli_tool_commands[0]);
