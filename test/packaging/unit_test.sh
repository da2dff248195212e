#!/usr/bin/env bash
# Checks the host install's systemd unit and configuration file
# (packaging/), without installing anything:
#
#   test/packaging/unit_test.sh DAEMON
#
# - `systemd-analyze verify` passes on the unit (a copy whose ExecStart
#   runs DAEMON, the built binary: verify also checks that the command
#   exists), and `systemd-analyze security --offline` rates its sandbox;
# - the unit starts before the kubelet at boot (Before=, WantedBy=),
#   restarts on failure, logs to the journal, reads the config file at the
#   path the chart mounts its config map at, and carries the chart's
#   hardening: no capability, no new privileges, a read-only system with
#   exactly the device-plugins dir and the CDI dir writable, which the
#   tmpfiles.d entry creates;
# - the packaged config file is one the daemon reads (`--print-config`),
#   with the listeners on the loopback, and its writable directories are
#   the ones the unit opens.
# Skips (77) without systemd-analyze. Ends with "N passed, M failed"; exits
# non-zero when anything failed.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
readonly ROOT
DAEMON="${1:-}"
[ -z "$DAEMON" ] || DAEMON="$(realpath "$DAEMON")"
readonly DAEMON
readonly UNIT="$ROOT/packaging/efa-k8s-device-plugin.service"
readonly CONFIG="$ROOT/packaging/config.yaml"
readonly TMPFILES="$ROOT/packaging/tmpfiles.conf"
# The highest exposure `systemd-analyze security` may give (0-10; the unit
# measured 2.2, "OK", on systemd 252).
readonly MAX_EXPOSURE=3.0

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "ok   - $1"; }
fail() { failed=$((failed + 1)); echo "FAIL - $1"; [ -z "${2:-}" ] || echo "       ${2//$'\n'/$'\n'       }"; }
finish() { echo "$passed passed, $failed failed"; [ "$failed" -eq 0 ]; exit $?; }

if [ -z "$DAEMON" ] || [ ! -x "$DAEMON" ]; then fail "usage: $0 DAEMON ('$DAEMON' is not an executable)"; finish; fi
if ! command -v systemd-analyze >/dev/null; then echo "skipped: no systemd-analyze (apt-get install systemd)"; exit 77; fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# --- systemd-analyze -------------------------------------------------------------
sed "s#^ExecStart=/usr/bin/efa-k8s-device-plugin #ExecStart=$DAEMON #" "$UNIT" >"$work/efa-k8s-device-plugin.service"
if out="$(systemd-analyze verify "$work/efa-k8s-device-plugin.service" 2>&1)" && [ -z "$out" ]; then
  pass "systemd-analyze verify: no finding"
else fail "systemd-analyze verify" "$out"; fi
out="$(systemd-analyze security --offline=yes "$work/efa-k8s-device-plugin.service" 2>&1)"
exposure="$(sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p' <<<"$out")"
if [ -n "$exposure" ] && awk -v e="$exposure" -v m="$MAX_EXPOSURE" 'BEGIN { exit !(e <= m) }'; then
  pass "systemd-analyze security: exposure $exposure (at most $MAX_EXPOSURE)"
else fail "systemd-analyze security: exposure '$exposure', more than $MAX_EXPOSURE" "$(grep '✗' <<<"$out")"; fi

# --- what the unit says ----------------------------------------------------------
# value KEY: the values the unit gives KEY, one per line, comments dropped.
value() { sed -n "s/^$1=\(.*\)$/\1/p" "$UNIT"; }
expect_key() {  # expect_key KEY WANT WHY
  local got
  got="$(value "$1" | paste -sd' ')"
  if [ "$got" = "$2" ]; then pass "$1=$2: $3"; else fail "$1=$2: $3" "the unit says '$1=$got'"; fi
}
expect_key Before kubelet.service "ordered before the kubelet"
expect_key WantedBy "multi-user.target kubelet.service" "started at boot, and with the kubelet"
expect_key Restart on-failure "restarted when it fails"
expect_key StartLimitIntervalSec 0 "never left stopped after repeated failures"
expect_key StandardOutput journal "logs to the journal"
expect_key StandardError journal "errors to the journal"
expect_key CapabilityBoundingSet "" "no capability (the chart drops ALL)"
expect_key AmbientCapabilities "" "no ambient capability"
expect_key NoNewPrivileges yes "no privilege escalation (allowPrivilegeEscalation: false)"
expect_key ProtectSystem strict "a read-only system (readOnlyRootFilesystem)"
expect_key ProtectHome yes "no home directory"
expect_key PrivateTmp yes "a private /tmp"
expect_key SystemCallFilter @system-service "a system call filter (seccomp RuntimeDefault)"
expect_key DevicePolicy closed "opens no device node"
expect_key PrivateDevices no "sees the host's /dev/infiniband"
expect_key IPAddressDeny any "its listeners answer nobody but the node"
expect_key ReadWritePaths "/var/lib/kubelet/device-plugins /run/cdi" \
  "writes only the device-plugins dir and the CDI dir"
expect_key ReadOnlyPaths /run "nothing else in /run"

# The config file: the path the chart mounts its config map at.
chart="$ROOT/helm/aws-efa-k8s-device-plugin"
chart_dir="$(sed -n 's/.*define "efa.configDir" -}}\(.*\){{- end.*/\1/p' "$chart/templates/_helpers.tpl")"
chart_arg="$(grep -o -- '--config={{ include "efa.configDir" . }}/[a-z.]*' "$chart/templates/_daemonset.tpl")"
chart_path="$chart_dir/${chart_arg##*/}"
exec_start="$(value ExecStart)"
if [ "$exec_start" = "/usr/bin/efa-k8s-device-plugin --config=$chart_path" ] &&
   [ "$chart_path" = /etc/efa-k8s-device-plugin/config.yaml ]; then
  pass "ExecStart reads $chart_path, where the chart's pod reads its config map"
else fail "ExecStart reads the chart's config path" "ExecStart=$exec_start; the chart's: '$chart_path'"; fi
if ! grep -qE '^(Environment|EnvironmentFile|PassEnvironment)=' "$UNIT"; then
  pass "no environment: the daemon needs none"
else fail "the unit sets the environment" "$(grep -E '^(Environment|EnvironmentFile|PassEnvironment)=' "$UNIT")"; fi

# --- the config file and the writable directories ----------------------------------
if effective="$("$DAEMON" --config="$CONFIG" --print-config 2>&1)"; then
  pass "the daemon reads packaging/config.yaml"
else fail "the daemon reads packaging/config.yaml" "$effective"; finish; fi
key() { sed -n "s/^$1: \"\{0,1\}\([^\" ]*\)\"\{0,1\}.*/\1/p" <<<"$effective"; }
for listener in metricsAddress probeAddress; do
  if [[ "$(key "$listener")" == 127.0.0.1:* ]]; then pass "$listener on the loopback: $(key "$listener")"
  else fail "$listener on the loopback" "got '$(key "$listener")'"; fi
done
kubelet_dir="$(key kubeletDir)"
cdi_dir="$(key cdiDir)"
want="$kubelet_dir/device-plugins ${cdi_dir/#\/var\/run\//\/run\/}"
got="$(value ReadWritePaths)"
if [ "$got" = "$want" ]; then pass "the writable directories are the config's kubeletDir/device-plugins and cdiDir"
else fail "the writable directories follow the config" "ReadWritePaths=$got, the config's: $want"; fi
created="$(awk '$1 == "d" {print $2}' "$TMPFILES" | paste -sd' ')"
if [ "$created" = "$got" ]; then pass "tmpfiles.d creates each writable directory before the sandbox needs it"
else fail "tmpfiles.d creates the writable directories" "it creates '$created', the unit writes '$got'"; fi
finish
