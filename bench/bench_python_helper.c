/*
 * bench_python_helper — the C side of bench/bench_python.py: the same
 * operation the Python benchmark times from Python, timed from C in the same
 * run, on a session file the Python side prepared, so that the ratio
 * Python / C compares like with like.
 *
 *   bench_python_helper save_turn FILE ITERS GAP_MS
 *       opens FILE read-write (ASYNC, background thread on), then 1 + ITERS
 *       turns of 64 tokens, each after a pause of GAP_MS: reserve + one
 *       memcpy per (layer, K/V, head) through ctxs_session_get_layout() +
 *       commit, as bench_session's save_turn ctxstore_async. The first turn
 *       is an untimed warm-up.
 *   bench_python_helper open FILE ITERS
 *       1 + ITERS times: open read-write + ctxs_session_get_layout(), timed
 *       (but the first), then close, untimed.
 *
 * The session's model is read from FILE (ctxs_file_inspect()); its slots
 * must be fp16 or bf16 and the reservations must land in never-written
 * slots (the caller sizes the capacity). Prints one time per line, in
 * microseconds, and nothing else on stdout.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "ctxstore.h"

const char *const bench_program = "bench_python_helper";

enum { TURN_TOKENS = 64 };

static ctxs_session *open_rw(const char *path, const ctxs_model *model)
{
    ctxs_open_options o = CTXS_OPEN_OPTIONS_INIT;
    ctxs_session *s;
    check_ctxs(ctxs_session_open(&s, path, model, 0, &o), "ctxs_session_open");
    return s;
}

static void save_turns(const char *path, const ctxs_model *model, uint32_t iters,
                       uint32_t gap_ms)
{
    const ctxs_geometry *g = &model->geometry;
    const uint32_t n_runs = g->n_layers * 2 * g->n_kv_heads;
    const size_t run_bytes = (size_t)TURN_TOKENS * g->head_dim * 2;
    uint8_t *turn = xmalloc(run_bytes * n_runs);
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    fill_fp16(turn, run_bytes * n_runs, &seed); /* also pre-faults it */
    uint32_t ids[TURN_TOKENS];
    for (uint32_t i = 0; i < TURN_TOKENS; i++)
        ids[i] = (uint32_t)(xorshift64(&seed) % 151936);

    ctxs_session *s = open_rw(path, model);
    ctxs_layout lay;
    get_layout(&lay, s, (size_t)g->head_dim * 2);
    for (uint32_t it = 0; it <= iters; it++) {
        pause_ms(gap_ms);
        double t0 = now_us();
        ctxs_reservation r;
        check_ctxs(ctxs_session_reserve(&r, s, TURN_TOKENS), "ctxs_session_reserve");
        uint32_t done = 0;
        for (uint32_t j = 0; j < r.n_spans; j++) {
            const size_t bytes = (size_t)r.spans[j].count * lay.slot_bytes;
            const size_t dst = (size_t)r.spans[j].slot * lay.slot_bytes;
            for (uint32_t run = 0; run < n_runs; run++)
                memcpy(kv_run(&lay, g->n_kv_heads, run) + dst,
                       turn + run * run_bytes + (size_t)done * lay.slot_bytes, bytes);
            done += r.spans[j].count;
        }
        check_ctxs(ctxs_session_commit(s, ids, TURN_TOKENS), "ctxs_session_commit");
        double t = now_us() - t0;
        if (it > 0)
            printf("%.1f\n", t);
    }
    ctxs_session_close(s);
    free(turn);
}

static void opens(const char *path, const ctxs_model *model, uint32_t iters)
{
    for (uint32_t it = 0; it <= iters; it++) {
        double t0 = now_us();
        ctxs_session *s = open_rw(path, model);
        ctxs_layout lay;
        check_ctxs(ctxs_session_get_layout(&lay, s), "ctxs_session_get_layout");
        double t = now_us() - t0;
        ctxs_session_close(s);
        if (it > 0)
            printf("%.1f\n", t);
    }
}

static _Noreturn void usage(void)
{
    fputs("usage: bench_python_helper save_turn FILE ITERS GAP_MS\n"
          "       bench_python_helper open FILE ITERS\n", stderr);
    exit(2);
}

int main(int argc, char **argv)
{
    if (argc < 4)
        usage();
    const char *mode = argv[1], *path = argv[2];
    uint32_t iters = parse_count(argv[3], "ITERS", 1, 1000);
    ctxs_file_report rep;
    check_ctxs(ctxs_file_inspect(&rep, path), "ctxs_file_inspect");
    check_ctxs(rep.status, path);
    if (rep.model.geometry.dtype != CTXS_DTYPE_F16 && rep.model.geometry.dtype != CTXS_DTYPE_BF16)
        die("%s: fp16 or bf16 sessions only", path);
    if (!strcmp(mode, "save_turn") && argc == 5)
        save_turns(path, &rep.model, iters, parse_count(argv[4], "GAP_MS", 0, 10000));
    else if (!strcmp(mode, "open") && argc == 4)
        opens(path, &rep.model, iters);
    else
        usage();
    return 0;
}
