// The daemon's owner loop: discover, serve, register, watch, re-register.
#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "plugin/device_plugin_service.h"
#include "topology/sysfs.h"

namespace grpc {
class Server;
}

namespace efa::plugin {

struct DaemonOptions {
  topology::HostRoots roots;
  std::filesystem::path kubelet_dir = "/var/lib/kubelet";
  bool report_numa = true;
  // Fallback rescan for hosts where neither uevents nor inotify report a
  // change (a pod without the host's network namespace gets no uevents).
  std::chrono::milliseconds rescan_interval{10000};
  // Take SIGTERM/SIGINT (stop) and SIGHUP (rescan and re-register) through
  // a signalfd; the caller must have blocked them in every thread.
  bool handle_signals = false;
};

// Runs the plugin. One owner thread (the caller of Run) does all lifecycle
// work; gRPC threads only read the service's immutable snapshots.
class Daemon {
 public:
  explicit Daemon(DaemonOptions options);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Blocks until Stop() or a stop signal. Returns the process exit code:
  // 0 after a clean stop (streams closed, socket removed), 1 when the
  // plugin socket cannot be served at all.
  int Run();
  // Asks Run() to return. Thread-safe, async-signal-unsafe.
  void Stop();

  // Successful registrations with the kubelet so far. Thread-safe.
  int registrations() const { return registrations_.load(); }
  std::filesystem::path plugin_socket() const;
  std::filesystem::path kubelet_socket() const;

 private:
  struct Fds;
  void Rescan();
  bool StartServer();
  void StopServer();
  void TryRegister();
  void HandleInotify();
  void WatchDeviceDirs();
  void Wake();

  const DaemonOptions options_;
  DevicePluginService service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Fds> fds_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> stream_ended_{false};
  std::atomic<int> registrations_{0};

  // Owner-thread state.
  bool registered_ = false;
  std::chrono::steady_clock::time_point next_register_;
  std::chrono::milliseconds register_backoff_{0};
  std::chrono::steady_clock::time_point next_rescan_;
  std::map<std::string, topology::EfaDevice> known_;  // every EFA seen, by ID
  std::set<std::string> logged_skips_;
  std::map<int, std::string> device_watches_;  // inotify wd -> directory
  int kubelet_watch_ = -1;
};

}  // namespace efa::plugin
