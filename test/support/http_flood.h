// What a hostile neighbour does to an HTTP port, and a client that can
// still measure a probe meanwhile: for the flood tests and the benchmarks.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace efa::testing {

// Connections to a loopback port held open by a flood: half idle (never a
// byte), half slow (a request head that never ends, one byte every
// `interval`). Every `interval` each slot the server closed is opened
// again, so the flood keeps pressing without spinning on connect(). Runs
// on a thread of its own until destroyed. Each slot is a descriptor of
// this process: raise RLIMIT_NOFILE first (RaiseFileLimit).
class ConnectionFlood {
 public:
  ConnectionFlood(uint16_t port, size_t count,
                  std::chrono::milliseconds interval = std::chrono::milliseconds(900))
      : port_(port), interval_(interval), conns_(count) {
    for (size_t i = 0; i < count; ++i) conns_[i].slow = i % 2 == 1;
    thread_ = std::thread([this] { Run(); });
  }
  ~ConnectionFlood() {
    stop_ = true;
    thread_.join();
    for (Conn& c : conns_) Close(c);
  }
  ConnectionFlood(const ConnectionFlood&) = delete;
  ConnectionFlood& operator=(const ConnectionFlood&) = delete;

  // The most connections established at once so far (as the client sees
  // them: the kernel completes a connection before the server accepts it).
  size_t max_open() const { return max_open_.load(); }
  // Connections established so far, and those of them the server closed.
  size_t connected() const { return connected_.load(); }
  size_t closed_by_server() const { return closed_by_server_.load(); }

 private:
  using SteadyClock = std::chrono::steady_clock;
  struct Conn {
    int fd = -1;
    bool slow = false;
    bool open = false;  // connected
    size_t sent = 0;
    SteadyClock::time_point next;  // the next byte, or the next attempt
  };

  void Open(Conn& c, SteadyClock::time_point now) {
    const bool slow = c.slow;
    c = Conn{};
    c.slow = slow;
    c.next = now + interval_;
    c.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c.fd < 0) return;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port_);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(c.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 &&
        errno != EINPROGRESS) {
      Close(c);
    }
  }
  static void Close(Conn& c) {
    if (c.fd >= 0) ::close(c.fd);
    c.fd = -1;
    c.open = false;
  }
  void SendByte(Conn& c, SteadyClock::time_point now) {
    static const std::string head = "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    const char byte = c.sent < head.size() ? head[c.sent] : 'a';
    if (::send(c.fd, &byte, 1, MSG_NOSIGNAL) == 1) {
      ++c.sent;
    } else if (errno != EAGAIN) {
      Close(c);
    }
    c.next = now + interval_;
  }

  void Run() {
    std::vector<pollfd> fds(conns_.size());
    for (auto start = SteadyClock::now(); Conn & c : conns_) Open(c, start);
    while (!stop_) {
      for (size_t i = 0; i < conns_.size(); ++i) {
        fds[i] = {conns_[i].fd, static_cast<short>(conns_[i].open ? POLLIN : POLLOUT), 0};
      }
      ::poll(fds.data(), fds.size(), 50);
      size_t open = 0;
      const auto now = SteadyClock::now();
      for (size_t i = 0; i < conns_.size(); ++i) {
        Conn& c = conns_[i];
        if (c.fd < 0) {
          if (now >= c.next) Open(c, now);
          continue;
        }
        if (!c.open && fds[i].revents != 0) {
          int err = 0;
          socklen_t len = sizeof err;
          ::getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
          if (err != 0) {
            Close(c);
            continue;
          }
          c.open = true;
          ++connected_;
          if (c.slow) SendByte(c, now);
        } else if (c.open && fds[i].revents != 0) {
          // The server answered (an error) or closed: again at the next tick.
          Close(c);
          ++closed_by_server_;
          continue;
        }
        if (c.open && c.slow && now >= c.next) SendByte(c, now);
        if (c.open) ++open;
      }
      if (open > max_open_) max_open_ = open;
    }
  }

  const uint16_t port_;
  const std::chrono::milliseconds interval_;
  std::vector<Conn> conns_;  // the flood's thread only
  std::atomic<bool> stop_{false};
  std::atomic<size_t> max_open_{0}, connected_{0}, closed_by_server_{0};
  std::thread thread_;
};

// Raises this process's soft RLIMIT_NOFILE to at least `want` (within the
// hard limit); returns the soft limit now.
inline rlim_t RaiseFileLimit(rlim_t want) {
  rlimit r{};
  ::getrlimit(RLIMIT_NOFILE, &r);
  if (r.rlim_cur < want) {
    r.rlim_cur = std::min(want, r.rlim_max);
    ::setrlimit(RLIMIT_NOFILE, &r);
    ::getrlimit(RLIMIT_NOFILE, &r);
  }
  return r.rlim_cur;
}

struct ProbeResult {
  int status = 0;  // 0: no answer within the timeout
  std::string body;
  double seconds = 0;  // from connect() to the end of the answer
};

// GET `path` on a loopback port with a deadline for the whole exchange,
// as the kubelet's prober does, from `source` (any of 127.0.0.0/8; empty:
// the kernel's choice). On any descriptor number (cpp-httplib's client
// waits with select(), which cannot watch one past 1023).
inline ProbeResult ProbeOnce(uint16_t port, const std::string& path,
                             std::chrono::milliseconds timeout, const std::string& source = "") {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  ProbeResult result;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return result;
  auto wait = [&](short events) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{fd, events, 0};
    return left.count() > 0 && ::poll(&p, 1, static_cast<int>(left.count())) == 1;
  };
  if (!source.empty()) {
    sockaddr_in from{};
    from.sin_family = AF_INET;
    if (::inet_pton(AF_INET, source.c_str(), &from.sin_addr) != 1 ||
        ::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0) {
      ::close(fd);
      return result;
    }
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  int err = 0;
  socklen_t len = sizeof err;
  const std::string request = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  if ((::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 ||
       (errno == EINPROGRESS && wait(POLLOUT))) &&
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0 &&
      ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(request.size())) {
    char buf[4096];
    while (wait(POLLIN)) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      reply.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // "HTTP/1.1 200 OK\r\n...\r\n\r\nbody", complete only when the server
  // closed the connection (it answers one request per connection).
  const size_t body = reply.find("\r\n\r\n");
  if (reply.rfind("HTTP/1.1 ", 0) == 0 && body != std::string::npos &&
      std::chrono::steady_clock::now() < deadline) {
    result.status = std::atoi(reply.c_str() + 9);
    result.body = reply.substr(body + 4);
  }
  return result;
}

// Asks `paths` on a loopback `port` every 100 ms on a thread of its own,
// as the kubelet's prober does (1 s timeout), from `source` (ProbeOnce),
// until stopped. A probe
// fails when it gets no answer within the timeout, or, on the paths of
// `must_pass`, an answer other than 200 (a readiness probe may rightly
// answer 503 for a moment, while the daemon registers again).
class Prober {
 public:
  Prober(uint16_t port, std::vector<std::string> paths, std::vector<std::string> must_pass,
         std::string source = "")
      : thread_([this, port, paths = std::move(paths), must_pass = std::move(must_pass),
                 source = std::move(source)] {
          for (auto next = std::chrono::steady_clock::now(); !stop_;
               next += std::chrono::milliseconds(100)) {
            // The prober's schedule, not a wait for an event.
            std::this_thread::sleep_until(next);
            for (const std::string& path : paths) {
              const ProbeResult result = ProbeOnce(port, path, std::chrono::seconds(1), source);
              seconds_.push_back(result.seconds);
              const bool pass =
                  std::find(must_pass.begin(), must_pass.end(), path) != must_pass.end();
              if (result.status == 0 || (pass && result.status != 200)) {
                failures_.push_back(path + ": status " + std::to_string(result.status) + " after " +
                                    std::to_string(result.seconds) + " s: " + result.body);
              }
            }
          }
        }) {}
  ~Prober() { Stop(); }
  Prober(const Prober&) = delete;
  Prober& operator=(const Prober&) = delete;

  // Stops asking; then failures() and seconds() hold every probe's.
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // The probes that failed, in words (after Stop).
  const std::vector<std::string>& failures() const { return failures_; }
  // Each probe's time, answered or not (after Stop).
  const std::vector<double>& seconds() const { return seconds_; }

 private:
  std::atomic<bool> stop_{false};
  std::vector<double> seconds_;        // the thread's until Stop
  std::vector<std::string> failures_;  // the thread's until Stop
  std::thread thread_;
};

}  // namespace efa::testing
