# shellcheck shell=bash
# Check 14: pods holding EFAs through simulated node reboots, with the
# chart's DaemonSet and with the host install. Sourced by run.sh, not run
# by itself.
#
# A reboot here is `cluster.sh node-down` (the kubelet and containerd stop,
# every container and shim is killed, containerd's state, the CDI dir, the
# pods' volumes and cgroups go as tmpfs would; the kubelet's dir and its
# checkpoint, stale sockets included, and containerd's images and container
# records stay, as on disk), then `cluster.sh node-up` (containerd, then the
# kubelet). The node holds, with restartPolicy Always (a Deployment's or a
# training job's pod):
#   rb-be   4 EFAs, admitted under best effort (its Allocate answer gave
#           device nodes by ID)
#   rb-lb   4 EFAs, admitted under late binding (its CDI spec goes with the
#           CDI dir at each reboot)
#   rb-new-N  2 EFAs, bound to the node (spec.nodeName, as the scheduler
#           binds) while it is down: a pod the kubelet has never admitted
# After each reboot every pod is either admitted again (it runs, in a new
# container) or rejected (Failed, UnexpectedAdmissionError); the counts are
# printed per install as "reboot: N/M pods admitted again (...)".
#   DaemonSet  the chart's pod (EFA_E2E_IMAGE_TAR's image, else one of this
#              build's binaries, as check 13; EFA_E2E_REBOOT_VALUES: more
#              `helm install` arguments, e.g. "--set hostNetwork=true") is
#              one of the pods the kubelet starts after the reboot.
#              Measured, not asserted.
#   host       the daemon as the packaged unit runs it (its ExecStart, its
#              config file path /etc/efa-k8s-device-plugin/config.yaml),
#              started before the kubelet as Before=kubelet.service orders
#              it, and killed with the node. Asserted: every pod that ran
#              before the reboot admitted again and running, every reboot.
#              The pod bound while the node was down is measured only.
# Kubelet 1.20.2 admits a pod its checkpoint holds without asking whether the
# plugin registered (devicesToAllocate: "pre-allocated devices", needed 0),
# and fails one it never admitted while no device is healthy; the newest
# kubelet fails both (docs/install.md, "After a node reboot"). It admits or
# rejects the pods from the API server tens of milliseconds after it serves
# kubelet.sock, so each reboot prints, from the kubelet's log, the time from
# its start and from kubelet.sock to the pods' admission and to the
# plugin's registration (and, for the DaemonSet, to the daemon's first and
# "registered" log lines): BENCHMARKS.md, "Reboot".
readonly REBOOTS="${EFA_E2E_REBOOTS:-2}"
readonly REBOOT_WAIT=60
readonly HOST_CONFIG_DIR=/etc/efa-k8s-device-plugin
# shellcheck disable=SC2154  # repo: run.sh's checkout
readonly HOST_UNIT="$repo/packaging/efa-k8s-device-plugin.service"

declare -A RB_CONTAINER=()  # pod -> its container ID before the reboot
declare -A RB_TALLY=()      # "INSTALL KIND" -> "admitted total"
declare -A RB_LAG=()        # install -> each reboot's seconds from kubelet.sock to the registration
declare -A RB_START=()      # install -> each reboot's seconds from the kubelet's start to it
RB_PROBLEMS=()              # what the host install must not show
RB_CONFIG_MADE=0            # this check made HOST_CONFIG_DIR

# rb_create NAME EFAS: a pod of EFAS EFAs bound to the node, restarted
# whenever its container ends.
rb_create() {
  pod_manifest "$1" "$2" | sed 's/restartPolicy: Never/restartPolicy: Always/' | e2e_kubectl apply -f - >/dev/null
}
rb_container() { e2e_kubectl get pod "$1" -o 'jsonpath={.status.containerStatuses[0].containerID}' 2>/dev/null; }
rb_reason() { e2e_kubectl get pod "$1" -o 'jsonpath={.status.reason}' 2>/dev/null; }
# Running and ready in a container other than OLD (none: any).
rb_running_anew() {
  local id
  pod_running "$1" || return 1
  [ "$(e2e_kubectl get pod "$1" -o 'jsonpath={.status.containerStatuses[0].ready}')" = true ] || return 1
  id="$(rb_container "$1")"
  [ -n "$id" ] && [ "$id" != "${2:-}" ]
}
rb_settled() { pod_failed "$1" || rb_running_anew "$1" "${2:-}"; }
rb_all_settled() {
  local pod
  for pod in "$@"; do rb_settled "$pod" "${RB_CONTAINER[$pod]:-}" || return 1; done
}

# The kubelet's log after line MARK: the time (seconds since the epoch) of
# the first line holding TEXT (klog's header: "I1207 04:00:30.806970").
kubelet_since() { tail -n "+$(($1 + 1))" "$E2E_LOGS/kubelet.log"; }
kubelet_has_since() { kubelet_since "$1" | grep -F -- "$2" >/dev/null; }
kubelet_epoch() {
  local header
  header="$(kubelet_since "$1" | grep -m1 -F -- "$2" | cut -c1-21)"
  [ -n "$header" ] || return 1
  date -d "$(date +%Y)-${header:1:2}-${header:3:2} ${header:6:15}" +%s.%N
}
# What the kubelet logs: its start (its version, the first klog line), its
# device-plugin socket served, the pods from the API server (each admitted
# or rejected at once, before anything else of this sync), the plugin's
# registration.
readonly KL_START="] Version: v"
readonly KL_SOCKET="Serving device plugin registration server on"
readonly KL_ADD='SyncLoop (ADD, "api")'
readonly KL_REGISTERED="Got registration request from device plugin with resource name \"$EFA\""
rfc3339_epoch() { date -d "$1" +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

# The DaemonSet's pod: when its daemon logged its first line and its
# registration (kubectl logs --timestamps: the runtime's time of each line).
chart_pod_times() {
  local pod="$1" logs first reg
  logs="$(e2e_kubectl logs -n "$CHART_NS" "$pod" --timestamps 2>/dev/null)"
  first="$(head -n1 <<< "$logs" | cut -d' ' -f1)"
  reg="$(grep -m1 -F "registered $EFA with the kubelet" <<< "$logs" | cut -d' ' -f1)"
  [ -n "$first" ] && [ -n "$reg" ] || return 1
  echo "$(rfc3339_epoch "$first") $(rfc3339_epoch "$reg")"
}

# The host install: the packaged unit's ExecStart with this build's binary,
# its config file (packaging/config.yaml) with the simulated node's roots
# and late binding's CDI dir added, and listeners on free ports.
host_config_write() {
  if [ -e "$HOST_CONFIG_DIR" ]; then
    why "$HOST_CONFIG_DIR exists on this machine (a host install?): not overwriting it"
    return 1
  fi
  # `cluster.sh down` removes it should this run end early.
  echo "$HOST_CONFIG_DIR" >> "$E2E_STATE/created"
  mkdir -p "$HOST_CONFIG_DIR"
  RB_CONFIG_MADE=1
  sed -e 's/^metricsAddress: .*/metricsAddress: "127.0.0.1:0"/' -e 's/^probeAddress: .*/probeAddress: "127.0.0.1:0"/' \
    "$repo/packaging/config.yaml" > "$HOST_CONFIG_DIR/config.yaml"
  cat >> "$HOST_CONFIG_DIR/config.yaml" <<EOF
# The e2e's simulated node (check 14):
sysfsRoot: $SIM/sys
devRoot: $DEV_ROOT
procRoot: $FAKE_PROC
cdiSpecDirs: [$CDI_DIR]
cdiDir: $CDI_DIR
logLevel: debug
EOF
}
# host_start [ALIGNMENT]: the daemon as the unit starts it.
host_start() {
  local exec
  exec="$(sed -n 's/^ExecStart=//p' "$HOST_UNIT")"
  [[ "$exec" == "/usr/bin/efa-k8s-device-plugin --config=$HOST_CONFIG_DIR/config.yaml" ]] \
    || why "packaging's unit starts '$exec'; this check knows '/usr/bin/efa-k8s-device-plugin --config=$HOST_CONFIG_DIR/config.yaml'" || return 1
  sed -i '/^alignment: /d' "$HOST_CONFIG_DIR/config.yaml"
  echo "alignment: ${1:-best-effort}" >> "$HOST_CONFIG_DIR/config.yaml"
  # shellcheck disable=SC2086  # the unit's words
  e2e_start efa-plugin "$PLUGIN_BIN" ${exec#* }
}
host_restart() {
  local before; before="$(registrations)"
  e2e_stop efa-plugin 10
  host_start "$1" || return 1
  e2e_wait_for 60 "the host daemon to register" registrations_above "$before" \
    || why "the host daemon ($1) did not register (see $E2E_LOGS/efa-plugin.log)"
}

# rb_ready: rb-be and rb-lb run (a rejected one is created again, under the
# daemon's present mode), each in a known container.
rb_ready() {
  local pod
  for pod in rb-be rb-lb; do
    if pod_failed "$pod"; then
      delete_pod "$pod" || why "cannot delete pod $pod" || return 1
      rb_create "$pod" 4 || why "cannot create pod $pod" || return 1
    fi
  done
  e2e_wait_for "$REBOOT_WAIT" "rb-be and rb-lb to run" all_running rb-be rb-lb \
    || why "not every pod runs before the reboot: $(not_running rb-be rb-lb)" || return 1
  for pod in rb-be rb-lb; do RB_CONTAINER[$pod]="$(rb_container "$pod")"; done
}

# reboot_once INSTALL N: one reboot, its outcome tallied and printed.
reboot_once() {
  local install="$1" n="$2" mark new="rb-new-$2" pod outcome line="" t0 treg
  rb_ready || return 1
  [ "$install" = DaemonSet ] || e2e_stop efa-plugin 5 KILL
  # shellcheck disable=SC2154  # here: run.sh's directory
  "$here/cluster.sh" node-down >>"$E2E_LOGS/reboot.log" 2>&1 || why "cluster.sh node-down failed (see $E2E_LOGS/reboot.log)" || return 1
  rb_create "$new" 2 || why "cannot create pod $new while the node is down" || return 1
  RB_CONTAINER[$new]=""
  mark="$(wc -l < "$E2E_LOGS/kubelet.log")"
  if [ "$install" = host ]; then host_start late-binding || return 1; fi
  "$here/cluster.sh" node-up >>"$E2E_LOGS/reboot.log" 2>&1 || why "cluster.sh node-up failed (see $E2E_LOGS/reboot.log)" || return 1
  e2e_wait_for "$REBOOT_WAIT" "the plugin to register after reboot $n" kubelet_has_since "$mark" "$KL_REGISTERED" \
    || why "[$install, reboot $n] the plugin did not register with the kubelet within ${REBOOT_WAIT}s" || return 1
  e2e_wait_for "$REBOOT_WAIT" "the pods to be admitted or rejected" rb_all_settled rb-be rb-lb "$new" || true
  for pod in rb-be rb-lb "$new"; do
    local kind=checkpointed
    [ "$pod" != "$new" ] || kind="bound while down"
    local tally="${RB_TALLY[$install $kind]:-0 0}" admitted total
    read -r admitted total <<< "$tally"
    total=$((total + 1))
    if pod_failed "$pod"; then
      outcome="rejected ($(rb_reason "$pod"): $(e2e_kubectl get pod "$pod" -o 'jsonpath={.status.message}' | cut -c1-160))"
      [ "$install" = DaemonSet ] || [ "$pod" = "$new" ] || RB_PROBLEMS+=("reboot $n: $pod $outcome")
    elif rb_running_anew "$pod" "${RB_CONTAINER[$pod]}"; then
      outcome="admitted, running"
      admitted=$((admitted + 1))
    else
      outcome="admitted, not running after ${REBOOT_WAIT}s: $(not_running "$pod")"
      admitted=$((admitted + 1))
      [ "$install" = DaemonSet ] || RB_PROBLEMS+=("reboot $n: $pod $outcome")
    fi
    RB_TALLY[$install $kind]="$admitted $total"
    line+="${line:+; }$pod $outcome"
  done
  local t0 tsock tadd treg timing
  t0="$(kubelet_epoch "$mark" "$KL_START")"; tsock="$(kubelet_epoch "$mark" "$KL_SOCKET")"
  tadd="$(kubelet_epoch "$mark" "$KL_ADD")"; treg="$(kubelet_epoch "$mark" "$KL_REGISTERED")"
  timing="kubelet start -> registration $(secs "$t0" "$treg")s; from kubelet.sock: pods admitted +$(secs "$tsock" "$tadd")s, registration +$(secs "$tsock" "$treg")s"
  if [ "$install" = DaemonSet ]; then
    local times
    if times="$(chart_pod_times "$(chart_pod_field '.[0].metadata.name')")"; then
      timing+=", the daemon's first line +$(secs "$tsock" "${times% *}")s, its registered line +$(secs "$tsock" "${times#* }")s"
    fi
  fi
  RB_LAG[$install]+=" $(secs "$tsock" "$treg")"
  RB_START[$install]+=" $(secs "$t0" "$treg")"
  info "[$install, reboot $n] $timing; $line"
  delete_pod "$new" || why "cannot delete pod $new" || return 1
}

rb_figure() {
  local install="$1" a1 t1 a2 t2
  read -r a1 t1 <<< "${RB_TALLY[$install checkpointed]:-0 0}"
  read -r a2 t2 <<< "${RB_TALLY[$install bound while down]:-0 0}"
  echo "reboot: $((a1 + a2))/$((t1 + t2)) pods admitted again ($install; $REBOOTS reboots: running before $a1/$t1, bound while down $a2/$t2)"
  echo "reboot: $install registered, seconds from the kubelet's start:${RB_START[$install]}; from kubelet.sock:${RB_LAG[$install]}"
}

reboot_daemonset() {
  local -a values
  mapfile -t values < <(upgrade_base_values)
  local -a extra
  read -r -a extra <<< "${EFA_E2E_REBOOT_VALUES:-}"
  upgrade_to install "$EFA" "install (best effort) ${extra[*]}" "${values[@]}" "${extra[@]}" || return 1
  rb_create rb-be 4 || why "cannot create pod rb-be" || return 1
  e2e_wait_for "$REBOOT_WAIT" "rb-be to run" pod_running rb-be || why "rb-be does not run: $(not_running rb-be)" || return 1
  upgrade_to "late binding" "$EFA" "upgrade --reuse-values --set alignment.mode=late-binding" \
    --reuse-values --set alignment.mode=late-binding || return 1
  rb_create rb-lb 4 || why "cannot create pod rb-lb" || return 1
  local n
  for ((n = 1; n <= REBOOTS; n++)); do reboot_once DaemonSet "$n" || return 1; done
  rb_figure DaemonSet
}

reboot_host() {
  host_config_write || return 1
  host_restart best-effort || return 1
  rb_create rb-be 4 || why "cannot create pod rb-be" || return 1
  e2e_wait_for "$REBOOT_WAIT" "rb-be to run" pod_running rb-be || why "rb-be does not run: $(not_running rb-be)" || return 1
  host_restart late-binding || return 1
  rb_create rb-lb 4 || why "cannot create pod rb-lb" || return 1
  local n
  for ((n = 1; n <= REBOOTS; n++)); do reboot_once host "$n" || return 1; done
  rb_figure host
}

check_14_reboot() {
  RB_TALLY=(); RB_PROBLEMS=(); RB_CONTAINER=(); RB_LAG=(); RB_START=(); RB_CONFIG_MADE=0
  # shellcheck disable=SC2034  # upgrade.sh's, for upgrade_to's progress lines
  UP_T0=$SECONDS
  delete_all_pods || why "cannot delete the earlier checks' pods" || return 1
  no_release || return 1
  upgrade_plugin_image || return 1
  stop_host_daemon || return 1
  add_chart_repo || return 1
  local rc=0
  reboot_daemonset || rc=1
  delete_all_pods || true
  uninstall_release || true
  rm -f "$CDI_DIR"/vpc.amazonaws.com-efa*_claim-*.json
  if [ "$rc" -eq 0 ]; then reboot_host || rc=1; fi
  delete_all_pods || true
  e2e_stop efa-plugin 10
  rm -f "$CDI_DIR"/vpc.amazonaws.com-efa*_claim-*.json
  [ "$RB_CONFIG_MADE" -eq 0 ] || rm -rf "$HOST_CONFIG_DIR"
  restart_host_daemon "$EFA_TOTAL" || rc=1
  [ "$rc" -eq 0 ] || return 1
  [ ${#RB_PROBLEMS[@]} -eq 0 ] \
    || why "with the host install ${#RB_PROBLEMS[@]} pods that ran before a reboot were not admitted again or do not run: $(printf '%s; ' "${RB_PROBLEMS[@]}" | sed 's/; $//')"
}
