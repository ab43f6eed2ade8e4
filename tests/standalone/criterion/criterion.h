/*
 * Criterion's Test(), TestSuite() and assertions without Criterion, for
 * builds that Criterion cannot run in: under ThreadSanitizer its test
 * runner aborts before any test starts ("Could not initialize inheritable
 * arena", Snaipe/Criterion#274). With this directory first on the include
 * path, a suite and tests/support.c build unchanged into a plain program
 * that runs each test in a forked child, one after the other:
 *
 *     test_x [substring of suite::name ...]
 *
 * Only what the suites built this way use is here. An assertion that fails
 * prints where and why and ends the test's child with exit status 1.
 */
#ifndef CTXS_STANDALONE_CRITERION_H
#define CTXS_STANDALONE_CRITERION_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CTXS_SA_MAX_TESTS 64

typedef struct ctxs_sa_suite {
    void (*init)(void);
    void (*fini)(void);
    double timeout;
} ctxs_sa_suite;

typedef struct ctxs_sa_test {
    const char *suite, *name;
    void (*fn)(void);
    const ctxs_sa_suite *opts;
} ctxs_sa_test;

void ctxs_sa_register(const char *suite, const char *name, void (*fn)(void));
void ctxs_sa_register_suite(const char *suite, const ctxs_sa_suite *opts);
__attribute__((noreturn, format(printf, 4, 5))) void
ctxs_sa_fail(const char *file, int line, const char *expr, const char *fmt, ...);
__attribute__((format(printf, 4, 5))) void
ctxs_sa_expect(const char *file, int line, const char *expr, const char *fmt, ...);

/* One registry for the whole program: weak, so that every file that
 * includes this shares it. */
__attribute__((weak)) ctxs_sa_test ctxs_sa_tests[CTXS_SA_MAX_TESTS];
__attribute__((weak)) int ctxs_sa_n_tests;
__attribute__((weak)) struct {
    const char *suite;
    const ctxs_sa_suite *opts;
} ctxs_sa_suites[16];
__attribute__((weak)) int ctxs_sa_n_suites;

__attribute__((weak)) void ctxs_sa_register(const char *suite, const char *name, void (*fn)(void))
{
    if (ctxs_sa_n_tests < CTXS_SA_MAX_TESTS)
        ctxs_sa_tests[ctxs_sa_n_tests++] = (ctxs_sa_test){suite, name, fn, NULL};
}

__attribute__((weak)) void ctxs_sa_register_suite(const char *suite, const ctxs_sa_suite *opts)
{
    if (ctxs_sa_n_suites < 16) {
        ctxs_sa_suites[ctxs_sa_n_suites].suite = suite;
        ctxs_sa_suites[ctxs_sa_n_suites++].opts = opts;
    }
}

__attribute__((weak, noreturn, format(printf, 4, 5))) void
ctxs_sa_fail(const char *file, int line, const char *expr, const char *fmt, ...)
{
    fprintf(stderr, "%s:%d: Assertion failed: %s\n  ", file, line, expr);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    _exit(1);
}

__attribute__((weak)) int ctxs_sa_expect_failed;

__attribute__((weak, format(printf, 4, 5))) void
ctxs_sa_expect(const char *file, int line, const char *expr, const char *fmt, ...)
{
    fprintf(stderr, "%s:%d: Expectation failed: %s\n  ", file, line, expr);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    ctxs_sa_expect_failed = 1;
}

/* Runs the tests whose "suite::name" holds one of the arguments (all with
 * none), each in a child of its own; the exit status says whether all
 * passed. */
__attribute__((weak)) int main(int argc, char **argv)
{
    int failed = 0, ran = 0;
    for (int i = 0; i < ctxs_sa_n_tests; i++) {
        ctxs_sa_test *t = &ctxs_sa_tests[i];
        char full[512];
        snprintf(full, sizeof(full), "%s::%s", t->suite, t->name);
        int want = argc < 2;
        for (int a = 1; a < argc && !want; a++)
            want = strstr(full, argv[a]) != NULL;
        if (!want)
            continue;
        const ctxs_sa_suite *opts = NULL;
        for (int s = 0; s < ctxs_sa_n_suites; s++)
            if (strcmp(ctxs_sa_suites[s].suite, t->suite) == 0)
                opts = ctxs_sa_suites[s].opts;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 2;
        }
        if (pid == 0) {
            if (opts && opts->init)
                opts->init();
            t->fn();
            if (opts && opts->fini)
                opts->fini();
            fflush(NULL);
            exit(ctxs_sa_expect_failed ? 1 : 0); /* exit(): sanitizers report at exit */
        }
        int status;
        while (waitpid(pid, &status, 0) < 0)
            ;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double secs = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
        int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        printf("[%s] %s (%.2fs)", ok ? "PASS" : "FAIL", full, secs);
        if (WIFEXITED(status) && WEXITSTATUS(status))
            printf(": exit status %d%s", WEXITSTATUS(status),
                   WEXITSTATUS(status) == 66 ? " (sanitizer reports)" : "");
        else if (WIFSIGNALED(status))
            printf(": signal %d", WTERMSIG(status));
        printf("\n");
        failed += !ok;
        ran++;
    }
    printf("[====] %d tests, %d failed\n", ran, failed);
    return failed || !ran ? 1 : 0;
}

#define CTXS_SA_CAT_(a, b) a##b
#define CTXS_SA_CAT(a, b) CTXS_SA_CAT_(a, b)

#define Test(suite, name, ...)                                                                     \
    static void suite##__##name(void);                                                             \
    __attribute__((constructor)) static void suite##__##name##__reg(void)                          \
    {                                                                                              \
        ctxs_sa_register(#suite, #name, suite##__##name);                                          \
    }                                                                                              \
    static void suite##__##name(void)

#define TestSuite(suite, ...)                                                                      \
    static const ctxs_sa_suite suite##__opts = {__VA_ARGS__};                                      \
    __attribute__((constructor)) static void suite##__suite_reg(void)                              \
    {                                                                                              \
        ctxs_sa_register_suite(#suite, &suite##__opts);                                            \
    }

#define cr_assert(cond, ...)                                                                       \
    ((cond) ? (void)0 : ctxs_sa_fail(__FILE__, __LINE__, #cond, " " __VA_ARGS__))
#define cr_expect(cond, ...)                                                                       \
    ((cond) ? (void)0 : ctxs_sa_expect(__FILE__, __LINE__, #cond, " " __VA_ARGS__))
#define cr_assert_fail(...) ctxs_sa_fail(__FILE__, __LINE__, "fail", " " __VA_ARGS__)
#define cr_assert_eq(a, b, ...) cr_assert((a) == (b), __VA_ARGS__)
#define cr_assert_neq(a, b, ...) cr_assert((a) != (b), __VA_ARGS__)
#define cr_assert_lt(a, b, ...) cr_assert((a) < (b), __VA_ARGS__)
#define cr_assert_leq(a, b, ...) cr_assert((a) <= (b), __VA_ARGS__)
#define cr_assert_gt(a, b, ...) cr_assert((a) > (b), __VA_ARGS__)
#define cr_assert_geq(a, b, ...) cr_assert((a) >= (b), __VA_ARGS__)
#define cr_assert_null(p, ...) cr_assert((p) == NULL, __VA_ARGS__)
#define cr_assert_not_null(p, ...) cr_assert((p) != NULL, __VA_ARGS__)
#define cr_expect_eq(a, b, ...) cr_expect((a) == (b), __VA_ARGS__)
#define cr_expect_neq(a, b, ...) cr_expect((a) != (b), __VA_ARGS__)
#define cr_expect_lt(a, b, ...) cr_expect((a) < (b), __VA_ARGS__)
#define cr_expect_leq(a, b, ...) cr_expect((a) <= (b), __VA_ARGS__)
#define cr_expect_gt(a, b, ...) cr_expect((a) > (b), __VA_ARGS__)
#define cr_expect_geq(a, b, ...) cr_expect((a) >= (b), __VA_ARGS__)
#define cr_log_info(...) (fprintf(stderr, __VA_ARGS__), fputc('\n', stderr))
#define cr_log_warn(...) (fprintf(stderr, __VA_ARGS__), fputc('\n', stderr))
#define cr_log_error(...) (fprintf(stderr, __VA_ARGS__), fputc('\n', stderr))
#define cr_skip_test(...) (fprintf(stderr, "SKIPPED: " __VA_ARGS__), fputc('\n', stderr), _exit(0))

#endif
