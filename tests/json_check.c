/*
 * A strict recursive-descent JSON parser (RFC 8259) for the tests; see
 * json_check.h for what it refuses and why.
 */
#include "json_check.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Deeper than anything the tool writes; keeps hostile input off the
 * stack. */
#define JC_MAX_DEPTH 64

typedef struct parser {
    const unsigned char *p, *end, *start;
    char *err;
    size_t errlen;
    int failed;
} parser;

__attribute__((format(printf, 2, 3))) static void fail(parser *ps, const char *fmt, ...)
{
    if (ps->failed)
        return;
    ps->failed = 1;
    if (!ps->err || !ps->errlen)
        return;
    int k = snprintf(ps->err, ps->errlen, "at byte %zu: ", (size_t)(ps->p - ps->start));
    if (k < 0 || (size_t)k >= ps->errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ps->err + k, ps->errlen - (size_t)k, fmt, ap);
    va_end(ap);
}

static void skip_ws(parser *ps)
{
    while (ps->p < ps->end &&
           (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static int literal(parser *ps, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0) {
        fail(ps, "expected '%s'", word);
        return -1;
    }
    ps->p += n;
    return 0;
}

/* --- Strings ----------------------------------------------------------------- */

typedef struct buf {
    char *data;
    size_t len, cap;
} buf;

static int buf_put(buf *b, const void *p, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 32;
        while (b->len + n + 1 > cap)
            cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d)
            return -1;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

static int hex4(parser *ps, unsigned *out)
{
    if (ps->end - ps->p < 4) {
        fail(ps, "\\u needs four hex digits");
        return -1;
    }
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = ps->p[i], d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else {
            fail(ps, "\\u needs four hex digits");
            return -1;
        }
        v = v * 16 + d;
    }
    ps->p += 4;
    *out = v;
    return 0;
}

static int put_utf8(buf *b, unsigned cp)
{
    unsigned char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (unsigned char)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (unsigned char)(0xc0 | (cp >> 6));
        u[1] = (unsigned char)(0x80 | (cp & 0x3f));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (unsigned char)(0xe0 | (cp >> 12));
        u[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        u[2] = (unsigned char)(0x80 | (cp & 0x3f));
        n = 3;
    } else {
        u[0] = (unsigned char)(0xf0 | (cp >> 18));
        u[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
        u[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        u[3] = (unsigned char)(0x80 | (cp & 0x3f));
        n = 4;
    }
    return buf_put(b, u, n);
}

/* The length of the valid UTF-8 sequence at p (not ASCII), or 0: no
 * overlong forms, no surrogates, nothing above U+10FFFF. */
static size_t utf8_len(const unsigned char *p, const unsigned char *end)
{
    unsigned c = p[0], cp, n;
    if (c >= 0xc2 && c <= 0xdf)
        n = 2, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef)
        n = 3, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4)
        n = 4, cp = c & 0x07;
    else
        return 0;
    if ((size_t)(end - p) < n)
        return 0;
    for (unsigned i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[i] & 0x3f);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n;
}

/* Parses a string at ps->p (at its opening quote) into *out. */
static int string_parse(parser *ps, char **out, size_t *len_out)
{
    buf b = { 0 };
    ps->p++; /* the quote */
    if (buf_put(&b, "", 0) < 0)
        goto nomem;
    for (;;) {
        if (ps->p >= ps->end) {
            fail(ps, "unterminated string");
            goto bad;
        }
        unsigned c = *ps->p;
        if (c == '"') {
            ps->p++;
            break;
        }
        if (c < 0x20) {
            fail(ps, "raw control character 0x%02x in a string", c);
            goto bad;
        }
        if (c == '\\') {
            ps->p++;
            if (ps->p >= ps->end) {
                fail(ps, "unterminated escape");
                goto bad;
            }
            char e = (char)*ps->p++, ch;
            switch (e) {
            case '"': ch = '"'; break;
            case '\\': ch = '\\'; break;
            case '/': ch = '/'; break;
            case 'b': ch = '\b'; break;
            case 'f': ch = '\f'; break;
            case 'n': ch = '\n'; break;
            case 'r': ch = '\r'; break;
            case 't': ch = '\t'; break;
            case 'u': {
                unsigned cp, lo;
                if (hex4(ps, &cp) < 0)
                    goto bad;
                if (cp >= 0xdc00 && cp <= 0xdfff) {
                    fail(ps, "a lone low surrogate");
                    goto bad;
                }
                if (cp >= 0xd800 && cp <= 0xdbff) {
                    if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u') {
                        fail(ps, "a high surrogate without its low half");
                        goto bad;
                    }
                    ps->p += 2;
                    if (hex4(ps, &lo) < 0)
                        goto bad;
                    if (lo < 0xdc00 || lo > 0xdfff) {
                        fail(ps, "a high surrogate without its low half");
                        goto bad;
                    }
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                }
                if (put_utf8(&b, cp) < 0)
                    goto nomem;
                continue;
            }
            default:
                ps->p--;
                fail(ps, "unknown escape '\\%c'", e);
                goto bad;
            }
            if (buf_put(&b, &ch, 1) < 0)
                goto nomem;
            continue;
        }
        size_t n = 1;
        if (c >= 0x80 && (n = utf8_len(ps->p, ps->end)) == 0) {
            fail(ps, "invalid UTF-8 in a string");
            goto bad;
        }
        if (buf_put(&b, ps->p, n) < 0)
            goto nomem;
        ps->p += n;
    }
    *out = b.data;
    *len_out = b.len;
    return 0;
nomem:
    fail(ps, "out of memory");
bad:
    free(b.data);
    return -1;
}

/* --- Numbers ------------------------------------------------------------------ */

static int is_digit(unsigned c)
{
    return c >= '0' && c <= '9';
}

static int number_parse(parser *ps, jc_value *v)
{
    const unsigned char *s = ps->p, *p = ps->p;
    int negative = 0, integral = 1;
    if (p < ps->end && *p == '-')
        negative = 1, p++;
    if (p >= ps->end || !is_digit(*p)) {
        fail(ps, "a number needs a digit");
        return -1;
    }
    if (*p == '0') {
        p++;
        if (p < ps->end && is_digit(*p)) {
            ps->p = p;
            fail(ps, "a leading zero");
            return -1;
        }
    } else {
        while (p < ps->end && is_digit(*p))
            p++;
    }
    if (p < ps->end && *p == '.') {
        integral = 0;
        p++;
        if (p >= ps->end || !is_digit(*p)) {
            ps->p = p;
            fail(ps, "a fraction needs a digit");
            return -1;
        }
        while (p < ps->end && is_digit(*p))
            p++;
    }
    if (p < ps->end && (*p == 'e' || *p == 'E')) {
        integral = 0;
        p++;
        if (p < ps->end && (*p == '+' || *p == '-'))
            p++;
        if (p >= ps->end || !is_digit(*p)) {
            ps->p = p;
            fail(ps, "an exponent needs a digit");
            return -1;
        }
        while (p < ps->end && is_digit(*p))
            p++;
    }
    char text[512];
    size_t n = (size_t)(p - s);
    if (n >= sizeof(text)) {
        fail(ps, "a number of %zu characters", n);
        return -1;
    }
    memcpy(text, s, n);
    text[n] = '\0';
    v->type = JC_NUMBER;
    v->number = strtod(text, NULL);
    v->negative = negative;
    if (integral) {
        errno = 0;
        if (negative) {
            long long x = strtoll(text, NULL, 10);
            if (errno == 0) {
                v->is_int = 1;
                v->i64 = x;
                if (x == 0)
                    v->negative = 0; /* "-0" */
            }
        } else {
            unsigned long long x = strtoull(text, NULL, 10);
            if (errno == 0) {
                v->is_int = 1;
                v->u64 = x;
                v->i64 = (int64_t)x;
            }
        }
    }
    ps->p = p;
    return 0;
}

/* --- Values -------------------------------------------------------------------- */

static void value_clear(jc_value *v);

static int value_parse(parser *ps, jc_value *v, int depth);

static int items_grow(jc_value *v, size_t *cap, int with_keys)
{
    if (v->n < *cap)
        return 0;
    size_t cap2 = *cap ? *cap * 2 : 4;
    jc_value *items = realloc(v->items, cap2 * sizeof(*items));
    if (!items)
        return -1;
    v->items = items;
    if (with_keys) {
        char **keys = realloc(v->keys, cap2 * sizeof(*keys));
        if (!keys)
            return -1;
        v->keys = keys;
        size_t *lens = realloc(v->key_lens, cap2 * sizeof(*lens));
        if (!lens)
            return -1;
        v->key_lens = lens;
    }
    *cap = cap2;
    return 0;
}

static int array_parse(parser *ps, jc_value *v, int depth)
{
    size_t cap = 0;
    v->type = JC_ARRAY;
    ps->p++; /* [ */
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == ']') {
        ps->p++;
        return 0;
    }
    for (;;) {
        if (items_grow(v, &cap, 0) < 0) {
            fail(ps, "out of memory");
            return -1;
        }
        memset(&v->items[v->n], 0, sizeof(v->items[0]));
        int rc = value_parse(ps, &v->items[v->n], depth + 1);
        v->n++; /* so that value_clear frees what was parsed */
        if (rc < 0)
            return -1;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == ']') {
            ps->p++;
            return 0;
        }
        fail(ps, "expected ',' or ']' in an array");
        return -1;
    }
}

static int object_parse(parser *ps, jc_value *v, int depth)
{
    size_t cap = 0;
    v->type = JC_OBJECT;
    ps->p++; /* { */
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == '}') {
        ps->p++;
        return 0;
    }
    for (;;) {
        skip_ws(ps);
        if (ps->p >= ps->end || *ps->p != '"') {
            fail(ps, "expected a key (a string)");
            return -1;
        }
        const unsigned char *key_at = ps->p;
        char *key;
        size_t key_len;
        if (string_parse(ps, &key, &key_len) < 0)
            return -1;
        for (size_t i = 0; i < v->n; i++) {
            if (v->key_lens[i] == key_len && memcmp(v->keys[i], key, key_len) == 0) {
                ps->p = key_at;
                fail(ps, "the key \"%s\" again in one object", key);
                free(key);
                return -1;
            }
        }
        skip_ws(ps);
        if (ps->p >= ps->end || *ps->p != ':') {
            fail(ps, "expected ':' after a key");
            free(key);
            return -1;
        }
        ps->p++;
        if (items_grow(v, &cap, 1) < 0) {
            fail(ps, "out of memory");
            free(key);
            return -1;
        }
        memset(&v->items[v->n], 0, sizeof(v->items[0]));
        v->keys[v->n] = key;
        v->key_lens[v->n] = key_len;
        int rc = value_parse(ps, &v->items[v->n], depth + 1);
        v->n++;
        if (rc < 0)
            return -1;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == '}') {
            ps->p++;
            return 0;
        }
        fail(ps, "expected ',' or '}' in an object");
        return -1;
    }
}

static int value_parse(parser *ps, jc_value *v, int depth)
{
    if (depth > JC_MAX_DEPTH) {
        fail(ps, "nested deeper than %d", JC_MAX_DEPTH);
        return -1;
    }
    skip_ws(ps);
    if (ps->p >= ps->end) {
        fail(ps, "expected a value, found the end");
        return -1;
    }
    switch (*ps->p) {
    case '{':
        return object_parse(ps, v, depth);
    case '[':
        return array_parse(ps, v, depth);
    case '"':
        v->type = JC_STRING;
        return string_parse(ps, &v->str, &v->len);
    case 't':
        v->type = JC_BOOL;
        v->boolean = 1;
        return literal(ps, "true");
    case 'f':
        v->type = JC_BOOL;
        return literal(ps, "false");
    case 'n':
        v->type = JC_NULL;
        return literal(ps, "null");
    default:
        if (*ps->p == '-' || is_digit(*ps->p))
            return number_parse(ps, v);
        fail(ps, "unexpected character '%c' (0x%02x)", *ps->p >= 0x20 && *ps->p < 0x7f ? *ps->p : '?',
             *ps->p);
        return -1;
    }
}

static void value_clear(jc_value *v)
{
    if (!v)
        return;
    free(v->str);
    for (size_t i = 0; i < v->n; i++) {
        value_clear(&v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->key_lens);
}

jc_value *jc_parse(const char *text, size_t len, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    parser ps = { (const unsigned char *)text, (const unsigned char *)text + len,
                  (const unsigned char *)text, err, errlen, 0 };
    jc_value *v = calloc(1, sizeof(*v));
    if (!v) {
        fail(&ps, "out of memory");
        return NULL;
    }
    if (!text) {
        fail(&ps, "no text");
        free(v);
        return NULL;
    }
    if (value_parse(&ps, v, 0) == 0) {
        skip_ws(&ps);
        if (ps.p == ps.end)
            return v;
        fail(&ps, "trailing bytes after the document");
    }
    value_clear(v);
    free(v);
    return NULL;
}

void jc_free(jc_value *v)
{
    value_clear(v);
    free(v);
}

/* --- Queries -------------------------------------------------------------------- */

const jc_value *jc_get(const jc_value *v, const char *key)
{
    if (!v || v->type != JC_OBJECT || !key)
        return NULL;
    size_t n = strlen(key);
    for (size_t i = 0; i < v->n; i++)
        if (v->key_lens[i] == n && memcmp(v->keys[i], key, n) == 0)
            return &v->items[i];
    return NULL;
}

const jc_value *jc_at(const jc_value *v, size_t i)
{
    if (!v || v->type != JC_ARRAY || i >= v->n)
        return NULL;
    return &v->items[i];
}

const jc_value *jc_path(const jc_value *v, const char *path)
{
    const char *p = path;
    while (v && p && *p) {
        if (*p == '.') {
            p++;
            continue;
        }
        if (*p == '[') {
            char *end;
            errno = 0;
            unsigned long long i = strtoull(p + 1, &end, 10);
            if (errno || end == p + 1 || *end != ']')
                return NULL;
            v = jc_at(v, (size_t)i);
            p = end + 1;
            continue;
        }
        size_t n = strcspn(p, ".[");
        char key[256];
        if (n >= sizeof(key))
            return NULL;
        memcpy(key, p, n);
        key[n] = '\0';
        v = jc_get(v, key);
        p += n;
    }
    return v;
}

const char *jc_str(const jc_value *v)
{
    return v && v->type == JC_STRING ? v->str : NULL;
}

int jc_u64(const jc_value *v, uint64_t *out)
{
    if (!v || v->type != JC_NUMBER || !v->is_int || v->negative)
        return -1;
    *out = v->u64;
    return 0;
}

int jc_bool(const jc_value *v)
{
    return v && v->type == JC_BOOL ? v->boolean : -1;
}

int jc_has_string(const jc_value *v, const char *s)
{
    if (!v || v->type != JC_ARRAY)
        return 0;
    for (size_t i = 0; i < v->n; i++)
        if (v->items[i].type == JC_STRING && strcmp(v->items[i].str, s) == 0)
            return 1;
    return 0;
}

static const jc_value *find(const jc_value *v, const char *key, int part)
{
    if (!v)
        return NULL;
    for (size_t i = 0; i < v->n; i++) {
        if (v->type == JC_OBJECT &&
            (part ? strstr(v->keys[i], key) != NULL : strcmp(v->keys[i], key) == 0))
            return &v->items[i];
        const jc_value *hit = find(&v->items[i], key, part);
        if (hit)
            return hit;
    }
    return NULL;
}

const jc_value *jc_find_key(const jc_value *v, const char *key)
{
    return find(v, key, 0);
}

const jc_value *jc_find_key_part(const jc_value *v, const char *part)
{
    return find(v, part, 1);
}

const char *jc_type_name(jc_type t)
{
    switch (t) {
    case JC_NULL: return "null";
    case JC_BOOL: return "boolean";
    case JC_NUMBER: return "number";
    case JC_STRING: return "string";
    case JC_ARRAY: return "array";
    case JC_OBJECT: return "object";
    }
    return "?";
}
