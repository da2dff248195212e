#!/usr/bin/env bash
# Tests that the version has one source, CMake's project(VERSION):
# scripts/version.sh reads the VERSION CMake configured, finds every other
# place agreeing in the tree, and in a copy of the tree names each place made
# to drift, one at a time; scripts/release.sh refuses another VERSION.
#
#   test/release/version_test.sh VERSION    (CTest passes ${PROJECT_VERSION})
#
# Ends with "N passed, M failed"; exits non-zero when anything failed.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
readonly ROOT
readonly VERSION="${1:?usage: version_test.sh VERSION, CMake PROJECT_VERSION}"
readonly DRIFT="9.8.7"

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "ok   - $1"; }
fail() { failed=$((failed + 1)); echo "FAIL - $1"; echo "       ${2//$'\n'/$'\n'       }"; }
# expect NAME WANT GOT
expect() { if [ "$3" = "$2" ]; then pass "$1"; else fail "$1" "expected: $2"$'\n'"got:      $3"; fi; }

got="$("$ROOT/scripts/version.sh" 2>&1)"
expect "scripts/version.sh prints CMake's PROJECT_VERSION" "$VERSION" "$got"
got="$("$ROOT/scripts/version.sh" check "$VERSION" 2>&1)"
expect "every place in the tree carries $VERSION" \
  "version $VERSION: CMakeLists.txt, Chart.yaml version and appVersion, Dockerfile, docs agree" "$got"

# A copy of what version.sh reads, to make drift in.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
copy_tree() {
  rm -rf "$work/tree"
  mkdir -p "$work/tree"
  (cd "$ROOT" && find . \( -name build -o -name .git \) -prune -o -type f \
     \( -name '*.md' -o -name Dockerfile -o -name values.yaml -o -name Chart.yaml -o -path ./CMakeLists.txt \) \
     -print0 | xargs -0 cp --parents -t "$work/tree")
}

# drift NAME FILE SED_EXPR EXPECTED_LINE: FILE (in the copy) edited by
# SED_EXPR; the check must fail with exactly EXPECTED_LINE as its finding.
drift() {
  local name="$1" file="$2" expr="$3" line="$4" got rc
  copy_tree
  local before; before="$(cat "$work/tree/$file")"
  sed -i "$expr" "$work/tree/$file"
  [ "$(cat "$work/tree/$file")" != "$before" ] \
    || { fail "$name" "the edit '$expr' changed nothing in $file (the test is out of date)"; return; }
  got="$(EFA_VERSION_ROOT="$work/tree" "$ROOT/scripts/version.sh" check "$VERSION" 2>&1)"
  rc=$?
  expect "$name: refused" 1 "$rc"
  expect "$name: named" "version.sh: the version is $VERSION, but:"$'\n'"  $work/tree/$line" "$got"
}

drift "CMakeLists.txt's project VERSION" CMakeLists.txt \
  "s/^\(project([^)]*VERSION \)[0-9.]*/\1$DRIFT/" "CMakeLists.txt: project VERSION is '$DRIFT'"
drift "Chart.yaml's version" helm/aws-efa-k8s-device-plugin/Chart.yaml \
  "s/^version: .*/version: $DRIFT/" "helm/aws-efa-k8s-device-plugin/Chart.yaml: version is '$DRIFT'"
drift "Chart.yaml's appVersion" helm/aws-efa-k8s-device-plugin/Chart.yaml \
  "s/^appVersion: .*/appVersion: \"$DRIFT\"/" "helm/aws-efa-k8s-device-plugin/Chart.yaml: appVersion is '$DRIFT'"
# Only where the Dockerfile has a default (the build scripts pass VERSION).
if grep -q '^ARG VERSION=' "$ROOT/Dockerfile"; then
  copy_tree
  sed -i "s/^ARG VERSION=.*/ARG VERSION=$DRIFT/" "$work/tree/Dockerfile"
  got="$(EFA_VERSION_ROOT="$work/tree" "$ROOT/scripts/version.sh" check "$VERSION" 2>&1)"
  expect "the Dockerfile's ARG VERSION default: named" 1 \
    "$(grep -c "^  $work/tree/Dockerfile: ARG VERSION default is '$DRIFT'$" <<< "$got")"
fi
# An example in the docs (a line that exists today: the check names the
# file and line, so the test finds its own).
doc="$(cd "$ROOT" && grep -rnoE --include='*.md' --exclude=CHANGELOG.md --exclude-dir=build --exclude-dir=.git \
         "efa-k8s-device-plugin:$VERSION" . | head -n1)"
if [ -n "$doc" ]; then
  IFS=: read -r file lineno _ <<< "$doc"
  file="${file#./}"
  drift "an image tag in $file" "$file" "${lineno}s/efa-k8s-device-plugin:$VERSION/efa-k8s-device-plugin:$DRIFT/" \
    "$file:$lineno:efa-k8s-device-plugin:$DRIFT"
else
  fail "an image tag in the docs" "no *.md names efa-k8s-device-plugin:$VERSION (the test is out of date)"
fi

# A release is cut at CMake's version only.
got="$(EFA_RELEASE_SKIP_IMAGE=1 EFA_RELEASE_DIR="$work/release" "$ROOT/scripts/release.sh" "$DRIFT" 2>&1)"
expect "release.sh $DRIFT: refused" 1 "$?"
expect "release.sh $DRIFT: says why" \
  "release: ERROR: VERSION $DRIFT differs from CMakeLists.txt's project VERSION $VERSION: set it there (and in Chart.yaml and the Dockerfile: scripts/version.sh check $DRIFT lists every place), then release" "$got"
expect "release.sh $DRIFT: wrote nothing" "" "$(ls -A "$work/release" 2>/dev/null)"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
