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

TEST_CASE("The NVIDIA MOFED CDI spec in any spec directory is a hint, not MOFED on", "[mofed]") {
  TempDir dir;
  const auto etc = dir.path() / "etc/cdi", run = dir.path() / "var/run/cdi";
  std::filesystem::create_directories(etc);
  auto none = MofedFromCdiSpecDirs({etc, run});
  CHECK(none.state == MofedState::kOff);
  CHECK(none.findings ==
        Findings{"no NVIDIA MOFED CDI spec in " + etc.string() + ", " + run.string()});

  WriteFileAtomically(run / "k8s.device-plugin.nvidia.com-mofed.json", "{}");
  // Left behind when MOFED was turned off, it proves nothing by itself.
  auto json = MofedFromCdiSpecDirs({etc, run});
  CHECK(json.state == MofedState::kOff);
  CHECK(json.findings.empty());
  CHECK(json.hints == Findings{(run / "k8s.device-plugin.nvidia.com-mofed.json").string() +
                               ": the NVIDIA MOFED CDI spec is installed (a hint: the NVIDIA "
                               "device plugin has or had MOFED on; no container counted was "
                               "given it)"});
  CHECK(CombineMofedEvidence({json}).hints == json.hints);
  CHECK(CombineMofedEvidence({json}).state == MofedState::kOff);

  std::filesystem::remove(run / "k8s.device-plugin.nvidia.com-mofed.json");
  WriteFileAtomically(etc / "k8s.device-plugin.nvidia.com-mofed.yaml", "cdiVersion: 0.5.0\n");
  CHECK(MofedFromCdiSpecDirs({etc, run}).hints.size() == 1);
  // Other NVIDIA specs are not MOFED.
  std::filesystem::remove(etc / "k8s.device-plugin.nvidia.com-mofed.yaml");
  WriteFileAtomically(etc / "k8s.device-plugin.nvidia.com-gpu.json", "{}");
  CHECK(MofedFromCdiSpecDirs({etc, run}).hints.empty());
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
  const MofedEvidence off{MofedState::kOff, {"off"}, {}, {}};
  const MofedEvidence on{MofedState::kOn, {"on"}, {}, {}};
  const MofedEvidence unknown{MofedState::kUnknown, {"unknown"}, {}, {}};
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
  const std::chrono::steady_clock::time_point t0;
  auto absent = guard.Check(t0);
  CHECK(absent.state == MofedState::kOff);
  CHECK(absent.evidence ==
        Findings{checkpoint.string() + ": absent", "no NVIDIA MOFED CDI spec in " + cdi.string(),
                 "no nvidia-device-plugin process run by root under " + proc.root().string()});

  WriteFileAtomically(checkpoint, "{\"Data\":{\"PodDeviceEntries\":[{\"AllocResp\":\"%%\"}]}}");
  auto unknown = guard.Check(t0);
  CHECK(unknown.state == MofedState::kUnknown);
  CHECK(unknown.evidence[0] ==
        checkpoint.string() +
            ": Data.PodDeviceEntries[0] (pod , container \"\", ): AllocResp is not valid base64");

  proc.AddProcess(9, {"nvidia-device-plugin", "-mofed-enabled=true"}, {}, "",
                  checkpoint.parent_path() / "nvidia-gpu.sock");
  auto on = guard.Check(t0);
  CHECK(on.state == MofedState::kOn);
  CHECK(on.evidence[0] ==
        "process 9 (nvidia-device-plugin version unknown): command line sets "
        "--mofed-enabled=true");

  CHECK(MofedGuard({}).Check(t0).state == MofedState::kOff);  // nothing configured
}

namespace {

// A List answer: pods of containers, each with its devices of one resource.
struct ListedContainer {
  std::string pod, container, resource;
  std::vector<std::string> ids;
};
v1::ListPodResourcesResponse ListOf(const std::vector<ListedContainer>& containers) {
  v1::ListPodResourcesResponse list;
  for (const ListedContainer& c : containers) {
    v1::PodResources* pod = list.add_pod_resources();
    pod->set_name(c.pod);
    pod->set_namespace_("default");
    v1::ContainerResources* container = pod->add_containers();
    container->set_name(c.container);
    // As kubelet 1.20 answers: one ContainerDevices per NUMA node.
    for (const std::string& id : c.ids) {
      v1::ContainerDevices* d = container->add_devices();
      d->set_resource_name(c.resource);
      d->add_device_ids(id);
    }
  }
  return list;
}

KubeletCheckpoint Parsed(const std::vector<FakeCheckpointEntry>& entries) {
  return ParseCheckpoint(FakeCheckpointJson(entries), kPath).value();
}

}  // namespace

TEST_CASE("ListedEntries matches checkpoint entries to listed containers by their devices",
          "[mofed]") {
  FakeCheckpointEntry init = Gpu("p1", true, false);
  init.container = "fetch";  // an init container: List leaves it out
  init.device_ids = {{0, {"GPU-init"}}};
  const KubeletCheckpoint checkpoint = Parsed({
      Gpu("p1", true, false),                                                  // 0: listed
      init,                                                                    // 1: its pod is
      Gpu("p2", true, false),                                                  // 2: gone
      {"p3", "cuda", "nvidia.com/gpu", {{0, {"GPU-a"}}, {1, {"GPU-b"}}}, {}},  // 3: half listed
  });
  CHECK(ListedEntries(checkpoint, ListOf({{"train", "cuda", "nvidia.com/gpu", {"GPU-p1"}},
                                          {"other", "cuda", "nvidia.com/gpu", {"GPU-a"}},
                                          {"efa", "cuda", "vpc.amazonaws.com/efa", {"GPU-p2"}}})) ==
        std::set<size_t>{0, 1});
  CHECK(ListedEntries(checkpoint, ListOf({{"x", "c", "nvidia.com/gpu", {"GPU-b", "GPU-a"}}})) ==
        std::set<size_t>{3});
}

TEST_CASE(
    "A MOFED entry stops counting only once successful, non-empty answers leave it out over "
    "the confirmation time",
    "[mofed]") {
  using std::chrono::seconds;
  const KubeletCheckpoint checkpoint = Parsed({Gpu("p1", false, false), Gpu("p2", true, false)});
  const auto& mofed = checkpoint.entries[1];
  const std::chrono::steady_clock::time_point t0;
  const auto other = ListOf({{"train", "cuda", "nvidia.com/gpu", {"GPU-p1"}}});
  const auto both = ListOf({{"train", "cuda", "nvidia.com/gpu", {"GPU-p1"}},
                            {"mofed", "cuda", "nvidia.com/gpu", {"GPU-p2"}}});
  GoneContainers gone(seconds(30));
  auto state = [&] { return MofedFromCheckpoint(checkpoint, kPath, &gone).state; };

  gone.Update(checkpoint, other, t0);
  CHECK_FALSE(gone.GoneFor(mofed));
  CHECK(state() == MofedState::kOn);
  // Neither an error nor an empty answer (a restarted kubelet) tells
  // anything: not gone, however late.
  gone.Update(checkpoint, absl::UnavailableError("/k/pod-resources/kubelet.sock: down"),
              t0 + seconds(40));
  CHECK_FALSE(gone.GoneFor(mofed));
  CHECK(MofedFromCheckpoint(checkpoint, kPath, &gone).findings ==
        Findings{std::string(kPath) +
                     ": pod p2 container \"cuda\" (nvidia.com/gpu) has env NVIDIA_MOFED=enabled",
                 "cannot tell which of these containers still run (/k/pod-resources/kubelet.sock: "
                 "down): each counts"});
  gone.Update(checkpoint, v1::ListPodResourcesResponse(), t0 + seconds(50));
  CHECK_FALSE(gone.GoneFor(mofed));
  CHECK(state() == MofedState::kOn);
  // Listed again in between: the absence starts over.
  gone.Update(checkpoint, both, t0 + seconds(55));
  gone.Update(checkpoint, other, t0 + seconds(60));
  gone.Update(checkpoint, other, t0 + seconds(89));
  CHECK_FALSE(gone.GoneFor(mofed));
  CHECK(state() == MofedState::kOn);
  // Left out by two answers 30 s apart: gone.
  gone.Update(checkpoint, other, t0 + seconds(90));
  CHECK(gone.GoneFor(mofed) == std::chrono::milliseconds(30000));
  CHECK_FALSE(gone.GoneFor(checkpoint.entries[0]));
  const MofedEvidence evidence = MofedFromCheckpoint(checkpoint, kPath, &gone);
  CHECK(evidence.state == MofedState::kOff);
  CHECK(evidence.findings ==
        Findings{std::string(kPath) +
                     ": 1 NVIDIA container, none with NVIDIA_MOFED or the MOFED CDI device",
                 std::string(kPath) +
                     ": pod p2 container \"cuda\" (nvidia.com/gpu) has env NVIDIA_MOFED=enabled, "
                     "but pod-resources has not listed it for 30 s: gone, ignored"});
  // Without pod-resources every entry counts, as before.
  CHECK(MofedFromCheckpoint(checkpoint, kPath).state == MofedState::kOn);
}

TEST_CASE("MOFED policies have one name each", "[mofed]") {
  CHECK(MofedPolicyNames().size() == 3);
  CHECK(MofedPolicyName(MofedPolicy::kWarn) == "warn");
  CHECK(MofedPolicyName(MofedPolicy::kProtect) == "protect");
  CHECK(MofedPolicyName(MofedPolicy::kOff) == "off");
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

  // With the default box the pass ends within it (done or cut short: an
  // optimized build scans all 10,000 in about 200 ms, a sanitized one may
  // not).
  const auto start = std::chrono::steady_clock::now();
  const MofedReport boxed =
      MofedGuard({{}, {}, proc.root(), plugins}).Check(std::chrono::steady_clock::now());
  const auto took = std::chrono::steady_clock::now() - start;
  INFO("the pass took " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                        << " ms" << (boxed.incomplete.empty() ? "" : " (cut short)"));
  CHECK(took < kMofedCheckTimeBox + kSlack);
  CHECK((boxed.state == MofedState::kOn || !boxed.incomplete.empty()));

  // Given the time, the scan finds the root plugin among them.
  const MofedReport whole =
      MofedGuard({{}, {}, proc.root(), plugins, {}, kMofedGoneAfter, std::chrono::seconds(60)})
          .Check(std::chrono::steady_clock::now());
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
  const MofedReport cut = MofedGuard({{}, {}, proc.root(), plugins, {}, kMofedGoneAfter, box})
                              .Check(std::chrono::steady_clock::now());
  CHECK(std::chrono::steady_clock::now() - cut_start < box + kSlack);
  CHECK(cut.incomplete.starts_with(proc.root().string() +
                                   ": the scan stopped at its time box after "));
}

TEST_CASE("A checkpoint over its size bound proves nothing and names itself", "[mofed]") {
  TempDir dir;
  const auto checkpoint = dir.path() / "kubelet_internal_checkpoint";
  { std::ofstream out(checkpoint); }
  std::filesystem::resize_file(checkpoint, (size_t{64} << 20) + 1);
  const MofedReport report =
      MofedGuard({checkpoint, {}, {}, {}}).Check(std::chrono::steady_clock::now());
  CHECK(report.incomplete == checkpoint.string() + ": larger than 64 MiB");
}
