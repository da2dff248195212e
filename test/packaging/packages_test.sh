#!/usr/bin/env bash
# Builds the host install's .deb and .rpm from a configured and built tree
# with CPack (packaging/CMakeLists.txt) and inspects them:
#
#   test/packaging/packages_test.sh BUILD_DIR VERSION
#
# Each holds exactly the two binaries (stripped; the daemon from the
# package prints VERSION, the idle binary passes its own check), the unit,
# the tmpfiles.d entry, the config file and the docs; the config file is a
# conffile (.deb) and %config(noreplace) (.rpm); the unit and config are
# packaging/'s; the maintainer scripts are there and parse; the .deb
# depends on the libraries the binaries load (dpkg-shlibdeps) and the .rpm
# requires their sonames. The packages go to a temporary directory, not
# BUILD_DIR/packages. Skips (77) without dpkg-deb, rpmbuild or rpm
# (scripts/install-deps.sh installs them). Ends with "N passed, M failed";
# exits non-zero when anything failed.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
readonly ROOT
readonly BUILD="${1:-}" VERSION="${2:-}"
readonly PKG=efa-k8s-device-plugin

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "ok   - $1"; }
fail() { failed=$((failed + 1)); echo "FAIL - $1"; [ -z "${2:-}" ] || echo "       ${2//$'\n'/$'\n'       }"; }
finish() { echo "$passed passed, $failed failed"; [ "$failed" -eq 0 ]; exit $?; }
# expect NAME WANT GOT
expect() { if [ "$3" = "$2" ]; then pass "$1"; else fail "$1" "expected: ${2//$'\n'/ }"$'\n'"got:      ${3//$'\n'/ }"; fi; }

if [ -z "$BUILD" ] || [ ! -f "$BUILD/CPackConfig.cmake" ] || [ -z "$VERSION" ]; then
  fail "usage: $0 BUILD_DIR VERSION (a configured tree: BUILD_DIR/CPackConfig.cmake)"; finish
fi
for tool in cpack dpkg-deb rpmbuild rpm rpm2cpio cpio; do
  command -v "$tool" >/dev/null || { echo "skipped: no $tool (scripts/install-deps.sh)"; exit 77; }
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if out="$(cpack --config "$BUILD/CPackConfig.cmake" -B "$work/out" -G "DEB;RPM" 2>&1)"; then
  pass "cpack made the .deb and the .rpm"
else fail "cpack -G DEB;RPM" "$(tail -20 <<<"$out")"; finish; fi
deb_arch="$(dpkg --print-architecture)"
rpm_arch="$(uname -m)"
deb="$work/out/${PKG}_${VERSION}_${deb_arch}.deb"
rpm="$work/out/$PKG-$VERSION-1.$rpm_arch.rpm"
for f in "$deb" "$rpm"; do [ -f "$f" ] || { fail "no ${f##*/} in $(ls "$work/out")"; finish; }; done

# The files, as each format lists them (directories of the package's own
# included; the system's shared ones, /usr/bin and the like, left out).
files="/etc/$PKG/config.yaml
/usr/bin/$PKG
/usr/bin/$PKG-idle
/usr/lib/systemd/system/$PKG.service
/usr/lib/tmpfiles.d/$PKG.conf
/usr/share/doc/$PKG/LICENSE
/usr/share/doc/$PKG/configuration.md
/usr/share/doc/$PKG/install.md"
got="$(dpkg-deb -c "$deb" | awk '$1 !~ /^d/ {sub(/^\./, "", $6); print $6}' | sort)"
expect ".deb: exactly the binaries, the unit, tmpfiles.d, the config and the docs" "$files" "$got"
got="$(rpm -qpl "$rpm" 2>/dev/null | sort)"
expect ".rpm: the same files, and its own two directories" \
  "$(printf '%s\n' "$files" "/etc/$PKG" "/usr/share/doc/$PKG" | sort)" "$got"
got="$(dpkg-deb -c "$deb" | awk '$6 ~ /usr\/bin\/./ {print $1, $2, $6}')"
expect ".deb: the binaries are root's, mode 0755" \
  "-rwxr-xr-x root/root ./usr/bin/$PKG"$'\n'"-rwxr-xr-x root/root ./usr/bin/$PKG-idle" "$got"

# The configuration file survives upgrades with the administrator's changes.
mkdir -p "$work/control"
dpkg-deb -e "$deb" "$work/control"
expect ".deb: the config file is its one conffile" "/etc/$PKG/config.yaml" "$(cat "$work/control/conffiles" 2>&1)"
expect ".rpm: the config file is its one %config file" "/etc/$PKG/config.yaml" "$(rpm -qpc "$rpm" 2>&1)"
got="$(rpm -qp --qf '[%{FILENAMES}|%{FILEFLAGS:fflags}\n]' "$rpm" 2>/dev/null | awk -F'|' '$2 ~ /c/ {print $2}')"
expect ".rpm: %config(noreplace): an upgrade leaves a changed file alone" "cn" "$got"

# The maintainer scripts: present, shell that parses, the unit's name in each.
for s in postinst prerm postrm; do
  if [ -x "$work/control/$s" ] && sh -n "$work/control/$s" && grep -q "$PKG.service" "$work/control/$s"; then
    pass ".deb: $s is there, parses and names the unit"
  else fail ".deb: $s" "$(ls -l "$work/control")"; fi
done
scripts="$(rpm -qp --scripts "$rpm" 2>/dev/null)"
for s in postinstall preuninstall postuninstall; do
  body="$(awk -v s="$s" '$0 ~ "^" s " scriptlet" {on = 1; next} / scriptlet \(using/ {on = 0} on' <<<"$scripts")"
  if [ -n "$body" ] && sh -n <<<"$body" && grep -q "$PKG.service" <<<"$body"; then
    pass ".rpm: the $s scriptlet is there, parses and names the unit"
  else fail ".rpm: the $s scriptlet" "$scripts"; fi
done

# What the binaries need: the .deb's Depends from dpkg-shlibdeps, the .rpm's
# Requires from rpmbuild's own scan.
depends="$(dpkg-deb -f "$deb" Depends)"
for lib in libc6 libstdc++6 libhwloc15 libyaml-cpp0.7 init-system-helpers; do
  if grep -q "\b$lib\b" <<<"$depends"; then pass ".deb: depends on $lib"
  else fail ".deb: depends on $lib" "Depends: $depends"; fi
done
expect ".deb: Version is CMake's project version" "$VERSION" "$(dpkg-deb -f "$deb" Version)"
expect ".deb: Architecture is this machine's" "$deb_arch" "$(dpkg-deb -f "$deb" Architecture)"
requires="$(rpm -qpR "$rpm" 2>/dev/null)"
for soname in libc.so.6 libstdc++.so.6 libhwloc.so.15 libyaml-cpp.so.0.7; do
  if grep -q "^$soname" <<<"$requires"; then pass ".rpm: requires $soname"
  else fail ".rpm: requires $soname" "$requires"; fi
done
expect ".rpm: Version is CMake's project version" "$VERSION" "$(rpm -qp --qf '%{VERSION}' "$rpm" 2>/dev/null)"
expect ".rpm: not relocatable (the unit names its paths)" "(none)" "$(rpm -qp --qf '%{PREFIXES}' "$rpm" 2>/dev/null)"

# The files themselves: packaging/'s unit and config; binaries stripped,
# the daemon's version, the idle binary's check.
dpkg-deb -x "$deb" "$work/deb"
mkdir -p "$work/rpm"
(cd "$work/rpm" && rpm2cpio "$rpm" | cpio -idm --quiet) 2>/dev/null
for f in "usr/lib/systemd/system/$PKG.service:packaging/$PKG.service" "etc/$PKG/config.yaml:packaging/config.yaml" \
         "usr/lib/tmpfiles.d/$PKG.conf:packaging/tmpfiles.conf"; do
  if cmp -s "$work/deb/${f%%:*}" "$ROOT/${f#*:}" && cmp -s "$work/rpm/${f%%:*}" "$ROOT/${f#*:}"; then
    pass "both packages install ${f#*:} as /${f%%:*}"
  else fail "both packages install ${f#*:} as /${f%%:*}"; fi
done
for bin in "$PKG" "$PKG-idle"; do
  if ! readelf -S "$work/deb/usr/bin/$bin" | grep -qE '\.(symtab|debug_)'; then pass ".deb: $bin is stripped"
  else fail ".deb: $bin is stripped" "$(readelf -S "$work/deb/usr/bin/$bin" | grep -E '\.(symtab|debug_)')"; fi
done
out="$("$work/deb/usr/bin/$PKG" --version 2>&1)"
if [[ "$out" == "$PKG $VERSION "* ]]; then pass "the packaged daemon runs: $out"
else fail "the packaged daemon prints version $VERSION" "$out"; fi
if out="$("$work/rpm/usr/bin/$PKG-idle" --check 2>&1)"; then pass "the packaged idle binary passes its check (.rpm's)"
else fail "the packaged idle binary's --check" "$out"; fi
finish
