#include "plugin/ops/efa_counter_monitor.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "plugin/alignment/alignment.h"
#include "plugin/kubelet/pod_resources_client.h"
#include "spdlog/spdlog.h"

namespace efa::plugin {
namespace {

std::string FormatDuration(std::chrono::milliseconds d) {
  return absl::FormatDuration(absl::Milliseconds(d.count()));
}

// The containers of `list` using ResourceClaims, each with its claims'
// devices (a claim listed without devices as one entry with an empty
// driver and device). As the kubelet fills it (pkg/kubelet/cm
// container_manager_linux.go GetDynamicResources): one DynamicResource per
// claim the container names, one ClaimResource per device the driver's
// NodePrepareResources answered (none when it answered none).
std::vector<EfaHolder> DraHolders(const v1::ListPodResourcesResponse& list) {
  std::vector<EfaHolder> out;
  for (const auto& pod : list.pod_resources()) {
    for (const auto& container : pod.containers()) {
      if (container.dynamic_resources().empty()) continue;
      EfaHolder h{pod.namespace_(), pod.name(), container.name(), {}};
      for (const auto& claim : container.dynamic_resources()) {
        if (claim.claim_resources().empty()) {
          h.dra_devices.push_back({claim.claim_name(), claim.claim_namespace(), "", "", ""});
        }
        for (const auto& r : claim.claim_resources()) {
          h.dra_devices.push_back({claim.claim_name(), claim.claim_namespace(), r.driver_name(),
                                   r.pool_name(), r.device_name()});
        }
      }
      out.push_back(std::move(h));
    }
  }
  return out;
}

}  // namespace

std::string DraDeviceName(const topology::PciAddress& pci) {
  std::string name = "pci-" + pci.ToString();
  std::replace_if(
      name.begin() + 4, name.end(), [](char c) { return c == ':' || c == '.'; }, '-');
  return name;
}

EfaCounterMonitor::EfaCounterMonitor(EfaCounterMonitorOptions options)
    : options_(std::move(options)) {}

Clock::time_point EfaCounterMonitor::Now() const { return options_.clock->Now(); }

void EfaCounterMonitor::SetDevices(std::vector<topology::EfaDevice> devices) {
  absl::MutexLock lock(&mu_);
  devices_ = std::move(devices);
}

std::map<std::string, std::string> EfaCounterMonitor::HealthProblems() const {
  absl::MutexLock lock(&mu_);
  return problems_;
}

std::shared_ptr<const EfaCounterSnapshot> EfaCounterMonitor::Sample(bool look_up_claims) {
  // A caller that may not wait on the API server does not wait for another
  // caller's read either (it may be looking claims up): that read
  // publishes what it finds.
  if (look_up_claims) {
    read_mu_.Lock();
  } else if (!read_mu_.TryLock()) {
    absl::MutexLock lock(&mu_);
    return latest_;
  }
  bool health_changed = false;
  std::shared_ptr<const EfaCounterSnapshot> snapshot = Read(look_up_claims, health_changed);
  read_mu_.Unlock();
  if (health_changed && options_.on_health_change) options_.on_health_change();
  return snapshot;
}

std::shared_ptr<const EfaCounterSnapshot> EfaCounterMonitor::Read(bool look_up_claims,
                                                                  bool& health_changed) {
  const Clock::time_point now = Now();
  std::vector<topology::EfaDevice> devices;
  int64_t reads = 0;
  {
    absl::MutexLock lock(&mu_);
    const bool lookups_due = look_up_claims && claims_waiting_;
    if (latest_ && now - read_at_ < options_.interval && !lookups_due) return latest_;
    devices = devices_;
    reads = latest_ ? latest_->reads : 0;
  }
  auto snapshot = std::make_shared<EfaCounterSnapshot>();
  snapshot->reads = reads + 1;
  bool claims_waiting = false;
  std::map<std::string, std::string> problems;
  std::map<std::string, EfaState> state;  // only the present EFAs' survives
  for (topology::EfaDevice& device : devices) {
    EfaCounterSnapshot::Efa& efa = snapshot->efas.emplace_back();
    efa.counters = topology::ReadEfaCounters(options_.sysfs_root, device.ibdev);
    auto old = efa_state_.find(device.ibdev);
    EfaState& s = state[device.ibdev] = old != efa_state_.end() ? old->second : EfaState{};
    const auto tx = efa.counters.Get("tx_bytes");
    const auto rx = efa.counters.Get("rx_bytes");
    const std::optional<uint64_t> bytes = tx && rx ? std::optional(*tx + *rx) : std::nullopt;
    if (bytes && (!s.bytes || *s.bytes != *bytes)) s.moved = now;
    s.bytes = bytes;
    if (options_.health.enabled) {
      health_changed |= JudgeHealth(device.ibdev, efa.counters, now, s);
      efa.unhealthy = s.reported;
      efa.unhealthy_kind = s.reported_kind;
      if (!s.reported.empty()) problems[device.ibdev] = s.reported;
    }
    efa.device = std::move(device);
  }
  NoteUnreadable(*snapshot);
  // An EFA that went away leaves its health to the presence check.
  for (const auto& [ibdev, s] : efa_state_) {
    if (!state.count(ibdev) && !s.reported.empty()) health_changed = true;
  }
  efa_state_ = std::move(state);

  if (options_.holders) {
    ListHolders();
    snapshot->holder_errors = holder_errors_;
    // Each container's EFAs in PCI order, as the devices are.
    std::map<std::string, size_t> pci_rank;
    for (const auto& efa : snapshot->efas) pci_rank.emplace(efa.device.ibdev, pci_rank.size());
    auto rank = [&](const std::string& efa) {
      auto it = pci_rank.find(efa);
      return it == pci_rank.end() ? pci_rank.size() : it->second;
    };
    std::vector<EfaHolder> holders_in_pci_order =
        ResolveDra(holders_, *snapshot, look_up_claims, claims_waiting);
    for (EfaHolder& h : holders_in_pci_order) {
      std::stable_sort(
          h.efas.begin(), h.efas.end(),
          [&](const std::string& a, const std::string& b) { return rank(a) < rank(b); });
    }
    snapshot->containers = JudgeIdle(holders_in_pci_order, now);
  }
  {
    absl::MutexLock lock(&mu_);
    latest_ = snapshot;
    read_at_ = now;
    claims_waiting_ = claims_waiting;
    problems_ = std::move(problems);
  }
  return snapshot;
}

void EfaCounterMonitor::ListHolders() {
  absl::StatusOr<std::vector<EfaHolder>> holders = options_.holders();
  if (holders.ok()) {
    holders_ = *std::move(holders);
    if (!holder_error_.empty()) {
      spdlog::info("EFA counters: pod-resources answers again (it failed before: {})",
                   holder_error_);
      holder_error_.clear();
    }
  } else {
    // A restarting kubelet: judge by the containers known last. Said
    // once per kind of failure, counted each time.
    ++holder_errors_;
    const std::string kind(absl::StatusCodeToString(holders.status().code()));
    if (kind != holder_error_) {
      spdlog::warn(
          "EFA counters: cannot tell which containers hold EFAs ({}); using the last known "
          "until pod-resources answers (counted in "
          "efa_device_plugin_efa_counters_holder_errors_total)",
          std::string(holders.status().message()));
      holder_error_ = kind;
    }
  }
}

bool EfaCounterMonitor::JudgeHealth(const std::string& ibdev,
                                    const topology::EfaCounterValues& values, Clock::time_point now,
                                    EfaState& s) const {
  std::string problem, kind;
  // keep_alive_rcvd is judged only once it has been seen advancing: a
  // device (or firmware) that never sends keep-alives must not be held
  // Unhealthy for it.
  if (const auto keep_alive = values.Get("keep_alive_rcvd")) {
    if (!s.keep_alive || *s.keep_alive != *keep_alive) {
      s.keep_alive_advanced |= s.keep_alive.has_value();
      s.keep_alive = keep_alive;
      s.keep_alive_moved = now;
    } else if (s.keep_alive_advanced &&
               now - s.keep_alive_moved >= options_.health.keep_alive_timeout) {
      problem = absl::StrCat("keep_alive_rcvd has not advanced for ",
                             FormatDuration(options_.health.keep_alive_timeout), " (stuck at ",
                             *keep_alive, "): the device stopped sending keep-alives");
      kind = "keep_alive";
    }
  }
  // A counter not read for a host reason (descriptors, memory, a parse
  // error) tells nothing: it keeps its last value to judge the next read
  // by, and such a read cannot end a problem (below).
  const bool partial = !values.unreadable.empty();
  const auto cmds_err = values.Get("cmds_err");
  const auto no_completion = values.Get("no_completion_cmds");
  std::vector<std::string> admin;
  if (no_completion && s.no_completion && *no_completion > *s.no_completion) {
    admin.push_back(absl::StrCat("no_completion_cmds rose by ", *no_completion - *s.no_completion,
                                 " (the device left admin commands unanswered)"));
  }
  if (cmds_err && s.cmds_err && *cmds_err >= *s.cmds_err + options_.health.admin_errors) {
    admin.push_back(absl::StrCat("cmds_err rose by ", *cmds_err - *s.cmds_err,
                                 " since the last read (limit ", options_.health.admin_errors,
                                 ")"));
  }
  // The port counters are fetched from the device with admin commands: once
  // its admin queue is closed they cannot be read. Only the device's own
  // answer counts (values.errors), never a read the daemon could not make.
  for (const std::string& error : values.errors) {
    if (error.find("/ports/1/hw_counters/") != std::string::npos) {
      admin.push_back(absl::StrCat("the device cannot report its counters (", error, ")"));
      break;
    }
  }
  if (cmds_err || !partial) s.cmds_err = cmds_err;
  if (no_completion || !partial) s.no_completion = no_completion;
  if (!admin.empty()) {
    problem = absl::StrCat("admin commands failing: ", absl::StrJoin(admin, "; "),
                           problem.empty() ? "" : "; " + problem);
    kind = "admin_errors";
  }

  if (!problem.empty()) {
    s.good_since.reset();
    if (s.reported == problem) return false;
    // A problem that goes on keeps its first reason: the kubelet's device
    // list does not change and the log says it once.
    if (!s.reported.empty() && s.reported_kind == kind) return false;
    spdlog::warn("EFA {} is unhealthy by its counters: {}", ibdev, problem);
    s.reported = problem;
    s.reported_kind = kind;
    return true;
  }
  if (s.reported.empty() || partial) return false;
  if (!s.good_since) s.good_since = now;
  if (now - *s.good_since < options_.health.hold_down) return false;
  spdlog::info("EFA {} is healthy again by its counters: no problem for {} (was: {})", ibdev,
               FormatDuration(options_.health.hold_down), s.reported);
  s.reported.clear();
  s.reported_kind.clear();
  s.good_since.reset();
  return true;
}

void EfaCounterMonitor::NoteUnreadable(EfaCounterSnapshot& snapshot) {
  size_t files = 0;
  const std::string* first = nullptr;
  for (const EfaCounterSnapshot::Efa& efa : snapshot.efas) {
    files += efa.counters.unreadable.size();
    if (!first && !efa.counters.unreadable.empty()) first = &efa.counters.unreadable.front();
  }
  unreadable_total_ += static_cast<int64_t>(files);
  snapshot.unreadable_total = unreadable_total_;
  if (!first) {
    if (!unreadable_cause_.empty()) {
      spdlog::info("EFA counters: every counter file can be read again (was: {})",
                   unreadable_cause_);
    }
    unreadable_cause_.clear();
    return;
  }
  // Once per cause ("Too many open files"), whichever file and EFA met it.
  const size_t colon = first->find(": ");
  const std::string cause = colon == std::string::npos ? *first : first->substr(colon + 2);
  if (cause == unreadable_cause_) return;
  unreadable_cause_ = cause;
  spdlog::warn(
      "EFA counters: {} counter file(s) not read for a reason that says nothing about the "
      "devices, first {}; their EFAs keep their device health until a read succeeds",
      files, *first);
}

std::vector<EfaHolder> EfaCounterMonitor::ResolveDra(std::vector<EfaHolder> holders,
                                                     EfaCounterSnapshot& snapshot,
                                                     bool look_up_claims, bool& waiting) {
  std::map<std::string, std::string> efa_by_name;  // DRANET's device name -> ibdev
  for (const auto& efa : snapshot.efas) {
    efa_by_name.emplace(DraDeviceName(efa.device.pci), efa.device.ibdev);
  }
  std::set<std::string> deviceless;
  std::map<std::string, std::vector<DraDevice>> known;
  LookupBudget budget{look_up_claims ? kClaimLookupsPerRead : 0,
                      std::chrono::steady_clock::now() + options_.claim_lookup_time};
  std::vector<EfaHolder> out;
  for (EfaHolder& h : holders) {
    std::vector<DraDevice> devices;
    for (DraDevice& d : h.dra_devices) {
      if (!d.device.empty()) {
        devices.push_back(std::move(d));
        continue;
      }
      if (const auto* found = ClaimDevices(d, h, budget, known)) {
        for (DraDevice device : *found) {
          device.claim_name = d.claim_name;
          device.claim_namespace = d.claim_namespace;
          devices.push_back(std::move(device));
        }
        continue;
      }
      waiting |= options_.claim_devices && !look_up_claims;
      const std::string claim = d.claim_namespace + "/" + d.claim_name;
      deviceless.insert(claim);
      if (deviceless_claims_.count(claim)) continue;
      spdlog::info(
          "pod {}/{} container {} uses ResourceClaim {}, which the kubelet lists without "
          "devices (its driver named none when it prepared the claim): its traffic cannot be "
          "told apart from the node's{}",
          h.pod_namespace, h.pod, h.container, claim,
          options_.claim_devices ? " until a lookup of the claim succeeds"
                                 : " (claimLookup finds its devices)");
    }
    std::vector<DraDevice> efas;
    for (DraDevice& d : devices) {
      auto efa = efa_by_name.find(d.device);
      if (efa == efa_by_name.end()) continue;  // not an EFA of this node
      if (std::find(h.efas.begin(), h.efas.end(), efa->second) == h.efas.end()) {
        h.efas.push_back(efa->second);
      }
      h.dra[efa->second] = d;
      efas.push_back(std::move(d));
    }
    h.dra_devices = std::move(efas);
    if (!h.efas.empty()) out.push_back(std::move(h));
  }
  deviceless_claims_ = std::move(deviceless);
  claim_devices_ = std::move(known);
  if (options_.claim_devices) {
    snapshot.claim_lookups = claim_lookups_;
    snapshot.claim_lookup_errors = claim_lookup_errors_;
  }
  return out;
}

const std::vector<DraDevice>* EfaCounterMonitor::ClaimDevices(
    const DraDevice& listed, const EfaHolder& holder, LookupBudget& budget,
    std::map<std::string, std::vector<DraDevice>>& known) {
  if (!options_.claim_devices) return nullptr;
  const std::string claim = listed.claim_namespace + "/" + listed.claim_name;
  const std::string key = absl::StrCat(claim, " for pod ", holder.pod);
  if (auto it = known.find(key); it != known.end()) return &it->second;
  // A claim in use keeps its allocation: once known, it is not asked again
  // while listed for the pod.
  if (auto it = claim_devices_.find(key); it != claim_devices_.end()) {
    return &(known[key] = it->second);
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      budget.deadline - std::chrono::steady_clock::now());
  if (budget.lookups == 0 || left <= std::chrono::milliseconds(0)) return nullptr;
  --budget.lookups;
  ++claim_lookups_;
  absl::StatusOr<std::vector<DraDevice>> devices =
      options_.claim_devices(listed.claim_namespace, listed.claim_name, left);
  if (!devices.ok()) {
    ++claim_lookup_errors_;
    budget.lookups = 0;
    // Once per kind of failure (the message names the claim).
    const std::string kind(absl::StatusCodeToString(devices.status().code()));
    if (kind != claim_lookup_error_) {
      claim_lookup_error_ = kind;
      spdlog::warn(
          "claim lookup: {}; containers of claims listed without devices get no per-container "
          "series until a lookup succeeds (tried again at the next read; counted in "
          "efa_device_plugin_claim_lookup_errors_total)",
          std::string(devices.status().message()));
    }
    return nullptr;
  }
  if (!claim_lookup_error_.empty()) {
    spdlog::info("claim lookup: ResourceClaim {} looked up (the lookups failed before: {})", claim,
                 claim_lookup_error_);
    claim_lookup_error_.clear();
  }
  return &(known[key] = *std::move(devices));
}

absl::StatusOr<std::vector<DraDevice>> ClaimAllocation(std::string_view json) {
  const nlohmann::json claim = nlohmann::json::parse(json, nullptr, false);
  // (Compared, not taken with value(): a "kind" that is no string throws.)
  if (!claim.is_object() || !claim.contains("kind") || claim["kind"] != "ResourceClaim") {
    return absl::InvalidArgumentError("the answer is not a ResourceClaim object");
  }
  const nlohmann::json* results = &claim;
  for (const char* key : {"status", "allocation", "devices", "results"}) {
    if (!results->is_object() || !results->contains(key)) {
      return absl::FailedPreconditionError(
          absl::StrCat("the ResourceClaim has no status.allocation.devices.results (not "
                       "allocated?): no ",
                       key));
    }
    results = &(*results)[key];
  }
  if (!results->is_array()) {
    return absl::InvalidArgumentError("status.allocation.devices.results is not a list");
  }
  std::vector<DraDevice> out;
  for (const nlohmann::json& r : *results) {
    auto field = [&](const char* key) {
      return r.is_object() && r.contains(key) && r[key].is_string() ? r[key].get<std::string>()
                                                                    : std::string();
    };
    DraDevice d{"", "", field("driver"), field("pool"), field("device")};
    if (d.driver.empty() || d.device.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("status.allocation.devices.results[",
                                                     out.size(), "] lacks its driver or device"));
    }
    out.push_back(std::move(d));
  }
  return out;
}

ClaimDevicesFn EfaCounterMonitor::ApiServerClaims(ApiServerSettings settings) {
  auto api = std::make_shared<const ApiServer>(std::move(settings));
  return [api](const std::string& claim_namespace, const std::string& claim_name,
               std::chrono::milliseconds timeout) -> absl::StatusOr<std::vector<DraDevice>> {
    // The kubelet's names are DNS labels and subdomains; anything else is
    // not put in a URL.
    for (const std::string* name : {&claim_namespace, &claim_name}) {
      if (name->empty() ||
          name->find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-.") != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat(
            "ResourceClaim ", claim_namespace, "/", claim_name, ": not a Kubernetes object name"));
      }
    }
    absl::StatusOr<std::string> body =
        api->Get(absl::StrCat("/apis/resource.k8s.io/v1/namespaces/", claim_namespace,
                              "/resourceclaims/", claim_name),
                 timeout);
    if (!body.ok()) return body.status();
    absl::StatusOr<std::vector<DraDevice>> devices = ClaimAllocation(*body);
    if (!devices.ok()) {
      return absl::Status(devices.status().code(),
                          absl::StrCat("ResourceClaim ", claim_namespace, "/", claim_name, ": ",
                                       devices.status().message()));
    }
    return devices;
  };
}

std::vector<EfaCounterSnapshot::Container> EfaCounterMonitor::JudgeIdle(
    const std::vector<EfaHolder>& holders, Clock::time_point now) {
  std::vector<EfaCounterSnapshot::Container> out;
  std::map<std::string, HolderState> state;
  for (const EfaHolder& holder : holders) {
    auto old = holder_state_.find(holder.Name());
    HolderState& s = state[holder.Name()] =
        old != holder_state_.end() ? old->second : HolderState{};
    std::map<std::string, Clock::time_point> since;
    EfaCounterSnapshot::Container& c = out.emplace_back();
    c.holder = holder;
    std::set<std::string> idle;
    for (const std::string& efa : holder.efas) {
      auto held = s.since.find(efa);
      const Clock::time_point from = since[efa] = held != s.since.end() ? held->second : now;
      auto e = efa_state_.find(efa);
      // Judged only when the EFA is present and its bytes are known.
      if (e == efa_state_.end() || !e->second.bytes) continue;
      if (now - std::max(from, e->second.moved) >= options_.idle_timeout) {
        idle.insert(efa);
        c.idle.push_back(efa);
      }
    }
    s.since = std::move(since);
    std::vector<std::string> gained, lost;
    std::set_difference(idle.begin(), idle.end(), s.idle.begin(), s.idle.end(),
                        std::back_inserter(gained));
    std::set_difference(s.idle.begin(), s.idle.end(), idle.begin(), idle.end(),
                        std::back_inserter(lost));
    if (!gained.empty()) {
      spdlog::warn(
          "allocated EFAs idle: possible TCP fallback: pod {}/{} container {}: EFAs {} ({} of its "
          "{}) moved no bytes for {}",
          holder.pod_namespace, holder.pod, holder.container, absl::StrJoin(c.idle, ","),
          c.idle.size(), holder.efas.size(), FormatDuration(options_.idle_timeout));
    } else if (!lost.empty()) {
      spdlog::info(
          "allocated EFAs moving bytes again: pod {}/{} container {}: EFAs {}{}",
          holder.pod_namespace, holder.pod, holder.container, absl::StrJoin(lost, ","),
          c.idle.empty() ? "" : absl::StrCat(" (still idle: ", absl::StrJoin(c.idle, ","), ")"));
    }
    s.idle = std::move(idle);
  }
  holder_state_ = std::move(state);
  return out;
}

EfaHoldersFn EfaCounterMonitor::PodResourcesHolders(
    const std::filesystem::path& socket,
    std::function<std::optional<std::vector<std::string>>(const std::vector<std::string>&)>
        physical) {
  auto client = std::make_shared<PodResourcesClient>(socket, PodResourcesClient::Options{});
  return [client, physical = std::move(physical)]() -> absl::StatusOr<std::vector<EfaHolder>> {
    auto list = client->List();
    if (!list.ok()) return list.status();
    std::vector<EfaHolder> out;
    std::map<std::string, size_t> index;  // Name() -> position in `out`
    const AcceleratorResources none{{}, {}, {}, 0};
    for (const ContainerDevices& c : ContainersWithDevices(*list, none)) {
      std::optional<std::vector<std::string>> efas = physical(c.efas);
      if (!efas || efas->empty()) continue;
      out.push_back({c.pod_namespace, c.pod_name, c.container, *std::move(efas)});
      index.emplace(out.back().Name(), out.size() - 1);
    }
    // During a move a container may hold EFAs both ways.
    for (EfaHolder& h : DraHolders(*list)) {
      auto it = index.find(h.Name());
      if (it != index.end()) {
        out[it->second].dra_devices = std::move(h.dra_devices);
      } else {
        out.push_back(std::move(h));
      }
    }
    return out;
  };
}

}  // namespace efa::plugin
