# shellcheck shell=bash
# Check 12: late binding on the real kubelet and containerd 1.7. Sourced by
# run.sh, not run by itself.
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
  # shellcheck disable=SC2154  # here: run.sh's directory
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
