#include "plugin/kubelet/pod_resources_client.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <algorithm>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "topology/sysfs.h"

namespace efa::plugin {
namespace {

// Marks the refusal of our own rate limit (a status payload's type URL).
constexpr char kOwnRateLimitPayload[] = "efa.plugin/pod-resources-own-rate-limit";

}  // namespace

PodResourcesClient::PodResourcesClient(std::filesystem::path socket, Options options)
    : socket_(std::move(socket)),
      options_(std::move(options)),
      watch_(socket_),
      tokens_(options_.burst),
      refilled_(options_.clock->Now()) {}

bool PodResourcesClient::TakeToken(bool rate_limited) {
  absl::MutexLock lock(&mu_);
  auto now = options_.clock->Now();
  tokens_ =
      std::min(options_.burst,
               tokens_ + std::chrono::duration<double>(now - refilled_).count() * options_.max_qps);
  refilled_ = now;
  if (tokens_ < 1 && rate_limited) return false;
  tokens_ = std::max(tokens_ - 1, -options_.burst);
  return true;
}

std::shared_ptr<v1::PodResourcesLister::Stub> PodResourcesClient::Stub() {
  absl::MutexLock lock(&mu_);
  if (watch_.Changed()) {
    // Created, removed or replaced: a new kubelet needs a new channel.
    struct stat st;
    present_ = ::stat(socket_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
    stub_.reset();
  }
  if (!present_) return nullptr;
  if (!stub_) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(options_.max_answer_bytes);
    stub_ = v1::PodResourcesLister::NewStub(grpc::CreateCustomChannel(
        "unix:" + socket_.string(), grpc::InsecureChannelCredentials(), args));
  }
  return stub_;
}

bool PodResourcesClient::IsOwnRateLimit(const absl::Status& status) {
  return status.GetPayload(kOwnRateLimitPayload).has_value();
}

absl::StatusOr<v1::ListPodResourcesResponse> PodResourcesClient::List(bool rate_limited) {
  if (!TakeToken(rate_limited)) {
    absl::Status status = absl::ResourceExhaustedError(
        absl::StrCat(socket_.string(), ": over the client's own rate limit of ", options_.max_qps,
                     " queries per second"));
    status.SetPayload(kOwnRateLimitPayload, absl::Cord());
    return status;
  }
  auto stub = Stub();
  if (!stub) {
    return absl::UnavailableError(
        absl::StrCat(socket_.string(),
                     ": List: no such socket (the kubelet's pod-resources API "
                     "is not served there)"));
  }
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options_.timeout);
  v1::ListPodResourcesResponse response;
  grpc::Status status = stub->List(&context, v1::ListPodResourcesRequest(), &response);
  if (status.ok()) return response;
  if (status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) {
    // A new channel next time: after a kubelet restart the old one may sit
    // in reconnect backoff long after the new socket is up.
    absl::MutexLock lock(&mu_);
    if (stub_ == stub) stub_.reset();
  }
  if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
      absl::StrContains(status.error_message(), "larger than max")) {
    // gRPC's own words name neither the input nor the unit.
    return absl::ResourceExhaustedError(
        absl::StrCat(socket_.string(), ": List: answer larger than ",
                     topology::SizeText(static_cast<size_t>(options_.max_answer_bytes)),
                     ", refused (", status.error_message(), ")"));
  }
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(socket_.string(), ": List: ", status.error_message()));
}

}  // namespace efa::plugin
