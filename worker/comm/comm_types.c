/* comm_types.c - the collectives' operations by name and their element types by size
 * (comm_internal.h). A file of their own, under comm.c and the backends alike: comm.c reaches the
 * backends through their tables, and a backend that called back into comm.c for these would make
 * the two one piece. */
#include "comm/comm_internal.h"

const char *comm_op_name(comm_op op) {
    static const char *const names[] = {"allgatherv", "reduce-scatterv", "allreduce", "broadcast", "barrier"};
    return names[op];
}

size_t comm_dtype_size(comm_dtype t) {
    return t == COMM_BF16 || t == COMM_F16 ? 2 : t == COMM_F32 ? 4 : 8;
}
