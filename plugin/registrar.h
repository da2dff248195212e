// The daemon's standing with the kubelet: serving the device plugin API on
// its socket, registering the resource, and the backoff between failed
// attempts.
#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "plugin/device_plugin_service.h"
#include "plugin/runtime/clock.h"

namespace grpc {
class Server;
}

namespace efa::plugin {

// Owner thread only, except the accessors that say they are thread-safe.
class Registrar {
 public:
  struct Options {
    std::filesystem::path kubelet_dir;
    std::string resource_name;
    const Clock* clock = &Clock::Steady();
  };
  // Why the resource is registered again at once (RegisterAgainNow).
  enum class Reason {
    kKubeletSocketCreated,  // kubelet.sock created: a kubelet (re)started
    kPluginSocketDeleted,   // our socket or its directory deleted (by someone)
    kStreamEnded,           // the kubelet ended ListAndWatch
    kSighup,                // the operator asked
    kEventsLost,            // inotify overflowed: a restart may be among them
    kDraDriverGone,         // the guards stop withholding the resource
  };

  // `service` (not owned) is served on the plugin socket; it outlives this.
  Registrar(Options options, DevicePluginService* service);
  ~Registrar();
  Registrar(const Registrar&) = delete;
  Registrar& operator=(const Registrar&) = delete;

  std::filesystem::path plugin_socket() const;
  std::filesystem::path kubelet_socket() const;
  // Whether kubelet.sock is there to register with (a socket file).
  bool KubeletSocketPresent() const;

  // Whether the latest registration stands (no reason to register again
  // came since).
  bool registered() const { return registered_; }
  // Whether another device plugin serves the socket, so that this one
  // neither serves nor registers (StartServer).
  bool standing_aside() const { return standing_aside_; }
  // When the next attempt is due.
  Clock::time_point next_attempt() const { return next_attempt_; }
  // Marks the resource unregistered and the next attempt due now, logging
  // why where the caller does not; `reason` decides whether the backoff of
  // earlier failures still applies (registrar.cc).
  void RegisterAgainNow(Reason reason);

  // Serves the device plugin API on a fresh socket (mode 0600); the error
  // names the socket and the cause. When another server accepts
  // connections on the socket (the plugin's host service while this one
  // runs in the chart's pod, or the other way round) it is left alone:
  // AlreadyExists, logged once until serving starts.
  absl::Status StartServer();
  // Ends the streams, stops serving and removes the socket. Idempotent.
  void StopServer();
  // Serves afresh when the socket is gone or serving failed before, then
  // registers (blocking up to 10 s); on failure logs it and schedules the
  // next attempt with backoff.
  void Register();

  // Successful registrations so far. Thread-safe.
  int registrations() const { return registrations_.load(); }
  // Times kubelet.sock was created again after a first registration (the
  // kubelet restarted). Thread-safe.
  int kubelet_restarts() const { return kubelet_restarts_.load(); }

 private:
  // Schedules the next attempt with backoff, logging `why` unless empty.
  void RetryLater(std::string_view why);

  const Options options_;
  DevicePluginService* const service_;
  std::unique_ptr<grpc::Server> server_;
  bool registered_ = false;
  bool standing_aside_ = false;
  Clock::time_point next_attempt_;
  std::chrono::milliseconds backoff_{0};  // doubles while attempts fail
  // kubelet.sock was created and no attempt has succeeded since: the first
  // retries come within milliseconds (RetryLater).
  bool new_kubelet_ = false;
  std::atomic<int> registrations_{0};
  std::atomic<int> kubelet_restarts_{0};
};

}  // namespace efa::plugin
