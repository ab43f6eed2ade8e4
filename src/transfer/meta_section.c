/*
 * The metadata section of export files and remote session records
 * (docs/FORMAT.md, "Metadata section"): a session's metadata map as the
 * index holds it (metadata.c), written out and read back, every entry
 * checked as the index would check it on a set.
 */
#include <stdlib.h>
#include <string.h>

#include "export_format.h"
#include "index.h"
#include "kv_block.h"
#include "syscall.h"

int ctxs__meta_section_make(uint8_t **out, uint32_t *bytes_out, uint32_t *count,
                            const ctxs_meta_entry *e, size_t n)
{
    *out = NULL;
    *bytes_out = *count = 0;
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += sizeof(ctxs__export_meta) + strlen(e[i].key) + e[i].value_bytes;
    if (bytes > CTXS__EXPORT_MAX_META)
        return CTXS_ECORRUPT; /* the index holds more than a set allows */
    uint8_t *at = NULL;
    if (bytes && !(at = *out = ctxs__malloc(bytes)))
        return CTXS_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        ctxs__export_meta m = {(uint16_t)strlen(e[i].key), 0, (uint32_t)e[i].value_bytes};
        memcpy(at, &m, sizeof(m));
        memcpy(at + sizeof(m), e[i].key, m.key_len);
        if (m.value_bytes)
            memcpy(at + sizeof(m) + m.key_len, e[i].value, m.value_bytes);
        at += sizeof(m) + m.key_len + m.value_bytes;
    }
    *bytes_out = (uint32_t)bytes;
    *count = (uint32_t)n;
    return 0;
}

/* Bytewise order, a key before the longer keys it starts: LMDB's. */
static int key_cmp(const char *a, size_t a_len, const char *b, size_t b_len)
{
    int c = memcmp(a, b, a_len < b_len ? a_len : b_len);
    return c ? c : (a_len > b_len) - (a_len < b_len);
}

int ctxs__meta_section_parse(ctxs__meta_item **items_out, const uint8_t *buf, uint32_t bytes,
                             uint32_t count)
{
    *items_out = NULL;
    if (bytes > CTXS__EXPORT_MAX_META || count > bytes / (sizeof(ctxs__export_meta) + 1) ||
        (bytes == 0) != (count == 0))
        return CTXS_ECORRUPT;
    if (bytes == 0)
        return 0;
    ctxs__meta_item *items = ctxs__calloc(count, sizeof(*items));
    if (!items)
        return CTXS_ENOMEM;
    *items_out = items;
    size_t at = 0, total = 0;
    for (uint32_t i = 0; i < count; i++) {
        ctxs__export_meta m;
        if (bytes - at < sizeof(m))
            return CTXS_ECORRUPT;
        memcpy(&m, buf + at, sizeof(m));
        at += sizeof(m);
        if (m.reserved0 != 0 || m.key_len == 0 || m.key_len > CTXS_NAME_MAX ||
            m.value_bytes > CTXS_META_VALUE_MAX || bytes - at < (size_t)m.key_len + m.value_bytes)
            return CTXS_ECORRUPT;
        char key[CTXS_NAME_MAX + 1];
        size_t got;
        memcpy(key, buf + at, m.key_len);
        key[m.key_len] = '\0';
        if (ctxs__name_check(key, &got) < 0 || got != m.key_len)
            return CTXS_ECORRUPT;
        ctxs__meta_item *it = &items[i];
        *it = (ctxs__meta_item){(const char *)buf + at, m.key_len, buf + at + m.key_len,
                                m.value_bytes};
        /* Ascending: no key twice. */
        if (i && key_cmp(it[-1].key, it[-1].key_len, it->key, it->key_len) >= 0)
            return CTXS_ECORRUPT;
        total += (size_t)m.key_len + m.value_bytes;
        at += (size_t)m.key_len + m.value_bytes;
    }
    if (at != bytes || total > CTXS_META_SESSION_MAX)
        return CTXS_ECORRUPT;
    return 0;
}
