/* Element types of weights as GGUF/ggml number them: their names and block
 * layouts (a format fact, used by the GGUF validator for sizes), which of
 * them npumoe computes with, scalar conversions, and row dequantisation. */
#ifndef NM_TENSOR_H
#define NM_TENSOR_H

#include "npumoe.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

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

/* Q4_0 block: an f16 scale d, then 16 bytes qs; element i < 16 is the low
 * nibble of qs[i], element 16 + i its high nibble; x = (q - 8) * d. */
enum { NM_Q4_0_BLOCK = 32, NM_Q4_0_BYTES = 18 };

/* MXFP4 block (OCP microscaling, as gpt-oss ships its experts): one E8M0
 * scale byte e, then 16 bytes qs; element i < 16 is the low nibble of
 * qs[i], element 16 + i its high nibble. A nibble is an E2M1 value, kept
 * doubled as a small integer (nm_mxfp4_values: 0, 1, 2, 3, 4, 6, 8, 12 and
 * their negatives), and the scale is halved to match: x = v * 2^(e - 128)
 * (ggml's e8m0_to_fp32_half; e = 0 and 1 give 2^-128 and 2^-127). */
enum { NM_MXFP4_BLOCK = 32, NM_MXFP4_BYTES = 17 };
extern const int8_t nm_mxfp4_values[16];
/* 2^(e - 128) as ggml computes it (denormal for e < 2). */
static inline float nm_e8m0_half_to_f32(uint8_t e) {
    const uint32_t bits = e >= 2 ? (uint32_t)(e - 1) << 23 : e == 1 ? 0x00400000u : 0x00200000u;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* K-quants: super-blocks of NM_QK_K = 256 elements. Byte layouts:
 * Q4_K (144): f16 d, f16 dmin, scales[12], qs[128]. Eight sub-blocks of 32
 *   with a 6-bit scale sc and min mn each (nm_k4_scale_min); sub-block pair
 *   p (elements 64p..64p+63) reads qs[32p..32p+31], the low nibbles for
 *   sub-block 2p and the high ones for 2p + 1; x = (d*sc) * q - (dmin*mn).
 * Q5_K (176): f16 d, f16 dmin, scales[12], qh[32], qs[128]. As Q4_K, plus a
 *   fifth bit: element l of sub-block s adds 16 when bit s of qh[l] is set.
 * Q6_K (210): ql[128], qh[64], int8 scales[16], f16 d. Each half h of 128
 *   elements reads ql[64h..], qh[32h..], scales[8h..]; its element 32g + l
 *   (g < 4, l < 32) takes the low (g < 2) or high (g >= 2) nibble of
 *   ql[64h + l + 32 (g & 1)], bits 2g..2g+1 of qh[32h + l] above them, minus
 *   32, and scale scales[8h + 2g + l / 16]; x = (d*sc) * q.
 * Products are rounded as written: the scale product first, then times q. */
enum {
    NM_QK_K = 256,
    NM_K_SCALES_BYTES = 12,
    NM_Q4_K_BYTES = 144,
    NM_Q5_K_BYTES = 176,
    NM_Q6_K_BYTES = 210,
};

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K super-block
 * from its 12 packed bytes: j < 4 keeps the low 6 bits of bytes j and j + 4;
 * j >= 4 joins a nibble of byte j + 4 with the top 2 bits of byte j - 4
 * (scale) or byte j (min). */
static inline void nm_k4_scale_min(int j, const uint8_t *scales, uint8_t *sc, uint8_t *mn) {
    if (j < 4) {
        *sc = scales[j] & 63;
        *mn = scales[j + 4] & 63;
    } else {
        *sc = (uint8_t)((scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4));
        *mn = (uint8_t)((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
    }
}

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

/* Converts n elements of a supported type starting at src into float,
 * bit for bit as ggml's to_float does. n is a multiple of the block size. */
void nm_dequantize_row(nm_dtype type, const void *src, float *dst, int64_t n);

/* ---- quantisation (quantize.c) ----------------------------------------------
 * Float rows to ggml's block layouts by ggml's reference algorithms
 * (quantize_row_*_ref, what llama-quantize runs without an importance
 * matrix), so the bytes equal ggml's and llama.cpp decodes them to the same
 * values. */

/* Whether nm_quantize_row makes this type: Q8_0, Q4_0, Q4_K, Q5_K, Q6_K,
 * MXFP4, and the float types F32, F16, BF16 (round to nearest even). */
bool nm_quantize_is_supported(uint32_t type_id);

/* Quantises n floats of src (n a multiple of the type's block size) into
 * dst, which has room for nm_dtype_row_bytes(type, n). Refuses, with
 * NM_ERR_INVALID_ARG and the element's index in err, a NaN or infinity, a
 * magnitude beyond what the type can hold (Q8_0 127 x 65504, Q4_0 8 x 65504,
 * Q4_K 945 x 65504, Q5_K 1953 x 65504, Q6_K 4096 x 65504, F16 65504), and a block whose
 * half-precision scale would overflow; dst is then partly written. Safe to
 * call from many threads at once. */
nm_status nm_quantize_row(nm_dtype type, const float *src, void *dst, int64_t n, nm_error *err);

#endif /* NM_TENSOR_H */
