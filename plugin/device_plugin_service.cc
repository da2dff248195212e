#include "plugin/device_plugin_service.h"

#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <map>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "plugin/alignment/cdi_spec.h"
#include "topology/replica_id.h"

namespace efa::plugin {
namespace {

// Device IDs come from the kubelet; quote them so odd bytes stay visible.
std::string QuoteId(const std::string& id) {
  constexpr size_t kMax = 64;
  std::string shown = absl::CHexEscape(id.substr(0, kMax));
  return absl::StrCat("\"", shown, id.size() > kMax ? "...\"" : "\"");
}

grpc::Status ToGrpc(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

v1beta1::ListAndWatchResponse BuildList(const topology::DeviceTable& table, bool report_numa) {
  v1beta1::ListAndWatchResponse list;
  for (const topology::EfaDevice& d : table.devices) {
    for (std::string& id : table.Ids(d)) {
      v1beta1::Device* out = list.add_devices();
      out->set_id(std::move(id));
      out->set_health(d.healthy() ? kHealthy : kUnhealthy);
      if (report_numa && d.numa_node) out->mutable_topology()->add_nodes()->set_id(*d.numa_node);
    }
  }
  return list;
}

}  // namespace

namespace {

topology::AllocationRequest PolicyRequest(const Targets& targets) {
  topology::AllocationRequest r;
  r.target_accelerators = targets.pci;
  r.target_neuron_indices = targets.neuron_indices;
  r.busy_known = targets.busy_known;
  r.busy_accelerators = targets.busy;
  return r;
}

// PreferredDevices with replicas > 1: the policy picks physical EFAs, in
// rounds, from those with a free replica not yet in the answer.
std::vector<std::string> PreferredReplicas(
    const topology::DeviceTable& table, const v1beta1::ContainerPreferredAllocationRequest& request,
    const Targets& targets) {
  std::map<const topology::EfaDevice*, std::map<int, std::string>> free;  // by replica
  for (const std::string& id : request.available_deviceids()) {
    const topology::EfaDevice* d = table.Find(id);
    if (d != nullptr && d->healthy()) free[d][topology::ParseReplicaId(id)->replica] = id;
  }
  std::vector<std::string> answer;
  std::vector<std::string> must;  // their EFAs
  for (const std::string& id : request.must_include_deviceids()) {
    if (std::find(answer.begin(), answer.end(), id) != answer.end()) continue;
    answer.push_back(id);
    if (const topology::EfaDevice* d = table.Find(id)) {
      free[d].erase(topology::ParseReplicaId(id)->replica);
      must.push_back(d->ibdev);
    }
  }
  int need = request.allocation_size() - static_cast<int>(answer.size());
  for (bool first = true; need > 0; first = false) {
    topology::AllocationRequest r = PolicyRequest(targets);
    for (const auto& [d, replicas] : free) {
      if (replicas.empty()) continue;
      r.available.push_back(d->ibdev);
      r.shared[d->ibdev] = table.replicas - static_cast<int>(replicas.size());
    }
    if (r.available.empty()) break;
    if (first) r.must_include = must;  // near them, and other EFAs first
    std::sort(r.must_include.begin(), r.must_include.end());
    r.must_include.erase(std::unique(r.must_include.begin(), r.must_include.end()),
                         r.must_include.end());
    r.size = need + static_cast<int>(r.must_include.size());
    int got = 0;
    for (const std::string& ibdev : topology::ChooseEfas(*table.model, r)) {
      if (std::binary_search(r.must_include.begin(), r.must_include.end(), ibdev)) continue;
      auto it = free.find(table.FindPhysical(ibdev));
      if (it == free.end() || it->second.empty()) continue;
      answer.push_back(it->second.begin()->second);
      it->second.erase(it->second.begin());
      ++got;
    }
    if (got == 0 && !first) break;  // (the first round may offer only must-include EFAs)
    need -= got;
  }
  return answer;
}

}  // namespace

std::vector<std::string> PreferredDevices(
    const topology::DeviceTable& table, const v1beta1::ContainerPreferredAllocationRequest& request,
    const Targets& targets) {
  if (table.replicas > 1) return PreferredReplicas(table, request, targets);
  topology::AllocationRequest r = PolicyRequest(targets);
  for (const std::string& id : request.available_deviceids()) {
    if (const auto* d = table.Find(id); d != nullptr && d->healthy()) r.available.push_back(id);
  }
  r.must_include.assign(request.must_include_deviceids().begin(),
                        request.must_include_deviceids().end());
  r.size = request.allocation_size();
  return topology::ChooseEfas(*table.model, r);
}

absl::StatusOr<v1beta1::ContainerAllocateResponse> AllocateContainer(
    const topology::DeviceTable& table, const v1beta1::ContainerAllocateRequest& request) {
  if (request.devices_ids().empty()) {
    return absl::InvalidArgumentError("the container request names no devices");
  }
  std::vector<const topology::EfaDevice*> chosen;
  absl::flat_hash_set<std::string> seen;
  for (const std::string& id : request.devices_ids()) {
    const topology::EfaDevice* d = table.Find(id);
    if (d == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown device ", QuoteId(id), ": not an EFA of this node"));
    }
    if (!seen.insert(id).second) {
      return absl::InvalidArgumentError(absl::StrCat("device ", QuoteId(id), " requested twice"));
    }
    if (!d->healthy()) {
      return absl::FailedPreconditionError(
          absl::StrCat("device ", QuoteId(id), " is unhealthy: ", d->health_problem));
    }
    // Replicas of one EFA: its device node once.
    if (std::find(chosen.begin(), chosen.end(), d) == chosen.end()) chosen.push_back(d);
  }
  std::sort(chosen.begin(), chosen.end(), [](auto* a, auto* b) { return a->pci < b->pci; });
  v1beta1::ContainerAllocateResponse response;
  std::vector<std::string> names, addresses;
  for (const topology::EfaDevice* d : chosen) {
    v1beta1::DeviceSpec* spec = response.add_devices();
    spec->set_container_path("/dev/infiniband/" + d->uverbs);
    spec->set_host_path(d->uverbs_path);
    spec->set_permissions("rw");
    names.push_back(d->ibdev);
    addresses.push_back(d->pci.ToString());
  }
  (*response.mutable_envs())[kEnvDevices] = absl::StrJoin(names, ",");
  (*response.mutable_envs())[kEnvPciAddresses] = absl::StrJoin(addresses, ",");
  (*response.mutable_envs())[kEnvSharingReplicas] = absl::StrCat(table.replicas);
  return response;
}

absl::StatusOr<v1beta1::ContainerAllocateResponse> AllocateContainerLate(
    const topology::DeviceTable& table, const v1beta1::ContainerAllocateRequest& request,
    CdiHandover handover, std::string_view resource) {
  if (auto checked = AllocateContainer(table, request); !checked.ok()) return checked.status();
  v1beta1::ContainerAllocateResponse response;
  const std::string claim = ClaimName(
      std::vector<std::string>(request.devices_ids().begin(), request.devices_ids().end()),
      resource);
  if (handover != CdiHandover::kAnnotation) {
    response.add_cdi_devices()->set_name(CdiDeviceName(claim));
  }
  if (handover != CdiHandover::kCdiDevices) {
    (*response.mutable_annotations())[CdiAnnotationKey(claim)] = CdiDeviceName(claim);
  }
  return response;
}

// One ListAndWatch stream: writes the current list, then each newer one.
// Lives until OnDone; all state is guarded by the service's mutex.
class DevicePluginService::Stream : public grpc::ServerWriteReactor<v1beta1::ListAndWatchResponse> {
 public:
  Stream(DevicePluginService* service, uint64_t registration)
      : service_(service), registration_(registration) {}
  uint64_t registration() const { return registration_; }
  // For the service's loops over its streams, which hold mu_: clang's
  // analysis cannot tell that service_ is the service itself.
  void AssertServiceLocked() const ABSL_ASSERT_EXCLUSIVE_LOCK(service_->mu_) {
    service_->mu_.AssertHeld();
  }

  // Starts a write of the service's current list, or finishes if asked to.
  void Pump() ABSL_EXCLUSIVE_LOCKS_REQUIRED(service_->mu_) {
    if (writing_ || finished_) return;
    if (finish_requested_) {
      finished_ = true;
      Finish(grpc::Status::OK);
      return;
    }
    if (in_flight_ == service_->list_) return;
    in_flight_ = service_->list_;
    writing_ = true;
    StartWrite(in_flight_.get());
  }
  void RequestFinish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(service_->mu_) {
    finish_requested_ = true;
    Pump();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&service_->mu_);
    writing_ = false;
    if (!ok) finish_requested_ = true;  // the kubelet is gone
    Pump();
  }
  void OnCancel() override {
    absl::MutexLock lock(&service_->mu_);
    RequestFinish();
  }
  void OnDone() override {
    service_->StreamDone(this);
    delete this;
  }

 private:
  DevicePluginService* const service_;
  const uint64_t registration_;
  std::shared_ptr<const v1beta1::ListAndWatchResponse> in_flight_;
  bool writing_ = false;
  bool finish_requested_ = false;
  bool finished_ = false;
};

DevicePluginService::DevicePluginService(Options options)
    : options_(options),
      table_(std::make_shared<topology::DeviceTable>(std::vector<topology::EfaDevice>{}, nullptr,
                                                     options.replicas)),
      list_(std::make_shared<v1beta1::ListAndWatchResponse>()) {}

DevicePluginService::~DevicePluginService() {
  Shutdown();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](absl::flat_hash_set<Stream*>* s) { return s->empty(); }, &streams_));
}

void DevicePluginService::SetDevices(std::vector<topology::EfaDevice> devices,
                                     std::shared_ptr<const topology::HostModel> model,
                                     bool model_pending) {
  auto built = std::make_shared<topology::DeviceTable>(std::move(devices), std::move(model),
                                                       options_.replicas);
  built->model_pending = model_pending;
  std::shared_ptr<const topology::DeviceTable> table = std::move(built);
  auto list = std::make_shared<const v1beta1::ListAndWatchResponse>(
      BuildList(*table, options_.report_numa));
  absl::MutexLock lock(&mu_);
  table_ = std::move(table);
  if (google::protobuf::util::MessageDifferencer::Equals(*list, *list_)) return;
  list_ = std::move(list);
  PumpStreamsLocked();
}

void DevicePluginService::PumpStreamsLocked() {
  for (Stream* s : streams_) {
    s->AssertServiceLocked();
    s->Pump();
  }
}

void DevicePluginService::Resend() {
  absl::MutexLock lock(&mu_);
  // A stream sends whenever list_ is another object (Stream::Pump).
  list_ = std::make_shared<const v1beta1::ListAndWatchResponse>(*list_);
  PumpStreamsLocked();
}

v1beta1::ListAndWatchResponse DevicePluginService::CurrentList() const {
  absl::MutexLock lock(&mu_);
  return *list_;
}

std::shared_ptr<const topology::DeviceTable> DevicePluginService::table() const {
  absl::MutexLock lock(&mu_);
  return table_;
}

std::shared_ptr<const topology::DeviceTable> DevicePluginService::TableWithModel() const {
  absl::MutexLock lock(&mu_);
  // Only right after start or a change of the EFAs: the daemon registers
  // before loading hwloc, and an admission that comes meanwhile waits the
  // few milliseconds for it rather than be placed without the PCI tree.
  mu_.AwaitWithTimeout(absl::Condition(this, &DevicePluginService::ModelReady),
                       absl::FromChrono(kModelWait));
  return table_;
}

void DevicePluginService::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  for (Stream* s : streams_) {
    s->AssertServiceLocked();
    s->RequestFinish();
  }
}

void DevicePluginService::BeginRegistration() {
  absl::MutexLock lock(&mu_);
  ++registration_;
}

void DevicePluginService::SetTargetFinder(TargetFinder finder) {
  target_finder_ = std::move(finder);
}

void DevicePluginService::SetLateBinding(PreStartBinder binder, CdiHandover handover) {
  binder_ = std::move(binder);
  handover_ = handover;
}

void DevicePluginService::SetStreamEndCallback(std::function<void()> callback) {
  on_stream_end_ = std::move(callback);
}

int DevicePluginService::open_streams() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(streams_.size());
}

void DevicePluginService::StreamDone(Stream* stream) {
  bool notify;
  {
    absl::MutexLock lock(&mu_);
    streams_.erase(stream);
    notify = !shutdown_ && stream->registration() == registration_;
  }
  if (notify && on_stream_end_) on_stream_end_();
}

v1beta1::DevicePluginOptions DevicePluginService::PluginOptions() const {
  v1beta1::DevicePluginOptions options;
  options.set_pre_start_required(binder_ != nullptr);
  options.set_get_preferred_allocation_available(true);
  return options;
}

grpc::ServerUnaryReactor* DevicePluginService::GetDevicePluginOptions(
    grpc::CallbackServerContext* context, const v1beta1::Empty*,
    v1beta1::DevicePluginOptions* response) {
  RpcTimer timer(rpc_observer_, RpcMethod::kGetDevicePluginOptions);
  *response = PluginOptions();
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<v1beta1::ListAndWatchResponse>* DevicePluginService::ListAndWatch(
    grpc::CallbackServerContext*, const v1beta1::Empty*) {
  absl::MutexLock lock(&mu_);
  auto* stream = new Stream(this, registration_);
  streams_.insert(stream);
  stream->AssertServiceLocked();
  if (shutdown_) {
    stream->RequestFinish();
  } else {
    stream->Pump();
  }
  return stream;
}

grpc::ServerUnaryReactor* DevicePluginService::GetPreferredAllocation(
    grpc::CallbackServerContext* context, const v1beta1::PreferredAllocationRequest* request,
    v1beta1::PreferredAllocationResponse* response) {
  // Never fails: unknown IDs are ignored and a short list is fine (the
  // kubelet fills any shortfall itself).
  RpcTimer timer(rpc_observer_, RpcMethod::kGetPreferredAllocation);
  auto devices = TableWithModel();
  // With late binding the IDs are only counted: no need to learn targets.
  Targets targets = target_finder_ && !binder_ ? target_finder_(*devices->model) : Targets{};
  for (const auto& req : request->container_requests()) {
    auto* out = response->add_container_responses();
    for (std::string& id : PreferredDevices(*devices, req, targets)) {
      out->add_deviceids(std::move(id));
    }
  }
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* DevicePluginService::Allocate(grpc::CallbackServerContext* context,
                                                        const v1beta1::AllocateRequest* request,
                                                        v1beta1::AllocateResponse* response) {
  RpcTimer timer(rpc_observer_, RpcMethod::kAllocate);
  auto devices = table();
  auto* reactor = context->DefaultReactor();
  v1beta1::AllocateResponse result;
  // One EFA is never given to two containers: an ID in two container
  // requests of one call is refused as a repeat within one container is.
  absl::flat_hash_set<std::string> requested;
  for (int i = 0; i < request->container_requests_size(); ++i) {
    const v1beta1::ContainerAllocateRequest& req = request->container_requests(i);
    auto container = binder_
                         ? AllocateContainerLate(*devices, req, handover_, options_.resource_name)
                         : AllocateContainer(*devices, req);
    for (const std::string& id : req.devices_ids()) {
      if (!container.ok()) break;
      if (!requested.insert(id).second) {
        container = absl::InvalidArgumentError(
            absl::StrCat("device ", QuoteId(id), " requested twice (by two containers)"));
      }
    }
    if (!container.ok()) {
      grpc::Status status = ToGrpc(container.status());
      timer.set_code(status.error_code());
      reactor->Finish(std::move(status));
      return reactor;
    }
    *result.add_container_responses() = std::move(*container);
  }
  if (rpc_observer_) {
    for (const auto& c : request->container_requests()) {
      if (binder_) {  // the IDs are tokens: no EFA is chosen yet
        rpc_observer_->ContainerAllocated(static_cast<size_t>(c.devices_ids_size()));
        continue;
      }
      // With sharing, two replicas of one EFA give it once: count EFAs.
      const std::vector<std::string> efas =
          devices->PhysicalEfas({c.devices_ids().begin(), c.devices_ids().end()});
      rpc_observer_->ContainerAllocated(efas.size());
      for (const std::string& efa : efas) rpc_observer_->EfaAllocated(efa);
    }
  }
  *response = std::move(result);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* DevicePluginService::PreStartContainer(
    grpc::CallbackServerContext* context, const v1beta1::PreStartContainerRequest* request,
    v1beta1::PreStartContainerResponse*) {
  RpcTimer timer(rpc_observer_, RpcMethod::kPreStartContainer);
  auto* reactor = context->DefaultReactor();
  if (binder_) {
    std::vector<std::string> ids(request->devices_ids().begin(), request->devices_ids().end());
    if (absl::Status bound = binder_(*TableWithModel(), ids); !bound.ok()) {
      grpc::Status status = ToGrpc(bound);
      timer.set_code(status.error_code());
      reactor->Finish(std::move(status));
      return reactor;
    }
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace efa::plugin
