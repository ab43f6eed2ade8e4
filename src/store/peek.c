#include "peek.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "internal.h"
#include "platform.h"
#include "syscall.h"

int ctxs__peek_fd(ctxs__peek *out, int fd)
{
    memset(out, 0, sizeof(*out));
    struct stat st;
    if (ctxs__fstat(fd, &st) != 0)
        return -errno;
    if (!S_ISREG(st.st_mode))
        return S_ISDIR(st.st_mode) ? -EISDIR : CTXS_EFOREIGN;
    ctxs__disk_header h;
    if ((uint64_t)st.st_size < sizeof(h))
        return CTXS_EFOREIGN;
    int rc;
    if ((rc = ctxs__read_exact(fd, &h, sizeof(h), 0)) < 0 ||
        (rc = ctxs__header_check(&h, (uint64_t)st.st_size, &out->lay)) < 0)
        return rc;
    out->ring = (h.flags & CTXS__FLAG_RING) != 0;
    ctxs__header_model(&out->model, &h);
    out->format_minor = h.version_minor;
    out->created_unix_ms = h.created_unix_ms;
    out->disk_bytes = (uint64_t)st.st_blocks * 512u;

    ctxs__records recs;
    if ((rc = ctxs__records_from_fd(&recs, fd, &out->lay, out->ring)) < 0)
        return rc;
    out->st = ctxs__record_state(&recs.r[recs.newest]);
    out->written_unix_ms = recs.r[recs.newest].written_unix_ms;
    memcpy(out->boot_id, recs.r[recs.newest].boot_id, 16);
    return 0;
}

uint64_t ctxs__peek_prefix_held(const ctxs__peek *p)
{
    uint64_t ns = p->lay.n_sink;
    if (p->st.ring_start <= ns)
        return p->st.n_tokens;
    return p->st.n_tokens < ns ? p->st.n_tokens : ns;
}

int ctxs__peek_tokens(uint32_t *out, int fd, const ctxs__peek *p,
                      uint64_t first, uint64_t n)
{
    uint64_t held = ctxs__peek_prefix_held(p);
    if (first > held || n > held - first)
        return CTXS_EINVAL;
    if (n == 0)
        return 0;
    return ctxs__read_exact(fd, out, (size_t)n * 4u,
                            (off_t)(p->lay.tokens_off + first * 4u));
}

int ctxs__peek_sum(uint64_t *out, int fd, const ctxs__peek *p, uint64_t pos)
{
    const ctxs__state *st = &p->st;
    uint64_t ns = p->lay.n_sink;
    uint64_t first_recent = st->ring_start > ns ? st->ring_start : ns;
    if (pos >= st->n_tokens || (pos >= ns && pos < first_recent))
        return CTXS_EEVICTED;
    uint32_t slot = ctxs__slot_of(pos, p->lay.capacity, p->lay.n_sink);
    return ctxs__read_exact(fd, out, 8, (off_t)(p->lay.sums_off + (uint64_t)slot * 8u));
}

int ctxs__peek_kept(uint64_t *out, int fd, const ctxs__peek *p, uint64_t n)
{
    uint64_t from = p->st.verified_from;
    *out = n;
    if (from >= n || ctxs__boot_vouches(p->boot_id))
        return 0;
    size_t len = (size_t)p->lay.file_bytes;
    uint8_t *map = ctxs__mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED)
        return errno == ENOMEM ? CTXS_ENOMEM : -errno;
    /* Read as a session's own mapping reads (session.c): a page a fault,
     * no large folios past what is read for a live writer to split. */
    madvise(map, len, MADV_RANDOM);
    *out = ctxs__leading_kept(map, &p->lay, p->ring, &p->st, n);
    munmap(map, len);
    return 0;
}
