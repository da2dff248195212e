# shellcheck shell=bash
# Check 13: `helm upgrade` of the chart's release with changed values while
# pods hold EFAs (issue 42). Sourced by run.sh, not run by itself.
#
# The chart is installed from its chart repository (add_chart_repo, as check
# 9) in best-effort mode; its pod runs the image of EFA_E2E_IMAGE_TAR, else
# one made here from this build's binaries by scripts/image-rootfs.sh (what
# the Dockerfile's runtime stage holds). Then, each step a `helm upgrade`
# that rolls the plugin pod, pods running all along:
#   install      best effort; pods be-gpu (1 GPU + 4 EFA), be-efa (2 EFA)
#   late binding --reuse-values --set alignment.mode=late-binding; pods
#                lb-gpu, lb-efa; be-gpu's container killed and restarted
#   sharing      --reuse-values --set sharing.replicas=2,
#                sharing.renameByDefault=true (vpc.amazonaws.com/efa.shared);
#                pods sh-gpu, sh-efa of the new name; lb-efa killed
#   back         --reset-values to the install's values; pods bk-gpu, bk-efa;
#                lb-gpu restarted, sh-efa killed
# A restarted container must come back with the same nodes; but one
# late-bound under the name the daemon no longer serves (lb-efa after the
# rename, sh-efa after the switch back) cannot (kubelet 1.20 calls that
# name's PreStartContainer, and no plugin serves it: docs/install.md): the
# daemon must say so, and the container either comes back with its nodes
# or stays down with its EFAs given to nobody else.
# After each upgrade, and again after each step's new pods and restart,
# every running container's /dev/infiniband is read from inside (kubectl
# exec, all at once: name and major:minor of each node) and checked: each container holds exactly the
# nodes it held when it started (a restarted one too), and no device node is
# in two running containers, except between containers that asked for the
# shared resource, at most sharing.replicas of them. Every finding is kept
# and the steps go on, so one run shows each transition's outcome; the
# reason names the step, the pod and the device node. Last, with every pod
# deleted the best-effort daemon removes the CDI specs late binding wrote.
# The daemon in the chart's pod reads the pod's own /proc (the chart fixes
# procRoot), not the fake NVIDIA driver's files: it cannot place GPUs, so
# late binding binds without alignment here; check 12 covers alignment.
readonly EFA_SHARED="vpc.amazonaws.com/efa.shared"
readonly UPGRADE_REPLICAS=2
readonly UPGRADE_LOCAL_IMAGE="localhost/efa-k8s-device-plugin:e2e-build"
readonly UPGRADE_WAIT=60   # seconds for a rollout, pods to run, a restart

declare -A UP_HELD=()   # pod -> its device nodes when it started: "MAJ:MIN name" lines
declare -A UP_RES=()    # pod -> the EFA resource it asked for
UP_PROBLEMS=()          # every finding, in order
declare -A UP_SEEN=()   # findings already reported (a state that lasts is reported once)
UP_STEP=""              # the step being run, for messages
UP_T0=0                 # when the check began (progress lines show the seconds since)

up_problem() { UP_PROBLEMS+=("[$UP_STEP] $*"); info "PROBLEM [$UP_STEP +$((SECONDS - UP_T0))s] $*"; }
# up_problem_once KEY MESSAGE: the finding, unless KEY was reported before.
up_problem_once() {
  [ -z "${UP_SEEN[$1]:-}" ] || return 0
  UP_SEEN[$1]=1
  up_problem "$2"
}

# The chart pod's image: EFA_E2E_IMAGE_TAR's (import_plugin_image), else
# one of this build's daemon and idle binaries with the libraries they load.
upgrade_plugin_image() {
  if [ -n "${EFA_E2E_IMAGE_TAR:-}" ]; then import_plugin_image; return; fi
  local root out tar="$E2E_STATE/plugin-image.tar" triplet
  triplet="$(gcc -dumpmachine)"
  root="$(mktemp -d)"
  # shellcheck disable=SC2154  # repo: run.sh's checkout
  out="$("$repo/scripts/image-rootfs.sh" "$triplet" "$root" "$PLUGIN_BIN" "$IDLE_BIN" 2>&1)" \
    || { rm -rf "$root"; why "scripts/image-rootfs.sh failed: $(flat "$out")"; return 1; }
  make_image "$tar" "$UPGRADE_LOCAL_IMAGE" "$root" '["/usr/bin/efa-k8s-device-plugin"]'
  rm -rf "$root"
  ctr --address "$E2E_CONTAINERD_SOCK" -n k8s.io images import "$tar" >>"$E2E_LOGS/images.log" 2>&1 \
    || why "ctr images import $tar failed (see $E2E_LOGS/images.log)" || return 1
  # shellcheck disable=SC2034  # chart.sh's, which chart_values reads
  PLUGIN_IMAGE="$UPGRADE_LOCAL_IMAGE"
}

# The install's values: check 9's, readiness probed every second (a
# rollout is waited for through it), debug log.
upgrade_base_values() {
  chart_values
  printf '%s\n' --set readinessProbe.periodSeconds=1 --set readinessProbe.initialDelaySeconds=0 \
    --set config.logLevel=debug
}

res_allocatable() {
  e2e_kubectl get node "$E2E_NODE" -o json 2>/dev/null | jq -r --arg r "$1" '.status.allocatable[$r] // "0"'
}
# The plugin pod that replaced OLD_UID (none: any) is Ready (registered),
# the old one gone, and the node offers RESOURCE.
plugin_serves() {
  local old="$1" res="$2" uid
  chart_pod_ready || return 1
  uid="$(chart_pod_field '.[0].metadata.uid')"
  [ "$uid" != "$old" ] || return 1
  [ -z "$old" ] || pod_uid_gone "$old" || return 1
  e2e_kubectl logs -n "$CHART_NS" "$(chart_pod_field '.[0].metadata.name')" 2>/dev/null \
    | grep -F "registered $res with the kubelet" >/dev/null || return 1
  [ "$(res_allocatable "$res")" -gt 0 ]
}

# upgrade_to STEP RESOURCE SHOWN HELM-ARGS...: `helm upgrade` (or install
# when STEP is "install"), then waits for the new plugin pod to serve
# RESOURCE. SHOWN: the arguments as the progress line shows them.
upgrade_to() {
  local step="$1" res="$2" shown="$3" old="" out t=$SECONDS; shift 3
  UP_STEP="$step"
  if [ "$step" = install ]; then
    out="$(e2e_helm install "$RELEASE" "$CHART_REF" -n "$CHART_NS" "$@" 2>&1)" \
      || why "helm install $RELEASE $CHART_REF failed: $(flat "$out")" || return 1
  else
    old="$(chart_pod_field '.[0].metadata.uid')"
    local old_name; old_name="$(chart_pod_field '.[0].metadata.name')"
    out="$(e2e_helm upgrade "$RELEASE" "$CHART_REF" -n "$CHART_NS" "$@" 2>&1)" \
      || why "[$step] helm upgrade $* failed: $(flat "$out")" || return 1
    # Kubelet 1.20 sometimes loses a deleted pod's container between its
    # kill and its pod killer ("Failed killing the pod ... not found") and
    # then never finishes the pod: it stays Terminating with no container
    # (ContainerStatusUnknown) and the DaemonSet waits for it. Such a pod
    # (none of its containers running) is force-deleted, as an operator
    # would; a daemon that does not stop is still the kubelet's to kill.
    # (The kubelet removes a deleted pod 6-9 s after its container ends.)
    if ! e2e_wait_for 15 "the old plugin pod $old_name to go" pod_uid_gone "$old" \
        && e2e_kubectl get pod -n "$CHART_NS" "$old_name" -o json 2>/dev/null \
          | jq -e '.metadata.deletionTimestamp != null and all(.status.containerStatuses[]?; .state.running == null)' >/dev/null; then
      info "[$step] the kubelet left the old plugin pod $old_name terminating with no container running (a kubelet 1.20 race): force-deleting it"
      e2e_kubectl delete pod -n "$CHART_NS" "$old_name" --grace-period=0 --force >/dev/null 2>&1 || true
    fi
  fi
  e2e_wait_for "$UPGRADE_WAIT" "the plugin pod of '$step' to serve $res" plugin_serves "$old" "$res" \
    || why "[$step] no new plugin pod serving $res within ${UPGRADE_WAIT}s: $(chart_pods | jq -c '[.items[] | {name: .metadata.name, uid: .metadata.uid, phase: .status.phase, ready: ([.status.conditions[]? | select(.type == "Ready") | .status] | first), containers: .status.containerStatuses}]'); allocatable $res '$(res_allocatable "$res")'" \
    || return 1
  info "[$step +$((SECONDS - UP_T0))s] plugin pod $(chart_pod_field '.[0].metadata.name') serves $res (allocatable $(res_allocatable "$res")) $((SECONDS - t))s after helm $shown"
}

# The container's device nodes as "MAJ:MIN name" lines, sorted; from inside.
nodes_in() {
  local view
  view="$(pod_view "$1" 2>&1)" || { echo "$view"; return 1; }
  view_devices "$view" | awk '{ print $2, $1 }' | sort
}
# read_nodes POD...: nodes_in of each pod, all at once (each is a kubectl
# exec); sets NODES[pod] to its lines, or NODES_ERR[pod] to why not.
declare -A NODES=() NODES_ERR=()
read_nodes() {
  local dir pod; dir="$(mktemp -d)"
  NODES=(); NODES_ERR=()
  for pod in "$@"; do
    { if nodes_in "$pod" > "$dir/$pod.out" 2>&1; then : > "$dir/$pod.ok"; fi; } &
  done
  wait
  for pod in "$@"; do
    if [ -e "$dir/$pod.ok" ]; then NODES[$pod]="$(cat "$dir/$pod.out")"
    else NODES_ERR[$pod]="$(flat "$(cat "$dir/$pod.out")")"; fi
  done
  rm -rf "$dir"
}
# "name (MAJ:MIN), ..." of "MAJ:MIN name" lines, for messages.
nodes_text() { awk 'NF { printf "%s%s (%s)", (n++ ? ", " : ""), $2, $1 }' <<< "$1"; }

# Whether each pod is Running, or will not run (Failed, or a container
# waiting with an error).
settled() {
  local p
  for p in "$@"; do
    pod_running "$p" || pod_failed "$p" \
      || pod_json "$p" | jq -e '[.status.containerStatuses[]?.state.waiting.reason // empty]
          | any(test("Err|Error|BackOff"))' >/dev/null || return 1
  done
}

# start_pods RESOURCE NAME:EFAS:GPUS...: creates the pods (restartPolicy
# OnFailure: a killed container is started again), waits for them, records
# what each running one holds. A pod that does not run, or holds another
# number of nodes than it asked for (1 to that many with sharing: one node
# an EFA however many of its replicas), is a finding.
start_pods() {
  local res="$1" spec name efas gpus manifests="" nodes count; shift
  local -a names=()
  for spec in "$@"; do
    IFS=: read -r name efas gpus <<< "$spec"
    names+=("$name")
    manifests+="$(pod_manifest "$name" "$efas" "$gpus" "$res" | sed 's/restartPolicy: Never/restartPolicy: OnFailure/')"$'\n---\n'
  done
  e2e_kubectl apply -f - <<< "$manifests" >/dev/null || why "[$UP_STEP] cannot create pods ${names[*]}" || return 1
  e2e_wait_for "$UPGRADE_WAIT" "pods ${names[*]} to run" settled "${names[@]}" || true
  read_nodes "${names[@]}"
  for spec in "$@"; do
    IFS=: read -r name efas gpus <<< "$spec"
    if ! pod_running "$name"; then
      up_problem "$name ($efas $res, $gpus GPU) does not run: $(not_running "$name")"
      continue
    fi
    [ -z "${NODES_ERR[$name]:-}" ] || { up_problem "cannot look inside $name: ${NODES_ERR[$name]}"; continue; }
    nodes="${NODES[$name]}"
    count="$(grep -c . <<< "$nodes")"
    local least="$efas"
    [ "$res" != "$EFA_SHARED" ] || least=1
    if [ "$count" -lt "$least" ] || [ "$count" -gt "$efas" ]; then
      up_problem "$name/main asked for $efas $res and holds $count device nodes: [$(nodes_text "$nodes")]"
    fi
    UP_HELD[$name]="$nodes"
    UP_RES[$name]="$res"
    info "[$UP_STEP +$((SECONDS - UP_T0))s] $name/main ($efas $res, $gpus GPU) holds $(nodes_text "$nodes")"
  done
}

# check_holdings WHEN: every recorded container holds exactly what it held
# when it started, and no device node is in two of them (but containers of
# the shared resource, up to the replicas, among themselves).
check_holdings() {
  local when="$1" pod now lost gained all="" before=${#UP_PROBLEMS[@]}
  local -a pods
  mapfile -t pods < <(printf '%s\n' "${!UP_HELD[@]}" | sort)
  read_nodes "${pods[@]}"
  for pod in "${pods[@]}"; do
    if [ -n "${NODES_ERR[$pod]:-}" ]; then
      up_problem_once "exec $pod" "$when: cannot look inside $pod: ${NODES_ERR[$pod]}"
      continue
    fi
    now="${NODES[$pod]}"
    if [ "$now" != "${UP_HELD[$pod]}" ]; then
      lost="$(comm -23 <(echo "${UP_HELD[$pod]}") <(echo "$now"))"
      gained="$(comm -13 <(echo "${UP_HELD[$pod]}") <(echo "$now"))"
      up_problem_once "changed $pod $(flat "$now")" \
        "$when: $pod/main (${UP_RES[$pod]}) lost [$(nodes_text "$lost")] and gained [$(nodes_text "$gained")]; it holds [$(nodes_text "$now")]"
    fi
    all+="$(awk -v p="$pod" 'NF { print $1, $2, p }' <<< "$now")"$'\n'
  done
  local node name holders shared
  while read -r node name holders; do
    [ -n "$node" ] || continue
    local -a list; IFS=, read -r -a list <<< "$holders"
    shared=1
    for pod in "${list[@]}"; do [ "${UP_RES[$pod]}" = "$EFA_SHARED" ] || shared=0; done
    [ "$shared" -eq 1 ] && [ "${#list[@]}" -le "$UPGRADE_REPLICAS" ] && continue
    local who=""
    for pod in "${list[@]}"; do who+="${who:+, }$pod/main (${UP_RES[$pod]})"; done
    up_problem_once "twice $node $holders" "$when: device node $name ($node) is in ${#list[@]} running containers: $who"
  done < <(grep . <<< "$all" | sort | awk '{ k = $1 " " $2; if (k in h) h[k] = h[k] "," $3; else h[k] = $3; n[k]++ }
                                           END { for (k in n) if (n[k] > 1) print k, h[k] }' | sort)
  [ ${#UP_PROBLEMS[@]} -gt "$before" ] \
    || info "[$UP_STEP +$((SECONDS - UP_T0))s] $when: ${#UP_HELD[@]} containers hold what they held at start$( [ ${#UP_SEEN[@]} -eq 0 ] && echo ", no device node in two" || echo "; no new finding")"
}

# restart_settled POD N SINCE: whether POD's container runs again after
# its Nth restart, or failed to start: the kubelet's "Failed" warning about
# it at SINCE (RFC 3339) or later, or a waiting reason naming an error or a
# back-off (the first restart after a kill is immediate, so a back-off
# means a start failed). The warning comes at once; the reason only at the
# pod worker's next sync, 10 s after a failed one.
restart_settled() {
  restarted_running "$1" "$2" && return 0
  e2e_kubectl get events -n default --field-selector "involvedObject.name=$1,type=Warning,reason=Failed" -o json 2>/dev/null \
    | jq -e --arg since "$3" 'any(.items[]; (.lastTimestamp // .eventTime // "") >= $since)' >/dev/null && return 0
  pod_json "$1" \
    | jq -e '[.status.containerStatuses[]?.state.waiting.reason // empty] | any(test("Err|Error|BackOff"))' >/dev/null
}
# The kubelet's last warning about POD (why a container did not start).
last_warning() {
  e2e_kubectl get events -n default --field-selector "involvedObject.name=$1,type=Warning" -o json 2>/dev/null \
    | jq -r '[.items[] | select(.reason != "BackOff")] | sort_by(.lastTimestamp) | last | .message // "none"' \
    | sed -E 's#endpoint &\{[^ ]* [^ ]* [^ ]* ([^ ]*) .*\} has been stopped#the endpoint of \1 has been stopped#' | cut -c1-400
}

# restart_and_check POD...: kills their containers together; each must
# come back (the kubelet calls PreStartContainer of the resource's plugin
# again when its last registration asked for it; without, the container
# is started from the checkpointed Allocate answer, a CDI annotation
# included) with the same device nodes. One that does not is no longer
# looked inside.
restart_and_check() {
  local pod now since
  declare -A was=()
  since="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  for pod in "$@"; do
    was[$pod]="$(restarts_of "$pod")"
    ctr --address "$E2E_CONTAINERD_SOCK" -n k8s.io tasks kill -s SIGKILL "$(container_of "$pod")" >/dev/null 2>&1 \
      || { up_problem "cannot kill $pod's container $(container_of "$pod")"; unset "was[$pod]"; }
  done
  for pod in $(printf '%s\n' "${!was[@]}" | sort); do
    e2e_wait_for "$UPGRADE_WAIT" "$pod's container to run again or fail to" restart_settled "$pod" $((was[$pod] + 1)) "$since" || true
    if ! restarted_running "$pod" $((was[$pod] + 1)); then
      up_problem "$pod/main (${UP_RES[$pod]}) did not start again after its container was killed: $(pod_json "$pod" | jq -c '[.status.containerStatuses[]? | {restartCount, waiting: .state.waiting.reason}]'); the kubelet: $(last_warning "$pod")"
      unset "UP_HELD[$pod]"
      continue
    fi
    if ! now="$(nodes_in "$pod")"; then up_problem "cannot look inside $pod after its restart: $(flat "$now")"; continue; fi
    [ "$now" = "${UP_HELD[$pod]}" ] \
      || up_problem "$pod/main (${UP_RES[$pod]}) came back from a container restart with [$(nodes_text "$now")], before [$(nodes_text "${UP_HELD[$pod]}")]"
    info "[$UP_STEP +$((SECONDS - UP_T0))s] $pod/main restarted (restartCount $((was[$pod] + 1))): $(nodes_text "$now")"
  done
}

# The plugin pod's log has this text.
plugin_says() {
  e2e_kubectl logs -n "$CHART_NS" "$(chart_pod_field '.[0].metadata.name')" 2>/dev/null | grep -F -- "$1" >/dev/null
}

# restart_unserved POD RESOURCE: POD's container holds EFAs late-bound under
# RESOURCE, a name the daemon no longer serves. Kubelet 1.20 calls that
# name's PreStartContainer again at a restart and has no plugin for it, so
# the container cannot start again (docs/install.md, "Changing values on a
# running cluster"): the daemon must say so, and the container, killed, must
# either come back with the same nodes or not come back at all (its EFAs
# then stay reserved: check_holdings sees no other container get them).
restart_unserved() {
  local pod="$1" res="$2" said="hold EFAs late-bound under $2, which this daemon no longer serves"
  e2e_wait_for 15 "the daemon to say that $res is no longer served" plugin_says "$said" \
    || up_problem "$pod/main holds EFAs late-bound under $res, which the daemon no longer serves, and the daemon did not say so (\"... $said ...\")"
  local n since now
  n="$(restarts_of "$pod")"; since="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  ctr --address "$E2E_CONTAINERD_SOCK" -n k8s.io tasks kill -s SIGKILL "$(container_of "$pod")" >/dev/null 2>&1 \
    || { up_problem "cannot kill $pod's container $(container_of "$pod")"; return 0; }
  e2e_wait_for "$UPGRADE_WAIT" "$pod's container to run again or fail to" restart_settled "$pod" $((n + 1)) "$since" || true
  if restarted_running "$pod" $((n + 1)); then
    if ! now="$(nodes_in "$pod")"; then up_problem "cannot look inside $pod after its restart: $(flat "$now")"; return 0; fi
    [ "$now" = "${UP_HELD[$pod]}" ] \
      || up_problem "$pod/main ($res) came back from a container restart with [$(nodes_text "$now")], before [$(nodes_text "${UP_HELD[$pod]}")]"
    info "[$UP_STEP +$((SECONDS - UP_T0))s] $pod/main ($res, no longer served) restarted with its nodes: $(nodes_text "$now")"
  else
    info "[$UP_STEP +$((SECONDS - UP_T0))s] $pod/main ($res, no longer served) did not start again, as documented; the daemon said so; the kubelet: $(last_warning "$pod")"
    unset "UP_HELD[$pod]"
  fi
}

late_specs_any() { find "$CDI_DIR" -maxdepth 1 -name 'vpc.amazonaws.com-efa*_claim-*.json' -printf '%f\n' | sort; }
no_late_specs() { [ -z "$(late_specs_any)" ]; }

# The steps; returns non-zero only when the run cannot go on (the findings
# are in UP_PROBLEMS).
upgrade_steps() {
  local -a base
  mapfile -t base < <(upgrade_base_values)
  upgrade_to install "$EFA" "install (best effort)" "${base[@]}" || return 1
  chart_fetched_from_repo || why "helm install did not fetch the chart from $CHART_REPO_URL (see $E2E_LOGS/chart-repo.log)" || return 1
  start_pods "$EFA" be-gpu:4:1 be-efa:2:0 || return 1
  check_holdings "best effort, pods started"

  upgrade_to "late binding" "$EFA" "upgrade --reuse-values --set alignment.mode=late-binding" \
    --reuse-values --set alignment.mode=late-binding || return 1
  check_holdings "after the upgrade to late binding"
  start_pods "$EFA" lb-gpu:4:1 lb-efa:2:0 || return 1
  restart_and_check be-gpu
  check_holdings "late binding, new pods started, be-gpu restarted"

  upgrade_to "sharing renamed" "$EFA_SHARED" \
    "upgrade --reuse-values --set sharing.replicas=$UPGRADE_REPLICAS,sharing.renameByDefault=true" \
    --reuse-values --set "sharing.replicas=$UPGRADE_REPLICAS" --set sharing.renameByDefault=true || return 1
  check_holdings "after the upgrade to sharing with the rename"
  start_pods "$EFA_SHARED" sh-gpu:4:1 sh-efa:2:0 || return 1
  restart_unserved lb-efa "$EFA"
  check_holdings "sharing renamed, new pods started, lb-efa killed"

  upgrade_to "back" "$EFA" "upgrade --reset-values <the install's values>" --reset-values "${base[@]}" || return 1
  check_holdings "after the upgrade back to the install's values"
  start_pods "$EFA" bk-gpu:4:1 bk-efa:2:0 || return 1
  # lb-gpu: late-bound, started from its CDI annotation (no PreStart in
  # best effort); sh-efa: late-bound under the name no longer served.
  restart_and_check lb-gpu
  restart_unserved sh-efa "$EFA_SHARED"
  check_holdings "back, new pods started, lb-gpu restarted, sh-efa killed"

  # The best-effort daemon deletes the specs late binding wrote once their
  # containers are gone.
  UP_STEP="back"
  local specs; specs="$(late_specs_any)"
  timed "delete pods" delete_all_pods || why "cannot delete the pods of check 13" || return 1
  [ -z "$specs" ] || timed "specs removed" e2e_wait_for "$UPGRADE_WAIT" "the late-binding specs to go" no_late_specs \
    || up_problem "with every pod deleted the best-effort daemon left late binding's CDI specs in $CDI_DIR: $(flat "$(late_specs_any)")"
}

# timed LABEL CMD...: runs CMD, adding "LABEL Ns" to UP_TIMES.
UP_TIMES=""
timed() {
  local label="$1" t=$SECONDS rc=0; shift
  "$@" || rc=$?
  UP_TIMES+="${UP_TIMES:+, }$label $((SECONDS - t))s"
  return "$rc"
}

# Back to the host daemon for the checks after this one, whatever happened;
# the first failure's reason is kept.
upgrade_cleanup() {
  local rc=0 saved="$reason"
  timed "delete pods" delete_all_pods || true
  timed uninstall uninstall_release || { rc=1; reason="helm uninstall $RELEASE did not remove the DaemonSet and its pods"; }
  rm -f "$CDI_DIR"/vpc.amazonaws.com-efa*_claim-*.json
  stop_fake_gpu_plugin
  timed "host daemon" restart_host_daemon "$EFA_TOTAL" || rc=1
  [ -z "$saved" ] || reason="$saved"
  return "$rc"
}

check_13_upgrade_values() {
  UP_HELD=(); UP_RES=(); UP_PROBLEMS=(); UP_SEEN=(); UP_STEP="setup"; UP_TIMES=""; UP_T0=$SECONDS
  timed "delete pods" delete_all_pods || why "cannot delete the earlier checks' pods" || return 1
  no_release || return 1
  if ! e2e_pid fake-gpu-plugin >/dev/null; then timed "fake GPU plugin" start_fake_gpu_plugin || return 1; fi
  timed image upgrade_plugin_image || return 1
  timed "stop host daemon" stop_host_daemon || return 1
  timed "chart repo" add_chart_repo || return 1
  local rc=0
  reason=""
  timed steps upgrade_steps || rc=1
  upgrade_cleanup || rc=1
  info "times: $UP_TIMES"
  [ "$rc" -eq 0 ] || return 1
  [ ${#UP_PROBLEMS[@]} -eq 0 ] || why "${#UP_PROBLEMS[@]} findings: $(printf '%s; ' "${UP_PROBLEMS[@]}" | sed 's/; $//')"
}
