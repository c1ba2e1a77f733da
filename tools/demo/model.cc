#include "model.hpp"

#include <hetmesh/afd/job.hpp>
#include <hetmesh/core/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <new>
#include <numeric>
#include <string>

namespace hetmesh::demo {
namespace {

// Deterministic weights in [-scale, scale].
std::vector<float> random_matrix(uint64_t seed, size_t count, float scale) {
  std::vector<float> m(count);
  uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (float& v : m) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    v = (static_cast<float>(x >> 40) / static_cast<float>(1ull << 24) * 2.0f - 1.0f) * scale;
  }
  return m;
}

// Error(OUT_OF_MEMORY) naming what a std::bad_alloc could not allocate, in its place.
[[noreturn]] void out_of_memory(const std::string& what, double bytes) {
  throw Error(HM_ERR_OUT_OF_MEMORY,
              fmt::format("{} ({}): out of memory", what, afd::format_bytes(bytes)));
}

}  // namespace

void run_experts(const ExpertArgs& a, const void* tokens, const Route* routing,
                 const float* weights, void* out) {
  std::vector<float> x(a.hidden), hidden(a.ffn_dim), y(a.hidden);
  const size_t per_expert = 2 * size_t{a.ffn_dim} * a.hidden;
  for (uint32_t t = 0; t < a.tokens; ++t) {
    for (uint32_t i = 0; i < a.hidden; ++i)
      x[i] = load(a.a2f, tokens, size_t{t} * a.hidden + i);
    std::fill(y.begin(), y.end(), 0.0f);
    for (uint32_t k = 0; k < a.top_k; ++k) {
      const Route& r = routing[size_t{t} * a.top_k + k];
      if (r.expert < a.first_expert || r.expert >= a.last_expert) continue;
      const float* w1 = weights + static_cast<size_t>(r.expert - a.first_expert) * per_expert;
      const float* w2 = w1 + size_t{a.ffn_dim} * a.hidden;
      for (uint32_t j = 0; j < a.ffn_dim; ++j) {
        float s = 0;
        for (uint32_t i = 0; i < a.hidden; ++i)
          s += w1[size_t{j} * a.hidden + i] * x[i];
        hidden[j] = std::max(s, 0.0f);
      }
      for (uint32_t i = 0; i < a.hidden; ++i) {
        float s = 0;
        for (uint32_t j = 0; j < a.ffn_dim; ++j)
          s += w2[size_t{i} * a.ffn_dim + j] * hidden[j];
        y[i] += r.weight * s;
      }
    }
    for (uint32_t i = 0; i < a.hidden; ++i)
      store(a.f2a, out, size_t{t} * a.hidden + i, y[i]);
  }
}

ExpertBytes expert_bytes(const ExpertArgs& a) {
  return {uint64_t{a.tokens} * a.hidden * dtype_bytes(a.a2f),
          uint64_t{a.tokens} * a.top_k * sizeof(Route),
          uint64_t{a.tokens} * a.hidden * dtype_bytes(a.f2a),
          static_cast<uint64_t>(a.last_expert - a.first_expert) * 2 * a.ffn_dim * a.hidden *
              sizeof(float)};
}

double model_bytes(const ModelShape& s) {
  const double h = s.hidden, f = s.ffn_dim, experts = s.experts;
  return s.layers * (h * h + experts * h + experts * 2 * f * h) * sizeof(float);
}

double expert_copy_bytes(const ModelShape& s, int ffn_rank, int ffn_count) {
  auto [first, last] = expert_range(s.experts, ffn_rank, ffn_count);
  return s.layers * double(last - first) * 2 * double(s.ffn_dim) * s.hidden * sizeof(float);
}

TinyMoe::TinyMoe(const ModelShape& shape) : shape_(shape) {
  const size_t h = shape.hidden, f = shape.ffn_dim;
  try {
    for (int l = 0; l < shape.layers; ++l) {
      uint64_t seed = shape.seed * 1000 + static_cast<uint64_t>(l) * 10;
      attention_.push_back(random_matrix(seed + 1, h * h, 1.0f / std::sqrt(static_cast<float>(h))));
      router_.push_back(random_matrix(seed + 2, shape.experts * h, 1.0f));
      experts_.push_back(random_matrix(seed + 3, static_cast<size_t>(shape.experts) * 2 * f * h,
                                       1.0f / std::sqrt(static_cast<float>(h))));
    }
  } catch (const std::bad_alloc&) {
    out_of_memory(fmt::format("the demo model's weights, {} layers", shape.layers),
                  model_bytes(shape));
  }
}

std::vector<float> TinyMoe::input(int a, int mb) const {
  const size_t n = size_t{shape_.tokens} * shape_.hidden;
  try {
    return random_matrix(
        shape_.seed * 7 + static_cast<uint64_t>(a) * 1009 + static_cast<uint64_t>(mb), n, 1.0f);
  } catch (const std::bad_alloc&) {
    out_of_memory(fmt::format("the demo's input of attention {} micro-batch {}", a, mb),
                  double(n) * sizeof(float));
  }
}

void TinyMoe::attention(int layer, const float* x, float* h, void* tokens, Route* routing) const {
  const uint32_t H = shape_.hidden, T = shape_.tokens;
  const std::vector<float>& w = attention_[static_cast<size_t>(layer)];
  const std::vector<float>& router = router_[static_cast<size_t>(layer)];
  std::vector<float> running(H, 0.0f), logits(static_cast<size_t>(shape_.experts));
  std::vector<int> order(static_cast<size_t>(shape_.experts));
  for (uint32_t t = 0; t < T; ++t) {
    const float* xt = x + size_t{t} * H;
    float* ht = h + size_t{t} * H;
    for (uint32_t i = 0; i < H; ++i) {
      float s = 0;
      for (uint32_t j = 0; j < H; ++j)
        s += w[size_t{i} * H + j] * xt[j];
      running[i] += std::tanh(s);
      ht[i] = xt[i] + running[i] / static_cast<float>(t + 1);  // causal mean of the mixed tokens
      store(shape_.a2f, tokens, size_t{t} * H + i, ht[i]);
    }
    for (int e = 0; e < shape_.experts; ++e) {
      float s = 0;
      for (uint32_t i = 0; i < H; ++i)
        s += router[static_cast<size_t>(e) * H + i] * ht[i];
      logits[static_cast<size_t>(e)] = s;
    }
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int p, int q) {
      return logits[static_cast<size_t>(p)] > logits[static_cast<size_t>(q)];
    });
    float top = logits[static_cast<size_t>(order[0])], total = 0;
    for (uint32_t k = 0; k < shape_.top_k; ++k)
      total += std::exp(logits[static_cast<size_t>(order[k])] - top);
    for (uint32_t k = 0; k < shape_.top_k; ++k) {
      int e = order[k];
      routing[size_t{t} * shape_.top_k + k] = {
          e, std::exp(logits[static_cast<size_t>(e)] - top) / total};
    }
  }
}

void TinyMoe::combine(const float* h, const std::vector<const void*>& partials, float* x) const {
  const size_t n = size_t{shape_.tokens} * shape_.hidden;
  for (size_t i = 0; i < n; ++i) {
    float s = h[i];
    for (const void* p : partials)
      s += load(shape_.f2a, p, i);
    x[i] = s;
  }
}

std::pair<int, int> expert_range(int experts, int rank, int count) {
  int per = experts / count, extra = experts % count;
  int first = rank * per + std::min(rank, extra);
  return {first, first + per + (rank < extra ? 1 : 0)};
}

std::pair<int, int> TinyMoe::expert_range(int rank, int count) const {
  return demo::expert_range(shape_.experts, rank, count);
}

std::vector<float> TinyMoe::expert_weights(int layer, int first, int last) const {
  const size_t per_expert = 2 * size_t{shape_.ffn_dim} * shape_.hidden;
  const auto& all = experts_[static_cast<size_t>(layer)];
  try {
    return {all.begin() + static_cast<ptrdiff_t>(first * per_expert),
            all.begin() + static_cast<ptrdiff_t>(last * per_expert)};
  } catch (const std::bad_alloc&) {
    out_of_memory(
        fmt::format("a copy of the demo's experts {}..{} of layer {}", first, last - 1, layer),
        double(last - first) * double(per_expert) * sizeof(float));
  }
}

ExpertArgs TinyMoe::expert_args(int ffn_rank, int ffn_count) const {
  auto [first, last] = expert_range(ffn_rank, ffn_count);
  return {shape_.tokens, shape_.hidden, shape_.ffn_dim, shape_.top_k,
          first,         last,          shape_.a2f,     shape_.f2a};
}

std::vector<float> TinyMoe::reference(int a, int mb, int ffn_count) const {
  const size_t n = size_t{shape_.tokens} * shape_.hidden;
  std::vector<float> x = input(a, mb), h;
  std::vector<uint8_t> tokens;
  std::vector<Route> routing;
  std::vector<std::vector<uint8_t>> partials;
  try {
    h.resize(n);
    tokens.resize(n * dtype_bytes(shape_.a2f));
    routing.resize(size_t{shape_.tokens} * shape_.top_k);
    partials.assign(static_cast<size_t>(ffn_count),
                    std::vector<uint8_t>(n * dtype_bytes(shape_.f2a)));
  } catch (const std::bad_alloc&) {
    out_of_memory(fmt::format("the single-process reference's buffers for attention {} "
                              "micro-batch {}",
                              a, mb),
                  double(n) * (sizeof(float) + dtype_bytes(shape_.a2f) +
                               double(ffn_count) * dtype_bytes(shape_.f2a)) +
                      double(shape_.tokens) * shape_.top_k * sizeof(Route));
  }
  for (int layer = 0; layer < shape_.layers; ++layer) {
    attention(layer, x.data(), h.data(), tokens.data(), routing.data());
    std::vector<const void*> views;
    for (int f = 0; f < ffn_count; ++f) {
      ExpertArgs args = expert_args(f, ffn_count);
      auto weights = expert_weights(layer, args.first_expert, args.last_expert);
      run_experts(args, tokens.data(), routing.data(), weights.data(),
                  partials[static_cast<size_t>(f)].data());
      views.push_back(partials[static_cast<size_t>(f)].data());
    }
    combine(h.data(), views, x.data());
  }
  return x;
}

}  // namespace hetmesh::demo
