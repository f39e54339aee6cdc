/* Measured peaks of this machine (0 when the instructions are missing). */
#ifndef NM_BENCH_PEAKS_H
#define NM_BENCH_PEAKS_H

double nm_peak_fma_gflops(void);        /* one core, FP32 FMA, 2 flops per lane */
double nm_peak_fma_avx2_gflops(void);   /* the same on 8-lane AVX2 vectors */
double nm_peak_bf16_dot_gflops(void);   /* one core, vdpbf16ps, 2 flops per product */
double nm_peak_vnni_gops(void);         /* one core, vpdpbusd, 2 ops per product */
/* one core, signed int8 products without VNNI (vpsignb, or with flip
 * vpxor, then vpmaddubsw, vpmaddwd, vpaddd per 32), 2 ops per product */
double nm_peak_int8_avx2_gops(int flip);
double nm_peak_read_gbs(int n_threads); /* memory read, GB/s */
/* one core, tdpbf16ps and tdpbssd, 2 ops per product; call only where the
 * CPU has AMX and the kernel granted the tile state */
double nm_peak_amx_bf16_gflops(void);
double nm_peak_amx_int8_gops(void);

#endif
