/*
 * format: the small decoders, called directly and fast: the session
 * header check and the layout it derives, commit-record checks and the
 * slots a record holds, the label page, and names (src/index/names.c).
 *
 * Input: the first byte picks the decoder (modulo 4); the rest is what it
 * reads. Besides not crashing, it checks what the callers rely on: a
 * header that passes describes regions that lie in order inside the file,
 * its runs (a windowed layer's of its ring) one after another inside the
 * KV region, and its rings' tables inside theirs;
 * a record that passes holds no more tokens than there are slots, in
 * slots below the capacity; a name that passes is 1..255 bytes of UTF-8
 * with no control character, '/' or "..".
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format.h"
#include "fuzz.h"
#include "index.h"
#include "label.h"

static void fail(const char *what)
{
    fprintf(stderr, "format_fuzzer: %s\n", what);
    abort();
}

/* What a layout that passed promises (docs/FORMAT.md): the regions in
 * order, each right after the one before; every run of its layer's slots
 * (the capacity, or a windowed group's ring of window + batch), right
 * after the run before, inside the KV region, its scales likewise; each
 * group's table inside the groups' region. Runs are checked over the
 * first two periods of layers and at the end, not all 2^25 of them. */
static void check_layout(const ctxs__file_layout *lay, uint64_t file_size)
{
    const uint64_t after_sums = lay->sums_off + lay->sums_bytes;
    if (lay->tokens_off != CTXS__PAGE || lay->sums_off != lay->tokens_off + lay->tokens_bytes ||
        (lay->scales_bytes ? lay->scales_off != after_sums : lay->scales_off != 0) ||
        (lay->groups_bytes ? lay->groups_off != after_sums + lay->scales_bytes
                           : lay->groups_off != 0 || lay->n_groups != 0) ||
        lay->kv_off != after_sums + lay->scales_bytes + lay->groups_bytes ||
        lay->file_bytes != lay->kv_off + lay->kv_bytes || lay->file_bytes > file_size ||
        lay->kv_off % CTXS__PAGE || lay->kv_bytes % CTXS__PAGE)
        fail("a header that passed describes regions out of order");
    if ((uint64_t)lay->capacity * 4 > lay->tokens_bytes ||
        (uint64_t)lay->capacity * 8 > lay->sums_bytes ||
        lay->head_stride != (size_t)lay->capacity * lay->slot_bytes)
        fail("a header that passed has tables too small");

    uint64_t table_end = lay->groups_off;
    for (uint32_t g = 0; g < lay->n_groups; g++) {
        const ctxs__group *gr = &lay->groups[g];
        if (!gr->window || gr->len != (uint64_t)gr->window + lay->batch ||
            gr->len >= lay->capacity || gr->len > lay->capacity - lay->n_sink)
            fail("a windowed group's ring breaks the rules");
        if (gr->table_off < table_end || gr->table_off % CTXS__PAGE ||
            gr->table_off + (uint64_t)gr->len * 16 > lay->groups_off + lay->groups_bytes)
            fail("a windowed group's table lies outside its region");
        table_end = gr->table_off + (uint64_t)gr->len * 16;
    }
    for (uint32_t j = 0; j < lay->pat; j++) {
        if (lay->group[j] >= (int32_t)lay->n_groups)
            fail("a pattern layer's group does not exist");
        uint32_t want = lay->group[j] < 0 ? lay->capacity : lay->groups[lay->group[j]].len;
        if (lay->len[j] != want)
            fail("a pattern layer's slots are not its group's ring");
    }

    const uint64_t per = 2ull * lay->n_kv_heads, runs = per * lay->n_layers;
    uint64_t check = 2 * per * lay->pat < runs ? 2 * per * lay->pat : runs;
    for (uint64_t i = 0; i <= check; i++) {
        uint64_t r = i < check ? i : runs - 1;
        uint64_t slots = ctxs__layer_cap(lay, (uint32_t)(r / per));
        uint64_t off = ctxs__run_off(lay, (uint32_t)r);
        if (off + slots * lay->slot_bytes > lay->kv_bytes)
            fail("a run ends past the KV region");
        if (r + 1 < runs && i + 1 < check &&
            ctxs__run_off(lay, (uint32_t)(r + 1)) != off + slots * lay->slot_bytes)
            fail("a run does not start where the one before ends");
        if (lay->scales_bytes) {
            uint64_t soff = ctxs__run_scales_off(lay, (uint32_t)r);
            if (soff + slots * 4 > lay->scales_bytes)
                fail("a run's scales end past the scale table");
            if (r + 1 < runs && i + 1 < check &&
                ctxs__run_scales_off(lay, (uint32_t)(r + 1)) != soff + slots * 4)
                fail("a run's scales do not start where the run before's end");
        }
    }
}

static void header(const uint8_t *data, size_t size)
{
    ctxs__disk_header h;
    if (size < sizeof(h) + 8)
        return;
    memcpy(&h, data, sizeof(h));
    uint64_t file_size;
    memcpy(&file_size, data + sizeof(h), 8);
    ctxs__file_layout lay;
    if (ctxs__header_check(&h, file_size, &lay) != 0)
        return;
    check_layout(&lay, file_size);

    /* Its records, from the rest of the input. */
    const uint8_t *rec = data + sizeof(h) + 8;
    size_t left = size - sizeof(h) - 8;
    for (uint32_t i = 0; i < 2 && left >= sizeof(ctxs__disk_record); i++) {
        ctxs__disk_record r;
        memcpy(&r, rec, sizeof(r));
        rec += sizeof(r), left -= sizeof(r);
        int ring = (h.flags & CTXS__FLAG_RING) != 0;
        /* Also judged with a CRC that holds, as if the writer had made it. */
        for (int sealed = 0; sealed < 2; sealed++) {
            if (sealed)
                ctxs__record_seal(&r, r.index);
            if (!ctxs__record_valid(&r, i, &lay, ring))
                continue;
            uint64_t n = r.n_tokens, ns = lay.n_sink;
            uint64_t first = r.ring_start > ns ? r.ring_start : ns;
            uint64_t sinks = n < ns ? n : ns, recent = n > first ? n - first : 0;
            if (sinks + recent > lay.capacity)
                fail("a valid record holds more tokens than slots");
            ctxs__span sp[2];
            uint32_t k = ctxs__slot_spans(sp, first, recent, lay.capacity, lay.n_sink);
            uint64_t got = 0;
            for (uint32_t j = 0; j < k; j++) {
                if ((uint64_t)sp[j].slot + sp[j].count > lay.capacity || sp[j].slot < lay.n_sink)
                    fail("a valid record's slots leave the ring");
                got += sp[j].count;
            }
            if (got != recent)
                fail("a valid record's slots do not add up");
            for (uint64_t p = first; p < n && p < first + 4; p++)
                if (ctxs__slot_of(p, lay.capacity, lay.n_sink) >= lay.capacity)
                    fail("a slot beyond the capacity");
        }
    }
}

/* Input: u32 n_layers, n_kv_heads, head_dim, dtype, capacity, n_sink,
 * batch, period, window[8] (missing ones zero). */
static void geometry(const uint8_t *data, size_t size)
{
    uint32_t v[16] = { 0 };
    memcpy(v, data, size < sizeof(v) ? size : sizeof(v));
    ctxs_geometry g = { v[0], v[1], v[2], v[3], v[7], {0} };
    memcpy(g.window, v + 8, sizeof(g.window));
    ctxs__file_layout lay;
    if (ctxs__layout_compute(&lay, &g, v[4], v[5], v[6]) != 0)
        return;
    check_layout(&lay, lay.file_bytes);
    ctxs__disk_header h;
    ctxs_model m;
    memset(&m, 0, sizeof(m));
    m.geometry = g;
    ctxs__header_init(&h, &lay, &m, v[5] & 1, 0);
    ctxs__file_layout again;
    if (ctxs__header_check(&h, lay.file_bytes, &again) != 0 ||
        memcmp(&again, &lay, sizeof(lay)) != 0)
        fail("a header made for a valid geometry does not check");
    if (ctxs__header_check(&h, lay.file_bytes - 1, &again) != CTXS_ECORRUPT)
        fail("a truncated file passes");
}

static void label(const uint8_t *data, size_t size)
{
    static int fd = -1;
    if (fd < 0) {
        char *path = fuzz_join(fuzz_scratch("format"), "label");
        fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        free(path);
        if (fd < 0)
            fail("a scratch file");
    }
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, CTXS__LABEL_OFF) != (ssize_t)size)
        fail("writing the label page");
    uint64_t id;
    char name[256];
    int rc = ctxs__label_read(fd, &id, name);
    if (rc == 0) {
        size_t len = strlen(name);
        if (len == 0 || len > CTXS__LABEL_NAME_MAX)
            fail("a label read with a bad name");
        ctxs__disk_label l;
        if (ctxs__label_make(&l, id, name, len) != 0 || memcmp(l.name, data + 16, len) != 0)
            fail("a label read does not make the same label");
    }
}

static void name(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s)
        abort();
    memcpy(s, data, size);
    s[size] = '\0';
    size_t len = 0;
    if (ctxs__name_check(s, &len) == 0) {
        if (len == 0 || len > 255 || len != strlen(s) || strchr(s, '/') || strstr(s, "..") ||
            strcmp(s, ".") == 0)
            fail("a name passed that breaks the rules");
        for (size_t i = 0; i < len; i++)
            if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
                fail("a name with a control character passed");
        ctxs__disk_label l;
        if (ctxs__label_make(&l, 1, s, len) != 0)
            fail("a valid name makes no label");
    }
    free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 16384)
        return 0;
    switch (data[0] % 4) {
    case 0:
        header(data + 1, size - 1);
        break;
    case 1:
        geometry(data + 1, size - 1);
        break;
    case 2:
        label(data + 1, size - 1);
        break;
    default:
        name(data + 1, size - 1);
        break;
    }
    return 0;
}
