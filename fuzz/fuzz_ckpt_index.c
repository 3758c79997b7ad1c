/* fuzz_ckpt_index.c - libFuzzer target for a sharded checkpoint's index.json (ckpt_index_parse,
 * worker/state/ckpt_index.c: JSON through common/json_util.c, the files and their slices, the
 * tiling check), for the model tiny-gpt, the model of the sharded checkpoints of
 * tests/cli/test_fsdp.sh. An index that is accepted must tile every unit exactly (each slice
 * inside the unit, no overlap, nothing missing: checked here again, pairwise) and name files in
 * its directory; a refused one must say why. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "planner/model.h"
#include "state/ckpt_index.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define DIR "ckpt/step_00000002"
#define MAX_UNITS 64

static void check_unit(const ckpt_index *ix, int u, int64_t numel) {
    int64_t covered = 0;
    for (int i = 0; i < ix->n_files; i++) {
        const ckpt_slices *a = &ix->files[i];
        if (a->off[u] < 0 || a->n[u] < 0 || a->off[u] + a->n[u] > numel) abort();
        covered += a->n[u];
        for (int j = 0; j < i; j++) {
            const ckpt_slices *b = &ix->files[j];
            if (a->n[u] && b->n[u] && a->off[u] < b->off[u] + b->n[u] && b->off[u] < a->off[u] + a->n[u]) abort();
        }
    }
    if (covered != numel) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static model_spec m;
    static int64_t numel[MAX_UNITS];
    static int n_units;
    err_t err;
    if (n_units == 0) { /* once: the model is the same for every input */
        if (model_resolve("tiny-gpt", &m, &err) < 0 || (n_units = model_n_units(&m)) > MAX_UNITS) abort();
        for (int u = 0; u < n_units; u++) numel[u] = model_unit_params(&m, u);
    }
    ckpt_index ix;
    err.msg[0] = '\0';
    int rc = ckpt_index_parse(DIR "/index.json", (const char *)data, size, DIR, DIR, numel, n_units, &ix, &err);
    if (rc != 0 && (rc != -1 || !err.msg[0])) abort(); /* a refusal without its reason */
    if (rc == 0) {
        for (int u = 0; u < n_units; u++) check_unit(&ix, u, numel[u]);
        for (int i = 0; i < ix.n_files; i++)
            if (strncmp(ix.files[i].path, DIR "/", sizeof DIR) || strchr(ix.files[i].path + sizeof DIR, '/')) abort();
    }
    ckpt_index_free(&ix);
    return 0;
}
