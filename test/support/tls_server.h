// An HTTPS server for the tests that stands in for the Kubernetes API
// server (cpp-httplib's SSLServer on 127.0.0.1, OpenSSL under it), with a
// self-signed certificate made for it: PEM files the client is given as
// its CA file. Answers what the test sets per path; records each request's
// Authorization header. SilentListener stands in for one that never
// answers.
//
//   TlsServer api(dir.path());
//   api.Answer("/apis/...", 200, claim_json);
//   ApiServerSettings s{api.address(), token_file, api.ca_file()};
#pragma once

#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "httplib.h"

namespace efa::testing {

// A self-signed certificate for `san` ("IP:127.0.0.1") and its key, written
// to `cert` and `key` (PEM).
inline void WriteSelfSignedCertificate(const std::filesystem::path& cert,
                                       const std::filesystem::path& key, const std::string& san) {
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> pkey(EVP_EC_gen("P-256"), EVP_PKEY_free);
  std::unique_ptr<X509, decltype(&X509_free)> x(X509_new(), X509_free);
  if (!pkey || !x) throw std::runtime_error("OpenSSL: cannot make a key or certificate");
  X509_set_version(x.get(), 2);
  static long serial = 1;
  ASN1_INTEGER_set(X509_get_serialNumber(x.get()), serial++);
  X509_gmtime_adj(X509_getm_notBefore(x.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(x.get()), 24 * 3600);
  X509_set_pubkey(x.get(), pkey.get());
  X509_NAME* name = X509_get_subject_name(x.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("efa-test-api-server"), -1, -1,
                             0);
  X509_set_issuer_name(x.get(), name);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, x.get(), x.get(), nullptr, nullptr, 0);
  for (const auto& [nid, value] :
       {std::pair{NID_subject_alt_name, san},
        std::pair{NID_basic_constraints, std::string("critical,CA:TRUE")}}) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
    if (ext == nullptr) throw std::runtime_error("OpenSSL: bad extension " + value);
    X509_add_ext(x.get(), ext, -1);
    X509_EXTENSION_free(ext);
  }
  if (X509_sign(x.get(), pkey.get(), EVP_sha256()) == 0) {
    throw std::runtime_error("OpenSSL: cannot sign the certificate");
  }
  std::unique_ptr<FILE, decltype(&fclose)> c(fopen(cert.c_str(), "w"), fclose);
  std::unique_ptr<FILE, decltype(&fclose)> k(fopen(key.c_str(), "w"), fclose);
  if (!c || !k || PEM_write_X509(c.get(), x.get()) != 1 ||
      PEM_write_PrivateKey(k.get(), pkey.get(), nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    throw std::runtime_error("cannot write " + cert.string() + " or " + key.string());
  }
}

class TlsServer {
 public:
  // Serves on 127.0.0.1 with a certificate for `san`, files under `dir`.
  explicit TlsServer(const std::filesystem::path& dir, const std::string& san = "IP:127.0.0.1")
      : ca_file_(dir / "api-ca.crt") {
    WriteSelfSignedCertificate(ca_file_, dir / "api.key", san);
    server_ = std::make_unique<httplib::SSLServer>(ca_file_.c_str(), (dir / "api.key").c_str());
    if (!server_->is_valid()) throw std::runtime_error("httplib: cannot make the TLS server");
    server_->Get(".*", [this](const httplib::Request& request, httplib::Response& response) {
      std::lock_guard<std::mutex> lock(mu_);
      authorizations_.push_back(request.get_header_value("Authorization"));
      auto it = answers_.find(request.path);
      if (it == answers_.end()) {
        response.status = 404;
        response.set_content(R"({"kind":"Status","message":"not found here"})", "application/json");
        return;
      }
      response.status = it->second.first;
      response.set_content(it->second.second, "application/json");
    });
    port_ = server_->bind_to_any_port("127.0.0.1");
    if (port_ <= 0) throw std::runtime_error("httplib: cannot bind 127.0.0.1");
    // Listening already: connections wait in the backlog until it accepts.
    thread_ = std::thread([this] { server_->listen_after_bind(); });
  }
  ~TlsServer() {
    // stop() ends the accept loop only once it runs.
    while (!server_->is_running()) std::this_thread::yield();
    server_->stop();
    thread_.join();
  }
  TlsServer(const TlsServer&) = delete;
  TlsServer& operator=(const TlsServer&) = delete;

  void Answer(const std::string& path, int status, std::string body) {
    std::lock_guard<std::mutex> lock(mu_);
    answers_[path] = {status, std::move(body)};
  }
  std::vector<std::string> Authorizations() const {
    std::lock_guard<std::mutex> lock(mu_);
    return authorizations_;
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  const std::filesystem::path& ca_file() const { return ca_file_; }

 private:
  std::filesystem::path ca_file_;
  std::unique_ptr<httplib::SSLServer> server_;
  int port_ = 0;
  std::thread thread_;
  mutable std::mutex mu_;
  std::map<std::string, std::pair<int, std::string>> answers_;
  std::vector<std::string> authorizations_;
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

}  // namespace efa::testing
