/* This machine's AVX-512 and AMX peaks, measured: one core's FP32 FMA rate (8
 * independent accumulators), the AVX512-BF16 dot product (vdpbf16ps) and
 * the AVX512-VNNI int8 dot (vpdpbusd) rates, the AMX tile products
 * (tdpbf16ps, tdpbssd: four independent 16 x 16 tiles from two A and two B
 * tiles, as amx.c's BF16 loop uses them; per second of the thread's CPU
 * time) (peaks-avx2.c: the AVX2 FMA rate and the memory read
 * bandwidth). Only called when CPUID reports the instructions
 * (AMX: and the kernel granted the tile state). */
#include "peaks.h"

#include <stdint.h>
#include <time.h>


#if defined(NM_BENCH_X86)
#include <immintrin.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum { CHAINS = 8, ITERS = 20000000 };

double nm_peak_fma_gflops(void) {
    __m512 acc[CHAINS];
    const __m512 a = _mm512_set1_ps(1.0000001f), b = _mm512_set1_ps(0.9999999f);
    for (int c = 0; c < CHAINS; c++)
        acc[c] = _mm512_set1_ps((float)c);
    const double t0 = now();
    for (int i = 0; i < ITERS; i++)
        for (int c = 0; c < CHAINS; c++)
            acc[c] = _mm512_fmadd_ps(acc[c], a, b);
    const double dt = now() - t0;
    float sink = 0;
    for (int c = 0; c < CHAINS; c++)
        sink += _mm512_reduce_add_ps(acc[c]);
    if (sink == 12345.0f) return 0; /* keeps the loop alive */
    return (double)ITERS * CHAINS * 16 * 2 / dt * 1e-9;
}

double nm_peak_bf16_dot_gflops(void) {
    __m512 acc[CHAINS];
    const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3f80);
    for (int c = 0; c < CHAINS; c++)
        acc[c] = _mm512_setzero_ps();
    const double t0 = now();
    for (int i = 0; i < ITERS; i++)
        for (int c = 0; c < CHAINS; c++)
            acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
    const double dt = now() - t0;
    float sink = 0;
    for (int c = 0; c < CHAINS; c++)
        sink += _mm512_reduce_add_ps(acc[c]);
    if (sink == 12345.0f) return 0;
    return (double)ITERS * CHAINS * 32 * 2 / dt * 1e-9; /* 32 products per instruction */
}

double nm_peak_vnni_gops(void) {
    __m512i acc[CHAINS];
    const __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(1);
    for (int c = 0; c < CHAINS; c++)
        acc[c] = _mm512_setzero_si512();
    const double t0 = now();
    for (int i = 0; i < ITERS; i++)
        for (int c = 0; c < CHAINS; c++)
            acc[c] = _mm512_dpbusd_epi32(acc[c], a, b);
    const double dt = now() - t0;
    long long sink = 0;
    for (int c = 0; c < CHAINS; c++)
        sink += _mm512_reduce_add_epi32(acc[c]);
    if (sink == 12345) return 0;
    return (double)ITERS * CHAINS * 64 * 2 / dt * 1e-9; /* 64 products per instruction */
}

#if defined(NM_BENCH_AMX)
typedef struct tile_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_cfg;

enum { TILE_ITERS = 2000000 };

/* The calling thread's CPU time: the tile units are per core, and on a
 * shared machine the time the thread was not running does not count. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* 16 x 16 x 32 BF16 (int8: x 64) products per instruction, 2 ops each. */
static double amx_peak(int int8) {
    tile_cfg cfg = {.palette = 1};
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
    static _Alignas(64) uint8_t a[1024], b[1024];
    for (int i = 0; i < 1024; i++)
        a[i] = b[i] = (uint8_t)(int8 ? 1 : (i % 2 ? 0x3f : 0x80));
    _tile_loadd(4, a, 64);
    _tile_loadd(5, a, 64);
    _tile_loadd(6, b, 64);
    _tile_loadd(7, b, 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const double t0 = cpu_now();
    if (int8) {
        for (int i = 0; i < TILE_ITERS; i++) {
            _tile_dpbssd(0, 4, 6);
            _tile_dpbssd(1, 4, 7);
            _tile_dpbssd(2, 5, 6);
            _tile_dpbssd(3, 5, 7);
        }
    } else {
        for (int i = 0; i < TILE_ITERS; i++) {
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    static _Alignas(64) uint8_t c[1024];
    _tile_stored(0, c, 64); /* keeps the loop alive */
    const double dt = cpu_now() - t0;
    _tile_release();
    return (double)TILE_ITERS * 4 * 16 * 16 * (int8 ? 64 : 32) * 2 / dt * 1e-9;
}

double nm_peak_amx_bf16_gflops(void) { return amx_peak(0); }
double nm_peak_amx_int8_gops(void) { return amx_peak(1); }
#else
double nm_peak_amx_bf16_gflops(void) { return 0; }
double nm_peak_amx_int8_gops(void) { return 0; }
#endif

#else
double nm_peak_amx_bf16_gflops(void) { return 0; }
double nm_peak_amx_int8_gops(void) { return 0; }
double nm_peak_fma_gflops(void) { return 0; }
double nm_peak_bf16_dot_gflops(void) { return 0; }
double nm_peak_vnni_gops(void) { return 0; }
#endif
