/* test_job_spec.c - a CephaloJob's spec read once (operator/job_spec.h): the defaults (the worker's
 * from common/worker_cmd.h's table, the operator's own), the worker pods' arguments through the
 * one builder with the paths inside the pod, the messages naming the field, and the phases
 * (operator/phase.h). The pods themselves need an API server: tests/cli/test_operator*.sh. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "operator/job_spec.h"
#include "operator/phase.h"

/* Parses the spec given as JSON: the result; *doc (the caller frees it) and *s; the message in msg. */
static int parse(const char *json, cJSON **doc, job_spec *s, char *msg) {
    *doc = cJSON_Parse(json);
    assert_non_null(*doc);
    err_t err = {{0}};
    int rc = job_spec_parse(*doc, s, &err);
    snprintf(msg, 1024, "%s", err.msg);
    return rc;
}

/* The worker's arguments joined by spaces. */
static char *argv_line(const job_spec *s) {
    wcmd_argv a = {0};
    job_spec_worker_argv(s, RECOMPUTE_FULL, &a);
    static char line[8192];
    line[0] = '\0';
    for (int i = 0; i < a.n; i++) {
        size_t len = strlen(line);
        snprintf(line + len, sizeof line - len, "%s%s", i ? " " : "", a.v[i]);
    }
    wcmd_argv_free(&a);
    return line;
}

#define NO_DATA "{\"model\":{\"name\":\"tiny-gpt\"},\"globalBatch\":8,\"steps\":10"
#define MINIMAL NO_DATA ",\"data\":{\"path\":\"synthetic\"}"

static void test_defaults(void **state) {
    (void)state;
    cJSON *doc;
    job_spec s;
    char msg[1024];
    assert_int_equal(parse(MINIMAL "}", &doc, &s, msg), 0);
    assert_int_equal(s.model, JOB_MODEL_NAME);
    assert_string_equal(s.model_name, "tiny-gpt");
    assert_int_equal(s.global_batch, 8);
    assert_int_equal(s.train.steps, 10);
    /* the worker's defaults are the table's */
    assert_true(s.train.lr == wcmd_default_num(WCMD_LR));
    assert_true(s.train.min_lr < 0); /* lr / 10, written out by the builder */
    assert_true(s.train.weight_decay == wcmd_default_num(WCMD_WEIGHT_DECAY));
    assert_true(s.train.eps == wcmd_default_num(WCMD_EPS));
    assert_int_equal(s.train.keep_last, -1); /* not given: the checkpoint directory's, else the table's */
    assert_int_equal(s.train.keep_every, -1);
    assert_string_equal(s.train.resume, wcmd_job_default(WCMD_RESUME)); /* a job resumes: "auto" */
    assert_string_equal(s.data_path, "synthetic"); /* as named: spec.data.path has no default */
    /* the operator's own */
    assert_true(s.mem_cap == JOB_SPEC_MEM_CAP);
    assert_int_equal(s.strat, STRAT_CEPHALO);
    assert_int_equal(s.recompute, RECOMPUTE_AUTO); /* the planner's choice per rank */
    assert_int_equal(s.metrics_port, JOB_SPEC_METRICS_PORT);
    assert_true(s.comm_timeout_s == JOB_SPEC_COMM_TIMEOUT_S);
    assert_int_equal(s.backoff_limit, JOB_SPEC_BACKOFF_LIMIT);
    assert_int_equal(s.grace_s, JOB_SPEC_GRACE_S);
    assert_int_equal(s.priority, JOB_SPEC_PRIORITY);
    assert_int_equal(s.min_replan_s, JOB_SPEC_MIN_REPLAN_S);
    assert_int_equal(s.min_gpus, 0);
    assert_int_equal(s.max_gpus, 0);
    assert_int_equal(s.seq_len, 0);
    assert_false(s.suspend);
    assert_false(s.checkpoint);
    assert_null(s.image);
    assert_null(s.tolerations);
    /* every setting spelled out, min-lr too: lr / 10 as the worker would compute it (0.0003 / 10 is
     * not the double nearest 3e-05) */
    assert_string_equal(argv_line(&s), "train --steps 10 --seed 1 --precision fp32 --recompute full --lr 0.0003 "
                                       "--min-lr 2.9999999999999997e-05 "
                                       "--schedule cosine --warmup 0 --weight-decay 0.1 --beta1 0.9 --beta2 0.95 "
                                       "--eps 1e-08 --clip 1 --data synthetic");
    cJSON_Delete(doc);
}

/* Everything given: the volumes' paths inside the pod, retention and resume always spelled out. */
static void test_worker_argv(void **state) {
    (void)state;
    cJSON *doc;
    job_spec s;
    char msg[1024];
    assert_int_equal(parse("{\"model\":{\"initFrom\":{\"volume\":{\"persistentVolumeClaim\":{\"claimName\":\"hf\"}},"
                           "\"path\":\"models/tiny-llama\",\"config\":{}}},\"globalBatch\":4,\"steps\":400,\"seed\":7,"
                           "\"precision\":\"bf16\",\"optimizer\":{\"lr\":0.003,\"minLr\":0.0001,\"schedule\":\"linear\","
                           "\"warmup\":5,\"weightDecay\":0,\"beta1\":0.8,\"beta2\":0.99,\"eps\":1e-6,\"clip\":0.5},"
                           "\"data\":{\"pvc\":\"tokens\",\"path\":\"train/*.bin\",\"validation\":{\"path\":\"val/*.bin\","
                           "\"every\":50,\"samples\":16}},\"checkpoint\":{\"pvc\":\"ck\",\"dir\":\"tiny\",\"every\":100,"
                           "\"keepLast\":2,\"keepEvery\":1000,\"resume\":\"never\"}}", &doc, &s, msg), 0);
    assert_string_equal(argv_line(&s),
                        "train --steps 400 --seed 7 --precision bf16 --recompute full --lr 0.003 --min-lr 0.0001 --schedule linear "
                        "--warmup 5 --weight-decay 0 --beta1 0.8 --beta2 0.99 --eps 1e-06 --clip 0.5 "
                        "--data /data/train/*.bin --init-from /cephalo/init/models/tiny-llama --val-data /data/val/*.bin "
                        "--val-every 50 --val-samples 16 --ckpt-dir /checkpoints/tiny --ckpt-every 100 --keep-last 2 "
                        "--keep-every 1000 --resume never");
    cJSON_Delete(doc);
    /* without claims the paths are the job's (a filesystem every pod shares); no retention given:
     * none in the args (the worker keeps the directory's) */
    assert_int_equal(parse(NO_DATA ",\"data\":{\"path\":\"/shared/tok\",\"validation\":{\"path\":\"/shared/val\"}},"
                           "\"checkpoint\":{\"dir\":\"/shared/odd\",\"every\":5}}", &doc, &s, msg), 0);
    assert_non_null(strstr(argv_line(&s), "--data /shared/tok --val-data /shared/val --ckpt-dir /shared/odd "
                                          "--ckpt-every 5 --resume auto"));
    cJSON_Delete(doc);
}

/* The worker pods' arguments and `cephalo-worker train`'s builder agree: the same options give
 * the same argv. */
static void test_same_builder(void **state) {
    (void)state;
    cJSON *doc;
    job_spec s;
    char msg[1024];
    assert_int_equal(parse(MINIMAL ",\"optimizer\":{\"lr\":0.001}}", &doc, &s, msg), 0);
    wcmd_train t;
    wcmd_train_defaults(&t);
    t.steps = 10, t.lr = 0.001, t.data = "synthetic";
    wcmd_argv a = {0}, b = {0};
    wcmd_train_argv(&t, &a);
    job_spec_worker_argv(&s, RECOMPUTE_FULL, &b);
    assert_int_equal(a.n, b.n);
    for (int i = 0; i < a.n; i++) assert_string_equal(a.v[i], b.v[i]);
    wcmd_argv_free(&a), wcmd_argv_free(&b);
    cJSON_Delete(doc);
}

static void test_refused(void **state) {
    (void)state;
    static const struct {
        const char *spec, *msg;
    } cases[] = {
        {"{\"model\":{\"name\":\"tiny-gpt\"},\"globalBatch\":8}", "spec.steps: missing (required)"},
        {NO_DATA "}", "spec.data.path: missing (required): token shards, or `synthetic` for random tokens"},
        {NO_DATA ",\"data\":{\"pvc\":\"tokens\"}}", "spec.data.path: missing (required)"},
        {MINIMAL ",\"optimizer\":{\"lr\":20}}", "spec.optimizer.lr: expected a number in [0, 10], got 20"},
        {MINIMAL ",\"optimizer\":{\"warmup\":1.5}}", "spec.optimizer.warmup: expected an integer in [0, 1099511627776], got 1.5"},
        {MINIMAL ",\"memCap\":0}", "spec.memCap: expected a number in (0, 1], got 0"},
        {MINIMAL ",\"metricsPort\":\"9400\"}", "spec.metricsPort: expected an integer in [0, 65535], got \"9400\""},
        {MINIMAL ",\"precision\":\"fp64\"}", "spec.precision: 'fp64' (expected fp32, bf16 or fp16)"},
        {MINIMAL ",\"recompute\":\"some\"}", "spec.recompute: 'some' (expected auto, none or full)"},
        {MINIMAL ",\"recompute\":true}", "spec.recompute: expected a non-empty string, got true"},
        {MINIMAL ",\"optimizer\":{\"schedule\":\"step\"}}", "spec.optimizer.schedule: 'step' (expected cosine, linear or constant)"},
        {MINIMAL ",\"strategy\":\"best\"}", "spec.strategy: unknown strategy 'best'"},
        {MINIMAL ",\"gpus\":{\"minGPUs\":3,\"maxGPUs\":2}}",
         "spec.gpus.minGPUs 3 is more than spec.gpus.maxGPUs 2 (expected minGPUs <= maxGPUs)"},
        /* the worker's rule (common/worker_cmd.c): InvalidSpec, not pods that fail and restart */
        {MINIMAL ",\"optimizer\":{\"warmup\":10}}",
         "spec.optimizer.warmup: 10 must be below spec.steps (10): the warmup must end before the last step"},
        {MINIMAL ",\"optimizer\":{\"warmup\":11}}", "spec.optimizer.warmup: 11 must be below spec.steps (10)"},
        {"{\"model\":{},\"globalBatch\":8,\"steps\":1}", "spec.model: give name, inline or initFrom"},
        {"{\"model\":{\"name\":\"a\",\"inline\":{}},\"globalBatch\":8,\"steps\":1}",
         "spec.model: give one of name, inline and initFrom"},
        {"{\"model\":{\"initFrom\":{\"volume\":{},\"config\":{}}},\"globalBatch\":8,\"steps\":1}",
         "spec.model.initFrom.volume: expected exactly one volume source"},
        {MINIMAL ",\"imagePullPolicy\":\"Sometimes\"}", "spec.imagePullPolicy: 'Sometimes' (expected Always, IfNotPresent or Never)"},
        {MINIMAL ",\"seed\":-1}", "spec.seed: expected an integer in [0, 4611686018427387904], got -1"},
        {NO_DATA ",\"data\":{\"path\":\"t\",\"validation\":{\"every\":5}}}", "spec.data.validation.path: missing (required)"},
        {MINIMAL ",\"checkpoint\":{\"every\":5}}", "spec.checkpoint.dir: missing (required)"},
        {MINIMAL ",\"tolerations\":{}}", "spec.tolerations: expected a list, got an object"},
        {MINIMAL ",\"optimizer\":3}", "spec.optimizer: expected an object, got 3"},
        {MINIMAL ",\"suspend\":\"yes\"}", "spec.suspend: expected true or false, got \"yes\""},
        {MINIMAL ",\"image\":\"\"}", "spec.image: expected a non-empty string, got \"\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cJSON *doc;
        job_spec s;
        char msg[1024];
        if (parse(cases[i].spec, &doc, &s, msg) != -1) fail_msg("case %zu accepted: %s", i, cases[i].spec);
        if (!strstr(msg, cases[i].msg)) fail_msg("case %zu: '%s' lacks '%s'", i, msg, cases[i].msg);
        cJSON_Delete(doc);
    }
}

/* A mistake leaves every other field read: a suspended job with a wrong field is still suspended,
 * and the queue still sees its priority. */
static void test_mistake_keeps_the_rest(void **state) {
    (void)state;
    cJSON *doc;
    job_spec s;
    char msg[1024];
    assert_int_equal(parse(MINIMAL ",\"optimizer\":{\"lr\":-1},\"suspend\":true,\"priority\":5}", &doc, &s, msg), -1);
    assert_non_null(strstr(msg, "spec.optimizer.lr"));
    assert_true(s.suspend);
    assert_int_equal(s.priority, 5);
    assert_true(s.train.lr == wcmd_default_num(WCMD_LR)); /* the wrong one: its default */
    cJSON_Delete(doc);
}

/* status.model, the MODEL column: every kind of spec.model names something. */
static void test_model_label(void **state) {
    (void)state;
    const char *cases[][2] = {
        {"{\"name\":\"gpt2-124m\"}", "gpt2-124m"},
        {"{\"inline\":{\"name\":\"wide\",\"base\":\"gpt2-124m\",\"n_layer\":4}}", "wide (inline)"},
        {"{\"inline\":{\"base\":\"gpt2-124m\",\"n_layer\":4}}", "gpt2-124m+ (inline)"},
        {"{\"inline\":{\"arch\":\"llama\",\"n_layer\":32,\"d_model\":4096,\"n_head\":32}}", "llama 32x4096 (inline)"},
        {"{\"initFrom\":{\"volume\":{\"hostPath\":{\"path\":\"/m\"}},\"path\":\"hf/Llama-2-7b-hf\","
         "\"configMap\":{\"name\":\"c\"}}}", "Llama-2-7b-hf (initFrom)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char json[512], msg[1024];
        snprintf(json, sizeof json, "{\"model\":%s,\"globalBatch\":8,\"steps\":10,\"data\":{\"path\":\"synthetic\"}}",
                 cases[i][0]);
        cJSON *doc;
        job_spec *s = malloc(sizeof *s);
        assert_int_equal(parse(json, &doc, s, msg), 0);
        assert_string_equal(s->model_label, cases[i][1]);
        free(s);
        cJSON_Delete(doc);
    }
}

static void test_phases(void **state) {
    (void)state;
    for (int p = PHASE_NONE + 1; p < PHASE_COUNT; p++) assert_int_equal(phase_parse(phase_name((phase)p)), p);
    assert_int_equal(phase_parse("Queued"), PHASE_QUEUED);
    assert_int_equal(phase_parse("queued"), PHASE_NONE);
    assert_int_equal(phase_parse(NULL), PHASE_NONE);
    assert_int_equal(phase_parse(""), PHASE_NONE);
    assert_string_equal(phase_name(PHASE_NONE), "");
    assert_true(phase_live(PHASE_PLANNED) && phase_live(PHASE_RUNNING) && phase_live(PHASE_RESTARTING));
    assert_false(phase_live(PHASE_QUEUED) || phase_live(PHASE_SUCCEEDED) || phase_live(PHASE_NONE));
    assert_true(phase_finished(PHASE_SUCCEEDED) && phase_finished(PHASE_FAILED));
    assert_false(phase_finished(PHASE_RUNNING) || phase_finished(PHASE_PENDING));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_worker_argv),
        cmocka_unit_test(test_same_builder),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_mistake_keeps_the_rest),
        cmocka_unit_test(test_model_label),
        cmocka_unit_test(test_phases),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
