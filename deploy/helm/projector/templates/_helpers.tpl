{{/* The chart's name, and the name of its resources. */}}
{{- define "projector.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "projector.fullname" -}}
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

{{/* Labels of every resource; "component" is run, relay or api. */}}
{{- define "projector.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "projector.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end }}

{{- define "projector.selectorLabels" -}}
app.kubernetes.io/name: {{ include "projector.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "projector.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
Bytes of a Kubernetes memory quantity in its common forms: a whole number
with an optional binary (Ki, Mi, Gi, Ti) or decimal (k, M, G, T) suffix.
Called with dict "q" QUANTITY "field" NAME, NAME naming the value in the
error.
*/}}
{{- define "projector.bytes" -}}
{{- $q := toString .q }}
{{- if not (regexMatch "^[0-9]+(Ki|Mi|Gi|Ti|k|M|G|T)?$" $q) }}
{{- fail (printf "%s %q: want a whole number of bytes with an optional Ki, Mi, Gi, Ti, k, M, G or T suffix, e.g. 1Gi" .field $q) }}
{{- end }}
{{- $units := dict "" 1 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 }}
{{- $n := regexReplaceAll "^([0-9]+).*$" $q "${1}" | int64 }}
{{- $unit := regexReplaceAll "^[0-9]+" $q "" }}
{{- mul $n (get $units $unit) }}
{{- end }}

{{/*
GOMEMLIMIT for a container: goMemLimitPercent of its memory limit, in
whole MiB; empty without a limit. Called with dict "root" $ "resources"
RESOURCES "field" NAME.
*/}}
{{- define "projector.goMemLimit" -}}
{{- $pct := int .root.Values.goMemLimitPercent }}
{{- if or (lt $pct 1) (gt $pct 100) }}
{{- fail (printf "goMemLimitPercent %v: want a whole percentage of the memory limit from 1 to 100 (80-90 leaves the runtime room)" .root.Values.goMemLimitPercent) }}
{{- end }}
{{- $limit := dig "limits" "memory" "" (.resources | default dict) }}
{{- if $limit }}
{{- $bytes := include "projector.bytes" (dict "q" $limit "field" .field) | int64 }}
{{- printf "%dMiB" (div (div (mul $bytes $pct) 100) 1048576) }}
{{- end }}
{{- end }}

{{/*
The secrets given as files: a list of {name, key, file, env} for each
secret reference that names a Secret. file is its name under
/etc/projector/secrets, env the variable projector reads the path from.
*/}}
{{- define "projector.secretFiles" -}}
{{- $v := .Values }}
{{- $refs := list
  (dict "ref" $v.database.passwordSecret "file" "database-password" "env" "PROJECTOR_DATABASE_PASSWORD_FILE")
  (dict "ref" $v.kafka.tls.caSecret "file" "kafka-ca.crt" "env" "PROJECTOR_KAFKA_TLS_CA_FILE")
  (dict "ref" $v.kafka.tls.certSecret "file" "kafka-client.crt" "env" "PROJECTOR_KAFKA_TLS_CERT_FILE")
  (dict "ref" $v.kafka.tls.keySecret "file" "kafka-client.key" "env" "PROJECTOR_KAFKA_TLS_KEY_FILE")
  (dict "ref" $v.kafka.sasl.passwordSecret "file" "kafka-sasl-password" "env" "PROJECTOR_KAFKA_SASL_PASSWORD_FILE")
  (dict "ref" $v.kafka.sasl.oauthTokenSecret "file" "kafka-sasl-oauth-token" "env" "PROJECTOR_KAFKA_SASL_OAUTH_TOKEN_FILE")
  (dict "ref" $v.registry.passwordSecret "file" "registry-password" "env" "PROJECTOR_REGISTRY_PASSWORD_FILE")
  (dict "ref" $v.registry.caSecret "file" "registry-ca.crt" "env" "PROJECTOR_REGISTRY_TLS_CA_FILE")
}}
{{- $out := list }}
{{- range $refs }}
{{- if .ref.name }}
{{- if not .ref.key }}
{{- fail (printf "the Secret %q for %s names no key" .ref.name .env) }}
{{- end }}
{{- $out = append $out (dict "name" .ref.name "key" .ref.key "file" .file "env" .env) }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
The environment every component shares: where Kafka, the Schema Registry
and PostgreSQL are and how to authenticate, secrets as files.
*/}}
{{- define "projector.commonEnv" -}}
{{- $v := .Values -}}
- name: PROJECTOR_BROKERS
  value: {{ required "kafka.brokers is required" $v.kafka.brokers | quote }}
{{- if $v.registry.url }}
- name: PROJECTOR_REGISTRY_URL
  value: {{ $v.registry.url | quote }}
{{- end }}
{{- if $v.registry.user }}
- name: PROJECTOR_REGISTRY_USER
  value: {{ $v.registry.user | quote }}
{{- end }}
{{- if $v.database.urlSecret.name }}
- name: PROJECTOR_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ $v.database.urlSecret.name }}
      key: {{ required "database.urlSecret.key is required with database.urlSecret.name" $v.database.urlSecret.key }}
{{- else }}
- name: PROJECTOR_DATABASE_URL
  value: {{ required "database.url (or database.urlSecret) is required" $v.database.url | quote }}
{{- end }}
{{- if $v.kafka.tls.enabled }}
- name: PROJECTOR_KAFKA_TLS
  value: "true"
{{- end }}
{{- if $v.kafka.tls.serverName }}
- name: PROJECTOR_KAFKA_TLS_SERVER_NAME
  value: {{ $v.kafka.tls.serverName | quote }}
{{- end }}
{{- if $v.kafka.sasl.mechanism }}
- name: PROJECTOR_KAFKA_SASL_MECHANISM
  value: {{ $v.kafka.sasl.mechanism | quote }}
{{- end }}
{{- if $v.kafka.sasl.username }}
- name: PROJECTOR_KAFKA_SASL_USERNAME
  value: {{ $v.kafka.sasl.username | quote }}
{{- end }}
{{- range (include "projector.secretFiles" . | fromJsonArray) }}
- name: {{ .env }}
  value: /etc/projector/secrets/{{ .file }}
{{- end }}
{{- end }}

{{/* The projected volume of the secrets given as files, if any. */}}
{{- define "projector.secretVolume" -}}
{{- $files := include "projector.secretFiles" . | fromJsonArray }}
{{- if $files }}
- name: secrets
  projected:
    # Readable by the pod's fsGroup only.
    defaultMode: 0440
    sources:
{{- range $files }}
      - secret:
          name: {{ .name }}
          items:
            - key: {{ .key }}
              path: {{ .file }}
{{- end }}
{{- end }}
{{- end }}

{{- define "projector.secretMount" -}}
{{- if (include "projector.secretFiles" . | fromJsonArray) }}
- name: secrets
  mountPath: /etc/projector/secrets
  readOnly: true
{{- end }}
{{- end }}

{{/*
Extra variables given as a map, in name order. Those the chart derives
from other values are refused, so that they cannot contradict them.
*/}}
{{- define "projector.extraEnv" -}}
{{- $derived := dict
  "PROJECTOR_IDENTITY" "identity"
  "PROJECTOR_INSTANCE_ID" "kind: StatefulSet"
  "PROJECTOR_CONFIG" "projections"
  "PROJECTOR_HTTP_ADDR" "httpPort (api.port for the read API)"
  "PROJECTOR_SHUTDOWN_TIMEOUT" "shutdown.timeoutSeconds"
  "PROJECTOR_SHARDS" "relay.shards"
  "PROJECTOR_DATABASE_MAX_CONNS" "database.maxConns"
  "PROJECTOR_BROKERS" "kafka.brokers"
  "PROJECTOR_DATABASE_URL" "database.url or database.urlSecret"
  "GOMEMLIMIT" "resources.limits.memory and goMemLimitPercent"
}}
{{- range $name, $value := . }}
{{- if hasKey $derived $name }}
{{- fail (printf "env %s: set %s instead, from which the chart derives it" $name (get $derived $name)) }}
{{- end }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end }}

{{/* The pod settings every component shares. */}}
{{- define "projector.podSpecCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .Values.serviceAccountName }}
serviceAccountName: {{ .Values.serviceAccountName }}
{{- end }}
# projector talks to no Kubernetes API.
automountServiceAccountToken: false
# No Service variables in the environment: projector reports PROJECTOR_*
# variables that it does not read.
enableServiceLinks: false
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The largest number of members: KEDA's bound or replicas. */}}
{{- define "projector.maxReplicas" -}}
{{- if .Values.autoscaling.enabled }}
{{- default .Values.partitions .Values.autoscaling.maxReplicas }}
{{- else }}
{{- .Values.replicas }}
{{- end }}
{{- end }}
