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
    uint32_t every;             /* the window pattern's period; 0: none */
    uint32_t windowed;          /* the session's window layers are rings */
    uint32_t n_layers, n_kv_heads, head_dim;
} ctxs__llama_shape;

/* The domain string of a windowed model's hash (ctxs_llama_model_init). */
#define CTXS__LLAMA_WINDOWED_DOMAIN "ctxstore-llama: window layers keep their window"

/* 1 if layer il attends to a window under a pattern of period every. */
uint32_t ctxs__llama_is_window_layer(uint32_t every, uint32_t il);

/* The shape of model's caches for a session of geometry g (whose dtype
 * gives the cache type, and whose schedule, if any, must be the model's
 * window pattern). Errors: CTXS_EINVAL with the reason recorded (a
 * geometry or schedule that is not the model's, a window pattern not
 * known). */
int ctxs__llama_shape_of(ctxs__llama_shape *out, const struct llama_model *model,
                         const ctxs_geometry *g);

#endif
