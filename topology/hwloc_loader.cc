#include "topology/hwloc_loader.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "topology/sysfs.h"

extern char** environ;

namespace efa::topology {
namespace {

// hwloc's Linux backend reads a fake root only from HWLOC_FSROOT, and
// changing the environment while other threads run (gRPC's) is undefined
// behaviour in glibc. So a fake root is read by a copy of this very program
// started with HWLOC_FSROOT in its initial environment: before main() (no
// thread yet) it sees this variable, writes the topology as XML to stdout
// and exits; the caller loads that XML. The environment is never changed.
constexpr char kExportEnv[] = "EFA_HWLOC_EXPORT_FSROOT";

// A topology object with every PCI device, bridge and OS device kept; not
// loaded yet.
absl::StatusOr<HwlocTopology> NewTopology() {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) return absl::InternalError("hwloc_topology_init failed");
  HwlocTopology topology(raw);
  hwloc_topology_set_io_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_ALL);
  // Not the libpciaccess plugin: Linux's own sysfs discovery gives the same
  // PCI tree (hwloc-ls --of xml is identical with HWLOC_COMPONENTS=-pci) and
  // honours HWLOC_FSROOT, which libpciaccess ignores; it also leaks its state
  // at every load (LeakSanitizer, scripts/sanitizers.sh).
  hwloc_topology_set_components(raw, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "pci");
  return topology;
}

absl::StatusOr<HwlocTopology> Load(HwlocTopology topology, const std::string& what) {
  if (hwloc_topology_load(topology.get()) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": hwloc cannot load the topology: ", std::strerror(errno)));
  }
  return topology;
}

void WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data += n;
    size -= static_cast<size_t>(n);
  }
}

// The helper's whole life (see kExportEnv): runs before main() in every
// program that links this file, and returns at once unless it is the helper.
__attribute__((constructor)) void ExportFakeRootIfAsked() {
  const char* fsroot = std::getenv(kExportEnv);
  if (fsroot == nullptr) return;
  auto topology = NewTopology();
  if (topology.ok()) {
    if (std::string_view(fsroot) != "/") {
      // Not the build host's CPUs in a simulated machine.
      hwloc_topology_set_components(topology->get(), HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST,
                                    "x86");
    }
    topology = Load(*std::move(topology), fsroot);
  }
  char* xml = nullptr;
  int length = 0;
  if (!topology.ok() || hwloc_topology_export_xmlbuffer(topology->get(), &xml, &length, 0) != 0) {
    const std::string why = topology.ok() ? absl::StrCat(fsroot, ": hwloc cannot export XML")
                                          : std::string(topology.status().message());
    WriteAll(2, why.data(), why.size());
    ::_exit(1);
  }
  WriteAll(1, xml, static_cast<size_t>(length));
  ::_exit(0);
}

// Reads `fds` until each is at its end; returns what each gave.
std::vector<std::string> ReadToEnd(std::vector<int> fds) {
  std::vector<std::string> out(fds.size());
  size_t open = fds.size();
  while (open > 0) {
    std::vector<pollfd> pfds;
    for (int fd : fds) pfds.push_back({fd, POLLIN, 0});
    if (::poll(pfds.data(), pfds.size(), -1) < 0 && errno != EINTR) break;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i] < 0 || !(pfds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[65536];
      ssize_t n = ::read(fds[i], buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ::close(fds[i]);
        fds[i] = -1;
        --open;
        continue;
      }
      out[i].append(buf, static_cast<size_t>(n));
    }
  }
  return out;
}

// The XML of the topology under `fsroot`, from the helper.
absl::StatusOr<std::string> ExportFakeRoot(const std::string& fsroot) {
  std::vector<std::string> env_strings = {absl::StrCat("HWLOC_FSROOT=", fsroot),
                                          absl::StrCat(kExportEnv, "=", fsroot)};
  for (char** e = environ; *e != nullptr; ++e) {
    // The rest of the environment as it is (library paths, sanitizer options).
    if (!absl::StartsWith(*e, "HWLOC_FSROOT=") && !absl::StartsWith(*e, kExportEnv)) {
      env_strings.emplace_back(*e);
    }
  }
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string arg0 = "efa-hwloc-export";
  char* argv[] = {arg0.data(), nullptr};

  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return absl::ErrnoToStatus(errno, "pipe");
  if (::pipe2(err, O_CLOEXEC) != 0) {
    const int e = errno;
    ::close(out[0]);
    ::close(out[1]);
    return absl::ErrnoToStatus(e, "pipe");
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  ::close(err[1]);
  if (rc != 0) {
    ::close(out[0]);
    ::close(err[0]);
    return absl::ErrnoToStatus(rc, absl::StrCat(fsroot, ": cannot start the hwloc export helper"));
  }
  std::vector<std::string> got = ReadToEnd({out[0], err[0]});
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string why(absl::StripTrailingAsciiWhitespace(got[1]));
    if (why.empty()) why = absl::StrCat(fsroot, ": the hwloc export helper failed");
    return absl::InvalidArgumentError(why);
  }
  return std::move(got[0]);
}

}  // namespace

TopologySource SourceFor(const std::filesystem::path& sysfs_root, std::string xml_path) {
  TopologySource source{"/", std::move(xml_path)};
  if (sysfs_root != HostRoots{}.sysfs) source.fsroot = sysfs_root.parent_path().string();
  return source;
}

absl::StatusOr<HwlocTopology> LoadTopology(const TopologySource& source) {
  auto topology = NewTopology();
  if (!topology.ok()) return topology.status();
  hwloc_topology_t raw = topology->get();
  const bool fake_root = !source.fsroot.empty() && source.fsroot != "/";
  const char* env_root = std::getenv("HWLOC_FSROOT");
  if (!source.xml_path.empty()) {
    if (hwloc_topology_set_xml(raw, source.xml_path.c_str()) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(source.xml_path, ": cannot read as hwloc XML: ", std::strerror(errno)));
    }
    return Load(*std::move(topology), source.xml_path);
  }
  // hwloc reads the root the environment names; when that is not the one
  // wanted, the helper reads it (see kExportEnv).
  const std::string wanted = fake_root ? source.fsroot : "/";
  if ((env_root == nullptr ? std::string("/") : std::string(env_root)) == wanted) {
    if (fake_root) {
      // Not the build host's CPUs in a simulated machine.
      hwloc_topology_set_components(raw, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "x86");
    }
    return Load(*std::move(topology), fake_root ? source.fsroot : "the live system");
  }
  auto xml = ExportFakeRoot(wanted);
  if (!xml.ok()) return xml.status();
  if (hwloc_topology_set_xmlbuffer(raw, xml->data(), static_cast<int>(xml->size())) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(wanted, ": cannot read the helper's hwloc XML: ", std::strerror(errno)));
  }
  return Load(*std::move(topology), wanted);
}

absl::Status ExportTopologyXml(hwloc_topology* topology, const std::string& path) {
  if (hwloc_topology_export_xml(topology, path.c_str(), 0) != 0) {
    return absl::ErrnoToStatus(errno, path);
  }
  return absl::OkStatus();
}

}  // namespace efa::topology
