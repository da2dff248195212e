// A client of the kubelet's pod-resources API (v1 List) that never makes an
// allocation wait long: short deadlines, a client-side rate limit below the
// kubelet's (100 QPS, burst 10, shared by every client on the node), and a
// fresh connection after any failure or when the socket is created again,
// so a restarted kubelet is found again. While the socket is absent (no
// kubelet, or the directory is not mounted) List fails at once, without
// dialing: an inotify watch says when that changes.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "plugin/kubelet/file_change_watch.h"
#include "plugin/runtime/clock.h"
#include "podresources/v1/api.grpc.pb.h"

namespace efa::plugin {

// The largest List answer read: what the kubelet's own clients of the API
// accept (test/e2e_node/util.go, defaultPodResourcesMaxSize). A pod's entry
// is its names and its containers' devices, CPUs and memory, about 1 KiB;
// the kubelet sends answers of any size (grpc-go's server has no send
// limit), and any tenant's pods are in it.
inline constexpr int kMaxPodResourcesAnswerBytes = 16 << 20;

class PodResourcesClient {
 public:
  struct Options {
    std::chrono::milliseconds timeout{250};
    double max_qps = 20;  // leaves most of the kubelet's 100 QPS to others
    double burst = 5;
    // A larger answer is refused (RESOURCE_EXHAUSTED) and not read.
    int max_answer_bytes = kMaxPodResourcesAnswerBytes;
    // The time the rate limit refills by: the daemon's clock, so that a test
    // moving a fake one gives tokens as a real minute would. Not owned;
    // outlives the client.
    const Clock* clock = &Clock::Steady();
  };
  PodResourcesClient(std::filesystem::path socket, Options options);

  // Lists every pod's devices. Fails with UNAVAILABLE (socket absent, at
  // once, or kubelet down), DEADLINE_EXCEEDED (slower than the timeout),
  // RESOURCE_EXHAUSTED (over our own limit when `rate_limited`, or the
  // kubelet's, or an answer over max_answer_bytes: "<socket>: List: answer
  // larger than 16 MiB, refused (...)"), each message naming the socket. Calls that are not
  // rate-limited still spend a token. Thread-safe.
  absl::StatusOr<v1::ListPodResourcesResponse> List(bool rate_limited = true);
  // Whether List failed for want of a token of our own limit (nothing was
  // asked), not for anything the kubelet said.
  static bool IsOwnRateLimit(const absl::Status& status);

  const std::filesystem::path& socket() const { return socket_; }

 private:
  // The stub, or null while the socket is absent.
  std::shared_ptr<v1::PodResourcesLister::Stub> Stub();
  bool TakeToken(bool rate_limited);

  const std::filesystem::path socket_;
  const Options options_;
  FileChangeWatch watch_;
  absl::Mutex mu_;
  bool present_ ABSL_GUARDED_BY(mu_) = false;  // as of the latest change
  std::shared_ptr<v1::PodResourcesLister::Stub> stub_ ABSL_GUARDED_BY(mu_);
  double tokens_ ABSL_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point refilled_ ABSL_GUARDED_BY(mu_);
};

}  // namespace efa::plugin
