/* The strict JSON parser: recursive descent (depth is capped, so recursion is
 * bounded) into a tree whose nodes, arrays and strings are carved out of one
 * arena per document, so that a whole tree is freed at once and a failed
 * parse leaves nothing behind. Positions are byte offsets while parsing;
 * line and column are worked out only when a message needs them. */
#include "json-impl.h"

#include "base/base.h"

#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the arena ----------------------------------------------------------- */

typedef union arena_chunk {
    union arena_chunk *next;
    max_align_t align; /* the payload after the header is suitably aligned */
} arena_chunk;

#define ARENA_FIRST_BYTES ((size_t)4096)
#define ARENA_MAX_BYTES ((size_t)1 << 20)

/* What nm_json_free releases: the chunks, and this block, which holds the
 * root so that the root's address leads back to it. */
typedef struct json_doc {
    arena_chunk *chunks;
    nm_json root;
} json_doc;

/* Members of open objects wait here (elements of open arrays too, with
 * key NULL) until their container closes and gets its exact-size array. */
typedef struct parser {
    const unsigned char *s; /* [n] */
    size_t n;
    size_t pos;
    int depth;
    json_doc *doc;
    unsigned char *cur; /* free space of the newest chunk */
    size_t left;
    size_t next_chunk_bytes;
    nm_json_member *stack; /* [cap] scratch, [0, top) in use */
    size_t top, cap;
    nm_error *err;
} parser;

/* Every block is 8-aligned, enough for the nodes, members and doubles. */
#define ARENA_ALIGN ((size_t)8)
_Static_assert(_Alignof(nm_json_member) <= ARENA_ALIGN && _Alignof(nm_json) <= ARENA_ALIGN,
               "arena alignment");

static void *arena_alloc(parser *p, size_t n_bytes) {
    size_t need = (n_bytes + ARENA_ALIGN - 1) & ~(ARENA_ALIGN - 1);
    if (need < n_bytes) return NULL;
    if (need > p->left) {
        size_t payload = need > p->next_chunk_bytes / 2 ? need : p->next_chunk_bytes;
        size_t total;
        if (!nm_add_size(payload, sizeof(arena_chunk), &total)) return NULL;
        arena_chunk *c = nm_malloc(total);
        if (!c) return NULL;
        if (payload == need && need != p->next_chunk_bytes) {
            /* A big block of its own: keep filling the current chunk. */
            c->next = p->doc->chunks ? p->doc->chunks->next : NULL;
            if (p->doc->chunks)
                p->doc->chunks->next = c;
            else
                p->doc->chunks = c;
            return c + 1;
        }
        c->next = p->doc->chunks;
        p->doc->chunks = c;
        p->cur = (unsigned char *)(c + 1);
        p->left = payload;
        if (p->next_chunk_bytes < ARENA_MAX_BYTES) p->next_chunk_bytes *= 2;
    }
    void *out = p->cur;
    p->cur += need;
    p->left -= need;
    return out;
}

static void doc_free(json_doc *doc) {
    if (!doc) return;
    for (arena_chunk *c = doc->chunks; c;) {
        arena_chunk *next = c->next;
        nm_free(c);
        c = next;
    }
    nm_free(doc);
}

void nm_json_free(nm_json *root) {
    if (!root) return;
    NM_ASSERT(root->is_root);
    doc_free((json_doc *)(void *)((char *)root - offsetof(json_doc, root)));
}

/* ---- UTF-8 --------------------------------------------------------------- */

/* Unicode Table 3-7 (well-formed sequences): the range of the second byte
 * depends on the lead; the others are 80..BF. */
size_t nm_json_utf8_len(const unsigned char *s, size_t n, size_t *bad_len) {
    unsigned c = s[0];
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        *bad_len = 1;
        return 0;
    }
    for (size_t k = 1; k < len; k++) {
        unsigned b = k < n ? s[k] : 0;
        if (k >= n || b < lo || b > hi) {
            *bad_len = k;
            return 0;
        }
        lo = 0x80;
        hi = 0xBF;
    }
    return len;
}

/* ---- errors -------------------------------------------------------------- */

static void line_col(const unsigned char *s, size_t at, size_t *line, size_t *col) {
    size_t l = 1, c = 1;
    for (size_t i = 0; i < at; i++) {
        if (s[i] == '\n') {
            l++;
            c = 1;
        } else if ((s[i] & 0xC0) != 0x80) {
            c++;
        }
    }
    *line = l;
    *col = c;
}

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static nm_status
fail(parser *p, size_t at, const char *fmt, ...) {
    char what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    size_t line, col;
    line_col(p->s, at, &line, &col);
    return nm_errorf(p->err, NM_ERR_FORMAT, "line %zu, column %zu: %s", line, col, what);
}

static nm_status fail_nomem(parser *p) {
    return nm_errorf(p->err, NM_ERR_NOMEM, "out of memory while parsing JSON");
}

static bool is_word_char(unsigned c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* Names what is at `at` for "got ..." in messages: end of input, a word
 * ('True'), a character ('x', 'é'), a control character or a bad byte. */
static const char *describe_at(const parser *p, size_t at, char buf[48]) {
    if (at >= p->n) return "end of input";
    unsigned c = p->s[at];
    if (is_word_char(c) && !(c >= '0' && c <= '9')) {
        size_t k = 0;
        while (at + k < p->n && k < 24 && is_word_char(p->s[at + k]))
            k++;
        snprintf(buf, 48, "'%.*s%s'", (int)k, (const char *)p->s + at,
                 at + k < p->n && is_word_char(p->s[at + k]) ? "..." : "");
    } else if (c >= 0x20 && c < 0x7F) {
        snprintf(buf, 48, "'%c'", (int)c);
    } else if (c < 0x80) {
        snprintf(buf, 48, "control character U+%04X", c);
    } else {
        size_t bad, len = nm_json_utf8_len(p->s + at, p->n - at, &bad);
        if (len)
            snprintf(buf, 48, "'%.*s'", (int)len, (const char *)p->s + at);
        else
            snprintf(buf, 48, "invalid UTF-8 byte 0x%02X", c);
    }
    return buf;
}

/* ---- scanning ------------------------------------------------------------ */

static void skip_ws(parser *p) {
    while (p->pos < p->n) {
        unsigned c = p->s[p->pos];
        if (c != ' ' && c != '\n' && c != '\r' && c != '\t') break;
        p->pos++;
    }
}

static int hex_digit(unsigned c) {
    if (c >= '0' && c <= '9') return (int)(c - '0');
    if (c >= 'a' && c <= 'f') return (int)(c - 'a' + 10);
    if (c >= 'A' && c <= 'F') return (int)(c - 'A' + 10);
    return -1;
}

/* The 4 hex digits after "\u" at s[i] (i points at the 'u'), or -1. */
static long hex4(const parser *p, size_t i) {
    if (p->n - i < 5) return -1;
    long v = 0;
    for (size_t k = 1; k <= 4; k++) {
        int d = hex_digit(p->s[i + k]);
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

static size_t put_utf8(unsigned char *out, unsigned long cp) {
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xC0 | (cp >> 6));
        out[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xE0 | (cp >> 12));
        out[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (unsigned char)(0xF0 | (cp >> 18));
    out[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The string whose opening quote is at p->pos. Pass one checks everything
 * and measures the decoded length; pass two decodes escapes into the arena
 * (strings without escapes are copied as they are). */
static nm_status parse_string(parser *p, const char **out, size_t *out_len) {
    const size_t open = p->pos;
    size_t i = open + 1, len = 0;
    bool escaped = false;
    for (;;) {
        if (i >= p->n) {
            size_t line, col;
            line_col(p->s, open, &line, &col);
            return fail(p, i, "end of input inside the string that starts at line %zu, column %zu",
                        line, col);
        }
        unsigned c = p->s[i];
        if (c == '"') break;
        if (c < 0x20) return fail(p, i, "unescaped control character U+%04X in a string", c);
        if (c >= 0x80) {
            size_t bad, k = nm_json_utf8_len(p->s + i, p->n - i, &bad);
            if (!k) {
                char bytes[16] = "";
                for (size_t b = 0; b < bad; b++)
                    snprintf(bytes + 3 * b, 4, " %02X", p->s[i + b]);
                return fail(p, i, "invalid UTF-8 in a string (bytes%s)", bytes);
            }
            i += k;
            len += k;
            continue;
        }
        if (c != '\\') {
            i++;
            len++;
            continue;
        }
        escaped = true;
        if (i + 1 >= p->n) {
            i = p->n; /* reported as the end of input above */
            continue;
        }
        unsigned e = p->s[i + 1];
        if (e != 'u') {
            if (!strchr("\"\\/bfnrt", (int)e) || e == 0) {
                char buf[48];
                return fail(p, i, "invalid escape '\\' followed by %s in a string",
                            describe_at(p, i + 1, buf));
            }
            i += 2;
            len++;
            continue;
        }
        long cp = hex4(p, i + 1);
        if (cp < 0) return fail(p, i, "'\\u' must be followed by 4 hex digits");
        if (cp >= 0xDC00 && cp <= 0xDFFF)
            return fail(p, i, "lone low surrogate \\u%04lX in a string", (unsigned long)cp);
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            long lo = -1;
            if (p->n - i >= 12 && p->s[i + 6] == '\\' && p->s[i + 7] == 'u') lo = hex4(p, i + 7);
            if (lo < 0xDC00 || lo > 0xDFFF)
                return fail(p, i,
                            "lone high surrogate \\u%04lX in a string (it must be followed "
                            "by a low surrogate \\uDC00-\\uDFFF)",
                            (unsigned long)cp);
            i += 12;
            len += 4;
            continue;
        }
        i += 6;
        len += cp < 0x80 ? 1 : cp < 0x800 ? 2 : 3;
    }
    const size_t close = i;
    unsigned char *dst = arena_alloc(p, len + 1);
    if (!dst) return fail_nomem(p);
    if (!escaped) {
        memcpy(dst, p->s + open + 1, len);
    } else {
        size_t o = 0;
        for (i = open + 1; i < close;) {
            unsigned c = p->s[i];
            if (c != '\\') {
                dst[o++] = (unsigned char)c;
                i++;
                continue;
            }
            unsigned e = p->s[i + 1];
            if (e == 'u') {
                unsigned long cp = (unsigned long)hex4(p, i + 1);
                i += 6;
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + ((unsigned long)hex4(p, i + 1) - 0xDC00);
                    i += 6;
                }
                o += put_utf8(dst + o, cp);
                continue;
            }
            static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
            dst[o++] = (unsigned char)to[strchr(from, (int)e) - from];
            i += 2;
        }
        NM_ASSERT(o == len);
    }
    dst[len] = '\0';
    p->pos = close + 1;
    *out = (const char *)dst;
    *out_len = len;
    return NM_OK;
}

static bool is_digit(const parser *p, size_t i) {
    return i < p->n && p->s[i] >= '0' && p->s[i] <= '9';
}

/* Converts the checked number text s[start, end) with strtod, which wants a
 * NUL-terminated copy written with the C locale's decimal point. */
static nm_status convert_number(parser *p, size_t start, size_t end, double *out) {
    const char *point = localeconv()->decimal_point;
    size_t point_len = point && *point ? strlen(point) : 1;
    size_t n = end - start, cap = n + point_len + 1;
    char small[96], *buf = cap <= sizeof small ? small : nm_malloc(cap);
    if (!buf) return fail_nomem(p);
    size_t o = 0;
    for (size_t i = start; i < end; i++) {
        if (p->s[i] == '.' && point && *point) {
            memcpy(buf + o, point, point_len);
            o += point_len;
        } else {
            buf[o++] = (char)p->s[i];
        }
    }
    buf[o] = '\0';
    double v = strtod(buf, NULL);
    if (buf != small) nm_free(buf);
    if (isinf(v)) {
        return fail(p, start, "number %.*s%s is out of the range of a double", n > 40 ? 40 : (int)n,
                    (const char *)p->s + start, n > 40 ? "..." : "");
    }
    *out = v;
    return NM_OK;
}

static nm_status parse_number(parser *p, nm_json *out) {
    const size_t start = p->pos;
    size_t i = start;
    bool neg = false;
    if (p->s[i] == '-') {
        neg = true;
        i++;
        if (p->n - i >= 8 && memcmp(p->s + i, "Infinity", 8) == 0)
            return fail(p, start, "-Infinity is not a JSON number");
    }
    if (!is_digit(p, i)) {
        char buf[48];
        return fail(p, i, "expected a digit after '-', got %s", describe_at(p, i, buf));
    }
    if (p->s[i] == '0' && is_digit(p, i + 1))
        return fail(p, start, "leading zeros are not allowed in numbers");
    uint64_t mantissa = 0;
    size_t n_digits = 0;
    while (is_digit(p, i)) {
        if (n_digits < 16) mantissa = mantissa * 10 + (uint64_t)(p->s[i] - '0');
        n_digits++;
        i++;
    }
    bool plain = true;
    if (i < p->n && p->s[i] == '.') {
        plain = false;
        i++;
        if (!is_digit(p, i)) {
            char buf[48];
            return fail(p, i, "expected a digit after '.', got %s", describe_at(p, i, buf));
        }
        while (is_digit(p, i))
            i++;
    }
    if (i < p->n && (p->s[i] == 'e' || p->s[i] == 'E')) {
        plain = false;
        i++;
        if (i < p->n && (p->s[i] == '+' || p->s[i] == '-')) i++;
        if (!is_digit(p, i)) {
            char buf[48];
            return fail(p, i, "expected a digit in the exponent, got %s", describe_at(p, i, buf));
        }
        while (is_digit(p, i))
            i++;
    }
    out->type = NM_JSON_NUMBER;
    if (plain && n_digits <= 15) {
        /* Exact: every integer below 10^15 is a double. -0 stays -0. */
        out->u.num = neg ? -(double)mantissa : (double)mantissa;
    } else {
        nm_status st = convert_number(p, start, i, &out->u.num);
        if (st != NM_OK) return st;
    }
    p->pos = i;
    return NM_OK;
}

static nm_status parse_literal(parser *p, const char *word, nm_json *out) {
    size_t len = strlen(word);
    if (p->n - p->pos < len || memcmp(p->s + p->pos, word, len) != 0) {
        char buf[48];
        return fail(p, p->pos, "expected a value, got %s", describe_at(p, p->pos, buf));
    }
    p->pos += len;
    if (word[0] == 'n') {
        out->type = NM_JSON_NULL;
    } else {
        out->type = NM_JSON_BOOL;
        out->u.b = word[0] == 't';
    }
    return NM_OK;
}

/* ---- containers ---------------------------------------------------------- */

static nm_status push(parser *p, const char *key, size_t key_len, const nm_json *value) {
    if (p->top == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64, n_bytes;
        if (!nm_mul_size(cap, sizeof *p->stack, &n_bytes)) return fail_nomem(p);
        nm_json_member *grown = nm_realloc(p->stack, n_bytes);
        if (!grown) return fail_nomem(p);
        p->stack = grown;
        p->cap = cap;
    }
    p->stack[p->top++] = (nm_json_member){.key = key, .key_len = key_len, .value = *value};
    return NM_OK;
}

static nm_status enter(parser *p) {
    if (++p->depth > NM_JSON_MAX_DEPTH)
        return fail(p, p->pos, "nesting deeper than %d levels", NM_JSON_MAX_DEPTH);
    p->pos++;
    skip_ws(p);
    return NM_OK;
}

/* A ']' or '}' right after a ','. */
static nm_status trailing_comma(parser *p, const char *what) {
    return fail(p, p->pos, "trailing comma: expected %s after ',', got '%c'", what,
                (int)p->s[p->pos]);
}

static nm_status parse_value(parser *p, nm_json *out);

static nm_status parse_array(parser *p, nm_json *out) {
    nm_status st = enter(p);
    if (st != NM_OK) return st;
    const size_t base = p->top;
    if (p->pos < p->n && p->s[p->pos] == ']') {
        p->pos++;
    } else {
        for (;;) {
            nm_json item;
            if ((st = parse_value(p, &item)) != NM_OK) return st;
            if ((st = push(p, NULL, 0, &item)) != NM_OK) return st;
            skip_ws(p);
            unsigned c = p->pos < p->n ? p->s[p->pos] : 0;
            if (c != ',' && c != ']') {
                char buf[48];
                return fail(p, p->pos, "expected ',' or ']' after an array element, got %s",
                            describe_at(p, p->pos, buf));
            }
            p->pos++;
            if (c == ']') break;
            skip_ws(p);
            if (p->pos < p->n && p->s[p->pos] == ']') return trailing_comma(p, "a value");
        }
    }
    size_t n = p->top - base, n_bytes;
    nm_json *items = NULL;
    if (n) {
        if (!nm_mul_size(n, sizeof *items, &n_bytes) || !(items = arena_alloc(p, n_bytes)))
            return fail_nomem(p);
        for (size_t k = 0; k < n; k++)
            items[k] = p->stack[base + k].value;
    }
    p->top = base;
    p->depth--;
    *out = (nm_json){.type = NM_JSON_ARRAY, .u.arr = {items, n}};
    return NM_OK;
}

/* Duplicate keys are caught as each key is read, so the message points at
 * the second occurrence and no later error is reported first. Small objects
 * compare with the keys before; past SMALL_OBJECT members a hash table of
 * stack indices takes over, so a huge object stays linear. */
#define SMALL_OBJECT 16

typedef struct key_index {
    uint32_t *slots; /* [cap] stack index - base + 1; 0 = empty */
    size_t cap;
} key_index;

static uint64_t key_hash(const char *key, size_t len) {
    uint64_t h = 0xcbf29ce484222325u; /* FNV-1a, then a final mix of the bits */
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)key[i]) * 0x100000001b3u;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdu;
    return h ^ (h >> 33);
}

/* Finds key among the members [base, top), or inserts it when insert. */
static bool key_seen(parser *p, key_index *ix, size_t base, const char *key, size_t len,
                     bool insert) {
    size_t mask = ix->cap - 1, i = (size_t)key_hash(key, len) & mask;
    for (; ix->slots[i]; i = (i + 1) & mask) {
        const nm_json_member *m = &p->stack[base + ix->slots[i] - 1];
        if (m->key_len == len && memcmp(m->key, key, len) == 0) return true;
    }
    if (insert) ix->slots[i] = (uint32_t)(p->top - base + 1);
    return false;
}

static nm_status index_grow(parser *p, key_index *ix, size_t base) {
    size_t n = p->top - base, cap = ix->cap ? ix->cap : 64;
    while (cap < 2 * (n + 1))
        cap *= 2;
    if (cap == ix->cap) return NM_OK;
    uint32_t *slots = nm_calloc(cap, sizeof *slots);
    if (!slots) return fail_nomem(p);
    nm_free(ix->slots);
    ix->slots = slots;
    ix->cap = cap;
    size_t top = p->top;
    for (p->top = base; p->top < top; p->top++) {
        const nm_json_member *m = &p->stack[p->top];
        key_seen(p, ix, base, m->key, m->key_len, true);
    }
    return NM_OK;
}

static nm_status check_duplicate(parser *p, key_index *ix, size_t base, size_t key_at,
                                 const char *key, size_t len) {
    size_t n = p->top - base;
    bool dup = false;
    if (n < SMALL_OBJECT) {
        for (size_t k = base; k < p->top && !dup; k++)
            dup = p->stack[k].key_len == len && memcmp(p->stack[k].key, key, len) == 0;
    } else {
        nm_status st = index_grow(p, ix, base);
        if (st != NM_OK) return st;
        dup = key_seen(p, ix, base, key, len, true);
    }
    if (!dup) return NM_OK;
    char shown[64];
    size_t o = 0;
    size_t k = 0;
    for (; k < len && o < 56; k++) {
        unsigned char c = (unsigned char)key[k];
        if (o >= 40 && (c & 0xC0) != 0x80) break; /* cut at a character boundary */
        if (c < 0x20 || c == 0x7F)
            o += (size_t)snprintf(shown + o, sizeof shown - o, "\\u%04X", c);
        else
            shown[o++] = (char)c;
    }
    shown[o] = '\0';
    return fail(p, key_at, "duplicate key '%s%s'", shown, k < len ? "..." : "");
}

static nm_status parse_object_members(parser *p, key_index *ix, size_t base) {
    nm_status st;
    if (p->pos < p->n && p->s[p->pos] == '}') {
        p->pos++;
        return NM_OK;
    }
    for (;;) {
        if (p->pos >= p->n || p->s[p->pos] != '"') {
            char buf[48];
            unsigned c = p->pos < p->n ? p->s[p->pos] : 0;
            if (c == '\'')
                return fail(p, p->pos, "keys are strings in double quotes, not single quotes");
            return fail(p, p->pos, "expected a key in double quotes, got %s",
                        describe_at(p, p->pos, buf));
        }
        const size_t key_at = p->pos;
        const char *key;
        size_t key_len;
        if ((st = parse_string(p, &key, &key_len)) != NM_OK) return st;
        if ((st = check_duplicate(p, ix, base, key_at, key, key_len)) != NM_OK) return st;
        skip_ws(p);
        if (p->pos >= p->n || p->s[p->pos] != ':') {
            char buf[48];
            return fail(p, p->pos, "expected ':' after the key, got %s",
                        describe_at(p, p->pos, buf));
        }
        p->pos++;
        skip_ws(p);
        nm_json value;
        if ((st = parse_value(p, &value)) != NM_OK) return st;
        if ((st = push(p, key, key_len, &value)) != NM_OK) return st;
        skip_ws(p);
        unsigned c = p->pos < p->n ? p->s[p->pos] : 0;
        if (c == '}') {
            p->pos++;
            return NM_OK;
        }
        if (c != ',') {
            char buf[48];
            return fail(p, p->pos, "expected ',' or '}' after an object member, got %s",
                        describe_at(p, p->pos, buf));
        }
        p->pos++;
        skip_ws(p);
        if (p->pos < p->n && p->s[p->pos] == '}') return trailing_comma(p, "a key");
    }
}

static nm_status parse_object(parser *p, nm_json *out) {
    nm_status st = enter(p);
    if (st != NM_OK) return st;
    const size_t base = p->top;
    key_index ix = {NULL, 0};
    st = parse_object_members(p, &ix, base);
    nm_free(ix.slots);
    if (st != NM_OK) return st;
    size_t n = p->top - base, n_bytes;
    nm_json_member *members = NULL;
    if (n) {
        if (!nm_mul_size(n, sizeof *members, &n_bytes) || !(members = arena_alloc(p, n_bytes)))
            return fail_nomem(p);
        memcpy(members, p->stack + base, n_bytes);
    }
    p->top = base;
    p->depth--;
    *out = (nm_json){.type = NM_JSON_OBJECT, .u.obj = {members, n}};
    return NM_OK;
}

static nm_status parse_value(parser *p, nm_json *out) {
    char buf[48];
    if (p->pos >= p->n) return fail(p, p->pos, "expected a value, got end of input");
    unsigned c = p->s[p->pos];
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number(p, out);
    switch (c) {
    case '{':
        return parse_object(p, out);
    case '[':
        return parse_array(p, out);
    case '"': {
        const char *s;
        size_t len;
        nm_status st = parse_string(p, &s, &len);
        if (st == NM_OK) *out = (nm_json){.type = NM_JSON_STRING, .u.str = {s, len}};
        return st;
    }
    case 't':
        return parse_literal(p, "true", out);
    case 'f':
        return parse_literal(p, "false", out);
    case 'n':
        return parse_literal(p, "null", out);
    case '+':
        return fail(p, p->pos, "numbers cannot start with '+'");
    case '.':
        return fail(p, p->pos, "a number needs a digit before '.'");
    case '\'':
        return fail(p, p->pos, "strings are written in double quotes, not single quotes");
    case '/':
        return fail(p, p->pos, "comments are not allowed in JSON");
    case 'N':
        if (p->n - p->pos >= 3 && memcmp(p->s + p->pos, "NaN", 3) == 0)
            return fail(p, p->pos, "NaN is not a JSON number");
        break;
    case 'I':
        if (p->n - p->pos >= 8 && memcmp(p->s + p->pos, "Infinity", 8) == 0)
            return fail(p, p->pos, "Infinity is not a JSON number");
        break;
    default:
        break;
    }
    return fail(p, p->pos, "expected a value, got %s", describe_at(p, p->pos, buf));
}

nm_status nm_json_parse(const char *text, size_t n_bytes, nm_json **out, nm_error *err) {
    NM_ASSERT(out && (text || n_bytes == 0));
    *out = NULL;
    if (n_bytes > NM_JSON_MAX_BYTES)
        return nm_errorf(err, NM_ERR_CAPACITY,
                         "the document is %zu bytes, more than the limit of %zu (%zu MiB)", n_bytes,
                         NM_JSON_MAX_BYTES, NM_JSON_MAX_BYTES >> 20);
    parser p = {.s = (const unsigned char *)text, .n = n_bytes, .err = err};
    p.next_chunk_bytes = ARENA_FIRST_BYTES;
    p.doc = nm_malloc(sizeof *p.doc);
    if (!p.doc) return fail_nomem(&p);
    p.doc->chunks = NULL;
    if (n_bytes >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) p.pos = 3;
    skip_ws(&p);
    nm_status st;
    if (p.pos == p.n) {
        st = fail(&p, p.pos, "the document is empty");
    } else if ((st = parse_value(&p, &p.doc->root)) == NM_OK) {
        skip_ws(&p);
        if (p.pos < p.n) {
            char buf[48];
            st = fail(&p, p.pos, "unexpected %s after the end of the document",
                      describe_at(&p, p.pos, buf));
        }
    }
    nm_free(p.stack);
    if (st != NM_OK) {
        doc_free(p.doc);
        return st;
    }
    p.doc->root.is_root = 1;
    *out = &p.doc->root;
    return NM_OK;
}
