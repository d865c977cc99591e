{{/* Names */}}
{{- define "rhc.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rhc.fullname" -}}
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

{{/* metadata.name of the RayCluster or RayJob */}}
{{- define "rhc.clusterName" -}}
{{- default (include "rhc.fullname" .) .Values.cluster.name }}
{{- end }}

{{- define "rhc.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "rhc.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "rhc.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rhc.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "rhc.credentialsSecret" -}}
{{- if .Values.storage.credentials.existingSecret }}
{{- .Values.storage.credentials.existingSecret }}
{{- else if .Values.storage.credentials.create }}
{{- printf "%s-storage" (include "rhc.fullname" .) }}
{{- end }}
{{- end }}

{{/* The Secret holding the ingest token (key `token`); empty when the token is off. */}}
{{- define "rhc.ingestTokenSecret" -}}
{{- if .Values.collector.ingestToken.enabled }}
{{- default (printf "%s-ingest-token" (include "rhc.fullname" .)) .Values.collector.ingestToken.existingSecret }}
{{- end }}
{{- end }}

{{/* Where the collector reads the ingest token (--ingest-token-file). */}}
{{- define "rhc.ingestTokenDir" -}}
/etc/ray-history-collector/ingest-token
{{- end }}

{{/* OWNER_KIND / OWNER_NAME: automatic for a RayJob, from values otherwise. */}}
{{- define "rhc.ownerKind" -}}
{{- if eq .Values.kind "RayJob" }}rayjob{{ else }}{{ .Values.owner.kind }}{{ end }}
{{- end }}

{{- define "rhc.ownerName" -}}
{{- if eq .Values.kind "RayJob" }}{{ default (include "rhc.clusterName" .) .Values.owner.name }}{{ else }}{{ .Values.owner.name }}{{ end }}
{{- end }}

{{/* Checks that need more than values.schema.json. */}}
{{- define "rhc.validate" -}}
{{- $_ := required "storage.url is required: where the collector uploads, e.g. s3://my-bucket/ray-history, gs://my-bucket, az://my-container or file:///mnt/history" .Values.storage.url }}
{{- $grace := int .Values.terminationGracePeriodSeconds }}
{{- $timeout := int .Values.collector.shutdownTimeoutSeconds }}
{{- if lt $grace (add $timeout 10) }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be at least collector.shutdownTimeoutSeconds (%d) + 10: Kubernetes stops the Ray container first and the collector after it, within the same grace period" $grace $timeout) }}
{{- end }}
{{- if and (eq .Values.kind "None") (not .Values.historyServer.enabled) }}
{{- fail "kind: None renders no Ray object, so it needs historyServer.enabled: true (a release of the history server alone)" }}
{{- end }}
{{- if and (eq .Values.kind "RayJob") (not .Values.rayJob.entrypoint) }}
{{- fail "rayJob.entrypoint is required with kind: RayJob" }}
{{- end }}
{{- if and .Values.owner.kind (not .Values.owner.name) (ne .Values.kind "RayJob") }}
{{- fail "owner.name is required when owner.kind is set" }}
{{- end }}
{{- if eq (int .Values.collector.port) (int .Values.collector.metricsPort) }}
{{- fail (printf "collector.metricsPort (%d) must differ from collector.port (%d): events and the read-only endpoints listen on ports of their own" (int .Values.collector.metricsPort) (int .Values.collector.port)) }}
{{- end }}
{{- if and .Values.storage.credentials.create .Values.storage.credentials.existingSecret }}
{{- fail "storage.credentials: set either existingSecret or create, not both" }}
{{- end }}
{{- /* No public image is published: a made-up default would leave every Ray pod in
       ImagePullBackOff behind its native sidecar, so the user names the image. */}}
{{- $_ := required "image.repository is required: the collector image you built and pushed (docker build -t <registry>/ray-history-collector:<tag> .), e.g. --set image.repository=registry.example.com/ray-history-collector" .Values.image.repository }}
{{- end }}

{{/* The native sidecar. Call with (dict "root" $ "role" "head|worker" "worker" <in a worker group>). */}}
{{- define "rhc.collectorContainer" -}}
{{- $v := .root.Values }}
{{- $c := $v.collector -}}
- name: ray-history-collector
  image: {{ printf "%s:%s" $v.image.repository (default .root.Chart.AppVersion $v.image.tag) | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  # A native sidecar: started before Ray, stopped after it.
  restartPolicy: Always
  args:
    # Events on the pod's loopback only; probes and metrics, read-only, on the pod IP.
    - --listen=127.0.0.1:{{ $c.port }}
    - --metrics-listen=0.0.0.0:{{ $c.metricsPort }}
    - --role={{ .role }}
    - --storage={{ $v.storage.url }}
    - --spool-dir={{ $c.spoolDir }}
    - --max-spool-bytes={{ $c.maxSpoolBytes }}
    - --rotation-interval={{ $c.rotationInterval }}
    - --compression={{ $c.compression }}
    {{- if eq $c.compression "gzip" }}
    - --gzip-level={{ $c.gzipLevel }}
    {{- end }}
    - --shutdown-timeout={{ $c.shutdownTimeoutSeconds }}s
    - --log-format={{ $c.logFormat }}
    {{- if include "rhc.ingestTokenSecret" .root }}
    # Only posts to /v1/events/<token> are Ray's (docs/security.md).
    - --ingest-token-file={{ include "rhc.ingestTokenDir" .root }}/token
    {{- end }}
    {{- range $c.extraArgs }}
    - {{ . | quote }}
    {{- end }}
  env:
    - name: RAY_CLUSTER_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.labels['ray.io/cluster']
    - name: RAY_CLUSTER_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
    - name: POD_IP
      valueFrom:
        fieldRef:
          fieldPath: status.podIP
    - name: RAY_TMP_ROOT
      value: /tmp/ray
    {{- if .worker }}
    # Workers reach the head's dashboard (node id lookup) through its Service.
    - name: FQ_RAY_IP
      value: $(RAY_CLUSTER_NAME)-head-svc.$(RAY_CLUSTER_NAMESPACE).svc
    {{- end }}
    - name: RUST_LOG
      value: {{ $c.logLevel | quote }}
    {{- with include "rhc.ownerKind" .root }}
    - name: OWNER_KIND
      value: {{ . | quote }}
    - name: OWNER_NAME
      value: {{ include "rhc.ownerName" $.root | quote }}
    {{- end }}
    {{- with $v.storage.rootDir }}
    - name: STORAGE_ROOT_DIR
      value: {{ . | quote }}
    {{- end }}
    {{- range $name, $value := $v.storage.env }}
    - name: {{ $name }}
      value: {{ $value | toString | quote }}
    {{- end }}
    {{- with $c.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with include "rhc.credentialsSecret" .root }}
  envFrom:
    - secretRef:
        name: {{ . }}
  {{- end }}
  # Only the read-only port: the events port listens on 127.0.0.1, out of reach of
  # everything outside the pod.
  ports:
    - name: rhc-metrics
      containerPort: {{ $c.metricsPort }}
      protocol: TCP
  {{- with $c.probes.startup }}
  {{- if .enabled }}
  startupProbe:
    httpGet:
      path: /healthz
      port: rhc-metrics
    periodSeconds: {{ .periodSeconds }}
    failureThreshold: {{ .failureThreshold }}
  {{- end }}
  {{- end }}
  {{- with $c.probes.liveness }}
  {{- if .enabled }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: rhc-metrics
    periodSeconds: {{ .periodSeconds }}
    timeoutSeconds: {{ .timeoutSeconds }}
    failureThreshold: {{ .failureThreshold }}
  {{- end }}
  {{- end }}
  {{- with $c.probes.readiness }}
  {{- if .enabled }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: rhc-metrics
    periodSeconds: {{ .periodSeconds }}
    timeoutSeconds: {{ .timeoutSeconds }}
    failureThreshold: {{ .failureThreshold }}
  {{- end }}
  {{- end }}
  {{- with $c.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $c.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: ray-tmp
      mountPath: /tmp/ray
    {{- if include "rhc.ingestTokenSecret" .root }}
    - name: ingest-token
      mountPath: {{ include "rhc.ingestTokenDir" .root }}
      readOnly: true
    {{- end }}
{{- end }}

{{/* The Ray container. Call with (dict "root" $ "name" "ray-head" "group" <values>). */}}
{{- define "rhc.rayContainer" -}}
{{- $v := .root.Values -}}
- name: {{ .name }}
  image: {{ $v.ray.image | quote }}
  imagePullPolicy: {{ $v.ray.imagePullPolicy }}
  env:
    # Ray pushes its events to the collector over the pod's loopback.
    - name: RAY_enable_ray_event
      value: "true"
    - name: RAY_enable_core_worker_ray_event_to_aggregator
      value: "true"
    {{- with include "rhc.ingestTokenSecret" .root }}
    # The collector's ingest token, the last segment of the export address
    # (Kubernetes expands $(RHC_INGEST_TOKEN): it is defined above it).
    - name: RHC_INGEST_TOKEN
      valueFrom:
        secretKeyRef:
          name: {{ . }}
          key: token
    - name: RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR
      value: {{ printf "http://127.0.0.1:%v/v1/events/$(RHC_INGEST_TOKEN)" $v.collector.port | quote }}
    {{- else }}
    - name: RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR
      value: {{ printf "http://127.0.0.1:%v/v1/events" $v.collector.port | quote }}
    {{- end }}
    - name: RAY_DASHBOARD_AGGREGATOR_AGENT_EXPOSABLE_EVENT_TYPES
      value: ALL
    - name: RAY_DASHBOARD_AGGREGATOR_AGENT_PUBLISHER_HTTP_ENDPOINT_EXPOSABLE_EVENT_TYPES
      value: ALL
    {{- with $v.ray.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- if eq .name "ray-head" }}
  ports:
    - name: gcs-server
      containerPort: 6379
    - name: dashboard
      containerPort: 8265
    - name: client
      containerPort: 10001
  {{- end }}
  {{- with .group.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: ray-tmp
      mountPath: /tmp/ray
{{- end }}

{{/* A group's pod template. Call with (dict "root" $ "group" <values> "role" "head|worker" "name" <container name>). */}}
{{- define "rhc.podTemplate" -}}
{{- $v := .root.Values -}}
metadata:
  labels:
    {{- include "rhc.labels" .root | nindent 4 }}
    ray-history-collector/sidecar: "true"
    {{- with $v.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $v.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  serviceAccountName: {{ include "rhc.serviceAccountName" .root }}
  terminationGracePeriodSeconds: {{ $v.terminationGracePeriodSeconds }}
  {{- with $v.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  initContainers:
    {{- include "rhc.collectorContainer" (dict "root" .root "role" .role "worker" (eq .name "ray-worker")) | nindent 4 }}
  containers:
    {{- include "rhc.rayContainer" (dict "root" .root "name" .name "group" .group) | nindent 4 }}
  volumes:
    - name: ray-tmp
      emptyDir: {}
    {{- with include "rhc.ingestTokenSecret" .root }}
    - name: ingest-token
      secret:
        secretName: {{ . }}
        items:
          - key: token
            path: token
    {{- end }}
  {{- with .group.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .group.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .group.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/* rayStartParams: KubeRay wants every value as a string. */}}
{{- define "rhc.rayStartParams" -}}
{{- if . -}}
rayStartParams:
  {{- range $k, $val := . }}
  {{ $k }}: {{ $val | toString | quote }}
  {{- end }}
{{- else -}}
rayStartParams: {}
{{- end }}
{{- end }}

{{/* The RayCluster spec, shared by kind RayCluster and RayJob.spec.rayClusterSpec. */}}
{{- define "rhc.rayClusterSpec" -}}
{{- $root := . -}}
rayVersion: {{ .Values.ray.version | quote }}
headGroupSpec:
  {{- include "rhc.rayStartParams" .Values.head.rayStartParams | nindent 2 }}
  template:
    {{- include "rhc.podTemplate" (dict "root" $root "group" .Values.head "role" (default "head" .Values.head.collectorRole) "name" "ray-head") | nindent 4 }}
{{- with .Values.workerGroups }}
workerGroupSpecs:
  {{- range . }}
  - groupName: {{ .groupName }}
    replicas: {{ .replicas }}
    minReplicas: {{ .minReplicas }}
    maxReplicas: {{ .maxReplicas }}
    {{- include "rhc.rayStartParams" .rayStartParams | nindent 4 }}
    template:
      {{- include "rhc.podTemplate" (dict "root" $root "group" . "role" (default "worker" .collectorRole) "name" "ray-worker") | nindent 6 }}
  {{- end }}
{{- end }}
{{- end }}

{{/* The history server's Deployment and Service. */}}
{{- define "rhc.historyServerName" -}}
{{- printf "%s-history-server" (include "rhc.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rhc.historyServerSelector" -}}
app.kubernetes.io/name: {{ include "rhc.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: history-server
{{- end }}

{{/* Python run in ray.image: copies the ray wheel's built dashboard to /dashboard/build
     without importing ray (find_spec only locates the package). */}}
{{- define "rhc.copyDashboard" -}}
import importlib.util, os, shutil
ray = importlib.util.find_spec('ray').submodule_search_locations[0]
src = os.path.join(ray, 'dashboard', 'client', 'build')
shutil.copytree(src, '/dashboard/build', dirs_exist_ok=True)
print('copied Ray dashboard from', src)
{{- end }}
