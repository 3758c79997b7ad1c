/* quantity.c - Kubernetes resource quantities (quantity.h). */
#include "operator/quantity.h"

#include <ctype.h>
#include <stdbool.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define QUANTITY_EXPECTED "expected a quantity such as 16Gi, 500M, 2 or 250m"

typedef struct suffix {
    const char *name;
    double factor;
} suffix;

static const suffix suffixes[] = {
    {"Ki", 1024.0}, {"Mi", 1048576.0}, {"Gi", 1073741824.0}, {"Ti", 1099511627776.0},
    {"Pi", 1125899906842624.0}, {"Ei", 1152921504606846976.0},
    {"n", 1e-9}, {"u", 1e-6}, {"m", 1e-3}, {"", 1}, {"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12},
    {"P", 1e15}, {"E", 1e18},
};

/* Length of the number at s: digits with at most one '.', at least one digit; 0 if none. */
static size_t number_len(const char *s) {
    size_t i = 0, digits = 0;
    bool dot = false;
    for (;; i++) {
        if (isdigit((unsigned char)s[i])) digits++;
        else if (s[i] == '.' && !dot) dot = true;
        else break;
    }
    return digits ? i : 0;
}

/* The factor of a suffix: one of the table, or e<N>/E<N> with a signed integer N. */
static bool suffix_factor(const char *s, double *f) {
    for (size_t i = 0; i < sizeof suffixes / sizeof *suffixes; i++)
        if (!strcmp(s, suffixes[i].name)) return *f = suffixes[i].factor, true;
    if (s[0] != 'e' && s[0] != 'E') return false;
    const char *p = s + 1 + (s[1] == '+' || s[1] == '-');
    if (!*p || strspn(p, "0123456789") != strlen(p) || strlen(p) > 3) return false;
    *f = pow(10, atoi(s + 1));
    return true;
}

int quantity_parse(const char *s, double *out, err_t *err) {
    const char *p = s + (*s == '+');
    size_t n = number_len(p);
    double f;
    char num[64];
    if (!n || n >= sizeof num || !suffix_factor(p + n, &f)) return err_set(err, "'%s': " QUANTITY_EXPECTED, s);
    memcpy(num, p, n), num[n] = 0; /* strtod alone would read an exponent suffix too */
    *out = strtod(num, NULL) * f;
    if (!isfinite(*out)) return err_set(err, "'%s': too large", s);
    return 0;
}

int quantity_json(const cJSON *v, double *out, err_t *err) {
    if (cJSON_IsString(v)) return quantity_parse(v->valuestring, out, err);
    if (cJSON_IsNumber(v) && v->valuedouble >= 0 && isfinite(v->valuedouble)) return *out = v->valuedouble, 0;
    return err_set(err, QUANTITY_EXPECTED);
}
