/*
 * ctxstore — a persistent, memory-mapped KV cache for transformer inference.
 *
 * A session is one conversation's KV cache in one file, laid out as
 * [layers][2][kv_heads][capacity][head_dim] (2 = K, V), mapped MAP_SHARED.
 * The engine writes new keys and values straight into the mapping and its
 * attention kernel reads straight from it; saving a turn is a checksum of the
 * new tokens plus a 128-byte commit record, resuming is a map and a header
 * check.
 *
 * Usage:
 *
 *     ctxs_model model = { .geometry = { 36, 8, 128, CTXS_DTYPE_F16 } };
 *     memcpy(model.model_hash, weights_hash, CTXS_HASH_BYTES);
 *     ctxs_session *s;
 *     int rc = ctxs_session_create(&s, "chat.ctxs", &model, NULL);
 *     if (rc < 0) fprintf(stderr, "%s\n", ctxs_strerror(rc));
 *
 *     ctxs_reservation r;
 *     ctxs_session_reserve(&r, s, n_new);        // slots for n_new tokens
 *     for (uint32_t l = 0; l < n_layers; l++)    // a layer at a time, as a
 *         ctxs_session_write_layer(s, &r, l, 0, n_new, k[l], v[l],
 *                                  CTXS_DTYPE_F32); // forward pass makes them
 *     ctxs_session_commit(s, token_ids, n_new);  // durable per the level
 *     ctxs_session_close(s);
 *
 *     // later, in another process, after a crash or a reboot:
 *     ctxs_session_open(&s, "chat.ctxs", &model, 0, NULL);
 *
 * Caveats:
 *
 * - A session handle is used by one thread at a time. Different handles may
 *   be used from different threads; ctxs_set_pressure() and the pressure
 *   watcher may run on any thread.
 * - Pointers into the mapping (ctxs_session_get_kv(), ctxs_session_get_layout())
 *   are valid until ctxs_session_close(). A slot's bytes are stable while its
 *   token is committed; a reader in another process may see a slot rewritten
 *   after the writer rolls back or the ring wraps over it: call
 *   ctxs_session_refresh() and check the token count before trusting a slot.
 * - Writes to the mapping outside a reservation are not supported. The
 *   checksums catch them after a power loss or with ctxs_session_verify();
 *   after a process crash the page cache is trusted and they are not looked
 *   for.
 * - Within one boot of the machine the page cache is trusted: a commit
 *   record written in the running boot vouches for every page written
 *   before it, so an open after a process crash or an unclean close
 *   verifies nothing. Only a record from another boot (or from an unknown
 *   one) makes open verify the tokens above its durability watermark. A
 *   test of power loss that does not reboot (a device that drops unflushed
 *   writes, a file damaged on purpose) must open as a new boot would:
 *   CTXS_OPEN_VERIFY does it for one open; the environment variable
 *   CTXS_TEST_BOOT=<text> does it for a whole process (read once, the
 *   first time the library needs the boot id): its boot id is then
 *   XXH3-128 of the machine's boot id and <text>, so it verifies what any
 *   process with another value (or none) wrote, and they verify what it
 *   writes. It can only add verification, which is why every build reads
 *   it; where the machine has no boot id, every open verifies anyway.
 * - Files are little-endian; ctxstore builds only on little-endian hosts.
 * - The library never installs signal handlers. Disk space for reserved slots
 *   is allocated by ctxs_session_reserve(), so a full disk is an error there
 *   and not a SIGBUS during a write; a file truncated by someone else while
 *   mapped can still raise SIGBUS, as with any mapping. That holds on ext4,
 *   XFS and tmpfs. On a copy-on-write filesystem an allocated block is good
 *   for one write only, and every later write through the mapping takes new
 *   space at the write fault:
 *   - btrfs: session files, and LMDB's lock file in a store, are made NOCOW
 *     when created (they lose btrfs's data checksums, not ctxstore's), so
 *     their blocks are written in place and the promise holds; forks copy
 *     there instead of sharing blocks. On a btrfs with no byte free a write
 *     fault is slow (btrfs first tries to free space), not an error. Blocks
 *     shared by means outside the library (a snapshot of the subvolume, a
 *     reflink copy) need new space when first written again, and a full
 *     disk then raises SIGBUS.
 *   - XFS with reflink: a fork shares its held tokens' blocks with its
 *     source; either session rewriting them (after a rollback below the
 *     fork point, or its ring wrapping over them) needs new space at the
 *     write fault, and a full disk then raises SIGBUS.
 *   - ZFS allocates nothing ahead (fallocate reserves no space) and
 *     bcachefs copies on write unless its nocow option is set: nothing is
 *     promised there; keep the store where space is guaranteed (a ZFS
 *     reservation on its dataset, for one).
 */
#ifndef CTXSTORE_H
#define CTXSTORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(CTXS_BUILDING_LIBRARY) && defined(__GNUC__)
#define CTXS_API __attribute__((visibility("default")))
#else
#define CTXS_API
#endif

#define CTXS_VERSION_MAJOR 0
#define CTXS_VERSION_MINOR 2
#define CTXS_VERSION_PATCH 0

/* ---------------------------------------------------------------------------
 * Conventions
 *
 * - Functions are named ctxs_<object>_<verb>: ctxs_session_commit(),
 *   ctxs_store_session_fork(). A property is read by ctxs_<object>_get_<what>
 *   and changed by ctxs_<object>_set_<what>; process-wide settings drop the
 *   object (ctxs_set_pressure()).
 * - Out-parameters come first, named out (or for what they receive, such as
 *   bad_pos); on failure a handle's *out is NULL.
 * - Options are structs whose version field the caller sets, through the
 *   structs' _INIT macros, which also hold every default:
 *
 *       ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
 *       o.capacity = 8192;
 *
 *   A library refuses (CTXS_EINVAL) a version it does not know, so a program
 *   built against a newer header never has fields silently ignored. Where
 *   macros cannot be used (a binding through a foreign-function interface),
 *   ctxs_<struct>_options_init(opts, version) fills the same defaults:
 *
 *       ctxs_create_options o;
 *       ctxs_create_options_init(&o, CTXS_CREATE_OPTIONS_VERSION);
 *
 *   It returns 0, or CTXS_EINVAL for NULL or a version this library does
 *   not know.
 */

/* ---------------------------------------------------------------------------
 * Process-wide state
 *
 * The library keeps, per process and out of any handle:
 * - the open sessions (for the pressure state and the background worker),
 *   under one mutex, with a pthread_atfork() handler registered at the
 *   first open: the mutex is held across fork(), and the child forgets the
 *   worker (it starts one at its next open or commit that needs it);
 * - the background worker thread while a session with the background
 *   option is open ("Background work");
 * - the open stores, so that two opens of one store share one LMDB
 *   environment, with a pthread_atfork() handler registered at the first
 *   store open: the child starts with none (its parent's are leaked, never
 *   closed, as LMDB requires), so a store it opens is its own;
 * - the sessions this process is creating through a store (between the
 *   intent and the index entry), so that a store open does not take them
 *   for a crashed creator's; a child inherits the list as it was;
 * - the pressure state (ctxs_set_pressure()), which a child inherits, and
 *   the pressure watcher's thread, which it does not;
 * - the machine's boot id and the CPU kernel's instruction set, each found
 *   once, at first use, and inherited by a child;
 * - the last error, per thread (ctxs_get_last_error()).
 * Each is thread-safe. A child of fork() uses none of its parent's handles
 * (see "Stores") and may open its own. The atfork handlers above make the
 * locks of the open sessions and of the open stores safe across fork();
 * the others (the sessions being created, the pressure watcher's, the
 * remote tier's) are held for a few instructions at a time, but a fork
 * made while another thread holds one leaves it held in the child: a
 * threaded program whose child calls the library forks where no other
 * thread is inside a create, a watcher start or stop, or a remote call.
 */

/* Names of sessions, checkpoints and models: at most this many bytes, see
 * "Stores" for the rule. Buffers that receive one are CTXS_NAME_MAX + 1. */
#define CTXS_NAME_MAX 255
/* The rule, in words, for a program to show when a name is refused. */
#define CTXS_NAME_RULE                                                         \
    "a name is 1 to 255 bytes of UTF-8 text without '/', '..' or control "     \
    "characters, and not '.'"
/* Model and tokenizer hashes (XXH3-128 by ctxs_model_hash_file() and
 * ctxs_tokenizer_hash_file()). */
#define CTXS_HASH_BYTES 16

/* The defaults of the _INIT macros. */
#define CTXS_DEFAULT_CAPACITY 2048u        /* slots in a new session file
                                              whose model's context length
                                              is not given */
#define CTXS_DEFAULT_N_SINK 4u             /* slots never overwritten */
#define CTXS_DEFAULT_WINDOW 0u             /* recent tokens attention reads:
                                              0 = the capacity (all held) */
#define CTXS_DEFAULT_PRESSURE_WINDOW 0u    /* the window under pressure:
                                              0 = half the window */
#define CTXS_DEFAULT_MAX_READERS 126u      /* concurrent index readers */
#define CTXS_DEFAULT_BATCH 512u            /* ctxs_create_options.batch */
#define CTXS_DEFAULT_MAP_BYTES (1ull << 30) /* most bytes the index grows to */
#define CTXS_DEFAULT_POLL_MS 1000u         /* pressure watcher's period */
#define CTXS_DEFAULT_MIN_AVAILABLE (512ull << 20) /* MemAvailable floor */
#define CTXS_DEFAULT_PSI_SOME_AVG10 20u    /* PSI "some avg10" percent */
#define CTXS_DEFAULT_REMOTE_TIMEOUT_MS 2000u /* connect and per-command timeout */
#define CTXS_DEFAULT_REMOTE_RETRIES 5u     /* tries of a background push */
#define CTXS_DEFAULT_REMOTE_BACKOFF_MS 50u /* first retry's wait, then doubled */
#define CTXS_DEFAULT_REMOTE_QUEUE_MAX 4096u /* background push jobs waiting */
#define CTXS_DEFAULT_REMOTE_CALL_MS 300000u /* one remote call, all of it */

/* ---------------------------------------------------------------------------
 * Errors
 *
 * Every call returns 0 on success or a negative code: -errno for system
 * errors (-ENOENT, -EACCES, -EIO, ...), or one of the codes below, which sit
 * in a band far from errno values.
 */
#define CTXS_ERRNO_MAP(XX)                                                     \
    XX(CORRUPT, -32001, "session file is corrupt")                             \
    XX(FOREIGN, -32002, "not a ctxstore file or store")                        \
    XX(VERSION, -32003, "session file format version is not supported")       \
    XX(MODEL, -32004, "session belongs to another model")                      \
    XX(BUSY, -32005, "session is open by another writer")                      \
    XX(FULL, -32006, "no space: disk full or capacity reached without ring")  \
    XX(NOTFOUND, -32007, "not found")                                          \
    XX(INVAL, -32008, "invalid argument")                                      \
    XX(READONLY, -32009, "session or store is open read-only")                 \
    XX(FAILED, -32010, "session failed after an I/O error; reopen it")         \
    XX(EVICTED, -32011, "tokens were overwritten by the ring")                 \
    XX(NOMEM, -32012, "out of memory")                                        \
    XX(STALE, -32013, "the session no longer holds those tokens")            \
    XX(NODEVICE, -32014, "no usable GPU device")                              \
    XX(DEVICE, -32015, "GPU error")                                          \
    XX(TOOBIG, -32016, "value or metadata above its size limit")           \
    XX(INDEX, -32017, "the store's index is damaged")                      \
    XX(REMOTE, -32018, "the remote store refused a request or holds damaged data") \
    XX(ENGINE, -32019, "the inference engine refused a request or its state was not understood") \
    XX(NOMODEL, -32020, "the model is not registered in the store")       \
    XX(TAKEN, -32021, "the name is taken")

typedef enum ctxs_error {
#define CTXS_ERR_ENUM_(name, value, text) CTXS_E##name = (value),
    CTXS_ERRNO_MAP(CTXS_ERR_ENUM_)
#undef CTXS_ERR_ENUM_
} ctxs_error;

/* A static, human-readable message for any return code (strerror() for
 * -errno). Thread-safe. */
CTXS_API const char *ctxs_strerror(int rc);

/* The code's name ("CTXS_EBUSY", "ENOENT", "OK"), for logs: every code
 * above and every errno the platform defines has its own (an alias such
 * as EWOULDBLOCK reads as the name the C library gives its value,
 * EAGAIN); "ERRNO" for a value in -4095..-1 that is no errno, "UNKNOWN"
 * for anything else. A static string. Thread-safe. */
CTXS_API const char *ctxs_err_name(int rc);

/*
 * Why a call failed, in words.
 *
 * A code says what kind of failure it was; the calling thread's last
 * error says why, in one sentence that names what was refused and the
 * rule it broke, for a program to print beside ctxs_strerror():
 *
 *     int rc = ctxs_session_commit(s, ids, n);
 *     if (rc < 0)
 *         fprintf(stderr, "commit: %s: %s\n", ctxs_strerror(rc),
 *                 ctxs_get_last_error());
 *     // commit: invalid argument: commit of 3 tokens, but 0 are reserved:
 *     // reserve them first (ctxs_session_reserve())
 *
 * Every call of this library (and of the libraries beside it: the
 * llama.cpp adapter, the remote tier) clears it when it starts and sets it
 * where it fails, so after a call that returned an error it is that
 * call's reason, and never an older call's. Kept per thread, like errno,
 * sqlite3_errmsg() and dlerror(): a failure on one thread is never read
 * on another.
 */

/* The reason the calling thread's last call failed: one sentence without
 * a final period, valid until the thread's next call into the library;
 * "" when that call said nothing beyond its code (an -errno from the
 * system that ctxs_strerror() says in full), or did not fail. Never NULL.
 * Thread-safe (per thread). */
CTXS_API const char *ctxs_get_last_error(void);

/* The code that ctxs_get_last_error() explains: the return value of the
 * call that failed; 0 when it is "". A program that reports codes from
 * elsewhere too checks that it is the code at hand before printing the
 * reason. Thread-safe (per thread). */
CTXS_API int ctxs_get_last_error_code(void);

/* Sets the calling thread's last error to rc with the reason fmt says
 * (printf-style; rc 0 clears it), and returns rc: for a library built on
 * this one whose calls fail in its own terms (the llama.cpp adapter does
 * this), so that its callers read one ctxs_get_last_error(). A reason
 * longer than 511 bytes is cut. Thread-safe (per thread). */
CTXS_API int ctxs_set_last_error(int rc, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* ---------------------------------------------------------------------------
 * Models and how K/V are kept
 */
/*
 * How a session stores K and V (ctxs_geometry.dtype), and the forms an
 * engine hands them over in (ctxs_session_write_token(), _read_token()).
 *
 * CTXS_DTYPE_Q8 keeps each element as an int8 in [-127, 127] and, for every
 * (token, head) of K and of V, one float32 scale: element i of a head's
 * slot is scale * q[i]. The scales live in a table of their own (the
 * layout's `scales`), so that a slot stays head_dim bytes and the slots of
 * one head stay one [capacity][head_dim] run that attention reads in place.
 * ctxs_session_write_token() quantizes as
 *     amax = max |x[i]| over the head_dim elements;
 *     scale = amax / 127;  q[i] = round-half-even(x[i] * (127 / amax))
 * (x[i] / amax * 127 when 127 / amax overflows a float)
 * (scale 0 and q = 0 when amax is 0), so |x[i] - scale * q[i]| <= scale / 2;
 * an engine that writes the mapping itself may quantize any way it likes as
 * long as scale * q[i] is what it means. Half the bytes of fp16 per token.
 */
typedef enum ctxs_dtype {
    CTXS_DTYPE_F16 = 1,  /* IEEE binary16 */
    CTXS_DTYPE_BF16 = 2, /* bfloat16: the high half of a float32 */
    CTXS_DTYPE_Q8 = 3,   /* int8 with a float32 scale per (token, head) */
    CTXS_DTYPE_F32 = 4,  /* float32: a form K/V are handed over in; not
                            a session's dtype */
} ctxs_dtype;

/* The most layers a layer schedule's pattern has (ctxs_geometry.period). */
#define CTXS_SCHEDULE_MAX 8

/*
 * A model's KV geometry, and its layer schedule.
 *
 * The schedule says which layers attend to every token (global layers)
 * and which to their last W positions only (sliding-window layers, as in
 * Gemma 2 and 3, gpt-oss, Mistral 7B): layer l has the window
 * window[l % period], 0 meaning global. period 0 (every window[] zero)
 * means every layer is global, the only schedule before format 3.0; else
 * period is 1..CTXS_SCHEDULE_MAX and at least one of window[0 .. period-1]
 * is not 0, the rest of window[] zero. Each window is 1..16 Mi.
 *
 * A sliding-window layer keeps only what it can read: its own ring of
 * window + batch slots (ctxs_create_options.batch), its oldest slots
 * overwritten as tokens arrive, where that is smaller than the session's
 * slots; else it is laid out as a global layer and its window bounds only
 * what attention reads. The schedule is part of the model: a session of
 * another schedule is refused (CTXS_EMODEL).
 */
typedef struct ctxs_geometry {
    uint32_t n_layers;   /* transformer layers, 1..4096 */
    uint32_t n_kv_heads; /* KV heads per layer (after GQA), 1..4096 */
    uint32_t head_dim;   /* elements per head, 1..4096 */
    uint32_t dtype;      /* ctxs_dtype */
    uint32_t period;     /* layers in the schedule's pattern; 0: all global */
    uint32_t window[CTXS_SCHEDULE_MAX]; /* per pattern layer: 0 = global,
                                           else its sliding window */
} ctxs_geometry;

/* The window of layer `layer` under g's schedule: 0 for a global layer.
 * Thread-safe. */
CTXS_API uint32_t ctxs_geometry_get_window(const ctxs_geometry *g, uint32_t layer);

/* Bytes of one token's K (or V) in the form ctxs_session_write_token() and
 * ctxs_session_read_token() take: [n_layers][n_kv_heads][head_dim] elements
 * of dtype, and for CTXS_DTYPE_Q8 then the [n_layers][n_kv_heads] float32
 * scales. 0 for an unknown dtype, a geometry out of range, or NULL.
 * Thread-safe. */
CTXS_API size_t ctxs_geometry_get_token_bytes(const ctxs_geometry *g, uint32_t dtype);

/* What a session's KV belongs to. Opening a session with a model whose
 * geometry or hashes differ fails with CTXS_EMODEL. */
typedef struct ctxs_model {
    ctxs_geometry geometry;
    uint8_t model_hash[CTXS_HASH_BYTES];     /* XXH3-128 of the weights, or
                                                the app's own */
    uint8_t tokenizer_hash[CTXS_HASH_BYTES];
} ctxs_model;

/* ---------------------------------------------------------------------------
 * Sessions
 */
typedef struct ctxs_session ctxs_session;

/* How much a commit waits for the disk. */
typedef enum ctxs_durability {
    CTXS_SYNC_NONE = 0,  /* nothing: survives a process crash */
    CTXS_SYNC_ASYNC = 1, /* start writeback, do not wait (default): of
                            the K/V pages commits fill as each run fills
                            one, of the rest (the page each run is still
                            filling, the records and tables) once commits
                            pause for a second (without the background
                            thread: at the next commit), or at close;
                            with windowed layers, reserve syncs as
                            ctxs_session_sync() before a ring reuses a
                            slot of the watermark's window */
    CTXS_SYNC_FULL = 2,  /* data durable, then the record, then the record
                            durable: survives power loss */
} ctxs_durability;

/*
 * Background work.
 *
 * By default (ctxs_open_options.background = 1) the library does, on one
 * thread of its own, the work that would otherwise make a user wait:
 *
 * - after an open: the attention window is read ahead from the disk and
 *   mapped (never more than the window in force, so memory pressure shrinks
 *   it too; of a sliding-window layer, its own window where smaller, as
 *   ctxs_session_get_layer_attn() plans); an attention pass right after
 *   the open waits only for the pages not yet in, and one after a pause
 *   finds them all in;
 * - after a commit: at ASYNC, writeback of the committed tokens is started
 *   (of the pages they filled, every 32 tokens; the page each run is still
 *   filling, and the records and tables, once commits pause for a second:
 *   a reply decoded token by token would otherwise have the same pages
 *   written back, and faulted on and waited for, at each token);
 *   the next slots are allocated and (at NONE and ASYNC) mapped writable (a
 *   "runway" of twice the largest recent reservation, at most 128 MiB), so
 *   that the next ctxs_session_reserve() costs microseconds and the next
 *   turn's K/V go straight into mapped pages; for two minutes after the
 *   commit, mapped writable again each time the kernel's flusher has
 *   written it back (it does after 30 s), so that a user who reads for a
 *   while is not made to wait for page faults (each time: about a turn's
 *   page faults on the worker, and the runway's zeros written back again);
 * - after a reserve beyond the runway, or once writeback has cleaned it:
 *   the reserved slots are mapped, a layer at a time, while the engine
 *   computes; and ahead of an engine that writes a few tokens at a time
 *   through ctxs_session_write_layer() (a reply decoded token by token);
 * - after a rollback: the runway again, from the new count (a regenerated
 *   reply finds its slots mapped).
 *
 * The thread is started by the first open or create with the option in the
 * process, and stopped and joined by the close of the last such session; a
 * process with none open has no thread of ctxstore's. On Linux it runs
 * SCHED_BATCH: waking it (a commit, a reserve) never preempts the thread
 * that woke it, and it still gets its fair share of the processor. Close
 * of any session waits for the thread to let go of it (at most one chunk
 * of a few MiB).
 * None of this changes a result: attention reads the same bytes, and a
 * commit is as durable as its level says once it returns. The library
 * registers a pthread_atfork() handler (at the first open) so that a child
 * forked while the thread works gets a consistent state; the child has no
 * thread until its next open or commit needs one.
 *
 * With background = 0 the library starts no thread for the session: the
 * window comes in as attention faults it (or ctxs_session_prefetch()), an
 * ASYNC commit starts its writeback on the caller's thread (of the pages
 * it filled; of what the commits before it left, the first commit after a
 * pause of a second, and close), and reserve allocates and maps the slots
 * it hands out itself.
 */

/* How a handle behaves: for ctxs_session_open(), ctxs_session_fork(), and
 * as the open part of ctxs_create_options. */
#define CTXS_OPEN_OPTIONS_VERSION 2

/*
 * Attention windows (open options version 2): the sliding windows of
 * layers that the session's schedule makes global, for an engine whose
 * cache keeps every position of its window layers (llama.cpp's swa_full,
 * whose sessions have a schedule of period 0). Layer l reads only its
 * last attn_window positions unless bit l % attn_period of
 * attn_global_mask is set (a global layer): ctxs_session_get_layer_attn()
 * plans it so, and the window brought in after an open (and by
 * ctxs_session_prefetch()), or kept under memory pressure, is that much
 * smaller: Gemma 3's 15 window layers of 18 read 512 positions of
 * thousands. Nothing is kept less: the file and every position in it are
 * as without. attn_period 0 (with
 * attn_window and attn_global_mask 0): none. Else attn_period is
 * 1..CTXS_SCHEDULE_MAX, attn_window 1..16 Mi, and at least one layer of
 * the pattern is not in attn_global_mask.
 */
typedef struct ctxs_open_options {
    uint32_t version;        /* CTXS_OPEN_OPTIONS_VERSION */
    uint32_t window;         /* recent tokens attention reads beside the
                                sinks; 0 = the capacity: every token held */
    uint32_t pressure_window;/* the window under memory pressure;
                                0 = half the window (at least 1) */
    uint32_t durability;     /* ctxs_durability */
    uint32_t background;     /* 1 = work off the caller's thread, 0 = none;
                                see "Background work" above */
    /* Version 2 (reserved in version 1), see above: */
    uint32_t attn_period;    /* layers in the windows' pattern; 0: none */
    uint32_t attn_window;    /* the window of the pattern's window layers */
    uint32_t attn_global_mask; /* bit j: pattern layer j is global */
    uint8_t reserved[16];    /* must be zero */
} ctxs_open_options;

#define CTXS_OPEN_OPTIONS_INIT                                                 \
    { CTXS_OPEN_OPTIONS_VERSION, CTXS_DEFAULT_WINDOW,                         \
      CTXS_DEFAULT_PRESSURE_WINDOW, CTXS_SYNC_ASYNC, 1, 0, 0, 0, { 0 } }
/* Fills *opts with the defaults of version (CTXS_OPEN_OPTIONS_INIT; the
 * same bytes for version 1, whose last 28 are reserved). Errors:
 * CTXS_EINVAL (opts NULL, or a version this library does not know).
 * Thread-safe. */
CTXS_API int ctxs_open_options_init(ctxs_open_options *opts, uint32_t version);

/* The shape of a new session file, and how the handle that
 * ctxs_session_create() returns behaves. */
#define CTXS_CREATE_OPTIONS_VERSION 1

typedef struct ctxs_create_options {
    uint32_t version;        /* CTXS_CREATE_OPTIONS_VERSION */
    uint32_t capacity;       /* slots in the file: 2 .. 16 Mi, above n_sink;
                                0 = context_length, or CTXS_DEFAULT_CAPACITY
                                where that is 0 too */
    uint32_t n_sink;         /* slots never overwritten */
    uint32_t ring;           /* 1 = once full, overwrite the oldest tokens
                                after the sinks (they are lost); 0 (the
                                default) = once full, reserve fails with
                                CTXS_EFULL and nothing is lost: grow the
                                session (ctxs_store_session_grow()) */
    uint32_t batch;          /* the most tokens reserved and not yet
                                committed at once in a session whose
                                schedule has sliding-window layers: the
                                slots such a layer keeps beyond its window;
                                0 = CTXS_DEFAULT_BATCH */
    uint32_t context_length; /* the model's context length (llama.cpp's
                                n_ctx), the capacity when capacity is 0;
                                0 = not known */
    uint8_t reserved[24];    /* must be zero */
    ctxs_open_options open;  /* the handle create returns */
} ctxs_create_options;

#define CTXS_CREATE_OPTIONS_INIT                                               \
    { CTXS_CREATE_OPTIONS_VERSION, 0, CTXS_DEFAULT_N_SINK, 0,                  \
      CTXS_DEFAULT_BATCH, 0, { 0 }, CTXS_OPEN_OPTIONS_INIT }
/* Fills *opts with the defaults of version (CTXS_CREATE_OPTIONS_INIT for
 * version 1). Errors: CTXS_EINVAL (opts NULL, or a version this library
 * does not know). Thread-safe. */
CTXS_API int ctxs_create_options_init(ctxs_create_options *opts, uint32_t version);

/* Creates a session file at path for model and opens it read-write.
 * The file appears complete or not at all (written aside, then linked into
 * place: a process killed meanwhile leaves nothing where the filesystem has
 * O_TMPFILE, else "<path>.tmp-<pid>-<n>"); it is sparse: only the first
 * page and the token tables take disk space until slots are reserved.
 * Files are created 0600. opts may be NULL for CTXS_CREATE_OPTIONS_INIT; the
 * KV region must fit in a size_t.
 *
 * Errors: CTXS_EINVAL (bad geometry, options or NULL argument), -EEXIST,
 * CTXS_EFULL (no disk space for the header), CTXS_ENOMEM, -errno.
 * *out is NULL on failure. Thread-safe. */
CTXS_API int ctxs_session_create(ctxs_session **out, const char *path,
                                 const ctxs_model *model,
                                 const ctxs_create_options *opts);

/* The flags of a session's open. CTXS_RDONLY is one value for every open
 * that takes flags: a session's, a store's (ctxs_store_open()) and a
 * session's through a store. */
#define CTXS_RDONLY 0x1u      /* read-only: shared lock, no writes */
#define CTXS_OPEN_VERIFY 0x2u /* verify the tokens since the last durable
                                 point always, as after a power loss */

/* Opens an existing session file. Read-write opens take the writer lock
 * (one writer per file, across processes) and need model; read-only opens
 * take a reader lock, coexist with a writer, and accept model == NULL to
 * inspect a file of any model.
 *
 * The newest commit record whose CRC holds is taken. Its tokens written
 * since the last durable point are verified when the file was last written
 * under another boot of the machine (a power loss or a reboot may have
 * dropped pages), or always with CTXS_OPEN_VERIFY; after a process crash
 * the page cache holds everything and no KV page is read. A state that
 * does not verify is rolled back
 * to its longest verifying prefix, and info.flags says so
 * (CTXS_INFO_RECOVERED). A read-write open writes the recovered state back.
 * A symbolic link in place of the file is refused (-ELOOP).
 *
 * flags: CTXS_RDONLY, CTXS_OPEN_VERIFY. opts may be NULL for
 * CTXS_OPEN_OPTIONS_INIT.
 *
 * Errors: -ENOENT, -ELOOP, -EACCES, CTXS_EFOREIGN (not a session file),
 * CTXS_EVERSION (newer major version), CTXS_ECORRUPT (header or both
 * records damaged, or sizes that do not add up), CTXS_EMODEL, CTXS_EBUSY
 * (another writer holds it; or, read-only too, a gc, compact or delete of
 * the store is working on it), CTXS_EINVAL, CTXS_ENOMEM, -errno.
 * *out is NULL on failure. Thread-safe. */
CTXS_API int ctxs_session_open(ctxs_session **out, const char *path,
                               const ctxs_model *model, unsigned flags,
                               const ctxs_open_options *opts);

/* Unmaps and closes. Uncommitted reservations are dropped. At ASYNC the
 * writeback started by commits continues, and that of what they left for
 * later (see CTXS_SYNC_ASYNC) is started, as is that of the slots mapped
 * ahead for the next turn (their zeros), at any durability. Waits for the
 * background thread to let go of s (see "Background work"), and joins the
 * thread when s was the last session using it. A writeback error makes
 * every later open verify the file, as after a power cut, from the moment
 * it is met (by the background thread, or by a commit that does not
 * report it): a process killed before a call of s reports it, or a close,
 * which cannot return it, loses nothing to it. Accepts NULL. */
CTXS_API void ctxs_session_close(ctxs_session *s);

/* Gives the session file at path capacity slots, as
 * ctxs_store_session_grow() does (the file keeps its name and label).
 * Errors: as ctxs_store_session_grow(), with -ENOENT for no such file.
 * Thread-safe. */
CTXS_API int ctxs_session_grow(const char *path, uint32_t capacity);

/* Creates a new session file at path that holds the first n_tokens tokens of
 * src (UINT64_MAX: all src holds) with src's model, capacity, sinks and
 * ring, and opens it read-write (writer lock held from the start). The new
 * session holds what ctxs_session_rollback(src, n_tokens) would leave src
 * holding: in a ring that has wrapped, the sinks and the tokens from the
 * oldest one still held up to n_tokens. The new file shares src's blocks
 * where the filesystem can (FICLONE: Btrfs, XFS); elsewhere the held slots
 * are copied from src's mapping, at memory speed, and a full disk is
 * CTXS_EFULL here, not later. Like ctxs_session_create(), the file appears
 * complete or not at all, and nothing is left behind on failure.
 *
 * src may be a read-only handle, and another process may be writing it
 * meanwhile: its committed tokens are what is copied (a read-only src is
 * refreshed, as by ctxs_session_refresh(), before and after the copy), and
 * the copy stands only if src still holds them, unchanged, afterwards. A
 * writer's uncommitted reservations are not copied.
 *
 * The fork's records and tables are durable when this returns, its KV by
 * its durability: at FULL all of it; at ASYNC writeback has started; at
 * NONE the page cache holds it. Until its KV is known durable, an open
 * after a power loss verifies every token and keeps the longest prefix
 * that verifies. opts as for ctxs_session_open().
 *
 * Errors: CTXS_EINVAL (n_tokens above src's count, NULL argument, bad
 * options), CTXS_EEVICTED (the ring overwrote tokens the fork needs),
 * CTXS_ESTALE (src was rolled back below n_tokens, or its ring overwrote
 * tokens the fork needs, during the copy), CTXS_EFAILED (src is a writer
 * that failed), CTXS_ECORRUPT (refreshing src found both its records
 * damaged), -EEXIST, CTXS_EFULL, CTXS_ENOMEM, -errno. *out is NULL on
 * failure. src is used as by any other call on it: one thread at a time. */
CTXS_API int ctxs_session_fork(ctxs_session **out, ctxs_session *src,
                               const char *path, uint64_t n_tokens,
                               const ctxs_open_options *opts);

/* --- Layout and zero-copy access ---------------------------------------- */

enum { CTXS_K = 0, CTXS_V = 1 };

typedef struct ctxs_layout {
    void *kv;              /* the KV region; 16 KiB aligned, whole pages */
    size_t kv_bytes;
    float *scales;         /* CTXS_DTYPE_Q8: the scale table (below); NULL
                              for other dtypes */
    size_t scales_bytes;
    size_t slot_bytes;     /* one slot of one head: head_dim * element size */
    size_t head_stride;    /* bytes from head h to h + 1: capacity*slot_bytes */
    size_t kv_stride;      /* bytes from K to V of a layer */
    size_t layer_stride;   /* bytes from layer l to l + 1 */
    const uint32_t *token_ids; /* capacity entries, slot order */
    uint32_t capacity;
    uint32_t n_sink;
    ctxs_geometry geometry;
} ctxs_layout;

/* The mapping's layout. Pointers are valid until ctxs_session_close(). In a
 * session whose schedule has windowed layers (geometry.period not 0) the
 * layers differ: take each with ctxs_session_get_kv(),
 * ctxs_session_get_scales(), ctxs_session_get_layer_slots() and
 * ctxs_session_get_layer_attn(); the strides below then hold for no layer
 * (only layer 0's K starts at kv). Else the
 * KV of (layer, kind, head, slot) lives at
 *     kv + layer*layer_stride + kind*kv_stride + head*head_stride
 *        + slot*slot_bytes,
 * and, for CTXS_DTYPE_Q8, its scale at
 *     scales[((layer*2 + kind)*n_kv_heads + head)*capacity + slot].
 * Errors: CTXS_EINVAL. */
CTXS_API int ctxs_session_get_layout(ctxs_layout *out, const ctxs_session *s);

/* The [slots][head_dim] run of one (layer, CTXS_K|CTXS_V, head), writable
 * for a read-write session (write only into reserved slots), where slots is
 * ctxs_session_get_layer_slots()'s: the capacity, and the session's slots
 * are the reservation's spans and ctxs_session_get_slot()'s; or, for a
 * windowed layer with a ring of its own, fewer, and position p lives in
 * slot p % slots (ctxs_session_write_layer() takes care of both).
 * Errors: CTXS_EINVAL (index out of range). */
CTXS_API int ctxs_session_get_kv(void **out, ctxs_session *s, uint32_t layer,
                                 uint32_t kind, uint32_t head);

/* The slots of each run of layer: the session's capacity, or, for a
 * windowed layer with a ring of its own, its window plus the session's
 * batch (see ctxs_session_get_kv()). Errors: CTXS_EINVAL (layer out of
 * range). */
CTXS_API int ctxs_session_get_layer_slots(uint32_t *out, const ctxs_session *s, uint32_t layer);

/* The [slots] scales of one (layer, CTXS_K|CTXS_V, head) of a
 * CTXS_DTYPE_Q8 session, writable as ctxs_session_get_kv()'s run is.
 * Errors: CTXS_EINVAL (index out of range, or a session of another dtype). */
CTXS_API int ctxs_session_get_scales(float **out, ctxs_session *s, uint32_t layer,
                                     uint32_t kind, uint32_t head);

/* Encodes n float32 values, one head of one token, as a session of dtype
 * (CTXS_DTYPE_F16, BF16 or Q8) stores them: what ctxs_session_write_token()
 * would store, bit for bit (rounded to nearest even; for Q8 quantized as
 * ctxs_dtype says). For an engine that writes K and V into the mapping
 * itself (ctxs_session_get_kv(), ctxs_session_get_scales()): n elements of
 * dtype go to out, and for Q8 the head's scale to *scale (which may be NULL
 * for the other dtypes). Errors: CTXS_EINVAL (NULL, n == 0 or above 4096,
 * another dtype, a value that is not finite for Q8); out is then
 * unspecified. Thread-safe. */
CTXS_API int ctxs_dtype_encode(void *out, float *scale, const float *in, uint32_t n,
                               uint32_t dtype);

/* --- Write path ----------------------------------------------------------- */

/* Slots handed out by ctxs_session_reserve(): tokens first_pos ..
 * first_pos + n_tokens - 1, in at most two slot spans (the ring wraps from
 * the last slot back to the first slot after the sinks). */
typedef struct ctxs_reservation {
    uint64_t first_pos;
    uint32_t n_tokens;
    uint32_t n_spans;
    struct {
        uint32_t slot;
        uint32_t count;
    } spans[2];
} ctxs_reservation;

/*
 * Writing K and V: three ways into the same slots.
 *
 * Between reserve and commit the engine puts the new tokens' K and V into
 * their slots. It can store them itself, through the mapping
 * (ctxs_session_get_kv(), ctxs_session_get_scales(), ctxs_dtype_encode()),
 * or hand them over: a layer of several tokens with
 * ctxs_session_write_layer(), the way a forward pass produces them, or one
 * token of every layer with ctxs_session_write_token(). The bytes are the
 * same either way; what differs is who pays for the pages. (Through the
 * mapping, a windowed layer's ring takes position p at its slot p % slots,
 * not at the reservation's: see ctxs_session_get_kv().)
 *
 * - Through the mapping, a store into a page that is not mapped writable
 *   takes a page fault on the engine's thread (about 3 us a 4 KiB page on
 *   Linux ext4, more than copying the page). The library maps the next
 *   turn's slots writable after each commit (the runway, see "Background
 *   work"), but the kernel write-protects every page it writes back, and
 *   its flusher writes back whatever has been dirty for 30 s
 *   (vm.dirty_expire_centisecs): after a pause of half a minute the next
 *   turn faults on every 4 KiB page it stores into.
 * - ctxs_session_write_layer() and ctxs_session_write_token() never fault
 *   the mapping on the caller's thread. Where the slots' pages are still
 *   mapped writable (a turn after a short pause) they convert straight
 *   into them, as fast as the stores above. Elsewhere they write each
 *   (layer, K|V, head) run of the call with one pwrite(2) into the page
 *   cache, which the mapping shows at once, at a cost that does not depend
 *   on what writeback did meanwhile. Where the system cannot tell which
 *   pages are still writable (Linux before 6.5, other systems) they always
 *   write through the file.
 * - ctxs_session_write_token() is that for one token:
 *   2 * n_layers * n_kv_heads system calls a token when it goes through
 *   the file. Use it for a token at a time, write_layer for more.
 *
 * - A file another program has read with read() (a backup, cp) is cached
 *   in folios of up to 2 MiB (ext4 since Linux 6.16), which the kernel
 *   writes back whole: a turn's 16 KiB of a run would write 2 MiB. The
 *   first commit after such a read finds them (asking the page cache, at
 *   most once a second, about pages past the slots the handle allocated),
 *   syncs the file and punches the slots past the held positions, which
 *   splits them; that commit costs a sync, the next ones cost as before.
 *
 * So an engine that has a layer's K/V in its own memory before attention
 * reads them (every CPU forward pass; a GPU engine that copies K/V back to
 * the host) calls ctxs_session_write_layer() for each layer; one whose
 * kernels must store in place writes through the mapping and pays the
 * faults after long pauses. README.md "Numbers" has the costs measured.
 */

/* Reserves slots for n more tokens after the committed ones (and after any
 * earlier reservation not yet committed) and allocates their disk blocks.
 * In a full ring the oldest tokens after the sinks are evicted first, and the
 * eviction is committed before this returns, so the engine may overwrite
 * their slots at once. The reserved pages are mapped writable ahead of the
 * engine's writes: by the background runway when it covers them and no
 * writeback has cleaned them since (then reserve costs microseconds), else
 * by the background thread, layer after layer, from this call on (here,
 * for a session without one).
 *
 * Errors: CTXS_EINVAL (n == 0, more than the ring holds, or, with windowed
 * layers, more uncommitted tokens than the session's batch), CTXS_EFULL
 * (no disk space, the capacity is reached and the session has no ring, or
 * the positions would pass 2^62 - 1, the most a file counts),
 * CTXS_EREADONLY, CTXS_EFAILED, -errno. Nothing is reserved on failure. */
CTXS_API int ctxs_session_reserve(ctxs_reservation *out, ctxs_session *s,
                                  uint32_t n);

/* Stores token i of reservation r from the layout engines commonly keep:
 * k and v are [n_layers][n_kv_heads][head_dim] arrays of dtype (see
 * ctxs_geometry_get_token_bytes()), which is CTXS_DTYPE_F32, F16 or BF16,
 * converted to the session's dtype (rounded to nearest even; a Q8 session
 * quantizes, see ctxs_dtype), or the session's own dtype, copied as it is
 * (for Q8: the int8 elements, then the scales). Non-finite values are
 * stored as they convert; a Q8 head with one is CTXS_EINVAL. It is
 * ctxs_session_write_layer() of one token for every layer, and takes the
 * same way into the slots (see "Writing K and V" above).
 * Errors: CTXS_EINVAL (i out of range, NULL, a dtype not listed, a
 * non-finite value for Q8), CTXS_EREADONLY, CTXS_EFAILED (including a
 * writeback error met since the last call), CTXS_ENOMEM, CTXS_EFULL or
 * -errno (a write into the file failed); as for write_layer, the token's
 * slots are then unspecified and nothing else changed. */
CTXS_API int ctxs_session_write_token(ctxs_session *s,
                                      const ctxs_reservation *r, uint32_t i,
                                      const void *k, const void *v,
                                      uint32_t dtype);

/* Stores tokens i .. i + n - 1 of reservation r for one layer, as a forward
 * pass produces them: k and v are each [n][n_kv_heads][head_dim] elements
 * of dtype, which is CTXS_DTYPE_F32, F16 or BF16, converted to the
 * session's dtype exactly as ctxs_session_write_token() converts them, bit
 * for bit (a Q8 session quantizes, see ctxs_dtype); or the session's own
 * dtype, copied as it is (for Q8: the [n][n_kv_heads][head_dim] int8
 * elements, then the [n][n_kv_heads] float32 scales). The bytes are in the
 * slots when it returns: an attention plan whose n_pending covers them
 * reads them, and so does the mapping. It never write-faults the mapping
 * on the caller's thread (see "Writing K and V" above). Tokens and layers
 * may be written in any order, and again; a commit takes what the slots
 * hold then.
 *
 * Errors: CTXS_EINVAL (NULL, layer out of range, n == 0, tokens past the
 * reservation or no longer reserved, a dtype not listed, a non-finite
 * value for Q8), CTXS_EREADONLY, CTXS_EFAILED (including a writeback error
 * met since the last call), CTXS_ENOMEM, CTXS_EFULL or -errno (a write
 * into the file failed, e.g. -EIO). After an error the slots of those
 * tokens in that layer hold unspecified bytes until a call that succeeds
 * writes them again; nothing committed changes, and the session stays
 * usable. Not thread-safe: one thread per handle. */
CTXS_API int ctxs_session_write_layer(ctxs_session *s,
                                      const ctxs_reservation *r, uint32_t layer,
                                      uint32_t i, uint32_t n, const void *k,
                                      const void *v, uint32_t dtype);

/* Copies the K and V of committed token pos into k and v, in the layout of
 * ctxs_session_write_token(), as dtype: CTXS_DTYPE_F32 (exact for every
 * session dtype; Q8 gives scale * q), the session's own dtype (the stored
 * bytes), or F16/BF16 from a session of F16 or BF16 (rounded to nearest
 * even). A windowed layer whose window no longer reaches pos reads as
 * zeros (its ring kept only its last positions). Errors: CTXS_EINVAL
 * (NULL, a dtype not listed), CTXS_EEVICTED (pos is no longer held),
 * CTXS_ENOTFOUND (pos is not committed). */
CTXS_API int ctxs_session_read_token(void *k, void *v,
                                     const ctxs_session *s, uint64_t pos,
                                     uint32_t dtype);

/* Commits the first n reserved tokens with their token ids: checksums them
 * (cost O(n)), writes the inactive commit record and syncs by the session's
 * durability (at ASYNC the writeback is started by the background thread,
 * or here when the session has none). Any reserved tokens past n are
 * released.
 *
 * Errors: CTXS_EINVAL (n == 0 or more than reserved, NULL ids),
 * CTXS_EREADONLY, CTXS_EFAILED (a sync or a write failed; the session is
 * unusable until reopened).
 * On CTXS_EINVAL or CTXS_EREADONLY nothing changed. On CTXS_EFAILED the
 * commit must be assumed lost, though it may be found committed on reopen
 * (a FULL commit whose last sync failed). */
CTXS_API int ctxs_session_commit(ctxs_session *s, const uint32_t *token_ids,
                                 uint32_t n);

/* Makes everything committed durable (as a FULL commit does), so a later
 * recovery after a power loss verifies nothing before this point. The
 * slots mapped ahead for the next turn are written back with the rest;
 * the background thread maps them again.
 * Errors: CTXS_EINVAL, CTXS_EREADONLY, CTXS_EFAILED. */
CTXS_API int ctxs_session_sync(ctxs_session *s);

/* Rolls the committed token count back to n_tokens. No KV is touched, but
 * the record, then the zeroed checksums of the dropped tokens, are made
 * durable before it returns (two small metadata syncs, at every level), so
 * that no power loss can mix the dropped tokens with those written next.
 * Errors: CTXS_EINVAL (n_tokens beyond the committed count),
 * CTXS_EEVICTED (the ring has overwritten tokens below n_tokens that the
 * rolled-back state would need), CTXS_EREADONLY, CTXS_EFAILED, -errno. */
CTXS_API int ctxs_session_rollback(ctxs_session *s, uint64_t n_tokens);

/* Re-reads the newest commit record, for a reader following a writer. A
 * record that no writer of this boot wrote is verified as at open.
 * Errors: CTXS_ECORRUPT (both records damaged), CTXS_EINVAL. */
CTXS_API int ctxs_session_refresh(ctxs_session *s);

/* Verifies the checksum of every held token. On a mismatch returns
 * CTXS_ECORRUPT and, if bad_pos is not NULL, the first bad position.
 * Reads the whole KV region. Errors: CTXS_EINVAL, CTXS_ECORRUPT. */
CTXS_API int ctxs_session_verify(uint64_t *bad_pos, const ctxs_session *s);

/* As ctxs_session_verify(), for the held positions in [from, to) only (to
 * is capped at the token count), so that a caller can verify in steps,
 * report progress, and go on past a bad token to find the next.
 * Errors: CTXS_EINVAL (from > to), CTXS_ECORRUPT (*bad_pos set). */
CTXS_API int ctxs_session_verify_range(uint64_t *bad_pos, const ctxs_session *s,
                                       uint64_t from, uint64_t to);

/* The slot that holds position pos. Errors: CTXS_EINVAL (NULL),
 * CTXS_EEVICTED, CTXS_ENOTFOUND (pos not committed). */
CTXS_API int ctxs_session_get_slot(uint32_t *out, const ctxs_session *s,
                                   uint64_t pos);

/* Copies the token ids of the committed positions [from, from + n) into
 * out[0..n), in position order: what the app committed there, to show the
 * conversation or tokenize after it without a table of its own. Reads the
 * session's token table (a reader sees it as of its last open or refresh,
 * with the caveat above on slots a writer rolls back or wraps over). n == 0
 * with from <= the committed count copies nothing and succeeds.
 * Errors: CTXS_EINVAL (s NULL, or out NULL with n > 0), CTXS_ENOTFOUND (the
 * range runs past the committed count), CTXS_EEVICTED (the ring overwrote
 * a position in it). Nothing is copied on error. */
CTXS_API int ctxs_session_get_tokens(uint32_t *out, const ctxs_session *s,
                                     uint64_t from, uint32_t n);

/* --- Info ----------------------------------------------------------------- */

#define CTXS_INFO_READONLY 0x01u  /* opened read-only */
#define CTXS_INFO_WRAPPED 0x02u   /* the ring has evicted tokens */
#define CTXS_INFO_RECOVERED 0x04u /* the last open fell back to an older or
                                     shorter state than the newest record */
#define CTXS_INFO_VERIFIED 0x08u  /* the last open verified tokens */
#define CTXS_INFO_FAILED 0x10u    /* a sync failed; reopen */
#define CTXS_INFO_PRESSURE 0x20u  /* the pressure window is in force */
#define CTXS_INFO_RING 0x40u      /* the session has a ring */
#define CTXS_INFO_PARTIAL_WINDOW 0x80u /* the window is smaller than what
                                     the session holds: attention does not
                                     read every held token */
#define CTXS_INFO_BACKGROUND 0x100u /* the handle has the background option:
                                     the library's thread reads the window
                                     ahead after the open (see "Background
                                     work"); without it, whatever reads the
                                     K/V first pays for bringing them in */

typedef struct ctxs_session_info {
    ctxs_model model;
    uint32_t format_major, format_minor;
    uint32_t capacity;
    uint32_t n_sink;
    uint64_t n_tokens;   /* tokens committed since the start (positions) */
    uint64_t ring_start; /* oldest position after the sinks still held */
    uint32_t n_held;     /* tokens held in slots */
    uint32_t n_reserved; /* reserved, not yet committed */
    uint32_t window;     /* recent tokens in the attention window now */
    uint32_t durability;
    uint64_t seq;        /* sequence number of the current commit record */
    uint64_t verified_from; /* positions below were durable at last sync */
    uint64_t lost_tokens;/* held tokens the last open's recovery dropped:
                            cut from the end, or evicted from the front of
                            a wrapped ring */
    uint64_t file_bytes; /* the file's logical size */
    uint64_t created_unix_ms;
    uint32_t flags;      /* CTXS_INFO_* */
    uint32_t reserved_;
} ctxs_session_info;

/* Fills *out. Errors: CTXS_EINVAL. */
CTXS_API int ctxs_session_get_info(ctxs_session_info *out,
                                   const ctxs_session *s);

/* --- Attention window ------------------------------------------------------
 *
 * Attention reads the sinks plus the last `window` tokens held, as at most
 * two contiguous slot spans; the spans are the same for every (layer, head)
 * of the global layers (a windowed layer's own window and slots:
 * ctxs_session_get_layer_attn()).
 */
typedef struct ctxs_window {
    uint32_t n_spans; /* 0, 1 or 2 */
    uint32_t n_tokens;/* slots in all spans */
    struct {
        uint32_t slot;
        uint32_t count;
    } spans[2];
} ctxs_window;

/* The current window. Errors: CTXS_EINVAL. */
CTXS_API int ctxs_session_get_window(ctxs_window *out, const ctxs_session *s);

/* Sets the window (recent tokens beside the sinks) outside memory pressure;
 * 0 means the capacity: every token held. The pressure window is not
 * changed. Errors: CTXS_EINVAL. */
CTXS_API int ctxs_session_set_window(ctxs_session *s, uint32_t window);

/* Brings the current window's K/V (of a sliding-window layer, its own
 * window where smaller; and a Q8 session's scale table) in and maps it,
 * and returns once it is in: every run of slots is read ahead first (POSIX_FADV_WILLNEED), then
 * mapped (MADV_POPULATE_READ), so that the disk reads sequentially instead
 * of one 4 KiB fault at a time (the KV region is mapped for random access,
 * so that writeback writes only what a turn wrote). The background thread
 * does the same after every open; this is for a session opened with
 * background = 0, or an app that would rather wait now than at its first
 * attention pass. Errors: CTXS_EINVAL. */
CTXS_API int ctxs_session_prefetch(const ctxs_session *s);

/* --- Memory pressure -------------------------------------------------------
 *
 * Under pressure every open session uses its pressure window (half its
 * window unless its options say otherwise) and the KV pages outside it are
 * released from memory with madvise (of a sliding-window layer, of the
 * schedule or of the attention windows above, those outside its own window
 * where that is smaller); they stay in the file and come back on the next
 * access. When the pressure is gone the windows grow back. New sessions
 * opened under pressure start with the small window. Nothing is deleted.
 */

/* Tells the library that the platform is (on != 0) or is no longer (on ==
 * 0) under memory pressure: Android's onTrimMemory, an iOS memory warning.
 * The state is the process's: it shrinks every open session of every
 * component of the program that uses ctxstore, not only the caller's, and
 * the windows of all of them grow back when it is cleared. Thread-safe. */
CTXS_API void ctxs_set_pressure(int on);

/* 1 when pressure is in force in the process, else 0. Thread-safe. */
CTXS_API int ctxs_get_pressure(void);

#define CTXS_WATCHER_OPTIONS_VERSION 1

typedef struct ctxs_watcher_options {
    uint32_t version;          /* CTXS_WATCHER_OPTIONS_VERSION */
    uint32_t poll_ms;          /* how often to look */
    uint64_t min_available;    /* pressure while MemAvailable is below;
                                  released above 1.25x */
    uint32_t psi_some_avg10;   /* pressure while PSI memory "some avg10" is at
                                  or above this percent; 0 = ignore PSI */
    uint8_t reserved[28];      /* must be zero */
} ctxs_watcher_options;

#define CTXS_WATCHER_OPTIONS_INIT                                              \
    { CTXS_WATCHER_OPTIONS_VERSION, CTXS_DEFAULT_POLL_MS,                     \
      CTXS_DEFAULT_MIN_AVAILABLE, CTXS_DEFAULT_PSI_SOME_AVG10, { 0 } }
/* Fills *opts with the defaults of version (CTXS_WATCHER_OPTIONS_INIT for
 * version 1). Errors: CTXS_EINVAL (opts NULL, or a version this library
 * does not know). Thread-safe. */
CTXS_API int ctxs_watcher_options_init(ctxs_watcher_options *opts, uint32_t version);

/* Starts a thread that watches available memory (Linux: /proc/meminfo and
 * /proc/pressure/memory) and calls ctxs_set_pressure() on changes, so it
 * sets the process-wide state (see there); while it runs, its reading
 * decides (it sets the state once at start). One watcher per process, not
 * inherited across fork(); opts may be NULL for CTXS_WATCHER_OPTIONS_INIT.
 * Errors: -EALREADY, -ENOTSUP where the platform has no source,
 * CTXS_EINVAL, -errno. Thread-safe. */
CTXS_API int ctxs_watcher_start(const ctxs_watcher_options *opts);

/* Stops the watcher and waits for its thread; the pressure state it set
 * stays until ctxs_set_pressure(). Safe to call when none runs. */
CTXS_API void ctxs_watcher_stop(void);

/* ---------------------------------------------------------------------------
 * Attention
 *
 * Kernels that read K and V where they lie: in the session's mapping (the
 * CPU kernel below), through CUDA host registration or a device mirror
 * (ctxstore_cuda.h), or a Metal no-copy buffer (ctxstore_metal.h). All of
 * them take the same plan: the slots one attention pass reads, in position
 * order. K is stored as the engine wrote it (after RoPE, if the model has
 * it); the kernels apply no position encoding.
 */
#define CTXS_ATTN_MAX_SPANS 4

/* A run of consecutive slots holding consecutive positions. */
typedef struct ctxs_attn_span {
    uint64_t pos;   /* position of the token in `slot` */
    uint32_t slot;  /* first slot */
    uint32_t count; /* slots, holding positions pos .. pos + count - 1 */
} ctxs_attn_span;

typedef struct ctxs_attn_plan {
    uint64_t n_tokens;    /* positions 0 .. n_tokens - 1: committed + pending */
    uint64_t first_query; /* the lowest query position the plan serves */
    uint32_t n_sink;      /* positions below n_sink are attention sinks */
    uint32_t window;      /* recent positions each query reads, itself included */
    uint32_t n_spans;     /* 0 .. CTXS_ATTN_MAX_SPANS, ascending positions */
    uint32_t n_keys;      /* slots in all spans */
    ctxs_attn_span spans[CTXS_ATTN_MAX_SPANS];
} ctxs_attn_plan;

/* The plan for the engine's next attention passes: the committed tokens and
 * the first n_pending tokens of the current reservation, whose K and V the
 * engine must have written before a kernel reads the plan. It serves queries
 * at positions from first_query (the first pending token, or with
 * n_pending == 0 the last committed one, which an engine recomputes after a
 * resume) to n_tokens - 1. It uses the session's window as it is now (the
 * pressure window under memory pressure), and is valid until the next
 * reserve, commit, rollback or refresh. The same plan serves every layer.
 * Errors: CTXS_EINVAL (NULL, n_pending above what is reserved, or no token
 * at all to attend to). */
CTXS_API int ctxs_session_get_attn_plan(ctxs_attn_plan *out, const ctxs_session *s,
                                        uint32_t n_pending);

/* What attention reads in one layer, for a session of any schedule: *kv
 * gets the layer alone, as a one-layer layout (pass layer 0 to the
 * kernels: its geometry has n_layers 1 and no schedule; its capacity and
 * n_sink are the layer's slots, a windowed layer's own ring having no
 * sinks; token_ids is NULL for such a ring, whose slots are not the
 * token table's), and *plan the plan for it as ctxs_session_get_attn_plan()
 * makes one: for a global layer that very plan; for a sliding-window
 * layer (of the schedule, or of the open options' attn_window) its last
 * min(window, the session's window) positions and no sinks. Valid as the
 * plan is. Errors: CTXS_EINVAL (NULL, layer out of range, n_pending above
 * what is reserved, no token at all). */
CTXS_API int ctxs_session_get_layer_attn(ctxs_layout *kv, ctxs_attn_plan *plan,
                                         const ctxs_session *s, uint32_t layer,
                                         uint32_t n_pending);

/* Queries of one attention pass. */
typedef struct ctxs_attn_query {
    const float *q;   /* [n][n_heads][head_dim] float32 */
    uint64_t pos;     /* position of the first query */
    uint32_t n;       /* queries: 1 to decode, more for a causal prefill */
    uint32_t n_heads; /* query heads, a multiple of the KV heads (GQA):
                         query head h reads KV head h / (n_heads / n_kv_heads) */
    float scale;      /* softmax scale; 0 means 1 / sqrt(head_dim) */
} ctxs_attn_query;

/* Attention of one layer on the CPU: query i, at position p = q->pos + i,
 * reads the plan's keys at positions up to p that are sinks or among the
 * last `window` positions up to p; softmax in float32, stable (max
 * subtracted); out[i][h] = sum of softmax weights times V. out is
 * [n][n_heads][head_dim] float32 and must not overlap q.
 *
 * kv is a session's layout (ctxs_session_get_layout()) or a copy of it whose kv
 * points at the same bytes elsewhere (anonymous memory, a snapshot); its
 * dtype is F16, BF16 or Q8 (whose scales are read from kv->scales), all
 * read in place. Elements widen to float32 exactly (bf16 by a 16-bit
 * shift, int8 as is); a Q8 scale is applied once per key and head: the
 * score is scale_k * sum(q[i] * k[i]) times the softmax scale, and V is
 * added with the weight p * scale_v. Against the floats a Q8 session was
 * quantized from (each element off by at most amax/254 of its token and
 * head), a key's score is off by at most d_j = softmax_scale *
 * sum_i |q[i]| * amax_kj / 254, and with d = max_j d_j each output element
 * by at most (e^(2d) - 1) * sum_j p_j |v_j[i]| + max_j amax_vj / 254
 * (plus float32 rounding; derived in tests/test_attention.c, where it is
 * checked). The result depends only on the keys each
 * query reads, in position order, not on how they split into spans, nor on
 * n: a token recomputed after a resume gets bit-identical output on the same
 * machine. The instruction set (AVX-512, AVX2+F16C, NEON, or portable C) is
 * chosen once, at the first call, from what the CPU has.
 *
 * A query that sees no key (only a plan built by hand can do that: a plan
 * from ctxs_session_get_attn_plan() holds each query's own position) gets
 * zeros. Bits may differ between instruction sets; on one machine and one
 * instruction set they do not.
 *
 * Errors: CTXS_EINVAL (NULL, layer out of range, n == 0, n_heads not a
 * multiple of the KV heads, queries outside [first_query, n_tokens), a plan
 * whose spans fall outside the capacity, overlap or are not in ascending
 * positions, or whose n_keys is not the sum of its counts; a layout of a
 * session whose schedule has windowed layers (its layers differ: take
 * each from ctxs_session_get_layer_attn()); a layout whose
 * slot_bytes is not head_dim times the element size, whose pointers or
 * strides are not aligned to the element (4 bytes for the scales), or whose
 * layer does not fit in kv_bytes (nor its scales in scales_bytes); a dtype
 * other than F16, BF16 and Q8). out is untouched on error. The kernel allocates nothing.
 * Thread-safe: threads may run passes over the same mapping at once. */
CTXS_API int ctxs_attention(float *out, const ctxs_layout *kv,
                            const ctxs_attn_plan *plan, uint32_t layer,
                            const ctxs_attn_query *q);

/* Checks the arguments of an attention pass as ctxs_attention() does,
 * except q->q (which a GPU kernel may take from elsewhere), and sets
 * *scale_out to the softmax scale to use: q->scale, or 1 / sqrt(head_dim)
 * rounded to float when it is 0. For kernels outside this library (CUDA,
 * Metal), so that every kernel accepts and refuses the same passes and
 * scales by the same float. Errors: CTXS_EINVAL, as ctxs_attention().
 * Thread-safe. */
CTXS_API int ctxs_attention_check(float *scale_out, const ctxs_layout *kv,
                                  const ctxs_attn_plan *plan, uint32_t layer,
                                  const ctxs_attn_query *q);

/* The instruction set ctxs_attention() uses: "avx512", "avx2", "neon" or
 * "portable". Thread-safe. */
CTXS_API const char *ctxs_attention_get_isa(void);

/* ---------------------------------------------------------------------------
 * Stores
 *
 * A store is a directory: index/ holds an LMDB environment that knows
 * sessions by name, models, checkpoints and shared prefixes; sessions/ holds
 * one file per session, named from its id (never from its name). The files
 * are the truth for data; the index is derived from them and ctxs_store_reindex()
 * rebuilds it. Several processes and threads may use one store at once.
 *
 * Names (sessions, checkpoints, models' display names) are UTF-8 text of 1
 * to CTXS_NAME_MAX bytes without control characters, '/' or ".." anywhere, and not
 * ".": CTXS_EINVAL otherwise. Names never become paths; the rule keeps them
 * from looking like one wherever tools print or export them.
 * ctxs_name_check() says why a name is refused; CTXS_NAME_RULE is the
 * rule in words.
 *
 * Caveats:
 *
 * - A ctxs_store handle is thread-safe: every function taking one may be
 *   called from any thread at once. Opening the same store twice in one
 *   process shares one LMDB environment. A session handle is used by one
 *   thread at a time.
 * - After fork(), the child must not use or close a store handle of its
 *   parent; it opens its own.
 * - Session handles opened through a store must be closed before the store.
 * - Any call below that reads the index may fail with CTXS_EINDEX where a
 *   page or record of the index is damaged (ctxs_store_open() says how to
 *   get out); the lists of errors below leave it out. CTXS_ECORRUPT is
 *   always about a session file.
 * - Through a store opened with CTXS_RDONLY, every call below that
 *   would write the index or a session file fails with CTXS_EREADONLY and
 *   changes nothing: creates, read-write opens, forks, imports, renames,
 *   deletes, pins, model registrations, checkpoint creates, restores and
 *   deletes, metadata changes, gc (but for a dry run), repair, reindex and
 *   compact.
 */
typedef struct ctxs_store ctxs_store;

/* Checks name against the rule above: NULL when it is a valid name, else a
 * static sentence that says why not, to follow the name in a message
 * ("contains '/'", "is longer than 255 bytes", "is not valid UTF-8", "is
 * empty", "is missing (NULL)", ...). Every call that takes a name refuses
 * with CTXS_EINVAL exactly the names this refuses. Thread-safe. */
CTXS_API const char *ctxs_name_check(const char *name);

#define CTXS_STORE_OPTIONS_VERSION 1

typedef struct ctxs_store_options {
    uint32_t version;      /* CTXS_STORE_OPTIONS_VERSION */
    uint32_t max_readers;  /* concurrent read transactions */
    uint64_t map_bytes;    /* most bytes the index may grow to (address
                              space, not disk) */
    uint8_t reserved[32];  /* must be zero */
} ctxs_store_options;

#define CTXS_STORE_OPTIONS_INIT                                                \
    { CTXS_STORE_OPTIONS_VERSION, CTXS_DEFAULT_MAX_READERS,                   \
      CTXS_DEFAULT_MAP_BYTES, { 0 } }
/* Fills *opts with the defaults of version (CTXS_STORE_OPTIONS_INIT for
 * version 1). Errors: CTXS_EINVAL (opts NULL, or a version this library
 * does not know). Thread-safe. */
CTXS_API int ctxs_store_options_init(ctxs_store_options *opts, uint32_t version);

/* The flags of ctxs_store_open(), besides CTXS_RDONLY (read the store,
 * never write it). */
#define CTXS_STORE_CREATE 0x2u /* make the store where there is none */

/* Opens the store in directory dir. A store is a directory holding index/
 * with a ctxstore index (an LMDB environment: index/data.mdb) and
 * sessions/.
 *
 * Without CTXS_STORE_CREATE, nothing is created where no store is: a
 * missing dir is -ENOENT, and a directory that is neither a store nor a
 * half-made one is CTXS_EFOREIGN. A half-made store has index/data.mdb but
 * no sessions/: creating a store makes index/ first, so this is what a
 * create that died (or a sessions/ removed by hand) leaves. A read-write
 * open makes sessions/ again; a read-only one fails with -ENOENT. A
 * directory with sessions/ and no index (index/ removed: the index was
 * lost) is not taken for a store: CTXS_EFOREIGN, so that no directory that
 * merely has a sessions/ gets an index; open it with CTXS_STORE_CREATE to
 * rebuild the index from the session files.
 *
 * dir may be a symbolic link to the store's directory, or a chain of
 * them: it is resolved once, here (realpath), and the handle knows the
 * store by its real path and by the device and inode of the directory, so
 * two paths to one store are one store (see "One process shares" below).
 * A link that leads nowhere is -ENOENT, with CTXS_STORE_CREATE too (no
 * store is made at the far end of a link), a loop -ELOOP. index/ and
 * sessions/ inside the store are never followed as links.
 *
 * With CTXS_STORE_CREATE, a missing dir is made (0700; files 0600) and so
 * are index/ and sessions/ in an existing one. A new index beside session
 * files is rebuilt from them, as ctxs_store_reindex() does.
 *
 * A read-write open finishes or undoes what a process that crashed left
 * half done: a session file created but not indexed, or dropped from the
 * index but not yet deleted (ctxs_store_intent_list() says what it would
 * do). The directories it makes are durable when it returns.
 *
 * With CTXS_RDONLY (not with CTXS_STORE_CREATE) the store is only
 * read: the index is opened read-only, what crashes left is left as it is,
 * and every call that would write the index or a session file fails with
 * CTXS_EREADONLY (sessions are opened with CTXS_RDONLY only; gc runs
 * only with CTXS_GC_DRY_RUN; ctxs_model_hash_file() does not cache). It
 * needs read access alone: where LMDB's lock file (index/lock.mdb) cannot
 * be opened for writing, on a read-only filesystem the index is read
 * without locks, which is safe since nobody can write it; elsewhere (the
 * user may read the store but not write it) the same is done only when
 * no other process has the store open at that moment, else CTXS_EBUSY.
 * Caveat: such a lock-less handle is not seen by the store's writers, so a
 * process that opens the store read-write afterwards and writes it while
 * the handle reads may make the handle's reads fail or see a mix of two
 * states of the index (the session files are checked on open as always).
 *
 * One process shares one LMDB environment between its handles to a store:
 * a read-only open while the store is open read-write in the process
 * shares its environment (the handle still refuses writes); a read-write
 * open while it is open only read-only is CTXS_EBUSY.
 *
 * The index is checked before LMDB reads any of it: index/data.mdb must
 * hold every page its meta pages claim (a file cut short, say a backup
 * restored short or a copy onto a full disk, would otherwise kill the
 * process with SIGBUS), both meta pages must be intact, every page of
 * every tree the current meta reaches must be one LMDB can read without
 * leaving it (its header, node offsets, key and data sizes, overflow
 * runs, tables' and duplicates' roots and sub-pages; no cycle) or that a
 * writer can change without harm (page and tree flags as LMDB writes
 * them, duplicates of the size the table holds, free lists naming only
 * free pages, once each, a transaction id below 2^63), and the index's
 * format record must be whole. The files of index/ (data.mdb, lock.mdb,
 * store.lock) must be regular files: a FIFO, socket, device, directory
 * or symbolic link there is CTXS_EINDEX at once (it is never opened as
 * the file, nor a link followed out of the store, so no open blocks on
 * one), and ctxs_store_repair_index() mends it. The page check reads every page
 * the trees use, by pread(), on the first open of the store in a process
 * (measured: about 3 ms for a 7.7 MB index, page cache warm). Another
 * process committing meanwhile never makes it report damage. A damaged index is CTXS_EINDEX, never
 * CTXS_ECORRUPT (which is about a session file): the session files are
 * not touched and not at fault. The way out: ctxs_store_repair_index()
 * (`ctxstore repair-index`), which moves the damaged index aside,
 * rebuilds the index from the session files and puts back what of the
 * damaged one still reads: names, checkpoints, metadata, pins and models'
 * display names, saying what it kept and lost. What no check of the
 * layout sees -- records of the right shape with wrong contents, keys out
 * of order -- is found by whichever call reads them: CTXS_EINDEX as well
 * (ctxs_store_check() judges every record).
 *
 * Errors: -ENOENT (no dir, or a dangling link; a half-made store opened
 * read-only), -ELOOP (a loop of links), -ENOTDIR, CTXS_EFOREIGN (not a store, or index/ holds something that is
 * not a ctxstore index), CTXS_EINDEX (the index is damaged: see above),
 * CTXS_EVERSION (an index written by a newer major version), CTXS_EBUSY
 * (see above), CTXS_EINVAL (bad options, unknown flags, CREATE with
 * RDONLY), CTXS_ENOMEM, -EACCES, -errno. *out is NULL on failure.
 * Thread-safe. */
CTXS_API int ctxs_store_open(ctxs_store **out, const char *dir, unsigned flags,
                             const ctxs_store_options *opts);

/* Closes the handle. Accepts NULL. */
CTXS_API void ctxs_store_close(ctxs_store *st);

/* --- Registered models -------------------------------------------------- */

typedef struct ctxs_model_entry {
    ctxs_model model;
    char name[CTXS_NAME_MAX + 1];              /* display name, NUL-terminated */
    uint64_t registered_unix_ms;
} ctxs_model_entry;

/* Registers model under its model hash with a display name (may be NULL).
 * Registering the same model again updates the display name; the same hash
 * with another geometry or tokenizer hash is CTXS_EMODEL.
 * Errors: CTXS_EMODEL, CTXS_EINVAL, CTXS_EFULL (index full),
 * CTXS_EREADONLY, -errno. */
CTXS_API int ctxs_model_register(ctxs_store *st, const ctxs_model *model,
                                 const char *name);

/* Looks a model up by its hash. Errors: CTXS_ENOTFOUND, CTXS_EINVAL. */
CTXS_API int ctxs_model_get(ctxs_model_entry *out, ctxs_store *st,
                            const uint8_t model_hash[CTXS_HASH_BYTES]);

/* All registered models, in hash order: *out is an array of *n_out entries
 * to release with ctxs_free() (NULL when there are none).
 * Errors: CTXS_ENOMEM, CTXS_EINVAL. */
CTXS_API int ctxs_model_list(ctxs_model_entry **out, size_t *n_out,
                             ctxs_store *st);

/* XXH3-128 of the file at path, read in a stream. With a store, the result
 * is cached under the file's device, inode, size and modification time, so
 * an unchanged file is hashed once; st may be NULL.
 * Errors: -errno from open or read, CTXS_EINVAL, CTXS_ENOMEM. */
CTXS_API int ctxs_model_hash_file(uint8_t out[CTXS_HASH_BYTES], ctxs_store *st,
                                  const char *path);

/* A tokenizer hash (for ctxs_model.tokenizer_hash) of the vocabulary file
 * at path (tokenizer.json, tokenizer.model, ...): XXH3-128 of its bytes in
 * a domain of its own (seeded), so that a file never gets the hash that
 * ctxs_model_hash_file() gives it. Cached as ctxs_model_hash_file() caches,
 * apart from weights hashes; st may be NULL.
 * Errors: -errno from open or read, -EISDIR, CTXS_EINVAL (NULL, or not a
 * regular file), CTXS_ENOMEM. */
CTXS_API int ctxs_tokenizer_hash_file(uint8_t out[CTXS_HASH_BYTES],
                                      ctxs_store *st, const char *path);

/* A tokenizer hash of the token strings of a vocabulary, in id order:
 * tokens[i] is the bytes of id i, lengths[i] bytes long (lengths NULL:
 * each is NUL-terminated). Each token is hashed after its length, so
 * ["ab", "c"] and ["a", "bc"] differ; the domain differs from both file
 * hashes. Nothing is cached: it reads only memory.
 * Errors: CTXS_EINVAL (out NULL, tokens NULL with n > 0, a NULL token with
 * a nonzero length or without lengths), CTXS_ENOMEM. Thread-safe. */
CTXS_API int ctxs_tokenizer_hash_strings(uint8_t out[CTXS_HASH_BYTES],
                                         const char *const *tokens,
                                         const size_t *lengths, size_t n);

/* Releases an array returned by a listing function. Accepts NULL. */
CTXS_API void ctxs_free(void *p);

/* --- Sessions by name ------------------------------------------------------ */

typedef struct ctxs_session_entry {
    char name[CTXS_NAME_MAX + 1];            /* NUL-terminated */
    uint64_t id;               /* the file is sessions/<id as 16 hex digits>.ctxs */
    uint8_t model_hash[CTXS_HASH_BYTES];
    uint64_t n_tokens;         /* as of the last index update: a close, a
                                  batch of prefixes, a fork */
    uint64_t disk_bytes;       /* disk space the file used then */
    uint64_t created_unix_ms;
    uint64_t last_used_unix_ms;/* create, last close of a read-write handle
                                  through a store, or last fork from it */
    uint64_t parent_id;        /* the session it was forked from, or 0 */
    uint64_t fork_tokens;      /* tokens taken from the parent */
    uint32_t pinned;           /* 1: gc never deletes it (ctxs_store_session_set_pinned()) */
    uint32_t reserved_;
} ctxs_session_entry;

/* Creates a session named name for model, which must be registered, and
 * opens it read-write. The file is created first and indexed second.
 * Errors: CTXS_ETAKEN (the name is taken), CTXS_ENOMODEL (the model is not
 * registered), CTXS_EMODEL (registered with another geometry),
 * CTXS_EREADONLY, the errors of ctxs_session_create(). *out is NULL on
 * failure. Thread-safe. */
CTXS_API int ctxs_store_session_create(ctxs_session **out, ctxs_store *st,
                                       const char *name,
                                       const ctxs_model *model,
                                       const ctxs_create_options *opts);

/* Opens the session named name, as ctxs_session_open() does (model may be
 * NULL only with CTXS_RDONLY). A read-write open indexes the prefixes
 * of tokens committed after the last index update (after a crash).
 * With a remote attached (ctxs_remote_open(), pull_on_open) to a store
 * that is not read-only, a name the store lacks is pulled from Redis
 * first (ctxs_remote_pull()), then opened: a conversation that began on
 * another machine resumes here. The pulled session may hold fewer tokens
 * than the conversation (chunks evicted): compare its n_tokens with the
 * conversation and prefill the rest. Where Redis has no such session or
 * cannot be reached, the open fails with CTXS_ENOTFOUND as without a
 * remote (the remote's stats keep the network error in last_error).
 * Errors: CTXS_ENOTFOUND (no such name, or its file is gone), CTXS_EMODEL,
 * CTXS_EREADONLY (a read-only store, without CTXS_RDONLY), the
 * errors of ctxs_session_open(). *out is NULL on failure. */
CTXS_API int ctxs_store_session_open(ctxs_session **out, ctxs_store *st,
                                     const char *name, const ctxs_model *model,
                                     unsigned flags,
                                     const ctxs_open_options *opts);

/* Fills *out for the session named name. Errors: CTXS_ENOTFOUND, CTXS_EINVAL. */
CTXS_API int ctxs_store_session_get(ctxs_session_entry *out, ctxs_store *st,
                                    const char *name);

/* All sessions, in name order: an array to release with ctxs_free().
 * Errors: CTXS_ENOMEM, CTXS_EINVAL. */
CTXS_API int ctxs_store_session_list(ctxs_session_entry **out, size_t *n_out,
                                     ctxs_store *st);

/* Renames a session; open handles stay valid, and so does its pin.
 * Errors: CTXS_ENOTFOUND, CTXS_ETAKEN (to is taken), CTXS_EINVAL,
 * CTXS_EREADONLY, -errno. */
CTXS_API int ctxs_store_session_rename(ctxs_store *st, const char *from,
                                       const char *to);

/* Deletes a session, its checkpoints, metadata, prefixes and pin: the
 * index first, then the file. A pinned session is deleted too: the pin only
 * keeps gc away. Errors: CTXS_ENOTFOUND, CTXS_EBUSY (a handle, writer or
 * reader, in any process has it open), CTXS_EREADONLY, -errno. */
CTXS_API int ctxs_store_session_delete(ctxs_store *st, const char *name);

/* Pins (pinned = 1) or unpins (0) the session named name: ctxs_store_gc()
 * never deletes a pinned session. The pin belongs to the session, not to
 * its name: it stays through a rename, a reindex and a compaction, and
 * goes with the session. Pinning a pinned session, or unpinning one that
 * is not, changes nothing and returns 0.
 * Errors: CTXS_ENOTFOUND, CTXS_EINVAL (bad name, pinned neither 0 nor 1),
 * CTXS_EREADONLY, CTXS_EFULL, -errno. Thread-safe. */
CTXS_API int ctxs_store_session_set_pinned(ctxs_store *st, const char *name, int pinned);

/* --- Metadata ----------------------------------------------------------------
 *
 * What an app keeps beside a conversation's tokens: its title, chat
 * template, sampler settings, the app's own JSON. Each session has a map
 * from keys (names, under the rule above) to values (any bytes, empty
 * included), kept in the index with the session:
 *
 * - a rename keeps it; a delete (and gc) deletes it with the session;
 *   ctxs_store_reindex() and ctxs_store_repair() keep it for every session
 *   whose file is still there;
 * - a fork does NOT copy it: a fork is a new conversation (and a prefix
 *   match forks another conversation's tokens, whose title and settings
 *   are not the new one's); copy what should carry over with these calls;
 * - export and import carry it (export format 2.0).
 *
 * A value holds at most CTXS_META_VALUE_MAX bytes, and a session's keys and
 * values together at most CTXS_META_SESSION_MAX bytes: CTXS_ETOOBIG past
 * either, and nothing changes. The map is not meant for the conversation's
 * text (the KV and token ids are), nor for anything large. Every call is
 * one transaction and thread-safe; a session open by a writer may have its
 * metadata read and changed meanwhile.
 */
#define CTXS_META_VALUE_MAX (64u << 10)    /* bytes of one value */
#define CTXS_META_SESSION_MAX (256u << 10) /* bytes of a session's keys and
                                              values together */

typedef struct ctxs_meta_entry {
    char key[CTXS_NAME_MAX + 1]; /* NUL-terminated */
    const void *value;   /* value_bytes bytes, then a NUL not counted (so
                            that a text value prints as a C string); in the
                            listing's own allocation */
    size_t value_bytes;
} ctxs_meta_entry;

/* Sets key of the session named name to value_bytes bytes of value
 * (value_bytes may be 0), replacing what it held; with value NULL (and
 * value_bytes 0) deletes key.
 * Errors: CTXS_ENOTFOUND (no such session; or, deleting, no such key),
 * CTXS_ETOOBIG (value above CTXS_META_VALUE_MAX, or the session's keys and
 * values would pass CTXS_META_SESSION_MAX), CTXS_EINVAL (NULL st, a name
 * or key that breaks the name rule, value NULL with value_bytes > 0),
 * CTXS_EFULL (index full), CTXS_EREADONLY, -errno. Nothing changes on
 * error. Thread-safe. */
CTXS_API int ctxs_store_session_set_meta(ctxs_store *st, const char *name,
                                         const char *key, const void *value,
                                         size_t value_bytes);

/* Reads key of the session named name. *value_bytes is, on entry, the
 * size of the buffer out, and receives the value's size. With out NULL
 * only the size is given; a buffer of CTXS_META_VALUE_MAX bytes always
 * holds a value. Errors: CTXS_ENOTFOUND (no such session or key), -ERANGE
 * (the value is larger than *value_bytes said: nothing copied,
 * *value_bytes set to its size), CTXS_EINVAL (NULL value_bytes or st, a
 * bad name or key), CTXS_EINDEX (a damaged record), -errno. Thread-safe. */
CTXS_API int ctxs_store_session_get_meta(void *out, size_t *value_bytes,
                                         ctxs_store *st, const char *name,
                                         const char *key);

/* Every key and value of the session named name, in key order (bytewise):
 * *out is an array of *n_out entries whose values lie in the same
 * allocation, released with one ctxs_free(*out) (NULL when there are
 * none). One consistent snapshot. Errors: CTXS_ENOTFOUND (no such
 * session), CTXS_EINVAL, CTXS_ENOMEM, CTXS_EINDEX (a damaged record).
 * Thread-safe. */
CTXS_API int ctxs_store_session_list_meta(ctxs_meta_entry **out, size_t *n_out,
                                          ctxs_store *st, const char *name);

/* --- Checkpoints -------------------------------------------------------- */

typedef struct ctxs_checkpoint_entry {
    char name[CTXS_NAME_MAX + 1];        /* NUL-terminated */
    uint64_t n_tokens;
    uint64_t created_unix_ms;
    uint32_t stale;        /* 1: the session no longer holds these tokens
                              (overwritten by the ring, or rolled back and
                              written again); restore and fork refuse it */
    uint32_t reserved_;
} ctxs_checkpoint_entry;

/* Checkpoints name token counts of a session opened through a store, by
 * name of the checkpoint; every call takes the session's handle (a
 * read-only one will do for all but a restore).
 *
 * Names the current token count of s. A checkpoint remembers the checksum
 * of its last token, so that a restore after the tokens were rolled back
 * and written differently is refused.
 * Errors: CTXS_ETAKEN (s has a checkpoint of that name), CTXS_EINVAL (s not
 * opened through a store, bad name),
 * CTXS_EREADONLY (the store is read-only), -errno. */
CTXS_API int ctxs_checkpoint_create(ctxs_session *s, const char *name);

/* Rolls s (read-write) back to the checkpoint, in O(1).
 * Errors: CTXS_ENOTFOUND, CTXS_EEVICTED (the ring overwrote its tokens),
 * CTXS_ESTALE (rolled back past it, or its tokens were written again),
 * CTXS_EREADONLY, the errors of ctxs_session_rollback(). */
CTXS_API int ctxs_checkpoint_restore(ctxs_session *s, const char *name);

/* The checkpoints of s, in name order, each marked stale or not as of s's
 * current state: an array to release with ctxs_free() (NULL when there are
 * none). Errors: CTXS_ENOMEM, CTXS_EINVAL (s not opened through a store). */
CTXS_API int ctxs_checkpoint_list(ctxs_checkpoint_entry **out, size_t *n_out,
                                  const ctxs_session *s);

/* Deletes a checkpoint of s. Errors: CTXS_ENOTFOUND, CTXS_EINVAL,
 * CTXS_EREADONLY (the store is read-only). */
CTXS_API int ctxs_checkpoint_delete(ctxs_session *s, const char *name);

/* --- Forks ----------------------------------------------------------------
 *
 * Every fork takes its source before the new session, as `cp SRC DST` and
 * `ctxstore fork SRC DST` do (out, the handle, comes first as everywhere).
 */

/* Creates the session name holding the first n_tokens tokens of the session
 * src (UINT64_MAX: all it holds) and opens it read-write (out may be NULL
 * to leave it closed). See ctxs_session_fork() for how the bytes travel;
 * src may be open by a writer meanwhile.
 * Errors: CTXS_ETAKEN, CTXS_ENOTFOUND, CTXS_EEVICTED, CTXS_ESTALE, CTXS_EBUSY (a
 * gc, compact or delete is working on src), the errors of
 * ctxs_session_fork(). */
CTXS_API int ctxs_store_session_fork(ctxs_session **out, ctxs_store *st,
                                     const char *src, const char *name,
                                     uint64_t n_tokens,
                                     const ctxs_open_options *opts);

/* As ctxs_store_session_fork(), at a checkpoint of src. Errors: also
 * CTXS_ESTALE and CTXS_EEVICTED for a stale checkpoint. */
CTXS_API int ctxs_store_session_fork_checkpoint(ctxs_session **out,
                                                ctxs_store *st,
                                                const char *src,
                                                const char *checkpoint,
                                                const char *name,
                                                const ctxs_open_options *opts);

/* --- Shared prefixes -------------------------------------------------------
 *
 * Every CTXS_PREFIX_CHUNK committed tokens from the start of a session, a
 * chained hash of the token ids so far is indexed under the model hash.
 * Entries are written in batches off the commit path: when a session's first
 * chunk completes, then every 16 chunks, at close, and at the next
 * read-write open after a crash. A crash can delay when a prefix is found;
 * it never makes a wrong one found: every match is checked against the
 * session file's token ids before it is returned.
 */
#define CTXS_PREFIX_CHUNK 64u

typedef struct ctxs_prefix_match {
    char session[CTXS_NAME_MAX + 1];     /* the session that holds the prefix */
    uint64_t n_tokens;     /* how many leading tokens of the prompt it holds */
} ctxs_prefix_match;

/* Finds the session holding the longest prefix of tokens[0..n) for the model
 * with hash model_hash: a binary search over chunk boundaries (O(log n)
 * index reads), then the tokens after the last whole chunk are compared with
 * the file's. Fork the match (ctxs_store_session_fork() at out->n_tokens) and
 * prefill only the rest. At least one whole chunk must match.
 *
 * The match counts only tokens an open of the session keeps, so that the
 * fork at it succeeds unless the session changes in between: after a power
 * loss, the tokens its newest record claims above its durability watermark
 * are verified against their checksums first, as the open that a fork
 * makes would (it reads their KV; once the session has been opened
 * read-write, its records vouch for them again and nothing is read). With
 * windowed layers a fork needs their windows at the match, which their
 * rings keep only near the session's end: a fork of an earlier match fails
 * with CTXS_EEVICTED.
 * Errors: CTXS_ENOTFOUND (no match), CTXS_EINVAL, CTXS_ENOMEM. Thread-safe. */
CTXS_API int ctxs_prefix_find(ctxs_prefix_match *out, ctxs_store *st,
                              const uint8_t model_hash[CTXS_HASH_BYTES],
                              const uint32_t *tokens, uint64_t n);

/* --- Inspecting files ------------------------------------------------------
 *
 * For tools: what a session file says about itself, read without opening it
 * as a session, so that a file that does not open can still be described.
 */
typedef struct ctxs_record_report {
    int32_t status;        /* 0 valid, CTXS_ECORRUPT (magic, index, CRC or
                              ranges wrong) */
    uint32_t current;      /* 1 for the record open would take */
    uint64_t seq;
    uint64_t n_tokens;
    uint64_t ring_start;
    uint64_t verified_from;
    uint64_t written_unix_ms;
    uint32_t this_boot;    /* 1 when written under the running boot */
    uint32_t boot_known;   /* 0: no boot id, as after a failed sync (the
                              next open verifies, as after a power loss) */
} ctxs_record_report;

typedef struct ctxs_file_report {
    int32_t status;        /* 0, or why the file does not open: CTXS_EFOREIGN,
                              CTXS_EVERSION, CTXS_ECORRUPT, -errno */
    uint32_t format_major, format_minor;
    int32_t header_status; /* 0, or what is wrong with the header */
    uint32_t header_crc_ok;/* 1 when the header's CRC holds */
    ctxs_model model;      /* valid when header_status == 0 */
    uint32_t capacity, n_sink;
    uint32_t ring;         /* 1: the session has a ring */
    uint32_t reserved0_;
    uint64_t created_unix_ms;
    uint64_t file_bytes;   /* the size the header gives */
    uint64_t size_bytes;   /* the file's size (st_size) */
    uint64_t disk_bytes;   /* blocks the file takes on disk */
    ctxs_record_report records[2];
    int32_t label_status;  /* 0, CTXS_ENOTFOUND (none), CTXS_ECORRUPT */
    uint32_t reserved1_;
    uint64_t label_id;     /* the store id in the label */
    char label_name[CTXS_NAME_MAX + 1];  /* the name in the label, NUL-terminated */
    uint32_t writer_open;  /* 1: a writer holds the file now */
    uint32_t reader_open;  /* 1: a reader holds the file now */
    int32_t writer_pid;    /* the process whose writer holds the file, where
                              the system says (Linux, a process of the same
                              user); 0 when none or not known */
    char writer_command[16]; /* that process's command name (Linux: comm),
                              NUL-terminated; "" when not known */
} ctxs_file_report;

/* Describes the session file at path: its header, both commit records, its
 * label, and whether a handle in any process has it open (and which
 * process writes it: found by reading /proc, when a writer holds the
 * file, so meant for tools, not a fast path). Returns 0 when
 * the file could be read, even if it is damaged (out->status says whether
 * it opens); -errno when it cannot be read at all (-ENOENT, -EACCES,
 * -ELOOP, -EISDIR); CTXS_EINVAL. Takes no lock and changes nothing. */
CTXS_API int ctxs_file_inspect(ctxs_file_report *out, const char *path);

/* --- The store's files -----------------------------------------------------
 *
 * For tools: where a session's file is, and which files of a store's
 * sessions/ no index entry names, named by path rather than opened, so
 * that a tool need not know how a store lays out its directory.
 */

/* The path of the file of the session with store id id (a
 * ctxs_session_entry's id) in the store at dir, as dir is given (not
 * resolved): dir/sessions/<id as 16 hex digits>.ctxs, into buf of size
 * bytes, NUL-terminated; with dir NULL, the path inside the store
 * (sessions/<id>.ctxs). Needs no open store and touches no file.
 * Errors: CTXS_EINVAL (buf NULL, size 0), -ENAMETOOLONG (the path does not
 * fit in size bytes; buf then holds ""). Thread-safe. */
CTXS_API int ctxs_store_session_get_path(char *buf, size_t size, const char *dir,
                                         uint64_t id);

/* A file in a store's sessions/ named like a session file. */
typedef struct ctxs_store_file {
    char file[32];         /* its name: "<id as 16 hex digits>.ctxs" */
    uint64_t id;           /* the store id its name gives */
    uint64_t disk_bytes;   /* blocks it takes on disk; 0 when not regular */
    int32_t status;        /* 0: a session file that opens, with a valid
                              current record, so that ctxs_store_reindex()
                              and ctxs_store_compact() adopt it; else why
                              it cannot be adopted: CTXS_ECORRUPT,
                              CTXS_EFOREIGN, CTXS_EVERSION, -errno (as
                              ctxs_file_inspect() says) */
    uint32_t regular;      /* 1: a regular file; 0: a link, a directory, a
                              FIFO, ... (which never opens as a session) */
} ctxs_store_file;

/* The files of the store at dir (as given, not resolved) that are named
 * like session files, in the order the directory lists them: those that
 * no index entry of st names, with st the store at dir, open; every one
 * with st NULL (a look before an open that may rebuild the index). An
 * array to release with ctxs_free() (NULL when there are none). Each file
 * is inspected (ctxs_file_inspect()) to fill in its status, so this costs
 * a read of each file's header; it changes nothing and takes no lock.
 * A store without sessions/ has none. Errors: CTXS_EINVAL, CTXS_ENOMEM,
 * CTXS_EINDEX and the errors of ctxs_store_session_list(), -errno (of
 * reading the directory). Thread-safe. */
CTXS_API int ctxs_store_file_list(ctxs_store_file **out, size_t *n_out, const char *dir,
                                  ctxs_store *st);

/* --- Progress ----------------------------------------------------------------
 *
 * Long operations call progress (when not NULL) now and then on the calling
 * thread with the work done so far and the total, in the operation's units
 * (bytes or tokens), and once with done == total at the end.
 */
typedef void (*ctxs_progress_fn)(void *arg, uint64_t done, uint64_t total);

/* The options of a long operation that reports progress, one struct per
 * call (ctxs_store_compact_options, ctxs_store_session_export_options,
 * ctxs_store_session_import_options, ctxs_remote_push_options,
 * ctxs_remote_pull_options), each laid out alike: version, reserved0,
 * progress, progress_arg, reserved[32]. Start from its _INIT macro or its
 * _options_init() function; a NULL options pointer is the defaults (no
 * progress). A version the library does not know or a reserved byte that
 * is not zero: CTXS_EINVAL. */

/* --- Maintenance -------------------------------------------------------- */

typedef struct ctxs_store_gc_result {
    uint64_t bytes_before;   /* disk space of the session files */
    uint64_t bytes_after;    /* after the deletes (a dry run: had it deleted) */
    uint64_t deleted;        /* sessions deleted (would be, in a dry run) */
    uint64_t skipped_open;   /* sessions kept because a handle had them open */
    uint64_t skipped_pinned; /* pinned sessions passed over, still above the
                                budget, that gc would otherwise have deleted */
    ctxs_session_entry *sessions; /* the deleted sessions (a dry run: those
                                it would delete), in the order gc took
                                them: least recently used first, each
                                with the disk_bytes gc counted for it;
                                n_sessions == deleted; release with
                                ctxs_free() */
    size_t n_sessions;
} ctxs_store_gc_result;

#define CTXS_GC_DRY_RUN 0x1u /* delete nothing; report what would go */

/* Deletes sessions, least recently used first, until the session files take
 * at most budget_bytes of disk, never one that is pinned
 * (ctxs_store_session_set_pinned()) or that a handle has open. out receives what
 * was deleted, also when a later delete fails (out->sessions is then NULL
 * or the sessions deleted before it); out may be NULL.
 *
 * With CTXS_GC_DRY_RUN nothing is deleted: out says what a gc would delete
 * now (sessions open now are counted in skipped_open, as gc would find
 * them); a dry run works on a read-only store.
 *
 * Errors: CTXS_EINVAL (unknown flags), CTXS_EREADONLY (a read-only store,
 * without CTXS_GC_DRY_RUN), CTXS_ENOMEM, -errno (also where a session's
 * size cannot be read). */
CTXS_API int ctxs_store_gc(ctxs_store_gc_result *out, ctxs_store *st,
                           uint64_t budget_bytes, unsigned flags);

/* An operation a crash (of the process, or of the machine) interrupted:
 * a create, fork, import or pull, or a delete (a gc's too), which records
 * its intent in the index before it touches a file and drops it when done.
 * Between the two, the store may hold a session file that no index entry
 * names: not damage, but what the next read-write open of the store
 * finishes or undoes (ctxs_store_open()). */
typedef enum ctxs_intent_kind {
    CTXS_INTENT_CREATE = 1, /* a create, fork, import or pull */
    CTXS_INTENT_DELETE = 2, /* a delete, or gc deleting */
} ctxs_intent_kind;

/* What the next read-write open of the store does with an intent. */
typedef enum ctxs_intent_action {
    CTXS_INTENT_WAIT = 1,        /* nothing: the process that recorded it
                                    is running, or a handle has the file
                                    open (the operation may be under way) */
    CTXS_INTENT_REMOVE_FILE = 2, /* removes the file, which no entry names,
                                    then the intent */
    CTXS_INTENT_DROP = 3,        /* drops the intent alone: the file is
                                    gone, or an entry names it */
} ctxs_intent_action;

typedef struct ctxs_intent_entry {
    uint64_t id;           /* the file: sessions/<id, 16 hex>.ctxs */
    uint32_t kind;         /* ctxs_intent_kind */
    uint32_t action;       /* ctxs_intent_action, as of this call */
    uint32_t pid;          /* the process that recorded it; 0: unknown (a
                              store made by index 1.0) */
    uint32_t file_present; /* 1: sessions/<id>.ctxs exists */
    uint32_t indexed;      /* 1: an index entry names id */
    uint32_t reserved_;
} ctxs_intent_entry;

/* The store's pending intents, in id order, each with what the next
 * read-write open of the store would do with it now: an array to release
 * with ctxs_free() (NULL when there are none). Changes nothing and takes
 * no lock; works on a read-only store, whose opens leave intents as they
 * are: how a read-only look tells a crash's leftover (a session file that
 * no entry names, with an intent) from damage. Malformed intents are left
 * to ctxs_store_check(). Errors: CTXS_EINVAL, CTXS_ENOMEM, -errno.
 * Thread-safe. */
CTXS_API int ctxs_store_intent_list(ctxs_intent_entry **out, size_t *n_out,
                                    ctxs_store *st);

typedef struct ctxs_store_repair_result {
    uint64_t files_adopted;    /* session files no entry named, now indexed */
    uint64_t files_removed;    /* leftovers of interrupted creates */
    uint64_t entries_removed;  /* index entries whose file was gone */
    uint64_t prefixes_updated; /* sessions whose prefix entries were fixed */
    uint64_t files_renumbered; /* session files named with id 0 or above
                                  2^63 - 1, given a new id with their rows */
    uint64_t next_id_mended;   /* 1: the index's next id was damaged (0,
                                  above 2^63 - 1, of another size, or not
                                  above an id the index names) and was set
                                  right; 0: it was not */
    uint64_t next_id_was;      /* the damaged value (0 for one of another
                                  size) when next_id_mended, else 0 */
    uint64_t next_id;          /* the next session id after the repair */
} ctxs_store_repair_result;

/* Compares the whole index with the session files. A session file that no
 * entry names is indexed again (under the name in its label where no other
 * session has it, else "session-<id>"), never deleted; a file copied in
 * under another id than its label's (a backup restored by hand) has its
 * label rewritten to name the id and name it is indexed under. An entry
 * whose file is gone is dropped;
 * files written aside by creates that died are removed (those of a process
 * still running are left: its create may be under way); prefix entries are
 * brought up to date. Files that are not sessions are left alone. Opening a
 * store already resolves what crashes leave; this also mends what a person
 * did to the files. A damaged next id (0, past the largest, or not above
 * every id in use) is mended first, and a session file named with id 0 (or
 * above 2^63 - 1) is given a new id with its entries (docs/FORMAT.md), so
 * that no id is ever handed out twice. A file that cannot be read (-EIO,
 * -EACCES, ...) stops the repair with its error; what was mended before it
 * stays mended. out may be NULL. Errors: CTXS_EREADONLY, -errno,
 * CTXS_ENOMEM, CTXS_EFULL (no id left: a file of id 2^63 - 1 exists). */
CTXS_API int ctxs_store_repair(ctxs_store_repair_result *out, ctxs_store *st);

typedef struct ctxs_store_reindex_result {
    uint64_t sessions;         /* files indexed */
    uint64_t skipped;          /* files that are not readable sessions */
    uint64_t files_renumbered; /* as in ctxs_store_repair_result */
    uint64_t next_id_mended;   /* 1: next id was damaged, or not above the
                                  id of a file indexed, and was set right */
    uint64_t next_id_was;      /* the value before, when next_id_mended */
    uint64_t next_id;          /* the next session id after the rebuild */
} ctxs_store_reindex_result;

/* Rebuilds the index from the session files: names (each file keeps its
 * own), models, token counts and prefixes. Checkpoints and metadata of
 * sessions still present and models' display names are kept; sessions whose name is lost
 * or taken are named "session-<id>". A file whose label names another id
 * (copied in by hand) gets its label's name when no file labelled with its
 * own id claims it, and its label is rewritten to name its id and the name
 * it got. Files that are not valid sessions
 * (foreign, damaged, of a newer version) are left alone and counted; a
 * file named with id 0 (or above 2^63 - 1) is given a new id first and
 * indexed as any other; a file that cannot be read (-EIO, -EACCES, ...)
 * stops the rebuild before the index changes, and its error is returned.
 * out may be NULL. Errors: CTXS_EREADONLY, -errno, CTXS_ENOMEM,
 * CTXS_EFULL (no id left). */
CTXS_API int ctxs_store_reindex(ctxs_store_reindex_result *out, ctxs_store *st);

/* What a repair of the index kept of one kind of row of the damaged one. */
typedef struct ctxs_store_repair_index_count {
    uint64_t kept;      /* in the new index */
    uint64_t dropped;   /* read, but not kept: malformed, beyond a limit, or
                           of a session whose file is gone */
    uint64_t unread;    /* lost to the damage: rows the damaged table
                           counted but could not be read (names: sessions
                           whose name in the index could not be read) */
    uint32_t whole;     /* 1: the damaged table was read to its end */
    uint32_t reserved_;
} ctxs_store_repair_index_count;

/* A session that did not get back the name the damaged index gave it. */
typedef struct ctxs_store_repair_index_renamed {
    uint64_t id;                    /* its file: sessions/<id, 16 hex>.ctxs */
    char name[CTXS_NAME_MAX + 1];   /* the name it has now: its label's, or
                                       "session-<id>" */
} ctxs_store_repair_index_renamed;

typedef struct ctxs_store_repair_index_result {
    uint64_t sessions;   /* session files indexed */
    uint64_t skipped;    /* files that are not readable sessions, left
                            alone (see ctxs_store_reindex()) */
    /* What was kept of each kind of row: */
    ctxs_store_repair_index_count names; /* sessions' names */
    ctxs_store_repair_index_count checkpoints;
    ctxs_store_repair_index_count metadata; /* metadata rows (one key's
                                               value) */
    ctxs_store_repair_index_count pins;
    ctxs_store_repair_index_count models; /* registrations with their display
                                             names */
    uint32_t meta_pages;    /* intact meta pages the repair could read
                               through (0: none; nothing of the damaged
                               index could be read) */
    uint32_t tables_failed; /* tables whose reader stopped early: a fault,
                               damage LMDB found, or time */
    char *moved_to;         /* where the damaged index/data.mdb now is
                               (absolute; NULL when there was none);
                               release with ctxs_free() */
    ctxs_store_repair_index_renamed *renamed; /* the sessions counted in
                                                 names.unread, by id;
                                                 release with ctxs_free() */
    size_t n_renamed;
} ctxs_store_repair_index_result;

/* Repairs the damaged index of the store in directory dir, keeping what
 * it can: the way out of CTXS_EINDEX. It works from the directory, since
 * a damaged index does not open. In order:
 *
 * 1. Takes the store lock exclusively: CTXS_EBUSY while any process (this
 *    one included) has the store open, and nothing is changed. A
 *    store.lock or lock.mdb that is no regular file (a FIFO, socket,
 *    device, symbolic link or empty directory) is removed first and made
 *    anew (neither holds anything the store needs); one that is a
 *    directory with something in it is CTXS_EINDEX, and left.
 * 2. Reads what still reads of index/data.mdb, from a private copy made
 *    readable (a lost meta page replaced by the other, a file cut short
 *    extended with zeros), each table in a child process of its own under
 *    a time bound (60 s): a fault inside LMDB on a page it cannot validate ends
 *    that child and loses the rest of that table, never the caller. Every
 *    row the children send is checked again here. A data.mdb that is no
 *    regular file (a FIFO, a symbolic link, ...) is neither opened nor
 *    followed: nothing is read of it.
 * 3. Moves the damaged data.mdb (and LMDB's lock.mdb) into
 *    dir/index.damaged-<unix seconds>/ (out->moved_to): it is never
 *    deleted.
 * 4. Builds a new index from the session files, as ctxs_store_reindex()
 *    does, then puts back what was read, within the usual rules: each
 *    session's name (over the one its file's label holds), creation and
 *    last-use times and parent; checkpoints (the staleness rules still
 *    judge them when used), metadata (within its limits), pins, models'
 *    registrations with display names (a file's model registration wins
 *    over a salvaged one with another geometry), and next_id (never
 *    lowered). Rows of sessions whose file is gone are dropped.
 *
 * out says, kind by kind, what was kept, dropped and lost, and which
 * sessions came back under another name. An intact index comes back
 * whole (all kept; prefix entries and the file hash cache are rebuilt as
 * they are used). The store opens afterwards. A repair cut short after
 * step 3 leaves a store without index/data.mdb: ctxs_store_open() with
 * CTXS_STORE_CREATE (`ctxstore reindex`) rebuilds it from the files, and
 * the damaged index stays in out->moved_to.
 *
 * The children are made with fork() and use only LMDB and malloc; they
 * never return into the caller's code. Not to be called from a process
 * whose other threads hold locks that LMDB or malloc take (glibc's malloc
 * is made safe across fork()). SIGCHLD must not be ignored (SIG_IGN): the
 * exit status is how a child's fault is known.
 *
 * flags must be 0. out may be NULL. On failure out->renamed is NULL, and
 * out->moved_to says where the damaged index went if it was moved before
 * the failure (release it too).
 * Errors: CTXS_EBUSY, CTXS_EFOREIGN (dir is no store: neither index/ nor
 * sessions/), CTXS_EINDEX (index/store.lock or lock.mdb is a directory
 * that is not empty), CTXS_EVERSION (the index says it was written by a newer
 * major version: nothing is changed), CTXS_EINVAL, -ENOENT, CTXS_ENOMEM,
 * CTXS_EFULL, -errno; and those of ctxs_store_reindex(). Thread-safe as
 * far as it goes: it refuses a store open in this process. */
CTXS_API int ctxs_store_repair_index(ctxs_store_repair_index_result *out,
                                     const char *dir, unsigned flags);

/* One malformed record of the index, as ctxs_store_check() reports it. */
typedef struct ctxs_index_problem {
    char table[16];   /* the index's table: "meta", "sessions", "ids",
                         "models", "filehash", "checkpoints", "metadata",
                         "pins", "prefixes", "chunks" or "pending" */
    char key[560];    /* the record's key, printable: 'text' when every
                         byte is printable ASCII (names, "next_id"), else
                         0x and hex; a key that leads with a session id is
                         "id N" then, after ", ", the rest so written; ""
                         when LMDB could not read the table on */
    char what[192];   /* what is wrong, one sentence without a period */
} ctxs_index_problem;

#define CTXS_CHECK_MAX_PROBLEMS 1024u /* problems listed; all are counted */

typedef struct ctxs_store_check_result {
    uint64_t records;              /* records read, all tables together */
    uint64_t n_problems;           /* malformed records found, all counted */
    ctxs_index_problem *problems;  /* the first n_listed of them, in table
                                      then key order; release with
                                      ctxs_free() (NULL when none) */
    size_t n_listed;               /* min(n_problems, CTXS_CHECK_MAX_PROBLEMS) */
} ctxs_store_check_result;

/* Reads every record of every table of the index (sessions, ids, models,
 * file hashes, checkpoints, metadata, pins, prefixes and chunks, pending
 * intents, and meta's format and next_id) in one read transaction, and
 * reports each malformed one without stopping at the first. A record is
 * malformed when a call that reads it would fail with CTXS_EINDEX: a value
 * or key of the wrong size, a session record whose id is 0 or above
 * 2^63 - 1 or that ids[] does not name back, a model record whose name
 * does not fit, a metadata value above CTXS_META_VALUE_MAX, a pin with a
 * value, an intent that is neither a create nor a delete. A next_id of 0,
 * above 2^63 - 1, or not above every id in use is reported too, although
 * no read refuses it (the next create, repair or reindex mends it). Damage
 * LMDB finds in its own pages ends the walk of that table, as a problem of
 * it (key ""); the other tables are still read. The session files are not
 * read: ctxs_store_repair() and the session calls judge them.
 *
 * out is filled (out->problems, to release) on 0 and on CTXS_EINDEX only.
 * Changes nothing; works on a read-only store. The way out of a damaged
 * index is ctxs_store_open()'s.
 * Returns 0 (no problem found) or CTXS_EINDEX (out lists what was found).
 * Errors: CTXS_EINVAL (NULL out or st), CTXS_ENOMEM, -errno. Thread-safe. */
CTXS_API int ctxs_store_check(ctxs_store_check_result *out, ctxs_store *st);

typedef struct ctxs_store_compact_result {
    uint64_t sessions;          /* session files compacted */
    uint64_t skipped_busy;      /* sessions skipped: a handle had them open */
    uint64_t bytes_before;      /* disk space of those session files */
    uint64_t bytes_after;
    uint64_t index_bytes_before;/* the index's data file before and after; */
    uint64_t index_bytes_after; /* equal unless index_compacted */
    uint32_t index_compacted;   /* 1: the index was rewritten compacted */
    uint32_t index_busy;        /* 1: the store was in use elsewhere (another
                                   process, another handle of this process,
                                   or a session opened through st), so the
                                   index was left as it was */
    uint64_t orphans_removed;   /* index rows and files that nothing owned */
} ctxs_store_compact_result;

#define CTXS_STORE_COMPACT_OPTIONS_VERSION 1
typedef struct ctxs_store_compact_options {
    uint32_t version;          /* CTXS_STORE_COMPACT_OPTIONS_VERSION */
    uint32_t reserved0;        /* must be zero */
    ctxs_progress_fn progress; /* called now and then with the sessions done; NULL = none */
    void *progress_arg;        /* passed to progress */
    uint8_t reserved[32];      /* must be zero */
} ctxs_store_compact_options;
#define CTXS_STORE_COMPACT_OPTIONS_INIT \
    { CTXS_STORE_COMPACT_OPTIONS_VERSION, 0, NULL, NULL, { 0 } }

/* Fills *opts with the defaults of version. Errors: CTXS_EINVAL (opts
 * NULL, or a version this library does not know). Thread-safe. */
CTXS_API int ctxs_store_compact_options_init(ctxs_store_compact_options *opts,
                                             uint32_t version);

/* Gives back the disk space a session does not use: the KV blocks of the
 * slots from min(n_tokens, capacity) on, which hold no token (after a
 * rollback, a recovery, or reservations never committed), are punched out;
 * the file keeps its size and its tokens, and later reservations allocate
 * them again. A ring that has wrapped keeps all its blocks. Where the
 * filesystem cannot punch holes, a session is left as it is.
 * With name == NULL, every session, and then the store itself: index rows
 * that no session owns are removed, then what ctxs_store_repair() mends,
 * and the index is rewritten compacted when nothing else uses the store:
 * no other process has it open, st is this process's only handle to it,
 * and no session opened through st is open (other processes' opens wait
 * meanwhile). A session that a handle in any process has open is not
 * touched: CTXS_EBUSY for name, counted in skipped_busy for all; files that
 * do not open as sessions are left alone. opts (NULL: the defaults) holds a
 * progress callback, which counts sessions. out may
 * be NULL; it holds what was done, also on failure. With name == NULL no
 * other thread may use st during the call.
 * Errors: CTXS_ENOTFOUND, CTXS_EBUSY, CTXS_EINVAL, CTXS_EFULL, CTXS_EREADONLY,
 * CTXS_EFAILED (the index was rewritten but could not be reopened: close
 * st), -errno. */
CTXS_API int ctxs_store_compact(ctxs_store_compact_result *out, ctxs_store *st,
                                const char *name,
                                const ctxs_store_compact_options *opts);

/* Gives the session name capacity slots, more than it has, keeping every
 * token, checksum, checkpoint and its metadata: the way on for a session
 * that is no ring once reserve says CTXS_EFULL. The file is rewritten
 * into a new one written aside (blocks shared with the old file where the
 * filesystem can, copy_file_range(); else copied at memory speed) and
 * renamed over it once durable: a crash leaves the old file or the grown
 * one, never less. A windowed layer's ring keeps its length. A session
 * that a handle in any process has open is not touched (CTXS_EBUSY).
 * Errors: CTXS_ENOTFOUND, CTXS_EBUSY, CTXS_EINVAL (capacity not above the
 * session's, or above 16 Mi; a ring that has gone round, whose slots are no
 * longer its positions; a capacity at which windowed layers laid out over
 * every slot would get rings of their own: the error says how far it can
 * grow), CTXS_EFULL, CTXS_EREADONLY, -errno.
 * Thread-safe. */
CTXS_API int ctxs_store_session_grow(ctxs_store *st, const char *name, uint32_t capacity);

/* --- Export and import ------------------------------------------------------
 *
 * An export file carries one session to another machine: its model (with
 * the display name), geometry, metadata, state and every held token's id,
 * checksum and KV, in zlib-compressed blocks that each carry a CRC-32
 * (export format 3.0 for a session with a layer schedule, else 2.0;
 * import also reads 1.0 files, which have no metadata). See
 * docs/FORMAT.md.
 */

#define CTXS_STORE_SESSION_EXPORT_OPTIONS_VERSION 1
typedef struct ctxs_store_session_export_options {
    uint32_t version;          /* CTXS_STORE_SESSION_EXPORT_OPTIONS_VERSION */
    uint32_t reserved0;        /* must be zero */
    ctxs_progress_fn progress; /* called now and then with the tokens done; NULL = none */
    void *progress_arg;        /* passed to progress */
    uint8_t reserved[32];      /* must be zero */
} ctxs_store_session_export_options;
#define CTXS_STORE_SESSION_EXPORT_OPTIONS_INIT \
    { CTXS_STORE_SESSION_EXPORT_OPTIONS_VERSION, 0, NULL, NULL, { 0 } }

/* Fills *opts with the defaults of version. Errors: CTXS_EINVAL (opts
 * NULL, or a version this library does not know). Thread-safe. */
CTXS_API int ctxs_store_session_export_options_init(ctxs_store_session_export_options *opts,
                                                    uint32_t version);

/* Writes the committed tokens of the session named name to a new file at
 * path (written aside, then linked into place, as ctxs_session_create()
 * does; -EEXIST if path exists). A writer may keep appending meanwhile;
 * what it had committed when the export began is exported, and
 * CTXS_ESTALE if it rolled back or its ring overwrote those tokens during
 * the export. opts (NULL: the defaults) holds a progress callback, which
 * counts tokens.
 * Errors: CTXS_ENOTFOUND, CTXS_ESTALE, CTXS_EBUSY (a gc, compact or delete
 * is working on the session), CTXS_ECORRUPT (a held token does not match
 * its checksum, or both records are damaged), CTXS_EFULL, -EEXIST,
 * CTXS_EINVAL (bad argument, or a geometry whose one token's KV is above
 * 64 MiB), CTXS_ENOMEM, -errno. A session with a layer schedule is
 * written as export format 3.0 (its windowed layers' K/V for the positions
 * of their windows; an import of it holds the committed state, and
 * refuses a rollback that needs positions below a window); any other as
 * 2.0. Those windows slide with each commit, and the writer's next turn
 * may rewrite what slid out of them: such an export ends with CTXS_ESTALE
 * if a writer commits before it has read the windowed layers' blocks
 * (which come last); run it again. */
CTXS_API int ctxs_store_session_export(ctxs_store *st, const char *name,
                                       const char *path,
                                       const ctxs_store_session_export_options *opts);

#define CTXS_STORE_SESSION_IMPORT_OPTIONS_VERSION 1
typedef struct ctxs_store_session_import_options {
    uint32_t version;          /* CTXS_STORE_SESSION_IMPORT_OPTIONS_VERSION */
    uint32_t reserved0;        /* must be zero */
    ctxs_progress_fn progress; /* called now and then with the bytes done; NULL = none */
    void *progress_arg;        /* passed to progress */
    uint8_t reserved[32];      /* must be zero */
} ctxs_store_session_import_options;
#define CTXS_STORE_SESSION_IMPORT_OPTIONS_INIT \
    { CTXS_STORE_SESSION_IMPORT_OPTIONS_VERSION, 0, NULL, NULL, { 0 } }

/* Fills *opts with the defaults of version. Errors: CTXS_EINVAL (opts
 * NULL, or a version this library does not know). Thread-safe. */
CTXS_API int ctxs_store_session_import_options_init(ctxs_store_session_import_options *opts,
                                                    uint32_t version);

/* Reads the export file at path and checks all of it (every block's CRC,
 * every token's checksum, the model and geometry, the metadata) before the
 * store is touched; then creates the session with its metadata, named name
 * (NULL: the name the file carries), registering the model if the store
 * does not know it. The
 * session appears complete or not at all. name_out (may be NULL) receives
 * the name used. opts (NULL: the defaults) holds a progress callback,
 * which counts bytes of the file, over both passes (total is twice the
 * file's size).
 * Errors: CTXS_EFOREIGN (not an export file, or not a regular file),
 * CTXS_EVERSION (a newer export format), CTXS_ECORRUPT (damaged or
 * truncated: nothing imported), CTXS_EMODEL (the store knows the model
 * hash with another geometry), CTXS_ETAKEN (the name is taken), CTXS_EINVAL,
 * CTXS_EFULL, CTXS_EREADONLY, CTXS_ENOMEM, -errno. */
CTXS_API int ctxs_store_session_import(char name_out[CTXS_NAME_MAX + 1],
                                       ctxs_store *st, const char *path,
                                       const char *name,
                                       const ctxs_store_session_import_options *opts);

/* ---------------------------------------------------------------------------
 * Remote tier (Redis)
 *
 * A store may push its sessions to a Redis server (or Valkey, or a Redis
 * Cluster's node through a proxy) and pull them back on another machine,
 * so that a conversation resumes on any server of a fleet. Nothing here
 * coordinates machines: Redis is the shared tier, and may evict anything.
 *
 * Chunks are content-addressed: every CTXS_PREFIX_CHUNK committed tokens
 * from position 0 make one value, keyed by the model hash, the form of
 * the KV (dtype and geometry: an fp16 and a Q8 store of one model keep
 * separate chunks) and the chained hash of the token ids up to and
 * including the chunk (the chain
 * ctxs_prefix_find() uses), holding the chunk's token ids, the checksum
 * and the K/V of every token for every layer and head. Two conversations
 * that share a system prompt share its chunks. A session's name maps to a
 * small record: its model, token ids and metadata, and whether its last
 * partial chunk (the tail) was pushed. docs/FORMAT.md, "Remote values",
 * gives the bytes.
 *
 * A session with a layer schedule (ctxs_geometry.period) travels too: its
 * chunks hold its global layers, and its windowed layers' state at the
 * record's count (each window's last tokens) is one more value, pushed
 * with the record (ctxs_remote_push(), or the background push at a close
 * after commits: such a session's record is not sent at its commits). A
 * pull holds a count only with its windows: a session longer than a
 * window whose window value is missing or damaged pulls no token. The
 * remote tier takes such a session only where every windowed layer keeps
 * its own ring (ctxs_create_options.batch): see ctxs_remote_push().
 *
 * Pushing is off the user's path: with push_on_commit, a background thread
 * pushes the chunks a commit completed (pipelined, a bounded queue, retries
 * with backoff), and a session's tail and record when it is closed. It
 * reads what it pushes from the session file and checks it against the
 * tokens' checksums, so a commit never waits for the network and a failed
 * or slow Redis never loses or blocks local data. Pulling verifies every
 * chunk before a byte of it is written locally; the first chunk missing
 * (evicted) or damaged ends a pull, and the caller prefills the rest:
 * shorter, never wrong.
 *
 * Network failures are -errno: -ECONNREFUSED, -ETIMEDOUT, -ECONNRESET,
 * -EHOSTUNREACH, ...; a password refused or required is -EACCES;
 * CTXS_EREMOTE is a server that answered with an error (out of memory with
 * a noeviction policy, not a Redis) or holds a damaged session record.
 *
 * A server is trusted with nothing but its data, which is verified: every
 * call ends by its deadline (call_ms) whatever the server sends or holds
 * back (-ETIMEDOUT), each read waits at most timeout_ms, and every reply
 * has a size cap from what a valid one can be, checked before it is
 * buffered: a chunk at most what a chunk of the model holds, a session
 * record at most a record of 2^24 tokens with a full metadata section
 * (66 MiB), a SCAN reply 4096 keys of at most a key's length, an INFO
 * section 1 MiB, a status or integer 64 KiB, no array where none is
 * expected; a listing walks at most 1,000,000 SCAN rounds and takes at
 * most 100,000 keys from them (what it keeps of each is ~300 bytes). A
 * reply past its cap, or a listing past its
 * bounds, ends the call with CTXS_EREMOTE, and nothing local is touched
 * (a pull leaves no session, or a complete and verified one).
 * ctxs_get_last_error() says which limit, and what the server sent ("the
 * SCAN reply holds an array of 2147483647 elements, above 4096", "no
 * reply within the call's deadline of 2000 ms", ...).
 */
typedef struct ctxs_remote ctxs_remote;

#define CTXS_REMOTE_OPTIONS_VERSION 1

typedef struct ctxs_remote_options {
    uint32_t version;        /* CTXS_REMOTE_OPTIONS_VERSION */
    uint32_t timeout_ms;     /* connect and per-command timeout */
    uint32_t retries;        /* tries of a failed background push before
                                its chunks are dropped (counted) */
    uint32_t backoff_ms;     /* wait before the first retry, doubled each
                                time up to 2 s */
    uint32_t queue_max;      /* background push jobs waiting at most; new
                                ones beyond are dropped (counted in
                                chunks_dropped, last_error -ENOBUFS) */
    uint32_t push_on_commit; /* 1: read-write sessions opened through the
                                store push the chunks their commits
                                complete (from chunk 0 at a handle's first
                                commit or close: Redis is asked which it
                                lacks) and their record, and their tail
                                and record at a close after commits (a
                                session closed untouched sends no record,
                                so that a partial pull never replaces a
                                longer record); 0: only ctxs_remote_push()
                                pushes */
    uint32_t pull_on_open;   /* 1: ctxs_store_session_open() of a name the
                                store lacks pulls it first, as
                                ctxs_remote_pull() does; 0: never */
    const char *key_prefix;  /* every key starts "<key_prefix>:"; NULL:
                                "ctxs"; a valid name (CTXS_NAME_RULE)
                                without ':', so that no prefix and
                                session name make another's key */
    uint32_t call_ms;        /* the deadline of one call, all its commands
                                and replies together: a push, a pull, a
                                list, an info, a background job, the
                                connection check; 0: the default
                                (CTXS_DEFAULT_REMOTE_CALL_MS, 5 minutes:
                                a 288 MiB session over 10 Mbit/s). A server
                                that answers a byte at a time ends the call
                                at it (-ETIMEDOUT), and so does one that
                                never ends a SCAN */
    uint8_t reserved[28];    /* must be zero */
} ctxs_remote_options;

#define CTXS_REMOTE_OPTIONS_INIT                                               \
    { CTXS_REMOTE_OPTIONS_VERSION, CTXS_DEFAULT_REMOTE_TIMEOUT_MS,           \
      CTXS_DEFAULT_REMOTE_RETRIES, CTXS_DEFAULT_REMOTE_BACKOFF_MS,           \
      CTXS_DEFAULT_REMOTE_QUEUE_MAX, 1, 1, NULL, 0, { 0 } }
/* Fills *opts with the defaults of version (CTXS_REMOTE_OPTIONS_INIT for
 * version 1). Errors: CTXS_EINVAL (opts NULL, or a version this library
 * does not know). Thread-safe. */
CTXS_API int ctxs_remote_options_init(ctxs_remote_options *opts, uint32_t version);

/* Connects st to the Redis server at url and starts its push thread.
 * url is "redis://[[user]:password@]host[:port][/db]" (port 6379, db 0;
 * a user for Redis 6 ACLs) or "unix:///path/to/redis.sock[?db=N]";
 * "rediss://" (TLS) is CTXS_EINVAL: the hiredis of Debian 12 has no TLS
 * (reach a remote server through a TLS tunnel or a private network). The
 * connection is checked (AUTH, SELECT, PING) before this returns. A store
 * handle has at most one remote. opts may be NULL for
 * CTXS_REMOTE_OPTIONS_INIT. The remote starts one thread (every signal
 * blocked) and holds a reference on st: ctxs_store_close(st) while it is
 * attached leaves the store open until ctxs_remote_close(). The calls on
 * the caller's thread (push, pull, list, info) each use a connection of
 * their own, and block SIGPIPE around it: thread-safe.
 * Errors: CTXS_EINVAL (a malformed url, bad options), -ECONNREFUSED,
 * -ETIMEDOUT, -EACCES (password refused or required), CTXS_EREMOTE
 * (answered, but not as Redis), CTXS_EBUSY (st has a remote), CTXS_ENOMEM,
 * -errno. *out is NULL on failure. */
CTXS_API int ctxs_remote_open(ctxs_remote **out, ctxs_store *st, const char *url,
                              const ctxs_remote_options *opts);

typedef struct ctxs_remote_stats {
    uint64_t chunks_pushed;   /* chunk values SET (a window value counts
                                 one) */
    uint64_t chunks_present;  /* found in Redis already, not sent again */
    uint64_t bytes_pushed;    /* value bytes SET, chunks and records */
    uint64_t records_pushed;  /* session records SET */
    uint64_t jobs_queued;     /* background jobs waiting now */
    uint64_t chunks_dropped;  /* values not pushed (each chunk, tail and
                                 session record counts one): queue full,
                                 tries exhausted, session deleted or
                                 rewritten, or left at close; the local
                                 sessions are intact, and
                                 ctxs_remote_push() sends what is missing */
    uint64_t retries;         /* reconnects and resends */
    int32_t last_error;       /* the last background error, or 0 */
    uint32_t connected;       /* 1: the push thread's connection is up
                                 (it connects at its first job, and again
                                 at the next job after it dropped one) */
} ctxs_remote_stats;

/* The counters since ctxs_remote_open(). Errors: CTXS_EINVAL. */
CTXS_API int ctxs_remote_get_stats(ctxs_remote_stats *out, ctxs_remote *r);

/* Waits until the background queue is empty, or timeout_ms has passed:
 * -ETIMEDOUT with jobs left. out (may be NULL) gets the counters. */
CTXS_API int ctxs_remote_flush(ctxs_remote_stats *out, ctxs_remote *r, uint32_t timeout_ms);

/* Flushes for at most timeout_ms, stops the push thread, detaches r from
 * its store and frees it. out (may be NULL) gets the final counters, in
 * which what was left is counted in chunks_dropped. Returns 0, or
 * -ETIMEDOUT when jobs were left (r is freed all the same). Close the
 * sessions opened through the store first: their close queues their tail
 * and record. Accepts NULL. */
CTXS_API int ctxs_remote_close(ctxs_remote_stats *out, ctxs_remote *r, uint32_t timeout_ms);

typedef struct ctxs_remote_push_result {
    uint64_t n_tokens;        /* tokens of the session Redis now holds */
    uint64_t chunks_sent;
    uint64_t chunks_present;  /* there already: shared, or pushed before */
    uint64_t bytes_sent;
} ctxs_remote_push_result;

#define CTXS_REMOTE_PUSH_OPTIONS_VERSION 1

/* How ctxs_remote_push() runs. Start from CTXS_REMOTE_PUSH_OPTIONS_INIT or
 * ctxs_remote_push_options_init(). */
typedef struct ctxs_remote_push_options {
    uint32_t version;          /* CTXS_REMOTE_PUSH_OPTIONS_VERSION */
    uint32_t reserved0;        /* must be zero */
    ctxs_progress_fn progress; /* called now and then with the tokens
                                  pushed; NULL = none */
    void *progress_arg;        /* passed to progress */
    uint8_t reserved[32];      /* must be zero */
} ctxs_remote_push_options;

#define CTXS_REMOTE_PUSH_OPTIONS_INIT { CTXS_REMOTE_PUSH_OPTIONS_VERSION, 0, NULL, NULL, { 0 } }

/* Fills *opts with the defaults of version (CTXS_REMOTE_PUSH_OPTIONS_INIT
 * for version 1). Errors: CTXS_EINVAL (opts NULL, or a version this
 * library does not know). Thread-safe. */
CTXS_API int ctxs_remote_push_options_init(ctxs_remote_push_options *opts, uint32_t version);

/* Pushes the local session name now, on the calling thread: every chunk
 * Redis lacks, the tail (its last n_tokens % CTXS_PREFIX_CHUNK tokens, as
 * a partial chunk), then its record. A writer may keep appending
 * meanwhile; what it had committed when the push began is pushed.
 * opts may be NULL for CTXS_REMOTE_PUSH_OPTIONS_INIT; its progress counts
 * tokens. out may be NULL.
 * Errors: CTXS_ENOTFOUND, CTXS_EEVICTED (a ring that wrapped: only a
 * session that holds every token from position 0 pushes), CTXS_ESTALE
 * (rolled back during the push; with a layer schedule, also a writer that
 * committed more than the batch past the push's count before its windows
 * were copied: push again), CTXS_ECORRUPT, the network's errors,
 * CTXS_EREMOTE, CTXS_EINVAL (opts of another version or with reserved
 * bytes set; a session with a layer schedule whose slots
 * lay a windowed layer out without its ring, its window + batch not
 * fitting them: export it instead; or whose windowed layers' state is
 * above 512 MiB, a Redis value's limit), CTXS_ENOMEM. A session with a
 * layer schedule also sends the window value of its count (counted in
 * chunks_sent or chunks_present). */
CTXS_API int ctxs_remote_push(ctxs_remote_push_result *out, ctxs_remote *r, const char *name,
                              const ctxs_remote_push_options *opts);

typedef struct ctxs_remote_pull_result {
    uint64_t n_tokens;        /* tokens now in the local session */
    uint64_t remote_tokens;   /* tokens the record lists (pull), or the
                                 prompt's n (pull_prefix) */
    uint64_t chunks_pulled;   /* whole and tail chunks written locally */
    uint64_t chunks_missing;  /* 1: the pull stopped at a chunk not found
                                 (evicted); else 0 */
    uint64_t chunks_refused;  /* 1: the pull stopped at a chunk that did
                                 not verify; else 0 */
    uint32_t *rest_ids;       /* pull: the record's token ids from n_tokens
                                 on, to prefill; release with ctxs_free().
                                 NULL for pull_prefix */
    uint64_t n_rest;
    ctxs_model model;         /* the remote session's model */
} ctxs_remote_pull_result;

#define CTXS_REMOTE_PULL_OPTIONS_VERSION 1

/* How ctxs_remote_pull() and ctxs_remote_pull_prefix() run (the new
 * session's slots are their create options'). Start from
 * CTXS_REMOTE_PULL_OPTIONS_INIT or ctxs_remote_pull_options_init(). */
typedef struct ctxs_remote_pull_options {
    uint32_t version;          /* CTXS_REMOTE_PULL_OPTIONS_VERSION */
    uint32_t reserved0;        /* must be zero */
    ctxs_progress_fn progress; /* called after each chunk written with the
                                  tokens pulled and those asked for; NULL =
                                  none */
    void *progress_arg;        /* passed to progress */
    uint8_t reserved[32];      /* must be zero */
} ctxs_remote_pull_options;

#define CTXS_REMOTE_PULL_OPTIONS_INIT { CTXS_REMOTE_PULL_OPTIONS_VERSION, 0, NULL, NULL, { 0 } }

/* Fills *opts with the defaults of version (CTXS_REMOTE_PULL_OPTIONS_INIT
 * for version 1). Errors: CTXS_EINVAL (opts NULL, or a version this
 * library does not know). Thread-safe. */
CTXS_API int ctxs_remote_pull_options_init(ctxs_remote_pull_options *opts, uint32_t version);

/* Creates the local session local_name (NULL: remote_name) from the remote
 * session remote_name: its record, then its chunks in order, each verified
 * (its header, its place in the chain, every token's checksum) before it
 * is written. The first chunk missing or refused ends the pull there. The
 * session appears complete or not at all, as an import does. The model is
 * registered if the store does not know it. create NULL, or a capacity and
 * context length of 0: the capacity is raised to hold the remote tokens
 * (the next multiple of CTXS_DEFAULT_CAPACITY above them); else at most
 * the whole chunks that fit the capacity are pulled. The handle has the default open
 * options (create->open is not used). out (may be NULL: the
 * session is closed) gets it open read-write; res (may be NULL) what was
 * pulled and what is left to prefill. opts may be NULL for
 * CTXS_REMOTE_PULL_OPTIONS_INIT; its progress counts tokens.
 * A session with a layer schedule also takes the window value of the
 * record's count (counted in chunks_pulled, or as the chunk missing or
 * refused), after the chunks reached that count (or the count is within
 * every window: then as many tokens as the chunks gave), else no token;
 * its new session has create's batch (0: CTXS_DEFAULT_BATCH), and with no
 * capacity or context length asked for, slots enough for every windowed
 * layer's ring.
 * Errors: CTXS_ENOTFOUND (no such remote session), CTXS_ETAKEN (local_name is
 * taken), CTXS_EMODEL (the store knows the model with another geometry,
 * tokenizer or layer schedule), CTXS_EREMOTE (a damaged record), CTXS_EFULL, the
 * network's errors, CTXS_EREADONLY, CTXS_EINVAL (bad create options; opts
 * of another version or with reserved bytes set; with a layer
 * schedule, a capacity that lays a windowed layer out without its ring),
 * CTXS_ENOMEM. */
CTXS_API int ctxs_remote_pull(ctxs_session **out, ctxs_remote_pull_result *res,
                              ctxs_remote *r, const char *remote_name,
                              const char *local_name, const ctxs_create_options *create,
                              const ctxs_remote_pull_options *opts);

/* Pulls the longest prefix of tokens[0..n) that Redis holds for model
 * into a new local session local_name, as ctxs_remote_pull() does: its
 * whole chunks, and a tail chunk that ends exactly at n when one does.
 * With a layer schedule it ends where a window value is: at the end of
 * what the chunks gave, or the largest chunk boundary below it with one
 * (the first found must verify). create and opts as for ctxs_remote_pull();
 * progress counts tokens of the prompt.
 * Errors: CTXS_ENOTFOUND (not even the first chunk; with a layer schedule,
 * no window value found), as ctxs_remote_pull(). */
CTXS_API int ctxs_remote_pull_prefix(ctxs_session **out, ctxs_remote_pull_result *res,
                                     ctxs_remote *r, const char *local_name,
                                     const ctxs_model *model, const uint32_t *tokens,
                                     uint64_t n, const ctxs_create_options *create,
                                     const ctxs_remote_pull_options *opts);

typedef struct ctxs_remote_entry {
    char name[CTXS_NAME_MAX + 1];
    uint8_t model_hash[CTXS_HASH_BYTES];
    uint64_t n_tokens;
    uint64_t updated_unix_ms;
    uint32_t tail_pushed;     /* 1: the partial last chunk is there too */
    int32_t status;           /* 0, or CTXS_EREMOTE: a damaged record */
} ctxs_remote_entry;

/* Every session record under the key prefix (SCAN: the server is never
 * blocked), in name order: an array to release with ctxs_free().
 * Errors: the network's, CTXS_ENOMEM. */
CTXS_API int ctxs_remote_list(ctxs_remote_entry **out, size_t *n_out, ctxs_remote *r);

typedef struct ctxs_remote_info {
    char server_version[32];  /* redis_version */
    uint64_t used_memory;
    uint64_t maxmemory;       /* 0: no limit */
    char maxmemory_policy[32];
    uint64_t evicted_keys;
    uint64_t keys;            /* keys in the database (DBSIZE) */
} ctxs_remote_info;

/* What the server says of itself (INFO, DBSIZE).
 * Errors: the network's, CTXS_EREMOTE. */
CTXS_API int ctxs_remote_get_info(ctxs_remote_info *out, ctxs_remote *r);

#ifdef __cplusplus
}
#endif

#endif /* CTXSTORE_H */
