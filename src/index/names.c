/*
 * Names are user text, never paths: files are named from ids. A name is still
 * refused where it could be mistaken for a path by anything that prints or
 * exports it, or where it is not text at all.
 */
#include <string.h>

#include "index.h"

/* Length of the UTF-8 sequence at s (of at most left bytes), or 0 when it is
 * not well-formed: no overlong forms, no surrogates, nothing past U+10FFFF. */
static size_t utf8_sequence(const unsigned char *s, size_t left)
{
    unsigned c = s[0];
    size_t n;
    unsigned min, cp;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2, min = 0x80, cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3, min = 0x800, cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4, min = 0x10000, cp = c & 0x07;
    } else {
        return 0;
    }
    if (n > left)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3fu);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n;
}

/* Why name breaks the rule, or NULL; *len gets its length when it keeps it. */
static const char *name_fault(const char *name, size_t *len)
{
    if (!name)
        return "is missing (NULL)";
    size_t n = strnlen(name, CTXS_NAME_MAX + 1);
    if (n == 0)
        return "is empty";
    if (n > CTXS_NAME_MAX)
        return "is longer than 255 bytes";
    if (strchr(name, '/'))
        return "contains '/'";
    if (strstr(name, ".."))
        return "contains '..'";
    if (strcmp(name, ".") == 0)
        return "is '.'";
    const unsigned char *s = (const unsigned char *)name;
    for (size_t i = 0; i < n;) {
        if (s[i] < 0x20 || s[i] == 0x7f)
            return "contains a control character";
        size_t step = utf8_sequence(s + i, n - i);
        if (step == 0)
            return "is not valid UTF-8";
        i += step;
    }
    *len = n;
    return NULL;
}

void ctxs__name_shown(char out[80], const char *name)
{
    size_t i = 0;
    for (; name && name[i] && i < 64; i++)
        out[i] = (unsigned char)name[i] < 0x20 || name[i] == 0x7f ? '?' : name[i];
    if (name && name[i])
        memcpy(out + i, "...", 3), i += 3;
    out[i] = '\0';
}

int ctxs__name_check(const char *name, size_t *len)
{
    const char *why = name_fault(name, len);
    if (!why)
        return 0;
    if (!name)
        return ctxs__error(CTXS_EINVAL, "a name is missing (NULL)");
    char shown[80];
    ctxs__name_shown(shown, name);
    return ctxs__error(CTXS_EINVAL, "the name '%s' %s: %s", shown, why, CTXS_NAME_RULE);
}

const char *ctxs_name_check(const char *name)
{
    size_t len;
    return name_fault(name, &len);
}

int ctxs__name_field(char *out, const char *field, uint16_t len, int may_be_empty)
{
    if (len > CTXS_NAME_MAX || (len == 0 && !may_be_empty))
        return CTXS_ECORRUPT;
    for (size_t i = len; i <= CTXS_NAME_MAX; i++)
        if (field[i])
            return CTXS_ECORRUPT;
    memcpy(out, field, len);
    out[len] = '\0';
    size_t got;
    if (len && (ctxs__name_check(out, &got) < 0 || got != len))
        return CTXS_ECORRUPT;
    return 0;
}
