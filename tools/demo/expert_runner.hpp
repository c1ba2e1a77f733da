// Runs one F part's experts on the F instance's device, by the routes hetmesh/demo_experts.h
// describes: on the host where the device's memory is host-addressable, else with the plugin's
// kernel library (libhetmesh-demo-<plugin>.so), else on the host through staging.
#pragma once

#include "model.hpp"

#include <hetmesh/afd/engine.hpp>

#include <memory>

namespace hetmesh::demo {

class ExpertRunner {
 public:
  // Logs which route it took, and why (a kernel library not found names where it looked).
  static std::unique_ptr<ExpertRunner> create(const Device& device, const TinyMoe& model,
                                              int ffn_rank, int ffn_count);
  virtual ~ExpertRunner() = default;
  // Enqueues (or runs) layer `layer`'s experts on `part`, in order on `stream`.
  virtual void run(int layer, const afd::Batch::FromAttention& part, const Stream& stream) = 0;
  // How the experts run, for the demo's report: "on the host", "by <kernel library>", ...
  std::string route;
};

}  // namespace hetmesh::demo
