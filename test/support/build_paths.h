// Paths of this build tree and source tree that the tests need at run time:
// the daemon's binary and the benchmark's echo server, the exposition
// parser script, expected outputs. They are compiled
// into one small file (build_paths.cc): as -D flags of every test file they
// made each clone's and worktree's objects of those files differ, so the
// compiler cache every tree on a machine shares (CMakeLists.txt) missed on
// the heaviest files of the build.
#pragma once

namespace efa::testing {

// The efa-k8s-device-plugin binary of this build tree.
extern const char* const kPluginBinary;
// The benchmark's baseline server, efa-bench-echo, of this build tree.
extern const char* const kEchoBinary;
// test/support/exposition_summary.py in the source tree.
extern const char* const kExpositionSummary;
// test/plugin/ops/testdata/topology: the topology report's expected outputs
// (by absolute path: __FILE__ is relative under the compiler cache).
extern const char* const kTopologyTestdata;
// Where test/lifecycle/build-upgrade-from.sh builds the daemon of the commit
// test/lifecycle/upgrade-from names (the lifecycle test's upgrade).
extern const char* const kUpgradeFromDir;

}  // namespace efa::testing
