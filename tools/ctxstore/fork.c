/*
 * Branching a conversation: fork and checkpoint.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* Reports rc from an operation on the checkpoint name of session, doing
 * what the message begins with (NULL: the checkpoint and session). The
 * library answers CTXS_ENOTFOUND alike for a missing session and a missing
 * checkpoint; the advice differs, so the index is asked which it was. That
 * lookup starts a library call, which clears the reason rc came with: the
 * reason is kept first. */
static int checkpoint_fail(int rc, ctxs_store *st, const char *session, const char *name,
                           const char *doing)
{
    ctxs_session_entry e;
    char what[320];
    if (doing)
        snprintf(what, sizeof(what), "%s", doing);
    else
        snprintf(what, sizeof(what), "checkpoint '%s' of '%s'", name, session);
    if (rc != CTXS_ENOTFOUND)
        return cli_fail(rc, "%s", what);
    char why[512];
    const char *reason = cli_reason(rc);
    snprintf(why, sizeof(why), "%s", reason ? reason : ctxs_strerror(rc));
    if (ctxs_store_session_get(&e, st, session) == CTXS_ENOTFOUND)
        return cli_fail(rc, "session '%s'", session);
    char hint[320];
    snprintf(hint, sizeof(hint), "`ctxstore checkpoint ls %s` lists its checkpoints", session);
    return cli_fail_said(rc, hint, "%s: %s", what, why);
}

/* The checkpoint name of s, from the index. Errors: those of
 * ctxs_checkpoint_list(), CTXS_ENOTFOUND (no such checkpoint), CTXS_EINVAL
 * (name breaks the rule). */
static int checkpoint_get(ctxs_checkpoint_entry *out, ctxs_store *st, const ctxs_session *s,
                          const char *name)
{
    ctxs_checkpoint_entry *cps;
    size_t n;
    int rc = ctxs_checkpoint_list(&cps, &n, s);
    if (rc < 0)
        return rc;
    rc = CTXS_ENOTFOUND;
    for (size_t i = 0; i < n && rc < 0; i++)
        if (strcmp(cps[i].name, name) == 0)
            *out = cps[i], rc = 0;
    ctxs_free(cps);
    /* A refused name is a usage error, as the library's checkpoint calls
     * make it. Session and checkpoint names follow one rule, which a
     * session lookup applies without changing anything. */
    ctxs_session_entry e;
    if (rc == CTXS_ENOTFOUND && ctxs_store_session_get(&e, st, name) == CTXS_EINVAL)
        rc = CTXS_EINVAL;
    else if (rc == CTXS_ENOTFOUND)
        rc = ctxs_set_last_error(rc, "the session has no checkpoint named '%s'", name);
    return rc;
}

const cli_command cli_cmd_fork = {
    .name = "fork",
    .run = cmd_fork,
    .summary = "copy a session's first tokens into a new session",
    .help =
        "fork SRC DST [--at N | --checkpoint NAME]\n\n"
        "Creates DST holding the first N tokens of SRC (all of them by\n"
        "default), or those of SRC's checkpoint NAME. Shares blocks where the\n"
        "file system can (Btrfs, XFS).\n",
};

int cmd_fork(cli *c, int argc, char **argv)
{
    static const struct option longopts[] = {
        CLI_COMMON_LONGOPTS,
        { "at", required_argument, NULL, 'n' },
        { "checkpoint", required_argument, NULL, 'k' },
        { NULL, 0, NULL, 0 },
    };
    int opt, have_at = 0, ex;
    uint64_t at = UINT64_MAX;
    const char *checkpoint = NULL;
    while ((opt = cli_getopt(c, argc, argv, "h", longopts, &ex)) > 0) {
        if (opt == 'n') {
            /* UINT64_MAX means "all" to the library; no session holds it. */
            if (parse_u64(optarg, &at) != 0 || at == UINT64_MAX)
                return cli_usage_error("fork", "--at takes a token count, not '%s'", optarg);
            have_at = 1;
        } else { /* 'k' */
            checkpoint = optarg;
        }
    }
    if (opt == CLI_GETOPT_EXIT)
        return ex;
    if (argc - optind != 2)
        return cli_usage_error("fork", "fork takes SRC and DST");
    if (checkpoint && have_at)
        return cli_usage_error("fork", "--at and --checkpoint exclude each other");
    const char *src = argv[optind], *dst = argv[optind + 1];
    if ((ex = cli_check_name("session name", src)) >= 0 ||
        (ex = cli_check_name("new session name", dst)) >= 0 ||
        (checkpoint && (ex = cli_check_name("checkpoint name", checkpoint)) >= 0))
        return ex;
    ctxs_store *st;
    ex = cli_store_open(c, &st, CLI_STORE_WRITE);
    if (ex != CLI_OK)
        return ex;
    int rc = checkpoint ? ctxs_store_session_fork_checkpoint(NULL, st, src, checkpoint, dst, NULL)
                        : ctxs_store_session_fork(NULL, st, src, dst, at, NULL);
    ctxs_session_entry e;
    if (rc == 0)
        rc = ctxs_store_session_get(&e, st, dst);
    char doing[320];
    snprintf(doing, sizeof(doing), "forking '%s' into '%s'", src, dst);
    if (rc == CTXS_ENOTFOUND && checkpoint)
        ex = checkpoint_fail(rc, st, src, checkpoint, doing);
    else if (rc == CTXS_EINVAL && have_at) {
        /* Both names were checked above: what the library refused is
         * --at, and its reason says the count. */
        ex = cli_fail_hint(rc, "--at is at most the tokens SRC holds (`ctxstore info SRC`)",
                           "%s", doing);
    } else if (rc < 0)
        ex = cli_fail(rc, "%s", doing);
    ctxs_store_close(st);
    if (rc < 0)
        return ex;
    if (c->json) {
        json j;
        json_begin_named(&j, e.name);
        json_kv_u64(&j, "id", e.id);
        json_kv_u64(&j, "n_tokens", e.fork_tokens);
        json_object_end(&j);
        json_finish(&j);
    } else {
        printf("forked '%s' into '%s' at %" PRIu64 " tokens\n", src, dst, e.fork_tokens);
    }
    return CLI_OK;
}

/* Opens the session name through st, read-write with its model or
 * read-only. */
static int open_session(ctxs_session **out, ctxs_store *st, const char *name, int writable)
{
    ctxs_open_options o = CTXS_OPEN_OPTIONS_INIT;
    o.background = 0; /* a command's handle attends to nothing */
    if (!writable)
        return ctxs_store_session_open(out, st, name, NULL, CTXS_RDONLY, &o);
    ctxs_session_entry e;
    ctxs_model_entry m;
    int rc;
    if ((rc = ctxs_store_session_get(&e, st, name)) < 0 ||
        (rc = ctxs_model_get(&m, st, e.model_hash)) < 0)
        return rc;
    return ctxs_store_session_open(out, st, name, &m.model, 0, &o);
}

static int checkpoint_ls(cli *c, ctxs_store *st, const char *session)
{
    ctxs_checkpoint_entry *cps = NULL;
    size_t n = 0;
    ctxs_session *s = NULL;
    int rc = open_session(&s, st, session, 0);
    if (rc == 0)
        rc = ctxs_checkpoint_list(&cps, &n, s);
    ctxs_session_close(s);
    if (rc < 0)
        return cli_fail(rc, "checkpoints of '%s'", session);
    if (c->json) {
        json j;
        json_init(&j, stdout);
        json_array_begin(&j);
        for (size_t i = 0; i < n; i++) {
            json_object_begin(&j);
            json_kv_string(&j, "name", cps[i].name);
            json_kv_u64(&j, "n_tokens", cps[i].n_tokens);
            json_kv_u64(&j, "created_unix_ms", cps[i].created_unix_ms);
            json_kv_bool(&j, "stale", cps[i].stale);
            json_object_end(&j);
        }
        json_array_end(&j);
        json_finish(&j);
    } else {
        printf("%-24s %10s  %-20s %s\n", "NAME", "TOKENS", "CREATED", "STATE");
        for (size_t i = 0; i < n; i++) {
            char t[32];
            printf("%-24s %10" PRIu64 "  %-20s %s\n", cps[i].name, cps[i].n_tokens,
                   fmt_time(t, cps[i].created_unix_ms), cps[i].stale ? "stale" : "ok");
        }
    }
    ctxs_free(cps);
    return CLI_OK;
}

/* What checkpoint create, restore or rm did, said. */
static void checkpoint_print(const cli *c, const char *verb, const char *session,
                             const ctxs_checkpoint_entry *cp, uint64_t before)
{
    int restore = strcmp(verb, "restore") == 0;
    if (c->json) {
        json j;
        json_init(&j, stdout);
        json_object_begin(&j);
        json_kv_string(&j, "session", session);
        json_kv_string(&j, "checkpoint", cp->name);
        json_kv_string(&j, "action", strcmp(verb, "create") == 0 ? "created"
                                     : restore                  ? "restored"
                                                                : "removed");
        json_kv_u64(&j, "n_tokens", cp->n_tokens);
        if (restore)
            json_kv_u64(&j, "n_tokens_before", before);
        json_object_end(&j);
        json_finish(&j);
    } else if (restore) {
        printf("restored '%s' to checkpoint '%s': %" PRIu64 " -> %" PRIu64 " tokens\n", session,
               cp->name, before, cp->n_tokens);
    } else {
        printf("%s checkpoint '%s' of '%s' at %" PRIu64 " tokens\n",
               verb[0] == 'c' ? "created" : "removed", cp->name, session, cp->n_tokens);
    }
}

/* checkpoint create, restore or rm. Returns an exit code. */
static int checkpoint_change(const cli *c, ctxs_store *st, const char *verb, const char *session,
                             const char *name)
{
    ctxs_checkpoint_entry cp;
    uint64_t before = 0;
    int restore = strcmp(verb, "restore") == 0;
    ctxs_session *s = NULL;
    ctxs_session_info info;
    int rc = open_session(&s, st, session, restore);
    if (rc == 0 && strcmp(verb, "rm") == 0) {
        /* Looked up first, for what it named. */
        if ((rc = checkpoint_get(&cp, st, s, name)) == 0)
            rc = ctxs_checkpoint_delete(s, name);
    } else if (rc == 0 && restore) {
        if ((rc = checkpoint_get(&cp, st, s, name)) == 0 &&
            (rc = ctxs_session_get_info(&info, s)) == 0) {
            before = info.n_tokens;
            rc = ctxs_checkpoint_restore(s, name);
        }
    } else if (rc == 0 && (rc = ctxs_checkpoint_create(s, name)) == 0) {
        rc = checkpoint_get(&cp, st, s, name);
    }
    /* Said before the close, which would clear the reason. */
    int ex = rc < 0 ? checkpoint_fail(rc, st, session, name, NULL) : CLI_OK;
    ctxs_session_close(s);
    if (rc < 0)
        return ex;
    checkpoint_print(c, verb, session, &cp, before);
    return CLI_OK;
}

const cli_command cli_cmd_checkpoint = {
    .name = "checkpoint",
    .run = cmd_checkpoint,
    .summary = "create, list, restore or remove checkpoints",
    .help =
        "checkpoint create SESSION NAME [--json]\n"
        "       ctxstore checkpoint ls SESSION [--json]\n"
        "       ctxstore checkpoint restore SESSION NAME [--json]\n"
        "       ctxstore checkpoint rm SESSION NAME [--json]\n\n"
        "A checkpoint names a session's current token count; restore rolls the\n"
        "session back to it (the session must not be open by a writer).\n",
};

int cmd_checkpoint(cli *c, int argc, char **argv)
{
    int first, ex = cli_parse_common(c, argc, argv, &first);
    if (ex >= 0)
        return ex;
    int nargs = argc - first;
    const char *verb = nargs > 0 ? argv[first] : "";
    int is_ls = strcmp(verb, "ls") == 0;
    if (!is_ls && strcmp(verb, "create") != 0 && strcmp(verb, "restore") != 0 &&
        strcmp(verb, "rm") != 0)
        return cli_usage_error("checkpoint", "checkpoint takes create, ls, restore or rm");
    if (nargs != (is_ls ? 2 : 3))
        return cli_usage_error("checkpoint", "checkpoint %s takes SESSION%s", verb,
                               is_ls ? "" : " NAME");
    const char *session = argv[first + 1], *name = is_ls ? NULL : argv[first + 2];
    if ((ex = cli_check_name("session name", session)) >= 0 ||
        (name && (ex = cli_check_name("checkpoint name", name)) >= 0))
        return ex;
    ctxs_store *st;
    if ((ex = cli_store_open(c, &st, is_ls ? CLI_STORE_READ : CLI_STORE_WRITE)) != CLI_OK)
        return ex;
    ex = is_ls ? checkpoint_ls(c, st, session) : checkpoint_change(c, st, verb, session, name);
    ctxs_store_close(st);
    return ex;
}
