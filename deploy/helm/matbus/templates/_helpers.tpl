{{/* Chart name, truncated to 63 characters. */}}
{{- define "matbus.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: <release>-<chart>, or the release name when it already holds the
chart name. Truncated to 52 characters so "-discovery" still fits in 63.
*/}}
{{- define "matbus.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "matbus.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "matbus.labels" -}}
helm.sh/chart: {{ include "matbus.chart" . }}
{{ include "matbus.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: matbus
{{- end }}

{{- define "matbus.selectorLabels" -}}
app.kubernetes.io/name: {{ include "matbus.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Namespace of the MAT and BMC Services, the Lease, the Role and RoleBinding. */}}
{{- define "matbus.targetNamespace" -}}
{{- default .Release.Namespace .Values.namespace }}
{{- end }}

{{- define "matbus.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "matbus.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "matbus.leaseName" -}}
{{- default (printf "%s-discovery" (include "matbus.fullname" .)) .Values.discovery.leaderElection.leaseName }}
{{- end }}

{{- define "matbus.natsSecretName" -}}
{{- default (printf "%s-nats" (include "matbus.fullname" .)) .Values.nats.existingSecret }}
{{- end }}

{{- define "matbus.natsHasCredentials" -}}
{{- if .Values.nats.existingSecret }}{{ if .Values.nats.existingSecretHasCredentials }}true{{ end }}{{ else if .Values.nats.credentials }}true{{ end }}
{{- end }}

{{/*
The NATS identity of a part ("discovery" or "worker"), called with
(dict "root" $ "part" "worker"): its own Secret when nats.<part> sets a URL,
credentials or an existing Secret (the users of deploy/nats/), else the
shared one of nats.url / nats.credentials / nats.existingSecret.
*/}}
{{- define "matbus.natsOwn" -}}
{{- $p := index .root.Values.nats .part -}}
{{- if or $p.url $p.credentials $p.existingSecret }}true{{ end }}
{{- end }}

{{- define "matbus.natsSecretNameOf" -}}
{{- $p := index .root.Values.nats .part -}}
{{- if $p.existingSecret }}{{ $p.existingSecret }}
{{- else if include "matbus.natsOwn" . }}{{ printf "%s-nats-%s" (include "matbus.fullname" .root) .part }}
{{- else }}{{ include "matbus.natsSecretName" .root }}{{ end }}
{{- end }}

{{- define "matbus.natsHasCredentialsOf" -}}
{{- $p := index .root.Values.nats .part -}}
{{- if $p.existingSecret }}{{ if $p.existingSecretHasCredentials }}true{{ end }}
{{- else if include "matbus.natsOwn" . }}{{ if $p.credentials }}true{{ end }}
{{- else }}{{ include "matbus.natsHasCredentials" .root }}{{ end }}
{{- end }}

{{/* NATS URL and credentials of a part, from its Secret; (dict "root" $ "part" "worker"). */}}
{{- define "matbus.natsEnv" -}}
- name: MATBUS_NATS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "matbus.natsSecretNameOf" . }}
      key: {{ .root.Values.nats.urlKey }}
{{- if include "matbus.natsHasCredentialsOf" . }}
- name: MATBUS_NATS_CREDS
  value: /etc/matbus/nats/{{ .root.Values.nats.credentialsKey }}
{{- end }}
{{- end }}

{{/* Stream of the sync jobs, as events.Bus.StreamName("SYNC") names it. */}}
{{- define "matbus.syncStream" -}}
{{- printf "%s_SYNC" (.Values.nats.subjectPrefix | replace "." "_" | replace "-" "_" | upper) }}
{{- end }}

{{- define "matbus.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* Environment shared by both containers: pod identity, NATS settings, common flags (the NATS identity is matbus.natsEnv). */}}
{{- define "matbus.commonEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: NAMESPACE
  value: {{ include "matbus.targetNamespace" . | quote }}
- name: MATBUS_SUBJECT_PREFIX
  value: {{ .Values.nats.subjectPrefix | quote }}
- name: MATBUS_STREAM_REPLICAS
  value: {{ .Values.nats.streamReplicas | quote }}
{{- with .Values.nats.tls }}
{{- if .enabled }}
{{- if .caKey }}
- name: MATBUS_NATS_TLS_CA
  value: /etc/matbus/nats-tls/{{ .caKey }}
{{- end }}
{{- if .clientCert }}
- name: MATBUS_NATS_TLS_CERT
  value: /etc/matbus/nats-tls/{{ .certKey }}
- name: MATBUS_NATS_TLS_KEY
  value: /etc/matbus/nats-tls/{{ .keyKey }}
{{- end }}
{{- end }}
{{- end }}
- name: LOG_LEVEL
  value: {{ .Values.common.logLevel | quote }}
- name: MATBUS_LOG_FORMAT
  value: {{ .Values.common.logFormat | quote }}
- name: MATBUS_KUBE_QPS
  value: {{ .Values.common.kubeQPS | quote }}
- name: MATBUS_KUBE_BURST
  value: {{ .Values.common.kubeBurst | quote }}
- name: MATBUS_KUBE_RATE
  value: {{ .Values.common.kubeRate | quote }}
- name: MATBUS_KUBE_QPS_MAX
  value: {{ .Values.common.kubeQPSMax | quote }}
- name: MATBUS_KUBE_MAX_INFLIGHT
  value: {{ .Values.common.kubeMaxInFlight | quote }}
- name: MATBUS_KUBE_LATENCY_TOLERANCE
  value: {{ .Values.common.kubeLatencyTolerance | quote }}
- name: MATBUS_KUBE_COMPRESSION
  value: {{ .Values.common.kubeCompression | quote }}
- name: MATBUS_HEALTH_ADDR
  value: {{ printf ":%v" .Values.common.healthPort | quote }}
- name: MATBUS_PROFILING
  value: {{ .Values.common.profiling | default false | quote }}
{{- end }}

{{/* Volumes and mounts of a part's NATS credentials and TLS files, when there are any; (dict "root" $ "part" "worker"). */}}
{{- define "matbus.natsVolumes" -}}
{{- if include "matbus.natsHasCredentialsOf" . }}
- name: nats-credentials
  secret:
    secretName: {{ include "matbus.natsSecretNameOf" . }}
    defaultMode: 0440
    items:
      - key: {{ .root.Values.nats.credentialsKey }}
        path: {{ .root.Values.nats.credentialsKey }}
{{- end }}
{{- with .root.Values.nats.tls }}
{{- if .enabled }}
- name: nats-tls
  secret:
    secretName: {{ required "nats.tls.secretName is required when nats.tls.enabled is true" .secretName }}
    defaultMode: 0440
    items:
      {{- if .caKey }}
      - key: {{ .caKey }}
        path: {{ .caKey }}
      {{- end }}
      {{- if .clientCert }}
      - key: {{ .certKey }}
        path: {{ .certKey }}
      - key: {{ .keyKey }}
        path: {{ .keyKey }}
      {{- end }}
{{- end }}
{{- end }}
{{- end }}

{{- define "matbus.natsVolumeMounts" -}}
{{- if include "matbus.natsHasCredentialsOf" . }}
- name: nats-credentials
  mountPath: /etc/matbus/nats
  readOnly: true
{{- end }}
{{- if .root.Values.nats.tls.enabled }}
- name: nats-tls
  mountPath: /etc/matbus/nats-tls
  readOnly: true
{{- end }}
{{- end }}

{{/* Whether worker.matCA names a Secret or a ConfigMap. */}}
{{- define "matbus.hasMatCA" -}}
{{- if or .Values.worker.matCA.secret .Values.worker.matCA.configMap }}true{{ end }}
{{- end }}

{{/* The --mat-ca-file path: the key's file in the mat-ca volume. */}}
{{- define "matbus.matCAFile" -}}
/etc/matbus/mat-ca/{{ .Values.worker.matCA.key }}
{{- end }}

{{/* Volume and mount of the MAT CA bundle (worker.matCA), when there is one. */}}
{{- define "matbus.matCAVolumes" -}}
{{- with .Values.worker.matCA }}
{{- if .secret }}
- name: mat-ca
  secret:
    secretName: {{ .secret }}
    defaultMode: 0444
    items:
      - key: {{ .key }}
        path: {{ .key }}
{{- else if .configMap }}
- name: mat-ca
  configMap:
    name: {{ .configMap }}
    defaultMode: 0444
    items:
      - key: {{ .key }}
        path: {{ .key }}
{{- end }}
{{- end }}
{{- end }}

{{- define "matbus.matCAVolumeMounts" -}}
{{- if include "matbus.hasMatCA" . }}
- name: mat-ca
  mountPath: /etc/matbus/mat-ca
  readOnly: true
{{- end }}
{{- end }}

{{/* Liveness and readiness probes on the health port. */}}
{{- define "matbus.probes" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: http
  periodSeconds: 10
  timeoutSeconds: 2
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: http
  periodSeconds: 5
  timeoutSeconds: 2
  failureThreshold: 3
{{- end }}

{{/* Checks of value combinations that cannot work. */}}
{{- define "matbus.validate" -}}
{{- if and .Values.worker.autoscaling.enabled .Values.worker.keda.enabled }}
{{- fail "worker.autoscaling.enabled and worker.keda.enabled are exclusive: KEDA creates its own HorizontalPodAutoscaler" }}
{{- end }}
{{- if not (has .Values.worker.bmcIPMode (list "cluster-ip" "external-ip")) }}
{{- fail (printf "worker.bmcIPMode %q: want cluster-ip or external-ip" .Values.worker.bmcIPMode) }}
{{- end }}
{{- if and .Values.worker.matCA.secret .Values.worker.matCA.configMap }}
{{- fail "worker.matCA.secret and worker.matCA.configMap are exclusive: give the one that holds the CA bundle" }}
{{- end }}
{{- if and (include "matbus.hasMatCA" .) .Values.worker.insecureSkipVerify }}
{{- fail "worker.matCA is set but worker.insecureSkipVerify is true, which ignores it: set worker.insecureSkipVerify=false" }}
{{- end }}
{{- if not .Values.image.repository }}
{{- fail "image.repository is required" }}
{{- end }}
{{- with .Values.gateway }}
{{- if .enabled }}
{{- if not .image }}
{{- fail "gateway.image is required when gateway.enabled is true: matbus ships no gateway image; name yours (registry/repository:tag)" }}
{{- end }}
{{- if not $.Values.discovery.sourceList.addr }}
{{- fail "gateway.enabled needs the sources API: discovery.sourceList.addr must not be empty" }}
{{- end }}
{{- if and .tls.existingSecret .tls.certManager.enabled }}
{{- fail "gateway.tls.existingSecret and gateway.tls.certManager.enabled are exclusive: give the one that makes the gateway's certificate" }}
{{- end }}
{{- if not (or .tls.existingSecret .tls.certManager.enabled) }}
{{- fail "gateway.enabled needs a serving certificate: set gateway.tls.existingSecret or gateway.tls.certManager.enabled" }}
{{- end }}
{{- if and .tls.certManager.enabled (not .tls.certManager.issuerRef.name) }}
{{- fail "gateway.tls.certManager.issuerRef.name is required when gateway.tls.certManager.enabled is true" }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The sources API URL the gateway polls: discovery.sourceList.addr as a
loopback URL (discovery serves it as plain HTTP; an all-addresses listen
address is reached on loopback).
*/}}
{{- define "matbus.gatewaySourcesURL" -}}
{{- $addr := .Values.discovery.sourceList.addr -}}
{{- $port := regexReplaceAll "^.*:" $addr "" -}}
{{- $host := trimSuffix (printf ":%s" $port) $addr -}}
{{- if has $host (list "" "0.0.0.0") }}{{ $host = "127.0.0.1" }}{{ else if eq $host "[::]" }}{{ $host = "[::1]" }}{{ end -}}
http://{{ $host }}:{{ $port }}/v1/sources
{{- end }}

{{- define "matbus.gatewayName" -}}
{{- printf "%s-gateway" (include "matbus.fullname" .) }}
{{- end }}

{{/* The Secret of the gateway's serving certificate. */}}
{{- define "matbus.gatewayTLSSecret" -}}
{{- default (printf "%s-tls" (include "matbus.gatewayName" .)) .Values.gateway.tls.existingSecret }}
{{- end }}

{{/*
The service account token of the matbus container, as the API server's
admission would mount it, for a pod with automountServiceAccountToken false
(so that a second container gets no Kubernetes credentials).
*/}}
{{- define "matbus.kubeAPIAccessVolume" -}}
- name: kube-api-access
  projected:
    defaultMode: 0444
    sources:
      - serviceAccountToken:
          path: token
          expirationSeconds: 3607
      - configMap:
          name: kube-root-ca.crt
          items:
            - key: ca.crt
              path: ca.crt
      - downwardAPI:
          items:
            - path: namespace
              fieldRef:
                apiVersion: v1
                fieldPath: metadata.namespace
{{- end }}

{{- define "matbus.kubeAPIAccessMount" -}}
- name: kube-api-access
  mountPath: /var/run/secrets/kubernetes.io/serviceaccount
  readOnly: true
{{- end }}
