/*
 * Hostile session files: every malformed file must give a clear error from
 * ctxs_session_open(), read-only and read-write, and never crash, hang,
 * succeed, or modify the file. Also the internal format helpers
 * (src/store/format.h) on crafted headers and records, ctxs_session_create()
 * argument checking, and the error strings.
 *
 * Hostile files are made by creating a valid session, closing it, and editing
 * its bytes; where the edit must get past the header CRC, the CRC is
 * recomputed with zlib, as the format says (crc32 of bytes 0..251).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>
#include <xxhash.h>
#include <zlib.h>

#include "format.h"
#include "label.h"
#include "platform.h"
#include "support.h"
#include "xxh3_lanes.h"


TestSuite(format, .init = ts_scratch_init, .fini = ts_scratch_fini, .timeout = 120);

/* --- helpers ---------------------------------------------------------- */

#define PRISTINE_CAP 1024u
#define PRISTINE_SINK 4u

static uint32_t header_crc(const ctxs__disk_header *h)
{
    return (uint32_t)crc32(0L, (const Bytef *)h, 252);
}

static uint32_t record_crc(const ctxs__disk_record *r)
{
    return (uint32_t)crc32(0L, (const Bytef *)r, 124);
}

static void raw_read(const char *path, uint64_t off, void *buf, size_t n)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0, "open %s: %s", path, strerror(errno));
    cr_assert_eq(pread(fd, buf, n, (off_t)off), (ssize_t)n, "pread %s", path);
    close(fd);
}

static void raw_write(const char *path, uint64_t off, const void *buf, size_t n)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0, "open %s: %s", path, strerror(errno));
    cr_assert_eq(pwrite(fd, buf, n, (off_t)off), (ssize_t)n, "pwrite %s", path);
    close(fd);
}

static void hdr_read(const char *path, ctxs__disk_header *h)
{
    raw_read(path, 0, h, sizeof(*h));
}

/* Writes h at offset 0; with fix_crc, after recomputing its CRC. */
static void hdr_write(const char *path, ctxs__disk_header *h, int fix_crc)
{
    if (fix_crc)
        h->crc32 = header_crc(h);
    raw_write(path, 0, h, sizeof(*h));
}

static void rec_read(const char *path, int i, ctxs__disk_record *r)
{
    raw_read(path, i ? CTXS__RECORD1_OFF : CTXS__RECORD0_OFF, r, sizeof(*r));
}

static void rec_write(const char *path, int i, ctxs__disk_record *r, int fix_crc)
{
    if (fix_crc)
        r->crc32 = record_crc(r);
    raw_write(path, i ? CTXS__RECORD1_OFF : CTXS__RECORD0_OFF, r, sizeof(*r));
}

static uint64_t file_size(const char *path)
{
    struct stat st;
    cr_assert_eq(lstat(path, &st), 0, "stat %s: %s", path, strerror(errno));
    return (uint64_t)st.st_size;
}

static void set_size(const char *path, uint64_t size)
{
    cr_assert_eq(truncate(path, (off_t)size), 0, "truncate %s: %s", path, strerror(errno));
}

static void copy_file(const char *from, const char *to)
{
    size_t len;
    uint8_t *b = ts_read_file(from, &len);
    cr_assert_eq(ts_write_file(to, b, len), 0);
    free(b);
}

static ctxs_create_options opts_for(uint32_t capacity, uint32_t n_sink, uint32_t ring)
{
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = capacity;
    o.n_sink = n_sink;
    o.ring = ring;
    return o;
}

/* Creates a session of ts_model(1) at name with commits of the given sizes,
 * closes it and returns its path (static storage, one per call site use). */
static const char *make_session(const char *name, uint32_t capacity, uint32_t ring,
                                const uint32_t *commits, int n_commits)
{
    static char paths[4][4096];
    static unsigned next;
    char *p = paths[next++ % 4];
    snprintf(p, sizeof(paths[0]), "%s/%s", ts_scratch, name);
    ctxs_model m = ts_model(1);
    ctxs_create_options o = opts_for(capacity, PRISTINE_SINK, ring);
    ctxs_session *s = NULL;
    int rc = ctxs_session_create(&s, p, &m, &o);
    cr_assert_eq(rc, 0, "create %s: %s", p, ctxs_strerror(rc));
    cr_assert_not_null(s);
    for (int i = 0; i < n_commits; i++) {
        rc = ts_append(s, commits[i]);
        cr_assert_eq(rc, 0, "append %u: %s", commits[i], ctxs_strerror(rc));
    }
    ctxs_session_close(s);
    return p;
}

static const char *make_pristine(const char *name)
{
    static const uint32_t commits[] = { 10, 7, 20 };
    return make_session(name, PRISTINE_CAP, 1, commits, 3);
}

/* Opens path; on success checks the session reads back and closes it. On
 * failure checks *out was set to NULL. Returns the open's result. */
static int try_open(const char *path, const ctxs_model *m, unsigned flags)
{
    ctxs_session *s = (ctxs_session *)(uintptr_t)0x1;
    int rc = ctxs_session_open(&s, path, m, flags, NULL);
    if (rc == 0) {
        cr_assert_not_null(s);
        ctxs_session_close(s);
    } else {
        cr_assert_null(s, "open failed (%s) but *out is not NULL", ctxs_err_name(rc));
    }
    return rc;
}

static int in_set(int rc, const int *allowed, int n)
{
    for (int i = 0; i < n; i++)
        if (rc == allowed[i])
            return 1;
    return 0;
}

/* Opens path read-only (without and with a model) and read-write; each must
 * fail with one of allowed and leave the file's bytes unchanged. */
static void expect_refused_any(const char *path, const char *what, const int *allowed, int n)
{
    ctxs_model m = ts_model(1);
    size_t len0 = 0, len1 = 0;
    struct stat st;
    int regular = stat(path, &st) == 0 && S_ISREG(st.st_mode);
    uint8_t *before = regular ? ts_read_file(path, &len0) : NULL;

    struct {
        const ctxs_model *m;
        unsigned flags;
        const char *mode;
    } modes[] = {
        { NULL, CTXS_RDONLY, "read-only, no model" },
        { &m, CTXS_RDONLY, "read-only" },
        { &m, 0, "read-write" },
    };
    for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
        int rc = try_open(path, modes[i].m, modes[i].flags);
        cr_assert(in_set(rc, allowed, n), "%s, %s: open returned %d (%s), want %s%s", what,
                  modes[i].mode, rc, ctxs_err_name(rc), ctxs_err_name(allowed[0]),
                  n > 1 ? " or similar" : "");
    }
    if (before) {
        uint8_t *after = ts_read_file(path, &len1);
        cr_assert_eq(len0, len1, "%s: a refused open changed the file size", what);
        cr_assert(memcmp(before, after, len0) == 0, "%s: a refused open changed the file", what);
        free(after);
        free(before);
    }
}

static void expect_refused(const char *path, const char *what, int want)
{
    expect_refused_any(path, what, &want, 1);
}

/* Checks that path opens in every mode and holds n_tokens tokens that read
 * back as written. */
static void expect_opens(const char *path, const char *what, uint64_t n_tokens)
{
    ctxs_model m = ts_model(1);
    unsigned flags[] = { CTXS_RDONLY, 0 };
    for (int i = 0; i < 2; i++) {
        ctxs_session *s = NULL;
        int rc = ctxs_session_open(&s, path, &m, flags[i], NULL);
        cr_assert_eq(rc, 0, "%s (%s): open: %s", what, i ? "read-write" : "read-only",
                     ctxs_strerror(rc));
        ctxs_session_info info;
        cr_assert_eq(ctxs_session_get_info(&info, s), 0);
        cr_assert_eq(info.n_tokens, n_tokens, "%s: n_tokens %llu, want %llu", what,
                     (unsigned long long)info.n_tokens, (unsigned long long)n_tokens);
        cr_assert_eq(ts_check_all(s), 0, "%s: tokens do not read back", what);
        ctxs_session_close(s);
    }
}

static uint64_t n_tokens_of(ctxs_session *s)
{
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    return info.n_tokens;
}

/* --- a valid file is what format.h says --------------------------------- */

Test(format, created_file_matches_the_documented_layout)
{
    const char *p = make_pristine("ok.ctxs");
    ctxs_model m = ts_model(1);
    ctxs__disk_header h;
    hdr_read(p, &h);

    cr_assert(memcmp(h.magic, CTXS__FILE_MAGIC, 8) == 0, "magic");
    cr_assert_eq(h.version_major, CTXS__FORMAT_MAJOR);
    cr_assert_eq(h.version_minor, CTXS__FORMAT_MINOR);
    cr_assert_eq(h.header_bytes, CTXS__HEADER_BYTES);
    cr_assert_eq(h.page_bytes, CTXS__PAGE);
    cr_assert_eq(h.record_bytes, CTXS__RECORD_BYTES);
    cr_assert_eq(h.record_off[0], CTXS__RECORD0_OFF);
    cr_assert_eq(h.record_off[1], CTXS__RECORD1_OFF);
    cr_assert_eq(h.crc32, header_crc(&h), "header CRC is not zlib crc32 of bytes 0..251");
    cr_assert(h.flags & CTXS__FLAG_RING);
    cr_assert_eq(h.dtype, CTXS_DTYPE_F16);
    cr_assert_eq(h.elem_bytes, 2);
    cr_assert_eq(h.n_layers, m.geometry.n_layers);
    cr_assert_eq(h.n_kv_heads, m.geometry.n_kv_heads);
    cr_assert_eq(h.head_dim, m.geometry.head_dim);
    cr_assert_eq(h.capacity, PRISTINE_CAP);
    cr_assert_eq(h.n_sink, PRISTINE_SINK);
    cr_assert(memcmp(h.model_hash, m.model_hash, 16) == 0);
    cr_assert(memcmp(h.tokenizer_hash, m.tokenizer_hash, 16) == 0);
    cr_assert_neq(h.created_unix_ms, 0);
    for (size_t i = 0; i < sizeof(h.reserved); i++)
        cr_assert_eq(h.reserved[i], 0, "reserved byte %zu not zero", i);

    ctxs__file_layout lay;
    cr_assert_eq(ctxs__layout_compute(&lay, &m.geometry, PRISTINE_CAP, PRISTINE_SINK, CTXS_DEFAULT_BATCH), 0);
    cr_assert_eq(h.tokens_off, lay.tokens_off);
    cr_assert_eq(h.tokens_bytes, lay.tokens_bytes);
    cr_assert_eq(h.sums_off, lay.sums_off);
    cr_assert_eq(h.sums_bytes, lay.sums_bytes);
    cr_assert_eq(h.kv_off, lay.kv_off);
    cr_assert_eq(h.kv_bytes, lay.kv_bytes);
    cr_assert_eq(h.file_bytes, lay.file_bytes);
    cr_assert_eq(file_size(p), h.file_bytes, "file size %llu != header.file_bytes %llu",
                 (unsigned long long)file_size(p), (unsigned long long)h.file_bytes);

    ctxs__file_layout chk;
    cr_assert_eq(ctxs__header_check(&h, h.file_bytes, &chk), 0);
    cr_assert(memcmp(&chk, &lay, sizeof(lay)) == 0, "header_check layout != layout_compute");

    /* Commits of 10, 7, 20: three records written alternately; the newer
     * one holds 37 tokens, the older 17. */
    ctxs__disk_record r[2];
    for (int i = 0; i < 2; i++) {
        rec_read(p, i, &r[i]);
        cr_assert(memcmp(r[i].magic, CTXS__RECORD_MAGIC, 4) == 0, "record %d magic", i);
        cr_assert_eq(r[i].index, (uint32_t)i);
        cr_assert_eq(r[i].crc32, record_crc(&r[i]), "record %d CRC", i);
        cr_assert(ctxs__record_valid(&r[i], (uint32_t)i, &lay, 1), "record %d invalid", i);
        cr_assert_eq(ctxs__record_valid(&r[i], (uint32_t)!i, &lay, 1), 0,
                     "record %d valid at the other index", i);
    }
    int newer = r[1].seq > r[0].seq;
    cr_assert_eq(r[newer].seq, r[!newer].seq + 1, "seqs %llu %llu",
                 (unsigned long long)r[0].seq, (unsigned long long)r[1].seq);
    cr_assert_eq(r[newer].n_tokens, 37);
    cr_assert_eq(r[!newer].n_tokens, 17);

    /* The token-id table holds the ids in slot order. */
    uint32_t ids[37];
    raw_read(p, h.tokens_off, ids, sizeof(ids));
    for (uint32_t i = 0; i < 37; i++)
        cr_assert_eq(ids[i], ts_token(i), "token id of slot %u", i);

    /* And the KV of one (layer, kind, head, slot) sits where the layout says. */
    uint16_t k[2 * 2 * 8], v[2 * 2 * 8], got[8];
    ts_fill_kv(&m.geometry, 33, k, v);
    uint64_t off = h.kv_off + 1 * lay.layer_stride + CTXS_V * lay.kv_stride + 1 * lay.head_stride +
                   33 * lay.slot_bytes;
    raw_read(p, off, got, sizeof(got));
    cr_assert(memcmp(got, v + (1 * 2 + 1) * 8, sizeof(got)) == 0, "V(1,1,33) is not in place");
}

Test(format, large_capacity_file_is_sparse)
{
    const char *p = ts_path(ts_scratch, "big.ctxs");
    ctxs_model m = ts_model(2);
    m.geometry = (ctxs_geometry){ 8, 8, 128, CTXS_DTYPE_F16, 0, {0} }; /* 128 MiB of KV */
    ctxs_create_options o = opts_for(4096, 4, 1);
    ctxs_session *s = NULL;
    int rc = ctxs_session_create(&s, p, &m, &o);
    cr_assert_eq(rc, 0, "%s", ctxs_strerror(rc));
    ctxs_session_close(s);
    struct stat st;
    cr_assert_eq(stat(p, &st), 0);
    cr_assert_geq((uint64_t)st.st_size, 128ull << 20);
    cr_assert_lt((uint64_t)st.st_blocks * 512, 4ull << 20,
                 "a fresh 128 MiB session takes %llu bytes of disk",
                 (unsigned long long)st.st_blocks * 512);
    cr_assert_eq(st.st_mode & 0777, 0600, "mode %o, want 0600", st.st_mode & 0777);
}

/* --- short and foreign files -------------------------------------------- */

Test(format, empty_file_is_refused)
{
    const char *p = ts_path(ts_scratch, "empty.ctxs");
    cr_assert_eq(ts_write_file(p, "", 0), 0);
    int allowed[] = { CTXS_EFOREIGN, CTXS_ECORRUPT };
    expect_refused_any(p, "empty file", allowed, 2);
}

Test(format, file_shorter_than_the_first_page_is_refused)
{
    const char *p = make_pristine("short.ctxs");
    /* Header intact, records or their page cut: clearly a damaged session. */
    uint64_t sizes[] = { CTXS__PAGE - 1, CTXS__RECORD1_OFF + 64, CTXS__RECORD1_OFF, CTXS__RECORD0_OFF + 1,
                         CTXS__HEADER_BYTES };
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        set_size(p, sizes[i]);
        char what[64];
        snprintf(what, sizeof(what), "%llu-byte file", (unsigned long long)sizes[i]);
        expect_refused(p, what, CTXS_ECORRUPT);
    }
    /* Less than a header, but with the magic: corrupt or foreign. */
    int allowed[] = { CTXS_ECORRUPT, CTXS_EFOREIGN };
    uint64_t tiny[] = { CTXS__HEADER_BYTES - 1, 100, 9, 8, 3, 1 };
    for (size_t i = 0; i < sizeof(tiny) / sizeof(tiny[0]); i++) {
        set_size(p, tiny[i]);
        char what[64];
        snprintf(what, sizeof(what), "%llu-byte file", (unsigned long long)tiny[i]);
        expect_refused_any(p, what, allowed, 2);
    }
}

Test(format, truncated_file_is_corrupt)
{
    const char *pristine = make_pristine("pristine.ctxs");
    ctxs__disk_header h;
    hdr_read(pristine, &h);
    uint64_t sizes[] = { h.file_bytes - 1, h.file_bytes - CTXS__PAGE, h.kv_off + 1, h.kv_off,
                         h.sums_off, h.tokens_off + 100, CTXS__PAGE };
    const char *p = ts_path(ts_scratch, "trunc.ctxs");
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        copy_file(pristine, p);
        set_size(p, sizes[i]);
        char what[96];
        snprintf(what, sizeof(what), "file cut to %llu of %llu bytes",
                 (unsigned long long)sizes[i], (unsigned long long)h.file_bytes);
        expect_refused(p, what, CTXS_ECORRUPT);
    }
    expect_opens(pristine, "pristine", 37);
}

Test(format, wrong_magic_is_foreign)
{
    const char *pristine = make_pristine("pristine.ctxs");
    const char *p = ts_path(ts_scratch, "magic.ctxs");
    const char *magics[] = { "CTXSSESX", "ctxssess", "\0\0\0\0\0\0\0\0", "SQLite f" };
    for (size_t i = 0; i < sizeof(magics) / sizeof(magics[0]); i++) {
        copy_file(pristine, p);
        ctxs__disk_header h;
        hdr_read(p, &h);
        memcpy(h.magic, magics[i], 8);
        hdr_write(p, &h, 1);
        expect_refused(p, "wrong magic, CRC recomputed", CTXS_EFOREIGN);
    }
}

Test(format, text_and_random_files_are_foreign)
{
    const char *p = ts_path(ts_scratch, "foreign.ctxs");

    /* A text file of several pages. */
    size_t n = 5 * CTXS__PAGE;
    char *text = malloc(n);
    for (size_t i = 0; i < n; i++)
        text[i] = "The quick brown fox jumps over the lazy dog.\n"[i % 45];
    cr_assert_eq(ts_write_file(p, text, n), 0);
    expect_refused(p, "text file", CTXS_EFOREIGN);
    cr_assert_eq(ts_write_file(p, text, 300), 0);
    expect_refused(p, "300-byte text file", CTXS_EFOREIGN);
    free(text);

    /* Random bytes, a few sizes. */
    srand(1234);
    size_t sizes[] = { 256, CTXS__PAGE, 4 * CTXS__PAGE, 1u << 20 };
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        uint8_t *b = malloc(sizes[s]);
        for (size_t i = 0; i < sizes[s]; i++)
            b[i] = (uint8_t)(rand() >> 7);
        cr_assert_eq(ts_write_file(p, b, sizes[s]), 0);
        expect_refused(p, "random bytes", CTXS_EFOREIGN);
        free(b);
    }

    /* All zeros. */
    uint8_t *z = calloc(1, 4 * CTXS__PAGE);
    cr_assert_eq(ts_write_file(p, z, 4 * CTXS__PAGE), 0);
    expect_refused(p, "zeros", CTXS_EFOREIGN);
    free(z);

    /* An executable. */
    size_t len;
    uint8_t *elf = ts_read_file("/proc/self/exe", &len);
    cr_assert_eq(ts_write_file(p, elf, len), 0);
    expect_refused(p, "ELF executable", CTXS_EFOREIGN);
    free(elf);
}

Test(format, magic_followed_by_garbage_is_corrupt)
{
    const char *p = ts_path(ts_scratch, "garbage.ctxs");
    size_t n = 12 * CTXS__PAGE;
    uint8_t *b = malloc(n);
    srand(99);
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(rand() >> 5);
    memcpy(b, CTXS__FILE_MAGIC, 8);
    b[8] = CTXS__FORMAT_MAJOR; /* a version this reader knows: the CRC decides */
    b[9] = 0;
    cr_assert_eq(ts_write_file(p, b, n), 0);
    expect_refused(p, "magic + random bytes", CTXS_ECORRUPT);
    free(b);
}

/* --- versions and CRC ----------------------------------------------------- */

Test(format, future_major_version_is_refused)
{
    const char *pristine = make_pristine("pristine.ctxs");
    const char *p = ts_path(ts_scratch, "future.ctxs");
    uint16_t majors[] = { CTXS__FORMAT_MAJOR + 1, 0x7fff, 0xffff };
    for (size_t i = 0; i < sizeof(majors) / sizeof(majors[0]); i++) {
        copy_file(pristine, p);
        ctxs__disk_header h;
        hdr_read(p, &h);
        h.version_major = majors[i];
        hdr_write(p, &h, 1);
        expect_refused(p, "newer major version", CTXS_EVERSION);
    }
    /* Version 0 was never written: refused one way or another. */
    copy_file(pristine, p);
    ctxs__disk_header h;
    hdr_read(p, &h);
    h.version_major = 0;
    hdr_write(p, &h, 1);
    int allowed[] = { CTXS_EVERSION, CTXS_ECORRUPT };
    expect_refused_any(p, "major version 0", allowed, 2);
}

Test(format, newer_minor_version_is_read)
{
    const char *p = make_pristine("minor.ctxs");
    ctxs__disk_header h;
    hdr_read(p, &h);
    h.version_minor = CTXS__FORMAT_MINOR + 7;
    h.reserved[0] = 0xab; /* "additions that old readers may ignore" */
    hdr_write(p, &h, 1);
    expect_opens(p, "newer minor version", 37);
}

Test(format, bad_header_crc_is_corrupt)
{
    const char *pristine = make_pristine("pristine.ctxs");
    const char *p = ts_path(ts_scratch, "crc.ctxs");
    for (int which = 0; which < 6; which++) {
        copy_file(pristine, p);
        ctxs__disk_header h;
        hdr_read(p, &h);
        switch (which) {
        case 0: h.crc32 ^= 1; break;
        case 1: h.reserved[4] ^= 0x80; break;
        case 2: h.model_hash[3] ^= 1; break;     /* not EMODEL: CRC first */
        case 3: h.capacity = 2048; break;
        case 4: h.created_unix_ms++; break;
        case 5: h.version_minor++; break;
        }
        hdr_write(p, &h, 0);
        char what[48];
        snprintf(what, sizeof(what), "bad header CRC (edit %d)", which);
        expect_refused(p, what, CTXS_ECORRUPT);
    }
}

/* --- header fields that do not add up -------------------------------------- */

/* Applies edit number `which` to a copy of a valid header of file_size
 * bytes; returns its name, or NULL past the last. Every edit makes a header
 * that must be refused with CTXS_ECORRUPT even with a correct CRC. */
static const char *bad_edit(ctxs__disk_header *h, int which)
{
    const uint64_t P = CTXS__PAGE;
    switch (which) {
    case 0: h->n_layers = 0; return "n_layers 0";
    case 1: h->n_layers = CTXS__MAX_DIM + 1; return "n_layers 4097";
    case 2: h->n_kv_heads = 0; return "n_kv_heads 0";
    case 3: h->n_kv_heads = CTXS__MAX_DIM + 1; return "n_kv_heads 4097";
    case 4: h->head_dim = 0; return "head_dim 0";
    case 5: h->head_dim = CTXS__MAX_DIM + 1; return "head_dim 4097";
    case 6: h->n_layers = UINT32_MAX; return "n_layers 0xffffffff";
    case 7: {
        /* The largest geometry in range: 2^62 bytes of KV; the offsets agree
         * with it, the file does not. */
        ctxs_geometry g = { CTXS__MAX_DIM, CTXS__MAX_DIM, CTXS__MAX_DIM, CTXS_DTYPE_F16, 0, {0} };
        ctxs__file_layout lay;
        h->n_layers = h->n_kv_heads = h->head_dim = CTXS__MAX_DIM;
        h->capacity = CTXS__MAX_CAPACITY;
        if (ctxs__layout_compute(&lay, &g, CTXS__MAX_CAPACITY, h->n_sink, 0) == 0) {
            h->tokens_off = lay.tokens_off;
            h->tokens_bytes = lay.tokens_bytes;
            h->sums_off = lay.sums_off;
            h->sums_bytes = lay.sums_bytes;
            h->kv_off = lay.kv_off;
            h->kv_bytes = lay.kv_bytes;
            h->file_bytes = lay.file_bytes;
        }
        return "4096 layers x 4096 heads x 4096 dims x 16 Mi slots, offsets to match";
    }
    case 8:
        h->n_layers = h->n_kv_heads = h->head_dim = h->capacity = UINT32_MAX;
        return "every dimension 0xffffffff";
    case 9:
        h->n_layers = h->n_kv_heads = h->head_dim = 1u << 16;
        h->capacity = 1u << 30;
        return "dimensions whose product overflows 64 bits";
    case 10: h->capacity = 0; return "capacity 0";
    case 11: h->capacity = CTXS__MAX_CAPACITY + 1; return "capacity over 16 Mi";
    case 12: h->capacity *= 2; return "capacity doubled, offsets stale";
    case 13: h->n_sink = h->capacity; return "n_sink == capacity";
    case 14: h->n_sink = h->capacity + 1; return "n_sink > capacity";
    case 15: h->n_sink = UINT32_MAX; return "n_sink 0xffffffff";
    case 16: h->dtype = 0; return "dtype 0";
    case 17: h->dtype = CTXS_DTYPE_F32; return "dtype 4 (f32: no session's)";
    case 18: h->dtype = UINT32_MAX; return "dtype 0xffffffff";
    case 19: h->elem_bytes = 4; return "elem_bytes 4 for f16";
    case 20: h->elem_bytes = 0; return "elem_bytes 0";
    case 21: h->elem_bytes = 1; return "elem_bytes 1 for f16";
    case 22: h->header_bytes = 512; return "header_bytes 512";
    case 23: h->header_bytes = 0; return "header_bytes 0";
    case 24: h->page_bytes = 4096; return "page_bytes 4096";
    case 25: h->page_bytes = 0; return "page_bytes 0";
    case 26: h->record_bytes = 64; return "record_bytes 64";
    case 27: h->record_bytes = 0; return "record_bytes 0";
    case 28: h->record_off[0] = 0; return "record 0 on the header";
    case 29: h->record_off[1] = h->record_off[0]; return "records overlap";
    case 30: h->record_off[1] = h->file_bytes; return "record 1 past the end";
    case 31: h->record_off[0] = UINT64_MAX - 64; return "record 0 offset near 2^64";
    case 32: h->tokens_off = 0; return "token table at 0";
    case 33: h->tokens_off += P; return "token table moved a page";
    case 34: h->tokens_off += 4; return "token table unaligned";
    case 35: h->tokens_bytes = 0; return "token table empty";
    case 36: h->tokens_bytes = (uint64_t)h->capacity * 4 - 4; return "token table too small";
    case 37: h->sums_off = h->tokens_off; return "checksums on the token table";
    case 38: h->sums_bytes = 0; return "checksum table empty";
    case 39:
        h->sums_off = h->tokens_off;
        h->tokens_off = h->sums_off + h->sums_bytes;
        return "token and checksum tables swapped";
    case 40: h->kv_off = h->sums_off; return "KV on the checksum table";
    case 41: h->kv_off = h->file_bytes; return "KV starts at the end";
    case 42: h->kv_off = h->file_bytes + P; return "KV past the end";
    case 43:
        h->kv_off += P;
        h->kv_bytes -= P;
        return "KV moved a page, file_bytes unchanged";
    case 44: h->kv_off += 1; return "KV unaligned";
    case 45: h->kv_bytes += P; return "kv_bytes a page more";
    case 46: h->kv_bytes -= P; return "kv_bytes a page less";
    case 47: h->kv_bytes = UINT64_MAX; return "kv_bytes 2^64-1";
    case 48: h->file_bytes += P; return "file_bytes past the end";
    case 49: h->file_bytes = UINT64_MAX; return "file_bytes 2^64-1";
    case 50:
        h->kv_bytes -= P;
        h->file_bytes -= P;
        return "KV and file_bytes a page short of the layout";
    case 51:
        h->kv_off = UINT64_MAX - P + 1;
        h->file_bytes = h->kv_off + h->kv_bytes; /* wraps */
        return "kv_off + kv_bytes wraps around 2^64";
    case 52:
        h->sums_bytes = UINT64_MAX - h->sums_off + 1;
        return "sums_off + sums_bytes wraps to 0";
    case 53: h->file_bytes = 0; return "file_bytes 0";
    default: return NULL;
    }
}

Test(format, header_fields_that_do_not_add_up_are_corrupt)
{
    const char *pristine = make_pristine("pristine.ctxs");
    const char *p = ts_path(ts_scratch, "edit.ctxs");
    ctxs__disk_header h0;
    hdr_read(pristine, &h0);
    int n = 0;
    for (int which = 0;; which++) {
        ctxs__disk_header h = h0;
        const char *what = bad_edit(&h, which);
        if (!what)
            break;
        copy_file(pristine, p);
        hdr_write(p, &h, 1);
        expect_refused(p, what, CTXS_ECORRUPT);
        n++;
    }
    cr_assert_geq(n, 50);
    expect_opens(pristine, "pristine", 37);
}

/* The same edits, straight into ctxs__header_check(). */
Test(format, header_check_refuses_crafted_headers)
{
    ctxs_model m = ts_model(1);
    ctxs__file_layout lay, out;
    cr_assert_eq(ctxs__layout_compute(&lay, &m.geometry, PRISTINE_CAP, PRISTINE_SINK, 0), 0);
    ctxs__disk_header h0;
    memset(&h0, 0x5a, sizeof(h0));
    ctxs__header_init(&h0, &lay, &m, CTXS__FLAG_RING, 1700000000000ull);
    h0.crc32 = header_crc(&h0);
    cr_assert_eq(ctxs__header_check(&h0, lay.file_bytes, &out), 0);
    cr_assert(memcmp(&out, &lay, sizeof(lay)) == 0);
    for (size_t i = 0; i < sizeof(h0.reserved); i++)
        cr_assert_eq(h0.reserved[i], 0, "header_init left reserved byte %zu", i);

    for (int which = 0;; which++) {
        ctxs__disk_header h = h0;
        const char *what = bad_edit(&h, which);
        if (!what)
            break;
        h.crc32 = header_crc(&h);
        int rc = ctxs__header_check(&h, lay.file_bytes, &out);
        cr_assert_eq(rc, CTXS_ECORRUPT, "%s: header_check returned %d (%s)", what, rc,
                     ctxs_err_name(rc));
    }

    ctxs__disk_header h = h0;
    h.version_major = CTXS__FORMAT_MAJOR + 1;
    h.crc32 = header_crc(&h);
    cr_assert_eq(ctxs__header_check(&h, lay.file_bytes, &out), CTXS_EVERSION);
    h = h0;
    h.magic[7] = 'X';
    h.crc32 = header_crc(&h);
    cr_assert_eq(ctxs__header_check(&h, lay.file_bytes, &out), CTXS_EFOREIGN);
    h = h0;
    h.crc32 ^= 0x10000;
    cr_assert_eq(ctxs__header_check(&h, lay.file_bytes, &out), CTXS_ECORRUPT);
    cr_assert_eq(ctxs__header_check(&h0, lay.file_bytes - 1, &out), CTXS_ECORRUPT);
    cr_assert_eq(ctxs__header_check(&h0, lay.file_bytes - CTXS__PAGE, &out), CTXS_ECORRUPT);
    cr_assert_eq(ctxs__header_check(&h0, 0, &out), CTXS_ECORRUPT);
    cr_assert_eq(ctxs__header_check(&h0, CTXS__PAGE, &out), CTXS_ECORRUPT);
}

/* Random edits with the CRC recomputed: never a crash, and a header whose
 * geometry, offsets or sizes changed is never accepted. */
Test(format, header_check_survives_random_edits)
{
    ctxs_model m = ts_model(1);
    ctxs__file_layout lay, out;
    cr_assert_eq(ctxs__layout_compute(&lay, &m.geometry, PRISTINE_CAP, PRISTINE_SINK, 0), 0);
    ctxs__disk_header h0;
    ctxs__header_init(&h0, &lay, &m, CTXS__FLAG_RING, 1700000000000ull);
    h0.crc32 = header_crc(&h0);
    cr_assert_eq(ctxs__header_check(&h0, lay.file_bytes, &out), 0);

    /* Bytes an edit of which must be refused: magic, major version,
     * dtype .. capacity, and tokens_off .. file_bytes. */
    uint8_t must[252] = { 0 };
    for (size_t i = 0; i < 10; i++)
        must[i] = 1;
    for (size_t i = offsetof(ctxs__disk_header, dtype); i < offsetof(ctxs__disk_header, n_sink); i++)
        must[i] = 1;
    for (size_t i = offsetof(ctxs__disk_header, tokens_off);
         i < offsetof(ctxs__disk_header, model_hash); i++)
        must[i] = 1;
    /* 3.0: the windowed rings' tables. (A schedule edited so that no
     * layer's slots change reveals itself as the dtype does: a read-write
     * open's model is another.) */
    for (size_t i = offsetof(ctxs__disk_header, groups_off);
         i < offsetof(ctxs__disk_header, reserved); i++)
        must[i] = 1;

    uint64_t seed = 0x1234567;
    for (int iter = 0; iter < 200000; iter++) {
        ctxs__disk_header h = h0;
        int touched_must = 0;
        size_t where[3] = { 0, 0, 0 };
        int n_edits = 1 + iter % 3;
        for (int e = 0; e < n_edits; e++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            size_t at = (size_t)(seed >> 33) % 252;
            uint8_t x = (uint8_t)(seed >> 20);
            if (!x)
                x = 1;
            uint8_t *b = (uint8_t *)&h;
            if (iter % 4 == 0)
                x = (uint8_t)(1u << ((seed >> 45) % 8)); /* single bit */
            b[at] ^= x;
            where[e] = at;
        }
        /* fp16 and bf16 share a layout: a dtype edited from one to the
         * other is an edit that no sizes reveal (the model's dtype does,
         * at a read-write open). So is an fp16 file's major version edited
         * to 1: 2.0 wrote fp16 files as 1.1 did. */
        for (size_t i = 0; i < 252; i++)
            touched_must |= must[i] && ((uint8_t *)&h)[i] != ((uint8_t *)&h0)[i] &&
                            !(i >= offsetof(ctxs__disk_header, dtype) &&
                              i < offsetof(ctxs__disk_header, dtype) + 4 &&
                              h.dtype == CTXS_DTYPE_BF16) &&
                            !(i >= offsetof(ctxs__disk_header, version_major) &&
                              i < offsetof(ctxs__disk_header, version_minor) &&
                              (h.version_major == 1 || h.version_major == 2)) &&
                            !(i >= offsetof(ctxs__disk_header, batch) &&
                              i < offsetof(ctxs__disk_header, reserved) &&
                              h.version_major < 3); /* reserved before 3.0 */
        touched_must |= h.dtype != h0.dtype && h.dtype != CTXS_DTYPE_BF16;
        h.crc32 = header_crc(&h);
        uint64_t fsize = (iter % 5 == 0) ? (uint64_t)(seed >> 40) : lay.file_bytes;
        int rc = ctxs__header_check(&h, fsize, &out);
        cr_assert(rc == 0 || rc == CTXS_ECORRUPT || rc == CTXS_EFOREIGN || rc == CTXS_EVERSION,
                  "iteration %d: header_check returned %d", iter, rc);
        if (rc == 0) {
            cr_assert(!touched_must,
                      "iteration %d: a header edited at bytes %zu %zu %zu (of %d edits) was "
                      "accepted",
                      iter, where[0], where[1], where[2], n_edits);
            cr_assert_leq(out.file_bytes, fsize, "iteration %d: layout past the file", iter);
            cr_assert_eq(out.kv_off % CTXS__PAGE, 0);
            cr_assert_eq(out.kv_off + out.kv_bytes, out.file_bytes);
            cr_assert_lt(out.n_sink, out.capacity);
        }
    }
}

/* --- commit records ----------------------------------------------------- */

Test(format, both_records_invalid_is_corrupt)
{
    const char *pristine = make_pristine("pristine.ctxs");
    const char *p = ts_path(ts_scratch, "records.ctxs");
    for (int which = 0; which < 4; which++) {
        copy_file(pristine, p);
        for (int i = 0; i < 2; i++) {
            ctxs__disk_record r;
            rec_read(p, i, &r);
            switch (which) {
            case 0: r.crc32 ^= 0xffu; rec_write(p, i, &r, 0); break;
            case 1: memset(&r, 0, sizeof(r)); rec_write(p, i, &r, 0); break;
            case 2: memcpy(r.magic, "XREC", 4); rec_write(p, i, &r, 1); break;
            case 3: r.n_tokens ^= 1ull << 40; rec_write(p, i, &r, 0); break;
            }
        }
        char what[48];
        snprintf(what, sizeof(what), "both records damaged (%d)", which);
        expect_refused(p, what, CTXS_ECORRUPT);
    }
}

/* Damages the newer record of a copy of pristine in one of several ways;
 * the file must open on the older record. */
Test(format, damaged_newer_record_falls_back_to_the_older)
{
    const char *pristine = make_pristine("pristine.ctxs");
    const char *p = ts_path(ts_scratch, "fallback.ctxs");
    ctxs__disk_record r[2];
    rec_read(pristine, 0, &r[0]);
    rec_read(pristine, 1, &r[1]);
    int newer = r[1].seq > r[0].seq;
    cr_assert_eq(r[!newer].n_tokens, 17);

    for (int which = 0; which < 7; which++) {
        copy_file(pristine, p);
        ctxs__disk_record x = r[newer];
        const char *what = NULL;
        int fix = 1;
        switch (which) {
        case 0: x.crc32 ^= 1; fix = 0; what = "bad CRC"; break;
        case 1: x.n_tokens = PRISTINE_CAP * 3ull; what = "n_tokens far past a ring that never wrapped"; break;
        case 2: x.ring_start = x.n_tokens + 1; what = "ring_start past n_tokens"; break;
        case 3: x.index = (uint32_t)!newer; what = "index of the other place"; break;
        case 4: memcpy(x.magic, "CRED", 4); what = "wrong record magic"; break;
        case 5: x.n_tokens = UINT64_MAX; what = "n_tokens 2^64-1"; break;
        case 6: x.verified_from = x.n_tokens + 5; what = "verified_from past n_tokens"; break;
        }
        rec_write(p, newer, &x, fix);
        /* A read-only open first: a read-write one may write the state back. */
        ctxs_model m = ts_model(1);
        ctxs_session *s = NULL;
        int rc = ctxs_session_open(&s, p, &m, CTXS_RDONLY, NULL);
        cr_assert_eq(rc, 0, "newer record: %s: open: %s", what, ctxs_strerror(rc));
        ctxs_session_info info;
        cr_assert_eq(ctxs_session_get_info(&info, s), 0);
        cr_assert_eq(info.n_tokens, 17, "newer record: %s: n_tokens %llu, want 17", what,
                     (unsigned long long)info.n_tokens);
        cr_assert_eq(ts_check_all(s), 0);
        ctxs_session_close(s);
        expect_opens(p, what, 17);

        /* The writer goes on from the older state. */
        rc = ctxs_session_open(&s, p, &m, 0, NULL);
        cr_assert_eq(rc, 0);
        cr_assert_eq(ts_append(s, 5), 0);
        ctxs_session_close(s);
        expect_opens(p, what, 22);
    }
}

/* The newest record, forged with a valid CRC to claim tokens that were never
 * written: an open that verifies rolls it back to what verifies. */
Test(format, forged_record_is_rolled_back_by_verification)
{
    const char *pristine = make_pristine("pristine.ctxs");
    const char *p = ts_path(ts_scratch, "forged.ctxs");
    ctxs__disk_record r[2];
    rec_read(pristine, 0, &r[0]);
    rec_read(pristine, 1, &r[1]);
    int newer = r[1].seq > r[0].seq;
    ctxs_model m = ts_model(1);
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;

    for (int which = 0; which < 3; which++) {
        copy_file(pristine, p);
        ctxs__disk_record x = r[newer];
        x.n_tokens = 500;
        x.verified_from = 0;
        unsigned flags = which == 2 ? 0 : CTXS_RDONLY;
        if (which == 1)
            memset(x.boot_id, 0x42, 16); /* another boot: verified without asking */
        else
            flags |= CTXS_OPEN_VERIFY;
        rec_write(p, newer, &x, 1);
        ctxs_session *s = NULL;
        int rc = ctxs_session_open(&s, p, &m, flags, &o.open);
        cr_assert_eq(rc, 0, "case %d: open: %s", which, ctxs_strerror(rc));
        ctxs_session_info info;
        cr_assert_eq(ctxs_session_get_info(&info, s), 0);
        cr_assert_eq(info.n_tokens, 37, "case %d: forged record kept %llu tokens", which,
                     (unsigned long long)info.n_tokens);
        cr_assert(info.flags & CTXS_INFO_RECOVERED, "case %d: RECOVERED not set", which);
        cr_assert(info.flags & CTXS_INFO_VERIFIED, "case %d: VERIFIED not set", which);
        cr_assert_eq(info.lost_tokens, 463, "case %d: lost_tokens %llu", which,
                     (unsigned long long)info.lost_tokens);
        cr_assert_eq(ts_check_all(s), 0);
        cr_assert_eq(ctxs_session_verify(NULL, s), 0);
        ctxs_session_close(s);
    }
    /* The read-write open wrote the recovered state back. */
    expect_opens(p, "after a verifying read-write open", 37);
}

/* A record whose sequence number is at its limit (valid CRC) is not valid:
 * no later record could outrank it, so every commit after it would vanish.
 * Open falls back to the other record, and commits after that persist. */
Test(format, record_seq_at_the_limit_does_not_lose_commits)
{
    const char *p = make_pristine("seq.ctxs");
    ctxs__disk_record r[2];
    rec_read(p, 0, &r[0]);
    rec_read(p, 1, &r[1]);
    int newer = r[1].seq > r[0].seq;
    uint64_t older_tokens = r[!newer].n_tokens;
    r[newer].seq = UINT64_MAX;
    rec_write(p, newer, &r[newer], 1);

    ctxs_model m = ts_model(1);
    ctxs_session *s = NULL;
    int rc = ctxs_session_open(&s, p, &m, 0, NULL);
    cr_assert_eq(rc, 0, "open: %s", ctxs_strerror(rc));
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_expect_eq(info.n_tokens, older_tokens);
    cr_expect(info.flags & CTXS_INFO_RECOVERED);
    cr_assert_eq(ts_append(s, 5), 0);
    ctxs_session_close(s);
    expect_opens(p, "commit after seq 2^64-1", older_tokens + 5);
}

/* A reader whose file loses both records under it gets CTXS_ECORRUPT from
 * refresh, keeps its last good state, and recovers when they come back. */
Test(format, refresh_with_both_records_damaged_is_corrupt)
{
    const char *p = make_pristine("refresh.ctxs");
    ctxs__disk_record r[2], bad[2];
    rec_read(p, 0, &r[0]);
    rec_read(p, 1, &r[1]);
    ctxs_session *s = NULL;
    cr_assert_eq(ctxs_session_open(&s, p, NULL, CTXS_RDONLY, NULL), 0);
    for (int i = 0; i < 2; i++) {
        bad[i] = r[i];
        bad[i].crc32 ^= 0x5a5a;
        rec_write(p, i, &bad[i], 0);
    }
    cr_assert_eq(ctxs_session_refresh(s), CTXS_ECORRUPT);
    cr_assert_eq(n_tokens_of(s), 37, "a failed refresh changed the state");
    cr_assert_eq(ts_check_all(s), 0);
    for (int i = 0; i < 2; i++)
        rec_write(p, i, &r[i], 0);
    cr_assert_eq(ctxs_session_refresh(s), 0);
    cr_assert_eq(n_tokens_of(s), 37);
    ctxs_session_close(s);
}

Test(format, records_helpers_check_counters)
{
    ctxs_model m = ts_model(1);
    ctxs__file_layout lay;
    cr_assert_eq(ctxs__layout_compute(&lay, &m.geometry, PRISTINE_CAP, PRISTINE_SINK, 0), 0);
    ctxs__disk_record r;

    memset(&r, 0, sizeof(r));
    ctxs__record_seal(&r, 0);
    cr_assert(ctxs__record_valid(&r, 0, &lay, 1), "a fresh zero record is valid");
    cr_assert(memcmp(r.magic, CTXS__RECORD_MAGIC, 4) == 0);
    cr_assert_eq(r.crc32, record_crc(&r), "record CRC is not zlib crc32 of bytes 0..123");

    memset(&r, 0, sizeof(r));
    r.seq = 9;
    r.n_tokens = 100;
    r.ring_start = PRISTINE_SINK;
    r.verified_from = 50;
    ctxs__record_seal(&r, 1);
    cr_assert_eq(r.index, 1);
    cr_assert(ctxs__record_valid(&r, 1, &lay, 1));
    cr_assert(ctxs__record_valid(&r, 1, &lay, 0));
    cr_assert_eq(ctxs__record_valid(&r, 0, &lay, 1), 0, "valid in the other place");
    ctxs__disk_record bad = r;
    bad.n_tokens++;
    cr_assert_eq(ctxs__record_valid(&bad, 1, &lay, 1), 0, "edited without CRC");
    bad = r;
    memcpy(bad.magic, "CREX", 4);
    bad.crc32 = record_crc(&bad);
    cr_assert_eq(ctxs__record_valid(&bad, 1, &lay, 1), 0, "wrong magic");

    /* Exactly full without ring: valid; one more: not. */
    memset(&r, 0, sizeof(r));
    r.seq = 3;
    r.n_tokens = PRISTINE_CAP;
    r.ring_start = PRISTINE_SINK;
    ctxs__record_seal(&r, 0);
    cr_assert(ctxs__record_valid(&r, 0, &lay, 0));
    r.n_tokens = PRISTINE_CAP + 1;
    ctxs__record_seal(&r, 0);
    cr_assert_eq(ctxs__record_valid(&r, 0, &lay, 0), 0, "more tokens than slots, no ring");

    /* A wrapped ring holds capacity tokens: n_sink + (n_tokens - ring_start). */
    r.n_tokens = PRISTINE_CAP + 100;
    r.ring_start = PRISTINE_SINK + 100;
    ctxs__record_seal(&r, 0);
    cr_assert(ctxs__record_valid(&r, 0, &lay, 1), "a full wrapped ring");
    cr_assert_eq(ctxs__record_valid(&r, 0, &lay, 0), 0, "evicted tokens without a ring");
    r.ring_start = PRISTINE_SINK + 99;
    ctxs__record_seal(&r, 0);
    cr_assert_eq(ctxs__record_valid(&r, 0, &lay, 1), 0, "a ring holding more than capacity");
    r.ring_start = r.n_tokens + 1;
    ctxs__record_seal(&r, 0);
    cr_assert_eq(ctxs__record_valid(&r, 0, &lay, 1), 0, "ring_start past n_tokens");
    r.n_tokens = UINT64_MAX;
    r.ring_start = UINT64_MAX - PRISTINE_CAP + PRISTINE_SINK;
    ctxs__record_seal(&r, 0);
    (void)ctxs__record_valid(&r, 0, &lay, 1); /* must not crash or trap */
    r.n_tokens = 100;
    r.ring_start = PRISTINE_SINK;
    r.verified_from = 101;
    ctxs__record_seal(&r, 0);
    cr_assert_eq(ctxs__record_valid(&r, 0, &lay, 1), 0, "verified_from past n_tokens");
}

/* --- the file system around the file ------------------------------------ */

Test(format, symlink_in_place_of_the_file_is_refused)
{
    const char *target = make_pristine("target.ctxs");
    const char *link_path = ts_path(ts_scratch, "link.ctxs");
    cr_assert_eq(symlink(target, link_path), 0);
    expect_refused(link_path, "symlink to a session", -ELOOP);
    const char *dangling = ts_path(ts_scratch, "dangling.ctxs");
    cr_assert_eq(symlink(ts_path(ts_scratch, "nowhere.ctxs"), dangling), 0);
    expect_refused(dangling, "dangling symlink", -ELOOP);
    expect_opens(target, "the target", 37);
}

Test(format, create_does_not_follow_symlinks)
{
    ctxs_model m = ts_model(1);
    const char *nowhere = ts_path(ts_scratch, "nowhere.ctxs");
    const char *dangling = ts_path(ts_scratch, "dangling.ctxs");
    cr_assert_eq(symlink(nowhere, dangling), 0);
    ctxs_session *s = (ctxs_session *)(uintptr_t)0x1;
    int rc = ctxs_session_create(&s, dangling, &m, NULL);
    cr_assert_eq(rc, -EEXIST, "create over a dangling symlink: %d (%s)", rc, ctxs_err_name(rc));
    cr_assert_null(s);
    struct stat st;
    cr_assert_neq(lstat(nowhere, &st), 0, "create followed the symlink and made its target");
    cr_assert_eq(lstat(dangling, &st), 0);
    cr_assert(S_ISLNK(st.st_mode), "the symlink was replaced");
}

Test(format, directory_is_refused)
{
    const char *d = ts_path(ts_scratch, "adir.ctxs");
    cr_assert_eq(mkdir(d, 0700), 0);
    ctxs_model m = ts_model(1);
    int rc = try_open(d, NULL, CTXS_RDONLY);
    cr_assert_lt(rc, 0, "a directory opened read-only");
    rc = try_open(d, &m, CTXS_RDONLY);
    cr_assert_lt(rc, 0, "a directory opened read-only");
    rc = try_open(d, &m, 0);
    cr_assert_lt(rc, 0, "a directory opened read-write");
    ctxs_session *s = (ctxs_session *)(uintptr_t)0x1;
    rc = ctxs_session_create(&s, d, &m, NULL);
    cr_assert_lt(rc, 0, "create over a directory succeeded");
    cr_assert_null(s);
    struct stat st;
    cr_assert_eq(stat(d, &st), 0);
    cr_assert(S_ISDIR(st.st_mode));
}

/* A FIFO in place of the file must be refused at once, not block the open
 * until some writer opens the FIFO (the test times out if it blocks). */
Test(format, fifo_is_refused_without_blocking, .timeout = 5)
{
    const char *p = ts_path(ts_scratch, "fifo.ctxs");
    cr_assert_eq(mkfifo(p, 0600), 0);
    ctxs_model m = ts_model(1);
    int rc = try_open(p, &m, 0);
    cr_assert_lt(rc, 0, "a FIFO opened read-write");
    rc = try_open(p, NULL, CTXS_RDONLY);
    cr_assert_lt(rc, 0, "a FIFO opened read-only");
    rc = try_open(p, &m, CTXS_RDONLY);
    cr_assert_lt(rc, 0, "a FIFO opened read-only");
}

Test(format, device_file_is_refused)
{
    ctxs_model m = ts_model(1);
    cr_assert_lt(try_open("/dev/null", NULL, CTXS_RDONLY), 0, "/dev/null opened read-only");
    cr_assert_lt(try_open("/dev/zero", &m, CTXS_RDONLY), 0, "/dev/zero opened read-only");
}

Test(format, missing_file_is_enoent)
{
    ctxs_model m = ts_model(1);
    const char *p = ts_path(ts_scratch, "missing.ctxs");
    cr_assert_eq(try_open(p, &m, 0), -ENOENT);
    cr_assert_eq(try_open(p, NULL, CTXS_RDONLY), -ENOENT);
    cr_assert_eq(try_open(ts_path(ts_scratch, "no/such/dir.ctxs"), &m, 0), -ENOENT);
    struct stat st;
    cr_assert_neq(stat(p, &st), 0, "open created the file");
}

/* --- models ---------------------------------------------------------------- */

Test(format, wrong_model_is_refused)
{
    const char *p = make_pristine("model.ctxs");
    ctxs_model good = ts_model(1);
    for (int which = 0; which < 6; which++) {
        ctxs_model m = good;
        const char *what = NULL;
        switch (which) {
        case 0: m = ts_model(2); what = "another model"; break;
        case 1: m.model_hash[15] ^= 1; what = "model hash"; break;
        case 2: m.tokenizer_hash[0] ^= 0x80; what = "tokenizer hash"; break;
        case 3: m.geometry.n_layers = 3; what = "n_layers"; break;
        case 4: m.geometry.n_kv_heads = 1; what = "n_kv_heads"; break;
        case 5: m.geometry.head_dim = 16; what = "head_dim"; break;
        }
        size_t len0, len1;
        uint8_t *before = ts_read_file(p, &len0);
        int rc = try_open(p, &m, 0);
        cr_assert_eq(rc, CTXS_EMODEL, "read-write, other %s: %d (%s)", what, rc, ctxs_err_name(rc));
        rc = try_open(p, &m, CTXS_RDONLY);
        cr_assert_eq(rc, CTXS_EMODEL, "read-only, other %s: %d (%s)", what, rc, ctxs_err_name(rc));
        uint8_t *after = ts_read_file(p, &len1);
        cr_assert(len0 == len1 && memcmp(before, after, len0) == 0, "EMODEL changed the file");
        free(before);
        free(after);
    }
    ctxs_model m = good;
    m.geometry.dtype = 5;
    cr_assert_lt(try_open(p, &m, 0), 0, "opened with an unknown dtype");
    m.geometry.dtype = CTXS_DTYPE_BF16;
    cr_assert_eq(try_open(p, &m, 0), CTXS_EMODEL, "opened an fp16 file as bf16");

    /* Read-only with no model inspects any file and reports its model. */
    ctxs_session *s = NULL;
    cr_assert_eq(ctxs_session_open(&s, p, NULL, CTXS_RDONLY, NULL), 0);
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert(memcmp(&info.model, &good, sizeof(good)) == 0, "info.model is not the file's model");
    cr_assert_eq(info.n_tokens, 37);
    cr_assert(info.flags & CTXS_INFO_READONLY);
    cr_assert_eq(info.format_major, CTXS__FORMAT_MAJOR);
    cr_assert_eq(ts_check_all(s), 0);
    ctxs_session_close(s);

    /* A writer needs the model. */
    cr_assert_eq(try_open(p, NULL, 0), CTXS_EINVAL);
}

/* --- create ----------------------------------------------------------- */

Test(format, create_over_an_existing_file_fails_and_keeps_it)
{
    const char *p = make_pristine("exists.ctxs");
    ctxs_model other = ts_model(7);
    size_t len0, len1;
    uint8_t *before = ts_read_file(p, &len0);
    ctxs_session *s = (ctxs_session *)(uintptr_t)0x1;
    int rc = ctxs_session_create(&s, p, &other, NULL);
    cr_assert_eq(rc, -EEXIST, "create over a session: %d (%s)", rc, ctxs_err_name(rc));
    cr_assert_null(s);
    uint8_t *after = ts_read_file(p, &len1);
    cr_assert(len0 == len1 && memcmp(before, after, len0) == 0, "create changed the existing file");
    free(before);
    free(after);
    expect_opens(p, "existing session", 37);

    /* The same while a writer holds it open. */
    ctxs_model m = ts_model(1);
    ctxs_session *w = NULL;
    cr_assert_eq(ctxs_session_open(&w, p, &m, 0, NULL), 0);
    rc = ctxs_session_create(&s, p, &m, NULL);
    cr_assert_eq(rc, -EEXIST, "create over an open session: %d (%s)", rc, ctxs_err_name(rc));
    cr_assert_eq(ts_append(w, 3), 0);
    ctxs_session_close(w);
    expect_opens(p, "existing session", 40);

    /* And over a file that is not a session. */
    const char *t = ts_path(ts_scratch, "notes.txt");
    cr_assert_eq(ts_write_file(t, "keep me\n", 8), 0);
    rc = ctxs_session_create(&s, t, &m, NULL);
    cr_assert_eq(rc, -EEXIST, "create over a text file: %d (%s)", rc, ctxs_err_name(rc));
    uint8_t *txt = ts_read_file(t, &len0);
    cr_assert(len0 == 8 && memcmp(txt, "keep me\n", 8) == 0, "create changed the text file");
    free(txt);

    /* Nothing is left behind in the directory (no temporary files). */
    char cmd[4200];
    snprintf(cmd, sizeof(cmd), "test $(ls -A '%s' | wc -l) -eq 2", ts_scratch);
    cr_assert_eq(system(cmd), 0, "create left files behind in %s", ts_scratch);
}

Test(format, create_rejects_bad_arguments)
{
    const char *p = ts_path(ts_scratch, "bad.ctxs");
    for (int which = 0;; which++) {
        ctxs_model m = ts_model(1);
        ctxs_create_options o = opts_for(64, 4, 1);
        const ctxs_model *mp = &m;
        const ctxs_create_options *op = &o;
        const char *path = p;
        ctxs_session *s = (ctxs_session *)(uintptr_t)0x1;
        ctxs_session **outp = &s;
        const char *what;
        switch (which) {
        case 0: m.geometry.n_layers = 0; what = "zero layers"; break;
        case 1: m.geometry.n_kv_heads = 0; what = "zero heads"; break;
        case 2: m.geometry.head_dim = 0; what = "zero head_dim"; break;
        case 3: m.geometry.head_dim = CTXS__MAX_DIM + 1; what = "head_dim 4097"; break;
        case 4: m.geometry.n_layers = UINT32_MAX; what = "layers 0xffffffff"; break;
        case 5: m.geometry.dtype = 0; what = "dtype 0"; break;
        case 6: m.geometry.dtype = CTXS_DTYPE_F32; what = "dtype f32"; break;
        case 7: m.geometry.dtype = UINT32_MAX; what = "dtype 0xffffffff"; break;
        case 8: o.capacity = 4; what = "capacity == n_sink"; break;
        case 9: o.capacity = 3; what = "capacity < n_sink"; break;
        case 10: o.capacity = CTXS__MAX_CAPACITY + 1; what = "capacity 16 Mi + 1"; break;
        case 11: o.capacity = UINT32_MAX; o.n_sink = UINT32_MAX - 1; what = "capacity 2^32-1"; break;
        case 12: path = NULL; what = "NULL path"; break;
        case 13: mp = NULL; what = "NULL model"; break;
        case 14: outp = NULL; what = "NULL out"; break;
        case 15: o.version = 0; what = "options version 0"; break;
        case 16: o.version = 999; what = "options version 999"; break;
        case 17: o.reserved[sizeof(o.reserved) - 1] = 1; what = "reserved option bytes"; break;
        case 18: o.open.durability = 3; what = "durability 3"; break;
        case 19: path = ""; what = "empty path"; break;
        case 20: o.open.background = 2; what = "background 2"; break;
        case 21: o.open.version = 0; what = "open options version 0"; break;
        case 22: o.ring = 2; what = "ring 2"; break;
        default: what = NULL; break;
        }
        if (!what)
            break;
        int rc = ctxs_session_create(outp, path, mp, op);
        if (which == 19)
            cr_assert_lt(rc, 0, "%s: create succeeded", what);
        else
            cr_assert_eq(rc, CTXS_EINVAL, "%s: create returned %d (%s)", what, rc, ctxs_err_name(rc));
        if (outp)
            cr_assert_null(s, "%s: *out not NULL on failure", what);
        struct stat st;
        cr_assert_neq(lstat(p, &st), 0, "%s: a file was left at the path", what);
    }
    /* Directory left empty. */
    char cmd[4200];
    snprintf(cmd, sizeof(cmd), "test -z \"$(ls -A '%s')\"", ts_scratch);
    cr_assert_eq(system(cmd), 0, "failed creates left files in %s", ts_scratch);

    /* The edges that are allowed. */
    ctxs_model m = ts_model(1);
    ctxs_create_options o = opts_for(5, 4, 1);
    ctxs_session *s = NULL;
    int rc = ctxs_session_create(&s, p, &m, &o);
    cr_assert_eq(rc, 0, "capacity n_sink + 1: %s", ctxs_strerror(rc));
    ctxs_session_close(s);
    cr_assert_eq(ctxs_session_create(&s, ts_path(ts_scratch, "defaults.ctxs"), &m, NULL), 0);
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(info.capacity, 2048);
    cr_assert_eq(info.n_sink, 4);
    cr_assert(!(info.flags & CTXS_INFO_RING), "a session is no ring unless asked");
    ctxs_session_close(s);
}

/* Nothing is lost by default: the capacity is the model's context length
 * where the app gives it, and a full session refuses more tokens, saying
 * how to go on, with every token it held. */
Test(format, the_default_capacity_is_the_context_length_and_nothing_is_overwritten)
{
    ctxs_model m = ts_model(1);
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.context_length = 8192;
    ctxs_session *s;
    cr_assert_eq(ctxs_session_create(&s, ts_path(ts_scratch, "ctx.ctxs"), &m, &o), 0);
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(info.capacity, 8192);
    ctxs_session_close(s);
    /* A capacity given wins. */
    o.capacity = 64;
    cr_assert_eq(ctxs_session_create(&s, ts_path(ts_scratch, "cap.ctxs"), &m, &o), 0);
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(info.capacity, 64);
    cr_assert(!(info.flags & CTXS_INFO_RING));
    cr_assert_eq(ts_append(s, 60), 0);
    ctxs_reservation r;
    cr_assert_eq(ctxs_session_reserve(&r, s, 5), CTXS_EFULL);
    cr_assert(strstr(ctxs_get_last_error(), "grow"), "%s", ctxs_get_last_error());
    cr_assert(strstr(ctxs_get_last_error(), "capacity of 64"), "%s", ctxs_get_last_error());
    cr_assert_eq(ctxs_session_reserve(&r, s, 4), 0);
    ctxs_session_close(s);
    cr_assert_eq(ctxs_session_open(&s, ts_path(ts_scratch, "cap.ctxs"), &m, 0, NULL), 0);
    cr_assert_eq(ts_n_tokens(s), 60);
    cr_assert_eq(ctxs_session_verify(NULL, s), 0);
    ctxs_session_close(s);
}

Test(format, open_rejects_bad_arguments)
{
    const char *p = make_pristine("args.ctxs");
    ctxs_model m = ts_model(1);
    ctxs_session *s = (ctxs_session *)(uintptr_t)0x1;
    cr_assert_eq(ctxs_session_open(&s, NULL, &m, 0, NULL), CTXS_EINVAL);
    cr_assert_null(s);
    cr_assert_eq(ctxs_session_open(NULL, p, &m, 0, NULL), CTXS_EINVAL);
    s = (ctxs_session *)(uintptr_t)0x1;
    cr_assert_eq(ctxs_session_open(&s, p, &m, 0x80u, NULL), CTXS_EINVAL, "unknown flags");
    cr_assert_null(s);
    ctxs_open_options o = CTXS_OPEN_OPTIONS_INIT;
    o.version = 0;
    s = (ctxs_session *)(uintptr_t)0x1;
    cr_assert_eq(ctxs_session_open(&s, p, &m, 0, &o), CTXS_EINVAL, "options version 0");
    cr_assert_null(s);
    o.version = CTXS_OPEN_OPTIONS_VERSION + 1;
    cr_assert_eq(ctxs_session_open(&s, p, &m, 0, &o), CTXS_EINVAL, "a later options version");
    ctxs_session_close(NULL);
    expect_opens(p, "after bad opens", 37);
}

/* --- error strings ---------------------------------------------------- */

Test(format, error_strings_cover_every_code)
{
#define CHECK_CODE_(name, value, text)                                                        \
    cr_assert_str_eq(ctxs_strerror(value), text, "strerror(%d)", value);                    \
    cr_assert_str_eq(ctxs_err_name(value), "CTXS_E" #name, "err_name(%d)", value);          \
    cr_assert_eq(CTXS_E##name, value);                                                       \
    n_codes++;
    int n_codes = 0;
    CTXS_ERRNO_MAP(CHECK_CODE_)
#undef CHECK_CODE_
    cr_assert_eq(n_codes, 21);

    cr_assert_str_eq(ctxs_err_name(0), "OK");
    cr_assert_not_null(ctxs_strerror(0));
    cr_assert_neq(ctxs_strerror(0)[0], '\0');

    cr_assert_str_eq(ctxs_strerror(-ENOENT), strerror(ENOENT));
    cr_assert_str_eq(ctxs_strerror(-ELOOP), strerror(ELOOP));
    const struct {
        int e;
        const char *name;
    } named[] = { { ENOENT, "ENOENT" }, { ELOOP, "ELOOP" }, { EEXIST, "EEXIST" }, { EACCES, "EACCES" } };
    for (size_t i = 0; i < sizeof(named) / sizeof(named[0]); i++)
        cr_assert_str_eq(ctxs_err_name(-named[i].e), named[i].name);

    int odd[] = { 1, 42, -32000, -32016, -32100, -31999, -4096, -100000, INT_MIN, INT_MAX, -1, -133, -4095 };
    for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
        const char *s = ctxs_strerror(odd[i]);
        const char *n = ctxs_err_name(odd[i]);
        cr_assert_not_null(s, "strerror(%d) is NULL", odd[i]);
        cr_assert_not_null(n, "err_name(%d) is NULL", odd[i]);
        cr_assert_neq(s[0], '\0', "strerror(%d) is empty", odd[i]);
        cr_assert_neq(n[0], '\0', "err_name(%d) is empty", odd[i]);
    }
    /* No library code is mistaken for another. */
    cr_assert_str_neq(ctxs_err_name(-32016), "CTXS_ENOMEM");
    cr_assert_str_neq(ctxs_err_name(-32000), "CTXS_ECORRUPT");
}

/* --- layout arithmetic ------------------------------------------------ */

Test(format, layout_compute_matches_the_format)
{
    ctxs_geometry g = { 2, 2, 8, CTXS_DTYPE_F16, 0, {0} };
    ctxs__file_layout lay;
    cr_assert_eq(ctxs__dtype_bytes(CTXS_DTYPE_F16), 2);
    cr_assert_eq(ctxs__dtype_bytes(0), 0);
    cr_assert_eq(ctxs__dtype_bytes(CTXS_DTYPE_BF16), 2);
    cr_assert_eq(ctxs__dtype_bytes(CTXS_DTYPE_Q8), 1);
    cr_assert_eq(ctxs__dtype_bytes(CTXS_DTYPE_F32), 0);
    cr_assert_eq(ctxs__dtype_bytes(5), 0);
    cr_assert_eq(ctxs__dtype_bytes(UINT32_MAX), 0);

    cr_assert_eq(ctxs__layout_compute(&lay, &g, 1000, 4, 0), 0);
    cr_assert_eq(lay.slot_bytes, 16);
    cr_assert_eq(lay.head_stride, 16000);
    cr_assert_eq(lay.kv_stride, 32000);
    cr_assert_eq(lay.layer_stride, 64000);
    cr_assert_eq(lay.tokens_off % CTXS__PAGE, 0);
    cr_assert_geq(lay.tokens_off, CTXS__PAGE);
    cr_assert_eq(lay.tokens_bytes, CTXS__PAGE);       /* 4000 rounded up */
    cr_assert_eq(lay.sums_off, lay.tokens_off + lay.tokens_bytes);
    cr_assert_eq(lay.sums_bytes, CTXS__PAGE);         /* 8000 rounded up */
    cr_assert_eq(lay.kv_off, lay.sums_off + lay.sums_bytes);
    cr_assert_eq(lay.kv_bytes, 128000 + (CTXS__PAGE - 128000 % CTXS__PAGE));
    cr_assert_eq(lay.file_bytes, lay.kv_off + lay.kv_bytes);
    cr_assert_eq(lay.capacity, 1000);
    cr_assert_eq(lay.n_sink, 4);
    cr_assert_eq(lay.elem_bytes, 2);

    /* Page-exact sizes are not rounded up a page further. */
    cr_assert_eq(ctxs__layout_compute(&lay, &g, 4096, 4, 0), 0);
    cr_assert_eq(lay.tokens_bytes, CTXS__PAGE);
    cr_assert_eq(lay.sums_bytes, 2 * CTXS__PAGE);
    cr_assert_eq(lay.kv_bytes, 8 * 4096 * 16);
}

Test(format, layout_compute_rejects_out_of_range_and_overflow)
{
    ctxs__file_layout lay;
    const struct {
        ctxs_geometry g;
        uint32_t cap, sink;
        const char *what;
    } bad[] = {
        { { 0, 2, 8, 1, 0, {0} }, 64, 4, "zero layers" },
        { { 2, 0, 8, 1, 0, {0} }, 64, 4, "zero heads" },
        { { 2, 2, 0, 1, 0, {0} }, 64, 4, "zero head_dim" },
        { { 4097, 2, 8, 1, 0, {0} }, 64, 4, "4097 layers" },
        { { 2, 4097, 8, 1, 0, {0} }, 64, 4, "4097 heads" },
        { { 2, 2, 4097, 1, 0, {0} }, 64, 4, "head_dim 4097" },
        { { 2, 2, 8, 0, 0, {0} }, 64, 4, "dtype 0" },
        { { 2, 2, 8, 4, 0, {0} }, 64, 4, "dtype 4 (f32)" },
        { { 2, 2, 8, 5, 0, {0} }, 64, 4, "dtype 5" },
        { { 2, 2, 8, 1, 0, {0} }, 0, 0, "capacity 0" },
        { { 2, 2, 8, 1, 0, {0} }, 4, 4, "capacity == n_sink" },
        { { 2, 2, 8, 1, 0, {0} }, 3, 4, "capacity < n_sink" },
        { { 2, 2, 8, 1, 0, {0} }, CTXS__MAX_CAPACITY + 1, 4, "capacity 16 Mi + 1" },
        { { UINT32_MAX, UINT32_MAX, UINT32_MAX, 1, 0, {0} }, UINT32_MAX, 0, "everything 2^32-1" },
        { { 1u << 16, 1u << 16, 1u << 16, 1, 0, {0} }, 1u << 30, 0, "products past 2^64" },
        { { 1u << 31, 1, 1u << 31, 1, 0, {0} }, 1u << 31, 0, "slot bytes past 2^32" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc = ctxs__layout_compute(&lay, &bad[i].g, bad[i].cap, bad[i].sink, 0);
        cr_assert_eq(rc, CTXS_EINVAL, "%s: layout_compute returned %d", bad[i].what, rc);
    }

    /* The largest geometry in range: 2^62 bytes of KV, which fits a 64-bit
     * size_t and must be computed exactly, and must not fit a 32-bit one. */
    ctxs_geometry big = { CTXS__MAX_DIM, CTXS__MAX_DIM, CTXS__MAX_DIM, CTXS_DTYPE_F16, 0, {0} };
    int rc = ctxs__layout_compute(&lay, &big, CTXS__MAX_CAPACITY, 4, 0);
    if (SIZE_MAX >= UINT64_MAX) {
        cr_assert_eq(rc, 0, "max geometry: %d", rc);
        cr_assert_eq(lay.slot_bytes, 8192);
        cr_assert_eq(lay.head_stride, 1ull << 37);
        cr_assert_eq(lay.kv_stride, 1ull << 49);
        cr_assert_eq(lay.layer_stride, 1ull << 50);
        cr_assert_eq(lay.kv_bytes, 1ull << 62);
        cr_assert_eq(lay.tokens_bytes, 4ull << 24);
        cr_assert_eq(lay.sums_bytes, 8ull << 24);
        cr_assert_eq(lay.file_bytes, lay.kv_off + (1ull << 62));
    } else {
        cr_assert_eq(rc, CTXS_EINVAL, "max geometry on a 32-bit size_t");
    }
    /* And create refuses to make it (no disk would hold it, but the call
     * must fail cleanly, never crash). */
    ctxs_model m = ts_model(1);
    m.geometry = big;
    ctxs_create_options o = opts_for(CTXS__MAX_CAPACITY, 4, 1);
    ctxs_session *s = (ctxs_session *)(uintptr_t)0x1;
    rc = ctxs_session_create(&s, ts_path(ts_scratch, "huge.ctxs"), &m, &o);
    if (rc == 0) {
        /* A file system with 2^62-byte sparse files: fine, but it works. */
        ctxs_session_close(s);
    } else {
        cr_assert_null(s);
    }
}

/* --- version 1.1: the label ------------------------------------------- */

static uint32_t label_crc(const ctxs__disk_label *l)
{
    return (uint32_t)crc32(0L, (const Bytef *)l, 508);
}

static int open_fd(const char *path, int flags)
{
    int fd = open(path, flags | O_CLOEXEC);
    cr_assert_geq(fd, 0, "open %s: %s", path, strerror(errno));
    return fd;
}

/* The label as ctxs__label_read() gives it; returns its result. */
static int label_of(const char *path, uint64_t *id, char name[256])
{
    int fd = open_fd(path, O_RDONLY);
    int rc = ctxs__label_read(fd, id, name);
    close(fd);
    return rc;
}

Test(format, new_file_says_version_3_0)
{
    cr_assert_eq(CTXS__FORMAT_MAJOR, 3);
    cr_assert_eq(CTXS__FORMAT_MINOR, 0);
    const char *p = make_pristine("v30.ctxs");
    ctxs__disk_header h;
    hdr_read(p, &h);
    cr_assert_eq(h.version_major, 3);
    cr_assert_eq(h.version_minor, 0);
    uint16_t raw[2];
    raw_read(p, 8, raw, sizeof(raw));
    cr_assert(raw[0] == 3 && raw[1] == 0, "bytes 8..11 say %u.%u", raw[0], raw[1]);

    ctxs_session *s = NULL;
    cr_assert_eq(ctxs_session_open(&s, p, NULL, CTXS_RDONLY, NULL), 0);
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(info.format_major, 3);
    cr_assert_eq(info.format_minor, 0);
    ctxs_session_close(s);
}

Test(format, header_check_accepts_every_minor_of_majors_1_to_3)
{
    ctxs_model m = ts_model(1);
    ctxs__file_layout lay, out;
    cr_assert_eq(ctxs__layout_compute(&lay, &m.geometry, PRISTINE_CAP, PRISTINE_SINK, 0), 0);
    uint16_t minors[] = { 0, 1, 2, 0xffff };
    for (uint16_t major = 1; major <= 4; major++) {
        for (size_t i = 0; i < sizeof(minors) / sizeof(minors[0]); i++) {
            ctxs__disk_header h;
            ctxs__header_init(&h, &lay, &m, CTXS__FLAG_RING, 1700000000000ull);
            h.version_major = major;
            h.version_minor = minors[i];
            h.crc32 = header_crc(&h);
            int rc = ctxs__header_check(&h, lay.file_bytes, &out);
            cr_assert_eq(rc, major == 4 ? CTXS_EVERSION : 0, "%u.%u: %s", major, minors[i],
                         ctxs_err_name(rc));
        }
    }
}

Test(format, major_1_knew_fp16_alone)
{
    static const uint32_t dtypes[] = { CTXS_DTYPE_BF16, CTXS_DTYPE_Q8 };
    for (size_t i = 0; i < 2; i++) {
        ctxs_model m = ts_model(1);
        m.geometry.dtype = dtypes[i];
        ctxs__file_layout lay, out;
        cr_assert_eq(ctxs__layout_compute(&lay, &m.geometry, PRISTINE_CAP, PRISTINE_SINK, 0), 0);
        ctxs__disk_header h;
        ctxs__header_init(&h, &lay, &m, CTXS__FLAG_RING, 1700000000000ull);
        cr_assert_eq(ctxs__header_check(&h, lay.file_bytes, &out), 0);
        h.version_major = 1;
        h.crc32 = header_crc(&h);
        cr_assert_eq(ctxs__header_check(&h, lay.file_bytes, &out), CTXS_ECORRUPT,
                     "a 1.x header of dtype %u", dtypes[i]);
    }
}

Test(format, q8_layout_has_a_scale_table_before_the_kv)
{
    ctxs_geometry g = { 3, 2, 8, CTXS_DTYPE_Q8, 0, {0} };
    ctxs__file_layout lay;
    cr_assert_eq(ctxs__layout_compute(&lay, &g, 1000, 4, 0), 0);
    cr_assert_eq(lay.slot_bytes, 8);
    cr_assert_eq(lay.scales_stride, 4000);
    cr_assert_eq(lay.scales_off, lay.sums_off + lay.sums_bytes);
    /* 12 runs of 1000 scales, rounded up to a page. */
    cr_assert_eq(lay.scales_bytes, 49152);
    cr_assert_eq(lay.kv_off, lay.scales_off + lay.scales_bytes);
    cr_assert_eq(lay.kv_off % CTXS__PAGE, 0);

    g.dtype = CTXS_DTYPE_BF16;
    cr_assert_eq(ctxs__layout_compute(&lay, &g, 1000, 4, 0), 0);
    cr_assert_eq(lay.scales_off, 0);
    cr_assert_eq(lay.scales_bytes, 0);
    cr_assert_eq(lay.kv_off, lay.sums_off + lay.sums_bytes);
}

Test(format, a_file_without_a_label_is_enotfound)
{
    const char *p = make_pristine("nolabel.ctxs");
    uint64_t id = 99;
    char name[256] = "junk";
    cr_assert_eq(label_of(p, &id, name), CTXS_ENOTFOUND);
    cr_assert_eq(id, 0);
    cr_assert_str_eq(name, "");
    uint8_t page[CTXS__PAGE - CTXS__LABEL_OFF];
    raw_read(p, CTXS__LABEL_OFF, page, sizeof(page));
    for (size_t i = 0; i < sizeof(page); i++)
        cr_assert_eq(page[i], 0, "byte %zu of the label page of a new file is not zero", i);

    /* Anything without the magic is no label, whatever else is there. */
    ctxs__disk_label l;
    memset(&l, 0xa5, sizeof(l));
    memcpy(l.magic, "CLBX", 4);
    l.crc32 = label_crc(&l);
    raw_write(p, CTXS__LABEL_OFF, &l, sizeof(l));
    cr_assert_eq(label_of(p, &id, name), CTXS_ENOTFOUND);
}

Test(format, label_round_trips)
{
    const char *p = make_pristine("label.ctxs");
    const struct {
        uint64_t id;
        const char *name;
    } cases[] = {
        { 1, "a" },
        { 0x0123456789abcdefull, "chat with Ada" },
        { UINT64_MAX, "\xc3\xa9t\xc3\xa9 \xe2\x80\x94 \xf0\x9f\x98\x80" }, /* UTF-8 */
        { 0, "x" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int fd = open_fd(p, O_RDWR);
        cr_assert_eq(ctxs__label_write(fd, cases[i].id, cases[i].name, strlen(cases[i].name)), 0);
        close(fd);
        uint64_t id;
        char name[256];
        cr_assert_eq(label_of(p, &id, name), 0);
        cr_assert_eq(id, cases[i].id);
        cr_assert_str_eq(name, cases[i].name);
    }

    /* The longest name, and the bytes are where format.h says. */
    char longest[256];
    memset(longest, 'n', 255);
    longest[255] = '\0';
    int fd = open_fd(p, O_RDWR);
    cr_assert_eq(ctxs__label_write(fd, 42, longest, 255), 0);
    close(fd);
    ctxs__disk_label l;
    raw_read(p, CTXS__LABEL_OFF, &l, sizeof(l));
    cr_assert(memcmp(l.magic, "CLBL", 4) == 0);
    cr_assert_eq(l.name_len, 255);
    cr_assert_eq(l.reserved0, 0);
    cr_assert_eq(l.store_id, 42);
    cr_assert(memcmp(l.name, longest, 255) == 0);
    cr_assert_eq(l.name[255], 0);
    for (size_t i = 0; i < sizeof(l.reserved); i++)
        cr_assert_eq(l.reserved[i], 0);
    cr_assert_eq(l.crc32, label_crc(&l), "label CRC is not zlib crc32 of bytes 0..507");
    uint64_t id;
    char name[256];
    cr_assert_eq(label_of(p, &id, name), 0);
    cr_assert_eq(strlen(name), 255);

    /* A shorter name leaves no trace of the longer one. */
    fd = open_fd(p, O_RDWR);
    cr_assert_eq(ctxs__label_write(fd, 7, "short", 5), 0);
    close(fd);
    raw_read(p, CTXS__LABEL_OFF, &l, sizeof(l));
    for (size_t i = 5; i < sizeof(l.name); i++)
        cr_assert_eq(l.name[i], 0, "name byte %zu", i);

    /* Readers ignore reserved bytes (the CRC covers them). */
    l.reserved[17] = 0x5a;
    l.crc32 = label_crc(&l);
    raw_write(p, CTXS__LABEL_OFF, &l, sizeof(l));
    cr_assert_eq(label_of(p, &id, name), 0);
    cr_assert_str_eq(name, "short");
}

Test(format, damaged_label_is_corrupt)
{
    const char *pristine = make_pristine("pristine.ctxs");
    int fd = open_fd(pristine, O_RDWR);
    cr_assert_eq(ctxs__label_write(fd, 5, "label", 5), 0);
    close(fd);
    ctxs__disk_label good;
    raw_read(pristine, CTXS__LABEL_OFF, &good, sizeof(good));

    const char *p = ts_path(ts_scratch, "badlabel.ctxs");
    for (int which = 0;; which++) {
        ctxs__disk_label l = good;
        int fix = 1;
        const char *what;
        switch (which) {
        case 0: l.crc32 ^= 1; fix = 0; what = "CRC"; break;
        case 1: l.name[2] ^= 0x20; fix = 0; what = "name edited, CRC stale"; break;
        case 2: l.store_id++; fix = 0; what = "id edited, CRC stale"; break;
        case 3: l.name_len = 0; what = "name_len 0"; break;
        case 4: l.name_len = 256; what = "name_len 256"; break;
        case 5: l.name_len = 0xffff; what = "name_len 0xffff"; break;
        case 6: l.name[1] = 0; what = "a NUL inside the name"; break;
        default: what = NULL; break;
        }
        if (!what)
            break;
        copy_file(pristine, p);
        if (fix)
            l.crc32 = label_crc(&l);
        raw_write(p, CTXS__LABEL_OFF, &l, sizeof(l));
        uint64_t id;
        char name[256];
        int rc = label_of(p, &id, name);
        cr_assert_eq(rc, CTXS_ECORRUPT, "%s: label_read gave %s", what, ctxs_err_name(rc));
        cr_assert_str_eq(name, "");
        /* The session itself does not care. */
        expect_opens(p, what, 37);
    }

    /* A file too short to have the label page. */
    set_size(p, CTXS__LABEL_OFF + 100);
    uint64_t id;
    char name[256];
    cr_assert_eq(label_of(p, &id, name), CTXS_ECORRUPT);
}

Test(format, label_write_refuses_bad_names)
{
    const char *p = make_pristine("names.ctxs");
    char big[300];
    memset(big, 'b', sizeof(big));
    int fd = open_fd(p, O_RDWR);
    cr_assert_eq(ctxs__label_write(fd, 1, "x", 0), CTXS_EINVAL, "empty name");
    cr_assert_eq(ctxs__label_write(fd, 1, big, 256), CTXS_EINVAL, "256 bytes");
    cr_assert_eq(ctxs__label_write(fd, 1, big, sizeof(big)), CTXS_EINVAL, "300 bytes");
    cr_assert_eq(ctxs__label_write(fd, 1, big, SIZE_MAX), CTXS_EINVAL, "SIZE_MAX");
    cr_assert_eq(ctxs__label_write(fd, 1, "a\0b", 3), CTXS_EINVAL, "NUL inside");
    cr_assert_eq(ctxs__label_write(fd, 1, NULL, 3), CTXS_EINVAL, "NULL");
    close(fd);
    uint64_t id;
    char name[256];
    cr_assert_eq(label_of(p, &id, name), CTXS_ENOTFOUND, "a refused write wrote");

    fd = open_fd(p, O_RDONLY);
    cr_assert_lt(ctxs__label_write(fd, 1, "ro", 2), 0, "a write through a read-only descriptor");
    close(fd);
}

/* The session never touches the label: commits, rollbacks and a verifying
 * writer's open leave it, and it changes nothing the session reads. */
Test(format, label_and_session_leave_each_other_alone)
{
    const char *p = make_pristine("both.ctxs");
    ctxs_model m = ts_model(1);
    ctxs_session *s = NULL;
    cr_assert_eq(ctxs_session_open(&s, p, &m, 0, NULL), 0);
    int fd = open_fd(p, O_RDWR);
    cr_assert_eq(ctxs__label_write(fd, 77, "while open", 10), 0);
    close(fd);
    cr_assert_eq(ts_append(s, 30), 0);
    cr_assert_eq(ctxs_session_rollback(s, 50), 0);
    cr_assert_eq(ts_append(s, 10), 0);
    cr_assert_eq(ctxs_session_sync(s), 0);
    cr_assert_eq(ts_check_all(s), 0);
    ctxs_session_close(s);

    cr_assert_eq(ctxs_session_open(&s, p, &m, CTXS_OPEN_VERIFY, NULL), 0);
    cr_assert_eq(n_tokens_of(s), 60);
    cr_assert_eq(ts_check_all(s), 0);
    ctxs_session_close(s);
    uint64_t id;
    char name[256];
    cr_assert_eq(label_of(p, &id, name), 0);
    cr_assert_eq(id, 77);
    cr_assert_str_eq(name, "while open");
}

/* --- files written by earlier versions --------------------------------- */

/* tests/data holds files written by the 1.0 code (tests/data/make_v1_0.c
 * says how); meson passes the folder in CTXS_TEST_DATA. They are copied
 * before use: a read-write open may write to them. */
static const char *old_file(const char *name)
{
    const char *dir = getenv("CTXS_TEST_DATA");
    cr_assert(dir && *dir, "CTXS_TEST_DATA is not set: run the suite through meson test");
    const char *p = ts_path(ts_scratch, name);
    copy_file(ts_path(dir, name), p);
    return p;
}

/* Opens path as the 1.x file it is and checks what make_v1_0.c or
 * make_v1_1.c wrote (the same contents). */
static void expect_v1(uint32_t minor, const char *path, unsigned flags, uint32_t recovery,
                      uint64_t n_tokens, uint64_t ring_start)
{
    ctxs_model m = ts_model(1);
    ctxs_session *s = NULL;
    int rc = ctxs_session_open(&s, path, (flags & CTXS_RDONLY) ? NULL : &m, flags | recovery,
                               NULL);
    cr_assert_eq(rc, 0, "open a 1.%u file: %s", minor, ctxs_strerror(rc));
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(info.format_major, 1);
    cr_assert_eq(info.format_minor, minor);
    cr_assert(memcmp(&info.model, &m, sizeof(m)) == 0, "the model");
    cr_assert_eq(info.capacity, 64);
    cr_assert_eq(info.n_sink, 4);
    cr_assert_eq(info.n_tokens, n_tokens);
    cr_assert_eq(info.ring_start, ring_start);
    cr_assert_eq(info.lost_tokens, 0);
    cr_assert_eq(info.flags & CTXS_INFO_RECOVERED, 0);
    cr_assert_eq(ts_check_all(s), 0, "tokens of a 1.%u file do not read back", minor);
    cr_assert_eq(ctxs_session_verify(NULL, s), 0);
    /* Every held token, one by one, and none of the evicted ones. */
    uint16_t k[32], v[32], ek[32], ev[32];
    uint64_t held = 0;
    for (uint64_t p = 0; p < n_tokens; p++) {
        rc = ctxs_session_read_token(k, v, s, p, CTXS_DTYPE_F16);
        if (p >= 4 && p < ring_start) {
            cr_assert_eq(rc, CTXS_EEVICTED, "position %llu", (unsigned long long)p);
            continue;
        }
        cr_assert_eq(rc, 0, "position %llu: %s", (unsigned long long)p, ctxs_strerror(rc));
        ts_fill_kv(&m.geometry, p, ek, ev);
        cr_assert(memcmp(k, ek, sizeof(k)) == 0 && memcmp(v, ev, sizeof(v)) == 0,
                  "position %llu", (unsigned long long)p);
        held++;
    }
    cr_assert_eq(info.n_held, held);
    ctxs_session_close(s);
}

Test(format, version_1_0_file_opens_and_keeps_its_tokens)
{
    const char *p = old_file("v1_0.ctxs");
    ctxs__disk_header h;
    hdr_read(p, &h);
    cr_assert_eq(h.version_major, 1);
    cr_assert_eq(h.version_minor, 0, "the data file is not a 1.0 file");
    uint64_t id = 1;
    char name[256];
    cr_assert_eq(label_of(p, &id, name), CTXS_ENOTFOUND);

    expect_v1(0, p, CTXS_RDONLY, 0, 20, 0);
    expect_v1(0, p, CTXS_RDONLY, CTXS_OPEN_VERIFY, 20, 0);
    expect_v1(0, p, 0, CTXS_OPEN_VERIFY, 20, 0);
    expect_v1(0, p, 0, 0, 20, 0);

    /* A writer of this version goes on with it; the header, and so its
     * version, is never rewritten. */
    ctxs_model m = ts_model(1);
    ctxs_session *s = NULL;
    cr_assert_eq(ctxs_session_open(&s, p, &m, 0, NULL), 0);
    cr_assert_eq(ts_append(s, 30), 0);
    ctxs_session_close(s);
    expect_v1(0, p, CTXS_RDONLY, CTXS_OPEN_VERIFY, 50, 0);
    ctxs__disk_header after;
    hdr_read(p, &after);
    cr_assert(memcmp(&h, &after, sizeof(h)) == 0, "the 1.0 header was rewritten");

    /* A store may label a 1.0 file; it stays a 1.0 file that opens. */
    int fd = open_fd(p, O_RDWR);
    cr_assert_eq(ctxs__label_write(fd, 3, "old", 3), 0);
    close(fd);
    cr_assert_eq(label_of(p, &id, name), 0);
    cr_assert_str_eq(name, "old");
    expect_v1(0, p, 0, CTXS_OPEN_VERIFY, 50, 0);
}

Test(format, version_1_0_wrapped_ring_opens_and_keeps_its_tokens)
{
    const char *p = old_file("v1_0_ring.ctxs");
    ctxs__disk_header h;
    hdr_read(p, &h);
    cr_assert_eq(h.version_minor, 0, "the data file is not a 1.0 file");
    uint64_t id;
    char name[256];
    cr_assert_eq(label_of(p, &id, name), CTXS_ENOTFOUND);
    expect_v1(0, p, CTXS_RDONLY, 0, 100, 40);
    expect_v1(0, p, CTXS_RDONLY, CTXS_OPEN_VERIFY, 100, 40);
    expect_v1(0, p, 0, CTXS_OPEN_VERIFY, 100, 40);

    ctxs_model m = ts_model(1);
    ctxs_session *s = NULL;
    cr_assert_eq(ctxs_session_open(&s, p, &m, 0, NULL), 0);
    cr_assert_eq(ts_append(s, 10), 0);
    ctxs_session_close(s);
    expect_v1(0, p, 0, 0, 110, 50);
}

Test(format, version_1_1_file_opens_and_keeps_its_tokens)
{
    const char *p = old_file("v1_1.ctxs");
    ctxs__disk_header h;
    hdr_read(p, &h);
    cr_assert_eq(h.version_major, 1);
    cr_assert_eq(h.version_minor, 1, "the data file is not a 1.1 file");
    uint64_t id = 0;
    char name[256];
    cr_assert_eq(label_of(p, &id, name), 0);
    cr_assert_eq(id, 11);
    cr_assert_str_eq(name, "made by 1.1");

    expect_v1(1, p, CTXS_RDONLY, 0, 20, 0);
    expect_v1(1, p, CTXS_RDONLY, CTXS_OPEN_VERIFY, 20, 0);
    expect_v1(1, p, 0, CTXS_OPEN_VERIFY, 20, 0);

    /* A writer of this version goes on with it, as fp16, and keeps its
     * header and so its version; the tokens read back as float too. */
    ctxs_model m = ts_model(1);
    ctxs_session *s = NULL;
    cr_assert_eq(ctxs_session_open(&s, p, &m, 0, NULL), 0);
    cr_assert_eq(ts_append(s, 30), 0);
    float k[TS_KV_MAX], v[TS_KV_MAX];
    uint16_t ek[TS_KV_MAX], ev[TS_KV_MAX];
    cr_assert_eq(ctxs_session_read_token(k, v, s, 7, CTXS_DTYPE_F32), 0);
    ts_fill_kv(&m.geometry, 7, ek, ev);
    size_t n = ctxs_geometry_get_token_bytes(&m.geometry, CTXS_DTYPE_F16) / 2;
    for (size_t i = 0; i < n; i++)
        cr_assert(k[i] == ctxs__f16_to_f32(ek[i]) && v[i] == ctxs__f16_to_f32(ev[i]), "element %zu", i);
    ctxs_session_close(s);
    expect_v1(1, p, CTXS_RDONLY, CTXS_OPEN_VERIFY, 50, 0);
    ctxs__disk_header after;
    hdr_read(p, &after);
    cr_assert(memcmp(&h, &after, sizeof(h)) == 0, "the 1.1 header was rewritten");
}

Test(format, version_1_1_wrapped_ring_opens_and_keeps_its_tokens)
{
    const char *p = old_file("v1_1_ring.ctxs");
    ctxs__disk_header h;
    hdr_read(p, &h);
    cr_assert_eq(h.version_minor, 1, "the data file is not a 1.1 file");
    expect_v1(1, p, CTXS_RDONLY, 0, 100, 40);
    expect_v1(1, p, 0, CTXS_OPEN_VERIFY, 100, 40);

    ctxs_model m = ts_model(1);
    ctxs_session *s = NULL;
    cr_assert_eq(ctxs_session_open(&s, p, &m, 0, NULL), 0);
    cr_assert_eq(ts_append(s, 10), 0);
    ctxs_session_close(s);
    expect_v1(1, p, 0, 0, 110, 50);
}

/* Opens path, a file make_v2_0.c wrote with dtype, and checks it against a
 * file the running code makes the same way: the same held tokens, read
 * back the same, and it verifies. */
static void expect_v2(const char *path, uint32_t dtype, const uint32_t *commits, int n_commits,
                      uint64_t n_tokens, uint64_t ring_start, unsigned flags)
{
    ctxs_model m = ts_model(1);
    m.geometry.dtype = dtype;
    ctxs_session *s = NULL, *fresh = NULL;
    int rc = ctxs_session_open(&s, path, (flags & CTXS_RDONLY) ? NULL : &m, flags, NULL);
    cr_assert_eq(rc, 0, "open a 2.0 file: %s", ctxs_strerror(rc));
    ctxs_create_options o = ts_options(64, 4, 1, CTXS_SYNC_NONE);
    cr_assert_eq(ctxs_session_create(&fresh, ts_path(ts_scratch, "fresh-v2"), &m, &o), 0);
    for (int i = 0; i < n_commits; i++)
        cr_assert_eq(ts_append(fresh, commits[i]), 0);
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(info.format_major, 2);
    cr_assert_eq(info.format_minor, 0);
    cr_assert(memcmp(&info.model, &m, sizeof(m)) == 0, "the model");
    cr_assert_eq(info.capacity, 64);
    cr_assert_eq(info.n_tokens, n_tokens);
    cr_assert_eq(info.ring_start, ring_start);
    cr_assert_eq(info.flags & CTXS_INFO_RECOVERED, 0);
    cr_assert_eq(ctxs_session_verify(NULL, s), 0);
    float k[TS_KV_MAX], v[TS_KV_MAX], fk[TS_KV_MAX], fv[TS_KV_MAX];
    for (uint64_t p = 0; p < n_tokens; p++) {
        int a = ctxs_session_read_token(k, v, s, p, CTXS_DTYPE_F32);
        int b = ctxs_session_read_token(fk, fv, fresh, p, CTXS_DTYPE_F32);
        cr_assert_eq(a, b, "position %llu", (unsigned long long)p);
        if (a == 0)
            cr_assert(memcmp(k, fk, sizeof(k)) == 0 && memcmp(v, fv, sizeof(v)) == 0,
                      "position %llu reads back otherwise", (unsigned long long)p);
    }
    uint32_t ids[100], fids[100];
    uint64_t first = ring_start > 4 ? ring_start : 4;
    cr_assert_eq(ctxs_session_get_tokens(ids, s, first, (uint32_t)(n_tokens - first)), 0);
    cr_assert_eq(ctxs_session_get_tokens(fids, fresh, first, (uint32_t)(n_tokens - first)), 0);
    cr_assert(memcmp(ids, fids, (n_tokens - first) * 4) == 0, "token ids");
    ctxs_session_close(fresh);
    ctxs_session_close(s);
    unlink(ts_path(ts_scratch, "fresh-v2"));
}

Test(format, version_2_0_files_open_and_keep_their_tokens)
{
    static const uint32_t few[] = {5, 7, 8}, wrap[] = {30, 30, 40};
    const char *p = old_file("v2_0_bf16.ctxs");
    ctxs__disk_header h;
    hdr_read(p, &h);
    cr_assert(h.version_major == 2 && h.version_minor == 0, "the data file is not a 2.0 file");
    uint64_t id = 0;
    char name[256];
    cr_assert_eq(label_of(p, &id, name), 0);
    cr_assert_eq(id, 21);
    cr_assert_str_eq(name, "made by 2.0");
    expect_v2(p, CTXS_DTYPE_BF16, few, 3, 20, 0, CTXS_RDONLY);
    expect_v2(p, CTXS_DTYPE_BF16, few, 3, 20, 0, CTXS_OPEN_VERIFY);

    const char *q = old_file("v2_0_q8.ctxs");
    hdr_read(q, &h);
    cr_assert(h.version_major == 2 && h.dtype == CTXS_DTYPE_Q8, "the data file is not 2.0 Q8");
    expect_v2(q, CTXS_DTYPE_Q8, wrap, 3, 100, 40, CTXS_RDONLY | CTXS_OPEN_VERIFY);
    expect_v2(q, CTXS_DTYPE_Q8, wrap, 3, 100, 40, CTXS_OPEN_VERIFY);

    /* A writer goes on with it and never rewrites its header. */
    ctxs_model m = ts_model(1);
    m.geometry.dtype = CTXS_DTYPE_Q8;
    ctxs_session *s = NULL;
    cr_assert_eq(ctxs_session_open(&s, q, &m, 0, NULL), 0);
    cr_assert_eq(ts_append(s, 10), 0);
    ctxs_session_close(s);
    static const uint32_t more[] = {30, 30, 40, 10};
    expect_v2(q, CTXS_DTYPE_Q8, more, 4, 110, 50, CTXS_OPEN_VERIFY);
    ctxs__disk_header after;
    hdr_read(q, &after);
    cr_assert(memcmp(&h, &after, sizeof(h)) == 0, "the 2.0 header was rewritten");
}

/* Every errno the system can return has its name, from the C library
 * where it names errnos and from the table otherwise, and the two agree. */
Test(format, err_name_names_every_errno_and_every_code)
{
    int named = 0;
    for (int e = 1; e <= 133; e++) {
        char unknown[64];
        snprintf(unknown, sizeof(unknown), "Unknown error %d", e);
        int real = strcmp(strerror(e), unknown) != 0; /* 41 and 58 are no errno on Linux */
        const char *n = ctxs_err_name(-e);
        cr_assert_not_null(n);
        if (!real) {
            cr_assert_str_eq(n, "ERRNO", "%d is no errno", e);
            continue;
        }
        named++;
        cr_assert(n[0] == 'E' && strcmp(n, "ERRNO") != 0, "errno %d (%s) is named %s", e,
                  strerror(e), n);
        const char *t = ctxs__errno_name(e);
        cr_assert_not_null(t, "the table has no name for errno %d (%s)", e, strerror(e));
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
        cr_assert_str_eq(t, strerrorname_np(e), "errno %d", e);
#endif
        cr_assert_str_eq(t, n, "errno %d", e);
    }
    cr_assert_geq(named, 100);
    const struct {
        int e;
        const char *name;
    } some[] = {{ENOENT, "ENOENT"}, {EAGAIN, "EAGAIN"}, {EOPNOTSUPP, "EOPNOTSUPP"},
                {ENOTRECOVERABLE, "ENOTRECOVERABLE"}, {EUCLEAN, "EUCLEAN"}, {ESTALE, "ESTALE"},
                {ETIMEDOUT, "ETIMEDOUT"}, {EOVERFLOW, "EOVERFLOW"}};
    for (size_t i = 0; i < sizeof(some) / sizeof(some[0]); i++)
        cr_assert_str_eq(ctxs_err_name(-some[i].e), some[i].name);
#define CODE_NAMED_(name, value, text)                                                        \
    cr_assert_str_eq(ctxs_err_name(value), "CTXS_E" #name);                                  \
    cr_assert_str_neq(ctxs_strerror(value), "unknown error");
    CTXS_ERRNO_MAP(CODE_NAMED_)
#undef CODE_NAMED_
    cr_assert_str_eq(ctxs_err_name(-4096), "UNKNOWN");
    cr_assert_str_eq(ctxs_err_name(1), "UNKNOWN");
}

/* --- checksums ---------------------------------------------------------- */

/* The four-input XXH3 kernels give xxHash's own values for every length
 * they take, any seed, and inputs at any alignment. */
Test(format, xxh3_lanes_equal_xxhash)
{
    static const char *const isas[] = {"avx512", "avx2"};
    static const uint64_t seeds[] = {0, 1, 0x637478732d6b7631ull, UINT64_MAX};
    const size_t span = CTXS__XXH3_LANES_MAX + 64;
    uint8_t *buf = malloc(4 * span);
    cr_assert_not_null(buf);
    for (size_t i = 0; i < 4 * span; i++)
        buf[i] = (uint8_t)ts_mix64(i);
    int ran = 0;
    for (size_t k = 0; k < sizeof(isas) / sizeof(isas[0]); k++) {
        ctxs__xxh3_lanes_fn lanes = ctxs__xxh3_lanes_named(isas[k]);
        if (!lanes) { /* info, not a warning: Criterion exits non-zero after any warning */
            cr_log_info("this CPU has no %s: its XXH3 kernel is not tested here", isas[k]);
            continue;
        }
        ran++;
        for (size_t len = CTXS__XXH3_LANES_MIN; len <= CTXS__XXH3_LANES_MAX; len++) {
            uint64_t h[4], want[4];
            const uint8_t *in[4];
            for (int j = 0; j < 4; j++) {
                in[j] = buf + (size_t)j * span + (len + (size_t)j) % 61;
                /* The fixed seeds in turn; every third length, mixed ones. */
                h[j] = len % 3 ? seeds[(len + (size_t)j) % 4] : ts_mix64(len * 4 + (size_t)j);
                want[j] = XXH3_64bits_withSeed(in[j], len, h[j]);
            }
            lanes(h, in, len);
            for (int j = 0; j < 4; j++)
                cr_assert_eq(h[j], want[j], "%s: lane %d of %zu bytes: %016llx, xxHash %016llx",
                             isas[k], j, len, (unsigned long long)h[j],
                             (unsigned long long)want[j]);
        }
    }
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2"))
        cr_assert_not_null(ctxs__xxh3_lanes(), "a CPU with AVX2 gets no kernel");
#endif
    cr_log_info("XXH3 kernels checked: %d", ran);
    free(buf);
}

/* The chain of docs/FORMAT.md "Checksums" for position pos, computed with
 * xxHash's own calls from a file's bytes: over the runs of the layers of
 * `group` (-1: those laid out as the session's slots), each at `slot`, then
 * their scales. */
static uint64_t format_chain(const uint8_t *file, const ctxs__file_layout *lay, int32_t group,
                             uint64_t pos, uint32_t id, uint32_t slot)
{
    uint8_t head[12];
    memcpy(head, &pos, 8);
    memcpy(head + 8, &id, 4);
    uint64_t h = XXH3_64bits_withSeed(head, 12, 0x637478732d6b7631ull);
    const uint32_t per = 2 * lay->n_kv_heads, n_runs = lay->n_layers * per;
    static uint8_t scales[4 * 4096];
    size_t scales_len = 0;
    for (uint32_t r = 0; r < n_runs; r++) {
        if (ctxs__layer_group(lay, r / per) != group)
            continue;
        h = XXH3_64bits_withSeed(file + lay->kv_off + ctxs__run_off(lay, r) +
                                     (uint64_t)slot * lay->slot_bytes,
                                 lay->slot_bytes, h);
        if (lay->scales_bytes) {
            cr_assert_leq(scales_len + 4, sizeof(scales));
            memcpy(scales + scales_len,
                   file + lay->scales_off + ctxs__run_scales_off(lay, r) + (uint64_t)slot * 4, 4);
            scales_len += 4;
        }
    }
    return lay->scales_bytes ? XXH3_64bits_withSeed(scales, scales_len, h) : h;
}

/* A session's checksums are the chain docs/FORMAT.md gives, computed here
 * with xxHash's own calls from the file's bytes: for slots the four-input
 * kernels hash (256 and 512 bytes, 1 KiB), for smaller and larger ones,
 * for Q8's scales (576 runs: hashed a piece at a time), and for a windowed
 * group's table; 13 tokens, so that some chains are hashed one at a time. */
Test(format, checksums_are_the_chain_the_format_gives)
{
    static const struct {
        uint32_t dtype, head_dim, n_layers, n_kv_heads, window;
    } cases[] = {{CTXS_DTYPE_F16, 8, 2, 2, 0},     {CTXS_DTYPE_F16, 128, 2, 2, 0},
                 {CTXS_DTYPE_BF16, 256, 2, 2, 0},  {CTXS_DTYPE_Q8, 256, 2, 2, 0},
                 {CTXS_DTYPE_F16, 512, 2, 2, 0},   {CTXS_DTYPE_F16, 1024, 2, 2, 0},
                 {CTXS_DTYPE_Q8, 128, 2, 2, 0},    {CTXS_DTYPE_Q8, 128, 36, 8, 0},
                 {CTXS_DTYPE_Q8, 64, 6, 3, 2},     {CTXS_DTYPE_F16, 64, 6, 3, 2}};
    const uint32_t n = 13, capacity = 64, batch = 9;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        char name[64];
        snprintf(name, sizeof(name), "chain-%zu.ctxs", c);
        const char *p = ts_path(ts_scratch, name);
        ctxs_model m = ts_model(7);
        m.geometry.dtype = cases[c].dtype;
        m.geometry.head_dim = cases[c].head_dim;
        m.geometry.n_layers = cases[c].n_layers;
        m.geometry.n_kv_heads = cases[c].n_kv_heads;
        if (cases[c].window) { /* every second layer windowed: a group whose ring wraps */
            m.geometry.period = 2;
            m.geometry.window[1] = cases[c].window;
        }
        ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
        o.capacity = capacity;
        o.batch = batch;
        o.ring = 0;
        ctxs_session *s;
        cr_assert_eq(ctxs_session_create(&s, p, &m, &o), 0, "%s", ctxs_get_last_error());
        /* In commits of at most the batch, which a windowed group's ring
         * keeps beyond its window: 9 (eight chains at once, then one), then 4. */
        for (uint32_t done = 0; done < n; done += batch)
            cr_assert_eq(ts_append(s, n - done < batch ? n - done : batch), 0, "%s",
                         ctxs_get_last_error());
        ctxs_session_close(s);

        ctxs__file_layout lay;
        cr_assert_eq(ctxs__layout_compute(&lay, &m.geometry, capacity, o.n_sink, batch), 0);
        cr_assert_eq(lay.n_groups, cases[c].window ? 1u : 0u);
        uint8_t *file = malloc(lay.file_bytes);
        cr_assert_not_null(file);
        raw_read(p, 0, file, lay.file_bytes);
        for (uint64_t pos = 0; pos < n; pos++) {
            uint32_t id;
            uint64_t stored;
            memcpy(&id, file + lay.tokens_off + pos * 4, 4);
            memcpy(&stored, file + lay.sums_off + pos * 8, 8);
            const uint64_t h = format_chain(file, &lay, -1, pos, id, (uint32_t)pos);
            cr_assert_eq(stored, h, "dtype %u, %u dims: position %llu's checksum %016llx, "
                                    "the format's chain %016llx",
                         cases[c].dtype, cases[c].head_dim, (unsigned long long)pos,
                         (unsigned long long)stored, (unsigned long long)h);
            if (!lay.n_groups)
                continue;
            /* The group's ring holds the positions of its last len slots. */
            const uint32_t len = lay.groups[0].len;
            cr_assert_lt(len, n, "the ring wraps");
            if (pos + len < n)
                continue;
            ctxs__group_entry e;
            memcpy(&e, file + lay.groups[0].table_off + (pos % len) * sizeof(e), sizeof(e));
            const uint64_t gh = format_chain(file, &lay, 0, pos, id, (uint32_t)(pos % len));
            cr_assert(e.pos == pos && e.sum == gh,
                      "dtype %u: the group's entry for position %llu holds position %llu, "
                      "checksum %016llx; the format's chain %016llx",
                      cases[c].dtype, (unsigned long long)pos, (unsigned long long)e.pos,
                      (unsigned long long)e.sum, (unsigned long long)gh);
        }
        free(file);
        /* And it opens verified, all its tokens held. */
        cr_assert_eq(ctxs_session_open(&s, p, &m, CTXS_RDONLY, NULL), 0, "%s", ctxs_get_last_error());
        ctxs_session_info info;
        cr_assert_eq(ctxs_session_get_info(&info, s), 0);
        cr_assert_eq(info.n_tokens, n);
        ctxs_session_close(s);
    }
}
