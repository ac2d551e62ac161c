// Sampling features through the engine on the real model: stop strings (also across two tokens),
// streamed text equal to the result's text, log-probabilities equal to an independent log-softmax of
// the model's logits, penalties that act exactly as documented, and seeded sampling with penalties
// that does not depend on the batch.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>

#include "test_util.h"
#include "tessera/engine.h"
#include "tessera/sampling.h"

namespace tessera {
namespace {

const std::vector<int32_t> kOnceUponATime = {1, 403, 407, 261, 378};

// The model's logits at every position of `tokens`, computed in one forward on a fresh sequence.
std::vector<std::vector<float>> model_logits(Pipeline& p, const std::vector<int32_t>& tokens) {
  Cache& cache = p.cache();
  const SeqId seq = 999999;
  CacheRequest req{seq, int64_t(tokens.size()), tokens, "test", false};
  auto plan = cache.plan(std::span<const CacheRequest>(&req, 1));
  EXPECT_TRUE(plan.has_value());
  cache.commit(*plan);
  ForwardSeq fs{seq, tokens, 0, int64_t(tokens.size())};
  std::vector<float> flat;
  p.model().forward(std::span<const ForwardSeq>(&fs, 1), p.attention(), cache, flat);
  cache.release(seq);
  const auto vocab = size_t(p.model().config().vocab);
  std::vector<std::vector<float>> rows;
  for (size_t i = 0; i < tokens.size(); ++i) rows.emplace_back(flat.begin() + i * vocab, flat.begin() + (i + 1) * vocab);
  return rows;
}

std::vector<double> log_softmax(const std::vector<float>& row) {
  double mx = row[0];
  for (float v : row) mx = std::max(mx, double(v));
  double sum = 0;
  for (float v : row) sum += std::exp(double(v) - mx);
  std::vector<double> out;
  for (float v : row) out.push_back(double(v) - mx - std::log(sum));
  return out;
}

GenerationResult generate(Pipeline& p, GenerationRequest req) {
  Engine engine(p);
  engine.submit(std::move(req));
  engine.run_until_idle();
  auto r = engine.take_finished();
  EXPECT_EQ(r.size(), 1u);
  return r.empty() ? GenerationResult{} : r[0];
}

// Greedy decoding's pick is std::max_element's: the first maximum, NaNs after the first element never
// chosen, -0 and +0 tied, at every length around the vector width.
TEST(EngineSampling, ArgmaxIsTheFirstMaximumLikeMaxElement) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> small(-3, 3);  // many ties
  for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 31, 33, 100, 32000, 32003}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> v(static_cast<size_t>(n));
      for (float& x : v) x = float(small(rng));
      if (trial % 4 == 1) v[size_t(rng() % n)] = NAN;
      if (trial % 4 == 2) std::fill(v.begin(), v.end(), -INFINITY);
      if (trial % 4 == 3) {
        for (float& x : v) x = (rng() & 1) ? 0.0f : -0.0f;
      }
      if (trial == 5) v[0] = NAN;
      const auto expected = int32_t(std::max_element(v.begin(), v.end()) - v.begin());
      EXPECT_EQ(argmax(v.data(), n), expected) << "n " << n << " trial " << trial;
    }
  }
}

TEST(EngineSampling, StopStringSpanningTwoTokensCutsTheTextAndStreamsTheRest) {
  auto p = test::cpu_pipeline(test::kStoriesF32);
  GenerationRequest req;
  req.prompt = kOnceUponATime;  // greedy: ", there was a little girl named Lily. She ..."
  req.max_tokens = 40;
  req.stop = {"re wa"};  // " there" + " was"
  std::vector<std::string> pieces;
  req.on_text = [&](RequestId, std::string_view t) { pieces.emplace_back(t); };
  const GenerationResult r = generate(*p, req);
  EXPECT_EQ(r.reason, FinishReason::stop);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{432, 383, 286}));
  EXPECT_EQ(r.text, ", the");
  std::string joined;
  for (const auto& s : pieces) joined += s;
  EXPECT_EQ(joined, r.text);
  EXPECT_EQ(p->cache().stats().blocks_used, 0);
}

TEST(EngineSampling, StreamedTextEqualsTheResultTextAndTheDecodedTokens) {
  auto p = test::cpu_pipeline(test::kStoriesF32);
  for (const std::vector<std::string>& stops : {std::vector<std::string>{}, {"Lily.", "zzz"}}) {
    GenerationRequest req;
    req.prompt = kOnceUponATime;
    req.max_tokens = 60;
    req.stop = stops;
    std::vector<std::string> pieces;
    req.on_text = [&](RequestId, std::string_view t) { pieces.emplace_back(t); };
    const GenerationResult r = generate(*p, req);
    std::string joined;
    for (const auto& s : pieces) joined += s;
    EXPECT_EQ(joined, r.text);
    EXPECT_GT(pieces.size(), 5u) << "text should stream piece by piece, not arrive at the end";
    const std::string all = p->tokenizer().decode(r.tokens);
    if (stops.empty()) {
      EXPECT_EQ(r.reason, FinishReason::length);
      EXPECT_EQ(r.text, all);
    } else {
      EXPECT_EQ(r.reason, FinishReason::stop);
      EXPECT_EQ(r.text, ", there was a little girl named ");
      EXPECT_EQ(all.substr(0, r.text.size()), r.text);
    }
  }
}

TEST(EngineSampling, EmptyStopStringIsRefused) {
  auto p = test::cpu_pipeline(test::kStoriesF32);
  Engine engine(*p);
  GenerationRequest req;
  req.prompt = kOnceUponATime;
  req.stop = {"x", ""};
  EXPECT_THROW(engine.submit(req), Error);
}

TEST(EngineSampling, LogprobsAreTheLogSoftmaxOfTheModelLogits) {
  auto p = test::cpu_pipeline(test::kStoriesF32);
  for (double temperature : {0.0, 1.3}) {
    GenerationRequest req;
    req.prompt = kOnceUponATime;
    req.max_tokens = 16;
    req.sampling = SamplingParams{};
    req.sampling->temperature = temperature;
    req.sampling->top_k = 40;
    req.sampling->seed = 5;
    req.sampling->logprobs = 5;
    const GenerationResult r = generate(*p, req);
    ASSERT_EQ(r.tokens.size(), 16u);
    ASSERT_EQ(r.logprobs.size(), 16u);
    ASSERT_EQ(r.top_logprobs.size(), 16u);
    std::vector<int32_t> all = r.prompt;
    all.insert(all.end(), r.tokens.begin(), r.tokens.end());
    const auto rows = model_logits(*p, all);
    for (size_t i = 0; i < r.tokens.size(); ++i) {
      const auto ls = log_softmax(rows[r.prompt.size() - 1 + i]);
      EXPECT_NEAR(r.logprobs[i], ls[size_t(r.tokens[i])], 1e-4) << "token " << i;
      ASSERT_EQ(r.top_logprobs[i].size(), 5u);
      std::vector<size_t> order(ls.size());
      for (size_t v = 0; v < order.size(); ++v) order[v] = v;
      std::partial_sort(order.begin(), order.begin() + 5, order.end(), [&](size_t a, size_t b) { return ls[a] > ls[b]; });
      for (size_t k = 0; k < 5; ++k) {
        EXPECT_EQ(r.top_logprobs[i][k].token, int32_t(order[k])) << "token " << i << " rank " << k;
        EXPECT_NEAR(r.top_logprobs[i][k].logprob, ls[order[k]], 1e-4);
      }
      if (temperature == 0.0) EXPECT_EQ(r.top_logprobs[i][0].token, r.tokens[i]);
    }
  }
}

TEST(EngineSampling, PenaltiesActExactlyAsDocumented) {
  // Greedy with all three penalties: every token must be the argmax of the model's logits after
  // repetition (prompt and output), frequency and presence (output only) penalties, computed here
  // independently; and the output must differ from plain greedy.
  auto p = test::cpu_pipeline(test::kStoriesF32);
  GenerationRequest req;
  req.prompt = p->tokenizer().encode("Tom and his dog went to the park", true);
  req.max_tokens = 40;
  req.ignore_eos = true;
  const GenerationResult plain = generate(*p, req);
  SamplingParams s;
  s.repetition_penalty = 1.3;
  s.frequency_penalty = 0.4;
  s.presence_penalty = 0.3;
  req.sampling = s;
  const GenerationResult r = generate(*p, req);
  ASSERT_EQ(r.tokens.size(), 40u);
  EXPECT_NE(r.tokens, plain.tokens);
  std::vector<int32_t> all = r.prompt;
  all.insert(all.end(), r.tokens.begin(), r.tokens.end());
  const auto rows = model_logits(*p, all);
  for (size_t i = 0; i < r.tokens.size(); ++i) {
    std::vector<float> l = rows[r.prompt.size() - 1 + i];
    std::set<int32_t> seen(all.begin(), all.begin() + long(r.prompt.size() + i));
    for (int32_t t : seen) l[size_t(t)] = l[size_t(t)] > 0 ? l[size_t(t)] / 1.3f : l[size_t(t)] * 1.3f;
    std::map<int32_t, int> count;
    for (size_t j = 0; j < i; ++j) ++count[r.tokens[j]];
    for (auto [t, n] : count) l[size_t(t)] -= float(n * 0.4 + 0.3);
    const auto best = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
    EXPECT_EQ(r.tokens[i], best) << "token " << i;
  }
  // Penalised output repeats less than plain greedy output.
  auto distinct = [](const std::vector<int32_t>& v) { return std::set<int32_t>(v.begin(), v.end()).size(); };
  EXPECT_GT(distinct(r.tokens), distinct(plain.tokens));
}

TEST(EngineSampling, SeededSamplingWithPenaltiesAndLogprobsIsBatchIndependent) {
  auto p = test::cpu_pipeline(test::kStoriesF32);
  SamplingParams s;
  s.temperature = 0.9;
  s.min_p = 0.05;
  s.frequency_penalty = 0.5;
  s.presence_penalty = -0.2;
  s.repetition_penalty = 1.1;
  s.logprobs = 2;
  s.seed = 7;
  auto run = [&](int companions) {
    GenerationRequest req;
    req.prompt = p->tokenizer().encode("Lily and Ben", true);
    req.max_tokens = 30;
    req.sampling = s;
    auto others = test::reseeded(req, companions, 100);
    for (int i = 0; i < companions; ++i) {
      others[size_t(i)].prompt = p->tokenizer().encode(i % 2 ? "Once upon a time" : "The cat", true);
    }
    return test::run_beside(*p, req, others);
  };
  const GenerationResult alone = run(0);
  const GenerationResult batched = run(3);
  EXPECT_EQ(alone.tokens, batched.tokens);
  EXPECT_EQ(alone.text, batched.text);
  ASSERT_EQ(alone.logprobs.size(), batched.logprobs.size());
  for (size_t i = 0; i < alone.logprobs.size(); ++i) EXPECT_NEAR(alone.logprobs[i], batched.logprobs[i], 1e-4);
}

}  // namespace
}  // namespace tessera
