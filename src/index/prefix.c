/*
 * Shared prefixes. At every CTXS_PREFIX_CHUNK committed tokens from the start
 * of a session, prefixes[model hash || chain hash] lists the session's id
 * (a sorted duplicate), and chunks[id || chunk] remembers the chain hash, so
 * that a session's entries can be found again to be dropped.
 *
 * Each session's entries cover chunks 1..k for some k, so "some session holds
 * the first c chunks" is monotone in c: a binary search over chunk counts
 * finds the longest one in O(log n) reads. Entries may lag behind the files
 * (they are written in batches) and may outlive a rollback or a ring wrap
 * until the next update, so every candidate is checked against its file's
 * token ids before it is returned: late, never wrong.
 *
 * A match is also cut to what an open of the file keeps, since the next
 * step is a fork at the match and a fork takes no more than its source
 * holds after the open. After a power loss the newest record may claim
 * tokens whose pages never reached the disk: an open drops them (its
 * recovery stops at the first token above the watermark that fails its
 * checksum), and until a writer's open writes that back, the record still
 * claims them. So a record of another boot has its matched tokens above
 * the watermark verified here, by the same rule (ctxs__peek_kept): a cost
 * of the matched tokens' KV, paid only until the session is next opened
 * read-write, and never more than the fork that follows reads.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "index.h"
#include "mdb_calls.h"
#include "session_iface.h"

/* Candidates checked at one chunk count before looking at shorter ones. */
#define MAX_CANDIDATES 8

void ctxs__prefix_chain_next(uint8_t out[16], const uint8_t prev[16], const uint32_t *ids,
                             uint32_t count)
{
    uint8_t buf[16 + CTXS_PREFIX_CHUNK * 4];
    memcpy(buf, prev, 16);
    memcpy(buf + 16, ids, (size_t)count * 4);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(buf, 16 + (size_t)count * 4));
    memcpy(out, c.digest, 16);
}

void ctxs__prefix_chains(uint8_t (*chain)[16], const uint32_t *ids, uint64_t n_chunks)
{
    static const uint8_t zero[16];
    for (uint64_t k = 0; k < n_chunks; k++)
        ctxs__prefix_chain_next(chain[k], k ? chain[k - 1] : zero, ids + k * CTXS_PREFIX_CHUNK,
                                CTXS_PREFIX_CHUNK);
}

static void chunk_key(uint8_t out[12], uint64_t id, uint32_t chunk)
{
    ctxs__id_key(out, id);
    for (int i = 0; i < 4; i++)
        out[8 + i] = (uint8_t)(chunk >> (24 - 8 * i));
}

static void prefix_key(uint8_t out[32], const uint8_t model_hash[CTXS_HASH_BYTES], const uint8_t chain[16])
{
    memcpy(out, model_hash, 16);
    memcpy(out + 16, chain, 16);
}

/* Drops session id's chunks from number `from` (1-based) on, and their
 * prefix entries. */
static int drop_from(MDB_txn *txn, ctxs_store *st, uint64_t id,
                     const uint8_t model_hash[CTXS_HASH_BYTES], uint32_t from)
{
    MDB_cursor *cur;
    int rc = ctxs__mdb_cursor_open(txn, st->chunks, &cur);
    if (rc != 0)
        return ctxs__mdb_error(rc);
    uint8_t start[12];
    chunk_key(start, id, from);
    MDB_val key = {sizeof(start), start}, val;
    for (rc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE); rc == 0;
         rc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
        if (key.mv_size != 12 || ctxs__id_from_key(key.mv_data) != id)
            break;
        if (val.mv_size == 16) {
            uint8_t pk[32], idk[8];
            prefix_key(pk, model_hash, val.mv_data);
            ctxs__id_key(idk, id);
            MDB_val pkey = {32, pk}, pval = {8, idk};
            int r = ctxs__mdb_del(txn, st->prefixes, &pkey, &pval);
            if (r != 0 && r != MDB_NOTFOUND) {
                rc = r;
                break;
            }
        }
        if ((rc = ctxs__mdb_cursor_del(cur, 0)) != 0)
            break;
    }
    mdb_cursor_close(cur);
    return rc == MDB_NOTFOUND ? 0 : ctxs__mdb_error(rc);
}

int ctxs__prefix_drop(MDB_txn *txn, ctxs_store *st, uint64_t id, const uint8_t model_hash[CTXS_HASH_BYTES])
{
    return drop_from(txn, st, id, model_hash, 1);
}

/* The number of leading chunks whose stored chain equals chain[]. */
static int common_chunks(MDB_txn *txn, ctxs_store *st, uint64_t id,
                         const uint8_t (*chain)[16], uint64_t n_chunks, uint64_t *out)
{
    MDB_cursor *cur;
    int rc = ctxs__mdb_cursor_open(txn, st->chunks, &cur);
    if (rc != 0)
        return ctxs__mdb_error(rc);
    uint8_t start[12];
    chunk_key(start, id, 1);
    MDB_val key = {sizeof(start), start}, val;
    uint64_t k = 0;
    for (rc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE); rc == 0 && k < n_chunks;
         rc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
        if (key.mv_size != 12 || ctxs__id_from_key(key.mv_data) != id)
            break;
        uint8_t expect[12];
        chunk_key(expect, id, (uint32_t)(k + 1));
        if (memcmp(key.mv_data, expect, 12) != 0 || val.mv_size != 16 ||
            memcmp(val.mv_data, chain[k], 16) != 0)
            break;
        k++;
    }
    mdb_cursor_close(cur);
    *out = k;
    return rc == 0 || rc == MDB_NOTFOUND ? 0 : ctxs__mdb_error(rc);
}

int ctxs__prefix_update(MDB_txn *txn, ctxs_store *st, uint64_t id,
                        ctxs__session_rec *rec, const uint32_t *ids, uint64_t n_held)
{
    uint64_t n_chunks = n_held / CTXS_PREFIX_CHUNK;
    if (n_chunks > UINT32_MAX)
        n_chunks = UINT32_MAX;
    uint8_t (*chain)[16] = NULL;
    if (n_chunks && !(chain = ctxs__malloc(n_chunks * 16)))
        return CTXS_ENOMEM;
    ctxs__prefix_chains(chain, ids, n_chunks);

    /* Usually the stored entries are a prefix of the new ones: the record's
     * chain says so without reading them. */
    uint64_t old_chunks = rec->prefix_tokens / CTXS_PREFIX_CHUNK, common = 0;
    int rc = 0;
    if (old_chunks <= n_chunks &&
        (old_chunks == 0 || memcmp(chain[old_chunks - 1], rec->prefix_chain, 16) == 0))
        common = old_chunks;
    else
        rc = common_chunks(txn, st, id, (const uint8_t (*)[16])chain, n_chunks, &common);
    if (rc == 0 && common < old_chunks)
        rc = drop_from(txn, st, id, rec->model_hash, (uint32_t)common + 1);
    uint8_t idk[8];
    ctxs__id_key(idk, id);
    for (uint64_t k = common; rc == 0 && k < n_chunks; k++) {
        uint8_t ck[12], pk[32];
        chunk_key(ck, id, (uint32_t)(k + 1));
        prefix_key(pk, rec->model_hash, chain[k]);
        MDB_val ckey = {12, ck}, cval = {16, chain[k]};
        MDB_val pkey = {32, pk}, pval = {8, idk};
        if ((rc = ctxs__mdb_put(txn, st->chunks, &ckey, &cval, 0)) == 0) {
            rc = ctxs__mdb_put(txn, st->prefixes, &pkey, &pval, MDB_NODUPDATA);
            if (rc == MDB_KEYEXIST)
                rc = 0;
        }
        rc = ctxs__mdb_error(rc);
    }
    if (rc == 0) {
        rec->prefix_tokens = n_chunks * CTXS_PREFIX_CHUNK;
        if (n_chunks)
            memcpy(rec->prefix_chain, chain[n_chunks - 1], 16);
        else
            memset(rec->prefix_chain, 0, 16);
    }
    free(chain);
    return rc;
}

/* --- Lookup ------------------------------------------------------------- */

static int has_chunks(MDB_txn *txn, ctxs_store *st, const uint8_t model_hash[CTXS_HASH_BYTES],
                      const uint8_t chain[16])
{
    uint8_t pk[32];
    prefix_key(pk, model_hash, chain);
    MDB_val key = {32, pk}, val;
    return mdb_get(txn, st->prefixes, &key, &val) == 0;
}

/* Candidates already checked during one lookup, so that a session met again
 * at a shorter chunk count is not read (nor verified) again. */
#define MEMO_MAX 64
typedef struct memo {
    size_t n;
    struct { uint64_t id, got; } at[MEMO_MAX];
} memo;

/* How many leading tokens of tokens[0..n) the file of id holds and an open
 * of it would keep (it should be at least the `whole` its entry claims,
 * unless the entry is stale or the file lost pages). */
static uint64_t check_candidate(ctxs_store *st, uint64_t id, const uint8_t model_hash[CTXS_HASH_BYTES],
                                const uint32_t *tokens, uint64_t n, memo *m)
{
    for (size_t i = 0; i < m->n; i++)
        if (m->at[i].id == id)
            return m->at[i].got;
    char name[32];
    ctxs__file_name(name, id);
    int fd = ctxs__openat(st->sessions_fd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return 0;
    uint64_t matched = 0;
    ctxs__peek p;
    uint32_t *ids = NULL;
    if (ctxs__peek_fd(&p, fd) == 0 && memcmp(p.model.model_hash, model_hash, 16) == 0) {
        uint64_t held = ctxs__peek_prefix_held(&p);
        uint64_t len = held < n ? held : n;
        if ((ids = ctxs__malloc(len ? len * 4 : 1)) && ctxs__peek_tokens(ids, fd, &p, 0, len) == 0)
            while (matched < len && ids[matched] == tokens[matched])
                matched++;
        if (matched && ctxs__peek_kept(&matched, fd, &p, matched) < 0)
            matched = 0;
    }
    free(ids);
    close(fd);
    if (m->n < MEMO_MAX)
        m->at[m->n].id = id, m->at[m->n++].got = matched;
    return matched;
}

/* The best match among the sessions listed for the first `whole` tokens;
 * 0 when none of them holds those tokens any more. */
static int best_at(MDB_txn *txn, ctxs_store *st, const uint8_t model_hash[CTXS_HASH_BYTES],
                   const uint8_t chain[16], const uint32_t *tokens, uint64_t n,
                   uint64_t whole, ctxs_prefix_match *out, memo *m)
{
    MDB_cursor *cur;
    if (ctxs__mdb_cursor_open(txn, st->prefixes, &cur) != 0)
        return 0;
    uint8_t pk[32];
    prefix_key(pk, model_hash, chain);
    MDB_val key = {32, pk}, val;
    uint64_t best = 0;
    int tried = 0;
    for (int rc = mdb_cursor_get(cur, &key, &val, MDB_SET_KEY);
         rc == 0 && tried < MAX_CANDIDATES && best < n;
         rc = mdb_cursor_get(cur, &key, &val, MDB_NEXT_DUP), tried++) {
        if (val.mv_size != 8)
            continue;
        uint64_t id = ctxs__id_from_key(val.mv_data);
        /* The id must still name a session: a deleted one's file may be
         * about to go. */
        uint8_t idk[8];
        ctxs__id_key(idk, id);
        MDB_val ikey = {8, idk}, name;
        if (mdb_get(txn, st->ids, &ikey, &name) != 0 || name.mv_size > CTXS_NAME_MAX)
            continue;
        uint64_t got = check_candidate(st, id, model_hash, tokens, n, m);
        if (got >= whole && got > best) {
            best = got;
            memcpy(out->session, name.mv_data, name.mv_size);
            out->session[name.mv_size] = '\0';
            out->n_tokens = got;
        }
    }
    mdb_cursor_close(cur);
    return best > 0;
}

int ctxs_prefix_find(ctxs_prefix_match *out, ctxs_store *st, const uint8_t model_hash[CTXS_HASH_BYTES],
                     const uint32_t *tokens, uint64_t n)
{
    ctxs__error_begin();
    if (!out)
        return CTXS_EINVAL;
    memset(out, 0, sizeof(*out));
    if (!st || !model_hash || (!tokens && n))
        return CTXS_EINVAL;
    uint64_t n_chunks = n / CTXS_PREFIX_CHUNK;
    if (n_chunks == 0)
        return CTXS_ENOTFOUND;
    if (n_chunks > SIZE_MAX / 16)
        return CTXS_ENOMEM;
    uint8_t (*chain)[16] = ctxs__malloc(n_chunks * 16);
    if (!chain)
        return CTXS_ENOMEM;
    ctxs__prefix_chains(chain, tokens, n_chunks);

    MDB_txn *txn;
    int rc = ctxs__txn_begin(&txn, st, 1);
    if (rc < 0) {
        free(chain);
        return rc;
    }
    /* Largest k in [1, n_chunks] with an entry: lo has one (or is 0). */
    uint64_t lo = 0, hi = n_chunks;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo + 1) / 2;
        if (has_chunks(txn, st, model_hash, chain[mid - 1]))
            lo = mid;
        else
            hi = mid - 1;
    }
    /* Entries that outlived a rollback or a wrap fail their check; a shorter
     * prefix may still be held, by them or by sessions listed only there.
     * Stale entries live until their session's next index update, so this
     * walk is short and rare. */
    rc = CTXS_ENOTFOUND;
    memo m = {0};
    for (uint64_t k = lo; k > 0; k--)
        if (best_at(txn, st, model_hash, chain[k - 1], tokens, n,
                    k * CTXS_PREFIX_CHUNK, out, &m)) {
            rc = 0;
            break;
        }
    mdb_txn_abort(txn);
    free(chain);
    return rc;
}
