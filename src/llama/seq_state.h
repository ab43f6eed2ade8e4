/*
 * llama.cpp's sequence state (llama_state_seq_get_data / _set_data), read
 * and written. The layout, as llama.cpp 0c1e570 writes it for one sequence
 * (little-endian, packed):
 *
 *   u32 magic 0xaf143cd8, i32 seq_id
 *   then one block per KV cache (one; two for an iSWA model: the global
 *   layers' cache, then the window layers'):
 *     u32 n_stream
 *     per stream: u32 cell_count; if cell_count > 0:
 *       per cell: i32 pos, u32 n_seq_id (1 here), i32 seq_id
 *       u32 v_trans, u32 n_layer
 *       per layer: i32 k_type, u64 k_row_bytes, cell_count rows
 *       per layer: v_trans == 0: i32 v_type, u64 v_row_bytes, cell_count rows
 *                  v_trans == 1: i32 v_type, u32 v_elem_bytes, u32 n_embd_v,
 *                                n_embd_v runs of cell_count elements
 *
 * Cells appear in cache order, which need not be position order. Models
 * whose cells carry more (M-RoPE positions, token ids: llama.cpp's cell
 * "ext") add to each cell and are refused: a cell is then not 12 bytes and
 * the sizes stop adding up.
 */
#ifndef CTXS_LLAMA_SEQ_STATE_H
#define CTXS_LLAMA_SEQ_STATE_H

#include <stddef.h>
#include <stdint.h>

#define CTXS__SEQ_MAGIC 0xaf143cd8u
#define CTXS__SEQ_MAX_BLOCKS 2
#define CTXS__SEQ_MAX_LAYERS 512

/* ggml's type numbers for the cache types a session holds. */
#define CTXS__GGML_F16 1
#define CTXS__GGML_BF16 30

/* One cache block of a parsed state: where its parts lie in the buffer. */
typedef struct ctxs__seq_block {
    uint32_t n_cells;
    uint32_t n_layers;
    uint32_t v_trans;
    int32_t type;              /* ggml type of K and of V */
    size_t row_bytes;          /* one cell's K (or V) of one layer */
    const uint8_t *cells;      /* n_cells * 12 bytes: pos, n_seq_id, seq_id */
    const uint8_t *k[CTXS__SEQ_MAX_LAYERS]; /* per layer: n_cells rows */
    const uint8_t *v[CTXS__SEQ_MAX_LAYERS]; /* per layer: rows, or n_embd_v runs */
} ctxs__seq_block;

typedef struct ctxs__seq_state {
    uint32_t n_blocks;
    ctxs__seq_block block[CTXS__SEQ_MAX_BLOCKS];
} ctxs__seq_state;

/* What the layout must agree with: the model's shape. */
typedef struct ctxs__seq_shape {
    uint32_t n_blocks;                      /* 1, or 2 for iSWA */
    uint32_t n_layers[CTXS__SEQ_MAX_BLOCKS];
    size_t row_bytes;                       /* n_kv_heads * head_dim * 2 */
    int32_t type;
} ctxs__seq_shape;

/* Parses buf[0..n) against shape. Returns 0, or CTXS_EENGINE with the
 * reason in why (a static string) when the bytes are not the layout above
 * or do not agree with the shape. */
int ctxs__seq_parse(ctxs__seq_state *out, const uint8_t *buf, size_t n,
                    const ctxs__seq_shape *shape, const char **why);

/* Position of cell i of a block. */
int32_t ctxs__seq_cell_pos(const ctxs__seq_block *b, uint32_t i);

/* Bytes of a state holding n_cells[b] cells in block b (the same with V
 * transposed or not). */
size_t ctxs__seq_size(const ctxs__seq_shape *shape, const uint32_t *n_cells);

/* Writes the header and block framing for n_cells[b] cells per block at
 * positions first[b] .. first[b] + n_cells[b] - 1 into buf (of
 * ctxs__seq_size() bytes), V transposed or not as llama.cpp keeps it (the
 * two are not interchangeable), and returns in k[b][l] and v[b][l] where
 * each layer's rows (or, transposed, its n_embd_v runs of n_cells
 * elements) go, for the caller to fill. Cell i of block b holds position
 * first[b] + (i - rot[b]) mod n_cells[b]: llama.cpp puts the cells in the
 * cache in that order, so rot[b] is the cell of the first position (rot
 * NULL: 0 for every block, position order). */
void ctxs__seq_build(uint8_t *buf, const ctxs__seq_shape *shape, int32_t seq_id,
                     const uint32_t *n_cells, const int32_t *first, const uint32_t *rot,
                     uint32_t v_trans, uint8_t *(*k)[CTXS__SEQ_MAX_LAYERS],
                     uint8_t *(*v)[CTXS__SEQ_MAX_LAYERS]);

#endif
