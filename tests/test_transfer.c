/*
 * Export and import (src/transfer/transfer.c): round trips between stores,
 * writers during an export, and export files that are damaged, truncated
 * or hostile, which import refuses without changing the store.
 *
 * Hostile files are crafted at the offsets of src/transfer/export_format.h,
 * whose static asserts hold them to docs/FORMAT.md ("Export file format").
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "ctxstore.h"
#include "aside.h"
#include "export_format.h"
#include "internal.h"
#include "support.h"

/* Where each field of the export file lies, and the sizes of its parts,
 * from the layout's one definition (src/transfer/export_format.h). */
#define H_OFF(field) offsetof(ctxs__export_header, field)
#define B_OFF(field) offsetof(ctxs__export_block, field)
#define T_OFF(field) offsetof(ctxs__export_trailer, field)
#define H_BYTES sizeof(ctxs__export_header)
#define B_BYTES sizeof(ctxs__export_block)
#define T_BYTES sizeof(ctxs__export_trailer)

TestSuite(transfer, .init = ts_scratch_init, .fini = ts_scratch_fini, .timeout = 60);

/* --- Helpers ---------------------------------------------------------------- */

static ctxs_store *store_at(const char *name)
{
    return ts_store_open(ts_path(ts_scratch, name));
}

/* Creates name with n tokens in st (model registered as "tiny model");
 * returns it open read-write. */
static ctxs_session *mk(ctxs_store *st, const char *name, const ctxs_model *m,
                        uint32_t capacity, uint32_t n_sink, uint32_t ring, uint32_t n)
{
    int rc = ctxs_model_register(st, m, "tiny model");
    cr_assert_eq(rc, 0, "register: %s", ctxs_err_name(rc));
    ctxs_create_options o = ts_options(capacity, n_sink, ring, CTXS_SYNC_NONE);
    ctxs_session *s = NULL;
    rc = ctxs_store_session_create(&s, st, name, m, &o);
    cr_assert_eq(rc, 0, "create %s: %s", name, ctxs_err_name(rc));
    ts_append_many(s, n);
    return s;
}

static ctxs_session *op(ctxs_store *st, const char *name)
{
    ctxs_session *s = NULL;
    int rc = ctxs_store_session_open(&s, st, name, NULL, CTXS_RDONLY, NULL);
    cr_assert_eq(rc, 0, "open %s: %s", name, ctxs_err_name(rc));
    return s;
}

static void export_ok(ctxs_store *st, const char *name, const char *path)
{
    int rc = ctxs_store_session_export(st, name, path, NULL);
    cr_assert_eq(rc, 0, "export %s: %s", name, ctxs_err_name(rc));
}

/* Two sessions hold the same state, positions, ids, checksums and bytes. */
static void same_session(const ctxs_session *a, const ctxs_session *b)
{
    ctxs_session_info ia, ib;
    cr_assert_eq(ctxs_session_get_info(&ia, a), 0);
    cr_assert_eq(ctxs_session_get_info(&ib, b), 0);
    cr_assert_eq(ia.n_tokens, ib.n_tokens);
    cr_assert_eq(ia.ring_start, ib.ring_start);
    cr_assert_eq(ia.n_held, ib.n_held);
    cr_assert_eq(ia.capacity, ib.capacity);
    cr_assert_eq(ia.n_sink, ib.n_sink);
    cr_assert_eq(ia.flags & CTXS_INFO_RING, ib.flags & CTXS_INFO_RING);
    cr_assert_eq(ia.created_unix_ms, ib.created_unix_ms);
    cr_assert(memcmp(&ia.model, &ib.model, sizeof(ia.model)) == 0, "models differ");
    uint16_t ka[TS_KV_MAX], va[TS_KV_MAX], kb[TS_KV_MAX], vb[TS_KV_MAX];
    uint64_t held = 0;
    for (uint64_t p = 0; p < ia.n_tokens; p++) {
        int ra = ctxs_session_read_token(ka, va, a, p, CTXS_DTYPE_F16);
        int rb = ctxs_session_read_token(kb, vb, b, p, CTXS_DTYPE_F16);
        cr_assert_eq(ra, rb, "position %llu: %s vs %s", (unsigned long long)p, ctxs_err_name(ra),
                     ctxs_err_name(rb));
        if (ra == CTXS_EEVICTED)
            continue;
        cr_assert_eq(ra, 0);
        held++;
        size_t n = (size_t)2 * 2 * 8 * 2;
        cr_assert(memcmp(ka, kb, n) == 0 && memcmp(va, vb, n) == 0, "KV of %llu differs",
                  (unsigned long long)p);
        uint32_t sa, sb;
        cr_assert_eq(ctxs_session_get_slot(&sa, a, p), 0);
        cr_assert_eq(ctxs_session_get_slot(&sb, b, p), 0);
        cr_assert_eq(sa, sb);
        cr_assert_eq(ctxs__token_table(a)[sa], ctxs__token_table(b)[sb], "id of %llu",
                     (unsigned long long)p);
        cr_assert_eq(ctxs__sum_table(a)[sa], ctxs__sum_table(b)[sb], "checksum of %llu",
                     (unsigned long long)p);
    }
    cr_assert_eq(held, ia.n_held);
    cr_assert_eq(ctxs_session_verify(NULL, b), 0);
}

/* Session name of st reads back as written, the same as s. */
static void expect_same_in(ctxs_store *st, const char *name, const ctxs_session *s)
{
    ctxs_session *t = op(st, name);
    cr_assert_eq(ts_check_all(t), 0);
    same_session(s, t);
    ctxs_session_close(t);
}

/* Session name of st opened read-write, n more tokens appended and every
 * token checked; the handle is the caller's. */
static ctxs_session *append_in(ctxs_store *st, const char *name, const ctxs_model *m, uint64_t n)
{
    ctxs_session *w = NULL;
    cr_assert_eq(ctxs_store_session_open(&w, st, name, m, 0, NULL), 0);
    ts_append_many(w, n);
    cr_assert_eq(ts_check_all(w), 0);
    return w;
}

/* What a store shows: its sessions by name and id, and its files. */
typedef struct snapshot {
    size_t n;
    char names[16][256];
    uint64_t ids[16];
    int files;
    size_t n_models;
} snapshot;

static snapshot snap(ctxs_store *st, const char *dir)
{
    snapshot s;
    memset(&s, 0, sizeof(s));
    ctxs_session_entry *list;
    cr_assert_eq(ctxs_store_session_list(&list, &s.n, st), 0);
    cr_assert_leq(s.n, 16);
    for (size_t i = 0; i < s.n; i++) {
        memcpy(s.names[i], list[i].name, 256);
        s.ids[i] = list[i].id;
    }
    ctxs_free(list);
    ctxs_model_entry *models;
    cr_assert_eq(ctxs_model_list(&models, &s.n_models, st), 0);
    ctxs_free(models);
    char sessions[1200];
    snprintf(sessions, sizeof(sessions), "%s/%s/sessions", ts_scratch, dir);
    s.files = ts_dir_entries(sessions);
    return s;
}

static void unchanged(const snapshot *before, ctxs_store *st, const char *dir, const char *what)
{
    snapshot now = snap(st, dir);
    cr_assert_eq(now.n, before->n, "%s: %zu sessions, was %zu", what, now.n, before->n);
    for (size_t i = 0; i < now.n; i++)
        cr_assert(strcmp(now.names[i], before->names[i]) == 0 && now.ids[i] == before->ids[i],
                  "%s: the session list changed", what);
    cr_assert_eq(now.files, before->files, "%s: %d files in sessions/, was %d", what, now.files,
                 before->files);
    cr_assert_eq(now.n_models, before->n_models, "%s: models changed", what);
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static void put32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

static void put64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

static uint32_t crc(const uint8_t *p, size_t n)
{
    return (uint32_t)crc32(0L, p, (uInt)n);
}

/* After an edit of the header at its documented offsets: a valid CRC. */
static void reseal_header(uint8_t *f)
{
    put32(f + H_OFF(crc32), crc(f, H_OFF(crc32)));
}

/* After an edit of a block or the header: every CRC valid again (block
 * headers, the body CRC and the trailer). */
static void reseal_all(uint8_t *f, size_t len)
{
    reseal_header(f);
    size_t off = H_BYTES + get32(f + H_OFF(meta_bytes));
    while (off + T_BYTES < len) {
        uint8_t *b = f + off;
        put32(b + B_OFF(crc32), crc(b, B_OFF(crc32)));
        off += B_BYTES + get32(b + B_OFF(comp_bytes));
    }
    cr_assert_eq(off + T_BYTES, len);
    uint8_t *t = f + off;
    put64(t + T_OFF(body_bytes), off);
    put32(t + T_OFF(body_crc32), crc(f, off));
    put32(t + T_OFF(crc32), crc(t, T_OFF(crc32)));
}

/* The offset of block i. */
static size_t block_at(const uint8_t *f, uint32_t i)
{
    size_t off = H_BYTES + get32(f + H_OFF(meta_bytes));
    while (i--)
        off += B_BYTES + get32(f + off + B_OFF(comp_bytes));
    return off;
}

/* Imports data (written to a file) into st; returns the result. */
static int import_bytes(ctxs_store *st, const uint8_t *data, size_t len, const char *name)
{
    const char *path = ts_path(ts_scratch, "hostile.ctxx");
    cr_assert_eq(ts_write_file(path, data, len), 0);
    return ctxs_store_session_import(NULL, st, path, name, NULL);
}

/* A store "src" with the session "chat" (capacity 256, 4 sinks, 200
 * tokens: four blocks), exported to "chat.ctxx"; and an empty store "dst"
 * that knows the model. Returns the export's bytes. */
static uint8_t *hostile_setup(ctxs_store **dst, size_t *len, snapshot *before)
{
    ctxs_store *src = store_at("src");
    ctxs_model m = ts_model(1);
    ctxs_session_close(mk(src, "chat", &m, 256, 4, 1, 200));
    const char *path = ts_path(ts_scratch, "chat.ctxx");
    export_ok(src, "chat", path);
    ctxs_store_close(src);
    *dst = store_at("dst");
    cr_assert_eq(ctxs_model_register(*dst, &m, NULL), 0);
    *before = snap(*dst, "dst");
    uint8_t *f = ts_read_file(path, len);
    cr_assert_not_null(f);
    return f;
}

/* --- Round trips ------------------------------------------------------------- */

typedef struct progress_log {
    uint64_t calls, last_done, last_total, finals;
    int backwards;
} progress_log;

static void on_progress(void *arg, uint64_t done, uint64_t total)
{
    progress_log *l = arg;
    if (l->calls && (done < l->last_done || total != l->last_total))
        l->backwards = 1;
    if (done > total)
        l->backwards = 1;
    l->calls++;
    l->last_done = done;
    l->last_total = total;
    l->finals += done == total;
}

Test(transfer, a_session_round_trips_into_another_store)
{
    ctxs_store *a = store_at("a"), *b = store_at("b");
    ctxs_model m = ts_model(1);
    ctxs_session *s = mk(a, "chat", &m, 512, 4, 1, 300);
    const char *path = ts_path(ts_scratch, "chat.ctxx");
    progress_log pe = {0};
    ctxs_store_session_export_options xo = CTXS_STORE_SESSION_EXPORT_OPTIONS_INIT;
    xo.progress = on_progress;
    xo.progress_arg = &pe;
    int rc = ctxs_store_session_export(a, "chat", path, &xo);
    cr_assert_eq(rc, 0, "export: %s", ctxs_err_name(rc));
    cr_assert(pe.calls >= 2 && !pe.backwards && pe.finals == 1, "export progress");
    cr_assert_eq(pe.last_done, 300);
    cr_assert_eq(pe.last_total, 300);
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0);
    cr_assert_eq(sb.st_mode & 0777, 0600);

    progress_log pi = {0};
    char name[256] = "garbage";
    ctxs_store_session_import_options io = CTXS_STORE_SESSION_IMPORT_OPTIONS_INIT;
    io.progress = on_progress;
    io.progress_arg = &pi;
    rc = ctxs_store_session_import(name, b, path, NULL, &io);
    cr_assert_eq(rc, 0, "import: %s", ctxs_err_name(rc));
    cr_assert_str_eq(name, "chat");
    cr_assert(pi.calls >= 2 && !pi.backwards && pi.finals == 1, "import progress");
    cr_assert_eq(pi.last_total, 2 * (uint64_t)sb.st_size);

    ctxs_model_entry e;
    rc = ctxs_model_get(&e, b, m.model_hash);
    cr_assert_eq(rc, 0, "the model is not registered: %s", ctxs_err_name(rc));
    cr_assert_str_eq(e.name, "tiny model");
    cr_assert(memcmp(&e.model, &m, sizeof(m)) == 0);

    ctxs_session_entry se;
    cr_assert_eq(ctxs_store_session_get(&se, b, "chat"), 0);
    cr_assert_eq(se.n_tokens, 300);
    cr_assert(memcmp(se.model_hash, m.model_hash, 16) == 0);

    expect_same_in(b, "chat", s);

    /* The import is an ordinary session: it takes more tokens, and the
     * prefix index knows it. */
    ctxs_session *w = append_in(b, "chat", &m, 20);
    ctxs_session_close(w);
    uint32_t ids[128];
    for (uint32_t i = 0; i < 128; i++)
        ids[i] = ts_token(i);
    ctxs_prefix_match pm;
    cr_assert_eq(ctxs_prefix_find(&pm, b, m.model_hash, ids, 128), 0);
    cr_assert_str_eq(pm.session, "chat");

    ctxs_session_close(s);
    ctxs_store_close(a);
    ctxs_store_close(b);
}

Test(transfer, an_imported_session_reopens_after_the_store_closes)
{
    ctxs_store *a = store_at("a");
    ctxs_model m = ts_model(3);
    ctxs_session *s = mk(a, "chat", &m, 128, 2, 0, 100);
    export_ok(a, "chat", ts_path(ts_scratch, "x"));
    ctxs_store *b = store_at("b");
    cr_assert_eq(ctxs_store_session_import(NULL, b, ts_path(ts_scratch, "x"), NULL, NULL), 0);
    ctxs_store_close(b);
    b = store_at("b");
    ctxs_create_options o = ts_options(128, 2, 0, CTXS_SYNC_NONE);
    ctxs_session *t = NULL;
    cr_assert_eq(ctxs_store_session_open(&t, b, "chat", &m, CTXS_OPEN_VERIFY, &o.open), 0);
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, t), 0);
    cr_assert_eq(info.lost_tokens, 0);
    cr_assert_eq(info.verified_from, 100);
    cr_assert_eq(info.flags & CTXS_INFO_RING, 0);
    same_session(s, t);
    /* Without a ring the capacity still binds. */
    ctxs_reservation r;
    cr_assert_eq(ctxs_session_reserve(&r, t, 29), CTXS_EFULL);
    ctxs_session_close(t);
    ctxs_session_close(s);
    ctxs_store_close(a);
    ctxs_store_close(b);
}

Test(transfer, a_wrapped_ring_round_trips)
{
    ctxs_store *a = store_at("a"), *b = store_at("b");
    ctxs_model m = ts_model(2);
    ctxs_session *s = mk(a, "ring", &m, 100, 4, 1, 777);
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert(info.flags & CTXS_INFO_WRAPPED);
    cr_assert_gt(info.ring_start, 4);
    const char *path = ts_path(ts_scratch, "ring.ctxx");
    export_ok(a, "ring", path);
    cr_assert_eq(ctxs_store_session_import(NULL, b, path, NULL, NULL), 0);
    expect_same_in(b, "ring", s);
    /* And goes on wrapping. */
    ctxs_session *w = append_in(b, "ring", &m, 150);
    cr_assert_eq(ctxs_session_verify(NULL, w), 0);
    ctxs_session_close(w);
    ctxs_session_close(s);
    ctxs_store_close(a);
    ctxs_store_close(b);
}

Test(transfer, a_ring_wrapped_by_less_than_a_block_and_sinkless_rings_round_trip)
{
    ctxs_store *a = store_at("a"), *b = store_at("b");
    ctxs_model m = ts_model(2);
    struct { uint32_t cap, sinks, n; } cases[] = {
        {100, 4, 103}, {100, 0, 250}, {64, 63, 200}, {2, 1, 5}, {70, 4, 70}, {70, 4, 3},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char name[32];
        snprintf(name, sizeof(name), "ring-%zu", i);
        ctxs_session *s = mk(a, name, &m, cases[i].cap, cases[i].sinks, 1, 0);
        for (uint32_t k = 0; k < cases[i].n; k++) /* a ring of 1 takes one at a time */
            cr_assert_eq(ts_append(s, 1), 0);
        const char *path = ts_path(ts_scratch, name);
        export_ok(a, name, path);
        int rc = ctxs_store_session_import(NULL, b, path, NULL, NULL);
        cr_assert_eq(rc, 0, "import %s: %s", name, ctxs_err_name(rc));
        ctxs_session *t = op(b, name);
        same_session(s, t);
        ctxs_session_close(t);
        ctxs_session_close(s);
    }
    ctxs_store_close(a);
    ctxs_store_close(b);
}

Test(transfer, an_empty_session_round_trips)
{
    ctxs_store *a = store_at("a"), *b = store_at("b");
    ctxs_model m = ts_model(4);
    ctxs_session *s = mk(a, "empty", &m, 64, 4, 1, 0);
    const char *path = ts_path(ts_scratch, "e");
    progress_log p = {0};
    ctxs_store_session_export_options xo = CTXS_STORE_SESSION_EXPORT_OPTIONS_INIT;
    xo.progress = on_progress;
    xo.progress_arg = &p;
    cr_assert_eq(ctxs_store_session_export(a, "empty", path, &xo), 0);
    cr_assert_eq(p.calls, 1);
    cr_assert_eq(p.last_total, 0);
    cr_assert_eq(ctxs_store_session_import(NULL, b, path, NULL, NULL), 0);
    ctxs_session *t = op(b, "empty");
    same_session(s, t);
    ctxs_session_close(t);
    ctxs_session_close(s);
    ctxs_store_close(a);
    ctxs_store_close(b);
}

Test(transfer, import_under_another_name_and_into_the_same_store)
{
    ctxs_store *a = store_at("a");
    ctxs_model m = ts_model(1);
    ctxs_session *s = mk(a, "chat", &m, 256, 4, 1, 130);
    const char *path = ts_path(ts_scratch, "chat.ctxx");
    export_ok(a, "chat", path);
    char name[256];
    int rc = ctxs_store_session_import(name, a, path, "chat copy", NULL);
    cr_assert_eq(rc, 0, "import: %s", ctxs_err_name(rc));
    cr_assert_str_eq(name, "chat copy");
    ctxs_session *t = op(a, "chat copy");
    same_session(s, t);
    /* Its own file, labelled with its own name and id. */
    ctxs_session_entry e1, e2;
    cr_assert_eq(ctxs_store_session_get(&e1, a, "chat"), 0);
    cr_assert_eq(ctxs_store_session_get(&e2, a, "chat copy"), 0);
    cr_assert_neq(e1.id, e2.id);
    char file[1200];
    snprintf(file, sizeof(file), "%s/a/sessions/%016llx.ctxs", ts_scratch,
             (unsigned long long)e2.id);
    ctxs_file_report rep;
    cr_assert_eq(ctxs_file_inspect(&rep, file), 0);
    cr_assert_eq(rep.label_status, 0);
    cr_assert_eq(rep.label_id, e2.id);
    cr_assert_str_eq(rep.label_name, "chat copy");
    ctxs_session_close(t);
    ctxs_session_close(s);

    /* Gone and imported back, by the name in the file. */
    cr_assert_eq(ctxs_store_session_delete(a, "chat"), 0);
    cr_assert_eq(ctxs_store_session_import(name, a, path, NULL, NULL), 0);
    cr_assert_str_eq(name, "chat");
    ctxs_store_close(a);
}

Test(transfer, a_name_that_is_taken_is_eexist_and_changes_nothing)
{
    ctxs_store *a = store_at("a");
    ctxs_model m = ts_model(1);
    ctxs_session_close(mk(a, "chat", &m, 256, 4, 1, 100));
    ctxs_session_close(mk(a, "other", &m, 256, 4, 1, 10));
    const char *path = ts_path(ts_scratch, "chat.ctxx");
    export_ok(a, "chat", path);
    snapshot before = snap(a, "a");
    char name[256] = "x";
    cr_assert_eq(ctxs_store_session_import(name, a, path, NULL, NULL), CTXS_ETAKEN);
    cr_assert_str_eq(name, "");
    cr_assert_eq(ctxs_store_session_import(NULL, a, path, "other", NULL), CTXS_ETAKEN);
    unchanged(&before, a, "a", "name taken");
    ctxs_session_entry e;
    cr_assert_eq(ctxs_store_session_get(&e, a, "other"), 0);
    cr_assert_eq(e.n_tokens, 10);
    ctxs_store_close(a);
}

/* The options of export and import: a version the library does not know,
 * or a reserved byte set, is CTXS_EINVAL, named, and touches nothing. */
Test(transfer, options_with_an_unknown_version_or_reserved_bytes_are_einval)
{
    TS_OPTIONS_INIT_CHECK(ctxs_store_session_export_options,
                          ctxs_store_session_export_options_init,
                          CTXS_STORE_SESSION_EXPORT_OPTIONS_INIT,
                          CTXS_STORE_SESSION_EXPORT_OPTIONS_VERSION);
    TS_OPTIONS_INIT_CHECK(ctxs_store_session_import_options,
                          ctxs_store_session_import_options_init,
                          CTXS_STORE_SESSION_IMPORT_OPTIONS_INIT,
                          CTXS_STORE_SESSION_IMPORT_OPTIONS_VERSION);
    ctxs_store_session_export_options xo = CTXS_STORE_SESSION_EXPORT_OPTIONS_INIT;
    ctxs_store_session_import_options io = CTXS_STORE_SESSION_IMPORT_OPTIONS_INIT;

    ctxs_store *a = store_at("a");
    ctxs_model m = ts_model(1);
    ctxs_session_close(mk(a, "chat", &m, 64, 4, 1, 10));
    const char *path = ts_path(ts_scratch, "chat.ctxx");
    progress_log p = {0};
    xo.progress = on_progress;
    xo.progress_arg = &p;
    xo.version = 2;
    cr_assert_eq(ctxs_store_session_export(a, "chat", path, &xo), CTXS_EINVAL);
    cr_assert(strstr(ctxs_get_last_error(), "version"), "%s", ctxs_get_last_error());
    xo.version = CTXS_STORE_SESSION_EXPORT_OPTIONS_VERSION;
    xo.reserved[31] = 1;
    cr_assert_eq(ctxs_store_session_export(a, "chat", path, &xo), CTXS_EINVAL);
    cr_assert(strstr(ctxs_get_last_error(), "reserved"), "%s", ctxs_get_last_error());
    xo.reserved[31] = 0;
    xo.reserved0 = 1;
    cr_assert_eq(ctxs_store_session_export(a, "chat", path, &xo), CTXS_EINVAL);
    cr_assert(!ts_exists(path));
    cr_assert_eq(p.calls, 0);
    xo.reserved0 = 0;
    cr_assert_eq(ctxs_store_session_export(a, "chat", path, &xo), 0);
    cr_assert(p.calls >= 1 && p.finals == 1, "export progress");

    memset(&p, 0, sizeof(p));
    io.progress = on_progress;
    io.progress_arg = &p;
    io.version = 0;
    cr_assert_eq(ctxs_store_session_import(NULL, a, path, "copy", &io), CTXS_EINVAL);
    io.version = CTXS_STORE_SESSION_IMPORT_OPTIONS_VERSION;
    io.reserved[0] = 1;
    cr_assert_eq(ctxs_store_session_import(NULL, a, path, "copy", &io), CTXS_EINVAL);
    ctxs_session_entry e;
    cr_assert_eq(ctxs_store_session_get(&e, a, "copy"), CTXS_ENOTFOUND);
    cr_assert_eq(p.calls, 0);
    io.reserved[0] = 0;
    cr_assert_eq(ctxs_store_session_import(NULL, a, path, "copy", &io), 0);
    cr_assert(p.calls >= 1 && p.finals == 1, "import progress");
    cr_assert_eq(ctxs_store_session_get(&e, a, "copy"), 0);
    ctxs_store_close(a);
}

Test(transfer, bad_arguments_are_einval)
{
    ctxs_store *a = store_at("a");
    ctxs_model m = ts_model(1);
    ctxs_session_close(mk(a, "chat", &m, 64, 4, 1, 10));
    const char *path = ts_path(ts_scratch, "chat.ctxx");
    cr_assert_eq(ctxs_store_session_export(NULL, "chat", path, NULL), CTXS_EINVAL);
    cr_assert_eq(ctxs_store_session_export(a, NULL, path, NULL), CTXS_EINVAL);
    cr_assert_eq(ctxs_store_session_export(a, "chat", NULL, NULL), CTXS_EINVAL);
    cr_assert_eq(ctxs_store_session_export(a, "chat", "", NULL), CTXS_EINVAL);
    cr_assert_eq(ctxs_store_session_export(a, "a/b", path, NULL), CTXS_EINVAL);
    cr_assert_eq(ctxs_store_session_export(a, "nobody", path, NULL), CTXS_ENOTFOUND);
    cr_assert(!ts_exists(path));
    export_ok(a, "chat", path);
    cr_assert_eq(ctxs_store_session_import(NULL, NULL, path, NULL, NULL), CTXS_EINVAL);
    cr_assert_eq(ctxs_store_session_import(NULL, a, NULL, NULL, NULL), CTXS_EINVAL);
    cr_assert_eq(ctxs_store_session_import(NULL, a, path, "..", NULL), CTXS_EINVAL);
    cr_assert_eq(ctxs_store_session_import(NULL, a, path, "", NULL), CTXS_EINVAL);
    cr_assert_eq(ctxs_store_session_import(NULL, a, ts_path(ts_scratch, "none"), "n", NULL),
                 -ENOENT);
    cr_assert_eq(ctxs_store_session_import(NULL, a, ts_scratch, "n", NULL), CTXS_EFOREIGN);
    ctxs_store_close(a);
}

Test(transfer, a_model_registered_with_another_geometry_is_emodel)
{
    ctxs_store *a = store_at("a"), *b = store_at("b");
    ctxs_model m = ts_model(1);
    ctxs_session_close(mk(a, "chat", &m, 64, 4, 1, 40));
    const char *path = ts_path(ts_scratch, "chat.ctxx");
    export_ok(a, "chat", path);

    ctxs_model other = m;
    other.geometry.head_dim = 16;
    cr_assert_eq(ctxs_model_register(b, &other, "same hash, other model"), 0);
    snapshot before = snap(b, "b");
    cr_assert_eq(ctxs_store_session_import(NULL, b, path, NULL, NULL), CTXS_EMODEL);
    unchanged(&before, b, "b", "another geometry");

    ctxs_store *c = store_at("c");
    other = m;
    other.tokenizer_hash[0] ^= 1;
    cr_assert_eq(ctxs_model_register(c, &other, NULL), 0);
    cr_assert_eq(ctxs_store_session_import(NULL, c, path, NULL, NULL), CTXS_EMODEL);

    /* A store that knows the model under another display name keeps it. */
    ctxs_store *d = store_at("d");
    cr_assert_eq(ctxs_model_register(d, &m, "my name"), 0);
    cr_assert_eq(ctxs_store_session_import(NULL, d, path, NULL, NULL), 0);
    ctxs_model_entry e;
    cr_assert_eq(ctxs_model_get(&e, d, m.model_hash), 0);
    cr_assert_str_eq(e.name, "my name");
    ctxs_store_close(a);
    ctxs_store_close(b);
    ctxs_store_close(c);
    ctxs_store_close(d);
}

Test(transfer, an_export_path_that_exists_is_eexist_and_left_untouched)
{
    ctxs_store *a = store_at("a");
    ctxs_model m = ts_model(1);
    ctxs_session_close(mk(a, "chat", &m, 64, 4, 1, 10));
    const char *path = ts_path(ts_scratch, "taken");
    cr_assert_eq(ts_write_file(path, "mine", 4), 0);
    cr_assert_eq(ctxs_store_session_export(a, "chat", path, NULL), -EEXIST);
    size_t len;
    uint8_t *got = ts_read_file(path, &len);
    cr_assert(len == 4 && memcmp(got, "mine", 4) == 0);
    free(got);
    cr_assert_eq(symlink("nowhere", ts_path(ts_scratch, "link")), 0);
    cr_assert_eq(ctxs_store_session_export(a, "chat", ts_path(ts_scratch, "link"), NULL), -EEXIST);
    cr_assert_eq(ts_dir_entries(ts_scratch), 3); /* a, taken, link */
    ctxs_store_close(a);
}

/* --- Writers during an export ------------------------------------------------ */

typedef struct writer_job {
    ctxs_session *w;
    int calls;
    int what; /* 0 append, 1 roll back, 2 roll back and write the same again,
                 3 wrap the ring over the exported tokens */
} writer_job;

static void on_export_block(void *arg, uint64_t done, uint64_t total)
{
    writer_job *j = arg;
    if (done == total || j->calls++)
        return;
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, j->w), 0);
    switch (j->what) {
    case 0:
        ts_append_many(j->w, 70);
        break;
    case 1:
        cr_assert_eq(ctxs_session_rollback(j->w, info.n_tokens - 1), 0);
        break;
    case 2:
        cr_assert_eq(ctxs_session_rollback(j->w, 50), 0);
        ts_append_many(j->w, (uint32_t)(info.n_tokens - 50));
        break;
    case 3:
        ts_append_many(j->w, 300);
        break;
    }
}

Test(transfer, export_while_a_writer_holds_the_session)
{
    ctxs_store *a = store_at("a"), *b = store_at("b");
    ctxs_model m = ts_model(1);
    ctxs_session *w = mk(a, "chat", &m, 512, 4, 1, 200);
    /* Reserved and written, not committed: not exported. */
    ctxs_reservation r;
    cr_assert_eq(ctxs_session_reserve(&r, w, 10), 0);
    const char *one = ts_path(ts_scratch, "one"), *two = ts_path(ts_scratch, "two");
    export_ok(a, "chat", one);
    cr_assert_eq(ctxs_store_session_import(NULL, b, one, "one", NULL), 0);
    ctxs_session_close(w);
    /* Appends during the export leave it exact: the state it began with. */
    cr_assert_eq(ctxs_store_session_open(&w, a, "chat", &m, 0, NULL), 0);
    writer_job j = {w, 0, 0};
    ctxs_store_session_export_options xo = CTXS_STORE_SESSION_EXPORT_OPTIONS_INIT;
    xo.progress = on_export_block;
    xo.progress_arg = &j;
    int rc = ctxs_store_session_export(a, "chat", two, &xo);
    cr_assert_eq(rc, 0, "export: %s", ctxs_err_name(rc));
    cr_assert_eq(j.calls, 3);
    cr_assert_eq(ctxs_store_session_import(NULL, b, two, "two", NULL), 0);
    const char *names[] = {"one", "two"};
    for (int i = 0; i < 2; i++) {
        ctxs_session *t = op(b, names[i]);
        ctxs_session_info info;
        cr_assert_eq(ctxs_session_get_info(&info, t), 0);
        cr_assert_eq(info.n_tokens, 200);
        cr_assert_eq(ts_check_all(t), 0);
        cr_assert_eq(ctxs_session_verify(NULL, t), 0);
        ctxs_session_close(t);
    }
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, w), 0);
    cr_assert_eq(info.n_tokens, 270);
    ctxs_session_close(w);
    ctxs_store_close(a);
    ctxs_store_close(b);
}

Test(transfer, a_writer_rolling_back_or_wrapping_during_the_export_gives_estale)
{
    ctxs_store *a = store_at("a");
    ctxs_model m = ts_model(1);
    for (int what = 1; what <= 3; what++) {
        char name[16];
        snprintf(name, sizeof(name), "s%d", what);
        ctxs_session *w = mk(a, name, &m, what == 3 ? 300 : 512, 4, 1, 200);
        const char *path = ts_path(ts_scratch, name);
        writer_job j = {w, 0, what};
        ctxs_store_session_export_options xo = CTXS_STORE_SESSION_EXPORT_OPTIONS_INIT;
        xo.progress = on_export_block;
        xo.progress_arg = &j;
        int rc = ctxs_store_session_export(a, name, path, &xo);
        if (what == 2) {
            /* The same tokens written again: exact, or refused. */
            cr_assert(rc == 0 || rc == CTXS_ESTALE, "%s", ctxs_err_name(rc));
            if (rc == 0) {
                ctxs_store *b = store_at("b");
                cr_assert_eq(ctxs_store_session_import(NULL, b, path, NULL, NULL), 0);
                ctxs_session *t = op(b, name);
                same_session(w, t);
                ctxs_session_close(t);
                ctxs_store_close(b);
            }
        } else {
            cr_assert_eq(rc, CTXS_ESTALE, "case %d: %s", what, ctxs_err_name(rc));
            cr_assert(!ts_exists(path), "a stale export was left at its path");
        }
        ctxs_session_close(w);
    }
    /* Nothing written aside is left either. */
    cr_assert_eq(ts_dir_entries(ts_scratch),
                 1 + ts_exists(ts_path(ts_scratch, "s2")) + ts_exists(ts_path(ts_scratch, "b")));
    ctxs_store_close(a);
}

Test(transfer, a_damaged_session_is_not_exported)
{
    ctxs_store *a = store_at("a");
    ctxs_model m = ts_model(1);
    ctxs_session *w = mk(a, "chat", &m, 128, 4, 1, 100);
    void *run;
    cr_assert_eq(ctxs_session_get_kv(&run, w, 1, CTXS_V, 1), 0);
    ((uint8_t *)run)[70 * 16] ^= 1; /* position 70, outside any reservation */
    const char *path = ts_path(ts_scratch, "x");
    cr_assert_eq(ctxs_store_session_export(a, "chat", path, NULL), CTXS_ECORRUPT);
    cr_assert(!ts_exists(path));
    ctxs_session_close(w);
    ctxs_store_close(a);
}

/* --- Damaged, truncated and hostile files ------------------------------------ */

Test(transfer, every_flipped_byte_is_refused_and_changes_nothing)
{
    ctxs_store *dst;
    size_t len;
    snapshot before;
    uint8_t *f = hostile_setup(&dst, &len, &before);
    uint8_t *g = malloc(len);
    cr_assert_not_null(g);
    /* Every byte of the header, of each block header and of the trailer;
     * a sample of the compressed data. */
    uint8_t *all = calloc(1, len);
    cr_assert_not_null(all);
    memset(all, 1, H_BYTES);
    memset(all + len - T_BYTES, 1, T_BYTES);
    for (uint32_t i = 0; i < 4; i++)
        memset(all + block_at(f, i), 1, B_BYTES);
    cr_assert_eq(block_at(f, 4), len - T_BYTES);
    size_t tested = 0;
    for (size_t off = 0; off < len; off++) {
        if (!all[off] && off % 61 != 0)
            continue;
        static const uint8_t masks[] = {0x01, 0x80, 0xff};
        uint8_t mask = masks[off % 3];
        memcpy(g, f, len);
        g[off] ^= mask;
        int rc = import_bytes(dst, g, len, NULL);
        if (off < 8)
            cr_assert_eq(rc, CTXS_EFOREIGN, "byte %zu: %s", off, ctxs_err_name(rc));
        else if (off < 10)
            cr_assert(rc == CTXS_EVERSION || rc == CTXS_ECORRUPT, "byte %zu: %s", off,
                      ctxs_err_name(rc));
        else
            cr_assert_eq(rc, CTXS_ECORRUPT, "byte %zu ^ %#x: %s", off, mask, ctxs_err_name(rc));
        tested++;
        if (tested % 64 == 0)
            unchanged(&before, dst, "dst", "a flipped byte");
    }
    cr_assert_gt(tested, 1200);
    free(all);
    unchanged(&before, dst, "dst", "a flipped byte");
    /* The file itself still imports. */
    cr_assert_eq(import_bytes(dst, f, len, NULL), 0);
    free(g);
    free(f);
    ctxs_store_close(dst);
}

Test(transfer, every_truncation_is_refused_and_changes_nothing)
{
    ctxs_store *dst;
    size_t len;
    snapshot before;
    uint8_t *f = hostile_setup(&dst, &len, &before);
    cr_assert_eq(import_bytes(dst, f, 0, NULL), CTXS_EFOREIGN);
    for (size_t cut = 1; cut < len; cut += cut < 1200 ? 1 : 37) {
        int rc = import_bytes(dst, f, cut, NULL);
        cr_assert_eq(rc, CTXS_ECORRUPT, "cut at %zu of %zu: %s", cut, len, ctxs_err_name(rc));
    }
    for (size_t cut = len - 2 * T_BYTES; cut < len; cut++)
        cr_assert_eq(import_bytes(dst, f, cut, NULL), CTXS_ECORRUPT);
    unchanged(&before, dst, "dst", "truncated");
    free(f);
    ctxs_store_close(dst);
}

Test(transfer, trailing_bytes_are_refused)
{
    ctxs_store *dst;
    size_t len;
    snapshot before;
    uint8_t *f = hostile_setup(&dst, &len, &before);
    uint8_t *g = calloc(1, len + 2 * T_BYTES);
    memcpy(g, f, len);
    cr_assert_eq(import_bytes(dst, g, len + 1, NULL), CTXS_ECORRUPT);
    cr_assert_eq(import_bytes(dst, g, len + T_BYTES, NULL), CTXS_ECORRUPT);
    memcpy(g + len, f + len - T_BYTES, T_BYTES); /* the trailer twice */
    cr_assert_eq(import_bytes(dst, g, len + T_BYTES, NULL), CTXS_ECORRUPT);
    unchanged(&before, dst, "dst", "trailing bytes");
    free(g);
    free(f);
    ctxs_store_close(dst);
}

Test(transfer, foreign_and_future_files_are_refused)
{
    ctxs_store *dst;
    size_t len;
    snapshot before;
    uint8_t *f = hostile_setup(&dst, &len, &before);
    /* A future major version, with a valid CRC or with another layout. */
    f[H_OFF(version_major)] = CTXS__EXPORT_MAJOR + 1;
    reseal_header(f);
    cr_assert_eq(import_bytes(dst, f, len, NULL), CTXS_EVERSION);
    cr_assert_eq(import_bytes(dst, f, 12, NULL), CTXS_EVERSION);
    f[H_OFF(version_major)] = 0;
    reseal_header(f);
    cr_assert_eq(import_bytes(dst, f, len, NULL), CTXS_ECORRUPT);
    f[H_OFF(version_major)] = CTXS__EXPORT_MAJOR;
    /* A newer minor is read. */
    f[H_OFF(version_minor)] = 7;
    reseal_header(f);
    cr_assert_eq(import_bytes(dst, f, len, "minor 7"), 0);
    f[H_OFF(version_minor)] = 0;
    reseal_header(f);

    /* Not an export file: a session file, text, nothing. */
    cr_assert_eq(import_bytes(dst, (const uint8_t *)"", 0, NULL), CTXS_EFOREIGN);
    cr_assert_eq(import_bytes(dst, (const uint8_t *)"hello\n", 6, NULL), CTXS_EFOREIGN);
    cr_assert_eq(import_bytes(dst, (const uint8_t *)"CTXS", 4, NULL), CTXS_ECORRUPT);
    ctxs_session *s;
    ctxs_model m = ts_model(1);
    const char *spath = ts_path(ts_scratch, "plain.ctxs");
    cr_assert_eq(ctxs_session_create(&s, spath, &m, NULL), 0);
    ctxs_session_close(s);
    cr_assert_eq(ctxs_store_session_import(NULL, dst, spath, "x", NULL), CTXS_EFOREIGN);
    cr_assert_eq(mkfifo(ts_path(ts_scratch, "fifo"), 0600), 0);
    cr_assert_eq(ctxs_store_session_import(NULL, dst, ts_path(ts_scratch, "fifo"), "x", NULL),
                 CTXS_EFOREIGN);
    snapshot after = snap(dst, "dst");
    cr_assert_eq(after.n, before.n + 1); /* "minor 7" */
    free(f);
    ctxs_store_close(dst);
}

/* Sets a header field (4 or 8 bytes) and reseals; expects a refusal. */
static void refuse_header_field(ctxs_store *dst, const uint8_t *f, size_t len, size_t off,
                                int width, uint64_t value, int want)
{
    uint8_t *g = malloc(len);
    memcpy(g, f, len);
    if (width == 2) {
        uint16_t v = (uint16_t)value;
        memcpy(g + off, &v, 2);
    } else if (width == 4) {
        put32(g + off, (uint32_t)value);
    } else {
        put64(g + off, value);
    }
    reseal_header(g);
    int rc = import_bytes(dst, g, len, NULL);
    cr_assert_eq(rc, want, "header field at %zu = %#llx: %s", off, (unsigned long long)value,
                 ctxs_err_name(rc));
    /* The same header alone, with nothing after it. */
    rc = import_bytes(dst, g, H_BYTES, NULL);
    cr_assert_eq(rc, want, "header only, field at %zu = %#llx: %s", off,
                 (unsigned long long)value, ctxs_err_name(rc));
    free(g);
}

Test(transfer, absurd_sizes_with_valid_crcs_are_refused)
{
    ctxs_store *dst;
    size_t len;
    snapshot before;
    uint8_t *f = hostile_setup(&dst, &len, &before);
    struct { size_t off; int width; uint64_t value; } bad[] = {
        {H_OFF(header_bytes), 4, 512},
        {H_OFF(flags), 4, 2},               /* unknown flag */
        {H_OFF(dtype), 4, 4},               /* f32: no session's dtype */
        {H_OFF(dtype), 4, 5},               /* unknown dtype */
        {H_OFF(n_layers), 4, 0},
        {H_OFF(n_layers), 4, 4097},
        {H_OFF(n_layers), 4, UINT32_MAX},
        {H_OFF(head_dim), 4, UINT32_MAX},
        {H_OFF(capacity), 4, UINT32_MAX},
        {H_OFF(capacity), 4, 1},
        {H_OFF(capacity), 4, 4},            /* n_sink 4 >= capacity */
        {H_OFF(n_sink), 4, UINT32_MAX},
        {H_OFF(block_tokens), 4, 0},
        {H_OFF(block_tokens), 4, 65},
        {H_OFF(block_tokens), 4, UINT32_MAX},
        {H_OFF(block_tokens), 4, 32},       /* then the blocks do not match */
        {H_OFF(n_tokens), 4, 199},          /* ditto */
        {H_OFF(n_tokens), 8, UINT64_MAX},
        {H_OFF(n_tokens), 8, 1ull << 62},
        {H_OFF(n_tokens), 8, 1ull << 40},   /* more than the ring holds */
        {H_OFF(ring_start), 8, 201},        /* above n_tokens */
        {H_OFF(ring_start), 8, 100},        /* evicts what the blocks carry */
        {H_OFF(n_held), 8, UINT64_MAX},
        {H_OFF(n_held), 8, 199},
        {H_OFF(n_blocks), 8, UINT64_MAX},
        {H_OFF(n_blocks), 8, 5},
        {H_OFF(model_name_len), 2, 65535},
        {H_OFF(model_name_len), 2, 256},
        {H_OFF(name_len), 2, 0},
        {H_OFF(name_len), 2, 300},
        {H_OFF(name_len), 2, 3},            /* "cha" then "t": no zero padding */
        {H_OFF(name), 4, 0x2f2f2f2f},       /* "////" */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        refuse_header_field(dst, f, len, bad[i].off, bad[i].width, bad[i].value, CTXS_ECORRUPT);
    /* Lying about capacity: 16 Mi slots of a valid geometry, a ring with
     * 16 Mi tokens held, and no blocks for them: refused at the first
     * missing block, without allocating for the slots. */
    uint8_t *g = malloc(len);
    memcpy(g, f, len);
    put32(g + H_OFF(capacity), 1u << 24);
    put64(g + H_OFF(n_tokens), 1u << 24);
    put64(g + H_OFF(ring_start), 0);
    put64(g + H_OFF(n_held), 1u << 24);
    put64(g + H_OFF(n_blocks), (1u << 24) / 64);
    reseal_header(g);
    cr_assert_eq(import_bytes(dst, g, len, NULL), CTXS_ECORRUPT);
    free(g);
    unchanged(&before, dst, "dst", "absurd header");
    free(f);
    ctxs_store_close(dst);
}

Test(transfer, absurd_block_headers_with_valid_crcs_are_refused)
{
    ctxs_store *dst;
    size_t len;
    snapshot before;
    uint8_t *f = hostile_setup(&dst, &len, &before);
    uint8_t *g = malloc(len);
    struct { uint32_t block; size_t off; int width; uint64_t value; } bad[] = {
        {0, B_OFF(index), 4, 1},
        {1, B_OFF(index), 4, 0},
        {0, B_OFF(first_pos), 8, 1},
        {2, B_OFF(first_pos), 8, UINT64_MAX},
        {0, B_OFF(count), 4, 63},
        {0, B_OFF(count), 4, 65},
        {3, B_OFF(count), 4, UINT32_MAX},
        {0, B_OFF(raw_bytes), 4, UINT32_MAX},
        {0, B_OFF(raw_bytes), 4, 64 * 140 - 1},
        {0, B_OFF(comp_bytes), 4, 0},
        {0, B_OFF(comp_bytes), 4, UINT32_MAX},
        {3, B_OFF(comp_bytes), 4, 1u << 20},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memcpy(g, f, len);
        uint8_t *b = g + block_at(g, bad[i].block);
        if (bad[i].width == 4)
            put32(b + bad[i].off, (uint32_t)bad[i].value);
        else
            put64(b + bad[i].off, bad[i].value);
        put32(b + B_OFF(crc32), crc(b, B_OFF(crc32)));
        int rc = import_bytes(dst, g, len, NULL);
        cr_assert_eq(rc, CTXS_ECORRUPT, "case %zu: %s", i, ctxs_err_name(rc));
    }
    /* Two blocks swapped: each intact, the positions out of order. */
    size_t b1 = block_at(f, 1), b2 = block_at(f, 2), b3 = block_at(f, 3);
    memcpy(g, f, len);
    memcpy(g + b1, f + b2, b3 - b2);
    memcpy(g + b1 + (b3 - b2), f + b1, b2 - b1);
    put32(g + b1 + 4, 1);
    put32(g + b1 + (b3 - b2) + 4, 2);
    reseal_all(g, len);
    cr_assert_eq(import_bytes(dst, g, len, NULL), CTXS_ECORRUPT);
    unchanged(&before, dst, "dst", "absurd block");
    free(g);
    free(f);
    ctxs_store_close(dst);
}

/* Decompresses block i of f, lets edit change the raw bytes, and writes the
 * block back recompressed with every CRC valid: only the token checksums
 * can tell. Returns the new file (its length in *len). */
static uint8_t *rewrite_block(const uint8_t *f, size_t *len, uint32_t i,
                              void (*edit)(uint8_t *raw, uint32_t count))
{
    size_t at = block_at(f, i);
    const uint8_t *b = f + at;
    uint32_t count = get32(b + B_OFF(count)), raw_bytes = get32(b + B_OFF(raw_bytes));
    uint32_t comp_bytes = get32(b + B_OFF(comp_bytes));
    uint8_t *raw = malloc(raw_bytes);
    uLongf got = raw_bytes;
    cr_assert_eq(uncompress(raw, &got, b + B_BYTES, comp_bytes), Z_OK);
    cr_assert_eq(got, raw_bytes);
    edit(raw, count);
    uLongf comp = compressBound(raw_bytes);
    uint8_t *z = malloc(comp);
    cr_assert_eq(compress2(z, &comp, raw, raw_bytes, 9), Z_OK);
    size_t n = *len - comp_bytes + comp;
    uint8_t *g = malloc(n);
    memcpy(g, f, at + B_BYTES);
    memcpy(g + at + B_BYTES, z, comp);
    memcpy(g + at + B_BYTES + comp, f + at + B_BYTES + comp_bytes,
           *len - (at + B_BYTES + comp_bytes));
    uint8_t *nb = g + at;
    put32(nb + B_OFF(comp_bytes), (uint32_t)comp);
    put32(nb + B_OFF(data_crc32), crc(z, comp));
    put32(nb + B_OFF(raw_crc32), crc(raw, raw_bytes));
    reseal_all(g, n);
    free(raw);
    free(z);
    *len = n;
    return g;
}

static void flip_kv(uint8_t *raw, uint32_t count)
{
    raw[count * 12 + 100] ^= 0x04;
}

static void change_id(uint8_t *raw, uint32_t count)
{
    raw[count * 8 + 5 * 4] ^= 1;
}

static void change_sum(uint8_t *raw, uint32_t count)
{
    (void)count;
    raw[7 * 8 + 3] ^= 1;
}

static void no_change(uint8_t *raw, uint32_t count)
{
    (void)raw;
    (void)count;
}

Test(transfer, a_token_that_does_not_match_its_checksum_is_refused)
{
    ctxs_store *dst;
    size_t len;
    snapshot before;
    uint8_t *f = hostile_setup(&dst, &len, &before);
    void (*edits[])(uint8_t *, uint32_t) = {flip_kv, change_id, change_sum};
    for (uint32_t blk = 0; blk < 4; blk++)
        for (size_t e = 0; e < 3; e++) {
            size_t n = len;
            uint8_t *g = rewrite_block(f, &n, blk, edits[e]);
            int rc = import_bytes(dst, g, n, NULL);
            cr_assert_eq(rc, CTXS_ECORRUPT, "block %u, edit %zu: %s", blk, e, ctxs_err_name(rc));
            free(g);
        }
    unchanged(&before, dst, "dst", "a token that does not verify");
    /* The same rewrite without an edit is a valid file (another zlib
     * level): the tests above failed for the edit alone. */
    size_t n = len;
    uint8_t *g = rewrite_block(f, &n, 2, no_change);
    int rc = import_bytes(dst, g, n, NULL);
    cr_assert_eq(rc, 0, "%s", ctxs_err_name(rc));
    free(g);
    free(f);
    ctxs_store_close(dst);
}

/* Damages the file between import's two passes. */
typedef struct damage_job {
    const char *path;
    uint64_t size;
    int done;
} damage_job;

static void damage_after_pass_one(void *arg, uint64_t done, uint64_t total)
{
    damage_job *j = arg;
    if (j->done || done < j->size - T_BYTES || done >= total / 2 + 1)
        return;
    /* The last block was read by pass 1: flip a byte of the first. */
    int fd = open(j->path, O_RDWR);
    cr_assert_geq(fd, 0);
    uint8_t c;
    cr_assert_eq(pread(fd, &c, 1, H_BYTES + B_BYTES + 5), 1);
    c ^= 0x10;
    cr_assert_eq(pwrite(fd, &c, 1, H_BYTES + B_BYTES + 5), 1);
    close(fd);
    j->done = 1;
}

Test(transfer, a_file_changed_between_the_passes_is_refused_and_leaves_nothing)
{
    ctxs_store *dst;
    size_t len;
    snapshot before;
    uint8_t *f = hostile_setup(&dst, &len, &before);
    /* A store that does not know the model: the import would register it. */
    ctxs_store *other = store_at("other");
    snapshot other_before = snap(other, "other");
    const char *path = ts_path(ts_scratch, "changing.ctxx");
    cr_assert_eq(ts_write_file(path, f, len), 0);
    damage_job j = {path, len, 0};
    ctxs_store_session_import_options io = CTXS_STORE_SESSION_IMPORT_OPTIONS_INIT;
    io.progress = damage_after_pass_one;
    io.progress_arg = &j;
    int rc = ctxs_store_session_import(NULL, other, path, NULL, &io);
    cr_assert(j.done, "the file was not damaged between the passes");
    cr_assert_eq(rc, CTXS_ECORRUPT, "%s", ctxs_err_name(rc));
    unchanged(&other_before, other, "other", "changed between passes");
    /* Nothing half done is found at the next open either. */
    ctxs_store_close(other);
    other = store_at("other");
    unchanged(&other_before, other, "other", "changed between passes, reopened");
    ctxs_store_close(other);
    free(f);
    ctxs_store_close(dst);
}

/* Ends the process in the middle of import's second pass: the session
 * file is half written aside, the intent recorded. */
static void die_in_pass_two(void *arg, uint64_t done, uint64_t total)
{
    (void)arg;
    if (done > total / 2 + H_BYTES)
        _exit(0);
}

/* named: the file written aside has a temporary name, as where the
 * filesystem has no O_TMPFILE; the killed import leaves it, with its intent,
 * for the next open to remove. Unnamed, it leaves only the intent. */
static void import_killed_in_pass_two(bool named)
{
    ctxs__aside_force_named(named);
    ctxs_store *src = store_at("src");
    ctxs_model m = ts_model(1);
    ctxs_session_close(mk(src, "chat", &m, 256, 4, 1, 200));
    const char *path = ts_path(ts_scratch, "chat.ctxx");
    export_ok(src, "chat", path);
    ctxs_store_close(src);

    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        ctxs_store *st;
        if (ctxs_store_open(&st, ts_path(ts_scratch, "dst"), CTXS_STORE_CREATE, NULL) != 0)
            _exit(2);
        ctxs_store_session_import_options io = CTXS_STORE_SESSION_IMPORT_OPTIONS_INIT;
        io.progress = die_in_pass_two;
        io.progress_arg = NULL;
        ctxs_store_session_import(NULL, st, path, NULL, &io);
        _exit(3); /* the import finished: it was not killed in pass 2 */
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: %#x", status);
    const char *sessions = ts_path(ts_scratch, "dst/sessions");
    cr_assert_eq(ts_dir_entries(sessions), named ? 1 : 0, "%d files written aside in sessions/",
                 ts_dir_entries(sessions));

    ctxs_store *dst = store_at("dst");
    snapshot now = snap(dst, "dst");
    cr_assert_eq(now.n, 0);
    cr_assert_eq(now.files, 0, "%d files left in sessions/", now.files);
    cr_assert_eq(now.n_models, 0);
    /* And the same import goes through. */
    cr_assert_eq(ctxs_store_session_import(NULL, dst, path, NULL, NULL), 0);
    ctxs_session *t = op(dst, "chat");
    cr_assert_eq(ts_check_all(t), 0);
    ctxs_session_close(t);
    ctxs_store_close(dst);
}

Test(transfer, a_process_killed_during_an_import_leaves_nothing_at_the_next_open)
{
    import_killed_in_pass_two(false);
}

Test(transfer, a_killed_import_that_wrote_aside_under_a_name_leaves_nothing_at_the_next_open)
{
    import_killed_in_pass_two(true);
}

/* Ends the process halfway through an export. */
static void die_halfway(void *arg, uint64_t done, uint64_t total)
{
    (void)arg;
    if (done > total / 2)
        _exit(0);
}

/* An export killed halfway leaves nothing beside its path: its file has no
 * name until it is complete. Where there is no O_TMPFILE (named) it leaves
 * "<path>.tmp-<pid>-<n>", which nothing outside a store removes. */
static void export_killed_halfway(bool named)
{
    ctxs_store *src = store_at("src");
    ctxs_model m = ts_model(1);
    ctxs_session_close(mk(src, "chat", &m, 256, 4, 1, 200));
    const char *dir = ts_path(ts_scratch, "exports");
    cr_assert_eq(mkdir(dir, 0700), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        ctxs__aside_force_named(named);
        ctxs_store_session_export_options xo = CTXS_STORE_SESSION_EXPORT_OPTIONS_INIT;
        xo.progress = die_halfway;
        xo.progress_arg = NULL;
        ctxs_store_session_export(src, "chat", ts_path(dir, "chat.ctxx"), &xo);
        _exit(3); /* the export finished: it was not stopped halfway */
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: %#x", status);
    cr_assert_eq(ts_dir_entries(dir), named ? 1 : 0, "%d files in the export's directory",
                 ts_dir_entries(dir));
    /* The export goes through afterwards, and imports. */
    export_ok(src, "chat", ts_path(dir, "chat.ctxx"));
    ctxs_store *dst = store_at("dst");
    cr_assert_eq(ctxs_store_session_import(NULL, dst, ts_path(dir, "chat.ctxx"), NULL, NULL), 0);
    ctxs_session *t = op(dst, "chat");
    cr_assert_eq(ts_check_all(t), 0);
    ctxs_session_close(t);
    ctxs_store_close(dst);
    ctxs_store_close(src);
}

Test(transfer, an_export_killed_halfway_leaves_no_file)
{
    export_killed_halfway(false);
}

Test(transfer, an_export_killed_halfway_without_o_tmpfile_leaves_its_temporary_name)
{
    export_killed_halfway(true);
}

/* --- Full disks ------------------------------------------------------------ */

static void body_export_full(const char *mnt)
{
    ts_enter_small_disk(mnt, "64k");
    ctxs_store *a;
    char dir[1200], out[1200];
    snprintf(dir, sizeof(dir), "%s/a", ts_scratch);
    TS_CHECK(ctxs_store_open(&a, dir, CTXS_STORE_CREATE, NULL) == 0, "store");
    ctxs_model m = ts_model(1);
    TS_CHECK(ctxs_model_register(a, &m, NULL) == 0, "register");
    ctxs_create_options o = ts_options(4096, 4, 1, CTXS_SYNC_NONE);
    ctxs_session *s;
    TS_CHECK(ctxs_store_session_create(&s, a, "chat", &m, &o) == 0, "create");
    for (int i = 0; i < 20; i++)
        TS_CHECK(ts_append(s, 100) == 0, "append");
    snprintf(out, sizeof(out), "%s/chat.ctxx", mnt);
    int rc = ctxs_store_session_export(a, "chat", out, NULL);
    TS_CHECK(rc == CTXS_EFULL, "export of 256 KiB to 64 KiB: %s", ctxs_err_name(rc));
    TS_CHECK(ts_dir_entries(mnt) == 0, "a failed export left %d files", ts_dir_entries(mnt));
    ctxs_session_close(s);
    ctxs_store_close(a);
    ts_say("ok\n");
    _exit(0);
}

Test(transfer, an_export_into_a_full_disk_is_efull_and_leaves_no_file)
{
    ts_run_child(body_export_full, "export to a full disk");
}

static void body_import_full(const char *mnt)
{
    ts_enter_small_disk(mnt, "1m");
    char dir[1200], path[1200];
    snprintf(dir, sizeof(dir), "%s/a", ts_scratch);
    snprintf(path, sizeof(path), "%s/chat.ctxx", ts_scratch);
    ctxs_store *a, *b;
    TS_CHECK(ctxs_store_open(&a, dir, CTXS_STORE_CREATE, NULL) == 0, "store a");
    ctxs_model m = ts_model(1);
    TS_CHECK(ctxs_model_register(a, &m, NULL) == 0, "register");
    ctxs_create_options o = ts_options(16384, 4, 1, CTXS_SYNC_NONE);
    ctxs_session *s;
    TS_CHECK(ctxs_store_session_create(&s, a, "chat", &m, &o) == 0, "create");
    for (int i = 0; i < 100; i++)
        TS_CHECK(ts_append(s, 100) == 0, "append");
    ctxs_session_close(s);
    TS_CHECK(ctxs_store_session_export(a, "chat", path, NULL) == 0, "export");
    snprintf(dir, sizeof(dir), "%s/store", mnt);
    TS_CHECK(ctxs_store_open(&b, dir, CTXS_STORE_CREATE, NULL) == 0, "store b");
    int rc = ctxs_store_session_import(NULL, b, path, NULL, NULL);
    TS_CHECK(rc == CTXS_EFULL, "import of 1.3 MiB of KV into 1 MiB: %s", ctxs_err_name(rc));
    ctxs_session_entry *list;
    size_t n;
    TS_CHECK(ctxs_store_session_list(&list, &n, b) == 0 && n == 0, "a session was left");
    snprintf(dir, sizeof(dir), "%s/store/sessions", mnt);
    TS_CHECK(ts_dir_entries(dir) == 0, "a failed import left %d files", ts_dir_entries(dir));
    ctxs_model_entry e;
    TS_CHECK(ctxs_model_get(&e, b, m.model_hash) == CTXS_ENOTFOUND, "the model was registered");
    ctxs_store_close(b);
    ctxs_store_close(a);
    ts_say("ok\n");
    _exit(0);
}

Test(transfer, an_import_into_a_full_disk_is_efull_and_leaves_nothing)
{
    ts_run_child(body_import_full, "import to a full disk");
}

/* --- Files written by earlier versions --------------------------------------- */

/* tests/data/export_v1_0.ctxx was written by the 1.0 export code
 * (tests/data/make_export_v1_0.c says how); meson passes the folder in
 * CTXS_TEST_DATA. Import only reads it. */
static const char *old_export(const char *name)
{
    const char *dir = getenv("CTXS_TEST_DATA");
    cr_assert(dir && *dir, "CTXS_TEST_DATA is not set: run the suite through meson test");
    return ts_path(dir, name);
}

Test(transfer, an_export_file_of_format_1_0_imports)
{
    ctxs_store *st = store_at("dst");
    char name[CTXS_NAME_MAX + 1];
    int rc = ctxs_store_session_import(name, st, old_export("export_v1_0.ctxx"), NULL, NULL);
    cr_assert_eq(rc, 0, "import a 1.0 export: %s", ctxs_err_name(rc));
    cr_assert_str_eq(name, "old chat");
    ctxs_model m = ts_model(1);
    ctxs_model_entry e;
    cr_assert_eq(ctxs_model_get(&e, st, m.model_hash), 0);
    cr_assert_str_eq(e.name, "tiny model");
    ctxs_session *s = op(st, "old chat");
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert(memcmp(&info.model, &m, sizeof(m)) == 0, "the model");
    cr_assert_eq(info.capacity, 64);
    cr_assert_eq(info.n_sink, 4);
    cr_assert(info.flags & CTXS_INFO_RING);
    cr_assert_eq(info.n_tokens, 100);
    cr_assert_eq(info.ring_start, 40);
    cr_assert_eq(info.n_held, 64);
    cr_assert_eq(ts_check_all(s), 0, "tokens of a 1.0 export do not read back");
    cr_assert_eq(ctxs_session_verify(NULL, s), 0);
    ctxs_session_close(s);
    ctxs_store_close(st);
}

/* --- Metadata (export 2.0) ------------------------------------------------- */

static void set_meta(ctxs_store *st, const char *name, const char *key, const void *v, size_t n)
{
    int rc = ctxs_store_session_set_meta(st, name, key, v, n);
    cr_assert_eq(rc, 0, "set %s: %s", key, ctxs_err_name(rc));
}

/* The two sessions' metadata are the same, key by key and byte by byte. */
static void same_meta(ctxs_store *a, const char *an, ctxs_store *b, const char *bn, size_t want)
{
    ctxs_meta_entry *x, *y;
    size_t nx, ny;
    cr_assert_eq(ctxs_store_session_list_meta(&x, &nx, a, an), 0);
    cr_assert_eq(ctxs_store_session_list_meta(&y, &ny, b, bn), 0);
    cr_assert_eq(nx, want);
    cr_assert_eq(ny, nx);
    for (size_t i = 0; i < nx; i++) {
        cr_assert_str_eq(x[i].key, y[i].key);
        cr_assert_eq(x[i].value_bytes, y[i].value_bytes, "%s", x[i].key);
        cr_assert(memcmp(x[i].value, y[i].value, x[i].value_bytes) == 0, "%s", x[i].key);
    }
    ctxs_free(x);
    ctxs_free(y);
}

Test(transfer, metadata_round_trips_with_the_session)
{
    ctxs_store *src = store_at("src"), *dst = store_at("dst");
    ctxs_model m = ts_model(1);
    ctxs_session_close(mk(src, "chat", &m, 256, 4, 1, 150));
    uint8_t *big = malloc(CTXS_META_VALUE_MAX);
    for (size_t i = 0; i < CTXS_META_VALUE_MAX; i++)
        big[i] = (uint8_t)(i * 7 + (i >> 8));
    set_meta(src, "chat", "title", "Trip to Lisbon", 14);
    set_meta(src, "chat", "app.json", "{\"pinned\":true}", 15);
    set_meta(src, "chat", "empty", "", 0);
    set_meta(src, "chat", "binary", "\0\1\2\0\377", 5);
    set_meta(src, "chat", "template", big, CTXS_META_VALUE_MAX);
    const char *path = ts_path(ts_scratch, "chat.ctxx");
    export_ok(src, "chat", path);
    size_t len;
    uint8_t *f = ts_read_file(path, &len);
    cr_assert_eq(get32(f + H_OFF(meta_count)), 5);
    cr_assert_eq(f[H_OFF(version_major)], 2);
    free(f);
    char name[CTXS_NAME_MAX + 1];
    cr_assert_eq(ctxs_store_session_import(name, dst, path, NULL, NULL), 0);
    same_meta(src, "chat", dst, "chat", 5);
    /* Under another name, in the same store. */
    cr_assert_eq(ctxs_store_session_import(name, src, path, "copy", NULL), 0);
    same_meta(src, "chat", src, "copy", 5);
    ctxs_session *a = op(src, "chat"), *b = op(dst, "chat");
    same_session(a, b);
    ctxs_session_close(a);
    ctxs_session_close(b);
    free(big);
    ctxs_store_close(src);
    ctxs_store_close(dst);
}

Test(transfer, an_export_file_of_format_1_0_has_no_metadata_whatever_its_reserved_bytes)
{
    ctxs_store *st = store_at("dst");
    size_t len;
    uint8_t *f = ts_read_file(old_export("export_v1_0.ctxx"), &len);
    cr_assert_not_null(f);
    cr_assert_eq(f[H_OFF(version_major)], 1);
    ctxs_meta_entry *list;
    size_t n;
    cr_assert_eq(import_bytes(st, f, len, "plain"), 0);
    cr_assert_eq(ctxs_store_session_list_meta(&list, &n, st, "plain"), 0);
    cr_assert_eq(n, 0);
    cr_assert_null(list);
    /* 1.0 reserved the bytes where 2.0 keeps the section's size: a 1.0
     * file with anything there still imports, without metadata. */
    put32(f + H_OFF(meta_bytes), 12);
    put32(f + H_OFF(meta_crc32), 0xdeadbeef);
    put32(f + H_OFF(meta_count), 1);
    reseal_header(f);
    uint8_t *t = f + len - T_BYTES;
    put32(t + T_OFF(body_crc32), crc(f, len - T_BYTES));
    put32(t + T_OFF(crc32), crc(t, T_OFF(crc32)));
    cr_assert_eq(import_bytes(st, f, len, "reserved"), 0);
    cr_assert_eq(ctxs_store_session_list_meta(&list, &n, st, "reserved"), 0);
    cr_assert_eq(n, 0);
    free(f);
    ctxs_store_close(st);
}

/* f (an export without metadata) with section (sec_len bytes, count
 * entries) spliced in after the header, every CRC valid; *out_len gets
 * its size. */
static uint8_t *with_section(const uint8_t *f, size_t len, const uint8_t *section, size_t sec_len,
                             uint32_t count, size_t *out_len)
{
    cr_assert_eq(get32(f + H_OFF(meta_bytes)), 0);
    uint8_t *g = malloc(len + sec_len);
    memcpy(g, f, H_BYTES);
    memcpy(g + H_BYTES, section, sec_len);
    memcpy(g + H_BYTES + sec_len, f + H_BYTES, len - H_BYTES);
    put32(g + H_OFF(meta_bytes), (uint32_t)sec_len);
    put32(g + H_OFF(meta_crc32), sec_len ? crc(section, sec_len) : 0);
    put32(g + H_OFF(meta_count), count);
    *out_len = len + sec_len;
    reseal_all(g, *out_len);
    return g;
}

/* Appends an entry (key_len bytes of key, value_bytes of 'v') to sec. */
static size_t entry(uint8_t *sec, size_t at, const char *key, uint16_t key_len, uint32_t value_bytes,
                    uint16_t reserved0)
{
    ctxs__export_meta m = {key_len, reserved0, value_bytes};
    memcpy(sec + at, &m, sizeof(m));
    memcpy(sec + at + sizeof(m), key, key_len);
    memset(sec + at + sizeof(m) + key_len, 'v', value_bytes);
    return at + sizeof(m) + key_len + value_bytes;
}

Test(transfer, hostile_metadata_sections_are_refused_and_change_nothing)
{
    ctxs_store *dst;
    size_t len, glen;
    snapshot before;
    uint8_t *f = hostile_setup(&dst, &len, &before);
    uint8_t *sec = calloc(1, 6u << 20);
    uint8_t *g;
    size_t n;
    /* The splice itself is sound: a good section imports. */
    n = entry(sec, 0, "a", 1, 3, 0);
    n = entry(sec, n, "b", 1, 0, 0);
    g = with_section(f, len, sec, n, 2, &glen);
    cr_assert_eq(import_bytes(dst, g, glen, "good"), 0);
    uint8_t v[8];
    size_t vb = sizeof(v);
    cr_assert_eq(ctxs_store_session_get_meta(v, &vb, dst, "good", "a"), 0);
    cr_assert(vb == 3 && memcmp(v, "vvv", 3) == 0);
    cr_assert_eq(ctxs_store_session_delete(dst, "good"), 0);
    free(g);

    struct {
        const char *what;
        size_t len;
        uint32_t count;
    } bad[16];
    uint8_t *secs[16];
    int k = 0;
#define BAD(what_, count_, ...)                                                                    \
    do {                                                                                           \
        secs[k] = calloc(1, 6u << 20);                                                             \
        size_t at_ = 0;                                                                            \
        uint8_t *s_ = secs[k];                                                                     \
        __VA_ARGS__;                                                                               \
        bad[k].what = what_;                                                                       \
        bad[k].len = at_;                                                                          \
        bad[k].count = count_;                                                                     \
        k++;                                                                                       \
    } while (0)
    BAD("out of order", 2, at_ = entry(s_, at_, "b", 1, 1, 0); at_ = entry(s_, at_, "a", 1, 1, 0));
    BAD("a key twice", 2, at_ = entry(s_, at_, "a", 1, 1, 0); at_ = entry(s_, at_, "a", 1, 2, 0));
    BAD("a longer key first", 2,
        at_ = entry(s_, at_, "ab", 2, 1, 0); at_ = entry(s_, at_, "a", 1, 1, 0));
    BAD("a key that is no name", 1, at_ = entry(s_, at_, "a/b", 3, 1, 0));
    BAD("an empty key", 1, at_ = entry(s_, at_, "", 0, 1, 0));
    BAD("a NUL in a key", 1, at_ = entry(s_, at_, "a\0b", 3, 1, 0));
    BAD("reserved bits", 1, at_ = entry(s_, at_, "a", 1, 1, 1));
    BAD("a value too big", 1, at_ = entry(s_, at_, "a", 1, CTXS_META_VALUE_MAX + 1, 0));
    BAD("a session too big", 5, for (int i_ = 0; i_ < 5; i_++) {
        char key_[2] = {(char)('a' + i_), 0};
        at_ = entry(s_, at_, key_, 1, CTXS_META_VALUE_MAX, 0);
    });
    BAD("more entries than said", 1,
        at_ = entry(s_, at_, "a", 1, 1, 0); at_ = entry(s_, at_, "b", 1, 1, 0));
    BAD("fewer entries than said", 3,
        at_ = entry(s_, at_, "a", 1, 1, 0); at_ = entry(s_, at_, "b", 1, 1, 0));
    BAD("an entry cut short", 1, at_ = entry(s_, at_, "abc", 3, 10, 0) - 1);
    BAD("a count without bytes", 1, (void)s_);
#undef BAD
    for (int i = 0; i < k; i++) {
        g = with_section(f, len, secs[i], bad[i].len, bad[i].count, &glen);
        int rc = import_bytes(dst, g, glen, "x");
        cr_expect_eq(rc, CTXS_ECORRUPT, "%s: %s", bad[i].what, ctxs_err_name(rc));
        free(g);
        free(secs[i]);
    }
    /* The section's CRC, and a size past the file or the bound. */
    n = entry(sec, 0, "a", 1, 3, 0);
    g = with_section(f, len, sec, n, 1, &glen);
    put32(g + H_OFF(meta_crc32), get32(g + H_OFF(meta_crc32)) ^ 1);
    reseal_all(g, glen);
    cr_assert_eq(import_bytes(dst, g, glen, "x"), CTXS_ECORRUPT);
    free(g);
    g = malloc(len);
    memcpy(g, f, len);
    put32(g + H_OFF(meta_bytes), (uint32_t)len);
    reseal_header(g);
    cr_assert_eq(import_bytes(dst, g, len, "x"), CTXS_ECORRUPT);
    put32(g + H_OFF(meta_bytes), UINT32_MAX);
    reseal_header(g);
    cr_assert_eq(import_bytes(dst, g, len, "x"), CTXS_ECORRUPT);
    free(g);
    unchanged(&before, dst, "dst", "hostile metadata");
    free(sec);
    free(f);
    ctxs_store_close(dst);
}
