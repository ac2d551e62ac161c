// What priority_fair is for, checked the way the engine drives a scheduler: a flood of
// high-priority requests must not starve low-priority ones (as strict priority does), and under
// contention the service follows the weights. Both schedulers come from their libraries through
// the registry, as in a pipeline: this plugin by path, `continuous` from the installed SDK.
#include <gtest/gtest.h>

#include <tessera/registry.h>
#include <tessera/scheduler.h>

#include <algorithm>
#include <map>
#include <vector>

namespace {

using namespace tessera;

Registry& registry() {
  static Registry reg;
  static const bool loaded = [] {
    reg.load_default_paths();
    reg.load_library(PRIORITY_FAIR_LIBRARY);
    return true;
  }();
  (void)loaded;
  return reg;
}

// Ample KV memory: this test is about admission order, not preemption.
class Unlimited final : public KvBudget {
 public:
  bool reserve(SeqId, int64_t) override { return true; }
  void release(SeqId) override {}
};

struct Counts {
  std::map<int32_t, int> admitted;  // per priority
  std::map<int32_t, int> waiting_at_end;
};

// Two requests arrive every step, one of priority 1 and one of priority 0; each has a 4-token
// prompt and 4 new tokens, and at most 2 run at once, so the queue only grows (contention
// throughout). The loop applies each plan as Engine::step does.
Counts run(Scheduler& sched, int steps) {
  Counts out;
  std::vector<SequenceInfo> waiting, running;
  std::map<SeqId, int64_t> generated;
  SeqId next_id = 1;
  Unlimited budget;
  for (int step = 0; step < steps; ++step) {
    for (int32_t prio : {1, 0}) {
      SequenceInfo s;
      s.id = next_id++;
      s.prompt_tokens = s.total_tokens = 4;
      s.max_new_tokens = s.expected_output = 4;
      s.priority = prio;
      s.arrival_time = step + 0.001 * double(s.id);
      waiting.push_back(s);
    }
    const StepPlan plan = sched.schedule(SchedulerView{waiting, running, 256, double(step)}, budget);
    EXPECT_TRUE(plan.preempted.empty());
    for (const ScheduledWork& w : plan.work) {
      auto wit = std::find_if(waiting.begin(), waiting.end(), [&](const SequenceInfo& s) { return s.id == w.id; });
      if (wit != waiting.end()) {
        ++out.admitted[wit->priority];
        running.push_back(*wit);
        waiting.erase(wit);
      }
      auto it = std::find_if(running.begin(), running.end(), [&](const SequenceInfo& s) { return s.id == w.id; });
      it->computed_tokens += w.n_tokens;
      if (it->computed_tokens == it->total_tokens) {
        ++it->total_tokens;
        if (++generated[w.id] == it->max_new_tokens) running.erase(it);
      }
    }
  }
  for (const auto& s : waiting) ++out.waiting_at_end[s.priority];
  return out;
}

std::shared_ptr<Scheduler> make(const std::string& name, nlohmann::json params) {
  return registry().create<Scheduler>(name, params, "priority_fair_test");
}

TEST(PriorityFair, StrictPriorityStarvesTheLowClass) {
  // The problem this plugin solves, shown on the in-tree scheduler.
  auto sched = make("continuous", {{"max_seqs", 2}});
  Counts c = run(*sched, 200);
  EXPECT_GT(c.admitted[1], 50);
  // Only at the first step, before a queue formed; after that every low-priority request waits.
  EXPECT_LE(c.admitted[0], 1);
  EXPECT_GE(c.waiting_at_end[0], 199);
}

TEST(PriorityFair, LowPriorityGetsItsWeightedShare) {
  auto sched = make("priority_fair", {{"max_seqs", 2}});  // priority_weight 2: shares 2 : 1
  Counts c = run(*sched, 200);
  const int total = c.admitted[0] + c.admitted[1];
  ASSERT_GT(total, 50);
  const double low_share = double(c.admitted[0]) / total;
  EXPECT_NEAR(low_share, 1.0 / 3.0, 0.05) << c.admitted[1] << " high vs " << c.admitted[0] << " low";
}

TEST(PriorityFair, WeightOneSharesEqually) {
  auto sched = make("priority_fair", {{"max_seqs", 2}, {"priority_weight", 1.0}});
  Counts c = run(*sched, 200);
  EXPECT_LE(std::abs(c.admitted[0] - c.admitted[1]), 2) << c.admitted[1] << " high vs " << c.admitted[0] << " low";
}

TEST(PriorityFair, RejectsABadWeightNamingIt) {
  try {
    make("priority_fair", {{"priority_weight", 0.5}});
    FAIL() << "priority_weight 0.5 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("priority_weight must be in [1, 16], got 0.5"), std::string::npos) << e.what();
  }
}

}  // namespace
