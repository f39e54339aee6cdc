/* Element types of weights as GGUF/ggml number them: their names and block
 * layouts (a format fact, used by the GGUF validator for sizes), which of
 * them npumoe computes with, scalar conversions, and row dequantisation. */
#ifndef NM_TENSOR_H
#define NM_TENSOR_H

#include "npumoe.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ggml type ids. Gaps are ids ggml removed; they are invalid in a file. */
typedef enum nm_dtype {
    NM_DTYPE_F32 = 0,
    NM_DTYPE_F16 = 1,
    NM_DTYPE_Q4_0 = 2,
    NM_DTYPE_Q4_1 = 3,
    NM_DTYPE_Q5_0 = 6,
    NM_DTYPE_Q5_1 = 7,
    NM_DTYPE_Q8_0 = 8,
    NM_DTYPE_Q8_1 = 9,
    NM_DTYPE_Q2_K = 10,
    NM_DTYPE_Q3_K = 11,
    NM_DTYPE_Q4_K = 12,
    NM_DTYPE_Q5_K = 13,
    NM_DTYPE_Q6_K = 14,
    NM_DTYPE_Q8_K = 15,
    NM_DTYPE_IQ2_XXS = 16,
    NM_DTYPE_IQ2_XS = 17,
    NM_DTYPE_IQ3_XXS = 18,
    NM_DTYPE_IQ1_S = 19,
    NM_DTYPE_IQ4_NL = 20,
    NM_DTYPE_IQ3_S = 21,
    NM_DTYPE_IQ2_S = 22,
    NM_DTYPE_IQ4_XS = 23,
    NM_DTYPE_I8 = 24,
    NM_DTYPE_I16 = 25,
    NM_DTYPE_I32 = 26,
    NM_DTYPE_I64 = 27,
    NM_DTYPE_F64 = 28,
    NM_DTYPE_IQ1_M = 29,
    NM_DTYPE_BF16 = 30,
    NM_DTYPE_TQ1_0 = 34,
    NM_DTYPE_TQ2_0 = 35,
    NM_DTYPE_MXFP4 = 39,
    NM_DTYPE_COUNT = 40
} nm_dtype;

/* Q8_0 block: an f16 scale d followed by 32 int8 values q; x = d * q. */
enum { NM_Q8_0_BLOCK = 32, NM_Q8_0_BYTES = 34 };

typedef struct nm_dtype_traits {
    const char *name;     /* "f32", "q8_0", ... as ggml names them */
    uint32_t block_size;  /* elements per block                      */
    uint32_t block_bytes; /* bytes per block                         */
} nm_dtype_traits;

/* Traits of a type id, or NULL for an id no ggml version defines now. */
const nm_dtype_traits *nm_dtype_traits_of(uint32_t type_id);

/* Name of a type id, "type<N>" style text for unknown ids (static buffer not
 * used: unknown ids give "unknown"). */
const char *nm_dtype_name(uint32_t type_id);

/* Bytes of a row of n elements. Returns false when n is not a multiple of
 * the block size or the type is unknown. */
bool nm_dtype_row_bytes(uint32_t type_id, int64_t n, size_t *out);

/* Whether npumoe can compute with weights of this type. */
bool nm_dtype_is_supported(uint32_t type_id);

/* IEEE half and bfloat16 conversions; f32->f16/bf16 round to nearest even. */
float nm_f16_to_f32(uint16_t h);
uint16_t nm_f32_to_f16(float f);
float nm_bf16_to_f32(uint16_t b);
uint16_t nm_f32_to_bf16(float f);

/* Converts n elements of a supported type starting at src into float. */
void nm_dequantize_row(nm_dtype type, const void *src, float *dst, int64_t n);

#endif /* NM_TENSOR_H */
