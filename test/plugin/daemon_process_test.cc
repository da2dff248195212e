// The real binary, as a process: start-to-registered, SIGHUP and SIGTERM.
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "test/bench/child_process.h"
#include "test/fake_kubelet/fake_kubelet.h"
#include "test/sim/sim_root.h"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using efa::bench::ChildProcess;
using efa::sim::SimRoot;
using efa::testing::FakeKubelet;

namespace {

constexpr char kEfa[] = "vpc.amazonaws.com/efa";

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Whether `log` holds `line` within `timeout` (inotify on its directory
// between looks).
bool WaitForLogLine(const fs::path& log, const std::string& line,
                    std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const int fd = ::inotify_init1(IN_CLOEXEC);
  ::inotify_add_watch(fd, log.parent_path().c_str(), IN_MODIFY | IN_CREATE);
  bool found = false;
  while (!(found = ReadAll(log).find(line) != std::string::npos)) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) != 1) break;
    char buf[4096];
    [[maybe_unused]] ssize_t n = ::read(fd, buf, sizeof buf);
  }
  ::close(fd);
  return found;
}

long long Threads(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoll(line.substr(8));
  }
  return -1;
}

}  // namespace

TEST_CASE(
    "The daemon binary registers on a p5 node, re-registers on SIGHUP and stops on "
    "SIGTERM",
    "[daemon][process][concurrency]") {
  SimRoot sim("p5.48xlarge");
  const fs::path kubelet_dir = sim.path() / "kubelet";
  FakeKubelet kubelet(kubelet_dir / "device-plugins");
  REQUIRE(kubelet.Start().ok());

  const auto start = std::chrono::steady_clock::now();
  ChildProcess daemon({EFA_PLUGIN_BINARY, "--kubelet-dir", kubelet_dir.string(), "--sysfs-root",
                       sim.sys().string(), "--dev-root", (sim.path() / "dev").string(),
                       "--cdi-spec-dirs", (sim.path() / "etc/cdi").string(), "--log-level", "warn",
                       "--metrics-address", "127.0.0.1:0", "--probe-address", "127.0.0.1:0"},
                      sim.path() / "daemon.log");
  REQUIRE(kubelet.WaitForRegistrations(kEfa, 1, 10s));
  const auto registered = std::chrono::steady_clock::now();
  std::printf("start -> registered: %.1f ms\n",
              std::chrono::duration<double, std::milli>(registered - start).count());
  REQUIRE(kubelet.WaitForDevices(
      kEfa, [](const auto& d) { return d.size() == 32; }, 10s));

  daemon.Signal(SIGHUP);
  REQUIRE(kubelet.WaitForRegistrations(kEfa, 2, 10s));

  const fs::path socket = kubelet_dir / "device-plugins/aws-efa-device-plugin.sock";
  CHECK(fs::is_socket(socket));
  daemon.Signal(SIGTERM);
  CHECK(daemon.Wait(10s) == 0);
  CHECK_FALSE(fs::exists(socket));
  CHECK(kubelet.WaitForStreaming(kEfa, false, 10s));
}

TEST_CASE("The daemon binary removes a stale socket before serving",
          "[daemon][process][concurrency]") {
  SimRoot sim("p4d.24xlarge");
  const fs::path kubelet_dir = sim.path() / "kubelet";
  fs::create_directories(kubelet_dir / "device-plugins");
  // A regular file where the socket goes, as a crashed run may leave one.
  {
    std::FILE* f =
        std::fopen((kubelet_dir / "device-plugins/aws-efa-device-plugin.sock").c_str(), "w");
    std::fclose(f);
  }
  FakeKubelet kubelet(kubelet_dir / "device-plugins");
  REQUIRE(kubelet.Start().ok());
  ChildProcess daemon({EFA_PLUGIN_BINARY, "--kubelet-dir", kubelet_dir.string(), "--sysfs-root",
                       sim.sys().string(), "--dev-root", (sim.path() / "dev").string(),
                       "--cdi-spec-dirs", (sim.path() / "etc/cdi").string(), "--log-level", "warn",
                       "--metrics-address", "127.0.0.1:0", "--probe-address", "127.0.0.1:0"},
                      sim.path() / "daemon.log");
  REQUIRE(kubelet.WaitForRegistrations(kEfa, 1, 10s));
  daemon.Signal(SIGINT);
  CHECK(daemon.Wait(10s) == 0);
}

TEST_CASE(
    "The daemon binary on a node without EFA runs no gRPC until an EFA appears, then serves and "
    "registers",
    "[daemon][process][concurrency]") {
  SimRoot sim("no-efa");
  SimRoot p4d("p4d.24xlarge");
  const fs::path kubelet_dir = sim.path() / "kubelet";
  FakeKubelet kubelet(kubelet_dir / "device-plugins");
  REQUIRE(kubelet.Start().ok());
  const fs::path log = sim.path() / "daemon.log";
  ChildProcess daemon(
      {EFA_PLUGIN_BINARY, "--kubelet-dir", kubelet_dir.string(), "--sysfs-root", sim.sys().string(),
       "--dev-root", (sim.path() / "dev").string(), "--cdi-spec-dirs",
       (sim.path() / "etc/cdi").string(), "--rescan-interval", "100ms", "--metrics-address",
       "127.0.0.1:0", "--probe-address", "127.0.0.1:0"},
      log);
  REQUIRE(WaitForLogLine(log, "no EFA on this node; idle until one appears", 10s));
  // Idle: no plugin socket, no gRPC threads (the owner loop and the two
  // HTTP listeners' accepting threads; workers start with the first
  // connection).
  const fs::path socket = kubelet_dir / "device-plugins/aws-efa-device-plugin.sock";
  CHECK_FALSE(fs::exists(socket));
  CHECK(Threads(daemon.pid()) == 3);
  CHECK(kubelet.registrations(kEfa) == 0);

  // An EFA appears: the p4d's four, hot-plugged into the same root.
  fs::remove_all(sim.sys());
  fs::copy(p4d.sys(), sim.sys(), fs::copy_options::recursive | fs::copy_options::copy_symlinks);
  for (int n = 0; n < 4; ++n) sim.RestoreUverbs(n);  // char devices do not copy
  REQUIRE(kubelet.WaitForRegistrations(kEfa, 1, 10s));
  CHECK(kubelet.WaitForDevices(
      kEfa,
      [](const auto& d) {
        return d.size() == 4 && std::all_of(d.begin(), d.end(),
                                            [](const auto& x) { return x.health() == "Healthy"; });
      },
      10s));
  CHECK(fs::is_socket(socket));
  daemon.Signal(SIGTERM);
  CHECK(daemon.Wait(10s) == 0);
}
