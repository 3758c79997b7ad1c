/* cpu_attention.c - flash-style attention for the CPU device.
 *
 * Neither pass builds a T x T matrix: queries are taken in tiles of ATT_BR rows, and a tile's
 * scores against the keys it can see, S[br, kn], live in per-thread scratch (kn <= T, so scratch
 * is O(ATT_BR * T) per thread). The products are OpenBLAS sgemm calls on strided views of q, k, v
 * (which usually sit side by side in one fused projection output), run single-threaded inside our
 * parallel region.
 *
 * Forward, per (batch, head, query tile): S = scale * Q K^T; row softmax over the visible keys,
 * saving lse = max + log(sum exp); O = P V.
 * Backward, per (batch, kv head): dk and dv of that kv head are zeroed and then accumulated by
 * every query head of its group and every query tile, in a fixed order, by the one thread that
 * owns the item - no races, no atomics, bit-reproducible. Per tile, P is recomputed from Q, K and
 * lse; dP = dO V^T; D = rowsum(dO * O); dS = P * (dP - D); dQ = scale * dS K (written),
 * dK += scale * dS^T Q, dV += P^T dO. The backward thus has B * Hkv items to share out: plenty
 * for training shapes (GPT batch 8 x 6 heads = 48), but a microbatch of one sample with few kv
 * heads leaves threads idle.
 *
 * Every tile is computed by one thread with single-threaded sgemm calls, so the results do not
 * depend on which thread runs it, nor on the thread count. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "devices/cpu_internal.h"

/* Query rows per tile: S[64, T] stays in L2 for the sequence lengths we train on, and the
 * sgemm calls are big enough (64 x T x hd) for OpenBLAS to run near peak. */
#define ATT_BR 64

typedef struct att_args {
    const float *q, *k, *v;
    int ldq, ldk, ldv;
    int B, T, H, Hkv, hd, group; /* group = H / Hkv query heads per kv head */
    bool causal;
    float scale;
} att_args;

/* A query tile: rows [q0, q0 + br) of sample b; they see keys [0, kn). */
typedef struct att_tile {
    int b, h, q0, br, kn;
    const float *q, *k, *v; /* the tile's query rows, and the sample's keys and values (head h) */
} att_tile;

static att_tile tile_at(const att_args *a, int b, int h, int qb) {
    att_tile t;
    t.b = b, t.h = h, t.q0 = qb * ATT_BR;
    t.br = a->T - t.q0 < ATT_BR ? a->T - t.q0 : ATT_BR;
    t.kn = a->causal ? t.q0 + t.br : a->T; /* keys after the tile's last row are all masked */
    int hkv = h / a->group;
    t.q = a->q + ((int64_t)b * a->T + t.q0) * a->ldq + (int64_t)h * a->hd;
    t.k = a->k + (int64_t)b * a->T * a->ldk + (int64_t)hkv * a->hd;
    t.v = a->v + (int64_t)b * a->T * a->ldv + (int64_t)hkv * a->hd;
    return t;
}

/* Keys that row i of the tile sees. */
static int visible(const att_args *a, const att_tile *t, int i) {
    return a->causal ? t->q0 + i + 1 : t->kn;
}

/* S[br, kn] = scale * Q K^T for the tile. */
static void tile_scores(const att_args *a, const att_tile *t, float *S) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t->br, t->kn, a->hd, a->scale, t->q,
                a->ldq, t->k, a->ldk, 0.0f, S, t->kn);
}

/* S -> P, the row softmax over the visible keys (0 beyond); lse[i] = max + log(sum). */
static CPU_HOT void tile_softmax(const att_args *a, const att_tile *t, float *S, float *lse) {
    for (int i = 0; i < t->br; i++) {
        float *restrict row = S + (int64_t)i * t->kn;
        int nv = visible(a, t, i);
        float m = vmax(row, nv);
#pragma omp simd
        for (int j = 0; j < nv; j++) row[j] = exp_fast(row[j] - m);
        float sum = vsum(row, nv);
        float inv = 1.0f / sum;
#pragma omp simd
        for (int j = 0; j < nv; j++) row[j] *= inv;
        memset(row + nv, 0, (size_t)(t->kn - nv) * sizeof(float));
        lse[i] = m + logf(sum);
    }
}

/* S -> P = exp(S - lse) with the lse saved by the forward (0 on masked keys). */
static CPU_HOT void tile_recompute_p(const att_args *a, const att_tile *t, float *S,
                                     const float *lse) {
    for (int i = 0; i < t->br; i++) {
        float *restrict row = S + (int64_t)i * t->kn;
        int nv = visible(a, t, i);
        float l = lse[i];
#pragma omp simd
        for (int j = 0; j < nv; j++) row[j] = exp_fast(row[j] - l);
        memset(row + nv, 0, (size_t)(t->kn - nv) * sizeof(float));
    }
}

void cpu_attention_fwd(device *d, float *out, float *lse, const float *q, int ldq, const float *k,
                       int ldk, const float *v, int ldv, int B, int T, int H, int Hkv, int hd,
                       bool causal) {
    CHECK(Hkv > 0 && H % Hkv == 0 && hd > 0 && T > 0);
    att_args a = {.q = q, .k = k, .v = v, .ldq = ldq, .ldk = ldk, .ldv = ldv,
                  .B = B, .T = T, .H = H, .Hkv = Hkv, .hd = hd, .group = H / Hkv,
                  .causal = causal, .scale = 1.0f / sqrtf((float)hd)};
    int nqb = (T + ATT_BR - 1) / ATT_BR;
    int64_t BH = (int64_t)B * H, items = BH * nqb;
    int ldo = H * hd;
#pragma omp parallel num_threads(d->threads)
    {
        float *S = xmalloc((size_t)ATT_BR * T * sizeof(float));
        /* Most expensive tiles (last query tiles under causal masking) first, dealt round-robin:
         * a static schedule that stays balanced. Tiles are independent, so any order gives the
         * same bits. */
#pragma omp for schedule(static, 1)
        for (int64_t it = 0; it < items; it++) {
            int qb = nqb - 1 - (int)(it / BH);
            int b = (int)(it % BH) / H, h = (int)(it % BH) % H;
            att_tile t = tile_at(&a, b, h, qb);
            tile_scores(&a, &t, S);
            tile_softmax(&a, &t, S, lse + ((int64_t)b * H + h) * T + t.q0);
            /* O[br, hd] = P V */
            float *o = out + ((int64_t)b * T + t.q0) * ldo + (int64_t)h * hd;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t.br, hd, t.kn, 1.0f, S, t.kn,
                        t.v, ldv, 0.0f, o, ldo);
        }
        free(S);
    }
}

/* Scratch of one thread in the backward. */
typedef struct att_scratch {
    float *P, *dS; /* [ATT_BR, T] each */
} att_scratch;

/* dS = P * (dP - D) in place of dP, D_i = dO_i . O_i (= sum_j P_ij dP_ij, the softmax
 * Jacobian's term). */
static CPU_HOT void tile_ds(const att_tile *t, att_scratch *s, const float *dO, const float *O,
                            int ldo, int hd) {
    for (int i = 0; i < t->br; i++) {
        float Di = vdot(dO + (int64_t)i * ldo, O + (int64_t)i * ldo, hd);
        float *restrict ds = s->dS + (int64_t)i * t->kn;
        const float *restrict p = s->P + (int64_t)i * t->kn;
#pragma omp simd
        for (int j = 0; j < t->kn; j++) ds[j] = p[j] * (ds[j] - Di);
    }
}

/* One query tile's contribution: dq written, dk/dv (of the tile's kv head) accumulated. */
static void bwd_tile(const att_args *a, const att_tile *t, att_scratch *s, float *dq, float *dk,
                     float *dv, const float *dout, const float *out, const float *lse) {
    int hd = a->hd, ldo = a->H * hd, hkv = t->h / a->group;
    int64_t row0 = (int64_t)t->b * a->T + t->q0;
    const float *dO = dout + row0 * ldo + (int64_t)t->h * hd;
    const float *O = out + row0 * ldo + (int64_t)t->h * hd;
    float *dQ = dq + row0 * a->ldq + (int64_t)t->h * hd;
    float *dK = dk + (int64_t)t->b * a->T * a->ldk + (int64_t)hkv * hd;
    float *dV = dv + (int64_t)t->b * a->T * a->ldv + (int64_t)hkv * hd;

    tile_scores(a, t, s->P);
    tile_recompute_p(a, t, s->P, lse + ((int64_t)t->b * a->H + t->h) * a->T + t->q0);
    /* dP[br, kn] = dO V^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t->br, t->kn, hd, 1.0f, dO, ldo, t->v,
                a->ldv, 0.0f, s->dS, t->kn);
    tile_ds(t, s, dO, O, ldo, hd);
    /* dQ[br, hd] = scale * dS K (this tile's rows and head: written once) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t->br, hd, t->kn, a->scale, s->dS,
                t->kn, t->k, a->ldk, 0.0f, dQ, a->ldq);
    /* dK[kn, hd] += scale * dS^T Q;  dV[kn, hd] += P^T dO */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t->kn, hd, t->br, a->scale, s->dS, t->kn,
                t->q, a->ldq, 1.0f, dK, a->ldk);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t->kn, hd, t->br, 1.0f, s->P, t->kn, dO,
                ldo, 1.0f, dV, a->ldv);
}

void cpu_attention_bwd(device *d, float *dq, float *dk, float *dv, const float *dout,
                       const float *out, const float *lse, const float *q, int ldq,
                       const float *k, int ldk, const float *v, int ldv, int B, int T, int H,
                       int Hkv, int hd, bool causal) {
    CHECK(Hkv > 0 && H % Hkv == 0 && hd > 0 && T > 0);
    att_args a = {.q = q, .k = k, .v = v, .ldq = ldq, .ldk = ldk, .ldv = ldv,
                  .B = B, .T = T, .H = H, .Hkv = Hkv, .hd = hd, .group = H / Hkv,
                  .causal = causal, .scale = 1.0f / sqrtf((float)hd)};
    int nqb = (T + ATT_BR - 1) / ATT_BR;
    int64_t items = (int64_t)B * Hkv;
#pragma omp parallel num_threads(d->threads)
    {
        att_scratch s = {xmalloc((size_t)ATT_BR * T * sizeof(float)),
                         xmalloc((size_t)ATT_BR * T * sizeof(float))};
        /* One item = one (sample, kv head): the only writer of that dk/dv head. */
#pragma omp for schedule(static)
        for (int64_t it = 0; it < items; it++) {
            int b = (int)(it / Hkv), hkv = (int)(it % Hkv);
            for (int t = 0; t < T; t++) {
                int64_t r = (int64_t)b * T + t;
                memset(dk + r * ldk + (int64_t)hkv * hd, 0, (size_t)hd * sizeof(float));
                memset(dv + r * ldv + (int64_t)hkv * hd, 0, (size_t)hd * sizeof(float));
            }
            for (int j = 0; j < a.group; j++)
                for (int qb = 0; qb < nqb; qb++) {
                    att_tile tl = tile_at(&a, b, hkv * a.group + j, qb);
                    bwd_tile(&a, &tl, &s, dq, dk, dv, dout, out, lse);
                }
        }
        free(s.P);
        free(s.dS);
    }
}

/* ---------------------------------------------------------------------------------------------
 * attention against a KV cache (generation): one item per (new query row, head), each computed
 * by one thread in a fixed order, so the result does not depend on the thread count. A decode
 * step has n = 1 and H items; its work is O(H * (pos0+1) * hd), a matrix-vector product per head,
 * so plain loops serve (no sgemm). Scores live in a per-thread [pos0+n] scratch row. */
void cpu_attention_cached(device *d, float *out, const float *q, int ldq, const float *kc,
                          const float *vc, int n, int pos0, int H, int Hkv, int hd) {
    CHECK(Hkv > 0 && H % Hkv == 0 && hd > 0 && n >= 0 && pos0 >= 0);
    int group = H / Hkv, kvw = Hkv * hd, ctx = pos0 + n;
    float scale = 1.0f / sqrtf((float)hd);
    int64_t items = (int64_t)n * H;
#pragma omp parallel num_threads(d->threads) if (items * ctx * hd > CPU_PAR_MIN)
    {
        float *p = xmalloc((size_t)(ctx > 0 ? ctx : 1) * sizeof(float));
#pragma omp for schedule(static)
        for (int64_t it = 0; it < items; it++) {
            int i = (int)(it / H), h = (int)(it % H), g = h / group, nv = pos0 + i + 1;
            const float *qi = q + (int64_t)i * ldq + (int64_t)h * hd;
            for (int j = 0; j < nv; j++)
                p[j] = scale * vdot(qi, kc + (int64_t)j * kvw + (int64_t)g * hd, hd);
            float mx = vmax(p, nv);
            for (int j = 0; j < nv; j++) p[j] = exp_fast(p[j] - mx);
            float inv = 1.0f / vsum(p, nv);
            float *restrict o = out + (int64_t)i * H * hd + (int64_t)h * hd;
            memset(o, 0, (size_t)hd * sizeof(float));
            for (int j = 0; j < nv; j++) {
                const float *restrict vj = vc + (int64_t)j * kvw + (int64_t)g * hd;
                float pj = p[j];
#pragma omp simd
                for (int c = 0; c < hd; c++) o[c] += pj * vj[c];
            }
#pragma omp simd
            for (int c = 0; c < hd; c++) o[c] *= inv;
        }
        free(p);
    }
}
