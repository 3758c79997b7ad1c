/* fuzz_cluster.c - libFuzzer target for the cluster file parser (cluster_load_string: YAML
 * loading through common/yaml_tree.c, then node/GPU validation in planner/cluster.c). */
#include <stddef.h>
#include <stdint.h>

#include "planner/cluster.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cluster c;
    err_t err;
    if (cluster_load_string("fuzz.yaml", (const char *)data, size, &c, &err) == 0) cluster_free(&c);
    return 0;
}
