#!/usr/bin/env bash
# Runs the daemon's main job on a built-in simulated node (no EFA needed):
# the real daemon registers with a fake kubelet over real unix sockets,
# advertises the node's EFAs and answers one allocation.
#   scripts/demo.sh [machine] [count]    (default p5.48xlarge 4; `--list` lists machines)
set -euo pipefail
cd "$(dirname "$0")/.."
machine="${1:-p5.48xlarge}"
count="${2:-4}"
scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j2 --target efa-k8s-device-plugin efa-simnode fake-kubelet >/dev/null
bin=build/release
if [ "$machine" = --list ]; then "$bin/test/efa-simnode" --list; echo no-efa; exit 0; fi

work=$(mktemp -d)
daemon_pid=""
cleanup() {
  [ -z "$daemon_pid" ] || kill "$daemon_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
"$bin/test/efa-simnode" "$machine" "$work/node"
echo "== simulated $machine in $work/node"
"$bin/plugin/efa-k8s-device-plugin" inventory --sysfs-root "$work/node/sys" \
  --dev-root "$work/node/dev"
echo
echo "== daemon log"
"$bin/plugin/efa-k8s-device-plugin" --kubelet-dir "$work/kubelet" \
  --sysfs-root "$work/node/sys" --dev-root "$work/node/dev" --proc-root "$work/node/proc" \
  --metrics-address 127.0.0.1:0 --probe-address 127.0.0.1:0 > >(sed 's/^/  daemon: /') 2>&1 &
daemon_pid=$!
echo
echo "== fake kubelet"
status=0
"$bin/test/fake-kubelet" --dir "$work/kubelet/device-plugins" --allocate "$count" || status=$?
kill -TERM "$daemon_pid"
wait "$daemon_pid" || { echo "daemon exited with $?" >&2; exit 1; }
daemon_pid=""
if [ -e "$work/kubelet/device-plugins/aws-efa-device-plugin.sock" ]; then
  echo "socket left behind after SIGTERM" >&2; exit 1
fi
echo "== daemon stopped on SIGTERM; its socket is removed"
exit $status
