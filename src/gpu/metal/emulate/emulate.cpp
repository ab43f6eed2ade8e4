// attention.metal run on the CPU (see run.sh): one OS thread per GPU
// thread of a threadgroup, std::barrier for threadgroup_barrier, and
// SIMD-group reductions through a per-SIMD-group barrier. The output is
// compared with ctxs_attention() on the same sessions and plans, for
// threadgroup sizes and SIMD widths that Apple GPUs (32), and others a
// Mac may have, would give.
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <unistd.h>

#include "attention_stripped.cpp"
#include "ctxstore.h"

namespace {

struct group_ctx {
    std::barrier<> *tg;
    std::vector<std::unique_ptr<std::barrier<>>> simd;
    std::vector<float> lanes; // [n_sg][width]
    uint width, nt;
};

thread_local group_ctx *t_group;
thread_local uint t_sg, t_lane;

float simd_reduce(float x, bool is_max)
{
    group_ctx &g = *t_group;
    uint n = std::min(g.width, g.nt - t_sg * g.width);
    g.lanes[t_sg * g.width + t_lane] = x;
    g.simd[t_sg]->arrive_and_wait();
    float r = g.lanes[t_sg * g.width];
    for (uint l = 1; l < n; l++) {
        float y = g.lanes[t_sg * g.width + l];
        r = is_max ? std::max(r, y) : r + y;
    }
    g.simd[t_sg]->arrive_and_wait(); // before the lanes are reused
    return r;
}

} // namespace

namespace metal {
void threadgroup_barrier(mem_flags) { t_group->tg->arrive_and_wait(); }
float simd_sum(float x) { return simd_reduce(x, false); }
float simd_max(float x) { return simd_reduce(x, true); }
} // namespace metal

static_assert(sizeof(ctxs_params) == 136, "metal.m's metal_params");

// What ctxs_metal_attention() does, with threads per threadgroup nt and a
// SIMD width w; the argument block is filled as metal.m fills it.
static void run_kernel(float *out, const ctxs_layout *lay,
                       const ctxs_attn_plan *plan, uint32_t layer,
                       const ctxs_attn_query *q, uint nt, uint w)
{
    const uint32_t hd = lay->geometry.head_dim;
    ctxs_params p{};
    p.k_off = (uint64_t)layer * lay->layer_stride;
    p.kv_stride = lay->kv_stride;
    p.head_stride = lay->head_stride;
    p.q_pos = q->pos;
    p.n_sink = plan->n_sink;
    p.window = plan->window;
    p.n_spans = plan->n_spans;
    p.head_dim = hd;
    p.n_heads = q->n_heads;
    p.group = q->n_heads / lay->geometry.n_kv_heads;
    p.scale = q->scale != 0.0f ? q->scale : (float)(1.0 / std::sqrt((double)hd));
    for (uint32_t i = 0; i < plan->n_spans; i++) {
        p.span_pos[i] = plan->spans[i].pos;
        p.span_slot[i] = plan->spans[i].slot;
        p.span_count[i] = plan->spans[i].count;
    }
    const uint n_sg = (nt + w - 1) / w;
    for (uint i = 0; i < q->n; i++) {
        for (uint h = 0; h < q->n_heads; h++) {
            // Poisoned, so that a read before a write shows.
            std::vector<float> shm(hd + nt + 2 * n_sg, NAN);
            std::vector<uint> slot(nt, 0xdeadbeefu);
            std::barrier<> tg(nt);
            group_ctx g;
            g.tg = &tg;
            g.width = w;
            g.nt = nt;
            g.lanes.assign((size_t)n_sg * w, NAN);
            for (uint s = 0; s < n_sg; s++)
                g.simd.emplace_back(new std::barrier<>(std::min(w, nt - s * w)));
            std::vector<std::thread> threads;
            for (uint t = 0; t < nt; t++) {
                threads.emplace_back([&, t] {
                    t_group = &g;
                    t_sg = t / w;
                    t_lane = t % w;
                    ctxs_attention_f16((const uchar *)lay->kv, q->q, out, p,
                                       shm.data(), slot.data(), uint2{h, i},
                                       t, nt, t / w, n_sg, t % w, w);
                });
            }
            for (auto &th : threads)
                th.join();
        }
    }
}

static uint64_t g_seed = 12345;

static uint64_t next_random()
{
    uint64_t x = g_seed;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return g_seed = x;
}

// As tests/test_metal.m: either sign in [0.5, 1), now and then [8, 16).
static uint16_t random_half()
{
    uint64_t r = next_random();
    uint16_t h = (uint16_t)((r & 0x83ffu) | 0x3800u);
    if ((r >> 32) % 61 == 0)
        h = (uint16_t)((h & 0x83ffu) | 0x4800u);
    return h;
}

static float random_float(float amp)
{
    return amp * (float)((double)(next_random() >> 11) / 0x1p52 - 1.0);
}

static void check(int rc, const char *what)
{
    if (rc != 0) {
        fprintf(stderr, "%s: %s\n", what, ctxs_strerror(rc));
        exit(2);
    }
}

static void append(ctxs_session *s, const ctxs_geometry *g, uint32_t n,
                   bool commit)
{
    ctxs_reservation r;
    check(ctxs_session_reserve(&r, s, n), "reserve");
    size_t e = (size_t)g->n_layers * g->n_kv_heads * g->head_dim;
    std::vector<uint16_t> k(e), v(e);
    std::vector<uint32_t> ids(n);
    for (uint32_t i = 0; i < n; i++) {
        for (size_t j = 0; j < e; j++) {
            k[j] = random_half();
            v[j] = random_half();
        }
        check(ctxs_session_write_token(s, &r, i, k.data(), v.data(), CTXS_DTYPE_F16), "write");
        ids[i] = i;
    }
    if (commit)
        check(ctxs_session_commit(s, ids.data(), n), "commit");
}

static ctxs_session *make_session(const char *dir, const ctxs_geometry *g,
                                  uint32_t capacity, uint32_t n_sink,
                                  uint32_t window)
{
    ctxs_model m{};
    m.geometry = *g;
    memcpy(m.model_hash, "emulate-metal---", 16);
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = capacity;
    o.n_sink = n_sink;
    o.open.window = window;
    o.open.durability = CTXS_SYNC_NONE;
    char path[4096];
    snprintf(path, sizeof path, "%s/s%u.ctxs", dir, capacity);
    unlink(path);
    ctxs_session *s;
    check(ctxs_session_create(&s, path, &m, &o), "create");
    return s;
}

static int g_failures;

static void compare(ctxs_session *s, const ctxs_attn_plan *plan,
                    uint32_t layer, const ctxs_attn_query *q, uint nt, uint w,
                    const char *what)
{
    ctxs_layout lay;
    check(ctxs_session_get_layout(&lay, s), "layout");
    size_t n = (size_t)q->n * q->n_heads * lay.geometry.head_dim;
    std::vector<float> want(n), got(n, NAN);
    check(ctxs_attention(want.data(), &lay, plan, layer, q), "ctxs_attention");
    run_kernel(got.data(), &lay, plan, layer, q, nt, w);
    double worst = 0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double err = std::fabs((double)got[i] - (double)want[i]);
        if (!(err <= 2e-5 + 2e-4 * std::fabs((double)want[i]))) // NaN too
            bad++;
        if (!(err <= worst))
            worst = err;
    }
    printf("%-38s nt %3u  simd %2u  layer %u  n %u: largest diff %.3g, "
           "%zu of %zu out of tolerance\n",
           what, nt, w, layer, q->n, worst, bad, n);
    g_failures += bad != 0;
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "/tmp";
    // Threads per threadgroup and SIMD width: Apple GPUs (32 wide), with a
    // partial last SIMD-group (100), and other widths a Mac's GPU may have.
    static const uint configs[][2] = {
        {128, 32}, {96, 32}, {100, 32}, {36, 32}, {128, 64}, {64, 16},
    };

    {
        const ctxs_geometry g = {3, 2, 128, CTXS_DTYPE_F16};
        ctxs_session *s = make_session(dir, &g, 1024, 4, 2048);
        append(s, &g, 700, true);
        ctxs_attn_plan plan;
        check(ctxs_session_get_attn_plan(&plan, s, 0), "plan");
        std::vector<float> qv(8 * 128);
        for (float &x : qv)
            x = random_float(2.0f);
        ctxs_attn_query q{};
        q.q = qv.data();
        q.pos = plan.first_query;
        q.n = 1;
        q.n_heads = 8; // GQA 4:1
        for (const auto &c : configs)
            compare(s, &plan, 1, &q, c[0], c[1], "decode, 700 keys, GQA 4:1");
        q.scale = 0.25f;
        compare(s, &plan, 2, &q, 128, 32, "decode, scale 0.25");
        ctxs_session_close(s);
    }
    {
        const ctxs_geometry g = {2, 2, 80, CTXS_DTYPE_F16};
        ctxs_session *s = make_session(dir, &g, 64, 4, 24);
        for (int i = 0; i < 3; i++)
            append(s, &g, 50, true); // the ring wraps
        append(s, &g, 9, false);     // a prefill of 9, pending
        ctxs_attn_plan plan;
        check(ctxs_session_get_attn_plan(&plan, s, 9), "plan");
        std::vector<float> qv(9 * 6 * 80);
        for (float &x : qv)
            x = random_float(1.0f);
        ctxs_attn_query q{};
        q.q = qv.data();
        q.pos = plan.first_query;
        q.n = 9;
        q.n_heads = 6; // GQA 3:1, head_dim 80
        for (const auto &c : configs)
            compare(s, &plan, 1, &q, c[0], c[1], "prefill of 9, wrapped ring");
        q.pos += 7;
        q.n = 2;
        q.q = qv.data() + 7 * 6 * 80;
        compare(s, &plan, 0, &q, 128, 32, "its last 2 queries alone");
        ctxs_session_close(s);
    }
    {
        const ctxs_geometry g = {1, 1, 32, CTXS_DTYPE_F16};
        ctxs_session *s = make_session(dir, &g, 256, 4, 1);
        append(s, &g, 200, true);
        ctxs_attn_plan plan;
        check(ctxs_session_get_attn_plan(&plan, s, 0), "plan");
        std::vector<float> qv(2 * 32, 0.5f);
        ctxs_attn_query q{};
        q.q = qv.data();
        q.pos = plan.first_query;
        q.n = 1;
        q.n_heads = 2;
        compare(s, &plan, 0, &q, 128, 32, "window 1: the sinks and itself");
        // By hand: a plan whose keys the query does not read gives zeros.
        ctxs_attn_plan none = plan;
        none.n_spans = 1;
        none.spans[0] = ctxs_attn_span{0, 0, 2};
        none.n_keys = 2;
        none.n_sink = 0;
        compare(s, &none, 0, &q, 128, 32, "a query that reads no key");
        ctxs_session_close(s);
    }
    printf(g_failures ? "emulate: %d FAILED\n" : "emulate: all passed\n",
           g_failures);
    return g_failures != 0;
}
