/* test_cost.c - the cost model: collectives, analytic estimates, profiled curves, memory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/hostinfo.h"
#include "common/log.h"
#include "common/nccl_budget.h"
#include "common/strutil.h"
#include "planner/cluster.h"
#include "planner/cost.h"
#include "planner/engine_mem.h"

static void build(cost_model *cm, cluster *cl, const char *cluster_yaml, const char *model, int seq, int batch, precision prec,
                  const profile *prof) {
    static model_spec m; /* the cost model keeps a pointer */
    err_t err;
    if (cluster_load_string("c.yaml", cluster_yaml, strlen(cluster_yaml), cl, &err) < 0) fail_msg("%s", err.msg);
    assert_int_equal(model_resolve(model, &m, &err), 0);
    cost_opts co = {.prec = prec, .mem_cap = 0.8, .prof = prof};
    if (cost_build(cm, &m, cl, seq, batch, &co, &err) < 0) fail_msg("%s", err.msg);
}

static const char two_nodes[] = "nodes:\n"
                                "  - {name: a, network_gbps: 50, gpus: [{type: A100-40GB, count: 2}]}\n"
                                "  - {name: b, network_gbps: 25, gpus: [{type: P40, count: 2}]}\n";

/* Ring collectives: (N-1) alpha + (N-1)/N bytes / beta, beta the slowest NIC. */
static void test_ring_collectives(void **state) {
    (void)state;
    cost_model cm;
    cluster cl;
    build(&cm, &cl, two_nodes, "gpt2-124m", 1024, 8, PREC_FP32, NULL);
    double bytes = (double)model_kind_params(cm.model, UNIT_BLOCK) * 4;
    double one = 3 * 0.030 + 3.0 / 4 * bytes / (25e9 / 8) * 1e3;
    double emb = (double)model_kind_params(cm.model, UNIT_EMBEDDING) * 4;
    double one_emb = 3 * 0.030 + 3.0 / 4 * emb / (25e9 / 8) * 1e3;
    /* the backward gathers every block and the embedding (recomputed from its checkpoint) */
    assert_true(fabs(cm.comm.ag_bwd_ms - (12 * one + one_emb)) < 1e-9);
    assert_true(fabs(cm.comm.bandwidth_gbs - 25.0 / 8) < 1e-12);
    /* uneven shards cost 15% more, for every collective */
    assert_true(fabs(cost_bwd_floor(&cm, true) / cost_bwd_floor(&cm, false) - 1.15) < 1e-12);
    /* fp16 gathers half the bytes (also on the P40s), reduces gradients in fp32 */
    cost_model cm16;
    cluster cl16;
    build(&cm16, &cl16, two_nodes, "gpt2-124m", 1024, 8, PREC_FP16, NULL);
    assert_true(cm16.comm.ag_bwd_ms < cm.comm.ag_bwd_ms * 0.6);
    assert_true(fabs(cm16.comm.rs_ms - cm.comm.rs_ms) < 1e-9);
    /* the tied head gathers the embedding again in the forward */
    assert_true(cm.comm.ag_fwd_ms > cm.comm.ag_bwd_ms);
    cost_free(&cm16), cluster_free(&cl16), cost_free(&cm), cluster_free(&cl);
}

static void test_single_node_uses_intra_link(void **state) {
    (void)state;
    cost_model cm;
    cluster cl;
    build(&cm, &cl, "nodes: [{name: a, network_gbps: 10, intra_gbps: 200, gpus: [{type: L4, count: 4}]}]\n", "bert-large", 512, 8,
          PREC_FP32, NULL);
    assert_true(fabs(cm.comm.bandwidth_gbs - 25) < 1e-12);
    cost_free(&cm), cluster_free(&cl);
}

static void test_analytic_estimates(void **state) {
    (void)state;
    cost_model cm;
    cluster cl;
    build(&cm, &cl, two_nodes, "bert-large", 512, 64, PREC_FP32, NULL);
    const cost_group *a100 = &cm.groups[0], *p40 = &cm.groups[1];
    assert_int_equal(cm.n_groups, 2);
    assert_int_equal(a100->count, 2);
    assert_false(a100->measured);
    for (int m = 1; m < 32; m++) {
        assert_true(a100->fwd_ms[m + 1] > a100->fwd_ms[m]); /* more samples take longer */
        assert_true(a100->fwd_ms[m + 1] / (m + 1) <= a100->fwd_ms[m] / m); /* ...but less per sample */
        assert_true(p40->fwd_ms[m] > a100->fwd_ms[m]);
        assert_true(a100->bwd_ms[m] > 2 * a100->fwd_ms[m] * 0.5);
    }
    /* compute memory is linear in the microbatch until the head's logits reach their cap
     * (bert-large, seq 512, vocabulary 30522: 2176 rows of fp32 logits fit 256 MiB, 4.25
     * samples), and from there on grows by the rest only: a sample's 512 rows of logits and row
     * losses less */
    int64_t V = cm.model->vocab, fit = ENGINE_HEAD_LOGITS_BYTES / (4 * V) / 64 * 64;
    assert_int_equal(fit, 2176);
    assert_int_equal(engine_head_chunk_rows(cm.model, 4, 512), 2048);
    assert_int_equal(engine_head_chunk_rows(cm.model, 5, 512), fit);
    int64_t d1 = cost_compute_bytes(a100, 2) - cost_compute_bytes(a100, 1);
    int64_t d3 = cost_compute_bytes(a100, 4) - cost_compute_bytes(a100, 3);
    int64_t d2 = cost_compute_bytes(a100, 9) - cost_compute_bytes(a100, 8);
    int64_t d4 = cost_compute_bytes(a100, 12) - cost_compute_bytes(a100, 11);
    assert_true(llabs(d1 - d3) <= 1 && llabs(d2 - d4) <= 1);
    assert_true(llabs(d1 - d2 - 512 * (V + 1) * 4) <= 1);
    /* ... and is what the engine allocates, to the byte (the reserve aside) */
    engine_opts eo = {.sharded = true, .prec = PREC_FP32, .double_buffer = true};
    for (int m = 0; m <= 12; m++)
        assert_true(llabs(cost_compute_bytes(a100, m) - engine_compute_bytes(cm.model, 512, m, eo) -
                          (int64_t)GPU_RESERVED_BYTES - nccl_device_bytes(cl.n_devices, 8)) <= 1);
    /* mmax is the largest microbatch that fits the usable memory */
    assert_true((double)cost_compute_bytes(p40, p40->mmax) <= p40->usable_bytes);
    assert_true(p40->mmax == p40->mlimit || (double)cost_compute_bytes(p40, p40->mmax + 1) > p40->usable_bytes);
    /* the even state share rounds every unit up */
    int64_t even = 0;
    for (int u = 0; u < model_n_units(cm.model); u++) even += (model_unit_params(cm.model, u) + 3) / 4;
    assert_int_equal(cm.even_state_params, even);
    cost_free(&cm), cluster_free(&cl);
    /* fp16 speeds up an Ampere GPU (tensor cores), not a Pascal one (the fp32 rate) */
    cost_model c16;
    build(&c16, &cl, two_nodes, "bert-large", 512, 64, PREC_FP16, NULL);
    cost_model c32;
    cluster cl32;
    build(&c32, &cl32, two_nodes, "bert-large", 512, 64, PREC_FP32, NULL);
    assert_true(c16.groups[0].fwd_ms[8] < 0.7 * c32.groups[0].fwd_ms[8]);
    assert_true(c16.groups[1].fwd_ms[8] > 0.9 * c32.groups[1].fwd_ms[8]);
    cost_free(&c16), cluster_free(&cl), cost_free(&c32), cluster_free(&cl32);
}

/* A cost model, or the error of cost_build (-1). */
static int try_build(cost_model *cm, cluster *cl, const char *cluster_yaml, precision prec, err_t *err) {
    static model_spec m;
    if (cluster_load_string("c.yaml", cluster_yaml, strlen(cluster_yaml), cl, err) < 0) fail_msg("%s", err->msg);
    assert_int_equal(model_resolve("gpt2-124m", &m, err), 0);
    cost_opts co = {.prec = prec, .mem_cap = 0.8};
    int rc = cost_build(cm, &m, cl, 256, 16, &co, err);
    if (rc < 0) cluster_free(cl);
    return rc;
}

static const char volta_turing[] = "nodes:\n"
                                   "  - {name: v, network_gbps: 100, gpus: [{type: V100-16GB, count: 2}]}\n"
                                   "  - {name: t, network_gbps: 100, gpus: [{type: T4, count: 2}]}\n";
static const char pascal[] = "nodes:\n"
                             "  - {name: p, network_gbps: 50, gpus: [{type: P40, count: 2}, {type: P100, count: 2}]}\n";
static const char ampere[] = "nodes:\n"
                             "  - {name: a, network_gbps: 50, gpus: [{type: A100-40GB, count: 2}, {type: L4, count: 2}]}\n";

/* fp16 costs memory exactly as bf16 does: 2-byte gathers, the same engine buffers. */
static void test_fp16_memory_like_bf16(void **state) {
    (void)state;
    err_t err;
    cost_model c16, cb16, c32;
    cluster l16, lb16, l32;
    assert_int_equal(try_build(&c16, &l16, ampere, PREC_FP16, &err), 0);
    assert_int_equal(try_build(&cb16, &lb16, ampere, PREC_BF16, &err), 0);
    assert_int_equal(try_build(&c32, &l32, ampere, PREC_FP32, &err), 0);
    for (int g = 0; g < c16.n_groups; g++) {
        assert_true(c16.groups[g].m0 == cb16.groups[g].m0 && c16.groups[g].m1 == cb16.groups[g].m1);
        assert_int_equal(c16.groups[g].mmax, cb16.groups[g].mmax);
        assert_true(c16.groups[g].m0 != c32.groups[g].m0); /* the 16-bit gather buffers */
        /* A100 and L4 run fp16 and bf16 at the same tensor rate */
        assert_true(fabs(c16.groups[g].fwd_ms[4] - cb16.groups[g].fwd_ms[4]) < 1e-12);
    }
    assert_true(c16.comm.ag_bwd_ms == cb16.comm.ag_bwd_ms);
    assert_true(c16.comm.ag_bwd_ms < 0.6 * c32.comm.ag_bwd_ms);
    const model_spec *m = c16.model;
    engine_opts e16 = {.sharded = true, .prec = PREC_FP16, .double_buffer = true}, eb = e16, e32 = e16;
    eb.prec = PREC_BF16;
    e32.prec = PREC_FP32;
    for (int mb = 0; mb < 4; mb++) {
        assert_int_equal(engine_compute_bytes(m, 256, mb, e16), engine_compute_bytes(m, 256, mb, eb));
        assert_true(engine_compute_bytes(m, 256, mb, e16) > engine_compute_bytes(m, 256, mb, e32));
    }
    cost_free(&c16), cost_free(&cb16), cost_free(&c32);
    cluster_free(&l16), cluster_free(&lb16), cluster_free(&l32);
}

/* Recompute none: the planner's M(m, l) is the engine's bytes with l microbatches kept (GPU
 * reserve and NCCL aside, as for full), it grows with m and l, and never falls below full's; the
 * backward phase drops exactly the blocks' recompute (L x the forward of a block). */
static void test_recompute_none_costs(void **state) {
    (void)state;
    err_t err;
    cost_model cm;
    cluster cl;
    assert_int_equal(try_build(&cm, &cl, ampere, PREC_BF16, &err), 0);
    const model_spec *m = cm.model;
    for (int g = 0; g < cm.n_groups; g++) {
        const cost_group *cg = &cm.groups[g];
        engine_opts full = {.sharded = true, .prec = PREC_BF16, .double_buffer = true}, none = full;
        none.recompute = RECOMPUTE_NONE;
        for (int mb = 1; mb <= 4; mb++)
            for (int l = 1; l <= 3; l++) {
                none.kept = l;
                int64_t extra = engine_compute_bytes(m, 256, mb, none) - engine_compute_bytes(m, 256, mb, full);
                assert_true(extra > 0);
                assert_int_equal(cost_compute_bytes_mode(cg, mb, l, RECOMPUTE_NONE) - cost_compute_bytes(cg, mb), extra);
                assert_int_equal(cost_compute_bytes_mode(cg, mb, l, RECOMPUTE_FULL), cost_compute_bytes(cg, mb));
                if (l > 1) assert_true(cost_compute_bytes_mode(cg, mb, l, RECOMPUTE_NONE) > cost_compute_bytes_mode(cg, mb, l - 1, RECOMPUTE_NONE));
            }
        /* K_full - K_none = L x block forward = (F - embedding forward - head) over the blocks:
         * both below F, and the difference positive */
        for (int mb = 1; mb <= 4; mb++) {
            double saved = cost_bwd_ms(cg, mb, RECOMPUTE_FULL) - cost_bwd_ms(cg, mb, RECOMPUTE_NONE);
            assert_true(saved > 0 && saved < cg->fwd_ms[mb]);
        }
    }
    /* each unit kind's saved buffers: a lookup embedding keeps nothing, a block all it computes */
    assert_int_equal(engine_saved_mask(m, UNIT_EMBEDDING), 0u);
    assert_true(engine_saved_mask(m, UNIT_BLOCK) & (1u << ES_QKV));
    assert_int_equal(engine_saved_sets(m, RECOMPUTE_FULL, 5), 1);
    assert_int_equal(engine_saved_sets(m, RECOMPUTE_NONE, 5), 1 + (model_n_units(m) - 1) * 5);
    cost_free(&cm);
    cluster_free(&cl);
}

/* fp16 runs at each GPU's fp16 tensor rate: V100 112, T4 65 TFLOP/s (fp32: 14.1, 8.1). */
static void test_fp16_rates(void **state) {
    (void)state;
    err_t err;
    cost_model c16, c32;
    cluster l16, l32;
    assert_int_equal(try_build(&c16, &l16, volta_turing, PREC_FP16, &err), 0);
    assert_int_equal(try_build(&c32, &l32, volta_turing, PREC_FP32, &err), 0);
    assert_float_equal(c16.groups[0].peak_tflops, 112, 1e-9);
    assert_float_equal(c16.groups[1].peak_tflops, 65, 1e-9);
    assert_float_equal(c32.groups[0].peak_tflops, 14.1, 1e-9);
    assert_float_equal(c32.groups[1].peak_tflops, 8.1, 1e-9);
    for (int g = 0; g < 2; g++) assert_true(c16.groups[g].fwd_ms[8] < 0.5 * c32.groups[g].fwd_ms[8]);
    cost_free(&c16), cost_free(&c32), cluster_free(&l16), cluster_free(&l32);
}

/* Pascal has no tensor cores: fp16 plans at the fp32 rate, with the 16-bit memory. */
static void test_pascal_fp16_at_fp32_rate(void **state) {
    (void)state;
    err_t err;
    cost_model c16, c32;
    cluster l16, l32;
    assert_int_equal(try_build(&c16, &l16, pascal, PREC_FP16, &err), 0);
    assert_int_equal(try_build(&c32, &l32, pascal, PREC_FP32, &err), 0);
    assert_float_equal(c16.groups[0].peak_tflops, 11.8, 1e-9); /* P40 */
    assert_float_equal(c16.groups[1].peak_tflops, 9.3, 1e-9);  /* P100 */
    for (int g = 0; g < 2; g++) {
        assert_float_equal(c16.groups[g].peak_tflops, c32.groups[g].peak_tflops, 1e-12);
        /* the same compute; only the halved traffic makes it a little faster */
        assert_true(c16.groups[g].fwd_ms[8] <= c32.groups[g].fwd_ms[8]);
        assert_true(c16.groups[g].fwd_ms[8] > 0.8 * c32.groups[g].fwd_ms[8]);
    }
    assert_true(c16.comm.ag_bwd_ms < 0.6 * c32.comm.ag_bwd_ms);
    cost_free(&c16), cost_free(&c32), cluster_free(&l16), cluster_free(&l32);
}

/* bf16 before sm_80 is refused, naming each GPU type, its compute capability and fp16. */
static void test_bf16_refused_before_ampere(void **state) {
    (void)state;
    err_t err;
    cost_model cm;
    cluster cl;
    assert_int_equal(try_build(&cm, &cl, volta_turing, PREC_BF16, &err), -1);
    assert_non_null(strstr(err.msg, "V100-16GB (compute capability 7.0) and T4 (compute capability 7.5) have no bf16"));
    assert_non_null(strstr(err.msg, "use precision fp16 (tensor cores) or fp32"));
    assert_int_equal(try_build(&cm, &cl, pascal, PREC_BF16, &err), -1);
    assert_non_null(strstr(err.msg, "P40 (compute capability 6.1) and P100 (compute capability 6.0) have no bf16"));
    assert_non_null(strstr(err.msg, "no tensor cores"));
    /* one pre-Ampere GPU among Ampere ones is enough */
    assert_int_equal(try_build(&cm, &cl, "nodes: [{name: a, gpus: [{type: A10G, count: 3}, {type: T4}]}]\n", PREC_BF16, &err), -1);
    assert_non_null(strstr(err.msg, "T4 (compute capability 7.5) has no bf16"));
    assert_null(strstr(err.msg, "A10G"));
    /* Ampere and later, and CPU devices, run it */
    assert_int_equal(try_build(&cm, &cl, ampere, PREC_BF16, &err), 0);
    cost_free(&cm), cluster_free(&cl);
    assert_int_equal(try_build(&cm, &cl, "nodes: [{name: c, gpus: [{type: cpu, threads: 1, memory_gib: 2, count: 2}]}]\n",
                               PREC_BF16, &err), 0);
    cost_free(&cm), cluster_free(&cl);
    /* a GPU of unknown compute capability (the operator's unknown product) is planned as asked */
    assert_int_equal(cluster_load_string("c.yaml", volta_turing, strlen(volta_turing), &cl, &err), 0);
    for (int d = 0; d < cl.n_devices; d++) cl.devices[d].cc_major = 0;
    assert_int_equal(cluster_check_precision(&cl, PREC_BF16, "--precision", &err), 0);
    cl.devices[0].cc_major = 7;
    assert_int_equal(cluster_check_precision(&cl, PREC_BF16, "--precision", &err), -1);
    assert_non_null(strstr(err.msg, "--precision bf16: V100-16GB"));
    assert_int_equal(cluster_check_precision(&cl, PREC_FP16, "--precision", &err), 0);
    assert_int_equal(cluster_check_precision(&cl, PREC_FP32, "--precision", &err), 0);
    cluster_free(&cl);
}

static const char profile_json[] =
    "{\"format\": \"cephalo-profile\", \"version\": 1, \"entries\": [\n"
    " {\"device\": \"Tesla-P40\", \"model\": \"bert-large\", \"seq\": 512, \"precision\": \"fp32\",\n"
    "  \"microbatch\": [1, 2, 4, 8], \"block\": {\"fwd_ms\": [3, 5, 9, 17], \"bwd_ms\": [6, 10, 18, 34]},\n"
    "  \"head\": {\"fwd_ms\": [1, 2, 4, 8], \"bwd_ms\": [2, 4, 8, 16]},\n"
    "  \"embedding\": {\"fwd_ms\": [0.1, 0.2, 0.4, 0.8], \"bwd_ms\": [0.2, 0.4, 0.8, 1.6]},\n"
    "  \"compute_bytes\": [3e9, 4e9, 6e9, 10e9]}],\n"
    " \"comm\": [{\"world\": 4, \"op\": \"allgather\", \"bytes\": [0, 1e8], \"ms\": [1, 11], \"uneven_ms\": [1.2, 13.2]},\n"
    "          {\"world\": 4, \"op\": \"reduce_scatter\", \"bytes\": [0, 1e8], \"ms\": [1, 11]}]}\n";

/* A version 2 profile's measured backward phases without the recompute (bwd_keep_ms) price
 * recompute none; full stays L (fwd + bwd) + emb bwd. */
static void test_profiled_keep(void **state) {
    (void)state;
    static const char v2[] =
        "{\"format\": \"cephalo-profile\", \"version\": 2, \"entries\": [\n"
        " {\"device\": \"Tesla-P40\", \"model\": \"bert-large\", \"seq\": 512, \"precision\": \"fp32\",\n"
        "  \"microbatch\": [1, 2, 4, 8], \"block\": {\"fwd_ms\": [3, 5, 9, 17], \"bwd_ms\": [6, 10, 18, 34],\n"
        "  \"bwd_keep_ms\": [7, 12, 21, 40]},\n"
        "  \"head\": {\"fwd_ms\": [1, 2, 4, 8], \"bwd_ms\": [2, 4, 8, 16]},\n"
        "  \"embedding\": {\"fwd_ms\": [0.1, 0.2, 0.4, 0.8], \"bwd_ms\": [0.2, 0.4, 0.8, 1.6],\n"
        "  \"bwd_keep_ms\": [0.1, 0.3, 0.5, 0.9]}}]}\n";
    profile prof;
    err_t err;
    if (profile_load_string("p.json", v2, strlen(v2), &prof, &err) < 0) fail_msg("%s", err.msg);
    cost_model cm;
    cluster cl;
    build(&cm, &cl, two_nodes, "bert-large", 512, 64, PREC_FP32, &prof);
    const cost_group *p40 = &cm.groups[1];
    assert_true(p40->measured);
    int L = 24;
    assert_true(fabs(cost_bwd_ms(p40, 2, RECOMPUTE_NONE) - (L * 12 + 0.3)) < 1e-9);
    assert_true(fabs(cost_bwd_ms(p40, 3, RECOMPUTE_NONE) - (L * 16.5 + 0.4)) < 1e-9); /* linear */
    assert_true(fabs(cost_bwd_ms(p40, 2, RECOMPUTE_FULL) - (L * (5 + 10) + 0.4)) < 1e-9);
    cost_free(&cm), cluster_free(&cl);
    profile_free(&prof);
}

static void test_profiled_costs(void **state) {
    (void)state;
    profile prof;
    err_t err;
    if (profile_load_string("p.json", profile_json, strlen(profile_json), &prof, &err) < 0) fail_msg("%s", err.msg);
    cost_model cm;
    cluster cl;
    build(&cm, &cl, two_nodes, "bert-large", 512, 64, PREC_FP32, &prof);
    const cost_group *a100 = &cm.groups[0], *p40 = &cm.groups[1];
    assert_false(a100->measured);
    assert_true(p40->measured); /* matched through the GFD alias */
    int L = 24;
    /* at a profiled point: emb fwd + L block fwd + head fwd + bwd, and L (recompute + bwd) + emb bwd */
    assert_true(fabs(p40->fwd_ms[2] - (0.2 + L * 5 + 2 + 4)) < 1e-9);
    assert_true(fabs(p40->bwd_ms[2] - (L * (5 + 10) + 0.4)) < 1e-9);
    /* recompute none from a version 1 profile: the block's bwd (its backward phase less its
     * forward) and the embedding's whole backward phase */
    assert_true(fabs(cost_bwd_ms(p40, 2, RECOMPUTE_NONE) - (L * 10 + 0.4)) < 1e-9);
    /* between points: linear */
    assert_true(fabs(p40->fwd_ms[3] - (0.3 + L * 7 + 3 + 6)) < 1e-9);
    /* beyond the last point: the fitted slope of the upper half (2 ms per sample for block fwd) */
    assert_true(fabs(p40->fwd_ms[10] - (1.0 + L * 21 + 10 + 20)) < 1e-9);
    /* compute memory: the least-squares line through the points less the head's logits (the
     * points are 2e9 + 1e9 m, so the line is not exact), plus the head's logits at m, plus
     * NCCL's own buffers on every GPU of a multi-GPU job, which no profile measures (a P40:
     * 16 channels x 2 connections x (4 MiB + 4.6875 MiB + 512 KiB) + 64 MiB) */
    int64_t nccl = nccl_device_bytes(cl.n_devices, 6);
    assert_true(cl.n_devices > 1 && nccl == 64 * 1048576 + 16 * 2 * (4 * 1048576 + 4915200 + 524288));
    const double xs[4] = {1, 2, 4, 8};
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (int i = 0; i < 4; i++) {
        double y = 2e9 + 1e9 * xs[i] - (double)engine_head_bytes(cm.model, 512, (int)xs[i]);
        sx += xs[i], sy += y, sxx += xs[i] * xs[i], sxy += xs[i] * y;
    }
    double slope = (4 * sxy - sx * sy) / (4 * sxx - sx * sx), icpt = (sy - slope * sx) / 4;
    double want = icpt + slope * 5 + (double)engine_head_bytes(cm.model, 512, 5) + (double)nccl;
    assert_true(fabs((double)cost_compute_bytes(p40, 5) - want) <= 2);
    /* measured collectives and their uneven ratio */
    assert_true(cm.comm.measured);
    assert_true(fabs(cm.comm.uneven_factor - 1.2) < 1e-9);
    double bytes = (double)model_kind_params(cm.model, UNIT_BLOCK) * 4;
    double emb = (double)model_kind_params(cm.model, UNIT_EMBEDDING) * 4;
    assert_true(fabs(cm.comm.ag_bwd_ms - (L * (1 + 10 * bytes / 1e8) + 1 + 10 * emb / 1e8)) < 1e-6);
    /* no step check in this profile: nothing added */
    assert_true(cm.comm.overhead_ms == 0);
    double exposed = cost_exposed_ms(&cm, false);
    cost_free(&cm), cluster_free(&cl);

    /* the step check's overhead per collective: times the step's collectives, in the exposed time
     * (bert-large: 26 units, the head tied: 27 + 25 gathers, 27 reduce-scatters, the loss's 2) */
    prof.comm[0].train_overhead_ms = 0.01;
    build(&cm, &cl, two_nodes, "bert-large", 512, 64, PREC_FP32, &prof);
    assert_int_equal(cost_step_collectives(cm.model), 27 + 25 + 27 + 2);
    assert_true(fabs(cm.comm.overhead_ms - 0.01 * 81) < 1e-9);
    assert_true(fabs(cost_exposed_ms(&cm, false) - (exposed + 0.81)) < 1e-9);
    assert_true(fabs(cost_exposed_ms(&cm, true) - (exposed * 1.2 + 0.81)) < 1e-9); /* not scaled as bytes are */
    cost_free(&cm), cluster_free(&cl), profile_free(&prof);
}

/* CPU devices of one host with more threads than its cores each get cores/threads of a core: every
 * analytic time (units and optimizer) grows by threads/cores, and not when the cores suffice or
 * are not known (a cluster file). */
static void test_cpu_cores_shared(void **state) {
    (void)state;
    static const char three[] = "nodes: [{name: a, gpus: [{type: cpu, count: 3, threads: 1, memory_gib: 1}]}]\n";
    static model_spec m;
    err_t err;
    assert_int_equal(model_resolve("tiny-gpt", &m, &err), 0);
    cost_opts co = {.prec = PREC_FP32, .mem_cap = 0.8};
    double ratio[3];
    const int cores[3] = {0, 2, 4}; /* unknown, fewer than the 3 threads, enough */
    cost_model base;
    cluster cl0;
    assert_int_equal(cluster_load_string("c.yaml", three, strlen(three), &cl0, &err), 0);
    assert_int_equal(cost_build(&base, &m, &cl0, 64, 12, &co, &err), 0);
    for (int k = 0; k < 3; k++) {
        cluster cl;
        cost_model cm;
        assert_int_equal(cluster_load_string("c.yaml", three, strlen(three), &cl, &err), 0);
        cl.nodes[0].host_cores = cores[k];
        assert_int_equal(cost_build(&cm, &m, &cl, 64, 12, &co, &err), 0);
        ratio[k] = cm.groups[0].fwd_ms[4] / base.groups[0].fwd_ms[4];
        for (int mb = 1; mb <= cm.groups[0].mlimit; mb++) {
            assert_true(fabs(cm.groups[0].fwd_ms[mb] / base.groups[0].fwd_ms[mb] - ratio[k]) < 1e-12);
            assert_true(fabs(cm.groups[0].bwd_ms[mb] / base.groups[0].bwd_ms[mb] - ratio[k]) < 1e-12);
        }
        assert_true(fabs(cm.groups[0].opt_ms_per_param / base.groups[0].opt_ms_per_param - ratio[k]) < 1e-12);
        cost_free(&cm), cluster_free(&cl);
    }
    assert_true(fabs(ratio[0] - 1) < 1e-12 && fabs(ratio[1] - 1.5) < 1e-12 && fabs(ratio[2] - 1) < 1e-12);
    cost_free(&base), cluster_free(&cl0);
}

/* CPU devices of one host talk over loopback (its latency and copy rate, not a GPU node's link);
 * when their threads and one communicator per rank oversubscribe the host's cores, the
 * collectives take cores from compute (their whole time exposed, the floors gone) and each waits
 * a wake-up; with enough cores, or cores unknown, neither. */
static void test_cpu_loopback_collectives(void **state) {
    (void)state;
    static const char two[] = "nodes: [{name: a, gpus: [{type: cpu, count: 2, threads: 1, memory_gib: 1}]}]\n";
    static model_spec m;
    err_t err;
    assert_int_equal(model_resolve("tiny-gpt", &m, &err), 0);
    cost_opts co = {.prec = PREC_FP32, .mem_cap = 0.8};
    const int cores[3] = {0, 2, 4}; /* unknown; fewer than 2 threads + 2 communicators; enough */
    for (int k = 0; k < 3; k++) {
        cluster cl;
        cost_model cm;
        assert_int_equal(cluster_load_string("c.yaml", two, strlen(two), &cl, &err), 0);
        cl.nodes[0].host_cores = cores[k];
        assert_int_equal(cost_build(&cm, &m, &cl, 64, 8, &co, &err), 0);
        const cost_comm *c = &cm.comm;
        assert_true(fabs(c->alpha_ms - 0.06) < 1e-12 && fabs(c->bandwidth_gbs - 1.6) < 1e-12);
        double blk = (double)model_kind_params(&m, UNIT_BLOCK) * 4;
        assert_true(fabs(c->rs_last_ms - (0.06 + 0.5 * (double)model_kind_params(&m, UNIT_EMBEDDING) * 4 / 1.6e9 * 1e3)) < 1e-9);
        bool contends = k == 1;
        if (contends) {
            assert_true(fabs(c->cpu_fwd_ms - c->ag_fwd_ms) < 1e-12);
            assert_true(fabs(c->cpu_bwd_ms - (c->ag_bwd_ms + c->rs_ms)) < 1e-12);
            assert_true(fabs(c->overhead_ms - 0.25 * cost_step_collectives(&m)) < 1e-12);
            assert_true(cost_fwd_floor(&cm, false) == 0 && cost_bwd_floor(&cm, false) == 0);
        } else {
            assert_true(c->cpu_fwd_ms == 0 && c->cpu_bwd_ms == 0 && c->overhead_ms == 0);
            assert_true(cost_fwd_floor(&cm, false) >= m.n_layer * (0.06 + 0.5 * blk / 1.6e9 * 1e3) - 1e-12);
        }
        cost_free(&cm), cluster_free(&cl);
    }
}

/* $CEPHALO_ADAMW=half's 16-bit shard copy is state: 2 bytes a parameter more in a bf16/fp16 plan,
 * nothing in fp32 (the mode is `unit` there); the cost model carries what the strategies use. */
static void test_state_bytes_adamw_half(void **state) {
    (void)state;
    static const char two[] = "nodes: [{name: a, gpus: [{type: cpu, count: 2, threads: 1, memory_gib: 1}]}]\n";
    static model_spec m;
    err_t err;
    assert_int_equal(model_resolve("tiny-gpt", &m, &err), 0);
    const precision precs[3] = {PREC_FP32, PREC_BF16, PREC_FP16};
    for (int half = 0; half <= 1; half++)
        for (int k = 0; k < 3; k++) {
            engine_set_adamw_half(half);
            int want = STATE_BYTES_PER_PARAM + (half && precs[k] != PREC_FP32 ? 2 : 0);
            assert_int_equal(engine_state_bytes_per_param(precs[k]), want);
            cluster cl;
            cost_model cm;
            cost_opts co = {.prec = precs[k], .mem_cap = 0.8};
            assert_int_equal(cluster_load_string("c.yaml", two, strlen(two), &cl, &err), 0);
            assert_int_equal(cost_build(&cm, &m, &cl, 64, 8, &co, &err), 0);
            assert_int_equal(cm.state_bpp, want);
            cost_free(&cm), cluster_free(&cl);
        }
    engine_set_adamw_half(-1);
}

/* 16-bit activations ($CEPHALO_ACTS=16): with recompute none each kept block's GEMM and attention
 * operands (GPT: ln1, q|k|v, attention output, ln2, MLP hidden and activation) take 2 bytes a
 * value instead of 4, and the unit at work one fp32 copy of them; recompute full and fp32 runs
 * are unchanged. Written from the buffers' shapes here, not from engine_mem.c's loops. */
static void test_acts16_memory(void **state) {
    (void)state;
    static model_spec m;
    err_t err;
    assert_int_equal(model_resolve("gpt2-124m", &m, &err), 0);
    const int seq = 1024, mb = 2;
    int64_t N = (int64_t)mb * seq, D = m.d_model, ff = m.d_ff;
    int64_t block16 = N * (D + 3 * D + D + D + ff + ff); /* floats of one set's 16-bit buffers */
    for (int kept = 1; kept <= 3; kept++)
        for (int p = 0; p < 3; p++) {
            precision prec = (precision[]){PREC_FP32, PREC_BF16, PREC_FP16}[p];
            for (int r = 0; r < 2; r++) {
                engine_opts o = {.sharded = true, .prec = prec, .recompute = r ? RECOMPUTE_NONE : RECOMPUTE_FULL,
                                 .kept = kept};
                engine_set_acts16(0);
                int64_t b32 = engine_compute_bytes(&m, seq, mb, o);
                engine_set_acts16(1);
                int64_t b16 = engine_compute_bytes(&m, seq, mb, o);
                int64_t want = prec == PREC_FP32 || !r ? 0 : (int64_t)m.n_layer * kept * block16 * 2 - block16 * 4;
                if (b32 - b16 != want)
                    fail_msg("%s kept %d recompute %s: 16-bit activations save %lld bytes, expected %lld",
                             precision_name(prec), kept, r ? "none" : "full", (long long)(b32 - b16), (long long)want);
            }
        }
    engine_set_acts16(-1);
}

/* An embedding reads the rows its tokens look up: once the table has more rows than a sample's
 * tokens, its size does not change the embedding's time (the backward without recompute is the
 * blocks' and the embedding's; the blocks do not see the vocabulary). */
static void test_embedding_reads_rows(void **state) {
    (void)state;
    static const char one[] = "nodes: [{name: a, gpus: [{type: cpu, count: 1, threads: 1, memory_gib: 4}]}]\n";
    static model_spec small, big;
    err_t err;
    const char *ys = "base: tiny-gpt\nname: v1\nvocab: 1024\n", *yb = "base: tiny-gpt\nname: v2\nvocab: 50257\n";
    assert_int_equal(model_load_string("s.yaml", ys, strlen(ys), &small, &err), 0);
    assert_int_equal(model_load_string("b.yaml", yb, strlen(yb), &big, &err), 0);
    cost_opts co = {.prec = PREC_FP32, .mem_cap = 0.8};
    cluster c1, c2;
    cost_model a, b;
    assert_int_equal(cluster_load_string("c.yaml", one, strlen(one), &c1, &err), 0);
    assert_int_equal(cluster_load_string("c.yaml", one, strlen(one), &c2, &err), 0);
    assert_int_equal(cost_build(&a, &small, &c1, 64, 4, &co, &err), 0);
    assert_int_equal(cost_build(&b, &big, &c2, 64, 4, &co, &err), 0);
    for (int mb = 1; mb <= 4; mb++) {
        assert_true(fabs(cost_bwd_ms(&a.groups[0], mb, RECOMPUTE_NONE) - cost_bwd_ms(&b.groups[0], mb, RECOMPUTE_NONE)) < 1e-12);
        assert_true(b.groups[0].fwd_ms[mb] > a.groups[0].fwd_ms[mb]); /* the head's logits do grow */
    }
    cost_free(&a), cost_free(&b), cluster_free(&c1), cluster_free(&c2);
}

/* The step check's line: every time of a measured group x step_scale, and step_overhead_ms once
 * per step in the exposed time (the most of the groups'). */
static void test_step_check_line(void **state) {
    (void)state;
    char *scaled = xstrdup(profile_json);
    char *at = strstr(scaled, "\"compute_bytes\"");
    char *text = str_printf("%.*s\"step_scale\": 0.5, \"step_overhead_ms\": 3, %s", (int)(at - scaled), scaled, at);
    profile plain, prof;
    err_t err;
    if (profile_load_string("p.json", profile_json, strlen(profile_json), &plain, &err) < 0) fail_msg("%s", err.msg);
    if (profile_load_string("s.json", text, strlen(text), &prof, &err) < 0) fail_msg("%s", err.msg);
    assert_true(prof.entries[0].step_scale == 0.5 && prof.entries[0].step_overhead_ms == 3);
    cost_model a, b;
    cluster c1, c2;
    build(&a, &c1, two_nodes, "bert-large", 512, 64, PREC_FP32, &plain);
    build(&b, &c2, two_nodes, "bert-large", 512, 64, PREC_FP32, &prof);
    const cost_group *pa = &a.groups[1], *pb = &b.groups[1];
    for (int mb = 1; mb <= 8; mb++) {
        assert_true(fabs(pb->fwd_ms[mb] - 0.5 * pa->fwd_ms[mb]) < 1e-9);
        assert_true(fabs(pb->bwd_ms[mb] - 0.5 * pa->bwd_ms[mb]) < 1e-9);
        assert_true(fabs(pb->bwd_keep_ms[mb] - 0.5 * pa->bwd_keep_ms[mb]) < 1e-9);
    }
    /* the unmeasured A100s keep their estimates */
    assert_true(fabs(b.groups[0].fwd_ms[4] - a.groups[0].fwd_ms[4]) < 1e-12);
    assert_true(fabs(cost_exposed_ms(&b, false) - (cost_exposed_ms(&a, false) + 3)) < 1e-9);
    /* out of bounds: refused with the field named */
    char *bad = str_printf("%.*s\"step_scale\": 20, %s", (int)(at - scaled), scaled, at);
    profile x;
    assert_int_equal(profile_load_string("x.json", bad, strlen(bad), &x, &err), -1);
    assert_non_null(strstr(err.msg, "step_scale"));
    cost_free(&a), cost_free(&b), cluster_free(&c1), cluster_free(&c2);
    profile_free(&plain), profile_free(&prof);
    free(scaled), free(text), free(bad);
}

/* What the worker checks its host offload pool against: the machine's memory, or less under a
 * container's memory limit; never more than the machine has, never nothing on Linux. */
static void test_host_memory(void **state) {
    (void)state;
    int64_t phys = (int64_t)sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE);
    int64_t mem = host_memory_bytes();
    assert_true(phys > 0);
    assert_true(mem > 0 && mem <= phys);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_collectives),
        cmocka_unit_test(test_single_node_uses_intra_link),
        cmocka_unit_test(test_analytic_estimates),
        cmocka_unit_test(test_profiled_costs),
        cmocka_unit_test(test_profiled_keep),
        cmocka_unit_test(test_fp16_memory_like_bf16),
        cmocka_unit_test(test_fp16_rates),
        cmocka_unit_test(test_recompute_none_costs),
        cmocka_unit_test(test_pascal_fp16_at_fp32_rate),
        cmocka_unit_test(test_bf16_refused_before_ampere),
        cmocka_unit_test(test_cpu_cores_shared),
        cmocka_unit_test(test_embedding_reads_rows),
        cmocka_unit_test(test_cpu_loopback_collectives),
        cmocka_unit_test(test_state_bytes_adamw_half),
        cmocka_unit_test(test_acts16_memory),
        cmocka_unit_test(test_step_check_line),
        cmocka_unit_test(test_host_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
