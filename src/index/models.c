/*
 * Models: registered once under their model hash; and the hashes of
 * weights and tokenizer files, cached so that a multi-gigabyte file is
 * read once, and of a tokenizer's strings.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "index.h"
#include "mdb_calls.h"
#include "platform.h"

int ctxs__model_geometry_valid(const ctxs_geometry *g)
{
    ctxs__file_layout lay;
    return ctxs__layout_compute(&lay, g, 2, 0, 0) == 0;
}

/* A decoded models value: the record and the geometry it gives. */
typedef struct model_row {
    ctxs__model_rec rec;
    ctxs_geometry geometry;
} model_row;

/* The registered model r stands for (hash is its key). */
static ctxs_model row_model(const model_row *r, const uint8_t hash[CTXS_HASH_BYTES])
{
    ctxs_model m;
    memset(&m, 0, sizeof(m));
    m.geometry = r->geometry;
    memcpy(m.model_hash, hash, 16);
    memcpy(m.tokenizer_hash, r->rec.tokenizer_hash, 16);
    return m;
}

static int same_model(const model_row *r, const ctxs_model *m)
{
    const ctxs_geometry *a = &r->geometry, *b = &m->geometry;
    return a->n_layers == b->n_layers && a->n_kv_heads == b->n_kv_heads &&
           a->head_dim == b->head_dim && a->dtype == b->dtype && a->period == b->period &&
           memcmp(a->window, b->window, sizeof(a->window)) == 0 &&
           memcmp(r->rec.tokenizer_hash, m->tokenizer_hash, 16) == 0;
}

int ctxs__model_decode(const void *val, size_t len, ctxs__model_rec *rec, ctxs_geometry *g,
                       const char **name)
{
    if (len < sizeof(*rec))
        return CTXS_EINDEX;
    memcpy(rec, val, sizeof(*rec));
    size_t sched = (rec->flags & CTXS__MODEL_SCHEDULE) ? CTXS__MODEL_SCHEDULE_BYTES : 0;
    if (rec->name_len > CTXS_NAME_MAX || (rec->flags & ~CTXS__MODEL_SCHEDULE) ||
        len != sizeof(*rec) + rec->name_len + sched)
        return CTXS_EINDEX;
    memset(g, 0, sizeof(*g));
    *g = (ctxs_geometry){rec->n_layers, rec->n_kv_heads, rec->head_dim, rec->dtype, 0, {0}};
    if (sched) {
        const uint8_t *at = (const uint8_t *)val + sizeof(*rec) + rec->name_len;
        memcpy(&g->period, at, 4);
        memcpy(g->window, at + 4, sizeof(g->window));
        if (ctxs__schedule_check(g) < 0 || !g->period)
            return CTXS_EINDEX;
    }
    if (name)
        *name = (const char *)val + sizeof(*rec);
    return 0;
}

/* Reads models[hash] into *row; *name points into the transaction's
 * pages. */
static int model_read(MDB_txn *txn, ctxs_store *st, const uint8_t hash[CTXS_HASH_BYTES],
                      model_row *row, const char **name)
{
    MDB_val key = {16, (void *)hash}, val;
    int rc = mdb_get(txn, st->models, &key, &val);
    if (rc != 0)
        return ctxs__mdb_error(rc);
    return ctxs__model_decode(val.mv_data, val.mv_size, &row->rec, &row->geometry, name);
}

static int model_write(MDB_txn *txn, ctxs_store *st, const ctxs_model *model,
                       const char *name, size_t name_len, uint64_t registered)
{
    uint8_t buf[sizeof(ctxs__model_rec) + CTXS_NAME_MAX + CTXS__MODEL_SCHEDULE_BYTES];
    ctxs__model_rec rec;
    const ctxs_geometry *g = &model->geometry;
    memset(&rec, 0, sizeof(rec));
    rec.n_layers = g->n_layers;
    rec.n_kv_heads = g->n_kv_heads;
    rec.head_dim = g->head_dim;
    rec.dtype = g->dtype;
    memcpy(rec.tokenizer_hash, model->tokenizer_hash, 16);
    rec.registered_unix_ms = registered;
    rec.name_len = (uint16_t)name_len;
    rec.flags = g->period ? CTXS__MODEL_SCHEDULE : 0;
    memcpy(buf, &rec, sizeof(rec));
    memcpy(buf + sizeof(rec), name, name_len);
    size_t len = sizeof(rec) + name_len;
    if (g->period) {
        int rc = ctxs__index_format_raise(txn, st);
        if (rc < 0)
            return rc;
        memcpy(buf + len, &g->period, 4);
        memcpy(buf + len + 4, g->window, sizeof(g->window));
        len += CTXS__MODEL_SCHEDULE_BYTES;
    }
    MDB_val key = {16, (void *)model->model_hash}, val = {len, buf};
    return ctxs__mdb_error(ctxs__mdb_put(txn, st->models, &key, &val, 0));
}

static void hash_prefix(char out[17], const uint8_t hash[CTXS_HASH_BYTES])
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < 8; i++) {
        out[2 * i] = hex[hash[i] >> 4];
        out[2 * i + 1] = hex[hash[i] & 15];
    }
    out[16] = '\0';
}

int ctxs__model_differs(const ctxs_model *known, const ctxs_model *model)
{
    char diff[160], h[17];
    ctxs__model_diff(diff, sizeof(diff), model, known);
    hash_prefix(h, known->model_hash);
    return ctxs__error(CTXS_EMODEL, "the store registered model %s... with another shape: %s "
                       "(here: the model given; there: the registered one)", h, diff);
}

static int model_differs_row(const model_row *r, const ctxs_model *model)
{
    ctxs_model known = row_model(r, model->model_hash);
    return ctxs__model_differs(&known, model);
}

int ctxs__model_check(MDB_txn *txn, ctxs_store *st, const ctxs_model *model)
{
    model_row rec;
    int rc = model_read(txn, st, model->model_hash, &rec, NULL);
    if (rc == CTXS_ENOTFOUND) {
        char h[17];
        hash_prefix(h, model->model_hash);
        return ctxs__error(CTXS_ENOMODEL, "model %s... is not registered in this store: "
                           "register it first (ctxs_model_register(), `ctxstore models "
                           "register`)", h);
    }
    if (rc < 0)
        return rc;
    return same_model(&rec, model) ? 0 : model_differs_row(&rec, model);
}

int ctxs__model_ensure(MDB_txn *txn, ctxs_store *st, const ctxs_model *model)
{
    int rc = ctxs__model_check(txn, st, model);
    if (rc == CTXS_ENOMODEL)
        rc = model_write(txn, st, model, "", 0, ctxs__now_ms());
    return rc;
}

int ctxs_model_register(ctxs_store *st, const ctxs_model *model, const char *name)
{
    ctxs__error_begin();
    CTXS__STORE_CHECK(st);
    if (!model)
        return ctxs__error(CTXS_EINVAL, "model is NULL");
    if (!ctxs__model_geometry_valid(&model->geometry))
        return ctxs__error_more(CTXS_EINVAL, "the model's geometry");
    size_t name_len = 0;
    if (name && ctxs__name_check(name, &name_len) < 0)
        return CTXS_EINVAL;
    MDB_txn *txn;
    int rc = ctxs__txn_begin(&txn, st, 0);
    if (rc < 0)
        return rc;
    model_row rec;
    uint64_t registered = ctxs__now_ms();
    rc = model_read(txn, st, model->model_hash, &rec, NULL);
    if (rc == 0) {
        registered = rec.rec.registered_unix_ms;
        if (!same_model(&rec, model))
            rc = model_differs_row(&rec, model);
    } else if (rc == CTXS_ENOTFOUND) {
        rc = 0;
    }
    if (rc == 0)
        rc = model_write(txn, st, model, name ? name : "", name_len, registered);
    return ctxs__txn_finish(txn, rc);
}

static void entry_fill(ctxs_model_entry *out, const uint8_t hash[CTXS_HASH_BYTES],
                       const model_row *row, const char *name)
{
    memset(out, 0, sizeof(*out));
    out->model.geometry = row->geometry;
    memcpy(out->model.model_hash, hash, 16);
    memcpy(out->model.tokenizer_hash, row->rec.tokenizer_hash, 16);
    memcpy(out->name, name, row->rec.name_len);
    out->registered_unix_ms = row->rec.registered_unix_ms;
}

int ctxs_model_get(ctxs_model_entry *out, ctxs_store *st, const uint8_t model_hash[CTXS_HASH_BYTES])
{
    ctxs__error_begin();
    if (!out || !st || !model_hash)
        return CTXS_EINVAL;
    MDB_txn *txn;
    int rc = ctxs__txn_begin(&txn, st, 1);
    if (rc < 0)
        return rc;
    model_row rec;
    memset(&rec, 0, sizeof(rec));
    const char *name = "";
    if ((rc = model_read(txn, st, model_hash, &rec, &name)) == 0)
        entry_fill(out, model_hash, &rec, name);
    mdb_txn_abort(txn);
    if (rc == CTXS_ENOTFOUND) {
        char h[17];
        hash_prefix(h, model_hash);
        return ctxs__error(rc, "model %s... is not registered in this store", h);
    }
    return rc;
}

static int model_entry_fill(void *entry, const MDB_val *key, const MDB_val *val)
{
    model_row rec;
    const char *name;
    if (key->mv_size != 16 ||
        ctxs__model_decode(val->mv_data, val->mv_size, &rec.rec, &rec.geometry, &name) < 0)
        return CTXS_EINDEX;
    entry_fill(entry, key->mv_data, &rec, name);
    return 0;
}

int ctxs_model_list(ctxs_model_entry **out, size_t *n_out, ctxs_store *st)
{
    ctxs__error_begin();
    if (!out || !n_out)
        return CTXS_EINVAL;
    *out = NULL;
    *n_out = 0;
    if (!st)
        return CTXS_EINVAL;
    return ctxs__list((void **)out, n_out, st, st->models, sizeof(**out), model_entry_fill);
}

static void digest(uint8_t out[CTXS_HASH_BYTES], XXH3_state_t *state)
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(state));
    memcpy(out, c.digest, 16);
}

static int hash_stream(uint8_t out[CTXS_HASH_BYTES], int fd, uint64_t seed)
{
    enum { CHUNK = 1 << 20 };
    uint8_t *buf = ctxs__malloc(CHUNK);
    XXH3_state_t *state = XXH3_createState();
    int rc = buf && state ? 0 : CTXS_ENOMEM;
    if (rc == 0)
        XXH3_128bits_reset_withSeed(state, seed);
#ifdef POSIX_FADV_SEQUENTIAL
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
    while (rc == 0) {
        ssize_t got = ctxs__read(fd, buf, CHUNK);
        if (got < 0) {
            rc = -errno;
            continue;
        }
        if (got == 0)
            break;
        XXH3_128bits_update(state, buf, (size_t)got);
    }
    if (rc == 0)
        digest(out, state);
    XXH3_freeState(state);
    free(buf);
    return rc;
}

static ctxs__filehash_key filehash_key(const struct stat *sb)
{
    ctxs__filehash_key k;
    memset(&k, 0, sizeof(k));
    k.dev = (uint64_t)sb->st_dev;
    k.ino = (uint64_t)sb->st_ino;
    k.size = (uint64_t)sb->st_size;
    k.mtime_sec = (int64_t)sb->st_mtim.tv_sec;
    k.mtime_nsec = (int64_t)sb->st_mtim.tv_nsec;
    return k;
}

/* The cache key of a file's state: a weights key, or a tokenizer key. */
typedef union cache_key {
    ctxs__filehash_key weights;
    ctxs__tokhash_key tokenizer;
} cache_key;

static size_t cache_key_make(cache_key *out, const struct stat *sb, int tokenizer)
{
    memset(out, 0, sizeof(*out));
    if (!tokenizer) {
        out->weights = filehash_key(sb);
        return sizeof(out->weights);
    }
    out->tokenizer.file = filehash_key(sb);
    memcpy(out->tokenizer.kind, CTXS__TOKHASH_KIND, 8);
    return sizeof(out->tokenizer);
}

static int cache_get(ctxs_store *st, const cache_key *k, size_t len, uint8_t out[CTXS_HASH_BYTES])
{
    MDB_txn *txn;
    int rc = ctxs__txn_begin(&txn, st, 1);
    if (rc < 0)
        return rc;
    MDB_val key = {len, (void *)k}, val;
    rc = ctxs__mdb_error(mdb_get(txn, st->filehash, &key, &val));
    if (rc == 0 && val.mv_size != 16)
        rc = CTXS_EINDEX;
    if (rc == 0)
        memcpy(out, val.mv_data, 16);
    mdb_txn_abort(txn);
    return rc;
}

static int cache_put(ctxs_store *st, const cache_key *k, size_t len,
                     const uint8_t hash[CTXS_HASH_BYTES])
{
    MDB_txn *txn;
    int rc = ctxs__txn_begin(&txn, st, 0);
    if (rc < 0)
        return rc;
    MDB_val key = {len, (void *)k}, val = {16, (void *)hash};
    return ctxs__txn_finish(txn, ctxs__mdb_error(ctxs__mdb_put(txn, st->filehash, &key, &val, 0)));
}

/* The hash of the file at path with seed, cached in st (may be NULL) under
 * the file's state and the kind of hash. */
static int hash_file(uint8_t out[CTXS_HASH_BYTES], ctxs_store *st, const char *path, int tokenizer)
{
    if (!out || !path)
        return CTXS_EINVAL;
    int fd = ctxs__open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return -errno;
    struct stat before, after;
    int rc = ctxs__fstat(fd, &before) == 0 ? 0 : -errno;
    if (rc == 0 && !S_ISREG(before.st_mode))
        rc = S_ISDIR(before.st_mode) ? -EISDIR : CTXS_EINVAL;
    cache_key k;
    size_t klen = cache_key_make(&k, &before, tokenizer);
    if (rc == 0 && st && cache_get(st, &k, klen, out) == 0) {
        close(fd);
        return 0;
    }
    if (rc == 0)
        rc = hash_stream(out, fd, tokenizer ? CTXS__TOKENIZER_FILE_SEED : 0);
    /* A file that changed while it was read has no single hash to cache. */
    if (rc == 0 && st && ctxs__fstat(fd, &after) == 0) {
        cache_key k2;
        cache_key_make(&k2, &after, tokenizer);
        if (memcmp(&k, &k2, klen) == 0)
            cache_put(st, &k, klen, out); /* a cache that cannot be written only costs time */
    }
    close(fd);
    return rc;
}

int ctxs_model_hash_file(uint8_t out[CTXS_HASH_BYTES], ctxs_store *st, const char *path)
{
    ctxs__error_begin();
    return hash_file(out, st, path, 0);
}

int ctxs_tokenizer_hash_file(uint8_t out[CTXS_HASH_BYTES], ctxs_store *st, const char *path)
{
    ctxs__error_begin();
    return hash_file(out, st, path, 1);
}

int ctxs_tokenizer_hash_strings(uint8_t out[CTXS_HASH_BYTES], const char *const *tokens,
                                const size_t *lengths, size_t n)
{
    ctxs__error_begin();
    if (!out || (!tokens && n))
        return CTXS_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (!tokens[i] && (!lengths || lengths[i]))
            return CTXS_EINVAL;
    XXH3_state_t *state = XXH3_createState();
    if (!state)
        return CTXS_ENOMEM;
    XXH3_128bits_reset_withSeed(state, CTXS__TOKENIZER_STRINGS_SEED);
    /* Each token as its length (u64, little-endian), then its bytes: no
     * two lists of strings give the same stream. */
    for (size_t i = 0; i < n; i++) {
        uint64_t len = lengths ? (uint64_t)lengths[i] : (uint64_t)strlen(tokens[i]);
        uint8_t le[8];
        for (int b = 0; b < 8; b++)
            le[b] = (uint8_t)(len >> (8 * b));
        XXH3_128bits_update(state, le, 8);
        if (len)
            XXH3_128bits_update(state, tokens[i], (size_t)len);
    }
    digest(out, state);
    XXH3_freeState(state);
    return 0;
}
