// What the benchmark suite's measures share (efa_bench, bench_main.cc): its
// settings, the table's rows, the figures' formats, and `Bench`, the p5
// node every measure but the policy's runs on: the fake kubelet and the
// fake GPU plugin there, the daemon from measure 3 on, the loaded echo
// server from measures 1 and 4 on. Each measure is a function of its own
// file (bench_<group>.cc) that adds its rows to the table.
//
// Not thread-safe: the suite's one thread runs the measures in turn.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "test/fake_kubelet/fake_accelerator_plugin.h"
#include "test/fake_kubelet/fake_kubelet.h"
#include "test/sim/machine_spec.h"
#include "test/sim/sim_root.h"
#include "test/support/build_paths.h"
#include "test/support/child_process.h"
#include "test/support/devices.h"

namespace efa::bench {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using efa::sim::SimRoot;
using efa::testing::ChildProcess;
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

// The node sizes of measure 2's curve (EFAs).
inline const std::vector<int> kPolicySizes = {32, 64, 128, 256, 512, 1024};

// Throws std::runtime_error: a measure that cannot run ends the suite.
[[noreturn]] void Fail(const std::string& message);

double Seconds(Clock::duration d);
// The value at fraction `p` of the sorted samples (nearest rank).
double Percentile(std::vector<double> v, double p);
double Median(std::vector<double> v);
double Max(const std::vector<double>& v);

std::string Us(double s);
std::string Ms(double s);
std::string Mib(long long kib);
std::string WorstAndMedian(const std::vector<double>& v);
std::string Count(long n);

std::optional<std::string> ReadFile(const std::filesystem::path& path);

// An inotify watch of one directory, to see when the kernel reports a
// change there: the earliest any process can learn of it.
class DirectoryWatch {
 public:
  DirectoryWatch(const std::filesystem::path& dir, uint32_t mask);
  ~DirectoryWatch();
  DirectoryWatch(const DirectoryWatch&) = delete;
  DirectoryWatch& operator=(const DirectoryWatch&) = delete;
  // Whether an event arrived within `timeout`.
  bool Wait(std::chrono::milliseconds timeout) const;

 private:
  const int fd_;
};

// A DevicePlugin client over a unix socket, once the server there answers.
std::unique_ptr<v1beta1::DevicePlugin::Stub> Connect(const std::filesystem::path& socket);

// Where the resident memory is: anonymous (heaps, stacks) or pages of
// the program's files (its libraries), and how many threads hold it.
std::string MemoryDetail(const std::string& when, pid_t daemon, pid_t echo);

// Waits until `log` holds `line`.
void WaitForLogLine(const std::filesystem::path& log, const std::string& line);

// The port a daemon logged serving `what` on ("serving <what> on ...
// (port N, ...)"), its latest such line.
int LoggedPort(const std::filesystem::path& log, const std::string& what);

// The p5 node the measures share, and the table they fill.
struct Bench {
  // Writes the node, starts its kubelet and GPU plugin (Fail when one
  // cannot start).
  explicit Bench(Settings s);

  // Where the daemons' and echo servers' logs go.
  std::filesystem::path logs() const;
  // The daemon on `sim`, with the kubelet dir `kubelet_dir` (default: the
  // simulated node's, where the fake kubelet serves).
  std::vector<std::string> DaemonArgs(const sim::SimRoot& sim,
                                      const std::filesystem::path& kubelet_dir = {}) const;

  const Settings settings;
  const sim::MachineSpec p5_spec;
  sim::SimRoot p5;
  testing::FakeKubelet kubelet;
  testing::FakeAcceleratorPlugin gpus;
  std::unique_ptr<testing::ChildProcess> daemon;  // on p5, from MeasureStart on
  std::unique_ptr<testing::ChildProcess> echo;    // from MeasureRpcs on
  std::vector<std::string> ids;                   // the p5 EFAs, as listed
  std::vector<Row> rows;
  std::vector<std::pair<std::string, std::vector<double>>> policy_curve;
  std::vector<std::string> details;   // printed under the table
  double p5_idle_cpu_per_minute = 0;  // measure 5, for measure 8
};

// The measures, numbered as in BENCHMARKS.md, in the order the suite runs
// them; each adds its rows (and details) to `b`.
void MeasurePolicy(Bench& bench);   // 2 (bench_policy.cc)
void MeasureStart(Bench& bench);    // 3 (bench_start.cc)
void MeasureRpcs(Bench& bench);     // 1 and 4 (bench_rpcs.cc)
void MeasureIdle(Bench& bench);     // 5 and 7 (bench_idle.cc)
void MeasureScrapes(Bench& bench);  // 8 (bench_idle.cc)
void MeasureEvents(Bench& bench);   // 6 (bench_events.cc)
void MeasureFlood(Bench& bench);    // 9 (bench_flood.cc)

}  // namespace efa::bench
