/* mma_layout.h - the index arithmetic of the tensor-core attention kernels (cuda_attention_mma.cu),
 * shared by the CUDA code and the CPU tests (tests/unit/test_mma_layout.c), so that what runs on
 * the GPU is what the tests checked: every function is __host__ __device__ under nvcc and plain
 * `static inline` C elsewhere. Nothing here touches memory.
 *
 * 1. Fragment ownership of mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32
 *    (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"). A warp's 32 lanes
 *    hold, with groupID g = lane >> 2 and threadID_in_group t = lane % 4:
 *      A (16 x 16, row-major), 8 halves a0..a7 in 4 .b32 registers:
 *        row = g for i in {0,1,4,5}, g + 8 otherwise; col = 2t + (i & 1), + 8 for i >= 4
 *      B (16 x 8, K x N), 4 halves b0..b3 in 2 registers:
 *        row (k) = 2t + (i & 1), + 8 for i >= 2; col (n) = g
 *      C, D (16 x 8 fp32), c0..c3:
 *        row = g for i < 2, g + 8 otherwise; col = 2t + (i & 1)
 *    Register r of a 16-bit operand holds halves 2r (low 16 bits) and 2r + 1 (high).
 *    Consequence used by the kernels (FlashAttention-2's register reuse): the C fragments of two
 *    adjacent n8 tiles j = 2kk, 2kk + 1 of a 16-row product, packed to 16 bits as
 *    {c0,c1}, {c2,c3} of tile 2kk then of tile 2kk + 1, are exactly the A fragment of columns
 *    16kk .. 16kk + 15 (mma_c_to_a_* below): P never goes through shared memory.
 *
 * 1b. Turing (sm_75) has mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 only (PTX ISA,
 *    "Matrix Fragments for mma.m16n8k8"): A (16 x 8) halves a0..a3 in 2 registers, row = g for
 *    i < 2, g + 8 otherwise, col = 2t + (i & 1); B (8 x 8) halves b0, b1 in 1 register, row (k) =
 *    2t + (i & 1), col (n) = g; C as above. These are the k16 fragments' first and second halves
 *    of k: k8 product h (k 8h .. 8h + 7) takes A registers mma_k8_a_reg(h, 0..1) = 2h, 2h + 1
 *    and B register mma_k8_b_reg(h) = h of the k16 fragments as loaded, so one k16 product is two
 *    k8 products into the same accumulators, with no other change to the kernels.
 *
 * 2. ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8j .. 8j + 7 give the row addresses
 *    (16 bytes each) of 8x8 matrix j; lane l receives in register j the two halves of row l / 4,
 *    columns 2(l % 4), 2(l % 4) + 1 of matrix j, or with .trans those of column l / 4, rows
 *    2(l % 4), 2(l % 4) + 1 (the transposed matrix). mma_ldm_* give, per lane, which tile row and
 *    which 8-column chunk that lane must point at for the three operand shapes the kernels load.
 *
 * 3. The shared-memory tiles hold 16-bit values, rows of W = 16, 32, 64 or 128 halves (the head
 *    dim padded) = W / 8 chunks of 16 bytes, with no padding: chunk c of row r is stored at chunk
 *    mma_swz_chunk(r, c, W / 8) of that row. An ldmatrix phase (8 lanes, one 8x8 matrix) reads
 *    one logical chunk of 8 consecutive rows starting at a multiple of 8; the XOR swizzle makes
 *    the 8 physical 16-byte positions distinct modulo 128 bytes (the 32 banks), so every phase
 *    is conflict-free, and the cp.async / st.shared writes of whole chunks are too.
 *
 * 4. Causal tiles. Query tile rows [q0, q0 + BR), key tile keys [k0, k0 + BC); key > row and
 *    key >= T are masked. mma_kv_tiles: how many key tiles a query tile visits (those wholly
 *    after its last row are skipped); mma_tile_full: whether a (query tile, key tile) pair needs
 *    no mask at all; mma_first_qtile: the first query tile that sees a key tile (dK/dV). */
#ifndef CEPHALO_MMA_LAYOUT_H
#define CEPHALO_MMA_LAYOUT_H

#include <stdbool.h>

#ifdef __CUDACC__
#define MMA_FN static constexpr __host__ __device__ __forceinline__
#else
#define MMA_FN static inline
#endif

/* ---- 1. fragment ownership (lane 0..31; i: the element index within the lane) ---- */

MMA_FN int mma_a_row(int lane, int i) { return (lane >> 2) + ((i & 2) ? 8 : 0); }
MMA_FN int mma_a_col(int lane, int i) { return 2 * (lane & 3) + (i & 1) + (i >= 4 ? 8 : 0); }
MMA_FN int mma_b_row(int lane, int i) { return 2 * (lane & 3) + (i & 1) + (i >= 2 ? 8 : 0); }
MMA_FN int mma_b_col(int lane, int i) { (void)i; return lane >> 2; }
MMA_FN int mma_c_row(int lane, int i) { return (lane >> 2) + (i >= 2 ? 8 : 0); }
MMA_FN int mma_c_col(int lane, int i) { return 2 * (lane & 3) + (i & 1); }

/* 1b. m16n8k8 (.f16, sm_75): its own fragments, and which k16 registers a k8 half takes. */
MMA_FN int mma_k8_a_row(int lane, int i) { return (lane >> 2) + (i >= 2 ? 8 : 0); }
MMA_FN int mma_k8_a_col(int lane, int i) { return 2 * (lane & 3) + (i & 1); }
MMA_FN int mma_k8_b_row(int lane, int i) { return 2 * (lane & 3) + (i & 1); }
MMA_FN int mma_k8_a_reg(int h, int r) { return 2 * h + r; }
MMA_FN int mma_k8_b_reg(int h) { return h; }

/* A register r (0..3) of k16 step kk, built from the C fragments of n8 tiles 2kk and 2kk + 1:
 * which tile (0: 2kk, 1: 2kk + 1) and which C elements (first, first + 1) it packs. */
MMA_FN int mma_c_to_a_tile(int r) { return r >> 1; }
MMA_FN int mma_c_to_a_elem(int r) { return (r & 1) * 2; }

/* ---- 2. ldmatrix addressing: the tile row and 8-column chunk lane `lane` points at ----
 * A operand, 16 rows x 16 k (Q, dO, K or V as the row operand): matrices 0..3 = (rows 0-7,
 * k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15) = registers a0..a3. */
MMA_FN int mma_ldm_a_row(int lane) { return lane & 15; }
MMA_FN int mma_ldm_a_chunk(int lane) { return lane >> 4; }
/* B operand from a row-major [n][k] tile (K for S = Q K^T: n = key, k = head dim), two n8 tiles
 * x k16, non-transposed: matrices = (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7),
 * (n 8-15, k 8-15) = b0, b1 of n tile 0, then b0, b1 of n tile 1. */
MMA_FN int mma_ldm_bn_row(int lane) { return (lane & 7) + ((lane >> 4) << 3); }
MMA_FN int mma_ldm_bn_chunk(int lane) { return (lane >> 3) & 1; }
/* B operand from a row-major [k][n] tile (V for O = P V: k = key, n = head dim), k16 x two n8
 * tiles, with .trans: matrices = (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15),
 * (k 8-15, n 8-15) = b0, b1 of n tile 0, then of n tile 1. Same lanes as the A operand. */
MMA_FN int mma_ldm_bt_row(int lane) { return lane & 15; }
MMA_FN int mma_ldm_bt_chunk(int lane) { return lane >> 4; }

/* What ldmatrix delivers: lane `lane`, register j's half e (0 low, 1 high) is element
 * (row, col) of 8x8 matrix j, as given by these two (trans: the transposed matrix). */
MMA_FN int mma_ldm_dst_row(int lane, int e, bool trans) { return trans ? 2 * (lane & 3) + e : lane >> 2; }
MMA_FN int mma_ldm_dst_col(int lane, int e, bool trans) { return trans ? lane >> 2 : 2 * (lane & 3) + e; }

/* ---- 3. the XOR swizzle of 16-byte chunks in a row of `nchunks` (2, 4, 8 or 16) chunks ----
 * A 128-byte line holds 8 chunks = 8 / nchunks rows when nchunks < 8; the rows of one line get
 * XOR key 0 and the lines of an aligned group of 8 rows get keys 0 .. min(nchunks, 8) - 1, so
 * the 8 rows of a phase land on 8 distinct chunk positions modulo 128 bytes. */
MMA_FN int mma_swz_chunk(int row, int chunk, int nchunks) {
    const int per_line = nchunks >= 8 ? 1 : 8 / nchunks; /* rows per 128-byte line */
    const int mask = (nchunks >= 8 ? 8 : nchunks) - 1;
    return chunk ^ ((row / per_line) & mask);
}
/* Offset in halves of element (row, col) of a swizzled [rows][width] tile. */
MMA_FN int mma_swz_off(int row, int col, int width) {
    return row * width + mma_swz_chunk(row, col >> 3, width >> 3) * 8 + (col & 7);
}

/* The tile width (halves per shared-memory row) a head dim runs in: 16, 32, 64 or 128; 0 above
 * 128. Columns hd .. width - 1 are zeros in shared memory and never stored. */
MMA_FN int mma_width(int hd) {
    return hd < 1 ? 0 : hd <= 16 ? 16 : hd <= 32 ? 32 : hd <= 64 ? 64 : hd <= 128 ? 128 : 0;
}

/* Tile sizes of the kernels (cuda_attention_mma.cu) that depend on the width, shared with the
 * emulator of tests/unit/test_mma_layout.c: the query rows a dK/dV block takes per step (16 at
 * width 128, where 32 made CUDA 11.8's ptxas spill on sm_80 at 255 registers), and the keys a
 * dQ block takes per step. The forward is 64 x 64 at every width, and so are the other tiles. */
MMA_FN int mma_dkv_rows(int width) { return width >= 128 ? 16 : 64; }
MMA_FN int mma_dq_keys(int width) { return width >= 128 ? 32 : 64; }

/* ---- 4. causal tiles ---- */

/* Key tiles visited by the query tile starting at q0: all of them, or up to the one holding
 * the tile's last row (min(q0 + BR, T) - 1) when causal. */
MMA_FN int mma_kv_tiles(int q0, int BR, int BC, int T, bool causal) {
    const int end = causal ? (q0 + BR < T ? q0 + BR : T) : T;
    return (end + BC - 1) / BC;
}
/* true when no (row, key) of the tiles is masked: every key < T, and (causal) the tile's last
 * key is at or before its first row. Rows >= T are never stored, so they do not count. */
MMA_FN bool mma_tile_full(int q0, int k0, int BC, int T, bool causal) {
    return k0 + BC <= T && (!causal || k0 + BC - 1 <= q0);
}
/* The first query tile (of BR rows) with a row at or after key k0: earlier ones see none of
 * the key tile starting at k0 when causal. */
MMA_FN int mma_first_qtile(int k0, int BR, bool causal) { return causal ? k0 / BR : 0; }
/* The mask itself. */
MMA_FN bool mma_visible(int row, int key, int T, bool causal) {
    return key < T && (!causal || key <= row);
}

#undef MMA_FN
#endif
