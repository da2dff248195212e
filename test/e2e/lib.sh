# shellcheck shell=bash disable=SC2034
# Shared settings and helpers of the end-to-end suite; sourced by cluster.sh
# and run.sh, not run by itself.
#
# Every path the suite writes is below one of:
#   E2E_CACHE  kept between runs: Kubernetes build, images, logs of the last run
#   E2E_STATE  one cluster's state (pids, certs, containerd, etcd, dev root);
#              removed by `cluster.sh down`
# plus the kubelet's fixed /var/lib/kubelet (removed by `down`).

E2E_CACHE="${EFA_E2E_CACHE:-/var/cache/efa-e2e}"
E2E_STATE="${EFA_E2E_STATE:-/run/efa-e2e}"
E2E_BIN="$E2E_CACHE/bin"
E2E_LOGS="$E2E_CACHE/logs"
E2E_NODE="efa-e2e"                 # node name (kubelet --hostname-override)
E2E_KUBELET_DIR="/var/lib/kubelet" # kubelet 1.20 hard-codes its device-plugins dir below it
E2E_CONTAINERD_SOCK="$E2E_STATE/containerd/containerd.sock"
# The one CDI spec dir of the cluster's containerd (not the host's /etc/cdi or
# /var/run/cdi: nothing on the host feeds the test); the daemon writes there.
E2E_CDI_DIR="$E2E_STATE/cdi"
E2E_KUBECONFIG="$E2E_STATE/admin.kubeconfig"
E2E_PAUSE_IMAGE="localhost/efa-e2e/pause:1"
E2E_POD_IMAGE="localhost/efa-e2e/busybox:1"
E2E_BRIDGE="efae2e0"
E2E_POD_SUBNET="10.88.77.0/24"
E2E_ETCD_PORT=2379
E2E_ETCD_PEER_PORT=2380
E2E_APISERVER_PORT=6443
E2E_KUBELET_PORT=10250
E2E_KUBELET_HEALTHZ_PORT=10248
E2E_CONTROLLER_MANAGER_PORT=10257
E2E_SCHEDULER_PORT=10259

e2e_log() { echo "[$(date +%H:%M:%S)] $*" >&2; }
e2e_die() { e2e_log "ERROR: $*"; exit 1; }

# Installs the Debian packages named that are missing.
e2e_ensure_packages() {
  "$(dirname "${BASH_SOURCE[0]}")/../../scripts/install-deps.sh" --only "$@" ||
    e2e_die "installing $* failed"
}

# kubectl against the test cluster.
# (Its discovery cache goes to the state dir, not ~/.kube.)
e2e_kubectl() {
  "$E2E_BIN/kubectl" --kubeconfig "$E2E_KUBECONFIG" --cache-dir "$E2E_STATE/kubectl-cache" "$@"
}

# helm (v4, from build-kubernetes.sh --with-helm) against the test cluster,
# its state in the state dir.
e2e_helm() {
  HELM_CACHE_HOME="$E2E_STATE/helm/cache" HELM_CONFIG_HOME="$E2E_STATE/helm/config" \
  HELM_DATA_HOME="$E2E_STATE/helm/data" \
    "$E2E_BIN/helm" --kubeconfig "$E2E_KUBECONFIG" "$@"
}

# Waits until the command succeeds: e2e_wait_for SECONDS DESCRIPTION CMD...
# Returns 1 (and says what it waited for) on timeout.
e2e_wait_for() {
  local timeout="$1" what="$2"; shift 2
  local deadline=$((SECONDS + timeout))
  while ! "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      e2e_log "timed out after ${timeout}s waiting for $what"
      return 1
    fi
    sleep 0.5
  done
}

# A docker-save tarball of one layer, for `ctr images import`:
#   make_image TAR REF LAYER_DIR ENTRYPOINT_JSON
# (cluster.sh's pause and pod images; check 13's plugin image)
make_image() {
  local tar="$1" ref="$2" rootfs="$3" entrypoint="$4"
  local work; work="$(mktemp -d)"
  tar -C "$rootfs" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf "$work/layer.tar" .
  local diff_id; diff_id="$(sha256sum "$work/layer.tar" | cut -d' ' -f1)"
  mkdir "$work/$diff_id"; mv "$work/layer.tar" "$work/$diff_id/layer.tar"
  cat > "$work/config.json" <<EOF
{"architecture":"amd64","os":"linux","created":"1970-01-01T00:00:00Z",
 "config":{"Entrypoint":$entrypoint,"Env":["PATH=/bin"]},
 "rootfs":{"type":"layers","diff_ids":["sha256:$diff_id"]}}
EOF
  local config_id; config_id="$(sha256sum "$work/config.json" | cut -d' ' -f1)"
  mv "$work/config.json" "$work/$config_id.json"
  echo "[{\"Config\":\"$config_id.json\",\"RepoTags\":[\"$ref\"],\"Layers\":[\"$diff_id/layer.tar\"]}]" \
    > "$work/manifest.json"
  tar -C "$work" --owner=0 --group=0 --numeric-owner -cf "$tar.tmp" manifest.json "$config_id.json" "$diff_id"
  mv "$tar.tmp" "$tar"
  rm -rf "$work"
}

# Starts a process in its own session, logging to $E2E_LOGS/NAME.log, and
# records "PID EXE" in $E2E_STATE/pids/NAME so that only this process is ever
# signalled later.
e2e_start() {
  local name="$1"; shift
  mkdir -p "$E2E_STATE/pids" "$E2E_LOGS"
  # 9>&-: run.sh's lock must not outlive run.sh in a daemon.
  setsid "$@" >>"$E2E_LOGS/$name.log" 2>&1 < /dev/null 9>&- &
  local pid=$! exe
  disown "$pid"  # no "Killed" job report when a check kills it
  exe="$(readlink -f "$(command -v "$1")")"
  echo "$pid $exe" > "$E2E_STATE/pids/$name"
  # The child becomes the binary once setsid has exec'd it.
  local deadline=$((SECONDS + 5))
  until [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$exe" ]; do
    e2e_alive "$pid" || e2e_die "$name exited at once; see $E2E_LOGS/$name.log"
    [ "$SECONDS" -lt "$deadline" ] || e2e_die "$name (pid $pid) is not running $exe"
    sleep 0.05
  done
}

# The PID recorded for NAME if that process still runs the recorded binary;
# nothing otherwise (PIDs get reused).
e2e_pid() {
  local file="$E2E_STATE/pids/$1" pid exe
  [ -f "$file" ] || return 1
  read -r pid exe < "$file"
  [ -n "$pid" ] && e2e_alive "$pid" || return 1
  [ "$(readlink "/proc/$pid/exe" 2>/dev/null | sed 's/ (deleted)$//')" = "$exe" ] || return 1
  echo "$pid"
}

# Whether PID is a live process (a zombie is not: this machine's init reaps
# orphans only now and then).
e2e_alive() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  stat="${stat##*) }"
  [ "${stat%% *}" != Z ]
}

# Ends the recorded process NAME: SIGTERM (or the signal given), then SIGKILL
# after GRACE seconds. Forgets the record. No-op if it is not running.
e2e_stop() {
  local name="$1" grace="${2:-10}" signal="${3:-TERM}" pid
  if pid="$(e2e_pid "$name")"; then
    kill "-$signal" "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + grace))
    while e2e_alive "$pid" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
    if e2e_alive "$pid"; then
      e2e_log "$name (pid $pid) did not stop in ${grace}s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      while e2e_alive "$pid"; do sleep 0.1; done
    fi
  fi
  rm -f "$E2E_STATE/pids/$name"
}

# Whether a TCP port on 127.0.0.1 (or any address) is being listened on.
e2e_port_busy() { ss -Hltn "sport = :$1" | grep -q .; }
