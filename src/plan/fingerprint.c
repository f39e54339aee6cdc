/* What all three plan files share: the fingerprint's text form, the header
 * check, atomic saving, and reading a file or memory into a tree with the
 * file named in every message. (The fingerprint itself is computed where
 * the model is: model/fingerprint.c.) */
#include "plan-impl.h"

#include "base/base.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- fingerprint ---- */

bool nm_fingerprint_parse(const char *text, nm_fingerprint *out) {
    if (strlen(text) != 16) return false;
    for (int i = 0; i < 16; i++)
        if (!((text[i] >= '0' && text[i] <= '9') || (text[i] >= 'a' && text[i] <= 'f')))
            return false;
    memcpy(out->hex, text, 17);
    return true;
}

nm_status nm_plan_json_fingerprint(const json_t *obj, nm_fingerprint *out, nm_error *err) {
    const char *s;
    nm_status st = nm_json_get_str(obj, "fingerprint", &s, NULL, err);
    if (st != NM_OK) return st;
    if (!nm_fingerprint_parse(s, out))
        return nm_errorf(err, NM_ERR_FORMAT,
                         "fingerprint: expected 16 lowercase hex digits, got \"%.40s\"", s);
    return NM_OK;
}

/* ---- files ---- */

nm_status nm_plan_json_header(const json_t *root, const char *format, int32_t version,
                              const char *older, nm_error *err) {
    if (!json_is_object(root))
        return nm_errorf(err, NM_ERR_FORMAT, "expected a %s object, got %s", format,
                         nm_json_type_name(root));
    const char *got;
    nm_status st = nm_json_get_str(root, "format", &got, NULL, err);
    if (st != NM_OK) return st;
    if (strcmp(got, format) != 0)
        return nm_errorf(err, NM_ERR_FORMAT, "format is \"%.40s\": this is not a %s file", got,
                         format);
    int64_t v;
    st = nm_json_get_int(root, "version", 0, INT32_MAX, &v, NULL, err);
    if (st != NM_OK) return st;
    if (v < version)
        return nm_errorf(err, NM_ERR_UNSUPPORTED,
                         "%s version %lld was written by an older npumoe (this one reads version "
                         "%d): %s",
                         format, (long long)v, version, older);
    if (v != version)
        return nm_errorf(err, NM_ERR_UNSUPPORTED, "%s version %lld is not supported (only %d)",
                         format, (long long)v, version);
    return NM_OK;
}

nm_status nm_plan_save_text(const char *path, nm_status st, char *text, size_t n_bytes,
                            nm_error *err) {
    if (st == NM_OK) {
        nm_outfile o; /* its messages name the path */
        st = nm_outfile_open(path, &o, err);
        if (st == NM_OK) st = nm_outfile_write(&o, text, n_bytes, err);
        if (st == NM_OK)
            st = nm_outfile_commit(&o, err);
        else
            nm_outfile_abort(&o);
    } else {
        nm_error_prefix(err, "%s", path);
    }
    nm_free(text);
    return st;
}

static nm_status run_reader(json_t *root, nm_plan_reader read, void *ctx, const char *name,
                            nm_error *err) {
    nm_status st = read(root, ctx, err);
    json_decref(root);
    if (st != NM_OK) nm_error_prefix(err, "%s", name);
    return st;
}

nm_status nm_plan_read_file(const char *path, nm_plan_reader read, void *ctx, nm_error *err) {
    json_t *root = NULL;
    nm_status st = nm_json_parse_file(path, &root, err); /* names the path itself */
    if (st != NM_OK) return st;
    return run_reader(root, read, ctx, path, err);
}

nm_status nm_plan_read_memory(const char *text, size_t n_bytes, const char *name,
                              nm_plan_reader read, void *ctx, nm_error *err) {
    const char *label = name && *name ? name : "<memory>";
    json_t *root = NULL;
    nm_status st = nm_json_parse(text, n_bytes, &root, err);
    if (st != NM_OK) {
        nm_error_prefix(err, "%s", label);
        return st;
    }
    return run_reader(root, read, ctx, label, err);
}

bool nm_plan_close(double a, double b) {
    const double scale = fmax(1.0, fmax(fabs(a), fabs(b)));
    return fabs(a - b) <= 1e-6 * scale;
}
