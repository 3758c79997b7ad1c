/* device.c - the device kinds: one row per kind (device.h's device_kind), chosen by name.
 *
 * The CPU device (cpu_device.c) is a row of every binary. The CUDA device is linked into
 * cephalo-worker-cuda only, where cuda_device.cu registers its row at start-up
 * (device_kind_register), as comm_nccl.c registers the nccl backend with comm.c; in the CPU
 * binaries the name "cuda" is then unknown, and asking for it is an error that names the binary
 * to use. What every kind shares (the accounting allocator, the RoPE tables, ...) is
 * dev_common.c's, below the kinds: uses run one way, device.c -> cpu_device.c -> dev_common.c. */
#include "devices/device.h"

#include <string.h>

#include "common/log.h"

/* The kinds this binary has: the CPU device, and those registered at start-up. */
#define MAX_KINDS 4
static const device_kind *kinds[MAX_KINDS] = {&cpu_device_kind};
static int n_kinds = 1;

void device_kind_register(const device_kind *k) {
    CHECK(n_kinds < MAX_KINDS);
    kinds[n_kinds++] = k;
}

static const device_kind *find_kind(const char *name) {
    for (int i = 0; i < n_kinds; i++)
        if (!strcmp(kinds[i]->name, name)) return kinds[i];
    return NULL;
}

int device_open(device *d, const char *kind, int rank, int threads, int gpu, int64_t capacity,
                err_t *err) {
    const device_kind *k = find_kind(kind);
    if (!k && !strcmp(kind, "cuda"))
        return err_set(err, "rank %d: the cuda device needs cephalo-worker-cuda (this worker was "
                       "built without CUDA; `make` builds it where nvcc is installed)", rank);
    if (!k) return err_set(err, "device '%s' is unknown (expected 'cpu' or 'cuda')", kind);
    return k->init(d, rank, threads, gpu, capacity, err);
}

/* The kind whose op table d runs on (its ops' name is its row's name). */
void device_close(device *d) {
    if (!d->ops) return;
    const device_kind *k = find_kind(d->ops->name);
    CHECK(k != NULL);
    k->close(d);
    d->ops = NULL;
}

int device_cuda_count(void) {
    const device_kind *k = find_kind("cuda");
    return k ? k->count() : 0;
}
