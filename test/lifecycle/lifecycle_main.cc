// efa-lifecycle: the seeded, randomized lifecycle test. It runs the real
// daemon binary as a child process on a simulated node (test/sim) beside the
// fake kubelet and the fake GPU plugin (test/fake_kubelet), and drives them
// through long random sequences of what happens to a node: pods admitted GPU
// first or EFA first, init containers holding EFAs, container restarts, pod
// deletions, kubelet restarts whose pod-resources List stays empty until the
// pods are synced, daemon restarts (SIGTERM) and kills (SIGKILL), daemon
// restarts under a configuration drawn at random (a helm upgrade with changed
// values: alignment best-effort / late-binding / off, sharing replicas 1 or
// N, renameByDefault, cdiHandover), an upgrade from the daemon binary of the
// commit test/lifecycle/upgrade-from names (built by CMake, see
// test/lifecycle/build-upgrade-from.sh) to this tree's, EFAs removed and
// returned (udev renaming some), a full descriptor table, a read-only CDI
// directory. The fake kubelet does what the kubelet does when the daemon
// comes back with another resource name, other device IDs or other options
// (test/fake_kubelet/fake_kubelet.h). After every step, once the node is
// quiet, it checks the invariants:
//
//   - every running container keeps the device nodes the runtime gave it at
//     its start (its Allocate answer's device specs, or the device nodes of
//     the CDI spec its answer names, read when it started): they are the same
//     before and after each daemon restart, and its CDI spec on disk names
//     them as long as it runs;
//   - no device node is in more running containers than it was given for:
//     an EFA given while sharing's replicas were N is in at most N running
//     containers, one given exclusively (replicas 1) in no other;
//   - a container's start is refused for want of EFAs (late binding) only
//     when the node has no EFA that no live container holds (counting a
//     deleted pod's EFAs as held until the kubelet gives one of its IDs to
//     another container, or kReleaseWindow passes; a take-over does not
//     count for a binding the base binary made that this tree's daemon
//     recovered without its claim record: see Gone::by_base);
//   - late binding: every running container's CDI device resolves to a spec
//     on disk naming its count of EFAs (with sharing, 1 to that many);
//   - every EFA's advertised health is the simulated node's truth (without
//     late binding, an EFA a live container holds may be advertised
//     Unhealthy: withheld), under the
//     resource name and replica IDs of the daemon's configuration, each
//     (EFA, replica) once;
//   - the daemon never exits, never leaves /healthz unanswered for more than
//     one probe period, and registers again after every kubelet restart.
//
// When one breaks it prints the seed and the shortest failing sequence it
// finds by dropping steps and replaying (bounded by --shrink-seconds), and a
// command line to replay that sequence. --exclude (or EFA_LIFECYCLE_EXCLUDE)
// leaves event classes out, to bisect. Exits 0 when every run held.
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
#include "test/sim/sim_root.h"
#include "test/support/build_paths.h"
#include "test/support/child_process.h"
#include "test/support/devices.h"
#include "test/support/temp_dir.h"
#include "topology/replica_id.h"

namespace {

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

// ---------------------------------------------------------------------------
// Events

enum class Event {
  kAdmit,             // a pod: GPUs and EFAs, in either order
  kAdmitWithInit,     // a pod whose init container holds EFAs
  kFinishInit,        // an init container completes; the pod's container starts
  kRestartContainer,  // a container starts again (PreStartContainer again)
  kDeletePod,         // a pod is deleted
  kRestartKubelet,    // the kubelet restarts; List stays empty until kSyncPods
  kSyncPods,          // the restarted kubelet has the pods again
  kRestartDaemon,     // SIGTERM, then the daemon starts again
  kKillDaemon,        // SIGKILL, then the daemon starts again
  kRemoveEfa,         // an EFA goes (its verbs device and uverbs node)
  kReturnEfa,         // a removed EFA comes back under its name
  kReturnEfaRenamed,  // a removed EFA comes back as efa_N and udev renames it
  kFillFds,           // the daemon's descriptor table is full for a moment
  kCdiReadOnly,       // the CDI directory turns read-only (late binding)
  kCdiWritable,       // it is writable again; failed starts are retried
  kReconfigure,       // SIGTERM, then the daemon starts under another configuration
  kUpgrade,           // SIGTERM of the base binary, then this tree's starts
};

struct EventInfo {
  Event event;
  const char* name;   // in --replay and in the report
  const char* group;  // what --exclude names
};

constexpr EventInfo kEvents[] = {
    {Event::kAdmit, "admit", "pods"},
    {Event::kAdmitWithInit, "admit-init", "init"},
    {Event::kFinishInit, "finish-init", "init"},
    {Event::kRestartContainer, "restart-container", "container-restart"},
    {Event::kDeletePod, "delete-pod", "pods"},
    {Event::kRestartKubelet, "restart-kubelet", "kubelet-restart"},
    {Event::kSyncPods, "sync-pods", "kubelet-restart"},
    {Event::kRestartDaemon, "restart-daemon", "daemon-restart"},
    {Event::kKillDaemon, "kill-daemon", "daemon-kill"},
    {Event::kRemoveEfa, "remove-efa", "hotplug"},
    {Event::kReturnEfa, "return-efa", "hotplug"},
    {Event::kReturnEfaRenamed, "return-efa-renamed", "udev-rename"},
    {Event::kFillFds, "fill-fds", "fd-full"},
    {Event::kCdiReadOnly, "cdi-read-only", "cdi-read-only"},
    {Event::kCdiWritable, "cdi-writable", "cdi-read-only"},
    {Event::kReconfigure, "reconfigure-daemon", "daemon-config"},
    {Event::kUpgrade, "upgrade-daemon", "upgrade"},
};

const EventInfo& Info(Event event) {
  for (const EventInfo& info : kEvents) {
    if (info.event == event) return info;
  }
  std::abort();
}

// One step: the event and two numbers that choose among what is there when
// it runs (which pod, which EFA, which shape), so that a sequence with steps
// dropped still replays; a step with nothing to act on does nothing.
struct Step {
  Event event;
  uint32_t pick = 0;
  uint32_t shape = 0;
};

std::string Encode(const std::vector<Step>& steps) {
  std::vector<std::string> parts;
  for (const Step& s : steps)
    parts.push_back(absl::StrCat(Info(s.event).name, ":", s.pick, ":", s.shape));
  return absl::StrJoin(parts, ",");
}

std::optional<std::vector<Step>> Decode(const std::string& text) {
  std::vector<Step> steps;
  const std::vector<std::string> parts = absl::StrSplit(text, ',', absl::SkipEmpty());
  for (const std::string& part : parts) {
    std::vector<std::string> f = absl::StrSplit(part, ':');
    if (f.size() != 3) return std::nullopt;
    const EventInfo* info = nullptr;
    for (const EventInfo& e : kEvents) info = f[0] == e.name ? &e : info;
    Step s;
    if (info == nullptr || !absl::SimpleAtoi(f[1], &s.pick) || !absl::SimpleAtoi(f[2], &s.shape)) {
      return std::nullopt;
    }
    s.event = info->event;
    steps.push_back(s);
  }
  return steps;
}

// The pod shapes: GPUs and EFAs of the pod's container (a p5 has 4 EFAs per
// GPU), or of the init container (its EFAs) and then the container.
struct Shape {
  int gpus;
  int efas;
};
constexpr Shape kShapes[] = {{1, 4}, {2, 8}, {0, 1}, {0, 2}, {1, 1}, {0, 4}, {1, 2}};

// ---------------------------------------------------------------------------
// The node

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
DaemonConfig DrawConfig(uint32_t bits, bool kubelet_1_20) {
  static constexpr const char* kAlignments[] = {"best-effort", "late-binding", "off"};
  static constexpr int kReplicas[] = {1, 1, 2, 4};
  static constexpr const char* kHandovers[] = {"both", "annotation", "cdi-devices"};
  DaemonConfig c;
  c.alignment = kAlignments[bits % 3];
  bits /= 3;
  c.replicas = kReplicas[bits % 4];
  bits /= 4;
  c.rename = bits % 2 == 1;
  bits /= 2;
  c.handover = kHandovers[bits % (kubelet_1_20 ? 2 : 3)];
  return c;
}

FakeKubelet::Options KubeletOptions(const fs::path& kubelet_dir, bool kubelet_1_20) {
  FakeKubelet::Options options = FakeKubelet::ForKubeletDir(kubelet_dir);
  options.kubelet_1_20 = kubelet_1_20;
  return options;
}

struct Violation {
  std::string invariant;
  std::string detail;
};

// How the CDI directory is made read-only: a read-only bind mount in this
// process's own mount namespace (root), file modes (not root), or not at all.
enum class ReadOnlyBy { kBindMount, kModes, kNone };
ReadOnlyBy read_only_by = ReadOnlyBy::kNone;

// A free TCP port on 127.0.0.1 for the daemon's probe server, the same over
// its restarts.
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

// The sockets on this machine whose local port is `port` (/proc/net/tcp and
// tcp6), with their TCP state and the processes that hold them: "LISTEN
// 127.0.0.1 (pid 12, efa-k8s-device-pl)" or "none"; for a daemon that
// cannot bind its probe address.
std::string PortHolders(int port) {
  static constexpr const char* kStates[] = {
      "?",     "ESTABLISHED", "SYN_SENT", "SYN_RECV", "FIN_WAIT1", "FIN_WAIT2",   "TIME_WAIT",
      "CLOSE", "CLOSE_WAIT",  "LAST_ACK", "LISTEN",   "CLOSING",   "NEW_SYN_RECV"};
  std::map<std::string, std::string> by_inode;  // socket inode -> what
  std::vector<std::string> found;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (f.size() < 10) continue;
      const std::vector<std::string> local = absl::StrSplit(f[1], ':');
      unsigned local_port = 0, state = 0;
      if (local.size() != 2 || !absl::SimpleHexAtoi(local[1], &local_port) ||
          static_cast<int>(local_port) != port || !absl::SimpleHexAtoi(f[3], &state)) {
        continue;
      }
      const std::string what = absl::StrCat(state < std::size(kStates) ? kStates[state] : "?", " ",
                                            local[0], " to ", f[2]);
      if (f[9] == "0") {
        found.push_back(what + " (no process)");
      } else {
        by_inode[absl::StrCat("socket:[", f[9], "]")] = what;
      }
    }
  }
  std::error_code ec;
  for (fs::directory_iterator proc("/proc", ec), end; !ec && proc != end; proc.increment(ec)) {
    const std::string pid = proc->path().filename().string();
    if (by_inode.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::error_code fd_ec;
    for (fs::directory_iterator fd(proc->path() / "fd", fd_ec); !fd_ec && fd != end;
         fd.increment(fd_ec)) {
      std::error_code link_ec;
      const auto it = by_inode.find(fs::read_symlink(fd->path(), link_ec).string());
      if (link_ec || it == by_inode.end()) continue;
      std::string comm = efa::testing::ReadFile(proc->path() / "comm");
      comm.erase(comm.find_last_not_of('\n') + 1);
      found.push_back(absl::StrCat(it->second, " (pid ", pid, ", ", comm, ")"));
    }
  }
  return found.empty() ? "none" : absl::StrJoin(found, "; ");
}

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
std::string Nodes(const std::vector<std::string>& nodes) {
  std::vector<std::string> names;
  for (const std::string& n : nodes) names.push_back(fs::path(n).filename().string());
  return names.empty() ? "none" : absl::StrJoin(names, ",");
}

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

void Node::FindEfas() {
  // The simulated machine names its EFAs as udev does; the kernel's names
  // follow PCI order (efa_0, efa_1, ...).
  std::vector<std::pair<std::string, Efa>> by_pci;
  for (const auto& entry : fs::directory_iterator(sim_.sys() / "class/infiniband_verbs")) {
    if (!entry.is_directory()) continue;
    Efa efa;
    efa.udev_name = efa::testing::ReadFile(entry.path() / "ibdev");
    efa.udev_name.erase(efa.udev_name.find_last_not_of('\n') + 1);
    const std::string name = entry.path().filename().string();
    if (!absl::SimpleAtoi(name.substr(6), &efa.uverbs)) continue;
    const fs::path pci = fs::canonical(entry.path() / "device");
    efa.ib_dir = pci / "infiniband";
    by_pci.emplace_back(pci.filename().string(), efa);
  }
  std::sort(by_pci.begin(), by_pci.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [pci, efa] : by_pci) {
    efa.kernel_name = absl::StrCat("efa_", efas_.size());
    efas_.push_back(efa);
  }
}

std::optional<Violation> Node::StartDaemon() {
  std::vector<std::string> args = {binary_};
  for (const std::string& flag : sim_.DaemonFlags()) args.push_back(flag);
  for (const std::string& flag :
       {std::string("--log-level"), std::string("info"), std::string("--metrics-address"),
        std::string(""), std::string("--probe-address"), absl::StrCat("127.0.0.1:", port_),
        std::string("--cdi-dir"), cdi_dir_.string()}) {
    args.push_back(flag);
  }
  for (const std::string& flag : daemon_config_.Flags()) args.push_back(flag);
  log_path_ = (sim_.path() / "daemon.log").string();
  {
    std::ofstream log(log_path_, std::ios::app);
    log << "=== efa-lifecycle, step " << step_ << ": " << absl::StrJoin(args, " ") << "\n";
  }
  const std::string resource = daemon_config_.resource();
  const int before = kubelet_.registrations(resource);
  // In a process group of its own, as a container's processes are its own
  // (StopDaemon).
  daemon_ = std::make_unique<ChildProcess>(args, log_path_, 0, /*own_group=*/true);
  // Waits in slices to see the daemon exit at once (who holds its probe
  // port is worth knowing then, not 10 s later).
  const auto deadline = Clock::now() + kDeadline;
  bool registered = false;
  int exited = -1;
  while (!registered && exited < 0 && Clock::now() < deadline) {
    registered = kubelet_.WaitForRegistrations(resource, before + 1, 100ms);
    if (!registered) exited = daemon_->Wait(0ms);
  }
  const std::string holders = exited >= 0 ? PortHolders(port_) : "";
  if (!registered || !kubelet_.WaitForStreaming(resource, true, kDeadline)) {
    return Violation{
        "registers",
        absl::StrCat("the daemon (", on_base() ? "base binary, " : "", daemon_config_.Describe(),
                     ") did not register ", resource, " within 10 s of its start",
                     exited >= 0 ? absl::StrCat(": it exited with status ", exited) : "",
                     " (its probe port ", port_, ": ", exited >= 0 ? holders : PortHolders(port_),
                     ")")};
  }
  probes_.Expect(true);
  gone_clock_ = Clock::now();
  return std::nullopt;
}

std::optional<Violation> Node::RestartDaemon(int signal, const std::string& binary,
                                             const DaemonConfig& next) {
  std::map<std::string, Resolved> before;
  for (const auto& [pod, c] : Running()) before[absl::StrCat(pod->uid, "/", c->name)] = Resolve(*c);
  // action_ is the step's event so far.
  const std::string change = absl::StrCat(
      binary != binary_ ? absl::StrCat("base ", config_.base_commit, " -> this tree, ")
                        : (on_base() ? "base binary, " : ""),
      daemon_config_.Describe(), next == daemon_config_ ? "" : " -> " + next.Describe());
  action_ += absl::StrCat(" (", change, ")");
  if (auto v = StopDaemon(signal)) return v;
  restarts_.push_back(absl::StrCat("step ", step_, ": ", action_));
  binary_ = binary;
  daemon_config_ = next;
  snapshot_ = std::move(before);
  return StartDaemon();
}

std::optional<Violation> Node::StopDaemon(int signal) {
  probes_.Expect(false);
  daemon_->Signal(signal);
  const int status = daemon_->Wait(kDeadline);
  // What the daemon started ends with it, as in its container (its PID 1's
  // end kills the rest of its PID namespace; runc kills a hostPID
  // container's cgroup), before the next one starts: a hwloc export helper
  // that a SIGKILL left between fork and exec held a copy of the daemon's
  // descriptors, its probe listener too, so the next daemon's bind failed
  // (EADDRINUSE).
  daemon_->KillGroup();
  daemon_.reset();
  if (signal == SIGTERM && status != 0) {
    return Violation{"stops cleanly",
                     absl::StrCat("SIGTERM ended the daemon with status ", status)};
  }
  return std::nullopt;
}

std::vector<std::pair<const Pod*, const Container*>> Node::Running() const {
  std::vector<std::pair<const Pod*, const Container*>> running;
  for (const Pod& pod : pods_) {
    for (const Container& c : pod.containers) {
      if (c.state == Container::State::kRunning && c.efas > 0) running.emplace_back(&pod, &c);
    }
  }
  return running;
}

std::optional<Violation> Node::Apply(const Step& step, size_t number) {
  step_ = number;
  action_ = Info(step.event).name;
  ++counts[action_];
  // Picks one of `n` things (nullopt when there is none).
  auto pick = [&](size_t n) -> std::optional<size_t> {
    if (n == 0) return std::nullopt;
    return step.pick % n;
  };
  // The containers in `state` (init ones or not), across pods.
  auto containers = [&](std::initializer_list<Container::State> states, std::optional<bool> init) {
    std::vector<std::pair<Pod*, Container*>> found;
    for (Pod& pod : pods_) {
      for (Container& c : pod.containers) {
        if (std::find(states.begin(), states.end(), c.state) != states.end() &&
            (!init || c.init == *init)) {
          found.emplace_back(&pod, &c);
        }
      }
    }
    return found;
  };
  auto efas = [&](bool present) {
    std::vector<Efa*> found;
    for (Efa& e : efas_) {
      if (e.present == present) found.push_back(&e);
    }
    return found;
  };
  auto skip = [&](const char* why) -> std::optional<Violation> {
    action_ += absl::StrCat(" (skipped: ", why, ")");
    --counts[Info(step.event).name];
    return std::nullopt;
  };

  if (on_base() && (step.event == Event::kRestartDaemon || step.event == Event::kKillDaemon ||
                    step.event == Event::kReconfigure)) {
    return skip("on the base binary, which is only upgraded");
  }
  switch (step.event) {
    case Event::kAdmit:
    case Event::kAdmitWithInit:
      if (!synced_) return skip("pods not synced");
      return Admit(step, step.event == Event::kAdmitWithInit);
    case Event::kFinishInit: {
      if (!synced_) return skip("pods not synced");
      auto inits = containers({Container::State::kRunning}, true);
      auto chosen = pick(inits.size());
      if (!chosen) return skip("no init container running");
      auto [pod, init] = inits[*chosen];
      init->state = Container::State::kDone;
      action_ += absl::StrCat(" ", pod->uid);
      for (Container& c : pod->containers) {
        if (c.state == Container::State::kWaitingForInit) return Start(*pod, c);
      }
      return std::nullopt;
    }
    case Event::kRestartContainer: {
      if (!synced_) return skip("pods not synced");
      auto started =
          containers({Container::State::kRunning, Container::State::kStartFailed}, std::nullopt);
      auto chosen = pick(started.size());
      if (!chosen) return skip("no container");
      auto [pod, c] = started[*chosen];
      action_ += absl::StrCat(" ", pod->uid, "/", c->name);
      return Start(*pod, *c);
    }
    case Event::kDeletePod: {
      auto chosen = pick(pods_.size());
      if (!chosen) return skip("no pod");
      const std::string uid = pods_[*chosen].uid;
      action_ += " " + uid;
      RecordGone(pods_[*chosen]);
      pods_.erase(pods_.begin() + static_cast<std::ptrdiff_t>(*chosen));
      if (absl::Status s = kubelet_.RemovePod(uid, FakeKubelet::CheckpointWrite::kAsKubelet);
          !s.ok()) {
        return Violation{"harness", std::string(s.message())};
      }
      return std::nullopt;
    }
    case Event::kRestartKubelet:
      return RestartKubelet();
    case Event::kSyncPods:
      if (synced_) return skip("pods synced");
      kubelet_.SyncPods();
      synced_ = true;
      gone_clock_ = Clock::now();
      return std::nullopt;
    case Event::kRestartDaemon:
    case Event::kKillDaemon:
      return RestartDaemon(step.event == Event::kRestartDaemon ? SIGTERM : SIGKILL, binary_,
                           daemon_config_);
    case Event::kReconfigure:
      // A helm upgrade with changed values: the chart's config checksum
      // restarts the daemon (SIGTERM) under the new flags.
      return RestartDaemon(SIGTERM, binary_, DrawConfig(step.shape, config_.kubelet_1_20));
    case Event::kUpgrade:
      // A helm upgrade to this tree's version, with changed values or not.
      if (!on_base()) return skip("upgraded already");
      return RestartDaemon(
          SIGTERM, efa::testing::kPluginBinary,
          step.pick % 2 == 0 ? daemon_config_ : DrawConfig(step.shape, config_.kubelet_1_20));
    case Event::kRemoveEfa: {
      auto present = efas(true);
      auto chosen = pick(present.size());
      if (!chosen) return skip("none present");
      RemoveEfa(*present[*chosen]);
      return std::nullopt;
    }
    case Event::kReturnEfa:
    case Event::kReturnEfaRenamed: {
      auto removed = efas(false);
      auto chosen = pick(removed.size());
      if (!chosen) return skip("none removed");
      ReturnEfa(*removed[*chosen], step.event == Event::kReturnEfaRenamed);
      return std::nullopt;
    }
    case Event::kFillFds:
      return FillFds();
    case Event::kCdiReadOnly:
      if (!daemon_config_.late() || read_only_by == ReadOnlyBy::kNone)
        return skip("no late binding");
      if (read_only_) return skip("read-only already");
      SetCdiReadOnly(true);
      return std::nullopt;
    case Event::kCdiWritable: {
      if (!read_only_) return skip("writable already");
      SetCdiReadOnly(false);
      // The kubelet retries a container that failed to start (back-off).
      if (!synced_) return std::nullopt;
      for (auto [pod, c] : containers({Container::State::kStartFailed}, std::nullopt)) {
        if (auto v = Start(*pod, *c)) return v;
      }
      return std::nullopt;
    }
  }
  return std::nullopt;
}

std::optional<Violation> Node::Admit(const Step& step, bool with_init) {
  const Shape shape = kShapes[step.shape % std::size(kShapes)];
  const bool gpu_first = (step.shape / std::size(kShapes)) % 2 == 0;
  Pod pod{absl::StrCat("uid-", ++next_pod_), {}};
  const std::string name = absl::StrCat("pod-", next_pod_);
  action_ += absl::StrCat(
      " ", pod.uid, ": ", with_init ? absl::StrCat("init ", 1 + step.pick % 4, " EFA, then ") : "",
      shape.gpus, " GPU + ", shape.efas, " EFA, ", gpu_first ? "GPU" : "EFA", " first");
  // Admission allocates every container (init ones first); the container
  // starts once the init containers are done.
  std::vector<std::tuple<std::string, std::vector<std::pair<std::string, int>>,
                         FakeKubelet::ContainerOptions>>
      wanted;
  // Pods ask for the name the daemon serves now (after a rename, new pods
  // are written for it); the running ones keep theirs.
  const std::string efa = daemon_config_.resource();
  // The init container starts only once every container of the pod is
  // admitted: the kubelet's admission allocates the devices of all of them
  // (init ones first; topologymanager scope.go, allocateAlignedResources
  // over append(pod.Spec.InitContainers, pod.Spec.Containers...)) before the
  // pod worker starts any, so a pod refused because its app container does
  // not fit never started its init container (nor had it bound).
  if (with_init) {
    wanted.emplace_back(
        "init",
        std::vector<std::pair<std::string, int>>{{efa, static_cast<int>(1 + step.pick % 4)}},
        FakeKubelet::ContainerOptions{.init = true, .start = false});
  }
  std::vector<std::pair<std::string, int>> requests = {{kGpu, shape.gpus}, {efa, shape.efas}};
  if (!gpu_first) std::swap(requests[0], requests[1]);
  wanted.emplace_back("main", requests,
                      FakeKubelet::ContainerOptions{.init = false, .start = !with_init});

  for (auto& [container, asked, options] : wanted) {
    auto admitted = kubelet_.AdmitContainer(name, "default", pod.uid, container, asked, options);
    if (!admitted.ok()) {
      // The kubelet rejects a pod the node cannot hold; anything else is an
      // answer of the daemon's that rejects a pod.
      if (admitted.status().code() == absl::StatusCode::kResourceExhausted) {
        ++counts["admissions refused: node full"];
        action_ += " (refused: node full)";
        if (!pod.containers.empty()) {
          // Its init container's entries stay in the checkpoint until the
          // kubelet writes it again, as a deleted pod's do.
          RecordGone(pod);
          (void)kubelet_.RemovePod(pod.uid, FakeKubelet::CheckpointWrite::kAsKubelet);
        }
        return std::nullopt;
      }
      // What the kubelet was told of a device the answer names: it gives
      // only devices it last heard of as Healthy, but for its init
      // containers' devices, which an app container reuses whatever their
      // health (devicesToAllocate takes devicesToReuse first): the daemon
      // refuses one gone or withheld, and the pod is rejected.
      std::string told;
      const std::string message(admitted.status().message());
      if (const size_t at = message.find("device \""); at != std::string::npos) {
        const std::string id = message.substr(at + 8, message.find('"', at + 8) - at - 8);
        for (const auto& d : kubelet_.devices(efa)) {
          if (d.id() == id) {
            told = absl::StrCat(" (its latest list, as the kubelet had it, said ", id, " is ",
                                d.health(), ")");
            const bool reused = std::any_of(
                pod.containers.begin(), pod.containers.end(), [&](const Container& init) {
                  return init.init && std::count(init.ids.begin(), init.ids.end(), id) > 0;
                });
            if (reused && d.health() != "Healthy") {
              ++counts["admissions refused: an init container's Unhealthy device reused"];
              action_ += " (refused: " + id + " reused Unhealthy)";
              RecordGone(pod);
              (void)kubelet_.RemovePod(pod.uid, FakeKubelet::CheckpointWrite::kAsKubelet);
              return std::nullopt;
            }
          }
        }
      }
      return Violation{"admits", absl::StrCat(pod.uid, "/", container, " at ", Now(), ": ", message,
                                              told, "; ", LastRestart())};
    }
    Container c;
    c.name = container;
    c.init = options.init;
    c.resource = efa;
    c.admitted_when = Now();
    for (const auto& allocation : admitted->allocations) {
      if (allocation.resource != efa) continue;
      c.efas = static_cast<int>(allocation.device_ids.size());
      c.ids = allocation.device_ids;
      // What the kubelet passes to the runtime: the CDI devices field
      // (kubelet 1.28+; 1.20's API has no such field and drops it) and the
      // annotations (every kubelet; the runtime injects the CDI devices of
      // cdi.k8s.io/ keys).
      auto claim_of = [](const std::string& device) { return device.substr(device.find('=') + 1); };
      if (!config_.kubelet_1_20 && allocation.response.cdi_devices_size() > 0) {
        c.claim = claim_of(allocation.response.cdi_devices(0).name());
      }
      for (const auto& [key, value] : allocation.response.annotations()) {
        if (c.claim.empty() && absl::StartsWith(key, efa::plugin::kCdiAnnotationPrefix)) {
          c.claim = claim_of(value);
        }
      }
      for (const auto& spec : allocation.response.devices())
        c.alloc_nodes.push_back(spec.host_path());
      std::sort(c.alloc_nodes.begin(), c.alloc_nodes.end());
      c.alloc_replicas = daemon_config_.replicas;
      const auto recorded = allocation.response.envs().find(efa::plugin::kEnvSharingReplicas);
      if (recorded != allocation.response.envs().end())
        c.recorded_replicas = std::stoi(recorded->second);
    }
    pod.containers.push_back(c);
    Container& added = pod.containers.back();
    if (!options.start) {
      added.state = Container::State::kWaitingForInit;
    } else if (admitted->start_status.ok()) {
      if (auto v = Started(pod, added)) return v;
    } else {
      added.state = Container::State::kStartFailed;
      ++counts["starts failed"];
      action_ +=
          absl::StrCat(" (", container, " not started: ", admitted->start_status.message(), ")");
      if (auto v = CheckRefusal(pod, added, admitted->start_status)) return v;
    }
  }
  pods_.push_back(std::move(pod));
  Pod& admitted = pods_.back();
  if (with_init) return Start(admitted, admitted.containers.front());
  return std::nullopt;
}

std::optional<Violation> Node::Start(Pod& pod, Container& c) {
  // Whether the daemon knows the kubelet IDs of the base binary's bindings
  // of deleted pods (Gone::by_base): their claim records, looked for before
  // the start, which releases a taken-over binding with its record. (It
  // cannot learn them meanwhile: the allocation that gave this container
  // its IDs rewrote the checkpoint without the deleted pods.)
  for (Gone& g : gone_) {
    std::error_code ec;
    if (g.bound && g.by_base && !g.recorded &&
        fs::exists(cdi_dir_ / efa::plugin::ClaimRecordFileName(g.claim), ec)) {
      g.recorded = true;
    }
  }
  const absl::Status status = kubelet_.StartContainer(pod.uid, c.name);
  if (status.ok()) return Started(pod, c);
  // A start the plugin refuses leaves the container waiting: the kubelet
  // retries it, with back-off.
  c.state = Container::State::kStartFailed;
  ++counts["starts failed"];
  action_ += absl::StrCat(" (", pod.uid, "/", c.name, " not started: ", status.message(), ")");
  return CheckRefusal(pod, c, status);
}

void Node::RecordGone(const Pod& pod) {
  for (const Container& c : pod.containers) {
    const std::vector<std::string> holds = Holds(c);
    if (holds.empty()) continue;
    gone_.push_back(Gone{!c.claim.empty(), absl::StrCat(pod.uid, "/", c.name), c.resource, c.ids,
                         holds, c.Counted(), Clock::now(), "", c.claim, c.bound_by_base});
  }
  std::erase_if(gone_, [&](const Gone& g) { return !Held(g); });
}

bool Node::Held(const Gone& g) const {
  // Released: the daemon deletes the spec with the binding.
  std::error_code ec;
  if (g.bound && !fs::exists(cdi_dir_ / efa::plugin::CdiSpecFileName(g.claim), ec)) return false;
  // The daemon releases a deleted pod's binding once the kubelet's records
  // (its checkpoint and pod-resources List) have lacked its container on two
  // looks release_after apart within one run of the daemon
  // (LateBinder::ReleaseGone): a restarted daemon cannot know how long the
  // container has been gone and confirms it anew, so daemon restarts closer
  // together than release_after keep the binding (safe: only what it saw
  // itself proves a container gone). A restarted kubelet reads a deleted
  // pod's checkpoint entries back and keeps them until its pods are synced
  // (SyncPods drops them), and the daemon counts them live meanwhile. A
  // by-ID holder's entries stay until the kubelet writes the file again,
  // which the daemon asks for anew after each of these.
  return Clock::now() - std::max(g.when, gone_clock_) <= kReleaseWindow;
}

std::string Node::Now() const {
  return absl::StrCat("step ", step_, " (", on_base() ? "base binary, " : "",
                      daemon_config_.Describe(), ")");
}

std::string Node::LastRestart() const {
  return restarts_.empty() ? std::string("the daemon has not restarted")
                           : absl::StrCat("the daemon's latest restart: ", restarts_.back());
}

std::string Node::Describe(const Pod& pod, const Container& c) const {
  return absl::StrCat(
      pod.uid, "/", c.name, " (", c.efas, " ", c.resource, ", admitted at ", c.admitted_when,
      c.held.empty()
          ? ""
          : absl::StrCat(
                ", given ", Nodes(c.held), " at ", c.held_when,
                c.held_replicas > 1 ? absl::StrCat(" to share ", c.held_replicas) : " exclusively"),
      ")");
}

std::string Node::DeviceNode(const Efa& efa) const {
  return (sim_.path() / "dev/infiniband" / absl::StrCat("uverbs", efa.uverbs)).string();
}

Resolved Node::Resolve(const Container& c) const {
  Resolved r{c.alloc_nodes, ""};
  if (!c.claim.empty()) {
    const fs::path spec = cdi_dir_ / efa::plugin::CdiSpecFileName(c.claim);
    const std::string text = efa::testing::ReadFile(spec);
    const auto json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (text.empty() || json.is_discarded()) {
      r.problem = absl::StrCat(spec.string(), text.empty() ? " is missing" : " does not parse");
      return r;
    }
    for (const auto& device : json.value("devices", nlohmann::json::array())) {
      for (const auto& node :
           device["containerEdits"].value("deviceNodes", nlohmann::json::array())) {
        r.nodes.push_back(node.value("hostPath", node.value("path", "")));
      }
    }
  }
  std::sort(r.nodes.begin(), r.nodes.end());
  return r;
}

std::vector<std::string> Node::Holds(const Container& c) const {
  if (c.held.empty() && !c.claim.empty()) return Resolve(c).nodes;
  return c.holds();
}

std::optional<Violation> Node::Started(const Pod& pod, Container& c) {
  c.state = Container::State::kRunning;
  const Resolved now = Resolve(c);
  if (!now.problem.empty() && c.held.empty() &&
      (!daemon_config_.late() || c.resource != daemon_config_.resource())) {
    // Admitted under late binding, never started, and now no
    // PreStartContainer comes for it (the daemon no longer late-binds, or
    // serves the other name): the daemon binds it beforehand
    // (LateBinder::BindUnstarted, on its own passes), and cannot when every
    // EFA is held. The runtime then refuses to create it ("unresolvable CDI
    // devices"), the kubelet counts a failed start (CreateContainerError)
    // and retries it with back-off: a refusal, judged as PreStartContainer's
    // are (free EFAs and none bound is a violation).
    c.state = Container::State::kStartFailed;
    ++counts["starts failed"];
    action_ += absl::StrCat(" (", pod.uid, "/", c.name, " not created: ", now.problem, ")");
    // A spec the daemon could not write (a read-only CDI dir) is no
    // refusal for want of EFAs; it writes it at its next pass (ReleaseGone,
    // every recheck_every while bindings exist, or the next checkpoint
    // change), as the kubelet's back-off retries the start.
    if (read_only_ || Clock::now() - cdi_writable_since_ <= kReleaseWindow) return std::nullopt;
    return CheckRefusal(
        pod, c,
        absl::FailedPreconditionError(absl::StrCat(
            "the daemon did not bind it before its start (cannot bind, as its log says): ",
            now.problem)));
  }
  if (!now.problem.empty()) {
    // The runtime cannot create it ("unresolvable CDI devices").
    return Violation{
        "a container's CDI device resolves when it starts",
        absl::StrCat(Describe(pod, c), " started at ", Now(),
                     " (the kubelet let it through): ", now.problem, "; ", LastRestart())};
  }
  // A deleted pod's kubelet ID given to this container: its start let the
  // daemon release what it had bound for that pod (LateBinder::
  // ReleaseTakenOver; a start that failed may have changed nothing). Only
  // when the daemon bound this one (late-bound: PreStartContainer, or
  // BindUnstarted before its start): a container given device nodes by ID
  // (best effort, alignment off) is bound by nothing, and the deleted pod's
  // binding stays until the daemon confirms it gone (ReleaseGone).
  for (Gone& g : gone_) {
    if (c.claim.empty()) break;
    if (g.by_base && !g.recorded && !on_base()) continue;  // its IDs unknown (Gone::by_base)
    for (const std::string& id : c.ids) {
      if (g.taken_over.empty() && g.resource == c.resource &&
          std::count(g.ids.begin(), g.ids.end(), id) > 0) {
        g.taken_over = absl::StrCat(id, " to ", pod.uid, "/", c.name);
      }
    }
  }
  if (now.nodes != c.held) {
    c.held = now.nodes;
    c.held_when = Now();
    // Late-bound: shared as the daemon's replicas when it bound the claim
    // if admitted with replica IDs, else exclusive (LateBinder::Bind). It
    // may have bound it before, under another configuration (an init
    // container's claim its app container reuses, BindUnstarted): then its
    // record says (the base binary writes none).
    c.held_replicas =
        c.claim.empty() || c.alloc_replicas == 1 ? c.alloc_replicas : daemon_config_.replicas;
    if (!c.claim.empty()) {
      const fs::path record = cdi_dir_ / efa::plugin::ClaimRecordFileName(c.claim);
      if (auto parsed = efa::plugin::ParseClaimRecord(efa::testing::ReadFile(record), c.claim,
                                                      record.string());
          parsed.ok() && parsed->version == efa::plugin::kClaimRecordVersion) {
        c.held_replicas = parsed->replicas;
      }
    }
    c.bound_by_base = !c.claim.empty() && on_base();
  }
  return std::nullopt;
}

std::optional<Violation> Node::CheckRefusal(const Pod& pod, const Container& c,
                                            const absl::Status& status) {
  // Late binding's refusal for want of EFAs (LateBinder::Bind).
  if (!absl::StrContains(status.message(), "cannot bind")) return std::nullopt;
  // Holders of each device node: every container of a live pod (its start's
  // nodes, else its answer's), but c and its own claim; deleted pods' bound
  // containers until taken over or released.
  std::map<std::string, std::vector<int>> holders;  // node -> holders' replicas
  std::vector<const Pod*> live;
  for (const Pod& p : pods_) live.push_back(&p);
  // A pod being admitted is not in pods_ yet.
  if (std::none_of(pods_.begin(), pods_.end(), [&](const Pod& p) { return &p == &pod; }))
    live.push_back(&pod);
  for (const Pod* p : live) {
    for (const Container& o : p->containers) {
      if (&o == &c || (!c.claim.empty() && o.claim == c.claim)) continue;
      for (const std::string& n : Holds(o)) {
        holders[n].push_back(o.Counted());
      }
    }
  }
  // What became of deleted pods' holdings: bindings, and EFAs held by ID
  // (the daemon counts the kubelet checkpoint's entries, which stay until
  // the kubelet writes it again: Held).
  std::vector<std::string> deleted;
  for (const Gone& g : gone_) {
    if (!g.taken_over.empty()) {
      deleted.push_back(
          absl::StrCat(g.who, "'s ", Nodes(g.nodes), " free (its ID ", g.taken_over, ")"));
      continue;
    }
    if (!Held(g)) continue;
    deleted.push_back(absl::StrCat(
        g.who, "'s ", Nodes(g.nodes), " held (deleted ",
        std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - g.when).count(), " s ago",
        g.by_base && !g.recorded ? ", bound by the base binary, no claim record" : "", ")"));
    for (const std::string& n : g.nodes) holders[n].push_back(g.replicas);
  }
  // A spec still on disk whose container no live pod has: one the daemon
  // could not delete (a read-only CDI dir), or one a daemon recovered
  // without its owner (written by the base binary, which keeps no record).
  // The daemon recovers it at its start and keeps its EFAs until the
  // kubelet's records confirm the container gone over release_after
  // (LateBinder::ReleaseGone): they count as held meanwhile.
  std::set<std::string> live_claims;
  for (const Pod* p : live) {
    for (const Container& o : p->containers) live_claims.insert(o.claim);
  }
  std::error_code ec;
  for (fs::directory_iterator it(cdi_dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string claim = efa::plugin::ClaimOfSpecFile(it->path().filename().string());
    if (claim.empty() || claim == c.claim || live_claims.count(claim)) continue;
    Container orphan;
    orphan.claim = claim;
    const Resolved spec = Resolve(orphan);
    // Shared as its record says: the daemon recovers it so (without one,
    // exclusive until it learns the owner's IDs).
    const std::string record =
        efa::testing::ReadFile(cdi_dir_ / efa::plugin::ClaimRecordFileName(claim));
    const auto parsed = efa::plugin::ParseClaimRecord(record, claim, claim);
    const int replicas = parsed.ok() ? parsed->replicas : 1;
    for (const std::string& n : spec.nodes) holders[n].push_back(replicas);
    if (!spec.nodes.empty())
      deleted.push_back(absl::StrCat(claim, "'s spec ", Nodes(spec.nodes), " still on disk"));
  }
  // A claim of plain IDs (admitted while the replicas were 1) is bound to
  // EFAs no one holds, all it asks (LateBinder::Bind); one of replica IDs
  // to as many EFAs with room as there are, at least one.
  const bool exclusive = daemon_config_.replicas == 1 || c.alloc_replicas == 1;
  std::vector<std::string> free;
  for (const Efa& e : efas_) {
    if (!e.present) continue;
    const auto it = holders.find(DeviceNode(e));
    int limit = daemon_config_.replicas;
    size_t held_by = 0;
    if (it != holders.end()) {
      held_by = it->second.size();
      for (int r : it->second) limit = std::min(limit, r);
    }
    if (exclusive ? held_by == 0 : static_cast<int>(held_by) < limit) free.push_back(DeviceNode(e));
  }
  const size_t wanted = exclusive ? static_cast<size_t>(c.efas) : 1;
  if (free.size() < wanted) return std::nullopt;
  return Violation{
      "a start is refused for want of EFAs only when none is free",
      absl::StrCat(Describe(pod, c), " was refused at ", Now(), ": ", status.message(), "; but ",
                   free.size(), " EFAs are held by no live container (", Nodes(free), ")",
                   deleted.empty() ? "" : "; deleted pods: " + absl::StrJoin(deleted, ", "), "; ",
                   LastRestart())};
}

std::optional<Violation> Node::RestartKubelet() {
  const std::string resource = daemon_config_.resource();
  const int before = kubelet_.registrations(resource);
  // A plugin registers again when kubelet.sock is created anew; the GPU
  // plugin is made to, the daemon must notice by itself.
  gpus_.Stop();
  if (absl::Status s = kubelet_.Restart(); !s.ok())
    return Violation{"harness", std::string(s.message())};
  synced_ = false;
  gone_clock_ = Clock::now();
  const int calls = kubelet_.pod_resources_calls();
  if (absl::Status s = gpus_.Start(); !s.ok())
    return Violation{"harness", std::string(s.message())};
  if (!daemon_) return std::nullopt;
  if (!kubelet_.WaitForRegistrations(resource, before + 1, kDeadline) ||
      !kubelet_.WaitForStreaming(resource, true, kDeadline)) {
    return Violation{"re-registers",
                     "the daemon did not register within 10 s of a kubelet restart"};
  }
  // Let the daemon look at the empty List once (it does so when the
  // checkpoint is written), so that what it makes of it is checked now.
  kubelet_.WaitForPodResourcesCalls(calls + 1, 1s);
  return std::nullopt;
}

void Node::RemoveEfa(Efa& efa) {
  // Gone as the daemon sees a device go: the class entries and the device
  // node; the kernel counts a uevent.
  const fs::path sys = sim_.sys();
  std::error_code ec;
  fs::remove(sys / "class/infiniband" / efa.udev_name, ec);
  fs::remove(sys / "class/infiniband_verbs" / absl::StrCat("uverbs", efa.uverbs), ec);
  fs::remove(sim_.path() / "dev/infiniband" / absl::StrCat("uverbs", efa.uverbs), ec);
  (void)efa::sim::CountUevent(sim_.path().string());
  efa.present = false;
  efa.changed = Clock::now();
  action_ += " " + efa.udev_name;
}

void Node::ReturnEfa(Efa& efa, bool renamed) {
  const fs::path sys = sim_.sys();
  const std::string uverbs = absl::StrCat("uverbs", efa.uverbs);
  const fs::path verbs_dir = efa.ib_dir.parent_path() / "infiniband_verbs" / uverbs;
  // The kernel adds it under its own name; udev renames it at once.
  const std::string first = renamed ? efa.kernel_name : efa.udev_name;
  if (renamed) {
    fs::rename(efa.ib_dir / efa.udev_name, efa.ib_dir / first);
    efa::testing::WriteFile(verbs_dir / "ibdev", first + "\n");
  }
  fs::create_directory_symlink(efa.ib_dir / first, sys / "class/infiniband" / first);
  fs::create_directory_symlink(verbs_dir, sys / "class/infiniband_verbs" / uverbs);
  sim_.RestoreUverbs(efa.uverbs);  // counts a uevent
  if (renamed) {
    efa::testing::WriteFile(verbs_dir / "ibdev", efa.udev_name + "\n");
    fs::rename(efa.ib_dir / first, efa.ib_dir / efa.udev_name);
    fs::remove(sys / "class/infiniband" / first);
    fs::create_directory_symlink(efa.ib_dir / efa.udev_name,
                                 sys / "class/infiniband" / efa.udev_name);
    (void)efa::sim::CountUevent(sim_.path().string());
  }
  efa.present = true;
  efa.changed = Clock::now();
  action_ += " " + efa.udev_name + (renamed ? " (as " + efa.kernel_name + ")" : "");
}

std::optional<Violation> Node::FillFds() {
  const pid_t pid = daemon_->pid();
  // The lowest descriptor the daemon does not hold: a limit there makes its
  // next open fail with EMFILE, as a full table does.
  auto lowest_free = [pid] {
    std::set<int> held;
    std::error_code ec;
    for (fs::directory_iterator it(absl::StrCat("/proc/", pid, "/fd"), ec), end; !ec && it != end;
         it.increment(ec)) {
      int fd = 0;
      if (absl::SimpleAtoi(it->path().filename().string(), &fd)) held.insert(fd);
    }
    rlim_t free = 0;
    while (held.count(static_cast<int>(free))) ++free;
    return free;
  };
  rlimit old{};
  if (::prlimit(pid, RLIMIT_NOFILE, nullptr, &old) != 0) {
    return Violation{"harness", absl::StrCat("prlimit ", pid, ": ", std::strerror(errno))};
  }
  probes_.Pause(true);
  fd_full_begin_ = Clock::now();
  // Something for the daemon to look at while it cannot open anything: a
  // change in a directory it watches makes it list the devices again. Done
  // a few times over the window, the limit lowered to each new hole (a
  // descriptor the daemon closed meanwhile would let an open through).
  const fs::path poke = sim_.path() / "dev/infiniband/.lifecycle";
  rlimit full = {lowest_free(), old.rlim_max};
  int status = -1;
  for (int round = 0; round < 5 && status == -1; ++round) {
    full.rlim_cur = std::min(full.rlim_cur, lowest_free());
    ::prlimit(pid, RLIMIT_NOFILE, &full, nullptr);
    efa::testing::WriteFile(poke, "");
    fs::remove(poke);
    // Ended early only by the daemon's death.
    status = daemon_->Wait(std::chrono::duration_cast<std::chrono::milliseconds>(kFdWindow) / 5);
  }
  ::prlimit(pid, RLIMIT_NOFILE, &old, nullptr);
  fd_full_end_ = Clock::now();
  probes_.Pause(false);
  action_ += absl::StrCat(" (limit ", full.rlim_cur, " for ", kFdWindow.count(), " ms)");
  if (status != -1) {
    daemon_.reset();
    return Violation{"never exits", absl::StrCat("the daemon exited with status ", status,
                                                 " while its descriptor table was full")};
  }
  return std::nullopt;
}

void Node::SetCdiReadOnly(bool read_only) {
  if (read_only == read_only_) return;
  if (read_only_by == ReadOnlyBy::kBindMount) {
    if (read_only) {
      ::mount(cdi_dir_.c_str(), cdi_dir_.c_str(), nullptr, MS_BIND, nullptr);
      ::mount(nullptr, cdi_dir_.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr);
    } else {
      ::umount2(cdi_dir_.c_str(), MNT_DETACH);
    }
  } else if (read_only_by == ReadOnlyBy::kModes) {
    fs::permissions(cdi_dir_, read_only ? fs::perms::owner_read | fs::perms::owner_exec |
                                              fs::perms::group_read | fs::perms::group_exec |
                                              fs::perms::others_read | fs::perms::others_exec
                                        : fs::perms::owner_all | fs::perms::group_read |
                                              fs::perms::group_exec | fs::perms::others_read |
                                              fs::perms::others_exec);
  }
  read_only_ = read_only;
  if (!read_only) cdi_writable_since_ = Clock::now();
}

std::optional<Violation> Node::Check() {
  if (daemon_) {
    const int status = daemon_->Wait(0ms);
    if (status != -1) {
      daemon_.reset();
      return Violation{"never exits", absl::StrCat("the daemon exited with status ", status)};
    }
  }
  if (auto gap = probes_.TakeWorstGap(); gap > kProbePeriod) {
    return Violation{
        "answers its probes",
        absl::StrCat("/healthz went unanswered for ",
                     std::chrono::duration_cast<std::chrono::milliseconds>(gap).count(),
                     " ms (the probe period is 10 s)")};
  }
  if (auto v = CheckAdvertised()) return v;
  if (auto v = CheckSnapshot()) return v;
  if (auto v = CheckHeld()) return v;
  return CheckEfasApart();
}

std::optional<Violation> Node::CheckSnapshot() {
  if (!snapshot_) return std::nullopt;
  const std::map<std::string, Resolved> before = *std::exchange(snapshot_, std::nullopt);
  for (const auto& [pod, c] : Running()) {
    const std::string who = absl::StrCat(pod->uid, "/", c->name);
    auto it = before.find(who);
    if (it == before.end()) continue;
    ++counts["device nodes compared across daemon restarts"];
    const Resolved now = Resolve(*c);
    if (now.nodes == it->second.nodes && now.problem == it->second.problem) continue;
    auto what = [](const Resolved& r) {
      return r.problem.empty() ? Nodes(r.nodes)
                               : absl::StrCat(Nodes(r.nodes), " (", r.problem, ")");
    };
    return Violation{
        "a running container's device nodes are the same before and after a daemon "
        "restart",
        absl::StrCat(Describe(*pod, *c), ": before ", restarts_.back(), " ", what(it->second),
                     ", after it ", what(now))};
  }
  return std::nullopt;
}

std::optional<Violation> Node::CheckHeld() {
  for (const auto& [pod, c] : Running()) {
    if (c->claim.empty()) continue;
    const Resolved now = Resolve(*c);
    if (!now.problem.empty()) {
      return Violation{"a running container's CDI device resolves",
                       absl::StrCat(Describe(*pod, *c), ": ", now.problem, "; ", LastRestart())};
    }
    if (now.nodes != c->held) {
      return Violation{"a running container keeps its device nodes",
                       absl::StrCat(Describe(*pod, *c), ": its CDI spec names ", Nodes(now.nodes),
                                    " now; ", LastRestart())};
    }
    const int n = static_cast<int>(now.nodes.size());
    if (c->held_replicas == 1 ? n != c->efas : (n < 1 || n > c->efas)) {
      return Violation{"a running container's CDI device resolves",
                       absl::StrCat(Describe(*pod, *c), ": its spec names ", n,
                                    " device nodes for ", c->efas, " EFA")};
    }
  }
  return std::nullopt;
}

std::optional<Violation> Node::CheckAdvertised() {
  // Which EFA each name is, and what the kubelet must be told of it.
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < efas_.size(); ++i) {
    index[efas_[i].udev_name] = i;
    index[efas_[i].kernel_name] = i;
  }
  // EFAs a live container holds (or a deleted pod's, not released yet): the
  // daemon may withhold them (advertise them Unhealthy). Read at each look:
  // the daemon binds a claim admitted under late binding and never started
  // on its own passes (LateBinder::BindUnstarted), at any time.
  auto held_now = [&] {
    std::set<std::string> held;
    for (const Pod& pod : pods_) {
      for (const Container& c : pod.containers) {
        const std::vector<std::string> holds = Holds(c);
        held.insert(holds.begin(), holds.end());
        // And what its claim's spec binds now: a finished init container's
        // claim, released when the app container reused its IDs, is bound
        // again by a daemon restarted without late binding, which cannot
        // tell it from one not started yet (BindUnstarted; pod-resources
        // List has no init containers): withheld until the pod ends.
        if (c.init && c.state == Container::State::kDone && !c.claim.empty()) {
          const std::vector<std::string> bound = Resolve(c).nodes;
          held.insert(bound.begin(), bound.end());
        }
      }
    }
    for (const Gone& g : gone_) {
      if (Held(g)) held.insert(g.nodes.begin(), g.nodes.end());
    }
    // A spec on disk that no live container's claim names (one a read-only
    // CDI dir kept after its release): the daemon recovers it at its start
    // and keeps it until it confirms the container gone (Held).
    if (Clock::now() - gone_clock_ <= kReleaseWindow) {
      std::set<std::string> live_claims;
      for (const Pod& pod : pods_) {
        for (const Container& c : pod.containers) live_claims.insert(c.claim);
      }
      std::error_code ec;
      for (fs::directory_iterator it(cdi_dir_, ec), end; !ec && it != end; it.increment(ec)) {
        Container orphan;
        orphan.claim = efa::plugin::ClaimOfSpecFile(it->path().filename().string());
        if (orphan.claim.empty() || live_claims.count(orphan.claim)) continue;
        const std::vector<std::string> nodes = Resolve(orphan).nodes;
        held.insert(nodes.begin(), nodes.end());
      }
    }
    return held;
  };
  const int replicas = daemon_config_.replicas;
  const std::string resource = daemon_config_.resource();
  std::string wrong;
  auto matches = [&](const std::vector<v1beta1::Device>& devices) {
    std::vector<std::string> problems;
    const std::set<std::string> held = held_now();
    std::vector<std::set<int>> seen(efas_.size());
    for (const auto& d : devices) {
      std::string name = d.id();
      int replica = 0;
      if (replicas > 1) {
        const auto ref = efa::topology::ParseReplicaId(d.id());
        if (!ref) {
          problems.push_back(absl::StrCat(d.id(), " is no replica ID (replicas ", replicas, ")"));
          continue;
        }
        name = ref->ibdev;
        replica = ref->replica;
      }
      auto it = index.find(name);
      if (it == index.end() || replica >= replicas) {
        problems.push_back(d.id() + " is no EFA of the node");
        continue;
      }
      const Efa& efa = efas_[it->second];
      if (!seen[it->second].insert(replica).second) problems.push_back(d.id() + " is listed twice");
      // Removed or returned just before the descriptor table filled: the
      // listing its event set off may have failed (the last known state
      // kept), and the periodic rescan sees it (--rescan-interval).
      if (efa.changed + kMissedEvent >= fd_full_begin_ && efa.changed <= fd_full_end_ &&
          Clock::now() < fd_full_end_ + kRescanInterval) {
        continue;
      }
      // Late binding reserves nothing (LateBinder::Reserved): a returned EFA
      // is Healthy again once the daemon sees it, held or not.
      const bool withheld = (!daemon_config_.late() || on_base()) &&
                            held.count(DeviceNode(efa)) > 0 && d.health() == "Unhealthy";
      if (efa.present && (name != efa.udev_name || (d.health() != "Healthy" && !withheld))) {
        problems.push_back(
            absl::StrCat(d.id(), " is ", d.health(), ", but ", efa.udev_name, " is there"));
      }
      if (!efa.present && d.health() == "Healthy")
        problems.push_back(d.id() + " is Healthy, but gone");
    }
    for (size_t i = 0; i < efas_.size(); ++i) {
      if (efas_[i].present && static_cast<int>(seen[i].size()) != replicas) {
        problems.push_back(absl::StrCat(efas_[i].udev_name, " is listed as ", seen[i].size(),
                                        " of its ", replicas, " replicas"));
      }
    }
    const size_t all = problems.size();
    if (all > 4) problems.resize(4);
    wrong = absl::StrCat(absl::StrJoin(problems, "; "),
                         all > 4 ? absl::StrCat("; and ", all - 4, " more") : "");
    return problems.empty();
  };
  if (!kubelet_.WaitForStreaming(resource, true, kQuiet)) {
    return Violation{"registered", absl::StrCat("the daemon's ListAndWatch stream of ", resource,
                                                " is not open")};
  }
  if (!kubelet_.WaitForDevices(resource, matches, kQuiet)) {
    return Violation{"advertises the node's truth",
                     absl::StrCat(resource, " under ", daemon_config_.Describe(), ": ", wrong)};
  }
  return std::nullopt;
}

std::optional<Violation> Node::CheckEfasApart() {
  // Device node -> the running containers holding it.
  std::map<std::string, std::vector<std::pair<const Pod*, const Container*>>> holders;
  for (const auto& [pod, c] : Running()) {
    ++counts["running containers checked"];
    for (const std::string& node : c->held) {
      ++counts["device nodes checked"];
      holders[node].emplace_back(pod, c);
    }
  }
  for (const auto& [node, who] : holders) {
    int limit = who.front().second->held_replicas;
    for (const auto& [pod, c] : who) limit = std::min(limit, c->held_replicas);
    if (static_cast<int>(who.size()) <= limit) continue;
    std::vector<std::string> names;
    for (const auto& [pod, c] : who) names.push_back(Describe(*pod, *c));
    return Violation{
        "no EFA in more running containers than it was given for",
        absl::StrCat(fs::path(node).filename().string(), " is in ", who.size(),
                     " running containers: ", absl::StrJoin(names, "; "), "; ", LastRestart())};
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// The generator: what happens next on a node in the state `node` is in.

Step Generate(std::mt19937& rng, const Node& node, const Config& config) {
  std::vector<std::pair<Event, int>> weights;
  auto add = [&](Event event, int weight) {
    if (weight > 0 && config.excluded.count(Info(event).group) == 0)
      weights.emplace_back(event, weight);
  };
  const bool synced = node.synced();
  add(Event::kAdmit, synced ? 30 : 0);
  add(Event::kAdmitWithInit, synced ? 6 : 0);
  add(Event::kFinishInit, synced && node.any(Container::State::kRunning, true) ? 12 : 0);
  add(Event::kRestartContainer, synced && node.pods() > 0 ? 10 : 0);
  add(Event::kDeletePod, node.pods() > 0 ? 5 + 3 * node.pods() : 0);
  add(Event::kRestartKubelet, 4);
  add(Event::kSyncPods, synced ? 0 : 40);
  // On the base binary the daemon only runs: its restarts' and
  // configuration changes' bugs are known (issue 42); the upgrade step is
  // the first restart.
  add(Event::kRestartDaemon, node.on_base() ? 0 : 2);
  add(Event::kKillDaemon, node.on_base() ? 0 : 2);
  add(Event::kRemoveEfa, 4);
  add(Event::kReturnEfa, node.removed_efas() > 0 ? 6 : 0);
  add(Event::kReturnEfaRenamed, node.removed_efas() > 0 ? 3 : 0);
  add(Event::kFillFds, 2);
  add(Event::kCdiReadOnly, node.daemon_config().late() && !node.read_only() ? 2 : 0);
  add(Event::kCdiWritable, node.read_only() ? 25 : 0);
  add(Event::kReconfigure, node.on_base() ? 0 : 3);
  add(Event::kUpgrade, node.on_base() ? 4 : 0);
  int total = 0;
  for (const auto& [event, weight] : weights) total += weight;
  int r = static_cast<int>(rng() % static_cast<uint32_t>(total));
  Step step{weights.back().first, static_cast<uint32_t>(rng()), static_cast<uint32_t>(rng())};
  for (const auto& [event, weight] : weights) {
    if ((r -= weight) < 0) {
      step.event = event;
      break;
    }
  }
  return step;
}

// ---------------------------------------------------------------------------
// Runs, replays and shrinking

struct Outcome {
  std::optional<Violation> violation;
  size_t failed_at = 0;  // the step (0-based) after which it broke
  std::vector<Step> steps;
  std::vector<std::string> actions;
  std::string log_tail;  // the daemon's last log lines when it broke
  double seconds = 0;
  std::map<std::string, int> counts;
};

// Whether a run starts on the base commit's binary: when there is one, and
// the steps upgrade (generated steps may, unless upgrades are excluded).
bool StartsOnBase(const Config& config, const std::vector<Step>& steps, bool generated) {
  if (config.base_binary.empty()) return false;
  if (generated) return config.excluded.count(Info(Event::kUpgrade).group) == 0;
  return std::any_of(steps.begin(), steps.end(),
                     [](const Step& s) { return s.event == Event::kUpgrade; });
}

// Runs `steps` (or, when `generate` is set, that many generated ones) on a
// fresh node, checking after each; stops at the first violation.
Outcome Run(const Config& config, std::vector<Step> steps, std::optional<unsigned> generate_seed,
            int generate_count, bool print = false) {
  Outcome out;
  const auto start = Clock::now();
  std::optional<Node> node;
  try {
    node.emplace(config, StartsOnBase(config, steps, generate_seed.has_value())
                             ? config.base_binary
                             : std::string(efa::testing::kPluginBinary));
  } catch (const std::exception& e) {
    out.violation = Violation{"harness", e.what()};
    return out;
  }
  std::mt19937 rng(generate_seed.value_or(0));
  const size_t n = generate_seed ? static_cast<size_t>(generate_count) : steps.size();
  for (size_t i = 0; i < n; ++i) {
    const Step step = generate_seed ? Generate(rng, *node, config) : steps[i];
    out.steps.push_back(step);
    std::optional<Violation> v = node->Apply(step, i + 1);
    out.actions.push_back(node->last_action());
    if (print) {
      std::printf("  %4zu. %s\n", i + 1, node->last_action().c_str());
    }
    if (!v) v = node->Check();
    if (v) {
      out.violation = v;
      out.failed_at = i;
      const std::string log = efa::testing::ReadFile(node->log());
      std::vector<std::string> lines = absl::StrSplit(log, '\n', absl::SkipEmpty());
      // EFA_LIFECYCLE_LOG_LINES: more of it, to debug a replay.
      const char* keep = std::getenv("EFA_LIFECYCLE_LOG_LINES");
      const size_t tail = keep != nullptr ? std::strtoul(keep, nullptr, 10) : 40;
      if (lines.size() > tail) lines.erase(lines.begin(), lines.end() - static_cast<long>(tail));
      out.log_tail = absl::StrJoin(lines, "\n");
      break;
    }
  }
  out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  out.counts = node->counts;
  return out;
}

// The shortest sequence found that still breaks `invariant`: chunks of
// steps dropped, halving the chunk down to single steps, each candidate
// replayed on a fresh node; stops when `budget` is spent.
std::vector<Step> Shrink(const Config& config, std::vector<Step> steps,
                         const std::string& invariant, std::chrono::seconds budget, int* replays) {
  const auto until = Clock::now() + budget;
  for (size_t chunk = std::max<size_t>(1, steps.size() / 2); chunk >= 1 && Clock::now() < until;
       chunk /= 2) {
    for (size_t at = 0; at < steps.size() && steps.size() > 1 && Clock::now() < until;) {
      std::vector<Step> candidate(steps.begin(), steps.begin() + static_cast<std::ptrdiff_t>(at));
      candidate.insert(
          candidate.end(),
          steps.begin() + static_cast<std::ptrdiff_t>(std::min(steps.size(), at + chunk)),
          steps.end());
      ++*replays;
      Outcome o = Run(config, candidate, std::nullopt, 0);
      if (o.violation && o.violation->invariant == invariant) {
        candidate.resize(o.failed_at + 1);
        steps = candidate;
      } else {
        at += chunk;
      }
    }
    if (chunk == 1) break;
  }
  return steps;
}

std::string ModeName(const Config& config, bool on_base) {
  return absl::StrCat(config.late_binding ? "late-binding" : "best-effort",
                      config.kubelet_1_20 ? ", kubelet 1.20" : "",
                      on_base ? ", upgrading from " + config.base_commit : "");
}

// One seed (or one replayed sequence): runs, reports, shrinks. Returns
// whether every invariant held.
bool RunAndReport(const Config& config, std::optional<unsigned> seed,
                  const std::vector<Step>& replay, int steps, std::chrono::seconds shrink_budget) {
  const bool on_base = StartsOnBase(config, replay, seed.has_value());
  const std::string what = seed ? absl::StrCat("seed ", *seed, " (", ModeName(config, on_base),
                                               ", ", config.machine, ", ", steps, " steps)")
                                : absl::StrCat("replay (", ModeName(config, on_base), ", ",
                                               config.machine, ", ", replay.size(), " steps)");
  Outcome o = Run(config, replay, seed, steps, config.verbose);
  if (!o.violation) {
    std::vector<std::string> counts;
    for (const auto& [name, n] : o.counts) counts.push_back(absl::StrCat(name, " ", n));
    std::printf("lifecycle: %s held: %zu steps in %.1f s (%.1f steps/s): %s\n", what.c_str(),
                o.steps.size(), o.seconds, o.steps.size() / std::max(o.seconds, 1e-3),
                absl::StrJoin(counts, ", ").c_str());
    return true;
  }
  const Violation& v = *o.violation;
  std::printf("lifecycle: %s FAILED at step %zu: %s: %s\n", what.c_str(), o.failed_at + 1,
              v.invariant.c_str(), v.detail.c_str());
  std::printf("lifecycle: the steps up to it:\n");
  const size_t first = o.failed_at >= 40 ? o.failed_at - 39 : 0;
  if (first > 0) std::printf("  ... (%zu earlier steps)\n", first);
  for (size_t i = first; i <= o.failed_at && i < o.actions.size(); ++i) {
    std::printf("  %4zu. %s\n", i + 1, o.actions[i].c_str());
  }
  std::printf("lifecycle: the daemon's last log lines:\n%s\n", o.log_tail.c_str());
  if (v.invariant == "harness") return false;
  std::vector<Step> failing(o.steps.begin(),
                            o.steps.begin() + static_cast<std::ptrdiff_t>(o.failed_at + 1));
  int replays = 0;
  const auto started = Clock::now();
  std::vector<Step> shortest = Shrink(config, failing, v.invariant, shrink_budget, &replays);
  Outcome again = Run(config, shortest, std::nullopt, 0);
  std::printf(
      "lifecycle: shortest failing sequence found: %zu of %zu steps (%d replays, %.0f s)%s:\n",
      shortest.size(), failing.size(), replays,
      std::chrono::duration<double>(Clock::now() - started).count(),
      again.violation ? "" : " (its last replay held: a race)");
  for (size_t i = 0; i < again.actions.size(); ++i)
    std::printf("  %4zu. %s\n", i + 1, again.actions[i].c_str());
  if (again.violation) {
    std::printf("  -> %s: %s\n", again.violation->invariant.c_str(),
                again.violation->detail.c_str());
  }
  std::printf("lifecycle: replay: efa-lifecycle --mode %s --machine %s%s --replay '%s'\n",
              config.late_binding ? "late-binding" : "best-effort", config.machine.c_str(),
              config.kubelet_1_20 ? " --kubelet-1-20" : "", Encode(shortest).c_str());
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  // The processes a daemon leaves behind become this process's children, so
  // that a daemon's stop waits for them (ChildProcess::KillGroup).
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  CLI::App app{"The randomized lifecycle test of the daemon binary on a simulated node"};
  std::vector<unsigned> seeds = {1};
  int steps = 200;
  std::string mode = "both";
  std::string exclude;
  std::string replay;
  int shrink_seconds = 120;
  std::string upgrade = "auto";
  std::string upgrade_from = efa::testing::kUpgradeFromDir;
  Config config;
  app.add_option("--seeds", seeds, "Seeds to run, one run per seed and mode")->delimiter(',');
  app.add_option("--steps", steps, "Steps per run")->check(CLI::PositiveNumber);
  app.add_option("--mode", mode, "late-binding, best-effort or both")
      ->check(CLI::IsMember({"late-binding", "best-effort", "both"}));
  app.add_option("--machine", config.machine, "The simulated machine");
  app.add_option("--exclude", exclude,
                 "Event groups to leave out, comma-separated: pods, init, container-restart, "
                 "kubelet-restart, daemon-restart, daemon-kill, daemon-config, upgrade, hotplug, "
                 "udev-rename, fd-full, cdi-read-only (also EFA_LIFECYCLE_EXCLUDE)");
  app.add_option("--upgrade", upgrade,
                 "Runs start on the base commit's binary and upgrade at a random step: auto "
                 "(when it was built), require (exit 77, a skip, when it was not) or off")
      ->check(CLI::IsMember({"auto", "require", "off"}));
  app.add_option(
      "--upgrade-from", upgrade_from,
      "Where CMake built the base commit's binary (test/lifecycle/build-upgrade-from.sh)");
  app.add_option("--replay", replay,
                 "Replay this sequence (as a failure prints it) instead of seeds");
  app.add_option("--shrink-seconds", shrink_seconds, "Time given to shrinking a failing sequence");
  app.add_flag("--verbose", config.verbose, "Print every step");
  app.add_flag("--kubelet-1-20", config.kubelet_1_20,
               "With --replay: the fake kubelet imitates kubelet 1.20 (seeds: the odd ones do)");
  CLI11_PARSE(app, argc, argv);
  if (const char* env = std::getenv("EFA_LIFECYCLE_EXCLUDE"); env != nullptr && exclude.empty())
    exclude = env;
  std::set<std::string> groups;
  for (const EventInfo& e : kEvents) groups.insert(e.group);
  const std::vector<std::string> excluded = absl::StrSplit(exclude, ',', absl::SkipEmpty());
  for (const std::string& g : excluded) {
    if (groups.count(g) == 0) {
      std::fprintf(stderr, "efa-lifecycle: --exclude: unknown event group \"%s\" (known: %s)\n",
                   g.c_str(), absl::StrJoin(groups, ", ").c_str());
      return 2;
    }
    config.excluded.insert(g);
  }
  if (upgrade == "off") {
    config.excluded.insert(Info(Event::kUpgrade).group);
  } else if (config.excluded.count(Info(Event::kUpgrade).group) == 0) {
    // The build script leaves the binary, or a file saying why there is none.
    const fs::path dir(upgrade_from);
    const fs::path binary = dir / "bin/efa-k8s-device-plugin";
    std::string why = efa::testing::ReadFile(dir / "UNAVAILABLE");
    why.erase(why.find_last_not_of('\n') + 1);
    std::error_code ec;
    if (why.empty() && !fs::exists(binary, ec)) {
      why = absl::StrCat(binary.string(), " was not built (the target efa-lifecycle-upgrade-from)");
    }
    if (why.empty()) {
      config.base_binary = binary.string();
      config.base_commit = efa::testing::ReadFile(dir / "COMMIT");
      config.base_commit.erase(config.base_commit.find_last_not_of('\n') + 1);
      config.base_commit = config.base_commit.substr(0, 7);
    } else {
      std::printf("lifecycle: SKIPPED the upgrade from the base commit: %s\n", why.c_str());
      if (upgrade == "require") return 77;
      config.excluded.insert(Info(Event::kUpgrade).group);
    }
  }
  std::optional<std::vector<Step>> replayed;
  if (!replay.empty()) {
    replayed = Decode(replay);
    if (!replayed) {
      std::fprintf(stderr, "efa-lifecycle: --replay: expected event:pick:shape,..., got \"%s\"\n",
                   replay.c_str());
      return 2;
    }
  }
  // Before any thread: a mount namespace of our own (the daemon inherits
  // it) for the read-only CDI directory, private so that nothing leaks out.
  if (::geteuid() != 0) {
    read_only_by = ReadOnlyBy::kModes;
  } else if (::unshare(CLONE_NEWNS) == 0 &&
             ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0) {
    read_only_by = ReadOnlyBy::kBindMount;
  } else {
    std::printf("lifecycle: cannot make a mount namespace (%s): no read-only CDI directory\n",
                std::strerror(errno));
  }
  ::signal(SIGPIPE, SIG_IGN);

  std::vector<bool> late_binding;
  if (mode != "best-effort") late_binding.push_back(true);
  if (mode != "late-binding") late_binding.push_back(false);
  bool ok = true;
  for (bool late : late_binding) {
    config.late_binding = late;
    if (replayed) {
      ok &= RunAndReport(config, std::nullopt, *replayed, 0, std::chrono::seconds(shrink_seconds));
      continue;
    }
    for (unsigned seed : seeds) {
      config.kubelet_1_20 = seed % 2 == 1;
      ok &= RunAndReport(config, seed, {}, steps, std::chrono::seconds(shrink_seconds));
    }
  }
  return ok ? 0 : 1;
}
