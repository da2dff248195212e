#include "plugin/alignment/aligner.h"

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "plugin/device_plugin_service.h"
#include "test/fake_kubelet/fake_accelerator_plugin.h"
#include "test/fake_kubelet/fake_kubelet.h"
#include "test/sim/sim_root.h"
#include "test/support/devices.h"
#include "topology/efa_discovery.h"
#include "topology/hwloc_loader.h"

using namespace std::chrono_literals;
using namespace efa::plugin;
using efa::sim::SimRoot;
using efa::testing::AcceleratorKind;
using efa::testing::FakeAcceleratorPlugin;
using efa::testing::FakeKubelet;
using efa::topology::PciAddress;

namespace {

using efa::testing::kDeadline;
using efa::testing::kGpu;

// A simulated p5.48xlarge with the fake kubelet, the fake GPU plugin and the
// EFA device plugin service registered, the service asking an Aligner for
// the targets of each admission (as the daemon does).
class P5Node {
 public:
  // `max_qps`: the aligner's own pod-resources rate limit.
  explicit P5Node(double max_qps = PodResourcesClient::Options{}.max_qps)
      : max_qps_(max_qps),
        kubelet_(FakeKubelet::ForKubeletDir(sim_.path() / "kubelet")),
        gpus_(*efa::sim::FindMachine("p5.48xlarge"), AcceleratorKind::kNvidiaGpu,
              sim_.path() / "kubelet/device-plugins"),
        aligner_(Options()),
        efa_(DevicePluginService::Options{}) {
    REQUIRE(kubelet_.Start().ok());
    REQUIRE(gpus_.Start().ok());
    REQUIRE(kubelet_.WaitForListAndWatchMessages(kGpu, 1, kDeadline));
    const auto inventory = efa::topology::DiscoverEfaDevices(sim_.roots());
    auto topology = efa::topology::LoadTopology({sim_.path().string(), ""});
    REQUIRE(topology.ok());
    model_ = efa::topology::HostModel::FromHwloc(inventory, topology->get());
    efa_.SetDevices(inventory.devices, model_);
    efa_.SetTargetFinder([this](const efa::topology::HostModel& model) {
      Targets targets = aligner_.ForAdmission(model);
      absl::MutexLock lock(&mu_);
      found_.push_back(targets);
      return targets;
    });
    const std::string endpoint = kPluginSocket;
    std::filesystem::create_directories((kubelet_.dir() / endpoint).parent_path());
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + (kubelet_.dir() / endpoint).string(),
                             grpc::InsecureServerCredentials());
    builder.RegisterService(&efa_);
    server_ = builder.BuildAndStart();
    REQUIRE(server_ != nullptr);
    v1beta1::RegisterRequest request;
    request.set_version(kApiVersion);
    request.set_endpoint(endpoint);
    request.set_resource_name(kResourceName);
    *request.mutable_options() = efa_.PluginOptions();
    grpc::ClientContext context;
    v1beta1::Empty empty;
    REQUIRE(v1beta1::Registration::NewStub(
                grpc::CreateChannel("unix:" + kubelet_.socket_path().string(),
                                    grpc::InsecureChannelCredentials()))
                ->Register(&context, request, &empty)
                .ok());
    REQUIRE(kubelet_.WaitForListAndWatchMessages(kResourceName, 1, kDeadline));
  }
  ~P5Node() {
    kubelet_.Stop();
    efa_.Shutdown();
    server_->Shutdown();
  }

  // Admits pod <name> (UID uid-<name>), container "main", one resource at a
  // time in the order given.
  void Admit(const std::string& name, const std::vector<std::pair<std::string, int>>& requests) {
    auto admitted = kubelet_.AdmitContainer(name, "default", "uid-" + name, "main", requests);
    INFO(admitted.status().ToString());
    REQUIRE(admitted.ok());
  }
  // The PCI address of the GPU pod <name> holds.
  PciAddress GpuOf(const std::string& name) const {
    const auto ids = kubelet_.container_devices("uid-" + name, "main", kGpu);
    REQUIRE(ids.size() == 1);
    for (const auto& gpu : gpus_.accelerators()) {
      if (gpu.id == ids[0]) return gpu.address;
    }
    FAIL("no such GPU: " << ids[0]);
    return {};
  }
  // What the aligner answered the EFA plugin's GetPreferredAllocation calls.
  std::vector<Targets> found() {
    absl::MutexLock lock(&mu_);
    return found_;
  }

  FakeKubelet& kubelet() { return kubelet_; }
  Aligner& aligner() { return aligner_; }
  const efa::topology::HostModel& model() const { return *model_; }

 private:
  AlignerOptions Options() const {
    AlignerOptions options;
    options.kubelet_dir = sim_.path() / "kubelet";
    options.proc_root = sim_.path() / "proc";
    options.resources.gpu = {kGpu};
    options.resources.neuron.clear();
    options.resources.neuroncore.clear();
    options.pod_resources.timeout = kDeadline;  // no loaded machine misses it
    options.pod_resources.max_qps = max_qps_;
    return options;
  }

  const double max_qps_;
  SimRoot sim_{"p5.48xlarge"};
  FakeKubelet kubelet_;
  FakeAcceleratorPlugin gpus_;
  std::shared_ptr<const efa::topology::HostModel> model_;
  Aligner aligner_;
  DevicePluginService efa_;
  std::unique_ptr<grpc::Server> server_;
  absl::Mutex mu_;
  std::vector<Targets> found_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

TEST_CASE("Aligner targets the GPU of the container being admitted", "[alignment]") {
  P5Node node;
  // A GPU-only pod already running (in the checkpoint) is not the one.
  node.Admit("running", {{kGpu, 1}});
  // GPU first: when the EFAs are placed, pod-resources lists this
  // container's GPU but the checkpoint does not have it yet.
  node.Admit("train", {{kGpu, 1}, {kResourceName, 4}});
  const auto found = node.found();
  REQUIRE(found.size() == 1);
  CHECK(found[0].pci == std::vector<PciAddress>{node.GpuOf("train")});
  CHECK(node.GpuOf("train") != node.GpuOf("running"));
  CHECK(found[0].unresolved.empty());
  auto counts = node.aligner().stats().Get();
  CHECK(counts.targeted == 1);
  CHECK(counts.predicted == 0);
  CHECK(counts.degraded == 0);

  // Admitted: now it holds EFAs, so no container is being admitted. The
  // aligner predicts, knowing both GPUs are taken.
  const Targets after = node.aligner().ForAdmission(node.model());
  CHECK(after.empty());
  CHECK(after.busy_known);
  CHECK(after.busy.size() == 2);
  counts = node.aligner().stats().Get();
  CHECK(counts.targeted == 1);
  CHECK(counts.predicted == 1);
}

TEST_CASE("Aligner degrades to prediction while pod-resources is down", "[alignment]") {
  P5Node node;
  node.Admit("running", {{kGpu, 1}});
  node.kubelet().StopPodResources();
  const Targets targets = node.aligner().ForAdmission(node.model());
  CHECK(targets.empty());
  CHECK_FALSE(targets.busy_known);
  CHECK(targets.busy.empty());
  const auto counts = node.aligner().stats().Get();
  CHECK(counts.degraded == 1);
  CHECK(counts.targeted == 0);
  CHECK(counts.predicted == 0);
  // Nor can it judge anything: try again later.
  CHECK(node.aligner().Report(node.model()) == Aligner::ReportOutcome::kFailed);
  CHECK(node.aligner().stats().Get().report_failed == 1);
}

TEST_CASE("Aligner judges each container holding EFAs and GPUs once", "[alignment]") {
  P5Node node;
  node.Admit("running", {{kGpu, 1}});  // no EFAs: not judged
  node.Admit("train", {{kGpu, 1}, {kResourceName, 4}});
  REQUIRE(node.aligner().Report(node.model()) == Aligner::ReportOutcome::kJudged);
  auto counts = node.aligner().stats().Get();
  CHECK(counts.aligned == 1);
  CHECK(counts.unaligned == 0);
  CHECK(node.aligner().stats().WaitForJudgedForTest(1, 0ms));
  // Judged already: not counted again.
  REQUIRE(node.aligner().Report(node.model()) == Aligner::ReportOutcome::kJudged);
  counts = node.aligner().stats().Get();
  CHECK(counts.aligned == 1);
  CHECK(counts.unaligned == 0);
  // A second such container is judged in its turn.
  node.Admit("eval", {{kGpu, 1}, {kResourceName, 4}});
  REQUIRE(node.aligner().Report(node.model()) == Aligner::ReportOutcome::kJudged);
  CHECK(node.aligner().stats().Get().aligned == 2);
}

TEST_CASE("Aligner defers a report its own rate limit refuses, counting no failure",
          "[alignment]") {
  // A token per 1,000 s: the admissions below spend the burst for good.
  P5Node node(/*max_qps=*/0.001);
  node.Admit("train", {{kGpu, 1}, {kResourceName, 4}});
  // Admissions are never refused by our own limit, but each spends a token.
  for (int i = 0; i < 10; ++i) node.aligner().ForAdmission(node.model());
  CHECK(node.aligner().stats().Get().degraded == 0);
  CHECK(node.aligner().Report(node.model()) == Aligner::ReportOutcome::kDeferred);
  const auto counts = node.aligner().stats().Get();
  CHECK(counts.report_failed == 0);
  CHECK(counts.aligned == 0);
}
