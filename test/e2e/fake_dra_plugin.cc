// fake-dra-plugin: a stand-in for the EFA DRA driver's kubelet plugin
// (DRANET, driver "dra.net") in the end-to-end suite (test/e2e/run.sh).
//
// It does on the node what DRANET's kubelet plugin does to register: the
// kubelet's DRA helper (k8s.io/dynamic-resource-allocation kubeletplugin,
// 3d03671: draplugin.go Start, noderegistrar.go, registrationserver.go),
// started by DRANET with DriverName("dra.net") and
// RegistrarDirectoryPath(<kubelet-dir>/plugins_registry) and no rolling
// update (kubernetes-sigs/dranet f258477, pkg/driver/driver.go), serves the
// kubelet's plugin registration API (pluginregistration.Registration) on
// <kubelet-dir>/plugins_registry/dra.net-reg.sock:
//   GetInfo: type "DRAPlugin", name "dra.net", endpoint
//     <kubelet-dir>/plugins/dra.net/dra.sock, supported versions
//     "v1.DRAPlugin" and "v1beta1.DRAPlugin";
//   NotifyRegistrationStatus: OK when registered, else an error
//     "failed registration process: ...", as the helper answers.
// Each call is logged. It serves nothing at the endpoint: it allocates
// nothing. Kubelet 1.20 (the e2e's) has no handler for DRAPlugin: it
// answers NotifyRegistrationStatus "no handler registered for plugin type:
// DRAPlugin at socket ..." and tries again, with backoff, as long as the
// socket is there.
//
// SIGTERM/SIGINT: removes its socket and exits 0. Exits 1 when it cannot
// serve.
#include <signal.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/server_context.h"
#include "pluginregistration/v1/api.grpc.pb.h"
#include "test/e2e/term_signals.h"

namespace {

namespace fs = std::filesystem;

void Log(const std::string& line) {
  std::printf("fake-dra-plugin: %s\n", line.c_str());
  std::fflush(stdout);
}

class Registration final : public pluginregistration::Registration::Service {
 public:
  Registration(std::string driver, std::string endpoint)
      : driver_(std::move(driver)), endpoint_(std::move(endpoint)) {}

  grpc::Status GetInfo(grpc::ServerContext* /*context*/,
                       const pluginregistration::InfoRequest* /*request*/,
                       pluginregistration::PluginInfo* info) override {
    info->set_type("DRAPlugin");
    info->set_name(driver_);
    info->set_endpoint(endpoint_);
    info->add_supported_versions("v1.DRAPlugin");
    info->add_supported_versions("v1beta1.DRAPlugin");
    Log("GetInfo");
    return grpc::Status::OK;
  }

  grpc::Status NotifyRegistrationStatus(
      grpc::ServerContext* /*context*/, const pluginregistration::RegistrationStatus* status,
      pluginregistration::RegistrationStatusResponse* /*response*/) override {
    Log(absl::StrFormat("NotifyRegistrationStatus: registered %s, error \"%s\"",
                        status->plugin_registered() ? "true" : "false", status->error()));
    if (!status->plugin_registered()) {
      return grpc::Status(grpc::StatusCode::UNKNOWN,
                          "failed registration process: " + status->error());
    }
    return grpc::Status::OK;
  }

 private:
  const std::string driver_;
  const std::string endpoint_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"A fake EFA DRA driver's kubelet plugin registration for the end-to-end suite."};
  std::string kubelet_dir = "/var/lib/kubelet";
  std::string driver = "dra.net";
  app.add_option("--kubelet-dir", kubelet_dir, "The kubelet's root directory")
      ->capture_default_str();
  app.add_option("--driver", driver, "The DRA driver's name")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  // Signals are taken synchronously by the main loop below.
  sigset_t signals = efa::e2e::BlockTermSignals();

  const fs::path registry = fs::path(kubelet_dir) / "plugins_registry";
  const fs::path socket = registry / (driver + "-reg.sock");
  const fs::path endpoint = fs::path(kubelet_dir) / "plugins" / driver / "dra.sock";
  std::error_code ec;
  fs::create_directories(registry, ec);
  fs::create_directories(endpoint.parent_path(), ec);
  fs::remove(socket, ec);  // a stale one of an earlier run
  Registration service(driver, endpoint.string());
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix://" + socket.string(), grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    Log("cannot serve on " + socket.string());
    return 1;
  }
  Log(absl::StrFormat("serving the registration of DRA driver %s on %s", driver, socket.string()));
  int sig = 0;
  while (sig != SIGTERM && sig != SIGINT) sig = sigwaitinfo(&signals, nullptr);
  server->Shutdown();
  fs::remove(socket, ec);
  Log("stopped");
  return 0;
}
