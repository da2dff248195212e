#include "plugin/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace efa::plugin {
namespace {

bool ValidName(std::string_view name, bool colons) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                    (colons && c == ':') || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "metrics registry: %s\n", what.c_str());
  std::abort();
}

std::string_view TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

// `{a="x",b="y"}` for the label names and values, plus an optional extra
// pair (a histogram's `le`); empty when there are no labels at all.
std::string LabelText(const std::vector<std::string>& names, const std::vector<std::string>& values,
                      std::string_view extra_name = {}, std::string_view extra_value = {}) {
  if (names.empty() && extra_name.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ',';
    out += names[i];
    out += "=\"";
    out += EscapeLabelValue(values[i]);
    out += '"';
  }
  if (!extra_name.empty()) {
    if (!names.empty()) out += ',';
    out += extra_name;
    out += "=\"";
    out += extra_value;
    out += '"';
  }
  out += '}';
  return out;
}

void AppendSample(std::string& out, std::string_view name, std::string_view suffix,
                  const std::string& labels, double value) {
  out += name;
  out += suffix;
  out += labels;
  out += ' ';
  out += FormatMetricValue(value);
  out += '\n';
}

void RenderSeries(std::string& out, const std::string& name, const std::vector<std::string>& names,
                  const std::vector<std::string>& values, const Counter& c) {
  AppendSample(out, name, "", LabelText(names, values), c.value());
}

void RenderSeries(std::string& out, const std::string& name, const std::vector<std::string>& names,
                  const std::vector<std::string>& values, const Gauge& g) {
  AppendSample(out, name, "", LabelText(names, values), g.value());
}

void RenderSeries(std::string& out, const std::string& name, const std::vector<std::string>& names,
                  const std::vector<std::string>& values, const Histogram& h) {
  const Histogram::Snapshot s = h.Get();
  for (size_t i = 0; i <= h.bounds().size(); ++i) {
    const std::string le = i < h.bounds().size() ? FormatMetricValue(h.bounds()[i]) : "+Inf";
    AppendSample(out, name, "_bucket", LabelText(names, values, "le", le),
                 static_cast<double>(s.cumulative[i]));
  }
  const std::string labels = LabelText(names, values);
  AppendSample(out, name, "_sum", labels, s.sum);
  AppendSample(out, name, "_count", labels, static_cast<double>(s.count));
}

}  // namespace

std::string FormatMetricValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // Whole numbers (counts, most gauges) exactly as integers; others in the
  // shortest form that reads back as the same double, like %g (0.0001, 1e-05).
  if (std::trunc(v) == v && std::fabs(v) < 9007199254740992.0) {
    return std::to_string(static_cast<int64_t>(v));
  }
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general);
  return ec == std::errc() ? std::string(buf, end) : "NaN";
}

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeHelp(std::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)),
      buckets_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {
  if (!std::is_sorted(bounds_.begin(), bounds_.end()) ||
      std::adjacent_find(bounds_.begin(), bounds_.end()) != bounds_.end()) {
    Die("histogram bounds must be strictly ascending");
  }
}

void Histogram::Observe(double v) {
  // A value equal to a bound belongs to that bucket (le = less or equal).
  const size_t i =
      static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Get() const {
  // Not one atomic snapshot: a concurrent Observe() may show in its bucket
  // and not yet in the sum. The count is the +Inf bucket, so buckets and
  // count always agree.
  Snapshot s;
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(running);
  }
  s.count = s.cumulative.back();
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

template <typename T>
T& Family<T>::WithLabels(const std::vector<std::string>& values) {
  if (values.size() != labels_.size()) {
    Die(name_ + ": " + std::to_string(labels_.size()) + " label value(s) expected, " +
        std::to_string(values.size()) + " given");
  }
  absl::MutexLock lock(&mu_);
  auto& slot = series_[values];
  if (!slot) slot = make_();
  return *slot;
}

template <typename T>
void Family<T>::Render(std::string& out) const {
  out += "# HELP " + name_ + " " + EscapeHelp(help_) + "\n";
  out += "# TYPE " + name_ + " ";
  out += TypeName(type_);
  out += "\n";
  absl::MutexLock lock(&mu_);
  for (const auto& [values, series] : series_) RenderSeries(out, name_, labels_, values, *series);
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

struct MetricsRegistry::Entry {
  std::string name;
  std::unique_ptr<Family<Counter>> counter;
  std::unique_ptr<Family<Gauge>> gauge;
  std::unique_ptr<Family<Histogram>> histogram;
};

MetricsRegistry::MetricsRegistry() = default;
MetricsRegistry::~MetricsRegistry() = default;

void MetricsRegistry::Register(const std::string& name, MetricType type,
                               const std::vector<std::string>& labels) {
  if (!ValidName(name, true)) Die("invalid metric name \"" + name + "\"");
  for (const std::string& l : labels) {
    if (!ValidName(l, false) || l.rfind("__", 0) == 0 ||
        (type == MetricType::kHistogram && l == "le")) {
      Die(name + ": invalid label name \"" + l + "\"");
    }
  }
  for (const auto& e : entries_) {
    if (e->name == name) Die("metric \"" + name + "\" declared twice");
  }
}

Family<Counter>& MetricsRegistry::AddCounter(const std::string& name, const std::string& help,
                                             std::vector<std::string> labels) {
  absl::MutexLock lock(&mu_);
  Register(name, MetricType::kCounter, labels);
  auto entry = std::make_unique<Entry>();
  entry->name = name;
  entry->counter.reset(new Family<Counter>(name, help, MetricType::kCounter, std::move(labels),
                                           [] { return std::make_unique<Counter>(); }));
  entries_.push_back(std::move(entry));
  return *entries_.back()->counter;
}

Family<Gauge>& MetricsRegistry::AddGauge(const std::string& name, const std::string& help,
                                         std::vector<std::string> labels) {
  absl::MutexLock lock(&mu_);
  Register(name, MetricType::kGauge, labels);
  auto entry = std::make_unique<Entry>();
  entry->name = name;
  entry->gauge.reset(new Family<Gauge>(name, help, MetricType::kGauge, std::move(labels),
                                       [] { return std::make_unique<Gauge>(); }));
  entries_.push_back(std::move(entry));
  return *entries_.back()->gauge;
}

Family<Histogram>& MetricsRegistry::AddHistogram(const std::string& name, const std::string& help,
                                                 std::vector<double> bounds,
                                                 std::vector<std::string> labels) {
  absl::MutexLock lock(&mu_);
  Register(name, MetricType::kHistogram, labels);
  if (bounds.empty() || !std::is_sorted(bounds.begin(), bounds.end()) ||
      std::adjacent_find(bounds.begin(), bounds.end()) != bounds.end() ||
      std::isinf(bounds.back())) {
    Die(name + ": histogram bounds must be finite and strictly ascending");
  }
  auto entry = std::make_unique<Entry>();
  entry->name = name;
  entry->histogram.reset(new Family<Histogram>(
      name, help, MetricType::kHistogram, std::move(labels),
      [bounds = std::move(bounds)] { return std::make_unique<Histogram>(bounds); }));
  entries_.push_back(std::move(entry));
  return *entries_.back()->histogram;
}

void MetricsRegistry::AddCollector(std::function<void()> collect) {
  absl::MutexLock lock(&mu_);
  collectors_.push_back(std::move(collect));
}

std::string MetricsRegistry::Render() const {
  absl::MutexLock render_lock(&render_mu_);
  std::vector<std::function<void()>> collectors;
  std::vector<const Entry*> entries;
  {
    absl::MutexLock lock(&mu_);
    collectors = collectors_;
    for (const auto& e : entries_) entries.push_back(e.get());
  }
  // Collectors run without mu_ held: they may declare series.
  for (const auto& collect : collectors) collect();
  std::string out;
  for (const Entry* e : entries) {
    if (e->counter) e->counter->Render(out);
    if (e->gauge) e->gauge->Render(out);
    if (e->histogram) e->histogram->Render(out);
  }
  return out;
}

}  // namespace efa::plugin
