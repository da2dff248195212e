// The daemon's HTTP endpoints read as Prometheus and the kubelet's prober do:
// over real HTTP (cpp-httplib's client) on a loopback port.
#pragma once

#include <httplib.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "test/support/devices.h"
#include "test/support/exposition.h"

namespace efa::testing {

struct HttpReply {
  int status = 0;  // 0: no answer
  std::string content_type;
  std::string body;
};

// GET http://127.0.0.1:<port><path>, waiting at most 5 s to connect and
// 5 s for the answer.
inline HttpReply HttpGet(uint16_t port, const std::string& path) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(std::chrono::seconds(5));
  client.set_read_timeout(std::chrono::seconds(5));
  auto result = client.Get(path);
  if (!result) return {};
  return {result->status, result->get_header_value("Content-Type"), result->body};
}

// Samples by series as written (ParseMetrics).
using Metrics = std::map<std::string, double>;

// The samples /metrics on `port` answers; none unless it answers 200.
inline Metrics Scrape(uint16_t port) {
  const HttpReply reply = HttpGet(port, "/metrics");
  return reply.status == 200 ? ParseMetrics(reply.body) : Metrics{};
}

// Scrapes `port` until `want` holds, at most kDeadline: the daemon publishes
// its state once per loop pass and the RPC metrics after each handler
// returns, with no event a test could wait on. Returns whether it held.
inline bool WaitScrape(uint16_t port, const std::function<bool(const Metrics&)>& want) {
  for (const auto deadline = std::chrono::steady_clock::now() + kDeadline;
       std::chrono::steady_clock::now() < deadline;) {
    if (want(Scrape(port))) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// Whether every (series, value) of `want` is in a scrape.
inline std::function<bool(const Metrics&)> Has(Metrics want) {
  return [want = std::move(want)](const Metrics& m) {
    for (const auto& [series, value] : want) {
      auto it = m.find(series);
      if (it == m.end() || it->second != value) return false;
    }
    return true;
  };
}

}  // namespace efa::testing
