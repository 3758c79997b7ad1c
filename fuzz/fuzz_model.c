/* fuzz_model.c - libFuzzer target for the model file parser (model_load_string: YAML loading
 * through common/yaml_tree.c, fields and defaults in planner/model_file.c, then model_validate). */
#include <stddef.h>
#include <stdint.h>

#include "planner/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    model_spec m;
    err_t err;
    (void)model_load_string("fuzz.yaml", (const char *)data, size, &m, &err); /* nothing to free */
    return 0;
}
