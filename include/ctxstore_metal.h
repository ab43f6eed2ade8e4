/*
 * ctxstore_metal — decode attention on an Apple GPU, reading K and V from
 * the session's mapping without a copy.
 *
 * The KV region of a session is 16 KiB aligned and a whole number of 16 KiB
 * pages, so that Metal can wrap it as it is: ctxs_metal_attach() makes one
 * MTLBuffer over it with newBufferWithBytesNoCopy (shared storage; on Apple
 * silicon the CPU and the GPU read the same memory). The engine keeps
 * writing new tokens into the mapping as usual; ctxs_metal_attention() runs
 * a kernel with the semantics of ctxs_attention() (ctxstore.h) on it.
 *
 * Every session dtype is read in place: F16, BF16 and Q8. A Q8 session's
 * scale table (ctxs_layout.scales) is 16 KiB aligned whole pages too, and
 * gets a no-copy buffer of its own beside the KV region's.
 *
 * Usage (Objective-C, ARC):
 *
 *     ctxs_metal_kv *mkv;
 *     rc = ctxs_metal_attach(&mkv, s, (__bridge void *)device); // or NULL
 *     ...
 *     ctxs_attn_plan plan;
 *     ctxs_session_get_attn_plan(&plan, s, n_pending);
 *     for (uint32_t layer = 0; layer < n_layers; layer++)
 *         ctxs_metal_attention((__bridge void *)out_buf, mkv,
 *                              (__bridge void *)q_buf, &plan, layer, &q,
 *                              (__bridge void *)command_buffer);
 *     [command_buffer commit];
 *     ...
 *     ctxs_metal_detach(mkv);   // before ctxs_session_close(s)
 *
 * Objective-C objects cross this C interface as void *: pass them with
 * (__bridge void *) and take ctxs_metal_get_buffer()'s result back with
 * (__bridge id<MTLBuffer>). No reference is transferred either way.
 *
 * Caveats:
 *
 * - The buffer aliases the mapping. Detach, and let every command buffer
 *   that reads it complete, before ctxs_session_close(): a GPU read of an
 *   unmapped region is a GPU fault.
 * - Slots that the ring or a rollback lets the writer rewrite may be
 *   rewritten while a command buffer reads them; a plan is valid until the
 *   next reserve, commit, rollback or refresh (ctxs_session_get_attn_plan()),
 *   and that includes the time the GPU takes to run it.
 * - The kernel's source is compiled by Metal at attach (tens of
 *   milliseconds); attach once per session, not per pass.
 * - Results agree with ctxs_attention() to float rounding, not bit for bit
 *   (another order of additions, another exp()).
 * - Not yet known: whether Metal faults in and wires the whole region
 *   (every slot of the capacity, as CUDA registration does) while the
 *   buffer is in use, and whether it does so for writing, which in a
 *   sparse session file would dirty the pages of its holes. The mapping is
 *   writable for a read-write session; attach a read-only handle where
 *   the GPU only reads.
 * - Needs a GPU with SIMD-group reductions: Apple7 (A14, M1) or later, or
 *   the Mac2 family. Not yet built or run on Apple hardware: see
 *   src/gpu/metal/README.md.
 */
#ifndef CTXSTORE_METAL_H
#define CTXSTORE_METAL_H

#include "ctxstore.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A session's KV region wrapped as one MTLBuffer (and a Q8 session's scale
 * table as another), the compiled kernel and a command queue of its own. */
typedef struct ctxs_metal_kv ctxs_metal_kv;

/* Wraps the KV region of session s (ctxs_session_get_layout()) in a no-copy
 * MTLBuffer on mtl_device (an id<MTLDevice>; NULL for the system default),
 * and for CTXS_DTYPE_Q8 its scale table in another, and compiles the
 * session dtype's kernel. s may be read-only. The handle keeps a copy of
 * the layout and does not use s again; it is valid until
 * ctxs_metal_detach(), which must come before ctxs_session_close(s).
 *
 * Errors: CTXS_EINVAL (NULL out or s, the region or a Q8 scale table not
 * aligned to or not a whole number of the system's pages, or missing, a
 * dtype other than F16, BF16 and Q8, or a region larger than the device's
 * maxBufferLength), CTXS_ENODEVICE (no Metal
 * device, a GPU without SIMD-group reductions, or the kernel did not
 * compile: set CTXS_METAL_DEBUG=1 in the environment to have the reason
 * printed on stderr), CTXS_ENOMEM (Metal refused the buffer or the queue).
 * *out is NULL on failure. Thread-safe. */
CTXS_API int ctxs_metal_attach(ctxs_metal_kv **out, ctxs_session *s,
                               void *mtl_device);

/* As ctxs_metal_attach(), for a layout given by the caller: a session's, or
 * a copy whose kv (and for Q8 scales) point at other page-aligned memory
 * holding the same bytes (anonymous memory, a snapshot), which must stay
 * mapped until ctxs_metal_detach(). Errors: as ctxs_metal_attach(). */
CTXS_API int ctxs_metal_attach_layout(ctxs_metal_kv **out,
                                      const ctxs_layout *kv,
                                      void *mtl_device);

/* The id<MTLBuffer> over the KV region (its contents are the layout's kv),
 * for engines that bind it in kernels of their own; byte offsets inside it
 * are those of ctxs_layout. Not retained for the caller: valid until
 * ctxs_metal_detach(). NULL for NULL. Thread-safe. */
CTXS_API void *ctxs_metal_get_buffer(const ctxs_metal_kv *kv);

/* The id<MTLBuffer> over a Q8 session's scale table (its contents are the
 * layout's scales; the scale of (layer, kind, head, slot) is float number
 * ((layer*2 + kind)*n_kv_heads + head)*capacity + slot), or NULL for the
 * other dtypes and for NULL. Not retained for the caller: valid until
 * ctxs_metal_detach(). Thread-safe. */
CTXS_API void *ctxs_metal_get_scales_buffer(const ctxs_metal_kv *kv);

/* Attention of one layer on the GPU, with the semantics of
 * ctxs_attention(): query i, at position p = q->pos + i, reads the plan's
 * keys at positions up to p that are sinks or among the last plan->window
 * positions up to p; query head h reads KV head h / (n_heads / n_kv_heads);
 * scores are scaled by q->scale (0: 1 / sqrt(head_dim)); softmax in
 * float32, stable (max subtracted); float32 accumulation. A query that
 * reads no key (only a plan built by hand allows it) gets zeros. K and V
 * are read as stored and widened to float32 (fp16 and bf16 exactly; Q8 as
 * its int8 values, a key's score times its K scale, a value row's weight
 * times its V scale).
 *
 * out_buffer (id<MTLBuffer>) receives [n][n_heads][head_dim] float32 from
 * its offset 0. q_buffer (id<MTLBuffer>) holds the queries in the same
 * layout from its offset 0, and q->q is not read; or q_buffer is NULL and
 * q->q is copied into a new buffer (only with command_buffer NULL). The
 * two buffers must be different and at least n * n_heads * head_dim * 4
 * bytes long.
 *
 * command_buffer (id<MTLCommandBuffer>): the pass is encoded into it (one
 * compute encoder, ended before this returns), and the caller commits it;
 * the buffers, the handle and the plan's slots must stay as they are until
 * it completes. NULL: a command buffer is made on the handle's queue,
 * committed and waited for, and out_buffer holds the result on return.
 *
 * Errors: CTXS_EINVAL (what ctxs_attention() refuses: NULL, layer out of
 * range, n == 0, n_heads not a multiple of the KV heads, queries outside
 * [first_query, n_tokens), a plan outside the capacity or not in ascending
 * positions; and buffers too short, the same buffer twice, q_buffer NULL
 * with a command_buffer; or a head_dim whose scratch does not fit in the
 * device's threadgroup memory), CTXS_ENOMEM (Metal refused a buffer,
 * command buffer or encoder), -EIO (the command buffer failed on the GPU;
 * CTXS_METAL_DEBUG=1 prints its error). Thread-safe, as ctxs_attention(),
 * for different command buffers. */
CTXS_API int ctxs_metal_attention(void *out_buffer, ctxs_metal_kv *kv,
                                  void *q_buffer, const ctxs_attn_plan *plan,
                                  uint32_t layer, const ctxs_attn_query *q,
                                  void *command_buffer);

/* Releases the buffers (the mapping itself is untouched: they have no
 * deallocator), the kernel and the queue. Every command buffer that reads
 * the buffer must have completed. Accepts NULL. */
CTXS_API void ctxs_metal_detach(ctxs_metal_kv *kv);

#ifdef __cplusplus
}
#endif

#endif /* CTXSTORE_METAL_H */
