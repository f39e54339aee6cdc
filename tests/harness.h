/* A tiny test harness: checks that print both sides of a failed comparison
 * and count failures; each test program returns nm_test_finish(). */
#ifndef NM_TEST_HARNESS_H
#define NM_TEST_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

extern int nm_test_failures;
extern int nm_test_checks;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        nm_test_checks++;                                                                          \
        if (!(cond)) {                                                                             \
            nm_test_failures++;                                                                    \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

#define CHECK_INT_EQ(a, b)                                                                         \
    do {                                                                                           \
        long long va_ = (long long)(a), vb_ = (long long)(b);                                      \
        nm_test_checks++;                                                                          \
        if (va_ != vb_) {                                                                          \
            nm_test_failures++;                                                                    \
            fprintf(stderr, "%s:%d: %s == %s failed: %lld != %lld\n", __FILE__, __LINE__, #a, #b,  \
                    va_, vb_);                                                                     \
        }                                                                                          \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                                      \
    do {                                                                                           \
        double va_ = (double)(a), vb_ = (double)(b);                                               \
        nm_test_checks++;                                                                          \
        if (!(va_ - vb_ <= (tol) && vb_ - va_ <= (tol))) {                                         \
            nm_test_failures++;                                                                    \
            fprintf(stderr, "%s:%d: |%s - %s| <= %g failed: %.9g vs %.9g\n", __FILE__, __LINE__,   \
                    #a, #b, (double)(tol), va_, vb_);                                              \
        }                                                                                          \
    } while (0)

/* Prints "<name>: N passed, M failed" and returns the exit status. */
int nm_test_finish(const char *name);

/* Reads a whole file; returns NULL if it cannot. Caller frees with free(). */
unsigned char *nm_test_read_file(const char *path, size_t *n_bytes);

/* Line line_no (0-based) of a text file as space-separated integers, at most
 * cap of them; returns how many, or -1 if the file cannot be read. */
int nm_test_read_ints(const char *path, int line_no, int32_t *out, int cap);

/* Prints text with escapes, and token ids, to stderr (failed comparisons). */
void nm_test_print_text(const char *label, const char *s, size_t n);
void nm_test_print_ids(const char *label, const int32_t *ids, size_t n);

/* Parses the RFC 8259 string literal at *p (the first column of the vectors'
 * *-tokenize.tsv) into out, which has room for as many bytes as the literal;
 * advances *p past it and returns its length, or -1 if malformed. */
long nm_test_parse_json_string(const char **p, char *out);

#endif
