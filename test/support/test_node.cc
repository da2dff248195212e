#include "test/support/test_node.h"

#include <signal.h>

#include <catch2/catch.hpp>
#include <random>

#include "plugin/alignment/alignment.h"
#include "plugin/kubelet/kubelet_checkpoint.h"
#include "test/support/build_paths.h"
#include "test/support/daemon_log.h"
#include "test/support/devices.h"
#include "test/support/temp_dir.h"
#include "topology/efa_discovery.h"
#include "topology/hwloc_loader.h"

namespace efa::testing {

namespace fs = std::filesystem;

namespace {

FakeKubelet::Options KubeletOptions(const sim::SimRoot& sim, bool pod_resources) {
  if (pod_resources) return FakeKubelet::ForKubeletDir(sim.path() / "kubelet");
  FakeKubelet::Options options;
  options.device_plugin_dir = sim.path() / "kubelet/device-plugins";
  return options;
}

}  // namespace

TestNode::TestNode(TestNodeOptions options)
    : config_(std::move(options)),
      sim_(config_.machine, config_.naming),
      kubelet_(KubeletOptions(sim_, config_.pod_resources)) {
  if (config_.prepare) config_.prepare(sim_);
  efas_ = topology::DiscoverEfaDevices(sim_.roots()).devices.size();
  if (config_.kubelet) REQUIRE(kubelet_.Start().ok());
  options_.roots = sim_.roots();
  options_.kubelet_dir = kubelet_dir();
  options_.cdi_spec_dirs = {sim_.path() / "etc/cdi"};  // never the host's
  if (config_.fake_clock) options_.clock = &clock_;
  if (config_.configure) config_.configure(options_);
  if (config_.run == DaemonRun::kInProcess) StartDaemon();
  if (config_.run == DaemonRun::kBinary) StartBinary(config_.flags, config_.max_files);
  if (config_.accelerators) {
    accelerators_ = std::make_unique<FakeAcceleratorPlugin>(
        *sim::FindMachine(config_.machine), *config_.accelerators, device_plugin_dir());
    REQUIRE(accelerators_->Start().ok());
    REQUIRE(kubelet_.WaitForRegistrations(accelerator_resource(), 1, kDeadline));
    REQUIRE(kubelet_.WaitForListAndWatchMessages(accelerator_resource(), 1, kDeadline));
    // Aligned()'s view of the machine, read now: not in the middle of a
    // test's admissions, whose pace it would change.
    auto topo = topology::LoadTopology({sim_.path().string(), ""});
    REQUIRE(topo.ok());
    model_ =
        topology::HostModel::FromHwloc(topology::DiscoverEfaDevices(sim_.roots()), topo->get());
    gpus_ = topology::ReadNvidiaGpus(sim_.path() / "proc", nullptr);
  }
}

TestNode::~TestNode() {
  StopDaemon();
  if (process_) process_->Stop(kDeadline);
}

fs::path TestNode::checkpoint() const { return device_plugin_dir() / plugin::kCheckpointFile; }

void TestNode::StartDaemon(const std::function<void(plugin::Daemon&)>& before_run) {
  StopDaemon();
  daemon_ = std::make_unique<plugin::Daemon>(options_);
  judged_ = 0;  // the new daemon's alignment stats start again
  if (before_run) before_run(*daemon_);
  thread_ = std::thread([this] { exit_code_ = daemon_->Run(); });
}

int TestNode::StopDaemon() {
  if (thread_.joinable()) {
    daemon_->Stop();
    thread_.join();
  }
  return exit_code_;
}

bool TestNode::Pass(FakeClock::duration d) {
  return AdvanceOnePass(clock_, *daemon_, d, kDeadline);
}

bool TestNode::PassUntil(const std::function<bool()>& done) {
  for (int pass = 0; pass < 12 && !done(); ++pass) {
    if (!Pass(options_.rescan_interval)) return false;
  }
  return done();
}

void TestNode::StartBinary(const std::vector<std::string>& flags, rlim_t max_files) {
  process_.reset();  // a killed daemon leaves its socket: the new one removes it
  std::vector<std::string> args = config_.wrapper;
  args.push_back(config_.binary.empty() ? kPluginBinary : config_.binary.string());
  for (const std::string& flag : sim_.DaemonFlags()) args.push_back(flag);
  args.insert(args.end(), flags.begin(), flags.end());
  process_ = std::make_unique<ChildProcess>(args, log(), max_files);
}

bool TestNode::KillBinary() {
  process_->Signal(SIGKILL);
  return process_->Wait(kDeadline) == 128 + SIGKILL;
}

int TestNode::LogLines(const std::string& text) const { return testing::LogLines(log(), text); }

bool TestNode::WaitLog(const std::string& text) const {
  if (WaitForLogLine(log(), text, kDeadline)) return true;
  UNSCOPED_INFO("no log line with: " << text << "\nlog:\n" << ReadFile(log()));
  return false;
}

int TestNode::LoggedPort(const std::string& what) const { return testing::LoggedPort(log(), what); }

bool TestNode::WaitHealth(const std::string& id, const std::string& health) {
  return kubelet_.WaitForDevices(
      kEfa,
      [&](const std::vector<v1beta1::Device>& devices) { return HealthOf(devices, id) == health; },
      kDeadline);
}

bool TestNode::All(const std::string& health, std::optional<size_t> n) const {
  return AllAre(kubelet_.devices(kEfa), health, n.value_or(efas_));
}

bool TestNode::WaitAll(const std::string& health, std::optional<size_t> n) {
  return kubelet_.WaitForDevices(
      kEfa,
      [&](const std::vector<v1beta1::Device>& devices) {
        return AllAre(devices, health, n.value_or(efas_));
      },
      kDeadline);
}

bool TestNode::Aligned(const std::string& uid, const std::vector<std::string>& efas,
                       const std::string& container) {
  std::vector<std::pair<std::string, std::string>> accels;
  for (const auto& id : kubelet_.container_devices(uid, container, accelerator_resource())) {
    accels.emplace_back(accelerator_resource(), id);
  }
  return plugin::IsAligned(*model_, efas, plugin::ResolveTargets(accels, {}, gpus_, *model_));
}

std::pair<int, int> TestNode::AdmitRounds(
    const AdmissionRounds& rounds, const AlignedCheck& aligned,
    const std::function<void(const std::vector<std::string>& uids)>& round_end) {
  std::mt19937 rng(rounds.seed);
  int aligned_containers = 0, total = 0;
  for (int round = 0; round < rounds.rounds; ++round) {
    std::vector<std::string> uids;
    while (true) {
      const bool accelerators_first = rounds.order == AdmitOrder::kAcceleratorFirst ||
                                      (rounds.order == AdmitOrder::kRandom && (rng() & 1));
      std::vector<std::pair<std::string, int>> requests = {
          {accelerator_resource(), rounds.accelerators}, {kEfa, rounds.efas}};
      if (!accelerators_first) std::swap(requests[0], requests[1]);
      const std::string n = std::to_string(++pods_);
      auto admitted = kubelet_.AdmitContainer("pod-" + n, "default", "uid-" + n, "main", requests);
      if (!admitted.ok()) break;  // the node is full
      uids.push_back("uid-" + n);
      ++total;
      aligned_containers += aligned(uids.back(), *admitted) ? 1 : 0;
    }
    if (round_end) round_end(uids);
    // The daemon judges each container after the fact, before it goes.
    judged_ += static_cast<int>(uids.size());
    REQUIRE(daemon_->alignment_stats()->WaitForJudgedForTest(judged_, kDeadline));
    for (const auto& uid : uids) REQUIRE(kubelet_.RemovePod(uid).ok());
  }
  return {aligned_containers, total};
}

}  // namespace efa::testing
