// efa_bench: the benchmark suite of BENCHMARKS.md. It runs the real daemon
// binary on simulated nodes against the fake kubelet, over real gRPC on real
// unix sockets, and reports each figure with its ratio to a baseline taken in
// the same run, as one table (also written to --out).
//   efa_bench [--quick] [--idle-seconds N] [--flood-seconds N] [--rpcs N] [--out FILE]
// scripts/bench.sh builds it in a Release tree and runs it. Exits 0 when
// every measurement ran, goals met or not; 1 when one could not run.
// Each measure is in a file of its own (bench.h lists them); this file runs
// them in turn and prints the table.
#include <sys/utsname.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "test/bench/bench.h"

namespace {

namespace fs = std::filesystem;
using efa::bench::Bench;
using efa::bench::Count;
using efa::bench::Fail;
using efa::bench::kPolicySizes;
using efa::bench::ReadFile;
using efa::bench::Row;
using efa::bench::Settings;
using efa::bench::Us;
using efa::testing::kDeadline;

void Progress(const std::string& what) {
  std::fprintf(stderr, "efa_bench: measuring %s\n", what.c_str());
}

// Runs every measure; throws std::runtime_error when one cannot run.
void Run(Bench& bench) {
  Progress("2: the allocation policy on synthetic nodes of 32 to 1024 EFAs");
  MeasurePolicy(bench);
  Progress("3: start to registered");
  MeasureStart(bench);
  Progress(absl::StrFormat("1, 4: %s RPCs to the daemon and to the echo server, interleaved",
                           Count(bench.settings.rpcs)));
  MeasureRpcs(bench);
  Progress(absl::StrFormat("5, 7: %.0f s idle", bench.settings.idle_seconds));
  MeasureIdle(bench);
  Progress(absl::StrFormat("8: /metrics scraped 10 times a second for %.0f s",
                           bench.settings.idle_seconds));
  MeasureScrapes(bench);
  Progress("6: device removed, kubelet restarted");
  MeasureEvents(bench);
  Progress(absl::StrFormat("9: probes and kubelet restarts for %.0f s, then as long during a flood",
                           bench.settings.flood_seconds));
  MeasureFlood(bench);
  if (bench.daemon->Stop(kDeadline) != 0) Fail("the daemon did not stop cleanly on SIGTERM");
  if (bench.echo->Stop(kDeadline) != 0) Fail("the echo server did not stop cleanly on SIGTERM");
}

// The table and the policy curve, as Markdown.
std::string Markdown(const Bench& bench) {
  std::vector<Row> rows = bench.rows;
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
  for (const std::string& d : bench.details) out += d + "\n";
  out += "\n";
  out += "Policy: CPU time per decision by node size (EFAs; one GPU per 8 EFAs)\n\n";
  out += absl::StrFormat("| scenario | %s |\n|---|", absl::StrJoin(kPolicySizes, " | "));
  for (size_t i = 0; i < kPolicySizes.size(); ++i) out += "---|";
  out += "\n";
  for (const auto& [name, times] : bench.policy_curve) {
    out += absl::StrFormat("| %s |", name);
    for (double t : times) out += absl::StrFormat(" %s |", Us(t));
    out += "\n";
  }
  return out;
}

// The last lines of every log, to tell why something failed.
void PrintLogTails(const Bench& bench) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(bench.logs(), ec)) {
    std::vector<std::string> lines = absl::StrSplit(ReadFile(entry.path()).value_or(""), '\n');
    std::fprintf(stderr, "--- the end of %s:\n", entry.path().c_str());
    for (size_t i = lines.size() > 20 ? lines.size() - 20 : 0; i < lines.size(); ++i) {
      std::fprintf(stderr, "%s\n", lines[i].c_str());
    }
  }
}

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
    Bench bench(s);
    try {
      Run(bench);
    } catch (const std::exception&) {
      PrintLogTails(bench);
      throw;
    }
    results = Header(s, load_before) + Markdown(bench);
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
