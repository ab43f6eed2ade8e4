/*
 * Writes export_v1_0.ctxx in this folder: an export file of format 1.0,
 * before the format carried metadata. Not built by meson: it was built
 * once against the 1.0 export code (commit d54bf74) and its
 * tests/support.c, whose ts_model/ts_fill_kv/ts_token give the contents
 * that tests/test_transfer.c checks:
 *
 *     git worktree add /tmp/ctxs-x10 d54bf74
 *     meson setup /tmp/ctxs-x10/build && ninja -C /tmp/ctxs-x10/build
 *     cc -std=c11 -D_GNU_SOURCE -I/tmp/ctxs-x10/include -I/tmp/ctxs-x10/tests \
 *        tests/data/make_export_v1_0.c /tmp/ctxs-x10/build/tests/libctxs_test_support.a \
 *        /tmp/ctxs-x10/build/src/libctxstore.a -lcriterion -lxxhash -lz -llmdb \
 *        -lpthread -o /tmp/make_export_v1_0
 *     /tmp/make_export_v1_0 tests/data
 *
 * export_v1_0.ctxx: the session "old chat" of ts_model(1), registered as
 * "tiny model"; capacity 64, 4 sinks, ring; 100 tokens committed 30 + 30
 * + 40, so the ring has wrapped: positions 0..3 and 40..99 are held.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctxstore.h"
#include "support.h"

int main(int argc, char **argv)
{
    static const uint32_t commits[] = { 30, 30, 40 };
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    char *tmp = ts_mkdtemp();
    char store_dir[4096], out[4096];
    snprintf(store_dir, sizeof(store_dir), "%s/store", tmp);
    snprintf(out, sizeof(out), "%s/export_v1_0.ctxx", argv[1]);
    ctxs_store *st = NULL;
    ctxs_session *s = NULL;
    ctxs_model m = ts_model(1);
    ctxs_create_options o = ts_options(64, 4, 1, CTXS_SYNC_FULL);
    int rc = ctxs_store_open(&st, store_dir, NULL);
    if (rc == 0)
        rc = ctxs_model_register(st, &m, "tiny model");
    if (rc == 0)
        rc = ctxs_store_session_create(&s, st, "old chat", &m, &o);
    for (size_t i = 0; rc == 0 && i < sizeof(commits) / sizeof(commits[0]); i++)
        rc = ts_append(s, commits[i]);
    ctxs_session_close(s);
    if (rc == 0)
        rc = ctxs_store_session_export(st, "old chat", out, NULL);
    ctxs_store_close(st);
    ts_rmtree(tmp);
    free(tmp);
    if (rc)
        fprintf(stderr, "%s: %s\n", out, ctxs_strerror(rc));
    return rc != 0;
}
