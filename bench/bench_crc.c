/* bench_crc.c - the checkpoint checksum (st_crc32, worker/formats/safetensors.c) on one core:
 * the rate at which loading a checkpoint verifies its data (docs/checkpoints.md). Prints GB/s of
 * wall time and of the thread's CPU time (the CPU figure holds on a busy machine); `make bench`
 * runs it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "common/log.h"
#include "formats/safetensors.h"

enum { MIB = 1 << 20, BUF_MIB = 256, PASSES = 4 };

static double seconds(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(void) {
    size_t n = (size_t)BUF_MIB * MIB;
    uint8_t *buf = malloc(n);
    CHECK(buf != NULL);
    /* written before timing, so no page fault is timed */
    for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)(i * 2654435761u >> 13);
    uint32_t crc = 0;
    double w0 = seconds(CLOCK_MONOTONIC), c0 = seconds(CLOCK_THREAD_CPUTIME_ID);
    for (int p = 0; p < PASSES; p++) crc = st_crc32(crc, buf, n);
    double wall = seconds(CLOCK_MONOTONIC) - w0, cpu = seconds(CLOCK_THREAD_CPUTIME_ID) - c0;
    double gb = (double)n * PASSES / 1e9;
    printf("checkpoint CRC-32 (st_crc32), %d x %d MiB on one core: %.2f GB/s wall,"
           " %.2f GB/s of CPU time (crc %08x)\n",
           PASSES, BUF_MIB, gb / wall, gb / cpu, (unsigned)crc);
    free(buf);
    return 0;
}
