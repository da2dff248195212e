// What the device-plugin service tells an observer (metrics) about the RPCs
// it handles: which method, how long the handler took, how it ended, and
// how many EFAs each allocated container got. Kept apart from the service
// so that the service does not depend on the metrics registry.
#pragma once

#include <grpcpp/support/status_code_enum.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace efa::plugin {

enum class RpcMethod : uint8_t {
  kGetDevicePluginOptions,
  kListAndWatch,
  kGetPreferredAllocation,
  kAllocate,
  kPreStartContainer,
};
inline constexpr size_t kRpcMethodCount = 5;

// The method's name in the v1beta1.DevicePlugin service ("Allocate").
constexpr std::string_view RpcMethodName(RpcMethod method) {
  switch (method) {
    case RpcMethod::kGetDevicePluginOptions:
      return "GetDevicePluginOptions";
    case RpcMethod::kListAndWatch:
      return "ListAndWatch";
    case RpcMethod::kGetPreferredAllocation:
      return "GetPreferredAllocation";
    case RpcMethod::kAllocate:
      return "Allocate";
    case RpcMethod::kPreStartContainer:
      return "PreStartContainer";
  }
  return "unknown";
}

// Called on gRPC threads, concurrently: implementations must be thread-safe
// and cheap (no locks on the common path, no I/O).
class RpcObserver {
 public:
  virtual ~RpcObserver() = default;
  // A unary handler finished with `code` after `elapsed`.
  virtual void RpcHandled(RpcMethod method, grpc::StatusCode code,
                          std::chrono::nanoseconds elapsed) = 0;
  // Allocate gave one container `devices` EFAs: physical ones, each once
  // however many of its replicas; with late binding the device IDs (the
  // EFAs are bound later).
  virtual void ContainerAllocated(size_t devices) = 0;
  // Allocate gave a container the physical EFA `ibdev` (once per container,
  // however many of its replicas; not with late binding). Default: nothing.
  virtual void EfaAllocated(std::string_view /*ibdev*/) {}
};

// Times one handler and reports it when it goes out of scope; does nothing
// (not even read the clock) without an observer.
class RpcTimer {
 public:
  RpcTimer(RpcObserver* observer, RpcMethod method)
      : observer_(observer),
        method_(method),
        start_(observer ? std::chrono::steady_clock::now()
                        : std::chrono::steady_clock::time_point()) {}
  ~RpcTimer() {
    if (observer_) observer_->RpcHandled(method_, code_, std::chrono::steady_clock::now() - start_);
  }
  RpcTimer(const RpcTimer&) = delete;
  RpcTimer& operator=(const RpcTimer&) = delete;

  void set_code(grpc::StatusCode code) { code_ = code; }

 private:
  RpcObserver* const observer_;
  const RpcMethod method_;
  const std::chrono::steady_clock::time_point start_;
  grpc::StatusCode code_ = grpc::StatusCode::OK;
};

}  // namespace efa::plugin
