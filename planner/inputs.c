/* inputs.c - loading what a plan is made from, shared by `cephalo plan` and `cephalo run`. */
#include "planner/inputs.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "planner/profile_store.h"

#include "common/fileio.h"

/* The profile store, when it can be read and has the model; a store that cannot be read is
 * reported and left out (plans still work from estimates). */
static void load_store(plan_inputs *in) {
    char path[4096];
    err_t e;
    int have = profile_store_path(path, sizeof path, &e);
    if (have < 0) fprintf(stderr, "cephalo: warning: the profile store is left out: %s\n", e.msg);
    if (have <= 0 || access(path, F_OK) != 0) return;
    if (profile_load_file(path, &in->prof, &e) < 0) {
        fprintf(stderr, "cephalo: warning: the profile store is left out: %s\n", e.msg);
        return;
    }
    if (!profile_has_model(&in->prof, in->model.name)) {
        profile_free(&in->prof);
        return;
    }
    in->have_prof = true;
    snprintf(in->prof_source, sizeof in->prof_source, "the profile store %s", path); /* 4096 + 18 < 4200 */
}

int inputs_build(plan_inputs *in, const inputs_opts *o, err_t *err) {
    if (in->have_prof) {
        /* the caller loaded it (the operator, from a ConfigMap) */
    } else if (o->profile) {
        if (profile_load_file(o->profile, &in->prof, err) < 0) return -1;
        in->have_prof = true;
        /* cannot be cut: the file was read, its path is under PATH_MAX (4096) */
        snprintf(in->prof_source, sizeof in->prof_source, "--profile %s", o->profile);
        if (!profile_has_model(&in->prof, in->model.name)) {
            char models[512];
            profile_models(&in->prof, models, sizeof models);
            err_set(err, "%s: the profile has no entry for model %s (it has: %s); run `cephalo profile --model %s`",
                    o->profile, in->model.name, models, in->model.name);
            profile_free(&in->prof);
            in->have_prof = false;
            return -1;
        }
    } else if (!o->no_store) {
        load_store(in);
    }
    cost_opts co = {.prec = o->prec, .mem_cap = o->mem_cap, .prof = in->have_prof ? &in->prof : NULL,
                    .recompute = o->recompute, .host_bytes = o->host_bytes};
    return cost_build(&in->cm, &in->model, &in->cl, (int)o->seq, (int)o->batch, &co, err);
}

void inputs_print_notes(const plan_inputs *in, const char *prog, FILE *f) {
    if (!in->have_prof) return;
    int measured = 0;
    for (int g = 0; g < in->cm.n_groups; g++) measured += in->cm.groups[g].measured;
    fprintf(f, "%s: note: costs from %s: measured for %d of %d device group%s, collectives %s\n", prog,
            in->prof_source, measured, in->cm.n_groups, in->cm.n_groups == 1 ? "" : "s",
            in->cm.comm.world <= 1 ? "not needed (one device)" : in->cm.comm.measured ? "measured" : "estimated");
    for (int g = 0; g < in->cm.n_groups; g++)
        if (!in->cm.groups[g].measured)
            fprintf(f, "%s: note: the profile has no entry for %s with %s, seq %d, %s; using estimates for it\n", prog,
                    in->cm.groups[g].dev->type, in->model.name, in->cm.seq, precision_name(in->cm.opts.prec));
}

void inputs_free(plan_inputs *in) {
    cost_free(&in->cm);
    cluster_free(&in->cl);
    if (in->have_prof) profile_free(&in->prof);
    in->have_prof = false;
}

int inputs_save_plan(const plan *p, const char *path, err_t *err) {
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem) return err_set(err, "%s: cannot write: out of memory", path);
    int rc = plan_write_json(p, mem, err);
    if (fclose(mem) != 0 && rc == 0) rc = err_set(err, "%s: cannot write: out of memory", path);
    if (rc == 0) rc = file_write_atomic(path, text, len, 0, err);
    free(text);
    return rc;
}
