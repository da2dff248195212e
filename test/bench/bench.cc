#include "test/bench/bench.h"

#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "absl/strings/str_format.h"
#include "grpcpp/grpcpp.h"
#include "test/support/daemon_log.h"
#include "test/support/proc_stats.h"

namespace efa::bench {

void Fail(const std::string& message) { throw std::runtime_error(message); }

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}
double Median(std::vector<double> v) { return Percentile(std::move(v), 0.5); }
double Max(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

std::string Us(double s) { return absl::StrFormat("%.1f µs", s * 1e6); }
std::string Ms(double s) { return absl::StrFormat("%.1f ms", s * 1e3); }
std::string Mib(long long kib) {
  return absl::StrFormat("%.1f MiB", static_cast<double>(kib) / 1024);
}
std::string WorstAndMedian(const std::vector<double>& v) {
  return absl::StrFormat("%s (median %s)", Ms(Max(v)), Ms(Median(v)));
}
std::string Count(long n) {
  return n % 1000 == 0 ? absl::StrFormat("%dk", n / 1000) : absl::StrFormat("%d", n);
}

std::optional<std::string> ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

DirectoryWatch::DirectoryWatch(const fs::path& dir, uint32_t mask)
    : fd_(inotify_init1(IN_CLOEXEC)) {
  if (fd_ < 0 || inotify_add_watch(fd_, dir.c_str(), mask) < 0) Fail(dir.string() + ": inotify");
}
DirectoryWatch::~DirectoryWatch() { ::close(fd_); }
bool DirectoryWatch::Wait(std::chrono::milliseconds timeout) const {
  pollfd p{fd_, POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(timeout.count())) == 1;
}

std::unique_ptr<v1beta1::DevicePlugin::Stub> Connect(const fs::path& socket) {
  grpc::ChannelArguments args;
  // The server may not be up yet: retry the connection soon, not after 1 s.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 10);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 100);
  auto channel = grpc::CreateCustomChannel("unix:" + socket.string(),
                                           grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + kDeadline)) {
    Fail(socket.string() + ": nothing serves there after 10 s");
  }
  return v1beta1::DevicePlugin::NewStub(channel);
}

std::string MemoryDetail(const std::string& when, pid_t daemon, pid_t echo) {
  auto one = [](pid_t pid) {
    const std::string status = "/proc/" + std::to_string(pid) + "/status";
    return absl::StrFormat("anonymous %s, file pages %s, %d threads",
                           Mib(efa::testing::StatusField(status, "RssAnon")),
                           Mib(efa::testing::StatusField(status, "RssFile")),
                           efa::testing::ThreadCount(pid));
  };
  return absl::StrFormat("- RSS %s: daemon %s; echo %s", when, one(daemon), one(echo));
}

void WaitForLogLine(const fs::path& log, const std::string& line) {
  if (!efa::testing::WaitForLogLine(log, line, kDeadline)) {
    Fail(log.string() + ": no \"" + line + "\" line");
  }
}

int LoggedPort(const fs::path& log, const std::string& what) {
  const int port = efa::testing::LoggedPort(log, what);
  if (port == 0) Fail(log.string() + ": no port logged for " + what);
  return port;
}

Bench::Bench(Settings s)
    : settings(std::move(s)),
      p5_spec(*efa::sim::FindMachine("p5.48xlarge")),
      p5(p5_spec),
      kubelet(testing::FakeKubelet::ForKubeletDir(p5.path() / "kubelet")),
      gpus(p5_spec, efa::testing::AcceleratorKind::kNvidiaGpu,
           p5.path() / "kubelet/device-plugins") {
  fs::create_directories(logs());
  if (auto status = kubelet.Start(); !status.ok()) Fail(std::string(status.message()));
  if (auto status = gpus.Start(); !status.ok()) Fail(std::string(status.message()));
}

fs::path Bench::logs() const {
  return settings.logs.empty() ? p5.path() / "logs" : fs::path(settings.logs);
}

std::vector<std::string> Bench::DaemonArgs(const sim::SimRoot& sim,
                                           const fs::path& kubelet_dir) const {
  std::vector<std::string> args = {settings.plugin};
  for (const std::string& flag : sim.DaemonFlags()) args.push_back(flag);
  if (!kubelet_dir.empty()) {
    *(std::find(args.begin(), args.end(), "--kubelet-dir") + 1) = kubelet_dir.string();
  }
  args.insert(args.end(), {"--metrics-address", "127.0.0.1:0", "--probe-address", "127.0.0.1:0"});
  return args;
}

}  // namespace efa::bench
