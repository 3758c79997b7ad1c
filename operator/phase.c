/* phase.c - job and pod phases (phase.h). */
#include "operator/phase.h"

#include <string.h>

/* The one name table: the CRD's status.phase enum (crds/) and core/v1's pod phases. */
static const char *const phase_names[PHASE_COUNT] = {
    [PHASE_NONE] = "",
    [PHASE_CREATED] = "Created",
    [PHASE_QUEUED] = "Queued",
    [PHASE_PLANNED] = "Planned",
    [PHASE_RUNNING] = "Running",
    [PHASE_RESTARTING] = "Restarting",
    [PHASE_SUCCEEDED] = "Succeeded",
    [PHASE_FAILED] = "Failed",
    [PHASE_SUSPENDED] = "Suspended",
    [PHASE_PENDING] = "Pending",
    [PHASE_UNKNOWN] = "Unknown",
};

const char *phase_name(phase p) { return p >= 0 && p < PHASE_COUNT ? phase_names[p] : ""; }

phase phase_parse(const char *name) {
    if (!name || !*name) return PHASE_NONE;
    for (int p = PHASE_NONE + 1; p < PHASE_COUNT; p++)
        if (!strcmp(phase_names[p], name)) return (phase)p;
    return PHASE_NONE;
}

bool phase_live(phase p) { return p == PHASE_PLANNED || p == PHASE_RUNNING || p == PHASE_RESTARTING; }

bool phase_finished(phase p) { return p == PHASE_SUCCEEDED || p == PHASE_FAILED; }
