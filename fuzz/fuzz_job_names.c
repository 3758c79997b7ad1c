/* fuzz_job_names.c - libFuzzer target for the names a job file carries into fixed places (issue
 * 27): a run name (`name:`, or the job file's name up to its first '.') of any length and any
 * bytes, with up to 64 device items of odd memory sizes. A job that loads must keep its name whole
 * and turn into a cluster the planner loads: the generated cluster text was once cut, and its
 * YAML error blamed <devices>. Any other outcome aborts, so libFuzzer reports it.
 *
 * Input: byte 0 picks how the rest splits into the name and the file name, byte 1 the device items
 * and whether `name:` is written; the rest is the name, then the file name. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/job.h"
#include "common/strutil.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* bytes as a C string (a NUL inside ends it, as it would in a file name or a YAML scalar) */
static char *text_of(const uint8_t *p, size_t n) {
    char *s = malloc(n + 1);
    memcpy(s, p, n);
    s[n] = '\0';
    return s;
}

/* What the job's name must be: the file's base name up to its first '.', or "job". */
static void derived_name(const char *file, char *out, size_t n) {
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    size_t len = strcspn(base, ".");
    if (len >= n) len = n - 1; /* longer ones are refused: never compared */
    memcpy(out, base, len);
    out[len] = '\0';
    if (!out[0]) snprintf(out, n, "job");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    size_t rest = size - 2, split = rest ? data[0] % (rest + 1) : 0;
    int items = 1 + (data[1] & 63);
    int named = data[1] & 64;
    char *name = text_of(data + 2, split), *file = text_of(data + 2 + split, rest - split);
    if (!*file) {
        free(file);
        file = strdup("fuzz.yaml");
    }
    char *yaml = NULL;
    size_t len = 0, cap = 0;
    if (named) str_appendf(&yaml, &len, &cap, "name: %s\n", name);
    str_appendf(&yaml, &len, &cap, "model: tiny-gpt\nbatch: %d\nsteps: 2\ndevices:\n", items * 4);
    for (int i = 0; i < items; i++) /* sizes whose GiB have many digits */
        str_appendf(&yaml, &len, &cap, "  - {type: cpu, threads: %d, memory: %dM, count: 4}\n", 1 + i % 7, 1 + (int)((size * 131 + (size_t)i * 977) % 4095));
    job j;
    err_t err;
    if (job_load_string(file, yaml, len, &j, &err) == 0) {
        char want[JOB_NAME_MAX + 1];
        if (!named) derived_name(file, want, sizeof want);
        if (!named && strcmp(j.name, want) != 0) {
            fprintf(stderr, "job name '%s', expected '%s' from the file name '%s'\n", j.name, want, file);
            abort();
        }
        cluster cl;
        if (job_cluster(&j, &cl, &err) < 0) {
            fprintf(stderr, "a job that loads (name '%s') gives a cluster that does not: %s\n", j.name, err.msg);
            abort();
        }
        if (cl.n_devices != j.n_devices) abort();
        cluster_free(&cl);
    }
    job_free(&j);
    free(yaml), free(name), free(file);
    return 0;
}
