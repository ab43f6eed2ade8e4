/*
 * Sessions whose layer schedule mixes global layers with sliding-window
 * layers of two windows: each windowed layer keeps a ring of its window
 * plus the batch, and everything (commit, verify, recovery after a
 * SIGKILL, fork, rollback, attention) follows it, in every dtype.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <zlib.h>

#include "ctxstore.h"
#include "export_format.h"
#include "internal.h"
#include "support.h"

TestSuite(schedule, .init = ts_scratch_init, .fini = ts_scratch_fini, .timeout = 300);

/* 6 layers, pattern [global, window 6, window 10]: layers 0 and 3 global,
 * 1 and 4 windowed at 6, 2 and 5 at 10. */
#define LAYERS 6
#define HEADS 2
#define DIM 16
#define CAP 128
#define BATCH 4
#define PER (LAYERS * HEADS * DIM)

static const uint32_t dtypes[] = {CTXS_DTYPE_F16, CTXS_DTYPE_BF16, CTXS_DTYPE_Q8};

static ctxs_model sched_model(uint32_t dtype)
{
    ctxs_model m = ts_model(7);
    m.geometry = (ctxs_geometry){LAYERS, HEADS, DIM, dtype, 3, {0, 6, 10}};
    return m;
}

static float value(uint64_t pos, uint32_t l, uint32_t kind, uint32_t h, uint32_t i)
{
    uint64_t x = ts_mix64(((pos * 8 + l) * 2 + kind) * 64 + h * 16 + i);
    return (float)((double)(x % 2001) / 1000.0 - 1.0);
}

static uint32_t token(uint64_t pos)
{
    return ts_token(pos) ^ 0x55u;
}

static void fill(float *k, float *v, uint64_t pos)
{
    for (uint32_t l = 0; l < LAYERS; l++)
        for (uint32_t h = 0; h < HEADS; h++)
            for (uint32_t i = 0; i < DIM; i++) {
                k[(l * HEADS + h) * DIM + i] = value(pos, l, 0, h, i);
                v[(l * HEADS + h) * DIM + i] = value(pos, l, 1, h, i);
            }
}

static ctxs_session *make(const char *name, uint32_t dtype, uint32_t durability)
{
    ctxs_model m = sched_model(dtype);
    ctxs_create_options o = ts_options(CAP, 4, 0, durability);
    o.batch = BATCH;
    ctxs_session *s = NULL;
    int rc = ctxs_session_create(&s, ts_path(ts_scratch, name), &m, &o);
    cr_assert_eq(rc, 0, "create: %s", ctxs_strerror(rc));
    return s;
}

/* Appends n tokens, in turns of at most the batch. */
static int append(ctxs_session *s, uint32_t n)
{
    float k[PER], v[PER];
    while (n) {
        uint32_t c = n < BATCH ? n : BATCH;
        ctxs_reservation r;
        int rc = ctxs_session_reserve(&r, s, c);
        uint32_t ids[BATCH];
        for (uint32_t i = 0; rc == 0 && i < c; i++) {
            fill(k, v, r.first_pos + i);
            ids[i] = token(r.first_pos + i);
            rc = ctxs_session_write_token(s, &r, i, k, v, CTXS_DTYPE_F32);
        }
        if (rc == 0)
            rc = ctxs_session_commit(s, ids, c);
        if (rc)
            return rc;
        n -= c;
    }
    return 0;
}

/* What dtype makes of x (F16/BF16 rounding, Q8 quantization per head). */
static void expected(float *out, const float *x, uint32_t dtype)
{
    for (uint32_t hd = 0; hd < LAYERS * HEADS; hd++) {
        uint8_t enc[DIM * 2];
        float scale = 0;
        cr_assert_eq(ctxs_dtype_encode(enc, &scale, x + hd * DIM, DIM, dtype), 0);
        for (uint32_t i = 0; i < DIM; i++) {
            float f;
            if (dtype == CTXS_DTYPE_Q8) {
                f = scale * (float)(int8_t)enc[i];
            } else {
                uint16_t u;
                memcpy(&u, enc + 2 * i, 2);
                if (dtype == CTXS_DTYPE_BF16) {
                    uint32_t b = (uint32_t)u << 16;
                    memcpy(&f, &b, 4);
                } else {
                    f = ctxs__f16_to_f32(u);
                }
            }
            out[hd * DIM + i] = f;
        }
    }
}

/* Every position of s reads back: global layers all of them, windowed
 * layers their window (older positions as zeros). */
static void check(const ctxs_session *s, uint32_t dtype)
{
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    uint64_t n = info.n_tokens;
    float k[PER], v[PER], x[PER], y[PER], ek[PER], ev[PER];
    for (uint64_t p = 0; p < n; p++) {
        cr_assert_eq(ctxs_session_read_token(k, v, s, p, CTXS_DTYPE_F32), 0, "read %llu",
                     (unsigned long long)p);
        fill(x, y, p);
        expected(ek, x, dtype);
        expected(ev, y, dtype);
        for (uint32_t l = 0; l < LAYERS; l++) {
            uint32_t w = ctxs_geometry_get_window(&info.model.geometry, l);
            int held = !w || p + w >= n;
            for (uint32_t j = l * HEADS * DIM; j < (l + 1) * HEADS * DIM; j++) {
                cr_assert(k[j] == (held ? ek[j] : 0.0f) && v[j] == (held ? ev[j] : 0.0f),
                          "position %llu layer %u (window %u) element %u",
                          (unsigned long long)p, l, w, j);
            }
        }
        uint32_t id;
        cr_assert_eq(ctxs_session_get_tokens(&id, s, p, 1), 0);
        cr_assert_eq(id, token(p));
    }
    cr_assert_eq(ctxs_session_verify(NULL, s), 0);
}

Test(schedule, create_commit_reopen_and_read_back_in_every_dtype)
{
    for (size_t d = 0; d < 3; d++) {
        char name[32];
        snprintf(name, sizeof(name), "mixed-%zu.ctxs", d);
        ctxs_session *s = make(name, dtypes[d], CTXS_SYNC_ASYNC);
        cr_assert_eq(append(s, 50), 0);
        check(s, dtypes[d]);
        ctxs_session_info info;
        cr_assert_eq(ctxs_session_get_info(&info, s), 0);
        cr_assert_eq(info.model.geometry.period, 3);
        cr_assert_eq(info.model.geometry.window[1], 6);
        cr_assert_eq(info.model.geometry.window[2], 10);
        cr_assert_eq(info.format_major, 3);
        ctxs_session_close(s);

        /* Another boot's open verifies everything; the same file opens and
         * reads back; a model of another schedule is refused. */
        ctxs_model m = sched_model(dtypes[d]);
        cr_assert_eq(ctxs_session_open(&s, ts_path(ts_scratch, name), &m, CTXS_OPEN_VERIFY, NULL),
                     0);
        cr_assert_eq(ctxs_session_get_info(&info, s), 0);
        cr_assert_eq(info.n_tokens, 50);
        cr_assert_eq(info.flags & CTXS_INFO_RECOVERED, 0);
        check(s, dtypes[d]);
        cr_assert_eq(append(s, 9), 0);
        check(s, dtypes[d]);
        ctxs_session_close(s);
        ctxs_model other = m;
        other.geometry.window[2] = 12;
        cr_assert_eq(ctxs_session_open(&s, ts_path(ts_scratch, name), &other, 0, NULL),
                     CTXS_EMODEL);
        other = m;
        other.geometry.period = 0;
        memset(other.geometry.window, 0, sizeof(other.geometry.window));
        cr_assert_eq(ctxs_session_open(&s, ts_path(ts_scratch, name), &other, 0, NULL),
                     CTXS_EMODEL);
    }
}

Test(schedule, windowed_layers_keep_only_their_ring)
{
    ctxs_model m = sched_model(CTXS_DTYPE_F16), global = m;
    global.geometry.period = 0;
    memset(global.geometry.window, 0, sizeof(global.geometry.window));
    ctxs_create_options o = ts_options(CAP, 4, 0, CTXS_SYNC_NONE);
    o.batch = BATCH;
    ctxs_session *a, *b;
    cr_assert_eq(ctxs_session_create(&a, ts_path(ts_scratch, "w.ctxs"), &m, &o), 0);
    cr_assert_eq(ctxs_session_create(&b, ts_path(ts_scratch, "g.ctxs"), &global, &o), 0);
    ctxs_session_info ia, ib;
    cr_assert_eq(ctxs_session_get_info(&ia, a), 0);
    cr_assert_eq(ctxs_session_get_info(&ib, b), 0);
    /* KV: 2 global layers of 128 slots, 2 rings of 6 + 4, 2 of 10 + 4;
     * against 6 layers of 128. */
    uint64_t slot = (uint64_t)2 * HEADS * DIM * 2; /* K and V, all heads */
    uint64_t kv_w = slot * (2 * CAP + 2 * 10 + 2 * 14), kv_g = slot * 6 * CAP;
    cr_assert_lt(ia.file_bytes, ib.file_bytes);
    cr_assert_leq(ia.file_bytes - ib.file_bytes + kv_g, kv_w + 4 * 16384,
                  "the windowed file is %llu bytes", (unsigned long long)ia.file_bytes);
    /* A windowed layer's runs are its ring's slots. */
    ctxs_layout lk;
    ctxs_attn_plan plan;
    cr_assert_eq(append(a, 8), 0);
    cr_assert_eq(ctxs_session_get_layer_attn(&lk, &plan, a, 1, 0), 0);
    cr_assert_eq(lk.capacity, 10);
    cr_assert_eq(lk.n_sink, 0);
    cr_assert_eq(plan.window, 6);
    cr_assert_eq(ctxs_session_get_layer_attn(&lk, &plan, a, 5, 0), 0);
    cr_assert_eq(lk.capacity, 14);
    cr_assert_eq(ctxs_session_get_layer_attn(&lk, &plan, a, 3, 0), 0);
    cr_assert_eq(lk.capacity, CAP);
    /* More uncommitted tokens than the batch would overwrite a window. */
    ctxs_reservation r;
    cr_assert_eq(ctxs_session_reserve(&r, a, BATCH + 1), CTXS_EINVAL);
    cr_assert_eq(ctxs_session_reserve(&r, a, BATCH), 0);
    cr_assert_eq(ctxs_session_reserve(&r, a, 1), CTXS_EINVAL);
    /* The full layout is refused by the kernel: its layers differ. */
    ctxs_layout full;
    cr_assert_eq(ctxs_session_get_layout(&full, a), 0);
    float q[2 * HEADS * DIM] = {0}, out[2 * HEADS * DIM];
    ctxs_attn_query aq = {q, 7, 1, HEADS, 0};
    cr_assert_eq(ctxs_session_get_attn_plan(&plan, a, 0), 0);
    cr_assert_eq(ctxs_attention(out, &full, &plan, 0, &aq), CTXS_EINVAL);
    ctxs_session_close(a);
    ctxs_session_close(b);
}

/* An engine that stores through the mapping finds each layer's slots from
 * ctxs_session_get_layer_slots(): a windowed ring takes position p at slot
 * p % slots, a global layer at the reservation's slot; what it stores
 * reads back and verifies as ctxs_session_write_token()'s would. */
Test(schedule, stores_through_the_mapping_go_where_each_layer_keeps_them)
{
    ctxs_session *s = make("mapped.ctxs", CTXS_DTYPE_F16, CTXS_SYNC_NONE);
    cr_assert_eq(append(s, 30), 0); /* every ring has wrapped */
    uint32_t slots[LAYERS];
    for (uint32_t l = 0; l < LAYERS; l++)
        cr_assert_eq(ctxs_session_get_layer_slots(&slots[l], s, l), 0);
    cr_assert_eq(slots[0], CAP);
    cr_assert_eq(slots[1], 6 + BATCH);
    cr_assert_eq(slots[2], 10 + BATCH);
    uint32_t none;
    cr_assert_eq(ctxs_session_get_layer_slots(&none, s, LAYERS), CTXS_EINVAL);

    ctxs_reservation r;
    cr_assert_eq(ctxs_session_reserve(&r, s, 2), 0);
    float k[PER], v[PER];
    uint32_t ids[2];
    for (uint32_t i = 0; i < 2; i++) {
        uint64_t pos = r.first_pos + i;
        fill(k, v, pos);
        ids[i] = token(pos);
        for (uint32_t l = 0; l < LAYERS; l++) {
            uint32_t slot = slots[l] < CAP ? (uint32_t)(pos % slots[l]) : r.spans[0].slot + i;
            for (uint32_t kind = 0; kind < 2; kind++)
                for (uint32_t h = 0; h < HEADS; h++) {
                    void *run;
                    cr_assert_eq(ctxs_session_get_kv(&run, s, l, kind, h), 0);
                    const float *x = (kind ? v : k) + (l * HEADS + h) * DIM;
                    cr_assert_eq(ctxs_dtype_encode((uint16_t *)run + (size_t)slot * DIM, NULL,
                                                   x, DIM, CTXS_DTYPE_F16), 0);
                }
        }
    }
    cr_assert_eq(ctxs_session_commit(s, ids, 2), 0);
    check(s, CTXS_DTYPE_F16);
    ctxs_session_close(s);
}

Test(schedule, rollback_within_the_rings_is_exact_and_past_them_refused)
{
    for (size_t d = 0; d < 3; d++) {
        char name[32];
        snprintf(name, sizeof(name), "rb-%zu.ctxs", d);
        ctxs_session *s = make(name, dtypes[d], CTXS_SYNC_FULL);
        cr_assert_eq(append(s, 40), 0);
        /* The window 6 ring holds 10 positions, 30..39: a rollback to 36
         * needs 30..35, held. To 35 needs 29: gone. */
        cr_assert_eq(ctxs_session_rollback(s, 35), CTXS_EEVICTED);
        cr_assert_eq(ts_n_tokens(s), 40);
        cr_assert_eq(ctxs_session_rollback(s, 36), 0);
        check(s, dtypes[d]);
        /* A reservation rewrote ring slots: a rollback that needs them is
         * refused, never served from the rewritten bytes. */
        cr_assert_eq(append(s, 4), 0); /* 40 again, the same values */
        check(s, dtypes[d]);
        /* Positions 40 and 41 go to the slots of 30 and 31 (ring of 10). */
        ctxs_reservation r;
        cr_assert_eq(ctxs_session_reserve(&r, s, 2), 0);
        float k[PER], v[PER];
        for (uint32_t i = 0; i < 2; i++) {
            fill(k, v, 1000 + i);
            cr_assert_eq(ctxs_session_write_token(s, &r, i, k, v, CTXS_DTYPE_F32), 0);
        }
        cr_assert_eq(ctxs_session_rollback(s, 37), CTXS_EEVICTED); /* needs 31 */
        cr_assert_eq(ctxs_session_rollback(s, 40), 0); /* drops the reservation */
        cr_assert_eq(ctxs_session_rollback(s, 38), 0);  /* needs 32..37 */
        check(s, dtypes[d]);
        ctxs_session_close(s);
        /* After a reopen, the rings serve a rollback as before. */
        ctxs_model m = sched_model(dtypes[d]);
        cr_assert_eq(ctxs_session_open(&s, ts_path(ts_scratch, name), &m, 0, NULL), 0);
        cr_assert_eq(ctxs_session_rollback(s, 37), CTXS_EEVICTED);
        cr_assert_eq(ctxs_session_rollback(s, 38), 0);
        cr_assert_eq(append(s, 12), 0);
        cr_assert_eq(ctxs_session_rollback(s, 47), 0);
        check(s, dtypes[d]);
        cr_assert_eq(append(s, 3), 0);
        check(s, dtypes[d]);
        ctxs_session_close(s);
        cr_assert_eq(ctxs_session_open(&s, ts_path(ts_scratch, name), &m, CTXS_OPEN_VERIFY, NULL),
                     0);
        cr_assert_eq(ts_n_tokens(s), 50);
        check(s, dtypes[d]);
        ctxs_session_close(s);
    }
}

Test(schedule, fork_holds_the_windows_of_its_count)
{
    for (size_t d = 0; d < 3; d++) {
        char name[32], fname[32];
        snprintf(name, sizeof(name), "src-%zu.ctxs", d);
        snprintf(fname, sizeof(fname), "fork-%zu.ctxs", d);
        ctxs_session *s = make(name, dtypes[d], CTXS_SYNC_ASYNC), *f = NULL;
        cr_assert_eq(append(s, 33), 0);
        cr_assert_eq(ctxs_session_fork(&f, s, ts_path(ts_scratch, "x.ctxs"), 20, NULL),
                     CTXS_EEVICTED);
        cr_assert_eq(ctxs_session_fork(&f, s, ts_path(ts_scratch, fname), 31, NULL), 0);
        cr_assert_eq(ts_n_tokens(f), 31);
        check(f, dtypes[d]);
        cr_assert_eq(append(f, 7), 0);
        check(f, dtypes[d]);
        ctxs_session_close(f);
        ctxs_model m = sched_model(dtypes[d]);
        cr_assert_eq(ctxs_session_open(&f, ts_path(ts_scratch, fname), &m, CTXS_OPEN_VERIFY,
                                       NULL),
                     0);
        cr_assert_eq(ts_n_tokens(f), 38);
        check(f, dtypes[d]);
        ctxs_session_close(f);
        check(s, dtypes[d]);
        ctxs_session_close(s);
    }
}

/* A damaged byte in a windowed layer's window, above the watermark (NONE
 * never raises it; ASYNC may, before a ring reuses its window's slots): an
 * open that verifies finds it, and keeps the newest count whose windows
 * all still verify. */
Test(schedule, recovery_keeps_a_state_whose_windows_verify)
{
    ctxs_session *s = make("dmg.ctxs", CTXS_DTYPE_F16, CTXS_SYNC_NONE);
    cr_assert_eq(append(s, 30), 0);
    void *run;
    /* Layer 2 (window 10, ring of 14): position 27 is slot 27 % 14. */
    cr_assert_eq(ctxs_session_get_kv(&run, s, 2, CTXS_V, 1), 0);
    ((uint8_t *)run)[(27 % 14) * DIM * 2 + 3] ^= 0x40;
    uint64_t bad = 0;
    cr_assert_eq(ctxs_session_verify(&bad, s), CTXS_ECORRUPT);
    cr_assert_eq(bad, 27);
    ctxs_session_close(s);
    ctxs_model m = sched_model(CTXS_DTYPE_F16);
    cr_assert_eq(ctxs_session_open(&s, ts_path(ts_scratch, "dmg.ctxs"), &m, CTXS_OPEN_VERIFY,
                                   NULL),
                 0);
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert(info.flags & CTXS_INFO_RECOVERED);
    /* Any count above 27 claims it in the window; 27 claims 17..26, which
     * the ring of 14 (positions 16..29) still holds. */
    cr_assert_eq(info.n_tokens, 27);
    check(s, CTXS_DTYPE_F16);
    cr_assert_eq(append(s, 10), 0);
    check(s, CTXS_DTYPE_F16);
    ctxs_session_close(s);
}

/* A writer killed (SIGKILL) while it commits turns: the file opens, holds
 * a prefix of what was committed, and every window verifies. */
Test(schedule, sigkill_while_committing_leaves_a_verifying_state)
{
    for (size_t d = 0; d < 3; d++) {
        char name[32];
        snprintf(name, sizeof(name), "kill-%zu.ctxs", d);
        ctxs_session *s = make(name, dtypes[d], CTXS_SYNC_NONE);
        ctxs_session_close(s);
        int pipefd[2];
        cr_assert_eq(pipe(pipefd), 0);
        pid_t pid = fork();
        cr_assert_neq(pid, -1);
        if (pid == 0) {
            ctxs_model m = sched_model(dtypes[d]);
            close(pipefd[0]);
            if (ctxs_session_open(&s, ts_path(ts_scratch, name), &m, 0, NULL) != 0)
                _exit(2);
            for (int turn = 0;; turn++) {
                if (append(s, 3) != 0)
                    _exit(3);
                if (turn == 20 && write(pipefd[1], "x", 1) != 1)
                    _exit(4);
                /* No criterion call in the child: its messages belong to
                 * the test's own process. */
                ctxs_session_info ci;
                if (ctxs_session_get_info(&ci, s) != 0)
                    _exit(5);
                /* Near the capacity, back off a little (within the rings)
                 * and keep committing. */
                if (ci.n_tokens > CAP - 8 && ctxs_session_rollback(s, ci.n_tokens - 3) != 0)
                    _exit(6);
            }
        }
        close(pipefd[1]);
        char c;
        cr_assert_eq(read(pipefd[0], &c, 1), 1);
        close(pipefd[0]);
        ts_sleep_us(2000 + 1000 * d);
        kill(pid, SIGKILL);
        int status;
        waitpid(pid, &status, 0);
        cr_assert(WIFSIGNALED(status), "the writer exited on its own: %d", status);

        ctxs_model m = sched_model(dtypes[d]);
        for (int verify = 0; verify < 2; verify++) {
            cr_assert_eq(ctxs_session_open(&s, ts_path(ts_scratch, name), &m,
                                           verify ? CTXS_OPEN_VERIFY : 0, NULL),
                         0);
            cr_assert_geq(ts_n_tokens(s), 60);
            check(s, dtypes[d]);
            ctxs_session_close(s);
        }
    }
}

/* fp64 attention over the values the session holds, per layer: the
 * layer's own window for a windowed layer, everything for a global one. */
Test(schedule, attention_per_layer_matches_fp64_in_every_dtype)
{
    for (size_t d = 0; d < 3; d++) {
        char name[32];
        snprintf(name, sizeof(name), "attn-%zu.ctxs", d);
        ctxs_session *s = make(name, dtypes[d], CTXS_SYNC_NONE);
        cr_assert_eq(append(s, 29), 0);
        enum { n_heads = 2 * HEADS };
        float q[n_heads * DIM], out[n_heads * DIM];
        for (uint32_t i = 0; i < n_heads * DIM; i++)
            q[i] = value(999, 0, 0, 0, i % 16) * (float)(1 + i % 3);
        static float ks[29][PER], vs[29][PER];
        for (uint64_t p = 0; p < 29; p++)
            cr_assert_eq(ctxs_session_read_token(ks[p], vs[p], s, p, CTXS_DTYPE_F32), 0);
        for (uint32_t l = 0; l < LAYERS; l++) {
            ctxs_layout kv;
            ctxs_attn_plan plan;
            cr_assert_eq(ctxs_session_get_layer_attn(&kv, &plan, s, l, 0), 0);
            ctxs_attn_query aq = {q, 28, 1, n_heads, 0};
            cr_assert_eq(ctxs_attention(out, &kv, &plan, 0, &aq), 0, "layer %u", l);
            ctxs_model m = sched_model(dtypes[d]);
            uint32_t w = ctxs_geometry_get_window(&m.geometry, l);
            uint64_t lo = w ? 29 - w : 0;
            for (uint32_t h = 0; h < n_heads; h++) {
                uint32_t kh = h / (n_heads / HEADS);
                double sc[29], mx = -1e300, sum = 0;
                for (uint64_t p = lo; p < 29; p++) {
                    double dot = 0;
                    for (uint32_t i = 0; i < DIM; i++)
                        dot += (double)q[h * DIM + i] * ks[p][(l * HEADS + kh) * DIM + i];
                    sc[p] = dot / sqrt((double)DIM);
                    mx = sc[p] > mx ? sc[p] : mx;
                }
                for (uint64_t p = lo; p < 29; p++)
                    sum += exp(sc[p] - mx);
                for (uint32_t i = 0; i < DIM; i++) {
                    double o = 0;
                    for (uint64_t p = lo; p < 29; p++)
                        o += exp(sc[p] - mx) / sum * vs[p][(l * HEADS + kh) * DIM + i];
                    cr_assert(fabs(o - out[h * DIM + i]) < 1e-4,
                              "dtype %u layer %u head %u element %u: %f against %f",
                              dtypes[d], l, h, i, out[h * DIM + i], o);
                }
            }
        }
        ctxs_session_close(s);
    }
}

Test(schedule, a_store_keeps_the_schedule_with_the_model)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_model m = sched_model(CTXS_DTYPE_BF16);
    cr_assert_eq(ctxs_model_register(st, &m, "mixed"), 0);
    ctxs_model_entry e;
    cr_assert_eq(ctxs_model_get(&e, st, m.model_hash), 0);
    cr_assert(memcmp(&e.model.geometry, &m.geometry, sizeof(m.geometry)) == 0,
              "the schedule did not come back");
    ctxs_model other = m;
    other.geometry.window[1] = 7;
    cr_assert_eq(ctxs_model_register(st, &other, "mixed"), CTXS_EMODEL);
    ctxs_create_options o = ts_options(CAP, 4, 0, CTXS_SYNC_NONE);
    o.batch = BATCH;
    ctxs_session *s;
    cr_assert_eq(ctxs_store_session_create(&s, st, "chat", &m, &o), 0);
    cr_assert_eq(append(s, 12), 0);
    check(s, CTXS_DTYPE_BF16);
    ctxs_session_close(s);
    cr_assert_eq(ctxs_store_session_open(&s, st, "chat", &other, 0, NULL), CTXS_EMODEL);
    cr_assert_eq(ctxs_store_session_open(&s, st, "chat", &m, 0, NULL), 0);
    check(s, CTXS_DTYPE_BF16);
    ctxs_session_close(s);
    ctxs_store_close(st);
}

/* A checkpoint whose windows the rings no longer hold is listed stale,
 * and restoring it is refused; one they hold restores exactly. */
Test(schedule, checkpoints_past_the_rings_are_stale)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_model m = sched_model(CTXS_DTYPE_F16);
    cr_assert_eq(ctxs_model_register(st, &m, "mixed"), 0);
    ctxs_create_options o = ts_options(CAP, 4, 0, CTXS_SYNC_NONE);
    o.batch = BATCH;
    ctxs_session *s;
    cr_assert_eq(ctxs_store_session_create(&s, st, "chat", &m, &o), 0);
    cr_assert_eq(append(s, 12), 0);
    cr_assert_eq(ctxs_checkpoint_create(s, "early"), 0);
    cr_assert_eq(append(s, 20), 0); /* rings of 6 + 4 and 10 + 4 slots */
    cr_assert_eq(ctxs_checkpoint_create(s, "late"), 0);
    cr_assert_eq(append(s, 2), 0);

    ctxs_checkpoint_entry *e;
    size_t n;
    cr_assert_eq(ctxs_checkpoint_list(&e, &n, s), 0);
    cr_assert_eq(n, 2);
    cr_assert_str_eq(e[0].name, "early");
    cr_assert_eq(e[0].stale, 1, "the rings overwrote the window of 12 tokens");
    cr_assert_str_eq(e[1].name, "late");
    cr_assert_eq(e[1].stale, 0);
    ctxs_free(e);
    cr_assert_eq(ctxs_checkpoint_restore(s, "early"), CTXS_EEVICTED);
    cr_assert_eq(ctxs_checkpoint_restore(s, "late"), 0, "%s", ctxs_get_last_error());
    ctxs_session_info info;
    cr_assert_eq(ctxs_session_get_info(&info, s), 0);
    cr_assert_eq(info.n_tokens, 32);
    check(s, CTXS_DTYPE_F16);
    ctxs_session_close(s);
    ctxs_store_close(st);
}

/* --- The file's bytes, read where docs/FORMAT.md puts them -------------- */

#define FILE_PAGE 16384u

static uint64_t page_up(uint64_t x)
{
    return (x + FILE_PAGE - 1) / FILE_PAGE * FILE_PAGE;
}

static uint64_t le(const uint8_t *b, uint64_t off, unsigned bytes)
{
    uint64_t x = 0;
    for (unsigned i = bytes; i-- > 0;)
        x = x << 8 | b[off + i];
    return x;
}

/* Values written through the API lie in the file at the offsets the
 * format's own formulas give, computed here from the header's fields and
 * nothing of the library's: a layer's runs of `slots(layer)` (its ring of
 * window + batch, or the capacity), the runs one after another in file
 * order, Q8 scales as a prefix sum over the same runs, each group's table
 * of (position, checksum) per ring slot. The rings have wrapped several
 * times; a ring laid out shorter or longer, or any run misplaced, puts
 * some value elsewhere. */
Test(schedule, values_lie_where_the_format_says_through_wrapped_rings)
{
    static const uint32_t kinds[] = {CTXS_DTYPE_F16, CTXS_DTYPE_Q8};
    enum { N = 45 };
    for (size_t d = 0; d < 2; d++) {
        const uint32_t dtype = kinds[d];
        char name[32];
        snprintf(name, sizeof(name), "layout-%zu.ctxs", d);
        ctxs_session *s = make(name, dtype, CTXS_SYNC_NONE);
        cr_assert_eq(append(s, N), 0);
        ctxs_session_close(s);
        size_t flen;
        uint8_t *b = ts_read_file(ts_path(ts_scratch, name), &flen);

        /* The header. */
        cr_assert(memcmp(b, "CTXSSESS", 8) == 0);
        cr_assert_eq(le(b, 8, 2), 3, "version_major");
        const uint64_t cap = le(b, 44, 4), ns = le(b, 48, 4), batch = le(b, 184, 4);
        const uint64_t period = le(b, 188, 4), elem = le(b, 28, 4);
        cr_assert(cap == CAP && ns == 4 && batch == BATCH && period == 3);
        cr_assert_eq(le(b, 24, 4), dtype);
        cr_assert_eq(elem, dtype == CTXS_DTYPE_Q8 ? 1 : 2);
        cr_assert(le(b, 32, 4) == LAYERS && le(b, 36, 4) == HEADS && le(b, 40, 4) == DIM);
        uint64_t window[8];
        for (int i = 0; i < 8; i++)
            window[i] = le(b, 192 + 4 * (uint64_t)i, 4);
        cr_assert(window[0] == 0 && window[1] == 6 && window[2] == 10 && window[3] == 0);
        const uint64_t slot_bytes = DIM * elem;

        /* slots(layer): a ring of window + batch where it fits, else the
         * capacity; the groups, one per window, in the order of their
         * first layer. */
        uint64_t slots[LAYERS], total = 0, group_len[8], group_w[8];
        unsigned n_groups = 0;
        for (uint32_t l = 0; l < LAYERS; l++) {
            uint64_t w = window[l % period], len = w + batch;
            slots[l] = w && len <= cap - ns && len < cap ? len : cap;
            if (slots[l] != cap) {
                unsigned g = 0;
                while (g < n_groups && group_w[g] != w)
                    g++;
                if (g == n_groups) {
                    group_w[n_groups] = w;
                    group_len[n_groups++] = len;
                }
            }
            total += slots[l];
        }
        cr_assert(slots[0] == CAP && slots[1] == 10 && slots[2] == 14 && slots[3] == CAP &&
                  slots[4] == 10 && slots[5] == 14 && n_groups == 2);

        const uint64_t tokens_off = 16384, tokens_bytes = page_up(cap * 4);
        const uint64_t sums_off = tokens_off + tokens_bytes, sums_bytes = page_up(cap * 8);
        const int q8 = dtype == CTXS_DTYPE_Q8;
        const uint64_t scales_off = q8 ? sums_off + sums_bytes : 0;
        const uint64_t scales_bytes = q8 ? page_up(2 * HEADS * 4 * total) : 0;
        const uint64_t groups_off = sums_off + sums_bytes + scales_bytes;
        uint64_t table_off[8], groups_bytes = 0;
        for (unsigned g = 0; g < n_groups; g++) {
            table_off[g] = groups_off + groups_bytes;
            groups_bytes += page_up(group_len[g] * 16);
        }
        const uint64_t kv_off = groups_off + groups_bytes;
        const uint64_t kv_bytes = page_up(2 * HEADS * slot_bytes * total);
        cr_assert_eq(le(b, 72, 8), tokens_off);
        cr_assert_eq(le(b, 80, 8), tokens_bytes);
        cr_assert_eq(le(b, 88, 8), sums_off);
        cr_assert_eq(le(b, 96, 8), sums_bytes);
        cr_assert_eq(le(b, 104, 8), kv_off, "kv_off %llu", (unsigned long long)le(b, 104, 8));
        cr_assert_eq(le(b, 112, 8), kv_bytes, "kv_bytes %llu", (unsigned long long)le(b, 112, 8));
        cr_assert_eq(le(b, 120, 8), kv_off + kv_bytes);
        cr_assert_eq(le(b, 168, 8), scales_off);
        cr_assert_eq(le(b, 176, 8), scales_bytes);
        cr_assert_eq(le(b, 224, 8), groups_off);
        cr_assert_eq(le(b, 232, 8), groups_bytes);
        cr_assert_eq(flen, kv_off + kv_bytes);

        /* Each run's start: the runs before it, of their layers' slots. */
        uint64_t run_off[2 * LAYERS * HEADS], scale_run_off[2 * LAYERS * HEADS];
        for (uint32_t r = 0, at = 0, sat = 0; r < 2 * LAYERS * HEADS; r++) {
            run_off[r] = at;
            scale_run_off[r] = sat;
            at += (uint32_t)(slots[r / (2 * HEADS)] * slot_bytes);
            sat += (uint32_t)(slots[r / (2 * HEADS)] * 4);
        }

        unsigned checked = 0, ring_checked = 0;
        for (uint64_t p = 0; p < N; p++) {
            /* No ring in the session: position p is slot p. */
            cr_assert_eq(le(b, tokens_off + p * 4, 4), token(p), "token id of %llu",
                         (unsigned long long)p);
            cr_assert_neq(le(b, sums_off + p * 8, 8), 0);
            float kv[2][PER];
            fill(kv[0], kv[1], p);
            for (uint32_t l = 0; l < LAYERS; l++) {
                /* A ring keeps its last slots(layer) positions. */
                if (slots[l] != cap && p + slots[l] < N)
                    continue;
                uint64_t slot = slots[l] == cap ? p : p % slots[l];
                for (uint32_t kind = 0; kind < 2; kind++)
                    for (uint32_t h = 0; h < HEADS; h++) {
                        uint32_t r = (l * 2 + kind) * HEADS + h;
                        uint8_t enc[DIM * 2];
                        float scale = 0;
                        const float *x = kv[kind] + (l * HEADS + h) * DIM;
                        cr_assert_eq(ctxs_dtype_encode(enc, &scale, x, DIM, dtype), 0);
                        uint64_t at = kv_off + run_off[r] + slot * slot_bytes;
                        cr_assert(memcmp(b + at, enc, slot_bytes) == 0,
                                  "%s: position %llu layer %u kind %u head %u: not at byte %llu "
                                  "(slot %llu of %llu)",
                                  name, (unsigned long long)p, l, kind, h,
                                  (unsigned long long)at, (unsigned long long)slot,
                                  (unsigned long long)slots[l]);
                        if (q8) {
                            float got;
                            uint64_t sat = scales_off + scale_run_off[r] + slot * 4;
                            memcpy(&got, b + sat, 4);
                            cr_assert(got == scale,
                                      "%s: position %llu layer %u kind %u head %u: scale %g at "
                                      "byte %llu, written %g",
                                      name, (unsigned long long)p, l, kind, h, (double)got,
                                      (unsigned long long)sat, (double)scale);
                        }
                        checked++;
                        ring_checked += slots[l] != cap;
                    }
            }
        }
        cr_assert_eq(ring_checked, 2 * HEADS * 2 * (10 + 14));
        cr_assert_gt(checked, ring_checked);

        /* Each group's table: the position its slot was last committed
         * for, and a checksum. */
        for (unsigned g = 0; g < n_groups; g++)
            for (uint64_t p = N - group_len[g]; p < N; p++) {
                uint64_t e = table_off[g] + (p % group_len[g]) * 16;
                cr_assert_eq(le(b, e, 8), p, "%s: group %u (window %llu) slot %llu names %llu",
                             name, g, (unsigned long long)group_w[g],
                             (unsigned long long)(p % group_len[g]),
                             (unsigned long long)le(b, e, 8));
                cr_assert_neq(le(b, e + 8, 8), 0);
            }
        free(b);
    }
}

/* Reads an export file's header. */
static ctxs__export_header export_header(const char *path)
{
    ctxs__export_header h;
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    cr_assert_eq(fread(&h, sizeof(h), 1, f), 1);
    fclose(f);
    return h;
}

/* An export carries the global layers' every held token and each windowed
 * group's window; the import holds the committed state the source held, in
 * every dtype, through a session ring that wrapped, and goes on as the
 * source would. */
Test(schedule, export_and_import_keep_the_rings_in_every_dtype)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    for (size_t d = 0; d < 3; d++) {
        ctxs_model m = sched_model(dtypes[d]);
        m.model_hash[15] ^= (uint8_t)d; /* a store keeps one dtype per model */
        char name[32], back[32], path[64];
        snprintf(name, sizeof(name), "chat-%zu", d);
        snprintf(back, sizeof(back), "back-%zu", d);
        snprintf(path, sizeof(path), "chat-%zu.ctxx", d);
        cr_assert_eq(ctxs_model_register(st, &m, NULL), 0);
        ctxs_create_options o = ts_options(CAP, 4, d == 1, CTXS_SYNC_NONE);
        o.batch = BATCH;
        ctxs_session *s;
        cr_assert_eq(ctxs_store_session_create(&s, st, name, &m, &o), 0);
        /* The ring session (bf16) goes round: 150 tokens through 128 slots. */
        cr_assert_eq(append(s, d == 1 ? 150 : 90), 0);
        ctxs_session_close(s);
        const char *x = ts_path(ts_scratch, path);
        int rc = ctxs_store_session_export(st, name, x, NULL);
        cr_assert_eq(rc, 0, "export: %s", ctxs_get_last_error());
        ctxs__export_header h = export_header(x);
        cr_assert_eq(h.version_major, 3);
        cr_assert_eq(h.period, 3);
        cr_assert_eq(h.window[2], 10);
        cr_assert_eq(h.batch, BATCH);
        char got[CTXS_NAME_MAX + 1];
        rc = ctxs_store_session_import(got, st, x, back, NULL);
        cr_assert_eq(rc, 0, "import: %s", ctxs_get_last_error());
        cr_assert_eq(ctxs_store_session_open(&s, st, back, &m, CTXS_OPEN_VERIFY, NULL), 0);
        ctxs_session_info info;
        cr_assert_eq(ctxs_session_get_info(&info, s), 0);
        cr_assert_eq(info.n_tokens, d == 1 ? 150 : 90);
        cr_assert_eq(info.model.geometry.period, 3);
        if (d != 1)
            check(s, dtypes[d]);
        cr_assert_eq(ctxs_session_verify(NULL, s), 0);
        /* It holds the committed windows, not what the source's rings kept
         * below them: a rollback that needs those is refused, and loses
         * nothing. */
        cr_assert_eq(ctxs_session_rollback(s, info.n_tokens - 3), CTXS_EEVICTED);
        cr_assert(strstr(ctxs_get_last_error(), "window"), "%s", ctxs_get_last_error());
        cr_assert_eq(ts_n_tokens(s), info.n_tokens);
        if (d != 1)
            check(s, dtypes[d]);
        cr_assert_eq(append(s, 20), 0);
        if (d != 1)
            check(s, dtypes[d]);
        ctxs_session_close(s);
    }
    ctxs_store_close(st);
}

/* A byte of a windowed layer's K/V changed in the file: the import refuses
 * it and leaves no session. A session without windowed layers is still
 * exported as 2.0, which readers of 2.0 read. */
Test(schedule, a_damaged_ring_block_is_refused_and_plain_sessions_stay_2_0)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    ctxs_model m = sched_model(CTXS_DTYPE_F16);
    cr_assert_eq(ctxs_model_register(st, &m, NULL), 0);
    ctxs_create_options o = ts_options(CAP, 4, 0, CTXS_SYNC_NONE);
    o.batch = BATCH;
    ctxs_session *s;
    cr_assert_eq(ctxs_store_session_create(&s, st, "chat", &m, &o), 0);
    cr_assert_eq(append(s, 40), 0);
    ctxs_session_close(s);
    const char *x = ts_path(ts_scratch, "chat.ctxx");
    cr_assert_eq(ctxs_store_session_export(st, "chat", x, NULL), 0);
    /* The last block is the window-10 group's: flip a bit of its zlib
     * stream and mend every CRC, so that only the checksums can tell. */
    FILE *f = fopen(x, "r+b");
    cr_assert_not_null(f);
    cr_assert_eq(fseek(f, 0, SEEK_END), 0);
    long size = ftell(f);
    uint8_t *b = malloc((size_t)size);
    cr_assert_eq(fseek(f, 0, SEEK_SET), 0);
    cr_assert_eq(fread(b, 1, (size_t)size, f), (size_t)size);
    /* Find the last block header by walking the blocks. */
    ctxs__export_header h;
    memcpy(&h, b, sizeof(h));
    size_t off = sizeof(h) + h.meta_bytes, last = 0;
    for (uint64_t i = 0; i < h.n_blocks; i++) {
        ctxs__export_block bh;
        memcpy(&bh, b + off, sizeof(bh));
        last = off;
        off += sizeof(bh) + bh.comp_bytes;
    }
    ctxs__export_block bh;
    memcpy(&bh, b + last, sizeof(bh));
    uint8_t *raw = malloc(bh.raw_bytes);
    uLongf rawn = bh.raw_bytes;
    cr_assert_eq(uncompress(raw, &rawn, b + last + sizeof(bh), bh.comp_bytes), Z_OK);
    raw[bh.raw_bytes - 1] ^= 0x40; /* the last run's last element */
    uLongf compn = compressBound(bh.raw_bytes);
    uint8_t *comp = malloc(compn);
    cr_assert_eq(compress(comp, &compn, raw, rawn), Z_OK);
    bh.comp_bytes = (uint32_t)compn;
    bh.raw_crc32 = (uint32_t)crc32(0, raw, (uInt)rawn);
    bh.data_crc32 = (uint32_t)crc32(0, comp, (uInt)compn);
    bh.crc32 = (uint32_t)crc32(0, (const Bytef *)&bh, offsetof(ctxs__export_block, crc32));
    size_t new_size = last + sizeof(bh) + compn + sizeof(ctxs__export_trailer);
    uint8_t *nb = malloc(new_size);
    memcpy(nb, b, last);
    memcpy(nb + last, &bh, sizeof(bh));
    memcpy(nb + last + sizeof(bh), comp, compn);
    ctxs__export_trailer t;
    memcpy(&t, b + size - sizeof(t), sizeof(t));
    t.body_bytes = last + sizeof(bh) + compn;
    t.body_crc32 = (uint32_t)crc32(0, nb, (uInt)t.body_bytes);
    t.crc32 = (uint32_t)crc32(0, (const Bytef *)&t, offsetof(ctxs__export_trailer, crc32));
    memcpy(nb + t.body_bytes, &t, sizeof(t));
    fclose(f);
    const char *y = ts_path(ts_scratch, "damaged.ctxx");
    f = fopen(y, "wb");
    cr_assert_eq(fwrite(nb, 1, new_size, f), new_size);
    fclose(f);
    cr_assert_eq(ctxs_store_session_import(NULL, st, y, "damaged", NULL), CTXS_ECORRUPT);
    ctxs_session_entry e;
    cr_assert_eq(ctxs_store_session_get(&e, st, "damaged"), CTXS_ENOTFOUND);
    /* The file as exported imports. */
    cr_assert_eq(ctxs_store_session_import(NULL, st, x, "whole", NULL), 0);
    free(nb);
    free(comp);
    free(raw);
    free(b);

    ctxs_model plain = ts_model(8);
    cr_assert_eq(ctxs_model_register(st, &plain, NULL), 0);
    cr_assert_eq(ctxs_store_session_create(&s, st, "plain", &plain, &o), 0);
    cr_assert_eq(ts_append(s, 10), 0);
    ctxs_session_close(s);
    const char *z = ts_path(ts_scratch, "plain.ctxx");
    cr_assert_eq(ctxs_store_session_export(st, "plain", z, NULL), 0);
    h = export_header(z);
    cr_assert_eq(h.version_major, 2);
    cr_assert_eq(h.period, 0);
    cr_assert_eq(h.batch, 0);
    ctxs_store_close(st);
}

/* A grown session keeps its windowed rings as they are and its global
 * layers' every token, in every dtype, and takes tokens on past its old
 * capacity. */
Test(schedule, a_grown_session_keeps_its_rings_and_its_tokens)
{
    for (size_t d = 0; d < 3; d++) {
        char name[32];
        snprintf(name, sizeof(name), "grow-%zu.ctxs", d);
        ctxs_session *s = make(name, dtypes[d], CTXS_SYNC_ASYNC);
        cr_assert_eq(append(s, CAP - 3), 0);
        cr_assert_eq(append(s, 4), CTXS_EFULL);
        ctxs_session_close(s);
        int rc = ctxs_session_grow(ts_path(ts_scratch, name), 4 * CAP);
        cr_assert_eq(rc, 0, "grow: %s", ctxs_get_last_error());
        ctxs_model m = sched_model(dtypes[d]);
        cr_assert_eq(ctxs_session_open(&s, ts_path(ts_scratch, name), &m, CTXS_OPEN_VERIFY, NULL),
                     0);
        ctxs_session_info info;
        cr_assert_eq(ctxs_session_get_info(&info, s), 0);
        cr_assert_eq(info.capacity, 4 * CAP);
        cr_assert_eq(info.n_tokens, CAP - 3);
        check(s, dtypes[d]);
        cr_assert_eq(append(s, 2 * CAP), 0);
        check(s, dtypes[d]);
        /* Within the rings, a rollback is exact as before. */
        cr_assert_eq(ctxs_session_rollback(s, 3 * CAP - 5), 0);
        check(s, dtypes[d]);
        ctxs_session_close(s);
    }
}

/* A writer in another process appends to a windowed session, its rings
 * going round, while this process forks it from a read-only handle and
 * exports it: a fork holds exactly what the writer had committed (every
 * token's K/V, the windows of the rings) or is refused with CTXS_ESTALE;
 * an export of the healthy session succeeds, whole, or is refused with
 * CTXS_ESTALE, never taken for damage. (With a batch of 4 the rings keep
 * a window for one more turn only, so most exports beside the writer are
 * stale; the one after it stops must succeed.) */
static void beside_a_live_writer(ctxs_store *st, uint32_t dtype)
{
    enum { LIVE_CAP = 2048 };
    ctxs_model m = sched_model(dtype);
    m.model_hash[15] ^= (uint8_t)dtype; /* a store keeps one dtype per model */
    cr_assert_eq(ctxs_model_register(st, &m, NULL), 0);
    ctxs_create_options o = ts_options(LIVE_CAP, 4, 0, CTXS_SYNC_NONE);
    o.batch = BATCH;
    char live[32];
    snprintf(live, sizeof(live), "live-%u", dtype);
    ctxs_session *s;
    cr_assert_eq(ctxs_store_session_create(&s, st, live, &m, &o), 0);
    cr_assert_eq(append(s, 40), 0);
    ctxs_session_close(s);

    int pipefd[2];
    cr_assert_eq(pipe(pipefd), 0);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        /* No criterion call in the child. */
        close(pipefd[0]);
        ctxs_store *cs;
        ctxs_session *w;
        if (ctxs_store_open(&cs, ts_store_dir(), 0, NULL) != 0 ||
            ctxs_store_session_open(&w, cs, live, &m, 0, NULL) != 0)
            _exit(2);
        if (write(pipefd[1], "x", 1) != 1)
            _exit(3);
        /* As an engine does: reserve a turn, write it, compute a while,
         * commit. Between write and commit the ring's slots hold the
         * turn's K/V, their entries still the older positions'. */
        float k[PER], v[PER];
        for (uint64_t n = 40; n + BATCH <= LIVE_CAP; n += BATCH) {
            ctxs_reservation r;
            uint32_t ids[BATCH];
            if (ctxs_session_reserve(&r, w, BATCH) != 0)
                _exit(4);
            for (uint32_t i = 0; i < BATCH; i++) {
                fill(k, v, r.first_pos + i);
                ids[i] = token(r.first_pos + i);
                if (ctxs_session_write_token(w, &r, i, k, v, CTXS_DTYPE_F32) != 0)
                    _exit(5);
            }
            ts_sleep_us(2000);
            if (ctxs_session_commit(w, ids, BATCH) != 0)
                _exit(6);
        }
        ctxs_session_close(w);
        ctxs_store_close(cs);
        _exit(0);
    }
    close(pipefd[1]);
    char c;
    cr_assert_eq(read(pipefd[0], &c, 1), 1);
    close(pipefd[0]);

    cr_assert_eq(ctxs_store_session_open(&s, st, live, &m, CTXS_RDONLY, NULL), 0);
    unsigned forks = 0, fork_stale = 0, exports = 0, export_stale = 0, round = 0;
    int status = 0, running = 1;
    for (; round < 400 && running; round++) {
        char path[64];
        snprintf(path, sizeof(path), "fork-%u.ctxs", round);
        ctxs_session *fk = NULL;
        int rc = ctxs_session_fork(&fk, s, ts_path(ts_scratch, path), UINT64_MAX, NULL);
        cr_assert(rc == 0 || rc == CTXS_ESTALE, "%s: fork %u beside the writer: %s (%s)",
                  ctxs__dtype_name(dtype), round, ctxs_err_name(rc), ctxs_get_last_error());
        if (rc == 0) {
            check(fk, dtype);
            ctxs_session_close(fk);
            cr_assert_eq(ctxs_session_open(&fk, ts_path(ts_scratch, path), &m,
                                           CTXS_RDONLY | CTXS_OPEN_VERIFY, NULL), 0);
            check(fk, dtype);
            ctxs_session_close(fk);
            forks++;
        } else {
            fork_stale++;
        }
        unlink(ts_path(ts_scratch, path));

        snprintf(path, sizeof(path), "live-%u.ctxx", round);
        const char *x = ts_path(ts_scratch, path);
        rc = ctxs_store_session_export(st, live, x, NULL);
        cr_assert(rc == 0 || rc == CTXS_ESTALE, "%s: export %u beside the writer: %s (%s)",
                  ctxs__dtype_name(dtype), round, ctxs_err_name(rc), ctxs_get_last_error());
        if (rc == 0 && exports % 4 == 0) {
            char got[CTXS_NAME_MAX + 1], back[32];
            snprintf(back, sizeof(back), "back-%u", round);
            rc = ctxs_store_session_import(got, st, x, back, NULL);
            cr_assert_eq(rc, 0, "import of export %u: %s", round, ctxs_get_last_error());
            ctxs_session *b;
            cr_assert_eq(ctxs_store_session_open(&b, st, back, &m, CTXS_OPEN_VERIFY, NULL), 0);
            check(b, dtype);
            ctxs_session_close(b);
            cr_assert_eq(ctxs_store_session_delete(st, back), 0);
        }
        exports += rc == 0;
        export_stale += rc == CTXS_ESTALE;
        unlink(x);
        running = waitpid(pid, &status, WNOHANG) == 0;
    }
    if (running) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    } else {
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the writer failed: %d",
                  status);
    }
    ctxs_session_close(s);
    fprintf(stderr, "%s beside a live writer: %u rounds, %u forks (%u stale), %u exports "
            "(%u stale)\n", ctxs__dtype_name(dtype), round, forks, fork_stale, exports,
            export_stale);
    cr_assert_gt(forks, 0, "no fork beside the writer succeeded");

    /* The writer gone, the export holds what it committed. */
    const char *x = ts_path(ts_scratch, "live-final.ctxx");
    int rc = ctxs_store_session_export(st, live, x, NULL);
    cr_assert_eq(rc, 0, "%s: export after the writer: %s (%s)", ctxs__dtype_name(dtype),
                 ctxs_err_name(rc), ctxs_get_last_error());
    char got[CTXS_NAME_MAX + 1];
    cr_assert_eq(ctxs_store_session_import(got, st, x, "back-final", NULL), 0);
    ctxs_session *b;
    cr_assert_eq(ctxs_store_session_open(&b, st, "back-final", &m, CTXS_OPEN_VERIFY, NULL), 0);
    check(b, dtype);
    ctxs_session_close(b);
    cr_assert_eq(ctxs_store_session_delete(st, "back-final"), 0);
    unlink(x);
}

Test(schedule, fork_and_export_beside_a_live_writer_are_exact_or_stale)
{
    ctxs_store *st = ts_store_open(ts_store_dir());
    beside_a_live_writer(st, CTXS_DTYPE_F16);
    beside_a_live_writer(st, CTXS_DTYPE_Q8);
    ctxs_store_close(st);
}
