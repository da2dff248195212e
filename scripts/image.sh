#!/usr/bin/env bash
# Builds the image from the Dockerfile for real, with podman, for amd64 and
# arm64, and proves each one runs (the arm64 one under qemu-user emulation):
# --version, the inventory of a simulated node (every library the binary
# loads is inside, libibverbs' EFA provider included), the hand-over to the
# idle binary on a node without EFA, and the daemon serving a fake kubelet
# from the image (register, list, Allocate with alignment, SIGTERM) on a
# simulated p5.48xlarge (amd64), p6e-gb200.36xlarge and hpc7g.16xlarge
# (arm64). Then makes the manifest list TAG of both and saves it as one OCI
# archive that a registry push (`skopeo copy --all oci-archive:FILE
# docker://...`) or containerd (`ctr -n k8s.io images import`) takes;
# podman keeps the images as TAG-amd64 and TAG-arm64.
#
#   scripts/image.sh [TAG]     (default efa-k8s-device-plugin:dev)
#   scripts/image.sh --prepare only what waits on the network: the packages,
#                              the emulator and the base image (.ci/run
#                              starts it first, in the background)
#
# No registry is needed: when podman has no debian:12 image, one is
# bootstrapped from Debian's packages (mmdebstrap, minbase). The build
# stage always runs on this machine's architecture and cross-compiles for the
# other (Dockerfile). Needs root. Environment:
#   EFA_IMAGE_ARCHES  the architectures (default "amd64 arm64")
#   EFA_IMAGE_TAR     where to save the archive (default build/image/efa-k8s-device-plugin.tar)
#   EFA_TEST_BIN      directory with this machine's efa-simnode and fake-kubelet
#                     (default build/release/test, built when missing)
#   EFA_WERROR        ON: the build stage compiles with -Werror (CI)
#   EFA_IMAGE_PACKAGES  a directory: also write each architecture's host
#                     install packages there (the Dockerfile's packages
#                     stage: the .deb and .rpm of packaging/, made from the
#                     same build stage as the image's binaries) and check each
#                     one's architecture, version and binaries' machine
#   EFA_CCACHE_DIR    the compiler cache the build stage compiles through,
#                     mounted into it (default /var/cache/efa-ccache, the one
#                     every build on this machine shares; "" for none)
set -euo pipefail
cd "$(dirname "$0")/.."
prepare=0
[ "${1:-}" = --prepare ] && { prepare=1; shift; }
tag="${1:-efa-k8s-device-plugin:dev}"
tar="${EFA_IMAGE_TAR:-$PWD/build/image/efa-k8s-device-plugin.tar}"
read -r -a arches <<< "${EFA_IMAGE_ARCHES:-amd64 arm64}"
say() { echo "image: $*" >&2; }
die() { say "ERROR: $*"; exit 1; }
started=$SECONDS
host_arch="$(dpkg --print-architecture)"

missing=()
for p in podman mmdebstrap runc jq; do command -v "$p" >/dev/null || missing+=("$p"); done
for arch in "${arches[@]}"; do
  [ "$arch" = "$host_arch" ] && continue
  for p in qemu-user-static binfmt-support; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  break
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  scripts/apt-get.sh update -qq
  DEBIAN_FRONTEND=noninteractive scripts/apt-get.sh install -y -qq "${missing[@]}" >/dev/null ||
    die "apt-get install ${missing[*]} failed"
fi

# Another architecture's binaries run through qemu-user, registered with
# binfmt_misc (with the F flag Debian's qemu-user-static uses, so that the
# interpreter is found inside containers too).
qemu_of() { case "$1" in arm64) echo qemu-aarch64 ;; amd64) echo qemu-x86_64 ;; *) return 1 ;; esac; }
for arch in "${arches[@]}"; do
  [ "$arch" = "$host_arch" ] && continue
  qemu="$(qemu_of "$arch")" || die "no emulator known for $arch"
  if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc || die "cannot mount binfmt_misc"
  fi
  if [ ! -e "/proc/sys/fs/binfmt_misc/$qemu" ]; then
    update-binfmts --enable "$qemu" || die "cannot register $qemu with binfmt_misc"
  fi
  grep -q '^enabled' "/proc/sys/fs/binfmt_misc/$qemu" || die "$qemu is registered but disabled in binfmt_misc"
done

# The sandbox may not raise RLIMIT_NOFILE: without default_ulimits = [] runc
# fails with "error setting rlimit type 7: operation not permitted". runc, not
# podman's default crun, which refuses this machine's hybrid cgroups.
conf="$(mktemp)"
work="$(mktemp -d)"
containers=()
cleanup() {
  for c in "${containers[@]}"; do podman rm -f "$c" >/dev/null 2>&1 || true; done
  rm -rf "$conf" "$work"
}
trap cleanup EXIT
printf '[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"\n' > "$conf"
export CONTAINERS_CONF="$conf"

# One bootstrap at a time (a --prepare in the background, then the build):
# the second waits for the first and finds the image.
exec 8>/run/lock/efa-image-base.lock
flock 8
if ! podman image exists docker.io/library/debian:12; then
  say "no debian:12 image: bootstrapping one from Debian's packages (mmdebstrap, minbase)"
  mmdebstrap --quiet --variant=minbase bookworm "$work/deb12.tar" || die "mmdebstrap failed"
  podman import -q "$work/deb12.tar" docker.io/library/debian:12 >/dev/null
  rm -f "$work/deb12.tar"
fi
exec 8>&-
if [ "$prepare" = 1 ]; then
  say "prepared: packages, emulation of ${arches[*]}, the debian:12 image; $((SECONDS - started)) s"
  exit 0
fi

bin="${EFA_TEST_BIN:-build/release/test}"
if [ ! -x "$bin/efa-simnode" ] || [ ! -x "$bin/fake-kubelet" ]; then
  cmake --preset release >/dev/null
  cmake --build --preset release -j2 --target efa-simnode fake-kubelet >/dev/null
  bin=build/release/test
fi

# full_name NAME: NAME as podman stores it (localhost/NAME:TAG when it names
# no registry).
full_name() {
  if [[ "${1%%/*}" == *.* || "${1%%/*}" == *:* || "$1" == localhost/* ]] && [[ "$1" == */* ]]; then
    echo "$1"
  else
    echo "localhost/$1"
  fi
}

revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
version="$(scripts/version.sh)"

# run_daemon NAME IMAGE NODE KUBELET_DIR: the daemon in the image, detached,
# as the chart runs it (read-only root, no network but loopback).
run_daemon() {
  local id
  id="$(podman run -d --name "$1" --read-only --network none -v "$3:/node:ro" -v "$4:/var/lib/kubelet" \
    "$2" --sysfs-root /node/sys --dev-root /node/dev --proc-root /node/proc \
    --metrics-address 127.0.0.1:0 --probe-address 127.0.0.1:0 --log-level debug)" ||
    die "the daemon did not start in $2"
  containers+=("$1")
  echo "$id"
}
# stop_daemon NAME: SIGTERM; the daemon must exit 0.
stop_daemon() {
  podman stop -t 20 "$1" >/dev/null
  local rc
  rc="$(podman inspect "$1" --format '{{.State.ExitCode}}')"
  [ "$rc" = 0 ] || { podman logs "$1" 2>&1 | tail -5 >&2; die "the daemon in $1 exited $rc on SIGTERM"; }
}

# serve_kubelet IMAGE MACHINE REQUEST WANT: the daemon in IMAGE serves a fake
# kubelet on a simulated MACHINE; a container asking REQUEST
# (nvidia.com/gpu=1,vpc.amazonaws.com/efa=N: the GPU admitted first) or N
# plain EFAs is admitted and gets the EFAs WANT names.
serve_kubelet() {
  local image="$1" machine="$2" request="$3" want="$4" node="$work/$2" kubelet="$work/$2-kubelet"
  local name out log
  name="efa-image-check-$$-${machine//./-}"
  "$bin/efa-simnode" "$machine" "$node" >/dev/null || die "efa-simnode $machine failed"
  mkdir -p "$kubelet/device-plugins"
  run_daemon "$name" "$image" "$node" "$kubelet" >/dev/null
  local kubelet_cmd=("$bin/fake-kubelet" --dir "$kubelet/device-plugins" --timeout 60s)
  if [[ "$request" == *=* ]]; then
    kubelet_cmd+=(--accelerators "$machine" --pod-resources-socket "$kubelet/pod-resources/kubelet.sock"
      --admit "$request")
  else
    kubelet_cmd+=(--allocate "$request")
  fi
  out="$("${kubelet_cmd[@]}" 2>&1)" || { echo "$out" >&2; podman logs "$name" 2>&1 | tail -20 >&2;
    die "$image on $machine: the fake kubelet's admission failed"; }
  grep -qxE "Admitted vpc.amazonaws.com/efa: $want|Allocate $want:" <<< "$out" ||
    { echo "$out" >&2; die "$image on $machine: the container did not get EFAs $want"; }
  # WANT are the EFAs behind the GPU's PCIe switch; the daemon's log says
  # it chose them for that GPU, found through the pod-resources API.
  stop_daemon "$name"
  log="$(podman logs "$name" 2>&1)"
  if [[ "$request" == *=* ]]; then
    grep -q "GetPreferredAllocation: aligning with the accelerators of default/demo/main" <<< "$log" ||
      { grep -i alignment <<< "$log" >&2; die "$image on $machine: the daemon did not align with the container's GPU"; }
  fi
  [ ! -e "$kubelet/device-plugins/efa/aws-efa-device-plugin.sock" ] ||
    die "$image on $machine: the daemon left its socket behind after SIGTERM"
  echo "$machine: registered, $(grep -oE '^[0-9]+ device\(s\) advertised' <<< "$out"), container got $want, SIGTERM exit 0"
}

# check_image IMAGE ARCH: runs the image's binaries (under emulation for a
# foreign ARCH).
check_image() {
  local image="$1" arch="$2" out machine count found name pid exe
  [ "$(podman image inspect "$image" --format '{{.Architecture}}')" = "$arch" ] ||
    die "$image is not an $arch image"
  out="$(podman run --rm --network none "$image" --version)" || die "--version failed in $image"
  echo "$out"
  [[ "$out" == *"revision $revision"* ]] || die "--version in $image does not name revision $revision: $out"

  # libibverbs looks for /dev/infiniband/uverbsN outside SYSFS_PATH: the
  # simulated node's device nodes go there, so its EFA provider (libefa,
  # loaded with dlopen) must list every device. A p5.48xlarge on every
  # architecture: Debian 12's libefa (rdma-core 44) does not list the
  # 0xefa3 functions of the newer simulated machines (the daemon, which
  # reads sysfs, serves them all).
  machine=p5.48xlarge
  "$bin/efa-simnode" "$machine" "$work/inv-$arch" >/dev/null
  count="$(find "$work/inv-$arch/sys/class/infiniband" -mindepth 1 -maxdepth 1 | wc -l)"
  out="$(podman run --rm --network none -v "$work/inv-$arch:/node:ro" \
    -v "$work/inv-$arch/dev/infiniband:/dev/infiniband:ro" "$image" \
    inventory --sysfs-root /node/sys --dev-root /node/dev)" || die "inventory failed in $image"
  found="$(grep -c '^rdmap.* listed ' <<< "$out" || true)"
  [ "$found" -eq "$count" ] ||
    die "in $image libibverbs lists $found of the simulated $machine's $count EFAs (no EFA provider?)"
  echo "inventory: libibverbs lists the simulated $machine's $count EFAs"

  # No EFA: the daemon hands over to the idle binary (same PID). No shell in
  # the image: the host reads what the container's PID 1 runs.
  "$bin/efa-simnode" m5.8xlarge "$work/no-efa-$arch" >/dev/null
  mkdir -p "$work/no-efa-$arch-kubelet"
  name="efa-image-check-$$-idle-$arch"
  run_daemon "$name" "$image" "$work/no-efa-$arch" "$work/no-efa-$arch-kubelet" >/dev/null
  for _ in $(seq 300); do
    grep -q "no EFA on this node; idle until one appears" <<< "$(podman logs "$name" 2>&1)" && break
    sleep 0.1
  done
  pid="$(podman inspect "$name" --format '{{.State.Pid}}')"
  exe="$(readlink "/proc/$pid/exe" || true)"
  # Under emulation /proc/PID/exe is qemu; the program is its first argument.
  [[ "$exe" == */qemu-* ]] && exe="$(tr '\0' '\n' < "/proc/$pid/cmdline" | sed -n 2p)"
  [[ "$exe" == */efa-k8s-device-plugin-idle ]] ||
    die "on a node without EFA $image's PID 1 runs '$exe', not efa-k8s-device-plugin-idle"
  stop_daemon "$name"
  echo "no EFA: PID 1 handed over to the idle binary, exit 0 on SIGTERM"

  case "$arch" in
    arm64)
      serve_kubelet "$image" p6e-gb200.36xlarge "nvidia.com/gpu=1,vpc.amazonaws.com/efa=2" "rdmap19s0, rdmap20s0"
      serve_kubelet "$image" hpc7g.16xlarge 1 rdmap0s6 ;;
    *)
      serve_kubelet "$image" p5.48xlarge "nvidia.com/gpu=1,vpc.amazonaws.com/efa=4" \
        "rdmap79s0, rdmap80s0, rdmap81s0, rdmap82s0" ;;
  esac

  # What the image holds: its size and the files in its one layer.
  local size files
  size="$(podman image inspect "$image" --format '{{.Size}}')"
  files="$(podman save --format docker-archive "$image" | tar -xOf - --wildcards '*.tar' | tar -t | grep -cv '/$')"
  echo "$arch image: $size bytes, $files files"
  [ "$size" -le $((30 * 1024 * 1024)) ] || die "the $arch image is $size bytes, over 30 MiB"
}

# The host's compiler cache, mounted where the build stage's CMake looks
# (CMakeLists.txt): the amd64 build reuses the objects of the host's release
# builds (the demo's, with the same flags), and each architecture those of
# the last image build.
ccache_dir="${EFA_CCACHE_DIR-/var/cache/efa-ccache}"
cache_mount=()
if [ -n "$ccache_dir" ]; then
  mkdir -p "$ccache_dir"
  cache_mount=(--volume "$ccache_dir:/var/cache/efa-ccache")
fi

# check_packages DIR ARCH: DIR holds exactly the .deb and the .rpm of ARCH
# at this version, and their daemon is built for ARCH (the ELF header's
# machine: it cannot run here under emulation without ARCH's libraries).
check_packages() {
  local dir="$1" arch="$2" rpm_arch machine deb rpm elf
  case "$arch" in
    arm64) rpm_arch=aarch64; machine=b7 ;;  # EM_AARCH64
    amd64) rpm_arch=x86_64; machine=3e ;;   # EM_X86_64
    *) die "no package check for $arch" ;;
  esac
  deb="$dir/efa-k8s-device-plugin_${version}_$arch.deb"
  rpm="$dir/efa-k8s-device-plugin-$version-1.$rpm_arch.rpm"
  if [ ! -f "$deb" ] || [ ! -f "$rpm" ]; then
    die "the $arch packages stage wrote $(find "$dir" -mindepth 1 -printf '%f ')but not both ${deb##*/} and ${rpm##*/}"
  fi
  [ "$(dpkg-deb -f "$deb" Architecture) $(dpkg-deb -f "$deb" Version)" = "$arch $version" ] ||
    die "${deb##*/} says architecture $(dpkg-deb -f "$deb" Architecture), version $(dpkg-deb -f "$deb" Version)"
  [ "$(rpm -qp --qf '%{ARCH} %{VERSION}' "$rpm" 2>/dev/null)" = "$rpm_arch $version" ] ||
    die "${rpm##*/} says $(rpm -qp --qf '%{ARCH} %{VERSION}' "$rpm" 2>/dev/null)"
  # Whole files first: a reader that stops early would fail the pipe.
  dpkg-deb --fsys-tarfile "$deb" | tar -xOf - ./usr/bin/efa-k8s-device-plugin > "$dir/daemon-from-deb"
  rpm2cpio "$rpm" | cpio -i --quiet --to-stdout ./usr/bin/efa-k8s-device-plugin > "$dir/daemon-from-rpm"
  for elf in "$dir/daemon-from-deb" "$dir/daemon-from-rpm"; do
    [ "$(od -An -tx1 -j18 -N1 "$elf" | tr -d ' ')" = "$machine" ] ||
      die "the daemon in the $arch ${elf##*-} is built for ELF machine 0x$(od -An -tx1 -j18 -N1 "$elf" | tr -d ' '), not 0x$machine"
  done
  rm -f "$dir/daemon-from-deb" "$dir/daemon-from-rpm"
  echo "$arch packages: ${deb##*/} ($(stat -c %s "$deb") bytes), ${rpm##*/} ($(stat -c %s "$rpm") bytes)"
}

packages="${EFA_IMAGE_PACKAGES:-}"
if [ -n "$packages" ]; then
  mkdir -p "$packages"
  for tool in dpkg-deb rpm rpm2cpio cpio; do
    command -v "$tool" >/dev/null || die "EFA_IMAGE_PACKAGES needs $tool (scripts/install-deps.sh installs it)"
  done
fi

podman manifest exists "$tag" 2>/dev/null && podman manifest rm "$tag" >/dev/null
podman image exists "$tag" && podman rmi "$tag" >/dev/null
images=()
for arch in "${arches[@]}"; do
  say "building $tag-$arch from the Dockerfile (revision $revision, version $version)"
  podman build --pull=never --network host --platform "linux/$arch" "${cache_mount[@]}" \
    --build-arg BUILDPLATFORM="linux/$host_arch" --build-arg VERSION="$version" \
    --build-arg REVISION="$revision" --build-arg EFA_WERROR="${EFA_WERROR:-OFF}" \
    -t "$tag-$arch" . || die "podman build for $arch failed (its output is above)"
  say "checking the $arch image"
  check_image "$tag-$arch" "$arch"
  images+=("$tag-$arch")
  if [ -n "$packages" ]; then
    # The same build arguments: the build stage is podman's cached one.
    say "building the $arch packages (the Dockerfile's packages stage)"
    podman build --pull=never --network host --platform "linux/$arch" "${cache_mount[@]}" \
      --build-arg BUILDPLATFORM="linux/$host_arch" --build-arg VERSION="$version" \
      --build-arg REVISION="$revision" --build-arg EFA_WERROR="${EFA_WERROR:-OFF}" \
      --target packages --output "type=local,dest=$work/packages-$arch" . ||
      die "podman build --target packages for $arch failed (its output is above)"
    check_packages "$work/packages-$arch" "$arch"
    mv "$work/packages-$arch"/*.deb "$work/packages-$arch"/*.rpm "$packages/"
  fi
done

# The manifest list: one name for every architecture (the last run's is
# removed before the builds: podman 4.3 may remove a list's images with it).
podman manifest create "$tag" >/dev/null
for image in "${images[@]}"; do podman manifest add "$tag" "containers-storage:$(full_name "$image")" >/dev/null; done
listed="$(podman manifest inspect "$tag" | jq -r '[.manifests[].platform.architecture] | sort | join(" ")')"
[ "$listed" = "$(printf '%s\n' "${arches[@]}" | sort | paste -sd' ')" ] ||
  die "the manifest list $tag names architectures '$listed', expected '${arches[*]}'"
echo "manifest list $tag: $listed"

mkdir -p "$(dirname "$tar")"
rm -f "$tar"
# Named in full, so that containerd imports it under the name a pod spec gives.
podman manifest push -q --all "$tag" "oci-archive:$tar:$(full_name "$tag")" >/dev/null ||
  die "saving $tar failed"
# The list lives on in the archive; podman keeps TAG-ARCH. Podman 4.3's
# `podman images` fails on a local list whose instances it cannot match to
# this machine's platform (one without this architecture, or one a push has
# rewritten), so the local list goes.
podman manifest rm "$tag" >/dev/null
podman images >/dev/null || die "podman's image store is inconsistent after saving $tar"
say "saved $tag ($listed) to $tar ($(du -h "$tar" | cut -f1)); $((SECONDS - started)) s"
