/*
 * The label page: a store's name for a session file, kept in the file so
 * that the index can be rebuilt from the files alone.
 */
#include "label.h"

#include <string.h>
#include <zlib.h>

#include "ctxstore.h"
#include "platform.h"

static uint32_t label_crc(const ctxs__disk_label *l)
{
    return (uint32_t)crc32(0L, (const Bytef *)l, offsetof(ctxs__disk_label, crc32));
}

int ctxs__label_make(ctxs__disk_label *out, uint64_t store_id, const char *name, size_t len)
{
    /* A NUL would not survive ctxs__label_read's NUL-terminated name. */
    if (!name || len == 0 || len > CTXS__LABEL_NAME_MAX || memchr(name, '\0', len))
        return CTXS_EINVAL;
    memset(out, 0, sizeof(*out));
    memcpy(out->magic, CTXS__LABEL_MAGIC, 4);
    out->name_len = (uint16_t)len;
    out->store_id = store_id;
    memcpy(out->name, name, len);
    out->crc32 = label_crc(out);
    return 0;
}

int ctxs__label_write(int fd, uint64_t store_id, const char *name, size_t len)
{
    ctxs__disk_label l;
    int rc = ctxs__label_make(&l, store_id, name, len);
    if (rc < 0)
        return rc;
    /* One system call: a killed process cannot leave half a label in the
     * page cache. */
    rc = ctxs__write_exact(fd, &l, sizeof(l), CTXS__LABEL_OFF);
    return rc < 0 ? rc : ctxs__sync_range(fd, CTXS__LABEL_OFF, sizeof(l));
}

int ctxs__label_read(int fd, uint64_t *store_id, char name[CTXS_NAME_MAX + 1])
{
    *store_id = 0;
    name[0] = '\0';
    ctxs__disk_label l;
    int rc = ctxs__read_exact(fd, &l, sizeof(l), CTXS__LABEL_OFF);
    if (rc < 0)
        return rc;
    if (memcmp(l.magic, CTXS__LABEL_MAGIC, 4) != 0)
        return CTXS_ENOTFOUND;
    if (l.crc32 != label_crc(&l) || l.name_len == 0 ||
        l.name_len > CTXS__LABEL_NAME_MAX || memchr(l.name, '\0', l.name_len))
        return CTXS_ECORRUPT;
    memcpy(name, l.name, l.name_len);
    name[l.name_len] = '\0';
    *store_id = l.store_id;
    return 0;
}
