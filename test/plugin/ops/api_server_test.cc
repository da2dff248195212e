#include "plugin/ops/api_server.h"

#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "test/support/child_process.h"
#include "test/support/temp_dir.h"
#include "test/support/tls_server.h"

namespace {

using efa::plugin::ApiServer;
using efa::plugin::ApiServerSettings;
using efa::testing::SilentListener;
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

namespace {

// A DNS server on 127.0.0.1:53 that answers only when told to: it keeps
// the queries it gets, and Answer() gives each A query `address` (and each
// other query no record).
struct HeldNameServer {
  HeldNameServer() {
    fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(53);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      throw std::runtime_error(std::string("cannot bind 127.0.0.1:53: ") + std::strerror(errno));
    }
  }
  ~HeldNameServer() { close(fd); }
  // The queries that came since the last call, kept for Answer().
  size_t Take() {
    size_t n = 0;
    for (;;) {
      Query q;
      socklen_t size = sizeof(q.from);
      const ssize_t got =
          recvfrom(fd, q.packet, sizeof(q.packet), 0, reinterpret_cast<sockaddr*>(&q.from), &size);
      if (got < 12) return n;
      q.size = static_cast<size_t>(got);
      held.push_back(q);
      ++n;
    }
  }
  void Answer(const unsigned char (&address)[4]) {
    for (Query& q : held) {
      // The question ends 4 bytes (type, class) after its name's 0 label.
      size_t end = 12;
      while (end < q.size && q.packet[end] != 0) end += q.packet[end] + 1;
      end += 5;
      const bool a_query = end <= q.size && q.packet[end - 4] == 0 && q.packet[end - 3] == 1;
      std::string answer(reinterpret_cast<const char*>(q.packet), end);
      answer[2] = static_cast<char>(0x81);  // a response, recursion desired
      answer[3] = static_cast<char>(0x80);  // recursion available, no error
      answer[7] = a_query ? 1 : 0;          // answers
      answer[9] = answer[11] = 0;           // no authority, no additional records
      if (a_query) {
        // The question's name (a pointer to offset 12), A, IN, TTL 60, 4 bytes.
        answer += std::string("\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04", 12);
        answer.append(reinterpret_cast<const char*>(address), 4);
      }
      sendto(fd, answer.data(), answer.size(), 0, reinterpret_cast<sockaddr*>(&q.from),
             sizeof(q.from));
    }
    held.clear();
  }
  struct Query {
    unsigned char packet[512];
    size_t size = 0;
    sockaddr_in from{};
  };
  int fd = -1;
  std::vector<Query> held;
};

// Runs in a user, mount and network namespace of its own (the test below
// starts it), where 127.0.0.1 is the only name server.
void UseOnlyNameServer(const std::filesystem::path& dir) {
  const int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ifreq lo{};
  std::strncpy(lo.ifr_name, "lo", IFNAMSIZ - 1);
  REQUIRE(ioctl(s, SIOCGIFFLAGS, &lo) == 0);
  lo.ifr_flags = static_cast<short>(lo.ifr_flags | IFF_UP);
  REQUIRE(ioctl(s, SIOCSIFFLAGS, &lo) == 0);
  close(s);
  // Each attempt waits 5 s for an answer: a blocking lookup would take 10.
  std::ofstream(dir / "resolv.conf") << "nameserver 127.0.0.1\noptions timeout:5 attempts:2\n";
  REQUIRE(mount((dir / "resolv.conf").c_str(), "/etc/resolv.conf", nullptr, MS_BIND, nullptr) == 0);
}

}  // namespace

// Run by the next test, in namespaces of its own.
TEST_CASE("A host name's lookup within the GET's deadline: the child", "[.api_server_resolver]") {
  TempDir dir;
  UseOnlyNameServer(dir.path());
  HeldNameServer dns;
  // A token and a CA, so that only the address is missing.
  const TlsServer tls(dir.path());
  std::ofstream(dir.path() / "token") << "the-token\n";
  const ApiServer api({"api.cluster.example:6443", dir.path() / "token", tls.ca_file()});
  auto timed_get = [&](std::chrono::milliseconds timeout, std::chrono::milliseconds& took) {
    const auto start = std::chrono::steady_clock::now();
    auto body = api.Get(kPath, timeout);
    took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                 start);
    return body;
  };
  std::chrono::milliseconds took{};
  // The name server holds its answer: the GET ends at its deadline.
  auto body = timed_get(300ms, took);
  CHECK(body.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(body.status().message() ==
        "GET https://api.cluster.example:6443" + std::string(kPath) +
            ": resolving it: timed out (the lookup goes on, for the next GET)");
  CHECK(took >= 300ms);
  CHECK(took < 2s);
  const size_t asked = dns.Take();
  CHECK(asked >= 1);
  // The next GET waits for the same lookup: no query is sent again.
  body = timed_get(300ms, took);
  CHECK(body.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(took < 2s);
  CHECK(dns.Take() == 0);
  // Answered now: the next GET takes the lookup's address and connects to
  // it (nothing listens there in this namespace).
  const unsigned char loopback[4] = {127, 0, 0, 1};
  dns.Answer(loopback);
  body = timed_get(2s, took);
  CHECK(body.status().message() == "GET https://api.cluster.example:6443" + std::string(kPath) +
                                       ": connect: Connection refused");
  CHECK(dns.Take() == 0);
}

TEST_CASE("A host name's lookup costs a GET no more than its deadline, and one lookup at a time",
          "[api_server]") {
  TempDir dir;
  auto in_namespaces = [&](const std::string& test) {
    return std::vector<std::string>{"/usr/bin/unshare",
                                    "--user",
                                    "--map-root-user",
                                    "--mount",
                                    "--net",
                                    "--",
                                    std::filesystem::read_symlink("/proc/self/exe"),
                                    test};
  };
  // A container's seccomp profile may forbid user namespaces.
  if (efa::testing::ChildProcess(
          {"/usr/bin/unshare", "--user", "--map-root-user", "--mount", "--net", "--", "/bin/true"},
          dir.path() / "probe.log")
          .Wait(30s) != 0) {
    WARN("no user namespaces here: the lookup is not tested");
    return;
  }
  efa::testing::ChildProcess child(
      in_namespaces("A host name's lookup within the GET's deadline: the child"),
      dir.path() / "child.log");
  const int status = child.Wait(60s);
  std::ifstream log(dir.path() / "child.log");
  const std::string text((std::istreambuf_iterator<char>(log)), {});
  CAPTURE(text);
  CHECK(status == 0);
}
