// A small Prometheus metrics registry: counters, gauges and histograms with
// labels, rendered in the text exposition format 0.0.4. prometheus-cpp is not
// packaged in Debian 12; this covers what the daemon exports and no more.
//
//   MetricsRegistry registry;
//   auto& calls = registry.AddCounter("efa_device_plugin_rpcs_total", "RPCs handled.",
//                                     {"method", "code"});
//   Counter& ok = calls.WithLabels({"Allocate", "OK"});  // look up once
//   ok.Increment();                                      // lock-free
//   std::string text = registry.Render();
//
// Families and series are created under a lock; updating a series you hold
// is lock-free (atomics), so hot paths should look series up once and keep
// the reference (series live as long as the registry). Values that live
// elsewhere (the daemon's state) are copied in by collectors, which Render()
// runs first.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace efa::plugin {

// A monotonically increasing value. Thread-safe, lock-free.
class Counter {
 public:
  void Increment(double by = 1) { value_.fetch_add(by, std::memory_order_relaxed); }
  // Mirrors a count kept elsewhere (a collector copying a monotonic total).
  void Set(double total) { value_.store(total, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// A value that goes up and down. Thread-safe, lock-free.
class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double by) { value_.fetch_add(by, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Observations counted into fixed buckets (upper bounds, ascending; +Inf is
// implicit). Thread-safe, lock-free: Observe() is a binary search and two
// relaxed atomic adds.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);

  struct Snapshot {
    std::vector<uint64_t> cumulative;  // per bound, then +Inf
    uint64_t count = 0;
    double sum = 0;
  };
  Snapshot Get() const;
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1, not cumulative
  std::atomic<double> sum_{0};
};

enum class MetricType { kCounter, kGauge, kHistogram };

// The series of one metric name, one per combination of label values.
// Thread-safe.
template <typename T>
class Family {
 public:
  // The series with these label values (one per label name, in order),
  // created on first use. The reference stays valid as long as the family.
  T& WithLabels(const std::vector<std::string>& values);
  // The series without labels (a family declared with no label names).
  T& Get() { return WithLabels({}); }

 private:
  friend class MetricsRegistry;
  Family(std::string name, std::string help, MetricType type, std::vector<std::string> labels,
         std::function<std::unique_ptr<T>()> make)
      : name_(std::move(name)),
        help_(std::move(help)),
        type_(type),
        labels_(std::move(labels)),
        make_(std::move(make)) {}
  void Render(std::string& out) const;

  const std::string name_;
  const std::string help_;
  const MetricType type_;
  const std::vector<std::string> labels_;
  const std::function<std::unique_ptr<T>()> make_;
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<T>> series_ ABSL_GUARDED_BY(mu_);
};

class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Declare a family. Names must match [a-zA-Z_:][a-zA-Z0-9_:]* and label
  // names [a-zA-Z_][a-zA-Z0-9_]* (not "le" for histograms), and a name may
  // be declared once: violations are programming errors (abort). The
  // returned reference lives as long as the registry. Thread-safe.
  Family<Counter>& AddCounter(const std::string& name, const std::string& help,
                              std::vector<std::string> labels = {});
  Family<Gauge>& AddGauge(const std::string& name, const std::string& help,
                          std::vector<std::string> labels = {});
  Family<Histogram>& AddHistogram(const std::string& name, const std::string& help,
                                  std::vector<double> bounds, std::vector<std::string> labels = {});

  // Runs before every Render(), in the order added, to copy in values kept
  // elsewhere. Must not call Render(). Thread-safe.
  void AddCollector(std::function<void()> collect);

  // Runs the collectors, then writes every family in the order declared and
  // its series in label order, in the text exposition format 0.0.4.
  // Thread-safe (renders are serialized).
  std::string Render() const;

 private:
  struct Entry;
  void Register(const std::string& name, MetricType type, const std::vector<std::string>& labels)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex render_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> collectors_ ABSL_GUARDED_BY(mu_);
};

// The Content-Type of Render()'s output.
inline constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// Exposition-format pieces, exposed for tests. A sample value: the shortest
// text that reads back as the same double, "+Inf", "-Inf" or "NaN".
std::string FormatMetricValue(double v);
// A label value with backslash, double quote and line feed escaped.
std::string EscapeLabelValue(std::string_view value);
// A HELP text with backslash and line feed escaped.
std::string EscapeHelp(std::string_view help);

}  // namespace efa::plugin
