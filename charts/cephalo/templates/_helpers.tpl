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
