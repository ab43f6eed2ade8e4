/*
 * The workload: a store used as an app uses it, through the public API
 * only, at one durability level and dtype, until the power goes. Every call
 * that changes something is logged twice, to a file off the disk: BEGIN
 * before it (what it will do), then ACK (it returned success) or FAIL. The
 * checker replays the log to know what each session may hold after the cut.
 *
 * The tokens' contents are a function of a generation and the position
 * (pc_token_kv), so the log carries a commit's generation, not its bytes.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "powercut.h"
#include "rng.h"

const char *const pc_op_name[PC_OP_KINDS] = {"?",      "store", "create", "commit",
                                             "sync",   "rollback", "reopen", "fork",
                                             "rename", "delete", "import", "meta"};

ctxs_model pc_model(uint32_t dtype)
{
    ctxs_model m = {.geometry = {PC_LAYERS, PC_HEADS, PC_DIM, dtype}};
    memcpy(m.model_hash, "powercut-model-h", 16);
    memcpy(m.tokenizer_hash, "powercut-tokens.", 16);
    return m;
}

static uint64_t mix(uint64_t gen, uint64_t pos, uint64_t i)
{
    uint64_t s = gen * 0x9e3779b97f4a7c15ull ^ (pos << 20) ^ i;
    return ts_rng_next(&s);
}

uint32_t pc_token_id(uint64_t gen, uint64_t pos)
{
    return (uint32_t)(mix(gen, pos, 0xfffff) % 150000u) + 1;
}

void pc_token_kv(float *k, float *v, uint64_t gen, uint64_t pos)
{
    /* Multiples of 1/8 in [-8, 8): exact in fp16 and bf16. */
    for (uint32_t i = 0; i < PC_ELEMS; i++) {
        uint64_t h = mix(gen, pos, i);
        k[i] = (float)((int)(h & 127) - 64) / 8.0f;
        v[i] = (float)((int)((h >> 8) & 127) - 64) / 8.0f;
    }
}

void pc_name(char out[32], uint32_t key, uint64_t name_no)
{
    snprintf(out, 32, "s%u-%llu", key, (unsigned long long)name_no);
}

/* --- The workload's own view of its sessions -------------------------------- */

#define MAX_SESSIONS 64

typedef struct wsess {
    uint32_t key;
    uint64_t name_no;
    ctxs_session *h; /* open read-write, or NULL */
    uint64_t n;
    uint64_t gens[PC_CAPACITY]; /* the generation of each position's tokens */
} wsess;

typedef struct work {
    const pc_workload *w;
    int log;
    uint64_t rng;
    ctxs_store *st;
    ctxs_model model;
    wsess *s[MAX_SESSIONS];
    size_t n_s;
    uint32_t next_key;
} work;

static void log_rec(work *k, const pc_rec *r)
{
    if (write(k->log, r, sizeof(*r)) != (ssize_t)sizeof(*r)) {
        fprintf(stderr, "powercut workload: the log: %s\n", strerror(errno));
        _exit(3);
    }
}

/* Logs BEGIN, and returns the record for the ACK or FAIL. */
static pc_rec begin(work *k, uint32_t op, uint32_t sess, uint32_t other, uint64_t a, uint64_t b,
                    uint64_t gen)
{
    pc_rec r = {.op = op, .phase = PC_BEGIN, .sess = sess, .other = other, .a = a, .b = b,
                .gen = gen};
    log_rec(k, &r);
    return r;
}

/* Logs the outcome; returns rc. */
static int end(work *k, pc_rec *r, int rc)
{
    r->phase = rc == 0 ? PC_ACK : PC_FAIL;
    r->rc = rc;
    log_rec(k, r);
    if (rc != 0)
        fprintf(stderr, "powercut workload: %s of s%u: %s\n", pc_op_name[r->op], r->sess,
                ctxs_err_name(rc));
    return rc;
}

static uint64_t rnd(work *k, uint64_t n)
{
    return n ? ts_rng_next(&k->rng) % n : 0;
}

static ctxs_open_options open_opts(const work *k)
{
    ctxs_open_options o = CTXS_OPEN_OPTIONS_INIT;
    o.durability = k->w->level;
    return o;
}

static void name_of(char out[32], const wsess *s)
{
    pc_name(out, s->key, s->name_no);
}

static uint64_t id_of(work *k, const char *name)
{
    ctxs_session_entry e;
    return ctxs_store_session_get(&e, k->st, name) == 0 ? e.id : 0;
}

static wsess *add(work *k, uint64_t n, const uint64_t *gens)
{
    wsess *s = calloc(1, sizeof(*s));
    if (!s)
        _exit(3);
    s->key = k->next_key++;
    s->n = n;
    if (n)
        memcpy(s->gens, gens, n * sizeof(*gens));
    k->s[k->n_s++] = s;
    return s;
}

static void drop(work *k, size_t i)
{
    free(k->s[i]);
    k->s[i] = k->s[--k->n_s];
}

static int op_create(work *k)
{
    wsess *s = add(k, 0, NULL);
    char name[32];
    name_of(name, s);
    ctxs_create_options o = CTXS_CREATE_OPTIONS_INIT;
    o.capacity = PC_CAPACITY;
    o.ring = 0;
    o.open = open_opts(k);
    pc_rec r = begin(k, PC_OP_CREATE, s->key, 0, 0, 0, 0);
    int rc = ctxs_store_session_create(&s->h, k->st, name, &k->model, &o);
    r.id = rc == 0 ? id_of(k, name) : 0;
    return end(k, &r, rc);
}

static int op_reopen(work *k, wsess *s)
{
    char name[32];
    name_of(name, s);
    ctxs_session_close(s->h);
    s->h = NULL;
    ctxs_open_options o = open_opts(k);
    pc_rec r = begin(k, PC_OP_REOPEN, s->key, 0, 0, 0, 0);
    return end(k, &r, ctxs_store_session_open(&s->h, k->st, name, &k->model, 0, &o));
}

static int op_commit(work *k, wsess *s)
{
    uint32_t n = (uint32_t)(1 + rnd(k, rnd(k, 4) ? 40 : 130));
    if (s->n + n > PC_CAPACITY)
        n = (uint32_t)(PC_CAPACITY - s->n);
    if (n == 0)
        return 0;
    uint64_t gen = ts_rng_next(&k->rng) >> 16;
    pc_rec r = begin(k, PC_OP_COMMIT, s->key, 0, s->n, n, gen);
    ctxs_reservation res;
    int rc = ctxs_session_reserve(&res, s->h, n);
    uint32_t ids[PC_CAPACITY];
    float kk[PC_ELEMS], vv[PC_ELEMS];
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        pc_token_kv(kk, vv, gen, s->n + i);
        ids[i] = pc_token_id(gen, s->n + i);
        rc = ctxs_session_write_token(s->h, &res, i, kk, vv, CTXS_DTYPE_F32);
    }
    if (rc == 0)
        rc = ctxs_session_commit(s->h, ids, n);
    if (rc == 0) {
        for (uint32_t i = 0; i < n; i++)
            s->gens[s->n + i] = gen;
        s->n += n;
    }
    return end(k, &r, rc);
}

static int op_sync(work *k, wsess *s)
{
    pc_rec r = begin(k, PC_OP_SYNC, s->key, 0, s->n, 0, 0);
    return end(k, &r, ctxs_session_sync(s->h));
}

static int op_rollback(work *k, wsess *s)
{
    uint64_t to = rnd(k, s->n + 1);
    pc_rec r = begin(k, PC_OP_ROLLBACK, s->key, 0, to, 0, 0);
    int rc = ctxs_session_rollback(s->h, to);
    if (rc == 0)
        s->n = to;
    return end(k, &r, rc);
}

static int op_fork(work *k, wsess *src)
{
    /* The whole source half the time: the tokens a prefix lookup finds. */
    uint64_t at = rnd(k, 2) ? src->n : rnd(k, src->n + 1);
    wsess *s = add(k, at, src->gens);
    char name[32], from[32];
    name_of(name, s);
    name_of(from, src);
    ctxs_open_options o = open_opts(k);
    pc_rec r = begin(k, PC_OP_FORK, s->key, src->key, at, 0, 0);
    int rc = ctxs_store_session_fork(&s->h, k->st, from, name, at, &o);
    r.id = rc == 0 ? id_of(k, name) : 0;
    return end(k, &r, rc);
}

static int op_rename(work *k, wsess *s)
{
    char from[32], to[32];
    name_of(from, s);
    pc_name(to, s->key, s->name_no + 1);
    pc_rec r = begin(k, PC_OP_RENAME, s->key, 0, s->name_no + 1, 0, 0);
    int rc = ctxs_store_session_rename(k->st, from, to);
    if (rc == 0)
        s->name_no++;
    return end(k, &r, rc);
}

static int op_delete(work *k, size_t i)
{
    wsess *s = k->s[i];
    char name[32];
    name_of(name, s);
    ctxs_session_close(s->h);
    s->h = NULL;
    pc_rec r = begin(k, PC_OP_DELETE, s->key, 0, 0, 0, 0);
    int rc = end(k, &r, ctxs_store_session_delete(k->st, name));
    if (rc == 0)
        drop(k, i);
    return rc;
}

/* An export of src imported under a new name: a session that crossed
 * stores. The export file is written on the disk too. */
static int op_import(work *k, wsess *src)
{
    char from[32], path[4200];
    name_of(from, src);
    snprintf(path, sizeof(path), "%s/../export-%u.ctxe", k->w->store, k->next_key);
    unlink(path);
    int rc = ctxs_store_session_export(k->st, from, path, NULL);
    if (rc != 0) {
        pc_rec r = begin(k, PC_OP_IMPORT, k->next_key, src->key, src->n, 0, 0);
        return end(k, &r, rc);
    }
    wsess *s = add(k, src->n, src->gens);
    char name[32], got[CTXS_NAME_MAX + 1];
    name_of(name, s);
    pc_rec r = begin(k, PC_OP_IMPORT, s->key, src->key, src->n, 0, 0);
    rc = ctxs_store_session_import(got, k->st, path, name, NULL);
    r.id = rc == 0 ? id_of(k, name) : 0;
    unlink(path);
    rc = end(k, &r, rc);
    if (rc == 0) {
        ctxs_open_options o = open_opts(k);
        r = begin(k, PC_OP_REOPEN, s->key, 0, 0, 0, 0);
        rc = end(k, &r, ctxs_store_session_open(&s->h, k->st, name, &k->model, 0, &o));
    }
    return rc;
}

static int op_meta(work *k, wsess *s)
{
    char name[32], key[16], val[32];
    uint64_t which = rnd(k, 4), value = ts_rng_next(&k->rng) >> 20;
    name_of(name, s);
    snprintf(key, sizeof(key), "k%llu", (unsigned long long)which);
    snprintf(val, sizeof(val), "v%llu", (unsigned long long)value);
    pc_rec r = begin(k, PC_OP_META, s->key, 0, which, value, 0);
    return end(k, &r, ctxs_store_session_set_meta(k->st, name, key, val, strlen(val)));
}

static int step(work *k)
{
    if (k->n_s == 0)
        return op_create(k);
    size_t i = (size_t)rnd(k, k->n_s);
    wsess *s = k->s[i];
    if (!s->h)
        return op_reopen(k, s);
    uint64_t roll = rnd(k, 100);
    if (roll < 50)
        return s->n + 8 >= PC_CAPACITY ? op_rollback(k, s) : op_commit(k, s);
    if (roll < 56)
        return k->w->level == CTXS_SYNC_FULL ? op_commit(k, s) : op_sync(k, s);
    if (roll < 63)
        return op_reopen(k, s);
    if (roll < 70)
        return op_rollback(k, s);
    if (roll < 76)
        return k->n_s < 6 ? op_fork(k, s) : op_delete(k, i);
    if (roll < 80)
        return op_rename(k, s);
    if (roll < 85)
        return k->n_s > 1 ? op_delete(k, i) : op_create(k);
    if (roll < 88)
        return k->n_s < 6 ? op_import(k, s) : op_commit(k, s);
    if (roll < 94)
        return k->n_s < 6 ? op_create(k) : op_commit(k, s);
    return op_meta(k, s);
}

/* The scenarios' operations, by name, on the one session of the script. */
static int run_script(work *k, const char *script)
{
    char copy[512], *save = NULL;
    snprintf(copy, sizeof(copy), "%s", script);
    for (char *op = strtok_r(copy, ",", &save); op; op = strtok_r(NULL, ",", &save)) {
        wsess *s = k->n_s ? k->s[0] : NULL;
        int rc;
        if (strcmp(op, "create") == 0)
            rc = op_create(k);
        else if (!s)
            rc = CTXS_EINVAL;
        else if (strcmp(op, "commit") == 0)
            rc = op_commit(k, s);
        else if (strcmp(op, "sync") == 0)
            rc = op_sync(k, s);
        else if (strcmp(op, "reopen") == 0)
            rc = op_reopen(k, s);
        else if (strcmp(op, "delete") == 0)
            rc = op_delete(k, 0);
        else
            rc = CTXS_EINVAL;
        if (rc != 0) {
            fprintf(stderr, "powercut workload: script step '%s': %s\n", op, ctxs_err_name(rc));
            return 1;
        }
    }
    return 0;
}

int pc_workload_run(const pc_workload *w)
{
    work k = {.w = w, .rng = w->seed, .model = pc_model(w->dtype), .next_key = 1};
    if ((k.log = open(w->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600)) < 0) {
        fprintf(stderr, "powercut workload: %s: %s\n", w->log, strerror(errno));
        return 3;
    }
    pc_rec r = begin(&k, PC_OP_STORE, 0, 0, 0, 0, 0);
    int rc = ctxs_store_open(&k.st, w->store, CTXS_STORE_CREATE, NULL);
    if (rc == 0)
        rc = ctxs_model_register(k.st, &k.model, "powercut");
    if (end(&k, &r, rc) != 0)
        return 1;
    if (w->script)
        return run_script(&k, w->script);
    for (uint32_t i = 0; i < w->max_ops; i++)
        if (step(&k) != 0)
            return 1;
    return 0;
}
