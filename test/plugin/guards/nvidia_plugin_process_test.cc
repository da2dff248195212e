#include "plugin/guards/nvidia_plugin_process.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <map>
#include <string>

#include "plugin/guards/go_build_info.h"
#include "test/plugin/guard_fakes.h"

using namespace efa::plugin;
using efa::testing::FakeGoBinary;
using efa::testing::FakeProc;
using efa::testing::TempDir;

namespace {

std::string Nul(std::initializer_list<const char*> fields) {
  std::string out;
  for (const char* f : fields) out += std::string(f) + '\0';
  return out;
}

}  // namespace

TEST_CASE("SplitNul splits cmdline and environ bytes", "[nvidia]") {
  CHECK(SplitNul("").empty());
  CHECK(SplitNul(Nul({"a", "b"})) == std::vector<std::string_view>{"a", "b"});
  CHECK(SplitNul(std::string("a\0b", 3)) == std::vector<std::string_view>{"a", "b"});
  CHECK(SplitNul(Nul({"a", "", "c"})) == std::vector<std::string_view>{"a", "", "c"});
}

TEST_CASE("IsNvidiaPluginCommand matches argv[0]'s base name only", "[nvidia]") {
  CHECK(IsNvidiaPluginCommand(Nul({"nvidia-device-plugin"})));
  CHECK(IsNvidiaPluginCommand(Nul({"/usr/bin/nvidia-device-plugin", "--mofed-enabled"})));
  CHECK_FALSE(IsNvidiaPluginCommand(Nul({"/bin/sh", "-c", "nvidia-device-plugin"})));
  CHECK_FALSE(IsNvidiaPluginCommand(Nul({"nvidia-device-plugin-helper"})));
  CHECK_FALSE(IsNvidiaPluginCommand(""));
}

TEST_CASE("MofedFlagFromCmdline reads the flag as Go's flag package does", "[nvidia]") {
  struct Case {
    std::string cmdline;
    std::optional<bool> flag;
  };
  const Case cases[] = {
      {Nul({"nvidia-device-plugin"}), std::nullopt},
      {Nul({"nvidia-device-plugin", "--mofed-enabled"}), true},
      {Nul({"nvidia-device-plugin", "-mofed-enabled"}), true},
      {Nul({"nvidia-device-plugin", "--mofed-enabled=true"}), true},
      {Nul({"nvidia-device-plugin", "--mofed-enabled=false"}), false},
      {Nul({"nvidia-device-plugin", "--mofed-enabled=0"}), false},
      {Nul({"nvidia-device-plugin", "--mofed-enabled", "--mofed-enabled=F"}), false},
      {Nul({"nvidia-device-plugin", "--mofed-enabled=maybe"}), std::nullopt},
      {Nul({"nvidia-device-plugin", "--mofed-enabledx"}), std::nullopt},
      {Nul({"nvidia-device-plugin", "--", "--mofed-enabled"}), std::nullopt},
      {Nul({"--mofed-enabled"}), std::nullopt},  // argv[0] is not a flag
  };
  for (const Case& c : cases) {
    INFO(c.cmdline);
    CHECK(MofedFlagFromCmdline(c.cmdline) == c.flag);
  }
}

TEST_CASE("MofedEnvFromEnviron reads MOFED_ENABLED", "[nvidia]") {
  CHECK(MofedEnvFromEnviron(Nul({"PATH=/bin", "MOFED_ENABLED=true"})) == true);
  CHECK(MofedEnvFromEnviron(Nul({"MOFED_ENABLED=False"})) == false);
  CHECK(MofedEnvFromEnviron(Nul({"MOFED_ENABLED="})) == std::nullopt);
  // Go's os.Getenv reads the first entry of a repeated variable: a later
  // one, bool or not, changes nothing.
  CHECK(MofedEnvFromEnviron(Nul({"MOFED_ENABLED=true", "MOFED_ENABLED=maybe"})) == true);
  CHECK(MofedEnvFromEnviron(Nul({"MOFED_ENABLED=true", "MOFED_ENABLED=false"})) == true);
  CHECK(MofedEnvFromEnviron(Nul({"MOFED_ENABLED=false", "MOFED_ENABLED=true"})) == false);
  CHECK(MofedEnvFromEnviron(Nul({"MOFED_ENABLED=x", "MOFED_ENABLED=true"})) == std::nullopt);
  CHECK(MofedEnvFromEnviron(Nul({"NVIDIA_MOFED_ENABLED=true"})) == std::nullopt);
  CHECK(MofedEnvFromEnviron("") == std::nullopt);
}

TEST_CASE("MOFED is on by default in v0.19.0 to v0.19.2 only", "[nvidia]") {
  CHECK(MofedDefaultForVersion("v0.19.0") == true);
  CHECK(MofedDefaultForVersion("v0.19.2") == true);
  CHECK(MofedDefaultForVersion("0.19.1-rc.1") == true);
  CHECK(MofedDefaultForVersion("v0.19.3") == false);
  CHECK(MofedDefaultForVersion("v0.18.2") == false);
  CHECK(MofedDefaultForVersion("v0.20.0") == false);
  CHECK(MofedDefaultForVersion("(devel)") == std::nullopt);
  CHECK(MofedDefaultForVersion("v0.19") == std::nullopt);
  CHECK(MofedDefaultForVersion("") == std::nullopt);
}

TEST_CASE("EffectiveMofed: the flag wins over the environment, which wins over the default",
          "[nvidia]") {
  NvidiaPluginProcess p;
  p.version = "v0.19.1";
  CHECK(EffectiveMofed(p) == true);
  p.mofed_env = false;
  CHECK(EffectiveMofed(p) == false);
  p.mofed_flag = true;
  CHECK(EffectiveMofed(p) == true);
  CHECK(EffectiveMofed(NvidiaPluginProcess{}) == std::nullopt);
}

TEST_CASE("ParseGoBuildInfo reads the Go and main module versions", "[nvidia]") {
  TempDir dir;
  const auto exe = dir.path() / "nvidia-device-plugin";
  std::ofstream(exe, std::ios::binary)
      << FakeGoBinary("go1.23.4", "github.com/NVIDIA/k8s-device-plugin/cmd/nvidia-device-plugin",
                      "github.com/NVIDIA/k8s-device-plugin", "v0.19.2");
  auto info = ReadGoBuildInfo(exe);
  REQUIRE(info.ok());
  CHECK(info->go_version == "go1.23.4");
  CHECK(info->path == "github.com/NVIDIA/k8s-device-plugin/cmd/nvidia-device-plugin");
  CHECK(info->main_module == "github.com/NVIDIA/k8s-device-plugin");
  CHECK(info->main_version == "v0.19.2");
}

TEST_CASE("ReadGoBuildInfo names the file it cannot use", "[nvidia]") {
  TempDir dir;
  const auto script = dir.path() / "script";
  std::ofstream(script) << "#!/bin/sh\nexec true\n";
  auto not_elf = ReadGoBuildInfo(script);
  REQUIRE_FALSE(not_elf.ok());
  CHECK(not_elf.status().message() == script.string() + ": not a 64-bit little-endian ELF file");

  auto missing = ReadGoBuildInfo(dir.path() / "nope");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message() ==
        (dir.path() / "nope").string() + ": No such file or directory");

  // A real ELF without Go build info: this test binary.
  auto self = ReadGoBuildInfo("/proc/self/exe");
  REQUIRE_FALSE(self.ok());
  CHECK(self.status().message() == "/proc/self/exe: no .go.buildinfo section");
}

TEST_CASE("ParseGoBuildInfo rejects what is not Go build info", "[nvidia]") {
  CHECK(ParseGoBuildInfo("").status().message() == "no Go build info magic");
  CHECK(ParseGoBuildInfo(std::string("\xff Go buildinf:\x08\x02", 16)).status().message() ==
        "truncated build info");
  std::string old_format("\xff Go buildinf:\x08\x00", 16);
  old_format.resize(32, '\0');
  CHECK(ParseGoBuildInfo(old_format).status().message() ==
        "build info in the pre-1.18 pointer format");
  std::string long_string("\xff Go buildinf:\x08\x02", 16);
  long_string.resize(32, '\0');
  long_string +=
      "\x7f"
      "go1";  // a length beyond the data
  CHECK(ParseGoBuildInfo(long_string).status().message() == "truncated build info");
}

TEST_CASE("FindNvidiaPluginProcesses reads a fake procfs", "[nvidia]") {
  TempDir dir;
  FakeProc proc(dir.path() / "proc");
  proc.AddProcess(1, {"/sbin/init"}, {});
  const auto plugins = dir.path() / "device-plugins";
  proc.AddProcess(4242, {"nvidia-device-plugin", "--mofed-enabled"}, {"PATH=/bin"}, "v0.19.3",
                  plugins / "nvidia-gpu.sock");
  proc.AddProcess(77, {"/usr/bin/nvidia-device-plugin"}, {"MOFED_ENABLED=false"});
  std::filesystem::create_directories(dir.path() / "proc/sys");  // not a process

  auto scan = FindNvidiaPluginProcesses(proc.root(), plugins);
  REQUIRE(scan.ok());
  const std::vector<NvidiaPluginProcess>* found = &scan->processes;
  REQUIRE(found->size() == 2);
  CHECK((*found)[0].pid == 77);
  CHECK((*found)[0].mofed_flag == std::nullopt);
  CHECK((*found)[0].mofed_env == false);
  CHECK((*found)[0].environ_readable);
  CHECK((*found)[0].version.empty());
  CHECK((*found)[0].plugin_socket.empty());
  CHECK((*found)[0].untrusted ==
        (proc.root() / "77/net/unix").string() + ": no listening nvidia-*.sock socket");
  CHECK((*found)[1].pid == 4242);
  CHECK((*found)[1].plugin_socket == (plugins / "nvidia-gpu.sock").string());
  CHECK((*found)[1].mofed_flag == true);
  CHECK((*found)[1].mofed_env == std::nullopt);
  CHECK((*found)[1].version == "v0.19.3");

  auto missing = FindNvidiaPluginProcesses(dir.path() / "nope", plugins);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message() ==
        (dir.path() / "nope").string() + ": No such file or directory");
}

namespace {

// A real process named nvidia-device-plugin (argv[0]) with --mofed-enabled
// that listens on a unix socket at `socket`: /bin/sh holding the socket,
// reading its stdin until the object goes.
class NamedProcess {
 public:
  explicit NamedProcess(const std::filesystem::path& socket) {
    std::filesystem::create_directories(socket.parent_path());
    int s = ::socket(AF_UNIX, SOCK_STREAM, 0);  // inherited by the child
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket.c_str(), sizeof addr.sun_path - 1);
    REQUIRE(s >= 0);
    REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(s, 4) == 0);
    int in[2], out[2];
    REQUIRE(::pipe2(in, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::execl("/bin/sh", "nvidia-device-plugin", "-c", "echo ready; read x", "sh",
              "--mofed-enabled", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(s);
    ::close(in[0]);
    ::close(out[1]);
    stdin_ = in[1];
    // "ready" once the shell runs (the exec is done).
    pollfd p{out[0], POLLIN, 0};
    char buf[16] = {};
    REQUIRE(::poll(&p, 1, 10000) == 1);
    REQUIRE(::read(out[0], buf, sizeof buf - 1) > 0);
    ::close(out[0]);
    CHECK(std::string(buf) == "ready\n");
  }
  ~NamedProcess() {
    ::close(stdin_);  // "read x" ends, the shell exits
    ::waitpid(pid_, nullptr, 0);
  }
  int pid() const { return pid_; }

 private:
  int pid_ = -1;
  int stdin_ = -1;
};

}  // namespace

TEST_CASE("A real nvidia-device-plugin process is trusted only when it holds the plugin's socket",
          "[nvidia][concurrency]") {
  TempDir dir;
  const auto plugins = dir.path() / "device-plugins";
  NamedProcess plugin(plugins / "nvidia-gpu.sock");
  // A tenant's process with the same name and flag and its own socket of
  // the same name elsewhere.
  NamedProcess tenant(dir.path() / "tenant/nvidia-gpu.sock");
  if (::getuid() != 0) {
    WARN("not root: the scan reads only root's processes, so none of these");
    return;
  }
  auto found = FindNvidiaPluginProcesses("/proc", plugins);
  REQUIRE(found.ok());
  std::map<int, NvidiaPluginProcess> by_pid;
  for (const auto& p : found->processes) by_pid[p.pid] = p;
  REQUIRE(by_pid.count(plugin.pid()));
  REQUIRE(by_pid.count(tenant.pid()));
  CHECK(by_pid[plugin.pid()].mofed_flag == true);
  CHECK(by_pid[plugin.pid()].plugin_socket == (plugins / "nvidia-gpu.sock").string());
  CHECK(by_pid[tenant.pid()].mofed_flag == true);
  CHECK(by_pid[tenant.pid()].plugin_socket.empty());
  // It sees the plugin's socket in its network namespace, but does not hold it.
  CHECK(by_pid[tenant.pid()].untrusted ==
        "holds no socket of " + (plugins / "nvidia-gpu.sock").string());
}

TEST_CASE("A scan reads only root's nvidia-device-plugin processes, at most its cap of them",
          "[nvidia]") {
  TempDir dir;
  FakeProc proc(dir.path() / "proc");
  const auto plugins = dir.path() / "device-plugins";
  // A tenant's process with the name and the flag.
  proc.AddProcess(10, {"nvidia-device-plugin", "--mofed-enabled"}, {}, "", {}, 1000);
  // A setuid-root one: effective UID 0, real UID 1000.
  proc.AddNamedProcess(11, {"nvidia-device-plugin"}, 0);
  efa::testing::WriteFileAtomically(dir.path() / "proc/11/status",
                                    "Name:\tnvidia-device-p\nUid:\t1000\t0\t0\t0\n");
  for (int pid = 20; pid < 30; ++pid) proc.AddNamedProcess(pid, {"nvidia-device-plugin"}, 0);

  auto capped = FindNvidiaPluginProcesses(proc.root(), plugins, {.max_candidates = 3});
  REQUIRE(capped.ok());
  CHECK(capped->not_root == 2);
  CHECK(capped->processes.size() == 3);
  CHECK(capped->over_cap == 7);
  CHECK(capped->incomplete ==
        proc.root().string() +
            ": 7 more nvidia-device-plugin processes run by root than the 3 read");
  for (const NvidiaPluginProcess& p : capped->processes) CHECK(p.pid >= 20);

  auto all = FindNvidiaPluginProcesses(proc.root(), plugins, {.max_candidates = 10});
  REQUIRE(all.ok());
  CHECK(all->processes.size() == 10);
  CHECK(all->over_cap == 0);
  CHECK(all->incomplete.empty());
}

TEST_CASE("The plugin's command line beyond its bound makes the scan incomplete", "[nvidia]") {
  TempDir dir;
  FakeProc proc(dir.path() / "proc");
  const auto plugins = dir.path() / "device-plugins";
  const std::string flags(70000, 'x');
  proc.AddProcess(42, {"nvidia-device-plugin", flags, "--mofed-enabled"}, {}, "",
                  plugins / "nvidia-gpu.sock");
  auto scan = FindNvidiaPluginProcesses(proc.root(), plugins);
  REQUIRE(scan.ok());
  CHECK(scan->processes.empty());
  CHECK(scan->incomplete == (proc.root() / "42/cmdline").string() +
                                ": larger than 64 KiB (process 42 holds " +
                                (plugins / "nvidia-gpu.sock").string() + ")");
}

TEST_CASE("A scan past its deadline stops, naming the procfs", "[nvidia]") {
  TempDir dir;
  FakeProc proc(dir.path() / "proc");
  proc.AddNamedProcess(20, {"nvidia-device-plugin"}, 0);
  auto scan = FindNvidiaPluginProcesses(proc.root(), dir.path() / "device-plugins",
                                        {.deadline = std::chrono::steady_clock::now()});
  REQUIRE_FALSE(scan.ok());
  CHECK(scan.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(scan.status().message() ==
        proc.root().string() + ": the scan stopped at its time box after 0 entries");
}
