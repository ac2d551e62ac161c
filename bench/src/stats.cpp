#include "tessera/bench/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tessera::bench {

double percentile_sorted(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = std::clamp(q, 0.0, 1.0) * double(sorted.size() - 1);
  const size_t lo = size_t(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = pos - double(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

double percentile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  return percentile_sorted(values, q);
}

Summary summarize(std::vector<double> values) {
  Summary s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.count = int64_t(values.size());
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / double(values.size());
  s.p50 = percentile_sorted(values, 0.50);
  s.p95 = percentile_sorted(values, 0.95);
  s.p99 = percentile_sorted(values, 0.99);
  s.min = values.front();
  s.max = values.back();
  return s;
}

std::vector<std::pair<double, double>> cdf_points(std::vector<double> values, size_t points) {
  std::vector<std::pair<double, double>> out;
  if (values.empty()) return out;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  points = std::max<size_t>(points, 2);
  const size_t step = std::max<size_t>(1, n / points);
  for (size_t i = 0; i < n; i += step) out.emplace_back(values[i], double(i + 1) / double(n));
  if (out.back().second < 1.0) out.emplace_back(values.back(), 1.0);
  return out;
}

nlohmann::json summary_json(const Summary& s, double scale) {
  nlohmann::json j = {{"count", s.count}};
  for (const auto& [name, v] : {std::pair{"mean", s.mean}, {"p50", s.p50}, {"p95", s.p95}, {"p99", s.p99},
                                {"min", s.min}, {"max", s.max}}) {
    j[name] = s.count > 0 ? nlohmann::json(v * scale) : nlohmann::json(nullptr);
  }
  return j;
}

}  // namespace tessera::bench
