// The canary guard of one model (RollbackSpec): each variant's finished requests over a sliding
// window, and the check that takes a canary's traffic away when it fails more often, or answers
// slower at the P99, than the stable variant allows.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "tessera/deployment_spec.h"

namespace tessera::serve {

// One finished request of a variant (times in seconds; ttft/tpot < 0: the request produced none).
struct Outcome {
  double time = 0;  // when it finished (steady clock)
  bool error = false;
  double ttft = -1;
  double tpot = -1;  // mean time per output token after the first
};

// A variant's outcomes in the window, at most kMaxOutcomes (the oldest go first).
class OutcomeWindow {
 public:
  static constexpr size_t kMaxOutcomes = 100000;
  void add(const Outcome& o);
  void prune(double now, double window);
  int64_t size() const { return int64_t(items_.size()); }
  int64_t errors() const;
  // The P99 of the requests' ttft (or tpot), over those that have one; -1 when none has.
  double p99_ttft() const;
  double p99_tpot() const;

 private:
  std::deque<Outcome> items_;
};

// Why a canary is rolled back, with the figures that tripped it, for the log and /metrics.
struct Breach {
  std::string reason;  // error_rate | ttft_p99 | tpot_p99
  std::string detail;  // "error rate 0.40 > 0.05 over 20 requests in 60 s (stable: 0.00 over 31)"
};

// The canary's breach of `spec` against the stable variant, if any (both windows pruned to now).
std::optional<Breach> check_canary(const RollbackSpec& spec, const OutcomeWindow& canary, const OutcomeWindow& stable);

}  // namespace tessera::serve
