// Metrics a Prometheus server scrapes (shared design §14): counters, gauges and histograms whose
// updates are one relaxed atomic operation, so a hot path pays nothing it would notice, read only
// when a scrape renders them in Prometheus' text exposition format (version 0.0.4). Names follow
// the OpenMetrics conventions: base units (seconds, bytes) as the name's last word, `_total` on
// counters only.
//
// A registry hands out series by name and labels; the same name and labels give the same series,
// and a reference stays valid as long as the registry. Making a series takes a lock; updating one
// does not.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh::metrics {

// Label names and values, in the order they are rendered.
using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void add(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

class Gauge {
 public:
  void set(double value) { value_.store(value, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Upper bounds in seconds for latencies: 1 us to 10 s, three a decade (1, 2.5, 5), so one
// histogram reads both a 20 us one-way time and a 10 s stall.
std::span<const double> latency_buckets();

// Observations counted into buckets by upper bound (seconds), as Prometheus' histograms are:
// `_bucket{le=...}` cumulative, `_sum` in seconds and `_count`.
class Histogram {
 public:
  explicit Histogram(std::span<const double> bounds);
  // An observation of `ns` nanoseconds (a negative one, from clocks that disagree, counts as 0).
  void observe_ns(int64_t ns);
  struct Snapshot {
    std::vector<double> bounds;        // seconds, ascending
    std::vector<uint64_t> cumulative;  // [i]: observations <= bounds[i]; then +Inf (the count)
    double sum = 0;                    // seconds
  };
  Snapshot snapshot() const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> bounds_ns_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // [i]: in (bound i-1, bound i]; last: +Inf
  std::atomic<uint64_t> sum_ns_{0};
};

class Registry {
 public:
  // `constant` labels go on every series (the instance's role, rank and host).
  explicit Registry(Labels constant = {});
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // The series `name`{labels} of each kind, made at first call. Throws Error(INVALID_ARGUMENT)
  // for a name or label name that is not Prometheus', a counter not named *_total, or a name
  // already used by another kind.
  Counter& counter(std::string_view name, std::string_view help, const Labels& labels = {});
  Gauge& gauge(std::string_view name, std::string_view help, const Labels& labels = {});
  Histogram& histogram(std::string_view name, std::string_view help, const Labels& labels = {},
                       std::span<const double> bounds = latency_buckets());

  // Runs at each scrape, before the series are read: for values an owner reads rather than counts
  // (memory registered, the peers' states). It may make and set series; it must not throw.
  void on_scrape(std::function<void()> refresh);

  // Every series in the text exposition format: per name a # HELP and a # TYPE line, then its
  // samples, names in order. Runs the on_scrape refreshers first; one render at a time.
  std::string render();

 private:
  struct Family;
  Family& family(std::string_view name, std::string_view help, int kind);
  std::string label_text(const Labels& labels) const;  // {constant..., labels...}

  Labels constant_;
  std::mutex render_mutex_;  // one render at a time; taken before mutex_
  std::mutex mutex_;
  std::map<std::string, std::unique_ptr<Family>, std::less<>> families_;
  std::vector<std::function<void()>> refreshers_;
};

}  // namespace hetmesh::metrics

#pragma GCC visibility pop
