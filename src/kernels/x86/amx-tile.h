/* The AMX tile operations of amx.c: the instructions themselves, or, when
 * NM_AMX_EMU is defined (amx-emu.c), plain C over a per-thread tile file
 * that checks the configuration on every use, so that the kernel's layouts
 * and loops are tested on CPUs without AMX.
 *
 * The tile file: eight tiles of up to 16 rows x 64 bytes, each with the
 * rows and bytes per row of the configuration last loaded on the thread
 * (AMX_LOADCFG, which also zeroes every tile). Emulated, every operation
 * asserts that the thread has loaded a configuration, that the tiles it
 * names are configured, and that their shapes fit the operation:
 *   AMX_LOAD(t, p, stride)  tile t's rows from p, p + stride, ...
 *   AMX_STORE(t, p, stride) tile t's rows to p, p + stride, ...
 *   AMX_ZERO(t)
 *   AMX_DPBF16(c, a, b)     c (rows x n FP32) += a (rows x 2k BF16) . b
 *                           (k rows of n pairs of BF16)
 *   AMX_DPBSUD(c, a, b)     c (rows x n int32) += a (rows x 4k int8) . b
 *                           (k rows of n quads of uint8)
 *   AMX_DPBSSD(c, a, b)     the same with b signed
 * Integer products and sums are exact (modulo 2^32), so the emulated and
 * the real int8 operations give the same bits. tdpbf16ps: emulated as the
 * pairs of products rounded to FP32 once (the products of two bfloat16 are
 * exact), each pair added to the sum in k order, denormal inputs and
 * results taken as zero, rounding to nearest even. Measured on a Sapphire
 * Rapids core (docs/PERFORMANCE.md), the instruction gives exactly that
 * when a tile holds one pair per row; with more pairs it sums them in an
 * order or precision the SDM does not describe, and results differ from
 * this model by up to about one unit in the last place in a third or more
 * of the outputs. The tests bound that difference; they compare the int8
 * paths bit for bit. */
#ifndef NM_KERNELS_X86_AMX_TILE_H
#define NM_KERNELS_X86_AMX_TILE_H

#include <stdint.h>

/* The 64-byte operand of ldtilecfg (palette 1). */
typedef struct nm_amx_cfg {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} nm_amx_cfg;
_Static_assert(sizeof(nm_amx_cfg) == 64, "ldtilecfg reads 64 bytes");

#if defined(NM_AMX_EMU)
#include "base/base.h"

#include <math.h>
#include <string.h>

typedef struct amx_emu_file {
    int configured;
    nm_amx_cfg cfg;
    uint8_t t[8][16 * 64];
} amx_emu_file;

static _Thread_local amx_emu_file amx_emu;

static void amx_emu_loadcfg(const nm_amx_cfg *c) {
    NM_ASSERT(c->palette == 1 && c->start_row == 0);
    for (int i = 0; i < 16; i++) {
        if (i < 8) {
            NM_ASSERT(c->rows[i] <= 16 && c->colsb[i] <= 64 && c->colsb[i] % 4 == 0);
            NM_ASSERT((c->rows[i] == 0) == (c->colsb[i] == 0));
        } else {
            NM_ASSERT(c->rows[i] == 0 && c->colsb[i] == 0);
        }
    }
    amx_emu.cfg = *c;
    memset(amx_emu.t, 0, sizeof amx_emu.t);
    amx_emu.configured = 1;
}

/* Tile t, configured on this thread. */
static uint8_t *amx_emu_tile(int t) {
    NM_ASSERT(amx_emu.configured && "tile used before this thread loaded a configuration");
    NM_ASSERT(t >= 0 && t < 8 && amx_emu.cfg.rows[t] > 0);
    return amx_emu.t[t];
}

static void amx_emu_load(int t, const void *p, int64_t stride) {
    uint8_t *d = amx_emu_tile(t);
    const int rows = amx_emu.cfg.rows[t], cb = amx_emu.cfg.colsb[t];
    memset(d, 0, 16 * 64); /* bytes past the configured ones read as 0 */
    for (int r = 0; r < rows; r++)
        memcpy(d + 64 * r, (const uint8_t *)p + r * stride, (size_t)cb);
}

static void amx_emu_store(int t, void *p, int64_t stride) {
    const uint8_t *s = amx_emu_tile(t);
    const int rows = amx_emu.cfg.rows[t], cb = amx_emu.cfg.colsb[t];
    for (int r = 0; r < rows; r++)
        memcpy((uint8_t *)p + r * stride, s + 64 * r, (size_t)cb);
}

static void amx_emu_zero(int t) { memset(amx_emu_tile(t), 0, 16 * 64); }

/* c += a . b checked as the instructions require: a's rows are c's, b has
 * one row per 4 bytes of a's rows, b's rows are as wide as c's. */
static void amx_emu_shapes(int c, int a, int b) {
    amx_emu_tile(c), amx_emu_tile(a), amx_emu_tile(b);
    const nm_amx_cfg *g = &amx_emu.cfg;
    NM_ASSERT(c != a && c != b && a != b);
    NM_ASSERT(g->rows[c] == g->rows[a] && g->colsb[a] / 4 == g->rows[b] &&
              g->colsb[c] == g->colsb[b]);
}

static float amx_emu_flush(float v) { return fabsf(v) < 0x1p-126f ? 0.0f * v : v; }
static float amx_emu_bf16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return amx_emu_flush(f);
}

static void amx_emu_dpbf16(int c, int a, int b) {
    amx_emu_shapes(c, a, b);
    const nm_amx_cfg *g = &amx_emu.cfg;
    uint8_t *tc = amx_emu.t[c];
    const uint8_t *ta = amx_emu.t[a], *tb = amx_emu.t[b];
    for (int m = 0; m < g->rows[c]; m++)
        for (int n = 0; n < g->colsb[c] / 4; n++) {
            float acc;
            memcpy(&acc, tc + 64 * m + 4 * n, 4);
            acc = amx_emu_flush(acc);
            for (int k = 0; k < g->rows[b]; k++) {
                const float a0 = amx_emu_bf16(ta + 64 * m + 4 * k);
                const float a1 = amx_emu_bf16(ta + 64 * m + 4 * k + 2);
                const float b0 = amx_emu_bf16(tb + 64 * k + 4 * n);
                const float b1 = amx_emu_bf16(tb + 64 * k + 4 * n + 2);
                /* a0 * b0 is exact; fmaf rounds the pair's sum once */
                const float pair = amx_emu_flush(fmaf(a1, b1, a0 * b0));
                acc = amx_emu_flush(acc + pair);
            }
            memcpy(tc + 64 * m + 4 * n, &acc, 4);
        }
}

static void amx_emu_dpb(int c, int a, int b, int b_signed) {
    amx_emu_shapes(c, a, b);
    const nm_amx_cfg *g = &amx_emu.cfg;
    uint8_t *tc = amx_emu.t[c];
    const uint8_t *ta = amx_emu.t[a], *tb = amx_emu.t[b];
    for (int m = 0; m < g->rows[c]; m++)
        for (int n = 0; n < g->colsb[c] / 4; n++) {
            uint32_t acc; /* wraps as the instruction's int32 sums do */
            memcpy(&acc, tc + 64 * m + 4 * n, 4);
            for (int k = 0; k < g->rows[b]; k++)
                for (int i = 0; i < 4; i++) {
                    const int32_t av = (int8_t)ta[64 * m + 4 * k + i];
                    const uint8_t bu = tb[64 * k + 4 * n + i];
                    const int32_t bv = b_signed ? (int32_t)(int8_t)bu : (int32_t)bu;
                    acc += (uint32_t)(av * bv);
                }
            memcpy(tc + 64 * m + 4 * n, &acc, 4);
        }
}

#define AMX_LOADCFG(cfg) amx_emu_loadcfg(cfg)
#define AMX_LOAD(t, p, stride) amx_emu_load(t, p, stride)
#define AMX_STORE(t, p, stride) amx_emu_store(t, p, stride)
#define AMX_ZERO(t) amx_emu_zero(t)
#define AMX_DPBF16(c, a, b) amx_emu_dpbf16(c, a, b)
#define AMX_DPBSUD(c, a, b) amx_emu_dpb(c, a, b, 0)
#define AMX_DPBSSD(c, a, b) amx_emu_dpb(c, a, b, 1)
#else
#include <immintrin.h>

#define AMX_LOADCFG(cfg) _tile_loadconfig(cfg)
#define AMX_LOAD(t, p, stride) _tile_loadd(t, p, stride)
#define AMX_STORE(t, p, stride) _tile_stored(t, p, stride)
#define AMX_ZERO(t) _tile_zero(t)
#define AMX_DPBF16(c, a, b) _tile_dpbf16ps(c, a, b)
#define AMX_DPBSUD(c, a, b) _tile_dpbsud(c, a, b)
#define AMX_DPBSSD(c, a, b) _tile_dpbssd(c, a, b)
#endif

#endif /* NM_KERNELS_X86_AMX_TILE_H */
