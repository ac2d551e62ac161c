// Decoder: turns logits into tokens (the decoding strategy).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tessera/cache.h"
#include "tessera/constraint.h"

namespace tessera {

class Speculator;

struct SamplingParams {
  double temperature = 0.0;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  double top_p = 1.0;
  double min_p = 0.0;
  double repetition_penalty = 1.0;  // divides positive logits of seen tokens (1 = off)
  double frequency_penalty = 0.0;   // minus penalty x count of each generated token (OpenAI style)
  double presence_penalty = 0.0;    // minus penalty once for each token already generated
  int64_t logprobs = -1;            // -1 = none; 0 = each chosen token's; N = and its N likeliest alternatives
  uint64_t seed = 0;
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;  // natural log of the probability under the model (before sampling filters)
};

// Throws tessera::Error naming the field and value when out of range.
void validate_sampling(const SamplingParams& p);

// One sequence's choice this step.
struct DecodeItem {
  SeqId seq = 0;
  const float* logits = nullptr;  // host memory, [vocab]
  int64_t vocab = 0;
  SamplingParams params;
  std::span<const int32_t> history;  // prompt and generated tokens so far
  // Speculative verification: tokens proposed after `history`. `logits` then holds draft.size() + 1
  // rows, row j scoring the token after history + draft[0, j). The decoder returns in `tokens` the
  // accepted leading drafts and one more token (a correction or a bonus). Empty for plain decoding.
  std::span<const int32_t> draft;
  int64_t prompt_tokens = 0;         // history[0, prompt_tokens) is the prompt (penalties count the rest)
  uint64_t* rng_state = nullptr;     // per sequence: same seed, same output, whatever the batch
  // Structured output: the decoder picks only tokens the constraint's mask allows (per row, drafts
  // included) and advances it by every token it returns. tokens_left: the sequence's budget,
  // counting this step's first token.
  ConstraintState* constraint = nullptr;
  int64_t tokens_left = 0;
  bool constraint_dead_end = false;  // out: the constraint allowed no token at all (the request fails)
  double mask_seconds = 0;           // out: time spent computing and applying the constraint's masks
  std::vector<int32_t> tokens;       // out: the chosen token(s)
  std::vector<float> logprobs;       // out: log-probability of each chosen token
  std::vector<std::vector<TokenLogprob>> top_logprobs;  // out: params.logprobs best per chosen token
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Sampling settings from the pipeline file, used where a request gives none.
  virtual SamplingParams default_params() const = 0;
  virtual void select(std::span<DecodeItem> items) = 0;
  // Decoders that draft tokens (speculative decoding) return their drafting side, which the pipeline
  // attaches and the engine drives; nullptr for the others.
  virtual Speculator* speculator() { return nullptr; }
};

}  // namespace tessera
