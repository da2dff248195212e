#include "test/lifecycle/lifecycle_node.h"

namespace efa::lifecycle {

namespace {

// The sockets on this machine whose local port is `port` (/proc/net/tcp and
// tcp6), with their TCP state and the processes that hold them: "LISTEN
// 127.0.0.1 (pid 12, efa-k8s-device-pl)" or "none"; for a daemon that
// cannot bind its probe address.
std::string PortHolders(int port) {
  static constexpr const char* kStates[] = {
      "?",     "ESTABLISHED", "SYN_SENT", "SYN_RECV", "FIN_WAIT1", "FIN_WAIT2",   "TIME_WAIT",
      "CLOSE", "CLOSE_WAIT",  "LAST_ACK", "LISTEN",   "CLOSING",   "NEW_SYN_RECV"};
  std::map<std::string, std::string> by_inode;  // socket inode -> what
  std::vector<std::string> found;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (f.size() < 10) continue;
      const std::vector<std::string> local = absl::StrSplit(f[1], ':');
      unsigned local_port = 0, state = 0;
      if (local.size() != 2 || !absl::SimpleHexAtoi(local[1], &local_port) ||
          static_cast<int>(local_port) != port || !absl::SimpleHexAtoi(f[3], &state)) {
        continue;
      }
      const std::string what = absl::StrCat(state < std::size(kStates) ? kStates[state] : "?", " ",
                                            local[0], " to ", f[2]);
      if (f[9] == "0") {
        found.push_back(what + " (no process)");
      } else {
        by_inode[absl::StrCat("socket:[", f[9], "]")] = what;
      }
    }
  }
  std::error_code ec;
  for (fs::directory_iterator proc("/proc", ec), end; !ec && proc != end; proc.increment(ec)) {
    const std::string pid = proc->path().filename().string();
    if (by_inode.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::error_code fd_ec;
    for (fs::directory_iterator fd(proc->path() / "fd", fd_ec); !fd_ec && fd != end;
         fd.increment(fd_ec)) {
      std::error_code link_ec;
      const auto it = by_inode.find(fs::read_symlink(fd->path(), link_ec).string());
      if (link_ec || it == by_inode.end()) continue;
      std::string comm = efa::testing::ReadFile(proc->path() / "comm");
      comm.erase(comm.find_last_not_of('\n') + 1);
      found.push_back(absl::StrCat(it->second, " (pid ", pid, ", ", comm, ")"));
    }
  }
  return found.empty() ? "none" : absl::StrJoin(found, "; ");
}

}  // namespace

// A configuration drawn from `bits` (a step's shape): any alignment mode,
// replicas 1, 2 or 4, renamed or not, any CDI handover that the kubelet
// passes on (kubelet 1.20 has no cdi_devices field: it drops it, so there
// only the annotation reaches the runtime).
DaemonConfig DrawConfig(uint32_t bits, bool kubelet_1_20) {
  static constexpr const char* kAlignments[] = {"best-effort", "late-binding", "off"};
  static constexpr int kReplicas[] = {1, 1, 2, 4};
  static constexpr const char* kHandovers[] = {"both", "annotation", "cdi-devices"};
  DaemonConfig c;
  c.alignment = kAlignments[bits % 3];
  bits /= 3;
  c.replicas = kReplicas[bits % 4];
  bits /= 4;
  c.rename = bits % 2 == 1;
  bits /= 2;
  c.handover = kHandovers[bits % (kubelet_1_20 ? 2 : 3)];
  return c;
}

FakeKubelet::Options KubeletOptions(const fs::path& kubelet_dir, bool kubelet_1_20) {
  FakeKubelet::Options options = FakeKubelet::ForKubeletDir(kubelet_dir);
  options.kubelet_1_20 = kubelet_1_20;
  return options;
}

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

std::string Nodes(const std::vector<std::string>& nodes) {
  std::vector<std::string> names;
  for (const std::string& n : nodes) names.push_back(fs::path(n).filename().string());
  return names.empty() ? "none" : absl::StrJoin(names, ",");
}

void Node::FindEfas() {
  // The simulated machine names its EFAs as udev does; the kernel's names
  // follow PCI order (efa_0, efa_1, ...).
  std::vector<std::pair<std::string, Efa>> by_pci;
  for (const auto& entry : fs::directory_iterator(sim_.sys() / "class/infiniband_verbs")) {
    if (!entry.is_directory()) continue;
    Efa efa;
    efa.udev_name = efa::testing::ReadFile(entry.path() / "ibdev");
    efa.udev_name.erase(efa.udev_name.find_last_not_of('\n') + 1);
    const std::string name = entry.path().filename().string();
    if (!absl::SimpleAtoi(name.substr(6), &efa.uverbs)) continue;
    const fs::path pci = fs::canonical(entry.path() / "device");
    efa.ib_dir = pci / "infiniband";
    by_pci.emplace_back(pci.filename().string(), efa);
  }
  std::sort(by_pci.begin(), by_pci.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [pci, efa] : by_pci) {
    efa.kernel_name = absl::StrCat("efa_", efas_.size());
    efas_.push_back(efa);
  }
}

std::optional<Violation> Node::StartDaemon() {
  std::vector<std::string> args = {binary_};
  for (const std::string& flag : sim_.DaemonFlags()) args.push_back(flag);
  for (const std::string& flag :
       {std::string("--log-level"), std::string("info"), std::string("--metrics-address"),
        std::string(""), std::string("--probe-address"), absl::StrCat("127.0.0.1:", port_),
        std::string("--cdi-dir"), cdi_dir_.string()}) {
    args.push_back(flag);
  }
  for (const std::string& flag : daemon_config_.Flags()) args.push_back(flag);
  log_path_ = (sim_.path() / "daemon.log").string();
  {
    std::ofstream log(log_path_, std::ios::app);
    log << "=== efa-lifecycle, step " << step_ << ": " << absl::StrJoin(args, " ") << "\n";
  }
  const std::string resource = daemon_config_.resource();
  const int before = kubelet_.registrations(resource);
  // In a process group of its own, as a container's processes are its own
  // (StopDaemon).
  daemon_ = std::make_unique<ChildProcess>(args, log_path_, 0, /*own_group=*/true);
  // Waits in slices to see the daemon exit at once (who holds its probe
  // port is worth knowing then, not 10 s later).
  const auto deadline = Clock::now() + kDeadline;
  bool registered = false;
  int exited = -1;
  while (!registered && exited < 0 && Clock::now() < deadline) {
    registered = kubelet_.WaitForRegistrations(resource, before + 1, 100ms);
    if (!registered) exited = daemon_->Wait(0ms);
  }
  const std::string holders = exited >= 0 ? PortHolders(port_) : "";
  if (!registered || !kubelet_.WaitForStreaming(resource, true, kDeadline)) {
    return Violation{
        "registers",
        absl::StrCat("the daemon (", on_base() ? "base binary, " : "", daemon_config_.Describe(),
                     ") did not register ", resource, " within 10 s of its start",
                     exited >= 0 ? absl::StrCat(": it exited with status ", exited) : "",
                     " (its probe port ", port_, ": ", exited >= 0 ? holders : PortHolders(port_),
                     ")")};
  }
  probes_.Expect(true);
  gone_clock_ = Clock::now();
  return std::nullopt;
}

std::optional<Violation> Node::RestartDaemon(int signal, const std::string& binary,
                                             const DaemonConfig& next) {
  std::map<std::string, Resolved> before;
  for (const auto& [pod, c] : Running()) before[absl::StrCat(pod->uid, "/", c->name)] = Resolve(*c);
  // action_ is the step's event so far.
  const std::string change = absl::StrCat(
      binary != binary_ ? absl::StrCat("base ", config_.base_commit, " -> this tree, ")
                        : (on_base() ? "base binary, " : ""),
      daemon_config_.Describe(), next == daemon_config_ ? "" : " -> " + next.Describe());
  action_ += absl::StrCat(" (", change, ")");
  if (auto v = StopDaemon(signal)) return v;
  restarts_.push_back(absl::StrCat("step ", step_, ": ", action_));
  binary_ = binary;
  daemon_config_ = next;
  snapshot_ = std::move(before);
  return StartDaemon();
}

std::optional<Violation> Node::StopDaemon(int signal) {
  probes_.Expect(false);
  daemon_->Signal(signal);
  const int status = daemon_->Wait(kDeadline);
  // What the daemon started ends with it, as in its container (its PID 1's
  // end kills the rest of its PID namespace; runc kills a hostPID
  // container's cgroup), before the next one starts: a hwloc export helper
  // that a SIGKILL left between fork and exec held a copy of the daemon's
  // descriptors, its probe listener too, so the next daemon's bind failed
  // (EADDRINUSE).
  daemon_->KillGroup();
  daemon_.reset();
  if (signal == SIGTERM && status != 0) {
    return Violation{"stops cleanly",
                     absl::StrCat("SIGTERM ended the daemon with status ", status)};
  }
  return std::nullopt;
}

std::vector<std::pair<const Pod*, const Container*>> Node::Running() const {
  std::vector<std::pair<const Pod*, const Container*>> running;
  for (const Pod& pod : pods_) {
    for (const Container& c : pod.containers) {
      if (c.state == Container::State::kRunning && c.efas > 0) running.emplace_back(&pod, &c);
    }
  }
  return running;
}

std::optional<Violation> Node::Apply(const Step& step, size_t number) {
  step_ = number;
  action_ = Info(step.event).name;
  ++counts[action_];
  // Picks one of `n` things (nullopt when there is none).
  auto pick = [&](size_t n) -> std::optional<size_t> {
    if (n == 0) return std::nullopt;
    return step.pick % n;
  };
  // The containers in `state` (init ones or not), across pods.
  auto containers = [&](std::initializer_list<Container::State> states, std::optional<bool> init) {
    std::vector<std::pair<Pod*, Container*>> found;
    for (Pod& pod : pods_) {
      for (Container& c : pod.containers) {
        if (std::find(states.begin(), states.end(), c.state) != states.end() &&
            (!init || c.init == *init)) {
          found.emplace_back(&pod, &c);
        }
      }
    }
    return found;
  };
  auto efas = [&](bool present) {
    std::vector<Efa*> found;
    for (Efa& e : efas_) {
      if (e.present == present) found.push_back(&e);
    }
    return found;
  };
  auto skip = [&](const char* why) -> std::optional<Violation> {
    action_ += absl::StrCat(" (skipped: ", why, ")");
    --counts[Info(step.event).name];
    return std::nullopt;
  };

  if (on_base() && (step.event == Event::kRestartDaemon || step.event == Event::kKillDaemon ||
                    step.event == Event::kReconfigure)) {
    return skip("on the base binary, which is only upgraded");
  }
  switch (step.event) {
    case Event::kAdmit:
    case Event::kAdmitWithInit:
      if (!synced_) return skip("pods not synced");
      return Admit(step, step.event == Event::kAdmitWithInit);
    case Event::kFinishInit: {
      if (!synced_) return skip("pods not synced");
      auto inits = containers({Container::State::kRunning}, true);
      auto chosen = pick(inits.size());
      if (!chosen) return skip("no init container running");
      auto [pod, init] = inits[*chosen];
      init->state = Container::State::kDone;
      action_ += absl::StrCat(" ", pod->uid);
      for (Container& c : pod->containers) {
        if (c.state == Container::State::kWaitingForInit) return Start(*pod, c);
      }
      return std::nullopt;
    }
    case Event::kRestartContainer: {
      if (!synced_) return skip("pods not synced");
      auto started =
          containers({Container::State::kRunning, Container::State::kStartFailed}, std::nullopt);
      auto chosen = pick(started.size());
      if (!chosen) return skip("no container");
      auto [pod, c] = started[*chosen];
      action_ += absl::StrCat(" ", pod->uid, "/", c->name);
      return Start(*pod, *c);
    }
    case Event::kDeletePod: {
      auto chosen = pick(pods_.size());
      if (!chosen) return skip("no pod");
      const std::string uid = pods_[*chosen].uid;
      action_ += " " + uid;
      RecordGone(pods_[*chosen]);
      pods_.erase(pods_.begin() + static_cast<std::ptrdiff_t>(*chosen));
      if (absl::Status s = kubelet_.RemovePod(uid, FakeKubelet::CheckpointWrite::kAsKubelet);
          !s.ok()) {
        return Violation{"harness", std::string(s.message())};
      }
      return std::nullopt;
    }
    case Event::kRestartKubelet:
      return RestartKubelet();
    case Event::kSyncPods:
      if (synced_) return skip("pods synced");
      kubelet_.SyncPods();
      synced_ = true;
      gone_clock_ = Clock::now();
      return std::nullopt;
    case Event::kRestartDaemon:
    case Event::kKillDaemon:
      return RestartDaemon(step.event == Event::kRestartDaemon ? SIGTERM : SIGKILL, binary_,
                           daemon_config_);
    case Event::kReconfigure:
      // A helm upgrade with changed values: the chart's config checksum
      // restarts the daemon (SIGTERM) under the new flags.
      return RestartDaemon(SIGTERM, binary_, DrawConfig(step.shape, config_.kubelet_1_20));
    case Event::kUpgrade:
      // A helm upgrade to this tree's version, with changed values or not.
      if (!on_base()) return skip("upgraded already");
      return RestartDaemon(
          SIGTERM, efa::testing::kPluginBinary,
          step.pick % 2 == 0 ? daemon_config_ : DrawConfig(step.shape, config_.kubelet_1_20));
    case Event::kRemoveEfa: {
      auto present = efas(true);
      auto chosen = pick(present.size());
      if (!chosen) return skip("none present");
      RemoveEfa(*present[*chosen]);
      return std::nullopt;
    }
    case Event::kReturnEfa:
    case Event::kReturnEfaRenamed: {
      auto removed = efas(false);
      auto chosen = pick(removed.size());
      if (!chosen) return skip("none removed");
      ReturnEfa(*removed[*chosen], step.event == Event::kReturnEfaRenamed);
      return std::nullopt;
    }
    case Event::kFillFds:
      return FillFds();
    case Event::kCdiReadOnly:
      if (!daemon_config_.late() || read_only_by == ReadOnlyBy::kNone)
        return skip("no late binding");
      if (read_only_) return skip("read-only already");
      SetCdiReadOnly(true);
      return std::nullopt;
    case Event::kCdiWritable: {
      if (!read_only_) return skip("writable already");
      SetCdiReadOnly(false);
      // The kubelet retries a container that failed to start (back-off).
      if (!synced_) return std::nullopt;
      for (auto [pod, c] : containers({Container::State::kStartFailed}, std::nullopt)) {
        if (auto v = Start(*pod, *c)) return v;
      }
      return std::nullopt;
    }
  }
  return std::nullopt;
}

std::optional<Violation> Node::Admit(const Step& step, bool with_init) {
  const Shape shape = kShapes[step.shape % std::size(kShapes)];
  const bool gpu_first = (step.shape / std::size(kShapes)) % 2 == 0;
  Pod pod{absl::StrCat("uid-", ++next_pod_), {}};
  const std::string name = absl::StrCat("pod-", next_pod_);
  action_ += absl::StrCat(
      " ", pod.uid, ": ", with_init ? absl::StrCat("init ", 1 + step.pick % 4, " EFA, then ") : "",
      shape.gpus, " GPU + ", shape.efas, " EFA, ", gpu_first ? "GPU" : "EFA", " first");
  // Admission allocates every container (init ones first); the container
  // starts once the init containers are done.
  std::vector<std::tuple<std::string, std::vector<std::pair<std::string, int>>,
                         FakeKubelet::ContainerOptions>>
      wanted;
  // Pods ask for the name the daemon serves now (after a rename, new pods
  // are written for it); the running ones keep theirs.
  const std::string efa = daemon_config_.resource();
  // The init container starts only once every container of the pod is
  // admitted: the kubelet's admission allocates the devices of all of them
  // (init ones first; topologymanager scope.go, allocateAlignedResources
  // over append(pod.Spec.InitContainers, pod.Spec.Containers...)) before the
  // pod worker starts any, so a pod refused because its app container does
  // not fit never started its init container (nor had it bound).
  if (with_init) {
    wanted.emplace_back(
        "init",
        std::vector<std::pair<std::string, int>>{{efa, static_cast<int>(1 + step.pick % 4)}},
        FakeKubelet::ContainerOptions{.init = true, .start = false});
  }
  std::vector<std::pair<std::string, int>> requests = {{kGpu, shape.gpus}, {efa, shape.efas}};
  if (!gpu_first) std::swap(requests[0], requests[1]);
  wanted.emplace_back("main", requests,
                      FakeKubelet::ContainerOptions{.init = false, .start = !with_init});

  for (auto& [container, asked, options] : wanted) {
    auto admitted = kubelet_.AdmitContainer(name, "default", pod.uid, container, asked, options);
    if (!admitted.ok()) {
      // The kubelet rejects a pod the node cannot hold; anything else is an
      // answer of the daemon's that rejects a pod.
      if (admitted.status().code() == absl::StatusCode::kResourceExhausted) {
        ++counts["admissions refused: node full"];
        action_ += " (refused: node full)";
        if (!pod.containers.empty()) {
          // Its init container's entries stay in the checkpoint until the
          // kubelet writes it again, as a deleted pod's do.
          RecordGone(pod);
          (void)kubelet_.RemovePod(pod.uid, FakeKubelet::CheckpointWrite::kAsKubelet);
        }
        return std::nullopt;
      }
      // What the kubelet was told of a device the answer names: it gives
      // only devices it last heard of as Healthy, but for its init
      // containers' devices, which an app container reuses whatever their
      // health (devicesToAllocate takes devicesToReuse first): the daemon
      // refuses one gone or withheld, and the pod is rejected.
      std::string told;
      const std::string message(admitted.status().message());
      if (const size_t at = message.find("device \""); at != std::string::npos) {
        const std::string id = message.substr(at + 8, message.find('"', at + 8) - at - 8);
        for (const auto& d : kubelet_.devices(efa)) {
          if (d.id() == id) {
            told = absl::StrCat(" (its latest list, as the kubelet had it, said ", id, " is ",
                                d.health(), ")");
            const bool reused = std::any_of(
                pod.containers.begin(), pod.containers.end(), [&](const Container& init) {
                  return init.init && std::count(init.ids.begin(), init.ids.end(), id) > 0;
                });
            if (reused && d.health() != "Healthy") {
              ++counts["admissions refused: an init container's Unhealthy device reused"];
              action_ += " (refused: " + id + " reused Unhealthy)";
              RecordGone(pod);
              (void)kubelet_.RemovePod(pod.uid, FakeKubelet::CheckpointWrite::kAsKubelet);
              return std::nullopt;
            }
          }
        }
      }
      return Violation{"admits", absl::StrCat(pod.uid, "/", container, " at ", Now(), ": ", message,
                                              told, "; ", LastRestart())};
    }
    Container c;
    c.name = container;
    c.init = options.init;
    c.resource = efa;
    c.admitted_when = Now();
    for (const auto& allocation : admitted->allocations) {
      if (allocation.resource != efa) continue;
      c.efas = static_cast<int>(allocation.device_ids.size());
      c.ids = allocation.device_ids;
      // What the kubelet passes to the runtime: the CDI devices field
      // (kubelet 1.28+; 1.20's API has no such field and drops it) and the
      // annotations (every kubelet; the runtime injects the CDI devices of
      // cdi.k8s.io/ keys).
      auto claim_of = [](const std::string& device) { return device.substr(device.find('=') + 1); };
      if (!config_.kubelet_1_20 && allocation.response.cdi_devices_size() > 0) {
        c.claim = claim_of(allocation.response.cdi_devices(0).name());
      }
      for (const auto& [key, value] : allocation.response.annotations()) {
        if (c.claim.empty() && absl::StartsWith(key, efa::plugin::kCdiAnnotationPrefix)) {
          c.claim = claim_of(value);
        }
      }
      for (const auto& spec : allocation.response.devices())
        c.alloc_nodes.push_back(spec.host_path());
      std::sort(c.alloc_nodes.begin(), c.alloc_nodes.end());
      c.alloc_replicas = daemon_config_.replicas;
      const auto recorded = allocation.response.envs().find(efa::plugin::kEnvSharingReplicas);
      if (recorded != allocation.response.envs().end())
        c.recorded_replicas = std::stoi(recorded->second);
    }
    pod.containers.push_back(c);
    Container& added = pod.containers.back();
    if (!options.start) {
      added.state = Container::State::kWaitingForInit;
    } else if (admitted->start_status.ok()) {
      if (auto v = Started(pod, added)) return v;
    } else {
      added.state = Container::State::kStartFailed;
      ++counts["starts failed"];
      action_ +=
          absl::StrCat(" (", container, " not started: ", admitted->start_status.message(), ")");
      if (auto v = CheckRefusal(pod, added, admitted->start_status)) return v;
    }
  }
  pods_.push_back(std::move(pod));
  Pod& admitted = pods_.back();
  if (with_init) return Start(admitted, admitted.containers.front());
  return std::nullopt;
}

std::optional<Violation> Node::Start(Pod& pod, Container& c) {
  // Whether the daemon knows the kubelet IDs of the base binary's bindings
  // of deleted pods (Gone::by_base): their claim records, looked for before
  // the start, which releases a taken-over binding with its record. (It
  // cannot learn them meanwhile: the allocation that gave this container
  // its IDs rewrote the checkpoint without the deleted pods.)
  for (Gone& g : gone_) {
    std::error_code ec;
    if (g.bound && g.by_base && !g.recorded &&
        fs::exists(cdi_dir_ / efa::plugin::ClaimRecordFileName(g.claim), ec)) {
      g.recorded = true;
    }
  }
  const absl::Status status = kubelet_.StartContainer(pod.uid, c.name);
  if (status.ok()) return Started(pod, c);
  // A start the plugin refuses leaves the container waiting: the kubelet
  // retries it, with back-off.
  c.state = Container::State::kStartFailed;
  ++counts["starts failed"];
  action_ += absl::StrCat(" (", pod.uid, "/", c.name, " not started: ", status.message(), ")");
  return CheckRefusal(pod, c, status);
}

void Node::RecordGone(const Pod& pod) {
  for (const Container& c : pod.containers) {
    const std::vector<std::string> holds = Holds(c);
    if (holds.empty()) continue;
    gone_.push_back(Gone{!c.claim.empty(), absl::StrCat(pod.uid, "/", c.name), c.resource, c.ids,
                         holds, c.Counted(), Clock::now(), "", c.claim, c.bound_by_base});
  }
  std::erase_if(gone_, [&](const Gone& g) { return !Held(g); });
}

bool Node::Held(const Gone& g) const {
  // Released: the daemon deletes the spec with the binding.
  std::error_code ec;
  if (g.bound && !fs::exists(cdi_dir_ / efa::plugin::CdiSpecFileName(g.claim), ec)) return false;
  // The daemon releases a deleted pod's binding once the kubelet's records
  // (its checkpoint and pod-resources List) have lacked its container on two
  // looks release_after apart within one run of the daemon
  // (LateBinder::ReleaseGone): a restarted daemon cannot know how long the
  // container has been gone and confirms it anew, so daemon restarts closer
  // together than release_after keep the binding (safe: only what it saw
  // itself proves a container gone). A restarted kubelet reads a deleted
  // pod's checkpoint entries back and keeps them until its pods are synced
  // (SyncPods drops them), and the daemon counts them live meanwhile. A
  // by-ID holder's entries stay until the kubelet writes the file again,
  // which the daemon asks for anew after each of these.
  return Clock::now() - std::max(g.when, gone_clock_) <= kReleaseWindow;
}

std::string Node::Now() const {
  return absl::StrCat("step ", step_, " (", on_base() ? "base binary, " : "",
                      daemon_config_.Describe(), ")");
}

std::string Node::LastRestart() const {
  return restarts_.empty() ? std::string("the daemon has not restarted")
                           : absl::StrCat("the daemon's latest restart: ", restarts_.back());
}

std::string Node::Describe(const Pod& pod, const Container& c) const {
  return absl::StrCat(
      pod.uid, "/", c.name, " (", c.efas, " ", c.resource, ", admitted at ", c.admitted_when,
      c.held.empty()
          ? ""
          : absl::StrCat(
                ", given ", Nodes(c.held), " at ", c.held_when,
                c.held_replicas > 1 ? absl::StrCat(" to share ", c.held_replicas) : " exclusively"),
      ")");
}

std::string Node::DeviceNode(const Efa& efa) const {
  return (sim_.path() / "dev/infiniband" / absl::StrCat("uverbs", efa.uverbs)).string();
}

Resolved Node::Resolve(const Container& c) const {
  Resolved r{c.alloc_nodes, ""};
  if (!c.claim.empty()) {
    const fs::path spec = cdi_dir_ / efa::plugin::CdiSpecFileName(c.claim);
    const std::string text = efa::testing::ReadFile(spec);
    const auto json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (text.empty() || json.is_discarded()) {
      r.problem = absl::StrCat(spec.string(), text.empty() ? " is missing" : " does not parse");
      return r;
    }
    for (const auto& device : json.value("devices", nlohmann::json::array())) {
      for (const auto& node :
           device["containerEdits"].value("deviceNodes", nlohmann::json::array())) {
        r.nodes.push_back(node.value("hostPath", node.value("path", "")));
      }
    }
  }
  std::sort(r.nodes.begin(), r.nodes.end());
  return r;
}

std::vector<std::string> Node::Holds(const Container& c) const {
  if (c.held.empty() && !c.claim.empty()) return Resolve(c).nodes;
  return c.holds();
}

std::optional<Violation> Node::Started(const Pod& pod, Container& c) {
  c.state = Container::State::kRunning;
  const Resolved now = Resolve(c);
  if (!now.problem.empty() && c.held.empty() &&
      (!daemon_config_.late() || c.resource != daemon_config_.resource())) {
    // Admitted under late binding, never started, and now no
    // PreStartContainer comes for it (the daemon no longer late-binds, or
    // serves the other name): the daemon binds it beforehand
    // (LateBinder::BindUnstarted, on its own passes), and cannot when every
    // EFA is held. The runtime then refuses to create it ("unresolvable CDI
    // devices"), the kubelet counts a failed start (CreateContainerError)
    // and retries it with back-off: a refusal, judged as PreStartContainer's
    // are (free EFAs and none bound is a violation).
    c.state = Container::State::kStartFailed;
    ++counts["starts failed"];
    action_ += absl::StrCat(" (", pod.uid, "/", c.name, " not created: ", now.problem, ")");
    // A spec the daemon could not write (a read-only CDI dir) is no
    // refusal for want of EFAs; it writes it at its next pass (ReleaseGone,
    // every recheck_every while bindings exist, or the next checkpoint
    // change), as the kubelet's back-off retries the start.
    if (read_only_ || Clock::now() - cdi_writable_since_ <= kReleaseWindow) return std::nullopt;
    return CheckRefusal(
        pod, c,
        absl::FailedPreconditionError(absl::StrCat(
            "the daemon did not bind it before its start (cannot bind, as its log says): ",
            now.problem)));
  }
  if (!now.problem.empty()) {
    // The runtime cannot create it ("unresolvable CDI devices").
    return Violation{
        "a container's CDI device resolves when it starts",
        absl::StrCat(Describe(pod, c), " started at ", Now(),
                     " (the kubelet let it through): ", now.problem, "; ", LastRestart())};
  }
  // A deleted pod's kubelet ID given to this container: its start let the
  // daemon release what it had bound for that pod (LateBinder::
  // ReleaseTakenOver; a start that failed may have changed nothing). Only
  // when the daemon bound this one (late-bound: PreStartContainer, or
  // BindUnstarted before its start): a container given device nodes by ID
  // (best effort, alignment off) is bound by nothing, and the deleted pod's
  // binding stays until the daemon confirms it gone (ReleaseGone).
  for (Gone& g : gone_) {
    if (c.claim.empty()) break;
    if (g.by_base && !g.recorded && !on_base()) continue;  // its IDs unknown (Gone::by_base)
    for (const std::string& id : c.ids) {
      if (g.taken_over.empty() && g.resource == c.resource &&
          std::count(g.ids.begin(), g.ids.end(), id) > 0) {
        g.taken_over = absl::StrCat(id, " to ", pod.uid, "/", c.name);
      }
    }
  }
  if (now.nodes != c.held) {
    c.held = now.nodes;
    c.held_when = Now();
    // Late-bound: shared as the daemon's replicas when it bound the claim
    // if admitted with replica IDs, else exclusive (LateBinder::Bind). It
    // may have bound it before, under another configuration (an init
    // container's claim its app container reuses, BindUnstarted): then its
    // record says (the base binary writes none).
    c.held_replicas =
        c.claim.empty() || c.alloc_replicas == 1 ? c.alloc_replicas : daemon_config_.replicas;
    if (!c.claim.empty()) {
      const fs::path record = cdi_dir_ / efa::plugin::ClaimRecordFileName(c.claim);
      if (auto parsed = efa::plugin::ParseClaimRecord(efa::testing::ReadFile(record), c.claim,
                                                      record.string());
          parsed.ok() && parsed->version == efa::plugin::kClaimRecordVersion) {
        c.held_replicas = parsed->replicas;
      }
    }
    c.bound_by_base = !c.claim.empty() && on_base();
  }
  return std::nullopt;
}

std::optional<Violation> Node::RestartKubelet() {
  const std::string resource = daemon_config_.resource();
  const int before = kubelet_.registrations(resource);
  // A plugin registers again when kubelet.sock is created anew; the GPU
  // plugin is made to, the daemon must notice by itself.
  gpus_.Stop();
  if (absl::Status s = kubelet_.Restart(); !s.ok())
    return Violation{"harness", std::string(s.message())};
  synced_ = false;
  gone_clock_ = Clock::now();
  const int calls = kubelet_.pod_resources_calls();
  if (absl::Status s = gpus_.Start(); !s.ok())
    return Violation{"harness", std::string(s.message())};
  if (!daemon_) return std::nullopt;
  if (!kubelet_.WaitForRegistrations(resource, before + 1, kDeadline) ||
      !kubelet_.WaitForStreaming(resource, true, kDeadline)) {
    return Violation{"re-registers",
                     "the daemon did not register within 10 s of a kubelet restart"};
  }
  // Let the daemon look at the empty List once (it does so when the
  // checkpoint is written), so that what it makes of it is checked now.
  kubelet_.WaitForPodResourcesCalls(calls + 1, 1s);
  return std::nullopt;
}

void Node::RemoveEfa(Efa& efa) {
  // Gone as the daemon sees a device go: the class entries and the device
  // node; the kernel counts a uevent.
  const fs::path sys = sim_.sys();
  std::error_code ec;
  fs::remove(sys / "class/infiniband" / efa.udev_name, ec);
  fs::remove(sys / "class/infiniband_verbs" / absl::StrCat("uverbs", efa.uverbs), ec);
  fs::remove(sim_.path() / "dev/infiniband" / absl::StrCat("uverbs", efa.uverbs), ec);
  (void)efa::sim::CountUevent(sim_.path().string());
  efa.present = false;
  efa.changed = Clock::now();
  action_ += " " + efa.udev_name;
}

void Node::ReturnEfa(Efa& efa, bool renamed) {
  const fs::path sys = sim_.sys();
  const std::string uverbs = absl::StrCat("uverbs", efa.uverbs);
  const fs::path verbs_dir = efa.ib_dir.parent_path() / "infiniband_verbs" / uverbs;
  // The kernel adds it under its own name; udev renames it at once.
  const std::string first = renamed ? efa.kernel_name : efa.udev_name;
  if (renamed) {
    fs::rename(efa.ib_dir / efa.udev_name, efa.ib_dir / first);
    efa::testing::WriteFile(verbs_dir / "ibdev", first + "\n");
  }
  fs::create_directory_symlink(efa.ib_dir / first, sys / "class/infiniband" / first);
  fs::create_directory_symlink(verbs_dir, sys / "class/infiniband_verbs" / uverbs);
  sim_.RestoreUverbs(efa.uverbs);  // counts a uevent
  if (renamed) {
    efa::testing::WriteFile(verbs_dir / "ibdev", efa.udev_name + "\n");
    fs::rename(efa.ib_dir / first, efa.ib_dir / efa.udev_name);
    fs::remove(sys / "class/infiniband" / first);
    fs::create_directory_symlink(efa.ib_dir / efa.udev_name,
                                 sys / "class/infiniband" / efa.udev_name);
    (void)efa::sim::CountUevent(sim_.path().string());
  }
  efa.present = true;
  efa.changed = Clock::now();
  action_ += " " + efa.udev_name + (renamed ? " (as " + efa.kernel_name + ")" : "");
}

std::optional<Violation> Node::FillFds() {
  const pid_t pid = daemon_->pid();
  // The lowest descriptor the daemon does not hold: a limit there makes its
  // next open fail with EMFILE, as a full table does.
  auto lowest_free = [pid] {
    std::set<int> held;
    std::error_code ec;
    for (fs::directory_iterator it(absl::StrCat("/proc/", pid, "/fd"), ec), end; !ec && it != end;
         it.increment(ec)) {
      int fd = 0;
      if (absl::SimpleAtoi(it->path().filename().string(), &fd)) held.insert(fd);
    }
    rlim_t free = 0;
    while (held.count(static_cast<int>(free))) ++free;
    return free;
  };
  rlimit old{};
  if (::prlimit(pid, RLIMIT_NOFILE, nullptr, &old) != 0) {
    return Violation{"harness", absl::StrCat("prlimit ", pid, ": ", std::strerror(errno))};
  }
  probes_.Pause(true);
  fd_full_begin_ = Clock::now();
  // Something for the daemon to look at while it cannot open anything: a
  // change in a directory it watches makes it list the devices again. Done
  // a few times over the window, the limit lowered to each new hole (a
  // descriptor the daemon closed meanwhile would let an open through).
  const fs::path poke = sim_.path() / "dev/infiniband/.lifecycle";
  rlimit full = {lowest_free(), old.rlim_max};
  int status = -1;
  for (int round = 0; round < 5 && status == -1; ++round) {
    full.rlim_cur = std::min(full.rlim_cur, lowest_free());
    ::prlimit(pid, RLIMIT_NOFILE, &full, nullptr);
    efa::testing::WriteFile(poke, "");
    fs::remove(poke);
    // Ended early only by the daemon's death.
    status = daemon_->Wait(std::chrono::duration_cast<std::chrono::milliseconds>(kFdWindow) / 5);
  }
  ::prlimit(pid, RLIMIT_NOFILE, &old, nullptr);
  fd_full_end_ = Clock::now();
  probes_.Pause(false);
  action_ += absl::StrCat(" (limit ", full.rlim_cur, " for ", kFdWindow.count(), " ms)");
  if (status != -1) {
    daemon_.reset();
    return Violation{"never exits", absl::StrCat("the daemon exited with status ", status,
                                                 " while its descriptor table was full")};
  }
  return std::nullopt;
}

void Node::SetCdiReadOnly(bool read_only) {
  if (read_only == read_only_) return;
  if (read_only_by == ReadOnlyBy::kBindMount) {
    if (read_only) {
      ::mount(cdi_dir_.c_str(), cdi_dir_.c_str(), nullptr, MS_BIND, nullptr);
      ::mount(nullptr, cdi_dir_.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr);
    } else {
      ::umount2(cdi_dir_.c_str(), MNT_DETACH);
    }
  } else if (read_only_by == ReadOnlyBy::kModes) {
    fs::permissions(cdi_dir_, read_only ? fs::perms::owner_read | fs::perms::owner_exec |
                                              fs::perms::group_read | fs::perms::group_exec |
                                              fs::perms::others_read | fs::perms::others_exec
                                        : fs::perms::owner_all | fs::perms::group_read |
                                              fs::perms::group_exec | fs::perms::others_read |
                                              fs::perms::others_exec);
  }
  read_only_ = read_only;
  if (!read_only) cdi_writable_since_ = Clock::now();
}

}  // namespace efa::lifecycle
