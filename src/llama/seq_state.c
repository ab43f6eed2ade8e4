/*
 * llama.cpp's sequence state read and written (layout in seq_state.h).
 * Every length is checked against what is left before anything is read,
 * and against the model's shape: bytes that do not add up are refused,
 * never guessed at.
 */
#include "seq_state.h"

#include <string.h>

#include "ctxstore.h"

#define CELL_BYTES 12u /* pos, n_seq_id, seq_id */

typedef struct reader {
    const uint8_t *p;
    size_t left;
    const char *why;
} reader;

static int take(reader *r, void *out, size_t n)
{
    if (r->left < n) {
        r->why = "the sequence state ends early";
        return 0;
    }
    if (out)
        memcpy(out, r->p, n);
    r->p += n;
    r->left -= n;
    return 1;
}

/* Steps over n * size bytes, returning where they start; NULL if short. */
static const uint8_t *skip(reader *r, size_t n, size_t size)
{
    const uint8_t *at = r->p;
    if (size && n > r->left / size) {
        r->why = "the sequence state ends early";
        return NULL;
    }
    r->p += n * size;
    r->left -= n * size;
    return at;
}

static int fail(reader *r, const char *why)
{
    r->why = why;
    return 0;
}

static int parse_rows(reader *r, ctxs__seq_block *b, const ctxs__seq_shape *shape, int is_v)
{
    for (uint32_t l = 0; l < b->n_layers; l++) {
        int32_t type;
        if (!take(r, &type, 4))
            return 0;
        if (type != shape->type)
            return fail(r, "a layer's cache type is not the context's");
        if (is_v && b->v_trans) {
            uint32_t elem, n_embd;
            if (!take(r, &elem, 4) || !take(r, &n_embd, 4))
                return 0;
            if (elem != 2 || (size_t)n_embd * 2 != shape->row_bytes)
                return fail(r, "a layer's V is not n_kv_heads x head_dim elements of 2 bytes");
            if (!(b->v[l] = skip(r, (size_t)n_embd * b->n_cells, 2)))
                return 0;
            continue;
        }
        uint64_t row;
        if (!take(r, &row, 8))
            return 0;
        if (row != shape->row_bytes)
            return fail(r, "a layer's rows are not n_kv_heads x head_dim elements");
        const uint8_t *at = skip(r, b->n_cells, shape->row_bytes);
        if (!at)
            return 0;
        if (is_v)
            b->v[l] = at;
        else
            b->k[l] = at;
    }
    return 1;
}

static int parse_block(reader *r, ctxs__seq_block *b, const ctxs__seq_shape *shape,
                       uint32_t n_layers)
{
    uint32_t n_stream;
    if (!take(r, &n_stream, 4))
        return 0;
    if (n_stream != 1)
        return fail(r, "the context's KV cache is not unified (kv_unified = false)");
    if (!take(r, &b->n_cells, 4))
        return 0;
    b->type = shape->type;
    b->row_bytes = shape->row_bytes;
    b->n_layers = n_layers;
    if (b->n_cells == 0)
        return 1;
    if (!(b->cells = skip(r, b->n_cells, CELL_BYTES)))
        return 0;
    for (uint32_t i = 0; i < b->n_cells; i++) {
        uint32_t n_seq;
        memcpy(&n_seq, b->cells + (size_t)i * CELL_BYTES + 4, 4);
        if (n_seq != 1)
            return fail(r, "a cell of the sequence state names more than its sequence "
                           "(cells with extra data: M-RoPE or token-id models are not supported)");
    }
    uint32_t layers;
    if (!take(r, &b->v_trans, 4) || !take(r, &layers, 4))
        return 0;
    if (b->v_trans > 1)
        return fail(r, "the sequence state's V layout flag is neither 0 nor 1");
    if (layers != n_layers)
        return fail(r, "a cache block holds another number of layers than the model's "
                       "sliding-window pattern gives");
    return parse_rows(r, b, shape, 0) && parse_rows(r, b, shape, 1);
}

int ctxs__seq_parse(ctxs__seq_state *out, const uint8_t *buf, size_t n,
                    const ctxs__seq_shape *shape, const char **why)
{
    reader r = {buf, n, NULL};
    uint32_t magic;
    int32_t seq;
    memset(out, 0, sizeof(*out));
    if (!take(&r, &magic, 4) || !take(&r, &seq, 4))
        goto bad;
    if (magic != CTXS__SEQ_MAGIC) {
        r.why = "the sequence state does not start with llama.cpp's magic";
        goto bad;
    }
    for (uint32_t b = 0; b < shape->n_blocks; b++)
        if (!parse_block(&r, &out->block[b], shape, shape->n_layers[b]))
            goto bad;
    if (r.left) {
        r.why = "the sequence state holds more than the model's cache blocks "
                "(an unknown memory type or layout)";
        goto bad;
    }
    out->n_blocks = shape->n_blocks;
    return 0;
bad:
    *why = r.why;
    return CTXS_EENGINE;
}

int32_t ctxs__seq_cell_pos(const ctxs__seq_block *b, uint32_t i)
{
    int32_t pos;
    memcpy(&pos, b->cells + (size_t)i * CELL_BYTES, 4);
    return pos;
}

size_t ctxs__seq_size(const ctxs__seq_shape *shape, const uint32_t *n_cells)
{
    size_t n = 8;
    for (uint32_t b = 0; b < shape->n_blocks; b++) {
        n += 8;
        if (n_cells[b])
            n += (size_t)n_cells[b] * CELL_BYTES + 8 +
                 2 * (size_t)shape->n_layers[b] * (12 + (size_t)n_cells[b] * shape->row_bytes);
    }
    return n;
}

static uint8_t *put(uint8_t *p, const void *v, size_t n)
{
    memcpy(p, v, n);
    return p + n;
}

void ctxs__seq_build(uint8_t *buf, const ctxs__seq_shape *shape, int32_t seq_id,
                     const uint32_t *n_cells, const int32_t *first, const uint32_t *rot,
                     uint32_t v_trans, uint8_t *(*k)[CTXS__SEQ_MAX_LAYERS],
                     uint8_t *(*v)[CTXS__SEQ_MAX_LAYERS])
{
    const uint32_t magic = CTXS__SEQ_MAGIC, one = 1, elem = 2;
    const uint32_t n_embd = (uint32_t)(shape->row_bytes / 2);
    const uint64_t row = shape->row_bytes;
    uint8_t *p = put(buf, &magic, 4);
    p = put(p, &seq_id, 4);
    for (uint32_t b = 0; b < shape->n_blocks; b++) {
        p = put(p, &one, 4); /* streams */
        p = put(p, &n_cells[b], 4);
        if (!n_cells[b])
            continue;
        const uint32_t r = rot ? rot[b] : 0;
        for (uint32_t i = 0; i < n_cells[b]; i++) {
            const int32_t pos = first[b] + (int32_t)((i + n_cells[b] - r) % n_cells[b]);
            p = put(p, &pos, 4);
            p = put(p, &one, 4);
            p = put(p, &seq_id, 4);
        }
        p = put(p, &v_trans, 4);
        p = put(p, &shape->n_layers[b], 4);
        for (int kind = 0; kind < 2; kind++) {
            for (uint32_t l = 0; l < shape->n_layers[b]; l++) {
                p = put(p, &shape->type, 4);
                if (kind && v_trans) {
                    p = put(p, &elem, 4);
                    p = put(p, &n_embd, 4);
                } else {
                    p = put(p, &row, 8);
                }
                (kind ? v : k)[b][l] = p;
                p += (size_t)n_cells[b] * row;
            }
        }
    }
}
