#include "plugin/ops/api_server.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "topology/sysfs.h"

namespace efa::plugin {
namespace {

using SteadyClock = std::chrono::steady_clock;

// The OpenSSL functions a GET calls, found in libssl.so.3 (the libcrypto
// ones through it: dlsym searches the libraries it loaded).
// clang-format off
#define EFA_OPENSSL_FUNCTIONS(X) \
  X(TLS_client_method) \
  X(SSL_CTX_new) \
  X(SSL_CTX_free) \
  X(SSL_CTX_load_verify_locations) \
  X(SSL_CTX_set_verify) \
  X(SSL_CTX_set_options) \
  X(SSL_new) \
  X(SSL_free) \
  X(SSL_set_fd) \
  X(SSL_ctrl) \
  X(SSL_set1_host) \
  X(SSL_get0_param) \
  X(X509_VERIFY_PARAM_set1_ip_asc) \
  X(SSL_connect) \
  X(SSL_write) \
  X(SSL_read) \
  X(SSL_get_error) \
  X(SSL_get_verify_result) \
  X(X509_verify_cert_error_string) \
  X(ERR_get_error) \
  X(ERR_error_string_n) \
  X(ERR_clear_error)
// clang-format on

struct OpenSsl {
// NOLINTNEXTLINE(bugprone-macro-parentheses): a declaration, not an expression
#define EFA_OPENSSL_FIELD(name) decltype(&::name) name = nullptr;
  EFA_OPENSSL_FUNCTIONS(EFA_OPENSSL_FIELD)
#undef EFA_OPENSSL_FIELD
};

// Loaded once, by the first GET; an error stays (the library will not
// appear while the process runs).
absl::StatusOr<const OpenSsl*> LoadOpenSsl() {
  static const auto* loaded = new absl::StatusOr<const OpenSsl*>([]() {
    constexpr char kLibrary[] = "libssl.so.3";
    void* lib = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      return absl::StatusOr<const OpenSsl*>(
          absl::UnavailableError(absl::StrCat("cannot load OpenSSL: ", dlerror())));
    }
    auto* ssl = new OpenSsl;
    std::string missing;
#define EFA_OPENSSL_LOAD(name)                                          \
  ssl->name = reinterpret_cast<decltype(ssl->name)>(dlsym(lib, #name)); \
  if (ssl->name == nullptr) missing += missing.empty() ? #name : ", " #name;
    EFA_OPENSSL_FUNCTIONS(EFA_OPENSSL_LOAD)
#undef EFA_OPENSSL_LOAD
    if (!missing.empty()) {
      delete ssl;
      return absl::StatusOr<const OpenSsl*>(absl::UnavailableError(
          absl::StrCat(kLibrary, " lacks ", missing, ": an OpenSSL older than 3.0?")));
    }
    return absl::StatusOr<const OpenSsl*>(ssl);
  }());
  return *loaded;
}

struct Endpoint {
  std::string host;  // without brackets
  std::string port;
};

absl::StatusOr<Endpoint> FindEndpoint(
    const ApiServerSettings& settings,
    const std::function<std::optional<std::string>(const std::string&)>& env) {
  if (settings.address.empty()) {
    const auto host = env("KUBERNETES_SERVICE_HOST");
    const auto port = env("KUBERNETES_SERVICE_PORT");
    if (!host || host->empty() || !port || port->empty()) {
      return absl::FailedPreconditionError(
          "no API server: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set (not "
          "in a pod?) and apiServer is empty");
    }
    return Endpoint{*host, *port};
  }
  const std::string& a = settings.address;
  const size_t colon = a.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == a.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("apiServer \"", a, "\" is not host:port (or [IPv6]:port)"));
  }
  std::string host = a.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return Endpoint{host, a.substr(colon + 1)};
}

bool IsIpAddress(const std::string& host) {
  unsigned char buf[sizeof(in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Milliseconds left until `deadline`, rounded up (0 only once it passed).
int Left(SteadyClock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - SteadyClock::now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

// Waits for `events` on `fd` until `deadline`.
absl::Status Wait(int fd, short events, SteadyClock::time_point deadline, const char* what) {
  for (;;) {
    const int left = Left(deadline);
    if (left == 0) return absl::DeadlineExceededError(absl::StrCat(what, ": timed out"));
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, left);
    if (n > 0) return absl::OkStatus();
    if (n < 0 && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("poll ", what, ": ", std::strerror(errno)));
    }
  }
}

using Addresses = std::unique_ptr<addrinfo, decltype(&freeaddrinfo)>;

// The addresses of `e` by `deadline`. An IP address is converted at once;
// a name is looked up by glibc's asynchronous getaddrinfo_a (getaddrinfo
// would wait as long as the resolver's own timeouts), continuing `pending`
// if a lookup is still running.
absl::StatusOr<Addresses> Resolve(const Endpoint& e, SteadyClock::time_point deadline,
                                  std::unique_ptr<ApiServer::PendingLookup>& pending);

// A connected non-blocking TCP socket to one of `addresses`.
absl::StatusOr<int> Connect(const addrinfo* addresses, SteadyClock::time_point deadline) {
  std::string last = "no address";
  for (const addrinfo* a = addresses; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last = absl::StrCat("socket: ", std::strerror(errno));
      continue;
    }
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      last = absl::StrCat("connect: ", std::strerror(errno));
      close(fd);
      continue;
    }
    absl::Status ready = Wait(fd, POLLOUT, deadline, "connect");
    int error = 0;
    socklen_t size = sizeof(error);
    if (ready.ok() && getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) == 0 && error == 0) {
      return fd;
    }
    last = ready.ok() ? absl::StrCat("connect: ", std::strerror(error)) : ready.ToString();
    close(fd);
    if (!ready.ok()) break;
  }
  return absl::UnavailableError(last);
}

// One TLS connection's calls, each driven to its end or the deadline.
class Tls {
 public:
  Tls(const OpenSsl& ssl, SSL* s, int fd, SteadyClock::time_point deadline)
      : ssl_(ssl), s_(s), fd_(fd), deadline_(deadline) {}

  // Runs `op` (an SSL_* call returning > 0 on success) until it succeeds,
  // polling while OpenSSL waits on the socket. 0: the peer closed.
  template <typename Op>
  absl::StatusOr<int> Drive(Op op, const char* what) {
    for (;;) {
      ssl_.ERR_clear_error();
      errno = 0;
      const int n = op();
      if (n > 0) return n;
      const int error = ssl_.SSL_get_error(s_, n);
      if (error == SSL_ERROR_ZERO_RETURN) return 0;
      if (error != SSL_ERROR_WANT_READ && error != SSL_ERROR_WANT_WRITE) {
        return absl::UnavailableError(absl::StrCat(what, ": ", Describe(error)));
      }
      absl::Status ready =
          Wait(fd_, error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline_, what);
      if (!ready.ok()) return ready;
    }
  }

 private:
  std::string Describe(int error) const {
    if (const long verify = ssl_.SSL_get_verify_result(s_); verify != X509_V_OK) {
      return absl::StrCat("the server's certificate is not trusted: ",
                          ssl_.X509_verify_cert_error_string(verify));
    }
    if (const unsigned long e = ssl_.ERR_get_error(); e != 0) {
      char text[256];
      ssl_.ERR_error_string_n(e, text, sizeof(text));
      return text;
    }
    if (error == SSL_ERROR_SYSCALL && errno != 0) return std::strerror(errno);
    return absl::StrCat("TLS error ", error);
  }

  const OpenSsl& ssl_;
  SSL* s_;
  int fd_;
  SteadyClock::time_point deadline_;
};

// The status and body of a whole HTTP/1.x answer.
absl::StatusOr<std::pair<int, std::string>> ParseAnswer(const std::string& answer) {
  const size_t end = answer.find("\r\n\r\n");
  if (end == std::string::npos) return absl::DataLossError("the answer ended in its headers");
  const std::vector<std::string> lines = absl::StrSplit(answer.substr(0, end), "\r\n");
  const std::vector<std::string> status = absl::StrSplit(lines[0], absl::MaxSplits(' ', 2));
  int code = 0;
  if (status.size() < 2 || !absl::StartsWith(status[0], "HTTP/1.") ||
      !absl::SimpleAtoi(status[1], &code)) {
    return absl::DataLossError(absl::StrCat("not an HTTP answer: \"", lines[0], "\""));
  }
  std::string body = answer.substr(end + 4);
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == std::string::npos) continue;
    const std::string name = absl::AsciiStrToLower(lines[i].substr(0, colon));
    const std::string value(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
    size_t length = 0;
    if (name == "content-length" && absl::SimpleAtoi(value, &length) && length != body.size()) {
      return absl::DataLossError(
          absl::StrCat("the answer's body has ", body.size(), " of its ", length, " bytes"));
    }
    if (name == "transfer-encoding" && !absl::EqualsIgnoreCase(value, "identity")) {
      return absl::DataLossError(absl::StrCat("an HTTP/1.0 request got a ", value, " answer"));
    }
  }
  return std::pair(code, std::move(body));
}

absl::Status HttpError(int code, const std::string& body) {
  // The API server explains itself in a Status object.
  std::string message;
  const nlohmann::json status = nlohmann::json::parse(body, nullptr, false);
  if (status.is_object() && status.contains("message") && status["message"].is_string()) {
    message = status["message"].get<std::string>();
  } else {
    message = std::string(absl::StripAsciiWhitespace(body.substr(0, 200)));
  }
  const std::string text = absl::StrCat("HTTP ", code, ": ", message);
  switch (code) {
    case 401:
      return absl::UnauthenticatedError(text);
    case 403:
      return absl::PermissionDeniedError(text);
    case 404:
      return absl::NotFoundError(text);
    default:
      return absl::UnavailableError(text);
  }
}

// Has the server's certificate checked for `host`: its address (no SNI
// for one) or its name.
absl::Status NameServer(const OpenSsl& ssl, SSL* s, const std::string& host) {
  const bool set =
      IsIpAddress(host)
          ? ssl.X509_VERIFY_PARAM_set1_ip_asc(ssl.SSL_get0_param(s), host.c_str()) == 1
          : ssl.SSL_set1_host(s, host.c_str()) == 1 &&
                ssl.SSL_ctrl(s, SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name,
                             const_cast<char*>(host.c_str())) == 1;
  if (set) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("cannot have the server's certificate checked for ", host));
}

absl::StatusOr<std::string> Fetch(const OpenSsl& ssl, const ApiServerSettings& settings,
                                  const Endpoint& e, const addrinfo* addresses,
                                  std::string_view path, SteadyClock::time_point deadline) {
  absl::StatusOr<std::string> token =
      topology::ReadFileBounded(settings.token_file, size_t{64} * 1024);
  if (!token.ok()) {
    return absl::Status(token.status().code(),
                        absl::StrCat("cannot read the token file ", token.status().message()));
  }
  const std::string bearer(absl::StripAsciiWhitespace(*token));
  // A token is printable and has no space: nothing else goes into a header.
  if (bearer.empty() ||
      std::any_of(bearer.begin(), bearer.end(), [](char c) { return c < 0x21 || c > 0x7e; })) {
    return absl::UnauthenticatedError(absl::StrCat(
        "the token file ", settings.token_file.string(),
        bearer.empty() ? " is empty" : " holds white space or control characters inside"));
  }
  std::unique_ptr<SSL_CTX, decltype(ssl.SSL_CTX_free)> ctx(ssl.SSL_CTX_new(ssl.TLS_client_method()),
                                                           ssl.SSL_CTX_free);
  if (!ctx) return absl::ResourceExhaustedError("cannot make a TLS context");
  ssl.SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  // The Content-Length check finds a cut answer.
  ssl.SSL_CTX_set_options(ctx.get(), SSL_OP_IGNORE_UNEXPECTED_EOF);
  if (ssl.SSL_CTX_load_verify_locations(ctx.get(), settings.ca_file.c_str(), nullptr) != 1) {
    return absl::UnavailableError(absl::StrCat(
        "cannot load the CA file ", settings.ca_file.string(), " (missing, or no certificate)"));
  }
  absl::StatusOr<int> fd = Connect(addresses, deadline);
  if (!fd.ok()) return fd.status();
  Fd socket(*fd);
  std::unique_ptr<SSL, decltype(ssl.SSL_free)> s(ssl.SSL_new(ctx.get()), ssl.SSL_free);
  if (!s || ssl.SSL_set_fd(s.get(), socket.get()) != 1) {
    return absl::ResourceExhaustedError("cannot make a TLS connection");
  }
  if (absl::Status named = NameServer(ssl, s.get(), e.host); !named.ok()) return named;
  Tls tls(ssl, s.get(), socket.get(), deadline);
  absl::StatusOr<int> done = tls.Drive([&] { return ssl.SSL_connect(s.get()); }, "TLS handshake");
  if (!done.ok()) return done.status();
  if (*done == 0) return absl::UnavailableError("the server closed during the TLS handshake");
  // HTTP/1.0: the server ends the body by closing, never chunks it.
  const std::string request = absl::StrCat(
      "GET ", std::string(path), " HTTP/1.0\r\nHost: ", e.host, "\r\nAuthorization: Bearer ",
      bearer, "\r\nAccept: application/json\r\nUser-Agent: efa-k8s-device-plugin\r\n\r\n");
  for (size_t sent = 0; sent < request.size();) {
    done = tls.Drive(
        [&] {
          return ssl.SSL_write(s.get(), request.data() + sent,
                               static_cast<int>(request.size() - sent));
        },
        "sending the request");
    if (!done.ok()) return done.status();
    if (*done == 0)
      return absl::UnavailableError("the server closed while the request was being sent");
    sent += static_cast<size_t>(*done);
  }
  constexpr size_t kMaxAnswer = ApiServer::kMaxBody + size_t{64} * 1024;
  std::string answer;
  char buf[16 * 1024];
  for (;;) {
    done = tls.Drive([&] { return ssl.SSL_read(s.get(), buf, sizeof(buf)); }, "reading the answer");
    if (!done.ok()) return done.status();
    if (*done == 0) break;
    answer.append(buf, static_cast<size_t>(*done));
    if (answer.size() > kMaxAnswer) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the answer is over ", kMaxAnswer, " bytes"));
    }
  }
  absl::StatusOr<std::pair<int, std::string>> parsed = ParseAnswer(answer);
  if (!parsed.ok()) return parsed.status();
  if (parsed->first != 200) return HttpError(parsed->first, parsed->second);
  if (parsed->second.size() > ApiServer::kMaxBody) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the body is over ", ApiServer::kMaxBody, " bytes"));
  }
  return std::move(parsed->second);
}

}  // namespace

struct ApiServer::PendingLookup {
  std::string host;
  std::string port;
  addrinfo hints{};
  gaicb request{};  // points into the three above
};

namespace {

absl::StatusOr<Addresses> Resolve(const Endpoint& e, SteadyClock::time_point deadline,
                                  std::unique_ptr<ApiServer::PendingLookup>& pending) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  if (IsIpAddress(e.host)) {
    hints.ai_flags |= AI_NUMERICHOST;  // never waits
    addrinfo* found = nullptr;
    if (const int rc = getaddrinfo(e.host.c_str(), e.port.c_str(), &hints, &found); rc != 0) {
      return absl::UnavailableError(absl::StrCat("cannot resolve it: ", gai_strerror(rc)));
    }
    return Addresses(found, freeaddrinfo);
  }
  if (pending && (pending->host != e.host || pending->port != e.port)) {
    if (gai_error(&pending->request) == EAI_INPROGRESS) {
      return absl::UnavailableError(
          absl::StrCat("cannot resolve it: the lookup of ", pending->host, " is still running"));
    }
    Addresses stale(pending->request.ar_result, freeaddrinfo);
    pending.reset();
  }
  if (!pending) {
    pending = std::make_unique<ApiServer::PendingLookup>();
    pending->host = e.host;
    pending->port = e.port;
    pending->hints = hints;
    pending->request.ar_name = pending->host.c_str();
    pending->request.ar_service = pending->port.c_str();
    pending->request.ar_request = &pending->hints;
    gaicb* start[] = {&pending->request};
    if (const int rc = getaddrinfo_a(GAI_NOWAIT, start, 1, nullptr); rc != 0) {
      pending.reset();
      return absl::UnavailableError(absl::StrCat("cannot resolve it: ", gai_strerror(rc)));
    }
  }
  const gaicb* const wait[] = {&pending->request};
  for (;;) {
    if (const int rc = gai_error(&pending->request); rc != EAI_INPROGRESS) {
      Addresses found(pending->request.ar_result, freeaddrinfo);
      pending.reset();
      if (rc != 0)
        return absl::UnavailableError(absl::StrCat("cannot resolve it: ", gai_strerror(rc)));
      return found;
    }
    const int left = Left(deadline);
    if (left == 0) {
      return absl::DeadlineExceededError(
          "resolving it: timed out (the lookup goes on, for the next GET)");
    }
    const timespec wait_for{left / 1000, (left % 1000) * 1000000L};
    gai_suspend(wait, 1, &wait_for);  // back when done, at the timeout or on a signal
  }
}

}  // namespace

ApiServer::~ApiServer() {
  absl::MutexLock lock(&mu_);
  if (!pending_) return;
  // A lookup glibc's thread is still making writes into it: left to it.
  if (gai_cancel(&pending_->request) == EAI_NOTCANCELED) {
    static_cast<void>(pending_.release());
    return;
  }
  if (pending_->request.ar_result != nullptr) freeaddrinfo(pending_->request.ar_result);
}

ApiServer::ApiServer(ApiServerSettings settings,
                     std::function<std::optional<std::string>(const std::string&)> env)
    : settings_(std::move(settings)), env_(std::move(env)) {
  if (!env_) {
    env_ = [](const std::string& name) -> std::optional<std::string> {
      const char* value = std::getenv(name.c_str());
      return value == nullptr ? std::nullopt : std::optional<std::string>(value);
    };
  }
}

absl::StatusOr<std::string> ApiServer::Get(std::string_view path,
                                           std::chrono::milliseconds timeout) const {
  const SteadyClock::time_point deadline = SteadyClock::now() + timeout;
  absl::StatusOr<Endpoint> e = FindEndpoint(settings_, env_);
  if (!e.ok()) return e.status();
  const bool v6 = e->host.find(':') != std::string::npos;
  const std::string where = absl::StrCat("GET https://", v6 ? "[" : "", e->host, v6 ? "]" : "", ":",
                                         e->port, std::string(path));
  absl::StatusOr<std::string> body = [&]() -> absl::StatusOr<std::string> {
    absl::StatusOr<const OpenSsl*> ssl = LoadOpenSsl();
    if (!ssl.ok()) return ssl.status();
    absl::StatusOr<Addresses> addresses = [&] {
      absl::MutexLock lock(&mu_);
      return Resolve(*e, deadline, pending_);
    }();
    if (!addresses.ok()) return addresses.status();
    return Fetch(**ssl, settings_, *e, addresses->get(), path, deadline);
  }();
  if (!body.ok()) {
    return absl::Status(body.status().code(), absl::StrCat(where, ": ", body.status().message()));
  }
  return body;
}

}  // namespace efa::plugin
