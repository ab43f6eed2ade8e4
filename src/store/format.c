/*
 * Header and commit-record encoding, checking and reading. Everything read
 * from a file passes through here before any size derived from it is used.
 */
#include "format.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <zlib.h>

#include "last_error.h"
#include "platform.h"

static uint32_t crc_of(const void *p, size_t n)
{
    return (uint32_t)crc32(0L, (const Bytef *)p, (uInt)n);
}

static int mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}

static int add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_add_overflow(a, b, out) ? -1 : 0;
}

static int round_page(uint64_t a, uint64_t *out)
{
    if (add_u64(a, CTXS__PAGE - 1, out))
        return -1;
    *out &= ~(uint64_t)(CTXS__PAGE - 1);
    return 0;
}

int ctxs__schedule_check(const ctxs_geometry *g)
{
    if (g->period > CTXS_SCHEDULE_MAX)
        return ctxs__error(CTXS_EINVAL, "the schedule's period %u is above %u layers",
                           g->period, CTXS_SCHEDULE_MAX);
    if (g->period > g->n_layers)
        return ctxs__error(CTXS_EINVAL, "the schedule's period %u is above the model's %u "
                           "layers", g->period, g->n_layers);
    int windowed = 0;
    for (uint32_t j = 0; j < CTXS_SCHEDULE_MAX; j++) {
        if (j >= g->period && g->window[j])
            return ctxs__error(CTXS_EINVAL, "window[%u] is %u, past the schedule's period "
                               "of %u layers: it must be 0", j, g->window[j], g->period);
        if (g->window[j] > CTXS__MAX_CAPACITY)
            return ctxs__error(CTXS_EINVAL, "window[%u] of %u tokens is above %u", j,
                               g->window[j], CTXS__MAX_CAPACITY);
        windowed |= g->window[j] != 0;
    }
    /* One way to say "every layer global": period 0. */
    if (g->period && !windowed)
        return ctxs__error(CTXS_EINVAL, "a schedule of period %u has no windowed layer: "
                           "every layer global is period 0", g->period);
    return 0;
}

static int too_large(const ctxs_geometry *g, uint32_t capacity)
{
    return ctxs__error(CTXS_EINVAL,
                       "%u layers x %u KV heads x %u head_dim x %u slots make a file too "
                       "large to map in this address space",
                       g->n_layers, g->n_kv_heads, g->head_dim, capacity);
}

int ctxs__layout_compute(ctxs__file_layout *out, const ctxs_geometry *g,
                         uint32_t capacity, uint32_t n_sink, uint32_t batch)
{
    memset(out, 0, sizeof(*out));
    uint32_t elem = ctxs__dtype_bytes(g->dtype);
    if (g->dtype == CTXS_DTYPE_F32)
        return ctxs__error(CTXS_EINVAL, "dtype CTXS_DTYPE_F32 is a form K and V are handed "
                           "over in, not a session's dtype: store them as CTXS_DTYPE_F16, "
                           "BF16 or Q8");
    if (!elem)
        return ctxs__error(CTXS_EINVAL, "dtype %u is none of CTXS_DTYPE_F16, BF16 and Q8",
                           g->dtype);
    if (g->n_layers == 0 || g->n_layers > CTXS__MAX_DIM)
        return ctxs__error(CTXS_EINVAL, "n_layers %u is outside 1..%u", g->n_layers,
                           CTXS__MAX_DIM);
    if (g->n_kv_heads == 0 || g->n_kv_heads > CTXS__MAX_DIM)
        return ctxs__error(CTXS_EINVAL, "n_kv_heads %u is outside 1..%u", g->n_kv_heads,
                           CTXS__MAX_DIM);
    if (g->head_dim == 0 || g->head_dim > CTXS__MAX_DIM)
        return ctxs__error(CTXS_EINVAL, "head_dim %u is outside 1..%u", g->head_dim,
                           CTXS__MAX_DIM);
    if (capacity < 2 || capacity > CTXS__MAX_CAPACITY)
        return ctxs__error(CTXS_EINVAL, "capacity %u is outside 2..%u slots", capacity,
                           CTXS__MAX_CAPACITY);
    if (n_sink >= capacity)
        return ctxs__error(CTXS_EINVAL, "n_sink %u is not below the capacity %u", n_sink,
                           capacity);
    if (batch > CTXS__MAX_CAPACITY)
        return ctxs__error(CTXS_EINVAL, "batch %u is above %u tokens", batch,
                           CTXS__MAX_CAPACITY);
    int rc = ctxs__schedule_check(g);
    if (rc < 0)
        return rc;

    const uint32_t pat = g->period ? g->period : 1;
    out->batch = batch;
    out->period = g->period;
    out->pat = pat;
    memcpy(out->window, g->window, sizeof(out->window));
    /* A windowed layer gets a ring of its own where window + batch is
     * smaller than the slots the session's ring can reuse; else it is laid
     * out as a global layer and its window bounds only what attention
     * reads. Layers of one window share a group and its checksum table. */
    for (uint32_t j = 0; j < pat; j++) {
        uint64_t want = (uint64_t)g->window[j] + batch;
        out->len[j] = capacity;
        out->group[j] = -1;
        if (!g->window[j] || !batch || want > (uint64_t)capacity - n_sink || want >= capacity)
            continue;
        out->len[j] = (uint32_t)want;
        uint32_t k = 0;
        while (k < out->n_groups && out->groups[k].window != g->window[j])
            k++;
        if (k == out->n_groups)
            out->groups[out->n_groups++] = (ctxs__group){g->window[j], (uint32_t)want, 0};
        out->group[j] = (int32_t)k;
    }

    uint64_t slot_bytes = (uint64_t)g->head_dim * elem;
    uint64_t head_stride, kv_stride, layer_stride, kv_exact, kv_bytes;
    uint64_t tokens_bytes, sums_bytes, off, file_bytes;
    uint64_t scales_stride = 0, scales_exact = 0, scales_bytes = 0;
    uint64_t runs_per_layer = 2ull * g->n_kv_heads;
    if (mul_u64(slot_bytes, capacity, &head_stride) ||
        mul_u64(head_stride, g->n_kv_heads, &kv_stride) ||
        mul_u64(kv_stride, 2, &layer_stride) ||
        round_page((uint64_t)capacity * 4, &tokens_bytes) ||
        round_page((uint64_t)capacity * 8, &sums_bytes))
        return too_large(g, capacity);
    /* A pattern's layers, then as many patterns as the layers fill. */
    for (uint32_t j = 0; j < pat; j++) {
        uint64_t run_bytes, lb, sb;
        if (mul_u64(slot_bytes, out->len[j], &run_bytes) ||
            mul_u64(run_bytes, runs_per_layer, &lb) ||
            add_u64(out->kv_prefix[j], lb, &out->kv_prefix[j + 1]) ||
            mul_u64((uint64_t)out->len[j] * 4, runs_per_layer, &sb) ||
            add_u64(out->sc_prefix[j], sb, &out->sc_prefix[j + 1]))
            return too_large(g, capacity);
    }
    uint64_t whole = g->n_layers / pat, part = g->n_layers % pat, sc_whole;
    if (mul_u64(whole, out->kv_prefix[pat], &kv_exact) ||
        add_u64(kv_exact, out->kv_prefix[part], &kv_exact) ||
        round_page(kv_exact, &kv_bytes) ||
        mul_u64(whole, out->sc_prefix[pat], &sc_whole))
        return too_large(g, capacity);
    if (ctxs__dtype_has_scales(g->dtype)) {
        scales_stride = (uint64_t)capacity * 4;
        if (add_u64(sc_whole, out->sc_prefix[part], &scales_exact) ||
            round_page(scales_exact, &scales_bytes))
            return too_large(g, capacity);
    }

    off = CTXS__PAGE;
    out->tokens_off = off;
    out->tokens_bytes = tokens_bytes;
    off += tokens_bytes;
    out->sums_off = off;
    out->sums_bytes = sums_bytes;
    if (add_u64(off, sums_bytes, &off))
        return too_large(g, capacity);
    if (scales_bytes) {
        out->scales_off = off;
        out->scales_bytes = scales_bytes;
        if (add_u64(off, scales_bytes, &off))
            return too_large(g, capacity);
    }
    if (out->n_groups) {
        out->groups_off = off;
        for (uint32_t k = 0; k < out->n_groups; k++) {
            uint64_t tb;
            out->groups[k].table_off = off;
            if (round_page((uint64_t)out->groups[k].len * sizeof(ctxs__group_entry), &tb) ||
                add_u64(off, tb, &off))
                return too_large(g, capacity);
        }
        out->groups_bytes = off - out->groups_off;
    }
    out->kv_off = off;
    out->kv_bytes = kv_bytes;
    /* The whole file is mapped: it must fit in the address space and leave
     * room for off_t arithmetic. */
    if (add_u64(off, kv_bytes, &file_bytes) || file_bytes > (uint64_t)INT64_MAX ||
        file_bytes > (uint64_t)SIZE_MAX - CTXS__MAP_ALIGN)
        return too_large(g, capacity);
    out->file_bytes = file_bytes;

    out->n_layers = g->n_layers;
    out->n_kv_heads = g->n_kv_heads;
    out->head_dim = g->head_dim;
    out->elem_bytes = elem;
    out->capacity = capacity;
    out->n_sink = n_sink;
    out->slot_bytes = (size_t)slot_bytes;
    out->head_stride = (size_t)head_stride;
    out->kv_stride = (size_t)kv_stride;
    out->layer_stride = (size_t)layer_stride;
    out->scales_stride = (size_t)scales_stride;
    return 0;
}

void ctxs__header_init(ctxs__disk_header *h, const ctxs__file_layout *lay,
                       const ctxs_model *model, uint32_t flags,
                       uint64_t created_unix_ms)
{
    memset(h, 0, sizeof(*h));
    memcpy(h->magic, CTXS__FILE_MAGIC, 8);
    h->version_major = CTXS__FORMAT_MAJOR;
    h->version_minor = CTXS__FORMAT_MINOR;
    h->header_bytes = CTXS__HEADER_BYTES;
    h->page_bytes = CTXS__PAGE;
    h->flags = flags;
    h->dtype = model->geometry.dtype;
    h->elem_bytes = lay->elem_bytes;
    h->n_layers = lay->n_layers;
    h->n_kv_heads = lay->n_kv_heads;
    h->head_dim = lay->head_dim;
    h->capacity = lay->capacity;
    h->n_sink = lay->n_sink;
    h->record_bytes = CTXS__RECORD_BYTES;
    h->record_off[0] = CTXS__RECORD0_OFF;
    h->record_off[1] = CTXS__RECORD1_OFF;
    h->tokens_off = lay->tokens_off;
    h->tokens_bytes = lay->tokens_bytes;
    h->sums_off = lay->sums_off;
    h->sums_bytes = lay->sums_bytes;
    h->scales_off = lay->scales_off;
    h->scales_bytes = lay->scales_bytes;
    h->batch = lay->batch;
    h->period = lay->period;
    memcpy(h->window, lay->window, sizeof(h->window));
    h->groups_off = lay->groups_off;
    h->groups_bytes = lay->groups_bytes;
    h->kv_off = lay->kv_off;
    h->kv_bytes = lay->kv_bytes;
    h->file_bytes = lay->file_bytes;
    memcpy(h->model_hash, model->model_hash, 16);
    memcpy(h->tokenizer_hash, model->tokenizer_hash, 16);
    h->created_unix_ms = created_unix_ms;
    h->crc32 = crc_of(h, offsetof(ctxs__disk_header, crc32));
}

void ctxs__header_model(ctxs_model *out, const ctxs__disk_header *h)
{
    memset(out, 0, sizeof(*out));
    out->geometry = (ctxs_geometry){h->n_layers, h->n_kv_heads, h->head_dim, h->dtype, 0, {0}};
    /* Before 3.0 the schedule's bytes were reserved: every layer global. */
    if (h->version_major >= 3) {
        out->geometry.period = h->period;
        memcpy(out->geometry.window, h->window, sizeof(out->geometry.window));
    }
    memcpy(out->model_hash, h->model_hash, 16);
    memcpy(out->tokenizer_hash, h->tokenizer_hash, 16);
}

const char *ctxs__dtype_name(uint32_t dtype)
{
    switch (dtype) {
    case CTXS_DTYPE_F16:
        return "fp16";
    case CTXS_DTYPE_BF16:
        return "bf16";
    case CTXS_DTYPE_Q8:
        return "q8";
    case CTXS_DTYPE_F32:
        return "f32";
    default:
        return "unknown";
    }
}

static void hash_hex(char out[17], const uint8_t *h)
{
    for (int i = 0; i < 8; i++)
        snprintf(out + 2 * i, 3, "%02x", h[i]);
}

void ctxs__schedule_text(char *buf, size_t n, const ctxs_geometry *g)
{
    if (!g->period) {
        snprintf(buf, n, "every layer global");
        return;
    }
    size_t at = (size_t)snprintf(buf, n, "period %u:", g->period);
    for (uint32_t j = 0; j < g->period && at < n; j++) {
        if (g->window[j])
            at += (size_t)snprintf(buf + at, n - at, " %u", g->window[j]);
        else
            at += (size_t)snprintf(buf + at, n - at, " global");
    }
}

void ctxs__model_diff(char *buf, size_t n, const ctxs_model *a, const ctxs_model *b)
{
    const ctxs_geometry *x = &a->geometry, *y = &b->geometry;
    char ha[17], hb[17];
    if (x->n_layers != y->n_layers)
        snprintf(buf, n, "n_layers is %u here, %u there", x->n_layers, y->n_layers);
    else if (x->n_kv_heads != y->n_kv_heads)
        snprintf(buf, n, "n_kv_heads is %u here, %u there", x->n_kv_heads, y->n_kv_heads);
    else if (x->head_dim != y->head_dim)
        snprintf(buf, n, "head_dim is %u here, %u there", x->head_dim, y->head_dim);
    else if (x->dtype != y->dtype)
        snprintf(buf, n, "the dtype is %s here, %s there", ctxs__dtype_name(x->dtype),
                 ctxs__dtype_name(y->dtype));
    else if (x->period != y->period || memcmp(x->window, y->window, sizeof(x->window)) != 0) {
        char sa[96], sb[96];
        ctxs__schedule_text(sa, sizeof(sa), x);
        ctxs__schedule_text(sb, sizeof(sb), y);
        snprintf(buf, n, "the layer schedule is %s here, %s there", sa, sb);
    } else if (memcmp(a->model_hash, b->model_hash, CTXS_HASH_BYTES) != 0) {
        hash_hex(ha, a->model_hash);
        hash_hex(hb, b->model_hash);
        snprintf(buf, n, "the model hash begins %s here, %s there", ha, hb);
    } else if (memcmp(a->tokenizer_hash, b->tokenizer_hash, CTXS_HASH_BYTES) != 0) {
        hash_hex(ha, a->tokenizer_hash);
        hash_hex(hb, b->tokenizer_hash);
        snprintf(buf, n, "the tokenizer hash begins %s here, %s there", ha, hb);
    } else if (n) {
        buf[0] = '\0';
    }
}

int ctxs__header_check(const ctxs__disk_header *h, uint64_t file_size,
                       ctxs__file_layout *out)
{
    if (memcmp(h->magic, CTXS__FILE_MAGIC, 8) != 0)
        return ctxs__error(CTXS_EFOREIGN, "not a session file: it does not begin with "
                           "the magic \"" CTXS__FILE_MAGIC "\"");
    /* The version is read before the CRC: a future major version may have
     * moved or resized the CRC itself. */
    if (h->version_major > CTXS__FORMAT_MAJOR)
        return ctxs__error(CTXS_EVERSION, "written in format %u.%u; this library reads "
                           "up to %u.x", h->version_major, h->version_minor,
                           CTXS__FORMAT_MAJOR);
    if (h->version_major == 0)
        return ctxs__error(CTXS_ECORRUPT, "the header's format version is 0");
    /* 1.x knew fp16 alone; its scale fields were reserved, hence zero. */
    if (h->version_major == 1 && h->dtype != CTXS_DTYPE_F16)
        return ctxs__error(CTXS_ECORRUPT, "a format 1 header with dtype %u (1.x knew fp16 "
                           "alone)", h->dtype);
    if (h->crc32 != crc_of(h, offsetof(ctxs__disk_header, crc32)))
        return ctxs__error(CTXS_ECORRUPT, "the header's CRC does not hold");
    if (h->header_bytes != CTXS__HEADER_BYTES || h->page_bytes != CTXS__PAGE ||
        h->record_bytes != CTXS__RECORD_BYTES ||
        h->record_off[0] != CTXS__RECORD0_OFF ||
        h->record_off[1] != CTXS__RECORD1_OFF ||
        (h->flags & ~CTXS__FLAG_RING) != 0 ||
        h->elem_bytes != ctxs__dtype_bytes(h->dtype))
        return ctxs__error(CTXS_ECORRUPT, "the header's sizes, offsets or flags are not "
                           "those of this format");

    ctxs_model m;
    ctxs__header_model(&m, h);
    uint32_t batch = h->version_major >= 3 ? h->batch : 0;
    if (ctxs__layout_compute(out, &m.geometry, h->capacity, h->n_sink, batch) != 0)
        return ctxs__error_more(CTXS_ECORRUPT, "the header's geometry is out of range");
    uint64_t groups_off = h->version_major >= 3 ? h->groups_off : 0;
    uint64_t groups_bytes = h->version_major >= 3 ? h->groups_bytes : 0;
    if (groups_off != out->groups_off || groups_bytes != out->groups_bytes)
        return ctxs__error(CTXS_ECORRUPT, "the header's windowed checksum tables are not "
                           "where its geometry puts them");
    if (h->tokens_off != out->tokens_off || h->tokens_bytes != out->tokens_bytes ||
        h->sums_off != out->sums_off || h->sums_bytes != out->sums_bytes ||
        h->scales_off != out->scales_off || h->scales_bytes != out->scales_bytes ||
        h->kv_off != out->kv_off || h->kv_bytes != out->kv_bytes ||
        h->file_bytes != out->file_bytes)
        return ctxs__error(CTXS_ECORRUPT, "the header's regions do not add up to its "
                           "geometry");
    if (file_size < out->file_bytes)
        return ctxs__error(CTXS_ECORRUPT, "the file is %" PRIu64 " bytes, cut short of "
                           "the %" PRIu64 " its header gives", file_size, out->file_bytes);
    return 0;
}

void ctxs__record_seal(ctxs__disk_record *r, uint32_t index)
{
    memcpy(r->magic, CTXS__RECORD_MAGIC, 4);
    r->index = index;
    r->crc32 = crc_of(r, offsetof(ctxs__disk_record, crc32));
}

int ctxs__record_valid(const ctxs__disk_record *r, uint32_t index,
                       const ctxs__file_layout *lay, int ring)
{
    if (memcmp(r->magic, CTXS__RECORD_MAGIC, 4) != 0 || r->index != index ||
        r->crc32 != crc_of(r, offsetof(ctxs__disk_record, crc32)))
        return 0;
    /* The next seq must exist: a record at the limit would win forever. */
    if (r->seq == UINT64_MAX)
        return 0;
    /* Positions are counted in 64 bits; leave room for any arithmetic. */
    if (r->n_tokens >= CTXS__MAX_POSITION)
        return 0;
    /* What bounds every walk over positions (verify, recovery, fork,
     * export, compact, the index's prefixes, the tool's verify): a record
     * holds [0, min(n_sink, n)) and [max(ring_start, n_sink), n), and the
     * checks below keep those within the capacity, so a walk over the held
     * runs costs at most capacity tokens whatever n_tokens claims (up to
     * 2^62 in a ring). A walk from 0, or from verified_from, to n_tokens
     * would cost the claim: none may be written. Without the ring, or
     * while ring_start <= n_sink, the same checks give n <= capacity, which
     * is what lets the index read the first n token ids as the prefix. */
    uint64_t n = r->n_tokens, rs = r->ring_start, ns = lay->n_sink;
    uint64_t ring_len = lay->capacity - lay->n_sink;
    if (rs > n || r->verified_from > n)
        return 0;
    if (!ring && (n > lay->capacity || rs > ns))
        return 0;
    if (n > ns) {
        uint64_t first = rs > ns ? rs : ns;
        if (n - first > ring_len)
            return 0;
    }
    return 1;
}

int ctxs__records_newest(const ctxs__disk_record r[2], const int valid[2])
{
    if (!valid[0] && !valid[1])
        return -1;
    return !valid[0] || (valid[1] && r[1].seq > r[0].seq);
}

/*
 * Readers take the records without the writer's lock, copied from a mapping
 * or read with pread, while a writer may be committing. The two are read one
 * after the other, and a writer can commit twice in between: the first is
 * then two commits old while the second is torn, and picking the first would
 * take the state back. So the pair is read again until two reads agree:
 * then, at the moment between reading record 0 and record 1, the file held
 * exactly these two (a torn one that stays the same is a write in progress,
 * and the other is the newest complete record). Such a pair with neither
 * record valid is damaged, not in flux: a writer writes one record at a time
 * and leaves the other whole. A try costs well under a microsecond from a
 * mapping and four preads from an fd, and fails only when a commit lands
 * within it: the tries run out only under a writer that commits faster than
 * a reader reads.
 */
#define RECORD_READ_TRIES 1000

static const uint32_t record_off[2] = {CTXS__RECORD0_OFF, CTXS__RECORD1_OFF};

/* Both records, from map or else from fd. */
static int read_pair(ctxs__disk_record out[2], const uint8_t *map, int fd)
{
    for (uint32_t i = 0; i < 2; i++) {
        if (map) {
            memcpy(&out[i], map + record_off[i], sizeof(out[i]));
            continue;
        }
        int rc = ctxs__read_exact(fd, &out[i], sizeof(out[i]), (off_t)record_off[i]);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int records_read(ctxs__records *out, const uint8_t *map, int fd,
                        const ctxs__file_layout *lay, int ring)
{
    memset(out, 0, sizeof(*out));
    for (int attempt = 0; attempt < RECORD_READ_TRIES; attempt++) {
        ctxs__disk_record again[2];
        int rc = read_pair(out->r, map, fd);
        atomic_thread_fence(memory_order_acquire);
        if (rc < 0 || (rc = read_pair(again, map, fd)) < 0)
            return rc;
        if (memcmp(out->r, again, sizeof(again)) != 0)
            continue;
        for (uint32_t i = 0; i < 2; i++)
            out->valid[i] = ctxs__record_valid(&out->r[i], i, lay, ring);
        int newest = ctxs__records_newest(out->r, out->valid);
        if (newest < 0)
            return CTXS_ECORRUPT;
        out->newest = (uint32_t)newest;
        return 0;
    }
    return CTXS_ECORRUPT;
}

int ctxs__records_from_map(ctxs__records *out, const uint8_t *map,
                           const ctxs__file_layout *lay, int ring)
{
    return records_read(out, map, -1, lay, ring);
}

int ctxs__records_from_fd(ctxs__records *out, int fd, const ctxs__file_layout *lay,
                          int ring)
{
    return records_read(out, NULL, fd, lay, ring);
}
