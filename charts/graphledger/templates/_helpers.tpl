{{/* Names ------------------------------------------------------------------------------------------ */}}

{{- define "graphledger.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release full name, at most 50 characters so "<fullname>-projector" etc. stay valid names. */}}
{{- define "graphledger.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "graphledger.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The read API's Service. Not "<fullname>-api": Kubernetes gives every pod in the namespace
<SERVICE>_PORT=tcp://... variables for each Service (enableServiceLinks), and a Service named
"graphledger-api" would set GRAPHLEDGER_API_PORT in every agent pod beside it, which is a setting.
*/}}
{{- define "graphledger.apiServiceName" -}}
{{- printf "%s-read-api" (include "graphledger.fullname" .) }}
{{- end }}

{{- define "graphledger.apiUrl" -}}
{{- $scheme := ternary "https" "http" (not (empty .Values.api.tls.existingSecret)) }}
{{- printf "%s://%s.%s.svc.%s:%v" $scheme (include "graphledger.apiServiceName" .) .Release.Namespace .Values.clusterDomain .Values.api.service.port }}
{{- end }}

{{/* Where the pods that verify the read API's certificate find its CA (empty: the system CAs). */}}
{{- define "graphledger.apiCaFile" -}}
{{- if and .Values.api.tls.existingSecret .Values.api.tls.caKey }}
{{- printf "%s/ca.crt" .Values.api.tls.mountPath }}
{{- end }}
{{- end }}

{{- define "graphledger.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "graphledger.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Labels ----------------------------------------------------------------------------------------- */}}

{{- define "graphledger.selectorLabels" -}}
app.kubernetes.io/name: {{ include "graphledger.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "graphledger.labels" -}}
helm.sh/chart: {{ include "graphledger.chart" . }}
{{ include "graphledger.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: graphledger
{{- end }}

{{/* dict "root" $ "component" "api" */}}
{{- define "graphledger.componentSelectorLabels" -}}
{{ include "graphledger.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "graphledger.componentLabels" -}}
{{ include "graphledger.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Image ------------------------------------------------------------------------------------------ */}}

{{- define "graphledger.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Configuration ---------------------------------------------------------------------------------- */}}

{{- define "graphledger.kafkaUsesSasl" -}}
{{- if hasPrefix "SASL_" .Values.kafka.securityProtocol }}true{{ end }}
{{- end }}

{{- define "graphledger.kafkaUsesTls" -}}
{{- if hasSuffix "SSL" .Values.kafka.securityProtocol }}true{{ end }}
{{- end }}

{{- define "graphledger.kafkaTlsFiles" -}}
{{- if or .Values.kafka.tls.caSecret.name .Values.kafka.tls.clientCertSecret.name }}true{{ end }}
{{- end }}

{{/* Fails the render on a combination of values that cannot work, naming the value to fix. */}}
{{- define "graphledger.validate" -}}
{{- $k := .Values.kafka }}
{{- $_ := required "kafka.bootstrapServers is required: the Kafka bootstrap servers, host:port[,host:port...]" $k.bootstrapServers }}
{{- $_ := required "postgres.existingSecret is required: the name of a Secret holding the Postgres DSN (key postgres.dsnKey)" .Values.postgres.existingSecret }}
{{- if include "graphledger.kafkaUsesSasl" . }}
{{- if not $k.sasl.mechanism }}
{{- fail (printf "kafka.sasl.mechanism is required with kafka.securityProtocol %s: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512" $k.securityProtocol) }}
{{- end }}
{{- if not $k.sasl.existingSecret }}
{{- fail (printf "kafka.sasl.existingSecret is required with kafka.securityProtocol %s: the Secret holding the SASL password" $k.securityProtocol) }}
{{- end }}
{{- if and (not $k.sasl.username) (not $k.sasl.usernameKey) }}
{{- fail "kafka.sasl.username (or kafka.sasl.usernameKey, read from kafka.sasl.existingSecret) is required with SASL" }}
{{- end }}
{{- end }}
{{- if and (include "graphledger.kafkaTlsFiles" .) (not (include "graphledger.kafkaUsesTls" .)) }}
{{- fail (printf "kafka.tls secrets are set but kafka.securityProtocol is %s: use SSL or SASL_SSL" $k.securityProtocol) }}
{{- end }}
{{- if not .Values.auth.existingSecret }}
{{- if .Values.api.ingress.enabled }}
{{- fail "api.ingress.enabled needs auth.existingSecret: an Ingress never exposes a read API without a token (auth.allowAnonymous does not apply to it)" }}
{{- end }}
{{- if not .Values.auth.allowAnonymous }}
{{- fail "auth.existingSecret is required: the Secret holding the read API's token (key auth.tokenKey) or token hashes (key auth.tokenHashesKey). To serve reads without any token, set auth.allowAnonymous: true" }}
{{- end }}
{{- if .Values.erasure.encryptEvents }}
{{- fail "auth.allowAnonymous needs erasure.encryptEvents false: agents seal events with data keys from the read API, which hands them only to a token; name auth.existingSecret instead" }}
{{- end }}
{{- end }}
{{- $projection := .Values.postgres.schema }}
{{- $keyStore := .Values.postgres.keyStoreSchema }}
{{- if or (eq $keyStore $projection) (eq $keyStore (printf "%s_rebuild" $projection)) (hasPrefix (printf "%s_old_" $projection) $keyStore) }}
{{- fail (printf "postgres.keyStoreSchema %s is postgres.schema %s or one of its replay schemas, which a replay renames and drops with the keys in them: give the key store a schema of its own" $keyStore $projection) }}
{{- end }}
{{- $inSync := .Values.topics.minInsyncReplicas }}
{{- if and (not (kindIs "invalid" $inSync)) (gt (int $inSync) (int .Values.topics.replicationFactor)) }}
{{- fail (printf "topics.minInsyncReplicas %d exceeds topics.replicationFactor %d: the brokers would refuse every write" (int $inSync) (int .Values.topics.replicationFactor)) }}
{{- end }}
{{- if and .Values.projector.keda.enabled .Values.projector.autoscaling.enabled }}
{{- fail "projector.keda.enabled and projector.autoscaling.enabled exclude each other: pick one" }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.enabled) }}
{{- fail "metrics.serviceMonitor.enabled needs metrics.enabled" }}
{{- end }}
{{- if and .Values.metrics.prometheusRule.enabled (not .Values.metrics.enabled) }}
{{- fail "metrics.prometheusRule.enabled needs metrics.enabled: the alerts query the services' metrics" }}
{{- end }}
{{- end }}

{{/* Key-encryption keys ---------------------------------------------------------------------------- */}}

{{/* The Secret the chart makes when erasure.keyEncryptionKeys.existingSecret names none. */}}
{{- define "graphledger.managedKekSecretName" -}}
{{- printf "%s-key-encryption-keys" (include "graphledger.fullname" .) }}
{{- end }}

{{/* The key of that Secret holding GRAPHLEDGER_KEY_ENCRYPTION_KEYS; fixed, so no value can orphan it. */}}
{{- define "graphledger.managedKekKey" -}}
keys
{{- end }}

{{/*
"true" when the release owns the key-encryption keys' Secret: no existing Secret is named, and events
are sealed or the Secret already exists (a log once sealed needs its keys after encryption is off).
*/}}
{{- define "graphledger.managesKek" -}}
{{- if not .Values.erasure.keyEncryptionKeys.existingSecret }}
{{- if or .Values.erasure.encryptEvents (lookup "v1" "Secret" .Release.Namespace (include "graphledger.managedKekSecretName" .)) }}true{{ end }}
{{- end }}
{{- end }}

{{/* The Secret the services read GRAPHLEDGER_KEY_ENCRYPTION_KEYS from; empty when they get none. */}}
{{- define "graphledger.kekSecretName" -}}
{{- if .Values.erasure.keyEncryptionKeys.existingSecret }}
{{- .Values.erasure.keyEncryptionKeys.existingSecret }}
{{- else if include "graphledger.managesKek" . }}
{{- include "graphledger.managedKekSecretName" . }}
{{- end }}
{{- end }}

{{- define "graphledger.kekSecretKey" -}}
{{- if .Values.erasure.keyEncryptionKeys.existingSecret }}
{{- .Values.erasure.keyEncryptionKeys.key }}
{{- else }}
{{- include "graphledger.managedKekKey" . }}
{{- end }}
{{- end }}

{{/*
The non-secret GRAPHLEDGER_* and OTEL_* variables, as a YAML map of strings: the ConfigMap's data,
and the hook Jobs' env (they run before the ConfigMap exists).
*/}}
{{- define "graphledger.configData" -}}
{{- $k := .Values.kafka -}}
GRAPHLEDGER_KAFKA_BOOTSTRAP_SERVERS: {{ $k.bootstrapServers | quote }}
GRAPHLEDGER_KAFKA_SECURITY_PROTOCOL: {{ $k.securityProtocol | quote }}
GRAPHLEDGER_KAFKA_IDEMPOTENCE: {{ $k.idempotence | toString | quote }}
{{- if include "graphledger.kafkaUsesSasl" . }}
GRAPHLEDGER_KAFKA_SASL_MECHANISM: {{ $k.sasl.mechanism | quote }}
{{- if not $k.sasl.usernameKey }}
GRAPHLEDGER_KAFKA_SASL_USERNAME: {{ $k.sasl.username | quote }}
{{- end }}
{{- end }}
{{- if $k.tls.caSecret.name }}
GRAPHLEDGER_KAFKA_SSL_CAFILE: {{ printf "%s/ca.crt" $k.tls.mountPath | quote }}
{{- end }}
{{- if $k.tls.clientCertSecret.name }}
GRAPHLEDGER_KAFKA_SSL_CERTFILE: {{ printf "%s/client.crt" $k.tls.mountPath | quote }}
GRAPHLEDGER_KAFKA_SSL_KEYFILE: {{ printf "%s/client.key" $k.tls.mountPath | quote }}
{{- end }}
GRAPHLEDGER_TOPIC_PREFIX: {{ .Values.topics.prefix | quote }}
GRAPHLEDGER_TOPIC_PARTITIONS: {{ .Values.topics.partitions | toString | quote }}
GRAPHLEDGER_TOPIC_REPLICATION_FACTOR: {{ .Values.topics.replicationFactor | toString | quote }}
{{- if not (kindIs "invalid" .Values.topics.minInsyncReplicas) }}
GRAPHLEDGER_TOPIC_MIN_INSYNC_REPLICAS: {{ .Values.topics.minInsyncReplicas | toString | quote }}
{{- end }}
GRAPHLEDGER_TOPIC_ALLOW_SINGLE_BROKER_ACKS: {{ .Values.topics.ensure.allowSingleBrokerAcks | toString | quote }}
GRAPHLEDGER_POSTGRES_SCHEMA: {{ .Values.postgres.schema | quote }}
GRAPHLEDGER_KEY_STORE_SCHEMA: {{ .Values.postgres.keyStoreSchema | quote }}
GRAPHLEDGER_PROJECTOR_GROUP_ID: {{ .Values.projector.groupId | quote }}
GRAPHLEDGER_API_HOST: {{ .Values.api.host | quote }}
GRAPHLEDGER_API_PORT: {{ .Values.api.port | toString | quote }}
{{- if .Values.api.tls.existingSecret }}
GRAPHLEDGER_API_TLS_CERTFILE: {{ printf "%s/tls.crt" .Values.api.tls.mountPath | quote }}
GRAPHLEDGER_API_TLS_KEYFILE: {{ printf "%s/tls.key" .Values.api.tls.mountPath | quote }}
{{- end }}
GRAPHLEDGER_HEALTH_HOST: "0.0.0.0"
GRAPHLEDGER_HEALTH_PORT: {{ .Values.health.port | toString | quote }}
GRAPHLEDGER_ENCRYPT_EVENTS: {{ .Values.erasure.encryptEvents | toString | quote }}
{{- range $key, $value := .Values.config }}
{{ $key }}: {{ $value | toString | quote }}
{{- end }}
{{- with .Values.otel }}
{{- if .endpoint }}
OTEL_EXPORTER_OTLP_ENDPOINT: {{ .endpoint | quote }}
OTEL_EXPORTER_OTLP_PROTOCOL: {{ .protocol | quote }}
{{- end }}
{{- end }}
{{- $attributes := list (printf "service.namespace=%s" (include "graphledger.fullname" .)) (printf "k8s.namespace.name=%s" .Release.Namespace) }}
{{- range $key, $value := .Values.otel.resourceAttributes }}
{{- $attributes = append $attributes (printf "%s=%v" $key $value) }}
{{- end }}
OTEL_RESOURCE_ATTRIBUTES: {{ join "," $attributes | quote }}
{{- if .Values.metrics.enabled }}
OTEL_EXPORTER_PROMETHEUS_HOST: "0.0.0.0"
OTEL_EXPORTER_PROMETHEUS_PORT: {{ .Values.metrics.port | toString | quote }}
{{- end }}
{{- end }}

{{/*
Secret variables by reference, each only where it is needed.
dict "root" $ "kafka" true "postgres" true "apiToken" false "kek" false
*/}}
{{- define "graphledger.secretEnv" -}}
{{- $v := .root.Values }}
{{- if .postgres }}
- name: GRAPHLEDGER_POSTGRES_DSN
  valueFrom:
    secretKeyRef:
      name: {{ $v.postgres.existingSecret | quote }}
      key: {{ $v.postgres.dsnKey | quote }}
{{- end }}
{{- if and .kafka (include "graphledger.kafkaUsesSasl" .root) }}
{{- if $v.kafka.sasl.usernameKey }}
- name: GRAPHLEDGER_KAFKA_SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ $v.kafka.sasl.existingSecret | quote }}
      key: {{ $v.kafka.sasl.usernameKey | quote }}
{{- end }}
- name: GRAPHLEDGER_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $v.kafka.sasl.existingSecret | quote }}
      key: {{ $v.kafka.sasl.passwordKey | quote }}
{{- end }}
{{- if and .apiToken $v.auth.existingSecret }}
{{- if $v.auth.tokenHashesKey }}
- name: GRAPHLEDGER_API_TOKEN_HASHES
  valueFrom:
    secretKeyRef:
      name: {{ $v.auth.existingSecret | quote }}
      key: {{ $v.auth.tokenHashesKey | quote }}
{{- else }}
- name: GRAPHLEDGER_API_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ $v.auth.existingSecret | quote }}
      key: {{ $v.auth.tokenKey | quote }}
{{- end }}
{{- end }}
{{- if .kek }}
{{- with include "graphledger.kekSecretName" .root }}
- name: GRAPHLEDGER_KEY_ENCRYPTION_KEYS
  valueFrom:
    secretKeyRef:
      name: {{ . | quote }}
      key: {{ include "graphledger.kekSecretKey" $.root | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* Env of a service container: the ConfigMap, its service name, its secrets, its extraEnv.
dict "root" $ "component" "api" "kafka" true "postgres" true "apiToken" true "kek" true "extraEnv" list */}}
{{- define "graphledger.serviceEnv" -}}
envFrom:
  - configMapRef:
      name: {{ include "graphledger.fullname" .root }}
env:
  - name: OTEL_SERVICE_NAME
    value: {{ printf "graphledger-%s" .component | quote }}
  {{- include "graphledger.secretEnv" . | trim | nindent 2 }}
  {{- with .extraEnv }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/*
Volumes: /tmp always, the Kafka TLS files for pods that talk to Kafka, the read API's certificate and key
("apiTls" "server") or only its CA ("apiTls" "ca"). dict "root" $ "kafka" true "apiTls" "server"
*/}}
{{- define "graphledger.volumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .root.Values.tmpSizeLimit }}
{{- with include "graphledger.apiTlsItems" . }}
- name: api-tls
  secret:
    secretName: {{ $.root.Values.api.tls.existingSecret | quote }}
    defaultMode: 0440
    items:
      {{- . | nindent 6 }}
{{- end }}
{{- $tls := .root.Values.kafka.tls }}
{{- if and .kafka (include "graphledger.kafkaTlsFiles" .root) }}
- name: kafka-tls
  projected:
    defaultMode: 0440
    sources:
      {{- with $tls.caSecret.name }}
      - secret:
          name: {{ . | quote }}
          items:
            - key: {{ $tls.caSecret.key | quote }}
              path: ca.crt
      {{- end }}
      {{- with $tls.clientCertSecret.name }}
      - secret:
          name: {{ . | quote }}
          items:
            - key: {{ $tls.clientCertSecret.certKey | quote }}
              path: client.crt
            - key: {{ $tls.clientCertSecret.keyKey | quote }}
              path: client.key
      {{- end }}
{{- end }}
{{- end }}

{{/* The files of the read API's TLS Secret a pod mounts (see graphledger.volumes); empty: none. */}}
{{- define "graphledger.apiTlsItems" -}}
{{- $tls := .root.Values.api.tls }}
{{- if and $tls.existingSecret (eq (default "" .apiTls) "server") }}
- key: {{ $tls.certKey | quote }}
  path: tls.crt
- key: {{ $tls.keyKey | quote }}
  path: tls.key
{{- end }}
{{- if and $tls.existingSecret $tls.caKey (eq (default "" .apiTls) "ca") }}
- key: {{ $tls.caKey | quote }}
  path: ca.crt
{{- end }}
{{- end }}

{{- define "graphledger.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if include "graphledger.apiTlsItems" . }}
- name: api-tls
  mountPath: {{ .root.Values.api.tls.mountPath }}
  readOnly: true
{{- end }}
{{- if and .kafka (include "graphledger.kafkaTlsFiles" .root) }}
- name: kafka-tls
  mountPath: {{ .root.Values.kafka.tls.mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{/* Pod-level settings shared by every pod of the release. */}}
{{- define "graphledger.podCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
automountServiceAccountToken: false
# Service links would put <SERVICE>_PORT=tcp://... variables beside the GRAPHLEDGER_* settings.
enableServiceLinks: false
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end }}

{{/* Scheduling of a component's pods. dict "root" $ "component" "api" "values" .Values.api */}}
{{- define "graphledger.scheduling" -}}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
topologySpreadConstraints:
{{- if .values.topologySpreadConstraints }}
  {{- toYaml .values.topologySpreadConstraints | nindent 2 }}
{{- else }}
{{- range list "topology.kubernetes.io/zone" "kubernetes.io/hostname" }}
  - maxSkew: 1
    topologyKey: {{ . }}
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "graphledger.componentSelectorLabels" (dict "root" $.root "component" $.component) | trim | nindent 8 }}
    matchLabelKeys:
      - pod-template-hash
{{- end }}
{{- end }}
{{- end }}

{{/* Pod metadata of a component: labels and the annotations that roll pods on config change. */}}
{{- define "graphledger.podMetadata" -}}
metadata:
  labels:
    {{- include "graphledger.componentLabels" (dict "root" .root "component" .component) | trim | nindent 4 }}
    {{- with .root.Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    checksum/config: {{ include (print .root.Template.BasePath "/configmap.yaml") .root | sha256sum }}
    {{- with .root.Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    {{- with .values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}

{{/* A read API probe from its values: its httpGet over HTTPS when the read API serves TLS. */}}
{{- define "graphledger.apiProbe" -}}
{{- $probe := deepCopy .probe }}
{{- if and .root.Values.api.tls.existingSecret (hasKey $probe "httpGet") }}
{{- $_ := set $probe.httpGet "scheme" "HTTPS" }}
{{- end }}
{{- toYaml $probe }}
{{- end }}

{{/* The container port of a worker's /livez and /readyz (the projector, the sweeper). */}}
{{- define "graphledger.healthPort" -}}
- name: health
  containerPort: {{ .Values.health.port }}
  protocol: TCP
{{- end }}

{{- define "graphledger.metricsPort" -}}
{{- if .Values.metrics.enabled }}
- name: metrics
  containerPort: {{ .Values.metrics.port }}
  protocol: TCP
{{- end }}
{{- end }}
