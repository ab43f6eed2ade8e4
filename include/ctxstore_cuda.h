/*
 * ctxstore_cuda — attention on NVIDIA GPUs over a session's KV cache, read
 * where it lies. A library of its own (libctxstore_cuda, pkg-config
 * ctxstore-cuda), so that the core library never links a GPU runtime.
 *
 * A session is attached to a device in one of two modes:
 *
 * - CTXS_CUDA_MAPPED: the kernel reads the session's mapping itself. On a
 *   coherent system whose GPU walks the host's page tables (Grace Hopper:
 *   ATS over NVLink-C2C) nothing is copied, pinned or registered, and the
 *   GPU may also write K/V into the mapping. On a discrete GPU (PCIe or
 *   NVLink to an x86 host) the KV region is registered with
 *   cudaHostRegister(), read-only: the whole region, every slot of the
 *   capacity, becomes resident and page-locked (see the Caveats), and every
 *   attention pass reads K/V across the bus.
 * - CTXS_CUDA_MIRROR: a copy of the KV region lives in device memory. The
 *   held tokens are copied to it at attach (a resume), new tokens written on
 *   the host are pushed, tokens written on the device are pulled back into
 *   the mapping before the commit: only new tokens cross the bus.
 *
 * Every session dtype is read in place: F16, BF16 and Q8. A Q8 session's
 * scale table (ctxs_layout.scales, whole pages right before the KV region
 * in the mapping) goes wherever its KV goes: registered with it, mirrored
 * with it, and pushed and pulled with the tokens' K/V.
 *
 * Usage, decode with a mirror (K/V computed on the device):
 *
 *     ctxs_cuda_kv *kv;
 *     ctxs_cuda_attach(&kv, s, CTXS_CUDA_MIRROR, 0);   // copies held tokens
 *     ctxs_layout dl;
 *     ctxs_cuda_get_layout(&dl, kv);                       // dl.kv: device memory
 *     for (;;) {
 *         ctxs_reservation r;
 *         ctxs_session_reserve(&r, s, 1);
 *         // the engine's kernels write the token's K/V at dl, slot
 *         // r.spans[0].slot of every (layer, K|V, head) run, on stream
 *         ctxs_attn_plan plan;
 *         ctxs_session_get_attn_plan(&plan, s, 1);
 *         for (uint32_t l = 0; l < n_layers; l++)
 *             ctxs_cuda_attention(d_out, kv, &plan, l, &query, stream);
 *         ctxs_cuda_pull(kv, &r, 0, 1, stream);         // device -> mapping
 *         ctxs_session_commit(s, &token_id, 1);
 *     }
 *     ctxs_cuda_detach(kv);                            // before closing s
 *     ctxs_session_close(s);
 *
 * An engine that writes K/V on the host (ctxs_session_write_token) calls
 * ctxs_cuda_push() instead of pull, before the attention reads them.
 *
 * Caveats:
 *
 * - Detach before closing the session: the handle points into its mapping.
 *   A ctxs_cuda_kv is used by one thread at a time, like its session;
 *   ctxs_cuda_attention() alone may run from several threads at once on one
 *   handle. Calls make kv's device current for their duration and restore
 *   the caller's current device before they return.
 * - Streams are cudaStream_t passed as void *; NULL is the legacy default
 *   stream. Work is queued on the stream and the call returns; the
 *   exceptions (attach, detach, pull) say so.
 * - Mapped mode on a discrete GPU pins kv_bytes (plus scales_bytes for Q8)
 *   of host memory (the file's page-cache pages, holes included: a sparse
 *   32k-token fp16 Qwen3-4B session pins 4.5 GiB) for as long as the handle
 *   lives. Registration faults the
 *   pages in read-only, so holes get zero-filled page-cache pages but no
 *   disk blocks, and nothing is dirtied; the CPU's later writes through the
 *   mapping land in the same pinned pages, which the GPU then reads. Memory
 *   pressure (ctxs_set_pressure) still unmaps the pages outside the window
 *   from the process, but pinned pages are not freed until detach. A
 *   registered region can be registered once: a second MAPPED attach of the
 *   same session fails with -EBUSY.
 * - Mapped mode on a discrete GPU is read-only for the device: engines that
 *   write K/V on the GPU use the mirror, or a coherent system
 *   (CTXS_CUDA_WRITABLE in ctxs_cuda_info).
 * - The mirror holds kv_bytes (plus scales_bytes for Q8) of device memory. It is as fresh as the last
 *   attach, push, pull or resync: after the session changes under it
 *   (rollback, checkpoint restore, refresh of a read-only session following
 *   a writer), call ctxs_cuda_resync() before the next attention.
 * - CUDA errors that have no better code are CTXS_EDEVICE, and
 *   ctxs_cuda_get_last_error() names them. After a sticky error (an illegal
 *   address) the CUDA context is unusable; only detach is safe.
 * - The library links the CUDA runtime statically (its symbols are not
 *   exported), so an application may use its own runtime alongside: device
 *   pointers and streams are the driver's and valid in both.
 */
#ifndef CTXSTORE_CUDA_H
#define CTXSTORE_CUDA_H

#include "ctxstore.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The largest head_dim ctxs_cuda_attention() supports. */
#define CTXS_CUDA_MAX_HEAD_DIM 256

typedef struct ctxs_cuda_kv ctxs_cuda_kv;

enum {
    CTXS_CUDA_MAPPED = 1, /* the kernel reads the session's mapping */
    CTXS_CUDA_MIRROR = 2, /* a copy of the KV region in device memory */
};

/* The number of CUDA devices (at least 1), or CTXS_ENODEVICE when there is
 * none or no usable driver (ctxs_cuda_get_last_error() says which). Thread-safe. */
CTXS_API int ctxs_cuda_get_device_count(void);

/* The CUDA error behind the last call of this thread that failed on one,
 * as "cudaErrorName: description", or "no CUDA error". The text lives in a
 * buffer of the thread, valid until its next call of this function.
 * Thread-safe (the error is per thread). */
CTXS_API const char *ctxs_cuda_get_last_error(void);

/* Attaches session s to CUDA device `device` (-1: the calling thread's
 * current device) in mode CTXS_CUDA_MAPPED or CTXS_CUDA_MIRROR.
 *
 * MAPPED: where the device reads pageable memory through the host's page
 * tables (cudaDevAttrPageableMemoryAccessUsesHostPageTables), the mapping is
 * used as it is, in O(1). Elsewhere the KV region, and for Q8 the scale
 * table right before it, are registered as one range with
 * cudaHostRegister(cudaHostRegisterMapped | cudaHostRegisterReadOnly), which
 * faults in and pins every page of it: O(capacity) time and kv_bytes +
 * scales_bytes of page-locked memory (see the Caveats). The device must
 * support mapped and read-only registration (-ENOTSUP otherwise).
 * MIRROR: allocates kv_bytes + scales_bytes of device memory and copies the
 * held tokens (all of them, not only the window), with their scales, into
 * it, in one strided copy per slot span (two for Q8): O(held tokens).
 * Reserved tokens not yet committed are not copied; push them.
 *
 * Attach completes before it returns (no stream). s may be read-only. The
 * handle holds s: keep s open until ctxs_cuda_detach(), and use them from
 * one thread at a time.
 *
 * Errors: CTXS_EINVAL (NULL, unknown mode, device out of range),
 * CTXS_ENODEVICE (no device or driver), CTXS_ENOMEM (host or device memory),
 * -EBUSY (the region is already registered, by another MAPPED handle),
 * -ENOTSUP (the device cannot map host memory read-only), CTXS_EDEVICE
 * (another CUDA error). *out is NULL on failure. */
CTXS_API int ctxs_cuda_attach(ctxs_cuda_kv **out, ctxs_session *s, int mode,
                              int device);

/* Waits for the device, unregisters or frees what attach took and releases
 * the handle. Accepts NULL. */
CTXS_API void ctxs_cuda_detach(ctxs_cuda_kv *kv);

#define CTXS_CUDA_WRITABLE 0x1u         /* kernels may write K/V through
                                           ctxs_cuda_get_layout()'s kv */
#define CTXS_CUDA_PINNED 0x2u           /* the KV region is page-locked with
                                           cudaHostRegister (mapped mode on a
                                           discrete GPU) */
#define CTXS_CUDA_HOST_PAGE_TABLES 0x4u /* the device reads the mapping
                                           through the host's page tables
                                           (coherent: Grace Hopper) */

typedef struct ctxs_cuda_info {
    int32_t mode;          /* CTXS_CUDA_MAPPED or CTXS_CUDA_MIRROR */
    int32_t device;        /* the CUDA device */
    uint32_t flags;        /* CTXS_CUDA_* above */
    uint32_t reserved_;
    uint64_t device_bytes; /* device memory the handle holds (the mirror:
                              KV region and scale table) */
    uint64_t pinned_bytes; /* host memory the handle keeps page-locked
                              (KV region and scale table) */
} ctxs_cuda_info;

/* Fills *out. Errors: CTXS_EINVAL. */
CTXS_API int ctxs_cuda_get_info(ctxs_cuda_info *out, const ctxs_cuda_kv *kv);

/* The session's layout with kv, and for Q8 scales, replaced by the device
 * addresses of the KV region and the scale table: the mirror, the
 * registered mapping's device alias, or the mapping itself on a coherent
 * system. token_ids stays a host pointer. Device kernels may write K/V (and
 * scales) at these addresses only when the handle is CTXS_CUDA_WRITABLE,
 * and only into reserved slots. Valid until detach. Errors: CTXS_EINVAL. */
CTXS_API int ctxs_cuda_get_layout(ctxs_layout *out, const ctxs_cuda_kv *kv);

/* Copies tokens first .. first + n - 1 of reservation r (written into the
 * mapping on the host) to the mirror, on stream: one strided copy of every
 * (layer, K|V, head) run per slot span they occupy, and for Q8 one of their
 * scales. The host bytes are
 * read before the call returns; the copy completes on the stream, before
 * later work on it (an attention) runs. Nothing to do in mapped mode,
 * where the device reads the mapping (0 is returned). r is a reservation
 * of kv's session, not yet committed.
 * Errors: CTXS_EINVAL (NULL, n == 0, tokens outside r, spans outside the
 * capacity), CTXS_ENODEVICE, CTXS_EDEVICE. */
CTXS_API int ctxs_cuda_push(ctxs_cuda_kv *kv, const ctxs_reservation *r,
                            uint32_t first, uint32_t n, void *stream);

/* Copies tokens first .. first + n - 1 of reservation r, written on the
 * device (through ctxs_cuda_get_layout(); for Q8 their scales too), from
 * the mirror into the mapping,
 * after the work already queued on stream, and waits for the stream: on
 * return the bytes are in the mapping and ctxs_session_commit() may
 * checksum them. In mapped mode there is nothing to copy; the stream is
 * waited for, so that device writes (coherent systems) are done.
 * Errors: CTXS_EINVAL (as push), CTXS_EREADONLY (s is read-only; mirror),
 * CTXS_ENODEVICE, CTXS_EDEVICE (including an error of earlier work on the
 * stream). */
CTXS_API int ctxs_cuda_pull(ctxs_cuda_kv *kv, const ctxs_reservation *r,
                            uint32_t first, uint32_t n, void *stream);

/* Copies every held token to the mirror again, as attach does, on stream:
 * after a rollback, a checkpoint restore or a refresh changed what the
 * session holds. The host bytes are read before it returns. Nothing to do
 * in mapped mode (0). Errors: CTXS_EINVAL, CTXS_ENODEVICE, CTXS_EDEVICE. */
CTXS_API int ctxs_cuda_resync(ctxs_cuda_kv *kv, void *stream);

/* Attention of one layer on kv's device, queued on stream: the contract of
 * ctxs_attention() (which keys each query reads, the GQA mapping, the
 * scale, a stable softmax in float32, every session dtype), with q->q and
 * out in memory the device can address (device memory, managed memory, or
 * mapped pinned host memory), both [n][n_heads][head_dim] float32 and not
 * overlapping. The plan is read before the call returns.
 *
 * K and V are read as they are stored and widened to float32 in the
 * kernel (fp16 and bf16 exactly; Q8 as its int8 values, each key's score
 * multiplied by its K scale, each value row's weight by its V scale).
 *
 * The kernel is split-K "flash decoding": the keys are cut into chunks of
 * 128 positions, aligned on positions; each block reads a 32-key tile of
 * one KV head into shared memory once for all the query heads of its GQA
 * group, and keeps a running max and sum (online softmax); partial results
 * of the chunks are merged in position order, in the block when there are
 * enough queries to fill the device, else by a second kernel. The float
 * operations and their order depend only on the keys a query reads and
 * their positions, so that, as on the CPU, the result does not depend on n
 * nor on how the plan splits into spans: a token recomputed after a resume
 * gets bit-identical output on the same device. The results agree with
 * the CPU kernel's to float32 rounding (the order of the sums and exp()
 * differ), not bit for bit.
 *
 * Errors: CTXS_EINVAL (those of ctxs_attention(), and a head_dim above
 * CTXS_CUDA_MAX_HEAD_DIM), CTXS_ENODEVICE, CTXS_ENOMEM (device memory for
 * the split-K partial results), CTXS_EDEVICE (a launch failed). Errors of
 * the kernel itself (a bad pointer) surface at the next synchronization.
 * Thread-safe. */
CTXS_API int ctxs_cuda_attention(float *out, const ctxs_cuda_kv *kv,
                                 const ctxs_attn_plan *plan, uint32_t layer,
                                 const ctxs_attn_query *q, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* CTXSTORE_CUDA_H */
