// efa_bench: the benchmark suite of BENCHMARKS.md. It runs the real daemon
// binary on simulated nodes against the fake kubelet, over real gRPC on real
// unix sockets, and reports each figure with its ratio to a baseline taken in
// the same run, as one table (also written to --out).
//   efa_bench [--quick] [--idle-seconds N] [--flood-seconds N] [--rpcs N] [--out FILE]
// scripts/bench.sh builds it in a Release tree and runs it. Exits 0 when
// every measurement ran, goals met or not; 1 when one could not run.
#include <httplib.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "podresources/v1/api.grpc.pb.h"
#include "test/bench/policy_scenarios.h"
#include "test/fake_kubelet/fake_accelerator_plugin.h"
#include "test/fake_kubelet/fake_kubelet.h"
#include "test/sim/machine_spec.h"
#include "test/sim/sim_root.h"
#include "test/support/build_paths.h"
#include "test/support/child_process.h"
#include "test/support/daemon_log.h"
#include "test/support/devices.h"
#include "test/support/http_flood.h"
#include "test/support/proc_stats.h"
#include "topology/hwloc_loader.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using efa::sim::SimRoot;
using efa::testing::ChildProcess;
using efa::testing::FakeAcceleratorPlugin;
using efa::testing::FakeKubelet;

using efa::testing::kDeadline;
using efa::testing::kEfa;
using efa::testing::kGpu;

struct Settings {
  bool quick = false;
  long rpcs = 100000;  // per server, for measures 1 and 4
  int starts = 10;     // daemon starts (3)
  int events = 5;      // device removals and kubelet restarts (6)
  double idle_seconds = 60;
  double flood_seconds = 25;  // each phase of measure 9
  std::string out;
  std::string logs;  // empty: in the simulated node's directory, removed at the end
  std::string plugin = efa::testing::kPluginBinary;
  std::string echo = efa::testing::kEchoBinary;
  // Where the simulated nodes go. In memory, as sysfs is: on disk, a read
  // whose page the host reclaimed waits for the disk, and the owner thread's
  // wake-ups counted those waits (64 a minute on /tmp against 6 on tmpfs,
  // BENCHMARKS.md).
  std::string node_dir = "/dev/shm";
  std::string command;
};

[[noreturn]] void Fail(const std::string& message) { throw std::runtime_error(message); }

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The value at fraction `p` of the sorted samples (nearest rank).
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

// One line of the table. `ratio` is value / baseline (NaN: no baseline to
// divide by); `met` whether the goal is (nullopt: a figure for information,
// with no goal).
struct Row {
  int measure;  // as numbered in BENCHMARKS.md
  std::string figure, value, baseline;
  double ratio;
  std::string goal;
  std::optional<bool> met;
};

// Times `fn` (which returns something to keep it from being optimized
// away) on this thread's CPU clock, so that other load on the machine stays
// out: batches of at least `min_batch` seconds; the median time per call.
volatile size_t sink;
template <typename F>
double TimePerCall(F&& fn, double min_batch, int batches) {
  auto cpu_now = [] {
    timespec t{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
  };
  size_t kept = 0;
  auto run = [&](long n) {
    const double start = cpu_now();
    for (long i = 0; i < n; ++i) kept += fn();
    return cpu_now() - start;
  };
  long n = 1;
  while (run(n) < min_batch) n *= 2;
  std::vector<double> per_call;
  for (int b = 0; b < batches; ++b) per_call.push_back(run(n) / static_cast<double>(n));
  sink = sink + kept;
  return Median(per_call);
}

// An inotify watch of one directory, to see when the kernel reports a
// change there: the earliest any process can learn of it.
class DirectoryWatch {
 public:
  DirectoryWatch(const fs::path& dir, uint32_t mask) : fd_(inotify_init1(IN_CLOEXEC)) {
    if (fd_ < 0 || inotify_add_watch(fd_, dir.c_str(), mask) < 0) Fail(dir.string() + ": inotify");
  }
  ~DirectoryWatch() { ::close(fd_); }
  DirectoryWatch(const DirectoryWatch&) = delete;
  DirectoryWatch& operator=(const DirectoryWatch&) = delete;
  // Whether an event arrived within `timeout`.
  bool Wait(std::chrono::milliseconds timeout) const {
    pollfd p{fd_, POLLIN, 0};
    return ::poll(&p, 1, static_cast<int>(timeout.count())) == 1;
  }

 private:
  const int fd_;
};

// A DevicePlugin client over a unix socket, once the server there answers.
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

// A process watched over an idle window.
struct IdleProcess {
  IdleProcess(std::string process_name, pid_t process_id)
      : name(std::move(process_name)), pid(process_id) {}
  std::string name;
  pid_t pid;
  double cpu = 0;
  std::map<pid_t, efa::testing::ThreadSwitches> switches;
  // Over the window, per minute.
  double cpu_per_minute = 0;
  double wakeups_per_minute = 0;
  double owner_cpu = 0;               // of the main thread: a reading, then per minute
  double own_wakeups_per_minute = 0;  // voluntary switches of the main (owner) thread
  long long rss_kib = 0;
  long long threads = 0;
};

class Suite {
 public:
  explicit Suite(Settings settings)
      : settings_(std::move(settings)),
        p5_spec_(*efa::sim::FindMachine("p5.48xlarge")),
        p5_(p5_spec_),
        kubelet_(FakeKubelet::ForKubeletDir(p5_.path() / "kubelet")),
        gpus_(p5_spec_, efa::testing::AcceleratorKind::kNvidiaGpu,
              p5_.path() / "kubelet/device-plugins") {
    fs::create_directories(logs());
    if (auto s = kubelet_.Start(); !s.ok()) Fail(std::string(s.message()));
    if (auto s = gpus_.Start(); !s.ok()) Fail(std::string(s.message()));
  }

  // Runs every measure; throws std::runtime_error when one cannot run.
  void Run() {
    Progress("2: the allocation policy on synthetic nodes of 32 to 1024 EFAs");
    MeasurePolicy();
    Progress("3: start to registered");
    MeasureStart();
    Progress(absl::StrFormat("1, 4: %s RPCs to the daemon and to the echo server, interleaved",
                             Count(settings_.rpcs)));
    MeasureRpcs();
    Progress(absl::StrFormat("5, 7: %.0f s idle", settings_.idle_seconds));
    MeasureIdle();
    Progress(absl::StrFormat("8: /metrics scraped 10 times a second for %.0f s",
                             settings_.idle_seconds));
    MeasureScrapes();
    Progress("6: device removed, kubelet restarted");
    MeasureEvents();
    Progress(
        absl::StrFormat("9: probes and kubelet restarts for %.0f s, then as long during a flood",
                        settings_.flood_seconds));
    MeasureFlood();
    if (daemon_->Stop(kDeadline) != 0) Fail("the daemon did not stop cleanly on SIGTERM");
    if (echo_->Stop(kDeadline) != 0) Fail("the echo server did not stop cleanly on SIGTERM");
  }

  // The table and the policy curve, as Markdown.
  std::string Markdown() const {
    std::vector<Row> rows = rows_;
    std::stable_sort(rows.begin(), rows.end(),
                     [](const Row& a, const Row& b) { return a.measure < b.measure; });
    std::string out = "| # | figure | value | baseline | ratio | goal | result |\n";
    out += "|---|---|---|---|---|---|---|\n";
    int goals = 0, met = 0;
    for (const Row& r : rows) {
      goals += r.met ? 1 : 0;
      met += r.met.value_or(false) ? 1 : 0;
      out += absl::StrFormat("| %d | %s | %s | %s | %s | %s | %s |\n", r.measure, r.figure, r.value,
                             r.baseline,
                             std::isnan(r.ratio) ? "–" : absl::StrFormat("%.2f×", r.ratio), r.goal,
                             !r.met   ? "info"
                             : *r.met ? "PASS"
                                      : "**MISS**");
    }
    out += absl::StrFormat("\n%d of %d goals met.\n\n", met, goals);
    for (const std::string& d : details_) out += d + "\n";
    out += "\n";
    out += "Policy: CPU time per decision by node size (EFAs; one GPU per 8 EFAs)\n\n";
    out += absl::StrFormat("| scenario | %s |\n|---|", absl::StrJoin(kPolicySizes, " | "));
    for (size_t i = 0; i < kPolicySizes.size(); ++i) out += "---|";
    out += "\n";
    for (const auto& [name, times] : policy_curve_) {
      out += absl::StrFormat("| %s |", name);
      for (double t : times) out += absl::StrFormat(" %s |", Us(t));
      out += "\n";
    }
    return out;
  }

  // The last lines of every log, to tell why something failed.
  void PrintLogTails() const {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(logs(), ec)) {
      std::vector<std::string> lines = absl::StrSplit(ReadFile(entry.path()).value_or(""), '\n');
      std::fprintf(stderr, "--- the end of %s:\n", entry.path().c_str());
      for (size_t i = lines.size() > 20 ? lines.size() - 20 : 0; i < lines.size(); ++i) {
        std::fprintf(stderr, "%s\n", lines[i].c_str());
      }
    }
  }

 private:
  static inline const std::vector<int> kPolicySizes = {32, 64, 128, 256, 512, 1024};

  static void Progress(const std::string& what) {
    std::fprintf(stderr, "efa_bench: measuring %s\n", what.c_str());
  }
  fs::path logs() const {
    return settings_.logs.empty() ? p5_.path() / "logs" : fs::path(settings_.logs);
  }

  // The daemon on `sim`, with the kubelet dir `kubelet` (default: the
  // simulated node's, where the fake kubelet serves).
  std::vector<std::string> DaemonArgs(const SimRoot& sim, const fs::path& kubelet = {}) const {
    std::vector<std::string> args = {settings_.plugin};
    for (const std::string& flag : sim.DaemonFlags()) args.push_back(flag);
    if (!kubelet.empty()) {
      *(std::find(args.begin(), args.end(), "--kubelet-dir") + 1) = kubelet.string();
    }
    args.insert(args.end(), {"--metrics-address", "127.0.0.1:0", "--probe-address", "127.0.0.1:0"});
    return args;
  }

  // 2. ChooseEfas on synthetic nodes, against sorting the same free IDs.
  void MeasurePolicy() {
    const double min_batch = settings_.quick ? 0.002 : 0.02;
    const int batches = settings_.quick ? 3 : 7;
    for (const auto& scenario : efa::bench::PolicyScenarios()) {
      std::vector<double> policy, sort;
      size_t free_ids = 0;
      for (int n : kPolicySizes) {
        const auto model = efa::bench::PolicyHost(n);
        const auto request = scenario.request(*model);
        policy.push_back(TimePerCall(
            [&] { return efa::topology::ChooseEfas(*model, request).size(); }, min_batch, batches));
        std::vector<std::string> shuffled = request.available;
        std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(7));
        sort.push_back(TimePerCall(
            [&] {
              auto ids = shuffled;
              std::sort(ids.begin(), ids.end());
              return ids.size();
            },
            min_batch, batches));
        free_ids = request.available.size();
      }
      policy_curve_.emplace_back(scenario.name, policy);
      const std::string name =
          absl::StrFormat("policy %s (%s)", scenario.name, scenario.description);
      rows_.push_back({2, name + ": 1024 EFAs, 128 GPUs", Us(policy.back()),
                       absl::StrFormat("sort the %d free IDs: %s", free_ids, Us(sort.back())),
                       policy.back() / sort.back(), "≤ 1 ms", policy.back() <= 1e-3});
      const double growth = policy.back() / policy.front();
      const double sort_growth = sort.back() / sort.front();
      rows_.push_back({2, name + ": growth 32 → 1024 EFAs", absl::StrFormat("%.1f×", growth),
                       absl::StrFormat("sort: %.1f×", sort_growth), growth / sort_growth,
                       "≤ 64× (n log n)", growth <= 64});
    }
  }

  // 3. Process start to Register received, against hwloc loading the same
  // node in this process.
  void MeasureStart() {
    std::vector<double> registered, hwloc, echo_bound;
    const fs::path echo_dir = p5_.path() / "echo-start";
    fs::create_directories(echo_dir);
    for (int i = 0; i < settings_.starts; ++i) {
      {
        DirectoryWatch watch(echo_dir, IN_CREATE);
        const auto start = Clock::now();
        ChildProcess echo({settings_.echo, (echo_dir / "echo.sock").string()},
                          logs() / "echo-start.log");
        if (!watch.Wait(kDeadline)) Fail("the echo server bound no socket within 10 s");
        echo_bound.push_back(Seconds(Clock::now() - start));
        if (echo.Stop(kDeadline) != 0) Fail("the echo server did not stop on SIGTERM");
      }
      auto start = Clock::now();
      auto topology = efa::topology::LoadTopology({p5_.path().string(), ""});
      if (!topology.ok()) Fail(std::string(topology.status().message()));
      hwloc.push_back(Seconds(Clock::now() - start));

      const int before = kubelet_.registrations(kEfa);
      const int lists = kubelet_.list_and_watch_messages(kEfa);
      start = Clock::now();
      auto daemon = std::make_unique<ChildProcess>(DaemonArgs(p5_), logs() / "daemon-p5.log");
      if (!kubelet_.WaitForRegistrations(kEfa, before + 1, kDeadline)) {
        Fail("the daemon did not register within 10 s");
      }
      registered.push_back(Seconds(Clock::now() - start));
      // Its first device list too, which makes the kubelet rewrite its
      // checkpoint: it must not come in the middle of measure 1's admission
      // (the kubelet keeps the previous daemon's list meanwhile).
      if (!kubelet_.WaitForListAndWatchMessages(kEfa, lists + 1, kDeadline)) {
        Fail("the daemon sent no device list within 10 s of registering");
      }
      if (i + 1 < settings_.starts) {
        if (daemon->Stop(kDeadline) != 0) Fail("the daemon did not stop cleanly on SIGTERM");
      } else {
        daemon_ = std::move(daemon);  // serves the measures that follow
      }
    }
    const double value = Median(registered), echo = Median(echo_bound);
    rows_.push_back(
        {3, absl::StrFormat("start → registered, p5.48xlarge (median of %d)", settings_.starts),
         Ms(value), "bare gRPC server (efa-bench-echo) start → socket bound: " + Ms(echo),
         value / echo, "≤ 1.25× echo", value <= 1.25 * echo});
    const double hwloc_load = Median(hwloc);
    rows_.push_back({3, "hwloc loads the p5 node (the daemon does so after registering)",
                     Ms(hwloc_load), "echo start: " + Ms(echo), hwloc_load / echo, "–",
                     std::nullopt});
  }

  // Puts the node in the state GetPreferredAllocation sees while the kubelet
  // admits a pod of 1 GPU + 4 EFAs, GPU first: pod-resources lists the
  // container with its GPU and no EFA yet, and the checkpoint does not hold
  // it (the kubelet writes it once all of the container's resources are
  // allocated). Returns the GPU's ID.
  std::string AdmitGpuContainer() {
    if (!kubelet_.WaitForStreaming(kGpu, true, kDeadline))
      Fail("the fake GPU plugin streams no GPU");
    const fs::path checkpoint = kubelet_.checkpoint_path();
    const auto before = ReadFile(checkpoint);
    auto admitted =
        kubelet_.AdmitContainer("train-0", "default", "uid-train-0", "main", {{kGpu, 1}});
    if (!admitted.ok()) Fail(std::string(admitted.status().message()));
    if (before) {
      const fs::path tmp = checkpoint.string() + ".bench";
      std::ofstream(tmp, std::ios::binary) << *before;
      fs::rename(tmp, checkpoint);
    } else {
      fs::remove(checkpoint);
    }
    return admitted->allocations[0].device_ids[0];
  }

  // The IDs of the EFAs behind the same PCIe switch as GPU `id`, sorted.
  std::vector<std::string> EfasBeside(const std::string& id) const {
    std::vector<std::string> efas;
    for (const auto& gpu : gpus_.accelerators()) {
      if (gpu.id != id) continue;
      for (const auto& group : p5_spec_.groups) {
        const bool here = std::any_of(group.endpoints.begin(), group.endpoints.end(),
                                      [&](const auto& e) { return e.addr == gpu.address; });
        for (const auto& e : group.endpoints) {
          if (here && e.kind == efa::sim::Kind::kEfa) {
            efas.push_back(efa::sim::VerbsName(e.kind, e.addr, 0, efa::sim::Naming::kUdev));
          }
        }
      }
    }
    std::sort(efas.begin(), efas.end());
    return efas;
  }

  // A v1beta1.DevicePlugin server under measure, and its round trips.
  struct Server {
    Server(std::string server_name, const fs::path& socket, pid_t process_id)
        : name(std::move(server_name)), stub(Connect(socket)), pid(process_id) {}
    std::string name;
    std::unique_ptr<v1beta1::DevicePlugin::Stub> stub;
    pid_t pid;
    long served = 0;
    std::vector<double> allocate, prefer;  // seconds per round trip
    std::vector<std::string> preferred;    // the latest answer, sorted
  };

  // 1 and 4. Allocate and GetPreferredAllocation round trips of the daemon,
  // of a second daemon that needs no lookup, of the echo server and the
  // pod-resources List, all interleaved; then the resident memory after
  // that load and after the same load from several clients at once.
  void MeasureRpcs() {
    auto healthy32 = [](const std::vector<v1beta1::Device>& devices) {
      return devices.size() == 32 && std::all_of(devices.begin(), devices.end(),
                                                 [](auto& d) { return d.health() == "Healthy"; });
    };
    if (!kubelet_.WaitForDevices(kEfa, healthy32, kDeadline)) Fail("the daemon lists no 32 EFAs");
    for (const auto& d : kubelet_.devices(kEfa)) ids_.push_back(d.id());
    const std::vector<std::string> aligned = EfasBeside(AdmitGpuContainer());
    if (aligned.size() != 4) Fail("the GPU has no 4 EFAs beside it");

    const fs::path echo_socket = p5_.path() / "echo/echo.sock";
    fs::create_directories(echo_socket.parent_path());
    echo_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{settings_.echo, echo_socket.string()}, logs() / "echo.log");
    // The same node seen by a daemon with no pod-resources API to ask (its
    // kubelet dir holds nothing): GetPreferredAllocation needs no lookup.
    // It serves its socket without registering.
    const fs::path lone_kubelet = p5_.path() / "kubelet-absent";
    ChildProcess lone_daemon(DaemonArgs(p5_, lone_kubelet), logs() / "daemon-no-lookup.log");
    Server daemon("the daemon",
                  p5_.path() / "kubelet/device-plugins/efa/aws-efa-device-plugin.sock",
                  daemon_->pid());
    Server echo("the echo server", echo_socket, echo_->pid());
    Server lone("the daemon without pod-resources",
                lone_kubelet / "device-plugins/efa/aws-efa-device-plugin.sock", lone_daemon.pid());
    // Its baseline: a second echo server, called as often (a process called
    // less often has colder threads).
    const fs::path rare_echo_socket = p5_.path() / "echo/rare-echo.sock";
    ChildProcess rare_echo_process({settings_.echo, rare_echo_socket.string()},
                                   logs() / "echo-rare.log");
    Server rare_echo("the second echo server", rare_echo_socket, rare_echo_process.pid());
    auto pod_resources = v1::PodResourcesLister::NewStub(
        grpc::CreateChannel("unix:" + kubelet_.pod_resources_socket_path().string(),
                            grpc::InsecureChannelCredentials()));

    v1beta1::AllocateRequest allocate;
    auto* container = allocate.add_container_requests();
    for (const auto& id : aligned) container->add_devices_ids(id);
    v1beta1::PreferredAllocationRequest prefer;
    auto* wanted = prefer.add_container_requests();
    for (const auto& id : ids_) wanted->add_available_deviceids(id);
    wanted->set_allocation_size(4);

    auto call_allocate = [&](Server& s, bool record) {
      grpc::ClientContext context;
      v1beta1::AllocateResponse response;
      const auto start = Clock::now();
      const grpc::Status status = s.stub->Allocate(&context, allocate, &response);
      const double took = Seconds(Clock::now() - start);
      if (!status.ok()) Fail(s.name + ": Allocate: " + status.error_message());
      ++s.served;
      if (record) s.allocate.push_back(took);
    };
    auto call_prefer = [&](Server& s, bool record) {
      grpc::ClientContext context;
      v1beta1::PreferredAllocationResponse response;
      const auto start = Clock::now();
      const grpc::Status status = s.stub->GetPreferredAllocation(&context, prefer, &response);
      const double took = Seconds(Clock::now() - start);
      if (!status.ok()) Fail(s.name + ": GetPreferredAllocation: " + status.error_message());
      ++s.served;
      if (record) s.prefer.push_back(took);
      if (response.container_responses_size() == 1) {
        const auto& ids = response.container_responses(0).deviceids();
        s.preferred.assign(ids.begin(), ids.end());
        std::sort(s.preferred.begin(), s.preferred.end());
      }
    };
    std::vector<double> list;  // the pod-resources List alone
    auto call_list = [&](bool record) {
      grpc::ClientContext context;
      v1::ListPodResourcesResponse response;
      const auto start = Clock::now();
      if (!pod_resources->List(&context, v1::ListPodResourcesRequest(), &response).ok()) {
        Fail("pod-resources List failed");
      }
      if (record) list.push_back(Seconds(Clock::now() - start));
    };
    auto check_aligned = [&] {
      if (daemon.preferred != aligned) {
        // The kubelet rewrites its checkpoint at every device list it gets:
        // one that came during the admission shows the container as admitted.
        const bool checkpointed =
            ReadFile(kubelet_.checkpoint_path()).value_or("").find("uid-train-0") !=
            std::string::npos;
        Fail(absl::StrFormat(
            "GetPreferredAllocation gave %s, not the EFAs beside the GPU (%s); the checkpoint %s "
            "the container being admitted",
            absl::StrJoin(daemon.preferred, ","), absl::StrJoin(aligned, ","),
            checkpointed ? "holds" : "does not hold"));
      }
    };
    call_prefer(daemon, false);
    check_aligned();
    call_prefer(lone, false);
    if (lone.preferred.size() != 4) Fail("the daemon without pod-resources gave no 4 EFAs");

    // Not recorded: the first calls set up connections and caches.
    const long warmup = std::max(50L, settings_.rpcs / 100);
    long long rss10_daemon = -1, rss10_echo = -1;
    for (long i = 0; daemon.served < settings_.rpcs; ++i) {
      const bool record = daemon.served >= warmup;
      Server& first = i % 2 ? daemon : echo;
      Server& second = i % 2 ? echo : daemon;
      call_allocate(first, record);
      call_allocate(second, record);
      call_prefer(first, record);
      call_prefer(second, record);
      if (i % 4 == 0) {
        // The others a quarter as often, each beside its own baseline.
        Server& rare_first = i % 8 ? lone : rare_echo;
        Server& rare_second = i % 8 ? rare_echo : lone;
        call_prefer(rare_first, record);
        call_prefer(rare_second, record);
        call_list(record);
      }
      if (rss10_daemon < 0 && daemon.served >= settings_.rpcs / 10) {
        rss10_daemon = efa::testing::ResidentKiB(daemon.pid);
        rss10_echo = efa::testing::ResidentKiB(echo.pid);
      }
    }
    check_aligned();
    const long long rss_daemon = efa::testing::ResidentKiB(daemon.pid);
    const long long rss_echo = efa::testing::ResidentKiB(echo.pid);
    details_.push_back(MemoryDetail("after the calls from one client", daemon.pid, echo.pid));

    auto count = [](const std::vector<double>& v) { return Count(static_cast<long>(v.size())); };
    auto p = [](const std::vector<double>& v, double q) { return Percentile(v, q); };
    auto latency_row = [&](const std::string& figure, const std::vector<double>& samples, double q,
                           double baseline, const std::string& baseline_text, double goal,
                           const std::string& goal_text) {
      const double value = p(samples, q);
      rows_.push_back({1, absl::StrFormat("%s (%s calls)", figure, count(samples)), Us(value),
                       baseline_text, value / baseline, goal_text, value <= goal * baseline});
    };
    latency_row("Allocate, 4 EFAs: p50", daemon.allocate, 0.5, p(echo.allocate, 0.5),
                "echo " + Us(p(echo.allocate, 0.5)), 1.15, "≤ 1.15× echo");
    latency_row("Allocate, 4 EFAs: p99", daemon.allocate, 0.99, p(echo.allocate, 0.99),
                "echo " + Us(p(echo.allocate, 0.99)), 2, "≤ 2× echo");
    // With the GPU to look up, the floor is a round trip plus the List the
    // daemon must make: echo + List.
    for (double q : {0.5, 0.99}) {
      const double floor = p(echo.prefer, q) + p(list, q);
      const double goal = q == 0.5 ? 1.15 : 1.5;
      latency_row(absl::StrFormat("GetPreferredAllocation, 4 of 32, GPU known: p%d",
                                  static_cast<int>(q * 100)),
                  daemon.prefer, q, floor,
                  absl::StrFormat("echo + List: %s + %s", Us(p(echo.prefer, q)), Us(p(list, q))),
                  goal, absl::StrFormat("≤ %g× (echo + List)", goal));
    }
    latency_row("GetPreferredAllocation, 4 of 32, no lookup (no pod-resources): p50", lone.prefer,
                0.5, p(rare_echo.prefer, 0.5),
                "a second echo, as often: " + Us(p(rare_echo.prefer, 0.5)), 1.25, "≤ 1.25× echo");
    rows_.push_back(
        {1, absl::StrFormat("pod-resources List round trip alone: p50 (%s calls)", count(list)),
         Us(p(list, 0.5)), "echo GetPreferredAllocation " + Us(p(echo.prefer, 0.5)),
         p(list, 0.5) / p(echo.prefer, 0.5), "–", std::nullopt});
    rows_.push_back({4, absl::StrFormat("RSS after %s RPCs from one client", Count(settings_.rpcs)),
                     Mib(rss_daemon), "echo " + Mib(rss_echo),
                     static_cast<double>(rss_daemon) / static_cast<double>(rss_echo),
                     "≤ 1.25× echo", rss_daemon * 4 <= rss_echo * 5});
    rows_.push_back(GrowthRow(absl::StrFormat("RSS from %s to %s RPCs from one client",
                                              Count(settings_.rpcs / 10), Count(settings_.rpcs)),
                              rss10_daemon, rss_daemon, rss10_echo, rss_echo));
    if (lone_daemon.Stop(kDeadline) != 0) Fail("the daemon without pod-resources did not stop");
    if (rare_echo_process.Stop(kDeadline) != 0) Fail("the second echo server did not stop");

    MeasureConcurrentRss(daemon, echo, allocate, prefer);
  }

  // Where the resident memory is: anonymous (heaps, stacks) or pages of
  // the program's files (its libraries), and how many threads hold it.
  static std::string MemoryDetail(const std::string& when, pid_t daemon, pid_t echo) {
    auto one = [](pid_t pid) {
      const std::string status = "/proc/" + std::to_string(pid) + "/status";
      return absl::StrFormat("anonymous %s, file pages %s, %d threads",
                             Mib(efa::testing::StatusField(status, "RssAnon")),
                             Mib(efa::testing::StatusField(status, "RssFile")),
                             efa::testing::ThreadCount(pid));
    };
    return absl::StrFormat("- RSS %s: daemon %s; echo %s", when, one(daemon), one(echo));
  }

  static Row GrowthRow(const std::string& figure, long long daemon_from, long long daemon_to,
                       long long echo_from, long long echo_to) {
    auto growth = [](long long from, long long to) {
      return absl::StrFormat("%s → %s (%+.1f MiB)", Mib(from), Mib(to),
                             static_cast<double>(to - from) / 1024);
    };
    return {4,
            figure,
            growth(daemon_from, daemon_to),
            "echo " + growth(echo_from, echo_to),
            (static_cast<double>(daemon_to) / static_cast<double>(daemon_from)) /
                (static_cast<double>(echo_to) / static_cast<double>(echo_from)),
            "flat: ≤ +1 MiB",
            daemon_to - daemon_from <= 1024};
  }

  // 4. The same calls from kClients threads at once, to the daemon and to
  // the echo server alike: resident memory after a tenth of them and after
  // all (gRPC serves them on more threads, each of which may get a malloc
  // arena of its own).
  void MeasureConcurrentRss(Server& daemon, Server& echo, const v1beta1::AllocateRequest& allocate,
                            const v1beta1::PreferredAllocationRequest& prefer) {
    constexpr int kClients = 8;
    const long per_client = settings_.rpcs / kClients;
    auto run = [&](long calls) {
      std::vector<std::thread> clients;
      std::atomic<bool> failed{false};
      for (int c = 0; c < kClients; ++c) {
        clients.emplace_back([&, c] {
          for (long i = 0; i < calls / 2 && !failed; ++i) {
            for (Server* s : c % 2 ? std::array{&daemon, &echo} : std::array{&echo, &daemon}) {
              grpc::ClientContext a, b;
              v1beta1::AllocateResponse allocated;
              v1beta1::PreferredAllocationResponse preferred;
              if (!s->stub->Allocate(&a, allocate, &allocated).ok() ||
                  !s->stub->GetPreferredAllocation(&b, prefer, &preferred).ok()) {
                failed = true;
              }
            }
          }
        });
      }
      for (std::thread& t : clients) t.join();
      if (failed) Fail("a call failed under concurrent load");
    };
    run(per_client / 10);
    const long long daemon10 = efa::testing::ResidentKiB(daemon.pid);
    const long long echo10 = efa::testing::ResidentKiB(echo.pid);
    run(per_client - per_client / 10);
    const long long daemon_all = efa::testing::ResidentKiB(daemon.pid);
    const long long echo_all = efa::testing::ResidentKiB(echo.pid);
    details_.push_back(MemoryDetail(absl::StrFormat("after the calls from %d clients", kClients),
                                    daemon.pid, echo.pid));
    rows_.push_back({4,
                     absl::StrFormat("RSS after %s more RPCs from %d clients at once",
                                     Count(per_client * kClients), kClients),
                     Mib(daemon_all), "echo " + Mib(echo_all),
                     static_cast<double>(daemon_all) / static_cast<double>(echo_all),
                     "≤ 1.25× echo", daemon_all * 4 <= echo_all * 5});
    rows_.push_back(
        GrowthRow(absl::StrFormat("RSS from %s to %s concurrent RPCs",
                                  Count(per_client * kClients / 10), Count(per_client * kClients)),
                  daemon10, daemon_all, echo10, echo_all));
  }

  // Waits until `log` holds `line`.
  static void WaitForLogLine(const fs::path& log, const std::string& line) {
    if (!efa::testing::WaitForLogLine(log, line, kDeadline)) {
      Fail(log.string() + ": no \"" + line + "\" line");
    }
  }

  // 5 and 7. CPU time and wake-ups over an idle window: the p5 daemon
  // (registered, its ListAndWatch stream open) against the echo server
  // that took the same RPCs; a daemon on a node without EFA (no gRPC at
  // all) against absolute goals, a freshly started echo server beside it.
  void MeasureIdle() {
    SimRoot no_efa("no-efa");
    FakeKubelet kubelet(FakeKubelet::ForKubeletDir(no_efa.path() / "kubelet"));
    if (auto s = kubelet.Start(); !s.ok()) Fail(std::string(s.message()));
    const fs::path idle_log = logs() / "daemon-no-efa.log";
    ChildProcess idle_daemon(DaemonArgs(no_efa), idle_log);
    const fs::path echo_socket = no_efa.path() / "echo/echo.sock";
    fs::create_directories(echo_socket.parent_path());
    ChildProcess fresh_echo({settings_.echo, echo_socket.string()}, logs() / "echo-fresh.log");
    // Both at rest before the window: the daemon through its first loop
    // pass (no probe: a probe would start an HTTP worker), the echo server
    // once it answers.
    WaitForLogLine(idle_log, "no EFA on this node; idle until one appears");
    Connect(echo_socket);

    std::vector<IdleProcess> procs = {{"p5 daemon", daemon_->pid()},
                                      {"echo (loaded)", echo_->pid()},
                                      {"no-efa daemon", idle_daemon.pid()},
                                      {"echo (fresh)", fresh_echo.pid()}};
    for (auto& p : procs) {
      p.cpu = efa::testing::ThreadsCpuSeconds(p.pid);
      p.owner_cpu = efa::testing::ThreadCpuSeconds(p.pid, p.pid);
      p.switches = efa::testing::ContextSwitches(p.pid);
    }
    // The window itself: nothing to wait for, by design.
    std::this_thread::sleep_for(std::chrono::duration<double>(settings_.idle_seconds));
    const double per_minute = 60 / settings_.idle_seconds;
    details_.push_back(
        absl::StrFormat("Idle wake-ups per minute by thread (measures 5 and 7, %.0f s):\n",
                        settings_.idle_seconds));
    for (auto& p : procs) {
      p.cpu_per_minute = (efa::testing::ThreadsCpuSeconds(p.pid) - p.cpu) * per_minute;
      auto by_thread =
          efa::testing::SwitchesBetween(p.switches, efa::testing::ContextSwitches(p.pid));
      std::vector<std::pair<long long, std::string>> busiest;
      long long total = 0;
      for (const auto& [name, count] : by_thread) {
        total += count;
        busiest.emplace_back(count, name);  // a thread that never woke shows 0
      }
      std::sort(busiest.rbegin(), busiest.rend());
      std::vector<std::string> parts;
      for (const auto& [count, name] : busiest) {
        parts.push_back(absl::StrFormat("%s %.0f", name, static_cast<double>(count) * per_minute));
      }
      p.owner_cpu = (efa::testing::ThreadCpuSeconds(p.pid, p.pid) - p.owner_cpu) * per_minute;
      details_.push_back(absl::StrFormat("- %s: %s; CPU %.1f ms/min, of which its main thread %.1f",
                                         p.name, absl::StrJoin(parts, ", "), p.cpu_per_minute * 1e3,
                                         p.owner_cpu * 1e3));
      p.wakeups_per_minute = static_cast<double>(total) * per_minute;
      // The owner loop runs on the main thread (its ID is the process's):
      // the times it slept and was woken, not the preemptions of a busy
      // machine.
      const auto now = efa::testing::ContextSwitches(p.pid);
      if (now.count(p.pid) && p.switches.count(p.pid)) {
        p.own_wakeups_per_minute =
            static_cast<double>(now.at(p.pid).voluntary - p.switches.at(p.pid).voluntary) *
            per_minute;
      }
      p.rss_kib = efa::testing::ResidentKiB(p.pid);
      p.threads = efa::testing::ThreadCount(p.pid);
    }
    if (kubelet.registrations(kEfa) != 0) Fail("the daemon registered on a node without EFA");

    const std::string window = absl::StrFormat("%.0f s", settings_.idle_seconds);
    auto ratio = [](double a, double b) { return b > 0 ? a / b : NAN; };
    auto cpu = [](const IdleProcess& p) {
      return absl::StrFormat("%.1f ms/min (%.3f %%)", p.cpu_per_minute * 1e3,
                             p.cpu_per_minute / 60 * 100);
    };
    const IdleProcess& p5 = procs[0];
    const IdleProcess& loaded = procs[1];
    rows_.push_back({5, absl::StrFormat("p5 daemon, registered: idle CPU over %s", window), cpu(p5),
                     "echo (loaded) " + cpu(loaded),
                     ratio(p5.cpu_per_minute, loaded.cpu_per_minute), "≤ 1.1× echo",
                     p5.cpu_per_minute <= 1.1 * loaded.cpu_per_minute});
    rows_.push_back(
        {5, absl::StrFormat("p5 daemon, registered: wake-ups of its owner thread over %s", window),
         absl::StrFormat("%.0f /min", p5.own_wakeups_per_minute), "", NAN, "≤ 6 /min",
         p5.own_wakeups_per_minute <= 6});
    rows_.push_back(
        {5, absl::StrFormat("p5 daemon, registered: wake-ups of all threads over %s", window),
         absl::StrFormat("%.0f /min", p5.wakeups_per_minute),
         absl::StrFormat("echo (loaded) %.0f /min", loaded.wakeups_per_minute),
         ratio(p5.wakeups_per_minute, loaded.wakeups_per_minute), "–", std::nullopt});
    p5_idle_cpu_per_minute_ = p5.cpu_per_minute;

    const IdleProcess& none = procs[2];
    const IdleProcess& fresh = procs[3];
    details_.push_back(
        MemoryDetail("idle, the node without EFA (echo: fresh)", none.pid, fresh.pid));
    rows_.push_back({7, "no-EFA node: RSS of the idle daemon", Mib(none.rss_kib),
                     "echo (fresh) " + Mib(fresh.rss_kib),
                     static_cast<double>(none.rss_kib) / static_cast<double>(fresh.rss_kib),
                     "≤ 8 MiB", none.rss_kib <= 8 * 1024});
    rows_.push_back({7, "no-EFA node: threads of the idle daemon",
                     absl::StrFormat("%d", none.threads),
                     absl::StrFormat("echo (fresh) %d", fresh.threads),
                     ratio(static_cast<double>(none.threads), static_cast<double>(fresh.threads)),
                     "≤ 4", none.threads <= 4});
    rows_.push_back({7, absl::StrFormat("no-EFA node, daemon: wake-ups over %s", window),
                     absl::StrFormat("%.0f /min", none.wakeups_per_minute),
                     absl::StrFormat("echo (fresh) %.0f /min", fresh.wakeups_per_minute),
                     ratio(none.wakeups_per_minute, fresh.wakeups_per_minute), "≤ 10 /min",
                     none.wakeups_per_minute <= 10});
    rows_.push_back({7, absl::StrFormat("no-EFA node, daemon: CPU over %s", window), cpu(none),
                     "echo (fresh) " + cpu(fresh), ratio(none.cpu_per_minute, fresh.cpu_per_minute),
                     "≤ 5 ms/min", none.cpu_per_minute <= 0.005});
    if (idle_daemon.Stop(kDeadline) != 0) Fail("the no-EFA daemon did not stop on SIGTERM");
    if (fresh_echo.Stop(kDeadline) != 0) Fail("the fresh echo server did not stop on SIGTERM");
  }

  // The port the p5 daemon serves /metrics on: its latest "serving
  // /metrics, ... (port N)" log line.
  int MetricsPort() const {
    return LoggedPort(logs() / "daemon-p5.log", "/metrics, /healthz and /readyz");
  }

  // 8. /metrics scraped 10 times a second over the idle window's length:
  // the daemon's CPU time over the window less its idle CPU time (measure 5)
  // for as long, as a share of one core.
  void MeasureScrapes() {
    httplib::Client client("127.0.0.1", MetricsPort());
    client.set_connection_timeout(1s);
    client.set_read_timeout(1s);
    std::vector<double> took;
    size_t bytes = 0;
    const double cpu = efa::testing::ThreadsCpuSeconds(daemon_->pid());
    const auto start = Clock::now();
    const auto window = std::chrono::duration<double>(settings_.idle_seconds);
    for (auto next = start; next < start + window; next += 100ms) {
      // The scraper's schedule: nothing to wait for.
      std::this_thread::sleep_until(next);
      const auto sent = Clock::now();
      auto reply = client.Get("/metrics");
      if (!reply || reply->status != 200) Fail("a scrape of /metrics failed");
      took.push_back(Seconds(Clock::now() - sent));
      bytes = reply->body.size();
    }
    const double elapsed = Seconds(Clock::now() - start);
    const double used = efa::testing::ThreadsCpuSeconds(daemon_->pid()) - cpu;
    const double idle = p5_idle_cpu_per_minute_ / 60 * elapsed;
    const double share = (used - idle) / elapsed;
    rows_.push_back(
        {8,
         absl::StrFormat("/metrics scraped 10×/s for %.0f s (%d scrapes of %d bytes): "
                         "CPU added",
                         elapsed, took.size(), bytes),
         absl::StrFormat("%.2f %% of a core (%.0f ms)", share * 100, (used - idle) * 1e3),
         absl::StrFormat("idle (5) for as long: %.0f ms", idle * 1e3), NAN, "≤ 2 % of a core",
         share <= 0.02});
    rows_.push_back({8, "one scrape, round trip: p50 / p99",
                     absl::StrFormat("%s / %s", Ms(Median(took)), Ms(Percentile(took, 0.99))), "",
                     NAN, "–", std::nullopt});
  }

  // Waits until the kubelet's latest list shows `id` with `health`.
  bool WaitHealth(const std::string& id, const std::string& health) {
    return kubelet_.WaitForDevices(
        kEfa,
        [&](const std::vector<v1beta1::Device>& devices) {
          return std::any_of(devices.begin(), devices.end(), [&](const v1beta1::Device& d) {
            return d.id() == id && d.health() == health;
          });
        },
        kDeadline);
  }

  // 6. A device's verbs entry deleted from sysfs until the kubelet reads it
  // Unhealthy; a kubelet restart until the daemon registered again.
  void MeasureEvents() {
    const std::string id = ids_.back();
    const fs::path classes = p5_.sys() / "class/infiniband";
    const fs::path entry = classes / id;
    const fs::path target = fs::read_symlink(entry);
    std::vector<double> unhealthy, noticed;
    for (int i = 0; i < settings_.events; ++i) {
      DirectoryWatch watch(classes, IN_DELETE);
      const auto start = Clock::now();
      fs::remove(entry);
      if (!watch.Wait(kDeadline)) Fail(classes.string() + ": inotify reported no deletion");
      noticed.push_back(Seconds(Clock::now() - start));
      if (!WaitHealth(id, "Unhealthy")) Fail(id + " was not reported Unhealthy within 10 s");
      unhealthy.push_back(Seconds(Clock::now() - start));
      fs::create_directory_symlink(target, entry);
      if (!WaitHealth(id, "Healthy")) Fail(id + " was not reported Healthy again within 10 s");
    }
    rows_.push_back({6,
                     absl::StrFormat("device removed → Unhealthy in ListAndWatch (worst of %d)",
                                     settings_.events),
                     WorstAndMedian(unhealthy), "inotify reports it: " + WorstAndMedian(noticed),
                     Max(unhealthy) / Max(noticed), "≤ 1 s", Max(unhealthy) <= 1.0});

    std::vector<double> registered, serving;
    for (int i = 0; i < settings_.events; ++i) {
      const int before = kubelet_.registrations(kEfa);
      const auto start = Clock::now();
      if (auto s = kubelet_.Restart(); !s.ok()) Fail(std::string(s.message()));
      serving.push_back(Seconds(Clock::now() - start));
      if (!kubelet_.WaitForRegistrations(kEfa, before + 1, kDeadline)) {
        Fail("the daemon did not register again within 10 s of a kubelet restart");
      }
      registered.push_back(Seconds(Clock::now() - start));
      if (!kubelet_.WaitForStreaming(kEfa, true, kDeadline)) Fail("no ListAndWatch after restart");
    }
    rows_.push_back(
        {6, absl::StrFormat("kubelet restarted → registered again (worst of %d)", settings_.events),
         WorstAndMedian(registered), "the kubelet serves again: " + WorstAndMedian(serving),
         Max(registered) / Max(serving), "≤ 1 s", Max(registered) <= 1.0});
  }

  // The port a daemon logged serving `what` on ("serving <what> on ...
  // (port N, ...)"), its latest such line.
  static int LoggedPort(const fs::path& log, const std::string& what) {
    const int port = efa::testing::LoggedPort(log, what);
    if (port == 0) Fail(log.string() + ": no port logged for " + what);
    return port;
  }

  // 9. A p5 daemon started with a container's descriptor limit (1024):
  // /healthz and /readyz on its probe port asked every 100 ms, and the
  // kubelet restarted `events` times, for flood_seconds; then the same
  // while 1,100 connections (more than its descriptors) hold its metrics
  // port, each trickling a byte every 0.9 s. The probes' p99 latency and
  // the time to register again, with the flood and without.
  void MeasureFlood() {
    constexpr size_t kConnections = 1100;
    if (efa::testing::RaiseFileLimit(kConnections + 1024) < kConnections + 256) {
      Fail("this process cannot open the flood's 1,100 connections (RLIMIT_NOFILE)");
    }
    SimRoot node(p5_spec_);
    FakeKubelet kubelet(FakeKubelet::ForKubeletDir(node.path() / "kubelet"));
    if (auto s = kubelet.Start(); !s.ok()) Fail(std::string(s.message()));
    const fs::path log = logs() / "daemon-flood.log";
    ChildProcess daemon(DaemonArgs(node), log, 1024);
    if (!kubelet.WaitForRegistrations(kEfa, 1, kDeadline))
      Fail("the flood's daemon did not register");
    const auto metrics_port =
        static_cast<uint16_t>(LoggedPort(log, "/metrics, /healthz and /readyz"));
    const auto probe_port = static_cast<uint16_t>(LoggedPort(log, "/healthz and /readyz"));
    // Live before the first phase (the kubelet's initial delay): the owner
    // loop's first pass ends after the registration.
    for (const auto until = Clock::now() + kDeadline;
         efa::testing::ProbeOnce(probe_port, "/healthz", 1s).status != 200;) {
      if (Clock::now() > until) Fail("the flood's daemon was not live within 10 s");
      std::this_thread::sleep_for(10ms);
    }
    struct Phase {
      std::vector<double> probes, registered;
      size_t failures = 0;
    };
    auto phase = [&](bool flooded) {
      std::unique_ptr<efa::testing::ConnectionFlood> flood;
      if (flooded) {
        flood = std::make_unique<efa::testing::ConnectionFlood>(metrics_port, kConnections);
        for (const auto until = Clock::now() + kDeadline;
             flood->connected() < kConnections && Clock::now() < until;) {
          std::this_thread::sleep_for(20ms);
        }
        if (flood->connected() < kConnections) Fail("the flood could not connect");
      }
      Phase out;
      efa::testing::Prober prober(probe_port, {"/healthz", "/readyz"}, {"/healthz"});
      const auto start = Clock::now();
      const auto window = std::chrono::duration<double>(settings_.flood_seconds);
      for (int i = 0; i < settings_.events; ++i) {
        // Restarts spread over the window: its schedule, nothing to wait for.
        std::this_thread::sleep_until(start + window * i / settings_.events);
        const int before = kubelet.registrations(kEfa);
        const auto restart = Clock::now();
        if (auto s = kubelet.Restart(); !s.ok()) Fail(std::string(s.message()));
        if (!kubelet.WaitForRegistrations(kEfa, before + 1, kDeadline)) {
          Fail(
              absl::StrFormat("the daemon did not register again within 10 s of a kubelet "
                              "restart%s",
                              flooded ? " during the flood" : ""));
        }
        out.registered.push_back(Seconds(Clock::now() - restart));
      }
      std::this_thread::sleep_until(start + window);
      prober.Stop();
      out.probes = prober.seconds();
      out.failures = prober.failures().size();
      return out;
    };
    const Phase calm = phase(false);
    const Phase flooded = phase(true);
    if (daemon.Stop(kDeadline) != 0) Fail("the flood's daemon did not stop cleanly on SIGTERM");
    const double p99 = Percentile(flooded.probes, 0.99);
    const double calm_p99 = Percentile(calm.probes, 0.99);
    rows_.push_back(
        {9,
         absl::StrFormat("probe latency p99 (%s probes over %.0f s) while %s connections flood the "
                         "metrics port; failed probes",
                         Count(static_cast<long>(flooded.probes.size())), settings_.flood_seconds,
                         Count(static_cast<long>(kConnections))),
         absl::StrFormat("%s; %d failed", Ms(p99), flooded.failures),
         absl::StrFormat("no flood: %s; %d failed", Ms(calm_p99), calm.failures), p99 / calm_p99,
         "none failed, p99 ≤ 1 s", flooded.failures == 0 && p99 <= 1.0});
    rows_.push_back(
        {9,
         absl::StrFormat("kubelet restarted → registered again during the flood (worst of %d)",
                         settings_.events),
         WorstAndMedian(flooded.registered), "no flood: " + WorstAndMedian(calm.registered),
         Max(flooded.registered) / Max(calm.registered), "≤ 1 s", Max(flooded.registered) <= 1.0});
  }

  const Settings settings_;
  const efa::sim::MachineSpec p5_spec_;
  SimRoot p5_;
  FakeKubelet kubelet_;
  FakeAcceleratorPlugin gpus_;
  std::unique_ptr<ChildProcess> daemon_;  // on p5_, from MeasureStart on
  std::unique_ptr<ChildProcess> echo_;    // from MeasureRpcs on
  std::vector<std::string> ids_;          // the p5 EFAs, as listed
  std::vector<Row> rows_;
  std::vector<std::pair<std::string, std::vector<double>>> policy_curve_;
  std::vector<std::string> details_;   // printed under the table
  double p5_idle_cpu_per_minute_ = 0;  // measure 5, for measure 8
};

std::string FirstLine(const fs::path& path, const std::string& prefix) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, prefix.size(), prefix) == 0) return line;
  }
  return "";
}

// Where and how the figures were taken: they mean little without it.
std::string Header(const Settings& s, const std::string& load_before) {
  utsname u{};
  ::uname(&u);
  std::string cpu = FirstLine("/proc/cpuinfo", "model name");
  cpu = cpu.find(": ") == std::string::npos ? "unknown CPU" : cpu.substr(cpu.find(": ") + 2);
  const std::time_t now = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::string load_after = ReadFile("/proc/loadavg").value_or("");
  std::string out = absl::StrFormat("# efa_bench results\n\n- command: `%s`\n", s.command);
  out += absl::StrFormat("- when: %s; host: %s, %d CPUs, Linux %s\n", when, cpu,
                         std::thread::hardware_concurrency(), u.release);
  out += absl::StrFormat("- load average before: %s; after: %s\n",
                         load_before.substr(0, load_before.find('\n')),
                         load_after.substr(0, load_after.find('\n')));
#ifdef NDEBUG
  out += "- build: optimized (NDEBUG)\n";
#else
  out += "- build: NOT optimized (no NDEBUG): the figures are not representative\n";
#endif
  out += absl::StrFormat("- simulated nodes in: %s\n", s.node_dir);
  out += absl::StrFormat(
      "- mode: %s; %s RPCs per server, %d starts, %d events, idle %.0f s, flood %.0f s\n\n",
      s.quick ? "quick (proves the suite runs; not a measurement)" : "full", Count(s.rpcs),
      s.starts, s.events, s.idle_seconds, s.flood_seconds);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  CLI::App app{"The EFA device plugin's benchmark suite (BENCHMARKS.md)"};
  app.add_flag("--quick", s.quick, "Small counts and a 2 s idle window: proves the suite runs");
  auto* rpcs = app.add_option("--rpcs", s.rpcs, "RPCs to each server (measures 1 and 4)")
                   ->capture_default_str()
                   ->check(CLI::Range(1000, 100000000));
  auto* starts = app.add_option("--starts", s.starts, "Daemon starts (measure 3)")
                     ->capture_default_str()
                     ->check(CLI::Range(1, 1000));
  auto* events = app.add_option("--events", s.events, "Removals and restarts (measure 6)")
                     ->capture_default_str()
                     ->check(CLI::Range(1, 1000));
  auto* flood = app.add_option("--flood-seconds", s.flood_seconds,
                               "Each phase of measure 9: without and with the flood")
                    ->capture_default_str()
                    ->check(CLI::Range(1.0, 3600.0));
  auto* idle = app.add_option("--idle-seconds", s.idle_seconds, "Idle window (measures 5 and 7)")
                   ->capture_default_str()
                   ->envname("EFA_BENCH_IDLE_SECONDS")
                   ->check(CLI::Range(1.0, 3600.0));
  app.add_option("--out", s.out, "Also write the results (Markdown) to this file")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--logs", s.logs, "Keep the logs of the daemons and echo servers here");
  app.add_option("--plugin", s.plugin, "The daemon binary")->capture_default_str();
  app.add_option("--echo", s.echo, "The echo server binary")->capture_default_str();
  app.add_option("--node-dir", s.node_dir,
                 "Where to write the simulated nodes (in memory, like sysfs, by default)")
      ->capture_default_str()
      ->check(CLI::ExistingDirectory);
  CLI11_PARSE(app, argc, argv);
  // The simulated nodes (SimRoot) are made under TMPDIR.
  ::setenv("TMPDIR", s.node_dir.c_str(), 1);
  if (s.quick) {
    if (rpcs->count() == 0) s.rpcs = 2000;
    if (starts->count() == 0) s.starts = 3;
    if (events->count() == 0) s.events = 2;
    if (flood->count() == 0) s.flood_seconds = 3;
    if (idle->count() == 0 && std::getenv("EFA_BENCH_IDLE_SECONDS") == nullptr) s.idle_seconds = 2;
  }
  std::vector<std::string> args(argv, argv + argc);
  s.command = absl::StrJoin(args, " ");
  const std::string load_before = ReadFile("/proc/loadavg").value_or("");

  std::string results;
  try {
    Suite suite(s);
    try {
      suite.Run();
    } catch (const std::exception&) {
      suite.PrintLogTails();
      throw;
    }
    results = Header(s, load_before) + suite.Markdown();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "efa_bench: %s\n", e.what());
    return 1;
  }
  std::fputs(results.c_str(), stdout);
  if (!s.out.empty()) {
    std::ofstream out(s.out);
    out << results;
    if (!out) {
      std::fprintf(stderr, "efa_bench: cannot write %s\n", s.out.c_str());
      return 1;
    }
    std::fprintf(stderr, "efa_bench: results written to %s\n", s.out.c_str());
  }
  return 0;
}
