/*
 * import: the input becomes an export file (docs/FORMAT.md, "Export file
 * format"), which ctxs_store_session_import() reads into a real store (the sample
 * store of fuzz.h, in a tmpfs).
 *
 * Input: a control byte, then the file. The control byte can recompute
 * the CRCs (header, blocks, trailer) and the token checksums inside each
 * block (recompressing it), so that mutations reach the later checks and
 * the second pass that writes the session.
 *
 * Besides not crashing, it checks what import promises: a session it
 * imports opens, verifies, holds the state the header gives, and exports
 * again; nothing is left behind by an import that fails.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "export_format.h"
#include "fuzz.h"
#include "index.h"
#include "internal.h"

enum {
    FIX_CRCS = 0x01,      /* header, block headers and data, trailer */
    FIX_SUMS = 0x02,      /* the token checksums in each block */
    NAME_FROM_FILE = 0x04,/* import under the file's name (name NULL) */
    PROGRESS = 0x08,      /* with a progress callback */
    CLASH_MODEL = 0x10,   /* register the file's model hash with another
                             geometry first: CTXS_EMODEL */
    CLASH_NAME = 0x20,    /* import as "a", which the store has: -EEXIST */
};

/* Where each field of the export file lies, and the sizes of its parts
 * (src/transfer/export_format.h). */
#define H_OFF(field) offsetof(ctxs__export_header, field)
#define B_OFF(field) offsetof(ctxs__export_block, field)
#define T_OFF(field) offsetof(ctxs__export_trailer, field)
#define HEADER_BYTES sizeof(ctxs__export_header)
#define BLOCK_BYTES sizeof(ctxs__export_block)
#define TRAILER_BYTES sizeof(ctxs__export_trailer)
#define MAX_RAW (1u << 20)

static char *store_dir, *file_path, *export_path;
static ctxs_store *st;

static void fail(const char *what, int rc)
{
    fprintf(stderr, "import_fuzzer: %s (%d %s)\n", what, rc, ctxs_err_name(rc));
    abort();
}

static uint32_t crc_of(const void *p, size_t n)
{
    return (uint32_t)crc32(0L, (const Bytef *)p, (uInt)n);
}

static uint32_t rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static void wr32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

static void wr64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

/* A growing output buffer. */
typedef struct out_buf {
    uint8_t *p;
    size_t n, cap;
} out_buf;

static void put(out_buf *o, const void *p, size_t n)
{
    if (n == 0)
        return;
    if (o->n + n > o->cap) {
        size_t cap = (o->n + n) * 2;
        uint8_t *q = realloc(o->p, cap);
        if (!q)
            abort();
        o->p = q;
        o->cap = cap;
    }
    memcpy(o->p + o->n, p, n);
    o->n += n;
}

/* The file with its CRCs (and, with FIX_SUMS, its token checksums)
 * recomputed wherever the structure can be followed; the rest as is. */
static void fix_up(out_buf *o, const uint8_t *data, size_t size, uint8_t ctl)
{
    if (size < HEADER_BYTES) {
        put(o, data, size);
        return;
    }
    uint8_t h[HEADER_BYTES];
    memcpy(h, data, sizeof(h));
    wr32(h + H_OFF(crc32), crc_of(h, H_OFF(crc32)));
    put(o, h, sizeof(h));

    /* The geometry, for the checksums. */
    uint64_t layers = rd32(h + H_OFF(n_layers)), heads = rd32(h + H_OFF(n_kv_heads));
    uint64_t dim = rd32(h + H_OFF(head_dim));
    uint32_t elem = ctxs__dtype_bytes(rd32(h + H_OFF(dtype)));
    uint64_t n_runs = 2 * layers * heads, slot_bytes = dim * elem;
    uint64_t scale_bytes = ctxs__dtype_has_scales(rd32(h + H_OFF(dtype))) ? 4 : 0;
    int geometry_ok = elem && layers && heads && dim && layers <= 4096 && heads <= 4096 &&
                      dim <= 4096;

    size_t off = HEADER_BYTES;
    uint8_t *raw = NULL, *comp = NULL;
    while (size - off > BLOCK_BYTES && memcmp(data + off, CTXS__EXPORT_BLOCK_MAGIC, 4) == 0) {
        uint8_t b[BLOCK_BYTES];
        memcpy(b, data + off, sizeof(b));
        size_t have = size - off - BLOCK_BYTES;
        size_t comp_bytes = rd32(b + B_OFF(comp_bytes));
        if (comp_bytes > have)
            comp_bytes = have;
        const uint8_t *cdata = data + off + BLOCK_BYTES;
        uint32_t count = rd32(b + B_OFF(count)), raw_bytes = rd32(b + B_OFF(raw_bytes));
        int raw_ok = 0;
        uLongf got = raw_bytes;
        if (raw_bytes <= MAX_RAW && (raw = realloc(raw, raw_bytes ? raw_bytes : 1)) &&
            uncompress(raw, &got, cdata, (uLong)comp_bytes) == Z_OK && got == raw_bytes)
            raw_ok = 1;
        const uint8_t *cout = cdata;
        size_t cout_bytes = comp_bytes;
        if (raw_ok && (ctl & FIX_SUMS) && geometry_ok && count &&
            count <= CTXS__EXPORT_MAX_BLOCK_TOKENS &&
            (uint64_t)raw_bytes == count * (12 + n_runs * (slot_bytes + scale_bytes))) {
            uint64_t sums[CTXS__EXPORT_MAX_BLOCK_TOKENS];
            uint32_t ids[CTXS__EXPORT_MAX_BLOCK_TOKENS];
            uint32_t at[CTXS__EXPORT_MAX_BLOCK_TOKENS];
            for (uint32_t i = 0; i < count; i++) {
                at[i] = i;
                memcpy(&ids[i], raw + (size_t)count * 8 + (size_t)i * 4, 4);
            }
            const uint8_t *kv = raw + (size_t)count * 12;
            ctxs__token_bytes tb = {
                .kv = kv,
                .run_stride = (size_t)count * slot_bytes,
                .scales = scale_bytes ? kv + (size_t)(n_runs * count * slot_bytes) : NULL,
                .scales_stride = (size_t)(count * scale_bytes),
                .n_runs = (uint32_t)n_runs,
                .slot_bytes = (size_t)slot_bytes,
                .at = at,
            };
            ctxs__sums_chain(sums, rd64(b + B_OFF(first_pos)), count, ids, &tb);
            memcpy(raw, sums, (size_t)count * 8);
            uLongf bound = compressBound(raw_bytes);
            if ((comp = realloc(comp, bound)) &&
                compress2(comp, &bound, raw, raw_bytes, Z_BEST_SPEED) == Z_OK) {
                cout = comp;
                cout_bytes = bound;
                wr32(b + B_OFF(comp_bytes), (uint32_t)cout_bytes);
            }
        }
        if (ctl & (FIX_CRCS | FIX_SUMS)) {
            wr32(b + B_OFF(data_crc32), crc_of(cout, cout_bytes));
            if (raw_ok)
                wr32(b + B_OFF(raw_crc32), crc_of(raw, raw_bytes));
            wr32(b + B_OFF(crc32), crc_of(b, B_OFF(crc32)));
        }
        put(o, b, sizeof(b));
        put(o, cout, cout_bytes);
        off += BLOCK_BYTES + comp_bytes;
    }
    free(raw);
    free(comp);
    if (size - off == TRAILER_BYTES && memcmp(data + off, CTXS__EXPORT_TRAILER_MAGIC, 4) == 0) {
        uint8_t t[TRAILER_BYTES];
        memcpy(t, data + off, sizeof(t));
        wr64(t + T_OFF(body_bytes), o->n);
        wr32(t + T_OFF(body_crc32), crc_of(o->p, o->n));
        wr32(t + T_OFF(crc32), crc_of(t, T_OFF(crc32)));
        put(o, t, sizeof(t));
    } else {
        put(o, data + off, size - off);
    }
}

static void progress_fn(void *arg, uint64_t done, uint64_t total)
{
    uint64_t *last = arg;
    if (done > total || done < *last)
        fail("progress went backwards or past its total", 0);
    *last = done;
}

static void open_store(void)
{
    int rc;
    if ((rc = fuzz_build_store(store_dir)) < 0 || (rc = ctxs_store_open(&st, store_dir, CTXS_STORE_CREATE, NULL)) < 0)
        fail("the sample store", rc);
}

/* Imports (and CLASH_MODEL) register models the sample store did not
 * know: forget them, so that every input meets the same store. */
static void forget_new_models(void)
{
    ctxs_model_entry *models;
    size_t n;
    if (ctxs_model_list(&models, &n, st) < 0)
        fail("listing the models", 0);
    ctxs_model m0 = fuzz_model(0), m1 = fuzz_model(1);
    MDB_txn *txn = NULL;
    for (size_t i = 0; i < n; i++) {
        if (!memcmp(models[i].model.model_hash, m0.model_hash, 16) ||
            !memcmp(models[i].model.model_hash, m1.model_hash, 16))
            continue;
        if (!txn && mdb_txn_begin(st->env, NULL, 0, &txn) != 0)
            fail("a transaction", 0);
        MDB_val key = { 16, models[i].model.model_hash };
        mdb_del(txn, st->models, &key, NULL);
    }
    if (txn && mdb_txn_commit(txn) != 0)
        fail("forgetting the models", 0);
    ctxs_free(models);
}

/* What a successful import promises. */
static void check_imported(const char *name, const uint8_t *file, size_t size)
{
    ctxs_session *s = NULL;
    int rc = ctxs_store_session_open(&s, st, name, NULL, CTXS_RDONLY | CTXS_OPEN_VERIFY,
                                     NULL);
    if (rc < 0)
        fail("an imported session does not open", rc);
    ctxs_session_info info;
    ctxs_session_get_info(&info, s);
    uint64_t bad;
    if ((rc = ctxs_session_verify(&bad, s)) < 0)
        fail("an imported session does not verify", rc);
    if (info.flags & CTXS_INFO_RECOVERED)
        fail("an imported session needed recovery", 0);
    if (size >= HEADER_BYTES && info.n_tokens != rd64(file + H_OFF(n_tokens)))
        fail("an imported session holds another count", 0);
    ctxs_session_close(s);

    unlink(export_path);
    if ((rc = ctxs_store_session_export(st, name, export_path, NULL)) < 0)
        fail("an imported session does not export", rc);
    char again[256];
    if ((rc = ctxs_store_session_import(again, st, export_path, "reimported", NULL)) < 0)
        fail("an export of an import does not import", rc);
    ctxs_store_session_delete(st, "reimported");
    unlink(export_path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > (1u << 20))
        return 0;
    if (!st) {
        const char *dir = fuzz_scratch("import");
        store_dir = fuzz_join(dir, "store");
        file_path = fuzz_join(dir, "in.export");
        export_path = fuzz_join(dir, "out.export");
        open_store();
    }
    int fds = fuzz_fd_count();
    uint8_t ctl = data[0];
    data++, size--;

    out_buf o = { 0 };
    if (ctl & (FIX_CRCS | FIX_SUMS))
        fix_up(&o, data, size, ctl);
    else
        put(&o, data, size);
    if (fuzz_write_file(file_path, o.p ? o.p : data, o.n) < 0)
        fail("writing the input", 0);

    if ((ctl & CLASH_MODEL) && o.n >= HEADER_BYTES) {
        ctxs_model m;
        memset(&m, 0, sizeof(m));
        m.geometry = (ctxs_geometry){ 1 + (rd32(o.p + H_OFF(n_layers)) & 1), 1, 8, CTXS_DTYPE_F16, 0, {0} };
        memcpy(m.model_hash, o.p + H_OFF(model_hash), 16);
        memcpy(m.tokenizer_hash, o.p + H_OFF(tokenizer_hash), 16);
        ctxs_model_register(st, &m, "clash");
    }

    const char *name = (ctl & NAME_FROM_FILE) ? NULL : (ctl & CLASH_NAME) ? "a" : "imp";
    char got[256];
    uint64_t last = 0;
    ctxs_store_session_import_options io = CTXS_STORE_SESSION_IMPORT_OPTIONS_INIT;
    io.progress = (ctl & PROGRESS) ? progress_fn : NULL;
    io.progress_arg = &last;
    int rc = ctxs_store_session_import(got, st, file_path, name, &io);
    fuzz_debug("import: %zu bytes, control 0x%02x: %s", o.n, ctl, ctxs_err_name(rc));
    if (rc == 0) {
        if (name && strcmp(got, name) != 0)
            fail("imported under another name", 0);
        check_imported(got, o.p, o.n);
        if ((rc = ctxs_store_session_delete(st, got)) < 0)
            fail("deleting an imported session", rc);
    } else if (rc == CTXS_EINVAL) {
        fail("import of a file refused as an invalid argument", rc);
    }
    /* A failed import leaves nothing behind: the sample sessions only. */
    ctxs_session_entry *list;
    size_t n;
    if (ctxs_store_session_list(&list, &n, st) == 0) {
        if (n != 4)
            fail("an import left a session behind", (int)n);
        ctxs_free(list);
    }
    free(o.p);
    unlink(file_path);
    forget_new_models();
    fuzz_check_fds("import", fds);
    return 0;
}
