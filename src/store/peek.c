#include "peek.h"

#include <errno.h>
#include <sys/stat.h>

#include "sys.h"
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

    /* A writer may be rewriting the records while they are read: as in
     * ctxs__records_read(), the pair counts only when a second read of both
     * gives the same bytes, and both torn means look again. */
    for (int attempt = 0; attempt < 100; attempt++) {
        ctxs__disk_record r[2], again[2];
        int valid[2];
        for (int pass = 0; pass < 2; pass++)
            for (uint32_t i = 0; i < 2; i++) {
                ctxs__disk_record *into = pass ? &again[i] : &r[i];
                if ((rc = ctxs__read_exact(fd, into, sizeof(*into), (off_t)h.record_off[i])) < 0)
                    return rc;
            }
        if (memcmp(r, again, sizeof(r)) != 0)
            continue;
        for (uint32_t i = 0; i < 2; i++)
            valid[i] = ctxs__record_valid(&r[i], i, &out->lay, out->ring);
        if (!valid[0] && !valid[1])
            continue;
        uint32_t pick = !valid[0] || (valid[1] && r[1].seq > r[0].seq);
        out->st.seq = r[pick].seq;
        out->st.n_tokens = r[pick].n_tokens;
        out->st.ring_start = r[pick].ring_start;
        out->st.verified_from = r[pick].verified_from;
        out->written_unix_ms = r[pick].written_unix_ms;
        return 0;
    }
    return CTXS_ECORRUPT;
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
