// The lifecycle test's simulated node (efa-lifecycle): the daemon binary on
// a simulated machine beside the fake kubelet and the fake GPU plugin, the
// model of its pods and EFAs the invariants are checked against, and the
// steps applied to it (lifecycle_node.cc) and the checks
// (lifecycle_checks.cc).
#pragma once

#include <fcntl.h>
#include <httplib.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "plugin/alignment/cdi_spec.h"
#include "test/fake_kubelet/fake_accelerator_plugin.h"
#include "test/fake_kubelet/fake_kubelet.h"
#include "test/lifecycle/lifecycle_events.h"
#include "test/sim/sim_root.h"
#include "test/support/build_paths.h"
#include "test/support/child_process.h"
#include "test/support/devices.h"
#include "test/support/temp_dir.h"
#include "topology/replica_id.h"

namespace efa::lifecycle {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using efa::sim::SimRoot;
using efa::testing::AcceleratorKind;
using efa::testing::ChildProcess;
using efa::testing::FakeAcceleratorPlugin;
using efa::testing::FakeKubelet;

using efa::testing::kDeadline;
using efa::testing::kEfa;
using efa::testing::kGpu;
// How long the node may take to be quiet after a step.
constexpr auto kQuiet = 5s;
// The kubelet's default probe period (the chart's liveness probe: every 10 s).
constexpr auto kProbePeriod = 10s;
// How long the descriptor table stays full.
constexpr auto kFdWindow = 300ms;
// The daemon's default --rescan-interval (10 s), and some slack.
constexpr auto kRescanInterval = 11s;
// How long after a device event the daemon may still be listing for it.
constexpr auto kMissedEvent = 1s;
// How long a deleted pod's late-bound EFAs may stay bound when no other
// container took over one of its kubelet IDs: the daemon's release_after
// (10 s) and recheck_every (15 s) (plugin/alignment/late_binder.h), and
// slack.
constexpr auto kReleaseWindow = 40s;
// The resource name with sharing's renameByDefault.
constexpr char kEfaShared[] = "vpc.amazonaws.com/efa.shared";

struct Config {
  std::string machine = "p5.48xlarge";
  bool late_binding = true;        // the daemon's first alignment mode (else best effort)
  std::set<std::string> excluded;  // event groups
  // The fake kubelet imitates kubelet 1.20 (the e2e's) where later ones
  // differ (FakeKubelet::Options::kubelet_1_20): odd seeds do.
  bool kubelet_1_20 = false;
  bool verbose = false;
  // The base commit's daemon binary (empty: none); a run whose steps
  // include an upgrade starts on it.
  std::string base_binary;
  std::string base_commit;
};

// The daemon's configuration, as the chart's values set it.
struct DaemonConfig {
  std::string alignment = "late-binding";  // best-effort, late-binding or off
  int replicas = 1;                        // sharing.replicas
  bool rename = false;                     // sharing.renameByDefault
  std::string handover = "both";           // cdiHandover

  bool late() const { return alignment == "late-binding"; }
  // The resource name it serves (plugin/config.cc).
  std::string resource() const { return replicas > 1 && rename ? kEfaShared : kEfa; }
  std::string Describe() const {
    return absl::StrCat(alignment, replicas > 1 ? absl::StrCat(", replicas ", replicas) : "",
                        resource() == kEfaShared ? ", renamed" : "",
                        late() && handover != "both" ? ", handover " + handover : "");
  }
  std::vector<std::string> Flags() const {
    return {"--alignment",
            alignment,
            "--sharing-replicas",
            absl::StrCat(replicas),
            "--sharing-rename-by-default",
            rename ? "true" : "false",
            "--cdi-handover",
            handover};
  }
  bool operator==(const DaemonConfig&) const = default;
};

// A configuration drawn from `bits` (a step's shape): any alignment mode,
// replicas 1, 2 or 4, renamed or not, any CDI handover that the kubelet
// passes on (kubelet 1.20 has no cdi_devices field: it drops it, so there
// only the annotation reaches the runtime).
DaemonConfig DrawConfig(uint32_t bits, bool kubelet_1_20);

// The fake kubelet's options on a node whose kubelet dir is `kubelet_dir`.
FakeKubelet::Options KubeletOptions(const fs::path& kubelet_dir, bool kubelet_1_20);

struct Violation {
  std::string invariant;
  std::string detail;
};

// How the CDI directory is made read-only: a read-only bind mount in this
// process's own mount namespace (root), file modes (not root), or not at all.
enum class ReadOnlyBy { kBindMount, kModes, kNone };
inline ReadOnlyBy read_only_by = ReadOnlyBy::kNone;

// A free TCP port on 127.0.0.1 for the daemon's probe server, the same over
// its restarts.
int FreePort();

// Asks the daemon's /healthz every 250 ms, as the kubelet's liveness probe
// does every period, and keeps the longest time without a 200 while the
// daemon is meant to be up.
class ProbeWatch {
 public:
  explicit ProbeWatch(int port) : port_(port), thread_([this] { Loop(); }) {}
  ~ProbeWatch() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // From now on (up) the gaps count; (down) they do not.
  void Expect(bool up) {
    std::lock_guard<std::mutex> lock(mu_);
    up_ = up;
    since_ = Clock::now();
  }
  // While paused it asks nothing (and counts no gap): its connections come
  // and go, and would leave holes in a descriptor table meant to be full.
  void Pause(bool paused) {
    std::unique_lock<std::mutex> lock(mu_);
    paused_ = paused;
    since_ = Clock::now();
    // Returns once no request is in flight.
    cv_.wait(lock, [this] { return !asking_; });
  }
  // The longest gap seen since the last call.
  Clock::duration TakeWorstGap() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(worst_, Clock::duration::zero());
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      if (!paused_) {
        asking_ = true;
        lock.unlock();
        httplib::Client client("127.0.0.1", port_);
        client.set_connection_timeout(1s);
        client.set_read_timeout(2s);
        auto reply = client.Get("/healthz");
        const bool ok = reply && reply->status == 200;
        lock.lock();
        asking_ = false;
        cv_.notify_all();
        const auto now = Clock::now();
        if (ok || paused_) since_ = now;
        if (up_) worst_ = std::max(worst_, now - since_);
      }
      cv_.wait_for(lock, 250ms, [this] { return stop_; });
    }
  }

  const int port_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool up_ = false;
  bool paused_ = false;
  bool asking_ = false;
  Clock::time_point since_ = Clock::now();
  Clock::duration worst_{};
  std::thread thread_;
};

// One container of the model, as the runtime sees it.
struct Container {
  std::string name;
  bool init = false;
  int efas = 0;
  enum class State { kWaitingForInit, kStartFailed, kRunning, kDone } state;
  // The EFA resource it asked for and the kubelet's IDs of it.
  std::string resource;
  std::vector<std::string> ids;
  // Its Allocate answer: the claim of the CDI device it names as the
  // kubelet passes it on (late binding), and its device specs' host paths.
  std::string claim;
  std::vector<std::string> alloc_nodes;
  int alloc_replicas = 1;     // sharing's replicas when it was allocated
  int recorded_replicas = 0;  // its answer's EFA_SHARING_REPLICAS (0: none)
  // What the runtime gave it at its latest start (sorted): the answer's
  // device nodes and its CDI spec's; sharing's replicas when they were
  // given; the step and configuration.
  std::vector<std::string> held;
  int held_replicas = 1;
  std::string held_when;
  // Late binding: what it holds was bound by the base binary (which writes
  // no claim records beside its CDI specs).
  bool bound_by_base = false;
  std::string admitted_when;
  // What it holds now: what it was given at its latest start, else (never
  // started) what its Allocate answer gives it.
  const std::vector<std::string>& holds() const { return held.empty() ? alloc_nodes : held; }
  // How many containers the daemon lets share what it holds
  // (LateBinder::Taken): what it was given them under, where the daemon can
  // know it (a by-ID answer's EFA_SHARING_REPLICAS, a binding's record);
  // else (the base binary records neither) the fewest its IDs prove.
  int Counted() const {
    if (claim.empty() ? recorded_replicas > 0 : !bound_by_base) {
      return held.empty() ? alloc_replicas : held_replicas;
    }
    int fewest = 1;
    for (const std::string& id : ids) {
      if (const auto replica = efa::topology::ParseReplicaId(id))
        fewest = std::max(fewest, replica->replica + 1);
    }
    return fewest;
  }
};

struct Pod {
  std::string uid;
  std::vector<Container> containers;
};

// A deleted pod's container: its EFAs may stay bound (late binding) until
// the daemon sees it gone, or until one of its IDs goes to another
// container; held by ID (its Allocate answer) until the kubelet's next
// checkpoint write. Meanwhile the daemon may withhold them.
struct Gone {
  bool bound = false;  // late-bound (its CDI spec's EFAs)
  std::string who;
  std::string resource;
  std::vector<std::string> ids;
  std::vector<std::string> nodes;
  int replicas = 1;  // as the daemon counts it (Container::Counted)
  Clock::time_point when;
  std::string taken_over;  // "<ID> to <pod>/<container>" when one of its IDs went to another
  // Bound by the base binary, which writes the CDI spec but no claim record
  // (vpc.amazonaws.com-efa_<claim>.state): this tree's daemon recovers such
  // a binding without its owner and kubelet IDs, and learns them (writing
  // the record) only from the kubelet checkpoint while the pod is there
  // (LateBinder::RecoverSpec, Adopt). Without them a start taking over one
  // of its IDs cannot release it (LateBinder::ReleaseTakenOver matches
  // kubelet IDs): it stays bound until confirmed gone (absent from the
  // checkpoint and List for release_after, ReleaseLocked), as designed,
  // never given twice. So for such a binding a take-over counts only while
  // the base binary runs (it keeps the IDs in memory) or once its record
  // was seen on disk before the start (`recorded`).
  std::string claim;
  bool by_base = false;
  bool recorded = false;
};

// What the runtime would give a container now: its Allocate answer's device
// nodes and its CDI spec's (sorted), or why the spec does not resolve.
struct Resolved {
  std::vector<std::string> nodes;
  std::string problem;
};

// "uverbs3,uverbs7" for a list of device nodes.
std::string Nodes(const std::vector<std::string>& nodes);

// One simulated EFA: its PCI function's names and whether it is there.
struct Efa {
  std::string udev_name;    // the name it has on the node (Naming::kUdev)
  std::string kernel_name;  // efa_N, before udev renames it
  int uverbs = 0;
  fs::path ib_dir;  // <pci dir>/infiniband
  bool present = true;
  Clock::time_point changed;  // when it was removed or returned last
};

class Node {
 public:
  // Starts the daemon of `binary` (this tree's, or the base commit's).
  Node(const Config& config, const std::string& binary)
      : config_(config),
        binary_(binary),
        sim_(config.machine),
        kubelet_(KubeletOptions(sim_.path() / "kubelet", config.kubelet_1_20)),
        gpus_(*efa::sim::FindMachine(config.machine), AcceleratorKind::kNvidiaGpu,
              sim_.path() / "kubelet/device-plugins"),
        cdi_dir_(sim_.path() / "var/run/cdi"),
        port_(FreePort()),
        probes_(port_) {
    daemon_config_.alignment = config.late_binding ? "late-binding" : "best-effort";
    fs::create_directories(cdi_dir_);
    FindEfas();
    if (!kubelet_.Start().ok()) throw std::runtime_error("the fake kubelet cannot start");
    if (!gpus_.Start().ok()) throw std::runtime_error("the fake GPU plugin cannot start");
    if (auto v = StartDaemon()) throw std::runtime_error(v->invariant + ": " + v->detail);
  }
  ~Node() {
    SetCdiReadOnly(false);
    probes_.Expect(false);
    if (daemon_) daemon_->KillGroup();
  }

  // Applies step `number` (from 1); a violation when something the step
  // waits for (a registration, a clean exit) does not come.
  std::optional<Violation> Apply(const Step& step, size_t number);
  // Waits for the node to be quiet and checks the invariants.
  std::optional<Violation> Check();
  // What the last Apply did, for the report.
  const std::string& last_action() const { return action_; }

  bool synced() const { return synced_; }
  bool on_base() const { return binary_ != efa::testing::kPluginBinary; }
  const DaemonConfig& daemon_config() const { return daemon_config_; }
  bool read_only() const { return read_only_; }
  int pods() const { return static_cast<int>(pods_.size()); }
  int removed_efas() const {
    return static_cast<int>(
        std::count_if(efas_.begin(), efas_.end(), [](const Efa& e) { return !e.present; }));
  }
  bool any(Container::State state, bool init) const {
    for (const Pod& pod : pods_) {
      for (const Container& c : pod.containers) {
        if (c.state == state && c.init == init) return true;
      }
    }
    return false;
  }
  const std::string& log() const { return log_path_; }
  std::map<std::string, int> counts;  // what happened, for the summary

 private:
  void FindEfas();
  std::optional<Violation> StartDaemon();
  std::optional<Violation> StopDaemon(int signal);
  // Stops the daemon (SIGTERM, or SIGKILL), notes what every running
  // container holds, and starts `binary` under `next`.
  std::optional<Violation> RestartDaemon(int signal, const std::string& binary,
                                         const DaemonConfig& next);
  std::optional<Violation> Admit(const Step& step, bool with_init);
  std::optional<Violation> Start(Pod& pod, Container& c);
  std::optional<Violation> RestartKubelet();
  std::optional<Violation> FillFds();
  void RemoveEfa(Efa& efa);
  void ReturnEfa(Efa& efa, bool renamed);
  void SetCdiReadOnly(bool read_only);
  std::optional<Violation> CheckAdvertised();
  std::optional<Violation> CheckEfasApart();
  std::optional<Violation> CheckSnapshot();
  std::optional<Violation> CheckHeld();
  // After a start the daemon refused: a violation when it refused for want
  // of EFAs while the node has EFAs no live container holds.
  std::optional<Violation> CheckRefusal(const Pod& pod, const Container& c,
                                        const absl::Status& status);
  // After a start the kubelet let through: what the runtime gives the
  // container, recorded; a violation when its CDI device does not resolve.
  std::optional<Violation> Started(const Pod& pod, Container& c);
  Resolved Resolve(const Container& c) const;
  // What a container holds now: Container::holds(), and for one admitted
  // under late binding that never started, what its spec on disk binds
  // (LateBinder::BindUnstarted binds it before its start when no
  // PreStartContainer will come).
  std::vector<std::string> Holds(const Container& c) const;
  // "uid-3/main (4 EFA of vpc.amazonaws.com/efa, admitted at step 3 under
  // ...)" for messages.
  std::string Describe(const Pod& pod, const Container& c) const;
  // The device node of the EFA with uverbs index `n`, as the daemon names it.
  std::string DeviceNode(const Efa& efa) const;
  // "step 7 (late-binding)" for what is being recorded now.
  std::string Now() const;
  // The latest daemon restart, for messages ("" before the first).
  std::string LastRestart() const;
  // The running containers that hold EFAs.
  std::vector<std::pair<const Pod*, const Container*>> Running() const;
  // Whether a deleted pod's container may still hold its EFAs (unless taken
  // over): (late-bound) its spec still on disk, within kReleaseWindow of
  // its deletion or of the latest event that starts the daemon's
  // confirmation over (gone_clock_).
  bool Held(const Gone& g) const;
  // A deleted or refused pod's containers that hold EFAs, to gone_.
  void RecordGone(const Pod& pod);

  const Config config_;
  std::string binary_;
  DaemonConfig daemon_config_;
  size_t step_ = 0;
  // Every daemon restart so far: "step 7: reconfigure-daemon: ... -> ...".
  std::vector<std::string> restarts_;
  // Running containers' device nodes before the latest daemon restart,
  // checked (and dropped) at the next Check.
  std::optional<std::map<std::string, Resolved>> snapshot_;
  std::vector<Gone> gone_;
  // The latest event after which the daemon confirms anew that a deleted
  // pod's containers are gone (Held): its own start, a kubelet restart, the
  // restarted kubelet's pods synced.
  Clock::time_point gone_clock_ = Clock::now();
  // The latest window of a full descriptor table (FillFds).
  Clock::time_point fd_full_begin_, fd_full_end_;
  SimRoot sim_;
  FakeKubelet kubelet_;
  FakeAcceleratorPlugin gpus_;
  const fs::path cdi_dir_;
  const int port_;
  ProbeWatch probes_;
  std::string log_path_;
  std::unique_ptr<ChildProcess> daemon_;
  std::vector<Efa> efas_;
  std::vector<Pod> pods_;
  int next_pod_ = 0;
  bool synced_ = true;
  bool read_only_ = false;
  // Since when the CDI dir is writable (BindUnstarted's spec writes fail
  // while it is not; the daemon tries again at its next pass).
  Clock::time_point cdi_writable_since_ = Clock::now();
  std::string action_;
};

}  // namespace efa::lifecycle
