{{/*
The chart name, or nameOverride; cut to 63 characters.
*/}}
{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name: fullnameOverride, else the release name when it already contains the name,
else <release>-<name>; cut to 63 characters (upstream's rule).
*/}}
{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Chart name and version, for the helm.sh/chart label.
*/}}
{{- define "sluice.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of every object.
*/}}
{{- define "sluice.labels" -}}
helm.sh/chart: {{ include "sluice.chart" . }}
{{ include "sluice.selectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Selector labels: the Deployment's selector, the pod's labels, the PodMonitor's selector.
*/}}
{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
The ServiceAccount the pod runs as.
*/}}
{{- define "sluice.serviceAccountName" -}}
{{- default (include "sluice.fullname" .) .Values.sluice.serviceAccount.name }}
{{- end }}

{{/*
redis.gateParams as a JSON object whose values are all strings (upstream's single-queue
--redis.ss.gate-params).
*/}}
{{- define "sluice.gateParamsJson" -}}
{{- $out := dict }}
{{- range $k, $v := .Values.ap.redis.gateParams }}
{{- $_ := set $out $k ($v | toString) }}
{{- end }}
{{- $out | toJson }}
{{- end }}

{{/*
"true" when the container gets REDIS_URL from a Secret: ap.redis.enabled (upstream), or a
transport chosen by sluice.config with ap.redis.url or ap.redis.secretName set.
*/}}
{{- define "sluice.redisEnv" -}}
{{- if .Values.ap.redis.enabled }}true
{{- else if and (.Values.sluice.config | default dict).transport (or .Values.ap.redis.url .Values.ap.redis.secretName) }}true
{{- end }}
{{- end }}

{{/*
The Secret REDIS_URL reads: <fullname>-redis when ap.redis.url is set (the chart creates it),
else ap.redis.secretName.
*/}}
{{- define "sluice.redisSecretName" -}}
{{- if .Values.ap.redis.url }}
{{- printf "%s-redis" (include "sluice.fullname" .) }}
{{- else }}
{{- .Values.ap.redis.secretName }}
{{- end }}
{{- end }}

{{/*
The key of that Secret: url when the chart creates it, else ap.redis.secretKey.
*/}}
{{- define "sluice.redisSecretKey" -}}
{{- if .Values.ap.redis.url }}url
{{- else }}
{{- .Values.ap.redis.secretKey }}
{{- end }}
{{- end }}

{{/*
"true" when the config ConfigMap <fullname>-config is rendered (and mounted at
/etc/llm-d-async/config).
*/}}
{{- define "sluice.configMapEnabled" -}}
{{- if or .Values.ap.workerPools .Values.ap.gcpPubSub.topicsConfig .Values.ap.transformConfig .Values.ap.requestMergePolicyConfig .Values.sluice.config }}true{{ end }}
{{- end }}

{{/*
The name of the cluster-scoped RBAC objects: they carry the namespace, since two releases of
the same name in two namespaces would otherwise share them.
*/}}
{{- define "sluice.clusterRBACName" -}}
{{- printf "%s-%s" .Release.Namespace (include "sluice.fullname" .) }}
{{- end }}
