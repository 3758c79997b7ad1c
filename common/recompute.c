/* recompute.c - names of the recompute modes (recompute.h). */
#include "common/recompute.h"

#include <string.h>

const char *recompute_name(recompute_mode r) { return r == RECOMPUTE_NONE ? "none" : "full"; }

bool recompute_parse(const char *s, recompute_mode *out) {
    if (s && !strcmp(s, "full")) return *out = RECOMPUTE_FULL, true;
    if (s && !strcmp(s, "none")) return *out = RECOMPUTE_NONE, true;
    return false;
}

static const char *const policy_names[] = {"auto", "full", "none"};

const char *recompute_policy_name(recompute_policy p) {
    return (unsigned)p < 3 ? policy_names[p] : "?";
}

bool recompute_policy_parse(const char *s, recompute_policy *out) {
    for (int i = 0; s && i < 3; i++)
        if (!strcmp(s, policy_names[i])) return *out = (recompute_policy)i, true;
    return false;
}
