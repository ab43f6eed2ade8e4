/*
 * The forward passes: prefill (many tokens), step (one), resume (the last
 * committed token again, writing nothing).
 *
 * All three run forward() below, which treats its n tokens row by row with
 * the same functions whatever n is; that, and -ffp-contract=off, is what
 * makes a token's logits the same bits in every path (see tinychat.h).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

#define RMS_EPS 1e-6f

/* Rows per prefill chunk at most: bounds the scratch memory; the result does
 * not depend on it. */
#define MAX_CHUNK 512u

/* --- Per-row kernels ----------------------------------------------------------- */

static void rmsnorm(float *out, const float *x, const float *w, uint32_t d)
{
    float ss = 0.0f;
    for (uint32_t i = 0; i < d; i++)
        ss += x[i] * x[i];
    const float r = 1.0f / sqrtf(ss / (float)d + RMS_EPS);
    for (uint32_t i = 0; i < d; i++)
        out[i] = x[i] * r * w[i];
}

/* y[n][cols] = x[n][in] * w[in][cols]. Each y[t][j] is
 *     ((0 + x[t][0] w[0][j]) + x[t][1] w[1][j]) + ...
 * in ascending i, whatever n and the tiling: the loops below only choose
 * which outputs advance together (a tile of columns, a block of rows, so
 * that a tile of w stays in cache while the rows stream past), never the
 * order of one output's sum, so a token's row comes out the same bits alone
 * (step, resume) or among many (prefill). The innermost loop runs over
 * independent columns, so the compiler vectorizes it without reassociating
 * anything. (Holding a block of outputs in a local array across i, the
 * textbook register blocking, measured 2-3x slower here: GCC keeps the
 * array in memory.) */
#define COL_TILE 512u
#define ROW_BLOCK 8u

static void matmul(float *restrict y, const float *restrict x, const float *restrict w,
                   uint32_t n, uint32_t in, uint32_t cols)
{
    for (uint32_t j0 = 0; j0 < cols; j0 += COL_TILE) {
        const uint32_t jn = cols - j0 < COL_TILE ? cols - j0 : COL_TILE;
        for (uint32_t t0 = 0; t0 < n; t0 += ROW_BLOCK) {
            const uint32_t tn = n - t0 < ROW_BLOCK ? n - t0 : ROW_BLOCK;
            for (uint32_t t = t0; t < t0 + tn; t++)
                memset(y + (size_t)t * cols + j0, 0, jn * sizeof(float));
            for (uint32_t i = 0; i < in; i++) {
                const float *restrict wr = w + (size_t)i * cols + j0;
                for (uint32_t t = t0; t < t0 + tn; t++) {
                    const float a = x[(size_t)t * in + i];
                    float *restrict yr = y + (size_t)t * cols + j0;
                    for (uint32_t j = 0; j < jn; j++)
                        yr[j] += a * wr[j];
                }
            }
        }
    }
}

static void add_rows(float *restrict x, const float *restrict o, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] += o[i];
}

/* Rotary encoding, NeoX style: element i of a head pairs with i + half.
 * cs holds cos then sin of the token's angles, [2][half]. */
static void rope(float *v, uint32_t n_heads, uint32_t head_dim, const float *cs)
{
    const uint32_t half = head_dim / 2;
    const float *c = cs, *s = cs + half;
    for (uint32_t h = 0; h < n_heads; h++) {
        float *a = v + (size_t)h * head_dim, *b = a + half;
        for (uint32_t i = 0; i < half; i++) {
            const float x0 = a[i], x1 = b[i];
            a[i] = x0 * c[i] - x1 * s[i];
            b[i] = x0 * s[i] + x1 * c[i];
        }
    }
}

static void rope_angles(float *cs, const tinychat_model *m, uint64_t pos)
{
    const uint32_t half = m->cfg.head_dim / 2;
    for (uint32_t i = 0; i < half; i++) {
        const double ang = (double)pos * m->inv_freq[i];
        cs[i] = (float)cos(ang);
        cs[half + i] = (float)sin(ang);
    }
}

static void swiglu(float *restrict g, const float *restrict u, size_t n)
{
    for (size_t i = 0; i < n; i++)
        g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static uint32_t argmax(const float *v, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

/* --- The pass ------------------------------------------------------------------- */

typedef enum { KV_WRITE, KV_CHECK } kv_mode;

/* Where a pass's K and V go: tokens i0 .. of reservation r of s
 * (KV_WRITE), or compared with what slots[] hold (KV_CHECK). */
typedef struct kv_dest {
    kv_mode mode;
    ctxs_session *s;
    const ctxs_reservation *r;
    uint32_t i0;
    const uint32_t *slots;
} kv_dest;

/* K and V of row t of layer l compared with what slot `slot` holds,
 * elements and (Q8) scales. Returns 1 when they differ, 0, or CTXS_EINVAL
 * from ctxs_dtype_encode() (a value that Q8 cannot hold). */
static int check_kv(tinychat_model *m, const ctxs_layout *lay, uint32_t l, uint32_t t,
                    uint32_t slot)
{
    const uint32_t hd = m->cfg.head_dim, kvd = m->kv_dim, n_kv = m->cfg.n_kv_heads;
    int differ = 0;
    for (uint32_t kind = 0; kind < 2; kind++)
        for (uint32_t h = 0; h < n_kv; h++) {
            const float *x = (kind ? m->v : m->k) + (size_t)t * kvd + (size_t)h * hd;
            uint8_t *dst = (uint8_t *)lay->kv + l * lay->layer_stride + kind * lay->kv_stride +
                           h * lay->head_stride + (size_t)slot * lay->slot_bytes;
            /* The layout's table: [layer][K/V][head][capacity]. */
            float *sdst = lay->scales ? lay->scales + ((size_t)(l * 2 + kind) * n_kv + h) *
                                                          lay->capacity + slot
                                      : NULL;
            float scale = 0.0f;
            int rc = ctxs_dtype_encode(m->kv_enc, &scale, x, hd, lay->geometry.dtype);
            if (rc < 0)
                return rc;
            differ |= memcmp(dst, m->kv_enc, lay->slot_bytes) != 0;
            /* Bits, not values: a stored -0 or NaN is not ours. */
            differ |= sdst && memcmp(sdst, &scale, sizeof(scale)) != 0;
        }
    return differ;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The K and V of rows 0 .. n of layer l, encoded in the session's dtype,
 * into tokens d->i0 .. of d->r with ctxs_session_write_layer(), which
 * stores what write_token would store from the same floats. */
static int write_kv(tinychat_model *m, const ctxs_layout *lay, uint32_t l, uint32_t n,
                    const kv_dest *d)
{
    const uint32_t hd = m->cfg.head_dim, n_kv = m->cfg.n_kv_heads, dtype = lay->geometry.dtype;
    const size_t heads = (size_t)n * n_kv;
    for (uint32_t kind = 0; kind < 2; kind++) {
        uint8_t *out = kind ? m->kv_v : m->kv_k;
        float *scales = (float *)(void *)(out + heads * lay->slot_bytes);
        for (size_t i = 0; i < heads; i++) {
            float scale = 0.0f;
            int rc = ctxs_dtype_encode(out + i * lay->slot_bytes, &scale,
                                       (kind ? m->v : m->k) + i * hd, hd, dtype);
            if (rc < 0)
                return rc;
            if (dtype == CTXS_DTYPE_Q8)
                memcpy(scales + i, &scale, sizeof(scale)); /* [n][n_kv] after the elements */
        }
    }
    const double t0 = now_s();
    int rc = ctxs_session_write_layer(d->s, d->r, l, d->i0, n, m->kv_k, m->kv_v, dtype);
    m->kv_write_s += now_s() - t0;
    return rc;
}

/* Runs tokens ids[0 .. n) at positions pos0 .. through every layer, their
 * K/V going to (or checked against) dest, attention by plan; *next_id gets the
 * greedy token after the last one, m->logits its logits. Returns 0,
 * CTXS_ECORRUPT (KV_CHECK found a difference), or the error of the write or
 * the kernel. */
static int forward(tinychat_model *m, const ctxs_session *s, const ctxs_layout *lay,
                   const ctxs_attn_plan *plan, uint32_t n_pending, uint64_t pos0,
                   const uint32_t *ids, uint32_t n, const kv_dest *dest, uint32_t *next_id)
{
    const tinychat_config *c = &m->cfg;
    const uint32_t d = c->d_model, qd = m->q_dim, kvd = m->kv_dim, F = c->ffn;
    const uint32_t hd = c->head_dim;
    int differ = 0, rc;

    /* A session opened without a model (read-only) may be another's. */
    const ctxs_geometry *g = &lay->geometry;
    if (g->n_layers != c->n_layers || g->n_kv_heads != c->n_kv_heads || g->head_dim != hd ||
        g->dtype != c->dtype)
        return CTXS_EMODEL;

    for (uint32_t t = 0; t < n; t++)
        memcpy(m->x + (size_t)t * d, m->embed + (size_t)ids[t] * d, d * sizeof(float));

    /* The rotary angles of each row, once for all layers. */
    for (uint32_t t = 0; t < n; t++)
        rope_angles(m->rope_cs + (size_t)t * hd, m, pos0 + t);

    for (uint32_t l = 0; l < c->n_layers; l++) {
        const tc__layer *L = &m->layers[l];
        for (uint32_t t = 0; t < n; t++)
            rmsnorm(m->h + (size_t)t * d, m->x + (size_t)t * d, L->attn_norm, d);
        matmul(m->q, m->h, L->wq, n, d, qd);
        matmul(m->k, m->h, L->wk, n, d, kvd);
        matmul(m->v, m->h, L->wv, n, d, kvd);
        /* A session with sliding-window layers: each layer's own layout
         * and plan (a windowed layer reads its last window positions, from
         * its own ring), as layer 0 of a one-layer layout. */
        const ctxs_layout *ly = lay;
        const ctxs_attn_plan *pl = plan;
        uint32_t li = l;
        ctxs_layout layer_lay;
        ctxs_attn_plan layer_plan;
        if (g->period) {
            if ((rc = ctxs_session_get_layer_attn(&layer_lay, &layer_plan, s, l, n_pending)) < 0)
                return rc;
            ly = &layer_lay;
            pl = &layer_plan;
            li = 0;
        }
        for (uint32_t t = 0; t < n; t++) {
            const float *cs = m->rope_cs + (size_t)t * hd;
            rope(m->q + (size_t)t * qd, c->n_heads, hd, cs);
            rope(m->k + (size_t)t * kvd, c->n_kv_heads, hd, cs);
            if (dest->mode == KV_CHECK) {
                /* A windowed ring has no sinks: position p is in slot
                 * p mod its length. */
                uint32_t slot = ly->token_ids ? dest->slots[t]
                                              : (uint32_t)((pos0 + t) % ly->capacity);
                if ((rc = check_kv(m, ly, li, t, slot)) < 0)
                    return rc;
                differ |= rc;
            }
        }
        if (dest->mode == KV_WRITE && (rc = write_kv(m, lay, l, n, dest)) < 0)
            return rc;
        const ctxs_attn_query q = {
            .q = m->q, .pos = pos0, .n = n, .n_heads = c->n_heads, .scale = 0.0f,
        };
        if ((rc = ctxs_attention(m->att, ly, pl, li, &q)) < 0)
            return rc;
        matmul(m->o, m->att, L->wo, n, qd, d);
        add_rows(m->x, m->o, (size_t)n * d);

        for (uint32_t t = 0; t < n; t++)
            rmsnorm(m->h + (size_t)t * d, m->x + (size_t)t * d, L->ffn_norm, d);
        matmul(m->gate, m->h, L->w_gate, n, d, F);
        matmul(m->up, m->h, L->w_up, n, d, F);
        swiglu(m->gate, m->up, (size_t)n * F);
        matmul(m->o, m->gate, L->w_down, n, F, d);
        add_rows(m->x, m->o, (size_t)n * d);
    }

    /* Only the last row's logits are wanted: one row, the same code a
     * single-token pass runs. */
    rmsnorm(m->h, m->x + (size_t)(n - 1) * d, m->out_norm, d);
    matmul(m->logits, m->h, m->unembed, 1, d, c->vocab);
    *next_id = argmax(m->logits, c->vocab);
    return differ ? CTXS_ECORRUPT : 0;
}

/* --- Entry points -------------------------------------------------------------- */

/* How many of `left` tokens to feed at position a in one reservation. A
 * chunk that makes the ring evict must not evict a key its first query
 * reads: with held recent positions [a + c - R, a + c) after the
 * reservation and the window reading [a + 1 - W, a] for the query at a, the
 * chunk is exact when c <= R + 1 - W (W capped at R: one step reads at most
 * the ring). Until the capacity is reached nothing is evicted. */
static uint32_t chunk_len(const ctxs_session_info *info, uint64_t a, uint64_t left)
{
    uint64_t c = left;
    if (info->flags & CTXS_INFO_RING) {
        const uint64_t cap = info->capacity, ring = cap - info->n_sink;
        if (a < cap) {
            if (c > cap - a)
                c = cap - a;
        } else {
            const uint64_t w = info->window < ring ? info->window : ring;
            const uint64_t most = ring + 1 - w;
            if (c > most)
                c = most;
        }
    }
    const uint32_t most = info->model.geometry.period ? TINYCHAT_SWA_BATCH : MAX_CHUNK;
    return (uint32_t)(c < most ? c : most);
}

int tinychat_prefill(tinychat_model *m, ctxs_session *s, const uint32_t *ids, uint32_t n,
                     uint32_t *next_id)
{
    if (!m || !s || !ids || !next_id || n == 0)
        return CTXS_EINVAL;
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] >= m->cfg.vocab)
            return CTXS_EINVAL;

    ctxs_session_info info;
    ctxs_layout lay;
    int rc;
    if ((rc = ctxs_session_get_info(&info, s)) < 0 || (rc = ctxs_session_get_layout(&lay, s)) < 0)
        return rc;
    /* A reservation left by a call that failed would sit before ours, and
     * the plan would read its slots as our pending tokens. */
    if (info.n_reserved)
        return CTXS_EINVAL;
    if (info.flags & CTXS_INFO_READONLY)
        return CTXS_EREADONLY;

    uint64_t pos = info.n_tokens;
    uint32_t done = 0, next = 0;
    while (done < n) {
        const uint32_t c = chunk_len(&info, pos, n - done);
        if ((rc = tc__scratch_reserve(m, c)) < 0)
            return rc;
        ctxs_reservation r;
        ctxs_attn_plan plan;
        if ((rc = ctxs_session_reserve(&r, s, c)) < 0)
            return rc;
        const kv_dest d = {KV_WRITE, s, &r, 0, NULL};
        if ((rc = ctxs_session_get_attn_plan(&plan, s, c)) < 0 ||
            (rc = forward(m, s, &lay, &plan, c, pos, ids + done, c, &d, &next)) < 0 ||
            (rc = ctxs_session_commit(s, ids + done, c)) < 0)
            return rc;
        done += c;
        pos += c;
        if (done < n && (rc = ctxs_session_get_info(&info, s)) < 0)
            return rc;
    }
    *next_id = next;
    return 0;
}

int tinychat_step(tinychat_model *m, ctxs_session *s, uint32_t id, uint32_t *next_id)
{
    return tinychat_prefill(m, s, &id, 1, next_id);
}

int tinychat_resume(tinychat_model *m, ctxs_session *s, uint32_t *next_id)
{
    if (!m || !s || !next_id)
        return CTXS_EINVAL;
    ctxs_session_info info;
    ctxs_layout lay;
    ctxs_attn_plan plan;
    int rc;
    if ((rc = ctxs_session_get_info(&info, s)) < 0 || (rc = ctxs_session_get_layout(&lay, s)) < 0)
        return rc;
    if (info.n_tokens == 0)
        return CTXS_EINVAL;
    const uint64_t pos = info.n_tokens - 1;
    uint32_t slot;
    if ((rc = ctxs_session_get_slot(&slot, s, pos)) < 0 ||
        (rc = ctxs_session_get_attn_plan(&plan, s, 0)) < 0)
        return rc;
    const uint32_t id = lay.token_ids[slot];
    if (id >= m->cfg.vocab)
        return CTXS_ECORRUPT;
    /* The plan with nothing pending serves the last committed position:
     * the query it recomputes. Its K and V are in the session already; the
     * pass recomputes them anyway and checks them against the stored ones. */
    const kv_dest d = {KV_CHECK, NULL, NULL, 0, &slot};
    return forward(m, s, &lay, &plan, 0, pos, &id, 1, &d, next_id);
}

int tinychat_write(tinychat_model *m, ctxs_session *s, const ctxs_reservation *r, uint32_t *ids,
                   int generate, uint32_t *next_id)
{
    if (!m || !s || !r || !ids || r->n_tokens == 0)
        return CTXS_EINVAL;
    ctxs_session_info info;
    ctxs_layout lay;
    ctxs_attn_plan plan;
    int rc;
    if ((rc = ctxs_session_get_info(&info, s)) < 0 || (rc = ctxs_session_get_layout(&lay, s)) < 0)
        return rc;
    /* r must be the newest reservation: its tokens end the pending ones,
     * and the plans below count pending tokens from the committed end. */
    const uint64_t first = r->first_pos;
    if (first < info.n_tokens || first + r->n_tokens != info.n_tokens + info.n_reserved)
        return CTXS_EINVAL;
    const uint32_t before = (uint32_t)(first - info.n_tokens); /* pending ahead of r */
    if (!generate)
        for (uint32_t i = 0; i < r->n_tokens; i++)
            if (ids[first + i] >= m->cfg.vocab)
                return CTXS_EINVAL;
    if ((rc = tc__scratch_reserve(m, generate ? 1 : (r->n_tokens < MAX_CHUNK ? r->n_tokens
                                                                            : MAX_CHUNK))) < 0)
        return rc;

    uint32_t next = 0;
    if (generate) {
        /* The first new token is the prediction after the token before it,
         * which is in the session (committed or pending): recompute it, as
         * a resume does, checking its stored K and V on the way. */
        if (first == 0 || ids[first - 1] >= m->cfg.vocab)
            return CTXS_EINVAL;
        uint32_t prev_slot;
        if ((rc = ctxs_session_get_attn_plan(&plan, s, before)) < 0)
            return rc;
        /* Its slot, from the plan: pending tokens have no other public
         * position-to-slot map, and the plan always holds the position it
         * serves. */
        rc = CTXS_EINVAL;
        for (uint32_t j = 0; j < plan.n_spans; j++)
            if (first - 1 >= plan.spans[j].pos && first - 1 - plan.spans[j].pos < plan.spans[j].count) {
                prev_slot = plan.spans[j].slot + (uint32_t)(first - 1 - plan.spans[j].pos);
                rc = 0;
            }
        const kv_dest check = {KV_CHECK, NULL, NULL, 0, &prev_slot};
        if (rc < 0 || (rc = forward(m, s, &lay, &plan, before, first - 1, &ids[first - 1], 1,
                                    &check, &next)) < 0)
            return rc;
        for (uint32_t i = 0; i < r->n_tokens; i++) {
            ids[first + i] = next;
            const kv_dest d = {KV_WRITE, s, r, i, NULL};
            if ((rc = ctxs_session_get_attn_plan(&plan, s, before + i + 1)) < 0 ||
                (rc = forward(m, s, &lay, &plan, before + i + 1, first + i, &ids[first + i], 1,
                              &d, &next)) < 0)
                return rc;
        }
    } else {
        for (uint32_t done = 0; done < r->n_tokens;) {
            const uint32_t c = r->n_tokens - done < MAX_CHUNK ? r->n_tokens - done : MAX_CHUNK;
            const kv_dest d = {KV_WRITE, s, r, done, NULL};
            if ((rc = ctxs_session_get_attn_plan(&plan, s, before + done + c)) < 0 ||
                (rc = forward(m, s, &lay, &plan, before + done + c, first + done,
                              &ids[first + done], c, &d, &next)) < 0)
                return rc;
            done += c;
        }
    }
    if (next_id)
        *next_id = next;
    return 0;
}

double tinychat_kv_write_seconds(const tinychat_model *m)
{
    return m->kv_write_s;
}

const float *tinychat_logits(const tinychat_model *m)
{
    return m->logits;
}
