# shellcheck shell=bash
# Check 16: the claim lookup against the real API server. Sourced by run.sh,
# not run by itself.

# DRANET prepares its claims without naming devices, so a kubelet lists
# them in pod-resources without any; the -dra daemon (draMonitor.claimLookup)
# reads such a claim from the API server. Real here: the API server's TLS
# (checked against the cluster's CA), its authentication of a service
# account token from TokenRequest (the token file read again at each
# lookup), and RBAC from the chart's own rendered templates/rbac.yaml. The
# kubelet here (1.20.2) has no DRA, so a fake kubelet (fake-kubelet --claim)
# lists the claim as a 1.34 kubelet lists DRANET's. The API server is named
# by host name. A bad token is refused
# (401), the chart's service account without its binding is refused by
# RBAC (403), and with the binding the request passes authorization and
# finds no such API (404: the API server, 1.20.2, has no resource.k8s.io).
# Then a CRD serves resource.k8s.io/v1 resourceclaims (the API server's
# own storage, authentication and RBAC; build-kubernetes.sh replaces the
# reflect2 that made custom objects crash it), and the claim, as DRANET's
# allocation leaves it, gives the pod its series.
CLAIMS_DIR=""
readonly CLAIMS_PORT=18089
readonly CLAIMS_PATH="/apis/resource.k8s.io/v1/namespaces/claims-ml/resourceclaims/efa-dranet"
# By name, as a host install names an EKS endpoint: resolved within the
# lookup's time, the certificate checked for the name (the API server's
# has DNS:localhost), SNI sent.
readonly CLAIMS_API="localhost:$E2E_APISERVER_PORT"

claims_metrics() { curl -fsS --max-time 5 "http://127.0.0.1:$CLAIMS_PORT/metrics" 2>/dev/null; }
claims_errors() { claims_metrics | awk '$1 == "efa_device_plugin_claim_lookup_errors_total" { print $2 }'; }
# The daemon logged a lookup that failed with TEXT (after its "GET URL: ").
claims_logged() { grep -cF -- "claim lookup: GET https://$CLAIMS_API$CLAIMS_PATH: $1" "$E2E_LOGS/claims-plugin.log"; }
# Scrapes (each scrape makes a read of the counters, a lookup) until the
# daemon has logged LINE.
claims_wait_line() {
  local deadline=$((SECONDS + 60))
  while [ "$SECONDS" -lt "$deadline" ]; do
    claims_metrics >/dev/null
    grep -qF -- "$1" "$E2E_LOGS/claims-plugin.log" && return 0
    sleep 0.5
  done
  return 1
}
# ... until it has logged a lookup that failed with TEXT.
claims_wait_logged() { claims_wait_line "claim lookup: GET https://$CLAIMS_API$CLAIMS_PATH: $1"; }

claims_cleanup() {
  e2e_stop claims-plugin 10
  e2e_stop claims-kubelet 10
  [ -z "$CLAIMS_DIR" ] || e2e_kubectl delete -f "$CLAIMS_DIR/rbac.yaml" --wait=false >/dev/null 2>&1
  e2e_kubectl delete namespace claims-ml --wait=false >/dev/null 2>&1
  e2e_kubectl delete crd resourceclaims.resource.k8s.io --wait=false >/dev/null 2>&1
  return 0
}

check_16_claim_lookup() {
  CLAIMS_DIR="$E2E_STATE/claims"
  rm -rf "$CLAIMS_DIR"
  mkdir -p "$CLAIMS_DIR/device-plugins" "$CLAIMS_DIR/pod-resources" "$CLAIMS_DIR/cdi"
  ! e2e_port_busy "$CLAIMS_PORT" || why "port $CLAIMS_PORT (the second daemon's metrics) is taken" || return 1
  # The chart's service account, ClusterRole and binding; the binding is
  # taken away at first.
  e2e_helm template efa "$CHART" -n kube-system --set draMonitor.enabled=true \
    --show-only templates/rbac.yaml > "$CLAIMS_DIR/rbac.yaml" \
    || why "helm template --show-only templates/rbac.yaml failed" || return 1
  local applied sa binding
  applied="$(e2e_kubectl apply -f "$CLAIMS_DIR/rbac.yaml" -o name)" || why "cannot apply the chart's RBAC" || return 1
  sa="$(sed -n 's|^serviceaccount/||p' <<< "$applied")"
  binding="$(sed -n 's|^clusterrolebinding.rbac.authorization.k8s.io/||p' <<< "$applied")"
  [ -n "$sa" ] && [ -n "$binding" ] || why "the chart's RBAC has no service account or binding: $(flat "$applied")" || return 1
  e2e_kubectl delete clusterrolebinding "$binding" >/dev/null || why "cannot delete $binding" || return 1
  "$E2E_BIN/kubectl-v1.34" --kubeconfig "$E2E_KUBECONFIG" create token "$sa" -n kube-system \
    --duration 1h > "$CLAIMS_DIR/token.real" 2>"$CLAIMS_DIR/token.err" \
    || why "kubectl create token $sa failed: $(cat "$CLAIMS_DIR/token.err")" || return 1
  echo "not-a-token" > "$CLAIMS_DIR/token"

  e2e_start claims-kubelet "$FAKE_KUBELET_BIN" --dir "$CLAIMS_DIR/device-plugins" \
    --pod-resources-socket "$CLAIMS_DIR/pod-resources/kubelet.sock" \
    --claim claims-ml/dranet-0/efa-dranet --hold --timeout 60
  e2e_start claims-plugin "$PLUGIN_BIN" --kubelet-dir "$CLAIMS_DIR" \
    --sysfs-root "$SIM/sys" --dev-root "$DEV_ROOT" --proc-root "$FAKE_PROC" \
    --cdi-spec-dirs "$CLAIMS_DIR/cdi" --cdi-dir "$CLAIMS_DIR/cdi" \
    --metrics-address "127.0.0.1:$CLAIMS_PORT" --probe-address "" --counter-interval 100ms \
    --claim-lookup --api-server "$CLAIMS_API" \
    --api-token-file "$CLAIMS_DIR/token" --api-ca-file "$E2E_STATE/pki/ca.crt"

  # A token the API server does not know.
  claims_wait_logged "HTTP 401: Unauthorized" \
    || why "no 401 logged for a bad token (see $E2E_LOGS/claims-plugin.log)" || return 1
  # The service account's own token, read at the next lookup: RBAC refuses
  # it without the chart's binding, with the API server's own message.
  cp "$CLAIMS_DIR/token.real" "$CLAIMS_DIR/token"
  local refused="HTTP 403: resourceclaims.resource.k8s.io \"efa-dranet\" is forbidden: User \"system:serviceaccount:kube-system:$sa\" cannot get resource \"resourceclaims\" in API group \"resource.k8s.io\" in the namespace \"claims-ml\""
  claims_wait_logged "$refused" \
    || why "no RBAC refusal logged as '$refused': $(flat "$(grep -F 'claim lookup' "$E2E_LOGS/claims-plugin.log")")" || return 1
  local errors; errors="$(claims_errors)"
  # The binding back: authorized, and this API server has no such API.
  e2e_kubectl apply -f "$CLAIMS_DIR/rbac.yaml" >/dev/null || why "cannot apply the chart's RBAC again" || return 1
  claims_wait_logged "HTTP 404: 404 page not found" \
    || why "with the chart's binding the lookup was not authorized (see $E2E_LOGS/claims-plugin.log)" || return 1
  # Each kind of failure logged once however often it recurs; each counted.
  local kind
  for kind in "HTTP 401: Unauthorized" "$refused" "HTTP 404: 404 page not found"; do
    [ "$(claims_logged "$kind")" = 1 ] || why "'$kind' logged $(claims_logged "$kind") times, not once" || return 1
  done
  [ "$(claims_errors)" -gt "$errors" ] || why "claim_lookup_errors_total did not grow past $errors" || return 1
  claims_metrics | grep -q '^efa_device_plugin_container_efa_tx_bytes_total{.*pod="dranet-0"' \
    && { why "series for pod dranet-0 though its claim was never found"; return 1; }

  # The claim itself: resource.k8s.io/v1 served by a CRD, and the claim as
  # DRANET's allocation leaves it, two of the node's EFAs by DRANET's names.
  local devs=() dev
  for dev in "$SIM"/sys/class/infiniband/*; do
    if [ "${#devs[@]}" -lt 2 ]; then devs+=("pci-$(basename "$(readlink -f "$dev/device")" | tr ':.' '--')"); fi
  done
  e2e_kubectl apply -f - > "$CLAIMS_DIR/claim.out" 2>&1 <<CLAIM || why "cannot create the CRD and the claim: $(flat "$(cat "$CLAIMS_DIR/claim.out")")" || return 1
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: resourceclaims.resource.k8s.io
  annotations: {api-approved.kubernetes.io: "https://github.com/kubernetes/enhancements/pull/4381"}
spec:
  group: resource.k8s.io
  scope: Namespaced
  names: {plural: resourceclaims, singular: resourceclaim, kind: ResourceClaim}
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
---
apiVersion: v1
kind: Namespace
metadata: {name: claims-ml}
CLAIM
  e2e_kubectl wait --for condition=established --timeout=60s crd/resourceclaims.resource.k8s.io >/dev/null \
    || why "the CRD for resource.k8s.io/v1 resourceclaims was not established" || return 1
  local lookups; lookups="$(claims_metrics | awk '$1 == "efa_device_plugin_claim_lookups_total" { print $2 }')"
  e2e_kubectl apply -f - > "$CLAIMS_DIR/claim.out" 2>&1 <<CLAIM || why "cannot create the claim: $(flat "$(cat "$CLAIMS_DIR/claim.out")")" || return 1
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: efa-dranet, namespace: claims-ml}
spec: {devices: {requests: [{name: efa, exactly: {deviceClassName: dranet, count: 2}}]}}
status:
  allocation:
    devices:
      results:
      - {request: efa, driver: dra.net, pool: $E2E_NODE, device: ${devs[0]}}
      - {request: efa, driver: dra.net, pool: $E2E_NODE, device: ${devs[1]}}
CLAIM
  claims_wait_line "claim lookup: ResourceClaim claims-ml/efa-dranet looked up" \
    || why "the claim served by the API server was not looked up (see $E2E_LOGS/claims-plugin.log)" || return 1
  local series
  series="$(claims_metrics | grep '^efa_device_plugin_container_efa_tx_bytes_total{.*pod="dranet-0"')"
  for dev in "${devs[@]}"; do
    grep -q "dra_claim_name=\"efa-dranet\",dra_claim_namespace=\"claims-ml\",dra_driver_name=\"dra.net\",dra_pool_name=\"$E2E_NODE\",dra_device_name=\"$dev\"" <<< "$series" \
      || why "no series for pod dranet-0 on $dev: $(flat "$series")" || return 1
  done
  [ "$(wc -l <<< "$series")" -eq 2 ] || why "pod dranet-0 has $(wc -l <<< "$series") series, not 2: $(flat "$series")" || return 1
  [ "$(claims_metrics | awk '$1 == "efa_device_plugin_claim_lookups_total" { print $2 }')" -gt "$lookups" ] \
    || why "claim_lookups_total did not grow past $lookups" || return 1
  info "401 for a bad token, 403 for $sa without the chart's binding, 404 (authorized; no resource.k8s.io in 1.20) with it; $(claims_errors) lookups failed, each kind logged once; the claim served by a CRD gave pod dranet-0 its 2 EFAs' series (${devs[*]})"
  claims_cleanup
}
