// Fakes of what the guards read, for tests: a kubelet checkpoint built from
// real serialized protos, a <proc-root> with fake processes (and Go
// binaries carrying build info), and a DRA driver's registration socket.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "deviceplugin/v1beta1/api.pb.h"
#include "nlohmann/json.hpp"
#include "test/support/temp_dir.h"

namespace efa::testing {

// Writes `bytes` to `path` as the kubelet does: a temporary file in the same
// directory renamed over the target (inotify sees IN_MOVED_TO).
inline void WriteFileAtomically(const std::filesystem::path& path, const std::string& bytes) {
  std::filesystem::create_directories(path.parent_path());
  const std::filesystem::path tmp = path.parent_path() / (".tmp-" + path.filename().string());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  std::filesystem::rename(tmp, path);
}

// A unix stream socket bound at `path` (its directory made), not listening
// yet; throws naming the path.
inline int BindUnixSocket(const std::filesystem::path& path) {
  std::filesystem::create_directories(path.parent_path());
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    throw std::runtime_error("cannot bind " + path.string());
  }
  return fd;
}

// One entry of a fake checkpoint.
struct FakeCheckpointEntry {
  std::string pod_uid;
  std::string container;
  std::string resource;
  std::map<int64_t, std::vector<std::string>> device_ids;  // NUMA node -> IDs
  v1beta1::ContainerAllocateResponse alloc_resp;
  bool plain_device_list = false;  // the pre-1.20 list form of DeviceIDs
  bool null_alloc_resp = false;    // Go's encoding of a nil []byte
};

// The checkpoint JSON as the kubelet writes it (field order of the Go
// struct; AllocResp = base64 of the serialized proto).
inline std::string FakeCheckpointJson(
    const std::vector<FakeCheckpointEntry>& entries,
    const std::map<std::string, std::vector<std::string>>& registered = {}) {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const FakeCheckpointEntry& e : entries) {
    nlohmann::ordered_json entry;
    entry["PodUID"] = e.pod_uid;
    entry["ContainerName"] = e.container;
    entry["ResourceName"] = e.resource;
    if (e.plain_device_list) {
      std::vector<std::string> ids;
      for (const auto& [numa, numa_ids] : e.device_ids) {
        ids.insert(ids.end(), numa_ids.begin(), numa_ids.end());
      }
      entry["DeviceIDs"] = ids;
    } else {
      nlohmann::ordered_json by_numa = nlohmann::ordered_json::object();
      for (const auto& [numa, ids] : e.device_ids) by_numa[std::to_string(numa)] = ids;
      entry["DeviceIDs"] = by_numa;
    }
    if (e.null_alloc_resp) {
      entry["AllocResp"] = nullptr;
    } else {
      entry["AllocResp"] = absl::Base64Escape(e.alloc_resp.SerializeAsString());
    }
    list.push_back(entry);
  }
  nlohmann::ordered_json doc;
  doc["Data"]["PodDeviceEntries"] = list;
  nlohmann::ordered_json reg = nlohmann::ordered_json::object();
  for (const auto& [resource, ids] : registered) reg[resource] = ids;
  doc["Data"]["RegisteredDevices"] = reg;
  doc["Checksum"] = 1234567890u;
  return doc.dump();
}

// An Allocate answer as the NVIDIA device plugin gives it for `gpus`, with
// MOFED shown by the env var and/or the CDI device.
inline v1beta1::ContainerAllocateResponse NvidiaAllocResp(const std::vector<std::string>& gpus,
                                                          bool mofed_env, bool mofed_cdi) {
  v1beta1::ContainerAllocateResponse resp;
  std::string visible;
  for (const auto& g : gpus) visible += (visible.empty() ? "" : ",") + g;
  (*resp.mutable_envs())["NVIDIA_VISIBLE_DEVICES"] = visible;
  if (mofed_env) (*resp.mutable_envs())["NVIDIA_MOFED"] = "enabled";
  for (const auto& g : gpus) {
    resp.add_cdi_devices()->set_name("k8s.device-plugin.nvidia.com/gpu=" + g);
  }
  if (mofed_cdi) resp.add_cdi_devices()->set_name("k8s.device-plugin.nvidia.com/mofed=all");
  return resp;
}

// An EFA Allocate answer as this plugin gives it.
inline v1beta1::ContainerAllocateResponse EfaAllocResp(const std::string& ibdev, int uverbs) {
  v1beta1::ContainerAllocateResponse resp;
  auto* spec = resp.add_devices();
  spec->set_container_path("/dev/infiniband/uverbs" + std::to_string(uverbs));
  spec->set_host_path("/dev/infiniband/uverbs" + std::to_string(uverbs));
  spec->set_permissions("rw");
  (*resp.mutable_envs())["EFA_DEVICES"] = ibdev;
  return resp;
}

// A minimal ELF64 little-endian file whose only content is a .go.buildinfo
// section in Go 1.18+'s inline format, as `go build` writes it.
inline std::string FakeGoBinary(const std::string& go_version, const std::string& path,
                                const std::string& module, const std::string& version) {
  auto uvarint = [](std::string& out, uint64_t v) {
    while (v >= 0x80) {
      out.push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    out.push_back(static_cast<char>(v));
  };
  auto le = [](std::string& out, size_t at, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
  };
  const std::string sentinel_start(
      "\x30\x77\xaf\x0c\x92\x74\x08\x02\x41\xe1\xc1\x07\xe6\xd6\x18\xe6", 16);
  const std::string sentinel_end("\xf9\x32\x43\x31\x86\x18\x20\x72\x00\x82\x42\x10\x41\x16\xd8\xf2",
                                 16);
  const std::string modinfo =
      sentinel_start + "path\t" + path + "\nmod\t" + module + "\t" + version +
      "\th1:fake=\ndep\tgoogle.golang.org/grpc\tv1.65.0\th1:x=\n" + sentinel_end;
  std::string section("\xff Go buildinf:", 14);
  section.push_back(8);  // pointer size
  section.push_back(2);  // flagsVersionInl
  section.resize(32, '\0');
  uvarint(section, go_version.size());
  section += go_version;
  uvarint(section, modinfo.size());
  section += modinfo;

  const std::string names = std::string("\0.go.buildinfo\0.shstrtab\0", 25);
  std::string elf(64, '\0');
  elf[0] = 0x7f;
  elf[1] = 'E';
  elf[2] = 'L';
  elf[3] = 'F';
  elf[4] = 2;  // ELFCLASS64
  elf[5] = 1;  // little-endian
  elf[6] = 1;
  const size_t section_at = elf.size();
  elf += section;
  const size_t names_at = elf.size();
  elf += names;
  elf.resize((elf.size() + 7) / 8 * 8, '\0');
  const size_t table_at = elf.size();
  elf.resize(table_at + 3 * 64, '\0');
  le(elf, 0x28, table_at, 8);  // e_shoff
  le(elf, 0x34, 64, 2);        // e_ehsize
  le(elf, 0x3a, 64, 2);        // e_shentsize
  le(elf, 0x3c, 3, 2);         // e_shnum
  le(elf, 0x3e, 2, 2);         // e_shstrndx
  // [1] .go.buildinfo, [2] .shstrtab: sh_name, sh_type, sh_offset, sh_size.
  le(elf, table_at + 64 + 0, 1, 4);
  le(elf, table_at + 64 + 4, 1, 4);  // SHT_PROGBITS
  le(elf, table_at + 64 + 24, section_at, 8);
  le(elf, table_at + 64 + 32, section.size(), 8);
  le(elf, table_at + 128 + 0, 15, 4);
  le(elf, table_at + 128 + 4, 3, 4);  // SHT_STRTAB
  le(elf, table_at + 128 + 24, names_at, 8);
  le(elf, table_at + 128 + 32, names.size(), 8);
  return elf;
}

// A fake procfs: <root>/<pid>/{cmdline,environ,exe}.
class FakeProc {
 public:
  explicit FakeProc(std::filesystem::path root) : root_(std::move(root)) {
    std::filesystem::create_directories(root_);
  }
  const std::filesystem::path& root() const { return root_; }

  ~FakeProc() {
    for (int fd : sockets_) ::close(fd);
  }
  FakeProc(const FakeProc&) = delete;
  FakeProc& operator=(const FakeProc&) = delete;

  // Adds (or replaces) a process. `version` non-empty writes `exe` as a Go
  // binary of the NVIDIA device plugin module at that version. `listens_on`
  // non-empty makes the process hold a listening socket bound there (a real
  // socket, bound here if not yet there), as the NVIDIA plugin holds
  // <device-plugins>/nvidia-gpu.sock: its root is "/", net/unix lists the
  // socket and fd/3 is it. Each file is replaced atomically and cmdline
  // last, so that a reader never sees the new command line with the old
  // environment or binary. `uid` is the real UID in status (the effective,
  // saved and filesystem ones are the same).
  void AddProcess(int pid, const std::vector<std::string>& argv,
                  const std::vector<std::string>& env, const std::string& version = "",
                  const std::filesystem::path& listens_on = {}, int uid = 0) {
    const std::filesystem::path dir = root_ / std::to_string(pid);
    std::filesystem::create_directories(dir);
    std::error_code ec;
    std::filesystem::remove(dir / "root", ec);
    std::filesystem::remove_all(dir / "fd", ec);
    std::filesystem::create_directories(dir / "fd");
    std::string unix_table = "Num       RefCount Protocol Flags    Type St Inode Path\n";
    if (!listens_on.empty()) {
      if (!std::filesystem::exists(listens_on)) Listen(listens_on);
      const std::string inode = std::to_string(100000 + pid);
      unix_table += "0000000000000000: 00000002 00000000 00010000 0001 01 " + inode + " " +
                    listens_on.string() + "\n";
      std::filesystem::create_symlink("/", dir / "root");
      std::filesystem::create_symlink("socket:[" + inode + "]", dir / "fd/3");
    }
    std::filesystem::create_directories(dir / "net");
    WriteFileAtomically(dir / "net/unix", unix_table);
    if (version.empty()) {
      std::filesystem::remove(dir / "exe", ec);
    } else {
      WriteFileAtomically(
          dir / "exe",
          FakeGoBinary("go1.23.4", "github.com/NVIDIA/k8s-device-plugin/cmd/nvidia-device-plugin",
                       "github.com/NVIDIA/k8s-device-plugin", version));
    }
    WriteFileAtomically(dir / "environ", Join(env));
    WriteFileAtomically(dir / "status", Status(argv.empty() ? "" : argv[0], uid));
    WriteFileAtomically(dir / "cmdline", Join(argv));
  }
  void RemoveProcess(int pid) { std::filesystem::remove_all(root_ / std::to_string(pid)); }
  // Adds a process of which only cmdline and status are there (the other
  // files gone, as when it exits during a scan): cheap enough for thousands.
  void AddNamedProcess(int pid, const std::vector<std::string>& argv, int uid) {
    const std::filesystem::path dir = root_ / std::to_string(pid);
    std::filesystem::create_directories(dir);
    WriteFileAtomically(dir / "status", Status(argv.empty() ? "" : argv[0], uid));
    WriteFileAtomically(dir / "cmdline", Join(argv));
  }

  // The head of /proc/<pid>/status as the kernel writes it
  // (fs/proc/array.c, task_state): the name is the executed file's base name
  // (here argv[0]'s) cut to 15 bytes (TASK_COMM_LEN), then "Uid:" real,
  // effective, saved, filesystem.
  static std::string Status(const std::string& argv0, int uid) {
    const std::string name = std::filesystem::path(argv0).filename().string().substr(0, 15);
    const std::string id = std::to_string(uid);
    return "Name:\t" + name + "\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t1\nNgid:\t0\n" +
           "Pid:\t1\nPPid:\t0\nTracerPid:\t0\nUid:\t" + id + "\t" + id + "\t" + id + "\t" + id +
           "\nGid:\t" + id + "\t" + id + "\t" + id + "\t" + id + "\n";
  }

 private:
  static std::string Join(const std::vector<std::string>& fields) {
    std::string out;
    for (const auto& f : fields) out += f + '\0';
    return out;
  }
  void Listen(const std::filesystem::path& path) {
    const int fd = BindUnixSocket(path);
    sockets_.push_back(fd);
    if (::listen(fd, 4) != 0) throw std::runtime_error("cannot listen on " + path.string());
  }
  std::filesystem::path root_;
  std::vector<int> sockets_;
};

// A DRA driver's registration socket in <kubelet-dir>/plugins_registry. The
// socket is bound and listening before it gets its name, so the daemon never
// sees it half made.
class FakeDraDriver {
 public:
  explicit FakeDraDriver(std::filesystem::path registry_dir,
                         std::string socket_name = "dra.net-reg.sock")
      : dir_(std::move(registry_dir)), name_(std::move(socket_name)) {}
  ~FakeDraDriver() { Stop(); }
  FakeDraDriver(const FakeDraDriver&) = delete;
  FakeDraDriver& operator=(const FakeDraDriver&) = delete;

  std::filesystem::path socket_path() const { return dir_ / name_; }

  // Creates the listening socket under its final name.
  void Start() {
    const std::filesystem::path tmp = dir_ / ".tmp-reg.sock";
    std::filesystem::remove(tmp);
    fd_ = BindUnixSocket(tmp);
    Listen();
    std::filesystem::rename(tmp, socket_path());
  }
  // Binds the socket under its final name without listening yet, as a
  // driver does between bind() and listen(): connections are refused.
  void Bind() { fd_ = BindUnixSocket(socket_path()); }
  // Starts listening on the socket Bind() made.
  void Listen() {
    if (::listen(fd_, 16) != 0) throw std::runtime_error("cannot listen on " + name_);
  }
  // Closes the socket and removes its file, as a driver that stops cleanly.
  void Stop() {
    if (fd_ < 0) return;
    ::close(fd_);
    fd_ = -1;
    std::error_code ec;
    std::filesystem::remove(socket_path(), ec);
  }
  // Closes the socket but leaves its file, as a driver that died.
  void Crash() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  std::filesystem::path dir_;
  std::string name_;
  int fd_ = -1;
};

}  // namespace efa::testing
