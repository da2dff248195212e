#include "test/fake_kubelet/fake_accelerator_plugin.h"

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "test/fake_kubelet/fake_kubelet.h"
#include "test/sim/machine_spec.h"
#include "test/support/devices.h"
#include "test/support/temp_dir.h"

namespace fs = std::filesystem;
using efa::sim::FindMachine;
using efa::sim::MachineSpec;
using efa::sim::SimGpuUuid;
using efa::testing::AcceleratorKind;
using efa::testing::FakeAcceleratorPlugin;
using efa::testing::FakeAcceleratorPluginOptions;
using efa::testing::FakeKubelet;
using efa::topology::PciAddress;
using namespace std::chrono_literals;

using efa::testing::TempDir;

namespace {

using efa::testing::kGpu;
constexpr char kNeuron[] = "aws.amazon.com/neuron";
constexpr auto kWait = 5s;

MachineSpec Machine(const std::string& name) {
  auto spec = FindMachine(name);
  REQUIRE(spec.ok());
  return *spec;
}

std::string Uuid(const char* bdf) { return SimGpuUuid(*PciAddress::Parse(bdf)); }

std::vector<std::string> Strings(const google::protobuf::RepeatedPtrField<std::string>& ids) {
  return {ids.begin(), ids.end()};
}

v1beta1::PreferredAllocationResponse Prefer(FakeKubelet& kubelet, const std::string& resource,
                                            const std::vector<std::string>& available,
                                            const std::vector<std::string>& must_include,
                                            int size) {
  v1beta1::PreferredAllocationRequest request;
  auto* container = request.add_container_requests();
  for (const auto& id : available) container->add_available_deviceids(id);
  for (const auto& id : must_include) container->add_must_include_deviceids(id);
  container->set_allocation_size(size);
  v1beta1::PreferredAllocationResponse response;
  REQUIRE(kubelet.GetPreferredAllocation(resource, request, &response).ok());
  REQUIRE(response.container_responses_size() == 1);
  return response;
}

}  // namespace

TEST_CASE("FakeAcceleratorPlugin advertises a p5's GPUs by UUID in PCI order with NUMA nodes",
          "[fake_kubelet][concurrency]") {
  TempDir dir;
  FakeKubelet kubelet(dir.path());
  REQUIRE(kubelet.Start().ok());
  FakeAcceleratorPlugin gpus(Machine("p5.48xlarge"), AcceleratorKind::kNvidiaGpu, dir.path());
  CHECK(gpus.resource_name() == kGpu);
  CHECK(gpus.socket_path() == dir.path() / "nvidia-gpu.sock");
  REQUIRE(gpus.Start().ok());
  CHECK(gpus.Start().code() == absl::StatusCode::kFailedPrecondition);

  REQUIRE(kubelet.WaitForRegistrations(kGpu, 1, kWait));
  CHECK(kubelet.last_request(kGpu)->endpoint() == "nvidia-gpu.sock");
  CHECK(kubelet.options(kGpu)->get_preferred_allocation_available());
  CHECK_FALSE(kubelet.options(kGpu)->pre_start_required());
  REQUIRE(kubelet.WaitForListAndWatchMessages(kGpu, 1, kWait));
  const std::vector<v1beta1::Device> devices = kubelet.devices(kGpu);
  REQUIRE(devices.size() == 8);
  CHECK(devices[0].id() == Uuid("0000:53:00.0"));
  CHECK(devices[0].id() == "GPU-00005300-0000-4000-8000-00000000e053");
  CHECK(devices[7].id() == Uuid("0000:ca:00.0"));
  CHECK(devices[0].health() == "Healthy");
  REQUIRE(devices[0].topology().nodes_size() == 1);
  CHECK(devices[0].topology().nodes(0).id() == 0);
  CHECK(devices[7].topology().nodes(0).id() == 1);
  CHECK(gpus.ids().size() == 8);
  CHECK(gpus.ids()[3] == devices[3].id());
  CHECK(gpus.accelerators()[3].address.ToString() == "0000:86:00.0");

  // A health change is streamed at once.
  REQUIRE(gpus.SetHealthy(devices[2].id(), false).ok());
  CHECK(kubelet.WaitForDevices(
      kGpu, [](const auto& d) { return d.size() == 8 && d[2].health() == "Unhealthy"; }, kWait));
  CHECK(gpus.SetHealthy("GPU-nope", false).message() == "nvidia.com/gpu: no device \"GPU-nope\"");
}

TEST_CASE("FakeAcceleratorPlugin prefers must-include GPUs, then the lowest PCI addresses",
          "[fake_kubelet][concurrency]") {
  TempDir dir;
  FakeKubelet kubelet(dir.path());
  REQUIRE(kubelet.Start().ok());
  FakeAcceleratorPlugin gpus(Machine("p5.48xlarge"), AcceleratorKind::kNvidiaGpu, dir.path());
  REQUIRE(gpus.Start().ok());
  const std::vector<std::string> ids = gpus.ids();

  // The kubelet's available list comes in any order; unknown IDs are ignored.
  auto response = Prefer(kubelet, kGpu, {ids[6], "GPU-unknown", ids[4], ids[5], ids[1]}, {}, 2);
  CHECK(Strings(response.container_responses(0).deviceids()) ==
        std::vector<std::string>{ids[1], ids[4]});
  response = Prefer(kubelet, kGpu, {ids[6], ids[4], ids[5], ids[1]}, {ids[5]}, 3);
  CHECK(Strings(response.container_responses(0).deviceids()) ==
        std::vector<std::string>{ids[5], ids[1], ids[4]});
}

TEST_CASE("FakeAcceleratorPlugin answers Allocate as the NVIDIA plugin, MOFED on request",
          "[fake_kubelet][concurrency]") {
  TempDir dir;
  FakeKubelet kubelet(dir.path());
  REQUIRE(kubelet.Start().ok());
  const bool mofed = GENERATE(false, true);
  FakeAcceleratorPluginOptions options;
  options.kind = AcceleratorKind::kNvidiaGpu;
  options.device_plugin_dir = dir.path();
  options.mofed_enabled = mofed;
  FakeAcceleratorPlugin gpus(Machine("p5.48xlarge"), options);
  REQUIRE(gpus.Start().ok());
  const std::vector<std::string> ids = gpus.ids();

  v1beta1::AllocateRequest request;
  request.add_container_requests()->add_devices_ids(ids[3]);
  request.mutable_container_requests(0)->add_devices_ids(ids[0]);
  v1beta1::AllocateResponse response;
  REQUIRE(kubelet.Allocate(kGpu, request, &response).ok());
  REQUIRE(response.container_responses_size() == 1);
  const auto& envs = response.container_responses(0).envs();
  CHECK(envs.at("NVIDIA_VISIBLE_DEVICES") == ids[3] + "," + ids[0]);
  CHECK(envs.count("NVIDIA_MOFED") == (mofed ? 1u : 0u));
  if (mofed) CHECK(envs.at("NVIDIA_MOFED") == "enabled");
  CHECK(response.container_responses(0).devices().empty());
  CHECK(gpus.allocations() == std::vector<std::vector<std::string>>{{ids[3], ids[0]}});

  request.mutable_container_requests(0)->add_devices_ids("GPU-x");
  grpc::Status status = kubelet.Allocate(kGpu, request, &response);
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(status.error_message() == "unknown device \"GPU-x\"");
}

TEST_CASE("FakeAcceleratorPlugin advertises a trn2's Neuron devices by index, lowest first",
          "[fake_kubelet][concurrency]") {
  TempDir dir;
  FakeKubelet kubelet(dir.path());
  REQUIRE(kubelet.Start().ok());
  FakeAcceleratorPluginOptions options;
  options.kind = AcceleratorKind::kNeuron;
  options.device_plugin_dir = dir.path();
  FakeAcceleratorPlugin neuron(Machine("trn2.48xlarge"), options);
  CHECK(neuron.resource_name() == kNeuron);
  REQUIRE(neuron.Start().ok());
  REQUIRE(kubelet.WaitForListAndWatchMessages(kNeuron, 1, kWait));
  const std::vector<v1beta1::Device> devices = kubelet.devices(kNeuron);
  REQUIRE(devices.size() == 16);
  for (size_t i = 0; i < devices.size(); ++i) CHECK(devices[i].id() == std::to_string(i));
  CHECK(neuron.accelerators()[0].address.ToString() == "0000:58:00.0");
  CHECK(devices[0].topology().nodes(0).id() == 0);
  CHECK(devices[15].topology().nodes(0).id() == 1);

  // Index order is numeric: "10" comes after "9".
  auto response = Prefer(kubelet, kNeuron, {"10", "2", "9", "11"}, {}, 3);
  CHECK(Strings(response.container_responses(0).deviceids()) ==
        std::vector<std::string>{"2", "9", "10"});

  v1beta1::AllocateRequest request;
  request.add_container_requests()->add_devices_ids("9");
  request.mutable_container_requests(0)->add_devices_ids("10");
  v1beta1::AllocateResponse allocated;
  REQUIRE(kubelet.Allocate(kNeuron, request, &allocated).ok());
  const auto& answer = allocated.container_responses(0);
  REQUIRE(answer.devices_size() == 2);
  CHECK(answer.devices(1).host_path() == "/dev/neuron10");
  CHECK(answer.devices(1).container_path() == "/dev/neuron10");
  CHECK(answer.envs().at("AWS_NEURON_VISIBLE_DEVICES") == "9,10");
}

TEST_CASE("FakeAcceleratorPlugin reports no NUMA node when asked not to or when unknown",
          "[fake_kubelet][concurrency]") {
  TempDir dir;
  FakeKubelet kubelet(dir.path());
  REQUIRE(kubelet.Start().ok());
  FakeAcceleratorPluginOptions options;
  options.kind = AcceleratorKind::kNvidiaGpu;
  options.device_plugin_dir = dir.path();
  // g5: every device on numa_node -1.
  FakeAcceleratorPlugin g5(Machine("g5.48xlarge"), options);
  REQUIRE(g5.Start().ok());
  REQUIRE(kubelet.WaitForListAndWatchMessages(kGpu, 1, kWait));
  REQUIRE(kubelet.devices(kGpu).size() == 8);
  CHECK_FALSE(kubelet.devices(kGpu)[0].has_topology());
  g5.Stop();

  options.report_numa = false;
  options.socket_name = "p5-gpu.sock";
  FakeAcceleratorPlugin p5(Machine("p5.48xlarge"), options);
  REQUIRE(p5.Start().ok());
  REQUIRE(kubelet.WaitForRegistrations(kGpu, 2, kWait));
  REQUIRE(kubelet.WaitForDevices(
      kGpu, [&](const auto& d) { return !d.empty() && d[0].id() == p5.ids()[0]; }, kWait));
  CHECK_FALSE(kubelet.devices(kGpu)[0].has_topology());
}

TEST_CASE("FakeAcceleratorPlugin registers again after Stop and Start",
          "[fake_kubelet][concurrency]") {
  TempDir dir;
  FakeKubelet kubelet(dir.path());
  // No kubelet yet: registration fails and nothing is left serving.
  FakeAcceleratorPlugin gpus(Machine("p5.48xlarge"), AcceleratorKind::kNvidiaGpu, dir.path());
  const absl::Status failed = gpus.Start();
  CHECK(failed.code() == absl::StatusCode::kUnavailable);
  CHECK(absl::StartsWith(failed.message(), (dir.path() / "kubelet.sock").string() +
                                               ": Register nvidia.com/gpu failed: "));
  CHECK_FALSE(fs::exists(gpus.socket_path()));

  REQUIRE(kubelet.Start().ok());
  REQUIRE(gpus.Start().ok());
  REQUIRE(kubelet.WaitForStreaming(kGpu, true, kWait));
  REQUIRE(kubelet.Restart().ok());
  CHECK_FALSE(fs::exists(gpus.socket_path()));
  gpus.Stop();
  REQUIRE(gpus.Start().ok());
  CHECK(kubelet.registrations(kGpu) == 2);
  CHECK(kubelet.WaitForStreaming(kGpu, true, kWait));
}
