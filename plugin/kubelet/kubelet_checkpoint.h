// The kubelet's device-manager checkpoint,
// <kubelet-dir>/device-plugins/kubelet_internal_checkpoint: which container
// got which devices of which resource, and the Allocate answer each got.
//
// The file is JSON written by the kubelet (Go encoding/json):
//   {"Data":{"PodDeviceEntries":[{"PodUID":"..","ContainerName":"..",
//     "ResourceName":"..","DeviceIDs":{"0":["id",..]},"AllocResp":"<base64>"}],
//     "RegisteredDevices":{"<resource>":["id",..]}},"Checksum":N}
// DeviceIDs maps NUMA node -> IDs since kubelet 1.20 and is a plain list
// before; AllocResp is a serialized v1beta1.ContainerAllocateResponse (null
// when the plugin returned none). The Checksum is a hash of Go's in-memory
// dump of the data and cannot be recomputed here: it is not checked.
//
// Every resource is returned, not only one plugin's: the MOFED guard reads
// the NVIDIA entries, pod alignment reads the accelerators'. All functions
// are thread-safe (they share no state).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "deviceplugin/v1beta1/api.pb.h"

namespace efa::plugin {

// The checkpoint's file name inside <kubelet-dir>/device-plugins.
inline constexpr char kCheckpointFile[] = "kubelet_internal_checkpoint";

// One container's devices of one resource.
struct CheckpointEntry {
  std::string pod_uid;
  std::string container_name;
  std::string resource_name;
  // Every device ID of the entry: NUMA node by NUMA node (ascending) for the
  // map form, in file order for the plain list.
  std::vector<std::string> device_ids;
  // NUMA node -> device IDs, as kubelet 1.20+ writes them (-1 when the plugin
  // reported no topology); empty for the older plain list.
  std::map<int64_t, std::vector<std::string>> device_ids_by_numa;
  // The plugin's Allocate answer for this container (empty when null).
  v1beta1::ContainerAllocateResponse alloc_resp;
};

struct KubeletCheckpoint {
  std::vector<CheckpointEntry> entries;  // in file order, the parsable ones
  // Resource name -> the device IDs its plugin last advertised.
  std::map<std::string, std::vector<std::string>> registered_devices;
  // Why each entry of PodDeviceEntries or RegisteredDevices that could not
  // be parsed was skipped (messages as below). A skipped entry may be any
  // container's: readers must not take its absence as "not live".
  std::vector<std::string> skipped;
  // The ResourceName of each PodDeviceEntries entry skipped, "" when that
  // could not be read either: an entry of another resource is no claim of
  // this plugin's.
  std::vector<std::string> skipped_entry_resources;
};

// Parses the checkpoint's bytes. `source` names the file in messages. Pure:
// any bytes are safe to give it (it is a fuzzing entry point). Errors of the
// whole file are InvalidArgument and start with the source:
//   "<source>:1:43: truncated JSON: syntax error while parsing object -
//    unexpected end of input; expected '}'"
//   "<source>:3:7: invalid JSON: ..."
//   "<source>: Data: missing"
// An entry that cannot be parsed is skipped and its message kept in
// `skipped`, the others are returned:
//   "<source>: Data.PodDeviceEntries[1].ContainerName: expected a string, got number"
//   "<source>: Data.PodDeviceEntries[0] (pod 0c5f.., container \"train\",
//    nvidia.com/gpu): AllocResp is not valid base64"
//   "...: AllocResp is not a serialized v1beta1.ContainerAllocateResponse"
// An absent or null PodDeviceEntries or RegisteredDevices is empty.
absl::StatusOr<KubeletCheckpoint> ParseCheckpoint(std::string_view json, const std::string& source);

// Reads and parses the checkpoint file at `path` (at most 64 MiB). A missing
// file is NotFound ("<path>: No such file or directory"); other errors as
// ParseCheckpoint, with the path as the source.
absl::StatusOr<KubeletCheckpoint> ReadCheckpoint(const std::filesystem::path& path);

}  // namespace efa::plugin
