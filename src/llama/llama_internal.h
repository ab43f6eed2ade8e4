/*
 * What the files of libctxstore_llama share: the thread's last error, and
 * the model's KV shape as llama.cpp's caches hold it.
 */
#ifndef CTXS_LLAMA_INTERNAL_H
#define CTXS_LLAMA_INTERNAL_H

#include <stdint.h>

#include "ctxstore_llama.h"
#include "seq_state.h"

struct llama_model;

/* Records why a call fails (printf-style) and returns rc. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
int ctxs__llama_fail(int rc, const char *fmt, ...);

/* Clears the thread's last error (at the start of a public call). */
void ctxs__llama_clear_error(void);

/* The model's KV as llama.cpp keeps it: its cache blocks (one, or the
 * global layers' then the window layers' for a sliding-window model), which
 * model layer each block's j-th layer is, and the window. */
typedef struct ctxs__llama_shape {
    ctxs__seq_shape seq;        /* row bytes, type, layers per block */
    uint32_t layer_of[CTXS__SEQ_MAX_BLOCKS][CTXS__SEQ_MAX_LAYERS];
    uint32_t n_swa;             /* window of the window layers; 0: none */
    uint32_t n_layers, n_kv_heads, head_dim;
} ctxs__llama_shape;

/* The shape of model's caches for a session of geometry g (whose dtype
 * gives the cache type). Errors: CTXS_EINVAL with the reason recorded (a
 * geometry that is not the model's, a window pattern not known). */
int ctxs__llama_shape_of(ctxs__llama_shape *out, const struct llama_model *model,
                         const ctxs_geometry *g);

#endif
