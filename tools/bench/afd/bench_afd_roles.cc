// `hetmesh bench afd`: the engine's instances. Attention keeps every micro-batch in flight for
// warmup + iterations rounds with no compute; FFN answers each batch at once.
#include "bench_afd.hpp"

#include <hetmesh/afd/instance.hpp>
#include <hetmesh/core/error.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace hetmesh::cli {
namespace {

namespace fs = std::filesystem;
using afd::JobConfig;
using afd::now_ns;

uint64_t total(const std::vector<std::pair<std::string, uint64_t>>& regions) {
  uint64_t sum = 0;
  for (const auto& [name, bytes] : regions)
    sum += bytes;
  return sum;
}

}  // namespace

int run_attention(const JobConfig& c, const AfdBenchOptions& o) {
  auto instance = afd::open_instance(c, afd::Role::attention, o.rank, o.instance_options());
  afd::AttentionEngine& engine = instance->attention();
  const int M = c.job.micro_batches;
  std::vector<afd::AttentionEngine::Handle> handles(static_cast<size_t>(M));
  afd::AttentionTrace trace{o.rank, {}};
  int64_t measured_start = 0, measured_end = 0;
  for (int it = 0; it < o.warmup + o.iterations; ++it) {
    if (it == o.warmup) measured_start = now_ns();
    for (int mb = 0; mb < M; ++mb) {
      if (it > 0) {
        auto trip = engine.wait(handles[static_cast<size_t>(mb)], c.job.timeout);
        if (it > o.warmup) trace.trips.push_back(trip);
      }
      handles[static_cast<size_t>(mb)] = engine.push_pull(mb, static_cast<uint32_t>(c.model.tokens),
                                                          {.attention_start_ns = now_ns()});
    }
  }
  for (int mb = 0; mb < M; ++mb)
    trace.trips.push_back(engine.wait(handles[static_cast<size_t>(mb)], c.job.timeout));
  measured_end = now_ns();
  engine.finish();
  std::ofstream(fs::path(o.out) / fmt::format("attention{}.trace.json", o.rank))
      << afd::trace_to_json(trace);
  std::ofstream(fs::path(o.out) / fmt::format("attention{}.info.json", o.rank)) << nlohmann::json{
      {"registered", total(engine.registered())},
      {"span_ns", measured_end - measured_start}}.dump();
  return 0;
}

int run_ffn(const JobConfig& c, const AfdBenchOptions& o) {
  auto instance = afd::open_instance(c, afd::Role::ffn, o.rank, o.instance_options());
  afd::FfnEngine& engine = instance->ffn();
  std::ofstream(fs::path(o.out) / fmt::format("ffn{}.info.json", o.rank))
      << nlohmann::json{{"registered", total(engine.registered())}}.dump();
  while (auto batch = engine.get_batch(c.job.timeout))
    engine.respond(*batch, nullptr, now_ns());
  return 0;
}

}  // namespace hetmesh::cli
