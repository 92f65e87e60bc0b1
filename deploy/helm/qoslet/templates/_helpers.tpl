{{/* The chart's name, or nameOverride: the app.kubernetes.io/name label. */}}
{{- define "qoslet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/*
Every object's name, or its prefix: fullnameOverride, else the release name where it holds the
chart's name (release qoslet: qoslet, qoslet-config, ...; the kustomization's names), else
RELEASE-NAME. Cluster-scoped objects carry it too, so two releases do not clash.
*/}}
{{- define "qoslet.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end }}

{{- define "qoslet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/* Labels of every object: the selector's and Helm's own. */}}
{{- define "qoslet.labels" -}}
helm.sh/chart: {{ include "qoslet.chart" . }}
{{ include "qoslet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
The pods' selector: name and instance, as the kustomization's (release qoslet), so either install
path manages the same pods and a second release (another namespace, other nodes) not these.
*/}}
{{- define "qoslet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "qoslet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The release's namespace: `helm install -n NAMESPACE`; the chart creates none. */}}
{{- define "qoslet.namespace" -}}
{{- .Release.Namespace -}}
{{- end }}

{{/* The agent's service account: serviceAccount.name, else the fullname (or default). */}}
{{- define "qoslet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "qoslet.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end }}

{{/* repository@digest when image.digest is set, else repository:tag (tag "": appVersion). */}}
{{- define "qoslet.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end }}

{{/* config.leaseNamespace, or the release's namespace when null. */}}
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
