#include "test/fake_kubelet/fake_kubelet.h"

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/server_context.h"
#include "test/support/temp_dir.h"

namespace fs = std::filesystem;
using efa::testing::FakeKubelet;
using namespace std::chrono_literals;

using efa::testing::TempDir;

namespace {

constexpr char kResource[] = "example.com/widget";
// Upper bound for events that normally take a few milliseconds.
constexpr auto kWait = 5s;

v1beta1::Device MakeDevice(const std::string& id, const std::string& health, int numa) {
  v1beta1::Device device;
  device.set_id(id);
  device.set_health(health);
  device.mutable_topology()->add_nodes()->set_id(numa);
  return device;
}

// A minimal device plugin served on a unix socket: answers the options it was
// given, streams the device list it holds (again on every SetDevices), and
// allocates /dev/<id> for each requested ID. Thread-safe.
class TestPlugin final : public v1beta1::DevicePlugin::Service {
 public:
  TestPlugin(fs::path socket, bool preferred_allocation) : socket_(std::move(socket)) {
    options_.set_get_preferred_allocation_available(preferred_allocation);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket_.string(), grpc::InsecureServerCredentials());
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    REQUIRE(server_ != nullptr);
  }
  ~TestPlugin() override { Stop(); }

  // Ends every ListAndWatch stream (as a dying plugin does) and stops serving.
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    if (server_ != nullptr) {
      server_->Shutdown();
      server_.reset();
    }
  }

  void SetDevices(std::vector<v1beta1::Device> devices) {
    absl::MutexLock lock(&mu_);
    devices_ = std::move(devices);
    ++version_;
  }

  // The Register request's endpoint; its socket's file name by default.
  void set_endpoint(std::string endpoint) { endpoint_ = std::move(endpoint); }

  // Registers with the kubelet at `kubelet_socket` under `resource`.
  grpc::Status Register(const fs::path& kubelet_socket, const std::string& resource,
                        const std::string& version = "v1beta1") {
    auto stub = v1beta1::Registration::NewStub(
        grpc::CreateChannel("unix:" + kubelet_socket.string(), grpc::InsecureChannelCredentials()));
    v1beta1::RegisterRequest request;
    request.set_version(version);
    request.set_endpoint(endpoint_.empty() ? socket_.filename().string() : endpoint_);
    request.set_resource_name(resource);
    *request.mutable_options() = options_;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kWait);
    v1beta1::Empty empty;
    return stub->Register(&context, request, &empty);
  }

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions* response) override {
    *response = options_;
    return grpc::Status::OK;
  }

  grpc::Status ListAndWatch(grpc::ServerContext*, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override {
    int sent = -1;
    while (true) {
      v1beta1::ListAndWatchResponse response;
      {
        absl::MutexLock lock(&mu_);
        auto changed = [&]() {
          mu_.AssertHeld();
          return stopping_ || version_ != sent;
        };
        mu_.Await(absl::Condition(&changed));
        if (stopping_) return grpc::Status::OK;
        sent = version_;
        for (const auto& device : devices_) *response.add_devices() = device;
      }
      if (!writer->Write(response)) return grpc::Status::OK;
    }
  }

  grpc::Status GetPreferredAllocation(grpc::ServerContext*,
                                      const v1beta1::PreferredAllocationRequest* request,
                                      v1beta1::PreferredAllocationResponse* response) override {
    for (const auto& container : request->container_requests()) {
      auto* answer = response->add_container_responses();
      for (int i = container.available_deviceids_size() - 1;
           i >= 0 && answer->deviceids_size() < container.allocation_size(); --i) {
        answer->add_deviceids(container.available_deviceids(i));
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* request,
                        v1beta1::AllocateResponse* response) override {
    for (const auto& container : request->container_requests()) {
      auto* answer = response->add_container_responses();
      for (const auto& id : container.devices_ids()) {
        if (id == "bad") {
          return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "unknown device \"bad\"");
        }
        auto* spec = answer->add_devices();
        spec->set_host_path("/dev/" + id);
        spec->set_container_path("/dev/" + id);
        spec->set_permissions("rw");
      }
      (*answer->mutable_envs())["PLUGIN"] = socket_.filename().string();
    }
    return grpc::Status::OK;
  }

  grpc::Status PreStartContainer(grpc::ServerContext*, const v1beta1::PreStartContainerRequest*,
                                 v1beta1::PreStartContainerResponse*) override {
    return grpc::Status::OK;
  }

 private:
  const fs::path socket_;
  std::string endpoint_;
  v1beta1::DevicePluginOptions options_;
  std::unique_ptr<grpc::Server> server_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int version_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<v1beta1::Device> devices_ ABSL_GUARDED_BY(mu_);
};

std::vector<std::string> Ids(const std::vector<v1beta1::Device>& devices) {
  std::vector<std::string> ids;
  for (const auto& device : devices) ids.push_back(device.id() + "=" + device.health());
  return ids;
}

}  // namespace

TEST_CASE("FakeKubelet records a registration with its request and options",
          "[fake_kubelet][concurrency]") {
  TempDir dir;
  FakeKubelet kubelet(dir.path() / "device-plugins");
  REQUIRE(kubelet.Start().ok());
  CHECK(fs::is_socket(dir.path() / "device-plugins" / "kubelet.sock"));
  CHECK(kubelet.registrations(kResource) == 0);
  CHECK_FALSE(kubelet.last_request(kResource).has_value());

  TestPlugin plugin(dir.path() / "device-plugins" / "widget.sock", /*preferred_allocation=*/true);
  const grpc::Status status = plugin.Register(kubelet.socket_path(), kResource);
  REQUIRE(status.error_message() == "");
  REQUIRE(status.ok());

  CHECK(kubelet.registrations(kResource) == 1);
  CHECK(kubelet.WaitForRegistrations(kResource, 1, 0ms));
  const auto request = kubelet.last_request(kResource);
  REQUIRE(request.has_value());
  CHECK(request->version() == "v1beta1");
  CHECK(request->endpoint() == "widget.sock");
  CHECK(request->resource_name() == kResource);
  CHECK(request->options().get_preferred_allocation_available());
  const auto options = kubelet.options(kResource);
  REQUIRE(options.has_value());
  CHECK(options->get_preferred_allocation_available());
  CHECK_FALSE(options->pre_start_required());
  CHECK(kubelet.WaitForStreaming(kResource, true, kWait));
  CHECK(kubelet.registrations("other.com/thing") == 0);
}

TEST_CASE("FakeKubelet rejects what the kubelet rejects, naming the bad field",
          "[fake_kubelet][concurrency]") {
  TempDir dir;
  FakeKubelet kubelet(dir.path());
  REQUIRE(kubelet.Start().ok());
  TestPlugin plugin(dir.path() / "widget.sock", false);

  grpc::Status status = plugin.Register(kubelet.socket_path(), kResource, "v1alpha");
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(status.error_message() ==
        "requested API version \"v1alpha\" is not supported by kubelet. Supported versions are "
        "[\"v1beta1\"]");

  status = plugin.Register(kubelet.socket_path(), "widget");
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(status.error_message() == "the ResourceName \"widget\" is invalid");

  CHECK(kubelet.registrations(kResource) == 0);
  CHECK(kubelet.registrations("widget") == 0);
  CHECK_FALSE(kubelet.streaming(kResource));
}

TEST_CASE("FakeKubelet dials an endpoint in a subdirectory, which its restart keeps",
          "[fake_kubelet][concurrency]") {
  TempDir dir;
  fs::create_directories(dir.path() / "sub");
  FakeKubelet kubelet(dir.path());
  REQUIRE(kubelet.Start().ok());
  TestPlugin plugin(dir.path() / "sub" / "widget.sock", false);
  plugin.set_endpoint("sub/widget.sock");
  REQUIRE(plugin.Register(kubelet.socket_path(), kResource).ok());
  CHECK(kubelet.registrations(kResource) == 1);

  // The device manager's start deletes the sockets at the top of the dir
  // and skips directories, the sockets in them with them.
  REQUIRE(kubelet.Restart().ok());
  CHECK(fs::exists(dir.path() / "sub" / "widget.sock"));
  REQUIRE(plugin.Register(kubelet.socket_path(), kResource).ok());
  CHECK(kubelet.registrations(kResource) == 2);
}

TEST_CASE("FakeKubelet rejects a registration whose endpoint does not answer",
          "[fake_kubelet][concurrency]") {
  TempDir dir;
  FakeKubelet kubelet(dir.path());
  kubelet.SetDialTimeoutForTest(100ms);
  REQUIRE(kubelet.Start().ok());

  // Registers before serving: the socket the kubelet dials does not exist.
  TestPlugin plugin(dir.path() / "widget.sock", false);
  plugin.Stop();
  fs::remove(dir.path() / "widget.sock");
  const grpc::Status status = plugin.Register(kubelet.socket_path(), kResource);
  CHECK(status.error_code() == grpc::StatusCode::UNAVAILABLE);
  CHECK(status.error_message() == "failed to get the device plugin options from " +
                                      (dir.path() / "widget.sock").string() +
                                      ": DEADLINE_EXCEEDED: Deadline Exceeded");
  CHECK(kubelet.registrations(kResource) == 0);
  CHECK_FALSE(kubelet.streaming(kResource));
}

TEST_CASE("FakeKubelet keeps the latest ListAndWatch device list", "[fake_kubelet][concurrency]") {
  TempDir dir;
  FakeKubelet kubelet(dir.path());
  REQUIRE(kubelet.Start().ok());
  TestPlugin plugin(dir.path() / "widget.sock", false);
  plugin.SetDevices({MakeDevice("w0", "Healthy", 0), MakeDevice("w1", "Healthy", 1)});
  CHECK(kubelet.devices(kResource).empty());
  CHECK(kubelet.list_and_watch_messages(kResource) == 0);
  REQUIRE(plugin.Register(kubelet.socket_path(), kResource).ok());

  REQUIRE(kubelet.WaitForDevices(
      kResource, [](const auto& devices) { return devices.size() == 2; }, kWait));
  CHECK(kubelet.list_and_watch_messages(kResource) == 1);
  std::vector<v1beta1::Device> devices = kubelet.devices(kResource);
  CHECK(Ids(devices) == std::vector<std::string>{"w0=Healthy", "w1=Healthy"});
  REQUIRE(devices[1].topology().nodes_size() == 1);
  CHECK(devices[1].topology().nodes(0).id() == 1);

  plugin.SetDevices({MakeDevice("w0", "Healthy", 0), MakeDevice("w1", "Unhealthy", 1)});
  REQUIRE(kubelet.WaitForDevices(
      kResource, [](const auto& d) { return d.size() == 2 && d[1].health() == "Unhealthy"; },
      kWait));
  CHECK(kubelet.list_and_watch_messages(kResource) == 2);
  CHECK(kubelet.WaitForListAndWatchMessages(kResource, 2, 0ms));
  CHECK_FALSE(kubelet.WaitForListAndWatchMessages(kResource, 3, 10ms));
  CHECK_FALSE(kubelet.WaitForDevices(
      kResource, [](const auto& d) { return d.empty(); }, 10ms));

  // The plugin dies: the stream ends, the last list stays for inspection.
  plugin.Stop();
  REQUIRE(kubelet.WaitForStreaming(kResource, false, kWait));
  CHECK(Ids(kubelet.devices(kResource)) == std::vector<std::string>{"w0=Healthy", "w1=Unhealthy"});
  REQUIRE(kubelet.last_stream_status(kResource).has_value());
}

TEST_CASE("FakeKubelet restart deletes every socket and keeps the checkpoint",
          "[fake_kubelet][concurrency]") {
  TempDir dir;
  FakeKubelet kubelet(dir.path());
  REQUIRE(kubelet.Start().ok());
  std::ofstream(dir.path() / "kubelet_internal_checkpoint") << "{}";
  std::ofstream(dir.path() / "notes.txt") << "not a socket";
  auto plugin = std::make_unique<TestPlugin>(dir.path() / "widget.sock", false);
  plugin->SetDevices({MakeDevice("w0", "Healthy", 0)});
  REQUIRE(plugin->Register(kubelet.socket_path(), kResource).ok());
  REQUIRE(kubelet.WaitForListAndWatchMessages(kResource, 1, kWait));
  REQUIRE(fs::is_socket(dir.path() / "widget.sock"));

  REQUIRE(kubelet.Restart().ok());
  CHECK_FALSE(fs::exists(dir.path() / "widget.sock"));
  CHECK(fs::is_regular_file(dir.path() / "kubelet_internal_checkpoint"));
  CHECK(fs::is_regular_file(dir.path() / "notes.txt"));
  CHECK(fs::is_socket(kubelet.socket_path()));
  CHECK_FALSE(kubelet.streaming(kResource));
  REQUIRE(kubelet.last_stream_status(kResource).has_value());
  CHECK(kubelet.last_stream_status(kResource)->error_code() == grpc::StatusCode::CANCELLED);
  CHECK(kubelet.registrations(kResource) == 1);
  CHECK(kubelet.devices(kResource).size() == 1);
  // The old endpoint is forgotten until the plugin registers again.
  v1beta1::AllocateResponse response;
  CHECK(kubelet.Allocate(kResource, {}, &response).error_code() ==
        grpc::StatusCode::FAILED_PRECONDITION);

  // A plugin that notices serves a new socket and registers with the new
  // kubelet. The old server goes first: gRPC unlinks its socket path when it
  // shuts down, even if that path is a newer server's socket by then.
  plugin.reset();
  plugin = std::make_unique<TestPlugin>(dir.path() / "widget.sock", false);
  plugin->SetDevices({MakeDevice("w0", "Healthy", 0), MakeDevice("w1", "Healthy", 0)});
  const grpc::Status status = plugin->Register(kubelet.socket_path(), kResource);
  REQUIRE(status.error_message() == "");
  REQUIRE(status.ok());
  CHECK(kubelet.WaitForRegistrations(kResource, 2, kWait));
  CHECK(kubelet.WaitForStreaming(kResource, true, kWait));
  CHECK(kubelet.WaitForDevices(
      kResource, [](const auto& d) { return d.size() == 2; }, kWait));
}

TEST_CASE("FakeKubelet as kubelet 1.20 deletes every file on restart but the checkpoint",
          "[fake_kubelet][concurrency]") {
  TempDir dir;
  FakeKubelet::Options options;
  options.device_plugin_dir = dir.path();
  options.kubelet_1_20 = true;
  FakeKubelet kubelet(options);
  REQUIRE(kubelet.Start().ok());
  std::ofstream(dir.path() / "kubelet_internal_checkpoint") << "{}";
  std::ofstream(dir.path() / "notes.txt") << "not a socket";
  fs::create_directories(dir.path() / "sub");
  REQUIRE(kubelet.Restart().ok());
  CHECK_FALSE(fs::exists(dir.path() / "notes.txt"));
  CHECK(fs::is_regular_file(dir.path() / "kubelet_internal_checkpoint"));
  CHECK(fs::is_directory(dir.path() / "sub"));
  CHECK(fs::is_socket(kubelet.socket_path()));
}

TEST_CASE("FakeKubelet EndStream ends the stream without restarting",
          "[fake_kubelet][concurrency]") {
  TempDir dir;
  FakeKubelet kubelet(dir.path());
  REQUIRE(kubelet.Start().ok());
  TestPlugin plugin(dir.path() / "widget.sock", false);
  REQUIRE(plugin.Register(kubelet.socket_path(), kResource).ok());
  REQUIRE(kubelet.WaitForStreaming(kResource, true, kWait));

  kubelet.EndStream(kResource);
  CHECK_FALSE(kubelet.streaming(kResource));
  REQUIRE(kubelet.last_stream_status(kResource).has_value());
  CHECK(kubelet.last_stream_status(kResource)->error_code() == grpc::StatusCode::CANCELLED);
  CHECK(fs::is_socket(kubelet.socket_path()));
  CHECK(fs::is_socket(dir.path() / "widget.sock"));
  kubelet.EndStream("unknown.com/thing");  // no-op

  REQUIRE(plugin.Register(kubelet.socket_path(), kResource).ok());
  CHECK(kubelet.registrations(kResource) == 2);
  CHECK(kubelet.WaitForStreaming(kResource, true, kWait));
}

TEST_CASE("FakeKubelet forwards allocation calls to the registered plugin",
          "[fake_kubelet][concurrency]") {
  TempDir dir;
  FakeKubelet kubelet(dir.path());
  REQUIRE(kubelet.Start().ok());

  v1beta1::AllocateRequest allocate;
  allocate.add_container_requests()->add_devices_ids("w1");
  v1beta1::AllocateResponse allocated;
  grpc::Status status = kubelet.Allocate(kResource, allocate, &allocated);
  CHECK(status.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(status.error_message() == "no device plugin is registered for \"example.com/widget\"");

  TestPlugin plugin(dir.path() / "widget.sock", true);
  REQUIRE(plugin.Register(kubelet.socket_path(), kResource).ok());

  v1beta1::PreferredAllocationRequest prefer;
  auto* container = prefer.add_container_requests();
  for (const char* id : {"w0", "w1", "w2"}) container->add_available_deviceids(id);
  container->set_allocation_size(2);
  v1beta1::PreferredAllocationResponse preferred;
  REQUIRE(kubelet.GetPreferredAllocation(kResource, prefer, &preferred).ok());
  REQUIRE(preferred.container_responses_size() == 1);
  CHECK(std::vector<std::string>(preferred.container_responses(0).deviceids().begin(),
                                 preferred.container_responses(0).deviceids().end()) ==
        std::vector<std::string>{"w2", "w1"});

  REQUIRE(kubelet.Allocate(kResource, allocate, &allocated).ok());
  REQUIRE(allocated.container_responses_size() == 1);
  REQUIRE(allocated.container_responses(0).devices_size() == 1);
  CHECK(allocated.container_responses(0).devices(0).host_path() == "/dev/w1");
  CHECK(allocated.container_responses(0).devices(0).permissions() == "rw");
  CHECK(allocated.container_responses(0).envs().at("PLUGIN") == "widget.sock");

  allocate.mutable_container_requests(0)->add_devices_ids("bad");
  status = kubelet.Allocate(kResource, allocate, &allocated);
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(status.error_message() == "unknown device \"bad\"");

  v1beta1::PreStartContainerResponse started;
  CHECK(kubelet.PreStartContainer(kResource, {}, &started).ok());
}

TEST_CASE("FakeKubelet re-registration replaces the endpoint", "[fake_kubelet][concurrency]") {
  TempDir dir;
  FakeKubelet kubelet(dir.path());
  REQUIRE(kubelet.Start().ok());
  TestPlugin first(dir.path() / "first.sock", false);
  first.SetDevices({MakeDevice("a0", "Healthy", 0)});
  REQUIRE(first.Register(kubelet.socket_path(), kResource).ok());
  REQUIRE(kubelet.WaitForListAndWatchMessages(kResource, 1, kWait));

  TestPlugin second(dir.path() / "second.sock", false);
  second.SetDevices({MakeDevice("b0", "Healthy", 0), MakeDevice("b1", "Healthy", 0)});
  REQUIRE(second.Register(kubelet.socket_path(), kResource).ok());
  CHECK(kubelet.last_request(kResource)->endpoint() == "second.sock");
  REQUIRE(kubelet.WaitForDevices(
      kResource, [](const auto& d) { return d.size() == 2; }, kWait));
  CHECK(kubelet.WaitForStreaming(kResource, true, kWait));
  // The first plugin's stream was ended by the kubelet: its death changes nothing.
  first.Stop();
  CHECK(kubelet.streaming(kResource));

  v1beta1::AllocateRequest allocate;
  allocate.add_container_requests()->add_devices_ids("b0");
  v1beta1::AllocateResponse allocated;
  REQUIRE(kubelet.Allocate(kResource, allocate, &allocated).ok());
  CHECK(allocated.container_responses(0).envs().at("PLUGIN") == "second.sock");
}

TEST_CASE("FakeKubelet Stop ends the streams and removes kubelet.sock",
          "[fake_kubelet][concurrency]") {
  TempDir dir;
  FakeKubelet kubelet(dir.path());
  REQUIRE(kubelet.Start().ok());
  CHECK(kubelet.Start().code() == absl::StatusCode::kFailedPrecondition);
  TestPlugin plugin(dir.path() / "widget.sock", false);
  REQUIRE(plugin.Register(kubelet.socket_path(), kResource).ok());

  kubelet.Stop();
  CHECK_FALSE(kubelet.streaming(kResource));
  CHECK_FALSE(fs::exists(kubelet.socket_path()));
  CHECK(fs::is_socket(dir.path() / "widget.sock"));
  CHECK_FALSE(plugin.Register(kubelet.socket_path(), kResource).ok());
  kubelet.Stop();  // idempotent

  // A stale kubelet.sock (a killed kubelet's) does not stop a new start.
  std::ofstream(kubelet.socket_path()) << "stale";
  REQUIRE(kubelet.Start().ok());
  CHECK(fs::is_socket(kubelet.socket_path()));
}
