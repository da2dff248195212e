// Prometheus metrics on prometheus-cpp. Values the daemon updates as events
// happen (RPC durations, allocations) live in a prometheus::Registry; values
// kept elsewhere (the daemon's state, its own counters) are read at each
// scrape into families built then, as the Go client's "const metrics" do:
//
//   std::vector<prometheus::MetricFamily> families = registry.Collect();
//   auto& devices = AddFamily(families, "efa_device_plugin_devices", "EFAs...",
//                             prometheus::MetricType::Gauge);
//   AddSample(devices, 4, {{"health", "healthy"}});
//   std::string text = SerializeMetrics(families);
#pragma once

#include <prometheus/metric_family.h>

#include <string>
#include <string_view>
#include <vector>

namespace efa::plugin {

// The Content-Type of SerializeMetrics()'s output.
// Every family's name starts with it.
inline constexpr char kMetricPrefix[] = "efa_device_plugin_";

inline constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// Appends an empty family (a counter or a gauge) to `families` and returns
// it; the reference is valid until `families` grows.
prometheus::MetricFamily& AddFamily(std::vector<prometheus::MetricFamily>& families,
                                    std::string name, std::string help,
                                    prometheus::MetricType type);

// Adds a sample of a counter or gauge family, with these labels.
void AddSample(prometheus::MetricFamily& family, double value,
               std::vector<prometheus::ClientMetric::Label> labels = {});

// The values of efa_device_plugin_info's mode label: serving the
// device-plugin API (an EFA was found since the process started),
// monitoring a DRA node pool's EFAs (the same, under draPolicy monitor:
// never registered), or idle on a node without EFA (the idle process, or
// the daemon waiting for a first EFA in its own loop).
inline constexpr char kModeServing[] = "serving";
inline constexpr char kModeMonitoring[] = "monitoring";
inline constexpr char kModeIdle[] = "idle";

// The families every process of the plugin exports, serving or idle, so
// that a node without EFA reads as such rather than as a node whose plugin
// is missing: info{version, mode} 1, devices by health (both 0 when idle)
// and start_time_seconds. The exec from one process to the other keeps the
// scrape address and the start time, so these series stay continuous
// across it (mode aside).
void CollectIdentity(std::string_view mode, int healthy, int unhealthy,
                     std::vector<prometheus::MetricFamily>& out);

// The families in the text exposition format 0.0.4: prometheus-cpp's
// serializer, with each HELP text escaped first (backslash and line feed),
// which prometheus-cpp 1.0.1 writes verbatim.
std::string SerializeMetrics(std::vector<prometheus::MetricFamily> families);

}  // namespace efa::plugin
