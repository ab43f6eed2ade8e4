/*
 * The store's index: an LMDB environment in <store>/index that knows
 * sessions by name, models, checkpoints and shared prefixes. The records
 * below are the values on disk (little-endian, the build refuses other
 * hosts); docs/FORMAT.md, "The index", is their prose version.
 *
 * Nothing outside src/index sees an MDB_* type or code.
 */
#ifndef CTXS_INDEX_H
#define CTXS_INDEX_H

#include <assert.h>
#include <dirent.h>
#include <stddef.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "ctxstore.h"
#include "last_error.h"
#include "session_iface.h"

/* CTXS_EREADONLY for a write through a read-only store, said so. */
int ctxs__store_readonly(void);

/* A NULL store handle is refused, said so. */
#define CTXS__STORE_CHECK(st) CTXS__REQUIRE(st, "the store handle is NULL")

#define CTXS__INDEX_MAGIC "CTXSINDX"
/* 2.0: model records with a layer schedule, which a 1.x build takes for
 * damage. New indexes are 2.0; a 1.x index stays 1.x until a model with a
 * schedule is written into it (ctxs__index_format_raise()). */
#define CTXS__INDEX_MAJOR 2
#define CTXS__INDEX_MINOR 0

/* Sessions whose first chunk completes are indexed at once; after that, every
 * this many new chunks (and at close). */
#define CTXS__PREFIX_FLUSH_CHUNKS 16u

/* meta["format"] */
typedef struct ctxs__index_format {
    char magic[8];          /* CTXS__INDEX_MAGIC */
    uint16_t major;         /* readers refuse a newer major */
    uint16_t minor;
    uint32_t reserved;
} ctxs__index_format;
static_assert(sizeof(ctxs__index_format) == 16, "index format record");

/* sessions[name] */
typedef struct ctxs__session_rec {
    uint64_t id;                /* file sessions/<016x id>.ctxs */
    uint8_t model_hash[16];
    uint64_t n_tokens;          /* at the last index update */
    uint64_t disk_bytes;        /* likewise */
    uint64_t created_unix_ms;
    uint64_t last_used_unix_ms;
    uint64_t parent_id;         /* forked from, or 0 */
    uint64_t fork_tokens;
    uint64_t prefix_tokens;     /* leading tokens whose chunks are indexed */
    uint8_t prefix_chain[16];   /* the chain hash at prefix_tokens */
} ctxs__session_rec;
static_assert(sizeof(ctxs__session_rec) == 96, "session record");
static_assert(offsetof(ctxs__session_rec, n_tokens) == 24, "session record");
static_assert(offsetof(ctxs__session_rec, prefix_chain) == 80, "session record");

/* models[model_hash]: this, then name_len bytes of display name, then
 * (2.0, flags bit 0) the layer schedule: u32 period, u32 window[8]. */
typedef struct ctxs__model_rec {
    uint32_t n_layers, n_kv_heads, head_dim, dtype;
    uint8_t tokenizer_hash[16];
    uint64_t registered_unix_ms;
    uint16_t name_len;
    uint8_t flags;              /* bit 0: a schedule follows the name */
    uint8_t reserved[5];
} ctxs__model_rec;
static_assert(sizeof(ctxs__model_rec) == 48, "model record");
#define CTXS__MODEL_SCHEDULE 0x1u
#define CTXS__MODEL_SCHEDULE_BYTES 36u

/* Raises a 1.x index's format record to 2.0 (within txn), before a model
 * record with a layer schedule is written into it, so that a 1.x build
 * refuses the index as newer (CTXS_EVERSION) rather than take the record
 * for damage. Returns 0 or a negative error. */
int ctxs__index_format_raise(MDB_txn *txn, ctxs_store *st);

/* Decodes a models value of len bytes: *rec, the geometry it gives (with
 * its schedule) in *g, and *name (into val). Returns 0 or CTXS_EINDEX. */
int ctxs__model_decode(const void *val, size_t len, ctxs__model_rec *rec, ctxs_geometry *g,
                       const char **name);

/* checkpoints[id BE || name] */
typedef struct ctxs__checkpoint_rec {
    uint64_t n_tokens;
    uint64_t last_sum;          /* checksum of position n_tokens - 1, or 0 */
    uint64_t created_unix_ms;
} ctxs__checkpoint_rec;
static_assert(sizeof(ctxs__checkpoint_rec) == 24, "checkpoint record");

/* filehash[key]: the cached XXH3-128 of a weights file (this key, 40
 * bytes), or of a tokenizer file (ctxs__tokhash_key, 48 bytes): the kinds
 * hash in different domains and never share a row. */
typedef struct ctxs__filehash_key {
    uint64_t dev, ino, size;
    int64_t mtime_sec, mtime_nsec;
} ctxs__filehash_key;
static_assert(sizeof(ctxs__filehash_key) == 40, "file hash key");

#define CTXS__TOKHASH_KIND "tokenizr"
typedef struct ctxs__tokhash_key {
    ctxs__filehash_key file;
    char kind[8];               /* CTXS__TOKHASH_KIND */
} ctxs__tokhash_key;
static_assert(sizeof(ctxs__tokhash_key) == 48, "tokenizer hash key");

/* XXH3-128 seeds: weights files hash with 0 (the plain XXH3-128 of the
 * file, which apps may compute themselves); a tokenizer, from its file or
 * its strings, with seeds of its own, so that no file hashes to the same
 * value as weights and as a tokenizer. */
#define CTXS__TOKENIZER_FILE_SEED 0x746f6b2d66696c65ull    /* "tok-file" */
#define CTXS__TOKENIZER_STRINGS_SEED 0x746f6b2d73747273ull /* "tok-strs" */

/* metadata[id BE || key]: the value's bytes (index 1.2). One entry, as
 * the code passes it around, points into its owner's memory: */
typedef struct ctxs__meta_item {
    const char *key;            /* key_len bytes, a valid name */
    size_t key_len;
    const void *value;
    size_t value_bytes;
} ctxs__meta_item;

/* pins[id BE]: an empty value; the session is pinned (index 1.2). */

/* pending[id BE]: a file being created or deleted (ctxs__intent). */
enum ctxs__intent { CTXS__INTENT_CREATE = 'C', CTXS__INTENT_DELETE = 'D' };

/* What a read-write session opened through a store tells its hooks. */
enum ctxs__store_event {
    CTXS__EVENT_COMMIT,             /* a commit succeeded */
    CTXS__EVENT_CLOSE_CHANGED,      /* closing, after commits */
    CTXS__EVENT_CLOSE_UNCHANGED,    /* closing, no commit since the open */
};

/* What one subscriber hears of a store: the index calls these without
 * knowing who listens. A NULL member hears nothing. */
typedef struct ctxs__store_hooks {
    /* Session id holds n_held leading tokens, at event (an enum
     * ctxs__store_event). *told is the handle's count of the whole chunks
     * the hook was told of since the open: 0 at first, set by the hook,
     * and lowered by the index to the chunks a rollback left whole (the
     * chunks after it will hold other tokens). Called under the hooks'
     * lock, on the committing thread: it must not wait for anything slow. */
    void (*session)(void *arg, uint64_t id, uint64_t n_held, int event, uint64_t *told);
    /* Session name is not in the store: 0 when the store now has it
     * (brought in here, or by another thread meanwhile), else
     * CTXS_ENOTFOUND. Called without the lock; a detach waits for it. */
    int (*missing)(void *arg, const char *name);
} ctxs__store_hooks;

struct ctxs_store {
    MDB_env *env;
    MDB_dbi meta, sessions, ids, models, filehash, checkpoints, prefixes,
        chunks, pending;
    MDB_dbi metadata;           /* index 1.2 */
    MDB_dbi pins;               /* 0 in a read-only handle to an index from
                                   before 1.2, which has no such table */
    int rdonly;                 /* CTXS_RDONLY: every write refused */
    struct ctxs_store *owner;   /* a read-only handle sharing the environment
                                   of owner, which this process has open
                                   read-write (ctxs_store_open()); NULL */
    char *dir;                  /* absolute */
    char *sessions_dir;         /* absolute */
    int sessions_fd;            /* O_DIRECTORY */
    dev_t dev;                  /* of the store directory: one handle per */
    ino_t ino;                  /* store per process (LMDB's rule) */
    int refs;                   /* ctxs_store_open()s plus open sessions */
    int lock_fd;                /* index/store.lock, read-locked while env
                                   is open (store.c, "The store lock") */
    const ctxs__store_hooks *hooks; /* hooks.c: what subscribed, or NULL;
                                   written under the hooks' lock with
                                   atomic stores, read under it or with
                                   an atomic load (ctxs__store_hooks_session()) */
    void *hooks_arg;            /* passed to them */
    int hooks_users;            /* missing() calls under way (hooks' lock) */
    struct ctxs_store *next;
};

/* --- store.c ---------------------------------------------------------- */

/* The named tables of the index, as every handle opens them: the name,
 * where ctxs_store keeps the handle, the flags the table persists, and
 * for a table of fixed-size duplicates (MDB_DUPFIXED) the size of each;
 * the page walk (check_file_pages.c) holds a file to the same. */
typedef struct ctxs__table {
    const char *name;
    size_t offset;
    unsigned flags;
    uint32_t dup_bytes;
} ctxs__table;
extern const ctxs__table ctxs__tables[];
extern const size_t ctxs__n_tables;

/* Translates an LMDB or errno code to a ctxstore code. */
int ctxs__mdb_error(int rc);

/* --- check_file.c ----------------------------------------------------- */

/* Whether the files of index_dir that exist (data.mdb, lock.mdb,
 * store.lock) are regular files, looked at without following a link:
 * 0, CTXS_EINDEX (one is a FIFO, socket, device, directory or symbolic
 * link), CTXS_ENOMEM, -errno. A missing index_dir is 0. */
int ctxs__index_dir_check(const char *index_dir);

/* Opens path, a file of index/, with flags | O_CLOEXEC | O_NOFOLLOW |
 * O_NONBLOCK (mode 0600 where flags create it), and checks that it is a
 * regular file. The descriptor, or CTXS_EINDEX (not a regular file: a
 * symbolic link, a FIFO, ...), -errno. */
int ctxs__index_file_open(const char *path, int flags);

/* Checks the index's data file at data_path before LMDB maps it: both
 * meta pages, that the file holds every page the meta LMDB will use
 * claims, and every page of the trees that meta reaches
 * (ctxs__index_pages_check()); damage found while other processes commit
 * counts only if the metas held still meanwhile. 0 for a file LMDB may
 * open (a missing one too, and an empty one if empty_ok: a store whose
 * creation died before LMDB wrote it), CTXS_EINDEX (a damaged index: cut
 * short, a meta page lost, a page garbled; or not a regular file),
 * CTXS_EFOREIGN (nothing of
 * LMDB's in it), CTXS_EVERSION (another LMDB data version), CTXS_ENOMEM,
 * -errno. */
int ctxs__index_file_check(const char *data_path, int empty_ok);

/* --- check_file_pages.c ----------------------------------------------- */

/* Walks, by pread() on fd, the free tree and the main tree of meta (the
 * one LMDB will use; lmdb_layout.h) and every named tree and tree of
 * duplicates below them, checking every page they reach against what
 * LMDB's reads and writes of it assume, within the pages 0 to
 * meta->last_pg, which the caller knows the file holds; then the free
 * lists against the pages the trees reached. 0, CTXS_EINDEX (a page or
 * record LMDB would read out of bounds, a cycle, a page reached twice, a
 * flag or size a writer would act on wrongly, a free page in use),
 * CTXS_ENOMEM, -errno. */
struct lmdb_meta;
int ctxs__index_pages_check(int fd, const struct lmdb_meta *meta);

/* Copies the data file at data_path to copy_path in a form LMDB can open
 * read-only, for salvage: a lost meta page replaced by the other, a file
 * cut short extended with zeros to the pages its meta claims, unreadable
 * blocks as zeros. *mapsize gets the copy's size, *metas the number of
 * meta pages that were intact (1 or 2). Errors: CTXS_EINDEX (no
 * usable meta page: LMDB can read nothing of it), CTXS_EFULL, -errno. */
int ctxs__index_salvage_copy(const char *data_path, const char *copy_path, uint64_t *mapsize,
                             uint32_t *metas);

/* Opens the sessions directory for reading (closedir() it).
 * Errors: -errno. */
int ctxs__sessions_dir_open(DIR **out, ctxs_store *st);

/* Copies the fixed-size record under key in dbi into out. Errors:
 * CTXS_ENOTFOUND, CTXS_EINDEX (a value of another size), as
 * ctxs__mdb_error(). */
int ctxs__record_get(void *out, size_t size, MDB_txn *txn, MDB_dbi dbi, MDB_val *key);

/* Transactions with the codes translated. A write transaction is committed
 * durably (two fdatasyncs of the index). */
int ctxs__txn_begin(MDB_txn **out, ctxs_store *st, int readonly);
int ctxs__txn_commit(MDB_txn *txn);
/* Commits txn if rc is 0, else aborts it. Returns rc or the commit's. */
int ctxs__txn_finish(MDB_txn *txn, int rc);

/* Every entry of dbi, in key order, as an array of n_out entries of
 * entry_size bytes (calloc'd, NULL when empty) that fill() makes from each
 * key and value; fill returns 0 or CTXS_EINDEX. */
typedef int (*ctxs__entry_fill)(void *entry, const MDB_val *key, const MDB_val *val);
int ctxs__list(void **out, size_t *n_out, ctxs_store *st, MDB_dbi dbi, size_t entry_size,
               ctxs__entry_fill fill);

/* The start of a public list call: out and n_out checked, *out = NULL and
 * *n_out = 0, st checked, then a read transaction begun into *txn.
 * Errors: CTXS_EINVAL, those of ctxs__txn_begin(). */
int ctxs__list_begin(MDB_txn **txn, void **out, size_t *n_out, ctxs_store *st);

/* The end of a list call: *out and *n_out get list and its n entries when
 * rc is 0; otherwise list is freed. Returns rc. */
int ctxs__list_out(void **out, size_t *n_out, void *list, size_t n, int rc);

/* The store lock taken for a repair of the index (repair_index.c), which
 * works on the directory because a damaged index cannot be opened: opens
 * <index_dir>/store.lock and takes it exclusively without waiting, after
 * making sure this process has no handle to the store at dir_sb. *fd gets
 * the lock's descriptor. Errors: CTXS_EBUSY (a process has the store
 * open), -errno. ctxs__store_lock_share() turns it into the shared lock a
 * store handle holds, so that the repair can open the store itself while
 * compactions stay out; close(*fd) drops it. */
int ctxs__store_lock_exclusive(int *fd, const char *index_dir, const struct stat *dir_sb);
void ctxs__store_lock_share(int fd);

/* Takes or drops a reference on st (open sessions hold one). */
void ctxs__store_ref(ctxs_store *st);
void ctxs__store_unref(ctxs_store *st);

/* "<016x id>.ctxs" into buf[32]; and the absolute path, malloc'd. */
void ctxs__file_name(char buf[32], uint64_t id);
char *ctxs__file_path(const ctxs_store *st, uint64_t id);

/* 1 when name is a session file's name as ctxs__file_name() writes it
 * ("<16 lowercase hex digits>.ctxs"), its id in *id; else 0. */
int ctxs__file_name_id(const char *name, uint64_t *id);

/* An id key: big-endian, so that keys sort by id. */
void ctxs__id_key(uint8_t out[8], uint64_t id);
uint64_t ctxs__id_from_key(const void *key);

/* Rewrites the index compacted (mdb_env_copyfd2 with MDB_CP_COMPACT, then
 * renamed over data.mdb) and reopens st's environment on it, when nothing
 * else uses it: no other process has the store open, and st is this
 * process's only handle to it, with no session open through it. The
 * calling thread must be the only one using st meanwhile. *bytes_before
 * and *bytes_after get data.mdb's disk space (equal when nothing was
 * done). Errors: CTXS_EBUSY (the store is in use: the index is left as it
 * was), -errno; CTXS_EFAILED when the environment could not be reopened
 * after the swap (st is then unusable). */
int ctxs__index_compact(ctxs_store *st, uint64_t *bytes_before, uint64_t *bytes_after);

/* --- pins.c ------------------------------------------------------------ */

/* Sets the pinned field of the n entries from the pins table, in txn. */
int ctxs__pins_fill(ctxs_session_entry *entries, size_t n, MDB_txn *txn, ctxs_store *st);

/* Removes the pin of session id, if it has one, in txn. */
int ctxs__pin_drop(MDB_txn *txn, ctxs_store *st, uint64_t id);

/* --- names.c ---------------------------------------------------------- */

/* Checks a user-given name: UTF-8, 1..255 bytes, no control character, no
 * '/', no "..". Sets *len. Returns 0 or CTXS_EINVAL, saying why. */
int ctxs__name_check(const char *name, size_t *len);

/* A name as a message shows it: control characters as '?', cut after 64
 * bytes with "...". */
void ctxs__name_shown(char out[80], const char *name);

/* CTXS_ENOTFOUND: no session named name in the store, said so. */
int ctxs__no_session(const char *name);

/* CTXS_ENOTFOUND: session has no checkpoint named name, said so. */
int ctxs__no_checkpoint(const char *session, const char *name);

/* CTXS_ETAKEN: a session named name exists already, said so. */
int ctxs__name_taken(const char *name);

/* A fixed name field of a file or value (CTXS_NAME_MAX + 1 bytes): len
 * bytes that make a valid name (none if may_be_empty), then zeros; copied
 * NUL-terminated into out[CTXS_NAME_MAX + 1]. Errors: CTXS_ECORRUPT. */
int ctxs__name_field(char *out, const char *field, uint16_t len, int may_be_empty);

/* --- sessions.c -------------------------------------------------------- */

/* Session ids run from 1 to CTXS__ID_MAX: 0 names no session (a parent id
 * of 0 is "none"), and the largest id plus one must not wrap. A file named
 * with an id outside that range is renumbered by repair and reindex. */
#define CTXS__ID_MAX ((uint64_t)INT64_MAX)

/* One above the largest id (up to CTXS__ID_MAX) that any row of the index
 * names: an entry, an intent, a checkpoint, metadata, a pin, a prefix
 * chunk. No id below it may be handed out: a row left by a deleted or
 * damaged session would attach itself to the new one. */
int ctxs__ids_floor(MDB_txn *txn, ctxs_store *st, uint64_t *out);

/* Makes meta["next_id"] at least at_least and above every id in use
 * (ctxs__ids_floor), repairing a value of 0, one past CTXS__ID_MAX, or
 * one at or below an id in use. Sets *out (may be NULL) to the value it
 * holds afterwards. Errors: CTXS_EFULL (no id left: an id at CTXS__ID_MAX
 * is in use), LMDB's, translated. */
int ctxs__next_id_repair(MDB_txn *txn, ctxs_store *st, uint64_t at_least, uint64_t *out);

/* Takes the next session id in txn: never 0, never one in use or whose
 * file exists in sessions/ (a stray file is skipped), and next_id moves
 * past it. Errors: as ctxs__next_id_repair. */
int ctxs__id_take(MDB_txn *txn, ctxs_store *st, uint64_t *out);

/* Reads sessions[name]. Errors: CTXS_ENOTFOUND, ... */
int ctxs__session_get(ctxs__session_rec *out, MDB_txn *txn, ctxs_store *st,
                      const char *name, size_t len);

/* Removes id's entries (name, id, checkpoints, metadata, chunks and their
 * prefixes) in txn. */
int ctxs__session_unindex(MDB_txn *txn, ctxs_store *st, uint64_t id);

/* The store a session handle was opened through, and its id there; NULL
 * for a handle opened without a store. */
ctxs_store *ctxs__session_store(const ctxs_session *s, uint64_t *id);

/* Deletes the file of id, whose entries txn-less callers already looked up:
 * takes the exclusive lock (CTXS_EBUSY when a handle has it), drops the
 * entries (if expect_name is set, only while it still names id), then the
 * file. With keep_pinned, a pinned session is left as it is and 1 is
 * returned. */
int ctxs__session_delete_id(ctxs_store *st, uint64_t id, const char *expect_name,
                            size_t expect_len, int keep_pinned);

/* Writes a whole new session file into fd, durably, with label in its
 * first page; returns 0 or an error. */
typedef int (*ctxs__label_fill_fn)(int fd, const ctxs__disk_label *label, void *arg);

/* Creates the session name (len bytes, checked) from a file that fill
 * writes aside, as a create does: the intent first, then the file, linked
 * into place and opened read-write, then model registered under
 * model_name (NULL or "": none) if the store does not know its hash, then
 * the index entries with the n_meta entries of meta as its metadata
 * (within the limits: the caller checked). The session appears complete or
 * not at all.
 * Errors: -EEXIST, CTXS_EMODEL (the hash is registered with another
 * geometry or tokenizer), fill's errors, those of ctxs__create_file().
 * *out is set on success only. */
int ctxs__store_session_create_filled(ctxs_session **out, ctxs_store *st, const char *name,
                                      size_t len, const ctxs_model *model,
                                      const char *model_name, const ctxs__meta_item *meta,
                                      size_t n_meta, ctxs__label_fill_fn fill, void *arg);

/* Removes name, a file written aside for id ("<id>.ctxs.tmp-<pid>-<n>")
 * that a create left, unless that create may be under way: it holds the
 * file's lock, or its process is alive (this one: it is creating id now).
 * Returns 1 (removed), 0 (gone already, or could not be removed),
 * CTXS_EBUSY (a create holds it), or another error from its lock. */
int ctxs__aside_remove(ctxs_store *st, uint64_t id, const char *name);

/* Finishes or undoes the creates and deletes that crashed processes left
 * (the pending table), those still under way left for later: what a
 * read-write open of the store does before it returns. 0 or an error. */
int ctxs__intents_resolve(ctxs_store *st);

/* The name of session id (into name[CTXS_NAME_MAX + 1]), in a read
 * transaction of its own. Errors: CTXS_ENOTFOUND, CTXS_EINDEX, LMDB's. */
int ctxs__session_name_of(char *name, ctxs_store *st, uint64_t id);

/* --- models.c --------------------------------------------------------- */

/* Checks that model is registered with the same geometry and tokenizer.
 * Errors: CTXS_ENOMODEL, CTXS_EMODEL (each said why). */
int ctxs__model_check(MDB_txn *txn, ctxs_store *st, const ctxs_model *model);

/* CTXS_EMODEL for model, whose hash the store registered as known (its
 * model_hash the same) with another geometry or tokenizer, saying how they
 * differ. */
int ctxs__model_differs(const ctxs_model *known, const ctxs_model *model);

/* Whether g is a geometry a session file can have. */
int ctxs__model_geometry_valid(const ctxs_geometry *g);

/* Registers model if it is not (no display name). */
int ctxs__model_ensure(MDB_txn *txn, ctxs_store *st, const ctxs_model *model);

/* --- checkpoints.c ---------------------------------------------------- */

/* Reads checkpoints[id || name]. Errors: CTXS_ENOTFOUND, ... */
int ctxs__checkpoint_get(ctxs__checkpoint_rec *out, MDB_txn *txn, ctxs_store *st,
                         uint64_t id, const char *name, size_t len);

/* Whether s still holds the checkpoint's tokens: 0, CTXS_EEVICTED (the ring
 * overwrote them) or CTXS_ESTALE (rolled back past it, or written again). */
int ctxs__checkpoint_check(const ctxs_session *s, const ctxs__checkpoint_rec *cp);

/* --- metadata.c ------------------------------------------------------- */

/* Removes every metadata row of session id. */
int ctxs__meta_drop(MDB_txn *txn, ctxs_store *st, uint64_t id);

/* Writes the n items as session id's metadata (no rows before), checked by
 * the caller against the limits. */
int ctxs__meta_put_all(MDB_txn *txn, ctxs_store *st, uint64_t id, const ctxs__meta_item *items,
                       size_t n);

/* --- prefix.c --------------------------------------------------------- */

/* chain[k] = XXH3-128(chain[k-1] || token ids of chunk k), chain[-1] = 0:
 * writes the chains of the n_chunks whole chunks of ids. */
void ctxs__prefix_chains(uint8_t (*chain)[16], const uint32_t *ids,
                         uint64_t n_chunks);

/* One link of that chain: out = XXH3-128(prev || ids[0..count)), count at
 * most CTXS_PREFIX_CHUNK (fewer: the remote tier's tail chunks). */
void ctxs__prefix_chain_next(uint8_t out[16], const uint8_t prev[16], const uint32_t *ids,
                             uint32_t count);

/* Brings the prefix entries of session id (record rec, updated in place) in
 * line with its leading held token ids ids[0..n_held). */
int ctxs__prefix_update(MDB_txn *txn, ctxs_store *st, uint64_t id,
                        ctxs__session_rec *rec, const uint32_t *ids,
                        uint64_t n_held);

/* Removes every prefix entry of session id. */
int ctxs__prefix_drop(MDB_txn *txn, ctxs_store *st, uint64_t id,
                      const uint8_t model_hash[16]);

/* --- hooks.c ---------------------------------------------------------- */

/* Attaches hooks h (which outlive the attach) with arg to st: CTXS_EBUSY
 * when st has hooks already. */
int ctxs__store_hooks_attach(ctxs_store *st, const ctxs__store_hooks *h, void *arg);

/* Detaches h from st if attached, then waits until no missing() call is
 * under way: after it no hook of h runs, and its arg may be freed. */
void ctxs__store_hooks_detach(ctxs_store *st, const ctxs__store_hooks *h);

/* Tells st's hooks, if any, that session id holds n_held leading tokens
 * at event (ctxs__store_hooks.session). Takes no lock when st has none. */
void ctxs__store_hooks_session(ctxs_store *st, uint64_t id, uint64_t n_held, int event,
                               uint64_t *told);

/* Asks st's hooks, if any, to bring in the missing session name
 * (ctxs__store_hooks.missing): 0 when the store now has it, else
 * CTXS_ENOTFOUND. */
int ctxs__store_hooks_missing(ctxs_store *st, const char *name);

#endif
