# shellcheck shell=bash
# The checks with GPUs (6, 7, 11, 12): the fake NVIDIA plugin, the PCI layout
# of EFAs and GPUs, and what a GPU pod's container was given. Sourced by
# run.sh, not run by itself.
readonly GPU="nvidia.com/gpu"
readonly GPU_TOTAL=8

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
