/*
 * ctxs_file_inspect: what a session file says about itself, read with
 * pread and no lock, so that tools can describe a file that does not open
 * (a damaged header, both records torn) as well as one a writer holds.
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "internal.h"
#include "label.h"
#include "lock.h"
#include "platform.h"
#include "syscall.h"

static int crc_holds(const void *p, size_t crc_off)
{
    uint32_t stored;
    memcpy(&stored, (const uint8_t *)p + crc_off, 4);
    return stored == (uint32_t)crc32(0, p, (uInt)crc_off);
}

static void report_header(ctxs_file_report *out, const ctxs__disk_header *h,
                          ctxs__file_layout *lay)
{
    out->format_major = h->version_major;
    out->format_minor = h->version_minor;
    out->header_crc_ok = crc_holds(h, offsetof(ctxs__disk_header, crc32));
    out->header_status = ctxs__header_check(h, out->size_bytes, lay);
    if (out->header_status != 0)
        return;
    ctxs__header_model(&out->model, h);
    out->capacity = h->capacity;
    out->n_sink = h->n_sink;
    out->ring = (h->flags & CTXS__FLAG_RING) != 0;
    out->created_unix_ms = h->created_unix_ms;
    out->file_bytes = h->file_bytes;
}

static void report_records(ctxs_file_report *out, const uint8_t *page,
                           const ctxs__file_layout *lay)
{
    uint8_t boot[16], zero[16] = { 0 };
    ctxs__boot_id(boot);
    ctxs__disk_record seen[2];
    int seen_valid[2];
    for (uint32_t i = 0; i < 2; i++) {
        ctxs__disk_record r;
        memcpy(&r, page + (i == 0 ? CTXS__RECORD0_OFF : CTXS__RECORD1_OFF), sizeof(r));
        ctxs_record_report *rr = &out->records[i];
        /* Without a valid header the counters cannot be checked against
         * the geometry; magic, index and CRC still can. */
        int valid = lay ? ctxs__record_valid(&r, i, lay, out->ring)
                        : memcmp(r.magic, CTXS__RECORD_MAGIC, 4) == 0 && r.index == i &&
                              crc_holds(&r, offsetof(ctxs__disk_record, crc32));
        rr->status = valid ? 0 : CTXS_ECORRUPT;
        rr->seq = r.seq;
        rr->n_tokens = r.n_tokens;
        rr->ring_start = r.ring_start;
        rr->verified_from = r.verified_from;
        rr->written_unix_ms = r.written_unix_ms;
        rr->boot_known = memcmp(r.boot_id, zero, 16) != 0;
        rr->this_boot = rr->boot_known && memcmp(r.boot_id, boot, 16) == 0;
        seen[i] = r;
        seen_valid[i] = valid;
    }
    int newest = ctxs__records_newest(seen, seen_valid);
    if (newest >= 0)
        out->records[newest].current = 1;
    else if (out->status == 0)
        out->status = CTXS_ECORRUPT;
}

int ctxs_file_inspect(ctxs_file_report *out, const char *path)
{
    ctxs__error_begin();
    CTXS__CHECK(out && path && *path);
    memset(out, 0, sizeof(*out));
    out->label_status = CTXS_ENOTFOUND;
    int fd = ctxs__open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return -errno;
    struct stat sb;
    if (ctxs__fstat(fd, &sb) != 0) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    if (S_ISDIR(sb.st_mode)) {
        close(fd);
        return -EISDIR;
    }
    out->size_bytes = (uint64_t)sb.st_size;
    out->disk_bytes = (uint64_t)sb.st_blocks * 512;

    int rc = 0;
    if (!S_ISREG(sb.st_mode) || sb.st_size < 8) {
        out->status = out->header_status = CTXS_EFOREIGN;
    } else {
        /* The first page up to the label; a shorter file reads as zeros
         * past its end, which the header check then calls truncated. */
        size_t want = sb.st_size < (off_t)CTXS__LABEL_OFF ? (size_t)sb.st_size
                                                          : CTXS__LABEL_OFF;
        uint8_t *first = ctxs__calloc(1, CTXS__LABEL_OFF);
        if (!first)
            rc = CTXS_ENOMEM;
        else if ((rc = ctxs__read_exact(fd, first, want, 0)) == 0) {
            ctxs__disk_header h;
            memcpy(&h, first, sizeof(h));
            ctxs__file_layout lay;
            report_header(out, &h, &lay);
            out->status = out->header_status;
            if (out->header_status == 0 || out->header_status == CTXS_ECORRUPT)
                report_records(out, first, out->header_status == 0 ? &lay : NULL);
            out->label_status = ctxs__label_read(fd, &out->label_id, out->label_name);
        }
        free(first);
    }
    if (rc == 0 && S_ISREG(sb.st_mode)) {
        int w = ctxs__lock_probe(fd, CTXS__LOCK_WRITER);
        int r = ctxs__lock_probe(fd, CTXS__LOCK_READER);
        out->writer_open = w > 0;
        out->reader_open = r > 0;
        if (out->writer_open)
            out->writer_pid = ctxs__lock_holder(fd, CTXS__LOCK_WRITER, out->writer_command,
                                                sizeof(out->writer_command));
        /* A process names itself: what a terminal would act on is hidden. */
        for (char *c = out->writer_command; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f)
                *c = '?';
    }
    close(fd);
    return rc;
}
