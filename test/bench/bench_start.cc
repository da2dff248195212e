// Measure 3: the daemon's start to its registration on the p5 node,
// against a bare gRPC server's start and hwloc loading the same node.
#include <sys/inotify.h>

#include "absl/strings/str_format.h"
#include "test/bench/bench.h"
#include "topology/hwloc_loader.h"

namespace efa::bench {

// 3. Process start to Register received, against hwloc loading the same
// node in this process.
void MeasureStart(Bench& bench) {
  std::vector<double> registered, hwloc, echo_bound;
  const fs::path echo_dir = bench.p5.path() / "echo-start";
  fs::create_directories(echo_dir);
  for (int i = 0; i < bench.settings.starts; ++i) {
    {
      DirectoryWatch watch(echo_dir, IN_CREATE);
      const auto start = Clock::now();
      ChildProcess echo({bench.settings.echo, (echo_dir / "echo.sock").string()},
                        bench.logs() / "echo-start.log");
      if (!watch.Wait(kDeadline)) Fail("the echo server bound no socket within 10 s");
      echo_bound.push_back(Seconds(Clock::now() - start));
      if (echo.Stop(kDeadline) != 0) Fail("the echo server did not stop on SIGTERM");
    }
    auto start = Clock::now();
    auto topology = efa::topology::LoadTopology({bench.p5.path().string(), ""});
    if (!topology.ok()) Fail(std::string(topology.status().message()));
    hwloc.push_back(Seconds(Clock::now() - start));

    const int before = bench.kubelet.registrations(kEfa);
    const int lists = bench.kubelet.list_and_watch_messages(kEfa);
    start = Clock::now();
    auto daemon =
        std::make_unique<ChildProcess>(bench.DaemonArgs(bench.p5), bench.logs() / "daemon-p5.log");
    if (!bench.kubelet.WaitForRegistrations(kEfa, before + 1, kDeadline)) {
      Fail("the daemon did not register within 10 s");
    }
    registered.push_back(Seconds(Clock::now() - start));
    // Its first device list too, which makes the kubelet rewrite its
    // checkpoint: it must not come in the middle of measure 1's admission
    // (the kubelet keeps the previous daemon's list meanwhile).
    if (!bench.kubelet.WaitForListAndWatchMessages(kEfa, lists + 1, kDeadline)) {
      Fail("the daemon sent no device list within 10 s of registering");
    }
    if (i + 1 < bench.settings.starts) {
      if (daemon->Stop(kDeadline) != 0) Fail("the daemon did not stop cleanly on SIGTERM");
    } else {
      bench.daemon = std::move(daemon);  // serves the measures that follow
    }
  }
  const double value = Median(registered), echo = Median(echo_bound);
  bench.rows.push_back(
      {3, absl::StrFormat("start → registered, p5.48xlarge (median of %d)", bench.settings.starts),
       Ms(value), "bare gRPC server (efa-bench-echo) start → socket bound: " + Ms(echo),
       value / echo, "≤ 1.25× echo", value <= 1.25 * echo});
  const double hwloc_load = Median(hwloc);
  bench.rows.push_back({3, "hwloc loads the p5 node (the daemon does so after registering)",
                        Ms(hwloc_load), "echo start: " + Ms(echo), hwloc_load / echo, "–",
                        std::nullopt});
}

}  // namespace efa::bench
