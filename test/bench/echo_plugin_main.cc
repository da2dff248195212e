// efa-bench-echo: the baseline server of efa_bench. A v1beta1.DevicePlugin
// that does no work: every unary call is answered at once with an empty
// message. It is served as the daemon serves (callback API, ServerBuilder
// defaults, insecure credentials, a unix socket of mode 0600), so the
// difference between the two is the daemon's own work.
//   efa-bench-echo SOCKET        (stops on SIGTERM or SIGINT)
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace {

class EchoService final : public v1beta1::DevicePlugin::CallbackService {
 public:
  grpc::ServerUnaryReactor* GetDevicePluginOptions(grpc::CallbackServerContext* context,
                                                   const v1beta1::Empty*,
                                                   v1beta1::DevicePluginOptions*) override {
    return Done(context);
  }
  grpc::ServerUnaryReactor* GetPreferredAllocation(grpc::CallbackServerContext* context,
                                                   const v1beta1::PreferredAllocationRequest*,
                                                   v1beta1::PreferredAllocationResponse*) override {
    return Done(context);
  }
  grpc::ServerUnaryReactor* Allocate(grpc::CallbackServerContext* context,
                                     const v1beta1::AllocateRequest*,
                                     v1beta1::AllocateResponse*) override {
    return Done(context);
  }
  grpc::ServerUnaryReactor* PreStartContainer(grpc::CallbackServerContext* context,
                                              const v1beta1::PreStartContainerRequest*,
                                              v1beta1::PreStartContainerResponse*) override {
    return Done(context);
  }

 private:
  static grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context) {
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: efa-bench-echo SOCKET\n");
    return 2;
  }
  const std::string socket = argv[1];
  // Taken by sigwait below: block them before gRPC starts its threads.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  ::unlink(socket.c_str());
  EchoService service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) {
    std::fprintf(stderr, "efa-bench-echo: cannot serve on %s\n", socket.c_str());
    return 1;
  }
  ::chmod(socket.c_str(), 0600);
  int signal = 0;
  sigwait(&set, &signal);
  server->Shutdown();
  ::unlink(socket.c_str());
  return 0;
}
