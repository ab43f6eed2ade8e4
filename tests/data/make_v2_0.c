/*
 * Writes the format 2.0 session files in this folder. Not built by meson:
 * it was built once against the 2.0 code (commit 8e44259) and its
 * tests/support.c, whose ts_model/ts_fill_kv/ts_token give the contents
 * that tests/test_format.c checks:
 *
 *     git worktree add /tmp/ctxs-v20 8e44259
 *     meson setup /tmp/ctxs-v20/build && ninja -C /tmp/ctxs-v20/build
 *     cc -std=c11 -D_GNU_SOURCE -I/tmp/ctxs-v20/include -I/tmp/ctxs-v20/tests \
 *        -I/tmp/ctxs-v20/src/store \
 *        tests/data/make_v2_0.c /tmp/ctxs-v20/build/tests/libctxs_test_support.a \
 *        /tmp/ctxs-v20/build/src/libctxstore.a -lcriterion -lxxhash -lz -llmdb \
 *        -lpthread -o /tmp/make_v2_0
 *     /tmp/make_v2_0 tests/data
 *
 * v2_0_bf16.ctxs: ts_model(1) stored as bf16, capacity 64, 4 sinks, ring;
 *                 20 tokens committed 5 + 7 + 8 at FULL (ts_append: fp16
 *                 handed over); labelled id 21, "made by 2.0".
 * v2_0_q8.ctxs:   the same as Q8; 100 tokens committed 30 + 30 + 40 at
 *                 FULL, so the ring has wrapped: sinks 0..3 and 40..99 held.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include "ctxstore.h"
#include "support.h"
#include "label.h"

static int make(const char *dir, const char *name, uint32_t dtype, const uint32_t *commits,
                int n)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    ctxs_model m = ts_model(1);
    m.geometry.dtype = dtype;
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = 64;
    o.n_sink = 4;
    o.ring = 1;
    o.open.durability = CTXS_SYNC_FULL;
    ctxs_session *s;
    int rc = ctxs_session_create(&s, path, &m, &o);
    for (int i = 0; rc == 0 && i < n; i++)
        rc = ts_append(s, commits[i]);
    ctxs_session_close(s);
    if (rc)
        fprintf(stderr, "%s: %s\n", path, ctxs_strerror(rc));
    return rc;
}

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

int main(int argc, char **argv)
{
    static const uint32_t few[] = { 5, 7, 8 }, wrap[] = { 30, 30, 40 };
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    return make(argv[1], "v2_0_bf16.ctxs", CTXS_DTYPE_BF16, few, 3) ||
           make(argv[1], "v2_0_q8.ctxs", CTXS_DTYPE_Q8, wrap, 3) ||
           label(argv[1], "v2_0_bf16.ctxs", 21, "made by 2.0");
}
