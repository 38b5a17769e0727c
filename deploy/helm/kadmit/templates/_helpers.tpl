{{/* Chart name, overridable. */}}
{{- define "kadmit.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Object name prefix: the release name when it already says kadmit. */}}
{{- define "kadmit.fullname" -}}
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
{{- end -}}

{{/* The namespace every namespaced object goes to. */}}
{{- define "kadmit.namespace" -}}
{{- default .Release.Namespace .Values.namespace.name -}}
{{- end -}}

{{/*
Selector labels: name AND instance, never a generic label alone, so the
Service of one release can never route to another release's (or another
controller's) pods in a shared namespace (the LeaderWorkerSet lesson).
*/}}
{{- define "kadmit.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kadmit.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kadmit.labels" -}}
{{ include "kadmit.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: kadmit
{{- end -}}

{{- define "kadmit.serviceAccountName" -}}
{{- default (include "kadmit.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "kadmit.secretName" -}}
{{- default (printf "%s-tls" (include "kadmit.fullname" .)) .Values.tls.secretName -}}
{{- end -}}

{{- define "kadmit.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}
{{- end -}}

{{/*
The name of this release's MutatingWebhookConfiguration and
ValidatingWebhookConfiguration (kadmit serve --webhook-config-name): the
full name by default, so two releases never share, overwrite or uninstall
each other's webhooks. RBAC resourceNames and `kadmit uninstall` use it too.
*/}}
{{- define "kadmit.webhookConfigurationName" -}}
{{- default (include "kadmit.fullname" .) .Values.webhookConfigurationName | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kadmit.restrictedPodSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "kadmit.restrictedContainerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/*
kadmit watch (watch.enabled): its own name, labels, ServiceAccount and Lease.
Its pods carry app.kubernetes.io/name <name>-watch, so neither the webhook
Service, the serving Deployment nor its PodDisruptionBudget (which select
<name> + instance) ever select them: the watch would report that collision
itself (KD301).
*/}}
{{- define "kadmit.watchName" -}}
{{- printf "%s-watch" (include "kadmit.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kadmit.watchSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-watch" (include "kadmit.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kadmit.watchLabels" -}}
{{ include "kadmit.watchSelectorLabels" . }}
app.kubernetes.io/component: watch
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: kadmit
{{- end -}}

{{- define "kadmit.watchServiceAccountName" -}}
{{- default (include "kadmit.watchName" .) .Values.watch.serviceAccount.name -}}
{{- end -}}

{{- define "kadmit.watchLeaseName" -}}
{{- default (include "kadmit.watchName" .) .Values.watch.leaderElection.leaseName -}}
{{- end -}}
