// Families built at scrape time, serialized by prometheus-cpp and read back
// by the Python prometheus_client parser.
#include "plugin/runtime/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <catch2/catch.hpp>

#include "test/support/exposition.h"

using namespace efa::plugin;
using efa::testing::SummarizeExposition;

TEST_CASE("Scrape-time families and registry metrics read back with their HELP, labels and values",
          "[metrics]") {
  prometheus::Registry registry;
  auto& rpcs =
      prometheus::BuildCounter().Name("demo_rpcs_total").Help("RPCs handled.").Register(registry);
  rpcs.Add({{"method", "Allocate"}, {"code", "OK"}}).Increment(3);
  prometheus::BuildHistogram()
      .Name("demo_size")
      .Help("Sizes.")
      .Register(registry)
      .Add({}, prometheus::Histogram::BucketBoundaries{1, 2.5})
      .Observe(2.5);

  std::vector<prometheus::MetricFamily> families = registry.Collect();
  auto& info = AddFamily(families, "demo_info", "A \\ backslash\nand a newline.",
                         prometheus::MetricType::Gauge);
  AddSample(info, 1, {{"path", "a\"b\\c\nd"}});
  AddSample(info, 0.00025, {{"path", "x"}});
  AddSample(
      AddFamily(families, "demo_restarts_total", "Restarts.", prometheus::MetricType::Counter), 7);

  const auto summary = SummarizeExposition(SerializeMetrics(families));
  REQUIRE(summary.exit_status == 0);
  CHECK(summary.text ==
        "demo_info gauge \"A \\\\ backslash\\nand a newline.\"\n"
        "  demo_info{path=\"a\\\"b\\\\c\\nd\"}\n"
        "  demo_info{path=\"x\"}\n"
        "demo_restarts counter \"Restarts.\"\n"
        "  demo_restarts_total{}\n"
        "demo_rpcs counter \"RPCs handled.\"\n"
        "  demo_rpcs_total{code=\"OK\",method=\"Allocate\"}\n"
        "demo_size histogram \"Sizes.\"\n"
        "  demo_size_bucket{le=\"*\"}\n"
        "  demo_size_count{}\n"
        "  demo_size_sum{}\n"
        "  le: 1 2.5 +Inf\n");
  const auto values = SummarizeExposition(SerializeMetrics(families), true);
  REQUIRE(values.exit_status == 0);
  CHECK(values.text ==
        "demo_info{path=\"a\\\"b\\\\c\\nd\"} 1.0\n"
        "demo_info{path=\"x\"} 0.00025\n"
        "demo_restarts_total{} 7.0\n"
        "demo_rpcs_total{code=\"OK\",method=\"Allocate\"} 3.0\n"
        "demo_size_bucket{le=\"+Inf\"} 1.0\n"
        "demo_size_bucket{le=\"1\"} 0.0\n"
        "demo_size_bucket{le=\"2.5\"} 1.0\n"
        "demo_size_count{} 1.0\n"
        "demo_size_sum{} 2.5\n");
}
