// The daemon's HTTP endpoints (/metrics, /healthz, /readyz), served by
// libevent's evhttp: GET and HEAD on a fixed set of paths, one request per
// connection (Connection: close). Each server is one thread running its own
// event loop, which serves every connection without blocking on any: a slow
// or stalled client delays no other. Idle, the thread sleeps in epoll_wait
// with no timer armed: no CPU, no wake-ups. (Debian's cpp-httplib, used
// before, is built with OpenSSL, whose static initializer cost the daemon
// 3.4 MiB of RSS: BENCHMARKS.md.)
//
// A client is disconnected after `timeout` without progress, reading its
// request or writing the response; a request whose line and headers pass
// `max_header_bytes` is refused. When the process runs out of file
// descriptors the server stops accepting for 100 ms at a time (the
// connections wait in the kernel's backlog) instead of spinning on
// accept().
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace efa::plugin {

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

// Runs on the server's thread for each GET or HEAD of its path, and should
// be quick: the server serves nothing else meanwhile. Servers sharing a
// handler may run it at once.
using HttpHandler = std::function<HttpResponse()>;

struct HttpServerOptions {
  std::chrono::milliseconds timeout{1000};  // without progress, reading or writing
  size_t max_header_bytes = 8192;           // request line and headers
};

// A listen address split into host and port: "host:port", ":port" (every
// interface), "[v6-address]:port". The host may be a name or an IP literal;
// the port is 0-65535 (0: the kernel picks one). Fails with a message that
// says what was expected, e.g. `expected an address like ":8080" or
// "127.0.0.1:8080", got "8080"`.
absl::StatusOr<std::pair<std::string, uint16_t>> ParseListenAddress(std::string_view address);

struct HttpLoop;  // libevent's state of a server (http_server.cc)

class HttpServer {
 public:
  // Listens on `address` (see ParseListenAddress; every interface is IPv6
  // and IPv4 where the kernel has IPv6, else IPv4) and serves `routes`
  // (exact paths; a query string is ignored) until destroyed. Unknown paths
  // get 404, other methods on a route 405. Fails when the address is
  // malformed or cannot be bound, naming the address: `"127.0.0.1:8080":
  // bind: Address already in use`.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      std::string_view address, std::map<std::string, HttpHandler> routes,
      HttpServerOptions options = {});
  ~HttpServer();  // lets a handler running finish, then closes every connection
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The port bound (useful with port 0). Thread-safe.
  uint16_t port() const { return port_; }

 private:
  HttpServer(std::unique_ptr<HttpLoop> loop, uint16_t port);

  std::unique_ptr<HttpLoop> loop_;
  const uint16_t port_;
  std::thread thread_;
};

// The daemon's endpoints: `routes` (/metrics and the probes) on
// `metrics_address` and `probe_routes` alone on `probe_address`, where no
// client of /metrics can delay them; an empty address serves nothing.
// Logs each listener started ("serving /metrics, /healthz and /readyz on
// :8080 (port 8080)"); fails naming the configuration key of an address
// that cannot be served ("metricsAddress: ...").
absl::StatusOr<std::vector<std::unique_ptr<HttpServer>>> ServeEndpoints(
    const std::string& metrics_address, std::map<std::string, HttpHandler> routes,
    const std::string& probe_address, std::map<std::string, HttpHandler> probe_routes);

}  // namespace efa::plugin
