/* fuzz_safetensors.c - libFuzzer target for the safetensors reader (st_parse: size field, UTF-8
 * and JSON header through common/json_util.c, entry checks, layout and CRC in
 * worker/formats/safetensors.c). Every tensor a successful parse returns is read in full and looked up by
 * name, so a bounds or lookup mistake shows up under ASan. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Where the tensor bytes are summed into, so the reads are not optimised away. */
static volatile unsigned sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* A private copy, exactly `size` bytes long: reads past the input are caught by ASan. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    st_file *f;
    err_t err;
    if (st_parse(&f, buf, size, "fuzz.safetensors", &err) == 0) {
        for (int i = 0; i < st_count(f); i++) {
            const st_tensor *t = st_tensor_at(f, i);
            const uint8_t *p = t->data;
            for (size_t k = 0; k < t->nbytes; k++)
                sink += p[k];
            if (st_find(f, t->name) != t) abort();
            if (st_expect(f, t->name, t->dtype, t->ndim, t->shape, NULL, &err) != 0) abort();
        }
        (void)st_meta(f, ST_CRC_KEY);
        st_close(f);
    }
    free(buf);
    return 0;
}
