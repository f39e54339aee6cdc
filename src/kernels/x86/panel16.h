/* NM_LAYOUT_PANEL16, the weights' layout that nm_mat_repack makes at load
 * for the int8 kernels (avx512vnni and amx read it in 64-byte vectors,
 * avx2 in their 32-byte halves), and the facts of the block formats the
 * kernels walk it by. No intrinsics: each variant reads and writes the
 * layout with its own; the copies they make are the same bytes
 * (test_kernels_variants).
 *
 * Rows in groups of PANEL_ROWS = 16; a group holds its fetches (blocks,
 * super-blocks) one after another, each as 16 * fetch_bytes bytes, in the
 * order a tile reads them (the hardware prefetchers follow one ascending
 * stream far better than jumps). A "vector" is 64 bytes whose 32-bit word c
 * belongs to row c of the group (rows 0-7 in the first 32 bytes); "the 8
 * vectors of" 32 bytes of each row: vector t holds their bytes 4t..4t+3.
 *   Q8_0: the 16 f16 d, then the 8 vectors of the codes, each + 128 (as
 *     unsigned bytes: 0x80 flipped).
 *   Q4_0, MXFP4: the 16 f16 d (MXFP4: 16 E8M0 bytes), then 4 vectors of the
 *     16 bytes qs (vector t: bytes 4t..4t+3, low nibbles elements 4t..,
 *     high ones 16 + 4t..).
 *   Q4_K, Q5_K: 4 vectors of bytes 0-3, 4-7, 8-11, 12-15 of each row's
 *     super-block (d and dmin, the 12 scale bytes); Q5_K: the 8 vectors of
 *     qh; the 8 vectors of each part's code bytes (kq_codes_at), parts 0-3.
 *   Q6_K: per unit u the scales sc[2u], sc[2u + 1] of each row (16 pairs of
 *     bytes), then the 16 f16 d; then for each half h the 8 vectors of
 *     qh[32h..] followed by the parts 2h and 2h + 1.
 * The same size as the file's rows (16 * 34, 18, 17, 144, 176 or 210 bytes
 * per fetch); the rows after the last whole group keep the file's layout. */
#ifndef NM_KERNELS_X86_PANEL16_H
#define NM_KERNELS_X86_PANEL16_H

#include "tensor/tensor.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* rows per group; weights per unit (one activation block); bytes of 8
 * vectors; of the Q4_K/Q5_K scales; where Q6_K's d start, and its scales
 * end */
enum {
    PANEL_ROWS = 16,
    PANEL_UNIT = 32,
    PK_VEC8 = 8 * 64,
    PK_K4_SCALES = 4 * 64,
    PK_Q6_D = 8 * 2 * PANEL_ROWS,
    PK_Q6_SCALES = PK_Q6_D + 2 * PANEL_ROWS
};

/* ---- K-quants: a super-block's unit scales first, then its codes in four
 * parts of two units each, so that one row's tile can use each part's codes
 * from registers ---- */

static inline size_t kq_bytes(uint32_t type) {
    return type == NM_DTYPE_Q4_K   ? NM_Q4_K_BYTES
           : type == NM_DTYPE_Q5_K ? NM_Q5_K_BYTES
                                   : NM_Q6_K_BYTES;
}

/* Unit i (0, 1) of part p: Q4_K/Q5_K sub-blocks 2p, 2p + 1 (one 32-byte
 * read gives both); Q6_K, half p / 2, units j and j + 2 with j = p % 2
 * (they share their ql bytes). */
static inline int kq_unit(uint32_t type, int p, int i) {
    return type == NM_DTYPE_Q6_K ? 4 * (p / 2) + p % 2 + 2 * i : 2 * p + i;
}

/* In a super-block of the file: the 32 code bytes of part p (Q4_K/Q5_K
 * qs[32p..]; Q6_K ql[64 (p / 2) + 32 (p % 2)..]) and the 32 high-bit bytes
 * of part p (Q5_K qh, the same for every part; Q6_K qh[32 (p / 2)..]). */
static inline size_t kq_codes_at(uint32_t type, int p) {
    if (type == NM_DTYPE_Q6_K) return 64 * (size_t)(p / 2) + 32 * (size_t)(p % 2);
    return 4 + NM_K_SCALES_BYTES + (type == NM_DTYPE_Q5_K ? NM_QK_K / 8 : 0) + 32 * (size_t)p;
}
static inline size_t kq_high_at(uint32_t type, int p) {
    return type == NM_DTYPE_Q6_K ? NM_QK_K / 2 + 32 * (size_t)(p / 2) : 4 + NM_K_SCALES_BYTES;
}

/* ---- where things lie in a fetch of the panel16 layout ---- */

static inline size_t pk_codes_at(uint32_t type, int p) {
    switch (type) {
    case NM_DTYPE_Q4_K:
        return PK_K4_SCALES + PK_VEC8 * (size_t)p;
    case NM_DTYPE_Q5_K:
        return PK_K4_SCALES + PK_VEC8 * (size_t)(1 + p);
    default: /* Q6_K: qh0, parts 0 and 1, qh1, parts 2 and 3 */
        return PK_Q6_SCALES + PK_VEC8 * (size_t)(p + 1 + p / 2);
    }
}
static inline size_t pk_high_at(uint32_t type, int p) {
    return type == NM_DTYPE_Q6_K ? PK_Q6_SCALES + PK_VEC8 * (size_t)(3 * (p / 2)) : PK_K4_SCALES;
}

/* ---- fetches: what a kernel reads of a row at a time ---- */

/* Whether one fetch is one block of 32 (not a K-quant super-block). */
static inline int is_block32(uint32_t type) {
    return type == NM_DTYPE_Q8_0 || type == NM_DTYPE_Q4_0 || type == NM_DTYPE_MXFP4;
}

/* Units of 32 weights one fetch gives: a block, or a K-quant super-block. */
static inline int units_per_fetch(uint32_t type) {
    return is_block32(type) ? 1 : NM_QK_K / PANEL_UNIT;
}

/* Bytes of one row that one fetch reads. */
static inline size_t fetch_bytes(uint32_t type) {
    switch (type) {
    case NM_DTYPE_Q8_0:
        return NM_Q8_0_BYTES;
    case NM_DTYPE_Q4_0:
        return NM_Q4_0_BYTES;
    case NM_DTYPE_MXFP4:
        return NM_MXFP4_BYTES;
    default:
        return kq_bytes(type);
    }
}

/* Row c's scales of one fetch (r: the fetch in the file's row) into the
 * fetch pb of the panel16 layout; the codes are each variant's to move. */
static inline void pk_put_scales(uint32_t type, const uint8_t *r, int c, uint8_t *pb) {
    switch (type) {
    case NM_DTYPE_Q8_0:
    case NM_DTYPE_Q4_0: /* f16 d first */
        memcpy(pb + 2 * c, r, 2);
        return;
    case NM_DTYPE_MXFP4: /* the E8M0 byte first */
        pb[c] = r[0];
        return;
    case NM_DTYPE_Q6_K: { /* sc after ql and qh, d last */
        const size_t sc_at = NM_QK_K / 2 + NM_QK_K / 4;
        for (int u = 0; u < 8; u++)
            memcpy(pb + 2 * PANEL_ROWS * u + 2 * c, r + sc_at + 2 * u, 2);
        memcpy(pb + PK_Q6_D + 2 * c, r + NM_Q6_K_BYTES - 2, 2);
        return;
    }
    default: /* Q4_K, Q5_K: d, dmin and the 12 scale bytes first */
        for (int i = 0; i < 4; i++)
            memcpy(pb + 64 * i + 4 * c, r + 4 * i, 4);
    }
}

#endif /* NM_KERNELS_X86_PANEL16_H */
