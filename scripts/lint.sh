#!/usr/bin/env bash
# The project's habits, checked; CI runs this first (.ci/run):
#   formatting  clang-format: every C++ and proto file as .clang-format says
#   scripts     shellcheck -x: every shell script (warnings and errors)
#   layering    every #include "..." points down (scripts/check-layering.py)
#   bug-prone   clang-tidy with .clang-tidy (bug-prone checks, functions of
#               at most 80 lines) on plugin/ and topology/, from the ci
#               preset's compile_commands.json (configures build/ci and
#               builds the generated proto headers it needs)
# Usage: scripts/lint.sh [--changed]
#   --changed   clang-tidy only the sources that differ from main (and the
#               .cc beside each changed header); CI checks every source.
# Installs the Debian packages it needs. Each check prints its time; any
# finding fails the run with a non-zero exit, after every check has run.
set -euo pipefail
cd "$(dirname "$0")/.."
changed=0
for arg in "$@"; do
  case "$arg" in
    --changed) changed=1 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "lint.sh: unknown argument '$arg' (--changed or nothing)" >&2; exit 2 ;;
  esac
done

started=$SECONDS
check_started=$SECONDS
failed=()
check() {  # check NAME STATUS
  echo "lint.sh: $1: $((SECONDS - check_started)) s" >&2
  [ "$2" = 0 ] || failed+=("$1")
  check_started=$SECONDS
}
# Tracked files and new ones not ignored, so that a script is linted before
# its first commit.
files() { git ls-files --cached --others --exclude-standard "$@" | sort -u; }

scripts/install-deps.sh

status=0
files '*.cc' '*.h' '*.proto' | xargs -r clang-format --dry-run -Werror || status=$?
check "clang-format" "$status"

status=0
# Scripts: *.sh, and files without an extension whose first line runs a
# shell (.ci/run).
mapfile -t scripts < <(files | while read -r f; do
  [ -f "$f" ] || continue
  case "${f##*/}" in
    *.sh) echo "$f" ;;
    *.*) ;;
    *) head -n1 "$f" | grep -qE '^#!.*\b(ba)?sh\b' && echo "$f" ;;
  esac
done)
shellcheck -x --severity=warning "${scripts[@]}" || status=$?
check "shellcheck (${#scripts[@]} scripts)" "$status"

status=0
python3 scripts/check-layering.py || status=$?
check "layering" "$status"

status=0
cmake --preset ci >/dev/null
cmake --build --preset ci --target efa_proto >/dev/null
mapfile -t sources < <(files 'plugin/*.cc' 'topology/*.cc')
if [ "$changed" = 1 ]; then
  base=$(git merge-base HEAD main)
  mapfile -t sources < <({ git diff --name-only "$base" -- plugin topology
                           git ls-files --others --exclude-standard -- plugin topology; } |
    sed -n 's/\.h$/.cc/; /\.cc$/p' | sort -u | while read -r f; do [ -f "$f" ] && echo "$f"; done)
fi
if [ ${#sources[@]} -gt 0 ]; then
  # run-clang-tidy takes regular expressions: anchor each path.
  run-clang-tidy -quiet -j 2 -p build/ci "${sources[@]/#/^$PWD/}" 2>&1 |
    { grep -vE '^[0-9]+ warnings? generated\.$|^Suppressed [0-9]+ warnings|^Use -header-filter|^clang-tidy-[0-9]+ .* -quiet ' || true; } ||
    status=$?
fi
check "clang-tidy (${#sources[@]} sources)" "$status"

if [ ${#failed[@]} -gt 0 ]; then
  echo "lint.sh: FAILED: ${failed[*]} (the findings are above)" >&2
  exit 1
fi
echo "lint.sh: all checks passed in $((SECONDS - started)) s" >&2
