# shellcheck shell=bash
# Check 16: the claim lookup against the real API server. Sourced by run.sh,
# not run by itself.

# DRANET prepares its claims without naming devices, so a kubelet lists
# them in pod-resources without any; the -dra daemon (draMonitor.claimLookup)
# reads such a claim's allocation from the API server. Real here: the API
# server's TLS (checked against the cluster's CA), a service account token
# from TokenRequest, and RBAC from the chart's own rendered templates/rbac.yaml
# (refused, then allowed). Stand-ins for what 1.20.2 lacks: the kubelet here
# has no DRA, so a fake kubelet (fake-kubelet --claim) lists the claim as a
# 1.34 kubelet lists DRANET's; the API server has no resource.k8s.io, so a
# CRD of that group and version serves ResourceClaims at the same path.
CLAIMS_DIR=""
CLAIMS_PORT=18089
readonly CLAIMS_CRD="resourceclaims.resource.k8s.io"

claims_metrics() { curl -fsS --max-time 5 "http://127.0.0.1:$CLAIMS_PORT/metrics" 2>/dev/null; }
claims_metric_at_least() {  # NAME VALUE
  claims_metrics | awk -v n="$1" -v v="$2" '$1 == n && $2 >= v { found = 1 } END { exit !found }'
}
claims_series() { claims_metrics | grep -c "^efa_device_plugin_container_efa_tx_bytes_total{.*pod=\"dranet-0\".*dra_device_name=\"$1\"" ; }
claims_both_series() { [ "$(claims_series "$1")" = 1 ] && [ "$(claims_series "$2")" = 1 ]; }
claims_log_has() { grep -F -- "$1" "$E2E_LOGS/claims-plugin.log" >/dev/null; }

claims_cleanup() {
  e2e_stop claims-plugin 10
  e2e_stop claims-kubelet 10
  e2e_kubectl delete namespace claims-ml --wait=false >/dev/null 2>&1
  e2e_kubectl delete crd "$CLAIMS_CRD" --wait=false >/dev/null 2>&1
  [ -z "$CLAIMS_DIR" ] || e2e_kubectl delete -f "$CLAIMS_DIR/rbac.yaml" --wait=false >/dev/null 2>&1
  return 0
}

check_16_claim_lookup() {
  CLAIMS_DIR="$E2E_STATE/claims"
  rm -rf "$CLAIMS_DIR"
  mkdir -p "$CLAIMS_DIR/device-plugins" "$CLAIMS_DIR/pod-resources" "$CLAIMS_DIR/cdi"
  ! e2e_port_busy "$CLAIMS_PORT" || why "port $CLAIMS_PORT (the second daemon's metrics) is taken" || return 1
  e2e_kubectl apply -f - >/dev/null <<EOF || why "cannot create the CRD $CLAIMS_CRD" || return 1
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: $CLAIMS_CRD
  annotations:
    api-approved.kubernetes.io: "unapproved, a stand-in for resource.k8s.io/v1 on a 1.20 API server (test only)"
spec:
  group: resource.k8s.io
  scope: Namespaced
  names: {plural: resourceclaims, singular: resourceclaim, kind: ResourceClaim, listKind: ResourceClaimList}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
EOF
  e2e_kubectl wait --for condition=established "crd/$CLAIMS_CRD" --timeout 60s >/dev/null \
    || why "the CRD $CLAIMS_CRD was not established" || return 1
  # The claim, as DRANET's allocation leaves it: two of the node's EFAs,
  # named as DRANET names them (pci- and the address with - for : and .).
  local efas=() names=() name
  mapfile -t efas < <(all_efa_names | head -n 2)
  for name in "${efas[@]}"; do names+=("pci-$(tr ':.' '--' <<< "${SIM_PCI[$name]}")"); done
  e2e_kubectl create namespace claims-ml >/dev/null 2>&1
  e2e_kubectl apply -f - >/dev/null <<EOF || why "cannot create the ResourceClaim" || return 1
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: efa-dranet, namespace: claims-ml}
spec:
  devices:
    requests: [{name: efa, exactly: {deviceClassName: efa.networking.k8s.aws, count: 2}}]
status:
  allocation:
    devices:
      results:
        - {request: efa, driver: dra.net, pool: $E2E_NODE, device: ${names[0]}}
        - {request: efa, driver: dra.net, pool: $E2E_NODE, device: ${names[1]}}
EOF
  # The chart's service account and its ClusterRole and binding; the binding
  # is taken away at first.
  e2e_helm template efa "$CHART" -n kube-system \
    --set draMonitor.enabled=true --show-only templates/rbac.yaml > "$CLAIMS_DIR/rbac.yaml" \
    || why "helm template --show-only templates/rbac.yaml failed" || return 1
  local applied sa binding
  applied="$(e2e_kubectl apply -f "$CLAIMS_DIR/rbac.yaml" -o name)" || why "cannot apply the chart's RBAC" || return 1
  sa="$(sed -n 's|^serviceaccount/||p' <<< "$applied")"
  binding="$(sed -n 's|^clusterrolebinding.rbac.authorization.k8s.io/||p' <<< "$applied")"
  [ -n "$sa" ] && [ -n "$binding" ] || why "the chart's RBAC has no service account or binding: $(flat "$applied")" || return 1
  e2e_kubectl delete clusterrolebinding "$binding" >/dev/null || why "cannot delete $binding" || return 1
  "$E2E_BIN/kubectl-v1.34" --kubeconfig "$E2E_KUBECONFIG" create token "$sa" -n kube-system \
    --duration 1h > "$CLAIMS_DIR/token" 2>"$CLAIMS_DIR/token.err" \
    || why "kubectl create token $sa failed: $(cat "$CLAIMS_DIR/token.err")" || return 1

  e2e_start claims-kubelet "$FAKE_KUBELET_BIN" --dir "$CLAIMS_DIR/device-plugins" \
    --pod-resources-socket "$CLAIMS_DIR/pod-resources/kubelet.sock" \
    --claim claims-ml/dranet-0/efa-dranet --hold --timeout 60
  e2e_start claims-plugin "$PLUGIN_BIN" --kubelet-dir "$CLAIMS_DIR" \
    --sysfs-root "$SIM/sys" --dev-root "$DEV_ROOT" --proc-root "$FAKE_PROC" \
    --cdi-spec-dirs "$CLAIMS_DIR/cdi" --cdi-dir "$CLAIMS_DIR/cdi" \
    --metrics-address "127.0.0.1:$CLAIMS_PORT" --probe-address "" --counter-interval 1s \
    --claim-lookup --api-server "127.0.0.1:$E2E_APISERVER_PORT" \
    --api-token-file "$CLAIMS_DIR/token" --api-ca-file "$E2E_STATE/pki/ca.crt"

  # Refused: counted, logged once with the API server's own message.
  e2e_wait_for 60 "a refused claim lookup" claims_metric_at_least efa_device_plugin_claim_lookup_errors_total 2 \
    || why "no failed claim lookup counted (see $E2E_LOGS/claims-plugin.log)" || return 1
  local refused="claim lookup: GET https://127.0.0.1:$E2E_APISERVER_PORT/apis/resource.k8s.io/v1/namespaces/claims-ml/resourceclaims/efa-dranet: HTTP 403: resourceclaims.resource.k8s.io \"efa-dranet\" is forbidden: User \"system:serviceaccount:kube-system:$sa\" cannot get resource \"resourceclaims\" in API group \"resource.k8s.io\" in the namespace \"claims-ml\""
  [ "$(grep -cF -- "$refused" "$E2E_LOGS/claims-plugin.log")" = 1 ] \
    || why "the refusal is not logged once as '$refused': $(flat "$(grep -F 'claim lookup' "$E2E_LOGS/claims-plugin.log" | head -n 2)")" || return 1
  [ "$(claims_series "${names[0]}")" = 0 ] || why "series for the claim while the lookup is refused" || return 1
  info "refused without the binding: $(grep -F "claim lookup" "$E2E_LOGS/claims-plugin.log" | head -n 1 | sed 's/^\[[^]]*\] //' | cut -c1-160)..."

  # Allowed: the claim's EFAs get the pod's series, with DRA's labels.
  e2e_kubectl apply -f "$CLAIMS_DIR/rbac.yaml" >/dev/null || why "cannot apply the chart's RBAC again" || return 1
  e2e_wait_for 60 "the claim's EFAs' per-pod series" claims_both_series "${names[0]}" "${names[1]}" \
    || why "no series of pod dranet-0 for ${names[*]} with the binding back (see $E2E_LOGS/claims-plugin.log)" || return 1
  claims_log_has "claim lookup: ResourceClaim claims-ml/efa-dranet looked up" \
    || why "the lookup's recovery is not logged" || return 1
  local lookups
  lookups="$(claims_metrics | awk '$1 == "efa_device_plugin_claim_lookups_total" { print $2 }')"
  info "allowed: pod claims-ml/dranet-0 has the series of ${efas[*]} (${names[*]}) after $lookups lookups"
  claims_cleanup
}
