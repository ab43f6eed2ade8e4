/*
 * Export and import: one session in one portable, self-checking file, to
 * move it to another machine. The file's layout is in export_format.h;
 * docs/FORMAT.md, "Export file format", is its prose version.
 *
 * An export file is a header (the model, geometry and committed state),
 * then the held tokens in position order, in zlib-compressed blocks that
 * each carry CRC-32s, then a trailer with a CRC-32 of everything before
 * it. Every token also carries its session checksum (the XXH3-64 chain of
 * FORMAT.md "Checksums"), which import recomputes from the decompressed
 * bytes: a file that verifies holds exactly what the source session held.
 *
 * Export reads the session through a read-only handle while a writer may
 * go on appending: it exports the state its handle opened with. A held
 * slot is never rewritten before a record that stops holding it (rollback,
 * ring eviction), so the copy is exact if, afterwards, the session still
 * holds every exported position with the checksums that were exported;
 * each block is also checked against its checksums as it is copied, so a
 * token rewritten under the copy never leaves as a mismatched pair.
 *
 * Import reads the file twice. Pass 1 checks all of it and touches
 * nothing. Pass 2 decodes it again, checking everything again (the file
 * may have changed in between), into a new session file written aside
 * through the store's create (intent, file, index): a failure or a crash at
 * any point leaves no session, and the intent is resolved at the next open.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zlib.h>

#include "aside.h"
#include "export_format.h"
#include "index.h"
#include "kv_block.h"
#include "session_iface.h"
#include "platform.h"
#include "progress.h"
#include "syscall.h"

/* Export blocks are kv_block.h's raw blocks, bounded alike. */
static_assert(CTXS__EXPORT_MAX_BLOCK_TOKENS == CTXS__KV_BLOCK_MAX_TOKENS, "export block tokens");
static_assert(CTXS__EXPORT_MAX_RAW == CTXS__KV_BLOCK_MAX_RAW, "export block bytes");

static uint32_t crc_of(const void *p, size_t n)
{
    return (uint32_t)crc32(0L, (const Bytef *)p, (uInt)n);
}

static uint32_t crc_more(uint32_t crc, const void *p, size_t n)
{
    return (uint32_t)crc32(crc, (const Bytef *)p, (uInt)n);
}

static int full_or(int rc)
{
    return rc == -ENOSPC || rc == -EDQUOT || rc == -EFBIG ? CTXS_EFULL : rc;
}

static void progress_call(ctxs_progress_fn fn, void *arg, uint64_t done, uint64_t total)
{
    if (fn && done < total)
        fn(arg, done, total);
}

/* --- Export --------------------------------------------------------------- */

typedef struct export_job {
    ctxs_session *s;            /* read-only, through the store */
    ctxs__kv_plan plan;
    int fd;                     /* the file written aside */
    uint64_t off;               /* bytes written so far */
    uint32_t body_crc;
    uint64_t sums_hash;         /* XXH3-64 chained over the exported sums */
    uint8_t *raw;               /* block_tokens * token_raw */
    uint8_t *out;               /* block header, then the zlib stream */
    size_t out_cap;
    /* Huffman coding only: fp16 keys and values have next to no repeated
     * strings for deflate's matching to find, and skipping the search
     * compresses them as well, three times faster. */
    z_stream zs;
    int zs_ready;
    uint8_t *meta;              /* the metadata section */
    uint32_t meta_bytes, meta_count;
    ctxs_progress_fn progress;
    void *progress_arg;
} export_job;

static int put(export_job *job, const void *p, size_t n)
{
    int rc = ctxs__write_exact(job->fd, p, n, (off_t)job->off);
    if (rc < 0)
        return rc;
    job->body_crc = crc_more(job->body_crc, p, n);
    job->off += n;
    return 0;
}

/* Copies, checks, compresses and writes one block. */
static int export_block(export_job *job, uint32_t index, int32_t part, uint64_t first,
                        uint32_t count)
{
    const ctxs__kv_plan *p = &job->plan;
    int rc;
    if ((rc = ctxs__kv_block_read(job->raw, p, part, job->s, first, count)) < 0)
        return rc;
    size_t raw_bytes = (size_t)ctxs__kv_raw_bytes(p, part, count);
    uLongf bound = compressBound((uLong)raw_bytes), comp = bound;
    z_stream *zs = &job->zs;
    deflateReset(zs);
    zs->next_in = job->raw;
    zs->avail_in = (uInt)raw_bytes;
    zs->next_out = job->out + sizeof(ctxs__export_block);
    zs->avail_out = (uInt)bound;
    int zrc = deflate(zs, Z_FINISH);
    if (zrc == Z_STREAM_END) {
        comp = zs->total_out;
    } else {
        /* Readers take at most compressBound(); compress2() keeps to it
         * whatever the data (Huffman coding alone has never needed more). */
        zrc = compress2(job->out + sizeof(ctxs__export_block), &comp, job->raw, (uLong)raw_bytes,
                        Z_BEST_SPEED);
        if (zrc != Z_OK)
            return zrc == Z_MEM_ERROR ? CTXS_ENOMEM : CTXS_EINVAL;
    }
    ctxs__export_block b;
    memset(&b, 0, sizeof(b));
    memcpy(b.magic, CTXS__EXPORT_BLOCK_MAGIC, 4);
    b.index = index;
    b.first_pos = first;
    b.count = count;
    b.raw_bytes = (uint32_t)raw_bytes;
    b.comp_bytes = (uint32_t)comp;
    b.data_crc32 = crc_of(job->out + sizeof(b), comp);
    b.raw_crc32 = crc_of(job->raw, raw_bytes);
    b.crc32 = crc_of(&b, offsetof(ctxs__export_block, crc32));
    memcpy(job->out, &b, sizeof(b));
    job->sums_hash =
        XXH3_64bits_withSeed(ctxs__raw_sums(job->raw), (size_t)count * 8, job->sums_hash);
    return put(job, job->out, sizeof(b) + comp);
}

/* After the copy: does the session still hold every exported token with
 * the checksum exported? Then the file holds what the session holds. */
static int export_still_held(export_job *job)
{
    const ctxs__kv_plan *p = &job->plan;
    int rc = ctxs__kv_still_holds(&job->plan, job->s);
    if (rc < 0)
        return rc;
    uint64_t h = 0, first, sums[CTXS__KV_BLOCK_MAX_TOKENS];
    uint32_t count;
    int32_t part;
    ctxs__kv_walk w;
    ctxs__kv_walk_init(p, &w);
    while (ctxs__kv_walk_next(p, &w, &part, &first, &count)) {
        if (part < 0)
            ctxs__session_tokens(NULL, sums, job->s, first, count);
        else if ((rc = ctxs__session_group_sums(sums, job->s, (uint32_t)part, first, count)) < 0)
            return rc;
        h = XXH3_64bits_withSeed(sums, (size_t)count * 8, h);
    }
    return h == job->sums_hash ? 0 : CTXS_ESTALE;
}

static int export_write(export_job *job, const ctxs__export_header *h)
{
    const ctxs__kv_plan *p = &job->plan;
    int rc = put(job, h, sizeof(*h));
    if (rc == 0 && job->meta_bytes)
        rc = put(job, job->meta, job->meta_bytes);
    uint64_t first, done = 0;
    uint32_t count, index = 0;
    int32_t part;
    ctxs__kv_walk w;
    ctxs__kv_walk_init(p, &w);
    while (rc == 0 && ctxs__kv_walk_next(p, &w, &part, &first, &count)) {
        rc = export_block(job, index++, part, first, count);
        done += part < 0 ? count : 0;
        if (rc == 0)
            progress_call(job->progress, job->progress_arg, done, p->n_held);
    }
    if (rc < 0)
        return rc;
    ctxs__export_trailer t;
    memset(&t, 0, sizeof(t));
    memcpy(t.magic, CTXS__EXPORT_TRAILER_MAGIC, 4);
    t.n_blocks = p->n_blocks;
    t.n_held = p->n_held;
    t.body_bytes = job->off;
    t.body_crc32 = job->body_crc;
    t.crc32 = crc_of(&t, offsetof(ctxs__export_trailer, crc32));
    if ((rc = put(job, &t, sizeof(t))) < 0)
        return rc;
    if ((rc = full_or(ctxs__sync_data(job->fd))) < 0)
        return rc;
    return export_still_held(job);
}

static int export_session(export_job *job, const ctxs_session_info *info, const char *name,
                          size_t len, const char *model_name, const char *path)
{
    ctxs__kv_plan *p = &job->plan;
    int ring = (info->flags & CTXS_INFO_RING) != 0;
    const ctxs_geometry *g = &info->model.geometry;
    int rc = ctxs__kv_plan_make(p, g, info->capacity, info->n_sink,
                                g->period ? ctxs__session_batch(job->s) : 0, ring, info->n_tokens,
                                info->ring_start, 0);
    if (rc < 0)
        return rc == CTXS_ECORRUPT ? CTXS_EINVAL : rc; /* cannot be: the session opened */

    ctxs__export_header h;
    memset(&h, 0, sizeof(h));
    memcpy(h.magic, CTXS__EXPORT_MAGIC, 8);
    /* Without windowed layers, the file 2.0 readers read. */
    h.version_major = g->period ? CTXS__EXPORT_MAJOR : 2;
    h.version_minor = CTXS__EXPORT_MINOR;
    h.period = g->period;
    memcpy(h.window, g->window, sizeof(h.window));
    h.batch = g->period ? p->lay.batch : 0;
    h.header_bytes = CTXS__EXPORT_HEADER_BYTES;
    h.flags = ring ? CTXS__EXPORT_FLAG_RING : 0;
    h.dtype = info->model.geometry.dtype;
    h.n_layers = info->model.geometry.n_layers;
    h.n_kv_heads = info->model.geometry.n_kv_heads;
    h.head_dim = info->model.geometry.head_dim;
    h.capacity = info->capacity;
    h.n_sink = info->n_sink;
    h.block_tokens = p->block_tokens;
    h.n_tokens = p->st.n_tokens;
    h.ring_start = p->st.ring_start;
    h.n_held = p->n_held;
    h.n_blocks = p->n_blocks;
    h.created_unix_ms = info->created_unix_ms;
    h.exported_unix_ms = ctxs__now_ms();
    memcpy(h.model_hash, info->model.model_hash, 16);
    memcpy(h.tokenizer_hash, info->model.tokenizer_hash, 16);
    size_t model_name_len = strlen(model_name);
    h.model_name_len = (uint16_t)model_name_len;
    memcpy(h.model_name, model_name, model_name_len);
    h.name_len = (uint16_t)len;
    memcpy(h.name, name, len);
    h.meta_bytes = job->meta_bytes;
    h.meta_crc32 = job->meta_bytes ? crc_of(job->meta, job->meta_bytes) : 0;
    h.meta_count = job->meta_count;
    h.crc32 = crc_of(&h, offsetof(ctxs__export_header, crc32));

    size_t raw_max = (size_t)(p->block_tokens * p->token_raw);
    for (uint32_t gi = 0; gi < p->lay.n_groups; gi++)
        if (p->block_tokens * p->group_raw[gi] > raw_max)
            raw_max = (size_t)(p->block_tokens * p->group_raw[gi]);
    job->out_cap = sizeof(ctxs__export_block) + compressBound((uLong)raw_max);
    job->raw = ctxs__malloc(raw_max);
    job->out = ctxs__malloc(job->out_cap);
    if (!job->raw || !job->out)
        return CTXS_ENOMEM;
    if (deflateInit2(&job->zs, Z_BEST_SPEED, Z_DEFLATED, 15, 9, Z_HUFFMAN_ONLY) != Z_OK)
        return CTXS_ENOMEM;
    job->zs_ready = 1;

    /* Written aside and linked into place: the name appears only with a
     * complete, checked file behind it, and a link replaces nothing. */
    ctxs__aside a;
    if ((rc = ctxs__aside_open(&a, path, O_WRONLY)) < 0)
        return rc;
    job->fd = a.fd;
    int linked = 0;
    if ((rc = export_write(job, &h)) == 0) {
        if ((rc = ctxs__aside_link(&a, path)) == 0)
            linked = 1;
        else
            rc = full_or(rc);
    }
    ctxs__aside_unname(&a);
    close(job->fd);
    job->fd = -1;
    if (rc == 0 && (rc = ctxs__sync_parent_dir(path)) < 0 && linked)
        ctxs__unlink(path);
    return rc;
}

int ctxs_store_session_export(ctxs_store *st, const char *name, const char *path,
                              const ctxs_store_session_export_options *opts)
{
    ctxs__error_begin();
    ctxs__progress pr;
    CTXS__PROGRESS_FROM(&pr, opts, CTXS_STORE_SESSION_EXPORT_OPTIONS_VERSION,
                        CTXS_STORE_SESSION_EXPORT_OPTIONS_INIT, "export options");
    int rc;
    size_t len;
    if (!st || !path || !*path || ctxs__name_check(name, &len) < 0)
        return CTXS_EINVAL;
    /* Saves a copy that link() would refuse; link() alone decides. */
    struct stat sb;
    if (lstat(path, &sb) == 0)
        return ctxs__error(-EEXIST, "%s exists: an export never replaces a file", path);
    ctxs_session *s;
    ctxs_open_options o = CTXS_OPEN_OPTIONS_INIT;
    o.background = 0; /* the export reads every held token in file order */
    rc = ctxs_store_session_open(&s, st, name, NULL, CTXS_RDONLY, &o);
    if (rc < 0)
        return rc;
    ctxs_session_info info;
    ctxs_session_get_info(&info, s);
    ctxs_model_entry model;
    if ((rc = ctxs_model_get(&model, st, info.model.model_hash)) == CTXS_ENOTFOUND) {
        model.name[0] = '\0';
        rc = 0;
    }
    export_job job = {.s = s, .fd = -1, .progress = pr.fn, .progress_arg = pr.arg};
    ctxs_meta_entry *meta = NULL;
    size_t n_meta = 0;
    if (rc == 0 && (rc = ctxs_store_session_list_meta(&meta, &n_meta, st, name)) == 0)
        rc = ctxs__meta_section_make(&job.meta, &job.meta_bytes, &job.meta_count, meta,
                                     n_meta);
    ctxs_free(meta);
    if (rc == 0)
        rc = export_session(&job, &info, name, len, model.name, path);
    if (job.zs_ready)
        deflateEnd(&job.zs);
    free(job.meta);
    free(job.raw);
    free(job.out);
    ctxs_session_close(s);
    if (rc == 0 && pr.fn)
        pr.fn(pr.arg, job.plan.n_held, job.plan.n_held);
    return rc;
}

/* --- Import --------------------------------------------------------------- */

typedef struct import_job {
    int fd;
    uint64_t size;              /* the file's, at pass 1 */
    ctxs__export_header h;      /* as pass 1 read it */
    ctxs__kv_plan plan;
    ctxs_model model;
    char model_name[CTXS_NAME_MAX + 1];       /* NUL-terminated */
    char name[CTXS_NAME_MAX + 1];             /* the name the file carries */
    uint8_t *raw, *comp;
    size_t raw_cap, comp_cap;
    uint32_t meta_bytes, meta_crc32, meta_count; /* 0 in a 1.0 file */
    uint8_t *meta;              /* the metadata section, as pass 1 read it */
    ctxs__meta_item *items;     /* its entries, pointing into meta */
    int out_fd;                 /* pass 2: the new session file */
    int pass;                   /* 1 or 2 */
    ctxs_progress_fn progress;
    void *progress_arg;
} import_job;

/* Reads and checks the header, in the order FORMAT.md gives, and derives
 * the plan. Errors: CTXS_EFOREIGN, CTXS_EVERSION, CTXS_ECORRUPT, -errno. */
static int header_read(import_job *job)
{
    ctxs__export_header *h = &job->h;
    uint8_t head[12] = {0};
    size_t have = job->size < sizeof(head) ? (size_t)job->size : sizeof(head);
    int rc = ctxs__read_exact(job->fd, head, have, 0);
    if (rc < 0)
        return rc;
    /* Too short for a magic: the start of ours is a truncated export,
     * anything else (an empty file) is foreign. */
    size_t cmp = have < 8 ? have : 8;
    if (have == 0 || memcmp(head, CTXS__EXPORT_MAGIC, cmp) != 0)
        return CTXS_EFOREIGN;
    if (have < 10)
        return CTXS_ECORRUPT;
    /* The version before the CRC: a future major may move the CRC. */
    uint16_t major;
    memcpy(&major, head + 8, 2);
    if (major > CTXS__EXPORT_MAJOR)
        return CTXS_EVERSION;
    if (major == 0 || job->size < sizeof(*h))
        return CTXS_ECORRUPT;
    if ((rc = ctxs__read_exact(job->fd, h, sizeof(*h), 0)) < 0)
        return rc;
    if (h->crc32 != crc_of(h, offsetof(ctxs__export_header, crc32)) ||
        h->header_bytes != CTXS__EXPORT_HEADER_BYTES || (h->flags & ~CTXS__EXPORT_FLAG_RING) != 0)
        return CTXS_ECORRUPT;
    /* 1.x knew fp16 alone. */
    if (major == 1 && h->dtype != CTXS_DTYPE_F16)
        return CTXS_ECORRUPT;
    ctxs_geometry g = {h->n_layers, h->n_kv_heads, h->head_dim, h->dtype, 0, {0}};
    uint32_t batch = 0;
    /* 3.0: the schedule. A 3.0 file without one is as good as a 2.0 one;
     * the fields lie in bytes that 2.0 reserved, and are read as zero
     * there. */
    if (major >= 3) {
        g.period = h->period;
        memcpy(g.window, h->window, sizeof(g.window));
        batch = h->batch;
        if (!g.period && batch)
            return CTXS_ECORRUPT;
    }
    if ((rc = ctxs__kv_plan_make(&job->plan, &g, h->capacity, h->n_sink, batch,
                                 (h->flags & CTXS__EXPORT_FLAG_RING) != 0, h->n_tokens,
                                 h->ring_start, h->block_tokens)) < 0)
        return CTXS_ECORRUPT;
    if (h->block_tokens == 0 || h->n_held != job->plan.n_held ||
        h->n_blocks != job->plan.n_blocks)
        return CTXS_ECORRUPT;
    if ((rc = ctxs__name_field(job->model_name, h->model_name, h->model_name_len, 1)) < 0 ||
        (rc = ctxs__name_field(job->name, h->name, h->name_len, 0)) < 0)
        return rc;
    job->model.geometry = g;
    memcpy(job->model.model_hash, h->model_hash, 16);
    memcpy(job->model.tokenizer_hash, h->tokenizer_hash, 16);
    /* 1.0 reserved these bytes: whatever they hold, there is no section. */
    if (major >= 2) {
        job->meta_bytes = h->meta_bytes;
        job->meta_crc32 = h->meta_crc32;
        job->meta_count = h->meta_count;
    }
    return 0;
}

/* Reads and checks the metadata section, in the order FORMAT.md gives, and
 * lists its entries. Errors: CTXS_ECORRUPT, CTXS_ENOMEM, -errno. */
static int meta_read(import_job *job)
{
    uint32_t bytes = job->meta_bytes;
    if (bytes > CTXS__EXPORT_MAX_META || bytes > job->size - sizeof(job->h) ||
        (bytes == 0) != (job->meta_count == 0))
        return CTXS_ECORRUPT;
    if (bytes == 0)
        return 0;
    int rc;
    if (!(job->meta = ctxs__malloc(bytes)))
        return CTXS_ENOMEM;
    if ((rc = ctxs__read_exact(job->fd, job->meta, bytes, (off_t)sizeof(job->h))) < 0)
        return rc;
    if (crc_of(job->meta, bytes) != job->meta_crc32)
        return CTXS_ECORRUPT;
    return ctxs__meta_section_parse(&job->items, job->meta, bytes, job->meta_count);
}

/* Grows *buf to at least n bytes (n already bounded by the caller). */
static int reserve_buf(uint8_t **buf, size_t *cap, size_t n)
{
    if (n <= *cap)
        return 0;
    uint8_t *b = ctxs__realloc(*buf, n);
    if (!b)
        return CTXS_ENOMEM;
    *buf = b;
    *cap = n;
    return 0;
}

/* Reads and checks every block and the trailer, in the order FORMAT.md
 * gives; in pass 2 stores each block as it is checked. */
static int blocks_read(import_job *job)
{
    const ctxs__kv_plan *p = &job->plan;
    uint64_t off = sizeof(ctxs__export_header) + job->meta_bytes, first, size = job->size;
    uint64_t progress_base = job->pass == 2 ? size : 0;
    uint32_t body_crc = crc_of(&job->h, sizeof(job->h));
    uint32_t count, index = 0;
    int32_t part;
    ctxs__kv_walk w;
    ctxs__kv_walk_init(p, &w);
    int rc;
    /* The metadata section as pass 1 read it: what the index will get. */
    if (job->pass == 2 && job->meta_bytes) {
        if ((rc = reserve_buf(&job->comp, &job->comp_cap, job->meta_bytes)) < 0 ||
            (rc = ctxs__read_exact(job->fd, job->comp, job->meta_bytes, (off_t)sizeof(job->h))) < 0)
            return rc;
        if (memcmp(job->comp, job->meta, job->meta_bytes) != 0)
            return CTXS_ECORRUPT;
    }
    if (job->meta_bytes) /* crc32() of a NULL buffer is its initial value */
        body_crc = crc_more(body_crc, job->meta, job->meta_bytes);
    while (ctxs__kv_walk_next(p, &w, &part, &first, &count)) {
        ctxs__export_block b;
        if (size - off < sizeof(b))
            return CTXS_ECORRUPT;
        if ((rc = ctxs__read_exact(job->fd, &b, sizeof(b), (off_t)off)) < 0)
            return rc;
        uint64_t raw_bytes = ctxs__kv_raw_bytes(p, part, count); /* <= CTXS__EXPORT_MAX_RAW */
        if (memcmp(b.magic, CTXS__EXPORT_BLOCK_MAGIC, 4) != 0 ||
            b.crc32 != crc_of(&b, offsetof(ctxs__export_block, crc32)) || b.index != index ||
            b.first_pos != first || b.count != count || b.raw_bytes != raw_bytes ||
            b.comp_bytes == 0 || b.comp_bytes > compressBound((uLong)raw_bytes) ||
            b.comp_bytes > size - off - sizeof(b))
            return CTXS_ECORRUPT;
        /* Both sizes are now bounded: raw by CTXS__EXPORT_MAX_RAW, comp by
         * that and by the bytes the file has. */
        if ((rc = reserve_buf(&job->raw, &job->raw_cap, (size_t)raw_bytes)) < 0 ||
            (rc = reserve_buf(&job->comp, &job->comp_cap, b.comp_bytes)) < 0)
            return rc;
        if ((rc = ctxs__read_exact(job->fd, job->comp, b.comp_bytes,
                                   (off_t)(off + sizeof(b)))) < 0)
            return rc;
        if (crc_of(job->comp, b.comp_bytes) != b.data_crc32)
            return CTXS_ECORRUPT;
        uLongf got = (uLongf)raw_bytes;
        uLong used = b.comp_bytes;
        if (uncompress2(job->raw, &got, job->comp, &used) != Z_OK || got != raw_bytes ||
            used != b.comp_bytes || crc_of(job->raw, (size_t)raw_bytes) != b.raw_crc32 ||
            !ctxs__kv_raw_verifies(p, part, job->raw, first, count))
            return CTXS_ECORRUPT;
        if (job->pass == 2 &&
            (rc = ctxs__kv_block_store(job->out_fd, p, part, job->raw, first, count)) < 0)
            return rc;
        body_crc = crc_more(body_crc, &b, sizeof(b));
        body_crc = crc_more(body_crc, job->comp, b.comp_bytes);
        off += sizeof(b) + b.comp_bytes;
        index++;
        progress_call(job->progress, job->progress_arg, progress_base + off, 2 * size);
    }

    ctxs__export_trailer t;
    if (size - off != sizeof(t)) /* truncated, or trailing bytes */
        return CTXS_ECORRUPT;
    if ((rc = ctxs__read_exact(job->fd, &t, sizeof(t), (off_t)off)) < 0)
        return rc;
    if (memcmp(t.magic, CTXS__EXPORT_TRAILER_MAGIC, 4) != 0 ||
        t.crc32 != crc_of(&t, offsetof(ctxs__export_trailer, crc32)) || t.n_blocks != p->n_blocks ||
        t.n_held != p->n_held || t.body_bytes != off || t.body_crc32 != body_crc)
        return CTXS_ECORRUPT;
    return 0;
}

/* Pass 2, as the new session file's fill: the file is checked again as it
 * is decoded into the file written aside, which is made durable before it
 * is linked into place. */
static int import_fill(int fd, const ctxs__disk_label *label, void *arg)
{
    import_job *job = arg;
    const ctxs__kv_plan *p = &job->plan;
    /* The export file must be the one pass 1 checked. */
    ctxs__export_header again;
    struct stat sb;
    int rc;
    if (ctxs__fstat(job->fd, &sb) != 0)
        return -errno;
    if ((uint64_t)sb.st_size != job->size)
        return CTXS_ECORRUPT;
    if ((rc = ctxs__read_exact(job->fd, &again, sizeof(again), 0)) < 0)
        return rc;
    if (memcmp(&again, &job->h, sizeof(again)) != 0)
        return CTXS_ECORRUPT;

    if ((rc = ctxs__kv_file_begin(fd, p, &job->model, job->h.created_unix_ms, label)) < 0)
        return rc;
    job->out_fd = fd;
    job->pass = 2;
    if ((rc = blocks_read(job)) < 0)
        return rc;
    return full_or(ctxs__sync_data(fd));
}

int ctxs_store_session_import(char name_out[CTXS_NAME_MAX + 1], ctxs_store *st, const char *path,
                              const char *name, const ctxs_store_session_import_options *opts)
{
    ctxs__error_begin();
    if (name_out)
        name_out[0] = '\0';
    ctxs__progress pr;
    CTXS__PROGRESS_FROM(&pr, opts, CTXS_STORE_SESSION_IMPORT_OPTIONS_VERSION,
                        CTXS_STORE_SESSION_IMPORT_OPTIONS_INIT, "import options");
    int rc;
    size_t len = 0;
    if (!st || !path || !*path || (name && ctxs__name_check(name, &len) < 0))
        return CTXS_EINVAL;
    /* O_NONBLOCK: a FIFO in place of the file must not hang the open. */
    import_job job = {.fd = -1, .out_fd = -1, .pass = 1, .progress = pr.fn,
                      .progress_arg = pr.arg};
    job.fd = ctxs__open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (job.fd < 0)
        return -errno;
    struct stat sb;
    rc = 0;
    if (ctxs__fstat(job.fd, &sb) != 0)
        rc = -errno;
    else if (!S_ISREG(sb.st_mode))
        rc = CTXS_EFOREIGN; /* a directory, FIFO or device is no export file */
    if (rc == 0) {
        job.size = (uint64_t)sb.st_size;
        rc = header_read(&job);
    }
    if (rc == 0)
        rc = meta_read(&job);
    if (rc == 0 && !name) {
        name = job.name;
        len = strlen(name);
    }

    /* What the store would refuse, before reading the blocks. */
    ctxs_model_entry known;
    ctxs_session_entry other;
    if (rc == 0 && (rc = ctxs_model_get(&known, st, job.model.model_hash)) == 0 &&
        (memcmp(&known.model.geometry, &job.model.geometry, sizeof(known.model.geometry)) ||
         memcmp(known.model.tokenizer_hash, job.model.tokenizer_hash, 16))) {
        rc = ctxs__model_differs(&known.model, &job.model);
    }
    if (rc == CTXS_ENOTFOUND)
        rc = 0;
    if (rc == 0 && (rc = ctxs_store_session_get(&other, st, name)) == 0)
        rc = ctxs__name_taken(name);
    if (rc == CTXS_ENOTFOUND)
        rc = 0;

    if (rc == 0)
        rc = blocks_read(&job); /* pass 1: nothing touched */
    ctxs_session *s = NULL;
    if (rc == 0)
        rc = ctxs__store_session_create_filled(&s, st, name, len, &job.model, job.model_name,
                                               job.items, job.meta_count, import_fill, &job);
    ctxs_session_close(s);
    free(job.meta);
    free(job.items);
    free(job.raw);
    free(job.comp);
    close(job.fd);
    if (rc < 0)
        return rc;
    if (name_out)
        memcpy(name_out, name, len + 1);
    if (pr.fn)
        pr.fn(pr.arg, 2 * job.size, 2 * job.size);
    return 0;
}
