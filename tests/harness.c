/* Counters and helpers behind harness.h. */
#include "harness.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int nm_test_failures = 0;
int nm_test_checks = 0;

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

int nm_test_read_ints(const char *path, int line_no, int32_t *out, int cap) {
    size_t n_bytes;
    char *text = (char *)nm_test_read_file(path, &n_bytes);
    if (!text) return -1;
    char *line = text;
    for (int i = 0; i < line_no && line; i++) {
        line = strchr(line, '\n');
        if (line) line++;
    }
    int n = 0;
    while (line && *line && *line != '\n' && n < cap) {
        char *end;
        long v = strtol(line, &end, 10);
        if (end == line) break;
        out[n++] = (int32_t)v;
        line = end;
        while (*line == ' ')
            line++;
    }
    free(text);
    return n;
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
