/*
 * ctxstore meta: what an app keeps beside a session's tokens (title, chat
 * template, sampler settings, its own JSON), listed, printed, set from an
 * argument or a file, and deleted.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* 1 if the n bytes at p are text to print as is: UTF-8 without NUL or
 * control characters other than tab and newline. */
static int is_text(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] == 0 || (p[i] < 0x20 && p[i] != '\t' && p[i] != '\n') || p[i] == 0x7f)
            return 0;
        if (p[i] >= 0x80) {
            size_t len = p[i] >= 0xf0 ? 4 : p[i] >= 0xe0 ? 3 : p[i] >= 0xc2 ? 2 : 0;
            if (len == 0 || len > n - i)
                return 0;
            for (size_t k = 1; k < len; k++)
                if ((p[i + k] & 0xc0) != 0x80)
                    return 0;
            i += len - 1;
        }
    }
    return 1;
}

void cli_meta_preview(char *buf, size_t cap, const void *value, size_t n)
{
    const uint8_t *p = value;
    if (!is_text(p, n)) {
        snprintf(buf, cap, "(%zu bytes, binary)", n);
        return;
    }
    /* The first line, at most 60 bytes, cut on a character boundary. */
    size_t keep = 0;
    while (keep < n && keep < 60 && p[keep] != '\n')
        keep++;
    while (keep < n && keep > 0 && (p[keep] & 0xc0) == 0x80)
        keep--;
    snprintf(buf, cap, "%.*s%s", (int)keep, (const char *)p, keep < n ? " ..." : "");
}

static void value_json(json *j, const void *value, size_t n)
{
    json_kv_u64(j, "bytes", n);
    if (is_text(value, n)) {
        json_kv_string(j, "text", value); /* NUL-terminated by the library */
    } else {
        json_key(j, "hex");
        json_hex(j, value, n);
    }
}

static int meta_list(const cli *c, ctxs_store *st, const char *name)
{
    ctxs_meta_entry *list = NULL;
    size_t n = 0;
    int rc = ctxs_store_session_list_meta(&list, &n, st, name);
    if (rc < 0)
        return cli_fail(rc, "metadata of '%s'", name);
    if (c->json) {
        json j;
        json_begin_named(&j, name);
        json_key(&j, "meta");
        json_array_begin(&j);
        for (size_t i = 0; i < n; i++) {
            json_object_begin(&j);
            json_kv_string(&j, "key", list[i].key);
            value_json(&j, list[i].value, list[i].value_bytes);
            json_object_end(&j);
        }
        json_array_end(&j);
        json_object_end(&j);
        json_finish(&j);
    } else {
        for (size_t i = 0; i < n; i++) {
            char preview[128];
            cli_meta_preview(preview, sizeof(preview), list[i].value, list[i].value_bytes);
            printf("%-20s %s\n", list[i].key, preview);
        }
        printf("%zu key%s\n", n, n == 1 ? "" : "s");
    }
    ctxs_free(list);
    return CLI_OK;
}

/* Prints the value as it is (no newline added), or as JSON. */
static int meta_get(const cli *c, ctxs_store *st, const char *name, const char *key)
{
    uint8_t *buf = malloc(CTXS_META_VALUE_MAX + 1);
    size_t n = CTXS_META_VALUE_MAX;
    int rc = buf ? ctxs_store_session_get_meta(buf, &n, st, name, key) : CTXS_ENOMEM;
    if (rc < 0) {
        free(buf);
        if (rc == CTXS_ENOTFOUND)
            return cli_fail_hint(rc, "`ctxstore meta SESSION` lists its keys; `ctxstore ls` the sessions",
                                 "key '%s' of session '%s'", key, name);
        return cli_fail(rc, "key '%s' of session '%s'", key, name);
    }
    buf[n] = '\0';
    if (c->json) {
        json j;
        json_begin_named(&j, name);
        json_kv_string(&j, "key", key);
        value_json(&j, buf, n);
        json_object_end(&j);
        json_finish(&j);
    } else {
        fwrite(buf, 1, n, stdout);
    }
    free(buf);
    return CLI_OK;
}

/* Reads at most CTXS_META_VALUE_MAX + 1 bytes of path ("-": standard
 * input): one more than a value holds, so that the library refuses a
 * file too big, and a huge one is not read whole. */
static int read_value(const char *path, uint8_t **out, size_t *n)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f)
        return -errno;
    uint8_t *buf = malloc(CTXS_META_VALUE_MAX + 1);
    size_t got = buf ? fread(buf, 1, CTXS_META_VALUE_MAX + 1, f) : 0;
    int rc = !buf ? CTXS_ENOMEM : ferror(f) ? -EIO : 0;
    if (f != stdin)
        fclose(f);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    *out = buf;
    *n = got;
    return 0;
}

static int meta_set(const cli *c, ctxs_store *st, const char *name, const char *key,
                    const char *value, const char *file, int del)
{
    uint8_t *buf = NULL;
    size_t n = 0;
    int rc = 0;
    if (file && (rc = read_value(file, &buf, &n)) < 0)
        return cli_fail_hint(rc, "check the path", "value file %s", file);
    const void *v = del ? NULL : file ? (const void *)buf : (const void *)value;
    if (!del && !file)
        n = strlen(value);
    rc = ctxs_store_session_set_meta(st, name, key, v, n);
    free(buf);
    if (rc == CTXS_ENOTFOUND && del)
        return cli_fail_hint(rc, "`ctxstore meta SESSION` lists its keys", "key '%s' of session '%s'",
                             key, name);
    if (rc < 0)
        return cli_fail(rc, "%s key '%s' of session '%s'", del ? "deleting" : "setting", key, name);
    if (c->json) {
        json j;
        json_begin_named(&j, name);
        json_kv_string(&j, "key", key);
        json_kv_string(&j, "action", del ? "deleted" : "set");
        if (!del)
            json_kv_u64(&j, "bytes", n);
        json_object_end(&j);
        json_finish(&j);
    } else if (del) {
        printf("deleted key '%s' of '%s'\n", key, name);
    } else {
        printf("set key '%s' of '%s' (%zu bytes)\n", key, name, n);
    }
    return CLI_OK;
}

const cli_command cli_cmd_meta = {
    .name = "meta",
    .run = cmd_meta,
    .summary = "show or change what an app keeps with a session",
    .help =
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
        "start without it, export and import carry it.\n",
};

int cmd_meta(cli *c, int argc, char **argv)
{
    static const struct option longopts[] = {
        CLI_COMMON_LONGOPTS,
        { "file", required_argument, NULL, 'f' },
        { "delete", no_argument, NULL, 'd' },
        { NULL, 0, NULL, 0 },
    };
    const char *file = NULL;
    int opt, del = 0, ex;
    while ((opt = cli_getopt(c, argc, argv, "h", longopts, &ex)) > 0) {
        if (opt == 'f')
            file = optarg;
        else /* 'd' */
            del = 1;
    }
    if (opt == CLI_GETOPT_EXIT)
        return ex;
    int nargs = argc - optind;
    if (nargs < 1 || nargs > 3)
        return cli_usage_error("meta", "meta takes SESSION, then KEY and VALUE as needed");
    const char *name = argv[optind], *key = nargs > 1 ? argv[optind + 1] : NULL;
    const char *value = nargs > 2 ? argv[optind + 2] : NULL;
    if ((file || del) && !key)
        return cli_usage_error("meta", "--file and --delete need a KEY");
    if (file && del)
        return cli_usage_error("meta", "--file and --delete exclude each other");
    if (value && (file || del))
        return cli_usage_error("meta", "give a VALUE, --file or --delete, not two");
    if ((ex = cli_check_name("session name", name)) >= 0 ||
        (key && (ex = cli_check_name("key", key)) >= 0))
        return ex;
    ctxs_store *st;
    int writes = value || file || del;
    if ((ex = cli_store_open(c, &st, writes ? CLI_STORE_WRITE : CLI_STORE_READ)) != CLI_OK)
        return ex;
    if (!key)
        ex = meta_list(c, st, name);
    else if (writes)
        ex = meta_set(c, st, name, key, value, file, del);
    else
        ex = meta_get(c, st, name, key);
    ctxs_store_close(st);
    return ex;
}
