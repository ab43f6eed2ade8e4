/*
 * The values of the remote tier (remote_format.h) as this side makes and
 * reads them: their keys, their headers stamped and checked (one function
 * each), the sizes a valid value has, and a session record parsed.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "platform.h"
#include "remote.h"
#include "syscall.h"

uint32_t ctxs__rcrc(const void *p, size_t n)
{
    return (uint32_t)crc32(0L, (const Bytef *)p, (uInt)n);
}

static void hex32(char out[33], const uint8_t b[16])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[32] = '\0';
}

void ctxs__rschedule_bytes(uint8_t out[CTXS__RSCHEDULE_BYTES], const ctxs_geometry *g)
{
    memcpy(out, &g->period, 4);
    memcpy(out + 4, g->window, 32);
}

static uint32_t schedule_crc(const ctxs_geometry *g)
{
    uint8_t b[CTXS__RSCHEDULE_BYTES];
    ctxs__rschedule_bytes(b, g);
    return ctxs__rcrc(b, sizeof(b));
}

uint16_t ctxs__rmajor(const ctxs_model *m)
{
    return m->geometry.period ? CTXS__REMOTE_MAJOR_SCHED : CTXS__REMOTE_MAJOR;
}

uint32_t ctxs__rn_windows(const ctxs_geometry *g)
{
    uint32_t n = 0;
    for (uint32_t j = 0; j < g->period; j++) {
        int seen = !g->window[j];
        for (uint32_t i = 0; i < j && !seen; i++)
            seen = g->window[i] == g->window[j];
        n += !seen;
    }
    return n;
}

/* "<prefix>:<kind>:<model hash>:<form>:<chain>" into key[CTXS__RCHUNK_KEY_MAX],
 * kind "chunk" or "window", the form "<dtype>-<layers>x<kv heads>x<head
 * dim>" ("f16-32x8x128"), and with a layer schedule "-w" and the
 * pattern's windows joined by '.' ("f16-6x2x16-w0.6.10"). The model hash
 * names the weights, not the form of their KV: an fp16 and a Q8 store of
 * one model compute the same chain for the same ids, and without the form
 * in the key each would find the other's chunks "present" and refuse
 * them at every pull, for good. The schedule is in it for the same
 * reason: a chunk of a scheduled session carries its global layers only. */
void ctxs__rvalue_key(char *key, const ctxs_remote *r, const char *kind, const ctxs_model *model,
                      const uint8_t chain[16])
{
    char m[33], c[33], sched[96] = "";
    hex32(m, model->model_hash);
    hex32(c, chain);
    const ctxs_geometry *g = &model->geometry;
    const char *dt = g->dtype == CTXS_DTYPE_F16    ? "f16"
                     : g->dtype == CTXS_DTYPE_BF16 ? "bf16"
                     : g->dtype == CTXS_DTYPE_Q8   ? "q8"
                                                   : "dtype?"; /* refused before */
    for (uint32_t j = 0, at = 0; j < g->period && j < CTXS_SCHEDULE_MAX; j++)
        at += (uint32_t)snprintf(sched + at, sizeof(sched) - at, "%s%" PRIu32, j ? "." : "-w",
                                 g->window[j]);
    snprintf(key, CTXS__RCHUNK_KEY_MAX, "%s:%s:%s:%s-%" PRIu32 "x%" PRIu32 "x%" PRIu32 "%s:%s",
             r->prefix, kind, m, dt, g->n_layers, g->n_kv_heads, g->head_dim, sched, c);
}

void ctxs__rchunk_key(char *key, const ctxs_remote *r, const ctxs_model *model,
                      const uint8_t chain[16])
{
    ctxs__rvalue_key(key, r, "chunk", model, chain);
}

void ctxs__rsession_key(char *key, const ctxs_remote *r, const char *name)
{
    snprintf(key, CTXS__RSESSION_KEY_MAX, "%s:session:%s", r->prefix, name);
}

uint64_t ctxs__rchunk_bytes(const ctxs__kv_plan *p, uint32_t count)
{
    return CTXS__RCHUNK_HEADER_BYTES + count * p->token_raw;
}

ctxs__kv_range ctxs__rwindow_of(const ctxs__kv_plan *p, uint32_t gi, uint64_t n)
{
    uint64_t w = p->lay.groups[gi].window;
    return (ctxs__kv_range){n > w ? n - w : 0, n};
}

uint64_t ctxs__rwindow_raw_bytes(const ctxs__kv_plan *p, uint64_t n)
{
    uint64_t sum = 0;
    for (uint32_t gi = 0; gi < p->lay.n_groups; gi++) {
        ctxs__kv_range w = ctxs__rwindow_of(p, gi, n);
        sum += (w.end - w.start) * p->group_raw[gi];
    }
    return sum;
}

/* --- Headers --------------------------------------------------------------- */

/* The 32 bytes every remote value opens with: the three headers agree on
 * them to the byte (remote_format.h). */
typedef struct value_head {
    char magic[8];
    uint16_t version_major;
    uint16_t version_minor;
    uint32_t header_bytes;
    uint32_t dtype;
    uint32_t n_layers;
    uint32_t n_kv_heads;
    uint32_t head_dim;
} value_head;

static_assert(sizeof(value_head) == 32, "value head size");
static_assert(offsetof(ctxs__rchunk_header, head_dim) == offsetof(value_head, head_dim),
              "a chunk opens with the head");
static_assert(offsetof(ctxs__rsession_header, head_dim) == offsetof(value_head, head_dim),
              "a record opens with the head");
static_assert(offsetof(ctxs__rwindow_header, head_dim) == offsetof(value_head, head_dim),
              "a window value opens with the head");

static void head_make(void *h, const char *magic, uint16_t major, uint32_t header_bytes,
                      const ctxs_geometry *g)
{
    value_head v = {.version_major = major, .version_minor = CTXS__REMOTE_MINOR,
                    .header_bytes = header_bytes, .dtype = g->dtype, .n_layers = g->n_layers,
                    .n_kv_heads = g->n_kv_heads, .head_dim = g->head_dim};
    memcpy(v.magic, magic, 8);
    memcpy(h, &v, sizeof(v));
}

/* Nonzero unless h opens as head_make() of the same arguments would have
 * it; any minor version reads. */
static int head_differs(const void *h, const char *magic, uint16_t major, uint32_t header_bytes,
                        const ctxs_geometry *g)
{
    value_head v;
    memcpy(&v, h, sizeof(v));
    return memcmp(v.magic, magic, 8) || v.version_major != major ||
           v.header_bytes != header_bytes || v.dtype != g->dtype || v.n_layers != g->n_layers ||
           v.n_kv_heads != g->n_kv_heads || v.head_dim != g->head_dim;
}

void ctxs__rchunk_header_make(ctxs__rchunk_header *h, const ctxs_model *model, uint64_t first,
                              uint32_t count, uint32_t raw_bytes, const uint8_t prev[16],
                              const uint8_t chain[16])
{
    const ctxs_geometry *g = &model->geometry;
    memset(h, 0, sizeof(*h));
    head_make(h, CTXS__RCHUNK_MAGIC, ctxs__rmajor(model), CTXS__RCHUNK_HEADER_BYTES, g);
    h->schedule_crc32 = g->period ? schedule_crc(g) : 0;
    h->count = count;
    h->raw_bytes = raw_bytes;
    h->first_pos = first;
    memcpy(h->model_hash, model->model_hash, 16);
    memcpy(h->prev_chain, prev, 16);
    memcpy(h->chain, chain, 16);
    h->crc32 = ctxs__rcrc(h, offsetof(ctxs__rchunk_header, crc32));
}

int ctxs__rchunk_header_check(const ctxs__rchunk_header *h, const ctxs_model *model,
                              uint64_t first, uint32_t count, uint32_t raw_bytes,
                              const uint8_t prev[16], const uint8_t chain[16])
{
    static const uint8_t zero[sizeof(h->reserved)];
    const ctxs_geometry *g = &model->geometry;
    return h->crc32 != ctxs__rcrc(h, offsetof(ctxs__rchunk_header, crc32)) ||
           head_differs(h, CTXS__RCHUNK_MAGIC, ctxs__rmajor(model), CTXS__RCHUNK_HEADER_BYTES, g) ||
           h->schedule_crc32 != (g->period ? schedule_crc(g) : 0) || h->count != count ||
           h->first_pos != first || h->raw_bytes != raw_bytes ||
           memcmp(h->model_hash, model->model_hash, 16) || memcmp(h->prev_chain, prev, 16) ||
           memcmp(h->chain, chain, 16) || memcmp(h->reserved, zero, sizeof(zero));
}

void ctxs__rwindow_header_make(ctxs__rwindow_header *h, const ctxs_model *model,
                               uint32_t n_groups, uint64_t n_tokens, const uint8_t chain[16],
                               uint64_t raw_bytes)
{
    const ctxs_geometry *g = &model->geometry;
    memset(h, 0, sizeof(*h));
    head_make(h, CTXS__RWINDOW_MAGIC, CTXS__REMOTE_MAJOR_SCHED, CTXS__RWINDOW_HEADER_BYTES, g);
    h->schedule_crc32 = schedule_crc(g);
    h->n_groups = n_groups;
    h->n_tokens = n_tokens;
    memcpy(h->model_hash, model->model_hash, 16);
    memcpy(h->chain, chain, 16);
    h->raw_bytes = raw_bytes;
    h->crc32 = ctxs__rcrc(h, offsetof(ctxs__rwindow_header, crc32));
}

int ctxs__rwindow_header_check(const ctxs__rwindow_header *h, const ctxs_model *model,
                               uint32_t n_groups, uint64_t n_tokens, const uint8_t chain[16],
                               uint64_t raw_bytes)
{
    static const uint8_t zero[sizeof(h->reserved)];
    const ctxs_geometry *g = &model->geometry;
    return h->crc32 != ctxs__rcrc(h, offsetof(ctxs__rwindow_header, crc32)) ||
           head_differs(h, CTXS__RWINDOW_MAGIC, CTXS__REMOTE_MAJOR_SCHED,
                        CTXS__RWINDOW_HEADER_BYTES, g) ||
           h->schedule_crc32 != schedule_crc(g) || h->n_groups != n_groups ||
           h->n_tokens != n_tokens || memcmp(h->model_hash, model->model_hash, 16) ||
           memcmp(h->chain, chain, 16) || h->raw_bytes != raw_bytes ||
           memcmp(h->reserved, zero, sizeof(zero));
}

void ctxs__rsession_header_make(ctxs__rsession_header *h, const ctxs_model *model,
                                const char *model_name, const char *name, uint64_t n_tokens,
                                uint32_t flags, uint32_t meta_bytes, uint32_t meta_count,
                                uint32_t body_crc32)
{
    memset(h, 0, sizeof(*h));
    head_make(h, CTXS__RSESSION_MAGIC, ctxs__rmajor(model), CTXS__RSESSION_HEADER_BYTES,
              &model->geometry);
    memcpy(h->model_hash, model->model_hash, 16);
    memcpy(h->tokenizer_hash, model->tokenizer_hash, 16);
    h->n_tokens = n_tokens;
    h->updated_unix_ms = ctxs__now_ms();
    h->flags = flags;
    h->name_len = (uint16_t)strlen(name);
    memcpy(h->name, name, h->name_len);
    h->model_name_len = (uint16_t)strlen(model_name);
    memcpy(h->model_name, model_name, h->model_name_len);
    h->meta_bytes = meta_bytes;
    h->meta_count = meta_count;
    h->body_crc32 = body_crc32;
    h->crc32 = ctxs__rcrc(h, offsetof(ctxs__rsession_header, crc32));
}

int ctxs__rsession_header_check(ctxs__rsession_header *h, const void *v, size_t len)
{
    if (len < sizeof(*h))
        return CTXS_EREMOTE;
    memcpy(h, v, sizeof(*h));
    char name[CTXS_NAME_MAX + 1];
    ctxs_geometry g = {h->n_layers, h->n_kv_heads, h->head_dim, h->dtype, 0, {0}};
    ctxs__file_layout lay;
    if (memcmp(h->magic, CTXS__RSESSION_MAGIC, 8) ||
        (h->version_major != CTXS__REMOTE_MAJOR && h->version_major != CTXS__REMOTE_MAJOR_SCHED) ||
        h->header_bytes != sizeof(*h) ||
        h->crc32 != ctxs__rcrc(h, offsetof(ctxs__rsession_header, crc32)) ||
        (h->flags & ~CTXS__RSESSION_FLAG_TAIL) || h->n_tokens > CTXS__REMOTE_MAX_TOKENS ||
        ctxs__layout_compute(&lay, &g, CTXS_PREFIX_CHUNK, 0, 0) < 0 ||
        ctxs__name_field(name, h->name, h->name_len, 0) < 0 ||
        ctxs__name_field(name, h->model_name, h->model_name_len, 1) < 0)
        return CTXS_EREMOTE;
    return 0;
}

int ctxs__record_parse(ctxs__record *rec, const void *v, size_t len, const char *name)
{
    memset(rec, 0, sizeof(*rec));
    ctxs__rsession_header *h = &rec->h;
    int rc = ctxs__rsession_header_check(h, v, len);
    if (rc < 0)
        return rc;
    const uint8_t *body = (const uint8_t *)v + sizeof(*h);
    size_t sched = h->version_major == CTXS__REMOTE_MAJOR_SCHED ? CTXS__RSCHEDULE_BYTES : 0;
    if (len != sizeof(*h) + sched + h->n_tokens * 4 + h->meta_bytes ||
        ctxs__rcrc(body, len - sizeof(*h)) != h->body_crc32 || h->name_len != strlen(name) ||
        memcmp(h->name, name, h->name_len))
        return CTXS_EREMOTE;
    rec->model.geometry = (ctxs_geometry){h->n_layers, h->n_kv_heads, h->head_dim, h->dtype, 0, {0}};
    if (sched) {
        /* A 2.0 record is a scheduled session's: a schedule of period 0
         * would be 1.0's, and one that breaks the rules is damage. */
        memcpy(&rec->model.geometry.period, body, 4);
        memcpy(rec->model.geometry.window, body + 4, 32);
        if (!rec->model.geometry.period || ctxs__schedule_check(&rec->model.geometry) < 0) {
            ctxs__rsay("the session record's layer schedule is damaged");
            return CTXS_EREMOTE;
        }
        body += sched;
    }
    memcpy(rec->model.model_hash, h->model_hash, 16);
    memcpy(rec->model.tokenizer_hash, h->tokenizer_hash, 16);
    memcpy(rec->model_name, h->model_name, h->model_name_len);
    rec->model_name[h->model_name_len] = '\0';
    if (!(rec->ids = ctxs__malloc(h->n_tokens * 4 + 4)) ||
        (h->meta_bytes && !(rec->meta = ctxs__malloc(h->meta_bytes))))
        return CTXS_ENOMEM;
    memcpy(rec->ids, body, h->n_tokens * 4);
    if (h->meta_bytes)
        memcpy(rec->meta, body + h->n_tokens * 4, h->meta_bytes);
    rc = ctxs__meta_section_parse(&rec->items, rec->meta, h->meta_bytes, h->meta_count);
    return rc == CTXS_ECORRUPT ? CTXS_EREMOTE : rc;
}

void ctxs__record_free(ctxs__record *rec)
{
    free(rec->ids);
    free(rec->meta);
    free(rec->items);
}
