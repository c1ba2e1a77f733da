// The one percentile rule of every bench and of the AFD metrics (p50, p99, ...). The Python
// package's bench (python/hetmesh/bench.py) and the CUDA baselines (plugins/cuda/tools), which
// cannot link this library, mirror it.
//
// The rule: of n samples in ascending order, the q-quantile is the one at 0-based index
// round(q * (n - 1)), halves rounded up. It is always a sample that was measured (never an
// interpolation between two), p0 is the minimum and p100 the maximum without a special case, and
// p50 of an even count is the upper of the two middle samples. Of 200 samples, p99 is the 198th
// smallest (index 197): two samples lie above it.
#pragma once

#include <span>
#include <vector>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh {

// The q-quantile of samples already in ascending order (several quantiles of one sort); 0 for no
// samples. A q outside [0, 1] (or NaN) throws Error(HM_ERR_INVALID_ARGUMENT).
double sorted_percentile(std::span<const double> sorted, double q);

// The q-quantile of samples in any order (sorts a copy); 0 for no samples.
double percentile(std::vector<double> samples, double q);

}  // namespace hetmesh

#pragma GCC visibility pop
