/*
 * Keeping a store healthy: compact, gc, rm, pin and unpin, rename, reindex,
 * repair-index.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void print_strays(const cli *c);

/* What the label of a session file said before compact or reindex
 * indexed it, to say under which name it came in. */
typedef struct label_seen {
    uint64_t id;       /* the file's id */
    uint64_t label_id; /* the id its label named */
    char name[CTXS_NAME_MAX + 1]; /* the name its label gave, or "" */
} label_seen;

/* The labels of the session files that no entry of st's index names
 * (every one with st NULL) and whose label is readable; with moved_only,
 * only those whose label names another id (a file copied in by hand under
 * another id). The caller frees *out; returns how many. */
static size_t labels_before(label_seen **out, const cli *c, ctxs_store *st, int moved_only)
{
    ctxs_store_file *files = NULL;
    size_t n = 0, count = 0;
    label_seen *list = NULL;
    char dir[PATH_MAX];
    cli_sessions_dir(dir, sizeof(dir), c->store_dir);
    if (ctxs_store_file_list(&files, &n, c->store_dir, st) < 0 ||
        (n && !(list = calloc(n, sizeof(*list)))))
        n = 0;
    for (size_t i = 0; i < n; i++) {
        char path[PATH_MAX + 32];
        ctxs_file_report rep;
        snprintf(path, sizeof(path), "%s/%s", dir, files[i].file);
        if (ctxs_file_inspect(&rep, path) < 0 || rep.label_status != 0 ||
            (moved_only && rep.label_id == files[i].id))
            continue;
        label_seen *l = &list[count++];
        l->id = files[i].id;
        l->label_id = rep.label_id;
        snprintf(l->name, sizeof(l->name), "%s", rep.label_name);
    }
    ctxs_free(files);
    *out = list;
    return count;
}

static const label_seen *label_of(const label_seen *seen, size_t n, uint64_t id)
{
    for (size_t i = 0; i < n; i++)
        if (seen[i].id == id)
            return &seen[i];
    return NULL;
}

/* Says that the session e came in from a file the index did not name
 * (how: "a file the index did not know"), and under which name: its
 * label's, or another because that one was taken. */
static void adopted_print(const cli *c, json *j, const ctxs_session_entry *e, const char *how,
                          const label_seen *l)
{
    int own_name = l && strcmp(l->name, e->name) == 0;
    if (c->json) {
        json_object_begin(j);
        json_kv_string(j, "name", e->name);
        json_kv_u64(j, "id", e->id);
        if (l) {
            json_kv_string(j, "label_name", l->name);
            json_kv_u64(j, "label_id", l->label_id);
        }
        json_object_end(j);
        return;
    }
    char file[64];
    ctxs_store_session_get_path(file, sizeof(file), NULL, e->id);
    printf("adopted   '%s' (%s, %s)", e->name, file, how);
    if (own_name)
        printf(", under its label's name\n");
    else if (l && l->name[0])
        printf(": its label's name '%s' is another session's; `ctxstore rename %s NEW` "
               "names it\n", l->name, e->name);
    else
        printf("\n");
}

/* The sessions of after[0..n) that came in from files (with
 * labelled_only, only those whose label was seen), each said as
 * adopted_print() says it: a JSON array into j, else lines (how: from
 * where). */
static void adopted_list(const cli *c, json *j, const ctxs_session_entry *after, size_t n,
                         const label_seen *seen, size_t n_seen, int labelled_only,
                         const char *how)
{
    if (j)
        json_array_begin(j);
    for (size_t i = 0; i < n; i++) {
        const label_seen *l = label_of(seen, n_seen, after[i].id);
        if (l || !labelled_only)
            adopted_print(c, j, &after[i], how, l);
    }
    if (j)
        json_array_end(j);
}

const cli_command cli_cmd_compact = {
    .name = "compact",
    .run = cmd_compact,
    .summary = "give back unused disk space",
    .help =
        "compact [SESSION | --all] [--json]\n\n"
        "Punches out the KV blocks of slots that hold no token (after rollbacks\n"
        "and recoveries). With --all (the default), every session, then removes\n"
        "orphaned index rows and leftover files, and rewrites the index\n"
        "compacted when no other process has the store open. Refuses (exit 4) a\n"
        "session that a process has open.\n",
};

int cmd_compact(cli *c, int argc, char **argv)
{
    const char *only = NULL;
    int ex = cli_parse_one_or_all(c, argc, argv, &only);
    if (ex < 0 && only)
        ex = cli_check_name("session name", only);
    if (ex >= 0)
        return ex;
    ctxs_store *st;
    if ((ex = cli_store_open(c, &st, CLI_STORE_WRITE)) != CLI_OK)
        return ex;
    /* The sessions before, to name those compact adopted (files the
     * index did not know, indexed under their label's name). */
    ctxs_session_entry *before = NULL, *after = NULL;
    size_t n_before = 0, n_after = 0;
    int listed = !only && ctxs_store_session_list(&before, &n_before, st) == 0;
    if (!listed)
        before = NULL, n_before = 0;
    label_seen *seen = NULL;
    size_t n_seen = only ? 0 : labels_before(&seen, c, listed ? st : NULL, 0);
    progress bar;
    progress_start(&bar, c, "compact", 0, 0);
    ctxs_store_compact_result res;
    ctxs_store_compact_options co = CTXS_STORE_COMPACT_OPTIONS_INIT;
    co.progress = progress_callback;
    co.progress_arg = &bar;
    int rc = ctxs_store_compact(&res, st, only, &co);
    progress_end(&bar);
    if (rc == 0 && !only && ctxs_store_session_list(&after, &n_after, st) < 0)
        after = NULL, n_after = 0;
    ctxs_store_close(st);
    /* after[] entries whose id before[] lacks come first: the adopted. */
    size_t n_adopted = 0;
    for (size_t i = 0; i < n_after; i++) {
        int known = 0;
        for (size_t k = 0; k < n_before && !known; k++)
            known = before[k].id == after[i].id;
        if (!known)
            after[n_adopted++] = after[i];
    }
    ctxs_free(before);
    if (rc < 0) {
        ctxs_free(after);
        free(seen);
        return cli_fail(rc, only ? "compacting '%s'" : "compacting %s", only ? only : c->store_dir);
    }
    if (c->json) {
        json j;
        json_init(&j, stdout);
        json_object_begin(&j);
        json_key(&j, "adopted");
        adopted_list(c, &j, after, n_adopted, seen, n_seen, 0, NULL);
        json_kv_u64(&j, "sessions", res.sessions);
        json_kv_u64(&j, "skipped_busy", res.skipped_busy);
        json_kv_u64(&j, "bytes_before", res.bytes_before);
        json_kv_u64(&j, "bytes_after", res.bytes_after);
        json_kv_bool(&j, "index_compacted", res.index_compacted);
        json_kv_bool(&j, "index_busy", res.index_busy);
        json_kv_u64(&j, "index_bytes_before", res.index_bytes_before);
        json_kv_u64(&j, "index_bytes_after", res.index_bytes_after);
        json_kv_u64(&j, "orphans_removed", res.orphans_removed);
        json_object_end(&j);
        json_finish(&j);
    } else {
        char a[32], b[32];
        printf("sessions  %" PRIu64 " compacted: %s -> %s on disk\n", res.sessions,
               fmt_size(a, res.bytes_before), fmt_size(b, res.bytes_after));
        if (res.skipped_busy)
            printf("skipped   %" PRIu64 " open by a process; run compact again when they are closed\n",
                   res.skipped_busy);
        if (!only) {
            if (res.index_compacted)
                printf("index     rewritten: %s -> %s\n", fmt_size(a, res.index_bytes_before),
                       fmt_size(b, res.index_bytes_after));
            else if (res.index_busy)
                printf("index     left as it is: another process has the store open\n");
            printf("orphans   %" PRIu64 " removed\n", res.orphans_removed);
            adopted_list(c, NULL, after, n_adopted, seen, n_seen, 0,
                         "a file the index did not know");
            print_strays(c);
        }
    }
    ctxs_free(after);
    free(seen);
    return res.skipped_busy && only ? CLI_EBUSY : CLI_OK;
}

/* One session gc deleted, or would delete. */
static void gc_session_print(const cli *c, json *j, const ctxs_session_entry *e, int dry)
{
    if (c->json) {
        json_object_begin(j);
        json_kv_string(j, "name", e->name);
        json_kv_u64(j, "id", e->id);
        json_kv_u64(j, "n_tokens", e->n_tokens);
        json_kv_u64(j, "disk_bytes", e->disk_bytes);
        json_kv_u64(j, "last_used_unix_ms", e->last_used_unix_ms);
        json_object_end(j);
    } else {
        char size[32], age[32];
        printf("%s '%s' (%" PRIu64 " tokens, %s, last used %s)\n",
               dry ? "would delete" : "deleted", e->name, e->n_tokens,
               fmt_size(size, e->disk_bytes), fmt_age(age, e->last_used_unix_ms));
    }
}

const cli_command cli_cmd_gc = {
    .name = "gc",
    .run = cmd_gc,
    .summary = "delete least recently used sessions",
    .help =
        "gc --max-size SIZE [--dry-run] [--json]\n\n"
        "Deletes sessions, least recently used first, until the session files\n"
        "take at most SIZE on disk (e.g. 10G, 512MiB), and names each session it\n"
        "deleted. Pinned sessions (`ctxstore pin`) and those that a process has\n"
        "open are kept. With --dry-run nothing is deleted: it names the sessions\n"
        "gc would delete now (and works on a store you cannot write).\n",
};

int cmd_gc(cli *c, int argc, char **argv)
{
    static const struct option longopts[] = {
        CLI_COMMON_LONGOPTS,
        { "max-size", required_argument, NULL, 'm' },
        { "dry-run", no_argument, NULL, 'n' },
        { NULL, 0, NULL, 0 },
    };
    int opt, have_budget = 0, dry = 0, ex;
    uint64_t budget = 0;
    while ((opt = cli_getopt(c, argc, argv, ":m:nh", longopts, &ex)) > 0) {
        if (opt == 'm') {
            if (parse_size(optarg, &budget) != 0)
                return cli_usage_error("gc", "'%s' is not a size (e.g. 10G, 512MiB)", optarg);
            have_budget = 1;
        } else { /* 'n' */
            dry = 1;
        }
    }
    if (opt == CLI_GETOPT_EXIT)
        return ex;
    if (!have_budget || optind < argc)
        return cli_usage_error("gc", "gc takes --max-size SIZE and no arguments");
    ctxs_store *st;
    ex = cli_store_open(c, &st, dry ? CLI_STORE_READ : CLI_STORE_WRITE);
    if (ex != CLI_OK)
        return ex;
    ctxs_store_gc_result res;
    int rc = ctxs_store_gc(&res, st, budget, dry ? CTXS_GC_DRY_RUN : 0);
    ctxs_store_close(st);
    /* What was deleted before a failure is said too: it is gone. */
    if (rc < 0)
        ex = cli_fail(rc, "gc of %s", c->store_dir);
    json j = { 0 };
    if (c->json) {
        json_init(&j, stdout);
        json_object_begin(&j);
        json_kv_bool(&j, "dry_run", dry);
        json_kv_u64(&j, "budget_bytes", budget);
        json_kv_u64(&j, "bytes_before", res.bytes_before);
        json_kv_u64(&j, "bytes_after", res.bytes_after);
        json_kv_u64(&j, "deleted", res.deleted);
        json_kv_u64(&j, "skipped_open", res.skipped_open);
        json_kv_u64(&j, "skipped_pinned", res.skipped_pinned);
        json_key(&j, "sessions");
        json_array_begin(&j);
    }
    for (size_t i = 0; i < res.n_sessions; i++)
        gc_session_print(c, &j, &res.sessions[i], dry);
    if (c->json) {
        json_array_end(&j);
        json_error(&j);
        json_object_end(&j);
        json_finish(&j);
    } else if (rc == 0) {
        char a[32], b[32], d[32];
        printf("%s %" PRIu64 " session%s: %s -> %s (budget %s)\n",
               dry ? "would delete" : "deleted", res.deleted, res.deleted == 1 ? "" : "s",
               fmt_size(a, res.bytes_before), fmt_size(b, res.bytes_after), fmt_size(d, budget));
        if (res.skipped_open)
            printf("kept %" PRIu64 " open session%s\n", res.skipped_open,
                   res.skipped_open == 1 ? "" : "s");
        if (res.skipped_pinned)
            printf("kept %" PRIu64 " pinned session%s\n", res.skipped_pinned,
                   res.skipped_pinned == 1 ? "" : "s");
        if (res.bytes_after > budget)
            printf("still above the budget: the open and pinned sessions take the rest\n");
    }
    ctxs_free(res.sessions);
    return ex;
}

/* Does one's work on each session named in argv[first..], through c's
 * store opened for writing: one(c, j, st, name, arg) reports what it did
 * (into the array j with --json) and returns 0, or the library's code
 * (reported). Every name is tried; the first failure decides the exit
 * code, and the result still lists what was done before and after it:
 * with --json one document, {key: [...], "error": ...}. */
static int each_session(cli *c, int argc, char **argv, int first, const char *key,
                        int (*one)(const cli *c, json *j, ctxs_store *st, const char *name,
                                   void *arg),
                        void *arg)
{
    ctxs_store *st;
    int ex = cli_store_open(c, &st, CLI_STORE_WRITE);
    if (ex != CLI_OK)
        return ex;
    json j;
    if (c->json) {
        json_init(&j, stdout);
        json_object_begin(&j);
        json_key(&j, key);
        json_array_begin(&j);
    }
    for (int i = first; i < argc; i++) {
        int rc = one(c, &j, st, argv[i], arg);
        if (rc < 0 && ex == CLI_OK)
            ex = cli_exit_code(rc);
    }
    ctxs_store_close(st);
    if (c->json) {
        json_array_end(&j);
        json_error(&j);
        json_object_end(&j);
        json_finish(&j);
    }
    return ex;
}

/* Deletes the session name, and says so. */
static int rm_one(const cli *c, json *j, ctxs_store *st, const char *name, void *arg)
{
    (void)arg;
    ctxs_session_entry e;
    int rc = ctxs_store_session_get(&e, st, name);
    if (rc == 0)
        rc = ctxs_store_session_delete(st, name);
    if (rc < 0) {
        cli_fail(rc, "session '%s'", name);
    } else if (c->json) {
        json_object_begin(j);
        json_kv_string(j, "name", e.name);
        json_kv_u64(j, "id", e.id);
        json_kv_u64(j, "n_tokens", e.n_tokens);
        json_object_end(j);
    } else {
        printf("removed '%s' (%" PRIu64 " tokens)\n", e.name, e.n_tokens);
    }
    return rc;
}

const cli_command cli_cmd_rm = {
    .name = "rm",
    .run = cmd_rm,
    .summary = "delete sessions",
    .help =
        "rm SESSION... [--json]\n\n"
        "Deletes sessions with their checkpoints and prefixes, and names each\n"
        "with its tokens. Refuses (exit 4) a session that a process has open.\n",
};

int cmd_rm(cli *c, int argc, char **argv)
{
    int first, ex = cli_parse_common(c, argc, argv, &first);
    if (ex >= 0)
        return ex;
    if (first >= argc)
        return cli_usage_error("rm", "rm takes one or more session names");
    /* All or none: a bad name refuses the command before anything goes. */
    for (int i = first; i < argc; i++)
        if ((ex = cli_check_name("session name", argv[i])) >= 0)
            return ex;
    return each_session(c, argc, argv, first, "removed", rm_one, NULL);
}

/* Pins (*pinned) or unpins the session name, and says so. */
static int pin_one(const cli *c, json *j, ctxs_store *st, const char *name, void *arg)
{
    int pinned = *(const int *)arg;
    int rc = ctxs_store_session_set_pinned(st, name, pinned);
    if (rc < 0)
        cli_fail(rc, "session '%s'", name);
    else if (c->json)
        json_string(j, name);
    else
        printf("%s '%s'\n", pinned ? "pinned" : "unpinned", name);
    return rc;
}

const cli_command cli_cmd_pin = {
    .name = "pin",
    .run = cmd_pin,
    .summary = "keep sessions from gc",
    .help =
        "pin SESSION... [--json]\n\n"
        "Pins sessions: gc never deletes a pinned session. The pin stays when the\n"
        "session is renamed; `ctxstore rm` still deletes it. `ctxstore ls` shows\n"
        "pins.\n",
};

const cli_command cli_cmd_unpin = {
    .name = "unpin",
    .run = cmd_pin,
    .summary = "let gc delete sessions again",
    .help =
        "unpin SESSION... [--json]\n\n"
        "Takes the pin off sessions, so that gc may delete them again.\n",
};

int cmd_pin(cli *c, int argc, char **argv)
{
    int first, ex = cli_parse_common(c, argc, argv, &first);
    if (ex >= 0)
        return ex;
    int pinned = strcmp(argv[0], "pin") == 0;
    if (first >= argc)
        return cli_usage_error(argv[0], "%s takes one or more session names", argv[0]);
    return each_session(c, argc, argv, first, pinned ? "pinned" : "unpinned", pin_one, &pinned);
}

/* Reports a refused rename. The library answers CTXS_EINVAL for either
 * name and CTXS_ENOTFOUND only for from; the advice for a taken name says
 * what to do about it without repeating it. */
static int rename_fail(int rc, const char *from, const char *to)
{
    if (rc == CTXS_ENOTFOUND)
        return cli_fail(rc, "session '%s'", from);
    if (rc == CTXS_ETAKEN)
        return cli_fail_hint(rc, "a session has that name; choose another NEW, or remove that "
                                 "session first with `ctxstore rm`",
                             "renaming '%s' to '%s'", from, to);
    return cli_fail(rc, "renaming '%s' to '%s'", from, to);
}

const cli_command cli_cmd_rename = {
    .name = "rename",
    .run = cmd_rename,
    .summary = "rename a session",
    .help =
        "rename OLD NEW [--json]\n\n"
        "Renames the session OLD to NEW. Its file, tokens and checkpoints stay as\n"
        "they are, and a process that has it open keeps using it. Refuses (exit 7)\n"
        "a NEW that another session has.\n",
};

int cmd_rename(cli *c, int argc, char **argv)
{
    int first, ex = cli_parse_common(c, argc, argv, &first);
    if (ex >= 0)
        return ex;
    if (argc - first != 2)
        return cli_usage_error("rename", "rename takes OLD and NEW");
    const char *from = argv[first], *to = argv[first + 1];
    if ((ex = cli_check_name("session name", from)) >= 0 ||
        (ex = cli_check_name("new name", to)) >= 0)
        return ex;
    ctxs_store *st;
    if ((ex = cli_store_open(c, &st, CLI_STORE_WRITE)) != CLI_OK)
        return ex;
    ctxs_session_entry e;
    int rc = ctxs_store_session_rename(st, from, to);
    if (rc == 0)
        rc = ctxs_store_session_get(&e, st, to);
    ctxs_store_close(st);
    if (rc < 0)
        return rename_fail(rc, from, to);
    /* What the file holds now: the index's count is as of the session's
     * last close, and a writer may be adding to it. */
    uint64_t positions = e.n_tokens, held = e.n_tokens;
    cli_session_tokens(c, e.id, &positions, &held);
    if (c->json) {
        json j;
        json_begin_named(&j, e.name);
        json_kv_string(&j, "old_name", from);
        json_kv_u64(&j, "id", e.id);
        json_kv_u64(&j, "n_tokens", positions);
        json_kv_u64(&j, "held", held);
        json_object_end(&j);
        json_finish(&j);
    } else {
        char t[64];
        printf("renamed '%s' to '%s' (%s)\n", from, e.name, fmt_tokens(t, positions, held));
    }
    return CLI_OK;
}

/* The files a rebuild left alone, each with the way out: no command of
 * the store will ever adopt them. */
static void print_strays(const cli *c)
{
    ctxs_store *st;
    if (ctxs_store_open(&st, c->store_dir, CTXS_RDONLY, NULL) != 0)
        return;
    ctxs_store_file *strays;
    size_t k = cli_strays(&strays, c, st);
    char dir[PATH_MAX];
    cli_sessions_dir(dir, sizeof(dir), NULL);
    for (size_t i = 0; i < k; i++) {
        char size[32], hint[PATH_MAX * 6];
        cli_stray_hint(hint, sizeof(hint), c, strays[i].file);
        printf("left alone: %s/%s (%s on disk, %s); %s\n", dir, strays[i].file,
               fmt_size(size, strays[i].disk_bytes), ctxs_strerror(strays[i].status), hint);
    }
    ctxs_free(strays);
    ctxs_store_close(st);
}

const cli_command cli_cmd_reindex = {
    .name = "reindex",
    .run = cmd_reindex,
    .summary = "rebuild the index from the session files",
    .help =
        "reindex [--json]\n\n"
        "Rebuilds the index from the session files: names, models, token counts\n"
        "and prefixes. Checkpoints and model names are kept.\n",
};

int cmd_reindex(cli *c, int argc, char **argv)
{
    int first, ex = cli_parse_common(c, argc, argv, &first);
    if (ex >= 0)
        return ex;
    if (first < argc)
        return cli_usage_error("reindex", "reindex takes no arguments");
    /* Files copied in under another id: said with the name each got.
     * Looked at before the store is opened, which rebuilds a missing
     * index. */
    label_seen *seen = NULL;
    size_t n_seen = labels_before(&seen, c, NULL, 1);
    ctxs_store *st;
    if ((ex = cli_store_open(c, &st, CLI_STORE_REBUILD)) != CLI_OK) {
        free(seen);
        return ex;
    }
    ctxs_store_reindex_result res;
    int rc = ctxs_store_reindex(&res, st);
    ctxs_session_entry *after = NULL;
    size_t n_after = 0;
    if (rc == 0 && n_seen && ctxs_store_session_list(&after, &n_after, st) < 0)
        after = NULL, n_after = 0;
    ctxs_store_close(st);
    if (rc < 0) {
        free(seen);
        return cli_fail(rc, "reindexing %s", c->store_dir);
    }
    if (c->json) {
        json j;
        json_init(&j, stdout);
        json_object_begin(&j);
        json_key(&j, "adopted");
        adopted_list(c, &j, after, n_after, seen, n_seen, 1, NULL);
        json_kv_u64(&j, "sessions", res.sessions);
        json_kv_u64(&j, "skipped", res.skipped);
        json_kv_u64(&j, "files_renumbered", res.files_renumbered);
        json_kv_bool(&j, "next_id_mended", res.next_id_mended != 0);
        json_kv_u64(&j, "next_id_was", res.next_id_was);
        json_kv_u64(&j, "next_id", res.next_id);
        json_object_end(&j);
        json_finish(&j);
    } else {
        printf("indexed %" PRIu64 " session file%s", res.sessions, res.sessions == 1 ? "" : "s");
        if (res.skipped)
            printf("; %" PRIu64 " file%s that do not open were left alone",
                   res.skipped, res.skipped == 1 ? "" : "s");
        printf("\n");
        adopted_list(c, NULL, after, n_after, seen, n_seen, 1, "copied in under another id");
        print_strays(c);
        if (res.files_renumbered)
            printf("renumbered %" PRIu64 " session file%s named with id 0 or past the range\n",
                   res.files_renumbered, res.files_renumbered == 1 ? "" : "s");
        if (res.next_id_mended)
            printf("mended the next session id: it was %" PRIu64 ", it is %" PRIu64 "\n",
                   res.next_id_was, res.next_id);
    }
    ctxs_free(after);
    free(seen);
    return CLI_OK;
}

static void salvage_count_print(const cli *c, json *j, const char *kind,
                                const ctxs_store_repair_index_count *n)
{
    if (c->json) {
        json_key(j, kind);
        json_object_begin(j);
        json_kv_u64(j, "kept", n->kept);
        json_kv_u64(j, "dropped", n->dropped);
        json_kv_u64(j, "unread", n->unread);
        json_kv_bool(j, "whole", n->whole);
        json_object_end(j);
    } else {
        printf("%-12s %" PRIu64 " kept", kind, n->kept);
        if (n->dropped)
            printf(", %" PRIu64 " dropped", n->dropped);
        if (n->unread)
            printf(", %" PRIu64 " lost to the damage", n->unread);
        if (!n->whole)
            printf(" (the table did not read to its end)");
        printf("\n");
    }
}

const cli_command cli_cmd_repair_index = {
    .name = "repair-index",
    .run = cmd_repair_index,
    .summary = "repair a damaged index, keeping what still reads",
    .help =
        "repair-index [--json]\n\n"
        "The way out when the index is damaged (exit 8). Moves index/data.mdb to\n"
        "index.damaged-TIME/ (never deletes it), rebuilds the index from the\n"
        "session files, and puts back what of the damaged one still reads:\n"
        "sessions' names, checkpoints, metadata, pins and models' display names.\n"
        "The damaged index is read in child processes, so damage that would crash\n"
        "a reader costs what it holds, never the repair. Prints, kind by kind,\n"
        "what was kept, dropped (malformed, or of a session whose file is gone)\n"
        "and lost to the damage, and the sessions that came back under another\n"
        "name. Refused (exit 4) while any process has the store open.\n",
};

int cmd_repair_index(cli *c, int argc, char **argv)
{
    int first, ex = cli_parse_common(c, argc, argv, &first);
    if (ex >= 0)
        return ex;
    if (first < argc)
        return cli_usage_error("repair-index", "repair-index takes no arguments");
    /* What is there that is no regular file, to say what became of it. */
    const char *special = NULL;
    char what[PATH_MAX + 64];
    if (!cli_index_special(c->store_dir, &special, what, sizeof(what)))
        special = NULL;
    ctxs_store_repair_index_result res;
    int rc = ctxs_store_repair_index(&res, c->store_dir, 0);
    if (rc == CTXS_EINDEX && cli_index_special(c->store_dir, &special, what, sizeof(what))) {
        ctxs_free(res.moved_to);
        return cli_fail_said(rc, "remove it by hand, then run repair-index again",
                             "%s/index/%s is %s, which repair-index does not remove",
                             c->store_dir, special, what);
    }
    if (rc == 0 && special)
        fprintf(stderr, "ctxstore: index/%s was %s, not a regular file: %s\n", special, what,
                strcmp(special, "data.mdb") == 0 ? "moved aside with the damaged index"
                                                 : "removed, and made anew");
    if (rc == CTXS_EBUSY) {
        ctxs_free(res.moved_to);
        return cli_fail_hint(rc, "close the programs that use it, then run repair-index again",
                             "store %s is open in another process", c->store_dir);
    }
    if (rc < 0) {
        if (res.moved_to)
            fprintf(stderr, "ctxstore: the damaged index is in %s\n", res.moved_to);
        ctxs_free(res.moved_to);
        return cli_fail(rc, "repairing the index of %s", c->store_dir);
    }
    json j;
    if (c->json) {
        json_init(&j, stdout);
        json_object_begin(&j);
        json_kv_u64(&j, "sessions", res.sessions);
        json_kv_u64(&j, "skipped", res.skipped);
        json_kv_u64(&j, "meta_pages", res.meta_pages);
        json_kv_u64(&j, "tables_failed", res.tables_failed);
        if (res.moved_to)
            json_kv_string(&j, "moved_to", res.moved_to);
        else {
            json_key(&j, "moved_to");
            json_null(&j);
        }
    } else {
        if (res.moved_to)
            printf("damaged index moved to %s\n", res.moved_to);
        printf("indexed %" PRIu64 " session file%s", res.sessions, res.sessions == 1 ? "" : "s");
        if (res.skipped)
            printf("; %" PRIu64 " that do not open left alone", res.skipped);
        printf("\n");
        print_strays(c);
        if (res.moved_to && !res.meta_pages && !(special && strcmp(special, "data.mdb") == 0))
            printf("nothing of the damaged index could be read: both meta pages are lost\n");
    }
    salvage_count_print(c, &j, "names", &res.names);
    salvage_count_print(c, &j, "checkpoints", &res.checkpoints);
    salvage_count_print(c, &j, "metadata", &res.metadata);
    salvage_count_print(c, &j, "pins", &res.pins);
    salvage_count_print(c, &j, "models", &res.models);
    if (c->json) {
        json_key(&j, "renamed");
        json_array_begin(&j);
    }
    for (size_t i = 0; i < res.n_renamed; i++) {
        if (c->json) {
            json_object_begin(&j);
            json_kv_u64(&j, "id", res.renamed[i].id);
            json_kv_string(&j, "name", res.renamed[i].name);
            json_object_end(&j);
        } else {
            printf("name lost: session %016" PRIx64 " is now '%s'\n", res.renamed[i].id,
                   res.renamed[i].name);
        }
    }
    if (c->json) {
        json_array_end(&j);
        json_object_end(&j);
        json_finish(&j);
    }
    ctxs_free(res.moved_to);
    ctxs_free(res.renamed);
    return CLI_OK;
}
