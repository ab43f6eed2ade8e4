/*
 * The CUDA attachments and kernel (include/ctxstore_cuda.h), checked
 * against the CPU kernel, ctxs_attention(), on real sessions: both modes,
 * decode and causal prefill, wrapped rings, GQA groups, windows shorter than
 * what is held, pending tokens of a reservation, the head dims of each code
 * path, and the mirror's copies both ways; for each session dtype (fp16,
 * bf16, Q8 with its scale table).
 *
 * Tests that need a device skip, saying why, where there is none; those
 * that check arguments before CUDA is touched run everywhere.
 */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctxstore_cuda.h"
#include "support.h"

static char *dir;

static void setup(void)
{
    dir = ts_mkdtemp();
    ctxs_set_pressure(0);
}

static void teardown(void)
{
    ts_rmtree(dir);
    free(dir);
    dir = NULL;
}

TestSuite(cuda, .init = setup, .fini = teardown);

/* Skips the calling test, loudly, where CUDA has no device to offer. A
 * skipped test's fini does not run: its directory goes first. */
static void need_device(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess && n > 0)
        return;
    teardown();
    if (e != cudaSuccess)
        cr_skip_test("no CUDA device: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    cr_skip_test("no CUDA device: cudaGetDeviceCount() found none");
}

/* Set by the report hook: tests skipped here because there is no device. */
static int skipped_for_no_device;

/* Says once, at the end, how many tests were skipped and why: Criterion's
 * summary counts only the tests that ran. Runs in the runner, after every
 * test's child has exited, so CUDA is never initialised before a fork. */
ReportHook(POST_ALL)(struct criterion_global_stats *stats)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (stats->tests_skipped && (e != cudaSuccess || n == 0)) {
        skipped_for_no_device = 1;
        fprintf(stderr,
                "test_cuda: SKIPPED %zu of %zu tests: no CUDA device (%s); only the checks "
                "that need none ran\n",
                stats->tests_skipped, stats->nb_tests,
                e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    }
}

/* Criterion's own main, but a run in which every test that needs a device
 * skipped (and the rest passed) exits 77, meson's status for a skipped
 * test: without a device the suite is counted as skipped, not passed. */
int main(int argc, char *argv[])
{
    struct criterion_test_set *tests = criterion_initialize();
    int rc = 0;
    if (criterion_handle_args(argc, argv, true))
        rc = criterion_run_all_tests(tests) ? 0 : 1;
    criterion_finalize(tests);
    if (rc == 0 && skipped_for_no_device)
        rc = 77;
    return rc;
}

#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        cr_assert_eq(e_, cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));                    \
    } while (0)

#define CTXS_OK(call)                                                                              \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        cr_assert_eq(rc_, 0, "%s: %s (%s; %s)", #call, ctxs_strerror(rc_), ctxs_err_name(rc_),    \
                     ctxs_cuda_get_last_error());                                                      \
    } while (0)

static const int modes[2] = {CTXS_CUDA_MAPPED, CTXS_CUDA_MIRROR};
static const char *const mode_names[3] = {"", "mapped", "mirror"};

#define N_DTYPES 3
static const uint32_t dtypes[N_DTYPES] = {CTXS_DTYPE_F16, CTXS_DTYPE_BF16, CTXS_DTYPE_Q8};

static const char *dtype_name(uint32_t dtype)
{
    return dtype == CTXS_DTYPE_F16 ? "f16" : dtype == CTXS_DTYPE_BF16 ? "bf16" : "q8";
}

/* A session file name per dtype, for tests that make one of each. */
static const char *name_of(const char *base, uint32_t dtype)
{
    static char name[64];
    snprintf(name, sizeof name, "%s-%s", base, dtype_name(dtype));
    return name;
}

/* --- Sessions with random K/V ------------------------------------------------ */

/* A valid fp16 of magnitude in [0.25, 2), either sign. */
static uint16_t rand_half(uint64_t *st)
{
    uint64_t r = ts_rng_next(st);
    return (uint16_t)(((r & 1) << 15) | ((13 + (r >> 1) % 3) << 10) | ((r >> 8) & 0x3ff));
}

/* A stored element of dtype with a magnitude in [0.25, 2) (fp16, bf16), or
 * an int8 in [-127, 127] (Q8), either sign. */
static void rand_elem(void *out, uint32_t dtype, uint64_t *st)
{
    uint64_t r = ts_rng_next(st);
    uint16_t bf = (uint16_t)(((r & 1) << 15) | ((125 + (r >> 1) % 3) << 7) | ((r >> 8) & 0x7f));
    int8_t q = (int8_t)((int)((r >> 8) % 255) - 127);
    if (dtype == CTXS_DTYPE_F16) {
        uint16_t h = rand_half(st);
        memcpy(out, &h, 2);
    } else if (dtype == CTXS_DTYPE_BF16) {
        memcpy(out, &bf, 2);
    } else {
        memcpy(out, &q, 1);
    }
}

/* A Q8 scale: values of scale * q up to about 2.5, as rand_half's. */
static float rand_scale(uint64_t *st)
{
    return 0.004f + (float)(ts_rng_next(st) % 1000) * 1.6e-5f;
}

static ctxs_model model_dt(uint32_t layers, uint32_t kv_heads, uint32_t head_dim,
                           uint32_t dtype)
{
    ctxs_model m = ts_model(7);
    m.geometry = (ctxs_geometry){layers, kv_heads, head_dim, dtype, 0, {0}};
    return m;
}

static ctxs_model model_of(uint32_t layers, uint32_t kv_heads, uint32_t head_dim)
{
    return model_dt(layers, kv_heads, head_dim, CTXS_DTYPE_F16);
}

static ctxs_session *create(const char *name, const ctxs_model *m, uint32_t capacity,
                            uint32_t n_sink, uint32_t window)
{
    ctxs_create_options o = ts_options(capacity, n_sink, 1, CTXS_SYNC_NONE);
    if (window)
        o.open.window = window;
    ctxs_session *s = NULL;
    CTXS_OK(ctxs_session_create(&s, ts_path(dir, name), m, &o));
    return s;
}

/* Writes tokens [first, first + n) of reservation r with random K/V,
 * handed over as fp16: a bf16 session rounds them, a Q8 one quantizes. */
static void write_random(ctxs_session *s, const ctxs_reservation *r, uint32_t first, uint32_t n,
                         uint64_t *rng)
{
    ctxs_session_info info;
    CTXS_OK(ctxs_session_get_info(&info, s));
    const ctxs_geometry *g = &info.model.geometry;
    size_t elems = (size_t)g->n_layers * g->n_kv_heads * g->head_dim;
    uint16_t *k = malloc(elems * 2), *v = malloc(elems * 2);
    cr_assert(k && v);
    for (uint32_t i = first; i < first + n; i++) {
        for (size_t e = 0; e < elems; e++) {
            k[e] = rand_half(rng);
            v[e] = rand_half(rng);
        }
        CTXS_OK(ctxs_session_write_token(s, r, i, k, v, CTXS_DTYPE_F16));
    }
    free(k);
    free(v);
}

/* Appends and commits n random tokens, in commits of at most 100. */
static void append(ctxs_session *s, uint64_t n, uint64_t *rng)
{
    uint32_t ids[100];
    while (n > 0) {
        uint32_t c = n < 100 ? (uint32_t)n : 100;
        ctxs_reservation r;
        CTXS_OK(ctxs_session_reserve(&r, s, c));
        write_random(s, &r, 0, c, rng);
        for (uint32_t i = 0; i < c; i++)
            ids[i] = ts_token(r.first_pos + i);
        CTXS_OK(ctxs_session_commit(s, ids, c));
        n -= c;
    }
}

/* --- Comparing with the CPU ----------------------------------------------------- */

typedef struct pass {
    uint64_t pos;
    uint32_t n;
    uint32_t n_heads;
    float scale;
} pass;

/* Runs every layer of pass p on the CPU and on kv's device, with the
 * queries q_in or (NULL) random ones drawn from seed, and checks them
 * within float rounding; the device's output of the last layer is left in
 * gpu_last (n * n_heads * head_dim floats) when it is not NULL. */
static void compare_q(ctxs_cuda_kv *kv, ctxs_session *s, const ctxs_attn_plan *plan, pass p,
                      const float *q_in, uint64_t seed, float *gpu_last, const char *what)
{
    ctxs_layout lay;
    CTXS_OK(ctxs_session_get_layout(&lay, s));
    const uint32_t hd = lay.geometry.head_dim;
    const size_t count = (size_t)p.n * p.n_heads * hd, bytes = count * sizeof(float);
    float *q = malloc(bytes), *cpu = malloc(bytes), *gpu = malloc(bytes);
    cr_assert(q && cpu && gpu);
    uint64_t rng = seed;
    for (size_t i = 0; i < count; i++)
        q[i] = q_in ? q_in[i]
                    : (float)((double)(ts_rng_next(&rng) >> 11) / 9007199254740992.0 * 8.0 - 4.0);
    float *dq, *dout;
    CUDA_OK(cudaMalloc((void **)&dq, bytes));
    CUDA_OK(cudaMalloc((void **)&dout, bytes));
    CUDA_OK(cudaMemcpy(dq, q, bytes, cudaMemcpyHostToDevice));
    ctxs_attn_query hq = {q, p.pos, p.n, p.n_heads, p.scale};
    ctxs_attn_query dqq = {dq, p.pos, p.n, p.n_heads, p.scale};

    for (uint32_t layer = 0; layer < lay.geometry.n_layers; layer++) {
        CTXS_OK(ctxs_attention(cpu, &lay, plan, layer, &hq));
        CUDA_OK(cudaMemset(dout, 0xff, bytes)); /* NaNs where nothing is written */
        CTXS_OK(ctxs_cuda_attention(dout, kv, plan, layer, &dqq, NULL));
        CUDA_OK(cudaMemcpy(gpu, dout, bytes, cudaMemcpyDeviceToHost));
        size_t bad = 0, first_bad = 0;
        double worst = 0, scale = 0;
        for (size_t i = 0; i < count; i++) {
            double d = fabs((double)cpu[i] - (double)gpu[i]);
            double tol = 1e-5 + 1e-3 * fabs((double)cpu[i]);
            if (!(d <= tol)) {
                if (!bad++)
                    first_bad = i;
            }
            worst = d > worst ? d : worst;
            scale = fabs((double)cpu[i]) > scale ? fabs((double)cpu[i]) : scale;
        }
        cr_assert_eq(bad, 0,
                     "%s (%s), layer %u: %zu of %zu outputs differ from the CPU; first at "
                     "query %zu head %zu dim %zu: cpu %.7g gpu %.7g",
                     what, dtype_name(lay.geometry.dtype), layer, bad, count,
                     first_bad / ((size_t)p.n_heads * hd),
                     first_bad / hd % p.n_heads, first_bad % hd, (double)cpu[first_bad],
                     (double)gpu[first_bad]);
        cr_log_info("%s (%s), layer %u: largest difference %.3g of outputs up to %.3g", what,
                    dtype_name(lay.geometry.dtype), layer, worst, scale);
    }
    if (gpu_last)
        memcpy(gpu_last, gpu, bytes);
    cudaFree(dq);
    cudaFree(dout);
    free(q);
    free(cpu);
    free(gpu);
}

static void compare(ctxs_cuda_kv *kv, ctxs_session *s, const ctxs_attn_plan *plan, pass p,
                    uint64_t seed, float *gpu_last, const char *what)
{
    compare_q(kv, s, plan, p, NULL, seed, gpu_last, what);
}

static ctxs_cuda_kv *attach(ctxs_session *s, int mode)
{
    ctxs_cuda_kv *kv = NULL;
    CTXS_OK(ctxs_cuda_attach(&kv, s, mode, 0));
    cr_assert_not_null(kv);
    return kv;
}

/* Decode of the last committed token, every layer, both modes. */
static void check_decode(ctxs_session *s, uint32_t n_heads, const char *what)
{
    ctxs_attn_plan plan;
    CTXS_OK(ctxs_session_get_attn_plan(&plan, s, 0));
    for (int m = 0; m < 2; m++) {
        char label[128];
        snprintf(label, sizeof label, "%s, %s decode", what, mode_names[modes[m]]);
        ctxs_cuda_kv *kv = attach(s, modes[m]);
        compare(kv, s, &plan, (pass){plan.n_tokens - 1, 1, n_heads, 0.0f}, 11, NULL, label);
        ctxs_cuda_detach(kv);
    }
}

/* --- No device needed ------------------------------------------------------------ */

Test(cuda, detach_accepts_null)
{
    ctxs_cuda_detach(NULL);
}

Test(cuda, calls_check_their_arguments_before_cuda)
{
    ctxs_model m = model_of(2, 2, 64);
    ctxs_session *s = create("a", &m, 64, 4, 0);
    ctxs_cuda_kv *kv = (ctxs_cuda_kv *)(uintptr_t)1;
    cr_expect_eq(ctxs_cuda_attach(&kv, NULL, CTXS_CUDA_MAPPED, 0), CTXS_EINVAL);
    cr_expect_null(kv);
    cr_expect_eq(ctxs_cuda_attach(NULL, s, CTXS_CUDA_MAPPED, 0), CTXS_EINVAL);
    cr_expect_eq(ctxs_cuda_attach(&kv, s, 0, 0), CTXS_EINVAL);
    cr_expect_eq(ctxs_cuda_attach(&kv, s, 3, 0), CTXS_EINVAL);
    cr_expect_eq(ctxs_cuda_attach(&kv, s, CTXS_CUDA_MIRROR, -2), CTXS_EINVAL);
    cr_expect_null(kv);

    ctxs_reservation r = {0};
    ctxs_layout l;
    ctxs_cuda_info info;
    ctxs_attn_plan plan = {0};
    ctxs_attn_query q = {(const float *)(uintptr_t)16, 0, 1, 2, 0};
    float *out = (float *)(uintptr_t)16;
    cr_expect_eq(ctxs_cuda_push(NULL, &r, 0, 1, NULL), CTXS_EINVAL);
    cr_expect_eq(ctxs_cuda_pull(NULL, &r, 0, 1, NULL), CTXS_EINVAL);
    cr_expect_eq(ctxs_cuda_resync(NULL, NULL), CTXS_EINVAL);
    cr_expect_eq(ctxs_cuda_get_layout(&l, NULL), CTXS_EINVAL);
    cr_expect_eq(ctxs_cuda_get_info(&info, NULL), CTXS_EINVAL);
    cr_expect_eq(ctxs_cuda_attention(out, NULL, &plan, 0, &q, NULL), CTXS_EINVAL);
    ctxs_session_close(s);
}

/* A session with sliding-window layers has a ring per windowed layer,
 * which the kernels (one stride for every layer) would read wrong:
 * refused, with a reason, device or not. */
Test(cuda, a_session_with_a_layer_schedule_is_refused)
{
    ctxs_model m = model_of(2, 2, 64);
    m.geometry.period = 2;
    m.geometry.window[0] = 8;
    ctxs_create_options o = ts_options(256, 4, 0, CTXS_SYNC_NONE);
    o.batch = 16;
    ctxs_session *s = NULL;
    CTXS_OK(ctxs_session_create(&s, ts_path(dir, "sched"), &m, &o));
    ctxs_cuda_kv *kv = (ctxs_cuda_kv *)(uintptr_t)1;
    cr_expect_eq(ctxs_cuda_attach(&kv, s, CTXS_CUDA_MAPPED, 0), CTXS_EINVAL);
    cr_expect_null(kv);
    cr_expect(strstr(ctxs_get_last_error(), "layer schedule") != NULL, "%s",
              ctxs_get_last_error());
    ctxs_session_close(s);
}

Test(cuda, device_count_agrees_with_the_runtime)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    int rc = ctxs_cuda_get_device_count();
    if (e != cudaSuccess || n == 0) {
        fprintf(stderr, "no CUDA device: %s\n", cudaGetErrorString(e));
        cr_expect_eq(rc, CTXS_ENODEVICE, "%s", ctxs_err_name(rc));
        cr_expect_str_neq(ctxs_cuda_get_last_error(), "no CUDA error");
    } else {
        cr_expect_eq(rc, n);
    }
}

Test(cuda, attach_says_when_there_is_no_device)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        fprintf(stderr, "no CUDA device: %s\n", cudaGetErrorString(e));
    for (int d = 0; d < N_DTYPES; d++) {
        ctxs_model m = model_dt(2, 2, 64, dtypes[d]);
        ctxs_session *s = create(name_of("a", dtypes[d]), &m, 64, 4, 0);
        ctxs_cuda_kv *kv = (ctxs_cuda_kv *)(uintptr_t)1;
        if (e != cudaSuccess || n == 0) {
            for (int i = 0; i < 2; i++) {
                cr_expect_eq(ctxs_cuda_attach(&kv, s, modes[i], 0), CTXS_ENODEVICE, "%s",
                             dtype_name(dtypes[d]));
                cr_expect_null(kv);
            }
        } else {
            cr_expect_eq(ctxs_cuda_attach(&kv, s, CTXS_CUDA_MIRROR, n), CTXS_EINVAL);
            cr_expect_null(kv);
        }
        ctxs_session_close(s);
    }
}

/* --- Decode -------------------------------------------------------------------- */

Test(cuda, decode_matches_the_cpu)
{
    need_device();
    uint64_t rng = ts_seed("cuda::decode_matches_the_cpu");
    for (int d = 0; d < N_DTYPES; d++) {
        ctxs_model m = model_dt(3, 2, 128, dtypes[d]);
        ctxs_session *s = create(name_of("a", dtypes[d]), &m, 2048, 4, 0);
        append(s, 1, &rng);
        check_decode(s, 8, "one token");
        append(s, 299, &rng);
        check_decode(s, 8, "300 tokens");
        append(s, 900, &rng); /* 1200 tokens: ten chunks, split-K */
        check_decode(s, 8, "1200 tokens");
        ctxs_session_close(s);
    }
}

Test(cuda, decode_in_a_wrapped_ring)
{
    need_device();
    uint64_t rng = ts_seed("cuda::decode_in_a_wrapped_ring");
    for (int d = 0; d < N_DTYPES; d++) {
        ctxs_model m = model_dt(2, 2, 64, dtypes[d]);
        ctxs_session *s = create(name_of("a", dtypes[d]), &m, 300, 4, 0);
        append(s, 1000, &rng);
        ctxs_session_info info;
        CTXS_OK(ctxs_session_get_info(&info, s));
        cr_assert(info.flags & CTXS_INFO_WRAPPED);
        ctxs_attn_plan plan;
        CTXS_OK(ctxs_session_get_attn_plan(&plan, s, 0));
        cr_assert_geq(plan.n_spans, 3, "sinks and a recent run split at the wrap");
        check_decode(s, 4, "wrapped ring");
        ctxs_session_close(s);
    }
}

Test(cuda, decode_with_a_window_shorter_than_what_is_held)
{
    need_device();
    uint64_t rng = ts_seed("cuda::decode_with_a_window_shorter_than_what_is_held");
    ctxs_model m = model_of(2, 2, 128);
    ctxs_session *s = create("a", &m, 1024, 4, 100);
    append(s, 700, &rng);
    check_decode(s, 8, "window 100 of 700");
    ctxs_set_pressure(1); /* the pressure window, 1024 by default, is larger */
    check_decode(s, 8, "under pressure");
    ctxs_set_pressure(0);
    ctxs_session_close(s);
}

Test(cuda, gqa_groups_of_every_size)
{
    need_device();
    uint64_t rng = ts_seed("cuda::gqa_groups_of_every_size");
    ctxs_model m = model_of(2, 2, 128);
    ctxs_session *s = create("a", &m, 1024, 4, 0);
    append(s, 333, &rng);
    const uint32_t heads[] = {2, 4, 6, 16, 24, 40}; /* groups 1, 2, 3, 8, 12, 20 */
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
        char label[64];
        snprintf(label, sizeof label, "%u query heads over 2", heads[i]);
        check_decode(s, heads[i], label);
    }
    ctxs_session_close(s);
}

Test(cuda, head_dims_of_every_code_path)
{
    need_device();
    uint64_t rng = ts_seed("cuda::head_dims_of_every_code_path");
    /* 8: the smallest; 36: rows not aligned for piece loads (element
     * loads); 64, 80, 128, 256: 2, 4, 4 and 8 elements per lane. */
    const uint32_t dims[] = {8, 36, 64, 80, 128, 256};
    for (int d = 0; d < N_DTYPES; d++) {
        for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
            ctxs_model m = model_dt(1, 2, dims[i], dtypes[d]);
            char name[32], label[64];
            snprintf(name, sizeof name, "d%u-%s", dims[i], dtype_name(dtypes[d]));
            ctxs_session *s = create(name, &m, 512, 4, 0);
            append(s, 200, &rng);
            snprintf(label, sizeof label, "head_dim %u", dims[i]);
            check_decode(s, 4, label);
            ctxs_session_close(s);
        }
    }
}

Test(cuda, an_explicit_scale)
{
    need_device();
    uint64_t rng = ts_seed("cuda::an_explicit_scale");
    ctxs_model m = model_of(1, 2, 64);
    ctxs_session *s = create("a", &m, 512, 4, 0);
    append(s, 150, &rng);
    ctxs_attn_plan plan;
    CTXS_OK(ctxs_session_get_attn_plan(&plan, s, 0));
    for (int i = 0; i < 2; i++) {
        ctxs_cuda_kv *kv = attach(s, modes[i]);
        compare(kv, s, &plan, (pass){plan.n_tokens - 1, 1, 4, 0.5f}, 5, NULL, "scale 0.5");
        compare(kv, s, &plan, (pass){plan.n_tokens - 1, 1, 4, 0.01f}, 5, NULL, "scale 0.01");
        ctxs_cuda_detach(kv);
    }
    ctxs_session_close(s);
}

/* --- Prefill --------------------------------------------------------------------- */

/* Reserves and writes n pending tokens (pushed to a mirror), then compares
 * causal passes over them: all of them, and a part from the middle. */
static void check_prefill(ctxs_session *s, uint32_t n, uint32_t n_heads, uint64_t *rng,
                          const char *what)
{
    ctxs_reservation r;
    CTXS_OK(ctxs_session_reserve(&r, s, n));
    write_random(s, &r, 0, n, rng);
    ctxs_attn_plan plan;
    CTXS_OK(ctxs_session_get_attn_plan(&plan, s, n));
    cr_assert_eq(plan.first_query, r.first_pos);
    for (int i = 0; i < 2; i++) {
        char label[128];
        ctxs_cuda_kv *kv = attach(s, modes[i]);
        CTXS_OK(ctxs_cuda_push(kv, &r, 0, n, NULL));
        snprintf(label, sizeof label, "%s, %s prefill of %u", what, mode_names[modes[i]], n);
        compare(kv, s, &plan, (pass){plan.first_query, n, n_heads, 0.0f}, 3, NULL, label);
        if (n >= 2) {
            snprintf(label, sizeof label, "%s, %s prefill middle", what, mode_names[modes[i]]);
            compare(kv, s, &plan, (pass){plan.first_query + n / 3, n / 2, n_heads, 0.0f}, 4,
                    NULL, label);
        }
        ctxs_cuda_detach(kv);
    }
    uint32_t *ids = malloc(n * sizeof(uint32_t));
    for (uint32_t i = 0; i < n; i++)
        ids[i] = ts_token(r.first_pos + i);
    CTXS_OK(ctxs_session_commit(s, ids, n));
    free(ids);
}

Test(cuda, prefill_matches_the_cpu)
{
    need_device();
    uint64_t rng = ts_seed("cuda::prefill_matches_the_cpu");
    for (int d = 0; d < N_DTYPES; d++) {
        ctxs_model m = model_dt(2, 2, 128, dtypes[d]);
        ctxs_session *s = create(name_of("a", dtypes[d]), &m, 4096, 4, 0);
        check_prefill(s, 40, 8, &rng, "empty session");
        check_prefill(s, 600, 8, &rng, "after 40"); /* enough pairs to fold in the block */
        check_prefill(s, 1, 8, &rng, "one more");
        ctxs_session_close(s);
    }
}

Test(cuda, prefill_in_a_wrapped_ring_with_a_short_window)
{
    need_device();
    uint64_t rng = ts_seed("cuda::prefill_in_a_wrapped_ring_with_a_short_window");
    for (int d = 0; d < N_DTYPES; d++) {
        ctxs_model m = model_dt(2, 2, 64, dtypes[d]);
        ctxs_session *s = create(name_of("a", dtypes[d]), &m, 256, 4, 90);
        append(s, 500, &rng);
        check_prefill(s, 70, 8, &rng, "wrapped, window 90");
        check_prefill(s, 200, 4, &rng, "wrapped again");
        ctxs_session_close(s);
    }
}

/* The device's output for a token is the same bits in a prefill (blocks
 * fold their chunks) and in a decode after the commit (split-K, over
 * another plan), and the same in both modes. */
static void check_same_bits(uint32_t dtype, uint64_t *rng)
{
    ctxs_model m = model_dt(1, 2, 128, dtype);
    ctxs_session *s = create(name_of("a", dtype), &m, 2048, 4, 0);
    append(s, 100, rng);
    /* 600 queries x 4 heads per KV head fill a device of up to 150 SMs
     * without split-K; one query does not. */
    const uint32_t n = 600, heads = 8, hd = 128;
    const size_t row = (size_t)heads * hd;
    ctxs_reservation r;
    CTXS_OK(ctxs_session_reserve(&r, s, n));
    write_random(s, &r, 0, n, rng);
    ctxs_attn_plan plan;
    CTXS_OK(ctxs_session_get_attn_plan(&plan, s, n));

    float *q = malloc((size_t)n * row * sizeof(float));
    float *all = malloc((size_t)n * row * sizeof(float));
    float *dec[3] = {malloc(row * sizeof(float)), malloc(row * sizeof(float)),
                     malloc(row * sizeof(float))};
    for (size_t i = 0; i < (size_t)n * row; i++)
        q[i] = (float)((double)(ts_rng_next(rng) >> 11) / 9007199254740992.0 * 8.0 - 4.0);
    const float *last = q + (size_t)(n - 1) * row;

    ctxs_cuda_kv *kv = attach(s, CTXS_CUDA_MIRROR);
    CTXS_OK(ctxs_cuda_push(kv, &r, 0, n, NULL));
    compare_q(kv, s, &plan, (pass){plan.first_query, n, heads, 0.0f}, q, 0, all, "prefill");
    compare_q(kv, s, &plan, (pass){plan.n_tokens - 1, 1, heads, 0.0f}, last, 0, dec[2],
              "pending decode");
    ctxs_cuda_detach(kv);

    uint32_t *ids = malloc(n * sizeof(uint32_t));
    for (uint32_t i = 0; i < n; i++)
        ids[i] = ts_token(r.first_pos + i);
    CTXS_OK(ctxs_session_commit(s, ids, n));
    CTXS_OK(ctxs_session_get_attn_plan(&plan, s, 0));
    for (int i = 0; i < 2; i++) {
        kv = attach(s, modes[i]);
        compare_q(kv, s, &plan, (pass){plan.n_tokens - 1, 1, heads, 0.0f}, last, 0, dec[i],
                  "decode");
        ctxs_cuda_detach(kv);
    }
    const float *in_prefill = all + (size_t)(n - 1) * row;
    const char *dn = dtype_name(dtype);
    cr_expect(memcmp(in_prefill, dec[0], row * sizeof(float)) == 0,
              "%s: the last token's output differs between the prefill and the decode", dn);
    cr_expect(memcmp(dec[2], dec[0], row * sizeof(float)) == 0,
              "%s: a pending token's decode differs from its decode after the commit", dn);
    cr_expect(memcmp(dec[0], dec[1], row * sizeof(float)) == 0, "%s: mapped and mirror differ",
              dn);
    free(q);
    free(all);
    free(ids);
    for (int i = 0; i < 3; i++)
        free(dec[i]);
    ctxs_session_close(s);
}

Test(cuda, a_token_gets_the_same_bits_in_prefill_and_decode)
{
    need_device();
    uint64_t rng = ts_seed("cuda::a_token_gets_the_same_bits_in_prefill_and_decode");
    for (int d = 0; d < N_DTYPES; d++)
        check_same_bits(dtypes[d], &rng);
}

/* --- The mirror's copies ------------------------------------------------------- */

/* Tokens written on the device through ctxs_cuda_get_layout() (with their
 * scales, for Q8) reach the file by pull, in a reservation that wraps
 * around the ring's end. */
static void check_pull(uint32_t dtype, uint64_t *rng)
{
    ctxs_model m = model_dt(2, 2, 64, dtype);
    const char *name = name_of("a", dtype);
    ctxs_session *s = create(name, &m, 128, 4, 0);
    append(s, 122, rng);
    ctxs_cuda_kv *kv = attach(s, CTXS_CUDA_MIRROR);
    const uint32_t n = 10;
    ctxs_reservation r;
    CTXS_OK(ctxs_session_reserve(&r, s, n));
    cr_assert_eq(r.n_spans, 2, "the reservation wraps");

    /* The engine's kernels would write these; cudaMemcpy stands in. Each
     * token in the form ctxs_session_read_token() gives back in the
     * session's dtype: the elements, then (Q8) a scale per (layer, head). */
    ctxs_layout dl;
    CTXS_OK(ctxs_cuda_get_layout(&dl, kv));
    const ctxs_geometry *g = &dl.geometry;
    const uint32_t eb = dtype == CTXS_DTYPE_Q8 ? 1 : 2, runs = g->n_layers * g->n_kv_heads;
    const size_t per_token = (size_t)runs * g->head_dim;
    const size_t tb = ctxs_geometry_get_token_bytes(g, dtype);
    cr_assert_eq(tb, per_token * eb + (dtype == CTXS_DTYPE_Q8 ? runs * sizeof(float) : 0));
    cr_assert_eq(dl.scales != NULL, dtype == CTXS_DTYPE_Q8);
    uint8_t *tok[2] = {malloc(n * tb), malloc(n * tb)}; /* K, V */
    for (int kind = 0; kind < 2; kind++) {
        for (uint32_t i = 0; i < n; i++) {
            uint8_t *t = tok[kind] + i * tb;
            for (size_t e = 0; e < per_token; e++)
                rand_elem(t + e * eb, dtype, rng);
            for (uint32_t j = 0; dtype == CTXS_DTYPE_Q8 && j < runs; j++) {
                float sc = rand_scale(rng);
                memcpy(t + per_token + j * sizeof(float), &sc, sizeof sc);
            }
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t slot = i < r.spans[0].count ? r.spans[0].slot + i
                                              : r.spans[1].slot + (i - r.spans[0].count);
        for (uint32_t l = 0; l < g->n_layers; l++) {
            for (uint32_t h = 0; h < g->n_kv_heads; h++) {
                for (uint32_t kind = 0; kind < 2; kind++) {
                    const uint32_t run = l * g->n_kv_heads + h; /* in the token */
                    const uint8_t *t = tok[kind] + i * tb;
                    size_t at = l * dl.layer_stride + kind * dl.kv_stride + h * dl.head_stride +
                                slot * dl.slot_bytes;
                    CUDA_OK(cudaMemcpy((uint8_t *)dl.kv + at, t + (size_t)run * g->head_dim * eb,
                                       dl.slot_bytes, cudaMemcpyHostToDevice));
                    if (dtype != CTXS_DTYPE_Q8)
                        continue;
                    size_t sat = ((size_t)(l * 2 + kind) * g->n_kv_heads + h) * dl.capacity + slot;
                    CUDA_OK(cudaMemcpy(dl.scales + sat, t + per_token + run * sizeof(float),
                                       sizeof(float), cudaMemcpyHostToDevice));
                }
            }
        }
    }
    CTXS_OK(ctxs_cuda_pull(kv, &r, 0, 3, NULL));
    CTXS_OK(ctxs_cuda_pull(kv, &r, 3, n - 3, NULL)); /* across the wrap */

    ctxs_attn_plan plan;
    CTXS_OK(ctxs_session_get_attn_plan(&plan, s, n));
    compare(kv, s, &plan, (pass){plan.first_query, n, 4, 0.0f}, 1, NULL, "pulled, pending");
    uint32_t ids[10];
    for (uint32_t i = 0; i < n; i++)
        ids[i] = ts_token(r.first_pos + i);
    CTXS_OK(ctxs_session_commit(s, ids, n));
    ctxs_cuda_detach(kv);
    ctxs_session_close(s);

    CTXS_OK(ctxs_session_open(&s, ts_path(dir, name), &m, 0, NULL));
    CTXS_OK(ctxs_session_verify(NULL, s));
    uint8_t *kr = malloc(tb), *vr = malloc(tb);
    for (uint32_t i = 0; i < n; i++) {
        CTXS_OK(ctxs_session_read_token(kr, vr, s, r.first_pos + i, dtype));
        cr_expect(memcmp(kr, tok[0] + i * tb, tb) == 0, "%s: K of token %u",
                  dtype_name(dtype), i);
        cr_expect(memcmp(vr, tok[1] + i * tb, tb) == 0, "%s: V of token %u",
                  dtype_name(dtype), i);
    }
    free(tok[0]);
    free(tok[1]);
    free(kr);
    free(vr);
    ctxs_session_close(s);
}

Test(cuda, mirror_pull_brings_device_writes_into_the_file)
{
    need_device();
    uint64_t rng = ts_seed("cuda::mirror_pull_brings_device_writes_into_the_file");
    for (int d = 0; d < N_DTYPES; d++)
        check_pull(dtypes[d], &rng);
}

/* Tokens written on the host reach the mirror by push, in pieces. */
Test(cuda, mirror_push_brings_host_writes_to_the_device)
{
    need_device();
    uint64_t rng = ts_seed("cuda::mirror_push_brings_host_writes_to_the_device");
    for (int d = 0; d < N_DTYPES; d++) {
        ctxs_model m = model_dt(2, 2, 64, dtypes[d]);
        ctxs_session *s = create(name_of("a", dtypes[d]), &m, 128, 4, 0);
        append(s, 122, &rng);
        ctxs_cuda_kv *kv = attach(s, CTXS_CUDA_MIRROR);
        ctxs_reservation r;
        CTXS_OK(ctxs_session_reserve(&r, s, 10));
        write_random(s, &r, 0, 10, &rng);
        CTXS_OK(ctxs_cuda_push(kv, &r, 4, 6, NULL));
        CTXS_OK(ctxs_cuda_push(kv, &r, 0, 4, NULL));
        ctxs_attn_plan plan;
        CTXS_OK(ctxs_session_get_attn_plan(&plan, s, 10));
        compare(kv, s, &plan, (pass){plan.first_query, 10, 4, 0.0f}, 1, NULL,
                "pushed, pending");
        ctxs_cuda_detach(kv);
        ctxs_session_close(s);
    }
}

Test(cuda, mirror_resync_follows_a_rollback)
{
    need_device();
    uint64_t rng = ts_seed("cuda::mirror_resync_follows_a_rollback");
    for (int d = 0; d < N_DTYPES; d++) {
        ctxs_model m = model_dt(2, 2, 64, dtypes[d]);
        ctxs_session *s = create(name_of("a", dtypes[d]), &m, 512, 4, 0);
        append(s, 200, &rng);
        ctxs_cuda_kv *kv = attach(s, CTXS_CUDA_MIRROR);
        CTXS_OK(ctxs_session_rollback(s, 150));
        append(s, 30, &rng); /* other K/V (and scales) where the mirror has the old */
        CTXS_OK(ctxs_cuda_resync(kv, NULL));
        ctxs_attn_plan plan;
        CTXS_OK(ctxs_session_get_attn_plan(&plan, s, 0));
        compare(kv, s, &plan, (pass){plan.n_tokens - 1, 1, 4, 0.0f}, 2, NULL, "resynced");
        ctxs_cuda_detach(kv);
        ctxs_session_close(s);
    }
}

/* A reader following a writer attaches read-only mappings in both modes. */
Test(cuda, read_only_sessions_attach)
{
    need_device();
    uint64_t rng = ts_seed("cuda::read_only_sessions_attach");
    ctxs_model m = model_of(2, 2, 128);
    ctxs_session *w = create("a", &m, 512, 4, 0);
    append(w, 300, &rng);
    ctxs_session *s = NULL;
    CTXS_OK(ctxs_session_open(&s, ts_path(dir, "a"), &m, CTXS_RDONLY, NULL));
    check_decode(s, 8, "read-only");

    ctxs_cuda_kv *kv = attach(s, CTXS_CUDA_MIRROR);
    ctxs_reservation r = {.first_pos = 300, .n_tokens = 1, .n_spans = 1};
    r.spans[0].slot = 300;
    r.spans[0].count = 1;
    cr_expect_eq(ctxs_cuda_pull(kv, &r, 0, 1, NULL), CTXS_EREADONLY);
    append(w, 20, &rng);
    CTXS_OK(ctxs_session_refresh(s));
    CTXS_OK(ctxs_cuda_resync(kv, NULL));
    ctxs_attn_plan plan;
    CTXS_OK(ctxs_session_get_attn_plan(&plan, s, 0));
    compare(kv, s, &plan, (pass){plan.n_tokens - 1, 1, 8, 0.0f}, 2, NULL, "refreshed");
    ctxs_cuda_detach(kv);
    ctxs_session_close(s);
    ctxs_session_close(w);
}

/* --- Handles ------------------------------------------------------------------- */

Test(cuda, info_says_what_the_handle_holds)
{
    need_device();
    for (int d = 0; d < N_DTYPES; d++) {
        ctxs_model m = model_dt(2, 2, 64, dtypes[d]);
        ctxs_session *s = create(name_of("a", dtypes[d]), &m, 256, 4, 0);
        ctxs_layout host;
        CTXS_OK(ctxs_session_get_layout(&host, s));
        /* A Q8 session's scale table goes with its KV region. */
        const uint64_t region = (uint64_t)host.kv_bytes + host.scales_bytes;
        cr_assert_eq(host.scales != NULL, dtypes[d] == CTXS_DTYPE_Q8);
        for (int i = 0; i < 2; i++) {
            ctxs_cuda_kv *kv = attach(s, modes[i]);
            ctxs_cuda_info info;
            ctxs_layout dl;
            CTXS_OK(ctxs_cuda_get_info(&info, kv));
            CTXS_OK(ctxs_cuda_get_layout(&dl, kv));
            cr_expect_eq(info.mode, modes[i]);
            cr_expect_eq(info.device, 0);
            cr_expect_not_null(dl.kv);
            cr_expect_eq(dl.kv_bytes, host.kv_bytes);
            cr_expect_eq(dl.head_stride, host.head_stride);
            cr_expect_eq(dl.token_ids, host.token_ids);
            cr_expect_eq(dl.scales_bytes, host.scales_bytes);
            /* The device's copy keeps the file's order: scales, then KV. */
            if (host.scales)
                cr_expect_eq((uint8_t *)dl.scales + dl.scales_bytes, (uint8_t *)dl.kv);
            else
                cr_expect_null(dl.scales);
            if (modes[i] == CTXS_CUDA_MIRROR) {
                cr_expect_eq(info.flags, CTXS_CUDA_WRITABLE);
                cr_expect_eq(info.device_bytes, region);
                cr_expect_eq(info.pinned_bytes, 0);
                cr_expect_neq(dl.kv, host.kv);
            } else if (info.flags & CTXS_CUDA_HOST_PAGE_TABLES) {
                cr_log_info("mapped mode: the device walks the host's page tables");
                cr_expect_eq(info.flags, CTXS_CUDA_HOST_PAGE_TABLES | CTXS_CUDA_WRITABLE);
                cr_expect_eq(info.pinned_bytes, 0);
                cr_expect_eq(dl.kv, host.kv);
                cr_expect_eq(dl.scales, host.scales);
            } else {
                cr_log_info("mapped mode: the KV region is registered and pinned");
                cr_expect_eq(info.flags, CTXS_CUDA_PINNED);
                cr_expect_eq(info.pinned_bytes, region);
                cr_expect_eq(info.device_bytes, 0);
            }
            ctxs_cuda_detach(kv);
        }
        ctxs_session_close(s);
    }
}

Test(cuda, a_region_is_registered_once)
{
    need_device();
    ctxs_model m = model_of(2, 2, 64);
    ctxs_session *s = create("a", &m, 256, 4, 0);
    ctxs_cuda_kv *a = attach(s, CTXS_CUDA_MAPPED), *b = NULL;
    ctxs_cuda_info info;
    CTXS_OK(ctxs_cuda_get_info(&info, a));
    int rc = ctxs_cuda_attach(&b, s, CTXS_CUDA_MAPPED, 0);
    if (info.flags & CTXS_CUDA_PINNED) {
        cr_expect_eq(rc, -EBUSY, "%s", ctxs_err_name(rc));
        cr_expect_null(b);
    } else {
        cr_expect_eq(rc, 0, "nothing is registered on a coherent system");
    }
    ctxs_cuda_detach(b);
    /* A mirror beside it is fine. */
    ctxs_cuda_kv *c = attach(s, CTXS_CUDA_MIRROR);
    ctxs_cuda_detach(c);
    ctxs_cuda_detach(a);
    /* And once detached, the region registers again. */
    a = attach(s, CTXS_CUDA_MAPPED);
    ctxs_cuda_detach(a);
    ctxs_session_close(s);
}

/* --- Arguments ------------------------------------------------------------------- */

Test(cuda, attention_refuses_what_the_cpu_refuses)
{
    need_device();
    uint64_t rng = ts_seed("cuda::attention_refuses_what_the_cpu_refuses");
    ctxs_model m = model_of(2, 2, 64);
    ctxs_session *s = create("a", &m, 256, 4, 0);
    append(s, 50, &rng);
    ctxs_cuda_kv *kv = attach(s, CTXS_CUDA_MIRROR);
    ctxs_layout lay;
    CTXS_OK(ctxs_session_get_layout(&lay, s));
    ctxs_attn_plan good;
    CTXS_OK(ctxs_session_get_attn_plan(&good, s, 0));
    float *dq, *dout, *hq = calloc(8 * 4 * 64, sizeof(float)), *hout = calloc(8 * 4 * 64, 4);
    CUDA_OK(cudaMalloc((void **)&dq, 8 * 4 * 64 * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&dout, 8 * 4 * 64 * sizeof(float)));
    const ctxs_attn_query q0 = {dq, good.n_tokens - 1, 1, 4, 0.0f};

#define REFUSED(plan_, layer_, q_)                                                                 \
    do {                                                                                           \
        ctxs_attn_query hq_ = (q_);                                                                \
        if (hq_.q)                                                                                 \
            hq_.q = hq;                                                                            \
        cr_expect_eq(ctxs_attention(hout, &lay, &(plan_), (layer_), &hq_), CTXS_EINVAL,            \
                     "the CPU accepts it: line %d", __LINE__);                                     \
        cr_expect_eq(ctxs_cuda_attention(dout, kv, &(plan_), (layer_), &(q_), NULL), CTXS_EINVAL,  \
                     "the GPU accepts it: line %d", __LINE__);                                     \
    } while (0)

    ctxs_attn_query q = q0;
    ctxs_attn_plan p = good;
    REFUSED(p, 2, q); /* no such layer */
    q.n = 0;
    REFUSED(p, 0, q);
    q = q0, q.n_heads = 3; /* not a multiple of 2 KV heads */
    REFUSED(p, 0, q);
    q = q0, q.n_heads = 0;
    REFUSED(p, 0, q);
    q = q0, q.pos = good.first_query - 1; /* before the plan's queries */
    REFUSED(p, 0, q);
    q = q0, q.n = 2; /* past its tokens */
    REFUSED(p, 0, q);
    q = q0, q.q = NULL;
    REFUSED(p, 0, q);
    q = q0;
    p.n_spans = CTXS_ATTN_MAX_SPANS + 1;
    REFUSED(p, 0, q);
    p = good, p.spans[0].slot = 250, p.spans[0].count = 7; /* past the capacity */
    p.n_keys = 7;
    p.n_spans = 1;
    REFUSED(p, 0, q);
    p = good, p.n_spans = 2, p.spans[0] = (ctxs_attn_span){10, 10, 5};
    p.spans[1] = (ctxs_attn_span){12, 12, 5}; /* overlapping positions */
    p.n_keys = 10;
    REFUSED(p, 0, q);
    p = good, p.n_keys++;
    REFUSED(p, 0, q);
    p = good;
    cr_expect_eq(ctxs_cuda_attention(NULL, kv, &p, 0, &q, NULL), CTXS_EINVAL);
    cr_expect_eq(ctxs_cuda_attention(dout, kv, NULL, 0, &q, NULL), CTXS_EINVAL);
    cr_expect_eq(ctxs_cuda_attention(dout, kv, &p, 0, NULL, NULL), CTXS_EINVAL);
    CTXS_OK(ctxs_cuda_attention(dout, kv, &p, 0, &q, NULL));
    CUDA_OK(cudaDeviceSynchronize());
#undef REFUSED
    cudaFree(dq);
    cudaFree(dout);
    free(hq);
    free(hout);
    ctxs_cuda_detach(kv);
    ctxs_session_close(s);
}

Test(cuda, head_dims_above_the_limit_are_refused)
{
    need_device();
    uint64_t rng = ts_seed("cuda::head_dims_above_the_limit_are_refused");
    ctxs_model m = model_of(1, 1, CTXS_CUDA_MAX_HEAD_DIM + 8);
    ctxs_session *s = create("a", &m, 64, 4, 0);
    append(s, 5, &rng);
    ctxs_cuda_kv *kv = attach(s, CTXS_CUDA_MIRROR);
    ctxs_attn_plan plan;
    CTXS_OK(ctxs_session_get_attn_plan(&plan, s, 0));
    float *d;
    CUDA_OK(cudaMalloc((void **)&d, 2 * (CTXS_CUDA_MAX_HEAD_DIM + 8) * sizeof(float)));
    ctxs_attn_query q = {d, plan.n_tokens - 1, 1, 1, 0.0f};
    cr_expect_eq(ctxs_cuda_attention(d + CTXS_CUDA_MAX_HEAD_DIM + 8, kv, &plan, 0, &q, NULL),
                 CTXS_EINVAL);
    cudaFree(d);
    ctxs_cuda_detach(kv);
    ctxs_session_close(s);
}

Test(cuda, push_and_pull_check_the_tokens)
{
    need_device();
    uint64_t rng = ts_seed("cuda::push_and_pull_check_the_tokens");
    ctxs_model m = model_of(1, 2, 64);
    ctxs_session *s = create("a", &m, 64, 4, 0);
    append(s, 10, &rng);
    ctxs_reservation r;
    CTXS_OK(ctxs_session_reserve(&r, s, 5));
    for (int i = 0; i < 2; i++) {
        ctxs_cuda_kv *kv = attach(s, modes[i]);
        cr_expect_eq(ctxs_cuda_push(kv, NULL, 0, 1, NULL), CTXS_EINVAL);
        cr_expect_eq(ctxs_cuda_push(kv, &r, 0, 0, NULL), CTXS_EINVAL);
        cr_expect_eq(ctxs_cuda_push(kv, &r, 3, 3, NULL), CTXS_EINVAL);
        cr_expect_eq(ctxs_cuda_pull(kv, &r, 5, 1, NULL), CTXS_EINVAL);
        cr_expect_eq(ctxs_cuda_pull(kv, &r, UINT32_MAX, 2, NULL), CTXS_EINVAL);
        ctxs_reservation bad = r;
        bad.spans[0].slot = 62; /* 5 slots from 62 pass the capacity */
        cr_expect_eq(ctxs_cuda_push(kv, &bad, 0, 1, NULL), CTXS_EINVAL);
        bad = r, bad.n_spans = 3;
        cr_expect_eq(ctxs_cuda_pull(kv, &bad, 0, 1, NULL), CTXS_EINVAL);
        bad = r, bad.n_tokens = 6; /* more tokens than its spans hold */
        cr_expect_eq(ctxs_cuda_pull(kv, &bad, 0, 1, NULL), CTXS_EINVAL);
        CTXS_OK(ctxs_cuda_push(kv, &r, 0, 5, NULL));
        CTXS_OK(ctxs_cuda_pull(kv, &r, 4, 1, NULL));
        ctxs_cuda_detach(kv);
    }
    ctxs_session_close(s);
}

/* Only a plan made by hand leaves a query nothing to read: zeros, as on
 * the CPU. */
Test(cuda, a_query_that_reads_no_key_gets_zeros)
{
    need_device();
    uint64_t rng = ts_seed("cuda::a_query_that_reads_no_key_gets_zeros");
    ctxs_model m = model_of(1, 2, 64);
    ctxs_session *s = create("a", &m, 64, 1, 0);
    append(s, 20, &rng);
    ctxs_attn_plan plan;
    CTXS_OK(ctxs_session_get_attn_plan(&plan, s, 0));
    plan.n_sink = 0;
    plan.window = 2;
    plan.n_spans = 1;
    plan.spans[0] = (ctxs_attn_span){0, 0, 10};
    plan.n_keys = 10;
    plan.first_query = 0;
    for (int i = 0; i < 2; i++) {
        ctxs_cuda_kv *kv = attach(s, modes[i]);
        float out[2 * 4 * 64];
        /* Queries 12 and 13 read 11 to 13: the plan holds 0 to 9 only. */
        compare(kv, s, &plan, (pass){12, 2, 4, 0.0f}, 1, out, "no keys");
        for (size_t e = 0; e < sizeof out / sizeof out[0]; e++)
            cr_assert(out[e] == 0.0f, "output %zu is %g", e, (double)out[e]);
        /* 9 reads 8 and 9, 10 reads 9, 11 and 12 read none. */
        compare(kv, s, &plan, (pass){9, 4, 4, 0.0f}, 1, NULL, "some keys");
        ctxs_cuda_detach(kv);
    }
    ctxs_session_close(s);
}
