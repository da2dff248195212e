// The lifecycle test's events (efa-lifecycle): what can happen to a node,
// the steps a run is made of, how a sequence is written for --replay, and
// the generator that draws the next step from the node's state.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace efa::lifecycle {

enum class Event {
  kAdmit,             // a pod: GPUs and EFAs, in either order
  kAdmitWithInit,     // a pod whose init container holds EFAs
  kFinishInit,        // an init container completes; the pod's container starts
  kRestartContainer,  // a container starts again (PreStartContainer again)
  kDeletePod,         // a pod is deleted
  kRestartKubelet,    // the kubelet restarts; List stays empty until kSyncPods
  kSyncPods,          // the restarted kubelet has the pods again
  kRestartDaemon,     // SIGTERM, then the daemon starts again
  kKillDaemon,        // SIGKILL, then the daemon starts again
  kRemoveEfa,         // an EFA goes (its verbs device and uverbs node)
  kReturnEfa,         // a removed EFA comes back under its name
  kReturnEfaRenamed,  // a removed EFA comes back as efa_N and udev renames it
  kFillFds,           // the daemon's descriptor table is full for a moment
  kCdiReadOnly,       // the CDI directory turns read-only (late binding)
  kCdiWritable,       // it is writable again; failed starts are retried
  kReconfigure,       // SIGTERM, then the daemon starts under another configuration
  kUpgrade,           // SIGTERM of the base binary, then this tree's starts
};

struct EventInfo {
  Event event;
  const char* name;   // in --replay and in the report
  const char* group;  // what --exclude names
};

inline constexpr EventInfo kEvents[] = {
    {Event::kAdmit, "admit", "pods"},
    {Event::kAdmitWithInit, "admit-init", "init"},
    {Event::kFinishInit, "finish-init", "init"},
    {Event::kRestartContainer, "restart-container", "container-restart"},
    {Event::kDeletePod, "delete-pod", "pods"},
    {Event::kRestartKubelet, "restart-kubelet", "kubelet-restart"},
    {Event::kSyncPods, "sync-pods", "kubelet-restart"},
    {Event::kRestartDaemon, "restart-daemon", "daemon-restart"},
    {Event::kKillDaemon, "kill-daemon", "daemon-kill"},
    {Event::kRemoveEfa, "remove-efa", "hotplug"},
    {Event::kReturnEfa, "return-efa", "hotplug"},
    {Event::kReturnEfaRenamed, "return-efa-renamed", "udev-rename"},
    {Event::kFillFds, "fill-fds", "fd-full"},
    {Event::kCdiReadOnly, "cdi-read-only", "cdi-read-only"},
    {Event::kCdiWritable, "cdi-writable", "cdi-read-only"},
    {Event::kReconfigure, "reconfigure-daemon", "daemon-config"},
    {Event::kUpgrade, "upgrade-daemon", "upgrade"},
};

const EventInfo& Info(Event event);

// One step: the event and two numbers that choose among what is there when
// it runs (which pod, which EFA, which shape), so that a sequence with steps
// dropped still replays; a step with nothing to act on does nothing.
struct Step {
  Event event;
  uint32_t pick = 0;
  uint32_t shape = 0;
};

// "admit:3:1,delete-pod:0:0": what --replay takes and a failure prints.
std::string Encode(const std::vector<Step>& steps);
// The steps of Encode's text; nullopt when it is not such a text.
std::optional<std::vector<Step>> Decode(const std::string& text);

// The pod shapes: GPUs and EFAs of the pod's container (a p5 has 4 EFAs per
// GPU), or of the init container (its EFAs) and then the container.
struct Shape {
  int gpus;
  int efas;
};
inline constexpr Shape kShapes[] = {{1, 4}, {2, 8}, {0, 1}, {0, 2}, {1, 1}, {0, 4}, {1, 2}};

class Node;
struct Config;

// ---------------------------------------------------------------------------
// The generator: what happens next on a node in the state `node` is in.
Step Generate(std::mt19937& rng, const Node& node, const Config& config);

}  // namespace efa::lifecycle
