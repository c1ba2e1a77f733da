// Runs one F part's experts on the F instance's device: directly on host-addressable memory
// (cpu), or as a "kernel" through the asic_stub launch extension on memory the host cannot touch.
// GPU kernels for the same model belong here too.
#pragma once

#include "model.hpp"

#include <hetmesh/afd/engine.hpp>

#include <memory>

namespace hetmesh::demo {

class ExpertRunner {
 public:
  // Throws Error naming the device if the demo has no kernels for it.
  static std::unique_ptr<ExpertRunner> create(const Device& device, const TinyMoe& model,
                                              int ffn_rank, int ffn_count);
  virtual ~ExpertRunner() = default;
  // Enqueues (or runs) layer `layer`'s experts on `part`, in order on `stream`.
  virtual void run(int layer, const afd::Batch::FromAttention& part, const Stream& stream) = 0;
};

}  // namespace hetmesh::demo
