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

{{/*
The admissionregistration.k8s.io version of ValidatingAdmissionPolicy the cluster serves:
v1, else v1beta1, else empty (no policy; NOTES warns). `helm template` without a cluster
knows neither unless given --api-versions.
*/}}
{{- define "scale-agent.policyApiVersion" -}}
{{- if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" -}}
v1
{{- else if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1beta1/ValidatingAdmissionPolicy" -}}
v1beta1
{{- end -}}
{{- end }}
