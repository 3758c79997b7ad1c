/* pod_template.h - spec.template, a CephaloJob's PodTemplateSpec (docs/k8s.md, "spec.template"):
 * what a platform needs on every worker pod (labels, annotations, a priority class, pull secrets,
 * a ServiceAccount, tolerations, affinity, a security context, volumes, init containers and
 * sidecars, and for the container named `worker` its resources, env, envFrom and volume mounts),
 * merged into the pods the operator builds. What the operator must own is refused, each field
 * named: the worker's command, args and image, its CEPHALO_* and rendezvous env, the GPU, the
 * node placement it planned (a required node affinity of the template is ANDed with it), the
 * restart policy, the pod's hostname and subdomain, the operator's labels, volumes and mounts.
 *
 *   if (pod_template_check(spec_template, &err) < 0) ... InvalidSpec: err names the field
 *   pod_template_apply(spec_template, pod);   // on the pod the operator built
 *
 * Reads nothing but the job (no API server): the job spec parser calls the check. */
#ifndef CEPHALO_POD_TEMPLATE_H
#define CEPHALO_POD_TEMPLATE_H

#include <cjson/cJSON.h>

#include "common/err.h"

#define POD_TEMPLATE_WORKER "worker" /* the container the operator builds */

/* 0 when spec.template (an object, or NULL: none) may be merged; -1 with err naming the field
 * and why ("spec.template.spec.containers[worker].command: owned by the operator (...)"). */
int pod_template_check(const cJSON *tmpl, err_t *err);
/* Merges a checked template into pod (the operator's, complete: metadata, spec, its worker
 * container); NULL adds nothing but automountServiceAccountToken: false. */
void pod_template_apply(const cJSON *tmpl, cJSON *pod);
/* The worker container's memory limit in bytes (resources.limits.memory of a checked template),
 * or 0 when it sets none: each worker's host memory, which bounds its offload pool. */
double pod_template_memory_limit(const cJSON *tmpl);

#endif
