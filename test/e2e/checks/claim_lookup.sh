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
# lists the claim as a 1.34 kubelet lists DRANET's. The API server (1.20.2)
# has no resource.k8s.io, and a CRD cannot stand in for it: this build's
# apiserver (Go 1.19, vendored reflect2 v1.0.1) dies of SIGSEGV in
# reflect2's map iteration the first time it decodes a custom object. So
# what is checked is every step before the claim itself: a bad token is
# refused (401), the chart's service account without its binding is
# refused by RBAC (403), and with the binding the request passes
# authorization and finds no such API (404). The claim's answer and the
# series it gives are checked against a stand-in HTTPS server
# (test/integration/efa_counters_daemon_test.cc, "With claimLookup ...").
CLAIMS_DIR=""
readonly CLAIMS_PORT=18089
readonly CLAIMS_PATH="/apis/resource.k8s.io/v1/namespaces/claims-ml/resourceclaims/efa-dranet"

claims_metrics() { curl -fsS --max-time 5 "http://127.0.0.1:$CLAIMS_PORT/metrics" 2>/dev/null; }
claims_errors() { claims_metrics | awk '$1 == "efa_device_plugin_claim_lookup_errors_total" { print $2 }'; }
# The daemon logged a lookup that failed with TEXT (after its "GET URL: ").
claims_logged() { grep -cF -- "claim lookup: GET https://127.0.0.1:$E2E_APISERVER_PORT$CLAIMS_PATH: $1" "$E2E_LOGS/claims-plugin.log"; }
# Scrapes (each scrape makes a read of the counters, a lookup) until the
# daemon has logged TEXT.
claims_wait_logged() {
  local text="$1" deadline=$((SECONDS + 60))
  while [ "$SECONDS" -lt "$deadline" ]; do
    claims_metrics >/dev/null
    [ "$(claims_logged "$text")" -ge 1 ] && return 0
    sleep 0.5
  done
  return 1
}

claims_cleanup() {
  e2e_stop claims-plugin 10
  e2e_stop claims-kubelet 10
  [ -z "$CLAIMS_DIR" ] || e2e_kubectl delete -f "$CLAIMS_DIR/rbac.yaml" --wait=false >/dev/null 2>&1
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
    --claim-lookup --api-server "127.0.0.1:$E2E_APISERVER_PORT" \
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
  info "401 for a bad token, 403 for $sa without the chart's binding, 404 (authorized; no resource.k8s.io in 1.20) with it; $(claims_errors) lookups failed, each kind logged once"
  claims_cleanup
}
