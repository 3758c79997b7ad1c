/* fuzz_job.c - libFuzzer target for the job file parser of `cephalo run` (job_load_string: YAML
 * through common/yaml_tree.c, then cli/job.c's fields, devices and cross-field checks). */
#include <stddef.h>
#include <stdint.h>

#include "cli/job.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    job j;
    err_t err;
    if (job_load_string("fuzz.yaml", (const char *)data, size, &j, &err) == 0) (void)job_check(&j, &err);
    job_free(&j);
    return 0;
}
