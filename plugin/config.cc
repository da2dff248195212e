#include "plugin/config.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <set>
#include <type_traits>
#include <utility>
#include <variant>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "plugin/ops/api_server.h"
#include "plugin/runtime/http_server.h"
#include "topology/replica_id.h"
#include "topology/sysfs.h"

namespace efa::plugin {
namespace {

using std::chrono::milliseconds;
using Strings = std::vector<std::string>;

// What a value must look like beyond its type.
enum class Check {
  kNone,
  kPath,          // non-empty
  kInstanceType,  // empty, or letters, digits, '.', '-'
  kAddress,       // "" or host:port
  kServer,        // "" or host:port with a host
  kResources,     // list of domain/name resource names
  kDirs,          // list of non-empty paths
  kDriverNames,   // list of DRA driver names (DNS subdomains: a-z, 0-9, '.', '-')
  kLongDuration,  // a duration up to kMaxLongDuration (else up to kMaxRescan)
};

template <typename T>
using Field = std::optional<T> Config::*;
using AnyField =
    std::variant<Field<std::string>, Field<bool>, Field<milliseconds>, Field<int>, Field<Strings>,
                 Field<LogLevel>, Field<LogFormat>, Field<AlignmentMode>, Field<CdiHandover>,
                 Field<MofedPolicy>, Field<DraPolicy>>;

struct Option {
  std::string key;  // YAML key; the flag and the variable follow from it
  AnyField field;
  std::string help = {};
  std::string type_name = {};  // for --help
  Check check = Check::kNone;
  int min = 0;               // integers: min..max
  int max = 0;               // integers: min..max
  std::string example = {};  // resource lists: an example name
  std::string flag() const;  // "rescan-interval"
  std::string env() const;   // "EFA_RESCAN_INTERVAL"
};

std::string Option::flag() const {
  std::string out;
  for (char c : key) {
    if (std::isupper(static_cast<unsigned char>(c))) {
      out += '-';
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else {
      out += c;
    }
  }
  return out;
}

std::string Option::env() const {
  std::string out = "EFA_";
  for (char c : flag()) {
    out += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return out;
}

// A configuration is a few hundred bytes; this bounds a wrong path (a log, a
// device) without refusing any real one.
constexpr size_t kMaxConfigBytes = size_t{1} << 20;
constexpr milliseconds kMinRescan{100};
constexpr milliseconds kMaxRescan{3600 * 1000};
constexpr milliseconds kMaxLongDuration{24 * 3600 * 1000};
// Of each HTTP listener: a descriptor each, within a container's usual
// limit of 1024 with room for the daemon's own.
constexpr int kMaxHttpConnections = 512;

// A table, one row per option: it grows with the options, not with logic.
// NOLINTNEXTLINE(readability-function-size)
const std::vector<Option>& Options() {
  static const std::vector<Option>* options = new std::vector<Option>{
      {.key = "sysfsRoot",
       .field = &Config::sysfs_root,
       .help = "Where the host's /sys is",
       .type_name = "PATH",
       .check = Check::kPath},
      {.key = "devRoot",
       .field = &Config::dev_root,
       .help = "Where the host's /dev is",
       .type_name = "PATH",
       .check = Check::kPath},
      {.key = "procRoot",
       .field = &Config::proc_root,
       .help = "Where the host's /proc is",
       .type_name = "PATH",
       .check = Check::kPath},
      {.key = "kubeletDir",
       .field = &Config::kubelet_dir,
       .help = "The kubelet's root directory",
       .type_name = "PATH",
       .check = Check::kPath},
      {.key = "topologyXml",
       .field = &Config::topology_xml,
       .help = "Read the PCI tree from this hwloc XML file instead of the host",
       .type_name = "PATH"},
      {.key = "instanceType",
       .field = &Config::instance_type,
       .help = "The EC2 instance type (empty: the DMI product name)",
       .type_name = "TYPE",
       .check = Check::kInstanceType},
      {.key = "reportNuma",
       .field = &Config::report_numa,
       .help = "Report each device's NUMA node to the kubelet (Topology Manager)",
       .type_name = "BOOL"},
      {.key = "rescanInterval",
       .field = &Config::rescan_interval,
       .help = "Period of the fallback rescan of devices and guards",
       .type_name = "DURATION"},
      {.key = "logLevel",
       .field = &Config::log_level,
       .help = "Least severe level logged: trace, debug, info, warn or error",
       .type_name = "LEVEL"},
      {.key = "logFormat",
       .field = &Config::log_format,
       .help = "text, or json (one JSON object per line)",
       .type_name = "FORMAT"},
      {.key = "metricsAddress",
       .field = &Config::metrics_address,
       .help = "Address of the HTTP server for /metrics, /healthz and /readyz (\"\": none)",
       .type_name = "ADDRESS",
       .check = Check::kAddress},
      {.key = "probeAddress",
       .field = &Config::probe_address,
       .help = "Address of a second HTTP server for /healthz and /readyz alone, for the kubelet's "
               "probes (\"\": none)",
       .type_name = "ADDRESS",
       .check = Check::kAddress},
      // Each HTTP connection holds a descriptor: the caps bound what clients
      // of the two listeners can take from the daemon's own work.
      {.key = "metricsMaxConnections",
       .field = &Config::metrics_max_connections,
       .help = "Connections metricsAddress holds at once; one more is closed at once",
       .type_name = "N",
       .min = 1,
       .max = kMaxHttpConnections},
      {.key = "probeMaxConnections",
       .field = &Config::probe_max_connections,
       .help = "Connections probeAddress holds at once; one more is closed at once",
       .type_name = "N",
       .min = 1,
       .max = kMaxHttpConnections},
      {.key = "httpRequestTimeout",
       .field = &Config::http_request_timeout,
       .help = "An HTTP client not answered this long after connecting is disconnected, however "
               "slowly it sends",
       .type_name = "DURATION"},
      {.key = "alignment",
       .field = &Config::alignment,
       .help = "How EFAs are aligned with the container's accelerators: best-effort, late-binding "
               "or off",
       .type_name = "MODE"},
      {.key = "gpuResources",
       .field = &Config::gpu_resources,
       .help = "GPU resources to align EFAs with",
       .type_name = "LIST",
       .check = Check::kResources,
       .example = "nvidia.com/gpu"},
      {.key = "neuronResources",
       .field = &Config::neuron_resources,
       .help = "Neuron device resources to align EFAs with",
       .type_name = "LIST",
       .check = Check::kResources,
       .example = "aws.amazon.com/neuron"},
      {.key = "neuroncoreResources",
       .field = &Config::neuroncore_resources,
       .help = "NeuronCore resources to align EFAs with",
       .type_name = "LIST",
       .check = Check::kResources,
       .example = "aws.amazon.com/neuroncore"},
      {.key = "neuroncoresPerDevice",
       .field = &Config::neuroncores_per_device,
       .help = "NeuronCores per Neuron device (0: by instance family)",
       .type_name = "N",
       .max = 64},
      {.key = "cdiDir",
       .field = &Config::cdi_dir,
       .help = "Where late binding writes its CDI specs (read in every mode: bindings outlive a "
               "change of mode)",
       .type_name = "PATH",
       .check = Check::kPath},
      {.key = "cdiHandover",
       .field = &Config::cdi_handover,
       .help = "How late binding names a container's CDI device to the kubelet: cdi-devices (the "
               "cdi_devices field, kubelet 1.28+), annotation (a cdi.k8s.io/ annotation, any "
               "kubelet) or both",
       .type_name = "HOW"},
      {.key = "mofedPolicy",
       .field = &Config::mofed_policy,
       .help = "When the NVIDIA device plugin has MOFED on: warn, protect (also report every EFA "
               "Unhealthy) or off",
       .type_name = "POLICY"},
      {.key = "draPolicy",
       .field = &Config::dra_policy,
       .help = "While the EFA DRA driver (dra.net) serves the node: yield (withdraw "
               "vpc.amazonaws.com/efa) or ignore; monitor on a DRA node pool's nodes (never "
               "register, export the EFAs' health and traffic)",
       .type_name = "POLICY"},
      {.key = "draDrivers",
       .field = &Config::dra_drivers,
       .help =
           "DRA drivers that hand out this node's EFAs, by driver name (their registration socket "
           "<kubeletDir>/plugins_registry/<name>-reg.sock); draPolicy applies while one registers",
       .type_name = "LIST",
       .check = Check::kDriverNames,
       .example = "dra.net"},
      {.key = "cdiSpecDirs",
       .field = &Config::cdi_spec_dirs,
       .help = "Where the host's CDI specs are (the NVIDIA MOFED spec is looked for there)",
       .type_name = "LIST",
       .check = Check::kDirs},
      {.key = "expectedEfaCount",
       .field = &Config::expected_efa_count,
       .help = "EFAs this node should have (0: by instance type); fewer gives a warning",
       .type_name = "N",
       .max = 1024},
      {.key = "sharingReplicas",
       .field = &Config::sharing_replicas,
       .help = "Device IDs per EFA: N > 1 lets N containers share each EFA (1: exclusive)",
       .type_name = "N",
       .min = 1,
       .max = topology::kMaxReplicas},
      {.key = "sharingRenameByDefault",
       .field = &Config::sharing_rename_by_default,
       .help = "With sharingReplicas > 1, advertise vpc.amazonaws.com/efa.shared instead of "
               "vpc.amazonaws.com/efa",
       .type_name = "BOOL"},
      {.key = "counterInterval",
       .field = &Config::counter_interval,
       .help = "The least time between two reads of the EFAs' counters (a scrape in between gets "
               "the last read); with deviceHealth the daemon also reads them this often",
       .type_name = "DURATION"},
      {.key = "idleTimeout",
       .field = &Config::idle_timeout,
       .help = "A running container's EFA that moved no bytes this long is reported idle",
       .type_name = "DURATION",
       .check = Check::kLongDuration},
      {.key = "deviceHealth",
       .field = &Config::device_health,
       .help = "Also report an EFA Unhealthy when its own counters say it stopped working "
               "(keep_alive_rcvd stopped, admin commands failing)",
       .type_name = "BOOL"},
      {.key = "deviceHealthKeepAliveTimeout",
       .field = &Config::device_health_keep_alive_timeout,
       .help = "deviceHealth: Unhealthy when keep_alive_rcvd does not advance this long",
       .type_name = "DURATION"},
      {.key = "deviceHealthAdminErrors",
       .field = &Config::device_health_admin_errors,
       .help = "deviceHealth: Unhealthy when cmds_err rises by this many between two reads",
       .type_name = "N",
       .min = 1,
       .max = 1000000},
      {.key = "deviceHealthHoldDown",
       .field = &Config::device_health_hold_down,
       .help = "deviceHealth: Healthy again only after this long without a problem",
       .type_name = "DURATION",
       .check = Check::kLongDuration},
      {.key = "claimLookup",
       .field = &Config::claim_lookup,
       .help = "Look up in the API server the devices of a ResourceClaim the kubelet lists "
               "without any (DRANET's), for its containers' EFA series; needs a token allowed to "
               "get resourceclaims",
       .type_name = "BOOL"},
      {.key = "apiServer",
       .field = &Config::api_server,
       .help = "claimLookup: the API server (\"\": the pod's KUBERNETES_SERVICE_HOST and "
               "KUBERNETES_SERVICE_PORT)",
       .type_name = "HOST:PORT",
       .check = Check::kServer},
      {.key = "apiTokenFile",
       .field = &Config::api_token_file,
       .help = "claimLookup: the bearer token, read at every lookup",
       .type_name = "PATH",
       .check = Check::kPath},
      {.key = "apiCaFile",
       .field = &Config::api_ca_file,
       .help = "claimLookup: the CA certificates the API server's certificate is checked against",
       .type_name = "PATH",
       .check = Check::kPath},
  };
  return *options;
}

// Names of enum values, in declaration order.
template <typename E>
const std::vector<std::pair<E, std::string>>& EnumNames();
template <>
const std::vector<std::pair<LogLevel, std::string>>& EnumNames() {
  return LogLevelNames();
}
template <>
const std::vector<std::pair<LogFormat, std::string>>& EnumNames() {
  return LogFormatNames();
}
template <>
const std::vector<std::pair<AlignmentMode, std::string>>& EnumNames() {
  static const auto* names = new std::vector<std::pair<AlignmentMode, std::string>>{
      {AlignmentMode::kBestEffort, "best-effort"},
      {AlignmentMode::kLateBinding, "late-binding"},
      {AlignmentMode::kOff, "off"}};
  return *names;
}
template <>
const std::vector<std::pair<CdiHandover, std::string>>& EnumNames() {
  static const auto* names = new std::vector<std::pair<CdiHandover, std::string>>{
      {CdiHandover::kBoth, "both"},
      {CdiHandover::kCdiDevices, "cdi-devices"},
      {CdiHandover::kAnnotation, "annotation"}};
  return *names;
}
template <>
const std::vector<std::pair<MofedPolicy, std::string>>& EnumNames() {
  return MofedPolicyNames();
}
template <>
const std::vector<std::pair<DraPolicy, std::string>>& EnumNames() {
  return DraPolicyNames();
}

template <typename E>
std::string EnumName(E value) {
  for (const auto& [v, name] : EnumNames<E>()) {
    if (v == value) return name;
  }
  return "?";
}

// `"text"` with quotes, backslashes and control characters escaped, as in
// a YAML (or JSON) double-quoted scalar.
std::string Quote(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7f) {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 0xf];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Quote() for messages: at most 64 bytes of `text`, then "...", so that a
// megabyte-long bad value gives a readable line, not a megabyte.
std::string QuoteShort(std::string_view text) {
  constexpr size_t kMax = 64;
  if (text.size() <= kMax) return Quote(text);
  std::string out = Quote(text.substr(0, kMax));
  out.insert(out.size() - 1, "...");
  return out;
}

std::string FormatDuration(milliseconds d) {
  return absl::FormatDuration(absl::Milliseconds(d.count()));
}

// What a value of option `o` must look like: "a duration like "10s"".
template <typename T>
std::string Expected(const Option& o) {
  if constexpr (std::is_same_v<T, std::string>) {
    switch (o.check) {
      case Check::kInstanceType:
        return "an EC2 instance type like \"p5.48xlarge\"";
      case Check::kAddress:
        return "an address like \":8080\" or \"127.0.0.1:8080\", or \"\" for none";
      case Check::kServer:
        return "a server like \"10.100.0.1:443\" or \"api.example.com:443\", or \"\"";
      default:
        return "a path";
    }
  } else if constexpr (std::is_same_v<T, bool>) {
    return "true or false";
  } else if constexpr (std::is_same_v<T, milliseconds>) {
    return "a duration like \"10s\"";
  } else if constexpr (std::is_same_v<T, int>) {
    return absl::StrCat("an integer from ", o.min, " to ", o.max);
  } else if constexpr (std::is_same_v<T, Strings>) {
    switch (o.check) {
      case Check::kResources:
        return absl::StrCat("a list of resource names like [", o.example, "]");
      case Check::kDriverNames:
        return absl::StrCat("a list of DRA driver names like [", o.example, "]");
      default:
        return "a list of directory paths";
    }
  } else {
    std::string out = "one of ";
    for (const auto& [v, name] : EnumNames<T>()) {
      if (out.size() > 7) out += ", ";
      out += name;
    }
    return out;
  }
}

absl::Status Mismatch(const std::string& expected, std::string_view got) {
  return absl::InvalidArgumentError(absl::StrCat("expected ", expected, ", got ", QuoteShort(got)));
}

// What one element of a list option must be.
std::string ElementExpected(const Option& o) {
  switch (o.check) {
    case Check::kResources:
      return absl::StrCat("a resource name like \"", o.example, "\"");
    case Check::kDriverNames:
      return absl::StrCat("a DRA driver name like \"", o.example, "\"");
    default:
      return "a directory path";
  }
}

// One element of a list option.
absl::Status CheckElement(const Option& o, std::string_view text) {
  if (o.check == Check::kDriverNames) {
    // Also a file name: no '/' may lead out of plugins_registry.
    bool ok = !text.empty();
    for (char c : text) {
      ok = ok && (std::islower(static_cast<unsigned char>(c)) ||
                  std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == '-');
    }
    if (!ok) return Mismatch(ElementExpected(o), text);
  } else if (o.check == Check::kResources) {
    const size_t slash = text.find('/');
    bool ok = slash != std::string_view::npos && slash > 0 && slash + 1 < text.size() &&
              text.find('/', slash + 1) == std::string_view::npos;
    for (char c : text) {
      ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' ||
                  c == '/');
    }
    if (!ok) return Mismatch(ElementExpected(o), text);
  } else if (text.empty()) {
    return Mismatch(ElementExpected(o), text);
  }
  return absl::OkStatus();
}

// Parses the text of a scalar option, from a flag, a variable or a YAML
// scalar. The message says what was expected and what was found.
template <typename T>
absl::StatusOr<T> ParseText(const Option& o, std::string_view text) {
  if constexpr (std::is_same_v<T, std::string>) {
    switch (o.check) {
      case Check::kPath:
        if (text.empty()) return Mismatch(Expected<T>(o), text);
        break;
      case Check::kInstanceType:
        for (char c : text) {
          if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-') {
            return Mismatch(Expected<T>(o), text);
          }
        }
        break;
      case Check::kAddress:
        if (!text.empty() && !ParseListenAddress(text).ok()) return Mismatch(Expected<T>(o), text);
        break;
      case Check::kServer:
        if (!text.empty() && (text.front() == ':' || !ParseListenAddress(text).ok())) {
          return Mismatch(Expected<T>(o), text);
        }
        break;
      default:
        break;
    }
    return std::string(text);
  } else if constexpr (std::is_same_v<T, bool>) {
    if (text == "true" || text == "True" || text == "TRUE") return true;
    if (text == "false" || text == "False" || text == "FALSE") return false;
    return Mismatch(Expected<T>(o), text);
  } else if constexpr (std::is_same_v<T, milliseconds>) {
    absl::Duration d;
    if (!absl::ParseDuration(std::string(text), &d)) return Mismatch(Expected<T>(o), text);
    const milliseconds ms(absl::ToInt64Milliseconds(d));
    const milliseconds max = o.check == Check::kLongDuration ? kMaxLongDuration : kMaxRescan;
    if (ms < kMinRescan || ms > max) {
      return Mismatch(
          absl::StrCat("a duration from ", FormatDuration(kMinRescan), " to ", FormatDuration(max)),
          text);
    }
    return ms;
  } else if constexpr (std::is_same_v<T, int>) {
    int v = 0;
    const bool digits = !text.empty() && std::all_of(text.begin(), text.end(),
                                                     [](char c) { return c >= '0' && c <= '9'; });
    if (!digits || !absl::SimpleAtoi(std::string(text), &v) || v < o.min || v > o.max) {
      return Mismatch(Expected<T>(o), text);
    }
    return v;
  } else if constexpr (std::is_same_v<T, Strings>) {
    // Comma-separated (flags and variables); empty text is an empty list.
    Strings out;
    if (text.empty()) return out;
    size_t start = 0;
    while (true) {
      const size_t end = text.find_first_of(",\n", start);
      std::string_view item =
          text.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
      while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
      while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
      if (absl::Status s = CheckElement(o, item); !s.ok()) return s;
      out.emplace_back(item);
      if (end == std::string_view::npos) break;
      start = end + 1;
    }
    return out;
  } else {
    for (const auto& [v, name] : EnumNames<T>()) {
      if (text == name) return v;
    }
    return Mismatch(Expected<T>(o), text);
  }
}

// Sets option `o` in `config` from text; errors are prefixed with `subject`
// ("--rescan-interval: ").
absl::Status SetFromText(const Option& o, std::string_view text, const std::string& subject,
                         Config& config) {
  return std::visit(
      [&](auto field) -> absl::Status {
        using T = typename std::remove_reference_t<decltype(config.*field)>::value_type;
        auto value = ParseText<T>(o, text);
        if (!value.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(subject, value.status().message()));
        }
        config.*field = *std::move(value);
        return absl::OkStatus();
      },
      o.field);
}

bool IsSet(const Option& o, const Config& config) {
  return std::visit([&](auto field) { return (config.*field).has_value(); }, o.field);
}

void Copy(const Option& o, const Config& from, Config& to) {
  std::visit(
      [&](auto field) {
        if ((from.*field).has_value()) to.*field = from.*field;
      },
      o.field);
}

// The value as it is written in a config file.
std::string YamlValue(const Option& o, const Config& config) {
  return std::visit(
      [&](auto field) -> std::string {
        const auto& value = config.*field;
        using T = typename std::remove_reference_t<decltype(value)>::value_type;
        if (!value) return "~";
        if constexpr (std::is_same_v<T, std::string>) {
          return Quote(*value);
        } else if constexpr (std::is_same_v<T, bool>) {
          return *value ? "true" : "false";
        } else if constexpr (std::is_same_v<T, milliseconds>) {
          return FormatDuration(*value);
        } else if constexpr (std::is_same_v<T, int>) {
          return std::to_string(*value);
        } else if constexpr (std::is_same_v<T, Strings>) {
          std::string out = "[";
          for (const std::string& s : *value) {
            if (out.size() > 1) out += ", ";
            out += Quote(s);
          }
          return out + "]";
        } else {
          return EnumName(*value);
        }
      },
      o.field);
}

// The value for the one-line summary: unquoted unless empty.
std::string PlainValue(const Option& o, const Config& config) {
  return std::visit(
      [&](auto field) -> std::string {
        const auto& value = config.*field;
        using T = typename std::remove_reference_t<decltype(value)>::value_type;
        if (!value) return "unset";
        if constexpr (std::is_same_v<T, std::string>) {
          return value->empty() ? "\"\"" : *value;
        } else if constexpr (std::is_same_v<T, Strings>) {
          std::string out = "[";
          for (const std::string& s : *value) {
            if (out.size() > 1) out += ",";
            out += s;
          }
          return out + "]";
        } else {
          return YamlValue(o, config);
        }
      },
      o.field);
}

// ---- YAML ------------------------------------------------------------------

std::string Where(const std::string& file, const YAML::Mark& mark) {
  if (mark.is_null()) return absl::StrCat(file, ": ");
  return absl::StrCat(file, ":", mark.line + 1, ":", mark.column + 1, ": ");
}

// How a node looks, for "got ...".
std::string Found(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      return QuoteShort(node.Scalar());
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    default:
      return "nothing";
  }
}

// A yaml-cpp message with the input's bytes it may quote (control
// characters, bytes of broken UTF-8) shown as \xNN.
std::string EscapeBytes(std::string_view text) {
  std::string out;
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) {
      absl::StrAppend(&out, "\\x", absl::Hex(u, absl::kZeroPad2));
    } else {
      out += c;
    }
  }
  return out;
}

// Where a second YAML document in `text` starts, if there is one. Not
// YAML::LoadAll: it loops forever on some inputs (",:").
std::optional<YAML::Mark> SecondDocument(const std::string& text) {
  class DocumentStarts : public YAML::EventHandler {
   public:
    void OnDocumentStart(const YAML::Mark& mark) override {
      if (++documents_ == 2) second_ = mark;
    }
    void OnDocumentEnd() override {}
    void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
    void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
    void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  const std::string&) override {}
    void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                         YAML::EmitterStyle::value) override {}
    void OnSequenceEnd() override {}
    void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                    YAML::EmitterStyle::value) override {}
    void OnMapEnd() override {}
    const std::optional<YAML::Mark>& second() const { return second_; }

   private:
    int documents_ = 0;
    std::optional<YAML::Mark> second_;
  };
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentStarts starts;
  for (int i = 0; i < 2 && parser.HandleNextDocument(starts); ++i) {
  }
  return starts.second();
}

absl::Status NodeError(const std::string& file, const YAML::Node& node, const std::string& key,
                       const std::string& expected) {
  return absl::InvalidArgumentError(
      absl::StrCat(Where(file, node.Mark()), key, ": expected ", expected, ", got ", Found(node)));
}

// Sets option `o` from its YAML value (not null).
absl::Status SetFromYaml(const Option& o, const YAML::Node& node, const std::string& file,
                         Config& config) {
  return std::visit(
      [&](auto field) -> absl::Status {
        using T = typename std::remove_reference_t<decltype(config.*field)>::value_type;
        if constexpr (std::is_same_v<T, Strings>) {
          if (!node.IsSequence()) return NodeError(file, node, o.key, Expected<T>(o));
          Strings out;
          for (size_t i = 0; i < node.size(); ++i) {
            const YAML::Node item = node[i];
            const std::string subject = absl::StrCat(o.key, "[", i, "]");
            if (!item.IsScalar()) {
              return NodeError(file, item, subject, ElementExpected(o));
            }
            if (absl::Status s = CheckElement(o, item.Scalar()); !s.ok()) {
              return absl::InvalidArgumentError(
                  absl::StrCat(Where(file, item.Mark()), subject, ": ", s.message()));
            }
            out.push_back(item.Scalar());
          }
          config.*field = std::move(out);
          return absl::OkStatus();
        } else {
          if (!node.IsScalar()) return NodeError(file, node, o.key, Expected<T>(o));
          return SetFromText(o, node.Scalar(), absl::StrCat(Where(file, node.Mark()), o.key, ": "),
                             config);
        }
      },
      o.field);
}

std::string Normalize(std::string_view key) {
  std::string out;
  for (char c : key) {
    if (c != '-' && c != '_') out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The known key closest to `key` (ignoring case, '-' and '_'), if it is
// close enough to be a likely typo.
std::optional<std::string> Suggest(std::string_view key) {
  const std::string norm = Normalize(key);
  std::optional<std::string> best;
  size_t best_distance = std::max<size_t>(2, norm.size() / 4) + 1;
  std::vector<std::string> keys = {"version"};
  for (const Option& o : Options()) keys.push_back(o.key);
  for (const std::string& k : keys) {
    const size_t d = EditDistance(norm, Normalize(k));
    if (d < best_distance) {
      best_distance = d;
      best = k;
    }
  }
  return best;
}

const Option* FindOption(std::string_view key) {
  for (const Option& o : Options()) {
    if (o.key == key) return &o;
  }
  return nullptr;
}

absl::StatusOr<Config> ParseYamlRoot(const YAML::Node& root, const std::string& file) {
  const std::string start = absl::StrCat(file, ":1:1: ");
  if (root.IsNull()) {
    return absl::InvalidArgumentError(
        absl::StrCat(start,
                     "expected a mapping of options starting with version: v1, got an "
                     "empty file"));
  }
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(file, root.Mark()), "expected a mapping of options, got ", Found(root)));
  }
  Config config;
  std::map<std::string, YAML::Mark> seen;
  bool versioned = false;
  for (auto it = root.begin(); it != root.end(); ++it) {
    // Copies: it-> is a temporary proxy, a reference into it would dangle.
    const YAML::Node key_node = it->first;
    const YAML::Node value = it->second;
    if (!key_node.IsScalar()) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(file, key_node.Mark()), "expected an option name, got ", Found(key_node)));
    }
    const std::string key = key_node.Scalar();
    auto [first, inserted] = seen.emplace(key, key_node.Mark());
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(Where(file, key_node.Mark()), key,
                                                     ": given twice (first at line ",
                                                     first->second.line + 1, ")"));
    }
    if (key == "version") {
      if (!value.IsScalar() || value.Scalar() != "v1") {
        return NodeError(file, value, key, "v1");
      }
      versioned = true;
      continue;
    }
    const Option* o = FindOption(key);
    if (o == nullptr) {
      std::optional<std::string> suggestion = Suggest(key);
      return absl::InvalidArgumentError(
          absl::StrCat(Where(file, key_node.Mark()), key, ": unknown key",
                       suggestion ? absl::StrCat(" (did you mean ", *suggestion, "?)") : ""));
    }
    if (value.IsNull()) continue;  // "key:" or "key: ~": not given
    if (absl::Status s = SetFromYaml(*o, value, file, config); !s.ok()) return s;
  }
  if (!versioned) {
    return absl::InvalidArgumentError(absl::StrCat(start, "version: expected v1, got nothing"));
  }
  return config;
}

}  // namespace

std::string_view LogLevelName(LogLevel level) {
  for (const auto& [v, name] : EnumNames<LogLevel>()) {
    if (v == level) return name;
  }
  return "?";
}
std::string_view LogFormatName(LogFormat format) {
  for (const auto& [v, name] : EnumNames<LogFormat>()) {
    if (v == format) return name;
  }
  return "?";
}
std::string_view AlignmentModeName(AlignmentMode mode) {
  for (const auto& [v, name] : EnumNames<AlignmentMode>()) {
    if (v == mode) return name;
  }
  return "?";
}

namespace {

// A setting's value as the configuration holds it, and back: paths are
// text there.
template <typename To, typename From>
To Convert(const From& from) {
  if constexpr (std::is_same_v<To, From>) {
    return from;
  } else if constexpr (std::is_same_v<To, std::string>) {
    return from.string();  // a path
  } else {
    return To(from.begin(), from.end());  // a path from text, or a list of either
  }
}

// The one place that says which setting each option sets: `visit(key,
// field)` for every option (but sharingRenameByDefault, which chooses
// the daemon's resource name with sharingReplicas: ToSettings).
template <typename C, typename S, typename Visit>
void ForEachSetting(C& c, S& s, const Visit& visit) {
  auto& d = s.daemon;
  visit(c.sysfs_root, d.roots.sysfs);
  visit(c.dev_root, d.roots.dev);
  visit(c.proc_root, d.roots.proc);
  visit(c.kubelet_dir, d.kubelet_dir);
  visit(c.topology_xml, d.topology_xml);
  visit(c.instance_type, d.instance_type);
  visit(c.report_numa, d.report_numa);
  visit(c.rescan_interval, d.rescan_interval);
  visit(c.log_level, s.log_level);
  visit(c.log_format, s.log_format);
  visit(c.metrics_address, s.metrics_address);
  visit(c.probe_address, s.probe_address);
  visit(c.metrics_max_connections, s.limits.metrics_connections);
  visit(c.probe_max_connections, s.limits.probe_connections);
  visit(c.http_request_timeout, s.limits.request_timeout);
  visit(c.alignment, d.alignment);
  visit(c.gpu_resources, d.accelerator_resources.gpu);
  visit(c.neuron_resources, d.accelerator_resources.neuron);
  visit(c.neuroncore_resources, d.accelerator_resources.neuroncore);
  visit(c.neuroncores_per_device, d.accelerator_resources.neuroncores_per_device);
  visit(c.cdi_dir, d.cdi_dir);
  visit(c.cdi_handover, d.cdi_handover);
  visit(c.mofed_policy, d.guards.mofed_policy);
  visit(c.dra_policy, d.guards.dra_policy);
  visit(c.dra_drivers, d.guards.dra_drivers);
  visit(c.cdi_spec_dirs, d.guards.cdi_spec_dirs);
  visit(c.expected_efa_count, s.expected_efa_count);
  visit(c.sharing_replicas, d.replicas);
  visit(c.sharing_rename_by_default, s.sharing_rename_by_default);
  visit(c.counter_interval, d.counters.interval);
  visit(c.idle_timeout, d.counters.idle_timeout);
  visit(c.device_health, d.counters.health.enabled);
  visit(c.device_health_keep_alive_timeout, d.counters.health.keep_alive_timeout);
  visit(c.device_health_admin_errors, d.counters.health.admin_errors);
  visit(c.device_health_hold_down, d.counters.health.hold_down);
  visit(c.claim_lookup, d.counters.claim_lookup);
  visit(c.api_server, d.counters.api_server.address);
  visit(c.api_token_file, d.counters.api_server.token_file);
  visit(c.api_ca_file, d.counters.api_server.ca_file);
}

}  // namespace

Config DefaultConfig() {
  Config c;
  const Settings s;
  ForEachSetting(c, s, [](auto& key, const auto& field) {
    key = Convert<typename std::remove_reference_t<decltype(key)>::value_type>(field);
  });
  return c;
}

Settings ToSettings(const Config& c) {
  Settings s;
  ForEachSetting(c, s, [](const auto& key, auto& field) {
    if (key) field = Convert<std::remove_reference_t<decltype(field)>>(*key);
  });
  if (s.daemon.replicas > 1 && s.sharing_rename_by_default) {
    s.daemon.resource_name = kSharedResourceName;
  }
  s.daemon.counters.claim_lookup_time = std::min(ApiServer::kTimeout, s.limits.request_timeout / 3);
  return s;
}

Config MergeConfig(Config base, const Config& over) {
  for (const Option& o : Options()) Copy(o, over, base);
  return base;
}

EnvLookup ProcessEnvironment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

absl::StatusOr<Config> ParseConfigYaml(std::string_view text, const std::string& file_name) {
  // yaml-cpp reports through exceptions; none leaves this function.
  try {
    const std::string yaml(text);
    absl::StatusOr<Config> config = ParseYamlRoot(YAML::Load(yaml), file_name);
    if (!config.ok()) return config;
    // YAML::Load reads the first document only: refuse a second rather
    // than ignore it.
    if (std::optional<YAML::Mark> second = SecondDocument(yaml)) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(file_name, *second), "expected one YAML document, got a second"));
    }
    return config;
  } catch (const YAML::DeepRecursion& e) {
    // yaml-cpp says "bad file" for this.
    return absl::InvalidArgumentError(
        absl::StrCat(Where(file_name, e.mark), "invalid YAML: nested too deeply"));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(file_name, e.mark), "invalid YAML: ", EscapeBytes(e.msg)));
  }
}

absl::StatusOr<Config> ReadConfigFile(const std::filesystem::path& path) {
  absl::StatusOr<std::string> text = topology::ReadFileBounded(path, kMaxConfigBytes);
  if (!text.ok()) return text.status();
  return ParseConfigYaml(*text, path.string());
}

absl::StatusOr<Config> ConfigFromEnvironment(const EnvLookup& env) {
  Config config;
  for (const Option& o : Options()) {
    const std::string name = o.env();
    std::optional<std::string> value = env(name);
    if (!value) continue;
    if (absl::Status s = SetFromText(o, *value, name + ": ", config); !s.ok()) return s;
  }
  return config;
}

struct ConfigFlags::Flag {
  const Option* option = nullptr;
  std::string value;
  CLI::Option* cli = nullptr;
};

ConfigFlags::ConfigFlags(CLI::App& app) {
  config_option_ = app.add_option("--config", config_file_,
                                  "A YAML configuration file (version: v1) [env: EFA_CONFIG]")
                       ->type_name("FILE")
                       ->expected(0, 1);
  app.add_flag("--print-config", print_config_,
               "Print the effective configuration as YAML and exit");
  const Config defaults = DefaultConfig();
  for (const Option& o : Options()) {
    auto flag = std::make_unique<Flag>();
    flag->option = &o;
    std::string help = absl::StrCat(o.help, " [env: ", o.env(), ", key: ", o.key,
                                    ", default: ", YamlValue(o, defaults), "]");
    // An empty value (--metrics-address=) is a value, judged like any other;
    // a bare boolean flag (--report-numa) means true.
    flag->cli =
        app.add_option("--" + o.flag(), flag->value, help)->type_name(o.type_name)->expected(0, 1);
    // A list may be given as "a,b" or as repeated flags; a scalar takes the
    // last value given.
    flag->cli->multi_option_policy(std::holds_alternative<Field<Strings>>(o.field)
                                       ? CLI::MultiOptionPolicy::Join
                                       : CLI::MultiOptionPolicy::TakeLast);
    flags_.push_back(std::move(flag));
  }
}

ConfigFlags::~ConfigFlags() = default;

absl::StatusOr<Config> ConfigFlags::Parsed() const {
  Config config;
  for (const auto& flag : flags_) {
    if (flag->cli->count() == 0) continue;
    const bool bare_bool =
        flag->value.empty() && std::holds_alternative<Field<bool>>(flag->option->field);
    if (absl::Status s = SetFromText(*flag->option, bare_bool ? "true" : flag->value,
                                     "--" + flag->option->flag() + ": ", config);
        !s.ok()) {
      return s;
    }
  }
  return config;
}

std::optional<std::string> ConfigFlags::config_file() const {
  if (config_option_->count() == 0) return std::nullopt;
  return config_file_;
}

absl::StatusOr<EffectiveConfig> ResolveConfig(const Config& flags,
                                              const std::optional<std::string>& config_file,
                                              const EnvLookup& env) {
  std::optional<std::string> file = config_file ? config_file : env("EFA_CONFIG");
  if (file && file->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_file ? "--config" : "EFA_CONFIG", ": expected a file, got \"\""));
  }
  Config from_file;
  if (file) {
    auto parsed = ReadConfigFile(*file);
    if (!parsed.ok()) return parsed.status();
    from_file = *std::move(parsed);
  }
  auto from_env = ConfigFromEnvironment(env);
  if (!from_env.ok()) return from_env.status();

  EffectiveConfig out;
  out.config = DefaultConfig();
  const std::pair<const Config*, int> layers[] = {{&from_file, 0}, {&*from_env, 1}, {&flags, 2}};
  for (const auto& [layer, rank] : layers) {
    for (const Option& o : Options()) {
      if (!IsSet(o, *layer)) continue;
      Copy(o, *layer, out.config);
      out.origin[o.key] = rank == 0 ? *file : rank == 1 ? o.env() : "--" + o.flag();
    }
  }
  return out;
}

absl::StatusOr<EffectiveConfig> ResolveConfig(const ConfigFlags& flags, const EnvLookup& env) {
  auto given = flags.Parsed();
  if (!given.ok()) return given.status();
  return ResolveConfig(*given, flags.config_file(), env);
}

std::string EffectiveConfig::ToYaml() const {
  std::string out = "version: v1\n";
  for (const Option& o : Options()) {
    absl::StrAppend(&out, o.key, ": ", YamlValue(o, config));
    auto it = origin.find(o.key);
    if (it != origin.end()) absl::StrAppend(&out, "  # from ", it->second);
    out += "\n";
  }
  return out;
}

std::string EffectiveConfig::Summary() const {
  std::string out;
  for (const Option& o : Options()) {
    if (!out.empty()) out += ' ';
    absl::StrAppend(&out, o.key, "=", PlainValue(o, config));
    auto it = origin.find(o.key);
    if (it != origin.end()) absl::StrAppend(&out, " (", it->second, ")");
  }
  return out;
}

DaemonOptions ToDaemonOptions(const Config& c) { return ToSettings(c).daemon; }

}  // namespace efa::plugin
