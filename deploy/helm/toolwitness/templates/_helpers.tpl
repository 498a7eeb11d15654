{{/*
Names, labels and the fixed contract of the toolwitness service (paths, env var
names, mount points), plus the fail-fast checks. Everything a template needs to agree
on with the service lives here, once.
*/}}

{{- define "toolwitness.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "toolwitness.fullname" -}}
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

{{/* terminationGracePeriodSeconds of the sidecar pods: their own, else the scorer's. */}}
{{- define "toolwitness.sidecarGracePeriod" -}}
{{- if kindIs "invalid" .Values.sidecar.terminationGracePeriodSeconds }}
{{- int .Values.terminationGracePeriodSeconds }}
{{- else }}
{{- int .Values.sidecar.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}

{{/* Name of the sidecar's resources. */}}
{{- define "toolwitness.sidecarName" -}}
{{- printf "%s-sidecar" (include "toolwitness.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{- define "toolwitness.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels common to every resource. */}}
{{- define "toolwitness.labels" -}}
helm.sh/chart: {{ include "toolwitness.chart" . }}
app.kubernetes.io/name: {{ include "toolwitness.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: toolwitness
{{- end }}

{{/* Selector labels of the scorer pods (the consumer group members). */}}
{{- define "toolwitness.selectorLabels" -}}
app.kubernetes.io/name: {{ include "toolwitness.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: scorer
{{- end }}

{{/* Selector labels of the OTLP sidecar pods. */}}
{{- define "toolwitness.sidecarSelectorLabels" -}}
app.kubernetes.io/name: {{ include "toolwitness.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: sidecar
{{- end }}

{{- define "toolwitness.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "toolwitness.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Image reference: digest wins over tag; the tag defaults to appVersion. */}}
{{- define "toolwitness.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The service's fixed contract. The admin server serves these paths on config.admin.port;
they are not configurable in the service, so they are not values either.
*/}}
{{- define "toolwitness.livenessPath" -}}/healthz{{- end }}
{{- define "toolwitness.readinessPath" -}}/readyz{{- end }}
{{- define "toolwitness.metricsPath" -}}/metrics{{- end }}
{{- define "toolwitness.configPath" -}}/etc/toolwitness/config.yaml{{- end }}
{{- define "toolwitness.kafkaTlsDir" -}}/etc/toolwitness/kafka-tls{{- end }}
{{- define "toolwitness.saslUsernameEnv" -}}TOOLWITNESS_KAFKA_SASL_USERNAME{{- end }}
{{- define "toolwitness.saslPasswordEnv" -}}TOOLWITNESS_KAFKA_SASL_PASSWORD{{- end }}
{{- define "toolwitness.redisPasswordEnv" -}}TOOLWITNESS_REDIS_PASSWORD{{- end }}

{{/* True ("true") when the Kafka protocol uses SASL / TLS. */}}
{{- define "toolwitness.kafkaSasl" -}}
{{- if has .Values.config.kafka.security.protocol (list "SASL_PLAINTEXT" "SASL_SSL") }}true{{- end }}
{{- end }}
{{- define "toolwitness.kafkaTls" -}}
{{- if has .Values.config.kafka.security.protocol (list "SSL" "SASL_SSL") }}true{{- end }}
{{- end }}

{{/* Path of a Kafka TLS file inside the pod, or "" when that key is not configured. */}}
{{- define "toolwitness.kafkaTlsFile" -}}
{{- $root := index . 0 }}
{{- $key := index . 1 }}
{{- $file := index . 2 }}
{{- if and $root.Values.secrets.kafkaTls.existingSecret $key }}
{{- printf "%s/%s" (include "toolwitness.kafkaTlsDir" $root) $file }}
{{- end }}
{{- end }}

{{/*
Hardened security contexts, identical for every container of this chart and not
overridable: the image is built for them (non-root uid 10001, writes only to /tmp).
*/}}
{{- define "toolwitness.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.podSecurityContext.runAsUser }}
runAsGroup: {{ .Values.podSecurityContext.runAsGroup }}
fsGroup: {{ .Values.podSecurityContext.fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "toolwitness.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.podSecurityContext.runAsUser }}
runAsGroup: {{ .Values.podSecurityContext.runAsGroup }}
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
privileged: false
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
Affinity and topology spread of one Deployment's pods, from a dict: root; affinity
({nodeAffinity, podAffinity, podAntiAffinity}, each passed as written); constraints
(topologySpreadConstraints items); selector (the name of the template of the pods' selector
labels); spread (what the default anti-affinity spreads, for its comment). An empty
podAntiAffinity means a soft spread of the Deployment's own pods over nodes; a constraint
without labelSelector selects the Deployment's own pods.
*/}}
{{- define "toolwitness.placement" -}}
{{- $selector := include .selector .root -}}
affinity:
  {{- with .affinity.nodeAffinity }}
  nodeAffinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .affinity.podAffinity }}
  podAffinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  podAntiAffinity:
    {{- if .affinity.podAntiAffinity }}
    {{- toYaml .affinity.podAntiAffinity | nindent 4 }}
    {{- else }}
    # Default: spread {{ .spread }} over nodes when possible.
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- $selector | nindent 14 }}
    {{- end }}
{{- with .constraints }}
topologySpreadConstraints:
  {{- range . }}
  - maxSkew: {{ int .maxSkew }}
    topologyKey: {{ .topologyKey }}
    whenUnsatisfiable: {{ .whenUnsatisfiable }}
    labelSelector:
      {{- if .labelSelector }}
      {{- toYaml .labelSelector | nindent 6 }}
      {{- else }}
      matchLabels:
        {{- $selector | nindent 8 }}
      {{- end }}
  {{- end }}
{{- end }}
{{- end }}

{{/* Container resources, omitting empty quantities. */}}
{{- define "toolwitness.resources" -}}
{{- $requests := dict }}
{{- range $k, $v := .requests }}{{- if $v }}{{- $_ := set $requests $k $v }}{{- end }}{{- end }}
{{- $limits := dict }}
{{- range $k, $v := .limits }}{{- if $v }}{{- $_ := set $limits $k $v }}{{- end }}{{- end }}
{{- if $requests }}
requests:
  {{- toYaml $requests | nindent 2 }}
{{- end }}
{{- if $limits }}
limits:
  {{- toYaml $limits | nindent 2 }}
{{- end }}
{{- end }}

{{/*
Environment from Secrets (references only). The sidecar only talks to Kafka, so it gets
the Kafka part alone; the scorer gets both.
*/}}
{{- define "toolwitness.secretEnv" -}}
{{- include "toolwitness.kafkaSecretEnv" . }}
{{- include "toolwitness.redisSecretEnv" . }}
{{- end }}

{{- define "toolwitness.kafkaSecretEnv" -}}
{{- include "toolwitness.saslEnv" (list . .Values.secrets.kafkaSasl) }}
{{- end }}

{{/* SASL username/password env from a {existingSecret, usernameKey, passwordKey} (list root secret). */}}
{{- define "toolwitness.saslEnv" -}}
{{- $root := index . 0 }}
{{- $sasl := index . 1 }}
{{- if include "toolwitness.kafkaSasl" $root }}
- name: {{ include "toolwitness.saslUsernameEnv" $root }}
  valueFrom:
    secretKeyRef:
      name: {{ $sasl.existingSecret }}
      key: {{ $sasl.usernameKey }}
- name: {{ include "toolwitness.saslPasswordEnv" $root }}
  valueFrom:
    secretKeyRef:
      name: {{ $sasl.existingSecret }}
      key: {{ $sasl.passwordKey }}
{{- end }}
{{- end }}

{{/*
The sidecar's environment: its OWN span-producer SASL credentials (never the scorer's: that
principal may not write spans and must not sit in the pod agents talk to) and its token.
*/}}
{{- define "toolwitness.sidecarEnv" -}}
{{- include "toolwitness.saslEnv" (list . .Values.sidecar.kafkaSasl) }}
{{- with .Values.sidecar.auth }}
{{- if .existingSecret }}
- name: TOOLWITNESS_SIDECAR_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret }}
      key: {{ .tokenKey }}
{{- end }}
{{- end }}
{{- end }}

{{/* Where the sidecar's listener certificate and key are mounted. */}}
{{- define "toolwitness.sidecarTlsDir" -}}/etc/toolwitness/sidecar-tls{{- end }}

{{/* The sidecar's volumes: config, /tmp, its Kafka TLS files (its own Secret, else the scorer's
CA-only one), its listener certificate. */}}
{{- define "toolwitness.sidecarVolumes" -}}
- name: config
  configMap:
    name: {{ include "toolwitness.fullname" . }}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.tmpVolume.sizeLimit }}
{{- $tls := .Values.sidecar.kafkaTls }}
{{- if not $tls.existingSecret }}{{- $tls = .Values.secrets.kafkaTls }}{{- end }}
{{- if $tls.existingSecret }}
- name: kafka-tls
  secret:
    secretName: {{ $tls.existingSecret }}
    defaultMode: 0440
    items:
      {{- if $tls.caKey }}
      - key: {{ $tls.caKey }}
        path: ca.crt
      {{- end }}
      {{- if $tls.certKey }}
      - key: {{ $tls.certKey }}
        path: tls.crt
      - key: {{ $tls.keyKey }}
        path: tls.key
      {{- end }}
{{- end }}
{{- with .Values.sidecar.tls }}
{{- if .existingSecret }}
- name: sidecar-tls
  secret:
    secretName: {{ .existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ .certKey }}
        path: tls.crt
      - key: {{ .keyKey }}
        path: tls.key
{{- end }}
{{- end }}
{{- end }}

{{- define "toolwitness.redisSecretEnv" -}}
{{- if .Values.secrets.redis.existingSecret }}
- name: {{ include "toolwitness.redisPasswordEnv" . }}
  valueFrom:
    secretKeyRef:
      name: {{ .Values.secrets.redis.existingSecret }}
      key: {{ .Values.secrets.redis.passwordKey }}
{{- end }}
{{- end }}

{{/* Volumes shared by the scorer and the sidecar: config, /tmp, Kafka TLS files. */}}
{{- define "toolwitness.volumes" -}}
- name: config
  configMap:
    name: {{ include "toolwitness.fullname" . }}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.tmpVolume.sizeLimit }}
{{- with .Values.secrets.kafkaTls }}
{{- if .existingSecret }}
- name: kafka-tls
  secret:
    secretName: {{ .existingSecret }}
    defaultMode: 0440
    items:
      {{- if .caKey }}
      - key: {{ .caKey }}
        path: ca.crt
      {{- end }}
      {{- if .certKey }}
      - key: {{ .certKey }}
        path: tls.crt
      - key: {{ .keyKey }}
        path: tls.key
      {{- end }}
{{- end }}
{{- end }}
{{- with .Values.secrets.redisTls }}
{{- if .existingSecret }}
- name: redis-tls
  secret:
    secretName: {{ .existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ .caKey }}
        path: ca.crt
{{- end }}
{{- end }}
{{- end }}

{{/* Where the Redis CA bundle is mounted (secrets.redisTls). */}}
{{- define "toolwitness.redisTlsDir" -}}/etc/toolwitness/redis-tls{{- end }}

{{- define "toolwitness.volumeMounts" -}}
# A single file, so that the Kafka TLS directory can sit beside it under
# /etc/toolwitness; config changes roll the pods (checksum/config) instead of
# relying on ConfigMap volume updates, which subPath mounts do not receive.
- name: config
  mountPath: {{ include "toolwitness.configPath" . }}
  subPath: config.yaml
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- if .Values.secrets.kafkaTls.existingSecret }}
- name: kafka-tls
  mountPath: {{ include "toolwitness.kafkaTlsDir" . }}
  readOnly: true
{{- end }}
{{- if .Values.secrets.redisTls.existingSecret }}
- name: redis-tls
  mountPath: {{ include "toolwitness.redisTlsDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{/* A NetworkPolicy egress rule from {ports, namespaces, podLabels, cidrs}. */}}
{{- define "toolwitness.egressRule" -}}
- ports:
    {{- range .ports }}
    - protocol: TCP
      port: {{ int . }}
    {{- end }}
  {{- if or .namespaces .podLabels .cidrs }}
  to:
    {{- if .namespaces }}
    - namespaceSelector:
        matchExpressions:
          - key: kubernetes.io/metadata.name
            operator: In
            values:
              {{- toYaml .namespaces | nindent 14 }}
      {{- if .podLabels }}
      podSelector:
        matchLabels:
          {{- toYaml .podLabels | nindent 10 }}
      {{- end }}
    {{- else if .podLabels }}
    - podSelector:
        matchLabels:
          {{- toYaml .podLabels | nindent 10 }}
    {{- end }}
    {{- range .cidrs }}
    - ipBlock:
        cidr: {{ . }}
    {{- end }}
  {{- end }}
{{- end }}

{{/* Egress to DNS (UDP and TCP 53). */}}
{{- define "toolwitness.dnsEgressRule" -}}
{{- with .Values.networkPolicy.egress.dns }}
{{- if .enabled }}
- ports:
    - protocol: UDP
      port: 53
    - protocol: TCP
      port: 53
  to:
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: {{ .namespace }}
      {{- if .podLabels }}
      podSelector:
        matchLabels:
          {{- toYaml .podLabels | nindent 10 }}
      {{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The port of config.redis.url ("" for unix://; 6379, redis-py's default, when the URL names
none). The schema has already checked the URL's shape.
*/}}
{{- define "toolwitness.redisPort" -}}
{{- $url := .Values.config.redis.url }}
{{- if not (hasPrefix "unix://" $url) }}
{{- $hostport := regexReplaceAll "^.*@" (regexFind "^[^/?#]*" (regexReplaceAll "^rediss?://" $url "")) "" }}
{{- default "6379" (trimPrefix ":" (regexFind ":[0-9]*$" $hostport)) }}
{{- end }}
{{- end }}

{{/* The ports of config.kafka.bootstrap_servers, as a JSON list of ints (duplicates dropped). */}}
{{- define "toolwitness.kafkaPorts" -}}
{{- $ports := list }}
{{- range splitList "," .Values.config.kafka.bootstrap_servers }}
{{- $ports = append $ports (int (regexFind "[0-9]+$" (trim .))) }}
{{- end }}
{{- uniq $ports | toJson }}
{{- end }}

{{/* The ports the service connects to (list root "kafka"|"redis"), as a JSON list: every port of
config.kafka.bootstrap_servers, or the port of config.redis.url (none for unix://). */}}
{{- define "toolwitness.configuredPorts" -}}
{{- $root := index . 0 }}
{{- if eq (index . 1) "kafka" }}
{{- include "toolwitness.kafkaPorts" $root }}
{{- else }}
{{- $port := include "toolwitness.redisPort" $root }}
{{- ternary (list) (list (atoi $port)) (empty $port) | toJson }}
{{- end }}
{{- end }}

{{/* NetworkPolicy egress ports of Kafka or Redis (list root "kafka"|"redis"), as a JSON list:
networkPolicy.egress.<kind>.ports when set, else the configured ports (above). */}}
{{- define "toolwitness.egressPorts" -}}
{{- $root := index . 0 }}
{{- $explicit := (get $root.Values.networkPolicy.egress (index . 1)).ports }}
{{- if $explicit }}
{{- toJson $explicit }}
{{- else }}
{{- include "toolwitness.configuredPorts" . }}
{{- end }}
{{- end }}

{{/*
Scorer tree shape, as the service checks it (scoring.score.tree.build_scorer_tree): each type
takes only its own keys (TREE_KEYS_BY_TYPE; a key left at false or [] says nothing), needs
the ones it cannot run without, and children are of the family their parent takes. Called
with (list path node); outputs the node's family: "tf" (true/false) or "float".
*/}}
{{- define "toolwitness.validateScorerTree" -}}
{{- $path := index . 0 }}
{{- $node := index . 1 }}
{{- $type := $node.type }}
{{- $takes := dict "otel_tool_call" (list) "substring" (list "substring" "case_sensitive") "plagiarism" (list "reference_text") "composite" (list "aggregator" "scorers") "inverter" (list "scorer") "threshold" (list "scorer" "threshold") "fallback" (list "scorer" "fallback_scorer") }}
{{- $needs := dict "otel_tool_call" (list) "substring" (list "substring") "plagiarism" (list "reference_text") "composite" (list "aggregator" "scorers") "inverter" (list "scorer") "threshold" (list "scorer" "threshold") "fallback" (list "scorer" "fallback_scorer") }}
{{- $own := get $takes $type }}
{{- range $k, $v := $node }}
{{- $unset := and (or (kindIs "bool" $v) (kindIs "slice" $v)) (empty $v) }}
{{- if and (not $unset) (not (has $k (concat (list "type" "categories") $own))) }}
{{- fail (printf "%s: %s does not apply to type %s (it takes: %s)" $path $k $type (default "no other key" (join ", " $own))) }}
{{- end }}
{{- end }}
{{- range $k := get $needs $type }}
{{- $v := get $node $k }}
{{- if or (not (hasKey $node $k)) (eq (toString $v) "") (and (kindIs "slice" $v) (empty $v)) }}
{{- fail (printf "%s: type %s needs %s" $path $type (ternary "a non-empty scorers list" $k (eq $k "scorers"))) }}
{{- end }}
{{- end }}
{{- if eq $type "plagiarism" }}float
{{- else if eq $type "composite" }}
{{- range $i, $child := $node.scorers }}
{{- $p := printf "%s.scorers[%d]" $path $i }}
{{- if ne (include "toolwitness.validateScorerTree" (list $p $child)) "tf" }}
{{- fail (printf "%s: a composite takes true/false scorers only, not %s (float scale): wrap it in a threshold" $p $child.type) }}
{{- end }}
{{- end }}tf
{{- else if eq $type "inverter" }}
{{- if ne (include "toolwitness.validateScorerTree" (list (printf "%s.scorer" $path) $node.scorer)) "tf" }}
{{- fail (printf "%s: an inverter needs a true/false scorer, not %s (float scale)" $path $node.scorer.type) }}
{{- end }}tf
{{- else if eq $type "threshold" }}
{{- if ne (include "toolwitness.validateScorerTree" (list (printf "%s.scorer" $path) $node.scorer)) "float" }}
{{- fail (printf "%s: a threshold needs a float-scale scorer (plagiarism, or a fallback of them), not %s" $path $node.scorer.type) }}
{{- end }}tf
{{- else if eq $type "fallback" }}
{{- $a := include "toolwitness.validateScorerTree" (list (printf "%s.scorer" $path) $node.scorer) }}
{{- $b := include "toolwitness.validateScorerTree" (list (printf "%s.fallback_scorer" $path) $node.fallback_scorer) }}
{{- if ne $a $b }}
{{- fail (printf "%s: fallback: scorer and fallback_scorer must be of the same family (both true/false or both float scale)" $path) }}
{{- end }}
{{- $a }}
{{- else }}tf
{{- end }}
{{- end }}

{{/* A Prometheus duration the schema allows ("<digits>ms|s|m|h") in milliseconds. */}}
{{- define "toolwitness.durationMs" -}}
{{- $factor := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 }}
{{- mul (int64 (regexFind "^[0-9]+" .)) (get $factor (regexFind "[a-z]+$" .)) }}
{{- end }}

{{/*
Fail-fast checks of combinations the schema cannot express. Included by the ConfigMap
(so `helm template` and `helm lint` stop on them) and by NOTES.txt.
*/}}
{{- define "toolwitness.validate" -}}
{{- $v := .Values }}
{{- $sec := $v.config.kafka.security }}
{{- if and (not $v.autoscaling.enabled) (lt (int $v.replicaCount) 1) }}
{{- fail "replicaCount must be at least 1: with 0 consumer-group members nothing consumes the spans topic and deadlines never fire (uninstall instead, or enable autoscaling)" }}
{{- end }}
{{- if lt (int $v.terminationGracePeriodSeconds) 30 }}
{{- fail (printf "terminationGracePeriodSeconds %d is shorter than the service's shutdown: after its in-flight batch it takes up to 30 s (6 steps of at most 5 s) while Kafka or Redis fails, and a pod killed before it leaves the group holds its partitions for config.kafka.session_timeout_ms; use at least 30" (int $v.terminationGracePeriodSeconds)) }}
{{- end }}
{{- if $v.autoscaling.enabled }}
{{- if lt (int $v.autoscaling.minReplicas) 1 }}
{{- fail "autoscaling.minReplicas must be at least 1" }}
{{- end }}
{{- if gt (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas) }}
{{- fail "autoscaling.minReplicas must not exceed autoscaling.maxReplicas" }}
{{- end }}
{{- if and (eq (int $v.autoscaling.targetCPUUtilizationPercentage) 0) (not $v.autoscaling.kafkaLag.enabled) }}
{{- fail "autoscaling needs a metric: set autoscaling.targetCPUUtilizationPercentage > 0 or enable autoscaling.kafkaLag" }}
{{- end }}
{{- if and (gt (int $v.autoscaling.targetCPUUtilizationPercentage) 0) (not $v.resources.requests.cpu) }}
{{- fail "autoscaling.targetCPUUtilizationPercentage is a percentage of resources.requests.cpu, which is empty: the HPA cannot compute the utilization and never scales on CPU; set a CPU request, or set the target to 0 and scale on autoscaling.kafkaLag" }}
{{- end }}
{{- end }}
{{- if include "toolwitness.kafkaSasl" . }}
{{- if not $v.secrets.kafkaSasl.existingSecret }}
{{- fail (printf "config.kafka.security.protocol is %s: set secrets.kafkaSasl.existingSecret to the Secret holding the SASL username and password (the chart never takes credentials as values)" $sec.protocol) }}
{{- end }}
{{- if not $sec.sasl_mechanism }}
{{- fail (printf "config.kafka.security.protocol is %s: set config.kafka.security.sasl_mechanism (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)" $sec.protocol) }}
{{- end }}
{{- else if $sec.sasl_mechanism }}
{{- fail (printf "config.kafka.security.sasl_mechanism is set but protocol %s does not use SASL: use SASL_PLAINTEXT or SASL_SSL, or clear the mechanism" $sec.protocol) }}
{{- else if $v.secrets.kafkaSasl.existingSecret }}
{{- fail (printf "secrets.kafkaSasl.existingSecret is set but protocol %s does not use SASL" $sec.protocol) }}
{{- end }}
{{- with $v.secrets.kafkaTls }}
{{- if and .existingSecret (not (include "toolwitness.kafkaTls" $)) }}
{{- fail (printf "secrets.kafkaTls.existingSecret is set but protocol %s does not use TLS: use SSL or SASL_SSL" $sec.protocol) }}
{{- end }}
{{- if ne (empty .certKey) (empty .keyKey) }}
{{- fail "secrets.kafkaTls.certKey and secrets.kafkaTls.keyKey go together (mutual TLS needs both)" }}
{{- end }}
{{- if and (or .certKey .keyKey) (not .existingSecret) }}
{{- fail "secrets.kafkaTls.certKey/keyKey need secrets.kafkaTls.existingSecret" }}
{{- end }}
{{- if and .existingSecret (not .caKey) (not .certKey) }}
{{- fail "secrets.kafkaTls.existingSecret is set but names no key: set caKey and/or certKey+keyKey" }}
{{- end }}
{{- end }}
{{- if and $v.config.redis.cluster (not (regexMatch "^rediss?://[^/]+(/0?)?$" $v.config.redis.url)) }}
{{- fail "config.redis.cluster: a Redis Cluster is reached over redis:// or rediss:// (database 0 only), e.g. redis://redis-cluster:6379" }}
{{- end }}
{{- if or (regexMatch "^[a-z]+://[^/@]*:[^/@]*@" $v.config.redis.url) (regexMatch "(?i)[?&]password=" $v.config.redis.url) }}
{{- fail "config.redis.url must not carry a password (a user name is fine: redis://user@host): put the password in a Secret and set secrets.redis.existingSecret" }}
{{- end }}
{{- if and $v.secrets.redisTls.existingSecret (not (hasPrefix "rediss://" $v.config.redis.url)) }}
{{- fail "secrets.redisTls.existingSecret is set but config.redis.url is not rediss:// (TLS)" }}
{{- end }}
{{- if and $v.serviceMonitor.enabled $v.networkPolicy.enabled (not $v.networkPolicy.ingress.namespaces) }}
{{- fail "serviceMonitor.enabled with networkPolicy.enabled needs networkPolicy.ingress.namespaces (e.g. [monitoring]): with none the NetworkPolicy blocks every scrape" }}
{{- end }}
{{- if has $v.config.admin.host (list "127.0.0.1" "localhost" "::1") }}
{{- fail (printf "config.admin.host is %s: the kubelet probes /healthz and /readyz (and Prometheus scrapes) on the pod IP, so every pod would fail its probes; use 0.0.0.0" $v.config.admin.host) }}
{{- end }}
{{- $topics := $v.config.kafka.topics }}
{{- $names := list $topics.spans $topics.control $topics.scores $topics.observations $topics.dlq }}
{{- if ne (len (uniq $names)) (len $names) }}
{{- fail (printf "config.kafka.topics: each role needs its own topic (spans, control, scores, observations, dlq are %s): a dead letter written to the spans topic would be read and dead-lettered again forever" (join ", " $names)) }}
{{- end }}
{{- if and $v.serviceMonitor.enabled (not $v.service.enabled) }}
{{- fail "serviceMonitor.enabled needs service.enabled (the ServiceMonitor scrapes the Service's admin port)" }}
{{- end }}
{{- if and $v.sidecar.enabled (include "toolwitness.kafkaSasl" .) (not $v.sidecar.kafkaSasl.existingSecret) }}
{{- fail "sidecar.kafkaSasl.existingSecret: the sidecar writes spans with its own span-producer credentials (a principal in kafkaAcls.spanProducerPrincipals); the scorer's may not write the spans topic and must not sit in the pod agents talk to" }}
{{- end }}
{{- if and $v.sidecar.enabled $v.secrets.kafkaTls.certKey (not $v.sidecar.kafkaTls.existingSecret) }}
{{- fail "sidecar.kafkaTls.existingSecret: the scorer authenticates to Kafka with a client certificate; the sidecar needs its own (a span-producer principal), not the scorer's" }}
{{- end }}
{{- if and $v.sidecar.kafkaTls.existingSecret (not (include "toolwitness.kafkaTls" .)) }}
{{- fail "sidecar.kafkaTls.existingSecret is set but config.kafka.security.protocol does not use TLS" }}
{{- end }}
{{- if and $v.sidecar.kafkaTls.existingSecret (not $v.secrets.kafkaTls.existingSecret) }}
{{- fail "sidecar.kafkaTls.existingSecret needs secrets.kafkaTls.existingSecret too: the shared config names the TLS files only when the scorer has them" }}
{{- end }}
{{- if and $v.sidecar.kafkaTls.existingSecret (ne (empty $v.sidecar.kafkaTls.certKey) (empty $v.secrets.kafkaTls.certKey)) }}
{{- fail "sidecar.kafkaTls.certKey and secrets.kafkaTls.certKey: both sides use a client certificate or neither (the config's ssl_certfile is shared)" }}
{{- end }}
{{- if and $v.sidecar.enabled (eq (int $v.sidecar.port) (int $v.config.admin.port)) }}
{{- fail "sidecar.port must differ from config.admin.port" }}
{{- end }}
{{- if and $v.sidecar.enabled (eq (int $v.sidecar.port) (int $v.sidecar.adminPort)) }}
{{- fail "sidecar.adminPort must differ from sidecar.port (OTLP/gRPC)" }}
{{- end }}
{{- if and $v.podDisruptionBudget.enabled (not $v.autoscaling.enabled) (ge (int $v.podDisruptionBudget.maxUnavailable) (int $v.replicaCount)) (gt (int $v.replicaCount) 1) }}
{{- fail "podDisruptionBudget.maxUnavailable must be lower than replicaCount, or a drain may stop every consumer at once" }}
{{- end }}
{{- with $v.sidecar }}
{{- if and .enabled .podDisruptionBudget.enabled (gt (int .replicaCount) 1) (ge (int .podDisruptionBudget.maxUnavailable) (int .replicaCount)) }}
{{- fail "sidecar.podDisruptionBudget.maxUnavailable must be lower than sidecar.replicaCount, or a drain may evict every sidecar at once (agents' span exports then fail)" }}
{{- end }}
{{- /* The sidecar's shutdown (collector/receivers/otlp_grpc.py run_sidecar): its drain, then up to
5 s for in-flight Export calls, then up to config.kafka.request_timeout_ms to stop its Kafka producer. */}}
{{- $stop := add 5 (div (add (int64 $v.config.kafka.request_timeout_ms) 999) 1000) }}
{{- $grace := include "toolwitness.sidecarGracePeriod" $ | int64 }}
{{- $graceKey := ternary "terminationGracePeriodSeconds" "sidecar.terminationGracePeriodSeconds" (kindIs "invalid" .terminationGracePeriodSeconds) }}
{{- if and .enabled (le $grace (add (int64 .shutdownDelaySeconds) $stop)) }}
{{- fail (printf "%s %d is too short for the sidecar: after SIGTERM it drains for sidecar.shutdownDelaySeconds (%d s), then takes up to %d s to stop (5 s for in-flight Export calls, then config.kafka.request_timeout_ms to stop its Kafka producer); killed earlier, the Export calls then in flight fail and agents must retry them. Raise %s above %d, or shorten sidecar.shutdownDelaySeconds" $graceKey (int $grace) (int .shutdownDelaySeconds) (int $stop) $graceKey (int (add (int64 .shutdownDelaySeconds) $stop))) }}
{{- end }}
{{- end }}
{{- range $name, $tree := $v.config.scorers }}
{{- if eq (include "toolwitness.validateScorerTree" (list (printf "config.scorers.%s" $name) $tree)) "float" }}
{{- fail (printf "config.scorers.%s: a tree's root must be true/false, not %s (float scale): wrap it in a threshold" $name $tree.type) }}
{{- end }}
{{- end }}
{{- range fromJsonArray (include "toolwitness.kafkaPorts" .) }}
{{- if or (lt (int .) 1) (gt (int .) 65535) }}
{{- fail (printf "config.kafka.bootstrap_servers: port %d is not a TCP port (1-65535)" (int .)) }}
{{- end }}
{{- end }}
{{- with include "toolwitness.redisPort" . }}
{{- if or (lt (atoi .) 1) (gt (atoi .) 65535) }}
{{- fail (printf "config.redis.url: port %s is not a TCP port (1-65535)" .) }}
{{- end }}
{{- end }}
{{- if $v.networkPolicy.enabled }}
{{- $settings := dict "kafka" (printf "config.kafka.bootstrap_servers (%s)" $v.config.kafka.bootstrap_servers) "redis" (printf "config.redis.url (%s)" $v.config.redis.url) }}
{{- range $kind := list "kafka" "redis" }}
{{- $allowed := list }}
{{- range (get $v.networkPolicy.egress $kind).ports }}{{- $allowed = append $allowed (int .) }}{{- end }}
{{- if $allowed }}
{{- range fromJsonArray (include "toolwitness.configuredPorts" (list $ $kind)) }}
{{- if not (has (int .) $allowed) }}
{{- fail (printf "networkPolicy.egress.%s.ports %v does not include port %d of %s, so the NetworkPolicy would block it: add the port, or set ports to [] to derive them from %s" $kind $allowed (int .) (get $settings $kind) (index (splitList " " (get $settings $kind)) 0)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- with $v.serviceMonitor }}
{{- if and .enabled (gt (int64 (include "toolwitness.durationMs" .scrapeTimeout)) (int64 (include "toolwitness.durationMs" .interval))) }}
{{- fail (printf "serviceMonitor.scrapeTimeout (%s) must be at most serviceMonitor.interval (%s): Prometheus refuses a scrape timeout longer than the scrape interval" .scrapeTimeout .interval) }}
{{- end }}
{{- end }}
{{- range $v.extraEnv }}
{{- if hasPrefix "TOOLWITNESS_" .name }}
{{- fail (printf "extraEnv %s: TOOLWITNESS_* variables override the service config; set the value under config: instead" .name) }}
{{- end }}
{{- end }}
{{- range $v.envFrom }}
{{- if hasPrefix "TOOLWITNESS_" (.prefix | default "" | upper) }}
{{- fail (printf "envFrom prefix %s: it would make every key of the source a TOOLWITNESS_* service config override; set those under config: instead" .prefix) }}
{{- end }}
{{- end }}
{{- $chartVolumes := list "config" "tmp" "kafka-tls" "redis-tls" }}
{{- $volumes := $chartVolumes }}
{{- range $v.extraVolumes }}
{{- if has .name $volumes }}
{{- fail (printf "extraVolumes %s: the name is %s; choose another" .name (ternary "one of the chart's own volumes (config, tmp, kafka-tls, redis-tls)" "given twice" (has .name $chartVolumes))) }}
{{- end }}
{{- $volumes = append $volumes .name }}
{{- end }}
{{- $chartPaths := list "/tmp" "/etc/toolwitness" (include "toolwitness.configPath" $) (include "toolwitness.kafkaTlsDir" $) (include "toolwitness.redisTlsDir" $) }}
{{- range $v.extraVolumeMounts }}
{{- if not (has .name $volumes) }}
{{- fail (printf "extraVolumeMounts %s: no volume of that name; add it to extraVolumes" .name) }}
{{- end }}
{{- if has (trimSuffix "/" .mountPath) $chartPaths }}
{{- fail (printf "extraVolumeMounts %s: mountPath %s is the chart's own (%s); mount under a new directory, e.g. /etc/toolwitness/%s" .name .mountPath (join ", " $chartPaths) .name) }}
{{- end }}
{{- end }}
{{- end }}
