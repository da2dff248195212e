// The metrics registry and its text exposition format (0.0.4).
#include "plugin/metrics.h"

#include <catch2/catch.hpp>
#include <limits>
#include <thread>
#include <vector>

using namespace efa::plugin;

TEST_CASE("The registry renders counters, gauges and histograms in the text format", "[metrics]") {
  MetricsRegistry registry;
  auto& rpcs = registry.AddCounter("demo_rpcs_total", "RPCs handled.", {"method", "code"});
  auto& temp = registry.AddGauge("demo_temperature_celsius", "Temperature.");
  auto& size = registry.AddHistogram("demo_size", "Sizes.", {1, 2, 4});
  rpcs.WithLabels({"Allocate", "OK"}).Increment();
  rpcs.WithLabels({"Allocate", "OK"}).Increment(2);
  rpcs.WithLabels({"Allocate", "INVALID_ARGUMENT"}).Increment();
  temp.Get().Set(-3.5);
  for (double v : {1.0, 2.0, 3.0, 8.0}) size.Get().Observe(v);
  CHECK(registry.Render() ==
        "# HELP demo_rpcs_total RPCs handled.\n"
        "# TYPE demo_rpcs_total counter\n"
        "demo_rpcs_total{method=\"Allocate\",code=\"INVALID_ARGUMENT\"} 1\n"
        "demo_rpcs_total{method=\"Allocate\",code=\"OK\"} 3\n"
        "# HELP demo_temperature_celsius Temperature.\n"
        "# TYPE demo_temperature_celsius gauge\n"
        "demo_temperature_celsius -3.5\n"
        "# HELP demo_size Sizes.\n"
        "# TYPE demo_size histogram\n"
        "demo_size_bucket{le=\"1\"} 1\n"
        "demo_size_bucket{le=\"2\"} 2\n"
        "demo_size_bucket{le=\"4\"} 3\n"
        "demo_size_bucket{le=\"+Inf\"} 4\n"
        "demo_size_sum 14\n"
        "demo_size_count 4\n");
}

TEST_CASE("Label values and help texts are escaped as the format requires", "[metrics]") {
  MetricsRegistry registry;
  auto& g = registry.AddGauge("demo_info", "A \\ backslash\nand a newline.", {"path"});
  g.WithLabels({"a\"b\\c\nd"}).Set(1);
  CHECK(registry.Render() ==
        "# HELP demo_info A \\\\ backslash\\nand a newline.\n"
        "# TYPE demo_info gauge\n"
        "demo_info{path=\"a\\\"b\\\\c\\nd\"} 1\n");
}

TEST_CASE("Sample values are written in the shortest exact form", "[metrics]") {
  CHECK(FormatMetricValue(0) == "0");
  CHECK(FormatMetricValue(42) == "42");
  CHECK(FormatMetricValue(0.1) == "0.1");
  CHECK(FormatMetricValue(0.00025) == "0.00025");
  CHECK(FormatMetricValue(0.0001) == "0.0001");
  CHECK(FormatMetricValue(1e-5) == "1e-05");
  CHECK(FormatMetricValue(1000000) == "1000000");
  CHECK(FormatMetricValue(-2) == "-2");
  CHECK(FormatMetricValue(1e21) == "1e+21");
  CHECK(FormatMetricValue(std::numeric_limits<double>::infinity()) == "+Inf");
  CHECK(FormatMetricValue(-std::numeric_limits<double>::infinity()) == "-Inf");
  CHECK(FormatMetricValue(std::numeric_limits<double>::quiet_NaN()) == "NaN");
}

TEST_CASE("Histogram buckets are cumulative and a value on a bound counts in it", "[metrics]") {
  Histogram h({0.001, 0.01, 0.1});
  for (double v : {0.0005, 0.001, 0.005, 0.1, 0.2}) h.Observe(v);
  const Histogram::Snapshot s = h.Get();
  CHECK(s.cumulative == std::vector<uint64_t>{2, 3, 4, 5});
  CHECK(s.count == 5);
  CHECK(s.sum == Approx(0.3065));
}

TEST_CASE("Collectors run before every render, and updates from many threads all count",
          "[metrics][concurrency]") {
  MetricsRegistry registry;
  auto& c = registry.AddCounter("demo_total", "Total.").Get();
  auto& g = registry.AddGauge("demo_collected", "Collected.").Get();
  int runs = 0;
  registry.AddCollector([&] { g.Set(++runs); });
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) c.Increment();
    });
  }
  for (auto& t : threads) t.join();
  registry.Render();
  CHECK(registry.Render() ==
        "# HELP demo_total Total.\n# TYPE demo_total counter\ndemo_total 4000\n"
        "# HELP demo_collected Collected.\n# TYPE demo_collected gauge\ndemo_collected 2\n");
}

TEST_CASE("A family without series renders only its HELP and TYPE lines", "[metrics]") {
  MetricsRegistry registry;
  registry.AddGauge("demo_expected", "Absent until known.");
  CHECK(registry.Render() ==
        "# HELP demo_expected Absent until known.\n# TYPE demo_expected gauge\n");
}
