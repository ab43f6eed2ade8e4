/*
 * The replay driver: runs a fuzz target's LLVMFuzzerTestOneInput over every
 * file in the directories and files named on the command line, without
 * libFuzzer, so that each corpus runs as a plain test (zstd's
 * tests/fuzz/regression_driver.c). A crash, a sanitizer report or an
 * abort from the target fails the test; the file being run is printed
 * first when CTXS_FUZZ_VERBOSE is set, and always named on a read error.
 *
 * Each input runs under a time budget (alarm(): CTXS_FUZZ_TIMEOUT seconds,
 * 30 by default, as libFuzzer's -timeout= in scripts/fuzz.sh): work on any
 * input is bounded by what the input can hold, so one that runs past it is
 * a finding, and fails the test naming the file, not a hang for meson's
 * timeout to kill.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz.h"

__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    return 0;
}

static int verbose;
static unsigned budget_s = 30;
static char slow_msg[4200]; /* said by the alarm: the input being run */
static size_t slow_len;

static void on_alarm(int sig)
{
    (void)sig;
    /* async-signal-safe: a prepared message, then out */
    ssize_t w = write(2, slow_msg, slow_len);
    (void)w;
    _exit(1);
}

static int run_file(const char *path, size_t *n_run)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, len = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(f);
            fprintf(stderr, "replay: out of memory\n");
            return -1;
        }
        len += fread(buf + len, 1, cap - len, f);
        if (len < cap)
            break;
        cap *= 2;
        buf = realloc(buf, cap);
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        fprintf(stderr, "replay: %s: read error\n", path);
        return -1;
    }
    if (verbose)
        fprintf(stderr, "replay: %s (%zu bytes)\n", path, len);
    /* An exact-size copy, so that ASan sees a read past the input. */
    uint8_t *in = malloc(len ? len : 1);
    if (!in) {
        free(buf);
        return -1;
    }
    memcpy(in, buf, len);
    free(buf);
    int said = snprintf(slow_msg, sizeof(slow_msg),
                        "replay: %s ran past its budget of %u s: work on an input must be "
                        "bounded by what it holds (a slow input is a finding)\n",
                        path, budget_s);
    slow_len = said > 0 && (size_t)said < sizeof(slow_msg) ? (size_t)said : sizeof(slow_msg) - 1;
    alarm(budget_s);
    LLVMFuzzerTestOneInput(in, len);
    alarm(0);
    free(in);
    (*n_run)++;
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_path(const char *path, size_t *n_run)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(sb.st_mode))
        return run_file(path, n_run);
    DIR *d = opendir(path);
    if (!d) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    /* In name order, so that a run is the same everywhere. */
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char **more = realloc(names, (n + 1) * sizeof(*names));
        if (!more)
            abort();
        names = more;
        names[n++] = fuzz_join(path, e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof(*names), by_name);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        if (run_path(names[i], n_run) < 0)
            rc = -1;
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    verbose = getenv("CTXS_FUZZ_VERBOSE") != NULL;
    const char *t = getenv("CTXS_FUZZ_TIMEOUT");
    if (t && atoi(t) > 0)
        budget_s = (unsigned)atoi(t);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
    LLVMFuzzerInitialize(&argc, &argv);
    size_t n_run = 0;
    int rc = 0;
    for (int i = 1; i < argc; i++)
        if (run_path(argv[i], &n_run) < 0)
            rc = 1;
    printf("replay: %zu inputs run\n", n_run);
    if (n_run == 0) {
        fprintf(stderr, "replay: no inputs\n");
        return 1;
    }
    return rc;
}
