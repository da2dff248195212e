// Measures 1 and 4: Allocate and GetPreferredAllocation round trips of the
// daemon on the p5 node against an echo server's, and the resident memory
// after them, from one client and from several at once.
#include <algorithm>
#include <array>
#include <atomic>
#include <fstream>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "grpcpp/grpcpp.h"
#include "podresources/v1/api.grpc.pb.h"
#include "test/bench/bench.h"
#include "test/sim/machine_spec.h"
#include "test/support/proc_stats.h"

namespace efa::bench {

namespace {

// Puts the node in the state GetPreferredAllocation sees while the kubelet
// admits a pod of 1 GPU + 4 EFAs, GPU first: pod-resources lists the
// container with its GPU and no EFA yet, and the checkpoint does not hold
// it (the kubelet writes it once all of the container's resources are
// allocated). Returns the GPU's ID.
std::string AdmitGpuContainer(Bench& bench) {
  if (!bench.kubelet.WaitForStreaming(kGpu, true, kDeadline))
    Fail("the fake GPU plugin streams no GPU");
  const fs::path checkpoint = bench.kubelet.checkpoint_path();
  const auto before = ReadFile(checkpoint);
  auto admitted =
      bench.kubelet.AdmitContainer("train-0", "default", "uid-train-0", "main", {{kGpu, 1}});
  if (!admitted.ok()) Fail(std::string(admitted.status().message()));
  if (before) {
    const fs::path tmp = checkpoint.string() + ".bench";
    std::ofstream(tmp, std::ios::binary) << *before;
    fs::rename(tmp, checkpoint);
  } else {
    fs::remove(checkpoint);
  }
  return admitted->allocations[0].device_ids[0];
}

// The IDs of the EFAs behind the same PCIe switch as GPU `id`, sorted.
std::vector<std::string> EfasBeside(const Bench& bench, const std::string& id) {
  std::vector<std::string> efas;
  for (const auto& gpu : bench.gpus.accelerators()) {
    if (gpu.id != id) continue;
    for (const auto& group : bench.p5_spec.groups) {
      const bool here = std::any_of(group.endpoints.begin(), group.endpoints.end(),
                                    [&](const auto& e) { return e.addr == gpu.address; });
      for (const auto& e : group.endpoints) {
        if (here && e.kind == efa::sim::Kind::kEfa) {
          efas.push_back(efa::sim::VerbsName(e.kind, e.addr, 0, efa::sim::Naming::kUdev));
        }
      }
    }
  }
  std::sort(efas.begin(), efas.end());
  return efas;
}

// A v1beta1.DevicePlugin server under measure, and its round trips.
struct Server {
  Server(std::string server_name, const fs::path& socket, pid_t process_id)
      : name(std::move(server_name)), stub(Connect(socket)), pid(process_id) {}
  std::string name;
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub;
  pid_t pid;
  long served = 0;
  std::vector<double> allocate, prefer;  // seconds per round trip
  std::vector<std::string> preferred;    // the latest answer, sorted
};

Row GrowthRow(const std::string& figure, long long daemon_from, long long daemon_to,
              long long echo_from, long long echo_to) {
  auto growth = [](long long from, long long to) {
    return absl::StrFormat("%s → %s (%+.1f MiB)", Mib(from), Mib(to),
                           static_cast<double>(to - from) / 1024);
  };
  return {4,
          figure,
          growth(daemon_from, daemon_to),
          "echo " + growth(echo_from, echo_to),
          (static_cast<double>(daemon_to) / static_cast<double>(daemon_from)) /
              (static_cast<double>(echo_to) / static_cast<double>(echo_from)),
          "flat: ≤ +1 MiB",
          daemon_to - daemon_from <= 1024};
}

// 4. The same calls from kClients threads at once, to the daemon and to
// the echo server alike: resident memory after a tenth of them and after
// all (gRPC serves them on more threads, each of which may get a malloc
// arena of its own).
void MeasureConcurrentRss(Bench& bench, Server& daemon, Server& echo,
                          const v1beta1::AllocateRequest& allocate,
                          const v1beta1::PreferredAllocationRequest& prefer) {
  constexpr int kClients = 8;
  const long per_client = bench.settings.rpcs / kClients;
  auto run = [&](long calls) {
    std::vector<std::thread> clients;
    std::atomic<bool> failed{false};
    for (int c = 0; c < kClients; ++c) {
      clients.emplace_back([&, c] {
        for (long i = 0; i < calls / 2 && !failed; ++i) {
          for (Server* s : c % 2 ? std::array{&daemon, &echo} : std::array{&echo, &daemon}) {
            grpc::ClientContext a, b;
            v1beta1::AllocateResponse allocated;
            v1beta1::PreferredAllocationResponse preferred;
            if (!s->stub->Allocate(&a, allocate, &allocated).ok() ||
                !s->stub->GetPreferredAllocation(&b, prefer, &preferred).ok()) {
              failed = true;
            }
          }
        }
      });
    }
    for (std::thread& t : clients) t.join();
    if (failed) Fail("a call failed under concurrent load");
  };
  run(per_client / 10);
  const long long daemon10 = efa::testing::ResidentKiB(daemon.pid);
  const long long echo10 = efa::testing::ResidentKiB(echo.pid);
  run(per_client - per_client / 10);
  const long long daemon_all = efa::testing::ResidentKiB(daemon.pid);
  const long long echo_all = efa::testing::ResidentKiB(echo.pid);
  bench.details.push_back(MemoryDetail(absl::StrFormat("after the calls from %d clients", kClients),
                                       daemon.pid, echo.pid));
  bench.rows.push_back({4,
                        absl::StrFormat("RSS after %s more RPCs from %d clients at once",
                                        Count(per_client * kClients), kClients),
                        Mib(daemon_all), "echo " + Mib(echo_all),
                        static_cast<double>(daemon_all) / static_cast<double>(echo_all),
                        "≤ 1.25× echo", daemon_all * 4 <= echo_all * 5});
  bench.rows.push_back(
      GrowthRow(absl::StrFormat("RSS from %s to %s concurrent RPCs",
                                Count(per_client * kClients / 10), Count(per_client * kClients)),
                daemon10, daemon_all, echo10, echo_all));
}

}  // namespace

// 1 and 4. Allocate and GetPreferredAllocation round trips of the daemon,
// of a second daemon that needs no lookup, of the echo server and the
// pod-resources List, all interleaved; then the resident memory after
// that load and after the same load from several clients at once.
void MeasureRpcs(Bench& bench) {
  auto healthy32 = [](const std::vector<v1beta1::Device>& devices) {
    return devices.size() == 32 && std::all_of(devices.begin(), devices.end(),
                                               [](auto& d) { return d.health() == "Healthy"; });
  };
  if (!bench.kubelet.WaitForDevices(kEfa, healthy32, kDeadline))
    Fail("the daemon lists no 32 EFAs");
  for (const auto& d : bench.kubelet.devices(kEfa)) bench.ids.push_back(d.id());
  const std::vector<std::string> aligned = EfasBeside(bench, AdmitGpuContainer(bench));
  if (aligned.size() != 4) Fail("the GPU has no 4 EFAs beside it");

  const fs::path echo_socket = bench.p5.path() / "echo/echo.sock";
  fs::create_directories(echo_socket.parent_path());
  bench.echo = std::make_unique<ChildProcess>(
      std::vector<std::string>{bench.settings.echo, echo_socket.string()},
      bench.logs() / "echo.log");
  // The same node seen by a daemon with no pod-resources API to ask (its
  // kubelet dir holds nothing): GetPreferredAllocation needs no lookup.
  // It serves its socket without registering.
  const fs::path lone_kubelet = bench.p5.path() / "kubelet-absent";
  ChildProcess lone_daemon(bench.DaemonArgs(bench.p5, lone_kubelet),
                           bench.logs() / "daemon-no-lookup.log");
  Server daemon("the daemon",
                bench.p5.path() / "kubelet/device-plugins/efa/aws-efa-device-plugin.sock",
                bench.daemon->pid());
  Server echo("the echo server", echo_socket, bench.echo->pid());
  Server lone("the daemon without pod-resources",
              lone_kubelet / "device-plugins/efa/aws-efa-device-plugin.sock", lone_daemon.pid());
  // Its baseline: a second echo server, called as often (a process called
  // less often has colder threads).
  const fs::path rare_echo_socket = bench.p5.path() / "echo/rare-echo.sock";
  ChildProcess rare_echo_process({bench.settings.echo, rare_echo_socket.string()},
                                 bench.logs() / "echo-rare.log");
  Server rare_echo("the second echo server", rare_echo_socket, rare_echo_process.pid());
  auto pod_resources = v1::PodResourcesLister::NewStub(
      grpc::CreateChannel("unix:" + bench.kubelet.pod_resources_socket_path().string(),
                          grpc::InsecureChannelCredentials()));

  v1beta1::AllocateRequest allocate;
  auto* container = allocate.add_container_requests();
  for (const auto& id : aligned) container->add_devices_ids(id);
  v1beta1::PreferredAllocationRequest prefer;
  auto* wanted = prefer.add_container_requests();
  for (const auto& id : bench.ids) wanted->add_available_deviceids(id);
  wanted->set_allocation_size(4);

  auto call_allocate = [&](Server& s, bool record) {
    grpc::ClientContext context;
    v1beta1::AllocateResponse response;
    const auto start = Clock::now();
    const grpc::Status status = s.stub->Allocate(&context, allocate, &response);
    const double took = Seconds(Clock::now() - start);
    if (!status.ok()) Fail(s.name + ": Allocate: " + status.error_message());
    ++s.served;
    if (record) s.allocate.push_back(took);
  };
  auto call_prefer = [&](Server& s, bool record) {
    grpc::ClientContext context;
    v1beta1::PreferredAllocationResponse response;
    const auto start = Clock::now();
    const grpc::Status status = s.stub->GetPreferredAllocation(&context, prefer, &response);
    const double took = Seconds(Clock::now() - start);
    if (!status.ok()) Fail(s.name + ": GetPreferredAllocation: " + status.error_message());
    ++s.served;
    if (record) s.prefer.push_back(took);
    if (response.container_responses_size() == 1) {
      const auto& ids = response.container_responses(0).deviceids();
      s.preferred.assign(ids.begin(), ids.end());
      std::sort(s.preferred.begin(), s.preferred.end());
    }
  };
  std::vector<double> list;  // the pod-resources List alone
  auto call_list = [&](bool record) {
    grpc::ClientContext context;
    v1::ListPodResourcesResponse response;
    const auto start = Clock::now();
    if (!pod_resources->List(&context, v1::ListPodResourcesRequest(), &response).ok()) {
      Fail("pod-resources List failed");
    }
    if (record) list.push_back(Seconds(Clock::now() - start));
  };
  auto check_aligned = [&] {
    if (daemon.preferred != aligned) {
      // The kubelet rewrites its checkpoint at every device list it gets:
      // one that came during the admission shows the container as admitted.
      const bool checkpointed =
          ReadFile(bench.kubelet.checkpoint_path()).value_or("").find("uid-train-0") !=
          std::string::npos;
      Fail(absl::StrFormat(
          "GetPreferredAllocation gave %s, not the EFAs beside the GPU (%s); the checkpoint %s "
          "the container being admitted",
          absl::StrJoin(daemon.preferred, ","), absl::StrJoin(aligned, ","),
          checkpointed ? "holds" : "does not hold"));
    }
  };
  call_prefer(daemon, false);
  check_aligned();
  call_prefer(lone, false);
  if (lone.preferred.size() != 4) Fail("the daemon without pod-resources gave no 4 EFAs");

  // Not recorded: the first calls set up connections and caches.
  const long warmup = std::max(50L, bench.settings.rpcs / 100);
  long long rss10_daemon = -1, rss10_echo = -1;
  for (long i = 0; daemon.served < bench.settings.rpcs; ++i) {
    const bool record = daemon.served >= warmup;
    Server& first = i % 2 ? daemon : echo;
    Server& second = i % 2 ? echo : daemon;
    call_allocate(first, record);
    call_allocate(second, record);
    call_prefer(first, record);
    call_prefer(second, record);
    if (i % 4 == 0) {
      // The others a quarter as often, each beside its own baseline.
      Server& rare_first = i % 8 ? lone : rare_echo;
      Server& rare_second = i % 8 ? rare_echo : lone;
      call_prefer(rare_first, record);
      call_prefer(rare_second, record);
      call_list(record);
    }
    if (rss10_daemon < 0 && daemon.served >= bench.settings.rpcs / 10) {
      rss10_daemon = efa::testing::ResidentKiB(daemon.pid);
      rss10_echo = efa::testing::ResidentKiB(echo.pid);
    }
  }
  check_aligned();
  const long long rss_daemon = efa::testing::ResidentKiB(daemon.pid);
  const long long rss_echo = efa::testing::ResidentKiB(echo.pid);
  bench.details.push_back(MemoryDetail("after the calls from one client", daemon.pid, echo.pid));

  auto count = [](const std::vector<double>& v) { return Count(static_cast<long>(v.size())); };
  auto p = [](const std::vector<double>& v, double q) { return Percentile(v, q); };
  auto latency_row = [&](const std::string& figure, const std::vector<double>& samples, double q,
                         double baseline, const std::string& baseline_text, double goal,
                         const std::string& goal_text) {
    const double value = p(samples, q);
    bench.rows.push_back({1, absl::StrFormat("%s (%s calls)", figure, count(samples)), Us(value),
                          baseline_text, value / baseline, goal_text, value <= goal * baseline});
  };
  latency_row("Allocate, 4 EFAs: p50", daemon.allocate, 0.5, p(echo.allocate, 0.5),
              "echo " + Us(p(echo.allocate, 0.5)), 1.15, "≤ 1.15× echo");
  latency_row("Allocate, 4 EFAs: p99", daemon.allocate, 0.99, p(echo.allocate, 0.99),
              "echo " + Us(p(echo.allocate, 0.99)), 2, "≤ 2× echo");
  // With the GPU to look up, the floor is a round trip plus the List the
  // daemon must make: echo + List.
  for (double q : {0.5, 0.99}) {
    const double floor = p(echo.prefer, q) + p(list, q);
    const double goal = q == 0.5 ? 1.15 : 1.5;
    latency_row(absl::StrFormat("GetPreferredAllocation, 4 of 32, GPU known: p%d",
                                static_cast<int>(q * 100)),
                daemon.prefer, q, floor,
                absl::StrFormat("echo + List: %s + %s", Us(p(echo.prefer, q)), Us(p(list, q))),
                goal, absl::StrFormat("≤ %g× (echo + List)", goal));
  }
  latency_row("GetPreferredAllocation, 4 of 32, no lookup (no pod-resources): p50", lone.prefer,
              0.5, p(rare_echo.prefer, 0.5),
              "a second echo, as often: " + Us(p(rare_echo.prefer, 0.5)), 1.25, "≤ 1.25× echo");
  bench.rows.push_back(
      {1, absl::StrFormat("pod-resources List round trip alone: p50 (%s calls)", count(list)),
       Us(p(list, 0.5)), "echo GetPreferredAllocation " + Us(p(echo.prefer, 0.5)),
       p(list, 0.5) / p(echo.prefer, 0.5), "–", std::nullopt});
  bench.rows.push_back(
      {4, absl::StrFormat("RSS after %s RPCs from one client", Count(bench.settings.rpcs)),
       Mib(rss_daemon), "echo " + Mib(rss_echo),
       static_cast<double>(rss_daemon) / static_cast<double>(rss_echo), "≤ 1.25× echo",
       rss_daemon * 4 <= rss_echo * 5});
  bench.rows.push_back(
      GrowthRow(absl::StrFormat("RSS from %s to %s RPCs from one client",
                                Count(bench.settings.rpcs / 10), Count(bench.settings.rpcs)),
                rss10_daemon, rss_daemon, rss10_echo, rss_echo));
  if (lone_daemon.Stop(kDeadline) != 0) Fail("the daemon without pod-resources did not stop");
  if (rare_echo_process.Stop(kDeadline) != 0) Fail("the second echo server did not stop");

  MeasureConcurrentRss(bench, daemon, echo, allocate, prefer);
}

}  // namespace efa::bench
