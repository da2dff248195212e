#include "plugin/ops/api_server.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <string>

#include "test/support/temp_dir.h"
#include "test/support/tls_server.h"

namespace {

using efa::plugin::ApiServer;
using efa::plugin::ApiServerSettings;
using efa::testing::TempDir;
using efa::testing::TlsServer;
using namespace std::chrono_literals;

constexpr char kPath[] = "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/efas";

struct Api {
  Api() : server(dir.path()) {
    std::ofstream(token) << "the-token\n";
    settings = {server.address(), token, server.ca_file()};
  }
  TempDir dir;
  TlsServer server;
  std::filesystem::path token = dir.path() / "token";
  ApiServerSettings settings;
};

// A TCP listener on 127.0.0.1 that never accepts: a connection is made (the
// backlog) but nothing is ever answered.
struct SilentListener {
  SilentListener() {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof(a);
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), size) != 0 || listen(fd, 4) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &size) != 0) {
      throw std::runtime_error("cannot listen on 127.0.0.1");
    }
    port = ntohs(a.sin_port);
  }
  ~SilentListener() { close(fd); }
  int fd = -1;
  int port = 0;
};

TEST_CASE("A GET to the API server: TLS checked against the CA file, the token as the bearer",
          "[api_server]") {
  Api api;
  api.server.Answer(kPath, 200, R"({"kind":"ResourceClaim"})");
  SECTION("at the address given") {
    const auto body = ApiServer(api.settings).Get(kPath);
    REQUIRE(body.ok());
    CHECK(*body == R"({"kind":"ResourceClaim"})");
    CHECK(api.server.Authorizations() == std::vector<std::string>{"Bearer the-token"});
  }
  SECTION("at the pod's KUBERNETES_SERVICE_HOST and _PORT") {
    ApiServerSettings settings = api.settings;
    settings.address.clear();
    const std::string port = api.server.address().substr(api.server.address().find(':') + 1);
    auto env = [&](const std::string& name) -> std::optional<std::string> {
      if (name == "KUBERNETES_SERVICE_HOST") return "127.0.0.1";
      if (name == "KUBERNETES_SERVICE_PORT") return port;
      return std::nullopt;
    };
    const auto body = ApiServer(settings, env).Get(kPath);
    REQUIRE(body.ok());
    CHECK(*body == R"({"kind":"ResourceClaim"})");
  }
  SECTION("the token read again at each GET (the kubelet rotates it)") {
    REQUIRE(ApiServer(api.settings).Get(kPath).ok());
    std::ofstream(api.token) << "the-next-token";
    REQUIRE(ApiServer(api.settings).Get(kPath).ok());
    CHECK(api.server.Authorizations() ==
          std::vector<std::string>{"Bearer the-token", "Bearer the-next-token"});
  }
}

TEST_CASE("A GET to the API server that fails says where and why", "[api_server]") {
  Api api;
  const std::string where = "GET https://" + api.server.address() + kPath + ": ";
  auto get = [&](const ApiServerSettings& settings,
                 std::chrono::milliseconds timeout = ApiServer::kTimeout) {
    return ApiServer(settings, [](const std::string&) { return std::nullopt; }).Get(kPath, timeout);
  };
  SECTION("the API server's own refusal, with its message") {
    api.server.Answer(kPath, 403,
                      R"({"kind":"Status","message":"resourceclaims.resource.k8s.io \"efas\" is )"
                      R"(forbidden: User \"system:serviceaccount:kube-system:efa\" cannot get"})");
    const auto body = get(api.settings);
    CHECK(body.status().code() == absl::StatusCode::kPermissionDenied);
    CHECK(body.status().message() ==
          where +
              "HTTP 403: resourceclaims.resource.k8s.io \"efas\" is forbidden: User "
              "\"system:serviceaccount:kube-system:efa\" cannot get");
    CHECK(get(api.settings).status().code() == absl::StatusCode::kPermissionDenied);
    api.server.Answer(kPath, 404, R"({"kind":"Status","message":"not found"})");
    CHECK(get(api.settings).status().code() == absl::StatusCode::kNotFound);
  }
  SECTION("a server whose certificate the CA file does not vouch for") {
    TempDir other;
    ApiServerSettings settings = api.settings;
    settings.ca_file = other.path() / "other-ca.crt";
    efa::testing::WriteSelfSignedCertificate(settings.ca_file, other.path() / "other.key",
                                             "IP:127.0.0.1");
    const auto body = get(settings);
    CHECK(body.status().message().find(
              where + "TLS handshake: the server's certificate is not trusted: ") == 0);
    CHECK(api.server.Authorizations().empty());  // the token never left
  }
  SECTION("a certificate for another address") {
    TempDir other;
    TlsServer elsewhere(other.path(), "IP:10.0.0.1");
    ApiServerSettings settings = api.settings;
    settings.address = elsewhere.address();
    settings.ca_file = elsewhere.ca_file();
    CHECK(std::string(get(settings).status().message()) ==
          "GET https://" + elsewhere.address() + kPath +
              ": TLS handshake: the server's certificate is not trusted: IP address mismatch");
    CHECK(elsewhere.Authorizations().empty());
  }
  SECTION("no token, no CA file, no server") {
    ApiServerSettings settings = api.settings;
    settings.token_file = api.dir.path() / "missing-token";
    CHECK(std::string(get(settings).status().message()) == where + "cannot read the token file " +
                                                               settings.token_file.string() +
                                                               ": No such file or directory");
    settings = api.settings;
    std::ofstream(api.token, std::ios::trunc) << " \n";
    CHECK(get(settings).status().code() == absl::StatusCode::kUnauthenticated);
    // Nothing but the token goes into the request's headers.
    std::ofstream(api.token, std::ios::trunc) << "the-token\r\nX-Injected: 1\n";
    CHECK(std::string(get(settings).status().message()) ==
          where + "the token file " + api.token.string() +
              " holds white space or control characters inside");
    CHECK(api.server.Authorizations().empty());
    std::ofstream(api.token) << "the-token";
    settings.ca_file = api.dir.path() / "missing-ca.crt";
    CHECK(std::string(get(settings).status().message()) == where + "cannot load the CA file " +
                                                               settings.ca_file.string() +
                                                               " (missing, or no certificate)");
    settings = api.settings;
    settings.address.clear();
    CHECK(get(settings).status().code() == absl::StatusCode::kFailedPrecondition);
    settings.address = "127.0.0.1";
    CHECK(get(settings).status().code() == absl::StatusCode::kInvalidArgument);
    SilentListener closed;  // a port known free once it is closed
    settings.address = "127.0.0.1:" + std::to_string(closed.port);
    close(closed.fd);
    closed.fd = -1;
    CHECK(std::string(get(settings).status().message()) ==
          "GET https://" + settings.address + kPath + ": connect: Connection refused");
  }
  SECTION("a server that never answers costs the timeout, no more") {
    SilentListener silent;
    ApiServerSettings settings = api.settings;
    settings.address = "127.0.0.1:" + std::to_string(silent.port);
    const auto start = std::chrono::steady_clock::now();
    const auto body = get(settings, 300ms);
    const auto took = std::chrono::steady_clock::now() - start;
    CHECK(body.status().code() == absl::StatusCode::kDeadlineExceeded);
    CHECK(std::string(body.status().message()) ==
          "GET https://" + settings.address + kPath + ": TLS handshake: timed out");
    CHECK(took >= 300ms);
    CHECK(took < 5s);
  }
  SECTION("a body over the bound is refused") {
    api.server.Answer(kPath, 200, std::string(ApiServer::kMaxBody + 1, 'x'));
    CHECK(get(api.settings).status().code() == absl::StatusCode::kResourceExhausted);
    api.server.Answer(kPath, 200, std::string(ApiServer::kMaxBody, 'x'));
    CHECK(get(api.settings).ok());
  }
}

}  // namespace
