/*
 * A small, strict JSON parser for the tests: the ctxstore tool's --json
 * output is parsed back into a tree and its values are checked against what
 * the test made.
 *
 * Strict on purpose, so that it also judges the tool's writer: RFC 8259
 * grammar only (no comments, no trailing commas, no leading zeros, no NaN),
 * strings must be valid UTF-8 without raw control characters, \u escapes
 * must pair their surrogates, an object must not repeat a key, and nothing
 * but whitespace may follow the document. Integers are kept exactly (64-bit)
 * besides their double value. No Criterion here: the tests wrap it.
 */
#ifndef CTXS_TESTS_JSON_CHECK_H
#define CTXS_TESTS_JSON_CHECK_H

#include <stddef.h>
#include <stdint.h>

typedef enum jc_type {
    JC_NULL,
    JC_BOOL,
    JC_NUMBER,
    JC_STRING,
    JC_ARRAY,
    JC_OBJECT,
} jc_type;

typedef struct jc_value jc_value;

struct jc_value {
    jc_type type;
    int boolean;          /* JC_BOOL: 0 or 1 */
    /* JC_NUMBER */
    double number;        /* the value as a double, always */
    int is_int;           /* 1: no fraction or exponent, and it fits below */
    int negative;         /* 1: the integer is negative (then in i64) */
    uint64_t u64;         /* the integer, when is_int and !negative */
    int64_t i64;          /* the integer, when is_int */
    /* JC_STRING: the decoded bytes, NUL-terminated (len excludes the NUL;
     * a \u0000 in the text makes strlen() shorter than len) */
    char *str;
    size_t len;
    /* JC_ARRAY and JC_OBJECT: n items; an object's keys[i] names items[i] */
    size_t n;
    jc_value *items;
    char **keys;
    size_t *key_lens;
};

/* Parses len bytes of text. Returns the tree (release it with jc_free()),
 * or NULL with a message naming the byte offset in err (errlen bytes; err
 * may be NULL). */
jc_value *jc_parse(const char *text, size_t len, char *err, size_t errlen);

/* Releases a tree from jc_parse(). Accepts NULL. */
void jc_free(jc_value *v);

/* The member key of object v, or NULL (v NULL or not an object, no such
 * key). */
const jc_value *jc_get(const jc_value *v, const char *key);

/* Item i of array v, or NULL. */
const jc_value *jc_at(const jc_value *v, size_t i);

/* A member reached by a path of keys and indexes: "sessions[0].name",
 * "[2].flags", "records[1].valid". NULL if any step is missing. */
const jc_value *jc_path(const jc_value *v, const char *path);

/* Accessors that return NULL / 0 / -1 when the value is absent or of
 * another type. */
const char *jc_str(const jc_value *v);          /* JC_STRING's text */
int jc_u64(const jc_value *v, uint64_t *out);   /* 0 for a non-negative int */
int jc_bool(const jc_value *v);                 /* 0, 1, or -1 */

/* 1 if the array v holds a string equal to s, else 0. */
int jc_has_string(const jc_value *v, const char *s);

/* The first member named key anywhere in the tree (depth first, in
 * document order), or NULL. For outputs whose exact shape a test does
 * not pin down. */
const jc_value *jc_find_key(const jc_value *v, const char *key);

/* As jc_find_key(), for the first member whose key contains part. */
const jc_value *jc_find_key_part(const jc_value *v, const char *part);

/* The type's name, for messages. */
const char *jc_type_name(jc_type t);

#endif
