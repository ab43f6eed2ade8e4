/*
 * Writes the seed corpora, fuzz/corpus/<target>/seed-*, made with the real
 * library: small session files (commits, a wrapped ring, a rollback, a
 * fork, a label, a durable sync), export files, index records over the
 * sample store, and command lines; then a few hostile inputs of each kind.
 *
 *     make_seeds OUTDIR       (OUTDIR is usually fuzz/corpus)
 *
 * Existing seed-* files are replaced; other files (what fuzzing found) are
 * left alone.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "export_format.h"
#include "format.h"
#include "fuzz.h"
#include "index.h"
#include "lmdb_layout.h"

static const char *out_root;
static char *work;

static void die(const char *what, int rc)
{
    fprintf(stderr, "make_seeds: %s: %s (%d)\n", what, ctxs_strerror(rc), rc);
    exit(1);
}

static void seed(const char *target, const char *name, const void *data, size_t len)
{
    char *d = fuzz_join(out_root, target);
    mkdir(d, 0755);
    char file[512];
    snprintf(file, sizeof(file), "%s/seed-%s", d, name);
    int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || write(fd, data, len) != (ssize_t)len || close(fd) != 0)
        die(file, -errno);
    free(d);
}

static uint8_t *slurp(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0)
        die(path, -errno);
    uint8_t *buf = malloc((size_t)sb.st_size + 1);
    if (!buf || read(fd, buf, (size_t)sb.st_size) != sb.st_size)
        die(path, -EIO);
    close(fd);
    *len = (size_t)sb.st_size;
    return buf;
}

/* A model with a layer schedule (format 3.0): 3 layers, pattern [global,
 * window 3, window 5], so two windowed groups of rings beside the session's
 * slots. */
static ctxs_model schedule_model(uint32_t dtype)
{
    ctxs_model m = fuzz_model(2);
    m.geometry = (ctxs_geometry){ 3, 2, 4, dtype, 3, { 0, 3, 5 } };
    m.model_hash[15] ^= (uint8_t)dtype;
    return m;
}

#define SCHEDULE_BATCH 4u

/* Appends n tokens in turns of the batch, the most a windowed session
 * takes between commits. */
static void append_batches(ctxs_session *s, uint64_t n)
{
    for (uint64_t done = 0; done < n; done += SCHEDULE_BATCH) {
        int rc = fuzz_append(s, n - done < SCHEDULE_BATCH ? n - done : SCHEDULE_BATCH);
        if (rc < 0)
            die("append to a windowed session", rc);
    }
}

static ctxs_create_options schedule_options(uint32_t capacity, uint32_t n_sink, uint32_t ring)
{
    ctxs_create_options o = fuzz_options(capacity, n_sink, ring);
    o.batch = SCHEDULE_BATCH;
    return o;
}

/* --- session_open ------------------------------------------------------- */

static void session_seed(const char *name, const char *path, uint8_t ctl)
{
    uint8_t *buf;
    size_t len;
    int rc = fuzz_session_encode(&buf, &len, path, ctl);
    if (rc < 0)
        die(path, rc);
    seed("session_open", name, buf, len);
    free(buf);
}

static ctxs_session *create_dtype(const char *path, ctxs_create_options o, uint32_t dtype)
{
    ctxs_model m = fuzz_model(0);
    m.geometry.dtype = dtype;
    ctxs_session *s;
    unlink(path);
    int rc = ctxs_session_create(&s, path, &m, &o);
    if (rc < 0)
        die(path, rc);
    return s;
}

static ctxs_session *create(const char *path, ctxs_create_options o)
{
    return create_dtype(path, o, CTXS_DTYPE_F16);
}

/* Sets n_tokens, ring_start and verified_from in both commit records of
 * a compact-form seed (records at 256 and 384 after the control byte). */
static void records_claim(uint8_t *in, uint64_t n, uint64_t ring_start, uint64_t verified_from)
{
    for (int r = 0; r < 2; r++) {
        uint8_t *rec = in + 1 + 256 + 128 * r;
        memcpy(rec + 16, &n, 8);
        memcpy(rec + 24, &ring_start, 8);
        memcpy(rec + 32, &verified_from, 8);
    }
}

/* Bounded work: commit records whose CRCs hold (the control
 * byte recomputes them) and whose claims are extreme, n_tokens at the top
 * of the range, ring_start and verified_from near it or past 2^64 - 2,
 * while what the file can hold is 16 slots. Every operation on them must
 * cost what the file holds; the replay driver's time budget makes a slow
 * one a failure. */
static void extreme_record_seeds(void)
{
    const uint8_t E = FUZZ_SESS_EXTEND, W = FUZZ_SESS_WRITE, R = FUZZ_SESS_FIX_RECORDS;
    char *p = fuzz_join(work, "x.ctxs");
    ctxs_session *s = create(p, fuzz_options(16, 2, 1)); /* a ring: 2 sinks, 14 recent */
    int rc;
    if ((rc = fuzz_append(s, 45)) < 0)
        die("append", rc);
    ctxs_session_close(s);
    uint8_t *buf, *in;
    size_t len;
    if ((rc = fuzz_session_encode(&buf, &len, p, E | W)) < 0)
        die(p, rc);
    if (!(in = malloc(len)))
        die("malloc", CTXS_ENOMEM);
    const uint64_t N = (1ull << 62) - 1; /* the largest n_tokens a record may claim */
    static const struct {
        const char *name;
        uint8_t extra;
        uint64_t n_off, ring_off, verified; /* n = N - n_off, ring_start = n - ring_off */
    } cases[] = {
        {"extreme-ring-full", 0, 0, 14, 0},                      /* verify all it holds */
        {"extreme-ring-full-sums", FUZZ_SESS_FIX_SUMS, 0, 14, 0}, /* ... and they verify */
        {"extreme-ring-verified-top", 0, 0, 14, N - 1},
        {"extreme-ring-this-boot", FUZZ_SESS_THIS_BOOT, 0, 14, N - 14},
        {"extreme-ring-sinks-only", 0, 0, 0, 0},                 /* ring_start = n */
        {"extreme-ring-one-held", FUZZ_SESS_FIX_SUMS, 1, 1, 0},
        {"extreme-verified-past-2-64", 0, 0, 14, UINT64_MAX - 1}, /* refused */
        {"extreme-ring-start-past-2-64", 0, 0, 0, 0},             /* refused, below */
        {"extreme-n-past-range", 0, 0, 14, 0},                    /* refused, below */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memcpy(in, buf, len);
        uint64_t n = N - cases[i].n_off;
        uint64_t ring = n - cases[i].ring_off;
        if (strcmp(cases[i].name, "extreme-ring-start-past-2-64") == 0)
            ring = UINT64_MAX - 1;
        if (strcmp(cases[i].name, "extreme-n-past-range") == 0)
            n = UINT64_MAX - 1, ring = n - 14;
        records_claim(in, n, ring, cases[i].verified);
        in[0] = E | W | R | cases[i].extra;
        seed("session_open", cases[i].name, in, len);
    }
    free(in);
    free(buf);
    unlink(p);
    free(p);
}

static void session_seeds(void)
{
    const uint8_t E = FUZZ_SESS_EXTEND, W = FUZZ_SESS_WRITE;
    char *p = fuzz_join(work, "s.ctxs"), *f = fuzz_join(work, "f.ctxs");
    ctxs_session *s, *fk;
    int rc;

    s = create(p, fuzz_options(8, 2, 1));
    ctxs_session_close(s);
    session_seed("empty-ring", p, E | W);

    s = create(p, fuzz_options(64, 4, 0));
    if ((rc = fuzz_append(s, 20)) < 0)
        die("append", rc);
    unlink(f);
    if ((rc = ctxs_session_fork(&fk, s, f, 10, NULL)) < 0)
        die("fork", rc);
    ctxs_session_close(fk);
    ctxs_session_close(s);
    session_seed("tokens", p, E | W);
    session_seed("fork", f, E | W);

    s = create(p, fuzz_options(16, 2, 1));
    if ((rc = fuzz_append(s, 45)) < 0)
        die("append", rc);
    ctxs_session_close(s);
    session_seed("wrapped", p, E | W);
    session_seed("wrapped-this-boot", p, E | W | FUZZ_SESS_THIS_BOOT);

    s = create(p, fuzz_options(32, 4, 1));
    if ((rc = fuzz_append(s, 30)) < 0 || (rc = ctxs_session_rollback(s, 12)) < 0 ||
        (rc = fuzz_append(s, 3)) < 0)
        die("rollback", rc);
    ctxs_session_close(s);
    session_seed("rolled-back", p, E | W);

    ctxs_create_options o = fuzz_options(32, 1, 1);
    o.open.durability = CTXS_SYNC_FULL;
    s = create(p, o);
    if ((rc = fuzz_append(s, 9)) < 0 || (rc = ctxs_session_sync(s)) < 0)
        die("sync", rc);
    ctxs_session_close(s);
    session_seed("synced", p, E | W);
    session_seed("synced-fix-all", p,
                 E | W | FUZZ_SESS_FIX_HEADER | FUZZ_SESS_FIX_RECORDS | FUZZ_SESS_FIX_LABEL |
                     FUZZ_SESS_FIX_SUMS);

    /* The other dtypes (format 2.0): bf16, and Q8 with its scale table,
     * wrapped so that the scales of the ring's slots are rewritten. */
    s = create_dtype(p, fuzz_options(16, 2, 1), CTXS_DTYPE_BF16);
    if ((rc = fuzz_append(s, 20)) < 0)
        die("append bf16", rc);
    ctxs_session_close(s);
    session_seed("bf16", p, E | W);
    s = create_dtype(p, fuzz_options(16, 2, 1), CTXS_DTYPE_Q8);
    if ((rc = fuzz_append(s, 25)) < 0)
        die("append q8", rc);
    ctxs_session_close(s);
    session_seed("q8-wrapped", p, E | W);
    session_seed("q8-fix-sums", p, E | W | FUZZ_SESS_FIX_SUMS);

    /* Layer schedules (3.0): rings of 7 and 9 slots that wrapped several
     * times, in fp16 and Q8 (whose scale table has the rings' runs), one
     * rolled back into its rings. */
    ctxs_model sm = schedule_model(CTXS_DTYPE_F16);
    ctxs_create_options so = schedule_options(32, 2, 0);
    unlink(p);
    if ((rc = ctxs_session_create(&s, p, &sm, &so)) < 0)
        die("create windowed", rc);
    append_batches(s, 30);
    ctxs_session_close(s);
    session_seed("schedule", p, E | W);
    session_seed("schedule-fix-sums", p, E | W | FUZZ_SESS_FIX_SUMS);
    session_seed("schedule-this-boot", p, E | W | FUZZ_SESS_THIS_BOOT);
    sm = schedule_model(CTXS_DTYPE_Q8);
    so = schedule_options(16, 2, 1);
    unlink(p);
    if ((rc = ctxs_session_create(&s, p, &sm, &so)) < 0)
        die("create windowed q8", rc);
    append_batches(s, 41);
    ctxs_session_close(s);
    session_seed("schedule-q8-ring", p, E | W);
    sm = schedule_model(CTXS_DTYPE_F16);
    so = schedule_options(64, 2, 0);
    unlink(p);
    if ((rc = ctxs_session_create(&s, p, &sm, &so)) < 0)
        die("create windowed", rc);
    append_batches(s, 20);
    if ((rc = ctxs_session_rollback(s, 18)) < 0)
        die("rollback windowed", rc);
    append_batches(s, 3);
    ctxs_session_close(s);
    session_seed("schedule-rolled-back", p, E | W);

    /* A labeled file with two prefix chunks: the sample store's "a". */
    char *store = fuzz_join(work, "store");
    fuzz_rmtree(store);
    if ((rc = fuzz_build_store(store)) < 0)
        die("sample store", rc);
    ctxs_store *st;
    ctxs_session_entry e;
    if ((rc = ctxs_store_open(&st, store, CTXS_STORE_CREATE, NULL)) < 0 ||
        (rc = ctxs_store_session_get(&e, st, "a")) < 0)
        die("sample store", rc);
    ctxs_store_close(st);
    char file[64];
    ctxs__file_name(file, e.id);
    char *sessions = fuzz_join(store, "sessions");
    char *a = fuzz_join(sessions, file);
    session_seed("labeled", a, E | W | FUZZ_SESS_FIX_SUMS);

    /* Hostile ones, from the tokens file: a header claiming a huge
     * geometry (with its CRC and offsets right), a newer version, both
     * records damaged, counters out of range. */
    s = create(p, fuzz_options(64, 4, 0));
    if ((rc = fuzz_append(s, 5)) < 0)
        die("append", rc);
    ctxs_session_close(s);
    uint8_t *buf;
    size_t len;
    if ((rc = fuzz_session_encode(&buf, &len, p, E | W)) < 0)
        die(p, rc);
    uint8_t *copy = malloc(len);
    ctxs__disk_header h;
    ctxs__file_layout lay;
    static const ctxs_geometry huge[] = { { 4096, 4096, 4096, 1, 0, {0} }, { 64, 8, 128, 1, 0, {0} },
                                          { 1, 1, 1, 1, 0, {0} } };
    static const uint32_t caps[] = { 16777216, 131072, 2 };
    for (int i = 0; i < 3; i++) {
        memcpy(copy, buf, len);
        memcpy(&h, copy + 1, sizeof(h));
        ctxs_model m;
        memset(&m, 0, sizeof(m));
        m.geometry = huge[i];
        memcpy(m.model_hash, h.model_hash, 16);
        memcpy(m.tokenizer_hash, h.tokenizer_hash, 16);
        if (ctxs__layout_compute(&lay, &huge[i], caps[i], 1, 0) < 0) {
            /* Too big to be a file: claim it anyway, sizes wrapped. */
            h.n_layers = huge[i].n_layers;
            h.n_kv_heads = huge[i].n_kv_heads;
            h.head_dim = huge[i].head_dim;
            h.capacity = caps[i];
            h.kv_bytes = UINT64_MAX - 16383;
            h.file_bytes = h.kv_bytes + h.kv_off;
        } else {
            ctxs__header_init(&h, &lay, &m, 0, h.created_unix_ms);
        }
        memcpy(copy + 1, &h, sizeof(h));
        copy[0] = FUZZ_SESS_FIX_HEADER | E | W;
        char nm[32];
        snprintf(nm, sizeof(nm), "hostile-huge-%d", i);
        seed("session_open", nm, copy, len);
    }
    memcpy(copy, buf, len);
    copy[1 + 8] = 3; /* version_major 3 */
    seed("session_open", "hostile-version", copy, len);
    memcpy(copy, buf, len);
    copy[1 + 256 + 20] ^= 1; /* record 0's n_tokens */
    copy[1 + 384 + 20] ^= 1;
    seed("session_open", "hostile-records", copy, len);
    memcpy(copy, buf, len);
    uint64_t big = UINT64_MAX;
    memcpy(copy + 1 + 256 + 8, &big, 8);      /* seq */
    memcpy(copy + 1 + 384 + 24, &big, 8);     /* ring_start */
    copy[0] = E | W | FUZZ_SESS_FIX_RECORDS;
    seed("session_open", "hostile-counters", copy, len);
    memcpy(copy, buf, len);
    memset(copy + 1 + FUZZ_SESS_COMPACT_HEAD + 16384 * 2, 0x5a, 64); /* KV */
    copy[0] = E | W;
    seed("session_open", "hostile-kv", copy, len);
    seed("session_open", "hostile-short", "\x80" "CTXSSES", 8);
    extreme_record_seeds();
    seed("session_open", "hostile-header-only", copy, 1 + 256);
    free(copy);
    free(buf);
    free(a);
    free(sessions);
    free(store);
    free(p);
    free(f);
}

/* --- import ------------------------------------------------------------- */

/* The import target's input for session name of st: control byte 0, then
 * its export file (*len bytes in all). */
static uint8_t *export_input(ctxs_store *st, const char *name, size_t *len)
{
    char *path = fuzz_join(work, "x.exp");
    unlink(path);
    int rc = ctxs_store_session_export(st, name, path, NULL);
    if (rc < 0)
        die("export", rc);
    size_t file_len;
    uint8_t *file = slurp(path, &file_len);
    uint8_t *in = malloc(file_len + 1);
    in[0] = 0;
    memcpy(in + 1, file, file_len);
    *len = file_len + 1;
    free(file);
    unlink(path);
    free(path);
    return in;
}

static void import_seeds(void)
{
    char *store = fuzz_join(work, "store");
    ctxs_store *st;
    int rc;
    if ((rc = ctxs_store_open(&st, store, CTXS_STORE_CREATE, NULL)) < 0)
        die("sample store", rc);
    static const char *names[] = { "a", "b", "c", "d" };
    static const uint8_t ctls[] = { 0x00, 0x01, 0x0a, 0x10 };
    uint8_t *a = NULL;
    size_t a_len = 0;
    for (int i = 0; i < 4; i++) {
        size_t len;
        uint8_t *in = export_input(st, names[i], &len);
        in[0] = ctls[i];
        char nm[32];
        snprintf(nm, sizeof(nm), "export-%s", names[i]);
        seed("import", nm, in, len);
        if (i == 0) {
            a = in;
            a_len = len;
        } else {
            free(in);
        }
    }
    /* A Q8 session, whose blocks carry scales, from a store of its own
     * (the sample store stays as fuzz_common.c describes it). */
    ctxs_model q8 = fuzz_model(0);
    q8.geometry.dtype = CTXS_DTYPE_Q8;
    q8.model_hash[15] ^= 0x80;
    char *q8_store = fuzz_join(work, "q8-store");
    fuzz_rmtree(q8_store);
    ctxs_store *st8;
    ctxs_session *s = NULL;
    if ((rc = ctxs_store_open(&st8, q8_store, CTXS_STORE_CREATE, NULL)) < 0 ||
        (rc = ctxs_model_register(st8, &q8, "tiny-q8")) < 0 ||
        (rc = ctxs_store_session_create(&s, st8, "q8", &q8, NULL)) < 0 ||
        (rc = fuzz_append(s, 30)) < 0)
        die("q8 session", rc);
    ctxs_session_close(s);
    size_t q8_len;
    uint8_t *q8_in = export_input(st8, "q8", &q8_len);
    ctxs_store_close(st8);
    fuzz_rmtree(q8_store);
    free(q8_store);
    seed("import", "export-q8", q8_in, q8_len);
    free(q8_in);
    /* Sessions with a layer schedule (export 3.0, with the rings' group
     * blocks), fp16 and Q8, from a store of their own. */
    static const uint32_t sched_dtypes[] = { CTXS_DTYPE_F16, CTXS_DTYPE_Q8 };
    for (int i = 0; i < 2; i++) {
        ctxs_model sm = schedule_model(sched_dtypes[i]);
        ctxs_create_options so = schedule_options(32, 2, i);
        char *sched_store = fuzz_join(work, "schedule-store");
        fuzz_rmtree(sched_store);
        ctxs_store *sts;
        s = NULL;
        if ((rc = ctxs_store_open(&sts, sched_store, CTXS_STORE_CREATE, NULL)) < 0 ||
            (rc = ctxs_model_register(sts, &sm, "tiny-windowed")) < 0 ||
            (rc = ctxs_store_session_create(&s, sts, "w", &sm, &so)) < 0)
            die("windowed session", rc);
        append_batches(s, i ? 45 : 27);
        ctxs_session_close(s);
        size_t w_len;
        uint8_t *w_in = export_input(sts, "w", &w_len);
        ctxs_store_close(sts);
        fuzz_rmtree(sched_store);
        free(sched_store);
        seed("import", i ? "export-schedule-q8-ring" : "export-schedule", w_in, w_len);
        if (i == 0) {
            /* The last block (a group's) claims other positions, its CRCs
             * fixed. */
            size_t off = 1 + sizeof(ctxs__export_header), last = 0;
            ctxs__export_block b;
            while (off + sizeof(b) <= w_len && memcmp(w_in + off, "CXBK", 4) == 0) {
                memcpy(&b, w_in + off, sizeof(b));
                last = off;
                off += sizeof(b) + b.comp_bytes;
            }
            if (!last)
                die("export windowed: no block", CTXS_ECORRUPT);
            w_in[0] = 0x01;
            w_in[last + offsetof(ctxs__export_block, first_pos)] ^= 0x01;
            seed("import", "hostile-schedule-block", w_in, w_len);
        }
        free(w_in);
    }
    ctxs_store_close(st);
    free(store);
    /* Hostile: truncated, trailing bytes, a newer version, a damaged
     * block with its CRCs right, foreign, a stub of the magic. */
    seed("import", "hostile-truncated", a, a_len / 2);
    uint8_t *more = malloc(a_len + 3);
    memcpy(more, a, a_len);
    memcpy(more + a_len, "xyz", 3);
    seed("import", "hostile-trailing", more, a_len + 3);
    memcpy(more, a, a_len);
    more[1 + offsetof(ctxs__export_header, version_major)] = CTXS__EXPORT_MAJOR + 1;
    seed("import", "hostile-version", more, a_len);
    memcpy(more, a, a_len);
    more[0] = 0x01; /* CRCs fixed, a token's bytes changed */
    more[1 + sizeof(ctxs__export_header) + sizeof(ctxs__export_block) + 20] ^= 0x55;
    seed("import", "hostile-block", more, a_len);
    memcpy(more, a, a_len);
    uint32_t v = 0xffffffffu;
    memcpy(more + 1 + offsetof(ctxs__export_header, capacity), &v, 4);
    more[0] = 0x01;
    seed("import", "hostile-capacity", more, a_len);
    memcpy(more, a, a_len);
    more[0] = 0x04; /* under the file's name, which the store has */
    seed("import", "name-taken", more, a_len);
    seed("import", "hostile-foreign", "\x00" "PK\x03\x04", 5);
    seed("import", "hostile-stub", "\x00" "CTXSEX", 7);
    free(more);
    free(a);
}

/* --- index_records -------------------------------------------------------- */

typedef struct rec_buf {
    uint8_t b[8192];
    size_t n;
} rec_buf;

enum { T_META, T_SESSIONS, T_IDS, T_MODELS, T_FILEHASH, T_CHECKPOINTS, T_PREFIXES, T_CHUNKS,
       T_PENDING };

static void rec_start(rec_buf *r, unsigned ops)
{
    r->b[0] = (uint8_t)ops;
    r->b[1] = (uint8_t)(ops >> 8);
    r->n = 2;
}

static void rec_put(rec_buf *r, int table, const void *k, size_t klen, const void *v, size_t vlen)
{
    r->b[r->n++] = (uint8_t)table;
    r->b[r->n++] = (uint8_t)klen;
    uint16_t vl = (uint16_t)vlen;
    memcpy(r->b + r->n, &vl, 2);
    r->n += 2;
    memcpy(r->b + r->n, k, klen);
    r->n += klen;
    if (vlen != 0xffff) {
        memcpy(r->b + r->n, v, vlen);
        r->n += vlen;
    }
}

static void index_seeds(void)
{
    char *store = fuzz_join(work, "store");
    ctxs_store *st;
    int rc;
    if ((rc = ctxs_store_open(&st, store, CTXS_STORE_CREATE, NULL)) < 0)
        die("sample store", rc);
    uint64_t ids[4];
    static const char *names[] = { "a", "b", "c", "d" };
    for (int i = 0; i < 4; i++) {
        ctxs_session_entry e;
        if ((rc = ctxs_store_session_get(&e, st, names[i])) < 0)
            die("session", rc);
        ids[i] = e.id;
    }
    /* The sample's own records, to mutate. */
    MDB_txn *txn;
    mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn);
    MDB_val k = { 1, (void *)"a" }, v;
    ctxs__session_rec a;
    if (mdb_get(txn, st->sessions, &k, &v) != 0 || v.mv_size != sizeof(a))
        die("session record", CTXS_ECORRUPT);
    memcpy(&a, v.mv_data, sizeof(a));
    ctxs_model m0 = fuzz_model(0);
    k = (MDB_val){ 16, m0.model_hash };
    uint8_t model_rec[64 + 255];
    size_t model_len;
    if (mdb_get(txn, st->models, &k, &v) != 0 || v.mv_size > sizeof(model_rec))
        die("model record", CTXS_ECORRUPT);
    memcpy(model_rec, v.mv_data, v.mv_size);
    model_len = v.mv_size;
    mdb_txn_abort(txn);
    ctxs_store_close(st);
    free(store);

    uint8_t id_key[4][8];
    for (int i = 0; i < 4; i++)
        ctxs__id_key(id_key[i], ids[i]);
    uint32_t tokens[128];
    fuzz_sample_tokens(tokens, 128);
    uint8_t chain[2][16];
    ctxs__prefix_chains(chain, tokens, 2);
    uint8_t pkey[32];
    memcpy(pkey, m0.model_hash, 16);
    memcpy(pkey + 16, chain[0], 16);

    rec_buf r;
    char nm[64];
    /* Every operation alone, and all of them, over the sample's records. */
    for (int bit = 0; bit < 15; bit++) {
        rec_start(&r, 1u << bit);
        snprintf(nm, sizeof(nm), "op-%02d", bit);
        seed("index_records", nm, r.b, r.n);
    }
    rec_start(&r, 0x7fff);
    seed("index_records", "op-all", r.b, r.n);

    const unsigned reads = 0x1 | 0x2 | 0x4 | 0x8 | 0x10 | 0x40 | 0x1000;
    ctxs__session_rec h = a;
    h.n_tokens = 1ull << 62;
    h.prefix_tokens = 1ull << 40;
    h.disk_bytes = UINT64_MAX;
    rec_start(&r, reads | 0x20);
    rec_put(&r, T_SESSIONS, "a", 1, &h, sizeof(h));
    seed("index_records", "session-huge-counts", r.b, r.n);

    rec_start(&r, reads);
    rec_put(&r, T_SESSIONS, "a", 1, &a, 10);
    seed("index_records", "session-short", r.b, r.n);

    h = a;
    h.id = 99;
    rec_start(&r, reads | 0x80);
    rec_put(&r, T_SESSIONS, "zz", 2, &h, sizeof(h));
    uint8_t k99[8];
    ctxs__id_key(k99, 99);
    rec_put(&r, T_IDS, k99, 8, "zz", 2);
    seed("index_records", "session-no-file", r.b, r.n);

    h = a;
    h.id = ids[2]; /* "c"'s file, of model 1 */
    rec_start(&r, reads | 0x200 | 0x800);
    rec_put(&r, T_SESSIONS, "a", 1, &h, sizeof(h));
    seed("index_records", "session-other-file", r.b, r.n);

    char long_name[300];
    memset(long_name, 'x', sizeof(long_name));
    rec_start(&r, reads | 0x8);
    rec_put(&r, T_IDS, id_key[0], 8, long_name, sizeof(long_name));
    rec_put(&r, T_IDS, id_key[1], 8, "", 0);
    seed("index_records", "ids-bad-names", r.b, r.n);

    uint8_t m[64 + 255];
    memcpy(m, model_rec, model_len);
    uint16_t name_len = 300;
    memcpy(m + 40, &name_len, 2);
    rec_start(&r, reads | 0x1000);
    rec_put(&r, T_MODELS, m0.model_hash, 16, m, model_len);
    seed("index_records", "model-name-len", r.b, r.n);
    rec_start(&r, reads);
    rec_put(&r, T_MODELS, m0.model_hash, 16, m, 20);
    seed("index_records", "model-short", r.b, r.n);
    memcpy(m, model_rec, model_len);
    memset(m, 0, 16); /* geometry 0 */
    rec_start(&r, reads | 0x200);
    rec_put(&r, T_MODELS, m0.model_hash, 16, m, model_len);
    seed("index_records", "model-geometry", r.b, r.n);

    /* Model records with a layer schedule (flags bit 0, then u32 period,
     * u32 window[8] after the name): one that holds, one whose schedule
     * breaks the rules, and one whose flag promises bytes that are not
     * there. */
    uint8_t ms[64 + 255 + CTXS__MODEL_SCHEDULE_BYTES];
    uint32_t sched[1 + 8] = { 1, 3 };
    memcpy(ms, model_rec, model_len);
    ms[offsetof(ctxs__model_rec, flags)] |= CTXS__MODEL_SCHEDULE;
    memcpy(ms + model_len, sched, sizeof(sched));
    rec_start(&r, reads | 0x200 | 0x1000);
    rec_put(&r, T_MODELS, m0.model_hash, 16, ms, model_len + sizeof(sched));
    seed("index_records", "model-schedule", r.b, r.n);
    sched[0] = 9;
    sched[8] = 7;
    memcpy(ms + model_len, sched, sizeof(sched));
    rec_start(&r, reads | 0x200 | 0x1000);
    rec_put(&r, T_MODELS, m0.model_hash, 16, ms, model_len + sizeof(sched));
    seed("index_records", "model-schedule-bad", r.b, r.n);
    rec_start(&r, reads | 0x1000);
    rec_put(&r, T_MODELS, m0.model_hash, 16, ms, model_len + 10);
    seed("index_records", "model-schedule-short", r.b, r.n);

    uint8_t ck[8 + 3];
    memcpy(ck, id_key[0], 8);
    memcpy(ck + 8, "cp0", 3);
    ctxs__checkpoint_rec cp = { 1ull << 63, 0, 0 };
    rec_start(&r, reads | 0x800 | 0x4000);
    rec_put(&r, T_CHECKPOINTS, ck, sizeof(ck), &cp, sizeof(cp));
    seed("index_records", "checkpoint-huge", r.b, r.n);
    rec_start(&r, reads | 0x800 | 0x4000);
    rec_put(&r, T_CHECKPOINTS, ck, sizeof(ck), &cp, 5);
    rec_put(&r, T_CHECKPOINTS, id_key[0], 8, &cp, sizeof(cp)); /* no name */
    seed("index_records", "checkpoint-short", r.b, r.n);

    rec_start(&r, reads | 0x40);
    rec_put(&r, T_PREFIXES, pkey, 32, k99, 8);
    rec_put(&r, T_PREFIXES, pkey, 32, id_key[2], 8);
    rec_put(&r, T_PREFIXES, pkey, 31, id_key[3], 8);
    seed("index_records", "prefixes-hostile", r.b, r.n);

    uint8_t chk[12];
    memcpy(chk, id_key[0], 8);
    memcpy(chk + 8, "\x00\x00\x00\x01", 4);
    rec_start(&r, reads | 0x40 | 0x400);
    rec_put(&r, T_CHUNKS, chk, 12, "abc", 3);
    memcpy(chk + 8, "\xff\xff\xff\xff", 4);
    rec_put(&r, T_CHUNKS, chk, 12, chain[1], 16);
    seed("index_records", "chunks-hostile", r.b, r.n);

    uint8_t k5[8];
    ctxs__id_key(k5, 5);
    rec_start(&r, 0x1 | 0x2000);
    rec_put(&r, T_PENDING, id_key[1], 8, "D", 1);
    rec_put(&r, T_PENDING, k5, 8, "C", 1);
    rec_put(&r, T_PENDING, id_key[2], 8, "X", 1);
    seed("index_records", "pending-intents", r.b, r.n);

    uint8_t fmt[16] = "CTXSINDX";
    fmt[8] = 2;
    rec_start(&r, 0x1 | 0x2000);
    rec_put(&r, T_META, "format", 6, fmt, 16);
    seed("index_records", "meta-newer", r.b, r.n);
    rec_start(&r, 0x1 | 0x2000);
    rec_put(&r, T_META, "format", 6, fmt, 3);
    seed("index_records", "meta-short", r.b, r.n);
    rec_start(&r, 0x1 | 0x2000);
    rec_put(&r, T_META, "format", 6, NULL, 0xffff);
    seed("index_records", "meta-deleted", r.b, r.n);
    uint64_t zero = 0;
    rec_start(&r, 0x1 | 0x200 | 0x80);
    rec_put(&r, T_META, "next_id", 7, &zero, 8);
    seed("index_records", "meta-next-id", r.b, r.n);

    uint8_t fh[40] = { 1 };
    rec_start(&r, 0x1 | 0x100);
    rec_put(&r, T_FILEHASH, fh, 40, "abc", 3);
    seed("index_records", "filehash-short", r.b, r.n);
}

/* --- cli -------------------------------------------------------------------- */

static void cli_seeds(void)
{
#define L(x) { x, sizeof(x) - 1 }
    static const struct { const char *s; size_t n; } lines[] = {
        L("ls"), L("ls\0--json"), L("--json\0ls"), L("info\0a"), L("info\0b\0--json"),
        L("info\0nope"), L("verify"), L("verify\0--all\0--json"), L("verify\0b"),
        L("compact\0a"), L("compact\0--all\0--json"), L("gc\0--max-size\0" "100K"),
        L("gc\0--max-size\0" "1.5G\0--json"), L("gc\0--max-size=0"),
        L("gc\0--max-size\0" "12QB"), L("rm\0c\0d"), L("rm\0nope"), L("fork\0a\0e"),
        L("fork\0a\0e\0--at\0" "64"), L("fork\0a\0e\0--checkpoint\0cp0"),
        L("fork\0b\0e\0--at\0" "99999999999999999999"), L("checkpoint\0create\0a\0new"),
        L("checkpoint\0ls\0a\0--json"), L("checkpoint\0restore\0a\0cp0"),
        L("checkpoint\0rm\0a\0cp1"), L("checkpoint\0bogus"), L("reindex"),
        L("reindex\0--json"), L("export\0a\0out.exp"), L("export\0b\0x.exp"),
        L("import\0x.exp"), L("import\0x.exp\0new\0--json"), L("import\0junk"),
        L("import\0store"), L("help\0fork"), L("--help"), L("--version"), L("info\0--help"),
        L("--store\0other\0ls"), L("--store=store\0info\0a"), L("nosuchcommand"), L(""),
        L("rename\0a\0z"), L("rename\0a\0b\0--json"), L("rename\0nope\0z"),
        L("rename\0a\0a/b"), L("models"), L("models\0ls\0--json"),
        L("models\0register\0x.exp\0--name\0w\0--layers\0" "1\0--kv-heads\0" "2\0--head-dim\0"
          "4\0--tokenizer\0junk\0--json"),
        L("models\0register\0junk\0--name\0w\0--layers\0" "4096\0--kv-heads\0" "4096\0"
          "--head-dim\0" "4096\0--tokenizer-hash\0" "909192939495969798999a9b9c9d9e9f"),
        L("models\0register\0store\0--name\0w\0--layers\0" "1\0--kv-heads\0" "1\0--head-dim\0" "1"),
        L("prefix\0--model\0" "404142434445464748494a4b4c4d4e4f\0" "1 2\0" "3"),
        L("prefix\0--model\0tiny\0--tokens-file\0junk"),
        L("prefix\0--model\0tiny\0--tokens-file\0x.exp\0--json"),
    };
#undef L
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++) {
        char nm[32];
        snprintf(nm, sizeof(nm), "argv-%02zu", i);
        seed("cli", nm, lines[i].s, lines[i].n);
    }
    /* The first chunk and a half of session a's ids: a prefix that the
     * sample store finds. */
    static const char start[] = "prefix\0--json\0--model\0tiny\0";
    char line[1024];
    size_t n = sizeof(start) - 1;
    memcpy(line, start, n);
    for (uint64_t pos = 0; pos < 100; pos++)
        n += (size_t)snprintf(line + n, sizeof(line) - n, "%s%u", pos ? " " : "", fuzz_token(pos));
    seed("cli", "argv-prefix-a", line, n);
}

/* --- index_file -------------------------------------------------------------- */

/* The meta LMDB uses in the image of psize-byte pages: its page. */
static int meta_page(const uint8_t *img, size_t psize, lmdb_meta *m)
{
    lmdb_meta_page a, b;
    memcpy(&a, img, sizeof(a));
    memcpy(&b, img + psize, sizeof(b));
    int page = b.meta.txnid > a.meta.txnid;
    *m = page ? b.meta : a.meta;
    return page;
}

static void index_file_seed(const char *name, uint8_t ctl, const uint8_t *img, size_t len)
{
    uint8_t *in = malloc(len + 1);
    if (!in)
        die("memory", CTXS_ENOMEM);
    in[0] = ctl;
    memcpy(in + 1, img, len);
    seed("index_file", name, in, len + 1);
    free(in);
}

/* The first node of a leaf page (in a page numbering itself) whose flags
 * are nflags: its offset in the image, or 0. */
static size_t leaf_node(const uint8_t *img, size_t len, size_t psize, unsigned nflags)
{
    for (size_t pg = 2; pg < len / psize; pg++) {
        lmdb_page_head h;
        memcpy(&h, img + pg * psize, sizeof(h));
        if (h.pgno != pg || h.flags != LMDB_P_LEAF)
            continue;
        for (unsigned i = 0; i < (h.u.b.lower - (unsigned)LMDB_PAGE_HEAD) / 2; i++) {
            uint16_t off;
            memcpy(&off, img + pg * psize + LMDB_PAGE_HEAD + 2 * i, 2);
            lmdb_node_head nh;
            memcpy(&nh, img + pg * psize + off, sizeof(nh));
            if (nh.flags == nflags)
                return pg * psize + off;
        }
    }
    return 0;
}

static void index_file_seeds(void)
{
    char *store = fuzz_join(work, "index-file-store");
    int rc = fuzz_build_store(store);
    if (rc < 0)
        die("sample store", rc);
    char *index = fuzz_join(store, "index");
    char *data = fuzz_join(index, "data.mdb");
    size_t len;
    uint8_t *img = slurp(data, &len);
    index_file_seed("as-written", FUZZ_INDEX_WRITE, img, len);
    index_file_seed("as-written-read-only", FUZZ_INDEX_RDONLY, img, len);
    const size_t psize = 4096;
    lmdb_meta m;
    int page = meta_page(img, psize, &m);
    /* Hostile: a free list naming the main tree's root (its first
     * inline list made that page alone). */
    if (m.dbs[0].root != LMDB_P_INVALID && m.dbs[0].depth == 1) {
        uint8_t *p = img + m.dbs[0].root * psize;
        uint16_t off;
        memcpy(&off, p + LMDB_PAGE_HEAD, 2);
        lmdb_node_head nh;
        memcpy(&nh, p + off, sizeof(nh));
        if (nh.flags == 0 && nh.lo >= 16) {
            uint64_t list[2] = { 1, m.dbs[1].root };
            uint8_t *copy = malloc(len);
            memcpy(copy, img, len);
            memcpy(copy + m.dbs[0].root * psize + off + LMDB_NODE_HEAD + nh.ksize, list, 16);
            index_file_seed("hostile-free-page-in-use", FUZZ_INDEX_WRITE, copy, len);
            free(copy);
        }
    }
    free(img);

    /* Compacted: every page the snapshot's. */
    MDB_env *env;
    char *tmp = fuzz_join(work, "index-file-compact");
    mkdir(tmp, 0700);
    if (mdb_env_create(&env) != 0 || mdb_env_set_maxdbs(env, 16) != 0 ||
        mdb_env_open(env, index, MDB_RDONLY, 0600) != 0 ||
        mdb_env_copy2(env, tmp, MDB_CP_COMPACT) != 0)
        die("compacting the sample index", -EIO);
    mdb_env_close(env);
    char *copied = fuzz_join(tmp, "data.mdb");
    img = slurp(copied, &len);
    index_file_seed("compacted", FUZZ_INDEX_WRITE, img, len);
    page = meta_page(img, psize, &m);
    uint8_t *copy = malloc(len);
    /* Hostile: what passed the page walk once and then broke a writer. */
    struct { const char *name; size_t at; uint64_t value; size_t width; } edits[] = {
        { "hostile-dirty-root", m.dbs[1].root * psize + offsetof(lmdb_page_head, flags),
          LMDB_P_LEAF | LMDB_P_DIRTY, 2 },
        { "hostile-free-dupsort",
          (size_t)page * psize + offsetof(lmdb_meta_page, meta.dbs[0].flags),
          LMDB_DB_INTEGERKEY | LMDB_DB_DUPSORT, 2 },
        { "hostile-txnid-max", (size_t)page * psize + offsetof(lmdb_meta_page, meta.txnid),
          UINT64_MAX, 8 },
    };
    for (size_t i = 0; i < sizeof(edits) / sizeof(edits[0]); i++) {
        memcpy(copy, img, len);
        memcpy(copy + edits[i].at, &edits[i].value, edits[i].width);
        index_file_seed(edits[i].name, FUZZ_INDEX_WRITE, copy, len);
    }
    /* A LEAF2 sub-page of prefixes (two sessions share chunk 1) whose
     * keys claim 9 bytes. */
    size_t node = leaf_node(img, len, psize, LMDB_F_DUPDATA);
    if (node) {
        lmdb_node_head nh;
        memcpy(&nh, img + node, sizeof(nh));
        memcpy(copy, img, len);
        uint16_t pad = 9;
        memcpy(copy + node + LMDB_NODE_HEAD + nh.ksize + offsetof(lmdb_page_head, pad), &pad, 2);
        index_file_seed("hostile-leaf2-size-9", FUZZ_INDEX_WRITE, copy, len);
    }
    free(copy);
    free(img);
    unlink(copied);
    rmdir(tmp);
    free(copied);
    free(tmp);
    free(data);
    free(index);
    free(store);
}

/* --- format ----------------------------------------------------------------- */

/* The format target's header input: the header, the file's size, both
 * records. */
static void format_header_seed(const char *name, const char *path)
{
    size_t len;
    uint8_t *file = slurp(path, &len);
    uint8_t in[1 + 256 + 8 + 256];
    in[0] = 0;
    memcpy(in + 1, file, 256);
    uint64_t size = len;
    memcpy(in + 1 + 256, &size, 8);
    memcpy(in + 1 + 264, file + 4096, 128);
    memcpy(in + 1 + 264 + 128, file + 8192, 128);
    seed("format", name, in, sizeof(in));
    free(file);
}

static void format_seeds(void)
{
    char *p = fuzz_join(work, "s.ctxs");
    ctxs_session *s = create(p, fuzz_options(16, 2, 1));
    int rc;
    if ((rc = fuzz_append(s, 20)) < 0)
        die("append", rc);
    ctxs_session_close(s);
    format_header_seed("header", p);
    /* 3.0: a Q8 ring with a schedule, every region there. */
    ctxs_model sm = schedule_model(CTXS_DTYPE_Q8);
    ctxs_create_options so = schedule_options(16, 2, 1);
    unlink(p);
    if ((rc = ctxs_session_create(&s, p, &sm, &so)) < 0)
        die("create windowed q8", rc);
    append_batches(s, 23);
    ctxs_session_close(s);
    format_header_seed("header-schedule-q8", p);

    /* Geometry: n_layers, n_kv_heads, head_dim, dtype, capacity, n_sink,
     * then batch, period and the windows. */
    uint32_t geo[16] = { 1, 2, 4, CTXS_DTYPE_F16, 64, 4 };
    uint8_t g[1 + 64];
    g[0] = 1;
    memcpy(g + 1, geo, 24);
    seed("format", "geometry", g, 1 + 24);
    uint32_t geo_sched[16] = { 6, 2, 4, CTXS_DTYPE_Q8, 64, 4, 8, 3, 0, 16, 32 };
    memcpy(g + 1, geo_sched, 64);
    seed("format", "geometry-schedule", g, sizeof(g));
    uint32_t geo_global[16] = { 4, 1, 8, CTXS_DTYPE_BF16, 32, 2, 4, 2, 0, 40 };
    memcpy(g + 1, geo_global, 64); /* its ring would not fit: laid out global */
    seed("format", "geometry-schedule-wide", g, sizeof(g));
    uint8_t l[1 + 512];
    l[0] = 2;
    ctxs__disk_label lab;
    ctxs__label_make(&lab, 7, "chat-1", 6);
    memcpy(l + 1, &lab, 512);
    seed("format", "label", l, sizeof(l));
    static const char *names[] = { "\x03" "hello", "\x03" "caf\xc3\xa9", "\x03" "a/b",
                                   "\x03" "\xed\xa0\x80", "\x03" ".." };
    for (int i = 0; i < 5; i++) {
        char nm[32];
        snprintf(nm, sizeof(nm), "name-%d", i);
        seed("format", nm, names[i], strlen(names[i]));
    }
    free(p);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: make_seeds OUTDIR\n");
        return 2;
    }
    out_root = argv[1];
    mkdir(out_root, 0755);
    work = (char *)fuzz_scratch("seeds");
    session_seeds();
    import_seeds();
    index_seeds();
    index_file_seeds();
    cli_seeds();
    format_seeds();
    printf("make_seeds: seeds written under %s\n", out_root);
    return 0;
}
