// Scheduler conformance: every scheduler the loader finds, with its defaults, drives a simulated
// engine loop (the same bookkeeping as Engine::step: preempted sequences restart from zero at the
// front of the queue; a sequence whose tokens are all computed samples one more; it finishes at
// max_new_tokens) against a KV budget implemented here with a token capacity in blocks. Each step
// is checked against the contract: work only for known, reserved sequences and never past their
// tokens, preempted sequences were running, are released and get no work, and the loop always
// makes progress until every request has finished.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "conformance/conformance_util.h"
#include "tessera/scheduler.h"

namespace tessera {
namespace {

using namespace conformance;

// A pool of `capacity` blocks of `block_size` tokens; reservations grow, release frees.
class BlockBudget final : public KvBudget {
 public:
  BlockBudget(int64_t capacity, int64_t block_size) : capacity_(capacity), block_size_(block_size) {}

  bool reserve(SeqId seq, int64_t total_tokens) override {
    if (!known_.count(seq)) return false;  // as the engine's budget: only sequences it holds
    const int64_t tokens = std::max(tokens_[seq], total_tokens);
    if (used_blocks() - blocks(tokens_[seq]) + blocks(tokens) > capacity_) {
      if (running_.count(seq)) ++failed_running_growth_;
      return false;
    }
    tokens_[seq] = tokens;
    return true;
  }
  void release(SeqId seq) override {
    tokens_.erase(seq);
    released_.insert(seq);
  }

  int64_t held(SeqId seq) const {
    auto it = tokens_.find(seq);
    return it == tokens_.end() ? 0 : it->second;
  }
  int64_t blocks(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }
  int64_t used_blocks() const {
    int64_t n = 0;
    for (const auto& [id, t] : tokens_) n += blocks(t);
    return n;
  }
  int64_t capacity() const { return capacity_; }

  std::set<SeqId> known_, running_;  // kept in step by the simulation
  std::set<SeqId> released_;          // this step's releases, cleared by the simulation
  int64_t failed_running_growth_ = 0;

 private:
  int64_t capacity_, block_size_;
  std::map<SeqId, int64_t> tokens_;
};

struct Request {
  SeqId id;
  int64_t prompt;
  int64_t max_new;
  int64_t arrive_step = 0;
};

struct Outcome {
  int64_t steps = 0;
  int64_t preemptions = 0;
  std::map<SeqId, int64_t> first_admitted;  // step of first work
  std::map<SeqId, int64_t> generated;
  std::vector<SeqId> finished;
  int64_t peak_running_demand = 0;  // blocks all running sequences would need at their longest
};

Outcome simulate(Scheduler& sched, const std::vector<Request>& reqs, BlockBudget& budget, int64_t max_steps = 5000) {
  Outcome out;
  std::vector<SequenceInfo> waiting, running;
  std::map<SeqId, Request> by_id;
  for (const Request& r : reqs) by_id[r.id] = r;
  size_t arrived = 0;
  int64_t idle = 0;
  std::vector<Request> pending = reqs;
  std::stable_sort(pending.begin(), pending.end(),
                   [](const Request& a, const Request& b) { return a.arrive_step < b.arrive_step; });

  for (int64_t step = 0; step < max_steps; ++step) {
    while (arrived < pending.size() && pending[arrived].arrive_step <= step) {
      const Request& r = pending[arrived++];
      SequenceInfo s;
      s.id = r.id;
      s.prompt_tokens = s.total_tokens = r.prompt;
      s.max_new_tokens = s.expected_output = r.max_new;
      s.arrival_time = double(r.arrive_step) + 1e-3 * double(arrived);
      waiting.push_back(s);
      budget.known_.insert(r.id);
    }
    if (waiting.empty() && running.empty()) {
      if (arrived == pending.size()) break;
      continue;
    }
    out.steps = step + 1;
    budget.running_.clear();
    budget.released_.clear();
    for (const auto& s : running) budget.running_.insert(s.id);

    // One step is one second of engine clock, so a scheduler waiting for a batch to fill (retry_after)
    // sees its timeout pass.
    const SchedulerView view{waiting, running, 512, double(step) + 0.5};
    const StepPlan plan = sched.schedule(view, budget);
    const std::string at = "step " + std::to_string(step) + ": ";

    // Preempted: running, once, released, and given no work.
    std::set<SeqId> pre;
    for (SeqId id : plan.preempted) {
      EXPECT_TRUE(budget.running_.count(id)) << at << "preempted seq " << id << " was not running";
      EXPECT_TRUE(pre.insert(id).second) << at << "seq " << id << " preempted twice";
      EXPECT_EQ(budget.held(id), 0) << at << "preempted seq " << id << " still holds KV";
    }
    // A running sequence's cache is released only by preempting it (its KV is gone).
    for (SeqId id : budget.released_) {
      if (budget.running_.count(id)) EXPECT_TRUE(pre.count(id)) << at << "running seq " << id << " released but not preempted";
    }
    // Work: known, once, within its tokens, covered by its reservation.
    std::set<SeqId> worked;
    for (const ScheduledWork& w : plan.work) {
      auto in = [&](const std::vector<SequenceInfo>& v) {
        return std::find_if(v.begin(), v.end(), [&](const SequenceInfo& s) { return s.id == w.id; });
      };
      auto it = in(running);
      const bool is_running = it != running.end();
      if (!is_running) it = in(waiting);
      if (!is_running && it == waiting.end()) {
        ADD_FAILURE() << at << "work for unknown seq " << w.id;
        return out;
      }
      EXPECT_FALSE(pre.count(w.id)) << at << "seq " << w.id << " is both preempted and scheduled";
      EXPECT_TRUE(worked.insert(w.id).second) << at << "seq " << w.id << " scheduled twice";
      EXPECT_GT(w.n_tokens, 0) << at << "seq " << w.id;
      EXPECT_LE(it->computed_tokens + w.n_tokens, it->total_tokens) << at << "seq " << w.id << " past its tokens";
      EXPECT_GE(budget.held(w.id), it->computed_tokens + w.n_tokens)
          << at << "seq " << w.id << " scheduled without reserving its KV";
    }
    EXPECT_LE(budget.used_blocks(), budget.capacity());
    if (testing::Test::HasFailure()) return out;

    // Apply, as the engine does.
    for (SeqId id : plan.preempted) {
      auto it = std::find_if(running.begin(), running.end(), [&](const SequenceInfo& s) { return s.id == id; });
      if (it == running.end()) continue;
      it->computed_tokens = 0;
      waiting.insert(waiting.begin(), *it);
      running.erase(it);
      ++out.preemptions;
    }
    for (const ScheduledWork& w : plan.work) {
      auto wit = std::find_if(waiting.begin(), waiting.end(), [&](const SequenceInfo& s) { return s.id == w.id; });
      if (wit != waiting.end()) {
        running.push_back(*wit);
        waiting.erase(wit);
        out.first_admitted.emplace(w.id, step);
      }
      auto it = std::find_if(running.begin(), running.end(), [&](const SequenceInfo& s) { return s.id == w.id; });
      it->computed_tokens += w.n_tokens;
      if (it->computed_tokens == it->total_tokens) {
        ++it->total_tokens;
        if (++out.generated[w.id] == it->max_new_tokens) {
          out.finished.push_back(w.id);
          budget.release(w.id);
          budget.known_.erase(w.id);
          running.erase(it);
        }
      }
    }
    int64_t demand = 0;
    for (const auto& s : running) demand += budget.blocks(by_id[s.id].prompt + by_id[s.id].max_new);
    out.peak_running_demand = std::max(out.peak_running_demand, demand);

    // Nothing changes between steps unless work is done, so repeated empty plans are a livelock.
    idle = plan.work.empty() ? idle + 1 : 0;
    if (idle > 3 && arrived == pending.size()) {
      ADD_FAILURE() << at << "no progress: " << waiting.size() << " waiting, " << running.size()
                    << " running, " << budget.used_blocks() << "/" << budget.capacity() << " blocks used";
      return out;
    }
  }
  EXPECT_EQ(out.finished.size(), reqs.size()) << "not every request finished within " << max_steps << " steps";
  for (const Request& r : reqs) EXPECT_EQ(out.generated[r.id], r.max_new) << "seq " << r.id;
  return out;
}

class SchedulerConformance : public testing::TestWithParam<std::string> {
 protected:
  std::shared_ptr<Scheduler> make() { return create_default<Scheduler>(GetParam()); }
};

TEST(SchedulerPlugins, AtLeastOneIsLoaded) {
  EXPECT_FALSE(plugin_names(ComponentKind::scheduler).empty())
      << "no scheduler plugin in " << plugin_source() << "\n" << load_failures();
}

TEST_P(SchedulerConformance, EveryRequestFinishesWithAmpleMemory) {
  auto sched = make();
  const auto prompts = random_ints(12, 1, 1, 60), news = random_ints(12, 2, 1, 20);
  std::vector<Request> reqs;
  for (size_t i = 0; i < prompts.size(); ++i) reqs.push_back({SeqId(i + 1), prompts[i], news[i], int64_t(i / 3)});
  BlockBudget budget(4096, 16);
  const Outcome o = simulate(*sched, reqs, budget);
  EXPECT_EQ(o.preemptions, 0) << "preempted although memory never ran out";
  EXPECT_EQ(budget.used_blocks(), 0) << "finished sequences still hold KV";
}

TEST_P(SchedulerConformance, TightMemoryPreemptsAndStillCompletes) {
  // Six requests that each fit alone (32 tokens = 8 of 16 blocks) but not together once they grow.
  auto sched = make();
  std::vector<Request> reqs;
  for (SeqId i = 1; i <= 6; ++i) reqs.push_back({i, 8, 24, 0});
  BlockBudget budget(16, 4);
  const Outcome o = simulate(*sched, reqs, budget);
  // Either the scheduler never admitted more than memory can finish, or it preempted when memory
  // ran out: admitting more and never preempting deadlocks here (all grow in lockstep).
  if (o.peak_running_demand > budget.capacity()) {
    EXPECT_GT(o.preemptions, 0) << "memory was overcommitted but nothing was preempted";
  }
  EXPECT_EQ(budget.used_blocks(), 0);
}

TEST_P(SchedulerConformance, LongAndShortRequestsMixUnderMemoryPressure) {
  auto sched = make();
  const auto prompts = random_ints(20, 3, 1, 100), news = random_ints(20, 4, 1, 40);
  std::vector<Request> reqs;
  for (size_t i = 0; i < prompts.size(); ++i) reqs.push_back({SeqId(100 + i), prompts[i], news[i], int64_t(i)});
  BlockBudget budget(40, 8);  // 320 tokens: the longest request (140) fits alone, not many together
  simulate(*sched, reqs, budget);
  EXPECT_EQ(budget.used_blocks(), 0);
}

TEST_P(SchedulerConformance, AdmitsEqualRequestsInArrivalOrder) {
  // Identical requests (same priority, prompt and expected output) arriving in id order; memory
  // for about two at a time, so admission is spread over many steps.
  auto sched = make();
  std::vector<Request> reqs;
  for (SeqId i = 1; i <= 8; ++i) reqs.push_back({i, 10, 5, 0});
  BlockBudget budget(9, 4);
  const Outcome o = simulate(*sched, reqs, budget);
  ASSERT_EQ(o.first_admitted.size(), reqs.size());
  for (SeqId i = 2; i <= 8; ++i) {
    EXPECT_LE(o.first_admitted.at(i - 1), o.first_admitted.at(i)) << "seq " << i << " admitted before seq " << i - 1;
  }
  EXPECT_GT(o.first_admitted.at(8), 0) << "memory for ~2 requests, yet all were admitted at once";
}

TEST_P(SchedulerConformance, StartsAtOnceWhenNothingMoreCanArrive) {
  // One request just submitted, memory for it, and no others to come (`tessera run`): waiting to
  // gather a batch would only delay it.
  auto sched = make();
  SequenceInfo s;
  s.id = 7;
  s.prompt_tokens = s.total_tokens = 12;
  s.max_new_tokens = s.expected_output = 4;
  s.arrival_time = 5.0;
  const std::vector<SequenceInfo> waiting = {s};
  BlockBudget budget(64, 16);
  budget.known_.insert(s.id);
  SchedulerView view{waiting, {}, 512, 5.0};
  view.arrivals_closed = true;
  const StepPlan plan = sched->schedule(view, budget);
  ASSERT_EQ(plan.work.size(), 1u) << "the request waits although nothing more can arrive";
  EXPECT_EQ(plan.work[0].id, s.id);
  EXPECT_GT(plan.work[0].n_tokens, 0);
}

INSTANTIATE_TEST_SUITE_P(Schedulers, SchedulerConformance,
                         testing::ValuesIn(plugin_names(ComponentKind::scheduler)), param_name);

}  // namespace
}  // namespace tessera
