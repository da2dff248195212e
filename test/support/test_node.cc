#include "test/support/test_node.h"

#include <signal.h>

#include <catch2/catch.hpp>
#include <random>

#include "plugin/alignment/alignment.h"
#include "plugin/config.h"
#include "plugin/kubelet/kubelet_checkpoint.h"
#include "test/support/build_paths.h"
#include "test/support/daemon_log.h"
#include "test/support/devices.h"
#include "test/support/scrape.h"
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
  options_.guards.cdi_spec_dirs = {sim_.path() / "etc/cdi"};  // never the host's
  if (config_.alignment) {
    if (config_.cdi_dir.empty()) fs::create_directories(cdi_dir());  // watched from the start
    options_.alignment = *config_.alignment;
    options_.cdi_dir = cdi_dir();
    options_.guards.cdi_spec_dirs.push_back(cdi_dir());
  }
  options_.replicas = config_.replicas;
  if (config_.fake_clock) options_.clock = &clock_;
  if (config_.configure) config_.configure(options_);
  if (config_.run == DaemonRun::kInProcess) StartDaemon();
  if (config_.run == DaemonRun::kBinary) StartBinary();
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
  if (config_.wait_serving) {
    WaitServing();
    if (config_.monitor && process_) {
      REQUIRE(WaitLog("serving /metrics, /healthz and /readyz on "));
      metrics_port_ = static_cast<uint16_t>(LoggedPort("/metrics, /healthz and /readyz"));
      REQUIRE(metrics_port_ > 0);
      probe_port_ = static_cast<uint16_t>(LoggedPort("/healthz and /readyz"));
    }
  }
}

TestNode::~TestNode() {
  StopDaemon();
  if (process_) process_->Stop(kDeadline);
}

fs::path TestNode::checkpoint() const { return device_plugin_dir() / plugin::kCheckpointFile; }

fs::path TestNode::plugin_socket() const {
  return device_plugin_dir() / "efa/aws-efa-device-plugin.sock";
}

fs::path TestNode::cdi_dir() const {
  return config_.cdi_dir.empty() ? sim_.path() / "var/run/cdi" : config_.cdi_dir;
}

void TestNode::StartDaemon(const std::function<void(plugin::Daemon&)>& before_run) {
  StopDaemon();
  if (config_.monitor && !monitor_) {
    monitor_ = std::make_unique<plugin::DaemonMonitor>(
        plugin::MonitorOptions{options_.rescan_interval, "", options_.roots.sysfs, 0});
    monitor_->Attach(options_);
  }
  daemon_ = std::make_unique<plugin::Daemon>(options_);
  judged_ = 0;  // the new daemon's alignment stats start again
  if (monitor_) {
    monitor_->Watch(daemon_.get());
    if (!http_) {
      auto http = plugin::HttpServer::Start("127.0.0.1:0", monitor_->Routes());
      REQUIRE(http.ok());
      http_ = *std::move(http);
      auto probes = plugin::HttpServer::Start("127.0.0.1:0", monitor_->ProbeRoutes());
      REQUIRE(probes.ok());
      probes_ = *std::move(probes);
    }
  }
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
  metrics_port_ = probe_port_ = 0;
  std::vector<std::string> args = config_.wrapper;
  args.push_back(config_.binary.empty() ? kPluginBinary : config_.binary.string());
  for (const std::string& flag : sim_.DaemonFlags()) args.push_back(flag);
  if (config_.alignment) {
    if (config_.cdi_dir.empty()) fs::create_directories(cdi_dir());
    args.insert(args.end(),
                {"--alignment", std::string(plugin::AlignmentModeName(*config_.alignment)),
                 "--cdi-dir", cdi_dir().string()});
  }
  if (config_.replicas != 1) {
    args.insert(args.end(), {"--sharing-replicas", std::to_string(config_.replicas)});
  }
  if (config_.monitor) args.insert(args.end(), {"--metrics-address", "127.0.0.1:0"});
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

uint16_t TestNode::metrics_port() const {
  if (http_) return http_->port();
  if (metrics_port_ == 0) {
    return static_cast<uint16_t>(LoggedPort("/metrics, /healthz and /readyz"));
  }
  return metrics_port_;
}

uint16_t TestNode::probe_port() const {
  if (probes_) return probes_->port();
  if (probe_port_ == 0) return static_cast<uint16_t>(LoggedPort("/healthz and /readyz"));
  return probe_port_;
}

Metrics TestNode::Scrape() const { return testing::Scrape(metrics_port()); }

bool TestNode::WaitScrape(const std::function<bool(const Metrics&)>& want) const {
  return testing::WaitScrape(metrics_port(), want);
}

void TestNode::WaitServing(int registrations, int messages) {
  REQUIRE(kubelet_.WaitForRegistrations(kEfa, registrations + 1, kDeadline));
  REQUIRE(kubelet_.WaitForListAndWatchMessages(kEfa, messages + 1, kDeadline));
  REQUIRE(kubelet_.WaitForStreaming(kEfa, true, kDeadline));
}

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
