// The daemon's HTTP endpoints (/metrics, /healthz, /readyz), served by
// libevent's evhttp: GET and HEAD on a fixed set of paths, one request per
// connection (Connection: close). Each server is one thread running its own
// event loop, which serves every connection without blocking on any: a slow
// or stalled client delays no other. Idle, the thread sleeps in epoll_wait
// with no timer armed: no CPU, no wake-ups. (Debian's cpp-httplib, used
// before, is built with OpenSSL, whose static initializer cost the daemon
// 3.4 MiB of RSS: BENCHMARKS.md.)
//
// What a client can make a server hold is bounded: at most
// `max_connections` connections at once, and `max_connections_per_client`
// from one address (one more is accepted and closed at once, so that the
// kernel's backlog never fills with a flood and a client that comes later
// is told at once); each is closed
// `request_timeout` after it was accepted, answered or not, however slowly
// its bytes trickle in (evhttp's own timeouts start again at every byte);
// a request whose line and headers pass `max_header_bytes` is refused,
// and one with a body too. When the process runs out of file descriptors
// the server stops accepting for 100 ms at a time (the connections wait in
// the kernel's backlog) instead of spinning on accept().
#pragma once

#include <prometheus/metric_family.h>

#include <atomic>
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

// The connections a server closed without an answer, for /metrics.
// Thread-safe.
struct HttpCounters {
  std::atomic<uint64_t> over_limit{0};  // accepted while max_connections were open
  std::atomic<uint64_t> timed_out{0};   // not answered within request_timeout
  // accept() failed for want of descriptors or memory: 100 ms without
  // accepting, each counted.
  std::atomic<uint64_t> accept_pauses{0};
};

struct HttpServerOptions {
  std::chrono::milliseconds request_timeout{3000};  // from accept to the answer sent
  size_t max_header_bytes = 8192;                   // request line and headers
  int max_connections = 64;                         // held at once, at least 1
  // Held at once by one client address (1..max_connections; 0: no bound
  // of its own), so that one neighbour cannot take every place.
  int max_connections_per_client = 0;
  HttpCounters* counters = nullptr;  // counted there when set; must outlive the server
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

// What the daemon's two listeners may hold (the options
// metricsMaxConnections, probeMaxConnections and httpRequestTimeout).
// Every connection is a file descriptor: the caller keeps the sum of the
// two caps within what the process can spare for HTTP, so that a flood
// never takes the descriptors the daemon's own work needs.
struct EndpointLimits {
  int metrics_connections = HttpServerOptions{}.max_connections;
  int probe_connections = 16;
  std::chrono::milliseconds request_timeout = HttpServerOptions{}.request_timeout;
};

// The counters of the two listeners. Thread-safe.
struct EndpointCounters {
  HttpCounters metrics;
  HttpCounters probe;
};

// The families http_connections_dropped and http_accept_pauses of
// `counters` appended to `out`.
void CollectEndpointCounters(const EndpointCounters& counters,
                             std::vector<prometheus::MetricFamily>& out);

// The daemon's endpoints: `routes` (/metrics and the probes) on
// `metrics_address` and `probe_routes` alone on `probe_address`, where no
// client of /metrics can delay them (each listener has its own thread,
// event loop and connection cap); an empty address serves nothing. One
// client address holds at most half of a listener's connections: a single
// neighbour flooding the probe port leaves places for the kubelet, whose
// probes come from the node's address.
// `counters`, when set, must outlive the servers. Logs each listener
// started ("serving /metrics, /healthz and /readyz on :8080 (port 8080, at
// most 64 connections)"); fails naming the configuration key of an address
// that cannot be served ("metricsAddress: ...").
absl::StatusOr<std::vector<std::unique_ptr<HttpServer>>> ServeEndpoints(
    const std::string& metrics_address, std::map<std::string, HttpHandler> routes,
    const std::string& probe_address, std::map<std::string, HttpHandler> probe_routes,
    const EndpointLimits& limits = {}, EndpointCounters* counters = nullptr);

}  // namespace efa::plugin
