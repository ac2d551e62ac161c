// scheduler: continuous — iteration-level batching. Every step, running sequences continue (a decode
// token, or the next chunk of a long prompt) and waiting ones are admitted, under a token budget
// (chunked prefill) and a sequence cap. Queues split by expected output length give long requests
// their own cap on running sequences, so short requests are not stuck behind them. Higher priority
// goes first; when KV blocks run out the victim is the lowest-priority, newest sequence, preempted
// for recompute.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "tessera/error.h"
#include "tessera/plugin.h"

namespace tessera {
namespace {

struct Queue {
  std::string name;
  int64_t min_expected_output = 0;  // sequences expecting at least this many tokens belong here
  int64_t max_running = 0;          // 0 = no cap of its own
};

// A value for a message; bytes that are not UTF-8 are replaced (the plain dump would throw on them).
std::string show(const nlohmann::json& v) { return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

std::vector<Queue> parse_queues(const nlohmann::json& j) {
  if (!j.is_array()) throw Error("scheduler continuous: 'queues' must be a list of {name, min_expected_output, max_running}");
  std::vector<Queue> out;
  for (const auto& q : j) {
    if (!q.is_object()) throw Error("scheduler continuous: each queue must be a map, got " + show(q));
    Queue queue;
    for (const auto& [key, value] : q.items()) {
      if (key == "name" && value.is_string()) {
        queue.name = value.get<std::string>();
      } else if (key == "min_expected_output" && value.is_number_integer() && value.get<int64_t>() >= 0) {
        queue.min_expected_output = value.get<int64_t>();
      } else if (key == "max_running" && value.is_number_integer() && value.get<int64_t>() >= 0) {
        queue.max_running = value.get<int64_t>();
      } else {
        throw Error("scheduler continuous: queue key '" + key + "' = " + show(value) +
                    " is not valid (expected name: text, min_expected_output: integer >= 0, max_running: integer >= 0)");
      }
    }
    if (queue.name.empty()) throw Error("scheduler continuous: every queue needs a 'name', got " + show(q));
    // A second queue of the same name or threshold would never receive a request.
    for (const Queue& other : out) {
      if (other.name == queue.name) throw Error("scheduler continuous: two queues are named '" + queue.name + "'");
      if (other.min_expected_output == queue.min_expected_output) {
        throw Error("scheduler continuous: queues '" + other.name + "' and '" + queue.name +
                    "' have the same min_expected_output " + std::to_string(queue.min_expected_output) +
                    " (a request joins the one queue whose threshold it reaches highest)");
      }
    }
    out.push_back(queue);
  }
  // The queue with the highest threshold that a sequence reaches is its queue.
  std::sort(out.begin(), out.end(), [](const Queue& a, const Queue& b) { return a.min_expected_output > b.min_expected_output; });
  return out;
}

class ContinuousScheduler final : public Scheduler {
 public:
  explicit ContinuousScheduler(const Params& p)
      : max_batch_tokens_(p.get_int("max_batch_tokens")),
        max_seqs_(p.get_int("max_seqs")),
        admission_reserve_(p.get_float("admission_reserve")),
        queues_(parse_queues(p.get("queues"))) {
    if (!(admission_reserve_ >= 0 && admission_reserve_ <= 1)) {
      throw Error("scheduler continuous: admission_reserve must be in [0, 1], got " + std::to_string(admission_reserve_));
    }
    if (max_batch_tokens_ < 1) throw Error("scheduler continuous: max_batch_tokens must be >= 1, got " + std::to_string(max_batch_tokens_));
    if (max_seqs_ < 1) throw Error("scheduler continuous: max_seqs must be >= 1, got " + std::to_string(max_seqs_));
  }

  StepPlan schedule(const SchedulerView& view, KvBudget& budget) override {
    StepPlan plan;
    int64_t tokens_left = max_batch_tokens_;
    std::vector<const SequenceInfo*> running = ordered(view.running);
    for (size_t i = 0; i < running.size(); ++i) {
      const SequenceInfo& s = *running[i];
      const int64_t n = std::min(s.total_tokens - s.computed_tokens, tokens_left);
      if (n <= 0) continue;  // out of budget this step: it keeps its blocks and waits
      bool self_preempted = false;
      while (!budget.reserve(s.id, s.computed_tokens + n)) {
        const SequenceInfo* victim = running.back();  // lowest priority, newest
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

    std::vector<int64_t> queue_running(queues_.size(), 0);
    for (const SequenceInfo* s : running) {
      if (const int q = queue_of(*s); q >= 0) ++queue_running[size_t(q)];
    }
    auto seqs = static_cast<int64_t>(running.size());
    for (const SequenceInfo* w : ordered(view.waiting)) {
      if (seqs >= max_seqs_ || tokens_left <= 0) break;
      const int q = queue_of(*w);
      if (q >= 0 && queues_[size_t(q)].max_running > 0 && queue_running[size_t(q)] >= queues_[size_t(q)].max_running) {
        continue;  // its queue is full; shorter requests behind it may still go
      }
      const int64_t n = std::min(w->total_tokens - w->computed_tokens, tokens_left);
      // Room for part of the expected output too, so that admitted sequences can grow without
      // preempting each other (recomputation costs more than waiting).
      const int64_t still_expected = std::max<int64_t>(0, w->prompt_tokens + w->expected_output - w->total_tokens);
      const auto lookahead = static_cast<int64_t>(admission_reserve_ * double(still_expected));
      const int64_t reserve = std::min(w->computed_tokens + n + lookahead, view.max_context);
      if (!budget.reserve(w->id, reserve)) break;  // memory: the rest wait in order
      plan.work.push_back({w->id, n});
      tokens_left -= n;
      ++seqs;
      if (q >= 0) ++queue_running[size_t(q)];
    }
    return plan;
  }

 private:
  // Higher priority first, then earlier arrival (a stable order keeps admission FIFO).
  static std::vector<const SequenceInfo*> ordered(std::span<const SequenceInfo> list) {
    std::vector<const SequenceInfo*> out;
    for (const auto& s : list) out.push_back(&s);
    std::stable_sort(out.begin(), out.end(), [](const SequenceInfo* a, const SequenceInfo* b) {
      if (a->priority != b->priority) return a->priority > b->priority;
      return a->arrival_time < b->arrival_time;
    });
    return out;
  }

  int queue_of(const SequenceInfo& s) const {
    for (size_t q = 0; q < queues_.size(); ++q) {
      if (s.expected_output >= queues_[q].min_expected_output) return static_cast<int>(q);
    }
    return -1;  // the default queue: no cap beyond max_seqs
  }

  int64_t max_batch_tokens_;
  int64_t max_seqs_;
  double admission_reserve_;
  std::vector<Queue> queues_;
};

void register_continuous(Registrar& r) {
  r.add<Scheduler>(
      "continuous",
      "Iteration-level batching with chunked prefill, length-aware queues, priorities and preemption by recompute",
      {{"max_batch_tokens", ParamType::integer, 512, "tokens per step (decode tokens + prefill chunks)", {}},
       {"max_seqs", ParamType::integer, 32, "sequences running at once", {}},
       {"admission_reserve", ParamType::number, 0.5,
        "share of a new request's expected output whose KV must also fit before it is admitted "
        "(0 = admit on the prompt alone, most concurrency; 1 = never preempt for growth)",
        {}},
       {"queues", ParamType::object, nlohmann::json::array(),
        "length-aware queues: [{name, min_expected_output, max_running}]; a request joins the queue with the highest "
        "min_expected_output it reaches (expected output = its hint or max_tokens); others share the default queue",
        {}}},
      [](const Params& p) { return std::make_unique<ContinuousScheduler>(p); });
}

}  // namespace
}  // namespace tessera

TESSERA_PLUGIN("scheduler_continuous", tessera::register_continuous)
