/*
 * What code outside src/store (the index, src/index) may ask of a session
 * and of the store's files: the contract between the two. struct
 * ctxs_session stays opaque there, as it is to applications. The index
 * asks the public API what it tells anyone (ctxs_session_get_info: model,
 * slots, committed state, flags, durability, creation time;
 * ctxs_session_get_slot: whether a position is held; refresh, rollback)
 * and this header for the rest: the file's descriptor, the token tables,
 * the hooks through which it learns of commits and closes, and the
 * store's calls that make new session files. It brings with it the
 * declarations of the session files' bytes that the index reads and
 * writes without a session open: the layout (format.h), the label
 * (label.h) and the cheap look at a file's newest record (peek.h).
 * src/index, src/transfer and src/remote include this header, never those
 * three (src/gpu takes format.h alone): the build's include check
 * (tests/check_includes.sh) holds it to that.
 *
 * Calls on a handle follow the public API's rule (one thread at a time per
 * handle) and see the handle's state when called: a reader's as of its
 * last open or refresh.
 */
#ifndef CTXS_STORE_SESSION_IFACE_H
#define CTXS_STORE_SESSION_IFACE_H

#include <stdint.h>

#include "ctxstore.h"
#include "format.h"
#include "label.h"
#include "peek.h"

/* --- Asking an open session (session_iface.c) ---------------------------- */

/* The descriptor of the session's file, open as long as s is: for fstat and
 * pread. Never for writes, locks or close. */
int ctxs__session_fd(const ctxs_session *s);

/* The leading positions [0, n) that s holds, all in slots 0..n-1: n_tokens
 * until the ring wraps, then the sinks (ctxs__peek_prefix_held() for a file
 * read by pread). Returns n; *ids, if ids is not NULL, gets their token ids
 * in the mapping, valid until s is closed (under a reader, a writer
 * elsewhere may change them). */
uint64_t ctxs__session_prefix_held(const uint32_t **ids, const ctxs_session *s);

/* The token ids (ids) and checksums (sums) of positions [first, first + n),
 * which s must hold (ctxs_session_get_slot()), from its tables as they are
 * now; either array may be NULL. */
void ctxs__session_tokens(uint32_t *ids, uint64_t *sums, const ctxs_session *s, uint64_t first,
                          uint64_t n);

/* The checksums of positions [first, first + n) over windowed group g's
 * layers, from its table as it is now. CTXS_ESTALE where a slot's entry
 * is another position's, or none (the ring no longer holds it), or below
 * the window of s's state (a writer's next turn may be rewriting it). */
int ctxs__session_group_sums(uint64_t *sums, const ctxs_session *s, uint32_t g, uint64_t first,
                             uint64_t n);

/* 0 if s can roll back to n tokens (ctxs_session_rollback()'s rules,
 * windowed rings included); else its error, CTXS_EEVICTED where a ring no
 * longer holds what n needs. */
int ctxs__session_can_roll_back(const ctxs_session *s, uint64_t n);

/* The batch s was created with (0 in a file from before 3.0). */
uint32_t ctxs__session_batch(const ctxs_session *s);

/* What the index learns from a session opened through a store. The store
 * only calls these; it knows nothing of LMDB. */
typedef struct ctxs__session_hooks {
    /* After a commit succeeded, on the thread that committed. */
    void (*committed)(ctxs_session *s, void *arg);
    /* At close, once the background work of s has stopped, before
     * anything is unmapped. */
    void (*closing)(ctxs_session *s, void *arg);
    /* After a rollback to n_tokens succeeded (fewer than were held), on
     * the thread that rolled back: what was noted of the positions from
     * n_tokens on no longer describes the session. */
    void (*rolled_back)(ctxs_session *s, uint64_t n_tokens, void *arg);
} ctxs__session_hooks;

/* Sets the hooks of s, and the argument they get (NULL hooks: none). Not
 * while a hook of s runs, except closing(), which may clear them. */
void ctxs__session_set_hooks(ctxs_session *s, const ctxs__session_hooks *hooks, void *arg);

/* The hooks of s, or NULL; *arg gets their argument. */
const ctxs__session_hooks *ctxs__session_get_hooks(const ctxs_session *s, void **arg);

/* Asks for writeback of the whole file, at ASYNC (commit.c): for a file
 * written before its handle was open (a fork's copy). */
void ctxs__writeback_request_all(ctxs_session *s);

/* --- New session files (session.c, fork.c) -------------------------------- */

/* Sizes a new file for lay and allocates its first page and tables (the KV
 * stays sparse). Errors: CTXS_EFULL, -errno. */
int ctxs__new_file_size(int fd, const ctxs__file_layout *lay);

/* Writes the first page of a new file in one pwrite: h, both records
 * holding st (record 0 with seq 1, record 1 with seq 0), label (zeros if
 * NULL), zeros elsewhere. Does not sync. Errors: CTXS_EFULL, CTXS_ENOMEM,
 * -errno. */
int ctxs__new_file_first_page(int fd, const ctxs__disk_header *h,
                              const ctxs__state *st, const ctxs__disk_label *label);

/* Writes a whole new file into fd, durably; returns 0 or an error. */
typedef int (*ctxs__fill_fn)(int fd, void *arg);

/* Makes the session file path appear complete or not at all: fill writes it
 * aside, as path.tmp-<pid>-<n> (open read-write, writer lock held), it is
 * linked into place (-EEXIST if path exists) and its directory synced, then
 * opened read-write with options o (resolved). Leaves no file behind on
 * failure. *out is set on success only. */
int ctxs__create_file(ctxs_session **out, const char *path, const ctxs_model *model,
                      const ctxs_open_options *o, ctxs__fill_fn fill, void *arg);

/* ctxs_session_create() and ctxs_session_fork() with the label the new
 * file gets in its first page (NULL: none, or the source's), written and
 * synced with it: a label written later would have to wait for the data
 * the new file's first sync did not. The fork's ASYNC writeback is left to
 * the caller, to start after its own syncs (on ext4 a journal commit waits
 * for every block allocated since the last one: a 288 MiB copy). */
int ctxs__session_create_labeled(ctxs_session **out, const char *path,
                                 const ctxs_model *model, const ctxs_create_options *opts,
                                 const ctxs__disk_label *label);
int ctxs__session_fork_labeled(ctxs_session **out, ctxs_session *src, const char *path,
                               uint64_t n_tokens, const ctxs_open_options *opts,
                               const ctxs__disk_label *label);

/* Compacts the session file at path (session_compact.c): punches out the KV blocks
 * of the slots from min(n_tokens, capacity) on, which hold no token, after
 * a writer's open has settled the state; reserve allocates them again.
 * *bytes_before and *bytes_after get the file's disk space (blocks x 512).
 * Where the filesystem cannot punch holes, nothing changes and 0 is
 * returned. Errors: CTXS_EBUSY (a handle in any process has it open),
 * -ENOENT, -ELOOP, the errors of ctxs_session_open(), CTXS_EFULL, -errno. */
int ctxs__session_compact(const char *path, uint64_t *bytes_before, uint64_t *bytes_after);

/* Rewrites the session file at path with capacity slots (grow.c), into a
 * new file renamed over it; *disk_bytes gets the new file's. Errors:
 * CTXS_EBUSY (a handle in any process has it open), CTXS_EINVAL (no
 * larger capacity, a ring gone round, windowed rings that would change),
 * -ENOENT, the errors of ctxs_session_open(), CTXS_EFULL, -errno. */
int ctxs__session_grow(const char *path, uint32_t capacity, uint64_t *disk_bytes);

#endif
