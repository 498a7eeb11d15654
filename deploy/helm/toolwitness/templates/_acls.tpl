{{/*
The Kafka ACLs toolwitness relies on, as one list that the ACL ConfigMap and NOTES.txt
both render. Each entry: principal, resourceType (topic|group), name, operations, why.
The control topic gets Write for the control-plane principal and for nobody else: the
agent under test produces its own spans and must never be able to register
expectations or declare completion for itself.
*/}}
{{- define "toolwitness.kafkaAcls" -}}
{{- $t := .Values.config.kafka.topics }}
{{- $a := .Values.kafkaAcls }}
{{- range $p := (concat (list $a.controlPlanePrincipal $a.servicePrincipal) $a.spanProducerPrincipals $a.scoreConsumerPrincipals) }}
{{- if not (regexMatch "^[A-Za-z]+:[A-Za-z0-9._@=,*-]+$" $p) }}
{{- fail (printf "kafkaAcls: principal %q must look like Type:name (letters, digits, . _ @ = , * -): it is pasted into shell commands" $p) }}
{{- end }}
{{- end }}
{{- if has $a.controlPlanePrincipal $a.spanProducerPrincipals }}
{{- fail (printf "kafkaAcls: %s is both the control-plane principal and a span producer: the agent under test could then register expectations and declare completion for itself" $a.controlPlanePrincipal) }}
{{- end }}
{{- $acls := list }}
{{- $acls = append $acls (dict "principal" $a.controlPlanePrincipal "resourceType" "topic" "name" $t.control "operations" (list "Write" "Describe") "why" "the control plane is the only writer of expectations and completion markers") }}
{{- if not (has $a.controlPlanePrincipal $a.scoreConsumerPrincipals) }}
{{- range (list $t.scores $t.observations) }}
{{- $acls = append $acls (dict "principal" $a.controlPlanePrincipal "resourceType" "topic" "name" . "operations" (list "Read" "Describe") "why" "the control plane reads the verdicts of what it registered (ToolwitnessClient.wait_for, scores())") }}
{{- end }}
{{- end }}
{{- range $a.spanProducerPrincipals }}
{{- $acls = append $acls (dict "principal" . "resourceType" "topic" "name" $t.spans "operations" (list "Write" "Describe") "why" "span producers write OTLP span batches and nothing else") }}
{{- end }}
{{- $acls = append $acls (dict "principal" $a.servicePrincipal "resourceType" "topic" "name" $t.spans "operations" (list "Read" "Describe") "why" "the scorer consumes spans") }}
{{- $acls = append $acls (dict "principal" $a.servicePrincipal "resourceType" "topic" "name" $t.control "operations" (list "Read" "Describe") "why" "the scorer consumes control messages (read only)") }}
{{- $acls = append $acls (dict "principal" $a.servicePrincipal "resourceType" "group" "name" .Values.config.kafka.group_id "operations" (list "Read" "Describe") "why" "the scorer's consumer group") }}
{{- range (list $t.scores $t.observations $t.dlq) }}
{{- $acls = append $acls (dict "principal" $a.servicePrincipal "resourceType" "topic" "name" . "operations" (list "Write" "Describe") "why" "the scorer publishes here") }}
{{- end }}
{{- range $p := $a.scoreConsumerPrincipals }}
{{- range (list $t.scores $t.observations) }}
{{- $acls = append $acls (dict "principal" $p "resourceType" "topic" "name" . "operations" (list "Read" "Describe") "why" "downstream readers of verdicts") }}
{{- end }}
{{- end }}
{{- toYaml $acls }}
{{- end }}

{{/* The ACL list as kafka-acls.sh commands. */}}
{{- define "toolwitness.kafkaAclCommands" -}}
{{- $acls := include "toolwitness.kafkaAcls" . | fromYamlArray }}
{{- range $acls }}
# {{ .why }}
kafka-acls.sh --bootstrap-server "$BOOTSTRAP" --command-config "$ADMIN_CONFIG" --add --allow-principal {{ .principal | squote }}{{ range .operations }} --operation {{ . }}{{ end }} --{{ .resourceType }} {{ .name | squote }}
{{- end }}
{{- end }}
