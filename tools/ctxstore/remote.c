/*
 * The remote tier from the command line: remote push NAME..., remote pull
 * NAME [--as LOCAL], remote ls, remote stat, against the Redis server at
 * --remote URL (else $CTXSTORE_REMOTE).
 *
 * The library does the work and the checking (include/ctxstore.h, "Remote
 * tier"); this opens what each verb needs, reports, and keeps one promise
 * of its own: the URL is shown everywhere (messages, hints, JSON) without
 * its password, because error output ends up in logs and bug reports.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

/* How long close waits for the push thread. The CLI opens the remote with
 * push_on_commit off, so the thread has nothing queued: this only bounds a
 * close against a server that stopped answering. */
#define CLOSE_TIMEOUT_MS 2000u

#define URL_HINT                                                               \
    "give redis://[[USER]:PASSWORD@]HOST[:PORT][/DB] or "                      \
    "unix:///PATH/TO/redis.sock[?db=N] with --remote or $CTXSTORE_REMOTE; "    \
    "rediss:// (TLS) is not supported: reach a remote server through a TLS "   \
    "tunnel or a private network"

/* The URL as it may be shown: "redis://user:***@host:6379/0". The user
 * info runs from "://" to the last '@' (a password may hold '@' or '/'),
 * and the password is what follows its first ':'; user info without a ':'
 * is hidden whole, in case a mistyped URL put a password there; without
 * "://", everything before the last '@' (or all of it). */
static void redact_url(char *buf, size_t n, const char *url)
{
    const char *auth = strstr(url, "://");
    if (!auth) {
        /* Not a URL we parse ("redis:/:pw@host"): where a password sits
         * in it is anyone's guess, so everything before the host goes. */
        const char *last = strrchr(url, '@');
        snprintf(buf, n, "***%s", last ? last : "");
        return;
    }
    const char *at = strrchr(auth + 3, '@');
    if (!at) {
        snprintf(buf, n, "%s", url);
        return;
    }
    auth += 3;
    const char *colon = memchr(auth, ':', (size_t)(at - auth));
    if (colon)
        snprintf(buf, n, "%.*s***%s", (int)(colon + 1 - url), url, at);
    else
        snprintf(buf, n, "%.*s***%s", (int)(auth - url), url, at);
}

/* A run of one verb: the options, the store and the remote it opened. */
typedef struct remote_run {
    cli *c;
    const char *verb;
    const char *url;
    char shown[1024]; /* url without its password */
    const char *as;   /* pull --as */
    ctxs_store *st;
    ctxs_remote *r;
    char tmp_store[PATH_MAX]; /* ls and stat without a store: a temporary
                                 one, removed at the end; "" otherwise */
} remote_run;

/* The network's errors and the password's, from ctxs_remote_open(), said
 * with the URL and what to check; returns the exit code. */
static int fail_open(remote_run *rr, int rc)
{
    switch (rc) {
    case CTXS_EINVAL:
        return cli_fail_said(rc, URL_HINT, "remote URL '%s' is not valid", rr->shown);
    case -EACCES:
    case -EPERM:
        cli_fail_said(rc,
                      "check the password (redis://:PASSWORD@HOST, or "
                      "redis://USER:PASSWORD@HOST for a Redis 6 ACL user)",
                      "remote %s refused the password, or wants one: %s", rr->shown,
                      ctxs_strerror(rc));
        return CLI_EREMOTE_DOWN;
    case CTXS_EREMOTE:
        return cli_fail_hint(rc, "check the host and port: is it a Redis (or Valkey) server?",
                             "remote %s answered, but not as Redis does", rr->shown);
    case CTXS_EBUSY:
        return cli_fail(rc, "remote %s", rr->shown);
    default:
        if (cli_is_network_error(rc))
            return cli_fail(rc, "cannot reach remote %s", rr->shown);
        return cli_fail(rc, "connecting to remote %s", rr->shown);
    }
}

/* Whether dir holds a store's index. */
static int has_store(const char *dir)
{
    char path[PATH_MAX];
    struct stat sb;
    return (size_t)snprintf(path, sizeof(path), "%s/index/data.mdb", dir) < sizeof(path) &&
           stat(path, &sb) == 0;
}

/* Opens the store as mode says and connects it to the remote. ls and stat
 * need no local store, but the library reaches Redis through a store
 * handle: where there is none they use an empty one in a temporary
 * directory. Returns an exit code. */
static int remote_begin(remote_run *rr, enum cli_store_mode mode, int store_optional)
{
    int ex;
    if (store_optional && !has_store(rr->c->store_dir)) {
        const char *tmp = getenv("TMPDIR");
        snprintf(rr->tmp_store, sizeof(rr->tmp_store), "%s/ctxstore-remote.XXXXXX",
                 tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(rr->tmp_store)) {
            int rc = -errno;
            rr->tmp_store[0] = '\0';
            return cli_fail(rc, "making a temporary directory");
        }
        int rc = ctxs_store_open(&rr->st, rr->tmp_store, CTXS_STORE_CREATE, NULL);
        if (rc < 0)
            return cli_fail(rc, "making a temporary store in %s", rr->tmp_store);
    } else if ((ex = cli_store_open(rr->c, &rr->st, mode)) != CLI_OK) {
        return ex;
    }
    ctxs_remote_options ro = CTXS_REMOTE_OPTIONS_INIT;
    /* The CLI pushes on its own thread, and only what it is asked to. */
    ro.push_on_commit = 0;
    int rc = ctxs_remote_open(&rr->r, rr->st, rr->url, &ro);
    if (rc < 0)
        return fail_open(rr, rc);
    return CLI_OK;
}

/* Removes the temporary store's files and directories: what a store
 * directory holds, and nothing else. */
static void remove_tmp_store(const char *dir)
{
    static const char *const files[] = { "index/data.mdb", "index/lock.mdb", "index/store.lock" };
    char path[PATH_MAX + 32]; /* dir is a mkdtemp() name below PATH_MAX */
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
        unlink(path);
    }
    snprintf(path, sizeof(path), "%s/index", dir);
    rmdir(path);
    cli_sessions_dir(path, sizeof(path), dir);
    rmdir(path);
    rmdir(dir);
}

static void remote_end(remote_run *rr)
{
    ctxs_remote_close(NULL, rr->r, CLOSE_TIMEOUT_MS);
    rr->r = NULL;
    ctxs_store_close(rr->st);
    rr->st = NULL;
    if (rr->tmp_store[0])
        remove_tmp_store(rr->tmp_store);
}

/* --- push ------------------------------------------------------------------ */

static int remote_push(remote_run *rr, int n, char **names)
{
    cli *c = rr->c;
    int ex;
    for (int i = 0; i < n; i++)
        if ((ex = cli_check_name("session name", names[i])) >= 0)
            return ex;
    if ((ex = remote_begin(rr, CLI_STORE_READ, 0)) != CLI_OK) {
        remote_end(rr);
        return ex;
    }
    json j;
    if (c->json) {
        json_init(&j, stdout);
        json_object_begin(&j);
        json_kv_string(&j, "remote", rr->shown);
        json_key(&j, "pushed");
        json_array_begin(&j);
    }
    ctxs_remote_push_result total = { 0 };
    ex = CLI_OK;
    for (int i = 0; i < n && ex == CLI_OK; i++) {
        char label[300];
        snprintf(label, sizeof(label), "push %s", names[i]);
        progress bar;
        progress_start(&bar, c, label, 0, 0);
        ctxs_remote_push_result res;
        double t0 = cli_now_s();
        ctxs_remote_push_options po = CTXS_REMOTE_PUSH_OPTIONS_INIT;
        po.progress = progress_callback;
        po.progress_arg = &bar;
        int rc = ctxs_remote_push(&res, rr->r, names[i], &po);
        double secs = cli_now_s() - t0;
        progress_end(&bar);
        if (rc < 0) {
            if (rc == CTXS_EEVICTED)
                ex = cli_fail_hint(rc,
                                   "only a session that holds every token from position 0 "
                                   "pushes; its ring has overwritten its first tokens",
                                   "pushing '%s' to %s", names[i], rr->shown);
            else
                ex = cli_fail(rc, "pushing '%s' to %s", names[i], rr->shown);
            break;
        }
        total.n_tokens += res.n_tokens;
        total.chunks_sent += res.chunks_sent;
        total.chunks_present += res.chunks_present;
        total.bytes_sent += res.bytes_sent;
        if (c->json) {
            json_object_begin(&j);
            json_kv_string(&j, "name", names[i]);
            json_kv_u64(&j, "n_tokens", res.n_tokens);
            json_kv_u64(&j, "chunks_sent", res.chunks_sent);
            json_kv_u64(&j, "chunks_present", res.chunks_present);
            json_kv_u64(&j, "bytes_sent", res.bytes_sent);
            json_kv_double(&j, "seconds", secs);
            json_object_end(&j);
        } else {
            char a[32], b[32];
            printf("pushed '%s': %" PRIu64 " tokens, %" PRIu64 " chunks sent, %" PRIu64
                   " already there, %s in %s\n",
                   names[i], res.n_tokens, res.chunks_sent, res.chunks_present,
                   fmt_size(a, res.bytes_sent), fmt_duration(b, secs));
        }
    }
    if (c->json) {
        json_array_end(&j);
        json_kv_u64(&j, "chunks_sent", total.chunks_sent);
        json_kv_u64(&j, "chunks_present", total.chunks_present);
        json_kv_u64(&j, "bytes_sent", total.bytes_sent);
        json_error(&j);
        json_object_end(&j);
        json_finish(&j);
    } else if (n > 1 && ex == CLI_OK) {
        char a[32];
        printf("total: %" PRIu64 " chunks sent, %" PRIu64 " already there, %s to %s\n",
               total.chunks_sent, total.chunks_present, fmt_size(a, total.bytes_sent), rr->shown);
    }
    remote_end(rr);
    return ex;
}

/* --- pull ------------------------------------------------------------------ */

/* Why a pull stopped short, in words, or NULL when it did not. */
static const char *stop_reason(const ctxs_remote_pull_result *res)
{
    if (res->chunks_missing)
        return "missing";
    if (res->chunks_refused)
        return "refused";
    return res->n_tokens < res->remote_tokens ? "short" : NULL;
}

static int remote_pull(remote_run *rr, const char *name)
{
    cli *c = rr->c;
    const char *local = rr->as ? rr->as : name;
    int ex;
    if ((ex = cli_check_name("session name", name)) >= 0 ||
        (rr->as && (ex = cli_check_name("session name", rr->as)) >= 0))
        return ex;
    if ((ex = remote_begin(rr, CLI_STORE_CREATE, 0)) != CLI_OK) {
        remote_end(rr);
        cli_store_made(c, 0);
        return ex;
    }
    progress bar;
    char label[300];
    snprintf(label, sizeof(label), "pull %s", name);
    progress_start(&bar, c, label, 0, 0);
    ctxs_remote_pull_result res;
    memset(&res, 0, sizeof(res));
    double t0 = cli_now_s();
    ctxs_remote_pull_options po = CTXS_REMOTE_PULL_OPTIONS_INIT;
    po.progress = progress_callback;
    po.progress_arg = &bar;
    int rc = ctxs_remote_pull(NULL, &res, rr->r, name, local, NULL, &po);
    double secs = cli_now_s() - t0;
    progress_end(&bar);
    remote_end(rr);
    cli_store_made(c, rc == 0);
    if (rc < 0) {
        ctxs_free(res.rest_ids);
        if (rc == CTXS_ENOTFOUND)
            return cli_fail_hint(rc, "`ctxstore remote ls` lists the remote sessions",
                                 "remote session '%s' on %s", name, rr->shown);
        if (rc == CTXS_ETAKEN)
            return cli_fail_hint(rc,
                                 "a local session has that name; pull it under another with "
                                 "--as LOCAL, or remove it with `ctxstore rm`",
                                 "pulling '%s' from %s as '%s'", name, rr->shown, local);
        if (rc == CTXS_EREMOTE)
            return cli_fail_hint(rc,
                                 "the remote record is damaged or the server refused a "
                                 "command; push the session again from a machine that has it",
                                 "pulling '%s' from %s", name, rr->shown);
        return cli_fail(rc, "pulling '%s' from %s", name, rr->shown);
    }
    const char *stopped = stop_reason(&res);
    char hex[33];
    if (c->json) {
        json j;
        json_init(&j, stdout);
        json_object_begin(&j);
        json_kv_string(&j, "remote", rr->shown);
        json_kv_string(&j, "name", name);
        json_kv_string(&j, "local", local);
        json_kv_string(&j, "model_hash", fmt_hash(hex, res.model.model_hash));
        json_kv_u64(&j, "n_tokens", res.n_tokens);
        json_kv_u64(&j, "remote_tokens", res.remote_tokens);
        json_kv_u64(&j, "chunks_pulled", res.chunks_pulled);
        json_kv_u64(&j, "to_prefill", res.n_rest);
        json_key(&j, "stopped");
        if (stopped)
            json_string(&j, stopped);
        else
            json_null(&j);
        json_key(&j, "rest_ids");
        json_array_begin(&j);
        for (uint64_t i = 0; i < res.n_rest && res.rest_ids; i++)
            json_u64(&j, res.rest_ids[i]);
        json_array_end(&j);
        json_kv_double(&j, "seconds", secs);
        json_object_end(&j);
        json_finish(&j);
    } else {
        char a[32];
        printf("pulled '%s' as '%s': %" PRIu64 " of %" PRIu64 " tokens (%" PRIu64
               " chunks) in %s\n",
               name, local, res.n_tokens, res.remote_tokens, res.chunks_pulled,
               fmt_duration(a, secs));
        if (stopped) {
            const char *why =
                res.chunks_missing   ? "the next chunk is not in Redis (evicted): a miss"
                : res.chunks_refused ? "the next chunk did not verify and was refused"
                                     : "the rest is not in Redis";
            printf("stopped at token %" PRIu64 ": %s; %" PRIu64 " tokens left to prefill\n",
                   res.n_tokens, why, res.n_rest);
        }
    }
    ctxs_free(res.rest_ids);
    return CLI_OK;
}

/* --- ls -------------------------------------------------------------------- */

static int remote_ls(remote_run *rr)
{
    cli *c = rr->c;
    int ex = remote_begin(rr, CLI_STORE_READ, 1);
    if (ex != CLI_OK) {
        remote_end(rr);
        return ex;
    }
    ctxs_remote_entry *e = NULL;
    size_t n = 0;
    int rc = ctxs_remote_list(&e, &n, rr->r);
    if (rc < 0) {
        remote_end(rr);
        return cli_fail(rc, "listing the sessions of %s", rr->shown);
    }
    char model[CTXS_NAME_MAX + 1], hex[33], when[32];
    if (c->json) {
        json j;
        json_init(&j, stdout);
        json_object_begin(&j);
        json_kv_string(&j, "remote", rr->shown);
        json_key(&j, "sessions");
        json_array_begin(&j);
        for (size_t i = 0; i < n; i++) {
            json_object_begin(&j);
            json_kv_string(&j, "name", e[i].name);
            json_kv_string(&j, "model_hash", fmt_hash(hex, e[i].model_hash));
            json_kv_string(&j, "model", cli_model_name(model, rr->st, e[i].model_hash));
            json_kv_u64(&j, "n_tokens", e[i].n_tokens);
            json_kv_bool(&j, "tail_pushed", e[i].tail_pushed != 0);
            json_kv_u64(&j, "updated_unix_ms", e[i].updated_unix_ms);
            json_key(&j, "error");
            if (e[i].status)
                json_string(&j, ctxs_err_name(e[i].status));
            else
                json_null(&j);
            json_object_end(&j);
        }
        json_array_end(&j);
        json_object_end(&j);
        json_finish(&j);
    } else if (n == 0) {
        printf("no sessions on %s\n", rr->shown);
    } else {
        printf("%-24s %-16s %8s  %-4s  %s\n", "NAME", "MODEL", "TOKENS", "TAIL", "UPDATED");
        for (size_t i = 0; i < n; i++) {
            if (e[i].status) {
                printf("%-24s %-16s %8s  %-4s  damaged record (%s)\n", e[i].name, "-", "-", "-",
                       ctxs_err_name(e[i].status));
                continue;
            }
            printf("%-24s %-16s %8" PRIu64 "  %-4s  %s\n", e[i].name,
                   cli_model_name(model, rr->st, e[i].model_hash), e[i].n_tokens,
                   e[i].tail_pushed ? "yes" : "no", fmt_age(when, e[i].updated_unix_ms));
        }
    }
    ctxs_free(e);
    remote_end(rr);
    return CLI_OK;
}

/* --- stat ------------------------------------------------------------------ */

static int remote_stat(remote_run *rr)
{
    cli *c = rr->c;
    int ex = remote_begin(rr, CLI_STORE_READ, 1);
    if (ex != CLI_OK) {
        remote_end(rr);
        return ex;
    }
    ctxs_remote_info info;
    int rc = ctxs_remote_get_info(&info, rr->r);
    remote_end(rr);
    if (rc < 0)
        return cli_fail(rc, "asking %s about itself", rr->shown);
    /* What a fleet's operator should know: without a limit Redis grows
     * until the machine runs out; with noeviction a full Redis refuses
     * pushes where an LRU policy would make room (a pull that misses an
     * evicted chunk prefills the rest). */
    const char *advice = NULL;
    if (info.maxmemory == 0)
        advice = "no maxmemory: Redis grows until the machine runs out; set maxmemory and "
                 "maxmemory-policy allkeys-lru";
    else if (strncmp(info.maxmemory_policy, "allkeys-", 8) != 0)
        advice = "pushes fail once Redis is full under this policy; allkeys-lru evicts old "
                 "chunks instead (a pull that misses one prefills the rest)";
    if (c->json) {
        json j;
        json_init(&j, stdout);
        json_object_begin(&j);
        json_kv_string(&j, "remote", rr->shown);
        json_kv_string(&j, "server_version", info.server_version);
        json_kv_u64(&j, "used_memory", info.used_memory);
        json_kv_u64(&j, "maxmemory", info.maxmemory);
        json_kv_string(&j, "maxmemory_policy", info.maxmemory_policy);
        json_kv_u64(&j, "evicted_keys", info.evicted_keys);
        json_kv_u64(&j, "keys", info.keys);
        json_key(&j, "advice");
        if (advice)
            json_string(&j, advice);
        else
            json_null(&j);
        json_object_end(&j);
        json_finish(&j);
    } else {
        char a[32], b[32];
        printf("remote        %s\n", rr->shown);
        printf("server        Redis %s\n", info.server_version);
        printf("memory        %s used of %s\n", fmt_size(a, info.used_memory),
               info.maxmemory ? fmt_size(b, info.maxmemory) : "no limit");
        printf("policy        %s\n", info.maxmemory_policy);
        printf("evicted keys  %" PRIu64 "\n", info.evicted_keys);
        printf("keys          %" PRIu64 "\n", info.keys);
        if (advice)
            printf("note: %s\n", advice);
    }
    return CLI_OK;
}

const cli_command cli_cmd_remote = {
    .name = "remote",
    .run = cmd_remote,
    .summary = "push sessions to Redis, pull them back, list them",
    .help =
        "remote push SESSION... [--remote URL] [--json]\n"
        "       ctxstore remote pull SESSION [--as LOCAL] [--remote URL] [--json]\n"
        "       ctxstore remote ls [--remote URL] [--json]\n"
        "       ctxstore remote stat [--remote URL] [--json]\n\n"
        "The remote tier: a Redis server that the machines of a fleet share, so\n"
        "that a conversation saved on one resumes on another. URL is\n"
        "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB] or\n"
        "unix:///PATH/TO/redis.sock[?db=N]; without --remote, $CTXSTORE_REMOTE.\n"
        "Messages show it without its password.\n\n"
        "push sends each session's chunks of 64 tokens that Redis lacks (chunks\n"
        "are keyed by their content: shared prefixes are stored once), its last\n"
        "partial chunk and its record, and says how many chunks it sent, how many\n"
        "were there already and the bytes. It only reads the store. A ring that\n"
        "has overwritten its first tokens is refused (exit 5).\n\n"
        "pull creates the local session LOCAL (default: SESSION) from the remote\n"
        "one, every chunk verified before it is written. Redis may have evicted\n"
        "a chunk: the pull then stops there, and says how many tokens it pulled\n"
        "and how many are left to prefill (in JSON, their ids). It makes the\n"
        "store if there is none.\n\n"
        "ls lists the remote sessions: model, tokens, whether the partial last\n"
        "chunk is there, when pushed. stat shows the server: version, memory used\n"
        "and maxmemory, eviction policy, keys evicted, keys held. Neither needs\n"
        "a local store.\n",
};

/* --- The command ------------------------------------------------------------ */

int cmd_remote(cli *c, int argc, char **argv)
{
    static const struct option longopts[] = {
        CLI_COMMON_LONGOPTS,
        { "remote", required_argument, NULL, 'r' },
        { "as", required_argument, NULL, 'a' },
        { NULL, 0, NULL, 0 },
    };
    remote_run rr;
    memset(&rr, 0, sizeof(rr));
    rr.c = c;
    int opt, ex;
    while ((opt = cli_getopt(c, argc, argv, "h", longopts, &ex)) > 0) {
        if (opt == 'r')
            rr.url = optarg;
        else /* 'a' */
            rr.as = optarg;
    }
    if (opt == CLI_GETOPT_EXIT)
        return ex;
    int nargs = argc - optind;
    char **args = argv + optind;
    rr.verb = nargs > 0 ? args[0] : "";
    int push = !strcmp(rr.verb, "push"), pull = !strcmp(rr.verb, "pull");
    int ls = !strcmp(rr.verb, "ls"), stat_ = !strcmp(rr.verb, "stat");
    if (!push && !pull && !ls && !stat_)
        return cli_usage_error("remote", "remote takes push, pull, ls or stat");
    if (push && nargs < 2)
        return cli_usage_error("remote", "remote push takes one or more session names");
    if (pull && nargs != 2)
        return cli_usage_error("remote", "remote pull takes one session name");
    if ((ls || stat_) && nargs != 1)
        return cli_usage_error("remote", "remote %s takes no arguments", rr.verb);
    if (rr.as && !pull)
        return cli_usage_error("remote", "--as goes with remote pull");
    if (!rr.url) {
        const char *env = getenv("CTXSTORE_REMOTE");
        rr.url = env && *env ? env : NULL;
    }
    if (!rr.url)
        return cli_usage_error("remote", "no remote: give --remote URL or set $CTXSTORE_REMOTE");
    redact_url(rr.shown, sizeof(rr.shown), rr.url);
    if (push)
        return remote_push(&rr, nargs - 1, args + 1);
    if (pull)
        return remote_pull(&rr, args[1]);
    if (ls)
        return remote_ls(&rr);
    return remote_stat(&rr);
}
