// Percentiles and summaries on data whose answers are known (numpy's linear interpolation).
#include <gtest/gtest.h>

#include "tessera/bench/stats.h"

namespace tessera::bench {
namespace {

TEST(Stats, PercentilesOfOneToHundredMatchNumpy) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);  // unsorted on purpose
  const Summary s = summarize(v);
  EXPECT_EQ(s.count, 100);
  EXPECT_DOUBLE_EQ(s.mean, 50.5);
  EXPECT_DOUBLE_EQ(s.p50, 50.5);
  EXPECT_NEAR(s.p95, 95.05, 1e-12);
  EXPECT_NEAR(s.p99, 99.01, 1e-12);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 100);
}

TEST(Stats, SmallAndSkewedSamples) {
  EXPECT_DOUBLE_EQ(percentile({7}, 0.99), 7);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 0.5), 2.5);
  // position 0.99 * 9 = 8.91: 91% of the way from 1 to 1000
  EXPECT_NEAR(percentile({1, 1, 1, 1, 1, 1, 1, 1, 1, 1000}, 0.99), 910.09, 1e-9);
  const Summary empty = summarize({});
  EXPECT_EQ(empty.count, 0);
  const nlohmann::json j = summary_json(empty);
  EXPECT_TRUE(j["p99"].is_null());
  EXPECT_DOUBLE_EQ(summary_json(summarize({0.001, 0.003}), 1000)["mean"].get<double>(), 2.0);
}

TEST(Stats, CdfEndsAtOneAndCoversTheRange) {
  std::vector<double> v;
  for (int i = 0; i < 1000; ++i) v.push_back(i % 97);
  const auto cdf = cdf_points(v, 50);
  ASSERT_GE(cdf.size(), 2u);
  EXPECT_LE(cdf.size(), 52u);
  EXPECT_DOUBLE_EQ(cdf.front().first, 0);
  EXPECT_DOUBLE_EQ(cdf.back().first, 96);
  EXPECT_DOUBLE_EQ(cdf.back().second, 1.0);
  for (size_t i = 1; i < cdf.size(); ++i) {
    EXPECT_GE(cdf[i].first, cdf[i - 1].first);
    EXPECT_GT(cdf[i].second, cdf[i - 1].second);
  }
}

}  // namespace
}  // namespace tessera::bench
