// The CDI specs late binding writes: one file per claim (one container's EFA
// allocation), <cdi-dir>/vpc.amazonaws.com-efa_<claim>.json, naming the one
// CDI device vpc.amazonaws.com/efa=<claim>:
//
//   {"cdiVersion":"0.5.0","kind":"vpc.amazonaws.com/efa","devices":[{
//     "name":"<claim>","containerEdits":{
//       "deviceNodes":[{"path":"/dev/infiniband/uverbsN",
//                       "hostPath":"<dev-root>/infiniband/uverbsN","permissions":"rw"},..],
//       "env":["EFA_DEVICES=<ibdev>,..","EFA_PCI_ADDRESSES=<bdf>,.."]}}]}
//
// CDI 0.5.0 (the first with hostPath; containerd 1.7 reads it) has no room
// for annotations, and runtimes parse specs strictly: the file holds nothing
// else. The bound EFAs are read back from EFA_DEVICES.
//
// Everything here is pure except WriteFileAtomically. Thread-safe.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "plugin/kubelet/resource_name.h"
#include "topology/efa_device.h"

namespace efa::plugin {

inline constexpr const char* kCdiKind = kResourceName;
inline constexpr char kCdiVersion[] = "0.5.0";
// Environment variables a container is given (by Allocate, or by its CDI
// spec): the allocated devices' ibdev names and PCI addresses,
// comma-separated, in PCI order.
inline constexpr char kEnvDevices[] = "EFA_DEVICES";
inline constexpr char kEnvPciAddresses[] = "EFA_PCI_ADDRESSES";
// Given by Allocate with device nodes: how many containers may share each of
// them (sharing's replicas then; 1 is exclusive). The kubelet keeps the
// answer in its checkpoint for the container's life: what a later
// configuration must not exceed for these EFAs.
inline constexpr char kEnvSharingReplicas[] = "EFA_SHARING_REPLICAS";
// Spec files are <prefix><claim><suffix>.
inline constexpr char kCdiSpecPrefix[] = "vpc.amazonaws.com-efa_";
inline constexpr char kCdiSpecSuffix[] = ".json";
// Runtimes inject the CDI devices named in a container annotation whose key
// starts with this (the CDI library's AnnotationPrefix).
inline constexpr char kCdiAnnotationPrefix[] = "cdi.k8s.io/";

// The claim of a container's EFA allocation: "claim-" and 16 hex digits of
// a 64-bit FNV-1a hash of the sorted device IDs the kubelet gave it under
// `resource`, and of `resource` when it is not vpc.amazonaws.com/efa. The
// kubelet's live allocations of one resource are disjoint, so the ID set
// names one allocation; but it counts each resource's IDs apart and gives
// the same strings ("rdmap79s0::0") under both EFA names after sharing's
// rename: the name keeps those claims (and their CDI devices) apart.
// Independent of the IDs' order; stable across versions (it names files
// that outlive the process): claims of vpc.amazonaws.com/efa are named as
// they always were.
std::string ClaimName(std::vector<std::string> kubelet_ids,
                      std::string_view resource = kResourceName);

// "vpc.amazonaws.com/efa=<claim>", the CDI device the kubelet passes on.
std::string CdiDeviceName(const std::string& claim);

// "vpc.amazonaws.com-efa_<claim>.json".
std::string CdiSpecFileName(const std::string& claim);

// "cdi.k8s.io/vpc.amazonaws.com-efa_<claim>", the annotation naming the claim's
// CDI device. As the CDI library's AnnotationKey(plugin, id) makes them: a
// name unique per plugin and allocation (the kubelet keeps the first of two
// equal keys in one container), at most 63 characters, alphanumeric at both
// ends and [A-Za-z0-9_.-] between.
std::string CdiAnnotationKey(const std::string& claim);

// The claim a spec file name is for, or "" when it is not one of ours.
std::string ClaimOfSpecFile(const std::string& file_name);

// The spec binding `efas` (in the order given; the caller sorts them by PCI
// address) to `claim`, as text ending in a newline.
std::string CdiSpecJson(const std::string& claim, const std::vector<topology::EfaDevice>& efas);

// The EFA device IDs (EFA_DEVICES) a spec for `claim` binds. `source` names
// the file in messages, which start with it:
//   "<source>: invalid JSON: ..."
//   "<source>: kind: expected \"vpc.amazonaws.com/efa\", got \"x\""
//   "<source>: devices: expected one device named \"claim-..\""
//   "<source>: devices[0].containerEdits.env: no EFA_DEVICES"
// Any bytes are safe to give it.
absl::StatusOr<std::vector<std::string>> ParseCdiSpec(std::string_view json,
                                                      const std::string& claim,
                                                      const std::string& source);

// Beside each spec, <prefix><claim>.state, what recovering the claim after
// a restart, upgrade or downgrade needs and the spec has no room for (CDI
// readers read only *.json and *.yaml):
//
//   {"version":1,"claim":"claim-..","mode":"late-binding","owner":"<pod UID>",
//    "kubeletIds":["efa_0",..],"resource":"vpc.amazonaws.com/efa","replicas":1,
//    "efas":["rdmap16s27",..]}
//
// A later format raises "version" and keeps "claim" and "efas": a reader
// keeps a newer record's claim bound to its "efas" and reads none of its
// other fields.
inline constexpr char kClaimRecordSuffix[] = ".state";
inline constexpr int kClaimRecordVersion = 1;
struct ClaimRecord {
  int version = kClaimRecordVersion;
  std::string owner;  // the pod UID, "" when unknown
  std::vector<std::string> kubelet_ids;
  std::string resource;  // the EFA resource name the kubelet allocated
  int replicas = 1;      // sharing's replicas when bound: 1 is exclusive
  std::vector<std::string> efas;
};

// "vpc.amazonaws.com-efa_<claim>.state".
std::string ClaimRecordFileName(const std::string& claim);
// The record as text ending in a newline (version kClaimRecordVersion).
std::string ClaimRecordJson(const std::string& claim, const ClaimRecord& record);
// Parses a record for `claim`; messages start with `source`. A record of a
// newer version comes back with its version and EFAs only.
absl::StatusOr<ClaimRecord> ParseClaimRecord(std::string_view json, const std::string& claim,
                                             const std::string& source);

// Replaces `path` with `content` so that a reader sees the old file or the
// new one, never a part: a temporary file in the same directory (a name
// starting with '.' and ending in ".tmp", which CDI readers skip) written,
// given `mode`, fsynced and renamed over `path`, then the directory fsynced.
// On failure nothing is left behind and the message names the path that
// failed first: "/var/run/cdi: Permission denied".
absl::Status WriteFileAtomically(const std::filesystem::path& path, std::string_view content,
                                 mode_t mode);

}  // namespace efa::plugin
