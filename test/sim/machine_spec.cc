#include "test/sim/machine_spec.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "topology/hwloc_loader.h"

namespace efa::sim {
namespace fs = std::filesystem;

namespace {

PciAddress Bdf(uint8_t bus, uint8_t dev = 0, uint8_t fn = 0) { return {0, bus, dev, fn}; }

Endpoint Efa(uint8_t bus, uint8_t dev, uint16_t id) { return {Bdf(bus, dev), Kind::kEfa, id}; }
Endpoint Gpu(uint8_t bus, uint8_t dev, uint16_t id) { return {Bdf(bus, dev), Kind::kGpu, id}; }
Endpoint Neuron(uint8_t bus, uint8_t dev, uint16_t id) {
  return {Bdf(bus, dev), Kind::kNeuron, id};
}
// The primary ENA interface every instance has (same vendor as EFA).
PcieGroup EnaRoot(int numa = 0) {
  return {.root_bus = 0x00,
          .numa = numa,
          .switched = false,
          .endpoints = {{Bdf(0x00, 0x05), Kind::kEna, 0xec20}}};
}

// p5 / p5en / p6-b200 / trn2 style: root port -> Nitro switch -> one endpoint
// per downstream port: `efas` then `accels` on consecutive buses from `first`.
// The root port is on `root`, the switch's upstream port on root + 1 and its
// downstream ports on root + 2.
struct Switch {
  uint8_t root;
  uint8_t first;
  int numa;
  int efas;
  uint16_t efa_id;
  int accels;
  Kind accel_kind;
  uint16_t accel_id;
};
PcieGroup SwitchGroup(const Switch& sw) {
  PcieGroup g{.root_bus = sw.root, .numa = sw.numa, .switched = true, .endpoints = {}};
  uint8_t bus = sw.first;
  for (int i = 0; i < sw.efas; ++i) g.endpoints.push_back(Efa(bus++, 0, sw.efa_id));
  for (int i = 0; i < sw.accels; ++i)
    g.endpoints.push_back({Bdf(bus++), sw.accel_kind, sw.accel_id});
  return g;
}

MachineSpec P4d() {
  MachineSpec m{
      .instance_type = "p4d.24xlarge", .numa_nodes = 2, .cpus_per_numa = 2, .groups = {EnaRoot()}};
  for (auto [bus, numa] : {std::pair{0x10, 0}, {0x20, 0}, {0x90, 1}, {0xa0, 1}}) {
    auto b = static_cast<uint8_t>(bus);
    m.groups.push_back(
        {.root_bus = b,
         .numa = numa,
         .switched = false,
         .endpoints = {Efa(b, 0x1b, 0xefa0), Gpu(b, 0x1c, 0x20b0), Gpu(b, 0x1d, 0x20b0)}});
  }
  return m;
}

MachineSpec P5() {
  MachineSpec m{
      .instance_type = "p5.48xlarge", .numa_nodes = 2, .cpus_per_numa = 2, .groups = {EnaRoot()}};
  // NVSwitches are PCI-visible on HGX H100 but are not GPUs (class 0x0680).
  for (uint8_t dev = 0x1b; dev <= 0x1e; ++dev) {
    m.groups[0].endpoints.push_back({Bdf(0x00, dev), Kind::kNvSwitch, 0x22a3});
  }
  // Switch upstream ports 45,56,67,78 (NUMA 0) and 89,9a,ab,bc (NUMA 1):
  // EFAs on the next buses +10..+13 and the GPU on +14 (45 -> 4f-52, 53).
  const uint8_t upstream[] = {0x45, 0x56, 0x67, 0x78, 0x89, 0x9a, 0xab, 0xbc};
  for (int i = 0; i < 8; ++i) {
    m.groups.push_back(SwitchGroup({.root = static_cast<uint8_t>(upstream[i] - 1),
                                    .first = static_cast<uint8_t>(upstream[i] + 10),
                                    .numa = i < 4 ? 0 : 1,
                                    .efas = 4,
                                    .efa_id = 0xefa1,
                                    .accels = 1,
                                    .accel_kind = Kind::kGpu,
                                    .accel_id = 0x2330}));
  }
  return m;
}

// p5en / p6-b200 / p6-b300 style: four switches (first EFA buses 55, 6e,
// 87, a0), two on each NUMA node, each with `efas_per_switch` EFAs and two
// GPUs.
struct FourSwitchMachine {
  std::string instance_type;
  int efas_per_switch;
  uint16_t efa_id;
  uint16_t gpu_id;
};
MachineSpec FourSwitches(const FourSwitchMachine& f) {
  MachineSpec m{
      .instance_type = f.instance_type, .numa_nodes = 2, .cpus_per_numa = 2, .groups = {EnaRoot()}};
  const uint8_t first[] = {0x55, 0x6e, 0x87, 0xa0};
  for (int i = 0; i < 4; ++i) {
    m.groups.push_back(SwitchGroup({.root = static_cast<uint8_t>(first[i] - 3),
                                    .first = first[i],
                                    .numa = i < 2 ? 0 : 1,
                                    .efas = f.efas_per_switch,
                                    .efa_id = f.efa_id,
                                    .accels = 2,
                                    .accel_kind = Kind::kGpu,
                                    .accel_id = f.gpu_id}));
  }
  return m;
}

MachineSpec P5en() {
  return FourSwitches(
      {.instance_type = "p5en.48xlarge", .efas_per_switch = 4, .efa_id = 0xefa2, .gpu_id = 0x2335});
}

MachineSpec P6B200() {
  MachineSpec m = FourSwitches({.instance_type = "p6-b200.48xlarge",
                                .efas_per_switch = 2,
                                .efa_id = 0xefa3,
                                .gpu_id = 0x2901});
  // ConnectX-7 verbs devices beside the EFAs: verbs devices, not EFA.
  m.groups.push_back({.root_bus = 0x30,
                      .numa = 0,
                      .switched = false,
                      .endpoints = {{Bdf(0x30, 0x01), Kind::kMlx5, 0x1021}}});
  m.groups.push_back({.root_bus = 0xb0,
                      .numa = 1,
                      .switched = false,
                      .endpoints = {{Bdf(0xb0, 0x01), Kind::kMlx5, 0x1021}}});
  return m;
}

// p6-b300.48xlarge: 8 GPUs and 16 EFAs at 400 Gbps, the primary network
// card ENA only (EC2 user guide, P6-B300 network cards). Assumed, as no
// public source we read gives them (correct here): p5en's layout of four
// switches with four EFAs and two GPUs each, EFA ID efa3, GPU ID 10de:3182.
MachineSpec P6B300() {
  return FourSwitches({.instance_type = "p6-b300.48xlarge",
                       .efas_per_switch = 4,
                       .efa_id = 0xefa3,
                       .gpu_id = 0x3182});
}

// p6e-gb200.36xlarge, arm64: two Grace CPUs (Neoverse-V2), a NUMA node
// each, and four Blackwell GPUs, two per Grace. Public facts (EC2 user
// guide, EFA for P6e-GB200): 17 network cards; card 0 ENA only; odd cards
// 1..15 EFA-only at 400 Gbps, even cards 2..16 ENA or EFA at 200 Gbps;
// cards [1,2]..[15,16] share one physical NIC; GPU g's traffic goes through
// cards 4g+1 and 4g+3. aws-ofi-nccl (src/platform-aws.cpp,
// src/nccl_ofi_topo.cpp) skips on p6e-gb200 the NICs without an accelerator
// at the same PCI level. So here the odd cards' EFAs sit behind their GPU's
// switch and the even cards' (with their ENA functions) on a root complex
// of their own on the GPU's NUMA node, where only NUMA relates them to a
// GPU. Assumed (no public source we read gives them; correct here): the bus
// numbers, an EFA on every card but 0 (16), Nitro switches (1d0f:0200), EFA
// ID efa3, GPU ID 10de:2941, Grace root ports 10de:22b2, and PCI domain 0
// throughout (a Grace host gives each root port a domain of its own).
MachineSpec P6eGb200() {
  MachineSpec m{.instance_type = "p6e-gb200.36xlarge",
                .numa_nodes = 2,
                .cpus_per_numa = 2,
                .groups = {EnaRoot()}};
  m.arm64_cpu_part = 0xd4f;
  m.root_port_vendor = 0x10de;
  m.root_port_device = 0x22b2;
  for (int g = 0; g < 4; ++g) {
    const auto root = static_cast<uint8_t>(0x10 + 0x40 * g);
    const int numa = g / 2;
    // Cards 4g+1 and 4g+3, then the GPU, behind one switch.
    m.groups.push_back(SwitchGroup({.root = root,
                                    .first = static_cast<uint8_t>(root + 3),
                                    .numa = numa,
                                    .efas = 2,
                                    .efa_id = 0xefa3,
                                    .accels = 1,
                                    .accel_kind = Kind::kGpu,
                                    .accel_id = 0x2941}));
    // Cards 4g+2 and 4g+4: EFA and ENA functions on a root bus of their own.
    const auto even = static_cast<uint8_t>(root + 0x20);
    m.groups.push_back({.root_bus = even,
                        .numa = numa,
                        .switched = false,
                        .endpoints = {Efa(even, 0x01, 0xefa3),
                                      Efa(even, 0x02, 0xefa3),
                                      {Bdf(even, 0x03), Kind::kEna, 0xec20},
                                      {Bdf(even, 0x04), Kind::kEna, 0xec20}}});
  }
  return m;
}

// hpc7g.16xlarge, arm64: one Graviton3E (Neoverse-V1), one NUMA node, 1 EFA
// (Karpenter's instance-types reference). Assumed (correct here): the EFA
// at 00:06.0 beside the primary ENA, EFA ID efa1.
MachineSpec Hpc7g() {
  MachineSpec m{.instance_type = "hpc7g.16xlarge",
                .numa_nodes = 1,
                .cpus_per_numa = 2,
                .groups = {EnaRoot()}};
  m.arm64_cpu_part = 0xd40;
  m.groups[0].endpoints.push_back(Efa(0x00, 0x06, 0xefa1));
  return m;
}

// c8gn.48xlarge, arm64: two Graviton4 (Neoverse-V2) sockets, 2 EFAs
// (Karpenter's instance-types reference). Assumed (correct here): one EFA
// per socket, the second on a root complex of NUMA node 1, EFA ID efa2.
MachineSpec C8gn() {
  MachineSpec m{
      .instance_type = "c8gn.48xlarge", .numa_nodes = 2, .cpus_per_numa = 2, .groups = {EnaRoot()}};
  m.arm64_cpu_part = 0xd4f;
  m.groups[0].endpoints.push_back(Efa(0x00, 0x06, 0xefa2));
  m.groups.push_back(
      {.root_bus = 0x80, .numa = 1, .switched = false, .endpoints = {Efa(0x80, 0x06, 0xefa2)}});
  return m;
}

MachineSpec Trn1(bool trn1n) {
  MachineSpec m{.instance_type = trn1n ? "trn1n.32xlarge" : "trn1.32xlarge",
                .numa_nodes = 2,
                .cpus_per_numa = 2,
                .groups = {EnaRoot()}};
  for (auto [bus, numa] : {std::pair{0x10, 0}, {0x20, 0}, {0x90, 1}, {0xa0, 1}}) {
    auto b = static_cast<uint8_t>(bus);
    PcieGroup g{.root_bus = b, .numa = numa, .switched = false, .endpoints = {}};
    if (trn1n) {
      g.endpoints.push_back(Efa(b, 0x17, 0xefa1));
      g.endpoints.push_back(Efa(b, 0x18, 0xefa1));
    }
    g.endpoints.push_back(Efa(b, 0x19, 0xefa1));
    g.endpoints.push_back(Efa(b, 0x1a, 0xefa1));
    for (uint8_t dev = 0x1b; dev <= 0x1e; ++dev) g.endpoints.push_back(Neuron(b, dev, 0x7164));
    m.groups.push_back(std::move(g));
  }
  return m;
}

MachineSpec Trn2() {
  MachineSpec m{
      .instance_type = "trn2.48xlarge", .numa_nodes = 2, .cpus_per_numa = 2, .groups = {EnaRoot()}};
  // Two EFAs and two Trainium2 per switch (EFA 56,57 beside Neuron 58,59 ...).
  const uint8_t first[] = {0x56, 0x6c, 0x82, 0x98, 0xb3, 0xc9, 0xdf, 0xf5};
  for (int i = 0; i < 8; ++i) {
    m.groups.push_back(SwitchGroup({.root = static_cast<uint8_t>(first[i] - 3),
                                    .first = first[i],
                                    .numa = i < 4 ? 0 : 1,
                                    .efas = 2,
                                    .efa_id = 0xefa2,
                                    .accels = 2,
                                    .accel_kind = Kind::kNeuron,
                                    .accel_id = 0x7364}));
  }
  return m;
}

MachineSpec G5() {
  // Everything on bus 00 and numa_node -1 (no proximity information).
  MachineSpec m{
      .instance_type = "g5.48xlarge", .numa_nodes = 2, .cpus_per_numa = 2, .groups = {EnaRoot(-1)}};
  auto& eps = m.groups[0].endpoints;
  eps.push_back(Efa(0x00, 0x15, 0xefa0));
  for (uint8_t dev = 0x16; dev <= 0x1d; ++dev) eps.push_back(Gpu(0x00, dev, 0x2237));
  // Assumed, so that one built-in machine runs an efa driver before r2.17.0
  // (a node on an older AMI): its EFA has no network counters.
  m.efa_network_counters = false;
  return m;
}

MachineSpec NoEfa() {
  return {
      .instance_type = "m5.8xlarge", .numa_nodes = 1, .cpus_per_numa = 2, .groups = {EnaRoot()}};
}

struct KindInfo {
  uint16_t vendor;
  uint32_t class_code;
  const char* driver;
  bool verbs;
};

KindInfo Info(Kind kind) {
  switch (kind) {
    case Kind::kEfa:
      return {0x1d0f, 0x020000, "efa", true};
    case Kind::kEna:
      return {0x1d0f, 0x020000, "ena", false};
    case Kind::kGpu:
      return {0x10de, 0x030200, "nvidia", false};
    case Kind::kNvSwitch:
      return {0x10de, 0x068000, "nvidia", false};
    case Kind::kNeuron:
      return {0x1d0f, 0x088000, "neuron", false};
    case Kind::kMlx5:
      return {0x15b3, 0x020700, "mlx5_core", true};
  }
  return {};
}

// Writes a file and its parent directories; errors are collected in `status`.
class TreeWriter {
 public:
  void File(const fs::path& path, const std::string& content) {
    if (!status_.ok()) return;
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    std::ofstream out(path, std::ios::binary);
    out << content;
    if (!out) status_ = absl::InternalError(absl::StrCat(path.string(), ": cannot write"));
  }
  // A relative symlink at `link` pointing at `target`, as sysfs has them.
  void Link(const fs::path& link, const fs::path& target) {
    if (!status_.ok()) return;
    std::error_code ec;
    fs::create_directories(link.parent_path(), ec);
    fs::create_directory_symlink(fs::relative(target, link.parent_path()), link, ec);
    if (ec) status_ = absl::ErrnoToStatus(ec.value(), link.string());
  }
  // A character device node, as devtmpfs has them (needs CAP_MKNOD).
  void CharDevice(const fs::path& path, unsigned major, unsigned minor) {
    if (!status_.ok()) return;
    status_ = MakeCharDevice(path, major, minor);
  }
  void Dir(const fs::path& path) {
    std::error_code ec;
    if (status_.ok() && !fs::create_directories(path, ec) && ec) {
      status_ = absl::ErrnoToStatus(ec.value(), path.string());
    }
  }
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

// A kernel cpumask ("00000003") for cpus [first, first + count).
std::string CpuMask(int first, int count) {
  std::vector<uint32_t> words((first + count + 31) / 32, 0);
  for (int c = first; c < first + count; ++c) words[c / 32] |= 1u << (c % 32);
  std::vector<std::string> parts;
  for (auto it = words.rbegin(); it != words.rend(); ++it) {
    parts.push_back(absl::StrFormat("%08x", *it));
  }
  return absl::StrJoin(parts, ",");
}

std::string CpuList(int first, int count) {
  return count == 1 ? absl::StrCat(first) : absl::StrCat(first, "-", first + count - 1);
}

// 64 bytes of PCI configuration space: IDs, class, header type and, for a
// bridge, its bus numbers (hwloc nests devices by these).
std::string ConfigSpace(uint16_t vendor, uint16_t device, uint32_t class_code, bool bridge,
                        uint8_t primary = 0, uint8_t secondary = 0, uint8_t subordinate = 0) {
  std::string c(64, '\0');
  c[0] = static_cast<char>(vendor & 0xff);
  c[1] = static_cast<char>(vendor >> 8);
  c[2] = static_cast<char>(device & 0xff);
  c[3] = static_cast<char>(device >> 8);
  c[0x09] = static_cast<char>(class_code & 0xff);
  c[0x0a] = static_cast<char>((class_code >> 8) & 0xff);
  c[0x0b] = static_cast<char>((class_code >> 16) & 0xff);
  c[0x0e] = bridge ? 1 : 0;
  if (bridge) {
    c[0x18] = static_cast<char>(primary);
    c[0x19] = static_cast<char>(secondary);
    c[0x1a] = static_cast<char>(subordinate);
  }
  return c;
}

struct Machine {
  const MachineSpec& spec;
  fs::path root;
  fs::path sys;
  TreeWriter w;

  int total_cpus() const { return spec.numa_nodes * spec.cpus_per_numa; }

  void Cpus() {
    const fs::path cpu = sys / "devices/system/cpu";
    const fs::path node = sys / "devices/system/node";
    const int n = total_cpus();
    for (const char* f : {"online", "possible", "present"}) w.File(cpu / f, CpuList(0, n) + "\n");
    std::string cpuinfo;
    for (int c = 0; c < n; ++c) {
      const int numa = c / spec.cpus_per_numa;
      const fs::path t = cpu / absl::StrCat("cpu", c) / "topology";
      if (c > 0) w.File(cpu / absl::StrCat("cpu", c) / "online", "1\n");
      w.File(t / "physical_package_id", absl::StrCat(numa, "\n"));
      w.File(t / "core_id", absl::StrCat(c % spec.cpus_per_numa, "\n"));
      for (const char* f : {"thread_siblings", "core_cpus"}) w.File(t / f, CpuMask(c, 1) + "\n");
      for (const char* f : {"thread_siblings_list", "core_cpus_list"}) {
        w.File(t / f, absl::StrCat(c, "\n"));
      }
      const int first = numa * spec.cpus_per_numa;
      // Dies are x86's alone: the kernel shows die_id and die_cpus only
      // there (drivers/base/topology.c, TOPOLOGY_DIE_SYSFS).
      std::vector<std::string> groups = {"core_siblings", "package_cpus"};
      if (!spec.arm64_cpu_part) {
        w.File(t / "die_id", "0\n");
        groups.push_back("die_cpus");
      }
      for (const std::string& f : groups) {
        w.File(t / f, CpuMask(first, spec.cpus_per_numa) + "\n");
        w.File(t / (f + "_list"), CpuList(first, spec.cpus_per_numa) + "\n");
      }
      if (spec.arm64_cpu_part) {
        // arm64's /proc/cpuinfo (arch/arm64/kernel/cpuinfo.c, c_show): no
        // vendor, model or package lines, the Arm IDs instead.
        absl::StrAppendFormat(&cpuinfo,
                              "processor\t: %d\nBogoMIPS\t: 2000.00\nFeatures\t: fp asimd "
                              "evtstrm aes pmull sha1 sha2 crc32 atomics cpuid asimdrdm sve\n"
                              "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: "
                              "0x0\nCPU part\t: 0x%03x\nCPU revision\t: 1\n\n",
                              c, *spec.arm64_cpu_part);
      } else {
        absl::StrAppend(&cpuinfo, "processor\t: ", c, "\nphysical id\t: ", numa,
                        "\ncore id\t\t: ", c % spec.cpus_per_numa, "\n\n");
      }
    }
    w.File(root / "proc/cpuinfo", cpuinfo);
    if (spec.arm64_cpu_part) {
      // hwloc takes the machine's architecture from here when it reads a
      // root other than "/" (as hwloc-gather-topology leaves it), not from
      // the build host's uname.
      w.File(root / "proc/hwloc-nofile-info", "OSName: Linux\nArchitecture: aarch64\n");
    }
    w.File(root / "proc/meminfo",
           absl::StrCat("MemTotal:       ", spec.numa_nodes * 1048576, " kB\n"));
    for (const char* f : {"online", "possible", "has_cpu", "has_memory", "has_normal_memory"}) {
      w.File(node / f, CpuList(0, spec.numa_nodes) + "\n");
    }
    for (int i = 0; i < spec.numa_nodes; ++i) {
      const fs::path d = node / absl::StrCat("node", i);
      w.File(d / "cpumap", CpuMask(i * spec.cpus_per_numa, spec.cpus_per_numa) + "\n");
      w.File(d / "cpulist", CpuList(i * spec.cpus_per_numa, spec.cpus_per_numa) + "\n");
      w.File(d / "meminfo", absl::StrCat("Node ", i, " MemTotal:       1048576 kB\n"));
      std::vector<std::string> dist;
      for (int j = 0; j < spec.numa_nodes; ++j) dist.push_back(i == j ? "10" : "20");
      w.File(d / "distance", absl::StrJoin(dist, " ") + "\n");
    }
  }

  void Dmi() {
    const fs::path dmi = sys / "devices/virtual/dmi/id";
    w.File(dmi / "product_name", spec.instance_type + "\n");
    w.File(dmi / "sys_vendor", "Amazon EC2\n");
  }

  // A PCI function directory with the attributes the kernel, hwloc and
  // libibverbs read, its driver link and its /sys/bus/pci/devices entry.
  void PciFunction(const fs::path& dir, const PciAddress& addr, uint16_t vendor, uint16_t device,
                   uint32_t class_code, const char* driver, int numa, const std::string& config) {
    auto hex = [](unsigned v, int width) { return absl::StrFormat("0x%0*x\n", width, v); };
    w.File(dir / "vendor", hex(vendor, 4));
    w.File(dir / "device", hex(device, 4));
    w.File(dir / "subsystem_vendor", hex(vendor, 4));
    w.File(dir / "subsystem_device", hex(device, 4));
    w.File(dir / "class", hex(class_code, 6));
    w.File(dir / "revision", "0x00\n");
    w.File(dir / "numa_node", absl::StrCat(numa, "\n"));
    const int first = numa < 0 ? 0 : numa * spec.cpus_per_numa;
    const int count = numa < 0 ? total_cpus() : spec.cpus_per_numa;
    w.File(dir / "local_cpus", CpuMask(first, count) + "\n");
    w.File(dir / "local_cpulist", CpuList(first, count) + "\n");
    w.File(dir / "current_link_speed", "32.0 GT/s PCIe\n");
    w.File(dir / "current_link_width", "16\n");
    w.File(dir / "modalias",
           absl::StrFormat("pci:v%08Xd%08Xsv%08Xsd%08Xbc%02Xsc%02Xi%02X\n", vendor, device, vendor,
                           device, class_code >> 16, (class_code >> 8) & 0xff, class_code & 0xff));
    w.File(dir / "config", config);
    w.Dir(sys / "bus/pci/drivers" / driver);
    w.Link(dir / "driver", sys / "bus/pci/drivers" / driver);
    w.Link(sys / "bus/pci/devices" / addr.ToString(), dir);
  }

  void Bridge(const fs::path& dir, const PciAddress& addr, uint16_t vendor, uint16_t device,
              int numa, uint8_t secondary, uint8_t subordinate) {
    PciFunction(dir, addr, vendor, device, 0x060400, "pcieport", numa,
                ConfigSpace(vendor, device, 0x060400, true, addr.bus, secondary, subordinate));
  }

  // The efa driver's counters, every one it has (efa_verbs.c,
  // EFA_DEFINE_DEVICE_STATS and EFA_DEFINE_PORT_STATS of amzn-drivers efa
  // 3.1.0), at 0, and the RDMA core's lifespan file in each group (ms).
  // Without spec.efa_network_counters, as a driver before r2.17.0: the port
  // counters up to rdma_write_recv_bytes (amzn-drivers commit 8ef8bcd added
  // the five after it).
  void EfaCounters(const fs::path& ib) {
    for (const char* name : {"submitted_cmds", "completed_cmds", "cmds_err", "no_completion_cmds",
                             "keep_alive_rcvd", "alloc_pd_err", "create_qp_err", "create_cq_err",
                             "reg_mr_err", "alloc_ucontext_err", "create_ah_err", "mmap_err"}) {
      w.File(ib / "hw_counters" / name, "0\n");
    }
    for (const char* name :
         {"tx_bytes", "tx_pkts", "rx_bytes", "rx_pkts", "rx_drops", "send_bytes", "send_wrs",
          "recv_bytes", "recv_wrs", "rdma_read_wrs", "rdma_read_bytes", "rdma_read_wr_err",
          "rdma_read_resp_bytes", "rdma_write_wrs", "rdma_write_bytes", "rdma_write_wr_err",
          "rdma_write_recv_bytes"}) {
      w.File(ib / "ports/1/hw_counters" / name, "0\n");
    }
    if (spec.efa_network_counters) {
      for (const char* name : {"retrans_bytes", "retrans_pkts", "retrans_timeout_events",
                               "unresponsive_remote_events", "impaired_remote_conn_events"}) {
        w.File(ib / "ports/1/hw_counters" / name, "0\n");
      }
    }
    w.File(ib / "hw_counters/lifespan", "10\n");
    w.File(ib / "ports/1/hw_counters/lifespan", "10\n");
  }

  void VerbsDevice(const fs::path& pci_dir, const Endpoint& ep, const std::string& ibdev,
                   int uverbs) {
    const std::string bdf = ep.addr.ToString();
    const fs::path ib = pci_dir / "infiniband" / ibdev;
    w.File(ib / "node_guid", absl::StrFormat("0a%02x:%02x%02x:fe00:%04x\n", ep.addr.bus,
                                             ep.addr.device, ep.addr.function, uverbs));
    w.File(ib / "node_type", "1: CA\n");
    w.File(ib / "ports/1/state", "4: ACTIVE\n");
    w.File(ib / "ports/1/link_layer", ep.kind == Kind::kEfa ? "Unspecified\n" : "InfiniBand\n");
    w.Link(ib / "device", pci_dir);
    w.Link(sys / "class/infiniband" / ibdev, ib);
    if (ep.kind == Kind::kEfa) EfaCounters(ib);
    const std::string name = absl::StrCat("uverbs", uverbs);
    const fs::path uv = pci_dir / "infiniband_verbs" / name;
    w.File(uv / "ibdev", ibdev + "\n");
    // Minors 192..223 for the first 32 uverbs devices, dynamic beyond.
    const unsigned minor = uverbs < 32 ? 192 + uverbs : uverbs - 32;
    w.File(uv / "dev", absl::StrCat("231:", minor, "\n"));
    w.File(uv / "abi_version", "1\n");
    w.Link(uv / "device", pci_dir);
    w.Link(sys / "class/infiniband_verbs" / name, uv);
    w.CharDevice(root / "dev/infiniband" / name, 231, minor);
  }
};

}  // namespace

absl::Status MakeCharDevice(const std::filesystem::path& path, unsigned major, unsigned minor) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (::mknod(path.c_str(), S_IFCHR | 0666, makedev(major, minor)) != 0) {
    const int err = errno;
    return absl::ErrnoToStatus(
        err, absl::StrCat(path.string(), ": cannot make character device ", major, ":", minor,
                          err == EPERM ? " (needs root: CAP_MKNOD)" : ""));
  }
  return absl::OkStatus();
}

namespace {

// Whole values only, as sysfs shows them: writes aside, then renames.
absl::Status ReplaceFile(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    out << text;
    if (!out) return absl::InternalError(absl::StrCat(tmp.string(), ": cannot write"));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return absl::ErrnoToStatus(ec.value(), path.string());
  return absl::OkStatus();
}

}  // namespace

absl::Status RestoreUverbsNode(const std::string& root, int uverbs) {
  const std::string name = absl::StrCat("uverbs", uverbs);
  const fs::path dev_file = fs::path(root) / "sys/class/infiniband_verbs" / name / "dev";
  std::ifstream in(dev_file);
  unsigned major = 0, minor = 0;
  char colon = 0;
  if (!(in >> major >> colon >> minor) || colon != ':') {
    return absl::NotFoundError(absl::StrCat(dev_file.string(), ": no \"major:minor\""));
  }
  if (auto made = MakeCharDevice(fs::path(root) / "dev/infiniband" / name, major, minor);
      !made.ok()) {
    return made;
  }
  return CountUevent(root);
}

absl::Status CountUevent(const std::string& root) {
  const fs::path path = fs::path(root) / "sys/kernel/uevent_seqnum";
  std::ifstream in(path);
  uint64_t count = 0;
  if (!(in >> count)) return absl::NotFoundError(absl::StrCat(path.string(), ": no count"));
  in.close();
  return ReplaceFile(path, absl::StrCat(count + 1, "\n"));
}

absl::Status SetEfaCounter(const std::string& root, const std::string& ibdev,
                           const std::string& name, uint64_t value) {
  const fs::path dev = fs::path(root) / "sys/class/infiniband" / ibdev;
  fs::path path = dev / "hw_counters" / name;
  std::error_code ec;
  if (!fs::exists(path, ec)) path = dev / "ports/1/hw_counters" / name;
  if (!fs::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat(dev.string(), ": no counter ", name,
                                            " in hw_counters or ports/1/hw_counters"));
  }
  return ReplaceFile(path, absl::StrCat(value, "\n"));
}

std::string VerbsName(Kind kind, const PciAddress& addr, int index, Naming naming) {
  if (naming == Naming::kKernel) {
    return absl::StrCat(kind == Kind::kEfa ? "efa_" : "mlx5_", index);
  }
  std::string name = absl::StrCat(kind == Kind::kEfa ? "rdmap" : "ibp", addr.bus, "s", addr.device);
  if (addr.function != 0) absl::StrAppend(&name, "f", addr.function);
  if (addr.domain != 0)
    name = absl::StrCat(kind == Kind::kEfa ? "rdmaP" : "ibP", addr.domain,
                        name.substr(kind == Kind::kEfa ? 4 : 2));
  return name;
}

std::string SimGpuUuid(const PciAddress& addr) {
  return absl::StrFormat("GPU-%04x%02x%02x-%x000-4000-8000-00000000e%03x", addr.domain, addr.bus,
                         addr.device, addr.function, addr.bus);
}

const std::vector<MachineSpec>& BuiltinMachines() {
  static const auto* machines = new std::vector<MachineSpec>{
      P4d(),  P5(), P5en(),  P6B200(),   P6B300(), Trn1(false), Trn1(true),
      Trn2(), G5(), NoEfa(), P6eGb200(), Hpc7g(),  C8gn()};
  return *machines;
}

absl::StatusOr<MachineSpec> FindMachine(const std::string& name) {
  std::vector<std::string> names;
  for (const MachineSpec& m : BuiltinMachines()) {
    if (m.instance_type == name || (name == "no-efa" && m.instance_type == "m5.8xlarge")) {
      return m;
    }
    names.push_back(m.instance_type);
  }
  return absl::NotFoundError(absl::StrCat("unknown machine \"", name,
                                          "\"; known: ", absl::StrJoin(names, ", "), ", no-efa"));
}

absl::Status WriteMachine(const MachineSpec& spec, const std::string& root, Naming naming) {
  std::error_code ec;
  if (fs::exists(root, ec) && !fs::is_empty(root, ec)) {
    return absl::FailedPreconditionError(absl::StrCat(root, ": exists and is not empty"));
  }
  Machine m{spec, fs::absolute(root), fs::absolute(root) / "sys", {}};
  m.Cpus();
  m.Dmi();
  // The kernel's uevent count: tests add one (CountUevent) for every
  // device change the kernel would announce.
  m.w.File(m.sys / "kernel/uevent_seqnum", "4711\n");

  // Verbs devices are numbered in PCI order, as the kernel probes them.
  std::vector<const Endpoint*> verbs;
  for (const PcieGroup& g : spec.groups) {
    for (const Endpoint& ep : g.endpoints) {
      if (Info(ep.kind).verbs) verbs.push_back(&ep);
    }
  }
  std::sort(verbs.begin(), verbs.end(),
            [](const Endpoint* a, const Endpoint* b) { return a->addr < b->addr; });
  std::map<const Endpoint*, std::pair<std::string, int>> verbs_names;  // ibdev, uverbs
  std::map<Kind, int> per_driver;
  for (size_t i = 0; i < verbs.size(); ++i) {
    const Endpoint* ep = verbs[i];
    verbs_names[ep] = {VerbsName(ep->kind, ep->addr, per_driver[ep->kind]++, naming),
                       static_cast<int>(i)};
  }
  if (!verbs.empty()) {
    m.w.File(m.sys / "class/infiniband_verbs/abi_version", "6\n");
    m.w.Dir(m.root / "dev/infiniband");
  }

  int gpu_minor = 0;
  for (const PcieGroup& g : spec.groups) {
    fs::path parent = m.sys / "devices" / absl::StrFormat("pci0000:%02x", g.root_bus);
    m.w.Dir(parent);
    uint8_t internal = 0;
    fs::path upstream_dir;
    if (g.switched) {
      uint8_t last = g.root_bus;
      for (const Endpoint& ep : g.endpoints) last = std::max(last, ep.addr.bus);
      const auto upstream = static_cast<uint8_t>(g.root_bus + 1);
      internal = static_cast<uint8_t>(g.root_bus + 2);
      const PciAddress port{0, g.root_bus, 0x01, 0};
      const fs::path port_dir = parent / port.ToString();
      m.Bridge(port_dir, port, spec.root_port_vendor, spec.root_port_device, g.numa, upstream,
               last);
      const PciAddress up{0, upstream, 0, 0};
      upstream_dir = port_dir / up.ToString();
      m.Bridge(upstream_dir, up, 0x1d0f, 0x0200, g.numa, internal, last);
    }
    for (size_t i = 0; i < g.endpoints.size(); ++i) {
      const Endpoint& ep = g.endpoints[i];
      const KindInfo info = Info(ep.kind);
      fs::path dir;
      if (g.switched) {
        const PciAddress down{0, internal, static_cast<uint8_t>(i + 1), 0};
        const fs::path down_dir = upstream_dir / down.ToString();
        m.Bridge(down_dir, down, 0x1d0f, 0x0200, g.numa, ep.addr.bus, ep.addr.bus);
        dir = down_dir / ep.addr.ToString();
      } else {
        dir = parent / ep.addr.ToString();
      }
      m.PciFunction(dir, ep.addr, info.vendor, ep.device_id, info.class_code, info.driver, g.numa,
                    ConfigSpace(info.vendor, ep.device_id, info.class_code, false));
      if (ep.kind == Kind::kGpu) {
        m.w.File(
            m.root / "proc/driver/nvidia/gpus" / ep.addr.ToString() / "information",
            absl::StrFormat("Model: \t\t NVIDIA GPU %04x\nIRQ:   \t\t 0\nGPU UUID: \t %s\n"
                            "Video BIOS: \t 00.00.00.00.00\nBus Type: \t PCIe\n"
                            "DMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\n"
                            "Bus Location: \t %s\nDevice Minor: \t %d\n",
                            ep.device_id, SimGpuUuid(ep.addr), ep.addr.ToString(), gpu_minor++));
      }
      if (info.verbs) {
        const auto& [ibdev, uverbs] = verbs_names[&ep];
        m.VerbsDevice(dir, ep, ibdev, uverbs);
      }
    }
  }
  if (!m.w.status().ok()) return m.w.status();

  auto topology = topology::LoadTopology({m.root.string(), ""});
  if (!topology.ok()) return topology.status();
  return topology::ExportTopologyXml(topology->get(), (m.root / "hwloc.xml").string());
}

}  // namespace efa::sim
