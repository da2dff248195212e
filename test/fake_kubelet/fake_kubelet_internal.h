// What the files of FakeKubelet share and its users need not see: the two
// gRPC services it serves and the kubelet's timeouts. Included only by
// test/fake_kubelet/fake_kubelet*.cc; the class itself is fake_kubelet.h.
// Which file holds which part of the kubelet: the table at the top of
// fake_kubelet.cc.
#pragma once

#include <chrono>

#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/status.h"
#include "podresources/v1/api.grpc.pb.h"
#include "test/fake_kubelet/fake_kubelet.h"

namespace efa::testing {

// v1beta1.Registration on kubelet.sock: every call is FakeKubelet::Register.
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

// v1.PodResourcesLister over the kubelet's state (fake_kubelet_pod_resources.cc).
class FakeKubelet::PodResourcesService final : public v1::PodResourcesLister::Service {
 public:
  explicit PodResourcesService(FakeKubelet* kubelet) : kubelet_(kubelet) {}

  grpc::Status List(grpc::ServerContext* context, const v1::ListPodResourcesRequest* request,
                    v1::ListPodResourcesResponse* response) override;
  grpc::Status GetAllocatableResources(grpc::ServerContext* context,
                                       const v1::AllocatableResourcesRequest* request,
                                       v1::AllocatableResourcesResponse* response) override;
  grpc::Status Get(grpc::ServerContext* context, const v1::GetPodResourcesRequest* request,
                   v1::GetPodResourcesResponse* response) override;

 private:
  FakeKubelet* const kubelet_;
};

namespace fake_kubelet_internal {

// How long Stop lets in-flight Register calls finish before gRPC cancels them.
// They have been cancelled already, so this is a backstop, not a wait.
inline constexpr auto kShutdownGrace = std::chrono::seconds(2);
// The kubelet's timeout for PreStartContainer.
inline constexpr auto kPreStartTimeout = std::chrono::seconds(30);

}  // namespace fake_kubelet_internal

}  // namespace efa::testing
