/* Every kernel variant this CPU supports against the reference kernels:
 * matmul for F32/F16/BF16/Q8_0/Q4_0/Q4_K/Q5_K/Q6_K/MXFP4 weights on awkward
 * sizes
 * (1 row, m around the tile sizes, K not a multiple of the vector width,
 * very long rows), results independent of the row count and of the column
 * range, attention; Q8_0 dequantisation against its closed form; and the
 * dequantisation of every quantised type bit for bit against ggml's.
 * Tolerance of a matmul output: |y - y_ref| <= 2 * K * 2^-24 * sum_k |x_k
 * w_k| + 1e-30 (two float sums of K terms in different orders each err by
 * at most K * u * sum|terms|; the quantised types' weights are the same
 * floats on both sides); avx512bf16 with BF16 weights rounds activations to
 * bfloat16 and adds 2^-8 * sum|x w|. avx512vnni, for the types it quantises
 * activations for, moves each x_k to d_b q_k (d_b = max|x| / 127 over its
 * block of 32, q_k the nearest integer to x_k / d_b): by at most
 * d_b (1/2 + 2^-14) (2^-14 covers the float rounding of x_k * (1 / d_b)), so
 * it adds sum_k |w_k| d_b(k) (1/2 + 2^-14), plus the float error of its
 * block sums and scales, (n_blocks + 4) 2^-24 sum_k a_k (|x_k| + d_b(k))
 * with a_k = |w_k| (Q4_K/Q5_K: |w_k| + 2 dmin mn, as w_k = (d sc) q - dmin mn
 * can cancel; MXFP4 also with the denormal and huge E8M0 scales). It is
 * also checked against this file's own model of that computation (the same
 * codes, summed in double) within that float term alone, and bit for bit
 * against a scalar model of the int8 contract (contract_model: the same
 * codes, exact integer unit sums, fmaf in the contract's order). avx2
 * quantises as avx512vnni for the types it quantises (all but MXFP4): the
 * same checks, and avx512vnni's bits where this CPU runs both. */
#include "harness.h"

#include "gguf/gguf.h"
#include "kernels/kernels-impl.h"
#include "tensor/tensor.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) { return nm_test_frand(&rng); }

static uint8_t random_byte(void) {
    frand();
    return (uint8_t)(rng >> 40);
}

/* An f16 scale of magnitude in [lo, 3 lo) and random sign. */
static void put_scale(uint8_t *p, float lo) {
    const float v = lo * (2.0f + frand());
    uint16_t h = nm_f32_to_f16(frand() < 0 ? -v : v);
    memcpy(p, &h, 2);
}

/* Random weights of a type as stored, and the same values as floats. Blocks
 * of the quantised types get random bytes, then f16 scales of a sensible
 * size (random bytes there could be infinities). */
static uint8_t *make_weights(uint32_t type, int64_t n, int64_t k, float *wf, size_t *row_bytes) {
    CHECK(nm_dtype_row_bytes(type, k, row_bytes));
    uint8_t *w = calloc((size_t)n, *row_bytes);
    const nm_dtype_traits *tr = nm_dtype_traits_of(type);
    for (int64_t j = 0; j < n; j++) {
        uint8_t *row = w + (size_t)j * *row_bytes;
        if (tr->block_size > 1) {
            for (size_t i = 0; i < *row_bytes; i++)
                row[i] = random_byte();
            for (int64_t b = 0; b < k / tr->block_size; b++) {
                uint8_t *blk = row + b * tr->block_bytes;
                switch (type) {
                case NM_DTYPE_Q8_0:
                case NM_DTYPE_Q4_0:
                    put_scale(blk, 0.01f);
                    break;
                case NM_DTYPE_Q4_K:
                case NM_DTYPE_Q5_K:
                    put_scale(blk, 0.001f);    /* d: times a 6-bit scale */
                    put_scale(blk + 2, 0.01f); /* dmin */
                    break;
                case NM_DTYPE_MXFP4: /* a power of two from 2^-10 to 2^-2 */
                    blk[0] = (uint8_t)(118 + random_byte() % 9);
                    break;
                default: /* Q6_K: d last */
                    put_scale(blk + NM_Q6_K_BYTES - 2, 0.0005f);
                }
            }
        } else {
            for (int64_t q = 0; q < k; q++) {
                float v = frand();
                if (type == NM_DTYPE_F32) {
                    memcpy(row + 4 * q, &v, 4);
                } else {
                    uint16_t h = type == NM_DTYPE_F16 ? nm_f32_to_f16(v) : nm_f32_to_bf16(v);
                    memcpy(row + 2 * q, &h, 2);
                }
            }
        }
        nm_dequantize_row((nm_dtype)type, row, wf + j * k, k);
    }
    return w;
}

/* The activation quantisation avx512vnni documents, written independently:
 * per block of 32, d = max|x| / 127 and q = nearest-even integer of
 * x * (1 / d) (all 0 when d is below FLT_MIN). Gives d per block in
 * d[k / 32] and the codes in q[k]. */
static void quantise_model(const float *x, int64_t k, float *d, int *q) {
    for (int64_t b = 0; b < k / 32; b++) {
        float amax = 0;
        for (int i = 0; i < 32; i++)
            if (fabsf(x[32 * b + i]) > amax) amax = fabsf(x[32 * b + i]);
        d[b] = amax / 127.0f;
        if (d[b] < FLT_MIN) d[b] = 0;
        const float id = d[b] > 0 ? 1.0f / d[b] : 0.0f;
        for (int i = 0; i < 32; i++)
            q[32 * b + i] = (int)nearbyintf(x[32 * b + i] * id);
    }
}

/* Per weight, the magnitude its float rounding is relative to: |w| for
 * Q8_0, Q4_0 and Q6_K; for Q4_K/Q5_K, whose w = (d sc) q - dmin mn is a
 * difference that can cancel, |w| + 2 dmin mn. a: [n][k]. */
static void rounding_magnitudes(uint32_t type, const uint8_t *w, size_t rb, const float *wf,
                                int64_t n, int64_t k, double *a) {
    for (int64_t j = 0; j < n; j++)
        for (int64_t p = 0; p < k; p++) {
            double mins = 0;
            if (type == NM_DTYPE_Q4_K || type == NM_DTYPE_Q5_K) {
                const uint8_t *blk =
                    w + j * rb +
                    (size_t)(p / 256) * (type == NM_DTYPE_Q4_K ? NM_Q4_K_BYTES : NM_Q5_K_BYTES);
                uint16_t h;
                uint8_t sc, mn;
                memcpy(&h, blk + 2, 2);
                nm_k4_scale_min((int)(p % 256 / 32), blk + 4, &sc, &mn);
                mins = 2.0 * fabs((double)nm_f16_to_f32(h) * mn);
            }
            a[j * k + p] = fabs((double)wf[j * k + p]) + mins;
        }
}

/* The stored code of element e (0..31) of unit u (32 elements) of a row of
 * a type avx512vnni quantises for, as its contract (avx512vnni.c) reads
 * it: Q8_0 signed, Q4_0 0..15 (offset 8), MXFP4 the doubled E2M1 value
 * (nm_mxfp4_values, -12..12), Q4_K 0..15, Q5_K 0..31, Q6_K 0..63 (offset
 * 32). From the byte layouts in tensor.h, written apart from
 * the kernels. */
static int unit_code(uint32_t type, const uint8_t *row, int64_t u, int e) {
    switch (type) {
    case NM_DTYPE_Q8_0:
        return (int8_t)row[u * NM_Q8_0_BYTES + 2 + e];
    case NM_DTYPE_Q4_0: {
        const uint8_t b = row[u * NM_Q4_0_BYTES + 2 + e % 16];
        return e < 16 ? b & 15 : b >> 4;
    }
    case NM_DTYPE_MXFP4: {
        const uint8_t b = row[u * NM_MXFP4_BYTES + 1 + e % 16];
        return nm_mxfp4_values[e < 16 ? b & 15 : b >> 4];
    }
    case NM_DTYPE_Q4_K:
    case NM_DTYPE_Q5_K: {
        const int five = type == NM_DTYPE_Q5_K, j = (int)(u % 8);
        const uint8_t *sb = row + u / 8 * (five ? NM_Q5_K_BYTES : NM_Q4_K_BYTES);
        const uint8_t b = sb[16 + (five ? 32 : 0) + 32 * (j / 2) + e];
        int q = j % 2 ? b >> 4 : b & 15;
        if (five && (sb[16 + e] >> j & 1)) q += 16;
        return q;
    }
    default: { /* Q6_K: element 32g + e of half h */
        const uint8_t *sb = row + u / 8 * NM_Q6_K_BYTES;
        const int h = (int)(u % 8) / 4, g = (int)(u % 4);
        const uint8_t l = sb[64 * h + 32 * (g & 1) + e];
        return (g < 2 ? l & 15 : l >> 4) | ((sb[128 + 32 * h + e] >> (2 * g) & 3) << 4);
    }
    }
}

/* One output of the int8 contract at the top of avx512vnni.c, modelled in
 * scalar C: row (the weights as stored, k elements), the activation codes
 * q[k] and block scales d[k / 32] (quantise_model). Integer sums in int64,
 * the float steps with fmaf in the contract's order. */
static float contract_model(uint32_t type, const uint8_t *row, const int *q, const float *d,
                            int64_t k) {
    float acc = 0;
    for (int64_t v = 0; v < k / 32; v++) {
        /* Q6_K: units 0, 2, 1, 3 of each half */
        static const int q6_order[8] = {0, 2, 1, 3, 4, 6, 5, 7};
        const int64_t u = type == NM_DTYPE_Q6_K ? v / 8 * 8 + q6_order[v % 8] : v;
        const int *qu = q + 32 * u;
        int64_t dot[2] = {0, 0}, sum_q = 0;
        const int off = type == NM_DTYPE_Q4_0 ? 8 : type == NM_DTYPE_Q6_K ? 32 : 0;
        for (int e = 0; e < 32; e++) {
            dot[e / 16] += (int64_t)(unit_code(type, row, u, e) - off) * qu[e];
            sum_q += qu[e];
        }
        uint16_t h;
        switch (type) {
        case NM_DTYPE_Q8_0:
        case NM_DTYPE_Q4_0:
            memcpy(&h, row + u * (type == NM_DTYPE_Q8_0 ? NM_Q8_0_BYTES : NM_Q4_0_BYTES), 2);
            acc = fmaf((float)(dot[0] + dot[1]), nm_f16_to_f32(h) * d[u], acc);
            break;
        case NM_DTYPE_MXFP4:
            acc = fmaf((float)(dot[0] + dot[1]),
                       nm_e8m0_half_to_f32(row[u * NM_MXFP4_BYTES]) * d[u], acc);
            break;
        case NM_DTYPE_Q4_K:
        case NM_DTYPE_Q5_K: {
            const uint8_t *sb =
                row + u / 8 * (type == NM_DTYPE_Q4_K ? NM_Q4_K_BYTES : NM_Q5_K_BYTES);
            uint8_t sc, mn;
            uint16_t hm;
            memcpy(&h, sb, 2);
            memcpy(&hm, sb + 2, 2);
            nm_k4_scale_min((int)(u % 8), sb + 4, &sc, &mn);
            acc = fmaf((float)(dot[0] + dot[1]), nm_f16_to_f32(h) * (float)sc * d[u], acc);
            acc = fmaf(nm_f16_to_f32(hm) * (float)mn, -(d[u] * (float)sum_q), acc);
            break;
        }
        default: { /* Q6_K: scales 2u and 2u + 1 of the super-block */
            const uint8_t *sb = row + u / 8 * NM_Q6_K_BYTES;
            const int64_t sc1 = (int8_t)sb[192 + 2 * (u % 8)], sc2 = (int8_t)sb[193 + 2 * (u % 8)];
            memcpy(&h, sb + NM_Q6_K_BYTES - 2, 2);
            acc = fmaf((float)(sc1 * dot[0] + sc2 * dot[1]), nm_f16_to_f32(h) * d[u], acc);
        }
        }
    }
    return acc;
}

/* Outputs (y[m][n]) that are not contract_model's bits; w: the rows as
 * stored (row_bytes rb). */
static int check_contract(uint32_t type, const uint8_t *w, size_t rb, const float *x,
                          const float *y, int64_t m, int64_t n, int64_t k) {
    float *d = malloc((size_t)(k / 32) * sizeof(float));
    int *q = malloc((size_t)k * sizeof(int));
    int bad = 0;
    for (int64_t i = 0; i < m; i++) {
        quantise_model(x + i * k, k, d, q);
        for (int64_t j = 0; j < n; j++) {
            const float want = contract_model(type, w + (size_t)j * rb, q, d, k);
            if (memcmp(&want, &y[i * n + j], sizeof want) != 0) {
                if (bad < 3)
                    fprintf(stderr, "  y[%lld][%lld] = %.9g, the contract's model %.9g\n",
                            (long long)i, (long long)j, y[i * n + j], want);
                bad++;
            }
        }
    }
    free(d);
    free(q);
    return bad;
}

/* Outputs of avx512vnni (y[m][n], activations quantised) outside the
 * tolerance against the reference yr, or against the model (the same codes
 * summed in double); a: the weights' rounding magnitudes; worst relative
 * error against yr in *worst. */
static int check_vnni(const float *x, const float *wf, const double *a, const float *y,
                      const float *yr, int64_t m, int64_t n, int64_t k, double *worst) {
    float *d = malloc((size_t)(k / 32) * sizeof(float));
    int *q = malloc((size_t)k * sizeof(int));
    const double u = 0x1.0p-24, nb = (double)(k / 32);
    int bad = 0;
    for (int64_t i = 0; i < m; i++) {
        quantise_model(x + i * k, k, d, q);
        for (int64_t j = 0; j < n; j++) {
            const float *wj = wf + j * k;
            double mag = 0, step = 0, qmag = 0, model = 0;
            for (int64_t p = 0; p < k; p++) {
                const double db = d[p / 32];
                mag += fabs((double)x[i * k + p] * wj[p]);
                step += fabs((double)wj[p]) * db;
                qmag += a[j * k + p] * (fabs((double)x[i * k + p]) + db);
                model += (double)wj[p] * (db * q[p]);
            }
            const double got = y[i * n + j], fl = (nb + 4) * u * qmag + 1e-30;
            const double tol = step * (0.5 + 0x1.0p-14) + 2.0 * (double)k * u * mag + fl;
            const double e = fabs(got - yr[i * n + j]);
            if (!(e <= tol) || !(fabs(got - model) <= fl)) {
                if (bad < 3)
                    fprintf(stderr,
                            "  y[%lld][%lld] = %.9g: ref %.9g (tol %.3g), model %.9g (tol %.3g)\n",
                            (long long)i, (long long)j, got, yr[i * n + j], tol, model, fl);
                bad++;
            }
            if (e / (mag + 1e-30) > *worst) *worst = e / (mag + 1e-30);
        }
    }
    free(d);
    free(q);
    return bad;
}

/* A matrix in the variant's own layout (nm_mat_repack) gives the bits of
 * the file's, y, on every row count and column range, also ranges that
 * start and end inside a group of rows, also while a variant that does not
 * read the layout is in use; avx2 writes the bytes avx512vnni writes. */
static void check_repacked(const nm_mat *mat, const float *x, int64_t m, const float *y) {
    const int64_t n = mat->n, k = mat->k;
    const size_t bytes = (size_t)n * mat->row_bytes;
    uint8_t *buf = malloc(bytes);
    const nm_mat pk = nm_mat_repack(mat, buf);
    CHECK_INT_EQ(pk.layout, NM_LAYOUT_PANEL16);
    CHECK(!nm_mat_repack_wanted(&pk));
#if defined(__x86_64__)
    /* both variants that write the layout write the same bytes */
    if (nm_kernels_active() == NM_KERNELS_AVX2 && nm_kernels_isa_supported(NM_KERNELS_AVX512VNNI)) {
        uint8_t *other = malloc(bytes);
        nm_avx512vnni_repack(mat, other);
        CHECK(memcmp(buf, other, bytes) == 0);
        free(other);
    }
#endif
    float *yp = malloc((size_t)(m * n) * sizeof(float));
    nm_matmul_forward(&pk, x, k, m, yp, n, 0, n);
    CHECK(memcmp(yp, y, (size_t)(m * n) * sizeof(float)) == 0);
    /* ranges cut at 5, 21 and n - 3 (inside groups of 16 and the tail) */
    memset(yp, 0, (size_t)(m * n) * sizeof(float));
    const int64_t cuts[] = {0, 5, 21 < n ? 21 : n, n - 3 > 21 ? n - 3 : n, n};
    const nm_kernels_isa was = nm_kernels_active();
    CHECK(nm_kernels_force(NM_KERNELS_REF));
    for (int c = 0; c + 1 < (int)(sizeof cuts / sizeof cuts[0]); c++)
        if (cuts[c] < cuts[c + 1]) nm_matmul_forward(&pk, x, k, m, yp, n, cuts[c], cuts[c + 1]);
    CHECK(nm_kernels_force(was));
    CHECK(memcmp(yp, y, (size_t)(m * n) * sizeof(float)) == 0);
    /* one row at a time; the last one also on the cut ranges (one row
     * reads whole groups and parts of them differently under avx2) */
    for (int64_t i = 0; i < m; i++)
        nm_matmul_forward(&pk, x + i * k, k, 1, yp + i * n, n, 0, n);
    CHECK(memcmp(yp, y, (size_t)(m * n) * sizeof(float)) == 0);
    memset(yp, 0, (size_t)n * sizeof(float));
    for (int c = 0; c + 1 < (int)(sizeof cuts / sizeof cuts[0]); c++)
        if (cuts[c] < cuts[c + 1])
            nm_matmul_forward(&pk, x + (m - 1) * k, k, 1, yp, n, cuts[c], cuts[c + 1]);
    CHECK(memcmp(yp, y + (m - 1) * n, (size_t)n * sizeof(float)) == 0);
    free(yp);
    free(buf);
}

/* amx against the code it shares and its two builds: for quantised weights
 * the bits of avx512vnni (the same int32 sums, scaled in the same order),
 * from the instructions and from the emulated tiles alike; for BF16 the
 * instructions within (K/32 + 1) 2^-22 sum|x w| of the emulation, which
 * models each tile product's pair sums (amx-tile.h). y: what the variant
 * in use gave. */
static void check_amx(const nm_mat *mat, const float *x, int64_t m, const float *y) {
    const int64_t n = mat->n, k = mat->k;
    const size_t bytes = (size_t)(m * n) * sizeof(float);
    float *ye = malloc(bytes), *yh = malloc(bytes), *yv = malloc(bytes);
    nm_matmul_amx_emu_forward(mat, x, k, m, ye, n, 0, n);
    const bool hw = nm_kernels_amx_hardware();
    if (hw) nm_matmul_amx_hw_forward(mat, x, k, m, yh, n, 0, n);
    if (nm_matmul_avx512vnni_quantises(mat->type)) {
        nm_matmul_avx512vnni_forward(mat, x, k, m, yv, n, 0, n);
        CHECK(memcmp(y, yv, bytes) == 0);
        CHECK(memcmp(ye, yv, bytes) == 0);
        if (hw) CHECK(memcmp(yh, yv, bytes) == 0);
    } else {
        CHECK(memcmp(y, nm_kernels_amx_emulated() ? ye : yh, bytes) == 0);
        int bad = 0;
        for (int64_t i = 0; i < m && hw; i++)
            for (int64_t j = 0; j < n; j++) {
                double mag = 0;
                for (int64_t q = 0; q < k; q++)
                    mag += fabs((double)x[i * k + q] *
                                nm_bf16_to_f32(((const uint16_t *)mat->data)[j * k + q]));
                const double tol = (double)(k / 32 + 1) * 0x1.0p-22 * mag + 1e-30;
                if (fabs((double)yh[i * n + j] - ye[i * n + j]) > tol) bad++;
            }
        CHECK_INT_EQ(bad, 0);
    }
    free(ye);
    free(yh);
    free(yv);
}

/* nm_matmul_swiglu_forward (gate mat, up a second matrix of its type and
 * shape) against its contract: the bits of the variant's two matmuls and
 * nm_swiglu_forward, on the whole column range and on ranges cut inside
 * groups of 16; for amx also its other build's entry point; and against
 * the reference (reference matmuls, then SwiGLU in double): with eg, eu the
 * matmuls' own errors (checked above), |h - h_ref| <= 1.1 eg |u_ref| +
 * (|g_ref| + eg) eu + 2^-21 (|h_ref| + |u_ref| |g_ref|) (silu' is at most
 * 1.1; expf and the products round). y: the variant's gate output. */
static void check_swiglu(nm_kernels_isa isa, const nm_mat *mat, const float *x, int64_t m,
                         const float *y) {
    const int64_t n = mat->n, k = mat->k;
    size_t rb = 0;
    float *wf = malloc((size_t)(n * k) * sizeof(float));
    uint8_t *w2 = make_weights(mat->type, n, k, wf, &rb);
    nm_mat up = *mat;
    up.data = w2;
    const size_t bytes = (size_t)(m * n) * sizeof(float);
    float *u = malloc(bytes), *want = malloc(bytes), *h = malloc(bytes), *hu = malloc(bytes);
    float *gr = malloc(bytes), *ur = malloc(bytes);
    nm_matmul_forward(&up, x, k, m, u, n, 0, n);
    nm_swiglu_forward(y, u, want, m * n);
    memset(h, 0, bytes);
    nm_matmul_swiglu_forward(mat, &up, x, k, m, h, n, hu, n, 0, n);
    CHECK(memcmp(h, want, bytes) == 0);
    CHECK(memcmp(hu, u, bytes) == 0);
    /* column ranges cut at 5 and 21, one call each */
    memset(h, 0, bytes);
    const int64_t cuts[] = {0, 5 < n ? 5 : n, 21 < n ? 21 : n, n};
    for (int c = 0; c < 3; c++)
        if (cuts[c] < cuts[c + 1])
            nm_matmul_swiglu_forward(mat, &up, x, k, m, h, n, hu, n, cuts[c], cuts[c + 1]);
    CHECK(memcmp(h, want, bytes) == 0);
    if (nm_mat_repack_wanted(mat)) { /* both in the variant's own layout: the same bits */
        uint8_t *pg = malloc((size_t)n * mat->row_bytes), *pu = malloc((size_t)n * mat->row_bytes);
        const nm_mat kg = nm_mat_repack(mat, pg), ku = nm_mat_repack(&up, pu);
        memset(h, 0, bytes);
        nm_matmul_swiglu_forward(&kg, &ku, x, k, m, h, n, hu, n, 0, n);
        CHECK(memcmp(h, want, bytes) == 0);
        /* one of them repacked: two matmuls, the same bits too */
        memset(h, 0, bytes);
        nm_matmul_swiglu_forward(&kg, &up, x, k, m, h, n, hu, n, 0, n);
        CHECK(memcmp(h, want, bytes) == 0);
        free(pg);
        free(pu);
    }
#if defined(__x86_64__)
    if (isa == NM_KERNELS_AMX) { /* the emulated tiles give the same bits as the build in use */
        memset(h, 0, bytes);
        nm_matmul_swiglu_amx_emu_forward(mat, &up, x, k, m, h, n, hu, n, 0, n);
        if (nm_kernels_amx_emulated() || mat->type != NM_DTYPE_BF16)
            CHECK(memcmp(h, want, bytes) == 0);
        if (nm_kernels_amx_hardware() && mat->type != NM_DTYPE_BF16) {
            memset(h, 0, bytes);
            nm_matmul_swiglu_amx_hw_forward(mat, &up, x, k, m, h, n, hu, n, 0, n);
            CHECK(memcmp(h, want, bytes) == 0);
        }
    }
#endif
    nm_matmul_ref_forward(mat, x, k, m, gr, n, 0, n);
    nm_matmul_ref_forward(&up, x, k, m, ur, n, 0, n);
    int bad = 0;
    for (int64_t i = 0; i < m * n; i++) {
        const double g = gr[i], uu = ur[i], hr = g / (1.0 + exp(-g)) * uu;
        const double eg = fabs((double)y[i] - g), eu = fabs((double)u[i] - uu);
        const double tol = 1.1 * eg * fabs(uu) + (fabs(g) + 1.1 * eg) * eu +
                           0x1.0p-21 * (fabs(hr) + fabs(uu * g)) + 1e-30;
        if (!(fabs((double)want[i] - hr) <= tol)) bad++;
    }
    if (bad)
        fprintf(stderr, "%s matmul_swiglu %s m=%lld n=%lld k=%lld: %d outside\n",
                nm_kernels_isa_name(isa), nm_dtype_name(mat->type), (long long)m, (long long)n,
                (long long)k, bad);
    CHECK_INT_EQ(bad, 0);
    free(w2);
    free(wf);
    free(u);
    free(want);
    free(h);
    free(hu);
    free(gr);
    free(ur);
}

static void check_matmul(nm_kernels_isa isa, uint32_t type, int64_t m, int64_t n, int64_t k) {
    size_t rb = 0;
    float *wf = malloc((size_t)(n * k) * sizeof(float));
    uint8_t *w = make_weights(type, n, k, wf, &rb);
    float *x = malloc((size_t)(m * k) * sizeof(float));
    float *y = malloc((size_t)(m * n) * sizeof(float));
    float *yr = malloc((size_t)(m * n) * sizeof(float));
    float *y1 = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < m * k; i++)
        x[i] = frand();
    nm_mat mat = {.data = w, .type = type, .n = n, .k = k, .row_bytes = rb};
    nm_matmul_ref_forward(&mat, x, k, m, yr, n, 0, n);
    CHECK(nm_kernels_force(isa));
    nm_matmul_forward(&mat, x, k, m, y, n, 0, n);
    int bad = 0;
    double worst = 0;
    const int vnni = ((isa == NM_KERNELS_AVX512VNNI || isa == NM_KERNELS_AMX) &&
                      nm_matmul_avx512vnni_quantises(type)) ||
                     (isa == NM_KERNELS_AVX2 && nm_matmul_avx2_quantises(type));
    if (vnni) {
        double *a = malloc((size_t)(n * k) * sizeof(double));
        rounding_magnitudes(type, w, rb, wf, n, k, a);
        bad = check_vnni(x, wf, a, y, yr, m, n, k, &worst);
        /* the contract's bits, from its scalar model; avx2 also the bits
         * of avx512vnni where this CPU runs both */
        bad += check_contract(type, w, rb, x, y, m, n, k);
        if (isa == NM_KERNELS_AVX2 && nm_kernels_isa_supported(NM_KERNELS_AVX512VNNI)) {
            float *yv = malloc((size_t)(m * n) * sizeof(float));
            nm_matmul_avx512vnni_forward(&mat, x, k, m, yv, n, 0, n);
            CHECK(memcmp(y, yv, (size_t)(m * n) * sizeof(float)) == 0);
            free(yv);
        }
        free(a);
    }
    for (int64_t i = 0; i < m && !vnni; i++)
        for (int64_t j = 0; j < n; j++) {
            double mag = 0;
            for (int64_t q = 0; q < k; q++)
                mag += fabs((double)x[i * k + q] * wf[j * k + q]);
            double e = fabs((double)y[i * n + j] - yr[i * n + j]);
            double tol = 2.0 * (double)k * 0x1.0p-24 * mag + 1e-30;
            /* activations rounded to bfloat16: up to 2^-9 each, both sides */
            /* (avx512vnni may hand BF16 weights to avx512bf16) */
            if ((isa == NM_KERNELS_AVX512BF16 || isa == NM_KERNELS_AVX512VNNI ||
                 isa == NM_KERNELS_AMX) &&
                type == NM_DTYPE_BF16)
                tol += 0x1.0p-8 * mag;
            /* and Q8_0 weights too: 2^-9 more */
            if (isa == NM_KERNELS_AVX512BF16 && type == NM_DTYPE_Q8_0) tol += 0x1.8p-8 * mag;
            if (e > tol) bad++;
            if (e / (mag + 1e-30) > worst) worst = e / (mag + 1e-30);
        }
    if (bad)
        fprintf(stderr, "%s matmul %s m=%lld n=%lld k=%lld: %d outside, worst rel %.3g\n",
                nm_kernels_isa_name(isa), nm_dtype_name(type), (long long)m, (long long)n,
                (long long)k, bad, worst);
    CHECK_INT_EQ(bad, 0);
#if defined(__x86_64__)
    /* avx512vnni hands BF16 weights to one of two variants by CPU vendor
     * (nm_kernels_bf16_in_fp32): its outputs are that variant's bits */
    if (isa == NM_KERNELS_AVX512VNNI && type == NM_DTYPE_BF16) {
        float *yd = malloc((size_t)(m * n) * sizeof(float));
        if (nm_kernels_bf16_in_fp32())
            nm_matmul_avx512_forward(&mat, x, k, m, yd, n, 0, n);
        else
            nm_matmul_avx512bf16_forward(&mat, x, k, m, yd, n, 0, n);
        CHECK(memcmp(y, yd, (size_t)(m * n) * sizeof(float)) == 0);
        free(yd);
    }
#endif
    /* the last row alone, over a column range split in two: the same bits */
    const int64_t split = n / 2 + (n > 2);
    nm_matmul_forward(&mat, x + (m - 1) * k, k, 1, y1, n, 0, split);
    nm_matmul_forward(&mat, x + (m - 1) * k, k, 1, y1, n, split, n);
    CHECK(memcmp(y1, y + (m - 1) * n, (size_t)n * sizeof(float)) == 0);
    /* the first rows, up to RT_MAX + 1 of them, on split column ranges */
    const int64_t mf = m < 5 ? m : 5;
    float *yf = malloc((size_t)(mf * n) * sizeof(float));
    nm_matmul_forward(&mat, x, k, mf, yf, n, 0, split);
    nm_matmul_forward(&mat, x, k, mf, yf, n, split, n);
    CHECK(memcmp(yf, y, (size_t)(mf * n) * sizeof(float)) == 0);
    free(yf);
    if (nm_mat_repack_wanted(&mat)) check_repacked(&mat, x, m, y);
    check_swiglu(isa, &mat, x, m, y);
#if defined(__x86_64__)
    if (isa == NM_KERNELS_AMX && (type == NM_DTYPE_BF16 || nm_matmul_avx512vnni_quantises(type)))
        check_amx(&mat, x, m, y);
#endif
    free(w);
    free(wf);
    free(x);
    free(y);
    free(yr);
    free(y1);
}

/* MXFP4 blocks whose E8M0 scales are all in [e_lo, e_hi] (the random
 * ones of make_weights stay in 118..126), with activations in
 * (-x_scale, x_scale) so that the products are normal floats: 0 and 1
 * give the denormal scales 2^-128 and 2^-127, 250 gives 2^122. Checked as
 * check_matmul checks a variant that quantises: against the reference and
 * the model, the repacked layout's bits, and amx's. */
static void check_mxfp4_scales(nm_kernels_isa isa, int e_lo, int e_hi, float x_scale, int64_t m) {
    const int64_t n = 35, k = 320;
    size_t rb = 0;
    float *wf = malloc((size_t)(n * k) * sizeof(float));
    uint8_t *w = make_weights(NM_DTYPE_MXFP4, n, k, wf, &rb);
    for (int64_t j = 0; j < n; j++) {
        for (int64_t b = 0; b < k / NM_MXFP4_BLOCK; b++)
            w[(size_t)j * rb + (size_t)b * NM_MXFP4_BYTES] =
                (uint8_t)(e_lo + random_byte() % (e_hi - e_lo + 1));
        nm_dequantize_row(NM_DTYPE_MXFP4, w + (size_t)j * rb, wf + j * k, k);
    }
    float *x = malloc((size_t)(m * k + 2 * m * n) * sizeof(float)); /* x, then y and yr */
    float *y = x + m * k, *yr = y + m * n;
    double *a = malloc((size_t)(n * k) * sizeof(double));
    for (int64_t i = 0; i < m * k; i++)
        x[i] = x_scale * frand();
    const nm_mat mat = {.data = w, .type = NM_DTYPE_MXFP4, .n = n, .k = k, .row_bytes = rb};
    nm_matmul_ref_forward(&mat, x, k, m, yr, n, 0, n);
    CHECK(nm_kernels_force(isa));
    nm_matmul_forward(&mat, x, k, m, y, n, 0, n);
    rounding_magnitudes(NM_DTYPE_MXFP4, w, rb, wf, n, k, a);
    double worst = 0;
    const int bad = check_vnni(x, wf, a, y, yr, m, n, k, &worst);
    if (bad)
        fprintf(stderr, "%s mxfp4 scales %d..%d, m=%lld: %d outside, worst rel %.3g\n",
                nm_kernels_isa_name(isa), e_lo, e_hi, (long long)m, bad, worst);
    CHECK_INT_EQ(bad, 0);
    check_repacked(&mat, x, m, y);
#if defined(__x86_64__)
    if (isa == NM_KERNELS_AMX) check_amx(&mat, x, m, y);
#endif
    free(w);
    free(wf);
    free(x);
    free(a);
}

/* Attention outputs against the reference's: they are averages of values
 * in [-1, 1], float sums of t terms. */
static void check_attention_out(const char *what, nm_kernels_isa isa, const float *o,
                                const float *orf, int nh, int nkv, int hd, int t) {
    double worst = 0;
    for (int i = 0; i < nh * hd; i++)
        if (fabs(o[i] - orf[i]) > worst) worst = fabs(o[i] - orf[i]);
    if (!(worst < 1e-6 * (4 + hd + t)))
        fprintf(stderr, "%s %sattention %d/%d x %d, %d positions: max diff %.3g\n",
                nm_kernels_isa_name(isa), what, nh, nkv, hd, t, worst);
    CHECK(worst < 1e-6 * (4 + hd + t));
}

static void check_attention(nm_kernels_isa isa, int nh, int nkv, int hd, int t) {
    const int64_t stride = (int64_t)nkv * hd;
    float *q = malloc((size_t)nh * hd * sizeof(float));
    float *k = malloc((size_t)t * stride * sizeof(float));
    float *v = malloc((size_t)t * stride * sizeof(float));
    float *o = malloc((size_t)nh * hd * sizeof(float));
    float *orf = malloc((size_t)nh * hd * sizeof(float));
    float *s = malloc((size_t)t * sizeof(float));
    for (int i = 0; i < nh * hd; i++)
        q[i] = frand();
    for (int64_t i = 0; i < t * stride; i++)
        k[i] = frand(), v[i] = frand();
    nm_attention_ref_forward(q, k, v, stride, t, nh, nkv, hd, 0.3f, NULL, orf, s);
    CHECK(nm_kernels_force(isa));
    nm_attention_forward(q, k, v, stride, 0, t, nh, nkv, hd, 0.3f, NULL, o, s);
    check_attention_out("", isa, o, orf, nh, nkv, hd, t);
    /* a window (the last half of the keys) and sink logits */
    float *sinks = malloc((size_t)nh * sizeof(float));
    for (int i = 0; i < nh; i++)
        sinks[i] = 2 * frand();
    const int kv0 = t / 2;
    nm_attention_ref_forward(q, k + kv0 * stride, v + kv0 * stride, stride, t - kv0, nh, nkv, hd,
                             0.3f, sinks, orf, s);
    nm_attention_forward(q, k, v, stride, kv0, t, nh, nkv, hd, 0.3f, sinks, o, s);
    check_attention_out("window+sinks ", isa, o, orf, nh, nkv, hd, t - kv0);
    free(sinks);
    free(q);
    free(k);
    free(v);
    free(o);
    free(orf);
    free(s);
}

/* nm_kernels_prepare's release callback: the source bytes it was handed. */
static void count_released(void *ctx, const void *data, size_t n_bytes) {
    (void)data;
    __atomic_add_fetch((size_t *)ctx, n_bytes, __ATOMIC_RELAXED);
}

/* Whether Linux gives transparent huge pages, read here on its own. */
static bool thp_enabled(void) {
    char line[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (f) {
        if (!fgets(line, sizeof line, f)) line[0] = 0;
        fclose(f);
    }
    return strstr(line, "[always]") || strstr(line, "[madvise]");
}

/* nm_kernels_prepare under the variant in use: a stack of 3 BF16 matrices
 * and one matrix each of F16, Q8_0, F32 and MXFP4. Those the variant wants
 * (nm_mat_repack_wanted, nm_mat_copy_wanted, asked before) move into the
 * mapping, in its layout or as they are, the others stay; under avx2
 * explicitly the float ones as they are (where the system gives huge
 * pages), Q8_0 repacked and MXFP4 (which it reads by rows) nowhere, and
 * under every other variant no float one. Within a budget (of bytes of
 * copies) of tight: 0, any; 1, the repacked ones' bytes (only those are
 * made); 2, one byte less (none is). Every matmul gives the same bits after
 * as before, the callback is handed every byte that was copied, and the
 * bytes not copied are counted. */
static void check_prepare(nm_kernels_isa isa, int tight) {
    enum { N_ITEMS = 5, M = 3 };
    const uint32_t types[N_ITEMS] = {NM_DTYPE_BF16, NM_DTYPE_F16, NM_DTYPE_Q8_0, NM_DTYPE_F32,
                                     NM_DTYPE_MXFP4};
    const int32_t counts[N_ITEMS] = {3, 1, 1, 1, 1};
    const int64_t ns[N_ITEMS] = {20, 17, 35, 10, 18}, ks[N_ITEMS] = {96, 64, 256, 64, 64};
    nm_mat mats[N_ITEMS];
    nm_prepare_item items[N_ITEMS];
    uint8_t *data[N_ITEMS];
    float *y[N_ITEMS], *x = malloc(M * 256 * sizeof(float));
    bool repack[N_ITEMS], as_is[N_ITEMS];
    size_t moved_bytes = 0, released = 0, repack_bytes = 0, unfit = 0;
    int32_t n_moved = 0, n_as_is = 0;
    CHECK(nm_kernels_force(isa));
    for (int64_t i = 0; i < M * 256; i++)
        x[i] = frand();
    for (int i = 0; i < N_ITEMS; i++) {
        const int64_t n = ns[i] * counts[i], k = ks[i];
        float *wf = malloc((size_t)(n * k) * sizeof(float));
        size_t rb = 0;
        data[i] = make_weights(types[i], n, k, wf, &rb);
        free(wf);
        mats[i] = (nm_mat){.data = data[i], .type = types[i], .n = ns[i], .k = k, .row_bytes = rb};
        items[i] = (nm_prepare_item){&mats[i], (size_t)ns[i] * rb, counts[i]};
        repack[i] = nm_mat_repack_wanted(&mats[i]);
        as_is[i] = !repack[i] && nm_mat_copy_wanted(&mats[i]);
        y[i] = malloc((size_t)(M * n) * sizeof(float));
        for (int32_t e = 0; e < counts[i]; e++) {
            const nm_mat me = nm_expert_mat(&mats[i], items[i].stride, e);
            nm_matmul_forward(&me, x, k, M, y[i] + e * ns[i], n, 0, ns[i]);
        }
    }
    CHECK(nm_kernels_huge_pages() == thp_enabled());
    const bool floats = isa == NM_KERNELS_AVX2 && thp_enabled();
    CHECK(as_is[0] == floats && as_is[1] == floats && as_is[3] == floats);
    CHECK(repack[2] ==
          (isa == NM_KERNELS_AVX2 || isa == NM_KERNELS_AVX512VNNI || isa == NM_KERNELS_AMX));
    if (isa == NM_KERNELS_AVX2) CHECK(!repack[4] && !as_is[4]);
    /* what fits the budget: the bytes of each copy rounded up to a line */
    for (int i = 0; i < N_ITEMS; i++)
        repack_bytes +=
            repack[i] ? ((size_t)ns[i] * counts[i] * mats[i].row_bytes + 63) / 64 * 64 : 0;
    for (int i = 0; i < N_ITEMS; i++) {
        const size_t bytes = (size_t)ns[i] * counts[i] * mats[i].row_bytes;
        if ((as_is[i] && tight) || (repack[i] && tight == 2)) {
            as_is[i] = repack[i] = false;
            unfit += (bytes + 63) / 64 * 64;
        }
        if (repack[i] || as_is[i]) {
            n_moved++;
            n_as_is += as_is[i];
            moved_bytes += bytes;
        }
    }
    nm_prepared prep;
    nm_error err = {0};
    const uint64_t budget = tight == 0   ? UINT64_MAX
                            : tight == 1 ? repack_bytes
                                         : (repack_bytes > 0 ? repack_bytes - 1 : 0);
    CHECK_INT_EQ(nm_kernels_prepare(items, N_ITEMS, budget, count_released, &released, &prep, &err),
                 NM_OK);
    CHECK(prep.unfit_bytes == unfit);
    CHECK_INT_EQ(prep.n_tensors, n_moved);
    CHECK_INT_EQ(prep.n_as_is, n_as_is);
    CHECK(prep.bytes >= moved_bytes && (prep.data != NULL) == (n_moved > 0));
    CHECK(released == moved_bytes);
    const uint8_t *lo = prep.data, *hi = lo + prep.bytes;
    for (int i = 0; i < N_ITEMS; i++) {
        const uint8_t *at = mats[i].data;
        const bool moved = repack[i] || as_is[i];
        CHECK(moved ? at >= lo && at + (size_t)ns[i] * counts[i] * mats[i].row_bytes <= hi
                    : at == data[i]);
        CHECK_INT_EQ(mats[i].layout, repack[i] ? NM_LAYOUT_PANEL16 : NM_LAYOUT_ROWS);
        if (as_is[i])
            CHECK(memcmp(at, data[i], (size_t)ns[i] * counts[i] * mats[i].row_bytes) == 0);
        const int64_t n = ns[i] * counts[i];
        float *y2 = malloc((size_t)(M * n) * sizeof(float));
        for (int32_t e = 0; e < counts[i]; e++) {
            const nm_mat me = nm_expert_mat(&mats[i], items[i].stride, e);
            nm_matmul_forward(&me, x, ks[i], M, y2 + e * ns[i], n, 0, ns[i]);
        }
        CHECK(memcmp(y2, y[i], (size_t)(M * n) * sizeof(float)) == 0);
        free(y2);
        free(y[i]);
        free(data[i]);
    }
    nm_prepared_free(&prep);
    CHECK(prep.data == NULL && prep.bytes == 0);
    free(x);
}

/* The F16-cache attention against the reference over the same halves. */
static void check_attention_f16(nm_kernels_isa isa, int nh, int nkv, int hd, int t) {
    const int64_t stride = (int64_t)nkv * hd;
    float *q = malloc((size_t)nh * hd * sizeof(float));
    uint16_t *k = malloc((size_t)t * stride * 2), *v = malloc((size_t)t * stride * 2);
    float *o = malloc((size_t)nh * hd * sizeof(float)),
          *orf = malloc((size_t)nh * hd * sizeof(float));
    float *s = malloc((size_t)t * sizeof(float));
    for (int i = 0; i < nh * hd; i++)
        q[i] = frand();
    for (int64_t i = 0; i < t * stride; i++)
        k[i] = nm_f32_to_f16(frand()), v[i] = nm_f32_to_f16(frand());
    nm_attention_f16_ref_forward(q, k, v, stride, t, nh, nkv, hd, 0.3f, NULL, orf, s);
    CHECK(nm_kernels_force(isa));
    nm_attention_f16_forward(q, k, v, stride, 0, t, nh, nkv, hd, 0.3f, NULL, o, s);
    check_attention_out("f16 ", isa, o, orf, nh, nkv, hd, t);
    float *sinks = malloc((size_t)nh * sizeof(float));
    for (int i = 0; i < nh; i++)
        sinks[i] = 2 * frand();
    const int kv0 = t / 2;
    nm_attention_f16_ref_forward(q, k + kv0 * stride, v + kv0 * stride, stride, t - kv0, nh, nkv,
                                 hd, 0.3f, sinks, orf, s);
    nm_attention_f16_forward(q, k, v, stride, kv0, t, nh, nkv, hd, 0.3f, sinks, o, s);
    check_attention_out("f16 window+sinks ", isa, o, orf, nh, nkv, hd, t - kv0);
    free(sinks);
    free(q);
    free(k);
    free(v);
    free(o);
    free(orf);
    free(s);
}

static void test_q8_0_dequant(void) {
    uint8_t blk[2 * 34];
    for (int b = 0; b < 2; b++) {
        uint16_t d = nm_f32_to_f16(b ? -0.5f : 0.25f);
        memcpy(blk + b * 34, &d, 2);
        for (int i = 0; i < 32; i++)
            blk[b * 34 + 2 + i] = (uint8_t)(int8_t)(i - 16 + b * 100);
    }
    float out[64];
    nm_dequantize_row(NM_DTYPE_Q8_0, blk, out, 64);
    CHECK(out[0] == 0.25f * -16 && out[31] == 0.25f * 15);
    CHECK(out[32] == -0.5f * 84 && out[63] == -0.5f * 115);
    CHECK(nm_dtype_is_supported(NM_DTYPE_Q8_0));
    size_t rb = 0;
    CHECK(nm_dtype_row_bytes(NM_DTYPE_Q8_0, 2048, &rb) && rb == 2176);
}

/* Dequantised values of one golden row through a variant's matmul: a
 * matrix of N_COPIES copies of the row times the identity, K rows at once
 * (the panel path), then three rows at a time and one at a time (tiles,
 * GEMV); every output must equal the golden value. Returns the mismatches. */
enum { N_COPIES = 9 };
static int identity_mismatches(uint32_t type, const uint8_t *row, size_t rb, int64_t k,
                               const float *want) {
    uint8_t *w = malloc((size_t)N_COPIES * rb);
    float *eye = calloc((size_t)(k * k), sizeof(float));
    float *y = malloc((size_t)(k * N_COPIES) * sizeof(float));
    for (int c = 0; c < N_COPIES; c++)
        memcpy(w + c * rb, row, rb);
    for (int64_t i = 0; i < k; i++)
        eye[i * k + i] = 1.0f;
    const nm_mat mat = {.data = w, .type = type, .n = N_COPIES, .k = k, .row_bytes = rb};
    int bad = 0;
    const int64_t steps[3] = {k, 3, 1};
    for (int s = 0; s < 3; s++) {
        for (int64_t i0 = 0; i0 < k; i0 += steps[s]) {
            const int64_t m = k - i0 < steps[s] ? k - i0 : steps[s];
            nm_matmul_forward(&mat, eye + i0 * k, k, m, y + i0 * N_COPIES, N_COPIES, 0, N_COPIES);
        }
        for (int64_t i = 0; i < k; i++)
            for (int c = 0; c < N_COPIES; c++)
                bad += y[i * N_COPIES + c] != want[i]; /* a -0 value comes back as +0 */
    }
    free(w);
    free(eye);
    free(y);
    return bad;
}

/* Whether a variant multiplies weights of a type by F32 activations
 * exactly (so 1 * w gives w back): not avx512bf16 for BF16 and Q8_0, which
 * it rounds to bfloat16, nor variants that quantise activations. */
static bool multiplies_exactly(nm_kernels_isa isa, uint32_t type) {
    switch (isa) {
    case NM_KERNELS_REF:
    case NM_KERNELS_AVX512:
        return true;
    case NM_KERNELS_AVX2:
        return !nm_matmul_avx2_quantises(type);
    case NM_KERNELS_AVX512BF16:
        return type != NM_DTYPE_BF16 && type != NM_DTYPE_Q8_0;
    default: /* avx512vnni and amx quantise for every quantised type */
        return false;
    }
}

/* Rows of llama.cpp's quantised tiny models, dequantised by ggml's own
 * to_float (dequant.txt: "name type row ne0 v0 ..."; q4_0, q4_K, q5_K, q6_K
 * and q8_0 tensors; mxfp4 ones by ik_llama.cpp's ggml, tests/vectors/
 * tiny-gptoss-mxfp4), bit for bit: nm_dequantize_row, the AVX-512 row
 * dequantisation, and every variant's matmul against the identity. */
static void test_golden_dequant(void) {
    static const char *const models[5] = {
        NM_VECTORS_DIR "/tiny-qwen3moe-q-Q8_0", NM_VECTORS_DIR "/tiny-qwen3moe-q-Q4_0",
        NM_VECTORS_DIR "/tiny-qwen3moe-q-Q4_K_M", NM_VECTORS_DIR "/tiny-qwen3moe-q-Q6_K",
        NM_SOURCE_DIR "/tests/vectors/tiny-gptoss-mxfp4"};
    static char line[1 << 16];
    int rows_of[NM_DTYPE_COUNT] = {0}, mismatches = 0;
    float *want = malloc(4096 * sizeof(float)), *out = malloc(4096 * sizeof(float));
    for (int mi = 0; mi < 5; mi++) {
        char path[512];
        snprintf(path, sizeof path, "%s/model.gguf", models[mi]);
        nm_gguf *g = NULL;
        nm_error err = {0};
        if (nm_gguf_open(path, &g, &err) != NM_OK) {
            fprintf(stderr, "%s\n", err.msg);
            CHECK(!"the quantised golden model opens");
            continue;
        }
        snprintf(path, sizeof path, "%s/dequant.txt", models[mi]);
        FILE *f = fopen(path, "r");
        CHECK(f != NULL);
        while (f && fgets(line, sizeof line, f)) {
            char name[128], type[16];
            long row, ne0;
            int used = 0;
            CHECK(sscanf(line, "%127s %15s %ld %ld%n", name, type, &row, &ne0, &used) == 4);
            if (ne0 <= 0 || ne0 > 4096) continue;
            const nm_gguf_tensor *t = nm_gguf_find_tensor(g, name);
            CHECK(t != NULL && strcmp(nm_dtype_name(t->type), type) == 0 && t->ne[0] == ne0);
            if (!t || !nm_dtype_is_supported(t->type)) continue;
            size_t rb = 0;
            CHECK(nm_dtype_row_bytes(t->type, ne0, &rb));
            const uint8_t *src = (const uint8_t *)t->data + (size_t)row * rb;
            char *p = line + used;
            for (long i = 0; i < ne0; i++)
                want[i] = strtof(p, &p);
            int bad = 0;
            nm_dequantize_row((nm_dtype)t->type, src, out, ne0);
            bad += memcmp(out, want, (size_t)ne0 * sizeof(float)) != 0;
            if (nm_kernels_isa_supported(NM_KERNELS_AVX512)) {
                nm_dequantize_avx512_row(t->type, src, out, ne0);
                bad += memcmp(out, want, (size_t)ne0 * sizeof(float)) != 0;
            }
            for (int isa = 0; isa < NM_KERNELS_COUNT; isa++) {
                if (!multiplies_exactly((nm_kernels_isa)isa, t->type)) continue;
                if (!nm_kernels_force((nm_kernels_isa)isa)) continue;
                const int n = identity_mismatches(t->type, src, rb, ne0, want);
                if (n)
                    fprintf(stderr, "%s: %s %s row %ld: %d values differ\n",
                            nm_kernels_isa_name((nm_kernels_isa)isa), models[mi], name, row, n);
                bad += n != 0;
            }
            if (bad) fprintf(stderr, "%s %s row %ld (%s) differs\n", models[mi], name, row, type);
            mismatches += bad;
            rows_of[t->type]++;
        }
        if (f) fclose(f);
        nm_gguf_close(g);
    }
    free(want);
    free(out);
    printf("golden dequantisation: %d q8_0, %d q4_0, %d q4_K, %d q5_K, %d q6_K, %d mxfp4 rows; "
           "%d differ\n",
           rows_of[NM_DTYPE_Q8_0], rows_of[NM_DTYPE_Q4_0], rows_of[NM_DTYPE_Q4_K],
           rows_of[NM_DTYPE_Q5_K], rows_of[NM_DTYPE_Q6_K], rows_of[NM_DTYPE_MXFP4], mismatches);
    CHECK(rows_of[NM_DTYPE_MXFP4] == 18);
    CHECK(rows_of[NM_DTYPE_Q8_0] >= 20 && rows_of[NM_DTYPE_Q4_0] >= 20);
    CHECK(rows_of[NM_DTYPE_Q4_K] >= 10 && rows_of[NM_DTYPE_Q5_K] >= 4);
    CHECK(rows_of[NM_DTYPE_Q6_K] >= 20);
    CHECK_INT_EQ(mismatches, 0);
}

static void test_names(void) {
    nm_kernels_isa isa;
    CHECK(nm_kernels_isa_parse("avx512", &isa) && isa == NM_KERNELS_AVX512);
    CHECK(!nm_kernels_isa_parse("sse", &isa));
    CHECK(nm_kernels_isa_supported(NM_KERNELS_REF));
    CHECK(strcmp(nm_kernels_isa_name(NM_KERNELS_AVX2), "avx2") == 0);
}

int main(void) {
    test_q8_0_dequant();
    test_golden_dequant();
    test_names();
    const nm_kernels_isa start = nm_kernels_active();
    const uint32_t types[] = {NM_DTYPE_F32,  NM_DTYPE_F16,  NM_DTYPE_BF16,
                              NM_DTYPE_Q8_0, NM_DTYPE_Q4_0, NM_DTYPE_Q4_K,
                              NM_DTYPE_Q5_K, NM_DTYPE_Q6_K, NM_DTYPE_MXFP4};
    const int n_types = (int)(sizeof types / sizeof types[0]);
    /* m around the tile sizes (GEMV, up to 4 or 6 rows, a panel), n around
     * the tile widths (4, 8, 16), K from one block to very long, also past
     * the quantised panels' limit (4096) with several rows and past
     * avx512vnni's slice of one row (65536); 200 rows of 768 more than
     * the stack's block of quantised rows holds (xrows_buffer: one block in
     * the scratch), 200 of 4096 more than the scratch's too (two blocks;
     * the stack's many blocks: test_kernel_scratch); amx's tiles of 16
     * rows and outputs, two by two, and its slices of BF16 rows (1024);
     * avx2's float spans of 512 elements over blocks of at most 64 columns */
    const int64_t shapes[][3] = {
        {1, 1, 1},     {1, 7, 3},      {3, 5, 257},   {17, 33, 300},  {2, 3, 4099},  {5, 9, 16},
        {4, 4, 64},    {9, 6, 33},     {1, 5, 70001}, {70, 13, 2048}, {130, 3, 20},  {6, 70, 96},
        {1, 19, 512},  {9, 5, 5000},   {5, 8, 768},   {4, 17, 4096},  {7, 16, 8192}, {13, 31, 256},
        {6, 15, 64},   {200, 20, 768}, {1, 33, 2048}, {12, 48, 4096}, {40, 6, 8192}, {48, 40, 1056},
        {150, 35, 96}, {16, 16, 256},  {9, 70, 1100}, {200, 4, 4096}};
    for (int isa = 0; isa < NM_KERNELS_COUNT; isa++) {
        if (!nm_kernels_isa_supported((nm_kernels_isa)isa)) {
            printf("variant %s: not supported here, skipped\n",
                   nm_kernels_isa_name((nm_kernels_isa)isa));
            continue;
        }
        for (int t = 0; t < n_types; t++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                const int64_t bs = nm_dtype_traits_of(types[t])->block_size;
                const int64_t k = (shapes[s][2] + bs - 1) / bs * bs;
                check_matmul((nm_kernels_isa)isa, types[t], shapes[s][0], shapes[s][1], k);
            }
        /* amx's BF16 products of more than four row tiles take groups of
         * up to 16 of them (two groups here) and blocks of columns (256 of
         * K = 2048, 128 for gate and up together: two and three here) */
        if (isa == NM_KERNELS_AMX) {
            check_matmul((nm_kernels_isa)isa, NM_DTYPE_BF16, 66, 260, 2048);
            check_matmul((nm_kernels_isa)isa, NM_DTYPE_BF16, 300, 40, 96);
        }
        if (isa == NM_KERNELS_AVX512VNNI || isa == NM_KERNELS_AMX)
            for (int64_t m = 1; m <= 20; m += 19) {
                check_mxfp4_scales((nm_kernels_isa)isa, 0, 3, 0x1.0p100f, m);
                check_mxfp4_scales((nm_kernels_isa)isa, 246, 250, 0x1.0p-100f, m);
            }
        check_attention((nm_kernels_isa)isa, 4, 2, 2, 3);
        check_attention((nm_kernels_isa)isa, 8, 2, 20, 1);
        check_attention((nm_kernels_isa)isa, 32, 4, 128, 300);
        check_attention((nm_kernels_isa)isa, 6, 3, 17, 41);
        check_attention((nm_kernels_isa)isa, 8, 2, 64, 37);
        check_attention((nm_kernels_isa)isa, 4, 1, 256, 9);
        check_attention_f16((nm_kernels_isa)isa, 32, 4, 128, 200);
        check_attention_f16((nm_kernels_isa)isa, 6, 3, 17, 5);
        for (int tight = 0; tight < 3; tight++)
            check_prepare((nm_kernels_isa)isa, tight);
        printf("variant %s: checked\n", nm_kernels_isa_name((nm_kernels_isa)isa));
    }
    nm_kernels_force(start);
    return nm_test_finish("test_kernels_variants");
}
