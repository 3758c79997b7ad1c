/* rec_claims.c - the claims a job mounts, looked at before its gang's pods are made
 * (rec_internal.h, rec_claims_ready). A pod whose claim is missing or unbound cannot be scheduled,
 * and the scheduler's refusal reads like a GPU taken after planning: the job would re-plan and
 * make gangs forever. Asked first, the status names the claim and the field instead. */
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "operator/rec_internal.h"

#define REC_CLAIM_RECHECK_S 5.0 /* no watch of claims: a waiting job looks again this often */

typedef struct claim_ref {
    const char *field, *name;
} claim_ref;

/* The job's claims and the fields naming them; their count. */
static int job_claims(const job_spec *js, claim_ref *out) {
    int n = 0;
    if (js->data_pvc) out[n++] = (claim_ref){"spec.data.pvc", js->data_pvc};
    if (js->ckpt_pvc) out[n++] = (claim_ref){"spec.checkpoint.pvc", js->ckpt_pvc};
    if (js->model == JOB_MODEL_INIT_FROM && js->init.claim)
        out[n++] = (claim_ref){"spec.model.initFrom.volume.persistentVolumeClaim", js->init.claim};
    return n;
}

/* What is wrong with claim c, into why (reason and text), or nothing: 1 wrong, 0 fine, -1 API. */
static int claim_wrong(rec_ctx *x, const claim_ref *c, const char **reason, char *why, size_t n, err_t *err) {
    char path[KUBE_PATH_MAX];
    if (kube_path(path, sizeof path, "v1", x->job.ns, "persistentvolumeclaims", c->name, err) < 0) return -1;
    cJSON *pvc = NULL;
    long status = 0;
    err_t e;
    if (kube_get(x->k, path, &pvc, &status, &e) < 0) {
        if (status == 404) {
            *reason = "ClaimNotFound";
            snprintf(why, n, "PersistentVolumeClaim %s/%s (%s) does not exist: create it (e.g. "
                     "examples/k8s/storage.yaml); the worker pods wait for it", x->job.ns, c->name, c->field);
            return 1;
        }
        if (status == 403) { /* no permission to look: the scheduler will say */
            log_msg("debug", "%s: cannot read claim %s: %s", x->job.key, c->name, e.msg);
            return 0;
        }
        *err = e;
        return -1;
    }
    const char *ph = rec_claim_phase(pvc);
    int wrong = strcmp(ph, "Bound") != 0;
    if (wrong) {
        *reason = "ClaimNotBound";
        snprintf(why, n, "PersistentVolumeClaim %s/%s (%s) is %s, not Bound to a volume: no PersistentVolume "
                 "matches it, or its storage class provisions none yet; the worker pods wait for it",
                 x->job.ns, c->name, c->field, *ph ? ph : "without a phase");
    }
    cJSON_Delete(pvc);
    return wrong;
}

bool rec_waits_for_claim(const rec_status_view *st) {
    const rec_cond *c = rec_cond_find(st, "Admitted");
    return c && c->reason && !strncmp(c->reason, "Claim", 5);
}

int rec_claims_ready(rec_ctx *x, phase ph, err_t *err) {
    claim_ref claims[3];
    int n = job_claims(&x->job.js, claims);
    const char *reason = NULL;
    char why[700];
    for (int i = 0; i < n; i++) {
        int w = claim_wrong(x, &claims[i], &reason, why, sizeof why, err);
        if (w < 0) return -1;
        if (w == 0) continue;
        if (strcmp(x->job.old.message, why)) rec_emit(x->k, &x->job.meta, "Warning", reason, why);
        if (x->st) x->st->requeue_s = REC_CLAIM_RECHECK_S;
        return rec_status_write(x, ph, reason, why, err) < 0 ? -1 : 0;
    }
    return 1;
}
