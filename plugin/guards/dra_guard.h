// The DRA guard: detects the EFA DRA driver (dra.net) on this node. It and
// this plugin must never both hand out the node's EFAs: each would give the
// same device to different pods.
//
// A DRA driver registers with the kubelet through a socket in
// <kubelet-dir>/plugins_registry/ named after the driver. Drivers built on
// the kubelet's DRA helper (k8s.io/dynamic-resource-allocation/kubeletplugin,
// draplugin.go: RegistrarSocketFilename and RollingUpdate) name it
// "<driver>-reg.sock", or "<driver>-<pod UID>-reg.sock" with rolling updates
// (kubelet 1.33+). DRANET (kubernetes-sigs/dranet, pkg/driver/driver.go)
// starts that helper with only DriverName("dra.net"): "dra.net-reg.sock". The driver counts as
// present while such a socket accepts connections: a socket file left behind by a driver that died
// refuses them and is ignored (the kubelet ignores it too), so an
// uninstalled driver does not keep the plugin away for ever.
//
// All functions are thread-safe (they share no state).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace efa::plugin {

inline constexpr char kDraDriverName[] = "dra.net";
inline constexpr char kPluginsRegistryDir[] = "plugins_registry";

// What the daemon does while the DRA driver is present.
enum class DraPolicy {
  kYield,    // do not register vpc.amazonaws.com/efa; withdraw it if registered (default)
  kIgnore,   // serve anyway (log a warning)
  kMonitor,  // a DRA node pool's node: never register, present or not; export health and traffic
};
// Each policy and its name ("yield", "ignore", "monitor"), in declaration
// order: the configuration reads and writes them from here.
const std::vector<std::pair<DraPolicy, std::string>>& DraPolicyNames();
std::string_view DraPolicyName(DraPolicy policy);

struct DraReport {
  bool present = false;
  // The driver whose socket accepts connections, while present.
  std::string driver = {};
  // Human-readable: the socket that shows the driver, or why none counts
  // ("<dir>/dra.net-reg.sock: refuses connections (stale)", "no dra.net
  // registration socket in <dir>").
  std::string evidence;
  // Registration sockets of the driver that refused a connection (stale,
  // or bound but not listening yet).
  int refusing = 0;
  // Not empty: the look was not complete (the directory could not be
  // listed whole, or a socket not probed), so `present` false says nothing.
  std::string error = {};
};

// Whether `file_name` in the plugins registry is `driver`'s registration
// socket: exactly "<driver>-reg.sock" or "<driver>-<pod UID>-reg.sock" (a
// UUID in its canonical 8-4-4-4-12 lower-case hex form). Another driver
// whose name merely contains `driver` ("foo.dra.net-reg.sock",
// "dra.network-reg.sock") is not it. Pure.
bool IsDraRegistrationName(std::string_view file_name, std::string_view driver);

// Looks in `registry_dir` for a socket of `driver` that accepts a
// connection (probed with a non-blocking connect, closed at once). A missing
// directory means no driver.
DraReport DetectDraDriver(const std::filesystem::path& registry_dir,
                          std::string_view driver = kDraDriverName);

// As DetectDraDriver, for any of `drivers` (configured: draDrivers): the
// first socket found that accepts a connection makes the report present
// and names its driver. A driver registered under another name is not
// seen.
DraReport DetectDraDrivers(const std::filesystem::path& registry_dir,
                           const std::vector<std::string>& drivers);

}  // namespace efa::plugin
