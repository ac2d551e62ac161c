// Engine behaviour a caller relies on: clear refusals, streaming order, cancellation returning
// KV, seeded sampling independent of the batch, stop tokens.
#include <gtest/gtest.h>

#include "test_util.h"
#include "tessera/engine.h"
#include "tessera/pipeline.h"
#include "tessera/registry.h"

namespace tessera {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Engine, RefusesPromptsThatDoNotFitTheContext) {
  auto p = test::cpu_pipeline(test::kStoriesF32);
  Engine engine(*p);
  GenerationRequest req;
  req.prompt.assign(512, 300);
  const std::string msg = error_of([&] { engine.submit(req); });
  EXPECT_NE(msg.find("512 tokens"), std::string::npos) << msg;
  EXPECT_NE(msg.find("context"), std::string::npos) << msg;
  req.prompt.clear();
  EXPECT_NE(error_of([&] { engine.submit(req); }).find("empty"), std::string::npos);
  req.prompt = {1, 9999};
  EXPECT_NE(error_of([&] { engine.submit(req); }).find("9999"), std::string::npos);
}

TEST(Engine, RefusesInvalidSamplingValuesNamingTheField) {
  auto p = test::cpu_pipeline(test::kStoriesF32);
  Engine engine(*p);
  GenerationRequest req;
  req.prompt = {1};
  req.sampling = SamplingParams{};
  req.sampling->temperature = -1;
  EXPECT_NE(error_of([&] { engine.submit(req); }).find("temperature"), std::string::npos);
  req.sampling->temperature = 1;
  req.sampling->top_p = 1.5;
  EXPECT_NE(error_of([&] { engine.submit(req); }).find("top_p"), std::string::npos);
}

TEST(Engine, StreamsEveryTokenInOrderAndStopsAtLength) {
  auto p = test::cpu_pipeline(test::kStoriesF32);
  Engine engine(*p);
  GenerationRequest req;
  req.prompt = p->tokenizer().encode("Lily and Ben", true);
  req.max_tokens = 20;
  std::vector<int32_t> streamed;
  req.on_token = [&](RequestId, int32_t t) { streamed.push_back(t); };
  engine.submit(req);
  engine.run_until_idle();
  auto r = engine.take_finished();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].tokens.size(), 20u);
  EXPECT_EQ(r[0].tokens, streamed);
  EXPECT_EQ(r[0].reason, FinishReason::length);
  EXPECT_LE(r[0].submitted, r[0].first_token);
  EXPECT_LE(r[0].first_token, r[0].finished);
}

TEST(Engine, StopTokenEndsGeneration) {
  auto p = test::cpu_pipeline(test::kStoriesF32);
  Engine engine(*p);
  GenerationRequest req;
  req.prompt = {1, 403, 407, 261, 378};
  req.max_tokens = 96;
  req.stop_tokens = {261};  // " a": the golden continuation reaches it at its 4th token
  engine.submit(req);
  engine.run_until_idle();
  auto r = engine.take_finished();
  EXPECT_EQ(r[0].tokens, (std::vector<int32_t>{432, 383, 286, 261}));
  EXPECT_EQ(r[0].reason, FinishReason::stop);
}

TEST(Engine, CancelReturnsTheCacheAndReportsCancelled) {
  auto p = test::cpu_pipeline(test::kStoriesF32);
  Engine engine(*p);
  GenerationRequest req;
  req.prompt = {1, 403};
  req.max_tokens = 200;
  const RequestId a = engine.submit(req);
  const RequestId b = engine.submit(req);
  for (int i = 0; i < 5; ++i) engine.step();
  EXPECT_EQ(p->cache().stats().sequences, 2);
  engine.cancel(a);
  engine.step();
  EXPECT_EQ(p->cache().stats().sequences, 1);
  engine.cancel(b);
  engine.run_until_idle();
  auto r = engine.take_finished();
  ASSERT_EQ(r.size(), 2u);
  for (const auto& x : r) EXPECT_EQ(x.reason, FinishReason::cancelled);
  EXPECT_EQ(p->cache().stats().blocks_used, 0);
}

TEST(Engine, SameSeedSameOutputWhateverTheBatch) {
  auto p = test::cpu_pipeline(test::kStoriesF32);
  SamplingParams s;
  s.temperature = 1.0;
  s.top_p = 0.95;
  s.seed = 42;
  auto run = [&](int companions) {
    GenerationRequest req;
    req.prompt = p->tokenizer().encode("Tom and his dog went to the park", true);
    req.max_tokens = 40;
    req.sampling = s;
    return test::run_beside(*p, req, test::reseeded(req, companions, 1000)).tokens;
  };
  const auto alone = run(0);
  EXPECT_EQ(alone.size(), 40u);
  EXPECT_EQ(alone, run(3));
  s.seed = 43;
  EXPECT_NE(alone, run(0)) << "a different seed should change a 40-token sample";
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

TEST(Engine, ARequestTheCacheCanNeverHoldFailsAloneWithAReason) {
  // One block of 16 tokens in all (stories260K: 1280 bytes a token).
  auto p = test::cpu_pipeline(test::kStoriesF32, {{"cache", {{"plugin", "paged"}, {"block_size", 16}, {"memory", 16 * 1280}}}});
  ASSERT_EQ(p->cache().stats().blocks_total, 1);
  Engine engine(*p);
  GenerationRequest big;
  big.prompt.assign(20, 300);
  big.prompt[0] = 1;
  big.max_tokens = 4;
  const RequestId bad = engine.submit(big);
  GenerationRequest small;
  small.prompt = {1, 403, 407, 261, 378};
  small.max_tokens = 8;
  const RequestId good = engine.submit(small);
  engine.run_until_idle();
  for (const auto& r : engine.take_finished()) {
    if (r.id == bad) {
      EXPECT_EQ(r.reason, FinishReason::error);
      EXPECT_NE(r.error.find("cannot hold this request (20 prompt tokens, up to 24 with the tokens to generate) in "),
                std::string::npos)
          << r.error;
      // The prompt alone is more than the pool holds: a smaller reserve cannot help.
      EXPECT_NE(r.error.find("1 block of 16 tokens; give the cache more memory, or send a shorter prompt"),
                std::string::npos)
          << r.error;
    } else {
      EXPECT_EQ(r.id, good);
      EXPECT_EQ(r.tokens, (std::vector<int32_t>{432, 383, 286, 261, 376, 298, 315, 421}));
      EXPECT_EQ(r.reason, FinishReason::length);
    }
  }
}

// The request that fails is the one the scheduler could not place, not the queue's oldest: here a
// later one of higher priority that no empty cache could hold (6 blocks of 16 tokens) goes first.
TEST(Engine, TheRequestThatCannotFitFailsNotTheOneAheadOfItInTheQueue) {
  auto p = test::cpu_pipeline(test::kStoriesF32,
                              {{"cache", {{"plugin", "paged"}, {"block_size", 16}, {"memory", 6 * 16 * 1280}}},
                               {"scheduler", {{"plugin", "continuous"}, {"admission_reserve", 0}}}});
  Engine engine(*p);
  GenerationRequest small;
  small.prompt = {1, 403, 407, 261, 378};
  small.max_tokens = 20;
  small.ignore_eos = true;
  const RequestId first = engine.submit(small);
  small.prompt.push_back(292);
  const RequestId second = engine.submit(small);
  GenerationRequest big = small;
  big.prompt.assign(120, 300);
  big.prompt[0] = 1;
  big.priority = 5;
  const RequestId bad = engine.submit(big);
  engine.run_until_idle();
  const auto results = engine.take_finished();
  ASSERT_EQ(results.size(), 3u);
  for (const auto& r : results) {
    if (r.id == bad) {
      EXPECT_EQ(r.reason, FinishReason::error);
      EXPECT_NE(r.error.find("(120 prompt tokens, up to 140 with"), std::string::npos) << r.error;
    } else {
      EXPECT_TRUE(r.id == first || r.id == second);
      EXPECT_EQ(r.reason, FinishReason::length) << r.error;
      EXPECT_EQ(r.tokens.size(), 20u);
    }
  }
}

// A component that breaks its interface's contract is named, and its output not used: a decoder
// returning two tokens for a plain step or an id past the vocabulary fails the request; a scheduler
// releasing a running request's cache without preempting it stops the engine.
TEST(Engine, ADecoderOrSchedulerThatBreaksItsContractIsNamed) {
  Registry r;
  r.load_directory(TESSERA_PLUGIN_DIR);
  r.load_library(std::string(TESSERA_TEST_LIB_DIR) + "/libtestlib_broken_components.so");
  auto run = [&](const nlohmann::json& components) {
    auto p = Pipeline::build(test::cpu_spec(test::kStoriesF32, components), r);
    Engine engine(*p);
    GenerationRequest req;
    req.prompt = {1, 403, 407, 261, 378};
    req.max_tokens = 8;
    engine.submit(req);
    engine.run_until_idle();
    return engine.take_finished().at(0);
  };
  const GenerationResult two = run({{"decoder", {{"plugin", "two_tokens"}}}});
  EXPECT_EQ(two.reason, FinishReason::error);
  EXPECT_EQ(two.error, "decoder 'two_tokens' returned 2 tokens for a step with 0 drafts (1 to 1 expected)");
  EXPECT_TRUE(two.tokens.empty());
  const GenerationResult outside = run({{"decoder", {{"plugin", "outside_vocabulary"}}}});
  EXPECT_EQ(outside.error, "decoder 'outside_vocabulary' returned token id 512, outside the vocabulary (0..511)");
  EXPECT_TRUE(outside.model_fault);
  const std::string dropped = error_of([&] { run({{"scheduler", {{"plugin", "drops_kv"}}}}); });
  EXPECT_NE(dropped.find("scheduler 'drops_kv' released the cache of running request 1 without listing it as "
                         "preempted"),
            std::string::npos)
      << dropped;
}

// A contiguous cache's max_len bounds a sequence as the model's context does: a longer prompt is
// refused when submitted, naming the cache; generation stops at it with "length".
TEST(Engine, AContiguousCachesMaxLenBoundsASequenceLikeTheContext) {
  auto p = test::cpu_pipeline(test::kStoriesF32, {{"cache", {{"plugin", "contiguous"}, {"max_len", 16}}}});
  EXPECT_EQ(p->max_sequence_tokens(), 16);
  EXPECT_EQ(p->sequence_limit_text(), "the contiguous cache's 16 tokens per sequence");
  Engine engine(*p);
  GenerationRequest big;
  big.prompt.assign(16, 300);
  try {
    engine.submit(big);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the prompt has 16 tokens; the contiguous cache's 16 tokens per sequence"),
              std::string::npos)
        << e.what();
  }
  GenerationRequest small;
  small.prompt = {1, 403, 407, 261, 378};
  small.max_tokens = 50;
  engine.submit(small);
  engine.run_until_idle();
  const auto r = engine.take_finished();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].reason, FinishReason::length) << r[0].error;
  EXPECT_EQ(r[0].tokens.size(), 11u);  // 5 + 11 = 16
  EXPECT_EQ(std::vector<int32_t>(r[0].tokens.begin(), r[0].tokens.begin() + 8),
            (std::vector<int32_t>{432, 383, 286, 261, 376, 298, 315, 421}));
  EXPECT_EQ(p->cache().stats().blocks_used, 0);
  auto whole = test::cpu_pipeline(test::kStoriesF32);
  EXPECT_EQ(whole->max_sequence_tokens(), 512);
  EXPECT_EQ(whole->sequence_limit_text(), "the model's context of 512 tokens");
}

}  // namespace
}  // namespace tessera
