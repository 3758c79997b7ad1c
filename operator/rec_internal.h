/* rec_internal.h - what the reconcile's files share (reconcile.h is the outside's view):
 *
 *   rec_view.c    the API's objects read once into typed views: the job's metadata and stored
 *                 status, its pods, the plan ConfigMap; the job's pods and the Nodes by name
 *   rec_status.c  the status's parts: phase, conditions, the plan summary, Events; written
 *   rec_pods.c    the objects: the plan ConfigMap, the Service, the worker pods (created at once
 *                 over several clients, assumed in the busy store), deletions, foreign objects
 *   rec_gpus.c    the GPUs a job may use (all, or the free ones), whether a plan fits them,
 *                 whether the plan's gang holds them already
 *   rec_gang.c    the gang: its pods sorted out against the plan, failures, disruptions, the
 *                 scheduler's refusals
 *   rec_phase.c   each phase's status: a job without a gang (suspended, failed to plan, waiting),
 *                 and a gang's (Planned, Running with progress, Restarting, Succeeded)
 *   rec_plan.c    planning: the inventory fingerprint, plan tasks on the planning pool, the plan
 *                 to run (the ConfigMap's, or a new one)
 *   rec_admit.c   admission: which GPUs a job is planned on, the queue (priority, creation),
 *                 Queued
 *   reconcile.c   rec_job: the flow of one reconcile, from the stores to the status
 *
 * Each file uses only those listed above it: no file circles (mk/circles.py).
 *
 * One reconcile is one rec_ctx, on one thread, its fields grouped by concern (job, stores, gpus,
 * plan, writes: each part says which files touch it). What it reads is read once, into typed
 * views: the spec (x->job.js, job_spec.h), plan.json (x->plan.view, plan_view.h), the metadata,
 * stored status, pods and plan ConfigMap (rec_view.c). Only rec_view.c reads the objects' fields
 * as JSON, so that a field's name, default and type are in one place; what the reconcile writes
 * (the ConfigMap, the Service, pods, patches, the status) is built as JSON. */
#ifndef CEPHALO_REC_INTERNAL_H
#define CEPHALO_REC_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/err.h"
#include "common/str_map.h"
#include "operator/client/cache.h"
#include "operator/inventory.h"
#include "operator/job_spec.h"
#include "operator/client/kube.h"
#include "operator/phase.h"
#include "operator/plan_view.h"
#include "operator/planning.h"
#include "operator/reconcile.h"
#include "planner/cluster.h"

#define REC_ASSUMED_RV "0"       /* an assumed pod's resourceVersion: older than any the API gives */
#define REC_BLAME_SETTLE_S 3.0   /* how long a failure's blame waits for the rest of its gang */
#define REC_BLAME_TIE_S 1.0      /* finishedAt stamps this close are a tie (whole seconds) */
#define REC_PROGRESS_S 5.0       /* seconds between progress reads of a running job */
#define REC_PROGRESS_MAX_S 60.0  /* ... and at most between reads of workers that do not answer */
#define REC_OUTSIDE_S 30.0       /* a job failed on a ConfigMap no watch follows reads it again this often */
#define REC_UNSCHED_FIRST_S 5.0  /* the first refusal's wait before the next gang; doubled per refusal */
#define REC_UNSCHED_MAX_S 300.0
/* The wait before the gang after a failure: first_s when the previous failure waited prev_s = 0
 * (none) or the gang since ran ran_s >= 2 max_s; else twice prev_s, at most max_s. */
double rec_restart_backoff(double prev_s, double ran_s, double first_s, double max_s);

/* A member of an API object: a list's items, an object of the stores. Fields are read by
 * rec_view.c into the views below, once a reconcile. */
static inline const cJSON *get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

/* ---- rec_view.c: the API's objects read once into typed views ---- */

/* A CephaloJob's metadata. */
typedef struct rec_job_meta {
    const char *ns, *name;  /* "" when absent */
    const char *uid, *created; /* metadata.uid, .creationTimestamp; NULL when absent */
    double gen;             /* metadata.generation */
    bool deleting;          /* metadata.deletionTimestamp is set */
} rec_job_meta;

/* A condition of a stored status. */
typedef struct rec_cond {
    const cJSON *obj;                  /* as stored: kept verbatim where a status keeps it */
    const char *type, *status;         /* "" when absent */
    const char *reason, *message, *ltt; /* lastTransitionTime; NULL when absent */
} rec_cond;

/* A counter the status keeps from one write to the next (step, loss...): have, when it is there. */
typedef struct rec_kept {
    bool have;
    double v;
} rec_kept;

/* A job's stored status: what a reconcile reads of it, read once (rec_status_read). */
typedef struct rec_status_view {
    const cJSON *obj;       /* the status, or NULL */
    phase phase;            /* PHASE_NONE: none yet */
    const char *message;    /* "" when absent */
    double restarts, replans;
    int attempt;            /* the gang attempt */
    rec_kept step, ckpt_step, samples_per_s, loss; /* step, lastCheckpointStep, samplesPerSecond, loss */
    rec_kept backoff_s;     /* restartBackoffSeconds: the last failure's wait before its gang */
    const char *start_time, *completion_time, *progress_time; /* NULL when absent */
    const char *last_restart_time, *next_restart_time; /* lastRestartTime, nextRestartTime; NULL */
    const cJSON *plan;      /* status.plan as stored (a re-planned live job keeps it), or NULL */
    const char *plan_id;    /* status.plan.id; NULL when absent */
    const char *plan_profile; /* status.plan.profile; "" when absent */
    bool plan_estimated;
    rec_cond *conds;        /* [n_conds], in their order */
    int n_conds;
} rec_status_view;

/* A pod, read once per reconcile (rec_pods_read). */
typedef struct rec_pod {
    const cJSON *obj;          /* the pod (inventory.h's node matching reads it) */
    const char *name, *ns, *job; /* metadata.name, .namespace, the job label; "" when absent */
    const char *rank;          /* the rank label; NULL when absent */
    const char *plan_id, *attempt; /* its plan id and gang attempt annotations; "" when absent */
    const char *owner_uid;     /* its controller CephaloJob's uid ("" without one); NULL: none */
    phase phase;               /* Pending until the API says otherwise */
    const char *node;          /* spec.nodeName; NULL: not bound */
    const char *ip;            /* status.podIP; NULL */
    bool deleting;             /* metadata.deletionTimestamp is set ... */
    const char *deletion;      /* ... to this time (NULL when not a string) */
    const char *reason, *message; /* status.reason, .message (an eviction); NULL */
    const char *wait_reason, *wait_message; /* its container waits for a reason worth reporting (not
                                             * plain creation: ImagePullBackOff...); NULL */
    bool terminated;           /* its container ended: */
    double exit_code;          /* exitCode, -1 when absent */
    const char *finished_at, *term_reason, *term_message; /* NULL when absent */
    bool unschedulable;        /* not bound, PodScheduled False with reason Unschedulable */
    const char *sched_message; /* PodScheduled's message; NULL */
} rec_pod;

/* The plan ConfigMap. */
typedef struct rec_cm_view {
    const cJSON *obj;       /* the ConfigMap, or NULL */
    const char *plan_json;  /* data["plan.json"]; NULL when absent */
    const char *generation, *inventory, *plan_id, *notes; /* annotations; "" when absent */
    const char *planned_at, *unschedulable; /* annotations; NULL when absent */
} rec_cm_view;

void rec_job_meta_read(const cJSON *job, rec_job_meta *m);
/* Whether obj (a pod, Service, ConfigMap) is the job's: its controller owner is the job, or it has
 * none of kind CephaloJob. */
bool rec_owned_by_job(const cJSON *obj, const rec_job_meta *job);
void rec_status_read(const cJSON *status, rec_status_view *v);
/* A CephaloJob of the store read whole: its metadata, stored status and spec. job_spec_parse's
 * return (-1 with err set for a spec with a mistake, whose fields then hold the defaults). */
int rec_job_read(const cJSON *job, rec_job_meta *m, rec_status_view *st, job_spec *js, err_t *err);
/* A list's (PodList, NodeList, CephaloJobList) items, to iterate with cJSON_ArrayForEach. */
const cJSON *rec_items(const cJSON *list);
/* A ConfigMap's data: its keys and string values, to iterate with cJSON_ArrayForEach. */
const cJSON *rec_cm_data(const cJSON *cm);
/* A PersistentVolumeClaim's status.phase ("Bound", "Pending", "Lost"), or "" without one. */
const char *rec_claim_phase(const cJSON *pvc);
/* A job's status object as the API returned it (NULL without one): compared whole before a write. */
const cJSON *rec_job_status(const cJSON *job);
void rec_status_view_free(rec_status_view *v);
/* The first condition of a type, or NULL; whether one is there and True. */
const rec_cond *rec_cond_find(const rec_status_view *v, const char *type);
bool rec_cond_true(const rec_cond *c);
/* Terminal: Succeeded, or Failed after the backoff limit. */
bool rec_terminal(const rec_status_view *v);
void rec_pod_read(const cJSON *pod, rec_pod *p);
/* A PodList's items as views ([*n], the caller frees it). */
rec_pod *rec_pods_read(const cJSON *list, int *n);
bool rec_pod_owned(const rec_pod *p, const rec_job_meta *job);
void rec_cm_read(const cJSON *cm, rec_cm_view *v);

/* A job's usable GPUs as inv_build finds them without the maxGPUs cap, built at most once per
 * reconcile from the stores' snapshot: each view a reconcile asks about (capped or not, every GPU
 * or the free ones) comes from one of two, since inv_build's cap keeps the first maxGPUs devices.
 * An admission used to build the 300-node inventory four times under the admission lock. */
typedef struct job_inv {
    bool built;
    int rc; /* rec_job_cluster's: -1 with err set when no GPU is usable */
    cluster cl;
    inv_result r;
    err_t err;
} job_inv;

/* The job a reconcile is about: who it is, its spec and its stored status, read once by
 * reconcile.c (read_job); every step reads it. attempt is the one field the steps change (a
 * restart or a queued gang's end bumps it: rec_gang.c, rec_admit.c). */
typedef struct rec_job_part {
    const char *ns, *name;
    char key[PLANNING_KEY_MAX]; /* namespace/name: the job's task in the planning pool */
    char path[KUBE_PATH_MAX];   /* the job's API path (its status is written there) */
    char cm_name[128];          /* its plan ConfigMap's name, NAME-plan ("" for a name too long) */
    cJSON *obj;                 /* the CephaloJob, a copy from the store */
    rec_job_meta meta;
    job_spec js;                /* the spec, read once */
    int js_rc;                  /* job_spec_parse's: -1 with js_err, which planning reports (InvalidSpec) */
    err_t js_err;
    rec_status_view old;        /* the stored status */
    int attempt;                /* the gang attempt: status.attempt, until a step bumps it */
} rec_job_part;

/* What the watches' stores hold, read once per reconcile (reconcile.c read_stores; the views by
 * rec_view.c); read-only. The nodes and busy pods are rec_gpus.c's (the free GPUs); the job's pods
 * are sorted out by rec_gang.c, counted by rec_gpus.c, rec_admit.c and rec_phase.c, deleted by
 * rec_pods.c; the ConfigMap is rec_plan.c's (its plan) and rec_gang.c's (the refusals' count);
 * rec_pods.c sets have_service (rec_clear_foreign). */
typedef struct rec_stores_part {
    cJSON *nodes;     /* NodeList (a view of the store) */
    str_map node_at;  /* the nodes by name (rec_find_node builds it on first use) */
    const cJSON **node_by;
    cJSON *pods;      /* PodList of the job's pods (label cephalo.dev/job; a view) ... */
    rec_pod *pod;     /* ... [n_pods]: its items read */
    int n_pods;
    cJSON *busy;      /* PodList of the pods that may hold GPUs: not terminal, every namespace (a view) */
    cache_view nodes_view, pods_view, busy_view;
    cJSON *cm;        /* the plan ConfigMap (a copy), or NULL ... */
    rec_cm_view cmv;  /* ... read */
    bool have_service; /* the job's Service exists (and is the job's) */
} rec_stores_part;

/* Which GPUs the job is planned and admitted on: rec_gpus.c builds the inventories, rec_admit.c
 * chooses the view (rec_choose_view) and holds the admission lock; rec_plan.c plans on them. */
typedef struct rec_gpus_part {
    job_inv inv_all, inv_free; /* the job's usable GPUs, no maxGPUs cap: all, and the free ones (rec_inv) */
    bool on_free; /* what the job is planned on: its free GPUs; false: all of them, while too few are free */
    int cap;      /* spec.gpus.maxGPUs; 0: no cap */
    int picked;   /* free GPUs the job would take now (at most maxGPUs) */
    int need;     /* GPUs it needs to start: spec.gpus.minGPUs, else its whole plan */
    bool admitting; /* holds the admission lock (rec_admit_lock) */
} rec_gpus_part;

/* The plan to run: rec_plan.c sets it (the ConfigMap's, or a new one); rec_admit.c, rec_pods.c,
 * rec_gang.c, rec_status.c and rec_phase.c read it. */
typedef struct rec_plan_part {
    plan_view view;  /* plan.json, read once (view.world 0: none yet) */
    char id[64];     /* its id: pods carry it */
    char notes[1024], profile[600];
    bool estimated;
    char why[600];   /* set when this reconcile re-planned: why the gang restarts */
    /* a new plan decided under the admission lock, written after it (rec_commit_plan, rec_pods.c):
     * the ConfigMap and the Planned/Replanned Event are API calls other admissions need not wait for */
    struct {
        char *json; /* plan.json; NULL: nothing to write */
        char gen[32], fp[64];
        bool forget; /* the planning pool keeps the task until the ConfigMap has the plan */
        const char *ev_reason; /* NULL: no Event */
        char ev[512];
    } fresh;
} rec_plan_part;

/* The writes beyond the status (rec_pods.c): clients to create a gang's pods at once, the pods
 * assumed in the busy store, the side thread of a new job's objects. */
typedef struct rec_writes_part {
    kube_client *const *helpers; /* more clients, for creating a gang's pods at once */
    int n_helpers;
    char (*assumed)[128]; /* pods put into the busy store before their creation (rec_assume_pods) */
    int n_assumed;
    struct { /* rec_side_writes_start */
        pthread_t th;
        bool started, service;
        kube_client *k;
        int rc;
        err_t err;
    } side;
} rec_writes_part;

/* What one reconcile works on, by concern. */
typedef struct rec_ctx {
    kube_client *k;      /* the reconcile's client */
    const rec_config *c; /* the operator's configuration and stores */
    rec_stats *st;       /* its counters (NULL: none) */
    rec_job_part job;
    rec_stores_part stores;
    rec_gpus_part gpus;
    rec_plan_part plan;
    rec_writes_part writes;
} rec_ctx;

/* ---- rec_view.c (the stores) ---- */

/* The job's pods of the pod store (its label, its namespace). */
cJSON *rec_job_pods(rec_ctx *x, cache_view *v);
/* The Node of x->stores.nodes named name, or NULL: by a map of the names, built once a reconcile (a gang's
 * pods and the job's pods each look up their node: not a scan of the nodes for each). */
const cJSON *rec_find_node(rec_ctx *x, const char *name);

/* Whether failed pod a is to be blamed before failed pod b: it ended first (stamps within
 * REC_BLAME_TIE_S are a tie), and on a tie a death by signal before an exit the worker chose. */
bool rec_blame_earlier(const rec_pod *a, const rec_pod *b);

/* The pods of the job sorted out against the current plan and gang attempt (rec_gang_read). */
typedef struct gang {
    int world;
    const rec_pod **pod; /* [world]: the current gang's pod of each rank (of the context's), or NULL */
    int stale; /* pods of an older plan or attempt */
    int pending, running, succeeded, failed, missing;
    const rec_pod *first_failed;
    const rec_pod *first_stuck; /* a pending pod whose container waits for a reason (ImagePullBackOff...) */
    const rec_pod *disrupted; /* a pod of the gang being deleted by someone else (eviction, drain, by hand) */
    const rec_pod *unschedulable; /* a pod of the gang the scheduler cannot place (its GPU was taken) */
    int failed_hard; /* failed pods that were not stopped on request (EXIT_STOPPED) */
} gang;

/* ---- rec_gpus.c ---- */

/* The job's usable GPUs (spec.gpus filters) among the nodes of the store's view (with their
 * digests when the store makes them); with pods (PodList items of every namespace) or their
 * digests (held), the free ones only: less those the pods hold, but the pods of the job own_uid.
 * 0, or -1 with the error set (no usable GPU: the error says why). */
int rec_job_cluster(const rec_config *rc, const rec_stores_part *st, const job_spec *js, const cJSON *pods,
                    const inv_held *const *held, int n_held, const char *own_uid, cluster *cl, inv_result *inv,
                    err_t *err);
/* The job's usable GPUs for this reconcile, no maxGPUs cap; free_only: less those that the pods
 * of x->stores.busy hold for others. Built once. */
const job_inv *rec_inv(rec_ctx *x, bool free_only);
/* How many devices of j a view with cap `cap` (0: none) holds. */
int rec_inv_devices(const job_inv *j, int cap);
/* Whether every rank of the plan has a free GPU on its node. */
bool rec_plan_fits(rec_ctx *x, const plan_view *pv);
/* Whether a pod of plan_id's current gang has ended (it must be seen through on that plan). */
bool rec_gang_ended(const rec_ctx *x, const char *plan_id);
/* How many pods of plan_id's current gang exist, none ended or being deleted; else 0. */
int rec_gang_started(const rec_ctx *x, const char *plan_id);

/* ---- rec_plan.c ---- */

/* The plan to run into x->plan.view: 1; 0 when the job cannot be planned (status Failed written)
 * or is being planned; -1 on an API error. */
int rec_current_plan(rec_ctx *x, err_t *err);
/* plan.json (the ConfigMap's, or a new plan's) into x->plan.view: 0, or -1 with err naming the field. */
int rec_plan_read(rec_ctx *x, const char *plan_json, err_t *err);
/* Drops the job's planning, if any (cancelled when it runs): the job is gone, finished, suspended. */
void rec_forget_plan(const rec_ctx *x);

/* ---- rec_admit.c ---- */

void rec_admit_lock(rec_ctx *x);
void rec_admit_unlock(rec_ctx *x); /* nothing when x does not hold it */
/* Which GPUs the job is planned on (x->gpus.on_free, x->gpus.cap, x->gpus.picked, x->gpus.need): 1; 0 when it can
 * never start (Failed, written); -1 on an API error. */
int rec_choose_view(rec_ctx *x, err_t *err);
/* May the planned gang run? 1 admitted; 0 queued (status written); -1 on an API error. */
int rec_admit(rec_ctx *x, err_t *err);

/* ---- rec_pods.c ---- */

int rec_delete_pods(rec_ctx *x, const rec_pod *pods, int n, bool keep_finished, err_t *err);
/* Objects of an earlier job of the same name deleted: 1 when there were some, 0, -1 (API). */
int rec_clear_foreign(rec_ctx *x, err_t *err);
void rec_assume_pods(rec_ctx *x);
void rec_forget_assumed(rec_ctx *x);
/* Keeps the pods x assumed in the busy store after x ends, until the job's next reconcile that
 * ends without an error (rec_release_held): a gang another leader left half created holds the
 * GPUs of its missing ranks from the moment this leader starts (rec_hold_partial_gangs). */
void rec_hold_assumed(rec_ctx *x);
void rec_release_held(const rec_ctx *x);
int rec_create_pods(rec_ctx *x, gang *g, err_t *err);
/* Before a gang's pods are made (a new job: before it is admitted): every claim the job mounts
 * (spec.data.pvc, spec.checkpoint.pvc, spec.model.initFrom's claim) exists and is Bound. 1 yes
 * (or they cannot be read: 403, left to the scheduler); 0 one is missing or unbound, said by name
 * in the status (phase ph: Queued for a job not admitted, which then holds no place in the queue,
 * else Restarting; reason ClaimNotFound or ClaimNotBound; a Warning Event when the message is
 * new), looked at again in REC_CLAIM_RECHECK_S; -1 on an API error. rec_claims.c. */
int rec_claims_ready(rec_ctx *x, phase ph, err_t *err);
/* Whether a job's status says it waits for a claim (rec_claims_ready): not a job ahead in the queue. */
bool rec_waits_for_claim(const rec_status_view *st);
/* The plan ConfigMap (x->plan.fresh) and its Event, when a new plan was made. */
int rec_commit_plan(rec_ctx *x, kube_client *k, err_t *err);
int rec_side_writes_start(rec_ctx *x, err_t *err);
int rec_side_writes_join(rec_ctx *x, int rc, err_t *err);
/* Merge-patches annotations of the plan ConfigMap (value NULL removes one). */
int rec_patch_cm_annotation(rec_ctx *x, const char *key, const char *value, err_t *err);

/* ---- rec_gang.c ---- */

int rec_gang_read(rec_ctx *x, gang *g, err_t *err);
void rec_gang_free(gang *g);
/* What the gang's pods call for: 1 when its missing pods are to be created and its status
 * written (rec_gang_status); else done, rc in *rc (the status written, or an API error). */
int rec_gang_decide(rec_ctx *x, gang *g, int *rc, err_t *err);
/* A gang runs: the scheduler's refusals in a row are forgotten (the next one waits the first wait). */
void rec_unsched_clear(rec_ctx *x);

/* ---- rec_status.c ---- */

void rec_emit(kube_client *k, const rec_job_meta *job, const char *type, const char *reason, const char *msg);
/* A condition of type into conds; its lastTransitionTime kept from the stored status's while its
 * status stays. */
void rec_condition(const rec_ctx *x, cJSON *conds, const char *type, bool ok, const char *reason, const char *message);
/* The status fields every phase carries: counters, times, progress; *conds (when not NULL) is
 * its conditions array, for rec_condition. */
cJSON *rec_status_base(rec_ctx *x, phase ph, const char *msg, cJSON **conds);
/* status.samplesPerSecond = rate, and samplesPerSecondText its one-decimal text (the SAMPLES/S
 * column), replacing what s had. */
void rec_status_rate(cJSON *s, double rate);
void rec_status_plan(rec_ctx *x, cJSON *s);
void rec_status_conditions(rec_ctx *x, cJSON *conds, phase ph, const char *reason, const char *msg);
/* Writes the status (taking it) unless the store has it already. */
int rec_write_status(rec_ctx *x, cJSON *status, err_t *err);
/* A status of phase ph with the plan and conditions, written. */
int rec_status_write(rec_ctx *x, phase ph, const char *reason, const char *msg, err_t *err);

/* ---- rec_phase.c ---- */

int rec_suspend_job(rec_ctx *x, err_t *err);
/* Waiting for the objects of an earlier job of the same name to go. */
int rec_wait_foreign(rec_ctx *x, err_t *err);
/* The job cannot be planned: phase Failed with the reason, no pods. */
int rec_plan_failed(rec_ctx *x, const char *reason, const char *why, err_t *err);
/* The gang's status once its pods exist (or are being created): Planned, Running, Restarting,
 * Succeeded, with progress while Running. */
int rec_gang_status(rec_ctx *x, const gang *g, err_t *err);
/* The pods could not be created: said in the status (best effort), the error kept. */
void rec_pods_not_created(rec_ctx *x, const err_t *why);

#endif
