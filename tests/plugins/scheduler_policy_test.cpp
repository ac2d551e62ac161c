// Scheduler policies on plain data, no model: admission order, queue caps, chunking, victim choice.
#include <gtest/gtest.h>

#include <map>

#include "test_util.h"

namespace tessera {
namespace {

// KV capacity in tokens, rounded up to blocks per sequence, as a paged cache would count it.
class TokenBudget final : public KvBudget {
 public:
  TokenBudget(int64_t blocks, int64_t block_size) : blocks_(blocks), block_size_(block_size) {}
  bool reserve(SeqId seq, int64_t total) override {
    const int64_t need = (total + block_size_ - 1) / block_size_;
    const int64_t have = held_.count(seq) ? held_[seq] : 0;
    if (need > have && used() + need - have > blocks_) return false;
    held_[seq] = std::max(need, have);
    return true;
  }
  void release(SeqId seq) override { held_.erase(seq); }
  int64_t used() const {
    int64_t n = 0;
    for (const auto& [id, b] : held_) n += b;
    return n;
  }
  std::map<SeqId, int64_t> held_;

 private:
  int64_t blocks_, block_size_;
};

SequenceInfo seq(SeqId id, int64_t prompt, int64_t computed = 0, int32_t priority = 0, double arrival = 0,
                 int64_t expected = 16) {
  SequenceInfo s;
  s.id = id;
  s.prompt_tokens = prompt;
  s.total_tokens = prompt;
  s.computed_tokens = computed;
  s.max_new_tokens = expected;
  s.expected_output = expected;
  s.priority = priority;
  s.arrival_time = arrival == 0 ? double(id) : arrival;
  return s;
}

std::shared_ptr<Scheduler> make(const std::string& name, const nlohmann::json& params) {
  return test::plugins().create<Scheduler>(name, params, "test");
}

std::vector<SeqId> ids(const std::vector<ScheduledWork>& work) {
  std::vector<SeqId> out;
  for (const auto& w : work) out.push_back(w.id);
  return out;
}

TEST(ContinuousPolicy, AdmitsByPriorityThenArrival) {
  auto s = make("continuous", nlohmann::json::object());
  std::vector<SequenceInfo> waiting = {seq(1, 8), seq(2, 8, 0, 5), seq(3, 8), seq(4, 8, 0, 5)};
  TokenBudget budget(100, 16);
  const StepPlan p = s->schedule({waiting, {}, 512, 10}, budget);
  EXPECT_EQ(ids(p.work), (std::vector<SeqId>{2, 4, 1, 3}));
}

TEST(ContinuousPolicy, ChunksLongPromptsUnderTheTokenBudgetAfterDecodes) {
  auto s = make("continuous", {{"max_batch_tokens", 100}});
  // Two sequences decoding (one token each) and a 1000-token prompt waiting.
  std::vector<SequenceInfo> running = {seq(1, 20, 20), seq(2, 30, 30)};
  running[0].total_tokens = 21;
  running[1].total_tokens = 31;
  std::vector<SequenceInfo> waiting = {seq(3, 1000)};
  TokenBudget budget(1000, 16);
  StepPlan p = s->schedule({waiting, running, 2048, 10}, budget);
  ASSERT_EQ(p.work.size(), 3u);
  EXPECT_EQ(p.work[0].n_tokens, 1);
  EXPECT_EQ(p.work[1].n_tokens, 1);
  EXPECT_EQ(p.work[2].id, 3u);
  EXPECT_EQ(p.work[2].n_tokens, 98) << "the prompt gets what the decodes leave of the step";
  EXPECT_EQ(budget.held_[3], (98 + 15) / 16) << "only the chunk's KV is reserved";
  // Next step the partly computed prompt continues as a running sequence.
  std::vector<SequenceInfo> running2 = {seq(3, 1000, 98)};
  p = s->schedule({{}, running2, 2048, 11}, budget);
  ASSERT_EQ(p.work.size(), 1u);
  EXPECT_EQ(p.work[0].n_tokens, 100);
}

TEST(ContinuousPolicy, LongQueueCapLetsShortRequestsPass) {
  auto s = make("continuous", {{"queues", {{{"name", "long"}, {"min_expected_output", 200}, {"max_running", 1}}}}});
  std::vector<SequenceInfo> running = {seq(1, 10, 10, 0, 1, 512)};  // a long one already runs
  running[0].total_tokens = 11;
  std::vector<SequenceInfo> waiting = {seq(2, 10, 0, 0, 2, 512), seq(3, 10, 0, 0, 3, 16), seq(4, 10, 0, 0, 4, 300),
                                       seq(5, 10, 0, 0, 5, 8)};
  TokenBudget budget(100, 16);
  const StepPlan p = s->schedule({waiting, running, 512, 10}, budget);
  EXPECT_EQ(ids(p.work), (std::vector<SeqId>{1, 3, 5})) << "long requests 2 and 4 wait; short 3 and 5 go";
}

TEST(ContinuousPolicy, MaxSeqsCapsTheBatch) {
  auto s = make("continuous", {{"max_seqs", 2}});
  std::vector<SequenceInfo> waiting = {seq(1, 4), seq(2, 4), seq(3, 4)};
  TokenBudget budget(100, 16);
  EXPECT_EQ(s->schedule({waiting, {}, 512, 10}, budget).work.size(), 2u);
}

TEST(ContinuousPolicy, PreemptsTheLowestPriorityThenNewest) {
  auto s = make("continuous", nlohmann::json::object());
  // Four running sequences, each holding one full block of 16 and needing a second; 5 blocks in all.
  std::vector<SequenceInfo> running = {seq(1, 16, 16, 1, 1), seq(2, 16, 16, 0, 2), seq(3, 16, 16, 1, 3),
                                       seq(4, 16, 16, 0, 4)};
  TokenBudget budget(5, 16);
  for (auto& r : running) {
    r.total_tokens = 17;
    budget.reserve(r.id, 16);
  }
  const std::vector<SequenceInfo> waiting = {seq(9, 4)};
  const StepPlan p = s->schedule({waiting, running, 512, 10}, budget);
  // Priority-0 sequences go first, newest (4) before older (2); then 1 and 3 have room to grow.
  EXPECT_EQ(p.preempted, (std::vector<SeqId>{4, 2}));
  EXPECT_EQ(ids(p.work), (std::vector<SeqId>{1, 3}));
  EXPECT_EQ(budget.held_.count(4), 0u);
  EXPECT_EQ(budget.held_.count(9), 0u) << "nothing new is admitted while memory is short";
}

TEST(ContinuousPolicy, RejectsMalformedQueues) {
  EXPECT_THROW(make("continuous", {{"queues", {{{"min_expected_output", 200}}}}}), Error);
  EXPECT_THROW(make("continuous", {{"queues", {{{"name", "long"}, {"max_running", -1}}}}}), Error);
  EXPECT_THROW(make("continuous", {{"max_batch_tokens", 0}}), Error);
  // A second queue of the same name or threshold could never receive a request.
  auto message = [](const nlohmann::json& queues) {
    try {
      make("continuous", {{"queues", queues}});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({{{"name", "long"}, {"min_expected_output", 200}}, {{"name", "long"}, {"min_expected_output", 50}}})
                .find("two queues are named 'long'"),
            std::string::npos);
  EXPECT_NE(message({{{"name", "a"}, {"min_expected_output", 200}}, {{"name", "b"}, {"min_expected_output", 200}}})
                .find("queues 'a' and 'b' have the same min_expected_output 200"),
            std::string::npos);
  // A refused value that is not UTF-8 (a pipeline file may hold any bytes) is named, not a JSON
  // library error from writing the message.
  EXPECT_NE(message({{{"name", "long"}, {"max_running", "x\xF8"}}}).find("queue key 'max_running' = \"x"), std::string::npos);
}

TEST(StaticPolicy, WaitsForABatchOrTheTimeout) {
  auto s = make("static", {{"batch_size", 3}, {"timeout", 0.5}});
  std::vector<SequenceInfo> waiting = {seq(1, 4, 0, 0, 10.0), seq(2, 4, 0, 0, 10.1)};
  TokenBudget budget(100, 16);
  StepPlan p = s->schedule({waiting, {}, 512, 10.2}, budget);
  EXPECT_TRUE(p.work.empty());
  EXPECT_NEAR(p.retry_after, 0.3, 1e-9);
  p = s->schedule({waiting, {}, 512, 10.6}, budget);
  EXPECT_EQ(ids(p.work), (std::vector<SeqId>{1, 2})) << "the timeout passed: a smaller batch starts";
  waiting.push_back(seq(3, 4, 0, 0, 10.15));
  TokenBudget fresh(100, 16);
  p = s->schedule({waiting, {}, 512, 10.2}, fresh);
  EXPECT_EQ(ids(p.work), (std::vector<SeqId>{1, 2, 3})) << "a full batch starts at once";
  TokenBudget closed(100, 16);
  p = s->schedule({std::span(waiting).first(2), {}, 512, 10.2, true}, closed);
  EXPECT_EQ(ids(p.work), (std::vector<SeqId>{1, 2})) << "nothing more can arrive: no wait for a full batch";
}

TEST(StaticPolicy, AdmitsNothingWhileABatchRuns) {
  auto s = make("static", {{"batch_size", 2}, {"timeout", 0.0}});
  std::vector<SequenceInfo> running = {seq(1, 4, 4)};
  running[0].total_tokens = 5;
  TokenBudget budget(100, 16);
  const std::vector<SequenceInfo> waiting = {seq(2, 4)};
  const StepPlan p = s->schedule({waiting, running, 512, 10}, budget);
  EXPECT_EQ(ids(p.work), (std::vector<SeqId>{1}));
}

}  // namespace
}  // namespace tessera
