/* What the files of the plan part share: the fingerprint's text form, the
 * format/version header every file starts with, and the load/save plumbing
 * (parse a file or memory, hand the tree to a reader, name the file in any
 * message; write a document atomically). Internal to src/plan/. */
#ifndef NM_PLAN_IMPL_H
#define NM_PLAN_IMPL_H

#include "plan.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define NM_CALIB_FORMAT "npumoe-calib"
#define NM_PROFILE_FORMAT "npumoe-profile"
#define NM_PLAN_FORMAT "npumoe-plan"
/* Each format's version: 2 for calibrations since they carry the ranked
 * routing weights, 2 for plans since they carry the objective, budget and
 * predicted drop rate. */
#define NM_CALIB_FILE_VERSION 2
#define NM_PROFILE_FILE_VERSION 1
#define NM_PLAN_FILE_VERSION 2

/* ---- JSON (plan_json.c): a thin layer over jansson ----
 *
 * The files are read and written by jansson alone; this layer adds what
 * every reader needs: limits, messages with line and column, and getters
 * that check a value's type and range and name its path. */

/* Largest document read, in bytes. Nesting is limited by jansson (2048
 * levels, a build constant of the library). */
#define NM_JSON_MAX_BYTES ((size_t)256 << 20)

/* Parses one JSON value (RFC 8259, as jansson reads it: UTF-8 validated,
 * no \u0000 in strings, no NaN or Infinity, a real beyond a double or an
 * integer beyond an int64 refused); a key twice in an object and a NUL
 * byte anywhere are refused; a UTF-8 byte order mark at the start is
 * skipped. Errors: NM_ERR_FORMAT with "line L, column
 * C: what"; NM_ERR_CAPACITY over NM_JSON_MAX_BYTES; NM_ERR_NOMEM. *out is
 * then NULL; on success the caller json_decref()s it. */
nm_status nm_json_parse(const char *text, size_t n_bytes, json_t **out, nm_error *err);
/* Reads and parses a file (pipes too); messages start with the path.
 * NM_ERR_IO when it cannot be opened or read (or is a directory). */
nm_status nm_json_parse_file(const char *path, json_t **out, nm_error *err);

/* Typed getters. Each reads member key of obj (or the value v itself,
 * nm_json_as_*) and checks its type and range; `where` names obj (or v)
 * in messages, such as "layers[3].groups[0]" (NULL or "" for the root):
 *     layers[3].groups[0].tier: expected an integer in [1, 4096], got 1.5
 *     layers[3].groups[0]: missing key 'tier'
 * NM_ERR_NOT_FOUND for a missing key, NM_ERR_FORMAT for a wrong type or a
 * value out of range (also when obj is not an object); *out is written
 * only on success. An integer is a number without fraction within [lo,
 * hi]: written as one ("16"), or as a whole double ("16.0", "1e3") up to
 * 2^53. */
nm_status nm_json_get_int(const json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                          const char *where, nm_error *err);
nm_status nm_json_get_num(const json_t *obj, const char *key, double lo, double hi, double *out,
                          const char *where, nm_error *err);
nm_status nm_json_get_str(const json_t *obj, const char *key, const char **out, const char *where,
                          nm_error *err);
nm_status nm_json_get_bool(const json_t *obj, const char *key, bool *out, const char *where,
                           nm_error *err);
nm_status nm_json_get_arr(const json_t *obj, const char *key, const json_t **out,
                          const char *where, nm_error *err);
nm_status nm_json_get_obj(const json_t *obj, const char *key, const json_t **out,
                          const char *where, nm_error *err);
nm_status nm_json_as_int(const json_t *v, int64_t lo, int64_t hi, int64_t *out, const char *where,
                         nm_error *err);
nm_status nm_json_as_num(const json_t *v, double lo, double hi, double *out, const char *where,
                         nm_error *err);
/* "object", "array", "string", "number", "bool" or "null". */
const char *nm_json_type_name(const json_t *v);

/* Longest text nm_json_format_number writes, with its NUL. */
#define NM_JSON_NUMBER_CHARS 32
/* A finite double with the fewest significant digits that read back as
 * the same double ("0.1", "1e+300"), for messages; returns the length. */
size_t nm_json_format_number(double v, char buf[NM_JSON_NUMBER_CHARS]);

/* Building a document: nm_json_num makes a number (a whole one of at most
 * 2^53 as an integer, "6" not "6.0"; v must be finite); nm_json_put sets
 * obj[key] = v and nm_json_push appends v to arr, taking v in every case;
 * both return false when anything failed (obj, arr or v NULL: out of
 * memory), so a writer ANDs their results and hands the answer to
 * nm_json_print. */
json_t *nm_json_num(double v);
bool nm_json_put(json_t *obj, const char *key, json_t *v);
bool nm_json_push(json_t *arr, json_t *v);
/* Prints root (2-space indent, keys in insertion order, doubles with 17
 * significant digits so they read back exactly, a final newline) into
 * *text (nm_free()d by the caller; *n_bytes excludes the NUL) and frees
 * root. ok false or root NULL: NM_ERR_NOMEM "out of memory for a <what>'s
 * text", *text NULL. */
nm_status nm_json_print(json_t *root, bool ok, const char *what, char **text, size_t *n_bytes,
                        nm_error *err);

/* ---- what the three files share (fingerprint.c) ---- */

/* Parses 16 lowercase hex digits; false for anything else. */
bool nm_fingerprint_parse(const char *text, nm_fingerprint *out);

/* Reads "fingerprint" of obj into out, with a message naming where. */
nm_status nm_plan_json_fingerprint(const json_t *obj, nm_fingerprint *out, nm_error *err);

/* Checks that root is an object whose "format" is format and whose
 * "version" is version; the message says what the file is instead ("a
 * npumoe-plan file, not npumoe-calib") and, for an older version, adds
 * older (what to do: "recalibrate with `npumoe calibrate`"). */
nm_status nm_plan_json_header(const json_t *root, const char *format, int32_t version,
                              const char *older, nm_error *err);

/* The file half of every nm_*_save: st and text are what the matching
 * nm_*_save_memory returned; on success replaces path with the text
 * atomically. Frees text; messages start with the path. */
nm_status nm_plan_save_text(const char *path, nm_status st, char *text, size_t n_bytes,
                            nm_error *err);

/* A reader of one kind of document: fills the caller's object from root. */
typedef nm_status (*nm_plan_reader)(const json_t *root, void *ctx, nm_error *err);

/* Parses path (or text[0..n_bytes), named name in messages) and runs read
 * over the tree; every failure message starts with the path or name. */
nm_status nm_plan_read_file(const char *path, nm_plan_reader read, void *ctx, nm_error *err);
nm_status nm_plan_read_memory(const char *text, size_t n_bytes, const char *name,
                              nm_plan_reader read, void *ctx, nm_error *err);

/* |a - b| within a relative tolerance of 1e-6 (summaries a person may have
 * rounded are still refused when they disagree with the data). */
bool nm_plan_close(double a, double b);

#endif /* NM_PLAN_IMPL_H */
