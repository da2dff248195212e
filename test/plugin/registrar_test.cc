// The registrar's backoff: which reasons to register again start it over.
#include "plugin/registrar.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>

#include "test/fake_kubelet/serve_unix.h"
#include "test/plugin/guard_fakes.h"
#include "test/support/fake_clock.h"
#include "test/support/temp_dir.h"

using namespace efa::plugin;
using std::chrono::milliseconds;

namespace {

// A registrar whose kubelet is not there: every attempt fails at once
// (the registration's dial is refused), and schedules the next.
struct NoKubelet {
  efa::testing::TempDir dir;
  efa::testing::FakeClock clock;
  DevicePluginService service{DevicePluginService::Options{}};
  Registrar registrar{{.kubelet_dir = dir.path(), .resource_name = kResourceName, .clock = &clock},
                      &service};

  // The delay before the next attempt that one failed attempt now sets.
  milliseconds FailOnce() {
    registrar.Register();
    REQUIRE_FALSE(registrar.registered());
    return std::chrono::duration_cast<milliseconds>(registrar.next_attempt() - clock.Now());
  }
};

}  // namespace

TEST_CASE("Failed registrations back off, doubling from 250 ms", "[registrar]") {
  NoKubelet node;
  CHECK(node.FailOnce() == milliseconds(250));
  CHECK(node.FailOnce() == milliseconds(500));
  CHECK(node.FailOnce() == milliseconds(1000));
}

TEST_CASE("Registering again for the same kubelet keeps the backoff, for a new one starts it over",
          "[registrar]") {
  NoKubelet node;
  node.FailOnce();
  node.FailOnce();  // 500 ms
  // The same kubelet: the attempt is due now, and its failure keeps the pace.
  for (Registrar::Reason same :
       {Registrar::Reason::kPluginSocketDeleted, Registrar::Reason::kSighup}) {
    node.clock.Advance(std::chrono::seconds(1));
    node.registrar.RegisterAgainNow(same);
    CHECK(node.registrar.next_attempt() == node.clock.Now());
  }
  CHECK(node.FailOnce() == milliseconds(1000));
  // Lost events, the DRA driver gone: from the shortest delay.
  for (Registrar::Reason fresh :
       {Registrar::Reason::kEventsLost, Registrar::Reason::kDraDriverGone}) {
    node.FailOnce();
    node.registrar.RegisterAgainNow(fresh);
    CHECK(node.registrar.next_attempt() == node.clock.Now());
    CHECK(node.FailOnce() == milliseconds(250));
  }
}

TEST_CASE("The registrar stands aside while another server listens on its socket", "[registrar]") {
  namespace fs = std::filesystem;
  NoKubelet node;
  const fs::path socket = node.registrar.plugin_socket();
  fs::create_directories(socket.parent_path());
  // Another device plugin (the plugin's host service beside its pod).
  const int other = efa::testing::ListenOnUnixSocket(socket);
  REQUIRE(other >= 0);
  CHECK(absl::IsAlreadyExists(node.registrar.StartServer()));
  CHECK(node.registrar.standing_aside());
  CHECK(fs::is_socket(socket));  // left alone
  // Registering looks again later, with the backoff, and registers nothing.
  CHECK(node.FailOnce() == milliseconds(250));
  CHECK(node.registrar.standing_aside());

  // Its server ended without removing the socket file: a stale socket,
  // replaced.
  ::close(other);
  REQUIRE(fs::is_socket(socket));
  REQUIRE(node.registrar.StartServer().ok());
  CHECK_FALSE(node.registrar.standing_aside());
  node.registrar.StopServer();
  CHECK_FALSE(fs::exists(socket));
}

TEST_CASE("After a new kubelet.sock the retries start within milliseconds", "[registrar]") {
  // The kubelet binds its socket, which inotify reports, and listens just
  // after: a Register in between is refused, as this one is (a socket
  // bound and never listening). The retries then come at 2, 4, ... ms, up
  // to the usual 250 ms and on from there.
  NoKubelet node;
  const int bound = efa::testing::BindUnixSocket(node.dir.path() / "device-plugins/kubelet.sock");
  REQUIRE(bound >= 0);
  node.FailOnce();
  node.FailOnce();  // 500 ms
  node.registrar.RegisterAgainNow(Registrar::Reason::kKubeletSocketCreated);
  CHECK(node.registrar.next_attempt() == node.clock.Now());
  for (int ms : {2, 4, 8, 16, 32, 64, 128, 256, 512}) CHECK(node.FailOnce() == milliseconds(ms));
  // The same kubelet again (its stream ended): the usual pace.
  node.registrar.RegisterAgainNow(Registrar::Reason::kStreamEnded);
  CHECK(node.FailOnce() == milliseconds(1024));
  ::close(bound);
}
