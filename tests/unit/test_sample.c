/* test_sample.c - generation (worker/model/kvcache.c, sample.c; docs/sample.md): the KV-cached
 * forward's logits, prefill and then one token at a time, against the training forward of the
 * whole sequence (wmodel.c) on the CPU device, for GPT-2 and Llama (GQA, rope_theta 500000, tied
 * head); and the token choice: greedy, top-k, top-p, temperature, determinism. The float64
 * PyTorch oracle of the whole command is tests/cli/test_sample.sh. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/sample.h"
#include "model/wmodel.h"

/* ---------------------------------------------------------------------------------------------
 * the cached forward = the training forward */

/* Logits [T, V] of the training forward (embedding, blocks, head with its logits copied out). */
static float *training_logits(device *d, const model_spec *m, float **params, const int32_t *ids,
                              int T) {
    err_t err;
    int D = m->d_model, V = m->vocab, units = model_n_units(m);
    wm_acts *a = wm_acts_new(d, m, 1, T, RECOMPUTE_FULL, 1, PREC_FP32, &err);
    assert_non_null(a);
    int32_t *dids = dev_alloc(d, (size_t)T * 4, "ids"), *dtg = dev_alloc(d, (size_t)T * 4, "targets");
    dev_upload(d, dids, ids, (size_t)T * 4);
    dev_upload(d, dtg, ids, (size_t)T * 4); /* any targets: only the logits are compared */
    float row_scale = 1.0f;
    wm_batch b = {.m = 1, .T = T, .ids = dids, .targets = dtg, .row_scale = &row_scale};
    float *x = dev_alloc_f(d, (int64_t)T * D, "x"), *y = dev_alloc_f(d, (int64_t)T * D, "y");
    float *dx = dev_alloc_f(d, (int64_t)T * D, "dx");
    float *dhead = dev_alloc_f(d, model_unit_params(m, units - 1), "head grads");
    float *demb = dev_alloc_f(d, model_unit_params(m, 0), "embedding grads");
    dev_zero(d, dhead, model_unit_params(m, units - 1));
    dev_zero(d, demb, model_unit_params(m, 0));
    wm_unit_forward(d, m, 0, params[0], &b, NULL, x, a);
    for (int u = 1; u < units - 1; u++) {
        wm_unit_forward(d, m, u, params[u], &b, x, y, a);
        float *t = x;
        x = y, y = t;
    }
    float *logits = malloc((size_t)T * V * sizeof(float));
    double *loss = dev_alloc(d, sizeof(double), "loss");
    dev_zero(d, (float *)loss, 2);
    wm_head_step(d, m, params[units - 1], dhead, params[0], demb, &b, x, dx, a, loss, logits);
    float *all[] = {x, y, dx, dhead, demb, (float *)loss};
    for (size_t i = 0; i < 6; i++) dev_free(d, all[i]);
    dev_free(d, dids), dev_free(d, dtg);
    wm_acts_free(d, a);
    return logits;
}

static void check_cached_forward(const char *name, double rope_theta, bool tied) {
    err_t err;
    model_spec m;
    assert_int_equal(model_resolve(name, &m, &err), 0);
    if (rope_theta > 0) m.rope_theta = rope_theta;
    if (tied) m.tied_head = true;
    device d;
    assert_int_equal(cpu_device_init(&d, 0, 2, 0, &err), 0);
    int units = model_n_units(&m), T = 40, P = 7, V = m.vocab;
    float **host = calloc((size_t)units, sizeof *host), **params = calloc((size_t)units, sizeof *params);
    for (int u = 0; u < units; u++) {
        int64_t n = model_unit_params(&m, u);
        host[u] = malloc((size_t)n * sizeof(float));
        wm_init_range(&m, u, 5, 0, n, host[u]);
        params[u] = dev_alloc_f(&d, n, "params");
        dev_upload(&d, params[u], host[u], (size_t)n * sizeof(float));
    }
    int32_t ids[40];
    for (int t = 0; t < T; t++) ids[t] = (int32_t)((t * 37 + 11) % V);
    float *want = training_logits(&d, &m, params, ids, T);

    sampler *s;
    assert_int_equal(sampler_new(&s, &d, &m, host, T, P, &err), 0);
    float *got = malloc((size_t)V * sizeof(float));
    for (int t = P - 1; t < T; t++) {
        if (t == P - 1) sampler_forward(s, ids, P, 0, got); /* prefill: the prompt's last logits */
        else sampler_forward(s, &ids[t], 1, t, got);        /* decode: one token on the cache */
        const float *w = want + (int64_t)t * V;
        double mx = 0, err_max = 0;
        for (int v = 0; v < V; v++) {
            mx = fmax(mx, fabs((double)w[v]));
            err_max = fmax(err_max, fabs((double)got[v] - (double)w[v]));
        }
        /* the same ops on the same parameters; only the attention's summation order differs */
        if (err_max > 1e-5 * mx)
            fail_msg("%s%s: position %d: cached logits differ from the training forward by %.3g (max %.3g)",
                     name, tied ? " tied" : "", t, err_max, mx);
    }
    sampler_free(s);
    free(got), free(want);
    for (int u = 0; u < units; u++) free(host[u]), dev_free(&d, params[u]);
    free(host), free(params);
    assert_int_equal(d.cur_bytes, 0); /* everything the sampler took, it gave back */
    cpu_device_close(&d);
}

static void test_cached_gpt(void **state) {
    (void)state;
    check_cached_forward("tiny-gpt", 0, false);
}

static void test_cached_llama(void **state) {
    (void)state;
    check_cached_forward("tiny-llama", 0, false);        /* GQA: 4 query heads on 2 */
    check_cached_forward("tiny-llama", 500000.0, true); /* Llama-3's base, a tied head */
}

/* ---------------------------------------------------------------------------------------------
 * the token choice */

static void test_greedy(void **state) {
    (void)state;
    const float l[] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
    sample_opts o = {.temperature = 0, .top_k = 0, .top_p = 1};
    sample_scratch sc = {0};
    uint64_t rng = 1;
    assert_int_equal(sample_pick(l, 5, &o, &rng, &sc), 1); /* ties: the lower id */
    o = (sample_opts){.temperature = 1, .top_k = 1, .top_p = 1};
    for (int i = 0; i < 50; i++) assert_int_equal(sample_pick(l, 5, &o, &rng, &sc), 1);
    o = (sample_opts){.temperature = 1, .top_k = 0, .top_p = 1e-9};
    for (int i = 0; i < 50; i++) assert_int_equal(sample_pick(l, 5, &o, &rng, &sc), 1);
    sample_scratch_free(&sc);
}

/* Frequencies of N draws against the expected probabilities (4 standard deviations). */
static void check_frequencies(const float *l, int V, sample_opts o, const double *want) {
    enum { N = 40000 };
    int count[8] = {0};
    sample_scratch sc = {0};
    uint64_t rng = 42;
    for (int i = 0; i < N; i++) count[sample_pick(l, V, &o, &rng, &sc)]++;
    sample_scratch_free(&sc);
    for (int v = 0; v < V; v++) {
        double f = (double)count[v] / N, sd = sqrt(want[v] * (1 - want[v]) / N);
        if (fabs(f - want[v]) > 4 * sd + 1e-12)
            fail_msg("T=%g top-k %d top-p %g: id %d drawn %.4f of the time, want %.4f", o.temperature,
                     o.top_k, o.top_p, v, f, want[v]);
    }
}

static void test_distributions(void **state) {
    (void)state;
    /* probabilities 0.1, 0.2, 0.3, 0.4 */
    const float l[] = {logf(0.1f), logf(0.2f), logf(0.3f), logf(0.4f)};
    check_frequencies(l, 4, (sample_opts){1, 0, 1}, (double[]){0.1, 0.2, 0.3, 0.4});
    check_frequencies(l, 4, (sample_opts){1, 2, 1}, (double[]){0, 0, 3 / 7.0, 4 / 7.0});
    /* top-p 0.5: 0.4 is short of it, 0.4 + 0.3 reaches it; top-p 0.4: the likeliest alone */
    check_frequencies(l, 4, (sample_opts){1, 0, 0.5}, (double[]){0, 0, 3 / 7.0, 4 / 7.0});
    check_frequencies(l, 4, (sample_opts){1, 0, 0.35}, (double[]){0, 0, 0, 1});
    /* temperature 2: p^(1/2), renormalised */
    double s = sqrt(0.1) + sqrt(0.2) + sqrt(0.3) + sqrt(0.4);
    check_frequencies(l, 4, (sample_opts){2, 0, 1},
                      (double[]){sqrt(0.1) / s, sqrt(0.2) / s, sqrt(0.3) / s, sqrt(0.4) / s});
    /* top-k 3 then top-p 0.6 of what is left (0.3/0.9, 0.4/0.9 ...): {0.4, 0.3} */
    check_frequencies(l, 4, (sample_opts){1, 3, 0.6}, (double[]){0, 0, 3 / 7.0, 4 / 7.0});
}

static void test_seeded(void **state) {
    (void)state;
    float l[300];
    for (int i = 0; i < 300; i++) l[i] = (float)sin(i * 0.7) * 3;
    sample_opts o = {0.9, 50, 0.95};
    sample_scratch sc = {0};
    int32_t a[64], b[64], c[64];
    uint64_t r1 = 7, r2 = 7, r3 = 8;
    for (int i = 0; i < 64; i++) {
        a[i] = sample_pick(l, 300, &o, &r1, &sc);
        b[i] = sample_pick(l, 300, &o, &r2, &sc);
        c[i] = sample_pick(l, 300, &o, &r3, &sc);
    }
    sample_scratch_free(&sc);
    assert_memory_equal(a, b, sizeof a);
    assert_memory_not_equal(a, c, sizeof a);
}

/* The choice with every candidate sorted (what sample_pick did before it selected only the
 * candidates truncation may keep), the same sums in the same order: picks must agree exactly. */
typedef struct ref_cand {
    float logit;
    int32_t id;
} ref_cand;

static int ref_order(const void *a, const void *b) {
    const ref_cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static int32_t ref_pick(const float *l, int V, sample_opts o, uint64_t *rng) {
    ref_cand *c = malloc((size_t)V * sizeof *c);
    double *p = malloc((size_t)V * sizeof *p), top = l[0], total = 0;
    for (int i = 0; i < V; i++) c[i] = (ref_cand){l[i], i}, top = l[i] > top ? l[i] : top;
    bool top_k = o.top_k > 0 && o.top_k < V;
    int keep = top_k ? o.top_k : V;
    if (!top_k) /* sample_pick sums a whole vocabulary in id order, a top-k in its sorted order */
        for (int i = 0; i < V; i++) total += exp(((double)l[i] - top) / o.temperature);
    qsort(c, (size_t)V, sizeof *c, ref_order);
    for (int i = 0; top_k && i < keep; i++) total += exp(((double)c[i].logit - top) / o.temperature);
    for (int i = 0; i < keep; i++) p[i] = exp(((double)c[i].logit - top) / o.temperature);
    if (o.top_p < 1.0) {
        double mass = 0;
        int n = 0;
        while (n < keep && (n == 0 || mass < o.top_p * total)) mass += p[n++];
        keep = n, total = mass;
    }
    double u = sample_uniform(rng) * total, acc = 0;
    int pick = keep - 1;
    for (int i = 0; i < keep; i++)
        if ((acc += p[i]) > u) {
            pick = i;
            break;
        }
    int32_t id = c[pick].id;
    free(c), free(p);
    return id;
}

/* Selecting only the top candidates picks what sorting all of them picks: vocabularies with ties,
 * top-k alone, top-p alone (nuclei past the first 256 candidates: the growing prefix), both. */
static void test_select_matches_sort(void **state) {
    (void)state;
    enum { V = 5003 };
    float *l = malloc(V * sizeof *l);
    const sample_opts opts[] = {{1, 40, 1}, {0.8f, 0, 0.9}, {1.5f, 0, 0.999}, {1, 300, 0.95},
                                {1, 1, 1}, {1, V - 1, 0.5}, {1, 0, 1e-9}, {3, 0, 0.99}};
    sample_scratch sc = {0};
    uint64_t gen = 3;
    for (int round = 0; round < 6; round++) {
        for (int i = 0; i < V; i++) /* round 1: flat, so top-p needs nearly every candidate */
            l[i] = round == 1 ? (float)(sample_uniform(&gen) * 1e-3)
                 : round == 2 ? (float)(int)(sample_uniform(&gen) * 8) /* many ties */
                              : (float)(sample_uniform(&gen) * 12 - 6);
        for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++) {
            uint64_t r1 = 11 + round, r2 = 11 + round;
            for (int draw = 0; draw < 20; draw++) {
                int32_t a = sample_pick(l, V, &opts[k], &r1, &sc), b = ref_pick(l, V, opts[k], &r2);
                if (a != b)
                    fail_msg("round %d, T=%g top-k %d top-p %g, draw %d: picked %d, sorting all picks %d", round,
                             opts[k].temperature, opts[k].top_k, opts[k].top_p, draw, a, b);
            }
        }
    }
    sample_scratch_free(&sc);
    free(l);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cached_gpt),   cmocka_unit_test(test_cached_llama),
        cmocka_unit_test(test_greedy),       cmocka_unit_test(test_distributions),
        cmocka_unit_test(test_seeded),       cmocka_unit_test(test_select_matches_sort),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
