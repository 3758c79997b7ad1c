/* precision.c - names of the training precisions (precision.h). */
#include "common/precision.h"

#include <string.h>

const char *const precision_names[PREC_COUNT + 1] = {"fp32", "bf16", "fp16", NULL};

const char *precision_name(precision p) {
    return (unsigned)p < PREC_COUNT ? precision_names[p] : "?";
}

bool precision_parse(const char *s, precision *out) {
    for (int i = 0; s && i < PREC_COUNT; i++)
        if (!strcmp(s, precision_names[i])) return *out = (precision)i, true;
    return false;
}

int precision_gather_bytes(precision p) { return precision_half(p) ? 2 : 4; }
