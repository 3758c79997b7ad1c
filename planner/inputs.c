/* inputs.c - loading what a plan is made from, shared by `cephalo plan` and `cephalo run`. */
#include "inputs.h"

#include <stdlib.h>

#include "fileio.h"

int inputs_build(plan_inputs *in, const inputs_opts *o, err_t *err) {
    if (o->profile) {
        if (profile_load_file(o->profile, &in->prof, err) < 0) return -1;
        in->have_prof = true;
    }
    cost_opts co = {.bf16 = o->bf16, .mem_cap = o->mem_cap, .prof = in->have_prof ? &in->prof : NULL};
    return cost_build(&in->cm, &in->model, &in->cl, (int)o->seq, (int)o->batch, &co, err);
}

void inputs_print_notes(const plan_inputs *in, const char *prog, FILE *f) {
    if (!in->have_prof) return;
    for (int g = 0; g < in->cm.n_groups; g++)
        if (!in->cm.groups[g].measured)
            fprintf(f, "%s: note: the profile has no entry for %s with %s, seq %d, %s; using estimates for it\n", prog,
                    in->cm.groups[g].dev->type, in->model.name, in->cm.seq, in->cm.opts.bf16 ? "bf16" : "fp32");
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
    if (rc == 0) rc = file_write_atomic(path, text, len, err);
    free(text);
    return rc;
}
