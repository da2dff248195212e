#!/usr/bin/env bash
# Runs the daemon's main job on a built-in simulated node (no EFA needed):
# the real daemon registers with a fake kubelet over real unix sockets and
# advertises the node's EFAs; a container asking for one GPU and N EFAs is
# admitted as the kubelet's device manager does it, and gets the EFAs behind
# its GPU's PCIe switch.
#   scripts/demo.sh [machine] [count]    (default p5.48xlarge 4; `--list` lists machines)
# A machine without GPUs or Neuron devices gets a plain allocation of COUNT
# EFAs; one without EFA (no-efa) shows the daemon idling.
set -euo pipefail
cd "$(dirname "$0")/.."
machine="${1:-p5.48xlarge}"
count="${2:-4}"
started=$SECONDS
fail() { echo "demo: FAILED: $*" >&2; exit 1; }
step() { echo; echo "== $*"; }

step "installing build dependencies (scripts/install-deps.sh)"
scripts/install-deps.sh || fail "installing the Debian packages failed (apt-get's error is above)"

step "building the daemon and the simulated node (cmake --preset release; a few minutes on 2 cores the first time)"
cmake --preset release >/dev/null || fail "cmake could not configure the build (its error is above)"
# Ninja prints each step and, on failure, the compiler's own error.
cmake --build --preset release -j2 --target efa-k8s-device-plugin efa-simnode fake-kubelet ||
  fail "the build failed (the compiler's error is above)"
echo "built in $((SECONDS - started)) s"
bin=build/release
if [ "$machine" = --list ]; then "$bin/test/efa-simnode" --list; echo no-efa; exit 0; fi

work=$(mktemp -d)
daemon_pid=""
# The simulated node's /dev/infiniband/uverbsN are character devices, as on a
# node: mknod needs root. The daemon itself runs as you.
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
cleanup() {
  [ -z "$daemon_pid" ] || kill "$daemon_pid" 2>/dev/null || true
  $SUDO rm -rf "$work"
}
trap cleanup EXIT
$SUDO "$bin/test/efa-simnode" "$machine" "$work/node" >/dev/null || fail "no simulated machine '$machine' (scripts/demo.sh --list)"
roots=(--sysfs-root "$work/node/sys" --dev-root "$work/node/dev" --proc-root "$work/node/proc")

step "the node: a simulated $machine ($work/node); its EFAs and accelerators as the daemon sees them"
"$bin/plugin/efa-k8s-device-plugin" topology "${roots[@]}" || fail "the topology command failed"

# The daemon logs to a file, shown after the kubelet's side (not interleaved);
# at debug level, where each GetPreferredAllocation's reason is logged.
log="$work/daemon.log"
"$bin/plugin/efa-k8s-device-plugin" --kubelet-dir "$work/kubelet" "${roots[@]}" \
  --metrics-address 127.0.0.1:0 --probe-address 127.0.0.1:0 --log-level debug >"$log" 2>&1 &
daemon_pid=$!

# A machine with GPUs or Neuron devices: admit one container asking for one of
# them and COUNT EFAs (the accelerator first, as the kubelet may), so the
# daemon aligns the EFAs with it. Otherwise: a plain allocation.
kubelet=("$bin/test/fake-kubelet" --dir "$work/kubelet/device-plugins")
case "$machine" in
  p*|g*) request="nvidia.com/gpu=1,vpc.amazonaws.com/efa=$count" ;;
  trn*) request="aws.amazon.com/neuron=1,vpc.amazonaws.com/efa=$count" ;;
  *) request="" ;;
esac
if [ -z "$(ls "$work/node/sys/class/infiniband" 2>/dev/null)" ]; then
  request="none"
elif [ -n "$request" ]; then
  step "the kubelet: the daemon registers; a container asks for $request"
  kubelet+=(--accelerators "$machine" --pod-resources-socket "$work/kubelet/pod-resources/kubelet.sock"
    --admit "$request")
else
  step "the kubelet: the daemon registers; a container asks for $count EFAs"
  kubelet+=(--allocate "$count")
fi
status=0
if [ "$request" = none ]; then
  # No EFA is a normal state: the daemon idles and registers nothing. Wait
  # (10 s at most) for its log to say so.
  step "a node without EFA: the daemon registers nothing and idles"
  status=1
  for _ in $(seq 100); do
    if grep -q "no EFA on this node" "$log"; then status=0; break; fi
    sleep 0.1
  done
else
  "${kubelet[@]}" | sed 's/^/  /' || status=$?
  step "why these EFAs: the daemon's decision"
  grep -E "GetPreferredAllocation|alignment:" "$log" | sed 's/^/  /' || echo "  (no accelerator: any $count healthy EFAs)"
fi

kill -TERM "$daemon_pid"
wait "$daemon_pid" || { cat "$log" >&2; fail "the daemon exited with $? on SIGTERM"; }
daemon_pid=""
step "the daemon's log (each EFA's discovery line folded into a count)"
awk '/found EFA/ {n++; next} {print "  " $0} END {if (n) print "  (" n " \"found EFA\" lines)"}' "$log"
if [ -e "$work/kubelet/device-plugins/efa/aws-efa-device-plugin.sock" ]; then
  fail "the daemon left its socket behind after SIGTERM"
fi
[ "$status" -eq 0 ] || fail "the container was not admitted, or the node without EFA did not idle (see above)"
step "done in $((SECONDS - started)) s: the daemon stopped on SIGTERM and removed its socket"
