/*
 * ctxstore models: the models a store knows, and registering one from its
 * weights file. A session can be created only for a registered model: the
 * hash names the weights, the geometry says how their KV is laid out, and
 * one hash never stands for two geometries.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

/* What `models register` was given. */
typedef struct reg_args {
    const char *file, *name, *tokenizer_file;
    ctxs_model model; /* geometry and tokenizer hash; the hash comes later */
    int have_tokenizer_hash;
    int given;        /* options given that only register takes */
} reg_args;

/* "2 layers x 8 KV heads x 128 dims, fp16", as info says it. */
static const char *fmt_geometry(char buf[96], const ctxs_geometry *g)
{
    snprintf(buf, 96, "%" PRIu32 " layers x %" PRIu32 " KV heads x %" PRIu32 " dims, %s",
             g->n_layers, g->n_kv_heads, g->head_dim, fmt_dtype(g->dtype));
    return buf;
}

static void model_json(json *j, const ctxs_model_entry *m)
{
    const ctxs_geometry *g = &m->model.geometry;
    json_object_begin(j);
    json_key(j, "model_hash");
    json_hex(j, m->model.model_hash, CTXS_HASH_BYTES);
    json_key(j, "name");
    if (m->name[0])
        json_string(j, m->name);
    else
        json_null(j);
    json_key(j, "geometry");
    json_object_begin(j);
    json_kv_u64(j, "n_layers", g->n_layers);
    json_kv_u64(j, "n_kv_heads", g->n_kv_heads);
    json_kv_u64(j, "head_dim", g->head_dim);
    json_kv_string(j, "dtype", fmt_dtype(g->dtype));
    json_schedule(j, g);
    json_object_end(j);
    json_key(j, "tokenizer_hash");
    json_hex(j, m->model.tokenizer_hash, CTXS_HASH_BYTES);
    json_kv_u64(j, "registered_unix_ms", m->registered_unix_ms);
    json_object_end(j);
}

static void models_table(const ctxs_model_entry *list, size_t n)
{
    /* Names whole, as ls shows them: a family's sizes and quantizations
     * share their first characters. */
    int name_w = 4;
    for (size_t i = 0; i < n; i++)
        if ((int)strlen(list[i].name) > name_w)
            name_w = (int)strlen(list[i].name);
    printf("%-32s  %-*s %6s %8s %8s %-5s  %-32s  %s\n", "HASH", name_w, "NAME", "LAYERS",
           "KV-HEADS", "HEAD-DIM", "DTYPE", "TOKENIZER", "REGISTERED");
    for (size_t i = 0; i < n; i++) {
        const ctxs_model_entry *m = &list[i];
        const ctxs_geometry *g = &m->model.geometry;
        char hash[33], tok[33], t[32];
        printf("%-32s  %-*s %6" PRIu32 " %8" PRIu32 " %8" PRIu32 " %-5s  %-32s  %s\n",
               fmt_hash(hash, m->model.model_hash), name_w, m->name[0] ? m->name : "-",
               g->n_layers, g->n_kv_heads, g->head_dim, fmt_dtype(g->dtype),
               fmt_hash(tok, m->model.tokenizer_hash), fmt_time(t, m->registered_unix_ms));
        char sched[160];
        if (g->period) /* a line of its own: it does not fit a column */
            printf("  schedule: %s\n", fmt_schedule(sched, sizeof(sched), g));
    }
    printf("%zu model%s\n", n, n == 1 ? "" : "s");
}

static int models_ls(const cli *c, ctxs_store *st)
{
    ctxs_model_entry *list = NULL;
    size_t n = 0;
    int rc = ctxs_model_list(&list, &n, st);
    if (rc < 0)
        return cli_fail(rc, "listing the models of %s", c->store_dir);
    if (c->json) {
        json j;
        json_init(&j, stdout);
        json_array_begin(&j);
        for (size_t i = 0; i < n; i++)
            model_json(&j, &list[i]);
        json_array_end(&j);
        json_finish(&j);
    } else {
        models_table(list, n);
    }
    ctxs_free(list);
    return CLI_OK;
}

/* Reports a file that could not be hashed; what is "weights file" or
 * "tokenizer file". */
static int hash_fail(int rc, const char *what, const char *path)
{
    const char *hint = rc == CTXS_EINVAL || rc == -EISDIR ? "give a regular file"
                       : rc == -ENOENT                    ? "check the path"
                                                          : NULL;
    return cli_fail_hint(rc, hint, "%s %s", what, path);
}

/* What a register that the index refused says. */
static int register_fail(int rc, ctxs_store *st, const reg_args *a)
{
    char hash[33], geo[96];
    fmt_hash(hash, a->model.model_hash);
    ctxs_model_entry old;
    if (rc == CTXS_EMODEL && ctxs_model_get(&old, st, a->model.model_hash) == 0) {
        char tok[33];
        return cli_fail_said(
            rc,
            "a model hash stands for one geometry and tokenizer; check --layers, "
            "--kv-heads, --head-dim, --dtype and the tokenizer against `ctxstore models`",
            "model %s is registered already with another geometry or tokenizer: %s, "
            "tokenizer %s",
            hash, fmt_geometry(geo, &old.model.geometry),
            fmt_hash(tok, old.model.tokenizer_hash));
    }
    if (rc == CTXS_EINVAL) /* the geometry was checked: the name is refused */
        return cli_fail(rc, "model name '%s'", a->name);
    return cli_fail(rc, "registering %s as model %s", a->file, hash);
}

/* What a register did. */
enum { REG_NEW, REG_RENAMED, REG_SAME };
static const char *const k_reg_action[] = { "registered", "renamed", "unchanged" };

static void register_print(const cli *c, const ctxs_model_entry *m, int did,
                           const char *old_name)
{
    char hash[33], geo[96];
    if (c->json) {
        json j;
        json_init(&j, stdout);
        json_object_begin(&j);
        json_kv_string(&j, "action", k_reg_action[did]);
        json_key(&j, "model");
        model_json(&j, m);
        json_object_end(&j);
        json_finish(&j);
        return;
    }
    fmt_hash(hash, m->model.model_hash);
    if (did == REG_NEW)
        printf("registered model '%s': %s\n", m->name, fmt_geometry(geo, &m->model.geometry));
    else if (did == REG_RENAMED)
        printf("renamed model '%s' to '%s'\n", old_name[0] ? old_name : hash, m->name);
    else
        printf("model '%s' is registered already, with this geometry\n", m->name);
    printf("hash %s\n", hash);
}

static int models_register(const cli *c, ctxs_store *st, reg_args *a)
{
    int rc = ctxs_model_hash_file(a->model.model_hash, st, a->file);
    if (rc < 0)
        return hash_fail(rc, "weights file", a->file);
    if (a->tokenizer_file &&
        (rc = ctxs_tokenizer_hash_file(a->model.tokenizer_hash, st, a->tokenizer_file)) < 0)
        return hash_fail(rc, "tokenizer file", a->tokenizer_file);
    ctxs_model_entry before, after;
    int existed = ctxs_model_get(&before, st, a->model.model_hash) == 0;
    rc = ctxs_model_register(st, &a->model, a->name);
    if (rc == 0)
        rc = ctxs_model_get(&after, st, a->model.model_hash);
    if (rc < 0)
        return register_fail(rc, st, a);
    int did = !existed ? REG_NEW : strcmp(before.name, after.name) != 0 ? REG_RENAMED : REG_SAME;
    register_print(c, &after, did, existed ? before.name : "");
    return CLI_OK;
}

/* Parses a dimension: 1 to 4096, what ctxs_geometry allows. Returns -1, or
 * the usage error's exit code. */
static int parse_dim(const char *opt, const char *arg, uint32_t *out)
{
    uint64_t v;
    if (parse_u64(arg, &v) != 0 || v < 1 || v > 4096)
        return cli_usage_error("models", "%s takes a number from 1 to 4096, not '%s'", opt, arg);
    *out = (uint32_t)v;
    return -1;
}

/* Takes one option of register. Returns -1, or an exit code. */
static int register_option(reg_args *a, int opt, const char *arg)
{
    ctxs_geometry *g = &a->model.geometry;
    a->given++;
    switch (opt) {
    case 'n': a->name = arg; return -1;
    case 'L': return parse_dim("--layers", arg, &g->n_layers);
    case 'H': return parse_dim("--kv-heads", arg, &g->n_kv_heads);
    case 'D': return parse_dim("--head-dim", arg, &g->head_dim);
    case 't': a->tokenizer_file = arg; return -1;
    case 'd':
        if (parse_dtype(arg, &g->dtype) != 0)
            return cli_usage_error("models", "--dtype takes fp16, bf16 or q8, not '%s'", arg);
        return -1;
    case 'T':
        if (parse_hash(arg, a->model.tokenizer_hash) != 0)
            return cli_usage_error("models", "--tokenizer-hash takes 32 hex digits, not '%s'", arg);
        a->have_tokenizer_hash = 1;
        return -1;
    default:
        return -1; /* models_parse() took the rest */
    }
}

/* Parses the options; *first is the first positional argument. Returns -1,
 * or an exit code (after --help, or a usage error). */
static int models_parse(cli *c, int argc, char **argv, reg_args *a, int *first)
{
    static const struct option longopts[] = {
        CLI_COMMON_LONGOPTS,
        { "name", required_argument, NULL, 'n' },
        { "layers", required_argument, NULL, 'L' },
        { "kv-heads", required_argument, NULL, 'H' },
        { "head-dim", required_argument, NULL, 'D' },
        { "dtype", required_argument, NULL, 'd' },
        { "tokenizer", required_argument, NULL, 't' },
        { "tokenizer-hash", required_argument, NULL, 'T' },
        { NULL, 0, NULL, 0 },
    };
    int opt, ex;
    while ((opt = cli_getopt(c, argc, argv, "h", longopts, &ex)) != -1) {
        if (opt == CLI_GETOPT_EXIT || (ex = register_option(a, opt, optarg)) >= 0)
            return ex;
    }
    *first = optind;
    return -1;
}

/* Checks what register needs. Returns -1, or the usage error's code. */
static int register_check(const reg_args *a, int nargs)
{
    const ctxs_geometry *g = &a->model.geometry;
    if (nargs != 2)
        return cli_usage_error("models", "models register takes one FILE, the weights");
    if (!a->name)
        return cli_usage_error("models", "models register needs --name NAME");
    int ex;
    if ((ex = cli_check_name("model name", a->name)) >= 0)
        return ex;
    if (!g->n_layers || !g->n_kv_heads || !g->head_dim)
        return cli_usage_error("models", "models register needs --layers, --kv-heads and "
                                         "--head-dim");
    if (a->tokenizer_file && a->have_tokenizer_hash)
        return cli_usage_error("models", "--tokenizer and --tokenizer-hash exclude each other");
    return -1;
}

const cli_command cli_cmd_models = {
    .name = "models",
    .run = cmd_models,
    .summary = "list the models, or register one",
    .help =
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
        "another geometry or tokenizer it is refused (exit 5). Prints the hash.\n",
};

int cmd_models(cli *c, int argc, char **argv)
{
    reg_args a;
    memset(&a, 0, sizeof(a));
    a.model.geometry.dtype = CTXS_DTYPE_F16;
    int first = 0, ex = models_parse(c, argc, argv, &a, &first);
    if (ex >= 0)
        return ex;
    int nargs = argc - first;
    const char *verb = nargs > 0 ? argv[first] : "ls";
    int is_register = strcmp(verb, "register") == 0;
    if (!is_register && strcmp(verb, "ls") != 0)
        return cli_usage_error("models", "models takes ls or register, not '%s'", verb);
    if (!is_register && (nargs > 1 || a.given))
        return cli_usage_error("models", "models ls takes no arguments, and no options but --json");
    if (is_register && (ex = register_check(&a, nargs)) >= 0)
        return ex;
    a.file = is_register ? argv[first + 1] : NULL;
    ctxs_store *st;
    if ((ex = cli_store_open(c, &st, is_register ? CLI_STORE_CREATE : CLI_STORE_READ)) != CLI_OK)
        return ex;
    ex = is_register ? models_register(c, st, &a) : models_ls(c, st);
    ctxs_store_close(st);
    if (is_register)
        cli_store_made(c, ex == CLI_OK);
    return ex;
}
