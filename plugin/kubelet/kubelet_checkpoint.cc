#include "plugin/kubelet/kubelet_checkpoint.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "topology/sysfs.h"

namespace efa::plugin {
namespace {

using Json = nlohmann::json;

constexpr size_t kMaxCheckpointBytes = size_t{64} << 20;

// nlohmann's parse errors read "[json.exception.parse_error.101] parse error
// at line 1, column 43: <detail>"; keep the detail, the position is ours.
absl::Status JsonSyntaxError(const std::string& source, std::string_view json,
                             const nlohmann::json::parse_error& e) {
  const std::string what = e.what();
  std::string detail = what;
  if (size_t column = what.find("column "); column != std::string::npos) {
    if (size_t colon = what.find(": ", column); colon != std::string::npos) {
      detail = what.substr(colon + 2);
    }
  }
  // e.byte is the 1-based index of the last character read (size + 1 at the
  // end of the input).
  const size_t consumed = std::min<size_t>(e.byte > 0 ? e.byte - 1 : 0, json.size());
  const std::string_view before = json.substr(0, consumed);
  const size_t line = 1 + static_cast<size_t>(std::count(before.begin(), before.end(), '\n'));
  const size_t last_newline = before.rfind('\n');
  const size_t column =
      last_newline == std::string_view::npos ? e.byte : e.byte - (last_newline + 1);
  // Also a string or literal cut off at the end of the input (nlohmann says
  // "missing closing quote" there).
  const bool truncated =
      absl::StrContains(detail, "unexpected end of input") || e.byte > json.size();
  // The detail quotes the input ("last read: '...'"): show its control
  // characters and broken UTF-8 as \xNN.
  std::string shown;
  for (char c : detail) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) {
      absl::StrAppend(&shown, "\\x", absl::Hex(u, absl::kZeroPad2));
    } else {
      shown += c;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      source, ":", line, ":", column, ": ", truncated ? "truncated" : "invalid", " JSON: ", shown));
}

absl::Status TypeError(const std::string& source, const std::string& where, const char* want,
                       const Json& got) {
  return absl::InvalidArgumentError(
      absl::StrCat(source, ": ", where, ": expected ", want, ", got ", got.type_name()));
}

// A string member of `object`; absent or null is empty (Go writes every
// field, but a hand-edited file need not).
absl::Status GetString(const std::string& source, const Json& object, const char* key,
                       const std::string& where, std::string* out) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_string()) return TypeError(source, absl::StrCat(where, ".", key), "a string", *it);
  *out = it->get<std::string>();
  return absl::OkStatus();
}

absl::Status GetStringList(const std::string& source, const Json& list, const std::string& where,
                           std::vector<std::string>* out) {
  if (list.is_null()) return absl::OkStatus();
  if (!list.is_array()) return TypeError(source, where, "a list of strings", list);
  out->reserve(out->size() + list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].is_string()) {
      return TypeError(source, absl::StrCat(where, "[", i, "]"), "a string", list[i]);
    }
    out->push_back(list[i].get<std::string>());
  }
  return absl::OkStatus();
}

// "Data.PodDeviceEntries[3] (pod <uid>, container "<name>", <resource>)".
std::string DescribeEntry(size_t index, const CheckpointEntry& entry) {
  return absl::StrCat("Data.PodDeviceEntries[", index, "] (pod ", absl::CHexEscape(entry.pod_uid),
                      ", container \"", absl::CHexEscape(entry.container_name), "\", ",
                      absl::CHexEscape(entry.resource_name), ")");
}

absl::Status ParseEntry(const std::string& source, const Json& json, size_t index,
                        CheckpointEntry* entry) {
  const std::string where = absl::StrCat("Data.PodDeviceEntries[", index, "]");
  if (!json.is_object()) return TypeError(source, where, "an object", json);
  if (auto s = GetString(source, json, "PodUID", where, &entry->pod_uid); !s.ok()) return s;
  if (auto s = GetString(source, json, "ContainerName", where, &entry->container_name); !s.ok()) {
    return s;
  }
  if (auto s = GetString(source, json, "ResourceName", where, &entry->resource_name); !s.ok()) {
    return s;
  }
  if (auto ids = json.find("DeviceIDs"); ids != json.end()) {
    const std::string ids_where = absl::StrCat(where, ".DeviceIDs");
    if (ids->is_object()) {
      for (const auto& [key, list] : ids->items()) {
        int64_t numa;
        if (!absl::SimpleAtoi(key, &numa)) {
          return absl::InvalidArgumentError(absl::StrCat(source, ": ", ids_where, ": NUMA node \"",
                                                         absl::CHexEscape(key),
                                                         "\" is not an integer"));
        }
        std::vector<std::string>& numa_ids = entry->device_ids_by_numa[numa];
        if (auto s =
                GetStringList(source, list, absl::StrCat(ids_where, "[\"", key, "\"]"), &numa_ids);
            !s.ok()) {
          return s;
        }
      }
      for (const auto& [numa, numa_ids] : entry->device_ids_by_numa) {
        entry->device_ids.insert(entry->device_ids.end(), numa_ids.begin(), numa_ids.end());
      }
    } else if (ids->is_array() || ids->is_null()) {
      if (auto s = GetStringList(source, *ids, ids_where, &entry->device_ids); !s.ok()) return s;
    } else {
      return TypeError(source, ids_where, "an object or a list", *ids);
    }
  }
  std::string encoded;
  if (auto s = GetString(source, json, "AllocResp", where, &encoded); !s.ok()) return s;
  if (encoded.empty()) return absl::OkStatus();
  std::string bytes;
  if (!absl::Base64Unescape(encoded, &bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", DescribeEntry(index, *entry),
                                                   ": AllocResp is not valid base64"));
  }
  if (!entry->alloc_resp.ParseFromString(bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", DescribeEntry(index, *entry),
                     ": AllocResp is not a serialized v1beta1.ContainerAllocateResponse"));
  }
  return absl::OkStatus();
}

absl::StatusOr<KubeletCheckpoint> ParseDocument(const std::string& source, const Json& doc) {
  if (!doc.is_object()) return TypeError(source, "the checkpoint", "an object", doc);
  auto data = doc.find("Data");
  if (data == doc.end()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": Data: missing"));
  }
  if (!data->is_object()) return TypeError(source, "Data", "an object", *data);
  KubeletCheckpoint checkpoint;
  if (auto entries = data->find("PodDeviceEntries");
      entries != data->end() && !entries->is_null()) {
    if (!entries->is_array()) {
      return TypeError(source, "Data.PodDeviceEntries", "a list", *entries);
    }
    // One entry the kubelet (or a hand edit, or a newer kubelet's format)
    // got wrong must not hide all the others: it is skipped, and named.
    for (size_t i = 0; i < entries->size(); ++i) {
      CheckpointEntry entry;
      if (auto s = ParseEntry(source, (*entries)[i], i, &entry); !s.ok()) {
        checkpoint.skipped.emplace_back(s.message());
        const Json& e = (*entries)[i];
        auto resource = e.is_object() ? e.find("ResourceName") : e.end();
        checkpoint.skipped_entry_resources.push_back(
            resource != e.end() && resource->is_string() ? resource->get<std::string>() : "");
        continue;
      }
      checkpoint.entries.push_back(std::move(entry));
    }
  }
  if (auto registered = data->find("RegisteredDevices");
      registered != data->end() && !registered->is_null()) {
    if (!registered->is_object()) {
      return TypeError(source, "Data.RegisteredDevices", "an object", *registered);
    }
    for (const auto& [resource, list] : registered->items()) {
      std::vector<std::string> ids;
      if (auto s = GetStringList(source, list,
                                 absl::StrCat("Data.RegisteredDevices[\"", resource, "\"]"), &ids);
          !s.ok()) {
        checkpoint.skipped.emplace_back(s.message());
        continue;
      }
      checkpoint.registered_devices[resource] = std::move(ids);
    }
  }
  return checkpoint;
}

}  // namespace

absl::StatusOr<KubeletCheckpoint> ParseCheckpoint(std::string_view json,
                                                  const std::string& source) {
  Json doc;
  try {
    doc = Json::parse(json.begin(), json.end());
  } catch (const nlohmann::json::parse_error& e) {
    return JsonSyntaxError(source, json, e);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": invalid JSON: ", e.what()));
  }
  return ParseDocument(source, doc);
}

absl::StatusOr<KubeletCheckpoint> ReadCheckpoint(const std::filesystem::path& path) {
  absl::StatusOr<std::string> bytes = topology::ReadFileBounded(path, kMaxCheckpointBytes);
  if (!bytes.ok()) return bytes.status();
  return ParseCheckpoint(*bytes, path.string());
}

}  // namespace efa::plugin
