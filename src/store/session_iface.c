/*
 * The answers to what session_iface.h lets code outside src/store ask of
 * an open session.
 */
#include "session_iface.h"

#include "internal.h"

int ctxs__session_fd(const ctxs_session *s)
{
    return s->fd;
}

uint64_t ctxs__session_prefix_held(const uint32_t **ids, const ctxs_session *s)
{
    if (ids)
        *ids = ctxs__token_table(s);
    uint64_t ns = s->lay.n_sink;
    if (s->st.ring_start <= ns)
        return s->st.n_tokens;
    return s->st.n_tokens < ns ? s->st.n_tokens : ns;
}

void ctxs__session_tokens(uint32_t *ids, uint64_t *sums, const ctxs_session *s, uint64_t first,
                          uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        uint32_t slot = ctxs__slot(s, first + i);
        if (ids)
            ids[i] = ctxs__token_table(s)[slot];
        if (sums)
            sums[i] = ctxs__sum_table(s)[slot];
    }
}

int ctxs__session_group_sums(uint64_t *sums, const ctxs_session *s, uint32_t g, uint64_t first,
                             uint64_t n)
{
    const ctxs__group_entry *t = ctxs__group_table(s, g);
    const uint64_t len = s->lay.groups[g].len;
    /* Below the window of the state now, a writer's turn may be rewriting
     * the slots before it commits (and before their entries change). */
    if (first < ctxs__group_from(s, &s->st, g))
        return CTXS_ESTALE;
    for (uint64_t i = 0; i < n; i++) {
        const ctxs__group_entry *e = &t[(first + i) % len];
        if (e->pos != first + i || !e->sum)
            return CTXS_ESTALE;
        sums[i] = e->sum;
    }
    return 0;
}

int ctxs__session_can_roll_back(const ctxs_session *s, uint64_t n)
{
    ctxs__state st;
    return ctxs__rollback_state(&st, s, n);
}

uint32_t ctxs__session_batch(const ctxs_session *s)
{
    return s->lay.batch;
}

void ctxs__session_set_hooks(ctxs_session *s, const ctxs__session_hooks *hooks, void *arg)
{
    s->hooks = hooks;
    s->hooks_arg = arg;
}

const ctxs__session_hooks *ctxs__session_get_hooks(const ctxs_session *s, void **arg)
{
    *arg = s->hooks_arg;
    return s->hooks;
}
