/*
 * Listing the session records under a remote's prefix (SCAN, then each
 * record's header), and the server's own words about itself (INFO,
 * DBSIZE).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "remote.h"
#include "syscall.h"

/* An INFO section: a few KiB from any Redis. */
static const ctxs__reply_cap CAP_INFO = {"INFO reply", 1u << 20, (1u << 20) + 64, 0};
/* The first 640 bytes of a record (GETRANGE). */
static const ctxs__reply_cap CAP_RECORD_HEAD = {"record header", CTXS__RSESSION_HEADER_BYTES,
                                          CTXS__RSESSION_HEADER_BYTES + 64, 0};
/* A SCAN reply: the cursor and at most SCAN_KEYS_MAX keys (COUNT asks
 * for 100; Redis returns about as many, more for a bucket's chain). */
#define SCAN_KEYS_MAX 4096
#define SCAN_KEY_MAX 1024 /* above "<prefix>:session:<name>" of any name */
static const ctxs__reply_cap CAP_SCAN = {"SCAN reply", SCAN_KEY_MAX,
                                   (uint64_t)SCAN_KEYS_MAX * (SCAN_KEY_MAX + 16) + 64,
                                   SCAN_KEYS_MAX};
/* A listing's bounds: SCAN rounds, and keys taken from them. */
#define SCAN_ROUNDS_MAX 1000000u
#define LIST_KEYS_MAX 100000u

static int entry_cmp(const void *a, const void *b)
{
    return strcmp(((const ctxs_remote_entry *)a)->name, ((const ctxs_remote_entry *)b)->name);
}

static int remote_list_impl(ctxs_remote_entry **out, size_t *n_out, ctxs_remote *r)
{
    if (!out || !n_out)
        return CTXS_EINVAL;
    *out = NULL;
    *n_out = 0;
    if (!r)
        return CTXS_EINVAL;
    redisContext *c;
    int rc = ctxs__redis_open(&c, r);
    if (rc < 0)
        return rc;
    /* A name may hold the glob characters * ? [ ] \ that MATCH reads as a
     * pattern: escaped, or the prefix "a*" would list "ab"'s records (as
     * damaged ones). Each key is still checked to start with exactly
     * "<prefix>:session:" below: what SCAN returns is the server's word. */
    char head[CTXS__RSESSION_KEY_MAX], pattern[2 * CTXS__RSESSION_KEY_MAX + 2];
    ctxs__rsession_key(head, r, "");
    size_t plen = strlen(head), at = 0;
    for (const char *p = r->prefix; *p; p++) {
        if (strchr("*?[]\\", *p))
            pattern[at++] = '\\';
        pattern[at++] = *p;
    }
    snprintf(pattern + at, sizeof(pattern) - at, ":session:*");
    ctxs_remote_entry *v = NULL;
    size_t n = 0, cap = 0;
    char cursor[32] = "0";
    /* A server whose cursor never comes back to 0, or that returns keys
     * without end, meets the bounds (and the call's deadline). */
    uint64_t rounds = 0, keys = 0;
    do {
        const char *argv[] = {"SCAN", cursor, "MATCH", pattern, "COUNT", "100"};
        redisReply *rep;
        if ((rc = ctxs__redis_command(&rep, c, &CAP_SCAN, 6, argv, NULL)) == 0 &&
            (rc = ctxs__reply_check(c, rep, 0)) == 0 &&
            (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
             rep->element[0]->type != REDIS_REPLY_STRING || rep->element[0]->len >= 32 ||
             rep->element[1]->type != REDIS_REPLY_ARRAY)) {
            ctxs__rsay("a SCAN reply that is not a cursor and an array of keys");
            rc = CTXS_EREMOTE;
        }
        size_t got = rc == 0 ? rep->element[1]->elements : 0;
        if (rc == 0)
            snprintf(cursor, sizeof(cursor), "%s", rep->element[0]->str);
        if (rc == 0 && ++rounds > SCAN_ROUNDS_MAX) {
            ctxs__rsay("SCAN's cursor still not back to 0 after %u rounds", SCAN_ROUNDS_MAX);
            rc = CTXS_EREMOTE;
        }
        if (rc == 0 && (keys += got) > LIST_KEYS_MAX) {
            ctxs__rsay("SCAN returned more than %u keys", LIST_KEYS_MAX);
            rc = CTXS_EREMOTE;
        }
        /* The headers only (GETRANGE): a record's ids may be megabytes. */
        ctxs__redis_cap_set(c, &CAP_RECORD_HEAD);
        for (size_t i = 0; i < got && rc == 0; i++) {
            const redisReply *k = rep->element[1]->element[i];
            char end[16];
            snprintf(end, sizeof(end), "%u", CTXS__RSESSION_HEADER_BYTES - 1);
            const char *ga[] = {"GETRANGE", k->str, "0", end};
            size_t gl[] = {8, k->len, 1, strlen(end)};
            if (redisAppendCommandArgv(c, 4, ga, gl) != REDIS_OK)
                rc = ctxs__redis_error(c, errno);
        }
        for (size_t i = 0; i < got && rc == 0; i++) {
            const redisReply *k = rep->element[1]->element[i];
            redisReply *hr;
            /* A key of another type under the prefix (CTXS__WRONGTYPE) is a
             * damaged record, listed as one. */
            int wrong_type = 0;
            if ((rc = ctxs__reply_next(&hr, c)) == 0) {
                wrong_type = hr->type == REDIS_REPLY_ERROR && !strncmp(hr->str, "WRONGTYPE", 9);
                if (!wrong_type)
                    rc = ctxs__reply_check(c, hr, 0);
            }
            if (rc == 0) {
                size_t nl = k->len - plen;
                if (k->len > plen && nl <= CTXS_NAME_MAX && !memcmp(k->str, head, plen) &&
                    (wrong_type || (hr->type == REDIS_REPLY_STRING &&
                                    hr->len > 0))) { /* a key deleted since SCAN reads as "" */
                    if (n == cap) {
                        cap = cap ? 2 * cap : 16;
                        ctxs_remote_entry *nv = ctxs__realloc(v, cap * sizeof(*v));
                        if (!nv)
                            rc = CTXS_ENOMEM;
                        else
                            v = nv;
                    }
                    if (rc == 0) {
                        ctxs_remote_entry *e = &v[n++];
                        memset(e, 0, sizeof(*e));
                        memcpy(e->name, k->str + plen, nl);
                        ctxs__rsession_header h;
                        if (wrong_type || ctxs__rsession_header_check(&h, hr->str, hr->len) < 0 ||
                            h.name_len != nl || memcmp(h.name, e->name, nl)) {
                            e->status = CTXS_EREMOTE;
                        } else {
                            memcpy(e->model_hash, h.model_hash, 16);
                            e->n_tokens = h.n_tokens;
                            e->updated_unix_ms = h.updated_unix_ms;
                            e->tail_pushed = (h.flags & CTXS__RSESSION_FLAG_TAIL) != 0;
                        }
                    }
                }
            }
            if (hr)
                freeReplyObject(hr);
        }
        if (rep)
            freeReplyObject(rep);
    } while (rc == 0 && strcmp(cursor, "0") != 0);
    ctxs__redis_close(c);
    if (rc < 0) {
        free(v);
        return rc;
    }
    /* SCAN may return a key twice: sorted, then the repeats dropped. */
    if (n)
        qsort(v, n, sizeof(*v), entry_cmp);
    size_t w = 0;
    for (size_t i = 0; i < n; i++)
        if (w == 0 || strcmp(v[w - 1].name, v[i].name))
            v[w++] = v[i];
    *out = v;
    *n_out = w;
    return 0;
}

/* The value of "field:" in an INFO reply, into out[cap] ("" if absent). */
static void info_field(char *out, size_t cap, const char *info, const char *field)
{
    out[0] = '\0';
    size_t fl = strlen(field);
    for (const char *at = info; at && *at; at = strchr(at, '\n') ? strchr(at, '\n') + 1 : NULL) {
        if (!strncmp(at, field, fl) && at[fl] == ':') {
            size_t n = strcspn(at + fl + 1, "\r\n");
            if (n >= cap)
                n = cap - 1;
            memcpy(out, at + fl + 1, n);
            out[n] = '\0';
            return;
        }
    }
}

static int remote_get_info_impl(ctxs_remote_info *out, ctxs_remote *r)
{
    if (!out || !r)
        return CTXS_EINVAL;
    memset(out, 0, sizeof(*out));
    redisContext *c;
    int rc = ctxs__redis_open(&c, r);
    if (rc < 0)
        return rc;
    static const char *sections[] = {"server", "memory", "stats"};
    for (size_t i = 0; i < 3 && rc == 0; i++) {
        const char *argv[] = {"INFO", sections[i]};
        redisReply *rep;
        if ((rc = ctxs__redis_command(&rep, c, &CAP_INFO, 2, argv, NULL)) == 0 &&
            (rc = ctxs__reply_check(c, rep, 0)) == 0 && rep->type != REDIS_REPLY_STRING &&
            rep->type != REDIS_REPLY_STATUS)
            rc = CTXS_EREMOTE;
        if (rc == 0) {
            char v[64];
            if (i == 0)
                info_field(out->server_version, sizeof(out->server_version), rep->str,
                           "redis_version");
            if (i == 1) {
                info_field(v, sizeof(v), rep->str, "used_memory");
                out->used_memory = strtoull(v, NULL, 10);
                info_field(v, sizeof(v), rep->str, "maxmemory");
                out->maxmemory = strtoull(v, NULL, 10);
                info_field(out->maxmemory_policy, sizeof(out->maxmemory_policy), rep->str,
                           "maxmemory_policy");
            }
            if (i == 2) {
                info_field(v, sizeof(v), rep->str, "evicted_keys");
                out->evicted_keys = strtoull(v, NULL, 10);
            }
        }
        if (rep)
            freeReplyObject(rep);
    }
    if (rc == 0) {
        const char *argv[] = {"DBSIZE"};
        redisReply *rep;
        if ((rc = ctxs__redis_command(&rep, c, &ctxs__cap_small, 1, argv, NULL)) == 0 &&
            (rc = ctxs__reply_check(c, rep, 0)) == 0 && rep->type != REDIS_REPLY_INTEGER)
            rc = CTXS_EREMOTE;
        if (rc == 0)
            out->keys = (uint64_t)rep->integer;
        if (rep)
            freeReplyObject(rep);
    }
    ctxs__redis_close(c);
    return rc;
}

int ctxs_remote_list(ctxs_remote_entry **out, size_t *n_out, ctxs_remote *r)
{
    ctxs__remote_call call;
    ctxs__remote_enter(&call);
    int rc = remote_list_impl(out, n_out, r);
    return ctxs__remote_leave(&call, rc);
}

int ctxs_remote_get_info(ctxs_remote_info *out, ctxs_remote *r)
{
    ctxs__remote_call call;
    ctxs__remote_enter(&call);
    int rc = remote_get_info_impl(out, r);
    return ctxs__remote_leave(&call, rc);
}

