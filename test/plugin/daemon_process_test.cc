// The real binary, as a process: start-to-registered, SIGHUP and SIGTERM.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
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
