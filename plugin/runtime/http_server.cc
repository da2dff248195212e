#include "plugin/runtime/http_server.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <event2/thread.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plugin/runtime/metrics.h"

namespace efa::plugin {

struct HttpConn;

struct HttpLoop {
  std::string address;
  std::map<std::string, HttpHandler> routes;
  HttpServerOptions options;
  event_base* base = nullptr;
  evhttp* http = nullptr;
  evconnlistener* listener = nullptr;  // evhttp's, over our socket
  event* resume = nullptr;             // re-enables accepting after EMFILE
  event* stop = nullptr;               // activated by ~HttpServer
  bool paused = false;                 // not accepting, out of descriptors
  bool warned = false;                 // of running out of descriptors
  bool warned_limit = false;           // of max_connections reached
  bool warned_client_limit = false;    // of max_connections_per_client reached
  bool warned_timeout = false;         // of a connection timed out
  // Connections with a descriptor; `held` of them adopted and kept (the
  // cap counts those: one client's connections waiting to be closed never
  // take another's place).
  std::set<HttpConn*> conns;
  int held = 0;
  std::map<std::string, int> per_client;  // adopted connections by client address

  ~HttpLoop();
};

// One accepted connection, from evhttp's bufferevent callback until the
// connection's close callback (or the loop's end).
struct HttpConn {
  HttpLoop* loop = nullptr;
  bufferevent* bev = nullptr;          // ours until adopted, then evhttp's
  evhttp_connection* evcon = nullptr;  // set when adopted
  event* timer = nullptr;              // adoption, then the request timeout
  bool held = false;                   // adopted and kept, counted in loop->held
  std::string client;                  // its address, once counted in per_client
};

namespace {

void ForgetConn(HttpConn* conn) {
  if (conn->held) --conn->loop->held;
  if (!conn->client.empty()) {
    auto it = conn->loop->per_client.find(conn->client);
    if (--it->second == 0) conn->loop->per_client.erase(it);
  }
  conn->loop->conns.erase(conn);
  event_free(conn->timer);
  delete conn;
}

}  // namespace

HttpLoop::~HttpLoop() {
  // evhttp_free closes the listener and every connection (each close
  // callback forgets its HttpConn); what is left was never adopted.
  if (http != nullptr) evhttp_free(http);
  while (!conns.empty()) {
    HttpConn* conn = *conns.begin();
    if (conn->evcon == nullptr) bufferevent_decref(conn->bev);
    ForgetConn(conn);
  }
  for (event* e : {resume, stop}) {
    if (e != nullptr) event_free(e);
  }
  if (base != nullptr) event_base_free(base);
}

namespace {

bool IsHostChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '-' || c == '_';
}

void Reply(evhttp_request* req, int status, const char* content_type, const std::string& body) {
  evkeyvalq* headers = evhttp_request_get_output_headers(req);
  evhttp_add_header(headers, "Content-Type", content_type);
  evhttp_add_header(headers, "Content-Length", std::to_string(body.size()).c_str());
  if (evhttp_request_get_command(req) != EVHTTP_REQ_HEAD) {
    evbuffer_add(evhttp_request_get_output_buffer(req), body.data(), body.size());
  }
  evhttp_send_reply(req, status, nullptr, nullptr);  // the standard reason phrase
}

// Routing by exact path, GET and HEAD only; every connection is closed
// after its one request (a kept-alive one would hold a descriptor between
// scrapes for nothing).
void Serve(evhttp_request* req, void* arg) {
  const auto& routes = static_cast<HttpLoop*>(arg)->routes;
  evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
  const evhttp_uri* uri = evhttp_request_get_evhttp_uri(req);
  const char* path = uri != nullptr ? evhttp_uri_get_path(uri) : nullptr;
  auto route = path != nullptr ? routes.find(path) : routes.end();
  if (route == routes.end()) return Reply(req, 404, "text/plain; charset=utf-8", "not found\n");
  const evhttp_cmd_type method = evhttp_request_get_command(req);
  if (method != EVHTTP_REQ_GET && method != EVHTTP_REQ_HEAD) {
    evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "GET, HEAD");
    return Reply(req, 405, "text/plain; charset=utf-8", "method not allowed\n");
  }
  const HttpResponse answer = route->second();
  Reply(req, answer.status, answer.content_type.c_str(), answer.body);
}

// The server whose loop runs on this thread (the listener's callback
// argument is evhttp's own).
thread_local HttpLoop* this_thread_loop = nullptr;

// accept() failed with the descriptors (or memory) exhausted: the
// listening socket stays readable, so a level-triggered loop would spin.
// Stop accepting for 100 ms; the connections wait in the backlog.
void OnAcceptError(evconnlistener* listener, void*) {
  HttpLoop* loop = this_thread_loop;
  const int err = EVUTIL_SOCKET_ERROR();
  if (err != EMFILE && err != ENFILE && err != ENOBUFS && err != ENOMEM) return;
  if (loop->options.counters != nullptr) ++loop->options.counters->accept_pauses;
  if (!loop->warned) {
    loop->warned = true;
    spdlog::warn(
        "\"{}\": accept: {}; not accepting for 100 ms at a time until it passes (counted in "
        "efa_device_plugin_http_accept_pauses_total)",
        loop->address, std::strerror(err));
  }
  loop->paused = true;
  evconnlistener_disable(listener);
  const timeval pause{0, 100'000};
  evtimer_add(loop->resume, &pause);
}

timeval ToTimeval(std::chrono::milliseconds d) {
  return {static_cast<time_t>(d.count() / 1000), static_cast<suseconds_t>(d.count() % 1000 * 1000)};
}

// The close callback of an adopted connection: its descriptor is being
// closed, so it no longer counts against the cap.
void OnConnClose(evhttp_connection*, void* arg) { ForgetConn(static_cast<HttpConn*>(arg)); }

// The connection's timer. The first run (activated by OnNewConnection,
// before the loop polls again, so before any byte of the connection is
// read) adopts the connection: evhttp has made it by now, and the
// bufferevent's callback argument is it (evhttp passes its connection to
// its own bufferevent callbacks; libevent 2.1 has no other way to reach a
// server connection before its request is complete). The next run is the
// request timeout, counted from accept, which no byte from the client
// starts again.
void OnConnTimer(evutil_socket_t, short, void* arg) {
  auto* conn = static_cast<HttpConn*>(arg);
  HttpLoop* loop = conn->loop;
  if (conn->evcon == nullptr) {
    void* evcon = nullptr;
    bufferevent_getcb(conn->bev, nullptr, nullptr, nullptr, &evcon);
    bufferevent_decref(conn->bev);  // our hold, against evhttp freeing it on a failure
    // Accepting stopped past the cap (OnNewConnection) resumes once the
    // connections accepted with this one are adopted or closed, which is
    // before the loop polls again.
    if (!loop->paused) evconnlistener_enable(loop->listener);
    if (evcon == nullptr) {  // evhttp failed to make it (and freed or never set up the bufferevent)
      ForgetConn(conn);
      return;
    }
    conn->evcon = static_cast<evhttp_connection*>(evcon);
    evhttp_connection_set_closecb(conn->evcon, OnConnClose, conn);
    char* client = nullptr;
    ev_uint16_t client_port = 0;
    evhttp_connection_get_peer(conn->evcon, &client, &client_port);
    const int per_client = loop->options.max_connections_per_client;
    const auto of_client =
        client != nullptr ? loop->per_client.find(client) : loop->per_client.end();
    const bool client_full =
        per_client > 0 && of_client != loop->per_client.end() && of_client->second >= per_client;
    const bool over_limit = loop->held >= loop->options.max_connections;
    if (!over_limit && !client_full) {
      conn->held = true;
      ++loop->held;
      if (client != nullptr) {
        conn->client = client;
        ++loop->per_client[client];
      }
      const timeval timeout = ToTimeval(loop->options.request_timeout);
      evtimer_add(conn->timer, &timeout);
      return;
    }
    // Past a cap: closed before anything is read.
    if (loop->options.counters != nullptr) ++loop->options.counters->over_limit;
    if (over_limit && !loop->warned_limit) {
      loop->warned_limit = true;
      spdlog::warn(
          "\"{}\": {} connections open, as many as allowed: closing new ones at once while it "
          "lasts (counted in efa_device_plugin_http_connections_dropped_total)",
          loop->address, loop->options.max_connections);
    } else if (!over_limit && !loop->warned_client_limit) {
      loop->warned_client_limit = true;
      spdlog::warn(
          "\"{}\": {} holds {} connections, as many as one client may: closing its new ones at "
          "once while it lasts (counted in efa_device_plugin_http_connections_dropped_total)",
          loop->address, client, per_client);
    }
    evhttp_connection_free(conn->evcon);  // forgets conn
    return;
  }
  if (loop->options.counters != nullptr) ++loop->options.counters->timed_out;
  if (!loop->warned_timeout) {
    loop->warned_timeout = true;
    spdlog::warn(
        "\"{}\": a client not answered within {} ms of connecting was disconnected; others are "
        "counted in efa_device_plugin_http_connections_dropped_total",
        loop->address, loop->options.request_timeout.count());
  }
  evhttp_connection_free(conn->evcon);  // forgets conn
}

// evhttp's bufferevent callback: runs for every accepted connection,
// before evhttp makes its connection object around the bufferevent.
bufferevent* OnNewConnection(event_base* base, void* arg) {
  auto* loop = static_cast<HttpLoop*>(arg);
  bufferevent* bev = bufferevent_socket_new(base, -1, 0);  // evhttp closes the socket itself
  if (bev == nullptr) return nullptr;                      // evhttp makes its own
  auto* conn = new HttpConn;
  conn->loop = loop;
  conn->bev = bev;
  conn->timer = evtimer_new(base, OnConnTimer, conn);
  if (conn->timer == nullptr) {
    delete conn;
    return bev;
  }
  bufferevent_incref(bev);
  loop->conns.insert(conn);
  if (static_cast<int>(loop->conns.size()) > loop->options.max_connections) {
    // Ends evconnlistener's accept loop after this one, so that what is
    // open stays within one of the cap: past it, each connection is closed
    // before the next is accepted.
    evconnlistener_disable(loop->listener);
  }
  event_active(conn->timer, EV_TIMEOUT, 1);
  return bev;
}

// A listening socket (non-blocking, close-on-exec, SO_REUSEADDR; IPv6 with
// IPv4 mapped) on the first address `host` resolves to that can be bound.
// Returns the descriptor, or the message of the last failure.
absl::StatusOr<int> Listen(const std::string& address, const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  std::vector<std::string> hosts =
      host.empty() ? std::vector<std::string>{"::", "0.0.0.0"} : std::vector<std::string>{host};
  const std::string service = std::to_string(port);
  std::string failure = "cannot listen";
  for (const std::string& h : hosts) {
    addrinfo* found = nullptr;
    if (int rc = ::getaddrinfo(h.c_str(), service.c_str(), &hints, &found); rc != 0) {
      failure = absl::StrCat("resolve: ", ::gai_strerror(rc));
      continue;
    }
    for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
      const int fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) {
        failure = absl::StrCat("socket: ", std::strerror(errno));
        continue;
      }
      int one = 1, zero = 0;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (ai->ai_family == AF_INET6)
        ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) {
        ::freeaddrinfo(found);
        return fd;
      }
      const int err = errno;
      ::close(fd);
      failure = absl::StrCat("bind: ", std::strerror(err));
      if (err == EADDRINUSE || err == EACCES) {
        ::freeaddrinfo(found);
        return absl::UnavailableError(absl::StrCat("\"", address, "\": ", failure));
      }
    }
    ::freeaddrinfo(found);
  }
  return absl::UnavailableError(absl::StrCat("\"", address, "\": ", failure));
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

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    std::string_view address, std::map<std::string, HttpHandler> routes,
    HttpServerOptions options) {
  if (options.max_connections < 1 || options.request_timeout.count() < 1 ||
      options.max_connections_per_client < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", std::string(address), "\": expected at least 1 connection and 1 ms, got ",
        options.max_connections, " and ", options.request_timeout.count(), " ms"));
  }
  auto parsed = ParseListenAddress(address);
  if (!parsed.ok()) return parsed.status();
  auto [host, port] = *std::move(parsed);
  auto fd = Listen(std::string(address), host, port);
  if (!fd.ok()) return fd.status();

  // The destructor stops the loop from another thread.
  static std::once_flag threads;
  std::call_once(threads, [] { evthread_use_pthreads(); });
  auto loop = std::make_unique<HttpLoop>();
  loop->address = std::string(address);
  loop->routes = std::move(routes);
  loop->options = options;
  loop->base = event_base_new();
  loop->http = loop->base != nullptr ? evhttp_new(loop->base) : nullptr;
  evhttp_bound_socket* bound =
      loop->http != nullptr ? evhttp_accept_socket_with_handle(loop->http, *fd) : nullptr;
  if (bound == nullptr) {
    ::close(*fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("\"", std::string(address), "\": cannot start the HTTP server"));
  }
  loop->listener = evhttp_bound_socket_get_listener(bound);
  loop->resume = evtimer_new(
      loop->base,
      [](evutil_socket_t, short, void* l) {
        auto* paused = static_cast<HttpLoop*>(l);
        paused->paused = false;
        evconnlistener_enable(paused->listener);
      },
      loop.get());
  loop->stop = event_new(
      loop->base, -1, 0,
      [](evutil_socket_t, short, void* b) { event_base_loopbreak(static_cast<event_base*>(b)); },
      loop->base);
  evconnlistener_set_error_cb(loop->listener, OnAcceptError);
  // Every method reaches Serve, which answers 405 itself with an Allow
  // header (evhttp's own 405 has none).
  evhttp_set_allowed_methods(loop->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD |
                                             EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE |
                                             EVHTTP_REQ_OPTIONS | EVHTTP_REQ_TRACE |
                                             EVHTTP_REQ_CONNECT | EVHTTP_REQ_PATCH);
  evhttp_set_gencb(loop->http, Serve, loop.get());
  // No evhttp timeout: the connection's own timer (OnConnTimer) is the
  // bound, from accept, and evhttp's would start again at every byte.
  evhttp_set_bevcb(loop->http, OnNewConnection, loop.get());
  evhttp_set_max_headers_size(loop->http, static_cast<ev_ssize_t>(options.max_header_bytes));
  evhttp_set_max_body_size(loop->http, 0);

  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  ::getsockname(*fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const uint16_t bound_port =
      ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                       : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(loop), bound_port));
}

HttpServer::HttpServer(std::unique_ptr<HttpLoop> loop, uint16_t port)
    : loop_(std::move(loop)), port_(port) {
  thread_ = std::thread([loop = loop_.get()] {
    // Named for the per-thread figures (scripts/bench.sh).
    ::pthread_setname_np(::pthread_self(), "efa-http");
    this_thread_loop = loop;
    event_base_loop(loop->base, EVLOOP_NO_EXIT_ON_EMPTY);
  });
}

HttpServer::~HttpServer() {
  // An activated event, unlike event_base_loopbreak, is not lost when the
  // loop has not begun yet.
  event_active(loop_->stop, 0, 0);
  thread_.join();
}

absl::StatusOr<std::vector<std::unique_ptr<HttpServer>>> ServeEndpoints(
    const std::string& metrics_address, std::map<std::string, HttpHandler> routes,
    const std::string& probe_address, std::map<std::string, HttpHandler> probe_routes,
    const EndpointLimits& limits, EndpointCounters* counters) {
  std::vector<std::unique_ptr<HttpServer>> servers;
  for (auto& [key, address, paths, what, cap, count] : {
           std::tuple("metricsAddress", &metrics_address, &routes, "/metrics, /healthz and /readyz",
                      limits.metrics_connections,
                      counters != nullptr ? &counters->metrics : nullptr),
           std::tuple("probeAddress", &probe_address, &probe_routes, "/healthz and /readyz",
                      limits.probe_connections, counters != nullptr ? &counters->probe : nullptr),
       }) {
    if (address->empty()) continue;
    HttpServerOptions options;
    options.request_timeout = limits.request_timeout;
    options.max_connections = cap;
    options.max_connections_per_client = std::max(1, cap / 2);
    options.counters = count;
    auto started = HttpServer::Start(*address, std::move(*paths), options);
    if (!started.ok()) {
      return absl::Status(started.status().code(),
                          absl::StrCat(key, ": ", started.status().message()));
    }
    spdlog::info("serving {} on {} (port {}, at most {} connections)", what, *address,
                 (*started)->port(), cap);
    servers.push_back(*std::move(started));
  }
  return servers;
}

void CollectEndpointCounters(const EndpointCounters& counters,
                             std::vector<prometheus::MetricFamily>& out) {
  auto& family = AddFamily(
      out, absl::StrCat(kMetricPrefix, "http_connections_dropped_total"),
      "HTTP connections closed without an answer, by listener (metrics, probe) and reason: limit "
      "(accepted while metricsMaxConnections or probeMaxConnections, or half of them from the same "
      "client, were open; closed at once), "
      "timeout (not answered within httpRequestTimeout of connecting).",
      prometheus::MetricType::Counter);
  for (const auto& [listener, c] :
       {std::pair("metrics", &counters.metrics), std::pair("probe", &counters.probe)}) {
    AddSample(family, static_cast<double>(c->over_limit.load()),
              {{"listener", listener}, {"reason", "limit"}});
    AddSample(family, static_cast<double>(c->timed_out.load()),
              {{"listener", listener}, {"reason", "timeout"}});
  }
  auto& pauses = AddFamily(
      out, absl::StrCat(kMetricPrefix, "http_accept_pauses_total"),
      "Pauses of 100 ms in accepting HTTP connections, by listener, because accept() found no "
      "descriptor or memory left (EMFILE, ENFILE, ENOBUFS, ENOMEM).",
      prometheus::MetricType::Counter);
  for (const auto& [listener, c] :
       {std::pair("metrics", &counters.metrics), std::pair("probe", &counters.probe)}) {
    AddSample(pauses, static_cast<double>(c->accept_pauses.load()), {{"listener", listener}});
  }
}

}  // namespace efa::plugin
