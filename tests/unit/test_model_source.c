/* test_model_source.c - spec.model.initFrom (operator/model_source.h): what is accepted, the
 * messages naming the field for what is not, the model planned from an inline config.json, and
 * what a worker pod gets. The ConfigMap path needs an API server: tests/cli/test_operator_init.sh. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "operator/model_source.h"

#define LLAMA "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":256,\"hidden_size\":64," \
    "\"intermediate_size\":192,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"num_hidden_layers\":2," \
    "\"max_position_embeddings\":128,\"rms_norm_eps\":1e-6,\"rope_scaling\":null}"

/* Parses {"initFrom": FROM}: the result, *s filled, err's message in msg. */
static int parse(const char *from, msrc *s, cJSON **model, char *msg) {
    char text[2048];
    snprintf(text, sizeof text, "{\"initFrom\":%s}", from);
    *model = cJSON_Parse(text);
    assert_non_null(*model);
    err_t err = {{0}};
    int rc = msrc_parse(*model, s, &err);
    snprintf(msg, 1024, "%s", err.msg);
    return rc;
}

static void test_accepted(void **state) {
    (void)state;
    static const struct {
        const char *from, *kind, *dir, *name;
    } cases[] = {
        {"{\"volume\":{\"persistentVolumeClaim\":{\"claimName\":\"hf\"}},\"path\":\"models/gpt2/\",\"config\":{}}",
         "persistentVolumeClaim", "/cephalo/init/models/gpt2", "gpt2"},
        {"{\"volume\":{\"hostPath\":{\"path\":\"/m\"}},\"configMap\":{\"name\":\"c\"}}", "hostPath", "/cephalo/init",
         "hf-model"},
        {"{\"volume\":{\"nfs\":{\"server\":\"nfs.local\",\"path\":\"/export\"}},\"path\":\"TinyLlama-1.1B\",\"config\":{}}",
         "nfs", "/cephalo/init/TinyLlama-1.1B", "TinyLlama-1.1B"},
        {"{\"volume\":{\"hostPath\":{\"path\":\"/m\"}},\"path\":\"a/..b/c\",\"config\":{}}", "hostPath",
         "/cephalo/init/a/..b/c", "c"},
        /* issue 38: a trailing "." names the directory before it, a path of "." components none */
        {"{\"volume\":{\"hostPath\":{\"path\":\"/m\"}},\"path\":\"models/gpt2/.\",\"config\":{}}", "hostPath",
         "/cephalo/init/models/gpt2/.", "gpt2"},
        {"{\"volume\":{\"hostPath\":{\"path\":\"/m\"}},\"path\":\"./gpt2//./\",\"config\":{}}", "hostPath",
         "/cephalo/init/./gpt2//.", "gpt2"},
        {"{\"volume\":{\"hostPath\":{\"path\":\"/m\"}},\"path\":\"./.\",\"config\":{}}", "hostPath",
         "/cephalo/init/./.", "hf-model"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        msrc s;
        cJSON *m;
        char msg[1024];
        int rc = parse(cases[i].from, &s, &m, msg);
        if (rc != 1) fail_msg("case %zu: %s", i, msg);
        assert_string_equal(s.kind, cases[i].kind);
        assert_string_equal(s.dir, cases[i].dir);
        assert_string_equal(s.name, cases[i].name);
        cJSON_Delete(m);
    }
    /* a ConfigMap's key defaults to config.json */
    msrc s;
    cJSON *m;
    char msg[1024];
    assert_int_equal(parse("{\"volume\":{\"hostPath\":{\"path\":\"/m\"}},\"configMap\":{\"name\":\"c\"}}", &s, &m, msg), 1);
    assert_string_equal(s.cm_name, "c");
    assert_string_equal(s.cm_key, "config.json");
    assert_null(s.config);
    cJSON_Delete(m);
    /* no initFrom: 0 */
    m = cJSON_Parse("{\"name\":\"gpt2-124m\"}");
    err_t err = {{0}};
    assert_int_equal(msrc_parse(m, &s, &err), 0);
    cJSON_Delete(m);
}

static void test_refused(void **state) {
    (void)state;
    static const struct {
        const char *from, *want;
    } cases[] = {
        {"{\"config\":{}}", "spec.model.initFrom.volume: missing"},
        {"{\"volume\":{},\"config\":{}}", "spec.model.initFrom.volume: expected exactly one volume source "
                                          "(persistentVolumeClaim, hostPath or nfs), got 0"},
        {"{\"volume\":{\"hostPath\":{\"path\":\"/m\"},\"nfs\":{\"server\":\"s\",\"path\":\"/e\"}},\"config\":{}}",
         "spec.model.initFrom.volume: expected exactly one volume source (persistentVolumeClaim, hostPath or nfs), "
         "got 2 (hostPath, nfs)"},
        {"{\"volume\":{\"csi\":{\"driver\":\"x\"}},\"config\":{}}",
         "spec.model.initFrom.volume.csi: not a supported volume source"},
        {"{\"volume\":{\"persistentVolumeClaim\":{}},\"config\":{}}",
         "spec.model.initFrom.volume.persistentVolumeClaim.claimName: missing"},
        {"{\"volume\":{\"persistentVolumeClaim\":{\"claimName\":\"Big_Name\"}},\"config\":{}}",
         "spec.model.initFrom.volume.persistentVolumeClaim.claimName: 'Big_Name' is not a claim name"},
        {"{\"volume\":{\"hostPath\":{\"path\":\"m\"}},\"config\":{}}",
         "spec.model.initFrom.volume.hostPath.path: 'm' is not an absolute path"},
        {"{\"volume\":{\"nfs\":{\"path\":\"/e\"}},\"config\":{}}", "spec.model.initFrom.volume.nfs.server: missing"},
        {"{\"volume\":{\"hostPath\":{\"path\":\"/m\"}},\"path\":\"/abs\",\"config\":{}}",
         "spec.model.initFrom.path: '/abs' is absolute"},
        {"{\"volume\":{\"hostPath\":{\"path\":\"/m\"}},\"path\":\"..\",\"config\":{}}",
         "spec.model.initFrom.path: '..' leaves the volume"},
        {"{\"volume\":{\"hostPath\":{\"path\":\"/m\"}},\"path\":\"a/../../b\",\"config\":{}}",
         "spec.model.initFrom.path: 'a/../../b' leaves the volume"},
        {"{\"volume\":{\"hostPath\":{\"path\":\"/m\"}}}", "spec.model.initFrom: missing config or configMap"},
        {"{\"volume\":{\"hostPath\":{\"path\":\"/m\"}},\"config\":{},\"configMap\":{\"name\":\"c\"}}",
         "spec.model.initFrom: give config or configMap, not both"},
        {"{\"volume\":{\"hostPath\":{\"path\":\"/m\"}},\"config\":\"{}\"}",
         "spec.model.initFrom.config: expected an object"},
        {"{\"volume\":{\"hostPath\":{\"path\":\"/m\"}},\"configMap\":{}}", "spec.model.initFrom.configMap.name: missing"},
        {"{\"volume\":{\"hostPath\":{\"path\":\"/m\"}},\"configMap\":{\"name\":\"c\",\"key\":\"\"}}",
         "spec.model.initFrom.configMap.key: expected a non-empty string"},
        {"[1]", "spec.model.initFrom: expected an object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        msrc s;
        cJSON *m;
        char msg[1024];
        int rc = parse(cases[i].from, &s, &m, msg);
        if (rc != -1 || strncmp(msg, cases[i].want, strlen(cases[i].want)) != 0)
            fail_msg("case %zu: rc %d, '%s' (want '%s...')", i, rc, msg, cases[i].want);
        cJSON_Delete(m);
    }
    /* initFrom with a name: one of the three */
    cJSON *m = cJSON_Parse("{\"name\":\"gpt2-124m\",\"initFrom\":{\"volume\":{\"hostPath\":{\"path\":\"/m\"}},\"config\":{}}}");
    msrc s;
    err_t err = {{0}};
    assert_int_equal(msrc_parse(m, &s, &err), -1);
    assert_non_null(strstr(err.msg, "spec.model: give one of name, inline and initFrom"));
    cJSON_Delete(m);
}

/* An inline config.json through the planner's reader: the model's fields, or the field at fault. */
static void test_model_inline(void **state) {
    (void)state;
    msrc s;
    cJSON *m;
    char msg[1024];
    assert_int_equal(parse("{\"volume\":{\"hostPath\":{\"path\":\"/m\"}},\"path\":\"tiny-llama\",\"config\":" LLAMA "}",
                           &s, &m, msg), 1);
    model_spec spec;
    err_t err = {{0}};
    if (msrc_model(NULL, "ml", &s, &spec, &err) != 0) fail_msg("%s", err.msg);
    assert_string_equal(spec.name, "tiny-llama");
    assert_int_equal(spec.arch, ARCH_LLAMA);
    assert_int_equal(spec.n_layer, 2);
    assert_int_equal(spec.d_model, 64);
    assert_int_equal(spec.n_head, 4);
    assert_int_equal(spec.n_kv_head, 2);
    assert_int_equal(spec.d_ff, 192);
    assert_int_equal(spec.vocab, 256);
    assert_int_equal(spec.max_seq, 128);
    assert_false(spec.tied_head);
    cJSON_Delete(m);

    /* a field Cephalo cannot train, named under the job's field */
    assert_int_equal(parse("{\"volume\":{\"hostPath\":{\"path\":\"/m\"}},\"config\":{\"architectures\":"
                           "[\"LlamaForCausalLM\"],\"vocab_size\":256,\"hidden_size\":64,\"intermediate_size\":192,"
                           "\"num_attention_heads\":4,\"num_hidden_layers\":2,\"rope_scaling\":{\"type\":\"yarn\"}}}",
                           &s, &m, msg), 1);
    assert_int_equal(msrc_model(NULL, "ml", &s, &spec, &err), -1);
    assert_non_null(strstr(err.msg, "spec.model.initFrom.config: rope_scaling.type is \"yarn\""));
    cJSON_Delete(m);
    assert_int_equal(parse("{\"volume\":{\"hostPath\":{\"path\":\"/m\"}},\"config\":{\"model_type\":\"gemma\"}}",
                           &s, &m, msg), 1);
    assert_int_equal(msrc_model(NULL, "ml", &s, &spec, &err), -1);
    assert_non_null(strstr(err.msg, "spec.model.initFrom.config: architecture 'gemma' cannot be imported"));
    cJSON_Delete(m);
}

/* The pod: the volume (claims read-only whatever the job said), the read-only mount, and the
 * directory its `--init-from` names (test_job_spec.c checks the argument itself). */
static void test_pod(void **state) {
    (void)state;
    msrc s;
    cJSON *m;
    char msg[1024];
    assert_int_equal(parse("{\"volume\":{\"persistentVolumeClaim\":{\"claimName\":\"hf\",\"readOnly\":false}},"
                           "\"path\":\"gpt2\",\"config\":{}}", &s, &m, msg), 1);
    cJSON *vols = cJSON_CreateArray(), *mounts = cJSON_CreateArray();
    msrc_pod(&s, vols, mounts);
    char *v = cJSON_PrintUnformatted(vols), *mt = cJSON_PrintUnformatted(mounts);
    assert_string_equal(v, "[{\"name\":\"init-from\",\"persistentVolumeClaim\":{\"claimName\":\"hf\",\"readOnly\":true}}]");
    assert_string_equal(mt, "[{\"name\":\"init-from\",\"mountPath\":\"/cephalo/init\",\"readOnly\":true}]");
    assert_string_equal(s.dir, "/cephalo/init/gpt2");
    free(v), free(mt);
    cJSON_Delete(vols), cJSON_Delete(mounts);
    /* the job's object is not changed (the pod has a copy) */
    assert_true(cJSON_IsFalse(cJSON_GetObjectItem(s.source, "readOnly")));
    cJSON_Delete(m);

    /* hostPath: the source as given (it has no readOnly; the mount is) */
    assert_int_equal(parse("{\"volume\":{\"hostPath\":{\"path\":\"/m\",\"type\":\"Directory\"}},\"config\":{}}",
                           &s, &m, msg), 1);
    vols = cJSON_CreateArray(), mounts = cJSON_CreateArray();
    msrc_pod(&s, vols, mounts);
    v = cJSON_PrintUnformatted(vols);
    assert_string_equal(v, "[{\"name\":\"init-from\",\"hostPath\":{\"path\":\"/m\",\"type\":\"Directory\"}}]");
    assert_string_equal(s.dir, "/cephalo/init");
    free(v);
    cJSON_Delete(vols), cJSON_Delete(mounts);
    cJSON_Delete(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accepted),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_model_inline),
        cmocka_unit_test(test_pod),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
