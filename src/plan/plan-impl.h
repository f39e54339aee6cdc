/* What the files of the plan part share: the fingerprint's text form, the
 * format/version header every file starts with, and the load/save plumbing
 * (parse a file or memory, hand the tree to a reader, name the file in any
 * message; write a document atomically). Internal to src/plan/. */
#ifndef NM_PLAN_IMPL_H
#define NM_PLAN_IMPL_H

#include "plan.h"

#include "json/json.h"

#include <stdbool.h>

#define NM_CALIB_FORMAT "npumoe-calib"
#define NM_PROFILE_FORMAT "npumoe-profile"
#define NM_PLAN_FORMAT "npumoe-plan"
/* Each format's version: 2 for calibrations since they carry the ranked
 * routing weights, 2 for plans since they carry the objective, budget and
 * predicted drop rate. */
#define NM_CALIB_FILE_VERSION 2
#define NM_PROFILE_FILE_VERSION 1
#define NM_PLAN_FILE_VERSION 2

/* Parses 16 lowercase hex digits; false for anything else. */
bool nm_fingerprint_parse(const char *text, nm_fingerprint *out);

/* Reads "fingerprint" of obj into out, with a message naming where. */
nm_status nm_plan_json_fingerprint(const nm_json *obj, nm_fingerprint *out, nm_error *err);

/* Checks that root is an object whose "format" is format and whose
 * "version" is version; the message says what the file is instead ("a
 * npumoe-plan file, not npumoe-calib") and, for an older version, adds
 * older (what to do: "recalibrate with `npumoe calibrate`"). */
nm_status nm_plan_json_header(const nm_json *root, const char *format, int32_t version,
                              const char *older, nm_error *err);

/* The file half of every nm_*_save: st and text are what the matching
 * nm_*_save_memory returned; on success replaces path with the text
 * atomically. Frees text; messages start with the path. */
nm_status nm_plan_save_text(const char *path, nm_status st, char *text, size_t n_bytes,
                            nm_error *err);

/* A reader of one kind of document: fills the caller's object from root. */
typedef nm_status (*nm_plan_reader)(const nm_json *root, void *ctx, nm_error *err);

/* Parses path (or text[0..n_bytes), named name in messages) and runs read
 * over the tree; every failure message starts with the path or name. */
nm_status nm_plan_read_file(const char *path, nm_plan_reader read, void *ctx, nm_error *err);
nm_status nm_plan_read_memory(const char *text, size_t n_bytes, const char *name,
                              nm_plan_reader read, void *ctx, nm_error *err);

/* |a - b| within a relative tolerance of 1e-6 (summaries a person may have
 * rounded are still refused when they disagree with the data). */
bool nm_plan_close(double a, double b);

#endif /* NM_PLAN_IMPL_H */
