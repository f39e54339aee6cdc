/* Counters and helpers behind harness.h. */
#include "harness.h"

#include <stdlib.h>

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
