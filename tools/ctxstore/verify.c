/*
 * ctxstore verify [SESSION | --all]: the header and record CRCs, every held
 * token's checksum, and (for --all) every record of the index
 * (ctxs_store_check()) and the index against the session files. The exit
 * code is the verdict: 0 nothing wrong, 8 the index is damaged (whatever
 * else was found: its way out comes first), 5 damage in session files.
 * Operations a crash interrupted (ctxs_store_intent_list()) are listed
 * with what the next read-write open does with them, never as damage.
 *
 * A bad token is reported with the 64-token chunk it falls in (the unit
 * the prefix index uses), and verification goes on past it, so the report
 * shows every damaged stretch, not just the first.
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

enum { STEP = 1024, MAX_BAD = 4096 };

typedef struct result {
    const char *name;
    int status;              /* 0 ok, else the error that describes it */
    char problem[PATH_MAX + 512]; /* what is wrong beyond bad tokens, or "" */
    uint64_t checked;        /* tokens verified */
    uint64_t n_bad;
    uint64_t bad[MAX_BAD];   /* the first MAX_BAD bad positions */
    uint64_t lost;           /* tokens the open's recovery dropped */
} result;

typedef struct run {
    const cli *c;
    progress bar;
    uint64_t done;
    json j;
    int damaged;
} run;

static void result_json(json *j, const result *r)
{
    json_object_begin(j);
    json_kv_string(j, "name", r->name);
    json_kv_bool(j, "ok", r->status == 0);
    json_kv_string(j, "status", ctxs_err_name(r->status));
    if (r->problem[0])
        json_kv_string(j, "problem", r->problem);
    json_kv_u64(j, "tokens_checked", r->checked);
    json_kv_u64(j, "bad_tokens", r->n_bad);
    json_kv_u64(j, "recovery_dropped", r->lost);
    json_key(j, "bad_chunks");
    json_array_begin(j);
    size_t shown = r->n_bad < MAX_BAD ? r->n_bad : MAX_BAD;
    for (size_t i = 0; i < shown;) {
        uint64_t chunk = r->bad[i] / CTXS_PREFIX_CHUNK;
        json_object_begin(j);
        json_kv_u64(j, "chunk", chunk);
        json_kv_u64(j, "first_token", chunk * CTXS_PREFIX_CHUNK);
        json_kv_u64(j, "last_token", chunk * CTXS_PREFIX_CHUNK + CTXS_PREFIX_CHUNK - 1);
        json_key(j, "bad_tokens");
        json_array_begin(j);
        for (; i < shown && r->bad[i] / CTXS_PREFIX_CHUNK == chunk; i++)
            json_u64(j, r->bad[i]);
        json_array_end(j);
        json_object_end(j);
    }
    json_array_end(j);
    json_object_end(j);
}

static void result_print(const result *r)
{
    if (r->status == 0) {
        printf("ok       %s: %" PRIu64 " tokens verified\n", r->name, r->checked);
        return;
    }
    if (r->problem[0])
        printf("DAMAGED  %s: %s\n", r->name, r->problem);
    size_t shown = r->n_bad < MAX_BAD ? r->n_bad : MAX_BAD;
    if (shown)
        printf("DAMAGED  %s: %" PRIu64 " of %" PRIu64 " tokens fail their checksums\n",
               r->name, r->n_bad, r->checked);
    for (size_t i = 0; i < shown;) {
        uint64_t chunk = r->bad[i] / CTXS_PREFIX_CHUNK, lo = r->bad[i];
        size_t count = 0;
        uint64_t hi = lo;
        for (; i < shown && r->bad[i] / CTXS_PREFIX_CHUNK == chunk; i++, count++)
            hi = r->bad[i];
        printf("         chunk %" PRIu64 " (tokens %" PRIu64 "-%" PRIu64 "): %zu bad, "
               "from token %" PRIu64 " to %" PRIu64 "\n",
               chunk, chunk * CTXS_PREFIX_CHUNK, chunk * CTXS_PREFIX_CHUNK + CTXS_PREFIX_CHUNK - 1,
               count, lo, hi);
    }
    if (shown) {
        printf("         what to do: tokens from %" PRIu64 " on cannot be trusted; keep what is "
               "before with `ctxstore fork %s NEW --at %" PRIu64 "`, then `ctxstore rm %s`\n",
               r->bad[0], r->name, r->bad[0], r->name);
    } else if (r->lost) {
        printf("         what to do: the tokens after the last good one are gone; the session "
               "opens with what verifies\n");
    } else {
        printf("         what to do: restore the session from an export or delete it with "
               "`ctxstore rm %s`\n", r->name);
    }
}

/* Verifies every held token of the open session s: the sinks, then the
 * recent run, each in steps. The walk follows the held positions, never
 * [0, n_tokens): a ring's n_tokens is what its record claims (up to 2^62),
 * while what it holds is at most the capacity (ctxs__record_valid refuses
 * a record whose held range does not fit the slots), so the work is
 * bounded by the file, not by the claim. */
static void verify_tokens(run *rn, result *r, ctxs_session *s)
{
    ctxs_session_info info;
    ctxs_session_get_info(&info, s);
    r->lost = info.lost_tokens;
    uint64_t n = info.n_tokens;
    uint64_t first = info.ring_start > info.n_sink ? info.ring_start : info.n_sink;
    uint64_t runs[2][2] = { { 0, n < info.n_sink ? n : info.n_sink }, { first, n } };
    for (int k = 0; k < 2; k++) {
        uint64_t hi = runs[k][1];
        for (uint64_t pos = runs[k][0]; pos < hi;) {
            uint64_t to = hi - pos > STEP ? pos + STEP : hi, bad;
            if (ctxs_session_verify_range(&bad, s, pos, to) == CTXS_ECORRUPT) {
                if (r->n_bad < MAX_BAD)
                    r->bad[r->n_bad] = bad;
                r->n_bad++;
                pos = bad + 1;
            } else {
                pos = to;
            }
            /* The bar counts positions, as the index's totals do: it
             * jumps over what the ring evicted. */
            progress_update(&rn->bar, rn->done + pos);
        }
    }
    r->checked = info.n_held;
    rn->done += n;
    if (r->lost) {
        /* The open's recovery (a record from another boot) stopped at the
         * first token that failed, position n: name it with the rest. */
        if (r->n_bad < MAX_BAD)
            r->bad[r->n_bad] = n;
        r->n_bad++;
        snprintf(r->problem, sizeof(r->problem),
                 "the newest commit record claims %" PRIu64 " more tokens, from token %" PRIu64
                 ", than verify after the last sync; opening drops them",
                 r->lost, n);
    }
    if (r->n_bad)
        r->status = CTXS_ECORRUPT;
}

static void describe_file(result *r, const ctxs_file_report *rep, const char *path)
{
    int bad_records = (rep->records[0].status != 0) + (rep->records[1].status != 0);
    if (rep->header_status != 0)
        snprintf(r->problem, sizeof(r->problem), "%s: header: %s%s", path,
                 ctxs_strerror(rep->header_status),
                 rep->header_crc_ok ? "" : " (its CRC does not hold)");
    else if (bad_records == 2)
        snprintf(r->problem, sizeof(r->problem), "%s: both commit records are damaged", path);
    else if (bad_records == 1)
        snprintf(r->problem, sizeof(r->problem),
                 "%s: commit record %d is damaged (the other holds; the next writer rewrites it)",
                 path, rep->records[0].status != 0 ? 0 : 1);
}

static void verify_one(run *rn, ctxs_store *st, const ctxs_session_entry *e, result *r)
{
    char path[PATH_MAX];
    cli_session_path(path, sizeof(path), rn->c, e->id);
    ctxs_file_report rep;
    int rc = ctxs_file_inspect(&rep, path);
    if (rc < 0) {
        r->status = rc;
        snprintf(r->problem, sizeof(r->problem), "its file %s: %s", path, ctxs_strerror(rc));
        return;
    }
    describe_file(r, &rep, path);
    if (rep.status != 0) {
        r->status = rep.status;
        return;
    }
    if (rep.label_status == 0 && rep.label_id != e->id) {
        r->status = CTXS_ECORRUPT;
        snprintf(r->problem, sizeof(r->problem),
                 "%s: its label says id %" PRIu64 ", the index %" PRIu64 "; run `ctxstore reindex`",
                 path, rep.label_id, e->id);
        return;
    }
    if (memcmp(rep.model.model_hash, e->model_hash, 16) != 0) {
        r->status = CTXS_EMODEL;
        snprintf(r->problem, sizeof(r->problem),
                 "%s: the file's model is not the one the index names; run `ctxstore reindex`", path);
        return;
    }
    ctxs_session *s;
    /* Without CTXS_OPEN_VERIFY: a file last written in another boot is
     * verified from its watermark as any open would, and loses what fails;
     * otherwise the page cache holds everything and every token is checked
     * below. */
    ctxs_open_options o = CTXS_OPEN_OPTIONS_INIT;
    o.background = 0; /* verify reads every token itself, in order */
    if ((rc = ctxs_store_session_open(&s, st, e->name, NULL, CTXS_RDONLY, &o)) < 0) {
        r->status = rc;
        if (!r->problem[0])
            snprintf(r->problem, sizeof(r->problem), "%s does not open: %s", path,
                     ctxs_strerror(rc));
        return;
    }
    verify_tokens(rn, r, s);
    ctxs_session_close(s);
    if (r->status == 0 && r->problem[0])
        r->status = CTXS_ECORRUPT; /* a damaged record */
}

/* The intent of id among the store's, or NULL. */
static const ctxs_intent_entry *intent_of(const ctxs_intent_entry *intents, size_t n_intents,
                                          uint64_t id)
{
    for (size_t i = 0; i < n_intents; i++)
        if (intents[i].id == id)
            return &intents[i];
    return NULL;
}

/* Session files that no index entry names, and entries whose file is gone
 * are found by verify_one; this finds the first kind. A file that an
 * operation interrupted by a crash left (its intent is pending) is no
 * damage: it is reported with the intents, with what a read-write open
 * does with it, and not counted here. */
static int unindexed_files(run *rn, ctxs_store *st, const ctxs_intent_entry *intents,
                           size_t n_intents)
{
    ctxs_store_file *files = NULL;
    size_t n = 0;
    /* An index whose session records are malformed names no file. */
    if (ctxs_store_file_list(&files, &n, rn->c->store_dir, st) < 0 &&
        ctxs_store_file_list(&files, &n, rn->c->store_dir, NULL) < 0)
        return 0;
    char dir[PATH_MAX];
    cli_sessions_dir(dir, sizeof(dir), rn->c->store_dir);
    int found = 0;
    for (size_t i = 0; i < n; i++) {
        const ctxs_store_file *f = &files[i];
        if (intent_of(intents, n_intents, f->id))
            continue;
        found++;
        /* One that opens is adopted by compact; one that does not is left
         * alone by compact and reindex alike: naming them would send the
         * user in a circle. */
        if (rn->c->json) {
            json_string(&rn->j, f->file);
        } else if (f->status == 0) {
            printf("DAMAGED  index: %s/%s is a session file the index does not know; "
                   "`ctxstore compact` adopts it\n", dir, f->file);
        } else {
            char hint[PATH_MAX * 6];
            cli_stray_hint(hint, sizeof(hint), rn->c, f->file);
            printf("DAMAGED  %s/%s: a file the index does not know, which does not open (%s);"
                   " %s\n", dir, f->file, ctxs_strerror(f->status), hint);
        }
    }
    ctxs_free(files);
    return found;
}

/* Operations a crash interrupted: not damage, but what the next read-write
 * open of the store finishes or undoes. */
static void intents_report(run *rn, const ctxs_intent_entry *intents, size_t n)
{
    if (rn->c->json) {
        cli_intents_json(&rn->j, "interrupted", rn->c, intents, n);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        char what[4096 + 512];
        cli_intent_sentence(what, sizeof(what), rn->c, &intents[i]);
        printf("pending  %s\n", what);
    }
}

/* Every malformed record of the index, in the report. */
static void index_report(run *rn, const ctxs_store_check_result *chk)
{
    if (rn->c->json) {
        json *j = &rn->j;
        json_key(j, "index");
        json_object_begin(j);
        json_kv_bool(j, "ok", chk->n_problems == 0);
        json_kv_u64(j, "records_checked", chk->records);
        json_kv_u64(j, "problems_found", chk->n_problems);
        json_key(j, "problems");
        json_array_begin(j);
        for (size_t i = 0; i < chk->n_listed; i++) {
            json_object_begin(j);
            json_kv_string(j, "table", chk->problems[i].table);
            json_kv_string(j, "key", chk->problems[i].key);
            json_kv_string(j, "problem", chk->problems[i].what);
            json_object_end(j);
        }
        json_array_end(j);
        json_object_end(j);
        return;
    }
    for (size_t i = 0; i < chk->n_listed; i++) {
        const ctxs_index_problem *p = &chk->problems[i];
        printf("DAMAGED  index: %s%s%s: %s\n", p->table, p->key[0] ? " " : "", p->key, p->what);
    }
    if (chk->n_problems > chk->n_listed)
        printf("DAMAGED  index: and %" PRIu64 " more malformed records\n",
               chk->n_problems - chk->n_listed);
    if (chk->n_problems == 0)
        printf("ok       index: %" PRIu64 " records well-formed\n", chk->records);
}

/* verify FILE: a standalone session file, by its path; the exit code as
 * for a session of a store. */
static int verify_file(const cli *c, const char *path)
{
    run rn = { .c = c };
    result *r = calloc(1, sizeof(*r));
    if (!r)
        return cli_fail(CTXS_ENOMEM, "verify");
    r->name = path;
    ctxs_file_report rep;
    int rc = ctxs_file_inspect(&rep, path);
    if (rc < 0) {
        free(r);
        return cli_fail_hint(rc, rc == -ENOENT ? "give the path of a session file, or a "
                                                 "session's name (`ctxstore ls` lists them)"
                                               : NULL,
                             "session file %s", path);
    }
    describe_file(r, &rep, path);
    ctxs_session *s = NULL;
    ctxs_open_options o = CTXS_OPEN_OPTIONS_INIT;
    o.background = 0;
    if (rep.status != 0)
        r->status = rep.status;
    else if ((rc = ctxs_session_open(&s, path, NULL, CTXS_RDONLY, &o)) < 0) {
        r->status = rc;
        if (!r->problem[0])
            snprintf(r->problem, sizeof(r->problem), "%s does not open: %s", path,
                     ctxs_strerror(rc));
    } else {
        progress_start(&rn.bar, c, "verify", rep.records[0].n_tokens, 0);
        verify_tokens(&rn, r, s);
        progress_end(&rn.bar);
        ctxs_session_close(s);
        if (r->status == 0 && r->problem[0])
            r->status = CTXS_ECORRUPT;
    }
    int ex = r->status ? CLI_EDAMAGED : CLI_OK;
    if (c->json) {
        json_init(&rn.j, stdout);
        json_object_begin(&rn.j);
        json_key(&rn.j, "sessions");
        json_array_begin(&rn.j);
        result_json(&rn.j, r);
        json_array_end(&rn.j);
        json_kv_bool(&rn.j, "ok", ex == CLI_OK);
        json_object_end(&rn.j);
        json_finish(&rn.j);
    } else {
        result_print(r);
        printf("%s: the session file %s checked\n", ex ? "DAMAGE FOUND" : "all good", path);
    }
    free(r);
    return ex;
}

const cli_command cli_cmd_verify = {
    .name = "verify",
    .run = cmd_verify,
    .summary = "check sessions and the index",
    .help =
        "verify [SESSION | FILE | --all] [--json]\n\n"
        "Checks every held token's checksum, the header and commit record CRCs,\n"
        "and (with --all, the default) every record of the index and the index\n"
        "against the session files. Reads every KV byte. Exits 0 when nothing is\n"
        "wrong, 8 when a record of the index is malformed (each one named by\n"
        "table and key; the other commands refuse the same records with 8), 5\n"
        "when a session file is damaged, naming the session, the tokens and what\n"
        "to do. FILE (a path, as for info) checks that session file alone.\n",
};

int cmd_verify(cli *c, int argc, char **argv)
{
    const char *only = NULL;
    int ex = cli_parse_one_or_all(c, argc, argv, &only);
    if (ex < 0 && only && cli_is_session_path(only))
        return verify_file(c, only);
    if (ex < 0 && only)
        ex = cli_check_session_or_path(only);
    if (ex >= 0)
        return ex;

    ctxs_store *st;
    if ((ex = cli_store_open(c, &st, CLI_STORE_READ)) != CLI_OK)
        return ex;
    ctxs_session_entry *list = NULL;
    size_t n = 0;
    int rc;
    /* --all reads the index's records first: a malformed one is index
     * damage, reported as such, and the walk finds every one of them,
     * where the list below would stop at the first. */
    ctxs_store_check_result chk = { 0 };
    if (!only && (rc = ctxs_store_check(&chk, st)) < 0 && rc != CTXS_EINDEX) {
        ctxs_store_close(st);
        return cli_fail(rc, "checking the index of %s", c->store_dir);
    }
    /* What crashes left half done, which a read-only open leaves as it
     * is: the files they left are theirs, not damage. */
    ctxs_intent_entry *intents = NULL;
    size_t n_intents = 0;
    if (!only && (rc = ctxs_store_intent_list(&intents, &n_intents, st)) < 0 &&
        rc != CTXS_EINDEX) {
        ctxs_free(chk.problems);
        ctxs_store_close(st);
        return cli_fail(rc, "reading the interrupted operations of %s", c->store_dir);
    }
    if (only) {
        list = malloc(sizeof(*list));
        rc = list ? ctxs_store_session_get(list, st, only) : CTXS_ENOMEM;
        n = 1;
    } else {
        rc = ctxs_store_session_list(&list, &n, st);
        /* A session record the walk found malformed: the report says so,
         * and no session can be listed to verify. */
        if (rc == CTXS_EINDEX && chk.n_problems)
            rc = 0, list = NULL, n = 0;
    }
    if (rc < 0) {
        ctxs_free(chk.problems);
        ctxs_free(intents);
        ctxs_free(list);
        ctxs_store_close(st);
        return cli_fail(rc, only ? "session '%s'" : "listing the sessions of %s",
                        only ? only : c->store_dir);
    }

    run rn = { .c = c };
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += list[i].n_tokens;
    progress_start(&rn.bar, c, "verify", total, 0);
    result *r = malloc(sizeof(*r));
    if (!r) {
        ctxs_free(chk.problems);
        ctxs_free(intents);
        ctxs_free(list);
        ctxs_store_close(st);
        return cli_fail(CTXS_ENOMEM, "verify");
    }
    if (c->json) {
        json_init(&rn.j, stdout);
        json_object_begin(&rn.j);
        json_key(&rn.j, "sessions");
        json_array_begin(&rn.j);
    }
    for (size_t i = 0; i < n; i++) {
        memset(r, 0, sizeof(*r));
        r->name = list[i].name;
        verify_one(&rn, st, &list[i], r);
        rn.damaged |= r->status != 0;
        progress_update(&rn.bar, rn.done);
        if (c->json)
            result_json(&rn.j, r);
        else {
            if (rn.bar.drawn)
                fputc('\n', stderr), rn.bar.drawn = 0;
            result_print(r);
        }
    }
    progress_end(&rn.bar);
    free(r);
    if (c->json) {
        json_array_end(&rn.j);
        if (!only) {
            json_key(&rn.j, "unindexed_files");
            json_array_begin(&rn.j);
        }
    }
    if (!only && unindexed_files(&rn, st, intents, n_intents) > 0)
        rn.damaged = 1;
    if (c->json && !only)
        json_array_end(&rn.j);
    if (!only)
        intents_report(&rn, intents, n_intents);
    if (!only)
        index_report(&rn, &chk);
    ex = rn.damaged ? CLI_EDAMAGED : CLI_OK;
    if (chk.n_problems) {
        char hint[PATH_MAX * 3 + 256];
        cli_index_hint(hint, sizeof(hint), c->store_dir);
        ex = cli_fail_said(CTXS_EINDEX, hint,
                           "the index of store %s has %" PRIu64 " malformed record%s "
                           "(listed above)", c->store_dir, chk.n_problems,
                           chk.n_problems == 1 ? "" : "s");
    }
    if (c->json) {
        json_kv_bool(&rn.j, "ok", ex == CLI_OK);
        json_error(&rn.j);
        json_object_end(&rn.j);
        json_finish(&rn.j);
    } else {
        printf("%s: %zu session%s checked%s\n",
               chk.n_problems ? "INDEX DAMAGED" : rn.damaged ? "DAMAGE FOUND" : "all good", n,
               n == 1 ? "" : "s",
               only ? "" : ", index records read and compared with the files");
    }
    ctxs_free(chk.problems);
    ctxs_free(intents);
    ctxs_free(list);
    ctxs_store_close(st);
    return ex;
}
