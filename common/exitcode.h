/* exitcode.h - the exit statuses of every program (cephalo, cephalo-worker, cephalo-operator),
 * one enum for all (docs/architecture.md, "Exit statuses"): a launcher reads a worker's status by
 * these names (cli/run.c, operator/rec_gang.c), and a program's own status uses the same ones.
 * EXIT_SUCCESS and EXIT_FAILURE (stdlib) are 0 and 1: EXIT_OK and EXIT_FAILED say which. */
#ifndef CEPHALO_EXITCODE_H
#define CEPHALO_EXITCODE_H

enum {
    EXIT_OK = 0,
    EXIT_FAILED = 1,        /* a failure while running: a peer died or stalled, a write failed, the
                               loss diverged, a worker of `cephalo run` failed */
    EXIT_BAD_INPUT = 2,     /* bad options, files, plan, data, checkpoint or environment, refused
                               before any work (common/args.h's ARGS_BAD) */
    EXIT_INFEASIBLE = 3,    /* cephalo plan, compare, run: no plan fits the devices' memory */
    EXIT_INTERRUPTED = 130, /* 128 + SIGINT: `cephalo run` interrupted; its workers stopped */
    EXIT_STOPPED = 143      /* 128 + SIGTERM: a worker stopped on request, its last step
                               checkpointed on every rank */
};

#endif
