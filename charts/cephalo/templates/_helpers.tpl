{{/* Names and labels shared by the templates. */}}
{{- define "cephalo.fullname" -}}
{{ .Release.Name }}-operator
{{- end }}

{{- define "cephalo.serviceAccountName" -}}
{{- if .Values.serviceAccount.name -}}
{{ .Values.serviceAccount.name }}
{{- else -}}
{{ include "cephalo.fullname" . }}
{{- end -}}
{{- end }}

{{- define "cephalo.labels" -}}
app.kubernetes.io/name: cephalo
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: cephalo-{{ .Chart.Version }}
{{- end }}

{{- define "cephalo.selectorLabels" -}}
app.kubernetes.io/name: cephalo
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- /* The operator's default node affinity (operator.avoidGPUNodes): no node that the NVIDIA GPU
       Operator or device plugin labels nvidia.com/gpu.present=true, and none that GPU Feature
       Discovery labels with a GPU count. NotIn and DoesNotExist both match a node without the
       label, so CPU nodes qualify whether or not those components run on the cluster. */}}
{{- define "cephalo.avoidGPUNodes" -}}
requiredDuringSchedulingIgnoredDuringExecution:
  nodeSelectorTerms:
    - matchExpressions:
        - key: nvidia.com/gpu.present
          operator: NotIn
          values: ["true"]
        - key: nvidia.com/gpu.count
          operator: DoesNotExist
{{- end }}

{{- /* What the operator writes for the jobs of a namespace (every namespace through the
       ClusterRole, or a Role in each of operator.watchNamespaces). Creating pods in a namespace
       is, in effect, reading its Secrets (a pod may mount any of them): the reason to list the
       namespaces on a shared cluster (docs/k8s.md, "RBAC"). */}}
{{- define "cephalo.jobRules" -}}
- apiGroups: [cephalo.dev]
  resources: [cephalojobs]
  verbs: [get, list, watch, update, patch]
- apiGroups: [cephalo.dev]
  resources: [cephalojobs/status]
  verbs: [get, update, patch]
# ownerReferences with blockOwnerDeletion on clusters with the OwnerReferencesPermissionEnforcement
# admission plugin (OpenShift) need update on the owner's finalizers
- apiGroups: [cephalo.dev]
  resources: [cephalojobs/finalizers]
  verbs: [update]
# one worker pod per GPU; gang restarts delete them (reading them is the ClusterRole's)
- apiGroups: [""]
  resources: [pods]
  verbs: [create, delete]
- apiGroups: [""]
  resources: [services, configmaps]
  verbs: [create, delete, get, list, watch, patch]
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
# a job's claims (data, checkpoints, initFrom) looked at before its pods: a missing or unbound
# one is named in the status instead of pods the scheduler cannot place
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get]
{{- end }}

{{- /* What values.schema.json cannot say: combinations that would render a broken release. */}}
{{- define "cephalo.checkValues" -}}
{{- if eq (int .Values.operator.metrics.port) 0 }}
{{- fail "operator.metrics.port: 0 would turn off the operator's HTTP endpoint, but the chart's liveness and readiness probes and its metrics Service use it: give a port (1-65535)" }}
{{- end }}
{{- if and (gt (int .Values.operator.replicas) 1) (not .Values.operator.leaderElection.enabled) }}
{{- fail (printf "operator.replicas: %d replicas need operator.leaderElection.enabled=true (without it every replica would reconcile every job)" (int .Values.operator.replicas)) }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled (not (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor")) }}
{{- fail "serviceMonitor.enabled: the cluster has no ServiceMonitor kind (monitoring.coreos.com/v1): install the Prometheus Operator's CRDs first, or leave serviceMonitor.enabled false (with helm template, pass --api-versions monitoring.coreos.com/v1/ServiceMonitor)" }}
{{- end }}
{{- end }}
