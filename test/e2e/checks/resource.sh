# shellcheck shell=bash
# Checks 1-5: the EFA resource itself, as the kubelet sees it: the node's
# count, a pod's devices and env, admission beyond what is free, a kubelet
# restart and a daemon restart. Sourced by run.sh, not run by itself.
POD1_NAMES=""
POD1_DEVS=""
POD1_CONTAINER=""

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
  # shellcheck disable=SC2154  # here: run.sh's directory
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
