// efa-lifecycle: the seeded, randomized lifecycle test. It runs the real
// daemon binary as a child process on a simulated node (test/sim) beside the
// fake kubelet and the fake GPU plugin (test/fake_kubelet), and drives them
// through long random sequences of what happens to a node: pods admitted GPU
// first or EFA first, init containers holding EFAs, container restarts, pod
// deletions, kubelet restarts whose pod-resources List stays empty until the
// pods are synced, daemon restarts (SIGTERM) and kills (SIGKILL), daemon
// restarts under a configuration drawn at random (a helm upgrade with changed
// values: alignment best-effort / late-binding / off, sharing replicas 1 or
// N, renameByDefault, cdiHandover), an upgrade from the daemon binary of the
// commit test/lifecycle/upgrade-from names (built by CMake, see
// test/lifecycle/build-upgrade-from.sh) to this tree's, EFAs removed and
// returned (udev renaming some), a full descriptor table, a read-only CDI
// directory. The fake kubelet does what the kubelet does when the daemon
// comes back with another resource name, other device IDs or other options
// (test/fake_kubelet/fake_kubelet.h). After every step, once the node is
// quiet, it checks the invariants:
//
//   - every running container keeps the device nodes the runtime gave it at
//     its start (its Allocate answer's device specs, or the device nodes of
//     the CDI spec its answer names, read when it started): they are the same
//     before and after each daemon restart, and its CDI spec on disk names
//     them as long as it runs;
//   - no device node is in more running containers than it was given for:
//     an EFA given while sharing's replicas were N is in at most N running
//     containers, one given exclusively (replicas 1) in no other;
//   - a container's start is refused for want of EFAs (late binding) only
//     when the node has no EFA that no live container holds (counting a
//     deleted pod's EFAs as held until the kubelet gives one of its IDs to
//     another container, or kReleaseWindow passes; a take-over does not
//     count for a binding the base binary made that this tree's daemon
//     recovered without its claim record: see Gone::by_base);
//   - late binding: every running container's CDI device resolves to a spec
//     on disk naming its count of EFAs (with sharing, 1 to that many);
//   - every EFA's advertised health is the simulated node's truth (without
//     late binding, an EFA a live container holds may be advertised
//     Unhealthy: withheld), under the
//     resource name and replica IDs of the daemon's configuration, each
//     (EFA, replica) once;
//   - the daemon never exits, never leaves /healthz unanswered for more than
//     one probe period, and registers again after every kubelet restart.
//
// When one breaks it prints the seed and the shortest failing sequence it
// finds by dropping steps and replaying (bounded by --shrink-seconds), and a
// command line to replay that sequence. --exclude (or EFA_LIFECYCLE_EXCLUDE)
// leaves event classes out, to bisect. Exits 0 when every run held.
//
// The files: lifecycle_events.* (the events, the steps, the generator),
// lifecycle_node.* (the node and what each step does to it),
// lifecycle_checks.cc (the invariants), lifecycle_run.* (runs, replays,
// shrinking, the report) and this one (the command line).
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "test/lifecycle/lifecycle_events.h"
#include "test/lifecycle/lifecycle_node.h"
#include "test/lifecycle/lifecycle_run.h"
#include "test/support/build_paths.h"
#include "test/support/temp_dir.h"

using efa::lifecycle::Config;
using efa::lifecycle::Event;
using efa::lifecycle::EventInfo;
using efa::lifecycle::Info;
using efa::lifecycle::kEvents;
using efa::lifecycle::ReadOnlyBy;
using efa::lifecycle::Step;
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  // The processes a daemon leaves behind become this process's children, so
  // that a daemon's stop waits for them (ChildProcess::KillGroup).
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  CLI::App app{"The randomized lifecycle test of the daemon binary on a simulated node"};
  std::vector<unsigned> seeds = {1};
  int steps = 200;
  std::string mode = "both";
  std::string exclude;
  std::string replay;
  int shrink_seconds = 120;
  std::string upgrade = "auto";
  std::string upgrade_from = efa::testing::kUpgradeFromDir;
  Config config;
  app.add_option("--seeds", seeds, "Seeds to run, one run per seed and mode")->delimiter(',');
  app.add_option("--steps", steps, "Steps per run")->check(CLI::PositiveNumber);
  app.add_option("--mode", mode, "late-binding, best-effort or both")
      ->check(CLI::IsMember({"late-binding", "best-effort", "both"}));
  app.add_option("--machine", config.machine, "The simulated machine");
  app.add_option("--exclude", exclude,
                 "Event groups to leave out, comma-separated: pods, init, container-restart, "
                 "kubelet-restart, daemon-restart, daemon-kill, daemon-config, upgrade, hotplug, "
                 "udev-rename, fd-full, cdi-read-only (also EFA_LIFECYCLE_EXCLUDE)");
  app.add_option("--upgrade", upgrade,
                 "Runs start on the base commit's binary and upgrade at a random step: auto "
                 "(when it was built), require (exit 77, a skip, when it was not) or off")
      ->check(CLI::IsMember({"auto", "require", "off"}));
  app.add_option(
      "--upgrade-from", upgrade_from,
      "Where CMake built the base commit's binary (test/lifecycle/build-upgrade-from.sh)");
  app.add_option("--replay", replay,
                 "Replay this sequence (as a failure prints it) instead of seeds");
  app.add_option("--shrink-seconds", shrink_seconds, "Time given to shrinking a failing sequence");
  app.add_flag("--verbose", config.verbose, "Print every step");
  app.add_flag("--kubelet-1-20", config.kubelet_1_20,
               "With --replay: the fake kubelet imitates kubelet 1.20 (seeds: the odd ones do)");
  CLI11_PARSE(app, argc, argv);
  if (const char* env = std::getenv("EFA_LIFECYCLE_EXCLUDE"); env != nullptr && exclude.empty())
    exclude = env;
  std::set<std::string> groups;
  for (const EventInfo& e : kEvents) groups.insert(e.group);
  const std::vector<std::string> excluded = absl::StrSplit(exclude, ',', absl::SkipEmpty());
  for (const std::string& g : excluded) {
    if (groups.count(g) == 0) {
      std::fprintf(stderr, "efa-lifecycle: --exclude: unknown event group \"%s\" (known: %s)\n",
                   g.c_str(), absl::StrJoin(groups, ", ").c_str());
      return 2;
    }
    config.excluded.insert(g);
  }
  if (upgrade == "off") {
    config.excluded.insert(Info(Event::kUpgrade).group);
  } else if (config.excluded.count(Info(Event::kUpgrade).group) == 0) {
    // The build script leaves the binary, or a file saying why there is none.
    const fs::path dir(upgrade_from);
    const fs::path binary = dir / "bin/efa-k8s-device-plugin";
    std::string why = efa::testing::ReadFile(dir / "UNAVAILABLE");
    why.erase(why.find_last_not_of('\n') + 1);
    std::error_code ec;
    if (why.empty() && !fs::exists(binary, ec)) {
      why = absl::StrCat(binary.string(), " was not built (the target efa-lifecycle-upgrade-from)");
    }
    if (why.empty()) {
      config.base_binary = binary.string();
      config.base_commit = efa::testing::ReadFile(dir / "COMMIT");
      config.base_commit.erase(config.base_commit.find_last_not_of('\n') + 1);
      config.base_commit = config.base_commit.substr(0, 7);
    } else {
      std::printf("lifecycle: SKIPPED the upgrade from the base commit: %s\n", why.c_str());
      if (upgrade == "require") return 77;
      config.excluded.insert(Info(Event::kUpgrade).group);
    }
  }
  std::optional<std::vector<Step>> replayed;
  if (!replay.empty()) {
    replayed = efa::lifecycle::Decode(replay);
    if (!replayed) {
      std::fprintf(stderr, "efa-lifecycle: --replay: expected event:pick:shape,..., got \"%s\"\n",
                   replay.c_str());
      return 2;
    }
  }
  // Before any thread: a mount namespace of our own (the daemon inherits
  // it) for the read-only CDI directory, private so that nothing leaks out.
  if (::geteuid() != 0) {
    efa::lifecycle::read_only_by = ReadOnlyBy::kModes;
  } else if (::unshare(CLONE_NEWNS) == 0 &&
             ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0) {
    efa::lifecycle::read_only_by = ReadOnlyBy::kBindMount;
  } else {
    std::printf("lifecycle: cannot make a mount namespace (%s): no read-only CDI directory\n",
                std::strerror(errno));
  }
  ::signal(SIGPIPE, SIG_IGN);

  std::vector<bool> late_binding;
  if (mode != "best-effort") late_binding.push_back(true);
  if (mode != "late-binding") late_binding.push_back(false);
  bool ok = true;
  for (bool late : late_binding) {
    config.late_binding = late;
    if (replayed) {
      ok &= efa::lifecycle::RunAndReport(config, std::nullopt, *replayed, 0,
                                         std::chrono::seconds(shrink_seconds));
      continue;
    }
    for (unsigned seed : seeds) {
      config.kubelet_1_20 = seed % 2 == 1;
      ok &= efa::lifecycle::RunAndReport(config, seed, {}, steps,
                                         std::chrono::seconds(shrink_seconds));
    }
  }
  return ok ? 0 : 1;
}
