/*
 * ctxstore grow: more token slots for a session, keeping all it holds, so
 * that a session that is full (and no ring) takes tokens again.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>

#include "cli.h"

const cli_command cli_cmd_grow = {
    .name = "grow",
    .run = cmd_grow,
    .summary = "give a session more token slots",
    .help =
        "grow NAME --capacity N [--json]\n\n"
        "Gives the session NAME N token slots (more than it has: up to\n"
        "16777216), keeping every token, checkpoint and metadata value: the way\n"
        "on for a session that is full and refuses tokens. Its file is written\n"
        "anew beside the old one and takes its place once complete; a crash\n"
        "leaves one or the other, whole. Refuses (exit 4) a session that a\n"
        "process has open, and a ring that has overwritten tokens.\n",
};

int cmd_grow(cli *c, int argc, char **argv)
{
    static const struct option longopts[] = {
        CLI_COMMON_LONGOPTS,
        { "capacity", required_argument, NULL, 'c' },
        { NULL, 0, NULL, 0 },
    };
    uint64_t capacity = 0;
    int opt, ex;
    while ((opt = cli_getopt(c, argc, argv, "h", longopts, &ex)) > 0) {
        /* 'c', the one option of its own */
        if (parse_u64(optarg, &capacity) != 0 || capacity == 0 || capacity > UINT32_MAX)
            return cli_usage_error("grow", "--capacity takes a count of token slots, "
                                           "not '%s'", optarg);
    }
    if (opt == CLI_GETOPT_EXIT)
        return ex;
    ctxs_store *st;
    if ((ex = cli_one_session(c, argc, argv,
                              capacity ? NULL
                                       : "grow needs --capacity N, the session's new count of "
                                         "token slots",
                              &st)) != CLI_OK)
        return ex;
    const char *name = argv[optind];
    ctxs_session_entry before, after;
    int rc = ctxs_store_session_get(&before, st, name);
    if (rc == 0)
        rc = ctxs_store_session_grow(st, name, (uint32_t)capacity);
    if (rc == 0)
        rc = ctxs_store_session_get(&after, st, name);
    if (rc < 0) {
        ex = cli_fail_hint(rc, rc == CTXS_EBUSY ? "close the program that has it open, then "
                                                  "grow it"
                                                : NULL,
                           "growing '%s'", name);
        ctxs_store_close(st);
        return ex;
    }
    ctxs_store_close(st);
    if (c->json) {
        json j;
        json_begin_named(&j, after.name);
        json_kv_u64(&j, "capacity", capacity);
        json_kv_u64(&j, "n_tokens", after.n_tokens);
        json_kv_u64(&j, "disk_bytes_before", before.disk_bytes);
        json_kv_u64(&j, "disk_bytes", after.disk_bytes);
        json_object_end(&j);
        json_finish(&j);
    } else {
        char a[32], b[32];
        printf("grew '%s' to %" PRIu64 " token slots, holding its %" PRIu64 " tokens: %s -> %s "
               "on disk\n",
               after.name, capacity, after.n_tokens, fmt_size(a, before.disk_bytes),
               fmt_size(b, after.disk_bytes));
    }
    return CLI_OK;
}
