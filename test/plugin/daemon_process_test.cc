// The real binary, as a process: start-to-registered, SIGHUP and SIGTERM.
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "test/fake_kubelet/fake_kubelet.h"
#include "test/sim/sim_root.h"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using efa::sim::SimRoot;
using efa::testing::FakeKubelet;

namespace {

constexpr char kEfa[] = "vpc.amazonaws.com/efa";

// A child process running the daemon; killed if the test leaves it behind.
class DaemonProcess {
 public:
  explicit DaemonProcess(std::vector<std::string> args) {
    args.insert(args.begin(), EFA_PLUGIN_BINARY);
    pid_ = ::fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  }
  ~DaemonProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (pidfd_ >= 0) ::close(pidfd_);
  }
  void Signal(int sig) { ::kill(pid_, sig); }
  // Waits for the process to exit; returns its exit status or -1 on timeout.
  int Wait(std::chrono::milliseconds timeout) {
    pollfd p{pidfd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return -1;
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
  int pidfd_ = -1;
};

}  // namespace

TEST_CASE(
    "The daemon binary registers on a p5 node, re-registers on SIGHUP and stops on "
    "SIGTERM",
    "[daemon][process]") {
  SimRoot sim("p5.48xlarge");
  const fs::path kubelet_dir = sim.path() / "kubelet";
  FakeKubelet kubelet(kubelet_dir / "device-plugins");
  REQUIRE(kubelet.Start().ok());

  const auto start = std::chrono::steady_clock::now();
  DaemonProcess daemon({"--kubelet-dir", kubelet_dir.string(), "--sysfs-root", sim.sys().string(),
                        "--dev-root", (sim.path() / "dev").string(), "--cdi-spec-dirs",
                        (sim.path() / "etc/cdi").string(), "--log-level", "warn",
                        "--metrics-address", "127.0.0.1:0"});
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

TEST_CASE("The daemon binary removes a stale socket before serving", "[daemon][process]") {
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
  DaemonProcess daemon({"--kubelet-dir", kubelet_dir.string(), "--sysfs-root", sim.sys().string(),
                        "--dev-root", (sim.path() / "dev").string(), "--cdi-spec-dirs",
                        (sim.path() / "etc/cdi").string(), "--log-level", "warn",
                        "--metrics-address", "127.0.0.1:0"});
  REQUIRE(kubelet.WaitForRegistrations(kEfa, 1, 10s));
  daemon.Signal(SIGINT);
  CHECK(daemon.Wait(10s) == 0);
}
