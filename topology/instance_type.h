// The EC2 instance type of the node ("p5.48xlarge"), its family ("p5"),
// and the production facts the daemon keeps per instance type, in one
// place: how many EFAs a type supports and how many NeuronCores a family's
// Neuron device has. The third kind of fact, which EFA serves each Neuron
// device, is AWS's own data and is kept whole, with its instance-family
// mapping, in topology/neuron_efa_map.cc. ARCHITECTURE.md ("A new instance
// type") lists every place to touch for a new type.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace efa::topology {

// Reads the DMI product name, `sysfs_root`/devices/virtual/dmi/id/product_name,
// which EC2 sets to the instance type. Fails with the path in the message
// when the file is missing or empty (not an EC2 instance, or no DMI).
// Thread-safe.
absl::StatusOr<std::string> ReadInstanceType(const std::filesystem::path& sysfs_root);

// An instance type without SageMaker HyperPod's "ml." prefix
// ("ml.p5.48xlarge" -> "p5.48xlarge"): HyperPod nodes report the prefixed
// name, and every per-type fact is the same as the EC2 type's.
std::string_view WithoutHyperPodPrefix(std::string_view instance_type);

// The part of an instance type before the first '.', after any HyperPod
// "ml." prefix, e.g. "trn2u" for "trn2u.48xlarge" and "trn1" for
// "ml.trn1.32xlarge"; the whole text when it has no '.'.
std::string_view InstanceFamily(std::string_view instance_type);

// The number of EFAs an instance type supports (EC2's
// MaximumEfaInterfaces), from a built-in table; nullopt for a type it does
// not list. A HyperPod "ml." prefix is ignored. Thread-safe.
std::optional<int> SupportedEfaCount(std::string_view instance_type);

// NeuronCores per Neuron device by instance family, to map a NeuronCore ID
// to its device: inf1 4, inf2/trn1/trn1n 2, and 4 for the others (trn2,
// trn3: 8 physical cores, default logical NeuronCore size 2). Thread-safe.
int DefaultNeuronCoresPerDevice(std::string_view instance_type);

}  // namespace efa::topology
