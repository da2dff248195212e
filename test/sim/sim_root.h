// A simulated machine written to a fresh temporary directory for one test,
// removed again when the object goes away.
#pragma once

#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "test/sim/machine_spec.h"
#include "topology/sysfs.h"

namespace efa::sim {

// Where simulated machines are written: TMPDIR when set; else /dev/shm when
// it takes device nodes and programs (a simulated sysfs is thousands of
// small files, as the real one is in memory: on tmpfs a test writing every
// machine took 0.9 s, on ext4 7.3 s, mostly the kernel's time); else /tmp.
inline std::string SimBaseDir() {
  if (const char* tmp = std::getenv("TMPDIR")) return tmp;
  struct statvfs shm {};
  if (::statvfs("/dev/shm", &shm) == 0 && (shm.f_flag & (ST_RDONLY | ST_NODEV | ST_NOEXEC)) == 0 &&
      ::access("/dev/shm", W_OK) == 0) {
    return "/dev/shm";
  }
  return "/tmp";
}

class SimRoot {
 public:
  explicit SimRoot(const std::string& machine, Naming naming = Naming::kUdev) {
    auto spec = FindMachine(machine);
    if (!spec.ok()) throw std::runtime_error(std::string(spec.status().message()));
    Init(*spec, naming);
  }
  explicit SimRoot(const MachineSpec& spec, Naming naming = Naming::kUdev) { Init(spec, naming); }
  ~SimRoot() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  SimRoot(const SimRoot&) = delete;
  SimRoot& operator=(const SimRoot&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path sys() const { return path_ / "sys"; }
  std::filesystem::path xml() const { return path_ / "hwloc.xml"; }
  topology::HostRoots roots() const { return {path_ / "sys", path_ / "dev", path_ / "proc"}; }
  // The daemon's flags for this machine: its roots, the kubelet directory
  // <path>/kubelet and the CDI spec dir <path>/etc/cdi.
  std::vector<std::string> DaemonFlags() const {
    return {
        "--kubelet-dir",   (path_ / "kubelet").string(), "--sysfs-root", sys().string(),
        "--dev-root",      (path_ / "dev").string(),     "--proc-root",  (path_ / "proc").string(),
        "--cdi-spec-dirs", (path_ / "etc/cdi").string()};
  }
  // Puts dev/infiniband/uverbsN back as its character device; throws on
  // failure.
  void RestoreUverbs(int n) const {
    auto status = RestoreUverbsNode(path_.string(), n);
    if (!status.ok()) throw std::runtime_error(std::string(status.message()));
  }
  // Sets an efa counter of `ibdev` (SetEfaCounter); throws on failure.
  void SetCounter(const std::string& ibdev, const std::string& name, uint64_t value) const {
    auto status = SetEfaCounter(path_.string(), ibdev, name, value);
    if (!status.ok()) throw std::runtime_error(std::string(status.message()));
  }

 private:
  void Init(const MachineSpec& spec, Naming naming) {
    std::string tmpl = SimBaseDir() + "/efa-sim-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
    auto status = WriteMachine(spec, path_.string(), naming);
    if (!status.ok()) throw std::runtime_error(std::string(status.message()));
  }
  std::filesystem::path path_;
};

}  // namespace efa::sim
