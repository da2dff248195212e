// The daemon's HTTP endpoints (/metrics, /healthz, /readyz), served by
// cpp-httplib: GET and HEAD on a fixed set of paths, one request per
// connection (Connection: close). Each server has an accepting thread that
// blocks in accept() and up to a few worker threads, started as connections
// come (none until the first), that block on a condition variable: idle, it
// takes no CPU and no wake-ups (no timer).
//
// A client gets `first_byte_timeout` to start its request and
// `read_timeout` for each read after that; requests are served by
// `threads` workers with at most `max_queued` accepted connections waiting.
// Beyond that the accepting thread serves the connection itself and accepts
// no more until it is done, so a flood of connections costs a bounded
// number of file descriptors and threads (the rest wait in the kernel's
// backlog). A slow client can still hold a worker for long (cpp-httplib
// bounds each read, not the whole request): serve the probes on a listener
// of their own (DaemonMonitor::ProbeRoutes) so that clients of /metrics
// cannot delay them.
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

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}

namespace efa::plugin {

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

// Runs on a server thread for each GET or HEAD of its path; may run on
// several threads at once.
using HttpHandler = std::function<HttpResponse()>;

struct HttpServerOptions {
  size_t threads = 2;                             // requests served at once
  size_t max_queued = 8;                          // accepted, waiting for a worker
  std::chrono::seconds first_byte_timeout{1};     // connect to the request's first byte
  std::chrono::milliseconds read_timeout{1000};   // each read of the request
  std::chrono::milliseconds write_timeout{1000};  // each write of the response
};

// A listen address split into host and port: "host:port", ":port" (every
// interface), "[v6-address]:port". The host may be a name or an IP literal;
// the port is 0-65535 (0: the kernel picks one). Fails with a message that
// says what was expected, e.g. `expected an address like ":8080" or
// "127.0.0.1:8080", got "8080"`.
absl::StatusOr<std::pair<std::string, uint16_t>> ParseListenAddress(std::string_view address);

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
  ~HttpServer();  // stops accepting, waits for the requests being served
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The port bound (useful with port 0). Thread-safe.
  uint16_t port() const { return port_; }

 private:
  HttpServer(std::unique_ptr<httplib::Server> server, uint16_t port);

  std::unique_ptr<httplib::Server> server_;
  const uint16_t port_;
  std::thread thread_;
};

}  // namespace efa::plugin
