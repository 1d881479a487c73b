{{- define "gateway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gateway.fullname" -}}
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

{{- define "gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gateway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gateway.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "gateway.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "gateway.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gateway.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret holding key-secret, reasoning-keys, keys.json and redis-url. */}}
{{- define "gateway.secretName" -}}
{{- default (include "gateway.fullname" .) .Values.auth.existingSecret }}
{{- end }}

{{/* The gateway pods' image: the CUDA one when they run a model on a GPU (not when an engine tier does). */}}
{{- define "gateway.image" -}}
{{- $cuda := and .Values.gpu.enabled (not .Values.engine.enabled) }}
{{- $tag := .Values.image.tag | default (ternary (printf "%s-cuda" .Chart.AppVersion) .Chart.AppVersion $cuda) }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}

{{- define "gateway.engineImage" -}}
{{- $tag := .Values.image.tag | default (ternary (printf "%s-cuda" .Chart.AppVersion) .Chart.AppVersion .Values.gpu.enabled) }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}

{{/* Engine pods' labels: a name of their own, so that no selector of the API tier (Deployment, Services, PDB)
takes them in. */}}
{{- define "gateway.engineSelectorLabels" -}}
app.kubernetes.io/name: {{ include "gateway.name" . }}-engine
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: engine
{{- end }}

{{- define "gateway.engineLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "gateway.engineSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "gateway.engineName" -}}
{{- printf "%s-engine" (include "gateway.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The engine pods' URLs, one a pod, by their stable names under the headless Service. */}}
{{- define "gateway.engineUrls" -}}
{{- $name := include "gateway.engineName" . }}
{{- $urls := list }}
{{- range $index := until (int .Values.engine.replicas) }}
{{- $urls = append $urls (printf "http://%s-%d.%s.%s.svc:%d" $name $index $name $.Release.Namespace (int $.Values.engine.port)) }}
{{- end }}
{{- join "," $urls }}
{{- end }}

{{/* The engine's options: device cuda on GPU nodes unless set, the graph cache on its volume unless set. */}}
{{- define "gateway.engineOptions" -}}
{{- $options := deepCopy (.Values.engine.options | default dict) }}
{{- if .Values.gpu.enabled }}
{{- $_ := set $options "device" (get $options "device" | default "cuda") }}
{{- end }}
{{- $_ := set $options "cache_dir" (get $options "cache_dir" | default "/var/cache/gpt-oss-gateway") }}
{{- toJson $options }}
{{- end }}

{{/* Seconds a pod may take to stop: the preStop pause, the drain budget, then the cut answers' last events. */}}
{{- define "gateway.terminationGraceSeconds" -}}
{{- add (int .Values.drain.preStopSleepSeconds) (int .Values.drain.seconds) 10 }}
{{- end }}

{{- define "gateway.validate" -}}
{{- $replicas := ternary .Values.autoscaling.maxReplicas .Values.replicaCount .Values.autoscaling.enabled }}
{{- if and (gt (int $replicas) 1) (not (or .Values.redis.url .Values.redis.existingSecret)) }}
{{- fail "more than one replica needs redis.url or redis.existingSecret: stored responses, chains of thought, API keys and limits are shared through Redis" }}
{{- end }}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) }}
{{- fail "autoscaling.minReplicas is above autoscaling.maxReplicas" }}
{{- end }}
{{- if and .Values.engine.enabled (or .Values.gateway.backends (ne .Values.gateway.backend.kind "mock")) }}
{{- fail "engine.enabled serves gateway.models through the engine tier: leave gateway.backend and gateway.backends unset" }}
{{- end }}
{{- if and .Values.redis.existingSecret .Values.redis.url }}
{{- fail "set redis.url or redis.existingSecret, not both" }}
{{- end }}
{{- end }}

{{/* Non-empty when the python sandbox is on with its full isolation (user namespaces in the pod). */}}
{{- define "gateway.pythonSandbox" -}}
{{- $python := (.Values.hostedTools | default dict).python | default dict -}}
{{- if and $python.enabled (ne ($python.isolation | default "strict") "weak") -}}true{{- end -}}
{{- end -}}
