#!/usr/bin/env bash
# Real libibverbs reading simulated machines: it lists the EFAs its providers
# know (Debian 12's rdma-core 44: efa0-efa2) while sysfs discovery finds all,
# efa3 included. libibverbs stats /dev/infiniband/uverbsN outside SYSFS_PATH,
# so the fake dev is bind-mounted there inside a private mount namespace.
#   verbs_crosscheck.sh <efa-simnode> <efa-k8s-device-plugin>
set -euo pipefail
simnode=$1 plugin=$2
if [ "$(id -u)" -ne 0 ] || ! unshare -m true 2>/dev/null; then
  echo "verbs_crosscheck: needs root and unshare(1) for a private mount namespace" >&2
  exit 1
fi
tmp=$(mktemp -d)
made_dir=0
cleanup() {
  rm -rf "$tmp"
  [ $made_dir = 0 ] || rmdir /dev/infiniband 2>/dev/null || true
}
trap cleanup EXIT
if [ ! -d /dev/infiniband ]; then mkdir /dev/infiniband; made_dir=1; fi

run() {  # machine -> inventory output
  "$simnode" "$1" "$tmp/$1"
  mkdir -p "$tmp/$1/dev/infiniband"
  unshare -m sh -c "mount --bind '$tmp/$1/dev/infiniband' /dev/infiniband &&
    '$plugin' inventory --sysfs-root '$tmp/$1/sys' --dev-root '$tmp/$1/dev'"
}

fail=0
check() {  # description, command...
  if "${@:2}"; then echo "ok: $1"; else echo "FAILED: $1"; fail=1; fi
}
p5=$(run p5.48xlarge)
echo "$p5" | head -3
check "p5: 32 EFAs" grep -q '^32 EFA device(s)' <<<"$p5"
check "p5: libibverbs lists all 32 (efa1)" test "$(grep -c ' listed ' <<<"$p5")" -eq 32
p6=$(run p6-b200.48xlarge)
echo "$p6" | head -3
check "p6-b200: 8 EFAs, mlx5 excluded" grep -q '^8 EFA device(s)' <<<"$p6"
check "p6-b200: efa3 found though libibverbs 44 has no provider" \
  test "$(grep -c ' efa3 .* unlisted ' <<<"$p6")" -eq 8
check "p6-b200: mlx5 skipped" grep -q '^skipped ibp48s1: PCI 15b3:1021 is a Mellanox device, not an EFA' <<<"$p6"
none=$(run no-efa)
check "no-efa: empty inventory, exit 0" grep -q '^0 EFA device(s)' <<<"$none"
[ $fail = 0 ] && echo "verbs_crosscheck: all checks passed"
exit $fail
