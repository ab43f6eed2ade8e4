/*
 * Writes the format 1.0 session files in this folder. Not built by meson:
 * it was built once against the 1.0 code (commit e4db93f) and its
 * tests/support.c, whose ts_model/ts_fill_kv/ts_token give the contents
 * that tests/test_format.c checks:
 *
 *     git worktree add /tmp/ctxs-v10 e4db93f
 *     meson setup /tmp/ctxs-v10/build && ninja -C /tmp/ctxs-v10/build
 *     cc -std=c11 -D_GNU_SOURCE -I/tmp/ctxs-v10/include -I/tmp/ctxs-v10/tests \
 *        tests/data/make_v1_0.c /tmp/ctxs-v10/build/tests/libctxs_test_support.a \
 *        /tmp/ctxs-v10/build/src/libctxstore.a -lcriterion -lxxhash -lz -llmdb \
 *        -lpthread -o /tmp/make_v1_0
 *     /tmp/make_v1_0 tests/data
 *
 * v1_0.ctxs:      ts_model(1), capacity 64, 4 sinks, ring; 20 tokens
 *                 committed 5 + 7 + 8 at FULL.
 * v1_0_ring.ctxs: the same geometry; 100 tokens committed 30 + 30 + 40 at
 *                 FULL, so the ring has wrapped: sinks 0..3 and 40..99 held.
 */
#include <stdio.h>
#include <stdlib.h>

#include "ctxstore.h"
#include "support.h"

static int make(const char *dir, const char *name, const uint32_t *commits, int n)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    ctxs_model m = ts_model(1);
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = 64;
    o.n_sink = 4;
    o.durability = CTXS_SYNC_FULL;
    ctxs_session *s;
    int rc = ctxs_session_create(&s, path, &m, &o);
    for (int i = 0; rc == 0 && i < n; i++)
        rc = ts_append(s, commits[i]);
    ctxs_session_close(s);
    if (rc)
        fprintf(stderr, "%s: %s\n", path, ctxs_strerror(rc));
    return rc;
}

int main(int argc, char **argv)
{
    static const uint32_t few[] = { 5, 7, 8 }, wrap[] = { 30, 30, 40 };
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    return make(argv[1], "v1_0.ctxs", few, 3) || make(argv[1], "v1_0_ring.ctxs", wrap, 3);
}
