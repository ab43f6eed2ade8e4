/*
 * tinychat's insides: the model's weights and scratch buffers, shared by
 * model.c (creation) and forward.c (the passes).
 */
#ifndef TINYCHAT_INTERNAL_H
#define TINYCHAT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "tinychat.h"

/* Matrices are row-major [in][out], so that y = x W walks W's rows in
 * order and every output sums its inputs in ascending index order (see
 * tc__matmul()). */
typedef struct tc__layer {
    float *attn_norm; /* [d_model] */
    float *wq;        /* [d_model][n_heads * head_dim] */
    float *wk;        /* [d_model][n_kv_heads * head_dim] */
    float *wv;        /* [d_model][n_kv_heads * head_dim] */
    float *wo;        /* [n_heads * head_dim][d_model] */
    float *ffn_norm;  /* [d_model] */
    float *w_gate;    /* [d_model][ffn] */
    float *w_up;      /* [d_model][ffn] */
    float *w_down;    /* [ffn][d_model] */
} tc__layer;

struct tinychat_model {
    tinychat_config cfg;
    uint32_t q_dim;   /* n_heads * head_dim */
    uint32_t kv_dim;  /* n_kv_heads * head_dim */
    float *weights;   /* one allocation behind every matrix */
    float *embed;     /* [vocab][d_model] */
    float *out_norm;  /* [d_model] */
    float *unembed;   /* [d_model][vocab] */
    tc__layer *layers;
    double *inv_freq; /* [head_dim / 2] rotary frequencies */

    /* Scratch for up to `rows` tokens at once. */
    uint32_t rows;
    float *x;         /* [rows][d_model] residual stream */
    float *h;         /* [rows][d_model] normed */
    float *q;         /* [rows][q_dim] */
    float *k;         /* [rows][kv_dim] */
    float *v;         /* [rows][kv_dim] */
    float *att;       /* [rows][q_dim] */
    float *o;         /* [rows][d_model] */
    float *gate;      /* [rows][ffn] */
    float *up;        /* [rows][ffn] */
    float *rope_cs;   /* [rows][head_dim]: cos, sin of each row's angles */
    float *logits;    /* [vocab] */
    uint8_t *kv_enc;  /* one head of K or V in the session's dtype */
    /* A layer's K and V of up to `rows` tokens as ctxs_session_write_layer()
     * takes them: [rows][n_kv_heads][head_dim] in the session's dtype, then
     * for Q8 the [rows][n_kv_heads] scales. */
    uint8_t *kv_k, *kv_v;
    double kv_write_s; /* seconds spent in ctxs_session_write_layer() */
};

/* Grows the scratch buffers to hold n tokens. Returns 0 or CTXS_ENOMEM. */
int tc__scratch_reserve(tinychat_model *m, uint32_t n);

#endif
