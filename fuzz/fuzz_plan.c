/* fuzz_plan.c - libFuzzer target for the worker's reading of a plan (plan_parse,
 * worker/state/plan_read.c: JSON through common/json_util.c, the model by name or as a spec
 * through planner/model_json.c, this rank's batch and microbatches, the units' shard sizes).
 *
 * The first byte is the rank and world size the worker was started with (the environment's RANK
 * and WORLD_SIZE): world = 1 + (byte & 7), rank = (byte >> 3) % world; the rest is plan.json. A
 * plan that is accepted must hold what the trainer relies on without checking again: this rank's
 * batch is microbatch x microbatches, and with world > 1 the shard sizes of every unit, one per
 * rank, add up to the unit's parameters. A refused plan must say why. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "state/plan_read.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const train_config *c, int rank, int world) {
    if (c->batch != c->micro * c->micros || c->sample_offset < 0 || c->rank != rank || c->world != world) abort();
    if ((world > 1) != (c->shard_sizes != NULL)) abort();
    if (!c->shard_sizes) return;
    for (int u = 0; u < model_n_units(&c->model); u++) {
        int64_t sum = 0;
        for (int r = 0; r < world; r++)
            sum += c->shard_sizes[(int64_t)u * world + r];
        if (sum != model_unit_params(&c->model, u)) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int world = 1 + (data[0] & 7), rank = (data[0] >> 3) % world;
    train_config c = {0};
    err_t err;
    err.msg[0] = '\0';
    int rc = plan_parse("plan.json", (const char *)data + 1, size - 1, rank, world, &c, &err);
    if (rc != 0 && (rc != -1 || !err.msg[0])) abort(); /* a refusal without its reason */
    if (rc == 0) check(&c, rank, world);
    free(c.shard_sizes); /* what train_config_release does (model/train.c, which needs BLAS) */
    return 0;
}
