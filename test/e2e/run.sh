#!/usr/bin/env bash
# The end-to-end suite: the daemon against a real kubelet v1.20.2, apiserver
# and containerd on a simulated p5.48xlarge node.
#
#   test/e2e/run.sh
#
# Builds what is missing (Kubernetes into /var/cache/efa-e2e, the daemon into
# build/e2e), brings up the cluster (cluster.sh), starts the daemon, runs the
# checks, tears everything down (also on failure or interruption) and ends
# with a line "N passed, M failed". Exits non-zero if anything failed. A
# prerequisite that cannot be had is a failure with its reason, never a skip.
# Checks: 1-5 the EFA resource itself; 6 alignment of 20 pods of 1 GPU + 4 EFA
# with a fake NVIDIA plugin (prints "alignment rate: X/20 = P%"); 7 the MOFED
# guard; 8 `helm upgrade` of a release of a chart shaped like AWS's to the
# Helm chart (the DaemonSet updated in place); 9 the chart's pod on the
# kubelet, from the image built from the Dockerfile, installed as README
# tells users (`helm repo add` of the chart repository scripts/release.sh
# makes, served on 127.0.0.1; 8 and 10 upgrade from it too); 10 the upgrade
# of 8 with the old release's pod running; 11 (run after 8, the host daemon restarted
# with --sharing-replicas 4 and restored after) sharing: 128 allocatable,
# 8 pods of 1 GPU + 4 EFA and 16 of 1 EFA at once, each pod's device nodes
# and env, the GPU pods aligned. Also a CTest test (e2e_real_kubelet, label
# e2e), which sets EFA_E2E_BUILD_DIR to its own build dir.
# Needs root. Environment: EFA_E2E_IMAGE_TAR (the image archive scripts/image.sh
# writes, or one of `podman save`; checks 9 and 10 are skipped, and say
# so, without it: scripts/test.sh runs them with --all), EFA_E2E_BUILD_DIR (default
# build/e2e; a configured dir is used as it is), EFA_E2E_JOBS (build jobs,
# default 1), EFA_E2E_CACHE, EFA_E2E_STATE;
# EFA_E2E_KEEP=1 leaves the cluster and the daemon running for debugging
# (end them with `test/e2e/cluster.sh down`).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=lib.sh
source "$here/lib.sh"

readonly BUILD_DIR="${EFA_E2E_BUILD_DIR:-$repo/build/e2e}"
readonly JOBS="${EFA_E2E_JOBS:-1}"
readonly MACHINE="p5.48xlarge"
readonly SIM="$E2E_STATE/node"          # the simulated node: $SIM/sys, $SIM/hwloc.xml
readonly DEV_ROOT="$E2E_STATE/dev"      # real char devices: $DEV_ROOT/infiniband/uverbsN
readonly FAKE_PROC="$E2E_STATE/proc"    # fake /proc/driver/nvidia for the GPU checks
readonly CDI_DIR="$E2E_CDI_DIR"         # the daemon's CDI spec dir, containerd's only one (the host's is not ours)
readonly EFA="vpc.amazonaws.com/efa"
readonly EFA_TOTAL=32
readonly CHECKPOINT="$E2E_KUBELET_DIR/device-plugins/kubelet_internal_checkpoint"
readonly PLUGIN_SOCKET="$E2E_KUBELET_DIR/device-plugins/aws-efa-device-plugin.sock"
PLUGIN_BIN="$BUILD_DIR/plugin/efa-k8s-device-plugin"
SIMNODE_BIN="$BUILD_DIR/test/efa-simnode"
FAKE_GPU_BIN="$BUILD_DIR/test/fake-gpu-plugin"

passed=0
failed=0
skipped=""        # checks 9-10 without the image
reason=""
torn_down=0
cluster_started=0
completed=0        # all checks ran
setup_reported=0   # a setup failure was already counted
declare -A times=()

# --- reporting --------------------------------------------------------------
why() { reason="$*"; return 1; }
info() { echo "    $*"; }
# A list of lines as one line, for messages.
flat() { paste -sd' ' <<< "$1"; }

# Whether check N is to run: EFA_E2E_CHECKS (e.g. "12" or "1 2 12"; checks
# 4 and 5 need 2's pod) names the checks to run, all when unset.
selected() { [ -z "${EFA_E2E_CHECKS:-}" ] || [[ " ${EFA_E2E_CHECKS//,/ } " == *" $1 "* ]]; }

# run_check N TITLE FUNCTION: runs FUNCTION and prints PASS or FAIL with the reason.
run_check() {
  local n="$1" title="$2" fn="$3"
  if ! selected "$n"; then
    echo "SKIP check $n: not in EFA_E2E_CHECKS=$EFA_E2E_CHECKS"
    skipped=$((skipped + 1))
    return 0
  fi
  reason=""
  echo "--- check $n: $title"
  local t=$SECONDS
  if "$fn"; then
    echo "PASS check $n: $title ($((SECONDS - t))s)"
    passed=$((passed + 1))
  else
    echo "FAIL check $n: $title: ${reason:-failed} ($((SECONDS - t))s)"
    failed=$((failed + 1))
  fi
}

# A prerequisite that cannot be had: every check counts as failed.
setup_failed() {
  setup_reported=1
  echo "FAIL setup: $*"
  failed=$((failed + 1))
  local n
  for n in 1 2 3 4 5 6 7 8 9 10 11 12; do
    echo "FAIL check $n: not run (setup failed)"
    failed=$((failed + 1))
  done
  finish
}

# --- helpers ----------------------------------------------------------------
node_field() {  # node_field capacity|allocatable
  e2e_kubectl get node "$E2E_NODE" -o "jsonpath={.status.$1.vpc\.amazonaws\.com/efa}" 2>/dev/null
}
node_efa_is() { [ "$(node_field "$1")" = "$2" ]; }

# How often the daemon has registered, from its log.
registrations() { grep -c "registered $EFA with the kubelet" "$E2E_LOGS/efa-plugin.log" 2>/dev/null || true; }
registrations_above() { [ "$(registrations)" -gt "$1" ]; }

# start_daemon [FLAG...]: the daemon on the simulated node; extra flags are
# passed on. Its /proc is the fake one the fake GPU plugin writes (GPU UUIDs
# to PCI addresses; no nvidia-device-plugin process), and its CDI spec dir is
# an empty one of ours, so that nothing on the host feeds the MOFED guard.
# At debug level: the checks read each GetPreferredAllocation's reason.
start_daemon() {
  e2e_start efa-plugin "$PLUGIN_BIN" --kubelet-dir "$E2E_KUBELET_DIR" \
    --sysfs-root "$SIM/sys" --dev-root "$DEV_ROOT" --proc-root "$FAKE_PROC" \
    --cdi-spec-dirs "$CDI_DIR" --metrics-address 127.0.0.1:0 --probe-address 127.0.0.1:0 \
    --log-level debug "$@"
}

# pod_manifest NAME EFA_COUNT [GPU_COUNT]: a busybox pod bound to the node.
pod_manifest() {
  local name="$1" efa="$2" gpu="${3:-0}"
  cat <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $name
  namespace: default
spec:
  nodeName: $E2E_NODE
  restartPolicy: Never
  terminationGracePeriodSeconds: 0
  containers:
  - name: main
    image: $E2E_POD_IMAGE
    imagePullPolicy: Never
    command: ["/bin/sleep", "86400"]
    resources:
      limits:
$( [ "$efa" -gt 0 ] && echo "        $EFA: $efa" )
$( [ "$gpu" -gt 0 ] && echo "        nvidia.com/gpu: $gpu" )
EOF
}

create_pod() { pod_manifest "$@" | e2e_kubectl apply -f - >/dev/null; }
delete_pod() { e2e_kubectl delete pod "$1" --grace-period=0 --force --wait=true --timeout=60s >/dev/null 2>&1; }
pod_json() { e2e_kubectl get pod "$1" -o json 2>/dev/null; }
pod_phase() { e2e_kubectl get pod "$1" -o 'jsonpath={.status.phase}' 2>/dev/null; }
pod_running() { [ "$(pod_phase "$1")" = Running ]; }
pod_failed() { [ "$(pod_phase "$1")" = Failed ]; }
pod_uid() { e2e_kubectl get pod "$1" -o 'jsonpath={.metadata.uid}' 2>/dev/null; }

# What the container sees: one line per /dev/infiniband entry ("uverbs3 231:195
# character special file"), then the EFA env vars.
pod_view() {
  e2e_kubectl exec "$1" -- /bin/sh -c '
    for f in /dev/infiniband/*; do
      [ -e "$f" ] || continue
      echo "DEV $(basename "$f") $(stat -c "%t %T" "$f") $(stat -c "%F" "$f")"
    done
    echo "ENV EFA_DEVICES=$EFA_DEVICES"
    echo "ENV EFA_PCI_ADDRESSES=$EFA_PCI_ADDRESSES"'
}

# The pod's device nodes as "uverbsN MAJ:MIN" lines (decimal), sorted.
view_devices() {
  local tag name major minor type
  while read -r tag name major minor type; do
    [ "$tag" = DEV ] || continue
    echo "$name $((16#$major)):$((16#$minor)) $type"
  done <<< "$1" | sort -V
}
view_env() { sed -n "s/^ENV $2=//p" <<< "$1"; }

# The simulated node's truth, read once by make_node: for each verbs device
# name its uverbs node, that node's MAJ:MIN and the device's PCI address.
declare -A SIM_UVERBS=() SIM_DEV=() SIM_PCI=()
read_sim_node() {
  local d name
  for d in "$SIM"/sys/class/infiniband_verbs/uverbs*; do
    name="$(cat "$d/ibdev")"
    SIM_UVERBS[$name]="$(basename "$d")"
    SIM_DEV[$name]="$(cat "$d/dev")"
    SIM_PCI[$name]="$(basename "$(readlink -f "$SIM/sys/class/infiniband/$name/device")")"
  done
}
all_efa_names() { printf '%s\n' "${!SIM_UVERBS[@]}" | sort; }

# The kubelet checkpoint's EFA device IDs of a pod, one a line, sorted.
checkpoint_ids() {
  jq -r --arg uid "$1" --arg res "$EFA" '.Data.PodDeviceEntries[]
    | select(.PodUID == $uid and .ResourceName == $res) | .DeviceIDs[] | .[]' "$CHECKPOINT" | sort
}
# The host paths in the pod's checkpointed Allocate response, sorted.
checkpoint_host_paths() {
  jq -r --arg uid "$1" --arg res "$EFA" '.Data.PodDeviceEntries[]
    | select(.PodUID == $uid and .ResourceName == $res) | .AllocResp' "$CHECKPOINT" \
    | base64 -d | strings | grep -o "$DEV_ROOT/infiniband/uverbs[0-9]*" | sort -u
}

# Verifies what a running pod holds; sets VIEW_NAMES (its EFA names, sorted).
# verify_pod POD COUNT
verify_pod() {
  local pod="$1" count="$2" view uid
  view="$(pod_view "$pod" 2>&1)" || why "kubectl exec $pod failed: $view" || return 1
  local names pcis
  names="$(view_env "$view" EFA_DEVICES)"
  pcis="$(view_env "$view" EFA_PCI_ADDRESSES)"
  [ -n "$names" ] || why "EFA_DEVICES is empty or unset in $pod" || return 1
  local -a name_list
  IFS=, read -r -a name_list <<< "$names"
  [ "${#name_list[@]}" -eq "$count" ] || why "EFA_DEVICES=$names names ${#name_list[@]} devices, expected $count" || return 1

  # Expected from the simulated sysfs: nodes and PCI addresses of those names.
  local expected_devs="" expected_pcis="" expected_paths="" n
  for n in "${name_list[@]}"; do
    [ -n "${SIM_UVERBS[$n]:-}" ] || why "EFA_DEVICES names $n, which the node does not have" || return 1
    expected_devs+="${SIM_UVERBS[$n]} ${SIM_DEV[$n]} character special file"$'\n'
    expected_pcis+="${expected_pcis:+,}${SIM_PCI[$n]}"
    expected_paths+="$DEV_ROOT/infiniband/${SIM_UVERBS[$n]}"$'\n'
  done
  expected_devs="$(sort -V <<< "${expected_devs%$'\n'}")"
  local actual_devs; actual_devs="$(view_devices "$view")"
  [ "$actual_devs" = "$expected_devs" ] \
    || why "/dev/infiniband in $pod holds [$(flat "$actual_devs")], expected exactly [$(flat "$expected_devs")]" || return 1
  [ "$pcis" = "$expected_pcis" ] \
    || why "EFA_PCI_ADDRESSES=$pcis, expected $expected_pcis (the PCI addresses of EFA_DEVICES=$names)" || return 1
  [ "$(tr , '\n' <<< "$pcis" | sort | paste -sd,)" = "$pcis" ] \
    || why "EFA_PCI_ADDRESSES=$pcis is not in PCI order" || return 1

  # The kubelet's checkpoint agrees.
  uid="$(pod_uid "$pod")"
  local sorted_names; sorted_names="$(tr , '\n' <<< "$names" | sort)"
  # (With sharing the kubelet's IDs are replicas "<ibdev>::<n>" of the EFAs.)
  local ck; ck="$(checkpoint_ids "$uid" | sed 's/::[0-9]*$//' | sort)"
  [ "$ck" = "$sorted_names" ] \
    || why "checkpoint lists [$(flat "$ck")] for $pod, the container has [$(flat "$sorted_names")]" || return 1
  local paths
  paths="$(checkpoint_host_paths "$uid")"
  expected_paths="$(sort <<< "${expected_paths%$'\n'}")"
  [ "$paths" = "$expected_paths" ] \
    || why "checkpointed Allocate response of $pod has host paths [$(flat "$paths")], expected [$(flat "$expected_paths")]" || return 1
  VIEW_NAMES="$sorted_names"
  VIEW_DEVS="$actual_devs"
}

# --- the checks -------------------------------------------------------------
POD1_NAMES=""
POD1_DEVS=""
POD1_CONTAINER=""

# The allocatable column README tells users to look at shows $EFA_TOTAL EFAs
# for the node (printed).
efa_column_shows_all() {
  local out
  out="$(e2e_kubectl get nodes -o 'custom-columns=NAME:.metadata.name,EFA:.status.allocatable.vpc\.amazonaws\.com/efa' 2>&1)"
  info "$(sed '2,$s/^/    /' <<< "$out")"
  local count; count="$(awk -v n="$E2E_NODE" '$1 == n { print $2 }' <<< "$out")"
  [ "$count" = "$EFA_TOTAL" ] || why "kubectl get nodes shows EFA '$count' for $E2E_NODE, expected $EFA_TOTAL"
}

check_1_count() {
  e2e_wait_for 60 "node allocatable $EFA to be $EFA_TOTAL" node_efa_is allocatable "$EFA_TOTAL"
  efa_column_shows_all
}

check_2_pod() {
  create_pod efa-4 4 || why "cannot create pod efa-4" || return 1
  e2e_wait_for 90 "pod efa-4 to run" pod_running efa-4 \
    || why "pod efa-4 is '$(pod_phase efa-4)', not Running: $(pod_json efa-4 | jq -c '.status | {reason, message, containerStatuses}')" || return 1
  verify_pod efa-4 4 || return 1
  POD1_NAMES="$VIEW_NAMES"
  POD1_DEVS="$VIEW_DEVS"
  POD1_CONTAINER="$(e2e_kubectl get pod efa-4 -o 'jsonpath={.status.containerStatuses[0].containerID}')"
  info "efa-4 holds $(flat "$POD1_NAMES"): $(echo "$POD1_DEVS" | awk '{printf "%s(%s) ", $1, $2}')"
}

check_3_too_many() {
  local free=$((EFA_TOTAL - 4)) want=$((EFA_TOTAL - 4 + 1))
  create_pod efa-too-many "$want" || why "cannot create pod efa-too-many" || return 1
  e2e_wait_for 60 "pod efa-too-many to fail" pod_failed efa-too-many \
    || why "pod efa-too-many asking $want of $free free EFAs is '$(pod_phase efa-too-many)', not Failed" || return 1
  local status; status="$(pod_json efa-too-many | jq -r '.status.reason + ": " + .status.message')"
  info "efa-too-many ($want of $free free): $status"
  [[ "$status" == UnexpectedAdmissionError:* ]] \
    || why "efa-too-many failed with '$status', expected an UnexpectedAdmissionError" || return 1
  local uid; uid="$(pod_uid efa-too-many)"
  [ -z "$(checkpoint_ids "$uid")" ] || why "the checkpoint holds devices for the rejected pod" || return 1
  delete_pod efa-too-many || why "cannot delete pod efa-too-many" || return 1
}

check_4_kubelet_restart() {
  [ -n "$POD1_NAMES" ] || why "needs the pod of check 2" || return 1
  local before; before="$(registrations)"
  "$here/cluster.sh" restart-kubelet || why "the kubelet did not restart (see $E2E_LOGS/kubelet.log)" || return 1
  e2e_wait_for 60 "the daemon to register again" registrations_above "$before" \
    || why "the daemon did not register again after the kubelet restart (registrations: $(registrations), before: $before)" || return 1
  info "the daemon registered again ($before -> $(registrations) registrations)"
  e2e_wait_for 60 "allocatable $EFA back to $EFA_TOTAL" node_efa_is allocatable "$EFA_TOTAL" \
    || why "allocatable $EFA is '$(node_field allocatable)' after the restart, expected $EFA_TOTAL" || return 1
  node_efa_is capacity "$EFA_TOTAL" || why "capacity $EFA is '$(node_field capacity)', expected $EFA_TOTAL" || return 1

  # The running pod keeps its container and its devices.
  pod_running efa-4 || why "pod efa-4 is '$(pod_phase efa-4)' after the kubelet restart" || return 1
  local container restarts
  container="$(e2e_kubectl get pod efa-4 -o 'jsonpath={.status.containerStatuses[0].containerID}')"
  restarts="$(e2e_kubectl get pod efa-4 -o 'jsonpath={.status.containerStatuses[0].restartCount}')"
  [ "$container" = "$POD1_CONTAINER" ] && [ "$restarts" = 0 ] \
    || why "efa-4's container changed ($POD1_CONTAINER -> $container, restarts $restarts)" || return 1
  verify_pod efa-4 4 || return 1
  [ "$VIEW_NAMES" = "$POD1_NAMES" ] && [ "$VIEW_DEVS" = "$POD1_DEVS" ] \
    || why "efa-4 now holds [$(flat "$VIEW_NAMES")], before the restart [$(flat "$POD1_NAMES")]" || return 1

  # The restarted kubelet allocates through the re-registered plugin, and not
  # the devices the running pod holds.
  create_pod efa-after-restart 1 || why "cannot create pod efa-after-restart" || return 1
  e2e_wait_for 90 "pod efa-after-restart to run" pod_running efa-after-restart \
    || why "a 1-EFA pod after the restart is '$(pod_phase efa-after-restart)': $(pod_json efa-after-restart | jq -c '.status | {reason, message}')" || return 1
  verify_pod efa-after-restart 1 || return 1
  ! grep -qxF "$VIEW_NAMES" <<< "$POD1_NAMES" \
    || why "efa-after-restart got $VIEW_NAMES, which efa-4 holds" || return 1
  info "after the restart a new pod got $VIEW_NAMES"
  delete_pod efa-after-restart || why "cannot delete pod efa-after-restart" || return 1
}

check_5_daemon_restart() {
  [ -n "$POD1_NAMES" ] || why "needs the pod of check 2" || return 1
  local pid; pid="$(e2e_pid efa-plugin)" || why "the daemon is not running" || return 1
  kill -KILL "$pid"
  e2e_stop efa-plugin 5   # reaps the record; the process is gone
  e2e_wait_for 60 "allocatable $EFA to drop to 0" node_efa_is allocatable 0 \
    || why "with the daemon dead, allocatable is '$(node_field allocatable)', expected 0" || return 1
  node_efa_is capacity "$EFA_TOTAL" \
    || why "with the daemon dead, capacity is '$(node_field capacity)', expected $EFA_TOTAL (kept)" || return 1
  info "daemon killed: allocatable 0, capacity $EFA_TOTAL"
  [ -S "$PLUGIN_SOCKET" ] && info "its stale socket stays: $(basename "$PLUGIN_SOCKET")"

  local before; before="$(registrations)"
  start_daemon
  e2e_wait_for 60 "the restarted daemon to register" registrations_above "$before" \
    || why "the restarted daemon did not register (see $E2E_LOGS/efa-plugin.log)" || return 1
  e2e_wait_for 60 "allocatable $EFA back to $EFA_TOTAL" node_efa_is allocatable "$EFA_TOTAL" \
    || why "after the daemon restart allocatable is '$(node_field allocatable)', expected $EFA_TOTAL" || return 1
  info "daemon restarted: allocatable $EFA_TOTAL"

  # No double allocation: the rest goes to a new pod, disjoint from efa-4's;
  # then nothing is left.
  local rest=$((EFA_TOTAL - 4))
  create_pod efa-rest "$rest" || why "cannot create pod efa-rest" || return 1
  e2e_wait_for 90 "pod efa-rest to run" pod_running efa-rest \
    || why "pod efa-rest ($rest EFAs, all that is free) is '$(pod_phase efa-rest)': $(pod_json efa-rest | jq -c '.status | {reason, message}')" || return 1
  verify_pod efa-rest "$rest" || return 1
  local shared; shared="$(comm -12 <(echo "$POD1_NAMES") <(echo "$VIEW_NAMES"))"
  [ -z "$shared" ] || why "efa-rest got $(flat "$shared"), which efa-4 holds: double allocation" || return 1
  [ "$(sort <<< "$POD1_NAMES"$'\n'"$VIEW_NAMES")" = "$(all_efa_names)" ] \
    || why "efa-4 and efa-rest together do not hold each of the $EFA_TOTAL EFAs once" || return 1
  info "efa-rest got the other $rest EFAs; together they hold each EFA once"
  create_pod efa-one-more 1 || why "cannot create pod efa-one-more" || return 1
  e2e_wait_for 60 "pod efa-one-more to fail" pod_failed efa-one-more \
    || why "with every EFA taken a 1-EFA pod is '$(pod_phase efa-one-more)', not Failed" || return 1
  delete_pod efa-one-more
  delete_pod efa-rest || why "cannot delete pod efa-rest" || return 1
}

# --- checks 6 and 7: the fake NVIDIA plugin ----------------------------------
readonly GPU="nvidia.com/gpu"
readonly GPU_TOTAL=8
readonly ALIGN_PODS=20          # pods of 1 GPU + 4 EFA
# The kubelet allocates a container's resources in random order, so the EFAs
# are sometimes chosen before the GPU is known: the daemon must still align
# at least this share of the pods.
readonly ALIGN_MIN_PERCENT=95

# EFA PCI address -> the GPU behind the same PCIe switch, as the daemon's own
# `topology --format json` reports the simulated node (relation "SW"). On
# the p5.48xlarge each of the 8 GPUs has 4 EFAs behind its switch; a layout
# of another shape fails the check before any pod runs.
declare -A GPU_OF_EFA=()
read_layout() {
  GPU_OF_EFA=()
  local efa gpu
  while read -r efa gpu; do
    [ -n "$efa" ] && GPU_OF_EFA[$efa]="$gpu"
  done < <("$PLUGIN_BIN" topology --sysfs-root "$SIM/sys" --dev-root "$DEV_ROOT" --format json \
    | jq -r '(.accelerators | map({(.name): .pci}) | add) as $pci | .efas[] | .pci as $efa
        | [.relations | to_entries[] | select(.value == "SW") | $pci[.key]]
        | select(length == 1) | "\($efa) \(.[0])"')
  [ "${#GPU_OF_EFA[@]}" -eq 32 ] \
    && [ "$(printf '%s\n' "${GPU_OF_EFA[@]}" | sort | uniq -c | awk '$1 == 4' | wc -l)" -eq "$GPU_TOTAL" ]
}

# Whether EFA PCI addresses (comma-separated) all sit with the GPU at $2.
efas_with_gpu() {
  local -a pcis; local p
  IFS=, read -r -a pcis <<< "$1"
  [ "${#pcis[@]}" -gt 0 ] || return 1
  for p in "${pcis[@]}"; do
    [ "${GPU_OF_EFA[$p]:-}" = "$2" ] || return 1
  done
}

# The fake driver's GPU UUID -> PCI address table, from what the fake GPU
# plugin wrote under $FAKE_PROC (as the NVIDIA driver's /proc files read).
declare -A GPU_PCI_OF_UUID=()
read_fake_gpus() {
  GPU_PCI_OF_UUID=()
  local f uuid bus
  for f in "$FAKE_PROC"/driver/nvidia/gpus/*/information; do
    [ -f "$f" ] || continue
    uuid="$(awk -F'\t' '/^GPU UUID:/ { gsub(/ /, "", $NF); print $NF }' "$f")"
    bus="$(awk -F'\t' '/^Bus Location:/ { gsub(/ /, "", $NF); print $NF }' "$f")"
    [ -n "$uuid" ] && [ -n "$bus" ] && GPU_PCI_OF_UUID[$uuid]="$bus"
  done
  [ "${#GPU_PCI_OF_UUID[@]}" -eq "$GPU_TOTAL" ]
}

# The daemon's log from a mark on: mark=$(log_mark); log_since "$mark".
log_mark() { wc -l < "$E2E_LOGS/efa-plugin.log"; }
log_since() { tail -n "+$(($1 + 1))" "$E2E_LOGS/efa-plugin.log"; }
# (Not grep -q: with pipefail, tail killed by SIGPIPE would fail the test.)
log_since_has() { log_since "$1" | grep -F -- "$2" >/dev/null; }

# Deletes every pod of the test namespace (what earlier checks left too).
delete_all_pods() {
  e2e_kubectl delete pods --all --grace-period=0 --force --wait=true --timeout=90s >/dev/null 2>&1
  e2e_wait_for 60 "every pod to be gone" no_pods
}
no_pods() { [ -z "$(e2e_kubectl get pods -o name 2>/dev/null)" ]; }
all_running() { local p; for p in "$@"; do pod_running "$p" || return 1; done; }
# The pods named that do not run, with their status, for messages.
not_running() {
  local p out=""
  for p in "$@"; do
    pod_running "$p" || out+="${out:+; }$p is '$(pod_phase "$p")': $(pod_json "$p" | jq -c '.status | {reason, message, containerStatuses}')"
  done
  echo "$out"
}

# The resource the kubelet allocated first for a pod's container: its device
# manager logs "Needs to allocate N "<resource>" for pod "<uid>" container ..."
# (V(3) in pkg/kubelet/cm/devicemanager/manager.go; cluster.sh starts the
# kubelet with --vmodule=manager=3) before it asks the plugin.
first_allocated() {
  grep -oE "Needs to allocate [0-9]+ \"[^\"]+\" for pod \"$1\"" "$E2E_LOGS/kubelet.log" \
    | head -n1 | sed -E 's/^Needs to allocate [0-9]+ "([^"]+)".*/\1/'
}

# What a GPU pod's container was given, as "KEY=value" lines.
gpu_pod_env() {
  e2e_kubectl exec "$1" -- /bin/sh -c 'echo "GPU=$NVIDIA_VISIBLE_DEVICES"
    echo "MOFED=$NVIDIA_MOFED"; echo "EFA=$EFA_DEVICES"; echo "EFA_PCI=$EFA_PCI_ADDRESSES"'
}
env_value() { sed -n "s/^$2=//p" <<< "$1"; }

# The daemon's alignment report line for a container, once it is there.
report_line() {
  grep -E "alignment: default/$1/main (aligned|NOT aligned): " "$E2E_LOGS/efa-plugin.log" | tail -n1
}
has_report() { [ -n "$(report_line "$1")" ]; }

# A running GPU-only pod must not attract another pod's EFAs: the kubelet's
# checkpoint holds its GPU, so the daemon does not take it for the container
# being admitted. Sets PROBE_SUMMARY.
probe_gpu_only_pod() {
  local mark; mark="$(log_mark)"
  create_pod gpu-only 0 1 || why "cannot create pod gpu-only" || return 1
  e2e_wait_for 90 "pod gpu-only to run" pod_running gpu-only \
    || why "pod gpu-only (1 GPU) is '$(pod_phase gpu-only)': $(pod_json gpu-only | jq -c '.status | {reason, message}')" || return 1
  create_pod efa-only 4 || why "cannot create pod efa-only" || return 1
  e2e_wait_for 90 "pod efa-only to run" pod_running efa-only \
    || why "pod efa-only (4 EFA) is '$(pod_phase efa-only)': $(pod_json efa-only | jq -c '.status | {reason, message}')" || return 1
  local gpu_env efa_env gpu_pci
  gpu_env="$(gpu_pod_env gpu-only 2>&1)" || why "kubectl exec gpu-only failed: $gpu_env" || return 1
  efa_env="$(gpu_pod_env efa-only 2>&1)" || why "kubectl exec efa-only failed: $efa_env" || return 1
  gpu_pci="${GPU_PCI_OF_UUID[$(env_value "$gpu_env" GPU)]:-?}"
  local wrong
  wrong="$(log_since "$mark" | grep -F "aligning with the accelerators of default/gpu-only/main" || true)"
  [ -z "$wrong" ] || why "the daemon took the running GPU-only pod for the one being admitted: $wrong" || return 1
  local said
  said="$(log_since "$mark" | grep -F "GetPreferredAllocation:" | tail -n1 | sed 's/^\[[^]]*\] \[[a-z]*\] //')"
  PROBE_SUMMARY="GPU-only pod on $gpu_pci; then a 4-EFA pod got $(env_value "$efa_env" EFA_PCI) (daemon: \"$said\")"
  delete_all_pods || why "cannot delete pods gpu-only and efa-only" || return 1
}

check_6_alignment() {
  # Every EFA and GPU free: efa-4 of check 2 (and whatever a failed check left) goes.
  delete_all_pods || why "cannot delete the earlier checks' pods" || return 1
  read_layout || why "the topology command does not show 32 EFAs, 4 behind each GPU's PCIe switch: $(printf '%s ' "${!GPU_OF_EFA[@]}" | wc -w) EFAs with one" || return 1
  start_fake_gpu_plugin || return 1
  read_fake_gpus || why "the fake GPU plugin wrote ${#GPU_PCI_OF_UUID[@]} GPUs under $FAKE_PROC/driver/nvidia/gpus, expected $GPU_TOTAL" || return 1

  local mark; mark="$(log_mark)"
  local -a names=() batch
  local i
  for i in $(seq 1 "$ALIGN_PODS"); do names+=("$(printf 'align-%02d' "$i")"); done
  local aligned=0 gpu_first=0 gpu_first_aligned=0 efa_first=0 efa_first_aligned=0
  local named=0 disagree="" unrecognised="" pod start stale
  for ((start = 0; start < ALIGN_PODS; start += GPU_TOTAL)); do
    batch=("${names[@]:start:GPU_TOTAL}")
    # No pod runs now, yet the kubelet's checkpoint may still hold the
    # deleted pods' devices: it is rewritten at the next allocation or
    # device-list update, not when a pod goes. Their GPUs, "UUID PODUID":
    stale="$(checkpoint_gpus)"
    [ -z "$stale" ] || info "batch $((start / GPU_TOTAL + 1)) begins with $(grep -c . <<< "$stale") $GPU entries of deleted pods in the kubelet checkpoint"
    for pod in "${batch[@]}"; do pod_manifest "$pod" 4 1; echo "---"; done \
      | e2e_kubectl apply -f - >/dev/null || why "cannot create pods ${batch[*]}" || return 1
    e2e_wait_for 180 "pods ${batch[*]} to run" all_running "${batch[@]}" || {
      local stuck=""
      for pod in "${batch[@]}"; do
        pod_running "$pod" || stuck+="${stuck:+; }$pod is '$(pod_phase "$pod")': $(pod_json "$pod" | jq -c '.status | {reason, message}')"
      done
      why "not every pod of 1 GPU + 4 EFA runs: $stuck"
      return 1
    }
    for pod in "${batch[@]}"; do
      local env uuid gpu_pci efa_pci efas uid first verdict daemon line
      env="$(gpu_pod_env "$pod" 2>&1)" || why "kubectl exec $pod failed: $env" || return 1
      uuid="$(env_value "$env" GPU)"
      efa_pci="$(env_value "$env" EFA_PCI)"
      efas="$(env_value "$env" EFA)"
      gpu_pci="${GPU_PCI_OF_UUID[$uuid]:-}"
      [ -n "$gpu_pci" ] || why "$pod has NVIDIA_VISIBLE_DEVICES='$uuid', not one GPU of the fake driver" || return 1
      [ "$(tr , '\n' <<< "$efa_pci" | grep -c .)" -eq 4 ] \
        || why "$pod has EFA_PCI_ADDRESSES='$efa_pci', expected 4 addresses" || return 1

      # The verdict from the layout the topology command reports.
      if efas_with_gpu "$efa_pci" "$gpu_pci"; then verdict=aligned; else verdict="NOT aligned"; fi
      [ "$verdict" = aligned ] && aligned=$((aligned + 1))

      # The kubelet's allocation order for this container.
      uid="$(pod_uid "$pod")"
      first="$(first_allocated "$uid")"
      case "$first" in
        "$GPU") gpu_first=$((gpu_first + 1)); [ "$verdict" = aligned ] && gpu_first_aligned=$((gpu_first_aligned + 1)) ;;
        "$EFA") efa_first=$((efa_first + 1)); [ "$verdict" = aligned ] && efa_first_aligned=$((efa_first_aligned + 1)) ;;
        *) why "the kubelet log has no allocation lines for $pod (uid $uid): is it started with --vmodule=manager=3?" || return 1 ;;
      esac

      # What the daemon said when the EFAs were chosen: it names the
      # container only when it recognised it (GPU already allocated).
      local said_of_pod
      said_of_pod="$(log_since "$mark" | grep -F "aligning with the accelerators of default/$pod/main" || true)"
      if [ -z "$said_of_pod" ] && [ "$first" = "$GPU" ]; then
        local held_by; held_by="$(awk -v u="$uuid" '$1 == u { print $2; exit }' <<< "$stale")"
        unrecognised+="${unrecognised:+; }$pod (GPU $gpu_pci"
        if [ -n "$held_by" ]; then
          unrecognised+=", which the checkpoint still gave deleted pod $held_by)"
        else
          unrecognised+=", not in the checkpoint when its batch began)"
        fi
      fi
      if [ -n "$said_of_pod" ]; then
        [ "$first" = "$GPU" ] \
          || why "the daemon aligned $pod with known accelerators although the kubelet allocated its EFAs first: $said_of_pod" || return 1
        [ "$(grep -c . <<< "$said_of_pod")" -eq 1 ] && grep -qF "(accelerators $gpu_pci)" <<< "$said_of_pod" \
          || why "the daemon's GetPreferredAllocation for $pod does not name its GPU $gpu_pci: $(flat "$said_of_pod")" || return 1
        named=$((named + 1))
      fi

      # The daemon's report agrees with the layout's verdict.
      e2e_wait_for 30 "the daemon's alignment report of $pod" has_report "$pod" \
        || why "the daemon logged no 'alignment: default/$pod/main ...' line" || return 1
      line="$(report_line "$pod")"
      if grep -qF "/main aligned: " <<< "$line"; then daemon=aligned; else daemon="NOT aligned"; fi
      [ "$daemon" = "$verdict" ] \
        || disagree+="${disagree:+; }$pod: daemon '$daemon', layout '$verdict' (GPU $gpu_pci, EFAs $efa_pci)"
      local reported_efas reported_gpu
      reported_efas="$(sed -E 's/.*: EFAs ([^ ]*) with accelerators.*/\1/' <<< "$line" | tr , '\n' | sort | paste -sd,)"
      reported_gpu="$(sed -E 's/.* with accelerators (.*)$/\1/' <<< "$line")"
      [ "$reported_efas" = "$(tr , '\n' <<< "$efas" | sort | paste -sd,)" ] && [ "$reported_gpu" = "$gpu_pci" ] \
        || why "the daemon's report of $pod names EFAs $reported_efas with $reported_gpu; the container has $efas with $gpu_pci" || return 1

      info "$pod: GPU $gpu_pci, EFAs $efa_pci: $verdict ($( [ "$first" = "$GPU" ] && echo "GPU first" || echo "EFAs first"); daemon: $daemon)"
    done
    delete_all_pods || why "cannot delete pods ${batch[*]}" || return 1
  done

  local wrongly_named
  wrongly_named="$(log_since "$mark" | grep -F "aligning with the accelerators of" | grep -vE "default/align-[0-9]+/main" || true)"
  [ -z "$wrongly_named" ] || why "the daemon aligned with a container that was not being admitted: $(flat "$wrongly_named")" || return 1

  # After the batches (before them, the probe's deleted GPU-only pod would
  # stay in the checkpoint and could hide the first admitted container: see
  # the note at checkpoint_gpus).
  local probe_problem=""
  if probe_gpu_only_pod; then info "$PROBE_SUMMARY"; else probe_problem="$reason"; fi

  local percent; percent=$((100 * aligned / ALIGN_PODS))
  info "kubelet order: GPU first for $gpu_first pods, EFAs first for $efa_first"
  info "GPU first: $gpu_first_aligned/$gpu_first aligned; the daemon recognised the container being admitted" \
       "$named/$gpu_first times (pod-resources listed its GPU, the checkpoint did not)"
  [ -z "$unrecognised" ] || info "not recognised: $unrecognised"
  info "EFAs first: $efa_first_aligned/$efa_first aligned by prediction (beside the lowest free GPU)"
  echo "    alignment rate: $aligned/$ALIGN_PODS = $percent%"
  # Every problem in one reason, the rate last.
  local -a problems=()
  [ -z "$probe_problem" ] || problems+=("$probe_problem")
  [ -z "$disagree" ] || problems+=("the daemon's alignment report disagrees with the PCI layout: $disagree")
  [ "$named" -eq "$gpu_first" ] \
    || problems+=("the daemon took the container being admitted for a running one in $((gpu_first - named)) of $gpu_first GPU-first admissions ($unrecognised) and predicted instead")
  [ "$gpu_first_aligned" -eq "$gpu_first" ] \
    || problems+=("$gpu_first_aligned of $gpu_first GPU-first pods are aligned (expected all)")
  [ "$percent" -ge "$ALIGN_MIN_PERCENT" ] \
    || problems+=("alignment rate $aligned/$ALIGN_PODS = $percent% is below $ALIGN_MIN_PERCENT%")
  [ ${#problems[@]} -eq 0 ] || { why "$(printf '%s; ' "${problems[@]}" | sed 's/; $//')"; return 1; }
}

# The $GPU entries of the kubelet checkpoint: "DEVICE-ID POD-UID" lines.
#
# Kubelet 1.20 writes the checkpoint at the end of each container's
# allocation (after all its resources), on every device-list update of any
# plugin, and when a resource is removed; never when a pod is deleted (its
# devices are freed in memory only). So a deleted pod stays in the checkpoint
# until the next write, and the first container admitted after it may get its
# GPU while the checkpoint still gives that GPU to the deleted pod. If the
# GPU is allocated before the EFAs, the daemon's rule ("the container whose
# accelerators pod-resources lists and the checkpoint does not hold") then
# takes the admitted container for a running one and predicts; the
# prediction skips the GPUs pod-resources shows held, this container's own
# included, so its EFAs go to the next group and the pod that gets that
# group's GPU next is misaligned too. Check 6 runs its pods in batches, so
# each batch after the first starts this way.
checkpoint_gpus() {
  [ -f "$CHECKPOINT" ] || return 0
  jq -r --arg res "$GPU" '(.Data.PodDeviceEntries // [])[] | select(.ResourceName == $res)
    | .PodUID as $uid | (.DeviceIDs // {})[] | .[] | "\(.) \($uid)"' "$CHECKPOINT"
}

# The MOFED guard against the kubelet's own checkpoint: the fake NVIDIA plugin
# answers Allocate with NVIDIA_MOFED=enabled (--mofed).
#   warn (the daemon as started): the conflict is logged, EFAs stay offered;
#   protect (daemon restarted with it): every EFA Unhealthy, allocatable 0,
#   until the conflict clears (the MOFED pod gone from the checkpoint), then
#   offered again by the same daemon process.
# Ends with the daemon restarted with its default flags.
check_7_mofed_guard() {
  delete_all_pods || why "cannot delete the earlier checks' pods" || return 1
  restart_fake_gpu_plugin --mofed || return 1

  # warn
  local mark; mark="$(log_mark)"
  create_pod mofed-gpu 1 1 || why "cannot create pod mofed-gpu" || return 1
  e2e_wait_for 90 "pod mofed-gpu to run" pod_running mofed-gpu \
    || why "pod mofed-gpu (1 GPU + 1 EFA) is '$(pod_phase mofed-gpu)': $(pod_json mofed-gpu | jq -c '.status | {reason, message}')" || return 1
  local env uid
  env="$(gpu_pod_env mofed-gpu 2>&1)" || why "kubectl exec mofed-gpu failed: $env" || return 1
  [ "$(env_value "$env" MOFED)" = enabled ] \
    || why "mofed-gpu has NVIDIA_MOFED='$(env_value "$env" MOFED)': the fake plugin's answer did not reach the container" || return 1
  uid="$(pod_uid mofed-gpu)"
  local evidence="pod $uid container \"main\" ($GPU) has env NVIDIA_MOFED=enabled"
  e2e_wait_for 30 "the daemon to log the MOFED conflict" log_since_has "$mark" "$evidence" \
    || why "the daemon (policy warn) did not log the MOFED conflict naming '$evidence'" || return 1
  local line; line="$(log_since "$mark" | grep -F "MOFED conflict:" | head -n1)"
  grep -qF "Policy warn" <<< "$line" || why "the conflict line does not say policy warn: $line" || return 1
  info "warn: $(cut -c1-160 <<< "$line")..."
  sleep 5   # a node status update (every 4 s) later
  node_efa_is allocatable "$EFA_TOTAL" \
    || why "under policy warn allocatable $EFA is '$(node_field allocatable)', expected $EFA_TOTAL" || return 1
  info "warn: allocatable $EFA stays $EFA_TOTAL"

  # protect
  e2e_stop efa-plugin 10
  mark="$(log_mark)"
  local before; before="$(registrations)"
  start_daemon --mofed-policy protect
  local pid; pid="$(e2e_pid efa-plugin)" || why "the daemon (policy protect) is not running" || return 1
  e2e_wait_for 60 "the daemon (protect) to register" registrations_above "$before" \
    || why "the daemon with --mofed-policy protect did not register" || return 1
  log_since_has "$mark" "Policy protect: every EFA is reported Unhealthy" \
    || why "the daemon (policy protect) did not log the conflict with its policy: $(log_since "$mark" | grep -F MOFED | head -n1)" || return 1
  e2e_wait_for 60 "allocatable $EFA to drop to 0" node_efa_is allocatable 0 \
    || why "under policy protect allocatable $EFA is '$(node_field allocatable)', expected 0" || return 1
  node_efa_is capacity "$EFA_TOTAL" \
    || why "under policy protect capacity $EFA is '$(node_field capacity)', expected $EFA_TOTAL (kept)" || return 1
  info "protect: registered, every EFA Unhealthy: allocatable 0, capacity $EFA_TOTAL"

  # The conflict clears: the MOFED pod goes, the NVIDIA plugin is fixed, and
  # the next GPU admission makes the kubelet rewrite its checkpoint without
  # the MOFED entry (deleting a pod alone does not rewrite it).
  mark="$(log_mark)"
  delete_all_pods || why "cannot delete pod mofed-gpu" || return 1
  restart_fake_gpu_plugin || return 1
  create_pod gpu-after 0 1 || why "cannot create pod gpu-after" || return 1
  e2e_wait_for 90 "pod gpu-after to run" pod_running gpu-after \
    || why "pod gpu-after (1 GPU) is '$(pod_phase gpu-after)'" || return 1
  e2e_wait_for 60 "the daemon to log that the conflict cleared" log_since_has "$mark" "MOFED conflict cleared" \
    || why "the MOFED conflict did not clear after the MOFED pod went (checkpoint: $(jq -c '[.Data.PodDeviceEntries[] | {PodUID, ResourceName}]' "$CHECKPOINT" 2>&1))" || return 1
  e2e_wait_for 60 "allocatable $EFA back to $EFA_TOTAL" node_efa_is allocatable "$EFA_TOTAL" \
    || why "after the conflict cleared allocatable $EFA is '$(node_field allocatable)', expected $EFA_TOTAL" || return 1
  [ "$(e2e_pid efa-plugin)" = "$pid" ] || why "the daemon (pid $pid) did not stay up through the conflict" || return 1
  info "cleared: $(log_since "$mark" | grep -F "MOFED conflict cleared" | head -n1 | sed 's/^\[[^]]*\] //' | cut -c1-140)"
  info "cleared: the same daemon (pid $pid) offers $EFA_TOTAL EFAs again"

  # Back to the defaults.
  delete_all_pods || why "cannot delete pod gpu-after" || return 1
  stop_fake_gpu_plugin
  e2e_stop efa-plugin 10
  before="$(registrations)"
  start_daemon
  e2e_wait_for 60 "the daemon to register" registrations_above "$before" \
    && e2e_wait_for 60 "allocatable $EFA back to $EFA_TOTAL" node_efa_is allocatable "$EFA_TOTAL" \
    || why "the daemon restarted with its defaults does not offer $EFA_TOTAL EFAs" || return 1
}

# The fake NVIDIA plugin for checks 6 and 7: registers nvidia.com/gpu with 8
# UUIDs and writes $FAKE_PROC/driver/nvidia/gpus/<bdf>/information mapping them
# to the simulated GPUs' PCI addresses. Extra arguments (--mofed) are passed on.
start_fake_gpu_plugin() {
  # In a subshell: a plugin that cannot start fails the check, not the run.
  ( e2e_start fake-gpu-plugin "$FAKE_GPU_BIN" --kubelet-dir "$E2E_KUBELET_DIR" \
      --sysfs-root "$SIM/sys" --proc-root "$FAKE_PROC" "$@" ) \
    || why "the fake GPU plugin did not start (see $E2E_LOGS/fake-gpu-plugin.log)" || return 1
  e2e_wait_for 60 "node allocatable $GPU to be $GPU_TOTAL" gpu_allocatable_is "$GPU_TOTAL" \
    || why "with the fake GPU plugin registered, allocatable $GPU is '$(gpu_field allocatable)', expected $GPU_TOTAL" || return 1
}
stop_fake_gpu_plugin() { e2e_stop fake-gpu-plugin 10; }
# A fresh fake plugin with other flags: the old one's GPUs must be seen gone
# first (unhealthy: allocatable 0), or the wait for 8 would see the old ones.
restart_fake_gpu_plugin() {
  stop_fake_gpu_plugin
  e2e_wait_for 60 "allocatable $GPU to drop to 0" gpu_gone \
    || why "with the fake GPU plugin stopped, allocatable $GPU is '$(gpu_field allocatable)', expected 0" || return 1
  start_fake_gpu_plugin "$@"
}
gpu_field() {  # gpu_field capacity|allocatable
  e2e_kubectl get node "$E2E_NODE" -o "jsonpath={.status.$1.nvidia\.com/gpu}" 2>/dev/null
}
gpu_allocatable_is() { [ "$(gpu_field allocatable)" = "$1" ]; }
gpu_gone() { local a; a="$(gpu_field allocatable)"; [ -z "$a" ] || [ "$a" = 0 ]; }

# --- checks 8-10: the Helm chart ---------------------------------------------
# Check 8 needs the apiserver only; 9 and 10 run the chart's pod on the
# kubelet, from the image built from the Dockerfile (EFA_E2E_IMAGE_TAR: an
# archive of `podman save`, imported into the cluster's containerd). The
# chart comes as users get it: from a chart repository (add_chart_repo).
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
# sysfs and /dev; CDI specs looked for in the test's own (empty) directory.
chart_values() {
  printf '%s\n' --set "image.repository=${PLUGIN_IMAGE%:*}" --set "image.tag=${PLUGIN_IMAGE##*:}" \
    --set image.pullPolicy=Never --set "hostPaths.sysfs=$SIM/sys" --set "hostPaths.dev=$DEV_ROOT" \
    --set-json "guards.mofed.cdiSpecDirs=[\"$CDI_DIR\"]"
}

# The chart repository of a release: scripts/release.sh's packaged chart and
# index.yaml (without the image, which the checks import themselves), served
# over HTTP on 127.0.0.1 (a free port) and added as README tells users
# (`helm repo add efa URL`); the checks then install and upgrade
# $CHART_REF. Once per run.
add_chart_repo() {
  [ -z "$CHART_REPO_URL" ] || return 0
  local out log="$E2E_LOGS/chart-repo.log" port
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
  e2e_kubectl logs -n "$CHART_NS" "$pod" 2>/dev/null | grep -qF "registered $EFA with the kubelet" \
    || why "the chart's pod did not log its registration: $(e2e_kubectl logs -n "$CHART_NS" "$pod" 2>&1 | tail -n 5 | paste -sd' ')" || return 1
  CHART_POD="$pod"
}

# --- check 11: sharing --------------------------------------------------------
readonly SHARING_REPLICAS=4
readonly SHARED_GPU_PODS=8    # pods of 1 GPU + 4 EFA
readonly SHARED_EFA_PODS=16   # pods of 1 EFA

# The daemon restarted with `flags`, registered again and showing $1
# allocatable EFAs.
restart_host_daemon() {
  local want="$1"; shift
  local before; before="$(registrations)"
  e2e_stop efa-plugin 10
  start_daemon "$@"
  e2e_wait_for 60 "the restarted daemon to register" registrations_above "$before" \
    || why "the daemon restarted with [$*] did not register (see $E2E_LOGS/efa-plugin.log)" || return 1
  e2e_wait_for 60 "node allocatable $EFA to be $want" node_efa_is allocatable "$want" \
    || why "with the daemon restarted with [$*] allocatable $EFA is '$(node_field allocatable)', expected $want" || return 1
}

check_11_sharing() {
  delete_all_pods || why "cannot delete the earlier checks' pods" || return 1
  restart_fake_gpu_plugin || return 1
  read_fake_gpus || why "the fake GPU plugin wrote ${#GPU_PCI_OF_UUID[@]} GPUs, expected $GPU_TOTAL" || return 1
  local total=$((EFA_TOTAL * SHARING_REPLICAS))
  restart_host_daemon "$total" --sharing-replicas "$SHARING_REPLICAS" || return 1
  local ids; ids="$(jq -r --arg res "$EFA" '.Data.RegisteredDevices[$res][]?' "$CHECKPOINT" | sort -V | head -n 2 | paste -sd,)"
  info "replicas $SHARING_REPLICAS: allocatable $EFA $(node_field allocatable), capacity $(node_field capacity); first IDs $ids"

  # Two EFA-only pods, then a GPU pod, all created at once.
  local -a pods=() gpu_pods=() efa_pods=()
  local i g=0 e=0 manifests=""
  for ((i = 0; i < SHARED_GPU_PODS + SHARED_EFA_PODS; i++)); do
    if ((i % 3 == 2)); then
      g=$((g + 1)); pods+=("shared-gpu-$g"); gpu_pods+=("shared-gpu-$g")
      manifests+="$(pod_manifest "shared-gpu-$g" 4 1)"$'\n---\n'
    else
      e=$((e + 1)); pods+=("shared-efa-$e"); efa_pods+=("shared-efa-$e")
      manifests+="$(pod_manifest "shared-efa-$e" 1)"$'\n---\n'
    fi
  done
  e2e_kubectl apply -f - <<< "$manifests" >/dev/null || why "cannot create the sharing pods" || return 1
  e2e_wait_for 240 "${#pods[@]} sharing pods to run" all_running "${pods[@]}" \
    || why "not every sharing pod runs: $(not_running "${pods[@]}")" || return 1

  # Each pod's device nodes, env and checkpoint (physical EFAs, each once).
  local pod uses=""
  for pod in "${efa_pods[@]}"; do
    verify_pod "$pod" 1 || { reason="$pod: $reason"; return 1; }
    uses+="$VIEW_NAMES"$'\n'
  done
  local aligned=0 env gpu_pci efa_pci verdict
  for pod in "${gpu_pods[@]}"; do
    verify_pod "$pod" 4 || { reason="$pod: $reason"; return 1; }
    uses+="$VIEW_NAMES"$'\n'
    env="$(gpu_pod_env "$pod" 2>&1)" || why "kubectl exec $pod failed: $env" || return 1
    gpu_pci="${GPU_PCI_OF_UUID[$(env_value "$env" GPU)]:-}"
    efa_pci="$(env_value "$env" EFA_PCI)"
    if efas_with_gpu "$efa_pci" "$gpu_pci"; then verdict=aligned; aligned=$((aligned + 1)); else verdict="NOT aligned"; fi
    info "$pod: GPU $gpu_pci, EFAs $efa_pci: $verdict"
  done
  local most; most="$(grep . <<< "$uses" | sort | uniq -c | sort -rn | head -n1)"
  local used; used="$(grep . <<< "$uses" | sort -u | grep -c .)"
  info "$((SHARED_GPU_PODS + SHARED_EFA_PODS)) pods run at once on $used EFAs; the most shared: $(awk '{print $2" by "$1" containers"}' <<< "$most")"
  echo "    sharing alignment rate: $aligned/$SHARED_GPU_PODS"
  local percent=$((100 * aligned / SHARED_GPU_PODS))
  [ "$percent" -ge "$ALIGN_MIN_PERCENT" ] \
    || why "with sharing $aligned of $SHARED_GPU_PODS GPU pods are aligned ($percent%, below $ALIGN_MIN_PERCENT%)" || return 1
  [ "$(awk '{print $1}' <<< "$most")" -le "$SHARING_REPLICAS" ] \
    || why "an EFA is shared by more containers than its replicas: $most" || return 1

  # Back to exclusive EFAs for the checks after this one.
  delete_all_pods || why "cannot delete the sharing pods" || return 1
  stop_fake_gpu_plugin
  restart_host_daemon "$EFA_TOTAL" || return 1
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

# --- check 12: late binding on the real kubelet and containerd 1.7 -----------
# Kubelet 1.20 drops an Allocate answer's cdi_devices (1.28+) but copies its
# annotations into the CRI config (pkg/kubelet/cm/devicemanager/pod_devices.go,
# deviceRunContainerOptions; kuberuntime/labels.go, newContainerAnnotations);
# containerd 1.7 with enable_cdi injects the CDI devices a cdi.k8s.io/
# annotation names. So the daemon's default handover (both) reaches the
# container here through the annotation.
readonly LATE_PODS=8   # pods of 1 GPU + 4 EFA, all at once: both allocation orders

# The late-binding spec files in the CDI dir, one a line.
late_specs() { find "$CDI_DIR" -maxdepth 1 -name 'vpc.amazonaws.com-efa_claim-*.json' -printf '%f\n' | sort; }
# The spec naming exactly these EFAs (comma-separated, as EFA_DEVICES).
spec_of() { grep -lF "\"EFA_DEVICES=$1\"" "$CDI_DIR"/vpc.amazonaws.com-efa_claim-*.json 2>/dev/null; }
spec_gone() { [ -z "$(spec_of "$1")" ]; }
container_of() { e2e_kubectl get pod "$1" -o 'jsonpath={.status.containerStatuses[0].containerID}' | sed 's|^containerd://||'; }
restarts_of() { e2e_kubectl get pod "$1" -o 'jsonpath={.status.containerStatuses[0].restartCount}'; }
restarted_running() { pod_running "$1" && [ "$(restarts_of "$1")" = "$2" ] \
  && [ "$(e2e_kubectl get pod "$1" -o 'jsonpath={.status.containerStatuses[0].ready}')" = true ]; }

# What a late-bound pod holds: its /dev/infiniband is exactly the nodes of the
# EFAs its EFA_DEVICES names, whose spec is on disk. Sets LATE_VIEW
# ("EFAs|GPU PCI|EFA PCI|devices").
verify_late_pod() {
  local pod="$1" view env names devs want="" n
  view="$(pod_view "$pod" 2>&1)" || why "kubectl exec $pod failed: $view" || return 1
  env="$(gpu_pod_env "$pod" 2>&1)" || why "kubectl exec $pod failed: $env" || return 1
  names="$(view_env "$view" EFA_DEVICES)"
  local -a list; IFS=, read -r -a list <<< "$names"
  [ "${#list[@]}" -eq 4 ] || why "$pod has EFA_DEVICES='$names', expected 4 EFAs (from its CDI spec)" || return 1
  for n in "${list[@]}"; do
    [ -n "${SIM_UVERBS[$n]:-}" ] || why "$pod: EFA_DEVICES names $n, which the node does not have" || return 1
    want+="${SIM_UVERBS[$n]} ${SIM_DEV[$n]} character special file"$'\n'
  done
  want="$(sort -V <<< "${want%$'\n'}")"
  devs="$(view_devices "$view")"
  [ "$devs" = "$want" ] || why "/dev/infiniband in $pod holds [$(flat "$devs")], expected exactly [$(flat "$want")] (EFA_DEVICES=$names)" || return 1
  [ -n "$(spec_of "$names")" ] || why "no CDI spec in $CDI_DIR binds $names, which $pod has" || return 1
  local gpu_pci="${GPU_PCI_OF_UUID[$(env_value "$env" GPU)]:-}"
  [ -n "$gpu_pci" ] || why "$pod has no GPU of the fake driver: $(flat "$env")" || return 1
  LATE_VIEW="$names|$gpu_pci|$(env_value "$env" EFA_PCI)|$devs"
}

check_12_late_binding() {
  delete_all_pods || why "cannot delete the earlier checks' pods" || return 1
  read_layout || why "the topology command does not show 4 EFAs behind each GPU's switch" || return 1
  if ! e2e_pid fake-gpu-plugin >/dev/null; then start_fake_gpu_plugin || return 1; fi
  read_fake_gpus || why "the fake GPU plugin wrote ${#GPU_PCI_OF_UUID[@]} GPUs, expected $GPU_TOTAL" || return 1
  restart_host_daemon "$EFA_TOTAL" --alignment late-binding --cdi-dir "$CDI_DIR" || return 1
  local pid; pid="$(e2e_pid containerd)" || why "containerd is not running" || return 1
  info "runtime: $("$(readlink "/proc/$pid/exe")" --version)"

  # OnFailure: a killed container is restarted (PreStartContainer again).
  local -a pods=(); local i manifests=""
  for ((i = 1; i <= LATE_PODS; i++)); do
    pods+=("late-$i")
    manifests+="$(pod_manifest "late-$i" 4 1 | sed 's/restartPolicy: Never/restartPolicy: OnFailure/')"$'\n---\n'
  done
  e2e_kubectl apply -f - <<< "$manifests" >/dev/null || why "cannot create the late-binding pods" || return 1
  e2e_wait_for 120 "${#pods[@]} late-binding pods to run" all_running "${pods[@]}" \
    || why "not every late-binding pod runs: $(not_running "${pods[@]}")" || return 1

  declare -A view=()
  local pod uses="" gpu_first=0 efa_first=0 first names gpu_pci efa_pci
  for pod in "${pods[@]}"; do
    verify_late_pod "$pod" || return 1
    view[$pod]="$LATE_VIEW"
    IFS='|' read -r names gpu_pci efa_pci _ <<< "$LATE_VIEW"
    uses+="$(tr , '\n' <<< "$names")"$'\n'
    first="$(first_allocated "$(pod_uid "$pod")")"
    case "$first" in
      "$GPU") gpu_first=$((gpu_first + 1)) ;;
      "$EFA") efa_first=$((efa_first + 1)) ;;
      *) why "the kubelet log has no allocation lines for $pod" || return 1 ;;
    esac
    efas_with_gpu "$efa_pci" "$gpu_pci" \
      || why "$pod ($( [ "$first" = "$GPU" ] && echo "GPU first" || echo "EFAs first")): EFAs $efa_pci are not beside its GPU $gpu_pci" || return 1
    info "$pod: GPU $gpu_pci, EFAs $efa_pci: aligned ($( [ "$first" = "$GPU" ] && echo "GPU first" || echo "EFAs first"))"
  done
  local twice; twice="$(grep . <<< "$uses" | sort | uniq -d)"
  [ -z "$twice" ] || why "EFAs given to two containers: $(flat "$twice")" || return 1
  [ "$(late_specs | grep -c .)" -eq "$LATE_PODS" ] \
    || why "$CDI_DIR holds $(late_specs | grep -c .) specs for $LATE_PODS containers: $(flat "$(late_specs)")" || return 1
  local via; via="$(grep -c 'CDI devices from annotations: \[vpc.amazonaws.com/efa=claim-' "$E2E_LOGS/containerd.log" || true)"
  [ "$via" -ge "$LATE_PODS" ] || why "containerd logged $via containers given the EFA CDI device through the annotation, expected $LATE_PODS" || return 1
  info "kubelet order: GPU first for $gpu_first pods, EFAs first for $efa_first; all $LATE_PODS aligned; containerd injected the annotated CDI device $via times"

  # A kubelet restart: the running containers keep their EFAs and their specs.
  declare -A container=()
  for pod in "${pods[@]}"; do container[$pod]="$(container_of "$pod")"; done
  local before; before="$(registrations)"
  "$here/cluster.sh" restart-kubelet || why "the kubelet did not restart (see $E2E_LOGS/kubelet.log)" || return 1
  e2e_wait_for 60 "the daemon to register again" registrations_above "$before" \
    || why "the daemon did not register again after the kubelet restart" || return 1
  e2e_wait_for 60 "allocatable $EFA back" node_efa_is allocatable "$EFA_TOTAL" \
    || why "allocatable $EFA is '$(node_field allocatable)' after the kubelet restart, expected $EFA_TOTAL" || return 1
  for pod in "${pods[@]}"; do
    [ "$(container_of "$pod")" = "${container[$pod]}" ] || why "$pod's container changed across the kubelet restart" || return 1
    verify_late_pod "$pod" || { reason="after the kubelet restart: $reason"; return 1; }
    [ "$LATE_VIEW" = "${view[$pod]}" ] || why "$pod holds [${LATE_VIEW}] after the kubelet restart, before [${view[$pod]}]" || return 1
  done
  [ "$(late_specs | grep -c .)" -eq "$LATE_PODS" ] \
    || why "after the kubelet restart $CDI_DIR holds $(late_specs | grep -c .) specs for $LATE_PODS running containers" || return 1
  info "kubelet restarted: the $LATE_PODS containers and their $LATE_PODS specs kept"

  # A container restart: PreStartContainer again, the same EFAs. (Each
  # binding first releases what no container holds: a release that took the
  # restarted kubelet's word too early shows here.)
  pod="${pods[0]}"
  ctr --address "$E2E_CONTAINERD_SOCK" -n k8s.io tasks kill -s SIGKILL "${container[$pod]}" >/dev/null 2>&1 \
    || why "cannot kill $pod's container ${container[$pod]}" || return 1
  e2e_wait_for 90 "$pod's container to run again" restarted_running "$pod" 1 \
    || why "$pod's container did not restart: $(pod_json "$pod" | jq -c '.status.containerStatuses')" || return 1
  verify_late_pod "$pod" || { reason="after the container restart: $reason"; return 1; }
  [ "$LATE_VIEW" = "${view[$pod]}" ] || why "$pod holds [${LATE_VIEW}] after its container restarted, before [${view[$pod]}]" || return 1
  [ "$(late_specs | grep -c .)" -eq "$LATE_PODS" ] \
    || why "after $pod's container restart $CDI_DIR holds $(late_specs | grep -c .) specs for $LATE_PODS running containers" || return 1
  info "$pod's container restarted (restartCount 1) with the same EFAs: ${LATE_VIEW%%|*}"

  # A deleted pod's spec goes; the others stay.
  pod="${pods[1]}"
  names="${view[$pod]%%|*}"
  delete_pod "$pod" || why "cannot delete pod $pod" || return 1
  e2e_wait_for 60 "the spec of $pod to go" spec_gone "$names" \
    || why "the spec of deleted pod $pod ($names) is still in $CDI_DIR: $(spec_of "$names")" || return 1
  [ "$(late_specs | grep -c .)" -eq $((LATE_PODS - 1)) ] \
    || why "after deleting $pod $CDI_DIR holds $(late_specs | grep -c .) specs, expected $((LATE_PODS - 1))" || return 1
  info "$pod deleted: its spec removed, the other $((LATE_PODS - 1)) kept"

  delete_all_pods || why "cannot delete the late-binding pods" || return 1
  e2e_wait_for 60 "every spec to go" bash -c "[ -z \"\$(find '$CDI_DIR' -name 'vpc.amazonaws.com-efa_claim-*.json')\" ]" \
    || why "with every pod deleted $CDI_DIR still holds $(flat "$(late_specs)")" || return 1
  stop_fake_gpu_plugin
  restart_host_daemon "$EFA_TOTAL" || return 1
}

# --- setup and teardown -----------------------------------------------------
build_all() {
  local t=$SECONDS
  "$here/build-kubernetes.sh" --with-helm >/dev/null || return 1
  times[kubernetes_build]=$((SECONDS - t))
  t=$SECONDS
  # What the checks use besides the cluster's own packages (cluster.sh).
  e2e_ensure_packages cmake ninja-build jq procps iproute2 binutils || return 1
  "$repo/scripts/install-deps.sh" || return 1
  # A build dir configured already (a preset's, e.g. build/ci under CTest) is
  # used as it is: its generator, type and flags; then this step builds
  # nothing when those binaries are up to date.
  if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
    cmake -S "$repo" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null || return 1
  fi
  cmake --build "$BUILD_DIR" -j "$JOBS" --target efa-k8s-device-plugin efa-simnode fake-gpu-plugin \
    > "$E2E_CACHE/daemon-build.log" 2>&1 \
    || { tail -n 30 "$E2E_CACHE/daemon-build.log"; return 1; }
  local bin
  for bin in "$PLUGIN_BIN" "$SIMNODE_BIN" "$FAKE_GPU_BIN"; do
    [ -x "$bin" ] || { echo "build_all: $bin was not built (the build dir's layout?)"; return 1; }
  done
  times[daemon_build]=$((SECONDS - t))
}

make_node() {
  "$SIMNODE_BIN" "$MACHINE" "$SIM" >/dev/null || why "efa-simnode $MACHINE $SIM failed" || return 1
  # Real character devices with the numbers the simulated sysfs gives.
  mkdir -p "$DEV_ROOT/infiniband" "$FAKE_PROC" "$CDI_DIR"
  local d name maj min count=0
  for d in "$SIM"/sys/class/infiniband_verbs/uverbs*; do
    name="$(basename "$d")"
    IFS=: read -r maj min < "$d/dev"
    mknod -m 0666 "$DEV_ROOT/infiniband/$name" c "$maj" "$min" || why "mknod $DEV_ROOT/infiniband/$name failed" || return 1
    count=$((count + 1))
  done
  [ "$count" -eq "$EFA_TOTAL" ] || why "the simulated $MACHINE has $count uverbs devices, expected $EFA_TOTAL" || return 1
  read_sim_node
  [ "${#SIM_UVERBS[@]}" -eq "$EFA_TOTAL" ] || why "the simulated $MACHINE names ${#SIM_UVERBS[@]} verbs devices, expected $EFA_TOTAL" || return 1
}

teardown() {
  [ "$torn_down" -eq 1 ] && return 0
  torn_down=1
  if [ "${EFA_E2E_KEEP:-0}" = 1 ] && [ "$cluster_started" -eq 1 ]; then
    echo "--- EFA_E2E_KEEP=1: cluster and daemon left running; KUBECONFIG=$E2E_KUBECONFIG;" \
         "end them with: $here/cluster.sh down"
    return 0
  fi
  e2e_stop fake-gpu-plugin 10 2>/dev/null || true
  e2e_stop efa-plugin 10 2>/dev/null || true
  if [ "$cluster_started" -eq 1 ]; then
    local t=$SECONDS
    "$here/cluster.sh" down || echo "FAIL teardown: cluster.sh down failed"
    times[teardown]=$((SECONDS - t))
  fi
}

# The machine is left as found.
check_clean() {
  local left=()
  [ ! -e "$E2E_STATE" ] || left+=("$E2E_STATE")
  [ ! -e "$E2E_KUBELET_DIR" ] || left+=("$E2E_KUBELET_DIR")
  findmnt -rn -o TARGET | grep -e "^$E2E_KUBELET_DIR" -e "^$E2E_STATE" >/dev/null && left+=("mounts")
  ! ip link show "$E2E_BRIDGE" >/dev/null 2>&1 || left+=("link $E2E_BRIDGE")
  compgen -G "/sys/fs/cgroup/*/kubepods" >/dev/null && left+=("kubepods cgroups")
  pgrep -f "containerd-shim-runc-v2 .*-address $E2E_CONTAINERD_SOCK" >/dev/null && left+=("shims")
  [ ${#left[@]} -eq 0 ] || why "left behind: ${left[*]}"
}

finish() {
  if [ "$completed" -eq 0 ] && [ "$setup_reported" -eq 0 ]; then
    echo "FAIL aborted: the suite stopped before all checks ran (see messages above)"
    failed=$((failed + 1))
  fi
  teardown
  if [ "$cluster_started" -eq 1 ] && [ "${EFA_E2E_KEEP:-0}" != 1 ]; then
    reason=""
    if check_clean; then
      echo "PASS teardown: machine clean"; passed=$((passed + 1))
    else
      echo "FAIL teardown: $reason"; failed=$((failed + 1))
    fi
  fi
  times[total]=$((SECONDS - start))
  echo "--- logs: $E2E_LOGS"
  echo "--- times (s): kubernetes build ${times[kubernetes_build]:--}, daemon build ${times[daemon_build]:--}," \
       "cluster up ${times[cluster_up]:--}, checks ${times[checks]:--}, teardown ${times[teardown]:--}, total ${times[total]}"
  echo "$passed passed, $failed failed${skipped:+, $skipped skipped}"
  trap - EXIT
  [ "$failed" -eq 0 ] && exit 0 || exit 1
}

on_signal() {
  echo "FAIL interrupted by a signal"
  failed=$((failed + 1))
  setup_reported=1
  finish
}

main() {
  start=$SECONDS
  [ "$(id -u)" -eq 0 ] || { echo "FAIL setup: must run as root (mknod, mounts, containerd)"; echo "0 passed, 1 failed"; exit 1; }
  mkdir -p "$E2E_CACHE"
  # Held on fd 9 for the whole run; e2e_start closes it in the daemons.
  exec 9>"$E2E_CACHE/run.lock"
  flock -n 9 || { echo "FAIL setup: another end-to-end run holds $E2E_CACHE/run.lock"; echo "0 passed, 1 failed"; exit 1; }
  trap finish EXIT
  trap on_signal INT TERM

  echo "--- building (kubernetes in $E2E_CACHE, daemon in $BUILD_DIR)"
  build_all || setup_failed "cannot build Kubernetes or the daemon (see messages above)"
  echo "--- starting the cluster"
  local t=$SECONDS
  if [ -e "$E2E_STATE" ]; then
    # We hold the lock, so no other run owns it: an earlier run died (or was
    # kept with EFA_E2E_KEEP=1). Its processes are recorded; end them.
    echo "--- $E2E_STATE is left from an earlier run: tearing that cluster down first"
    "$here/cluster.sh" down || setup_failed "cannot tear down the earlier run's cluster"
  fi
  cluster_started=1   # `down` is safe after a partial `up`
  "$here/cluster.sh" up || setup_failed "the cluster did not come up (logs: $E2E_LOGS)"
  times[cluster_up]=$((SECONDS - t))
  echo "--- simulated $MACHINE at $SIM, device nodes in $DEV_ROOT"
  make_node || setup_failed "$reason"
  start_daemon
  e2e_wait_for 60 "the daemon to register" registrations_above 0 \
    || setup_failed "the daemon did not register with the kubelet (see $E2E_LOGS/efa-plugin.log)"

  t=$SECONDS
  run_check 1 "the node shows $EFA_TOTAL allocatable EFAs" check_1_count
  run_check 2 "a 4-EFA pod gets exactly its 4 device nodes and env" check_2_pod
  run_check 3 "a pod asking more than is free fails admission" check_3_too_many
  run_check 4 "kubelet restart: re-registration, running pod keeps its devices" check_4_kubelet_restart
  run_check 5 "daemon killed and restarted: unhealthy, healthy, no double allocation" check_5_daemon_restart
  run_check 6 "alignment of $ALIGN_PODS pods of 1 GPU + 4 EFA with a fake NVIDIA plugin" check_6_alignment
  run_check 7 "the MOFED guard trips on NVIDIA_MOFED=enabled (warn, protect, cleared)" check_7_mofed_guard
  run_check 8 "helm upgrade of a release of AWS's chart updates its DaemonSet in place" check_8_upgrade_in_place
  run_check 11 "sharing: replicas $SHARING_REPLICAS show $((EFA_TOTAL * SHARING_REPLICAS)) EFAs; $SHARED_GPU_PODS GPU pods and $SHARED_EFA_PODS EFA-only pods run at once" check_11_sharing
  run_check 12 "late binding on containerd 1.7 (CDI annotation): $LATE_PODS pods of 1 GPU + 4 EFA get the EFAs beside their GPU; kept across a kubelet and a container restart; specs removed with their pods" check_12_late_binding
  if [ -n "${EFA_E2E_IMAGE_TAR:-}" ]; then
    run_check 9 "the Helm chart's pod runs on the kubelet and serves the node" check_9_chart_on_kubelet
    run_check 10 "helm upgrade replaces the running pod of AWS's chart with the chart's" check_10_upgrade_on_kubelet
  else
    # The image is built by the full tier only (scripts/test.sh --all, CI).
    for n in 9 10; do
      selected "$n" || continue
      echo "SKIP check $n: needs the image (EFA_E2E_IMAGE_TAR; scripts/test.sh --all builds it)"
      skipped=$((skipped + 1))
    done
  fi
  times[checks]=$((SECONDS - t))
  completed=1
  finish
}

main "$@"
