// The percentile rule (percentile.hpp).
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/percentile.hpp>

#include <fmt/format.h>

#include <algorithm>

namespace hetmesh {

double sorted_percentile(std::span<const double> sorted, double q) {
  if (!(q >= 0 && q <= 1))  // NaN fails both comparisons
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("percentile {}: not in [0, 1]", q));
  if (sorted.empty()) return 0;
  return sorted[static_cast<size_t>(q * static_cast<double>(sorted.size() - 1) + 0.5)];
}

double percentile(std::vector<double> samples, double q) {
  std::sort(samples.begin(), samples.end());
  return sorted_percentile(samples, q);
}

}  // namespace hetmesh
