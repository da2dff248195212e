#!/usr/bin/env bash
# Runs the daemon's main job on a built-in simulated node (no EFA needed).
#   scripts/demo.sh [machine]    (default p5.48xlarge; `efa-simnode --list` shows all)
set -euo pipefail
cd "$(dirname "$0")/.."
machine="${1:-p5.48xlarge}"
scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j2 --target efa-k8s-device-plugin efa-simnode >/dev/null
bin=build/release
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$bin/test/efa-simnode" "$machine" "$work/node"
echo "== simulated $machine at $work/node"
"$bin/plugin/efa-k8s-device-plugin" inventory --sysfs-root "$work/node/sys" \
  --dev-root "$work/node/dev" --proc-root "$work/node/proc"
