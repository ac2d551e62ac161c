// Batch invariance on the real model: whatever the scheduler, chunking, arrival pattern or thread
// that submits, every greedy output equals the request's output when run alone.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <thread>

#include "test_util.h"
#include "tessera/engine.h"

namespace tessera {
namespace {

// Mixed lengths: the golden prompts, some joined into longer ones (up to ~60 tokens).
std::vector<std::vector<int32_t>> mixed_prompts(const Tokenizer& tok) {
  std::vector<std::string> texts;
  for (const auto& item : test::read_json(test::kShared + "/golden/stories260K-f32.greedy96.json")) {
    texts.push_back(item.at("prompt"));
  }
  std::vector<std::vector<int32_t>> out;
  for (size_t i = 0; i < texts.size(); ++i) {
    out.push_back(tok.encode(texts[i], true));
    out.push_back(tok.encode(texts[i] + ". " + texts[(i + 1) % texts.size()] + ". " + texts[(i + 2) % texts.size()], true));
  }
  return out;
}

std::vector<int32_t> alone(Pipeline& p, const std::vector<int32_t>& prompt, int64_t n) {
  Engine engine(p);
  GenerationRequest req;
  req.prompt = prompt;
  req.max_tokens = n;
  engine.submit(req);
  engine.run_until_idle();
  return engine.take_finished().at(0).tokens;
}

class Batching : public ::testing::Test {
 protected:
  void SetUp() override {
    reference_pipeline_ = test::cpu_pipeline(test::kStoriesF32);
    prompts_ = mixed_prompts(reference_pipeline_->tokenizer());
    for (size_t i = 0; i < prompts_.size(); ++i) {
      lengths_.push_back(20 + int64_t(i) * 7);  // outputs of different lengths too
      expected_.push_back(alone(*reference_pipeline_, prompts_[i], lengths_[i]));
    }
  }

  // Submits prompt i at step arrival_step[i] and checks every output.
  // Returns the number of preemptions.
  int64_t check_staggered(Pipeline& p) {
    Engine engine(p);
    std::map<RequestId, size_t> which;
    size_t next = 0;
    for (int step = 0;; ++step) {
      // Two new requests every third step, so prefill chunks meet running decodes.
      if (step % 3 == 0) {
        for (int k = 0; k < 2 && next < prompts_.size(); ++k, ++next) {
          GenerationRequest req;
          req.prompt = prompts_[next];
          req.max_tokens = lengths_[next];
          which[engine.submit(req)] = next;
        }
      }
      if (!engine.step() && next == prompts_.size()) break;
    }
    auto results = engine.take_finished();
    EXPECT_EQ(results.size(), prompts_.size());
    for (const auto& r : results) {
      const size_t i = which.at(r.id);
      EXPECT_EQ(r.tokens, expected_[i]) << "prompt " << i << " (" << prompts_[i].size() << " tokens)";
      EXPECT_EQ(r.reason, FinishReason::length);
      EXPECT_EQ(r.token_times.size(), r.tokens.size());
      EXPECT_GE(r.queue_time(), 0.0);
      EXPECT_GT(r.ttft(), 0.0);
    }
    EXPECT_EQ(p.cache().stats().blocks_used, 0);
    return engine.stats().preemptions;
  }

  std::unique_ptr<Pipeline> reference_pipeline_;
  std::vector<std::vector<int32_t>> prompts_;
  std::vector<int64_t> lengths_;
  std::vector<std::vector<int32_t>> expected_;
};

TEST_F(Batching, ContinuousWithChunkedPrefillAndStaggeredArrivals) {
  // A 16-token step budget splits every long prompt into chunks that share steps with decodes.
  auto p = test::cpu_pipeline(test::kStoriesF32,
                              {{"scheduler", {{"plugin", "continuous"}, {"max_batch_tokens", 16}, {"max_seqs", 6}}}});
  check_staggered(*p);
}

TEST_F(Batching, ContinuousUnderMemoryPressurePreemptsWithoutChangingOutputs) {
  // 25 blocks of 8 tokens (the longest request needs 18) for ten requests: admission waits on memory,
  // and growing sequences preempt others.
  auto p = test::cpu_pipeline(test::kStoriesF32,
                              {{"cache", {{"plugin", "paged"}, {"block_size", 8}, {"memory", "256KiB"}}},
                               {"scheduler", {{"plugin", "continuous"}, {"max_batch_tokens", 32}}}});
  EXPECT_GT(check_staggered(*p), 0) << "the test is meant to force preemptions";
}

TEST_F(Batching, StaticBatchesRunToCompletion) {
  auto p = test::cpu_pipeline(test::kStoriesF32, {{"scheduler", {{"plugin", "static"}, {"batch_size", 4}, {"timeout", 0.0}}}});
  check_staggered(*p);
}

TEST_F(Batching, ThreadSafeSubmitWhileAnotherThreadSteps) {
  auto p = test::cpu_pipeline(test::kStoriesF32, {{"scheduler", {{"plugin", "continuous"}, {"max_batch_tokens", 24}}}});
  Engine engine(*p);
  std::atomic<bool> done{false};
  std::thread stepper([&] {
    while (!done.load()) {
      if (!engine.step()) std::this_thread::yield();
    }
    engine.run_until_idle();
  });
  std::map<RequestId, size_t> which;
  std::mutex which_mutex;
  std::vector<std::thread> clients;
  for (int c = 0; c < 3; ++c) {
    clients.emplace_back([&, c] {
      for (size_t i = size_t(c); i < prompts_.size(); i += 3) {
        GenerationRequest req;
        req.prompt = prompts_[i];
        req.max_tokens = lengths_[i];
        const RequestId id = engine.submit(req);
        std::lock_guard lock(which_mutex);
        which[id] = i;
      }
    });
  }
  for (auto& t : clients) t.join();
  done = true;
  stepper.join();
  auto results = engine.take_finished();
  ASSERT_EQ(results.size(), prompts_.size());
  for (const auto& r : results) EXPECT_EQ(r.tokens, expected_[which.at(r.id)]);
  const EngineStats stats = engine.stats();
  EXPECT_EQ(stats.waiting + stats.running, 0);
  int64_t generated = 0;
  for (auto n : lengths_) generated += n;
  EXPECT_EQ(stats.decode_tokens, generated);
}

}  // namespace
}  // namespace tessera
