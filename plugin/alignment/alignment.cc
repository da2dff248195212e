#include "plugin/alignment/alignment.h"

#include <algorithm>
#include <charconv>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "plugin/alignment/cdi_spec.h"
#include "topology/instance_type.h"

namespace efa::plugin {
namespace {

bool Contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::optional<int> ParseIndex(const std::string& id) {
  int value = 0;
  auto [end, ec] = std::from_chars(id.data(), id.data() + id.size(), value);
  if (id.empty() || ec != std::errc() || end != id.data() + id.size() || value < 0) {
    return std::nullopt;
  }
  return value;
}

int CoresPerDevice(const AcceleratorResources& resources, const std::string& instance_type) {
  if (resources.neuroncores_per_device > 0) return resources.neuroncores_per_device;
  return topology::DefaultNeuronCoresPerDevice(instance_type);
}

// Distance class of EFA `efa` to its nearest target; -1 for an EFA the
// Neuron table names for a target (better than any PCIe relation).
int NearestTarget(const topology::HostModel& model, size_t efa, const Targets& targets,
                  const std::vector<size_t>& target_accelerators) {
  for (int n : targets.neuron_indices) {
    const auto& named = model.NeuronEfas(n);
    if (std::find(named.begin(), named.end(), efa) != named.end()) return -1;
  }
  int best = static_cast<int>(topology::Distance::kOther);
  for (const topology::Neighbour& nb : model.Neighbours(efa)) {
    if (std::find(target_accelerators.begin(), target_accelerators.end(), nb.accelerator) !=
        target_accelerators.end()) {
      best = std::min(best, static_cast<int>(nb.distance));
    }
  }
  return best;
}

std::vector<int> Profile(const topology::HostModel& model, const std::vector<std::string>& efas,
                         const Targets& targets) {
  std::vector<size_t> accels;
  for (const auto& pci : targets.pci) {
    if (auto a = model.FindAccelerator(pci)) accels.push_back(*a);
  }
  std::vector<int> profile;
  for (const std::string& id : efas) {
    auto efa = model.FindEfa(id);
    profile.push_back(efa ? NearestTarget(model, *efa, targets, accels)
                          : static_cast<int>(topology::Distance::kOther));
  }
  std::sort(profile.begin(), profile.end());
  return profile;
}

// Files device `id` of `resource` under `c` when it is an accelerator or an EFA.
void AddDevice(const std::string& resource, const std::string& id,
               const AcceleratorResources& resources, ContainerDevices& c) {
  if (IsEfaResource(resource)) {
    c.efas.push_back(id);
    c.efa_resource = resource;
  }
  if (Contains(resources.gpu, resource) || Contains(resources.neuron, resource) ||
      Contains(resources.neuroncore, resource)) {
    c.accelerators.emplace_back(resource, id);
  }
}

bool SameDevices(const ContainerDevices& a, const ContainerDevices& b) {
  auto sorted = [](auto v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  return a.container == b.container && sorted(a.accelerators) == sorted(b.accelerators) &&
         sorted(a.efas) == sorted(b.efas);
}

}  // namespace

std::vector<ContainerDevices> ContainersWithDevices(const v1::ListPodResourcesResponse& list,
                                                    const AcceleratorResources& resources) {
  std::vector<ContainerDevices> out;
  for (const auto& pod : list.pod_resources()) {
    for (const auto& container : pod.containers()) {
      ContainerDevices c;
      c.pod_namespace = pod.namespace_();
      c.pod_name = pod.name();
      c.container = container.name();
      for (const auto& devices : container.devices()) {
        for (const std::string& id : devices.device_ids()) {
          AddDevice(devices.resource_name(), id, resources, c);
        }
      }
      if (!c.accelerators.empty() || !c.efas.empty()) out.push_back(std::move(c));
    }
  }
  return out;
}

std::vector<ContainerDevices> CheckpointedContainers(const KubeletCheckpoint& checkpoint,
                                                     const AcceleratorResources& resources) {
  std::map<std::pair<std::string, std::string>, ContainerDevices> by_container;
  for (const CheckpointEntry& e : checkpoint.entries) {
    ContainerDevices& c = by_container[{e.pod_uid, e.container_name}];
    c.pod_uid = e.pod_uid;
    c.container = e.container_name;
    for (const std::string& id : e.device_ids) AddDevice(e.resource_name, id, resources, c);
    if (!IsEfaResource(e.resource_name) || e.alloc_resp.devices_size() == 0) continue;
    c.efas_by_id = true;
    const auto env = e.alloc_resp.envs().find(kEnvSharingReplicas);
    int replicas = 0;
    if (env != e.alloc_resp.envs().end() && absl::SimpleAtoi(env->second, &replicas) &&
        replicas >= 1) {
      c.replicas = replicas;
    }
  }
  std::vector<ContainerDevices> out;
  for (auto& [key, c] : by_container) {
    if (!c.accelerators.empty() || !c.efas.empty()) out.push_back(std::move(c));
  }
  return out;
}

void LearnPodNames(const std::vector<ContainerDevices>& containers,
                   const std::vector<ContainerDevices>& checkpointed, PodNames& names) {
  PodNames learned;
  for (const ContainerDevices& k : checkpointed) {
    const ContainerDevices* match = nullptr;
    int matches = 0;
    for (const ContainerDevices& c : containers) {
      if (SameDevices(c, k)) {
        match = &c;
        ++matches;
      }
    }
    if (matches == 1) {
      learned[k.pod_uid] = match->pod_namespace + "/" + match->pod_name;
    } else if (auto known = names.find(k.pod_uid); known != names.end()) {
      learned.insert(*known);
    }
  }
  names = std::move(learned);
}

std::optional<ContainerDevices> FindAdmittedContainer(
    const std::vector<ContainerDevices>& containers,
    const std::vector<ContainerDevices>* checkpointed, const PodNames& names, int* candidates) {
  std::optional<ContainerDevices> found;
  int count = 0;
  for (const ContainerDevices& c : containers) {
    if (c.accelerators.empty() || !c.efas.empty()) continue;
    bool admitted_before = false;
    if (checkpointed != nullptr) {
      for (const ContainerDevices& k : *checkpointed) {
        auto known = names.find(k.pod_uid);
        admitted_before |=
            SameDevices(c, k) &&
            (known == names.end() || known->second == c.pod_namespace + "/" + c.pod_name);
      }
    }
    if (admitted_before) continue;
    ++count;
    found = c;
  }
  if (candidates != nullptr) *candidates = count;
  if (count != 1) return std::nullopt;
  return found;
}

std::string DescribeTargets(const Targets& targets) {
  std::vector<std::string> parts;
  for (const auto& pci : targets.pci) parts.push_back(pci.ToString());
  for (int n : targets.neuron_indices) parts.push_back("neuron" + std::to_string(n));
  return parts.empty() ? "no known accelerators" : "accelerators " + absl::StrJoin(parts, ", ");
}

Targets ResolveTargets(const std::vector<std::pair<std::string, std::string>>& accelerators,
                       const AcceleratorResources& resources,
                       const std::vector<topology::NvidiaGpu>& gpus,
                       const topology::HostModel& model) {
  Targets t;
  std::vector<topology::PciAddress> neuron_pci;  // the model's Neuron devices, PCI order
  for (const auto& a : model.accelerators()) {
    if (a.kind == topology::AcceleratorKind::kNeuron) neuron_pci.push_back(a.pci);
  }
  auto add_neuron = [&](int index, const std::string& id) {
    if (model.neuron_table() != nullptr) {
      if (std::find(t.neuron_indices.begin(), t.neuron_indices.end(), index) ==
          t.neuron_indices.end()) {
        t.neuron_indices.push_back(index);
      }
    } else if (index < static_cast<int>(neuron_pci.size())) {
      t.pci.push_back(neuron_pci[index]);
    } else {
      t.unresolved.push_back(id);
    }
  };
  for (const auto& [resource, id] : accelerators) {
    if (Contains(resources.gpu, resource)) {
      if (auto pci = topology::NvidiaDeviceAddress(gpus, id)) {
        t.pci.push_back(*pci);
      } else {
        t.unresolved.push_back(id);
      }
    } else if (auto index = ParseIndex(id); !index) {
      t.unresolved.push_back(id);
    } else if (Contains(resources.neuron, resource)) {
      add_neuron(*index, id);
    } else {
      add_neuron(*index / CoresPerDevice(resources, model.instance_type()), id);
    }
  }
  std::sort(t.pci.begin(), t.pci.end());
  t.pci.erase(std::unique(t.pci.begin(), t.pci.end()), t.pci.end());
  std::sort(t.neuron_indices.begin(), t.neuron_indices.end());
  return t;
}

bool IsAligned(const topology::HostModel& model, const std::vector<std::string>& efas,
               const Targets& targets) {
  topology::AllocationRequest ideal_request;
  for (const auto& e : model.efas()) ideal_request.available.push_back(e.id);
  ideal_request.size = static_cast<int>(efas.size());
  ideal_request.target_accelerators = targets.pci;
  ideal_request.target_neuron_indices = targets.neuron_indices;
  const auto ideal = Profile(model, topology::ChooseEfas(model, ideal_request), targets);
  const auto actual = Profile(model, efas, targets);
  if (actual.size() != ideal.size()) return false;
  for (size_t i = 0; i < actual.size(); ++i) {
    if (actual[i] > ideal[i]) return false;
  }
  return true;
}

}  // namespace efa::plugin
