/* nccl_budget.h - an estimate of the device memory NCCL takes for its own buffers on each GPU of
 * a communicator, outside every allocator of ours (the worker's device capacity, the planner's
 * memory model). Used by the CUDA worker (the capacity of a device with an automatic capacity
 * shrinks by it when the nccl backend opens on its GPU) and by the planner.
 *
 * Where the numbers come from (NCCL's documentation and source, NCCL 2.18 - 2.2x):
 *  - every channel keeps, per peer connection, one buffer per protocol: Simple NCCL_BUFFSIZE
 *    (default 4 MiB), LL128 (about 4.6 MiB: 120 elements x 640 threads x 8 steps x 8 bytes) and
 *    LL (512 KiB: 8 lines x 512 threads x 8 steps x 16 bytes);
 *  - a ring channel connects to one previous and one next rank, a tree channel to a parent and
 *    up to two children; the receiving side holds the buffers, so count 2 connections per
 *    channel within a node, 4 once the tree spans nodes (world > 8 is taken as several nodes);
 *  - channels: NCCL picks them from the topology, up to NCCL_MAX_NCHANNELS (32 by default); a
 *    PCIe node uses 2-4, an NVLink A100 node 16-24, an NVLink/NVSwitch H100 node up to 32. We
 *    take 16 below sm_90 and 32 on sm_90+;
 *  - NVLink SHARP (NVLS, sm_90 with NVSwitch) maps multicast buffers per channel on top, several
 *    hundred MiB to about 1 GiB per GPU (reported in NVIDIA/nccl issues; NCCL_NVLS_ENABLE=0 is
 *    the usual memory saver): we budget 1 GiB on sm_90+ unless NCCL_NVLS_ENABLE=0;
 *  - plus about 64 MiB of fixed per-communicator state (work FIFOs, proxy and channel structs).
 * The environment variables NCCL itself reads (NCCL_BUFFSIZE, NCCL_MAX_NCHANNELS,
 * NCCL_NVLS_ENABLE) change the estimate the same way; read in the process that calls this, so a
 * planner on another machine than the workers should see the workers' settings. An estimate,
 * on the generous side: the nccl backend logs the measured figure when it opens (docs/cuda.md).
 * Header-only: C and CUDA C++ include it. */
#ifndef CEPHALO_NCCL_BUDGET_H
#define CEPHALO_NCCL_BUDGET_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NCCL_BUDGET_SIMPLE ((int64_t)4 << 20)                /* NCCL_BUFFSIZE default */
#define NCCL_BUDGET_LL128 ((int64_t)120 * 640 * 8 * 8)       /* 4.6875 MiB */
#define NCCL_BUDGET_LL ((int64_t)8 * 512 * 8 * 16)           /* 512 KiB */
#define NCCL_BUDGET_NVLS ((int64_t)1 << 30)                  /* sm_90+ with NVSwitch */
#define NCCL_BUDGET_FIXED ((int64_t)64 << 20)                /* per communicator */

/* A positive integer from the environment, else def. */
static inline int64_t nccl_budget_env(const char *name, int64_t def) {
    const char *v = getenv(name);
    if (!v || !*v) return def;
    char *end = NULL;
    long long x = strtoll(v, &end, 0);
    return end && *end == '\0' && x > 0 ? (int64_t)x : def;
}

/* Bytes of device memory NCCL's communicator is expected to take on each GPU, for `world`
 * ranks on GPUs of compute capability major cc_major; 0 for a single rank (no communicator). */
static inline int64_t nccl_device_bytes(int world, int cc_major) {
    if (world <= 1) return 0;
    int64_t channels = cc_major >= 9 ? 32 : 16;
    int64_t max_ch = nccl_budget_env("NCCL_MAX_NCHANNELS", channels);
    if (max_ch < channels) channels = max_ch;
    const int64_t conns = world > 8 ? 4 : 2;
    const int64_t per_conn =
        nccl_budget_env("NCCL_BUFFSIZE", NCCL_BUDGET_SIMPLE) + NCCL_BUDGET_LL128 + NCCL_BUDGET_LL;
    int64_t bytes = NCCL_BUDGET_FIXED + channels * conns * per_conn;
    const char *nvls = getenv("NCCL_NVLS_ENABLE");
    if (cc_major >= 9 && !(nvls && strcmp(nvls, "0") == 0)) bytes += NCCL_BUDGET_NVLS;
    return bytes;
}

#endif
