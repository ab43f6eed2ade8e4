/*
 * What the fuzz targets, the replay driver and the seed generator share:
 * the libFuzzer entry points, scratch directories, a small model and a
 * sample store built with the real library.
 *
 * Every target keeps its per-input work small (files of at most a few MiB,
 * in a tmpfs where there is one), cleans up after each input, and checks
 * that an input leaks no file descriptor (libFuzzer's -detect_leaks checks
 * memory per input).
 */
#ifndef CTXS_FUZZ_H
#define CTXS_FUZZ_H

#include <stddef.h>
#include <stdint.h>

#include "ctxstore.h"

/* libFuzzer's entry points: every target defines the first, and may define
 * the second; the replay driver (replay.c) calls them the same way. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* A fresh directory for this process's scratch files, removed at exit:
 * under $CTXS_FUZZ_TMPDIR, else /dev/shm (a tmpfs, so the syncs the
 * library makes cost nothing), else $TMPDIR, else /tmp. what names the
 * target. Aborts when none can be made. */
const char *fuzz_scratch(const char *what);

/* "a/b" into a malloc'ed string (aborts on failure). */
char *fuzz_join(const char *a, const char *b);

/* Writes a whole file (created 0600, truncated). Returns 0 or -errno. */
int fuzz_write_file(const char *path, const void *data, size_t len);

/* Removes path and everything below it; no error if it is missing. */
void fuzz_rmtree(const char *path);

/* Removes everything inside dir but dir itself. */
void fuzz_empty_dir(const char *dir);

/* Copies the tree src to dst (regular files and directories; files named
 * skip, if not NULL, are left out). Returns 0 or -errno. */
int fuzz_copy_tree(const char *src, const char *dst, const char *skip);

/* The number of open file descriptors of this process. */
int fuzz_fd_count(void);

/* Aborts, saying which target and what, when an input left more file
 * descriptors open than there were before it. */
void fuzz_check_fds(const char *what, int before);

/* Points stdout and stderr (the FILE streams, not the descriptors, which
 * the sanitizers and libFuzzer report through) at /dev/null, and back. */
void fuzz_silence(void);
void fuzz_unsilence(void);

/* printf to stderr when $CTXS_FUZZ_DEBUG is set: what a target did with
 * an input, to see why a corpus file does not reach where it should. */
void fuzz_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* --- The sample store -------------------------------------------------- */

/* The small model the samples use: 1 layer, 2 KV heads, head_dim 4, fp16
 * (32 bytes of KV per token); i varies the hashes. */
ctxs_model fuzz_model(unsigned i);

/* The token id and KV the samples write at position pos. */
uint32_t fuzz_token(uint64_t pos);

/* Reserves, writes and commits n tokens after the committed ones (in
 * commits of at most 50). Returns 0 or the library's error. */
int fuzz_append(ctxs_session *s, uint64_t n);

/* Options for a sample session. */
ctxs_create_options fuzz_options(uint32_t capacity, uint32_t n_sink, uint32_t ring);

/* Builds the sample store in dir (created): model 0 registered as "tiny",
 * model 1 registered without a name, and sessions
 *   "a"    capacity 256, 4 sinks, 150 tokens, checkpoints "cp0" (70) and
 *          "cp1" (150): two prefix chunks
 *   "b"    capacity 16, 2 sinks, ring, 40 tokens: wrapped
 *   "c"    model 1, capacity 8, no ring, no tokens
 *   "d"    forked from "a" at 64 tokens, then 10 more
 * all closed. Returns 0 or the library's error. */
int fuzz_build_store(const char *dir);

/* The leading token ids of sample session "a" (as many as n, at most
 * 150), for prefix lookups. */
void fuzz_sample_tokens(uint32_t *out, uint64_t n);

/* --- Session files as fuzz inputs (session_open_fuzzer.c) -------------- */

/* The control byte that leads a session_open input. */
enum {
    FUZZ_SESS_FIX_HEADER = 0x01,  /* recompute the header's CRC */
    FUZZ_SESS_FIX_RECORDS = 0x02, /* recompute both records' CRCs */
    FUZZ_SESS_FIX_LABEL = 0x04,   /* recompute the label's CRC */
    FUZZ_SESS_THIS_BOOT = 0x08,   /* stamp this boot into both records (and
                                     recompute their CRCs): no recovery */
    FUZZ_SESS_EXTEND = 0x10,      /* extend the file to the header's
                                     file_bytes, when it is small enough */
    FUZZ_SESS_FIX_SUMS = 0x20,    /* recompute the checksums of the held
                                     tokens of the newest record */
    FUZZ_SESS_WRITE = 0x40,       /* also open read-write and write */
    FUZZ_SESS_RAW = 0x80,         /* the rest is the file, as is */
};

/* The control byte that leads an index_file input (then index/data.mdb,
 * as is). */
enum {
    FUZZ_INDEX_WRITE = 0x01,  /* also write through the store */
    FUZZ_INDEX_RDONLY = 0x02, /* open it read-only (no writes then) */
};

/* In the compact form (no FUZZ_SESS_RAW), the bytes after the control
 * byte are, in order, the file's header (256 bytes at offset 0), record 0
 * (128 at 4096), record 1 (128 at 8192), the label (512 at 12288), then
 * everything from offset 16384 on (the tables and the KV): the gaps in
 * the first page, which hold nothing, are left out. */
#define FUZZ_SESS_COMPACT_HEAD 1024u

/* Encodes the session file at path in the compact form with control byte
 * ctl, trailing zeros dropped. *out is malloc'ed. Returns 0 or -errno. */
int fuzz_session_encode(uint8_t **out, size_t *len, const char *path, uint8_t ctl);

#endif
