/*
 * The checker: what the store holds after the cut, opened as a new boot
 * opens it, against what the workload was told (its log). The claims, as
 * README.md and docs/FORMAT.md ("What survives a power cut") make them:
 *
 * - Sessions: one whose create, fork or import was acknowledged is listed
 *   and opens, under the name its last acknowledged rename gave it, until
 *   its delete began; one whose delete was acknowledged is neither listed
 *   nor has a file, and never comes back; nothing is listed that the
 *   workload did not make. An operation in flight at the cut either
 *   happened or did not (a rename: exactly one of the two names).
 * - Tokens: a session holds a prefix of one of the states it was told of
 *   (or of the one in flight) since its last acknowledged rollback: every
 *   token id and every K/V byte as committed, never a token of another
 *   history; and at least its durable floor: the count at its last
 *   acknowledged sync, its last acknowledged commit at CTXS_SYNC_FULL, all
 *   of an import, all of a fork at FULL, lowered by a later rollback.
 *   Every held token verifies; a read-write open keeps what a read-only
 *   one saw.
 * - A prefix match is forkable, and what the fork holds is the prompt.
 * - Metadata acknowledged is there (or the value in flight), and so is the
 *   model registered when the store was made.
 * - A read-only look finds no file that neither an entry nor an intent
 *   explains; after a read-write open no intent is left and every file is
 *   indexed; ctxs_store_check() finds no damage.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "powercut.h"

static int violations;

static void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void violation(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("VIOLATION: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    violations++;
}

/* --- The log replayed --------------------------------------------------------- */

typedef struct state {
    uint64_t n;
    uint64_t *gens; /* n entries */
} state;

#define MAX_META 4

typedef struct csess {
    uint32_t key;
    int seen;             /* its create (fork, import) began */
    int made;             /* ... and was acknowledged */
    int deleting;         /* its delete began */
    int deleted;          /* ... and was acknowledged */
    uint64_t id;          /* from the acknowledgement */
    uint64_t name_no;
    int64_t name_next;    /* a rename in flight: its name number; else -1 */
    state *states;        /* the states it may hold (acknowledged, since
                             the last acknowledged rollback) */
    size_t n_states;
    state next;           /* the state of an operation in flight */
    int has_next;
    int next_rollback;    /* ... which is a rollback: it may have lowered
                             the floor */
    uint64_t floor;       /* it holds at least this many tokens */
    int64_t meta[MAX_META];      /* acknowledged value of k<i>, -1: none */
    int64_t meta_next[MAX_META]; /* in flight, -1: none */
} csess;

typedef struct replay {
    int store_begun, store_made;
    csess *s;
    size_t n_s;
    uint32_t level;
    pc_rec last;           /* the last record */
} replay;

static csess *sess(replay *rp, uint32_t key)
{
    for (size_t i = 0; i < rp->n_s; i++)
        if (rp->s[i].key == key)
            return &rp->s[i];
    rp->s = realloc(rp->s, (rp->n_s + 1) * sizeof(*rp->s));
    csess *s = &rp->s[rp->n_s++];
    memset(s, 0, sizeof(*s));
    s->key = key;
    s->name_next = -1;
    for (int i = 0; i < MAX_META; i++)
        s->meta[i] = s->meta_next[i] = -1;
    return s;
}

/* The first n positions of from (zeros past its end). */
static state state_copy(const state *from, uint64_t n)
{
    state st = {n, calloc(n ? n : 1, sizeof(uint64_t))};
    uint64_t have = from->n < n ? from->n : n;
    if (have)
        memcpy(st.gens, from->gens, have * sizeof(uint64_t));
    return st;
}

static const state *newest(const csess *s)
{
    static const state empty;
    return s->n_states ? &s->states[s->n_states - 1] : &empty;
}

static void push_state(csess *s, state st)
{
    s->states = realloc(s->states, (s->n_states + 1) * sizeof(*s->states));
    s->states[s->n_states++] = st;
}

static void drop_states(csess *s)
{
    for (size_t i = 0; i < s->n_states; i++)
        free(s->states[i].gens);
    s->n_states = 0;
}

static void set_next(csess *s, state st)
{
    if (s->has_next)
        free(s->next.gens);
    s->next = st;
    s->has_next = 1;
    s->next_rollback = 0;
}

static void begin(replay *rp, const pc_rec *r)
{
    csess *s = r->op == PC_OP_STORE ? NULL : sess(rp, r->sess);
    switch (r->op) {
    case PC_OP_STORE:
        rp->store_begun = 1;
        break;
    case PC_OP_CREATE:
        s->seen = 1;
        set_next(s, (state){0, calloc(1, 8)});
        break;
    case PC_OP_FORK:
    case PC_OP_IMPORT: {
        csess *src = sess(rp, r->other);
        s->seen = 1;
        set_next(s, state_copy(newest(src), r->a));
        /* An export carries the metadata; a fork starts without. */
        for (int k = 0; k < MAX_META && r->op == PC_OP_IMPORT; k++)
            s->meta_next[k] = src->meta[k];
        break;
    }
    case PC_OP_COMMIT: {
        state st = state_copy(newest(s), r->a + r->b);
        for (uint64_t p = r->a; p < r->a + r->b; p++)
            st.gens[p] = r->gen;
        set_next(s, st);
        break;
    }
    case PC_OP_ROLLBACK:
        set_next(s, state_copy(newest(s), r->a));
        s->next_rollback = 1;
        break;
    case PC_OP_RENAME:
        s->name_next = (int64_t)r->a;
        break;
    case PC_OP_DELETE:
        s->deleting = 1;
        break;
    case PC_OP_META:
        s->meta_next[r->a % MAX_META] = (int64_t)r->b;
        break;
    default:
        break;
    }
}

static void ack(replay *rp, const pc_rec *r)
{
    csess *s = r->op == PC_OP_STORE ? NULL : sess(rp, r->sess);
    switch (r->op) {
    case PC_OP_STORE:
        rp->store_made = 1;
        break;
    case PC_OP_CREATE:
    case PC_OP_FORK:
    case PC_OP_IMPORT:
        s->made = 1;
        s->id = r->id;
        push_state(s, s->next);
        s->has_next = 0;
        for (int k = 0; k < MAX_META && r->op == PC_OP_IMPORT; k++)
            s->meta[k] = s->meta_next[k], s->meta_next[k] = -1;
        /* An import is durable whole; a fork's KV only at FULL. */
        s->floor = r->op == PC_OP_IMPORT || (r->op == PC_OP_FORK && rp->level == CTXS_SYNC_FULL)
                       ? r->a
                       : 0;
        break;
    case PC_OP_COMMIT:
        push_state(s, s->next);
        s->has_next = 0;
        if (rp->level == CTXS_SYNC_FULL)
            s->floor = newest(s)->n;
        break;
    case PC_OP_SYNC:
        s->floor = newest(s)->n;
        break;
    case PC_OP_ROLLBACK:
        /* What came before it is the new state's prefix, or gone for good. */
        drop_states(s);
        push_state(s, s->next);
        s->has_next = 0;
        if (s->floor > r->a)
            s->floor = r->a;
        break;
    case PC_OP_RENAME:
        s->name_no = r->a;
        s->name_next = -1;
        break;
    case PC_OP_DELETE:
        s->deleted = 1;
        break;
    case PC_OP_META:
        s->meta[r->a % MAX_META] = (int64_t)r->b;
        s->meta_next[r->a % MAX_META] = -1;
        break;
    default:
        break;
    }
}

static int replay_log(replay *rp, const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 0 : -1; /* cut before the workload began */
    pc_rec r;
    ssize_t n;
    while ((n = read(fd, &r, sizeof(r))) == (ssize_t)sizeof(r)) {
        rp->last = r;
        if (r.phase == PC_BEGIN)
            begin(rp, &r);
        else if (r.phase == PC_ACK)
            ack(rp, &r);
        /* FAIL: the operation stays in flight, done or not. */
    }
    close(fd);
    return n == 0 ? 0 : -1;
}

/* --- Checks ------------------------------------------------------------------- */

typedef struct ctx {
    const pc_check *c;
    replay rp;
    ctxs_model model;
    size_t token_bytes;
} ctx;

/* The session listed as name, if any. */
static const ctxs_session_entry *listed(const ctxs_session_entry *list, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(list[i].name, name) == 0)
            return &list[i];
    return NULL;
}

/* The session's name now: its acknowledged one, or the one a rename in
 * flight gave it; *which is the name number found (or -1). */
static const ctxs_session_entry *find(const ctxs_session_entry *list, size_t n, const csess *s,
                                      int64_t *which)
{
    char name[32];
    pc_name(name, s->key, s->name_no);
    const ctxs_session_entry *e = listed(list, n, name);
    *which = e ? (int64_t)s->name_no : -1;
    if (s->name_next >= 0) {
        pc_name(name, s->key, (uint64_t)s->name_next);
        const ctxs_session_entry *e2 = listed(list, n, name);
        if (e && e2)
            violation("s%u is listed under both its old and its new name", s->key);
        if (e2)
            e = e2, *which = s->name_next;
    }
    return e;
}

/* The raw bytes a session of dtype stores for floats (one token's K or V),
 * as read_token() gives them back in the session's dtype. */
static void expected_raw(uint8_t *out, const float *x, uint32_t dtype)
{
    size_t heads = PC_LAYERS * PC_HEADS;
    if (dtype == CTXS_DTYPE_Q8) {
        float *scales = (float *)(void *)(out + heads * PC_DIM);
        for (size_t h = 0; h < heads; h++)
            ctxs_dtype_encode(out + h * PC_DIM, &scales[h], x + h * PC_DIM, PC_DIM, dtype);
    } else {
        for (size_t h = 0; h < heads; h++)
            ctxs_dtype_encode(out + h * PC_DIM * 2, NULL, x + h * PC_DIM, PC_DIM, dtype);
    }
}

/* Whether the first n positions of s (open) hold state st's tokens. On a
 * mismatch, *bad is the first position that differs. */
static int holds_prefix(ctx *x, ctxs_session *s, const state *st, uint64_t n, uint64_t *bad)
{
    if (n > st->n) {
        *bad = st->n;
        return 0;
    }
    uint32_t *ids = malloc((n ? n : 1) * 4);
    uint8_t *k = malloc(x->token_bytes), *v = malloc(x->token_bytes);
    uint8_t *ek = malloc(x->token_bytes), *ev = malloc(x->token_bytes);
    float fk[PC_ELEMS], fv[PC_ELEMS];
    int ok = ctxs_session_get_tokens(ids, s, 0, (uint32_t)n) == 0;
    *bad = 0;
    for (uint64_t p = 0; ok && p < n; p++) {
        uint64_t gen = st->gens[p];
        pc_token_kv(fk, fv, gen, p);
        expected_raw(ek, fk, x->model.geometry.dtype);
        expected_raw(ev, fv, x->model.geometry.dtype);
        ok = ids[p] == pc_token_id(gen, p) &&
             ctxs_session_read_token(k, v, s, p, x->model.geometry.dtype) == 0 &&
             memcmp(k, ek, x->token_bytes) == 0 && memcmp(v, ev, x->token_bytes) == 0;
        if (!ok)
            *bad = p;
    }
    free(ids);
    free(k), free(v), free(ek), free(ev);
    return ok;
}

/* The states s may hold: the acknowledged ones, then the one in flight. */
static size_t candidates(const csess *s, const state **out, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < s->n_states && n < max; i++)
        out[n++] = &s->states[i];
    if (s->has_next && n < max)
        out[n++] = &s->next;
    return n;
}

/* Opens name read-only as a new boot does and holds it against s's claims;
 * returns the count it holds, or -1. */
static int64_t check_tokens(ctx *x, ctxs_store *st, const char *name, const csess *s)
{
    ctxs_session *h;
    int rc = ctxs_store_session_open(&h, st, name, NULL, CTXS_RDONLY, NULL);
    if (rc != 0) {
        violation("%s does not open: %s", name, ctxs_err_name(rc));
        return -1;
    }
    ctxs_session_info info;
    ctxs_session_get_info(&info, h);
    uint64_t n = info.n_tokens;
    const state *cand[4096];
    size_t n_cand = candidates(s, cand, 4096);
    int found = 0;
    uint64_t first_bad = 0, max_n = 0;
    for (size_t i = n_cand; i-- > 0 && !found;) {
        uint64_t bad;
        if (cand[i]->n > max_n)
            max_n = cand[i]->n;
        if (holds_prefix(x, h, cand[i], n, &bad))
            found = 1;
        else if (i == n_cand - 1)
            first_bad = bad;
    }
    if (!found)
        violation("%s holds %" PRIu64 " tokens that are no prefix of any state it was told of "
                  "(%zu states, longest %" PRIu64 "; against the newest the first wrong position is %" PRIu64 ")",
                  name, n, n_cand, max_n, first_bad);
    /* A rollback in flight may have lowered what is durable. */
    uint64_t floor = s->floor;
    if (s->has_next && s->next_rollback && s->next.n < floor)
        floor = s->next.n;
    if (n < floor)
        violation("%s holds %" PRIu64 " tokens, fewer than the %" PRIu64
                  " an acknowledged sync, FULL commit, import or fork made durable",
                  name, n, floor);
    uint64_t bad_pos;
    if ((rc = ctxs_session_verify(&bad_pos, h)) != 0)
        violation("%s: a held token fails its checksum at %" PRIu64 ": %s", name, bad_pos,
                  ctxs_err_name(rc));
    ctxs_session_close(h);
    return (int64_t)n;
}

/* Every .ctxs file of sessions/ by id; returns how many. */
static size_t session_files(const char *store, uint64_t *ids, size_t max)
{
    char dir[4200];
    snprintf(dir, sizeof(dir), "%s/sessions", store);
    DIR *d = opendir(dir);
    size_t n = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len == 21 && strcmp(de->d_name + 16, ".ctxs") == 0 && n < max)
            ids[n++] = strtoull(de->d_name, NULL, 16);
    }
    if (d)
        closedir(d);
    return n;
}

/* The read-only look, before anything resolves what the cut left. */
static void check_read_only(ctx *x)
{
    ctxs_store *st;
    int rc = ctxs_store_open(&st, x->c->store, CTXS_RDONLY, NULL);
    if (rc != 0) {
        violation("the store does not open read-only: %s", ctxs_err_name(rc));
        return;
    }
    ctxs_session_entry *list = NULL;
    size_t n = 0;
    ctxs_intent_entry *in = NULL;
    size_t n_in = 0;
    if ((rc = ctxs_store_session_list(&list, &n, st)) != 0)
        violation("listing read-only: %s", ctxs_err_name(rc));
    if ((rc = ctxs_store_intent_list(&in, &n_in, st)) != 0)
        violation("the intents, read-only: %s", ctxs_err_name(rc));
    uint64_t ids[256];
    size_t n_files = session_files(x->c->store, ids, 256);
    for (size_t f = 0; f < n_files; f++) {
        int known = 0;
        for (size_t i = 0; i < n && !known; i++)
            known = list[i].id == ids[f];
        for (size_t i = 0; i < n_in && !known; i++)
            known = in[i].id == ids[f];
        if (!known)
            violation("read-only: sessions/%016" PRIx64 ".ctxs is neither indexed nor an "
                      "interrupted operation's",
                      ids[f]);
    }
    ctxs_free(list);
    ctxs_free(in);
    ctxs_store_close(st);
    /* The tool says the same: nothing it calls damage but tokens a
     * recovery drops (not damage of the index or a stray file). */
    if (x->c->bin) {
        char cmd[8400];
        snprintf(cmd, sizeof(cmd), "'%s' --store '%s' verify --all --json > /dev/null 2>&1",
                 x->c->bin, x->c->store);
        int ex = system(cmd);
        ex = WIFEXITED(ex) ? WEXITSTATUS(ex) : -1;
        if (ex != 0 && ex != 5)
            violation("`ctxstore verify --all` read-only exited %d", ex);
    }
}

/* Prefix lookups before any read-write open of the sessions: each match
 * must fork, and the fork hold the prompt's tokens. */
static void check_prefixes(ctx *x, ctxs_store *st, const ctxs_session_entry *list, size_t n)
{
    static int forks;
    for (size_t i = 0; i < x->rp.n_s; i++) {
        const csess *s = &x->rp.s[i];
        int64_t which;
        if (!find(list, n, s, &which))
            continue;
        const state *cand[4096];
        size_t n_cand = candidates(s, cand, 4096);
        const state *q = n_cand ? cand[n_cand - 1] : NULL;
        if (!q || q->n < PC_CHUNK)
            continue;
        uint32_t *prompt = malloc(q->n * 4);
        for (uint64_t p = 0; p < q->n; p++)
            prompt[p] = pc_token_id(q->gens[p], p);
        ctxs_prefix_match m;
        int rc = ctxs_prefix_find(&m, st, x->model.model_hash, prompt, q->n);
        if (rc == 0) {
            char fork[32];
            snprintf(fork, sizeof(fork), "check-fork-%d", forks++);
            ctxs_session *f;
            rc = ctxs_store_session_fork(&f, st, m.session, fork, m.n_tokens, NULL);
            if (rc != 0) {
                violation("a prefix match (%s at %" PRIu64 " tokens) does not fork: %s",
                          m.session, m.n_tokens, ctxs_err_name(rc));
            } else {
                uint32_t *ids = malloc(m.n_tokens * 4 + 4);
                if (ctxs_session_get_tokens(ids, f, 0, (uint32_t)m.n_tokens) != 0 ||
                    memcmp(ids, prompt, m.n_tokens * 4) != 0)
                    violation("the fork of a prefix match (%s at %" PRIu64
                              ") does not hold the prompt",
                              m.session, m.n_tokens);
                free(ids);
                ctxs_session_close(f);
                ctxs_store_session_delete(st, fork);
            }
        } else if (rc != CTXS_ENOTFOUND) {
            violation("prefix lookup: %s", ctxs_err_name(rc));
        }
        free(prompt);
    }
}

int pc_check_run(const pc_check *c)
{
    ctx x = {.c = c, .model = pc_model(c->dtype)};
    x.rp.level = c->level;
    x.token_bytes = ctxs_geometry_get_token_bytes(&x.model.geometry, c->dtype);
    if (replay_log(&x.rp, c->log) != 0) {
        fprintf(stderr, "powercut check: %s: cannot read the log\n", c->log);
        return -1;
    }
    if (!x.rp.store_made) {
        /* Made or not, half made or not: an open that works must work. */
        ctxs_store *st;
        if (ctxs_store_open(&st, c->store, 0, NULL) == 0)
            ctxs_store_close(st);
        return violations;
    }
    check_read_only(&x);

    ctxs_store *st;
    int rc = ctxs_store_open(&st, c->store, 0, NULL);
    if (rc != 0) {
        violation("the store does not open read-write: %s", ctxs_err_name(rc));
        return violations;
    }
    ctxs_model_entry me;
    if ((rc = ctxs_model_get(&me, st, x.model.model_hash)) != 0)
        violation("the model registered with the store is not there: %s", ctxs_err_name(rc));
    ctxs_session_entry *list = NULL;
    size_t n = 0;
    if ((rc = ctxs_store_session_list(&list, &n, st)) != 0)
        violation("listing: %s", ctxs_err_name(rc));

    /* Nothing listed that the workload did not make. */
    for (size_t i = 0; i < n; i++) {
        unsigned key;
        unsigned long long no;
        int known = 0;
        if (sscanf(list[i].name, "s%u-%llu", &key, &no) == 2)
            for (size_t j = 0; j < x.rp.n_s && !known; j++)
                known = x.rp.s[j].key == key && x.rp.s[j].seen &&
                        (no == x.rp.s[j].name_no || (int64_t)no == x.rp.s[j].name_next);
        if (!known)
            violation("'%s' is listed, and no operation made it", list[i].name);
    }

    check_prefixes(&x, st, list, n);

    for (size_t i = 0; i < x.rp.n_s; i++) {
        const csess *s = &x.rp.s[i];
        int64_t which;
        const ctxs_session_entry *e = find(list, n, s, &which);
        char name[32];
        pc_name(name, s->key, which >= 0 ? (uint64_t)which : s->name_no);
        if (s->deleted) {
            if (e)
                violation("%s is listed after its delete was acknowledged", name);
            char path[4200];
            snprintf(path, sizeof(path), "%s/sessions/%016" PRIx64 ".ctxs", c->store, s->id);
            if (s->id && access(path, F_OK) == 0)
                violation("the file of %s (deleted, acknowledged) is back: %s", name, path);
            continue;
        }
        if (!e) {
            if (s->made && !s->deleting)
                violation("%s (acknowledged) is not listed", name);
            continue;
        }
        if (s->made && s->id && e->id != s->id)
            violation("%s has id %" PRIu64 ", not %" PRIu64, name, e->id, s->id);
        int64_t held = check_tokens(&x, st, name, s);
        /* A read-write open settles on what the read-only one saw. */
        ctxs_session *h;
        ctxs_model m = x.model;
        if (held >= 0 && (rc = ctxs_store_session_open(&h, st, name, &m, 0, NULL)) == 0) {
            ctxs_session_info info;
            ctxs_session_get_info(&info, h);
            uint64_t bad;
            if ((int64_t)info.n_tokens != held)
                violation("%s: read-only it holds %" PRId64 " tokens, read-write %" PRIu64, name,
                          held, info.n_tokens);
            if (ctxs_session_verify(&bad, h) != 0)
                violation("%s: a token fails its checksum after a read-write open, at %" PRIu64,
                          name, bad);
            ctxs_session_close(h);
        } else if (held >= 0) {
            violation("%s does not open read-write: %s", name, ctxs_err_name(rc));
        }
        for (int k = 0; k < MAX_META; k++) {
            if (s->meta[k] < 0 && s->meta_next[k] < 0)
                continue;
            char key[16], val[64], want[32], want_next[32];
            size_t len = sizeof(val) - 1;
            snprintf(key, sizeof(key), "k%d", k);
            rc = ctxs_store_session_get_meta(val, &len, st, name, key);
            val[rc == 0 ? len : 0] = '\0';
            snprintf(want, sizeof(want), "v%" PRId64, s->meta[k]);
            snprintf(want_next, sizeof(want_next), "v%" PRId64, s->meta_next[k]);
            int ok = (rc == 0 && (strcmp(val, want) == 0 || strcmp(val, want_next) == 0)) ||
                     (rc == CTXS_ENOTFOUND && s->meta[k] < 0);
            if (!ok)
                violation("%s: metadata %s is '%s' (%s), want '%s'", name, key, val,
                          ctxs_err_name(rc), want);
        }
    }

    /* What the cut left is resolved, and nothing else is out of place. */
    ctxs_intent_entry *in = NULL;
    size_t n_in = 0;
    if (ctxs_store_intent_list(&in, &n_in, st) == 0 && n_in)
        violation("%zu intents are left after a read-write open (the first: id %" PRIu64 ")",
                  n_in, in[0].id);
    ctxs_free(in);
    uint64_t ids[256];
    size_t n_files = session_files(c->store, ids, 256);
    ctxs_free(list);
    list = NULL;
    ctxs_store_session_list(&list, &n, st);
    for (size_t f = 0; f < n_files; f++) {
        int known = 0;
        for (size_t i = 0; i < n && !known; i++)
            known = list[i].id == ids[f];
        if (!known)
            violation("sessions/%016" PRIx64 ".ctxs is indexed by nothing after a read-write open",
                      ids[f]);
    }
    ctxs_store_check_result chk;
    if ((rc = ctxs_store_check(&chk, st)) != 0)
        violation("ctxs_store_check: %s (%" PRIu64 " problems)", ctxs_err_name(rc),
                  rc == CTXS_EINDEX ? chk.n_problems : 0);
    if (rc == 0 || rc == CTXS_EINDEX)
        ctxs_free(chk.problems);
    ctxs_free(list);
    ctxs_store_close(st);
    return violations;
}
