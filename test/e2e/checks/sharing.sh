# shellcheck shell=bash
# Check 11: sharing, the daemon restarted with --sharing-replicas. Sourced by
# run.sh, not run by itself.
readonly SHARING_REPLICAS=4
readonly SHARED_GPU_PODS=8    # pods of 1 GPU + 4 EFA
readonly SHARED_EFA_PODS=16   # pods of 1 EFA

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
