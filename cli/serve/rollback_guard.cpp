#include "rollback_guard.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

namespace tessera::serve {

namespace {

double p99(const std::deque<Outcome>& items, double Outcome::*field) {
  std::vector<double> v;
  for (const Outcome& o : items) {
    if (o.*field >= 0) v.push_back(o.*field);
  }
  if (v.empty()) return -1;
  // Nearest rank: the smallest value with at least 99% of the values at or below it.
  const size_t rank = size_t(std::ceil(0.99 * double(v.size())));
  std::nth_element(v.begin(), v.begin() + long(rank - 1), v.end());
  return v[rank - 1];
}

std::string fmt(const char* f, double a, double b = 0, double c = 0, double d = 0) {
  char buf[160];
  std::snprintf(buf, sizeof buf, f, a, b, c, d);
  return buf;
}

}  // namespace

void OutcomeWindow::add(const Outcome& o) {
  items_.push_back(o);
  if (items_.size() > kMaxOutcomes) items_.pop_front();
}

void OutcomeWindow::prune(double now, double window) {
  while (!items_.empty() && items_.front().time < now - window) items_.pop_front();
}

int64_t OutcomeWindow::errors() const {
  return std::count_if(items_.begin(), items_.end(), [](const Outcome& o) { return o.error; });
}

double OutcomeWindow::p99_ttft() const { return p99(items_, &Outcome::ttft); }
double OutcomeWindow::p99_tpot() const { return p99(items_, &Outcome::tpot); }

std::optional<Breach> check_canary(const RollbackSpec& spec, const OutcomeWindow& canary, const OutcomeWindow& stable) {
  if (canary.size() < spec.min_requests) return std::nullopt;
  const double rate = double(canary.errors()) / double(canary.size());
  if (rate > spec.max_error_rate) {
    const double stable_rate = stable.size() == 0 ? 0 : double(stable.errors()) / double(stable.size());
    return Breach{"error_rate", fmt("error rate %.3f > %.3f over %.0f requests", rate, spec.max_error_rate,
                                    double(canary.size())) +
                                    fmt(" in %.0f s (stable: %.3f over %.0f)", spec.window, stable_rate, double(stable.size()))};
  }
  // Latency is relative to the stable variant: only once that has as many requests to compare with.
  if (stable.size() < spec.min_requests) return std::nullopt;
  const struct {
    const char* reason;
    const char* what;
    double limit;
    double ours, theirs;
  } ratios[] = {{"ttft_p99", "P99 TTFT", spec.max_ttft_p99_ratio, canary.p99_ttft(), stable.p99_ttft()},
                {"tpot_p99", "P99 TPOT", spec.max_tpot_p99_ratio, canary.p99_tpot(), stable.p99_tpot()}};
  for (const auto& r : ratios) {
    if (r.limit <= 0 || r.ours < 0 || r.theirs <= 0) continue;
    if (r.ours / r.theirs > r.limit) {
      return Breach{r.reason, std::string(r.what) + fmt(" %.4f s is %.2fx the stable variant's %.4f s (limit %.2fx)",
                                                        r.ours, r.ours / r.theirs, r.theirs, r.limit) +
                                  fmt(" over %.0f and %.0f requests", double(canary.size()), double(stable.size()))};
    }
  }
  return std::nullopt;
}

}  // namespace tessera::serve
