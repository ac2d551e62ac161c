// Speculative decoding on the real model: greedy output equals plain greedy output token for token
// for every proposer, alone and in a batch; rejected drafts' KV is rolled back and blocks return to
// the pool; a draft model with another vocabulary is refused; rejection sampling leaves the target's
// distribution intact (chi-square); the adaptive window shrinks and turns off.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "test_util.h"
#include "tessera/engine.h"
#include "tessera/sampling.h"
#include "tessera/synth.h"

namespace tessera {
namespace {

struct Golden {
  std::vector<int32_t> prompt, completion;
};

std::vector<Golden> golden() {
  std::vector<Golden> out;
  for (const auto& item : test::read_json(test::kShared + "/golden/stories260K-f32.greedy96.json")) {
    out.push_back({item.at("prompt_token_ids").get<std::vector<int32_t>>(),
                   item.at("completion_token_ids").get<std::vector<int32_t>>()});
  }
  return out;
}

// Every proposer, as a decoder spec.
std::map<std::string, nlohmann::json> proposers() {
  return {
      {"ngram", {{"plugin", "speculative"}, {"proposer", "ngram"}, {"window", 4}}},
      {"layer_skip", {{"plugin", "speculative"}, {"proposer", "layer_skip"}, {"layers", 3}, {"window", 3}}},
      {"draft_model", {{"plugin", "speculative"}, {"proposer", "draft_model"}, {"draft_model", test::kStoriesQ8}}},
      {"self_quantized", {{"plugin", "speculative"}, {"proposer", "self_quantized"}, {"draft_quantizer", "int4"}}},
      // The Q8_0 draft in its own blocks (gguf), not through the f32 target's quantizer.
      {"draft_model_gguf",
       {{"plugin", "speculative"}, {"proposer", "draft_model"}, {"draft_model", test::kStoriesQ8}, {"draft_quantizer", "gguf"}}},
      {"ngram_prefix_lru", {{"plugin", "speculative"}, {"proposer", "ngram"}, {"window", 5}}},
      {"ngram_adaptive",
       {{"plugin", "speculative"}, {"proposer", "ngram"}, {"window", 2}, {"adaptive", true}, {"max_window", 6}}},
  };
}

nlohmann::json paged_continuous(const nlohmann::json& decoder, const std::string& cache = "paged") {
  return {{"cache", {{"plugin", cache}, {"block_size", 16}, {"memory", "16MiB"}}},
          // admission_reserve 0: the scheduler reserves only what it computes, so any block beyond the
          // accepted tokens would be speculation's.
          {"scheduler", {{"plugin", "continuous"}, {"max_batch_tokens", 256}, {"max_seqs", 8}, {"admission_reserve", 0}}},
          {"decoder", decoder}};
}

class SpeculativeGreedy : public testing::TestWithParam<std::string> {};

TEST_P(SpeculativeGreedy, EqualsPlainGreedyOnTheGoldenPromptsAloneAndBatched) {
  const nlohmann::json decoder = proposers().at(GetParam());
  const auto cases = golden();
  // Alone, on the default pipeline (contiguous cache, fcfs).
  {
    auto p = test::cpu_pipeline(test::kStoriesF32, {{"decoder", decoder}});
    for (const Golden& g : cases) {
      Engine engine(*p);
      GenerationRequest req;
      req.prompt = g.prompt;
      req.max_tokens = int64_t(g.completion.size());
      engine.submit(req);
      engine.run_until_idle();
      const auto r = engine.take_finished();
      ASSERT_EQ(r.size(), 1u);
      EXPECT_EQ(r[0].tokens, g.completion) << GetParam() << " alone";
      const SpeculationStats s = engine.stats().speculation;
      EXPECT_GT(s.proposed, 0) << GetParam();
      EXPECT_LE(s.accepted, s.proposed);
    }
  }
  // Batched, on the paged cache with continuous batching; blocks go back to zero afterwards and,
  // during the run, the cache never holds blocks for rejected drafts or unused look-ahead.
  const bool prefix = GetParam() == "ngram_prefix_lru";
  auto p = test::cpu_pipeline(test::kStoriesF32, paged_continuous(decoder, prefix ? "prefix_lru" : "paged"));
  Engine engine(*p);
  std::map<RequestId, size_t> which;
  std::map<RequestId, int64_t> length;  // prompt + tokens streamed so far
  for (size_t i = 0; i < cases.size(); ++i) {
    GenerationRequest req;
    req.prompt = cases[i].prompt;
    req.max_tokens = int64_t(cases[i].completion.size());
    req.on_token = [&length](RequestId id, int32_t) { ++length[id]; };
    const RequestId id = engine.submit(req);
    which[id] = i;
    length[id] = int64_t(req.prompt.size());
  }
  std::vector<GenerationResult> results;
  const int64_t block = 16;
  while (engine.step()) {
    for (auto& r : engine.take_finished()) {
      length.erase(r.id);
      results.push_back(std::move(r));
    }
    int64_t bound = 0;
    for (const auto& [id, n] : length) bound += (n + block - 1) / block;
    EXPECT_LE(p->cache().stats().blocks_used, bound) << GetParam() << ": KV held past the accepted tokens; step " << engine.stats().steps << " seqs " << length.size() << " cache seqs " << p->cache().stats().sequences;
  }
  for (auto& r : engine.take_finished()) results.push_back(std::move(r));
  ASSERT_EQ(results.size(), cases.size());
  for (const auto& r : results) EXPECT_EQ(r.tokens, cases[which[r.id]].completion) << GetParam() << " batched";
  // (prefix_lru keeps finished sequences' full blocks cached for reuse; they are not in use.)
  EXPECT_EQ(p->cache().stats().blocks_used, 0);
  EXPECT_EQ(p->cache().stats().sequences, 0);
  const SpeculationStats s = engine.stats().speculation;
  EXPECT_GT(s.verifications, 0);
  EXPECT_GT(s.accepted, 0) << GetParam() << " never had a draft accepted";
  EXPECT_GT(s.draft_time_share(), 0.0);
  EXPECT_LT(s.draft_time_share(), 1.0);
}

INSTANTIATE_TEST_SUITE_P(Proposers, SpeculativeGreedy,
                         testing::Values("ngram", "layer_skip", "draft_model", "draft_model_gguf", "self_quantized",
                                         "ngram_adaptive", "ngram_prefix_lru"));

// Verification reads a half-precision cache in another order than decode does (all keys converted
// at once, not a block at a time): greedy output must still equal plain greedy on the same cache.
TEST(Speculative, EqualsPlainGreedyOnAHalfPrecisionCache) {
  for (DType kv : {DType::F16, DType::BF16}) {
    auto plain = test::cpu_pipeline(test::kStoriesF32, nlohmann::json::object(), kv);
    auto spec = test::cpu_pipeline(test::kStoriesF32, paged_continuous(proposers().at("layer_skip")), kv);
    for (const Golden& g : golden()) {
      std::vector<int32_t> out[2];
      for (int i = 0; i < 2; ++i) {
        Engine engine(i == 0 ? *plain : *spec);
        GenerationRequest req;
        req.prompt = g.prompt;
        req.max_tokens = int64_t(g.completion.size());
        engine.submit(req);
        engine.run_until_idle();
        out[i] = engine.take_finished().at(0).tokens;
      }
      EXPECT_EQ(out[1], out[0]) << dtype_name(kv);
      EXPECT_EQ(out[0].size(), g.completion.size());
    }
    EXPECT_EQ(spec->cache().stats().blocks_used, 0);
  }
}

// Block-sparse attention approximates prefill and keeps decode dense; verification passes look
// like short prefill chunks, but each of their queries must get what a decode step gives, or
// greedy speculation changes the tokens (it did, 8 tokens into a 390-token prompt's answer).
TEST(Speculative, EqualsPlainGreedyOverBlockSparseAttention) {
  const nlohmann::json sparse = {{"plugin", "sparse"}, {"block_size", 64}, {"sink_blocks", 1}, {"local_window", 128},
                                 {"keep_ratio", 0.5}, {"min_context", 256}};
  auto tokens_of = [&](const nlohmann::json& decoder) {
    nlohmann::json components = paged_continuous(decoder);
    components["attention"] = sparse;
    auto p = test::cpu_pipeline(test::kStoriesF32, components);
    const std::string text = test::read_text(test::kShared + "/eval/tiny_stories_eval.txt");
    std::vector<int32_t> prompt = p->tokenizer().encode(text, true);
    std::vector<GenerationResult> out;
    Engine engine(*p);
    for (const size_t n : {271, 390, 426}) {  // past min_context: each prefill goes sparse
      GenerationRequest req;
      req.prompt.assign(prompt.begin(), prompt.begin() + ptrdiff_t(n));
      req.max_tokens = 40;
      req.ignore_eos = true;
      SamplingParams greedy;
      greedy.temperature = 0;
      greedy.logprobs = 0;
      req.sampling = greedy;
      engine.submit(req);
    }
    engine.run_until_idle();
    out = engine.take_finished();
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
    return out;
  };
  const auto plain = tokens_of({{"plugin", "sampling"}, {"temperature", 0}});
  const auto spec = tokens_of(proposers().at("ngram"));
  ASSERT_EQ(plain.size(), 3u);
  ASSERT_EQ(spec.size(), 3u);
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(spec[i].tokens, plain[i].tokens) << "prompt " << i;
    EXPECT_EQ(spec[i].logprobs, plain[i].logprobs) << "prompt " << i;
  }
}

TEST(Speculative, SeededSamplingIsBatchIndependentAndCancellationFreesEverything) {
  for (const std::string name : {"ngram", "draft_model"}) {
    auto p = test::cpu_pipeline(test::kStoriesF32, paged_continuous(proposers().at(name)));
    SamplingParams s;
    s.temperature = 0.8;
    s.top_k = 20;
    s.seed = 11;
    auto run = [&](int companions) {
      GenerationRequest req;
      req.prompt = p->tokenizer().encode("Lily and Ben", true);
      req.max_tokens = 40;
      req.sampling = s;
      return test::run_beside(*p, req, test::reseeded(req, companions, 50)).tokens;
    };
    const auto alone = run(0);
    EXPECT_EQ(alone.size(), 40u) << name;
    EXPECT_EQ(alone, run(3)) << name;
    // Cancel in the middle of speculation.
    Engine engine(*p);
    GenerationRequest req;
    req.prompt = p->tokenizer().encode("Once upon a time", true);
    req.max_tokens = 90;
    const RequestId a = engine.submit(req);
    engine.submit(req);
    for (int i = 0; i < 6; ++i) engine.step();
    engine.cancel(a);
    engine.run_until_idle();
    EXPECT_EQ(engine.take_finished().size(), 2u);
    EXPECT_EQ(p->cache().stats().blocks_used, 0) << name;
  }
}

TEST(Speculative, DraftModelWithAnotherVocabularyIsRefused) {
  // aidreams260K has 512 tokens too, but not the same ones.
  nlohmann::json d = {{"plugin", "speculative"}, {"proposer", "draft_model"}, {"draft_model", test::kAidreamsF32}};
  try {
    test::cpu_pipeline(test::kStoriesF32, {{"decoder", d}});
    ADD_FAILURE() << "a draft with another vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocabulary mismatch"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("aidreams260K"), std::string::npos) << e.what();
  }
  // Another size: a synthetic model with 600 tokens.
  test::TempDir dir;
  SynthSpec spec;
  spec.preset = "custom";
  spec.dim = 64;
  spec.ffn_dim = 128;
  spec.n_layers = 1;
  spec.n_heads = 4;
  spec.n_kv_heads = 4;
  spec.vocab = 600;
  spec.context_length = 512;
  const std::string path = dir.path() + "/vocab600.gguf";
  write_synthetic_model(spec, path);
  d["draft_model"] = path;
  try {
    test::cpu_pipeline(test::kStoriesF32, {{"decoder", d}});
    ADD_FAILURE() << "a draft with 600 tokens was accepted for a 512-token target";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has 600 tokens"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("has 512"), std::string::npos) << e.what();
  }
  // A missing file and a missing path are named.
  d["draft_model"] = dir.path() + "/none.gguf";
  EXPECT_THROW(test::cpu_pipeline(test::kStoriesF32, {{"decoder", d}}), Error);
  d.erase("draft_model");
  EXPECT_THROW(test::cpu_pipeline(test::kStoriesF32, {{"decoder", d}}), Error);
}

// Chi-square statistic of observed counts against expected probabilities.
double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& p, int64_t n) {
  double x2 = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double e = p[i] * double(n);
    x2 += (double(counts[i]) - e) * (double(counts[i]) - e) / e;
  }
  return x2;
}

// 99.9% quantile of chi-square with 5 degrees of freedom.
constexpr double kChi2Df5 = 20.515;

TEST(SpeculativeRejectionSampling, AcceptedTokensFollowTheTargetDistribution) {
  const std::vector<double> p = {0.35, 0.25, 0.15, 0.12, 0.08, 0.05};
  const std::vector<double> q = {0.05, 0.10, 0.40, 0.05, 0.20, 0.20};  // a poor draft
  std::vector<Candidate> pc, qc, scratch;
  for (int32_t t = 0; t < 6; ++t) {
    pc.push_back({t, p[size_t(t)]});
    qc.push_back({t, q[size_t(t)]});
  }
  const int64_t n = 60000;
  uint64_t rng = 12345;
  std::vector<int64_t> counts(6, 0), drafted(6, 0);
  int64_t accepted = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t x = draw(qc, rng);
    ++drafted[size_t(x)];
    const DraftVerdict v = accept_or_resample(pc, qc, x, rng, scratch);
    ++counts[size_t(v.token)];
    accepted += v.accepted;
  }
  EXPECT_LT(chi_square(counts, p, n), kChi2Df5);
  // The drafts themselves follow q, which differs from p: the test can tell the two apart.
  EXPECT_GT(chi_square(drafted, p, n), 1000.0);
  // Acceptance rate is sum min(p, q) = 0.05 + 0.10 + 0.15 + 0.05 + 0.08 + 0.05 = 0.48.
  EXPECT_NEAR(double(accepted) / double(n), 0.48, 0.01);
}

TEST(SpeculativeRejectionSampling, TheDecoderKeepsTheTargetDistributionForDeterministicDrafts) {
  // Through the speculative decoder's select(): one draft (token 2, as prompt lookup proposes,
  // a point mass), target logits with a known softmax at temperature 1; the first emitted token
  // must follow the target.
  auto decoder = test::plugins().create<Decoder>("speculative", nlohmann::json::object(), "test");
  const std::vector<double> p = {0.30, 0.25, 0.20, 0.12, 0.08, 0.05};
  std::vector<float> logits(12);
  for (size_t t = 0; t < 6; ++t) logits[t] = float(std::log(p[t]));
  for (size_t t = 6; t < 12; ++t) logits[t] = 0;  // the bonus row
  SamplingParams s;
  s.temperature = 1.0;
  s.logprobs = 0;  // and each chosen token's log-probability, accepted or not
  const std::vector<int32_t> history = {1, 2, 3};
  const std::vector<int32_t> draft = {2};
  const int64_t n = 40000;
  uint64_t rng = 99;
  std::vector<int64_t> counts(6, 0);
  int64_t accepted = 0;
  for (int64_t i = 0; i < n; ++i) {
    DecodeItem item;
    item.seq = 1;
    item.logits = logits.data();
    item.vocab = 6;
    item.params = s;
    item.history = history;
    item.prompt_tokens = 3;
    item.draft = draft;
    item.rng_state = &rng;
    decoder->select(std::span<DecodeItem>(&item, 1));
    ASSERT_FALSE(item.tokens.empty());
    ++counts[size_t(item.tokens[0])];
    if (item.tokens.size() == 2) ++accepted;
    ASSERT_EQ(item.logprobs.size(), item.tokens.size());
  }
  EXPECT_LT(chi_square(counts, p, n), kChi2Df5);
  EXPECT_NEAR(double(accepted) / double(n), 0.20, 0.01);
}

TEST(SpeculativeAdaptiveWindow, ShrinksOnRejectionGrowsOnAcceptanceAndTurnsOff) {
  auto decoder = test::plugins().create<Decoder>(
      "speculative", nlohmann::json{{"window", 3}, {"adaptive", true}, {"max_window", 5}, {"min_acceptance", 0.3}},
      "test");
  Speculator* spec = decoder->speculator();
  ASSERT_NE(spec, nullptr);
  // Greedy: row argmax is token 0; drafts of 0 are accepted, drafts of 1 rejected.
  auto verify = [&](SeqId seq, const std::vector<int32_t>& draft) {
    std::vector<float> logits;
    for (size_t j = 0; j <= draft.size(); ++j) logits.insert(logits.end(), {5.0f, 1.0f, 0.0f});
    const std::vector<int32_t> history = {2};
    DecodeItem item;
    item.seq = seq;
    item.logits = logits.data();
    item.vocab = 3;
    item.history = history;
    item.prompt_tokens = 1;
    item.draft = draft;
    decoder->select(std::span<DecodeItem>(&item, 1));
    return item.tokens;
  };
  EXPECT_EQ(spec->lookahead(7), 3);
  EXPECT_EQ(verify(7, {0, 0, 0}), (std::vector<int32_t>{0, 0, 0, 0}));
  EXPECT_EQ(spec->lookahead(7), 4);
  verify(7, {0, 0, 0, 0});
  verify(7, {0, 0, 0, 0, 0});
  EXPECT_EQ(spec->lookahead(7), 5);  // capped at max_window
  EXPECT_EQ(verify(8, {1, 0, 0}), (std::vector<int32_t>{0}));
  EXPECT_EQ(spec->lookahead(8), 1);  // nothing accepted: halved
  verify(8, {1});                    // two verifications, nothing ever accepted: speculation off
  EXPECT_EQ(spec->lookahead(8), 0);
  EXPECT_EQ(spec->lookahead(7), 5);  // the other sequence is unaffected
  spec->release(8);
  EXPECT_EQ(spec->lookahead(8), 3);
  // Some acceptance, but below min_acceptance (0.3): off after four verifications.
  EXPECT_EQ(verify(9, {0, 1, 0}), (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(spec->lookahead(9), 2);  // fewer than half accepted: one less
  verify(9, {1, 0});
  EXPECT_EQ(spec->lookahead(9), 1);
  verify(9, {1});
  EXPECT_EQ(spec->lookahead(9), 1);  // 1 of 6 accepted, but only three verifications
  verify(9, {1});
  EXPECT_EQ(spec->lookahead(9), 0);
}

}  // namespace
}  // namespace tessera
