/*
 * Token ids by position: what an app shows or re-tokenizes from, read
 * from the token table (slot order) through the ring's arithmetic.
 */
#include "internal.h"

int ctxs_session_get_tokens(uint32_t *out, const ctxs_session *s, uint64_t from, uint32_t n)
{
    ctxs__error_begin();
    CTXS__CHECK(s && (out || n == 0));
    /* Past the count, or a range that runs past it: nothing is copied. */
    if (from > s->st.n_tokens || n > s->st.n_tokens - from)
        return CTXS_ENOTFOUND;
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
        return CTXS_EEVICTED;
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
