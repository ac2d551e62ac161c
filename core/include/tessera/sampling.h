// The arithmetic of sampling, shared by every decoder so that they agree to the bit: penalties, the
// filtered distribution a sampler draws from, the per-sequence random stream and log-probabilities.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tessera/decoder.h"
#include "tessera/params.h"

namespace tessera {

// The sampling parameters a decoder plugin declares (temperature, top_k, top_p, min_p, the three
// penalties, seed) and reads back as its defaults.
std::vector<ParamSpec> sampling_param_specs();
SamplingParams sampling_params_from(const Params& p);

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

// Speculative rejection sampling at one draft position: the draft x was drawn from q (empty q: x was
// proposed deterministically, a point mass), the target's distribution there is p. Accepts x with
// probability min(1, p(x)/q(x)); otherwise draws from max(0, p - q) normalised. The token returned
// is then distributed exactly as p. `scratch` is reused.
struct DraftVerdict {
  int32_t token = 0;
  bool accepted = false;
};
DraftVerdict accept_or_resample(std::span<const Candidate> p, std::span<const Candidate> q, int32_t x, uint64_t& rng,
                                std::vector<Candidate>& scratch);

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
  // `logits` with every token item.constraint disallows set to -infinity (a copy), or `logits`
  // itself without a constraint. `tokens_left` as in ConstraintState::fill_mask. Sets
  // item.constraint_dead_end when nothing is allowed.
  const float* constrained(DecodeItem& item, const float* logits, int64_t tokens_left);
  // Advances item.constraint by a chosen token.
  static void advance(DecodeItem& item, int32_t token);
  // pick() + record() for item.logits, within item.constraint.
  void select_one(DecodeItem& item);

 private:
  std::vector<float> penalized_;
  std::vector<float> masked_;
  std::vector<uint32_t> mask_;
  std::vector<Candidate> dist_;
};

}  // namespace tessera
