// A minimal HTTP/1.1 server for /metrics, /healthz and /readyz: GET and
// HEAD on a fixed set of paths, one request per connection (Connection:
// close), served by one poll() thread of its own. Requests are bounded in
// size and time, so a slow or hostile client cannot hold the thread or grow
// memory: a request head larger than `max_request_bytes` is answered 431, a
// connection that has not finished within `timeout` is closed, and beyond
// `max_connections` new connections are closed at once.
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

namespace efa::plugin {

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

// Runs on the server thread for each GET or HEAD of its path.
using HttpHandler = std::function<HttpResponse()>;

struct HttpServerOptions {
  size_t max_request_bytes = 8192;          // request line and headers
  std::chrono::milliseconds timeout{5000};  // per connection, accept to last byte
  size_t max_connections = 16;              // open at once
};

// A listen address split into host and port: "host:port", ":port" (every
// interface), "[v6-address]:port". The host may be a name or an IP literal;
// the port is 0-65535 (0: the kernel picks one). Fails with a message that
// says what was expected, e.g. `expected an address like ":8080" or
// "127.0.0.1:8080", got "8080"`.
absl::StatusOr<std::pair<std::string, uint16_t>> ParseListenAddress(std::string_view address);

class HttpServer {
 public:
  // Listens on `address` (see ParseListenAddress) and serves `routes`
  // (exact paths; a query string is ignored) until destroyed. Unknown paths
  // get 404, other methods 405. Fails when the address is malformed or
  // cannot be bound, naming the address: `"127.0.0.1:8080": bind: Address
  // already in use`.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      std::string_view address, std::map<std::string, HttpHandler> routes,
      HttpServerOptions options = {});
  ~HttpServer();  // stops the thread and closes every socket
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The port bound (useful with port 0). Thread-safe.
  uint16_t port() const { return port_; }

 private:
  struct Connection;
  HttpServer(int listen_fd, uint16_t port, std::map<std::string, HttpHandler> routes,
             HttpServerOptions options);
  void Loop();
  void Accept();
  // Returns false when the connection is finished (to be closed).
  bool OnReadable(Connection& c);
  bool OnWritable(Connection& c);
  void Respond(Connection& c);

  const int listen_fd_;
  const uint16_t port_;
  const std::map<std::string, HttpHandler> routes_;
  const HttpServerOptions options_;
  int wake_fd_ = -1;
  // Server thread only.
  std::map<int, std::unique_ptr<Connection>> connections_;
  std::chrono::steady_clock::time_point accept_paused_until_;
  std::thread thread_;
};

}  // namespace efa::plugin
