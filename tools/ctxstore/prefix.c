/*
 * ctxstore prefix: which session already holds the start of a prompt, so
 * that an app forks it at that many tokens and prefills only the rest. The
 * prompt is its token ids, in decimal, separated by whitespace: in the
 * arguments (one may hold several, as "$(cat ids)" gives them) or in a
 * file, - for standard input.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

/* A token file larger than this is not a prompt (and /dev/zero is not one
 * either). */
#define MAX_TOKEN_TEXT (256u << 20)

#define TOKEN_RULE "a token id is a decimal number below 2^32; ids are separated by whitespace"

typedef struct tokens {
    uint32_t *v;
    size_t n, cap;
} tokens;

static int tokens_push(tokens *t, uint32_t id)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 256;
        uint32_t *v = realloc(t->v, cap * sizeof(*v));
        if (!v)
            return CTXS_ENOMEM;
        t->v = v, t->cap = cap;
    }
    t->v[t->n++] = id;
    return 0;
}

static int is_space(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f';
}

/* Appends the ids in text[0..len) to t. Returns 0; CTXS_EINVAL with the
 * word that is no id in *bad (*bad_len bytes); CTXS_ENOMEM. */
static int tokens_parse(tokens *t, const char *text, size_t len, const char **bad,
                        size_t *bad_len)
{
    size_t i = 0;
    while (i < len) {
        if (is_space(text[i])) {
            i++;
            continue;
        }
        size_t start = i;
        uint64_t v = 0;
        int ok = 1;
        for (; i < len && !is_space(text[i]); i++) {
            if (text[i] < '0' || text[i] > '9' || v > UINT32_MAX)
                ok = 0;
            else
                v = v * 10 + (uint64_t)(text[i] - '0');
        }
        if (!ok || v > UINT32_MAX) {
            *bad = text + start, *bad_len = i - start;
            return CTXS_EINVAL;
        }
        int rc = tokens_push(t, (uint32_t)v);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Reads all of fd into *out (malloc'ed). Returns its length or -errno. */
static ssize_t read_all(int fd, char **out)
{
    size_t len = 0, cap = 0;
    char *buf = NULL;
    for (;;) {
        if (len == cap) {
            char *b = cap >= MAX_TOKEN_TEXT ? NULL : realloc(buf, cap ? cap * 2 : 65536);
            if (!b) {
                free(buf);
                return cap >= MAX_TOKEN_TEXT ? -EFBIG : CTXS_ENOMEM;
            }
            buf = b, cap = cap ? cap * 2 : 65536;
        }
        ssize_t got = read(fd, buf + len, cap - len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            int e = errno;
            free(buf);
            return -e;
        }
        if (got == 0)
            break;
        len += (size_t)got;
    }
    *out = buf;
    return (ssize_t)len;
}

/* Reads the ids in the file at path ("-": standard input) into t. Returns
 * an exit code (reported). */
static int tokens_read_file(tokens *t, const char *path)
{
    int is_stdin = strcmp(path, "-") == 0;
    const char *what = is_stdin ? "- (standard input)" : path;
    int fd = is_stdin ? STDIN_FILENO : open(path, O_RDONLY | O_CLOEXEC);
    int rc = fd < 0 ? -errno : 0;
    if (rc < 0)
        return cli_fail_hint(rc, rc == -ENOENT ? "check the path" : NULL, "token file %s", what);
    char *text = NULL;
    ssize_t len = read_all(fd, &text);
    if (!is_stdin)
        close(fd);
    if (len < 0)
        return cli_fail_hint((int)len, len == -EFBIG ? "a prompt's token ids take less than 256 MiB" : NULL,
                             "token file %s", what);
    const char *bad = NULL;
    size_t bad_len = 0;
    rc = tokens_parse(t, text, (size_t)len, &bad, &bad_len);
    int ex = CLI_OK;
    if (rc == CTXS_EINVAL)
        ex = cli_fail_hint(rc, TOKEN_RULE, "token file %s: '%.*s' is no token id", what,
                           bad_len > 40 ? 40 : (int)bad_len, bad);
    else if (rc < 0)
        ex = cli_fail(rc, "token file %s", what);
    free(text);
    return ex;
}

int cli_model_resolve(uint8_t out[CTXS_HASH_BYTES], ctxs_store *st, const char *arg)
{
    static const char *const lists = "`ctxstore models` lists the models";
    ctxs_model_entry e, *list = NULL;
    size_t n = 0, found = 0;
    if (parse_hash(arg, out) == 0) {
        int rc = ctxs_model_get(&e, st, out);
        return rc < 0 ? cli_fail_hint(rc, lists, "model %s", arg) : CLI_OK;
    }
    int rc = ctxs_model_list(&list, &n, st);
    if (rc < 0)
        return cli_fail(rc, "model '%s'", arg);
    for (size_t i = 0; i < n; i++)
        if (strcmp(list[i].name, arg) == 0 && found++ == 0)
            memcpy(out, list[i].model.model_hash, CTXS_HASH_BYTES);
    ctxs_free(list);
    if (found == 0)
        return cli_fail_hint(CTXS_ENOTFOUND,
                             "--model takes a model's name or its 32-digit hash, as "
                             "`ctxstore models` lists them",
                             "model '%s'", arg);
    if (found > 1)
        return cli_fail_hint(CTXS_EINVAL, "models of that name differ in their hash; give the "
                                          "hash (`ctxstore models` lists them)",
                             "model '%s' names %zu models", arg, found);
    return CLI_OK;
}

static void prefix_print(const cli *c, const ctxs_prefix_match *m, size_t n_prompt,
                         const uint8_t hash[CTXS_HASH_BYTES])
{
    if (c->json) {
        json j;
        json_init(&j, stdout);
        json_object_begin(&j);
        json_kv_string(&j, "session", m->session);
        json_kv_u64(&j, "n_tokens", m->n_tokens);
        json_kv_u64(&j, "prompt_tokens", n_prompt);
        json_key(&j, "model_hash");
        json_hex(&j, hash, CTXS_HASH_BYTES);
        json_object_end(&j);
        json_finish(&j);
    } else {
        printf("'%s' holds the first %" PRIu64 " of the %zu tokens\n", m->session, m->n_tokens,
               n_prompt);
    }
}

/* Finds and prints the match of t for the model arg. Returns an exit
 * code. */
static int prefix_find(const cli *c, ctxs_store *st, const char *model, const tokens *t)
{
    uint8_t hash[CTXS_HASH_BYTES];
    int ex = cli_model_resolve(hash, st, model);
    if (ex != CLI_OK)
        return ex;
    ctxs_prefix_match m;
    int rc = ctxs_prefix_find(&m, st, hash, t->v, t->n);
    if (rc == CTXS_ENOTFOUND) {
        char hint[256];
        if (t->n < CTXS_PREFIX_CHUNK)
            snprintf(hint, sizeof(hint), "prefixes match in whole chunks of %u tokens; there %s only %zu",
                     CTXS_PREFIX_CHUNK, t->n == 1 ? "is" : "are", t->n);
        else
            snprintf(hint, sizeof(hint), "no session of the model holds the first %u of them; a "
                     "session's prefixes are indexed every %u tokens and when it is closed",
                     CTXS_PREFIX_CHUNK, 16 * CTXS_PREFIX_CHUNK);
        return cli_fail_hint(rc, hint, "a session of model '%s' holding the start of these %zu tokens",
                             model, t->n);
    }
    if (rc < 0)
        return cli_fail(rc, "looking for a prefix of %zu tokens", t->n);
    prefix_print(c, &m, t->n, hash);
    return CLI_OK;
}

/* Parses the options into *model and *file. Returns -1 with *first set, or
 * an exit code. */
static int prefix_parse(cli *c, int argc, char **argv, const char **model, const char **file,
                        int *first)
{
    static const struct option longopts[] = {
        CLI_COMMON_LONGOPTS,
        { "model", required_argument, NULL, 'm' },
        { "tokens-file", required_argument, NULL, 'f' },
        { NULL, 0, NULL, 0 },
    };
    int opt, ex;
    while ((opt = cli_getopt(c, argc, argv, "h", longopts, &ex)) > 0) {
        if (opt == 'm')
            *model = optarg;
        else /* 'f' */
            *file = optarg;
    }
    if (opt == CLI_GETOPT_EXIT)
        return ex;
    *first = optind;
    if (!*model)
        return cli_usage_error("prefix", "prefix needs --model MODEL");
    if (*file && optind < argc)
        return cli_usage_error("prefix", "prefix takes token ids or --tokens-file, not both");
    return -1;
}

/* The token ids in the arguments from first on, into t. Returns -1, or an
 * exit code. */
static int tokens_from_args(tokens *t, int argc, char **argv, int first)
{
    for (int i = first; i < argc; i++) {
        const char *bad = NULL;
        size_t bad_len = 0;
        int rc = tokens_parse(t, argv[i], strlen(argv[i]), &bad, &bad_len);
        if (rc == CTXS_EINVAL)
            return cli_usage_error("prefix", "'%.*s' is no token id: " TOKEN_RULE,
                                   bad_len > 40 ? 40 : (int)bad_len, bad);
        if (rc < 0)
            return cli_fail(rc, "prefix");
    }
    return -1;
}

const cli_command cli_cmd_prefix = {
    .name = "prefix",
    .run = cmd_prefix,
    .summary = "find the session holding a prompt's first tokens",
    .help =
        "prefix --model MODEL TOKEN... [--json]\n"
        "       ctxstore prefix --model MODEL --tokens-file FILE [--json]\n\n"
        "Finds the session of MODEL (a name or a 32-digit hash, as `models`\n"
        "lists them) that holds the longest start of a prompt, and prints it\n"
        "with how many of the prompt's tokens it holds: fork it there (`ctxstore\n"
        "fork SESSION NEW --at N`) and prefill only the rest. The prompt is its\n"
        "token ids in decimal, separated by whitespace, in the arguments (one may\n"
        "hold several) or in FILE (- for standard input). Prefixes match in whole\n"
        "chunks of 64 tokens and are indexed every 1024 tokens a session commits\n"
        "and when it is closed. Exits 3 when no session holds the first 64.\n",
};

int cmd_prefix(cli *c, int argc, char **argv)
{
    const char *model = NULL, *file = NULL;
    int first = 0, ex = prefix_parse(c, argc, argv, &model, &file, &first);
    if (ex >= 0)
        return ex;
    uint8_t hash[CTXS_HASH_BYTES];
    if (parse_hash(model, hash) != 0 && (ex = cli_check_name("model name", model)) >= 0)
        return ex;
    tokens t = { 0 };
    /* The prompt is read before the store is opened: a command line or a
     * file that is wrong leaves no store behind. */
    if (file)
        ex = tokens_read_file(&t, file);
    else if ((ex = tokens_from_args(&t, argc, argv, first)) < 0)
        ex = CLI_OK;
    if (ex == CLI_OK && t.n == 0)
        ex = file ? cli_fail_hint(CTXS_EINVAL, TOKEN_RULE, "token file %s: no token ids",
                                  strcmp(file, "-") == 0 ? "- (standard input)" : file)
                  : cli_usage_error("prefix", "prefix takes the prompt's token ids");
    ctxs_store *st;
    if (ex == CLI_OK && (ex = cli_store_open(c, &st, CLI_STORE_READ)) == CLI_OK) {
        ex = prefix_find(c, st, model, &t);
        ctxs_store_close(st);
    }
    free(t.v);
    return ex;
}
