/* test_mma_layout.c - the index arithmetic of the tensor-core attention (worker/devices/
 * mma_layout.h) on the CPU, and a warp emulator that runs the kernels' tile algorithm
 * (worker/devices/cuda_attention_mma.cu) through the same helpers.
 *
 *  - fragment ownership: each of A, B, C/D of mma.m16n8k16 is a bijection lanes x elements ->
 *    matrix cells, equal to the PTX ISA's formulas written out independently here;
 *  - the C -> A register reuse (P and dS stay in registers) puts every value where A wants it;
 *  - ldmatrix addressing: an emulated ldmatrix x4 (.trans) from swizzled tiles followed by an
 *    emulated mma equals the direct matrix product, for the three operand shapes;
 *  - the swizzle: a permutation of each row's chunks, and every 8-lane ldmatrix phase the
 *    kernels issue touches 8 distinct 16-byte bank groups (no bank conflicts);
 *  - Turing's m16n8k8: its fragments, and two k8 products on the k16 fragments' halves equal
 *    one k16 product (the sm_75 path of the kernels);
 *  - causal tiles: the tile counts, full-tile test and first query tile agree with brute force;
 *  - the emulator: forward and backward of the kernels, lane by lane, against the CPU device's
 *    attention_fwd / attention_bwd on inputs rounded to bf16 (or fp16), causal and not, GQA,
 *    partial tiles and padded head dims. Without the P / dS rounding (a switch of the emulator)
 *    the agreement is fp32 summation-order close (1e-5), which pins the fragment logic; with
 *    it, the error is that of 16-bit P and dS (the bound is stated at the check). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devices/device.h"
#include "devices/mma_layout.h"

/* ---------------------------------------------------------------------------------------------
 * 1. fragment ownership, as the PTX ISA states it (m16n8k16, .f16/.bf16 A and B, f32 C/D) */

static int ptx_a_row(int lane, int i) {
    int g = lane >> 2;
    return (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
}
static int ptx_a_col(int lane, int i) {
    int t = lane % 4;
    return i < 4 ? t * 2 + (i & 1) : t * 2 + (i & 1) + 8;
}
static int ptx_b_row(int lane, int i) {
    int t = lane % 4;
    return i < 2 ? t * 2 + (i & 1) : t * 2 + (i & 1) + 8;
}
static int ptx_c_row(int lane, int i) { return i < 2 ? lane >> 2 : (lane >> 2) + 8; }

static void test_ownership(void **state) {
    (void)state;
    int seen_a[16][16] = {{0}}, seen_b[16][8] = {{0}}, seen_c[16][8] = {{0}};
    for (int lane = 0; lane < 32; lane++) {
        for (int i = 0; i < 8; i++) {
            int r = mma_a_row(lane, i), c = mma_a_col(lane, i);
            assert_int_equal(r, ptx_a_row(lane, i));
            assert_int_equal(c, ptx_a_col(lane, i));
            seen_a[r][c]++;
        }
        for (int i = 0; i < 4; i++) {
            int r = mma_b_row(lane, i), c = mma_b_col(lane, i);
            assert_int_equal(r, ptx_b_row(lane, i));
            assert_int_equal(c, lane >> 2);
            seen_b[r][c]++;
            int cr = mma_c_row(lane, i), cc = mma_c_col(lane, i);
            assert_int_equal(cr, ptx_c_row(lane, i));
            assert_int_equal(cc, (lane % 4) * 2 + (i & 1));
            seen_c[cr][cc]++;
        }
    }
    /* 256 A elements, 128 B and 128 C: each cell exactly once = a bijection */
    for (int r = 0; r < 16; r++) {
        for (int c = 0; c < 16; c++) assert_int_equal(seen_a[r][c], 1);
        for (int c = 0; c < 8; c++) assert_int_equal(seen_b[r][c], 1), assert_int_equal(seen_c[r][c], 1);
    }
}

/* C fragments of n8 tiles 2kk, 2kk + 1 -> the A fragment of the 16 columns they span. */
static void test_c_to_a(void **state) {
    (void)state;
    for (int lane = 0; lane < 32; lane++)
        for (int r = 0; r < 4; r++)
            for (int e = 0; e < 2; e++) {
                int i = 2 * r + e; /* the A element held in register r, half e */
                int tile = mma_c_to_a_tile(r), ce = mma_c_to_a_elem(r) + e;
                assert_in_range(ce, 0, 3);
                assert_int_equal(mma_c_row(lane, ce), mma_a_row(lane, i));
                assert_int_equal(8 * tile + mma_c_col(lane, ce), mma_a_col(lane, i));
            }
}

/* 1b. m16n8k8 (Turing): its fragments as the PTX ISA states them, a bijection each, and the
 * k8 halves of a k16 product are exactly the registers mma_k8_a_reg / mma_k8_b_reg name. */
static void test_k8_ownership(void **state) {
    (void)state;
    int seen_a[16][8] = {{0}}, seen_b[8][8] = {{0}};
    for (int lane = 0; lane < 32; lane++) {
        int g = lane / 4, t = lane % 4;
        for (int i = 0; i < 4; i++) {
            int r = mma_k8_a_row(lane, i), c = mma_k8_a_col(lane, i);
            assert_int_equal(r, i < 2 ? g : g + 8);
            assert_int_equal(c, t * 2 + (i & 1));
            seen_a[r][c]++;
            for (int h = 0; h < 2; h++) { /* the same cell of the k16 A, 8h columns on */
                int e = 2 * mma_k8_a_reg(h, i / 2) + (i & 1);
                assert_int_equal(mma_a_row(lane, e), r);
                assert_int_equal(mma_a_col(lane, e), c + 8 * h);
            }
        }
        for (int i = 0; i < 2; i++) {
            int r = mma_k8_b_row(lane, i);
            assert_int_equal(r, t * 2 + (i & 1));
            seen_b[r][g]++;
            for (int h = 0; h < 2; h++) { /* the same cell of the k16 B, 8h rows on */
                int e = 2 * mma_k8_b_reg(h) + i;
                assert_int_equal(mma_b_row(lane, e), r + 8 * h);
                assert_int_equal(mma_b_col(lane, e), g);
            }
        }
    }
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 8; c++) assert_int_equal(seen_a[r][c], 1);
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < 8; c++) assert_int_equal(seen_b[r][c], 1);
}

/* ---------------------------------------------------------------------------------------------
 * the emulated warp: 16-bit values, ldmatrix, mma */

static device cpu;
static bool use_fp16; /* the 16-bit format the emulator rounds to */

static uint16_t rnd16(float x) {
    uint16_t h;
    if (use_fp16)
        cpu.ops->to_fp16(&cpu, &h, &x, 1);
    else
        cpu.ops->to_bf16(&cpu, &h, &x, 1);
    return h;
}
/* from_bf16 / from_fp16 of every bit pattern, filled at set-up (the emulator widens a lot) */
static float wide_bf16[65536], wide_fp16[65536];
static float wide(uint16_t h) { return use_fp16 ? wide_fp16[h] : wide_bf16[h]; }
static float round16(float x) { return wide(rnd16(x)); }

typedef struct { uint16_t h[4][2]; } regs4; /* one lane's 4 .b32 registers, halves lo, hi */

/* ldmatrix x4 (.trans): lane l points at tile offset src[l] (in halves, a 16-byte row of
 * 8 values); out[lane] gets the matrices as mma_layout.h says the hardware delivers them. */
static void emu_ldm_x4(regs4 out[32], const uint16_t *tile, const int src[32], bool trans) {
    for (int lane = 0; lane < 32; lane++)
        for (int j = 0; j < 4; j++)
            for (int e = 0; e < 2; e++) {
                int r = mma_ldm_dst_row(lane, e, trans), c = mma_ldm_dst_col(lane, e, trans);
                out[lane].h[j][e] = tile[src[8 * j + r] + c];
            }
}

/* d[lane][4] += A B for one m16n8k16: A from a[lane] (4 registers), B from registers b0, b1
 * of b[lane] (bi = 0: registers 0, 1; bi = 1: registers 2, 3). Products in double, then fp32
 * (the tensor cores' products are exact; the sum order is theirs). */
static void emu_mma(float d[32][4], const regs4 a[32], const regs4 b[32], int bi) {
    double A[16][16], B[16][8];
    for (int lane = 0; lane < 32; lane++) {
        for (int i = 0; i < 8; i++) A[mma_a_row(lane, i)][mma_a_col(lane, i)] = wide(a[lane].h[i / 2][i & 1]);
        for (int i = 0; i < 4; i++)
            B[mma_b_row(lane, i)][mma_b_col(lane, i)] = wide(b[lane].h[2 * bi + i / 2][i & 1]);
    }
    for (int lane = 0; lane < 32; lane++)
        for (int i = 0; i < 4; i++) {
            int r = mma_c_row(lane, i), c = mma_c_col(lane, i);
            double acc = d[lane][i];
            for (int kk = 0; kk < 16; kk++) acc += A[r][kk] * B[kk][c];
            d[lane][i] = (float)acc;
        }
}

/* d += A B for one m16n8k8 (Turing), with the k16 fragments' registers it takes for half h:
 * A registers mma_k8_a_reg(h, 0..1) of a[lane], B register mma_k8_b_reg(h) of n tile bi. */
static void emu_mma_k8(float d[32][4], const regs4 a[32], const regs4 b[32], int bi, int h) {
    double A[16][8], B[8][8];
    for (int lane = 0; lane < 32; lane++) {
        for (int i = 0; i < 4; i++) A[mma_k8_a_row(lane, i)][mma_k8_a_col(lane, i)] = wide(a[lane].h[mma_k8_a_reg(h, i / 2)][i & 1]);
        for (int i = 0; i < 2; i++) B[mma_k8_b_row(lane, i)][lane >> 2] = wide(b[lane].h[2 * bi + mma_k8_b_reg(h)][i]);
    }
    for (int lane = 0; lane < 32; lane++)
        for (int i = 0; i < 4; i++) {
            int r = mma_c_row(lane, i), c = mma_c_col(lane, i);
            double acc = d[lane][i];
            for (int kk = 0; kk < 8; kk++) acc += A[r][kk] * B[kk][c];
            d[lane][i] = (float)acc;
        }
}

/* Turing's two k8 products = one k16 product, exactly, on small integers (every sum exact). */
static void test_k8_product(void **state) {
    (void)state;
    use_fp16 = true; /* Turing's tensor cores take fp16 only */
    uint64_t seed = 99;
    for (int trial = 0; trial < 8; trial++) {
        regs4 a[32], b[32];
        for (int lane = 0; lane < 32; lane++)
            for (int r = 0; r < 4; r++)
                for (int e = 0; e < 2; e++) {
                    seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
                    a[lane].h[r][e] = rnd16((float)((int)(seed % 17) - 8));
                    b[lane].h[r][e] = rnd16((float)((int)((seed >> 20) % 17) - 8));
                }
        for (int bi = 0; bi < 2; bi++) {
            float d16[32][4], d8[32][4];
            for (int lane = 0; lane < 32; lane++)
                for (int i = 0; i < 4; i++) d16[lane][i] = d8[lane][i] = (float)(lane - i);
            emu_mma(d16, a, b, bi);
            emu_mma_k8(d8, a, b, bi, 0);
            emu_mma_k8(d8, a, b, bi, 1);
            for (int lane = 0; lane < 32; lane++)
                for (int i = 0; i < 4; i++) assert_true(d16[lane][i] == d8[lane][i]);
        }
    }
    use_fp16 = false;
}

/* The three ldmatrix sources of the kernels (at_a, at_bn, at_bt) for tile row r0, step kk. */
enum { SRC_A, SRC_BN, SRC_BT };
static void emu_src(int src[32], int kind, int r0, int kk, int W) {
    for (int lane = 0; lane < 32; lane++) {
        int row = kind == SRC_BN ? mma_ldm_bn_row(lane) : kind == SRC_A ? mma_ldm_a_row(lane) : mma_ldm_bt_row(lane);
        int ch = kind == SRC_BN ? mma_ldm_bn_chunk(lane) : kind == SRC_A ? mma_ldm_a_chunk(lane) : mma_ldm_bt_chunk(lane);
        src[lane] = mma_swz_off(r0 + row, kk * 16 + 8 * ch, W);
    }
}

/* acc[NJ][lane][4] += A (rows r0.. of As) B^T (rows 0.. of Bs): the kernels' mma_abt. */
static void emu_abt(float (*acc)[32][4], int NJ, const uint16_t *As, int r0, const uint16_t *Bs, int W) {
    for (int kk = 0; kk < W / 16; kk++) {
        regs4 a[32], b[32];
        int src[32];
        emu_src(src, SRC_A, r0, kk, W);
        emu_ldm_x4(a, As, src, false);
        for (int np = 0; np < NJ / 2; np++) {
            emu_src(src, SRC_BN, 16 * np, kk, W);
            emu_ldm_x4(b, Bs, src, false);
            emu_mma(acc[2 * np], a, b, 0);
            emu_mma(acc[2 * np + 1], a, b, 1);
        }
    }
}

static bool round_p = true; /* the P / dS rounding point (off: fp32 P, to check the logic) */

/* acc[W/8][lane][4] += P (NJ C fragments) X (rows 0 .. 8 NJ - 1 of Xs): the kernels' mma_px. */
static void emu_px(float (*acc)[32][4], int W, float (*p)[32][4], int NJ, const uint16_t *Xs) {
    for (int kk = 0; kk < NJ / 2; kk++) {
        regs4 a[32], b[32];
        for (int lane = 0; lane < 32; lane++)
            for (int r = 0; r < 4; r++)
                for (int e = 0; e < 2; e++) {
                    float x = p[2 * kk + mma_c_to_a_tile(r)][lane][mma_c_to_a_elem(r) + e];
                    a[lane].h[r][e] = rnd16(x);
                }
        for (int dp = 0; dp < W / 16; dp++) {
            int src[32];
            emu_src(src, SRC_BT, 16 * kk, dp, W);
            emu_ldm_x4(b, Xs, src, true);
            if (round_p) {
                emu_mma(acc[2 * dp], a, b, 0);
                emu_mma(acc[2 * dp + 1], a, b, 1);
                continue;
            }
            /* fp32 P: the same fragments of X, P read from the C registers directly */
            for (int half = 0; half < 2; half++) {
                double A[16][16], B[16][8];
                for (int lane = 0; lane < 32; lane++) {
                    for (int r = 0; r < 4; r++)
                        for (int e = 0; e < 2; e++) {
                            int i = 2 * r + e;
                            A[mma_a_row(lane, i)][mma_a_col(lane, i)] =
                                p[2 * kk + mma_c_to_a_tile(r)][lane][mma_c_to_a_elem(r) + e];
                        }
                    for (int i = 0; i < 4; i++)
                        B[mma_b_row(lane, i)][mma_b_col(lane, i)] = wide(b[lane].h[2 * half + i / 2][i & 1]);
                }
                for (int lane = 0; lane < 32; lane++)
                    for (int i = 0; i < 4; i++) {
                        int r = mma_c_row(lane, i), c = mma_c_col(lane, i);
                        double s = acc[2 * dp + half][lane][i];
                        for (int k2 = 0; k2 < 16; k2++) s += A[r][k2] * B[k2][c];
                        acc[2 * dp + half][lane][i] = (float)s;
                    }
            }
        }
    }
}

/* The kernels' stage: rows [row0, row0 + rows) of a [T, hd] strided view, rounded, zero past T
 * and hd, into a swizzled [rows][W] tile. */
static void emu_stage(uint16_t *s, int W, int rows, const float *g, int64_t ldg, int row0, int T, int hd) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < W; c++) {
            int gr = row0 + r;
            float x = gr < T && c < hd ? g[(int64_t)gr * ldg + c] : 0.0f;
            s[mma_swz_off(r, c, W)] = rnd16(x);
        }
}

/* ---------------------------------------------------------------------------------------------
 * 2. ldmatrix + mma = the matrix product, for each operand shape */

static float frand(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return (float)((double)(*s >> 40) / (double)(1ULL << 24) * 2.0 - 1.0);
}

static void test_ldmatrix_products(void **state) {
    (void)state;
    uint64_t rs = 12345;
    const int widths[] = {16, 32, 64, 128};
    for (int wi = 0; wi < 4; wi++) {
        int W = widths[wi];
        /* A [32][W], B [32][W]: C = A[16.. 31] B[0 .. 15]^T (two n8 tiles) via abt, and
         * D = P X with P = C's fragments, X = B rows 0 .. 15 (all W columns) via px */
        float *A = malloc(sizeof(float) * 32 * W), *B = malloc(sizeof(float) * 32 * W);
        uint16_t *As = malloc(2 * 32 * W), *Bs = malloc(2 * 32 * W);
        for (int i = 0; i < 32 * W; i++) A[i] = round16(frand(&rs)), B[i] = round16(frand(&rs));
        emu_stage(As, W, 32, A, W, 0, 32, W);
        emu_stage(Bs, W, 32, B, W, 0, 32, W);
        float acc[2][32][4];
        memset(acc, 0, sizeof acc);
        emu_abt(acc, 2, As, 16, Bs, W);
        for (int lane = 0; lane < 32; lane++)
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 2; j++) {
                    int r = 16 + mma_c_row(lane, i), c = 8 * j + mma_c_col(lane, i);
                    double ref = 0;
                    for (int k = 0; k < W; k++) ref += (double)A[r * W + k] * B[c * W + k];
                    assert_float_equal(acc[j][lane][i], ref, 1e-5 * W);
                }
        /* P = round16(acc) exactly representable: px with rounding on is then exact too */
        for (int j = 0; j < 2; j++)
            for (int lane = 0; lane < 32; lane++)
                for (int i = 0; i < 4; i++) acc[j][lane][i] = round16(acc[j][lane][i]);
        float (*o)[32][4] = calloc((size_t)W / 8, sizeof *o);
        emu_px(o, W, acc, 2, Bs);
        for (int lane = 0; lane < 32; lane++)
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < W / 8; j++) {
                    int r = mma_c_row(lane, i), c = 8 * j + mma_c_col(lane, i);
                    double ref = 0; /* sum over the 16 columns of P of P[r][k] X[k][c] */
                    for (int k = 0; k < 16; k++) {
                        int jj = k / 8, kc = k % 8;
                        /* P[r][k] lives in tile jj at the lane with c_row = r, c_col = kc */
                        float pv = NAN;
                        for (int l2 = 0; l2 < 32; l2++)
                            for (int i2 = 0; i2 < 4; i2++)
                                if (mma_c_row(l2, i2) == r && mma_c_col(l2, i2) == kc) pv = acc[jj][l2][i2];
                        ref += (double)pv * B[k * W + c];
                    }
                    assert_float_equal(o[j][lane][i], ref, 1e-4 * (1 + fabs(ref)));
                }
        free(o), free(A), free(B), free(As), free(Bs);
    }
}

/* ---------------------------------------------------------------------------------------------
 * 3. the swizzle */

static void test_swizzle(void **state) {
    (void)state;
    const int widths[] = {16, 32, 64, 128};
    for (int wi = 0; wi < 4; wi++) {
        int W = widths[wi], nch = W / 8;
        for (int r = 0; r < 128; r++) { /* a permutation of the row's chunks */
            int seen[16] = {0};
            for (int c = 0; c < nch; c++) {
                int p = mma_swz_chunk(r, c, nch);
                assert_in_range(p, 0, nch - 1);
                seen[p]++;
            }
            for (int c = 0; c < nch; c++) assert_int_equal(seen[c], 1);
        }
        /* every phase of every ldmatrix the kernels issue, for 128-row tiles: the 8 lanes of
         * matrix j hit 8 distinct 16-byte bank groups ((byte offset / 16) mod 8) */
        for (int kind = SRC_A; kind <= SRC_BT; kind++)
            for (int r0 = 0; r0 < 128; r0 += 16)
                for (int kk = 0; kk < W / 16; kk++) {
                    int src[32];
                    emu_src(src, kind, r0, kk, W);
                    for (int j = 0; j < 4; j++) {
                        int groups[8] = {0};
                        for (int l = 8 * j; l < 8 * j + 8; l++) {
                            assert_int_equal(src[l] % 8, 0); /* 16-byte aligned rows */
                            groups[(src[l] * 2 / 16) % 8]++;
                        }
                        for (int g = 0; g < 8; g++) assert_int_equal(groups[g], 1);
                    }
                }
        /* and the stage's chunk writes: 8 consecutive chunks (threads) of a 128-byte group of
         * logical chunks land on distinct bank groups as well */
        for (int c0 = 0; c0 < 128 * nch; c0 += 8) {
            int groups[8] = {0};
            for (int c = c0; c < c0 + 8; c++) groups[(mma_swz_off(c / nch, (c % nch) * 8, W) / 8) % 8]++;
            for (int g = 0; g < 8; g++) assert_int_equal(groups[g], 1);
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * 4. causal tiles against brute force */

static void test_causal_tiles(void **state) {
    (void)state;
    const int sizes[] = {16, 32, 64};
    for (int T = 1; T <= 200; T += (T < 70 ? 1 : 13))
        for (int bi = 0; bi < 3; bi++)
            for (int ci = 0; ci < 3; ci++)
                for (int causal = 0; causal < 2; causal++) {
                    int BR = sizes[bi], BC = sizes[ci];
                    for (int q0 = 0; q0 < T; q0 += BR) {
                        int last = -1; /* the last key tile with a visible pair */
                        for (int k0 = 0; k0 < T; k0 += BC) {
                            bool any = false, all = k0 + BC <= T; /* keys past T are masked */
                            for (int row = q0; row < q0 + BR && row < T; row++)
                                for (int key = k0; key < k0 + BC; key++) {
                                    bool vis = key < T && (!causal || key <= row);
                                    assert_int_equal(vis, mma_visible(row, key, T, causal));
                                    any |= vis;
                                    all &= vis;
                                }
                            if (any) last = k0 / BC;
                            /* full implies no masked pair; and for rows wholly < T the test is
                             * exact (rows past T are not stored, the kernels may mask them) */
                            if (mma_tile_full(q0, k0, BC, T, causal)) assert_true(all);
                            if (q0 + BR <= T) assert_int_equal(all, mma_tile_full(q0, k0, BC, T, causal));
                        }
                        assert_int_equal(mma_kv_tiles(q0, BR, BC, T, causal), last + 1);
                    }
                    for (int k0 = 0; k0 < T; k0 += BC) { /* the first query tile seeing k0.. */
                        int first = -1;
                        for (int q0 = 0; q0 < T && first < 0; q0 += BR)
                            for (int row = q0; row < q0 + BR && row < T && first < 0; row++)
                                for (int key = k0; key < k0 + BC && key < T; key++)
                                    if (!causal || key <= row) {
                                        first = q0 / BR;
                                        break;
                                    }
                        assert_int_equal(mma_first_qtile(k0, BR, causal), first);
                    }
                }
    /* mma_tile_full for unaligned starts too (the kernels pass a warp's first row or key) */
    for (int T = 1; T <= 40; T++)
        for (int q0 = 0; q0 < T; q0++)
            for (int k0 = 0; k0 < T; k0++)
                for (int causal = 0; causal < 2; causal++) {
                    bool all = true;
                    for (int row = q0; row < q0 + 16; row++)
                        for (int key = k0; key < k0 + 16; key++) all &= mma_visible(row, key, T, causal);
                    assert_int_equal(all, mma_tile_full(q0, k0, 16, T, causal));
                }
    for (int hd = 1; hd <= 128; hd++) { /* the padded widths */
        int w = mma_width(hd);
        assert_true(w >= hd && (w == 16 || w == 32 || w == 64 || w == 128));
        assert_true(w == 16 || hd > w / 2);
    }
    assert_int_equal(mma_width(0), 0);
    assert_int_equal(mma_width(129), 0);
}

/* ---------------------------------------------------------------------------------------------
 * 5. the warp emulator: the kernels' algorithm, lane by lane */

typedef struct {
    int B, T, H, Hkv, hd, ld; /* q, k, v in one fused row of ld floats: q | k | v */
    bool causal;
} att_shape;

/* attn_mma_fwd_kernel for every block: 64-row query tiles, 64-key tiles, 4 warps of 16 rows. */
static void emu_fwd(const att_shape *a, float *out, float *lse, const float *qkv) {
    const int BR = 64, BC = 64, NJ = BC / 8, W = mma_width(a->hd), ND = W / 8, group = a->H / a->Hkv;
    const int ld = a->ld, T = a->T, hd = a->hd, ldo = a->H * hd;
    const float sl2 = 1.0f / sqrtf((float)hd) * 1.4426950408889634f;
    uint16_t *Qs = malloc(2 * (size_t)BR * W), *Ks = malloc(2 * (size_t)BC * W), *Vs = malloc(2 * (size_t)BC * W);
    float (*o)[ND][32][4] = malloc(sizeof(float) * 4 * ND * 32 * 4);
    float m[4][32][2], l[4][32][2];
    for (int b = 0; b < a->B; b++)
        for (int h = 0; h < a->H; h++)
            for (int q0 = 0; q0 < T; q0 += BR) {
                const float *base = qkv + (int64_t)b * T * ld;
                const int hkv = h / group;
                emu_stage(Qs, W, BR, base + h * hd, ld, q0, T, hd);
                memset(o, 0, sizeof(float) * 4 * ND * 32 * 4);
                for (int w = 0; w < 4; w++)
                    for (int lane = 0; lane < 32; lane++) m[w][lane][0] = m[w][lane][1] = -INFINITY, l[w][lane][0] = l[w][lane][1] = 0;
                const int nkt = mma_kv_tiles(q0, BR, BC, T, a->causal);
                for (int kt = 0; kt < nkt; kt++) {
                    const int k0 = kt * BC;
                    emu_stage(Ks, W, BC, base + (a->H + hkv) * hd, ld, k0, T, hd);
                    emu_stage(Vs, W, BC, base + (a->H + a->Hkv + hkv) * hd, ld, k0, T, hd);
                    for (int w = 0; w < 4; w++) {
                        const int wr = 16 * w;
                        float s[8][32][4];
                        memset(s, 0, sizeof s);
                        emu_abt(s, NJ, Qs, wr, Ks, W);
                        const bool full = mma_tile_full(q0 + wr, k0, BC, T, a->causal);
                        for (int hh = 0; hh < 2; hh++) {
                            float mt[32];
                            for (int lane = 0; lane < 32; lane++) {
                                const int row = q0 + wr + mma_c_row(lane, 2 * hh);
                                mt[lane] = -INFINITY;
                                for (int j = 0; j < NJ; j++)
                                    for (int e = 0; e < 2; e++) {
                                        float x = s[j][lane][2 * hh + e] * sl2;
                                        if (!full && !mma_visible(row, k0 + 8 * j + mma_c_col(lane, e), T, a->causal))
                                            x = -INFINITY;
                                        s[j][lane][2 * hh + e] = x;
                                        mt[lane] = fmaxf(mt[lane], x);
                                    }
                            }
                            for (int lane = 0; lane < 32; lane++) { /* shfl_xor 1, 2 */
                                float x = mt[lane];
                                for (int t = 0; t < 4; t++) x = fmaxf(x, mt[(lane & ~3) | t]);
                                const float mn = fmaxf(m[w][lane][hh], x);
                                const float ms = mn == -INFINITY ? 0.0f : mn;
                                const float alpha = exp2f(m[w][lane][hh] - ms);
                                m[w][lane][hh] = mn;
                                float ps = 0;
                                for (int j = 0; j < NJ; j++)
                                    for (int e = 0; e < 2; e++) {
                                        float p = exp2f(s[j][lane][2 * hh + e] - ms);
                                        s[j][lane][2 * hh + e] = p;
                                        ps += p;
                                    }
                                l[w][lane][hh] = l[w][lane][hh] * alpha + ps;
                                for (int j = 0; j < ND; j++) o[w][j][lane][2 * hh] *= alpha, o[w][j][lane][2 * hh + 1] *= alpha;
                            }
                        }
                        emu_px(o[w], W, s, NJ, Vs);
                    }
                }
                for (int w = 0; w < 4; w++)
                    for (int lane = 0; lane < 32; lane++)
                        for (int hh = 0; hh < 2; hh++) {
                            float L = 0;
                            for (int t = 0; t < 4; t++) L += l[w][(lane & ~3) | t][hh];
                            const int row = q0 + 16 * w + mma_c_row(lane, 2 * hh);
                            if (row >= T) continue;
                            if ((lane & 3) == 0)
                                lse[((int64_t)b * a->H + h) * T + row] = (m[w][lane][hh] + log2f(L)) * 0.6931471805599453f;
                            for (int j = 0; j < ND; j++)
                                for (int e = 0; e < 2; e++) {
                                    int col = 8 * j + mma_c_col(lane, e);
                                    if (col < hd) out[((int64_t)b * T + row) * ldo + h * hd + col] = o[w][j][lane][2 * hh + e] / L;
                                }
                        }
            }
    free(Qs), free(Ks), free(Vs), free(o);
}

/* attn_mma_dq_kernel and attn_mma_dkv_kernel for every block (D computed like the simt path). */
static void emu_bwd(const att_shape *a, float *dqkv, const float *dout, const float *out, const float *lse,
                    const float *qkv) {
    const int W = mma_width(a->hd), ND = W / 8, group = a->H / a->Hkv, T = a->T, hd = a->hd, ld = a->ld;
    const int ldo = a->H * hd;
    const float scale = 1.0f / sqrtf((float)hd), sl2 = scale * 1.4426950408889634f;
    float *D = malloc(sizeof(float) * a->B * a->H * T);
    for (int b = 0; b < a->B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < a->H; h++) {
                float acc = 0;
                for (int c = 0; c < hd; c++) {
                    int64_t i = ((int64_t)b * T + t) * ldo + h * hd + c;
                    acc += dout[i] * out[i];
                }
                D[((int64_t)b * a->H + h) * T + t] = acc;
            }
    uint16_t *Xa = malloc(2 * 64 * (size_t)W), *Xb = malloc(2 * 64 * (size_t)W);
    uint16_t *Ya = malloc(2 * 64 * (size_t)W), *Yb = malloc(2 * 64 * (size_t)W);
    float (*acc1)[32][4] = malloc(sizeof(float) * ND * 32 * 4), (*acc2)[32][4] = malloc(sizeof(float) * ND * 32 * 4);
    for (int b = 0; b < a->B; b++) {
        const float *base = qkv + (int64_t)b * T * ld, *ob = dout + (int64_t)b * T * ldo;
        float *dbase = dqkv + (int64_t)b * T * ld;
        /* dQ: per 64-row query tile and head; key tiles of dq_bc */
        const int QBC = mma_dq_keys(W), NJQ = QBC / 8;
        for (int h = 0; h < a->H; h++) {
            const int hkv = h / group;
            const float *lse_h = lse + ((int64_t)b * a->H + h) * T, *D_h = D + ((int64_t)b * a->H + h) * T;
            for (int q0 = 0; q0 < T; q0 += 64) {
                emu_stage(Xa, W, 64, base + h * hd, ld, q0, T, hd);
                emu_stage(Xb, W, 64, ob + h * hd, ldo, q0, T, hd);
                for (int w = 0; w < 4; w++) {
                    const int wr = 16 * w;
                    memset(acc1, 0, sizeof(float) * ND * 32 * 4);
                    for (int kt = 0; kt < mma_kv_tiles(q0, 64, QBC, T, a->causal); kt++) {
                        const int k0 = kt * QBC;
                        emu_stage(Ya, W, QBC, base + (a->H + hkv) * hd, ld, k0, T, hd);
                        emu_stage(Yb, W, QBC, base + (a->H + a->Hkv + hkv) * hd, ld, k0, T, hd);
                        float s[8][32][4], dp[8][32][4];
                        memset(s, 0, sizeof s), memset(dp, 0, sizeof dp);
                        emu_abt(s, NJQ, Xa, wr, Ya, W);
                        emu_abt(dp, NJQ, Xb, wr, Yb, W);
                        const bool full = mma_tile_full(q0 + wr, k0, QBC, T, a->causal);
                        for (int j = 0; j < NJQ; j++)
                            for (int lane = 0; lane < 32; lane++)
                                for (int i = 0; i < 4; i++) {
                                    int row = q0 + wr + mma_c_row(lane, i);
                                    float l2 = row < T ? lse_h[row] * 1.4426950408889634f : 0, dr = row < T ? D_h[row] : 0;
                                    bool ok = full || mma_visible(row, k0 + 8 * j + mma_c_col(lane, i), T, a->causal);
                                    float p = ok ? exp2f(fmaf(s[j][lane][i], sl2, -l2)) : 0.0f;
                                    dp[j][lane][i] = p * (dp[j][lane][i] - dr);
                                }
                        emu_px(acc1, W, dp, NJQ, Ya);
                    }
                    for (int lane = 0; lane < 32; lane++)
                        for (int i = 0; i < 4; i++)
                            for (int j = 0; j < ND; j++) {
                                int row = q0 + wr + mma_c_row(lane, i), col = 8 * j + mma_c_col(lane, i);
                                if (row < T && col < hd) dbase[(int64_t)row * ld + h * hd + col] = acc1[j][lane][i] * scale;
                            }
                }
            }
        }
        /* dK, dV: per 64-key tile and kv head, looping over the group's heads and query tiles */
        const int KBR = mma_dkv_rows(W), NJK = KBR / 8;
        for (int hkv = 0; hkv < a->Hkv; hkv++)
            for (int k0 = 0; k0 < T; k0 += 64) {
                emu_stage(Xa, W, 64, base + (a->H + hkv) * hd, ld, k0, T, hd);
                emu_stage(Xb, W, 64, base + (a->H + a->Hkv + hkv) * hd, ld, k0, T, hd);
                for (int w = 0; w < 4; w++) {
                    const int wk = 16 * w;
                    memset(acc1, 0, sizeof(float) * ND * 32 * 4), memset(acc2, 0, sizeof(float) * ND * 32 * 4);
                    for (int hh = 0; hh < group; hh++) {
                        const int h = hkv * group + hh;
                        const float *lse_h = lse + ((int64_t)b * a->H + h) * T, *D_h = D + ((int64_t)b * a->H + h) * T;
                        for (int qt = mma_first_qtile(k0, KBR, a->causal); qt * KBR < T; qt++) {
                            const int q0 = qt * KBR;
                            emu_stage(Ya, W, KBR, base + h * hd, ld, q0, T, hd);
                            emu_stage(Yb, W, KBR, ob + h * hd, ldo, q0, T, hd);
                            float s[8][32][4], dp[8][32][4];
                            memset(s, 0, sizeof s), memset(dp, 0, sizeof dp);
                            emu_abt(s, NJK, Xa, wk, Ya, W);
                            emu_abt(dp, NJK, Xb, wk, Yb, W);
                            const bool full = q0 + KBR <= T && mma_tile_full(q0, k0 + wk, 16, T, a->causal);
                            for (int j = 0; j < NJK; j++)
                                for (int lane = 0; lane < 32; lane++)
                                    for (int i = 0; i < 4; i++) {
                                        int query = q0 + 8 * j + mma_c_col(lane, i), key = k0 + wk + mma_c_row(lane, i);
                                        bool qok = query < T;
                                        float l2 = qok ? lse_h[query] * 1.4426950408889634f : 0, dq = qok ? D_h[query] : 0;
                                        bool ok = full || (qok && mma_visible(query, key, T, a->causal));
                                        float p = ok ? exp2f(fmaf(s[j][lane][i], sl2, -l2)) : 0.0f;
                                        s[j][lane][i] = p;
                                        dp[j][lane][i] = p * (dp[j][lane][i] - dq);
                                    }
                            emu_px(acc2, W, s, NJK, Yb); /* dV += P^T dO */
                            emu_px(acc1, W, dp, NJK, Ya); /* dK += dS^T Q */
                        }
                    }
                    for (int lane = 0; lane < 32; lane++)
                        for (int i = 0; i < 4; i++)
                            for (int j = 0; j < ND; j++) {
                                int key = k0 + wk + mma_c_row(lane, i), col = 8 * j + mma_c_col(lane, i);
                                if (key >= T || col >= hd) continue;
                                dbase[(int64_t)key * ld + (a->H + hkv) * hd + col] = acc1[j][lane][i] * scale;
                                dbase[(int64_t)key * ld + (a->H + a->Hkv + hkv) * hd + col] = acc2[j][lane][i];
                            }
                }
            }
    }
    free(D), free(Xa), free(Xb), free(Ya), free(Yb), free(acc1), free(acc2);
}

/* max |got - ref| <= tol * max |ref| over the n values (strided: the first w of each ld) */
static void expect_close(const char *what, const float *got, const float *ref, int64_t rows, int w, int ld,
                         double tol) {
    double m = 0, worst = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int c = 0; c < w; c++) {
            m = fmax(m, fabs(ref[r * ld + c]));
            double e = fabs((double)got[r * ld + c] - ref[r * ld + c]);
            worst = isnan(e) ? INFINITY : fmax(worst, e);
        }
    if (getenv("MMA_EMU_VERBOSE")) printf("# %s: %.3g of max|ref|\n", what, worst / (m > 0 ? m : 1));
    if (!(worst <= tol * (m > 0 ? m : 1))) {
        print_error("%s: max error %.3g > %.3g x max|ref| %.3g\n", what, worst, tol, m);
        fail();
    }
}

/* The emulated kernels against the CPU device, forward within tol_f and backward within tol_b
 * of max|ref| (with the P / dS rounding). prerounded: the inputs are 16-bit values (the
 * reference sees what the kernels stage), and a second pass without the P / dS rounding must
 * agree to fp32 summation order (1e-5 forward, 1e-4 backward); else fp32 inputs, which the
 * kernels round when staging (the tolerances of the GPU test, test_cuda_ops). */
static void check_emulator(const att_shape *a, bool f16, bool prerounded, double tol_f, double tol_b,
                           uint64_t seed) {
    use_fp16 = f16;
    const int64_t rows = (int64_t)a->B * a->T;
    const int ldo = a->H * a->hd;
    float *qkv = calloc((size_t)(rows * a->ld), 4), *dout = malloc(sizeof(float) * rows * ldo);
    uint64_t rs = seed;
    for (int64_t i = 0; i < rows * a->ld; i++) qkv[i] = 1.5f * frand(&rs);
    for (int64_t i = 0; i < rows * ldo; i++) dout[i] = frand(&rs);
    if (prerounded) {
        for (int64_t i = 0; i < rows * a->ld; i++) qkv[i] = round16(qkv[i]);
        for (int64_t i = 0; i < rows * ldo; i++) dout[i] = round16(dout[i]);
    }
    const float *q = qkv, *k = qkv + a->H * a->hd, *v = qkv + (a->H + a->Hkv) * a->hd;
    float *out = malloc(sizeof(float) * rows * ldo), *lse = malloc(sizeof(float) * a->B * a->H * a->T);
    float *dqkv = calloc((size_t)(rows * a->ld), 4), *eqkv = calloc((size_t)(rows * a->ld), 4);
    cpu.ops->attention_fwd(&cpu, out, lse, q, a->ld, k, a->ld, v, a->ld, a->B, a->T, a->H, a->Hkv, a->hd, a->causal);
    cpu.ops->attention_bwd(&cpu, dqkv, dqkv + a->H * a->hd, dqkv + (a->H + a->Hkv) * a->hd, dout, out, lse, q, a->ld,
                           k, a->ld, v, a->ld, a->B, a->T, a->H, a->Hkv, a->hd, a->causal);
    float *eout = malloc(sizeof(float) * rows * ldo), *else_ = malloc(sizeof(float) * a->B * a->H * a->T);
    char what[160];
    for (int rp = prerounded ? 0 : 1; rp < 2; rp++) {
        round_p = rp == 1;
        double tf = round_p ? tol_f : 1e-5, tb = round_p ? tol_b : 1e-4;
        emu_fwd(a, eout, else_, qkv);
        snprintf(what, sizeof what, "emulated fwd B=%d T=%d H=%d/%d hd=%d causal=%d %s inputs %s, P %s", a->B, a->T,
                 a->H, a->Hkv, a->hd, a->causal, f16 ? "fp16" : "bf16", prerounded ? "16-bit" : "fp32",
                 round_p ? "rounded" : "fp32");
        expect_close(what, eout, out, rows, ldo, ldo, tf);
        expect_close("lse", else_, lse, 1, a->B * a->H * a->T, 0, tf);
        /* the backward from the CPU's out and lse (the kernels' inputs), D as the simt path */
        emu_bwd(a, eqkv, dout, out, lse, qkv);
        snprintf(what, sizeof what, "emulated bwd dq|dk|dv B=%d T=%d H=%d/%d hd=%d causal=%d %s dS %s", a->B, a->T,
                 a->H, a->Hkv, a->hd, a->causal, f16 ? "fp16" : "bf16", round_p ? "rounded" : "fp32");
        for (int part = 0; part < 3; part++) {
            int off = part == 0 ? 0 : part == 1 ? a->H * a->hd : (a->H + a->Hkv) * a->hd;
            int pw = part == 0 ? a->H * a->hd : a->Hkv * a->hd;
            expect_close(what, eqkv + off, dqkv + off, rows, pw, a->ld, tb);
        }
    }
    free(qkv), free(dout), free(out), free(lse), free(dqkv), free(eqkv), free(eout), free(else_);
}

static void test_emulator(void **state) {
    (void)state;
    /* 16-bit P and dS: relative error 2^-9 (bf16) / 2^-12 (fp16) per value, on sums that
     * largely average out; 1e-2 (bf16) and 2e-3 (fp16) of max|ref| hold with margin */
    const att_shape shapes[] = {
        {1, 70, 2, 1, 64, 0, true},   /* two query tiles, the second partial; GQA 2 on 1 */
        {1, 70, 2, 1, 64, 0, false},  /* not causal */
        {2, 33, 4, 2, 16, 0, true},   /* one partial tile, two samples, GQA 4 on 2 */
        {1, 40, 2, 2, 100, 0, true},  /* padded head dim in the 128 width (32-row dK/dV tiles) */
        {1, 21, 1, 1, 5, 0, false},   /* hd 5 in the 16 width */
        {1, 65, 3, 1, 32, 0, true},   /* group 3 */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        att_shape a = shapes[i];
        a.ld = (a.H + 2 * a.Hkv) * a.hd + 3; /* a padded fused row, as the trainer's */
        check_emulator(&a, false, true, 1e-2, 2e-2, 100 + i);
        check_emulator(&a, true, true, 2e-3, 4e-3, 200 + i);
        /* fp32 inputs: test_cuda_ops's bounds, 8u / 16u (bf16) and 16u / 32u (fp16) */
        check_emulator(&a, false, false, 8.0 / 256, 16.0 / 256, 300 + i);
        check_emulator(&a, true, false, 16.0 / 2048, 32.0 / 2048, 400 + i);
    }
}

static int setup(void **state) {
    (void)state;
    err_t err;
    if (cpu_device_init(&cpu, 0, 1, 0, &err) != 0) return -1;
    uint16_t all[65536];
    for (int i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    cpu.ops->from_bf16(&cpu, wide_bf16, all, 65536);
    cpu.ops->from_fp16(&cpu, wide_fp16, all, 65536);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    cpu_device_close(&cpu);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ownership),     cmocka_unit_test(test_c_to_a),
        cmocka_unit_test(test_ldmatrix_products), cmocka_unit_test(test_swizzle),
        cmocka_unit_test(test_causal_tiles),  cmocka_unit_test(test_emulator),
        cmocka_unit_test(test_k8_ownership),  cmocka_unit_test(test_k8_product),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
