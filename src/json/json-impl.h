/* The body of nm_json, shared by the parser (json_parse.c), the lookups
 * (json_get.c) and the writer (json_write.c). Nothing outside src/json/
 * includes this. */
#ifndef NM_JSON_IMPL_H
#define NM_JSON_IMPL_H

#include "json.h"

typedef struct nm_json_member nm_json_member;

struct nm_json {
    uint8_t type;    /* nm_json_type */
    uint8_t is_root; /* the value nm_json_parse handed out (nm_json_free checks) */
    union {
        bool b;
        double num;
        struct {
            const char *ptr; /* [len + 1], NUL-terminated */
            size_t len;
        } str;
        struct {
            nm_json *items; /* [n] */
            size_t n;
        } arr;
        struct {
            nm_json_member *members; /* [n] in text order */
            size_t n;
        } obj;
    } u;
};

struct nm_json_member {
    const char *key; /* [key_len + 1], NUL-terminated */
    size_t key_len;
    nm_json value;
};

/* Longest text nm_json_format_number produces, with its NUL. */
#define NM_JSON_NUMBER_CHARS 32

/* Formats a finite double the way the writer prints it (see json.h); returns
 * the length. Independent of the C locale. */
size_t nm_json_format_number(double v, char buf[NM_JSON_NUMBER_CHARS]);

/* Length of the valid UTF-8 sequence at s[0..n) (1 to 4), or 0 when it is
 * not valid; then *bad_len gets the length of the maximal invalid subpart
 * (at least 1): the bytes that began a sequence which the next byte broke. */
size_t nm_json_utf8_len(const unsigned char *s, size_t n, size_t *bad_len);

#endif /* NM_JSON_IMPL_H */
