/* fuzz_job_spec.c - libFuzzer target for a CephaloJob's spec (operator/job_spec.c, with
 * spec.model.initFrom's checks in operator/model_source_spec.c): the input is the job as the API
 * server sends it (JSON through common/json_util.c), its `spec` read as the reconcile reads it.
 * A spec that parses is turned into the worker pods' arguments for each recompute mode (the
 * builder of common/worker_cmd.c), and every argument is read, so a field the parse let through
 * that the builder cannot take shows up under ASan. A refused spec must say why. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/json_util.h"
#include "operator/job_spec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Where the arguments' lengths are summed into, so the reads are not optimised away. */
static volatile size_t sink;

static void build_argv(const job_spec *s, recompute_mode mode) {
    wcmd_argv a = {0};
    job_spec_worker_argv(s, mode, &a);
    if (a.n < 1 || strcmp(a.v[0], "train") != 0) abort();
    for (int i = 0; i < a.n; i++)
        sink += strlen(a.v[i]);
    wcmd_argv_free(&a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    err_t err;
    cJSON *job = json_parse("job.json", (const char *)data, size, &err);
    if (!job) return 0;
    job_spec s;
    err.msg[0] = '\0';
    int rc = job_spec_parse(cJSON_GetObjectItemCaseSensitive(job, "spec"), &s, &err);
    if (rc != 0 && (rc != -1 || !err.msg[0])) abort(); /* a refusal without its reason */
    if (rc == 0) {
        build_argv(&s, RECOMPUTE_NONE);
        build_argv(&s, RECOMPUTE_FULL);
    }
    cJSON_Delete(job);
    return 0;
}
