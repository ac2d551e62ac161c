// scheduler: static — the baseline for continuous batching. Gather a batch (batch_size requests, or
// whatever has arrived when the oldest has waited `timeout` seconds), run it to completion, then
// gather the next (at once when no more requests can arrive). Nothing joins a running batch.
#include <algorithm>
#include <memory>
#include <string>

#include "tessera/error.h"
#include "tessera/plugin.h"

namespace tessera {
namespace {

class StaticScheduler final : public Scheduler {
 public:
  explicit StaticScheduler(const Params& p) : batch_size_(p.get_int("batch_size")), timeout_(p.get_float("timeout")) {
    if (batch_size_ < 1) throw Error("scheduler static: batch_size must be >= 1, got " + std::to_string(batch_size_));
    if (timeout_ < 0) throw Error("scheduler static: timeout must be >= 0, got " + std::to_string(timeout_));
  }

  StepPlan schedule(const SchedulerView& view, KvBudget& budget) override {
    StepPlan plan;
    if (!view.running.empty()) {
      // The batch runs on; under memory pressure its newest members are recomputed later.
      size_t end = view.running.size();
      for (size_t i = 0; i < end; ++i) {
        const SequenceInfo& s = view.running[i];
        bool self_preempted = false;
        while (!budget.reserve(s.id, s.total_tokens)) {
          const SequenceInfo& victim = view.running[--end];
          budget.release(victim.id);
          plan.preempted.push_back(victim.id);
          if (&victim == &s) {
            self_preempted = true;
            break;
          }
        }
        if (self_preempted) break;
        plan.work.push_back({s.id, s.total_tokens - s.computed_tokens});
      }
      return plan;
    }
    if (view.waiting.empty()) return plan;
    double oldest = view.waiting.front().arrival_time;
    for (const auto& w : view.waiting) oldest = std::min(oldest, w.arrival_time);
    const double waited = view.now - oldest;
    if (static_cast<int64_t>(view.waiting.size()) < batch_size_ && waited < timeout_ && !view.arrivals_closed) {
      plan.retry_after = timeout_ - waited;
      return plan;
    }
    for (const auto& w : view.waiting) {
      if (static_cast<int64_t>(plan.work.size()) >= batch_size_) break;
      if (!budget.reserve(w.id, w.total_tokens)) break;
      plan.work.push_back({w.id, w.total_tokens - w.computed_tokens});
    }
    return plan;
  }

 private:
  int64_t batch_size_;
  double timeout_;
};

void register_static(Registrar& r) {
  r.add<Scheduler>("static", "Baseline: gather a batch (size or timeout), run it to completion, then the next",
                   {{"batch_size", ParamType::integer, 8, "requests per batch", {}},
                    {"timeout", ParamType::number, 0.05,
                     "seconds the oldest request waits for a batch to fill before a smaller batch starts "
                     "(no wait when nothing more can arrive, as in `tessera run`)", {}}},
                   [](const Params& p) { return std::make_unique<StaticScheduler>(p); });
}

}  // namespace
}  // namespace tessera

TESSERA_PLUGIN("scheduler_static", tessera::register_static)
