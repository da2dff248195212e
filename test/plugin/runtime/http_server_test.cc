// The HTTP server over real TCP sockets: routes, methods, limits. Requests
// go through cpp-httplib's client; malformed and stalled ones through a bare
// socket, which no client library sends.
#include "plugin/runtime/http_server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test/support/sanitized.h"

using namespace efa::plugin;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<HttpServer> StartServer(HttpServerOptions options = {}) {
  auto server =
      HttpServer::Start("127.0.0.1:0",
                        {{"/hello",
                          [] {
                            return HttpResponse{200, "text/plain; charset=utf-8", "hello\n"};
                          }},
                         {"/down",
                          [] {
                            return HttpResponse{503, "text/plain; charset=utf-8", "not ok: down\n"};
                          }}},
                        options);
  REQUIRE(server.ok());
  REQUIRE((*server)->port() != 0);
  return *std::move(server);
}

// Sends `request` on a new loopback connection and returns what the server
// wrote until it closed the connection (empty when it wrote nothing).
std::string RawExchange(uint16_t port, const std::string& request) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string reply;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) reply.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return reply;
}

}  // namespace

TEST_CASE("The HTTP server answers GET on its routes and closes the connection",
          "[http][concurrency]") {
  auto server = StartServer();
  httplib::Client client("127.0.0.1", server->port());
  auto reply = client.Get("/hello");
  REQUIRE(reply);
  CHECK(reply->status == 200);
  CHECK(reply->body == "hello\n");
  CHECK(reply->get_header_value("Content-Type") == "text/plain; charset=utf-8");
  CHECK(reply->get_header_value("Content-Length") == "6");
  CHECK(reply->get_header_value("Connection") == "close");

  reply = client.Get("/hello?verbose=1");
  REQUIRE(reply);
  CHECK(reply->status == 200);
  reply = client.Get("/down");
  REQUIRE(reply);
  CHECK(reply->status == 503);
  CHECK(reply->body == "not ok: down\n");
}

TEST_CASE("The HTTP server answers HEAD without a body", "[http][concurrency]") {
  auto server = StartServer();
  auto reply = httplib::Client("127.0.0.1", server->port()).Head("/hello");
  REQUIRE(reply);
  CHECK(reply->status == 200);
  CHECK(reply->get_header_value("Content-Length") == "6");
  CHECK(reply->body.empty());
}

TEST_CASE("The HTTP server refuses unknown paths, other methods and malformed requests",
          "[http][concurrency]") {
  auto server = StartServer();
  httplib::Client client("127.0.0.1", server->port());
  CHECK(client.Get("/nope")->status == 404);
  CHECK(client.Get("/hello/")->status == 404);
  auto reply = client.Post("/hello", "", "text/plain");
  REQUIRE(reply);
  CHECK(reply->status == 405);
  CHECK(reply->get_header_value("Allow") == "GET, HEAD");
  CHECK(RawExchange(server->port(), "GET /hello\r\n\r\n").rfind("HTTP/1.1 400 ", 0) == 0);
  CHECK(RawExchange(server->port(), "GET /hello SPDY/3\r\n\r\n").rfind("HTTP/1.1 400 ", 0) == 0);
}

TEST_CASE("The HTTP server bounds the request size and the time a client may take",
          "[http][concurrency]") {
  HttpServerOptions options;
  options.request_timeout = 200ms;
  auto server = StartServer(options);
  // Headers over 8 KiB, on one line or on many.
  std::string many;
  for (int i = 0; i < 400; ++i) many += "X-Pad: " + std::string(20, 'a') + "\r\n";
  for (const std::string& headers : {"X-Pad: " + std::string(9000, 'a') + "\r\n", many}) {
    CHECK(RawExchange(server->port(), "GET /hello HTTP/1.1\r\n" + headers + "\r\n")
              .rfind("HTTP/1.1 400 ", 0) == 0);
  }
  // No route takes a body: one is refused, announced or chunked.
  CHECK(RawExchange(server->port(), "GET /hello HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello")
            .rfind("HTTP/1.1 413 ", 0) == 0);
  CHECK(RawExchange(
            server->port(),
            "GET /hello HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
            .rfind("HTTP/1.1 413 ", 0) == 0);
  // A client that stops in the middle of its request, or never starts one,
  // is disconnected, and the server goes on serving others.
  for (const char* stalled : {"GET /hel", ""}) {
    INFO('"' << stalled << '"');
    const auto start = std::chrono::steady_clock::now();
    CHECK(RawExchange(server->port(), stalled).empty());
    CHECK(std::chrono::steady_clock::now() - start < 4s);
  }
  CHECK(httplib::Client("127.0.0.1", server->port()).Get("/hello")->status == 200);
}

namespace {

// A loopback connection to `port` from `source` (any of 127.0.0.0/8),
// connected (the kernel completes it before the server accepts it).
int Connect(uint16_t port, const char* source = "127.0.0.1") {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  REQUIRE(::inet_pton(AF_INET, source, &from.sin_addr) == 1);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from) == 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  return fd;
}

// Seconds until the server closes `fd` (recv returns 0), at most 5.
double SecondsUntilClosed(int fd) {
  const auto start = std::chrono::steady_clock::now();
  char buf[256];
  while (::recv(fd, buf, sizeof buf, 0) > 0) {
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TEST_CASE("A connection past the cap is closed at once, and a freed place serves again",
          "[http][concurrency]") {
  HttpCounters counters;
  HttpServerOptions options;
  options.max_connections = 3;
  options.request_timeout = 10s;
  options.counters = &counters;
  auto server = StartServer(options);
  std::vector<int> held;
  for (int i = 0; i < 3; ++i) held.push_back(Connect(server->port()));
  // The fourth is accepted after the three (the backlog is in order) and
  // closed without a byte, long before the request timeout.
  const int fourth = Connect(server->port());
  CHECK(SecondsUntilClosed(fourth) < 2);
  ::close(fourth);
  CHECK(counters.over_limit == 1);
  CHECK(counters.timed_out == 0);
  // A held connection asks and is answered: the three were served, not
  // merely queued.
  const std::string request = "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n";
  REQUIRE(::send(held[0], request.data(), request.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(request.size()));
  char buf[4096];
  const ssize_t n = ::recv(held[0], buf, sizeof buf, 0);
  REQUIRE(n > 0);
  CHECK(std::string(buf, static_cast<size_t>(n)).rfind("HTTP/1.1 200 ", 0) == 0);
  // Its place is free once the server closed it: a new client is served
  // (asked again while the server may not have seen the close yet).
  std::string reply;
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (reply.empty() && std::chrono::steady_clock::now() < deadline) {
    reply = RawExchange(server->port(), request);
  }
  CHECK(reply.rfind("HTTP/1.1 200 ", 0) == 0);
  for (size_t i = 1; i < held.size(); ++i) ::close(held[i]);
  ::close(held[0]);
}

TEST_CASE("One client address holds at most its share of the connections; another is served",
          "[http][concurrency]") {
  HttpCounters counters;
  HttpServerOptions options;
  options.max_connections = 4;
  options.max_connections_per_client = 2;
  options.request_timeout = 10s;
  options.counters = &counters;
  auto server = StartServer(options);
  const int first = Connect(server->port());
  const int second = Connect(server->port());
  // The third from the same address is closed at once, with places left.
  const int third = Connect(server->port());
  CHECK(SecondsUntilClosed(third) < 2);
  ::close(third);
  CHECK(counters.over_limit == 1);
  // Another address is served.
  const int other = Connect(server->port(), "127.0.0.2");
  const std::string request = "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n";
  REQUIRE(::send(other, request.data(), request.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(request.size()));
  char buf[4096];
  const ssize_t n = ::recv(other, buf, sizeof buf, 0);
  REQUIRE(n > 0);
  CHECK(std::string(buf, static_cast<size_t>(n)).rfind("HTTP/1.1 200 ", 0) == 0);
  for (int fd : {first, second, other}) ::close(fd);
}

TEST_CASE("A client trickling its request is disconnected at the request timeout after accept",
          "[http][concurrency]") {
  HttpCounters counters;
  HttpServerOptions options;
  options.request_timeout = 500ms;
  options.counters = &counters;
  auto server = StartServer(options);
  const int fd = Connect(server->port());
  // A byte every 100 ms, a request head that never ends: progress all
  // along, which restarts evhttp's own timeouts, never this one.
  const std::string head = "GET /hello HTTP/1.1\r\nX-Slow: " + std::string(100, 'a');
  const auto start = std::chrono::steady_clock::now();
  bool closed = false;
  for (size_t i = 0; i < head.size() && !closed; ++i) {
    closed = ::send(fd, &head[i], 1, MSG_NOSIGNAL) != 1;
    pollfd p{fd, POLLIN, 0};
    closed = closed || ::poll(&p, 1, 100) == 1;  // paces the bytes; wakes at the close
  }
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ::close(fd);
  INFO("closed after " << took << " s");
  CHECK(closed);
  CHECK(took >= 0.4);
  CHECK(took < 2);
  CHECK(counters.timed_out == 1);
  CHECK(counters.over_limit == 0);
}

TEST_CASE("A server without room for a connection or time for a request is refused", "[http]") {
  HttpServerOptions options;
  options.max_connections = 0;
  auto server = HttpServer::Start("127.0.0.1:0", {}, options);
  REQUIRE_FALSE(server.ok());
  CHECK(std::string(server.status().message()) ==
        "\"127.0.0.1:0\": expected at least 1 connection and 1 ms, got 0 and 3000 ms");
}

TEST_CASE("Listen addresses are parsed and checked", "[http]") {
  using Parsed = std::pair<std::string, uint16_t>;
  CHECK(*ParseListenAddress(":8080") == Parsed{"", 8080});
  CHECK(*ParseListenAddress("127.0.0.1:9090") == Parsed{"127.0.0.1", 9090});
  CHECK(*ParseListenAddress("[::1]:0") == Parsed{"::1", 0});
  CHECK(*ParseListenAddress("localhost:65535") == Parsed{"localhost", 65535});
  for (const char* bad : {"8080", ":", ":65536", "::1:80", "[::1:80", "a b:80", ":-1", ":80a"}) {
    INFO(bad);
    auto parsed = ParseListenAddress(bad);
    REQUIRE_FALSE(parsed.ok());
    CHECK(std::string(parsed.status().message()) ==
          std::string("expected an address like \":8080\" or \"127.0.0.1:8080\", got \"") + bad +
              "\"");
  }
}

TEST_CASE("A port already in use is an error naming the address", "[http][concurrency]") {
  auto first = StartServer();
  const std::string address = "127.0.0.1:" + std::to_string(first->port());
  auto second = HttpServer::Start(address, {});
  REQUIRE_FALSE(second.ok());
  CHECK(std::string(second.status().message()) ==
        "\"" + address + "\": bind: Address already in use");
}

TEST_CASE("A server on every interface answers on IPv4 loopback", "[http][concurrency]") {
  auto server = HttpServer::Start(":0", {{"/hello", [] { return HttpResponse{}; }}});
  REQUIRE(server.ok());
  auto reply = httplib::Client("127.0.0.1", (*server)->port()).Get("/hello");
  REQUIRE(reply);
  CHECK(reply->status == 200);
}

namespace {

// CPU time (user + system, in clock ticks) of this process's threads named
// `name` so far.
long ThreadCpuTicks(const std::string& name) {
  long ticks = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string line;
    if (!std::getline(comm, line) || line != name) continue;
    std::ifstream stat(task.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    std::istringstream fields(text.substr(text.rfind(')') + 2));
    std::string field;
    long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && fields >> field; ++i) {
      if (i == 14) utime = std::stol(field);
      if (i == 15) stime = std::stol(field);
    }
    ticks += utime + stime;
  }
  return ticks;
}

using efa::testing::kSanitized;

}  // namespace

TEST_CASE("A server out of descriptors stops accepting for a while, then serves again",
          "[http][concurrency]") {
  if (kSanitized) {
    WARN("not run under a sanitizer: its runtime needs descriptors while none are left");
    return;
  }
  HttpCounters counters;
  HttpServerOptions options;
  options.counters = &counters;
  auto server = StartServer(options);
  // The client's socket exists before the descriptors run out; its
  // connection then waits in the backlog while accept() fails with EMFILE.
  const int client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(client >= 0);
  const long before = ThreadCpuTicks("efa-http");
  rlimit saved{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
  rlimit low = saved;
  low.rlim_cur = std::min<rlim_t>(saved.rlim_cur, 1024);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  std::vector<int> filler;
  for (int fd; (fd = ::dup(client)) >= 0;) filler.push_back(fd);
  CHECK(errno == EMFILE);

  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(server->port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  const std::string request = "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n";
  REQUIRE(::send(client, request.data(), request.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(request.size()));
  // A window to see that the server does not spin on the failing accept()
  // (a level-triggered loop would burn the whole half second); measured,
  // not waited on.
  std::this_thread::sleep_for(500ms);
  for (int fd : filler) ::close(fd);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &saved) == 0);
  const long spent = ThreadCpuTicks("efa-http") - before;
  INFO("CPU ticks of the server thread in the half second: " << spent);
  CHECK(spent * 1000 / ::sysconf(_SC_CLK_TCK) < 100);
  // Each pause counted: a few in the half second, not one per spin.
  CHECK(counters.accept_pauses >= 1);
  CHECK(counters.accept_pauses <= 10);
  // Descriptors again: the waiting connection is accepted and answered.
  timeval tv{5, 0};
  ::setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string reply;
  char buf[4096];
  for (ssize_t n; (n = ::recv(client, buf, sizeof buf, 0)) > 0;) reply.append(buf, size_t(n));
  ::close(client);
  CHECK(reply.rfind("HTTP/1.1 200 ", 0) == 0);
}
