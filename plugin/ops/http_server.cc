#include "plugin/ops/http_server.h"

#include <event2/buffer.h>
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

#include <cerrno>
#include <cstring>
#include <mutex>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"

namespace efa::plugin {

struct HttpLoop {
  std::string address;
  std::map<std::string, HttpHandler> routes;
  event_base* base = nullptr;
  evhttp* http = nullptr;
  evconnlistener* listener = nullptr;  // evhttp's, over our socket
  event* resume = nullptr;             // re-enables accepting after EMFILE
  event* stop = nullptr;               // activated by ~HttpServer
  bool warned = false;                 // of running out of descriptors

  ~HttpLoop() {
    if (http != nullptr) evhttp_free(http);  // closes the listener and connections
    for (event* e : {resume, stop}) {
      if (e != nullptr) event_free(e);
    }
    if (base != nullptr) event_base_free(base);
  }
};

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
  if (!loop->warned) {
    loop->warned = true;
    spdlog::warn("\"{}\": accept: {}; not accepting for 100 ms at a time until it passes",
                 loop->address, std::strerror(err));
  }
  evconnlistener_disable(listener);
  const timeval pause{0, 100'000};
  evtimer_add(loop->resume, &pause);
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
        evconnlistener_enable(static_cast<evconnlistener*>(l));
      },
      loop->listener);
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
  const timeval timeout{options.timeout.count() / 1000,
                        static_cast<suseconds_t>(options.timeout.count() % 1000 * 1000)};
  evhttp_set_timeout_tv(loop->http, &timeout);
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
    const std::string& probe_address, std::map<std::string, HttpHandler> probe_routes) {
  std::vector<std::unique_ptr<HttpServer>> servers;
  for (auto& [key, address, paths, what] : {
           std::tuple("metricsAddress", &metrics_address, &routes,
                      "/metrics, /healthz and /readyz"),
           std::tuple("probeAddress", &probe_address, &probe_routes, "/healthz and /readyz"),
       }) {
    if (address->empty()) continue;
    auto started = HttpServer::Start(*address, std::move(*paths));
    if (!started.ok()) {
      return absl::Status(started.status().code(),
                          absl::StrCat(key, ": ", started.status().message()));
    }
    spdlog::info("serving {} on {} (port {})", what, *address, (*started)->port());
    servers.push_back(*std::move(started));
  }
  return servers;
}

}  // namespace efa::plugin
