/*
 * Writes the format 1.1 session files in this folder. Not built by meson:
 * it was built once against the 1.1 code (commit 33931c0) and its
 * tests/support.c, whose ts_model/ts_fill_kv/ts_token give the contents
 * that tests/test_format.c checks:
 *
 *     git worktree add /tmp/ctxs-v11 33931c0
 *     meson setup /tmp/ctxs-v11/build && ninja -C /tmp/ctxs-v11/build
 *     cc -std=c11 -D_GNU_SOURCE -I/tmp/ctxs-v11/include -I/tmp/ctxs-v11/tests \
 *        -I/tmp/ctxs-v11/src/store \
 *        tests/data/make_v1_1.c /tmp/ctxs-v11/build/tests/libctxs_test_support.a \
 *        /tmp/ctxs-v11/build/src/libctxstore.a -lcriterion -lxxhash -lz -llmdb \
 *        -lpthread -o /tmp/make_v1_1
 *     /tmp/make_v1_1 tests/data
 *
 * v1_1.ctxs:      ts_model(1), capacity 64, 4 sinks, ring; 20 tokens
 *                 committed 5 + 7 + 8 at FULL; labelled id 11, "made by 1.1".
 * v1_1_ring.ctxs: the same geometry; 100 tokens committed 30 + 30 + 40 at
 *                 FULL, so the ring has wrapped: sinks 0..3 and 40..99 held.
 */
#define MAKE_OPTIONS(m, o, variant) ((void)(variant), (o).open.durability = CTXS_SYNC_FULL)
#define MAKE_LABEL
#include "make_files.h"

int main(int argc, char **argv)
{
    return make_both(argc, argv, "v1_1.ctxs", 0, "v1_1_ring.ctxs", 0) ||
           label(argv[1], "v1_1.ctxs", 11, "made by 1.1");
}
