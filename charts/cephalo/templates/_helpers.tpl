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
