# shellcheck shell=bash
# Checks 8-10: the Helm chart, installed and upgraded from its chart
# repository (scripts/release.sh's) as users do. Sourced by run.sh, not run
# by itself.
# Check 8 needs the apiserver only; 9 and 10 run the chart's pod on the
# kubelet, from the image built from the Dockerfile (EFA_E2E_IMAGE_TAR: an
# archive of `podman save`, imported into the cluster's containerd). The
# chart comes as users get it: from a chart repository (add_chart_repo).
# shellcheck disable=SC2154  # repo: run.sh's checkout
readonly CHART="$repo/helm/aws-efa-k8s-device-plugin"
readonly CHART_REPO_DIR="$E2E_STATE/chart-repo"
readonly CHART_REF="efa/aws-efa-k8s-device-plugin"
CHART_REPO_URL=""  # once added
readonly RELEASE="efa"
readonly CHART_NS="kube-system"
readonly DS_NAME="efa-aws-efa-k8s-device-plugin"   # both charts' name for release efa
readonly INSTANCE_LABEL="node.kubernetes.io/instance-type"
PLUGIN_IMAGE="localhost/efa-k8s-device-plugin:e2e"  # the imported image's name, once imported

# A chart shaped like AWS's (eks/aws-efa-k8s-device-plugin 0.5.30), written
# from its facts: chart name, DaemonSet name, its labels, the selector
# `name: <fullname>`, the pod labels, the container name and the values
# keys. Its container runs whatever image.repository names with the args
# given (the test's busybox, sleeping): AWS's image is not here.
write_aws_shaped_chart() {
  local dir="$1"
  mkdir -p "$dir/templates"
  cat > "$dir/Chart.yaml" <<'EOF'
apiVersion: v1
name: aws-efa-k8s-device-plugin
description: Test fixture shaped like AWS's EFA device plugin chart
version: 0.5.30
appVersion: v0.5.20
EOF
  cat > "$dir/values.yaml" <<'EOF'
image:
  repository: 602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/aws-efa-k8s-device-plugin
  tag: v0.5.20
securityContext: {}
supportedInstanceLabels:
  keys: [node.kubernetes.io/instance-type]
  values: [p4d.24xlarge, p5.48xlarge]
resources:
  requests: {cpu: 10m, memory: 20Mi}
nodeSelector: {}
updateStrategy:
  type: RollingUpdate
tolerations: []
additionalPodAnnotations: {}
additionalPodLabels: {}
nameOverride: ""
fullnameOverride: ""
imagePullSecrets: []
EOF
  cat > "$dir/templates/daemonset.yaml" <<'EOF'
{{- $name := default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- $full := printf "%s-%s" .Release.Name $name }}
{{- if contains $name .Release.Name }}{{ $full = .Release.Name }}{{ end }}
{{- $full = default $full .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- $terms := list }}
{{- range .Values.supportedInstanceLabels.keys }}
{{- $terms = append $terms (dict "matchExpressions" (list (dict "key" . "operator" "In" "values" $.Values.supportedInstanceLabels.values))) }}
{{- end }}
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: {{ $full }}
  labels:
    helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
    app.kubernetes.io/name: {{ $name }}
    app.kubernetes.io/instance: {{ .Release.Name }}
    app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
    app.kubernetes.io/managed-by: {{ .Release.Service }}
spec:
  selector:
    matchLabels: {name: {{ $full }}}
  updateStrategy: {{ toJson .Values.updateStrategy }}
  template:
    metadata:
      annotations: {{ toJson .Values.additionalPodAnnotations }}
      labels: {{ merge (dict "name" $full) .Values.additionalPodLabels | toJson }}
    spec:
      automountServiceAccountToken: false
      hostNetwork: true
      priorityClassName: system-node-critical
      imagePullSecrets: {{ toJson .Values.imagePullSecrets }}
      nodeSelector: {{ toJson .Values.nodeSelector }}
      tolerations: {{ concat (list (dict "key" "CriticalAddonsOnly" "operator" "Exists")) .Values.tolerations | toJson }}
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms: {{ toJson $terms }}
      terminationGracePeriodSeconds: 0
      containers:
        - name: aws-efa-k8s-device-plugin
          image: {{ .Values.image.repository }}:{{ .Values.image.tag }}
          args: ["-c", "exec sleep 86400"]
          securityContext: {{ toJson .Values.securityContext }}
          resources: {{ toJson .Values.resources }}
EOF
}

# The values a test node needs: the imported image, and the simulated node's
# sysfs and /dev; CDI specs looked for, and late binding's written (the chart
# mounts that dir in every mode), in the test's own directory, containerd's
# only one (not the host's /var/run/cdi).
chart_values() {
  printf '%s\n' --set "image.repository=${PLUGIN_IMAGE%:*}" --set "image.tag=${PLUGIN_IMAGE##*:}" \
    --set image.pullPolicy=Never --set "hostPaths.sysfs=$SIM/sys" --set "hostPaths.dev=$DEV_ROOT" \
    --set-json "guards.mofed.cdiSpecDirs=[\"$CDI_DIR\"]" --set "alignment.cdiDir=$CDI_DIR"
}

# The chart repository of a release: scripts/release.sh's packaged chart and
# index.yaml (without the image, which the checks import themselves), served
# over HTTP on 127.0.0.1 (a free port) and added as README tells users
# (`helm repo add efa URL`); the checks then install and upgrade
# $CHART_REF. Once per run.
add_chart_repo() {
  [ -z "$CHART_REPO_URL" ] || return 0
  local out log="$E2E_LOGS/chart-repo.log" port
  # shellcheck disable=SC2154  # repo: run.sh's checkout
  out="$(HELM="$E2E_BIN/helm" EFA_RELEASE_SKIP_IMAGE=1 EFA_RELEASE_DIR="$CHART_REPO_DIR" \
           "$repo/scripts/release.sh" 2>&1)" || why "scripts/release.sh failed: $(flat "$out")" || return 1
  # Debian's python3 (a pyenv shim is a script, not the server's binary).
  : > "$log"
  e2e_start chart-repo /usr/bin/python3 -u -m http.server --bind 127.0.0.1 --directory "$CHART_REPO_DIR" 0
  e2e_wait_for 10 "the chart repository's server to listen" grep -q '^Serving HTTP on 127.0.0.1 port [1-9]' "$log" \
    || why "python3 -m http.server did not start: $(flat "$(cat "$log")")" || return 1
  port="$(sed -n 's/^Serving HTTP on 127.0.0.1 port \([0-9]*\) .*/\1/p' "$log")"
  out="$(e2e_helm repo add efa "http://127.0.0.1:$port" 2>&1)" \
    || why "helm repo add efa http://127.0.0.1:$port failed: $(flat "$out")" || return 1
  CHART_REPO_URL="http://127.0.0.1:$port"
  info "chart repository $CHART_REPO_URL (scripts/release.sh in $CHART_REPO_DIR): $(e2e_helm search repo efa -o json | jq -c '[.[] | [.name, .version]]')"
}

# Whether the repository has served the packaged chart. helm 4 keeps a
# fetched chart in its cache by the index's digest, so only the first check
# to install or upgrade fetches it.
chart_fetched_from_repo() {
  grep -q "\"GET /aws-efa-k8s-device-plugin-$(sed -n 's/^version: *//p' "$CHART/Chart.yaml").tgz HTTP/1.1\" 200" \
    "$E2E_LOGS/chart-repo.log"
}

# Installs a release of the AWS-shaped chart with values as a user gives
# them (placement by instance type, a pod label, a toleration), its pod
# running the test's busybox.
install_aws_shaped_release() {
  local fixture="$E2E_STATE/aws-shaped-chart" out
  write_aws_shaped_chart "$fixture"
  # Client-side apply, as helm 3 (which made the releases users have) does.
  out="$(e2e_helm install "$RELEASE" "$fixture" -n "$CHART_NS" --server-side=false \
          --set "image.repository=${E2E_POD_IMAGE%:*}" --set "image.tag=${E2E_POD_IMAGE##*:}" \
          --set-json 'supportedInstanceLabels.values=["p5.48xlarge","p5en.48xlarge"]' \
          --set additionalPodLabels.team=hpc \
          --set-json 'tolerations=[{"key":"dedicated","operator":"Exists","effect":"NoSchedule"}]' 2>&1)" \
    || why "helm install of the AWS-shaped chart failed: $out"
}

# The one-line upgrade of the chart README's migration section, from the
# chart repository, plus the values of this test node.
upgrade_to_chart() {
  local out values
  add_chart_repo || return 1
  mapfile -t values < <(chart_values)
  out="$(e2e_helm upgrade "$RELEASE" "$CHART_REF" -n "$CHART_NS" --reset-then-reuse-values "${values[@]}" 2>&1)" \
    || why "helm upgrade $RELEASE $CHART_REF from the AWS-shaped release was refused: $(flat "$out")" || return 1
  chart_fetched_from_repo || why "helm upgrade did not fetch the chart from $CHART_REPO_URL (see $E2E_LOGS/chart-repo.log)"
}

ds_json() { e2e_kubectl get daemonset -n "$CHART_NS" "$DS_NAME" -o json 2>/dev/null; }
ds_gone() { ! e2e_kubectl get daemonset -n "$CHART_NS" "$DS_NAME" >/dev/null 2>&1; }
# The chart's pods (AWS's selector, this chart's name label), as JSON.
chart_pods() {
  e2e_kubectl get pods -n "$CHART_NS" -l "name=$DS_NAME,app.kubernetes.io/component=device-plugin" -o json 2>/dev/null
}
chart_pod_field() { chart_pods | jq -r "[.items[] | select(.metadata.deletionTimestamp == null)] | $1"; }
# Exactly one pod of the chart, Running and Ready.
chart_pod_ready() {
  [ "$(chart_pod_field '[.[] | select(.status.phase == "Running" and any(.status.conditions[]?; .type == "Ready" and .status == "True"))] | length')" = 1 ] \
    && [ "$(chart_pod_field 'length')" = 1 ]
}
no_chart_ns_pods() { [ -z "$(e2e_kubectl get pods -n "$CHART_NS" -o name 2>/dev/null)" ]; }

# A release left by a failed check goes first.
no_release() {
  ! e2e_helm status "$RELEASE" -n "$CHART_NS" >/dev/null 2>&1 || uninstall_release \
    || why "cannot uninstall release $RELEASE left by an earlier check"
}

uninstall_release() {
  e2e_helm uninstall "$RELEASE" -n "$CHART_NS" >/dev/null 2>&1
  e2e_wait_for 60 "DaemonSet $DS_NAME to go" ds_gone \
    && e2e_wait_for 90 "the pods of $DS_NAME to go" no_chart_ns_pods
}

# Imports EFA_E2E_IMAGE_TAR into the cluster's containerd; sets PLUGIN_IMAGE.
import_plugin_image() {
  local tar="${EFA_E2E_IMAGE_TAR:-}" ref
  [ -n "$tar" ] || why "EFA_E2E_IMAGE_TAR is not set: build the image from the Dockerfile with podman (see IMAGE-BUILD.md), 'podman save' it and give the archive's path" || return 1
  [ -s "$tar" ] || why "EFA_E2E_IMAGE_TAR=$tar is not a file" || return 1
  # scripts/image.sh saves an OCI archive of a manifest list (its name in
  # index.json); `podman save` a docker archive (its name in manifest.json).
  ref="$(tar -xOf "$tar" index.json 2>/dev/null | jq -r '.manifests[0].annotations["org.opencontainers.image.ref.name"] // empty')"
  [ -n "$ref" ] || ref="$(tar -xOf "$tar" manifest.json 2>/dev/null | jq -r '.[0].RepoTags[0] // empty')"
  [ -n "$ref" ] || why "$tar is neither an OCI archive with a named index (scripts/image.sh makes one) nor a docker archive with a tag (podman save IMAGE -o FILE)" || return 1
  ctr --address "$E2E_CONTAINERD_SOCK" -n k8s.io images import "$tar" >>"$E2E_LOGS/images.log" 2>&1 \
    || why "ctr images import $tar failed (see $E2E_LOGS/images.log)" || return 1
  PLUGIN_IMAGE="$ref"
}

# The host daemon goes, so that the chart's pod is what serves the node.
stop_host_daemon() {
  e2e_stop efa-plugin 10
  e2e_wait_for 60 "allocatable $EFA to drop to 0" node_efa_is allocatable 0 \
    || why "with the daemon stopped allocatable $EFA is '$(node_field allocatable)', expected 0"
}

# The chart's pod runs on the kubelet and serves the node: Ready (readiness
# probe), /healthz and /readyz answer, its process holds no capability,
# cannot gain privileges, is under seccomp and on a read-only root; it
# registered and the node offers $EFA_TOTAL EFAs.
verify_chart_pod() {
  e2e_wait_for 120 "the chart's pod to be Running and Ready" chart_pod_ready \
    || why "the chart's pod is not Running and Ready: $(chart_pod_field '[.[] | {name: .metadata.name, phase: .status.phase, status: .status.containerStatuses}]' | jq -c .)" || return 1
  local pod ip container pid
  pod="$(chart_pod_field '.[0].metadata.name')"
  ip="$(chart_pod_field '.[0].status.podIP')"
  container="$(chart_pod_field '.[0].status.containerStatuses[0].containerID' | sed 's|^containerd://||')"
  local restarts; restarts="$(chart_pod_field '.[0].status.containerStatuses[0].restartCount')"
  [ "$restarts" = 0 ] || why "the chart's pod $pod restarted $restarts times: $(e2e_kubectl logs -n "$CHART_NS" "$pod" --previous 2>&1 | tail -n 5)" || return 1
  local path code
  for path in healthz readyz; do
    code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://$ip:8080/$path")"
    [ "$code" = 200 ] || why "the probes' http://$ip:8080/$path answers $code, expected 200" || return 1
  done
  local unhealthy
  unhealthy="$(e2e_kubectl get events -n "$CHART_NS" --field-selector "involvedObject.name=$pod,reason=Unhealthy" -o name 2>/dev/null)"
  [ -z "$unhealthy" ] || why "probe failures of $pod: $(e2e_kubectl get events -n "$CHART_NS" --field-selector "involvedObject.name=$pod,reason=Unhealthy" 2>&1 | tail -n 3)" || return 1
  # The security context as the kernel applies it to the daemon's process.
  pid="$(ctr --address "$E2E_CONTAINERD_SOCK" -n k8s.io tasks ls 2>/dev/null | awk -v id="$container" '$1 == id { print $2 }')"
  [ -n "$pid" ] && [ -r "/proc/$pid/status" ] || why "no process found for container $container of $pod" || return 1
  local status root
  status="$(grep -E '^(Uid|CapPrm|CapEff|CapBnd|NoNewPrivs|Seccomp):' "/proc/$pid/status" | tr -s '\t ' ' ')"
  root="$(awk '$5 == "/" { print $6 }' "/proc/$pid/mountinfo" | tail -n1)"
  local want="Uid: 0 0 0 0
CapPrm: 0000000000000000
CapEff: 0000000000000000
CapBnd: 0000000000000000
NoNewPrivs: 1
Seccomp: 2"
  [ "$status" = "$want" ] || why "the daemon's process in $pod has [$(flat "$status")], expected [$(flat "$want")]" || return 1
  [[ "$root" == ro,* || "$root" == ro ]] || why "the root file system of $pod is mounted '$root', expected read-only" || return 1
  info "$pod: Running, Ready, /healthz and /readyz 200, uid 0 with no capability, no_new_privs, seccomp filter, read-only root"
  e2e_wait_for 60 "node allocatable $EFA to be $EFA_TOTAL" node_efa_is allocatable "$EFA_TOTAL" \
    || why "with the chart's pod running allocatable $EFA is '$(node_field allocatable)', expected $EFA_TOTAL" || return 1
  # Allocatable may still count the replaced pod's registration (the
  # kubelet keeps an endpoint's devices for a grace period): wait for this
  # pod's own, which comes once the socket it replaces stops answering.
  e2e_wait_for 60 "$pod to log its registration" pod_logged "$CHART_NS" "$pod" "registered $EFA with the kubelet" \
    || why "the chart's pod did not log its registration: $(e2e_kubectl logs -n "$CHART_NS" "$pod" 2>&1 | tail -n 5 | paste -sd' ')" || return 1
  CHART_POD="$pod"
}

check_8_upgrade_in_place() {
  no_release || return 1
  install_aws_shaped_release || return 1
  # The node is no p5: the AWS-shaped DaemonSet places no pod here.
  local before after
  before="$(ds_json)" || why "the AWS-shaped release made no DaemonSet $DS_NAME" || return 1
  upgrade_to_chart || return 1
  after="$(ds_json)" || why "DaemonSet $DS_NAME is gone after the upgrade" || return 1
  local uid0 uid1 gen0 gen1
  uid0="$(jq -r .metadata.uid <<< "$before")"; uid1="$(jq -r .metadata.uid <<< "$after")"
  gen0="$(jq -r .metadata.generation <<< "$before")"; gen1="$(jq -r .metadata.generation <<< "$after")"
  [ "$uid1" = "$uid0" ] || why "the DaemonSet was replaced (uid $uid0 -> $uid1), not updated" || return 1
  [ "$gen1" -gt "$gen0" ] || why "the DaemonSet's generation stayed $gen0: its spec was not updated" || return 1
  local got want
  got="$(jq -c '[.spec.selector, .spec.template.metadata.labels["app.kubernetes.io/name"], .spec.template.metadata.labels.team, .spec.template.spec.containers[0].image, .spec.template.spec.containers[0].securityContext.privileged, .spec.template.spec.hostNetwork]' <<< "$after")"
  want="$(jq -nc --arg n "$DS_NAME" --arg i "$PLUGIN_IMAGE" '[{matchLabels: {name: $n}}, "aws-efa-k8s-device-plugin", "hpc", $i, false, null]')"
  [ "$got" = "$want" ] || why "after the upgrade [selector, app.kubernetes.io/name, team label, image, privileged, hostNetwork] = $got, expected $want" || return 1
  # The values given to AWS's chart kept their meaning.
  got="$(jq -c '[.spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[].matchExpressions[-1], .spec.template.spec.tolerations[0].key, .spec.template.spec.tolerations[-1].key]' <<< "$after")"
  want='[{"key":"node.kubernetes.io/instance-type","operator":"In","values":["p5.48xlarge","p5en.48xlarge"]},"CriticalAddonsOnly","dedicated"]'
  [ "$got" = "$want" ] || why "the reused values render as [instance-type term, first and last toleration] = $got, expected $want" || return 1
  local history
  history="$(e2e_helm history "$RELEASE" -n "$CHART_NS" -o json | jq -c '[.[] | [.revision, .chart, .status]]')"
  [ "$history" = '[[1,"aws-efa-k8s-device-plugin-0.5.30","superseded"],[2,"aws-efa-k8s-device-plugin-'"$(sed -n 's/^version: *//p' "$CHART/Chart.yaml")"'","deployed"]]' ] \
    || why "helm history of $RELEASE: $history" || return 1
  info "DaemonSet $DS_NAME (uid $uid0) updated in place: generation $gen0 -> $gen1, selector name=$DS_NAME; history $history"
  uninstall_release || why "helm uninstall $RELEASE did not remove the DaemonSet and its pods" || return 1
}

check_9_chart_on_kubelet() {
  no_release || return 1
  import_plugin_image || return 1
  stop_host_daemon || return 1
  add_chart_repo || return 1
  # README's `helm install`, with this node's image and simulated host paths.
  local values out
  mapfile -t values < <(chart_values)
  out="$(e2e_helm install "$RELEASE" "$CHART_REF" -n "$CHART_NS" "${values[@]}" 2>&1)" \
    || why "helm install $RELEASE $CHART_REF failed: $(flat "$out")" || return 1
  chart_fetched_from_repo || why "helm install did not fetch the chart from $CHART_REPO_URL (see $E2E_LOGS/chart-repo.log)" || return 1
  verify_chart_pod || return 1
  efa_column_shows_all || return 1
  info "allocatable $EFA = $EFA_TOTAL, served by $CHART_POD ($PLUGIN_IMAGE), installed from $CHART_REF"
  create_pod efa-chart-4 4 || why "cannot create pod efa-chart-4" || return 1
  e2e_wait_for 90 "pod efa-chart-4 to run" pod_running efa-chart-4 \
    || why "pod efa-chart-4 is '$(pod_phase efa-chart-4)': $(pod_json efa-chart-4 | jq -c '.status | {reason, message}')" || return 1
  verify_pod efa-chart-4 4 || return 1
  info "efa-chart-4 holds $(flat "$VIEW_NAMES")"
  delete_pod efa-chart-4 || why "cannot delete pod efa-chart-4" || return 1
  uninstall_release || why "helm uninstall $RELEASE did not remove the DaemonSet and its pods" || return 1
  e2e_wait_for 60 "allocatable $EFA to drop to 0" node_efa_is allocatable 0 \
    || why "with the chart uninstalled allocatable $EFA is '$(node_field allocatable)', expected 0" || return 1
}

# The running pod of the AWS-shaped release (selected by its only label).
aws_pod_uid() {
  e2e_kubectl get pods -n "$CHART_NS" -l "name=$DS_NAME,!app.kubernetes.io/component" -o json \
    | jq -r '.items[] | select(.status.phase == "Running") | .metadata.uid'
}
aws_pod_running() { [ -n "$(aws_pod_uid)" ]; }
pod_uid_gone() {
  e2e_kubectl get pods -n "$CHART_NS" -o json | jq -e --arg u "$1" 'all(.items[]; .metadata.uid != $u)' >/dev/null
}

check_10_upgrade_on_kubelet() {
  no_release || return 1
  import_plugin_image || return 1
  stop_host_daemon || return 1
  # The node is a p5 now: the AWS-shaped release runs its pod here.
  e2e_kubectl label node "$E2E_NODE" "$INSTANCE_LABEL=p5.48xlarge" --overwrite >/dev/null \
    || why "cannot label node $E2E_NODE" || return 1
  install_aws_shaped_release || return 1
  e2e_wait_for 120 "the AWS-shaped release's pod to run" aws_pod_running \
    || why "the AWS-shaped DaemonSet's pod does not run: $(e2e_kubectl get pods -n "$CHART_NS" -o wide 2>&1 | paste -sd' ')" || return 1
  local old uid0
  old="$(aws_pod_uid)"
  uid0="$(ds_json | jq -r .metadata.uid)"
  upgrade_to_chart || return 1
  verify_chart_pod || return 1
  [ "$(ds_json | jq -r .metadata.uid)" = "$uid0" ] || why "the DaemonSet was replaced, not updated" || return 1
  e2e_wait_for 60 "the AWS-shaped release's pod to go" pod_uid_gone "$old" \
    || why "the AWS-shaped release's pod (uid $old) is still there beside the chart's" || return 1
  info "the AWS-shaped release's running pod was replaced by $CHART_POD; allocatable $EFA = $EFA_TOTAL"
  uninstall_release || why "helm uninstall $RELEASE did not remove the DaemonSet and its pods" || return 1
  e2e_kubectl label node "$E2E_NODE" "$INSTANCE_LABEL-" >/dev/null
}
