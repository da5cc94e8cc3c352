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
redis.gateParams as a JSON object whose values are all strings (the gate_params of the
single sorted-set queue the deprecated values translate into).
*/}}
{{- define "sluice.gateParamsJson" -}}
{{- $out := dict }}
{{- range $k, $v := .Values.ap.redis.gateParams }}
{{- $_ := set $out $k ($v | toString) }}
{{- end }}
{{- $out | toJson }}
{{- end }}

{{/*
The transport the chart renders (--transport=): ap.transport when set (upstream's newer values);
otherwise the one the deprecated values select, as upstream's chart now derives it:
ap.redis.enabled gives redis-sortedset when ap.messageQueueImpl says so and redis-pubsub for any
other value, else ap.gcpPubSub.enabled gives gcp-pubsub (gcp-pubsub-gated included: a topic's
gate_type gates on the --transport path). Empty when none is selected (sluice.config.transport
may still choose one; the chart then renders no transport flag).
*/}}
{{- define "sluice.transport" -}}
{{- if .Values.ap.transport }}
{{- .Values.ap.transport }}
{{- else if .Values.ap.redis.enabled }}
{{- if eq (.Values.ap.messageQueueImpl | default "redis-pubsub") "redis-sortedset" }}redis-sortedset{{ else }}redis-pubsub{{ end }}
{{- else if .Values.ap.gcpPubSub.enabled }}gcp-pubsub
{{- end }}
{{- end }}

{{/*
The transport document (--transport-config): ap.transportConfig without the chart-only
urlSecret key, or the document the deprecated values translate into.
*/}}
{{- define "sluice.transportConfig" -}}
{{- if and .Values.ap.transport (kindIs "map" .Values.ap.transportConfig) }}
{{- omit .Values.ap.transportConfig "urlSecret" | toJson }}
{{- else if .Values.ap.transport }}
{{- .Values.ap.transportConfig | toJson }}
{{- else }}
{{- include "sluice.legacyTransportConfig" . }}
{{- end }}
{{- end }}

{{/*
The deprecated ap.redis.* / ap.gcpPubSub.* / ap.otel.redisTracing values as a transport document,
with the keys upstream's chart translates them into. No Redis "url" is written: REDIS_URL gives it.
  redis-pubsub:    queues (ap.redis.queuesConfig, or one queue "request-queue" on ap.igwBaseURL),
                   enable_tracing.
  redis-sortedset: result_queue_name, poll_interval_ms, batch_size, enable_tracing, queues
                   (ap.redis.queuesConfig, or one queue ap.redis.requestQueueName with
                   ap.redis.gateType and ap.redis.gateParams, every param a string).
  gcp-pubsub:      project_id, result_topic_id, topics (ap.gcpPubSub.topicsConfig, or one topic
                   ap.gcpPubSub.requestSubscriberId on ap.igwBaseURL).
*/}}
{{- define "sluice.legacyTransportConfig" -}}
{{- $ap := .Values.ap }}
{{- $transport := include "sluice.transport" . }}
{{- $doc := dict }}
{{- $tracing := and $ap.otel.redisTracing $ap.otel.endpoint }}
{{- if eq $transport "redis-sortedset" }}
{{- $_ := set $doc "result_queue_name" ($ap.redis.resultQueueName | default "result-list") }}
{{- $_ := set $doc "poll_interval_ms" (int ($ap.redis.pollIntervalMs | default 1000)) }}
{{- $_ := set $doc "batch_size" (int ($ap.redis.batchSize | default 10)) }}
{{- if $tracing }}{{ $_ := set $doc "enable_tracing" true }}{{ end }}
{{- if $ap.redis.queuesConfig }}
{{- $_ := set $doc "queues" $ap.redis.queuesConfig }}
{{- else }}
{{- $queue := dict "queue_name" ($ap.redis.requestQueueName | default "request-sortedset") "igw_base_url" $ap.igwBaseURL "request_path_url" $ap.redis.requestPathURL }}
{{- if $ap.redis.gateType }}
{{- $_ := set $queue "gate_type" $ap.redis.gateType }}
{{- $_ := set $queue "gate_params" (fromJson (include "sluice.gateParamsJson" .)) }}
{{- end }}
{{- $_ := set $doc "queues" (list $queue) }}
{{- end }}
{{- else if eq $transport "redis-pubsub" }}
{{- if $tracing }}{{ $_ := set $doc "enable_tracing" true }}{{ end }}
{{- if $ap.redis.queuesConfig }}
{{- $_ := set $doc "queues" $ap.redis.queuesConfig }}
{{- else }}
{{- $_ := set $doc "queues" (list (dict "queue_name" "request-queue" "igw_base_url" $ap.igwBaseURL "request_path_url" $ap.redis.requestPathURL)) }}
{{- end }}
{{- else if eq $transport "gcp-pubsub" }}
{{- $_ := set $doc "project_id" $ap.gcpPubSub.projectId }}
{{- $_ := set $doc "result_topic_id" $ap.gcpPubSub.resultTopicId }}
{{- if $ap.gcpPubSub.topicsConfig }}
{{- $_ := set $doc "topics" $ap.gcpPubSub.topicsConfig }}
{{- else }}
{{- $_ := set $doc "topics" (list (dict "subscriber_id" $ap.gcpPubSub.requestSubscriberId "igw_base_url" $ap.igwBaseURL "request_path_url" $ap.gcpPubSub.requestPathURL)) }}
{{- end }}
{{- end }}
{{- $doc | toJson }}
{{- end }}

{{/*
ap.transportConfig.urlSecret (a map, or empty), read only with ap.transport set.
*/}}
{{- define "sluice.urlSecret" -}}
{{- $tc := .Values.ap.transportConfig }}
{{- if and .Values.ap.transport (kindIs "map" $tc) (kindIs "map" $tc.urlSecret) }}
{{- $tc.urlSecret | toJson }}
{{- else }}{}
{{- end }}
{{- end }}

{{/*
The Redis URL the chart writes into the Secret <fullname>-redis: urlSecret.url (with
ap.transport), else the deprecated ap.redis.url. Empty: the chart creates no Secret.
*/}}
{{- define "sluice.redisURL" -}}
{{- $us := include "sluice.urlSecret" . | fromJson }}
{{- $us.url | default .Values.ap.redis.url }}
{{- end }}

{{/*
The Secret REDIS_URL reads, in upstream's order: <fullname>-redis for urlSecret.url, the existing
urlSecret.name, <fullname>-redis for ap.redis.url, else ap.redis.secretName. Empty: none.
*/}}
{{- define "sluice.redisSecretName" -}}
{{- $us := include "sluice.urlSecret" . | fromJson }}
{{- if $us.url }}
{{- printf "%s-redis" (include "sluice.fullname" .) }}
{{- else if $us.name }}
{{- $us.name }}
{{- else if .Values.ap.redis.url }}
{{- printf "%s-redis" (include "sluice.fullname" .) }}
{{- else }}
{{- .Values.ap.redis.secretName }}
{{- end }}
{{- end }}

{{/*
The key of that Secret: url when the chart creates it, urlSecret.key (default url) for an existing
urlSecret.name, else ap.redis.secretKey.
*/}}
{{- define "sluice.redisSecretKey" -}}
{{- $us := include "sluice.urlSecret" . | fromJson }}
{{- if $us.url }}url
{{- else if $us.name }}
{{- $us.key | default "url" }}
{{- else if .Values.ap.redis.url }}url
{{- else }}
{{- .Values.ap.redis.secretKey }}
{{- end }}
{{- end }}

{{/*
"true" when the container gets REDIS_URL from a Secret: the rendered transport is a Redis one
(redis-sortedset, redis-pubsub, redis-stream) and a Secret is resolved, as upstream's chart does;
or a transport chosen by sluice.config with ap.redis.url or ap.redis.secretName set.
*/}}
{{- define "sluice.redisEnv" -}}
{{- if include "sluice.transport" . }}
{{- if and (hasPrefix "redis" (include "sluice.transport" .)) (include "sluice.redisSecretName" .) }}true{{ end }}
{{- else if and (.Values.sluice.config | default dict).transport (or .Values.ap.redis.url .Values.ap.redis.secretName) }}true
{{- end }}
{{- end }}

{{/*
"true" when the transport comes from the deprecated values (NOTES.txt warns).
*/}}
{{- define "sluice.deprecatedTransport" -}}
{{- if and (not .Values.ap.transport) (or .Values.ap.redis.enabled .Values.ap.gcpPubSub.enabled) }}true{{ end }}
{{- end }}

{{/*
"true" when the Redis connection comes from the deprecated ap.redis.url / ap.redis.secretName
rather than ap.transportConfig.urlSecret (NOTES.txt warns).
*/}}
{{- define "sluice.deprecatedRedisConnection" -}}
{{- $us := include "sluice.urlSecret" . | fromJson }}
{{- if and (include "sluice.redisEnv" .) (include "sluice.transport" .) (not (or $us.url $us.name)) (or .Values.ap.redis.url .Values.ap.redis.secretName) }}true{{ end }}
{{- end }}

{{/*
"true" when the config ConfigMap <fullname>-config is rendered (and mounted at
/etc/llm-d-async/config). The GCP topics travel inside --transport-config now, as upstream's chart
passes them: no pubsub-topics.json.
*/}}
{{- define "sluice.configMapEnabled" -}}
{{- if or .Values.ap.workerPools .Values.ap.transformConfig .Values.ap.requestMergePolicyConfig .Values.sluice.config }}true{{ end }}
{{- end }}

{{/*
The name of the cluster-scoped RBAC objects: they carry the namespace, since two releases of
the same name in two namespaces would otherwise share them.
*/}}
{{- define "sluice.clusterRBACName" -}}
{{- printf "%s-%s" .Release.Namespace (include "sluice.fullname" .) }}
{{- end }}
