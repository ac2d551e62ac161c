// scheduler: priority_fair — an out-of-tree scheduler plugin, built against the installed SDK.
//
// Strict priority (the in-tree `continuous` scheduler) starves low-priority requests while
// higher-priority ones keep arriving. priority_fair shares admission by weight instead: each
// priority level is a class with weight priority_weight^priority, and the next request admitted
// comes from the class that has received the least service per unit of weight so far (weighted
// fair queueing; service = a request's prompt plus expected output, in tokens). With the default
// weight 2, priority 1 gets twice the service of priority 0 under contention, and priority 0 still
// progresses. A class that had nothing waiting starts again at the current share (no credit for
// idle time), and within a class requests go in arrival order.
//
// Running sequences continue every step as in `continuous` (a decode token or the next prefill
// chunk, under max_batch_tokens); when KV memory runs out the victim is the lowest-priority,
// newest running sequence, preempted for recompute.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <tessera/error.h>
#include <tessera/plugin.h>

namespace priority_fair {

using namespace tessera;

class PriorityFairScheduler final : public Scheduler {
 public:
  explicit PriorityFairScheduler(const Params& p)
      : max_batch_tokens_(p.get_int("max_batch_tokens")),
        max_seqs_(p.get_int("max_seqs")),
        priority_weight_(p.get_float("priority_weight")),
        admission_reserve_(p.get_float("admission_reserve")) {
    if (max_batch_tokens_ < 1) fail("max_batch_tokens must be >= 1, got " + std::to_string(max_batch_tokens_));
    if (max_seqs_ < 1) fail("max_seqs must be >= 1, got " + std::to_string(max_seqs_));
    if (!(priority_weight_ >= 1.0 && priority_weight_ <= 16.0)) {
      fail("priority_weight must be in [1, 16], got " + std::to_string(priority_weight_));
    }
    if (!(admission_reserve_ >= 0 && admission_reserve_ <= 1)) {
      fail("admission_reserve must be in [0, 1], got " + std::to_string(admission_reserve_));
    }
  }

  StepPlan schedule(const SchedulerView& view, KvBudget& budget) override {
    StepPlan plan;
    int64_t tokens_left = max_batch_tokens_;

    // 1. Running sequences continue, highest priority and oldest first; under memory pressure the
    //    lowest-priority, newest one is given up.
    std::vector<const SequenceInfo*> running = by_priority(view.running);
    for (size_t i = 0; i < running.size(); ++i) {
      const SequenceInfo& s = *running[i];
      const int64_t n = std::min(s.total_tokens - s.computed_tokens, tokens_left);
      if (n <= 0) continue;  // out of token budget this step: it keeps its KV and waits
      bool self_preempted = false;
      while (!budget.reserve(s.id, s.computed_tokens + n)) {
        const SequenceInfo* victim = running.back();
        budget.release(victim->id);
        plan.preempted.push_back(victim->id);
        running.pop_back();
        if (victim == &s) {
          self_preempted = true;
          break;
        }
      }
      if (self_preempted) break;
      plan.work.push_back({s.id, n});
      tokens_left -= n;
    }
    if (!plan.preempted.empty()) return plan;  // memory is short: admit nobody new

    // 2. Admission by weighted fair queueing across priority classes.
    std::map<int32_t, std::vector<const SequenceInfo*>> classes;  // each in arrival order
    for (const SequenceInfo* w : by_arrival(view.waiting)) classes[w->priority].push_back(w);
    start_new_busy_classes(classes);
    std::map<int32_t, size_t> next;  // per class: index of its next waiting request
    auto seqs = static_cast<int64_t>(running.size());
    while (seqs < max_seqs_ && tokens_left > 0) {
      const int32_t* pick = nullptr;
      for (const auto& [prio, queue] : classes) {
        if (next[prio] >= queue.size()) continue;
        // Least normalised service first; ties go to the higher priority (the later key).
        if (pick == nullptr || virtual_time_[prio] <= virtual_time_[*pick]) pick = &prio;
      }
      if (pick == nullptr) break;
      const int32_t prio = *pick;
      const SequenceInfo& w = *classes[prio][next[prio]];
      const int64_t n = std::min(w.total_tokens - w.computed_tokens, tokens_left);
      // Room for part of the expected output too, so admitted sequences can grow without
      // preempting each other.
      const int64_t still_expected = std::max<int64_t>(0, w.prompt_tokens + w.expected_output - w.total_tokens);
      const auto lookahead = static_cast<int64_t>(admission_reserve_ * double(still_expected));
      const int64_t reserve = std::min(w.computed_tokens + n + lookahead, view.max_context);
      // Out of memory: everyone waits, so a small request cannot overtake its own class's head.
      if (!budget.reserve(w.id, reserve)) break;
      plan.work.push_back({w.id, n});
      tokens_left -= n;
      ++seqs;
      ++next[prio];
      const int64_t service = (w.total_tokens - w.computed_tokens) + still_expected;
      virtual_time_[prio] += double(std::max<int64_t>(service, 1)) / weight(prio);
    }
    backlogged_.clear();
    for (const auto& [prio, queue] : classes) {
      if (next[prio] < queue.size()) backlogged_.insert(prio);
    }
    return plan;
  }

 private:
  [[noreturn]] static void fail(const std::string& what) { throw Error("scheduler priority_fair: " + what); }

  double weight(int32_t priority) const {
    return std::pow(priority_weight_, std::clamp(priority, -64, 64));
  }

  // A class that had nothing waiting at the end of the last step joins at the smallest virtual time
  // of the classes that kept waiting (it gets no credit for the time it was idle, and keeps any
  // excess service it had); when no class kept waiting, a new busy period starts from zero.
  void start_new_busy_classes(const std::map<int32_t, std::vector<const SequenceInfo*>>& classes) {
    bool any_continuing = false;
    double floor = 0;
    for (const auto& [prio, queue] : classes) {
      if (!backlogged_.count(prio)) continue;
      floor = any_continuing ? std::min(floor, virtual_time_[prio]) : virtual_time_[prio];
      any_continuing = true;
    }
    if (!any_continuing) {
      virtual_time_.clear();
      return;
    }
    for (const auto& [prio, queue] : classes) {
      if (!backlogged_.count(prio)) virtual_time_[prio] = std::max(virtual_time_[prio], floor);
    }
  }

  static std::vector<const SequenceInfo*> by_arrival(std::span<const SequenceInfo> list) {
    std::vector<const SequenceInfo*> out;
    for (const auto& s : list) out.push_back(&s);
    std::stable_sort(out.begin(), out.end(),
                     [](const SequenceInfo* a, const SequenceInfo* b) { return a->arrival_time < b->arrival_time; });
    return out;
  }
  static std::vector<const SequenceInfo*> by_priority(std::span<const SequenceInfo> list) {
    std::vector<const SequenceInfo*> out = by_arrival(list);
    std::stable_sort(out.begin(), out.end(),
                     [](const SequenceInfo* a, const SequenceInfo* b) { return a->priority > b->priority; });
    return out;
  }

  int64_t max_batch_tokens_;
  int64_t max_seqs_;
  double priority_weight_;
  double admission_reserve_;
  std::map<int32_t, double> virtual_time_;  // per priority: service received / weight
  std::set<int32_t> backlogged_;            // classes that still had requests waiting after the last step
};

void register_plugins(Registrar& r) {
  r.add<Scheduler>(
      "priority_fair",
      "Weighted fair admission across priority levels (no starvation of low priority), chunked prefill, "
      "preemption of the lowest priority by recompute",
      {{"max_batch_tokens", ParamType::integer, 512, "tokens per step (decode tokens + prefill chunks)", {}},
       {"max_seqs", ParamType::integer, 32, "sequences running at once", {}},
       {"priority_weight", ParamType::number, 2.0,
        "share of priority p relative to priority p-1 under contention (weight = priority_weight^p); 1 = equal shares",
        {}},
       {"admission_reserve", ParamType::number, 0.5,
        "share of a new request's expected output whose KV must also fit before it is admitted", {}}},
      [](const Params& p) { return std::make_unique<PriorityFairScheduler>(p); });
}

}  // namespace priority_fair

TESSERA_PLUGIN("priority_fair", priority_fair::register_plugins)
