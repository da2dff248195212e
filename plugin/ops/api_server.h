// One GET to the Kubernetes API server, as a pod's service account makes it:
// HTTPS to the server the kubelet names in KUBERNETES_SERVICE_HOST and
// KUBERNETES_SERVICE_PORT, the server's certificate checked against the
// service account's CA, the account's token as the bearer. Used for one
// thing: the allocation of a ResourceClaim that the kubelet lists without
// devices (DRANET's; docs/observability.md, "EFAs served by DRA").
//
// OpenSSL is loaded (dlopen) at the first GET, not at start: linked, it
// would cost every daemon 1.8 MiB of RSS for a lookup most never make.
//
//   ApiServer api(settings);
//   absl::StatusOr<std::string> body = api.Get("/apis/resource.k8s.io/v1/...");
#pragma once

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace efa::plugin {

// Where the API server is and how to be let in; the defaults are a pod's.
struct ApiServerSettings {
  // "host:port" ("[v6]:port" for an IPv6 address); empty: the pod's
  // KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT.
  std::string address;
  // Read at every GET: the kubelet rotates a projected token.
  std::filesystem::path token_file = "/var/run/secrets/kubernetes.io/serviceaccount/token";
  std::filesystem::path ca_file = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
};

class ApiServer {
 public:
  // `env` looks up the environment (the process's when null).
  explicit ApiServer(ApiServerSettings settings,
                     std::function<std::optional<std::string>(const std::string&)> env = nullptr);
  ~ApiServer();
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  // The body of a 200 answer to GET `path`; otherwise an error naming the
  // server and path and what failed (address, token, TLS and its
  // certificate check, the HTTP status with the API server's message). At
  // most `timeout` in all, a host name's lookup included; a body over
  // kMaxBody is refused. Thread-safe.
  absl::StatusOr<std::string> Get(std::string_view path,
                                  std::chrono::milliseconds timeout = kTimeout) const;

  static constexpr std::chrono::milliseconds kTimeout{3000};
  static constexpr size_t kMaxBody = 1 << 20;

  // A host name's lookup (glibc's getaddrinfo_a) that outlived the GET
  // that started it: the next GET waits for it rather than start another,
  // so a resolver that never answers holds one lookup, not one a GET.
  struct PendingLookup;

 private:
  ApiServerSettings settings_;
  std::function<std::optional<std::string>(const std::string&)> env_;
  mutable absl::Mutex mu_;
  mutable std::unique_ptr<PendingLookup> pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace efa::plugin
