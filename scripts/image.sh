#!/usr/bin/env bash
# Builds the image from the Dockerfile for real, with podman, and proves it
# runs: its binary prints --version and the inventory of a simulated p5 node
# inside the image (so the runtime stage has every library the binary loads,
# libibverbs' EFA provider included), and on a simulated node without EFA
# hands over to the idle process. Then saves it as an archive containerd
# can import (`ctr -n k8s.io images import`).
#
#   scripts/image.sh [TAG]     (default efa-k8s-device-plugin:dev)
#
# No registry is needed: when podman has no debian:12 image, one is
# bootstrapped from Debian's packages (mmdebstrap, minbase) and tagged
# debian:12 and debian:12-slim. Needs root. Environment:
#   EFA_IMAGE_TAR   where to save the archive (default build/image/efa-k8s-device-plugin.tar)
#   EFA_SIMNODE     efa-simnode binary for the inventory check (default: built
#                   with the release preset when missing)
set -euo pipefail
cd "$(dirname "$0")/.."
tag="${1:-efa-k8s-device-plugin:dev}"
tar="${EFA_IMAGE_TAR:-$PWD/build/image/efa-k8s-device-plugin.tar}"
say() { echo "image: $*" >&2; }
die() { say "ERROR: $*"; exit 1; }
started=$SECONDS

missing=()
for p in podman mmdebstrap runc; do command -v "$p" >/dev/null || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null ||
    die "apt-get install ${missing[*]} failed"
fi

# The sandbox may not raise RLIMIT_NOFILE: without default_ulimits = [] runc
# fails with "error setting rlimit type 7: operation not permitted". runc, not
# podman's default crun, which refuses this machine's hybrid cgroups.
conf="$(mktemp)"
work="$(mktemp -d)"
trap 'rm -rf "$conf" "$work"' EXIT
printf '[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"\n' > "$conf"
export CONTAINERS_CONF="$conf"

if ! podman image exists docker.io/library/debian:12; then
  say "no debian:12 image: bootstrapping one from Debian's packages (mmdebstrap, minbase)"
  mmdebstrap --quiet --variant=minbase bookworm "$work/deb12.tar" || die "mmdebstrap failed"
  podman import -q "$work/deb12.tar" docker.io/library/debian:12 >/dev/null
  rm -f "$work/deb12.tar"
fi
podman image exists docker.io/library/debian:12-slim ||
  podman tag docker.io/library/debian:12 docker.io/library/debian:12-slim

revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
say "building $tag from the Dockerfile (revision $revision)"
podman build --pull=never --network host --build-arg REVISION="$revision" -t "$tag" . ||
  die "podman build failed (its output is above)"

say "checking the binary inside the image"
version="$(podman run --rm --network none "$tag" --version)" || die "--version failed in the image"
echo "$version"
[[ "$version" == *"revision $revision"* ]] || die "--version does not name revision $revision: $version"
simnode="${EFA_SIMNODE:-build/release/test/efa-simnode}"
if [ ! -x "$simnode" ]; then
  cmake --preset release >/dev/null
  cmake --build --preset release -j2 --target efa-simnode >/dev/null
fi
"$simnode" p5.48xlarge "$work/node" >/dev/null
# libibverbs looks for /dev/infiniband/uverbsN outside SYSFS_PATH: the
# simulated node's nodes go there, so its EFA provider (libefa, loaded with
# dlopen) must list every device.
inventory="$(podman run --rm --network none -v "$work/node:/node:ro" \
  -v "$work/node/dev/infiniband:/dev/infiniband:ro" "$tag" \
  inventory --sysfs-root /node/sys --dev-root /node/dev)" || die "inventory failed in the image"
echo "$inventory" | head -3
found="$(grep -c '^rdmap.* listed ' <<< "$inventory" || true)"
[ "$found" -eq 32 ] ||
  die "in the image libibverbs lists $found of the simulated p5.48xlarge's 32 EFAs (no EFA provider?)"

# On a node without EFA the daemon hands over to the idle process (same
# PID): wait for its line, then look at what PID 1 runs.
"$simnode" m5.8xlarge "$work/no-efa" >/dev/null
container="$(podman run -d --rm --network none -v "$work/no-efa:/node:ro" "$tag" \
  --sysfs-root /node/sys --dev-root /node/dev --kubelet-dir /tmp/kubelet)" ||
  die "the daemon did not start in the image"
for _ in $(seq 100); do
  podman logs "$container" 2>&1 | grep -q "no EFA on this node; idle until one appears" && break
  sleep 0.1
done
exe="$(podman exec "$container" readlink /proc/1/exe)"
podman stop -t 10 "$container" >/dev/null
[ "$exe" = /usr/bin/efa-k8s-device-plugin-idle ] ||
  die "on a node without EFA the image's PID 1 runs '$exe', not /usr/bin/efa-k8s-device-plugin-idle"
echo "no EFA: PID 1 handed over to $exe"

mkdir -p "$(dirname "$tar")"
rm -f "$tar"
podman save -q --format docker-archive -o "$tar" "$tag"
say "saved $tag to $tar ($(du -h "$tar" | cut -f1)); image $(podman image inspect "$tag" --format '{{.Size}}') bytes; $((SECONDS - started)) s"
