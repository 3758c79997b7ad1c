/* test_worker_cmd.c - one worker command line (common/worker_cmd.c, docs/architecture.md
 * "Contracts"): the defaults table against every place that has a default of its own (the CRD's
 * `default:` values, the job file's parser, the worker's train_config_defaults), the numbers it
 * writes read back as the same doubles, and the same job run through `cephalo run`
 * (run_worker_argv, cli/run.c) and through the operator (job_spec_parse + job_spec_worker_argv,
 * operator/job_spec.c) gives the same argv. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/job.h"
#include "cli/run.h"
#include "common/worker_cmd.h"
#include "common/yaml_tree.h"
#include "model/train.h"
#include "operator/job_spec.h"

#define CRD "crds/cephalojobs.cephalo.dev.yaml"

/* ---- the CRD's defaults ---- */

static const ynode *ypath(const ynode *n, const char *const *keys) {
    for (; n && *keys; keys++) n = ymap_get(n, *keys);
    return n;
}

/* spec's schema: spec.versions[0].schema.openAPIV3Schema.properties.spec */
static const ynode *spec_schema(const ynode *crd) {
    const ynode *v = ypath(crd, (const char *const[]){"spec", "versions", NULL});
    assert_non_null(v);
    assert_true(v->kind == YNODE_SEQ && v->n > 0);
    const ynode *s = ypath(v->items[0], (const char *const[]){"schema", "openAPIV3Schema", "properties", "spec", NULL});
    assert_non_null(s);
    return s;
}

/* The schema of a dotted field under spec ("optimizer.lr"), and whether its parent requires it. */
static const ynode *field_schema(const ynode *spec, const char *dotted, bool *required) {
    char buf[128], *save = NULL;
    snprintf(buf, sizeof buf, "%s", dotted);
    const ynode *n = spec;
    *required = false;
    for (char *k = strtok_r(buf, ".", &save); k && n; k = strtok_r(NULL, ".", &save)) {
        const ynode *req = ymap_get(n, "required");
        *required = false;
        for (size_t i = 0; req && req->kind == YNODE_SEQ && i < req->n; i++)
            if (!strcmp(req->items[i]->str, k)) *required = true;
        n = ypath(n, (const char *const[]){"properties", k, NULL});
    }
    return n;
}

static bool same_value(const char *table, const char *crd) {
    char *e1, *e2;
    double a = strtod(table, &e1), b = strtod(crd, &e2);
    if (!*e1 && !*e2 && e1 != table && e2 != crd) return a == b; /* 1.0e-8 and 1e-08 alike */
    return !strcmp(table, crd);
}

/* Every option the CRD has: its `default:` is the table's; without one, the table has none of its
 * own, or the field is required, or its description says the worker's default applies. */
static void test_crd_defaults(void **state) {
    (void)state;
    err_t err;
    ynode *crd = ytree_load_file(CRD, &err);
    if (!crd) fail_msg("%s", err.msg);
    const ynode *spec = spec_schema(crd);
    int checked = 0;
    for (int k = 0; k < WCMD_N; k++) {
        const wcmd_default *d = &wcmd_defaults[k];
        if (!d->crd_path) continue;
        bool required;
        const ynode *f = field_schema(spec, d->crd_path, &required);
        if (!f) fail_msg("%s: spec.%s is not in the CRD", d->flag, d->crd_path);
        const ynode *def = ymap_get(f, "default"), *desc = ymap_get(f, "description");
        const char *want = wcmd_job_default((wcmd_key)k); /* a job's default, the CRD's */
        if (def) {
            if (!want) fail_msg("spec.%s: the CRD's default %s, the table has none (%s)", d->crd_path, def->str, d->derived);
            if (!same_value(want, def->str))
                fail_msg("spec.%s: the CRD's default is %s, the table's %s (%s)", d->crd_path, def->str, want, d->flag);
        } else if (want && !required && !(desc && strstr(desc->str, "default"))) {
            fail_msg("spec.%s: no default in the CRD and none documented; the table's is %s", d->crd_path, want);
        }
        checked++;
    }
    assert_true(checked >= 15);
    ytree_free(crd);
}

/* The operator's own defaults (operator/job_spec.h) are the CRD's too. */
static void test_crd_operator_defaults(void **state) {
    (void)state;
    static const struct {
        const char *path;
        double value;
    } nums[] = {{"memCap", JOB_SPEC_MEM_CAP},        {"priority", JOB_SPEC_PRIORITY},
                {"elastic.minReplanSeconds", JOB_SPEC_MIN_REPLAN_S}, {"commTimeout", JOB_SPEC_COMM_TIMEOUT_S},
                {"backoffLimit", JOB_SPEC_BACKOFF_LIMIT}, {"terminationGracePeriodSeconds", JOB_SPEC_GRACE_S},
                {"metricsPort", JOB_SPEC_METRICS_PORT}};
    err_t err;
    ynode *crd = ytree_load_file(CRD, &err);
    if (!crd) fail_msg("%s", err.msg);
    const ynode *spec = spec_schema(crd);
    bool required;
    for (size_t i = 0; i < sizeof nums / sizeof *nums; i++) {
        const ynode *f = field_schema(spec, nums[i].path, &required), *def = f ? ymap_get(f, "default") : NULL;
        if (!def) fail_msg("spec.%s: no default in the CRD", nums[i].path);
        if (strtod(def->str, NULL) != nums[i].value)
            fail_msg("spec.%s: the CRD's default is %s, the operator's %g", nums[i].path, def->str, nums[i].value);
    }
    const ynode *f = field_schema(spec, "strategy", &required);
    assert_non_null(f);
    assert_string_equal(ymap_get(f, "default")->str, JOB_SPEC_STRATEGY);
    ytree_free(crd);
}

/* The checker itself: a CRD whose lr default differs from the table fails it. */
static void test_crd_mismatch_is_seen(void **state) {
    (void)state;
    static const char text[] = "spec:\n  versions:\n  - schema:\n      openAPIV3Schema:\n        properties:\n"
                               "          spec:\n            properties:\n              optimizer:\n"
                               "                properties:\n                  lr: {type: number, default: 0.001}\n";
    err_t err;
    ynode *crd = ytree_load_string("crd.yaml", text, sizeof text - 1, &err);
    assert_non_null(crd);
    bool required;
    const ynode *f = field_schema(spec_schema(crd), "optimizer.lr", &required);
    assert_non_null(f);
    assert_false(same_value(wcmd_defaults[WCMD_LR].value, ymap_get(f, "default")->str));
    assert_true(same_value("1.0e-8", "1e-08"));
    ytree_free(crd);
}

/* ---- the job file's and the worker's defaults ---- */

static void test_job_file_defaults(void **state) {
    (void)state;
    static const char text[] = "model: tiny-gpt\nbatch: 4\nsteps: 20\ndata: synthetic\ncheckpoint: {dir: ck}\n"
                               "devices: [{type: cpu, threads: 1, memory: 256M}]\n";
    job j;
    err_t err;
    if (job_load_string("job.yaml", text, sizeof text - 1, &j, &err) < 0) fail_msg("%s", err.msg);
    wcmd_train got = j.train, want;
    wcmd_train_defaults(&want);
    assert_true(got.lr == want.lr && got.min_lr == want.min_lr && got.weight_decay == want.weight_decay);
    assert_true(got.beta1 == want.beta1 && got.beta2 == want.beta2 && got.eps == want.eps && got.clip == want.clip);
    assert_int_equal(got.schedule, want.schedule);
    assert_int_equal(got.warmup, want.warmup);
    assert_int_equal(got.seed, want.seed);
    assert_int_equal(got.prec, want.prec);
    assert_null(want.data); /* no default: a job names its data */
    assert_string_equal(got.data, "synthetic");
    assert_int_equal(got.keep_last, want.keep_last);
    assert_int_equal(got.keep_every, want.keep_every);
    assert_string_equal(got.resume, want.resume);
    assert_int_equal(got.val_every, -1);
    job_free(&j);
}

static void test_worker_defaults(void **state) {
    (void)state;
    train_config c;
    memset(&c, 0, sizeof c);
    train_config_defaults(&c);
    wcmd_train w;
    wcmd_train_defaults(&w);
    assert_int_equal(c.steps, w.steps);
    assert_true(c.lr == w.lr && c.min_lr < 0 && c.weight_decay == w.weight_decay && c.clip == w.clip);
    assert_true(c.beta1 == w.beta1 && c.beta2 == w.beta2 && c.eps == w.eps);
    assert_int_equal(c.schedule, w.schedule);
    assert_int_equal(c.seed, w.seed);
    assert_null(c.data); /* none: the worker refuses to train without --data */
    assert_null(w.data);
    assert_true(c.loss_scale == wcmd_default_num(WCMD_LOSS_SCALE));
    assert_int_equal(c.loss_scale_window, wcmd_default_long(WCMD_LOSS_SCALE_WINDOW));
    train_config_release(&c);
}

/* ---- the argv ---- */

static const char *flag_value(const wcmd_argv *a, const char *flag) {
    for (int i = 0; i + 1 < a->n; i++)
        if (!strcmp(a->v[i], flag)) return a->v[i + 1];
    return NULL;
}

/* Numbers come back as the same double, however many digits that takes. */
static void test_numbers_read_back(void **state) {
    (void)state;
    wcmd_train t;
    wcmd_train_defaults(&t);
    t.lr = 0.1 + 0.2, t.beta2 = 1 - 1e-9, t.eps = 1.0 / 3e9, t.clip = 60;
    wcmd_argv a = {0};
    wcmd_train_argv(&t, &a);
    assert_string_equal(a.v[0], "train");
    assert_true(strtod(flag_value(&a, "--lr"), NULL) == t.lr);
    assert_true(strtod(flag_value(&a, "--min-lr"), NULL) == t.lr / 10);
    assert_true(strtod(flag_value(&a, "--beta2"), NULL) == t.beta2);
    assert_true(strtod(flag_value(&a, "--eps"), NULL) == t.eps);
    assert_string_equal(flag_value(&a, "--clip"), "60");
    assert_string_equal(flag_value(&a, "--lr"), "0.30000000000000004");
    assert_null(flag_value(&a, "--ckpt-dir")); /* no checkpoints: none of their flags */
    assert_null(flag_value(&a, "--keep-last"));
    wcmd_argv_free(&a);
}

/* Every default is spelled out, and resume whenever there are checkpoints; retention only when
 * the job gives it (the checkpoint directory keeps its own, common/ckpt_keep.h). */
static void test_defaults_spelled_out(void **state) {
    (void)state;
    wcmd_train t;
    wcmd_train_defaults(&t);
    t.ckpt_dir = "/ck";
    wcmd_argv a = {0};
    wcmd_train_argv(&t, &a);
    for (int k = 0; k < WCMD_N; k++) {
        const wcmd_default *d = &wcmd_defaults[k];
        const char *want = wcmd_job_default((wcmd_key)k);
        if (!d->job_key || !want || k == WCMD_VAL_SAMPLES) continue; /* validation: none asked for */
        if (k == WCMD_RECOMPUTE) { /* a job's policy (auto); the argv has the rank's mode */
            assert_string_equal(flag_value(&a, d->flag), d->value);
            continue;
        }
        const char *v = flag_value(&a, d->flag);
        if (k == WCMD_KEEP_LAST || k == WCMD_KEEP_EVERY) {
            assert_null(v);
            continue;
        }
        if (!v) fail_msg("%s is missing from the argv", d->flag);
        assert_true(same_value(want, v));
    }
    wcmd_argv_free(&a);
}

/* ---- one job, two front ends ---- */

/* `cephalo run`'s argv for a job file's text (the run's checkpoint directory ckpt_dir). */
static void cli_argv(const char *yaml, const char *ckpt_dir, recompute_mode rec, wcmd_argv *out) {
    job j;
    err_t err;
    if (job_load_string("job.yaml", yaml, strlen(yaml), &j, &err) < 0) fail_msg("job file: %s", err.msg);
    run_worker_argv(&j, j.ckpt_dir ? ckpt_dir : NULL, false, rec, out);
    job_free(&j);
}

/* The operator's argv for a CephaloJob spec's JSON. */
static void operator_argv(const char *json, recompute_mode rec, wcmd_argv *out) {
    cJSON *spec = cJSON_Parse(json);
    assert_non_null(spec);
    job_spec s;
    err_t err;
    if (job_spec_parse(spec, &s, &err) < 0) fail_msg("spec: %s", err.msg);
    job_spec_worker_argv(&s, rec, out);
    cJSON_Delete(spec);
}

static void assert_same_argv(const wcmd_argv *a, const wcmd_argv *b) {
    for (int i = 0; i < a->n && i < b->n; i++)
        if (strcmp(a->v[i], b->v[i])) fail_msg("argument %d: cephalo run '%s', the operator '%s'", i, a->v[i], b->v[i]);
    if (a->n != b->n) fail_msg("cephalo run gives %d arguments, the operator %d", a->n, b->n);
}

/* For each recompute mode a plan may give a rank: the same argv, with that mode. */
static void compare(const char *yaml, const char *ckpt_dir, const char *json) {
    for (int rec = RECOMPUTE_FULL; rec <= RECOMPUTE_NONE; rec++) {
        wcmd_argv a = {0}, b = {0};
        cli_argv(yaml, ckpt_dir, (recompute_mode)rec, &a);
        operator_argv(json, (recompute_mode)rec, &b);
        assert_same_argv(&a, &b);
        assert_true(a.n > 20);
        assert_string_equal(flag_value(&a, "--recompute"), recompute_name((recompute_mode)rec));
        wcmd_argv_free(&a);
        wcmd_argv_free(&b);
    }
}

/* Every option given, none at its default: paths absolute (the operator's without volumes are the
 * spec's as given; the launcher puts a job's checkpoints in its run directory, here the same). */
static void test_same_job_every_option(void **state) {
    (void)state;
    compare("model: tiny-gpt\nbatch: 8\nsteps: 100\nseed: 7\nprecision: bf16\ndata: /data/train\n"
            "optimizer: {lr: 0.001, min_lr: 1.5e-05, warmup: 10, schedule: linear, weight_decay: 0.05,\n"
            "            beta1: 0.85, beta2: 0.99, eps: 1e-07, clip: 0.5}\n"
            "validation: {data: /data/val, every: 5, samples: 32}\n"
            "checkpoint: {dir: ck, every: 5, keep_last: 2, keep_every: 10, resume: never}\n"
            "devices: [{type: cpu, threads: 1, memory: 256M, count: 2}]\n",
            "/ck/run",
            "{\"model\": {\"name\": \"tiny-gpt\"}, \"globalBatch\": 8, \"steps\": 100, \"seed\": 7, \"precision\": \"bf16\","
            " \"optimizer\": {\"lr\": 0.001, \"minLr\": 1.5e-05, \"warmup\": 10, \"schedule\": \"linear\","
            " \"weightDecay\": 0.05, \"beta1\": 0.85, \"beta2\": 0.99, \"eps\": 1e-07, \"clip\": 0.5},"
            " \"data\": {\"path\": \"/data/train\", \"validation\": {\"path\": \"/data/val\", \"every\": 5, \"samples\": 32}},"
            " \"checkpoint\": {\"dir\": \"/ck/run\", \"every\": 5, \"keepLast\": 2, \"keepEvery\": 10, \"resume\": \"never\"}}");
}

/* Nothing but what each requires, and checkpoints: every default from the two front ends'
 * parsers (the operator's without the API server's defaulting, as an older CRD would leave it). */
static void test_same_job_defaults(void **state) {
    (void)state;
    compare("model: tiny-gpt\nbatch: 8\nsteps: 20\ndata: synthetic\ncheckpoint: {dir: ck}\n"
            "devices: [{type: cpu, threads: 1, memory: 256M}]\n",
            "/ck/run",
            "{\"model\": {\"name\": \"tiny-gpt\"}, \"globalBatch\": 8, \"steps\": 20, \"data\": {\"path\": \"synthetic\"},"
            " \"checkpoint\": {\"dir\": \"/ck/run\"}}");
}

/* ... and with the API server's defaulting: the CRD's `default:` values filled in. */
static void test_same_job_crd_defaults(void **state) {
    (void)state;
    compare("model: tiny-gpt\nbatch: 8\nsteps: 20\ndata: synthetic\ncheckpoint: {dir: ck}\n"
            "devices: [{type: cpu, threads: 1, memory: 256M}]\n",
            "/ck/run",
            "{\"model\": {\"name\": \"tiny-gpt\"}, \"globalBatch\": 8, \"steps\": 20, \"seed\": 1, \"precision\": \"fp32\","
            " \"optimizer\": {\"lr\": 0.0003, \"schedule\": \"cosine\", \"warmup\": 0, \"weightDecay\": 0.1,"
            " \"beta1\": 0.9, \"beta2\": 0.95, \"eps\": 1e-08, \"clip\": 1.0},"
            " \"data\": {\"path\": \"synthetic\"},"
            " \"checkpoint\": {\"dir\": \"/ck/run\", \"resume\": \"auto\"}}");
}

/* The comparison can fail: one option apart is named. */
static void test_difference_is_seen(void **state) {
    (void)state;
    wcmd_argv a = {0}, b = {0};
    cli_argv("model: tiny-gpt\nbatch: 8\nsteps: 20\ndata: synthetic\noptimizer: {lr: 0.001}\n"
             "devices: [{type: cpu, threads: 1, memory: 256M}]\n", NULL, RECOMPUTE_FULL, &a);
    operator_argv("{\"model\": {\"name\": \"tiny-gpt\"}, \"globalBatch\": 8, \"steps\": 20, \"data\": {\"path\": \"synthetic\"}}",
                  RECOMPUTE_FULL, &b);
    assert_int_equal(a.n, b.n);
    int differ = 0;
    for (int i = 0; i < a.n; i++) differ += strcmp(a.v[i], b.v[i]) != 0;
    assert_int_equal(differ, 2); /* --lr and --min-lr */
    wcmd_argv_free(&a);
    wcmd_argv_free(&b);
}

/* ---- one rule, every front end ---- */

/* warmup against steps: the job file and the CephaloJob accept and refuse alike, with the one
 * wording of wcmd_check_warmup (the worker's --warmup/--steps use it too: test_worker.sh). */
static void test_warmup_rule_shared(void **state) {
    (void)state;
    static const struct {
        long warmup, steps;
        bool ok;
    } cases[] = {{0, 1, true}, {9, 10, true}, {10, 10, false}, {11, 10, false}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char yaml[256], json[256], want[128];
        snprintf(yaml, sizeof yaml, "model: tiny-gpt\nbatch: 8\nsteps: %ld\ndata: synthetic\noptimizer: {warmup: %ld}\n"
                 "devices: [{type: cpu, threads: 1, memory: 256M}]\n", cases[i].steps, cases[i].warmup);
        snprintf(json, sizeof json, "{\"model\": {\"name\": \"tiny-gpt\"}, \"globalBatch\": 8, \"steps\": %ld,"
                 " \"optimizer\": {\"warmup\": %ld}, \"data\": {\"path\": \"synthetic\"}}", cases[i].steps, cases[i].warmup);
        job j;
        err_t e1 = {{0}}, e2 = {{0}};
        if (job_load_string("job.yaml", yaml, strlen(yaml), &j, &e1) < 0) fail_msg("job file: %s", e1.msg);
        int cli = job_check(&j, &e1);
        job_free(&j);
        cJSON *spec = cJSON_Parse(json);
        job_spec s;
        int op = job_spec_parse(spec, &s, &e2);
        cJSON_Delete(spec);
        assert_int_equal(cli, cases[i].ok ? 0 : -1);
        assert_int_equal(op, cases[i].ok ? 0 : -1);
        if (cases[i].ok) continue;
        snprintf(want, sizeof want, "optimizer.warmup: %ld must be below steps (%ld): the warmup must end before the last step",
                 cases[i].warmup, cases[i].steps);
        if (!strstr(e1.msg, want)) fail_msg("job file: '%s' lacks '%s'", e1.msg, want);
        snprintf(want, sizeof want, "spec.optimizer.warmup: %ld must be below spec.steps (%ld): the warmup must end", cases[i].warmup,
                 cases[i].steps);
        if (!strstr(e2.msg, want)) fail_msg("CephaloJob: '%s' lacks '%s'", e2.msg, want);
    }
}

/* The one environment builder: every variable a launcher sets, in its order; optional ones only
 * when set; the comm timeout written as the job gave it. */
static void test_rank_env(void **state) {
    (void)state;
    wcmd_env e;
    wcmd_env_init(&e, 2, 3, "job-0.job.ns.svc", 29500);
    wcmd_argv a = {0};
    wcmd_env_entries(&e, &a);
    assert_int_equal(a.n, 4);
    assert_string_equal(a.v[0], "RANK=2");
    assert_string_equal(a.v[1], "WORLD_SIZE=3");
    assert_string_equal(a.v[2], "MASTER_ADDR=job-0.job.ns.svc");
    assert_string_equal(a.v[3], "MASTER_PORT=29500");
    wcmd_argv_free(&a);
    e.plan = "/etc/cephalo/plan.json", e.comm_timeout = 0.5, e.local_rank = 2, e.job = "job", e.job_id = "uid-1";
    e.metrics_port = 0;
    wcmd_env_entries(&e, &a);
    const char *want[] = {"RANK=2", "WORLD_SIZE=3", "MASTER_ADDR=job-0.job.ns.svc", "MASTER_PORT=29500",
                          "CEPHALO_PLAN=/etc/cephalo/plan.json", "CEPHALO_COMM_TIMEOUT=0.5", "LOCAL_RANK=2",
                          "CEPHALO_JOB=job", "CEPHALO_JOB_ID=uid-1", "CEPHALO_METRICS_PORT=0"};
    assert_int_equal(a.n, 10);
    for (int i = 0; i < 10; i++) assert_string_equal(a.v[i], want[i]);
    assert_null(a.v[a.n]);
    wcmd_argv_free(&a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crd_defaults),      cmocka_unit_test(test_crd_operator_defaults),
        cmocka_unit_test(test_crd_mismatch_is_seen),
        cmocka_unit_test(test_job_file_defaults), cmocka_unit_test(test_worker_defaults),
        cmocka_unit_test(test_numbers_read_back), cmocka_unit_test(test_defaults_spelled_out),
        cmocka_unit_test(test_same_job_every_option), cmocka_unit_test(test_same_job_defaults),
        cmocka_unit_test(test_same_job_crd_defaults), cmocka_unit_test(test_difference_is_seen),
        cmocka_unit_test(test_warmup_rule_shared), cmocka_unit_test(test_rank_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
