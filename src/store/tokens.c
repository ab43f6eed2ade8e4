/*
 * Token ids by position: what an app shows or re-tokenizes from, read
 * from the token table (slot order) through the ring's arithmetic.
 */
#include <inttypes.h>

#include "internal.h"

int ctxs__evicted(const ctxs_session *s, uint64_t pos)
{
    return ctxs__error(CTXS_EEVICTED,
                       "position %" PRIu64 " was overwritten by the ring: the session holds "
                       "its %u sinks and positions %" PRIu64 " to %" PRIu64,
                       pos, s->lay.n_sink, ctxs__first_recent(s, &s->st),
                       s->st.n_tokens ? s->st.n_tokens - 1 : 0);
}

int ctxs_session_get_tokens(uint32_t *out, const ctxs_session *s, uint64_t from, uint32_t n)
{
    ctxs__error_begin();
    CTXS__CHECK(s);
    CTXS__REQUIRE(out || n == 0, "out is NULL for %u tokens", n);
    /* Past the count, or a range that runs past it: nothing is copied. */
    if (from > s->st.n_tokens || n > s->st.n_tokens - from)
        return ctxs__error(CTXS_ENOTFOUND, "positions %" PRIu64 " to %" PRIu64 " run past "
                           "the %" PRIu64 " committed", from, from + n, s->st.n_tokens);
    if (n == 0)
        return 0;
    /* Held positions form at most two runs: the sinks, then the recent
     * tokens from the first one after the sinks still held. A range is
     * held whole when its first and last positions are and no evicted
     * position lies between them: the gap between the runs is one run of
     * consecutive positions. */
    uint64_t last = from + n - 1, gap = ctxs__first_recent(s, &s->st);
    uint64_t ns = s->lay.n_sink;
    if (!ctxs__holds(s, &s->st, from) || !ctxs__holds(s, &s->st, last) ||
        (from < ns && last >= ns && gap > ns))
        return ctxs__evicted(s, ctxs__holds(s, &s->st, from) ? ns : from);
    ctxs__span sp[2];
    const uint32_t *table = ctxs__token_table(s);
    uint64_t p = from;
    while (p <= last) {
        /* Sinks and recent positions lie in different slot runs. */
        uint64_t end = p < ns ? (last < ns ? last + 1 : ns) : last + 1;
        uint32_t n_sp = ctxs__slot_spans(sp, p, (uint32_t)(end - p), s->lay.capacity, s->lay.n_sink);
        for (uint32_t i = 0; i < n_sp; i++) {
            memcpy(out, table + sp[i].slot, (size_t)sp[i].count * sizeof(*out));
            out += sp[i].count;
        }
        p = end;
    }
    return 0;
}
