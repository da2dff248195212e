// The daemon under test on a node of its own: a simulated machine
// (test/sim), the fake kubelet in the machine's kubelet directory over real
// unix sockets, and the daemon, either in this process on a thread (with a
// fake clock when a test moves time itself) or as its binary; with the waits
// the integration tests share. What several test files need (the daemon's
// HTTP monitor, late binding's CDI directory, sharing's replicas, the wait
// for the first registration) is an option; a test file adds only what is
// its own (a guard's fakes, its requests and checks) around one of these.
//
//   TestNode node({.machine = "p5.48xlarge", .wait_serving = true});  // in process
//   fs::remove(node.sim().path() / "dev/infiniband/uverbs1");
//   CHECK(node.WaitHealth("rdmap80s0", "Unhealthy"));
//
// Not thread-safe: one test thread drives it (the daemon runs on its own).
#pragma once

#include <sys/resource.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "plugin/daemon.h"
#include "plugin/daemon_monitor.h"
#include "plugin/runtime/http_server.h"
#include "test/fake_kubelet/fake_accelerator_plugin.h"
#include "test/fake_kubelet/fake_kubelet.h"
#include "test/sim/sim_root.h"
#include "test/support/child_process.h"
#include "test/support/fake_clock.h"
#include "topology/host_model.h"
#include "topology/nvidia_gpus.h"

namespace efa::testing {

// How the daemon under test runs.
enum class DaemonRun {
  kInProcess,  // a plugin::Daemon on a thread of the test process
  kBinary,     // the daemon's binary (EFA_PLUGIN_BINARY) as a child process
  kLater,      // not started yet: the test calls StartDaemon or StartBinary
};

// Which of a pod's two resources the kubelet admits first (AdmitRounds).
enum class AdmitOrder {
  kAcceleratorFirst,
  kEfaFirst,
  kRandom,  // either, drawn for each pod
};

// Rounds of pods, each of accelerators and EFAs, admitted until the node is
// full (AdmitRounds).
struct AdmissionRounds {
  int accelerators = 1;  // per pod
  int efas = 4;          // per pod
  AdmitOrder order = AdmitOrder::kAcceleratorFirst;
  int rounds = 1;
  unsigned seed = 1;  // of kRandom's draws
};

struct TestNodeOptions {
  std::string machine = "p4d.24xlarge";
  sim::Naming naming = sim::Naming::kUdev;
  // Changes the simulated machine before anything starts (an EFA missing,
  // a driver without counters, a file left where a socket goes).
  std::function<void(sim::SimRoot&)> prepare = nullptr;
  // The fake kubelet serves with the node; without, nothing serves its
  // socket (the test may put a kubelet of its own at
  // device_plugin_dir()/kubelet.sock). Not with `accelerators`.
  bool kubelet = true;
  // The kubelet also serves its pod-resources API, as a real one does;
  // without, only the device-plugin API (the daemon's alignment degrades).
  bool pod_resources = true;
  DaemonRun run = DaemonRun::kInProcess;
  // In process: the daemon reads clock() instead of the steady clock, and
  // the test moves it (Pass, PassUntil).
  bool fake_clock = false;
  // In process: changes the daemon's options after the node's own (roots,
  // kubelet dir, CDI spec dirs, clock).
  std::function<void(plugin::DaemonOptions&)> configure = nullptr;
  // As the binary: the program (empty: EFA_PLUGIN_BINARY; a copy of it
  // elsewhere, say, alone in its folder); a command it runs under (the
  // command's argv before the program's: unshare, nsenter), which is then
  // the process pid() names; its flags after the node's
  // (SimRoot::DaemonFlags); and its RLIMIT_NOFILE (0: this process's).
  std::filesystem::path binary = {};
  std::vector<std::string> wrapper = {};
  std::vector<std::string> flags = {};
  rlim_t max_files = 0;
  // A fake plugin of the machine's GPUs or Neuron devices, started after
  // the daemon and registered with the kubelet before the constructor
  // returns.
  std::optional<AcceleratorKind> accelerators = std::nullopt;
  // The daemon's alignment mode (unset: its default). With it, the daemon
  // writes late binding's CDI specs to cdi_dir(), made before it starts;
  // in process that directory is also one of its CDI spec dirs (the MOFED
  // guard watches it, as on a node), as the binary `--alignment` and
  // `--cdi-dir` only.
  std::optional<plugin::AlignmentMode> alignment = std::nullopt;
  // With `alignment`: where late binding writes its specs (empty: the
  // node's var/run/cdi).
  std::filesystem::path cdi_dir = {};
  // Sharing's device IDs per EFA (1: none).
  int replicas = 1;
  // The daemon's /metrics (and its probes) on ports of 127.0.0.1
  // (metrics_port(), probe_port()): in process a DaemonMonitor of the
  // node's, attached at the first StartDaemon and served from then on; as
  // the binary its `--metrics-address` (a probe listener of its own only
  // as its flags say), the port read from its log.
  bool monitor = false;
  // The constructor returns once the daemon registered, sent its first
  // device list and streams (WaitServing); with `monitor` as the binary,
  // once it serves /metrics.
  bool wait_serving = false;
};

class TestNode {
 public:
  // Writes the machine, starts the kubelet, then the daemon and the
  // accelerators' plugin as `options` say. Fails the test (REQUIRE) when
  // one cannot start.
  explicit TestNode(TestNodeOptions options = {});
  // Stops the daemon (a binary with SIGTERM, waited for) and the kubelet.
  ~TestNode();
  TestNode(const TestNode&) = delete;
  TestNode& operator=(const TestNode&) = delete;

  sim::SimRoot& sim() { return sim_; }
  const sim::SimRoot& sim() const { return sim_; }
  FakeKubelet& kubelet() { return kubelet_; }
  const FakeKubelet& kubelet() const { return kubelet_; }
  std::filesystem::path kubelet_dir() const { return sim_.path() / "kubelet"; }
  std::filesystem::path device_plugin_dir() const { return kubelet_dir() / "device-plugins"; }
  // The kubelet's device-manager checkpoint.
  std::filesystem::path checkpoint() const;
  // The EFAs the machine had at the start (after `prepare`).
  size_t efas() const { return efas_; }
  const std::string& machine() const { return config_.machine; }
  // The daemon's socket in device_plugin_dir().
  std::filesystem::path plugin_socket() const;
  // Where late binding writes its CDI specs (the options' cdi_dir, else
  // the node's var/run/cdi).
  std::filesystem::path cdi_dir() const;

  // ---- The daemon in process -------------------------------------------
  // The options of the next StartDaemon: the node's roots and kubelet
  // directory, its etc/cdi as the only CDI spec dir (never the host's), the
  // fake clock when asked, then `configure`.
  plugin::DaemonOptions& options() { return options_; }
  const plugin::DaemonOptions& options() const { return options_; }
  // Builds a daemon from options() and runs it on a thread; `before_run`
  // sees it built, before it runs (with `monitor`, after the monitor
  // watches it and serves). A daemon stopped before is replaced (a
  // restart).
  void StartDaemon(const std::function<void(plugin::Daemon&)>& before_run = nullptr);
  // Stops the daemon and joins its thread; returns Run()'s exit code (-1
  // when none ran). The daemon stays readable until the next StartDaemon.
  int StopDaemon();
  plugin::Daemon& daemon() { return *daemon_; }
  const plugin::Daemon& daemon() const { return *daemon_; }
  FakeClock& clock() { return clock_; }
  // With the fake clock: moves it on by `d` and waits for the owner loop's
  // pass at the new time (AdvanceOnePass, kDeadline).
  bool Pass(FakeClock::duration d);
  // With the fake clock: passes of a rescan interval each until `done`
  // holds, at most 12; returns whether it held.
  bool PassUntil(const std::function<bool()>& done);

  // ---- The daemon's binary ---------------------------------------------
  // Starts the binary on this node (the options' binary, under their
  // wrapper) with `flags` after the node's and the options' alignment,
  // replicas and monitor, its output in log(). A binary started before
  // must have ended (KillBinary).
  void StartBinary(const std::vector<std::string>& flags, rlim_t max_files = 0);
  // The same with the options' flags and descriptor limit (again after
  // KillBinary: a restart).
  void StartBinary() { StartBinary(config_.flags, config_.max_files); }
  // SIGKILL (to the wrapper, with one); returns whether it died of it. Safe
  // on any thread (no Catch2).
  bool KillBinary();
  ChildProcess& process() { return *process_; }
  pid_t pid() const { return process_->pid(); }
  std::filesystem::path log() const { return sim_.path() / "daemon.log"; }
  // Lines of log() containing `text`; WaitLog waits (kDeadline) for one.
  int LogLines(const std::string& text) const;
  bool WaitLog(const std::string& text) const;
  // The port of the listener log() last says it serves `what` on ("serving
  // <what> on ... (port N"); 0 when none.
  int LoggedPort(const std::string& what) const;

  // ---- The daemon's HTTP monitor (the `monitor` option) -----------------
  // Ports of 127.0.0.1: /metrics (which answers the probes too), and the
  // probes' own listener (0 when the binary's flags give it none).
  uint16_t metrics_port() const;
  uint16_t probe_port() const;
  // One scrape of /metrics; WaitScrape scrapes until `want` holds
  // (kDeadline): the daemon publishes its state once per loop pass.
  std::map<std::string, double> Scrape() const;
  bool WaitScrape(const std::function<bool(const std::map<std::string, double>&)>& want) const;

  // ---- The kubelet's view ----------------------------------------------
  // Waits (kDeadline; REQUIRE) until the daemon registered for the
  // `registrations`+1th time, sent the kubelet its `messages`+1th device
  // list and streams: serving after a (re)start, counted from before it.
  void WaitServing(int registrations = 0, int messages = 0);
  // Waits (kDeadline) until the kubelet's latest list shows `id` as
  // `health`.
  bool WaitHealth(const std::string& id, const std::string& health);
  // Whether the kubelet's latest list has `n` devices (efas() when unset),
  // each `health`; WaitAll waits (kDeadline) for it.
  bool All(const std::string& health, std::optional<size_t> n = std::nullopt) const;
  bool WaitAll(const std::string& health, std::optional<size_t> n = std::nullopt);

  // ---- Accelerators and alignment --------------------------------------
  // The accelerators' resource (nvidia.com/gpu, aws.amazon.com/neuron).
  const std::string& accelerator_resource() const { return accelerators_->resource_name(); }
  // With accelerators: whether `efas` are aligned with the accelerators
  // the kubelet gave container `uid`/`container`, as the machine's topology
  // says (hwloc, read at the start).
  bool Aligned(const std::string& uid, const std::vector<std::string>& efas,
               const std::string& container = "main");
  // With accelerators and the daemon in process: admits pods (one
  // container, "main"; pod-N, uid-N) until the node is full, `rounds.rounds`
  // times over. `aligned` sees each container admitted and says whether its
  // EFAs are aligned; `round_end` sees the round's uids. Then the daemon has
  // judged every container after the fact (its alignment stats, counted
  // since StartDaemon) and the pods are removed. Returns how many
  // containers were aligned, out of how many.
  using AlignedCheck =
      std::function<bool(const std::string& uid, const FakeKubelet::AdmittedContainer& admitted)>;
  std::pair<int, int> AdmitRounds(
      const AdmissionRounds& rounds, const AlignedCheck& aligned,
      const std::function<void(const std::vector<std::string>& uids)>& round_end = nullptr);

 private:
  const TestNodeOptions config_;
  sim::SimRoot sim_;
  size_t efas_ = 0;
  FakeKubelet kubelet_;
  FakeClock clock_;
  plugin::DaemonOptions options_;
  std::unique_ptr<plugin::Daemon> daemon_;
  std::thread thread_;
  int exit_code_ = -1;
  std::unique_ptr<ChildProcess> process_;
  std::unique_ptr<FakeAcceleratorPlugin> accelerators_;
  // With `monitor` in process: the monitor (the daemon's hooks point at it:
  // the destructor stops the daemon first) and its listeners.
  std::unique_ptr<plugin::DaemonMonitor> monitor_;
  std::unique_ptr<plugin::HttpServer> http_;
  std::unique_ptr<plugin::HttpServer> probes_;
  // As the binary: the ports its log gave at the start (wait_serving; 0:
  // read from the log when asked).
  uint16_t metrics_port_ = 0;
  uint16_t probe_port_ = 0;
  // Aligned()'s view of the machine (with accelerators).
  std::shared_ptr<const topology::HostModel> model_;
  std::vector<topology::NvidiaGpu> gpus_;
  // AdmitRounds': pods admitted so far, containers the daemon judged.
  int pods_ = 0;
  int judged_ = 0;
};

}  // namespace efa::testing
