/*
 * What the make_v*.c generators of this folder share: a session file of
 * ts_model(1), capacity 64, 4 sinks, its tokens committed at FULL by
 * ts_append() in the steps given, and a label written into a file. Each
 * generator is built against the code of its own format version (see its
 * opening comment), whose API differed: before including this it defines
 *
 *   MAKE_OPTIONS(m, o, variant)  what its version sets beyond capacity and
 *                                sinks (FULL durability, and what variant
 *                                selects), on the model m and the options o
 *   MAKE_LABEL                   where its version has file labels
 *                                (src/store/label.h)
 */
#ifndef CTXS_TESTS_DATA_MAKE_FILES_H
#define CTXS_TESTS_DATA_MAKE_FILES_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctxstore.h"
#include "support.h"

#ifdef MAKE_LABEL
#include <fcntl.h>
#include <unistd.h>

#include "label.h"
#endif

/* The commits of the two files each version writes: a few tokens, and
 * enough that the ring has wrapped (sinks 0..3 and 40..99 held). */
static const uint32_t make_few[] = { 5, 7, 8 }, make_wrap[] = { 30, 30, 40 };

static int make(const char *dir, const char *name, uint32_t variant, const uint32_t *commits,
                int n)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    ctxs_model m = ts_model(1);
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = 64;
    o.n_sink = 4;
    MAKE_OPTIONS(m, o, variant);
    ctxs_session *s;
    int rc = ctxs_session_create(&s, path, &m, &o);
    for (int i = 0; rc == 0 && i < n; i++)
        rc = ts_append(s, commits[i]);
    ctxs_session_close(s);
    if (rc)
        fprintf(stderr, "%s: %s\n", path, ctxs_strerror(rc));
    return rc;
}

/* make() of the two files, few and wrap, into the folder argv[1]. */
static int make_both(int argc, char **argv, const char *few, uint32_t few_variant,
                     const char *wrap, uint32_t wrap_variant)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    return make(argv[1], few, few_variant, make_few, 3) ||
           make(argv[1], wrap, wrap_variant, make_wrap, 3);
}

#ifdef MAKE_LABEL
static int label(const char *dir, const char *name, uint64_t id, const char *text)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int fd = open(path, O_RDWR);
    int rc = fd < 0 ? -1 : ctxs__label_write(fd, id, text, (uint32_t)strlen(text));
    if (fd >= 0)
        close(fd);
    return rc;
}
#endif

#endif
