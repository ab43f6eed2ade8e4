/*
 * session_open: the input becomes a session file, which is then opened
 * every way a user can: described (ctxs_file_inspect), peeked (the index's
 * cheap reads), opened read-only with and without verification, read
 * (info, tokens, window, attention plan and one attention pass, verify),
 * forked, and, when the control byte asks, opened read-write (recovery
 * written back, stale checksums cleared), appended to, rolled back, synced
 * and compacted.
 *
 * Input: a control byte (FUZZ_SESS_* in fuzz.h), then the file, as is
 * (FUZZ_SESS_RAW) or in the compact form that leaves out the empty parts
 * of the first page. The control byte can recompute the CRCs and the
 * token checksums, so that mutations reach past them.
 *
 * Besides not crashing, it checks what recovery promises: after an open
 * with CTXS_OPEN_VERIFY, every held token at or above the watermark
 * verifies; after a commit, the new tokens read back as written.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "fuzz.h"
#include "internal.h"
#include "label.h"
#include "peek.h"
#include "platform.h"

/* The largest file an input may make by FUZZ_SESS_EXTEND. */
#define MAX_FILE (4u << 20)

static char *path, *fork_path;

static void fail(const char *what, int rc)
{
    fprintf(stderr, "session_open_fuzzer: %s (%d %s)\n", what, rc, ctxs_err_name(rc));
    abort();
}

static uint32_t crc_of(const void *p, size_t n)
{
    return (uint32_t)crc32(0L, (const Bytef *)p, (uInt)n);
}

/* Recomputes the checksums of the held positions of the newest valid
 * record, on the file image buf of size bytes. */
static void fix_sums(uint8_t *buf, size_t size)
{
    ctxs__disk_header h;
    ctxs__file_layout lay;
    if (size < sizeof(h))
        return;
    memcpy(&h, buf, sizeof(h));
    /* A header that passes sizes a file of at least three pages. */
    if (ctxs__header_check(&h, size, &lay) != 0)
        return;
    int ring = (h.flags & CTXS__FLAG_RING) != 0;
    ctxs__disk_record r[2];
    int valid[2];
    for (uint32_t i = 0; i < 2; i++) {
        memcpy(&r[i], buf + (i ? CTXS__RECORD1_OFF : CTXS__RECORD0_OFF), sizeof(r[i]));
        valid[i] = ctxs__record_valid(&r[i], i, &lay, ring);
    }
    if (!valid[0] && !valid[1])
        return;
    const ctxs__disk_record *cur = &r[!valid[0] || (valid[1] && r[1].seq > r[0].seq)];
    uint64_t n = cur->n_tokens, ns = lay.n_sink;
    uint64_t first = cur->ring_start > ns ? cur->ring_start : ns;
    uint64_t runs[2][2] = { { 0, n < ns ? n : ns }, { first, n } };
    uint32_t *ids_table = (uint32_t *)(void *)(buf + lay.tokens_off);
    uint64_t *sums_table = (uint64_t *)(void *)(buf + lay.sums_off);
    for (int k = 0; k < 2; k++) {
        for (uint64_t p = runs[k][0]; p < runs[k][1]; p++) {
            uint32_t slot = ctxs__slot_of(p, lay.capacity, lay.n_sink);
            uint32_t id = ids_table[slot];
            ctxs__token_bytes tb = {
                .kv = buf + lay.kv_off,
                .run_stride = lay.head_stride,
                .scales = lay.scales_bytes ? buf + lay.scales_off : NULL,
                .scales_stride = lay.scales_stride,
                .n_runs = 2 * lay.n_layers * lay.n_kv_heads,
                .slot_bytes = lay.slot_bytes,
                .at = &slot,
            };
            ctxs__sums_chain(&sums_table[slot], p, 1, &id, &tb);
        }
    }
}

/* Writes the session file the input describes. */
static int make_file(const uint8_t *data, size_t size)
{
    uint8_t ctl = data[0];
    data++, size--;
    if (ctl & FUZZ_SESS_RAW)
        return fuzz_write_file(path, data, size);

    static const struct { size_t at, off, len; } parts[] = {
        { 0, 0, 256 }, { 256, CTXS__RECORD0_OFF, 128 }, { 384, CTXS__RECORD1_OFF, 128 },
        { 512, CTXS__LABEL_OFF, 512 },
    };
    size_t end = 0; /* of the bytes the input gives */
    for (size_t i = 0; i < 4; i++)
        if (size > parts[i].at) {
            size_t n = size - parts[i].at < parts[i].len ? size - parts[i].at : parts[i].len;
            end = parts[i].off + n;
        }
    size_t rest = size > FUZZ_SESS_COMPACT_HEAD ? size - FUZZ_SESS_COMPACT_HEAD : 0;
    if (rest)
        end = CTXS__PAGE + rest;
    size_t file_size = end;
    if ((ctl & FUZZ_SESS_EXTEND) && size >= 256) {
        uint64_t fb;
        memcpy(&fb, data + offsetof(ctxs__disk_header, file_bytes), 8);
        if (fb > file_size && fb <= MAX_FILE)
            file_size = (size_t)fb;
    }
    if (file_size > MAX_FILE + CTXS__PAGE)
        return -EFBIG;
    uint8_t *buf = calloc(1, file_size ? file_size : 1);
    if (!buf)
        abort();
    for (size_t i = 0; i < 4; i++)
        if (size > parts[i].at)
            memcpy(buf + parts[i].off, data + parts[i].at,
                   size - parts[i].at < parts[i].len ? size - parts[i].at : parts[i].len);
    if (rest)
        memcpy(buf + CTXS__PAGE, data + FUZZ_SESS_COMPACT_HEAD, rest);

    size_t dirty = end; /* bytes to write; the rest of the file is a hole */
    if ((ctl & FUZZ_SESS_FIX_HEADER) && end >= 256) {
        uint32_t crc = crc_of(buf, offsetof(ctxs__disk_header, crc32));
        memcpy(buf + offsetof(ctxs__disk_header, crc32), &crc, 4);
    }
    static const size_t rec_off[2] = { CTXS__RECORD0_OFF, CTXS__RECORD1_OFF };
    for (int i = 0; i < 2; i++) {
        if (end < rec_off[i] + CTXS__RECORD_BYTES)
            continue;
        uint8_t *r = buf + rec_off[i];
        if (ctl & FUZZ_SESS_THIS_BOOT)
            ctxs__boot_id(r + offsetof(ctxs__disk_record, boot_id));
        if (ctl & (FUZZ_SESS_FIX_RECORDS | FUZZ_SESS_THIS_BOOT)) {
            uint32_t crc = crc_of(r, offsetof(ctxs__disk_record, crc32));
            memcpy(r + offsetof(ctxs__disk_record, crc32), &crc, 4);
        }
    }
    if ((ctl & FUZZ_SESS_FIX_LABEL) && end >= CTXS__LABEL_OFF + CTXS__LABEL_BYTES) {
        uint8_t *l = buf + CTXS__LABEL_OFF;
        uint32_t crc = crc_of(l, offsetof(ctxs__disk_label, crc32));
        memcpy(l + offsetof(ctxs__disk_label, crc32), &crc, 4);
    }
    if (ctl & FUZZ_SESS_FIX_SUMS) {
        fix_sums(buf, file_size);
        dirty = file_size;
    }
    int rc = fuzz_write_file(path, buf, dirty < file_size ? dirty : file_size);
    if (rc == 0 && file_size > dirty && truncate(path, (off_t)file_size) != 0)
        rc = -errno;
    free(buf);
    return rc;
}

/* What peek.c gives the index. */
static void peek(void)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ctxs__peek p;
    if (ctxs__peek_fd(&p, fd) == 0) {
        uint64_t held = ctxs__peek_prefix_held(&p);
        uint32_t ids[64];
        uint64_t n = held < 64 ? held : 64;
        ctxs__peek_tokens(ids, fd, &p, 0, n);
        if (held > n)
            ctxs__peek_tokens(ids, fd, &p, held - n, n);
        uint64_t sum;
        if (p.st.n_tokens) {
            ctxs__peek_sum(&sum, fd, &p, p.st.n_tokens - 1);
            ctxs__peek_sum(&sum, fd, &p, 0);
        }
    }
    uint64_t id;
    char name[256];
    ctxs__label_read(fd, &id, name);
    close(fd);
}

/* One attention pass of layer 0 over the plan, when it is small. */
static void attend(const ctxs_session *s, const ctxs_session_info *info, uint32_t pending)
{
    ctxs_attn_plan plan;
    ctxs_layout lay;
    if (ctxs_session_get_attn_plan(&plan, s, pending) < 0 || ctxs_session_get_layout(&lay, s) < 0)
        return;
    const ctxs_geometry *g = &info->model.geometry;
    size_t per_query = (size_t)g->n_kv_heads * g->head_dim;
    uint64_t nq = plan.n_tokens - plan.first_query;
    if (per_query > 65536 || nq == 0 || nq > 4 || plan.n_keys > 4096)
        return;
    float *q = malloc(per_query * nq * sizeof(float));
    float *o = malloc(per_query * nq * sizeof(float));
    if (!q || !o)
        abort();
    for (size_t i = 0; i < per_query * nq; i++)
        q[i] = (float)((int)(i % 7) - 3) * 0.25f;
    ctxs_attn_query aq = { q, plan.first_query, (uint32_t)nq, g->n_kv_heads, 0.0f };
    float scale;
    ctxs_attention_check(&scale, &lay, &plan, 0, &aq);
    ctxs_attention(o, &lay, &plan, 0, &aq);
    free(q);
    free(o);
}

/* Everything a reader (or a writer) may call without changing the file. */
static void read_all(ctxs_session *s, uint32_t window)
{
    ctxs_session_info info;
    if (ctxs_session_get_info(&info, s) < 0)
        fail("info", -1);
    ctxs_layout lay;
    ctxs_session_get_layout(&lay, s);
    uint64_t bad;
    ctxs_session_verify(&bad, s);
    ctxs_session_verify_range(&bad, s, info.n_tokens / 2, info.n_tokens);

    const ctxs_geometry *g = &info.model.geometry;
    size_t token_bytes = ctxs_geometry_get_token_bytes(g, CTXS_DTYPE_F32);
    if (token_bytes <= (1u << 20)) {
        uint8_t *k = malloc(token_bytes), *v = malloc(token_bytes);
        if (!k || !v)
            abort();
        uint64_t n = info.n_tokens;
        uint64_t pos[] = { 0, 1, info.n_sink, info.ring_start, n / 2, n - 1, n, n + 1 };
        for (size_t i = 0; i < sizeof(pos) / sizeof(pos[0]); i++) {
            uint32_t slot;
            if (ctxs_session_get_slot(&slot, s, pos[i]) == 0 && slot >= info.capacity)
                fail("slot beyond the capacity", (int)slot);
            ctxs_session_read_token(k, v, s, pos[i], CTXS_DTYPE_F32);
            ctxs_session_read_token(k, v, s, pos[i], g->dtype);
        }
        free(k);
        free(v);
    }
    void *run;
    ctxs_session_get_kv(&run, s, g->n_layers - 1, CTXS_V, g->n_kv_heads - 1);

    ctxs_window w;
    ctxs_session_get_window(&w, s);
    ctxs_session_set_window(s, window);
    ctxs_session_get_window(&w, s);
    if (w.n_tokens > info.capacity)
        fail("window beyond the capacity", (int)w.n_tokens);
    attend(s, &info, 0);
    /* Memory pressure: the small window, and the pages outside it
     * released; then back. */
    ctxs_set_pressure(1);
    ctxs_session_get_window(&w, s);
    attend(s, &info, 0);
    ctxs_set_pressure(0);
    ctxs_session_set_window(s, 0);
    ctxs_session_prefetch(s);
}

/* Recovery's promise: every held token at or above the watermark an open
 * with CTXS_OPEN_VERIFY settled on verifies. */
static void check_recovered(const ctxs_session *s)
{
    ctxs_session_info info;
    ctxs_session_get_info(&info, s);
    uint64_t bad = 0;
    int rc = ctxs_session_verify_range(&bad, s, info.verified_from, UINT64_MAX);
    if (rc != 0) {
        fprintf(stderr, "session_open_fuzzer: after a verifying open, position %llu "
                        "(watermark %llu, n_tokens %llu) does not verify\n",
                (unsigned long long)bad, (unsigned long long)info.verified_from,
                (unsigned long long)info.n_tokens);
        abort();
    }
}

static void fork_it(ctxs_session *s, uint64_t n)
{
    ctxs_session *f = NULL;
    if (ctxs_session_fork(&f, s, fork_path, n, NULL) == 0) {
        uint64_t bad;
        ctxs_session_info fi;
        ctxs_session_get_info(&fi, f);
        /* The fork holds committed tokens that verified in the source's
         * state only as far as the source's checksums went; it must open
         * again and describe itself. */
        ctxs_session_verify(&bad, f);
        ctxs_session_close(f);
        ctxs_file_report rep;
        ctxs_file_inspect(&rep, fork_path);
        ctxs_session *again = NULL;
        if (ctxs_session_open(&again, fork_path, NULL, CTXS_RDONLY | CTXS_OPEN_VERIFY,
                              NULL) == 0) {
            check_recovered(again);
            ctxs_session_close(again);
        }
    }
    unlink(fork_path);
}

/* One token's K or V in the session's own form (for Q8: its int8
 * elements, then a scale per head), from i and salt. */
static void own_form(uint8_t *out, const ctxs_geometry *g, size_t elems, size_t i, int kind,
                     uint8_t salt)
{
    if (g->dtype == CTXS_DTYPE_Q8) {
        for (size_t e = 0; e < elems; e++)
            out[e] = (uint8_t)(e * (kind ? 5 : 3) + i + salt);
        float scale = kind ? 0.25f : 0.5f;
        for (size_t h = 0; h < elems / g->head_dim; h++)
            memcpy(out + elems + h * 4, &scale, 4);
        return;
    }
    for (size_t e = 0; e < elems; e++) {
        uint16_t x = kind ? (uint16_t)(0x3800 | ((e * 5 + i + salt) & 0x3ff))
                          : (uint16_t)(0x3c00 | ((e * 3 + i + salt) & 0x3ff));
        memcpy(out + e * 2, &x, 2);
    }
}

/* Appends n tokens in the session's own form and checks they read back
 * byte for byte. */
static void append(ctxs_session *s, uint32_t n, uint8_t salt)
{
    ctxs_session_info info;
    ctxs_session_get_info(&info, s);
    const ctxs_geometry *g = &info.model.geometry;
    size_t elems = (size_t)g->n_layers * g->n_kv_heads * g->head_dim;
    if (elems > (1u << 18))
        return;
    size_t tb = ctxs_geometry_get_token_bytes(g, g->dtype);
    uint8_t *k = malloc(tb * n), *v = malloc(tb * n), *rk = malloc(tb), *rv = malloc(tb);
    if (!tb || !k || !v || !rk || !rv)
        abort();
    uint32_t ids[4];
    ctxs_reservation r;
    int rc = ctxs_session_reserve(&r, s, n);
    if (rc == 0) {
        for (uint32_t i = 0; i < n; i++) {
            own_form(k + i * tb, g, elems, i, 0, salt);
            own_form(v + i * tb, g, elems, i, 1, salt);
            ids[i] = salt + i;
            if ((rc = ctxs_session_write_token(s, &r, i, k + i * tb, v + i * tb, g->dtype)) < 0)
                fail("write_token into a reservation", rc);
        }
        attend(s, &info, n);
        rc = ctxs_session_commit(s, ids, n);
        if (rc < 0 && rc != CTXS_EFAILED && rc != CTXS_EFULL)
            fail("commit of reserved tokens", rc);
        if (rc == 0) {
            uint64_t bad;
            if ((rc = ctxs_session_verify_range(&bad, s, r.first_pos, r.first_pos + n)) < 0)
                fail("new tokens do not verify", rc);
            /* A windowed layer holds its window only (older positions
             * read as zeros): the tokens every layer still holds read back
             * as written. */
            uint64_t narrowest = UINT64_MAX;
            for (uint32_t l = 0; l < g->n_layers; l++) {
                uint32_t w = ctxs_geometry_get_window(g, l);
                if (w && w < narrowest)
                    narrowest = w;
            }
            for (uint32_t i = 0; i < n; i++) {
                if ((rc = ctxs_session_read_token(rk, rv, s, r.first_pos + i, g->dtype)) < 0)
                    fail("read of a new token", rc);
                if (narrowest < n - i)
                    continue;
                if (memcmp(rk, k + i * tb, tb) || memcmp(rv, v + i * tb, tb))
                    fail("a new token reads back different", 0);
            }
        }
    }
    free(k);
    free(v);
    free(rk);
    free(rv);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > (1u << 20) + FUZZ_SESS_COMPACT_HEAD + 1)
        return 0;
    if (!path) {
        const char *dir = fuzz_scratch("session_open");
        path = fuzz_join(dir, "s.ctxs");
        fork_path = fuzz_join(dir, "f.ctxs");
    }
    int fds = fuzz_fd_count();
    uint8_t ctl = data[0];
    /* A few choices from the last byte, so that they mutate too. */
    uint8_t tail = data[size - 1];
    uint32_t window = 1u + (tail & 0x3fu);

    if (make_file(data, size) < 0) {
        unlink(path);
        fuzz_check_fds("session_open", fds);
        return 0;
    }

    ctxs_file_report rep;
    ctxs_file_inspect(&rep, path);
    peek();

    ctxs_session_info ro_info;
    int have_info = 0;
    for (int verify = 0; verify < 2; verify++) {
        ctxs_session *s = NULL;
        int rc = ctxs_session_open(&s, path, NULL,
                                   CTXS_RDONLY | (verify ? CTXS_OPEN_VERIFY : 0), NULL);
        fuzz_debug("session_open: read-only open%s: %s", verify ? " (verify)" : "",
                   ctxs_err_name(rc));
        if (rc < 0)
            continue;
        if (verify)
            check_recovered(s);
        read_all(s, window);
        ctxs_session_refresh(s);
        ctxs_session_get_info(&ro_info, s);
        have_info = 1;
        /* Read-only handles refuse writes. */
        ctxs_reservation r;
        if (ctxs_session_reserve(&r, s, 1) != CTXS_EREADONLY)
            fail("reserve on a read-only handle", 0);
        if (verify)
            fork_it(s, (tail & 0x40) ? ro_info.n_tokens / 2 : UINT64_MAX);
        ctxs_session_close(s);
    }

    if ((ctl & FUZZ_SESS_WRITE) && have_info) {
        ctxs_open_options o = CTXS_OPEN_OPTIONS_INIT;
        unsigned verify = (tail & 0x80) ? CTXS_OPEN_VERIFY : 0;
        o.durability = tail % 3;
        ctxs_session *w = NULL;
        ctxs_model other = ro_info.model;
        other.tokenizer_hash[0] ^= 1;
        if (ctxs_session_open(&w, path, &other, verify, &o) != CTXS_EMODEL)
            fail("open with another model", 0);
        int rc = ctxs_session_open(&w, path, &ro_info.model, verify, &o);
        fuzz_debug("session_open: read-write open: %s", ctxs_err_name(rc));
        if (rc == 0) {
            if (verify)
                check_recovered(w);
            read_all(w, window);
            append(w, 1 + (tail >> 6), tail);
            ctxs_session_info info;
            ctxs_session_get_info(&info, w);
            ctxs_session_rollback(w, info.n_tokens - (info.n_tokens > 0));
            ctxs_session_sync(w);
            append(w, 1, (uint8_t)(tail + 7));
            ctxs_session_close(w);

            /* What the writer left opens and verifies. */
            ctxs_session *s = NULL;
            if (ctxs_session_open(&s, path, NULL, CTXS_RDONLY | CTXS_OPEN_VERIFY, NULL) == 0) {
                check_recovered(s);
                ctxs_session_close(s);
            }
            uint64_t before, after;
            ctxs__session_compact(path, &before, &after);
        }
    }

    unlink(path);
    unlink(fork_path);
    fuzz_check_fds("session_open", fds);
    return 0;
}
