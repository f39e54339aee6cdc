/* JSON (RFC 8259) for the project's own files: calibration data, device
 * profiles and plans. A strict validating parser into a read-only tree, typed
 * getters whose messages name the path of the bad value, and a pretty-printing
 * writer. Input is hostile: any byte sequence is refused with a message or
 * parsed, never crashes. Not a general JSON library: no streaming, no editing
 * of parsed trees, numbers are doubles. */
#ifndef NM_JSON_H
#define NM_JSON_H

#include "npumoe.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Deepest nesting of arrays and objects the parser accepts and the writer
 * produces ([[1]] is depth 2; a scalar document is depth 0). */
#define NM_JSON_MAX_DEPTH 64

/* Largest document the parser accepts, in bytes. */
#define NM_JSON_MAX_BYTES ((size_t)256 << 20)

typedef enum nm_json_type {
    NM_JSON_NULL,
    NM_JSON_BOOL,
    NM_JSON_NUMBER,
    NM_JSON_STRING,
    NM_JSON_ARRAY,
    NM_JSON_OBJECT,
    NM_JSON_TYPE_COUNT
} nm_json_type;

/* "null", "bool", "number", "string", "array", "object". */
const char *nm_json_type_name(nm_json_type type);

/* A parsed value. The whole tree is owned by the root nm_json_parse returned;
 * every pointer into it (values, keys, strings) lives until nm_json_free. */
typedef struct nm_json nm_json;

/* ---- parser ----------------------------------------------------------------
 *
 * RFC 8259 exactly: one value with optional whitespace around it; UTF-8
 * validated everywhere (overlong forms, surrogates and code points past
 * U+10FFFF refused); \u escapes with surrogate pairs combined and lone
 * surrogates refused; no trailing commas, comments, single quotes, NaN or
 * Infinity, leading zeros, '+' signs or bare '.'. Numbers become the nearest
 * double; a number beyond the double range (1e400) is refused, one below it
 * (1e-400) becomes 0. Duplicate keys in an object are refused (the message
 * names the key). Nesting deeper than NM_JSON_MAX_DEPTH is refused. A UTF-8
 * byte order mark at the very start is skipped (RFC 8259 section 8.1 allows
 * ignoring it).
 *
 * Errors: NM_ERR_FORMAT with "line L, column C: what" (both from 1; columns
 * count characters, that is UTF-8 code points, so they match an editor);
 * NM_ERR_CAPACITY for a document over NM_JSON_MAX_BYTES; NM_ERR_NOMEM. On
 * failure *out is NULL and nothing is left allocated. */
nm_status nm_json_parse(const char *text, size_t n_bytes, nm_json **out, nm_error *err);

/* Reads and parses a file (pipes too); messages start with the path
 * ("plan.json: line 3, column 7: ..."). NM_ERR_IO when the file cannot be
 * opened or read (or is a directory), NM_ERR_CAPACITY when it is larger than
 * NM_JSON_MAX_BYTES, then as nm_json_parse. */
nm_status nm_json_parse_file(const char *path, nm_json **out, nm_error *err);

/* Frees a tree; root must be what a parse returned (or NULL). */
void nm_json_free(nm_json *root);

/* ---- reading a tree --------------------------------------------------------
 *
 * Asking a value for the wrong kind of content (nm_json_number of a string,
 * element i >= nm_json_len) is a programmer error and hits NM_ASSERT: check
 * nm_json_type_of first, or use the typed getters below, which turn a wrong
 * type into a message. */
nm_json_type nm_json_type_of(const nm_json *v);

/* Elements of an array or members of an object; 0 for scalars and NULL. */
size_t nm_json_len(const nm_json *v);

/* Element i of an array, or the value of member i of an object (members
 * keep their order in the text). */
const nm_json *nm_json_at(const nm_json *v, size_t i);

/* Key of member i of an object, NUL-terminated. A key may hold "\u0000";
 * nm_json_key_len gives its full length in bytes. */
const char *nm_json_key_at(const nm_json *obj, size_t i);
size_t nm_json_key_len(const nm_json *obj, size_t i);

/* The value of key (compared as bytes up to its NUL); NULL when obj is
 * NULL, not an object, or has no such key. Linear in the members. */
const nm_json *nm_json_get(const nm_json *obj, const char *key);

double nm_json_number(const nm_json *v);
bool nm_json_bool(const nm_json *v);

/* The decoded UTF-8 bytes, NUL-terminated; they may hold NUL bytes when the
 * text escaped them (\u0000), so *len (when len is non-NULL) tells the full
 * length. */
const char *nm_json_string(const nm_json *v, size_t *len);

/* ---- typed getters ---------------------------------------------------------
 *
 * Each reads member key of obj, or the value v itself (nm_json_as_*), and
 * checks its type and range. `where` names obj (or v) for messages: a file
 * and path such as "plan.json: layers[3].groups[0]"; NULL or "" for none.
 * Messages read
 *     plan.json: layers[3].groups[0].tier: expected an integer in [1, 4096], got 1.5
 *     plan.json: layers[3].groups[0]: missing key 'tier'
 * Returns NM_ERR_NOT_FOUND for a missing key, NM_ERR_FORMAT for a wrong type
 * or a value out of range (also when obj is not an object); *out is written
 * only on success.
 *
 * Integers: a number with no fractional part within [lo, hi] (1e3 and 2.0
 * count). Magnitudes above 2^53 are refused even when in range, because a
 * double cannot tell 2^53 + 1 from 2^53: the text did not say what it means
 * to say. */
nm_status nm_json_get_int(const nm_json *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                          const char *where, nm_error *err);
nm_status nm_json_get_num(const nm_json *obj, const char *key, double lo, double hi, double *out,
                          const char *where, nm_error *err);
/* A string without NUL bytes (a string with "\u0000" is refused, since
 * callers read it as a C string). */
nm_status nm_json_get_str(const nm_json *obj, const char *key, const char **out, const char *where,
                          nm_error *err);
nm_status nm_json_get_bool(const nm_json *obj, const char *key, bool *out, const char *where,
                           nm_error *err);
nm_status nm_json_get_arr(const nm_json *obj, const char *key, const nm_json **out,
                          const char *where, nm_error *err);
nm_status nm_json_get_obj(const nm_json *obj, const char *key, const nm_json **out,
                          const char *where, nm_error *err);

nm_status nm_json_as_int(const nm_json *v, int64_t lo, int64_t hi, int64_t *out, const char *where,
                         nm_error *err);
nm_status nm_json_as_num(const nm_json *v, double lo, double hi, double *out, const char *where,
                         nm_error *err);

/* ---- writer ----------------------------------------------------------------
 *
 * Pretty-printed: 2-space indent, "key": value, one member or element per
 * line, except that an array whose elements are all numbers stays on one
 * line ("[1, 2.5, 3]"); empty containers are "[]" and "{}". The document
 * ends with a newline.
 *
 * Misuse is a programmer error and hits NM_ASSERT: a value where a key is
 * due or a key where a value is due, an end that does not match its begin,
 * a second top-level value, nesting deeper than NM_JSON_MAX_DEPTH, a
 * non-finite number, finishing an incomplete document.
 *
 * Numbers: integral values of magnitude up to 2^53 print as integers ("-0"
 * for negative zero), others with the fewest significant digits (at most 17)
 * that read back as the same double. nm_json_write_int prints every int64
 * exactly, but the parser reads numbers as doubles, so integers beyond 2^53
 * do not read back exactly.
 *
 * Strings: escaped per RFC 8259 ('"', '\\', and control characters as \n,
 * \t, \r, \b, \f or \u00XX; everything else as UTF-8). Bytes that are not
 * valid UTF-8 are each replaced by U+FFFD (one per maximal invalid
 * subsequence, as Unicode recommends) rather than asserting, because text
 * from outside (token pieces, file names) reaches the writer and must not
 * crash it; the output is therefore always valid JSON.
 *
 * Failures while writing (a full disk, out of memory) are remembered and
 * reported by nm_json_writer_finish; the calls themselves return nothing. */
typedef struct nm_json_writer nm_json_writer;

/* Writes to f, which stays open and owned by the caller. NULL on OOM. */
nm_json_writer *nm_json_writer_file(FILE *f);
/* Writes into a growing buffer handed out by nm_json_writer_finish. */
nm_json_writer *nm_json_writer_memory(void);

void nm_json_begin_object(nm_json_writer *w);
void nm_json_end_object(nm_json_writer *w);
void nm_json_begin_array(nm_json_writer *w);
void nm_json_end_array(nm_json_writer *w);

void nm_json_key(nm_json_writer *w, const char *key);
void nm_json_key_n(nm_json_writer *w, const char *key, size_t len); /* may hold NULs */

void nm_json_write_str(nm_json_writer *w, const char *s);
void nm_json_write_str_n(nm_json_writer *w, const char *s, size_t len); /* may hold NULs */
void nm_json_write_num(nm_json_writer *w, double v);
void nm_json_write_int(nm_json_writer *w, int64_t v);
void nm_json_write_bool(nm_json_writer *w, bool v);
void nm_json_write_null(nm_json_writer *w);

/* Writes a parsed value and everything under it. */
void nm_json_write_value(nm_json_writer *w, const nm_json *v);

/* Checks the document is complete (NM_ASSERT), writes the final newline and
 * flushes; frees the writer in every case. Returns NM_ERR_IO if a write to
 * the file failed, NM_ERR_NOMEM if memory ran out. For a memory writer,
 * text and n_bytes are required: on success *text is the NUL-terminated
 * document (*n_bytes excludes the NUL; the caller nm_free()s it), on
 * failure NULL. For a file writer they may be NULL and are left alone. */
nm_status nm_json_writer_finish(nm_json_writer *w, char **text, size_t *n_bytes, nm_error *err);

/* Discards an unfinished writer (an error path of the caller); NULL is
 * fine. Whatever a file writer already wrote stays written. */
void nm_json_writer_free(nm_json_writer *w);

/* Writes text to path by the rules of nm_outfile (base.h): a regular file
 * is replaced atomically (readers see the old file or the new one, never a
 * part), a symbolic link is followed, a character device or FIFO is written
 * directly, anything else is refused. NM_ERR_IO (the message names the
 * path) when any step fails; a temporary file is then removed. */
nm_status nm_json_write_file(const char *path, const char *text, size_t n_bytes, nm_error *err);

#endif /* NM_JSON_H */
