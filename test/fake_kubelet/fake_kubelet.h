// A fake kubelet for tests and the demo: the device-plugin side of a real
// kubelet, over real gRPC on real unix sockets, and a miniature of its device
// manager (which behaviour is where, from which kubelet source: fake_kubelet.cc).
//
// It serves v1beta1.Registration on <device_plugin_dir>/kubelet.sock and, like
// the kubelet, inside Register dials the plugin's socket (<dir>/<endpoint>),
// calls GetDevicePluginOptions before answering, then reads ListAndWatch in a
// thread of its own. Allocate, GetPreferredAllocation and PreStartContainer are
// forwarded to the plugin on request. Restart() does what kubelet 1.20 does on
// start: every socket file in the directory is deleted (the plugin's included)
// and a fresh kubelet.sock is served.
//
// Pod admission (AdmitContainer) follows the kubelet's device manager
// (allocateContainerResources, in fake_kubelet.cc's table): one resource at
// a time in the order the test gives (the kubelet's is Go map order, random),
// GetPreferredAllocation when the plugin offers it, Allocate, the devices
// recorded at once (visible through pod-resources List from then on), and the
// checkpoint <dir>/kubelet_internal_checkpoint written once every resource of
// the container is allocated; then PreStartContainer. A container start after
// that (StartContainer: a restart) calls PreStartContainer again with the same
// IDs and no Allocate. Given a socket path, it also serves the pod-resources
// API v1 (v1.PodResourcesLister) over the same state.
//
// What the kubelet's pod manager holds (the pods pod-resources List shows) is
// kept apart from what its device manager holds (the allocations and the
// checkpoint), as in the kubelet:
//   - After Restart, List shows no pod until SyncPods (the kubelet's pod
//     manager fills from the API server after the pod-resources server is
//     up), while the allocations are back from the checkpoint at once.
//   - Init containers (not restartable) are in the checkpoint, never in List.
//   - A deleted pod leaves List at once; its allocations go at the device
//     manager's next UpdateAllocatedDevices, only once the sources are ready
//     (not between Restart and SyncPods), and leave the file at its next
//     write (RemovePod says when).
//
// The checkpoint, as the kubelet's: JSON {"Data":{"PodDeviceEntries":[{
// "PodUID","ContainerName","ResourceName","DeviceIDs":{"<NUMA node>":[ids]},
// "AllocResp":"<base64 ContainerAllocateResponse>"}] (null when none),
// "RegisteredDevices":{"<resource>":[healthy ids]}},"Checksum":N}, written
// atomically (temporary file, rename). Like the kubelet it is also rewritten
// on EVERY ListAndWatch message, so a device update arriving while a
// container is being admitted writes that container's resources allocated so
// far. Start and Restart read it back: its entries are the allocated devices
// from then on, including entries of pods this object was never given (a
// hand-written checkpoint): those stay allocated and are written back, but
// pod-resources cannot list them (it knows no pod name for them).
//
// Thread safety: every public method is thread-safe. The lifecycle methods
// (Start, Restart, Stop, EndStream, StartPodResources, StopPodResources, the
// destructor) are serialized among themselves; they must not be called from a
// predicate given to WaitForDevices. Admissions (AdmitContainer,
// StartContainer, PrepareClaim, RemovePod, SyncPods) are serialized among themselves, as
// the kubelet admits one pod at a time; Start, Restart and Stop wait for the
// one in progress, so none of these may be called from a plugin's handler
// while it serves an admission.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "deviceplugin/v1beta1/api.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/server.h"
#include "grpcpp/support/status.h"
#include "podresources/v1/api.pb.h"

namespace efa::testing {

class FakeKubelet {
 public:
  // The name of the kubelet's registration socket inside the directory.
  static constexpr char kSocketName[] = "kubelet.sock";
  // The only API version Register accepts.
  static constexpr char kVersion[] = "v1beta1";
  // How long Register waits for the plugin's socket to answer, as the kubelet.
  static constexpr std::chrono::milliseconds kDialTimeout{10000};
  // The device manager's checkpoint file inside the directory.
  static constexpr char kCheckpointName[] = "kubelet_internal_checkpoint";
  // The checkpoint's NUMA key for devices whose plugin reported no topology
  // (kubelet 1.21 and later; 1.20 uses 0, see Options::kubelet_1_20).
  static constexpr int64_t kNoTopology = -1;

  struct Options {
    // Where kubelet.sock is served and plugins put their sockets (created by
    // Start if missing).
    std::filesystem::path device_plugin_dir;
    // Where v1.PodResourcesLister is served, normally
    // <kubelet-dir>/pod-resources/kubelet.sock (the directory is created if
    // missing); empty: the pod-resources API is not served.
    std::filesystem::path pod_resources_socket;
    // Imitates kubelet 1.20 (the kubelet of test/e2e) where later kubelets
    // differ: devices whose plugin reported no topology are recorded under
    // NUMA node 0 instead of -1; List gives one ContainerDevices per resource
    // and NUMA node, the node always set, instead of one per device (with no
    // topology when there is none); GetAllocatableResources does not exist
    // (UNIMPLEMENTED); Restart deletes every file of the directory that is
    // not a directory, not the sockets only.
    bool kubelet_1_20 = false;
    // How long the device manager keeps a stopped endpoint (its plugin's
    // stream ended and no plugin registered the resource again) before its
    // GetCapacity drops it: endpointStopGracePeriod, 5 minutes in every
    // kubelet. Until then the
    // resource has no free device and a container start that needs its
    // PreStartContainer fails ("endpoint ... has been stopped", endpoint.go
    // preStartContainer); after it the resource is unregistered: a start of
    // a container holding its devices fails ("endpoint not found in cache
    // for a registered resource", manager.go callPreStartContainerIfNeeded),
    // an admission asking for it too ("can't allocate unregistered device"),
    // and the checkpoint's RegisteredDevices leave it out. Its containers'
    // allocations stay (podDevices and the checkpoint) while they live.
    std::chrono::milliseconds endpoint_stop_grace_period = std::chrono::minutes(5);
    // The KubeletPodResourcesDynamicResources gate (alpha 1.27-1.33, beta
    // and on from 1.34): List shows each container's ResourceClaims
    // (dynamic_resources). Off with kubelet_1_20 whatever it says (no DRA).
    bool dynamic_resources = true;
  };

  // Options for a kubelet directory: <kubelet_dir>/device-plugins and
  // <kubelet_dir>/pod-resources/kubelet.sock, as the kubelet lays them out.
  static Options ForKubeletDir(const std::filesystem::path& kubelet_dir);

  // Will serve v1beta1.Registration on <device_plugin_dir>/kubelet.sock (the
  // directory is created by Start if missing), and no pod-resources API.
  // Serves nothing until Start.
  explicit FakeKubelet(std::filesystem::path device_plugin_dir);
  // Will serve what `options` says. Serves nothing until Start.
  explicit FakeKubelet(Options options);
  // Stops the server, ends every stream and joins every thread.
  ~FakeKubelet();

  FakeKubelet(const FakeKubelet&) = delete;
  FakeKubelet& operator=(const FakeKubelet&) = delete;

  // Creates the directory if missing, removes a stale kubelet.sock and serves;
  // likewise the pod-resources socket when one was given. Like a starting
  // kubelet, first reads the device allocations back from the checkpoint if
  // there is one (a checkpoint that cannot be read is reported on stderr and
  // ignored, as the kubelet does). Fails (naming the path) when a directory
  // cannot be made or a socket cannot be bound, then serving nothing;
  // FailedPrecondition when already serving.
  absl::Status Start();

  // Simulated kubelet restart: ends every ListAndWatch stream, stops the
  // Registration server, deletes every socket file in the directory (with
  // Options::kubelet_1_20 every file that is not a directory; the checkpoint
  // is kept either way), then serves a fresh kubelet.sock. Recorded
  // registrations, requests and the last device lists are kept; streaming()
  // is false for every resource afterwards until its plugin registers again.
  // The pod-resources server, when configured, is stopped and served again on
  // a new socket (even after StopPodResources). The devices allocated to
  // admitted containers are read back from the checkpoint, as the kubelet
  // restores them; the file is next written at the first ListAndWatch message
  // or at SyncPods. The admitted pods are not listed by pod-resources, nor
  // admitted to, nor started, until SyncPods. Fails as Start does, or naming a
  // socket file that could not be deleted.
  absl::Status Restart();

  // The restarted kubelet's sources are ready: its pod manager has the pods
  // from the API server again (every pod admitted before Restart and not
  // removed since), so pod-resources lists them, and it admits them again as
  // the kubelet does after a restart: no Allocate (the devices are found in
  // the checkpoint), the checkpoint written, the entries of removed pods
  // dropped from it. No-op when the pods are synced already.
  void SyncPods();
  // False from Restart until SyncPods.
  bool pods_synced() const;

  // Ends the ListAndWatch stream of `resource` without restarting (cancels the
  // client context, as the kubelet does when it drops an endpoint). Returns once
  // the stream's reader thread has finished, so streaming(resource) is false on
  // return (until the plugin registers again). No-op for an unknown resource.
  // Call it once streaming(resource) is true: a stream cancelled before the
  // plugin's handler ran may never have reached the plugin at all.
  void EndStream(const std::string& resource);

  // Stops serving, ends every stream and removes kubelet.sock (kubelet gone);
  // the pod-resources server too. In-flight Register calls fail with
  // UNAVAILABLE. Idempotent.
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

  // --- Pod admission: the kubelet's device manager in miniature. ---

  // How AdmitContainer treats the container.
  struct ContainerOptions {
    // An init container that is not restartable: its devices are in the
    // checkpoint but pod-resources does not list it (the kubelet's List walks
    // pod.Spec.Containers, and since 1.28 the restartable init containers
    // only). The pod's later regular containers take its devices first (the
    // kubelet's devicesToReuse).
    bool init = false;
    // Start it once admitted (PreStartContainer); false: admitted only, as a
    // regular container waiting for the pod's init containers, started later
    // with StartContainer.
    bool start = true;
  };

  // One resource of an admitted container.
  struct ResourceAllocation {
    std::string resource;
    // The devices, in the order given to Allocate: the plugin's preference
    // first (in its order), then the kubelet's fill (sorted IDs).
    std::vector<std::string> device_ids;
    // container_responses[0] of the plugin's Allocate answer.
    v1beta1::ContainerAllocateResponse response;
  };
  struct AdmittedContainer {
    // In request order; requests for 0 devices are left out.
    std::vector<ResourceAllocation> allocations;
    // PreStartContainer's outcome (OK when no plugin asked for it). As in the
    // kubelet, a failure here leaves the container admitted with its devices,
    // only not started: retry with StartContainer or remove the pod.
    absl::Status start_status;
  };

  // Admits one container of a pod asking for `requests_in_order` (resource,
  // device count), as the kubelet's device manager does, one resource
  // at a time in the given order: the free devices are the resource's healthy
  // ones (none while its ListAndWatch stream is not open) minus those of other
  // containers; if the plugin offers GetPreferredAllocation it is asked
  // (available = the free IDs, sorted; must-include empty; size = count) and
  // its answer, limited to free IDs, is taken first, the shortfall filled with
  // the first free IDs in sorted order; then Allocate is called with them and
  // the devices and answer are recorded at once, so pod-resources List shows
  // them before the next resource is allocated. Once all are allocated the
  // checkpoint is written, then PreStartContainer is called for each resource
  // whose plugin asked for it (see AdmittedContainer::start_status).
  //
  // The pod is listed by pod-resources (with this container) from the start
  // of the call. On failure nothing of this container stays allocated (nor
  // the pod, when this call added it) and the error reads like the kubelet's
  // UnexpectedAdmissionError, e.g. "UnexpectedAdmissionError: Allocate failed
  // due to requested number of devices unavailable for nvidia.com/gpu.
  // Requested: 9, Available: 8, which is unexpected" (RESOURCE_EXHAUSTED);
  // "... can't allocate unregistered device x.com/y ..." (FAILED_PRECONDITION);
  // a plugin's error as Go prints it, "... rpc error: code = InvalidArgument
  // desc = ... " with the plugin's code. INVALID_ARGUMENT for an empty pod
  // UID or container name, a negative count or a resource named twice;
  // ALREADY_EXISTS when the container was admitted already.
  // Before the resources, the device manager drops the allocations of
  // removed pods (UpdateAllocatedDevices) once its sources are ready; the
  // checkpoint is written whatever the container asks for. A regular
  // container takes the devices of its pod's init containers first, without
  // asking the plugin when they are enough (else must-include names them).
  // FAILED_PRECONDITION between Restart and SyncPods.
  absl::StatusOr<AdmittedContainer> AdmitContainer(
      const std::string& pod_name, const std::string& pod_namespace, const std::string& pod_uid,
      const std::string& container_name,
      const std::vector<std::pair<std::string, int>>& requests_in_order);
  absl::StatusOr<AdmittedContainer> AdmitContainer(
      const std::string& pod_name, const std::string& pod_namespace, const std::string& pod_uid,
      const std::string& container_name,
      const std::vector<std::pair<std::string, int>>& requests_in_order,
      const ContainerOptions& options);

  // Starts the admitted container again (or for the first time when admitted
  // with start = false), as the kubelet's GetDeviceRunContainerOptions does
  // before each start: PreStartContainer for each resource whose plugin asked
  // for it, with the same device IDs as before (30 s deadline), and no
  // Allocate: the devices are found allocated. Only a resource the device
  // manager lost (a checkpoint without it at Restart) is allocated again,
  // with Allocate, when its plugin does not ask for PreStartContainer; when
  // it does, the start fails as the kubelet's does ("no devices found
  // allocated in local cache ..."). Returns the first failure ("device
  // plugin PreStartContainer rpc failed with err: rpc error: code = ... desc
  // = ...", with the plugin's code); NOT_FOUND for a container that is not
  // admitted; FAILED_PRECONDITION between Restart and SyncPods.
  absl::Status StartContainer(const std::string& pod_uid, const std::string& container_name);

  // When the checkpoint loses a removed pod's entries.
  enum class CheckpointWrite {
    // At once, as if the device manager's next UpdateAllocatedDevices and
    // write came right after the deletion (a shortcut for tests that do not
    // care when); between Restart and SyncPods, at SyncPods.
    kAtOnce,
    // As the kubelet: the allocations are dropped at its next
    // UpdateAllocatedDevices (an admission, a pod-resources List, SyncPods)
    // once the sources are ready, and the file keeps them until its next
    // write (an admission, a ListAndWatch message, SyncPods). On a quiet node
    // that can be long.
    kAsKubelet,
  };
  // The pod was deleted: it leaves pod-resources at once, and its claims are
  // unprepared (a claim no other pod uses leaves the DRA manager); its devices are
  // freed and its entries leave the checkpoint as `when` says. NOT_FOUND for
  // an unknown pod; the checkpoint write's error otherwise.
  absl::Status RemovePod(const std::string& pod_uid,
                         CheckpointWrite when = CheckpointWrite::kAtOnce);

  // --- Dynamic resources: the kubelet's DRA manager in miniature. ---
  //
  // As the kubelet's DRA manager (its source: fake_kubelet.cc's table)
  // prepareResources: a ResourceClaim the pod uses is prepared once per node
  // (its claim info cached by namespace/name, every pod using it referenced),
  // each driver of its allocation is asked NodePrepareResources, and every
  // device the driver answers is recorded (info.addDevice: pool, device, CDI
  // IDs). A driver may answer none: DRANET (kubernetes-sigs/dranet f258477,
  // pkg/driver/dra_hooks.go prepareResourceClaim) returns an empty
  // PrepareResult, so the kubelet knows the claim and its driver and no
  // device. The claim info is dropped when the last pod using it is removed
  // (unprepareResources), and survives a restart (its checkpoint,
  // dra_manager_state).

  // One device a driver's NodePrepareResources answered for a claim.
  struct PreparedDevice {
    std::string pool;
    std::string device;
    std::vector<std::string> cdi_ids;
  };
  // A claim as the DRA manager caches it once prepared: per driver of its
  // allocation, the devices the driver answered (possibly none).
  struct PreparedClaim {
    std::string name;
    std::string claim_namespace;
    std::map<std::string, std::vector<PreparedDevice>> drivers;
  };
  // The pod (added to the pod manager when new, as an admission does) uses
  // `claim` (pod.spec.resourceClaims, in call order), prepared now unless a
  // claim of that namespace and name is prepared already (then only
  // referenced), and its containers `containers` name it in
  // resources.claims (each added to the pod when new, holding no device of
  // a plugin). INVALID_ARGUMENT for an empty pod UID, claim name or
  // namespace, or a claim in another namespace than the pod; FAILED_PRECONDITION
  // between Restart and SyncPods.
  absl::Status PrepareClaim(const std::string& pod_name, const std::string& pod_namespace,
                            const std::string& pod_uid, const PreparedClaim& claim,
                            const std::vector<std::string>& containers);

  // --- The pod status (ResourceHealthStatus, KEP-4680). ---
  //
  // What the kubelet writes into status.containerStatuses[].
  // allocatedResourcesStatus when its ResourceHealthStatus gate is on
  // (alpha 1.31, beta and on 1.36): generateAPIPodStatus calls the device
  // manager's UpdateAllocatedResourcesStatus at every status sync (their
  // sources: fake_kubelet.cc's table).
  // For each resource of the container, one
  // entry per device ID it holds: the Health of that ID in the latest
  // ListAndWatch list of the resource (allDevices), "Unhealthy" for any
  // value but "Healthy", and "Healthy" when the latest list does not have
  // the ID at all (or the resource has sent none since the kubelet started).
  // A plugin whose stream ended leaves its last list as it was.
  struct ResourceHealth {
    std::string resource_id;
    std::string health;  // "Healthy" or "Unhealthy"
    bool operator==(const ResourceHealth&) const = default;
  };
  struct ResourceStatus {
    std::string name;                       // the resource name
    std::vector<ResourceHealth> resources;  // by device ID
    bool operator==(const ResourceStatus&) const = default;
  };
  // The container's allocatedResourcesStatus, resources by name (a Go map
  // there), device IDs sorted (a Go map there too); empty for a container
  // holding no device.
  std::vector<ResourceStatus> AllocatedResourcesStatus(const std::string& pod_uid,
                                                       const std::string& container) const;

  // The devices of `resource` allocated to the container, in Allocate order
  // (empty if none).
  std::vector<std::string> container_devices(const std::string& pod_uid,
                                             const std::string& container_name,
                                             const std::string& resource) const;

  // --- The pod-resources API (v1.PodResourcesLister). ---
  //
  // List: every admitted pod (in admission order; none between Restart and
  // SyncPods) with its admitted regular containers and, per container, the
  // devices of each resource (with the NUMA nodes the plugin reported; see
  // Options::kubelet_1_20 for the shape). Like the kubelet's, it first drops
  // the allocations of removed pods (UpdateAllocatedDevices) once the sources
  // are ready.
  // GetAllocatableResources: the healthy devices of every resource whose
  // stream is open. Get: UNIMPLEMENTED, as in kubelets without the
  // KubeletPodResourcesGet gate.

  // Serves the pod-resources socket again after StopPodResources. Fails as
  // Start does; FAILED_PRECONDITION when no socket path was given or already
  // serving.
  absl::Status StartPodResources();
  // Stops the pod-resources server and removes its socket (calls in progress
  // fail with UNAVAILABLE). Idempotent.
  void StopPodResources();
  // Each pod-resources call waits `delay` before answering (0: none). A call
  // that is waiting when the server stops fails with UNAVAILABLE.
  void SetPodResourcesDelay(std::chrono::milliseconds delay);
  // While set, every pod-resources call fails at once with RESOURCE_EXHAUSTED
  // "rejected by rate limit", as the kubelet's rate limiter answers.
  void SetPodResourcesExhausted(bool exhausted);

  // Appends `entry_json` (one JSON object, written as given) to
  // PodDeviceEntries in every checkpoint written from now on, as a kubelet
  // of another version or a hand edit could leave one the plugin cannot
  // parse.
  void AddCheckpointEntryForTest(const std::string& entry_json);
  // Pod-resources calls received so far (all methods, rejected ones too).
  int pod_resources_calls() const;
  // Blocks until pod_resources_calls() >= n or `timeout` passes; returns
  // whether the count was reached.
  bool WaitForPodResourcesCalls(int n, std::chrono::milliseconds timeout);

  // The directory served and the registration socket's path.
  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path socket_path() const { return dir_ / kSocketName; }
  // <dir>/kubelet_internal_checkpoint.
  std::filesystem::path checkpoint_path() const { return dir_ / kCheckpointName; }
  // The pod-resources socket's path (empty when not configured).
  const std::filesystem::path& pod_resources_socket_path() const { return pod_resources_socket_; }

  // Shortens how long Register waits for the plugin's socket (default 10 s),
  // so that tests of an unreachable endpoint stay fast.
  void SetDialTimeoutForTest(std::chrono::milliseconds timeout);

 private:
  class RegistrationService;
  class PodResourcesService;

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
    // Since when the endpoint is stopped: the stream of the latest
    // registration ended, or the kubelet restarted (readCheckpoint makes a
    // stopped endpoint of every registered resource, stopped from then on);
    // nullopt while it runs. Reset by Register.
    std::optional<std::chrono::steady_clock::time_point> stopped_since;
    // GetCapacity dropped the endpoint (stopped longer than the grace
    // period before the kubelet's latest restart); Register brings it back.
    bool removed = false;
  };

  // One admitted container of a pod.
  struct Container {
    std::string name;
    bool init = false;
    std::vector<std::pair<std::string, int>> requests;
    // The pod's claims it names in resources.claims.
    std::set<std::string> claims = {};
  };
  // A pod the kubelet was given, with the containers admitted so far.
  struct Pod {
    std::string uid;
    std::string name;
    std::string pod_namespace;
    std::vector<Container> containers;
    // pod.spec.resourceClaims: the claims' names, in order.
    std::vector<std::string> claims = {};
    const Container* Find(const std::string& container) const;
  };
  // The DRA manager's claim info: the claim and the pods using it.
  struct ClaimInfo {
    PreparedClaim claim;
    std::set<std::string> pod_uids;
  };

  // One container's devices of one resource: a checkpoint entry.
  struct DeviceEntry {
    std::string pod_uid;
    std::string container;
    std::string resource;
    // In Allocate order (for a restored entry, in checkpoint order).
    std::vector<std::string> ids;
    // NUMA node (kNoTopology or 0 when unknown) -> IDs, as the checkpoint.
    std::map<int64_t, std::vector<std::string>> ids_by_numa;
    v1beta1::ContainerAllocateResponse response;
  };

  // Chooses and allocates `count` devices of `resource` for the container and
  // records them; returns the kubelet's error text on failure (not wrapped).
  absl::StatusOr<ResourceAllocation> AllocateResource(const std::string& pod_uid,
                                                      const std::string& container, bool init,
                                                      const std::string& resource, int count)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(admission_mu_);
  // The device manager's UpdateAllocatedDevices: drops the allocations of
  // removed pods once the sources are ready (the file keeps them until the
  // next write). Returns whether any went.
  bool CollectRemovedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status StartContainerLocked(const std::string& pod_uid, const std::string& container)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(admission_mu_);
  // Forgets the container's devices (and the pod if `drop_pod`) after a
  // failed admission.
  void RollBackLocked(const std::string& pod_uid, const std::string& container, bool drop_pod)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Pod* FindPodLocked(const std::string& pod_uid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // NUMA node -> IDs of `ids` from the topology `resource` last advertised.
  std::map<int64_t, std::vector<std::string>> GroupByNumaLocked(
      const std::string& resource, const std::vector<std::string>& ids) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the checkpoint atomically (temporary file, then rename).
  absl::Status WriteCheckpointLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Replaces the device entries with the checkpoint's (none if it is missing
  // or unreadable).
  void LoadCheckpointLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Applies the pod-resources knobs to one call: counts it, rejects it when
  // exhausted, waits the delay. OK means: answer it.
  grpc::Status BeginPodResourcesCall();
  void FillListLocked(v1::ListPodResourcesResponse* response) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillAllocatableLocked(v1::AllocatableResourcesResponse* response) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The container's dynamic_resources, as GetDynamicResources fills them.
  void FillDynamicResourcesLocked(const Pod& pod, const Container& container,
                                  v1::ContainerResources* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // unprepareResources for a removed pod: drops its references, and the
  // claim infos no pod references any more.
  void UnprepareClaimsLocked(const std::string& pod_uid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Handles one Register call (called by RegistrationService).
  grpc::Status Register(const v1beta1::RegisterRequest& request);
  // Reads ListAndWatch of `stream` until it ends; the body of a stream thread.
  void Watch(Stream* stream);
  // The stub of the plugin that registered `resource`, or null.
  std::shared_ptr<v1beta1::DevicePlugin::Stub> StubFor(const std::string& resource) const;
  // The record of `resource`, or null.
  const Resource* FindLocked(const std::string& resource) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the device manager has dropped the endpoint of `resource`
  // (Options::endpoint_stop_grace_period).
  bool EndpointRemovedLocked(const Resource& resource) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Status StartLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lifecycle_mu_);
  // Stops both servers and every stream.
  void StopLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lifecycle_mu_);
  absl::Status StartPodResourcesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lifecycle_mu_);
  void StopPodResourcesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lifecycle_mu_);

  const std::filesystem::path dir_;
  const std::filesystem::path pod_resources_socket_;
  const bool kubelet_1_20_;
  const bool dynamic_resources_;
  const std::chrono::milliseconds endpoint_stop_grace_period_;

  // Serializes admissions (AdmitContainer, StartContainer, RemovePod) and
  // keeps Start/Restart/Stop/destructor out while one runs. Held across calls
  // to the plugins. Acquired before lifecycle_mu_ and mu_, never after.
  absl::Mutex admission_mu_ ABSL_ACQUIRED_BEFORE(lifecycle_mu_, mu_);

  // Serializes Start/Restart/Stop/EndStream/destructor; the only holder that
  // joins stream threads. Acquired before mu_, never after.
  absl::Mutex lifecycle_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // A fresh service per server: a gRPC service is registered with one server.
  std::unique_ptr<RegistrationService> service_ ABSL_GUARDED_BY(lifecycle_mu_);
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(lifecycle_mu_);
  std::unique_ptr<PodResourcesService> pod_resources_service_ ABSL_GUARDED_BY(lifecycle_mu_);
  std::unique_ptr<grpc::Server> pod_resources_server_ ABSL_GUARDED_BY(lifecycle_mu_);

  mutable absl::Mutex mu_;
  bool serving_ ABSL_GUARDED_BY(mu_) = false;
  std::chrono::milliseconds dial_timeout_ ABSL_GUARDED_BY(mu_) = kDialTimeout;
  std::map<std::string, Resource> resources_ ABSL_GUARDED_BY(mu_);
  // GetDevicePluginOptions calls in flight inside Register; cancelled by Stop.
  std::set<grpc::ClientContext*> dialing_ ABSL_GUARDED_BY(mu_);
  // Streams replaced by a re-registration: cancelled, joined by Stop.
  std::vector<std::shared_ptr<Stream>> retired_ ABSL_GUARDED_BY(mu_);

  // The pod manager's pods in admission order, and the device manager's pod
  // devices (in the order allocated, or restored from the checkpoint).
  std::vector<Pod> pods_ ABSL_GUARDED_BY(mu_);
  // From Restart to SyncPods: the pods the API server still has, not in the
  // pod manager yet (pods_ is empty then), and the sources are not ready.
  std::vector<Pod> unsynced_ ABSL_GUARDED_BY(mu_);
  bool pods_synced_ ABSL_GUARDED_BY(mu_) = true;
  // Every pod removed: the device manager drops their allocations at its
  // next UpdateAllocatedDevices (CollectRemovedLocked).
  std::set<std::string> removed_ ABSL_GUARDED_BY(mu_);
  std::vector<DeviceEntry> entries_ ABSL_GUARDED_BY(mu_);
  // The device manager's allDevices: resource -> device ID -> health, from
  // the latest ListAndWatch message since the (re)start.
  std::map<std::string, std::map<std::string, std::string>> all_devices_ ABSL_GUARDED_BY(mu_);
  // The DRA manager's claim infos, by "namespace/name".
  std::map<std::string, ClaimInfo> claim_infos_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> extra_entries_ ABSL_GUARDED_BY(mu_);

  // The pod-resources server is up (calls waiting out a delay end when not).
  bool pod_resources_serving_ ABSL_GUARDED_BY(mu_) = false;
  std::chrono::milliseconds pod_resources_delay_ ABSL_GUARDED_BY(mu_){0};
  bool pod_resources_exhausted_ ABSL_GUARDED_BY(mu_) = false;
  int pod_resources_calls_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace efa::testing
