#!/usr/bin/env bash
# A real single-node Kubernetes v1.20.2 cluster on this machine, for the
# end-to-end suite: containerd, etcd, kube-apiserver, a kubelet, and for
# DaemonSets (the Helm chart's) kube-controller-manager with only the
# DaemonSet and garbage collector controllers, and kube-scheduler. Test pods
# name their node.
#
#   test/e2e/cluster.sh up               start it (builds Kubernetes first if needed)
#   test/e2e/cluster.sh down             stop it and leave the machine clean
#   test/e2e/cluster.sh restart-kubelet  stop the kubelet and start it again
#   test/e2e/cluster.sh node-down        the node goes down as in a reboot: the
#                                        kubelet and containerd stop, every
#                                        container and shim is killed, and what
#                                        lives on tmpfs (containerd's state, the
#                                        CDI dir, pod volumes, kubepods cgroups)
#                                        is gone; what lives on disk stays (the
#                                        kubelet's dir and checkpoint, stale
#                                        sockets included, containerd's root
#                                        with its images and container records)
#   test/e2e/cluster.sh node-up          containerd, then the kubelet, as at boot
#   test/e2e/cluster.sh env              print KUBECONFIG=... for a shell
#
# `up` refuses to start over an existing cluster or a busy port. `down` is safe
# to run at any time, also after a failed or partial `up`: it ends only the
# processes it recorded (by PID, checking the binary), removes the pods'
# containers, unmounts what the kubelet and containerd mounted, removes the
# cgroups, bridge, device nodes and state, and restores ip_forward.
# Logs stay in $E2E_CACHE/logs until the next `up`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib.sh
source "$here/lib.sh"

readonly PKI="$E2E_STATE/pki"
readonly CONTAINERD_DIR="$E2E_STATE/containerd"
readonly CNI_DIR="$E2E_STATE/cni"
readonly RECORD="$E2E_STATE/created"   # system paths this cluster created, for `down`

# --- images -----------------------------------------------------------------
# The pause image from the tree's pause.c and a pod image holding busybox-static.
build_images() {
  local dir="$E2E_CACHE/images"
  mkdir -p "$dir"
  if [ ! -s "$dir/pause.tar" ]; then
    local src="$E2E_CACHE/gopath/src/k8s.io/kubernetes/build/pause/linux/pause.c"
    [ -f "$src" ] || e2e_die "$src not found: run test/e2e/build-kubernetes.sh first"
    local root; root="$(mktemp -d)"
    gcc -Os -Wall -Werror -static -DVERSION=v3.4-efa-e2e -o "$root/pause" "$src" \
      || e2e_die "cannot compile $src (gcc -static)"
    make_image "$dir/pause.tar" "$E2E_PAUSE_IMAGE" "$root" '["/pause"]'
    rm -rf "$root"
  fi
  if [ ! -s "$dir/busybox.tar" ]; then
    [ -x /bin/busybox ] || e2e_die "/bin/busybox not found (package busybox-static)"
    local root; root="$(mktemp -d)"
    mkdir -p "$root/bin" "$root/tmp" "$root/etc"
    cp /bin/busybox "$root/bin/busybox"
    local applet
    for applet in $("$root/bin/busybox" --list); do
      [ "$applet" = busybox ] || ln -s busybox "$root/bin/$applet"
    done
    make_image "$dir/busybox.tar" "$E2E_POD_IMAGE" "$root" '["/bin/sh"]'
    rm -rf "$root"
  fi
}

import_images() {
  local image
  for image in pause busybox; do
    ctr --address "$E2E_CONTAINERD_SOCK" -n k8s.io images import "$E2E_CACHE/images/$image.tar" \
      >>"$E2E_LOGS/images.log" 2>&1 || e2e_die "ctr images import $image.tar failed (see $E2E_LOGS/images.log)"
  done
}

# --- certificates and kubeconfigs -------------------------------------------
# cert NAME SUBJECT EXTENSIONS: a key and a certificate signed by the test CA.
cert() {
  local name="$1" subject="$2" ext="$3"
  openssl req -new -newkey rsa:2048 -nodes -keyout "$PKI/$name.key" -subj "$subject" \
    -out "$PKI/$name.csr" 2>/dev/null
  printf '%s\n' "$ext" > "$PKI/$name.ext"
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 2 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
}

make_pki() {
  mkdir -p "$PKI"
  openssl req -x509 -new -newkey rsa:2048 -nodes -keyout "$PKI/ca.key" -subj "/CN=efa-e2e-ca" \
    -days 2 -out "$PKI/ca.crt" 2>/dev/null || e2e_die "openssl cannot make the CA"
  local client="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
  cert apiserver "/CN=kube-apiserver" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
  cert admin "/O=system:masters/CN=efa-e2e-admin" "$client"
  cert node "/O=system:nodes/CN=system:node:$E2E_NODE" "$client"
  cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client"
  openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
  openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  [ -s "$PKI/sa.pub" ] && [ -s "$PKI/node.crt" ] || e2e_die "openssl failed to make the certificates"
}

kubeconfig() {
  local file="$1" user="$2"
  cat > "$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: efa-e2e
  cluster:
    server: https://127.0.0.1:$E2E_APISERVER_PORT
    certificate-authority: $PKI/ca.crt
users:
- name: $user
  user:
    client-certificate: $PKI/$user.crt
    client-key: $PKI/$user.key
contexts:
- name: efa-e2e
  context: {cluster: efa-e2e, user: $user}
current-context: efa-e2e
EOF
}

# --- components -------------------------------------------------------------
start_containerd() {
  mkdir -p "$CONTAINERD_DIR" "$CNI_DIR/net.d" "$E2E_CDI_DIR"
  # restrict_oom_score_adj: these VMs lack CAP_SYS_RESOURCE (runc otherwise dies
  # with "can't get final child's PID from pipe: EOF"). Every path is below the
  # state dir, so `down` can remove all of it.
  cat > "$CONTAINERD_DIR/config.toml" <<EOF
version = 2
root = "$CONTAINERD_DIR/root"
state = "$CONTAINERD_DIR/state"
[grpc]
  address = "$E2E_CONTAINERD_SOCK"
[plugins."io.containerd.internal.v1.opt"]
  path = "$CONTAINERD_DIR/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$E2E_PAUSE_IMAGE"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  # CDI devices named in the CRI config's CDIDevices or in cdi.k8s.io/
  # annotations (kubelet 1.20 passes a device plugin's annotations on).
  enable_cdi = true
  cdi_spec_dirs = ["$E2E_CDI_DIR"]
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$CONTAINERD_DIR/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$CNI_DIR/net.d"
EOF
  # A bridge with host-local addresses (containerd adds the loopback itself).
  cat > "$CNI_DIR/net.d/10-efa-e2e.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "efa-e2e", "plugins": [
  {"type": "bridge", "bridge": "$E2E_BRIDGE", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$E2E_POD_SUBNET"}]],
            "dataDir": "$CNI_DIR/ipam"}}]}
EOF
  # containerd 1.7 (Debian 12's 1.6 has no CDI), its shims first in PATH.
  local bin
  bin="$("$here/fetch-containerd.sh")" || e2e_die "cannot fetch containerd 1.7 (test/e2e/fetch-containerd.sh)"
  e2e_log "$("$bin/containerd" --version)"
  PATH="$bin:$PATH" e2e_start containerd "$bin/containerd" --config "$CONTAINERD_DIR/config.toml"
  e2e_wait_for 30 "containerd to serve $E2E_CONTAINERD_SOCK" \
    ctr --address "$E2E_CONTAINERD_SOCK" version || e2e_die "containerd did not start (see $E2E_LOGS/containerd.log)"
}

start_etcd() {
  e2e_start etcd etcd --name efa-e2e --data-dir "$E2E_STATE/etcd" \
    --listen-client-urls "http://127.0.0.1:$E2E_ETCD_PORT" \
    --advertise-client-urls "http://127.0.0.1:$E2E_ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$E2E_ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$E2E_ETCD_PEER_PORT" \
    --initial-cluster "efa-e2e=http://127.0.0.1:$E2E_ETCD_PEER_PORT" \
    --listen-metrics-urls "" --logger zap --log-level warn
  e2e_wait_for 30 "etcd to be healthy" curl -fsS "http://127.0.0.1:$E2E_ETCD_PORT/health" \
    || e2e_die "etcd did not start (see $E2E_LOGS/etcd.log)"
}

start_apiserver() {
  e2e_start kube-apiserver "$E2E_BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$E2E_ETCD_PORT" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 \
    --secure-port "$E2E_APISERVER_PORT" --insecure-port 0 \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" \
    --service-account-key-file "$PKI/sa.pub" \
    --service-account-signing-key-file "$PKI/sa.key" \
    --service-account-issuer https://kubernetes.default.svc \
    --service-cluster-ip-range 10.96.0.0/24 \
    --authorization-mode Node,RBAC \
    --disable-admission-plugins ServiceAccount \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP \
    --cert-dir "$E2E_STATE/apiserver" --profiling=false --v=1
  e2e_wait_for 60 "kube-apiserver to be ready" e2e_kubectl get --raw /readyz \
    || e2e_die "kube-apiserver did not become ready (see $E2E_LOGS/kube-apiserver.log)"
}

# What places a DaemonSet's pods: the DaemonSet controller creates them (and
# the garbage collector removes them with their DaemonSet), the scheduler
# binds them. No other controller runs: the checks see only their own doing.
start_controllers() {
  e2e_start kube-controller-manager "$E2E_BIN/kube-controller-manager" \
    --kubeconfig "$E2E_KUBECONFIG" --controllers daemonset,garbagecollector \
    --leader-elect=false --use-service-account-credentials=false \
    --bind-address 127.0.0.1 --port 0 --secure-port "$E2E_CONTROLLER_MANAGER_PORT" \
    --profiling=false --v=1
  e2e_start kube-scheduler "$E2E_BIN/kube-scheduler" \
    --kubeconfig "$E2E_KUBECONFIG" --leader-elect=false \
    --bind-address 127.0.0.1 --port 0 --secure-port "$E2E_SCHEDULER_PORT" \
    --profiling=false --v=1
  e2e_wait_for 60 "kube-controller-manager and kube-scheduler to be healthy" \
    bash -c "curl -fsk https://127.0.0.1:$E2E_CONTROLLER_MANAGER_PORT/healthz && curl -fsk https://127.0.0.1:$E2E_SCHEDULER_PORT/healthz" \
    || e2e_die "kube-controller-manager or kube-scheduler did not start (see $E2E_LOGS/kube-controller-manager.log, kube-scheduler.log)"
}

# The kubelet; also used by restart-kubelet, so its flags live in one place.
start_kubelet() {
  # A stale kubelet.sock stays after a kill until the new kubelet replaces it:
  # wait for a fresh one (newer than this moment).
  local marker="$E2E_STATE/kubelet-started"
  touch "$marker"
  # The kubelet refuses a loopback node IP; the apiserver reaches it at this one.
  local node_ip
  node_ip="$(cat "$E2E_STATE/node-ip")"
  # --vmodule=manager=3: the device manager (manager.go) logs at V(3) each
  # resource it allocates for a container, in order (run.sh's check 6 reads it).
  e2e_start kubelet "$E2E_BIN/kubelet" \
    --container-runtime remote \
    --container-runtime-endpoint "unix://$E2E_CONTAINERD_SOCK" \
    --runtime-request-timeout 2m \
    --cgroup-driver cgroupfs \
    --fail-swap-on=false \
    --hostname-override "$E2E_NODE" --node-ip "$node_ip" \
    --kubeconfig "$E2E_STATE/node.kubeconfig" \
    --root-dir "$E2E_KUBELET_DIR" \
    --address "$node_ip" --port "$E2E_KUBELET_PORT" --read-only-port 0 \
    --healthz-bind-address 127.0.0.1 --healthz-port "$E2E_KUBELET_HEALTHZ_PORT" \
    --anonymous-auth=false --client-ca-file "$PKI/ca.crt" --authorization-mode AlwaysAllow \
    --make-iptables-util-chains=false \
    --volume-plugin-dir "$E2E_STATE/volume-plugins" \
    --node-status-update-frequency 4s \
    --eviction-hard 'memory.available<1Mi,nodefs.available<1%,imagefs.available<1%' \
    --image-gc-high-threshold 100 --image-gc-low-threshold 99 \
    --v=2 --vmodule=manager=3
  e2e_wait_for 60 "the kubelet to serve $E2E_KUBELET_DIR/device-plugins/kubelet.sock" \
    test -S "$E2E_KUBELET_DIR/device-plugins/kubelet.sock" -a \
         "$E2E_KUBELET_DIR/device-plugins/kubelet.sock" -nt "$marker" \
    || e2e_die "the kubelet did not start (see $E2E_LOGS/kubelet.log)"
}

node_ready() {
  [ "$(e2e_kubectl get node "$E2E_NODE" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" = True ]
}

# Records a system path that this cluster creates (if it does not exist yet).
record_if_absent() {
  [ -e "$1" ] || echo "$1" >> "$RECORD"
}

up() {
  [ "$(id -u)" -eq 0 ] || e2e_die "must run as root"
  e2e_ensure_packages containerd runc containernetworking-plugins etcd-server iptables conntrack \
    openssl busybox-static curl jq iproute2 build-essential procps util-linux mount
  "$here/build-kubernetes.sh" >/dev/null
  [ ! -e "$E2E_STATE" ] || e2e_die "$E2E_STATE exists: a cluster is up or was not torn down; run '$0 down'"
  [ ! -e "$E2E_KUBELET_DIR" ] \
    || e2e_die "$E2E_KUBELET_DIR exists: another kubelet uses this machine, or an earlier run was not torn down ('$0 down')"
  local port
  for port in $E2E_ETCD_PORT $E2E_ETCD_PEER_PORT $E2E_APISERVER_PORT $E2E_KUBELET_PORT $E2E_KUBELET_HEALTHZ_PORT \
              $E2E_CONTROLLER_MANAGER_PORT $E2E_SCHEDULER_PORT; do
    ! e2e_port_busy "$port" || e2e_die "TCP port $port is in use: another cluster or program holds it"
  done
  ! ip link show "$E2E_BRIDGE" >/dev/null 2>&1 || e2e_die "network interface $E2E_BRIDGE exists; run '$0 down'"
  local ctl
  for ctl in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
    [ ! -d "$ctl" ] || e2e_die "$ctl exists: another kubelet runs here, or run '$0 down'"
  done

  rm -rf "$E2E_LOGS"
  mkdir -p "$E2E_STATE" "$E2E_LOGS"
  # A failed `up` takes down what it started (the logs stay).
  trap 'e2e_log "up failed: tearing down"; down' EXIT
  : > "$RECORD"
  record_if_absent "$E2E_KUBELET_DIR"
  record_if_absent /var/log/pods
  record_if_absent /var/log/containers
  record_if_absent /var/lib/cni
  record_if_absent /run/containerd   # the shims' sockets go to /run/containerd/s, whatever the config
  cat /proc/sys/net/ipv4/ip_forward > "$E2E_STATE/ip_forward"
  ip -4 -o addr show scope global | awk '{ split($4, a, "/"); print a[1]; exit }' > "$E2E_STATE/node-ip"
  [ -s "$E2E_STATE/node-ip" ] || e2e_die "this machine has no non-loopback IPv4 address for the node (the kubelet refuses 127.0.0.1)"

  local t0=$SECONDS
  build_images
  make_pki
  kubeconfig "$E2E_KUBECONFIG" admin
  kubeconfig "$E2E_STATE/node.kubeconfig" node
  start_containerd
  import_images
  start_etcd
  start_apiserver
  start_controllers
  start_kubelet
  e2e_wait_for 60 "node $E2E_NODE to register" e2e_kubectl get node "$E2E_NODE" \
    || e2e_die "node $E2E_NODE did not register (see $E2E_LOGS/kubelet.log)"
  # The kubelet registers its node with the taint node.kubernetes.io/not-ready
  # (NoSchedule), which the node lifecycle controller lifts once the node is
  # Ready; no DaemonSet pod is placed before. That controller does not run
  # here (it would evict pods while a check stops the kubelet): lift the
  # taint as it would.
  e2e_wait_for 60 "node $E2E_NODE to be Ready" node_ready \
    || e2e_die "node $E2E_NODE did not become Ready (see $E2E_LOGS/kubelet.log)"
  e2e_kubectl taint node "$E2E_NODE" node.kubernetes.io/not-ready:NoSchedule- >/dev/null \
    || e2e_die "cannot lift the not-ready taint of node $E2E_NODE"
  trap - EXIT
  e2e_log "cluster up in $((SECONDS - t0))s: node $E2E_NODE, KUBECONFIG=$E2E_KUBECONFIG, logs in $E2E_LOGS"
}

restart_kubelet() {
  [ -f "$E2E_STATE/pids/kubelet" ] || e2e_die "no kubelet recorded: is the cluster up?"
  e2e_stop kubelet 30
  start_kubelet
}

# --- a simulated reboot -----------------------------------------------------
# Everything a power cycle ends, in the order it would not matter: nothing is
# asked to stop cleanly but the kubelet (which, stopped, touches nothing).
node_down() {
  if [ ! -f "$E2E_STATE/pids/kubelet" ] || [ ! -f "$E2E_STATE/pids/containerd" ]; then
    e2e_die "no kubelet or containerd recorded: is the cluster up?"
  fi
  e2e_stop kubelet 30
  kill_pod_processes
  kill_leftover_shims
  e2e_stop containerd 15 KILL
  # tmpfs on a real node: /run (containerd's state with its sandboxes'
  # network namespaces and containers' root file systems, the CDI dir) and
  # the pods' volume mounts.
  unmount_below "$CONTAINERD_DIR/state" "$E2E_KUBELET_DIR/pods"
  rm -rf --one-file-system "$CONTAINERD_DIR/state" "$CONTAINERD_DIR/runc"
  find "$E2E_CDI_DIR" -mindepth 1 -delete 2>/dev/null || true
  remove_cgroups
}

node_up() {
  start_containerd
  start_kubelet
}

# --- teardown ---------------------------------------------------------------
# Unmounts every mount at or below the given paths, deepest first.
unmount_below() {
  local prefix mnt
  for prefix in "$@"; do
    # A self bind-mount can be stacked; repeat until nothing is left.
    for _ in 1 2 3 4 5; do
      local mounts
      mounts="$(findmnt -rn -o TARGET | awk -v p="$prefix" '$0 == p || index($0, p "/") == 1' | sort -r)"
      [ -n "$mounts" ] || break
      while IFS= read -r mnt; do
        umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || e2e_log "cannot unmount $mnt"
      done <<< "$mounts"
    done
  done
}

# Removes the pods through the kubelet so that CNI and the runtime clean up
# properly; what remains is removed by force below.
delete_pods() {
  e2e_pid kube-apiserver >/dev/null && e2e_pid kubelet >/dev/null || return 0
  e2e_kubectl delete pods --all --all-namespaces --grace-period=0 --force --wait=false \
    >/dev/null 2>&1 || return 0
  e2e_wait_for 60 "the kubelet to remove every pod" \
    bash -c "[ -z \"\$(ctr --address '$E2E_CONTAINERD_SOCK' -n k8s.io tasks ls -q 2>/dev/null)\" ]" || true
}

remove_containers() {
  e2e_pid containerd >/dev/null || return 0
  local ctr_=(ctr --address "$E2E_CONTAINERD_SOCK" -n k8s.io) id
  for id in $("${ctr_[@]}" tasks ls -q 2>/dev/null); do
    "${ctr_[@]}" tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
  done
  for id in $("${ctr_[@]}" tasks ls -q 2>/dev/null); do
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      "${ctr_[@]}" tasks delete "$id" >/dev/null 2>&1 && break
      sleep 0.5
    done
  done
  for id in $("${ctr_[@]}" containers ls -q 2>/dev/null); do
    "${ctr_[@]}" containers delete "$id" >/dev/null 2>&1 || true
  done
}

# Shims of our containerd still running (after a crash): found by our socket
# path in their command line, which no other containerd uses.
kill_leftover_shims() {
  local pid
  for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $E2E_CONTAINERD_SOCK" || true); do
    e2e_log "killing leftover shim $pid"
    kill -KILL "$pid" 2>/dev/null || true
  done
}

# Processes left in the kubelet's pod cgroups (containers whose shim or
# containerd died). `up` refuses to start when kubepods exists, so every
# process in it belongs to this cluster.
kill_pod_processes() {
  local pids pid
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    pids="$(find /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods -name cgroup.procs \
              -exec cat {} + 2>/dev/null | sort -u || true)"
    [ -n "$pids" ] || return 0
    for pid in $pids; do
      kill -KILL "$pid" 2>/dev/null || true
    done
    sleep 0.5
  done
  e2e_log "processes left in the kubepods cgroups: $(paste -sd' ' <<< "$pids")"
}

remove_cgroups() {
  local dir
  for dir in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
    [ -d "$dir" ] || continue
    find "$dir" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    [ ! -d "$dir" ] || e2e_log "cannot remove cgroup $dir (processes left in it?)"
  done
}

down() {
  [ "$(id -u)" -eq 0 ] || e2e_die "must run as root"
  # Best effort: every step runs even when an earlier one failed.
  set +e
  if [ ! -e "$E2E_STATE" ]; then
    e2e_log "no cluster state at $E2E_STATE: nothing to tear down"
    return 0
  fi
  # Processes a test started (the device plugins) go first, and the
  # controllers (or the DaemonSet controller would replace deleted pods).
  local record
  for record in "$E2E_STATE"/pids/*; do
    [ -f "$record" ] || continue
    case "$(basename "$record")" in
      containerd|etcd|kube-apiserver|kubelet) ;;
      *) e2e_stop "$(basename "$record")" 10 ;;
    esac
  done
  delete_pods
  e2e_stop kubelet 30
  remove_containers
  e2e_stop kube-apiserver 15
  e2e_stop etcd 15
  e2e_stop containerd 15
  kill_leftover_shims
  kill_pod_processes
  unmount_below "$E2E_KUBELET_DIR" "$E2E_STATE"
  remove_cgroups
  ip link delete "$E2E_BRIDGE" 2>/dev/null || true
  if [ -f "$E2E_STATE/ip_forward" ]; then
    cat "$E2E_STATE/ip_forward" > /proc/sys/net/ipv4/ip_forward || true
  fi
  # Paths that did not exist before `up`; the kubelet dir always is one
  # (`up` refuses to start over an existing one).
  if [ -f "$RECORD" ]; then
    local path
    while IFS= read -r path; do
      [ -n "$path" ] && rm -rf --one-file-system "$path"
    done < "$RECORD"
  fi
  rm -rf --one-file-system "$E2E_STATE"
  [ ! -e "$E2E_STATE" ] || e2e_log "could not remove all of $E2E_STATE"
  e2e_log "cluster down"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  restart-kubelet) restart_kubelet ;;
  node-down) node_down ;;
  node-up) node_up ;;
  env) echo "KUBECONFIG=$E2E_KUBECONFIG" ;;
  *) echo "usage: $0 up|down|restart-kubelet|node-down|node-up|env" >&2; exit 2 ;;
esac
