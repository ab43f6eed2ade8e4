/*
 * Metal decode attention over a session's mapping (ctxstore_metal.h): the
 * KV region wrapped in one no-copy MTLBuffer (and a Q8 session's scale
 * table in another), and attention.metal run on it with the semantics of
 * ctxs_attention().
 *
 * Memory management is ARC (the file refuses to build without
 * -fobjc-arc). A handle is an Objective-C object handed to C as a retained
 * void * (__bridge_retained at attach, __bridge_transfer at detach); every
 * other object crossing the C interface is bridged without a transfer.
 *
 * The kernel is compiled at attach, from attention.metal embedded in the
 * library at build time (xxd -i, see meson.build). A metallib built ahead
 * of time would need the metal compiler, which comes only with a full
 * Xcode, not with the Command Line Tools; compiling at run time needs
 * nothing beyond the Metal framework and costs tens of milliseconds once
 * per attach.
 *
 * Not yet built or run on Apple hardware: see README.md.
 */
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include <TargetConditionals.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctxstore_metal.h"

#if !__has_feature(objc_arc)
#error "metal.m is written for ARC: compile it with -fobjc-arc"
#endif

/* attention.metal, as bytes (not NUL-terminated). */
static const unsigned char k_kernel_source[] = {
#include "attention.metal.inc"
};

/* Threads per threadgroup, which is also the keys per softmax block. */
enum { THREADS = 128 };

/* The kernel's argument block: struct ctxs_params in attention.metal,
 * field for field. */
typedef struct metal_params {
    uint64_t k_off;
    uint64_t kv_stride;
    uint64_t head_stride;
    uint64_t q_pos;
    uint64_t n_sink;
    uint64_t window;
    uint64_t span_pos[CTXS_ATTN_MAX_SPANS];
    uint64_t k_scale_off;
    uint64_t v_scale_off;
    uint32_t span_slot[CTXS_ATTN_MAX_SPANS];
    uint32_t span_count[CTXS_ATTN_MAX_SPANS];
    uint32_t n_spans;
    uint32_t head_dim;
    uint32_t n_heads;
    uint32_t group;
    float scale;
    uint32_t capacity;
} metal_params;

_Static_assert(CTXS_ATTN_MAX_SPANS == 4, "attention.metal's MAX_SPANS");
_Static_assert(sizeof(metal_params) == 152, "attention.metal's ctxs_params");

@interface CTXSMetalKV : NSObject {
@public
    id<MTLDevice> device;
    id<MTLBuffer> buffer;
    id<MTLBuffer> scales; /* Q8: the scale table; nil for other dtypes */
    id<MTLComputePipelineState> pipeline;
    id<MTLCommandQueue> queue;
    NSUInteger threads;   /* per threadgroup */
    NSUInteger simdgroups;/* per threadgroup */
    ctxs_layout layout;
}
@end

@implementation CTXSMetalKV
@end

/* The library never prints, except on request while the Metal part has
 * not been run on enough machines: CTXS_METAL_DEBUG=1. */
static void debug_log(const char *what, NSError *err)
{
    const char *env = getenv("CTXS_METAL_DEBUG");
    if (!env || !*env || !strcmp(env, "0"))
        return;
    fprintf(stderr, "ctxstore metal: %s: %s\n", what,
            err ? err.localizedDescription.UTF8String : "(no error given)");
}

static id<MTLDevice> default_device(void)
{
    id<MTLDevice> dev = MTLCreateSystemDefaultDevice();
#if TARGET_OS_OSX
    /* A command-line program that does not link CoreGraphics can get nil
     * here on a Mac with several GPUs; any of them will do. */
    if (!dev)
        dev = MTLCopyAllDevices().firstObject;
#endif
    return dev;
}

static int make_pipeline(CTXSMetalKV *h)
{
    NSString *src = [[NSString alloc] initWithBytes:k_kernel_source
                                             length:sizeof k_kernel_source
                                           encoding:NSUTF8StringEncoding];
    if (!src)
        return CTXS_ENOMEM;
    MTLCompileOptions *opts = [MTLCompileOptions new];
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wdeprecated-declarations"
    /* exp() to full float precision, as the CPU kernel's. (mathMode, which
     * replaces this property, is macOS 15 and iOS 18 only.) */
    opts.fastMathEnabled = NO;
#pragma clang diagnostic pop
    NSError *err = nil;
    id<MTLLibrary> lib = [h->device newLibraryWithSource:src
                                                 options:opts
                                                   error:&err];
    /* One kernel per dtype, around one body (attention.metal). */
    NSString *name = h->layout.geometry.dtype == CTXS_DTYPE_Q8     ? @"ctxs_attention_q8"
                     : h->layout.geometry.dtype == CTXS_DTYPE_BF16 ? @"ctxs_attention_bf16"
                                                                   : @"ctxs_attention_f16";
    id<MTLFunction> fn = [lib newFunctionWithName:name];
    if (!fn) {
        debug_log("compiling attention.metal", err);
        return CTXS_ENODEVICE;
    }
    h->pipeline = [h->device newComputePipelineStateWithFunction:fn
                                                           error:&err];
    if (!h->pipeline) {
        debug_log("making the compute pipeline", err);
        return CTXS_ENODEVICE;
    }
    /* Whole SIMD-groups where the pipeline allows as many. */
    NSUInteger width = h->pipeline.threadExecutionWidth;
    h->threads = MIN((NSUInteger)THREADS,
                     h->pipeline.maxTotalThreadsPerThreadgroup);
    if (width == 0 || h->threads == 0)
        return CTXS_ENODEVICE;
    if (h->threads > width)
        h->threads -= h->threads % width;
    h->simdgroups = (h->threads + width - 1) / width;
    return 0;
}

int ctxs_metal_attach_layout(ctxs_metal_kv **out, const ctxs_layout *kv,
                             void *mtl_device)
{
    if (!out)
        return CTXS_EINVAL;
    *out = NULL;
    if (!kv || !kv->kv || kv->kv_bytes == 0)
        return CTXS_EINVAL;
    const uint32_t dt = kv->geometry.dtype;
    const int q8 = dt == CTXS_DTYPE_Q8;
    if (dt != CTXS_DTYPE_F16 && dt != CTXS_DTYPE_BF16 && !q8)
        return CTXS_EINVAL;
    /* newBufferWithBytesNoCopy wants whole pages; the session's regions
     * (the KV region, a Q8 session's scale table) are 16 KiB aligned and
     * sized, a multiple of every Apple page size. */
    const uintptr_t page = (uintptr_t)getpagesize();
    if ((uintptr_t)kv->kv % page != 0 || kv->kv_bytes % page != 0)
        return CTXS_EINVAL;
    if (q8 && (!kv->scales || kv->scales_bytes == 0 ||
               (uintptr_t)kv->scales % page != 0 || kv->scales_bytes % page != 0))
        return CTXS_EINVAL;

    @autoreleasepool {
        id<MTLDevice> dev = mtl_device ? (__bridge id<MTLDevice>)mtl_device
                                       : default_device();
        if (!dev)
            return CTXS_ENODEVICE;
        if (![dev supportsFamily:MTLGPUFamilyApple7] &&
            ![dev supportsFamily:MTLGPUFamilyMac2])
            return CTXS_ENODEVICE; /* no simd_sum / simd_max */
        if (kv->kv_bytes > dev.maxBufferLength ||
            (q8 && kv->scales_bytes > dev.maxBufferLength))
            return CTXS_EINVAL;

        CTXSMetalKV *h = [CTXSMetalKV new];
        if (!h)
            return CTXS_ENOMEM;
        h->device = dev;
        h->layout = *kv;
        /* No deallocator: the mapping belongs to the session. */
        h->buffer = [dev newBufferWithBytesNoCopy:kv->kv
                                           length:kv->kv_bytes
                                          options:MTLResourceStorageModeShared
                                      deallocator:nil];
        if (!h->buffer)
            return CTXS_ENOMEM;
        if (q8) {
            h->scales = [dev newBufferWithBytesNoCopy:kv->scales
                                               length:kv->scales_bytes
                                              options:MTLResourceStorageModeShared
                                          deallocator:nil];
            if (!h->scales)
                return CTXS_ENOMEM;
        }
        int rc = make_pipeline(h);
        if (rc < 0)
            return rc;
        h->queue = [dev newCommandQueue];
        if (!h->queue)
            return CTXS_ENOMEM;
        *out = (__bridge_retained void *)h;
    }
    return 0;
}

int ctxs_metal_attach(ctxs_metal_kv **out, ctxs_session *s, void *mtl_device)
{
    if (!out)
        return CTXS_EINVAL;
    *out = NULL;
    ctxs_layout lay;
    int rc = ctxs_session_get_layout(&lay, s);
    if (rc < 0)
        return rc;
    /* One stride for every layer in the kernel; a windowed layer's ring
     * has its own: refused before it is read wrong. */
    if (lay.geometry.period)
        return ctxs_set_last_error(CTXS_EINVAL, "the session has a layer schedule (sliding-"
                                   "window layers with rings of their own), which the Metal "
                                   "kernel does not read: use the CPU kernel, a layer at a time "
                                   "(ctxs_session_get_layer_attn(), ctxs_attention())");
    return ctxs_metal_attach_layout(out, &lay, mtl_device);
}

void *ctxs_metal_get_buffer(const ctxs_metal_kv *kv)
{
    if (!kv)
        return NULL;
    CTXSMetalKV *h = (__bridge CTXSMetalKV *)(void *)kv;
    return (__bridge void *)h->buffer;
}

void *ctxs_metal_get_scales_buffer(const ctxs_metal_kv *kv)
{
    if (!kv)
        return NULL;
    CTXSMetalKV *h = (__bridge CTXSMetalKV *)(void *)kv;
    return (__bridge void *)h->scales;
}

void ctxs_metal_detach(ctxs_metal_kv *kv)
{
    if (!kv)
        return;
    /* Takes back the reference attach gave out; ARC releases the handle,
     * and with it the buffer, the pipeline and the queue, here. */
    (void)CFBridgingRelease(kv);
}

/* What a pass takes besides its arguments: the score scale, the size of q
 * and of out, and the threadgroup memory. */
typedef struct pass_sizes {
    float scale;
    size_t bytes;   /* of q and of out */
    NSUInteger tg0; /* floats: acc, w, red */
    NSUInteger tg1; /* uints: slot */
} pass_sizes;

/* The core library's checks, so that every kernel accepts the same passes
 * and scales by the same float; then the sizes, overflow-checked, and the
 * scratch against the device's threadgroup memory. */
static int check_pass(pass_sizes *ps, CTXSMetalKV *h, const ctxs_attn_plan *plan,
                      uint32_t layer, const ctxs_attn_query *q)
{
    const ctxs_layout *lay = &h->layout;
    int rc = ctxs_attention_check(&ps->scale, lay, plan, layer, q);
    if (rc < 0)
        return rc;
    const uint32_t hd = lay->geometry.head_dim;

    if (__builtin_mul_overflow((size_t)q->n * q->n_heads, (size_t)hd, &ps->bytes) ||
        __builtin_mul_overflow(ps->bytes, sizeof(float), &ps->bytes))
        return CTXS_EINVAL;
    /* acc[hd], w[threads], red[2 * simdgroups] floats; slot[threads]. */
    const NSUInteger tg_floats = ((NSUInteger)hd + h->threads +
                                  2 * h->simdgroups) * sizeof(float);
    const NSUInteger tg_uints = h->threads * sizeof(uint32_t);
    ps->tg0 = (tg_floats + 15) & ~(NSUInteger)15;
    ps->tg1 = (tg_uints + 15) & ~(NSUInteger)15;
    if (ps->tg0 + ps->tg1 > h->device.maxThreadgroupMemoryLength)
        return CTXS_EINVAL;
    return 0;
}

/* The kernel's argument block for one layer. */
static metal_params pass_params(const ctxs_layout *lay, const ctxs_attn_plan *plan,
                                uint32_t layer, const ctxs_attn_query *q, float scale)
{
    metal_params p = {
        .k_off = (uint64_t)layer * lay->layer_stride,
        .kv_stride = lay->kv_stride,
        .head_stride = lay->head_stride,
        .q_pos = q->pos,
        .n_sink = plan->n_sink,
        .window = plan->window,
        .n_spans = plan->n_spans,
        .head_dim = lay->geometry.head_dim,
        .n_heads = q->n_heads,
        .group = q->n_heads / lay->geometry.n_kv_heads,
        .scale = scale,
    };
    if (lay->geometry.dtype == CTXS_DTYPE_Q8) {
        /* Floats into the scale buffer: run (layer*2 + kind)*n_kv + head. */
        const uint64_t n_kv = lay->geometry.n_kv_heads;
        p.k_scale_off = (uint64_t)layer * 2 * n_kv * lay->capacity;
        p.v_scale_off = p.k_scale_off + n_kv * lay->capacity;
        p.capacity = lay->capacity;
    }
    for (uint32_t i = 0; i < plan->n_spans; i++) {
        p.span_pos[i] = plan->spans[i].pos;
        p.span_slot[i] = plan->spans[i].slot;
        p.span_count[i] = plan->spans[i].count;
    }
    return p;
}

/* Encodes the pass into cb: one compute encoder, one threadgroup per
 * (query head, query), ended before this returns. */
static int encode_pass(id<MTLCommandBuffer> cb, CTXSMetalKV *h, id<MTLBuffer> qb,
                       id<MTLBuffer> out, const metal_params *p, const pass_sizes *ps,
                       const ctxs_attn_query *q)
{
    id<MTLComputeCommandEncoder> enc = [cb computeCommandEncoder];
    if (!enc)
        return CTXS_ENOMEM;
    [enc setComputePipelineState:h->pipeline];
    [enc setBuffer:h->buffer offset:0 atIndex:0];
    [enc setBuffer:qb offset:0 atIndex:1];
    [enc setBuffer:out offset:0 atIndex:2];
    [enc setBytes:p length:sizeof *p atIndex:3];
    if (h->scales)
        [enc setBuffer:h->scales offset:0 atIndex:4];
    [enc setThreadgroupMemoryLength:ps->tg0 atIndex:0];
    [enc setThreadgroupMemoryLength:ps->tg1 atIndex:1];
    [enc dispatchThreadgroups:MTLSizeMake(q->n_heads, q->n, 1)
        threadsPerThreadgroup:MTLSizeMake(h->threads, 1, 1)];
    [enc endEncoding];
    return 0;
}

int ctxs_metal_attention(void *out_buffer, ctxs_metal_kv *kv, void *q_buffer,
                         const ctxs_attn_plan *plan, uint32_t layer,
                         const ctxs_attn_query *q, void *command_buffer)
{
    if (!kv || !out_buffer || !plan || !q || out_buffer == q_buffer)
        return CTXS_EINVAL;
    if (!q_buffer && (command_buffer || !q->q))
        return CTXS_EINVAL;
    CTXSMetalKV *h = (__bridge CTXSMetalKV *)(void *)kv;
    pass_sizes ps;
    int rc = check_pass(&ps, h, plan, layer, q);
    if (rc < 0)
        return rc;
    metal_params p = pass_params(&h->layout, plan, layer, q, ps.scale);

    @autoreleasepool {
        id<MTLBuffer> out = (__bridge id<MTLBuffer>)out_buffer;
        if (out.length < ps.bytes)
            return CTXS_EINVAL;
        id<MTLBuffer> qb;
        if (q_buffer) {
            qb = (__bridge id<MTLBuffer>)q_buffer;
            if (qb.length < ps.bytes)
                return CTXS_EINVAL;
        } else {
            qb = [h->device newBufferWithBytes:q->q
                                        length:ps.bytes
                                       options:MTLResourceStorageModeShared];
            if (!qb)
                return CTXS_ENOMEM;
        }

        id<MTLCommandBuffer> cb =
            command_buffer ? (__bridge id<MTLCommandBuffer>)command_buffer
                           : [h->queue commandBuffer];
        if (!cb)
            return CTXS_ENOMEM;
        if ((rc = encode_pass(cb, h, qb, out, &p, &ps, q)) < 0)
            return rc;
        if (command_buffer)
            return 0;

        [cb commit];
        [cb waitUntilCompleted];
        if (cb.status != MTLCommandBufferStatusCompleted) {
            debug_log("running the attention kernel", cb.error);
            return -EIO;
        }
    }
    return 0;
}
