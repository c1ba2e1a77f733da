// `hetmesh bench afd`: the engine's instances. Attention keeps every micro-batch in flight for
// warmup + iterations rounds with no compute; FFN answers each batch at once. Each sends from and
// receives into the engine's slots, or buffers of its own laid out alike (the application's).
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

nlohmann::json counters_json(const afd::DataCounters& moved) {
  return {{"caller_bytes", moved.caller_bytes},
          {"slot_bytes", moved.slot_bytes},
          {"staged_bytes", moved.staged_bytes},
          {"caller_buffers", moved.caller_buffers}};
}

}  // namespace

void host_work(int gap_us) {
  if (gap_us <= 0) return;
  const int64_t until = now_ns() + int64_t{gap_us} * 1000;
  while (now_ns() < until) {
  }
}

int run_attention(const JobConfig& c, const AfdBenchOptions& o, bool caller) {
  afd::InstanceOptions options = o.instance_options();
  options.job = job_id(o.role);
  auto instance = afd::open_instance(c, afd::Role::attention, o.rank, options);
  afd::AttentionEngine& engine = instance->attention();
  const afd::EngineSpec& spec = engine.spec();
  const int M = c.job.micro_batches;
  std::vector<afd::AttentionEngine::Handle> handles(static_cast<size_t>(M));
  // The application's buffers: each micro-batch's tokens then routing, and its results per F.
  std::optional<Buffer> sent, results;
  std::vector<afd::PushOptions> pushes(static_cast<size_t>(M));
  std::vector<afd::PushTensor> tensors(static_cast<size_t>(M * spec.a2f_tensors()));
  std::vector<void*> into(static_cast<size_t>(M * spec.ffn));
  if (caller) {
    sent = instance->device().allocate(M * spec.a2f_slot_bytes());
    results = instance->device().allocate(M * spec.ffn * spec.f2a_slot_bytes());
    for (int mb = 0; mb < M; ++mb) {
      // Each tensor's rows at its place in a block like the engine's own send slot.
      auto* slot = static_cast<uint8_t*>(sent->data()) + mb * spec.a2f_slot_bytes();
      afd::PushOptions& push = pushes[static_cast<size_t>(mb)];
      const auto first = static_cast<size_t>(mb * spec.a2f_tensors());
      for (int t = 0; t < spec.a2f_tensors(); ++t)
        tensors[first + static_cast<size_t>(t)].from =
            slot + spec.a2f_tensor_offset(spec.tokens, t);
      push.tensors = std::span<const afd::PushTensor>(&tensors[first],
                                                      static_cast<size_t>(spec.a2f_tensors()));
      for (int f = 0; f < spec.ffn; ++f)
        into[static_cast<size_t>(mb * spec.ffn + f)] =
            static_cast<uint8_t*>(results->data()) + (mb * spec.ffn + f) * spec.f2a_slot_bytes();
      push.results_into = std::span<void* const>(&into[static_cast<size_t>(mb * spec.ffn)],
                                                 static_cast<size_t>(spec.ffn));
    }
    engine.register_buffer(sent->data(), sent->size());
    engine.register_buffer(results->data(), results->size());
  }
  afd::AttentionTrace trace{o.rank, {}};
  int64_t measured_start = 0, measured_end = 0;
  for (int it = 0; it < o.warmup + o.iterations; ++it) {
    if (it == o.warmup) measured_start = now_ns();
    for (int mb = 0; mb < M; ++mb) {
      if (it > 0) {
        auto trip = engine.wait(handles[static_cast<size_t>(mb)], c.job.timeout);
        if (it > o.warmup) trace.trips.push_back(trip);
        host_work(o.gap_us);
      }
      afd::PushOptions& push = pushes[static_cast<size_t>(mb)];
      push.attention_start_ns = now_ns();
      handles[static_cast<size_t>(mb)] =
          engine.push_pull(mb, static_cast<uint32_t>(c.model.tokens), push);
    }
  }
  for (int mb = 0; mb < M; ++mb)
    trace.trips.push_back(engine.wait(handles[static_cast<size_t>(mb)], c.job.timeout));
  measured_end = now_ns();
  engine.finish();
  std::ofstream(fs::path(o.out) / fmt::format("{}{}.trace.json", o.role, o.rank))
      << afd::trace_to_json(trace);
  std::ofstream(fs::path(o.out) / fmt::format("{}{}.info.json", o.role, o.rank)) << nlohmann::json{
      {"registered", total(engine.registered())},
      {"span_ns", measured_end - measured_start},
      {"moved", counters_json(engine.counters())}}.dump();
  return 0;
}

int run_ffn(const JobConfig& c, const AfdBenchOptions& o, bool caller) {
  afd::InstanceOptions options = o.instance_options();
  options.job = job_id(o.role);
  auto instance = afd::open_instance(c, afd::Role::ffn, o.rank, options);
  afd::FfnEngine& engine = instance->ffn();
  const afd::EngineSpec& spec = engine.spec();
  // The application's outputs, one per (A, micro-batch), and the buffers its As' rows land in:
  // a row space of each A2F tensor per micro-batch, as the engine's own.
  std::optional<Buffer> outputs, inputs;
  if (caller) {
    outputs =
        instance->device().allocate(spec.attention * spec.micro_batches * spec.f2a_slot_bytes());
    engine.register_buffer(outputs->data(), outputs->size());
    const uint64_t rows = spec.ffn_rows(spec.rank);
    inputs = instance->device().allocate(spec.micro_batches * spec.a2f_block_bytes(rows));
    for (int mb = 0; mb < spec.micro_batches; ++mb)
      for (int t = 0; t < spec.a2f_tensors(); ++t)
        if (const uint64_t bytes = rows * spec.a2f_row_bytes(t); bytes > 0)
          engine.receive_into(mb, t,
                              static_cast<uint8_t*>(inputs->data()) +
                                  mb * spec.a2f_block_bytes(rows) + spec.a2f_tensor_offset(rows, t),
                              bytes);
  }
  while (auto batch = engine.get_batch(c.job.timeout)) {
    if (outputs)
      for (auto& part : batch->parts)
        part.output = static_cast<uint8_t*>(outputs->data()) +
                      (part.rank * spec.micro_batches + batch->micro_batch) * spec.f2a_slot_bytes();
    engine.respond(*batch, nullptr, now_ns());
  }
  std::ofstream(fs::path(o.out) / fmt::format("{}{}.info.json", o.role, o.rank)) << nlohmann::json{
      {"registered", total(engine.registered())},
      {"moved", counters_json(engine.counters())}}.dump();
  return 0;
}

}  // namespace hetmesh::cli
