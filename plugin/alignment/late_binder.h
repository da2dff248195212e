// Late binding (docs/alignment.md): the kubelet's EFA device IDs are
// tokens it counts; the physical EFAs are chosen at PreStartContainer, when
// all of the container's resources are known, and handed to the runtime
// through a CDI spec per container allocation (plugin/alignment/cdi_spec.h).
//
// The spec files in the CDI dir are the durable state: Recover() reads them
// back after a restart. No physical EFA is ever bound to two claims, or with
// sharing to more claims than its replicas: each choice excludes the EFAs
// other bindings fill.
//
// A binding is released only on proof that its container is gone, since a
// wrong release hands a running container's EFAs to the next one:
// - the kubelet gave one of its kubelet IDs to another container (the device
//   manager never gives an ID to two live containers); or
// - neither the kubelet's checkpoint, read whole (no EFA entry skipped), nor
//   pod-resources List, when it answers, holds its container, on two reads
//   at least `release_after` apart.
// Both sources are needed: List answers from the kubelet's pod manager,
// which is empty after a kubelet restart until the API server's pods are
// added back (pkg/kubelet/apis/podresources/server_v1.go, GetPods), and
// never lists init containers (it walks pod.Spec.Containers), while the
// checkpoint keeps both; the checkpoint keeps a deleted pod's entries until
// the kubelet's next admission (devicemanager UpdateAllocatedDevices), while
// List drops them at once. The kubelet writes nothing when a pod is deleted,
// so while bindings exist List is asked every `recheck_every`; List makes the
// kubelet drop a deleted pod's allocations in memory (server_v1.go calls
// UpdateAllocatedDevices, which does so only once its pod sources are
// ready), and when List lacks a container the checkpoint holds, the daemon
// resends its device list (`refresh_checkpoint`): the kubelet rewrites the
// checkpoint from memory on every ListAndWatch message. A checkpoint that
// cannot be read, or with an EFA
// entry it had to skip, decides nothing: it is logged once and counted
// (`undecided`), and the bindings are kept.
//
// The daemon's own restart, upgrade or change of configuration changes no
// running container's EFAs (ARCHITECTURE.md, "The daemon's lifecycle"), so
// the binder runs in every alignment mode and knows every holder:
// - claims under either EFA resource name (sharing's rename changes it);
// - containers whose Allocate answer gave device nodes by ID (best effort,
//   alignment off: the checkpoint keeps that answer) hold the EFAs their IDs
//   name, and a binding never takes those;
// - without late binding (`late_binding` false) nothing is bound, but the
//   bindings an earlier configuration made are recovered and kept until
//   their containers end, and their EFAs are reserved (Reserved()): the
//   daemon advertises the IDs naming them Unhealthy, so the kubelet gives
//   them to no new container (unless the binding's own IDs name them: the
//   kubelet counts those held);
// - each binding's owner (its pod), kubelet IDs, resource and replicas are
//   written beside its spec (ClaimRecord) and read back by Recover(), and
//   adopted from the checkpoint for specs an older release wrote alone.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "plugin/alignment/alignment.h"
#include "plugin/alignment/nvidia_gpu_cache.h"
#include "plugin/kubelet/checkpoint_cache.h"
#include "plugin/kubelet/pod_resources_client.h"
#include "plugin/kubelet/resource_name.h"
#include "plugin/runtime/clock.h"
#include "topology/device_table.h"

namespace efa::plugin {

struct LateBinderOptions {
  // Given by the daemon (DaemonOptions holds their defaults).
  std::filesystem::path cdi_dir;
  std::filesystem::path kubelet_dir;
  std::filesystem::path proc_root;
  // False: the daemon allocates by device ID (best effort, alignment off);
  // PreStart is not called, and the bindings recovered are only kept.
  bool late_binding = true;
  // The resource name served now: EFAs held under the other, or by IDs of
  // another replica count, are reserved when not binding.
  std::string resource_name = kResourceName;
  // Sharing: how many claims may bind one EFA (the table's replicas).
  int replicas = 1;
  AcceleratorResources resources;
  PodResourcesClient::Options pod_resources;
  // Runs after each new binding, on the thread that made it (a gRPC
  // thread); must be quick. Null: nothing.
  std::function<void()> on_bound;
  // How long a binding must stay absent from the kubelet's records before it
  // is released: longer than a kubelet restart takes to refill pod-resources
  // from the API server (seconds), and short beside a pod's life.
  std::chrono::milliseconds release_after{10000};
  // While bindings exist, how often the kubelet's records are read again
  // (a pod's deletion changes no file the daemon watches).
  std::chrono::milliseconds recheck_every{15000};
  // Asks the kubelet to rewrite its checkpoint (the daemon resends its
  // device list); called, outside any lock, when List newly lacks bound
  // containers the checkpoint holds. Null: nothing.
  std::function<void()> refresh_checkpoint;
  // The time the release confirmation counts on (tests move a fake one).
  // Not owned; outlives the binder.
  const Clock* clock = &Clock::Steady();
};

// Counters since start.
struct LateBindingCounts {
  int bound = 0;      // EFAs bound for a claim (PreStartContainer, BindUnstarted)
  int kept = 0;       // PreStartContainer found the claim bound already (container restart)
  int failed = 0;     // PreStartContainer failed; BindUnstarted failed (once per cause)
  int released = 0;   // bindings dropped (their pod is gone)
  int recovered = 0;  // bindings read back from the CDI dir at start
  // Recover() passes that could not read the CDI dir whole (retried).
  int recover_incomplete = 0;
  // Release passes the kubelet's records could not decide (checkpoint
  // unreadable, or an EFA entry in it skipped): every binding was kept.
  int undecided = 0;
};

class LateBinder {
 public:
  explicit LateBinder(LateBinderOptions options);

  // Reads <cdi-dir>/vpc.amazonaws.com-efa_*.json and their records back as
  // bindings. A spec that was read but cannot be parsed is logged and
  // removed with its record (the EFAs it bound are unknown; its container
  // gets a fresh binding at its next start), unless a record of a newer
  // version names its EFAs; two specs binding one EFA are logged as an error
  // and both kept. Leftover temporary files and records without a spec are
  // removed. A missing CDI dir holds no binding. When the dir cannot be
  // listed or a file cannot be read, the error is returned (logged once,
  // counted) and nothing of that file is decided: call again until it
  // succeeds, and serve only then (recovered()).
  absl::Status Recover();
  // Whether a Recover() has read the CDI dir whole. Thread-safe.
  bool recovered() const;

  // Without late binding: the physical EFAs no new container may be given
  // (ibdev -> why): those bound by an earlier late-binding configuration
  // (but a binding of the EFAs its own IDs name, as advertised now), and
  // those held by ID under another resource name or replica count.
  // Empty with late binding, which counts them at each binding. When
  // pod-resources List lacks containers the checkpoint says hold EFAs so (a
  // deleted pod's entries stay until the kubelet writes the file again),
  // asks for the rewrite (`refresh_checkpoint`) once per such set.
  // Thread-safe.
  std::map<std::string, std::string> Reserved();
  // The bindings held under the EFA resource name not served now (sharing's
  // rename changed it): their containers keep their EFAs while they run,
  // but the kubelet cannot restart them, having no plugin of that name to
  // call PreStartContainer on. Thread-safe.
  int BoundUnderOtherName() const;

  // Binds the claims of containers admitted under late binding that never
  // started and for which no PreStartContainer will come: without late
  // binding now, or held under the EFA resource name not served now. The
  // kubelet starts them with the CDI device of their Allocate answer, and
  // skips the call for a resource whose plugin has not registered since its
  // own restart (devicemanager callPreStartContainerIfNeeded: no options),
  // so their device resolves when they start. A claim gets the EFAs its
  // kubelet IDs name when those are free (the kubelet counts them held;
  // such claims are bound first), else the free EFAs nearest its
  // accelerators, which without late binding must be EFAs whose every ID
  // the kubelet holds for a live pod (pod-resources List): it gives the
  // others by ID before it hears they are taken; a claim released as gone
  // is not bound again. Does nothing before recovered(), nor while the host
  // model is being loaded (table.model_pending), nor while the
  // checkpoint cannot be read whole (a skipped entry may hide a holder of
  // the EFAs it would choose). A claim that cannot
  // be bound is logged and counted (`failed`) once per cause, and tried
  // again at the next call. Thread-safe.
  void BindUnstarted(const topology::DeviceTable& table);

  // PreStartContainer for the kubelet's `kubelet_ids`: binds the physical
  // EFAs of `table` (healthy, bound to no other claim) nearest the
  // container's accelerators (from the kubelet checkpoint, else
  // pod-resources; without any, the policy's placement) and writes the
  // claim's CDI spec atomically. A claim already bound to the same container
  // (a restart) keeps its EFAs (its spec is written again if missing); one
  // bound to another container, or recovered after a restart, is bound
  // afresh. Fails, naming the claim and the IDs, when there are not enough
  // free healthy EFAs (FAILED_PRECONDITION) or the spec cannot be written
  // (the error of the path that failed); then nothing is bound or written.
  // Thread-safe.
  absl::Status PreStart(const topology::DeviceTable& table,
                        const std::vector<std::string>& kubelet_ids);

  // Releases every binding older than this call whose container has been
  // absent from the kubelet's records (header comment) for release_after,
  // deleting its spec; a binding absent for the first time is noted. Returns
  // when to call again (to confirm the bindings noted, else recheck_every
  // later), or nullopt when nothing is bound. Thread-safe.
  std::optional<std::chrono::steady_clock::time_point> ReleaseGone();

  // The physical EFAs bound for a container holding `kubelet_ids` (in PCI
  // order), or nullopt when they are not bound. Thread-safe.
  std::optional<std::vector<std::string>> BoundEfas(
      const std::vector<std::string>& kubelet_ids) const;
  // Claim -> its physical EFAs. Thread-safe.
  std::map<std::string, std::vector<std::string>> Bindings() const;
  LateBindingCounts counts() const;
  std::filesystem::path SpecPath(const std::string& claim) const;

  // Blocks until pred(counts()) holds or `timeout` passes; returns whether
  // it held.
  bool WaitForCountsForTest(const std::function<bool(const LateBindingCounts&)>& pred,
                            std::chrono::milliseconds timeout) const;

 private:
  struct Binding {
    std::vector<std::string> efas;  // physical, PCI order
    // The pod UID ("pod <namespace/name>" from pod-resources); empty when
    // unknown (recovered without a record, or bound while the checkpoint
    // could not name its container; not adopted from the checkpoint yet):
    // then the next PreStartContainer binds afresh. A pod's init and
    // app containers given the same IDs (the kubelet's devicesToReuse)
    // share the binding.
    std::string owner;
    std::string spec;         // the spec file's content
    uint64_t generation = 0;  // bindings made after a release began are spared
    // The kubelet's IDs it was bound for, and their resource (empty when
    // unknown, as `owner`).
    std::vector<std::string> kubelet_ids;
    std::string resource;
    // How many claims may share its EFAs: sharing's replicas when it was
    // bound; 1 when bound for plain IDs (admitted while the replicas were
    // 1) or not known to be shared. A later configuration's replicas never
    // put more claims on its EFAs while it lives.
    int replicas = 1;
    // When the kubelet's records were first seen without its container.
    std::optional<std::chrono::steady_clock::time_point> absent_since;
  };
  // The claims of the checkpoint's containers, each with its pod's
  // containers holding it merged (their accelerators together: an init and
  // an app container may share one). `problem` says why the claims may be
  // incomplete (the checkpoint unreadable, or an entry that may be an EFA's
  // skipped); empty when they are not.
  struct Checkpointed {
    std::map<std::string, ContainerDevices> claims;
    // Containers holding the same kubelet IDs as a claim above under the
    // other EFA resource name (the claim is the served name's): their
    // claim names collide, but they are other containers.
    std::vector<ContainerDevices> other_name;
    std::string problem;
    bool missing = false;  // the problem: there is no checkpoint file
    std::set<std::string> ClaimNames() const;
  };
  Checkpointed ReadCheckpointed() const;
  uint64_t Generation();  // generation_, under the lock
  // Fills in the owner, IDs and resource of bindings recovered without them
  // from the checkpoint's container holding their claim.
  // Releases those whose claim's IDs the checkpoint shows given by ID.
  void Adopt(const Checkpointed& checkpointed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the kubelet gave `binding`'s IDs to another container: the
  // checkpoint's only containers holding `claim`'s IDs under its resource
  // were answered by ID (so are not late-bound), or another pod's container
  // holds one of them by ID.
  static bool TakenOverById(const Checkpointed& checkpointed, const std::string& claim,
                            const Binding& binding);
  // Whether a binding of another pod (owner known) than `pod` holds one of
  // `efas`, where it or `claim` (given them under `replicas`) may not share.
  bool ExclusivelyBoundElsewhere(const std::string& claim, const std::vector<std::string>& efas,
                                 int replicas, const std::string& pod) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // EFA -> how many of its replicas are taken by bindings other than those
  // of `except` and by containers holding EFAs by ID: one each, however
  // many of an EFA's replica IDs a container holds; and when one of them
  // was given it under fewer replicas than `replicas` (exclusive: 1), the
  // difference too. A checkpoint not read whole (`checkpointed.problem`)
  // may lack holders by ID: those of the latest whole read count too.
  std::map<std::string, int> Taken(const Checkpointed& checkpointed,
                                   const std::set<std::string>& except, int replicas) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads one spec (and its record) into `out`; a read error is returned.
  absl::Status RecoverSpec(const std::filesystem::path& path, std::map<std::string, Binding>& out);
  // The claims of the containers holding EFAs now: the checkpoint's and, when
  // `list` succeeded, List's; nullopt when the checkpoint cannot tell (then
  // logged once and counted).
  // The claims of List's containers.
  std::set<std::string> ListedClaims(const v1::ListPodResourcesResponse& list) const;
  std::optional<std::set<std::string>> LiveClaims(
      const absl::StatusOr<v1::ListPodResourcesResponse>& list, const Checkpointed& checkpointed);
  // Releases the bindings older than `generation` confirmed absent from
  // `live`, and notes those absent for the first time; returns when the
  // earliest noted one is due.
  std::optional<std::chrono::steady_clock::time_point> ReleaseLocked(
      const std::set<std::string>& live, uint64_t generation) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Release(std::map<std::string, Binding>::iterator it, std::string_view why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One PreStartContainer's claim.
  struct Claim {
    std::string name;       // ClaimName(kubelet_ids)
    std::string described;  // DescribeClaim(), how messages name it
    std::vector<std::string> kubelet_ids;
    // The pod UID from the checkpoint, "pod <namespace/name>" from
    // pod-resources, or "" when neither has the container yet.
    std::string owner;
    std::string resource;  // the IDs' EFA resource name, "" when not known
  };
  // The container holding `claim`'s IDs by ID at the latest whole checkpoint
  // read, if any (PreStart, when the checkpoint is not read whole now).
  std::optional<ContainerDevices> HeldByIdAtWholeRead(const std::string& claim)
      ABSL_LOCKS_EXCLUDED(mu_);
  // PreStart of a container that holds its EFAs by ID: nothing to bind.
  absl::Status KeptById(const Claim& claim, const ContainerDevices& container);
  // After a refusal for want of EFAs: when the checkpoint holds containers
  // by ID that List lacks (a deleted pod's entries stay until the kubelet
  // writes the file again), asks the kubelet to rewrite it, once per such
  // set, so that the container's next start (the kubelet retries it) finds
  // their EFAs free.
  void RefreshStaleById(const Checkpointed& checkpointed, const v1::ListPodResourcesResponse& list);
  // PreStart's steps. Counts and logs a failure; returns `status`.
  absl::Status Fail(absl::Status status);
  // A restart of the container the claim is bound for: keeps the binding
  // (writing its spec again if missing); nullopt when it is not one.
  std::optional<absl::Status> KeepBinding(const Claim& claim);
  // The container's accelerators as PCI addresses and Neuron indices.
  Targets TargetsOf(const topology::DeviceTable& table,
                    const std::optional<ContainerDevices>& container, const std::string& described);
  // BindUnstarted's claims: the EFAs their IDs name when those are all
  // free (`named_only`: else none); else, when `kubelet_held` is given
  // (without late binding: the kubelet gives EFAs by ID), only EFAs all of
  // whose IDs it holds (EFA -> how many of its IDs pod-resources List holds
  // under the name served, for containers `checkpointed` has).
  struct Unstarted {
    bool named_only = false;
    const std::map<std::string, int>* kubelet_held = nullptr;
    // Whether the kubelet holds the EFAs the claim's IDs name: late
    // binding, or its IDs are the ones advertised now (AdvertisedNow).
    bool named_held = true;
  };
  absl::StatusOr<std::map<std::string, int>> KubeletHeld(const Checkpointed& checkpointed);
  // Whether the daemon advertises `id` now (its form under the replicas
  // served), and the IDs `ids` of `resource`, given to be shared by
  // `replicas`: held so, the kubelet counts them, and gives an EFA's other
  // IDs to no more containers than its holders accepted.
  bool AdvertisedId(const std::string& id) const;
  bool AdvertisedNow(const std::string& resource, const std::vector<std::string>& ids,
                     int replicas) const;
  // Releases the bindings gone (`live`, when known) or taken over, then
  // binds the claim and writes its spec; the EFAs bound, in PCI order.
  // `unstarted` (BindUnstarted, above): a claim bound meanwhile keeps its
  // binding.
  absl::StatusOr<std::vector<std::string>> Bind(const topology::DeviceTable& table,
                                                const Claim& claim,
                                                const Checkpointed& checkpointed,
                                                const std::optional<std::set<std::string>>& live,
                                                uint64_t generation, const Targets& targets,
                                                std::optional<Unstarted> unstarted = std::nullopt);
  // Releases the bindings of other pods that hold one of the claim's
  // kubelet IDs.
  void ReleaseTakenOver(const Claim& claim) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The bindings of the claim's pod holding some of its IDs: an init
  // container's, whose IDs the kubelet gives again to the pod's next
  // containers (devicesToReuse), as it runs none of them together. The claim
  // reuses their EFAs, and their specs stay for the init container's next
  // run.
  std::set<std::string> ReusedBy(const Claim& claim) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the claim's spec and its record atomically; the error names the
  // claim and path.
  absl::Status WriteSpec(const std::string& claim, const std::string& described,
                         const Binding& binding) const;

  const LateBinderOptions options_;
  PodResourcesClient pod_resources_;
  mutable CheckpointCache checkpoint_;  // read once per change
  NvidiaGpuCache gpus_;
  mutable absl::Mutex mu_;
  std::map<std::string, Binding> bindings_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  LateBindingCounts counts_ ABSL_GUARDED_BY(mu_);
  // Why the kubelet's records decided nothing at the latest pass ("": they
  // did), to log each cause once.
  std::string undecided_ ABSL_GUARDED_BY(mu_);
  // Why the latest Recover() was incomplete ("": it was not), to log each
  // cause once; whether one has been complete.
  std::string recover_problem_ ABSL_GUARDED_BY(mu_);
  bool recovered_ ABSL_GUARDED_BY(mu_) = false;
  // The bound claims the checkpoint held and List did not at the latest pass
  // that had both (the checkpoint is refreshed when this set changes).
  std::set<std::string> checkpoint_only_ ABSL_GUARDED_BY(mu_);
  // The same for the containers holding reserved EFAs by ID (Reserved()),
  // and for those holding EFAs by ID at the latest refusal for want of EFAs
  // (PreStart).
  std::set<std::string> reserved_stale_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> refused_stale_ ABSL_GUARDED_BY(mu_);
  // The EFAs held by ID that the latest whole checkpoint read reserved.
  std::map<std::string, std::string> reserved_by_id_ ABSL_GUARDED_BY(mu_);
  // The containers holding EFAs by ID at the latest whole checkpoint read
  // (Adopt), for Taken when a read is not whole; nullopt before the first.
  std::optional<std::vector<ContainerDevices>> held_by_id_ ABSL_GUARDED_BY(mu_);
  // BindUnstarted(): the claims released as gone ("claim owner"), never
  // bound again; the failures logged (claim -> message). Both only of
  // claims the checkpoint still holds.
  std::set<std::string> released_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> unbound_ ABSL_GUARDED_BY(mu_);
};

}  // namespace efa::plugin
