#include "topology/neuron_efa_map.h"

#include <cstdlib>
#include <utility>

#include "topology/instance_type.h"

namespace efa::topology {
namespace {

// The tables below are data from aws-neuron/connected-device-maps-over-efa-for-neuron
// (https://github.com/aws-neuron/connected-device-maps-over-efa-for-neuron,
// commit 2eb56e48a3f8af8e13478e3d48df2a1874f04fd7: lookup/neuron/{trn1,trn1n,trn2,
// trn3,trn3pds}.json and lookup/config/instance-family-mappings.json),
// published by AWS under the Apache License, Version 2.0: see the LICENSE
// file of that repository and http://www.apache.org/licenses/LICENSE-2.0.
// Transcribed unchanged: entry N of a table is the EFA PCI address for
// Neuron device N.
struct RawTable {
  const char* name;
  const char* efas[16];
};

constexpr RawTable kRawTables[] = {
    {"trn1",
     {"0000:10:1a.0", "0000:10:1a.0", "0000:a0:1a.0", "0000:a0:1a.0", "0000:20:19.0",
      "0000:20:19.0", "0000:90:19.0", "0000:90:19.0", "0000:20:1a.0", "0000:20:1a.0",
      "0000:90:1a.0", "0000:90:1a.0", "0000:10:19.0", "0000:10:19.0", "0000:a0:19.0",
      "0000:a0:19.0"}},
    {"trn1n",
     {"0000:10:17.0", "0000:10:1a.0", "0000:a0:17.0", "0000:a0:1a.0", "0000:20:19.0",
      "0000:20:18.0", "0000:90:19.0", "0000:90:18.0", "0000:20:17.0", "0000:20:1a.0",
      "0000:90:17.0", "0000:90:1a.0", "0000:10:19.0", "0000:10:18.0", "0000:a0:19.0",
      "0000:a0:18.0"}},
    {"trn2",
     {"0000:c9:00.0", "0000:b4:00.0", "0000:b3:00.0", "0000:ca:00.0", "0000:6c:00.0",
      "0000:57:00.0", "0000:56:00.0", "0000:6d:00.0", "0000:98:00.0", "0000:83:00.0",
      "0000:82:00.0", "0000:99:00.0", "0000:f5:00.0", "0000:e0:00.0", "0000:df:00.0",
      "0000:f6:00.0"}},
    {"trn3",
     {"0000:be:00.0", "0000:a9:00.0", "0000:a8:00.0", "0000:bf:00.0", "0000:61:00.0",
      "0000:4c:00.0", "0000:4b:00.0", "0000:62:00.0", "0000:8d:00.0", "0000:78:00.0",
      "0000:77:00.0", "0000:8e:00.0", "0000:ea:00.0", "0000:d5:00.0", "0000:d4:00.0",
      "0000:eb:00.0"}},
    {"trn3pds",
     {"0000:a9:00.0", "0000:a8:00.0", "0000:bf:00.0", "0000:be:00.0", "0000:d5:00.0",
      "0000:d4:00.0", "0000:eb:00.0", "0000:ea:00.0", "0000:4c:00.0", "0000:4b:00.0",
      "0000:62:00.0", "0000:61:00.0", "0000:78:00.0", "0000:77:00.0", "0000:8e:00.0",
      "0000:8d:00.0"}},
};

// Instance family -> table name (instance-family-mappings.json).
constexpr std::pair<std::string_view, std::string_view> kFamilies[] = {
    {"trn1", "trn1"},  {"trn1n", "trn1n"},       {"trn2", "trn2"},         {"trn2e", "trn2"},
    {"trn2u", "trn2"}, {"trn3", "trn3"},         {"trn3p", "trn3"},        {"trn3pd98", "trn3"},
    {"trn3s", "trn3"}, {"trn3-dev0", "trn3pds"}, {"trn3-dev1", "trn3pds"},
};

std::vector<NeuronEfaTable> ParseTables() {
  std::vector<NeuronEfaTable> tables;
  for (const RawTable& raw : kRawTables) {
    NeuronEfaTable table{raw.name, {}};
    for (const char* text : raw.efas) {
      auto addr = PciAddress::Parse(text);
      if (!addr) std::abort();  // the data above is constant; a typo is a build-time bug
      table.efas.push_back({*addr});
    }
    tables.push_back(std::move(table));
  }
  return tables;
}

}  // namespace

const std::vector<NeuronEfaTable>& NeuronEfaTables() {
  static const auto* tables = new std::vector<NeuronEfaTable>(ParseTables());
  return *tables;
}

const NeuronEfaTable* FindNeuronEfaTable(std::string_view instance_type) {
  const std::string_view family = InstanceFamily(instance_type);
  for (const auto& [fam, name] : kFamilies) {
    if (fam != family) continue;
    for (const NeuronEfaTable& table : NeuronEfaTables()) {
      if (table.name == name) return &table;
    }
  }
  return nullptr;
}

}  // namespace efa::topology
