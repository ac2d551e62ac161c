// The real model against reference outputs from an independent implementation (llama.cpp and a
// float64 llama2.c forward pass): every greedy token must match, alone and batched.
#include <gtest/gtest.h>

#include "test_util.h"
#include "tessera/engine.h"

namespace tessera {
namespace {

using test::cpu_pipeline;
using test::read_json;

std::vector<GenerationResult> generate(Pipeline& p, const std::vector<std::vector<int32_t>>& prompts,
                                       int64_t max_tokens, bool ignore_eos = false) {
  Engine engine(p);
  for (const auto& prompt : prompts) {
    GenerationRequest req;
    req.prompt = prompt;
    req.max_tokens = max_tokens;
    req.ignore_eos = ignore_eos;
    engine.submit(std::move(req));
  }
  engine.run_until_idle();
  auto results = engine.take_finished();
  std::sort(results.begin(), results.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return results;
}

struct GoldenCase {
  std::string prompt;
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> completion;
  std::string completion_text;
};

std::vector<GoldenCase> golden_cases(const std::string& file) {
  std::vector<GoldenCase> out;
  for (const auto& item : read_json(test::kShared + "/golden/" + file)) {
    out.push_back({item.at("prompt"), item.at("prompt_token_ids"), item.at("completion_token_ids"),
                   item.at("completion_text")});
  }
  return out;
}

TEST(ModelGolden, EveryPromptReproduces96GreedyTokensOneAtATime) {
  auto p = cpu_pipeline(test::kStoriesF32);
  const auto cases = golden_cases("stories260K-f32.greedy96.json");
  ASSERT_EQ(cases.size(), 5u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.prompt);
    EXPECT_EQ(p->tokenizer().encode(c.prompt, true), c.prompt_ids);
    const auto r = generate(*p, {c.prompt_ids}, 96);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].tokens, c.completion);
    EXPECT_EQ(p->tokenizer().decode(r[0].tokens), c.completion_text) << "a completion keeps its leading space";
  }
}

// All golden prompts submitted together must each give their golden tokens.
void expect_golden_batched(Pipeline& p) {
  const auto cases = golden_cases("stories260K-f32.greedy96.json");
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& c : cases) prompts.push_back(c.prompt_ids);
  const auto r = generate(p, prompts, 96);
  ASSERT_EQ(r.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) EXPECT_EQ(r[i].tokens, cases[i].completion) << cases[i].prompt;
  EXPECT_EQ(p.cache().stats().blocks_used, 0) << "finished sequences must give their KV back";
}

TEST(ModelGolden, BatchedPromptsGiveTheSameTokensAsAlone) {
  expect_golden_batched(*cpu_pipeline(test::kStoriesF32));
}

TEST(ModelGolden, BatchedPromptsWaitingForKvSlotsStillMatch) {
  // Two KV slots for five prompts: sequences wait for memory; the output must not change.
  expect_golden_batched(*cpu_pipeline(test::kStoriesF32, {{"cache", {{"plugin", "contiguous"}, {"max_seqs", 2}}}}));
}

TEST(ModelGolden, BosOnlyReproduces256Tokens) {
  auto p = cpu_pipeline(test::kStoriesF32);
  const auto golden = read_json(test::kShared + "/models/stories260K/stories260K_greedy.json");
  const std::vector<int32_t> expected = golden.at("generated_token_ids");
  const auto r = generate(*p, {{1}}, int64_t(expected.size()));
  EXPECT_EQ(r[0].tokens, expected);
  std::vector<int32_t> with_bos = {1};
  with_bos.insert(with_bos.end(), r[0].tokens.begin(), r[0].tokens.end());
  EXPECT_EQ(p->tokenizer().decode(with_bos), golden.at("text").get<std::string>());
}

TEST(ModelGolden, MhaModelReproducesItsReferenceUpToTheFullContext) {
  // aidreams260K: MHA (4 heads, 4 kv heads), head size 16, context 128.
  auto p = cpu_pipeline(test::kAidreamsF32);
  const auto golden = read_json(test::kShared + "/models/aidreams260K/aidreams260K_greedy.json");
  const std::vector<int32_t> expected = golden.at("generated_token_ids");
  const auto r = generate(*p, {{1}}, 1000, /*ignore_eos=*/true);
  EXPECT_EQ(r[0].tokens, expected);
  EXPECT_EQ(r[0].reason, FinishReason::length) << "generation stops at the model's context";
}

TEST(ModelGolden, Q8ModelFollowsItsReference) {
  // The reference quantises activations inside its Q8_0 dot products, we do not; the README allows a
  // divergence after a near-tie, so require a long common prefix rather than all 96 tokens.
  auto p = cpu_pipeline(test::kStoriesQ8);
  for (const auto& c : golden_cases("stories260K-q8_0.greedy96.json")) {
    SCOPED_TRACE(c.prompt);
    const auto r = generate(*p, {c.prompt_ids}, 96);
    size_t same = 0;
    while (same < c.completion.size() && same < r[0].tokens.size() && r[0].tokens[same] == c.completion[same]) ++same;
    EXPECT_GE(same, 32u);
  }
}

}  // namespace
}  // namespace tessera
