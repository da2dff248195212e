#include "plugin/alignment/cdi_spec.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace efa::plugin {
namespace fs = std::filesystem;
namespace {

absl::Status PosixError(const std::string& subject, int error) {
  return absl::Status(absl::ErrnoToStatusCode(error),
                      absl::StrCat(subject, ": ", std::strerror(error)));
}

// Closes `fd` and removes `temporary` unless released.
class TemporaryFile {
 public:
  TemporaryFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~TemporaryFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  // Closes the file; returns errno on failure (0 when fine).
  int Close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc == 0 ? 0 : errno;
  }
  void Keep() { path_.clear(); }

 private:
  int fd_;
  std::string path_;
};

}  // namespace

std::string ClaimName(std::vector<std::string> kubelet_ids, std::string_view resource) {
  std::sort(kubelet_ids.begin(), kubelet_ids.end());
  kubelet_ids.erase(std::unique(kubelet_ids.begin(), kubelet_ids.end()), kubelet_ids.end());
  uint64_t hash = 14695981039346656037ull;
  auto add = [&hash](unsigned char c) {
    hash ^= c;
    hash *= 1099511628211ull;
  };
  if (resource != kResourceName) {
    for (unsigned char c : resource) add(c);
    add(0);
  }
  for (const std::string& id : kubelet_ids) {
    for (unsigned char c : id) add(c);
    add(0);  // IDs cannot hold a NUL byte here: the separator keeps sets apart
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string name = "claim-";
  for (int shift = 60; shift >= 0; shift -= 4) name += kHex[(hash >> shift) & 0xf];
  return name;
}

std::string CdiDeviceName(const std::string& claim) { return absl::StrCat(kCdiKind, "=", claim); }

std::string CdiSpecFileName(const std::string& claim) {
  return absl::StrCat(kCdiSpecPrefix, claim, kCdiSpecSuffix);
}

std::string CdiAnnotationKey(const std::string& claim) {
  return absl::StrCat(kCdiAnnotationPrefix, kCdiSpecPrefix, claim);
}

std::string ClaimOfSpecFile(const std::string& file_name) {
  if (!absl::StartsWith(file_name, kCdiSpecPrefix) || !absl::EndsWith(file_name, kCdiSpecSuffix)) {
    return "";
  }
  const size_t prefix = std::strlen(kCdiSpecPrefix);
  const size_t suffix = std::strlen(kCdiSpecSuffix);
  if (file_name.size() <= prefix + suffix) return "";
  return file_name.substr(prefix, file_name.size() - prefix - suffix);
}

std::string CdiSpecJson(const std::string& claim, const std::vector<topology::EfaDevice>& efas) {
  using Json = nlohmann::ordered_json;
  Json nodes = Json::array();
  std::vector<std::string> names, addresses;
  for (const topology::EfaDevice& d : efas) {
    nodes.push_back(Json{{"path", "/dev/infiniband/" + d.uverbs},
                         {"hostPath", d.uverbs_path},
                         {"permissions", "rw"}});
    names.push_back(d.ibdev);
    addresses.push_back(d.pci.ToString());
  }
  Json env = Json::array({absl::StrCat(kEnvDevices, "=", absl::StrJoin(names, ",")),
                          absl::StrCat(kEnvPciAddresses, "=", absl::StrJoin(addresses, ","))});
  Json spec =
      Json{{"cdiVersion", kCdiVersion},
           {"kind", kCdiKind},
           {"devices", Json::array({Json{{"name", claim},
                                         {"containerEdits", Json{{"deviceNodes", std::move(nodes)},
                                                                 {"env", std::move(env)}}}}})}};
  return spec.dump() + "\n";
}

absl::StatusOr<std::vector<std::string>> ParseCdiSpec(std::string_view json,
                                                      const std::string& claim,
                                                      const std::string& source) {
  auto fail = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", why));
  };
  const nlohmann::json doc = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return fail("invalid JSON");
  if (!doc.is_object()) return fail("expected a JSON object");
  auto kind = doc.find("kind");
  if (kind == doc.end() || !kind->is_string() || kind->get<std::string>() != kCdiKind) {
    return fail(absl::StrCat("kind: expected \"", kCdiKind, "\", got ",
                             kind == doc.end() ? "nothing" : kind->dump()));
  }
  auto devices = doc.find("devices");
  if (devices == doc.end() || !devices->is_array() || devices->size() != 1 ||
      !(*devices)[0].is_object() || !(*devices)[0].contains("name") ||
      (*devices)[0]["name"] != claim) {
    return fail(absl::StrCat("devices: expected one device named \"", claim, "\""));
  }
  const nlohmann::json& device = (*devices)[0];
  auto edits = device.find("containerEdits");
  const nlohmann::json* env = nullptr;
  if (edits != device.end() && edits->is_object()) {
    auto it = edits->find("env");
    if (it != edits->end() && it->is_array()) env = &*it;
  }
  if (env == nullptr) return fail("devices[0].containerEdits.env: missing");
  const std::string key = absl::StrCat(kEnvDevices, "=");
  for (const nlohmann::json& entry : *env) {
    if (!entry.is_string()) continue;
    const std::string text = entry.get<std::string>();
    if (!absl::StartsWith(text, key)) continue;
    std::vector<std::string> ids = absl::StrSplit(text.substr(key.size()), ',', absl::SkipEmpty());
    if (ids.empty()) return fail(absl::StrCat("devices[0].containerEdits.env: ", key, " is empty"));
    return ids;
  }
  return fail(absl::StrCat("devices[0].containerEdits.env: no ", kEnvDevices));
}

std::string ClaimRecordFileName(const std::string& claim) {
  return absl::StrCat(kCdiSpecPrefix, claim, kClaimRecordSuffix);
}

std::string ClaimRecordJson(const std::string& claim, const ClaimRecord& record) {
  const nlohmann::ordered_json doc = {
      {"version", kClaimRecordVersion},   {"claim", claim},
      {"mode", "late-binding"},           {"owner", record.owner},
      {"kubeletIds", record.kubelet_ids}, {"resource", record.resource},
      {"replicas", record.replicas},      {"efas", record.efas}};
  return doc.dump() + "\n";
}

absl::StatusOr<ClaimRecord> ParseClaimRecord(std::string_view json, const std::string& claim,
                                             const std::string& source) {
  auto fail = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", why));
  };
  const nlohmann::json doc = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return fail("expected a JSON object");
  auto strings = [&](const char* key) -> std::optional<std::vector<std::string>> {
    auto it = doc.find(key);
    if (it == doc.end() || !it->is_array()) return std::nullopt;
    std::vector<std::string> out;
    for (const auto& v : *it) {
      if (!v.is_string()) return std::nullopt;
      out.push_back(v.get<std::string>());
    }
    return out;
  };
  auto text = [&](const char* key) -> std::optional<std::string> {
    auto it = doc.find(key);
    if (it == doc.end() || !it->is_string()) return std::nullopt;
    return it->get<std::string>();
  };
  ClaimRecord r;
  auto version = doc.find("version");
  if (version == doc.end() || !version->is_number_integer() || *version < 1) {
    return fail("version: expected a positive integer");
  }
  r.version = version->get<int>();
  if (text("claim") != claim) return fail(absl::StrCat("claim: expected \"", claim, "\""));
  auto efas = strings("efas");
  if (!efas || efas->empty()) return fail("efas: expected a non-empty list of strings");
  r.efas = *std::move(efas);
  if (r.version > kClaimRecordVersion) return r;
  auto owner = text("owner");
  auto ids = strings("kubeletIds");
  auto resource = text("resource");
  auto replicas = doc.find("replicas");
  if (!owner || !ids || !resource || replicas == doc.end() || !replicas->is_number_integer() ||
      *replicas < 1) {
    return fail("expected owner, kubeletIds, resource and replicas");
  }
  r.owner = *std::move(owner);
  r.kubelet_ids = *std::move(ids);
  r.resource = *std::move(resource);
  r.replicas = replicas->get<int>();
  return r;
}

absl::Status WriteFileAtomically(const fs::path& path, std::string_view content, mode_t mode) {
  const fs::path dir = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  std::string name = absl::StrCat(dir.string(), "/.", path.filename().string(), ".XXXXXX.tmp");
  const int fd = ::mkstemps(name.data(), 4);
  if (fd < 0) return PosixError(dir.string(), errno);
  TemporaryFile temporary(fd, name);
  for (size_t done = 0; done < content.size();) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return PosixError(name, errno);
    done += static_cast<size_t>(n);
  }
  if (::fchmod(fd, mode) != 0) return PosixError(name, errno);
  if (::fsync(fd) != 0) return PosixError(name, errno);
  if (int error = temporary.Close(); error != 0) return PosixError(name, error);
  if (::rename(name.c_str(), path.c_str()) != 0) return PosixError(path.string(), errno);
  temporary.Keep();
  // The rename itself must survive a crash too.
  if (int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
  return absl::OkStatus();
}

}  // namespace efa::plugin
