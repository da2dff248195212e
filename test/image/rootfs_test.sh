#!/usr/bin/env bash
# Checks, without a container engine, the image's runtime file system as the
# Dockerfile's build stage assembles it (scripts/image-rootfs.sh), for this
# machine's architecture:
#
#   test/image/rootfs_test.sh DAEMON IDLE SIMNODE
#
# The file system holds the two binaries, their libraries and libibverbs'
# EFA provider and nothing else (no shell); run inside it with chroot (the
# container's view: no ld.so.cache, no library from the host), the daemon
# prints --version, its inventory lists every EFA of a simulated p5.48xlarge
# through libibverbs (dlopen of libibverbs, then of libefa), and on a node
# without EFA it hands over to the idle binary, which keeps running. Also
# checks the Dockerfile's shape (a `FROM scratch` runtime stage fed by the
# build stage, OCI labels, the binary as entrypoint). scripts/image.sh runs
# the real images, both architectures.
# Needs root (chroot, mknod); exits 77 (skipped) otherwise.
# Ends with "N passed, M failed"; exits non-zero when anything failed.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
readonly ROOT
readonly DAEMON="${1:-}" IDLE="${2:-}" SIMNODE="${3:-}"

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "ok   - $1"; }
fail() { failed=$((failed + 1)); echo "FAIL - $1"; }
finish() { echo "$passed passed, $failed failed"; [ "$failed" -eq 0 ]; exit $?; }

for f in "$DAEMON" "$IDLE" "$SIMNODE"; do
  if [ -z "$f" ] || [ ! -x "$f" ]; then fail "usage: $0 DAEMON IDLE SIMNODE ('$f' is not an executable)"; finish; fi
done
if [ "$(id -u)" -ne 0 ]; then echo "skipped: chroot and the simulated node's device files need root"; exit 77; fi

# --- the Dockerfile -------------------------------------------------------------
# Instructions with their continuation lines joined, comments dropped; the
# runtime stage is everything from the last FROM on.
instructions="$(sed -e '/^[[:space:]]*#/d' "$ROOT/Dockerfile" | sed -e ':a' -e '/\\$/{N;s/\\\n/ /;ba}')"
runtime="$(awk 'toupper($1)=="FROM"{buf=""} {buf=buf $0 "\n"} END{printf "%s", buf}' <<<"$instructions")"
if grep -qE "^FROM[[:space:]]+--platform=\\\$BUILDPLATFORM[[:space:]]" <<<"$instructions"; then
  pass "the build stage runs on the build host's platform (cross-compiles for the target)"
else fail "the build stage runs on the build host's platform: FROM --platform=\$BUILDPLATFORM"; fi
if grep -qE '^FROM[[:space:]]+scratch[[:space:]]*$' <<<"$runtime" \
   && grep -qE '^COPY[[:space:]]+--from=build[[:space:]]+/rootfs/?[[:space:]]+/[[:space:]]*$' <<<"$runtime" \
   && [ "$(grep -cE '^(RUN|COPY|ADD)[[:space:]]' <<<"$runtime")" -eq 1 ]; then
  pass "the runtime stage is FROM scratch and holds only the build stage's /rootfs"
else fail "the runtime stage is FROM scratch with one COPY --from=build /rootfs/ /: found [$(tr '\n' ';' <<<"$runtime")]"; fi
for label in title description licenses version source revision; do
  if grep -qE "org\.opencontainers\.image\.$label=" <<<"$runtime"; then pass "OCI label org.opencontainers.image.$label"
  else fail "OCI label org.opencontainers.image.$label in the runtime stage"; fi
done
if grep -qE '^ENTRYPOINT[[:space:]]*\[[[:space:]]*"/usr/bin/efa-k8s-device-plugin"' <<<"$runtime"; then
  pass "the daemon is the entrypoint"
else fail "ENTRYPOINT [\"/usr/bin/efa-k8s-device-plugin\"] in the runtime stage"; fi

# --- the file system ------------------------------------------------------------
work="$(mktemp -d)"
daemon_pid=""
# shellcheck disable=SC2317  # called by the trap
cleanup() {
  [ -z "$daemon_pid" ] || kill -KILL "$daemon_pid" 2>/dev/null
  mountpoint -q "$work/rootfs/proc" && umount "$work/rootfs/proc"
  rm -rf "$work"
}
trap cleanup EXIT
rootfs="$work/rootfs"
triplet="$(gcc -dumpmachine)"
if out="$("$ROOT/scripts/image-rootfs.sh" "$triplet" "$rootfs" "$DAEMON" "$IDLE" 2>&1)"; then
  pass "scripts/image-rootfs.sh assembled the file system: ${out##*image-rootfs: }"
else fail "scripts/image-rootfs.sh failed: $out"; finish; fi
others="$(cd "$rootfs" && find . -type f ! -path './usr/lib/*' ! -path './usr/bin/*' ! -path './lib*/ld-linux*' \
  ! -path ./etc/libibverbs.d/efa.driver | sort | tr '\n' ' ')"
if [ -z "$others" ]; then pass "only binaries, libraries, the loader and libibverbs' efa configuration"
else fail "files other than binaries, libraries, the loader and libibverbs' efa configuration: $others"; fi
if [ ! -e "$rootfs/bin/sh" ] && [ ! -e "$rootfs/usr/bin/sh" ] && [ -z "$(find "$rootfs" -name 'libmlx*')" ]; then
  pass "no shell, no mlx provider"
else fail "a shell or an mlx provider is in the file system"; fi

# claimLookup loads OpenSSL at its first GET (dlopen "libssl.so.3", which
# brings libcrypto.so.3): a program doing the same, and initializing TLS as
# a GET does, inside the file system alone.
cat > "$work/dlopen.c" <<'EOF'
#include <dlfcn.h>
#include <stdio.h>
int main(void) {
  void* ssl = dlopen("libssl.so.3", RTLD_NOW | RTLD_LOCAL);
  if (!ssl) { printf("%s\n", dlerror()); return 1; }
  const void* (*method)(void) = (const void* (*)(void))dlsym(ssl, "TLS_client_method");
  void* (*ctx_new)(const void*) = (void* (*)(const void*))dlsym(ssl, "SSL_CTX_new");
  if (!method || !ctx_new || !ctx_new(method())) { printf("no TLS context\n"); return 1; }
  printf("ok\n");
  return 0;
}
EOF
mkdir -p "$rootfs/tmp"
if ! gcc -o "$rootfs/tmp/dlopen" "$work/dlopen.c" 2>"$work/gcc.err"; then
  fail "cannot compile the dlopen check: $(head -3 "$work/gcc.err" | tr '\n' ';')"
elif loaded="$(chroot "$rootfs" /tmp/dlopen 2>&1)"; then
  pass "OpenSSL loads and makes a TLS context in the file system alone, as claimLookup's first GET does"
else fail "OpenSSL in the file system (claimLookup): $loaded"; fi
rm -rf "${rootfs:?}/tmp"

if version="$(chroot "$rootfs" /usr/bin/efa-k8s-device-plugin --version 2>&1)"; then
  pass "--version runs in the file system alone: $version"
else fail "--version in the file system: $version"; fi

# The simulated node inside the root: libibverbs looks for
# /dev/infiniband/uverbsN at that absolute path.
"$SIMNODE" p5.48xlarge "$work/node" >/dev/null || { fail "efa-simnode p5.48xlarge"; finish; }
cp -a "$work/node/sys" "$work/node/dev" "$rootfs/"
inventory="$(chroot "$rootfs" /usr/bin/efa-k8s-device-plugin inventory --sysfs-root /sys --dev-root /dev 2>&1)"
listed="$(grep -c '^rdmap.* listed ' <<<"$inventory")"
if [ "$listed" -eq 32 ]; then pass "the inventory lists the simulated p5.48xlarge's 32 EFAs through libibverbs and libefa"
else fail "the inventory lists $listed of 32 EFAs through libibverbs (provider or a library missing?): $(head -5 <<<"$inventory" | tr '\n' ';')"; fi

# A node without EFA: the daemon execs the idle binary (same PID; found next
# to /proc/self/exe, so /proc is mounted as a container runtime does), which
# runs.
rm -rf "${rootfs:?}/sys" "${rootfs:?}/dev"
"$SIMNODE" m5.8xlarge "$work/no-efa" >/dev/null || { fail "efa-simnode m5.8xlarge"; finish; }
cp -a "$work/no-efa/sys" "$rootfs/"
mkdir -p "$rootfs/kubelet" "$rootfs/dev" "$rootfs/proc"
mount -t proc proc "$rootfs/proc" || { fail "mount proc in the file system"; finish; }
chroot "$rootfs" /usr/bin/efa-k8s-device-plugin --sysfs-root /sys --dev-root /dev --kubelet-dir /kubelet \
  --metrics-address 127.0.0.1:0 --probe-address 127.0.0.1:0 >"$work/idle.log" 2>&1 &
daemon_pid=$!
exe=""
for _ in $(seq 100); do
  exe="$(readlink "/proc/$daemon_pid/exe" 2>/dev/null)"
  [[ "$exe" == */efa-k8s-device-plugin-idle ]] && break
  sleep 0.1
done
if [[ "$exe" == "$rootfs/usr/bin/efa-k8s-device-plugin-idle" ]] && kill -0 "$daemon_pid" 2>/dev/null; then
  pass "on a node without EFA the daemon hands over to the idle binary, which runs"
else fail "on a node without EFA the process runs '$exe', not the idle binary: $(tail -3 "$work/idle.log" | tr '\n' ';')"; fi
kill -TERM "$daemon_pid" 2>/dev/null
wait "$daemon_pid"
rc=$?
daemon_pid=""
if [ "$rc" -eq 0 ]; then pass "the idle binary exits 0 on SIGTERM"
else fail "the idle binary exited $rc on SIGTERM: $(tail -3 "$work/idle.log" | tr '\n' ';')"; fi
finish
