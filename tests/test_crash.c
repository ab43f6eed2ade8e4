/*
 * Process crashes. A child process commits turns into a session in a loop
 * and tells the parent, through a pipe, what it is about to do and what each
 * call returned; the parent SIGKILLs it at a random moment, reopens the file
 * and checks that the session holds exactly the acknowledged state (or the
 * one whose commit was in flight), and that every held token reads back as
 * it was written. The next child carries on from what it finds, so one file
 * keeps growing and wrapping its ring across hundreds of kills.
 *
 * Runs with --jobs 1 (each Test is its own process and forks its children).
 * Seeds come from CTXS_TEST_SEED when set, else from the clock; each test
 * logs its seed.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ctxstore.h"
#include "format.h"
#include "support.h"

#define MODEL_SEED 7u
#define CAPACITY 256u
#define N_SINK 4u
#define MAX_TURN 40u

/* Contents of generation gen at position pos: generation 0 is what
 * ts_fill_kv()/ts_token() write (so ts_check_all() applies); a position
 * rewritten after a rollback gets a new generation, so old and new bytes
 * differ. */
static uint64_t vpos(uint64_t pos, uint32_t gen)
{
    return pos + ((uint64_t)gen << 40);
}

/* Seeds and counts go to stderr: Criterion shows cr_log_info() only with
 * --verbose, and a failure's seed must reach the default test log. */
#define say(...) (fprintf(stderr, __VA_ARGS__), fputc('\n', stderr))


static int boot_id_known(void)
{
    return access("/proc/sys/kernel/random/boot_id", R_OK) == 0;
}

/* --- What the child tells the parent ------------------------------------- */

enum {
    MSG_APPEND = 1, /* about to append positions [a, b) in generation gen */
    MSG_ROLLBACK,   /* about to roll back from b to a */
    MSG_SYNC,       /* about to sync at a */
    MSG_ACK,        /* the call returned; the committed count is a */
    MSG_WRITTEN,    /* reserved and wrote [a, b), will not commit */
};

/* 24 bytes: one write() to a pipe, atomic (< PIPE_BUF), so a kill never
 * leaves half a message. */
struct msg {
    uint32_t type;
    uint32_t gen;
    uint64_t a, b;
};

enum {
    CHILD_EOPEN = 10,
    CHILD_EINFO,
    CHILD_EAPPEND,
    CHILD_ECOUNT,
    CHILD_EWATERMARK,
    CHILD_EROLLBACK,
    CHILD_ESYNC,
    CHILD_EPIPE,
    CHILD_ERESERVE,
    CHILD_EKV,
};

static const char *child_code_name(int code)
{
    switch (code) {
    case CHILD_EOPEN: return "open failed";
    case CHILD_EINFO: return "info_get failed";
    case CHILD_EAPPEND: return "reserve/write/commit failed";
    case CHILD_ECOUNT: return "n_tokens after a call is not what it should be";
    case CHILD_EWATERMARK: return "verified_from is wrong after a commit or sync";
    case CHILD_EROLLBACK: return "rollback failed";
    case CHILD_ESYNC: return "sync failed";
    case CHILD_EPIPE: return "pipe write failed";
    case CHILD_ERESERVE: return "reserve returned a wrong reservation";
    case CHILD_EKV: return "ctxs_session_get_kv failed";
    default: return "?";
    }
}

static _Noreturn void child_fail(int code, int rc, uint64_t a, uint64_t b)
{
    fprintf(stderr, "crash child: %s (rc %d %s, %llu, %llu)\n", child_code_name(code), rc,
            ctxs_err_name(rc), (unsigned long long)a, (unsigned long long)b);
    _exit(code);
}

static void send_msg(int fd, uint32_t type, uint32_t gen, uint64_t a, uint64_t b)
{
    struct msg m = {type, gen, a, b};
    ssize_t w;
    do
        w = write(fd, &m, sizeof(m));
    while (w < 0 && errno == EINTR);
    if (w != (ssize_t)sizeof(m))
        child_fail(CHILD_EPIPE, -errno, 0, 0);
}

/* Writes tokens [i, i + n) of r, generation gen, a layer at a time
 * (ctxs_session_write_layer()), last layer first. */
static int write_layers(ctxs_session *s, const ctxs_geometry *g, const ctxs_reservation *r,
                        uint32_t i, uint32_t n, uint32_t gen)
{
    uint16_t k[TS_KV_MAX], v[TS_KV_MAX];
    uint16_t lk[(MAX_TURN + 8) * TS_KV_MAX], lv[(MAX_TURN + 8) * TS_KV_MAX];
    const size_t layer = (size_t)g->n_kv_heads * g->head_dim;
    for (uint32_t l = g->n_layers; l-- > 0;) {
        for (uint32_t t = 0; t < n; t++) {
            ts_fill_kv(g, vpos(r->first_pos + i + t, gen), k, v);
            memcpy(lk + t * layer, k + l * layer, layer * 2);
            memcpy(lv + t * layer, v + l * layer, layer * 2);
        }
        int rc = ctxs_session_write_layer(s, r, l, i, n, lk, lv, CTXS_DTYPE_F16);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Reserves n slots and writes generation gen into them, a token at a time
 * or (for about half the turns) a layer at a time, in two calls; no
 * Criterion calls, so that it is safe in a forked child. */
static int reserve_write(ctxs_session *s, const ctxs_geometry *g, uint32_t n, uint32_t gen,
                         ctxs_reservation *r, uint32_t *ids)
{
    uint16_t k[TS_KV_MAX], v[TS_KV_MAX];
    int rc = ctxs_session_reserve(r, s, n);
    if (rc != 0 || n > MAX_TURN + 8)
        return rc ? rc : CTXS_EINVAL;
    for (uint32_t i = 0; i < n; i++)
        ids[i] = ts_token(vpos(r->first_pos + i, gen));
    if (ts_mix64(r->first_pos ^ ((uint64_t)gen << 32)) & 1) {
        uint32_t half = n / 2;
        if ((rc = write_layers(s, g, r, half, n - half, gen)) != 0 ||
            (half && (rc = write_layers(s, g, r, 0, half, gen)) != 0))
            return rc;
        return 0;
    }
    for (uint32_t i = 0; i < n; i++) {
        ts_fill_kv(g, vpos(r->first_pos + i, gen), k, v);
        rc = ctxs_session_write_token(s, r, i, k, v, CTXS_DTYPE_F16);
        if (rc != 0)
            return rc;
    }
    return 0;
}

static int append_gen(ctxs_session *s, const ctxs_geometry *g, uint32_t n, uint32_t gen,
                      uint64_t *first_pos)
{
    uint32_t ids[MAX_TURN + 8];
    ctxs_reservation r;
    if (n > MAX_TURN + 8)
        return CTXS_EINVAL;
    int rc = reserve_write(s, g, n, gen, &r, ids);
    if (rc != 0)
        return rc;
    *first_pos = r.first_pos;
    return ctxs_session_commit(s, ids, n);
}

typedef struct child_args {
    const char *path;
    int fd;
    uint32_t level;
    uint64_t seed;
    uint32_t gen;      /* generation of the first writes */
    int rollbacks;     /* also roll back and sync now and then */
    int dangle_after;  /* < 0: loop until killed; else after this many
                          appends reserve and write a turn, say MSG_WRITTEN,
                          and wait to be killed */
    int dangle_mode;   /* 0: write nothing, 1: the right contents, 2: noise */
} child_args;

static void child_dangle(ctxs_session *s, const child_args *a, const ctxs_geometry *g, uint64_t n,
                         uint32_t gen, uint64_t *rng)
{
    uint32_t k = 1 + (uint32_t)(ts_rng_next(rng) % MAX_TURN);
    ctxs_reservation r;
    uint32_t ids[MAX_TURN];
    int rc;
    if (a->dangle_mode == 1) {
        rc = reserve_write(s, g, k, gen, &r, ids);
        if (rc != 0)
            child_fail(CHILD_EAPPEND, rc, n, k);
    } else {
        rc = ctxs_session_reserve(&r, s, k);
        if (rc != 0)
            child_fail(CHILD_EAPPEND, rc, n, k);
    }
    if (r.first_pos != n || r.n_tokens != k)
        child_fail(CHILD_ERESERVE, 0, r.first_pos, r.n_tokens);
    if (a->dangle_mode == 2) {
        /* Noise straight into the reserved slots of every (layer, K/V, head):
         * not committed, so it must never show up as a token. */
        ctxs_layout lay;
        if (ctxs_session_get_layout(&lay, s) != 0)
            child_fail(CHILD_EKV, -1, 0, 0);
        for (uint32_t l = 0; l < g->n_layers; l++)
            for (uint32_t kind = 0; kind < 2; kind++)
                for (uint32_t h = 0; h < g->n_kv_heads; h++) {
                    void *base;
                    rc = ctxs_session_get_kv(&base, s, l, kind, h);
                    if (rc != 0)
                        child_fail(CHILD_EKV, rc, l, h);
                    for (uint32_t sp = 0; sp < r.n_spans; sp++) {
                        uint8_t *p = (uint8_t *)base + (size_t)r.spans[sp].slot * lay.slot_bytes;
                        for (size_t i = 0; i < r.spans[sp].count * lay.slot_bytes; i++)
                            p[i] = (uint8_t)ts_rng_next(rng);
                    }
                }
    }
    send_msg(a->fd, MSG_WRITTEN, gen, n, n + k);
    for (;;)
        pause();
}

static _Noreturn void child_main(const child_args *a)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    ctxs_model m = ts_model(MODEL_SEED);
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.open.durability = a->level;
    ctxs_session *s;
    int rc = ctxs_session_open(&s, a->path, &m, 0, &o.open);
    if (rc != 0)
        child_fail(CHILD_EOPEN, rc, 0, 0);
    ctxs_session_info info;
    if ((rc = ctxs_session_get_info(&info, s)) != 0)
        child_fail(CHILD_EINFO, rc, 0, 0);
    const ctxs_geometry g = m.geometry;
    uint64_t n = info.n_tokens;
    uint64_t rng = a->seed;
    uint32_t gen = a->gen;

    for (int i = 0;; i++) {
        if (a->dangle_after >= 0 && i == a->dangle_after)
            child_dangle(s, a, &g, n, gen, &rng);
        uint64_t r = ts_rng_next(&rng);
        if (a->rollbacks && r % 6 == 0 && n > 1) {
            uint64_t back = 1 + (r >> 8) % 12;
            uint64_t target = n > back ? n - back : 0;
            uint64_t rs = info.ring_start;
            send_msg(a->fd, MSG_ROLLBACK, gen, target, n);
            rc = ctxs_session_rollback(s, target);
            if ((rc = rc == 0 ? ctxs_session_get_info(&info, s) : rc) == 0) {
                if (info.n_tokens != target)
                    child_fail(CHILD_ECOUNT, 0, info.n_tokens, target);
                n = target;
                gen++; /* what is written at target.. from now on differs */
            } else if (!(rc == CTXS_EEVICTED && rs > N_SINK)) {
                /* Only a ring that has evicted may refuse a rollback. */
                child_fail(CHILD_EROLLBACK, rc, target, n);
            }
            send_msg(a->fd, MSG_ACK, gen, n, n);
        } else if (a->rollbacks && r % 17 == 1) {
            send_msg(a->fd, MSG_SYNC, gen, n, n);
            if ((rc = ctxs_session_sync(s)) != 0)
                child_fail(CHILD_ESYNC, rc, n, 0);
            if ((rc = ctxs_session_get_info(&info, s)) != 0)
                child_fail(CHILD_EINFO, rc, 0, 0);
            if (info.n_tokens != n)
                child_fail(CHILD_ECOUNT, 0, info.n_tokens, n);
            if (info.verified_from != n)
                child_fail(CHILD_EWATERMARK, 0, info.verified_from, n);
            send_msg(a->fd, MSG_ACK, gen, n, n);
        } else {
            uint32_t k = 1 + (uint32_t)((r >> 16) % MAX_TURN);
            uint64_t first = 0;
            send_msg(a->fd, MSG_APPEND, gen, n, n + k);
            if ((rc = append_gen(s, &g, k, gen, &first)) != 0)
                child_fail(CHILD_EAPPEND, rc, n, k);
            if ((rc = ctxs_session_get_info(&info, s)) != 0)
                child_fail(CHILD_EINFO, rc, 0, 0);
            if (first != n || info.n_tokens != n + k)
                child_fail(CHILD_ECOUNT, 0, info.n_tokens, n + k);
            /* FULL: everything is durable; otherwise the new tokens are
             * not, and the watermark must not claim them. */
            if (a->level == CTXS_SYNC_FULL ? info.verified_from != n + k
                                           : info.verified_from > first)
                child_fail(CHILD_EWATERMARK, 0, info.verified_from, first);
            n += k;
            send_msg(a->fd, MSG_ACK, gen, n, n);
        }
    }
}

/* --- The parent ------------------------------------------------------------ */

/* Checks every position below n_tokens: held ones read back exactly as
 * generation gs->v[p] wrote them (K, V and token id) from the slot the
 * format says; the others are reported evicted. Returns the number of
 * wrong positions. */
static uint64_t check_held(const ctxs_session *s, const ts_gens *gs, const char *what)
{
    ctxs_session_info info;
    ctxs_layout lay;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(ctxs_session_get_layout(&lay, s), 0);
    const ctxs_geometry *g = &info.model.geometry;
    size_t per = (size_t)g->n_layers * g->n_kv_heads * g->head_dim;
    cr_assert(per <= TS_KV_MAX);
    uint16_t k[TS_KV_MAX], v[TS_KV_MAX], ek[TS_KV_MAX], ev[TS_KV_MAX];
    uint64_t bad = 0, n = info.n_tokens, rs = info.ring_start;
    uint32_t ns = info.n_sink;
    uint64_t first_recent = rs > ns ? rs : ns;
    for (uint64_t p = 0; p < n; p++) {
        int held = p < ns || p >= first_recent;
        if (!held && p > ns && p + 1 < first_recent)
            p = first_recent - 1; /* evicted: check the two ends only */
        int rc = ctxs_session_read_token(k, v, s, p, CTXS_DTYPE_F16);
        if (!held) {
            cr_assert_eq(rc, CTXS_EEVICTED, "%s: position %llu is below ring_start %llu but read_token says %s",
                         what, (unsigned long long)p, (unsigned long long)rs, ctxs_err_name(rc));
            continue;
        }
        cr_assert_eq(rc, 0, "%s: read_token(%llu) of %llu: %s", what, (unsigned long long)p,
                     (unsigned long long)n, ctxs_err_name(rc));
        uint32_t slot;
        cr_assert_eq(ctxs_session_get_slot(&slot, s, p), 0);
        cr_assert_eq(slot, ctxs__slot_of(p, info.capacity, ns), "%s: position %llu in slot %u",
                     what, (unsigned long long)p, slot);
        uint32_t gen = gs && p < gs->cap ? gs->v[p] : 0;
        ts_fill_kv(g, vpos(p, gen), ek, ev);
        if (memcmp(k, ek, per * 2) || memcmp(v, ev, per * 2) ||
            lay.token_ids[slot] != ts_token(vpos(p, gen))) {
            if (bad++ < 4)
                cr_log_error("%s: position %llu (slot %u, gen %u) reads back wrong", what,
                             (unsigned long long)p, slot, gen);
        }
    }
    int rc = ctxs_session_read_token(k, v, s, n, CTXS_DTYPE_F16);
    cr_assert_eq(rc, CTXS_ENOTFOUND, "%s: read_token(n_tokens) gives %s", what, ctxs_err_name(rc));
    return bad;
}

static ctxs_session *open_checked(const char *path, unsigned flags, uint32_t recovery,
                                  ctxs_session_info *info, const char *what)
{
    ctxs_model m = ts_model(MODEL_SEED);
    ctxs_session *s = NULL;
    int rc = ctxs_session_open(&s, path, &m, flags | recovery, NULL);
    cr_assert_eq(rc, 0, "%s: open(%s, %s): %s", what, flags & CTXS_RDONLY ? "ro" : "rw",
                 recovery == CTXS_OPEN_VERIFY ? "VERIFY" : "AUTO", ctxs_err_name(rc));
    cr_assert_eq(ctxs_session_get_info(info, s), 0);
    return s;
}

/* After a kill: the state must be one of the two the child could have left
 * (lo: before the call in flight, hi: after it), the same read-only with
 * VERIFY and read-write with `recovery`, complete (a process crash keeps the
 * page cache: nothing may be reported lost), and read back exactly. */
static uint64_t reopen_check(const char *path, uint64_t lo, uint64_t hi, const ts_gens *gs,
                             uint32_t recovery, const char *what)
{
    ctxs_session_info a, b;
    uint64_t bad_pos = 0;
    int rc;

    ctxs_session *s = open_checked(path, CTXS_RDONLY, CTXS_OPEN_VERIFY, &a, what);
    cr_assert(a.n_tokens == lo || a.n_tokens == hi,
              "%s: reopened with %llu tokens; the child left %llu or %llu", what,
              (unsigned long long)a.n_tokens, (unsigned long long)lo, (unsigned long long)hi);
    cr_assert_eq(a.lost_tokens, 0, "%s: VERIFY after a process crash lost %llu tokens", what,
                 (unsigned long long)a.lost_tokens);
    cr_assert_eq(check_held(s, gs, what), 0, "%s: wrong tokens (read-only, VERIFY)", what);
    rc = ctxs_session_verify(&bad_pos, s);
    cr_assert_eq(rc, 0, "%s: verify: %s at %llu", what, ctxs_err_name(rc), (unsigned long long)bad_pos);
    ctxs_session_close(s);

    s = open_checked(path, 0, recovery, &b, what);
    cr_assert_eq(b.n_tokens, a.n_tokens, "%s: read-write open sees %llu tokens, read-only %llu", what,
                 (unsigned long long)b.n_tokens, (unsigned long long)a.n_tokens);
    cr_assert_eq(b.ring_start, a.ring_start);
    cr_assert_eq(b.lost_tokens, 0);
    cr_assert_eq(b.n_reserved, 0, "%s: a fresh open holds %u reserved slots", what, b.n_reserved);
    if (recovery == 0 && boot_id_known())
        cr_assert(!(b.flags & CTXS_INFO_VERIFIED),
                  "%s: AUTO verified tokens although the file was written in this boot", what);
    cr_assert_eq(check_held(s, gs, what), 0, "%s: wrong tokens (read-write)", what);
    rc = ctxs_session_verify(&bad_pos, s);
    cr_assert_eq(rc, 0, "%s: verify: %s at %llu", what, ctxs_err_name(rc), (unsigned long long)bad_pos);
    ctxs_session_close(s);
    return a.n_tokens;
}

static void create_session(const char *path, uint32_t level)
{
    ctxs_model m = ts_model(MODEL_SEED);
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = CAPACITY;
    o.n_sink = N_SINK;
    o.ring = 1;
    o.open.durability = level;
    ctxs_session *s;
    int rc = ctxs_session_create(&s, path, &m, &o);
    cr_assert_eq(rc, 0, "create: %s", ctxs_err_name(rc));
    ctxs_session_close(s);
}

static void check_all_ro(const char *path, const char *what)
{
    ctxs_session_info info;
    ctxs_session *s = open_checked(path, CTXS_RDONLY, 0, &info, what);
    cr_assert_eq(ts_check_all(s), 0, "%s: ts_check_all", what);
    ctxs_session_close(s);
}

typedef struct child_run {
    pid_t pid;
    int fd;
} child_run;

static child_run spawn(child_args *a)
{
    int p[2];
    cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
    (void)fcntl(p[1], F_SETPIPE_SZ, 1 << 20); /* never block the child */
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_neq(pid, -1, "fork: %s", strerror(errno));
    if (pid == 0) {
        close(p[0]);
        a->fd = p[1];
        child_main(a);
    }
    close(p[1]);
    return (child_run){pid, p[0]};
}

/* Reads one message; 0 at end of file. */
static int read_msg(int fd, struct msg *m)
{
    size_t got = 0;
    while (got < sizeof(*m)) {
        ssize_t r = read(fd, (char *)m + got, sizeof(*m) - got);
        if (r < 0 && errno == EINTR)
            continue;
        cr_assert_geq(r, 0, "read: %s", strerror(errno));
        if (r == 0)
            break;
        got += (size_t)r;
    }
    cr_assert(got == 0 || got == sizeof(*m), "torn message from the child (%zu bytes)", got);
    return got != 0;
}

typedef struct outcome {
    uint64_t lo, hi;  /* the state is one of these */
    uint64_t acks;    /* calls acknowledged */
    uint32_t last;    /* last message type, 0 if none */
} outcome;

static void apply_msg(outcome *o, const struct msg *m, ts_gens *gs)
{
    o->last = m->type;
    switch (m->type) {
    case MSG_APPEND:
        cr_assert_eq(m->a, o->hi, "append intent from %llu, acknowledged %llu",
                     (unsigned long long)m->a, (unsigned long long)o->hi);
        ts_gens_set(gs, m->a, m->b, m->gen);
        o->lo = m->a;
        o->hi = m->b;
        break;
    case MSG_WRITTEN: /* reserved and written, never committed */
        ts_gens_set(gs, m->a, m->b, m->gen);
        o->lo = o->hi = m->a;
        break;
    case MSG_ROLLBACK:
    case MSG_SYNC:
        o->lo = m->a;
        o->hi = m->b;
        break;
    case MSG_ACK:
        o->lo = o->hi = m->a;
        o->acks++;
        if (m->gen > gs->hi)
            gs->hi = m->gen;
        break;
    default:
        cr_assert_fail("unknown message %u", m->type);
    }
}

/* Drains the child's messages: the last one says what state it left. */
static void drain(int fd, outcome *o, ts_gens *gs)
{
    struct msg m;
    while (read_msg(fd, &m))
        apply_msg(o, &m, gs);
    close(fd);
}

static void reap_killed(pid_t pid)
{
    int st = ts_wait(pid);
    if (WIFEXITED(st))
        cr_assert_fail("the child exited with %d (%s) before it was killed; see its stderr",
                       WEXITSTATUS(st), child_code_name(WEXITSTATUS(st)));
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the child died of signal %d",
              WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

typedef struct loop_stats {
    uint64_t kills, acks, in_flight, n_end, ring_start_end;
} loop_stats;

/* kills children at levels[i % n_levels], each after a random delay below
 * max_delay_us[level], all on one file. */
static loop_stats kill_loop(const char *test, const uint32_t *levels, unsigned n_levels,
                            unsigned kills, const unsigned *max_delay_us, int rollbacks)
{
    uint64_t rng = ts_seed(test);
    char *dir = ts_mkdtemp();
    const char *path = ts_path(dir, "kill.ctxs");
    char path_copy[4096];
    snprintf(path_copy, sizeof(path_copy), "%s", path);
    create_session(path_copy, levels[0]);

    ts_gens gs = {0};
    ts_gens_set(&gs, 0, 1, 0);
    loop_stats st = {0};
    uint64_t n = 0;
    for (unsigned i = 0; i < kills; i++) {
        uint32_t level = levels[i % n_levels];
        child_args a = {
            .path = path_copy,
            .level = level,
            .seed = ts_rng_next(&rng),
            .gen = rollbacks ? gs.hi + 1 : 0,
            .rollbacks = rollbacks,
            .dangle_after = -1,
        };
        uint64_t delay = ts_rng_next(&rng) % max_delay_us[level];
        child_run c = spawn(&a);
        ts_sleep_us(delay);
        kill(c.pid, SIGKILL);
        reap_killed(c.pid);
        outcome o = {n, n, 0, 0};
        drain(c.fd, &o, &gs);

        char what[160];
        snprintf(what, sizeof(what), "kill %u (level %u, after %llu us, %llu calls acknowledged)", i,
                 level, (unsigned long long)delay, (unsigned long long)o.acks);
        n = reopen_check(path_copy, o.lo, o.hi, &gs,
                         i % 2 ? CTXS_OPEN_VERIFY : 0, what);
        /* All generation 0: the shared checker applies (it walks every
         * position ever committed, so not after every kill). */
        if (!rollbacks && (i % 16 == 15 || i + 1 == kills))
            check_all_ro(path_copy, what);
        st.kills++;
        st.acks += o.acks;
        st.in_flight += o.lo != o.hi;
    }
    ctxs_session_info info;
    ctxs_session *s = open_checked(path_copy, CTXS_RDONLY, CTXS_OPEN_VERIFY, &info, test);
    st.n_end = info.n_tokens;
    st.ring_start_end = info.ring_start;
    ctxs_session_close(s);
    say("%s: %llu kills, %llu calls acknowledged, %llu kills with a call in flight, "
                "%llu positions at the end (ring_start %llu)",
                test, (unsigned long long)st.kills, (unsigned long long)st.acks,
                (unsigned long long)st.in_flight, (unsigned long long)st.n_end,
                (unsigned long long)st.ring_start_end);
    free(gs.v);
    ts_rmtree(dir);
    free(dir);
    return st;
}

static const unsigned delays_us[3] = {
    [CTXS_SYNC_NONE] = 3000,
    [CTXS_SYNC_ASYNC] = 3000,
    [CTXS_SYNC_FULL] = 25000, /* fdatasync: give the child time to commit */
};

Test(crash, killed_writers_at_none_and_async_leave_the_acknowledged_state, .timeout = 300)
{
    const uint32_t levels[] = {CTXS_SYNC_NONE, CTXS_SYNC_ASYNC};
    loop_stats st = kill_loop("none+async", levels, 2, 300, delays_us, 0);
    cr_assert_gt(st.ring_start_end, N_SINK, "the ring never wrapped: the test lost its point");
}

Test(crash, killed_writers_at_full_leave_the_acknowledged_state, .timeout = 300)
{
    const uint32_t levels[] = {CTXS_SYNC_FULL};
    kill_loop("full", levels, 1, 30, delays_us, 0);
}

Test(crash, killed_writers_that_roll_back_and_sync_leave_the_acknowledged_state, .timeout = 300)
{
    const uint32_t levels[] = {CTXS_SYNC_NONE, CTXS_SYNC_ASYNC, CTXS_SYNC_NONE, CTXS_SYNC_ASYNC,
                               CTXS_SYNC_FULL};
    loop_stats st = kill_loop("rollback", levels, 5, 120, delays_us, 1);
    cr_assert_gt(st.ring_start_end, N_SINK, "the ring never wrapped: the test lost its point");
}

/* A child reserves a turn, writes nothing, the right bytes or noise into the
 * reserved slots, and is killed before it commits: the reopened session holds
 * exactly what was committed before (in a full ring, minus what the reserve
 * evicted), and the slots are handed out again. */
Test(crash, killed_between_reserve_and_commit_keeps_the_previous_state, .timeout = 300)
{
    uint64_t rng = ts_seed("dangling");
    char *dir = ts_mkdtemp();
    char path[4096];
    snprintf(path, sizeof(path), "%s", ts_path(dir, "dangle.ctxs"));
    create_session(path, CTXS_SYNC_NONE);
    const uint32_t levels[] = {CTXS_SYNC_NONE, CTXS_SYNC_ASYNC, CTXS_SYNC_NONE, CTXS_SYNC_FULL};
    ts_gens gs = {0};
    ts_gens_set(&gs, 0, 1, 0);
    uint64_t n = 0, rs_prev = 0;
    unsigned iters = 48;
    for (unsigned i = 0; i < iters; i++) {
        child_args a = {
            .path = path,
            .level = levels[i % 4],
            .seed = ts_rng_next(&rng),
            .dangle_after = (int)(ts_rng_next(&rng) % 4),
            .dangle_mode = (int)(i % 3),
        };
        child_run c = spawn(&a);
        outcome o = {n, n, 0, 0};
        struct msg m;
        int got = 0;
        while (!got && read_msg(c.fd, &m)) {
            apply_msg(&o, &m, &gs);
            got = m.type == MSG_WRITTEN;
        }
        kill(c.pid, SIGKILL);
        reap_killed(c.pid); /* reports a child that failed before MSG_WRITTEN */
        cr_assert(got, "the child never reserved its dangling turn");
        drain(c.fd, &o, &gs);
        cr_assert_eq(o.last, MSG_WRITTEN);

        char what[128];
        snprintf(what, sizeof(what), "dangling %u (level %u, mode %d, [%llu, %llu))", i, a.level,
                 a.dangle_mode, (unsigned long long)m.a, (unsigned long long)m.b);
        n = reopen_check(path, o.lo, o.hi, &gs, i % 2 ? CTXS_OPEN_VERIFY : 0,
                         what);
        cr_assert_eq(n, m.a, "%s: %llu tokens after the kill", what, (unsigned long long)n);
        check_all_ro(path, what);

        /* The slots of the dead reservation are handed out again. */
        ctxs_session_info info;
        ctxs_session *s = open_checked(path, 0, 0, &info, what);
        cr_assert_geq(info.ring_start, rs_prev, "%s: ring_start went back", what);
        int rc = ts_append(s, 3);
        cr_assert_eq(rc, 0, "%s: append after the kill: %s", what, ctxs_err_name(rc));
        ts_gens_set(&gs, n, n + 3, 0);
        cr_assert_eq(ctxs_session_get_info(&info, s), 0);
        cr_assert_eq(info.n_tokens, n + 3);
        cr_assert_eq(check_held(s, &gs, what), 0);
        ctxs_session_close(s);
        n += 3;
        rs_prev = info.ring_start;
    }
    cr_assert_gt(rs_prev, N_SINK, "the ring never wrapped: the test lost its point");
    say("dangling: %u kills between reserve and commit, %llu positions at the end", iters,
                (unsigned long long)n);
    free(gs.v);
    ts_rmtree(dir);
    free(dir);
}
