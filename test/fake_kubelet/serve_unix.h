// Serving one gRPC service on a unix socket, as the kubelet and device
// plugins do; shared by the fake kubelet's sockets and the fake accelerator
// plugin.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
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

// A unix socket listening at `path` that never accepts: to a client, a
// server that is there (connections wait in its backlog). Returns its
// descriptor, -1 on failure.
inline int ListenOnUnixSocket(const std::filesystem::path& path) {
  if (!CheckUnixSocketPath(path).ok()) return -1;
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.native().size());
  if (fd < 0 || ::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(fd, 16) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace efa::testing
