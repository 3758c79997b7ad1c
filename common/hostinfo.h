/* hostinfo.h - what the planner and the profile cache need to know about this machine's CPUs. */
#ifndef CEPHALO_HOSTINFO_H
#define CEPHALO_HOSTINFO_H

#include <stddef.h>

/* The cores this process may run on (the online CPUs; at least 1). */
int host_cores(void);
/* The CPU's model name from /proc/cpuinfo ("model name", else "Model"/"cpu model"), spaces
 * squeezed, into buf; "unknown" when there is none. */
void host_cpu_model(char *buf, size_t n);

#endif
