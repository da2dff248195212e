{{- /*
The DaemonSet, rendered by daemonset.yaml: "root" is the chart's context;
"dra" true renders draMonitor's, <fullname>-dra, on the nodes
placement.draNodeLabel marks as DRA's, its daemon under draPolicy monitor.
*/ -}}
{{- define "efa.daemonset" }}
{{- $dra := .dra }}
{{- with .root }}
{{- $cdiDir := include "efa.cdiDirMounted" . }}
{{- $cdiSpecMounts := include "efa.cdiSpecMounts" . | fromJsonArray }}
{{- $processCheck := .Values.guards.mofed.processCheck }}
{{- $sysfs := include "efa.sysfsRoot" . }}
{{- $dev := include "efa.devRoot" . }}
{{- $claimLookup := and $dra .Values.draMonitor.claimLookup }}
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: {{ include "efa.fullname" . }}{{ if $dra }}-dra{{ end }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "efa.labels" . | nindent 4 }}
spec:
  selector:
    matchLabels:
      {{- include "efa.selectorLabels" . | nindent 6 }}{{ if $dra }}-dra{{ end }}
  {{- with .Values.updateStrategy }}
  updateStrategy:
    {{- if eq (toString .type) "OnDelete" }}
    type: OnDelete
    {{- else }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
  template:
    metadata:
      labels:
        {{- include "efa.selectorLabels" . | nindent 8 }}{{ if $dra }}-dra{{ end }}
        {{- include "efa.labels" . | nindent 8 }}
        {{- with merge (dict) .Values.podLabels .Values.additionalPodLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      annotations:
        # Rolls the pods when the daemon's config changes.
        checksum/config: {{ include "efa.configFile" . | sha256sum }}
        {{- with omit (merge (dict) .Values.podAnnotations .Values.additionalPodAnnotations) "checksum/config" }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      {{- if $claimLookup }}
      # draMonitor.claimLookup: a token allowed to get resourceclaims alone.
      # The API server's address comes from KUBERNETES_SERVICE_HOST and
      # _PORT, which the kubelet sets even with enableServiceLinks false
      # (pkg/kubelet/kubelet_pods.go getServiceEnvVarMap).
      serviceAccountName: {{ include "efa.fullname" . }}-dra
      automountServiceAccountToken: true
      {{- else }}
      # The daemon never talks to the API server: no token, no RBAC.
      automountServiceAccountToken: false
      {{- end }}
      enableServiceLinks: false
      {{- with .Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      {{- if .Values.hostNetwork }}
      hostNetwork: true
      dnsPolicy: ClusterFirstWithHostNet
      {{- end }}
      {{- if $processCheck }}
      # guards.mofed.processCheck: the NVIDIA device plugin's processes are
      # visible under /proc only in the host's PID namespace.
      hostPID: true
      {{- end }}
      terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}
      {{- with .Values.podSecurityContext }}
      securityContext:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.nodeSelector }}
      nodeSelector:
        {{- /* Label values are strings: true and 1 become "true" and "1". */}}
        {{- range $key, $value := . }}
        {{- if and (kindIs "float64" $value) (eq $value (float64 (int64 $value))) }}
        {{- $value = int64 $value }}
        {{- end }}
        {{ $key }}: {{ toString $value | quote }}
        {{- end }}
      {{- end }}
      affinity:
        {{- if .Values.affinity.nodeAffinity }}
        {{- toYaml .Values.affinity | nindent 8 }}
        {{- else }}
        nodeAffinity:
          {{- include "efa.defaultNodeAffinity" (dict "root" . "dra" $dra) | nindent 10 }}
        {{- with .Values.affinity }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
        {{- end }}
      # CriticalAddonsOnly always (as AWS's chart), then defaultTolerations,
      # then the user's tolerations.
      tolerations:
        {{- $tolerations := concat (list (dict "key" "CriticalAddonsOnly" "operator" "Exists")) .Values.defaultTolerations .Values.tolerations }}
        {{- toYaml (uniq $tolerations) | nindent 8 }}
      containers:
        - name: {{ .Chart.Name }}
          image: {{ include "efa.image" . | quote }}
          imagePullPolicy: {{ .Values.image.pullPolicy }}
          args:
            - --config={{ include "efa.configDir" . }}/config.yaml
            {{- if $dra }}
            - --dra-policy=monitor
            {{- end }}
            {{- if $claimLookup }}
            - --claim-lookup
            {{- end }}
            {{- range .Values.extraArgs }}
            - {{ . | quote }}
            {{- end }}
          {{- $hostIP := and .Values.metrics.enabled (eq (toString .Values.metrics.bind) "hostIP") }}
          {{- if or $hostIP .Values.extraEnv }}
          env:
            {{- if $hostIP }}
            # metrics.bind=hostIP: /metrics on the node's primary address
            # alone (brackets: an IPv6 address too).
            - name: HOST_IP
              valueFrom:
                fieldRef:
                  fieldPath: status.hostIP
            - name: EFA_METRICS_ADDRESS
              value: "[$(HOST_IP)]:{{ .Values.metrics.port }}"
            {{- end }}
            {{- with .Values.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- end }}
          {{- $probes := or .Values.livenessProbe.enabled .Values.readinessProbe.enabled }}
          {{- if or .Values.metrics.enabled $probes }}
          ports:
            {{- if .Values.metrics.enabled }}
            - name: metrics
              containerPort: {{ .Values.metrics.port }}
              protocol: TCP
            {{- end }}
            {{- if $probes }}
            - name: probes
              containerPort: {{ .Values.probePort }}
              protocol: TCP
            {{- end }}
          {{- end }}
          {{- with .Values.livenessProbe }}
          {{- if .enabled }}
          livenessProbe:
            httpGet:
              path: /healthz
              port: probes
            initialDelaySeconds: {{ .initialDelaySeconds }}
            periodSeconds: {{ .periodSeconds }}
            timeoutSeconds: {{ .timeoutSeconds }}
            failureThreshold: {{ .failureThreshold }}
          {{- end }}
          {{- end }}
          {{- with .Values.readinessProbe }}
          {{- if .enabled }}
          readinessProbe:
            httpGet:
              path: /readyz
              port: probes
            initialDelaySeconds: {{ .initialDelaySeconds }}
            periodSeconds: {{ .periodSeconds }}
            timeoutSeconds: {{ .timeoutSeconds }}
            failureThreshold: {{ .failureThreshold }}
          {{- end }}
          {{- end }}
          {{- $sc := deepCopy .Values.securityContext }}
          {{- if $processCheck }}
          {{- $caps := default dict $sc.capabilities }}
          {{- $add := default list $caps.add }}
          {{- if not (has "SYS_PTRACE" $add) }}
          {{- $_ := set $caps "add" (append $add "SYS_PTRACE") }}
          {{- end }}
          {{- $_ := set $sc "capabilities" $caps }}
          {{- end }}
          securityContext:
            {{- toYaml $sc | nindent 12 }}
          {{- with .Values.resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          volumeMounts:
            - name: config
              mountPath: {{ include "efa.configDir" . }}
              readOnly: true
            # Its socket and the kubelet's: read-write.
            - name: device-plugins
              mountPath: /var/lib/kubelet/device-plugins
            # The directory, not the socket: a restarted kubelet's new
            # socket shows through.
            - name: pod-resources
              mountPath: /var/lib/kubelet/pod-resources
              readOnly: true
            - name: plugins-registry
              mountPath: /var/lib/kubelet/plugins_registry
              readOnly: true
            # The host's /dev/infiniband at the same path: the kubelet is
            # given host paths of the uverbs nodes (devRoot).
            - name: dev-infiniband
              mountPath: {{ $dev }}/infiniband
              readOnly: true
            # The host's view of sysfs (the pod's own shows the infiniband
            # class as the pod's network namespace sees it); only these three
            # trees, so no host cgroup, bpf or debug file system comes along.
            - name: sys-bus
              mountPath: {{ $sysfs }}/bus
              readOnly: true
            - name: sys-class
              mountPath: {{ $sysfs }}/class
              readOnly: true
            - name: sys-devices
              mountPath: {{ $sysfs }}/devices
              readOnly: true
            # Read-write in every mode: late binding writes its CDI specs
            # here, and after a switch to another mode the daemon still
            # reads them and deletes each when its container ends.
            {{- if $cdiDir }}
            - name: cdi-dir
              mountPath: {{ .Values.alignment.cdiDir }}
            {{- end }}
            {{- range $i, $path := $cdiSpecMounts }}
            - name: {{ include "efa.cdiVolumeName" (dict "i" $i "path" $path) }}
              mountPath: {{ $path }}
              readOnly: true
            {{- end }}
            {{- with .Values.extraVolumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
      volumes:
        - name: config
          configMap:
            name: {{ include "efa.fullname" . }}
        - name: device-plugins
          hostPath:
            path: {{ .Values.hostPaths.devicePlugins }}
            type: DirectoryOrCreate
        - name: pod-resources
          hostPath:
            path: {{ .Values.hostPaths.podResources }}
            type: DirectoryOrCreate
        - name: plugins-registry
          hostPath:
            path: {{ .Values.hostPaths.pluginsRegistry }}
            type: DirectoryOrCreate
        # Created when missing, so that the pod starts on a node whose EFA
        # driver has not loaded (yet): the device nodes appear in it later.
        - name: dev-infiniband
          hostPath:
            path: {{ $dev }}/infiniband
            type: DirectoryOrCreate
        - name: sys-bus
          hostPath:
            path: {{ $sysfs }}/bus
            type: Directory
        - name: sys-class
          hostPath:
            path: {{ $sysfs }}/class
            type: Directory
        - name: sys-devices
          hostPath:
            path: {{ $sysfs }}/devices
            type: Directory
        {{- if $cdiDir }}
        - name: cdi-dir
          hostPath:
            path: {{ .Values.alignment.cdiDir }}
            type: DirectoryOrCreate
        {{- end }}
        {{- range $i, $path := $cdiSpecMounts }}
        - name: {{ include "efa.cdiVolumeName" (dict "i" $i "path" $path) }}
          hostPath:
            path: {{ $path }}
            type: DirectoryOrCreate
        {{- end }}
        {{- with .Values.extraVolumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
{{- end }}
{{- end }}
