// The invariants efa-lifecycle checks after every step (the list is at the
// top of lifecycle_main.cc), as the Node's checks.
#include "test/lifecycle/lifecycle_node.h"

namespace efa::lifecycle {

std::optional<Violation> Node::CheckRefusal(const Pod& pod, const Container& c,
                                            const absl::Status& status) {
  // Late binding's refusal for want of EFAs (LateBinder::Bind).
  if (!absl::StrContains(status.message(), "cannot bind")) return std::nullopt;
  // Holders of each device node: every container of a live pod (its start's
  // nodes, else its answer's), but c and its own claim; deleted pods' bound
  // containers until taken over or released.
  std::map<std::string, std::vector<int>> holders;  // node -> holders' replicas
  std::vector<const Pod*> live;
  for (const Pod& p : pods_) live.push_back(&p);
  // A pod being admitted is not in pods_ yet.
  if (std::none_of(pods_.begin(), pods_.end(), [&](const Pod& p) { return &p == &pod; }))
    live.push_back(&pod);
  for (const Pod* p : live) {
    for (const Container& o : p->containers) {
      if (&o == &c || (!c.claim.empty() && o.claim == c.claim)) continue;
      for (const std::string& n : Holds(o)) {
        holders[n].push_back(o.Counted());
      }
    }
  }
  // What became of deleted pods' holdings: bindings, and EFAs held by ID
  // (the daemon counts the kubelet checkpoint's entries, which stay until
  // the kubelet writes it again: Held).
  std::vector<std::string> deleted;
  for (const Gone& g : gone_) {
    if (!g.taken_over.empty()) {
      deleted.push_back(
          absl::StrCat(g.who, "'s ", Nodes(g.nodes), " free (its ID ", g.taken_over, ")"));
      continue;
    }
    if (!Held(g)) continue;
    deleted.push_back(absl::StrCat(
        g.who, "'s ", Nodes(g.nodes), " held (deleted ",
        std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - g.when).count(), " s ago",
        g.by_base && !g.recorded ? ", bound by the base binary, no claim record" : "", ")"));
    for (const std::string& n : g.nodes) holders[n].push_back(g.replicas);
  }
  // A spec still on disk whose container no live pod has: one the daemon
  // could not delete (a read-only CDI dir), or one a daemon recovered
  // without its owner (written by the base binary, which keeps no record).
  // The daemon recovers it at its start and keeps its EFAs until the
  // kubelet's records confirm the container gone over release_after
  // (LateBinder::ReleaseGone): they count as held meanwhile.
  std::set<std::string> live_claims;
  for (const Pod* p : live) {
    for (const Container& o : p->containers) live_claims.insert(o.claim);
  }
  std::error_code ec;
  for (fs::directory_iterator it(cdi_dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string claim = efa::plugin::ClaimOfSpecFile(it->path().filename().string());
    if (claim.empty() || claim == c.claim || live_claims.count(claim)) continue;
    Container orphan;
    orphan.claim = claim;
    const Resolved spec = Resolve(orphan);
    // Shared as its record says: the daemon recovers it so (without one,
    // exclusive until it learns the owner's IDs).
    const std::string record =
        efa::testing::ReadFile(cdi_dir_ / efa::plugin::ClaimRecordFileName(claim));
    const auto parsed = efa::plugin::ParseClaimRecord(record, claim, claim);
    const int replicas = parsed.ok() ? parsed->replicas : 1;
    for (const std::string& n : spec.nodes) holders[n].push_back(replicas);
    if (!spec.nodes.empty())
      deleted.push_back(absl::StrCat(claim, "'s spec ", Nodes(spec.nodes), " still on disk"));
  }
  // A claim of plain IDs (admitted while the replicas were 1) is bound to
  // EFAs no one holds, all it asks (LateBinder::Bind); one of replica IDs
  // to as many EFAs with room as there are, at least one.
  const bool exclusive = daemon_config_.replicas == 1 || c.alloc_replicas == 1;
  std::vector<std::string> free;
  for (const Efa& e : efas_) {
    if (!e.present) continue;
    const auto it = holders.find(DeviceNode(e));
    int limit = daemon_config_.replicas;
    size_t held_by = 0;
    if (it != holders.end()) {
      held_by = it->second.size();
      for (int r : it->second) limit = std::min(limit, r);
    }
    if (exclusive ? held_by == 0 : static_cast<int>(held_by) < limit) free.push_back(DeviceNode(e));
  }
  const size_t wanted = exclusive ? static_cast<size_t>(c.efas) : 1;
  if (free.size() < wanted) return std::nullopt;
  return Violation{
      "a start is refused for want of EFAs only when none is free",
      absl::StrCat(Describe(pod, c), " was refused at ", Now(), ": ", status.message(), "; but ",
                   free.size(), " EFAs are held by no live container (", Nodes(free), ")",
                   deleted.empty() ? "" : "; deleted pods: " + absl::StrJoin(deleted, ", "), "; ",
                   LastRestart())};
}

std::optional<Violation> Node::Check() {
  if (daemon_) {
    const int status = daemon_->Wait(0ms);
    if (status != -1) {
      daemon_.reset();
      return Violation{"never exits", absl::StrCat("the daemon exited with status ", status)};
    }
  }
  if (auto gap = probes_.TakeWorstGap(); gap > kProbePeriod) {
    return Violation{
        "answers its probes",
        absl::StrCat("/healthz went unanswered for ",
                     std::chrono::duration_cast<std::chrono::milliseconds>(gap).count(),
                     " ms (the probe period is 10 s)")};
  }
  if (auto v = CheckAdvertised()) return v;
  if (auto v = CheckSnapshot()) return v;
  if (auto v = CheckHeld()) return v;
  return CheckEfasApart();
}

std::optional<Violation> Node::CheckSnapshot() {
  if (!snapshot_) return std::nullopt;
  const std::map<std::string, Resolved> before = *std::exchange(snapshot_, std::nullopt);
  for (const auto& [pod, c] : Running()) {
    const std::string who = absl::StrCat(pod->uid, "/", c->name);
    auto it = before.find(who);
    if (it == before.end()) continue;
    ++counts["device nodes compared across daemon restarts"];
    const Resolved now = Resolve(*c);
    if (now.nodes == it->second.nodes && now.problem == it->second.problem) continue;
    auto what = [](const Resolved& r) {
      return r.problem.empty() ? Nodes(r.nodes)
                               : absl::StrCat(Nodes(r.nodes), " (", r.problem, ")");
    };
    return Violation{
        "a running container's device nodes are the same before and after a daemon "
        "restart",
        absl::StrCat(Describe(*pod, *c), ": before ", restarts_.back(), " ", what(it->second),
                     ", after it ", what(now))};
  }
  return std::nullopt;
}

std::optional<Violation> Node::CheckHeld() {
  for (const auto& [pod, c] : Running()) {
    if (c->claim.empty()) continue;
    const Resolved now = Resolve(*c);
    if (!now.problem.empty()) {
      return Violation{"a running container's CDI device resolves",
                       absl::StrCat(Describe(*pod, *c), ": ", now.problem, "; ", LastRestart())};
    }
    if (now.nodes != c->held) {
      return Violation{"a running container keeps its device nodes",
                       absl::StrCat(Describe(*pod, *c), ": its CDI spec names ", Nodes(now.nodes),
                                    " now; ", LastRestart())};
    }
    const int n = static_cast<int>(now.nodes.size());
    if (c->held_replicas == 1 ? n != c->efas : (n < 1 || n > c->efas)) {
      return Violation{"a running container's CDI device resolves",
                       absl::StrCat(Describe(*pod, *c), ": its spec names ", n,
                                    " device nodes for ", c->efas, " EFA")};
    }
  }
  return std::nullopt;
}

std::optional<Violation> Node::CheckAdvertised() {
  // Which EFA each name is, and what the kubelet must be told of it.
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < efas_.size(); ++i) {
    index[efas_[i].udev_name] = i;
    index[efas_[i].kernel_name] = i;
  }
  // EFAs a live container holds (or a deleted pod's, not released yet): the
  // daemon may withhold them (advertise them Unhealthy). Read at each look:
  // the daemon binds a claim admitted under late binding and never started
  // on its own passes (LateBinder::BindUnstarted), at any time.
  auto held_now = [&] {
    std::set<std::string> held;
    for (const Pod& pod : pods_) {
      for (const Container& c : pod.containers) {
        const std::vector<std::string> holds = Holds(c);
        held.insert(holds.begin(), holds.end());
        // And what its claim's spec binds now: a finished init container's
        // claim, released when the app container reused its IDs, is bound
        // again by a daemon restarted without late binding, which cannot
        // tell it from one not started yet (BindUnstarted; pod-resources
        // List has no init containers): withheld until the pod ends.
        if (c.init && c.state == Container::State::kDone && !c.claim.empty()) {
          const std::vector<std::string> bound = Resolve(c).nodes;
          held.insert(bound.begin(), bound.end());
        }
      }
    }
    for (const Gone& g : gone_) {
      if (Held(g)) held.insert(g.nodes.begin(), g.nodes.end());
    }
    // A spec on disk that no live container's claim names (one a read-only
    // CDI dir kept after its release): the daemon recovers it at its start
    // and keeps it until it confirms the container gone (Held).
    if (Clock::now() - gone_clock_ <= kReleaseWindow) {
      std::set<std::string> live_claims;
      for (const Pod& pod : pods_) {
        for (const Container& c : pod.containers) live_claims.insert(c.claim);
      }
      std::error_code ec;
      for (fs::directory_iterator it(cdi_dir_, ec), end; !ec && it != end; it.increment(ec)) {
        Container orphan;
        orphan.claim = efa::plugin::ClaimOfSpecFile(it->path().filename().string());
        if (orphan.claim.empty() || live_claims.count(orphan.claim)) continue;
        const std::vector<std::string> nodes = Resolve(orphan).nodes;
        held.insert(nodes.begin(), nodes.end());
      }
    }
    return held;
  };
  const int replicas = daemon_config_.replicas;
  const std::string resource = daemon_config_.resource();
  std::string wrong;
  auto matches = [&](const std::vector<v1beta1::Device>& devices) {
    std::vector<std::string> problems;
    const std::set<std::string> held = held_now();
    std::vector<std::set<int>> seen(efas_.size());
    for (const auto& d : devices) {
      std::string name = d.id();
      int replica = 0;
      if (replicas > 1) {
        const auto ref = efa::topology::ParseReplicaId(d.id());
        if (!ref) {
          problems.push_back(absl::StrCat(d.id(), " is no replica ID (replicas ", replicas, ")"));
          continue;
        }
        name = ref->ibdev;
        replica = ref->replica;
      }
      auto it = index.find(name);
      if (it == index.end() || replica >= replicas) {
        problems.push_back(d.id() + " is no EFA of the node");
        continue;
      }
      const Efa& efa = efas_[it->second];
      if (!seen[it->second].insert(replica).second) problems.push_back(d.id() + " is listed twice");
      // Removed or returned just before the descriptor table filled: the
      // listing its event set off may have failed (the last known state
      // kept), and the periodic rescan sees it (--rescan-interval).
      if (efa.changed + kMissedEvent >= fd_full_begin_ && efa.changed <= fd_full_end_ &&
          Clock::now() < fd_full_end_ + kRescanInterval) {
        continue;
      }
      // Late binding reserves nothing (LateBinder::Reserved): a returned EFA
      // is Healthy again once the daemon sees it, held or not.
      const bool withheld = (!daemon_config_.late() || on_base()) &&
                            held.count(DeviceNode(efa)) > 0 && d.health() == "Unhealthy";
      if (efa.present && (name != efa.udev_name || (d.health() != "Healthy" && !withheld))) {
        problems.push_back(
            absl::StrCat(d.id(), " is ", d.health(), ", but ", efa.udev_name, " is there"));
      }
      if (!efa.present && d.health() == "Healthy")
        problems.push_back(d.id() + " is Healthy, but gone");
    }
    for (size_t i = 0; i < efas_.size(); ++i) {
      if (efas_[i].present && static_cast<int>(seen[i].size()) != replicas) {
        problems.push_back(absl::StrCat(efas_[i].udev_name, " is listed as ", seen[i].size(),
                                        " of its ", replicas, " replicas"));
      }
    }
    const size_t all = problems.size();
    if (all > 4) problems.resize(4);
    wrong = absl::StrCat(absl::StrJoin(problems, "; "),
                         all > 4 ? absl::StrCat("; and ", all - 4, " more") : "");
    return problems.empty();
  };
  if (!kubelet_.WaitForStreaming(resource, true, kQuiet)) {
    return Violation{"registered", absl::StrCat("the daemon's ListAndWatch stream of ", resource,
                                                " is not open")};
  }
  if (!kubelet_.WaitForDevices(resource, matches, kQuiet)) {
    return Violation{"advertises the node's truth",
                     absl::StrCat(resource, " under ", daemon_config_.Describe(), ": ", wrong)};
  }
  return std::nullopt;
}

std::optional<Violation> Node::CheckEfasApart() {
  // Device node -> the running containers holding it.
  std::map<std::string, std::vector<std::pair<const Pod*, const Container*>>> holders;
  for (const auto& [pod, c] : Running()) {
    ++counts["running containers checked"];
    for (const std::string& node : c->held) {
      ++counts["device nodes checked"];
      holders[node].emplace_back(pod, c);
    }
  }
  for (const auto& [node, who] : holders) {
    int limit = who.front().second->held_replicas;
    for (const auto& [pod, c] : who) limit = std::min(limit, c->held_replicas);
    if (static_cast<int>(who.size()) <= limit) continue;
    std::vector<std::string> names;
    for (const auto& [pod, c] : who) names.push_back(Describe(*pod, *c));
    return Violation{
        "no EFA in more running containers than it was given for",
        absl::StrCat(fs::path(node).filename().string(), " is in ", who.size(),
                     " running containers: ", absl::StrJoin(names, "; "), "; ", LastRestart())};
  }
  return std::nullopt;
}

}  // namespace efa::lifecycle
