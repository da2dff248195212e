// efa-k8s-device-plugin: the kubelet device plugin for AWS EFA.
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "plugin/config.h"
#include "plugin/daemon.h"
#include "plugin/daemon_monitor.h"
#include "plugin/ops/topology_report.h"
#include "plugin/runtime/fd_budget.h"
#include "plugin/runtime/http_server.h"
#include "plugin/runtime/idle_args.h"
#include "plugin/runtime/logging.h"
#include "plugin/runtime/signals.h"
#include "spdlog/spdlog.h"
#include "topology/efa_discovery.h"

namespace {

namespace fs = std::filesystem;
using efa::plugin::Config;
using efa::plugin::EffectiveConfig;

// Prints the node's EFAs and what discovery passed over.
int RunInventory(const efa::topology::HostRoots& roots) {
  auto inv = efa::topology::DiscoverEfaDevices(roots);
  if (absl::Status verbs = efa::topology::MarkVerbsProviders(inv); !verbs.ok()) {
    std::fprintf(stderr, "%s (the LIBIBVERBS column is unknown)\n",
                 std::string(verbs.message()).c_str());
  }
  std::printf("%zu EFA device(s) under %s\n", inv.devices.size(), roots.sysfs.c_str());
  if (!inv.devices.empty()) {
    std::printf("%-12s %-9s %-13s %-5s %-4s %-11s %-10s %s\n", "IBDEV", "UVERBS", "PCI", "EFA",
                "NUMA", "ROOT", "LIBIBVERBS", "HEALTH");
  }
  for (const auto& d : inv.devices) {
    std::printf("%-12s %-9s %-13s %-5s %-4s %-11s %-10s %s\n", d.ibdev.c_str(), d.uverbs.c_str(),
                d.pci.ToString().c_str(), absl::StrFormat("%04x", d.device_id).c_str(),
                d.numa_node ? std::to_string(*d.numa_node).c_str() : "-", d.root_complex.c_str(),
                d.verbs_provider ? "listed" : "unlisted",
                d.healthy() ? "Healthy" : ("Unhealthy: " + d.health_problem).c_str());
  }
  for (const auto& s : inv.skipped) {
    std::printf("skipped %s: %s\n", s.ibdev.c_str(), s.reason.c_str());
  }
  return 0;
}

// Prints which EFA is next to which accelerator, and whether all are there.
int RunTopology(const Config& c, const std::string& format) {
  // The daemon's options: the replicas and the resource name it would serve.
  const efa::plugin::DaemonOptions daemon = efa::plugin::ToDaemonOptions(c);
  auto report =
      efa::plugin::BuildTopologyReport({.roots = {*c.sysfs_root, *c.dev_root, *c.proc_root},
                                        .topology_xml = *c.topology_xml,
                                        .instance_type = *c.instance_type,
                                        .expected_efa_count = *c.expected_efa_count,
                                        .replicas = daemon.replicas,
                                        .resource_name = daemon.resource_name});
  auto text = efa::plugin::FormatTopology(report, format);
  if (!text.ok()) {
    std::fprintf(stderr, "%s\n", std::string(text.status().message()).c_str());
    return 2;
  }
  std::fputs(text->c_str(), stdout);
  return 0;
}

// How long the idle binary may take to show that it starts: milliseconds
// on any node; more means it hangs, and the daemon idles itself.
constexpr int kIdleCheckTimeoutMs = 5000;

// Whether the idle binary at `idle` can run: started with --check, it exits
// 0 once the dynamic loader found its libraries and its static
// initialisers ran. An exec that succeeded cannot be taken back (a missing
// library fails after execve, in the new image, and the container would
// exit and crash-loop), so it is tried in a child first. The error says
// why not ("its check exited with status 127").
absl::Status CheckIdleBinary(const fs::path& idle) {
  std::string path = idle.string(), flag = "--check";
  char* args[] = {path.data(), flag.data(), nullptr};
  // The child starts with no signal blocked (the daemon blocks its own).
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, path.c_str(), nullptr, &attr, args, environ);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return absl::ErrnoToStatus(rc, "cannot start its check");
  // Waited for on this (the owner) thread, the only one that reaps.
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  const int pidfd_errno = errno;
  pollfd p{pidfd, POLLIN, 0};
  int ready = 0;
  while (pidfd >= 0 && (ready = ::poll(&p, 1, kIdleCheckTimeoutMs)) < 0 && errno == EINTR) {
  }
  if (pidfd >= 0) ::close(pidfd);
  if (ready != 1) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (pidfd < 0) return absl::ErrnoToStatus(pidfd_errno, "cannot wait for its check (pidfd_open)");
  if (ready != 1) {
    return absl::DeadlineExceededError(
        absl::StrCat("its check did not end within ", kIdleCheckTimeoutMs, " ms"));
  }
  if (WIFSIGNALED(status)) {
    return absl::UnavailableError(
        absl::StrCat("its check was killed by signal ", WTERMSIG(status)));
  }
  if (WEXITSTATUS(status) != 0) {
    return absl::UnavailableError(
        absl::StrCat("its check exited with status ", WEXITSTATUS(status)));
  }
  return absl::OkStatus();
}

// On a node without EFA the daemon hands over to efa-k8s-device-plugin-idle,
// installed beside it, which answers the probes and /metrics without
// mapping gRPC and execs the daemon again (same PID, same command line and
// environment) when an EFA appears. Returns when it cannot: without an idle
// binary that runs, the daemon idles in its own loop.
void ExecIdleProcess(const Config& c, int argc, char** argv) {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  const fs::path idle = self.parent_path() / "efa-k8s-device-plugin-idle";
  if (ec || ::access(idle.c_str(), X_OK) != 0) return;
  if (absl::Status runs = CheckIdleBinary(idle); !runs.ok()) {
    spdlog::warn("cannot run {}: {}; idle in this process instead", idle.string(),
                 std::string(runs.message()));
    return;
  }
  efa::plugin::IdleArgs idle_args{.sysfs_root = *c.sysfs_root,
                                  .dev_root = *c.dev_root,
                                  .rescan_interval = *c.rescan_interval,
                                  .metrics_address = *c.metrics_address,
                                  .probe_address = *c.probe_address,
                                  .limits = {.metrics_connections = *c.metrics_max_connections,
                                             .probe_connections = *c.probe_max_connections,
                                             .request_timeout = *c.http_request_timeout},
                                  .instance_type = *c.instance_type,
                                  .expected_efa_count = *c.expected_efa_count,
                                  .log_level = *c.log_level,
                                  .log_format = *c.log_format,
                                  .daemon = {self.string()}};
  idle_args.daemon.insert(idle_args.daemon.end(), argv + 1, argv + argc);
  std::vector<std::string> args = efa::plugin::IdleArgv(idle_args);
  args.insert(args.begin(), idle.string());
  std::vector<char*> exec_args;
  for (std::string& a : args) exec_args.push_back(a.data());
  exec_args.push_back(nullptr);
  spdlog::info("no EFA on this node: handing over to {} until one appears", idle.string());
  spdlog::default_logger()->flush();
  ::execv(exec_args[0], exec_args.data());
  spdlog::warn("cannot run {}: {}; idle in this process instead", idle.string(),
               std::strerror(errno));
}

int RunDaemon(const EffectiveConfig& effective, int argc, char** argv) {
  const Config& c = effective.config;
  spdlog::info("configuration: {}", effective.Summary());
  efa::plugin::InitDescriptorBudget();  // before any server holds a descriptor
  efa::plugin::DaemonOptions options = efa::plugin::ToDaemonOptions(c);
  options.handle_signals = true;
  options.on_idle = [&c, argc, argv] { ExecIdleProcess(c, argc, argv); };
  efa::plugin::DaemonMonitor monitor(
      {*c.rescan_interval, *c.instance_type, *c.sysfs_root, *c.expected_efa_count});
  monitor.Attach(options);
  efa::plugin::Daemon daemon(options);
  monitor.Watch(&daemon);
  // Every HTTP connection is a descriptor: the two caps are all the HTTP
  // side may hold, whatever its clients do, and they fit in what the
  // descriptor budget leaves it.
  const efa::plugin::EndpointLimits limits = efa::plugin::FitEndpointLimits(
      {*c.metrics_max_connections, *c.probe_max_connections, *c.http_request_timeout},
      efa::plugin::HttpDescriptorAllowance());
  auto servers = efa::plugin::ServeEndpoints(*c.metrics_address, monitor.Routes(), *c.probe_address,
                                             monitor.ProbeRoutes(), limits, &monitor.http());
  if (!servers.ok()) {
    spdlog::error("{}", std::string(servers.status().message()));
    return 1;
  }
  return daemon.Run();
}

}  // namespace

// An exception that reaches main is a bug or memory exhaustion: std::terminate
// then ends the daemon with a core dump and the DaemonSet restarts it.
// NOLINTNEXTLINE(bugprone-exception-escape)
int main(int argc, char** argv) {
  // Debian builds abseil without NDEBUG, which turns absl::Mutex's deadlock
  // detection on: every lock and unlock updates a global lock graph (a few
  // per cent of the daemon's CPU under load, found with perf). The tests
  // keep it on; the daemon's lock order is theirs.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // Signals are taken by the owner loop through a signalfd: block them
  // before any thread (gRPC's included) exists. SIGCHLD too: as PID 1 the
  // loop reaps orphans on it (plugin/runtime/orphan_reaper.h).
  efa::plugin::BlockOwnerLoopSignals();
  // gRPC polls every client channel's connection every 5 s from its timer
  // thread, to notice a peer gone while no call runs. The daemon's one
  // lasting channel, to the kubelet's pod-resources socket, is replaced
  // when the socket is and after a failed call, so it needs no such poll:
  // off (the environment may say otherwise), before gRPC reads it.
  setenv("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "0", /*overwrite=*/0);

  CLI::App app{"EFA device plugin for Kubernetes"};
  app.set_version_flag("--version",
                       "efa-k8s-device-plugin " EFA_VERSION " (revision " EFA_REVISION ")");
  efa::plugin::ConfigFlags flags(app);
  auto* inventory = app.add_subcommand("inventory", "Print the node's EFA devices and exit");
  inventory->fallthrough();
  auto* topology = app.add_subcommand(
      "topology",
      "Print which EFA is next to which GPU or Neuron device, and whether all EFAs are there");
  topology->fallthrough();
  std::string format = "table";
  topology->add_option("--format", format, "table, json, or dot (Graphviz: the PCIe tree)")
      ->capture_default_str()
      ->check(CLI::IsMember({"table", "json", "dot"}));
  app.require_subcommand(0, 1);
  CLI11_PARSE(app, argc, argv);

  auto effective = efa::plugin::ResolveConfig(flags, efa::plugin::ProcessEnvironment());
  if (!effective.ok()) {
    std::fprintf(stderr, "%s\n", std::string(effective.status().message()).c_str());
    return 2;
  }
  if (flags.print_config()) {
    std::fputs(effective->ToYaml().c_str(), stdout);
    return 0;
  }
  const Config& c = effective->config;
  const bool command = inventory->parsed() || topology->parsed();
  efa::plugin::ConfigureLogging(*c.log_level, *c.log_format, command);
  efa::topology::PointLibibverbsAt(*c.sysfs_root);
  if (inventory->parsed()) return RunInventory({*c.sysfs_root, *c.dev_root, *c.proc_root});
  if (topology->parsed()) return RunTopology(c, format);
  return RunDaemon(*effective, argc, argv);
}
