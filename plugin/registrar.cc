#include "plugin/registrar.h"

#include <grpcpp/grpcpp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace efa::plugin {
namespace fs = std::filesystem;

namespace {

constexpr auto kRegisterTimeout = std::chrono::seconds(10);
constexpr auto kMinBackoff = std::chrono::milliseconds(250);
constexpr auto kMaxBackoff = std::chrono::milliseconds(8000);
// The first retry after kubelet.sock was created (RetryLater).
constexpr auto kNewKubeletRetry = std::chrono::milliseconds(2);

// 0 when a unix socket can be bound at `path` (it is removed again), else
// the errno.
int BindError(const fs::path& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.native().size() >= sizeof addr.sun_path) return ENAMETOOLONG;
  std::memcpy(addr.sun_path, path.c_str(), path.native().size());
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  int err = 0;
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    err = errno;
  } else {
    ::unlink(path.c_str());
  }
  ::close(fd);
  return err;
}

bool IsSocket(const fs::path& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

// Whether a server listens on the unix socket at `path`: a connection is
// accepted, or refused only because its backlog is full (EAGAIN, from a
// non-blocking connect). A socket file left by a server that ended refuses
// (ECONNREFUSED), a removed one is absent (ENOENT): no one. Any other
// failure (EMFILE for our own socket, ...) tells nothing and is returned.
absl::StatusOr<bool> Listening(const fs::path& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.native().size() >= sizeof addr.sun_path) return false;
  std::memcpy(addr.sun_path, path.c_str(), path.native().size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot tell whether another device plugin serves ",
                                               path.string(), ": socket: ", std::strerror(errno)));
  }
  const int connected = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
  const int error = connected == 0 ? 0 : errno;
  ::close(fd);
  if (error == 0 || error == EAGAIN || error == EINPROGRESS) return true;
  if (error == ECONNREFUSED || error == ENOENT) return false;
  return absl::UnavailableError(absl::StrCat("cannot tell whether another device plugin serves ",
                                             path.string(), ": connect: ", std::strerror(error)));
}

}  // namespace

Registrar::Registrar(Options options, DevicePluginService* service)
    : options_(std::move(options)), service_(service) {}

Registrar::~Registrar() { StopServer(); }

fs::path Registrar::plugin_socket() const {
  return options_.kubelet_dir / "device-plugins" / kPluginSocket;
}
fs::path Registrar::kubelet_socket() const {
  return options_.kubelet_dir / "device-plugins" / "kubelet.sock";
}
bool Registrar::KubeletSocketPresent() const { return IsSocket(kubelet_socket()); }

void Registrar::RegisterAgainNow(Reason reason) {
  // The backoff spaces the attempts while the kubelet refuses or cannot be
  // reached. A new kubelet (kubelet.sock created, or a lost inotify event
  // that may have been one) and the end of a DRA driver's tenure (no
  // attempt was made meanwhile) are new circumstances: the failures before
  // say nothing about them, so the retries start again from the shortest
  // delay. Our socket deleted and SIGHUP leave the same kubelet as before:
  // the attempt is made now, and should it fail, the retries keep the pace
  // the earlier failures set. A stream ends only while registered, when
  // the backoff is zero anyway.
  bool reset_backoff = false;
  switch (reason) {
    case Reason::kKubeletSocketCreated:
      if (registrations_ > 0) ++kubelet_restarts_;
      spdlog::info(registered_ ? "kubelet.sock was created: the kubelet restarted; "
                                 "registering again"
                               : "kubelet.sock appeared; registering");
      reset_backoff = true;
      new_kubelet_ = true;
      break;
    case Reason::kPluginSocketDeleted:
      spdlog::info("{} was deleted; serving and registering again", kPluginSocket);
      break;
    case Reason::kStreamEnded:
      spdlog::info("the kubelet ended ListAndWatch; registering again");
      break;
    case Reason::kSighup:
      break;  // the caller logs the rescan and the registration together
    case Reason::kEventsLost:
    case Reason::kDraDriverGone:
      reset_backoff = true;  // the caller logged the cause
      break;
  }
  registered_ = false;
  if (reset_backoff) backoff_ = std::chrono::milliseconds(0);
  next_attempt_ = options_.clock->Now();
}

absl::Status Registrar::StartServer() {
  const fs::path socket = plugin_socket();
  std::error_code ec;
  fs::create_directories(socket.parent_path(), ec);
  // Another device plugin serving our socket: the host service of this
  // plugin (a .deb or .rpm) while this one runs in the chart's pod, or the
  // other way round. Replacing its socket would register the resource
  // twice, each registration taking the kubelet from the other; this one
  // stands aside instead and looks again with the registration's backoff,
  // so that it takes over once the other stops (its socket then refuses or
  // is gone).
  const absl::StatusOr<bool> listening = IsSocket(socket) ? Listening(socket) : false;
  if (!listening.ok()) return listening.status();  // decides nothing: retried
  if (*listening) {
    if (!standing_aside_) {
      spdlog::warn(
          "another device plugin serves {} (efa-k8s-device-plugin's host service, or its pod): "
          "standing aside, neither serving nor registering while it runs; this one takes over "
          "when it stops",
          socket.string());
    }
    standing_aside_ = true;
    return absl::AlreadyExistsError(
        absl::StrCat(socket.string(), ": another device plugin serves it"));
  }
  // A stale socket from an earlier run; anything else in the way (a
  // directory, a read-only file system) is the cause to report.
  if (!fs::remove(socket, ec) && ec && ec != std::errc::no_such_file_or_directory) {
    return absl::FailedPreconditionError(absl::StrCat(socket.string(), ": ", ec.message()));
  }
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket.string(), grpc::InsecureServerCredentials());
  builder.RegisterService(service_);
  // Only the (root) kubelet talks to the socket: create it 0600 rather than
  // chmod it after bind, when it would be open to all for a moment. The
  // umask is process-wide, but the daemon's other threads create files only
  // through WriteFileAtomically, which sets their mode with fchmod.
  const mode_t old_umask = ::umask(0177);
  server_ = builder.BuildAndStart();
  ::umask(old_umask);
  if (!server_) {
    // gRPC does not say why; a bind of our own does.
    const int err = BindError(socket);
    return absl::UnavailableError(absl::StrCat(
        socket.string(), ": ", err != 0 ? std::strerror(err) : "gRPC cannot serve there"));
  }
  struct stat st;
  std::string problem;
  if (::lstat(socket.c_str(), &st) != 0) {
    problem = std::strerror(errno);
  } else if (!S_ISSOCK(st.st_mode) || (st.st_mode & 07777) != 0600) {
    problem = absl::StrFormat("mode %04o, not a socket of mode 0600", st.st_mode & 07777);
  }
  if (!problem.empty()) {
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
    server_.reset();
    fs::remove(socket, ec);
    return absl::FailedPreconditionError(absl::StrCat(socket.string(), ": ", problem));
  }
  if (standing_aside_) spdlog::info("the other device plugin left {}", socket.string());
  standing_aside_ = false;
  spdlog::info("serving the device plugin API on {}", socket.string());
  return absl::OkStatus();
}

void Registrar::StopServer() {
  if (!server_) return;
  service_->Shutdown();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server_->Wait();
  server_.reset();
  std::error_code ec;
  fs::remove(plugin_socket(), ec);
}

void Registrar::Register() {
  if (!server_ || !IsSocket(plugin_socket())) {
    // Our socket was deleted (by someone: the kubelet keeps its directory),
    // or serving failed before: serve afresh.
    if (server_) {
      spdlog::info("{} is gone; serving again", plugin_socket().string());
      server_->Shutdown(std::chrono::system_clock::now());
      server_->Wait();
      server_.reset();
    }
    if (absl::Status served = StartServer(); !served.ok()) {
      // Standing aside was logged once, not at every look.
      RetryLater(absl::IsAlreadyExists(served)
                     ? ""
                     : absl::StrCat("cannot serve the device plugin API: ", served.message()));
      return;
    }
  }
  auto channel =
      grpc::CreateChannel("unix:" + kubelet_socket().string(), grpc::InsecureChannelCredentials());
  auto stub = v1beta1::Registration::NewStub(channel);
  v1beta1::RegisterRequest request;
  request.set_version(kApiVersion);
  request.set_endpoint(kPluginSocket);
  request.set_resource_name(options_.resource_name);
  *request.mutable_options() = service_->PluginOptions();
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kRegisterTimeout);
  v1beta1::Empty reply;
  grpc::Status status = stub->Register(&context, request, &reply);
  if (status.ok()) {
    registered_ = true;
    backoff_ = std::chrono::milliseconds(0);
    new_kubelet_ = false;
    ++registrations_;
    spdlog::info("registered {} with the kubelet at {}", options_.resource_name,
                 kubelet_socket().string());
    return;
  }
  RetryLater(absl::StrCat("registration with ", kubelet_socket().string(),
                          " failed: ", status.error_message()));
}

void Registrar::RetryLater(std::string_view why) {
  // inotify reports kubelet.sock at its bind(), and the kubelet listen()s
  // just after: a connection in between is refused. Measured on a
  // rebooting node, where the kubelet admits pods milliseconds later, so
  // the retries after a new kubelet.sock start at 2 ms (logged at debug),
  // doubling to the usual pace.
  const bool quick = new_kubelet_ && backoff_ * 2 < kMinBackoff;
  backoff_ = std::clamp(backoff_ * 2, new_kubelet_ ? kNewKubeletRetry : kMinBackoff, kMaxBackoff);
  if (backoff_ >= kMinBackoff) new_kubelet_ = false;
  next_attempt_ = options_.clock->Now() + backoff_;
  if (!why.empty()) {
    spdlog::log(quick ? spdlog::level::debug : spdlog::level::warn, "{}; retrying in {} ms", why,
                backoff_.count());
  }
}

}  // namespace efa::plugin
