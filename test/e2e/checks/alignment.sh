# shellcheck shell=bash
# Check 6: alignment of pods of 1 GPU + 4 EFA with the fake NVIDIA plugin,
# against the PCI layout and the daemon's own report. Sourced by run.sh, not
# run by itself.
readonly ALIGN_PODS=20          # pods of 1 GPU + 4 EFA
# The kubelet allocates a container's resources in random order, so the EFAs
# are sometimes chosen before the GPU is known: the daemon must still align
# at least this share of the pods (check 11 too).
readonly ALIGN_MIN_PERCENT=95

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
  # shellcheck disable=SC2154  # reason: set by why (run.sh)
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
