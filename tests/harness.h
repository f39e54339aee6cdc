/* A tiny test harness: checks that print both sides of a failed comparison
 * and count failures; each test program returns nm_test_finish(). */
#ifndef NM_TEST_HARNESS_H
#define NM_TEST_HARNESS_H

#include "kernels/kernels.h"
#include "npumoe.h"
#include "plan/plan.h"
#include "tokenizer/tokenizer.h"

#include <stdbool.h>
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

/* The xorshift64 generator the tests draw from: advances *state (never 0)
 * and returns it; nm_test_frand maps its top 53 bits to a float in [-1, 1). */
uint64_t nm_test_xorshift(uint64_t *state);
float nm_test_frand(uint64_t *state);

/* Prints "<name>: N passed, M failed" and returns the exit status. */
int nm_test_finish(const char *name);

/* Reads a whole file; returns NULL if it cannot. Caller frees with free(). */
unsigned char *nm_test_read_file(const char *path, size_t *n_bytes);

/* Line line_no (0-based) of a text file as space-separated integers, at most
 * cap of them; returns how many, or -1 if the file cannot be read. */
int nm_test_read_ints(const char *path, int line_no, int32_t *out, int cap);

/* The same for floats; line_no < 0 reads every line (up to cap). */
int nm_test_read_floats(const char *path, int line_no, float *out, int cap);

/* Prints text with escapes, and token ids, to stderr (failed comparisons). */
void nm_test_print_text(const char *label, const char *s, size_t n);
void nm_test_print_ids(const char *label, const int32_t *ids, size_t n);

/* nm_tokenizer_encode, printing the error if it fails: the count, or -1. */
long nm_test_encode(const nm_tokenizer *tok, const char *s, size_t n, bool add_bos,
                    bool parse_special, int32_t *ids, size_t cap);

/* The text of n ids as a test's tokenizer writes it back: its length, or
 * (size_t)-1 when it does not fit cap. */
typedef size_t (*nm_test_decode_fn)(const nm_tokenizer *tok, const int32_t *ids, size_t n,
                                    char *out, size_t cap);

/* The pieces of n ids concatenated (special tokens rendered), as
 * llama.cpp's detokenizer gives them to a byte-level BPE vocabulary. */
size_t nm_test_decode(const nm_tokenizer *tok, const int32_t *ids, size_t n, char *out, size_t cap);

/* Checks every line of a vectors *-tokenize.tsv: encoding the text (special
 * tokens parsed, BOS as the vocabulary says, as llama-tokenize ran) gives
 * llama.cpp's ids, and decode of those ids (after the BOS) gives the text
 * back. Returns the number of lines; *n_exact, when not NULL, the lines whose
 * ids were equal. */
int nm_test_check_tokenize_tsv(const nm_tokenizer *tok, const char *tsv_path,
                               nm_test_decode_fn decode, int *n_exact);

/* Parses the RFC 8259 string literal at *p (the first column of the vectors'
 * *-tokenize.tsv) into out, which has room for as many bytes as the literal;
 * advances *p past it and returns its length, or -1 if malformed. */
long nm_test_parse_json_string(const char **p, char *out);

/* Golden logits (vectors/<model>/): max|got - want| / max|want| of one row
 * of n values, NaN counting as infinite. */
double nm_test_row_rel_err(const float *got, const float *want, int n);

/* The largest nm_test_row_rel_err of all_logits ([n][n_vocab], every
 * position of prompt p) over the positions < n stored for prompt p in the
 * model folder dir (positions.txt, logits_<p>.f32); INFINITY, with a failed
 * check, when they cannot be read. */
double nm_test_golden_worst(const char *dir, int p, const float *all_logits, int n, int n_vocab);
/* As nm_test_golden_worst, leaving out the positions t with skip[t] (skip:
 * [n]); *n_skipped: how many stored positions were left out. */
double nm_test_golden_worst_except(const char *dir, int p, const float *all_logits, int n,
                                   int n_vocab, const bool *skip, int *n_skipped);

/* The greedy continuation stored for prompt p in the model folder dir
 * (greedy.txt) and llama.cpp's margin at each step (greedy_margin.txt), n of
 * each; a failed check when fewer can be read. */
void nm_test_read_greedy(const char *dir, int p, int32_t *want, float *margin, int n);

/* A session of 512 positions on m with n_batch and n_threads; NULL (and a
 * failed check) if it cannot be made. */
nm_session *nm_test_new_session(nm_model *m, int n_batch, int n_threads);

/* Rows of logits: the largest nm_test_row_rel_err of rows rows of n values. */
double nm_test_rows_rel_err(const float *got, const float *want, size_t rows, int n);

/* Applies NPUMOE_KERNELS (nm_kernels_check_env) and prints the variant in
 * use; false, after a "skipped" line, when the variant it names is not
 * available here: the test then exits 77, CTest's code for skipped. */
bool nm_test_kernels_from_env(void);

/* ---- the static modes (test_static, test_static_arch) ---- */

enum { NM_TEST_MAX_LAYER = 32, NM_TEST_MAX_EXPERT = 16 }; /* 26 MoE layers: tiny-deepseek2 */

/* A plan of chunks of `chunk` tokens whose layers have two groups, the even
 * and the odd experts, of `capacity` rows each; the odd group on the host
 * when host_odd. */
typedef struct nm_test_plan {
    nm_plan plan;
    nm_moe_layer_plan layers[NM_TEST_MAX_LAYER];
    nm_moe_group groups[NM_TEST_MAX_LAYER][2];
    int32_t experts[NM_TEST_MAX_LAYER][2][NM_TEST_MAX_EXPERT / 2];
} nm_test_plan;

/* Synthetic expert weights of any computable type: n_expert experts with
 * gate and up [d_ff][d_model] and down [d_model][d_ff], values uniform in
 * +-1/sqrt(K) drawn from rand_pm1 (uniform in [-1, 1)), quantised by the
 * library's reference quantiser. */
typedef struct nm_test_experts {
    nm_expert_weights w;
    void *data[3]; /* gate, up, down: [n_expert][N][K] each */
} nm_test_experts;

nm_test_experts nm_test_experts_new(uint32_t type, int32_t n_expert, int64_t d_model, int64_t d_ff,
                                    float (*rand_pm1)(void));
void nm_test_experts_free(nm_test_experts *s);

void nm_test_parity_plan(nm_test_plan *tp, int32_t chunk, int32_t n_layer, int32_t n_expert,
                         int32_t capacity, bool host_odd, nm_overflow overflow,
                         nm_salience salience);

/* A session of 512 positions, 2 threads and batches of n_batch tokens in
 * mode (plan and dev for the static modes); NULL and a failed check if it
 * cannot be made. */
nm_session *nm_test_mode_session(nm_model *m, int n_batch, nm_mode mode, const nm_plan *plan,
                                 nm_device *dev);

/* Evaluates the n ids with all logits into out ([n + n_decode][n_vocab]),
 * reporting the prefill's loads to load_fn(ctx) when load_fn is not NULL,
 * then n_decode greedy steps, one token each, whose logits follow. */
void nm_test_run_greedy(nm_session *s, const int32_t *ids, int n, int n_decode, float *out,
                        int n_vocab, nm_load_fn load_fn, void *ctx);

#endif
