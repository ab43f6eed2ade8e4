/*
 * ctxstore — look into a store, keep it healthy, and see what ctxstore
 * does. git-style subcommands (commands.c); every one takes --store DIR,
 * --json (when it reports) and --help. dispatch.c runs them.
 */
#include "cli.h"

int main(int argc, char **argv)
{
    return cli_main(cli_tool_commands, cli_n_tool_commands, argc, argv);
}
