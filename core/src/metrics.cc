// The metrics registry and its text exposition (metrics.hpp).
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/hex.hpp>
#include <hetmesh/core/metrics.hpp>
#include <hetmesh/core/metrics_server.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>

namespace hetmesh::metrics {

namespace {

enum Kind { kCounter, kGauge, kHistogram };
constexpr std::array<const char*, 3> kKindNames = {"counter", "gauge", "histogram"};

bool valid_name(std::string_view name, bool colon) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                    (colon && c == ':') || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

// A label value or HELP text with \, " (values only) and newlines escaped.
std::string escaped(std::string_view text, bool quote) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (c == '"' && quote)
      out += "\\\"";
    else
      out += c;
  }
  return out;
}

std::string number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", value);
}

}  // namespace

std::span<const double> latency_buckets() {
  static constexpr std::array<double, 22> kBounds = {
      1e-6, 2.5e-6, 5e-6,   1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3,
      5e-3, 1e-2,   2.5e-2, 5e-2, 0.1,    0.25, 0.5,  1,      2.5,  5,    10};
  return kBounds;
}

Histogram::Histogram(std::span<const double> bounds)
    : bounds_(bounds.begin(), bounds.end()),
      buckets_(std::make_unique<std::atomic<uint64_t>[]>(bounds.size() + 1)) {
  if (bounds_.empty() || !std::is_sorted(bounds_.begin(), bounds_.end()) ||
      std::adjacent_find(bounds_.begin(), bounds_.end()) != bounds_.end() || bounds_.front() <= 0)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                "metrics: a histogram's bounds must be positive and strictly ascending");
  for (const double b : bounds_)
    bounds_ns_.push_back(static_cast<int64_t>(std::llround(b * 1e9)));
}

void Histogram::observe_ns(int64_t ns) {
  ns = std::max<int64_t>(ns, 0);
  const auto at = std::lower_bound(bounds_ns_.begin(), bounds_ns_.end(), ns) - bounds_ns_.begin();
  buckets_[static_cast<size_t>(at)].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<uint64_t>(ns), std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s{bounds_, {}, static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) * 1e-9};
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(total);
  }
  return s;
}

struct Registry::Family {
  int kind = kCounter;
  std::string help;
  struct Series {
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
  };
  std::map<std::string, Series, std::less<>> series;  // by their labels, rendered
};

Registry::Registry(Labels constant) : constant_(std::move(constant)) {
  for (const auto& [name, value] : constant_)
    if (!valid_name(name, false) || name.starts_with("__"))
      throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("metrics: bad label name '{}'", name));
}

Registry::~Registry() = default;

Registry::Family& Registry::family(std::string_view name, std::string_view help, int kind) {
  if (!valid_name(name, true))
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("metrics: bad metric name '{}'", name));
  if ((kind == kCounter) != name.ends_with("_total"))
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("metrics: '{}': counters, and only they, end in _total", name));
  auto it = families_.find(name);
  if (it == families_.end()) {
    auto made = std::make_unique<Family>();
    made->kind = kind;
    made->help = std::string(help);
    it = families_.emplace(std::string(name), std::move(made)).first;
  } else if (it->second->kind != kind) {
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("metrics: '{}' is a {}, not a {}", name, kKindNames[it->second->kind],
                            kKindNames[static_cast<size_t>(kind)]));
  }
  return *it->second;
}

std::string Registry::label_text(const Labels& labels) const {
  std::string out;
  auto add = [&](std::string_view name, std::string_view value) {
    out += out.empty() ? "{" : ",";
    out += fmt::format("{}=\"{}\"", name, escaped(value, true));
  };
  for (const auto& [name, value] : constant_)
    add(name, value);
  for (const auto& [name, value] : labels) {
    if (!valid_name(name, false) || name.starts_with("__") || name == "le")
      throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("metrics: bad label name '{}'", name));
    add(name, value);
  }
  return out.empty() ? out : out + "}";
}

Counter& Registry::counter(std::string_view name, std::string_view help, const Labels& labels) {
  std::lock_guard lock(mutex_);
  Family::Series& s = family(name, help, kCounter).series[label_text(labels)];
  if (!s.counter) s.counter = std::make_unique<Counter>();
  return *s.counter;
}

Gauge& Registry::gauge(std::string_view name, std::string_view help, const Labels& labels) {
  std::lock_guard lock(mutex_);
  Family::Series& s = family(name, help, kGauge).series[label_text(labels)];
  if (!s.gauge) s.gauge = std::make_unique<Gauge>();
  return *s.gauge;
}

Histogram& Registry::histogram(std::string_view name, std::string_view help, const Labels& labels,
                               std::span<const double> bounds) {
  std::lock_guard lock(mutex_);
  Family::Series& s = family(name, help, kHistogram).series[label_text(labels)];
  if (!s.histogram) s.histogram = std::make_unique<Histogram>(bounds);
  return *s.histogram;
}

void Registry::on_scrape(std::function<void()> refresh) {
  std::lock_guard lock(mutex_);
  refreshers_.push_back(std::move(refresh));
}

std::string Registry::render() {
  std::lock_guard one_at_a_time(render_mutex_);
  std::vector<std::function<void()>> refreshers;
  {
    std::lock_guard lock(mutex_);
    refreshers = refreshers_;
  }
  for (const auto& refresh : refreshers)
    refresh();  // outside mutex_: it makes and sets series

  std::lock_guard lock(mutex_);
  std::string out;
  for (const auto& [name, f] : families_) {
    if (f->series.empty()) continue;
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, escaped(f->help, false), name,
                       kKindNames[static_cast<size_t>(f->kind)]);
    for (const auto& [labels, s] : f->series) {
      if (s.counter) out += fmt::format("{}{} {}\n", name, labels, s.counter->value());
      if (s.gauge) out += fmt::format("{}{} {}\n", name, labels, number(s.gauge->value()));
      if (!s.histogram) continue;
      const Histogram::Snapshot h = s.histogram->snapshot();
      // The bucket lines carry `le` after the other labels.
      const std::string open = labels.empty() ? "{" : labels.substr(0, labels.size() - 1) + ",";
      for (size_t i = 0; i < h.cumulative.size(); ++i)
        out += fmt::format("{}_bucket{}le=\"{}\"}} {}\n", name, open,
                           i < h.bounds.size() ? number(h.bounds[i]) : "+Inf", h.cumulative[i]);
      out += fmt::format("{}_sum{} {}\n{}_count{} {}\n", name, labels, number(h.sum), name, labels,
                         h.cumulative.back());
    }
  }
  return out;
}

// Declared with the server (metrics_server.hpp); here, so a build without libmicrohttpd has it too.
std::string metrics_token(const JobSecret& secret) {
  return to_hex(secret.mac("hetmesh metrics bearer token", {}, {}));
}

}  // namespace hetmesh::metrics
