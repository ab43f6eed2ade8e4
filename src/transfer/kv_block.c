/*
 * Blocks of tokens outside a session file (kv_block.h): what export,
 * import and the remote tier share.
 *
 * A copy from a live session is exact without any lock: a held slot is
 * never rewritten before a record that stops holding it (rollback, ring
 * eviction), so a block whose every token matches its checksum, and whose
 * positions the session still holds afterwards with the same checksums,
 * is what the session held.
 */
#include "kv_block.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "last_error.h"
#include "platform.h"
#include "session_iface.h"
#include "syscall.h"

int ctxs__kv_plan_make(ctxs__kv_plan *p, const ctxs_geometry *g, uint32_t capacity,
                       uint32_t n_sink, uint32_t batch, int ring, uint64_t n_tokens,
                       uint64_t ring_start, uint32_t block_tokens)
{
    memset(p, 0, sizeof(*p));
    /* Without the batch, a windowed layer's ring has no known length. */
    if (g->period && !batch)
        return CTXS_EINVAL;
    if (ctxs__layout_compute(&p->lay, g, capacity, n_sink, batch) < 0)
        return CTXS_ECORRUPT;
    p->ring = ring;
    /* The state obeys the rules of a commit record: judge it as one. */
    ctxs__disk_record r;
    memset(&r, 0, sizeof(r));
    r.seq = 1;
    r.n_tokens = n_tokens;
    r.ring_start = ring_start;
    r.verified_from = n_tokens;
    ctxs__record_seal(&r, 0);
    if (!ctxs__record_valid(&r, 0, &p->lay, ring))
        return CTXS_ECORRUPT;
    p->st.n_tokens = n_tokens;
    p->st.ring_start = ring_start;
    p->st.verified_from = n_tokens;

    uint64_t ns = n_sink;
    uint64_t sinks = n_tokens < ns ? n_tokens : ns;
    uint64_t first = ring_start > ns ? ring_start : ns;
    if (sinks)
        p->ranges[p->n_ranges++] = (ctxs__kv_range){0, sinks};
    if (first < n_tokens) {
        if (p->n_ranges && p->ranges[0].end == first)
            p->ranges[0].end = n_tokens;
        else
            p->ranges[p->n_ranges++] = (ctxs__kv_range){first, n_tokens};
    }

    /* Below 2^25 runs of at most 8 KiB: no overflow in 64 bits. */
    const uint32_t per = 2 * p->lay.n_kv_heads;
    for (uint32_t l = 0; l < p->lay.n_layers; l++) {
        int32_t gi = ctxs__layer_group(&p->lay, l);
        if (gi < 0)
            p->n_runs += per;
        else
            p->group_runs[gi] += per;
    }
    p->scale_bytes = p->lay.scales_bytes ? 4 : 0;
    const uint64_t run_token = p->lay.slot_bytes + p->scale_bytes;
    p->token_raw = 12 + (uint64_t)p->n_runs * run_token;
    uint64_t most = p->token_raw;
    for (uint32_t gi = 0; gi < p->lay.n_groups; gi++) {
        p->group_raw[gi] = 12 + (uint64_t)p->group_runs[gi] * run_token;
        most = p->group_raw[gi] > most ? p->group_raw[gi] : most;
        /* A group's window, as its records claim it; within the held
         * positions (a window is at most the slots after the sinks). */
        uint64_t w = p->lay.groups[gi].window, from = n_tokens > w ? n_tokens - w : 0;
        if (from >= ns && from < first)
            from = first;
        p->window[gi] = (ctxs__kv_range){from, n_tokens};
    }
    if (block_tokens == 0) {
        uint64_t fit = CTXS__KV_BLOCK_MAX_RAW / most;
        if (fit == 0)
            return CTXS_EINVAL;
        block_tokens = fit < CTXS__KV_BLOCK_MAX_TOKENS ? (uint32_t)fit
                                                       : CTXS__KV_BLOCK_MAX_TOKENS;
    }
    if (block_tokens > CTXS__KV_BLOCK_MAX_TOKENS ||
        block_tokens * most > CTXS__KV_BLOCK_MAX_RAW)
        return CTXS_ECORRUPT;
    p->block_tokens = block_tokens;
    for (uint32_t i = 0; i < p->n_ranges; i++) {
        uint64_t len = p->ranges[i].end - p->ranges[i].start;
        p->n_held += len;
        p->n_blocks += (len + block_tokens - 1) / block_tokens;
    }
    for (uint32_t gi = 0; gi < p->lay.n_groups; gi++) {
        uint64_t len = p->window[gi].end - p->window[gi].start;
        p->n_blocks += (len + block_tokens - 1) / block_tokens;
    }
    return 0;
}

void ctxs__kv_walk_init(const ctxs__kv_plan *p, ctxs__kv_walk *w)
{
    w->part = -1;
    w->range = 0;
    w->next = p->n_ranges ? p->ranges[0].start : 0;
}

int ctxs__kv_walk_next(const ctxs__kv_plan *p, ctxs__kv_walk *w, int32_t *part, uint64_t *first,
                       uint32_t *count)
{
    for (;;) {
        const ctxs__kv_range *ranges = w->part < 0 ? p->ranges : &p->window[w->part];
        uint32_t n = w->part < 0 ? p->n_ranges : 1;
        while (w->range < n && w->next >= ranges[w->range].end) {
            w->range++;
            if (w->range < n)
                w->next = ranges[w->range].start;
        }
        if (w->range < n) {
            uint64_t left = ranges[w->range].end - w->next;
            *part = w->part;
            *first = w->next;
            *count = (uint32_t)(left < p->block_tokens ? left : p->block_tokens);
            w->next += *count;
            return 1;
        }
        if ((uint32_t)(w->part + 1) >= p->lay.n_groups)
            return 0;
        w->part++;
        w->range = 0;
        w->next = p->window[w->part].start;
    }
}

/* The slots of a block's positions: one or two runs of consecutive slots,
 * since a block lies within one range of held positions; in a group's
 * ring, position p in slot p mod len. */
static uint32_t block_spans(ctxs__span out[2], const ctxs__kv_plan *p, int32_t part,
                            uint64_t first, uint32_t count)
{
    if (part >= 0)
        return ctxs__slot_spans(out, first, count, p->lay.groups[part].len, 0);
    return ctxs__slot_spans(out, first, count, p->lay.capacity, p->lay.n_sink);
}

/* 1 if file run `run` is one of part's. */
static int run_in(const ctxs__kv_plan *p, int32_t part, uint32_t run)
{
    return ctxs__layer_group(&p->lay, run / (2 * p->lay.n_kv_heads)) == part;
}

static uint32_t part_runs(const ctxs__kv_plan *p, int32_t part)
{
    return part < 0 ? p->n_runs : p->group_runs[part];
}

static uint8_t *raw_kv(uint8_t *raw, uint32_t count)
{
    return raw + (size_t)count * 12;
}

/* The scales, run by run, after the KV (with a scale table only). */
static uint8_t *raw_scales(const ctxs__kv_plan *p, int32_t part, uint8_t *raw, uint32_t count)
{
    return raw_kv(raw, count) + (size_t)part_runs(p, part) * count * p->lay.slot_bytes;
}

int ctxs__kv_raw_verifies(const ctxs__kv_plan *p, int32_t part, uint8_t *raw, uint64_t first,
                          uint32_t count)
{
    uint64_t got[CTXS__KV_BLOCK_MAX_TOKENS];
    uint32_t at[CTXS__KV_BLOCK_MAX_TOKENS];
    for (uint32_t i = 0; i < count; i++)
        at[i] = i;
    ctxs__token_bytes tb = {
        .kv = raw_kv(raw, count),
        .run_stride = (size_t)count * p->lay.slot_bytes,
        .scales = p->scale_bytes ? raw_scales(p, part, raw, count) : NULL,
        .scales_stride = (size_t)count * p->scale_bytes,
        .n_runs = part_runs(p, part),
        .slot_bytes = p->lay.slot_bytes,
        .at = at,
    };
    ctxs__sums_chain(got, first, count, ctxs__raw_ids(raw, count), &tb);
    const uint64_t *sums = ctxs__raw_sums(raw);
    for (uint32_t i = 0; i < count; i++)
        if (got[i] != sums[i])
            return 0;
    return 1;
}

/* pread (write 0) or pwrite (write 1) of exactly len bytes. */
static int exact_io(int fd, int write, uint8_t *buf, size_t len, uint64_t off)
{
    return write ? ctxs__write_exact(fd, buf, len, (off_t)off)
                 : ctxs__read_exact(fd, buf, len, (off_t)off);
}

/* Moves the KV and Q8 scales of a block's runs between raw and the file
 * at fd, run by run, in the slots of sp[0..n_sp): read from the file
 * (write 0) or written into it (write 1). */
static int runs_io(int fd, int write, uint8_t *raw, const ctxs__kv_plan *p, int32_t part,
                   const ctxs__span *sp, uint32_t n_sp, uint32_t count)
{
    size_t sb = p->lay.slot_bytes, run_bytes = (size_t)count * sb;
    size_t scb = p->scale_bytes, scale_run_bytes = (size_t)count * scb;
    uint8_t *kv = raw_kv(raw, count), *scales = raw_scales(p, part, raw, count);
    const uint32_t runs = 2 * p->lay.n_layers * p->lay.n_kv_heads;
    for (uint32_t run = 0, r = 0; run < runs; run++) {
        if (!run_in(p, part, run))
            continue;
        uint64_t base = p->lay.kv_off + ctxs__run_off(&p->lay, run);
        uint64_t scale_base = p->lay.scales_off + ctxs__run_scales_off(&p->lay, run);
        size_t at = 0, scale_at = 0;
        for (uint32_t j = 0; j < n_sp; j++) {
            size_t len = (size_t)sp[j].count * sb, scale_len = (size_t)sp[j].count * scb;
            int rc = exact_io(fd, write, kv + (size_t)r * run_bytes + at, len,
                              base + (uint64_t)sp[j].slot * sb);
            if (rc == 0 && scb)
                rc = exact_io(fd, write, scales + (size_t)r * scale_run_bytes + scale_at,
                              scale_len, scale_base + (uint64_t)sp[j].slot * scb);
            if (rc < 0)
                return rc;
            at += len;
            scale_at += scale_len;
        }
        r++;
    }
    return 0;
}

/* Copies the ids, checksums and KV of a block's tokens from the session. */
static int block_copy(uint8_t *raw, const ctxs__kv_plan *p, int32_t part, const ctxs_session *s,
                      uint64_t first, uint32_t count)
{
    ctxs__session_tokens(ctxs__raw_ids(raw, count), part < 0 ? ctxs__raw_sums(raw) : NULL, s,
                         first, count);
    int rc;
    if (part >= 0 &&
        (rc = ctxs__session_group_sums(ctxs__raw_sums(raw), s, (uint32_t)part, first, count)) < 0)
        return rc;
    /* By pread rather than through the mapping: the mapping reads no ahead
     * (MADV_RANDOM), and an I/O error is an error here, not a SIGBUS. */
    ctxs__span sp[2];
    uint32_t n_sp = block_spans(sp, p, part, first, count);
    return runs_io(ctxs__session_fd(s), 0, raw, p, part, sp, n_sp, count);
}

/* 1 if now holds every position want holds (fork.c's rule). */
static int holds_all(uint32_t n_sink, const ctxs__state *now, const ctxs__state *want)
{
    uint64_t ns = n_sink;
    uint64_t first_want = want->ring_start > ns ? want->ring_start : ns;
    uint64_t first_now = now->ring_start > ns ? now->ring_start : ns;
    return want->n_tokens <= now->n_tokens &&
           (first_want >= want->n_tokens || first_want >= first_now);
}

int ctxs__kv_still_holds(const ctxs__kv_plan *p, ctxs_session *s)
{
    int rc = ctxs_session_refresh(s);
    if (rc < 0)
        return rc;
    ctxs_session_info info;
    ctxs_session_get_info(&info, s);
    ctxs__state now = {.n_tokens = info.n_tokens, .ring_start = info.ring_start};
    return holds_all(info.n_sink, &now, &p->st) ? 0 : CTXS_ESTALE;
}

/* CTXS_ESTALE unless the session still holds the block's tokens with the
 * checksums copied. */
static int block_still_held(uint8_t *raw, const ctxs__kv_plan *p, int32_t part,
                            ctxs_session *s, uint64_t first, uint32_t count)
{
    int rc = ctxs__kv_still_holds(p, s);
    if (rc < 0)
        return rc;
    uint64_t now[CTXS__KV_BLOCK_MAX_TOKENS];
    if (part < 0)
        ctxs__session_tokens(NULL, now, s, first, count);
    else if ((rc = ctxs__session_group_sums(now, s, (uint32_t)part, first, count)) < 0)
        return rc;
    const uint64_t *sums = ctxs__raw_sums(raw);
    for (uint32_t i = 0; i < count; i++)
        if (now[i] != sums[i])
            return CTXS_ESTALE;
    return 0;
}

int ctxs__kv_block_read(uint8_t *raw, const ctxs__kv_plan *p, int32_t part, ctxs_session *s,
                        uint64_t first, uint32_t count)
{
    for (int attempt = 0;; attempt++) {
        int rc = block_copy(raw, p, part, s, first, count);
        if (rc < 0 && rc != CTXS_ESTALE)
            return rc;
        if (rc == 0 && ctxs__kv_raw_verifies(p, part, raw, first, count))
            return 0;
        if ((rc = block_still_held(raw, p, part, s, first, count)) < 0)
            return rc;
        if (attempt == 1)
            return ctxs__error(CTXS_ECORRUPT, "the K/V of positions %" PRIu64 "..%" PRIu64
                               " do not match their checksums, read twice",
                               first, first + count - 1);
    }
}

int ctxs__kv_block_store(int fd, const ctxs__kv_plan *p, int32_t part, uint8_t *raw,
                         uint64_t first, uint32_t count)
{
    ctxs__span sp[2];
    uint32_t n_sp = block_spans(sp, p, part, first, count);
    size_t at = 0;
    int rc;
    if (part < 0) {
        for (uint32_t j = 0; j < n_sp; j++) {
            uint64_t slot = sp[j].slot, n = sp[j].count;
            if ((rc = ctxs__write_exact(fd, ctxs__raw_ids(raw, count) + at, n * 4,
                                        (off_t)(p->lay.tokens_off + slot * 4))) < 0 ||
                (rc = ctxs__write_exact(fd, ctxs__raw_sums(raw) + at, n * 8,
                                        (off_t)(p->lay.sums_off + slot * 8))) < 0)
                return rc;
            at += n;
        }
    } else {
        /* The group's chain hashes the ids the position blocks stored. */
        ctxs__span gs[2];
        uint32_t n_gs = ctxs__slot_spans(gs, first, count, p->lay.capacity, p->lay.n_sink);
        uint32_t ids[CTXS__KV_BLOCK_MAX_TOKENS];
        for (uint32_t j = 0; j < n_gs; j++) {
            if ((rc = ctxs__read_exact(fd, ids + at, (size_t)gs[j].count * 4,
                                       (off_t)(p->lay.tokens_off + (uint64_t)gs[j].slot * 4))) < 0)
                return rc;
            at += gs[j].count;
        }
        if (memcmp(ids, ctxs__raw_ids(raw, count), (size_t)count * 4) != 0)
            return CTXS_ECORRUPT;
        const ctxs__group *gr = &p->lay.groups[part];
        for (uint32_t i = 0; i < count; i++) {
            ctxs__group_entry e = {first + i, ctxs__raw_sums(raw)[i]};
            if ((rc = ctxs__write_exact(fd, &e, sizeof(e),
                                        (off_t)(gr->table_off +
                                                ((first + i) % gr->len) * sizeof(e)))) < 0)
                return rc;
        }
    }
    return runs_io(fd, 1, raw, p, part, sp, n_sp, count);
}

static int full_or(int rc)
{
    return rc == -ENOSPC || rc == -EDQUOT || rc == -EFBIG ? CTXS_EFULL : rc;
}

int ctxs__kv_file_begin(int fd, const ctxs__kv_plan *p, const ctxs_model *model,
                        uint64_t created_unix_ms, const ctxs__disk_label *label)
{
    /* The records hold the state with verified_from = n_tokens: the
     * caller syncs everything before the file has its name, so every held
     * token is durable once any record is. */
    ctxs__disk_header h;
    ctxs__header_init(&h, &p->lay, model, p->ring ? CTXS__FLAG_RING : 0, created_unix_ms);
    int rc;
    if ((rc = full_or(ctxs__new_file_size(fd, &p->lay))) < 0 ||
        (rc = ctxs__new_file_first_page(fd, &h, &p->st, label)) < 0)
        return rc;
    /* Slots below min(n_tokens, capacity) have blocks in any session; a
     * windowed layer's ring all of its slots (as a fork gives it). */
    uint64_t alloc = p->st.n_tokens < p->lay.capacity ? p->st.n_tokens : p->lay.capacity;
    const uint32_t runs = 2 * p->lay.n_layers * p->lay.n_kv_heads;
    for (uint32_t run = 0; run < runs; run++) {
        uint32_t l = run / (2 * p->lay.n_kv_heads);
        uint64_t slots = ctxs__layer_group(&p->lay, l) >= 0 ? ctxs__layer_cap(&p->lay, l) : alloc;
        if (slots && (rc = full_or(ctxs__allocate(fd, p->lay.kv_off + ctxs__run_off(&p->lay, run),
                                                  slots * p->lay.slot_bytes))) < 0)
            return rc;
    }
    return 0;
}
