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
# The checks, one file a group under checks/ (common.sh and gpus.sh hold
# what several groups use): resource.sh 1-5 the EFA resource itself;
# alignment.sh 6 alignment of 20 pods of 1 GPU + 4 EFA with a fake NVIDIA
# plugin (prints "alignment rate: X/20 = P%"); mofed_guard.sh 7 the MOFED
# guard; chart.sh 8 `helm upgrade` of a release of a chart shaped like AWS's
# to the Helm chart (the DaemonSet updated in place), 9 the chart's pod on
# the kubelet, from the image built from the Dockerfile, installed as README
# tells users (`helm repo add` of the chart repository scripts/release.sh
# makes, served on 127.0.0.1; 8 and 10 upgrade from it too), 10 the upgrade
# of 8 with the old release's pod running; sharing.sh 11 (run after 8, the
# host daemon restarted with --sharing-replicas 4 and restored after)
# sharing: 128 allocatable, 8 pods of 1 GPU + 4 EFA and 16 of 1 EFA at once,
# each pod's device nodes and env, the GPU pods aligned; late_binding.sh 12
# late binding through containerd 1.7's CDI annotation; upgrade.sh 13 `helm
# upgrade` of the chart's release with changed values (best effort -> late
# binding -> sharing with the rename -> back) while pods hold EFAs, each
# running container's device nodes checked from inside after each (the
# chart's pod from EFA_E2E_IMAGE_TAR, else from an image of this build's
# binaries, scripts/image-rootfs.sh); reboot.sh 14 pods holding EFAs
# (best effort, late binding, and one bound while the node is down) through
# EFA_E2E_REBOOTS (default 2) simulated reboots (cluster.sh node-down and
# node-up), with the chart's DaemonSet (its pod as in 13) and with the
# daemon run as packaging/'s unit runs it, started before the kubelet;
# prints "reboot: N/M pods admitted again (INSTALL; ...)" and each reboot's
# times from the kubelet's start to the pods' admission and the plugin's
# registration; asserts that with the host install every pod that ran
# before a reboot is admitted again and runs; dra_guard.sh 15 (run
# before 14) the DRA guard: a fake of DRANET's kubelet plugin registering
# in plugins_registry (fake-dra-plugin) takes allocatable from 32 to 0,
# and its going back to 32, a running pod's device nodes unchanged
# throughout; claim_lookup.sh 16 (run before 14) the claim lookup against
# the API server, for a DRANET claim a fake kubelet lists without devices
# (fake-kubelet --claim): TLS against the cluster's CA, a bad token
# refused (401), the chart's service account refused without the chart's
# binding (403) and authorized with it (404: 1.20 has no resource.k8s.io).
# This file is the
# runner: settings, reporting, setup, the order of the checks, teardown.
# Also a CTest test (e2e_real_kubelet, label e2e), which sets
# EFA_E2E_BUILD_DIR to its own build dir.
# Needs root. Environment: EFA_E2E_IMAGE_TAR (the image archive scripts/image.sh
# writes, or one of `podman save`; checks 9 and 10 are skipped, and say
# so, without it: scripts/test.sh runs them with --all), EFA_E2E_BUILD_DIR (default
# build/e2e; a configured dir is used as it is), EFA_E2E_JOBS (build jobs,
# default 1), EFA_E2E_REBOOTS (check 14's reboots per install, default 2),
# EFA_E2E_CACHE, EFA_E2E_STATE;
# EFA_E2E_KEEP=1 leaves the cluster and the daemon running for debugging
# (end them with `test/e2e/cluster.sh down`).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=SCRIPTDIR/lib.sh
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
readonly PLUGIN_SOCKET="$E2E_KUBELET_DIR/device-plugins/efa/aws-efa-device-plugin.sock"
PLUGIN_BIN="$BUILD_DIR/plugin/efa-k8s-device-plugin"
IDLE_BIN="$BUILD_DIR/plugin/efa-k8s-device-plugin-idle"
SIMNODE_BIN="$BUILD_DIR/test/efa-simnode"
FAKE_GPU_BIN="$BUILD_DIR/test/fake-gpu-plugin"
FAKE_DRA_BIN="$BUILD_DIR/test/fake-dra-plugin"
FAKE_KUBELET_BIN="$BUILD_DIR/test/fake-kubelet"

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
  for n in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16; do
    echo "FAIL check $n: not run (setup failed)"
    failed=$((failed + 1))
  done
  finish
}

# --- the checks: one file a group -------------------------------------------
# shellcheck source=SCRIPTDIR/checks/common.sh
source "$here/checks/common.sh"
# shellcheck source=SCRIPTDIR/checks/gpus.sh
source "$here/checks/gpus.sh"
# shellcheck source=SCRIPTDIR/checks/resource.sh
source "$here/checks/resource.sh"
# shellcheck source=SCRIPTDIR/checks/alignment.sh
source "$here/checks/alignment.sh"
# shellcheck source=SCRIPTDIR/checks/mofed_guard.sh
source "$here/checks/mofed_guard.sh"
# shellcheck source=SCRIPTDIR/checks/chart.sh
source "$here/checks/chart.sh"
# shellcheck source=SCRIPTDIR/checks/sharing.sh
source "$here/checks/sharing.sh"
# shellcheck source=SCRIPTDIR/checks/late_binding.sh
source "$here/checks/late_binding.sh"
# shellcheck source=SCRIPTDIR/checks/upgrade.sh
source "$here/checks/upgrade.sh"
# shellcheck source=SCRIPTDIR/checks/reboot.sh
source "$here/checks/reboot.sh"
# shellcheck source=SCRIPTDIR/checks/dra_guard.sh
source "$here/checks/dra_guard.sh"
# shellcheck source=SCRIPTDIR/checks/claim_lookup.sh
source "$here/checks/claim_lookup.sh"

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
  cmake --build "$BUILD_DIR" -j "$JOBS" --target efa-k8s-device-plugin efa-k8s-device-plugin-idle efa-simnode fake-gpu-plugin fake-dra-plugin fake-kubelet \
    > "$E2E_CACHE/daemon-build.log" 2>&1 \
    || { tail -n 30 "$E2E_CACHE/daemon-build.log"; return 1; }
  local bin
  for bin in "$PLUGIN_BIN" "$IDLE_BIN" "$SIMNODE_BIN" "$FAKE_GPU_BIN" "$FAKE_DRA_BIN" "$FAKE_KUBELET_BIN"; do
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
  e2e_stop fake-dra-plugin 10 2>/dev/null || true
  e2e_stop claims-plugin 10 2>/dev/null || true
  e2e_stop claims-kubelet 10 2>/dev/null || true
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
  run_check 13 "helm upgrade with changed values while pods hold EFAs (best effort -> late binding -> sharing renamed -> back): every running container keeps its device nodes, none is in two" check_13_upgrade_values
  run_check 15 "the DRA guard: allocatable $EFA_TOTAL, 0 while a dra.net kubelet plugin registers, $EFA_TOTAL when it goes; a running pod keeps its device nodes" check_15_dra_guard
  run_check 16 "the claim lookup on the real API server: TLS, a bad token (401), the chart's account without its binding (403), with it (authorized, 404 in 1.20), then the claim from a CRD of resource.k8s.io/v1 (its EFAs' series)" check_16_claim_lookup
  run_check 14 "reboots with pods holding EFAs: the race measured with the DaemonSet and the host install, which admits again every pod that ran" check_14_reboot
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
