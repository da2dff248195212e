// efa-k8s-device-plugin: the kubelet device plugin for AWS EFA.
#include <cstdio>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "topology/efa_discovery.h"

namespace {

// Prints the node's EFAs and what discovery passed over.
int RunInventory(const efa::topology::HostRoots& roots) {
  efa::topology::PointLibibverbsAt(roots.sysfs);
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
  CLI::App app{"EFA device plugin for Kubernetes"};
  efa::topology::HostRoots roots;
  std::string sysfs = roots.sysfs, dev = roots.dev, proc = roots.proc;
  app.add_option("--sysfs-root", sysfs, "Where the host's /sys is")->capture_default_str();
  app.add_option("--dev-root", dev, "Where the host's /dev is")->capture_default_str();
  app.add_option("--proc-root", proc, "Where the host's /proc is")->capture_default_str();
  auto* inventory = app.add_subcommand("inventory", "Print the node's EFA devices and exit");
  app.require_subcommand(0, 1);
  inventory->fallthrough();
  CLI11_PARSE(app, argc, argv);
  roots = {sysfs, dev, proc};
  (void)inventory;
  return RunInventory(roots);
}
