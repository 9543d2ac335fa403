{{- define "scale-agent.labels" -}}
app.kubernetes.io/part-of: scale-agent
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "scale-agent.operatorSelector" -}}
app.kubernetes.io/name: scale-agent-operator
app.kubernetes.io/component: operator
{{- end -}}

{{- define "scale-agent.hubSelector" -}}
app.kubernetes.io/name: scale-agent-hub
app.kubernetes.io/component: hub
{{- end -}}
