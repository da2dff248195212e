// The daemon in process on a simulated node, against the fake kubelet over
// real unix sockets (test/support/test_node.h).
#include "plugin/daemon.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "test/sim/sim_root.h"
#include "test/support/descriptor_table_full.h"
#include "test/support/devices.h"
#include "test/support/sanitized.h"
#include "test/support/temp_dir.h"
#include "test/support/test_node.h"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using efa::plugin::Daemon;
using efa::plugin::DaemonOptions;
using efa::sim::Naming;
using efa::sim::SimRoot;
using efa::testing::AllHealthy;
using efa::testing::HealthOf;
using efa::testing::kDeadline;
using efa::testing::kEfa;
using efa::testing::TestNode;

TEST_CASE("The daemon registers as vpc.amazonaws.com/efa and lists the node's EFAs",
          "[daemon][concurrency]") {
  TestNode node({.machine = "p5.48xlarge"});
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  auto request = node.kubelet().last_request(kEfa);
  REQUIRE(request.has_value());
  CHECK(request->version() == "v1beta1");
  CHECK(request->endpoint() == "efa/aws-efa-device-plugin.sock");
  CHECK(request->resource_name() == kEfa);
  CHECK(request->options().get_preferred_allocation_available());
  CHECK_FALSE(request->options().pre_start_required());

  REQUIRE(node.WaitAll("Healthy", 32));
  auto devices = node.kubelet().devices(kEfa);
  CHECK(devices[0].id() == "rdmap79s0");
  CHECK(devices[0].topology().nodes(0).id() == 0);
  CHECK(devices[31].id() == "rdmap201s0");
  CHECK(devices[31].topology().nodes(0).id() == 1);

  v1beta1::AllocateRequest request4;
  auto* c = request4.add_container_requests();
  for (const char* id : {"rdmap79s0", "rdmap80s0", "rdmap81s0", "rdmap82s0"})
    c->add_devices_ids(id);
  v1beta1::AllocateResponse response;
  REQUIRE(node.kubelet().Allocate(kEfa, request4, &response).ok());
  REQUIRE(response.container_responses(0).devices_size() == 4);
  CHECK(response.container_responses(0).devices(3).container_path() == "/dev/infiniband/uverbs3");

  CHECK(node.StopDaemon() == 0);
  CHECK_FALSE(fs::exists(node.daemon().plugin_socket()));
}

TEST_CASE("The daemon registers again after a kubelet restart", "[daemon][concurrency]") {
  TestNode node({.machine = "p4d.24xlarge"});
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  for (int i = 2; i <= 4; ++i) {
    REQUIRE(node.kubelet().Restart().ok());
    REQUIRE(node.kubelet().WaitForRegistrations(kEfa, i, kDeadline));
    REQUIRE(node.kubelet().WaitForStreaming(kEfa, true, kDeadline));
  }
  CHECK(node.WaitAll("Healthy", 4));
  CHECK(fs::exists(node.daemon().plugin_socket()));
  // The kubelet closing the replaced stream must not start a loop of
  // registrations.
  CHECK_FALSE(node.kubelet().WaitForRegistrations(kEfa, 5, 500ms));
  CHECK(node.daemon().registrations() == 4);
}

TEST_CASE("The daemon registers again when the kubelet ends ListAndWatch",
          "[daemon][concurrency]") {
  TestNode node({.machine = "p4d.24xlarge"});
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  REQUIRE(node.kubelet().WaitForListAndWatchMessages(kEfa, 1, kDeadline));
  node.kubelet().EndStream(kEfa);
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 2, kDeadline));
  CHECK(node.kubelet().WaitForStreaming(kEfa, true, kDeadline));
}

TEST_CASE("A removed device turns Unhealthy and comes back Healthy", "[daemon][concurrency]") {
  TestNode node({.machine = "p4d.24xlarge"});
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  REQUIRE(node.WaitHealth("rdmap32s27", "Healthy"));
  const fs::path uverbs = node.sim().path() / "dev/infiniband/uverbs1";

  SECTION("the uverbs node") {
    fs::remove(uverbs);
    REQUIRE(node.WaitHealth("rdmap32s27", "Unhealthy"));
    CHECK(node.kubelet().devices(kEfa)[0].health() == "Healthy");
    node.sim().RestoreUverbs(1);
    REQUIRE(node.WaitHealth("rdmap32s27", "Healthy"));
  }
  SECTION("the whole verbs device") {
    const fs::path cls = node.sim().sys() / "class/infiniband/rdmap32s27";
    const fs::path target = fs::read_symlink(cls);
    fs::remove(cls);
    REQUIRE(node.WaitHealth("rdmap32s27", "Unhealthy"));
    CHECK(node.kubelet().devices(kEfa).size() == 4);
    fs::create_directory_symlink(target, cls);
    REQUIRE(node.WaitHealth("rdmap32s27", "Healthy"));
  }
  // Allocating an unhealthy device is refused; the daemon keeps serving.
  fs::remove(uverbs);
  REQUIRE(node.WaitHealth("rdmap32s27", "Unhealthy"));
  v1beta1::AllocateRequest request;
  request.add_container_requests()->add_devices_ids("rdmap32s27");
  v1beta1::AllocateResponse response;
  CHECK(node.kubelet().Allocate(kEfa, request, &response).error_code() ==
        grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_CASE("A periodic pass looks at the devices again only once the kernel counted a uevent",
          "[daemon][concurrency]") {
  TestNode node({.machine = "p4d.24xlarge", .fake_clock = true});
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  auto health = [&node] { return HealthOf(node.daemon().advertised().devices(), "rdmap32s27"); };
  REQUIRE(health() == "Healthy");
  // Unbound from its driver. A simulated root sends no event for it (the
  // link is below the watched directories); a real kernel counts a uevent.
  fs::remove(node.sim().sys() / "class/infiniband/rdmap32s27/device/driver");
  auto pass = [&] { return node.Pass(10s); };
  SECTION("a uevent counted") {
    REQUIRE(pass());
    CHECK(health() == "Healthy");  // the fingerprint was not taken
    REQUIRE(efa::sim::CountUevent(node.sim().path().string()).ok());
    REQUIRE(pass());
    // That pass may still be publishing when its heartbeat shows: waited
    // for (no other pass runs while the fake clock stands still).
    CHECK(node.WaitHealth("rdmap32s27", "Unhealthy"));
  }
  SECTION("no uevent: not even the full rescan of every sixth pass") {
    for (int n = 1; n <= 7; ++n) {
      REQUIRE(pass());
      CHECK(health() == "Healthy");
    }
    REQUIRE(efa::sim::CountUevent(node.sim().path().string()).ok());
    REQUIRE(pass());
    CHECK(node.WaitHealth("rdmap32s27", "Unhealthy"));
  }
}

TEST_CASE("On a node without EFA the daemon idles, then serves when EFAs appear",
          "[daemon][concurrency]") {
  SimRoot p4d("p4d.24xlarge");
  TestNode node({.machine = "no-efa", .fake_clock = true});
  // Several periodic passes: the daemon must neither exit nor register.
  for (int pass = 0; pass < 8; ++pass) {
    REQUIRE(node.Pass(10s));
  }
  CHECK(node.kubelet().registrations(kEfa) == 0);
  // EFAs appear: hot-plugged into the same root, found by a periodic pass
  // (a simulated root has no uevents).
  fs::remove_all(node.sim().sys());
  fs::copy(p4d.sys(), node.sim().sys(),
           fs::copy_options::recursive | fs::copy_options::copy_symlinks);
  for (int n = 0; n < 4; ++n) node.sim().RestoreUverbs(n);  // char devices do not copy
  for (int pass = 0; pass < 12 && node.kubelet().registrations(kEfa) == 0; ++pass) {
    REQUIRE(node.Pass(10s));
  }
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  CHECK(node.WaitAll("Healthy", 4));
}

TEST_CASE(
    "The daemon survives a plugin socket path it cannot bind after a kubelet restart, and "
    "comes back when it can",
    "[daemon][concurrency]") {
  TestNode node({.machine = "p4d.24xlarge"});
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  // The kubelet goes and takes our socket with it; something else then
  // takes the path (here a directory that cannot be removed).
  node.kubelet().Stop();
  const fs::path socket = node.daemon().plugin_socket();
  fs::remove(socket);
  fs::create_directories(socket / "in-the-way");
  REQUIRE(node.kubelet().Start().ok());
  // The daemon tries, fails and retries (each attempt once crashed it).
  CHECK_FALSE(node.kubelet().WaitForRegistrations(kEfa, 2, 1500ms));
  fs::remove_all(socket);
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 2, kDeadline));
  CHECK(node.WaitAll("Healthy", 4));
  struct stat st;
  REQUIRE(::lstat(socket.c_str(), &st) == 0);
  CHECK(S_ISSOCK(st.st_mode));
  CHECK(node.StopDaemon() == 0);
}

TEST_CASE("A device renamed by udev is listed once, under its new name", "[daemon][concurrency]") {
  // The kernel names the EFAs efa_0..efa_3; udev renames efa_0 (PCI
  // 0000:10:1b.0) rdmap16s27 while the daemon runs.
  TestNode node({.machine = "p4d.24xlarge", .naming = Naming::kKernel});
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  REQUIRE(node.WaitHealth("efa_0", "Healthy"));
  const fs::path sys = node.sim().sys();
  const fs::path ib_dir = fs::canonical(sys / "class/infiniband/efa_0");
  REQUIRE(ib_dir.parent_path().parent_path().filename() == "0000:10:1b.0");
  std::string uverbs;
  for (const auto& e : fs::directory_iterator(sys / "class/infiniband_verbs")) {
    std::ifstream in(e.path() / "ibdev");
    std::string ibdev;
    if (in >> ibdev && ibdev == "efa_0") uverbs = e.path().filename();
  }
  REQUIRE(uverbs == "uverbs0");
  // The rename as the daemon may see it step by step; the class link last
  // (its event brings the final rescan).
  efa::testing::WriteFile(sys / "class/infiniband_verbs/uverbs0/ibdev", "rdmap16s27\n");
  const fs::path new_dir = ib_dir.parent_path() / "rdmap16s27";
  fs::rename(ib_dir, new_dir);
  fs::remove(sys / "class/infiniband/efa_0");
  fs::create_directory_symlink(new_dir, sys / "class/infiniband/rdmap16s27");

  auto renamed = [](const std::vector<v1beta1::Device>& d) {
    std::set<std::string> ids;
    for (const auto& x : d) ids.insert(x.id());
    return AllHealthy(d, 4) &&
           ids == std::set<std::string>{"rdmap16s27", "efa_1", "efa_2", "efa_3"};
  };
  REQUIRE(node.kubelet().WaitForDevices(kEfa, renamed, kDeadline));
  CHECK(node.daemon().known_devices() == 4);
  // An allocation by the new name works; the old name is unknown.
  v1beta1::AllocateRequest request;
  request.add_container_requests()->add_devices_ids("rdmap16s27");
  v1beta1::AllocateResponse response;
  CHECK(node.kubelet().Allocate(kEfa, request, &response).ok());
  request.mutable_container_requests(0)->set_devices_ids(0, "efa_0");
  CHECK(node.kubelet().Allocate(kEfa, request, &response).error_code() ==
        grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_CASE("After an inotify queue overflow the daemon rescans at once", "[daemon][concurrency]") {
  // The owner thread is held in a rescan (through the inventory hook)
  // while the test floods the daemon's inotify queue with events it
  // ignores, then removes a uverbs node: that event is lost. Only a rescan
  // on the overflow (not the periodic one, 10 minutes away) can see it.
  std::mutex mu;
  std::condition_variable cv;
  bool hold = false, held = false;
  auto held_rescans = [&](DaemonOptions& o) {
    o.rescan_interval = 600s;
    o.on_inventory = [&](const efa::topology::Inventory&) {
      std::unique_lock<std::mutex> lock(mu);
      if (!hold) return;
      held = true;
      cv.notify_all();
      cv.wait(lock, [&] { return !hold; });
    };
  };
  TestNode node({.machine = "p4d.24xlarge", .configure = held_rescans});
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  REQUIRE(node.WaitHealth("rdmap32s27", "Healthy"));
  {
    std::unique_lock<std::mutex> lock(mu);
    hold = true;
  }
  efa::testing::WriteFile(node.sim().path() / "dev/infiniband/trigger", "");  // a rescan
  {
    std::unique_lock<std::mutex> lock(mu);
    REQUIRE(cv.wait_for(lock, kDeadline, [&] { return held; }));
  }
  int max_queued = 16384;
  std::ifstream("/proc/sys/fs/inotify/max_queued_events") >> max_queued;
  const fs::path flood = node.sim().path() / "kubelet/device-plugins/flood";
  for (int i = 0; i < max_queued / 2 + 100; ++i) {  // 3 events each
    int fd = ::open(flood.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    REQUIRE(fd >= 0);
    ::close(fd);
    ::unlink(flood.c_str());
  }
  fs::remove(node.sim().path() / "dev/infiniband/uverbs1");
  {
    std::unique_lock<std::mutex> lock(mu);
    hold = false;
  }
  cv.notify_all();
  CHECK(node.WaitHealth("rdmap32s27", "Unhealthy"));
}

TEST_CASE("The plugin socket is never seen with a mode other than 0600", "[daemon][concurrency]") {
  // Watch its directory for the socket's creation and look at its mode at
  // once, through several deletions of it (the kubelet keeps it, in a
  // directory of its own: each is served again at the kubelet's restart).
  TestNode node({.machine = "p4d.24xlarge"});
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  const fs::path socket = node.daemon().plugin_socket();
  int in = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  REQUIRE(in >= 0);
  REQUIRE(::inotify_add_watch(in, socket.parent_path().c_str(), IN_CREATE | IN_MOVED_TO) >= 0);
  std::vector<unsigned> modes;
  for (int restart = 2; restart <= 6; ++restart) {
    REQUIRE(fs::remove(socket));
    REQUIRE(node.kubelet().Restart().ok());
    const auto deadline = std::chrono::steady_clock::now() + kDeadline;
    bool seen = false;
    while (!seen && std::chrono::steady_clock::now() < deadline) {
      pollfd p{in, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      alignas(inotify_event) char buf[4096];
      ssize_t n = ::read(in, buf, sizeof buf);
      for (char* q = buf; n > 0 && q < buf + n;) {
        auto* ev = reinterpret_cast<inotify_event*>(q);
        q += sizeof(inotify_event) + ev->len;
        struct stat st;
        if (ev->len && std::string(ev->name) == socket.filename() &&
            ::lstat(socket.c_str(), &st) == 0) {
          modes.push_back(st.st_mode & 07777);
          seen = true;
        }
      }
    }
    REQUIRE(node.kubelet().WaitForRegistrations(kEfa, restart, kDeadline));
  }
  ::close(in);
  CHECK(modes.size() == 5);
  for (unsigned mode : modes) CHECK(mode == 0600);
}

TEST_CASE("The plugin socket outlives kubelet restarts: registering again is one call",
          "[daemon][concurrency]") {
  // The kubelet deletes the sockets at the top of its directory when it
  // starts and keeps directories; ours is in one, so the same socket, from
  // the same server, serves each new kubelet.
  TestNode node({.machine = "p4d.24xlarge"});
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  const fs::path socket = node.daemon().plugin_socket();
  CHECK(socket.parent_path().filename() == "efa");
  struct stat before {};
  REQUIRE(::stat(socket.c_str(), &before) == 0);
  for (int restart = 2; restart <= 4; ++restart) {
    REQUIRE(node.kubelet().Restart().ok());
    REQUIRE(node.kubelet().WaitForRegistrations(kEfa, restart, kDeadline));
    REQUIRE(node.kubelet().WaitForStreaming(kEfa, true, kDeadline));
  }
  struct stat after {};
  REQUIRE(::stat(socket.c_str(), &after) == 0);
  CHECK(after.st_ino == before.st_ino);
  CHECK(after.st_ctim.tv_sec == before.st_ctim.tv_sec);
  CHECK(after.st_ctim.tv_nsec == before.st_ctim.tv_nsec);
}

namespace {
// Waits, at most `timeout`, until the daemon has counted `n` failed
// listings and reads (it has no event of its own to wait on: polled).
bool WaitForDiscoveryErrors(const Daemon& daemon, int64_t n,
                            std::chrono::milliseconds timeout = kDeadline) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    const Daemon::DiscoveryErrorCounts errors = daemon.discovery_errors();
    if (errors.list + errors.read >= n) return true;
    std::this_thread::sleep_for(1ms);
  }
  return false;
}

}  // namespace

TEST_CASE(
    "A full descriptor table turns no EFA Unhealthy; a device removed meanwhile is seen after",
    "[daemon][concurrency]") {
  if (efa::testing::kSanitized) {
    WARN("not run under a sanitizer: its runtime needs descriptors while none are left");
    return;
  }
  TestNode node({.machine = "p5.48xlarge", .fake_clock = true});
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  REQUIRE(node.WaitAll("Healthy", 32));
  {
    efa::testing::DescriptorTableFull full;
    // A full rescan falls due, and a device is removed (its inotify event
    // brings another rescan): neither can list class/infiniband. A
    // descriptor another thread of this process frees between the fill and
    // the pass lets that listing succeed (no log, no error: seen in 1 to 2
    // runs of 10): the table is filled again for another.
    bool failed = false;
    for (int attempt = 0; attempt < 5 && !failed; ++attempt) {
      full.Refill();
      REQUIRE(node.Pass(5min));
      failed = WaitForDiscoveryErrors(node.daemon(), 1, 2s);
    }
    REQUIRE(failed);
    full.Refill();
    const int64_t before =
        node.daemon().discovery_errors().list + node.daemon().discovery_errors().read;
    fs::remove(node.sim().sys() / "class/infiniband/rdmap79s0");
    REQUIRE(WaitForDiscoveryErrors(node.daemon(), before + 1));
    const v1beta1::ListAndWatchResponse list = node.daemon().advertised();
    CHECK(list.devices_size() == 32);
    for (const auto& d : list.devices()) {
      CAPTURE(d.id());
      CHECK(d.health() == "Healthy");
    }
  }
  // Descriptors back: the next pass looks again (the uevent count stood
  // still) and sees the device gone, and only that one.
  REQUIRE(node.Pass(10s));
  REQUIRE(node.WaitHealth("rdmap79s0", "Unhealthy"));
  auto devices = node.kubelet().devices(kEfa);
  CHECK(devices.size() == 32);
  CHECK(std::count_if(devices.begin(), devices.end(),
                      [](const auto& d) { return d.health() == "Healthy"; }) == 31);
}

TEST_CASE("A quiet node recovers from a failed rescan at the next periodic pass",
          "[daemon][concurrency]") {
  TestNode node({.machine = "p4d.24xlarge", .fake_clock = true});
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  REQUIRE(node.WaitAll("Healthy", 4));
  // class/infiniband cannot be listed (a loop: ELOOP), and a device node
  // appearing brings a rescan that fails.
  const fs::path cls = node.sim().sys() / "class/infiniband";
  const fs::path away = node.sim().sys() / "class/infiniband.away";
  fs::rename(cls, away);
  fs::create_symlink("infiniband", cls);
  fs::create_directory(node.sim().path() / "dev/infiniband/trigger");
  REQUIRE(WaitForDiscoveryErrors(node.daemon(), 1));
  for (const char* id : {"rdmap16s27", "rdmap32s27", "rdmap144s27", "rdmap160s27"}) {
    CAPTURE(id);
    CHECK(HealthOf(node.daemon().advertised().devices(), id) == "Healthy");
  }
  // Meanwhile one EFA is unbound; then the listing works again. No event
  // comes of either (below the watched directories, and no uevent counted).
  fs::remove(away / "rdmap32s27/device/driver");
  fs::remove(cls);
  fs::rename(away, cls);
  REQUIRE(node.Pass(10s));
  REQUIRE(node.WaitHealth("rdmap32s27", "Unhealthy"));
  for (const char* id : {"rdmap16s27", "rdmap144s27", "rdmap160s27"}) {
    CAPTURE(id);
    CHECK(HealthOf(node.daemon().advertised().devices(), id) == "Healthy");
  }
}

TEST_CASE("A full rescan runs every few minutes even while the uevent count stands still",
          "[daemon][concurrency]") {
  auto every_two_minutes = [](DaemonOptions& o) { o.full_rescan_interval = 2min; };
  TestNode node({.machine = "p4d.24xlarge", .fake_clock = true, .configure = every_two_minutes});
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  REQUIRE(node.WaitHealth("rdmap32s27", "Healthy"));
  // Unbound: no inotify event, no uevent counted.
  fs::remove(node.sim().sys() / "class/infiniband/rdmap32s27/device/driver");
  for (int pass = 1; pass < 12; ++pass) {  // 110 s
    REQUIRE(node.Pass(10s));
    REQUIRE(HealthOf(node.daemon().advertised().devices(), "rdmap32s27") == "Healthy");
  }
  REQUIRE(node.Pass(10s));  // 2 min
  CHECK(node.WaitHealth("rdmap32s27", "Unhealthy"));
}
