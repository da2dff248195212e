#include "topology/nvidia_gpus.h"

#include <algorithm>
#include <charconv>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "topology/sysfs.h"

namespace efa::topology {
namespace {

std::string_view Trim(std::string_view t) {
  while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.remove_prefix(1);
  while (!t.empty() && (t.back() == ' ' || t.back() == '\t' || t.back() == '\r')) {
    t.remove_suffix(1);
  }
  return t;
}

}  // namespace

absl::StatusOr<NvidiaGpu> ParseNvidiaGpuInformation(std::string_view text,
                                                    std::string_view source) {
  std::optional<std::string> uuid;
  std::optional<std::string> bus;
  while (!text.empty()) {
    size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string_view key = Trim(line.substr(0, colon));
    std::string_view value = Trim(line.substr(colon + 1));
    if (key == "GPU UUID") uuid = std::string(value);
    if (key == "Bus Location") bus = std::string(value);
  }
  if (!uuid || uuid->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(source), ": no \"GPU UUID:\" line"));
  }
  // The driver writes "GPU-" and hex groups, or "??" while it cannot read
  // the UUID. Anything else could not be told from the device plugin's
  // other ID forms ("<ID>::<replica>", "MIG-GPU-...", "<i>:<j>").
  if (constexpr std::string_view kPrefix = "GPU-";
      !uuid->starts_with(kPrefix) ||
      !std::all_of(uuid->begin() + kPrefix.size(), uuid->end(),
                   [](char c) { return absl::ascii_isxdigit(c) || c == '-'; })) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(source), ": GPU UUID \"",
                                                   uuid->substr(0, 48), "\" is not \"GPU-<hex>\""));
  }
  if (!bus)
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(source), ": no \"Bus Location:\" line"));
  auto pci = PciAddress::Parse(*bus);
  if (!pci) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(source), ": Bus Location \"",
                                                   bus->substr(0, 32), "\" is not a PCI address"));
  }
  return NvidiaGpu{*uuid, *pci};
}

std::vector<NvidiaGpu> ReadNvidiaGpus(const std::filesystem::path& proc_root,
                                      std::vector<std::string>* errors) {
  std::vector<NvidiaGpu> gpus;
  const std::filesystem::path dir = proc_root / "driver/nvidia/gpus";
  auto names = ListDirectory(dir);
  if (!names.ok()) return gpus;
  for (const std::string& name : *names) {
    const std::filesystem::path file = dir / name / "information";
    auto text = ReadAttribute(file);
    absl::StatusOr<NvidiaGpu> gpu =
        text.ok() ? ParseNvidiaGpuInformation(*text, file.string()) : text.status();
    if (gpu.ok()) {
      gpus.push_back(std::move(*gpu));
    } else if (errors != nullptr) {
      errors->emplace_back(gpu.status().message());
    }
  }
  std::sort(gpus.begin(), gpus.end(), [](const auto& a, const auto& b) { return a.pci < b.pci; });
  return gpus;
}

std::optional<PciAddress> NvidiaDeviceAddress(const std::vector<NvidiaGpu>& gpus,
                                              std::string_view id) {
  // The NVIDIA device plugin's device IDs (NVIDIA/k8s-device-plugin):
  //  - time-slicing and MPS replicas are "<ID>::<replica>"
  //    (internal/rm/devices.go, NewAnnotatedID: fmt.Sprintf("%s::%d", id,
  //    replica)): the replica is on <ID>'s GPU;
  //  - --device-id-strategy=index: a GPU is "<i>", a MIG device
  //    "<i>:<j>", <i> being its parent GPU's index (internal/rm/
  //    nvml_devices.go, newGPUDevice and newMigDevice: fmt.Sprintf("%v:%v",
  //    i, j));
  //  - --device-id-strategy=uuid (the default): a GPU's UUID, a MIG
  //    device's NVML UUID. Drivers before R470 name MIG devices
  //    "MIG-GPU-<parent GPU UUID>/<GI>/<CI>", which names the parent; later
  //    ones "MIG-<UUID>", which does not, and nothing under /proc maps it to
  //    its parent (only NVML does): such an ID stays unresolved.
  if (size_t replica = id.find("::"); replica != std::string_view::npos) {
    id = id.substr(0, replica);
  }
  std::string_view uuid = id;
  if (constexpr std::string_view kLegacyMig = "MIG-GPU-";
      id.substr(0, kLegacyMig.size()) == kLegacyMig) {
    uuid = id.substr(4, id.find('/') - 4);  // "GPU-<parent UUID>"
  }
  for (const NvidiaGpu& g : gpus) {
    if (g.uuid == uuid) return g.pci;
  }
  // "<i>" or "<i>:<j>", decimal.
  auto digits = [](std::string_view text) {
    return !text.empty() &&
           std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  const size_t colon = id.find(':');
  const std::string_view gpu_index = id.substr(0, colon);
  if (colon != std::string_view::npos && !digits(id.substr(colon + 1))) return std::nullopt;
  size_t index = 0;
  auto [end, ec] = std::from_chars(gpu_index.data(), gpu_index.data() + gpu_index.size(), index);
  if (digits(gpu_index) && ec == std::errc() && end == gpu_index.data() + gpu_index.size() &&
      index < gpus.size()) {
    return gpus[index].pci;
  }
  return std::nullopt;
}

}  // namespace efa::topology
