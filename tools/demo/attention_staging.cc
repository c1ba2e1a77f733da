#include "attention_staging.hpp"

#include "dtype.hpp"

namespace hetmesh::demo {

AttentionStaging::AttentionStaging(const Device& device, const afd::AttentionEngine& engine,
                                   const ModelShape& shape, int micro_batches, int ffn_count)
    : engine_(engine),
      token_bytes_(uint64_t{shape.tokens} * shape.hidden * dtype_bytes(shape.a2f)),
      routing_bytes_(uint64_t{shape.tokens} * shape.top_k * sizeof(Route)),
      result_bytes_(uint64_t{shape.tokens} * shape.hidden * dtype_bytes(shape.f2a)),
      ffn_count_(ffn_count),
      staged_(!device.has(HM_CAP_HOST_ADDRESSABLE_DEVICE_MEMORY)) {
  if (!staged_) return;
  stream_ = device.create_stream();
  for (int mb = 0; mb < micro_batches; ++mb) {
    Slot slot;
    slot.tokens = device.allocate(token_bytes_, MemoryKind::pinned_host);
    slot.routing = device.allocate(routing_bytes_, MemoryKind::pinned_host);
    for (int f = 0; f < ffn_count; ++f)
      slot.results.push_back(device.allocate(result_bytes_, MemoryKind::pinned_host));
    slots_.push_back(std::move(slot));
  }
}

void* AttentionStaging::tokens(int mb) {
  return staged_ ? slots_.at(static_cast<size_t>(mb)).tokens.data() : engine_.tokens(mb);
}

Route* AttentionStaging::routing(int mb) {
  return static_cast<Route*>(staged_ ? slots_.at(static_cast<size_t>(mb)).routing.data()
                                     : engine_.routing(mb));
}

afd::ReadySignal AttentionStaging::upload(int mb) {
  if (!staged_) return {};
  Slot& slot = slots_.at(static_cast<size_t>(mb));
  stream_.copy(engine_.tokens(mb), slot.tokens.data(), token_bytes_);
  stream_.copy(engine_.routing(mb), slot.routing.data(), routing_bytes_);
  return {&stream_};  // push_pull sends once these copies are done
}

std::vector<const void*> AttentionStaging::results(int mb, std::chrono::milliseconds timeout) {
  std::vector<const void*> partials;
  for (int f = 0; f < ffn_count_; ++f) {
    if (!staged_) {
      partials.push_back(engine_.result(mb, f));
      continue;
    }
    void* host = slots_.at(static_cast<size_t>(mb)).results.at(static_cast<size_t>(f)).data();
    stream_.copy(host, engine_.result(mb, f), result_bytes_);
    partials.push_back(host);
  }
  if (staged_) stream_.synchronize(timeout);
  return partials;
}

}  // namespace hetmesh::demo
