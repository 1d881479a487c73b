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

{{- define "gateway.image" -}}
{{- $tag := .Values.image.tag | default (ternary (printf "%s-cuda" .Chart.AppVersion) .Chart.AppVersion .Values.gpu.enabled) }}
{{- printf "%s:%s" .Values.image.repository $tag }}
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
{{- if and .Values.redis.existingSecret .Values.redis.url }}
{{- fail "set redis.url or redis.existingSecret, not both" }}
{{- end }}
{{- end }}

{{/* Non-empty when the python sandbox is on with its full isolation (user namespaces in the pod). */}}
{{- define "gateway.pythonSandbox" -}}
{{- $python := (.Values.hostedTools | default dict).python | default dict -}}
{{- if and $python.enabled (ne ($python.isolation | default "strict") "weak") -}}true{{- end -}}
{{- end -}}
