// The real binary, as a process: start-to-registered, SIGHUP and SIGTERM;
// its metrics under sharing, scraped over HTTP.
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "test/fake_kubelet/fake_kubelet.h"
#include "test/fake_kubelet/serve_unix.h"
#include "test/sim/sim_root.h"
#include "test/support/child_process.h"
#include "test/support/devices.h"
#include "test/support/exposition.h"
#include "test/support/proc_stats.h"
#include "test/support/scrape.h"
#include "test/support/temp_dir.h"
#include "test/support/test_node.h"
#include "topology/replica_id.h"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using efa::sim::SimRoot;
using efa::testing::ChildProcess;
using efa::testing::DaemonRun;
using efa::testing::HttpGet;
using efa::testing::ListenOnUnixSocket;
using efa::testing::ReadFile;
using efa::testing::TestNode;

namespace {

using efa::testing::kEfa;
// Threads a sanitizer's runtime adds to every process (TSan's background
// thread).
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr int kRuntimeThreads = 1;
#else
constexpr int kRuntimeThreads = 0;
#endif
#elif defined(__SANITIZE_THREAD__)
constexpr int kRuntimeThreads = 1;
#else
constexpr int kRuntimeThreads = 0;
#endif
using efa::testing::kDeadline;
// The daemon's listener of every route, as its log line names it
// (TestNode::LoggedPort).
constexpr char kMetrics[] = "/metrics, /healthz and /readyz";

// The value of the unlabelled sample `series` in a scrape, as written
// ("" when absent).
std::string SampleText(const std::string& scrape, const std::string& series) {
  const std::string key = "\n" + series + " ";
  const size_t at = scrape.find(key);
  if (at == std::string::npos) return "";
  const size_t from = at + key.size();
  return scrape.substr(from, scrape.find('\n', from) - from);
}

// The samples of `family` in a scrape read back by the independent parser
// (exposition_summary.py --values: sorted lines like
// `name{efa="rdmap16s27"} 3.0`).
std::string Samples(const std::string& values, const std::string& family) {
  std::string out;
  std::istringstream in(values);
  for (std::string line; std::getline(in, line);) {
    if (absl::StartsWith(line, family + "{")) absl::StrAppend(&out, line, "\n");
  }
  return out;
}

// The processes whose parent is `parent` and whose command is `comm` (any
// when empty), by PID (as /proc/<pid>/stat says, in this PID namespace).
std::vector<pid_t> Children(pid_t parent, const std::string& comm = "") {
  std::vector<pid_t> out;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = ReadFile(entry.path() / "stat");
    const size_t open = stat.find('('), close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    // "pid (comm) state ppid ..."
    std::istringstream rest(stat.substr(close + 1));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent && (comm.empty() || stat.substr(open + 1, close - open - 1) == comm)) {
      out.push_back(std::stoi(name));
    }
  }
  return out;
}

// The PID of `pid` inside its own (innermost) PID namespace: the last field
// of NSpid in /proc/<pid>/status; 0 when unknown.
pid_t InnermostPid(pid_t pid) {
  std::istringstream in(ReadFile("/proc/" + std::to_string(pid) + "/status"));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("NSpid:", 0) != 0) continue;
    std::istringstream fields(line.substr(6));
    pid_t last = 0;
    for (pid_t p; fields >> p;) last = p;
    return last;
  }
  return 0;
}

}  // namespace

TEST_CASE(
    "The daemon binary registers on a p5 node, re-registers on SIGHUP and stops on "
    "SIGTERM",
    "[daemon][process][concurrency]") {
  TestNode node({.machine = "p5.48xlarge", .pod_resources = false, .run = DaemonRun::kLater});
  const auto start = std::chrono::steady_clock::now();
  node.StartBinary({"--log-level", "warn", "--metrics-address", "127.0.0.1:0", "--probe-address",
                    "127.0.0.1:0"});
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, 10s));
  const auto registered = std::chrono::steady_clock::now();
  std::printf("start -> registered: %.1f ms\n",
              std::chrono::duration<double, std::milli>(registered - start).count());
  REQUIRE(node.kubelet().WaitForDevices(
      kEfa, [](const auto& d) { return d.size() == 32; }, 10s));

  node.process().Signal(SIGHUP);
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 2, 10s));

  const fs::path socket = node.device_plugin_dir() / "efa/aws-efa-device-plugin.sock";
  CHECK(fs::is_socket(socket));
  node.process().Signal(SIGTERM);
  CHECK(node.process().Wait(10s) == 0);
  CHECK_FALSE(fs::exists(socket));
  CHECK(node.kubelet().WaitForStreaming(kEfa, false, 10s));
}

TEST_CASE("The daemon binary removes a stale socket before serving",
          "[daemon][process][concurrency]") {
  TestNode node({.machine = "p4d.24xlarge",
                 // A regular file where the socket goes, as a crashed run may
                 // leave one.
                 .prepare =
                     [](SimRoot& sim) {
                       const fs::path dir = sim.path() / "kubelet/device-plugins/efa";
                       fs::create_directories(dir);
                       efa::testing::WriteFile(dir / "aws-efa-device-plugin.sock", "");
                     },
                 .pod_resources = false,
                 .run = DaemonRun::kBinary,
                 .flags = {"--log-level", "warn", "--metrics-address", "127.0.0.1:0",
                           "--probe-address", "127.0.0.1:0"}});
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, 10s));
  node.process().Signal(SIGINT);
  CHECK(node.process().Wait(10s) == 0);
}

TEST_CASE(
    "The daemon binary stands aside while another device plugin serves its socket, and takes "
    "over when it stops",
    "[daemon][process][concurrency]") {
  // Another device plugin on the socket: the plugin's host service, say,
  // while this daemon runs in the chart's pod.
  TestNode node({.machine = "p4d.24xlarge", .pod_resources = false, .run = DaemonRun::kLater});
  fs::create_directories(node.device_plugin_dir() / "efa");
  const fs::path socket = node.device_plugin_dir() / "efa/aws-efa-device-plugin.sock";
  const int other = ListenOnUnixSocket(socket);
  REQUIRE(other >= 0);
  struct stat before {};
  REQUIRE(::stat(socket.c_str(), &before) == 0);
  node.StartBinary({"--log-level", "info", "--metrics-address", "127.0.0.1:0", "--probe-address",
                    "", "--rescan-interval", "1s"});
  REQUIRE(node.WaitLog("standing aside, neither serving nor registering while it runs"));
  // Ready (its steady state on such a node: a DaemonSet rollout must not
  // wait for it) from the owner loop's next pass, unregistered, the
  // other's socket left in place.
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  auto ready = HttpGet(node.LoggedPort(kMetrics), "/readyz");
  while (ready.status != 200 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(100ms);
    ready = HttpGet(node.LoggedPort(kMetrics), "/readyz");
  }
  CHECK(ready.status == 200);
  CHECK(absl::StrContains(ready.body, "another device plugin serves vpc.amazonaws.com/efa"));
  CHECK_FALSE(node.kubelet().WaitForRegistrations(kEfa, 1, 3s));
  struct stat still {};
  REQUIRE(::stat(socket.c_str(), &still) == 0);
  CHECK(still.st_ino == before.st_ino);

  // The other stops and its socket goes, as this daemon's does on SIGTERM:
  // this one serves and registers.
  ::close(other);
  fs::remove(socket);
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, 15s));
  CHECK(node.WaitLog("the other device plugin left"));
  // Said once, not at every look.
  CHECK(node.LogLines("another device plugin serves") == 1);
  CHECK(node.process().Stop(kDeadline) == 0);
}

TEST_CASE(
    "With sharing the daemon binary counts allocations per physical EFA in its metrics, renamed",
    "[daemon][process][sharing][metrics][concurrency]") {
  // renameByDefault: the resource is vpc.amazonaws.com/efa.shared.
  constexpr char kShared[] = "vpc.amazonaws.com/efa.shared";
  TestNode node(
      {.machine = "p4d.24xlarge",
       .run = DaemonRun::kBinary,
       .flags = {"--log-level", "info", "--metrics-address", "127.0.0.1:0", "--probe-address", "",
                 "--sharing-replicas", "4", "--sharing-rename-by-default"}});
  auto& kubelet = node.kubelet();
  REQUIRE(kubelet.WaitForRegistrations(kShared, 1, kDeadline));
  REQUIRE(kubelet.WaitForDevices(
      kShared, [](const auto& d) { return d.size() == 16; }, kDeadline));
  const int port = node.LoggedPort(kMetrics);
  REQUIRE(port > 0);

  std::map<std::string, int> want;  // physical EFA -> containers given it
  int containers = 0, efas_given = 0;
  auto given = [&](const std::vector<std::string>& ids) {
    std::set<std::string> physical;
    for (const auto& id : ids) physical.insert(efa::topology::ParseReplicaId(id)->ibdev);
    for (const auto& efa : physical) ++want[efa];
    ++containers;
    efas_given += static_cast<int>(physical.size());
    return physical.size();
  };
  auto allocate = [&](const std::vector<std::vector<std::string>>& containers_ids) {
    v1beta1::AllocateRequest request;
    for (const auto& ids : containers_ids) {
      auto* c = request.add_container_requests();
      for (const auto& id : ids) c->add_devices_ids(id);
    }
    v1beta1::AllocateResponse response;
    grpc::Status status = kubelet.Allocate(kShared, request, &response);
    if (status.ok()) {
      for (const auto& ids : containers_ids) given(ids);
    }
    return status;
  };
  // Two replicas of one EFA in a container count once; two containers of
  // one call sharing an EFA count twice.
  REQUIRE(allocate({{"rdmap16s27::0", "rdmap16s27::2", "rdmap32s27::1"}}).ok());
  REQUIRE(allocate({{"rdmap16s27::1"}, {"rdmap16s27::3", "rdmap144s27::0"}}).ok());
  // Pods admitted by the kubelet's device manager (GetPreferredAllocation,
  // then Allocate): four of 2 EFAs each.
  for (int i = 0; i < 4; ++i) {
    const std::string uid = absl::StrCat("u", i);
    REQUIRE(kubelet.AdmitContainer(absl::StrCat("pod-", i), "default", uid, "main", {{kShared, 2}})
                .ok());
    // Distinct EFAs: the policy spreads first.
    CHECK(given(kubelet.container_devices(uid, "main", kShared)) == 2);
  }
  // A refused request counts nothing.
  CHECK(allocate({{"rdmap160s27::0", "rdmap160s27::4"}}).error_code() ==
        grpc::StatusCode::INVALID_ARGUMENT);

  std::string want_samples;  // sorted, as the parser prints them
  for (const auto& [efa, n] : want) {
    absl::StrAppend(&want_samples, "efa_device_plugin_efa_allocations_total{efa=\"", efa, "\"} ", n,
                    ".0\n");
  }
  // The counters are updated after each handler returns: scrape until the
  // last Allocate (the refused one) is counted.
  std::string body;
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (std::chrono::steady_clock::now() < deadline) {
    const auto scrape = HttpGet(port, "/metrics");
    REQUIRE(scrape.status != 0);
    body = scrape.body;
    // The series exists once the call is counted.
    if (absl::StrContains(body, "efa_device_plugin_allocations_total{code=\"INVALID_ARGUMENT\"}")) {
      break;
    }
    std::this_thread::sleep_for(10ms);
  }
  // /readyz names the resource registered.
  const auto ready = HttpGet(port, "/readyz");
  REQUIRE(ready.status != 0);
  CHECK(ready.status == 200);
  CHECK(ready.body == "ok: vpc.amazonaws.com/efa.shared is registered with the kubelet\n");
  CHECK(kubelet.registrations(kEfa) == 0);

  const auto parsed = efa::testing::SummarizeExposition(body, /*values=*/true);
  REQUIRE(parsed.exit_status == 0);
  CHECK(Samples(parsed.text, "efa_device_plugin_efa_allocations_total") == want_samples);
  CHECK(want.at("rdmap16s27") >= 3);
  // Sizes are physical EFAs too: 3 replica IDs of 2 EFAs observe 2.
  CHECK(Samples(parsed.text, "efa_device_plugin_allocation_size_count") ==
        absl::StrCat("efa_device_plugin_allocation_size_count{} ", containers, ".0\n"));
  CHECK(Samples(parsed.text, "efa_device_plugin_allocation_size_sum") ==
        absl::StrCat("efa_device_plugin_allocation_size_sum{} ", efas_given, ".0\n"));
  // No series anywhere names a replica.
  CHECK(parsed.text.find("::") == std::string::npos);
  CHECK(node.process().Stop(kDeadline) == 0);
}

TEST_CASE(
    "The daemon binary on a node without EFA runs no gRPC until an EFA appears, then serves and "
    "registers",
    "[daemon][process][concurrency]") {
  SimRoot p4d("p4d.24xlarge");
  // Installed beside the daemon, the idle process takes over (same PID);
  // alone, or beside an idle binary that cannot run (a library missing in a
  // custom image: the loader exits 127 after the exec), the daemon idles in
  // its own loop.
  enum class Idle { kInstalled, kAbsent, kBroken };
  const Idle idle = GENERATE(Idle::kInstalled, Idle::kAbsent, Idle::kBroken);
  const bool alone = idle != Idle::kInstalled;
  const efa::testing::TempDir bin;  // a copy of the daemon's binary, alone
  fs::path binary = efa::testing::kPluginBinary;
  if (alone) {
    binary = bin.path() / "efa-k8s-device-plugin";
    fs::copy_file(efa::testing::kPluginBinary, binary);
  }
  const fs::path idle_binary = binary.parent_path() / "efa-k8s-device-plugin-idle";
  if (idle == Idle::kBroken) {
    efa::testing::WriteFile(idle_binary, "#!/bin/sh\nexit 127\n");
    fs::permissions(idle_binary, fs::perms::owner_all);
  }
  INFO((idle == Idle::kInstalled ? "with the idle process"
        : idle == Idle::kAbsent  ? "the daemon alone"
                                 : "beside an idle binary that cannot run"));
  TestNode node({.machine = "no-efa",
                 .pod_resources = false,
                 .run = DaemonRun::kBinary,
                 .binary = binary,
                 .flags = {"--rescan-interval", "100ms", "--metrics-address", "127.0.0.1:0",
                           "--probe-address", "127.0.0.1:0"}});
  SimRoot& sim = node.sim();
  auto& kubelet = node.kubelet();
  REQUIRE(node.WaitLog("no EFA on this node; idle until one appears"));
  const fs::path exe = "/proc/" + std::to_string(node.pid()) + "/exe";
  CHECK(fs::read_symlink(exe) == (alone ? binary : idle_binary));
  CHECK(absl::StrContains(ReadFile(node.log()), "handing over to") != alone);
  CHECK(absl::StrContains(ReadFile(node.log()),
                          "cannot run " + idle_binary.string() +
                              ": its check exited with status 127; idle in this process "
                              "instead") == (idle == Idle::kBroken));
  // Idle: no plugin socket, no gRPC threads (the loop and the two HTTP
  // listeners' event loops).
  const fs::path socket = node.device_plugin_dir() / "efa/aws-efa-device-plugin.sock";
  CHECK_FALSE(fs::exists(socket));
  CHECK(efa::testing::ThreadCount(node.pid()) == 3 + kRuntimeThreads);
  CHECK(kubelet.registrations(kEfa) == 0);
  // Its endpoints answer (the idle process's "serving" lines come last).
  const int idle_port = node.LoggedPort(kMetrics);
  const auto metrics = HttpGet(idle_port, "/metrics");
  REQUIRE(metrics.status != 0);
  CHECK(metrics.status == 200);
  CHECK(absl::StrContains(metrics.body, "\nefa_device_plugin_efas_found 0\n"));
  // The families that say which node runs the plugin, as when serving, so
  // that alerts tell a node without EFA from one whose plugin is missing.
  const std::string idle_info =
      "\nefa_device_plugin_info{version=\"" EFA_VERSION "\",mode=\"idle\"} 1\n";
  CHECK(absl::StrContains(metrics.body, idle_info));
  CHECK(absl::StrContains(metrics.body, "\nefa_device_plugin_devices{health=\"healthy\"} 0\n"));
  CHECK(absl::StrContains(metrics.body, "\nefa_device_plugin_devices{health=\"unhealthy\"} 0\n"));
  const std::string started = SampleText(metrics.body, "efa_device_plugin_start_time_seconds");
  double started_at = 0;
  CHECK(absl::SimpleAtod(started, &started_at));
  // Within a day of now: the process's start, not the boot's.
  CHECK(std::abs(started_at - static_cast<double>(std::time(nullptr))) < 86400);
  const auto ready = HttpGet(idle_port, "/readyz");
  REQUIRE(ready.status != 0);
  CHECK(ready.body == "ok: no EFA on this node, nothing to register\n");
  CHECK(HttpGet(idle_port, "/healthz").status == 200);

  // An EFA appears: the p4d's four, hot-plugged into the same root.
  fs::remove_all(sim.sys());
  fs::copy(p4d.sys(), sim.sys(), fs::copy_options::recursive | fs::copy_options::copy_symlinks);
  for (int n = 0; n < 4; ++n) sim.RestoreUverbs(n);  // char devices do not copy
  REQUIRE(kubelet.WaitForRegistrations(kEfa, 1, 10s));
  CHECK(kubelet.WaitForDevices(
      kEfa, [](const auto& d) { return efa::testing::AllHealthy(d, 4); }, 10s));
  CHECK(fs::is_socket(socket));
  CHECK(fs::read_symlink(exe) == binary);
  // The daemon says it serves (on port 0 here, a new port), once the loop
  // pass after the registration has published its state.
  const auto serving_port = static_cast<uint16_t>(node.LoggedPort(kMetrics));
  CHECK(efa::testing::WaitScrape(
      serving_port,
      efa::testing::Has(
          {{"efa_device_plugin_info{version=\"" EFA_VERSION "\",mode=\"serving\"}", 1},
           {"efa_device_plugin_devices{health=\"healthy\"}", 4}})));
  const auto after = HttpGet(serving_port, "/metrics");
  REQUIRE(after.status != 0);
  // The same process (exec keeps it): no restart to alert on.
  CHECK(SampleText(after.body, "efa_device_plugin_start_time_seconds") == started);
  node.process().Signal(SIGTERM);
  CHECK(node.process().Wait(10s) == 0);
}

TEST_CASE(
    "The daemon binary exec'ed back by the idle process answers /healthz while its first "
    "registration waits",
    "[daemon][process][concurrency]") {
  SimRoot p4d("p4d.24xlarge");
  // A kubelet that takes the connection and never answers: Register waits
  // for its whole deadline (10 s).
  TestNode node({.machine = "no-efa", .kubelet = false, .run = DaemonRun::kLater});
  SimRoot& sim = node.sim();
  fs::create_directories(node.device_plugin_dir());
  const int kubelet = ListenOnUnixSocket(node.device_plugin_dir() / "kubelet.sock");
  REQUIRE(kubelet >= 0);
  node.StartBinary({"--log-level", "info", "--metrics-address", "127.0.0.1:0", "--probe-address",
                    "127.0.0.1:0", "--rescan-interval", "100ms"});
  REQUIRE(node.WaitLog("no EFA on this node; idle until one appears"));
  REQUIRE(absl::StrContains(ReadFile(node.log()), "handing over to"));

  // An EFA appears: the idle process execs the daemon, which serves and
  // registers.
  fs::remove_all(sim.sys());
  fs::copy(p4d.sys(), sim.sys(), fs::copy_options::recursive | fs::copy_options::copy_symlinks);
  for (int n = 0; n < 4; ++n) sim.RestoreUverbs(n);
  REQUIRE(node.WaitLog("serving the device plugin API on"));
  const auto serving = std::chrono::steady_clock::now();
  // The daemon's own listener (its "serving /metrics" line is the last).
  const auto health = HttpGet(node.LoggedPort(kMetrics), "/healthz");
  REQUIRE(health.status != 0);
  CHECK(health.status == 200);
  CHECK(absl::StartsWith(health.body, "ok: the owner loop ran "));
  // Asked while the registration still waited.
  CHECK(std::chrono::steady_clock::now() - serving < 5s);
  CHECK_FALSE(absl::StrContains(ReadFile(node.log()), "registration with"));
  CHECK(node.process().Stop(kDeadline + 10s) == 0);
  ::close(kubelet);
}

TEST_CASE("As PID 1 of its PID namespace the daemon binary and the idle process reap orphans",
          "[daemon][process][concurrency]") {
  if (::geteuid() != 0) {
    WARN("not run: a PID namespace of its own (unshare --pid) needs root");
    return;
  }
  // With an EFA the daemon stays; without, the idle process takes its PID.
  const bool efa = GENERATE(true, false);
  INFO((efa ? "the daemon" : "the idle process"));
  TestNode node(
      {.machine = efa ? "p4d.24xlarge" : "no-efa",
       .run = DaemonRun::kBinary,
       // --kill-child: the daemon goes with unshare, should the
       // test fail.
       .wrapper = {"/usr/bin/unshare", "--fork", "--pid", "--mount-proc", "--kill-child", "--"},
       .flags = {"--log-level", "debug", "--metrics-address", "127.0.0.1:0", "--probe-address",
                 ""}});
  if (efa) {
    REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  } else {
    REQUIRE(node.WaitLog("no EFA on this node; idle until one appears"));
  }
  // unshare's one child is the daemon, PID 1 inside.
  std::vector<pid_t> init = Children(node.pid(), "efa-k8s-device-");  // comm: 15 bytes
  REQUIRE(init.size() == 1);
  REQUIRE(InnermostPid(init[0]) == 1);

  // As `kubectl exec` does: a shell entered into the container's PID
  // namespace starts a process in the background and exits; its child is
  // handed to PID 1. The shell prints the child's PID: the child may not
  // have exec'ed sleep yet (its name is still the shell's), but it was
  // handed over before the shell's exit reached nsenter, which waits for it.
  const fs::path exec_log = node.sim().path() / "exec.log";
  ChildProcess exec({"/usr/bin/nsenter", "--target", std::to_string(init[0]), "--pid", "--",
                     "/bin/sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!; exit 0"},
                    exec_log);
  REQUIRE(exec.Wait(kDeadline) == 0);
  const std::string printed = ReadFile(exec_log);
  INFO("the shell printed " << printed);
  pid_t inside = 0;
  REQUIRE(absl::SimpleAtoi(absl::StripAsciiWhitespace(printed), &inside));
  REQUIRE(inside > 1);
  pid_t orphan = 0;  // its PID here
  for (pid_t child : Children(init[0])) {
    if (InnermostPid(child) == inside) orphan = child;
  }
  REQUIRE(orphan > 0);

  // It ends: PID 1 reaps it (else it stays a zombie for ever).
  REQUIRE(::kill(orphan, SIGTERM) == 0);
  CHECK(node.WaitLog(absl::StrCat("reaped process ", inside, " (killed by signal 15)")));
  const std::vector<pid_t> left = Children(init[0]);
  CHECK(std::find(left.begin(), left.end(), orphan) == left.end());
  // A clean stop; unshare exits with its child's status.
  REQUIRE(::kill(init[0], SIGTERM) == 0);
  CHECK(node.process().Wait(kDeadline) == 0);
}

TEST_CASE(
    "The daemon binary under --dra-policy=monitor exports its EFAs as monitoring and never "
    "registers",
    "[daemon][process][concurrency]") {
  // A DRA node pool's node, its DRA driver not (yet) there.
  TestNode node({.machine = "p4d.24xlarge",
                 .pod_resources = false,
                 .run = DaemonRun::kBinary,
                 .flags = {"--dra-policy", "monitor", "--metrics-address", "127.0.0.1:0",
                           "--probe-address", ""}});
  REQUIRE(node.WaitLog("the DRA policy is monitor but no EFA DRA driver serves this node's EFAs"));
  const auto port = static_cast<uint16_t>(node.LoggedPort(kMetrics));
  REQUIRE(port != 0);
  CHECK(efa::testing::WaitScrape(
      port, efa::testing::Has(
                {{"efa_device_plugin_info{version=\"" EFA_VERSION "\",mode=\"monitoring\"}", 1},
                 {"efa_device_plugin_withdrawn", 1},
                 {"efa_device_plugin_dra_driver_present", 0},
                 {"efa_device_plugin_efas_found", 4}})));
  const auto ready = HttpGet(port, "/readyz");
  CHECK(ready.status == 200);
  CHECK(ready.body.find("--dra-policy=monitor") != std::string::npos);
  CHECK(node.kubelet().registrations(kEfa) == 0);
  node.process().Signal(SIGTERM);
  CHECK(node.process().Wait(10s) == 0);
}
