#include "plugin/ops/http_server.h"

#include <httplib.h>
#include <pthread.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace efa::plugin {
namespace {

bool IsHostChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '-' || c == '_';
}

// cpp-httplib's pool starts all of its threads at once and queues without
// bound. This one starts a worker only when a connection finds none idle
// (a server nobody calls has its accepting thread alone), keeps it for the
// next ones, and past `limit` connections waiting or being served runs the
// task on the calling (accepting) thread, which accepts no more meanwhile.
class BoundedTaskQueue final : public httplib::TaskQueue {
 public:
  BoundedTaskQueue(size_t threads, size_t limit) : max_threads_(threads), limit_(limit) {}
  ~BoundedTaskQueue() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    {
      absl::MutexLock lock(&mu_);
      if (jobs_.size() + busy_ < limit_ && !shutdown_) {
        jobs_.push_back(std::move(fn));
        if (idle_ < jobs_.size() && threads_.size() < max_threads_) {
          threads_.emplace_back([this] { Work(); });
        }
        return;
      }
    }
    fn();
  }
  void shutdown() override {
    std::vector<std::thread> threads;
    {
      absl::MutexLock lock(&mu_);
      shutdown_ = true;
      threads.swap(threads_);
    }
    for (std::thread& t : threads) t.join();
  }

 private:
  void Work() {
    mu_.Lock();
    while (true) {
      ++idle_;
      mu_.Await(absl::Condition(this, &BoundedTaskQueue::HasWorkOrShutdown));
      --idle_;
      if (jobs_.empty()) break;  // shut down, nothing left to serve
      std::function<void()> fn = std::move(jobs_.front());
      jobs_.pop_front();
      ++busy_;
      mu_.Unlock();
      fn();
      mu_.Lock();
      --busy_;
    }
    mu_.Unlock();
  }
  bool HasWorkOrShutdown() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !jobs_.empty() || shutdown_;
  }

  const size_t max_threads_;
  const size_t limit_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  size_t idle_ ABSL_GUARDED_BY(mu_) = 0;  // workers waiting for a job
  size_t busy_ ABSL_GUARDED_BY(mu_) = 0;  // workers serving one
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

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

  auto server = std::make_unique<httplib::Server>();
  server->new_task_queue = [options] {
    return new BoundedTaskQueue(options.threads, options.threads + options.max_queued);
  };
  // One request per connection: a kept-alive connection would hold a
  // worker, which polls it every 10 ms, between scrapes.
  server->set_keep_alive_max_count(1);
  server->set_keep_alive_timeout(options.first_byte_timeout.count());
  server->set_read_timeout(options.read_timeout);
  server->set_write_timeout(options.write_timeout);
  server->set_payload_max_length(0);
  // cpp-httplib's default also sets SO_REUSEPORT, with which a second
  // process could bind the same port and take half of the connections.
  server->set_socket_options([](int fd) {
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  });
  // Routing by exact path here: cpp-httplib's own routes are regular
  // expressions, and it answers 404, not 405, to another method.
  server->set_pre_routing_handler(
      [routes = std::move(routes)](const httplib::Request& req, httplib::Response& res) {
        auto route = routes.find(req.path);
        if (route == routes.end()) return httplib::Server::HandlerResponse::Unhandled;
        if (req.method != "GET" && req.method != "HEAD") {
          res.status = 405;
          res.set_header("Allow", "GET, HEAD");
          return httplib::Server::HandlerResponse::Handled;
        }
        HttpResponse answer = route->second();
        res.status = answer.status;
        res.set_content(answer.body, answer.content_type.c_str());
        return httplib::Server::HandlerResponse::Handled;
      });

  // Every interface: IPv6 with IPv4 mapped (cpp-httplib clears
  // IPV6_V6ONLY), else IPv4 alone.
  int bound = -1;
  errno = 0;
  for (const std::string& h :
       host.empty() ? std::vector<std::string>{"::", "0.0.0.0"} : std::vector<std::string>{host}) {
    bound = port == 0 ? server->bind_to_any_port(h) : (server->bind_to_port(h, port) ? port : -1);
    if (bound >= 0 || errno == EADDRINUSE || errno == EACCES) break;
  }
  if (bound < 0) {
    const int err = errno;
    return absl::UnavailableError(absl::StrCat(
        "\"", std::string(address), "\": bind: ", err != 0 ? std::strerror(err) : "cannot listen"));
  }
  std::unique_ptr<HttpServer> http(new HttpServer(std::move(server), static_cast<uint16_t>(bound)));
  return http;
}

HttpServer::HttpServer(std::unique_ptr<httplib::Server> server, uint16_t port)
    : server_(std::move(server)), port_(port) {
  thread_ = std::thread([s = server_.get()] {
    // Named for the per-thread figures (scripts/bench.sh); the workers,
    // started from this thread, inherit the name.
    ::pthread_setname_np(::pthread_self(), "efa-http");
    s->listen_after_bind();
  });
  // stop() does nothing before the loop has begun (its first statement
  // marks it running): a server destroyed at once would never stop.
  while (!server_->is_running()) std::this_thread::yield();
}

HttpServer::~HttpServer() {
  server_->stop();
  thread_.join();
}

}  // namespace efa::plugin
