// A fake kubelet for tests and the demo: the device-plugin side of a real
// kubelet, over real gRPC on real unix sockets.
//
// It serves v1beta1.Registration on <device_plugin_dir>/kubelet.sock and, like
// the kubelet, inside Register dials the plugin's socket (<dir>/<endpoint>),
// calls GetDevicePluginOptions before answering, then reads ListAndWatch in a
// thread of its own. Allocate, GetPreferredAllocation and PreStartContainer are
// forwarded to the plugin on request. Restart() does what kubelet 1.20 does on
// start: every socket file in the directory is deleted (the plugin's included)
// and a fresh kubelet.sock is served.
//
// Thread safety: every public method is thread-safe. The lifecycle methods
// (Start, Restart, Stop, EndStream, the destructor) are serialized among
// themselves; they must not be called from a predicate given to WaitForDevices.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "deviceplugin/v1beta1/api.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/server.h"
#include "grpcpp/support/status.h"

namespace efa::testing {

class FakeKubelet {
 public:
  // The name of the kubelet's registration socket inside the directory.
  static constexpr char kSocketName[] = "kubelet.sock";
  // The only API version Register accepts.
  static constexpr char kVersion[] = "v1beta1";
  // How long Register waits for the plugin's socket to answer, as the kubelet.
  static constexpr std::chrono::milliseconds kDialTimeout{10000};

  // Will serve v1beta1.Registration on <device_plugin_dir>/kubelet.sock (the
  // directory is created by Start if missing). Serves nothing until Start.
  explicit FakeKubelet(std::filesystem::path device_plugin_dir);
  // Stops the server, ends every stream and joins every thread.
  ~FakeKubelet();

  FakeKubelet(const FakeKubelet&) = delete;
  FakeKubelet& operator=(const FakeKubelet&) = delete;

  // Creates the directory if missing, removes a stale kubelet.sock and serves.
  // Fails (naming the path) when the directory cannot be made or the socket
  // cannot be bound; FailedPrecondition when already serving.
  absl::Status Start();

  // Simulated kubelet restart, as kubelet 1.20 does it: ends every ListAndWatch
  // stream, stops the Registration server, deletes EVERY socket file in the
  // directory (keeps kubelet_internal_checkpoint and any non-socket file), then
  // serves a fresh kubelet.sock. Recorded registrations, requests and the last
  // device lists are kept; streaming() is false for every resource afterwards
  // until its plugin registers again. Fails as Start does, or naming a socket
  // file that could not be deleted.
  absl::Status Restart();

  // Ends the ListAndWatch stream of `resource` without restarting (cancels the
  // client context, as the kubelet does when it drops an endpoint). Returns once
  // the stream's reader thread has finished, so streaming(resource) is false on
  // return (until the plugin registers again). No-op for an unknown resource.
  // Call it once streaming(resource) is true: a stream cancelled before the
  // plugin's handler ran may never have reached the plugin at all.
  void EndStream(const std::string& resource);

  // Stops serving, ends every stream and removes kubelet.sock (kubelet gone).
  // In-flight Register calls fail with UNAVAILABLE. Idempotent.
  void Stop();

  // Register calls that succeeded for `resource` so far (0 if none).
  int registrations(const std::string& resource) const;
  // Blocks until registrations(resource) >= n or `timeout` passes; returns
  // whether the count was reached.
  bool WaitForRegistrations(const std::string& resource, int n, std::chrono::milliseconds timeout);
  // The request of the latest successful Register for `resource`.
  std::optional<v1beta1::RegisterRequest> last_request(const std::string& resource) const;
  // The options the plugin returned from GetDevicePluginOptions during the
  // latest successful Register for `resource`.
  std::optional<v1beta1::DevicePluginOptions> options(const std::string& resource) const;

  // The latest full device list received on ListAndWatch for `resource` (empty
  // if none yet). Kept when the stream ends and across re-registration until
  // the new stream sends its first message.
  std::vector<v1beta1::Device> devices(const std::string& resource) const;
  // ListAndWatch messages received for `resource`, counted over all its
  // streams (registrations).
  int list_and_watch_messages(const std::string& resource) const;
  // Blocks until list_and_watch_messages(resource) >= n or `timeout` passes;
  // returns whether the count was reached.
  bool WaitForListAndWatchMessages(const std::string& resource, int n,
                                   std::chrono::milliseconds timeout);
  // Blocks until pred(devices(resource)) holds or `timeout` passes; returns
  // whether it held. `pred` runs with an internal lock held and may run on
  // another thread: it must not call back into this object.
  bool WaitForDevices(const std::string& resource,
                      std::function<bool(const std::vector<v1beta1::Device>&)> pred,
                      std::chrono::milliseconds timeout);
  // Whether the ListAndWatch stream of `resource` is currently open: from the
  // first message of the stream of the latest registration until that stream
  // ends. When it is not, the real kubelet counts the resource's devices as
  // unhealthy. Register returning does not mean the stream is open yet: the
  // stream starts concurrently with the answer, as in the kubelet; wait with
  // WaitForStreaming.
  bool streaming(const std::string& resource) const;
  // Blocks until streaming(resource) == open or `timeout` passes; returns
  // whether it did.
  bool WaitForStreaming(const std::string& resource, bool open, std::chrono::milliseconds timeout);
  // The status the last ended ListAndWatch stream of `resource` finished with
  // (CANCELLED after EndStream/Restart/Stop); nullopt while none has ended.
  std::optional<grpc::Status> last_stream_status(const std::string& resource) const;

  // Calls forwarded to the plugin that last registered `resource`, over the
  // channel opened by Register. The plugin's status is returned as is;
  // FAILED_PRECONDITION if no plugin registered `resource`, or none has since
  // the last Stop/Restart (a restarted kubelet forgets its endpoints). As in the kubelet,
  // Allocate and GetPreferredAllocation have no deadline and PreStartContainer
  // has 30 s; unlike the kubelet, PreStartContainer is forwarded even when the
  // plugin did not ask for it. Thread-safe; may run while the stream is open.
  grpc::Status Allocate(const std::string& resource, const v1beta1::AllocateRequest& req,
                        v1beta1::AllocateResponse* resp);
  grpc::Status GetPreferredAllocation(const std::string& resource,
                                      const v1beta1::PreferredAllocationRequest& req,
                                      v1beta1::PreferredAllocationResponse* resp);
  grpc::Status PreStartContainer(const std::string& resource,
                                 const v1beta1::PreStartContainerRequest& req,
                                 v1beta1::PreStartContainerResponse* resp);

  // The directory served and the registration socket's path.
  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path socket_path() const { return dir_ / kSocketName; }

  // Shortens how long Register waits for the plugin's socket (default 10 s),
  // so that tests of an unreachable endpoint stay fast.
  void SetDialTimeoutForTest(std::chrono::milliseconds timeout);

 private:
  class RegistrationService;

  // One ListAndWatch stream and the thread that reads it. Fields are set
  // before the stream is published under mu_; `thread` is joined only under
  // lifecycle_mu_. Owned by a Resource or retired_ until joined.
  struct Stream {
    std::string resource;
    std::shared_ptr<v1beta1::DevicePlugin::Stub> stub;
    grpc::ClientContext context;
    std::thread thread;
  };

  // What the kubelet knows of one resource name.
  struct Resource {
    int registrations = 0;
    std::optional<v1beta1::RegisterRequest> last_request;
    std::optional<v1beta1::DevicePluginOptions> options;
    // The endpoint of the latest registration; null after Stop/Restart.
    std::shared_ptr<v1beta1::DevicePlugin::Stub> stub;
    std::vector<v1beta1::Device> devices;
    int messages = 0;
    bool streaming = false;
    std::optional<grpc::Status> last_stream_status;
    // The stream of the latest registration (possibly ended).
    std::shared_ptr<Stream> stream;
  };

  // Handles one Register call (called by RegistrationService).
  grpc::Status Register(const v1beta1::RegisterRequest& request);
  // Reads ListAndWatch of `stream` until it ends; the body of a stream thread.
  void Watch(Stream* stream);
  // The stub of the plugin that registered `resource`, or null.
  std::shared_ptr<v1beta1::DevicePlugin::Stub> StubFor(const std::string& resource) const;
  // The record of `resource`, or null.
  const Resource* FindLocked(const std::string& resource) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Status StartLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lifecycle_mu_);
  void StopLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lifecycle_mu_);

  const std::filesystem::path dir_;

  // Serializes Start/Restart/Stop/EndStream/destructor; the only holder that
  // joins stream threads. Acquired before mu_, never after.
  absl::Mutex lifecycle_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // A fresh service per server: a gRPC service is registered with one server.
  std::unique_ptr<RegistrationService> service_ ABSL_GUARDED_BY(lifecycle_mu_);
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(lifecycle_mu_);

  mutable absl::Mutex mu_;
  bool serving_ ABSL_GUARDED_BY(mu_) = false;
  std::chrono::milliseconds dial_timeout_ ABSL_GUARDED_BY(mu_) = kDialTimeout;
  std::map<std::string, Resource> resources_ ABSL_GUARDED_BY(mu_);
  // GetDevicePluginOptions calls in flight inside Register; cancelled by Stop.
  std::set<grpc::ClientContext*> dialing_ ABSL_GUARDED_BY(mu_);
  // Streams replaced by a re-registration: cancelled, joined by Stop.
  std::vector<std::shared_ptr<Stream>> retired_ ABSL_GUARDED_BY(mu_);
};

}  // namespace efa::testing
