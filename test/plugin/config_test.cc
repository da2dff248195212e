// The configuration: precedence of flags, environment, file and defaults,
// and the exact message for each kind of invalid input.
#include "plugin/config.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "plugin/ops/api_server.h"
#include "test/plugin/guard_fakes.h"

namespace fs = std::filesystem;
using namespace efa::plugin;
using efa::testing::TempDir;

namespace {

EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// Parses `args` as the binary does and resolves the configuration.
absl::StatusOr<EffectiveConfig> Resolve(std::vector<std::string> args,
                                        std::map<std::string, std::string> env = {}) {
  CLI::App app;
  ConfigFlags flags(app);
  args.insert(args.begin(), "efa-k8s-device-plugin");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  return ResolveConfig(flags, FakeEnv(std::move(env)));
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

void WriteFile(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

}  // namespace

TEST_CASE("Options take the flag over the environment over the file over the default", "[config]") {
  TempDir dir;
  const fs::path file = dir.path() / "config.yaml";
  WriteFile(file,
            "version: v1\n"
            "rescanInterval: 30s\n"
            "logLevel: debug\n"
            "reportNuma: false\n"
            "gpuResources: [example.com/gpu]\n"
            "expectedEfaCount: 8\n");
  auto c = Resolve({"--rescan-interval", "5s", "--sysfs-root=/host/sys"},
                   {{"EFA_CONFIG", file.string()},
                    {"EFA_RESCAN_INTERVAL", "20s"},
                    {"EFA_LOG_LEVEL", "warn"},
                    {"EFA_SYSFS_ROOT", "/env/sys"}});
  REQUIRE(c.ok());
  CHECK(*c->config.rescan_interval == std::chrono::seconds(5));  // flag over env and file
  CHECK(*c->config.sysfs_root == "/host/sys");                   // flag over env
  CHECK(*c->config.log_level == LogLevel::kWarn);                // env over file
  CHECK(*c->config.report_numa == false);                        // file over default
  CHECK(*c->config.gpu_resources == std::vector<std::string>{"example.com/gpu"});
  CHECK(*c->config.expected_efa_count == 8);
  CHECK(*c->config.dev_root == "/dev");  // default
  CHECK(*c->config.metrics_address == ":8080");
  CHECK(*c->config.probe_address == ":8081");
  CHECK(c->origin == std::map<std::string, std::string>{{"rescanInterval", "--rescan-interval"},
                                                        {"sysfsRoot", "--sysfs-root"},
                                                        {"logLevel", "EFA_LOG_LEVEL"},
                                                        {"reportNuma", file.string()},
                                                        {"gpuResources", file.string()},
                                                        {"expectedEfaCount", file.string()}});
}

TEST_CASE("The --config flag wins over EFA_CONFIG, and without either no file is read",
          "[config]") {
  TempDir dir;
  WriteFile(dir.path() / "a.yaml", "version: v1\nlogLevel: error\n");
  WriteFile(dir.path() / "b.yaml", "version: v1\nlogLevel: trace\n");
  auto c = Resolve({"--config", (dir.path() / "a.yaml").string()},
                   {{"EFA_CONFIG", (dir.path() / "b.yaml").string()}});
  REQUIRE(c.ok());
  CHECK(*c->config.log_level == LogLevel::kError);
  c = Resolve({}, {{"EFA_CONFIG", (dir.path() / "b.yaml").string()}});
  REQUIRE(c.ok());
  CHECK(*c->config.log_level == LogLevel::kTrace);
  c = Resolve({});
  REQUIRE(c.ok());
  CHECK(c->config == DefaultConfig());
  CHECK(c->origin.empty());
}

TEST_CASE("Lists come comma-separated or repeated from flags, and empty means none", "[config]") {
  auto c = Resolve({"--gpu-resources", "a.com/x, b.com/y", "--neuron-resources=c.com/n",
                    "--neuron-resources", "d.com/n", "--cdi-spec-dirs="},
                   {{"EFA_NEURONCORE_RESOURCES", ""}});
  REQUIRE(c.ok());
  CHECK(*c->config.gpu_resources == std::vector<std::string>{"a.com/x", "b.com/y"});
  CHECK(*c->config.neuron_resources == std::vector<std::string>{"c.com/n", "d.com/n"});
  CHECK(c->config.cdi_spec_dirs->empty());
  CHECK(c->config.neuroncore_resources->empty());
}

TEST_CASE("A boolean flag alone means true; with a value it takes the value", "[config]") {
  auto c = Resolve({"--report-numa"}, {{"EFA_REPORT_NUMA", "false"}});
  REQUIRE(c.ok());
  CHECK(*c->config.report_numa == true);
  c = Resolve({"--report-numa", "false"});
  REQUIRE(c.ok());
  CHECK(*c->config.report_numa == false);
}

TEST_CASE("An empty metrics address from the environment turns the endpoints off", "[config]") {
  auto c = Resolve({}, {{"EFA_METRICS_ADDRESS", ""}, {"EFA_TOPOLOGY_XML", ""}});
  REQUIRE(c.ok());
  CHECK(*c->config.metrics_address == "");
  CHECK(c->origin.at("metricsAddress") == "EFA_METRICS_ADDRESS");
}

TEST_CASE("The CDI handover is named by its value in a flag, the environment or the file",
          "[config]") {
  const std::vector<std::pair<std::string, CdiHandover>> values = {
      {"both", CdiHandover::kBoth},
      {"cdi-devices", CdiHandover::kCdiDevices},
      {"annotation", CdiHandover::kAnnotation}};
  for (const auto& [name, value] : values) {
    INFO(name);
    auto c = Resolve({"--cdi-handover", name});
    REQUIRE(c.ok());
    CHECK(ToDaemonOptions(c->config).cdi_handover == value);
    c = Resolve({}, {{"EFA_CDI_HANDOVER", name}});
    REQUIRE(c.ok());
    CHECK(ToDaemonOptions(c->config).cdi_handover == value);
    CHECK(c->ToYaml().find("\ncdiHandover: " + name + "  # from EFA_CDI_HANDOVER\n") !=
          std::string::npos);
  }
  auto c = Resolve({"--cdi-handover=annotations"});
  REQUIRE_FALSE(c.ok());
  CHECK(Message(c.status()) ==
        "--cdi-handover: expected one of both, cdi-devices, annotation, got \"annotations\"");
}

TEST_CASE("A null value in the file counts as not given", "[config]") {
  auto c = ParseConfigYaml("version: v1\nlogLevel:\ngpuResources: ~\ninstanceType: null\n",
                           "config.yaml");
  REQUIRE(c.ok());
  CHECK(*c == Config{});
}

TEST_CASE("Every option parses from the file", "[config]") {
  auto c = ParseConfigYaml(
      "version: v1\n"
      "sysfsRoot: /host/sys\n"
      "devRoot: /host/dev\n"
      "procRoot: /host/proc\n"
      "kubeletDir: /var/lib/k\n"
      "topologyXml: /etc/topo.xml\n"
      "instanceType: p5.48xlarge\n"
      "reportNuma: false\n"
      "rescanInterval: 1m30s\n"
      "logLevel: trace\n"
      "logFormat: json\n"
      "metricsAddress: 127.0.0.1:9090\n"
      "probeAddress: \"\"\n"
      "metricsMaxConnections: 8\n"
      "probeMaxConnections: 2\n"
      "httpRequestTimeout: 1500ms\n"
      "alignment: late-binding\n"
      "gpuResources: [nvidia.com/gpu, nvidia.com/mig-1g.10gb]\n"
      "neuronResources: []\n"
      "neuroncoreResources:\n  - aws.amazon.com/neuroncore\n"
      "neuroncoresPerDevice: 4\n"
      "cdiDir: /run/cdi\n"
      "cdiHandover: annotation\n"
      "mofedPolicy: protect\n"
      "draPolicy: ignore\n"
      "draDrivers: [dra.net, efa.dra.example.com]\n"
      "cdiSpecDirs: [/etc/cdi]\n"
      "expectedEfaCount: 31\n"
      "sharingReplicas: 4\n"
      "sharingRenameByDefault: true\n"
      "counterInterval: 30s\n"
      "idleTimeout: 2h\n"
      "deviceHealth: true\n"
      "deviceHealthKeepAliveTimeout: 45s\n"
      "deviceHealthAdminErrors: 3\n"
      "deviceHealthHoldDown: 10m\n",
      "config.yaml");
  REQUIRE(c.ok());
  Config want;
  want.sysfs_root = "/host/sys";
  want.dev_root = "/host/dev";
  want.proc_root = "/host/proc";
  want.kubelet_dir = "/var/lib/k";
  want.topology_xml = "/etc/topo.xml";
  want.instance_type = "p5.48xlarge";
  want.report_numa = false;
  want.rescan_interval = std::chrono::seconds(90);
  want.log_level = LogLevel::kTrace;
  want.log_format = LogFormat::kJson;
  want.metrics_address = "127.0.0.1:9090";
  want.probe_address = "";
  want.metrics_max_connections = 8;
  want.probe_max_connections = 2;
  want.http_request_timeout = std::chrono::milliseconds(1500);
  want.alignment = AlignmentMode::kLateBinding;
  want.gpu_resources = std::vector<std::string>{"nvidia.com/gpu", "nvidia.com/mig-1g.10gb"};
  want.neuron_resources = std::vector<std::string>{};
  want.neuroncore_resources = std::vector<std::string>{"aws.amazon.com/neuroncore"};
  want.neuroncores_per_device = 4;
  want.cdi_dir = "/run/cdi";
  want.cdi_handover = CdiHandover::kAnnotation;
  want.mofed_policy = MofedPolicy::kProtect;
  want.dra_policy = DraPolicy::kIgnore;
  want.dra_drivers = std::vector<std::string>{"dra.net", "efa.dra.example.com"};
  want.cdi_spec_dirs = std::vector<std::string>{"/etc/cdi"};
  want.expected_efa_count = 31;
  want.sharing_replicas = 4;
  want.sharing_rename_by_default = true;
  want.counter_interval = std::chrono::seconds(30);
  want.idle_timeout = std::chrono::hours(2);
  want.device_health = true;
  want.device_health_keep_alive_timeout = std::chrono::seconds(45);
  want.device_health_admin_errors = 3;
  want.device_health_hold_down = std::chrono::minutes(10);
  CHECK(*c == want);

  DaemonOptions o = ToDaemonOptions(MergeConfig(DefaultConfig(), *c));
  CHECK(o.roots.sysfs == "/host/sys");
  CHECK(o.roots.dev == "/host/dev");
  CHECK(o.roots.proc == "/host/proc");
  CHECK(o.kubelet_dir == "/var/lib/k");
  CHECK(o.topology_xml == "/etc/topo.xml");
  CHECK(o.instance_type == "p5.48xlarge");
  CHECK_FALSE(o.report_numa);
  CHECK(o.rescan_interval == std::chrono::seconds(90));
  CHECK(o.alignment == AlignmentMode::kLateBinding);
  CHECK(o.accelerator_resources.gpu.size() == 2);
  CHECK(o.accelerator_resources.neuron.empty());
  CHECK(o.accelerator_resources.neuroncores_per_device == 4);
  CHECK(o.cdi_dir == "/run/cdi");
  CHECK(o.cdi_handover == CdiHandover::kAnnotation);
  // Both by default: older kubelets read only the annotation (docs/alignment.md, "Late binding").
  CHECK(ToDaemonOptions(DefaultConfig()).cdi_handover == CdiHandover::kBoth);
  CHECK(o.guards.mofed_policy == MofedPolicy::kProtect);
  CHECK(o.guards.dra_policy == DraPolicy::kIgnore);
  CHECK(o.guards.dra_drivers == std::vector<std::string>{"dra.net", "efa.dra.example.com"});
  CHECK(o.guards.cdi_spec_dirs == std::vector<fs::path>{"/etc/cdi"});
  CHECK(o.replicas == 4);
  CHECK(o.resource_name == "vpc.amazonaws.com/efa.shared");
  CHECK(o.counters.interval == std::chrono::seconds(30));
  CHECK(o.counters.idle_timeout == std::chrono::hours(2));
  CHECK(o.counters.health.enabled);
  CHECK(o.counters.health.keep_alive_timeout == std::chrono::seconds(45));
  CHECK(o.counters.health.admin_errors == 3);
  CHECK(o.counters.health.hold_down == std::chrono::minutes(10));
  // Device health is off by default.
  CHECK_FALSE(ToDaemonOptions(DefaultConfig()).counters.health.enabled);
  CHECK(ToDaemonOptions(DefaultConfig()).counters.idle_timeout == std::chrono::minutes(10));
  // Renaming applies only while sharing; by default the name stays.
  c->sharing_replicas = 1;
  CHECK(ToDaemonOptions(*c).resource_name == "vpc.amazonaws.com/efa");
  CHECK(ToDaemonOptions(DefaultConfig()).replicas == 1);
  CHECK(ToDaemonOptions(DefaultConfig()).resource_name == "vpc.amazonaws.com/efa");
  c->sharing_replicas = 2;
  c->sharing_rename_by_default = std::nullopt;
  CHECK(ToDaemonOptions(*c).resource_name == "vpc.amazonaws.com/efa");

  // The process's own settings.
  const Settings s = ToSettings(*c);
  CHECK(s.metrics_address == "127.0.0.1:9090");
  CHECK(s.probe_address.empty());
  CHECK(s.limits.metrics_connections == 8);
  CHECK(s.limits.probe_connections == 2);
  CHECK(s.limits.request_timeout == std::chrono::milliseconds(1500));
  // A scrape that makes claim lookups is answered within httpRequestTimeout.
  CHECK(s.daemon.counters.claim_lookup_time == std::chrono::milliseconds(500));
  CHECK(ToSettings(DefaultConfig()).daemon.counters.claim_lookup_time ==
        std::chrono::milliseconds(1000));
  c->http_request_timeout = std::chrono::seconds(30);
  CHECK(ToSettings(*c).daemon.counters.claim_lookup_time == efa::plugin::ApiServer::kTimeout);
  CHECK(s.log_level == LogLevel::kTrace);
  CHECK(s.log_format == LogFormat::kJson);
  CHECK(s.expected_efa_count == 31);
  CHECK(s.daemon.accelerator_resources.neuroncore ==
        std::vector<std::string>{"aws.amazon.com/neuroncore"});
}

// The defaults are written once, in the options of the parts that use them
// (plugin/daemon.h, the parts' settings, plugin/runtime/host_paths.h);
// the configuration, its --help and docs/configuration.md read them there.
TEST_CASE("The configuration's defaults are the parts' own, every option has one", "[config]") {
  const Config d = DefaultConfig();
  const DaemonOptions daemon;
  CHECK(*d.sysfs_root == efa::topology::HostRoots{}.sysfs.string());
  CHECK(*d.kubelet_dir == kDefaultKubeletDir);
  CHECK(*d.cdi_dir == kRuntimeCdiDir);
  CHECK(*d.cdi_spec_dirs == std::vector<std::string>{kStaticCdiDir, kRuntimeCdiDir});
  CHECK(*d.rescan_interval == daemon.rescan_interval);
  CHECK(*d.mofed_policy == GuardSettings{}.mofed_policy);
  CHECK(*d.dra_drivers == std::vector<std::string>{"dra.net"});
  CHECK(*d.counter_interval == EfaCounterSettings{}.interval);
  CHECK(*d.device_health_hold_down == DeviceHealthOptions{}.hold_down);
  CHECK(*d.metrics_max_connections == EndpointLimits{}.metrics_connections);
  CHECK(*d.http_request_timeout == EndpointLimits{}.request_timeout);
  // No option without a default (it would print as ~).
  const std::string yaml = EffectiveConfig{d, {}}.ToYaml();
  INFO(yaml);
  CHECK(yaml.find(": ~") == std::string::npos);
  // And the defaults give the default options.
  const DaemonOptions back = ToDaemonOptions(d);
  CHECK(back.roots.proc == daemon.roots.proc);
  CHECK(back.cdi_dir == daemon.cdi_dir);
  CHECK(back.guards.cdi_spec_dirs == daemon.guards.cdi_spec_dirs);
  CHECK(back.counters.health.admin_errors == daemon.counters.health.admin_errors);
  CHECK(back.resource_name == daemon.resource_name);
}

TEST_CASE("The printed configuration reads back as the same configuration", "[config]") {
  auto c = Resolve({"--rescan-interval=1.5s", "--metrics-address="},
                   {{"EFA_GPU_RESOURCES", "a.com/g\"q"}, {"EFA_INSTANCE_TYPE", "trn2.48xlarge"}});
  REQUIRE_FALSE(c.ok());  // a quote is not part of a resource name
  c = Resolve({"--rescan-interval=1.5s", "--metrics-address=", "--kubelet-dir=/a \"b\"\\c"},
              {{"EFA_INSTANCE_TYPE", "trn2.48xlarge"}});
  REQUIRE(c.ok());
  const std::string yaml = c->ToYaml();
  CHECK(yaml ==
        "version: v1\n"
        "sysfsRoot: \"/sys\"\n"
        "devRoot: \"/dev\"\n"
        "procRoot: \"/proc\"\n"
        "kubeletDir: \"/a \\\"b\\\"\\\\c\"  # from --kubelet-dir\n"
        "topologyXml: \"\"\n"
        "instanceType: \"trn2.48xlarge\"  # from EFA_INSTANCE_TYPE\n"
        "reportNuma: true\n"
        "rescanInterval: 1.5s  # from --rescan-interval\n"
        "logLevel: info\n"
        "logFormat: text\n"
        "metricsAddress: \"\"  # from --metrics-address\n"
        "probeAddress: \":8081\"\n"
        "metricsMaxConnections: 64\n"
        "probeMaxConnections: 16\n"
        "httpRequestTimeout: 3s\n"
        "alignment: best-effort\n"
        "gpuResources: [\"nvidia.com/gpu\"]\n"
        "neuronResources: [\"aws.amazon.com/neuron\"]\n"
        "neuroncoreResources: [\"aws.amazon.com/neuroncore\"]\n"
        "neuroncoresPerDevice: 0\n"
        "cdiDir: \"/var/run/cdi\"\n"
        "cdiHandover: both\n"
        "mofedPolicy: warn\n"
        "draPolicy: yield\n"
        "draDrivers: [\"dra.net\"]\n"
        "cdiSpecDirs: [\"/etc/cdi\", \"/var/run/cdi\"]\n"
        "expectedEfaCount: 0\n"
        "sharingReplicas: 1\n"
        "sharingRenameByDefault: false\n"
        "counterInterval: 15s\n"
        "idleTimeout: 10m\n"
        "deviceHealth: false\n"
        "deviceHealthKeepAliveTimeout: 1m\n"
        "deviceHealthAdminErrors: 10\n"
        "deviceHealthHoldDown: 5m\n"
        "claimLookup: false\n"
        "apiServer: \"\"\n"
        "apiTokenFile: \"/var/run/secrets/kubernetes.io/serviceaccount/token\"\n"
        "apiCaFile: \"/var/run/secrets/kubernetes.io/serviceaccount/ca.crt\"\n");
  auto back = ParseConfigYaml(yaml, "printed.yaml");
  REQUIRE(back.ok());
  CHECK(*back == c->config);
  CHECK(
      c->Summary() ==
      "sysfsRoot=/sys devRoot=/dev procRoot=/proc kubeletDir=/a \"b\"\\c (--kubelet-dir) "
      "topologyXml=\"\" instanceType=trn2.48xlarge (EFA_INSTANCE_TYPE) reportNuma=true "
      "rescanInterval=1.5s (--rescan-interval) logLevel=info logFormat=text "
      "metricsAddress=\"\" (--metrics-address) probeAddress=:8081 metricsMaxConnections=64 "
      "probeMaxConnections=16 httpRequestTimeout=3s alignment=best-effort "
      "gpuResources=[nvidia.com/gpu] neuronResources=[aws.amazon.com/neuron] "
      "neuroncoreResources=[aws.amazon.com/neuroncore] neuroncoresPerDevice=0 "
      "cdiDir=/var/run/cdi cdiHandover=both mofedPolicy=warn draPolicy=yield draDrivers=[dra.net] "
      "cdiSpecDirs=[/etc/cdi,/var/run/cdi] expectedEfaCount=0 sharingReplicas=1 "
      "sharingRenameByDefault=false counterInterval=15s idleTimeout=10m deviceHealth=false "
      "deviceHealthKeepAliveTimeout=1m deviceHealthAdminErrors=10 deviceHealthHoldDown=5m "
      "claimLookup=false apiServer=\"\" "
      "apiTokenFile=/var/run/secrets/kubernetes.io/serviceaccount/token "
      "apiCaFile=/var/run/secrets/kubernetes.io/serviceaccount/ca.crt");
}

TEST_CASE("Invalid configuration files are refused with the place, the key and what was wrong",
          "[config]") {
  struct Case {
    std::string yaml;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"version: v1\nrescanInterval: abc\n",
       "config.yaml:2:17: rescanInterval: expected a duration like \"10s\", got \"abc\""},
      {"version: v1\nrescanInterval: 10\n",
       "config.yaml:2:17: rescanInterval: expected a duration like \"10s\", got \"10\""},
      {"version: v1\nrescanInterval: 2h\n",
       "config.yaml:2:17: rescanInterval: expected a duration from 100ms to 1h, got \"2h\""},
      {"version: v1\nidleTimeout: 2d\n",
       "config.yaml:2:14: idleTimeout: expected a duration like \"10s\", got \"2d\""},
      {"version: v1\nidleTimeout: 25h\n",
       "config.yaml:2:14: idleTimeout: expected a duration from 100ms to 24h, got \"25h\""},
      {"version: v1\ncounterInterval: 2h\n",
       "config.yaml:2:18: counterInterval: expected a duration from 100ms to 1h, got \"2h\""},
      {"version: v1\ndeviceHealthAdminErrors: 0\n",
       "config.yaml:2:26: deviceHealthAdminErrors: expected an integer from 1 to 1000000, got "
       "\"0\""},
      {"version: v1\nrescanIntervall: 5s\n",
       "config.yaml:2:1: rescanIntervall: unknown key (did you mean rescanInterval?)"},
      {"version: v1\nsysfs-root: /host/sys\n",
       "config.yaml:2:1: sysfs-root: unknown key (did you mean sysfsRoot?)"},
      {"version: v1\ncolour: blue\n", "config.yaml:2:1: colour: unknown key"},
      {"logLevel: info\n", "config.yaml:1:1: version: expected v1, got nothing"},
      {"version: v2\n", "config.yaml:1:10: version: expected v1, got \"v2\""},
      {"version: v1\nreportNuma: yes\n",
       "config.yaml:2:13: reportNuma: expected true or false, got \"yes\""},
      {"version: v1\nlogLevel: verbose\n",
       "config.yaml:2:11: logLevel: expected one of trace, debug, info, warn, error, got "
       "\"verbose\""},
      {"version: v1\nalignment: strict\n",
       "config.yaml:2:12: alignment: expected one of best-effort, late-binding, off, got "
       "\"strict\""},
      {"version: v1\ncdiHandover: cdi-cri\n",
       "config.yaml:2:14: cdiHandover: expected one of both, cdi-devices, annotation, got "
       "\"cdi-cri\""},
      {"version: v1\ngpuResources: nvidia.com/gpu\n",
       "config.yaml:2:15: gpuResources: expected a list of resource names like "
       "[nvidia.com/gpu], got \"nvidia.com/gpu\""},
      {"version: v1\ngpuResources:\n  - nvidia.com/gpu\n  - gpu\n",
       "config.yaml:4:5: gpuResources[1]: expected a resource name like \"nvidia.com/gpu\", got "
       "\"gpu\""},
      {"version: v1\nneuroncoresPerDevice: -1\n",
       "config.yaml:2:23: neuroncoresPerDevice: expected an integer from 0 to 64, got \"-1\""},
      {"version: v1\nsharingReplicas: 0\n",
       "config.yaml:2:18: sharingReplicas: expected an integer from 1 to 64, got \"0\""},
      {"version: v1\nexpectedEfaCount: 5000\n",
       "config.yaml:2:19: expectedEfaCount: expected an integer from 0 to 1024, got \"5000\""},
      {"version: v1\nmetricsAddress: \"8080\"\n",
       "config.yaml:2:17: metricsAddress: expected an address like \":8080\" or "
       "\"127.0.0.1:8080\", or \"\" for none, got \"8080\""},
      {"version: v1\nmetricsMaxConnections: 0\n",
       "config.yaml:2:24: metricsMaxConnections: expected an integer from 1 to 512, got \"0\""},
      {"version: v1\nhttpRequestTimeout: 50ms\n",
       "config.yaml:2:21: httpRequestTimeout: expected a duration from 100ms to 1h, got \"50ms\""},
      {"version: v1\nsysfsRoot: \"\"\n", "config.yaml:2:12: sysfsRoot: expected a path, got \"\""},
      {"version: v1\nmofedPolicy: {mode: warn}\n",
       "config.yaml:2:14: mofedPolicy: expected one of warn, protect, off, got a mapping"},
      {"version: v1\ndraDrivers: [dra.net, ../dra.net]\n",
       "config.yaml:2:23: draDrivers[1]: expected a DRA driver name like \"dra.net\", got "
       "\"../dra.net\""},
      {"version: v1\ndraDrivers: dra.net\n",
       "config.yaml:2:13: draDrivers: expected a list of DRA driver names like [dra.net], got "
       "\"dra.net\""},
      {"version: v1\ncdiSpecDirs: [/etc/cdi, \"\"]\n",
       "config.yaml:2:25: cdiSpecDirs[1]: expected a directory path, got \"\""},
      {"version: v1\ninstanceType: p5 48xlarge\n",
       "config.yaml:2:15: instanceType: expected an EC2 instance type like \"p5.48xlarge\", got "
       "\"p5 48xlarge\""},
      {"- version: v1\n", "config.yaml:1:1: expected a mapping of options, got a list"},
      {"version: v1\nlogLevel: info\nlogLevel: debug\n",
       "config.yaml:3:1: logLevel: given twice (first at line 2)"},
      {"",
       "config.yaml:1:1: expected a mapping of options starting with version: v1, got an "
       "empty file"},
      {"version: v1\nlogLevel: [info\n",
       "config.yaml:3:1: invalid YAML: end of sequence flow not found"},
      {"version: v1\n[a]: b\n", "config.yaml:2:1: expected an option name, got a list"},
  };
  for (const Case& c : cases) {
    INFO(c.yaml);
    auto parsed = ParseConfigYaml(c.yaml, "config.yaml");
    REQUIRE_FALSE(parsed.ok());
    CHECK(Message(parsed.status()) == c.message);
    CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("Invalid environment variables and flags are refused naming the variable or flag",
          "[config]") {
  struct Case {
    std::vector<std::string> args;
    std::map<std::string, std::string> env;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{},
       {{"EFA_LOG_LEVEL", "verbose"}},
       "EFA_LOG_LEVEL: expected one of trace, debug, info, warn, error, got \"verbose\""},
      {{},
       {{"EFA_GPU_RESOURCES", "nvidia.com/gpu,,x"}},
       "EFA_GPU_RESOURCES: expected a resource name like \"nvidia.com/gpu\", got \"\""},
      {{}, {{"EFA_REPORT_NUMA", ""}}, "EFA_REPORT_NUMA: expected true or false, got \"\""},
      {{"--sharing-replicas=65"},
       {},
       "--sharing-replicas: expected an integer from 1 to 64, got \"65\""},
      {{},
       {{"EFA_SHARING_REPLICAS", "two"}},
       "EFA_SHARING_REPLICAS: expected an integer from 1 to 64, got \"two\""},
      {{},
       {{"EFA_DRA_POLICY", "Yield"}},
       "EFA_DRA_POLICY: expected one of yield, ignore, monitor, got \"Yield\""},
      {{"--rescan-interval=abc"},
       {},
       "--rescan-interval: expected a duration like \"10s\", got \"abc\""},
      {{"--metrics-address", "localhost"},
       {},
       "--metrics-address: expected an address like \":8080\" or \"127.0.0.1:8080\", or \"\" "
       "for none, got \"localhost\""},
      {{"--metrics-address", ":65536"},
       {},
       "--metrics-address: expected an address like \":8080\" or \"127.0.0.1:8080\", or \"\" "
       "for none, got \":65536\""},
      {{},
       {{"EFA_API_SERVER", ":443"}},
       "EFA_API_SERVER: expected a server like \"10.100.0.1:443\" or \"api.example.com:443\", "
       "or \"\", got \":443\""},
      {{"--probe-max-connections", "513"},
       {},
       "--probe-max-connections: expected an integer from 1 to 512, got \"513\""},
      {{"--expected-efa-count", "4x"},
       {},
       "--expected-efa-count: expected an integer from 0 to 1024, got \"4x\""},
      {{"--config="}, {}, "--config: expected a file, got \"\""},
      {{"--config", "/nonexistent/config.yaml"},
       {},
       "/nonexistent/config.yaml: No such file or directory"},
      // The flag is checked even though it would win: a bad value is never silently ignored.
      {{"--log-format=xml"},
       {{"EFA_LOG_FORMAT", "json"}},
       "--log-format: expected one of text, json, got \"xml\""},
  };
  for (const Case& c : cases) {
    INFO(c.message);
    auto resolved = Resolve(c.args, c.env);
    REQUIRE_FALSE(resolved.ok());
    CHECK(Message(resolved.status()) == c.message);
  }
}

TEST_CASE("A bad value in a lower-precedence source is refused even when a flag overrides it",
          "[config]") {
  TempDir dir;
  WriteFile(dir.path() / "c.yaml", "version: v1\nlogLevel: loud\n");
  auto c = Resolve({"--config", (dir.path() / "c.yaml").string(), "--log-level=info"});
  REQUIRE_FALSE(c.ok());
  CHECK(Message(c.status()) == (dir.path() / "c.yaml").string() +
                                   ":2:11: logLevel: expected one of trace, debug, info, warn, "
                                   "error, got \"loud\"");
}
