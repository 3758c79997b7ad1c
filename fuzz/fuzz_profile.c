/* fuzz_profile.c - libFuzzer target for the profile file parser (profile_load_string: JSON
 * parsing through common/json_util.c, then entry/comm validation in planner/profile.c). */
#include <stddef.h>
#include <stdint.h>

#include "planner/profile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    profile p;
    err_t err;
    if (profile_load_string("fuzz.json", (const char *)data, size, &p, &err) == 0) profile_free(&p);
    return 0;
}
