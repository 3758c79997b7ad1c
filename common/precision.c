/* precision.c - names of the training precisions (precision.h). */
#include "common/precision.h"

#include <string.h>

static const char *const NAMES[PREC_COUNT] = {"fp32", "bf16", "fp16"};

const char *precision_name(precision p) {
    return (unsigned)p < PREC_COUNT ? NAMES[p] : "?";
}

bool precision_parse(const char *s, precision *out) {
    for (int i = 0; s && i < PREC_COUNT; i++)
        if (!strcmp(s, NAMES[i])) return *out = (precision)i, true;
    return false;
}

int precision_gather_bytes(precision p) { return precision_half(p) ? 2 : 4; }
