// scheduler: fcfs — first come, first served. Running sequences decode together each step; waiting
// ones are admitted in arrival order (whole prompt in one step) while sequence, token and memory
// budgets allow. When a running sequence cannot grow, the newest running sequences are preempted
// (to be recomputed later).
#include <algorithm>
#include <memory>
#include <string>

#include "tessera/error.h"
#include "tessera/plugin.h"

namespace tessera {
namespace {

class FcfsScheduler final : public Scheduler {
 public:
  explicit FcfsScheduler(const Params& p)
      : max_seqs_(p.get_int("max_seqs")), max_batch_tokens_(p.get_int("max_batch_tokens")) {
    if (max_seqs_ < 1) throw Error("scheduler fcfs: max_seqs must be >= 1, got " + std::to_string(max_seqs_));
    if (max_batch_tokens_ < 1) {
      throw Error("scheduler fcfs: max_batch_tokens must be >= 1, got " + std::to_string(max_batch_tokens_));
    }
  }

  StepPlan schedule(const SchedulerView& view, KvBudget& budget) override {
    StepPlan plan;
    int64_t tokens = 0;
    // Running sequences first, oldest first; the newest are the ones given up under pressure.
    std::vector<const SequenceInfo*> running;
    for (const auto& s : view.running) running.push_back(&s);
    size_t end = running.size();
    for (size_t i = 0; i < end; ++i) {
      const SequenceInfo& s = *running[i];
      const int64_t n = s.total_tokens - s.computed_tokens;
      if (n <= 0) continue;
      while (!budget.reserve(s.id, s.total_tokens)) {
        // Preempt the newest other sequence; if this one is the newest, preempt it instead.
        const size_t victim = end - 1;
        budget.release(running[victim]->id);
        plan.preempted.push_back(running[victim]->id);
        --end;
        if (victim == i) break;
      }
      if (i >= end) break;
      plan.work.push_back({s.id, n});
      tokens += n;
    }
    if (!plan.preempted.empty()) return plan;  // under memory pressure, admit nothing new

    int64_t seqs = static_cast<int64_t>(end);
    for (const auto& s : view.waiting) {
      if (seqs >= max_seqs_) break;
      const int64_t n = s.total_tokens - s.computed_tokens;
      if (tokens + n > max_batch_tokens_ && !plan.work.empty()) break;
      if (!budget.reserve(s.id, s.total_tokens)) break;  // head of line waits for memory
      plan.work.push_back({s.id, n});
      tokens += n;
      ++seqs;
    }
    return plan;
  }

 private:
  int64_t max_seqs_;
  int64_t max_batch_tokens_;
};

void register_fcfs(Registrar& r) {
  r.add<Scheduler>("fcfs", "First come, first served: decode the running batch, admit in arrival order",
                   {{"max_seqs", ParamType::integer, 16, "sequences running at once", {}},
                    {"max_batch_tokens", ParamType::integer, 4096,
                     "tokens per step (a longer prompt still runs, alone)", {}}},
                   [](const Params& p) { return std::make_unique<FcfsScheduler>(p); });
}

}  // namespace
}  // namespace tessera

TESSERA_PLUGIN("scheduler_fcfs", tessera::register_fcfs)
