/* phase.h - the phases the operator reads and writes: a CephaloJob's status.phase (the CRD's enum:
 * Created ... Suspended) and a Pod's status.phase (core/v1: Pending ... Unknown), in one enum
 * because they share names (Running, Succeeded, Failed) and are compared the same way: parsed once
 * from the object, then switched on, never compared as text.
 *
 *   phase p = phase_parse(get_str(status, "phase", NULL));   // PHASE_NONE when absent or unknown
 *   if (phase_live(p)) ...
 *   cJSON_AddStringToObject(s, "phase", phase_name(PHASE_QUEUED)); */
#ifndef CEPHALO_PHASE_H
#define CEPHALO_PHASE_H

#include <stdbool.h>

typedef enum {
    PHASE_NONE, /* no phase yet (a new job), or a name this operator does not know */
    /* a CephaloJob's (docs/operator.md, "Reconcile") */
    PHASE_CREATED,
    PHASE_QUEUED,
    PHASE_PLANNED,
    PHASE_RUNNING, /* also a Pod's */
    PHASE_RESTARTING,
    PHASE_SUCCEEDED, /* also a Pod's */
    PHASE_FAILED,    /* also a Pod's */
    PHASE_SUSPENDED,
    /* a Pod's only */
    PHASE_PENDING,
    PHASE_UNKNOWN,
    PHASE_COUNT
} phase;

/* The name as the API spells it ("Queued"); "" for PHASE_NONE. */
const char *phase_name(phase p);
/* The phase of a name; PHASE_NONE for NULL, "" or a name not in the table. */
phase phase_parse(const char *name);

/* A job whose gang exists or is being started on its plan: Planned, Running, Restarting. */
bool phase_live(phase p);
/* A pod that ended: Succeeded or Failed. */
bool phase_finished(phase p);

#endif
