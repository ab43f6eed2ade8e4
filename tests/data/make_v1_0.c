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
#define MAKE_OPTIONS(m, o, variant) ((void)(variant), (o).durability = CTXS_SYNC_FULL)
#include "make_files.h"

int main(int argc, char **argv)
{
    return make_both(argc, argv, "v1_0.ctxs", 0, "v1_0_ring.ctxs", 0);
}
