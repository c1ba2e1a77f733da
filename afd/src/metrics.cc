#include <hetmesh/afd/metrics.hpp>
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/percentile.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <numeric>
#include <set>

namespace hetmesh::afd {
namespace {

double us(int64_t ns) {
  return static_cast<double>(ns) / 1e3;
}

// Skips samples whose inputs are missing (a stamp of 0).
void add(std::map<std::string, std::vector<double>>& samples, const std::string& name,
         int64_t later, int64_t earlier) {
  if (later != 0 && earlier != 0) samples[name].push_back(us(later - earlier));
}

}  // namespace

Percentiles percentiles(std::vector<double> v) {
  Percentiles p;
  p.count = v.size();
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  p.p50 = sorted_percentile(v, 0.5);
  p.p99 = sorted_percentile(v, 0.99);
  p.max = v.back();
  p.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  return p;
}

const std::vector<std::string>& metric_names() {
  static const std::vector<std::string> names = {
      "attention compute", "A send-queue delay",  "A2F network*", "F gather wait",
      "F compute",         "F respond delay",     "F2A network*", "A notify",
      "round trip",        "net cost (skew-free)"};
  return names;
}

Metrics compute_metrics(const std::vector<AttentionTrace>& traces, bool same_host_clock,
                        double straggler_factor) {
  std::map<std::string, std::vector<double>> samples;
  std::map<int, std::vector<double>> straggle;
  for (const AttentionTrace& trace : traces) {
    for (const RoundTrip& t : trace.trips) {
      add(samples, "attention compute", t.push_start, t.attention_start);
      add(samples, "A send-queue delay", t.posted, t.push_start);
      add(samples, "round trip", t.completed, t.posted);
      add(samples, "A notify", t.wait_returned, t.completed);
      int64_t first = INT64_MAX;
      for (const auto& f : t.ffn)
        first = std::min(first, f.received_at_a);
      for (size_t i = 0; i < t.ffn.size(); ++i) {
        const auto& f = t.ffn[i];
        add(samples, "F gather wait", f.f_batch_ready, f.f_received);
        add(samples, "F compute", f.f_compute_end, f.f_compute_start);
        add(samples, "F respond delay", f.f_posted, f.f_compute_end);
        // When A's writes to this F started (traces without it: when the first F's did).
        int64_t posted = f.posted_at_a != 0 ? f.posted_at_a : t.posted;
        if (same_host_clock) {
          add(samples, "A2F network*", f.f_received, posted);
          add(samples, "F2A network*", f.received_at_a, f.f_posted);
        }
        if (f.received_at_a && posted && f.f_posted && f.f_received)
          samples["net cost (skew-free)"].push_back(
              us((f.received_at_a - posted) - (f.f_posted - f.f_received)));
        straggle[static_cast<int>(i)].push_back(us(f.received_at_a - first));
      }
    }
  }
  Metrics m;
  m.same_host_clock = same_host_clock;
  for (auto& [name, values] : samples)
    m.values[name] = percentiles(std::move(values));
  double typical = 0;
  for (auto& [f, values] : straggle) {
    m.straggle[f] = percentiles(std::move(values));
    typical += m.straggle[f].p50;
  }
  if (!straggle.empty()) typical /= static_cast<double>(straggle.size());
  for (const auto& [f, p] : m.straggle)
    if (m.straggle.size() > 1 && p.p50 > 0 && p.p50 > straggler_factor * typical && p.p50 > 5.0)
      m.stragglers.push_back(
          fmt::format("ffn {} answers {:.1f} us after the first (p50), {:.1f}x "
                      "the average",
                      f, p.p50, p.p50 / std::max(typical, 1e-9)));
  return m;
}

std::string format_metrics(const Metrics& m) {
  std::string out = fmt::format("{:<22} {:>8} {:>10} {:>10} {:>10} {:>10} {:>8}\n", "metric (us)",
                                "count", "p50", "p99", "mean", "max", "p99/p50");
  for (const auto& name : metric_names()) {
    auto it = m.values.find(name);
    if (it == m.values.end()) continue;
    const Percentiles& p = it->second;
    out += fmt::format("{:<22} {:>8} {:>10.1f} {:>10.1f} {:>10.1f} {:>10.1f} {:>8.2f}\n", name,
                       p.count, p.p50, p.p99, p.mean, p.max, p.jitter());
  }
  for (const auto& [f, p] : m.straggle)
    out += fmt::format("{:<22} {:>8} {:>10.1f} {:>10.1f} {:>10.1f} {:>10.1f}\n",
                       fmt::format("straggle ffn {}", f), p.count, p.p50, p.p99, p.mean, p.max);
  out +=
      m.same_host_clock
          ? "* one-way times subtract clocks of two processes on one host\n"
          : "* one-way times omitted: A and F do not share a clock; use the skew-free net cost\n";
  for (const auto& s : m.stragglers)
    out += "straggler: " + s + "\n";
  for (const auto& line : m.peer_changes)
    out += "peers: " + line + "\n";
  return out;
}

std::string trace_to_json(const AttentionTrace& trace) {
  nlohmann::json trips = nlohmann::json::array();
  for (const RoundTrip& t : trace.trips) {
    nlohmann::json ffn = nlohmann::json::array();
    for (const auto& f : t.ffn)
      ffn.push_back({f.received_at_a, f.f_received, f.f_batch_ready, f.f_compute_start,
                     f.f_compute_end, f.f_posted, f.posted_at_a});
    trips.push_back(
        {{"mb", t.micro_batch},
         {"seq", t.sequence},
         {"a", {t.attention_start, t.push_start, t.ready, t.posted, t.completed, t.wait_returned}},
         {"f", ffn}});
  }
  return nlohmann::json{{"rank", trace.rank}, {"trips", trips}}.dump();
}

AttentionTrace trace_from_json(const std::string& text) {
  try {
    auto j = nlohmann::json::parse(text);
    AttentionTrace trace;
    trace.rank = j.at("rank").get<int>();
    for (const auto& t : j.at("trips")) {
      RoundTrip r;
      r.micro_batch = t.at("mb").get<int>();
      r.sequence = t.at("seq").get<uint64_t>();
      const auto& a = t.at("a");
      r.attention_start = a.at(0);
      r.push_start = a.at(1);
      r.ready = a.at(2);
      r.posted = a.at(3);
      r.completed = a.at(4);
      r.wait_returned = a.at(5);
      for (const auto& f : t.at("f"))
        r.ffn.push_back({f.at(0), f.at(1), f.at(2), f.at(3), f.at(4), f.at(5),
                         f.size() > 6 ? f.at(6).get<int64_t>() : 0});
      trace.trips.push_back(std::move(r));
    }
    return trace;
  } catch (const nlohmann::json::exception& e) {
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("malformed trace: {}", e.what()));
  }
}

const std::vector<std::string>& trace_slice_names() {
  static const std::vector<std::string> names = {
      "attention compute", "A send-queue delay", "A2F network", "F gather wait", "F compute",
      "F respond delay",   "F2A network",        "A notify",    "round trip"};
  return names;
}

void write_chrome_trace(const std::string& path, const std::vector<AttentionTrace>& traces,
                        const std::vector<InstanceHistory>& histories) {
  // Every phase of every round trip is a complete event ("X") named after its metric, on a track
  // per (A, micro-batch) in A's process and per (A, micro-batch) in each F's process. The events
  // are written in time order; metadata events name the processes and tracks.
  nlohmann::json slices = nlohmann::json::array();
  auto slice = [&](const std::string& name, int pid, int tid, int64_t start, int64_t end,
                   const nlohmann::json& args) {
    if (start == 0 || end == 0 || end < start) return;
    slices.push_back({{"name", name},
                      {"cat", pid < kFfnPidBase ? "attention" : "ffn"},
                      {"ph", "X"},
                      {"pid", pid},
                      {"tid", tid},
                      {"ts", static_cast<double>(start) / 1e3},
                      {"dur", static_cast<double>(end - start) / 1e3},
                      {"args", args}});
  };
  nlohmann::json metadata = nlohmann::json::array();
  auto name_process = [&](int pid, const std::string& name) {
    metadata.push_back(
        {{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", name}}}});
    metadata.push_back({{"name", "process_sort_index"},
                        {"ph", "M"},
                        {"pid", pid},
                        {"args", {{"sort_index", pid}}}});
  };
  std::set<std::pair<int, int>> tracks;  // (pid, tid) already named
  auto name_track = [&](int pid, int tid, const std::string& name) {
    if (!tracks.insert({pid, tid}).second) return;
    metadata.push_back({{"name", "thread_name"},
                        {"ph", "M"},
                        {"pid", pid},
                        {"tid", tid},
                        {"args", {{"name", name}}}});
  };
  std::set<int> ffn_ranks;
  for (const AttentionTrace& trace : traces) {
    int pid = trace.rank;
    name_process(pid, fmt::format("attention {}", trace.rank));
    for (const RoundTrip& t : trace.trips) {
      nlohmann::json args = {{"micro_batch", t.micro_batch}, {"sequence", t.sequence}};
      int tid = t.micro_batch;
      name_track(pid, tid, fmt::format("micro-batch {}", t.micro_batch));
      slice("attention compute", pid, tid, t.attention_start, t.push_start, args);
      slice("A send-queue delay", pid, tid, t.push_start, t.posted, args);
      slice("round trip", pid, tid, t.posted, t.completed, args);
      slice("A notify", pid, tid, t.completed, t.wait_returned, args);
      for (size_t f = 0; f < t.ffn.size(); ++f) {
        const auto& r = t.ffn[f];
        int fpid = kFfnPidBase + static_cast<int>(f);
        ffn_ranks.insert(static_cast<int>(f));
        nlohmann::json fargs = {{"from_attention", trace.rank},
                                {"micro_batch", t.micro_batch},
                                {"sequence", t.sequence}};
        int ftid = trace.rank * 64 + t.micro_batch;
        name_track(fpid, ftid,
                   fmt::format("from attention {}, micro-batch {}", trace.rank, t.micro_batch));
        slice("A2F network", fpid, ftid, r.posted_at_a != 0 ? r.posted_at_a : t.posted,
              r.f_received, fargs);
        slice("F gather wait", fpid, ftid, r.f_received, r.f_batch_ready, fargs);
        slice("F compute", fpid, ftid, r.f_compute_start, r.f_compute_end, fargs);
        slice("F respond delay", fpid, ftid, r.f_compute_end, r.f_posted, fargs);
        slice("F2A network", fpid, ftid, r.f_posted, r.received_at_a, fargs);
      }
    }
  }
  for (const InstanceHistory& h : histories) {
    const int pid = h.role == Role::attention ? h.rank : kFfnPidBase + h.rank;
    if (h.role == Role::ffn) ffn_ranks.insert(h.rank);
    for (const PeerChange& change : h.history.changes)
      slices.push_back(
          {{"name", fmt::format("{} {} {}", to_string(change.role), change.rank,
                                change.state == PeerStatus::State::lost ? "lost" : "joined")},
           {"cat", "peers"},
           {"ph", "i"},
           {"s", "p"},  // spans the instance's process
           {"pid", pid},
           {"tid", 0},
           {"ts", static_cast<double>(change.at_ns) / 1e3},
           {"args", {{"epoch", change.epoch}, {"reason", change.reason}}}});
  }
  for (int f : ffn_ranks)
    name_process(kFfnPidBase + f, fmt::format("ffn {}", f));
  std::vector<nlohmann::json> ordered(slices.begin(), slices.end());
  std::stable_sort(ordered.begin(), ordered.end(), [](const auto& x, const auto& y) {
    return x["ts"].template get<double>() < y["ts"].template get<double>();
  });
  nlohmann::json events = std::move(metadata);
  for (auto& e : ordered)
    events.push_back(std::move(e));
  std::ofstream out(path);
  if (!out) throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("cannot write trace file {}", path));
  out << nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ns"}}.dump() << "\n";
  if (!out) throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("cannot write trace file {}", path));
}

}  // namespace hetmesh::afd
