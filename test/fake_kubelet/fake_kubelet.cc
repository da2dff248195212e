#include "test/fake_kubelet/fake_kubelet.h"

#include <sys/un.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/server_context.h"
#include "nlohmann/json.hpp"
#include "podresources/v1/api.grpc.pb.h"

namespace efa::testing {

namespace fs = std::filesystem;

class FakeKubelet::RegistrationService final : public v1beta1::Registration::Service {
 public:
  explicit RegistrationService(FakeKubelet* kubelet) : kubelet_(kubelet) {}

  grpc::Status Register(grpc::ServerContext* /*context*/, const v1beta1::RegisterRequest* request,
                        v1beta1::Empty* /*response*/) override {
    return kubelet_->Register(*request);
  }

 private:
  FakeKubelet* const kubelet_;
};

namespace {

// How long Stop lets in-flight Register calls finish before gRPC cancels them.
// They have been cancelled already, so this is a backstop, not a wait.
constexpr auto kShutdownGrace = std::chrono::seconds(2);
// The kubelet's timeout for PreStartContainer.
constexpr auto kPreStartTimeout = std::chrono::seconds(30);

// An extended resource name as the kubelet's v1helper.IsExtendedResourceName
// accepts it, simplified: "<domain>/<name>", outside the kubernetes.io domains
// and not a quota "requests." name.
bool IsExtendedResourceName(const std::string& name) {
  const size_t slash = name.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == name.size() ||
      name.find('/', slash + 1) != std::string::npos) {
    return false;
  }
  const std::string domain = name.substr(0, slash);
  return !absl::EndsWith(domain, "kubernetes.io") && !absl::StartsWith(name, "requests.");
}

// The endpoint must name a file directly inside the device-plugin directory.
bool IsPlainFileName(const std::string& endpoint) {
  return !endpoint.empty() && endpoint != "." && endpoint != ".." &&
         endpoint.find('/') == std::string::npos && endpoint.find('\0') == std::string::npos;
}

std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

}  // namespace

FakeKubelet::Options FakeKubelet::ForKubeletDir(const fs::path& kubelet_dir) {
  Options options;
  options.device_plugin_dir = kubelet_dir / "device-plugins";
  options.pod_resources_socket = kubelet_dir / "pod-resources" / kSocketName;
  return options;
}

FakeKubelet::FakeKubelet(fs::path device_plugin_dir)
    : FakeKubelet(Options{std::move(device_plugin_dir), {}, false}) {}

FakeKubelet::FakeKubelet(Options options)
    : dir_(std::move(options.device_plugin_dir)),
      pod_resources_socket_(std::move(options.pod_resources_socket)),
      kubelet_1_20_(options.kubelet_1_20) {}

FakeKubelet::~FakeKubelet() {
  absl::MutexLock admission_lock(&admission_mu_);
  absl::MutexLock lock(&lifecycle_mu_);
  StopLocked();
}

absl::Status FakeKubelet::Start() {
  absl::MutexLock admission_lock(&admission_mu_);
  absl::MutexLock lock(&lifecycle_mu_);
  if (server_ != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(socket_path().string(), ": already serving"));
  }
  {
    // Before serving: a device list arriving first would overwrite the file.
    absl::MutexLock state_lock(&mu_);
    LoadCheckpointLocked();
  }
  if (absl::Status status = StartLocked(); !status.ok()) return status;
  if (!pod_resources_socket_.empty()) {
    if (absl::Status status = StartPodResourcesLocked(); !status.ok()) {
      StopLocked();
      return status;
    }
  }
  return absl::OkStatus();
}

absl::Status FakeKubelet::StartLocked() {
  const fs::path path = socket_path();
  if (server_ != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(path.string(), ": already serving"));
  }
  // sockaddr_un holds the path with its terminating NUL.
  if (path.string().size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: too long for a unix socket (%d bytes at most)", path.string(),
                        sizeof(sockaddr_un::sun_path) - 1));
  }
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(dir_.string(), ": ", ec.message()));
  }
  // A kubelet that was killed leaves its socket behind; gRPC cannot bind over it.
  fs::remove(path, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(path.string(), ": ", ec.message()));
  }

  auto service = std::make_unique<RegistrationService>(this);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + path.string(), grpc::InsecureServerCredentials());
  builder.RegisterService(service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    return absl::UnavailableError(
        absl::StrCat(path.string(), ": cannot serve gRPC here (see the gRPC log above)"));
  }
  service_ = std::move(service);
  server_ = std::move(server);
  absl::MutexLock lock(&mu_);
  serving_ = true;
  return absl::OkStatus();
}

absl::Status FakeKubelet::Restart() {
  absl::MutexLock admission_lock(&admission_mu_);
  absl::MutexLock lock(&lifecycle_mu_);
  StopLocked();
  // The device manager empties the directory on start, the plugins' sockets
  // included, and keeps the checkpoint: kubelet 1.20 (ManagerImpl.Start,
  // removeContents) deletes every file that is not a directory, later ones
  // (CleanupPluginDirectory) only sockets.
  std::error_code ec;
  if (fs::exists(dir_, ec)) {
    for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code type_ec;
      if (it->path() == checkpoint_path()) continue;
      if (kubelet_1_20_ ? it->is_directory(type_ec) : !it->is_socket(type_ec)) continue;
      std::error_code remove_ec;
      fs::remove(it->path(), remove_ec);
      if (remove_ec) {
        return absl::UnavailableError(absl::StrCat(it->path().string(), ": ", remove_ec.message()));
      }
    }
    if (ec) {
      return absl::UnavailableError(absl::StrCat(dir_.string(), ": ", ec.message()));
    }
  }
  {
    // A new kubelet process knows the allocations only from the checkpoint
    // (ManagerImpl.Start, readCheckpoint), and its pod manager is empty until
    // the API server source has synced: pod-resources List, served from
    // startKubelet on, answers from it (server_v1.go List,
    // podsProvider.GetPods()) and lists nothing until then.
    absl::MutexLock state_lock(&mu_);
    LoadCheckpointLocked();
    for (Pod& pod : pods_) unsynced_.push_back(std::move(pod));
    pods_.clear();
    pods_synced_ = false;
  }
  if (absl::Status status = StartLocked(); !status.ok()) return status;
  if (!pod_resources_socket_.empty()) {
    if (absl::Status status = StartPodResourcesLocked(); !status.ok()) {
      StopLocked();
      return status;
    }
  }
  return absl::OkStatus();
}

void FakeKubelet::Stop() {
  absl::MutexLock admission_lock(&admission_mu_);
  absl::MutexLock lock(&lifecycle_mu_);
  StopLocked();
}

void FakeKubelet::StopLocked() {
  StopPodResourcesLocked();
  {
    absl::MutexLock lock(&mu_);
    // From here on Register refuses to commit, so no stream is added.
    serving_ = false;
    for (grpc::ClientContext* context : dialing_) context->TryCancel();
  }
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
    server_->Wait();
    server_.reset();
    service_.reset();
  }

  std::vector<std::shared_ptr<Stream>> streams;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, resource] : resources_) {
      // The kubelet process is gone: so are its connections to the plugins.
      resource.stub.reset();
      if (resource.stream != nullptr) {
        resource.stream->context.TryCancel();
        streams.push_back(resource.stream);
      }
    }
    for (auto& stream : retired_) streams.push_back(std::move(stream));
    retired_.clear();
  }
  // Joined without mu_: the stream threads take it to record their end.
  for (auto& stream : streams) {
    if (stream->thread.joinable()) stream->thread.join();
  }

  std::error_code ec;
  fs::remove(socket_path(), ec);
}

void FakeKubelet::EndStream(const std::string& resource) {
  absl::MutexLock lock(&lifecycle_mu_);
  std::shared_ptr<Stream> stream;
  {
    absl::MutexLock state_lock(&mu_);
    auto it = resources_.find(resource);
    if (it == resources_.end() || it->second.stream == nullptr) return;
    stream = it->second.stream;
    stream->context.TryCancel();
  }
  if (stream->thread.joinable()) stream->thread.join();
}

grpc::Status FakeKubelet::Register(const v1beta1::RegisterRequest& request) {
  // The messages are the kubelet's own (pkg/kubelet/cm/devicemanager).
  if (request.version() != kVersion) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrFormat(
            "requested API version \"%s\" is not supported by kubelet. Supported versions are "
            "[\"%s\"]",
            request.version(), kVersion));
  }
  if (!IsExtendedResourceName(request.resource_name())) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrFormat("the ResourceName \"%s\" is invalid", request.resource_name()));
  }
  if (!IsPlainFileName(request.endpoint())) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrFormat("the endpoint \"%s\" is not a file name in %s",
                                        request.endpoint(), dir_.string()));
  }

  const fs::path endpoint = dir_ / request.endpoint();
  std::shared_ptr<v1beta1::DevicePlugin::Stub> stub = v1beta1::DevicePlugin::NewStub(
      grpc::CreateChannel("unix:" + endpoint.string(), grpc::InsecureChannelCredentials()));

  // The kubelet dials with a blocking 10 s dial and then asks for the options
  // before it answers: a plugin must serve before it registers. wait_for_ready
  // makes the call wait for the connection, as the blocking dial does.
  grpc::ClientContext context;
  context.set_wait_for_ready(true);
  {
    absl::MutexLock lock(&mu_);
    if (!serving_) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "kubelet is shutting down");
    }
    context.set_deadline(std::chrono::system_clock::now() + dial_timeout_);
    dialing_.insert(&context);
  }
  v1beta1::DevicePluginOptions options;
  const grpc::Status status = stub->GetDevicePluginOptions(&context, v1beta1::Empty(), &options);

  absl::MutexLock lock(&mu_);
  dialing_.erase(&context);
  if (!serving_) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "kubelet is shutting down");
  }
  if (!status.ok()) {
    return grpc::Status(
        grpc::StatusCode::UNAVAILABLE,
        absl::StrFormat("failed to get the device plugin options from %s: %s: %s",
                        endpoint.string(), CodeName(status.error_code()), status.error_message()));
  }

  Resource& resource = resources_[request.resource_name()];
  // The newest registration wins; the old endpoint's stream is ended.
  if (resource.stream != nullptr) {
    resource.stream->context.TryCancel();
    retired_.push_back(std::move(resource.stream));
  }
  ++resource.registrations;
  resource.last_request = request;
  resource.options = options;
  resource.stub = stub;
  // Open once the first message arrives: only then is the plugin's handler
  // surely running, so that ending the stream is something it can notice.
  resource.streaming = false;

  auto stream = std::make_shared<Stream>();
  stream->resource = request.resource_name();
  stream->stub = std::move(stub);
  // Started under mu_ and published before mu_ is released, so the thread
  // always finds itself as its resource's stream (until replaced).
  stream->thread = std::thread(&FakeKubelet::Watch, this, stream.get());
  resource.stream = std::move(stream);
  return grpc::Status::OK;
}

void FakeKubelet::Watch(Stream* stream) {
  std::unique_ptr<grpc::ClientReader<v1beta1::ListAndWatchResponse>> reader =
      stream->stub->ListAndWatch(&stream->context, v1beta1::Empty());
  v1beta1::ListAndWatchResponse response;
  while (reader->Read(&response)) {
    absl::MutexLock lock(&mu_);
    Resource& resource = resources_[stream->resource];
    // A replaced endpoint's last messages are dropped, as the kubelet does.
    if (resource.stream.get() != stream) continue;
    resource.streaming = true;
    resource.devices.assign(response.devices().begin(), response.devices().end());
    ++resource.messages;
    // The kubelet's genericDeviceUpdateCallback rewrites the checkpoint on
    // every device list, so the file also holds whatever the device manager
    // has recorded by then, a container half-way through admission included.
    if (absl::Status status = WriteCheckpointLocked(); !status.ok()) {
      std::fprintf(stderr, "fake-kubelet: %s\n", std::string(status.message()).c_str());
    }
  }
  const grpc::Status status = reader->Finish();
  absl::MutexLock lock(&mu_);
  Resource& resource = resources_[stream->resource];
  if (resource.stream.get() == stream) {
    resource.streaming = false;
    resource.last_stream_status = status;
  }
}

const FakeKubelet::Resource* FakeKubelet::FindLocked(const std::string& resource) const {
  auto it = resources_.find(resource);
  return it == resources_.end() ? nullptr : &it->second;
}

int FakeKubelet::registrations(const std::string& resource) const {
  absl::MutexLock lock(&mu_);
  const Resource* r = FindLocked(resource);
  return r == nullptr ? 0 : r->registrations;
}

bool FakeKubelet::WaitForRegistrations(const std::string& resource, int n,
                                       std::chrono::milliseconds timeout) {
  absl::MutexLock lock(&mu_);
  auto reached = [&]() {
    mu_.AssertHeld();
    const Resource* r = FindLocked(resource);
    return (r == nullptr ? 0 : r->registrations) >= n;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&reached), absl::FromChrono(timeout));
}

std::optional<v1beta1::RegisterRequest> FakeKubelet::last_request(
    const std::string& resource) const {
  absl::MutexLock lock(&mu_);
  const Resource* r = FindLocked(resource);
  return r == nullptr ? std::nullopt : r->last_request;
}

std::optional<v1beta1::DevicePluginOptions> FakeKubelet::options(
    const std::string& resource) const {
  absl::MutexLock lock(&mu_);
  const Resource* r = FindLocked(resource);
  return r == nullptr ? std::nullopt : r->options;
}

std::vector<v1beta1::Device> FakeKubelet::devices(const std::string& resource) const {
  absl::MutexLock lock(&mu_);
  const Resource* r = FindLocked(resource);
  return r == nullptr ? std::vector<v1beta1::Device>() : r->devices;
}

int FakeKubelet::list_and_watch_messages(const std::string& resource) const {
  absl::MutexLock lock(&mu_);
  const Resource* r = FindLocked(resource);
  return r == nullptr ? 0 : r->messages;
}

bool FakeKubelet::WaitForListAndWatchMessages(const std::string& resource, int n,
                                              std::chrono::milliseconds timeout) {
  absl::MutexLock lock(&mu_);
  auto reached = [&]() {
    mu_.AssertHeld();
    const Resource* r = FindLocked(resource);
    return (r == nullptr ? 0 : r->messages) >= n;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&reached), absl::FromChrono(timeout));
}

bool FakeKubelet::WaitForDevices(const std::string& resource,
                                 std::function<bool(const std::vector<v1beta1::Device>&)> pred,
                                 std::chrono::milliseconds timeout) {
  absl::MutexLock lock(&mu_);
  const std::vector<v1beta1::Device> none;
  auto holds = [&]() {
    mu_.AssertHeld();
    const Resource* r = FindLocked(resource);
    return pred(r == nullptr ? none : r->devices);
  };
  return mu_.AwaitWithTimeout(absl::Condition(&holds), absl::FromChrono(timeout));
}

bool FakeKubelet::streaming(const std::string& resource) const {
  absl::MutexLock lock(&mu_);
  const Resource* r = FindLocked(resource);
  return r != nullptr && r->streaming;
}

bool FakeKubelet::WaitForStreaming(const std::string& resource, bool open,
                                   std::chrono::milliseconds timeout) {
  absl::MutexLock lock(&mu_);
  auto reached = [&]() {
    mu_.AssertHeld();
    const Resource* r = FindLocked(resource);
    return (r != nullptr && r->streaming) == open;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&reached), absl::FromChrono(timeout));
}

std::optional<grpc::Status> FakeKubelet::last_stream_status(const std::string& resource) const {
  absl::MutexLock lock(&mu_);
  const Resource* r = FindLocked(resource);
  return r == nullptr ? std::nullopt : r->last_stream_status;
}

void FakeKubelet::SetDialTimeoutForTest(std::chrono::milliseconds timeout) {
  absl::MutexLock lock(&mu_);
  dial_timeout_ = timeout;
}

std::shared_ptr<v1beta1::DevicePlugin::Stub> FakeKubelet::StubFor(
    const std::string& resource) const {
  absl::MutexLock lock(&mu_);
  const Resource* r = FindLocked(resource);
  return r == nullptr ? nullptr : r->stub;
}

namespace {

grpc::Status NotRegistered(const std::string& resource) {
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                      absl::StrFormat("no device plugin is registered for \"%s\"", resource));
}

}  // namespace

grpc::Status FakeKubelet::Allocate(const std::string& resource, const v1beta1::AllocateRequest& req,
                                   v1beta1::AllocateResponse* resp) {
  std::shared_ptr<v1beta1::DevicePlugin::Stub> stub = StubFor(resource);
  if (stub == nullptr) return NotRegistered(resource);
  grpc::ClientContext context;
  return stub->Allocate(&context, req, resp);
}

grpc::Status FakeKubelet::GetPreferredAllocation(const std::string& resource,
                                                 const v1beta1::PreferredAllocationRequest& req,
                                                 v1beta1::PreferredAllocationResponse* resp) {
  std::shared_ptr<v1beta1::DevicePlugin::Stub> stub = StubFor(resource);
  if (stub == nullptr) return NotRegistered(resource);
  grpc::ClientContext context;
  return stub->GetPreferredAllocation(&context, req, resp);
}

grpc::Status FakeKubelet::PreStartContainer(const std::string& resource,
                                            const v1beta1::PreStartContainerRequest& req,
                                            v1beta1::PreStartContainerResponse* resp) {
  std::shared_ptr<v1beta1::DevicePlugin::Stub> stub = StubFor(resource);
  if (stub == nullptr) return NotRegistered(resource);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kPreStartTimeout);
  return stub->PreStartContainer(&context, req, resp);
}

// ---------------------------------------------------------------------------
// Pod admission

namespace {

// Go's names of the gRPC codes (codes.Code.String()).
const char* GoCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "Canceled";
    case grpc::StatusCode::UNKNOWN:
      return "Unknown";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "InvalidArgument";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DeadlineExceeded";
    case grpc::StatusCode::NOT_FOUND:
      return "NotFound";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "AlreadyExists";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PermissionDenied";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "ResourceExhausted";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FailedPrecondition";
    case grpc::StatusCode::ABORTED:
      return "Aborted";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OutOfRange";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "Unimplemented";
    case grpc::StatusCode::INTERNAL:
      return "Internal";
    case grpc::StatusCode::UNAVAILABLE:
      return "Unavailable";
    case grpc::StatusCode::DATA_LOSS:
      return "DataLoss";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "Unauthenticated";
    default:
      return "Unknown";
  }
}

// A plugin's gRPC error as the kubelet (Go) prints it.
std::string GoRpcError(const grpc::Status& status) {
  return absl::StrFormat("rpc error: code = %s desc = %s", GoCodeName(status.error_code()),
                         status.error_message());
}

absl::StatusCode ToAbslCode(grpc::StatusCode code) { return static_cast<absl::StatusCode>(code); }

// The kubelet rejects the pod with reason UnexpectedAdmissionError and this
// message (container_manager_linux.go).
absl::Status UnexpectedAdmission(const absl::Status& error) {
  return absl::Status(error.code(),
                      absl::StrCat("UnexpectedAdmissionError: Allocate failed due to ",
                                   error.message(), ", which is unexpected"));
}

// Every ID of an entry's NUMA groups, once each, in NUMA then group order.
std::vector<std::string> Flatten(const std::map<int64_t, std::vector<std::string>>& by_numa) {
  std::vector<std::string> ids;
  std::set<std::string> seen;
  for (const auto& [numa, group] : by_numa) {
    for (const auto& id : group) {
      if (seen.insert(id).second) ids.push_back(id);
    }
  }
  return ids;
}

// 32-bit FNV-1a. The kubelet's checksum hashes Go's in-memory dump of the
// data, which cannot be reproduced here; this one stands in for it and is
// never verified (a real kubelet would refuse this file for that reason).
uint32_t Fnv1a32(const std::string& bytes) {
  uint32_t hash = 2166136261u;
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 16777619u;
  }
  return hash;
}

}  // namespace

const FakeKubelet::Container* FakeKubelet::Pod::Find(const std::string& container) const {
  for (const Container& c : containers) {
    if (c.name == container) return &c;
  }
  return nullptr;
}

void FakeKubelet::SyncPods() {
  absl::MutexLock admission_lock(&admission_mu_);
  absl::MutexLock lock(&mu_);
  if (pods_synced_) return;
  for (Pod& pod : unsynced_) pods_.push_back(std::move(pod));
  unsynced_.clear();
  pods_synced_ = true;
  // The kubelet admits every pod it gets from the API server again
  // (HandlePodAdditions): allocateContainerResources finds each container's
  // devices allocated (devicesToAllocate: "Found pre-allocated devices"),
  // calls no plugin, and writes the checkpoint, after UpdateAllocatedDevices
  // dropped the removed pods.
  CollectRemovedLocked();
  if (absl::Status status = WriteCheckpointLocked(); !status.ok()) {
    std::fprintf(stderr, "fake-kubelet: %s\n", std::string(status.message()).c_str());
  }
}

bool FakeKubelet::pods_synced() const {
  absl::MutexLock lock(&mu_);
  return pods_synced_;
}

bool FakeKubelet::CollectRemovedLocked() {
  // UpdateAllocatedDevices returns early until sourcesReady.AllReady(): a
  // pod missing from a pod manager still filling is not gone.
  if (!pods_synced_ || removed_.empty()) return false;
  const size_t before = entries_.size();
  for (auto it = entries_.begin(); it != entries_.end();) {
    it = removed_.count(it->pod_uid) != 0 ? entries_.erase(it) : std::next(it);
  }
  removed_.clear();
  return entries_.size() != before;
}

absl::StatusOr<FakeKubelet::AdmittedContainer> FakeKubelet::AdmitContainer(
    const std::string& pod_name, const std::string& pod_namespace, const std::string& pod_uid,
    const std::string& container_name,
    const std::vector<std::pair<std::string, int>>& requests_in_order) {
  return AdmitContainer(pod_name, pod_namespace, pod_uid, container_name, requests_in_order,
                        ContainerOptions{});
}

namespace {

absl::Status NotSynced() {
  return absl::FailedPreconditionError(
      "the kubelet restarted and has not synced its pods from the API server yet (SyncPods)");
}

}  // namespace

absl::StatusOr<FakeKubelet::AdmittedContainer> FakeKubelet::AdmitContainer(
    const std::string& pod_name, const std::string& pod_namespace, const std::string& pod_uid,
    const std::string& container_name,
    const std::vector<std::pair<std::string, int>>& requests_in_order,
    const ContainerOptions& options) {
  if (pod_uid.empty()) return absl::InvalidArgumentError("pod UID: empty");
  if (container_name.empty()) return absl::InvalidArgumentError("container name: empty");
  std::set<std::string> requested;
  for (const auto& [resource, count] : requests_in_order) {
    if (count < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: negative device count %d", resource, count));
    }
    // Requests come from a map in the kubelet: a name cannot repeat.
    if (!requested.insert(resource).second) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: requested twice", resource));
    }
  }

  absl::MutexLock admission_lock(&admission_mu_);
  bool new_pod = false;
  {
    absl::MutexLock lock(&mu_);
    // Pods come from the API server source, which a restarted kubelet has
    // not synced yet.
    if (!pods_synced_) return NotSynced();
    Pod* pod = FindPodLocked(pod_uid);
    if (pod != nullptr && pod->Find(container_name) != nullptr) {
      return absl::AlreadyExistsError(
          absl::StrFormat("pod %s container \"%s\" is already admitted", pod_uid, container_name));
    }
    // The kubelet adds the pod to its pod manager before admitting it, so
    // pod-resources lists it (without devices) from the start.
    if (pod == nullptr) {
      pods_.push_back(Pod{pod_uid, pod_name, pod_namespace, {}});
      pod = &pods_.back();
      new_pod = true;
    }
    pod->containers.push_back(Container{container_name, options.init, requests_in_order});
    // allocateContainerResources starts with UpdateAllocatedDevices when the
    // container asks for a device plugin's resource.
    if (std::any_of(requests_in_order.begin(), requests_in_order.end(),
                    [](const auto& request) { return request.second > 0; })) {
      CollectRemovedLocked();
    }
  }

  AdmittedContainer admitted;
  for (const auto& [resource, count] : requests_in_order) {
    if (count == 0) continue;
    absl::StatusOr<ResourceAllocation> allocation =
        AllocateResource(pod_uid, container_name, options.init, resource, count);
    if (!allocation.ok()) {
      absl::MutexLock lock(&mu_);
      RollBackLocked(pod_uid, container_name, new_pod);
      return UnexpectedAdmission(allocation.status());
    }
    admitted.allocations.push_back(*std::move(allocation));
  }
  {
    // allocateContainerResources ends with writeCheckpoint, whatever the
    // container asked for.
    absl::MutexLock lock(&mu_);
    if (absl::Status status = WriteCheckpointLocked(); !status.ok()) {
      RollBackLocked(pod_uid, container_name, new_pod);
      return UnexpectedAdmission(status);
    }
  }
  if (options.start) admitted.start_status = StartContainerLocked(pod_uid, container_name);
  return admitted;
}

absl::StatusOr<FakeKubelet::ResourceAllocation> FakeKubelet::AllocateResource(
    const std::string& pod_uid, const std::string& container, bool init,
    const std::string& resource, int count) {
  std::vector<std::string> available;
  // The devices of the pod's init containers that no regular container of it
  // took yet: a regular container takes them first (ManagerImpl.Allocate
  // keeps devicesToReuse: init containers add theirs, regular ones remove
  // theirs; devicesToAllocate allocates from it before anything else).
  std::vector<std::string> chosen;
  std::shared_ptr<v1beta1::DevicePlugin::Stub> stub;
  bool ask_plugin = false;
  {
    absl::MutexLock lock(&mu_);
    const Resource* r = FindLocked(resource);
    if (r == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("can't allocate unregistered device ", resource));
    }
    std::set<std::string> in_use, reusable, taken_by_regular;
    const Pod* pod = FindPodLocked(pod_uid);
    for (const DeviceEntry& entry : entries_) {
      if (entry.resource != resource) continue;
      in_use.insert(entry.ids.begin(), entry.ids.end());
      const Container* c =
          entry.pod_uid == pod_uid && pod != nullptr ? pod->Find(entry.container) : nullptr;
      if (c == nullptr) continue;
      (c->init ? reusable : taken_by_regular).insert(entry.ids.begin(), entry.ids.end());
    }
    if (!init) {
      for (const auto& id : reusable) {
        if (static_cast<int>(chosen.size()) == count) break;
        if (taken_by_regular.count(id) == 0) chosen.push_back(id);
      }
    }
    stub = r->stub;
    if (static_cast<int>(chosen.size()) < count) {
      // Without an open stream the kubelet counts every device unhealthy.
      if (r->streaming) {
        for (const auto& device : r->devices) {
          if (device.health() == "Healthy" && in_use.count(device.id()) == 0) {
            available.push_back(device.id());
          }
        }
      }
      std::sort(available.begin(), available.end());
      available.erase(std::unique(available.begin(), available.end()), available.end());
      const int needed = count - static_cast<int>(chosen.size());
      if (static_cast<int>(available.size()) < needed) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "requested number of devices unavailable for %s. Requested: %d, Available: %d",
            resource, needed, available.size()));
      }
      ask_plugin = r->options.has_value() && r->options->get_preferred_allocation_available();
    }
    if (stub == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("unknown Device Plugin ", resource));
    }
  }

  // No topology manager here: every free device is "unaligned", so the
  // plugin's preference is asked over all of them and the devices taken
  // already, which it must include (devicesToAllocate).
  std::set<std::string> taken(chosen.begin(), chosen.end());
  const std::set<std::string> is_free(available.begin(), available.end());
  if (ask_plugin) {
    v1beta1::PreferredAllocationRequest request;
    auto* container_request = request.add_container_requests();
    std::vector<std::string> offered(available);
    offered.insert(offered.end(), chosen.begin(), chosen.end());
    std::sort(offered.begin(), offered.end());
    for (const auto& id : offered) container_request->add_available_deviceids(id);
    for (const auto& id : chosen) container_request->add_must_include_deviceids(id);
    container_request->set_allocation_size(count);
    v1beta1::PreferredAllocationResponse response;
    grpc::ClientContext context;
    const grpc::Status status = stub->GetPreferredAllocation(&context, request, &response);
    if (!status.ok()) {
      return absl::Status(ToAbslCode(status.error_code()),
                          absl::StrCat("device plugin GetPreferredAllocation rpc failed with err: ",
                                       GoRpcError(status)));
    }
    // The kubelet keeps the answer as a set and takes from it in random
    // order; here its order decides when it names more than needed.
    if (response.container_responses_size() > 0) {
      for (const auto& id : response.container_responses(0).deviceids()) {
        if (static_cast<int>(chosen.size()) == count) break;
        if (is_free.count(id) != 0 && taken.insert(id).second) chosen.push_back(id);
      }
    }
  }
  for (const auto& id : available) {
    if (static_cast<int>(chosen.size()) == count) break;
    if (taken.insert(id).second) chosen.push_back(id);
  }

  v1beta1::AllocateRequest request;
  auto* container_request = request.add_container_requests();
  for (const auto& id : chosen) container_request->add_devices_ids(id);
  v1beta1::AllocateResponse response;
  grpc::ClientContext context;  // no deadline, as in the kubelet
  const grpc::Status status = stub->Allocate(&context, request, &response);
  if (!status.ok()) {
    return absl::Status(ToAbslCode(status.error_code()), GoRpcError(status));
  }
  if (response.container_responses().empty()) {
    return absl::InternalError(
        "no containers return in allocation response "
        "&AllocateResponse{ContainerResponses:[]*ContainerAllocateResponse{},}");
  }

  ResourceAllocation allocation{resource, chosen, response.container_responses(0)};
  absl::MutexLock lock(&mu_);
  entries_.push_back(DeviceEntry{pod_uid, container, resource, chosen,
                                 GroupByNumaLocked(resource, chosen), allocation.response});
  return allocation;
}

std::map<int64_t, std::vector<std::string>> FakeKubelet::GroupByNumaLocked(
    const std::string& resource, const std::vector<std::string>& ids) const {
  std::map<std::string, const v1beta1::Device*> known;
  if (const Resource* r = FindLocked(resource); r != nullptr) {
    for (const auto& device : r->devices) known[device.id()] = &device;
  }
  std::map<int64_t, std::vector<std::string>> by_numa;
  for (const auto& id : ids) {
    auto it = known.find(id);
    if (it == known.end() || !it->second->has_topology() ||
        it->second->topology().nodes().empty()) {
      by_numa[kubelet_1_20_ ? 0 : kNoTopology].push_back(id);
      continue;
    }
    for (const auto& node : it->second->topology().nodes()) by_numa[node.id()].push_back(id);
  }
  return by_numa;
}

void FakeKubelet::RollBackLocked(const std::string& pod_uid, const std::string& container,
                                 bool drop_pod) {
  const size_t before = entries_.size();
  std::erase_if(entries_, [&](const DeviceEntry& entry) {
    return entry.pod_uid == pod_uid && entry.container == container;
  });
  if (Pod* pod = FindPodLocked(pod_uid); pod != nullptr) {
    std::erase_if(pod->containers, [&](const Container& c) { return c.name == container; });
  }
  if (drop_pod) {
    std::erase_if(pods_, [&](const Pod& pod) { return pod.uid == pod_uid; });
  }
  // A device list may have written the half-admitted container already.
  if (entries_.size() != before) {
    if (absl::Status status = WriteCheckpointLocked(); !status.ok()) {
      std::fprintf(stderr, "fake-kubelet: %s\n", std::string(status.message()).c_str());
    }
  }
}

FakeKubelet::Pod* FakeKubelet::FindPodLocked(const std::string& pod_uid) {
  for (Pod& pod : pods_) {
    if (pod.uid == pod_uid) return &pod;
  }
  return nullptr;
}

absl::Status FakeKubelet::StartContainer(const std::string& pod_uid,
                                         const std::string& container_name) {
  absl::MutexLock admission_lock(&admission_mu_);
  {
    absl::MutexLock lock(&mu_);
    // Containers are started by the pod workers, which a restarted kubelet
    // runs only for the pods it got from the API server.
    if (!pods_synced_) return NotSynced();
    const Pod* pod = FindPodLocked(pod_uid);
    if (pod == nullptr || pod->Find(container_name) == nullptr) {
      return absl::NotFoundError(
          absl::StrFormat("pod %s container \"%s\" is not admitted", pod_uid, container_name));
    }
  }
  return StartContainerLocked(pod_uid, container_name);
}

absl::Status FakeKubelet::StartContainerLocked(const std::string& pod_uid,
                                               const std::string& container) {
  struct Call {
    std::string resource;
    std::shared_ptr<v1beta1::DevicePlugin::Stub> stub;
    std::vector<std::string> ids;
  };
  std::vector<Call> calls;
  // Requested resources the device manager holds no devices of.
  std::vector<std::pair<std::string, int>> lost;
  bool init = false;
  {
    absl::MutexLock lock(&mu_);
    const Pod* pod = FindPodLocked(pod_uid);
    const Container* c = pod == nullptr ? nullptr : pod->Find(container);
    if (c == nullptr) {
      return absl::NotFoundError(
          absl::StrFormat("pod %s container \"%s\" is not admitted", pod_uid, container));
    }
    init = c->init;
    // GetDeviceRunContainerOptions, before every start of the container:
    // callPreStartContainerIfNeeded with the devices podDevices holds for it
    // (the same IDs every time), and Allocate again only for a resource it
    // holds none of ("a race during node restart").
    for (const auto& request : c->requests) {
      const std::string& resource = request.first;
      if (request.second == 0) continue;
      const Resource* r = FindLocked(resource);
      if (r == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat("endpoint not found in cache for a registered resource: ", resource));
      }
      // A restarted kubelet holds a stopped endpoint without options until
      // the plugin registers again: it skips the call, as for a plugin that
      // did not ask for it.
      const bool pre_start =
          r->stub != nullptr && r->options.has_value() && r->options->pre_start_required();
      auto entry = std::find_if(entries_.begin(), entries_.end(), [&](const DeviceEntry& e) {
        return e.pod_uid == pod_uid && e.container == container && e.resource == resource;
      });
      if (entry == entries_.end()) {
        if (pre_start) {
          return absl::FailedPreconditionError(absl::StrFormat(
              "no devices found allocated in local cache for pod %s, container %s, resource %s",
              pod_uid, container, resource));
        }
        lost.emplace_back(resource, request.second);
        continue;
      }
      if (pre_start) calls.push_back(Call{resource, r->stub, entry->ids});
    }
  }
  for (const Call& call : calls) {
    v1beta1::PreStartContainerRequest request;
    for (const auto& id : call.ids) request.add_devices_ids(id);
    v1beta1::PreStartContainerResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kPreStartTimeout);
    const grpc::Status status = call.stub->PreStartContainer(&context, request, &response);
    if (!status.ok()) {
      return absl::Status(ToAbslCode(status.error_code()),
                          absl::StrCat("device plugin PreStartContainer rpc failed with err: ",
                                       GoRpcError(status)));
    }
  }
  if (lost.empty()) return absl::OkStatus();
  for (const auto& [resource, count] : lost) {
    absl::StatusOr<ResourceAllocation> allocation =
        AllocateResource(pod_uid, container, init, resource, count);
    if (!allocation.ok()) return allocation.status();
  }
  absl::MutexLock lock(&mu_);
  return WriteCheckpointLocked();
}

absl::Status FakeKubelet::RemovePod(const std::string& pod_uid, CheckpointWrite when) {
  absl::MutexLock admission_lock(&admission_mu_);
  absl::MutexLock lock(&mu_);
  auto is_it = [&](const Pod& pod) { return pod.uid == pod_uid; };
  if (std::none_of(pods_.begin(), pods_.end(), is_it) &&
      std::none_of(unsynced_.begin(), unsynced_.end(), is_it)) {
    return absl::NotFoundError(absl::StrFormat("pod %s is not known", pod_uid));
  }
  // Gone from the pod manager, hence from List, at once; the device manager
  // keeps the allocations until UpdateAllocatedDevices.
  std::erase_if(pods_, is_it);
  std::erase_if(unsynced_, is_it);
  removed_.insert(pod_uid);
  if (when == CheckpointWrite::kAsKubelet || !pods_synced_) return absl::OkStatus();
  CollectRemovedLocked();
  return WriteCheckpointLocked();
}

std::vector<std::string> FakeKubelet::container_devices(const std::string& pod_uid,
                                                        const std::string& container_name,
                                                        const std::string& resource) const {
  absl::MutexLock lock(&mu_);
  for (const DeviceEntry& entry : entries_) {
    if (entry.pod_uid == pod_uid && entry.container == container_name &&
        entry.resource == resource) {
      return entry.ids;
    }
  }
  return {};
}

// ---------------------------------------------------------------------------
// The checkpoint

void FakeKubelet::AddCheckpointEntryForTest(const std::string& entry_json) {
  absl::MutexLock lock(&mu_);
  extra_entries_.push_back(entry_json);
}

absl::Status FakeKubelet::WriteCheckpointLocked() {
  using Json = nlohmann::ordered_json;
  // Field order and null-for-empty as Go's encoding/json writes the
  // kubelet's structs (a nil PodDeviceEntries slice is null).
  Json entries = entries_.empty() && extra_entries_.empty() ? Json(nullptr) : Json::array();
  for (const DeviceEntry& entry : entries_) {
    Json ids = Json::object();
    for (const auto& [numa, group] : entry.ids_by_numa) ids[std::to_string(numa)] = group;
    entries.push_back(Json{{"PodUID", entry.pod_uid},
                           {"ContainerName", entry.container},
                           {"ResourceName", entry.resource},
                           {"DeviceIDs", std::move(ids)},
                           {"AllocResp", absl::Base64Escape(entry.response.SerializeAsString())}});
  }
  for (const std::string& extra : extra_entries_) entries.push_back(Json::parse(extra));
  // The kubelet's healthyDevices: emptied while a plugin's stream is down.
  Json registered = Json::object();
  for (const auto& [name, resource] : resources_) {
    Json ids = Json::array();
    if (resource.streaming) {
      for (const auto& device : resource.devices) {
        if (device.health() == "Healthy") ids.push_back(device.id());
      }
    }
    registered[name] = std::move(ids);
  }
  Json data =
      Json{{"PodDeviceEntries", std::move(entries)}, {"RegisteredDevices", std::move(registered)}};
  const uint32_t checksum = Fnv1a32(data.dump());
  const std::string text = Json{{"Data", std::move(data)}, {"Checksum", checksum}}.dump();

  const fs::path path = checkpoint_path();
  const fs::path temporary = dir_ / absl::StrCat(".", kCheckpointName, ".tmp");
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) {
      return absl::InternalError(
          absl::StrCat("failed to write checkpoint file ", temporary.string(), ": cannot write"));
    }
  }
  std::error_code ec;
  fs::rename(temporary, path, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("failed to write checkpoint file ", path.string(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

void FakeKubelet::LoadCheckpointLocked() {
  entries_.clear();
  const fs::path path = checkpoint_path();
  std::error_code ec;
  if (!fs::exists(path, ec)) return;
  auto complain = [&](const std::string& why) {
    std::fprintf(stderr, "fake-kubelet: %s: %s; starting without its allocations\n",
                 path.string().c_str(), why.c_str());
  };
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json doc = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("Data") ||
      !doc.at("Data").is_object()) {
    complain("not a device manager checkpoint");
    return;
  }
  const nlohmann::json& data = doc.at("Data");
  auto list = data.find("PodDeviceEntries");
  if (list == data.end() || list->is_null()) return;
  if (!list->is_array()) {
    complain("Data.PodDeviceEntries is not a list");
    return;
  }
  for (const auto& item : *list) {
    // Like the kubelet's fromCheckpointData, an entry that does not parse is
    // skipped, the others are kept.
    if (!item.is_object()) continue;
    DeviceEntry entry;
    try {
      entry.pod_uid = item.at("PodUID").get<std::string>();
      entry.container = item.at("ContainerName").get<std::string>();
      entry.resource = item.at("ResourceName").get<std::string>();
      for (const auto& [key, group] : item.at("DeviceIDs").items()) {
        entry.ids_by_numa[std::stoll(key)] = group.get<std::vector<std::string>>();
      }
      std::string bytes;
      const auto& encoded = item.at("AllocResp");
      if (!encoded.is_null() && (!absl::Base64Unescape(encoded.get<std::string>(), &bytes) ||
                                 !entry.response.ParseFromString(bytes))) {
        continue;
      }
    } catch (const std::exception&) {
      continue;
    }
    entry.ids = Flatten(entry.ids_by_numa);
    entries_.push_back(std::move(entry));
  }
}

// ---------------------------------------------------------------------------
// The pod-resources API

class FakeKubelet::PodResourcesService final : public v1::PodResourcesLister::Service {
 public:
  explicit PodResourcesService(FakeKubelet* kubelet) : kubelet_(kubelet) {}

  grpc::Status List(grpc::ServerContext* /*context*/,
                    const v1::ListPodResourcesRequest* /*request*/,
                    v1::ListPodResourcesResponse* response) override {
    if (grpc::Status status = kubelet_->BeginPodResourcesCall(); !status.ok()) return status;
    absl::MutexLock lock(&kubelet_->mu_);
    // server_v1.go List: devicesProvider.UpdateAllocatedDevices() first.
    kubelet_->CollectRemovedLocked();
    kubelet_->FillListLocked(response);
    return grpc::Status::OK;
  }

  grpc::Status GetAllocatableResources(grpc::ServerContext* /*context*/,
                                       const v1::AllocatableResourcesRequest* /*request*/,
                                       v1::AllocatableResourcesResponse* response) override {
    if (grpc::Status status = kubelet_->BeginPodResourcesCall(); !status.ok()) return status;
    // Added in kubelet 1.21: grpc-go's answer for a method it does not know.
    if (kubelet_->kubelet_1_20_) {
      return grpc::Status(
          grpc::StatusCode::UNIMPLEMENTED,
          "unknown method GetAllocatableResources for service v1.PodResourcesLister");
    }
    absl::MutexLock lock(&kubelet_->mu_);
    kubelet_->FillAllocatableLocked(response);
    return grpc::Status::OK;
  }

  grpc::Status Get(grpc::ServerContext* /*context*/, const v1::GetPodResourcesRequest* /*request*/,
                   v1::GetPodResourcesResponse* /*response*/) override {
    if (grpc::Status status = kubelet_->BeginPodResourcesCall(); !status.ok()) return status;
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        kubelet_->kubelet_1_20_
                            ? "unknown method Get for service v1.PodResourcesLister"
                            : "PodResources API Get method disabled");
  }

 private:
  FakeKubelet* const kubelet_;
};

namespace {

// Appends `ids` of `resource` on NUMA node `numa` to `out`, in the shape of
// the kubelet being imitated.
void AppendContainerDevices(const std::string& resource, int64_t numa,
                            const std::vector<std::string>& ids, bool kubelet_1_20,
                            google::protobuf::RepeatedPtrField<v1::ContainerDevices>* out) {
  if (kubelet_1_20) {
    // pod_devices.go getContainerDevices: one entry per NUMA node, the node
    // always set.
    v1::ContainerDevices* devices = out->Add();
    devices->set_resource_name(resource);
    for (const auto& id : ids) devices->add_device_ids(id);
    devices->mutable_topology()->add_nodes()->set_id(numa);
    return;
  }
  // Later kubelets (containerDevicesFromResourceDeviceInstances): one entry
  // per device and NUMA node, no topology when the plugin reported none.
  for (const auto& id : ids) {
    v1::ContainerDevices* devices = out->Add();
    devices->set_resource_name(resource);
    devices->add_device_ids(id);
    if (numa != FakeKubelet::kNoTopology) devices->mutable_topology()->add_nodes()->set_id(numa);
  }
}

}  // namespace

grpc::Status FakeKubelet::BeginPodResourcesCall() {
  absl::MutexLock lock(&mu_);
  ++pod_resources_calls_;
  if (pod_resources_exhausted_) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "rejected by rate limit");
  }
  if (pod_resources_delay_ > std::chrono::milliseconds(0)) {
    auto stopped = [this]() {
      mu_.AssertHeld();
      return !pod_resources_serving_;
    };
    mu_.AwaitWithTimeout(absl::Condition(&stopped), absl::FromChrono(pod_resources_delay_));
  }
  if (!pod_resources_serving_) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "kubelet is shutting down");
  }
  return grpc::Status::OK;
}

void FakeKubelet::FillListLocked(v1::ListPodResourcesResponse* response) const {
  for (const Pod& pod : pods_) {
    v1::PodResources* pod_resources = response->add_pod_resources();
    pod_resources->set_name(pod.name);
    pod_resources->set_namespace_(pod.pod_namespace);
    // server_v1.go List walks pod.Spec.Containers (1.28 and later also the
    // restartable init containers): a plain init container is not listed.
    for (const Container& container : pod.containers) {
      if (container.init) continue;
      v1::ContainerResources* container_resources = pod_resources->add_containers();
      container_resources->set_name(container.name);
      for (const DeviceEntry& entry : entries_) {
        if (entry.pod_uid != pod.uid || entry.container != container.name) continue;
        for (const auto& [numa, ids] : entry.ids_by_numa) {
          AppendContainerDevices(entry.resource, numa, ids, kubelet_1_20_,
                                 container_resources->mutable_devices());
        }
      }
    }
  }
}

void FakeKubelet::FillAllocatableLocked(v1::AllocatableResourcesResponse* response) const {
  for (const auto& [name, resource] : resources_) {
    if (!resource.streaming) continue;
    for (const auto& device : resource.devices) {
      if (device.health() != "Healthy") continue;
      if (!device.has_topology() || device.topology().nodes().empty()) {
        AppendContainerDevices(name, kNoTopology, {device.id()}, false,
                               response->mutable_devices());
        continue;
      }
      for (const auto& node : device.topology().nodes()) {
        AppendContainerDevices(name, node.id(), {device.id()}, false, response->mutable_devices());
      }
    }
  }
}

absl::Status FakeKubelet::StartPodResources() {
  absl::MutexLock lock(&lifecycle_mu_);
  return StartPodResourcesLocked();
}

void FakeKubelet::StopPodResources() {
  absl::MutexLock lock(&lifecycle_mu_);
  StopPodResourcesLocked();
}

absl::Status FakeKubelet::StartPodResourcesLocked() {
  const fs::path& path = pod_resources_socket_;
  if (path.empty()) {
    return absl::FailedPreconditionError("no pod-resources socket was configured");
  }
  if (pod_resources_server_ != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(path.string(), ": already serving"));
  }
  if (path.string().size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: too long for a unix socket (%d bytes at most)", path.string(),
                        sizeof(sockaddr_un::sun_path) - 1));
  }
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(path.parent_path().string(), ": ", ec.message()));
  }
  fs::remove(path, ec);
  if (ec) return absl::UnavailableError(absl::StrCat(path.string(), ": ", ec.message()));

  auto service = std::make_unique<PodResourcesService>(this);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + path.string(), grpc::InsecureServerCredentials());
  builder.RegisterService(service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    return absl::UnavailableError(
        absl::StrCat(path.string(), ": cannot serve gRPC here (see the gRPC log above)"));
  }
  pod_resources_service_ = std::move(service);
  pod_resources_server_ = std::move(server);
  absl::MutexLock lock(&mu_);
  pod_resources_serving_ = true;
  return absl::OkStatus();
}

void FakeKubelet::StopPodResourcesLocked() {
  {
    absl::MutexLock lock(&mu_);
    // Ends the delays of calls in progress.
    pod_resources_serving_ = false;
  }
  if (pod_resources_server_ != nullptr) {
    pod_resources_server_->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
    pod_resources_server_->Wait();
    pod_resources_server_.reset();
    pod_resources_service_.reset();
    std::error_code ec;
    fs::remove(pod_resources_socket_, ec);
  }
}

void FakeKubelet::SetPodResourcesDelay(std::chrono::milliseconds delay) {
  absl::MutexLock lock(&mu_);
  pod_resources_delay_ = delay;
}

void FakeKubelet::SetPodResourcesExhausted(bool exhausted) {
  absl::MutexLock lock(&mu_);
  pod_resources_exhausted_ = exhausted;
}

int FakeKubelet::pod_resources_calls() const {
  absl::MutexLock lock(&mu_);
  return pod_resources_calls_;
}

bool FakeKubelet::WaitForPodResourcesCalls(int n, std::chrono::milliseconds timeout) {
  absl::MutexLock lock(&mu_);
  auto reached = [&]() {
    mu_.AssertHeld();
    return pod_resources_calls_ >= n;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&reached), absl::FromChrono(timeout));
}

}  // namespace efa::testing
