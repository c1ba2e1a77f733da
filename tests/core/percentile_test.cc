// The one percentile rule (core/percentile.hpp): the sample at index round(q * (n - 1)) of the
// sorted samples, halves rounded up; 0 for no samples; a q outside [0, 1] refused.
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/percentile.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace hetmesh {
namespace {

// 1, 2, ..., n in a shuffled order, so that the rule's sort is exercised.
std::vector<double> one_to(int n) {
  std::vector<double> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 1.0);
  for (size_t i = 0; i < v.size(); ++i)
    std::swap(v[i], v[(i * 7919) % v.size()]);
  return v;
}

TEST(PercentileTest, NoSamplesGiveZero) {
  EXPECT_EQ(percentile({}, 0.0), 0);
  EXPECT_EQ(percentile({}, 0.5), 0);
  EXPECT_EQ(percentile({}, 1.0), 0);
  EXPECT_EQ(sorted_percentile({}, 0.99), 0);
}

TEST(PercentileTest, OneSampleIsEveryPercentile) {
  for (double q : {0.0, 0.01, 0.5, 0.99, 1.0})
    EXPECT_EQ(percentile({42.5}, q), 42.5) << "q " << q;
}

TEST(PercentileTest, P0IsTheMinimumAndP100TheMaximum) {
  auto v = one_to(37);
  EXPECT_EQ(percentile(v, 0.0), 1);
  EXPECT_EQ(percentile(v, 1.0), 37);
}

TEST(PercentileTest, P50IsTheMiddleOfAnOddCountAndTheUpperMiddleOfAnEvenOne) {
  EXPECT_EQ(percentile({3, 1, 2}, 0.5), 2);
  EXPECT_EQ(percentile({4, 1, 3, 2}, 0.5), 3);  // index round(1.5) = 2, not the mean 2.5
  EXPECT_EQ(percentile(one_to(200), 0.5), 101);
  EXPECT_EQ(percentile(one_to(201), 0.5), 101);
}

TEST(PercentileTest, P99IsTheSampleAtRoundedIndex) {
  // 200 samples: index round(0.99 * 199) = round(197.01) = 197, the 198th smallest.
  EXPECT_EQ(percentile(one_to(200), 0.99), 198);
  // 100 samples: round(98.01) = 98; 10 samples: round(8.91) = 9, the maximum.
  EXPECT_EQ(percentile(one_to(100), 0.99), 99);
  EXPECT_EQ(percentile(one_to(10), 0.99), 10);
  // A half rounds up: 5 samples, q 0.125 gives index 0.5 -> 1.
  EXPECT_EQ(percentile(one_to(5), 0.125), 2);
}

TEST(PercentileTest, AlwaysReturnsAMeasuredSample) {
  std::vector<double> v = {0.25, 10.0, 7.5, 3.0};
  for (int step = 0; step <= 20; ++step) {
    double q = step / 20.0, p = percentile(v, q);
    EXPECT_NE(std::find(v.begin(), v.end(), p), v.end()) << "q " << q << " gave " << p;
  }
}

TEST(PercentileTest, SortedSamplesGiveTheSameAsAnyOrder) {
  auto v = one_to(50);
  auto sorted = v;
  std::sort(sorted.begin(), sorted.end());
  for (double q : {0.0, 0.3, 0.5, 0.9, 0.99, 1.0})
    EXPECT_EQ(sorted_percentile(sorted, q), percentile(v, q)) << "q " << q;
}

TEST(PercentileTest, RefusesAQuantileOutsideZeroToOne) {
  for (double q : {-0.01, 1.01, 99.0, std::nan("")}) {
    EXPECT_THROW(percentile({1, 2, 3}, q), Error) << "q " << q;
    EXPECT_THROW(percentile({}, q), Error) << "q " << q;
  }
}

}  // namespace
}  // namespace hetmesh
