// NVIDIA GPUs as the NVIDIA driver lists them under
// <proc-root>/driver/nvidia/gpus/<bdf>/information, so that the NVIDIA
// device plugin's device IDs (GPU UUIDs by default, indices with
// --device-id-strategy=index) can be turned into PCI addresses.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "topology/pci_address.h"

namespace efa::topology {

struct NvidiaGpu {
  std::string uuid;  // "GPU-6b7a9c0e-..."
  PciAddress pci;
};

// Parses one `information` file ("Model: ...", "GPU UUID: GPU-...",
// "Bus Location: 0000:53:00.0", ...). Errors name `source` and the missing
// or malformed line; a UUID not of the driver's form "GPU-<hex and dashes>"
// ("??" while the driver cannot read it) is malformed. Pure.
absl::StatusOr<NvidiaGpu> ParseNvidiaGpuInformation(std::string_view text, std::string_view source);

// Every GPU under `proc_root`/driver/nvidia/gpus, in PCI order (the order of
// NVML's and the NVIDIA plugin's indices). A GPU whose file cannot be read
// or parsed is left out and described in `errors`. No driver: empty.
std::vector<NvidiaGpu> ReadNvidiaGpus(const std::filesystem::path& proc_root,
                                      std::vector<std::string>* errors);

// The PCI address of the GPU behind NVIDIA device-plugin device ID `id`: a
// GPU UUID or an index into `gpus` ("0".."N-1"), either with a time-slicing
// replica suffix ("GPU-...::3", "2::0"); a MIG device by its parent GPU
// ("<GPU index>:<MIG index>", "MIG-GPU-<parent UUID>/<GI>/<CI>"). A MIG
// UUID of R470+ drivers ("MIG-<UUID>") or anything else unknown gives
// nullopt (see the .cc for the formats and their sources).
std::optional<PciAddress> NvidiaDeviceAddress(const std::vector<NvidiaGpu>& gpus,
                                              std::string_view id);

}  // namespace efa::topology
