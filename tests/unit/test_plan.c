/* test_plan.c - plan invariants over many clusters, models, batches and strategies; the state
 * split; plan JSON; infeasibility messages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/cluster.h"
#include "planner/cost.h"
#include "planner/plan.h"
#include "planner/state_split.h"

/* Two GPUs where even sharding cannot fit: the small one must hold less state. */
static const char tight_cluster[] =
    "nodes:\n"
    "  - name: n0\n"
    "    network_gbps: 50\n"
    "    gpus: [{type: A6000, memory_gib: 8}, {type: P40, memory_gib: 48}]\n";

static void load_cluster(const char *path_or_text, cluster *cl) {
    err_t err;
    int rc = strchr(path_or_text, '\n') ? cluster_load_string("tight.yaml", path_or_text, strlen(path_or_text), cl, &err)
                                        : cluster_load_file(path_or_text, cl, &err);
    if (rc < 0) fail_msg("%s", err.msg);
}

static void check_invariants(const plan *p) {
    const cost_model *cm = p->cm;
    long sum = 0;
    double ratio = 0;
    for (int i = 0; i < p->n_ranks; i++) {
        const plan_rank *r = &p->ranks[i];
        assert_true(r->batch >= 1);
        assert_true(r->micro >= 1);
        assert_int_equal(r->micro * r->micros, r->batch);
        assert_true((double)r->peak_bytes <= r->usable_bytes); /* within the device's cap */
        assert_int_equal(r->peak_bytes, r->compute_bytes + r->state_bytes);
        sum += r->batch;
        ratio += r->state_ratio;
    }
    assert_int_equal(sum, cm->batch);
    if (!p->replicated) assert_true(fabs(ratio - 1) < 1e-9);
    int uneven = 0;
    for (int u = 0; u < p->n_units; u++) {
        int64_t cover = 0;
        for (int i = 0; i < p->n_ranks; i++) {
            assert_true(p->shards[(size_t)u * p->n_ranks + i] >= 0);
            cover += p->shards[(size_t)u * p->n_ranks + i];
        }
        assert_int_equal(cover, model_unit_params(cm->model, u)); /* each unit covered exactly */
        uneven += split_is_uneven(p->shards + (size_t)u * p->n_ranks, p->n_ranks);
    }
    assert_int_equal(uneven > 0, p->uneven);
    assert_true(p->iter_ms > 0 && isfinite(p->iter_ms));
}

static void test_invariants_everywhere(void **state) {
    (void)state;
    const char *clusters[] = {"examples/clusters/cluster-a.yaml", "examples/clusters/cluster-b.yaml",
                              "examples/clusters/local-cpu.yaml", tight_cluster};
    const char *models[] = {"gpt2-124m", "gpt2-774m", "bert-large", "llama-3b", "vit-g", "tiny-gpt", "tiny-llama"};
    int feasible = 0, infeasible = 0, uneven = 0, refused = 0;
    for (size_t c = 0; c < sizeof clusters / sizeof *clusters; c++) {
        cluster cl;
        load_cluster(clusters[c], &cl);
        for (size_t mi = 0; mi < sizeof models / sizeof *models; mi++) {
            model_spec m;
            err_t err;
            assert_int_equal(model_resolve(models[mi], &m, &err), 0);
            int batches[] = {cl.n_devices, 2 * cl.n_devices + 1, 64, 256};
            for (int bi = 0; bi < 4; bi++) {
                if (batches[bi] < cl.n_devices) continue;
                cost_model cm;
                /* every precision; bf16 where a GPU lacks it (clusters A and B) is refused */
                cost_opts co = {.mem_cap = 0.8, .prec = (precision)((bi + mi) % PREC_COUNT)};
                err_t perr;
                if (cluster_check_precision(&cl, co.prec, "precision", &perr) < 0) {
                    assert_int_equal(co.prec, PREC_BF16);
                    assert_int_equal(cost_build(&cm, &m, &cl, 0, batches[bi], &co, &err), -1);
                    assert_non_null(strstr(err.msg, "no bf16"));
                    refused++;
                    continue;
                }
                assert_int_equal(cost_build(&cm, &m, &cl, 0, batches[bi], &co, &err), 0);
                for (int s = 0; s < STRAT_COUNT; s++) {
                    plan p;
                    assert_int_equal(plan_make(&cm, (strategy)s, &p, &err), 0);
                    if (p.feasible) {
                        check_invariants(&p);
                        feasible++;
                        uneven += p.uneven;
                    } else {
                        assert_true(strlen(p.reason) > 10);
                        infeasible++;
                    }
                    plan_free(&p);
                }
                cost_free(&cm);
            }
        }
        cluster_free(&cl);
    }
    assert_true(feasible > 100);
    assert_true(infeasible > 10);
    assert_true(uneven > 0);
    assert_true(refused > 0);
}

/* Cephalo is never slower than a baseline that is feasible: each baseline's plan lies in the
 * space cephalo optimizes over (up to the optimizer step, which is not optimized). */
static void test_cephalo_beats_baselines(void **state) {
    (void)state;
    cluster cl;
    load_cluster("examples/clusters/cluster-a.yaml", &cl);
    const char *models[] = {"bert-large", "gpt2-774m", "llama-3b"};
    for (int mi = 0; mi < 3; mi++) {
        model_spec m;
        err_t err;
        assert_int_equal(model_resolve(models[mi], &m, &err), 0);
        cost_model cm;
        cost_opts co = {.mem_cap = 0.8};
        assert_int_equal(cost_build(&cm, &m, &cl, 0, 128, &co, &err), 0);
        plan ceph, other;
        assert_int_equal(plan_make(&cm, STRAT_CEPHALO, &ceph, &err), 0);
        assert_true(ceph.feasible);
        for (int s = STRAT_FSDP; s < STRAT_COUNT; s++) {
            assert_int_equal(plan_make(&cm, (strategy)s, &other, &err), 0);
            if (other.feasible && !other.replicated)
                assert_true(ceph.iter_ms - ceph.opt_ms <= other.iter_ms - other.opt_ms + 1e-9);
            plan_free(&other);
        }
        plan_free(&ceph);
        cost_free(&cm);
    }
    cluster_free(&cl);
}

/* The tight two-GPU cluster with gpt2-774m, B = 16, seq 512, and its cephalo plan. */
typedef struct tight_case {
    cluster cl;
    model_spec m;
    cost_model cm;
    plan p;
} tight_case;

static void tight_setup(tight_case *t) {
    err_t err;
    load_cluster(tight_cluster, &t->cl);
    assert_int_equal(model_resolve("gpt2-774m", &t->m, &err), 0);
    cost_opts co = {.mem_cap = 0.8};
    assert_int_equal(cost_build(&t->cm, &t->m, &t->cl, 512, 16, &co, &err), 0);
    assert_int_equal(plan_make(&t->cm, STRAT_CEPHALO, &t->p, &err), 0);
}

static void tight_teardown(tight_case *t) {
    plan_free(&t->p);
    cost_free(&t->cm);
    cluster_free(&t->cl);
}

static void test_tight_cluster_is_uneven(void **state) {
    (void)state;
    tight_case t;
    tight_setup(&t);
    const plan *p = &t.p;
    assert_true(p->feasible);
    check_invariants(p);
    assert_true(p->uneven);
    assert_true(p->ranks[0].state_ratio < 0.5); /* the 8 GiB device holds less */
    /* water-filling: no rank holding state is fuller than any other rank */
    double u0 = p->ranks[0].peak_bytes / p->ranks[0].capacity_bytes, u1 = p->ranks[1].peak_bytes / p->ranks[1].capacity_bytes;
    assert_true(p->ranks[0].state_params == 0 ? u0 >= u1 - 1e-6 : fabs(u0 - u1) < 1e-6);
    plan fsdp;
    err_t err;
    assert_int_equal(plan_make(&t.cm, STRAT_FSDP, &fsdp, &err), 0);
    assert_false(fsdp.feasible);
    assert_non_null(strstr(fsdp.reason, "rank 0 (A6000 on n0)"));
    assert_non_null(strstr(fsdp.reason, "missing"));
    plan_free(&fsdp);
    tight_teardown(&t);
}

static void test_infeasible_reasons(void **state) {
    (void)state;
    cluster cl;
    load_cluster("examples/clusters/cluster-a.yaml", &cl);
    model_spec m;
    err_t err;
    assert_int_equal(model_resolve("llama-7b", &m, &err), 0); /* 108 GiB of state: too much */
    cost_model cm;
    cost_opts co = {.mem_cap = 0.5};
    assert_int_equal(cost_build(&cm, &m, &cl, 0, 64, &co, &err), 0);
    plan p;
    assert_int_equal(plan_make(&cm, STRAT_CEPHALO, &p, &err), 0);
    assert_false(p.feasible);
    assert_non_null(strstr(p.reason, "training state"));
    assert_non_null(strstr(p.reason, "missing in all"));
    /* what would make it fit: N more GPUs like the one with the most room after compute, N the
     * fewest whose room covers what is missing */
    double room_sum = 0, room_max = 0, need = (double)cm.params * cm.state_bpp;
    for (int i = 0; i < cl.n_devices; i++) {
        const cost_group *g = &cm.groups[cost_group_of(&cm, i)];
        double room = g->usable_bytes - (double)cost_compute_bytes(g, 1);
        room_sum += room;
        if (room > room_max) room_max = room;
    }
    const char *more = strstr(p.reason, "it needs ");
    assert_non_null(more);
    int n_more = atoi(more + strlen("it needs "));
    assert_true(n_more >= 1);
    assert_true(room_sum + n_more * room_max >= need && room_sum + (n_more - 1) * room_max < need);
    assert_non_null(strstr(p.reason, "or GPUs with more memory"));
    plan_free(&p);
    cost_free(&cm);
    /* a batch smaller than the device count cannot be split */
    assert_int_equal(cost_build(&cm, &m, &cl, 0, 4, &co, &err), -1);
    assert_non_null(strstr(err.msg, "cannot be split over 8 devices"));
    assert_int_equal(cost_build(&cm, &m, &cl, 0, 0, &co, &err), -1);
    cluster_free(&cl);
}

/* A bound on host memory (a worker pod's memory limit) caps every rank's batch by its offload pool:
 * b x units x tokens x d x 4 bytes within host x mem_cap. Unbounded, the L4s and the A6000 of
 * cluster-a take most of the batch; bounded, no rank's pool passes the bound, every strategy's plan
 * is checked against it, and a bound too small for the batch names the pool and the limit. */
static void test_host_memory_bound(void **state) {
    (void)state;
    cluster cl;
    load_cluster("examples/clusters/cluster-a.yaml", &cl);
    model_spec m;
    err_t err;
    assert_int_equal(model_resolve("gpt2-124m", &m, &err), 0);
    double per_sample = (double)model_n_units(&m) * 1024 * m.d_model * 4;
    cost_model cm;
    plan p;
    cost_opts free_opts = {.mem_cap = 0.8, .prec = PREC_FP16};
    assert_int_equal(cost_build(&cm, &m, &cl, 0, 64, &free_opts, &err), 0);
    assert_int_equal(plan_make(&cm, STRAT_CEPHALO, &p, &err), 0);
    int most = 0;
    for (int i = 0; i < p.n_ranks; i++) most = p.ranks[i].batch > most ? p.ranks[i].batch : most;
    assert_true(most > 15); /* else the bound below would not bind */
    plan_free(&p);
    cost_free(&cm);
    cost_opts bound = {.mem_cap = 0.8, .prec = PREC_FP16, .host_bytes = 800.0 * 1024 * 1024};
    assert_int_equal(cost_build(&cm, &m, &cl, 0, 64, &bound, &err), 0);
    assert_true(cm.host_per_sample == per_sample);
    int cap = (int)floor(bound.host_bytes * 0.8 / per_sample);
    assert_int_equal(cm.host_bmax, cap);
    assert_int_equal(plan_make(&cm, STRAT_CEPHALO, &p, &err), 0);
    assert_true(p.feasible);
    check_invariants(&p);
    for (int i = 0; i < p.n_ranks; i++) {
        assert_true(p.ranks[i].batch <= cap);
        assert_true(p.ranks[i].host_bytes == p.ranks[i].batch * per_sample);
        assert_true(p.ranks[i].host_bytes <= bound.host_bytes * 0.8);
    }
    plan_free(&p);
    for (int s = 0; s < STRAT_COUNT; s++) { /* a baseline is infeasible rather than over the bound */
        assert_int_equal(plan_make(&cm, (strategy)s, &p, &err), 0);
        for (int i = 0; p.feasible && i < p.n_ranks; i++) assert_true(p.ranks[i].host_bytes <= bound.host_bytes * 0.8);
        if (!p.feasible && strstr(p.reason, "host")) assert_non_null(strstr(p.reason, "out of host memory"));
        plan_free(&p);
    }
    cost_free(&cm);
    bound.host_bytes = 300.0 * 1024 * 1024; /* 5 samples a rank, 40 in all: less than 64 */
    assert_int_equal(cost_build(&cm, &m, &cl, 0, 64, &bound, &err), 0);
    assert_int_equal(plan_make(&cm, STRAT_CEPHALO, &p, &err), 0);
    assert_false(p.feasible);
    assert_non_null(strstr(p.reason, "the host offload pools do not fit"));
    assert_non_null(strstr(p.reason, "at most 5 samples, 40 in all, fewer than the batch 64"));
    assert_non_null(strstr(p.reason, "0.80 x the workers' host memory 300.00 MiB"));
    plan_free(&p);
    cost_free(&cm);
    bound.host_bytes = -1;
    assert_int_equal(cost_build(&cm, &m, &cl, 0, 64, &bound, &err), -1);
    assert_non_null(strstr(err.msg, "host memory"));
    cluster_free(&cl);
}

static void test_waterfill(void **state) {
    (void)state;
    double cap[3] = {10000, 20000, 40000};
    int64_t compute[3] = {5000, 1000, 30000}, room[3] = {300, 1100, 600}, p[3];
    assert_int_equal(split_waterfill(3, cap, compute, room, 16, 1200, p), 0);
    assert_int_equal(p[0] + p[1] + p[2], 1200);
    for (int i = 0; i < 3; i++) assert_true(p[i] >= 0 && p[i] <= room[i]);
    /* the level is common: utilisations of ranks that hold state agree to a few elements */
    double u0 = (compute[0] + 16.0 * p[0]) / cap[0], u1 = (compute[1] + 16.0 * p[1]) / cap[1];
    assert_true(fabs(u0 - u1) < 16.0 * 2 / cap[0]);
    assert_int_equal(split_waterfill(3, cap, compute, room, 16, 3000, p), -1); /* no room */
}

static void test_shards_fewest_uneven(void **state) {
    (void)state;
    int64_t numel[5] = {1000, 100, 100, 100, 50};
    int64_t p[2] = {600, 750}, shards[10];
    int uneven = split_shards(5, numel, 2, p, shards);
    assert_int_equal(uneven, 1); /* moving the 1000-element unit alone meets both totals */
    for (int i = 0; i < 2; i++) {
        int64_t tot = 0;
        for (int u = 0; u < 5; u++) tot += shards[u * 2 + i];
        assert_int_equal(tot, p[i]);
    }
    for (int u = 1; u < 5; u++) assert_false(split_is_uneven(shards + u * 2, 2));
    int64_t even[2] = {675, 675};
    assert_int_equal(split_shards(5, numel, 2, even, shards), 0);
}

static void test_plan_json(void **state) {
    (void)state;
    tight_case t;
    tight_setup(&t);
    char *buf = NULL;
    size_t len = 0;
    err_t err;
    FILE *f = open_memstream(&buf, &len);
    assert_int_equal(plan_write_json(&t.p, f, &err), 0);
    fclose(f);
    cJSON *root = cJSON_Parse(buf);
    assert_non_null(root);
    assert_string_equal(cJSON_GetObjectItem(root, "format")->valuestring, PLAN_FORMAT);
    assert_int_equal(cJSON_GetObjectItem(root, "version")->valueint, PLAN_VERSION);
    cJSON *ranks = cJSON_GetObjectItem(root, "ranks");
    assert_int_equal(cJSON_GetArraySize(ranks), 2);
    cJSON *r0 = cJSON_GetArrayItem(ranks, 0);
    assert_int_equal(cJSON_GetObjectItem(r0, "batch")->valueint, t.p.ranks[0].batch);
    assert_non_null(cJSON_GetObjectItem(cJSON_GetObjectItem(r0, "predicted"), "peak_bytes"));
    cJSON *units = cJSON_GetObjectItem(root, "units");
    assert_int_equal(cJSON_GetArraySize(units), model_n_units(&t.m));
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetArrayItem(units, 0), "shard_sizes")), 2);
    assert_true(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "predicted"), "iter_ms")->valuedouble > 0);
    cJSON_Delete(root);
    free(buf);
    tight_teardown(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_invariants_everywhere), cmocka_unit_test(test_cephalo_beats_baselines),
        cmocka_unit_test(test_tight_cluster_is_uneven), cmocka_unit_test(test_infeasible_reasons),
        cmocka_unit_test(test_host_memory_bound),
        cmocka_unit_test(test_waterfill), cmocka_unit_test(test_shards_fewest_uneven),
        cmocka_unit_test(test_plan_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
