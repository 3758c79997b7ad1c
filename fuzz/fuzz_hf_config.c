/* fuzz_hf_config.c - libFuzzer target for the Hugging Face config.json reader
 * (model_load_hf_string: JSON through common/json_util.c with its duplicate-key check, the
 * GPT-2 and Llama fields in planner/model_hf.c, then model_validate). */
#include <stddef.h>
#include <stdint.h>

#include "planner/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    model_spec m;
    err_t err;
    (void)model_load_hf_string("config.json", (const char *)data, size, "fuzz", &m, &err); /* nothing to free */
    return 0;
}
