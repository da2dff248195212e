// Alignment of EFAs with a container's accelerators: finding the container
// the kubelet is admitting, turning its accelerator device IDs into targets
// for the allocation policy, and judging an allocation after the fact.
// Everything here is pure (no I/O): the caller fetches pod-resources, the
// checkpoint and the NVIDIA GPU list.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "plugin/kubelet/kubelet_checkpoint.h"
#include "plugin/kubelet/resource_name.h"
#include "podresources/v1/api.pb.h"
#include "topology/allocation_policy.h"
#include "topology/host_model.h"
#include "topology/nvidia_gpus.h"

namespace efa::plugin {

// The accelerator resources whose devices EFAs align with.
struct AcceleratorResources {
  std::vector<std::string> gpu = {"nvidia.com/gpu"};
  std::vector<std::string> neuron = {"aws.amazon.com/neuron"};
  std::vector<std::string> neuroncore = {"aws.amazon.com/neuroncore"};
  // NeuronCores per Neuron device, to map a NeuronCore ID to its device;
  // 0: by instance family (topology::DefaultNeuronCoresPerDevice).
  int neuroncores_per_device = 0;
};

// One container's devices, as pod-resources lists them.
struct ContainerDevices {
  std::string pod_namespace;
  std::string pod_name;
  std::string container;
  std::vector<std::pair<std::string, std::string>> accelerators;  // (resource, device ID)
  std::vector<std::string> efas;
  std::string efa_resource;  // the EFA resource name `efas` are held under
  std::string pod_uid;       // from the checkpoint only (pod-resources v1 has none)
  // From the checkpoint only: the Allocate answer for `efas` gave device
  // nodes by ID (best effort, alignment off), not a CDI device (late
  // binding). The container then holds the EFAs its IDs name, in any mode.
  bool efas_by_id = false;
  // From the checkpoint only, held by ID: sharing's replicas its answer was
  // given under (kEnvSharingReplicas); 0 when it does not say (an answer of
  // a daemon older than the variable).
  int replicas = 0;
  std::string Name() const { return pod_namespace + "/" + pod_name + "/" + container; }
};

// The containers of `list` holding accelerators or EFAs (under either EFA
// resource name, plugin/kubelet/resource_name.h).
std::vector<ContainerDevices> ContainersWithDevices(const v1::ListPodResourcesResponse& list,
                                                    const AcceleratorResources& resources);

// The checkpoint's containers holding accelerators or EFAs, by pod UID and
// container name (no pod namespace or name: the checkpoint has none).
std::vector<ContainerDevices> CheckpointedContainers(const KubeletCheckpoint& checkpoint,
                                                     const AcceleratorResources& resources);

// Pod UID -> "namespace/name", learned where exactly one pod-resources
// container holds exactly a checkpointed container's devices.
using PodNames = std::map<std::string, std::string>;

// Updates `names` from a pod-resources list and a checkpoint read together
// after the fact (when the checkpoint is current): learns what matches,
// keeps what it knew of UIDs still checkpointed, forgets the rest.
void LearnPodNames(const std::vector<ContainerDevices>& containers,
                   const std::vector<ContainerDevices>& checkpointed, PodNames& names);

// The container being admitted, if it can be told: it holds accelerators
// but no EFA yet, and the checkpoint holds no container of its name with
// exactly its devices (and no EFA). The kubelet lists a container's devices
// in pod-resources as soon as each resource is allocated but writes the
// checkpoint only after all of the container's resources are, so a running
// GPU-only pod (in the checkpoint) is never taken for it. The kubelet keeps
// a deleted pod in the checkpoint until its next write, and the admitted
// container may have got that pod's GPUs since: a stale entry holding EFAs
// too, or one `names` knows belongs to another pod, does not count.
// `candidates` gets how many containers qualified; with none or several the
// answer is nullopt. A null `checkpointed` (missing or unreadable) leaves
// nothing to tell them apart by: then only a single container with
// accelerators and no EFA qualifies.
std::optional<ContainerDevices> FindAdmittedContainer(
    const std::vector<ContainerDevices>& containers,
    const std::vector<ContainerDevices>* checkpointed, const PodNames& names, int* candidates);

// Accelerator device IDs as policy targets: NVIDIA IDs (UUID or index)
// through the driver's GPU list, Neuron device indices (through the AWS
// table when the model has one, else by the model's Neuron devices in PCI
// order) and NeuronCore IDs mapped to their device. IDs that cannot be
// placed are listed in `unresolved`.
struct Targets {
  std::vector<topology::PciAddress> pci;
  std::vector<int> neuron_indices;
  std::vector<std::string> unresolved;
  // Without targets: the accelerators other containers hold, when known.
  bool busy_known = false;
  std::vector<topology::PciAddress> busy;
  bool empty() const { return pci.empty() && neuron_indices.empty(); }
};
// For logs: "accelerators 0000:53:00.0, neuron3", or "no known accelerators".
std::string DescribeTargets(const Targets& targets);
Targets ResolveTargets(const std::vector<std::pair<std::string, std::string>>& accelerators,
                       const AcceleratorResources& resources,
                       const std::vector<topology::NvidiaGpu>& gpus,
                       const topology::HostModel& model);

// Whether `efas` are as close to `targets` as the policy would place that
// many EFAs on an empty node: each EFA's distance to its nearest target
// (a Neuron table entry counting as nearest), sorted, is no worse than the
// ideal's, position by position.
bool IsAligned(const topology::HostModel& model, const std::vector<std::string>& efas,
               const Targets& targets);

}  // namespace efa::plugin
