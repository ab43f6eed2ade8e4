/*
 * ctxstore ls: one line per session, from the index and, for what the
 * index does not know (the tokens now, locks, damage), from the file; then
 * a line per operation a crash interrupted, with what a read-write open
 * does with it.
 */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

typedef struct row {
    const ctxs_session_entry *e;
    ctxs_file_report rep;
    int inspect_rc;            /* ctxs_file_inspect's return */
    const ctxs_record_report *cur;
    char flags[96];
    char model[256];           /* cli_model_name() */
} row;

static void row_fill(row *r, const cli *c, ctxs_store *st, const ctxs_session_entry *e)
{
    char path[PATH_MAX];
    cli_session_path(path, sizeof(path), c, e->id);
    memset(r, 0, sizeof(*r));
    r->e = e;
    cli_model_name(r->model, st, e->model_hash);
    r->inspect_rc = ctxs_file_inspect(&r->rep, path);
    if (r->inspect_rc == 0 && r->rep.status == 0)
        r->cur = cli_current_record(&r->rep);

    char *f = r->flags;
    size_t left = sizeof(r->flags);
#define FLAG(cond, text)                                                       \
    do {                                                                       \
        if (cond) {                                                            \
            int k = snprintf(f, left, "%s%s", f == r->flags ? "" : ",", text); \
            f += k, left -= (size_t)k;                                         \
        }                                                                      \
    } while (0)
    FLAG(e->pinned, "pinned");
    FLAG(r->cur && r->rep.ring, "ring");
    FLAG(r->inspect_rc == 0 && r->rep.model.geometry.period, "windowed");
    FLAG(r->cur && r->cur->ring_start > r->rep.n_sink, "wrapped");
    FLAG(r->cur && r->cur->n_tokens < e->n_tokens, "rolled-back");
    FLAG(r->rep.writer_open, "writer");
    FLAG(!r->cur, "failed");
#undef FLAG
    if (f == r->flags)
        snprintf(r->flags, sizeof(r->flags), "-");
}

static void print_json(json *j, const row *rows, size_t n, const ctxs_store_file *strays,
                       size_t n_strays)
{
    json_array_begin(j);
    for (size_t i = 0; i < n; i++) {
        const row *r = &rows[i];
        json_object_begin(j);
        json_kv_string(j, "name", r->e->name);
        json_kv_u64(j, "id", r->e->id);
        json_key(j, "model_hash");
        json_hex(j, r->e->model_hash, 16);
        json_kv_string(j, "model", r->model);
        if (r->inspect_rc == 0)
            json_schedule(j, &r->rep.model.geometry);
        if (r->cur) {
            json_kv_u64(j, "n_tokens", r->cur->n_tokens);
            json_kv_u64(j, "held", cli_held(&r->rep, r->cur));
            json_kv_u64(j, "capacity", r->rep.capacity);
        } else {
            json_key(j, "error");
            json_string(j, ctxs_err_name(r->inspect_rc ? r->inspect_rc : r->rep.status));
        }
        json_kv_u64(j, "disk_bytes", r->inspect_rc == 0 ? r->rep.disk_bytes : 0);
        json_kv_u64(j, "created_unix_ms", r->e->created_unix_ms);
        json_kv_u64(j, "last_used_unix_ms", r->e->last_used_unix_ms);
        json_kv_bool(j, "pinned", r->e->pinned);
        json_key(j, "flags");
        json_array_begin(j);
        if (strcmp(r->flags, "-") != 0) {
            char copy[sizeof(r->flags)], *save = NULL;
            snprintf(copy, sizeof(copy), "%s", r->flags);
            for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save))
                json_string(j, t);
        }
        json_array_end(j);
        json_object_end(j);
    }
    /* Files no session owns that cannot be adopted: no name, their file. */
    for (size_t i = 0; i < n_strays; i++) {
        json_object_begin(j);
        json_kv_string(j, "file", strays[i].file);
        json_kv_bool(j, "unadoptable", 1);
        json_kv_string(j, "error", ctxs_err_name(strays[i].status));
        json_kv_u64(j, "disk_bytes", strays[i].disk_bytes);
        json_object_end(j);
    }
    json_array_end(j);
    json_finish(j);
}

/* s, then spaces up to width columns of a terminal (as many as s takes
 * already: none). */
static void put_padded(const char *s, int width)
{
    fputs(s, stdout);
    for (int w = cli_display_width(s); w < width; w++)
        putchar(' ');
}

static void print_table(const cli *c, const row *rows, size_t n, const ctxs_store_file *strays,
                        size_t n_strays)
{
    /* Model names are shown whole: two models whose names share their
     * first characters (a family's sizes, quantizations) must not look the
     * same. Session names beyond 40 columns are whole too, only out of
     * line. Widths are the terminal's columns, not bytes: a name in CJK
     * takes two a character, an accent none. */
    int name_w = 4, model_w = 5;
    for (size_t i = 0; i < n; i++) {
        int len = cli_display_width(rows[i].e->name);
        if (len > name_w)
            name_w = len > 40 ? 40 : len;
        len = cli_display_width(rows[i].model);
        if (len > model_w)
            model_w = len;
    }
    /* HELD: tokens in the session's slots now; POSITIONS: tokens committed
     * since its start, more than it holds once a ring has wrapped. */
    put_padded("NAME", name_w);
    fputs("  ", stdout);
    put_padded("MODEL", model_w);
    printf(" %9s %9s %9s %10s  %-12s %s\n", "HELD", "POSITIONS", "CAPACITY", "DISK",
           "LAST USED", "FLAGS");
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const row *r = &rows[i];
        char size[32], age[32], held[32] = "?", positions[32] = "?", cap[32] = "?";
        if (r->cur) {
            snprintf(held, sizeof(held), "%" PRIu64, cli_held(&r->rep, r->cur));
            snprintf(positions, sizeof(positions), "%" PRIu64, r->cur->n_tokens);
            snprintf(cap, sizeof(cap), "%" PRIu32, r->rep.capacity);
        }
        uint64_t disk = r->inspect_rc == 0 ? r->rep.disk_bytes : 0;
        total += disk;
        put_padded(r->e->name, name_w);
        fputs("  ", stdout);
        put_padded(r->model, model_w);
        printf(" %9s %9s %9s %10s  %-12s %s\n", held, positions, cap, fmt_size(size, disk),
               fmt_age(age, r->e->last_used_unix_ms), r->flags);
    }
    char size[32], dir[PATH_MAX];
    cli_sessions_dir(dir, sizeof(dir), NULL);
    for (size_t i = 0; i < n_strays; i++) {
        total += strays[i].disk_bytes;
        printf("DAMAGED  %s/%s: %s on disk, cannot be adopted (%s)\n", dir, strays[i].file,
               fmt_size(size, strays[i].disk_bytes), ctxs_strerror(strays[i].status));
    }
    printf("%zu session%s", n, n == 1 ? "" : "s");
    if (n_strays)
        printf(" and %zu damaged file%s", n_strays, n_strays == 1 ? "" : "s");
    printf(", %s on disk\n", fmt_size(size, total));
    if (n_strays) {
        char hint[PATH_MAX * 6];
        cli_stray_hint(hint, sizeof(hint), c, n_strays == 1 ? strays[0].file : "FILE");
        printf("  hint: %s\n", hint);
    }
}

/* Operations a crash interrupted, which a read-only open leaves as they
 * are: their files are not listed above (no entry names them), and are
 * not damage. A failure to read them only leaves them out. */
static void print_intents(const cli *c, ctxs_store *st)
{
    ctxs_intent_entry *list;
    size_t n;
    if (ctxs_store_intent_list(&list, &n, st) < 0)
        return;
    for (size_t i = 0; i < n; i++) {
        char what[4096 + 512];
        cli_intent_sentence(what, sizeof(what), c, &list[i]);
        printf("pending: %s\n", what);
    }
    ctxs_free(list);
}

const cli_command cli_cmd_ls = {
    .name = "ls",
    .run = cmd_ls,
    .summary = "list sessions",
    .help =
        "ls [--json]\n\n"
        "Lists the sessions: model, HELD (tokens in the session's slots now),\n"
        "POSITIONS (tokens committed since its start: more than it holds once a\n"
        "ring has wrapped), capacity (slots), size on disk, last used, and flags:\n"
        "  pinned    gc never deletes it (`ctxstore pin`)\n"
        "  ring      the session overwrites its oldest tokens once full\n"
        "  wrapped   the ring has overwritten tokens\n"
        "  rolled-back  the index remembers more tokens than the file holds\n"
        "  writer    a process has it open for writing now\n"
        "  failed    the file does not open (damaged, missing); see `verify`\n",
};

int cmd_ls(cli *c, int argc, char **argv)
{
    int first, ex = cli_parse_common(c, argc, argv, &first);
    if (ex >= 0)
        return ex;
    if (first < argc)
        return cli_usage_error("ls", "ls takes no arguments");
    ctxs_store *st;
    if ((ex = cli_store_open(c, &st, CLI_STORE_READ)) != CLI_OK)
        return ex;
    ctxs_session_entry *list = NULL;
    size_t n = 0;
    int rc = ctxs_store_session_list(&list, &n, st);
    if (rc < 0) {
        ctxs_store_close(st);
        return cli_fail(rc, "listing the sessions of %s", c->store_dir);
    }
    row *rows = n ? calloc(n, sizeof(*rows)) : NULL;
    if (n && !rows) {
        ctxs_free(list);
        ctxs_store_close(st);
        return cli_fail(CTXS_ENOMEM, "ls");
    }
    for (size_t i = 0; i < n; i++)
        row_fill(&rows[i], c, st, &list[i]);
    ctxs_store_file *strays;
    size_t n_strays = cli_strays(&strays, c, st);
    if (c->json) {
        json j;
        json_init(&j, stdout);
        print_json(&j, rows, n, strays, n_strays);
    } else {
        print_table(c, rows, n, strays, n_strays);
        print_intents(c, st);
    }
    ctxs_free(strays);
    free(rows);
    ctxs_free(list);
    ctxs_store_close(st);
    return CLI_OK;
}
