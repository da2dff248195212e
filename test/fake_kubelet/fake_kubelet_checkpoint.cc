// FakeKubelet, the device manager's checkpoint: <dir>/kubelet_internal_checkpoint
// written as the kubelet writes it and read back at Start and Restart.
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "test/fake_kubelet/fake_kubelet.h"

namespace efa::testing {

namespace fs = std::filesystem;

namespace {

// Every ID of an entry's NUMA groups, once each, in NUMA then group order.
std::vector<std::string> Flatten(const std::map<int64_t, std::vector<std::string>>& by_numa) {
  std::vector<std::string> ids;
  std::set<std::string> seen;
  for (const auto& [numa, group] : by_numa) {
    for (const auto& id : group) {
      if (seen.insert(id).second) ids.push_back(id);
    }
  }
  return ids;
}

// 32-bit FNV-1a. The kubelet's checksum hashes Go's in-memory dump of the
// data, which cannot be reproduced here; this one stands in for it and is
// never verified (a real kubelet would refuse this file for that reason).
uint32_t Fnv1a32(const std::string& bytes) {
  uint32_t hash = 2166136261u;
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 16777619u;
  }
  return hash;
}

}  // namespace

void FakeKubelet::AddCheckpointEntryForTest(const std::string& entry_json) {
  absl::MutexLock lock(&mu_);
  extra_entries_.push_back(entry_json);
}

absl::Status FakeKubelet::WriteCheckpointLocked() {
  using Json = nlohmann::ordered_json;
  // Field order and null-for-empty as Go's encoding/json writes the
  // kubelet's structs (a nil PodDeviceEntries slice is null).
  Json entries = entries_.empty() && extra_entries_.empty() ? Json(nullptr) : Json::array();
  for (const DeviceEntry& entry : entries_) {
    Json ids = Json::object();
    for (const auto& [numa, group] : entry.ids_by_numa) ids[std::to_string(numa)] = group;
    entries.push_back(Json{{"PodUID", entry.pod_uid},
                           {"ContainerName", entry.container},
                           {"ResourceName", entry.resource},
                           {"DeviceIDs", std::move(ids)},
                           {"AllocResp", absl::Base64Escape(entry.response.SerializeAsString())}});
  }
  for (const std::string& extra : extra_entries_) entries.push_back(Json::parse(extra));
  // The kubelet's healthyDevices: emptied while a plugin's stream is down.
  Json registered = Json::object();
  for (const auto& [name, resource] : resources_) {
    // GetCapacity deleted its healthyDevices with the endpoint.
    if (EndpointRemovedLocked(resource)) continue;
    Json ids = Json::array();
    if (resource.streaming) {
      for (const auto& device : resource.devices) {
        if (device.health() == "Healthy") ids.push_back(device.id());
      }
    }
    registered[name] = std::move(ids);
  }
  Json data =
      Json{{"PodDeviceEntries", std::move(entries)}, {"RegisteredDevices", std::move(registered)}};
  const uint32_t checksum = Fnv1a32(data.dump());
  const std::string text = Json{{"Data", std::move(data)}, {"Checksum", checksum}}.dump();

  const fs::path path = checkpoint_path();
  const fs::path temporary = dir_ / absl::StrCat(".", kCheckpointName, ".tmp");
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) {
      return absl::InternalError(
          absl::StrCat("failed to write checkpoint file ", temporary.string(), ": cannot write"));
    }
  }
  std::error_code ec;
  fs::rename(temporary, path, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("failed to write checkpoint file ", path.string(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

void FakeKubelet::LoadCheckpointLocked() {
  entries_.clear();
  const fs::path path = checkpoint_path();
  std::error_code ec;
  if (!fs::exists(path, ec)) return;
  auto complain = [&](const std::string& why) {
    std::fprintf(stderr, "fake-kubelet: %s: %s; starting without its allocations\n",
                 path.string().c_str(), why.c_str());
  };
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json doc = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("Data") ||
      !doc.at("Data").is_object()) {
    complain("not a device manager checkpoint");
    return;
  }
  const nlohmann::json& data = doc.at("Data");
  auto list = data.find("PodDeviceEntries");
  if (list == data.end() || list->is_null()) return;
  if (!list->is_array()) {
    complain("Data.PodDeviceEntries is not a list");
    return;
  }
  for (const auto& item : *list) {
    // Like the kubelet's fromCheckpointData, an entry that does not parse is
    // skipped, the others are kept.
    if (!item.is_object()) continue;
    DeviceEntry entry;
    try {
      entry.pod_uid = item.at("PodUID").get<std::string>();
      entry.container = item.at("ContainerName").get<std::string>();
      entry.resource = item.at("ResourceName").get<std::string>();
      for (const auto& [key, group] : item.at("DeviceIDs").items()) {
        entry.ids_by_numa[std::stoll(key)] = group.get<std::vector<std::string>>();
      }
      std::string bytes;
      const auto& encoded = item.at("AllocResp");
      if (!encoded.is_null() && (!absl::Base64Unescape(encoded.get<std::string>(), &bytes) ||
                                 !entry.response.ParseFromString(bytes))) {
        continue;
      }
    } catch (const std::exception&) {
      continue;
    }
    entry.ids = Flatten(entry.ids_by_numa);
    entries_.push_back(std::move(entry));
  }
}
}  // namespace efa::testing
