#include "topology/efa_discovery.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <map>
#include <set>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace efa::topology {
namespace fs = std::filesystem;

std::optional<int> EfaGeneration(uint16_t vendor, uint16_t device) {
  // The family, not the IDs known today: the kernel's efa driver lists
  // 0xefa0-0xefa3 (efa_main.c, efa_pci_tbl) and a 2026 patch adds 0xefa4;
  // aws-ofi-nccl takes any (device & 0xfff0) == 0xefa0, and so does this,
  // so that a new generation is not seen as zero EFAs. ENA (0x0ec2, 0x1ec2,
  // 0xec20, 0xec21) and Neuron (0x7xxx) share the vendor and stay out.
  if (vendor != kAmazonVendorId || (device & 0xfff0) != 0xefa0) return std::nullopt;
  return device - 0xefa0 + 1;
}

namespace {

struct UverbsEntry {
  std::string name;
  absl::StatusOr<std::pair<uint32_t, uint32_t>> numbers;
};

// A listing or read that failed for a reason that says nothing about the
// devices: "listing <dir>: <strerror>", "reading <file>: <strerror>".
DiscoveryError HostError(std::string_view operation, const absl::Status& status) {
  return {std::string(operation), ErrnoOf(status),
          absl::StrCat(operation == "list" ? "listing " : "reading ", status.message())};
}

struct UverbsListing {
  std::map<std::string, UverbsEntry> by_ibdev;  // ibdev name -> its uverbs char device
  // False when a host error hid entries: an ibdev without one is unknown
  // then, not without a uverbs device.
  bool complete = true;
};

// From class/infiniband_verbs/*/ibdev; adds the host errors to `errors`.
UverbsListing ListUverbs(const fs::path& sysfs, std::vector<DiscoveryError>& errors) {
  UverbsListing out;
  fs::path dir = sysfs / "class/infiniband_verbs";
  auto names = ListDirectory(dir);
  if (!names.ok()) {
    // No such directory: no uverbs device at all, a fact. Anything else
    // hides whatever is there.
    if (ErrnoOf(names.status()) != ENOENT) {
      out.complete = false;
      errors.push_back(HostError("list", names.status()));
    }
    return out;
  }
  for (const std::string& name : *names) {
    if (!name.starts_with("uverbs")) continue;
    auto ibdev = ReadAttribute(dir / name / "ibdev");
    if (!ibdev.ok()) {
      if (IsHostResourceError(ErrnoOf(ibdev.status()))) {
        out.complete = false;
        errors.push_back(HostError("read", ibdev.status()));
      }
      continue;  // else reported as "no uverbs device" for that ibdev
    }
    const fs::path dev_path = dir / name / "dev";
    auto dev_text = ReadAttribute(dev_path);
    absl::StatusOr<std::pair<uint32_t, uint32_t>> numbers =
        dev_text.ok() ? ParseDevNumbers(*dev_text) : dev_text.status();
    if (dev_text.ok() && !numbers.ok()) {
      numbers = absl::InvalidArgumentError(
          absl::StrCat(dev_path.string(), ": ", numbers.status().message()));
    }
    out.by_ibdev.emplace(*ibdev, UverbsEntry{name, std::move(numbers)});
  }
  return out;
}

// "pci0000:44" from ".../devices/pci0000:44/0000:44:01.0/...".
std::string RootComplexOf(const fs::path& pci_dir) {
  for (const auto& part : pci_dir) {
    std::string s = part.string();
    if (s.starts_with("pci") && s.size() > 3) return s;
  }
  return "";
}

// Why a present device cannot be used, or "" when it can; an error when a
// host error (IsHostResourceError) left that unknown.
absl::StatusOr<std::string> HealthProblem(const EfaDevice& dev, const fs::path& class_dir) {
  struct stat st;
  if (::stat(dev.uverbs_path.c_str(), &st) != 0) {
    absl::Status error = PathError(dev.uverbs_path, errno);
    if (IsHostResourceError(errno)) return error;
    return std::string(error.message());
  }
  // Only the character device reaches the driver: a container given a
  // regular file or a directory there gets no EFA.
  if (!S_ISCHR(st.st_mode)) {
    return absl::StrCat(dev.uverbs_path, ": not a character device (",
                        S_ISREG(st.st_mode)    ? "a regular file"
                        : S_ISDIR(st.st_mode)  ? "a directory"
                        : S_ISBLK(st.st_mode)  ? "a block device"
                        : S_ISSOCK(st.st_mode) ? "a socket"
                        : S_ISFIFO(st.st_mode) ? "a FIFO"
                                               : "another kind of file",
                        ")");
  }
  if (major(st.st_rdev) != dev.major || minor(st.st_rdev) != dev.minor) {
    return absl::StrFormat("%s: device %u:%u, but sysfs says %u:%u", dev.uverbs_path,
                           major(st.st_rdev), minor(st.st_rdev), dev.major, dev.minor);
  }
  fs::path driver_link = class_dir / "device/driver";
  auto driver = ResolvePath(driver_link);
  if (!driver.ok()) {
    if (IsHostResourceError(ErrnoOf(driver.status()))) return driver.status();
    // No link or a dangling one: unbound. Anything else (a loop) is named.
    if (absl::IsNotFound(driver.status())) {
      return absl::StrCat(driver_link.string(), ": no driver bound");
    }
    return std::string(driver.status().message());
  }
  if (driver->filename() != "efa") {
    return absl::StrCat(driver_link.string(), ": bound to ", driver->filename().string(),
                        ", not efa");
  }
  return "";
}

// ENA's device IDs (the ena driver's ena_pci_id_tbl.h: 0x0ec2, 0x1ec2,
// 0xec20, 0xec21, and their likely successors 0xNec2 and 0xec2N) and
// Mellanox/NVIDIA networking (vendor 0x15b3, the mlx5 devices).
bool IsEnaOrMellanox(uint64_t vendor, uint64_t device) {
  if (vendor == 0x15b3) return true;
  return vendor == kAmazonVendorId && ((device & 0x0fff) == 0x0ec2 || (device & 0xfff0) == 0xec20);
}

// Whether the device's PCI function is bound to the efa driver; false when
// unbound or bound to another; an error only for a host error
// (IsHostResourceError).
absl::StatusOr<bool> BoundToEfa(const fs::path& class_dir) {
  auto driver = ResolvePath(class_dir / "device/driver");
  if (!driver.ok()) {
    if (IsHostResourceError(ErrnoOf(driver.status()))) return driver.status();
    return false;
  }
  return driver->filename() == "efa";
}

void SortDevices(std::vector<EfaDevice>& devices) {
  std::sort(devices.begin(), devices.end(), [](const EfaDevice& a, const EfaDevice& b) {
    return std::tie(a.pci, a.ibdev) < std::tie(b.pci, b.ibdev);
  });
}

// The efa generation of the PCI function vendor:device behind
// `class_dir` (0: newer than any this build knows), or NotFound when it is
// not an EFA; any other error is a host error (IsHostResourceError).
absl::StatusOr<int> GenerationOf(const fs::path& class_dir, uint32_t vendor, uint32_t device) {
  const bool in_range = vendor <= 0xffff && device <= 0xffff;
  if (in_range) {
    if (auto generation =
            EfaGeneration(static_cast<uint16_t>(vendor), static_cast<uint16_t>(device))) {
      return *generation;
    }
  }
  // A function the efa driver took is an EFA whatever its ID: a
  // generation newer than this table (bound through the driver's own
  // ID list) must not leave the node with zero EFAs. An ENA or a
  // ConnectX never is, whatever a (forced) binding says.
  if (IsEnaOrMellanox(vendor, device)) {
    return absl::NotFoundError(
        absl::StrFormat("PCI %04x:%04x is %s, not an EFA", vendor, device,
                        vendor == kAmazonVendorId ? "an ENA" : "a Mellanox device"));
  }
  absl::StatusOr<bool> bound = in_range ? BoundToEfa(class_dir) : absl::StatusOr<bool>(false);
  if (!bound.ok()) return bound.status();
  if (!*bound) {
    return absl::NotFoundError(absl::StrFormat(
        "PCI %04x:%04x is not an EFA (neither 1d0f:efa0-efaf nor bound to the efa driver)", vendor,
        device));
  }
  return 0;  // unknown: newer than any this build knows
}

// device/numa_node under `class_dir`: -1 (none) or a node number.
absl::StatusOr<int64_t> NumaNodeOf(const fs::path& class_dir) {
  const fs::path path = class_dir / "device/numa_node";
  auto numa = ReadIntAttribute(path);
  if (!numa.ok()) return numa.status();
  if (*numa < -1 || *numa > 1023) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.string(), ": expected -1 or a NUMA node number, got ", *numa));
  }
  return *numa;
}

// Adds class/infiniband/<ibdev> to `inv`: to its devices when it is an
// EFA (healthy or not), else to skipped (with why) or unknown.
void AddDevice(Inventory& inv, const HostRoots& roots, const UverbsListing& uverbs,
               const std::string& ibdev) {
  const fs::path class_dir = roots.sysfs / "class/infiniband" / ibdev;
  // A device's file that cannot be read for a host reason leaves the
  // device unknown; any other failure is the device's sysfs, named.
  auto skip = [&](const absl::Status& why, bool malformed = true) {
    if (IsHostResourceError(ErrnoOf(why))) {
      inv.unknown.push_back(ibdev);
      inv.errors.push_back(HostError("read", why));
      return;
    }
    inv.skipped.push_back({ibdev, std::string(why.message()), malformed});
  };
  auto pci_dir = ResolvePath(class_dir / "device");
  if (!pci_dir.ok()) return skip(pci_dir.status());
  auto vendor = ReadHexAttribute(class_dir / "device/vendor");
  if (!vendor.ok()) return skip(vendor.status());
  auto device = ReadHexAttribute(class_dir / "device/device");
  if (!device.ok()) return skip(device.status());
  auto generation = GenerationOf(class_dir, *vendor, *device);
  if (!generation.ok()) return skip(generation.status(), /*malformed=*/false);
  auto pci = PciAddress::Parse(pci_dir->filename().string());
  if (!pci) {
    return skip(absl::InvalidArgumentError(absl::StrCat((class_dir / "device").string(),
                                                        ": links to ", pci_dir->string(),
                                                        ", which is not a PCI function")));
  }
  auto numa = NumaNodeOf(class_dir);
  if (!numa.ok()) return skip(numa.status());
  auto uv = uverbs.by_ibdev.find(ibdev);
  if (uv == uverbs.by_ibdev.end() && !uverbs.complete) {
    inv.unknown.push_back(ibdev);  // its error is listed once, by ListUverbs
    return;
  }
  if (uv == uverbs.by_ibdev.end()) {
    return skip(absl::NotFoundError(absl::StrCat((roots.sysfs / "class/infiniband_verbs").string(),
                                                 ": no uverbs device names ", ibdev)));
  }
  if (!uv->second.numbers.ok()) return skip(uv->second.numbers.status());

  EfaDevice dev;
  dev.ibdev = ibdev;
  dev.uverbs = uv->second.name;
  dev.uverbs_path = (roots.dev / "infiniband" / uv->second.name).string();
  dev.major = uv->second.numbers->first;
  dev.minor = uv->second.numbers->second;
  dev.pci = *pci;
  dev.device_id = static_cast<uint16_t>(*device);
  dev.generation = *generation;
  if (*numa >= 0) dev.numa_node = static_cast<int>(*numa);
  auto node_guid = ReadAttribute(class_dir / "node_guid");
  if (!node_guid.ok() && IsHostResourceError(ErrnoOf(node_guid.status()))) {
    return skip(node_guid.status());
  }
  dev.node_guid = node_guid.value_or("");
  dev.root_complex = RootComplexOf(*pci_dir);
  auto problem = HealthProblem(dev, class_dir);
  if (!problem.ok()) return skip(problem.status());
  dev.health_problem = *std::move(problem);
  inv.devices.push_back(std::move(dev));
}

}  // namespace

Inventory DiscoverEfaDevices(const HostRoots& roots) {
  Inventory inv;
  const fs::path class_root = roots.sysfs / "class/infiniband";
  auto names = ListDirectory(class_root);
  if (!names.ok()) {
    // No RDMA subsystem at all (ENOENT) is the normal state of a node
    // without EFA. Any other failure (out of descriptors, a loop) hides
    // what is there: an incomplete answer, never "no EFA".
    if (ErrnoOf(names.status()) != ENOENT) {
      inv.listed = false;
      inv.errors.push_back(HostError("list", names.status()));
    }
    return inv;
  }
  const UverbsListing uverbs = ListUverbs(roots.sysfs, inv.errors);
  for (const std::string& ibdev : *names) AddDevice(inv, roots, uverbs, ibdev);
  SortDevices(inv.devices);
  return inv;
}

Inventory KeepLastKnown(Inventory now, const Inventory& before) {
  if (now.complete()) return now;
  std::set<PciAddress> seen;
  for (const EfaDevice& d : now.devices) seen.insert(d.pci);
  std::set<std::string> skipped;
  for (const SkippedDevice& s : now.skipped) skipped.insert(s.ibdev);
  for (const EfaDevice& d : before.devices) {
    if (!seen.count(d.pci) && !skipped.count(d.ibdev)) now.devices.push_back(d);
  }
  SortDevices(now.devices);
  return now;
}

std::string DiscoveryFingerprint(const HostRoots& roots) {
  std::string out;
  auto link = [&out](const fs::path& path) {
    char target[4096];
    const ssize_t n = ::readlink(path.c_str(), target, sizeof target);
    if (n >= 0) {
      out.append(target, static_cast<size_t>(n));
    } else {
      absl::StrAppend(&out, "!", errno);
    }
    out += '\n';
  };
  auto attribute = [&out](const fs::path& path) {
    auto text = ReadAttribute(path);
    absl::StrAppend(&out, text.ok() ? *text : "!", "\n");
  };
  const fs::path class_root = roots.sysfs / "class/infiniband";
  for (const std::string& ibdev : ListDirectory(class_root).value_or(std::vector<std::string>{})) {
    absl::StrAppend(&out, ibdev, "\n");
    link(class_root / ibdev);
    link(class_root / ibdev / "device/driver");
  }
  const fs::path verbs_root = roots.sysfs / "class/infiniband_verbs";
  for (const std::string& uverbs : ListDirectory(verbs_root).value_or(std::vector<std::string>{})) {
    absl::StrAppend(&out, uverbs, "\n");
    attribute(verbs_root / uverbs / "ibdev");
    attribute(verbs_root / uverbs / "dev");
    struct stat st;
    const fs::path node = roots.dev / "infiniband" / uverbs;
    if (::stat(node.c_str(), &st) == 0) {
      absl::StrAppend(&out, st.st_mode, " ", st.st_rdev, "\n");
    } else {
      absl::StrAppend(&out, "!", errno, "\n");
    }
  }
  return out;
}

std::vector<fs::path> DiscoveryDirs(const HostRoots& roots) {
  return {roots.dev / "infiniband", roots.sysfs / "class/infiniband",
          roots.sysfs / "class/infiniband_verbs"};
}

}  // namespace efa::topology
