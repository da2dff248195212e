#include "plugin/alignment/late_binder.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <system_error>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "plugin/alignment/cdi_spec.h"
#include "plugin/kubelet/kubelet_checkpoint.h"
#include "spdlog/spdlog.h"
#include "topology/allocation_policy.h"
#include "topology/nvidia_gpus.h"
#include "topology/replica_id.h"
#include "topology/sysfs.h"

namespace efa::plugin {
namespace fs = std::filesystem;
namespace {

constexpr mode_t kSpecMode = 0644;  // the runtime reads it; only we write it
// Our specs are a few hundred bytes; a larger file is not ours.
constexpr size_t kMaxCdiSpecBytes = size_t{64} * 1024;

std::vector<std::string> Sorted(std::vector<std::string> ids) {
  std::sort(ids.begin(), ids.end());
  return ids;
}

// "claim-.. (kubelet devices \"a\", \"b\")": how messages name a claim.
std::string DescribeClaim(const std::string& claim, const std::vector<std::string>& ids) {
  std::vector<std::string> quoted;
  for (const std::string& id : ids) {
    quoted.push_back(absl::StrCat("\"", absl::CHexEscape(id.substr(0, 64)), "\""));
  }
  return absl::StrCat(claim, " (kubelet devices ", absl::StrJoin(quoted, ", "), ")");
}

// The container of pod-resources' `list` that holds exactly the EFA
// device IDs `kubelet_ids` of `resource`, if any.
std::optional<ContainerDevices> FindByDevices(const v1::ListPodResourcesResponse& list,
                                              const AcceleratorResources& resources,
                                              const std::vector<std::string>& kubelet_ids,
                                              const std::string& resource) {
  const std::vector<std::string> wanted = Sorted(kubelet_ids);
  for (ContainerDevices& c : ContainersWithDevices(list, resources)) {
    if (c.efa_resource == resource && Sorted(c.efas) == wanted) return std::move(c);
  }
  return std::nullopt;
}

// The EFAs of `table` a claim may be given: healthy, with room for one
// more claim (`taken`: EFA -> claims bound to it), or held by none when the
// claim is not `shared`; with sharing, how many claims each holds already.
topology::AllocationRequest FreeEfas(const topology::DeviceTable& table,
                                     const std::map<std::string, int>& taken, bool shared) {
  topology::AllocationRequest request;
  for (const topology::EfaDevice& d : table.devices) {
    auto uses = taken.find(d.ibdev);
    const int used = uses == taken.end() ? 0 : uses->second;
    if (!d.healthy() || used >= (shared ? table.replicas : 1)) continue;
    request.available.push_back(d.ibdev);
    if (used > 0) request.shared[d.ibdev] = used;
  }
  return request;
}

// How many containers may share the EFAs a container holds by `ids`:
// `recorded` (its Allocate answer's kEnvSharingReplicas) when known, else
// the fewest replicas the IDs can have been given under (a replica ID's
// index + 1, a plain ID's 1).
int AdmittedReplicas(const std::vector<std::string>& ids, int recorded) {
  if (recorded > 0) return recorded;
  int fewest = 1;
  for (const std::string& id : ids) {
    if (const auto replica = topology::ParseReplicaId(id)) {
      fewest = std::max(fewest, replica->replica + 1);
    }
  }
  return fewest;
}

// Whether a binding holds some of the claim's IDs, of the same resource
// when both are known (the other name may advertise the same strings).
bool HoldsIdsOf(const std::vector<std::string>& held, const std::string& resource,
                const std::vector<std::string>& ids, const std::string& ids_resource) {
  if (!ids_resource.empty() && !resource.empty() && resource != ids_resource) return false;
  return std::any_of(held.begin(), held.end(), [&](const std::string& id) {
    return std::find(ids.begin(), ids.end(), id) != ids.end();
  });
}

// The EFAs device IDs name.
std::set<std::string> NamedEfas(const std::vector<std::string>& ids) {
  std::set<std::string> named;
  for (const std::string& id : ids) {
    const auto replica = topology::ParseReplicaId(id);
    named.insert(replica ? replica->ibdev : id);
  }
  return named;
}

// Whether the kubelet is to be asked to rewrite its checkpoint: `stale`
// (containers it holds that pod-resources List lacks) is not empty and not
// the set `remembered` had (set to it): once per such set.
bool NewlyStale(std::set<std::string> stale, std::set<std::string>& remembered) {
  const bool newly = !stale.empty() && stale != remembered;
  remembered = std::move(stale);
  return newly;
}

enum class Offer { kNamed, kHeld, kAll, kWait };

// Narrows `available` for a claim bound before its container starts
// (LateBinder::BindUnstarted): to the EFAs its IDs name when all are
// available (kNamed); else nothing (`named_only`: kWait), or, given
// `kubelet_held` (EFA -> its IDs the kubelet holds), the named and those
// whose `replicas` IDs the kubelet all holds (kHeld); else all (kAll).
// The EFAs its IDs name count only when the kubelet holds them
// (`named_held`: late binding, or they are the IDs the kubelet is told of
// now); else it gives those EFAs' IDs of now to others meanwhile.
Offer OfferUnstarted(const std::vector<std::string>& kubelet_ids, bool named_only,
                     const std::map<std::string, int>* kubelet_held, bool named_held, int replicas,
                     std::vector<std::string>& available) {
  const std::set<std::string> named = named_held ? NamedEfas(kubelet_ids) : std::set<std::string>{};
  if (!named.empty() && std::all_of(named.begin(), named.end(), [&](const std::string& efa) {
        return std::find(available.begin(), available.end(), efa) != available.end();
      })) {
    available.assign(named.begin(), named.end());
    return Offer::kNamed;
  }
  if (named_only) return Offer::kWait;
  if (kubelet_held == nullptr) return Offer::kAll;
  std::erase_if(available, [&](const std::string& efa) {
    const auto held = kubelet_held->find(efa);
    return !named.count(efa) && (held == kubelet_held->end() || held->second < replicas);
  });
  return Offer::kHeld;
}

}  // namespace

LateBinder::LateBinder(LateBinderOptions options)
    : options_(std::move(options)),
      pod_resources_(options_.kubelet_dir / "pod-resources/kubelet.sock", options_.pod_resources),
      checkpoint_(options_.kubelet_dir / "device-plugins" / kCheckpointFile),
      gpus_(options_.proc_root) {}

fs::path LateBinder::SpecPath(const std::string& claim) const {
  return options_.cdi_dir / CdiSpecFileName(claim);
}

absl::Status LateBinder::RecoverSpec(const fs::path& path, std::map<std::string, Binding>& out) {
  const std::string claim = ClaimOfSpecFile(path.filename().string());
  absl::StatusOr<std::string> text = topology::ReadFileBounded(path, kMaxCdiSpecBytes);
  if (absl::IsNotFound(text.status())) return absl::OkStatus();  // released meanwhile
  if (!text.ok() && topology::ErrnoOf(text.status()) != 0) return text.status();
  const fs::path record_path = options_.cdi_dir / ClaimRecordFileName(claim);
  absl::StatusOr<std::string> record_text =
      topology::ReadFileBounded(record_path, kMaxCdiSpecBytes);
  std::optional<ClaimRecord> record;
  if (record_text.ok()) {
    absl::StatusOr<ClaimRecord> parsed =
        ParseClaimRecord(*record_text, claim, record_path.string());
    if (parsed.ok()) {
      record = *std::move(parsed);
    } else {
      spdlog::warn("late binding: {}; taking the owner of {} from the kubelet checkpoint",
                   std::string(parsed.status().message()), claim);
    }
  } else if (!absl::IsNotFound(record_text.status())) {
    return record_text.status();
  }
  absl::StatusOr<std::vector<std::string>> efas =
      text.ok() ? ParseCdiSpec(*text, claim, path.string())
                : absl::StatusOr<std::vector<std::string>>(text.status());
  const bool newer = record && record->version > kClaimRecordVersion;
  if (!efas.ok() && newer) {
    // A later release's spec: its record says which EFAs it holds.
    efas = record->efas;
  } else if (!efas.ok()) {
    std::error_code remove_ec;
    fs::remove(path, remove_ec);
    fs::remove(record_path, remove_ec);
    spdlog::error(
        "late binding: cannot recover a binding from {}; {}: its EFAs are unknown and its "
        "container gets new ones at its next start",
        std::string(efas.status().message()),
        remove_ec ? "could not remove it either (" + remove_ec.message() + ")" : "removed it");
    return absl::OkStatus();
  }
  Binding b;
  b.efas = Sorted(*efas);
  if (text.ok()) b.spec = *std::move(text);
  if (record && !newer) {
    b.owner = record->owner;
    b.kubelet_ids = record->kubelet_ids;
    b.resource = record->resource;
    b.replicas = record->replicas;
  }
  out[claim] = std::move(b);
  return absl::OkStatus();
}

absl::Status LateBinder::Recover() {
  std::error_code ec;
  std::vector<fs::path> specs;
  std::set<std::string> records;  // claims with a record
  for (fs::directory_iterator it(options_.cdi_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (absl::StartsWith(name, std::string(".") + kCdiSpecPrefix) && absl::EndsWith(name, ".tmp")) {
      // A write that a crash interrupted: never renamed, so never bound.
      std::error_code remove_ec;
      fs::remove(it->path(), remove_ec);
      continue;
    }
    if (!ClaimOfSpecFile(name).empty()) specs.push_back(it->path());
    if (absl::StartsWith(name, kCdiSpecPrefix) && absl::EndsWith(name, kClaimRecordSuffix)) {
      records.insert(
          name.substr(std::strlen(kCdiSpecPrefix),
                      name.size() - std::strlen(kCdiSpecPrefix) - std::strlen(kClaimRecordSuffix)));
    }
  }
  absl::Status status;
  // No directory there holds no spec either.
  if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory) {
    status = absl::UnavailableError(
        absl::StrCat("cannot list ", options_.cdi_dir.string(), ": ", ec.message()));
  }
  std::sort(specs.begin(), specs.end());
  std::map<std::string, Binding> recovered;
  for (const fs::path& path : specs) {
    records.erase(ClaimOfSpecFile(path.filename().string()));
    if (absl::Status read = RecoverSpec(path, recovered); !read.ok() && status.ok()) {
      status = read;
    }
  }
  if (status.ok()) {
    for (const std::string& claim : records) {  // its spec was released
      std::error_code remove_ec;
      fs::remove(options_.cdi_dir / ClaimRecordFileName(claim), remove_ec);
    }
  }
  std::map<std::string, std::vector<std::string>> owners_of;  // EFA -> claims
  for (const auto& [claim, binding] : recovered) {
    for (const std::string& efa : binding.efas) {
      std::vector<std::string>& owners = owners_of[efa];
      owners.push_back(claim);
      // With sharing, up to `replicas` claims bind one EFA.
      if (static_cast<int>(owners.size()) > options_.replicas) {
        spdlog::error(
            "late binding: EFA {} is bound {} times, by {} and by {} ({} and {}): more "
            "containers than its {} replica(s) may share it; each is bound afresh at its next "
            "start",
            efa, owners.size(), owners.front(), claim, SpecPath(owners.front()).string(),
            SpecPath(claim).string(), options_.replicas);
      }
    }
  }
  absl::MutexLock lock(&mu_);
  for (auto& [claim, binding] : recovered) {
    if (bindings_.count(claim)) continue;  // recovered at an earlier pass
    spdlog::info("late binding: recovered {} (EFAs {}{}) from {}", claim,
                 absl::StrJoin(binding.efas, ","),
                 binding.owner.empty() ? "" : ", pod " + binding.owner, SpecPath(claim).string());
    ++counts_.recovered;
    bindings_[claim] = std::move(binding);
  }
  const std::string problem(status.message());
  if (problem != recover_problem_) {
    if (problem.empty()) {
      spdlog::info("late binding: the CDI dir {} is read whole again", options_.cdi_dir.string());
    } else {
      spdlog::error(
          "late binding: {}: the bindings there are not all known; registering with the "
          "kubelet only once they are (retried at each periodic pass)",
          problem);
    }
    recover_problem_ = problem;
  }
  if (!status.ok()) ++counts_.recover_incomplete;
  recovered_ = recovered_ || status.ok();
  return status;
}

int LateBinder::BoundUnderOtherName() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(std::count_if(bindings_.begin(), bindings_.end(), [&](const auto& b) {
    return !b.second.resource.empty() && b.second.resource != options_.resource_name;
  }));
}

uint64_t LateBinder::Generation() {
  absl::MutexLock lock(&mu_);
  return generation_;
}

bool LateBinder::recovered() const {
  absl::MutexLock lock(&mu_);
  return recovered_;
}

namespace {

// The claim names of a container's EFAs: its claim's, and for the shared
// resource name also the one daemons before ClaimName took the resource
// into account named it (their bindings are that container's too).
void AddClaimNames(const ContainerDevices& c, std::set<std::string>& names) {
  names.insert(ClaimName(c.efas, c.efa_resource));
  if (c.efa_resource != kResourceName) names.insert(ClaimName(c.efas));
}

}  // namespace

std::set<std::string> LateBinder::Checkpointed::ClaimNames() const {
  std::set<std::string> names;
  for (const auto& [claim, c] : claims) AddClaimNames(c, names);
  for (const ContainerDevices& c : other_name) AddClaimNames(c, names);
  return names;
}

LateBinder::Checkpointed LateBinder::ReadCheckpointed() const {
  Checkpointed out;
  const auto read = checkpoint_.Get();
  if (!read->ok()) {
    out.problem = std::string(read->status().message());
    out.missing = absl::IsNotFound(read->status());
    return out;
  }
  const KubeletCheckpoint* checkpoint = &**read;
  for (size_t i = 0; i < checkpoint->skipped_entry_resources.size(); ++i) {
    const std::string& resource = checkpoint->skipped_entry_resources[i];
    if (resource.empty() || IsEfaResource(resource)) {
      out.problem = checkpoint->skipped[i];
      break;
    }
  }
  for (ContainerDevices& c : CheckpointedContainers(*checkpoint, options_.resources)) {
    if (c.efas.empty()) continue;
    // A stale entry of a deleted pod never shares its IDs with a live one
    // of the same resource (the kubelet frees them first); a pod's
    // containers may (devicesToReuse).
    auto [it, added] = out.claims.try_emplace(ClaimName(c.efas, c.efa_resource), c);
    if (added) continue;
    if (it->second.efa_resource == c.efa_resource) {
      if (it->second.pod_uid != c.pod_uid) continue;
      it->second.accelerators.insert(it->second.accelerators.end(), c.accelerators.begin(),
                                     c.accelerators.end());
      it->second.efas_by_id = it->second.efas_by_id || c.efas_by_id;
      continue;
    }
    // The same ID strings under the other EFA resource name (sharing's
    // rename; the kubelet counts each name's IDs apart): another container.
    // The claim is the served name's, the one PreStartContainer and
    // BindUnstarted act on; the other container holds its EFAs all the same.
    if (c.efa_resource == options_.resource_name) std::swap(it->second, c);
    out.other_name.push_back(std::move(c));
  }
  return out;
}

bool LateBinder::TakenOverById(const Checkpointed& checkpointed, const std::string& claim,
                               const Binding& binding) {
  // Of a binding's resource, or of any EFA resource while that is unknown.
  auto its = [&](const ContainerDevices& c) {
    return binding.resource.empty() || c.efa_resource == binding.resource;
  };
  // Its claim's IDs, held only by containers answered by ID.
  bool by_id = false, late = false;
  auto look = [&](const ContainerDevices& c) {
    if (!its(c) || ClaimName(c.efas, c.efa_resource) != claim) return;
    (c.efas_by_id ? by_id : late) = true;
  };
  // Or one of its IDs held by ID by another pod's container: the kubelet
  // gives an ID to one live pod at a time (as ReleaseTakenOver).
  const bool owner_known = !binding.owner.empty() && !absl::StartsWith(binding.owner, "pod ");
  bool other_pod = false;
  auto another = [&](const ContainerDevices& c) {
    other_pod =
        other_pod || (owner_known && c.efas_by_id && c.pod_uid != binding.owner &&
                      HoldsIdsOf(binding.kubelet_ids, binding.resource, c.efas, c.efa_resource));
  };
  for (const auto& [name, c] : checkpointed.claims) {
    look(c);
    another(c);
  }
  for (const ContainerDevices& c : checkpointed.other_name) {
    look(c);
    another(c);
  }
  return (by_id && !late) || other_pod;
}

void LateBinder::Adopt(const Checkpointed& checkpointed) {
  // Every read under the lock comes here: the holders by ID of a whole one
  // stand for a read that is not (Taken).
  if (checkpointed.problem.empty()) {
    held_by_id_.emplace();
    for (const auto& [name, c] : checkpointed.claims) {
      if (c.efas_by_id) held_by_id_->push_back(c);
    }
    for (const ContainerDevices& c : checkpointed.other_name) {
      if (c.efas_by_id) held_by_id_->push_back(c);
    }
  }
  for (auto next = bindings_.begin(); next != bindings_.end();) {
    const auto current = next++;  // Release erases it
    // A late-bound container's Allocate answer names no device nodes: a
    // container given the claim's IDs by ID is another one, admitted after
    // the kubelet freed them (a pod deleted, the next admitted under best
    // effort): the binding's container is gone.
    if (TakenOverById(checkpointed, current->first, current->second)) {
      Release(current, "the kubelet gave its devices to a container it answered by ID");
      continue;
    }
    auto& [claim, binding] = *current;
    // Unknown, or named by pod-resources before the checkpoint had it.
    if (!binding.owner.empty() && !absl::StartsWith(binding.owner, "pod ")) continue;
    auto it = checkpointed.claims.find(claim);
    if (it == checkpointed.claims.end()) continue;
    const ContainerDevices& c = it->second;
    // Recovered without a record (written before records were), which has
    // no kubelet IDs: its container is this one only if no other pod's
    // binding holds one of its EFAs where either may not share; else it is
    // a gone container's spec, left behind (a read-only CDI dir), whose IDs
    // the kubelet gave anew. One PreStartContainer bound while the
    // checkpoint could not name its container has its IDs: it is adopted.
    const bool recorded = !binding.kubelet_ids.empty();
    if (!recorded && binding.owner.empty() &&
        ExclusivelyBoundElsewhere(claim, binding.efas, AdmittedReplicas(c.efas, 0), c.pod_uid)) {
      Release(current, "recovered without its record; its EFAs are another pod's binding's");
      continue;
    }
    binding.owner = c.pod_uid;
    binding.resource = c.efa_resource;
    if (!recorded) {
      binding.kubelet_ids = c.efas;
      binding.replicas = AdmittedReplicas(c.efas, 0);
    }
    spdlog::info("late binding: {} (EFAs {}) belongs to pod {} (from the kubelet checkpoint)",
                 claim, absl::StrJoin(binding.efas, ","), binding.owner);
    // A later release's spec is left as it wrote it.
    if (binding.spec.empty()) continue;
    if (absl::Status written = WriteSpec(claim, claim, binding); !written.ok()) {
      spdlog::warn("late binding: {}", std::string(written.message()));
    }
  }
}

bool LateBinder::ExclusivelyBoundElsewhere(const std::string& claim,
                                           const std::vector<std::string>& efas, int replicas,
                                           const std::string& pod) const {
  for (const auto& [name, other] : bindings_) {
    if (name == claim || other.owner.empty() || other.owner == pod) continue;
    if (replicas > 1 && other.replicas > 1) continue;  // both shared
    for (const std::string& efa : efas) {
      if (std::find(other.efas.begin(), other.efas.end(), efa) != other.efas.end()) return true;
    }
  }
  return false;
}

std::map<std::string, int> LateBinder::Taken(const Checkpointed& checkpointed,
                                             const std::set<std::string>& except,
                                             int replicas) const {
  // EFA -> its holders, and the fewest replicas one of them was given it
  // under: no more may share it while that one lives.
  std::map<std::string, std::pair<int, int>> held;
  auto hold = [&](const std::set<std::string>& efas, int admitted) {
    for (const std::string& efa : efas) {
      auto [it, added] = held.try_emplace(efa, 0, admitted);
      ++it->second.first;
      it->second.second = std::min(it->second.second, admitted);
    }
  };
  for (const auto& [claim, binding] : bindings_) {
    if (!except.count(claim)) hold({binding.efas.begin(), binding.efas.end()}, binding.replicas);
  }
  // A container holds each EFA its IDs name once, however many of its
  // replicas it was given: sharing counts the containers on an EFA.
  for (const auto& [claim, c] : checkpointed.claims) {
    if (c.efas_by_id && !except.count(claim))
      hold(NamedEfas(c.efas), AdmittedReplicas(c.efas, c.replicas));
  }
  for (const ContainerDevices& c : checkpointed.other_name) {
    if (c.efas_by_id) hold(NamedEfas(c.efas), AdmittedReplicas(c.efas, c.replicas));
  }
  if (!checkpointed.problem.empty() && held_by_id_) {
    const std::set<std::string> read = checkpointed.ClaimNames();
    for (const ContainerDevices& c : *held_by_id_) {
      if (!read.count(ClaimName(c.efas, c.efa_resource)))
        hold(NamedEfas(c.efas), AdmittedReplicas(c.efas, c.replicas));
    }
  }
  std::map<std::string, int> taken;
  for (const auto& [efa, holders] : held) {
    taken[efa] = holders.first + replicas - std::min(replicas, holders.second);
  }
  return taken;
}

bool LateBinder::AdvertisedId(const std::string& id) const {
  const auto replica = topology::ParseReplicaId(id);
  return options_.replicas > 1 ? replica && replica->replica < options_.replicas : !replica;
}

bool LateBinder::AdvertisedNow(const std::string& resource, const std::vector<std::string>& ids,
                               int replicas) const {
  if (resource != options_.resource_name || replicas < options_.replicas) return false;
  return std::all_of(ids.begin(), ids.end(),
                     [&](const std::string& id) { return AdvertisedId(id); });
}

std::map<std::string, std::string> LateBinder::Reserved() {
  std::map<std::string, std::string> reserved;
  if (options_.late_binding) return reserved;
  const Checkpointed checkpointed = ReadCheckpointed();
  std::set<std::string> held_by_id;  // their claims
  std::vector<std::pair<std::string, const ContainerDevices*>> holders;
  for (const auto& [claim, c] : checkpointed.claims) holders.emplace_back(claim, &c);
  for (const ContainerDevices& c : checkpointed.other_name) {
    holders.emplace_back(ClaimName(c.efas, c.efa_resource), &c);
  }
  for (const auto& [claim, holder] : holders) {
    const ContainerDevices& c = *holder;
    if (!c.efas_by_id ||
        AdvertisedNow(c.efa_resource, c.efas, AdmittedReplicas(c.efas, c.replicas))) {
      continue;
    }
    held_by_id.insert(claim);
    for (const std::string& id : c.efas) {
      const auto replica = topology::ParseReplicaId(id);
      reserved[replica ? replica->ibdev : id] =
          absl::StrCat("held by pod ", c.pod_uid, " as ", c.efa_resource, " device ", id,
                       " (an earlier configuration) until its containers end");
    }
  }
  // A deleted pod's entries stay in the checkpoint until the kubelet writes
  // it again, and with every EFA reserved no admission comes to make it:
  // when List lacks containers held so, the kubelet is asked to rewrite it
  // (List itself made it forget the pods gone), as for bindings.
  bool refresh = false;
  if (!held_by_id.empty()) {
    const auto list = pod_resources_.List();
    if (list.ok()) {
      std::set<std::string> stale;
      const std::set<std::string> listed = ListedClaims(*list);
      std::set_difference(held_by_id.begin(), held_by_id.end(), listed.begin(), listed.end(),
                          std::inserter(stale, stale.end()));
      absl::MutexLock lock(&mu_);
      refresh = NewlyStale(std::move(stale), reserved_stale_);
    }
  }
  if (refresh && options_.refresh_checkpoint) options_.refresh_checkpoint();
  absl::MutexLock lock(&mu_);
  // A checkpoint that could not be read whole says nothing of the holders it
  // did not show: those of the latest whole read stay reserved.
  if (checkpointed.problem.empty()) {
    reserved_by_id_ = reserved;
  } else {
    reserved.insert(reserved_by_id_.begin(), reserved_by_id_.end());
  }
  Adopt(checkpointed);
  for (const auto& [claim, binding] : bindings_) {
    // Bound to EFAs its own IDs name, as advertised now: the kubelet gives
    // those IDs to no other container while it lives, and withholding the
    // others of a shared EFA would take them from a pod it may be
    // admitting (BindUnstarted binds such claims first).
    const std::set<std::string> named = NamedEfas(binding.kubelet_ids);
    if (AdvertisedNow(binding.resource, binding.kubelet_ids, binding.replicas) &&
        std::all_of(binding.efas.begin(), binding.efas.end(),
                    [&](const std::string& efa) { return named.count(efa) > 0; })) {
      continue;
    }
    for (const std::string& efa : binding.efas) {
      reserved[efa] = absl::StrCat("bound by late binding to ", claim,
                                   binding.owner.empty() ? "" : " of pod " + binding.owner,
                                   " (an earlier configuration) until its containers end");
    }
  }
  return reserved;
}

std::optional<std::set<std::string>> LateBinder::LiveClaims(
    const absl::StatusOr<v1::ListPodResourcesResponse>& list, const Checkpointed& checkpointed) {
  {
    absl::MutexLock lock(&mu_);
    if (checkpointed.problem != undecided_) {
      if (checkpointed.problem.empty()) {
        spdlog::info(
            "late binding: the kubelet checkpoint is readable again; releasing the "
            "bindings of gone containers");
      } else {
        spdlog::warn(
            "late binding: releasing nothing while the kubelet checkpoint cannot say which "
            "containers hold EFAs: {}",
            checkpointed.problem);
      }
      undecided_ = checkpointed.problem;
    }
    if (!checkpointed.problem.empty()) {
      ++counts_.undecided;
      return std::nullopt;
    }
  }
  std::set<std::string> claims = checkpointed.ClaimNames();
  if (list.ok()) claims.merge(ListedClaims(*list));
  return claims;
}

std::set<std::string> LateBinder::ListedClaims(const v1::ListPodResourcesResponse& list) const {
  std::set<std::string> claims;
  for (const ContainerDevices& c : ContainersWithDevices(list, options_.resources)) {
    if (!c.efas.empty()) AddClaimNames(c, claims);
  }
  return claims;
}

absl::StatusOr<std::map<std::string, int>> LateBinder::KubeletHeld(
    const Checkpointed& checkpointed) {
  const auto list = pod_resources_.List();
  if (!list.ok()) return list.status();
  std::map<std::string, std::set<std::string>> ids;  // EFA -> its IDs held
  for (const ContainerDevices& c : ContainersWithDevices(*list, options_.resources)) {
    // Only containers the checkpoint as read has: List may be newer, and a
    // container admitted since may hold its EFAs by ID, which Taken cannot
    // count yet.
    if (c.efa_resource != options_.resource_name ||
        !checkpointed.claims.count(ClaimName(c.efas, c.efa_resource))) {
      continue;
    }
    for (const std::string& id : c.efas) {
      // An ID of an earlier replica count is none the kubelet advertises
      // now: it gives the EFA's IDs of now to others meanwhile.
      if (!AdvertisedId(id)) continue;
      const auto replica = topology::ParseReplicaId(id);
      ids[replica ? replica->ibdev : id].insert(id);
    }
  }
  std::map<std::string, int> held;
  for (const auto& [efa, its] : ids) held[efa] = static_cast<int>(its.size());
  return held;
}

void LateBinder::Release(std::map<std::string, Binding>::iterator it, std::string_view why) {
  const fs::path path = SpecPath(it->first);
  std::error_code ec, record_ec;
  fs::remove(options_.cdi_dir / ClaimRecordFileName(it->first), record_ec);
  fs::remove(path, ec);
  if (ec) {
    spdlog::warn("late binding: released {} (EFAs {}) but cannot remove {}: {}", it->first,
                 absl::StrJoin(it->second.efas, ","), path.string(), ec.message());
  } else {
    spdlog::info("late binding: released {} (EFAs {}): {}", it->first,
                 absl::StrJoin(it->second.efas, ","), why);
  }
  ++counts_.released;
  released_.insert(absl::StrCat(it->first, " ", it->second.owner));
  bindings_.erase(it);
}

std::optional<std::chrono::steady_clock::time_point> LateBinder::ReleaseLocked(
    const std::set<std::string>& live, uint64_t generation) {
  const auto now = options_.clock->Now();
  std::optional<std::chrono::steady_clock::time_point> due;
  for (auto it = bindings_.begin(); it != bindings_.end();) {
    const auto current = it++;  // Release erases it
    Binding& b = current->second;
    if (b.generation > generation || live.count(current->first)) {
      b.absent_since.reset();
      continue;
    }
    if (!b.absent_since) b.absent_since = now;
    const auto release_at = *b.absent_since + options_.release_after;
    if (now < release_at) {
      due = std::min(due.value_or(release_at), release_at);
      continue;
    }
    Release(current, absl::StrCat("no container has held its devices for ",
                                  absl::FormatDuration(absl::FromChrono(now - *b.absent_since))));
  }
  return due;
}

std::optional<std::chrono::steady_clock::time_point> LateBinder::ReleaseGone() {
  uint64_t generation;
  {
    absl::MutexLock lock(&mu_);
    if (bindings_.empty()) return std::nullopt;
    generation = generation_;
  }
  const auto list = pod_resources_.List();
  const Checkpointed checkpointed = ReadCheckpointed();
  const auto live = LiveClaims(list, checkpointed);
  const std::set<std::string> listed = list.ok() ? ListedClaims(*list) : std::set<std::string>{};
  bool refresh = false;
  std::optional<std::chrono::steady_clock::time_point> due;
  {
    absl::MutexLock lock(&mu_);
    Adopt(checkpointed);
    if (live) {
      due = ReleaseLocked(*live, generation);
    } else {
      for (auto& [claim, binding] : bindings_) binding.absent_since.reset();
    }
    if (live && list.ok()) {
      // A deleted pod's entries stay in the file until the kubelet writes it
      // again; an init container's stay for its pod's life (once is enough).
      std::set<std::string> stale;
      for (const auto& [claim, binding] : bindings_) {
        if (checkpointed.claims.count(claim) && !listed.count(claim)) stale.insert(claim);
      }
      refresh = NewlyStale(std::move(stale), checkpoint_only_);
    }
    if (!bindings_.empty()) {
      const auto recheck = options_.clock->Now() + options_.recheck_every;
      due = std::min(due.value_or(recheck), recheck);
    }
  }
  if (refresh && options_.refresh_checkpoint) options_.refresh_checkpoint();
  return due;
}

absl::Status LateBinder::WriteSpec(const std::string& claim, const std::string& described,
                                   const Binding& binding) const {
  std::error_code ec;
  fs::create_directories(options_.cdi_dir, ec);  // on failure the write names the problem
  const ClaimRecord record{.owner = binding.owner,
                           .kubelet_ids = binding.kubelet_ids,
                           .resource = binding.resource,
                           .replicas = binding.replicas,
                           .efas = binding.efas};
  // The record first: a spec on disk always has what recovers it beside it.
  const fs::path record_path = options_.cdi_dir / ClaimRecordFileName(claim);
  absl::Status written =
      WriteFileAtomically(record_path, ClaimRecordJson(claim, record), kSpecMode);
  if (written.ok()) written = WriteFileAtomically(SpecPath(claim), binding.spec, kSpecMode);
  if (written.ok()) return written;
  fs::remove(record_path, ec);  // a record without its spec binds nothing
  return absl::Status(written.code(),
                      absl::StrCat("cannot write the CDI spec of ", described, " to ",
                                   SpecPath(claim).string(), ": ", written.message()));
}

void LateBinder::RefreshStaleById(const Checkpointed& checkpointed,
                                  const v1::ListPodResourcesResponse& list) {
  std::set<std::string> stale;
  const std::set<std::string> listed = ListedClaims(list);
  for (const auto& [name, c] : checkpointed.claims) {
    if (c.efas_by_id && !listed.count(name)) stale.insert(name);
  }
  bool refresh;
  {
    absl::MutexLock lock(&mu_);
    refresh = NewlyStale(std::move(stale), refused_stale_);
  }
  if (refresh && options_.refresh_checkpoint) options_.refresh_checkpoint();
}

std::optional<ContainerDevices> LateBinder::HeldByIdAtWholeRead(const std::string& claim) {
  // Not read whole now: a container that held the claim's IDs by ID at the
  // latest whole read still does (soak seed 1001, late binding, step 238:
  // a best-effort container restarted during a full descriptor table).
  absl::MutexLock lock(&mu_);
  if (!held_by_id_) return std::nullopt;
  for (const ContainerDevices& c : *held_by_id_) {
    if (c.efa_resource == options_.resource_name && ClaimName(c.efas, c.efa_resource) == claim) {
      return c;
    }
  }
  return std::nullopt;
}

absl::Status LateBinder::KeptById(const Claim& claim, const ContainerDevices& container) {
  // Admitted under an earlier configuration that gave device nodes by ID:
  // the container holds those EFAs (its Allocate answer gives them again at
  // each start), and late binding counts them as taken.
  absl::MutexLock lock(&mu_);
  ++counts_.kept;
  spdlog::info("late binding: {} of pod {} holds EFAs {} by device ID; nothing to bind",
               claim.described, claim.owner, absl::StrJoin(container.efas, ","));
  return absl::OkStatus();
}

absl::Status LateBinder::PreStart(const topology::DeviceTable& table,
                                  const std::vector<std::string>& kubelet_ids) {
  const std::string name = ClaimName(kubelet_ids, options_.resource_name);
  Claim claim;
  claim.name = name;
  claim.kubelet_ids = kubelet_ids;
  claim.described = DescribeClaim(name, kubelet_ids);
  if (kubelet_ids.empty()) {
    return Fail(absl::InvalidArgumentError("PreStartContainer names no devices"));
  }
  const uint64_t generation = Generation();
  // By PreStartContainer the kubelet has checkpointed every resource of the
  // container: its accelerators are there, by pod UID and container name.
  const Checkpointed checkpointed = ReadCheckpointed();
  std::optional<ContainerDevices> container;
  // PreStartContainer comes for the name served: a container holding the
  // same IDs under the other name (Checkpointed::other_name) is not this one.
  if (auto it = checkpointed.claims.find(claim.name);
      it != checkpointed.claims.end() && it->second.efa_resource == options_.resource_name) {
    container = it->second;
  } else if (!checkpointed.problem.empty()) {
    container = HeldByIdAtWholeRead(claim.name);
  }
  if (container) {
    claim.owner = container->pod_uid;
    claim.resource = container->efa_resource;
  }
  if (container && container->efas_by_id) return KeptById(claim, *container);
  // Never read whole: a holder by ID may be among what it lacks (but a
  // kubelet that has written no checkpoint has given no EFA by ID).
  bool unknown = false;
  {
    absl::MutexLock lock(&mu_);
    Adopt(checkpointed);
    unknown = !checkpointed.problem.empty() && !checkpointed.missing && !held_by_id_;
    // Bound by a daemon that named claims of the shared name as those of
    // vpc.amazonaws.com/efa: its container's CDI device names that spec.
    const std::string before = ClaimName(kubelet_ids);
    if (auto it = bindings_.find(before); !bindings_.count(claim.name) && it != bindings_.end() &&
                                          it->second.resource == options_.resource_name) {
      claim.name = before;
      claim.described = DescribeClaim(claim.name, kubelet_ids);
    }
  }
  if (std::optional<absl::Status> kept = KeepBinding(claim)) {
    return kept->ok() ? *kept : Fail(*kept);
  }
  if (unknown) {
    return Fail(absl::UnavailableError(absl::StrCat(
        "which containers hold EFAs by device ID is unknown, so ", claim.described,
        " waits (the kubelet checkpoint was not read whole: ", checkpointed.problem, ")")));
  }
  // Which bindings are live (to free the EFAs of gone ones), and the
  // container when the checkpoint does not have it yet: the kubelet lists
  // its devices in pod-resources as soon as they are allocated.
  const auto list = pod_resources_.List(/*rate_limited=*/false);
  const std::optional<std::set<std::string>> live = LiveClaims(list, checkpointed);
  if (!container && list.ok()) {
    container = FindByDevices(*list, options_.resources, kubelet_ids, options_.resource_name);
    if (container) {
      claim.owner = "pod " + container->Name();
      claim.resource = container->efa_resource;
    }
  }
  const Targets targets = TargetsOf(table, container, claim.described);
  absl::StatusOr<std::vector<std::string>> efas =
      Bind(table, claim, checkpointed, live, generation, targets);
  if (!efas.ok()) {
    if (absl::IsFailedPrecondition(efas.status()) && list.ok())
      RefreshStaleById(checkpointed, *list);
    return Fail(efas.status());
  }
  spdlog::info("late binding: bound {} of {} to EFAs {} ({})", claim.described,
               claim.owner.empty() ? "an unknown container" : claim.owner,
               absl::StrJoin(*efas, ","), DescribeTargets(targets));
  if (options_.on_bound) options_.on_bound();
  return absl::OkStatus();
}

void LateBinder::BindUnstarted(const topology::DeviceTable& table) {
  // Placed by the host model: not while it is being loaded.
  if (!recovered() || table.model_pending) return;
  // A checkpoint not read whole may hide a holder of the EFAs it would
  // choose: nothing is bound until one is (the next pass tries again).
  const Checkpointed checkpointed = ReadCheckpointed();
  if (!checkpointed.problem.empty()) return;
  {
    // What it remembers of claims the kubelet no longer has goes: bounded by
    // the checkpoint.
    absl::MutexLock lock(&mu_);
    std::erase_if(released_, [&](const std::string& key) {
      return !checkpointed.claims.count(key.substr(0, key.find(' ')));
    });
    std::erase_if(unbound_,
                  [&](const auto& entry) { return !checkpointed.claims.count(entry.first); });
  }
  // Without late binding the kubelet gives EFAs by ID, and is told an EFA
  // is taken (advertised Unhealthy, Reserved()) only after it is bound: it
  // may give it meanwhile to a pod it admits, whose Allocate then fails. So
  // beside the EFAs a claim's own IDs name, a claim may take only EFAs whose
  // every ID the kubelet holds for a live container (pod-resources List;
  // such EFAs exist: each late-bound claim's IDs name as many EFAs as it
  // holds). Read when first needed; when List fails, only the EFAs a
  // claim's IDs name can be bound.
  std::optional<std::map<std::string, int>> kubelet_held;
  // First the claims whose own EFAs are free, then the others (which may
  // take the EFAs other claims' IDs name).
  for (const bool named_only : {true, false}) {
    for (const auto& [name, c] : checkpointed.claims) {
      if (c.efas_by_id) continue;  // its Allocate answer gave device nodes
      // PreStartContainer binds the claims of the name served.
      if (options_.late_binding && c.efa_resource == options_.resource_name) continue;
      uint64_t generation;
      {
        absl::MutexLock lock(&mu_);
        if (bindings_.count(name) || released_.count(absl::StrCat(name, " ", c.pod_uid))) continue;
        generation = generation_;
      }
      if (!named_only && !options_.late_binding && !kubelet_held) {
        kubelet_held = KubeletHeld(checkpointed).value_or(std::map<std::string, int>{});
      }
      const Claim claim{.name = name,
                        .described = DescribeClaim(name, c.efas),
                        .kubelet_ids = c.efas,
                        .owner = c.pod_uid,
                        .resource = c.efa_resource};
      const Targets targets = TargetsOf(table, c, claim.described);
      const Unstarted unstarted{
          .named_only = named_only,
          .kubelet_held = kubelet_held ? &*kubelet_held : nullptr,
          // Whether the sharing it was admitted under allows more holders
          // is Taken's to count.
          .named_held =
              options_.late_binding || AdvertisedNow(c.efa_resource, c.efas, options_.replicas)};
      absl::StatusOr<std::vector<std::string>> efas =
          Bind(table, claim, checkpointed, std::nullopt, generation, targets, unstarted);
      if (named_only && !efas.ok()) continue;
      absl::MutexLock lock(&mu_);
      if (efas.ok()) {
        unbound_.erase(name);
        spdlog::info(
            "late binding: bound {} of pod {} to EFAs {} before its container starts (admitted "
            "under late binding; the kubelet starts it with its CDI device)",
            claim.described, claim.owner, absl::StrJoin(*efas, ","));
        continue;
      }
      std::string& logged = unbound_[name];
      if (logged == efas.status().message()) continue;
      ++counts_.failed;
      logged = std::string(efas.status().message());
      spdlog::error("late binding: {} (its container cannot start until EFAs are free)", logged);
    }
  }
}

absl::Status LateBinder::Fail(absl::Status status) {
  absl::MutexLock lock(&mu_);
  ++counts_.failed;
  spdlog::error("late binding: PreStartContainer failed: {}", std::string(status.message()));
  return status;
}

std::optional<absl::Status> LateBinder::KeepBinding(const Claim& claim) {
  // A restart of the container it was bound for: same EFAs.
  if (claim.owner.empty()) return std::nullopt;
  absl::Status kept;
  std::vector<std::string> kept_efas;
  {
    absl::MutexLock lock(&mu_);
    auto it = bindings_.find(claim.name);
    if (it == bindings_.end() || it->second.owner != claim.owner) return std::nullopt;
    kept_efas = it->second.efas;
    std::error_code ec;
    if (!fs::exists(SpecPath(claim.name), ec)) {
      kept = WriteSpec(claim.name, claim.described, it->second);
    }
    if (kept.ok()) ++counts_.kept;
  }
  if (kept.ok()) {
    spdlog::info("late binding: {} of {} started again; keeping EFAs {}", claim.described,
                 claim.owner, absl::StrJoin(kept_efas, ","));
  }
  return kept;
}

Targets LateBinder::TargetsOf(const topology::DeviceTable& table,
                              const std::optional<ContainerDevices>& container,
                              const std::string& described) {
  if (!container || container->accelerators.empty()) return {};
  const auto gpus = gpus_.Get(*table.model);
  const std::vector<std::string>& errors = gpus->errors;
  Targets targets =
      ResolveTargets(container->accelerators, options_.resources, gpus->gpus, *table.model);
  if (!targets.unresolved.empty()) {
    spdlog::warn("late binding: cannot place accelerators {} of {}{}",
                 absl::StrJoin(targets.unresolved, ", "), described,
                 errors.empty() ? "" : " (" + absl::StrJoin(errors, "; ") + ")");
  }
  return targets;
}

absl::StatusOr<std::vector<std::string>> LateBinder::Bind(
    const topology::DeviceTable& table, const Claim& claim, const Checkpointed& checkpointed,
    const std::optional<std::set<std::string>>& live, uint64_t generation, const Targets& targets,
    std::optional<Unstarted> unstarted) {
  absl::MutexLock lock(&mu_);
  if (unstarted) {
    // Bound meanwhile: its container may have started with that spec.
    if (auto it = bindings_.find(claim.name); it != bindings_.end()) return it->second.efas;
  }
  ReleaseTakenOver(claim);
  // Bindings confirmed gone free their EFAs too.
  if (live) ReleaseLocked(*live, generation);
  std::set<std::string> except = ReusedBy(claim);
  std::set<std::string> reused_efas;
  for (const std::string& reused : except) {
    const std::vector<std::string>& efas = bindings_.at(reused).efas;
    reused_efas.insert(efas.begin(), efas.end());
  }
  except.insert(claim.name);
  const std::map<std::string, int> taken = Taken(checkpointed, except, table.replicas);
  // A claim of replica IDs (admitted under sharing) shares its EFAs; one of
  // plain IDs (admitted with one replica per EFA) needs EFAs no one holds,
  // and all of them, whatever the replicas now.
  const bool shared =
      table.replicas > 1 &&
      std::all_of(claim.kubelet_ids.begin(), claim.kubelet_ids.end(),
                  [](const std::string& id) { return topology::ParseReplicaId(id).has_value(); });
  topology::AllocationRequest request = FreeEfas(table, taken, shared);
  bool only_held = false;  // only EFAs the kubelet holds the IDs of are offered
  if (unstarted) {
    const Offer offer =
        OfferUnstarted(claim.kubelet_ids, unstarted->named_only, unstarted->kubelet_held,
                       unstarted->named_held, table.replicas, request.available);
    if (offer == Offer::kWait)
      return absl::UnavailableError("the EFAs its IDs name are not all free");
    only_held = offer == Offer::kHeld;
  }
  // With sharing, a claim of more replicas than there are EFAs with room
  // gets each of those once (a device node is given once anyway).
  const size_t wanted = shared ? std::min(claim.kubelet_ids.size(), request.available.size())
                               : claim.kubelet_ids.size();
  request.size = static_cast<int>(wanted);
  for (const std::string& efa : request.available) {
    if (reused_efas.count(efa) && request.must_include.size() < wanted) {
      request.must_include.push_back(efa);
    }
  }
  request.target_accelerators = targets.pci;
  request.target_neuron_indices = targets.neuron_indices;
  std::vector<topology::EfaDevice> devices;
  // The policy was offered ibdev names: it answers physical EFAs, which
  // with sharing are no device IDs.
  for (const std::string& ibdev : topology::ChooseEfas(*table.model, request)) {
    if (const topology::EfaDevice* d = table.FindPhysical(ibdev)) devices.push_back(*d);
  }
  if (devices.size() < wanted || devices.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot bind ", claim.described, ": ", claim.kubelet_ids.size(), " EFAs wanted, ",
        request.available.size(), " healthy and free (", taken.size(), " held by other containers",
        only_held ? "; without late binding, only EFAs whose every ID the kubelet "
                    "holds for a running pod can be bound"
                  : "",
        ")"));
  }
  std::sort(devices.begin(), devices.end(),
            [](const auto& a, const auto& b) { return a.pci < b.pci; });
  std::vector<std::string> efas;
  for (const auto& d : devices) efas.push_back(d.ibdev);
  Binding binding;
  binding.efas = efas;
  binding.owner = claim.owner;
  binding.spec = CdiSpecJson(claim.name, devices);
  binding.kubelet_ids = claim.kubelet_ids;
  binding.resource = claim.resource;
  binding.replicas = shared ? table.replicas : 1;
  if (absl::Status written = WriteSpec(claim.name, claim.described, binding); !written.ok()) {
    return written;
  }
  binding.generation = ++generation_;
  bindings_[claim.name] = std::move(binding);
  ++counts_.bound;
  return efas;
}

namespace {}  // namespace

void LateBinder::ReleaseTakenOver(const Claim& claim) {
  // A binding of another pod that held one of these IDs is gone: the
  // kubelet gives an ID to one live pod at a time.
  for (auto it = bindings_.begin(); it != bindings_.end();) {
    const auto current = it++;  // Release erases it
    const Binding& b = current->second;
    if (current->first != claim.name && (claim.owner.empty() || b.owner != claim.owner) &&
        HoldsIdsOf(b.kubelet_ids, b.resource, claim.kubelet_ids, claim.resource)) {
      Release(current, "the kubelet gave its devices to another container");
    }
  }
}

std::set<std::string> LateBinder::ReusedBy(const Claim& claim) const {
  std::set<std::string> reused;
  if (claim.owner.empty()) return reused;
  for (const auto& [name, b] : bindings_) {
    if (name != claim.name && b.owner == claim.owner &&
        HoldsIdsOf(b.kubelet_ids, b.resource, claim.kubelet_ids, claim.resource)) {
      reused.insert(name);
    }
  }
  return reused;
}

std::optional<std::vector<std::string>> LateBinder::BoundEfas(
    const std::vector<std::string>& kubelet_ids) const {
  absl::MutexLock lock(&mu_);
  // The served name's claim first; the same IDs under the other name's, or
  // named as before ClaimName took the resource into account.
  const std::string_view served = options_.resource_name;
  for (std::string_view resource :
       {served, std::string_view(kSharedResourceName), std::string_view(kResourceName)}) {
    if (auto it = bindings_.find(ClaimName(kubelet_ids, resource)); it != bindings_.end())
      return it->second.efas;
  }
  return std::nullopt;
}

std::map<std::string, std::vector<std::string>> LateBinder::Bindings() const {
  absl::MutexLock lock(&mu_);
  std::map<std::string, std::vector<std::string>> out;
  for (const auto& [claim, binding] : bindings_) out[claim] = binding.efas;
  return out;
}

LateBindingCounts LateBinder::counts() const {
  absl::MutexLock lock(&mu_);
  return counts_;
}

bool LateBinder::WaitForCountsForTest(const std::function<bool(const LateBindingCounts&)>& pred,
                                      std::chrono::milliseconds timeout) const {
  absl::MutexLock lock(&mu_);
  auto holds = [&] {
    mu_.AssertHeld();
    return pred(counts_);
  };
  return mu_.AwaitWithTimeout(absl::Condition(&holds), absl::FromChrono(timeout));
}

}  // namespace efa::plugin
