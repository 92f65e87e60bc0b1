{{/* Labels of every object: the kustomization's app.kubernetes.io/name and Helm's own. */}}
{{- define "qoslet.labels" -}}
app.kubernetes.io/name: qoslet
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* The pods' selector: the kustomization's, so either install path manages the same pods. */}}
{{- define "qoslet.selectorLabels" -}}
app.kubernetes.io/name: qoslet
{{- end }}

{{- define "qoslet.namespace" -}}
{{- required "namespace.name is required" .Values.namespace.name -}}
{{- end }}

{{/* config.leaseNamespace, or the chart's namespace when null. */}}
{{- define "qoslet.leaseNamespace" -}}
{{- .Values.config.leaseNamespace | default (include "qoslet.namespace" .) -}}
{{- end }}

{{/* The port of config.metricsAddress (host:port or [v6]:port). */}}
{{- define "qoslet.metricsPort" -}}
{{- $port := regexFind "[0-9]+$" .Values.config.metricsAddress -}}
{{- if not (regexMatch ":[0-9]+$" .Values.config.metricsAddress) -}}
{{- fail (printf "config.metricsAddress %q has no :port" .Values.config.metricsAddress) -}}
{{- end -}}
{{- $port -}}
{{- end }}

{{/* Whether a prometheus-operator kind is rendered: its value true, or "auto" and served. */}}
{{- define "qoslet.monitoring" -}}
{{- $enabled := toString .enabled -}}
{{- if or (eq $enabled "true") (and (eq $enabled "auto") (.root.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" .kind))) -}}
true
{{- end -}}
{{- end }}
