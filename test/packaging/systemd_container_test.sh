#!/usr/bin/env bash
# Installs the host install's .deb in a Debian 12 container with systemd as
# PID 1 (podman run --systemd=always) and runs it as a node would:
#
#   test/packaging/systemd_container_test.sh BUILD_DIR SIMNODE FAKE_KUBELET
#
# 1. dpkg -i: the unit is enabled (for boot and for kubelet.service) and
#    started; systemd-analyze verify passes on the installed unit. On the
#    container's own /sys (no EFA) the daemon hands over to the idle binary.
# 2. The running process has the sandbox: no capability, no new
#    privileges, a seccomp filter, / read-only, the device-plugins dir
#    writable.
# 3. The config file pointed at a simulated p5.48xlarge (efa-simnode,
#    mounted read-only at /node) and the service restarted: the daemon
#    registers with a fake kubelet on the host (the kubelet dir is shared
#    with the container), advertises the 32 EFAs and answers Allocate;
#    /readyz answers 200; its log is in the journal. The daemon started on
#    the host beside it, as the chart's pod would be, on the same kubelet
#    dir, stands aside: it registers nothing and leaves the socket alone.
# 4. Killed, it is restarted (Restart=on-failure); the .deb installed again
#    (an upgrade) keeps the edited config file and restarts the service.
# 5. A reboot of the container: the service starts at boot, before a
#    kubelet.service, and registers again; tmpfiles.d made /run/cdi again.
# 6. systemctl stop: exit 0, its socket removed. dpkg --purge: no file of
#    the package, no unit link, no config left; the file system is as
#    before the install but for the kubelet's device-plugins dir and
#    /run/cdi, which stay.
# The image (Debian 12 with systemd and the package's dependencies, and a
# stand-in kubelet.service) is built from podman's debian:12 image
# (scripts/image.sh --prepare makes one without a registry); apt-get
# reaches Debian's mirror through the host's network. Needs root and
# podman, skips (77) without them or without the debian:12 image. Ends with
# "N passed, M failed"; exits non-zero when anything failed.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
readonly ROOT
readonly BUILD="${1:-}" SIMNODE="${2:-}" FAKE_KUBELET="${3:-}"
readonly PKG=efa-k8s-device-plugin
readonly BASE=docker.io/library/debian:12
readonly IMAGE=localhost/efa-host-install-node:test

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "ok   - $1"; }
fail() { failed=$((failed + 1)); echo "FAIL - $1"; [ -z "${2:-}" ] || echo "       ${2//$'\n'/$'\n'       }"; }
finish() { echo "$passed passed, $failed failed"; [ "$failed" -eq 0 ]; exit $?; }

if [ -z "$BUILD" ] || [ ! -f "$BUILD/CPackConfig.cmake" ] || [ ! -x "$SIMNODE" ] || [ ! -x "$FAKE_KUBELET" ]; then
  fail "usage: $0 BUILD_DIR SIMNODE FAKE_KUBELET (a configured and built tree, efa-simnode, fake-kubelet)"; finish
fi
if [ "$(id -u)" -ne 0 ]; then echo "skipped: podman with systemd and the simulated node's device files need root"; exit 77; fi
if ! command -v podman >/dev/null; then echo "skipped: no podman (scripts/image.sh --prepare installs it)"; exit 77; fi
for tool in cpack dpkg-deb; do command -v "$tool" >/dev/null || { echo "skipped: no $tool"; exit 77; }; done

# As scripts/image.sh: runc (crun refuses hybrid cgroup layouts), no
# default ulimits (the sandbox may not raise RLIMIT_NOFILE), cgroupfs.
work="$(mktemp -d)"
name="efa-host-install-$$"
fake_pid=""
# shellcheck disable=SC2317  # called by the trap
cleanup() {
  [ -z "$fake_pid" ] || kill "$fake_pid" 2>/dev/null
  podman rm -f -t 0 "$name" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT
printf '[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\n' >"$work/containers.conf"
export CONTAINERS_CONF="$work/containers.conf"
if ! podman image exists "$BASE"; then
  echo "skipped: no $BASE image in podman (scripts/image.sh --prepare bootstraps one)"; exit 77
fi

# --- the package and the image ---------------------------------------------------
if out="$(cpack --config "$BUILD/CPackConfig.cmake" -B "$work/pkg" -G DEB 2>&1)"; then
  pass "cpack made the .deb"
else fail "cpack -G DEB" "$(tail -20 <<<"$out")"; finish; fi
deb="$(cd "$work/pkg" && ls ./*.deb)"
deb="${deb#./}"
# The package's dependencies, installed in the image (the container runs
# without a network); dpkg -i then finds them all.
deps="$(dpkg-deb -f "$work/pkg/$deb" Depends | tr ',' '\n' | sed 's/(.*)//; s/|.*//' | xargs)"
mkdir -p "$work/ctx"
cp "$ROOT/scripts/apt-get.sh" "$work/ctx/"
cat >"$work/ctx/kubelet.service" <<'EOF'
[Unit]
Description=A stand-in for the kubelet: something to be started before
[Service]
ExecStart=/bin/sleep infinity
[Install]
WantedBy=multi-user.target
EOF
cat >"$work/ctx/Containerfile" <<EOF
FROM $BASE
COPY apt-get.sh /usr/local/sbin/apt-get.sh
RUN apt-get.sh update -qq && DEBIAN_FRONTEND=noninteractive apt-get.sh install -y -qq \\
      --no-install-recommends systemd systemd-sysv $deps >/dev/null && apt-get.sh clean
COPY kubelet.service /etc/systemd/system/kubelet.service
RUN systemctl enable kubelet.service
CMD ["/sbin/init"]
EOF
if out="$(podman build -q --pull=never --network host -t "$IMAGE" "$work/ctx" 2>&1)"; then
  pass "the image: Debian 12, systemd, the package's dependencies ($deps)"
else fail "podman build of the systemd image" "$(tail -20 <<<"$out")"; finish; fi

"$SIMNODE" p5.48xlarge "$work/node" >/dev/null || { fail "efa-simnode p5.48xlarge"; finish; }
mkdir -p "$work/kubelet"

# in CMD...: runs in the container.
inside() { podman exec "$name" "$@"; }
# wait_for SECONDS CMD...: until CMD succeeds.
wait_for() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.2
  done
}
booted() { local s; s="$(inside systemctl is-system-running 2>/dev/null)"; [ "$s" = running ] || [ "$s" = degraded ]; }
prop() { inside systemctl show -P "$2" "$1" 2>/dev/null; }
main_pid() { prop "$PKG" MainPID; }
exe_of() { inside readlink "/proc/$1/exe" 2>/dev/null; }
journal() { inside journalctl -b -u "$PKG" --no-pager -o cat 2>/dev/null; }
# The file system but what changes by itself (the kernel's, the runtime's,
# logs and caches, dpkg's own records) and the shared directories.
listing() {
  inside find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /run -o -path /tmp -o -path /var/tmp \
    -o -path /var/log -o -path /var/cache -o -path /var/lib/dpkg -o -path /var/lib/apt -o -path /node \
    -o -path /pkg -o -path /var/lib/kubelet -o -path /etc/machine-id -o -path /var/lib/systemd/random-seed \
    -o -path /var/lib/systemd/catalog \) -prune -o -print | sort
}
# kubelet ARGS...: the fake kubelet on the host, serving the shared dir.
# CAP_SYS_ADMIN: without it systemd in a container sets up no mount
# namespace for a service and ignores ProtectSystem=, ReadWritePaths= and
# PrivateTmp= without a word (the service runs in PID 1's namespace); a
# node's systemd has every capability.
if ! podman run -d --name "$name" --systemd=always --cap-add SYS_ADMIN --network none -v "$work/node:/node:ro" \
     -v "$work/kubelet:/var/lib/kubelet" -v "$work/pkg:/pkg:ro" "$IMAGE" >/dev/null 2>"$work/run.err"; then
  fail "podman run --systemd=always" "$(cat "$work/run.err")"; finish
fi
if wait_for 60 booted; then pass "systemd boots as PID 1 in the container: $(inside systemctl is-system-running)"
else fail "systemd boots in the container" "$(inside systemctl is-system-running 2>&1; podman logs "$name" 2>&1 | tail -20)"; finish; fi
before="$(listing)"

# --- 1. install ------------------------------------------------------------------
if out="$(inside dpkg -i "/pkg/$deb" 2>&1)"; then pass "dpkg -i $deb"
else fail "dpkg -i $deb" "$out"; finish; fi
expect_in() {  # expect_in NAME WANT CMD...
  local what="$1" want="$2" got
  shift 2
  got="$(inside "$@" 2>&1)"
  if [ "$got" = "$want" ]; then pass "$what"; else fail "$what" "expected: $want"$'\n'"got:      $got"; fi
}
expect_in "the unit is enabled" enabled systemctl is-enabled "$PKG"
expect_in "... wanted by multi-user.target and by kubelet.service" \
  "/etc/systemd/system/kubelet.service.wants/$PKG.service /etc/systemd/system/multi-user.target.wants/$PKG.service" \
  sh -c "ls /etc/systemd/system/*.wants/$PKG.service | xargs"
if [[ " $(prop "$PKG" Before) " == *" kubelet.service "* ]]; then pass "... and ordered before it"
else fail "ordered before kubelet.service" "Before=$(prop "$PKG" Before)"; fi
if out="$(inside systemd-analyze verify "$PKG.service" 2>&1)" && [ -z "$out" ]; then
  pass "systemd-analyze verify on the installed unit: no finding"
else fail "systemd-analyze verify on the installed unit" "$out"; fi
if wait_for 10 sh -c "[ \"\$(podman exec $name systemctl is-active $PKG)\" = active ]"; then
  pass "dpkg -i started the service"
else fail "the service runs after dpkg -i" "$(journal | tail -20)"; fi
idle_exe() { [ "$(exe_of "$(main_pid)")" = "/usr/bin/$PKG-idle" ]; }
if wait_for 15 idle_exe && grep -q "no EFA on this node: handing over to /usr/bin/$PKG-idle" <<<"$(journal)"; then
  pass "on the container's /sys (no EFA) the daemon hands over to the idle binary, in the sandbox"
else fail "the idle hand-over" "$(journal | tail -10)"; fi

# --- 2. the sandbox, seen from the process ----------------------------------------------
pid="$(main_pid)"
status="$(inside cat "/proc/$pid/status")"
for field in "CapBnd:	0000000000000000" "CapEff:	0000000000000000" "NoNewPrivs:	1" "Seccomp:	2"; do
  if grep -qF "$field" <<<"$status"; then pass "the process: ${field//	/ }"
  else fail "the process: ${field//	/ }" "$(grep -E '^(Cap|NoNew|Seccomp)' <<<"$status")"; fi
done
if [ "$(inside readlink "/proc/$pid/ns/mnt")" != "$(inside readlink /proc/1/ns/mnt)" ]; then
  pass "the process has a mount namespace of its own (ProtectSystem=, ReadWritePaths=, PrivateTmp=)"
else fail "the process has a mount namespace of its own" "systemd set none up: the sandbox's file system part is off"; fi
# Writes through /proc/PID/root see the process's mounts: what it may write.
for dir in /etc /usr/bin /var/lib /var/lib/kubelet /run /var/lib/kubelet/device-plugins /run/cdi; do
  want=read-only
  [[ "$dir" == /var/lib/kubelet/device-plugins || "$dir" == /run/cdi ]] && want=writable
  if inside touch "/proc/$pid/root$dir/.efa-write-probe" 2>/dev/null; then
    got=writable
    inside rm -f "/proc/$pid/root$dir/.efa-write-probe"
  else got=read-only; fi
  if [ "$got" = "$want" ]; then pass "the process: $dir is $want"
  else fail "the process: $dir is $want" "it is $got"; fi
done

# --- 3. a node with EFAs: registration and Allocate ----------------------------------
inside sh -c "printf 'sysfsRoot: /node/sys\ndevRoot: /node/dev\nprocRoot: /node/proc\n' >> /etc/$PKG/config.yaml"
inside systemctl restart "$PKG"
# fake_kubelet: the fake kubelet on the host waits for the registration,
# asks for 4 EFAs and keeps serving (--hold); succeeds when it did all of
# it. Sets `out` to its output, or to what it did and its file when not.
fake_kubelet() {
  local started=$SECONDS fake_state="still running"
  # The binary itself in the background ($! is what the kill below ends).
  "$FAKE_KUBELET" --dir "$work/kubelet/device-plugins" --timeout 60s --allocate 4 --hold \
    >"$work/kubelet.out" 2>&1 &
  fake_pid=$!
  until grep -q "holding until SIGTERM" "$work/kubelet.out"; do
    if ! kill -0 "$fake_pid" 2>/dev/null; then
      wait "$fake_pid"
      fake_state="exited with status $?"
      fake_pid=""
      break
    fi
    [ "$SECONDS" -lt $((started + 60)) ] || break
    sleep 0.2
  done
  out="$(cat "$work/kubelet.out")"
  grep -q "^Registered vpc.amazonaws.com/efa" <<<"$out" && grep -q "^32 device(s) advertised: 32 healthy" <<<"$out" &&
    grep -qE "^Allocate .*:$" <<<"$out" && return 0
  out="the fake kubelet ($FAKE_KUBELET) $fake_state after $((SECONDS - started)) s; its output \
($(stat -c '%s bytes' "$work/kubelet.out" 2>&1)):"$'\n'"$out"$'\n'"$(ls -la "$work/kubelet/device-plugins" 2>&1)"$'\n'"the daemon's journal:"$'\n'"$(journal | tail -20)"
  if [ -n "$fake_pid" ]; then kill "$fake_pid" 2>/dev/null; wait "$fake_pid" 2>/dev/null; fake_pid=""; fi
  return 1
}
# register: the service registers with a fake kubelet and answers it; then
# /readyz in the container. A fake kubelet that fails is said and started
# once more (a new kubelet.sock, which the service registers with again):
# CI once saw one leave no output at all while the service had registered
# with it and answered its GetPreferredAllocation (cause not found).
register() {
  local out readyz first="" ok=1
  if ! fake_kubelet; then
    first="$out"
    echo "note - $1: the first fake kubelet failed; once more. ${first//$'\n'/$'\n'       }"
    fake_kubelet || { ok=0; out="first: $first"$'\n'"again: $out"; }
  fi
  if [ "$ok" = 1 ]; then
    pass "$1: the service registers with the kubelet, advertises 32 EFAs, answers Allocate: $(grep -E '^Allocate' <<<"$out")"
  else fail "$1: registration with the fake kubelet" "$out"; fi
  readyz="$(inside bash -c 'exec 3<>/dev/tcp/127.0.0.1/8081 && printf "GET /readyz HTTP/1.0\r\n\r\n" >&3 && head -1 <&3' 2>&1)"
  if [[ "$readyz" == *" 200 "* ]]; then pass "$1: /readyz on 127.0.0.1:8081: ${readyz%$'\r'}"
  else fail "$1: /readyz answers 200" "$readyz"; fi
  [ -z "${2:-}" ] || "$2"
  if [ -n "$fake_pid" ]; then
    kill "$fake_pid" 2>/dev/null
    wait "$fake_pid" 2>/dev/null
    fake_pid=""
  fi
}
# beside_it: the daemon as the chart's pod runs it, here on the host (its
# own mount namespace), started beside the running service on the same
# kubelet dir: it stands aside, and leaves the service's socket alone
# when it stops.
beside_it() {
  local socket="$work/kubelet/device-plugins/efa/aws-efa-device-plugin.sock" inode pod rc
  inode="$(stat -c %i "$socket")"
  "$BUILD/plugin/$PKG" --kubelet-dir "$work/kubelet" --sysfs-root "$work/node/sys" --dev-root "$work/node/dev" \
    --proc-root "$work/node/proc" --metrics-address 127.0.0.1:0 --probe-address 127.0.0.1:0 >"$work/pod.log" 2>&1 &
  pod=$!
  wait_for 20 grep -q "standing aside" "$work/pod.log"
  sleep 1
  kill -TERM "$pod"
  wait "$pod"
  rc=$?
  if grep -q "another device plugin serves .* standing aside" "$work/pod.log" &&
     grep -q "stopped; .* left to the device plugin serving it" "$work/pod.log" &&
     ! grep -q "registered vpc.amazonaws.com/efa" "$work/pod.log" && [ "$rc" = 0 ] &&
     [ "$(stat -c %i "$socket" 2>/dev/null)" = "$inode" ] && [ "$(grep -c '^Registered' "$work/kubelet.out")" = 1 ]; then
    pass "a second daemon beside the service (the chart's pod) stands aside, registers nothing, leaves its socket"
  else fail "a second daemon beside the service stands aside" \
    "exit $rc; socket inode $inode -> $(stat -c %i "$socket" 2>&1)"$'\n'"$(tail -5 "$work/pod.log")"$'\n'"$(grep '^Registered' "$work/kubelet.out")"; fi
}
register "a node with EFAs" beside_it
if grep -q "configuration: .*sysfsRoot=/node/sys (/etc/$PKG/config.yaml)" <<<"$(journal)"; then
  pass "the journal has its log, and its configuration from /etc/$PKG/config.yaml"
else fail "the daemon's log in the journal" "$(journal | tail -5)"; fi

# --- 4. restart on failure, and an upgrade --------------------------------------------
old="$(main_pid)"
inside systemctl kill -s KILL --kill-whom=main "$PKG"
restarted() { local p; p="$(main_pid)"; [ -n "$p" ] && [ "$p" != 0 ] && [ "$p" != "$old" ] && [ "$(inside systemctl is-active "$PKG")" = active ]; }
if wait_for 20 restarted; then pass "killed (SIGKILL), it is restarted: NRestarts=$(prop "$PKG" NRestarts)"
else fail "Restart=on-failure" "$(inside systemctl status "$PKG" --no-pager 2>&1 | head -8)"; fi
old="$(main_pid)"
if out="$(inside dpkg -i "/pkg/$deb" 2>&1)" && wait_for 20 restarted; then
  pass "dpkg -i again (an upgrade) restarts the service"
else fail "dpkg -i again restarts the service" "$out"; fi
if inside grep -q "^sysfsRoot: /node/sys" "/etc/$PKG/config.yaml"; then pass "... and keeps the edited config file"
else fail "the edited config file survives the upgrade" "$(inside cat "/etc/$PKG/config.yaml")"; fi

# --- 5. a reboot --------------------------------------------------------------------------
if out="$(podman restart -t 60 "$name" 2>&1)" && wait_for 60 booted; then pass "the container rebooted"
else fail "podman restart" "$out"; finish; fi
active_at="$(prop "$PKG" ActiveEnterTimestampMonotonic)"
kubelet_at="$(prop kubelet.service InactiveExitTimestampMonotonic)"
if [ "${active_at:-0}" -gt 0 ] && [ "${kubelet_at:-0}" -ge "$active_at" ]; then
  pass "at boot the service was started before kubelet.service (active at ${active_at} us, the kubelet started at ${kubelet_at} us)"
else fail "the service starts before the kubelet at boot" "service active at '$active_at', kubelet started at '$kubelet_at'"; fi
expect_in "tmpfiles.d made /run/cdi again at boot" "directory 755" stat -c '%F %a' /run/cdi
register "after the reboot"

# --- 6. stop and purge --------------------------------------------------------------------
inside systemctl stop "$PKG"
expect_in "systemctl stop: the daemon exits 0 on SIGTERM" "success 0" \
  sh -c "echo \$(systemctl show -P Result $PKG) \$(systemctl show -P ExecMainStatus $PKG)"
if [ ! -e "$work/kubelet/device-plugins/efa/aws-efa-device-plugin.sock" ]; then pass "... and removes its socket"
else fail "the socket is removed on stop" "$(ls -l "$work/kubelet/device-plugins")"; fi
if out="$(inside dpkg --purge "$PKG" 2>&1)"; then pass "dpkg --purge"
else fail "dpkg --purge" "$out"; fi
after="$(listing)"
if [ "$after" = "$before" ]; then pass "after the purge the file system is as before the install (no file, unit link or config left)"
else fail "the file system after the purge" "$(diff <(echo "$before") <(echo "$after"))"; fi
left="$(inside sh -c "ls -d /etc/$PKG /usr/bin/$PKG* /etc/systemd/system/*.wants/$PKG.service 2>/dev/null")"
if [ -z "$left" ]; then pass "no config dir, binary or unit link of the package"
else fail "files of the package after the purge" "$left"; fi
running="$(inside sh -c "for p in /proc/[0-9]*; do readlink \$p/exe; done 2>/dev/null | grep -c $PKG")"
if [ "$running" = 0 ]; then pass "no process of the package runs"
else fail "no process of the package runs" "$running running"; fi
if [ -d "$work/kubelet/device-plugins" ]; then pass "the kubelet's device-plugins dir stays (the kubelet's)"
else fail "the kubelet's device-plugins dir stays"; fi
finish
