// The HTTP server over real TCP sockets: routes, methods, limits.
#include "plugin/http_server.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <string>

#include "test/plugin/http_client.h"

using namespace efa::plugin;
using efa::testing::HttpExchange;
using efa::testing::HttpGet;
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

}  // namespace

TEST_CASE("The HTTP server answers GET on its routes and closes the connection",
          "[http][concurrency]") {
  auto server = StartServer();
  auto reply = HttpGet(server->port(), "/hello");
  CHECK(reply.status == 200);
  CHECK(reply.body == "hello\n");
  CHECK(reply.headers["content-type"] == "text/plain; charset=utf-8");
  CHECK(reply.headers["content-length"] == "6");
  CHECK(reply.headers["connection"] == "close");

  reply = HttpGet(server->port(), "/hello?verbose=1");
  CHECK(reply.status == 200);
  reply = HttpGet(server->port(), "/down");
  CHECK(reply.status == 503);
  CHECK(reply.body == "not ok: down\n");
}

TEST_CASE("The HTTP server answers HEAD without a body", "[http][concurrency]") {
  auto server = StartServer();
  auto reply = HttpExchange(server->port(), "HEAD /hello HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(reply.status == 200);
  CHECK(reply.headers["content-length"] == "6");
  CHECK(reply.body.empty());
}

TEST_CASE("The HTTP server refuses unknown paths, other methods and malformed requests",
          "[http][concurrency]") {
  auto server = StartServer();
  CHECK(HttpGet(server->port(), "/nope").status == 404);
  CHECK(HttpGet(server->port(), "/hello/").status == 404);
  auto reply = HttpExchange(server->port(), "POST /hello HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  CHECK(reply.status == 405);
  CHECK(reply.headers["allow"] == "GET, HEAD");
  CHECK(HttpExchange(server->port(), "GET /hello\r\n\r\n").status == 400);
  CHECK(HttpExchange(server->port(), "GET /hello SPDY/3\r\n\r\n").status == 400);
}

TEST_CASE("The HTTP server bounds the request size and the time a client may take",
          "[http][concurrency]") {
  HttpServerOptions options;
  options.max_request_bytes = 256;
  options.timeout = 200ms;
  auto server = StartServer(options);
  auto reply = HttpExchange(server->port(),
                            "GET /hello HTTP/1.1\r\nX-Pad: " + std::string(1000, 'a') + "\r\n\r\n");
  CHECK(reply.status == 431);
  // A client that never finishes its request is disconnected, and the
  // server goes on serving others.
  const auto start = std::chrono::steady_clock::now();
  reply = HttpExchange(server->port(), "GET /hel", 5s);
  CHECK(reply.status == 0);
  CHECK(std::chrono::steady_clock::now() - start < 4s);
  CHECK(HttpGet(server->port(), "/hello").status == 200);
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
