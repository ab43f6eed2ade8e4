/*
 * ctxstore info SESSION: everything the index and the file say about one
 * session. The file is described from its bytes (ctxs_file_inspect), so a
 * damaged one is still shown; the window comes from a read-only open.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

typedef struct view {
    ctxs_session_entry e;
    char path[PATH_MAX];
    ctxs_file_report rep;
    const ctxs_record_report *cur;
    int open_rc;          /* the read-only open's return */
    ctxs_window win;
    ctxs_session_info info;
    ctxs_checkpoint_entry *cps;
    size_t n_cps;
    ctxs_meta_entry *meta;
    size_t n_meta;
    char parent[CTXS_NAME_MAX + 1];
} view;

static void record_json(json *j, const ctxs_record_report *r)
{
    json_object_begin(j);
    json_kv_bool(j, "valid", r->status == 0);
    json_kv_bool(j, "current", r->current);
    json_kv_u64(j, "seq", r->seq);
    json_kv_u64(j, "n_tokens", r->n_tokens);
    json_kv_u64(j, "ring_start", r->ring_start);
    json_kv_u64(j, "verified_from", r->verified_from);
    json_kv_u64(j, "written_unix_ms", r->written_unix_ms);
    json_kv_bool(j, "this_boot", r->this_boot);
    json_object_end(j);
}

static void format_json(json *j, const ctxs_file_report *r)
{
    json_key(j, "format");
    json_object_begin(j);
    json_kv_u64(j, "major", r->format_major);
    json_kv_u64(j, "minor", r->format_minor);
    json_kv_bool(j, "header_crc_ok", r->header_crc_ok);
    json_object_end(j);
}

/* What only a valid header tells: the tokenizer, the geometry, the sizes. */
static void header_json(json *j, const ctxs_file_report *r)
{
    json_key(j, "tokenizer_hash");
    json_hex(j, r->model.tokenizer_hash, 16);
    json_key(j, "geometry");
    json_object_begin(j);
    json_kv_u64(j, "n_layers", r->model.geometry.n_layers);
    json_kv_u64(j, "n_kv_heads", r->model.geometry.n_kv_heads);
    json_kv_u64(j, "head_dim", r->model.geometry.head_dim);
    json_kv_string(j, "dtype", fmt_dtype(r->model.geometry.dtype));
    json_schedule(j, &r->model.geometry);
    json_object_end(j);
    json_kv_u64(j, "capacity", r->capacity);
    json_kv_u64(j, "n_sink", r->n_sink);
    json_kv_bool(j, "ring", r->ring);
    json_kv_u64(j, "file_bytes", r->file_bytes);
}

static void window_json(json *j, const ctxs_window *win)
{
    json_key(j, "window");
    json_object_begin(j);
    json_kv_u64(j, "n_tokens", win->n_tokens);
    json_key(j, "spans");
    json_array_begin(j);
    for (uint32_t i = 0; i < win->n_spans; i++) {
        json_object_begin(j);
        json_kv_u64(j, "slot", win->spans[i].slot);
        json_kv_u64(j, "count", win->spans[i].count);
        json_object_end(j);
    }
    json_array_end(j);
    json_object_end(j);
}

static void parent_json(json *j, const view *v)
{
    json_key(j, "parent");
    json_object_begin(j);
    json_kv_u64(j, "id", v->e.parent_id);
    if (v->parent[0])
        json_kv_string(j, "name", v->parent);
    json_kv_u64(j, "tokens", v->e.fork_tokens);
    json_object_end(j);
}

static void checkpoints_json(json *j, const view *v)
{
    json_key(j, "checkpoints");
    json_array_begin(j);
    for (size_t i = 0; i < v->n_cps; i++) {
        json_object_begin(j);
        json_kv_string(j, "name", v->cps[i].name);
        json_kv_u64(j, "n_tokens", v->cps[i].n_tokens);
        json_kv_u64(j, "created_unix_ms", v->cps[i].created_unix_ms);
        json_kv_bool(j, "stale", v->cps[i].stale);
        json_object_end(j);
    }
    json_array_end(j);
}

/* The keys, each with its size and the start of its value: `ctxstore meta
 * SESSION KEY` prints a whole one. */
static void meta_json(json *j, const view *v)
{
    json_key(j, "meta");
    json_array_begin(j);
    for (size_t i = 0; i < v->n_meta; i++) {
        char preview[128];
        cli_meta_preview(preview, sizeof(preview), v->meta[i].value, v->meta[i].value_bytes);
        json_object_begin(j);
        json_kv_string(j, "key", v->meta[i].key);
        json_kv_u64(j, "bytes", v->meta[i].value_bytes);
        json_kv_string(j, "preview", preview);
        json_object_end(j);
    }
    json_array_end(j);
}

static void print_json(const view *v, ctxs_store *st)
{
    const ctxs_file_report *r = &v->rep;
    json j;
    json_begin_named(&j, v->e.name);
    json_kv_u64(&j, "id", v->e.id);
    json_kv_string(&j, "path", v->path);
    json_kv_string(&j, "status", ctxs_err_name(r->status));
    format_json(&j, r);
    char model[256];
    json_kv_string(&j, "model", cli_model_name(model, st, v->e.model_hash));
    json_key(&j, "model_hash");
    json_hex(&j, v->e.model_hash, 16);
    if (r->header_status == 0)
        header_json(&j, r);
    json_kv_u64(&j, "disk_bytes", r->disk_bytes);
    if (v->cur) {
        json_kv_u64(&j, "n_tokens", v->cur->n_tokens);
        json_kv_u64(&j, "held", cli_held(r, v->cur));
        json_kv_u64(&j, "verified_from", v->cur->verified_from);
    }
    json_key(&j, "records");
    json_array_begin(&j);
    record_json(&j, &r->records[0]);
    record_json(&j, &r->records[1]);
    json_array_end(&j);
    if (v->open_rc == 0)
        window_json(&j, &v->win);
    json_kv_bool(&j, "writer_open", r->writer_open);
    if (r->writer_pid) {
        json_kv_u64(&j, "writer_pid", (uint64_t)r->writer_pid);
        json_kv_string(&j, "writer_command", r->writer_command);
    }
    json_kv_bool(&j, "reader_open", r->reader_open);
    json_kv_u64(&j, "created_unix_ms", v->e.created_unix_ms);
    json_kv_u64(&j, "last_used_unix_ms", v->e.last_used_unix_ms);
    if (v->e.parent_id)
        parent_json(&j, v);
    checkpoints_json(&j, v);
    meta_json(&j, v);
    json_object_end(&j);
    json_finish(&j);
}

static void print_record(int i, const ctxs_record_report *r)
{
    char t[32];
    if (r->status != 0) {
        printf("  record %d   damaged (CRC or fields do not hold)\n", i);
        return;
    }
    printf("  record %d   seq %" PRIu64 ", %" PRIu64 " tokens, ring start %" PRIu64
           ", verified from %" PRIu64 ", written %s%s%s\n",
           i, r->seq, r->n_tokens, r->ring_start, r->verified_from,
           fmt_time(t, r->written_unix_ms), r->this_boot ? " (this boot)" : "",
           r->current ? "  <- current" : "");
}

static void print_text(const view *v, ctxs_store *st)
{
    const ctxs_file_report *r = &v->rep;
    const ctxs_geometry *g = &r->model.geometry;
    char a[32], b[32], hex[33], model[256];
    /* Without a store (info FILE) the file is all there is. */
    if (st)
        printf("session      %s (id %" PRIu64 ")\n", v->e.name, v->e.id);
    printf("file         %s%s\n", v->path, st ? "" : " (a session file, read by its path)");
    if (r->status != 0)
        printf("status       DOES NOT OPEN: %s (%s); run `ctxstore verify %s`\n",
               ctxs_strerror(r->status), ctxs_err_name(r->status), v->e.name);
    printf("format       %" PRIu32 ".%" PRIu32 ", header CRC %s\n", r->format_major,
           r->format_minor, r->header_crc_ok ? "ok" : "BAD");
    printf("model        %s, hash %s\n", cli_model_name(model, st, v->e.model_hash),
           fmt_hash(hex, v->e.model_hash));
    if (r->header_status == 0) {
        uint64_t per_token = 2ull * g->n_layers * g->n_kv_heads * g->head_dim * 2;
        printf("geometry     %" PRIu32 " layers x %" PRIu32 " KV heads x %" PRIu32
               " dims, %s: %s per token\n",
               g->n_layers, g->n_kv_heads, g->head_dim, fmt_dtype(g->dtype),
               fmt_size(a, per_token));
        char sched[160];
        printf("schedule     %s\n", fmt_schedule(sched, sizeof(sched), g));
        printf("capacity     %" PRIu32 " slots, %" PRIu32 " sinks, %s\n", r->capacity,
               r->n_sink, r->ring ? "ring (overwrites the oldest tokens once full)"
                                  : "no ring (full at capacity)");
        printf("size         %s, %s on disk\n", fmt_size(a, r->file_bytes),
               fmt_size(b, r->disk_bytes));
    }
    if (v->cur) {
        uint64_t held = cli_held(r, v->cur);
        printf("tokens       %" PRIu64 " committed, %" PRIu64 " held", v->cur->n_tokens, held);
        if (v->cur->ring_start > r->n_sink)
            printf(" (the ring overwrote positions %" PRIu32 "..%" PRIu64 ")", r->n_sink,
                   v->cur->ring_start - 1);
        printf("\n");
        printf("durability   watermark %" PRIu64 ": tokens below it were durable at the last "
               "sync; an open after a power loss verifies the %" PRIu64 " token%s after it\n",
               v->cur->verified_from,
               v->cur->n_tokens - v->cur->verified_from,
               v->cur->n_tokens - v->cur->verified_from == 1 ? "" : "s");
    }
    print_record(0, &r->records[0]);
    print_record(1, &r->records[1]);
    if (v->open_rc == 0) {
        printf("window       %" PRIu32 " tokens", v->win.n_tokens);
        for (uint32_t i = 0; i < v->win.n_spans; i++)
            printf("%s slots %" PRIu32 "..%" PRIu32, i ? "," : " in", v->win.spans[i].slot,
                   v->win.spans[i].slot + v->win.spans[i].count - 1);
        if (v->info.flags & CTXS_INFO_PARTIAL_WINDOW)
            printf("; SHORTER than the %" PRIu32 " held: attention does not read %" PRIu32
                   " of them%s",
                   v->info.n_held, v->info.n_held - v->win.n_tokens,
                   (v->info.flags & CTXS_INFO_PRESSURE) ? " (memory pressure)" : "");
        else
            printf(": all it holds");
        printf("\n");
    }
    printf("checksums    one XXH3-64 per token over its id, position and KV; "
           "`ctxstore verify %s` checks them all\n", v->e.name);
    printf("open by      %s", r->writer_open ? "a writer" : "no writer");
    if (r->writer_pid)
        printf(" (process %d%s%s)", (int)r->writer_pid, r->writer_command[0] ? ", " : "",
               r->writer_command);
    printf("%s\n", r->reader_open ? ", readers" : "");
    printf("created      %s\n", fmt_time(a, v->e.created_unix_ms));
    if (st)
        printf("last used    %s (%s)\n", fmt_time(a, v->e.last_used_unix_ms),
               fmt_age(b, v->e.last_used_unix_ms));
    if (v->e.parent_id)
        printf("forked from  %s at %" PRIu64 " tokens\n",
               v->parent[0] ? v->parent : "(deleted session)", v->e.fork_tokens);
    if (r->label_status == 0)
        printf("label        \"%s\", id %" PRIu64 "\n", r->label_name, r->label_id);
    if (v->open_rc < 0)
        printf("checkpoints  unknown: the session does not open\n");
    else
        printf("checkpoints  %zu\n", v->n_cps);
    for (size_t i = 0; i < v->n_cps; i++)
        printf("  %-20s %" PRIu64 " tokens, %s%s\n", v->cps[i].name, v->cps[i].n_tokens,
               fmt_time(a, v->cps[i].created_unix_ms), v->cps[i].stale ? ", stale" : "");
    printf("metadata     %zu key%s%s\n", v->n_meta, v->n_meta == 1 ? "" : "s",
           v->n_meta ? "; `ctxstore meta SESSION KEY` prints a whole value" : "");
    for (size_t i = 0; i < v->n_meta; i++) {
        char preview[128];
        cli_meta_preview(preview, sizeof(preview), v->meta[i].value, v->meta[i].value_bytes);
        printf("  %-20s %s\n", v->meta[i].key, preview);
    }
}

/* The name of the session with id, or "" (a linear scan: info is rare). */
static void name_of(char out[256], ctxs_store *st, uint64_t id)
{
    out[0] = '\0';
    ctxs_session_entry *list;
    size_t n;
    if (ctxs_store_session_list(&list, &n, st) != 0)
        return;
    for (size_t i = 0; i < n; i++)
        if (list[i].id == id)
            snprintf(out, 256, "%s", list[i].name);
    ctxs_free(list);
}

/* info FILE: a standalone session file (what ctxs_session_create() makes
 * outside a store), from its bytes and a read-only open; no index, so no
 * name, last use, parent or metadata beyond what the file holds. */
static int info_file(const cli *c, const char *path)
{
    view *v = calloc(1, sizeof(*v));
    if (!v)
        return cli_fail(CTXS_ENOMEM, "info");
    snprintf(v->path, sizeof(v->path), "%s", path);
    int rc = ctxs_file_inspect(&v->rep, path), ex;
    if (rc < 0) {
        ex = cli_fail_hint(rc, rc == -ENOENT ? "give the path of a session file, or a "
                                               "session's name (`ctxstore ls` lists them)"
                                             : NULL,
                           "session file %s", path);
        free(v);
        return ex;
    }
    v->cur = v->rep.status == 0 ? cli_current_record(&v->rep) : NULL;
    snprintf(v->e.name, sizeof(v->e.name), "%s", path);
    v->e.id = v->rep.label_status == 0 ? v->rep.label_id : 0;
    memcpy(v->e.model_hash, v->rep.model.model_hash, CTXS_HASH_BYTES);
    v->e.created_unix_ms = v->rep.created_unix_ms;
    ctxs_session *s = NULL;
    ctxs_open_options o = CTXS_OPEN_OPTIONS_INIT;
    o.background = 0;
    /* Checkpoints live in a store's index: a file alone has none. */
    v->open_rc = ctxs_session_open(&s, path, NULL, CTXS_RDONLY, &o);
    if (v->open_rc == 0) {
        ctxs_session_get_window(&v->win, s);
        ctxs_session_get_info(&v->info, s);
    }
    ctxs_session_close(s);
    if (c->json)
        print_json(v, NULL), ex = CLI_OK;
    else
        print_text(v, NULL), ex = CLI_OK;
    free(v);
    return ex;
}

const cli_command cli_cmd_info = {
    .name = "info",
    .run = cmd_info,
    .summary = "show a session in detail",
    .help =
        "info SESSION | FILE [--json]\n\n"
        "Shows a session's header, geometry, both commit records, durability\n"
        "watermark, attention window, checkpoints, metadata keys (values\n"
        "shortened), checksum state, and who has it open (a writer by its\n"
        "process id and command name, where /proc tells). FILE, a path with a\n"
        "'/' or ending in .ctxs, is a session file read by its path (one made\n"
        "outside a store, e.g. by ctxs_session_create()); no store is needed.\n",
};

int cmd_info(cli *c, int argc, char **argv)
{
    int first, ex = cli_parse_common(c, argc, argv, &first);
    if (ex >= 0)
        return ex;
    if (argc - first != 1)
        return cli_usage_error("info", "info takes one session name or session file");
    const char *name = argv[first];
    if (cli_is_session_path(name))
        return info_file(c, name);
    if ((ex = cli_check_session_or_path(name)) >= 0)
        return ex;
    ctxs_store *st;
    if ((ex = cli_store_open(c, &st, CLI_STORE_READ)) != CLI_OK)
        return ex;
    view *v = calloc(1, sizeof(*v));
    int rc = v ? ctxs_store_session_get(&v->e, st, name) : CTXS_ENOMEM;
    if (rc < 0) {
        free(v);
        ctxs_store_close(st);
        return cli_fail(rc, "session '%s'", name);
    }
    cli_session_path(v->path, sizeof(v->path), c, v->e.id);
    if ((rc = ctxs_file_inspect(&v->rep, v->path)) < 0) {
        ex = cli_fail(rc, "session '%s': its file %s", name, v->path);
        goto out;
    }
    v->cur = v->rep.status == 0 ? cli_current_record(&v->rep) : NULL;
    ctxs_session *s = NULL;
    ctxs_open_options o = CTXS_OPEN_OPTIONS_INIT;
    o.background = 0; /* opened for its window, not to attend */
    v->open_rc = ctxs_store_session_open(&s, st, name, NULL, CTXS_RDONLY, &o);
    if (v->open_rc == 0) {
        ctxs_session_get_window(&v->win, s);
        ctxs_session_get_info(&v->info, s);
        rc = ctxs_checkpoint_list(&v->cps, &v->n_cps, s);
    }
    ctxs_session_close(s);
    if (v->open_rc == 0 && rc < 0) {
        ex = cli_fail(rc, "checkpoints of '%s'", name);
        goto out;
    }
    if ((rc = ctxs_store_session_list_meta(&v->meta, &v->n_meta, st, name)) < 0) {
        ex = cli_fail(rc, "metadata of '%s'", name);
        goto out;
    }
    if (v->e.parent_id)
        name_of(v->parent, st, v->e.parent_id);
    if (c->json)
        print_json(v, st);
    else
        print_text(v, st);
    ex = CLI_OK;
out:
    ctxs_free(v->cps);
    ctxs_free(v->meta);
    free(v);
    ctxs_store_close(st);
    return ex;
}
