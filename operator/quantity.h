/* quantity.h - Kubernetes resource quantities ("16Gi", "500M", "1.5", "250m", "1e9"), as the
 * API's resource.Quantity writes them: a decimal number, then one suffix — binary Ki Mi Gi Ti Pi
 * Ei, decimal n u m k M G T P E, or an exponent e<N> / E<N>. A pod template's worker
 * resources are read with it (pod_template.h): the memory limit bounds the host offload pool the
 * planner gives each rank.
 *
 *   double bytes;
 *   if (quantity_parse("16Gi", &bytes, &err) < 0) ... err says what was expected */
#ifndef CEPHALO_QUANTITY_H
#define CEPHALO_QUANTITY_H

#include <cjson/cJSON.h>

#include "common/err.h"

/* The value of s; 0, or -1 with err saying what a quantity looks like. Negative values are
 * refused (no resource is negative). */
int quantity_parse(const char *s, double *out, err_t *err);
/* A quantity as JSON holds it: a string as above, or a plain number. */
int quantity_json(const cJSON *v, double *out, err_t *err);

#endif
