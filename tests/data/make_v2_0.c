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
#define MAKE_OPTIONS(m, o, variant) /* variant: the dtype */                                  \
    ((m).geometry.dtype = (variant), (o).ring = 1, (o).open.durability = CTXS_SYNC_FULL)
#define MAKE_LABEL
#include "make_files.h"

int main(int argc, char **argv)
{
    return make_both(argc, argv, "v2_0_bf16.ctxs", CTXS_DTYPE_BF16, "v2_0_q8.ctxs",
                     CTXS_DTYPE_Q8) ||
           label(argv[1], "v2_0_bf16.ctxs", 21, "made by 2.0");
}
