// Measures 5, 7 and 8: the daemon at rest (CPU time, wake-ups, memory) on
// the p5 node and on a node without EFA, against echo servers; then the
// CPU time /metrics scrapes add to it.
#include <httplib.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "test/bench/bench.h"
#include "test/support/proc_stats.h"

namespace efa::bench {

namespace {

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

// The port the p5 daemon serves /metrics on: its latest "serving
// /metrics, ... (port N)" log line.
int MetricsPort(const Bench& bench) {
  return LoggedPort(bench.logs() / "daemon-p5.log", "/metrics, /healthz and /readyz");
}

}  // namespace

// 5 and 7. CPU time and wake-ups over an idle window: the p5 daemon
// (registered, its ListAndWatch stream open) against the echo server
// that took the same RPCs; a daemon on a node without EFA (no gRPC at
// all) against absolute goals, a freshly started echo server beside it.
void MeasureIdle(Bench& bench) {
  SimRoot no_efa("no-efa");
  FakeKubelet kubelet(FakeKubelet::ForKubeletDir(no_efa.path() / "kubelet"));
  if (auto s = kubelet.Start(); !s.ok()) Fail(std::string(s.message()));
  const fs::path idle_log = bench.logs() / "daemon-no-efa.log";
  ChildProcess idle_daemon(bench.DaemonArgs(no_efa), idle_log);
  const fs::path echo_socket = no_efa.path() / "echo/echo.sock";
  fs::create_directories(echo_socket.parent_path());
  ChildProcess fresh_echo({bench.settings.echo, echo_socket.string()},
                          bench.logs() / "echo-fresh.log");
  // Both at rest before the window: the daemon through its first loop
  // pass (no probe: a probe would start an HTTP worker), the echo server
  // once it answers.
  WaitForLogLine(idle_log, "no EFA on this node; idle until one appears");
  Connect(echo_socket);

  std::vector<IdleProcess> procs = {{"p5 daemon", bench.daemon->pid()},
                                    {"echo (loaded)", bench.echo->pid()},
                                    {"no-efa daemon", idle_daemon.pid()},
                                    {"echo (fresh)", fresh_echo.pid()}};
  for (auto& p : procs) {
    p.cpu = efa::testing::ThreadsCpuSeconds(p.pid);
    p.owner_cpu = efa::testing::ThreadCpuSeconds(p.pid, p.pid);
    p.switches = efa::testing::ContextSwitches(p.pid);
  }
  // The window itself: nothing to wait for, by design.
  std::this_thread::sleep_for(std::chrono::duration<double>(bench.settings.idle_seconds));
  const double per_minute = 60 / bench.settings.idle_seconds;
  bench.details.push_back(
      absl::StrFormat("Idle wake-ups per minute by thread (measures 5 and 7, %.0f s):\n",
                      bench.settings.idle_seconds));
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
    bench.details.push_back(
        absl::StrFormat("- %s: %s; CPU %.1f ms/min, of which its main thread %.1f", p.name,
                        absl::StrJoin(parts, ", "), p.cpu_per_minute * 1e3, p.owner_cpu * 1e3));
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

  const std::string window = absl::StrFormat("%.0f s", bench.settings.idle_seconds);
  auto ratio = [](double a, double b) { return b > 0 ? a / b : NAN; };
  auto cpu = [](const IdleProcess& p) {
    return absl::StrFormat("%.1f ms/min (%.3f %%)", p.cpu_per_minute * 1e3,
                           p.cpu_per_minute / 60 * 100);
  };
  const IdleProcess& p5 = procs[0];
  const IdleProcess& loaded = procs[1];
  bench.rows.push_back({5, absl::StrFormat("p5 daemon, registered: idle CPU over %s", window),
                        cpu(p5), "echo (loaded) " + cpu(loaded),
                        ratio(p5.cpu_per_minute, loaded.cpu_per_minute), "≤ 1.1× echo",
                        p5.cpu_per_minute <= 1.1 * loaded.cpu_per_minute});
  bench.rows.push_back(
      {5, absl::StrFormat("p5 daemon, registered: wake-ups of its owner thread over %s", window),
       absl::StrFormat("%.0f /min", p5.own_wakeups_per_minute), "", NAN, "≤ 6 /min",
       p5.own_wakeups_per_minute <= 6});
  bench.rows.push_back(
      {5, absl::StrFormat("p5 daemon, registered: wake-ups of all threads over %s", window),
       absl::StrFormat("%.0f /min", p5.wakeups_per_minute),
       absl::StrFormat("echo (loaded) %.0f /min", loaded.wakeups_per_minute),
       ratio(p5.wakeups_per_minute, loaded.wakeups_per_minute), "–", std::nullopt});
  bench.p5_idle_cpu_per_minute = p5.cpu_per_minute;

  const IdleProcess& none = procs[2];
  const IdleProcess& fresh = procs[3];
  bench.details.push_back(
      MemoryDetail("idle, the node without EFA (echo: fresh)", none.pid, fresh.pid));
  bench.rows.push_back({7, "no-EFA node: RSS of the idle daemon", Mib(none.rss_kib),
                        "echo (fresh) " + Mib(fresh.rss_kib),
                        static_cast<double>(none.rss_kib) / static_cast<double>(fresh.rss_kib),
                        "≤ 8 MiB", none.rss_kib <= 8LL * 1024});
  bench.rows.push_back(
      {7, "no-EFA node: threads of the idle daemon", absl::StrFormat("%d", none.threads),
       absl::StrFormat("echo (fresh) %d", fresh.threads),
       ratio(static_cast<double>(none.threads), static_cast<double>(fresh.threads)), "≤ 4",
       none.threads <= 4});
  bench.rows.push_back({7, absl::StrFormat("no-EFA node, daemon: wake-ups over %s", window),
                        absl::StrFormat("%.0f /min", none.wakeups_per_minute),
                        absl::StrFormat("echo (fresh) %.0f /min", fresh.wakeups_per_minute),
                        ratio(none.wakeups_per_minute, fresh.wakeups_per_minute), "≤ 10 /min",
                        none.wakeups_per_minute <= 10});
  bench.rows.push_back({7, absl::StrFormat("no-EFA node, daemon: CPU over %s", window), cpu(none),
                        "echo (fresh) " + cpu(fresh),
                        ratio(none.cpu_per_minute, fresh.cpu_per_minute), "≤ 5 ms/min",
                        none.cpu_per_minute <= 0.005});
  if (idle_daemon.Stop(kDeadline) != 0) Fail("the no-EFA daemon did not stop on SIGTERM");
  if (fresh_echo.Stop(kDeadline) != 0) Fail("the fresh echo server did not stop on SIGTERM");
}

// 8. /metrics scraped 10 times a second over the idle window's length:
// the daemon's CPU time over the window less its idle CPU time (measure 5)
// for as long, as a share of one core.
void MeasureScrapes(Bench& bench) {
  httplib::Client client("127.0.0.1", MetricsPort(bench));
  client.set_connection_timeout(1s);
  client.set_read_timeout(1s);
  std::vector<double> took;
  size_t bytes = 0;
  const double cpu = efa::testing::ThreadsCpuSeconds(bench.daemon->pid());
  const auto start = Clock::now();
  const auto window = std::chrono::duration<double>(bench.settings.idle_seconds);
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
  const double used = efa::testing::ThreadsCpuSeconds(bench.daemon->pid()) - cpu;
  const double idle = bench.p5_idle_cpu_per_minute / 60 * elapsed;
  const double share = (used - idle) / elapsed;
  bench.rows.push_back(
      {8,
       absl::StrFormat("/metrics scraped 10×/s for %.0f s (%d scrapes of %d bytes): "
                       "CPU added",
                       elapsed, took.size(), bytes),
       absl::StrFormat("%.2f %% of a core (%.0f ms)", share * 100, (used - idle) * 1e3),
       absl::StrFormat("idle (5) for as long: %.0f ms", idle * 1e3), NAN, "≤ 2 % of a core",
       share <= 0.02});
  bench.rows.push_back({8, "one scrape, round trip: p50 / p99",
                        absl::StrFormat("%s / %s", Ms(Median(took)), Ms(Percentile(took, 0.99))),
                        "", NAN, "–", std::nullopt});
}

}  // namespace efa::bench
