/* Counters and helpers behind harness.h. */
#include "harness.h"

#include "engine/engine.h"
#include "kernels/kernels.h"
#include "tensor/tensor.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int nm_test_failures = 0;
int nm_test_checks = 0;

uint64_t nm_test_xorshift(uint64_t *state) {
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *state = x;
}

float nm_test_frand(uint64_t *state) {
    return (float)((nm_test_xorshift(state) >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

int nm_test_finish(const char *name) {
    printf("%s: %d passed, %d failed\n", name, nm_test_checks - nm_test_failures, nm_test_failures);
    return nm_test_failures == 0 ? 0 : 1;
}

unsigned char *nm_test_read_file(const char *path, size_t *n_bytes) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return NULL;
    }
    long size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return NULL;
    }
    unsigned char *buf = malloc((size_t)size + 1);
    if (buf && fread(buf, 1, (size_t)size, f) != (size_t)size) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[size] = 0;
        *n_bytes = (size_t)size;
    }
    return buf;
}

/* Numbers of line line_no of a text file (every line when line_no < 0), at
 * most cap, each parsed by put(out, n, s, &end); how many, or -1. */
static int read_numbers(const char *path, int line_no, void *out, int cap,
                        bool (*put)(void *out, int n, const char *s, char **end)) {
    size_t n_bytes;
    char *text = (char *)nm_test_read_file(path, &n_bytes);
    if (!text) return -1;
    char *line = text;
    for (int i = 0; i < line_no && line; i++) {
        line = strchr(line, '\n');
        if (line) line++;
    }
    int n = 0;
    while (line && *line && n < cap) {
        if (*line == '\n') {
            if (line_no >= 0) break;
            line++;
            continue;
        }
        char *end;
        if (!put(out, n, line, &end) || end == line) break;
        n++;
        line = end;
        while (*line == ' ')
            line++;
    }
    free(text);
    return n;
}

static bool put_int(void *out, int n, const char *s, char **end) {
    ((int32_t *)out)[n] = (int32_t)strtol(s, end, 10);
    return true;
}

static bool put_float(void *out, int n, const char *s, char **end) {
    ((float *)out)[n] = strtof(s, end);
    return true;
}

int nm_test_read_ints(const char *path, int line_no, int32_t *out, int cap) {
    return read_numbers(path, line_no < 0 ? 0 : line_no, out, cap, put_int);
}

int nm_test_read_floats(const char *path, int line_no, float *out, int cap) {
    return read_numbers(path, line_no, out, cap, put_float);
}

/* ---- the vectors' tokenizer TSV files ---- */

void nm_test_print_text(const char *label, const char *s, size_t n) {
    fprintf(stderr, "  %s \"", label);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", stderr);
        else if (c == '\t')
            fputs("\\t", stderr);
        else if (c == '\r')
            fputs("\\r", stderr);
        else if (c == '"' || c == '\\')
            fprintf(stderr, "\\%c", c);
        else if (c < 0x20 || c == 0x7F)
            fprintf(stderr, "\\x%02X", c);
        else
            fputc(c, stderr);
    }
    fputs("\"\n", stderr);
}

void nm_test_print_ids(const char *label, const int32_t *ids, size_t n) {
    fprintf(stderr, "  %s [%zu]:", label, n);
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, " %d", ids[i]);
    fputc('\n', stderr);
}

static int hex4(const char *p) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

static size_t put_utf8(char *out, unsigned cp) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Parses the RFC 8259 string literal at *p into out (room for as many bytes
 * as the literal has); returns its length, or -1 if malformed. */
long nm_test_parse_json_string(const char **p, char *out) {
    const char *s = *p;
    if (*s++ != '"') return -1;
    size_t n = 0;
    while (*s != '"') {
        if (*s == '\0' || *s == '\n') return -1;
        if (*s != '\\') {
            out[n++] = *s++;
            continue;
        }
        s++;
        switch (*s++) {
        case '"':
            out[n++] = '"';
            break;
        case '\\':
            out[n++] = '\\';
            break;
        case '/':
            out[n++] = '/';
            break;
        case 'b':
            out[n++] = '\b';
            break;
        case 'f':
            out[n++] = '\f';
            break;
        case 'n':
            out[n++] = '\n';
            break;
        case 'r':
            out[n++] = '\r';
            break;
        case 't':
            out[n++] = '\t';
            break;
        case 'u': {
            int hi = hex4(s);
            if (hi < 0) return -1;
            s += 4;
            unsigned cp = (unsigned)hi;
            if (hi >= 0xD800 && hi < 0xDC00 && s[0] == '\\' && s[1] == 'u') {
                int lo = hex4(s + 2);
                if (lo < 0xDC00 || lo > 0xDFFF) return -1;
                cp = 0x10000 + (((unsigned)hi - 0xD800) << 10) + ((unsigned)lo - 0xDC00);
                s += 6;
            }
            n += put_utf8(out + n, cp);
            break;
        }
        default:
            return -1;
        }
    }
    *p = s + 1;
    return (long)n;
}

double nm_test_row_rel_err(const float *got, const float *want, int n) {
    double max_d = 0, max_w = 0;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (d > max_d || isnan(d)) max_d = isnan(d) ? INFINITY : d;
        if (fabs(want[i]) > max_w) max_w = fabs(want[i]);
    }
    return max_d / max_w;
}

void nm_test_read_greedy(const char *dir, int p, int32_t *want, float *margin, int n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/greedy.txt", dir);
    CHECK_INT_EQ(nm_test_read_ints(path, p, want, n), n);
    snprintf(path, sizeof path, "%s/greedy_margin.txt", dir);
    CHECK_INT_EQ(nm_test_read_floats(path, p, margin, n), n);
}

double nm_test_golden_worst(const char *dir, int p, const float *all_logits, int n, int n_vocab) {
    int n_skipped;
    return nm_test_golden_worst_except(dir, p, all_logits, n, n_vocab, NULL, &n_skipped);
}

double nm_test_golden_worst_except(const char *dir, int p, const float *all_logits, int n,
                                   int n_vocab, const bool *skip, int *n_skipped) {
    enum { MAX_POSITIONS = 1024 };
    char path[1024];
    int32_t pos[MAX_POSITIONS];
    snprintf(path, sizeof path, "%s/positions.txt", dir);
    int n_pos = nm_test_read_ints(path, p, pos, MAX_POSITIONS);
    snprintf(path, sizeof path, "%s/logits_%d.f32", dir, p);
    size_t n_bytes;
    float *gold = (float *)nm_test_read_file(path, &n_bytes);
    CHECK(gold != NULL && n_pos > 0);
    if (!gold || n_pos <= 0) {
        free(gold);
        return INFINITY;
    }
    CHECK_INT_EQ(n_bytes, (size_t)n_pos * n_vocab * sizeof(float));
    double worst = 0;
    *n_skipped = 0;
    for (int r = 0; r < n_pos && pos[r] < n && n_bytes >= (size_t)(r + 1) * n_vocab * sizeof(float);
         r++) {
        if (skip && skip[pos[r]]) {
            (*n_skipped)++;
            continue;
        }
        double e = nm_test_row_rel_err(all_logits + (size_t)pos[r] * n_vocab,
                                       gold + (size_t)r * n_vocab, n_vocab);
        if (e > worst) worst = e;
    }
    free(gold);
    return worst;
}

nm_session *nm_test_new_session(nm_model *m, int n_batch, int n_threads) {
    nm_session_params sp = nm_session_default_params();
    sp.n_ctx = 512;
    sp.n_batch = n_batch;
    sp.n_threads = n_threads;
    nm_session *s = NULL;
    nm_error err = {0};
    nm_status st = nm_session_new(m, &sp, &s, &err);
    if (st != NM_OK) fprintf(stderr, "session: %s\n", err.msg);
    CHECK_INT_EQ(st, NM_OK);
    return s;
}

double nm_test_rows_rel_err(const float *got, const float *want, size_t rows, int n) {
    double worst = 0;
    for (size_t r = 0; r < rows; r++) {
        const double e = nm_test_row_rel_err(got + r * (size_t)n, want + r * (size_t)n, n);
        if (!(e <= worst)) worst = e;
    }
    return worst;
}

void nm_test_parity_plan(nm_test_plan *tp, int32_t chunk, int32_t n_layer, int32_t n_expert,
                         int32_t capacity, bool host_odd, nm_overflow overflow,
                         nm_salience salience) {
    CHECK(n_layer <= NM_TEST_MAX_LAYER && n_expert <= NM_TEST_MAX_EXPERT && n_expert % 2 == 0);
    memset(tp, 0, sizeof *tp);
    snprintf(tp->plan.device, sizeof tp->plan.device, "cpu"); /* the device the tests run */
    nm_moe_plan *p = &tp->plan.moe;
    p->chunk = chunk;
    p->n_layer = n_layer;
    p->n_expert = n_expert;
    p->overflow = overflow;
    p->salience = salience;
    p->layers = tp->layers;
    for (int l = 0; l < n_layer && l < NM_TEST_MAX_LAYER; l++) {
        tp->layers[l].n_groups = 2;
        tp->layers[l].groups = tp->groups[l];
        for (int g = 0; g < 2; g++) {
            for (int i = 0; i < n_expert / 2 && i < NM_TEST_MAX_EXPERT / 2; i++)
                tp->experts[l][g][i] = 2 * i + g;
            tp->groups[l][g] = (nm_moe_group){.capacity = capacity,
                                              .n_experts = n_expert / 2,
                                              .experts = tp->experts[l][g],
                                              .on_device = !(host_odd && g == 1)};
        }
    }
}

nm_session *nm_test_mode_session(nm_model *m, int n_batch, nm_mode mode, const nm_plan *plan,
                                 nm_device *dev) {
    nm_session_params sp = nm_session_default_params();
    sp.n_ctx = 512;
    sp.n_batch = n_batch;
    sp.n_threads = 2;
    sp.mode = mode;
    sp.plan = plan;
    sp.device = dev;
    nm_session *s = NULL;
    nm_error err = {0};
    nm_status st = nm_session_new(m, &sp, &s, &err);
    if (st != NM_OK) fprintf(stderr, "session (%s): %s\n", nm_mode_name(mode), err.msg);
    CHECK_INT_EQ(st, NM_OK);
    return s;
}

void nm_test_run_greedy(nm_session *s, const int32_t *ids, int n, int n_decode, float *out,
                        int n_vocab, nm_load_fn load_fn, void *ctx) {
    nm_error err = {0};
    if (load_fn) nm_session_set_load_fn(s, load_fn, ctx);
    CHECK_INT_EQ(nm_session_eval(s, ids, n, out, true, &err), NM_OK);
    if (load_fn) nm_session_set_load_fn(s, NULL, NULL);
    const float *last = out + (size_t)(n - 1) * n_vocab;
    for (int i = 0; i < n_decode; i++) {
        int32_t next = nm_argmax(last, n_vocab);
        float *row = out + (size_t)(n + i) * n_vocab;
        CHECK_INT_EQ(nm_session_eval(s, &next, 1, row, false, &err), NM_OK);
        last = row;
    }
}

bool nm_test_kernels_from_env(void) {
    const char *bad = NULL;
    if (!nm_kernels_check_env(&bad)) {
        printf("NPUMOE_KERNELS=%s is not available here: skipped\n", bad);
        return false;
    }
    printf("kernels: %s\n", nm_kernels_isa_name(nm_kernels_active()));
    return true;
}

long nm_test_encode(const nm_tokenizer *tok, const char *s, size_t n, bool add_bos,
                    bool parse_special, int32_t *ids, size_t cap) {
    size_t n_out = 0;
    nm_error err = {0};
    nm_status st = nm_tokenizer_encode(tok, s, n, add_bos, parse_special, ids, cap, &n_out, &err);
    if (st != NM_OK) {
        fprintf(stderr, "  encode failed: %s: %s\n", nm_status_str(st), err.msg);
        return -1;
    }
    return (long)n_out;
}

size_t nm_test_decode(const nm_tokenizer *tok, const int32_t *ids, size_t n, char *out,
                      size_t cap) {
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t k = nm_tokenizer_piece(tok, ids[i], true, len < cap ? out + len : NULL,
                                       len < cap ? cap - len : 0);
        if (k < 0) return (size_t)-1;
        len += (size_t)k;
    }
    return len;
}

int nm_test_check_tokenize_tsv(const nm_tokenizer *tok, const char *tsv_path,
                               nm_test_decode_fn decode, int *n_exact) {
    size_t n_file = 0;
    char *file = (char *)nm_test_read_file(tsv_path, &n_file);
    CHECK(file != NULL);
    if (!file) {
        fprintf(stderr, "cannot read %s\n", tsv_path);
        return 0;
    }
    char *text = malloc(n_file + 1), *decoded = malloc(4 * n_file + 64);
    int32_t *want = malloc((n_file + 1) * sizeof *want), *got = malloc((n_file + 1) * sizeof *got);
    int line = 0, exact = 0;
    for (char *p = file; *p; line++) {
        char *eol = strchr(p, '\n');
        if (eol) *eol = '\0';
        const char *q = p;
        long n_text = nm_test_parse_json_string(&q, text);
        CHECK(n_text >= 0 && *q == '\t');
        if (n_text < 0 || *q != '\t') break;
        size_t n_want = 0;
        for (q++; *q;) {
            char *end;
            long id = strtol(q, &end, 10);
            if (end == q) break; /* not a number: the count check below fails */
            want[n_want++] = (int32_t)id;
            q = *end == ' ' ? end + 1 : end;
        }
        long n_got = nm_test_encode(tok, text, (size_t)n_text, nm_tokenizer_add_bos(tok), true, got,
                                    n_file + 1);
        nm_test_checks++;
        if (n_got != (long)n_want || memcmp(got, want, n_want * sizeof *want) != 0) {
            nm_test_failures++;
            fprintf(stderr, "%s line %d: ids differ from llama.cpp's\n", tsv_path, line + 1);
            nm_test_print_text("text", text, (size_t)n_text);
            nm_test_print_ids("llama.cpp", want, n_want);
            if (n_got >= 0) nm_test_print_ids("npumoe   ", got, (size_t)n_got);
        } else {
            exact++;
        }
        const size_t skip_bos = nm_tokenizer_add_bos(tok) && n_want > 0 ? 1 : 0;
        size_t n_dec = decode(tok, want + skip_bos, n_want - skip_bos, decoded, 4 * n_file + 64);
        nm_test_checks++;
        if (n_dec != (size_t)n_text || memcmp(decoded, text, (size_t)n_text) != 0) {
            nm_test_failures++;
            fprintf(stderr, "%s line %d: decoding llama.cpp's ids does not give the text\n",
                    tsv_path, line + 1);
            nm_test_print_text("text   ", text, (size_t)n_text);
            if (n_dec != (size_t)-1) nm_test_print_text("decoded", decoded, n_dec);
        }
        if (!eol) break;
        p = eol + 1;
    }
    free(text);
    free(decoded);
    free(want);
    free(got);
    free(file);
    if (n_exact) *n_exact = exact;
    return line;
}

static void *experts_stack(uint32_t type, int64_t n_mats, int64_t n, int64_t k,
                           float (*rand_pm1)(void), nm_mat *first, size_t *stride) {
    size_t rb = 0;
    CHECK(nm_dtype_row_bytes(type, k, &rb));
    uint8_t *data = malloc((size_t)(n_mats * n) * rb);
    float *row = malloc((size_t)k * sizeof(float));
    const float scale = 1.0f / sqrtf((float)k);
    for (int64_t r = 0; r < n_mats * n; r++) {
        for (int64_t i = 0; i < k; i++)
            row[i] = rand_pm1() * scale;
        nm_error err = {0};
        CHECK_INT_EQ(nm_quantize_row((nm_dtype)type, row, data + (size_t)r * rb, k, &err), NM_OK);
    }
    free(row);
    *first = (nm_mat){.data = data, .type = type, .n = n, .k = k, .row_bytes = rb};
    *stride = (size_t)n * rb;
    return data;
}

nm_test_experts nm_test_experts_new(uint32_t type, int32_t n_expert, int64_t d_model, int64_t d_ff,
                                    float (*rand_pm1)(void)) {
    nm_test_experts s = {.w.n_expert = n_expert};
    s.data[0] = experts_stack(type, n_expert, d_ff, d_model, rand_pm1, &s.w.gate, &s.w.gate_stride);
    s.data[1] = experts_stack(type, n_expert, d_ff, d_model, rand_pm1, &s.w.up, &s.w.up_stride);
    s.data[2] = experts_stack(type, n_expert, d_model, d_ff, rand_pm1, &s.w.down, &s.w.down_stride);
    return s;
}

void nm_test_experts_free(nm_test_experts *s) {
    for (int i = 0; i < 3; i++)
        free(s->data[i]);
}
