/*
 * The Metal kernel against the CPU reference, like dav1d's checkasm: the
 * same session, plan and queries through ctxs_metal_attention() and
 * ctxs_attention(), outputs equal to float rounding, for each session dtype
 * (fp16, bf16, Q8 with its scale table). Skipped where there is no Metal
 * device. Objective-C (ARC) because the test makes its own
 * MTLBuffers; built by this directory's meson.build, suite 'gpu'.
 */
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include <criterion/criterion.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctxstore.h"
#include "ctxstore_metal.h"

static char g_dir[PATH_MAX];

static void make_dir(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/test_metal.XXXXXX",
             tmp && *tmp ? tmp : "/tmp");
    cr_assert_not_null(mkdtemp(g_dir));
}

static const uint32_t k_dtypes[3] = { CTXS_DTYPE_F16, CTXS_DTYPE_BF16,
                                      CTXS_DTYPE_Q8 };

static const char *dtype_name(uint32_t dtype)
{
    return dtype == CTXS_DTYPE_F16 ? "f16" : dtype == CTXS_DTYPE_BF16 ? "bf16" : "q8";
}

/* The tests make only session files named s<capacity>-<dtype>.ctxs here. */
static void remove_dir(void)
{
    static const unsigned capacities[] = { 32, 64, 256, 1024 };
    char path[PATH_MAX];
    for (size_t i = 0; i < sizeof capacities / sizeof capacities[0]; i++) {
        for (int d = 0; d < 3; d++) {
            snprintf(path, sizeof path, "%s/s%u-%s.ctxs", g_dir, capacities[i],
                     dtype_name(k_dtypes[d]));
            unlink(path);
        }
    }
    rmdir(g_dir);
}

TestSuite(metal, .init = make_dir, .fini = remove_dir);

static id<MTLDevice> device_or_skip(void)
{
    id<MTLDevice> dev = MTLCreateSystemDefaultDevice();
#if TARGET_OS_OSX
    if (!dev)
        dev = MTLCopyAllDevices().firstObject;
#endif
    if (!dev)
        cr_skip_test("SKIPPED: no Metal device");
    return dev;
}

static uint64_t next_random(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* fp16 of either sign in [0.5, 1), or now and then up to 8, so that some
 * keys stand out and the softmax is not flat. */
static uint16_t random_half(uint64_t *s)
{
    uint64_t r = next_random(s);
    uint16_t h = (uint16_t)((r & 0x83ffu) | 0x3800u);
    if ((r >> 32) % 61 == 0)
        h = (uint16_t)((h & 0x83ffu) | 0x4800u); /* [8, 16) */
    return h;
}

static float random_float(uint64_t *s, float amp)
{
    return amp * (float)((double)(next_random(s) >> 11) / 0x1p52 - 1.0);
}

/* Reserves n tokens and writes random K/V into them, handed over as fp16
 * (a bf16 session rounds them, a Q8 one quantizes); commits them, or with
 * commit == 0 leaves them pending (for a plan with n_pending). */
static void append(ctxs_session *s, const ctxs_geometry *g, uint32_t n,
                   int commit, uint64_t *seed)
{
    ctxs_reservation r;
    cr_assert_eq(ctxs_session_reserve(&r, s, n), 0);
    size_t elems = (size_t)g->n_layers * g->n_kv_heads * g->head_dim;
    uint16_t *k = malloc(elems * 2), *v = malloc(elems * 2);
    uint32_t *ids = malloc(n * sizeof ids[0]);
    cr_assert(k && v && ids);
    for (uint32_t i = 0; i < n; i++) {
        for (size_t e = 0; e < elems; e++) {
            k[e] = random_half(seed);
            v[e] = random_half(seed);
        }
        cr_assert_eq(ctxs_session_write_token(s, &r, i, k, v, CTXS_DTYPE_F16), 0);
        ids[i] = i;
    }
    if (commit)
        cr_assert_eq(ctxs_session_commit(s, ids, n), 0);
    free(k);
    free(v);
    free(ids);
}

static ctxs_session *make_session(const ctxs_geometry *g, uint32_t capacity,
                                  uint32_t n_sink, uint32_t window)
{
    ctxs_model model = { .geometry = *g };
    memcpy(model.model_hash, "test-metal-model", 16);
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = capacity;
    o.n_sink = n_sink;
    o.open.window = window;
    o.open.durability = CTXS_SYNC_NONE;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/s%u-%s.ctxs", g_dir, capacity,
             dtype_name(g->dtype));
    ctxs_session *s = NULL;
    cr_assert_eq(ctxs_session_create(&s, path, &model, &o), 0);
    return s;
}

/* Runs one pass on the CPU and on the GPU and compares. q_in_buffer: the
 * queries in an MTLBuffer, encoded into a command buffer of the test's
 * own; else q->q copied by the library, which commits and waits. */
static void compare(id<MTLDevice> dev, ctxs_session *s,
                    const ctxs_attn_plan *plan, uint32_t layer,
                    const ctxs_attn_query *q, int q_in_buffer)
{
    ctxs_layout lay;
    cr_assert_eq(ctxs_session_get_layout(&lay, s), 0);
    size_t n = (size_t)q->n * q->n_heads * lay.geometry.head_dim;
    float *want = malloc(n * sizeof(float));
    cr_assert_not_null(want);
    cr_assert_eq(ctxs_attention(want, &lay, plan, layer, q), 0);

    ctxs_metal_kv *mkv = NULL;
    cr_assert_eq(ctxs_metal_attach(&mkv, s, (__bridge void *)dev), 0);
    id<MTLBuffer> kvbuf = (__bridge id<MTLBuffer>)ctxs_metal_get_buffer(mkv);
    cr_assert_eq(kvbuf.contents, lay.kv, "the buffer must be the mapping");
    id<MTLBuffer> sbuf = (__bridge id<MTLBuffer>)ctxs_metal_get_scales_buffer(mkv);
    if (lay.geometry.dtype == CTXS_DTYPE_Q8)
        cr_assert_eq(sbuf.contents, lay.scales, "the scales must be the mapping");
    else
        cr_assert_null(sbuf);

    id<MTLBuffer> out = [dev newBufferWithLength:n * sizeof(float)
                                         options:MTLResourceStorageModeShared];
    cr_assert_not_null(out);
    memset(out.contents, 0xff, n * sizeof(float)); /* NaN if not written */
    if (q_in_buffer) {
        id<MTLBuffer> qb = [dev newBufferWithBytes:q->q
                                            length:n * sizeof(float)
                                           options:MTLResourceStorageModeShared];
        id<MTLCommandQueue> queue = [dev newCommandQueue];
        id<MTLCommandBuffer> cb = [queue commandBuffer];
        cr_assert_eq(ctxs_metal_attention((__bridge void *)out, mkv,
                                          (__bridge void *)qb, plan, layer, q,
                                          (__bridge void *)cb), 0);
        [cb commit];
        [cb waitUntilCompleted];
        cr_assert_eq(cb.status, MTLCommandBufferStatusCompleted);
    } else {
        cr_assert_eq(ctxs_metal_attention((__bridge void *)out, mkv, NULL,
                                          plan, layer, q, NULL), 0);
    }

    const float *got = out.contents;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - (double)want[i]);
        double tol = 2e-5 + 2e-4 * fabs((double)want[i]);
        cr_assert(err <= tol, "%s, element %zu: metal %.9g, cpu %.9g",
                  dtype_name(lay.geometry.dtype), i, (double)got[i],
                  (double)want[i]);
        if (err > worst)
            worst = err;
    }
    cr_log_info("%s, layer %u, %u queries: largest difference %.3g",
                dtype_name(lay.geometry.dtype), layer, q->n, worst);
    ctxs_metal_detach(mkv);
    free(want);
}

static void check_decode(id<MTLDevice> dev, uint32_t dtype)
{
    const ctxs_geometry g = { 3, 2, 128, dtype, 0, {0} };
    ctxs_session *s = make_session(&g, 1024, 4, 2048);
    uint64_t seed = 42;
    append(s, &g, 700, 1, &seed); /* several blocks of 128 keys */

    ctxs_attn_plan plan;
    cr_assert_eq(ctxs_session_get_attn_plan(&plan, s, 0), 0);
    float *qv = malloc(8 * 128 * sizeof(float));
    for (int i = 0; i < 8 * 128; i++)
        qv[i] = random_float(&seed, 2.0f);
    ctxs_attn_query q = { .q = qv, .pos = plan.first_query, .n = 1,
                          .n_heads = 8 }; /* GQA 4:1 */
    for (uint32_t layer = 0; layer < g.n_layers; layer++)
        compare(dev, s, &plan, layer, &q, layer % 2);
    q.scale = 0.25f;
    compare(dev, s, &plan, 1, &q, 1);
    free(qv);
    ctxs_session_close(s);
}

Test(metal, decode_matches_the_cpu_kernel)
{
    id<MTLDevice> dev = device_or_skip();
    for (int d = 0; d < 3; d++)
        check_decode(dev, k_dtypes[d]);
}

static void check_prefill(id<MTLDevice> dev, uint32_t dtype)
{
    /* head_dim 80: not a multiple of the SIMD width; GQA 3:1. */
    const ctxs_geometry g = { 2, 2, 80, dtype, 0, {0} };
    ctxs_session *s = make_session(&g, 64, 4, 24);
    uint64_t seed = 7;
    for (int i = 0; i < 3; i++)
        append(s, &g, 50, 1, &seed); /* the ring wraps */
    append(s, &g, 9, 0, &seed);      /* pending: a prefill of 9 */

    ctxs_attn_plan plan;
    cr_assert_eq(ctxs_session_get_attn_plan(&plan, s, 9), 0);
    cr_assert_gt(plan.n_spans, 1, "the plan should wrap");
    float *qv = malloc(9 * 6 * 80 * sizeof(float));
    for (int i = 0; i < 9 * 6 * 80; i++)
        qv[i] = random_float(&seed, 1.0f);
    ctxs_attn_query q = { .q = qv, .pos = plan.first_query, .n = 9,
                          .n_heads = 6 };
    compare(dev, s, &plan, 0, &q, 1);
    compare(dev, s, &plan, 1, &q, 0);
    /* The last queries alone, as after a resume. */
    q.pos = plan.first_query + 7;
    q.n = 2;
    q.q = qv + 7 * 6 * 80;
    compare(dev, s, &plan, 1, &q, 0);
    free(qv);
    ctxs_session_close(s);
}

Test(metal, prefill_in_a_wrapped_ring_matches)
{
    id<MTLDevice> dev = device_or_skip();
    for (int d = 0; d < 3; d++)
        check_prefill(dev, k_dtypes[d]);
}

typedef struct bad_pass {
    const char *what;
    uint32_t layer;
    ctxs_attn_query q;
    ctxs_attn_plan plan;
} bad_pass;

Test(metal, refuses_what_the_cpu_kernel_refuses)
{
    id<MTLDevice> dev = device_or_skip();
    const ctxs_geometry g = { 2, 2, 64, CTXS_DTYPE_F16, 0, {0} };
    ctxs_session *s = make_session(&g, 32, 4, 2048);
    uint64_t seed = 3;
    append(s, &g, 10, 1, &seed);
    ctxs_layout lay;
    cr_assert_eq(ctxs_session_get_layout(&lay, s), 0);
    ctxs_metal_kv *mkv = NULL;
    cr_assert_eq(ctxs_metal_attach(&mkv, s, (__bridge void *)dev), 0);
    id<MTLBuffer> out = [dev newBufferWithLength:4 * 64 * sizeof(float)
                                         options:MTLResourceStorageModeShared];
    id<MTLBuffer> qb = [dev newBufferWithLength:4 * 64 * sizeof(float)
                                        options:MTLResourceStorageModeShared];
    float cpu_out[4 * 64];
    const float *qv = qb.contents;

    ctxs_attn_plan plan;
    cr_assert_eq(ctxs_session_get_attn_plan(&plan, s, 0), 0);
    ctxs_attn_query q = { .q = qv, .pos = plan.first_query, .n = 1,
                          .n_heads = 4 };
    bad_pass bad[8];
    int nb = 0;
    bad[nb++] = (bad_pass){ "layer out of range", 2, q, plan };
    bad[nb] = (bad_pass){ "n_heads not a multiple", 0, q, plan };
    bad[nb++].q.n_heads = 3;
    bad[nb] = (bad_pass){ "no query", 0, q, plan };
    bad[nb++].q.n = 0;
    bad[nb] = (bad_pass){ "before first_query", 0, q, plan };
    bad[nb++].q.pos = plan.first_query - 1;
    bad[nb] = (bad_pass){ "past n_tokens", 0, q, plan };
    bad[nb++].q.n = 2;
    bad[nb] = (bad_pass){ "n_keys wrong", 0, q, plan };
    bad[nb++].plan.n_keys += 1;
    bad[nb] = (bad_pass){ "span past capacity", 0, q, plan };
    bad[nb++].plan.spans[0].slot = 30;
    for (int i = 0; i < nb; i++) {
        cr_expect_eq(ctxs_attention(cpu_out, &lay, &bad[i].plan, bad[i].layer,
                                    &bad[i].q),
                     CTXS_EINVAL, "cpu: %s", bad[i].what);
        cr_expect_eq(ctxs_metal_attention((__bridge void *)out, mkv,
                                          (__bridge void *)qb, &bad[i].plan,
                                          bad[i].layer, &bad[i].q, NULL),
                     CTXS_EINVAL, "metal: %s", bad[i].what);
    }
    /* Metal's own: the same buffer twice, a short buffer, q->q without a
     * q_buffer but with a command buffer. */
    cr_expect_eq(ctxs_metal_attention((__bridge void *)out, mkv,
                                      (__bridge void *)out, &plan, 0, &q, NULL),
                 CTXS_EINVAL);
    id<MTLBuffer> small = [dev newBufferWithLength:16
                                           options:MTLResourceStorageModeShared];
    cr_expect_eq(ctxs_metal_attention((__bridge void *)small, mkv,
                                      (__bridge void *)qb, &plan, 0, &q, NULL),
                 CTXS_EINVAL);
    id<MTLCommandBuffer> cb = [[dev newCommandQueue] commandBuffer];
    cr_expect_eq(ctxs_metal_attention((__bridge void *)out, mkv, NULL, &plan,
                                      0, &q, (__bridge void *)cb),
                 CTXS_EINVAL);
    ctxs_metal_detach(mkv);
    ctxs_session_close(s);
}

Test(metal, attach_wants_whole_aligned_pages)
{
    const ctxs_geometry g = { 1, 1, 64, CTXS_DTYPE_F16, 0, {0} };
    ctxs_session *s = make_session(&g, 256, 4, 2048);
    ctxs_layout lay;
    cr_assert_eq(ctxs_session_get_layout(&lay, s), 0);
    ctxs_metal_kv *mkv = (ctxs_metal_kv *)(uintptr_t)1;

    ctxs_layout shifted = lay;
    shifted.kv = (char *)lay.kv + 2;
    cr_expect_eq(ctxs_metal_attach_layout(&mkv, &shifted, NULL), CTXS_EINVAL);
    cr_expect_null(mkv);
    ctxs_layout short_by_one = lay;
    short_by_one.kv_bytes -= 1;
    cr_expect_eq(ctxs_metal_attach_layout(&mkv, &short_by_one, NULL),
                 CTXS_EINVAL);
    ctxs_layout f32 = lay;
    f32.geometry.dtype = CTXS_DTYPE_F32; /* a form handed over, not stored */
    cr_expect_eq(ctxs_metal_attach_layout(&mkv, &f32, NULL), CTXS_EINVAL);
    cr_expect_eq(ctxs_metal_attach(&mkv, NULL, NULL), CTXS_EINVAL);
    cr_expect_eq(ctxs_metal_attach(NULL, s, NULL), CTXS_EINVAL);
    ctxs_metal_detach(NULL);
    cr_expect_null(ctxs_metal_get_buffer(NULL));
    cr_expect_null(ctxs_metal_get_scales_buffer(NULL));
    ctxs_session_close(s);

    /* A Q8 session's scale table is wrapped too: whole pages, aligned. */
    const ctxs_geometry g8 = { 1, 1, 64, CTXS_DTYPE_Q8, 0, {0} };
    s = make_session(&g8, 256, 4, 2048);
    cr_assert_eq(ctxs_session_get_layout(&lay, s), 0);
    cr_assert_not_null(lay.scales);
    ctxs_layout no_scales = lay;
    no_scales.scales = NULL;
    no_scales.scales_bytes = 0;
    cr_expect_eq(ctxs_metal_attach_layout(&mkv, &no_scales, NULL), CTXS_EINVAL);
    ctxs_layout scales_shifted = lay;
    scales_shifted.scales = (float *)(void *)((char *)lay.scales + 4);
    cr_expect_eq(ctxs_metal_attach_layout(&mkv, &scales_shifted, NULL),
                 CTXS_EINVAL);
    ctxs_layout scales_short = lay;
    scales_short.scales_bytes -= 4;
    cr_expect_eq(ctxs_metal_attach_layout(&mkv, &scales_short, NULL),
                 CTXS_EINVAL);
    cr_expect_null(mkv);
    ctxs_session_close(s);
}
