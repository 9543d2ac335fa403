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

{{- /*
The pod knobs of one component's values (operator or hub): pod-spec fields, rendered only
when set. Called with the component's values.
*/ -}}
{{- define "scale-agent.podPlacement" -}}
{{- with .imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- end -}}

{{- /*
Pod labels: the component's podLabels under its selector labels, which win (the Deployment
and Service select by them). Called with (list $ component-values selector-template).
*/ -}}
{{- define "scale-agent.podLabels" -}}
{{- $root := index . 0 -}}
{{- $values := index . 1 -}}
{{- $selector := include (index . 2) $root | fromYaml -}}
{{- toYaml (merge $selector ($values.podLabels | default dict)) -}}
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
