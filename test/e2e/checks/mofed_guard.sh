# shellcheck shell=bash
# Check 7: the MOFED guard against the kubelet's own checkpoint. Sourced by
# run.sh, not run by itself.

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
