/*
 * Moving a session between machines: export SESSION FILE, import FILE
 * [NAME]. The library does the work and the checking; this reports it.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

const cli_command cli_cmd_export = {
    .name = "export",
    .run = cmd_export,
    .summary = "write a session to a portable file",
    .help =
        "export SESSION FILE\n\n"
        "Writes SESSION's committed tokens to FILE: a self-checking file\n"
        "(zlib-compressed blocks, each with a CRC-32) with the model and\n"
        "geometry, to carry the session to another machine.\n",
};

int cmd_export(cli *c, int argc, char **argv)
{
    int first, ex = cli_parse_common(c, argc, argv, &first);
    if (ex >= 0)
        return ex;
    if (argc - first != 2)
        return cli_usage_error("export", "export takes SESSION and FILE");
    const char *name = argv[first], *path = argv[first + 1];
    if ((ex = cli_check_name("session name", name)) >= 0)
        return ex;
    ctxs_store *st;
    if ((ex = cli_store_open(c, &st, CLI_STORE_READ)) != CLI_OK)
        return ex;
    progress bar;
    progress_start(&bar, c, "export", 0, 0);
    double t0 = cli_now_s();
    ctxs_store_session_export_options xo = CTXS_STORE_SESSION_EXPORT_OPTIONS_INIT;
    xo.progress = progress_callback;
    xo.progress_arg = &bar;
    int rc = ctxs_store_session_export(st, name, path, &xo);
    double secs = cli_now_s() - t0;
    progress_end(&bar);
    ctxs_store_close(st);
    if (rc < 0) {
        /* The store was opened read-only and read: a refusal to write is
         * the destination's. */
        char hint[PATH_MAX + 128], parent[PATH_MAX];
        snprintf(parent, sizeof(parent), "%s", path);
        char *slash = strrchr(parent, '/');
        if (!slash)
            snprintf(parent, sizeof(parent), ".");
        else
            slash[slash == parent] = '\0';
        snprintf(hint, sizeof(hint), "check that you may write to %s (the destination), or "
                 "export to another place", parent);
        int dest = rc == -EACCES || rc == -EPERM || rc == -EROFS;
        return cli_fail_hint(rc, dest ? hint : NULL, "exporting '%s' to %s", name, path);
    }
    struct stat sb;
    uint64_t bytes = stat(path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    if (c->json) {
        json j;
        json_begin_named(&j, name);
        json_kv_string(&j, "file", path);
        json_kv_u64(&j, "bytes", bytes);
        json_kv_double(&j, "seconds", secs);
        json_object_end(&j);
        json_finish(&j);
    } else {
        char a[32], b[32];
        printf("exported '%s' to %s: %s in %s\n", name, path, fmt_size(a, bytes),
               fmt_duration(b, secs));
    }
    return CLI_OK;
}

/* The advice for a failed import. The file is named in the message and a
 * NAME given there too, so neither is repeated here; a broken file is no
 * session to verify or remove, and a store left as it was is worth
 * saying. */
static const char *import_hint(char *buf, size_t n, int rc, int named)
{
    const char *a;
    switch (rc) {
    case CTXS_ECORRUPT:
        a = "the file is not a valid ctxstore export: it is damaged or truncated";
        break;
    case CTXS_EFOREIGN:
        a = "the file is not a ctxstore export; check the path";
        break;
    case CTXS_EINVAL:
        a = named ? cli_name_rule : "the file is not a valid ctxstore export";
        break;
    case CTXS_ETAKEN:
        a = named ? "a session has that name; choose another NAME, or remove it with `ctxstore rm`"
                  : "a session has the name it was exported under; give another: "
                    "`ctxstore import FILE NAME`";
        break;
    default:
        a = cli_advice(rc);
    }
    snprintf(buf, n, "%s%snothing was imported", a ? a : "", a ? "; " : "");
    return buf;
}

const cli_command cli_cmd_import = {
    .name = "import",
    .run = cmd_import,
    .summary = "read a session from an export file",
    .help =
        "import FILE [NAME] [--json]\n\n"
        "Checks all of FILE, then creates the session NAME (by default the name\n"
        "it was exported under). A damaged, truncated or foreign file is refused\n"
        "(exit 5) and the store is left unchanged.\n",
};

int cmd_import(cli *c, int argc, char **argv)
{
    int first, ex = cli_parse_common(c, argc, argv, &first);
    if (ex >= 0)
        return ex;
    if (argc - first < 1 || argc - first > 2)
        return cli_usage_error("import", "import takes FILE and an optional NAME");
    const char *path = argv[first], *name = argc - first == 2 ? argv[first + 1] : NULL;
    if (name && (ex = cli_check_name("session name", name)) >= 0)
        return ex;
    ctxs_store *st;
    if ((ex = cli_store_open(c, &st, CLI_STORE_CREATE)) != CLI_OK)
        return ex;
    progress bar;
    progress_start(&bar, c, "import", 0, 1);
    char used[256] = "";
    double t0 = cli_now_s();
    ctxs_store_session_import_options io = CTXS_STORE_SESSION_IMPORT_OPTIONS_INIT;
    io.progress = progress_callback;
    io.progress_arg = &bar;
    int rc = ctxs_store_session_import(used, st, path, name, &io);
    double secs = cli_now_s() - t0;
    progress_end(&bar);
    ctxs_session_entry e;
    if (rc == 0)
        rc = ctxs_store_session_get(&e, st, used);
    ctxs_store_close(st);
    cli_store_made(c, rc == 0);
    if (rc < 0) {
        char hint[512];
        if (name)
            return cli_fail_hint(rc, import_hint(hint, sizeof(hint), rc, 1),
                                 "importing %s as '%s'", path, name);
        return cli_fail_hint(rc, import_hint(hint, sizeof(hint), rc, 0), "importing %s", path);
    }
    if (c->json) {
        json j;
        json_begin_named(&j, used);
        json_kv_u64(&j, "id", e.id);
        json_kv_u64(&j, "n_tokens", e.n_tokens);
        json_kv_double(&j, "seconds", secs);
        json_object_end(&j);
        json_finish(&j);
    } else {
        char a[32];
        printf("imported '%s' (%llu tokens) from %s in %s\n", used,
               (unsigned long long)e.n_tokens, path, fmt_duration(a, secs));
    }
    return CLI_OK;
}
