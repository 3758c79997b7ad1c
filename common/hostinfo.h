/* hostinfo.h - what the planner and the profile cache need to know about this machine's CPUs. */
#ifndef CEPHALO_HOSTINFO_H
#define CEPHALO_HOSTINFO_H

#include <stddef.h>
#include <stdint.h>

/* The cores this process may run on (the online CPUs; at least 1). */
int host_cores(void);
/* The CPU's model name from /proc/cpuinfo ("model name", else "Model"/"cpu model"), spaces
 * squeezed, into buf; "unknown" when there is none. */
void host_cpu_model(char *buf, size_t n);

/* The memory this process may use, in bytes: the machine's physical memory, or less when its
 * cgroup (a container's memory limit: cgroup v2 memory.max, v1 memory.limit_in_bytes) says so.
 * A worker pod past its limit is OOM-killed, so this, not the node's memory, bounds what the host
 * offload pool may take. 0 when nothing is known. */
int64_t host_memory_bytes(void);

#endif
