// Serving one gRPC service on a unix socket, as the kubelet and device
// plugins do; shared by the fake kubelet's sockets and the fake accelerator
// plugin.
#pragma once

#include <sys/un.h>

#include <filesystem>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"

namespace efa::testing {

// Whether `path` fits a unix socket address (sockaddr_un holds it with its
// terminating NUL); the error names the path.
inline absl::Status CheckUnixSocketPath(const std::filesystem::path& path) {
  if (path.string().size() < sizeof(sockaddr_un::sun_path)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("%s: too long for a unix socket (%d bytes at most)", path.string(),
                      sizeof(sockaddr_un::sun_path) - 1));
}

// Serves `service` on the unix socket `path` (which must not exist). The
// error names the path.
inline absl::StatusOr<std::unique_ptr<grpc::Server>> ServeOnUnixSocket(
    const std::filesystem::path& path, grpc::Service* service) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + path.string(), grpc::InsecureServerCredentials());
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    return absl::UnavailableError(
        absl::StrCat(path.string(), ": cannot serve gRPC here (see the gRPC log above)"));
  }
  return server;
}

}  // namespace efa::testing
