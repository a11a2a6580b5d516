{{- define "infera-gate.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "infera-gate.labels" -}}
app.kubernetes.io/name: infera-gate
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "infera-gate.selectorLabels" -}}
app.kubernetes.io/name: infera-gate
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "infera-gate.extProcTlsSecret" -}}
{{- default (printf "%s-ext-proc-tls" (include "infera-gate.fullname" .)) .Values.extProc.tls.secretName -}}
{{- end -}}

{{- define "infera-gate.adminTokenSecret" -}}
{{- default (printf "%s-admin-token" (include "infera-gate.fullname" .)) .Values.adminToken.existingSecret -}}
{{- end -}}
