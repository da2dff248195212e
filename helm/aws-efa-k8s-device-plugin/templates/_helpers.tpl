{{/* The chart name, overridable. */}}
{{- define "efa.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of every object: the release name, followed by the chart name
unless the release name already contains it (release "efa" ->
"efa-aws-efa-k8s-device-plugin", as the reference chart names its DaemonSet).
*/}}
{{- define "efa.fullname" -}}
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

{{- define "efa.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The DaemonSet's selector: the one AWS's chart uses, so that `helm upgrade` of
a release of that chart updates its DaemonSet in place (a selector is
immutable). The pods carry it besides the labels below.
*/}}
{{- define "efa.selectorLabels" -}}
name: {{ include "efa.fullname" . }}
{{- end }}

{{/* The release's recommended labels; the Service and ServiceMonitor select by them. */}}
{{- define "efa.instanceLabels" -}}
app.kubernetes.io/name: {{ include "efa.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "efa.labels" -}}
helm.sh/chart: {{ include "efa.chart" . }}
{{ include "efa.instanceLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: device-plugin
app.kubernetes.io/part-of: {{ include "efa.name" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "efa.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) }}
{{- end }}

{{/* The host's sysfs and /dev, mounted at the same paths in the container. */}}
{{- define "efa.sysfsRoot" -}}{{ .Values.hostPaths.sysfs | trimSuffix "/" | default "/" }}{{- end }}
{{- define "efa.devRoot" -}}{{ .Values.hostPaths.dev | trimSuffix "/" | default "/" }}{{- end }}

{{/* Where the rendered config file is mounted in the container. */}}
{{- define "efa.configDir" -}}/etc/efa-k8s-device-plugin{{- end }}

{{/* "true" when the daemon runs in late-binding mode (writes CDI specs). */}}
{{- define "efa.lateBinding" -}}
{{- if eq (toString .Values.alignment.mode) "late-binding" }}true{{ end }}
{{- end }}

{{/* "true" unless the MOFED guard is off (null = the binary's default, warn). */}}
{{- define "efa.mofedGuard" -}}
{{- if ne (toString .Values.guards.mofed.policy) "off" }}true{{ end }}
{{- end }}

{{/*
"true" when the chart mounts alignment.cdiDir read-write: in every mode, not
only late binding, so that after a switch from late binding to another mode
(or a downgrade of the mode) the daemon still reads the CDI specs late binding
wrote for running containers, counts their EFAs as held, and deletes each
spec when its container ends (docs/install.md, "Changing values on a running
cluster"). Empty only when cdiDir is (which late binding refuses).
*/}}
{{- define "efa.cdiDirMounted" -}}
{{- if .Values.alignment.cdiDir }}true{{ end }}
{{- end }}

{{/*
The CDI spec dirs mounted read-only for the MOFED guard, as a JSON list:
guards.mofed.cdiSpecDirs without alignment.cdiDir (that one is mounted
read-write already) and without repeats.
*/}}
{{- define "efa.cdiSpecMounts" -}}
{{- $out := list }}
{{- if include "efa.mofedGuard" . }}
{{- range .Values.guards.mofed.cdiSpecDirs }}
{{- $d := . | trimSuffix "/" }}
{{- if and (include "efa.cdiDirMounted" $) (eq $d ($.Values.alignment.cdiDir | toString | trimSuffix "/")) }}
{{- else if not (has $d $out) }}
{{- $out = append $out $d }}
{{- end }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
The volume name of the CDI spec dir at index .i, path .path: unique by the
index, readable by the path ("cdi-spec-0-etc-cdi").
*/}}
{{- define "efa.cdiVolumeName" -}}
{{- printf "cdi-spec-%d-%s" (int .i) (.path | trimPrefix "/" | replace "/" "-" | replace "_" "-" | replace "." "-" | lower) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The daemon's config file. Options left null are omitted so that the binary's
defaults win; the options the chart's mounts depend on are always written.
*/}}
{{- define "efa.configFile" -}}
{{- $cfg := dict }}
{{- range $k, $v := .Values.config }}
{{- if not (kindIs "invalid" $v) }}
{{- $_ := set $cfg $k $v }}
{{- end }}
{{- end }}
{{- if .Values.metrics.enabled }}
{{- if eq (toString .Values.metrics.bind) "localhost" }}
{{- $_ := set $cfg "metricsAddress" (printf "127.0.0.1:%d" (int .Values.metrics.port)) }}
{{- else if ne (toString .Values.metrics.bind) "hostIP" }}
{{- /* hostIP: the container's EFA_METRICS_ADDRESS, from the downward API. */}}
{{- $_ := set $cfg "metricsAddress" (printf ":%d" (int .Values.metrics.port)) }}
{{- end }}
{{- else }}
{{- $_ := set $cfg "metricsAddress" "" }}
{{- end }}
{{- if or .Values.livenessProbe.enabled .Values.readinessProbe.enabled }}
{{- $_ := set $cfg "probeAddress" (printf ":%d" (int .Values.probePort)) }}
{{- else }}
{{- $_ := set $cfg "probeAddress" "" }}
{{- end }}
{{- with .Values.alignment.mode }}
{{- $_ := set $cfg "alignment" . }}
{{- end }}
{{- if not (kindIs "invalid" .Values.sharing.replicas) }}
{{- $_ := set $cfg "sharingReplicas" .Values.sharing.replicas }}
{{- end }}
{{- if not (kindIs "invalid" .Values.sharing.renameByDefault) }}
{{- $_ := set $cfg "sharingRenameByDefault" .Values.sharing.renameByDefault }}
{{- end }}
{{- range $key, $option := dict "enabled" "deviceHealth" "keepAliveTimeout" "deviceHealthKeepAliveTimeout" "adminErrors" "deviceHealthAdminErrors" "holdDown" "deviceHealthHoldDown" }}
{{- $v := index $.Values.deviceHealth $key }}
{{- if not (kindIs "invalid" $v) }}
{{- $_ := set $cfg $option $v }}
{{- end }}
{{- end }}
{{- /* cdiDir in every mode: the daemon reads late binding's specs after a switch back. */}}
{{- if include "efa.cdiDirMounted" . }}
{{- $_ := set $cfg "cdiDir" .Values.alignment.cdiDir }}
{{- end }}
{{- if include "efa.lateBinding" . }}
{{- with .Values.alignment.cdiHandover }}
{{- $_ := set $cfg "cdiHandover" . }}
{{- end }}
{{- end }}
{{- with .Values.guards.mofed.policy }}
{{- $_ := set $cfg "mofedPolicy" . }}
{{- end }}
{{- if include "efa.mofedGuard" . }}
{{- $_ := set $cfg "cdiSpecDirs" .Values.guards.mofed.cdiSpecDirs }}
{{- end }}
{{- with .Values.guards.dra.policy }}
{{- $_ := set $cfg "draPolicy" . }}
{{- end }}
{{- if not (kindIs "invalid" .Values.guards.dra.drivers) }}
{{- $_ := set $cfg "draDrivers" .Values.guards.dra.drivers }}
{{- end }}
{{- $sysfs := include "efa.sysfsRoot" . }}
{{- if ne $sysfs "/sys" }}
{{- $_ := set $cfg "sysfsRoot" $sysfs }}
{{- end }}
{{- $dev := include "efa.devRoot" . }}
{{- if ne $dev "/dev" }}
{{- $_ := set $cfg "devRoot" $dev }}
{{- end -}}
version: v1
{{ toYaml $cfg }}
{{- end }}

{{/*
The node affinity built from .Values.placement and
.Values.supportedInstanceLabels: one term of the placement requirements, or,
with supportedInstanceLabels.values, one term per key (ORed, as AWS's chart)
each adding "key In values" to them. "root": the chart's context; "dra":
draMonitor's DaemonSet, on the nodes draNodeLabel marks (In, not NotIn).
*/}}
{{- define "efa.defaultNodeAffinity" -}}
{{- $dra := .dra }}
{{- with .root }}
{{- $p := .Values.placement }}
{{- $base := list (dict "key" "kubernetes.io/os" "operator" "In" "values" (list "linux")) }}
{{- with $p.architectures }}
{{- $base = append $base (dict "key" "kubernetes.io/arch" "operator" "In" "values" .) }}
{{- end }}
{{- with $p.excludeComputeTypes }}
{{- $base = append $base (dict "key" "eks.amazonaws.com/compute-type" "operator" "NotIn" "values" .) }}
{{- end }}
{{- with $p.draNodeLabel }}
{{- if .key }}
{{- $base = append $base (dict "key" .key "operator" (ternary "In" "NotIn" $dra) "values" .values) }}
{{- end }}
{{- end }}
{{- $base = concat $base $p.matchExpressions }}
{{- $terms := list }}
{{- $instances := .Values.supportedInstanceLabels }}
{{- if $instances.values }}
{{- range $instances.keys }}
{{- $terms = append $terms (dict "matchExpressions" (append $base (dict "key" . "operator" "In" "values" $instances.values))) }}
{{- end }}
{{- else }}
{{- $terms = list (dict "matchExpressions" $base) }}
{{- end -}}
requiredDuringSchedulingIgnoredDuringExecution:
  nodeSelectorTerms:
    {{- toYaml $terms | nindent 4 }}
{{- end }}
{{- end }}
