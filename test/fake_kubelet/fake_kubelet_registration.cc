// FakeKubelet, the device manager's side of the plugins (its sources:
// fake_kubelet.cc's table): Register, which dials the plugin before it
// answers; the ListAndWatch stream of each registered resource and what it
// recorded; the calls forwarded to a registered plugin.
#include <cstdio>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "test/fake_kubelet/fake_kubelet.h"
#include "test/fake_kubelet/fake_kubelet_internal.h"

namespace efa::testing {

namespace fs = std::filesystem;

using fake_kubelet_internal::kPreStartTimeout;

namespace {

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

std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

}  // namespace

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
  // The endpoint is joined to the directory unchecked, a path into a
  // subdirectory too (1.20 addEndpoint and the newest server.Register:
  // filepath.Join(socketDir, r.Endpoint)); what it does not name is found
  // when dialling it.
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
  resource.stopped_since.reset();
  resource.removed = false;
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
    // genericDeviceUpdateCallback: allDevices[resource] is the latest list.
    auto& all = all_devices_[stream->resource];
    all.clear();
    for (const auto& device : response.devices()) all[device.id()] = device.health();
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
    // runEndpoint: e.stop() sets the endpoint's stopTime (and
    // markResourceUnhealthy empties its healthy devices).
    if (!resource.stopped_since) resource.stopped_since = std::chrono::steady_clock::now();
  }
}

const FakeKubelet::Resource* FakeKubelet::FindLocked(const std::string& resource) const {
  auto it = resources_.find(resource);
  return it == resources_.end() ? nullptr : &it->second;
}

bool FakeKubelet::EndpointRemovedLocked(const Resource& resource) const {
  // GetCapacity (every node status update) deletes an endpoint whose
  // stopGracePeriodExpired(); here it is found so when asked.
  return resource.removed ||
         (resource.stopped_since &&
          std::chrono::steady_clock::now() - *resource.stopped_since > endpoint_stop_grace_period_);
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
}  // namespace efa::testing
