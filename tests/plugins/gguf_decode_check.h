// What the GGUF type tests share: a model's greedy decode on its blocks against the same weights in
// f32 (quantizer none), through the real loader.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "test_util.h"
#include "tessera/engine.h"

namespace tessera::test {

// Greedy runs of a pipeline on `path` with the given quantizer, with the top 5 log-probabilities.
inline std::vector<GenerationResult> greedy(const std::string& path, const std::string& quantizer) {
  auto p = test::cpu_pipeline(path, {{"quantizer", {{"plugin", quantizer}}}});
  std::vector<GenerationResult> out;
  const std::vector<std::vector<int32_t>> prompts = {{1, 300, 301, 302}, {1, 400, 270}, {1, 280, 290}, {1, 350}};
  for (const std::vector<int32_t>& prompt : prompts) {
    Engine engine(*p);
    GenerationRequest req;
    req.prompt = prompt;
    req.max_tokens = 24;
    req.ignore_eos = true;
    SamplingParams s;
    s.temperature = 0;
    s.logprobs = 5;
    req.sampling = s;
    engine.submit(std::move(req));
    engine.run_until_idle();
    auto results = engine.take_finished();
    EXPECT_EQ(results.size(), 1u);
    if (!results.empty()) out.push_back(std::move(results[0]));
  }
  return out;
}

// The blocks run in place (8-bit activations) decode the tokens of the same weights in f32 (quantizer
// none): equal, or parting only at a near-tie of the f32 run, where its choice and ours are within
// 0.1 nats; and at every step until they part, each token both runs list in their top 5 has the
// same log-probability within 0.1 (8-bit activations move them by 0.01-0.05 on these random
// models, whose flat distributions are full of near-ties; a wrong kernel moves them by far more).
// A long stretch of tokens agrees over the prompts.
inline void expect_same_tokens(const std::string& path, size_t min_agreed = 16) {
  const auto got = greedy(path, "gguf"), want = greedy(path, "none");
  ASSERT_EQ(got.size(), want.size());
  size_t agreed = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const auto& g = got[i].tokens;
    const auto& w = want[i].tokens;
    ASSERT_EQ(g.size(), 24u);
    size_t same = 0;
    while (same < g.size() && same < w.size() && g[same] == w[same]) ++same;
    agreed += same;
    for (size_t p = 0; p <= std::min(same, g.size() - 1); ++p) {
      for (const TokenLogprob& ours : got[i].top_logprobs.at(p)) {
        for (const TokenLogprob& theirs : want[i].top_logprobs.at(p)) {
          if (ours.token == theirs.token) {
            EXPECT_NEAR(ours.logprob, theirs.logprob, 0.1) << "prompt " << i << " step " << p << " token " << ours.token;
          }
        }
      }
    }
    if (same == g.size()) continue;
    const auto& top = want[i].top_logprobs.at(same);
    const auto ours = std::find_if(top.begin(), top.end(), [&](const TokenLogprob& t) { return t.token == g[same]; });
    ASSERT_NE(ours, top.end()) << "prompt " << i << " token " << same << ": ours is not in the f32 run's top 5";
    EXPECT_LT(want[i].logprobs.at(same) - ours->logprob, 0.1)
        << "prompt " << i << " parted from the f32 run at token " << same << " on a clear choice";
  }
  EXPECT_GE(agreed, min_agreed) << "a long stretch of equal tokens";
}

}  // namespace tessera::test
