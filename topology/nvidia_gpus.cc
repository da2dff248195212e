#include "topology/nvidia_gpus.h"

#include <algorithm>
#include <charconv>

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
  for (const NvidiaGpu& g : gpus) {
    if (g.uuid == id) return g.pci;
  }
  size_t index = 0;
  auto [end, ec] = std::from_chars(id.data(), id.data() + id.size(), index);
  if (!id.empty() && ec == std::errc() && end == id.data() + id.size() && index < gpus.size()) {
    return gpus[index].pci;
  }
  return std::nullopt;
}

}  // namespace efa::topology
