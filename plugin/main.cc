// efa-k8s-device-plugin: the kubelet device plugin for AWS EFA.
#include <signal.h>

#include <cstdio>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "plugin/daemon.h"
#include "spdlog/spdlog.h"
#include "topology/efa_discovery.h"

namespace {

// Prints the node's EFAs and what discovery passed over.
int RunInventory(const efa::topology::HostRoots& roots) {
  auto inv = efa::topology::DiscoverEfaDevices(roots);
  efa::topology::MarkVerbsProviders(inv);
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

}  // namespace

int main(int argc, char** argv) {
  // Signals are taken by the owner loop through a signalfd: block them
  // before any thread (gRPC's included) exists.
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&set, s);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  CLI::App app{"EFA device plugin for Kubernetes"};
  efa::plugin::DaemonOptions options;
  std::string sysfs = options.roots.sysfs, dev = options.roots.dev, proc = options.roots.proc;
  std::string kubelet_dir = options.kubelet_dir, log_level = "info";
  double rescan_seconds = 10;
  app.add_option("--sysfs-root", sysfs, "Where the host's /sys is")->capture_default_str();
  app.add_option("--dev-root", dev, "Where the host's /dev is")->capture_default_str();
  app.add_option("--proc-root", proc, "Where the host's /proc is")->capture_default_str();
  app.add_option("--topology-xml", options.topology_xml,
                 "Read the PCI tree from this hwloc XML file instead of the host");
  app.add_option("--instance-type", options.instance_type,
                 "The EC2 instance type (default: the DMI product name)");
  app.add_option("--kubelet-dir", kubelet_dir, "The kubelet's root directory")
      ->capture_default_str();
  app.add_option("--report-numa", options.report_numa,
                 "Report each device's NUMA node to the kubelet (Topology Manager)")
      ->capture_default_str();
  app.add_option("--rescan-interval", rescan_seconds,
                 "Seconds between fallback rescans of the devices")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->capture_default_str()
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  std::string mofed_policy = "warn", dra_policy = "yield";
  std::vector<std::string> cdi_spec_dirs(options.cdi_spec_dirs.begin(),
                                         options.cdi_spec_dirs.end());
  app.add_option("--mofed-policy", mofed_policy,
                 "When the NVIDIA device plugin has MOFED on: warn (log and report), protect "
                 "(also report every EFA Unhealthy until it clears) or off")
      ->capture_default_str()
      ->check(CLI::IsMember({"warn", "protect", "off"}));
  app.add_option("--dra-policy", dra_policy,
                 "While the EFA DRA driver (dra.net) is registered with the kubelet: yield "
                 "(withdraw vpc.amazonaws.com/efa) or ignore")
      ->capture_default_str()
      ->check(CLI::IsMember({"yield", "ignore"}));
  app.add_option("--cdi-spec-dirs", cdi_spec_dirs,
                 "Where the host's CDI specs are (the NVIDIA MOFED spec is looked for there)")
      ->delimiter(',')
      ->capture_default_str();
  auto* inventory = app.add_subcommand("inventory", "Print the node's EFA devices and exit");
  inventory->fallthrough();
  app.require_subcommand(0, 1);
  CLI11_PARSE(app, argc, argv);
  options.roots = {sysfs, dev, proc};
  options.kubelet_dir = kubelet_dir;
  options.rescan_interval = std::chrono::milliseconds(static_cast<int64_t>(rescan_seconds * 1000));
  options.handle_signals = true;
  options.mofed_policy = *efa::plugin::ParseMofedPolicy(mofed_policy);
  options.dra_policy = *efa::plugin::ParseDraPolicy(dra_policy);
  options.cdi_spec_dirs.assign(cdi_spec_dirs.begin(), cdi_spec_dirs.end());
  spdlog::set_level(spdlog::level::from_str(log_level));
  efa::topology::PointLibibverbsAt(options.roots.sysfs);
  if (inventory->parsed()) return RunInventory(options.roots);
  efa::plugin::Daemon daemon(options);
  return daemon.Run();
}
