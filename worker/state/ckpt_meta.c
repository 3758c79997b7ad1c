/* ckpt_meta.c - what a checkpoint file says it holds (ckpt_meta.h): the kinds of its tensors and
 * the model of its "cephalo.model" metadata. A file of its own because both ckpt.c and ckpt_set.c
 * read them and ckpt.c reads through ckpt_set.c: kept in ckpt.c, the two would use each other. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/json_util.h"
#include "planner/model_json.h"
#include "state/ckpt_meta.h"

const char *const CKPT_KINDS[3] = {"param", "adam_m", "adam_v"};

int ckpt_read_model(const st_file *f, model_spec *m, err_t *err) {
    const char *text = st_meta(f, "cephalo.model");
    if (!text) return err_set(err, "%s: no 'cephalo.model' metadata (not a Cephalo checkpoint?)",
                              st_label(f));
    cJSON *o = json_parse(st_label(f), text, strlen(text), err);
    if (!o) return -1;
    json_ctx c = {st_label(f), err};
    int rc = model_from_json(&c, o, "metadata cephalo.model", m);
    cJSON_Delete(o);
    return rc;
}

/* The checkpoint's model must be the one being trained, field by field. */
int ckpt_check_model(const st_file *f, const model_spec *want, err_t *err) {
    model_spec got;
    if (ckpt_read_model(f, &got, err) < 0) return -1;
    cJSON *a = model_to_json(&got), *b = model_to_json(want);
    cJSON_DeleteItemFromObject(a, "name"), cJSON_DeleteItemFromObject(b, "name");
    bool same = cJSON_Compare(a, b, true);
    if (!same) {
        char *sa = cJSON_PrintUnformatted(a), *sb = cJSON_PrintUnformatted(b);
        err_set(err, "%s: the checkpoint is of model %s %s, not the %s being trained %s",
                st_label(f), got.name, sa, want->name, sb);
        free(sa), free(sb);
    }
    cJSON_Delete(a), cJSON_Delete(b);
    return same ? 0 : RESUME_OTHER_MODEL;
}
