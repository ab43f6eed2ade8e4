/*
 * Running the ctxstore binary from a test (cli_run.h).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli_run.h"
#include "json_check.h"
#include "support.h"

extern char **environ;

const char *cli_bin(void)
{
    const char *b = getenv("CTXSTORE_BIN");
    cr_assert(b && *b,
              "CTXSTORE_BIN is not set: it must name the ctxstore binary to test "
              "(meson sets it: env: 'CTXSTORE_BIN=' + tool.full_path())");
    cr_assert_eq(access(b, X_OK), 0, "CTXSTORE_BIN=%s is not an executable: %s", b,
                 strerror(errno));
    return b;
}

static int env_is(const char *entry, const char *name)
{
    size_t n = strlen(name);
    return strncmp(entry, name, n) == 0 && entry[n] == '=';
}

/* Appends what fd has to *buf (kept NUL-terminated, grown as needed);
 * *open_ = 0 at the end of the stream. */
static void drain(int fd, char **buf, size_t *len, size_t *cap, int *open_)
{
    while (*len + 4096 + 1 > *cap) {
        *cap *= 2;
        *buf = realloc(*buf, *cap);
        cr_assert_not_null(*buf);
    }
    ssize_t r = read(fd, *buf + *len, *cap - *len - 1);
    if (r < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    cr_assert_geq(r, 0, "read from the child: %s", strerror(errno));
    if (r == 0)
        *open_ = 0;
    *len += (size_t)r;
    (*buf)[*len] = '\0';
}

unsigned cli_run_limit_s;

int cli_run(cli_result *r, const char *path, const char *store, const char *const *env,
            const char *const *args, int unprivileged)
{
    cli_result R = {0};
    free(r->out);
    free(r->err);
    memset(r, 0, sizeof(*r));

    size_t n_args = 0;
    while (args[n_args])
        n_args++;
    char **argv = calloc(n_args + 2, sizeof(*argv));
    cr_assert_not_null(argv);
    argv[0] = (char *)"ctxstore";
    size_t w = (size_t)snprintf(R.what, sizeof(R.what), "ctxstore");
    for (size_t i = 0; i < n_args; i++) {
        argv[i + 1] = (char *)args[i];
        if (w < sizeof(R.what))
            w += (size_t)snprintf(R.what + w, sizeof(R.what) - w, " %s", args[i]);
    }

    static const char *const replaced[] = { "CTXSTORE_DIR", "HOME", "XDG_DATA_HOME" };
    size_t n_env = 0, n_extra = 0;
    while (environ[n_env])
        n_env++;
    while (env && env[n_extra])
        n_extra++;
    char **envp = calloc(n_env + n_extra + 4, sizeof(*envp));
    cr_assert_not_null(envp);
    size_t k = 0;
    for (size_t i = 0; i < n_env; i++) {
        int skip = 0;
        for (size_t j = 0; j < 3; j++)
            skip |= env_is(environ[i], replaced[j]);
        for (size_t j = 0; j < n_extra; j++) {
            size_t len = strcspn(env[j], "=");
            skip |= strncmp(environ[i], env[j], len) == 0 && environ[i][len] == '=';
        }
        if (!skip)
            envp[k++] = environ[i];
    }
    static char store_env[4200], home_env[4200];
    const char *home = ts_path(ts_scratch, "home");
    mkdir(home, 0700);
    snprintf(home_env, sizeof(home_env), "HOME=%s", home);
    envp[k++] = home_env;
    if (store) {
        snprintf(store_env, sizeof(store_env), "CTXSTORE_DIR=%s", store);
        envp[k++] = store_env;
    }
    for (size_t j = 0; j < n_extra; j++)
        if (strchr(env[j], '='))
            envp[k++] = (char *)env[j];
    envp[k] = NULL;

    int out_pipe[2], err_pipe[2];
    cr_assert_eq(pipe2(out_pipe, O_CLOEXEC), 0);
    cr_assert_eq(pipe2(err_pipe, O_CLOEXEC), 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        int in = open("/dev/null", O_RDONLY);
        if (in < 0 || dup2(in, 0) < 0 || dup2(out_pipe[1], 1) < 0 || dup2(err_pipe[1], 2) < 0)
            _exit(126);
        if (unprivileged && ts_drop_privileges() != 0)
            _exit(126);
        execve(path, argv, envp);
        _exit(127);
    }
    close(out_pipe[1]);
    close(err_pipe[1]);
    /* Both pipes at once: a child that fills one while the test waits on
     * the other would never finish. */
    size_t out_cap = 1, err_cap = 1;
    int out_open = 1, err_open = 1;
    R.out = calloc(1, 1);
    R.err = calloc(1, 1);
    cr_assert(R.out && R.err);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (out_open || err_open) {
        struct pollfd p[2] = { { out_open ? out_pipe[0] : -1, POLLIN, 0 },
                               { err_open ? err_pipe[0] : -1, POLLIN, 0 } };
        int wait_ms = -1;
        if (cli_run_limit_s) {
            struct timespec t;
            clock_gettime(CLOCK_MONOTONIC, &t);
            double left = cli_run_limit_s - ((double)(t.tv_sec - t0.tv_sec) +
                                             (double)(t.tv_nsec - t0.tv_nsec) / 1e9);
            if (left <= 0) {
                kill(pid, SIGKILL);
                waitpid(pid, NULL, 0);
                cr_assert_fail("`%s` was still running after %u s: killed.\nstdout:\n%s\n"
                               "stderr:\n%s", R.what, cli_run_limit_s, R.out, R.err);
            }
            wait_ms = (int)(left * 1000) + 1;
        }
        int n = poll(p, 2, wait_ms);
        if (n < 0 && errno == EINTR)
            continue;
        cr_assert_geq(n, 0, "poll: %s", strerror(errno));
        if (out_open && p[0].revents)
            drain(out_pipe[0], &R.out, &R.out_len, &out_cap, &out_open);
        if (err_open && p[1].revents)
            drain(err_pipe[0], &R.err, &R.err_len, &err_cap, &err_open);
    }
    close(out_pipe[0]);
    close(err_pipe[0]);
    int st;
    pid_t got;
    while ((got = waitpid(pid, &st, 0)) < 0 && errno == EINTR)
        ;
    cr_assert_eq(got, pid);
    free(argv);
    free(envp);
    if (WIFSIGNALED(st))
        cr_assert_fail("`%s` died of signal %d (%s).\nstdout:\n%s\nstderr:\n%s", R.what,
                       WTERMSIG(st), strsignal(WTERMSIG(st)), R.out, R.err);
    cr_assert(WIFEXITED(st));
    cr_assert_neq(WEXITSTATUS(st), 127, "could not execute %s", path);
    /* A binary built with sanitizers reports on stderr. */
    cr_assert(!strstr(R.err, "Sanitizer") && !strstr(R.err, "runtime error:"),
              "`%s`: a sanitizer found an error:\n%s", R.what, R.err);
    R.code = WEXITSTATUS(st);
    *r = R;
    return R.code;
}

void cli_expect_exit(const cli_result *r, int got, int code)
{
    cr_assert_eq(got, code, "`%s` exited %d, expected %d.\nstdout:\n%s\nstderr:\n%s", r->what,
                 got, code, r->out, r->err);
}

void cli_contains(const cli_result *r, int out, const char *s)
{
    const char *text = out ? r->out : r->err;
    cr_assert(strstr(text, s) != NULL, "`%s`: %s does not say \"%s\". It says:\n%s", r->what,
              out ? "stdout" : "stderr", s, text);
}

jc_value *cli_json(const cli_result *r)
{
    char err[256];
    jc_value *v = jc_parse(r->out, r->out_len, err, sizeof(err));
    cr_assert_not_null(v, "`%s` --json output does not parse: %s\n%s", r->what, err, r->out);
    cr_assert(r->out_len > 0 && r->out[r->out_len - 1] == '\n',
              "`%s`: the JSON document does not end with a newline", r->what);
    return v;
}

const jc_value *cli_jget(const cli_result *r, const jc_value *v, const char *path)
{
    const jc_value *x = jc_path(v, path);
    cr_assert_not_null(x, "`%s`: no \"%s\" in the JSON output:\n%s", r->what, path, r->out);
    return x;
}

uint64_t cli_ju(const cli_result *r, const jc_value *v, const char *path)
{
    uint64_t u;
    cr_assert_eq(jc_u64(cli_jget(r, v, path), &u), 0, "`%s`: \"%s\" is not a count:\n%s", r->what,
                 path, r->out);
    return u;
}

const char *cli_js(const cli_result *r, const jc_value *v, const char *path)
{
    const char *s = jc_str(cli_jget(r, v, path));
    cr_assert_not_null(s, "`%s`: \"%s\" is not a string:\n%s", r->what, path, r->out);
    return s;
}

void cli_hex(char out[33], const uint8_t hash[16])
{
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", hash[i]);
}
