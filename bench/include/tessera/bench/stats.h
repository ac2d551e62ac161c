// Summary statistics of latency samples: mean and percentiles (linear interpolation between the
// closest ranks, as numpy's default), and empirical CDFs for charts.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera::bench {

struct Summary {
  int64_t count = 0;
  double mean = 0, p50 = 0, p95 = 0, p99 = 0, min = 0, max = 0;
};

// q in [0, 1]; `sorted` ascending and non-empty.
double percentile_sorted(const std::vector<double>& sorted, double q);
double percentile(std::vector<double> values, double q);
Summary summarize(std::vector<double> values);

// At most `points` (x, share of samples <= x) pairs describing the CDF, always including the
// minimum and the maximum.
std::vector<std::pair<double, double>> cdf_points(std::vector<double> values, size_t points = 64);

// {"count", "mean", "p50", "p95", "p99", "min", "max"}, each value multiplied by `scale` (e.g.
// 1000 for seconds -> milliseconds); null fields when there are no samples.
nlohmann::json summary_json(const Summary& s, double scale = 1.0);

}  // namespace tessera::bench
