// Scheduler: each step, choose which sequences run and how many tokens each processes (a prefill
// chunk or one decode token), under token, sequence and memory budgets; preempt when memory runs
// out. It sees plain data and a KV budget, never the engine or the cache themselves.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tessera/cache.h"

namespace tessera {

struct SequenceInfo {
  SeqId id = 0;
  int64_t prompt_tokens = 0;
  int64_t total_tokens = 0;     // prompt + generated so far
  int64_t computed_tokens = 0;  // tokens whose KV is in the cache
  int64_t max_new_tokens = 0;
  int64_t expected_output = 0;  // hint for length-aware queues (defaults to max_new_tokens)
  int32_t priority = 0;         // higher runs first
  double arrival_time = 0;      // seconds, engine clock
};

struct SchedulerView {
  std::span<const SequenceInfo> waiting;  // arrival order (preempted sequences go back here)
  std::span<const SequenceInfo> running;  // admission order
  int64_t max_context = 0;
  double now = 0;  // seconds, engine clock (same as arrival_time)
  // Nothing more will be submitted while these run (Engine::run_until_idle, as `tessera run` and
  // `eval` drive it): a scheduler waiting for more requests to fill a batch would wait for nothing.
  bool arrivals_closed = false;
};

// Reservations made during one schedule() call; the engine commits them after it returns.
class KvBudget {
 public:
  virtual ~KvBudget() = default;
  // Grows the reservation of `seq` to `total_tokens`; false (and nothing reserved) if it won't fit.
  virtual bool reserve(SeqId seq, int64_t total_tokens) = 0;
  // Gives back what `seq` holds, as preemption will; later reserve() calls may use it.
  virtual void release(SeqId seq) = 0;
};

struct ScheduledWork {
  SeqId id = 0;
  int64_t n_tokens = 0;  // tokens to compute this step, starting at computed_tokens
};

struct StepPlan {
  std::vector<ScheduledWork> work;
  std::vector<SeqId> preempted;  // running sequences to stop and recompute later
  // With no work: > 0 means "deliberately waiting (e.g. for a batch to fill), ask again in this many
  // seconds"; 0 means nothing could be admitted, which with nothing running is an error.
  double retry_after = 0;
};

class Scheduler {
 public:
  virtual ~Scheduler() = default;
  virtual StepPlan schedule(const SchedulerView& view, KvBudget& budget) = 0;
};

}  // namespace tessera
