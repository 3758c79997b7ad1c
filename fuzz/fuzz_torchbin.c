/* fuzz_torchbin.c - libFuzzer target for the torch.save reader (tb_parse: the zip's central
 * directory and zip64 fields, the restricted pickle machine, tensors against their storages in
 * worker/formats/torchbin.c). Every tensor a successful parse returns is read in full and looked
 * up by name, so a bounds or lookup mistake shows up under ASan. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats/torchbin.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile unsigned sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* A private copy, exactly `size` bytes long: reads past the input are caught by ASan. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    st_file *f;
    err_t err;
    if (tb_parse(&f, buf, size, "fuzz.bin", &err) == 0) {
        for (int i = 0; i < st_count(f); i++) {
            const st_tensor *t = st_tensor_at(f, i);
            const uint8_t *p = t->data;
            for (size_t k = 0; k < t->nbytes; k++) sink += p[k];
            if (st_find(f, t->name) != t) abort();
        }
        st_close(f);
    }
    free(buf);
    return 0;
}
