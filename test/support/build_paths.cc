#include "test/support/build_paths.h"

namespace efa::testing {

const char* const kPluginBinary = EFA_PLUGIN_BINARY;
const char* const kEchoBinary = EFA_ECHO_BINARY;
const char* const kExpositionSummary = EFA_EXPOSITION_SUMMARY;
const char* const kTopologyTestdata = EFA_TOPOLOGY_TESTDATA;
const char* const kUpgradeFromDir = EFA_UPGRADE_FROM_DIR;

}  // namespace efa::testing
