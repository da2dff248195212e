#!/usr/bin/env bash
# Checks, without a Docker engine, that the Dockerfile's runtime stage gives
# the binary every shared library it needs:
#
#   test/image/runtime_libs_test.sh BINARY [DOCKERFILE]
#
# Each library `ldd BINARY` resolves is mapped with `dpkg -S` to its Debian
# package, which must be
#   - in the runtime stage's `apt-get install` list, or
#   - in the base image (debian:12-slim: the packages of priority required and
#     what they depend on, apt included), or
#   - for a library the binary does not link directly, a dependency of a
#     listed package (apt installs it with that package).
# A library the binary links directly (readelf NEEDED) must be provided by a
# listed or base package, not by chance through another package's
# dependencies. The inventory command loads libibverbs with dlopen, and
# libibverbs its providers (libefa), which ldd cannot see: libibverbs1 and
# ibverbs-providers must be listed too. The mapping holds
# because the build stage and this machine are both Debian 12; the test says
# so when they are not. Also checks the Dockerfile's shape (multi-stage, the
# runtime base, OCI labels, the binary as entrypoint). Listed packages that
# provide nothing the binary needs are noted, not failed.
# Ends with "N passed, M failed"; exits non-zero when anything failed.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
readonly ROOT
readonly BINARY="${1:-}"
readonly DOCKERFILE="${2:-$ROOT/Dockerfile}"

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "ok   - $1"; }
fail() { failed=$((failed + 1)); echo "FAIL - $1"; }
note() { echo "note - $1"; }
finish() { echo "$passed passed, $failed failed"; [ "$failed" -eq 0 ]; exit $?; }

if [ -z "$BINARY" ] || [ ! -x "$BINARY" ]; then
  fail "usage: $0 BINARY [DOCKERFILE] (got binary '${BINARY}': not an executable)"; finish
fi
[ -f "$DOCKERFILE" ] || { fail "no Dockerfile at $DOCKERFILE"; finish; }
for tool in ldd readelf dpkg dpkg-query; do
  command -v "$tool" >/dev/null || { fail "$tool not found: this test needs a Debian machine"; finish; }
done

# --- the Dockerfile -----------------------------------------------------------
# Instructions with their continuation lines joined, comments dropped.
instructions="$(sed -e '/^[[:space:]]*#/d' "$DOCKERFILE" | sed -e ':a' -e '/\\$/{N;s/\\\n/ /;ba}')"
stages="$(grep -ciE '^[[:space:]]*FROM[[:space:]]' <<<"$instructions")"
# The runtime stage: everything from the last FROM on.
runtime="$(awk 'toupper($1)=="FROM"{buf=""} {buf=buf $0 "\n"} END{printf "%s", buf}' <<<"$instructions")"
runtime_base="$(awk 'toupper($1)=="FROM"{print $2; exit}' <<<"$runtime")"

if [ "$stages" -ge 2 ]; then pass "Dockerfile is multi-stage ($stages stages)"
else fail "Dockerfile is multi-stage: found $stages FROM"; fi

case "$runtime_base" in
  debian:12-slim*|debian:bookworm-slim*) pass "runtime stage is based on $runtime_base" ;;
  *) fail "runtime stage is based on debian:12-slim (this test maps libraries to Debian 12 packages): found '$runtime_base'" ;;
esac
os="$(. /etc/os-release 2>/dev/null && echo "${ID:-} ${VERSION_ID:-}")"
if [ "$os" == "debian 12" ]; then pass "this machine is Debian 12, like the build stage"
else fail "this machine is Debian 12, like the build stage: found '${os}' (package names would not match)"; fi

for label in title description licenses version source revision; do
  if grep -qE "org\.opencontainers\.image\.$label=" <<<"$runtime"; then pass "OCI label org.opencontainers.image.$label"
  else fail "OCI label org.opencontainers.image.$label in the runtime stage"; fi
done
if grep -qE '^[[:space:]]*COPY[[:space:]]+--from=' <<<"$runtime" \
   && grep -qE '^[[:space:]]*ENTRYPOINT[[:space:]]*\[[[:space:]]*"/usr/bin/efa-k8s-device-plugin"' <<<"$runtime"; then
  pass "runtime stage copies the binary from the build stage and runs it as the entrypoint"
else fail "runtime stage copies the binary from the build stage and runs it as the entrypoint"; fi

# The packages the runtime stage installs: the words after `apt-get install`
# up to the end of that command (&&, ;, |), options skipped.
declare -A listed=()
while read -r word; do listed["$word"]=1; done < <(
  grep -oE 'apt-get[[:space:]]+install[^&;|]*' <<<"$runtime" \
    | sed -E 's/^apt-get[[:space:]]+install//' | tr ' \t' '\n\n' \
    | grep -vE '^(-.*|)$')
if [ "${#listed[@]}" -gt 0 ]; then pass "runtime stage installs ${#listed[@]} packages: $(printf '%s\n' "${!listed[@]}" | sort | tr '\n' ' ')"
else fail "runtime stage has an apt-get install list"; fi

# --- what this machine's packages depend on -------------------------------------
declare -A installed=() depends=() provider=() base=()
while IFS=$'\t' read -r pkg status deps provides priority; do
  [[ "$status" == *" installed" ]] || continue
  installed["$pkg"]=1
  depends["$pkg"]="$deps"
  [ "$priority" == required ] && base["$pkg"]=1
  for v in ${provides//,/ }; do
    [[ "$v" == \(* || "$v" == *\) || "$v" == "=" ]] && continue
    provider["$v"]="${provider[$v]:-$pkg}"
  done
done < <(dpkg-query -W -f='${Package}\t${Status}\t${Depends}, ${Pre-Depends}\t${Provides}\t${Priority}\n')

for pkg in "${!listed[@]}"; do
  if [ -n "${installed[$pkg]:-}" ]; then pass "listed package $pkg is a Debian 12 package (installed here)"
  else fail "listed package $pkg is not installed on this machine: misspelt, or not a Debian 12 package? (the build's -dev packages install every runtime library)"; fi
done

# closure OUT_ARRAY ROOTS...: every installed package ROOTS depend on,
# recursively (the first installed alternative of each dependency), mapped to
# the root it was reached from.
closure() {
  local -n out="$1"; shift
  local queue=() p dep alt name chosen i=0
  for p in "$@"; do out["$p"]="$p"; queue+=("$p"); done
  while [ "$i" -lt "${#queue[@]}" ]; do
    p="${queue[$i]}"; i=$((i + 1))
    IFS=',' read -r -a deps_of <<<"${depends[$p]:-}"
    for dep in "${deps_of[@]}"; do
      chosen=""
      IFS='|' read -r -a alts <<<"$dep"
      for alt in "${alts[@]}"; do
        name="${alt%%(*}"; name="${name%%:*}"; name="${name//[[:space:]]/}"
        [ -z "$name" ] && continue
        if [ -n "${installed[$name]:-}" ]; then chosen="$name"; break; fi
        if [ -n "${provider[$name]:-}" ]; then chosen="${provider[$name]}"; break; fi
      done
      if [ -n "$chosen" ] && [ -z "${out[$chosen]:-}" ]; then
        out["$chosen"]="${out[$p]}"; queue+=("$chosen")
      fi
    done
  done
}
declare -A in_base=() via_listed=()
closure in_base "${!base[@]}" apt
closure via_listed "${!listed[@]}"

# --- the binary's libraries ----------------------------------------------------
# dpkg knows a library by the path its package installed, which on a merged-/usr
# system may differ from the one the loader found (/lib vs /usr/lib): ask for
# every spelling at once (one slow dpkg -S instead of one per library).
candidates_of() {
  local path="$1" real
  real="$(realpath -e "$path" 2>/dev/null || echo "$path")"
  for c in "$path" "$real"; do
    echo "$c"
    case "$c" in /usr/*) echo "${c#/usr}" ;; *) echo "/usr$c" ;; esac
  done
}
declare -A owner=()
map_packages() {
  local paths=() line pkgs path
  mapfile -t paths < <(for p in "$@"; do candidates_of "$p"; done | sort -u)
  [ "${#paths[@]}" -gt 0 ] || return 0
  while IFS= read -r line; do
    pkgs="${line%%: /*}"; path="/${line#*: /}"
    pkgs="${pkgs%%,*}"; owner["$path"]="${pkgs%%:*}"
  done < <(dpkg -S "${paths[@]}" 2>/dev/null | grep -v "^diversion ")
}
package_of() {
  local c
  for c in $(candidates_of "$1"); do
    if [ -n "${owner[$c]:-}" ]; then echo "${owner[$c]}"; return 0; fi
  done
  return 1
}

declare -A needed=() used=()
while read -r lib; do needed["$lib"]=1; done < <(readelf -d "$BINARY" | sed -nE 's/.*\(NEEDED\).*\[(.*)\]/\1/p')
ldd_out="$(ldd "$BINARY" 2>&1)" || { fail "ldd $BINARY: $ldd_out"; finish; }
if grep -q 'not found' <<<"$ldd_out"; then
  fail "ldd finds every library here: $(grep 'not found' <<<"$ldd_out" | tr -s ' \t' ' ' | tr '\n' ';')"
fi

libs="$(awk '$2 == "=>" && $3 ~ /^\// {print $1, $3} $1 ~ /^\// {n=split($1, p, "/"); print p[n], $1}' <<<"$ldd_out")"
mapfile -t lib_paths < <(awk '{print $2}' <<<"$libs")
map_packages "${lib_paths[@]}"
while read -r soname path; do
  [ -n "$path" ] || continue
  if ! pkg="$(package_of "$path")"; then
    fail "$soname ($path) belongs to no Debian package: the runtime image cannot have it"
    continue
  fi
  direct=""; [ -n "${needed[$soname]:-}" ] && direct=" (linked directly)"
  if [ -n "${listed[$pkg]:-}" ]; then
    used["$pkg"]=1; pass "$soname$direct: $pkg, installed by the runtime stage"
  elif [ -n "${in_base[$pkg]:-}" ]; then
    pass "$soname$direct: $pkg, in the debian:12-slim base"
  elif [ -n "${via_listed[$pkg]:-}" ] && [ -z "$direct" ]; then
    used["${via_listed[$pkg]}"]=1; pass "$soname: $pkg, a dependency of listed ${via_listed[$pkg]}"
  elif [ -n "${via_listed[$pkg]:-}" ]; then
    fail "$soname$direct: $pkg arrives only as a dependency of ${via_listed[$pkg]}; add $pkg to the runtime stage's apt-get install"
  else
    fail "$soname$direct: $pkg is not installed by the runtime stage; add $pkg to its apt-get install"
  fi
done <<<"$libs"

# Loaded with dlopen, so invisible to ldd: libibverbs by the inventory
# command, the efa provider (libefa) by libibverbs.
if [ -n "${needed[libibverbs.so.1]:-}" ] || grep -qa 'libibverbs\.so\.1' "$BINARY"; then
  for pkg in libibverbs1 ibverbs-providers; do
    if [ -n "${listed[$pkg]:-}" ]; then
      used[$pkg]=1; pass "$pkg listed: loaded with dlopen (libibverbs by the inventory command, its efa provider by libibverbs)"
    else fail "$pkg is loaded with dlopen: add $pkg to the runtime stage's apt-get install"; fi
  done
fi

for pkg in $(printf '%s\n' "${!listed[@]}" | sort); do
  [ -n "${used[$pkg]:-}" ] || note "$pkg is installed by the runtime stage but provides nothing $(basename "$BINARY") loads"
done
finish
