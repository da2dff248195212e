#include "plugin/guards/dra_guard.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace efa::plugin {
namespace fs = std::filesystem;
namespace {

// 0 when something listens on the unix socket at `path`, else the errno
// (ECONNREFUSED or ENOENT: nothing listens; any other: not known).
int ProbeSocket(const fs::path& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.native().size() >= sizeof addr.sun_path) return ENAMETOOLONG;
  std::memcpy(addr.sun_path, path.c_str(), path.native().size());
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  int err = 0;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) err = errno;
  ::close(fd);
  // A full backlog (EAGAIN) still means a listener.
  return err == EAGAIN || err == EINPROGRESS ? 0 : err;
}

}  // namespace

const std::vector<std::pair<DraPolicy, std::string>>& DraPolicyNames() {
  static const auto* names =
      new std::vector<std::pair<DraPolicy, std::string>>{{DraPolicy::kYield, "yield"},
                                                         {DraPolicy::kIgnore, "ignore"},
                                                         {DraPolicy::kMonitor, "monitor"}};
  return *names;
}

std::string_view DraPolicyName(DraPolicy policy) {
  for (const auto& [value, name] : DraPolicyNames()) {
    if (value == policy) return name;
  }
  return "?";
}

bool IsDraRegistrationName(std::string_view file_name, std::string_view driver) {
  constexpr std::string_view kSuffix = "-reg.sock";
  if (driver.empty() || !file_name.starts_with(driver) || !file_name.ends_with(kSuffix)) {
    return false;
  }
  std::string_view middle =
      file_name.substr(driver.size(), file_name.size() - driver.size() - kSuffix.size());
  if (middle.empty()) return true;
  // "-" and a pod UID: 8-4-4-4-12 lower-case hex digits.
  if (middle.size() != 37 || middle.front() != '-') return false;
  middle.remove_prefix(1);
  for (size_t i = 0; i < middle.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    const char c = middle[i];
    if (dash ? c != '-' : !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

DraReport DetectDraDriver(const fs::path& registry_dir, std::string_view driver) {
  return DetectDraDrivers(registry_dir, {std::string(driver)});
}

DraReport DetectDraDrivers(const fs::path& registry_dir, const std::vector<std::string>& drivers) {
  DraReport report;
  if (drivers.empty()) {
    report.evidence = "no DRA driver to look for (draDrivers is empty)";
    return report;
  }
  std::error_code ec;
  std::vector<std::string> stale;
  std::vector<std::string> unknown;
  fs::directory_iterator it(registry_dir, ec);
  // No directory: a kubelet with no plugin registry, a complete answer.
  if (ec == std::errc::no_such_file_or_directory) ec.clear();
  for (const fs::directory_iterator end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    auto driver = std::find_if(drivers.begin(), drivers.end(), [&](const std::string& d) {
      return IsDraRegistrationName(name, d);
    });
    if (driver == drivers.end()) continue;
    struct stat st;
    if (::stat(it->path().c_str(), &st) != 0) {
      if (errno != ENOENT) {
        unknown.push_back(
            absl::StrCat("cannot stat ", it->path().string(), ": ", std::strerror(errno)));
      }
      continue;
    }
    if (!S_ISSOCK(st.st_mode)) continue;
    if (int err = ProbeSocket(it->path()); err != 0) {
      if (err != ECONNREFUSED && err != ENOENT) {
        unknown.push_back(
            absl::StrCat("cannot probe ", it->path().string(), ": ", std::strerror(err)));
        continue;
      }
      ++report.refusing;
      stale.push_back(absl::StrCat(it->path().string(),
                                   ": refuses connections (stale: ", std::strerror(err), ")"));
      continue;
    }
    report.present = true;
    report.driver = *driver;
    report.evidence = absl::StrCat(it->path().string(), ": the ", *driver,
                                   " DRA driver's registration socket accepts connections");
    return report;
  }
  if (ec)
    unknown.push_back(absl::StrCat("cannot list ", registry_dir.string(), ": ", ec.message()));
  report.error = absl::StrJoin(unknown, "; ");
  report.evidence = stale.empty() ? absl::StrCat("no ", absl::StrJoin(drivers, " or "),
                                                 " registration socket in ", registry_dir.string())
                                  : absl::StrJoin(stale, "; ");
  return report;
}

}  // namespace efa::plugin
