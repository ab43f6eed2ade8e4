// attention.metal run on the CPU (see run.sh): one OS thread per GPU
// thread of a threadgroup, std::barrier for threadgroup_barrier, and
// SIMD-group reductions through a per-SIMD-group barrier. The output is
// compared with an fp64 reference computed here and with ctxs_attention()
// (where it accepts the session's dtype) on the same sessions and plans,
// for each session dtype (fp16, bf16, Q8) and for threadgroup sizes and
// SIMD widths that Apple GPUs (32), and others a Mac may have, would give.
#include <barrier>
#include <cmath>
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

static_assert(sizeof(ctxs_params) == 152, "metal.m's metal_params");

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
    const uint32_t dt = lay->geometry.dtype, n_kv = lay->geometry.n_kv_heads;
    if (dt == CTXS_DTYPE_Q8) {
        p.k_scale_off = (uint64_t)layer * 2 * n_kv * lay->capacity;
        p.v_scale_off = p.k_scale_off + (uint64_t)n_kv * lay->capacity;
        p.capacity = lay->capacity;
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
                    const uchar *kv = (const uchar *)lay->kv;
                    if (dt == CTXS_DTYPE_Q8)
                        ctxs_attention_q8(kv, q->q, out, p, lay->scales, shm.data(),
                                          slot.data(), uint2{h, i}, t, nt, t / w, n_sg,
                                          t % w, w);
                    else if (dt == CTXS_DTYPE_BF16)
                        ctxs_attention_bf16(kv, q->q, out, p, shm.data(), slot.data(),
                                            uint2{h, i}, t, nt, t / w, n_sg, t % w, w);
                    else
                        ctxs_attention_f16(kv, q->q, out, p, shm.data(), slot.data(),
                                           uint2{h, i}, t, nt, t / w, n_sg, t % w, w);
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

// n queries of n_heads heads of head_dim random floats in qv, each at most
// amp, the first at the plan's first query.
static ctxs_attn_query random_query(std::vector<float> &qv, float amp, const ctxs_attn_plan &plan,
                                    uint32_t n, uint32_t n_heads, uint32_t head_dim)
{
    qv.resize((size_t)n * n_heads * head_dim);
    for (float &x : qv)
        x = random_float(amp);
    ctxs_attn_query q{};
    q.q = qv.data();
    q.pos = plan.first_query;
    q.n = n;
    q.n_heads = n_heads;
    return q;
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

static const char *dtype_name(uint32_t dtype)
{
    return dtype == CTXS_DTYPE_F16 ? "f16" : dtype == CTXS_DTYPE_BF16 ? "bf16" : "q8";
}

// Element i of a run of the layout's dtype, as the session means it (Q8
// before its scale).
static double element(const ctxs_layout *lay, const uint8_t *run, size_t i)
{
    uint16_t h;
    switch (lay->geometry.dtype) {
    case CTXS_DTYPE_BF16: {
        std::memcpy(&h, run + 2 * i, 2);
        uint32_t b = (uint32_t)h << 16;
        float f;
        std::memcpy(&f, &b, 4);
        return f;
    }
    case CTXS_DTYPE_Q8:
        return (int8_t)run[i];
    default:
        std::memcpy(&h, run + 2 * i, 2);
        return (float)half{h};
    }
}

// What the kernel should give, in double: every query's keys (its sinks
// and window, up to itself, that the plan holds), softmax, weighted V.
static void reference(double *out, const ctxs_layout *lay, const ctxs_attn_plan *plan,
                      uint32_t layer, const ctxs_attn_query *q)
{
    const uint32_t hd = lay->geometry.head_dim, n_kv = lay->geometry.n_kv_heads;
    const uint32_t group = q->n_heads / n_kv;
    const double scale = q->scale != 0.0f ? q->scale : 1.0 / std::sqrt((double)hd);
    const bool q8 = lay->geometry.dtype == CTXS_DTYPE_Q8;
    for (uint32_t i = 0; i < q->n; i++) {
        const uint64_t pos = q->pos + i;
        for (uint32_t h = 0; h < q->n_heads; h++) {
            const uint32_t g = h / group;
            const uint8_t *K = (const uint8_t *)lay->kv + layer * lay->layer_stride +
                               g * lay->head_stride;
            const uint8_t *V = K + lay->kv_stride;
            const float *ks = q8 ? lay->scales + ((size_t)layer * 2 * n_kv + g) * lay->capacity
                                 : nullptr;
            const float *vs = q8 ? ks + (size_t)n_kv * lay->capacity : nullptr;
            const float *qh = q->q + ((size_t)i * q->n_heads + h) * hd;
            std::vector<uint32_t> slots;
            for (uint32_t sp = 0; sp < plan->n_spans; sp++) {
                for (uint32_t c = 0; c < plan->spans[sp].count; c++) {
                    const uint64_t kp = plan->spans[sp].pos + c;
                    if (kp <= pos && (kp < plan->n_sink || kp + plan->window > pos))
                        slots.push_back(plan->spans[sp].slot + c);
                }
            }
            std::vector<double> sc(slots.size());
            double m = -INFINITY, l = 0;
            for (size_t j = 0; j < slots.size(); j++) {
                double dot = 0;
                for (uint32_t d = 0; d < hd; d++)
                    dot += qh[d] * element(lay, K, (size_t)slots[j] * hd + d);
                sc[j] = scale * dot * (q8 ? ks[slots[j]] : 1.0);
                m = std::max(m, sc[j]);
            }
            double *o = out + ((size_t)i * q->n_heads + h) * hd;
            for (uint32_t d = 0; d < hd; d++)
                o[d] = 0;
            for (size_t j = 0; j < slots.size(); j++) {
                const double e = std::exp(sc[j] - m);
                l += e;
                const double wv = e * (q8 ? vs[slots[j]] : 1.0);
                for (uint32_t d = 0; d < hd; d++)
                    o[d] += wv * element(lay, V, (size_t)slots[j] * hd + d);
            }
            for (uint32_t d = 0; d < hd && l > 0; d++)
                o[d] /= l;
        }
    }
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
    o.ring = 1;
    o.open.window = window;
    o.open.durability = CTXS_SYNC_NONE;
    char path[4096];
    snprintf(path, sizeof path, "%s/s%u-%s.ctxs", dir, capacity, dtype_name(g->dtype));
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
    std::vector<float> cpu(n), got(n, NAN);
    std::vector<double> ref(n);
    // The CPU kernel may not read every dtype yet: then the reference
    // alone judges.
    const bool have_cpu = ctxs_attention(cpu.data(), &lay, plan, layer, q) == 0;
    reference(ref.data(), &lay, plan, layer, q);
    run_kernel(got.data(), &lay, plan, layer, q, nt, w);
    double worst[2] = {0, 0};
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        const double want[2] = {ref[i], cpu[i]};
        for (int k = 0; k < (have_cpu ? 2 : 1); k++) {
            double err = std::fabs((double)got[i] - want[k]);
            if (!(err <= 2e-5 + 2e-4 * std::fabs(want[k]))) // NaN too
                bad++;
            if (!(err <= worst[k]))
                worst[k] = err;
        }
    }
    char cpu_diff[32] = "(refused)";
    if (have_cpu)
        snprintf(cpu_diff, sizeof cpu_diff, "%.3g", worst[1]);
    printf("%-4s %-36s nt %3u  simd %2u  layer %u  n %u: largest diff fp64 %.3g, "
           "cpu %s; %zu out of tolerance\n",
           dtype_name(lay.geometry.dtype), what, nt, w, layer, q->n, worst[0], cpu_diff, bad);
    g_failures += bad != 0;
}

// Every case, on sessions of one dtype (written as fp16 and converted, or
// quantized, by the session).
static void run_cases(const char *dir, uint32_t dtype)
{
    // Threads per threadgroup and SIMD width: Apple GPUs (32 wide), with a
    // partial last SIMD-group (100), and other widths a Mac's GPU may have.
    static const uint configs[][2] = {
        {128, 32}, {96, 32}, {100, 32}, {36, 32}, {128, 64}, {64, 16},
    };

    {
        const ctxs_geometry g = {3, 2, 128, dtype, 0, {0}};
        ctxs_session *s = make_session(dir, &g, 1024, 4, 2048);
        append(s, &g, 700, true);
        ctxs_attn_plan plan;
        check(ctxs_session_get_attn_plan(&plan, s, 0), "plan");
        std::vector<float> qv;
        ctxs_attn_query q = random_query(qv, 2.0f, plan, 1, 8, 128); // GQA 4:1
        for (const auto &c : configs)
            compare(s, &plan, 1, &q, c[0], c[1], "decode, 700 keys, GQA 4:1");
        q.scale = 0.25f;
        compare(s, &plan, 2, &q, 128, 32, "decode, scale 0.25");
        ctxs_session_close(s);
    }
    {
        const ctxs_geometry g = {2, 2, 80, dtype, 0, {0}};
        ctxs_session *s = make_session(dir, &g, 64, 4, 24);
        for (int i = 0; i < 3; i++)
            append(s, &g, 50, true); // the ring wraps
        append(s, &g, 9, false);     // a prefill of 9, pending
        ctxs_attn_plan plan;
        check(ctxs_session_get_attn_plan(&plan, s, 9), "plan");
        std::vector<float> qv;
        ctxs_attn_query q = random_query(qv, 1.0f, plan, 9, 6, 80); // GQA 3:1, head_dim 80
        for (const auto &c : configs)
            compare(s, &plan, 1, &q, c[0], c[1], "prefill of 9, wrapped ring");
        q.pos += 7;
        q.n = 2;
        q.q = qv.data() + 7 * 6 * 80;
        compare(s, &plan, 0, &q, 128, 32, "its last 2 queries alone");
        ctxs_session_close(s);
    }
    {
        const ctxs_geometry g = {1, 1, 32, dtype, 0, {0}};
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
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "/tmp";
    for (uint32_t dtype : {CTXS_DTYPE_F16, CTXS_DTYPE_BF16, CTXS_DTYPE_Q8})
        run_cases(dir, dtype);
    printf(g_failures ? "emulate: %d FAILED\n" : "emulate: all passed\n",
           g_failures);
    return g_failures != 0;
}
