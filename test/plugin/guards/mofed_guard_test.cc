#include "plugin/guards/mofed_guard.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "test/plugin/guard_fakes.h"

using namespace efa::plugin;
using efa::testing::EfaAllocResp;
using efa::testing::FakeCheckpointEntry;
using efa::testing::FakeCheckpointJson;
using efa::testing::FakeProc;
using efa::testing::NvidiaAllocResp;
using efa::testing::TempDir;
using efa::testing::WriteFileAtomically;
using Findings = std::vector<std::string>;

namespace {

constexpr char kPath[] = "/k/device-plugins/kubelet_internal_checkpoint";

FakeCheckpointEntry Gpu(const std::string& pod, bool env, bool cdi) {
  return {pod,
          "cuda",
          "nvidia.com/gpu",
          {{0, {"GPU-" + pod}}},
          NvidiaAllocResp({"GPU-" + pod}, env, cdi)};
}
FakeCheckpointEntry Efa(const std::string& pod) {
  return {pod, "cuda", "vpc.amazonaws.com/efa", {{0, {"rdmap79s0"}}}, EfaAllocResp("rdmap79s0", 0)};
}

MofedEvidence FromJson(const std::string& json) {
  return MofedFromCheckpoint(ParseCheckpoint(json, kPath), kPath);
}

}  // namespace

TEST_CASE("The checkpoint without GPU entries shows no MOFED", "[mofed]") {
  auto evidence = FromJson(FakeCheckpointJson({Efa("p1")}));
  CHECK(evidence.state == MofedState::kOff);
  CHECK(evidence.findings == Findings{std::string(kPath) + ": no NVIDIA containers"});
}

TEST_CASE("GPU entries without MOFED show no MOFED", "[mofed]") {
  auto evidence =
      FromJson(FakeCheckpointJson({Gpu("p1", false, false), Efa("p1"), Gpu("p2", false, false)}));
  CHECK(evidence.state == MofedState::kOff);
  CHECK(evidence.findings ==
        Findings{std::string(kPath) +
                 ": 2 NVIDIA containers, none with NVIDIA_MOFED or the MOFED CDI device"});
}

TEST_CASE("A GPU entry with NVIDIA_MOFED=enabled shows MOFED on", "[mofed]") {
  auto evidence = FromJson(FakeCheckpointJson({Gpu("p1", false, false), Gpu("p2", true, false)}));
  CHECK(evidence.state == MofedState::kOn);
  CHECK(evidence.findings ==
        Findings{std::string(kPath) +
                 ": pod p2 container \"cuda\" (nvidia.com/gpu) has env NVIDIA_MOFED=enabled"});
}

TEST_CASE("A GPU entry with the MOFED CDI device shows MOFED on", "[mofed]") {
  auto evidence = FromJson(FakeCheckpointJson({Gpu("p3", false, true)}));
  CHECK(evidence.state == MofedState::kOn);
  CHECK(evidence.findings ==
        Findings{std::string(kPath) + ": pod p3 container \"cuda\" (nvidia.com/gpu) has CDI device "
                                      "k8s.device-plugin.nvidia.com/mofed=all"});
}

TEST_CASE("MofedInAllocResponse also reads CDI annotations and shared GPU resources", "[mofed]") {
  v1beta1::ContainerAllocateResponse resp;
  (*resp.mutable_annotations())["cdi.k8s.io/nvidia-device-plugin_uuid"] =
      "k8s.device-plugin.nvidia.com/gpu=GPU-1,k8s.device-plugin.nvidia.com/mofed=all";
  CHECK(
      MofedInAllocResponse(resp) ==
      "CDI annotation cdi.k8s.io/nvidia-device-plugin_uuid=k8s.device-plugin.nvidia.com/mofed=all");
  CHECK(MofedInAllocResponse(v1beta1::ContainerAllocateResponse{}) == std::nullopt);

  FakeCheckpointEntry shared = Gpu("p4", true, false);
  shared.resource = "nvidia.com/gpu.shared";
  CHECK(FromJson(FakeCheckpointJson({shared})).state == MofedState::kOn);
  // An env var of another resource's plugin is not the NVIDIA plugin's doing.
  FakeCheckpointEntry other = Gpu("p5", true, false);
  other.resource = "example.com/gpu";
  CHECK(FromJson(FakeCheckpointJson({other})).state == MofedState::kOff);
}

TEST_CASE("Many MOFED containers are summarised after three", "[mofed]") {
  std::vector<FakeCheckpointEntry> entries;
  for (int i = 0; i < 5; ++i) entries.push_back(Gpu("p" + std::to_string(i), true, false));
  auto evidence = FromJson(FakeCheckpointJson(entries));
  CHECK(evidence.state == MofedState::kOn);
  REQUIRE(evidence.findings.size() == 4);
  CHECK(evidence.findings[3] == std::string(kPath) + ": and 2 more NVIDIA containers so");
}

TEST_CASE("A corrupt checkpoint makes the MOFED state unknown, a missing one does not", "[mofed]") {
  auto truncated = FromJson("{\"Data\":{");
  CHECK(truncated.state == MofedState::kUnknown);
  CHECK(truncated.findings ==
        Findings{std::string(kPath) +
                 ":1:10: truncated JSON: syntax error while parsing object key - unexpected end "
                 "of input; expected string literal"});

  TempDir dir;
  auto missing = MofedFromCheckpoint(ReadCheckpoint(dir.path() / "cp"), dir.path() / "cp");
  CHECK(missing.state == MofedState::kOff);
  CHECK(missing.findings == Findings{(dir.path() / "cp").string() + ": absent"});
}

TEST_CASE("The NVIDIA MOFED CDI spec in any spec directory shows MOFED on", "[mofed]") {
  TempDir dir;
  const auto etc = dir.path() / "etc/cdi", run = dir.path() / "var/run/cdi";
  std::filesystem::create_directories(etc);
  auto none = MofedFromCdiSpecDirs({etc, run});
  CHECK(none.state == MofedState::kOff);
  CHECK(none.findings ==
        Findings{"no NVIDIA MOFED CDI spec in " + etc.string() + ", " + run.string()});

  WriteFileAtomically(run / "k8s.device-plugin.nvidia.com-mofed.json", "{}");
  auto json = MofedFromCdiSpecDirs({etc, run});
  CHECK(json.state == MofedState::kOn);
  CHECK(json.findings == Findings{(run / "k8s.device-plugin.nvidia.com-mofed.json").string() +
                                  ": the NVIDIA MOFED CDI spec is installed"});

  std::filesystem::remove(run / "k8s.device-plugin.nvidia.com-mofed.json");
  WriteFileAtomically(etc / "k8s.device-plugin.nvidia.com-mofed.yaml", "cdiVersion: 0.5.0\n");
  CHECK(MofedFromCdiSpecDirs({etc, run}).state == MofedState::kOn);
  // Other NVIDIA specs are not MOFED.
  std::filesystem::remove(etc / "k8s.device-plugin.nvidia.com-mofed.yaml");
  WriteFileAtomically(etc / "k8s.device-plugin.nvidia.com-gpu.json", "{}");
  CHECK(MofedFromCdiSpecDirs({etc, run}).state == MofedState::kOff);
}

TEST_CASE("An nvidia-device-plugin process with the flag shows MOFED on, without it off",
          "[mofed]") {
  TempDir dir;
  FakeProc proc(dir.path() / "proc");
  const auto plugins = dir.path() / "device-plugins";
  const auto socket = plugins / "nvidia-gpu.sock";
  proc.AddProcess(1, {"/sbin/init"}, {});
  auto report = [&] {
    return MofedFromProcesses(FindNvidiaPluginProcesses(proc.root(), plugins), proc.root());
  };
  auto none = report();
  CHECK(none.state == MofedState::kOff);
  CHECK(none.findings ==
        Findings{"no nvidia-device-plugin process run by root under " + proc.root().string()});

  proc.AddProcess(4242, {"nvidia-device-plugin", "--fail-on-init-error=false"}, {"PATH=/bin"}, "",
                  socket);
  auto without = report();
  CHECK(without.state == MofedState::kOff);
  CHECK(without.findings ==
        Findings{"process 4242 (nvidia-device-plugin version unknown): MOFED not set by flag or "
                 "environment"});

  proc.AddProcess(4242, {"nvidia-device-plugin", "--mofed-enabled"}, {"PATH=/bin"}, "", socket);
  auto with_flag = report();
  CHECK(with_flag.state == MofedState::kOn);
  CHECK(with_flag.findings ==
        Findings{"process 4242 (nvidia-device-plugin version unknown): command line sets "
                 "--mofed-enabled=true"});

  proc.AddProcess(4242, {"nvidia-device-plugin"}, {"MOFED_ENABLED=true"}, "v0.19.3", socket);
  auto with_env = report();
  CHECK(with_env.state == MofedState::kOn);
  CHECK(with_env.findings ==
        Findings{"process 4242 (nvidia-device-plugin v0.19.3): environment sets "
                 "MOFED_ENABLED=true"});

  proc.AddProcess(4242, {"nvidia-device-plugin"}, {}, "v0.19.0", socket);
  auto by_default = report();
  CHECK(by_default.state == MofedState::kOn);
  CHECK(by_default.findings ==
        Findings{"process 4242 (nvidia-device-plugin v0.19.0): MOFED is on by default in v0.19.0"});

  proc.AddProcess(4242, {"nvidia-device-plugin", "--mofed-enabled=false"}, {}, "v0.19.0", socket);
  auto disabled = report();
  CHECK(disabled.state == MofedState::kOff);
  CHECK(disabled.findings ==
        Findings{"process 4242 (nvidia-device-plugin v0.19.0): command line sets "
                 "--mofed-enabled=false"});

  // Anyone can name a process nvidia-device-plugin: one that does not hold
  // the plugin's socket is no evidence.
  proc.AddProcess(4242, {"nvidia-device-plugin", "--mofed-enabled"}, {"MOFED_ENABLED=true"});
  auto impostor = report();
  CHECK(impostor.state == MofedState::kOff);
  CHECK(impostor.findings ==
        Findings{"process 4242 (nvidia-device-plugin version unknown): not the NVIDIA device "
                 "plugin (" +
                 (proc.root() / "4242/net/unix").string() +
                 ": no listening nvidia-*.sock socket); ignored"});
}

TEST_CASE("A process that binds its own nvidia-gpu.sock is not the NVIDIA device plugin",
          "[mofed]") {
  TempDir dir;
  FakeProc proc(dir.path() / "proc");
  const auto plugins = dir.path() / "device-plugins";
  proc.AddProcess(77, {"nvidia-device-plugin"}, {}, "",
                  plugins / "nvidia-gpu.sock");  // the real one
  auto report = [&] {
    return MofedFromProcesses(FindNvidiaPluginProcesses(proc.root(), plugins), proc.root());
  };
  // A tenant in its own root binds <its root>/evil/nvidia-gpu.sock, where
  // /evil is an absolute symlink to the host's device-plugins path: looked
  // up from outside, the path would lead to the real socket, but inside
  // the tenant's root it is the tenant's own.
  const auto tenant = dir.path() / "tenant-root";
  std::filesystem::create_directories(tenant / "var");
  std::filesystem::create_symlink(plugins, tenant / "evil");
  proc.AddProcess(4242, {"nvidia-device-plugin", "--mofed-enabled"}, {});
  const auto pid_dir = proc.root() / "4242";
  std::filesystem::create_symlink(tenant, pid_dir / "root");
  std::filesystem::create_symlink("socket:[555]", pid_dir / "fd/3");
  WriteFileAtomically(pid_dir / "net/unix",
                      "Num       RefCount Protocol Flags    Type St Inode Path\n"
                      "0000000000000000: 00000002 00000000 00010000 0001 01 555 "
                      "/evil/nvidia-gpu.sock\n");
  auto evidence = report();
  CHECK(evidence.state == MofedState::kOff);
  CHECK(evidence.findings ==
        Findings{"process 77 (nvidia-device-plugin version unknown): MOFED not set by flag or "
                 "environment",
                 "process 4242 (nvidia-device-plugin version unknown): not the NVIDIA device "
                 "plugin (its nvidia-*.sock sockets are not the ones in " +
                     plugins.string() + "); ignored"});
  // The real plugin's socket named by a process that does not hold it.
  WriteFileAtomically(pid_dir / "net/unix",
                      "Num       RefCount Protocol Flags    Type St Inode Path\n"
                      "0000000000000000: 00000002 00000000 00010000 0001 01 100077 " +
                          (plugins / "nvidia-gpu.sock").string() + "\n");
  std::filesystem::remove(pid_dir / "root");
  std::filesystem::create_symlink("/", pid_dir / "root");
  CHECK(report().findings[1] ==
        "process 4242 (nvidia-device-plugin version unknown): not the NVIDIA device plugin "
        "(holds no socket of " +
            (plugins / "nvidia-gpu.sock").string() + "); ignored");
}

TEST_CASE("Without a visible procfs the process source is only a finding", "[mofed]") {
  TempDir dir;
  auto evidence = MofedFromProcesses(
      FindNvidiaPluginProcesses(dir.path() / "proc", dir.path() / "device-plugins"),
      dir.path() / "proc");
  CHECK(evidence.state == MofedState::kOff);
  CHECK(evidence.findings ==
        Findings{(dir.path() / "proc").string() + ": No such file or directory"});
}

TEST_CASE("CombineMofedEvidence: on beats unknown beats off, and the deciding sources are evidence",
          "[mofed]") {
  const MofedEvidence off{MofedState::kOff, {"off"}, {}};
  const MofedEvidence on{MofedState::kOn, {"on"}, {}};
  const MofedEvidence unknown{MofedState::kUnknown, {"unknown"}, {}};
  CHECK(CombineMofedEvidence({}).state == MofedState::kOff);
  auto a = CombineMofedEvidence({off, unknown});
  CHECK(a.state == MofedState::kUnknown);
  CHECK(a.evidence == Findings{"unknown"});
  CHECK(a.other == Findings{"off"});
  auto b = CombineMofedEvidence({unknown, off, on});
  CHECK(b.state == MofedState::kOn);
  CHECK(b.evidence == Findings{"on"});
  CHECK(b.other == Findings{"unknown", "off"});
}

TEST_CASE("MofedGuard reads every configured source", "[mofed]") {
  TempDir dir;
  const auto checkpoint = dir.path() / "kubelet/device-plugins/kubelet_internal_checkpoint";
  const auto cdi = dir.path() / "etc/cdi";
  FakeProc proc(dir.path() / "proc");
  MofedGuard guard({checkpoint, {cdi}, proc.root(), checkpoint.parent_path()});
  auto absent = guard.Check();
  CHECK(absent.state == MofedState::kOff);
  CHECK(absent.evidence ==
        Findings{checkpoint.string() + ": absent", "no NVIDIA MOFED CDI spec in " + cdi.string(),
                 "no nvidia-device-plugin process run by root under " + proc.root().string()});

  WriteFileAtomically(checkpoint, "{\"Data\":{\"PodDeviceEntries\":[{\"AllocResp\":\"%%\"}]}}");
  auto unknown = guard.Check();
  CHECK(unknown.state == MofedState::kUnknown);
  CHECK(unknown.evidence[0] ==
        checkpoint.string() +
            ": Data.PodDeviceEntries[0] (pod , container \"\", ): AllocResp is not valid base64");

  proc.AddProcess(9, {"nvidia-device-plugin", "-mofed-enabled=true"}, {}, "",
                  checkpoint.parent_path() / "nvidia-gpu.sock");
  auto on = guard.Check();
  CHECK(on.state == MofedState::kOn);
  CHECK(on.evidence[0] ==
        "process 9 (nvidia-device-plugin version unknown): command line sets "
        "--mofed-enabled=true");

  CHECK(MofedGuard({}).Check().state == MofedState::kOff);  // nothing configured
}

TEST_CASE("MOFED policies parse by name", "[mofed]") {
  CHECK(ParseMofedPolicy("warn").value() == MofedPolicy::kWarn);
  CHECK(ParseMofedPolicy("protect").value() == MofedPolicy::kProtect);
  CHECK(ParseMofedPolicy("off").value() == MofedPolicy::kOff);
  CHECK(ParseMofedPolicy("block").status().message() ==
        "mofed policy \"block\": expected warn, protect or off");
  CHECK(MofedPolicyName(MofedPolicy::kProtect) == "protect");
  CHECK(MofedStateName(MofedState::kUnknown) == "unknown");
}

TEST_CASE(
    "10,000 fake nvidia-device-plugin processes do not delay a guard pass beyond its time box",
    "[mofed]") {
  TempDir dir;
  FakeProc proc(dir.path() / "proc");
  const auto plugins = dir.path() / "device-plugins";
  // 9,995 of tenants, 4 of root without the plugin's socket, then the
  // plugin with MOFED on: 5 candidates, within the cap.
  const std::vector<std::string> fake = {"nvidia-device-plugin", "--mofed-enabled"};
  for (int pid = 1000; pid < 10995; ++pid) proc.AddNamedProcess(pid, fake, 1000);
  for (int pid = 20000; pid < 20004; ++pid) proc.AddNamedProcess(pid, fake, 0);
  proc.AddProcess(30000, {"/usr/bin/nvidia-device-plugin", "--mofed-enabled"}, {}, "v0.17.0",
                  plugins / "nvidia-gpu.sock");
  // What one step past the deadline may take (a file read) on a loaded machine.
  constexpr auto kSlack = std::chrono::milliseconds(250);

  const auto start = std::chrono::steady_clock::now();
  const MofedReport whole = MofedGuard({{}, {}, proc.root(), plugins}).Check();
  const auto took = std::chrono::steady_clock::now() - start;
  INFO("the pass took " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                        << " ms");
  CHECK(took < kMofedCheckTimeBox + kSlack);
  CHECK(whole.incomplete.empty());
  CHECK(whole.state == MofedState::kOn);
  auto has = [&](const std::string& finding) {
    return std::find(whole.evidence.begin(), whole.evidence.end(), finding) != whole.evidence.end();
  };
  CHECK(
      has("process 30000 (nvidia-device-plugin v0.17.0): command line sets "
          "--mofed-enabled=true"));
  CHECK(has("9995 nvidia-device-plugin processes not run by root under " + proc.root().string() +
            ": ignored"));

  // A time box far shorter than the scan: it stops there, and says so.
  const auto box = std::chrono::milliseconds(2);
  const auto cut_start = std::chrono::steady_clock::now();
  const MofedReport cut = MofedGuard({{}, {}, proc.root(), plugins, box}).Check();
  CHECK(std::chrono::steady_clock::now() - cut_start < box + kSlack);
  CHECK(cut.incomplete.starts_with(proc.root().string() +
                                   ": the scan stopped at its time box after "));
}

TEST_CASE("A checkpoint over its size bound proves nothing and names itself", "[mofed]") {
  TempDir dir;
  const auto checkpoint = dir.path() / "kubelet_internal_checkpoint";
  { std::ofstream out(checkpoint); }
  std::filesystem::resize_file(checkpoint, (size_t{64} << 20) + 1);
  const MofedReport report = MofedGuard({checkpoint, {}, {}, {}}).Check();
  CHECK(report.incomplete == checkpoint.string() + ": larger than 64 MiB");
}
