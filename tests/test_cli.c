/*
 * The ctxstore tool, run as a real binary ($CTXSTORE_BIN) on real stores:
 * every subcommand, damaged sessions that verify must find and name,
 * hostile export files that import must refuse without touching the store,
 * names that must never become paths, and every --json output parsed back
 * (json_check.c) and compared with what the test made.
 *
 * Each test builds its stores in-process with the library (small sessions:
 * 2 layers x 2 KV heads x 16 dims), closes what the binary must find
 * closed, and runs the binary with $CTXSTORE_DIR pointing at the store.
 * Tests check exit codes, output and files; never durations.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ctxstore.h"
#include "format.h"
#include "index.h"
#include "cli_run.h"
#include "json_check.h"
#include "support.h"

TestSuite(cli, .init = ts_scratch_init, .fini = ts_scratch_fini, .timeout = 120);

static const char *const k_commands[] = {
    "ls", "info", "verify", "compact", "gc", "rm", "rename", "fork",
    "checkpoint", "meta", "models", "prefix", "reindex", "export", "import", "bench", "demo", "create",
    "pin", "unpin", "remote", "grow",
};
enum { N_COMMANDS = sizeof(k_commands) / sizeof(k_commands[0]) };

/* --- Running the binary ----------------------------------------------------- */

/* What the last run left: its exit code, stdout and stderr (NUL-terminated;
 * the next run replaces them). */
static cli_result R;
/* 1: the next runs drop to an unprivileged user (ts_drop_privileges()). */
static int run_unprivileged;

/* Another binary to run instead of $CTXSTORE_BIN (a copy of it), or
 * NULL. */
static const char *bin_override;

/* Runs the binary (cli_run()) on store, with env's changes to the
 * environment; fills R and returns the exit code. */
static int run_env(const char *store, const char *const *env, const char *const *args)
{
    return cli_run(&R, bin_override ? bin_override : cli_bin(), store, env, args,
                   run_unprivileged);
}

#define ARGS(...) ((const char *const[]){ __VA_ARGS__, NULL })
/* Runs the binary on store with the arguments that follow. */
#define CLI(store, ...) run_env((store), NULL, ARGS(__VA_ARGS__))
/* As CLI, and fails the test unless it exits with code. */
#define CLI_EXPECT(code, store, ...) cli_expect_exit(&R, CLI((store), __VA_ARGS__), (code))

/* Asserts that the last run's stdout (out = 1) or stderr contains s. */
#define contains(out, s) cli_contains(&R, (out), (s))

/* As contains(), but marks the test failed and goes on. */
static void says(int out, const char *s)
{
    const char *text = out ? R.out : R.err;
    cr_expect(strstr(text, s) != NULL, "`%s`: %s does not say \"%s\". It says:\n%s", R.what,
              out ? "stdout" : "stderr", s, text);
}

/* The last run's stdout parsed as JSON (release with jc_free()), and
 * checked accessors into it: each fails the test, naming the path, when
 * the value is absent or of another kind (cli_run.h). */
#define json_out() cli_json(&R)
#define jget(v, path) cli_jget(&R, (v), (path))
#define ju(v, path) cli_ju(&R, (v), (path))
#define js(v, path) cli_js(&R, (v), (path))

static int jb(const jc_value *v, const char *path)
{
    int b = jc_bool(jget(v, path));
    cr_assert_geq(b, 0, "`%s`: \"%s\" is not a boolean:\n%s", R.what, path, R.out);
    return b;
}

static double jd(const jc_value *v, const char *path)
{
    const jc_value *x = jget(v, path);
    cr_assert_eq(x->type, JC_NUMBER, "`%s`: \"%s\" is not a number:\n%s", R.what, path, R.out);
    return x->number;
}

/* The object of the array arr whose "name" is name, or NULL. */
static const jc_value *by_name(const jc_value *arr, const char *name)
{
    cr_assert(arr && arr->type == JC_ARRAY, "`%s`: not an array:\n%s", R.what, R.out);
    for (size_t i = 0; i < arr->n; i++) {
        const char *s = jc_str(jc_get(&arr->items[i], "name"));
        if (s && strcmp(s, name) == 0)
            return &arr->items[i];
    }
    return NULL;
}

static const jc_value *must_by_name(const jc_value *arr, const char *name)
{
    const jc_value *v = by_name(arr, name);
    cr_assert_not_null(v, "`%s`: no entry named \"%s\":\n%s", R.what, name, R.out);
    return v;
}

/* The line of the last run's stdout that contains key, copied into line. */
static void line_with(char *line, size_t n, const char *key)
{
    const char *p = strstr(R.out, key);
    cr_assert_not_null(p, "`%s`: no line with \"%s\":\n%s", R.what, key, R.out);
    const char *b = p, *e = strchr(p, '\n');
    while (b > R.out && b[-1] != '\n')
        b--;
    size_t len = e ? (size_t)(e - b) : strlen(b);
    if (len >= n)
        len = n - 1;
    memcpy(line, b, len);
    line[len] = '\0';
}

/* How many times s occurs in text. */
static int count_of(const char *text, const char *s)
{
    int n = 0;
    for (const char *p = strstr(text, s); p; p = strstr(p + 1, s))
        n++;
    return n;
}

/* The last run's stdout as the JSON error object --json promises on a
 * failure: exactly one document (json_out() refuses anything after it)
 * whose "error" has the code and name, a message and a hint (a string or
 * null). stderr still says the message to a person. Returns the
 * document. */
static jc_value *json_error_out(int code, const char *name)
{
    jc_value *v = json_out();
    const jc_value *e = jget(v, "error");
    cr_assert_eq(e->type, JC_OBJECT, "`%s`: \"error\" is not an object:\n%s", R.what, R.out);
    const jc_value *c = jget(e, "code");
    cr_assert(c->type == JC_NUMBER && c->is_int && c->i64 == code,
              "`%s`: the error code is not %d:\n%s", R.what, code, R.out);
    cr_assert_str_eq(js(e, "name"), name, "`%s`:\n%s", R.what, R.out);
    cr_assert_gt(strlen(js(e, "message")), 0, "`%s`: an empty message:\n%s", R.what, R.out);
    const jc_value *h = jget(e, "hint");
    cr_assert(h->type == JC_STRING || h->type == JC_NULL, "`%s`: the hint is a %s:\n%s",
              R.what, jc_type_name(h->type), R.out);
    /* Up to the first byte that is not ASCII: JSON carries U+FFFD where
     * the user typed bytes that are not UTF-8, and stderr the bytes. */
    char said[512];
    snprintf(said, sizeof(said), "ctxstore: %s", js(e, "message"));
    for (char *p = said; *p; p++)
        if ((unsigned char)*p >= 0x80)
            *p = '\0', p--;
    contains(0, said);
    return v;
}

/* The hint of an error document, or "" when it is null. */
static const char *hint_of(const jc_value *v)
{
    const char *h = jc_str(jc_path(v, "error.hint"));
    return h ? h : "";
}

/* --- Stores built in-process --------------------------------------------------- */

/* "<scratch>/name", in a static buffer that rotates over 32 entries: more
 * than any test keeps at once. */
static const char *dir_of(const char *name)
{
    static char bufs[32][1024];
    static unsigned next;
    char *b = bufs[next++ % 32];
    snprintf(b, sizeof(bufs[0]), "%s/%s", ts_scratch, name);
    return b;
}

/* The store most tests use (ts_store_dir()), short: most command lines
 * name it. */
static const char *S(void)
{
    return ts_store_dir();
}

/* ts_model with 16 dims a head: 2 layers x 2 KV heads x 16, fp16. */
static ctxs_model model(void)
{
    ctxs_model m = ts_model(7);
    m.geometry.head_dim = 16;
    return m;
}

#define MODEL_NAME "tiny-test"

static void register_model(ctxs_store *st)
{
    ctxs_model m = model();
    int rc = ctxs_model_register(st, &m, MODEL_NAME);
    cr_assert_eq(rc, 0, "ctxs_model_register: %s", ctxs_err_name(rc));
}

/* Creates name with n tokens (ts_append contents); returns it open. */
static ctxs_session *mk_open(ctxs_store *st, const char *name, uint32_t capacity, int ring,
                             uint64_t n)
{
    ctxs_model m = model();
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = capacity;
    o.n_sink = 4;
    o.ring = (uint32_t)ring;
    o.open.durability = CTXS_SYNC_NONE;
    ctxs_session *s = NULL;
    int rc = ctxs_store_session_create(&s, st, name, &m, &o);
    cr_assert_eq(rc, 0, "create '%s': %s", name, ctxs_err_name(rc));
    ts_append_many(s, n);
    return s;
}

static void mk(ctxs_store *st, const char *name, uint32_t capacity, int ring, uint64_t n)
{
    ctxs_session_close(mk_open(st, name, capacity, ring, n));
}

/* The store S(), open, with the model registered. */
static ctxs_store *store_with_model(void)
{
    ctxs_store *st = ts_store_open(S());
    register_model(st);
    return st;
}

/* The store S() with one session, name, of n tokens (mk()); closed. */
static void store_with_session(const char *name, uint32_t capacity, int ring, uint64_t n)
{
    ctxs_store *st = store_with_model();
    mk(st, name, capacity, ring, n);
    ctxs_store_close(st);
}

static ctxs_session *open_rw(ctxs_store *st, const char *name)
{
    ctxs_model m = model();
    ctxs_session *s = NULL;
    int rc = ctxs_store_session_open(&s, st, name, &m, 0, NULL);
    cr_assert_eq(rc, 0, "open '%s': %s", name, ctxs_err_name(rc));
    return s;
}

static ctxs_session *open_ro(ctxs_store *st, const char *name)
{
    ctxs_session *s = NULL;
    int rc = ctxs_store_session_open(&s, st, name, NULL, CTXS_RDONLY, NULL);
    cr_assert_eq(rc, 0, "open '%s' read-only: %s", name, ctxs_err_name(rc));
    return s;
}

/* The file of session name in the store at dir. */
static const char *file_of(const char *dir, const char *name)
{
    static char bufs[4][1100];
    static unsigned next;
    ctxs_store *st = ts_store_open(dir);
    ctxs_session_entry e;
    int rc = ctxs_store_session_get(&e, st, name);
    cr_assert_eq(rc, 0, "get '%s': %s", name, ctxs_err_name(rc));
    ctxs_store_close(st);
    char *b = bufs[next++ % 4];
    snprintf(b, sizeof(bufs[0]), "%s/sessions/%016llx.ctxs", dir, (unsigned long long)e.id);
    return b;
}

/* XORs the byte at off of path with mask. */
static void flip(const char *path, uint64_t off, uint8_t mask)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    cr_assert_geq(fd, 0, "open %s: %s", path, strerror(errno));
    uint8_t b;
    cr_assert_eq(pread(fd, &b, 1, (off_t)off), 1, "read byte %llu of %s", (unsigned long long)off,
                 path);
    b ^= mask;
    cr_assert_eq(pwrite(fd, &b, 1, (off_t)off), 1);
    close(fd);
}

static ctxs__disk_header header_of(const char *path)
{
    ctxs__disk_header h;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0, "open %s: %s", path, strerror(errno));
    cr_assert_eq(pread(fd, &h, sizeof(h), 0), (ssize_t)sizeof(h));
    close(fd);
    return h;
}

/* The file offset of the KV bytes of (layer, kind, head) of the slot
 * holding position pos, as the header's layout gives it. */
static uint64_t kv_offset(const char *path, uint32_t layer, uint32_t kind, uint32_t head,
                          uint64_t pos)
{
    ctxs__disk_header h = header_of(path);
    uint64_t slot_bytes = (uint64_t)h.head_dim * h.elem_bytes;
    uint64_t head_stride = (uint64_t)h.capacity * slot_bytes;
    uint64_t kv_stride = h.n_kv_heads * head_stride;
    uint64_t slot = ctxs__slot_of(pos, h.capacity, h.n_sink);
    return h.kv_off + layer * 2 * kv_stride + kind * kv_stride + head * head_stride +
           slot * slot_bytes;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* "name size\n" for each entry of dir, sorted, into a malloc'ed string. */
static char *listing(const char *dir)
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "opendir %s: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        struct stat sb;
        char p[2048];
        snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
        cr_assert_eq(lstat(p, &sb), 0);
        names = realloc(names, (n + 1) * sizeof(*names));
        cr_assert_not_null(names);
        char line[512];
        snprintf(line, sizeof(line), "%s %lld %o\n", de->d_name, (long long)sb.st_size,
                 (unsigned)sb.st_mode);
        names[n++] = strdup(line);
    }
    closedir(d);
    if (n) /* qsort's array may not be NULL, even empty */
        qsort(names, n, sizeof(*names), cmp_str);
    size_t total = 1;
    for (size_t i = 0; i < n; i++)
        total += strlen(names[i]);
    char *s = malloc(total);
    cr_assert_not_null(s);
    s[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        strcat(s, names[i]);
        free(names[i]);
    }
    free(names);
    return s;
}

/* Writes back the session files of the store at dir. A file written at
 * CTXS_SYNC_NONE gets blocks (an extent tree block, on ext4) when the
 * kernel writes it back, whenever that is: its disk bytes settle here. */
static void settle(const char *dir)
{
    const char *ses = ts_path(dir, "sessions");
    DIR *d = opendir(ses);
    cr_assert_not_null(d, "opendir %s: %s", ses, strerror(errno));
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        int fd = openat(dirfd(d), de->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd >= 0) {
            fsync(fd);
            close(fd);
        }
    }
    closedir(d);
}

/* What "the store is unchanged" compares: `ls --json` (disk bytes
 * included) and the listing of the store directory and of sessions/. */
static char *store_state(const char *dir)
{
    settle(dir);
    CLI_EXPECT(EX_OK, dir, "ls", "--json");
    jc_free(json_out());
    char *top = listing(dir), *ses = listing(ts_path(dir, "sessions"));
    size_t n = strlen(R.out) + strlen(top) + strlen(ses) + 64;
    char *s = malloc(n);
    cr_assert_not_null(s);
    snprintf(s, n, "ls:\n%s\ndir:\n%s\nsessions/:\n%s", R.out, top, ses);
    free(top);
    free(ses);
    return s;
}

static void same_state(const char *before, const char *dir, const char *after_what)
{
    char *now = store_state(dir);
    cr_assert_str_eq(now, before, "the store changed after %s:\nbefore:\n%s\nafter:\n%s",
                     after_what, before, now);
    free(now);
}

/* Every position both sessions hold has the same K, V and token id, and
 * they hold the same positions. */
static void same_tokens(const ctxs_session *a, const ctxs_session *b)
{
    ctxs_session_info ia = ts_info(a), ib = ts_info(b);
    cr_assert_eq(ia.n_tokens, ib.n_tokens);
    cr_assert_eq(ia.n_held, ib.n_held);
    cr_assert_eq(ia.ring_start, ib.ring_start);
    cr_assert_eq(ia.capacity, ib.capacity);
    cr_assert_eq(ia.n_sink, ib.n_sink);
    const ctxs_geometry *g = &ia.model.geometry;
    size_t per = (size_t)g->n_layers * g->n_kv_heads * g->head_dim;
    uint16_t *k1 = malloc(per * 2), *v1 = malloc(per * 2), *k2 = malloc(per * 2),
             *v2 = malloc(per * 2);
    cr_assert(k1 && v1 && k2 && v2);
    ctxs_layout la, lb;
    cr_assert_eq(ctxs_session_get_layout(&la, a), 0);
    cr_assert_eq(ctxs_session_get_layout(&lb, b), 0);
    for (uint64_t p = 0; p < ia.n_tokens; p++) {
        int ra = ctxs_session_read_token(k1, v1, a, p, CTXS_DTYPE_F16);
        int rb = ctxs_session_read_token(k2, v2, b, p, CTXS_DTYPE_F16);
        cr_assert_eq(ra, rb, "position %llu: %s here, %s there", (unsigned long long)p,
                     ctxs_err_name(ra), ctxs_err_name(rb));
        if (ra == CTXS_EEVICTED)
            continue;
        cr_assert_eq(ra, 0);
        cr_assert(memcmp(k1, k2, per * 2) == 0 && memcmp(v1, v2, per * 2) == 0,
                  "position %llu: the KV differs", (unsigned long long)p);
        uint32_t sa, sb;
        cr_assert_eq(ctxs_session_get_slot(&sa, a, p), 0);
        cr_assert_eq(ctxs_session_get_slot(&sb, b, p), 0);
        cr_assert_eq(la.token_ids[sa], lb.token_ids[sb], "position %llu: the token id differs",
                     (unsigned long long)p);
    }
    free(k1);
    free(v1);
    free(k2);
    free(v2);
}

/* =============================================================================
 * The JSON checker itself
 * ========================================================================== */

static jc_value *parse_ok(const char *text)
{
    char err[256];
    jc_value *v = jc_parse(text, strlen(text), err, sizeof(err));
    cr_assert_not_null(v, "'%s' should parse: %s", text, err);
    return v;
}

static void parse_bad(const char *text, size_t len)
{
    char err[256];
    jc_value *v = jc_parse(text, len, err, sizeof(err));
    cr_assert_null(v, "'%.*s' should not parse", (int)len, text);
    cr_assert(err[0], "no message for '%.*s'", (int)len, text);
}

Test(cli, json_checker_parses_what_json_allows_and_refuses_the_rest)
{
    jc_value *v = parse_ok(" {\"a\": [1, -2, 3.5e2, 0, 18446744073709551615, true, false, null],"
                           " \"s\": \"q\\\"b\\\\s\\/\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00\\u0000x\","
                           " \"o\": {\"k\": {}}, \"e\": [], \"u\": \"\xc3\xa9\"} \n");
    cr_assert_eq(v->type, JC_OBJECT);
    uint64_t u;
    cr_assert_eq(jc_u64(jc_path(v, "a[0]"), &u), 0);
    cr_assert_eq(u, 1);
    cr_assert_eq(jc_path(v, "a[1]")->i64, -2);
    cr_assert_neq(jc_u64(jc_path(v, "a[1]"), &u), 0, "a negative number is not a count");
    cr_assert_eq(jc_path(v, "a[2]")->number, 350.0);
    cr_assert_eq(jc_path(v, "a[2]")->is_int, 0);
    cr_assert_eq(jc_u64(jc_path(v, "a[4]"), &u), 0);
    cr_assert_eq(u, UINT64_MAX, "integers are exact to 64 bits");
    cr_assert_eq(jc_bool(jc_path(v, "a[5]")), 1);
    cr_assert_eq(jc_bool(jc_path(v, "a[6]")), 0);
    cr_assert_eq(jc_path(v, "a[7]")->type, JC_NULL);
    cr_assert_null(jc_path(v, "a[8]"));
    const jc_value *s = jc_get(v, "s");
    static const char want[] = "q\"b\\s/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80\0x";
    cr_assert_eq(s->len, sizeof(want) - 1);
    cr_assert(memcmp(s->str, want, sizeof(want) - 1) == 0);
    cr_assert_str_eq(jc_str(jc_get(v, "u")), "\xc3\xa9");
    cr_assert_eq(jc_path(v, "o.k")->type, JC_OBJECT);
    cr_assert_eq(jc_path(v, "e")->n, 0);
    cr_assert_not_null(jc_find_key(v, "k"));
    jc_free(v);

    static const char *const bad[] = {
        "", " ", "{", "[", "[1,]", "{\"a\":1,}", "{\"a\" 1}", "{a:1}", "[1 2]", "01", "-",
        "1.", ".5", "1e", "+1", "NaN", "Infinity", "tru", "nul", "\"abc", "\"\\x\"",
        "\"\\u12\"", "\"\\ud800\"", "\"\\udc00\"", "\"\\ud800\\u0041\"", "\"a\tb\"",
        "\"\xff\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"", "{\"a\":1,\"a\":2}", "[1] [2]",
        "{} x", "[1]]", "'a'", "[1,,2]", "// c\n1",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        parse_bad(bad[i], strlen(bad[i]));
    parse_bad("[1]\0", 4); /* a NUL after the document is trailing garbage */

    char deep[400];
    memset(deep, '[', 200);
    memset(deep + 200, ']', 200);
    parse_bad(deep, sizeof(deep));
    jc_value *ok = jc_parse(deep + 150, 100, NULL, 0); /* 50 deep is fine */
    cr_assert_not_null(ok);
    jc_free(ok);
}

/* =============================================================================
 * Help and usage
 * ========================================================================== */

Test(cli, help_for_every_command_exits_0_and_documents_the_exit_codes)
{
    const char *store = dir_of("never-made");
    CLI_EXPECT(EX_OK, store, "--help");
    contains(1, "usage: ctxstore");
    for (size_t i = 0; i < N_COMMANDS; i++)
        contains(1, k_commands[i]);
    contains(1, "Exit codes");

    /* Every command is tried, whatever an earlier one did. */
    for (size_t i = 0; i < N_COMMANDS; i++) {
        char want[64];
        snprintf(want, sizeof(want), "usage: ctxstore %s", k_commands[i]);
        CLI(store, k_commands[i], "--help");
        cr_expect_eq(R.code, EX_OK, "`%s` exited %d:\n%s", R.what, R.code, R.err);
        says(1, want);
        says(1, "Exit codes");
        says(1, "5  damaged");
        says(1, "7  the name or file already exists");
        says(1, "8  the store's index is damaged");
        CLI(store, "help", k_commands[i]);
        cr_expect_eq(R.code, EX_OK, "`%s` exited %d:\n%s", R.what, R.code, R.err);
        says(1, want);
        CLI(store, "--store", store, k_commands[i], "--help", "--json");
        cr_expect_eq(R.code, EX_OK, "`%s` exited %d:\n%s", R.what, R.code, R.err);
        says(1, want);
    }
    CLI_EXPECT(EX_OK, store, "--version");
    contains(1, "ctxstore 0.2.0");
    cr_assert_not(ts_exists(store), "--help created the store %s", store);
}

/* A command line that is wrong: the arguments, then what stderr must
 * say. */
typedef struct usage_case {
    const char *args[16];
    const char *says;
} usage_case;

/* Runs each case on a store that does not exist: each must exit 2 with a
 * usage line, print nothing on stdout, and create no store. */
static void usage_errors(const usage_case *cases, size_t n)
{
    const char *store = dir_of("never-made");
    /* Every case is tried, whatever an earlier one did. */
    for (size_t i = 0; i < n; i++) {
        run_env(store, NULL, cases[i].args);
        cr_expect_eq(R.code, EX_USAGE, "`%s` exited %d, expected 2.\nstdout:\n%s\nstderr:\n%s",
                     R.what, R.code, R.out, R.err);
        says(0, cases[i].says);
        cr_expect_eq(R.out_len, 0, "`%s` wrote to stdout after a usage error:\n%s", R.what,
                     R.out);
        cr_assert_not(ts_exists(store), "`%s` created the store %s", R.what, store);
    }
}

Test(cli, usage_errors_exit_2_with_a_usage_line_and_create_nothing)
{
    static const usage_case cases[] = {
        { { "ls", "--bogus" }, "usage: ctxstore ls" },
        { { "ls", "extra" }, "usage: ctxstore ls" },
        { { "info" }, "usage: ctxstore info" },
        { { "info", "a", "b" }, "usage: ctxstore info" },
        { { "verify", "a", "--all" }, "usage: ctxstore verify" },
        { { "verify", "a", "b" }, "usage: ctxstore verify" },
        { { "verify", "--bogus" }, "usage: ctxstore verify" },
        { { "compact", "a", "b" }, "usage: ctxstore compact" },
        { { "compact", "--all", "a" }, "usage: ctxstore compact" },
        { { "gc" }, "usage: ctxstore gc" },
        { { "gc", "--max-size", "banana" }, "usage: ctxstore gc" },
        { { "gc", "--max-size", "-5" }, "usage: ctxstore gc" },
        { { "gc", "--max-size", "1G", "extra" }, "usage: ctxstore gc" },
        { { "gc", "--max-size" }, "usage: ctxstore gc" },
        { { "rm" }, "usage: ctxstore rm" },
        { { "rm", "--bogus", "a" }, "usage: ctxstore rm" },
        { { "fork", "a" }, "usage: ctxstore fork" },
        { { "fork", "a", "b", "c" }, "usage: ctxstore fork" },
        { { "fork", "a", "b", "--at", "ten" }, "usage: ctxstore fork" },
        { { "fork", "a", "b", "--at", "-1" }, "usage: ctxstore fork" },
        { { "fork", "a", "b", "--at", "5", "--checkpoint", "c" }, "usage: ctxstore fork" },
        { { "checkpoint" }, "usage: ctxstore checkpoint" },
        { { "checkpoint", "frob", "s", "n" }, "usage: ctxstore checkpoint" },
        { { "checkpoint", "create", "s" }, "usage: ctxstore checkpoint" },
        { { "checkpoint", "ls" }, "usage: ctxstore checkpoint" },
        { { "checkpoint", "ls", "s", "extra" }, "usage: ctxstore checkpoint" },
        { { "checkpoint", "restore", "s" }, "usage: ctxstore checkpoint" },
        { { "checkpoint", "rm", "s", "n", "x" }, "usage: ctxstore checkpoint" },
        { { "reindex", "x" }, "usage: ctxstore reindex" },
        { { "export", "s" }, "usage: ctxstore export" },
        { { "export", "s", "f", "g" }, "usage: ctxstore export" },
        { { "import" }, "usage: ctxstore import" },
        { { "import", "f", "n", "x" }, "usage: ctxstore import" },
        { { "demo", "--turns", "0" }, "usage: ctxstore demo" },
        { { "demo", "--bogus" }, "usage: ctxstore demo" },
        { { "demo", "extra" }, "usage: ctxstore demo" },
        { { "demo", "--engine", "gpt" }, "usage: ctxstore demo" },
        { { "bench", "--bogus" }, "usage: ctxstore bench" },
        { { "frobnicate" }, "'frobnicate' is not a command" },
        { { "--bogus", "ls" }, "ctxstore --help" },
        { { NULL }, "usage: ctxstore" },
    };
    usage_errors(cases, sizeof(cases) / sizeof(cases[0]));
}

Test(cli, usage_errors_of_rename_models_and_prefix_exit_2_and_create_nothing)
{
    static const usage_case cases[] = {
        { { "rename" }, "usage: ctxstore rename" },
        { { "rename", "a" }, "usage: ctxstore rename" },
        { { "rename", "a", "b", "c" }, "usage: ctxstore rename" },
        { { "rename", "--bogus", "a", "b" }, "usage: ctxstore rename" },
        { { "models", "frob" }, "usage: ctxstore models" },
        { { "models", "ls", "x" }, "usage: ctxstore models" },
        { { "models", "--layers", "2" }, "usage: ctxstore models" },
        { { "models", "register" }, "usage: ctxstore models" },
        { { "models", "register", "w", "--layers", "2", "--kv-heads", "2", "--head-dim", "16" },
          "--name" },
        { { "models", "register", "w", "--name", "n", "--layers", "2", "--kv-heads", "2" },
          "--head-dim" },
        { { "models", "register", "w", "--name", "n", "--layers", "0" }, "1 to 4096" },
        { { "models", "register", "w", "--name", "n", "--head-dim", "4097" }, "1 to 4096" },
        { { "models", "register", "w", "--name", "n", "--kv-heads", "two" }, "1 to 4096" },
        { { "models", "register", "w", "--name", "n", "--dtype", "fp8" }, "fp16, bf16 or q8" },
        { { "models", "register", "w", "--name", "n", "--tokenizer-hash", "abc" }, "32 hex" },
        { { "models", "register", "w", "v", "--name", "n", "--layers", "1", "--kv-heads", "1" },
          "usage: ctxstore models" },
        { { "models", "register", "w", "--name", "n", "--layers", "1", "--kv-heads", "1",
            "--head-dim", "1", "--tokenizer", "t", "--tokenizer-hash",
            "00112233445566778899aabbccddeeff" },
          "exclude each other" },
        { { "prefix" }, "--model" },
        { { "prefix", "1", "2" }, "--model" },
        { { "prefix", "--model", "m" }, "token ids" },
        { { "prefix", "--model", "m", "1", "2x" }, "'2x' is no token id" },
        { { "prefix", "--model", "m", "4294967296" }, "'4294967296' is no token id" },
        { { "prefix", "--model", "m", "1 +2" }, "'+2' is no token id" },
        { { "prefix", "--model", "m", "--tokens-file", "f", "1" }, "not both" },
        { { "prefix", "--model", "m", "--bogus", "1" }, "usage: ctxstore prefix" },
    };
    usage_errors(cases, sizeof(cases) / sizeof(cases[0]));
}

/* =============================================================================
 * ls and info
 * ========================================================================== */

#define ODD_NAME "quote\" back\\slash \xc3\xa9t\xc3\xa9 \xe2\x9c\x93"

Test(cli, ls_lists_names_tokens_capacity_and_flags)
{
    ctxs_store *st = store_with_model();
    mk(st, "alpha", 256, 0, 100);           /* no ring */
    mk(st, "beta", 256, 1, 300);            /* a ring that wrapped */
    mk(st, "damaged", 256, 1, 40);          /* its header gets a flipped byte */
    mk(st, ODD_NAME, 512, 1, 7);            /* JSON escapes */
    ctxs_session *held = mk_open(st, "delta", 256, 1, 60); /* a writer holds it */
    ctxs_session *beta = open_ro(st, "beta");
    ctxs_session_info bi = ts_info(beta);
    ctxs_session_close(beta);
    cr_assert(bi.flags & CTXS_INFO_WRAPPED, "the test's ring did not wrap");
    flip(file_of(S(), "damaged"), offsetof(ctxs__disk_header, capacity), 0x10);

    CLI_EXPECT(EX_OK, NULL, "--store", S(), "ls", "--json");
    jc_value *v = json_out();
    cr_assert_eq(v->type, JC_ARRAY);
    cr_assert_eq(v->n, 5, "five sessions:\n%s", R.out);
    /* In name order. */
    for (size_t i = 1; i < v->n; i++)
        cr_assert_lt(strcmp(js(jc_at(v, i - 1), "name"), js(jc_at(v, i), "name")), 0,
                     "ls --json is not in name order:\n%s", R.out);

    const jc_value *a = must_by_name(v, "alpha");
    cr_assert_eq(ju(a, "n_tokens"), 100);
    cr_assert_eq(ju(a, "held"), 100);
    cr_assert_eq(ju(a, "capacity"), 256);
    cr_assert_str_eq(js(a, "model"), MODEL_NAME);
    char hex[33];
    ctxs_model m = model();
    cli_hex(hex, m.model_hash);
    cr_assert_str_eq(js(a, "model_hash"), hex);
    cr_assert_gt(ju(a, "disk_bytes"), 0);
    cr_assert_gt(ju(a, "last_used_unix_ms"), 0);
    cr_assert_eq(jget(a, "flags")->n, 0, "alpha has no flags:\n%s", R.out);

    const jc_value *b = must_by_name(v, "beta");
    cr_assert_eq(ju(b, "n_tokens"), 300);
    cr_assert_eq(ju(b, "held"), bi.n_held);
    cr_assert_eq(ju(b, "capacity"), 256);
    cr_assert(jc_has_string(jget(b, "flags"), "ring"), "beta: %s", R.out);
    cr_assert(jc_has_string(jget(b, "flags"), "wrapped"), "beta: %s", R.out);
    cr_assert_not(jc_has_string(jget(b, "flags"), "failed"), "beta: %s", R.out);
    cr_assert_not(jc_has_string(jget(b, "flags"), "writer"), "beta: %s", R.out);

    const jc_value *d = must_by_name(v, "delta");
    cr_assert_eq(ju(d, "n_tokens"), 60);
    cr_assert(jc_has_string(jget(d, "flags"), "writer"), "delta is held open: %s", R.out);
    cr_assert_not(jc_has_string(jget(d, "flags"), "wrapped"), "delta: %s", R.out);
    cr_assert_not(jc_has_string(jget(d, "flags"), "failed"), "delta: %s", R.out);

    const jc_value *x = must_by_name(v, "damaged");
    cr_assert(jc_has_string(jget(x, "flags"), "failed"), "damaged: %s", R.out);
    cr_assert_str_eq(js(x, "error"), "CTXS_ECORRUPT");
    cr_assert_null(jc_get(x, "n_tokens"), "a file that does not open has no token count");

    const jc_value *o = must_by_name(v, ODD_NAME);
    cr_assert_eq(ju(o, "n_tokens"), 7);
    cr_assert_eq(ju(o, "capacity"), 512);
    jc_free(v);

    /* The table says the same. */
    CLI_EXPECT(EX_OK, S(), "ls");
    contains(1, "NAME");
    contains(1, "5 sessions");
    char line[1024];
    line_with(line, sizeof(line), "alpha");
    cr_assert(strstr(line, " 100 ") && strstr(line, " 256 ") && strstr(line, MODEL_NAME),
              "alpha's line: %s", line);
    line_with(line, sizeof(line), "beta");
    cr_assert(strstr(line, " 300 ") && strstr(line, "wrapped"), "beta's line: %s", line);
    line_with(line, sizeof(line), "delta");
    cr_assert(strstr(line, " 60 ") && strstr(line, "writer"), "delta's line: %s", line);
    line_with(line, sizeof(line), "damaged");
    cr_assert(strstr(line, "failed") && strstr(line, " ? "), "damaged's line: %s", line);
    line_with(line, sizeof(line), ODD_NAME);

    /* Once the writer is gone, so is the flag. */
    ctxs_session_close(held);
    ctxs_store_close(st);
    CLI_EXPECT(EX_OK, S(), "ls", "--json");
    v = json_out();
    cr_assert_not(jc_has_string(jget(must_by_name(v, "delta"), "flags"), "writer"), "%s", R.out);
    jc_free(v);
}

/* Rewrites both commit records of path with no boot id, as a failed
 * writeback leaves them (and as every record is where the platform has no
 * boot id): the next open verifies, and the session opens. */
static void forget_boot_id(const char *path)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    for (uint32_t i = 0; i < 2; i++) {
        off_t off = i == 0 ? CTXS__RECORD0_OFF : CTXS__RECORD1_OFF;
        ctxs__disk_record r;
        cr_assert_eq(pread(fd, &r, sizeof(r), off), (ssize_t)sizeof(r));
        memset(r.boot_id, 0, sizeof(r.boot_id));
        ctxs__record_seal(&r, i);
        cr_assert_eq(pwrite(fd, &r, sizeof(r), off), (ssize_t)sizeof(r));
    }
    close(fd);
}

Test(cli, ls_flags_failed_only_for_a_file_that_does_not_open)
{
    store_with_session("no-boot-id", 256, 1, 70);
    forget_boot_id(file_of(S(), "no-boot-id"));

    /* It opens, and every token verifies... */
    CLI_EXPECT(EX_OK, S(), "verify", "no-boot-id");
    CLI_EXPECT(EX_OK, S(), "info", "no-boot-id", "--json");
    jc_value *v = json_out();
    cr_assert_str_eq(js(v, "status"), "OK");
    cr_assert_eq(ju(v, "n_tokens"), 70);
    jc_free(v);
    /* ...so ls must not call it failed ("the file does not open"). */
    CLI_EXPECT(EX_OK, S(), "ls", "--json");
    v = json_out();
    const jc_value *e = must_by_name(v, "no-boot-id");
    cr_assert_eq(ju(e, "n_tokens"), 70);
    cr_assert_not(jc_has_string(jget(e, "flags"), "failed"),
                  "ls flags a session that opens and verifies as failed:\n%s", R.out);
    jc_free(v);
}

Test(cli, ls_flags_rolled_back_while_the_index_remembers_more_tokens)
{
    ctxs_store *st = store_with_model();
    mk(st, "undo", 256, 1, 150);
    ctxs_session *s = open_rw(st, "undo");
    cr_assert_eq(ctxs_session_rollback(s, 50), 0);

    CLI_EXPECT(EX_OK, S(), "ls", "--json");
    jc_value *v = json_out();
    const jc_value *e = must_by_name(v, "undo");
    cr_assert_eq(ju(e, "n_tokens"), 50, "ls reads the tokens from the file:\n%s", R.out);
    cr_assert(jc_has_string(jget(e, "flags"), "rolled-back"), "%s", R.out);
    cr_assert(jc_has_string(jget(e, "flags"), "writer"), "%s", R.out);
    jc_free(v);
    ctxs_session_close(s);
    ctxs_store_close(st);
    CLI_EXPECT(EX_OK, S(), "ls", "--json");
    v = json_out();
    e = must_by_name(v, "undo");
    cr_assert_not(jc_has_string(jget(e, "flags"), "rolled-back"), "%s", R.out);
    cr_assert_not(jc_has_string(jget(e, "flags"), "writer"), "%s", R.out);
    jc_free(v);
}

Test(cli, ls_of_an_empty_store)
{
    ctxs_store_close(ts_store_open(S()));
    CLI_EXPECT(EX_OK, S(), "ls", "--json");
    jc_value *v = json_out();
    cr_assert_eq(v->type, JC_ARRAY);
    cr_assert_eq(v->n, 0);
    jc_free(v);
    CLI_EXPECT(EX_OK, S(), "ls");
    contains(1, "0 sessions");
}

/* =============================================================================
 * Stores the tool must not make, and stores it cannot write
 * ========================================================================== */

static const char *weights_file(const char *name, size_t n, uint8_t seed, uint8_t hash[16]);

/* Every command that needs a store, on dir: none makes one. */
static void no_store_here(const char *dir, int want_dir)
{
    static const char *const cases[][8] = {
        { "ls" }, { "info", "s" }, { "verify" }, { "verify", "s" },
        { "export", "s", "out.export" }, { "models" }, { "prefix", "--model", "m", "1" },
        { "checkpoint", "ls", "s" }, { "gc", "--max-size", "0", "--dry-run" },
        { "gc", "--max-size", "0" }, { "compact" }, { "rm", "s" }, { "rename", "s", "t" },
        { "fork", "s", "t" }, { "checkpoint", "create", "s", "c" }, { "pin", "s" },
        { "unpin", "s" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *args[10] = { 0 };
        size_t n = 0;
        while (n < 8 && cases[i][n])
            args[n] = cases[i][n], n++;
        args[n++] = "--json";
        run_env(dir, NULL, args);
        cr_assert_eq(R.code, EX_NOTFOUND, "`%s` exited %d, expected 3.\nstdout:\n%s\nstderr:\n%s",
                     R.what, R.code, R.out, R.err);
        jc_value *v = json_error_out(want_dir ? CTXS_EFOREIGN : -ENOENT,
                                     want_dir ? "CTXS_EFOREIGN" : "ENOENT");
        cr_assert(strstr(hint_of(v), "import"), "`%s` says how to make a store: %s", R.what,
                  R.out);
        jc_free(v);
        cr_assert(!strstr(R.err, "created store"), "`%s`: %s", R.what, R.err);
        if (want_dir)
            cr_assert_eq(ts_dir_entries(dir), 1, "`%s` made something in %s", R.what, dir);
        else
            cr_assert(!ts_exists(dir), "`%s` made %s", R.what, dir);
    }
}

Test(cli, commands_make_no_store_where_there_is_none_and_say_why)
{
    no_store_here(dir_of("missing"), 0);
    const char *other = dir_of("other");
    cr_assert_eq(mkdir(other, 0755), 0);
    cr_assert_eq(ts_write_file(ts_path(other, "notes.txt"), "mine", 4), 0);
    no_store_here(other, 1);
    CLI_EXPECT(EX_NOTFOUND, other, "ls");
    says(0, "is not a ctxstore store");
}

Test(cli, import_and_models_register_make_a_store_and_say_so)
{
    store_with_session("carried", 256, 1, 70);
    const char *file = dir_of("carried.export");
    CLI_EXPECT(EX_OK, S(), "export", "carried", file);

    /* A damaged export file leaves no store behind... */
    const char *fresh = dir_of("fresh");
    const char *junk = dir_of("junk.export");
    cr_assert_eq(ts_write_file(junk, "not an export", 13), 0);
    CLI_EXPECT(EX_DAMAGED, fresh, "import", junk);
    cr_assert(!ts_exists(fresh), "a failed import left a store");
    cr_assert(!strstr(R.err, "created store"), "%s", R.err);
    /* ...and one that is good makes it, and says so. */
    CLI_EXPECT(EX_OK, fresh, "import", file);
    says(0, "created store");
    CLI_EXPECT(EX_OK, fresh, "ls", "--json");
    jc_value *v = json_out();
    cr_assert_not_null(by_name(v, "carried"), "%s", R.out);
    jc_free(v);
    CLI_EXPECT(EX_OK, fresh, "import", file, "again");
    cr_assert(!strstr(R.err, "created store"), "only a new store is announced: %s", R.err);

    uint8_t h[16];
    const char *weights = weights_file("w.bin", 4096, 3, h);
    const char *other = dir_of("for-models");
    cr_assert_eq(mkdir(other, 0700), 0);
    CLI_EXPECT(EX_NOTFOUND, other, "models", "register", dir_of("no-such-weights"), "--name",
               "m", "--layers", "2", "--kv-heads", "2", "--head-dim", "16");
    cr_assert_eq(ts_dir_entries(other), 0, "a failed register left a store");
    CLI_EXPECT(EX_OK, other, "models", "register", weights, "--name", "m", "--layers", "2",
               "--kv-heads", "2", "--head-dim", "16");
    says(0, "created store");
    CLI_EXPECT(EX_OK, other, "models", "--json");
    v = json_out();
    cr_assert_eq(v->n, 1, "%s", R.out);
    jc_free(v);
}

Test(cli, reindex_rebuilds_a_lost_index_beside_the_session_files)
{
    store_with_session("survivor", 256, 1, 70);
    ts_rmtree(ts_path(S(), "index"));
    CLI_EXPECT(EX_NOTFOUND, S(), "ls", "--json");
    jc_value *v = json_error_out(CTXS_EFOREIGN, "CTXS_EFOREIGN");
    cr_assert(strstr(hint_of(v), "reindex"), "%s", R.out);
    jc_free(v);
    cr_assert(!ts_exists(ts_path(S(), "index")));
    CLI_EXPECT(EX_OK, S(), "reindex");
    says(0, "no index");
    CLI_EXPECT(EX_OK, S(), "ls", "--json");
    v = json_out();
    cr_assert_not_null(by_name(v, "survivor"), "%s", R.out);
    jc_free(v);
}

/* Whether path is a regular file (lstat: a link is not). */
static int is_regular(const char *path)
{
    struct stat sb;
    return lstat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* A store with one session, "chat", renamed so that only the index
 * knows its name (a rebuild from the files alone would call it
 * otherwise) -- and so whether an index came back whole shows. */
static void special_store(void)
{
    ctxs_store *st = store_with_model();
    mk(st, "first", 256, 1, 70);
    cr_assert_eq(ctxs_store_session_rename(st, "first", "chat"), 0);
    ctxs_store_close(st);
}

/* ls lists "chat" (exits 0). */
static void lists_chat(void)
{
    CLI_EXPECT(EX_OK, S(), "ls");
    contains(1, "chat");
}

/* ls lists one session: the store's one file, indexed again. */
static void lists_one(void)
{
    CLI_EXPECT(EX_OK, S(), "ls", "--json");
    jc_value *v = json_out();
    const jc_value *list = v->type == JC_ARRAY ? v : jc_find_key(v, "sessions");
    cr_assert(list && list->type == JC_ARRAY && list->n == 1, "%s", R.out);
    jc_free(v);
}

static void copy_file(const char *from, const char *to)
{
    size_t len;
    uint8_t *bytes = ts_read_file(from, &len);
    cr_assert_not_null(bytes, "%s", from);
    cr_assert_eq(ts_write_file(to, bytes, len), 0);
    free(bytes);
}

Test(cli, special_files_in_the_index_are_refused_in_bounded_time_and_repair_index_mends_them)
{
    /* Each of these blocked every command forever, or followed a link
     * out of the store: a run that does not end fails the test. */
    cli_run_limit_s = 60;
    special_store();
    char index[4200], lock[4300], data[4300], lmdb_lock[4300], aside[4300], victim[4300];
    snprintf(index, sizeof(index), "%s/index", S());
    snprintf(lock, sizeof(lock), "%s/store.lock", index);
    snprintf(data, sizeof(data), "%s/data.mdb", index);
    snprintf(lmdb_lock, sizeof(lmdb_lock), "%s/lock.mdb", index);
    snprintf(aside, sizeof(aside), "%s/index-data.mdb", ts_scratch);
    snprintf(victim, sizeof(victim), "%s/victim", ts_scratch);

    /* A FIFO at store.lock: read and write commands alike. */
    cr_assert_eq(unlink(lock), 0);
    cr_assert_eq(mkfifo(lock, 0600), 0);
    CLI_EXPECT(EX_INDEX, S(), "ls");
    contains(0, "index/store.lock is a FIFO (named pipe)");
    contains(0, "repair-index");
    CLI_EXPECT(EX_INDEX, S(), "pin", "chat");
    contains(0, "index/store.lock is a FIFO");
    CLI_EXPECT(EX_OK, S(), "repair-index");
    contains(0, "index/store.lock was a FIFO (named pipe)");
    cr_assert(is_regular(lock));
    lists_chat();

    /* A FIFO at data.mdb: repair-index blocked too, and once killed left
     * the store without an index. */
    cr_assert_eq(rename(data, aside), 0);
    cr_assert_eq(mkfifo(data, 0600), 0);
    CLI_EXPECT(EX_INDEX, S(), "ls");
    contains(0, "index/data.mdb is a FIFO (named pipe)");
    contains(0, "repair-index");
    CLI_EXPECT(EX_INDEX, S(), "verify", "--all");
    CLI_EXPECT(EX_OK, S(), "repair-index");
    contains(0, "index/data.mdb was a FIFO (named pipe)");
    contains(1, "indexed 1 session file");
    cr_assert(is_regular(data));
    lists_one();

    /* data.mdb a symbolic link to the index itself, moved out: never
     * followed; the first way out is to put the file back. */
    cr_assert_eq(unlink(data), 0);
    copy_file(aside, data);
    CLI_EXPECT(EX_OK, S(), "ls");
    contains(1, "chat");
    cr_assert_eq(rename(data, aside), 0);
    cr_assert_eq(symlink(aside, data), 0);
    CLI_EXPECT(EX_INDEX, S(), "ls");
    contains(0, "index/data.mdb is a symbolic link to '");
    contains(0, "mv TARGET");
    cr_assert(!strstr(R.err, "ELOOP") && !strstr(R.err, "symbolic links"), "%s", R.err);
    cr_assert_eq(unlink(data), 0);
    cr_assert_eq(rename(aside, data), 0);
    lists_chat();
    /* The other: repair-index moves the link aside and rebuilds. */
    copy_file(data, aside);
    cr_assert_eq(unlink(data), 0);
    cr_assert_eq(symlink(aside, data), 0);
    CLI_EXPECT(EX_OK, S(), "repair-index");
    contains(0, "index/data.mdb was a symbolic link");
    cr_assert(is_regular(data));
    lists_one();

    /* lock.mdb a symbolic link out of the store: LMDB would truncate and
     * map the far file as its reader table. */
    cr_assert_eq(ts_write_file(victim, "precious\n", 9), 0);
    unlink(lmdb_lock);
    cr_assert_eq(symlink(victim, lmdb_lock), 0);
    CLI_EXPECT(EX_INDEX, S(), "ls");
    contains(0, "index/lock.mdb is a symbolic link to '");
    CLI_EXPECT(EX_OK, S(), "repair-index");
    contains(0, "index/lock.mdb was a symbolic link");
    cr_assert(is_regular(lmdb_lock));
    size_t len;
    uint8_t *bytes = ts_read_file(victim, &len);
    cr_assert(bytes && len == 9 && memcmp(bytes, "precious\n", 9) == 0,
              "the link's target was written");
    free(bytes);
    CLI_EXPECT(EX_OK, S(), "ls");

    /* A directory with something in it at store.lock: repair-index
     * leaves it, and says to remove it by hand. */
    char inside[4400];
    cr_assert_eq(unlink(lock), 0);
    cr_assert_eq(mkdir(lock, 0700), 0);
    snprintf(inside, sizeof(inside), "%s/x", lock);
    cr_assert_eq(ts_write_file(inside, "x", 1), 0);
    CLI_EXPECT(EX_INDEX, S(), "ls");
    contains(0, "index/store.lock is a directory");
    contains(0, "rm -r");
    CLI_EXPECT(EX_INDEX, S(), "repair-index");
    contains(0, "remove it by hand");
    ts_rmtree(lock);
    lists_one();
    cli_run_limit_s = 0;
}

Test(cli, read_commands_work_on_a_store_the_user_cannot_write)
{
    ctxs_store *st = store_with_model();
    mk(st, "kept", 256, 1, 130);
    mk(st, "other", 256, 1, 70);
    cr_assert_eq(ctxs_store_session_set_pinned(st, "kept", 1), 0);
    ctxs_store_close(st);
    const char *out = dir_of("out");
    cr_assert_eq(mkdir(out, 0777), 0);
    cr_assert_eq(chmod(out, 0777), 0);
    cr_assert_eq(ts_make_unwritable(S()), 0);
    char *before = store_state(S());

    run_unprivileged = 1;
    CLI_EXPECT(EX_OK, S(), "ls", "--json");
    jc_value *v = json_out();
    cr_assert_eq(v->n, 2, "%s", R.out);
    cr_assert(jb(must_by_name(v, "kept"), "pinned"));
    jc_free(v);
    CLI_EXPECT(EX_OK, S(), "info", "kept");
    CLI_EXPECT(EX_OK, S(), "verify");
    CLI_EXPECT(EX_OK, S(), "verify", "kept");
    CLI_EXPECT(EX_OK, S(), "models");
    CLI_EXPECT(EX_OK, S(), "checkpoint", "ls", "kept");
    CLI_EXPECT(EX_OK, S(), "gc", "--max-size", "0", "--dry-run", "--json");
    v = json_out();
    cr_assert_eq(ju(v, "deleted"), 1, "%s", R.out);
    jc_free(v);
    CLI_EXPECT(EX_OK, S(), "export", "kept", ts_path(out, "kept.export"));
    /* What writes fails, and says why. */
    CLI_EXPECT(EX_FAIL, S(), "rm", "other");
    says(0, "permission");
    CLI_EXPECT(EX_FAIL, S(), "pin", "other");
    CLI_EXPECT(EX_FAIL, S(), "gc", "--max-size", "0");
    run_unprivileged = 0;

    same_state(before, S(), "read commands on a store the user cannot write");
    free(before);
    CLI_EXPECT(EX_OK, dir_of("again"), "import", ts_path(out, "kept.export"));
}

Test(cli, pin_keeps_a_session_from_gc_and_gc_names_what_it_deletes)
{
    ctxs_store *st = store_with_model();
    static const char *const names[] = { "oldest", "older", "newer" };
    for (int i = 0; i < 3; i++) {
        mk(st, names[i], 256, 1, 100);
        ts_sleep_us(15000); /* distinct last-use times */
    }
    ctxs_store_close(st);

    CLI_EXPECT(EX_OK, S(), "pin", "oldest", "--json");
    jc_value *v = json_out();
    cr_assert(jc_has_string(jget(v, "pinned"), "oldest"), "%s", R.out);
    jc_free(v);
    CLI_EXPECT(EX_NOTFOUND, S(), "pin", "nobody");
    CLI_EXPECT(EX_OK, S(), "ls");
    char line[1024];
    line_with(line, sizeof(line), "oldest");
    cr_assert(strstr(line, "pinned"), "ls shows the pin: %s", line);
    line_with(line, sizeof(line), "older");
    cr_assert(!strstr(line, "pinned"), "%s", line);

    /* A dry run lists, least recently used first, and deletes nothing. */
    CLI_EXPECT(EX_OK, S(), "gc", "--max-size", "0", "--dry-run");
    contains(1, "would delete 'older'");
    contains(1, "would delete 'newer'");
    contains(1, "kept 1 pinned session");
    cr_assert(!strstr(R.out, "'oldest'"), "%s", R.out);
    cr_assert_lt(strstr(R.out, "'older'"), strstr(R.out, "'newer'"));
    CLI_EXPECT(EX_OK, S(), "ls", "--json");
    v = json_out();
    cr_assert_eq(v->n, 3, "a dry run deleted something: %s", R.out);
    jc_free(v);

    /* The pin stays through a rename; gc names what it deleted. */
    CLI_EXPECT(EX_OK, S(), "rename", "oldest", "kept");
    CLI_EXPECT(EX_OK, S(), "gc", "--max-size", "0", "--json");
    v = json_out();
    cr_assert_eq(jb(v, "dry_run"), 0);
    cr_assert_eq(ju(v, "deleted"), 2, "%s", R.out);
    cr_assert_eq(ju(v, "skipped_pinned"), 1, "%s", R.out);
    const jc_value *del = jget(v, "sessions");
    cr_assert_eq(del->n, 2, "%s", R.out);
    cr_assert_str_eq(js(jc_at(del, 0), "name"), "older");
    cr_assert_str_eq(js(jc_at(del, 1), "name"), "newer");
    jc_free(v);
    CLI_EXPECT(EX_OK, S(), "ls", "--json");
    v = json_out();
    cr_assert_eq(v->n, 1, "%s", R.out);
    cr_assert(jb(must_by_name(v, "kept"), "pinned"));
    jc_free(v);

    CLI_EXPECT(EX_OK, S(), "unpin", "kept");
    contains(1, "unpinned 'kept'");
    CLI_EXPECT(EX_OK, S(), "gc", "--max-size", "0");
    contains(1, "deleted 'kept'");
    contains(1, "deleted 1 session");
}

Test(cli, info_reports_geometry_records_window_checkpoints_and_parent)
{
    ctxs_store *st = store_with_model();
    ctxs_session *s = mk_open(st, "base", 256, 1, 100);
    cr_assert_eq(ctxs_checkpoint_create(s, "cp1"), 0);
    ts_append_many(s, 50);
    ctxs_session_close(s);
    cr_assert_eq(ctxs_store_session_fork(NULL, st, "base", "child", 80, NULL), 0);
    ctxs_session *ro = open_ro(st, "base");
    ctxs_window win;
    cr_assert_eq(ctxs_session_get_window(&win, ro), 0);
    ctxs_session_close(ro);
    ctxs_store_close(st);

    CLI_EXPECT(EX_OK, S(), "info", "base", "--json");
    jc_value *v = json_out();
    cr_assert_eq(v->type, JC_OBJECT);
    cr_assert_str_eq(js(v, "name"), "base");
    cr_assert_str_eq(js(v, "status"), "OK");
    cr_assert_str_eq(js(v, "path"), file_of(S(), "base"));
    cr_assert_str_eq(js(v, "model"), MODEL_NAME);
    cr_assert_eq(ju(v, "geometry.n_layers"), 2);
    cr_assert_eq(ju(v, "geometry.n_kv_heads"), 2);
    cr_assert_eq(ju(v, "geometry.head_dim"), 16);
    cr_assert_str_eq(js(v, "geometry.dtype"), "fp16");
    cr_assert_eq(ju(v, "capacity"), 256);
    cr_assert_eq(ju(v, "n_sink"), 4);
    cr_assert_eq(jb(v, "ring"), 1);
    cr_assert_eq(ju(v, "n_tokens"), 150);
    cr_assert_eq(ju(v, "held"), 150);
    cr_assert_eq(ju(v, "format.major"), CTXS__FORMAT_MAJOR);
    cr_assert_eq(jb(v, "format.header_crc_ok"), 1);
    cr_assert_eq(jb(v, "writer_open"), 0);

    const jc_value *recs = jget(v, "records");
    cr_assert_eq(recs->n, 2);
    int current = 0;
    for (size_t i = 0; i < 2; i++) {
        const jc_value *r = jc_at(recs, i);
        cr_assert_eq(jb(r, "valid"), 1, "record %zu: %s", i, R.out);
        if (jb(r, "current")) {
            current++;
            cr_assert_eq(ju(r, "n_tokens"), 150);
        } else {
            cr_assert_lt(ju(r, "n_tokens"), 150);
        }
    }
    cr_assert_eq(current, 1, "one current record:\n%s", R.out);

    cr_assert_eq(ju(v, "window.n_tokens"), win.n_tokens);
    const jc_value *spans = jget(v, "window.spans");
    cr_assert_eq(spans->n, win.n_spans);
    for (uint32_t i = 0; i < win.n_spans; i++) {
        cr_assert_eq(ju(jc_at(spans, i), "slot"), win.spans[i].slot);
        cr_assert_eq(ju(jc_at(spans, i), "count"), win.spans[i].count);
    }

    const jc_value *cps = jget(v, "checkpoints");
    cr_assert_eq(cps->n, 1);
    cr_assert_str_eq(js(cps, "[0].name"), "cp1");
    cr_assert_eq(ju(cps, "[0].n_tokens"), 100);
    cr_assert_eq(jb(cps, "[0].stale"), 0);
    cr_assert_null(jc_get(v, "parent"));
    jc_free(v);

    CLI_EXPECT(EX_OK, S(), "info", "child", "--json");
    v = json_out();
    cr_assert_eq(ju(v, "n_tokens"), 80);
    cr_assert_str_eq(js(v, "parent.name"), "base");
    cr_assert_eq(ju(v, "parent.tokens"), 80);
    jc_free(v);

    CLI_EXPECT(EX_OK, S(), "info", "base");
    contains(1, "session      base");
    contains(1, "2 layers x 2 KV heads x 16 dims, fp16");
    contains(1, "256 slots, 4 sinks");
    contains(1, "150 committed, 150 held");
    contains(1, "checkpoints  1");
    contains(1, "cp1");
    CLI_EXPECT(EX_OK, S(), "info", "child");
    contains(1, "forked from  base at 80 tokens");

    CLI_EXPECT(EX_NOTFOUND, S(), "info", "nobody");
    contains(0, "nobody");
}

/* =============================================================================
 * verify
 * ========================================================================== */

/* What an operation killed between writing its file and updating the
 * index leaves: sessions/<id>.ctxs that no entry names, and its intent
 * (kind 'C': a create, fork or import killed after linking its file; 'D':
 * a delete killed after dropping the entry, before the unlink), recorded by
 * a process that is gone. Returns the id. */
static uint64_t leave_interrupted(ctxs_store *st, const char *name, char kind)
{
    pid_t gone = fork();
    cr_assert_geq(gone, 0);
    if (gone == 0)
        _exit(0);
    cr_assert_eq(waitpid(gone, NULL, 0), gone);
    mk(st, name, 256, 1, 70);
    uint64_t id = ts_session_entry(st, name).id;
    MDB_txn *txn;
    cr_assert_eq(mdb_txn_begin(st->env, NULL, 0, &txn), 0);
    cr_assert_eq(ctxs__session_unindex(txn, st, id), 0);
    uint8_t idk[8], intent[5] = {(uint8_t)kind, (uint8_t)gone, (uint8_t)(gone >> 8),
                                 (uint8_t)(gone >> 16), (uint8_t)(gone >> 24)};
    ctxs__id_key(idk, id);
    MDB_val key = {8, idk}, val = {sizeof(intent), intent};
    cr_assert_eq(mdb_put(txn, st->pending, &key, &val, 0), 0);
    cr_assert_eq(mdb_txn_commit(txn), 0);
    return id;
}

/* A read-only look (ls, verify --all) does not resolve what crashes left:
 * it must say what each leftover is and what a read-write open does with
 * it, and never count it as damage (whose advice, `compact`, would have the
 * file removed as the leftover it is). */
Test(cli, a_crash_leftover_is_an_interrupted_operation_not_damage)
{
    ctxs_store *st = store_with_model();
    mk(st, "kept", 256, 1, 30);
    uint64_t created = leave_interrupted(st, "half-made", 'C');
    uint64_t deleted = leave_interrupted(st, "half-gone", 'D');
    ctxs_store_close(st);
    cr_assert(ts_exists(ts_id_path(created)) && ts_exists(ts_id_path(deleted)));

    CLI_EXPECT(EX_OK, S(), "verify", "--all");
    cr_expect_eq(count_of(R.out, "DAMAGED"), 0, "verify calls a crash leftover damage:\n%s", R.out);
    cr_expect_eq(count_of(R.out, "pending  "), 2, "verify --all:\n%s", R.out);
    says(1, "a create, fork or import of ");
    says(1, "a delete of ");
    says(1, "removes the file");
    says(1, "all good: 1 session checked");

    CLI_EXPECT(EX_OK, S(), "verify", "--all", "--json");
    jc_value *v = json_out();
    cr_assert_eq(jb(v, "ok"), 1);
    cr_assert_eq(jget(v, "unindexed_files")->n, 0);
    const jc_value *in = jget(v, "interrupted");
    cr_assert_eq(in->n, 2);
    for (size_t i = 0; i < in->n; i++) {
        const jc_value *e = &in->items[i];
        uint64_t id = ju(e, "id");
        cr_assert(id == created || id == deleted);
        cr_assert_str_eq(js(e, "kind"), id == created ? "create" : "delete");
        cr_assert_str_eq(js(e, "action"), "remove_file");
        cr_assert_eq(jb(e, "file_present"), 1);
    }
    jc_free(v);

    CLI_EXPECT(EX_OK, S(), "ls");
    cr_expect_eq(count_of(R.out, "pending: "), 2, "ls:\n%s", R.out);
    cr_assert(ts_exists(ts_id_path(created)) && ts_exists(ts_id_path(deleted)),
              "a read-only command changed the store");

    /* What a read-write open does with them is what they said. */
    CLI_EXPECT(EX_OK, S(), "compact", "--all");
    cr_assert(!ts_exists(ts_id_path(created)) && !ts_exists(ts_id_path(deleted)));
    CLI_EXPECT(EX_OK, S(), "verify", "--all");
    cr_expect_eq(count_of(R.out, "pending"), 0, "%s", R.out);
    CLI_EXPECT(EX_OK, S(), "ls");
    cr_expect_eq(count_of(R.out, "pending"), 0, "%s", R.out);
    contains(1, "kept");
}

/* A file no entry names and no intent explains is damage, as before. */
Test(cli, an_unindexed_file_without_an_intent_is_damage)
{
    ctxs_store *st = store_with_model();
    uint64_t id = leave_interrupted(st, "orphan", 'C');
    ctxs_store_close(st);
    /* The intent gone (by hand), the file stays: nobody owns it. */
    uint8_t idk[8];
    ctxs__id_key(idk, id);
    ts_raw_put(S(), "pending", idk, 8, NULL, 0);
    CLI_EXPECT(EX_DAMAGED, S(), "verify", "--all");
    says(1, "is a session file the index does not know");
    cr_expect_eq(count_of(R.out, "pending"), 0, "%s", R.out);
}

Test(cli, verify_of_a_clean_store_exits_0)
{
    ctxs_store *st = store_with_model();
    mk(st, "one", 256, 1, 130);
    mk(st, "two", 256, 1, 400); /* wrapped */
    mk(st, "three", 256, 0, 1);
    ctxs_store_close(st);

    CLI_EXPECT(EX_OK, S(), "verify");
    contains(1, "ok       one: 130 tokens verified");
    contains(1, "ok       three: 1 token");
    contains(1, "all good: 3 sessions checked");
    CLI_EXPECT(EX_OK, S(), "verify", "--all", "--json");
    jc_value *v = json_out();
    cr_assert_eq(jb(v, "ok"), 1);
    cr_assert_eq(jget(v, "unindexed_files")->n, 0);
    const jc_value *ses = jget(v, "sessions");
    cr_assert_eq(ses->n, 3);
    const jc_value *two = must_by_name(ses, "two");
    cr_assert_eq(jb(two, "ok"), 1);
    cr_assert_eq(ju(two, "bad_tokens"), 0);
    cr_assert_eq(ju(two, "tokens_checked"), 256, "a wrapped ring holds its capacity");
    cr_assert_eq(jget(two, "bad_chunks")->n, 0);
    jc_free(v);
    CLI_EXPECT(EX_OK, S(), "verify", "two");
    contains(1, "ok       two: 256 tokens verified");
}

Test(cli, verify_names_the_session_chunks_and_tokens_of_flipped_kv_bytes)
{
    ctxs_store *st = store_with_model();
    mk(st, "victim", 256, 1, 200);
    mk(st, "bystander", 256, 1, 200);
    mk(st, "wrapped", 256, 1, 400);
    ctxs_store_close(st);
    /* In a wrapped ring, position 390 lives in slot 4 + 386 % 252. */
    const char *w = file_of(S(), "wrapped");
    flip(w, kv_offset(w, 0, CTXS_V, 1, 390) + 5, 0x02);
    const char *f = file_of(S(), "victim");
    flip(f, kv_offset(f, 1, CTXS_V, 1, 10) + 3, 0x01);   /* chunk 0 */
    flip(f, kv_offset(f, 0, CTXS_K, 0, 100) + 31, 0x80); /* chunk 1 */
    flip(f, kv_offset(f, 1, CTXS_K, 1, 101), 0x40);

    CLI_EXPECT(EX_DAMAGED, S(), "verify");
    contains(1, "DAMAGED  victim: 3 of 200 tokens fail their checksums");
    contains(1, "chunk 0 (tokens 0-63): 1 bad, from token 10 to 10");
    contains(1, "chunk 1 (tokens 64-127): 2 bad, from token 100 to 101");
    contains(1, "ctxstore fork victim NEW --at 10");
    contains(1, "ok       bystander: 200 tokens verified");
    contains(1, "DAMAGE FOUND");

    CLI_EXPECT(EX_DAMAGED, S(), "verify", "--json");
    jc_value *v = json_out();
    cr_assert_eq(jb(v, "ok"), 0);
    const jc_value *vic = must_by_name(jget(v, "sessions"), "victim");
    cr_assert_eq(jb(vic, "ok"), 0);
    cr_assert_str_eq(js(vic, "status"), "CTXS_ECORRUPT");
    cr_assert_eq(ju(vic, "bad_tokens"), 3);
    cr_assert_eq(ju(vic, "tokens_checked"), 200);
    const jc_value *ch = jget(vic, "bad_chunks");
    cr_assert_eq(ch->n, 2);
    cr_assert_eq(ju(ch, "[0].chunk"), 0);
    cr_assert_eq(ju(ch, "[0].first_token"), 0);
    cr_assert_eq(ju(ch, "[0].last_token"), 63);
    cr_assert_eq(jget(ch, "[0].bad_tokens")->n, 1);
    cr_assert_eq(ju(ch, "[0].bad_tokens[0]"), 10);
    cr_assert_eq(ju(ch, "[1].chunk"), 1);
    cr_assert_eq(ju(ch, "[1].first_token"), 64);
    cr_assert_eq(ju(ch, "[1].last_token"), 127);
    cr_assert_eq(jget(ch, "[1].bad_tokens")->n, 2);
    cr_assert_eq(ju(ch, "[1].bad_tokens[0]"), 100);
    cr_assert_eq(ju(ch, "[1].bad_tokens[1]"), 101);
    cr_assert_eq(jb(must_by_name(jget(v, "sessions"), "bystander"), "ok"), 1);
    const jc_value *wr = must_by_name(jget(v, "sessions"), "wrapped");
    cr_assert_eq(ju(wr, "bad_tokens"), 1);
    cr_assert_eq(ju(wr, "tokens_checked"), 256);
    cr_assert_eq(ju(wr, "bad_chunks[0].chunk"), 6);
    cr_assert_eq(ju(wr, "bad_chunks[0].bad_tokens[0]"), 390);
    jc_free(v);

    CLI_EXPECT(EX_DAMAGED, S(), "verify", "wrapped");
    contains(1, "DAMAGED  wrapped: 1 of 256 tokens fail their checksums");
    contains(1, "chunk 6 (tokens 384-447): 1 bad, from token 390 to 390");
    CLI_EXPECT(EX_DAMAGED, S(), "verify", "victim");
    contains(1, "chunk 1 (tokens 64-127)");
    CLI_EXPECT(EX_OK, S(), "verify", "bystander");
}

Test(cli, verify_names_the_tokens_an_open_after_a_reboot_would_drop)
{
    store_with_session("reboot", 256, 1, 70);
    const char *f = file_of(S(), "reboot");
    ctxs_file_report rep;
    cr_assert_eq(ctxs_file_inspect(&rep, f), 0);
    const ctxs_record_report *cur = rep.records[0].current ? &rep.records[0] : &rep.records[1];
    cr_assert_leq(cur->verified_from, 60, "the test needs token 60 above the watermark");
    /* As after a power loss: the records are not of this boot, and a token
     * after the watermark did not reach the disk intact. */
    forget_boot_id(f);
    flip(f, kv_offset(f, 1, CTXS_K, 0, 60) + 7, 0x08);

    CLI_EXPECT(EX_DAMAGED, S(), "verify", "--json");
    jc_value *v = json_out();
    const jc_value *r = must_by_name(jget(v, "sessions"), "reboot");
    cr_assert_eq(jb(r, "ok"), 0);
    cr_assert_eq(ju(r, "recovery_dropped"), 10, "%s", R.out);
    cr_assert_eq(ju(r, "tokens_checked"), 60, "%s", R.out);
    cr_assert_eq(ju(r, "bad_tokens"), 1, "%s", R.out);
    cr_assert_eq(ju(r, "bad_chunks[0].bad_tokens[0]"), 60, "%s", R.out);
    cr_assert(strstr(js(r, "problem"), "claims 10 more tokens, from token 60"), "%s", R.out);
    jc_free(v);
    CLI_EXPECT(EX_DAMAGED, S(), "verify", "reboot");
    contains(1, "chunk 0 (tokens 0-63): 1 bad, from token 60 to 60");
    /* verify changed nothing: the file still claims its 70 tokens. */
    cr_assert_eq(ctxs_file_inspect(&rep, f), 0);
    cur = rep.records[0].current ? &rep.records[0] : &rep.records[1];
    cr_assert_eq(cur->n_tokens, 70);
}

Test(cli, verify_reports_a_damaged_commit_record)
{
    store_with_session("rec", 256, 1, 120);
    const char *f = file_of(S(), "rec");
    ctxs_file_report rep;
    cr_assert_eq(ctxs_file_inspect(&rep, f), 0);
    int cur = rep.records[0].current ? 0 : 1;
    cr_assert(rep.records[cur].current);
    /* A byte of the current record's reserved area: only its CRC sees it. */
    flip(f, (cur ? CTXS__RECORD1_OFF : CTXS__RECORD0_OFF) + 70, 0x04);

    char want[64];
    snprintf(want, sizeof(want), "commit record %d is damaged", cur);
    CLI_EXPECT(EX_DAMAGED, S(), "verify");
    contains(1, "DAMAGED  rec");
    contains(1, want);
    CLI_EXPECT(EX_DAMAGED, S(), "verify", "rec", "--json");
    jc_value *v = json_out();
    cr_assert_eq(jb(v, "ok"), 0);
    const jc_value *r = must_by_name(jget(v, "sessions"), "rec");
    cr_assert_eq(jb(r, "ok"), 0);
    cr_assert(strstr(js(r, "problem"), want), "%s", R.out);
    jc_free(v);

    CLI_EXPECT(EX_OK, S(), "info", "rec", "--json");
    v = json_out();
    char path[32];
    snprintf(path, sizeof(path), "records[%d].valid", cur);
    cr_assert_eq(jb(v, path), 0, "info shows the damaged record:\n%s", R.out);
    jc_free(v);
}

Test(cli, verify_reports_a_header_with_a_flipped_byte)
{
    ctxs_store *st = store_with_model();
    mk(st, "hdr", 256, 1, 50);
    mk(st, "fine", 256, 1, 50);
    ctxs_store_close(st);
    const char *f = file_of(S(), "hdr");
    flip(f, offsetof(ctxs__disk_header, created_unix_ms) + 2, 0x20);

    CLI_EXPECT(EX_DAMAGED, S(), "verify");
    contains(1, "DAMAGED  hdr");
    contains(1, "header");
    contains(1, "ok       fine");
    CLI_EXPECT(EX_DAMAGED, S(), "verify", "--json");
    jc_value *v = json_out();
    const jc_value *h = must_by_name(jget(v, "sessions"), "hdr");
    cr_assert_eq(jb(h, "ok"), 0);
    cr_assert_str_eq(js(h, "status"), "CTXS_ECORRUPT");
    cr_assert(strstr(js(h, "problem"), "header"), "%s", R.out);
    jc_free(v);

    CLI_EXPECT(EX_OK, S(), "info", "hdr", "--json");
    v = json_out();
    cr_assert_eq(jb(v, "format.header_crc_ok"), 0);
    cr_assert_str_eq(js(v, "status"), "CTXS_ECORRUPT");
    jc_free(v);
    CLI_EXPECT(EX_OK, S(), "info", "hdr");
    contains(1, "DOES NOT OPEN");
}

Test(cli, verify_reports_a_session_file_deleted_behind_the_index)
{
    ctxs_store *st = store_with_model();
    mk(st, "gone", 256, 1, 50);
    mk(st, "here", 256, 1, 50);
    ctxs_store_close(st);
    const char *f = file_of(S(), "gone");
    cr_assert_eq(unlink(f), 0);

    CLI_EXPECT(EX_DAMAGED, S(), "verify");
    contains(1, "DAMAGED  gone");
    contains(1, "ok       here");
    CLI_EXPECT(EX_DAMAGED, S(), "verify", "--json");
    jc_value *v = json_out();
    const jc_value *g = must_by_name(jget(v, "sessions"), "gone");
    cr_assert_eq(jb(g, "ok"), 0);
    cr_assert_str_eq(js(g, "status"), "ENOENT");
    jc_free(v);
    CLI_EXPECT(EX_OK, S(), "ls", "--json");
    v = json_out();
    cr_assert(jc_has_string(jget(must_by_name(v, "gone"), "flags"), "failed"), "%s", R.out);
    jc_free(v);
}

Test(cli, verify_reports_a_session_file_the_index_does_not_know)
{
    store_with_session("known", 256, 1, 50);
    size_t len;
    uint8_t *data = ts_read_file(file_of(S(), "known"), &len);
    cr_assert_eq(ts_write_file(ts_path(S(), "sessions/00000000deadbeef.ctxs"), data, len), 0);
    free(data);

    CLI_EXPECT(EX_DAMAGED, S(), "verify");
    contains(1, "00000000deadbeef.ctxs is a session file the index does not know");
    contains(1, "ok       known");
    CLI_EXPECT(EX_DAMAGED, S(), "verify", "--json");
    jc_value *v = json_out();
    cr_assert_eq(jb(v, "ok"), 0);
    cr_assert(jc_has_string(jget(v, "unindexed_files"), "00000000deadbeef.ctxs"), "%s", R.out);
    cr_assert_eq(jb(must_by_name(jget(v, "sessions"), "known"), "ok"), 1);
    jc_free(v);
    /* One session is checked alone; the stray is not its business. */
    CLI_EXPECT(EX_OK, S(), "verify", "known");
}

/* =============================================================================
 * gc and rm
 * ========================================================================== */

Test(cli, gc_deletes_least_recently_used_first_and_keeps_open_ones)
{
    ctxs_store *st = store_with_model();
    static const char *const names[] = { "oldest", "older", "newer", "newest" };
    for (int i = 0; i < 4; i++) {
        mk(st, names[i], 256, 1, 100);
        ts_sleep_us(15000); /* distinct last-use times */
    }
    ctxs_session *held = open_ro(st, "oldest");

    CLI_EXPECT(EX_OK, S(), "ls", "--json");
    jc_value *v = json_out();
    uint64_t disk[4];
    for (int i = 0; i < 4; i++)
        disk[i] = ju(must_by_name(v, names[i]), "disk_bytes");
    jc_free(v);
    /* Room for the open one and one more: "older" and "newer" must go. */
    uint64_t small = disk[1] < disk[2] ? disk[1] : disk[2];
    uint64_t budget = disk[0] + disk[3] + small / 2;
    char arg[32];
    snprintf(arg, sizeof(arg), "%llu", (unsigned long long)budget);

    CLI_EXPECT(EX_OK, S(), "gc", "--max-size", arg, "--json");
    v = json_out();
    cr_assert_eq(ju(v, "budget_bytes"), budget);
    cr_assert_eq(ju(v, "deleted"), 2, "%s", R.out);
    cr_assert_eq(ju(v, "skipped_open"), 1, "%s", R.out);
    cr_assert_leq(ju(v, "bytes_after"), budget);
    cr_assert_gt(ju(v, "bytes_before"), ju(v, "bytes_after"));
    jc_free(v);

    CLI_EXPECT(EX_OK, S(), "ls", "--json");
    v = json_out();
    cr_assert_eq(v->n, 2, "%s", R.out);
    cr_assert_not_null(by_name(v, "oldest"), "the open session was deleted: %s", R.out);
    cr_assert_not_null(by_name(v, "newest"), "the newest session was deleted: %s", R.out);
    jc_free(v);

    /* A budget of nothing keeps only the open one. */
    CLI_EXPECT(EX_OK, S(), "gc", "--max-size", "0");
    contains(1, "deleted 1 session");
    contains(1, "kept 1 open session");
    ctxs_session_close(held);
    ctxs_store_close(st);
    CLI_EXPECT(EX_OK, S(), "ls", "--json");
    v = json_out();
    cr_assert_eq(v->n, 1);
    cr_assert_not_null(by_name(v, "oldest"));
    jc_free(v);
    CLI_EXPECT(EX_OK, S(), "gc", "--max-size", "10G");
    contains(1, "deleted 0 sessions");
}

Test(cli, rm_deletes_one_or_several_and_refuses_missing_and_open_sessions)
{
    ctxs_store *st = store_with_model();
    static const char *const names[] = { "a", "b", "c", "d", "e" };
    for (int i = 0; i < 5; i++)
        mk(st, names[i], 256, 1, 20);
    ctxs_session *held = mk_open(st, "open", 256, 1, 20);
    const char *fa = file_of(S(), "a"), *fd = file_of(S(), "d");

    CLI_EXPECT(EX_OK, S(), "rm", "a");
    cr_assert_not(ts_exists(fa), "rm left the file of a");
    contains(1, "removed 'a' (20 tokens)");
    CLI_EXPECT(EX_OK, S(), "rm", "b", "c", "--json");
    jc_value *v = json_out();
    cr_assert_null(jc_get(v, "error"), "%s", R.out);
    cr_assert_eq(jget(v, "removed")->n, 2, "%s", R.out);
    cr_assert_eq(ju(must_by_name(jget(v, "removed"), "b"), "n_tokens"), 20);
    cr_assert_not_null(must_by_name(jget(v, "removed"), "c"));
    jc_free(v);
    CLI_EXPECT(EX_NOTFOUND, S(), "rm", "missing");
    contains(0, "missing");
    cr_assert_eq(R.out_len, 0, "rm removed nothing but says:\n%s", R.out);
    /* Every name is tried; the first failure decides the exit code, and
     * the one document has it beside what was removed. */
    CLI_EXPECT(EX_NOTFOUND, S(), "rm", "d", "missing", "e", "--json");
    cr_assert_not(ts_exists(fd));
    v = json_error_out(CTXS_ENOTFOUND, "CTXS_ENOTFOUND");
    cr_assert(strstr(js(v, "error.message"), "'missing'"), "%s", R.out);
    cr_assert_eq(jget(v, "removed")->n, 2, "%s", R.out);
    cr_assert_not_null(must_by_name(jget(v, "removed"), "d"));
    cr_assert_not_null(must_by_name(jget(v, "removed"), "e"));
    jc_free(v);
    CLI_EXPECT(EX_BUSY, S(), "rm", "open", "--json");
    contains(0, "open");
    v = json_error_out(CTXS_EBUSY, "CTXS_EBUSY");
    cr_assert_eq(jget(v, "removed")->n, 0, "%s", R.out);
    jc_free(v);

    CLI_EXPECT(EX_OK, S(), "ls", "--json");
    v = json_out();
    cr_assert_eq(v->n, 1, "%s", R.out);
    cr_assert_not_null(by_name(v, "open"));
    jc_free(v);
    cr_assert_eq(ts_dir_entries(ts_path(S(), "sessions")), 1);

    ctxs_session_close(held);
    ctxs_store_close(st);
    CLI_EXPECT(EX_OK, S(), "rm", "open");
    cr_assert_eq(ts_dir_entries(ts_path(S(), "sessions")), 0);
}

/* =============================================================================
 * fork and checkpoints
 * ========================================================================== */

Test(cli, fork_at_a_count_at_a_checkpoint_and_in_full)
{
    ctxs_store *st = store_with_model();
    ctxs_session *s = mk_open(st, "src", 256, 1, 120);
    cr_assert_eq(ctxs_checkpoint_create(s, "mid"), 0);
    ts_append_many(s, 30);
    ctxs_session_close(s);
    ctxs_store_close(st);

    CLI_EXPECT(EX_OK, S(), "fork", "src", "at50", "--at", "50", "--json");
    jc_value *v = json_out();
    cr_assert_str_eq(js(v, "name"), "at50");
    cr_assert_eq(ju(v, "n_tokens"), 50);
    jc_free(v);
    CLI_EXPECT(EX_OK, S(), "fork", "src", "atcp", "--checkpoint", "mid");
    contains(1, "at 120 tokens");
    CLI_EXPECT(EX_OK, S(), "fork", "--at", "0", "src", "empty");
    CLI_EXPECT(EX_OK, S(), "fork", "src", "all");
    contains(1, "forked 'src' into 'all' at 150 tokens");

    st = ts_store_open(S());
    static const struct {
        const char *name;
        uint64_t n;
    } want[] = { { "at50", 50 }, { "atcp", 120 }, { "empty", 0 }, { "all", 150 } };
    for (size_t i = 0; i < 4; i++) {
        ctxs_session *f = open_ro(st, want[i].name);
        cr_assert_eq(ts_info(f).n_tokens, want[i].n, "%s", want[i].name);
        cr_assert_eq(ts_check_all(f), 0, "%s does not hold src's tokens", want[i].name);
        ctxs_session_close(f);
    }
    ctxs_store_close(st);

    char *before = store_state(S());
    CLI_EXPECT(EX_USAGE, S(), "fork", "src", "x", "--at", "5", "--checkpoint", "mid");
    contains(0, "usage: ctxstore fork");
    CLI_EXPECT(EX_USAGE, S(), "fork", "src", "x", "--at", "151");
    CLI_EXPECT(EX_NOTFOUND, S(), "fork", "nobody", "x");
    CLI_EXPECT(EX_NOTFOUND, S(), "fork", "src", "x", "--checkpoint", "nocp");
    CLI_EXPECT(EX_EXIST, S(), "fork", "src", "all");
    same_state(before, S(), "forks that were refused");
    /* The largest count is a count too, not "all of it". */
    CLI(S(), "fork", "src", "x", "--at", "18446744073709551615");
    cr_expect_eq(R.code, EX_USAGE, "`%s` exited %d:\n%s%s", R.what, R.code, R.out, R.err);
    CLI(S(), "fork", "src", "y", "--at", "18446744073709551615", "--checkpoint", "mid");
    cr_expect_eq(R.code, EX_USAGE, "`%s` exited %d:\n%s%s", R.what, R.code, R.out, R.err);
    free(before);
}

Test(cli, checkpoint_create_ls_restore_and_rm)
{
    store_with_session("chat", 256, 1, 100);

    CLI_EXPECT(EX_OK, S(), "checkpoint", "create", "chat", "turn1");
    contains(1, "created checkpoint 'turn1' of 'chat' at 100 tokens");
    CLI_EXPECT(EX_EXIST, S(), "checkpoint", "create", "chat", "turn1");
    ctxs_store *st = ts_store_open(S());
    ctxs_session *s = open_rw(st, "chat");
    ts_append_many(s, 40);
    ctxs_session_close(s);
    ctxs_store_close(st);
    CLI_EXPECT(EX_OK, S(), "checkpoint", "create", "chat", "turn2", "--json");
    jc_value *v = json_out();
    cr_assert_str_eq(js(v, "session"), "chat");
    cr_assert_str_eq(js(v, "checkpoint"), "turn2");
    cr_assert_str_eq(js(v, "action"), "created");
    cr_assert_eq(ju(v, "n_tokens"), 140);
    jc_free(v);

    CLI_EXPECT(EX_OK, S(), "checkpoint", "ls", "chat", "--json");
    v = json_out();
    cr_assert_eq(v->n, 2, "%s", R.out);
    cr_assert_eq(ju(must_by_name(v, "turn1"), "n_tokens"), 100);
    cr_assert_eq(ju(must_by_name(v, "turn2"), "n_tokens"), 140);
    cr_assert_eq(jb(must_by_name(v, "turn1"), "stale"), 0);
    cr_assert_gt(ju(must_by_name(v, "turn1"), "created_unix_ms"), 0);
    jc_free(v);
    CLI_EXPECT(EX_OK, S(), "checkpoint", "ls", "chat");
    contains(1, "turn1");
    contains(1, "turn2");

    /* A writer holds the session: restore refuses, nothing moves. */
    st = ts_store_open(S());
    s = open_rw(st, "chat");
    CLI_EXPECT(EX_BUSY, S(), "checkpoint", "restore", "chat", "turn1");
    cr_assert_eq(ts_info(s).n_tokens, 140);
    ctxs_session_close(s);
    ctxs_store_close(st);

    CLI_EXPECT(EX_OK, S(), "checkpoint", "restore", "chat", "turn1");
    contains(1, "restored 'chat' to checkpoint 'turn1': 140 -> 100 tokens");
    CLI_EXPECT(EX_OK, S(), "ls", "--json");
    v = json_out();
    cr_assert_eq(ju(must_by_name(v, "chat"), "n_tokens"), 100, "%s", R.out);
    cr_assert_not(jc_has_string(jget(must_by_name(v, "chat"), "flags"), "rolled-back"),
                  "the index was not brought up to date by the restore:\n%s", R.out);
    jc_free(v);
    /* A checkpoint of a session a writer holds names what it committed. */
    st = ts_store_open(S());
    s = open_rw(st, "chat");
    ts_append_many(s, 10);
    CLI_EXPECT(EX_OK, S(), "checkpoint", "create", "chat", "live");
    ctxs_session_close(s);
    ctxs_store_close(st);
    CLI_EXPECT(EX_OK, S(), "checkpoint", "ls", "chat", "--json");
    v = json_out();
    cr_assert_eq(ju(must_by_name(v, "live"), "n_tokens"), 110, "%s", R.out);
    jc_free(v);
    CLI_EXPECT(EX_OK, S(), "checkpoint", "restore", "chat", "turn1", "--json");
    v = json_out();
    cr_assert_str_eq(js(v, "session"), "chat");
    cr_assert_str_eq(js(v, "checkpoint"), "turn1");
    cr_assert_str_eq(js(v, "action"), "restored");
    cr_assert_eq(ju(v, "n_tokens"), 100);
    cr_assert_eq(ju(v, "n_tokens_before"), 110);
    jc_free(v);
    CLI_EXPECT(EX_OK, S(), "checkpoint", "rm", "chat", "live");
    contains(1, "removed checkpoint 'live' of 'chat' at 110 tokens");
    st = ts_store_open(S());
    s = open_ro(st, "chat");
    cr_assert_eq(ts_info(s).n_tokens, 100);
    cr_assert_eq(ts_check_all(s), 0);
    ctxs_session_close(s);
    ctxs_store_close(st);

    CLI_EXPECT(EX_NOTFOUND, S(), "checkpoint", "restore", "chat", "nocp");
    CLI_EXPECT(EX_NOTFOUND, S(), "checkpoint", "ls", "nobody");
    CLI_EXPECT(EX_NOTFOUND, S(), "checkpoint", "create", "nobody", "x");
    CLI_EXPECT(EX_OK, S(), "checkpoint", "rm", "chat", "turn2", "--json");
    v = json_out();
    cr_assert_str_eq(js(v, "checkpoint"), "turn2");
    cr_assert_str_eq(js(v, "action"), "removed");
    cr_assert_eq(ju(v, "n_tokens"), 140);
    jc_free(v);
    CLI_EXPECT(EX_NOTFOUND, S(), "checkpoint", "rm", "chat", "turn2");
    CLI_EXPECT(EX_OK, S(), "checkpoint", "ls", "chat", "--json");
    v = json_out();
    cr_assert_eq(v->n, 1, "%s", R.out);
    cr_assert_not_null(by_name(v, "turn1"));
    jc_free(v);
}

/* =============================================================================
 * rename, models and prefix
 * ========================================================================== */

Test(cli, rename_says_what_it_did_and_why_it_refuses)
{
    ctxs_store *st = store_with_model();
    ctxs_session *s = mk_open(st, "chat", 256, 1, 50);
    cr_assert_eq(ctxs_checkpoint_create(s, "cp"), 0);
    ctxs_session_close(s);
    mk(st, "other", 256, 1, 20);
    ctxs_session_entry e0;
    cr_assert_eq(ctxs_store_session_get(&e0, st, "chat"), 0);
    ctxs_store_close(st);
    const char *file = file_of(S(), "chat");

    CLI_EXPECT(EX_OK, S(), "rename", "chat", "talk");
    contains(1, "renamed 'chat' to 'talk' (50 tokens)");
    CLI_EXPECT(EX_OK, S(), "rename", "talk", ODD_NAME, "--json");
    jc_value *v = json_out();
    cr_assert_str_eq(js(v, "name"), ODD_NAME);
    cr_assert_str_eq(js(v, "old_name"), "talk");
    cr_assert_eq(ju(v, "id"), e0.id);
    cr_assert_eq(ju(v, "n_tokens"), 50);
    jc_free(v);
    /* The same session: its file, tokens and checkpoints. */
    st = ts_store_open(S());
    ctxs_session_entry e;
    cr_assert_eq(ctxs_store_session_get(&e, st, "chat"), CTXS_ENOTFOUND);
    cr_assert_eq(ctxs_store_session_get(&e, st, ODD_NAME), 0);
    cr_assert_eq(e.id, e0.id);
    ctxs_store_close(st);
    cr_assert_str_eq(file_of(S(), ODD_NAME), file);
    CLI_EXPECT(EX_OK, S(), "checkpoint", "ls", ODD_NAME, "--json");
    v = json_out();
    cr_assert_eq(ju(must_by_name(v, "cp"), "n_tokens"), 50, "%s", R.out);
    jc_free(v);

    char *before = store_state(S());
    CLI_EXPECT(EX_NOTFOUND, S(), "rename", "nobody", "x", "--json");
    v = json_error_out(CTXS_ENOTFOUND, "CTXS_ENOTFOUND");
    cr_assert(strstr(js(v, "error.message"), "session 'nobody'"), "%s", R.out);
    cr_assert_str_eq(hint_of(v), "`ctxstore ls` lists the sessions");
    jc_free(v);
    CLI_EXPECT(EX_EXIST, S(), "rename", ODD_NAME, "other", "--json");
    v = json_error_out(CTXS_ETAKEN, "CTXS_ETAKEN");
    cr_assert(strstr(js(v, "error.message"), "to 'other'"), "%s", R.out);
    cr_assert(strstr(hint_of(v), "choose another NEW"), "%s", R.out);
    jc_free(v);
    CLI_EXPECT(EX_EXIST, S(), "rename", ODD_NAME, "other");
    contains(0, "choose another NEW");
    static const char *const refused[][2] = { { "other", "a/b" }, { "x..y", "fine" } };
    for (size_t i = 0; i < 2; i++) {
        CLI_EXPECT(EX_USAGE, S(), "rename", refused[i][0], refused[i][1], "--json");
        v = json_error_out(CTXS_EINVAL, "CTXS_EINVAL");
        cr_assert(strstr(hint_of(v), "1 to 255 bytes"), "%s", R.out);
        jc_free(v);
    }
    same_state(before, S(), "renames that were refused");
    free(before);

    /* A writer's handle stays valid, and its tokens go with the name;
     * the label in the file too, which reindex reads. */
    st = ts_store_open(S());
    s = open_rw(st, "other");
    CLI_EXPECT(EX_OK, S(), "rename", "other", "renamed");
    ts_append_many(s, 10);
    ctxs_session_close(s);
    s = open_ro(st, "renamed");
    cr_assert_eq(ts_info(s).n_tokens, 30);
    cr_assert_eq(ts_check_all(s), 0);
    ctxs_session_close(s);
    ctxs_store_close(st);
    ts_rmtree(ts_path(S(), "index"));
    CLI_EXPECT(EX_OK, S(), "reindex");
    CLI_EXPECT(EX_OK, S(), "ls", "--json");
    v = json_out();
    cr_assert_eq(ju(must_by_name(v, "renamed"), "n_tokens"), 30, "%s", R.out);
    cr_assert_not_null(must_by_name(v, ODD_NAME));
    jc_free(v);
}

/* 32 lowercase hex digits of h. */
static const char *hex_of(const uint8_t h[16])
{
    static char bufs[4][33];
    static unsigned next;
    char *b = bufs[next++ % 4];
    for (int i = 0; i < 16; i++)
        snprintf(b + 2 * i, 3, "%02x", h[i]);
    return b;
}

/* Writes a file of n bytes that seed makes different, in the scratch
 * area, and returns its path and (in hash) its XXH3-128. */
static const char *weights_file(const char *name, size_t n, uint8_t seed, uint8_t hash[16])
{
    uint8_t *buf = malloc(n);
    cr_assert_not_null(buf);
    for (size_t i = 0; i < n; i++)
        buf[i] = (uint8_t)(i * 131 + seed * 7 + (i >> 9));
    const char *path = dir_of(name);
    cr_assert_eq(ts_write_file(path, buf, n), 0);
    free(buf);
    cr_assert_eq(ctxs_model_hash_file(hash, NULL, path), 0);
    return path;
}

/* The registered model with hash h, read through the library. */
static ctxs_model_entry model_of(const uint8_t h[16])
{
    ctxs_store *st = ts_store_open(S());
    ctxs_model_entry e;
    int rc = ctxs_model_get(&e, st, h);
    cr_assert_eq(rc, 0, "model %s: %s", hex_of(h), ctxs_err_name(rc));
    ctxs_store_close(st);
    return e;
}

Test(cli, models_lists_what_is_registered)
{
    ctxs_store *st = store_with_model();
    ctxs_model unnamed = ts_model(9);
    cr_assert_eq(ctxs_model_register(st, &unnamed, NULL), 0);
    ctxs_store_close(st);
    ctxs_model m = model();

    CLI_EXPECT(EX_OK, S(), "models", "--json");
    jc_value *v = json_out();
    cr_assert_eq(v->type, JC_ARRAY);
    cr_assert_eq(v->n, 2, "%s", R.out);
    const jc_value *a = by_name(v, MODEL_NAME);
    cr_assert_not_null(a, "%s", R.out);
    cr_assert_str_eq(js(a, "model_hash"), hex_of(m.model_hash));
    cr_assert_eq(ju(a, "geometry.n_layers"), m.geometry.n_layers);
    cr_assert_eq(ju(a, "geometry.n_kv_heads"), m.geometry.n_kv_heads);
    cr_assert_eq(ju(a, "geometry.head_dim"), 16);
    cr_assert_str_eq(js(a, "geometry.dtype"), "fp16");
    cr_assert_str_eq(js(a, "tokenizer_hash"), hex_of(m.tokenizer_hash));
    cr_assert_gt(ju(a, "registered_unix_ms"), 0);
    const jc_value *b = jc_at(v, a == jc_at(v, 0) ? 1 : 0);
    cr_assert_eq(jget(b, "name")->type, JC_NULL, "an unnamed model's name is null:\n%s", R.out);
    cr_assert_str_eq(js(b, "model_hash"), hex_of(unnamed.model_hash));
    jc_free(v);
    CLI_EXPECT(EX_OK, S(), "models", "ls");
    contains(1, "2 models");
    char line[1024];
    line_with(line, sizeof(line), hex_of(m.model_hash));
    cr_assert(strstr(line, MODEL_NAME) && strstr(line, " fp16 ") && strstr(line, " 16 ") &&
                  strstr(line, hex_of(m.tokenizer_hash)),
              "the model's line: %s", line);
}

/* A model with sliding-window layers: models, info and ls say its
 * schedule, in words and in JSON. */
Test(cli, models_info_and_ls_show_a_layer_schedule)
{
    ctxs_store *st = ts_store_open(S());
    ctxs_model m = ts_model(12);
    m.geometry.period = 2;
    m.geometry.window[0] = 8;
    cr_assert_eq(ctxs_model_register(st, &m, "swa"), 0);
    ctxs_create_options o = ts_options(256, 4, 0, CTXS_SYNC_NONE);
    o.batch = 16;
    ctxs_session *s;
    cr_assert_eq(ctxs_store_session_create(&s, st, "chat", &m, &o), 0);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(ts_append(s, 10), 0);
    ctxs_session_close(s);
    ctxs_store_close(st);

    CLI_EXPECT(EX_OK, S(), "models");
    contains(1, "schedule: repeating every 2 layers: window 8, global");
    CLI_EXPECT(EX_OK, S(), "models", "--json");
    jc_value *v = json_out();
    const jc_value *a = by_name(v, "swa");
    cr_assert_not_null(a, "%s", R.out);
    cr_assert_eq(ju(a, "geometry.schedule.period"), 2);
    const jc_value *w = jget(a, "geometry.schedule.window");
    cr_assert(w && w->type == JC_ARRAY && w->n == 2, "%s", R.out);
    jc_free(v);
    CLI_EXPECT(EX_OK, S(), "info", "chat");
    contains(1, "repeating every 2 layers: window 8, global");
    CLI_EXPECT(EX_OK, S(), "ls", "--json");
    v = json_out();
    cr_assert_eq(ju(must_by_name(v, "chat"), "schedule.period"), 2, "%s", R.out);
    jc_free(v);
}

Test(cli, models_register_hashes_the_weights_and_refuses_another_geometry)
{
    uint8_t h1[16], h2[16], ht[16];
    const char *w1 = weights_file("w1.bin", 300000, 1, h1);
    const char *w2 = weights_file("w2.bin", 5000, 2, h2);
    const char *tok = weights_file("tokenizer.json", 700, 3, ht);
    static const char tok_hex[] = "00112233445566778899aabbccddeeff";

    CLI_EXPECT(EX_OK, S(), "models", "register", w1, "--name", "w-one", "--layers", "4",
               "--kv-heads", "2", "--head-dim", "32", "--tokenizer-hash", tok_hex, "--json");
    jc_value *v = json_out();
    cr_assert_str_eq(js(v, "action"), "registered");
    cr_assert_str_eq(js(v, "model.model_hash"), hex_of(h1));
    cr_assert_str_eq(js(v, "model.name"), "w-one");
    cr_assert_eq(ju(v, "model.geometry.n_layers"), 4);
    cr_assert_eq(ju(v, "model.geometry.head_dim"), 32);
    cr_assert_str_eq(js(v, "model.tokenizer_hash"), tok_hex);
    jc_free(v);
    ctxs_model_entry e = model_of(h1);
    cr_assert_str_eq(e.name, "w-one");
    cr_assert_eq(e.model.geometry.n_layers, 4);
    cr_assert_eq(e.model.geometry.n_kv_heads, 2);
    cr_assert_eq(e.model.geometry.head_dim, 32);
    cr_assert_eq(e.model.geometry.dtype, CTXS_DTYPE_F16);
    cr_assert_str_eq(hex_of(e.model.tokenizer_hash), tok_hex);

    /* A session can be made for it. */
    ctxs_store *st = ts_store_open(S());
    ctxs_session *s = NULL;
    cr_assert_eq(ctxs_store_session_create(&s, st, "on-w1", &e.model, NULL), 0);
    ctxs_session_close(s);
    ctxs_store_close(st);

    CLI_EXPECT(EX_OK, S(), "models", "register", w2, "--name", "w-two", "--layers", "2",
               "--kv-heads", "2", "--head-dim", "16", "--dtype", "fp16", "--tokenizer", tok);
    contains(1, "registered model 'w-two': 2 layers x 2 KV heads x 16 dims, fp16");
    char want[64];
    snprintf(want, sizeof(want), "hash %s", hex_of(h2));
    contains(1, want);
    /* The tokenizer's hash, in its own domain: not the file's weights hash. */
    uint8_t ht_tok[16];
    cr_assert_eq(ctxs_tokenizer_hash_file(ht_tok, NULL, tok), 0);
    cr_assert_str_eq(hex_of(model_of(h2).model.tokenizer_hash), hex_of(ht_tok));
    cr_assert_str_neq(hex_of(ht_tok), hex_of(ht));

    /* Again: a new name, then nothing new. */
    CLI_EXPECT(EX_OK, S(), "models", "register", w2, "--name", "w-2", "--layers", "2",
               "--kv-heads", "2", "--head-dim", "16", "--tokenizer", tok);
    contains(1, "renamed model 'w-two' to 'w-2'");
    CLI_EXPECT(EX_OK, S(), "models", "register", w2, "--name", "w-2", "--layers", "2",
               "--kv-heads", "2", "--head-dim", "16", "--tokenizer", tok, "--json");
    v = json_out();
    cr_assert_str_eq(js(v, "action"), "unchanged");
    jc_free(v);

    /* A model whose sessions keep 8-bit K/V; info names its dtype. */
    uint8_t h3[16];
    const char *w3 = weights_file("w3.bin", 4000, 4, h3);
    CLI_EXPECT(EX_OK, S(), "models", "register", w3, "--name", "w-q8", "--layers", "2",
               "--kv-heads", "2", "--head-dim", "16", "--dtype", "q8");
    contains(1, "registered model 'w-q8': 2 layers x 2 KV heads x 16 dims, q8");
    ctxs_model_entry e3 = model_of(h3);
    cr_assert_eq(e3.model.geometry.dtype, CTXS_DTYPE_Q8);
    st = ts_store_open(S());
    cr_assert_eq(ctxs_store_session_create(&s, st, "on-q8", &e3.model, NULL), 0);
    ctxs_session_close(s);
    ctxs_store_close(st);
    CLI_EXPECT(EX_OK, S(), "info", "on-q8");
    contains(1, "x 16 dims, q8");
    contains(1, ": all it holds");
    cr_assert_neq(CLI(S(), "models", "register", w3, "--name", "w-q8", "--layers", "2",
                      "--kv-heads", "2", "--head-dim", "16", "--dtype", "bf16"),
                  EX_OK, "the same weights registered as another dtype");

    CLI_EXPECT(EX_OK, S(), "models", "--json");
    v = json_out();
    cr_assert_eq(v->n, 3, "w-one, w-2 and w-q8:\n%s", R.out);
    cr_assert_not_null(by_name(v, "w-one"));
    cr_assert_not_null(by_name(v, "w-2"));
    jc_free(v);
}

Test(cli, models_register_refuses_another_geometry_files_that_are_no_weights_and_bad_names)
{
    uint8_t h1[16];
    const char *w1 = weights_file("w1.bin", 300000, 1, h1);
    static const char tok_hex[] = "00112233445566778899aabbccddeeff";
    CLI_EXPECT(EX_OK, S(), "models", "register", w1, "--name", "w-one", "--layers", "4",
               "--kv-heads", "2", "--head-dim", "32", "--tokenizer-hash", tok_hex);
    char *before = store_state(S());

    /* The same hash with another geometry, or another tokenizer. */
    CLI_EXPECT(EX_DAMAGED, S(), "models", "register", w1, "--name", "w-one", "--layers", "5",
               "--kv-heads", "2", "--head-dim", "32", "--tokenizer-hash", tok_hex, "--json");
    jc_value *v = json_error_out(CTXS_EMODEL, "CTXS_EMODEL");
    cr_assert(strstr(js(v, "error.message"), hex_of(h1)) &&
                  strstr(js(v, "error.message"), "another geometry") &&
                  strstr(js(v, "error.message"), "4 layers x 2 KV heads x 32 dims"),
              "%s", R.out);
    cr_assert(strstr(hint_of(v), "--layers"), "%s", R.out);
    cr_assert_not(strstr(R.err, "session"), "no session is involved:\n%s", R.err);
    jc_free(v);
    CLI_EXPECT(EX_DAMAGED, S(), "models", "register", w1, "--name", "w-one", "--layers", "4",
               "--kv-heads", "2", "--head-dim", "32");
    ctxs_model_entry e = model_of(h1);
    cr_assert_eq(e.model.geometry.n_layers, 4, "a refused register changed the model");
    cr_assert_str_eq(hex_of(e.model.tokenizer_hash), tok_hex);

    /* Files that are no weights, and a name that is refused. */
    CLI_EXPECT(EX_NOTFOUND, S(), "models", "register", dir_of("missing.bin"), "--name", "m",
               "--layers", "2", "--kv-heads", "2", "--head-dim", "16", "--json");
    v = json_error_out(-ENOENT, "ENOENT");
    cr_assert(strstr(js(v, "error.message"), "missing.bin"), "%s", R.out);
    jc_free(v);
    CLI_EXPECT(EX_FAIL, S(), "models", "register", ts_scratch, "--name", "m", "--layers", "2",
               "--kv-heads", "2", "--head-dim", "16");
    contains(0, "regular file");
    CLI_EXPECT(EX_NOTFOUND, S(), "models", "register", w1, "--name", "m", "--layers", "2",
               "--kv-heads", "2", "--head-dim", "16", "--tokenizer", dir_of("missing.json"));
    uint8_t h3[16];
    const char *w3 = weights_file("w3.bin", 100, 4, h3);
    CLI_EXPECT(EX_USAGE, S(), "models", "register", w3, "--name", "a/b", "--layers", "2",
               "--kv-heads", "2", "--head-dim", "16", "--json");
    v = json_error_out(CTXS_EINVAL, "CTXS_EINVAL");
    cr_assert(strstr(hint_of(v), "1 to 255 bytes"), "%s", R.out);
    jc_free(v);

    CLI_EXPECT(EX_OK, S(), "models", "--json");
    v = json_out();
    cr_assert_eq(v->n, 1, "only w-one is registered:\n%s", R.out);
    cr_assert_str_eq(js(v, "[0].name"), "w-one");
    jc_free(v);
    same_state(before, S(), "registers that were refused");
    free(before);
}

/* Writes text to a file in the scratch area; returns its path. */
static const char *text_file(const char *name, const char *text)
{
    const char *path = dir_of(name);
    cr_assert_eq(ts_write_file(path, text, strlen(text)), 0);
    return path;
}

/* Checks the last run's `prefix --json` document. */
static void prefix_says(const char *session, uint64_t n_tokens, uint64_t prompt)
{
    jc_value *v = json_out();
    cr_assert_str_eq(js(v, "session"), session, "%s", R.out);
    cr_assert_eq(ju(v, "n_tokens"), n_tokens, "%s", R.out);
    cr_assert_eq(ju(v, "prompt_tokens"), prompt, "%s", R.out);
    ctxs_model m = model();
    cr_assert_str_eq(js(v, "model_hash"), hex_of(m.model_hash));
    jc_free(v);
}

/* The store the prefix tests use: "chat" holds 150 tokens, closed, so its
 * prefixes are indexed; "short" holds 40, less than a chunk. prompt gets
 * 200 ids, the first 150 chat's. Returns how many of them the library
 * finds chat holds. */
static uint64_t prefix_store(uint32_t prompt[200])
{
    ctxs_store *st = store_with_model();
    mk(st, "chat", 256, 1, 150);
    mk(st, "short", 256, 1, 40);
    for (uint64_t i = 0; i < 200; i++)
        prompt[i] = ts_token(i) + (i < 150 ? 0 : 1);
    ctxs_prefix_match want;
    ctxs_model m = model();
    cr_assert_eq(ctxs_prefix_find(&want, st, m.model_hash, prompt, 200), 0);
    cr_assert_str_eq(want.session, "chat");
    cr_assert_geq(want.n_tokens, 128);
    ctxs_store_close(st);
    return want.n_tokens;
}

/* The ids of prompt, separated by sep, in a malloc'ed string. */
static char *prompt_text(const uint32_t *prompt, size_t n, const char *sep)
{
    size_t cap = n * (11 + strlen(sep)) + 1, len = 0;
    char *s = malloc(cap);
    cr_assert_not_null(s);
    s[0] = '\0';
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(s + len, cap - len, "%s%u", i ? sep : "", prompt[i]);
    return s;
}

Test(cli, prefix_finds_the_session_holding_a_prompts_start)
{
    uint32_t prompt[200];
    uint64_t want = prefix_store(prompt);
    ctxs_model m = model();
    char *all = prompt_text(prompt, 200, "\n"), *chunk = prompt_text(prompt, 64, " ");
    char *before = store_state(S());

    /* From a file, by the model's name. */
    CLI_EXPECT(EX_OK, S(), "prefix", "--model", MODEL_NAME, "--tokens-file",
               text_file("prompt.txt", all));
    char line[128];
    snprintf(line, sizeof(line), "'chat' holds the first %llu of the 200 tokens\n",
             (unsigned long long)want);
    contains(1, line);
    /* One id an argument, by the model's hash. */
    const char *args[208] = { "prefix", "--model", hex_of(m.model_hash), "--json" };
    static char ids[200][12];
    for (int i = 0; i < 200; i++) {
        snprintf(ids[i], sizeof(ids[i]), "%u", prompt[i]);
        args[4 + i] = ids[i];
    }
    run_env(S(), NULL, args);
    cr_assert_eq(R.code, EX_OK, "`%s` exited %d:\n%s", R.what, R.code, R.err);
    prefix_says("chat", want, 200);
    /* All in one argument, as "$(cat prompt.txt)" passes them. */
    CLI_EXPECT(EX_OK, S(), "prefix", "--model", MODEL_NAME, all, "--json");
    prefix_says("chat", want, 200);
    /* Exactly the first chunk. */
    CLI_EXPECT(EX_OK, S(), "prefix", "--model", MODEL_NAME, chunk, "--json");
    prefix_says("chat", 64, 64);
    CLI_EXPECT(EX_OK, S(), "prefix", "--model", MODEL_NAME, chunk);
    contains(1, "'chat' holds the first 64 of the 64 tokens");

    /* Two models of one name: the hash decides. */
    ctxs_store *st = ts_store_open(S());
    ctxs_model twin = ts_model(11);
    cr_assert_eq(ctxs_model_register(st, &twin, MODEL_NAME), 0);
    ctxs_store_close(st);
    CLI_EXPECT(EX_USAGE, S(), "prefix", "--model", MODEL_NAME, chunk, "--json");
    jc_value *v = json_error_out(CTXS_EINVAL, "CTXS_EINVAL");
    cr_assert(strstr(hint_of(v), "give the hash"), "%s", R.out);
    jc_free(v);
    CLI_EXPECT(EX_OK, S(), "prefix", "--model", hex_of(m.model_hash), chunk, "--json");
    prefix_says("chat", 64, 64);
    free(before);
    free(all);
    free(chunk);
}

Test(cli, prefix_finds_nothing_for_other_tokens_and_says_why)
{
    uint32_t prompt[200];
    prefix_store(prompt);
    char *chunk = prompt_text(prompt, 64, " ");
    char *before = store_state(S());

    /* Other tokens; a first chunk that differs; less than a chunk. */
    uint32_t other[200];
    for (int i = 0; i < 200; i++)
        other[i] = prompt[i] + 1;
    char *text = prompt_text(other, 200, " ");
    CLI_EXPECT(EX_NOTFOUND, S(), "prefix", "--model", MODEL_NAME, text, "--json");
    jc_value *v = json_error_out(CTXS_ENOTFOUND, "CTXS_ENOTFOUND");
    cr_assert(strstr(js(v, "error.message"), "200 tokens"), "%s", R.out);
    cr_assert(strstr(hint_of(v), "first 64"), "%s", R.out);
    jc_free(v);
    free(text);
    prompt[0]++;
    text = prompt_text(prompt, 200, " ");
    CLI_EXPECT(EX_NOTFOUND, S(), "prefix", "--model", MODEL_NAME, text);
    contains(0, "first 64");
    prompt[0]--;
    free(text);
    text = prompt_text(prompt, 40, " "); /* all of short */
    CLI_EXPECT(EX_NOTFOUND, S(), "prefix", "--model", MODEL_NAME, text, "--json");
    v = json_error_out(CTXS_ENOTFOUND, "CTXS_ENOTFOUND");
    cr_assert(strstr(hint_of(v), "only 40"), "%s", R.out);
    jc_free(v);
    free(text);

    /* A model that is not there; a file that is not there, or holds
     * something else. */
    CLI_EXPECT(EX_NOTFOUND, S(), "prefix", "--model", "nobody", chunk, "--json");
    v = json_error_out(CTXS_ENOTFOUND, "CTXS_ENOTFOUND");
    cr_assert(strstr(js(v, "error.message"), "model 'nobody'"), "%s", R.out);
    cr_assert(strstr(hint_of(v), "`ctxstore models`"), "%s", R.out);
    jc_free(v);
    CLI_EXPECT(EX_NOTFOUND, S(), "prefix", "--model", "0123456789abcdef0123456789ABCDEF", chunk);
    contains(0, "`ctxstore models`");
    CLI_EXPECT(EX_NOTFOUND, S(), "prefix", "--model", MODEL_NAME, "--tokens-file",
               dir_of("missing.txt"), "--json");
    jc_free(json_error_out(-ENOENT, "ENOENT"));
    CLI_EXPECT(EX_USAGE, S(), "prefix", "--model", MODEL_NAME, "--tokens-file",
               text_file("bad.txt", "1 2 three 4"), "--json");
    v = json_error_out(CTXS_EINVAL, "CTXS_EINVAL");
    cr_assert(strstr(js(v, "error.message"), "'three'"), "%s", R.out);
    cr_assert(strstr(hint_of(v), "decimal"), "%s", R.out);
    jc_free(v);
    CLI_EXPECT(EX_USAGE, S(), "prefix", "--model", MODEL_NAME, "--tokens-file",
               text_file("empty.txt", " \n"));
    contains(0, "no token ids");
    CLI_EXPECT(EX_USAGE, S(), "prefix", "--model", MODEL_NAME, "--tokens-file", "-");
    contains(0, "standard input");
    same_state(before, S(), "prefix lookups");
    free(before);
    free(chunk);
}

/* =============================================================================
 * Errors with --json, and the hints
 * ========================================================================== */

Test(cli, json_errors_name_the_code_the_message_and_the_hint)
{
    store_with_session("chat", 256, 1, 50);

    /* A missing session. */
    CLI_EXPECT(EX_NOTFOUND, S(), "info", "nobody", "--json");
    jc_value *v = json_error_out(CTXS_ENOTFOUND, "CTXS_ENOTFOUND");
    cr_assert(strstr(js(v, "error.message"), "'nobody'"), "%s", R.out);
    cr_assert_str_eq(hint_of(v), "`ctxstore ls` lists the sessions");
    jc_free(v);
    CLI_EXPECT(EX_NOTFOUND, S(), "--json", "checkpoint", "ls", "nobody");
    jc_free(json_error_out(CTXS_ENOTFOUND, "CTXS_ENOTFOUND"));
    CLI_EXPECT(EX_NOTFOUND, S(), "export", "nobody", dir_of("x.ctxx"), "--json");
    jc_free(json_error_out(CTXS_ENOTFOUND, "CTXS_ENOTFOUND"));

    /* A missing checkpoint, of restore, rm and fork. */
    static const char *const cp_cmds[][7] = { /* NULL-terminated */
        { "checkpoint", "restore", "chat", "nocp", "--json" },
        { "checkpoint", "rm", "chat", "nocp", "--json" },
        { "fork", "chat", "copy", "--checkpoint", "nocp", "--json" },
    };
    for (size_t i = 0; i < 3; i++) {
        run_env(S(), NULL, cp_cmds[i]);
        cr_assert_eq(R.code, EX_NOTFOUND, "`%s` exited %d:\n%s", R.what, R.code, R.err);
        v = json_error_out(CTXS_ENOTFOUND, "CTXS_ENOTFOUND");
        cr_assert(strstr(js(v, "error.message"), "no checkpoint named 'nocp'"), "%s", R.out);
        cr_assert_str_eq(hint_of(v), "`ctxstore checkpoint ls chat` lists its checkpoints");
        cr_assert_not(strstr(R.err, "`ctxstore ls`"), "`%s` points at ls:\n%s", R.what, R.err);
        jc_free(v);
    }
    /* ...but a missing session there is a missing session. */
    CLI_EXPECT(EX_NOTFOUND, S(), "checkpoint", "restore", "nobody", "cp", "--json");
    v = json_error_out(CTXS_ENOTFOUND, "CTXS_ENOTFOUND");
    cr_assert(strstr(js(v, "error.message"), "session 'nobody'"), "%s", R.out);
    cr_assert_str_eq(hint_of(v), "`ctxstore ls` lists the sessions");
    jc_free(v);

    /* A name that is refused says the rule. */
    static const char *const bad_cmds[][6] = {
        { "checkpoint", "create", "chat", "a/b", "--json" },
        { "fork", "chat", "x..y", "--json" },
        { "info", "tab\tname", "--json" },
        { "rm", "..", "--json" },
        /* Not text: the message that echoes it must still be JSON. */
        { "info", "\xff\xfe", "--json" },
        { "checkpoint", "restore", "chat", "\xc3", "--json" },
    };
    for (size_t i = 0; i < sizeof(bad_cmds) / sizeof(bad_cmds[0]); i++) {
        run_env(S(), NULL, bad_cmds[i]);
        cr_assert_eq(R.code, EX_USAGE, "`%s` exited %d:\n%s", R.what, R.code, R.err);
        v = json_error_out(CTXS_EINVAL, "CTXS_EINVAL");
        const char *h = hint_of(v);
        cr_assert(strstr(h, "1 to 255 bytes") && strstr(h, "'/'") && strstr(h, "'..'") &&
                      strstr(h, "control characters"),
                  "`%s`: the hint does not say the rule: %s", R.what, h);
        contains(0, "1 to 255 bytes");
        jc_free(v);
    }

    /* A usage error, with --json before or after it, is an error object
     * too; without --json stdout stays empty. */
    CLI_EXPECT(EX_USAGE, S(), "--json", "rm", "--bogus");
    v = json_error_out(CTXS_EINVAL, "CTXS_EINVAL");
    cr_assert_str_eq(hint_of(v), "`ctxstore rm --help` says more");
    jc_free(v);
    CLI_EXPECT(EX_USAGE, S(), "frobnicate", "--json");
    jc_free(json_error_out(CTXS_EINVAL, "CTXS_EINVAL"));
    CLI_EXPECT(EX_USAGE, S(), "checkpoint", "create", "chat", "--json");
    jc_free(json_error_out(CTXS_EINVAL, "CTXS_EINVAL"));
    CLI_EXPECT(EX_USAGE, S(), "checkpoint", "create", "chat");
    cr_assert_eq(R.out_len, 0, "%s", R.out);

    /* A busy session: the code and exit code of the library's error. */
    ctxs_store *st = ts_store_open(S());
    ctxs_session *held = open_rw(st, "chat");
    CLI_EXPECT(EX_BUSY, S(), "checkpoint", "restore", "chat", "x", "--json");
    jc_free(json_error_out(CTXS_EBUSY, "CTXS_EBUSY"));
    ctxs_session_close(held);
    ctxs_store_close(st);
}

Test(cli, ls_shows_a_long_model_name_whole_and_aligned)
{
    static const char long_model[] =
        "Qwen3-4B-Instruct-2507-Q4_K_M-with-a-rather-long-quantization-suffix";
    ctxs_store *st = store_with_model();
    ctxs_model m = ts_model(9);
    m.geometry.head_dim = 16;
    cr_assert_eq(ctxs_model_register(st, &m, long_model), 0);
    mk(st, "short", 256, 1, 100);
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = 256;
    o.open.durability = CTXS_SYNC_NONE;
    ctxs_session *s = NULL;
    cr_assert_eq(ctxs_store_session_create(&s, st, "long", &m, &o), 0);
    ts_append_many(s, 7);
    ctxs_session_close(s);
    ctxs_store_close(st);

    CLI_EXPECT(EX_OK, S(), "ls");
    char head[1024], a[1024], b[1024];
    line_with(head, sizeof(head), "NAME");
    line_with(a, sizeof(a), "short");
    line_with(b, sizeof(b), long_model);
    /* The HELD column ends in the same place on every line. */
    size_t end = (size_t)(strstr(head, "HELD") - head) + strlen("HELD");
    cr_assert(strstr(a, " 100 ") && (size_t)(strstr(a, " 100 ") - a) + 4 == end,
              "not aligned:\n%s", R.out);
    cr_assert(strstr(b, " 7 ") && (size_t)(strstr(b, " 7 ") - b) + 2 == end,
              "not aligned:\n%s", R.out);
    CLI_EXPECT(EX_OK, S(), "ls", "--json");
    jc_value *v = json_out();
    cr_assert_str_eq(js(must_by_name(v, "long"), "model"), long_model);
    jc_free(v);
}

/* =============================================================================
 * reindex and compact
 * ========================================================================== */

Test(cli, reindex_after_the_index_is_deleted_brings_the_names_back)
{
    ctxs_store *st = store_with_model();
    mk(st, "first", 256, 1, 64);
    mk(st, "second", 256, 1, 300);
    mk(st, ODD_NAME, 256, 0, 5);
    ctxs_store_close(st);
    ts_rmtree(ts_path(S(), "index"));
    cr_assert_not(ts_exists(ts_path(S(), "index")));

    CLI_EXPECT(EX_OK, S(), "reindex", "--json");
    jc_value *v = json_out();
    cr_assert_eq(ju(v, "sessions"), 3, "%s", R.out);
    cr_assert_eq(ju(v, "skipped"), 0);
    jc_free(v);
    CLI_EXPECT(EX_OK, S(), "ls", "--json");
    v = json_out();
    cr_assert_eq(v->n, 3, "%s", R.out);
    cr_assert_eq(ju(must_by_name(v, "first"), "n_tokens"), 64);
    cr_assert_eq(ju(must_by_name(v, "second"), "n_tokens"), 300);
    cr_assert_eq(ju(must_by_name(v, ODD_NAME), "n_tokens"), 5);
    jc_free(v);
    CLI_EXPECT(EX_OK, S(), "verify");
    CLI_EXPECT(EX_OK, S(), "reindex");
    contains(1, "indexed 3 session files");
}

Test(cli, compact_gives_back_a_rolled_back_sessions_blocks_and_refuses_an_open_one)
{
    ctxs_store *st = store_with_model();
    ctxs_session *s = mk_open(st, "shrunk", 1024, 1, 900);
    cr_assert_eq(ctxs_session_rollback(s, 20), 0);
    ctxs_session_close(s);
    ctxs_session *held = mk_open(st, "busy", 1024, 1, 100);

    CLI_EXPECT(EX_OK, S(), "ls", "--json");
    jc_value *v = json_out();
    uint64_t before = ju(must_by_name(v, "shrunk"), "disk_bytes");
    jc_free(v);

    CLI_EXPECT(EX_BUSY, S(), "compact", "busy");
    contains(0, "busy");
    CLI_EXPECT(EX_OK, S(), "compact", "shrunk", "--json");
    v = json_out();
    cr_assert_eq(ju(v, "sessions"), 1, "%s", R.out);
    cr_assert_gt(ju(v, "bytes_before"), ju(v, "bytes_after"), "%s", R.out);
    jc_free(v);
    CLI_EXPECT(EX_OK, S(), "ls", "--json");
    v = json_out();
    uint64_t after = ju(must_by_name(v, "shrunk"), "disk_bytes");
    cr_assert_lt(after, before, "compact did not give back the rolled-back slots' blocks");
    cr_assert_eq(ju(must_by_name(v, "shrunk"), "n_tokens"), 20);
    jc_free(v);

    /* --all skips the open one and says so. */
    CLI_EXPECT(EX_OK, S(), "compact", "--all", "--json");
    v = json_out();
    cr_assert_eq(ju(v, "skipped_busy"), 1, "%s", R.out);
    jc_free(v);
    CLI_EXPECT(EX_NOTFOUND, S(), "compact", "nobody");
    ctxs_session_close(held);
    ctxs_store_close(st);

    st = ts_store_open(S());
    s = open_ro(st, "shrunk");
    cr_assert_eq(ts_check_all(s), 0, "compact lost held tokens");
    ctxs_session_close(s);
    ctxs_store_close(st);
    CLI_EXPECT(EX_OK, S(), "verify");
}

/* =============================================================================
 * export and import
 * ========================================================================== */

/* Makes "trip" (a wrapped ring) in S() and exports it to the returned
 * path. */
static const char *make_export(void)
{
    store_with_session("trip", 256, 1, 333);
    const char *file = dir_of("trip.ctxx");
    CLI_EXPECT(EX_OK, S(), "export", "trip", file, "--json");
    jc_value *v = json_out();
    cr_assert_str_eq(js(v, "name"), "trip");
    cr_assert_str_eq(js(v, "file"), file);
    struct stat sb;
    cr_assert_eq(stat(file, &sb), 0, "export made no file");
    cr_assert_eq(ju(v, "bytes"), (uint64_t)sb.st_size);
    jc_free(v);
    return file;
}

Test(cli, export_then_import_into_another_store_keeps_every_token)
{
    const char *file = make_export();
    const char *other = dir_of("other");

    CLI_EXPECT(EX_OK, other, "import", file, "--json");
    jc_value *v = json_out();
    cr_assert_str_eq(js(v, "name"), "trip");
    cr_assert_eq(ju(v, "n_tokens"), 333);
    jc_free(v);
    CLI_EXPECT(EX_OK, other, "import", file, "again");
    contains(1, "imported 'again' (333 tokens)");
    CLI_EXPECT(EX_EXIST, other, "import", file);

    ctxs_store *a = ts_store_open(S()), *b = ts_store_open(other);
    ctxs_session *src = open_ro(a, "trip");
    static const char *const names[] = { "trip", "again" };
    for (int i = 0; i < 2; i++) {
        ctxs_session *dst = open_ro(b, names[i]);
        same_tokens(src, dst);
        cr_assert_eq(ts_check_all(dst), 0);
        cr_assert(ts_info(dst).flags & CTXS_INFO_WRAPPED);
        ctxs_session_close(dst);
    }
    ctxs_session_close(src);
    ctxs_model_entry me;
    ctxs_model m = model();
    cr_assert_eq(ctxs_model_get(&me, b, m.model_hash), 0, "import registers the model");
    cr_assert_str_eq(me.name, MODEL_NAME);
    ctxs_store_close(a);
    ctxs_store_close(b);

    CLI_EXPECT(EX_OK, other, "verify");
    CLI_EXPECT(EX_OK, other, "ls", "--json");
    v = json_out();
    cr_assert_eq(ju(must_by_name(v, "again"), "n_tokens"), 333);
    cr_assert_str_eq(js(must_by_name(v, "again"), "model"), MODEL_NAME);
    jc_free(v);

    CLI_EXPECT(EX_EXIST, S(), "export", "trip", file);
    CLI_EXPECT(EX_NOTFOUND, S(), "export", "nobody", dir_of("nobody.ctxx"));
    cr_assert_not(ts_exists(dir_of("nobody.ctxx")));
}

/* Imports path into dir and expects the refusal code, with the store as
 * before. */
static void refused(const char *dir, const char *before, const char *path, int code,
                    const char *what)
{
    /* The code is an expectation: every case is tried and reported. */
    int got = CLI(dir, "import", path, "--json");
    cr_expect_eq(got, code, "import of %s exited %d, expected %d.\nstdout:\n%s\nstderr:\n%s",
                 what, got, code, R.out, R.err);
    cr_assert_neq(got, EX_OK, "import of %s succeeded:\n%s", what, R.out);
    says(0, "nothing was imported");
    /* The one document is the error; a file that is no export is not a
     * session to verify or remove. */
    jc_value *v = json_out();
    const char *h = js(v, "error.hint");
    cr_assert_null(jc_get(v, "name"), "import of %s printed a result:\n%s", what, R.out);
    cr_expect(strstr(h, "nothing was imported") != NULL, "import of %s: hint \"%s\"", what, h);
    cr_expect(!strstr(R.err, "verify") && !strstr(R.err, "`ctxstore rm`"),
              "import of %s advises verify or rm:\n%s", what, R.err);
    jc_free(v);
    char *ses = listing(ts_path(dir, "sessions"));
    const char *at = strstr(before, "sessions/:\n");
    cr_assert_str_eq(ses, at + strlen("sessions/:\n"), "import of %s left files:\n%s", what,
                     ses);
    free(ses);
}

Test(cli, import_refuses_damaged_truncated_and_hostile_files_and_changes_nothing)
{
    const char *file = make_export();
    size_t len;
    uint8_t *good = ts_read_file(file, &len);
    cr_assert_gt(len, 1024 + 40);

    /* The target store already holds a session, so that "unchanged" has
     * something to keep. */
    const char *dst = dir_of("dst");
    ctxs_store *st = ts_store_open(dst);
    register_model(st);
    mk(st, "resident", 256, 1, 30);
    ctxs_store_close(st);
    char *before = store_state(dst);
    const char *bad = dir_of("bad.ctxx");
    uint8_t *buf = malloc(len + 64);
    cr_assert_not_null(buf);
    char what[128];

    /* Flipped bytes: every byte of the magic and version, then offsets
     * spread over the header, the blocks and the trailer. */
    uint64_t seed = ts_seed("import_refuses_damaged_truncated_and_hostile_files");
    uint64_t offs[96];
    size_t n_offs = 0;
    for (uint64_t o = 0; o < 16; o++)
        offs[n_offs++] = o;
    static const uint64_t fixed[] = { 48, 96, 128, 136, 392, 700, 1019, 1020, 1023,
                                      1024, 1030, 1060, 1063, 1064, 1100 };
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
        offs[n_offs++] = fixed[i];
    for (uint64_t o = 1; o <= 16; o++)
        offs[n_offs++] = len - o;
    while (n_offs < 96)
        offs[n_offs++] = 1024 + ts_rng_next(&seed) % (len - 1024);
    for (size_t i = 0; i < n_offs; i++) {
        memcpy(buf, good, len);
        buf[offs[i]] ^= (uint8_t)(1u << (i % 8));
        cr_assert_eq(ts_write_file(bad, buf, len), 0);
        snprintf(what, sizeof(what), "a file with byte %llu of %zu flipped",
                 (unsigned long long)offs[i], len);
        refused(dst, before, bad, EX_DAMAGED, what);
    }

    /* Truncations: at every length near the ends of the header, the first
     * block and the trailer, and spread in between. */
    size_t lens[48];
    size_t n_lens = 0;
    static const size_t short_lens[] = { 1, 7, 8, 9, 100, 1019, 1020, 1023, 1024, 1025, 1063, 1064, 1065 };
    for (size_t i = 0; i < sizeof(short_lens) / sizeof(short_lens[0]); i++)
        lens[n_lens++] = short_lens[i];
    for (size_t o = 1; o <= 12; o++)
        lens[n_lens++] = len - o;
    while (n_lens < 48)
        lens[n_lens++] = 1 + ts_rng_next(&seed) % (len - 1);
    for (size_t i = 0; i < n_lens; i++) {
        cr_assert_eq(ts_write_file(bad, good, lens[i]), 0);
        snprintf(what, sizeof(what), "the file cut to %zu of %zu bytes", lens[i], len);
        refused(dst, before, bad, EX_DAMAGED, what);
    }

    /* Bytes after the trailer. */
    memcpy(buf, good, len);
    memset(buf + len, 0, 64);
    cr_assert_eq(ts_write_file(bad, buf, len + 1), 0);
    refused(dst, before, bad, EX_DAMAGED, "the file with one zero byte appended");
    memcpy(buf + len, good + len - 40, 40); /* a second trailer */
    cr_assert_eq(ts_write_file(bad, buf, len + 40), 0);
    refused(dst, before, bad, EX_DAMAGED, "the file with its trailer twice");

    /* Not export files at all. */
    cr_assert_eq(ts_write_file(bad, "", 0), 0);
    refused(dst, before, bad, EX_DAMAGED, "an empty file");
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)ts_rng_next(&seed);
    cr_assert_eq(ts_write_file(bad, buf, len), 0);
    refused(dst, before, bad, EX_DAMAGED, "random bytes");
    memcpy(buf, good, 8); /* the magic, then random bytes */
    cr_assert_eq(ts_write_file(bad, buf, len), 0);
    refused(dst, before, bad, EX_DAMAGED, "the magic then random bytes");
    refused(dst, before, file_of(dst, "resident"), EX_DAMAGED, "a session file");
    const char *fifo = dir_of("fifo");
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    refused(dst, before, fifo, EX_DAMAGED, "a FIFO");
    refused(dst, before, dir_of("missing.ctxx"), EX_NOTFOUND, "a missing file");
    const char *sub = dir_of("a-directory");
    cr_assert_eq(mkdir(sub, 0700), 0);
    refused(dst, before, sub, EX_DAMAGED, "a directory");

    /* The same file, undamaged, still imports. */
    same_state(before, dst, "all the refused imports");
    CLI_EXPECT(EX_OK, dst, "import", file);
    CLI_EXPECT(EX_OK, dst, "verify");
    free(buf);
    free(good);
    free(before);
}

Test(cli, import_hints_fit_a_broken_file_and_a_name_taken)
{
    const char *file = make_export();
    /* A damaged export is no session: not told to verify or rm. */
    size_t len;
    uint8_t *buf = ts_read_file(file, &len);
    buf[len / 2] ^= 0x40;
    const char *bad = dir_of("bad.ctxx");
    cr_assert_eq(ts_write_file(bad, buf, len), 0);
    free(buf);
    CLI_EXPECT(EX_DAMAGED, S(), "import", bad, "copy", "--json");
    jc_value *v = json_error_out(CTXS_ECORRUPT, "CTXS_ECORRUPT");
    const char *h = hint_of(v);
    cr_assert(strstr(h, "not a valid ctxstore export") && strstr(h, "nothing was imported"),
              "hint: %s", h);
    cr_assert_not(strstr(R.err, "verify") || strstr(R.err, "`ctxstore rm`"), "%s", R.err);
    jc_free(v);
    CLI_EXPECT(EX_DAMAGED, S(), "import", bad, "copy");
    contains(0, "not a valid ctxstore export");
    cr_assert_not(strstr(R.err, "verify") || strstr(R.err, "`ctxstore rm`"), "%s", R.err);

    /* NAME taken: said once, not again in the hint. */
    CLI_EXPECT(EX_EXIST, S(), "import", file, "trip", "--json");
    v = json_error_out(CTXS_ETAKEN, "CTXS_ETAKEN");
    cr_assert_eq(count_of(js(v, "error.message"), "'trip'"), 1, "%s", R.out);
    cr_assert_eq(count_of(hint_of(v), "trip"), 0, "%s", R.out);
    cr_assert_eq(count_of(R.err, "trip'"), 1, "the name is said more than once:\n%s", R.err);
    jc_free(v);
    /* Without NAME, the hint says how to give one. */
    CLI_EXPECT(EX_EXIST, S(), "import", file);
    contains(0, "`ctxstore import FILE NAME`");
    /* A refused NAME: the rule. */
    CLI_EXPECT(EX_USAGE, S(), "import", file, "a/b", "--json");
    v = json_error_out(CTXS_EINVAL, "CTXS_EINVAL");
    cr_assert(strstr(hint_of(v), "1 to 255 bytes"), "%s", R.out);
    jc_free(v);
}

/* =============================================================================
 * Names that must not become paths
 * ========================================================================== */

Test(cli, hostile_names_exit_2_and_create_nothing)
{
    store_with_session("base", 256, 1, 30);
    const char *file = dir_of("base.ctxx");
    CLI_EXPECT(EX_OK, S(), "export", "base", file);
    char *before = store_state(S());

    char long_name[300];
    memset(long_name, 'x', 256);
    long_name[256] = '\0';
    static const char *const names[] = {
        "a/b", "/abs", "../up", "..", ".", "x..y", "dir/", "tab\tname", "new\nline", "\x01",
        "bell\x07", "del\x7f", "\xff\xfe", "\xc3", "",
    };
    size_t n = sizeof(names) / sizeof(names[0]);
    for (size_t i = 0; i <= n; i++) {
        const char *name = i < n ? names[i] : long_name;
        CLI_EXPECT(EX_USAGE, S(), "fork", "base", name);
        CLI_EXPECT(EX_USAGE, S(), "checkpoint", "create", "base", name);
        CLI_EXPECT(EX_USAGE, S(), "import", file, name);
        CLI_EXPECT(EX_USAGE, S(), "info", name);
        CLI_EXPECT(EX_USAGE, S(), "rm", name);
        CLI_EXPECT(EX_USAGE, S(), "rename", "base", name);
        CLI_EXPECT(EX_USAGE, S(), "rename", name, "other");
        /* Each says what is wrong with the name, and the rule. */
        says(0, ctxs_name_check(name));
        says(0, CTXS_NAME_RULE);
        CLI_EXPECT(EX_USAGE, S(), "meta", name);
        says(0, ctxs_name_check(name));
        CLI_EXPECT(EX_USAGE, S(), "meta", "base", name, "v");
        says(0, ctxs_name_check(name));
        CLI_EXPECT(EX_USAGE, S(), "export", name, dir_of("never.ctxx"));
        CLI_EXPECT(EX_USAGE, S(), "verify", name);
        CLI_EXPECT(EX_USAGE, S(), "compact", name);
        CLI_EXPECT(EX_USAGE, S(), "checkpoint", "rm", "base", name);
        CLI_EXPECT(EX_USAGE, S(), "fork", "base", "x", "--checkpoint", name);
        CLI_EXPECT(EX_USAGE, S(), "prefix", "--model", name, "1");
        CLI_EXPECT(EX_USAGE, S(), "rm", "base", name);
        says(0, ctxs_name_check(name));
    }
    same_state(before, S(), "commands with hostile names");
    cr_assert_not(ts_exists(dir_of("never.ctxx")));
    CLI_EXPECT(EX_OK, S(), "checkpoint", "ls", "base", "--json");
    jc_value *v = json_out();
    cr_assert_eq(v->n, 0, "a checkpoint was made: %s", R.out);
    jc_free(v);
    /* Nothing appeared beside the store either. */
    cr_assert_not(ts_exists(dir_of("b")));
    cr_assert_not(ts_exists(ts_path(S(), "up")));
    free(before);
}

/* =============================================================================
 * demo and bench
 * ========================================================================== */

static int is_memory_fs(const char *dir)
{
    struct statfs sf;
    if (statfs(dir, &sf) != 0)
        return 0;
    return (unsigned long)sf.f_type == 0x01021994ul || (unsigned long)sf.f_type == 0x858458f6ul;
}

Test(cli, demo_quick_completes_on_a_fresh_directory_and_resumes_identically)
{
    const char *fresh = dir_of("fresh");
    cr_assert_not(ts_exists(fresh));
    CLI_EXPECT(EX_OK, NULL, "demo", "--quick", "--store", fresh, "--json");
    jc_value *v = json_out();
    cr_assert_eq(jb(v, "quick"), 1);
    cr_assert_eq(jb(v, "temporary"), 0);
    cr_assert_str_eq(js(v, "store"), fresh);
    cr_assert_eq(jb(v, "resume.identical"), 1, "the resumed session was not identical:\n%s",
                 R.out);
    cr_assert_gt(ju(v, "resume.tokens"), 0);
    cr_assert_gt(ju(v, "resume.tokens_checked"), 0);
    /* The default engine is tinychat: after the resume it predicted from
     * the session alone. */
    cr_assert_str_eq(js(v, "engine"), "tinychat");
    jget(v, "resume.next_token_s");
    /* The resume is timed to the first token, warm and cold, beside the
     * state file read warm and cold; the cold pass says whether the page
     * cache could be dropped. */
    const char *passes[] = { "warm", "cold" };
    for (size_t i = 0; i < 2; i++) {
        char key[64];
        snprintf(key, sizeof key, "resume.%s.ctxstore_s", passes[i]);
        double whole = jd(v, key);
        snprintf(key, sizeof key, "resume.%s.open_s", passes[i]);
        cr_assert_leq(jd(v, key), whole, "%s", R.out);
        snprintf(key, sizeof key, "resume.%s.state_file_s", passes[i]);
        cr_assert_gt(jd(v, key), 0, "%s", R.out);
    }
    jb(v, "resume.cold_dropped");
    const jc_value *turns = jget(v, "turns");
    cr_assert_geq(turns->n, 2, "%s", R.out);
    int resumed = 0;
    uint64_t last = 0;
    for (size_t i = 0; i < turns->n; i++) {
        const jc_value *turn = jc_at(turns, i);
        uint64_t t = ju(turn, "tokens");
        cr_assert_gt(t, last, "turn %zu did not add tokens:\n%s", i, R.out);
        last = t;
        resumed |= jb(turn, "resumed");
        /* A save counts reserve, the stores and the commit. */
        double parts = jd(turn, "reserve_s") + jd(turn, "write_s") + jd(turn, "commit_s");
        cr_assert_float_eq(jd(turn, "save_s"), parts, 1e-6, "turn %zu:\n%s", i, R.out);
    }
    cr_assert(resumed, "no turn came after the resume:\n%s", R.out);
    cr_assert_geq(jd(v, "summary.save_median_s"), jd(v, "summary.commit_median_s"), "%s", R.out);
    /* The conversation as a file of each dtype: bf16 as big as fp16, Q8
     * half the elements plus a float scale per head, on disk too. */
    cr_assert_eq(ju(v, "dtype_sizes.held_tokens"), ju(jc_at(turns, turns->n - 1), "held_tokens"),
                 "%s", R.out);
    cr_assert_str_eq(js(v, "dtype_sizes.files[0].dtype"), "f16");
    cr_assert_str_eq(js(v, "dtype_sizes.files[1].dtype"), "bf16");
    cr_assert_str_eq(js(v, "dtype_sizes.files[2].dtype"), "q8");
    uint64_t f16_token = ju(v, "dtype_sizes.files[0].token_bytes");
    cr_assert_eq(f16_token, ju(v, "model.token_bytes"), "%s", R.out);
    cr_assert_eq(ju(v, "dtype_sizes.files[1].token_bytes"), f16_token);
    uint64_t heads = ju(v, "model.n_layers") * ju(v, "model.n_kv_heads");
    cr_assert_eq(ju(v, "dtype_sizes.files[2].token_bytes"), f16_token / 2 + 2 * heads * 4);
    /* The files' sizes are the format's; the blocks on disk are the
     * filesystem's (how far it allocated ahead), so only compared. */
    cr_assert_eq(ju(v, "dtype_sizes.files[1].file_bytes"), ju(v, "dtype_sizes.files[0].file_bytes"),
                 "%s", R.out);
    cr_assert_lt(ju(v, "dtype_sizes.files[2].file_bytes"), ju(v, "dtype_sizes.files[0].file_bytes"),
                 "%s", R.out);
    cr_assert_lt(ju(v, "dtype_sizes.files[2].disk_bytes"), ju(v, "dtype_sizes.files[0].disk_bytes"),
                 "%s", R.out);
    jc_free(v);
    /* Without --keep the demo's session and scratch files are gone. */
    CLI_EXPECT(EX_OK, fresh, "ls", "--json");
    v = json_out();
    cr_assert_eq(v->n, 0, "the demo left its session:\n%s", R.out);
    jc_free(v);
    char *left = listing(fresh);
    cr_assert_null(strstr(left, ".demo"), "the demo left its scratch files:\n%s", left);
    free(left);

    /* With --keep its session stays, and verifies. */
    const char *kept = dir_of("kept");
    CLI_EXPECT(EX_OK, kept, "demo", "--quick", "--keep", "--engine", "tinychat");
    contains(1, "identical");
    /* Why its numbers are not the headline's. */
    contains(1, "--quick is a test run: a tiny model (512 B a token");
    contains(1, "kept: ctxstore --store");
    CLI_EXPECT(EX_OK, kept, "ls", "--json");
    v = json_out();
    cr_assert_eq(v->n, 1, "%s", R.out);
    cr_assert_gt(ju(jc_at(v, 0), "n_tokens"), 0);
    jc_free(v);
    CLI_EXPECT(EX_OK, kept, "verify");

    /* In a store of the user's, without --keep, the demo deletes its
     * session and says so, with how to keep it; the header said so too. */
    CLI_EXPECT(EX_OK, kept, "demo", "--quick", "--engine", "synthetic");
    contains(1, "the demo's session is deleted at the end; --keep keeps it");
    contains(1, "deleted the demo's session");
    CLI_EXPECT(EX_OK, kept, "ls", "--json");
    v = json_out();
    cr_assert_eq(v->n, 1, "the first demo's session is still there, alone:\n%s", R.out);
    jc_free(v);

    /* The synthetic engine has no model: the resumed K/V are compared with
     * what it recomputes. */
    CLI_EXPECT(EX_OK, dir_of("synthetic"), "demo", "--quick", "--engine", "synthetic",
               "--json");
    v = json_out();
    cr_assert_str_eq(js(v, "engine"), "synthetic");
    cr_assert_eq(jb(v, "resume.identical"), 1, "%s", R.out);
    cr_assert_eq(ju(v, "resume.tokens_checked"), 8, "%s", R.out);
    cr_assert_null(jc_path(v, "resume.next_token_s"), "%s", R.out);
    jc_free(v);
}

/* The llama.cpp demo, a program beside the tool in the build tree where
 * llama.cpp was found: the default engine there. */
static int llama_demo_is_built(void)
{
    char path[PATH_MAX];
    const char *bin = getenv("CTXSTORE_BIN");
    const char *slash = bin ? strrchr(bin, '/') : NULL;
    if (!slash)
        return 0;
    snprintf(path, sizeof path, "%.*s/../demo-llama/ctxstore-demo-llama", (int)(slash - bin), bin);
    return access(path, X_OK) == 0;
}

Test(cli, demo_chats_with_a_real_model_through_llama_cpp_and_resumes)
{
    if (!llama_demo_is_built())
        cr_skip_test("the llama.cpp demo is not built (llama.cpp not found); "
                     "scripts/bootstrap.sh builds it");
    const char *store = dir_of("llama");
    cr_assert_eq(mkdir(store, 0700), 0);
    CLI_EXPECT(EX_OK, store, "demo", "--quick");
    contains(1, "SmolLM2: ");
    contains(1, "the app quits and starts again");
    contains(1, "the chat goes on from ctxstore's resume");
    contains(1, "llama.cpp's state file");
    /* the user's store is left as it was */
    CLI_EXPECT(EX_OK, store, "ls", "--json");
    jc_value *v = json_out();
    cr_assert_eq(v->n, 0, "the demo left its session:\n%s", R.out);
    jc_free(v);
    CLI_EXPECT(EX_OK, store, "demo", "--quick", "--keep", "--engine", "llama");
    CLI_EXPECT(EX_OK, store, "verify", "paris");
    CLI_EXPECT(EX_OK, store, "ls", "--json");
    v = json_out();
    cr_assert_eq(v->n, 1, "%s", R.out);
    cr_assert_gt(ju(jc_at(v, 0), "n_tokens"), 200);
    jc_free(v);
    CLI_EXPECT(EX_USAGE, store, "demo", "--engine", "llama", "--turns", "2");
}

Test(cli, demo_without_a_store_works_in_a_temporary_directory_and_removes_it)
{
    const char *parent = dir_of("tmp");
    cr_assert_eq(mkdir(parent, 0700), 0);
    char tmpdir[1100];
    snprintf(tmpdir, sizeof(tmpdir), "TMPDIR=%s", parent);
    run_env(NULL, ARGS(tmpdir), ARGS("demo", "--quick", "--turns", "2", "--json"));
    if (is_memory_fs(parent)) {
        cr_assert_eq(R.code, EX_USAGE, "on a memory file system the demo refuses: %s", R.err);
        contains(0, "memory file systems");
        return;
    }
    cr_assert_eq(R.code, EX_OK, "`%s` exited %d:\n%s", R.what, R.code, R.err);
    jc_value *v = json_out();
    cr_assert_eq(jb(v, "temporary"), 1);
    cr_assert_eq(jb(v, "resume.identical"), 1);
    cr_assert_eq(strncmp(js(v, "store"), parent, strlen(parent)), 0,
                 "the temporary store is not under $TMPDIR: %s", js(v, "store"));
    jc_free(v);
    cr_assert_eq(ts_dir_entries(parent), 0, "the demo left its temporary directory:\n%s",
                 listing(parent));
    cr_assert_eq(ts_dir_entries(ts_path(ts_scratch, "home")), 0, "the demo wrote to $HOME");
}

/* Copies the program name from beside the tool to <scratch>/copy/bin. */
static void copy_program(const char *name)
{
    char from[1100], to[1100];
    const char *bin = cli_bin(), *slash = strrchr(bin, '/');
    snprintf(from, sizeof(from), "%.*s%s", slash ? (int)(slash - bin + 1) : 0, bin, name);
    snprintf(to, sizeof(to), "%s/copy/bin/%s", ts_scratch, name);
    size_t len;
    uint8_t *data = ts_read_file(from, &len);
    cr_assert_not_null(data, "no %s beside the tool", from);
    cr_assert_eq(ts_write_file(to, data, len), 0);
    free(data);
    cr_assert_eq(chmod(to, 0700), 0);
}

/* A copy of the binary at <scratch>/copy/bin/ctxstore, with ctxstore-bench
 * beside it when with_bench, so that nothing else is "beside the tool"
 * (bench looks in <tool>/../../bench, which in a build tree holds the
 * real benchmarks). Sets ld_path to "LD_LIBRARY_PATH=<dir>", where the
 * loader found libctxstore for the original, when it links it dynamically
 * (through an rpath relative to itself, as meson's build tree does); else
 * to "". */
static const char *copy_binary(char *ld_path, size_t n, int with_bench)
{
    ld_path[0] = '\0';
    run_env(S(), ARGS("LD_TRACE_LOADED_OBJECTS=1"), ARGS("--version"));
    const char *lib = strstr(R.out, "libctxstore");
    if (lib && (lib = strstr(lib, "=> /")) != NULL) {
        lib += 3;
        size_t len = strcspn(lib, " \n");
        const char *slash = lib + len;
        while (slash > lib && *slash != '/')
            slash--;
        snprintf(ld_path, n, "LD_LIBRARY_PATH=%.*s", (int)(slash - lib), lib);
    }
    static char copy[1100];
    snprintf(copy, sizeof(copy), "%s/copy", ts_scratch);
    cr_assert_eq(mkdir(copy, 0700), 0);
    snprintf(copy, sizeof(copy), "%s/copy/bin", ts_scratch);
    cr_assert_eq(mkdir(copy, 0700), 0);
    copy_program("ctxstore");
    if (with_bench)
        copy_program("ctxstore-bench");
    snprintf(copy, sizeof(copy), "%s/copy/bin/ctxstore", ts_scratch);
    cr_assert_not(ts_exists(ts_path(ts_scratch, "bench")));
    return copy;
}

/* demo and bench are programs of their own beside the tool: without them
 * the tool says which program it looked for, and where. */
Test(cli, demo_and_bench_without_their_programs_name_them)
{
    char ld_path[1200], want[1200];
    bin_override = copy_binary(ld_path, sizeof(ld_path), 0);
    const char *envs[2] = { ld_path[0] ? ld_path : NULL, NULL };
    run_env(S(), envs, ARGS("--version"));
    cr_assert_eq(R.code, EX_OK, "the copy runs: %s", R.err);
    const char *const programs[][2] = { { "demo", "ctxstore-demo" },
                                        { "bench", "ctxstore-bench" } };
    for (int i = 0; i < 2; i++) {
        snprintf(want, sizeof(want), "%s/copy/bin/%s", ts_scratch, programs[i][1]);
        run_env(S(), envs, ARGS(programs[i][0], "--quick"));
        cr_assert_eq(R.code, EX_NOTFOUND, "%s without its program: %d\n%s", programs[i][0],
                     R.code, R.err);
        contains(0, want);
        contains(0, "ENOENT");
        run_env(S(), envs, ARGS("help", programs[i][0], "--json"));
        cr_assert_eq(R.code, EX_NOTFOUND, "%s", R.err);
        jc_value *v = json_error_out(-ENOENT, "ENOENT");
        cr_assert(strstr(js(v, "error.message"), want), "%s", R.out);
        jc_free(v);
    }
    bin_override = NULL;
}

Test(cli, bench_without_its_programs_fails_with_a_clear_error)
{
    char ld_path[1200], env[1100];
    bin_override = copy_binary(ld_path, sizeof(ld_path), 1);
    const char *envs[3] = { env, ld_path[0] ? ld_path : NULL, NULL };
    const char *empty = dir_of("no-bench");
    cr_assert_eq(mkdir(empty, 0700), 0);
    snprintf(env, sizeof(env), "CTXSTORE_BENCH_DIR=%s", empty);
    CLI_EXPECT(EX_OK, S(), "--version"); /* the copy runs */

    run_env(S(), envs, ARGS("bench", "--quick"));
    cr_assert_neq(R.code, EX_OK, "bench without its programs exited 0:\n%s", R.out);
    cr_assert_neq(R.code, EX_USAGE, "bench without its programs is not a usage error:\n%s",
                  R.err);
    contains(0, "bench_session not found");
    contains(0, "bench_attention not found");
    contains(0, "bench_tinychat not found");
    contains(0, empty);
    contains(0, "CTXSTORE_BENCH_DIR");
    run_env(S(), envs, ARGS("bench", "--quick", "--only", "index", "--json"));
    cr_assert_neq(R.code, EX_OK);
    cr_assert_neq(R.code, EX_USAGE, "%s", R.err);
    contains(0, "bench_index not found");
    jc_value *v = json_error_out(CTXS_ENOTFOUND, "CTXS_ENOTFOUND");
    cr_assert(strstr(js(v, "error.message"), "bench_index"), "%s", R.out);
    cr_assert(strstr(hint_of(v), "CTXSTORE_BENCH_DIR"), "%s", R.out);
    jc_free(v);
    /* A directory that does not exist is the same. */
    snprintf(env, sizeof(env), "CTXSTORE_BENCH_DIR=%s", dir_of("nowhere"));
    run_env(S(), envs, ARGS("bench", "--quick", "--only", "session"));
    cr_assert_neq(R.code, EX_OK);
    contains(0, "bench_session not found");
    bin_override = NULL;
}

/* The one measurement of results with this method and context; fails the
 * test unless there is exactly one. */
static const jc_value *tinychat_result(const jc_value *results, const char *method,
                                       uint64_t tokens)
{
    const jc_value *found = NULL;
    for (size_t i = 0; i < results->n; i++) {
        const jc_value *r = jc_at(results, i);
        if (strcmp(js(r, "method"), method) == 0 && ju(r, "tokens") == tokens) {
            cr_assert_null(found, "two %s results at %llu tokens:\n%s", method,
                           (unsigned long long)tokens, R.out);
            found = r;
        }
    }
    cr_assert_not_null(found, "no %s result at %llu tokens:\n%s", method,
                       (unsigned long long)tokens, R.out);
    return found;
}

/* bench --json runs bench_tinychat as it runs the others and passes its
 * objects through: in a build tree the tool finds it in <build>/bench, each
 * context of --quick has a resume and a recompute measurement, and both
 * predicted the same token. No duration is judged: only that the numbers
 * are timings and that the ratio is the medians'. */
/* Its own timeout: under AddressSanitizer the prefills of --quick take
 * about 140 s on 2 cores. */
Test(cli, bench_runs_bench_tinychat_and_passes_its_json_through, .timeout = 400)
{
    const char *prog = getenv("BENCH_TINYCHAT_BIN");
    cr_assert(prog && *prog, "BENCH_TINYCHAT_BIN is not set: it must name the bench_tinychat "
                             "program the tool finds (meson sets it)");
    char *want_path = realpath(prog, NULL);
    cr_assert_not_null(want_path, "BENCH_TINYCHAT_BIN=%s: %s", prog, strerror(errno));
    const char *dir = dir_of("bench");
    cr_assert_eq(mkdir(dir, 0700), 0);

    /* $CTXSTORE_BENCH_DIR empty: the tool must find the program beside it. */
    run_env(S(), ARGS("CTXSTORE_BENCH_DIR="),
            ARGS("bench", "--only", "tinychat", "--quick", "--dir", dir, "--json"));
    if (is_memory_fs(dir)) {
        cr_assert_neq(R.code, EX_OK, "bench_tinychat ran on a memory file system:\n%s", R.out);
        contains(0, "memory file system");
        free(want_path);
        return;
    }
    cr_assert_eq(R.code, EX_OK, "`%s` exited %d:\n%s", R.what, R.code, R.err);
    /* Lines of the program's stdout that are not objects come out on stderr
     * under its name: with --json it must write none. */
    cr_assert(strncmp(R.err, "bench_tinychat: ", 16) != 0 && !strstr(R.err, "\nbench_tinychat: "),
              "bench_tinychat --json wrote more than objects to stdout:\n%s", R.err);

    jc_value *v = json_out();
    cr_assert_eq(jget(v, "programs")->n, 1, "%s", R.out);
    cr_assert_str_eq(js(v, "programs[0].program"), "bench_tinychat");
    /* The table's row: the ratio of the two medians it names. */
    cr_assert_eq(jget(v, "comparisons")->n, 1, "%s", R.out);
    cr_assert_str_eq(js(v, "comparisons[0].part"), "tinychat");
    cr_assert_eq(ju(v, "comparisons[0].tokens"), 1024, "%s", R.out);
    double cmp_want = jd(v, "comparisons[0].alternative_us") / jd(v, "comparisons[0].ctxstore_us");
    cr_assert(fabs(jd(v, "comparisons[0].ratio") - cmp_want) <= cmp_want * 1e-3 + 1e-3, "%s",
              R.out);
    cr_assert_str_eq(js(v, "programs[0].path"), want_path);
    cr_assert_eq(ju(v, "programs[0].exit_status"), 0);
    const jc_value *args = jget(v, "programs[0].args");
    cr_assert(jc_has_string(args, "--quick") && jc_has_string(args, "--json"), "%s", R.out);

    /* --quick: contexts of 256 and 1024 tokens, two methods each; then the
     * attention kernel alone, prefill and decode of 2048 tokens. */
    const jc_value *results = jget(v, "programs[0].results");
    static const uint64_t contexts[] = { 256, 1024 };
    static const char *const methods[] = { "resume", "recompute" };
    cr_assert_eq(results->n, 6, "%s", R.out);
    for (size_t i = 4; i < 6; i++) {
        const jc_value *r = &results->items[i];
        cr_assert_str_eq(js(r, "op"), "attention", "%s", R.out);
        cr_assert_str_eq(js(r, "method"), i == 4 ? "prefill" : "decode", "%s", R.out);
        cr_assert_eq(ju(r, "tokens"), 2048);
        double gb_s = jd(r, "gb_s"), want = jd(r, "kv_bytes") / (jd(r, "median_us") * 1e3);
        double off = gb_s > want ? gb_s - want : want - gb_s;
        cr_assert(gb_s > 0 && off <= want * 0.01 + 0.001,
                  "gb_s %g, but kv_bytes / median gives %g:\n%s", gb_s, want, R.out);
    }
    for (size_t c = 0; c < 2; c++) {
        const jc_value *by_method[2];
        for (size_t m = 0; m < 2; m++) {
            const jc_value *r = tinychat_result(results, methods[m], contexts[c]);
            by_method[m] = r;
            cr_assert_str_eq(js(r, "op"), "next_token");
            cr_assert_str_eq(js(r, "config"), "mid");
            cr_assert_str_eq(js(r, "isa"), ctxs_attention_get_isa());
            cr_assert_eq(jb(r, "same"), 1, "resume and recompute disagree:\n%s", R.out);
            cr_assert_geq(ju(r, "n"), 1);
            double lo = jd(r, "min_us"), mid = jd(r, "median_us"), hi = jd(r, "max_us");
            cr_assert(lo > 0 && lo <= mid && mid <= hi, "not a timing: %g [%g, %g]:\n%s", mid,
                      lo, hi, R.out);
        }
        /* As the table prints it: recompute median / resume median, on the
         * recompute object only (2 decimals, medians to 0.1 us). */
        cr_assert_null(jc_get(by_method[0], "ratio"), "%s", R.out);
        double want = jd(by_method[1], "median_us") / jd(by_method[0], "median_us");
        double ratio = jd(by_method[1], "ratio");
        cr_assert(ratio > want - 0.01 - want * 1e-3 && ratio < want + 0.01 + want * 1e-3,
                  "ratio %g, but the medians give %g:\n%s", ratio, want, R.out);
    }
    jc_free(v);
    free(want_path);
    cr_assert_eq(ts_dir_entries(dir), 0, "bench_tinychat left its scratch files:\n%s",
                 listing(dir));
}

/* What a newcomer reads: one line saying what is measured and about how
 * long it takes, then a short table whose ratio is the two medians it
 * shows; the programs' own notes stay back. */
Test(cli, bench_says_what_it_times_and_prints_a_short_table_of_ratios, .timeout = 400)
{
    const char *dir = dir_of("bench");
    cr_assert_eq(mkdir(dir, 0700), 0);
    run_env(S(), ARGS("CTXSTORE_BENCH_DIR="), ARGS("bench", "--only", "tinychat", "--quick",
                                                   "--dir", dir));
    if (is_memory_fs(dir)) {
        cr_assert_neq(R.code, EX_OK, "bench_tinychat ran on a memory file system:\n%s", R.out);
        return;
    }
    cr_assert_eq(R.code, EX_OK, "`%s` exited %d:\n%s", R.what, R.code, R.err);
    char first[512];
    snprintf(first, sizeof(first), "%.*s", (int)strcspn(R.out, "\n"), R.out);
    cr_assert(strstr(first, "Timing ctxstore") && strstr(first, "about "),
              "the first line does not say what is timed and for how long:\n%s", R.out);
    cr_assert_lt(count_of(R.out, "\n"), 12, "not a short table:\n%s", R.out);
    contains(1, "CTXSTORE IS");
    cr_assert_not(strstr(R.out, "note:") || strstr(R.err, "note:") || strstr(R.out, "NOT "),
                  "the programs' notes or verdicts came through:\n%s\n%s", R.out, R.err);
    /* The row: its two medians, then what their ratio says. */
    char row[512];
    line_with(row, sizeof(row), "next token after a reopen");
    char a[32], aunit[8], b[32], bunit[8], word[16];
    double x;
    cr_assert_eq(sscanf(row, "next token after a reopen %*u %31s %7s recompute the prefill "
                             "%31s %7s %lfx %15s", a, aunit, b, bunit, &x, word), 6,
                 "the row does not read as STEP TOKENS TIME ALTERNATIVE TIME RATIO:\n%s", row);
    double ctxs = strtod(a, NULL), alt = strtod(b, NULL);
    double scale[2];
    const char *units[2] = { aunit, bunit };
    for (int i = 0; i < 2; i++)
        scale[i] = !strcmp(units[i], "s") ? 1e6 : !strcmp(units[i], "ms") ? 1e3 : 1;
    double want = alt * scale[1] / (ctxs * scale[0]);
    if (!strcmp(word, "slower"))
        want = 1 / want;
    cr_assert(x > want * 0.95 - 0.1 && x < want * 1.05 + 0.1,
              "%gx, but the medians shown give %g:\n%s", x, want, row);
    cr_assert(!strcmp(word, "faster") || !strcmp(word, "slower"), "%s", row);
    cr_assert_eq(ts_dir_entries(dir), 0, "bench_tinychat left its scratch files:\n%s",
                 listing(dir));
}

Test(cli, bench_remote_without_a_redis_server_is_skipped_with_a_reason)
{
    run_env(S(), ARGS("REDIS_SERVER_BIN=/nonexistent/redis-server"),
            ARGS("bench", "--only", "remote", "--quick"));
    cr_assert_eq(R.code, EX_OK, "`%s` exited %d:\n%s\n%s", R.what, R.code, R.out, R.err);
    contains(1, "remote: skipped: $REDIS_SERVER_BIN (/nonexistent/redis-server)");
    run_env(S(), ARGS("REDIS_SERVER_BIN=/nonexistent/redis-server"),
            ARGS("bench", "--only", "remote", "--quick", "--json"));
    cr_assert_eq(R.code, EX_OK, "`%s` exited %d:\n%s", R.what, R.code, R.err);
    jc_value *v = json_out();
    cr_assert_str_eq(js(v, "skipped[0].part"), "remote");
    cr_assert(strstr(js(v, "skipped[0].why"), "REDIS_SERVER_BIN"), "%s", R.out);
    cr_assert_eq(jget(v, "programs")->n, 0, "%s", R.out);
    jc_free(v);
    CLI_EXPECT(EX_USAGE, S(), "bench", "--only", "nothing");
    contains(0, "session, index, attention, tinychat or remote");
}

/* =============================================================================
 * meta
 * ========================================================================== */

Test(cli, meta_sets_prints_lists_and_deletes_what_an_app_keeps)
{
    store_with_session("chat", 256, 1, 30);
    CLI_EXPECT(EX_OK, S(), "meta", "chat", "title", "Trip to Lisbon");
    contains(1, "set key 'title' of 'chat' (14 bytes)");
    const char *f = text_file("template.jinja", "{% for m in messages %}\n{{ m }}\n{% endfor %}\n");
    CLI_EXPECT(EX_OK, S(), "meta", "chat", "chat_template", "--file", f, "--json");
    jc_value *v = json_out();
    cr_assert_str_eq(js(v, "action"), "set");
    cr_assert_eq(ju(v, "bytes"), 45);
    jc_free(v);
    /* A value prints as it is, with nothing added. */
    CLI_EXPECT(EX_OK, S(), "meta", "chat", "title");
    cr_assert_str_eq(R.out, "Trip to Lisbon");
    CLI_EXPECT(EX_OK, S(), "meta", "chat", "chat_template");
    cr_assert_str_eq(R.out, "{% for m in messages %}\n{{ m }}\n{% endfor %}\n");
    /* The library agrees. */
    ctxs_store *st = ts_store_open(S());
    char buf[64];
    size_t n = sizeof(buf);
    cr_assert_eq(ctxs_store_session_get_meta(buf, &n, st, "chat", "title"), 0);
    cr_assert(n == 14 && memcmp(buf, "Trip to Lisbon", 14) == 0);
    cr_assert_eq(ctxs_store_session_set_meta(st, "chat", "blob", "\0\1\2", 3), 0);
    ctxs_store_close(st);
    /* The listing: the start of each value; binary ones as their size. */
    CLI_EXPECT(EX_OK, S(), "meta", "chat");
    contains(1, "Trip to Lisbon");
    contains(1, "{% for m in messages %} ...");
    contains(1, "(3 bytes, binary)");
    contains(1, "3 keys");
    CLI_EXPECT(EX_OK, S(), "meta", "chat", "--json");
    v = json_out();
    const jc_value *list = jget(v, "meta");
    cr_assert_eq(list->n, 3, "%s", R.out);
    cr_assert_str_eq(js(jc_at(list, 0), "key"), "blob");
    cr_assert_str_eq(js(jc_at(list, 0), "hex"), "000102");
    cr_assert_str_eq(js(jc_at(list, 2), "text"), "Trip to Lisbon");
    jc_free(v);
    /* info shows the keys, values shortened. */
    CLI_EXPECT(EX_OK, S(), "info", "chat");
    contains(1, "metadata     3 keys");
    contains(1, "title");
    CLI_EXPECT(EX_OK, S(), "info", "chat", "--json");
    v = json_out();
    cr_assert_eq(jget(v, "meta")->n, 3);
    cr_assert_str_eq(js(jc_at(jget(v, "meta"), 1), "preview"), "{% for m in messages %} ...");
    jc_free(v);
    /* Delete; then the key is not there. */
    CLI_EXPECT(EX_OK, S(), "meta", "chat", "blob", "--delete");
    contains(1, "deleted key 'blob' of 'chat'");
    CLI_EXPECT(EX_NOTFOUND, S(), "meta", "chat", "blob");
    CLI_EXPECT(EX_NOTFOUND, S(), "meta", "chat", "blob", "--delete");
    CLI_EXPECT(EX_NOTFOUND, S(), "meta", "nope");
    /* Usage. */
    CLI_EXPECT(EX_USAGE, S(), "meta");
    CLI_EXPECT(EX_USAGE, S(), "meta", "chat", "--delete");
    CLI_EXPECT(EX_USAGE, S(), "meta", "chat", "k", "v", "--delete");
    CLI_EXPECT(EX_USAGE, S(), "meta", "chat", "k", "--file", f, "--delete");
    CLI_EXPECT(EX_NOTFOUND, S(), "meta", "chat", "k", "--file", dir_of("missing"));
}

Test(cli, meta_past_its_limit_exits_2_says_the_limit_and_changes_nothing)
{
    store_with_session("chat", 256, 1, 0);
    CLI_EXPECT(EX_OK, S(), "meta", "chat", "title", "kept");
    char *big = malloc(CTXS_META_VALUE_MAX + 2);
    memset(big, 'x', CTXS_META_VALUE_MAX + 1);
    big[CTXS_META_VALUE_MAX + 1] = '\0';
    const char *f = text_file("big.txt", big);
    CLI_EXPECT(EX_USAGE, S(), "meta", "chat", "title", "--file", f, "--json");
    jc_value *v = json_error_out(CTXS_ETOOBIG, "CTXS_ETOOBIG");
    cr_assert(strstr(hint_of(v), "64 KiB") && strstr(hint_of(v), "256 KiB"), "%s", R.out);
    jc_free(v);
    big[CTXS_META_VALUE_MAX] = '\0';
    f = text_file("max.txt", big);
    CLI_EXPECT(EX_OK, S(), "meta", "chat", "other", "--file", f);
    CLI_EXPECT(EX_OK, S(), "meta", "chat", "title");
    cr_assert_str_eq(R.out, "kept");
    free(big);
}

Test(cli, export_and_import_carry_the_metadata)
{
    store_with_session("chat", 256, 1, 100);
    CLI_EXPECT(EX_OK, S(), "meta", "chat", "title", "Trip to Lisbon");
    CLI_EXPECT(EX_OK, S(), "meta", "chat", "app", "{\"pinned\":true}");
    const char *file = dir_of("chat.ctxx");
    CLI_EXPECT(EX_OK, S(), "export", "chat", file);
    const char *other = dir_of("other");
    CLI_EXPECT(EX_OK, other, "import", file);
    CLI_EXPECT(EX_OK, other, "meta", "chat", "title");
    cr_assert_str_eq(R.out, "Trip to Lisbon");
    CLI_EXPECT(EX_OK, other, "meta", "chat", "app");
    cr_assert_str_eq(R.out, "{\"pinned\":true}");
    /* A fork starts without it. */
    CLI_EXPECT(EX_OK, other, "fork", "chat", "fork");
    CLI_EXPECT(EX_OK, other, "meta", "fork");
    contains(1, "0 keys");
}

/* --- A damaged index -------------------------------------------------------- */

Test(cli, every_command_on_a_cut_index_exits_8_with_the_index_hint)
{
    ctxs_store *st = store_with_model();
    mk(st, "chat", 256, 1, 150);
    mk(st, "notes", 256, 1, 80);
    ctxs_store_close(st);
    const char *exp = dir_of("chat.ctxsx");
    CLI_EXPECT(EX_OK, S(), "export", "chat", exp);
    char *before = listing(ts_path(S(), "sessions"));
    /* Cut to half a page past its meta pages: LMDB would read past the end. */
    const char *data = ts_path(S(), "index/data.mdb");
    struct stat sb;
    cr_assert_eq(stat(data, &sb), 0);
    cr_assert_eq(truncate(data, 3 * 4096 + 100), 0);

    const char *const lines[][8] = {
        {"ls"}, {"info", "chat"}, {"verify", "--all"}, {"verify", "chat"},
        {"compact", "--all"}, {"gc", "--max-size", "1G"}, {"gc", "--max-size", "1G", "--dry-run"},
        {"pin", "chat"}, {"unpin", "chat"}, {"rm", "notes"}, {"rename", "chat", "talk"},
        {"fork", "chat", "copy"}, {"checkpoint", "create", "chat", "t1"},
        {"checkpoint", "ls", "chat"}, {"meta", "chat"}, {"meta", "chat", "k", "v"},
        {"models"}, {"prefix", "--model", "00000000000000000000000000000000", "1", "2"},
        {"reindex"}, {"import", exp, "again"},
    };
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++) {
        const char *args[12] = {"--store", S(), "--json"};
        size_t n = 3;
        for (size_t k = 0; k < 8 && lines[i][k]; k++)
            args[n++] = lines[i][k];
        run_env(S(), NULL, args);
        cr_expect_eq(R.code, EX_INDEX, "`%s` exited %d:\n%s\n%s", R.what, R.code, R.out, R.err);
        if (R.code != EX_INDEX)
            continue;
        says(0, "is damaged");
        says(0, "repair-index");
        cr_expect(!strstr(R.err, "session file is corrupt"), "`%s`:\n%s", R.what, R.err);
        cr_expect(!strstr(R.err, "ctxstore verify"), "`%s`:\n%s", R.what, R.err);
        jc_value *v = json_error_out(CTXS_EINDEX, "CTXS_EINDEX");
        cr_expect(strstr(hint_of(v), "repair-index") != NULL, "`%s`:\n%s", R.what, R.out);
        jc_free(v);
    }
    /* Without --json too, the words a person reads. */
    CLI_EXPECT(EX_INDEX, S(), "ls");
    contains(0, "the index of store");
    contains(0, "hint:");
    char *after = listing(ts_path(S(), "sessions"));
    cr_assert_str_eq(before, after, "the session files changed");
    free(after);

    /* The way out the hint gives: the index cut short still held both
     * meta pages, so the repair reads through the newer one (the file
     * extended with zeros) and says what it kept and lost. */
    CLI_EXPECT(EX_OK, S(), "repair-index", "--json");
    jc_value *r = json_out();
    uint64_t u;
    cr_assert_eq(jc_u64(jc_get(r, "sessions"), &u), 0, "%s", R.out);
    cr_assert_eq(u, 2, "%s", R.out);
    cr_assert_eq(jc_u64(jc_get(r, "meta_pages"), &u), 0, "%s", R.out);
    cr_assert_eq(u, 2, "%s", R.out);
    const char *moved = jc_str(jc_get(r, "moved_to"));
    cr_assert_not_null(moved, "%s", R.out);
    cr_assert(strstr(moved, "/index.damaged-") != NULL, "%s", moved);
    cr_assert(ts_exists(ts_path(moved, "data.mdb")), "%s", moved);
    const char *kinds[] = {"names", "checkpoints", "metadata", "pins", "models"};
    uint64_t names_kept = 0;
    for (size_t i = 0; i < 5; i++) {
        const jc_value *k = jc_get(r, kinds[i]);
        cr_assert_not_null(k, "no %s:\n%s", kinds[i], R.out);
        cr_assert_eq(jc_u64(jc_get(k, "kept"), &u), 0, "%s", R.out);
        if (i == 0)
            names_kept = u;
        cr_assert_eq(jc_u64(jc_get(k, "dropped"), &u), 0, "%s", R.out);
        cr_assert_eq(jc_u64(jc_get(k, "unread"), &u), 0, "%s", R.out);
        cr_assert_neq(jc_bool(jc_get(k, "whole")), -1, "%s", R.out);
    }
    const jc_value *renamed = jc_get(r, "renamed");
    cr_assert(renamed && renamed->type == JC_ARRAY, "%s", R.out);
    cr_assert_eq(names_kept + renamed->n, 2, "%s", R.out);
    jc_free(r);
    CLI_EXPECT(EX_OK, S(), "verify", "--all");
    CLI_EXPECT(EX_OK, S(), "ls", "--json");
    jc_value *v = json_out();
    cr_assert_not_null(by_name(v, "chat"), "%s", R.out);
    cr_assert_not_null(by_name(v, "notes"), "%s", R.out);
    jc_free(v);
    /* Refused while another process (this one) has the store open. */
    st = ts_store_open(S());
    CLI_EXPECT(EX_BUSY, S(), "repair-index");
    contains(0, "open in another process");
    ctxs_store_close(st);
    free(before);
}

/* --- One verdict on a malformed index record --------------------- */

/* "chat" (id 1: 70 tokens, checkpoint "t1", metadata "title", pinned) and
 * "notes" (id 2), the store closed. */
static const char *VD; /* the store of the case under test */

static void verdict_store(void)
{
    ctxs_store *st = ts_store_open(VD);
    register_model(st);
    ctxs_session *s = mk_open(st, "chat", 256, 0, 70);
    cr_assert_eq(ctxs_checkpoint_create(s, "t1"), 0);
    ctxs_session_close(s);
    mk(st, "notes", 256, 0, 3);
    cr_assert_eq(ctxs_store_session_set_meta(st, "chat", "title", "hello", 5), 0);
    cr_assert_eq(ctxs_store_session_set_pinned(st, "chat", 1), 0);
    ctxs_store_close(st);
}

typedef struct verdict_case {
    const char *what;
    const char *table;           /* the table verify --all names */
    const char *key;             /* and the key, as it prints it */
    void (*damage)(void);
    /* exit codes of ls, info chat, checkpoint ls chat, meta chat: the
     * commands that read the record say CTXS_EINDEX, the others are not
     * concerned */
    int ls, info, cp_ls, meta;
} verdict_case;

static const uint8_t k_id1[8] = {0, 0, 0, 0, 0, 0, 0, 1};

static void damage_session_record(void)
{
    uint8_t rec[95] = {1};
    ts_raw_put(VD, "sessions", "chat", 4, rec, sizeof(rec));
}

static void damage_checkpoint_record(void)
{
    uint8_t key[10], rec[23] = {0};
    memcpy(key, k_id1, 8);
    memcpy(key + 8, "t1", 2);
    ts_raw_put(VD, "checkpoints", key, sizeof(key), rec, sizeof(rec));
}

static void damage_metadata_value(void)
{
    uint8_t key[13];
    memcpy(key, k_id1, 8);
    memcpy(key + 8, "title", 5);
    static uint8_t big[CTXS_META_VALUE_MAX + 1];
    ts_raw_put(VD, "metadata", key, sizeof(key), big, sizeof(big));
}

static void damage_metadata_key(void)
{
    ts_raw_put(VD, "metadata", k_id1, 8, "v", 1); /* no key after the id */
}

static void damage_pin(void)
{
    ts_raw_put(VD, "pins", k_id1, 8, "x", 1);
}

static void damage_ids_row(void)
{
    ts_raw_put(VD, "ids", k_id1, 8, "", 0); /* names no session */
}

static const verdict_case k_verdicts[] = {
    {"a session record of 95 bytes", "sessions", "'chat'", damage_session_record,
     EX_INDEX, EX_INDEX, EX_INDEX, EX_INDEX},
    {"a checkpoint record of 23 bytes", "checkpoints", "id 1, 't1'", damage_checkpoint_record,
     EX_OK, EX_INDEX, EX_INDEX, EX_OK},
    {"a metadata value above the limit", "metadata", "id 1, 'title'", damage_metadata_value,
     EX_OK, EX_INDEX, EX_OK, EX_INDEX},
    {"a metadata row without a key", "metadata", "id 1", damage_metadata_key,
     EX_OK, EX_INDEX, EX_OK, EX_INDEX},
    {"a pin with a value", "pins", "id 1", damage_pin,
     EX_INDEX, EX_INDEX, EX_OK, EX_OK},
    {"an empty ids row", "ids", "id 1", damage_ids_row,
     EX_OK, EX_OK, EX_OK, EX_OK},
};

Test(cli, info_ls_checkpoint_ls_meta_and_verify_agree_on_each_malformed_record)
{
    for (size_t i = 0; i < sizeof(k_verdicts) / sizeof(k_verdicts[0]); i++) {
        const verdict_case *vc = &k_verdicts[i];
        char name[16];
        snprintf(name, sizeof(name), "v%zu", i);
        VD = dir_of(name);
        verdict_store();
        CLI_EXPECT(EX_OK, VD, "verify", "--all");
        vc->damage();
        const struct {
            const char *args[4];
            int want;
        } lines[] = {
            {{"ls"}, vc->ls},
            {{"info", "chat"}, vc->info},
            {{"checkpoint", "ls", "chat"}, vc->cp_ls},
            {{"meta", "chat"}, vc->meta},
        };
        for (size_t l = 0; l < sizeof(lines) / sizeof(lines[0]); l++) {
            const char *args[12] = {"--store", VD, "--json"};
            size_t n = 3;
            for (size_t k = 0; k < 4 && lines[l].args[k]; k++)
                args[n++] = lines[l].args[k];
            run_env(VD, NULL, args);
            cr_expect_eq(R.code, lines[l].want, "%s: `%s` exited %d, not %d:\n%s\n%s", vc->what,
                         R.what, R.code, lines[l].want, R.out, R.err);
            if (R.code == EX_INDEX) {
                jc_value *v = json_error_out(CTXS_EINDEX, "CTXS_EINDEX");
                cr_expect(strstr(hint_of(v), "repair-index") != NULL, "%s: `%s`:\n%s", vc->what,
                          R.what, R.out);
                jc_free(v);
            }
        }
        /* verify --all: index damage, every time, named by table and key,
         * with the way out; never a session file's damage. */
        CLI_EXPECT(EX_INDEX, VD, "verify", "--all");
        char line[1024];
        snprintf(line, sizeof(line), "DAMAGED  index: %s %s: ", vc->table, vc->key);
        contains(1, line);
        contains(1, "INDEX DAMAGED");
        contains(0, "hint:");
        contains(0, "repair-index");
        cr_expect(!strstr(R.err, "session file is corrupt"), "%s:\n%s", vc->what, R.err);
        CLI_EXPECT(EX_INDEX, VD, "verify", "--all", "--json");
        jc_value *v = json_error_out(CTXS_EINDEX, "CTXS_EINDEX");
        cr_expect_eq(jb(v, "ok"), 0, "%s", vc->what);
        cr_expect_eq(jb(v, "index.ok"), 0, "%s", vc->what);
        const jc_value *probs = jget(v, "index.problems");
        cr_assert_geq(probs->n, 1, "%s: %s", vc->what, R.out);
        int named = 0;
        for (size_t p = 0; p < probs->n; p++)
            named |= strcmp(js(&probs->items[p], "table"), vc->table) == 0 &&
                     strcmp(js(&probs->items[p], "key"), vc->key) == 0;
        cr_expect(named, "%s: no problem names %s %s:\n%s", vc->what, vc->table, vc->key,
                  R.out);
        cr_expect_eq(ju(v, "index.problems_found"), probs->n, "%s", vc->what);
        jc_free(v);
    }
}

Test(cli, reindex_says_it_mended_next_id_and_renumbered_nothing)
{
    ctxs_store *st = store_with_model();
    mk(st, "a", 64, 0, 2);
    mk(st, "b", 64, 0, 2);
    ctxs_store_close(st);
    uint64_t zero = 0;
    ts_raw_put(S(), "meta", "next_id", 7, &zero, 8);
    CLI_EXPECT(EX_OK, S(), "reindex", "--json");
    jc_value *v = json_out();
    cr_assert_eq(ju(v, "sessions"), 2);
    cr_assert_eq(jb(v, "next_id_mended"), 1);
    cr_assert_eq(ju(v, "next_id_was"), 0);
    cr_assert_eq(ju(v, "next_id"), 3);
    cr_assert_eq(ju(v, "files_renumbered"), 0);
    jc_free(v);
    ts_raw_put(S(), "meta", "next_id", 7, &zero, 8);
    CLI_EXPECT(EX_OK, S(), "reindex");
    contains(1, "mended the next session id: it was 0, it is 3");
    CLI_EXPECT(EX_OK, S(), "reindex");
    cr_assert(!strstr(R.out, "mended"), "%s", R.out);
}

Test(cli, a_store_given_as_a_symlink_works_and_a_dangling_one_is_refused_with_why)
{
    store_with_session("chat", 64, 0, 5);
    const char *l1 = dir_of("link"), *l2 = dir_of("link2"), *dang = dir_of("dangling");
    const char *nowhere = dir_of("nowhere");
    cr_assert_eq(symlink(S(), l1), 0);
    cr_assert_eq(symlink(l1, l2), 0);
    cr_assert_eq(symlink(nowhere, dang), 0);
    CLI_EXPECT(EX_OK, l2, "ls", "--json");
    jc_value *v = json_out();
    cr_assert_not_null(by_name(v, "chat"), "%s", R.out);
    jc_free(v);
    CLI_EXPECT(EX_OK, l1, "verify", "--all");
    CLI_EXPECT(EX_OK, l2, "rename", "chat", "talk"); /* a write, through two links */
    CLI_EXPECT(EX_OK, S(), "info", "talk");
    /* Nowhere: said, and nothing made there, by a read or a write. */
    CLI_EXPECT(EX_NOTFOUND, dang, "ls");
    contains(0, "symbolic link to");
    contains(0, "does not exist");
    char w[1100];
    snprintf(w, sizeof(w), "%s", weights_file("w.bin", 4096, 3, (uint8_t[16]){0}));
    CLI_EXPECT(EX_NOTFOUND, dang, "models", "register", w, "--name", "w", "--layers", "2",
               "--kv-heads", "2", "--head-dim", "16", "--dtype", "fp16");
    contains(0, "symbolic link to");
    cr_assert_not(ts_exists(nowhere), "a store was made at the end of a dangling link");
}

/* =============================================================================
 * A session's life from the command line, and refusals that say why
 * ========================================================================== */

Test(cli, create_makes_an_empty_session_a_program_then_writes)
{
    ctxs_store *st = store_with_model();
    ctxs_store_close(st);
    CLI_EXPECT(EX_OK, S(), "create", "chat", "--model", MODEL_NAME);
    contains(1, "created 'chat'");
    contains(1, "2048 token slots");
    CLI_EXPECT(EX_OK, S(), "create", "small", "--model", MODEL_NAME, "--capacity", "100",
               "--dtype", "fp16", "--json");
    jc_value *v = json_out();
    cr_assert_str_eq(js(v, "name"), "small");
    cr_assert_eq(ju(v, "capacity"), 100);
    cr_assert_str_eq(js(v, "dtype"), "fp16");
    cr_assert_str_eq(js(v, "model"), MODEL_NAME);
    jc_free(v);
    /* By its hash too, as `models` prints it. */
    char hex[33];
    ctxs_model m = model();
    for (int i = 0; i < 16; i++)
        snprintf(hex + 2 * i, 3, "%02x", m.model_hash[i]);
    CLI_EXPECT(EX_OK, S(), "create", "by-hash", "--model", hex);

    /* What it made is a session the library writes to. */
    st = ts_store_open(S());
    ctxs_session *s = open_rw(st, "small");
    ts_append_many(s, 30);
    cr_assert_eq(ts_info(s).capacity, 100);
    ctxs_session_close(s);
    ctxs_store_close(st);
    CLI_EXPECT(EX_OK, S(), "ls", "--json");
    v = json_out();
    cr_assert_eq(ju(must_by_name(v, "chat"), "n_tokens"), 0);
    cr_assert_eq(ju(must_by_name(v, "small"), "n_tokens"), 30);
    jc_free(v);

    /* Refusals, each with its reason, and nothing made. */
    char *before = store_state(S());
    CLI_EXPECT(EX_EXIST, S(), "create", "chat", "--model", MODEL_NAME, "--json");
    v = json_error_out(CTXS_ETAKEN, "CTXS_ETAKEN");
    cr_assert(strstr(js(v, "error.message"), "'chat'"), "%s", R.out);
    jc_free(v);
    CLI_EXPECT(EX_DAMAGED, S(), "create", "q", "--model", MODEL_NAME, "--dtype", "q8");
    contains(0, "the dtype is q8 here, fp16 there");
    CLI_EXPECT(EX_USAGE, S(), "create", "tiny", "--model", MODEL_NAME, "--capacity", "3");
    contains(0, "n_sink 4 is not below the capacity 3");
    CLI_EXPECT(EX_USAGE, S(), "create", "huge", "--model", MODEL_NAME, "--capacity", "99999999");
    contains(0, "capacity 99999999 is outside");
    CLI_EXPECT(EX_NOTFOUND, S(), "create", "x", "--model", "nobody");
    contains(0, "model 'nobody'");
    CLI_EXPECT(EX_USAGE, S(), "create", "x");
    contains(0, "create needs --model");
    CLI_EXPECT(EX_USAGE, S(), "create", "a/b", "--model", MODEL_NAME);
    contains(0, "contains '/'");
    CLI_EXPECT(EX_USAGE, S(), "create", "x", "--model", MODEL_NAME, "--dtype", "f32");
    contains(0, "--dtype takes fp16, bf16 or q8");
    same_state(before, S(), "creates that were refused");
    free(before);
    /* No store is made by create: a model must be registered first. */
    CLI_EXPECT(EX_NOTFOUND, dir_of("none"), "create", "x", "--model", MODEL_NAME);
    cr_assert_not(ts_exists(dir_of("none")), "create made a store");
}

/* A session is no ring unless asked: full, it refuses tokens, and grow
 * gives it more slots with every token kept. */
Test(cli, grow_gives_a_full_session_more_slots)
{
    ctxs_store *st = store_with_model();
    ctxs_store_close(st);
    CLI_EXPECT(EX_OK, S(), "create", "small", "--model", MODEL_NAME, "--capacity", "100");
    cr_assert_not(strstr(R.out, "ring"), "%s", R.out);
    CLI_EXPECT(EX_OK, S(), "create", "loop", "--model", MODEL_NAME, "--capacity", "100", "--ring");
    contains(1, "a ring after the first 4");
    st = ts_store_open(S());
    ctxs_session *s = open_rw(st, "small");
    ts_append_many(s, 100);
    ctxs_reservation r;
    cr_assert_eq(ctxs_session_reserve(&r, s, 1), CTXS_EFULL);
    /* Open: refused, and left as it is. */
    CLI_EXPECT(EX_BUSY, S(), "grow", "small", "--capacity", "400");
    contains(0, "close it");
    ctxs_session_close(s);
    ctxs_store_close(st);

    CLI_EXPECT(EX_OK, S(), "grow", "small", "--capacity", "400");
    contains(1, "grew 'small' to 400 token slots, holding its 100 tokens");
    st = ts_store_open(S());
    s = open_rw(st, "small");
    cr_assert_eq(ts_info(s).capacity, 400);
    cr_assert_eq(ts_check_all(s), 0);
    ts_append_many(s, 200);
    ctxs_session_close(s);
    ctxs_store_close(st);
    CLI_EXPECT(EX_OK, S(), "grow", "small", "--capacity", "1000", "--json");
    jc_value *v = json_out();
    cr_assert_eq(ju(v, "capacity"), 1000);
    cr_assert_eq(ju(v, "n_tokens"), 300);
    jc_free(v);

    char *before = store_state(S());
    CLI_EXPECT(EX_USAGE, S(), "grow", "small", "--capacity", "500");
    contains(0, "does not grow the session, which has 1000");
    CLI_EXPECT(EX_USAGE, S(), "grow", "small");
    contains(0, "grow needs --capacity");
    CLI_EXPECT(EX_USAGE, S(), "grow", "small", "--capacity", "lots");
    contains(0, "--capacity takes a count");
    CLI_EXPECT(EX_NOTFOUND, S(), "grow", "nobody", "--capacity", "500");
    same_state(before, S(), "grows that were refused");
    free(before);
}

Test(cli, a_refusal_prints_the_library_reason)
{
    store_with_session("src", 256, 0, 150);
    CLI_EXPECT(EX_USAGE, S(), "fork", "src", "x", "--at", "512");
    contains(0, "512 tokens is more than the 150 the session holds");
    cr_assert_not(strstr(R.err, "invalid argument"), "%s", R.err);
    CLI_EXPECT(EX_NOTFOUND, S(), "meta", "src", "title", "--json");
    jc_value *v = json_error_out(CTXS_ENOTFOUND, "CTXS_ENOTFOUND");
    cr_assert(strstr(js(v, "error.message"), "no metadata key 'title'"), "%s", R.out);
    jc_free(v);
}

Test(cli, info_names_the_process_that_writes_a_session)
{
    ctxs_store *st = store_with_model();
    mk(st, "chat", 256, 0, 30);
    CLI_EXPECT(EX_OK, S(), "info", "chat", "--json");
    jc_value *v = json_out();
    cr_assert_eq(jb(v, "writer_open"), 0, "%s", R.out);
    cr_assert_null(jc_path(v, "writer_pid"), "no writer, yet a process is named:\n%s", R.out);
    jc_free(v);

    /* This test's own process holds the writer. */
    ctxs_session *s = open_rw(st, "chat");
    char comm[64] = "", want[96];
    FILE *f = fopen("/proc/self/comm", "r");
    cr_assert_not_null(f);
    cr_assert_not_null(fgets(comm, sizeof(comm), f));
    fclose(f);
    comm[strcspn(comm, "\n")] = '\0';
    snprintf(want, sizeof(want), "a writer (process %d, %s)", (int)getpid(), comm);
    CLI_EXPECT(EX_OK, S(), "info", "chat");
    contains(1, want);
    CLI_EXPECT(EX_OK, S(), "info", file_of(S(), "chat"));
    contains(1, want);
    CLI_EXPECT(EX_OK, S(), "info", "chat", "--json");
    v = json_out();
    cr_assert_eq(jb(v, "writer_open"), 1, "%s", R.out);
    cr_assert_eq(ju(v, "writer_pid"), (uint64_t)getpid(), "%s", R.out);
    cr_assert_str_eq(js(v, "writer_command"), comm);
    jc_free(v);
    ctxs_session_close(s);
    ctxs_store_close(st);
}

Test(cli, a_missing_checkpoint_is_named_by_fork_restore_and_rm)
{
    store_with_session("src", 256, 0, 150);
    CLI_EXPECT(EX_NOTFOUND, S(), "fork", "src", "dst", "--checkpoint", "nocp");
    contains(0, "session 'src' has no checkpoint named 'nocp'");
    contains(0, "checkpoint ls src");
    CLI_EXPECT(EX_NOTFOUND, S(), "checkpoint", "restore", "src", "nocp");
    contains(0, "the session has no checkpoint named 'nocp'");
    CLI_EXPECT(EX_NOTFOUND, S(), "checkpoint", "rm", "src", "nocp", "--json");
    jc_value *v = json_error_out(CTXS_ENOTFOUND, "CTXS_ENOTFOUND");
    cr_assert(strstr(js(v, "error.message"), "no checkpoint named 'nocp'"), "%s", R.out);
    jc_free(v);
    /* A missing session is said as such, not as a missing checkpoint. */
    CLI_EXPECT(EX_NOTFOUND, S(), "fork", "nobody", "dst", "--checkpoint", "nocp");
    contains(0, "no session named 'nobody'");
    CLI_EXPECT(EX_OK, S(), "ls", "--json");
    v = json_out();
    cr_assert_eq(v->n, 1, "a refused fork made a session:\n%s", R.out);
    jc_free(v);
}

Test(cli, an_option_error_is_said_once_naming_the_option)
{
    CLI_EXPECT(EX_USAGE, S(), "ls", "--bogus");
    cr_assert_eq(count_of(R.err, "--bogus"), 1, "said more than once:\n%s", R.err);
    contains(0, "unknown option '--bogus'");
    cr_assert_not(strstr(R.err, "unrecognized"), "getopt spoke too:\n%s", R.err);
    CLI_EXPECT(EX_USAGE, S(), "--bogus", "ls");
    cr_assert_eq(count_of(R.err, "--bogus"), 1, "said more than once:\n%s", R.err);
    CLI_EXPECT(EX_USAGE, S(), "create", "x", "--model");
    contains(0, "--model needs a value");
    cr_assert_eq(count_of(R.err, "ctxstore:"), 1, "%s", R.err);
    CLI_EXPECT(EX_USAGE, S(), "ls", "--json=yes");
    contains(0, "--json takes no value");
    CLI_EXPECT(EX_USAGE, S(), "gc", "-m");
    contains(0, "-m needs a value");
    CLI_EXPECT(EX_USAGE, S(), "ls", "-z");
    contains(0, "unknown option '-z'");
    cr_assert_eq(count_of(R.err, "-z"), 1, "%s", R.err);
}

Test(cli, version_speaks_json_when_asked)
{
    CLI_EXPECT(EX_OK, NULL, "--version");
    contains(1, "ctxstore ");
    const char *const orders[][2] = { { "--version", "--json" }, { "--json", "--version" } };
    for (int i = 0; i < 2; i++) {
        CLI_EXPECT(EX_OK, NULL, orders[i][0], orders[i][1]);
        jc_value *v = json_out();
        char want[32];
        snprintf(want, sizeof(want), "%d.%d.%d", CTXS_VERSION_MAJOR, CTXS_VERSION_MINOR,
                 CTXS_VERSION_PATCH);
        cr_assert_str_eq(js(v, "version"), want);
        cr_assert_eq(ju(v, "major"), CTXS_VERSION_MAJOR);
        jc_free(v);
    }
}

Test(cli, rename_and_gc_report_what_the_files_hold)
{
    ctxs_store *st = store_with_model();
    mk(st, "chat", 256, 0, 50);
    mk(st, "old", 256, 0, 10);
    mk(st, "ring", 64, 1, 150);
    ctxs_store_close(st);
    /* Written through its path: the index still says 50 tokens, and the
     * disk space of a 10-token file. */
    ctxs_model m = model();
    const char *const grow[] = { "chat", "old" };
    for (int i = 0; i < 2; i++) {
        ctxs_session *s = NULL;
        cr_assert_eq(ctxs_session_open(&s, file_of(S(), grow[i]), &m, 0, NULL), 0);
        ts_append_many(s, 200);
        ctxs_session_close(s);
    }
    CLI_EXPECT(EX_OK, S(), "rename", "chat", "talk");
    contains(1, "renamed 'chat' to 'talk' (250 tokens)");
    CLI_EXPECT(EX_OK, S(), "rename", "ring", "loop", "--json");
    jc_value *v = json_out();
    cr_assert_eq(ju(v, "n_tokens"), 150);
    cr_assert_eq(ju(v, "held"), 64);
    jc_free(v);
    CLI_EXPECT(EX_OK, S(), "rename", "loop", "ring");
    contains(1, "(64 tokens held of 150 positions)");

    CLI_EXPECT(EX_OK, S(), "gc", "--max-size", "0", "--dry-run", "--json");
    v = json_out();
    const jc_value *list = jget(v, "sessions");
    uint64_t sum = 0;
    for (size_t i = 0; i < list->n; i++)
        sum += ju(jc_at(list, i), "disk_bytes");
    cr_assert_eq(list->n, 3, "%s", R.out);
    cr_assert_eq(sum, ju(v, "bytes_before") - ju(v, "bytes_after"),
                 "the sessions' sizes do not add up to what gc frees:\n%s", R.out);
    jc_free(v);
}

/* The terminal columns of the first n bytes of s: a CJK character (three
 * bytes from 0xe3 to 0xe9) takes two, any other character one. */
static size_t columns(const char *s, size_t n)
{
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        if ((b & 0xc0) != 0x80)
            w += b >= 0xe3 && b <= 0xe9 ? 2 : 1;
    }
    return w;
}

Test(cli, ls_aligns_wide_names_and_names_held_and_positions)
{
    ctxs_store *st = store_with_model();
    mk(st, "abcd", 256, 0, 7);
    mk(st, "caf\xc3\xa9", 256, 0, 8);          /* café: 4 columns, 5 bytes */
    mk(st, "\xe4\xbc\x9a\xe8\xa9\xb1", 256, 0, 9); /* 会話: 4 columns, 6 bytes */
    mk(st, "wrapped", 64, 1, 150);
    ctxs_store_close(st);
    CLI_EXPECT(EX_OK, S(), "ls");
    char head[1024], line[1024];
    line_with(head, sizeof(head), "NAME");
    cr_assert(strstr(head, "HELD") && strstr(head, "POSITIONS"), "%s", R.out);
    size_t held_end = columns(head, (size_t)(strstr(head, "HELD") - head)) + 4;
    const char *const names[] = { "abcd", "caf\xc3\xa9", "\xe4\xbc\x9a\xe8\xa9\xb1" };
    const char *const counts[] = { " 7 ", " 8 ", " 9 " };
    for (int i = 0; i < 3; i++) {
        line_with(line, sizeof(line), names[i]);
        const char *p = strstr(line, counts[i]);
        cr_assert_not_null(p, "%s", R.out);
        cr_assert_eq(columns(line, (size_t)(p - line)) + 2, held_end,
                     "'%s' is not aligned with the header:\n%s", names[i], R.out);
    }
    /* A ring that wrapped: 64 held of 150 positions, each under its name. */
    line_with(line, sizeof(line), "wrapped");
    cr_assert(strstr(line, " 64       150 "), "held then positions:\n%s", R.out);
}

Test(cli, info_and_verify_read_a_session_file_by_its_path)
{
    /* A file made outside any store, as the README's first example does. */
    const char *path = dir_of("chat.ctxs");
    ctxs_model m = model();
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = 256;
    ctxs_session *s = NULL;
    cr_assert_eq(ctxs_session_create(&s, path, &m, &o), 0);
    ts_append_many(s, 70);
    ctxs_session_close(s);
    const char *nowhere = dir_of("no-store");
    CLI_EXPECT(EX_OK, nowhere, "info", path);
    contains(1, "a session file, read by its path");
    contains(1, "70 committed, 70 held");
    CLI_EXPECT(EX_OK, nowhere, "info", path, "--json");
    jc_value *v = json_out();
    cr_assert_eq(ju(v, "n_tokens"), 70);
    cr_assert_str_eq(js(v, "path"), path);
    jc_free(v);
    CLI_EXPECT(EX_OK, nowhere, "verify", path, "--json");
    v = json_out();
    cr_assert(jb(v, "ok"), "%s", R.out);
    cr_assert_eq(ju(jc_at(jget(v, "sessions"), 0), "tokens_checked"), 70, "%s", R.out);
    jc_free(v);
    cr_assert_not(ts_exists(nowhere), "reading a file made a store");

    /* Damage is found and named, with exit 5. */
    flip(path, offsetof(ctxs__disk_header, capacity), 0x10);
    CLI_EXPECT(EX_DAMAGED, nowhere, "verify", path);
    contains(1, "DAMAGE FOUND");
    contains(1, "header");
    CLI_EXPECT(EX_OK, nowhere, "info", path); /* described from its bytes */
    contains(1, "DOES NOT OPEN");
    /* A path where nothing is: said as a path and as a name. */
    CLI_EXPECT(EX_USAGE, nowhere, "info", dir_of("gone.ctxs"));
    contains(0, "no session file at");
    contains(0, "contains '/'");
}

Test(cli, a_store_that_is_a_file_empty_or_under_a_missing_parent_is_said_as_such)
{
    const char *file = dir_of("plain");
    cr_assert_eq(ts_write_file(file, "x", 1), 0);
    CLI_EXPECT(EX_NOTFOUND, file, "ls", "--json");
    jc_value *v = json_error_out(-ENOTDIR, "ENOTDIR");
    cr_assert(strstr(js(v, "error.message"), "it is a file, not a directory"), "%s", R.out);
    cr_assert(strstr(hint_of(v), "`ctxstore info FILE`"), "%s", R.out);
    jc_free(v);

    CLI_EXPECT(EX_USAGE, NULL, "--store", "", "ls");
    contains(0, "--store is empty");
    cr_assert_not(strstr(R.err, "a name is"), "the session-name rule:\n%s", R.err);

    /* A command that makes a store does not advise running itself. */
    char w[1100], under[1100];
    snprintf(w, sizeof(w), "%s", weights_file("w.bin", 4096, 3, (uint8_t[16]){0}));
    snprintf(under, sizeof(under), "%s/sub", dir_of("missing"));
    CLI_EXPECT(EX_NOTFOUND, under, "models", "register", w, "--name", "w", "--layers", "2",
               "--kv-heads", "2", "--head-dim", "16");
    contains(0, "its parent directory");
    contains(0, "mkdir -p");
    cr_assert_not(strstr(R.err, "models register` make"), "advises itself:\n%s", R.err);
    cr_assert_not(ts_exists(under));
}

Test(cli, export_to_a_place_the_user_cannot_write_names_the_destination)
{
    store_with_session("chat", 256, 0, 20);
    cr_assert_eq(ts_make_unwritable(S()), 0); /* and readable by the user below */
    const char *ro = dir_of("ro");
    cr_assert_eq(mkdir(ro, 0555), 0);
    cr_assert_eq(chmod(ro, 0555), 0);
    char dest[1100];
    snprintf(dest, sizeof(dest), "%s/chat.export", ro);
    run_unprivileged = 1;
    CLI(S(), "export", "chat", dest);
    run_unprivileged = 0;
    cr_assert_eq(R.code, EX_FAIL, "`%s` exited %d:\n%s", R.what, R.code, R.err);
    contains(0, ro);
    contains(0, "(the destination)");
    cr_assert_not(strstr(R.err, "store directory"), "blames the store:\n%s", R.err);
}

Test(cli, a_file_that_cannot_be_adopted_is_listed_and_the_advice_ends_the_loop)
{
    store_with_session("chat", 256, 0, 40);
    /* A damaged session file the index does not know, as a crash of a
     * disk or a person's copy leaves it. */
    char stray[1200], sessions[1100];
    snprintf(sessions, sizeof(sessions), "%s/sessions", S());
    snprintf(stray, sizeof(stray), "%s/00000000000000f0.ctxs", sessions);
    copy_file(file_of(S(), "chat"), stray);
    flip(stray, offsetof(ctxs__disk_header, capacity), 0x10);

    CLI_EXPECT(EX_OK, S(), "ls");
    contains(1, "DAMAGED  sessions/00000000000000f0.ctxs");
    contains(1, "1 session and 1 damaged file");
    contains(1, "mkdir -p");
    CLI_EXPECT(EX_OK, S(), "ls", "--json");
    jc_value *v = json_out();
    cr_assert_eq(v->n, 2, "%s", R.out);
    const jc_value *d = jc_at(v, 1);
    cr_assert_str_eq(js(d, "file"), "00000000000000f0.ctxs");
    cr_assert(jb(d, "unadoptable"));
    cr_assert_gt(ju(d, "disk_bytes"), 0);
    jc_free(v);

    /* Neither verify nor reindex nor compact sends the user to the other. */
    CLI_EXPECT(EX_DAMAGED, S(), "verify");
    contains(1, "00000000000000f0.ctxs: a file the index does not know, which does not open");
    contains(1, "damaged/");
    cr_assert_not(strstr(R.out, "compact` adopts"), "%s", R.out);
    CLI_EXPECT(EX_OK, S(), "reindex");
    contains(1, "left alone: sessions/00000000000000f0.ctxs");
    contains(1, "damaged/");
    cr_assert_not(strstr(R.out, "ctxstore verify"), "sends back to verify:\n%s", R.out);
    CLI_EXPECT(EX_OK, S(), "compact");
    contains(1, "left alone: sessions/00000000000000f0.ctxs");

    /* The advice, followed, ends it. */
    char aside[1100];
    snprintf(aside, sizeof(aside), "%s/damaged", S());
    cr_assert_eq(mkdir(aside, 0700), 0);
    snprintf(aside, sizeof(aside), "%s/damaged/00000000000000f0.ctxs", S());
    cr_assert_eq(rename(stray, aside), 0);
    CLI_EXPECT(EX_OK, S(), "verify");
    CLI_EXPECT(EX_OK, S(), "ls");
    cr_assert_not(strstr(R.out, "DAMAGED"), "%s", R.out);
}

Test(cli, compact_names_the_sessions_it_adopted)
{
    store_with_session("chat", 256, 0, 40);
    char restored[1100];
    snprintf(restored, sizeof(restored), "%s/sessions/00000000000000f1.ctxs", S());
    copy_file(file_of(S(), "chat"), restored);
    CLI_EXPECT(EX_OK, S(), "compact", "--json");
    jc_value *v = json_out();
    const jc_value *a = jget(v, "adopted");
    cr_assert_eq(a->n, 1, "%s", R.out);
    cr_assert_eq(ju(jc_at(a, 0), "id"), 0xf1);
    jc_free(v);
    /* Once adopted it is a session like any: no second adoption. */
    CLI_EXPECT(EX_OK, S(), "compact");
    cr_assert_not(strstr(R.out, "adopted"), "%s", R.out);
    CLI_EXPECT(EX_OK, S(), "ls", "--json");
    v = json_out();
    cr_assert_eq(v->n, 2, "%s", R.out);
    jc_free(v);
}

/* A session file copied in by hand under another id (a backup restored
 * beside the store's own files) comes back under its label's name where
 * that name is free, else as session-<id>, and the tool says which. */
Test(cli, a_file_restored_under_another_id_gets_its_labels_name_when_free)
{
    store_with_session("chat", 256, 0, 40);
    const char *backup = dir_of("chat.backup");
    copy_file(file_of(S(), "chat"), backup);
    char restored[1100];

    /* Beside the session it came from: its name is taken. */
    snprintf(restored, sizeof(restored), "%s/sessions/00000000000000f1.ctxs", S());
    copy_file(backup, restored);
    CLI_EXPECT(EX_OK, S(), "compact");
    contains(1, "adopted   'session-00000000000000f1'");
    contains(1, "its label's name 'chat' is another session's");
    /* The label now names the id it is indexed under: nothing to report. */
    CLI_EXPECT(EX_OK, S(), "verify");

    /* Its name is free once the session is gone. */
    CLI_EXPECT(EX_OK, S(), "rm", "chat");
    snprintf(restored, sizeof(restored), "%s/sessions/00000000000000f2.ctxs", S());
    copy_file(backup, restored);
    CLI_EXPECT(EX_OK, S(), "compact", "--json");
    jc_value *v = json_out();
    const jc_value *a = jget(v, "adopted");
    cr_assert_eq(a->n, 1, "%s", R.out);
    cr_assert_str_eq(js(jc_at(a, 0), "name"), "chat");
    cr_assert_eq(ju(jc_at(a, 0), "id"), 0xf2);
    cr_assert_str_eq(js(jc_at(a, 0), "label_name"), "chat");
    cr_assert_eq(ju(jc_at(a, 0), "label_id"), 1);
    jc_free(v);
    CLI_EXPECT(EX_OK, S(), "verify");
    ctxs_store *st = ts_store_open(S());
    ctxs_session *s = open_ro(st, "chat");
    cr_assert_eq(ts_info(s).n_tokens, 40);
    cr_assert_eq(ts_check_all(s), 0);
    ctxs_session_close(s);
    ctxs_store_close(st);

    /* Its file deleted by hand and the backup put back under another id:
     * the entry of the missing file does not keep the name from it. */
    cr_assert_eq(unlink(restored), 0);
    snprintf(restored, sizeof(restored), "%s/sessions/00000000000000f3.ctxs", S());
    copy_file(backup, restored);
    CLI_EXPECT(EX_OK, S(), "compact");
    contains(1, "adopted   'chat' (sessions/00000000000000f3.ctxs");
    contains(1, "under its label's name");

    /* A rebuild: the file labelled with its own id keeps the name, though
     * a copy with a lower id is read first. */
    snprintf(restored, sizeof(restored), "%s/sessions/0000000000000010.ctxs", S());
    copy_file(backup, restored);
    CLI_EXPECT(EX_OK, S(), "reindex");
    contains(1, "adopted   'session-0000000000000010'");
    contains(1, "its label's name 'chat' is another session's");
    CLI_EXPECT(EX_OK, S(), "ls", "--json");
    v = json_out();
    cr_assert_eq(v->n, 3, "%s", R.out);
    cr_assert_eq(ju(must_by_name(v, "chat"), "id"), 0xf3, "%s", R.out);
    cr_assert_not_null(by_name(v, "session-00000000000000f1"), "%s", R.out);
    cr_assert_not_null(by_name(v, "session-0000000000000010"), "%s", R.out);
    jc_free(v);
    CLI_EXPECT(EX_OK, S(), "verify");
    /* Once indexed, a file is no longer said to be adopted. */
    CLI_EXPECT(EX_OK, S(), "reindex");
    cr_assert_not(strstr(R.out, "adopted"), "%s", R.out);
}
