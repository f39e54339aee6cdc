/* Counters and helpers behind harness.h. */
#include "harness.h"

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
        while (*line == ' ') line++;
    }
    free(text);
    return n;
}
