// A tiny HTTP/1.1 client for tests: one request per connection over a real
// TCP socket to 127.0.0.1, reading until the server closes. Also a parser
// for the Prometheus text exposition format, enough to look samples up.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>

namespace efa::testing {

struct HttpReply {
  int status = 0;                              // 0: no answer (connection failed or timed out)
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};

// Sends `request` (the whole request text) and returns the parsed reply.
inline HttpReply HttpExchange(uint16_t port, const std::string& request,
                              std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  HttpReply reply;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return reply;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return reply;
  }
  size_t sent = 0;
  while (sent < request.size()) {
    ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string raw;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    char buf[4096];
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    raw.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  const size_t head_end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.1 ", 0) != 0 || head_end == std::string::npos) return reply;
  reply.status = std::atoi(raw.c_str() + 9);
  size_t pos = raw.find("\r\n") + 2;
  while (pos < head_end) {
    size_t end = raw.find("\r\n", pos);
    std::string line = raw.substr(pos, end - pos);
    size_t colon = line.find(':');
    if (colon != std::string::npos) {
      std::string name = line.substr(0, colon);
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      size_t v = colon + 1;
      while (v < line.size() && line[v] == ' ') ++v;
      reply.headers[name] = line.substr(v);
    }
    pos = end + 2;
  }
  reply.body = raw.substr(head_end + 4);
  return reply;
}

inline HttpReply HttpGet(uint16_t port, const std::string& path) {
  return HttpExchange(port, "GET " + path + " HTTP/1.1\r\nHost: localhost\r\n\r\n");
}

// Samples of a Prometheus text exposition, keyed by the series exactly as
// written (`name{label="value"}`); comments are skipped.
inline std::map<std::string, double> ParseMetrics(const std::string& text) {
  std::map<std::string, double> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty() || line[0] == '#') continue;
    size_t space = line.rfind(' ');
    if (space == std::string::npos) continue;
    out[line.substr(0, space)] = std::strtod(line.c_str() + space + 1, nullptr);
  }
  return out;
}

}  // namespace efa::testing
