/* Quantising GGUF files: which type each tensor gets (single types, and the
 * Q4_K_M / Q5_K_M mixes as llama.cpp's llama-quantize chooses them), and the
 * driver that writes a quantised copy of a file with all of its keys. Not
 * here: the block algorithms (tensor/quantize.c); the documented rules are in
 * docs/USAGE.md. */
#ifndef NM_QUANT_H
#define NM_QUANT_H

#include "gguf/gguf.h"
#include "npumoe.h"

#include <stdbool.h>
#include <stdint.h>

/* What a file is quantised to. Single types give every quantisable tensor
 * that type (llama-quantize --pure); the _M and _S mixes follow llama.cpp's
 * rules. */
typedef enum nm_quant_kind {
    NM_QUANT_Q8_0,
    NM_QUANT_Q4_0,
    NM_QUANT_Q4_K,
    NM_QUANT_Q5_K,
    NM_QUANT_Q6_K,
    NM_QUANT_Q4_K_M,
    NM_QUANT_Q5_K_M,
    NM_QUANT_Q4_K_S,
    NM_QUANT_Q5_K_S,
    NM_QUANT_F32,
    NM_QUANT_F16,
    NM_QUANT_BF16,
    NM_QUANT_KIND_COUNT
} nm_quant_kind;

/* "q8_0", "q4_0", "q4_k", "q5_k", "q6_k", "q4_k_m", "q5_k_m", "q4_k_s",
 * "q5_k_s", "f32", "f16", "bf16" (any case); anything else is
 * NM_ERR_INVALID_ARG with the list in the message. */
nm_status nm_quant_kind_parse(const char *name, nm_quant_kind *out, nm_error *err);
const char *nm_quant_kind_name(nm_quant_kind kind);
/* general.file_type, llama.cpp's LLAMA_FTYPE number: q8_0 7, q4_0 2, q4_k 14
 * (MOSTLY_Q4_K_S, as llama-quantize --pure Q4_K_S writes), q5_k 16, q6_k 18,
 * q4_k_m 15, q5_k_m 17, q4_k_s 14, q5_k_s 16, f32 0, f16 1, bf16 32. */
uint32_t nm_quant_file_type(nm_quant_kind kind);
/* The type of a single kind, or of a mix's ordinary tensors (q4_K, q5_K). */
uint32_t nm_quant_base_type(nm_quant_kind kind);

/* The decision for one tensor. */
typedef struct nm_quant_choice {
    uint32_t type;   /* ggml type written                                  */
    uint32_t wanted; /* the kind's type before the row-length fallback     */
    bool eligible;   /* false: not a tensor llama.cpp quantises (1-D, norm,
                        router, ...): kept in its own type                 */
    bool convert;    /* type differs from the input's: the data is converted */
} nm_quant_choice;

/* The choice for every tensor of g, in file order (choices[n_tensors]). Uses
 * names, shapes and the keys general.architecture, <arch>.block_count and
 * <arch>.expert_count; the input types only to say what is converted. A
 * tensor whose row length is not a multiple of its type's block falls back
 * to q8_0 (K-quants, when the rows are a multiple of 32) or f16. Fails with
 * a message for a mix when a key it needs is missing or a tensor's layer
 * cannot be told. */
nm_status nm_quant_choose(const nm_gguf *g, nm_quant_kind kind, nm_quant_choice *choices,
                          nm_error *err);

/* One finished tensor, for progress reports. */
typedef struct nm_quant_progress {
    uint64_t index, n_tensors; /* index is 0-based */
    const nm_gguf_tensor *tensor;
    const nm_quant_choice *choice;
    uint64_t out_bytes;
} nm_quant_progress;

typedef void (*nm_quant_progress_fn)(void *ctx, const nm_quant_progress *p);

typedef struct nm_quant_params {
    nm_quant_kind kind;
    int n_threads;                 /* >= 1 */
    nm_quant_progress_fn progress; /* may be NULL */
    void *progress_ctx;
} nm_quant_params;

nm_quant_params nm_quant_default_params(void); /* q8_0, 1 thread, no progress */

/* The public summary (npumoe.h): nm_quantize_file fills the counts and
 * sizes, nm_quantize the type, file type and threads. */
typedef nm_quantize_summary nm_quant_summary;

/* Reads the GGUF file in_path and writes out_path: every key in order
 * (general.file_type and general.quantization_version = 2 set), every tensor
 * in order, converted as nm_quant_choose says. out_path is written by the
 * rules of nm_outfile (base.h): a regular file under a temporary name beside
 * it, renamed at the end, so it is either the whole new file or untouched; a
 * symbolic link's target; a character device or FIFO directly. Fails, before
 * any work where it can, on: a missing or malformed input, a file without
 * tensors, a split file, out_path naming the input, an output of another
 * kind, a tensor to convert that is not F32/F16/BF16, an output that cannot
 * be created; and while converting, on NaN, infinite or out-of-range values
 * (the message names the tensor, row and column). Needs memory for about
 * twice the output's size (the writer builds the file in memory). */
nm_status nm_quantize_file(const char *in_path, const char *out_path, const nm_quant_params *p,
                           nm_quant_summary *summary, nm_error *err);

#endif /* NM_QUANT_H */
