/*
 * The model: configuration, weights drawn from the seed, identity hashes,
 * scratch buffers.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "internal.h"

void tinychat_config_default(tinychat_config *cfg)
{
    *cfg = (tinychat_config){
        .vocab = 256,
        .d_model = 64,
        .n_layers = 4,
        .n_heads = 4,
        .n_kv_heads = 2,
        .head_dim = 16,
        .ffn = 128,
        .rope_theta = 10000.0f,
        .seed = 1,
        .dtype = CTXS_DTYPE_F16,
    };
}

void tinychat_config_qwen3_4b_kv(tinychat_config *cfg)
{
    tinychat_config_default(cfg);
    cfg->n_layers = 36;
    cfg->n_heads = 16;
    cfg->n_kv_heads = 8;
    cfg->head_dim = 128;
}

const tinychat_config *tinychat_model_config(const tinychat_model *m)
{
    return &m->cfg;
}

/* --- Weights ----------------------------------------------------------------
 *
 * Every matrix has its own splitmix64 stream, seeded from (seed, layer,
 * matrix), so a matrix does not change when another one changes shape. */

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t x = (*state += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

enum { W_EMBED, W_UNEMBED, W_Q, W_K, W_V, W_O, W_GATE, W_UP, W_DOWN };

/* n floats uniform in [-scale, scale): 24 random bits, exact in a float. */
static void fill_uniform(float *w, size_t n, float scale, uint64_t seed, uint32_t layer,
                         uint32_t which)
{
    uint64_t st = seed ^ ((uint64_t)layer << 32 | which) * 0xd6e8feb86659fd93ull;
    (void)splitmix64(&st);
    for (size_t i = 0; i < n; i++) {
        float u = (float)(splitmix64(&st) >> 40) * 0x1p-23f - 1.0f;
        w[i] = u * scale;
    }
}

static void fill_ones(float *w, size_t n)
{
    for (size_t i = 0; i < n; i++)
        w[i] = 1.0f;
}

static int config_valid(const tinychat_config *c)
{
    if (!c->vocab || !c->d_model || !c->n_layers || !c->n_heads || !c->n_kv_heads ||
        !c->head_dim || !c->ffn)
        return 0;
    if (c->n_heads % c->n_kv_heads || c->head_dim % 2)
        return 0;
    /* ctxstore's geometry limits, and sizes that keep every matrix below
     * 2^31 floats so that no product below overflows. */
    if (c->n_layers > 4096 || c->n_kv_heads > 4096 || c->head_dim > 4096 || c->n_heads > 65536)
        return 0;
    if (c->vocab > (1u << 24) || c->d_model > (1u << 16) || c->ffn > (1u << 20))
        return 0;
    uint64_t q_dim = (uint64_t)c->n_heads * c->head_dim;
    if ((uint64_t)c->vocab * c->d_model > (1ull << 31) || q_dim * c->d_model > (1ull << 31) ||
        (uint64_t)c->ffn * c->d_model > (1ull << 31))
        return 0;
    if (!(c->rope_theta > 1.0f) || !isfinite(c->rope_theta))
        return 0;
    if (c->dtype != CTXS_DTYPE_F16 && c->dtype != CTXS_DTYPE_BF16 && c->dtype != CTXS_DTYPE_Q8)
        return 0;
    if (c->swa_every && (c->swa_every < 2 || c->swa_every > CTXS_SCHEDULE_MAX ||
                         c->swa_window == 0 || c->swa_window > (1u << 24)))
        return 0;
    if (!c->swa_every && c->swa_window)
        return 0;
    return 1;
}

int tinychat_model_create(tinychat_model **out, const tinychat_config *cfg)
{
    if (!out)
        return CTXS_EINVAL;
    *out = NULL;
    if (!cfg || !config_valid(cfg))
        return CTXS_EINVAL;
    tinychat_model *m = calloc(1, sizeof(*m));
    if (!m)
        return CTXS_ENOMEM;
    m->cfg = *cfg;
    const size_t d = cfg->d_model, V = cfg->vocab, F = cfg->ffn;
    m->q_dim = cfg->n_heads * cfg->head_dim;
    m->kv_dim = cfg->n_kv_heads * cfg->head_dim;
    const size_t qd = m->q_dim, kvd = m->kv_dim;

    const size_t per_layer = 2 * d + d * qd + 2 * d * kvd + qd * d + 3 * d * F;
    const size_t total = 2 * V * d + d + per_layer * cfg->n_layers; /* < 2^44: no overflow */
    m->weights = malloc(total * sizeof(float));
    m->layers = calloc(cfg->n_layers, sizeof(*m->layers));
    m->inv_freq = malloc(cfg->head_dim / 2 * sizeof(double));
    if (!m->weights || !m->layers || !m->inv_freq) {
        tinychat_model_destroy(m);
        return CTXS_ENOMEM;
    }

    float *w = m->weights;
#define TAKE(n) (w += (n), w - (n))
    m->embed = TAKE(V * d);
    m->out_norm = TAKE(d);
    m->unembed = TAKE(d * V);
    fill_uniform(m->embed, V * d, 1.0f, cfg->seed, 0, W_EMBED);
    fill_ones(m->out_norm, d);
    fill_uniform(m->unembed, d * V, 1.0f / sqrtf((float)d), cfg->seed, 0, W_UNEMBED);
    for (uint32_t l = 0; l < cfg->n_layers; l++) {
        tc__layer *L = &m->layers[l];
        L->attn_norm = TAKE(d);
        L->wq = TAKE(d * qd);
        L->wk = TAKE(d * kvd);
        L->wv = TAKE(d * kvd);
        L->wo = TAKE(qd * d);
        L->ffn_norm = TAKE(d);
        L->w_gate = TAKE(d * F);
        L->w_up = TAKE(d * F);
        L->w_down = TAKE(F * d);
        const float sd = 1.0f / sqrtf((float)d);
        fill_ones(L->attn_norm, d);
        fill_ones(L->ffn_norm, d);
        fill_uniform(L->wq, d * qd, sd, cfg->seed, l + 1, W_Q);
        fill_uniform(L->wk, d * kvd, sd, cfg->seed, l + 1, W_K);
        fill_uniform(L->wv, d * kvd, sd, cfg->seed, l + 1, W_V);
        fill_uniform(L->wo, qd * d, 1.0f / sqrtf((float)qd), cfg->seed, l + 1, W_O);
        fill_uniform(L->w_gate, d * F, sd, cfg->seed, l + 1, W_GATE);
        fill_uniform(L->w_up, d * F, sd, cfg->seed, l + 1, W_UP);
        fill_uniform(L->w_down, F * d, 1.0f / sqrtf((float)F), cfg->seed, l + 1, W_DOWN);
    }
#undef TAKE

    /* theta^(-2i/head_dim), in double so that the angles of far positions
     * keep their precision; computed once, read by every pass. */
    for (uint32_t i = 0; i < cfg->head_dim / 2; i++)
        m->inv_freq[i] = pow((double)cfg->rope_theta, -2.0 * i / (double)cfg->head_dim);

    int rc = tc__scratch_reserve(m, 1);
    if (rc < 0) {
        tinychat_model_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}

static void free_scratch(tinychat_model *m)
{
    free(m->x);
    free(m->h);
    free(m->q);
    free(m->k);
    free(m->v);
    free(m->att);
    free(m->o);
    free(m->gate);
    free(m->up);
    free(m->rope_cs);
    free(m->kv_k);
    free(m->kv_v);
}

void tinychat_model_destroy(tinychat_model *m)
{
    if (!m)
        return;
    free_scratch(m);
    free(m->logits);
    free(m->kv_enc);
    free(m->inv_freq);
    free(m->layers);
    free(m->weights);
    free(m);
}

int tc__scratch_reserve(tinychat_model *m, uint32_t n)
{
    if (n <= m->rows)
        return 0;
    const tinychat_config *c = &m->cfg;
    free_scratch(m);
    m->rows = 0;
    m->x = malloc((size_t)n * c->d_model * sizeof(float));
    m->h = malloc((size_t)n * c->d_model * sizeof(float));
    m->q = malloc((size_t)n * m->q_dim * sizeof(float));
    m->k = malloc((size_t)n * m->kv_dim * sizeof(float));
    m->v = malloc((size_t)n * m->kv_dim * sizeof(float));
    m->att = malloc((size_t)n * m->q_dim * sizeof(float));
    m->o = malloc((size_t)n * c->d_model * sizeof(float));
    m->gate = malloc((size_t)n * c->ffn * sizeof(float));
    m->up = malloc((size_t)n * c->ffn * sizeof(float));
    m->rope_cs = malloc((size_t)n * c->head_dim * sizeof(float));
    /* 2 bytes an element at most, and Q8's scales. */
    size_t kv_bytes = (size_t)n * c->n_kv_heads * (c->head_dim * 2 + sizeof(float));
    m->kv_k = malloc(kv_bytes);
    m->kv_v = malloc(kv_bytes);
    if (!m->logits)
        m->logits = malloc((size_t)c->vocab * sizeof(float));
    if (!m->kv_enc)
        m->kv_enc = malloc((size_t)c->head_dim * 2); /* 2 bytes an element at most */
    if (!m->x || !m->h || !m->q || !m->k || !m->v || !m->att || !m->o || !m->gate || !m->up ||
        !m->rope_cs || !m->logits || !m->kv_enc || !m->kv_k || !m->kv_v) {
        free_scratch(m);
        m->x = m->h = m->q = m->k = m->v = m->att = m->o = m->gate = m->up = NULL;
        m->rope_cs = NULL;
        m->kv_k = m->kv_v = NULL;
        return CTXS_ENOMEM;
    }
    m->rows = n;
    return 0;
}

/* --- Identity ---------------------------------------------------------------- */

static uint8_t *put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        *p++ = (uint8_t)(v >> (8 * i));
    return p;
}

static void hash128(uint8_t out[16], const void *buf, size_t n)
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(buf, n));
    memcpy(out, c.digest, 16);
}

void tinychat_model_ctxs(ctxs_model *out, const tinychat_model *m)
{
    const tinychat_config *c = &m->cfg;
    memset(out, 0, sizeof(*out));
    out->geometry = (ctxs_geometry){c->n_layers, c->n_kv_heads, c->head_dim, c->dtype, 0, {0}};
    if (c->swa_every) {
        out->geometry.period = c->swa_every;
        for (uint32_t j = 0; j + 1 < c->swa_every; j++)
            out->geometry.window[j] = c->swa_window;
    }

    /* The fields one by one, little-endian: no padding, no host order. */
    static const char tag[] = "tinychat-model-v1";
    uint8_t buf[sizeof(tag) + 13 * 4], *p = buf;
    memcpy(p, tag, sizeof(tag));
    p += sizeof(tag);
    uint32_t theta_bits;
    memcpy(&theta_bits, &c->rope_theta, 4);
    const uint32_t f[] = {c->vocab, c->d_model, c->n_layers, c->n_heads, c->n_kv_heads,
                          c->head_dim, c->ffn, theta_bits, (uint32_t)c->seed,
                          (uint32_t)(c->seed >> 32)};
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
        p = put32(p, f[i]);
    /* A store registers a hash with one geometry, dtype included: each
     * dtype hashes apart. fp16 adds nothing, so that the sessions written
     * before there were dtypes keep their model. */
    if (c->dtype != CTXS_DTYPE_F16)
        p = put32(p, c->dtype);
    /* Likewise the schedule: none adds nothing. */
    if (c->swa_every) {
        p = put32(p, c->swa_every);
        p = put32(p, c->swa_window);
    }
    hash128(out->model_hash, buf, (size_t)(p - buf));

    static const char ttag[] = "tinychat-bytes-v1";
    uint8_t tbuf[sizeof(ttag) + 4];
    memcpy(tbuf, ttag, sizeof(ttag));
    put32(tbuf + sizeof(ttag), c->vocab);
    hash128(out->tokenizer_hash, tbuf, sizeof(tbuf));
}

uint32_t tinychat_window(uint32_t capacity, uint32_t n_sink)
{
    uint32_t ring_len = capacity > n_sink ? capacity - n_sink : 0;
    uint32_t w = (uint32_t)((uint64_t)ring_len * 3 / 4);
    return w ? w : 1;
}

void tinychat_session_options(ctxs_create_options *opts, uint32_t capacity, uint32_t window)
{
    *opts = (ctxs_create_options)CTXS_CREATE_OPTIONS_INIT;
    if (!capacity)
        capacity = 128;
    opts->capacity = capacity;
    opts->n_sink = capacity >= 32 ? 4 : capacity / 8;
    opts->ring = 1;
    opts->batch = TINYCHAT_SWA_BATCH;
    opts->open.window = window ? window : tinychat_window(capacity, opts->n_sink);
}
