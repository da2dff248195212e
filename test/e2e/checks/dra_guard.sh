# shellcheck shell=bash
# Check 15: the DRA guard on the real kubelet. Sourced by run.sh, not run by
# itself.

# A node moving to the EFA DRA driver: the fake DRA plugin registers in the
# kubelet's plugins_registry as DRANET's kubelet plugin does
# (dra.net-reg.sock, pluginregistration GetInfo "DRAPlugin"). The daemon
# (draPolicy yield, its default) withdraws vpc.amazonaws.com/efa: allocatable
# goes from $EFA_TOTAL to 0 while the driver serves, and back to $EFA_TOTAL
# when it goes, the same daemon process throughout; a pod admitted before
# keeps exactly its device nodes (checked from inside its container) at each
# step.
check_15_dra_guard() {
  delete_all_pods || why "cannot delete the earlier checks' pods" || return 1
  e2e_wait_for 60 "allocatable $EFA to be $EFA_TOTAL" node_efa_is allocatable "$EFA_TOTAL" \
    || why "before the DRA driver allocatable $EFA is '$(node_field allocatable)', expected $EFA_TOTAL" || return 1
  create_pod dra-before 4 || why "cannot create pod dra-before" || return 1
  e2e_wait_for 90 "pod dra-before to run" pod_running dra-before \
    || why "pod dra-before (4 EFA) is '$(pod_phase dra-before)'" || return 1
  verify_pod dra-before 4 || return 1
  local held="$VIEW_DEVS" pid
  pid="$(e2e_pid efa-plugin)" || why "the daemon is not running" || return 1
  info "allocatable $EFA_TOTAL; dra-before holds $(flat "$VIEW_NAMES")"

  local mark; mark="$(log_mark)"
  e2e_start fake-dra-plugin "$FAKE_DRA_BIN" --kubelet-dir "$E2E_KUBELET_DIR"
  e2e_wait_for 30 "the daemon to withdraw $EFA" log_since_has "$mark" "withdrawing $EFA" \
    || why "with dra.net-reg.sock serving the daemon did not withdraw $EFA (see $E2E_LOGS/efa-plugin.log)" || return 1
  e2e_wait_for 60 "allocatable $EFA to drop to 0" node_efa_is allocatable 0 \
    || why "with the DRA driver registered allocatable $EFA is '$(node_field allocatable)', expected 0" || return 1
  # The kubelet's plugin watcher found the socket (1.20 has no DRA handler).
  e2e_wait_for 30 "the kubelet to ask the fake DRA plugin GetInfo" \
    grep -F GetInfo "$E2E_LOGS/fake-dra-plugin.log" \
    || why "the kubelet never called GetInfo on dra.net-reg.sock" || return 1
  verify_pod dra-before 4 || return 1
  [ "$VIEW_DEVS" = "$held" ] \
    || why "withdrawn, dra-before holds [$(flat "$VIEW_DEVS")], it held [$(flat "$held")]" || return 1
  info "DRA driver registered: allocatable 0 ($(log_since "$mark" | grep -F "withdrawing $EFA" | head -n1 | sed 's/^\[[^]]*\] //' | cut -c1-100)...); dra-before keeps its device nodes"

  mark="$(log_mark)"
  e2e_stop fake-dra-plugin 10
  # Gone for 3 rescans (rescanInterval 10s) before the resource comes back.
  e2e_wait_for 30 "the daemon to hold the withdrawal" log_since_has "$mark" "stays withdrawn until it has stayed gone for 30s" \
    || why "with the fake DRA plugin stopped the daemon did not hold the withdrawal (see $E2E_LOGS/efa-plugin.log)" || return 1
  [ "$(node_field allocatable)" = 0 ] || why "within the hold-down allocatable $EFA is '$(node_field allocatable)', expected 0" || return 1
  e2e_wait_for 90 "the daemon to see the DRA driver gone" log_since_has "$mark" "the EFA DRA driver is gone" \
    || why "with the fake DRA plugin stopped the daemon did not log that the driver is gone" || return 1
  e2e_wait_for 60 "allocatable $EFA back to $EFA_TOTAL" node_efa_is allocatable "$EFA_TOTAL" \
    || why "with the DRA driver gone allocatable $EFA is '$(node_field allocatable)', expected $EFA_TOTAL" || return 1
  verify_pod dra-before 4 || return 1
  [ "$VIEW_DEVS" = "$held" ] \
    || why "after the driver went dra-before holds [$(flat "$VIEW_DEVS")], it held [$(flat "$held")]" || return 1
  [ "$(e2e_pid efa-plugin)" = "$pid" ] || why "the daemon (pid $pid) did not stay up through the yield" || return 1
  info "DRA driver gone: allocatable $EFA_TOTAL again from the same daemon (pid $pid); dra-before keeps its device nodes"
  delete_pod dra-before || why "cannot delete pod dra-before" || return 1
}
