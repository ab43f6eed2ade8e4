/*
 * `ctxstore remote push|pull|ls|stat`, run as the real binary
 * ($CTXSTORE_BIN) against a real redis-server on the loopback
 * (tests/redis_server.c): sessions pushed from one store and pulled into
 * another read back byte for byte; a pull that meets a chunk Redis lost,
 * or one that does not verify, stops there and names the tokens left to
 * prefill; every --json output is parsed (json_check.c) and compared with
 * what the test made; a refused password, a server that is not there and
 * a missing URL give the documented exit codes, and no output ever holds
 * the password.
 *
 * Then tinychat across two machines: a conversation generated in store A,
 * pushed, pulled into store B, continues in B with exactly the tokens it
 * continues with in A and in a run that never stopped; pulled short (a
 * chunk deleted from Redis), the tokens left are prefilled and the
 * continuation is still the same.
 *
 * Tests check exit codes, output and bytes; never durations.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctxstore.h"
#include "cli_run.h"
#include "json_check.h"
#include "redis_server.h"
#include "support.h"
#include "tinychat.h"

static ts_redis g_redis;

static void suite_init(void)
{
    ts_scratch_init();
}

static void suite_fini(void)
{
    ts_redis_stop(&g_redis);
    ts_scratch_fini();
}

TestSuite(cli_remote, .init = suite_init, .fini = suite_fini, .timeout = 120);

/* --- Running the binary ----------------------------------------------------- */

static cli_result R;

/* Runs $CTXSTORE_BIN with args (cli_run()) on store, with $CTXSTORE_REMOTE
 * = remote_env (removed when NULL). Fills R and returns the exit code. */
static int run(const char *store, const char *remote_env, const char *const *args)
{
    char remote[512];
    snprintf(remote, sizeof(remote), "CTXSTORE_REMOTE=%s", remote_env ? remote_env : "");
    const char *env[] = {remote_env ? remote : "CTXSTORE_REMOTE", NULL};
    return cli_run(&R, cli_bin(), store, env, args, 0);
}

#define ARGS(...) ((const char *const[]){ __VA_ARGS__, NULL })
#define EXPECT(code, store, env, ...)                                                              \
    cli_expect_exit(&R, run((store), (env), ARGS(__VA_ARGS__)), (code))
#define contains(out, s) cli_contains(&R, (out), (s))

static void lacks(const char *s)
{
    cr_assert(!strstr(R.out, s) && !strstr(R.err, s),
              "`%s` shows \"%s\".\nstdout:\n%s\nstderr:\n%s", R.what, s, R.out, R.err);
}

/* The last run's --json output, and checked accessors into it (cli_run.h). */
#define json_out() cli_json(&R)
#define jget(v, path) cli_jget(&R, (v), (path))
#define ju(v, path) cli_ju(&R, (v), (path))
#define js(v, path) cli_js(&R, (v), (path))

/* --- Stores ------------------------------------------------------------------ */

static ctxs_model model(void)
{
    ctxs_model m = ts_model(7);
    m.geometry.head_dim = 16;
    return m;
}

static const char *store_a(void) { return ts_path(ts_scratch, "a"); }
static const char *store_b(void) { return ts_path(ts_scratch, "b"); }

static ctxs_store *open_store(const char *dir)
{
    ctxs_store *st = NULL;
    int rc = ctxs_store_open(&st, dir, CTXS_STORE_CREATE, NULL);
    cr_assert_eq(rc, 0, "store %s: %s", dir, ctxs_err_name(rc));
    return st;
}

/* Creates name with n tokens (ts_append contents: the same K/V and id at
 * the same position in every session, so sessions share their chunks). */
static void mk(ctxs_store *st, const char *name, uint32_t capacity, int ring, uint64_t n)
{
    ctxs_model m = model();
    int rc = ctxs_model_register(st, &m, "tiny-test");
    cr_assert(rc == 0 || rc == -EEXIST, "register: %s", ctxs_err_name(rc));
    ctxs_create_options o = ts_options(capacity, 4, (uint32_t)ring, CTXS_SYNC_NONE);
    ctxs_session *s = NULL;
    rc = ctxs_store_session_create(&s, st, name, &m, &o);
    cr_assert_eq(rc, 0, "create '%s': %s", name, ctxs_err_name(rc));
    ts_append_many(s, n);
    ctxs_session_close(s);
}

/* Asserts that store dir holds name with n tokens whose K/V and ids are
 * what ts_append wrote. */
static void check_pulled(const char *dir, const char *name, uint64_t n)
{
    ctxs_store *st = NULL;
    int rc = ctxs_store_open(&st, dir, CTXS_RDONLY, NULL);
    cr_assert_eq(rc, 0, "store %s: %s", dir, ctxs_err_name(rc));
    ctxs_model m = model();
    ctxs_session *s = NULL;
    rc = ctxs_store_session_open(&s, st, name, &m, CTXS_RDONLY, NULL);
    cr_assert_eq(rc, 0, "open pulled '%s': %s", name, ctxs_err_name(rc));
    cr_assert_eq(ts_n_tokens(s), n, "'%s' holds %llu tokens, expected %llu", name,
                 (unsigned long long)ts_n_tokens(s), (unsigned long long)n);
    cr_assert_eq(ts_check_all(s), 0, "pulled '%s' reads back other K/V than was pushed", name);
    uint32_t *ids = calloc(n ? n : 1, sizeof(*ids));
    cr_assert_not_null(ids);
    rc = ctxs_session_get_tokens(ids, s, 0, (uint32_t)n);
    cr_assert_eq(rc, 0, "get_tokens: %s", ctxs_err_name(rc));
    for (uint64_t i = 0; i < n; i++)
        cr_assert_eq(ids[i], ts_token(i), "token %llu of pulled '%s'", (unsigned long long)i, name);
    free(ids);
    ctxs_session_close(s);
    ctxs_store_close(st);
}

/* A port on 127.0.0.1 where nothing listens: bound, then closed. */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    socklen_t len = sizeof(a);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* --- push and pull ------------------------------------------------------------ */

Test(cli_remote, push_then_pull_between_two_stores)
{
    ts_redis_start(&g_redis, NULL, 0);
    const char *url = g_redis.url;
    ctxs_store *st = open_store(store_a());
    mk(st, "a", 512, 0, 150); /* two whole chunks and a tail of 22 */
    mk(st, "b", 512, 0, 200); /* a's first two chunks, one more, a tail of 8 */
    ctxs_store_close(st);

    EXPECT(EX_OK, store_a(), NULL, "remote", "push", "a", "--remote", url, "--json");
    jc_value *v = json_out();
    cr_assert_str_eq(js(v, "remote"), url);
    cr_assert_str_eq(js(v, "pushed[0].name"), "a");
    cr_assert_eq(ju(v, "pushed[0].n_tokens"), 150);
    uint64_t sent_a = ju(v, "pushed[0].chunks_sent");
    cr_assert_geq(sent_a, 2, "two whole chunks at least:\n%s", R.out);
    cr_assert_eq(ju(v, "pushed[0].chunks_present"), 0);
    /* 150 tokens x 2 layers x 2 heads x 16 dims x 2 (K, V) x 2 bytes. */
    cr_assert_geq(ju(v, "pushed[0].bytes_sent"), 150u * 256);
    cr_assert_eq(ju(v, "chunks_sent"), sent_a);
    jc_free(v);

    /* b shares a's first two chunks: they are not sent again. The URL
     * comes from the environment this time. */
    EXPECT(EX_OK, store_a(), url, "remote", "push", "b", "--json");
    v = json_out();
    cr_assert_eq(ju(v, "pushed[0].n_tokens"), 200);
    cr_assert_geq(ju(v, "pushed[0].chunks_present"), 2, "a's chunks are b's:\n%s", R.out);
    cr_assert_geq(ju(v, "pushed[0].chunks_sent"), 1);
    jc_free(v);
    cr_assert_eq(ts_redis_count(&g_redis, "ctxs:session:*"), 2);

    /* Pushing again sends no whole chunk. */
    EXPECT(EX_OK, store_a(), url, "remote", "push", "a", "b");
    contains(1, "pushed 'a': 150 tokens");
    contains(1, "pushed 'b': 200 tokens");

    /* Store b does not exist: pull makes it. */
    EXPECT(EX_OK, store_b(), NULL, "remote", "pull", "a", "--remote", url, "--json");
    v = json_out();
    cr_assert_str_eq(js(v, "name"), "a");
    cr_assert_str_eq(js(v, "local"), "a");
    cr_assert_eq(ju(v, "n_tokens"), 150);
    cr_assert_eq(ju(v, "remote_tokens"), 150);
    cr_assert_eq(ju(v, "to_prefill"), 0);
    cr_assert_eq(jget(v, "stopped")->type, JC_NULL, "%s", R.out);
    cr_assert_eq(jget(v, "rest_ids")->type, JC_ARRAY);
    cr_assert_eq(jget(v, "rest_ids")->n, 0);
    jc_free(v);
    check_pulled(store_b(), "a", 150);

    EXPECT(EX_OK, store_b(), url, "remote", "pull", "b", "--as", "b-copy");
    contains(1, "pulled 'b' as 'b-copy': 200 of 200 tokens");
    check_pulled(store_b(), "b-copy", 200);

    /* Taken, unknown. */
    EXPECT(EX_EXIST, store_b(), url, "remote", "pull", "a");
    EXPECT(EX_NOTFOUND, store_b(), url, "remote", "pull", "nosuch", "--json");
    v = json_out();
    cr_assert_str_eq(js(v, "error.name"), "CTXS_ENOTFOUND");
    jc_free(v);
    /* Nothing to push. */
    EXPECT(EX_NOTFOUND, store_a(), url, "remote", "push", "nosuch");
}

Test(cli_remote, a_ring_that_wrapped_is_refused)
{
    ts_redis_start(&g_redis, NULL, 0);
    ctxs_store *st = open_store(store_a());
    mk(st, "ring", 64, 1, 100);
    ctxs_store_close(st);
    EXPECT(EX_DAMAGED, store_a(), g_redis.url, "remote", "push", "ring", "--json");
    jc_value *v = json_out();
    cr_assert_str_eq(js(v, "error.name"), "CTXS_EEVICTED");
    jc_free(v);
    cr_assert_eq(ts_redis_count(&g_redis, "ctxs:session:*"), 0);
}

/* The pull stops at the first chunk Redis lost (evicted) or that does not
 * verify, keeps what came before, and names the tokens left. */
Test(cli_remote, pull_stops_at_a_missing_or_damaged_chunk)
{
    ts_redis_start(&g_redis, NULL, 0);
    ctxs_store *st = open_store(store_a());
    mk(st, "first", 512, 0, 64); /* exactly chunk 0 */
    mk(st, "long", 512, 0, 150);
    ctxs_store_close(st);
    EXPECT(EX_OK, store_a(), g_redis.url, "remote", "push", "first");
    uint64_t first_keys = ts_redis_count(&g_redis, "ctxs:chunk:*");
    cr_assert_geq(first_keys, 1);
    /* Chunk 0's key, the only chunk key so far. */
    char *k0 = ts_redis_cmd(&g_redis, "EVAL", "return redis.call('KEYS', 'ctxs:chunk:*')[1]",
                            "0", NULL);
    cr_assert(k0 && strncmp(k0, "ctxs:chunk:", 11) == 0, "no chunk key found: %s", k0);
    EXPECT(EX_OK, store_a(), g_redis.url, "remote", "push", "long");

    /* Damage every chunk of "long" but chunk 0: rename chunk 0 aside,
     * flip a byte in the middle of every other chunk, put chunk 0 back. */
    char *r = ts_redis_cmd(&g_redis, "RENAME", k0, "aside:k0", NULL);
    free(r);
    uint64_t n_chunks = ts_redis_count(&g_redis, "ctxs:chunk:*");
    cr_assert_geq(n_chunks, 1);
    r = ts_redis_cmd(&g_redis, "EVAL",
                     "local n = 0\n"
                     "for _, k in ipairs(redis.call('KEYS', 'ctxs:chunk:*')) do\n"
                     "  local len = redis.call('STRLEN', k)\n"
                     "  local b = redis.call('GETRANGE', k, len - 7, len - 7)\n"
                     "  redis.call('SETRANGE', k, len - 7, string.char((string.byte(b) + 1) % 256))\n"
                     "  n = n + 1\n"
                     "end\n"
                     "return n",
                     "0", NULL);
    cr_assert_eq(strtoull(r, NULL, 10), n_chunks, "EVAL: %s", r);
    free(r);
    r = ts_redis_cmd(&g_redis, "RENAME", "aside:k0", k0, NULL);
    free(r);

    EXPECT(EX_OK, store_b(), g_redis.url, "remote", "pull", "long", "--json");
    jc_value *v = json_out();
    cr_assert_eq(ju(v, "n_tokens"), 64, "only chunk 0 verifies:\n%s", R.out);
    cr_assert_eq(ju(v, "remote_tokens"), 150);
    cr_assert_eq(ju(v, "to_prefill"), 86);
    cr_assert_str_eq(js(v, "stopped"), "refused");
    const jc_value *rest = jget(v, "rest_ids");
    cr_assert_eq(rest->n, 86);
    for (size_t i = 0; i < rest->n; i++) {
        uint64_t id;
        cr_assert_eq(jc_u64(jc_at(rest, i), &id), 0);
        cr_assert_eq(id, ts_token(64 + i), "rest_ids[%zu]", i);
    }
    jc_free(v);
    check_pulled(store_b(), "long", 64);

    /* Now the damaged chunks are gone, as an eviction leaves it. */
    r = ts_redis_cmd(&g_redis, "RENAME", k0, "aside:k0", NULL);
    free(r);
    r = ts_redis_cmd(&g_redis, "EVAL",
                     "local ks = redis.call('KEYS', 'ctxs:chunk:*')\n"
                     "for _, k in ipairs(ks) do redis.call('DEL', k) end\n"
                     "return #ks",
                     "0", NULL);
    free(r);
    r = ts_redis_cmd(&g_redis, "RENAME", "aside:k0", k0, NULL);
    free(r);
    EXPECT(EX_OK, store_b(), g_redis.url, "remote", "pull", "long", "--as", "long-2");
    contains(1, "pulled 'long' as 'long-2': 64 of 150 tokens");
    contains(1, "evicted");
    contains(1, "86 tokens left to prefill");
    check_pulled(store_b(), "long-2", 64);
    free(k0);
}

/* --- ls and stat ---------------------------------------------------------------- */

Test(cli_remote, ls_and_stat)
{
    ts_redis_start(&g_redis, NULL, 64u << 20);
    ctxs_store *st = open_store(store_a());
    mk(st, "zeta", 512, 0, 70);
    mk(st, "alpha", 512, 0, 128);
    ctxs_store_close(st);
    EXPECT(EX_OK, store_a(), g_redis.url, "remote", "push", "zeta", "alpha");

    /* In store a, which knows the model by name. */
    EXPECT(EX_OK, store_a(), g_redis.url, "remote", "ls", "--json");
    jc_value *v = json_out();
    const jc_value *ss = jget(v, "sessions");
    cr_assert_eq(ss->n, 2, "%s", R.out);
    cr_assert_str_eq(js(v, "sessions[0].name"), "alpha");
    cr_assert_eq(ju(v, "sessions[0].n_tokens"), 128);
    cr_assert_str_eq(js(v, "sessions[0].model"), "tiny-test");
    cr_assert_str_eq(js(v, "sessions[1].name"), "zeta");
    cr_assert_eq(ju(v, "sessions[1].n_tokens"), 70);
    cr_assert_eq(jc_bool(jget(v, "sessions[1].tail_pushed")), 1);
    cr_assert_eq(jget(v, "sessions[1].error")->type, JC_NULL);
    char hex[33];
    ctxs_model m = model();
    cli_hex(hex, m.model_hash);
    cr_assert_str_eq(js(v, "sessions[1].model_hash"), hex);
    cr_assert_gt(ju(v, "sessions[1].updated_unix_ms"), 0);
    jc_free(v);

    /* Where there is no store: it needs none, and makes none. */
    const char *none = ts_path(ts_scratch, "no-store");
    EXPECT(EX_OK, none, g_redis.url, "remote", "ls");
    contains(1, "alpha");
    contains(1, "zeta");
    cr_assert(!ts_exists(none), "remote ls made a store at %s", none);

    EXPECT(EX_OK, none, g_redis.url, "remote", "stat", "--json");
    v = json_out();
    cr_assert_str_eq(js(v, "remote"), g_redis.url);
    cr_assert(strlen(js(v, "server_version")) > 0);
    cr_assert_eq(ju(v, "maxmemory"), 64u << 20);
    cr_assert_str_eq(js(v, "maxmemory_policy"), "allkeys-lru");
    cr_assert_eq(ju(v, "evicted_keys"), 0);
    char *dbsize = ts_redis_cmd(&g_redis, "DBSIZE", NULL);
    cr_assert_eq(ju(v, "keys"), strtoull(dbsize, NULL, 10));
    free(dbsize);
    cr_assert_gt(ju(v, "used_memory"), 0);
    cr_assert_eq(jget(v, "advice")->type, JC_NULL);
    jc_free(v);
    EXPECT(EX_OK, none, g_redis.url, "remote", "stat");
    contains(1, "allkeys-lru");
}

Test(cli_remote, stat_advises_a_limit)
{
    ts_redis_start(&g_redis, NULL, 0);
    EXPECT(EX_OK, ts_path(ts_scratch, "none"), g_redis.url, "remote", "stat", "--json");
    jc_value *v = json_out();
    cr_assert_eq(ju(v, "maxmemory"), 0);
    cr_assert(strstr(js(v, "advice"), "maxmemory"), "%s", R.out);
    jc_free(v);
}

/* --- Failures ------------------------------------------------------------------- */

Test(cli_remote, a_wrong_password_is_refused_and_never_shown)
{
    ts_redis_start(&g_redis, "right-pw-4417", 0);
    ctxs_store *st = open_store(store_a());
    mk(st, "a", 512, 0, 70);
    ctxs_store_close(st);
    char wrong[256], none[256];
    snprintf(wrong, sizeof(wrong), "redis://:wrong-pw-9061@127.0.0.1:%d", g_redis.port);
    snprintf(none, sizeof(none), "redis://127.0.0.1:%d", g_redis.port);

    EXPECT(EX_REMOTE_DOWN, store_a(), NULL, "remote", "push", "a", "--remote", wrong, "--json");
    lacks("wrong-pw-9061");
    jc_value *v = json_out();
    cr_assert_str_eq(js(v, "error.name"), "EACCES");
    cr_assert(strstr(js(v, "error.message"), "redis://:***@127.0.0.1"), "%s", R.out);
    jc_free(v);
    EXPECT(EX_REMOTE_DOWN, store_a(), wrong, "remote", "stat");
    lacks("wrong-pw-9061");
    contains(0, "password");
    /* None given where one is wanted. */
    EXPECT(EX_REMOTE_DOWN, store_a(), none, "remote", "ls");
    contains(0, "password");
    /* The right one: the output does not show it either. */
    EXPECT(EX_OK, store_a(), g_redis.url, "remote", "push", "a");
    lacks("right-pw-4417");
    EXPECT(EX_OK, store_a(), g_redis.url, "remote", "ls", "--json");
    lacks("right-pw-4417");
    contains(1, "\"name\":\"a\"");
}

Test(cli_remote, no_server_is_exit_9)
{
    char url[128];
    snprintf(url, sizeof(url), "redis://:pw-1234@127.0.0.1:%d", free_port());
    ctxs_store *st = open_store(store_a());
    mk(st, "a", 512, 0, 70);
    ctxs_store_close(st);
    EXPECT(EX_REMOTE_DOWN, store_a(), url, "remote", "push", "a", "--json");
    jc_value *v = json_out();
    const jc_value *c = jget(v, "error.code");
    cr_assert(c->is_int && c->negative && c->i64 == -ECONNREFUSED,
              "error.code is not -ECONNREFUSED:\n%s", R.out);
    jc_free(v);
    lacks("pw-1234");
    EXPECT(EX_REMOTE_DOWN, store_b(), url, "remote", "pull", "a");
    contains(0, "cannot reach remote");
    cr_assert(!ts_exists(store_b()), "a failed pull left a store behind");
}

Test(cli_remote, a_missing_or_bad_url_is_a_usage_error)
{
    EXPECT(EX_USAGE, store_a(), NULL, "remote", "ls", "--json");
    jc_value *v = json_out();
    cr_assert_str_eq(js(v, "error.name"), "CTXS_EINVAL");
    cr_assert(strstr(js(v, "error.message"), "CTXSTORE_REMOTE"), "%s", R.out);
    jc_free(v);
    EXPECT(EX_USAGE, store_a(), NULL, "remote", "push", "a");
    contains(0, "--remote URL");
    EXPECT(EX_USAGE, store_a(), "rediss://:tls-pw@127.0.0.1:6380", "remote", "stat");
    lacks("tls-pw");
    /* Not a URL at all ("://" mistyped): nothing before the host shows. */
    EXPECT(EX_USAGE, store_a(), "redis:/:hunter2@127.0.0.1:1", "remote", "stat");
    lacks("hunter2");
    contains(0, "@127.0.0.1:1");
    EXPECT(EX_USAGE, store_a(), "redis:/:hunter2@127.0.0.1:1", "remote", "ls", "--json");
    lacks("hunter2");
    contains(0, "TLS");
    EXPECT(EX_USAGE, store_a(), "redis://127.0.0.1:1", "remote", "frobnicate");
    EXPECT(EX_USAGE, store_a(), "redis://127.0.0.1:1", "remote", "pull");
    EXPECT(EX_USAGE, store_a(), "redis://127.0.0.1:1", "remote", "push", "a", "--as", "b");
    EXPECT(EX_USAGE, store_a(), "redis://127.0.0.1:1", "remote", "pull", "a/b");
}

/* --- tinychat across two machines ------------------------------------------------ */

#define TC_CAPACITY 512u
#define TC_WINDOW 256u /* above every position here: the same in A and B */
#define TC_GEN1 100u
#define TC_GEN2 60u

static const char k_prompt[] = "The quick brown fox jumps over the lazy dog.";
#define N_PROMPT ((uint32_t)(sizeof(k_prompt) - 1))

static tinychat_model *tc_model(void)
{
    tinychat_config cfg;
    tinychat_config_default(&cfg);
    tinychat_model *m = NULL;
    int rc = tinychat_model_create(&m, &cfg);
    cr_assert_eq(rc, 0, "tinychat_model_create: %s", ctxs_err_name(rc));
    return m;
}

/* n tokens generated from next into s, into out; returns the prediction
 * after the last. */
static uint32_t tc_generate(tinychat_model *m, ctxs_session *s, uint32_t next, uint32_t *out,
                            uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        out[i] = next;
        int rc = tinychat_step(m, s, next, &next);
        cr_assert_eq(rc, 0, "tinychat_step: %s", ctxs_err_name(rc));
    }
    return next;
}

/* The conversation: the prompt and TC_GEN1 tokens, in session name of st;
 * with out, it goes on TC_GEN2 tokens without a stop, into out. */
static void tc_conversation(tinychat_model *m, ctxs_store *st, const char *name, uint32_t *out)
{
    ctxs_model cm;
    tinychat_model_ctxs(&cm, m);
    int rc = ctxs_model_register(st, &cm, "tinychat");
    cr_assert(rc == 0 || rc == -EEXIST, "register: %s", ctxs_err_name(rc));
    ctxs_create_options so;
    tinychat_session_options(&so, TC_CAPACITY, TC_WINDOW);
    ctxs_session *s = NULL;
    rc = ctxs_store_session_create(&s, st, name, &cm, &so);
    cr_assert_eq(rc, 0, "create: %s", ctxs_err_name(rc));
    uint32_t ids[N_PROMPT], next, first[TC_GEN1];
    for (uint32_t i = 0; i < N_PROMPT; i++)
        ids[i] = (uint8_t)k_prompt[i];
    rc = tinychat_prefill(m, s, ids, N_PROMPT, &next);
    cr_assert_eq(rc, 0, "prefill: %s", ctxs_err_name(rc));
    next = tc_generate(m, s, next, first, TC_GEN1);
    if (out)
        tc_generate(m, s, next, out, TC_GEN2);
    ctxs_session_close(s);
}

/* Opens name in the store at dir, prefills rest (may be 0 tokens),
 * resumes and generates TC_GEN2 tokens into out. */
static void tc_continue(tinychat_model *m, const char *dir, const char *name,
                        const uint32_t *rest, uint32_t n_rest, uint32_t *out)
{
    ctxs_store *st = open_store(dir);
    ctxs_model cm;
    tinychat_model_ctxs(&cm, m);
    ctxs_open_options oo = CTXS_OPEN_OPTIONS_INIT;
    oo.window = TC_WINDOW;
    ctxs_session *s = NULL;
    int rc = ctxs_store_session_open(&s, st, name, &cm, 0, &oo);
    cr_assert_eq(rc, 0, "open '%s' in %s: %s", name, dir, ctxs_err_name(rc));
    rc = ctxs_session_set_window(s, TC_WINDOW);
    cr_assert_eq(rc, 0, "set_window: %s", ctxs_err_name(rc));
    uint32_t next;
    if (n_rest)
        rc = tinychat_prefill(m, s, rest, n_rest, &next);
    else
        rc = tinychat_resume(m, s, &next);
    cr_assert_eq(rc, 0, "%s: %s", n_rest ? "prefill" : "resume", ctxs_err_name(rc));
    tc_generate(m, s, next, out, TC_GEN2);
    ctxs_session_close(s);
    ctxs_store_close(st);
}

Test(cli_remote, tinychat_continues_in_another_store_with_the_same_tokens)
{
    ts_redis_start(&g_redis, NULL, 0);
    tinychat_model *m = tc_model();
    uint32_t straight[TC_GEN2], in_a[TC_GEN2], in_b[TC_GEN2], in_b_short[TC_GEN2];

    /* The run that never stops, in a store of its own. */
    ctxs_store *st = open_store(ts_path(ts_scratch, "straight"));
    tc_conversation(m, st, "chat", straight);
    ctxs_store_close(st);

    /* Machine A: the conversation, closed; pushed. */
    st = open_store(store_a());
    tc_conversation(m, st, "chat", NULL);
    ctxs_store_close(st);
    EXPECT(EX_OK, store_a(), g_redis.url, "remote", "push", "chat", "--json");
    jc_value *v = json_out();
    const uint64_t n_conv = N_PROMPT + TC_GEN1;
    cr_assert_eq(ju(v, "pushed[0].n_tokens"), n_conv);
    jc_free(v);

    /* Machine B: pulled whole, continued. */
    EXPECT(EX_OK, store_b(), g_redis.url, "remote", "pull", "chat", "--json");
    v = json_out();
    cr_assert_eq(ju(v, "n_tokens"), n_conv);
    cr_assert_eq(ju(v, "to_prefill"), 0);
    jc_free(v);
    tc_continue(m, store_b(), "chat", NULL, 0, in_b);
    tc_continue(m, store_a(), "chat", NULL, 0, in_a);
    for (uint32_t i = 0; i < TC_GEN2; i++) {
        cr_assert_eq(in_a[i], straight[i], "token %u continued in A differs from the run", i);
        cr_assert_eq(in_b[i], straight[i], "token %u continued in B differs from A", i);
    }

    /* Redis lost a chunk after the first (an eviction): B pulls what
     * comes before it, prefills the rest from the ids the pull names, and
     * still continues with the same tokens. */
    char *r = ts_redis_cmd(&g_redis, "EVAL",
                           "local ks = redis.call('KEYS', 'ctxs:chunk:*')\n"
                           "return #ks",
                           "0", NULL);
    uint64_t n_keys = strtoull(r, NULL, 10);
    free(r);
    cr_assert_geq(n_keys, 2, "the conversation is more than one chunk");
    /* Which key is which chunk is the chain hash's secret: take each
     * away in turn until a pull stops short, after some tokens but not
     * all (chunk 0 gone stops it at 0). Keys are few. */
    r = ts_redis_cmd(&g_redis, "EVAL",
                     "local ks = redis.call('KEYS', 'ctxs:chunk:*')\n"
                     "table.sort(ks)\n"
                     "return table.concat(ks, ' ')",
                     "0", NULL);
    char *save = NULL;
    uint64_t got_short = 0;
    uint32_t *rest = NULL;
    uint64_t n_rest = 0;
    for (char *key = strtok_r(r, " ", &save); key && !got_short; key = strtok_r(NULL, " ", &save)) {
        char aside[300];
        snprintf(aside, sizeof(aside), "aside:%s", key);
        free(ts_redis_cmd(&g_redis, "RENAME", key, aside, NULL));
        run(store_b(), g_redis.url, ARGS("remote", "pull", "chat", "--as", "chat-short", "--json"));
        if (R.code != EX_OK) {
            /* Nothing pulled at all (chunk 0 gone) may be an error:
             * the session then appears not at all. */
            free(ts_redis_cmd(&g_redis, "RENAME", aside, key, NULL));
            continue;
        }
        v = json_out();
        uint64_t n = ju(v, "n_tokens");
        if (n > 0 && n < n_conv) {
            got_short = n;
            const jc_value *ids = jget(v, "rest_ids");
            n_rest = ids->n;
            rest = calloc(n_rest, sizeof(*rest));
            cr_assert_not_null(rest);
            for (size_t i = 0; i < n_rest; i++) {
                uint64_t id;
                cr_assert_eq(jc_u64(jc_at(ids, i), &id), 0);
                rest[i] = (uint32_t)id;
            }
            cr_assert_str_eq(js(v, "stopped"), "missing");
        }
        jc_free(v);
        free(ts_redis_cmd(&g_redis, "RENAME", aside, key, NULL));
        if (!got_short) {
            /* The pull made chat-short (whole or empty); drop it. */
            ctxs_store *sb = open_store(store_b());
            int rc = ctxs_store_session_delete(sb, "chat-short");
            cr_assert_eq(rc, 0, "delete chat-short: %s", ctxs_err_name(rc));
            ctxs_store_close(sb);
        }
    }
    free(r);
    cr_assert_gt(got_short, 0, "no single missing chunk made the pull stop short");
    cr_assert_eq(got_short + n_rest, n_conv);
    tc_continue(m, store_b(), "chat-short", rest, (uint32_t)n_rest, in_b_short);
    for (uint32_t i = 0; i < TC_GEN2; i++)
        cr_assert_eq(in_b_short[i], straight[i],
                     "token %u after a short pull and a prefill differs from the run", i);
    free(rest);
    tinychat_model_destroy(m);
}
