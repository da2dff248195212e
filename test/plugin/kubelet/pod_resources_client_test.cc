#include "plugin/kubelet/pod_resources_client.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "test/fake_kubelet/fake_accelerator_plugin.h"
#include "test/fake_kubelet/fake_kubelet.h"
#include "test/sim/machine_spec.h"
#include "test/support/devices.h"
#include "test/support/temp_dir.h"

using namespace std::chrono_literals;
using efa::plugin::PodResourcesClient;
using efa::testing::AcceleratorKind;
using efa::testing::FakeAcceleratorPlugin;
using efa::testing::FakeKubelet;
using efa::testing::TempDir;

namespace {

using efa::testing::kDeadline;
using efa::testing::kGpu;

// A fake kubelet serving pod-resources in a temporary kubelet directory,
// with the fake GPU plugin of a p5.48xlarge registered.
struct Kubelet {
  Kubelet()
      : kubelet(FakeKubelet::ForKubeletDir(dir.path())),
        gpus(*efa::sim::FindMachine("p5.48xlarge"), AcceleratorKind::kNvidiaGpu,
             dir.path() / "device-plugins") {
    REQUIRE(kubelet.Start().ok());
    REQUIRE(gpus.Start().ok());
    REQUIRE(kubelet.WaitForListAndWatchMessages(kGpu, 1, kDeadline));
  }
  // Admits pod <name> (UID uid-<name>) with one container "main" of `count` GPUs.
  void Admit(const std::string& name, int count) {
    REQUIRE(kubelet.AdmitContainer(name, "default", "uid-" + name, "main", {{kGpu, count}}).ok());
  }
  std::string socket() const { return kubelet.pod_resources_socket_path().string(); }

  TempDir dir;
  FakeKubelet kubelet;
  FakeAcceleratorPlugin gpus;
};

// "namespace/pod/container resource=id,id" for each container's devices.
std::vector<std::string> Listed(const v1::ListPodResourcesResponse& response) {
  std::vector<std::string> out;
  for (const auto& pod : response.pod_resources()) {
    for (const auto& container : pod.containers()) {
      for (const auto& devices : container.devices()) {
        out.push_back(pod.namespace_() + "/" + pod.name() + "/" + container.name() + " " +
                      devices.resource_name() + "=" + absl::StrJoin(devices.device_ids(), ","));
      }
    }
  }
  return out;
}

// Options with a timeout no loaded machine misses, for tests not about it.
PodResourcesClient::Options Patient() {
  PodResourcesClient::Options options;
  options.timeout = kDeadline;
  return options;
}

// Calls List (not rate-limited) until it succeeds or the deadline passes.
absl::StatusOr<v1::ListPodResourcesResponse> ListUntilOk(PodResourcesClient& client) {
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  auto list = client.List(/*rate_limited=*/false);
  while (!list.ok() && std::chrono::steady_clock::now() < deadline) list = client.List(false);
  return list;
}

}  // namespace

TEST_CASE("PodResourcesClient lists the devices of the admitted pods", "[kubelet]") {
  Kubelet k;
  k.Admit("a", 1);
  k.Admit("b", 2);
  PodResourcesClient client(k.socket(), Patient());
  CHECK(client.socket() == k.socket());
  auto list = client.List();
  REQUIRE(list.ok());
  const auto a = k.kubelet.container_devices("uid-a", "main", kGpu);
  const auto b = k.kubelet.container_devices("uid-b", "main", kGpu);
  REQUIRE(a.size() == 1);
  REQUIRE(b.size() == 2);
  // The fake kubelet lists one entry per device (kubelet 1.21 and later).
  CHECK(Listed(*list) == std::vector<std::string>{"default/a/main nvidia.com/gpu=" + a[0],
                                                  "default/b/main nvidia.com/gpu=" + b[0],
                                                  "default/b/main nvidia.com/gpu=" + b[1]});
  CHECK(k.kubelet.pod_resources_calls() == 1);
}

TEST_CASE("PodResourcesClient fails at once, naming the socket, while it is absent", "[kubelet]") {
  TempDir dir;
  const std::string socket = (dir.path() / "pod-resources/kubelet.sock").string();
  PodResourcesClient client(socket, {});
  for (int i = 0; i < 2; ++i) {
    auto list = client.List();
    REQUIRE_FALSE(list.ok());
    CHECK(list.status().code() == absl::StatusCode::kUnavailable);
    CHECK(list.status().message() ==
          socket + ": List: no such socket (the kubelet's pod-resources API is not served there)");
  }
}

TEST_CASE("PodResourcesClient finds the pod-resources socket again when it comes back",
          "[kubelet]") {
  Kubelet k;
  k.Admit("a", 1);
  PodResourcesClient client(k.socket(), Patient());
  REQUIRE(client.List().ok());
  k.kubelet.StopPodResources();
  auto down = client.List(false);
  REQUIRE_FALSE(down.ok());
  CHECK(down.status().code() == absl::StatusCode::kUnavailable);
  CHECK(down.status().message().find(k.socket() + ": List: ") == 0);
  REQUIRE(k.kubelet.StartPodResources().ok());
  auto up = ListUntilOk(client);
  REQUIRE(up.ok());
  CHECK(Listed(*up).size() == 1);
  // And after a whole kubelet restart, which serves a new socket (and lists
  // the pods once it has them from the API server again).
  REQUIRE(k.kubelet.Restart().ok());
  k.kubelet.SyncPods();
  auto restarted = ListUntilOk(client);
  REQUIRE(restarted.ok());
  CHECK(Listed(*restarted) == Listed(*up));
}

TEST_CASE("PodResourcesClient gives up after its timeout, naming the socket", "[kubelet]") {
  Kubelet k;
  PodResourcesClient::Options options;
  options.timeout = 100ms;
  PodResourcesClient client(k.socket(), options);
  k.kubelet.SetPodResourcesDelay(5s);
  auto slow = client.List(false);
  REQUIRE_FALSE(slow.ok());
  CHECK(slow.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(slow.status().message().find(k.socket() + ": List: ") == 0);
  // A prompt kubelet is asked again on a fresh connection.
  k.kubelet.SetPodResourcesDelay(0ms);
  CHECK(ListUntilOk(client).ok());
}

TEST_CASE("PodResourcesClient limits its own rate, but not calls that must not wait", "[kubelet]") {
  Kubelet k;
  PodResourcesClient::Options options = Patient();
  options.max_qps = 0.001;
  options.burst = 2;
  PodResourcesClient client(k.socket(), options);
  CHECK(client.List().ok());
  CHECK(client.List().ok());
  auto over = client.List();
  REQUIRE_FALSE(over.ok());
  CHECK(over.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(over.status().message() ==
        k.socket() + ": over the client's own rate limit of 0.001 queries per second");
  // Refused here: the kubelet never saw it.
  CHECK(k.kubelet.pod_resources_calls() == 2);
  CHECK(client.List(/*rate_limited=*/false).ok());
  CHECK(k.kubelet.pod_resources_calls() == 3);
  // That call spent a token too: still over.
  CHECK(client.List().status().code() == absl::StatusCode::kResourceExhausted);
  // The kubelet's own limit is reported as such.
  k.kubelet.SetPodResourcesExhausted(true);
  auto kubelet_over = client.List(false);
  CHECK(kubelet_over.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(kubelet_over.status().message().find(k.socket() + ": List: ") == 0);
}

TEST_CASE("PodResourcesClient refuses a List answer over its bound, naming the socket",
          "[kubelet]") {
  Kubelet k;
  // Pod names may be 253 characters; 8 pods of 100 make an answer over 1 KiB.
  for (char c = 'a'; c < 'a' + 8; ++c) k.Admit(std::string(100, c), 1);
  PodResourcesClient unbounded(k.socket(), Patient());
  auto whole = unbounded.List(false);
  REQUIRE(whole.ok());
  const size_t size = whole->ByteSizeLong();
  REQUIRE(size > 1024);

  PodResourcesClient::Options options = Patient();
  options.max_answer_bytes = 1024;
  PodResourcesClient client(k.socket(), options);
  auto over = client.List(false);
  REQUIRE_FALSE(over.ok());
  CHECK(over.status().code() == absl::StatusCode::kResourceExhausted);
  const std::string message(over.status().message());
  CHECK(message.find(k.socket() + ": List: answer larger than 1 KiB, refused (") == 0);
  CHECK(message.find("(" + std::to_string(size) + " vs. 1024)") != std::string::npos);

  // Under the bound again: the same client reads it.
  for (char c = 'a'; c < 'a' + 6; ++c) {
    REQUIRE(k.kubelet.RemovePod("uid-" + std::string(100, c)).ok());
  }
  auto under = ListUntilOk(client);
  REQUIRE(under.ok());
  CHECK(Listed(*under).size() == 2);
}
