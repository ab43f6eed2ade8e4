/*
 * A session attached to a CUDA device: the mapping registered for the
 * device to read (mapped mode), or a copy of the KV region in device memory
 * that follows the session token by token (mirror mode).
 *
 * The KV region is [layers][2][kv_heads][capacity][head_dim]: one run of
 * `capacity` slots per (layer, K|V, head), every run head_stride bytes
 * after the previous. A range of slots is therefore the same column of
 * every run, and one strided copy (cudaMemcpy2DAsync: width = the slots'
 * bytes, height = the number of runs, pitch = head_stride) moves it for all
 * layers and heads at once, in both directions.
 *
 * A Q8 session has a second such table, its scales: one float per slot of
 * every run, [runs][capacity], right before the KV region in the file (and
 * so in the mapping), whole 16 KiB pages. The device gets both as one
 * region, the bytes from the first to the end of the last: one
 * registration, one allocation, and every copy of slots copies their
 * scales too, as a second strided copy.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
/* For ctxs__slot_spans(), inline: where the store puts a range of positions. */
#include "../../store/format.h"

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond))                                                           \
            return CTXS_EINVAL;                                                \
    } while (0)

/* --- Errors ----------------------------------------------------------------- */

static _Thread_local cudaError_t last_error;
static _Thread_local char last_error_text[256];

int ctxs__cuda_err(cudaError_t e)
{
    if (e == cudaSuccess)
        return 0;
    last_error = e;
    switch (e) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInvalidDevice:
    case cudaErrorInitializationError:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorSystemNotReady:
        return CTXS_ENODEVICE;
    case cudaErrorMemoryAllocation:
        return CTXS_ENOMEM;
    case cudaErrorHostMemoryAlreadyRegistered:
        return -EBUSY;
    case cudaErrorNotSupported:
        return -ENOTSUP;
    case cudaErrorInvalidValue:
        return CTXS_EINVAL;
    default:
        return CTXS_EDEVICE;
    }
}

const char *ctxs_cuda_get_last_error(void)
{
    if (last_error == cudaSuccess)
        return "no CUDA error";
    snprintf(last_error_text, sizeof last_error_text, "%s: %s",
             cudaGetErrorName(last_error), cudaGetErrorString(last_error));
    return last_error_text;
}

int ctxs_cuda_get_device_count(void)
{
    int n = 0;
    /* Whatever the runtime says (no device, no driver, a driver older
     * than the runtime), there is no device to use. */
    if (ctxs__cuda_err(cudaGetDeviceCount(&n)) < 0)
        return CTXS_ENODEVICE;
    if (n <= 0) {
        last_error = cudaErrorNoDevice;
        return CTXS_ENODEVICE;
    }
    return n;
}

/* The runtime's current device is per thread; a library call borrows it. */
int ctxs__cuda_enter(int device, int *prev)
{
    int rc = ctxs__cuda_err(cudaGetDevice(prev));
    if (rc < 0)
        return rc;
    if (*prev != device)
        rc = ctxs__cuda_err(cudaSetDevice(device));
    return rc;
}

void ctxs__cuda_leave(int prev, int device)
{
    if (prev != device)
        cudaSetDevice(prev);
}

/* --- Copies ----------------------------------------------------------------- */

enum { TO_DEVICE, TO_HOST };

/* Copies slots [slot, slot + count) of every run between the mapping and
 * the mirror, on stream: their K/V, and their scales where there are. */
static cudaError_t copy_slots(const ctxs_cuda_kv *kv, uint32_t slot, uint32_t count,
                              int dir, cudaStream_t stream)
{
    const ctxs_layout *l = &kv->host;
    const size_t off = (size_t)slot * l->slot_bytes, width = (size_t)count * l->slot_bytes;
    const uint32_t heads = l->geometry.n_kv_heads;
    uint8_t *host = (uint8_t *)l->kv + off, *dev = kv->dev_kv + off;
    const enum cudaMemcpyKind kind =
        dir == TO_DEVICE ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    if (count == 0)
        return cudaSuccess;

    if (l->scales) {
        /* [runs][capacity] floats (the layout's formula): one 2D copy, or
         * one per run past the device's largest pitch. */
        const size_t runs = (size_t)l->geometry.n_layers * 2 * heads;
        const size_t pitch = (size_t)l->capacity * sizeof(float);
        const size_t step = pitch <= kv->max_pitch ? runs : 1;
        uint8_t *hs = (uint8_t *)l->scales + (size_t)slot * sizeof(float);
        uint8_t *ds = (uint8_t *)kv->dev_scales + (size_t)slot * sizeof(float);
        const size_t sw = (size_t)count * sizeof(float);
        for (size_t r = 0; r < runs; r += step) {
            uint8_t *h = hs + r * pitch, *d = ds + r * pitch;
            cudaError_t e = dir == TO_DEVICE
                                ? cudaMemcpy2DAsync(d, pitch, h, pitch, sw, step, kind, stream)
                                : cudaMemcpy2DAsync(h, pitch, d, pitch, sw, step, kind, stream);
            if (e != cudaSuccess)
                return e;
        }
    }

    /* Runs evenly spaced (the session's layout always is): one 2D copy. */
    if (l->kv_stride == heads * l->head_stride && l->layer_stride == 2 * l->kv_stride &&
        l->head_stride <= kv->max_pitch) {
        size_t runs = (size_t)l->geometry.n_layers * 2 * heads;
        return dir == TO_DEVICE
                   ? cudaMemcpy2DAsync(dev, l->head_stride, host, l->head_stride, width,
                                       runs, kind, stream)
                   : cudaMemcpy2DAsync(host, l->head_stride, dev, l->head_stride, width,
                                       runs, kind, stream);
    }
    for (uint32_t layer = 0; layer < l->geometry.n_layers; layer++) {
        for (uint32_t k = 0; k < 2; k++) {
            for (uint32_t h = 0; h < heads; h++) {
                size_t at = layer * l->layer_stride + k * l->kv_stride + h * l->head_stride;
                cudaError_t e = dir == TO_DEVICE
                                    ? cudaMemcpyAsync(dev + at, host + at, width, kind, stream)
                                    : cudaMemcpyAsync(host + at, dev + at, width, kind, stream);
                if (e != cudaSuccess)
                    return e;
            }
        }
    }
    return cudaSuccess;
}

/* The slot ranges of the tokens the session holds: the sinks, and the
 * recent tokens, which wrap at most once in the ring. Returns how many
 * ranges (0 to 3), adjacent ones merged. */
static int held_ranges(const ctxs_cuda_kv *kv, uint32_t slot[3], uint32_t count[3])
{
    ctxs_session_info info;
    int rc = ctxs_session_get_info(&info, kv->s);
    if (rc < 0)
        return rc;
    const uint64_t n = info.n_tokens, ns = info.n_sink;
    int k = 0;
    uint64_t sinks = n < ns ? n : ns;
    if (sinks)
        slot[k] = 0, count[k] = (uint32_t)sinks, k++;
    uint64_t lo = info.ring_start > ns ? info.ring_start : ns;
    ctxs__span recent[2];
    uint32_t m = lo < n ? ctxs__slot_spans(recent, lo, n - lo, info.capacity, info.n_sink) : 0;
    for (uint32_t i = 0; i < m; i++) {
        if (k && slot[k - 1] + count[k - 1] == recent[i].slot)
            count[k - 1] += recent[i].count;
        else
            slot[k] = recent[i].slot, count[k] = recent[i].count, k++;
    }
    return k;
}

static int copy_held(const ctxs_cuda_kv *kv, cudaStream_t stream)
{
    uint32_t slot[3], count[3];
    int k = held_ranges(kv, slot, count);
    if (k < 0)
        return k;
    for (int i = 0; i < k; i++) {
        int rc = ctxs__cuda_err(copy_slots(kv, slot[i], count[i], TO_DEVICE, stream));
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* The slot ranges of tokens first .. first + n - 1 of r (at most two: the
 * reservation's spans). Returns how many, or CTXS_EINVAL. */
static int reservation_ranges(const ctxs_reservation *r, uint32_t capacity, uint32_t first,
                              uint32_t n, uint32_t slot[2], uint32_t count[2])
{
    CHECK(n > 0 && r->n_spans >= 1 && r->n_spans <= 2);
    CHECK(first <= r->n_tokens && n <= r->n_tokens - first);
    uint64_t t0 = 0, total = 0;
    int k = 0;
    for (uint32_t i = 0; i < r->n_spans; i++) {
        uint32_t s = r->spans[i].slot, c = r->spans[i].count;
        CHECK(c <= capacity && s <= capacity - c);
        uint64_t lo = first > t0 ? first : t0;
        uint64_t hi = (uint64_t)first + n < t0 + c ? (uint64_t)first + n : t0 + c;
        if (lo < hi) {
            slot[k] = s + (uint32_t)(lo - t0);
            count[k] = (uint32_t)(hi - lo);
            total += hi - lo;
            k++;
        }
        t0 += c;
    }
    CHECK(t0 == r->n_tokens && total == n);
    return k;
}

/* --- Handles ---------------------------------------------------------------- */

static int attr(int *out, enum cudaDeviceAttr a, int device)
{
    *out = 0;
    return ctxs__cuda_err(cudaDeviceGetAttribute(out, a, device));
}

/* The device address of the region, and of its parts. */
static void set_dev_region(ctxs_cuda_kv *kv, void *dev)
{
    kv->dev_region = dev;
    kv->dev_kv = kv->dev_region + ((uint8_t *)kv->host.kv - kv->host_region);
    kv->dev_scales = kv->host.scales ? (float *)(void *)(kv->dev_region +
                                                         ((uint8_t *)kv->host.scales -
                                                          kv->host_region))
                                     : NULL;
}

/* Registers the mapping for the device to read (see ctxstore_cuda.h), or
 * takes it as it is where the device walks the host's page tables. */
static int attach_mapped(ctxs_cuda_kv *kv)
{
    int ats, can_map, read_only, rc;
    if ((rc = attr(&ats, cudaDevAttrPageableMemoryAccessUsesHostPageTables, kv->device)) < 0)
        return rc;
    if (ats) {
        /* Coherent (ATS): the device takes page faults on the mapping like
         * a CPU thread, writes included, and nothing needs pinning. */
        set_dev_region(kv, kv->host_region);
        kv->flags = CTXS_CUDA_WRITABLE | CTXS_CUDA_HOST_PAGE_TABLES;
        return 0;
    }
    if ((rc = attr(&can_map, cudaDevAttrCanMapHostMemory, kv->device)) < 0 ||
        (rc = attr(&read_only, cudaDevAttrHostRegisterReadOnlySupported, kv->device)) < 0)
        return rc;
    if (!can_map || !read_only) {
        last_error = cudaErrorNotSupported;
        return -ENOTSUP;
    }
    /* Read-only: the driver pins with a read fault, which gives holes a
     * zero-filled page-cache page and dirties nothing. Pinning for write
     * would run page_mkwrite on every page of the region (allocating disk
     * blocks for every slot of the capacity, dirtying all of them for
     * writeback), fails on a read-only session's PROT_READ mapping, and
     * Linux 6.5+ refuses long-term write pins of file mappings that need
     * dirty tracking (ext4, XFS, Btrfs) outright. */
    rc = ctxs__cuda_err(cudaHostRegister(kv->host_region, kv->region_bytes,
                                         cudaHostRegisterMapped | cudaHostRegisterReadOnly));
    if (rc < 0)
        return rc;
    kv->registered = 1;
    void *dev = NULL;
    if ((rc = ctxs__cuda_err(cudaHostGetDevicePointer(&dev, kv->host_region, 0))) < 0)
        return rc;
    set_dev_region(kv, dev);
    kv->flags = CTXS_CUDA_PINNED;
    return 0;
}

static int attach_mirror(ctxs_cuda_kv *kv)
{
    void *dev = NULL;
    int rc = ctxs__cuda_err(cudaMalloc(&dev, kv->region_bytes));
    if (rc < 0)
        return rc;
    set_dev_region(kv, dev);
    kv->flags = CTXS_CUDA_WRITABLE;
    /* The per-thread stream: attach waits for its own copies only, not
     * for whatever the application has queued on other streams. */
    if ((rc = copy_held(kv, cudaStreamPerThread)) < 0)
        return rc;
    return ctxs__cuda_err(cudaStreamSynchronize(cudaStreamPerThread));
}

static void release(ctxs_cuda_kv *kv)
{
    /* Kernels may still read the region: wait for them first. */
    cudaDeviceSynchronize();
    if (kv->registered)
        cudaHostUnregister(kv->host_region);
    else if (kv->mode == CTXS_CUDA_MIRROR && kv->dev_region)
        cudaFree(kv->dev_region);
    free(kv);
}

int ctxs_cuda_attach(ctxs_cuda_kv **out, ctxs_session *s, int mode, int device)
{
    CHECK(out);
    *out = NULL;
    CHECK(s && (mode == CTXS_CUDA_MAPPED || mode == CTXS_CUDA_MIRROR) && device >= -1);
    ctxs_layout host;
    int rc = ctxs_session_get_layout(&host, s);
    if (rc < 0)
        return rc;
    /* The kernels and the mirror take one stride for every layer; a
     * windowed layer's ring has its own: refused before it is read wrong. */
    if (host.geometry.period)
        return ctxs_set_last_error(CTXS_EINVAL, "the session has a layer schedule (sliding-"
                                   "window layers with rings of their own), which the CUDA "
                                   "kernels do not read: use the CPU kernel, a layer at a time "
                                   "(ctxs_session_get_layer_attn(), ctxs_attention())");

    int count = ctxs_cuda_get_device_count();
    if (count < 0)
        return count;
    if (device == -1 && (rc = ctxs__cuda_err(cudaGetDevice(&device))) < 0)
        return rc;
    CHECK(device < count);

    int prev;
    if ((rc = ctxs__cuda_enter(device, &prev)) < 0)
        return rc;
    ctxs_cuda_kv *kv = calloc(1, sizeof(*kv));
    if (!kv) {
        ctxs__cuda_leave(prev, device);
        return CTXS_ENOMEM;
    }
    kv->s = s;
    kv->mode = mode;
    kv->device = device;
    kv->host = host;
    /* The KV region and the scale table as one range: in a session file
     * the table ends where the KV region starts, so nothing lies between. */
    uint8_t *lo = host.kv, *hi = (uint8_t *)host.kv + host.kv_bytes;
    if (host.scales) {
        uint8_t *s_lo = (uint8_t *)host.scales, *s_hi = s_lo + host.scales_bytes;
        lo = s_lo < lo ? s_lo : lo;
        hi = s_hi > hi ? s_hi : hi;
    }
    kv->host_region = lo;
    kv->region_bytes = (size_t)(hi - lo);
    int pitch = 0;
    if ((rc = attr(&kv->sm_count, cudaDevAttrMultiProcessorCount, device)) < 0 ||
        (rc = attr(&kv->mem_pools, cudaDevAttrMemoryPoolsSupported, device)) < 0 ||
        (rc = attr(&pitch, cudaDevAttrMaxPitch, device)) < 0)
        goto fail;
    kv->max_pitch = pitch > 0 ? (size_t)pitch : 0;
    rc = mode == CTXS_CUDA_MAPPED ? attach_mapped(kv) : attach_mirror(kv);
    if (rc < 0)
        goto fail;
    ctxs__cuda_leave(prev, device);
    *out = kv;
    return 0;

fail:
    release(kv);
    ctxs__cuda_leave(prev, device);
    return rc;
}

void ctxs_cuda_detach(ctxs_cuda_kv *kv)
{
    if (!kv)
        return;
    int prev, device = kv->device;
    int entered = ctxs__cuda_enter(device, &prev) == 0;
    release(kv);
    if (entered)
        ctxs__cuda_leave(prev, device);
}

int ctxs_cuda_get_info(ctxs_cuda_info *out, const ctxs_cuda_kv *kv)
{
    CHECK(out && kv);
    memset(out, 0, sizeof(*out));
    out->mode = kv->mode;
    out->device = kv->device;
    out->flags = kv->flags;
    if (kv->mode == CTXS_CUDA_MIRROR)
        out->device_bytes = kv->region_bytes;
    if (kv->registered)
        out->pinned_bytes = kv->region_bytes;
    return 0;
}

int ctxs_cuda_get_layout(ctxs_layout *out, const ctxs_cuda_kv *kv)
{
    CHECK(out && kv);
    *out = kv->host;
    out->kv = kv->dev_kv;
    out->scales = kv->dev_scales;
    return 0;
}

/* --- Tokens ------------------------------------------------------------------- */

static int move_tokens(ctxs_cuda_kv *kv, const ctxs_reservation *r, uint32_t first,
                       uint32_t n, int dir, cudaStream_t stream)
{
    uint32_t slot[2], count[2];
    int k = reservation_ranges(r, kv->host.capacity, first, n, slot, count);
    if (k < 0)
        return k;
    if (kv->mode == CTXS_CUDA_MAPPED && dir == TO_DEVICE)
        return 0; /* the device reads the mapping */
    if (kv->mode == CTXS_CUDA_MIRROR && dir == TO_HOST) {
        ctxs_session_info info;
        int rc = ctxs_session_get_info(&info, kv->s);
        if (rc < 0)
            return rc;
        if (info.flags & CTXS_INFO_READONLY)
            return CTXS_EREADONLY;
    }

    int prev, rc;
    if ((rc = ctxs__cuda_enter(kv->device, &prev)) < 0)
        return rc;
    if (kv->mode == CTXS_CUDA_MIRROR)
        for (int i = 0; i < k && rc == 0; i++)
            rc = ctxs__cuda_err(copy_slots(kv, slot[i], count[i], dir, stream));
    /* Pull hands the bytes to a commit, which checksums them at once. */
    if (rc == 0 && dir == TO_HOST)
        rc = ctxs__cuda_err(cudaStreamSynchronize(stream));
    ctxs__cuda_leave(prev, kv->device);
    return rc;
}

int ctxs_cuda_push(ctxs_cuda_kv *kv, const ctxs_reservation *r, uint32_t first, uint32_t n,
                   void *stream)
{
    CHECK(kv && r);
    return move_tokens(kv, r, first, n, TO_DEVICE, (cudaStream_t)stream);
}

int ctxs_cuda_pull(ctxs_cuda_kv *kv, const ctxs_reservation *r, uint32_t first, uint32_t n,
                   void *stream)
{
    CHECK(kv && r);
    return move_tokens(kv, r, first, n, TO_HOST, (cudaStream_t)stream);
}

int ctxs_cuda_resync(ctxs_cuda_kv *kv, void *stream)
{
    CHECK(kv);
    if (kv->mode == CTXS_CUDA_MAPPED)
        return 0;
    int prev, rc;
    if ((rc = ctxs__cuda_enter(kv->device, &prev)) < 0)
        return rc;
    rc = copy_held(kv, (cudaStream_t)stream);
    ctxs__cuda_leave(prev, kv->device);
    return rc;
}
