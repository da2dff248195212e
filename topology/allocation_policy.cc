#include "topology/allocation_policy.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <queue>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"

namespace efa::topology {
namespace {

constexpr size_t kNone = std::numeric_limits<size_t>::max();
constexpr GroupLevel kTiers[] = {GroupLevel::kSwitch, GroupLevel::kRootComplex, GroupLevel::kNuma};

enum State : uint8_t { kUnavailable = 0, kFree = 1, kChosen = 2 };

// Which EFAs are free and which are chosen; the answer in the making.
class Selection {
 public:
  explicit Selection(size_t efas) : state_(efas, kUnavailable), shared_(efas, 0) {}

  bool IsFree(size_t e) const { return state_[e] == kFree; }
  bool IsChosen(size_t e) const { return state_[e] == kChosen; }
  void MarkFree(size_t e) {
    if (state_[e] == kUnavailable) state_[e] = kFree;
  }
  void Choose(size_t e) {
    if (state_[e] == kChosen) return;
    state_[e] = kChosen;
    chosen_.push_back(e);
  }
  std::vector<size_t>& chosen() { return chosen_; }
  // How many containers already use EFA `e` (sharing).
  int Shared(size_t e) const { return shared_[e]; }
  void SetShared(size_t e, int uses) {
    shared_[e] = uses;
    sharing_ = sharing_ || uses != 0;
  }
  bool sharing() const { return sharing_; }
  // The least shared free EFA among list[from..] (list[from] must be free),
  // the first of them on a tie: list[from] when nothing is shared.
  size_t LeastShared(const std::vector<size_t>& list, size_t from) const {
    size_t best = list[from];
    for (size_t i = from + 1; sharing_ && i < list.size(); ++i) {
      if (IsFree(list[i]) && Shared(list[i]) < Shared(best)) best = list[i];
    }
    return best;
  }

 private:
  std::vector<uint8_t> state_;
  std::vector<int> shared_;
  bool sharing_ = false;
  std::vector<size_t> chosen_;
};

// ---- With targets -------------------------------------------------------

struct Target {
  const std::vector<size_t>* exact = nullptr;  // EFAs the Neuron table names
  size_t exact_cursor = 0;
  int groups[3] = {-1, -1, -1};  // switch, root complex, NUMA group of EFAs near it
};

// Where a target is, for spreading: its switch, else root complex, else
// NUMA group.
std::pair<int, int> SpreadKey(const Target& t) {
  for (int level = 0; level < 3; ++level) {
    if (t.groups[level] >= 0) return {level, t.groups[level]};
  }
  return {3, 0};
}

// Shared cursors over the tier lists. A cursor only passes EFAs that are not
// free, and an EFA never becomes free again, so targets that share a list
// can share its cursor: all tiers together cost O(n) per decision.
class TierCursors {
 public:
  TierCursors(const HostModel& model, Selection& sel) : model_(model), sel_(sel) {
    for (size_t level = 0; level < 3; ++level) {
      cursors_[level].assign(model.GroupCount(static_cast<GroupLevel>(level)), 0);
    }
  }

  // The nearest free EFA for `t`, or kNone when no EFA is free at all.
  size_t Next(Target& t) {
    if (t.exact != nullptr) {
      while (t.exact_cursor < t.exact->size() && !sel_.IsFree((*t.exact)[t.exact_cursor])) {
        ++t.exact_cursor;
      }
      if (t.exact_cursor < t.exact->size()) return sel_.LeastShared(*t.exact, t.exact_cursor);
    }
    for (size_t level = 0; level < 3; ++level) {
      const int g = t.groups[level];
      if (g < 0) continue;
      const std::vector<size_t>& list = model_.GroupEfas(kTiers[level], g);
      size_t& c = cursors_[level][static_cast<size_t>(g)];
      while (c < list.size() && !sel_.IsFree(list[c])) ++c;
      if (c < list.size()) return sel_.LeastShared(list, c);
    }
    const size_t n = model_.efas().size();
    while (all_ < n && !sel_.IsFree(all_)) ++all_;
    if (all_ == n) return kNone;
    if (!sel_.sharing()) return all_;
    if (every_.empty()) {
      for (size_t e = 0; e < n; ++e) every_.push_back(e);
    }
    return sel_.LeastShared(every_, all_);
  }

 private:
  const HostModel& model_;
  Selection& sel_;
  std::vector<size_t> cursors_[3];
  size_t all_ = 0;
  std::vector<size_t> every_;  // 0..n-1, made when first needed with sharing
};

std::vector<Target> ResolveTargets(const HostModel& model, const AllocationRequest& request) {
  std::vector<Target> targets;
  std::vector<size_t> accels;
  for (const PciAddress& pci : request.target_accelerators) {
    if (auto a = model.FindAccelerator(pci)) accels.push_back(*a);
  }
  std::sort(accels.begin(), accels.end());
  accels.erase(std::unique(accels.begin(), accels.end()), accels.end());
  for (size_t a : accels) {
    Target t;
    for (size_t level = 0; level < 3; ++level) {
      t.groups[level] = model.AcceleratorGroup(kTiers[level], a);
    }
    targets.push_back(t);
  }
  std::vector<int> neurons = request.target_neuron_indices;
  std::sort(neurons.begin(), neurons.end());
  neurons.erase(std::unique(neurons.begin(), neurons.end()), neurons.end());
  for (int n : neurons) {
    const std::vector<size_t>& exact = model.NeuronEfas(n);
    if (exact.empty()) continue;
    // Beyond the named EFAs, the first of them stands for the device's place.
    Target t;
    t.exact = &exact;
    for (size_t level = 0; level < 3; ++level) {
      t.groups[level] = model.EfaGroup(kTiers[level], exact[0]);
    }
    targets.push_back(t);
  }
  // Spread over the topology: the first target of each switch (or root
  // complex) goes before the second target of any.
  std::vector<int> rank(targets.size());
  std::map<std::pair<int, int>, int> seen;
  for (size_t i = 0; i < targets.size(); ++i) rank[i] = seen[SpreadKey(targets[i])]++;
  std::vector<size_t> order(targets.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return rank[a] < rank[b]; });
  std::vector<Target> ordered;
  ordered.reserve(targets.size());
  for (size_t i : order) ordered.push_back(targets[i]);
  return ordered;
}

void ChooseNearTargets(const HostModel& model, std::vector<Target>& targets, int need,
                       Selection& sel) {
  // Must-include EFAs count for the target nearest to them, so that the
  // spread stays even (ties: the earlier target).
  std::vector<int> count(targets.size(), 0);
  {
    absl::flat_hash_map<size_t, size_t> by_exact;
    std::map<int, size_t> by_group[3];
    for (size_t t = targets.size(); t-- > 0;) {
      if (targets[t].exact != nullptr) {
        for (size_t e : *targets[t].exact) by_exact[e] = t;
      }
      for (size_t level = 0; level < 3; ++level) {
        if (targets[t].groups[level] >= 0) by_group[level][targets[t].groups[level]] = t;
      }
    }
    for (size_t e : sel.chosen()) {
      size_t owner = kNone;
      if (auto it = by_exact.find(e); it != by_exact.end()) owner = it->second;
      for (size_t level = 0; level < 3 && owner == kNone; ++level) {
        const int g = model.EfaGroup(kTiers[level], e);
        if (auto it = by_group[level].find(g); g >= 0 && it != by_group[level].end()) {
          owner = it->second;
        }
      }
      if (owner != kNone) ++count[owner];
    }
  }
  using Turn = std::pair<int, size_t>;  // (EFAs so far, target order)
  std::priority_queue<Turn, std::vector<Turn>, std::greater<Turn>> turns;
  for (size_t t = 0; t < targets.size(); ++t) turns.push({count[t], t});
  TierCursors cursors(model, sel);
  while (need > 0 && !turns.empty()) {
    auto [so_far, t] = turns.top();
    turns.pop();
    const size_t e = cursors.Next(targets[t]);
    if (e == kNone) break;  // nothing free anywhere
    sel.Choose(e);
    --need;
    turns.push({so_far + 1, t});
  }
}

// ---- Without targets ----------------------------------------------------

struct NodeStats {
  int depth = 0;  // root 0, NUMA node 1, root complex 2, leaf 3
  int free = 0;
  int must = 0;  // must-include EFAs (already chosen) in the subtree
  // Sharing: the uses of the subtree's least shared free EFA (a group fills
  // one layer of replicas before the next).
  int shared = std::numeric_limits<int>::max();
  size_t key = kNone;    // first accelerator likely still free, by index (= PCI order)
  size_t first = kNone;  // first free EFA
};

// Fills a request from whole groups of the placement tree.
class GroupFiller {
 public:
  GroupFiller(const HostModel& model, Selection& sel, const AllocationRequest& request)
      : tree_(model.placement_tree()), sel_(sel), stats_(tree_.size()) {
    std::vector<bool> busy(model.accelerators().size(), false);
    for (const PciAddress& pci : request.busy_accelerators) {
      if (auto a = model.FindAccelerator(pci)) busy[*a] = true;
    }
    for (size_t i = 0; i < tree_.size(); ++i) {
      for (int c : tree_[i].children) stats_[static_cast<size_t>(c)].depth = stats_[i].depth + 1;
    }
    // Children have greater indices than their parents: aggregate backwards.
    for (size_t i = tree_.size(); i-- > 0;) {
      const PlacementNode& node = tree_[i];
      NodeStats& s = stats_[i];
      if (node.children.empty()) {
        for (size_t e : node.efas) {
          if (sel.IsFree(e)) {
            s.shared = std::min(s.shared, sel.Shared(e));
            ++s.free;
            s.first = std::min(s.first, e);
          } else if (sel.IsChosen(e)) {
            ++s.must;
          }
        }
        // The accelerator plugins hand out the lowest free address first, so
        // a group whose EFAs are partly taken has probably lost its first
        // accelerators in the same proportion.
        const size_t accels = node.accelerators.size();
        if (request.busy_known) {
          for (size_t a : node.accelerators) {
            if (!busy[a]) {
              s.key = a;
              break;
            }
          }
        } else {
          const size_t likely_free =
              static_cast<size_t>(s.free + s.must) * accels / std::max<size_t>(node.efas.size(), 1);
          if (likely_free > 0) s.key = node.accelerators[accels - likely_free];
        }
      } else {
        for (int c : node.children) {
          const NodeStats& cs = stats_[static_cast<size_t>(c)];
          s.free += cs.free;
          s.must += cs.must;
          s.shared = std::min(s.shared, cs.shared);
          s.key = std::min(s.key, cs.key);
          s.first = std::min(s.first, cs.first);
        }
      }
    }
  }

  void Fill(int need) {
    if (!tree_.empty()) Descend(0, need);
  }

 private:
  const NodeStats& Stats(int node) const { return stats_[static_cast<size_t>(node)]; }

  // Preference among groups: those holding must-include EFAs, then those
  // whose least shared free EFA is least shared (with sharing, predictions
  // must not pile containers onto one group: a group's EFAs fill one layer
  // of replicas before the next), then those whose likely free accelerator
  // comes first, then PCI order.
  bool Before(int a, int b) const {
    const NodeStats& x = Stats(a);
    const NodeStats& y = Stats(b);
    return std::tuple(-x.must, x.shared, x.key, x.first) <
           std::tuple(-y.must, y.shared, y.key, y.first);
  }

  // The group strictly below `node` with at least `need` free EFAs that is
  // nearest the must-include EFAs (under the deepest group holding some),
  // then deepest, then preferred; -1 if none. Only groups that fit can
  // contain one that does. `affinity` is the depth of the deepest group
  // above holding must-include EFAs.
  struct Fit {
    int node = -1;
    int affinity = -1;
  };
  Fit BestFit(int node, int need, int affinity = -1) const {
    Fit best;
    for (int c : tree_[static_cast<size_t>(node)].children) {
      if (Stats(c).free < need) continue;
      const int a = Stats(c).must > 0 ? Stats(c).depth : affinity;
      for (Fit candidate : {Fit{c, a}, BestFit(c, need, a)}) {
        if (candidate.node < 0) continue;
        if (best.node < 0 || Better(candidate, best)) best = candidate;
      }
    }
    return best;
  }
  bool Better(const Fit& x, const Fit& y) const {
    if (x.affinity != y.affinity) return x.affinity > y.affinity;
    if (Stats(x.node).depth != Stats(y.node).depth) {
      return Stats(x.node).depth > Stats(y.node).depth;
    }
    return Before(x.node, y.node);
  }

  void Descend(int node, int need) {
    const NodeStats& s = Stats(node);
    if (need <= 0 || s.free == 0) return;
    const PlacementNode& pn = tree_[static_cast<size_t>(node)];
    if (need >= s.free) {
      TakeAll(node);
      return;
    }
    if (pn.children.empty()) {
      std::vector<size_t> free;
      for (size_t e : pn.efas) {
        if (sel_.IsFree(e)) free.push_back(e);
      }
      std::stable_sort(free.begin(), free.end(),
                       [this](size_t a, size_t b) { return sel_.Shared(a) < sel_.Shared(b); });
      for (size_t i = 0; i < free.size() && need > 0; ++i, --need) sel_.Choose(free[i]);
      return;
    }
    // The smallest group that holds the whole rest keeps it together.
    if (int fit = BestFit(node, need).node; fit >= 0) {
      Descend(fit, need);
      return;
    }
    // Else whole groups in preference order, the last one split.
    std::vector<int> kids;
    for (int c : pn.children) {
      if (Stats(c).free > 0) kids.push_back(c);
    }
    std::sort(kids.begin(), kids.end(), [this](int a, int b) { return Before(a, b); });
    for (int c : kids) {
      if (need == 0) break;
      const int take = std::min(need, Stats(c).free);
      Descend(c, take);
      need -= take;
    }
  }

  void TakeAll(int node) {
    const PlacementNode& pn = tree_[static_cast<size_t>(node)];
    for (size_t e : pn.efas) {
      if (sel_.IsFree(e)) sel_.Choose(e);
    }
    for (int c : pn.children) TakeAll(c);
  }

  const std::vector<PlacementNode>& tree_;
  Selection& sel_;
  std::vector<NodeStats> stats_;
};

}  // namespace

std::vector<std::string> ChooseEfas(const HostModel& model, const AllocationRequest& request) {
  const size_t n = model.efas().size();
  Selection sel(n);
  for (const auto& [id, uses] : request.shared) {
    if (auto e = model.FindEfa(id)) sel.SetShared(*e, uses);
  }
  std::vector<std::string> unknown_must;
  for (const std::string& id : request.must_include) {
    if (auto e = model.FindEfa(id)) {
      sel.Choose(*e);
    } else {
      unknown_must.push_back(id);
    }
  }
  std::sort(unknown_must.begin(), unknown_must.end());
  unknown_must.erase(std::unique(unknown_must.begin(), unknown_must.end()), unknown_must.end());

  std::vector<std::string> unknown_free;
  int free_count = 0;
  for (const std::string& id : request.available) {
    if (auto e = model.FindEfa(id)) {
      if (!sel.IsFree(*e) && !sel.IsChosen(*e)) ++free_count;
      sel.MarkFree(*e);
    } else if (!std::binary_search(unknown_must.begin(), unknown_must.end(), id)) {
      unknown_free.push_back(id);
    }
  }

  int need = request.size - static_cast<int>(sel.chosen().size() + unknown_must.size());
  if (need > 0 && need >= free_count) {
    for (size_t e = 0; e < n; ++e) {
      if (sel.IsFree(e)) sel.Choose(e);
    }
    need -= free_count;
  } else if (need > 0) {
    std::vector<Target> targets = ResolveTargets(model, request);
    if (!targets.empty()) {
      ChooseNearTargets(model, targets, need, sel);
    } else {
      GroupFiller(model, sel, request).Fill(need);
    }
    need = 0;
  }

  std::vector<size_t>& chosen = sel.chosen();
  std::sort(chosen.begin(), chosen.end());
  std::vector<std::string> result;
  result.reserve(chosen.size() + unknown_must.size());
  for (size_t e : chosen) result.push_back(model.efas()[e].id);
  std::vector<std::string> extra = std::move(unknown_must);
  if (need > 0) {
    std::sort(unknown_free.begin(), unknown_free.end());
    unknown_free.erase(std::unique(unknown_free.begin(), unknown_free.end()), unknown_free.end());
    for (size_t i = 0; i < unknown_free.size() && need > 0; ++i, --need) {
      extra.push_back(unknown_free[i]);
    }
    std::sort(extra.begin(), extra.end());
  }
  result.insert(result.end(), extra.begin(), extra.end());
  return result;
}

}  // namespace efa::topology
