// Where the demo's host-side attention writes a micro-batch and reads F's partials back. On a
// device the host can address (cpu) that is the engine's own slots; on any other device (a GPU,
// asic_stub) it is pinned host staging, moved by a stream copy: push_pull starts when the upload's
// event completes, and results() copies the partials down before the host combines them.
#pragma once

#include "model.hpp"

#include <hetmesh/afd/engine.hpp>

#include <chrono>
#include <vector>

namespace hetmesh::demo {

class AttentionStaging {
 public:
  AttentionStaging(const Device& device, const afd::AttentionEngine& engine,
                   const ModelShape& shape, int micro_batches, int ffn_count);

  void* tokens(int micro_batch);
  Route* routing(int micro_batch);
  // Enqueues the upload of micro-batch mb (if staged) and returns what push_pull should wait for.
  afd::ReadySignal upload(int micro_batch);
  // What push_pull waits for to send micro-batch mb again (after a lost F): the uploads enqueued.
  afd::ReadySignal uploaded() { return staged_ ? afd::ReadySignal{&stream_} : afd::ReadySignal{}; }
  // F's partials of micro-batch mb, host-readable (downloaded first if staged).
  std::vector<const void*> results(int micro_batch, std::chrono::milliseconds timeout);

 private:
  struct Slot {
    Buffer tokens, routing;
    std::vector<Buffer> results;  // one per F
  };
  const afd::AttentionEngine& engine_;
  uint64_t token_bytes_, routing_bytes_, result_bytes_;
  int ffn_count_;
  bool staged_;
  Stream stream_;
  std::vector<Slot> slots_;  // staged only
};

}  // namespace hetmesh::demo
