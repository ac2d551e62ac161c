// The engine's per-request state and its per-step view of the cache, shared by engine.cpp and
// engine_speculation.cpp.
#pragma once

#include <algorithm>
#include <map>
#include <optional>
#include <vector>

#include "tessera/engine.h"
#include "tessera/text_stream.h"

namespace tessera {

struct Engine::Sequence {
  GenerationRequest request;
  GenerationResult result;
  std::vector<int32_t> tokens;  // prompt followed by generated tokens
  int64_t computed = 0;         // tokens whose KV is in the cache
  int64_t max_total = 0;        // prompt + max_tokens, capped by the context
  uint64_t rng = 0;
  SamplingParams sampling;
  TextStream text;  // detokenized output, stop strings
  std::unique_ptr<ConstraintState> constraint;  // where the output is in the request's constraint
  // Speculation this step: the drafts, and the tokens the target scores ([last, drafts...]).
  std::vector<int32_t> draft;
  std::vector<int32_t> verify_tokens;
  bool done = false;

  SequenceInfo info() const {
    SequenceInfo i;
    i.id = result.id;
    i.prompt_tokens = static_cast<int64_t>(request.prompt.size());
    i.total_tokens = static_cast<int64_t>(tokens.size());
    i.computed_tokens = computed;
    i.max_new_tokens = request.max_tokens;
    i.expected_output = request.expected_output > 0 ? request.expected_output : request.max_tokens;
    i.priority = request.priority;
    i.arrival_time = result.submitted;
    return i;
  }
};

// The scheduler's view of the cache for one step: reservations accumulate into one plan, which the
// engine commits when the scheduler is done.
class Engine::Budget final : public KvBudget {
 public:
  Budget(Cache& cache, Engine& engine) : cache_(cache), engine_(engine) {}

  // A decoding sequence that may speculate gets room for its drafts too when that fits; otherwise
  // it runs without speculation this step.
  bool reserve(SeqId seq, int64_t total_tokens) override {
    Sequence* s = engine_.find(seq);
    if (s == nullptr) return false;
    lookahead_.erase(seq);
    requested_[seq] = total_tokens;
    const int64_t extra = total_tokens == int64_t(s->tokens.size()) ? engine_.lookahead(*s) : 0;
    if (extra > 0 && try_reserve(*s, total_tokens + extra)) {
      lookahead_[seq] = extra;
      return true;
    }
    if (try_reserve(*s, total_tokens)) return true;
    if (!refused_) refused_ = seq;
    return false;
  }

  void release(SeqId seq) override {
    released_.push_back(seq);
    std::erase_if(requests_, [&](const CacheRequest& r) { return r.seq == seq; });
    lookahead_.erase(seq);
    requested_.erase(seq);
    cache_.release(seq);
    plan_.reset();
    if (!requests_.empty()) plan_ = cache_.plan(requests_);
  }

  // Tokens the scheduler itself reserved for `seq` (look-ahead for drafts excluded).
  int64_t requested(SeqId seq) const {
    auto it = requested_.find(seq);
    return it == requested_.end() ? 0 : it->second;
  }

  // Drafts `seq` has cache room for this step (0 = none).
  int64_t lookahead(SeqId seq) const {
    auto it = lookahead_.find(seq);
    return it == lookahead_.end() ? 0 : it->second;
  }

  const std::optional<CachePlan>& plan() const { return plan_; }

  // The first sequence whose reservation did not fit this step, if any: where nothing runs and
  // nothing was admitted, the one even an empty cache cannot hold (the scheduler's order, which
  // may not be the queue's: priorities, preempted sequences put back).
  std::optional<SeqId> first_refused() const { return refused_; }
  // Sequences whose cache the scheduler released this step (preemption, or a contract breach).
  const std::vector<SeqId>& released() const { return released_; }

 private:
  bool try_reserve(const Sequence& s, int64_t total_tokens) {
    const SeqId seq = s.result.id;
    std::vector<CacheRequest> trial = requests_;
    auto it = std::find_if(trial.begin(), trial.end(), [&](const CacheRequest& r) { return r.seq == seq; });
    CacheRequest req{seq, total_tokens, s.tokens, s.request.user, s.request.retain};
    if (it != trial.end()) {
      *it = req;
    } else {
      trial.push_back(req);
    }
    auto plan = cache_.plan(trial);
    if (!plan) return false;
    requests_ = std::move(trial);
    plan_ = std::move(plan);
    return true;
  }

  Cache& cache_;
  Engine& engine_;
  std::vector<CacheRequest> requests_;
  std::optional<CachePlan> plan_;
  std::map<SeqId, int64_t> lookahead_;
  std::map<SeqId, int64_t> requested_;
  std::optional<SeqId> refused_;
  std::vector<SeqId> released_;
};

}  // namespace tessera
