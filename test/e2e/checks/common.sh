# shellcheck shell=bash
# What every group of checks uses: the node's EFA counts, the daemon, pods
# and what their containers see, the kubelet's checkpoint, the daemon's log.
# Sourced by run.sh (which defines the settings and the reporting helpers
# these use), not run by itself.

node_field() {  # node_field capacity|allocatable
  e2e_kubectl get node "$E2E_NODE" -o "jsonpath={.status.$1.vpc\.amazonaws\.com/efa}" 2>/dev/null
}
node_efa_is() { [ "$(node_field "$1")" = "$2" ]; }
# pod_logged NAMESPACE POD TEXT: whether the pod's log has TEXT (the whole
# log read: grep -q would end kubectl early, a failure under pipefail).
pod_logged() { e2e_kubectl logs -n "$1" "$2" 2>/dev/null | grep -F "$3" >/dev/null; }

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

# pod_manifest NAME EFA_COUNT [GPU_COUNT [RESOURCE]]: a busybox pod bound to
# the node, asking for EFA_COUNT of RESOURCE (default $EFA).
pod_manifest() {
  local name="$1" efa="$2" gpu="${3:-0}" resource="${4:-$EFA}"
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
$( [ "$efa" -gt 0 ] && echo "        $resource: $efa" )
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
# shellcheck disable=SC2034  # VIEW_NAMES and VIEW_DEVS are for the checks
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

# The allocatable column README tells users to look at shows $EFA_TOTAL EFAs
# for the node (printed).
efa_column_shows_all() {
  local out
  out="$(e2e_kubectl get nodes -o 'custom-columns=NAME:.metadata.name,EFA:.status.allocatable.vpc\.amazonaws\.com/efa' 2>&1)"
  info "$(sed '2,$s/^/    /' <<< "$out")"
  local count; count="$(awk -v n="$E2E_NODE" '$1 == n { print $2 }' <<< "$out")"
  [ "$count" = "$EFA_TOTAL" ] || why "kubectl get nodes shows EFA '$count' for $E2E_NODE, expected $EFA_TOTAL"
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
