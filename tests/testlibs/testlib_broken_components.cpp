// Components that break their interface's contract, for the engine's checks (engine_test.cpp):
//   decoder "two_tokens": returns the greedy token twice for a plain step (one is expected)
//   decoder "outside_vocabulary": returns an id past the vocabulary
//   scheduler "drops_kv": runs one sequence at a time, and once it decodes releases its cache
//                         without listing it as preempted
#include <algorithm>
#include <memory>

#include "tessera/plugin.h"

namespace {

class BrokenDecoder final : public tessera::Decoder {
 public:
  explicit BrokenDecoder(bool twice) : twice_(twice) {}
  tessera::SamplingParams default_params() const override { return {}; }
  void select(std::span<tessera::DecodeItem> items) override {
    for (tessera::DecodeItem& item : items) {
      const auto best = int32_t(std::max_element(item.logits, item.logits + item.vocab) - item.logits);
      item.tokens = twice_ ? std::vector<int32_t>{best, best} : std::vector<int32_t>{int32_t(item.vocab)};
    }
  }

 private:
  bool twice_;
};

class DropsKvScheduler final : public tessera::Scheduler {
 public:
  tessera::StepPlan schedule(const tessera::SchedulerView& view, tessera::KvBudget& budget) override {
    tessera::StepPlan plan;
    const tessera::SequenceInfo* s = !view.running.empty() ? &view.running[0]
                                     : !view.waiting.empty() ? &view.waiting[0]
                                                             : nullptr;
    if (s == nullptr || !budget.reserve(s->id, s->total_tokens)) return plan;
    if (s->computed_tokens > s->prompt_tokens) budget.release(s->id);  // the breach
    plan.work.push_back({s->id, s->total_tokens - s->computed_tokens});
    return plan;
  }
};

void register_broken(tessera::Registrar& r) {
  r.add<tessera::Decoder>("two_tokens", "test: two tokens a plain step", {},
                          [](const tessera::Params&) { return std::make_unique<BrokenDecoder>(true); });
  r.add<tessera::Decoder>("outside_vocabulary", "test: a token id past the vocabulary", {},
                          [](const tessera::Params&) { return std::make_unique<BrokenDecoder>(false); });
  r.add<tessera::Scheduler>("drops_kv", "test: releases a running sequence's cache", {},
                            [](const tessera::Params&) { return std::make_unique<DropsKvScheduler>(); });
}

}  // namespace

TESSERA_PLUGIN("testlib_broken", register_broken)
