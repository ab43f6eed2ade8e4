/*
 * ctxstore create: a new, empty session for a registered model, so that a
 * user can try every other command without writing a program first.
 */
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

const cli_command cli_cmd_create = {
    .name = "create",
    .run = cmd_create,
    .summary = "create an empty session for a registered model",
    .help =
        "create NAME --model MODEL [--capacity N] [--ring] [--dtype fp16|bf16|q8]\n"
        "       [--json]\n\n"
        "Creates the session NAME for MODEL (a name or a 32-digit hash, as\n"
        "`ctxstore models` lists them), empty, with N token slots (default 2048;\n"
        "5 to 16777216). Once full it refuses more tokens, losing none (`ctxstore\n"
        "grow` gives it more slots); with --ring it overwrites its oldest tokens\n"
        "after the first 4 instead. The session holds K and V as the model was registered\n"
        "(--dtype, when given, must be that one: a store keeps one form of a\n"
        "model's KV). The store must exist (`ctxstore models register` makes\n"
        "one). Refuses (exit 7) a NAME that another session has.\n",
};

int cmd_create(cli *c, int argc, char **argv)
{
    static const struct option longopts[] = {
        CLI_COMMON_LONGOPTS,
        { "model", required_argument, NULL, 'm' },
        { "capacity", required_argument, NULL, 'c' },
        { "dtype", required_argument, NULL, 'd' },
        { "ring", no_argument, NULL, 'r' },
        { NULL, 0, NULL, 0 },
    };
    const char *model = NULL, *dtype_arg = NULL;
    uint64_t capacity = 0; /* the library's default */
    uint32_t dtype = 0, ring = 0;
    int opt, ex;
    while ((opt = cli_getopt(c, argc, argv, "h", longopts, &ex)) > 0) {
        switch (opt) {
        case 'm':
            model = optarg;
            break;
        case 'c':
            if (parse_u64(optarg, &capacity) != 0 || capacity == 0 || capacity > UINT32_MAX)
                return cli_usage_error("create", "--capacity takes a count of token slots, "
                                                 "not '%s'", optarg);
            break;
        case 'd':
            if (parse_dtype(optarg, &dtype) != 0)
                return cli_usage_error("create", "--dtype takes fp16, bf16 or q8, not '%s'",
                                       optarg);
            dtype_arg = optarg;
            break;
        default: /* 'r' */
            ring = 1;
            break;
        }
    }
    if (opt == CLI_GETOPT_EXIT)
        return ex;
    ctxs_store *st;
    if ((ex = cli_one_session(c, argc, argv,
                              model ? NULL
                                    : "create needs --model MODEL (`ctxstore models` lists them)",
                              &st)) != CLI_OK)
        return ex;
    const char *name = argv[optind];
    uint8_t hash[CTXS_HASH_BYTES];
    ctxs_model_entry known;
    if ((ex = cli_model_resolve(hash, st, model)) != CLI_OK) {
        ctxs_store_close(st);
        return ex;
    }
    int rc = ctxs_model_get(&known, st, hash);
    ctxs_model m = known.model;
    /* A store keeps one form of a model's KV: a --dtype other than the
     * registered one is refused below by the library, which says so. */
    if (dtype_arg)
        m.geometry.dtype = dtype;
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = (uint32_t)capacity;
    o.ring = ring;
    o.open.background = 0; /* closed at once */
    ctxs_session *s = NULL;
    if (rc == 0)
        rc = ctxs_store_session_create(&s, st, name, &m, &o);
    ctxs_session_info info;
    ctxs_session_entry e;
    if (rc == 0 && (rc = ctxs_session_get_info(&info, s)) == 0)
        ctxs_session_close(s), s = NULL, rc = ctxs_store_session_get(&e, st, name);
    ctxs_session_close(s);
    if (rc < 0) {
        /* Said before any other call of the library clears its reason. */
        if (rc == CTXS_ETAKEN)
            ex = cli_fail_hint(rc, "choose another NAME, or remove that session first with "
                                   "`ctxstore rm`", "creating '%s'", name);
        else
            ex = cli_fail_hint(rc, rc == CTXS_EMODEL ? "leave out --dtype: a store keeps one "
                                                       "form of a model's KV, the one it was "
                                                       "registered with"
                                                     : NULL,
                               "creating '%s'", name);
        ctxs_store_close(st);
        return ex;
    }
    char model_name[CTXS_NAME_MAX + 1];
    cli_model_name(model_name, st, hash);
    ctxs_store_close(st);
    if (c->json) {
        json j;
        json_begin_named(&j, e.name);
        json_kv_u64(&j, "id", e.id);
        json_kv_string(&j, "model", model_name);
        json_key(&j, "model_hash");
        json_hex(&j, hash, CTXS_HASH_BYTES);
        json_kv_u64(&j, "capacity", info.capacity);
        json_kv_u64(&j, "n_sink", info.n_sink);
        json_kv_bool(&j, "ring", (info.flags & CTXS_INFO_RING) != 0);
        json_kv_string(&j, "dtype", fmt_dtype(m.geometry.dtype));
        json_kv_u64(&j, "disk_bytes", e.disk_bytes);
        json_object_end(&j);
        json_finish(&j);
    } else {
        char size[32];
        char ring_text[64] = "";
        if (info.flags & CTXS_INFO_RING)
            snprintf(ring_text, sizeof(ring_text), " (a ring after the first %" PRIu32 ")",
                     info.n_sink);
        printf("created '%s': model %s, %s, %" PRIu32 " token slots%s, %s on disk\n",
               e.name, model_name, fmt_dtype(m.geometry.dtype), info.capacity, ring_text,
               fmt_size(size, e.disk_bytes));
    }
    return CLI_OK;
}
