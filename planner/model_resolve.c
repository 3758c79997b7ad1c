/* model_resolve.c - a model by name or path: a built-in, a model file (model_file.c) or a Hugging
 * Face config.json (model_hf.c). Kept out of model.c because it calls the loaders, and the
 * loaders call model.c (names, built-ins, checks): the choice sits above both. */
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "planner/model.h"

/* A Hugging Face model: its config.json, or a directory holding one. */
static bool is_hf_config(const char *path) {
    size_t n = strlen(path);
    if (n >= 5 && strcmp(path + n - 5, ".json") == 0) return true;
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int model_resolve(const char *name_or_path, model_spec *out, err_t *err) {
    int n;
    const model_spec *b = model_builtins(&n);
    for (int i = 0; i < n; i++) {
        if (strcasecmp(b[i].name, name_or_path) == 0) {
            *out = b[i];
            return 0;
        }
    }
    if (is_hf_config(name_or_path)) return model_load_hf_config(name_or_path, out, err);
    if (strchr(name_or_path, '/') || strstr(name_or_path, ".yaml") ||
        strstr(name_or_path, ".yml"))
        return model_load_file(name_or_path, out, err);
    return model_unknown(name_or_path, err);
}
