// A tiny MoE transformer for the AFD demo: per layer, a causal token-mixing "attention" and a
// top-k router on the attention side, and experts split across the FFN instances. Small enough to
// run on a CPU, real enough to exercise the A2F/F2A data path, dtypes and routing.
#pragma once

#include "dtype.hpp"

#include <cstdint>
#include <utility>
#include <vector>

namespace hetmesh::demo {

struct ModelShape {
  int layers = 4;
  uint32_t tokens = 16;  // per micro-batch per attention instance
  uint32_t hidden = 64;
  int experts = 8;
  uint32_t top_k = 2;
  uint32_t ffn_dim = 128;
  Dtype a2f = Dtype::bf16;
  Dtype f2a = Dtype::bf16;
  uint64_t seed = 2026;
};

// Routing entry on the wire: top_k per token.
struct Route {
  int32_t expert;
  float weight;
};

// The arguments of the expert kernel (also the asic_stub launch arguments).
struct ExpertArgs {
  uint32_t tokens, hidden, ffn_dim, top_k;
  int32_t first_expert, last_expert;  // this F owns [first, last)
  Dtype a2f, f2a;
};

// Bytes of a part of `args.tokens` tokens (its tokens, routing and output) and of the weights of
// experts [first, last): what a kernel reads and writes.
struct ExpertBytes {
  uint64_t tokens, routing, output, weights;
};
ExpertBytes expert_bytes(const ExpertArgs& args);

// out[t] = sum over token t's routes to experts in [first, last) of weight * W2 relu(W1 x_t),
// with x read in the A2F dtype and out written in the F2A dtype. `weights` holds, per expert
// from `first_expert` on, W1 [ffn_dim][hidden] then W2 [hidden][ffn_dim].
void run_experts(const ExpertArgs& args, const void* tokens, const Route* routing,
                 const float* weights, void* out);

// Bytes of host memory a TinyMoe of `shape` holds (every layer's weights), and that an F's
// ExpertRunner copies for its experts [first, last), in floating point: shapes the config accepts
// can exceed 64 bits.
double model_bytes(const ModelShape& shape);
double expert_copy_bytes(const ModelShape& shape, int ffn_rank, int ffn_count);
// Experts [first, last) of `experts` owned by F `rank` of `count`.
std::pair<int, int> expert_range(int experts, int rank, int count);

class TinyMoe {
 public:
  explicit TinyMoe(const ModelShape& shape);
  const ModelShape& shape() const { return shape_; }

  // Input hidden states of attention rank `a`, micro-batch `mb`: [tokens][hidden].
  std::vector<float> input(int a, int mb) const;
  // Attention and router of `layer` on x; h (residual) in float, tokens in the A2F dtype.
  void attention(int layer, const float* x, float* h, void* tokens, Route* routing) const;
  // x = h + the sum of the F partials, in F order.
  void combine(const float* h, const std::vector<const void*>& partials, float* x) const;
  // Expert weights of `layer` for experts [first, last), laid out for run_experts.
  std::vector<float> expert_weights(int layer, int first, int last) const;
  ExpertArgs expert_args(int ffn_rank, int ffn_count) const;
  // Experts [first, last) owned by F `rank` of `count`.
  std::pair<int, int> expert_range(int rank, int count) const;

  // The whole model for (a, mb) in one process, with the same quantization on the same paths.
  std::vector<float> reference(int a, int mb, int ffn_count) const;

 private:
  ModelShape shape_;
  std::vector<std::vector<float>> attention_, router_, experts_;  // per layer
};

}  // namespace hetmesh::demo
