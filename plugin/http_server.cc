#include "plugin/http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace efa::plugin {
namespace {

using Clock = std::chrono::steady_clock;

absl::Status AddressError(std::string_view address, std::string_view op, int err) {
  return absl::UnavailableError(
      absl::StrCat("\"", std::string(address), "\": ", std::string(op), ": ", std::strerror(err)));
}

std::string_view Reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 431:
      return "Request Header Fields Too Large";
    case 503:
      return "Service Unavailable";
    default:
      return status < 500 ? "Client Error" : "Server Error";
  }
}

bool IsHostChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '-' || c == '_';
}

// A listening socket for host:port; for an empty host every interface, IPv6
// and IPv4 where the kernel has IPv6, else IPv4 only.
absl::StatusOr<int> Listen(std::string_view address, const std::string& host, uint16_t port) {
  std::vector<sockaddr_storage> candidates;
  if (host.empty()) {
    sockaddr_storage ss{};
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
    v6->sin6_family = AF_INET6;
    v6->sin6_addr = in6addr_any;
    v6->sin6_port = htons(port);
    candidates.push_back(ss);
    ss = {};
    auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
    v4->sin_family = AF_INET;
    v4->sin_addr.s_addr = htonl(INADDR_ANY);
    v4->sin_port = htons(port);
    candidates.push_back(ss);
  } else {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* result = nullptr;
    const std::string service = std::to_string(port);
    int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &result);
    if (rc != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", std::string(address), "\": ", ::gai_strerror(rc)));
    }
    for (addrinfo* a = result; a != nullptr; a = a->ai_next) {
      sockaddr_storage ss{};
      std::memcpy(&ss, a->ai_addr, std::min<size_t>(a->ai_addrlen, sizeof ss));
      candidates.push_back(ss);
    }
    ::freeaddrinfo(result);
  }
  int last_errno = EADDRNOTAVAIL;
  std::string_view last_op = "bind";
  for (const sockaddr_storage& ss : candidates) {
    const socklen_t len = ss.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
    int fd = ::socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last_errno = errno;
      last_op = "socket";
      continue;
    }
    int one = 1, zero = 0;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ss.ss_family == AF_INET6 && host.empty()) {
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    }
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&ss), len) != 0) {
      last_errno = errno;
      last_op = "bind";
      ::close(fd);
      // Address in use will not get better on another family.
      if (last_errno == EADDRINUSE || last_errno == EACCES) break;
      continue;
    }
    if (::listen(fd, 64) != 0) {
      last_errno = errno;
      last_op = "listen";
      ::close(fd);
      continue;
    }
    return fd;
  }
  return AddressError(address, last_op, last_errno);
}

uint16_t BoundPort(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return 0;
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
}

}  // namespace

absl::StatusOr<std::pair<std::string, uint16_t>> ParseListenAddress(std::string_view address) {
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("expected an address like \":8080\" or \"127.0.0.1:8080\", got \"",
                     std::string(address), "\""));
  };
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos) return bad();
  std::string_view host = address.substr(0, colon);
  const std::string_view port_text = address.substr(colon + 1);
  if (port_text.empty() || port_text.size() > 5) return bad();
  uint32_t port = 0;
  for (char c : port_text) {
    if (c < '0' || c > '9') return bad();
    port = port * 10 + static_cast<uint32_t>(c - '0');
  }
  if (port > 65535) return bad();
  if (!host.empty() && host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return bad();
    host = host.substr(1, host.size() - 2);
    for (char c : host) {
      if (!(IsHostChar(c) || c == ':' || c == '%')) return bad();
    }
  } else {
    for (char c : host) {
      if (!IsHostChar(c)) return bad();
    }
  }
  return std::make_pair(std::string(host), static_cast<uint16_t>(port));
}

struct HttpServer::Connection {
  int fd = -1;
  Clock::time_point deadline;
  std::string in;
  std::string out;
  size_t sent = 0;
  enum class State { kReading, kWriting, kDraining } state = State::kReading;
  ~Connection() {
    if (fd >= 0) ::close(fd);
  }
};

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    std::string_view address, std::map<std::string, HttpHandler> routes,
    HttpServerOptions options) {
  auto parsed = ParseListenAddress(address);
  if (!parsed.ok()) return parsed.status();
  auto fd = Listen(address, parsed->first, parsed->second);
  if (!fd.ok()) return fd.status();
  int wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    int err = errno;
    ::close(*fd);
    return AddressError(address, "eventfd", err);
  }
  std::unique_ptr<HttpServer> server(
      new HttpServer(*fd, BoundPort(*fd), std::move(routes), options));
  server->wake_fd_ = wake;
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

HttpServer::HttpServer(int listen_fd, uint16_t port, std::map<std::string, HttpHandler> routes,
                       HttpServerOptions options)
    : listen_fd_(listen_fd), port_(port), routes_(std::move(routes)), options_(options) {}

HttpServer::~HttpServer() {
  if (thread_.joinable()) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof one);
    thread_.join();
  }
  connections_.clear();
  ::close(listen_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void HttpServer::Loop() {
  while (true) {
    // Out of file descriptors, the listening socket stays readable: stop
    // polling it for a moment instead of spinning.
    const bool accepting = Clock::now() >= accept_paused_until_;
    std::vector<pollfd> pfds = {{wake_fd_, POLLIN, 0}, {accepting ? listen_fd_ : -1, POLLIN, 0}};
    auto deadline = accepting ? Clock::time_point::max() : accept_paused_until_;
    for (const auto& [fd, c] : connections_) {
      pfds.push_back(
          {fd, static_cast<short>(c->state == Connection::State::kWriting ? POLLOUT : POLLIN), 0});
      deadline = std::min(deadline, c->deadline);
    }
    int timeout = -1;
    if (deadline != Clock::time_point::max()) {
      auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      timeout = static_cast<int>(std::clamp<int64_t>(wait.count() + 1, 0, 60000));
    }
    int n = ::poll(pfds.data(), pfds.size(), timeout);
    if (n < 0 && errno != EINTR) return;
    if (pfds[0].revents & POLLIN) return;  // the destructor asks to stop
    if (pfds[1].revents & POLLIN) Accept();
    for (size_t i = 2; i < pfds.size(); ++i) {
      if (pfds[i].revents == 0) continue;
      auto it = connections_.find(pfds[i].fd);
      if (it == connections_.end()) continue;
      Connection& c = *it->second;
      bool keep;
      if (pfds[i].revents & (POLLERR | POLLNVAL)) {
        keep = false;
      } else if (c.state == Connection::State::kWriting) {
        keep = OnWritable(c);
      } else {
        keep = OnReadable(c);  // POLLHUP reads the end of the stream
      }
      if (!keep) connections_.erase(it);
    }
    const auto now = Clock::now();
    for (auto it = connections_.begin(); it != connections_.end();) {
      it = it->second->deadline <= now ? connections_.erase(it) : std::next(it);
    }
  }
}

void HttpServer::Accept() {
  while (true) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        accept_paused_until_ = Clock::now() + std::chrono::milliseconds(100);
      }
      return;  // EAGAIN, or a connection that failed before it was accepted
    }
    if (connections_.size() >= options_.max_connections) {
      ::close(fd);
      continue;
    }
    auto c = std::make_unique<Connection>();
    c->fd = fd;
    c->deadline = Clock::now() + options_.timeout;
    connections_[fd] = std::move(c);
  }
}

bool HttpServer::OnReadable(Connection& c) {
  char buf[4096];
  while (true) {
    ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
    if (n == 0) return false;  // closed before a whole request
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    if (c.state == Connection::State::kDraining) continue;
    c.in.append(buf, static_cast<size_t>(n));
    if (c.in.find("\r\n\r\n") != std::string::npos || c.in.size() > options_.max_request_bytes) {
      Respond(c);
      return OnWritable(c);
    }
  }
}

bool HttpServer::OnWritable(Connection& c) {
  while (c.sent < c.out.size()) {
    ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    c.sent += static_cast<size_t>(n);
  }
  // Closing with unread input would send a reset that can destroy the
  // response in flight: end our side, then read until the client closes
  // (or briefly, at most).
  ::shutdown(c.fd, SHUT_WR);
  c.state = Connection::State::kDraining;
  c.deadline = std::min(c.deadline, Clock::now() + std::chrono::seconds(1));
  return true;
}

void HttpServer::Respond(Connection& c) {
  c.state = Connection::State::kWriting;
  HttpResponse response;
  std::string allow;
  bool head = false;
  const size_t end = c.in.find("\r\n\r\n");
  if (end == std::string::npos || end + 4 > options_.max_request_bytes) {
    response = {431, "text/plain; charset=utf-8", "request head too large\n"};
  } else {
    const std::string_view head_text(c.in.data(), end);
    const std::string_view line = head_text.substr(0, head_text.find("\r\n"));
    const size_t sp1 = line.find(' ');
    const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
    if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos ||
        line.substr(sp2 + 1).rfind("HTTP/1.", 0) != 0) {
      response = {400, "text/plain; charset=utf-8", "malformed request line\n"};
    } else {
      const std::string_view method = line.substr(0, sp1);
      std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
      target = target.substr(0, target.find('?'));
      auto route = routes_.find(std::string(target));
      if (route == routes_.end()) {
        response = {404, "text/plain; charset=utf-8", "not found\n"};
      } else if (method != "GET" && method != "HEAD") {
        response = {405, "text/plain; charset=utf-8", "only GET and HEAD\n"};
        allow = "Allow: GET, HEAD\r\n";
      } else {
        head = method == "HEAD";
        response = route->second();
      }
    }
  }
  c.out = absl::StrCat("HTTP/1.1 ", response.status, " ", std::string(Reason(response.status)),
                       "\r\nContent-Type: ", response.content_type,
                       "\r\nContent-Length: ", response.body.size(), "\r\n", allow,
                       "Connection: close\r\n\r\n");
  if (!head) c.out += response.body;
}

}  // namespace efa::plugin
