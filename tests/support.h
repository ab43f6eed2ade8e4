/*
 * Shared helpers for the Criterion suites: scratch directories, a small model
 * and deterministic K/V contents that tell every (position, token) apart.
 */
#ifndef CTXS_TESTS_SUPPORT_H
#define CTXS_TESTS_SUPPORT_H

#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

#include "ctxstore.h"
#include "rng.h" /* ts_rng_next() */

/* A fresh directory under $TMPDIR (or /tmp), malloc'ed; ts_rmtree() removes
 * the directory and everything in it. */
char *ts_mkdtemp(void);
void ts_rmtree(const char *dir);

/* A scratch directory per test, for TestSuite(.init = ts_scratch_init,
 * .fini = ts_scratch_fini). */
extern char *ts_scratch;
void ts_scratch_init(void);
void ts_scratch_fini(void);

/* "dir/name" in a static buffer that rotates over 8 entries. */
const char *ts_path(const char *dir, const char *name);

/* Whether something is at path (lstat: a dangling link counts). */
int ts_exists(const char *path);

/* The store most tests use: "<ts_scratch>/store", in a static buffer. */
const char *ts_store_dir(void);

/* ctxs_store_open() of dir with default options; asserts that it opens. */
ctxs_store *ts_store_open(const char *dir);

/* The file of session id in ts_store_dir(), as ctxstore.h documents it
 * (sessions/<016x id>.ctxs), in a static buffer that rotates over 16
 * entries. */
const char *ts_id_path(uint64_t id);

/* ctxs_store_session_get() of name, asserting that it succeeds. */
ctxs_session_entry ts_session_entry(ctxs_store *st, const char *name);

/* ctxs_session_get_info() of s, asserted. */
ctxs_session_info ts_info(const ctxs_session *s);

/* The committed token count of s (ctxs_session_get_info(), asserted). */
uint64_t ts_n_tokens(const ctxs_session *s);

/* A small model: TS_N_LAYERS layers, TS_N_KV_HEADS KV heads, head_dim
 * TS_HEAD_DIM, fp16; hashes from seed. */
#define TS_N_LAYERS 2u
#define TS_N_KV_HEADS 2u
#define TS_HEAD_DIM 8u
ctxs_model ts_model(uint32_t seed);

/* Elements per token of ts_model() in each of K and V (layers * heads *
 * head_dim = 32): what one token's K or V array holds, for ts_fill_kv()
 * and ctxs_session_read_token(). */
#define TS_KV_MAX (TS_N_LAYERS * TS_N_KV_HEADS * TS_HEAD_DIM)

/* The token id written at position pos in tests. */
uint32_t ts_token(uint64_t pos);

/* Fills the [layers][heads][head_dim] K and V arrays of position pos
 * (valid fp16 values in [1, 2) that depend on pos, layer, head, element). */
void ts_fill_kv(const ctxs_geometry *g, uint64_t pos, uint16_t *k,
                uint16_t *v);

/* Reserves, writes and commits positions n_tokens .. n_tokens+n-1 with
 * ts_fill_kv contents and ts_token ids. Returns the first error (of the
 * reserve, a write or the commit), or 0. */
int ts_append(ctxs_session *s, uint32_t n);

/* ts_append() without Criterion, for children and for tests that must know
 * which step failed: *stage (may be NULL) gets TS_AT_RESERVE, TS_AT_WRITE
 * or TS_AT_COMMIT, the step of the error returned (0 before the first:
 * ctxs_session_get_info() or an allocation, CTXS_ENOMEM). */
enum { TS_AT_RESERVE = 1, TS_AT_WRITE, TS_AT_COMMIT };
int ts_try_append(ctxs_session *s, uint32_t n, int *stage);

/* ts_append() with the K/V handed over a layer at a time
 * (ctxs_session_write_layer()): the same contents, the same ids. */
int ts_append_layers(ctxs_session *s, uint32_t n);

/* Checks that every held position reads back as ts_fill_kv wrote it.
 * Returns the number of wrong positions. */
uint64_t ts_check_all(const ctxs_session *s);

/* Options for a small session: capacity slots, n_sink sinks, ring 0 or 1,
 * the given durability; the rest default. */
ctxs_create_options ts_options(uint32_t capacity, uint32_t n_sink, uint32_t ring,
                                uint32_t durability);

/* ctxs_checkpoint_list() and ctxs_checkpoint_delete() of the session named
 * session, through a read-only handle opened for the call: the errors of
 * ctxs_store_session_open() (CTXS_ENOTFOUND for no such session) or of the
 * call. */
int ts_checkpoint_list(ctxs_checkpoint_entry **out, size_t *n_out, ctxs_store *st,
                       const char *session);
int ts_checkpoint_delete(ctxs_store *st, const char *session, const char *name);

/* ts_append() of n tokens in commits of at most 50, asserting each. */
void ts_append_many(ctxs_session *s, uint64_t n);

/* Asserts that positions [0, n) of a source session a and its fork b (of
 * ts_model()) are held by both and read back the same: K, V and token id.
 * what names the check in a failure's message. */
void ts_same_tokens(const ctxs_session *a, const ctxs_session *b, uint64_t n, const char *what);

/* A seed for a randomized test: $CTXS_TEST_SEED if set, else from the
 * clock; printed to stderr with the test's name, so that a failure can be
 * replayed. */
uint64_t ts_seed(const char *test);

/* MurmurHash3's 64-bit finalizer: a well-mixed function of x. */
uint64_t ts_mix64(uint64_t x);

/* The intents (create or delete under way) in the store's index, read
 * with raw LMDB. */
size_t ts_pending_intents(ctxs_store *st);

/* The LMDB environment of the index of the store at dir, opened with raw
 * LMDB (flags: 0 or MDB_RDONLY; 16 tables, a map of 1 GiB), asserted; the
 * caller closes it (mdb_env_close()). The store must not be open in this
 * process: LMDB forbids two opens of one environment in a process. */
typedef struct MDB_env MDB_env;
MDB_env *ts_raw_env(const char *dir, unsigned flags);

/* The entries of table db in the index of the store at dir (raw LMDB, as
 * ts_raw_env()), asserting that the table exists. */
size_t ts_raw_entries(const char *dir, const char *db);

/* Writes db[key] = val straight into the index of the store at dir with
 * raw LMDB (what another program, or damage, could leave), creating the
 * table if needed; val NULL deletes the key. The store must not be open in
 * this process: LMDB forbids two opens of one environment in a process. */
void ts_raw_put(const char *dir, const char *db, const void *key, size_t key_len,
                const void *val, size_t val_len);

/* The entries of a directory, "." and ".." aside; -1 if it cannot be read. */
int ts_dir_entries(const char *dir);

/* An options struct's _options_init() (in a Criterion test): it fills what
 * the _INIT macro holds, and refuses a version it does not know and NULL. */
#define TS_OPTIONS_INIT_CHECK(type, init_fn, INIT, VERSION)                                       \
    do {                                                                                           \
        type got_, want_;                                                                          \
        memset(&want_, 0, sizeof(want_)); /* padding as _init leaves it: zero */                   \
        want_ = (type)INIT;                                                                        \
        memset(&got_, 0xa5, sizeof(got_));                                                         \
        cr_assert_eq(init_fn(&got_, VERSION), 0);                                                  \
        cr_assert(memcmp(&got_, &want_, sizeof(got_)) == 0, #init_fn " fills what " #INIT " holds"); \
        cr_assert_eq(init_fn(&got_, (VERSION) + 1), CTXS_EINVAL);                                  \
        cr_assert_eq(init_fn(&got_, 0), CTXS_EINVAL);                                              \
        cr_assert_eq(init_fn(NULL, VERSION), CTXS_EINVAL);                                         \
    } while (0)

/* --- Scenarios in a child process --------------------------------------
 *
 * Work that must not touch the test process (a private mount namespace, a
 * resource limit) runs in a forked child that uses no Criterion assertion:
 * it reports with ts_say() and exits 0 (pass), 1 (fail) or 77 (skip). */

/* The child's end of the pipe to the parent's log. */
extern int ts_child_log_fd;

/* Writes to the parent's log (printf-like). */
__attribute__((format(printf, 1, 2))) void ts_say(const char *fmt, ...);

/* In the child: says where and why, and exits 1, when cond is false. */
#define TS_CHECK(cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            ts_say("FAIL at line %d: ", __LINE__);                                                 \
            ts_say(__VA_ARGS__);                                                                   \
            ts_say("\n");                                                                          \
            _exit(1);                                                                              \
        }                                                                                          \
    } while (0)

/* In the child: enters a private user + mount namespace and mounts a tmpfs
 * of `size` on mnt: a small, full-able disk without root. Exits 77 (skip),
 * saying why, where the system does not allow it. Call it before the
 * library starts a thread: a threaded process cannot unshare. */
void ts_enter_small_disk(const char *mnt, const char *size);

/* Runs body(mnt) in a child (mnt: a new directory in the scratch
 * directory) and judges its exit: a signal or a 1 fails the test with the
 * child's log, 77 skips it loudly. */
void ts_run_child(void (*body)(const char *mnt), const char *what);

/* Forks with a pipe from the child to the parent (stdio flushed first).
 * Returns 0 in the child, where *fd is the pipe's write end, and the
 * child's pid in the parent, where *fd is its read end; the other end is
 * closed on each side. Asserts that pipe() and fork() succeed. */
pid_t ts_fork_pipe(int *fd);

/* Runs body(arg) in a forked child and returns the int it returned, sent
 * through a pipe; body uses no Criterion assertion. A child killed by a
 * signal, or that exits without sending its result (ASan reports a fault
 * and exits 1), fails the test, naming what. */
int ts_in_child(int (*body)(void *arg), void *arg, const char *what);

/* For a child: opens the store ts_store_dir() with flags, lists its
 * sessions and, when deep, each one's metadata, and closes it. Returns the
 * first error, or 0. */
int ts_store_read(unsigned flags, int deep);

/* A store (or any tree) the user may read but not write: everything under
 * dir becomes 0555 (directories) or 0444 (files), and ts_scratch 0755 so
 * that another user can reach it. ts_rmtree() still removes it. Returns 0
 * or -errno. */
int ts_make_unwritable(const char *dir);

/* In a child: become an unprivileged user (uid and gid 65534) when running
 * as root, who would ignore the permissions ts_make_unwritable() set;
 * nothing otherwise. Returns 0 or -errno. */
int ts_drop_privileges(void);

/* Reads a whole file into malloc'ed memory; *len gets its size. */
uint8_t *ts_read_file(const char *path, size_t *len);
/* Writes len bytes to path (created or truncated). Returns 0 or -errno. */
int ts_write_file(const char *path, const void *data, size_t len);

/* Waits for child pid, through signals, and returns its wait status. */
int ts_wait(pid_t pid);

/* Monotonic microseconds; a sleep that resumes across signals. */
uint64_t ts_now_us(void);
void ts_sleep_us(uint64_t us);

/* --- Self-describing tokens (the soak and concurrency suites) -----------
 *
 * The token written at position pos in generation gen has the id
 * ts_pat_id(pos, gen), and K and V that depend only on its position and its
 * id (ts_pat_kv()). A reader that knows nothing of the writer can so check
 * that every held slot is whole and belongs to its token; one that knows
 * the generations can check that each token is the one committed. Writers
 * take a new generation for what they write after a rollback, so old and
 * new bytes at one position differ. None of these call Criterion: children
 * and threads may use them. */

/* The generation written at each position, as a parent learns it from a
 * writer's announcements, and the highest one handed out. Grows as needed;
 * positions never set read as generation 0. */
typedef struct ts_gens {
    uint32_t *v;
    size_t cap;
    uint32_t hi;
} ts_gens;

/* Positions [a, b) hold generation gen. */
void ts_gens_set(ts_gens *gs, uint64_t a, uint64_t b, uint32_t gen);
uint32_t ts_gens_get(const ts_gens *gs, uint64_t p);

/* Elements per token (layers * heads * head_dim) the helpers handle. */
#define TS_PAT_KV_MAX 256u

uint32_t ts_pat_id(uint64_t pos, uint32_t gen);
void ts_pat_kv(const ctxs_geometry *g, uint64_t pos, uint32_t id, uint16_t *k, uint16_t *v);

/* Reserves, writes and commits n tokens of generation gen after the
 * committed ones; *first_pos (may be NULL) gets the first position.
 * Returns the first failing call's result. */
int ts_pat_append(ctxs_session *s, uint32_t n, uint32_t gen, uint64_t *first_pos);

/* The held positions of s (as its handle sees them) whose K, V or token id
 * do not belong together; *bad_pos (may be NULL) gets the first. */
uint64_t ts_pat_check(const ctxs_session *s, uint64_t *bad_pos);

/* What a reader checks while a writer may be working on the file: the
 * state s shows, checked as ts_pat_check() does (and with verify by
 * ctxs_session_verify() too), then s refreshed. Returns 1 when the commit
 * record did not change meanwhile, so the check counts: *n_out gets the
 * token count seen and *last_id the id of its last token (0 when empty);
 * 0 when it changed (the writer may have reused the slots read: the check
 * is void); -1 on a violation, described in why. */
int ts_pat_stable_check(ctxs_session *s, int verify, uint64_t *n_out, uint32_t *last_id,
                        char *why, size_t why_len);

#endif
