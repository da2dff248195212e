// efa-simnode: writes a simulated AWS node (fake sysfs, dev and hwloc XML).
//   efa-simnode --list
//   efa-simnode p5.48xlarge /tmp/p5 [--kernel-names]
#include <cstdio>
#include <string>

#include "CLI/CLI.hpp"
#include "test/sim/machine_spec.h"

int main(int argc, char** argv) {
  CLI::App app{"Write a simulated AWS node: ROOT/sys, ROOT/dev, ROOT/hwloc.xml"};
  std::string machine, root;
  bool list = false, kernel_names = false;
  app.add_flag("--list", list, "List the built-in machines");
  app.add_option("machine", machine, "Instance type, e.g. p5.48xlarge");
  app.add_option("root", root, "Directory to create (must be empty or absent)");
  app.add_flag("--kernel-names", kernel_names, "Name verbs devices efa_N as the kernel does");
  CLI11_PARSE(app, argc, argv);
  if (list) {
    for (const auto& m : efa::sim::BuiltinMachines()) std::printf("%s\n", m.instance_type.c_str());
    return 0;
  }
  if (machine.empty() || root.empty()) {
    std::fprintf(stderr, "%s", app.help().c_str());
    return 2;
  }
  auto spec = efa::sim::FindMachine(machine);
  if (!spec.ok()) {
    std::fprintf(stderr, "efa-simnode: %s\n", std::string(spec.status().message()).c_str());
    return 2;
  }
  auto status = efa::sim::WriteMachine(
      *spec, root, kernel_names ? efa::sim::Naming::kKernel : efa::sim::Naming::kUdev);
  if (!status.ok()) {
    std::fprintf(stderr, "efa-simnode: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
