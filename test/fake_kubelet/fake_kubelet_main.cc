// fake-kubelet: serves kubelet.sock in a directory, waits for a device plugin
// to register, prints what it advertises and, with --allocate N, does what the
// kubelet does when a pod asks for N devices (GetPreferredAllocation, then
// Allocate). With --accelerators MACHINE it also runs the fake GPU or Neuron
// plugin of a simulated machine, and with --admit it admits one container
// asking for several resources in the given order, as the kubelet's device
// manager does. Used by the README demo; exits 0 when all of that worked.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "test/fake_kubelet/fake_accelerator_plugin.h"
#include "test/fake_kubelet/fake_kubelet.h"
#include "test/sim/machine_spec.h"

namespace {

using Clock = std::chrono::steady_clock;
using efa::testing::AcceleratorKind;
using efa::testing::FakeAcceleratorPlugin;
using efa::testing::FakeAcceleratorPluginOptions;
using efa::testing::FakeKubelet;

int Fail(const std::string& message) {
  std::fprintf(stderr, "fake-kubelet: %s\n", message.c_str());
  return 1;
}

std::chrono::milliseconds Remaining(Clock::time_point deadline) {
  return std::max(std::chrono::milliseconds(0),
                  std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
}

std::string YesNo(bool value) { return value ? "yes" : "no"; }

std::string NumaNodes(const v1beta1::Device& device) {
  if (!device.has_topology() || device.topology().nodes().empty()) return "-";
  std::vector<int64_t> nodes;
  for (const auto& node : device.topology().nodes()) nodes.push_back(node.id());
  return absl::StrJoin(nodes, ",");
}

void PrintRegistration(const v1beta1::RegisterRequest& request,
                       const v1beta1::DevicePluginOptions& options) {
  std::printf("Registered %s\n", request.resource_name().c_str());
  std::printf("  version   %s\n", request.version().c_str());
  std::printf("  endpoint  %s\n", request.endpoint().c_str());
  std::printf("  options   GetPreferredAllocation: %s, PreStartContainer: %s\n",
              YesNo(options.get_preferred_allocation_available()).c_str(),
              YesNo(options.pre_start_required()).c_str());
}

void PrintDevices(const std::vector<v1beta1::Device>& devices) {
  const auto healthy = std::count_if(devices.begin(), devices.end(),
                                     [](const auto& d) { return d.health() == "Healthy"; });
  std::printf("\n%zu device(s) advertised: %ld healthy, %ld unhealthy\n", devices.size(),
              static_cast<long>(healthy), static_cast<long>(devices.size() - healthy));
  if (devices.empty()) return;
  size_t width = 2;
  for (const auto& d : devices) width = std::max(width, d.id().size());
  const int w = static_cast<int>(width);
  std::printf("  %-*s  %-9s  %s\n", w, "ID", "HEALTH", "NUMA");
  for (const auto& d : devices) {
    std::printf("  %-*s  %-9s  %s\n", w, d.id().c_str(), d.health().c_str(), NumaNodes(d).c_str());
  }
}

void PrintAllocation(const v1beta1::ContainerAllocateResponse& response) {
  std::printf("  device nodes (host -> container, permissions):\n");
  if (response.devices().empty()) std::printf("    (none)\n");
  for (const auto& spec : response.devices()) {
    std::printf("    %s -> %s  %s\n", spec.host_path().c_str(), spec.container_path().c_str(),
                spec.permissions().c_str());
  }
  // Protobuf maps have no order; a person wants one.
  std::vector<std::pair<std::string, std::string>> envs(response.envs().begin(),
                                                        response.envs().end());
  std::sort(envs.begin(), envs.end());
  std::printf("  environment:\n");
  if (envs.empty()) std::printf("    (none)\n");
  for (const auto& [name, value] : envs) {
    std::printf("    %s=%s\n", name.c_str(), value.c_str());
  }
  if (!response.mounts().empty()) {
    std::printf("  mounts (host -> container):\n");
    for (const auto& mount : response.mounts()) {
      std::printf("    %s -> %s%s\n", mount.host_path().c_str(), mount.container_path().c_str(),
                  mount.read_only() ? "  (read-only)" : "");
    }
  }
  if (!response.annotations().empty()) {
    std::vector<std::pair<std::string, std::string>> annotations(response.annotations().begin(),
                                                                 response.annotations().end());
    std::sort(annotations.begin(), annotations.end());
    std::printf("  annotations:\n");
    for (const auto& [name, value] : annotations) {
      std::printf("    %s=%s\n", name.c_str(), value.c_str());
    }
  }
  if (!response.cdi_devices().empty()) {
    std::printf("  CDI devices:\n");
    for (const auto& device : response.cdi_devices()) {
      std::printf("    %s\n", device.name().c_str());
    }
  }
}

// Chooses `n` of the healthy devices as the kubelet does: asks the plugin for
// its preference when it offers one, keeps the answer's IDs that are available
// (once each) and fills any shortfall itself. Prints the choice.
bool ChooseDevices(FakeKubelet& kubelet, const std::string& resource, bool ask_plugin,
                   const std::vector<std::string>& available, int n,
                   std::vector<std::string>* chosen) {
  std::vector<std::string> preferred;
  if (ask_plugin) {
    v1beta1::PreferredAllocationRequest request;
    auto* container = request.add_container_requests();
    for (const auto& id : available) container->add_available_deviceids(id);
    container->set_allocation_size(n);
    v1beta1::PreferredAllocationResponse response;
    const grpc::Status status = kubelet.GetPreferredAllocation(resource, request, &response);
    if (!status.ok()) {
      Fail(absl::StrFormat("GetPreferredAllocation failed (the kubelet rejects the pod): %s",
                           status.error_message()));
      return false;
    }
    if (!response.container_responses().empty()) {
      const auto& ids = response.container_responses(0).deviceids();
      preferred.assign(ids.begin(), ids.end());
    }
    std::printf("\nGetPreferredAllocation (%d of %zu available): %s\n", n, available.size(),
                preferred.empty() ? "(no preference)" : absl::StrJoin(preferred, ", ").c_str());
  } else {
    std::printf("\nThe plugin offers no GetPreferredAllocation: the kubelet picks %d\n", n);
  }

  const std::set<std::string> is_available(available.begin(), available.end());
  std::set<std::string> taken;
  for (const auto& id : preferred) {
    if (static_cast<int>(chosen->size()) == n) break;
    if (is_available.count(id) != 0 && taken.insert(id).second) chosen->push_back(id);
  }
  const size_t from_plugin = chosen->size();
  for (const auto& id : available) {
    if (static_cast<int>(chosen->size()) == n) break;
    if (taken.insert(id).second) chosen->push_back(id);
  }
  if (ask_plugin && chosen->size() != from_plugin) {
    std::printf("  the kubelet added %zu device(s) to make up %d\n", chosen->size() - from_plugin,
                n);
  }
  return true;
}

// Parses "res=N,res=N" (order kept). Fails naming the bad item.
absl::StatusOr<std::vector<std::pair<std::string, int>>> ParseRequests(const std::string& text) {
  std::vector<std::pair<std::string, int>> requests;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(item, '=');
    int count = 0;
    if (parts.first.empty() || !absl::SimpleAtoi(parts.second, &count) || count < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--admit: expected RESOURCE=COUNT like \"nvidia.com/gpu=1\", got \"%s\"", item));
    }
    requests.emplace_back(std::string(parts.first), count);
  }
  if (requests.empty()) return absl::InvalidArgumentError("--admit: no resource given");
  return requests;
}

// Starts the fake plugins of the accelerators `machine` has (none if it has
// none); they register with the kubelet serving in `dir`.
absl::Status StartAccelerators(const std::string& machine, const std::string& dir, bool mofed,
                               std::vector<std::unique_ptr<FakeAcceleratorPlugin>>* plugins) {
  absl::StatusOr<efa::sim::MachineSpec> spec = efa::sim::FindMachine(machine);
  if (!spec.ok()) return spec.status();
  for (AcceleratorKind kind : {AcceleratorKind::kNvidiaGpu, AcceleratorKind::kNeuron}) {
    FakeAcceleratorPluginOptions options;
    options.kind = kind;
    options.device_plugin_dir = dir;
    options.mofed_enabled = mofed;
    auto plugin = std::make_unique<FakeAcceleratorPlugin>(*spec, options);
    if (plugin->accelerators().empty()) continue;
    if (absl::Status status = plugin->Start(); !status.ok()) return status;
    std::printf("fake-kubelet: started a fake %s plugin with %zu device(s) of %s\n",
                plugin->resource_name().c_str(), plugin->accelerators().size(), machine.c_str());
    plugins->push_back(std::move(plugin));
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  // The plugin may vanish mid-call; a write to its socket must not kill us.
  signal(SIGPIPE, SIG_IGN);

  CLI::App app{
      "A fake kubelet: serves kubelet.sock in DIR, waits for a device plugin to register, "
      "prints what it advertises and optionally allocates devices as for a pod."};
  std::string dir;
  std::string resource = "vpc.amazonaws.com/efa";
  int allocate = 0;
  std::string timeout_text = "10";
  app.add_option("--dir", dir, "The device-plugin directory (kubelet.sock is served there)")
      ->required();
  app.add_option("--resource", resource, "The resource to wait for")->capture_default_str();
  std::string pod_resources_socket;
  std::string accelerators;
  bool mofed = false;
  std::string admit;
  auto* allocate_option =
      app.add_option("--allocate", allocate,
                     "Allocate N devices for one container (GetPreferredAllocation, Allocate)")
          ->check(CLI::NonNegativeNumber);
  app.add_option("--pod-resources-socket", pod_resources_socket,
                 "Also serve the pod-resources API v1 on this socket "
                 "(normally <kubelet-dir>/pod-resources/kubelet.sock)");
  app.add_option("--accelerators", accelerators,
                 "Also run the fake nvidia.com/gpu or aws.amazon.com/neuron plugin of this "
                 "simulated machine (e.g. p5.48xlarge, trn2.48xlarge) in DIR");
  app.add_flag("--mofed", mofed,
               "The fake GPU plugin answers NVIDIA_MOFED=enabled (its --mofed-enabled)");
  app.add_option("--admit", admit,
                 "Admit one container asking for RESOURCE=COUNT,... in this order, as the "
                 "kubelet's device manager does (e.g. nvidia.com/gpu=1,vpc.amazonaws.com/efa=4)")
      ->excludes(allocate_option);
  std::vector<std::string> claims;
  app.add_option("--claim", claims,
                 "List in pod-resources a container \"main\" of pod NAMESPACE/POD using "
                 "ResourceClaim NAMESPACE/CLAIM of driver dra.net prepared without devices, as "
                 "DRANET prepares them (NAMESPACE/POD/CLAIM; repeatable)");
  bool hold = false;
  app.add_flag("--hold", hold,
               "Then keep serving until SIGTERM or SIGINT, for a daemon (and its metrics) to "
               "run against");
  app.add_option("--timeout", timeout_text,
                 "Seconds to wait for the registration and the first device list (\"10\" or "
                 "\"10s\")")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  // Blocked before gRPC starts its threads, so that only sigwait() below
  // takes them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  if (hold) pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  int timeout_seconds = 0;
  if (!absl::SimpleAtoi(absl::StripSuffix(timeout_text, "s"), &timeout_seconds) ||
      timeout_seconds <= 0) {
    return Fail(
        absl::StrFormat("--timeout: expected a positive number of seconds like \"10\" or "
                        "\"10s\", got \"%s\"",
                        timeout_text));
  }
  const auto deadline = Clock::now() + std::chrono::seconds(timeout_seconds);
  std::vector<std::pair<std::string, int>> requests;
  if (!admit.empty()) {
    auto parsed = ParseRequests(admit);
    if (!parsed.ok()) return Fail(std::string(parsed.status().message()));
    requests = *std::move(parsed);
  }

  FakeKubelet::Options kubelet_options;
  kubelet_options.device_plugin_dir = dir;
  kubelet_options.pod_resources_socket = pod_resources_socket;
  FakeKubelet kubelet(kubelet_options);
  if (absl::Status status = kubelet.Start(); !status.ok()) {
    return Fail(std::string(status.message()));
  }
  std::printf("fake-kubelet: serving %s, waiting up to %ds for %s\n", kubelet.socket_path().c_str(),
              timeout_seconds, resource.c_str());
  if (!pod_resources_socket.empty()) {
    std::printf("fake-kubelet: serving the pod-resources API on %s\n",
                pod_resources_socket.c_str());
  }
  for (const std::string& claim : claims) {
    const std::vector<std::string> parts = absl::StrSplit(claim, '/');
    if (parts.size() != 3 || parts[0].empty() || parts[1].empty() || parts[2].empty()) {
      return Fail(absl::StrFormat("--claim: expected NAMESPACE/POD/CLAIM, got \"%s\"", claim));
    }
    const FakeKubelet::PreparedClaim prepared{parts[2], parts[0], {{"dra.net", {}}}};
    if (absl::Status status =
            kubelet.PrepareClaim(parts[1], parts[0], "uid-" + parts[1], prepared, {"main"});
        !status.ok()) {
      return Fail(std::string(status.message()));
    }
    std::printf("fake-kubelet: pod %s/%s uses ResourceClaim %s/%s (no devices listed)\n",
                parts[0].c_str(), parts[1].c_str(), parts[0].c_str(), parts[2].c_str());
  }
  std::vector<std::unique_ptr<FakeAcceleratorPlugin>> plugins;
  if (!accelerators.empty()) {
    if (absl::Status status = StartAccelerators(accelerators, dir, mofed, &plugins); !status.ok()) {
      return Fail(std::string(status.message()));
    }
  }
  std::fflush(stdout);

  if (!kubelet.WaitForRegistrations(resource, 1, Remaining(deadline))) {
    return Fail(absl::StrFormat("timed out after %ds: no device plugin registered %s at %s",
                                timeout_seconds, resource, kubelet.socket_path().string()));
  }
  const v1beta1::RegisterRequest request = *kubelet.last_request(resource);
  const v1beta1::DevicePluginOptions options = *kubelet.options(resource);
  PrintRegistration(request, options);
  std::fflush(stdout);

  if (!kubelet.WaitForListAndWatchMessages(resource, 1, Remaining(deadline))) {
    return Fail(absl::StrFormat("timed out after %ds: %s registered but sent no device list",
                                timeout_seconds, resource));
  }
  const std::vector<v1beta1::Device> devices = kubelet.devices(resource);
  PrintDevices(devices);

  if (allocate > 0) {
    std::vector<std::string> healthy;
    for (const auto& d : devices) {
      if (d.health() == "Healthy") healthy.push_back(d.id());
    }
    if (static_cast<int>(healthy.size()) < allocate) {
      return Fail(absl::StrFormat(
          "cannot allocate %d device(s): only %d healthy (the kubelet rejects such a pod)",
          allocate, healthy.size()));
    }
    std::vector<std::string> chosen;
    if (!ChooseDevices(kubelet, resource, options.get_preferred_allocation_available(), healthy,
                       allocate, &chosen)) {
      return 1;
    }

    v1beta1::AllocateRequest allocate_request;
    auto* container = allocate_request.add_container_requests();
    for (const auto& id : chosen) container->add_devices_ids(id);
    v1beta1::AllocateResponse response;
    const grpc::Status status = kubelet.Allocate(resource, allocate_request, &response);
    if (!status.ok()) {
      return Fail(absl::StrFormat("Allocate %s failed (the kubelet rejects the pod): %s",
                                  absl::StrJoin(chosen, ", "), status.error_message()));
    }
    if (response.container_responses().empty()) {
      return Fail("Allocate returned no container response (the kubelet rejects the pod)");
    }
    std::printf("\nAllocate %s:\n", absl::StrJoin(chosen, ", ").c_str());
    PrintAllocation(response.container_responses(0));

    if (options.pre_start_required()) {
      v1beta1::PreStartContainerRequest pre_start;
      for (const auto& id : chosen) pre_start.add_devices_ids(id);
      v1beta1::PreStartContainerResponse pre_started;
      const grpc::Status pre = kubelet.PreStartContainer(resource, pre_start, &pre_started);
      if (!pre.ok()) {
        return Fail(absl::StrFormat("PreStartContainer failed (the container does not start): %s",
                                    pre.error_message()));
      }
      std::printf("\nPreStartContainer: ok\n");
    }
  }
  if (!requests.empty()) {
    // Every plugin asked for must have sent its list, or its devices count
    // as unavailable.
    for (const auto& [name, count] : requests) {
      if (count > 0 && !kubelet.WaitForStreaming(name, true, Remaining(deadline))) {
        return Fail(absl::StrFormat("timed out after %ds: no device plugin is streaming %s",
                                    timeout_seconds, name));
      }
    }
    auto admitted = kubelet.AdmitContainer("demo", "default", "demo-pod-uid", "main", requests);
    if (!admitted.ok()) return Fail(std::string(admitted.status().message()));
    for (const auto& allocation : admitted->allocations) {
      std::printf("\nAdmitted %s: %s\n", allocation.resource.c_str(),
                  absl::StrJoin(allocation.device_ids, ", ").c_str());
      PrintAllocation(allocation.response);
    }
    if (!admitted->start_status.ok()) {
      return Fail(
          absl::StrFormat("the container does not start: %s", admitted->start_status.message()));
    }
    std::printf("\nCheckpoint written to %s\n", kubelet.checkpoint_path().c_str());
  }
  std::fflush(stdout);
  if (hold) {
    std::printf("fake-kubelet: holding until SIGTERM\n");
    std::fflush(stdout);
    int signal_number = 0;
    sigwait(&stop_signals, &signal_number);
  }
  for (auto& plugin : plugins) plugin->Stop();
  kubelet.Stop();
  return 0;
}
