/*
 * bench_cuda — decode attention on an NVIDIA GPU over a ctxstore session,
 * in both attachments (include/ctxstore_cuda.h), beside the CPU kernel.
 *
 * KV geometry of Qwen3-4B: 36 layers, 8 KV heads, head dim 128, with 32
 * query heads (GQA 4:1), in each session dtype (the dtype column): fp16 and
 * bf16, 147,456 bytes per token, and Q8, 73,728 bytes plus 2,304 of
 * scales. For each dtype and context (2048 and 8192 held tokens) a real
 * session file is created in a scratch directory with room for the context
 * and one more token, filled with random values (of either sign in [0.5, 1);
 * Q8: random int8 with scale 1/127), committed, synced and reopened (a
 * resume), its window set to the whole context so that a query reads every
 * held token. Then:
 *
 *   attach       ctxs_cuda_attach, wall time. mirror: cudaMalloc of the KV
 *                region and the copy of every held token to the device (the
 *                resume copy); mapped: cudaHostRegister of the whole KV
 *                region (faulting in and pinning every page), or nothing on
 *                a coherent system (see the header line).
 *   decode_step  attention of all 36 layers for one query token (the last
 *                position), one ctxs_cuda_attention() per layer on one
 *                stream, timed with CUDA events around the 36 calls.
 *   layer        one call (layer 0) alone, timed with events.
 *   decode_step_gpu  the 36 calls queued behind a host function that holds
 *                the stream for 5 ms, so that all of them are enqueued
 *                before the GPU starts: the GPU's own time for a step
 *                (events), without the gaps the host leaves.
 *   enqueue_step the host's time to issue the 36 calls (wall, meanwhile).
 *   push_token   ctxs_cuda_push of one token written on the host, and a
 *                stream sync: wall time (mirror; mapped has nothing to do).
 *   pull_token   ctxs_cuda_pull of one token (it waits for the stream):
 *                wall time.
 *   copy         the references a decode step's GB/s is read against, on
 *                the bytes one step reads: device_to_device, a cudaMemcpy
 *                between two plain device buffers (it reads and writes
 *                them, so its GB/s counts both, as the card's memory
 *                bandwidth is stated); host_to_device, a cudaMemcpy from
 *                pinned host memory (the link's bandwidth, what a mapped
 *                read can reach at best).
 *
 * The CPU kernel, ctxs_attention() on the calling thread, is timed on the
 * same plan and queries (decode_step and layer, wall time), and every GPU
 * output is checked against it: a difference of more than 1e-3 of the
 * output's largest magnitude is reported, the run goes on, and the program
 * exits 1 at the end. GB/s is the K/V bytes (and Q8 scales) a
 * step reads over its median time. Every measurement is several timed
 * repetitions after an untimed warm-up; it reports median, min and max in
 * microseconds.
 *
 * Without a CUDA device it says so and exits 0.
 *
 * Usage: bench_cuda [--quick] [--tokens N] [--dtype f16|bf16|q8] [--dir DIR] [--json]
 */
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "ctxstore.h"
#include "ctxstore_cuda.h"

const char *const bench_program = "bench_cuda";

/* --- Geometry -------------------------------------------------------------- */

enum {
    N_LAYERS = 36,
    N_KV_HEADS = 8,
    N_HEADS = 32,
    HEAD_DIM = 128,
    N_RUNS = N_LAYERS * 2 * N_KV_HEADS,
    HALF_TOKEN = N_RUNS / 2 * HEAD_DIM * 2, /* K (or V) of a token, as fp16 */
    Q_FLOATS = N_HEADS * HEAD_DIM,          /* one layer's query, and output */
    N_SINK = 4,
    MIN_TOKENS = 16,
    MAX_TOKENS = 32768,
};

/* --- Results --------------------------------------------------------------- */

static const uint32_t g_dtypes[3] = {CTXS_DTYPE_F16, CTXS_DTYPE_BF16, CTXS_DTYPE_Q8};

static const char *dtype_name(uint32_t dtype)
{
    return dtype == CTXS_DTYPE_F16 ? "f16" : dtype == CTXS_DTYPE_BF16 ? "bf16" : "q8";
}

typedef struct result {
    bench_result base; /* first, for results_add() */
    uint32_t dtype;
    double bytes;   /* K/V read, for GB/s; 0: not a read */
    double rel_err; /* decode_step on a GPU: against the CPU's output; else -1 */
} result;

static result g_result_rows[192];
static result_table g_results = RESULT_TABLE(g_result_rows);

/* One measurement into the table; the samples are spent. */
static void record(const char *op, const char *method, uint32_t tokens, uint32_t dtype,
                   samples *s, double bytes)
{
    result *r = results_add(&g_results, op, method, tokens, s);
    r->dtype = dtype;
    r->bytes = bytes;
    r->rel_err = -1;
    samples_free(s);
}

/* Outputs that differ from the CPU kernel's, counted for the exit status. */
static int g_mismatches;

/* Where the text goes: stdout, or stderr with --json (stdout carries only
 * the objects). */
static FILE *g_text;

/* The row of op, method, tokens and dtype; NULL if there is none
 * (results_find() knows no dtype). */
static const result *find(const char *op, const char *method, uint32_t tokens, uint32_t dtype)
{
    for (size_t i = 0; i < g_results.n; i++) {
        const result *r = &g_result_rows[i];
        if (!strcmp(r->base.op, op) && !strcmp(r->base.method, method) &&
            r->base.tokens == tokens && r->dtype == dtype)
            return r;
    }
    return NULL;
}

/* --- Scratch files ----------------------------------------------------------- */

/* The session file: a scratch file, removed on a signal. */
static char g_path[PATH_MAX];

typedef struct options {
    int quick;
    uint32_t only_tokens;
    uint32_t only_dtype; /* 0: every dtype */
    const char *dir;
    int json;
} options;

static void usage(FILE *f)
{
    fputs("usage: bench_cuda [--quick] [--tokens N] [--dtype f16|bf16|q8] [--dir DIR] [--json]\n"
          "  --quick     fewer repetitions (the same contexts)\n"
          "  --tokens N  one context of N tokens (16..32768)\n"
          "  --dtype D   one session dtype (default: each of f16, bf16, q8)\n"
          "  --dir DIR   put the session file in a new directory under DIR\n"
          "              (default $TMPDIR, else /var/tmp)\n"
          "  --json      one JSON object per measurement on stdout\n",
          f);
}

static options parse_options(int argc, char **argv)
{
    options o = {0};
    const char *dtype = NULL;
    for (int i = 1; i < argc; i++) {
        if (!flag_option(argv[i], "--quick", &o.quick) &&
            !flag_option(argv[i], "--json", &o.json) &&
            !string_option(argc, argv, &i, "--dir", &o.dir) &&
            !string_option(argc, argv, &i, "--dtype", &dtype) &&
            !count_option(argc, argv, &i, "--tokens", MIN_TOKENS, MAX_TOKENS, &o.only_tokens))
            unknown_option(argv[i], usage);
    }
    for (int d = 0; dtype && d < 3; d++)
        if (!strcmp(dtype, dtype_name(g_dtypes[d])))
            o.only_dtype = g_dtypes[d];
    if (dtype && !o.only_dtype)
        unknown_option(dtype, usage);
    return o;
}

/* --- CUDA -------------------------------------------------------------------- */

static void check_cuda(cudaError_t e, const char *what)
{
    if (e != cudaSuccess)
        die("%s failed: %s", what, cudaGetErrorString(e));
}

static void check_gpu(int rc, const char *what)
{
    if (rc < 0)
        die("%s failed: %s (%s; %s)", what, ctxs_strerror(rc), ctxs_err_name(rc),
            ctxs_cuda_get_last_error());
}

/* --- One context --------------------------------------------------------------- */

typedef struct bench {
    uint32_t tokens;
    uint32_t dtype;
    int reps;
    ctxs_model model;
    ctxs_session *s;
    ctxs_layout lay;
    ctxs_attn_plan plan;
    float *q, *cpu_out, *gpu_out; /* host: [N_LAYERS][Q_FLOATS] */
    float *d_q, *d_out;           /* device: the same */
    cudaStream_t stream;
    cudaEvent_t ev[2];
    double step_bytes; /* K/V one decode step reads */
} bench;

/* n bytes of random K/V of dtype: values of either sign in [0.5, 1) (fp16,
 * bf16), or int8 in [-127, 127]. n is a multiple of 8. */
static void fill_run(uint32_t dtype, uint8_t *p, size_t n, uint64_t *seed)
{
    if (dtype == CTXS_DTYPE_F16) {
        fill_fp16_signed(p, n, seed);
        return;
    }
    for (size_t i = 0; i + 8 <= n; i += 8) {
        uint64_t w = xorshift64(seed);
        if (dtype == CTXS_DTYPE_BF16) {
            w = (w & 0x807f807f807f807full) | 0x3f003f003f003f00ull;
        } else {
            for (int j = 0; j < 8; j++) /* -128 is not a Q8 value */
                if (((w >> (8 * j)) & 0xff) == 0x80)
                    w ^= (uint64_t)1 << (8 * j);
        }
        memcpy(p + i, &w, 8);
    }
}

static void create_and_reopen(bench *b)
{
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = b->tokens + 1; /* and one for push / pull */
    o.n_sink = N_SINK;
    o.ring = 0;
    o.open.window = b->tokens + 1;
    check_ctxs(ctxs_session_create(&b->s, g_path, &b->model, &o), "ctxs_session_create");
    ctxs_layout lay;
    check_ctxs(ctxs_session_get_layout(&lay, b->s), "ctxs_session_get_layout");
    ctxs_reservation r;
    check_ctxs(ctxs_session_reserve(&r, b->s, b->tokens), "ctxs_session_reserve");
    uint64_t seed = 0x9e3779b97f4a7c15ull ^ b->tokens;
    for (uint32_t run = 0; run < N_RUNS; run++)
        fill_run(b->dtype, kv_run(&lay, N_KV_HEADS, run), (size_t)b->tokens * lay.slot_bytes,
                 &seed);
    /* Q8: every value scale * q, with q in [-127, 127] and scale 1/127. */
    for (uint32_t run = 0; lay.scales && run < N_RUNS; run++)
        for (uint32_t i = 0; i < b->tokens; i++)
            lay.scales[(size_t)run * lay.capacity + i] = 1.0f / 127.0f;
    uint32_t *ids = xmalloc((size_t)b->tokens * sizeof ids[0]);
    for (uint32_t i = 0; i < b->tokens; i++)
        ids[i] = (uint32_t)(xorshift64(&seed) % 151936); /* Qwen3 vocab */
    check_ctxs(ctxs_session_commit(b->s, ids, b->tokens), "ctxs_session_commit");
    free(ids);
    check_ctxs(ctxs_session_sync(b->s), "ctxs_session_sync");
    ctxs_session_close(b->s);
    settle_disk();
    /* A resume: the file is reopened; the page cache still holds it. */
    check_ctxs(ctxs_session_open(&b->s, g_path, &b->model, 0, &o.open), "ctxs_session_open");
    check_ctxs(ctxs_session_get_layout(&b->lay, b->s), "ctxs_session_get_layout");
    check_ctxs(ctxs_session_get_attn_plan(&b->plan, b->s, 0), "ctxs_session_get_attn_plan");
    if (b->plan.n_keys != b->tokens)
        die("the plan reads %u keys, not %u", b->plan.n_keys, b->tokens);
    b->step_bytes = (double)N_RUNS * b->tokens *
                    (b->lay.slot_bytes + (b->lay.scales ? sizeof(float) : 0));

    const size_t n = (size_t)N_LAYERS * Q_FLOATS;
    b->q = xmalloc(n * sizeof(float));
    b->cpu_out = xmalloc(n * sizeof(float));
    b->gpu_out = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        b->q[i] = (float)((double)(xorshift64(&seed) >> 11) / 0x1p52 - 1.0);
    check_cuda(cudaMalloc((void **)&b->d_q, n * sizeof(float)), "cudaMalloc");
    check_cuda(cudaMalloc((void **)&b->d_out, n * sizeof(float)), "cudaMalloc");
    check_cuda(cudaMemcpy(b->d_q, b->q, n * sizeof(float), cudaMemcpyHostToDevice),
               "cudaMemcpy");
}

static ctxs_attn_query query(const bench *b, const float *q, uint32_t layer)
{
    return (ctxs_attn_query){q + (size_t)layer * Q_FLOATS, b->plan.n_tokens - 1, 1, N_HEADS,
                             0.0f};
}

static void cpu_kernel(bench *b)
{
    samples step = {0}, layer = {0};
    int reps = b->reps < 8 ? b->reps : 8; /* the CPU is slow: fewer */
    for (int i = -1; i < reps; i++) {
        double t0 = now_us(), t1 = 0;
        for (uint32_t l = 0; l < N_LAYERS; l++) {
            ctxs_attn_query q = query(b, b->q, l);
            check_ctxs(ctxs_attention(b->cpu_out + (size_t)l * Q_FLOATS, &b->lay, &b->plan, l, &q),
                       "ctxs_attention");
            if (l == 0)
                t1 = now_us();
        }
        if (i >= 0) {
            samples_add(&step, now_us() - t0);
            samples_add(&layer, t1 - t0);
        }
    }
    char *method = xmalloc(32);
    snprintf(method, 32, "cpu_%s", ctxs_attention_get_isa());
    record("decode_step", method, b->tokens, b->dtype, &step, b->step_bytes);
    record("layer", method, b->tokens, b->dtype, &layer, b->step_bytes / N_LAYERS);
}

/* The largest difference from the CPU's output, relative to the output's
 * largest magnitude. */
static double check_output(bench *b)
{
    const size_t n = (size_t)N_LAYERS * Q_FLOATS;
    check_cuda(cudaMemcpy(b->gpu_out, b->d_out, n * sizeof(float), cudaMemcpyDeviceToHost),
               "cudaMemcpy");
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)b->gpu_out[i] - b->cpu_out[i]);
        if (!(d <= worst))
            worst = d;
        if (fabs(b->cpu_out[i]) > scale)
            scale = fabs(b->cpu_out[i]);
    }
    return worst / (scale > 0 ? scale : 1);
}

/* Holds a stream for 5 ms, on the driver's thread. */
static void CUDART_CB hold_stream(void *unused)
{
    (void)unused;
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
}

static double elapsed_us(bench *b)
{
    float ms;
    check_cuda(cudaEventSynchronize(b->ev[1]), "cudaEventSynchronize");
    check_cuda(cudaEventElapsedTime(&ms, b->ev[0], b->ev[1]), "cudaEventElapsedTime");
    return ms * 1e3;
}

static void gpu_mode(bench *b, int mode)
{
    const char *method = mode == CTXS_CUDA_MAPPED ? "gpu_mapped" : "gpu_mirror";
    samples us = {0};
    ctxs_cuda_kv *kv = NULL;
    check_ctxs(ctxs_session_get_attn_plan(&b->plan, b->s, 0), "ctxs_session_get_attn_plan");

    /* attach, as a resume does; the last one stays for what follows */
    int attach_reps = b->reps < 5 ? b->reps : 5;
    for (int i = -1; i < attach_reps; i++) {
        ctxs_cuda_detach(kv);
        kv = NULL;
        double t0 = now_us();
        check_gpu(ctxs_cuda_attach(&kv, b->s, mode, 0), "ctxs_cuda_attach");
        if (i >= 0)
            samples_add(&us, now_us() - t0);
    }
    record("attach", method, b->tokens, b->dtype, &us, mode == CTXS_CUDA_MIRROR ? b->step_bytes : 0);
    ctxs_cuda_info info;
    check_gpu(ctxs_cuda_get_info(&info, kv), "ctxs_cuda_get_info");
    if (mode == CTXS_CUDA_MAPPED)
        fprintf(g_text, "%u tokens, mapped: %s (%.0f MiB pinned)\n", b->tokens,
               info.flags & CTXS_CUDA_HOST_PAGE_TABLES
                   ? "the GPU reads the mapping through the host's page tables"
                   : "the KV region is registered read-only and pinned",
               (double)info.pinned_bytes / (1 << 20));

    /* decode_step and layer */
    for (int i = -3; i < b->reps; i++) {
        check_cuda(cudaEventRecord(b->ev[0], b->stream), "cudaEventRecord");
        for (uint32_t l = 0; l < N_LAYERS; l++) {
            ctxs_attn_query q = query(b, b->d_q, l);
            check_gpu(ctxs_cuda_attention(b->d_out + (size_t)l * Q_FLOATS, kv, &b->plan, l, &q,
                                          b->stream),
                      "ctxs_cuda_attention");
        }
        check_cuda(cudaEventRecord(b->ev[1], b->stream), "cudaEventRecord");
        double t = elapsed_us(b);
        if (i >= 0)
            samples_add(&us, t);
    }
    double err = check_output(b);
    record("decode_step", method, b->tokens, b->dtype, &us, b->step_bytes);
    g_result_rows[g_results.n - 1].rel_err = err;
    if (!(err <= 1e-3)) {
        fprintf(stderr, "bench_cuda: %s at %u tokens, %s: the output differs from the CPU's "
                        "by %.3g of its largest magnitude\n",
                method, b->tokens, dtype_name(b->dtype), err);
        g_mismatches++;
    }
    for (int i = -3; i < b->reps; i++) {
        ctxs_attn_query q = query(b, b->d_q, 0);
        check_cuda(cudaEventRecord(b->ev[0], b->stream), "cudaEventRecord");
        check_gpu(ctxs_cuda_attention(b->d_out, kv, &b->plan, 0, &q, b->stream),
                  "ctxs_cuda_attention");
        check_cuda(cudaEventRecord(b->ev[1], b->stream), "cudaEventRecord");
        double t = elapsed_us(b);
        if (i >= 0)
            samples_add(&us, t);
    }
    record("layer", method, b->tokens, b->dtype, &us, b->step_bytes / N_LAYERS);

    /* the step with the host out of the GPU's way */
    samples host = {0};
    for (int i = -3; i < b->reps; i++) {
        check_cuda(cudaLaunchHostFunc(b->stream, hold_stream, NULL), "cudaLaunchHostFunc");
        check_cuda(cudaEventRecord(b->ev[0], b->stream), "cudaEventRecord");
        double t0 = now_us();
        for (uint32_t l = 0; l < N_LAYERS; l++) {
            ctxs_attn_query q = query(b, b->d_q, l);
            check_gpu(ctxs_cuda_attention(b->d_out + (size_t)l * Q_FLOATS, kv, &b->plan, l, &q,
                                          b->stream),
                      "ctxs_cuda_attention");
        }
        double t1 = now_us();
        check_cuda(cudaEventRecord(b->ev[1], b->stream), "cudaEventRecord");
        double t = elapsed_us(b);
        if (i >= 0) {
            samples_add(&us, t);
            samples_add(&host, t1 - t0);
        }
    }
    record("decode_step_gpu", method, b->tokens, b->dtype, &us, b->step_bytes);
    record("enqueue_step", method, b->tokens, b->dtype, &host, 0);

    /* push and pull of one token of a reservation (written once on the
     * host; the copies are the same each time) */
    ctxs_reservation r;
    check_ctxs(ctxs_session_reserve(&r, b->s, 1), "ctxs_session_reserve");
    /* Handed over as fp16, as an engine would: converted (or quantized)
     * to the session's dtype. */
    uint8_t *k = xmalloc(HALF_TOKEN), *v = xmalloc(HALF_TOKEN);
    uint64_t seed = 42;
    fill_fp16_signed(k, HALF_TOKEN, &seed);
    fill_fp16_signed(v, HALF_TOKEN, &seed);
    check_ctxs(ctxs_session_write_token(b->s, &r, 0, k, v, CTXS_DTYPE_F16), "ctxs_session_write_token");
    free(k);
    free(v);
    if (mode == CTXS_CUDA_MIRROR) {
        for (int i = -3; i < b->reps; i++) {
            double t0 = now_us();
            check_gpu(ctxs_cuda_push(kv, &r, 0, 1, b->stream), "ctxs_cuda_push");
            check_cuda(cudaStreamSynchronize(b->stream), "cudaStreamSynchronize");
            if (i >= 0)
                samples_add(&us, now_us() - t0);
        }
        record("push_token", method, b->tokens, b->dtype, &us, 0);
    }
    for (int i = -3; i < b->reps; i++) {
        double t0 = now_us();
        check_gpu(ctxs_cuda_pull(kv, &r, 0, 1, b->stream), "ctxs_cuda_pull");
        if (i >= 0)
            samples_add(&us, now_us() - t0);
    }
    record("pull_token", method, b->tokens, b->dtype, &us, 0);
    /* Drop the reservation: a rollback to the count releases it. */
    check_ctxs(ctxs_session_rollback(b->s, b->plan.n_tokens), "ctxs_session_rollback");
    ctxs_cuda_detach(kv);
}

/* One cudaMemcpy of bytes from src to dst on the stream, timed with events. */
static void time_copy(bench *b, const char *method, void *dst, const void *src, size_t bytes,
                      enum cudaMemcpyKind kind, double counted_bytes)
{
    samples us = {0};
    for (int i = -3; i < b->reps; i++) {
        check_cuda(cudaEventRecord(b->ev[0], b->stream), "cudaEventRecord");
        check_cuda(cudaMemcpyAsync(dst, src, bytes, kind, b->stream), "cudaMemcpyAsync");
        check_cuda(cudaEventRecord(b->ev[1], b->stream), "cudaEventRecord");
        double t = elapsed_us(b);
        if (i >= 0)
            samples_add(&us, t);
    }
    record("copy", method, b->tokens, b->dtype, &us, counted_bytes);
}

/* The references for a decode step's GB/s: the card's memory and its link,
 * each moving the bytes that one step reads. */
static void copy_references(bench *b)
{
    size_t bytes = (size_t)b->step_bytes;
    void *d_src, *d_dst, *h_src;
    check_cuda(cudaMalloc(&d_src, bytes), "cudaMalloc");
    check_cuda(cudaMalloc(&d_dst, bytes), "cudaMalloc");
    check_cuda(cudaMallocHost(&h_src, bytes), "cudaMallocHost");
    memset(h_src, 0x3c, bytes);
    check_cuda(cudaMemset(d_src, 0x3c, bytes), "cudaMemset");
    time_copy(b, "device_to_device", d_dst, d_src, bytes, cudaMemcpyDeviceToDevice, 2.0 * bytes);
    time_copy(b, "host_to_device", d_dst, h_src, bytes, cudaMemcpyHostToDevice, bytes);
    cudaFree(d_src);
    cudaFree(d_dst);
    cudaFreeHost(h_src);
}

static void run_context(const options *o, uint32_t tokens, uint32_t dtype)
{
    bench b = {0};
    b.tokens = tokens;
    b.dtype = dtype;
    b.reps = o->quick ? 10 : 40;
    b.model.geometry = (ctxs_geometry){N_LAYERS, N_KV_HEADS, HEAD_DIM, dtype, 0, {0}};
    memset(b.model.model_hash, 0xb5, 16);
    check_cuda(cudaSetDevice(0), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaEventCreate(&b.ev[0]), "cudaEventCreate");
    check_cuda(cudaEventCreate(&b.ev[1]), "cudaEventCreate");
    const char *dn = dtype_name(dtype);
    fprintf(stderr, "%u tokens, %s: filling the session\n", tokens, dn);
    create_and_reopen(&b);
    fprintf(stderr, "%u tokens, %s: CPU kernel\n", tokens, dn);
    cpu_kernel(&b);
    fprintf(stderr, "%u tokens, %s: mirror\n", tokens, dn);
    gpu_mode(&b, CTXS_CUDA_MIRROR);
    fprintf(stderr, "%u tokens, %s: mapped\n", tokens, dn);
    gpu_mode(&b, CTXS_CUDA_MAPPED);
    fprintf(stderr, "%u tokens, %s: copy references\n", tokens, dn);
    copy_references(&b);
    ctxs_session_close(b.s);
    unlink(g_path);
    cudaFree(b.d_q);
    cudaFree(b.d_out);
    cudaEventDestroy(b.ev[0]);
    cudaEventDestroy(b.ev[1]);
    cudaStreamDestroy(b.stream);
    free(b.q);
    free(b.cpu_out);
    free(b.gpu_out);
}

/* Rows by op (in the order of ops[]), tokens, dtype (as g_dtypes), method. */
static const char *const g_ops[] = {"attach",       "decode_step", "decode_step_gpu",
                                    "enqueue_step", "layer",       "push_token",
                                    "pull_token",   "copy"};

static int rank_of(const char *op)
{
    int i = 0;
    while (i < (int)(sizeof g_ops / sizeof g_ops[0]) && strcmp(g_ops[i], op))
        i++;
    return i;
}

static int cmp_rows(const void *pa, const void *pb)
{
    const result *a = pa, *b = pb;
    int ra = rank_of(a->base.op), rb = rank_of(b->base.op);
    if (ra != rb)
        return ra < rb ? -1 : 1;
    if (a->base.tokens != b->base.tokens)
        return a->base.tokens < b->base.tokens ? -1 : 1;
    if (a->dtype != b->dtype) /* F16 < BF16 < Q8, the order of g_dtypes */
        return a->dtype < b->dtype ? -1 : 1;
    return strcmp(a->base.method, b->base.method);
}

static double gb_per_s(const result *r)
{
    return r->bytes > 0 && r->base.median_us > 0 ? r->bytes / r->base.median_us / 1e3 : 0;
}

static void print_json(void)
{
    for (size_t i = 0; i < g_results.n; i++) {
        const result *r = &g_result_rows[i];
        json_result_begin(&r->base);
        printf(",\"dtype\":\"%s\",\"bytes\":%.0f,\"gb_s\":%.2f", dtype_name(r->dtype), r->bytes,
               gb_per_s(r));
        if (r->rel_err >= 0)
            printf(",\"rel_err_vs_cpu\":%.3g", r->rel_err);
        printf("}\n");
    }
}

static void print_table(void)
{
    printf("\n%-12s %6s %-5s %-12s %12s %12s %12s %3s %8s\n", "op", "tokens", "dtype", "method",
           "median_us", "min_us", "max_us", "n", "GB/s");
    const char *last = "";
    for (size_t i = 0; i < g_results.n; i++) {
        const result *r = &g_result_rows[i];
        const bench_result *m = &r->base;
        if (strcmp(m->op, last) && *last)
            putchar('\n');
        last = m->op;
        char gbs[32] = "";
        if (gb_per_s(r) > 0)
            snprintf(gbs, sizeof gbs, "%.1f", gb_per_s(r));
        printf("%-12s %6u %-5s %-12s %12.1f %12.1f %12.1f %3zu %8s\n", m->op, m->tokens,
               dtype_name(r->dtype), m->method, m->median_us, m->min_us, m->max_us, m->n, gbs);
    }
}

static void print_headlines(const uint32_t *contexts, int n)
{
    char cpu[32];
    snprintf(cpu, sizeof cpu, "cpu_%s", ctxs_attention_get_isa());
    putchar('\n');
    for (int i = 0; i < n; i++) {
        for (int d = 0; d < 3; d++) {
            const uint32_t dt = g_dtypes[d];
            const result *c = find("decode_step", cpu, contexts[i], dt);
            const result *mi = find("decode_step", "gpu_mirror", contexts[i], dt);
            const result *ma = find("decode_step", "gpu_mapped", contexts[i], dt);
            if (c && mi && ma)
                printf("decode_step, 36 layers, %u tokens, %s: CPU (%s) %.0f us; GPU mirror %.0f "
                       "us (%.1fx the CPU's speed), mapped %.0f us (%.1fx)\n",
                       contexts[i], dtype_name(dt), ctxs_attention_get_isa(),
                       c->base.median_us, mi->base.median_us,
                       c->base.median_us / mi->base.median_us, ma->base.median_us,
                       c->base.median_us / ma->base.median_us);
            const result *dd = find("copy", "device_to_device", contexts[i], dt);
            const result *hd = find("copy", "host_to_device", contexts[i], dt);
            if (mi && ma && dd && hd)
                printf("  reads: mirror %.0f GB/s (%.0f%% of the card's copy rate, %.0f GB/s); "
                       "mapped %.1f GB/s (%.0f%% of the link's, %.1f GB/s)\n",
                       gb_per_s(mi), 100 * gb_per_s(mi) / gb_per_s(dd), gb_per_s(dd),
                       gb_per_s(ma), 100 * gb_per_s(ma) / gb_per_s(hd), gb_per_s(hd));
        }
    }
}

int main(int argc, char **argv)
{
    options o = parse_options(argc, argv);
    g_text = o.json ? stderr : stdout;
    int n_dev = ctxs_cuda_get_device_count();
    if (n_dev < 0) {
        fprintf(g_text, "bench_cuda: no CUDA device (%s); nothing to measure\n", ctxs_cuda_get_last_error());
        return 0;
    }
    struct cudaDeviceProp prop;
    check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    catch_signals(remove_scratch_on_signal);
    make_scratch_dir(o.dir, "ctxstore-bench");
    scratch_file(g_path, "cuda.ctxs");

    uint32_t contexts[2] = {2048, 8192};
    int n_contexts = pick_contexts(contexts, 2, o.only_tokens);
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    fprintf(g_text, "ctxstore bench_cuda: %s (%d SMs, %.0f GiB), Qwen3-4B KV geometry: %d layers x %d KV "
           "heads x %d dim, %d query heads; one query token reads every held token; "
           "session in %s; CUDA driver %d.%d, runtime %d.%d; times in us (GPU ops: CUDA events; "
           "attach, push, pull: wall)\n",
           prop.name, prop.multiProcessorCount, (double)prop.totalGlobalMem / (1 << 30),
           N_LAYERS, N_KV_HEADS, HEAD_DIM, N_HEADS, g_dir, driver / 1000, driver % 1000 / 10,
           runtime / 1000, runtime % 1000 / 10);
    fflush(stdout);
    double t0 = now_us();
    for (int d = 0; d < 3; d++)
        for (int i = 0; i < n_contexts && (!o.only_dtype || o.only_dtype == g_dtypes[d]); i++)
            run_context(&o, contexts[i], g_dtypes[d]);
    qsort(g_result_rows, g_results.n, sizeof g_result_rows[0], cmp_rows);
    if (o.json) {
        print_json();
    } else {
        print_table();
        print_headlines(contexts, n_contexts);
    }
    fprintf(g_text, "total run time: %.1f s\n", (now_us() - t0) / 1e6);
    cleanup();
    if (g_mismatches)
        fprintf(stderr, "bench_cuda: %d GPU outputs differ from the CPU kernel's\n",
                g_mismatches);
    return g_mismatches ? 1 : 0;
}
