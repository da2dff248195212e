// The guards in the running daemon, against the fake kubelet over real unix
// sockets: what the kubelet sees under each policy.
#include <fcntl.h>
#include <stdio.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "plugin/daemon.h"
#include "test/fake_kubelet/fake_accelerator_plugin.h"
#include "test/fake_kubelet/fake_kubelet.h"
#include "test/plugin/guard_fakes.h"
#include "test/sim/sim_root.h"
#include "test/support/devices.h"
#include "test/support/test_node.h"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using namespace efa::plugin;
using efa::sim::SimRoot;
using efa::testing::AcceleratorKind;
using efa::testing::DaemonRun;
using efa::testing::FakeAcceleratorPlugin;
using efa::testing::FakeAcceleratorPluginOptions;
using efa::testing::FakeCheckpointEntry;
using efa::testing::FakeCheckpointJson;
using efa::testing::FakeDraDriver;
using efa::testing::FakeKubelet;
using efa::testing::FakeProc;
using efa::testing::NvidiaAllocResp;
using efa::testing::TestNode;
using efa::testing::WriteFileAtomically;

namespace {

using efa::testing::kDeadline;
using efa::testing::kEfa;

// A p4d.24xlarge (4 EFAs) with a fake kubelet, a fake procfs, CDI spec
// directories and a plugins registry; the daemon starts on StartDaemon().
class GuardedNode : public TestNode {
 public:
  // `fake_clock`: the daemon reads clock() instead of the real clock.
  explicit GuardedNode(MofedPolicy mofed, DraPolicy dra = DraPolicy::kYield,
                       std::chrono::milliseconds rescan = 10s, bool fake_clock = false)
      : TestNode({.machine = "p4d.24xlarge", .run = DaemonRun::kLater, .fake_clock = fake_clock}),
        proc_(sim().path() / "proc") {
    fs::create_directories(registry());
    fs::create_directories(cdi_dir());
    options().rescan_interval = rescan;
    options().guards.mofed_policy = mofed;
    options().guards.dra_policy = dra;
    options().guards.cdi_spec_dirs = {cdi_dir(), sim().path() / "etc/cdi"};
  }

  FakeProc& proc() { return proc_; }
  fs::path registry() const { return kubelet_dir() / "plugins_registry"; }

  // The kubelet owns the checkpoint (it rewrites it from memory on every
  // device list), so tests change it as a kubelet restart does: the new
  // kubelet process reads it back. The daemon registers again.
  void RestartKubeletWithCheckpoint(const std::string& json) {
    kubelet().Stop();
    WriteFileAtomically(checkpoint(), json);
    REQUIRE(kubelet().Start().ok());
  }

  bool WaitStatus(const std::function<bool(const GuardStatus&)>& pred) {
    return daemon().WaitForGuardStatusForTest(pred, kDeadline);
  }
  bool WaitMofed(MofedState state) {
    return WaitStatus([state](const GuardStatus& s) { return s.mofed.state == state; });
  }
  // Waits for a guard check after `checks` (one that saw a change).
  bool WaitCheckAfter(int checks) {
    return WaitStatus([checks](const GuardStatus& s) { return s.checks > checks; });
  }

 private:
  FakeProc proc_;
};

FakeCheckpointEntry Gpu(const std::string& pod, bool env, bool cdi) {
  return {pod,
          "cuda",
          "nvidia.com/gpu",
          {{0, {"GPU-" + pod}}},
          NvidiaAllocResp({"GPU-" + pod}, env, cdi)};
}

std::string NoMofed() { return FakeCheckpointJson({Gpu("p1", false, false)}); }
std::string MofedEnv() {
  return FakeCheckpointJson({Gpu("p1", false, false), Gpu("p2", true, false)});
}
std::string MofedCdi() { return FakeCheckpointJson({Gpu("p3", false, true)}); }

grpc::Status AllocateOne(FakeKubelet& kubelet, const std::string& id) {
  v1beta1::AllocateRequest request;
  request.add_container_requests()->add_devices_ids(id);
  v1beta1::AllocateResponse response;
  return kubelet.Allocate(kEfa, request, &response);
}

}  // namespace

TEST_CASE("Under MOFED policy protect every EFA turns Unhealthy while the conflict lasts",
          "[guards][daemon][concurrency]") {
  GuardedNode node(MofedPolicy::kProtect);
  node.RestartKubeletWithCheckpoint(NoMofed());
  node.StartDaemon();
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  REQUIRE(node.WaitAll("Healthy"));
  GuardStatus status = node.daemon().guard_status();
  CHECK(status.mofed.state == MofedState::kOff);
  CHECK(status.mofed.evidence[0] ==
        node.checkpoint().string() +
            ": 1 NVIDIA container, none with NVIDIA_MOFED or the MOFED CDI device");

  // on: a GPU container was given NVIDIA_MOFED=enabled.
  node.RestartKubeletWithCheckpoint(MofedEnv());
  REQUIRE(node.WaitAll("Unhealthy"));
  status = node.daemon().guard_status();
  CHECK(status.mofed.state == MofedState::kOn);
  CHECK(status.efas_held_unhealthy);
  CHECK(status.mofed.evidence[0] ==
        node.checkpoint().string() +
            ": pod p2 container \"cuda\" (nvidia.com/gpu) has env NVIDIA_MOFED=enabled");
  grpc::Status refused = AllocateOne(node.kubelet(), "rdmap16s27");
  CHECK(refused.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(refused.error_message() ==
        "device \"rdmap16s27\" is unhealthy: the NVIDIA device plugin has MOFED enabled (policy "
        "protect): " +
            status.mofed.evidence[0]);

  // off: the MOFED pod is gone.
  node.RestartKubeletWithCheckpoint(NoMofed());
  REQUIRE(node.WaitAll("Healthy"));
  CHECK_FALSE(node.daemon().guard_status().efas_held_unhealthy);
  CHECK(AllocateOne(node.kubelet(), "rdmap16s27").ok());

  // on again, through the CDI device this time.
  node.RestartKubeletWithCheckpoint(MofedCdi());
  REQUIRE(node.WaitAll("Unhealthy"));
  CHECK(node.daemon().guard_status().mofed.state == MofedState::kOn);
  // Never withdrawn, only unhealthy: the stream stays open.
  CHECK(node.kubelet().WaitForStreaming(kEfa, true, kDeadline));
}

TEST_CASE(
    "A GPU pod admitted from an NVIDIA plugin with MOFED on turns EFAs Unhealthy under "
    "protect until it is removed",
    "[guards][daemon][concurrency]") {
  GuardedNode node(MofedPolicy::kProtect);
  FakeAcceleratorPluginOptions options;
  options.kind = AcceleratorKind::kNvidiaGpu;
  options.device_plugin_dir = node.device_plugin_dir();
  options.mofed_enabled = true;  // as v0.19.0-v0.19.2 by default
  FakeAcceleratorPlugin gpus(*efa::sim::FindMachine("p4d.24xlarge"), options);
  REQUIRE(gpus.Start().ok());
  node.StartDaemon();
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  REQUIRE(node.WaitAll("Healthy"));
  REQUIRE(node.kubelet().WaitForStreaming("nvidia.com/gpu", true, kDeadline));

  // The kubelet records the NVIDIA plugin's answer in its checkpoint.
  auto admitted = node.kubelet().AdmitContainer("train", "default", "uid-train", "cuda",
                                                {{"nvidia.com/gpu", 2}});
  REQUIRE(admitted.ok());
  REQUIRE(node.WaitAll("Unhealthy"));
  CHECK(node.daemon().guard_status().mofed.evidence ==
        std::vector<std::string>{
            node.checkpoint().string() +
            ": pod uid-train container \"cuda\" (nvidia.com/gpu) has env NVIDIA_MOFED=enabled"});

  // The pod goes: the kubelet rewrites the checkpoint without it.
  REQUIRE(node.kubelet().RemovePod("uid-train").ok());
  CHECK(node.WaitAll("Healthy"));
  CHECK(node.daemon().guard_status().mofed.state == MofedState::kOff);
}

TEST_CASE("Under MOFED policy warn the conflict is reported and EFAs stay Healthy",
          "[guards][daemon][concurrency]") {
  GuardedNode node(MofedPolicy::kWarn);
  node.StartDaemon();
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  REQUIRE(node.WaitAll("Healthy"));

  int registrations = 1;
  for (const std::string& mofed : {MofedEnv(), MofedCdi()}) {
    node.RestartKubeletWithCheckpoint(mofed);
    REQUIRE(node.WaitMofed(MofedState::kOn));
    REQUIRE(node.kubelet().WaitForRegistrations(kEfa, ++registrations, kDeadline));
    REQUIRE(node.kubelet().WaitForStreaming(kEfa, true, kDeadline));
    CHECK(node.WaitAll("Healthy"));
    CHECK_FALSE(node.daemon().guard_status().efas_held_unhealthy);
    CHECK(AllocateOne(node.kubelet(), "rdmap16s27").ok());

    node.RestartKubeletWithCheckpoint(NoMofed());
    REQUIRE(node.WaitMofed(MofedState::kOff));
    REQUIRE(node.kubelet().WaitForRegistrations(kEfa, ++registrations, kDeadline));
    CHECK(node.WaitAll("Healthy"));
  }
}

TEST_CASE("Under MOFED policy off the guard does not look", "[guards][daemon][concurrency]") {
  GuardedNode node(MofedPolicy::kOff);
  node.StartDaemon();
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  REQUIRE(node.WaitAll("Healthy"));
  const int checks = node.daemon().guard_status().checks;
  node.RestartKubeletWithCheckpoint(MofedEnv());
  REQUIRE(node.WaitCheckAfter(checks));  // the checkpoint changed
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 2, kDeadline));
  GuardStatus status = node.daemon().guard_status();
  CHECK(status.mofed_policy == MofedPolicy::kOff);
  CHECK(status.mofed.state == MofedState::kOff);
  CHECK(status.mofed.evidence.empty());
  CHECK(status.mofed.other.empty());
  CHECK(node.WaitAll("Healthy"));
}

TEST_CASE("A corrupt checkpoint makes the MOFED state unknown and the daemon keeps serving",
          "[guards][daemon][concurrency]") {
  GuardedNode node(MofedPolicy::kProtect);
  node.StartDaemon();
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  REQUIRE(node.WaitAll("Healthy"));

  // Written behind the kubelet's back (a torn write): the device list does
  // not change, so the kubelet does not rewrite it.
  const std::string good = MofedEnv();
  WriteFileAtomically(node.checkpoint(), good.substr(0, 60));
  REQUIRE(node.WaitMofed(MofedState::kUnknown));
  CHECK(node.daemon().guard_status().mofed.evidence[0] ==
        node.checkpoint().string() +
            ":1:61: truncated JSON: syntax error while parsing value - unexpected end of input; "
            "expected '[', '{', or a literal");
  CHECK_FALSE(node.daemon().guard_status().efas_held_unhealthy);
  CHECK(AllocateOne(node.kubelet(), "rdmap16s27").ok());

  WriteFileAtomically(node.checkpoint(),
                      R"({"Data":{"PodDeviceEntries":[{"PodUID":"p9","ContainerName":"cuda",)"
                      R"("ResourceName":"nvidia.com/gpu","DeviceIDs":{"0":["GPU-9"]},)"
                      R"("AllocResp":"@@@"}]},"Checksum":1})");
  const std::string bad_base64 =
      node.checkpoint().string() +
      ": Data.PodDeviceEntries[0] (pod p9, container \"cuda\", nvidia.com/gpu): AllocResp is not "
      "valid base64";
  REQUIRE(node.WaitStatus([&](const GuardStatus& s) {
    return s.mofed.state == MofedState::kUnknown && s.mofed.evidence[0] == bad_base64;
  }));
  CHECK(AllocateOne(node.kubelet(), "rdmap16s27").ok());
  CHECK(node.kubelet().streaming(kEfa));
  CHECK(node.WaitAll("Healthy"));

  // Readable again and showing MOFED: now protect acts.
  node.RestartKubeletWithCheckpoint(good);
  CHECK(node.WaitAll("Unhealthy"));
}

TEST_CASE("A checkpoint over its size bound keeps the MOFED verdict, logged and counted",
          "[guards][daemon][concurrency]") {
  GuardedNode node(MofedPolicy::kProtect);
  node.RestartKubeletWithCheckpoint(MofedEnv());
  node.StartDaemon();
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  REQUIRE(node.WaitAll("Unhealthy"));
  const int checks = node.daemon().guard_status().checks;
  CHECK(node.daemon().guard_status().mofed_incomplete == 0);

  // Replaced behind the kubelet's back by a file over the bound: not read,
  // so not proof that the MOFED pod is gone.
  const fs::path big = node.checkpoint().string() + ".big";
  { std::ofstream out(big); }
  fs::resize_file(big, (size_t{64} << 20) + 1);
  fs::rename(big, node.checkpoint());
  REQUIRE(node.WaitStatus(
      [checks](const GuardStatus& s) { return s.checks > checks && s.mofed_incomplete > 0; }));
  const GuardStatus status = node.daemon().guard_status();
  CHECK(status.mofed.incomplete == node.checkpoint().string() + ": larger than 64 MiB");
  CHECK(status.mofed.state == MofedState::kOn);
  CHECK(status.efas_held_unhealthy);
  CHECK(node.All("Unhealthy"));

  // Readable again without MOFED: the verdict follows.
  node.RestartKubeletWithCheckpoint(NoMofed());
  CHECK(node.WaitAll("Healthy"));
  CHECK(node.daemon().guard_status().mofed.incomplete.empty());
}

TEST_CASE(
    "The MOFED CDI spec appearing in a CDI directory is reported as a hint and does not turn "
    "EFAs Unhealthy under protect",
    "[guards][daemon][concurrency]") {
  GuardedNode node(MofedPolicy::kProtect);
  node.StartDaemon();
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  REQUIRE(node.WaitAll("Healthy"));
  const fs::path spec = node.cdi_dir() / "k8s.device-plugin.nvidia.com-mofed.json";
  WriteFileAtomically(spec,
                      R"({"cdiVersion":"0.5.0","kind":"k8s.device-plugin.nvidia.com/mofed"})");
  // Left behind by an NVIDIA plugin that ran with MOFED once: a hint.
  REQUIRE(node.WaitStatus([](const GuardStatus& s) { return s.mofed.hints.size() == 1; }));
  const GuardStatus status = node.daemon().guard_status();
  CHECK(status.mofed.hints[0] ==
        spec.string() +
            ": the NVIDIA MOFED CDI spec is installed (a hint: the NVIDIA device plugin has or had "
            "MOFED on; no container counted was given it)");
  CHECK(status.mofed.state == MofedState::kOff);
  CHECK_FALSE(status.efas_held_unhealthy);
  CHECK(node.All("Healthy"));
  CHECK(AllocateOne(node.kubelet(), "rdmap16s27").ok());
  fs::remove(spec);
  CHECK(node.WaitStatus([](const GuardStatus& s) { return s.mofed.hints.empty(); }));
}

TEST_CASE(
    "Under protect a deleted MOFED pod's entry left in the checkpoint stops counting once "
    "pod-resources has left it out for the confirmation time",
    "[guards][daemon][concurrency]") {
  GuardedNode node(MofedPolicy::kProtect, DraPolicy::kYield, 10s, /*fake_clock=*/true);
  node.StartDaemon();
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  REQUIRE(node.WaitAll("Healthy"));
  // A pod deleted after it was given MOFED: the kubelet keeps its entry in
  // memory until its next UpdateAllocatedDevices, and in the file until its
  // next write after that (kubelet pkg/kubelet/cm/devicemanager/manager.go:
  // writeCheckpoint's callers); pod-resources no longer lists it.
  const auto deleted = nlohmann::json::parse(FakeCheckpointJson({Gpu("uid-gone", true, false)}));
  node.kubelet().AddCheckpointEntryForTest(deleted["Data"]["PodDeviceEntries"][0].dump());
  // The node's other pods (in production at least this daemon's own) are
  // listed; this admission writes the checkpoint.
  REQUIRE(node.kubelet().AdmitContainer("user", "default", "uid-user", "main", {{kEfa, 1}}).ok());
  REQUIRE(node.WaitAll("Unhealthy"));
  CHECK(node.daemon().guard_status().mofed.evidence[0] ==
        node.checkpoint().string() +
            ": pod uid-gone container \"cuda\" (nvidia.com/gpu) has env NVIDIA_MOFED=enabled");
  // Left out of pod-resources for the confirmation time: it no longer
  // counts, though the file still has it.
  CHECK(node.PassUntil([&] { return node.All("Healthy"); }));
  const GuardStatus status = node.daemon().guard_status();
  CHECK(status.mofed.state == MofedState::kOff);
  CHECK_FALSE(status.efas_held_unhealthy);
  REQUIRE(status.mofed.evidence.size() >= 2);  // the checkpoint's two first
  CHECK(status.mofed.evidence[1].starts_with(
      node.checkpoint().string() +
      ": pod uid-gone container \"cuda\" (nvidia.com/gpu) has env NVIDIA_MOFED=enabled, but "
      "pod-resources has not listed it for "));
}

TEST_CASE("An nvidia-device-plugin process with --mofed-enabled is found by the periodic check",
          "[guards][daemon][concurrency]") {
  GuardedNode node(MofedPolicy::kProtect, DraPolicy::kYield, 10s, /*fake_clock=*/true);
  const fs::path socket = node.device_plugin_dir() / "nvidia-gpu.sock";
  node.proc().AddProcess(4242, {"/usr/bin/nvidia-device-plugin"}, {"PATH=/bin"}, "v0.19.3", socket);
  node.StartDaemon();
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  REQUIRE(node.WaitAll("Healthy"));
  GuardStatus status = node.daemon().guard_status();
  CHECK(status.mofed.state == MofedState::kOff);
  CHECK(std::find(status.mofed.evidence.begin(), status.mofed.evidence.end(),
                  "process 4242 (nvidia-device-plugin v0.19.3): MOFED is off by default in "
                  "v0.19.3") != status.mofed.evidence.end());

  node.proc().AddProcess(4242, {"/usr/bin/nvidia-device-plugin", "--mofed-enabled"}, {}, "v0.19.3",
                         socket);
  REQUIRE(node.PassUntil([&] { return node.All("Unhealthy"); }));
  CHECK(node.daemon().guard_status().mofed.evidence[0] ==
        "process 4242 (nvidia-device-plugin v0.19.3): command line sets --mofed-enabled=true");

  node.proc().RemoveProcess(4242);
  CHECK(node.PassUntil([&] { return node.All("Healthy"); }));
}

TEST_CASE("Among 10,000 nvidia-device-plugin processes the daemon finds the plugin's MOFED",
          "[guards][daemon][concurrency]") {
  GuardedNode node(MofedPolicy::kProtect);
  const std::vector<std::string> fake = {"nvidia-device-plugin", "--mofed-enabled"};
  for (int pid = 1000; pid < 10999; ++pid) node.proc().AddNamedProcess(pid, fake, 1000);
  node.proc().AddProcess(30000, {"/usr/bin/nvidia-device-plugin", "--mofed-enabled"}, {}, "v0.17.0",
                         node.device_plugin_dir() / "nvidia-gpu.sock");
  // Room for a slow machine (a sanitizer build scans 10,000 entries in
  // about 0.7 s); the default time box has its own tests.
  node.options().guards.mofed_time_box = std::chrono::seconds(60);
  node.StartDaemon();
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  REQUIRE(node.WaitAll("Unhealthy"));
  const GuardStatus status = node.daemon().guard_status();
  CHECK(status.mofed.state == MofedState::kOn);
  CHECK(status.mofed_incomplete == 0);
  CHECK(std::find(status.mofed.evidence.begin(), status.mofed.evidence.end(),
                  "process 30000 (nvidia-device-plugin v0.17.0): command line sets "
                  "--mofed-enabled=true") != status.mofed.evidence.end());
}

TEST_CASE("A process that only calls itself nvidia-device-plugin does not make EFAs Unhealthy",
          "[guards][daemon][concurrency]") {
  GuardedNode node(MofedPolicy::kProtect, DraPolicy::kYield, 10s, /*fake_clock=*/true);
  // exec -a nvidia-device-plugin ... --mofed-enabled, without the plugin's socket.
  node.proc().AddProcess(4242, {"nvidia-device-plugin", "--mofed-enabled"}, {"MOFED_ENABLED=true"},
                         "v0.19.1");
  node.StartDaemon();
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  const std::string ignored =
      "process 4242 (nvidia-device-plugin v0.19.1): not the NVIDIA device "
      "plugin (no nvidia-*.sock socket in " +
      node.device_plugin_dir().string() + "); ignored";
  auto ignored_twice = [&](const GuardStatus& s) {
    return s.checks >= 2 && std::find(s.mofed.evidence.begin(), s.mofed.evidence.end(), ignored) !=
                                s.mofed.evidence.end();
  };
  REQUIRE(node.PassUntil([&] { return ignored_twice(node.daemon().guard_status()); }));
  CHECK(node.daemon().guard_status().mofed.state == MofedState::kOff);
  CHECK(node.WaitAll("Healthy"));
}

TEST_CASE("A dra.net registration socket withdraws the resource, and its going registers it again",
          "[guards][daemon][concurrency]") {
  // Gone for 3 rescans (the hold-down) before it counts as gone.
  GuardedNode node(MofedPolicy::kWarn, DraPolicy::kYield, 300ms);
  node.StartDaemon();
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  REQUIRE(node.WaitAll("Healthy"));

  FakeDraDriver driver(node.registry());
  driver.Start();
  // Withdrawn: the open stream now advertises nothing.
  REQUIRE(node.kubelet().WaitForDevices(
      kEfa, [](const auto& d) { return d.empty(); }, kDeadline));
  GuardStatus status = node.daemon().guard_status();
  CHECK(status.dra.present);
  CHECK(status.withdrawn);
  CHECK(status.dra.evidence == driver.socket_path().string() +
                                   ": the dra.net DRA driver's registration socket accepts "
                                   "connections");
  CHECK(node.kubelet().streaming(kEfa));

  // A kubelet restart does not bring the plugin back while the driver is there.
  REQUIRE(node.kubelet().Restart().ok());
  CHECK_FALSE(node.kubelet().WaitForRegistrations(kEfa, 2, 500ms));

  driver.Stop();
  // Its going is confirmed over the hold-down first: still withdrawn.
  REQUIRE(node.WaitStatus([](const GuardStatus& s) {
    return s.dra.evidence.find("stays withdrawn until it has stayed gone for 900ms") !=
           std::string::npos;
  }));
  CHECK(node.kubelet().registrations(kEfa) == 1);
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 2, kDeadline));
  CHECK(node.WaitAll("Healthy"));
  CHECK_FALSE(node.daemon().guard_status().withdrawn);
}

TEST_CASE("A plugin registry that cannot be listed keeps the DRA guard's last answer",
          "[guards][daemon][concurrency]") {
  GuardedNode node(MofedPolicy::kWarn, DraPolicy::kYield, 200ms);
  node.StartDaemon();
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  REQUIRE(node.WaitAll("Healthy"));
  FakeDraDriver driver(node.registry());
  driver.Start();
  REQUIRE(node.WaitStatus([](const GuardStatus& s) { return s.withdrawn; }));
  REQUIRE(node.kubelet().WaitForDevices(
      kEfa, [](const auto& d) { return d.empty(); }, kDeadline));
  // The registry out of sight (a file where the directory was, swapped in
  // at once): the driver may be there still, so the resource stays
  // withdrawn.
  const fs::path other = node.registry().string() + ".other";
  std::ofstream(other) << "not a directory";
  auto swap = [&] {
    REQUIRE(renameat2(AT_FDCWD, other.c_str(), AT_FDCWD, node.registry().c_str(),
                      RENAME_EXCHANGE) == 0);
  };
  swap();
  REQUIRE(node.WaitStatus([](const GuardStatus& s) { return s.dra_incomplete >= 2; }));
  GuardStatus status = node.daemon().guard_status();
  CHECK(status.dra.present);
  CHECK(status.withdrawn);
  CHECK(status.dra.error == "cannot list " + node.registry().string() + ": Not a directory");
  CHECK(node.kubelet().registrations(kEfa) == 1);
  CHECK(node.kubelet().streaming(kEfa));
  // Whole again: the driver is seen, still withdrawn; then it goes.
  swap();
  REQUIRE(node.WaitStatus([](const GuardStatus& s) { return s.dra.error.empty(); }));
  CHECK(node.daemon().guard_status().withdrawn);
  driver.Stop();
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 2, kDeadline));
  CHECK(node.WaitAll("Healthy"));
}

TEST_CASE(
    "The DRA guard withdraws the resource for a configured driver of another name, not for an "
    "unlisted dra.net",
    "[guards][daemon][concurrency]") {
  GuardedNode node(MofedPolicy::kWarn, DraPolicy::kYield, 300ms);
  // dra.net here serves ENA interfaces only; the EFAs' driver is another.
  node.options().guards.dra_drivers = {"efa.dra.example.com"};
  node.StartDaemon();
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  REQUIRE(node.WaitAll("Healthy"));

  const int checks = node.daemon().guard_status().checks;
  FakeDraDriver dranet(node.registry());
  dranet.Start();
  REQUIRE(node.WaitCheckAfter(checks));  // the new socket was looked at
  CHECK_FALSE(node.daemon().guard_status().dra.present);
  CHECK(node.All("Healthy"));

  FakeDraDriver efa(node.registry(), "efa.dra.example.com-reg.sock");
  efa.Start();
  REQUIRE(node.kubelet().WaitForDevices(
      kEfa, [](const auto& d) { return d.empty(); }, kDeadline));
  const GuardStatus status = node.daemon().guard_status();
  CHECK(status.withdrawn);
  CHECK(status.dra.driver == "efa.dra.example.com");
  efa.Stop();
  CHECK(node.WaitAll("Healthy"));
}

TEST_CASE("With the DRA driver present at start the daemon registers only once it goes",
          "[guards][daemon][concurrency]") {
  GuardedNode node(MofedPolicy::kWarn, DraPolicy::kYield, 300ms);
  FakeDraDriver driver(node.registry());
  driver.Start();
  node.StartDaemon();
  REQUIRE(node.WaitStatus([](const GuardStatus& s) { return s.withdrawn; }));
  CHECK_FALSE(node.kubelet().WaitForRegistrations(kEfa, 1, 500ms));

  driver.Stop();
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  CHECK(node.WaitAll("Healthy"));
}

TEST_CASE(
    "A DRA driver gone while a container holds EFAs through its claim keeps the resource "
    "withdrawn until the pod ends",
    "[guards][daemon][concurrency]") {
  GuardedNode node(MofedPolicy::kWarn, DraPolicy::kYield, 200ms);
  FakeDraDriver driver(node.registry());
  driver.Start();
  node.StartDaemon();
  REQUIRE(node.WaitStatus([](const GuardStatus& s) { return s.withdrawn; }));
  // DRANET's claim (listed without devices) and a claim of another
  // driver (a GPU's), which does not count.
  const FakeKubelet::PreparedClaim efas{"efas", "ml", {{"dra.net", {}}}};
  REQUIRE(node.kubelet().PrepareClaim("train-0", "ml", "uid-train-0", efas, {"main"}).ok());
  const FakeKubelet::PreparedClaim gpus{
      "gpus", "ml", {{"gpu.nvidia.com", {{"node-a", "gpu-0", {}}}}}};
  REQUIRE(node.kubelet().PrepareClaim("render-0", "ml", "uid-render-0", gpus, {"main"}).ok());
  driver.Stop();
  REQUIRE(node.WaitStatus([](const GuardStatus& s) {
    return s.dra.evidence.find(
               "stays withdrawn until no container holds EFAs through a DRA "
               "claim (1 do)") != std::string::npos;
  }));
  const int checks = node.daemon().guard_status().checks;
  REQUIRE(node.WaitCheckAfter(checks + 2));  // rescans later: still withdrawn
  CHECK(node.daemon().guard_status().withdrawn);
  CHECK(node.kubelet().registrations(kEfa) == 0);
  REQUIRE(node.kubelet().RemovePod("uid-train-0").ok());
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  CHECK(node.WaitAll("Healthy"));
}

TEST_CASE("A stale dra.net socket does not keep the daemon from registering",
          "[guards][daemon][concurrency]") {
  GuardedNode node(MofedPolicy::kWarn);
  FakeDraDriver driver(node.registry());
  driver.Start();
  driver.Crash();
  node.StartDaemon();
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  CHECK(node.WaitAll("Healthy"));
  GuardStatus status = node.daemon().guard_status();
  CHECK_FALSE(status.dra.present);
  CHECK(status.dra.evidence ==
        driver.socket_path().string() + ": refuses connections (stale: Connection refused)");
}

TEST_CASE("The daemon serves next to a listening registration socket that does not withdraw it",
          "[guards][daemon][concurrency]") {
  struct Case {
    const char* what;
    DraPolicy policy;
    const char* socket;
    bool present;
  };
  for (const Case& c : {
           Case{.what = "the DRA driver under policy ignore",
          .policy = DraPolicy::kIgnore,
          .socket = "dra.net-reg.sock",
          .present = true},
           Case{.what = "another driver whose name contains dra.net",
           .policy = DraPolicy::kYield,
           .socket = "foo.dra.net-reg.sock",
           .present = false},
       }) {
    INFO(c.what);
    GuardedNode node(MofedPolicy::kWarn, c.policy);
    FakeDraDriver driver(node.registry(), c.socket);
    driver.Start();
    node.StartDaemon();
    REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
    CHECK(node.WaitAll("Healthy"));
    GuardStatus status = node.daemon().guard_status();
    CHECK(status.dra.present == c.present);
    CHECK_FALSE(status.withdrawn);
  }
}

namespace {

// Whether the guards' latest DRA probe found `socket` refusing connections.
bool Refused(const GuardStatus& s, const fs::path& socket) {
  return !s.dra.present &&
         s.dra.evidence == socket.string() + ": refuses connections (stale: Connection refused)";
}

}  // namespace

TEST_CASE(
    "A DRA driver that listens only some time after binding its socket withdraws the "
    "resource",
    "[guards][daemon][concurrency]") {
  // No periodic check comes to the rescue: only the re-probe of a refusing
  // socket can see the listen().
  GuardedNode node(MofedPolicy::kWarn, DraPolicy::kYield, 600s);
  node.StartDaemon();
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  REQUIRE(node.WaitAll("Healthy"));

  FakeDraDriver driver(node.registry());
  driver.Bind();
  REQUIRE(node.WaitStatus([&](const GuardStatus& s) { return Refused(s, driver.socket_path()); }));
  driver.Listen();
  REQUIRE(node.kubelet().WaitForDevices(
      kEfa, [](const auto& d) { return d.empty(); }, kDeadline));
  CHECK(node.daemon().guard_status().withdrawn);
}

TEST_CASE(
    "A kubelet restart just after a DRA driver starts listening does not register the "
    "resource beside it",
    "[guards][daemon][concurrency]") {
  GuardedNode node(MofedPolicy::kWarn, DraPolicy::kYield, 600s);
  FakeDraDriver driver(node.registry());
  driver.Bind();
  node.StartDaemon();
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  REQUIRE(node.WaitStatus([&](const GuardStatus& s) { return Refused(s, driver.socket_path()); }));
  node.kubelet().Stop();
  driver.Listen();
  REQUIRE(node.kubelet().Start().ok());
  // Either the re-probe or the probe before registering sees the driver.
  REQUIRE(node.WaitStatus([](const GuardStatus& s) { return s.withdrawn; }));
  CHECK_FALSE(node.kubelet().WaitForRegistrations(kEfa, 2, 500ms));
  CHECK(node.kubelet().registrations(kEfa) == 1);
}

TEST_CASE("Under DRA policy monitor the daemon never registers, with the DRA driver or without",
          "[guards][daemon][concurrency]") {
  // A DRA node pool's node: the EFAs are the driver's by plan, also while
  // it is gone (restarting, or not installed yet).
  GuardedNode node(MofedPolicy::kWarn, DraPolicy::kMonitor);
  node.StartDaemon();
  REQUIRE(node.WaitStatus([](const GuardStatus& s) { return s.checks > 0; }));
  GuardStatus status = node.daemon().guard_status();
  CHECK_FALSE(status.dra.present);
  CHECK(status.withdrawn);
  CHECK(status.dra_policy == DraPolicy::kMonitor);

  FakeDraDriver driver(node.registry());
  driver.Start();
  REQUIRE(node.WaitStatus([](const GuardStatus& s) { return s.dra.present; }));
  CHECK(node.daemon().guard_status().withdrawn);
  driver.Stop();
  REQUIRE(node.WaitStatus([](const GuardStatus& s) { return !s.dra.present; }));
  CHECK(node.daemon().guard_status().withdrawn);
  // The kubelet was there throughout: under yield the driver's going
  // would have registered the resource at once.
  CHECK_FALSE(node.kubelet().WaitForRegistrations(kEfa, 1, 500ms));
  CHECK(node.kubelet().registrations(kEfa) == 0);
}
