// The arithmetic of sampling, shared by every decoder so that they agree to the bit: penalties, the
// filtered distribution a sampler draws from, the per-sequence random stream and log-probabilities.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tessera/decoder.h"

namespace tessera {

// splitmix64: tiny, statistically sound, and its whole state is one integer kept per sequence.
uint64_t next_random(uint64_t& state);
// Uniform in [0, 1).
double uniform01(uint64_t& state);

// True when any of the repetition, frequency or presence penalties is active.
bool has_penalties(const SamplingParams& p);

// Applies the penalties in place. repetition_penalty (llama.cpp/HF) divides positive logits and
// multiplies negative ones of every token seen in `history` (prompt included); frequency_penalty and
// presence_penalty (OpenAI) subtract count x frequency + presence for each token generated so far,
// i.e. in history[prompt_tokens..].
void apply_penalties(const SamplingParams& p, std::span<const int32_t> history, int64_t prompt_tokens,
                     std::span<float> logits);

struct Candidate {
  int32_t token = 0;
  double p = 0;
};

// The distribution a sampler draws from, after temperature, top-k, min-p and top-p: candidates in
// decreasing probability summing to 1. Temperature 0 gives the argmax with probability 1 (ties go to
// the lowest id). `out` is reused to avoid allocations.
void sampling_distribution(const SamplingParams& p, const float* logits, int64_t vocab, std::vector<Candidate>& out);

// Draws one token from `dist` (probabilities summing to about 1) with one uniform from `rng`.
int32_t draw(std::span<const Candidate> dist, uint64_t& rng);

int32_t argmax(const float* logits, int64_t vocab);

// Log-probabilities from the raw model logits (log-softmax over the whole vocabulary, before
// penalties, temperature and filters, as OpenAI and vLLM report them): the chosen token's, and when
// top_n > 0 the top_n most likely tokens in decreasing order.
void token_logprobs(const float* logits, int64_t vocab, int32_t chosen, int64_t top_n, float* chosen_logprob,
                    std::vector<TokenLogprob>* top);

// Per-decoder scratch and the one-token step every decoder shares.
class TokenSampler {
 public:
  // `logits` with the penalties of `p` for `history` applied (a copy when any is active).
  const float* penalized(const SamplingParams& p, const float* logits, int64_t vocab,
                         std::span<const int32_t> history, int64_t prompt_tokens);
  // Picks one token from `logits` (raw) for a sequence with this history and draws from `rng`.
  int32_t pick(const SamplingParams& p, const float* logits, int64_t vocab, std::span<const int32_t> history,
               int64_t prompt_tokens, uint64_t& rng);
  // Appends `token` to item.tokens with its log-probability under `logits` (raw) and, when
  // item.params.logprobs > 0, the top alternatives.
  static void record(DecodeItem& item, const float* logits, int32_t token);
  // pick() + record() for item.logits.
  void select_one(DecodeItem& item);

 private:
  std::vector<float> penalized_;
  std::vector<Candidate> dist_;
};

}  // namespace tessera
