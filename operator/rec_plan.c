/* rec_plan.c - a job's plan (rec_internal.h): the usable GPUs and their fingerprint, what a plan is
 * made from (read on the reconcile's thread), the plan made on the planning pool, and the plan
 * to run: the ConfigMap's while it holds, else a new one. The usable GPUs themselves are
 * rec_gpus.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json_util.h"
#include "common/log.h"
#include "common/strutil.h"
#include "operator/model_source.h"
#include "operator/pod_template.h"
#include "operator/rec_internal.h"
#include "planner/inputs.h"
#include "planner/model.h"
#include "planner/plan.h"
#include "planner/profile_store.h"

#define REC_PLAN_WAIT_S 0.25 /* how long the loop waits for a new plan before it moves on */

/* ---- the inventory fingerprint -------------------------------------------------------------- */

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}
#define FNV_OFFSET 0xcbf29ce484222325ULL

/* A fingerprint of the job's usable GPUs (node, type and memory of each, in rank order: the first
 * `cap` of j): when it changes, the job is planned again. "none" when no GPU is usable. */
static void inventory_fingerprint(const job_inv *j, int cap, char *out, size_t n) {
    if (j->rc < 0) {
        snprintf(out, n, "none");
        return;
    }
    int nd = rec_inv_devices(j, cap);
    uint64_t h = FNV_OFFSET;
    for (int i = 0; i < nd; i++) {
        char line[160];
        int len = snprintf(line, sizeof line, "%s\t%s\t%.0f\n", j->cl.nodes[j->cl.devices[i].node].name,
                           j->cl.devices[i].type, j->cl.devices[i].memory_bytes);
        h = fnv1a(h, line, (size_t)len);
    }
    snprintf(out, n, "%d-%016llx", nd, (unsigned long long)h);
}

/* The plan id: the generation it was made for and a hash of plan.json. Pods carry it. */
static void plan_id_of(double gen, const char *plan_json, char *out, size_t n) {
    uint64_t h = fnv1a(FNV_OFFSET, plan_json, strlen(plan_json));
    snprintf(out, n, "g%.0f-%08llx", gen, (unsigned long long)(h & 0xffffffffULL));
}

/* ---- what a plan is made from ---------------------------------------------------------------- */

typedef struct plan_out {
    char *json; /* plan.json text */
    bool estimated;
    char notes[1024];
    char profile[600]; /* where measured costs came from ("ConfigMap ns/name"), or "" */
    int measured_groups, groups; /* device groups with measured costs, of all */
    const char *reason; /* on failure: the condition reason */
} plan_out;

/* One plan to make: what it is made from, read on the reconcile loop (plan_prepare), and what a
 * planning thread made of it (plan_solve; planning.h). */
typedef struct plan_task {
    plan_inputs in;
    bool have_inputs; /* in holds allocations (plan_solve frees them as soon as it is done) */
    inputs_opts o;
    strategy strat;
    double budget_s; /* --plan-timeout */
    char profile_rv[64]; /* resourceVersion of the profile ConfigMap used, "" for none */
    int rc; /* the result: 0 with out.json, or -1 with out.reason and msg */
    bool outside; /* failed on an object no watch follows (an initFrom or profile ConfigMap) */
    plan_out out;
    char msg[sizeof(err_t)];
} plan_task;

static void plan_task_free(void *task) {
    plan_task *t = task;
    if (!t) return;
    if (t->have_inputs) inputs_free(&t->in);
    free(t->out.json);
    free(t);
}

/* spec.model.name or .inline as a model. Built-in names only: a name must never read a file on
 * the operator's filesystem. */
static int resolve_model(const job_spec *js, model_spec *m, err_t *err) {
    if (js->model == JOB_MODEL_INLINE) {
        char *text = cJSON_PrintUnformatted(js->model_inline);
        if (!text) return err_set(err, "out of memory");
        int rc = model_load_string("spec.model.inline", text, strlen(text), m, err);
        free(text);
        return rc;
    }
    int n;
    const model_spec *b = model_builtins(&n);
    for (int i = 0; i < n; i++)
        if (strcmp(b[i].name, js->model_name) == 0) return model_resolve(js->model_name, m, err);
    return model_unknown(js->model_name, err);
}

/* The model to plan: a Hugging Face directory's config.json (model_source.h), a built-in, or
 * inline. 0; -1 with err set (the job's problem); -2 on an API error. */
static int plan_model(kube_client *k, const rec_ctx *x, model_spec *m, err_t *err) {
    if (x->job.js.model == JOB_MODEL_INIT_FROM) return msrc_model(k, x->job.ns, &x->job.js.init, m, err);
    return resolve_model(&x->job.js, m, err) < 0 ? err_prefix(err, "model") : 0;
}

/* The profile ConfigMap of a job: spec.profileConfigMap in its namespace, else the operator's
 * --profile-configmap. false: none. */
static int profile_cm(const rec_ctx *x, char *ns, char *name, size_t n, err_t *err) {
    const char *def = x->c->profile_cm, *slash = def ? strchr(def, '/') : NULL;
    /* a cut name would read another ConfigMap; a namespace is at most 63 */
    if (x->job.js.profile_cm) {
        snprintf(ns, n, "%s", x->job.ns);
        if (str_fmt(name, n, err, "spec.profileConfigMap", "%s", x->job.js.profile_cm) < 0) return -1;
    } else if (slash) {
        if (str_fmt(ns, n, err, "--profile-configmap: the namespace", "%.*s", (int)(slash - def), def) < 0 ||
            str_fmt(name, n, err, "--profile-configmap: the name", "%s", slash + 1) < 0)
            return -1;
    }
    return x->job.js.profile_cm || slash;
}

/* Every data key ending in ".json" of cm, merged into in->prof. 0 (files: how many), or -1 with
 * err set. */
static int merge_profiles(const cJSON *cm, const char *ns, const char *name, plan_inputs *in, int *files,
                          err_t *err) {
    const cJSON *item;
    *files = 0;
    cJSON_ArrayForEach(item, rec_cm_data(cm)) {
        size_t kl = strlen(item->string);
        if (!cJSON_IsString(item) || kl < 5 || strcmp(item->string + kl - 5, ".json") != 0) continue;
        char src[600];
        snprintf(src, sizeof src, "ConfigMap %s/%s key %s", ns, name, item->string);
        profile p;
        if (profile_load_string(src, item->valuestring, strlen(item->valuestring), &p, err) < 0) {
            if (*files) profile_free(&in->prof);
            return -1;
        }
        if ((*files)++ == 0) {
            in->prof = p;
        } else {
            profile_merge(&in->prof, &p);
            profile_free(&p);
        }
    }
    return 0;
}

/* The merged profiles must cover the job's model: the job's own ConfigMap must (else -1 with err
 * set), the operator's default one is dropped (estimates). */
static int profile_cover(plan_inputs *in, bool own, const char *ns, const char *name, err_t *err) {
    int rc = 0;
    in->have_prof = true;
    snprintf(in->prof_source, sizeof in->prof_source, "ConfigMap %s/%s", ns, name);
    if (profile_has_model(&in->prof, in->model.name)) return 0;
    char models[512];
    profile_models(&in->prof, models, sizeof models);
    if (own)
        rc = err_set(err, "spec.profileConfigMap: ConfigMap %s/%s has no profile of model %s "
                          "(it has: %s); run `cephalo profile --model %s` on the GPUs",
                     ns, name, in->model.name, models, in->model.name);
    profile_free(&in->prof);
    in->have_prof = false;
    return rc;
}

/* Profiles from a ConfigMap (docs/operator.md, Profiles): every data key ending in ".json" is a
 * profile file as `cephalo profile -o` writes it; they are merged. A missing default ConfigMap,
 * or one without the job's model, means estimates; the job's own must exist and have the model.
 * rv gets the ConfigMap's resourceVersion ("" without one): a changed profile is planned anew.
 * 0 (in->have_prof says whether one was loaded), -1 with err set (the job's problem), or -2 with
 * err set (an API error). */
static int load_profiles(kube_client *k, const rec_ctx *x, plan_inputs *in, char *rv, size_t rvn, err_t *err) {
    char ns[256], name[256], path[KUBE_PATH_MAX];
    bool own = x->job.js.profile_cm != NULL;
    int have = profile_cm(x, ns, name, sizeof ns, err);
    if (have <= 0) return have;
    cJSON *cm = NULL;
    long status = 0;
    if (kube_path(path, sizeof path, "v1", ns, "configmaps", name, err) < 0) return own ? -1 : 0;
    if (kube_get(k, path, &cm, &status, err) < 0) {
        if (status != 404) return -2;
        return own ? err_set(err, "spec.profileConfigMap: ConfigMap %s/%s not found", ns, name) : 0;
    }
    /* it joins the plan's id: a cut one could hide a changed profile */
    const char *cm_rv = kube_meta_str(cm, "resourceVersion");
    if (str_fmt(rv, rvn, err, "the profile ConfigMap's resourceVersion", "%s", cm_rv ? cm_rv : "") < 0) {
        cJSON_Delete(cm);
        return -2;
    }
    int files = 0, rc = merge_profiles(cm, ns, name, in, &files, err);
    cJSON_Delete(cm);
    if (rc < 0) return -1;
    if (files) return profile_cover(in, own, ns, name, err);
    if (own)
        return err_set(err, "spec.profileConfigMap: ConfigMap %s/%s has no key ending in .json "
                            "(expected profile files written by `cephalo profile -o`)", ns, name);
    return 0;
}

/* The cluster and the planner's options: the GPUs of the view, the spec's batch, sequence,
 * memory cap and precision. 0, or -1 with t->out.reason and err set. */
static int plan_inputs_of(const rec_ctx *x, const job_inv *gpus, int cap, plan_task *t, err_t *err) {
    plan_out *out = &t->out;
    if (gpus->rc < 0) {
        *err = gpus->err;
        out->reason = "NoGPUs";
        return -1;
    }
    if (cluster_copy(&gpus->cl, cap, &t->in.cl) < 0) return err_set(err, "out of memory");
    t->have_inputs = true;
    out->estimated = gpus->r.estimated;
    snprintf(out->notes, sizeof out->notes, "%s", gpus->r.notes);
    t->strat = x->job.js.strat;
    t->o = (inputs_opts){.batch = x->job.js.global_batch, .seq = x->job.js.seq_len, .mem_cap = x->job.js.mem_cap,
                         .prec = x->job.js.train.prec, .recompute = x->job.js.recompute, .no_store = true,
                         .host_bytes = pod_template_memory_limit(x->job.js.pod_template)};
    if (cluster_check_precision(&t->in.cl, t->o.prec, "spec.precision", err) < 0) {
        out->reason = "UnsupportedPrecision";
        return -1;
    }
    if (t->o.batch < t->in.cl.n_devices)
        return err_set(err, "globalBatch %ld is less than the %d usable GPUs (every GPU needs a sample; "
                            "lower gpus.maxGPUs or raise globalBatch)", t->o.batch, t->in.cl.n_devices);
    return 0;
}

/* What the plan is made from, read from the job and the API (on the loop: the client is not
 * thread-safe): the model, the usable GPUs, the profiles. 0; -1 with t->out.reason and err set
 * (the job's problem, not the API's); -2 with err set on an API error. */
static int plan_prepare(rec_ctx *x, plan_task *t, err_t *err) {
    t->out.reason = "InvalidSpec";
    int mrc = plan_model(x->k, x, &t->in.model, err);
    t->outside = mrc == -1 && x->job.js.model == JOB_MODEL_INIT_FROM;
    if (mrc < 0) return mrc;
    if (plan_inputs_of(x, rec_inv(x, x->gpus.on_free), x->gpus.cap, t, err) < 0) return -1;
    int prc = load_profiles(x->k, x, &t->in, t->profile_rv, sizeof t->profile_rv, err);
    if (prc < 0) t->out.reason = "InvalidProfile", t->outside = prc == -1;
    return prc;
}

/* ---- the plan, on a planning thread -------------------------------------------------------- */

/* plan.json as text (the caller frees it), or NULL with err set. */
static char *plan_json_text(const plan *p, err_t *err) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return err_set(err, "out of memory"), NULL;
    int rc = plan_write_json(p, f, err);
    if (fclose(f) != 0 && rc == 0) rc = err_set(err, "out of memory");
    if (rc == 0) return buf;
    free(buf);
    return NULL;
}

/* The optimizer ran out of its budget: the planner names the budget and the size; the advice is
 * the operator's. */
static int plan_timed_out(plan_task *t, err_t *err) {
    t->out.reason = "PlanningTimeout";
    char why[600];
    snprintf(why, sizeof why, "%.599s", err->msg);
    return err_set(err, "%s; a smaller spec.globalBatch, fewer GPUs (spec.gpus.maxGPUs) or a coarser plan "
                        "(spec.strategy fsdp or whale, planned at once) fits in it, or raise the operator's "
                        "--plan-timeout (chart value operator.planTimeout)", why);
}

/* The optimizer on the task's cost model within its budget: 0 with t->out.json, or -1 with
 * t->out.reason and err set. */
static int plan_answer(plan_task *t, const volatile int *cancel, err_t *err) {
    plan p;
    int rc = plan_make_limited(&t->in.cm, t->strat, t->budget_s, cancel, &p, err);
    if (rc == 1 && cancel && *cancel) { /* dropped (a newer spec, the job gone, a shutdown): nobody reads it */
        t->out.reason = "Cancelled";
        return -1;
    }
    if (rc == 1) return plan_timed_out(t, err);
    t->out.reason = "PlanError";
    if (rc < 0) return -1;
    if (!p.feasible) {
        t->out.reason = "Infeasible";
        err_set(err, "no feasible %s plan on %d GPUs: %s", strategy_name(t->strat), t->in.cl.n_devices, p.reason);
    } else {
        t->out.json = plan_json_text(&p, err);
    }
    plan_free(&p);
    return t->out.json ? 0 : -1;
}

/* Which of the cost model's device groups have measured costs: the plan's `estimated` and its
 * profile's name. */
static void plan_measured(plan_task *t) {
    plan_inputs *in = &t->in;
    int measured = 0;
    for (int g = 0; in->have_prof && g < in->cm.n_groups; g++) measured += in->cm.groups[g].measured;
    t->out.estimated |= measured < in->cm.n_groups;
    snprintf(t->out.profile, sizeof t->out.profile, "%.*s", (int)sizeof t->out.profile - 1,
             in->have_prof ? in->prof_source : "");
    t->out.measured_groups = measured;
    t->out.groups = in->cm.n_groups;
}

/* Makes the plan of a prepared task: the cost model, the optimizer, plan.json. Runs on a planning
 * thread (planning_run_fn), or inline without a pool. */
static void plan_solve(void *task, const volatile int *cancel) {
    plan_task *t = task;
    err_t err = {{0}};
    t->out.reason = "InvalidSpec";
    t->rc = inputs_build(&t->in, &t->o, &err);
    if (t->rc == 0) {
        plan_measured(t);
        t->rc = plan_answer(t, cancel, &err);
    }
    if (t->rc < 0) snprintf(t->msg, sizeof t->msg, "%s", err.msg);
    inputs_free(&t->in); /* the cost tables can be large; the result needs none of it */
    t->have_inputs = false;
}

/* ---- the plan to run ------------------------------------------------------------------------- */

void rec_forget_plan(const rec_ctx *x) {
    if (x->c->planner) planning_forget(x->c->planner, x->job.key);
}

/* A planning thread works on the job: the status says so (condition Planned False, reason
 * Planning). A live job keeps its phase, conditions and plan summary: its gang runs on the old
 * plan until the new one is ready. A queued job stays in the queue meanwhile. Others are Created. */
static int plan_pending(rec_ctx *x, const char *msg, err_t *err) {
    bool live = phase_live(x->job.old.phase) || x->job.old.phase == PHASE_QUEUED;
    cJSON *conds, *s = rec_status_base(x, live ? x->job.old.phase : PHASE_CREATED, msg, &conds);
    bool planned = false;
    if (!live) rec_condition(x, conds, "Created", true, "Created", "the job was accepted by the operator");
    for (int i = 0; live && i < x->job.old.n_conds; i++) {
        const rec_cond *oc = &x->job.old.conds[i];
        if (strcmp(oc->type, "Planned") != 0) { /* kept as stored */
            cJSON_AddItemToArray(conds, cJSON_Duplicate(oc->obj, true));
            continue;
        }
        rec_condition(x, conds, "Planned", false, "Planning", msg); /* in its place */
        planned = true;
    }
    if (!planned) rec_condition(x, conds, "Planned", false, "Planning", msg);
    if (live && x->job.old.plan) cJSON_AddItemToObject(s, "plan", cJSON_Duplicate(x->job.old.plan, true));
    return rec_write_status(x, s, err);
}

/* A task the job's problem ended before planning, or one planned here without a pool: *tp, owned
 * by the caller. */
static int plan_here(rec_ctx *x, plan_task *t, int prc, plan_task **tp, bool *own, const err_t *err) {
    if (x->st) x->st->plans++;
    if (prc < 0) t->rc = -1, snprintf(t->msg, sizeof t->msg, "%s", err->msg);
    else plan_solve(t, NULL);
    rec_forget_plan(x); /* a planning for an older spec is of no use */
    *tp = t, *own = true;
    return 1;
}

/* The task on the pool: submitted unless the pool has one for this id, then waited for a
 * moment. 1 with *tp when it is done; 0 while it runs (the status says so). */
static int plan_on_pool(rec_ctx *x, plan_task *t, const char *id, plan_task **tp, err_t *err) {
    planning *pool = x->c->planner;
    char msg[512];
    snprintf(msg, sizeof msg, "%splanning globalBatch %ld on %d GPUs (strategy %s, at most %g s)",
             phase_live(x->job.old.phase) ? "re-" : "", t->o.batch, t->in.cl.n_devices, strategy_name(t->strat),
             t->budget_s);
    void *done = NULL;
    planning_state st = planning_get(pool, x->job.key, id, &done);
    if (st == PLANNING_NONE) {
        if (x->st) x->st->plans++;
        planning_submit(pool, x->job.key, id, t, plan_solve, plan_task_free);
        planning_wait(pool, x->job.key, REC_PLAN_WAIT_S);
        st = planning_get(pool, x->job.key, id, &done);
    } else {
        plan_task_free(t); /* the pool has this one already, planned or being planned */
    }
    if (st != PLANNING_DONE) return plan_pending(x, msg, err) < 0 ? -1 : 0;
    *tp = done;
    return 1;
}

/* The job planned for generation gen_s on GPUs fp, off the loop (planning.h). 1 with *tp, the
 * finished task (its rc < 0: the job cannot be planned), owned by the pool unless *own; 0 while a
 * planning thread works on it (the status says so; the pool queues the job again when it is
 * done); -1 on an API error. Most plans take milliseconds and are waited for here. */
static int obtain_plan(rec_ctx *x, const char *gen_s, const char *fp, plan_task **tp, bool *own, err_t *err) {
    plan_task *t = xcalloc(1, sizeof *t);
    t->budget_s = x->c->plan_timeout_s;
    *tp = NULL, *own = false;
    int prc = plan_prepare(x, t, err);
    if (prc == -2) {
        plan_task_free(t);
        return -1;
    }
    if (prc < 0 || !x->c->planner) return plan_here(x, t, prc, tp, own, err);
    char id[PLANNING_ID_MAX]; /* 31 + 63 + 63: cannot be cut */
    snprintf(id, sizeof id, "%s|%s|%s", gen_s, fp, t->profile_rv);
    return plan_on_pool(x, t, id, tp, err);
}

/* A plan that still fits is kept when other GPUs free up or get busy (re-planning restarts the
 * gang); the job grows onto more free GPUs at most once per spec.elastic.minReplanSeconds since it
 * was planned, so that churn does not thrash it. */
static bool keep_plan(rec_ctx *x) {
    if (!rec_plan_fits(x, &x->plan.view)) return false;
    if (x->gpus.picked <= x->plan.view.world) return true;
    double at = 0;
    if (!kube_time_parse(x->stores.cmv.planned_at, &at)) at = 0; /* older plans: long ago */
    double wait = (double)x->job.js.min_replan_s - (kube_time_now_s() - at);
    if (wait <= 0) return false;
    if (x->st && (x->st->requeue_s <= 0 || wait < x->st->requeue_s)) x->st->requeue_s = wait;
    return true;
}

/* The ConfigMap's plan, when it was made for this generation and these GPUs, or a pod of its gang
 * ended (to be seen through), or its gang was started but not complete and it fits, or it still
 * fits (and the job is not due to grow): 1 with x->plan.view; 0 to plan anew. A plan.json that does not
 * read (edited by hand) is planned anew too, the warning naming its field. */
static int stored_plan(rec_ctx *x, const char *gen_s, const char *fp, err_t *err) {
    const rec_cm_view *cm = &x->stores.cmv;
    if (!cm->plan_json || strcmp(cm->generation, gen_s)) return 0;
    bool read = rec_plan_read(x, cm->plan_json, err) == 0;
    const char *id = cm->plan_id;
    /* a gang started on it and not complete yet (maybe left by another leader) is completed on it
     * while it fits; a complete one grows as keep_plan says */
    int started = read ? rec_gang_started(x, id) : 0;
    if (read && (!strcmp(cm->inventory, fp) || rec_gang_ended(x, id) ||
                 (started > 0 && started < x->plan.view.world && rec_plan_fits(x, &x->plan.view)) || keep_plan(x)) &&
        /* ours are "g<generation>-<hash>": one too long for the buffer is not, and is planned anew */
        str_fmt(x->plan.id, sizeof x->plan.id, NULL, "", "%s", id) == 0) {
        snprintf(x->plan.notes, sizeof x->plan.notes, "%s", cm->notes);
        snprintf(x->plan.profile, sizeof x->plan.profile, "%s", x->job.old.plan_profile);
        x->plan.estimated = x->job.old.plan_estimated;
        return 1;
    }
    if (!read) log_warn("%s/%s: %s; planning again", x->job.ns, x->job.name, err->msg);
    plan_view_free(&x->plan.view);
    return 0;
}

/* The Event of a new plan: Replanned for a live job with a gang (it restarts on it; counted and
 * said in the status), Planned for another. */
static void new_plan_event(rec_ctx *x, bool spec_changed) {
    const char *old_id = x->stores.cmv.plan_id;
    int world = x->plan.view.world;
    double sps = x->plan.view.samples_per_s;
    if (!strcmp(old_id, x->plan.id)) return;
    /* a job with a gang (or one being started) restarts on the new plan; a suspended or failed
     * one is just planned */
    if (x->stores.cmv.plan_json && phase_live(x->job.old.phase)) {
        if (x->st) x->st->replans++;
        snprintf(x->plan.fresh.ev, sizeof x->plan.fresh.ev, "re-planned on %d GPUs (%s), predicted %.2f samples/s; the "
                 "gang restarts from the last checkpoint", world, spec_changed ? "the spec changed"
                 : "the usable GPUs changed", sps);
        x->plan.fresh.ev_reason = "Replanned";
        snprintf(x->plan.why, sizeof x->plan.why, "%s", x->plan.fresh.ev);
    } else {
        snprintf(x->plan.fresh.ev, sizeof x->plan.fresh.ev, "planned %d GPUs, predicted %.2f samples/s (%.300s)", world,
                 sps, *x->plan.profile ? x->plan.profile : "analytic estimates");
        x->plan.fresh.ev_reason = "Planned";
    }
}

/* Takes a finished task's plan as the one to run, to be written by rec_commit_plan once the
 * admission lock is released. 1, or -1 when plan.json does not parse. */
static int take_plan(rec_ctx *x, const plan_task *t, bool own, const char *gen_s, const char *fp, err_t *err) {
    const plan_out *po = &t->out;
    const char *cm_gen = x->stores.cmv.generation;
    plan_id_of(x->job.meta.gen, po->json, x->plan.id, sizeof x->plan.id);
    x->plan.estimated = po->estimated;
    snprintf(x->plan.notes, sizeof x->plan.notes, "%s", po->notes);
    snprintf(x->plan.profile, sizeof x->plan.profile, "%s", po->profile);
    if (rec_plan_read(x, po->json, err) < 0) return -1;
    x->plan.fresh.json = xstrdup(po->json);
    snprintf(x->plan.fresh.gen, sizeof x->plan.fresh.gen, "%s", gen_s);
    snprintf(x->plan.fresh.fp, sizeof x->plan.fresh.fp, "%s", fp);
    x->plan.fresh.forget = !own;
    if (!x->stores.cm && x->st) x->st->jobs_created++;
    new_plan_event(x, strcmp(cm_gen, gen_s) != 0);
    return 1;
}

int rec_plan_read(rec_ctx *x, const char *plan_json, err_t *err) {
    char name[400];
    snprintf(name, sizeof name, "ConfigMap %s/%s: plan.json", x->job.ns, x->job.cm_name);
    return plan_view_parse(name, plan_json, strlen(plan_json), &x->plan.view, err);
}

int rec_current_plan(rec_ctx *x, err_t *err) {
    char gen_s[32], fp[64];
    snprintf(gen_s, sizeof gen_s, "%.0f", x->job.meta.gen);
    inventory_fingerprint(rec_inv(x, x->gpus.on_free), x->gpus.cap, fp, sizeof fp);
    if (stored_plan(x, gen_s, fp, err)) return 1;
    plan_task *t;
    bool own;
    int rc = obtain_plan(x, gen_s, fp, &t, &own, err);
    if (rc <= 0) return rc;
    /* a failure is kept by the pool: nothing is planned again until the inputs change. One on a
     * ConfigMap no watch follows is a deadline of its own: it is read again REC_OUTSIDE_S later */
    if (t->rc < 0) rc = rec_plan_failed(x, t->out.reason, t->msg, err) < 0 ? -1 : 0;
    else rc = take_plan(x, t, own, gen_s, fp, err);
    if (t->rc < 0 && t->outside && x->st && (x->st->requeue_s <= 0 || x->st->requeue_s > REC_OUTSIDE_S))
        x->st->requeue_s = REC_OUTSIDE_S;
    if (own) plan_task_free(t);
    return rc;
}
