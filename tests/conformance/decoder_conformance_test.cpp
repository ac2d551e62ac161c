// Decoder conformance: every decoder the loader finds, with its defaults, turns seeded random logits
// into tokens the way a user relies on: greedy is the argmax, a seed fixes the output whatever else
// is in the batch, different seeds differ, top_k = 1 is greedy at any temperature, and tokens are
// always inside the vocabulary. Also: validate_sampling refuses out-of-range settings by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "conformance/conformance_util.h"
#include "tessera/constraint.h"
#include "tessera/decoder.h"
#include "tessera/error.h"

namespace tessera {
namespace {

using namespace conformance;

// Decoders whose defaults need a companion the pipeline wires in, so they cannot be created from
// defaults alone. They are skipped only if creation actually fails. (speculative is not one: its
// default proposer, ngram, needs no model, and without drafts it must decode like any decoder.)
const std::set<std::string> kNeedCompanion = {};

class DecoderConformance : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    try {
      decoder_ = create_default<Decoder>(GetParam());
    } catch (const Error& e) {
      if (kNeedCompanion.count(GetParam())) GTEST_SKIP() << "needs a companion: " << e.what();
      FAIL() << "decoder '" << GetParam() << "' cannot be created from its defaults: " << e.what();
    }
  }

  // One step for several sequences; returns each item's tokens.
  std::vector<std::vector<int32_t>> select(std::vector<DecodeItem>& items) {
    decoder_->select(items);
    std::vector<std::vector<int32_t>> out;
    for (const DecodeItem& it : items) {
      if (it.draft.empty()) EXPECT_EQ(it.tokens.size(), 1u) << "a plain step (no drafts) chooses one token";
      out.push_back(it.tokens);
    }
    return out;
  }

  SamplingParams params(double temperature, int64_t top_k = 0, double top_p = 1.0, uint64_t seed = 0) const {
    SamplingParams p = decoder_->default_params();
    p.temperature = temperature;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = 0.0;
    p.repetition_penalty = 1.0;
    p.seed = seed;
    return p;
  }

  std::shared_ptr<Decoder> decoder_;
};

DecodeItem item(SeqId seq, const std::vector<float>& logits, const SamplingParams& p, std::span<const int32_t> history,
                uint64_t* rng) {
  DecodeItem it;
  it.seq = seq;
  it.logits = logits.data();
  it.vocab = int64_t(logits.size());
  it.params = p;
  it.history = history;
  it.rng_state = rng;
  return it;
}

int32_t argmax(const std::vector<float>& v) { return int32_t(std::max_element(v.begin(), v.end()) - v.begin()); }

TEST(DecoderPlugins, AtLeastOneIsLoaded) {
  EXPECT_FALSE(plugin_names(ComponentKind::decoder).empty())
      << "no decoder plugin in " << plugin_source() << "\n" << load_failures();
}

TEST(SamplingValidation, RejectsOutOfRangeValuesNamingTheField) {
  auto expect_refused = [](SamplingParams p, const std::string& field) {
    try {
      validate_sampling(p);
      ADD_FAILURE() << field << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  SamplingParams p;
  p.temperature = -1;
  expect_refused(p, "temperature");
  p = {};
  p.top_p = 0;
  expect_refused(p, "top_p");
  p.top_p = 1.5;
  expect_refused(p, "top_p=1.5");
  p = {};
  p.min_p = -0.1;
  expect_refused(p, "min_p");
  p = {};
  p.top_k = -3;
  expect_refused(p, "top_k=-3");
  p = {};
  p.repetition_penalty = 0;
  expect_refused(p, "repetition_penalty");
  p = {};
  p.frequency_penalty = 2.5;
  expect_refused(p, "frequency_penalty=2.5");
  p = {};
  p.presence_penalty = -3;
  expect_refused(p, "presence_penalty=-3");
  p = {};
  p.logprobs = 21;
  expect_refused(p, "logprobs=21");
  p = {};
  p.temperature = std::nan("");
  expect_refused(p, "temperature");
  EXPECT_NO_THROW(validate_sampling(SamplingParams{}));
  p = {};
  p.frequency_penalty = -2;
  p.presence_penalty = 2;
  p.logprobs = 20;
  p.min_p = 1;
  EXPECT_NO_THROW(validate_sampling(p));
}

TEST_P(DecoderConformance, DefaultsAreValid) { EXPECT_NO_THROW(validate_sampling(decoder_->default_params())); }

// Structured output relies on every decoder: a request's constraint (here the `grammar` plugin's
// choice among three words over a vocabulary of letters) must hold whatever the logits prefer, and
// the decoder advances it by the tokens it returns.
TEST_P(DecoderConformance, KeepsTheRequestsConstraint) {
  if (registry().find(ComponentKind::constraint, "grammar") == nullptr) GTEST_SKIP() << "no 'grammar' constraint plugin loaded";
  auto constraint = create_default<Constraint>("grammar");
  ConstraintVocab v;
  for (char c = 'a'; c <= 'z'; ++c) v.pieces.push_back(std::string(1, c));
  v.pieces.push_back("ab");
  v.end_tokens.push_back(int32_t(v.pieces.size()));
  v.pieces.push_back("");
  constraint->set_vocabulary(v);
  const std::vector<std::string> choices = {"abc", "abd", "zz"};
  const auto compiled = constraint->compile({"choice", R"(["abc", "abd", "zz"])", "conformance"});
  const int64_t vocab = int64_t(v.pieces.size());
  for (double temperature : {0.0, 1.0}) {
    for (uint64_t seed = 0; seed < 6; ++seed) {
      auto state = compiled->start();
      std::string out;
      std::vector<int32_t> history = {0};
      uint64_t rng = seed;
      for (int step = 0; step < 6 && !state->finished(); ++step) {
        // The model prefers 'q', which no choice has; then the letters at random.
        std::vector<float> logits = random_floats(size_t(vocab), seed * 100 + uint64_t(step));
        logits['q' - 'a'] = 50;
        std::vector<DecodeItem> items = {item(1, logits, params(temperature, 0, 1.0, seed), history, &rng)};
        items[0].constraint = state.get();
        items[0].tokens_left = 6 - step;
        decoder_->select(items);
        ASSERT_EQ(items[0].tokens.size(), 1u);
        const int32_t t = items[0].tokens[0];
        EXPECT_FALSE(items[0].constraint_dead_end);
        if (t == v.end_tokens[0]) break;
        out += v.pieces[size_t(t)];
        history.push_back(t);
      }
      EXPECT_TRUE(state->finished()) << "the decoder did not advance the constraint (output '" << out << "')";
      EXPECT_NE(std::find(choices.begin(), choices.end(), out), choices.end()) << "'" << out << "' is no choice";
    }
  }
}

TEST_P(DecoderConformance, TemperatureZeroPicksTheArgmax) {
  for (int64_t vocab : {2, 512, 1001}) {
    for (uint64_t seed = 1; seed <= 20; ++seed) {
      const auto logits = random_floats(size_t(vocab), seed * 977 + uint64_t(vocab), -10, 10);
      uint64_t rng = seed;
      const std::vector<int32_t> history = {1, 2, 3};
      std::vector<DecodeItem> items = {item(1, logits, params(0.0), history, &rng)};
      const auto out = select(items);
      ASSERT_FALSE(out[0].empty());
      EXPECT_EQ(out[0][0], argmax(logits)) << "vocab " << vocab << " seed " << seed;
    }
  }
}

TEST_P(DecoderConformance, TopKOneIsGreedyAtAnyTemperature) {
  for (double t : {0.3, 1.0, 5.0}) {
    for (uint64_t seed = 1; seed <= 10; ++seed) {
      const auto logits = random_floats(1001, seed * 131, -3, 3);
      uint64_t rng = seed;
      std::vector<DecodeItem> items = {item(1, logits, params(t, 1, 1.0, seed), {}, &rng)};
      const auto out = select(items);
      ASSERT_FALSE(out[0].empty());
      EXPECT_EQ(out[0][0], argmax(logits)) << "temperature " << t << " seed " << seed;
    }
  }
}

// Runs `steps` steps for sequences with the given seeds, batching them as `batches` says (per step,
// which sequences go together and in what order); logits depend only on (sequence, step).
std::map<SeqId, std::vector<int32_t>> generate(Decoder& d, const SamplingParams& base,
                                               const std::map<SeqId, uint64_t>& seeds, int steps,
                                               const std::vector<std::vector<SeqId>>& batches,
                                               int64_t vocab = 1001, bool flat = false) {
  std::map<SeqId, std::vector<int32_t>> out;
  std::map<SeqId, uint64_t> rng;
  for (const auto& [id, s] : seeds) rng[id] = s;
  for (int step = 0; step < steps; ++step) {
    for (const auto& batch : batches) {
      std::vector<std::vector<float>> logits;
      for (SeqId id : batch) {
        logits.push_back(flat ? std::vector<float>(size_t(vocab), 0.0f)
                              : random_floats(size_t(vocab), id * 10007 + uint64_t(step), -4, 4));
      }
      std::vector<DecodeItem> items;
      for (size_t i = 0; i < batch.size(); ++i) {
        SamplingParams p = base;
        p.seed = seeds.at(batch[i]);
        items.push_back(item(batch[i], logits[i], p, out[batch[i]], &rng[batch[i]]));
      }
      d.select(items);
      for (size_t i = 0; i < batch.size(); ++i) {
        EXPECT_EQ(items[i].tokens.size(), 1u) << "a plain step (no drafts) chooses one token";
        for (int32_t t : items[i].tokens) {
          EXPECT_GE(t, 0);
          EXPECT_LT(t, vocab);
          out[batch[i]].push_back(t);
        }
      }
    }
  }
  return out;
}

TEST_P(DecoderConformance, SameSeedSameTokensWhateverTheBatch) {
  const std::map<SeqId, uint64_t> seeds = {{1, 42}, {2, 7}, {3, 42}};
  for (const SamplingParams& p : {params(1.0), params(0.8, 50), params(1.2, 0, 0.9)}) {
    SCOPED_TRACE("temperature " + std::to_string(p.temperature) + " top_k " + std::to_string(p.top_k) + " top_p " +
                 std::to_string(p.top_p));
    const auto together = generate(*decoder_, p, seeds, 24, {{1, 2, 3}});
    const auto reordered = generate(*decoder_, p, seeds, 24, {{3, 1}, {2}});
    const auto alone = generate(*decoder_, p, seeds, 24, {{2}, {1}, {3}});
    EXPECT_EQ(together, reordered);
    EXPECT_EQ(together, alone);
  }
}

TEST_P(DecoderConformance, DifferentSeedsDifferOnAFlatDistribution) {
  const auto out = generate(*decoder_, params(1.0), {{1, 1}, {2, 2}}, 20, {{1, 2}}, 1001, /*flat=*/true);
  EXPECT_NE(out.at(1), out.at(2)) << "seeds 1 and 2 gave the same 20 tokens out of 1001 equally likely ones";
  // A flat distribution should not keep producing one token either.
  EXPECT_GT(std::set<int32_t>(out.at(1).begin(), out.at(1).end()).size(), 10u);
}

TEST_P(DecoderConformance, TokensStayInsideTheVocabulary) {
  // Filters at their edges: tiny top_p keeps the top token, huge top_k is clamped, min_p, penalty.
  std::vector<SamplingParams> all = {params(1.0, 0, 1e-9), params(2.0, 100000), params(0.5, 3, 0.5)};
  SamplingParams mp = params(1.0);
  mp.min_p = 0.9;
  all.push_back(mp);
  SamplingParams rep = params(0.7);
  rep.repetition_penalty = 1.3;
  all.push_back(rep);
  for (const SamplingParams& p : all) {
    for (int64_t vocab : {1, 2, 97}) {
      generate(*decoder_, p, {{1, 3}, {2, 4}}, 8, {{1, 2}}, vocab);
    }
  }
}

// Greedy choice among crafted logits for a history whose first `prompt_tokens` are the prompt.
int32_t greedy_with(Decoder& d, SamplingParams p, const std::vector<float>& logits, const std::vector<int32_t>& history,
                    int64_t prompt_tokens) {
  p.temperature = 0;
  uint64_t rng = 1;
  std::vector<DecodeItem> items = {item(1, logits, p, history, &rng)};
  items[0].prompt_tokens = prompt_tokens;
  d.select(items);
  EXPECT_FALSE(items[0].tokens.empty());
  return items[0].tokens.empty() ? -1 : items[0].tokens[0];
}

TEST_P(DecoderConformance, RepetitionPenaltyCountsPromptAndOutput) {
  SamplingParams p = params(0.0);
  p.repetition_penalty = 1.5;
  // Token 0 leads by a little; seen once (in the prompt), 2.0 / 1.5 falls below 1.8.
  EXPECT_EQ(greedy_with(*decoder_, p, {2.0f, 1.8f, -1.0f}, {}, 0), 0);
  EXPECT_EQ(greedy_with(*decoder_, p, {2.0f, 1.8f, -1.0f}, {0}, 1), 1);
  EXPECT_EQ(greedy_with(*decoder_, p, {2.0f, 1.8f, -1.0f}, {5, 0}, 1), 1);
  // Negative logits are multiplied: -1.0 x 1.5 = -1.5 now loses to -1.2.
  EXPECT_EQ(greedy_with(*decoder_, p, {-1.0f, -1.2f}, {0}, 1), 1);
  p.repetition_penalty = 1.0;
  EXPECT_EQ(greedy_with(*decoder_, p, {2.0f, 1.8f, -1.0f}, {0}, 1), 0);
}

TEST_P(DecoderConformance, FrequencyAndPresencePenaltiesCountOnlyGeneratedTokens) {
  SamplingParams f = params(0.0);
  f.frequency_penalty = 0.3;
  const std::vector<float> logits = {2.0f, 1.5f};
  // In the prompt only: no penalty, however often.
  EXPECT_EQ(greedy_with(*decoder_, f, logits, {0, 0, 0, 0}, 4), 0);
  // Generated once: 2.0 - 0.3 = 1.7 still leads; twice: 1.4 no longer.
  EXPECT_EQ(greedy_with(*decoder_, f, logits, {1, 0}, 1), 0);
  EXPECT_EQ(greedy_with(*decoder_, f, logits, {1, 0, 0}, 1), 1);
  SamplingParams pr = params(0.0);
  pr.presence_penalty = 0.6;
  // Presence counts once, however often: 2.0 - 0.6 = 1.4 < 1.5.
  EXPECT_EQ(greedy_with(*decoder_, pr, logits, {0, 0, 0}, 3), 0);
  EXPECT_EQ(greedy_with(*decoder_, pr, logits, {1, 0}, 1), 1);
  pr.presence_penalty = 0.4;
  EXPECT_EQ(greedy_with(*decoder_, pr, logits, {1, 0, 0, 0, 0}, 1), 0);
  // A negative penalty favours repeats.
  SamplingParams neg = params(0.0);
  neg.presence_penalty = -1.0;
  EXPECT_EQ(greedy_with(*decoder_, neg, {1.0f, 1.5f}, {0}, 0), 0);
}

TEST_P(DecoderConformance, LogprobsAreTheLogSoftmaxOfTheRawLogits) {
  const auto logits = random_floats(97, 11, -5, 5);
  double mx = *std::max_element(logits.begin(), logits.end()), sum = 0;
  for (float v : logits) sum += std::exp(double(v) - mx);
  auto logprob = [&](int32_t t) { return double(logits[size_t(t)]) - mx - std::log(sum); };
  for (double t : {0.0, 0.7}) {
    SamplingParams p = params(t, 10, 0.9, 3);
    p.logprobs = 4;
    p.repetition_penalty = 1.2;  // penalties and temperature do not change the reported logprobs
    uint64_t rng = 3;
    const std::vector<int32_t> history = {5, 6};
    std::vector<DecodeItem> items = {item(1, logits, p, history, &rng)};
    decoder_->select(items);
    const DecodeItem& it = items[0];
    ASSERT_FALSE(it.tokens.empty());
    ASSERT_EQ(it.logprobs.size(), it.tokens.size());
    ASSERT_EQ(it.top_logprobs.size(), it.tokens.size());
    EXPECT_NEAR(it.logprobs[0], logprob(it.tokens[0]), 1e-5);
    ASSERT_EQ(it.top_logprobs[0].size(), 4u);
    std::vector<int32_t> order(logits.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
    for (size_t k = 0; k < 4; ++k) {
      EXPECT_EQ(it.top_logprobs[0][k].token, order[k]);
      EXPECT_NEAR(it.top_logprobs[0][k].logprob, logprob(order[k]), 1e-5);
    }
  }
  // logprobs 0: only the chosen token's comes back; -1 (the default): none at all.
  uint64_t rng = 1;
  SamplingParams chosen_only = params(0.0);
  chosen_only.logprobs = 0;
  std::vector<DecodeItem> items = {item(1, logits, chosen_only, {}, &rng)};
  decoder_->select(items);
  EXPECT_EQ(items[0].logprobs.size(), items[0].tokens.size());
  EXPECT_NEAR(items[0].logprobs[0], logprob(items[0].tokens[0]), 1e-5);
  EXPECT_TRUE(items[0].top_logprobs.empty());
  items = {item(1, logits, params(0.0), {}, &rng)};
  decoder_->select(items);
  EXPECT_FALSE(items[0].tokens.empty());
  EXPECT_TRUE(items[0].logprobs.empty());
  EXPECT_TRUE(items[0].top_logprobs.empty());
}

INSTANTIATE_TEST_SUITE_P(Decoders, DecoderConformance, testing::ValuesIn(plugin_names(ComponentKind::decoder)),
                         param_name);

}  // namespace
}  // namespace tessera
