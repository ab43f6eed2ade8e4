/*
 * A GGUF model's identity for ctxstore (geometry, weights and tokenizer
 * hashes) and the shape of its KV caches in llama.cpp, from llama.cpp's
 * public model API and the GGUF's metadata.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llama.h>

#include "llama_internal.h"

_Static_assert(GGML_TYPE_F16 == CTXS__GGML_F16 && GGML_TYPE_BF16 == CTXS__GGML_BF16,
               "ggml's type numbers as seq_state.h states them");

/* The adapter's failures are said through the library's last error
 * (ctxs_get_last_error()), so that an app reads one reason whichever
 * library refused. */
int ctxs__llama_fail(int rc, const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    return ctxs_set_last_error(rc, "%s", text);
}

void ctxs__llama_clear_error(void)
{
    ctxs_set_last_error(0, NULL);
}

/* The integer value of the GGUF key "<arch>.<suffix>"; -1 if absent or not
 * a non-negative integer. */
static long arch_key(const struct llama_model *model, const char *suffix)
{
    char arch[64], key[160], val[64];
    if (llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch) < 0)
        return -1;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (llama_model_meta_val_str(model, key, val, sizeof val) < 0)
        return -1;
    char *end;
    errno = 0;
    long v = strtol(val, &end, 10);
    return errno || end == val || *end || v < 0 ? -1 : v;
}

/* llama.cpp's default sliding-window pattern of the architectures whose
 * GGUFs may leave it out: every n-th layer, the last of each group of n, is
 * global (llama.cpp's set_swa_pattern(n), dense_first = false). */
static const struct {
    const char *arch;
    uint32_t every;
} k_swa_defaults[] = {
    {"gemma2", 2}, {"gemma3", 6}, {"cohere2", 4}, {"gpt-oss", 2}, {"exaone4", 4}, {"olmo2", 4},
};

static int window_pattern(uint32_t *every, const struct llama_model *model)
{
    long n = arch_key(model, "attention.sliding_window_pattern");
    if (n > 0) {
        *every = (uint32_t)n;
        return 0;
    }
    char arch[64] = "";
    llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch);
    for (size_t i = 0; i < sizeof k_swa_defaults / sizeof k_swa_defaults[0]; i++) {
        if (!strcmp(arch, k_swa_defaults[i].arch)) {
            *every = k_swa_defaults[i].every;
            return 0;
        }
    }
    return ctxs__llama_fail(CTXS_EINVAL,
                            "%s has sliding-window layers but neither its GGUF "
                            "(%s.attention.sliding_window_pattern as a number) nor this adapter "
                            "says which layers they are",
                            arch, arch);
}

/* K and V head dims as the GGUF states them, else n_embd / n_head. */
static int head_dims(uint32_t *k_dim, uint32_t *v_dim, const struct llama_model *model)
{
    const int32_t n_head = llama_model_n_head(model), n_embd = llama_model_n_embd(model);
    long k = arch_key(model, "attention.key_length"), v = arch_key(model, "attention.value_length");
    if (k <= 0)
        k = n_head > 0 ? n_embd / n_head : 0;
    if (v <= 0)
        v = k;
    if (k <= 0 || k > 4096 || v <= 0 || v > 4096)
        return ctxs__llama_fail(CTXS_EINVAL, "the model's head dims are not known (%ld, %ld)", k, v);
    *k_dim = (uint32_t)k;
    *v_dim = (uint32_t)v;
    return 0;
}

static int dtype_of(uint32_t *out, int type_k, int type_v)
{
    if (type_k != type_v)
        return ctxs__llama_fail(CTXS_EINVAL,
                                "the context keeps K as %s and V as %s: a session holds both in "
                                "one type (f16 or bf16)",
                                ggml_type_name(type_k), ggml_type_name(type_v));
    if (type_k == GGML_TYPE_F16)
        *out = CTXS_DTYPE_F16;
    else if (type_k == GGML_TYPE_BF16)
        *out = CTXS_DTYPE_BF16;
    else
        return ctxs__llama_fail(CTXS_EINVAL,
                                "the context's cache type is %s: a session holds f16 or bf16 "
                                "caches bit for bit; llama.cpp's quantized blocks have no "
                                "session form (create the context with type_k = type_v = "
                                "GGML_TYPE_F16)",
                                ggml_type_name(type_k));
    return 0;
}

/* Hash of the vocabulary: every token's text in id order, with its type
 * attributes folded in as a prefix byte so that a control token and a
 * normal token of the same text differ. */
static int tokenizer_hash(uint8_t out[CTXS_HASH_BYTES], const struct llama_model *model)
{
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const int32_t n = llama_vocab_n_tokens(vocab);
    if (n <= 0)
        return ctxs__llama_fail(CTXS_EINVAL, "the model has no vocabulary");
    char **texts = calloc((size_t)n, sizeof *texts);
    size_t *lengths = calloc((size_t)n, sizeof *lengths);
    int rc = CTXS_ENOMEM;
    if (!texts || !lengths)
        goto done;
    for (int32_t i = 0; i < n; i++) {
        const char *t = llama_vocab_get_text(vocab, i);
        size_t len = t ? strlen(t) : 0;
        if (!(texts[i] = malloc(len + 5)))
            goto done;
        uint32_t attr = (uint32_t)llama_vocab_get_attr(vocab, i);
        memcpy(texts[i], &attr, 4);
        memcpy(texts[i] + 4, t ? t : "", len);
        lengths[i] = len + 4;
    }
    rc = ctxs_tokenizer_hash_strings(out, (const char *const *)texts, lengths, (size_t)n);
done:
    for (int32_t i = 0; texts && i < n; i++)
        free(texts[i]);
    free(texts);
    free(lengths);
    return rc == CTXS_ENOMEM ? ctxs__llama_fail(rc, "out of memory hashing the vocabulary") : rc;
}

/* The schedule of a context whose window layers keep only their window
 * (swa_full = false), and a model hash of its own: the store keys models by
 * their hash, and one GGUF under two schedules is two models, whose
 * sessions are not each other's. The hash is that of the strings
 * CTXS__LLAMA_WINDOWED_DOMAIN, the weights' hash and the schedule (u32
 * period, u32 window[8], little-endian). */
static int windowed_identity(ctxs_model *m, const ctxs__llama_shape *shape)
{
    if (shape->every > CTXS_SCHEDULE_MAX)
        return ctxs__llama_fail(CTXS_EINVAL,
                                "the model's window layers repeat every %u layers; a session's "
                                "schedule holds at most %u (create the context with swa_full = "
                                "true to keep every position)",
                                shape->every, CTXS_SCHEDULE_MAX);
    m->geometry.period = shape->every;
    for (uint32_t j = 0; j < shape->every; j++)
        m->geometry.window[j] = ctxs__llama_is_window_layer(shape->every, j) ? shape->n_swa : 0;
    uint8_t sched[4 * (1 + CTXS_SCHEDULE_MAX)];
    memcpy(sched, &m->geometry.period, 4);
    memcpy(sched + 4, m->geometry.window, 4 * CTXS_SCHEDULE_MAX);
    const char *parts[3] = {CTXS__LLAMA_WINDOWED_DOMAIN, (const char *)m->model_hash,
                            (const char *)sched};
    const size_t lengths[3] = {strlen(CTXS__LLAMA_WINDOWED_DOMAIN), CTXS_HASH_BYTES, sizeof sched};
    uint8_t h[CTXS_HASH_BYTES];
    int rc = ctxs_tokenizer_hash_strings(h, parts, lengths, 3);
    if (rc < 0)
        return ctxs__llama_fail(rc, "hashing the model's schedule: %s", ctxs_strerror(rc));
    memcpy(m->model_hash, h, CTXS_HASH_BYTES);
    return 0;
}

int ctxs_llama_model_init(ctxs_model *out, ctxs_store *st, const char *gguf_path,
                          const struct llama_model *model,
                          const struct llama_context_params *cparams)
{
    ctxs__llama_clear_error();
    if (!out || !gguf_path || !model || !cparams)
        return ctxs__llama_fail(CTXS_EINVAL, "ctxs_llama_model_init: a NULL argument");
    memset(out, 0, sizeof(*out));
    uint32_t k_dim = 0, v_dim = 0, dtype = 0;
    int rc;
    if ((rc = head_dims(&k_dim, &v_dim, model)) < 0 ||
        (rc = dtype_of(&dtype, cparams->type_k, cparams->type_v)) < 0)
        return rc;
    if (k_dim != v_dim)
        return ctxs__llama_fail(CTXS_EINVAL,
                                "the model's K heads have %u elements and its V heads %u: a "
                                "session's K and V share one head dim",
                                k_dim, v_dim);
    const int32_t n_layer = llama_model_n_layer(model), n_head_kv = llama_model_n_head_kv(model);
    if (n_layer <= 0 || n_layer > CTXS__SEQ_MAX_LAYERS || n_head_kv <= 0 || n_head_kv > 4096)
        return ctxs__llama_fail(CTXS_EINVAL, "the model has %d layers of %d KV heads", n_layer,
                                n_head_kv);
    out->geometry = (ctxs_geometry){(uint32_t)n_layer, (uint32_t)n_head_kv, k_dim, dtype, 0, {0}};
    ctxs__llama_shape shape;
    if ((rc = ctxs__llama_shape_of(&shape, model, &out->geometry)) < 0)
        return rc;
    if ((rc = ctxs_model_hash_file(out->model_hash, st, gguf_path)) < 0)
        return ctxs__llama_fail(rc, "hashing %s: %s", gguf_path, ctxs_strerror(rc));
    /* The session keeps what the context keeps: llama.cpp's window layers
     * keep every position with swa_full, and their window otherwise. */
    if (shape.n_swa && !cparams->swa_full && (rc = windowed_identity(out, &shape)) < 0)
        return rc;
    return tokenizer_hash(out->tokenizer_hash, model);
}

int ctxs__llama_shape_of(ctxs__llama_shape *out, const struct llama_model *model,
                         const ctxs_geometry *g)
{
    memset(out, 0, sizeof(*out));
    uint32_t k_dim = 0, v_dim = 0;
    int rc = head_dims(&k_dim, &v_dim, model);
    if (rc < 0)
        return rc;
    if (g->n_layers != (uint32_t)llama_model_n_layer(model) ||
        g->n_kv_heads != (uint32_t)llama_model_n_head_kv(model) || g->head_dim != k_dim)
        return ctxs__llama_fail(CTXS_EINVAL,
                                "the session's geometry (%u layers x %u KV heads x %u) is not "
                                "the model's (%d x %d x %u)",
                                g->n_layers, g->n_kv_heads, g->head_dim, llama_model_n_layer(model),
                                llama_model_n_head_kv(model), k_dim);
    if (g->dtype != CTXS_DTYPE_F16 && g->dtype != CTXS_DTYPE_BF16)
        return ctxs__llama_fail(CTXS_EINVAL, "a session for llama.cpp holds f16 or bf16");
    out->n_layers = g->n_layers;
    out->n_kv_heads = g->n_kv_heads;
    out->head_dim = g->head_dim;
    out->seq.type = g->dtype == CTXS_DTYPE_F16 ? CTXS__GGML_F16 : CTXS__GGML_BF16;
    out->seq.row_bytes = (size_t)g->n_kv_heads * g->head_dim * 2;
    const int32_t n_swa = llama_model_n_swa(model);
    if (n_swa <= 0 && g->period != 0)
        return ctxs__llama_fail(CTXS_EINVAL, "the session has window layers; the model has none");
    if (n_swa <= 0) {
        out->seq.n_blocks = 1;
        out->seq.n_layers[0] = g->n_layers;
        for (uint32_t il = 0; il < g->n_layers; il++)
            out->layer_of[0][il] = il;
        return 0;
    }
    uint32_t every = 0;
    if ((rc = window_pattern(&every, model)) < 0)
        return rc;
    out->n_swa = (uint32_t)n_swa;
    out->every = every;
    out->seq.n_blocks = 2;
    for (uint32_t il = 0; il < g->n_layers; il++) {
        const uint32_t b = ctxs__llama_is_window_layer(every, il);
        out->layer_of[b][out->seq.n_layers[b]++] = il;
    }
    if (g->period == 0)
        return 0;
    /* A session of windowed layers: its schedule must be the model's. */
    for (uint32_t il = 0; il < g->n_layers; il++) {
        const uint32_t want = ctxs__llama_is_window_layer(every, il) ? out->n_swa : 0;
        if (ctxs_geometry_get_window(g, il) != want)
            return ctxs__llama_fail(CTXS_EINVAL,
                                    "the session's layer schedule gives layer %u a window of %u; "
                                    "the model's, %u",
                                    il, ctxs_geometry_get_window(g, il), want);
    }
    out->windowed = 1;
    return 0;
}

int ctxs_llama_attention_windows(ctxs_open_options *opts, const struct llama_context *ctx)
{
    ctxs__llama_clear_error();
    if (!opts || !ctx)
        return ctxs__llama_fail(CTXS_EINVAL, "ctxs_llama_attention_windows: a NULL argument");
    if (opts->version != CTXS_OPEN_OPTIONS_VERSION)
        return ctxs__llama_fail(CTXS_EINVAL,
                                "open options of version %u have no attention windows (version "
                                "%u has): start from CTXS_OPEN_OPTIONS_INIT",
                                opts->version, CTXS_OPEN_OPTIONS_VERSION);
    opts->attn_period = opts->attn_window = opts->attn_global_mask = 0;
    const struct llama_model *model = llama_get_model(ctx);
    const int32_t n_swa = llama_model_n_swa(model);
    if (n_swa <= 0 || n_swa > (1 << 24))
        return 0;
    uint32_t every = 0;
    int rc = window_pattern(&every, model);
    if (rc < 0)
        return rc;
    if (every == 0 || every > CTXS_SCHEDULE_MAX)
        return 0;
    uint32_t global = 0;
    for (uint32_t j = 0; j < every; j++)
        if (!ctxs__llama_is_window_layer(every, j))
            global |= 1u << j;
    opts->attn_period = every;
    opts->attn_window = (uint32_t)n_swa;
    opts->attn_global_mask = global;
    return 0;
}

uint32_t ctxs__llama_is_window_layer(uint32_t every, uint32_t il)
{
    /* The last layer of each group of `every` is global (llama.cpp's
     * set_swa_pattern(every), dense_first = false). */
    return every == 1 || il % every < every - 1;
}
