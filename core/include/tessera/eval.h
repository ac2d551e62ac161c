// Perplexity, measured the way the llama.cpp reference does: the token stream is cut into chunks
// of ctx tokens, each chunk starts with BOS, and the negative log-likelihood is averaged over the
// second half of every chunk.
#pragma once

#include <cstdint>
#include <span>

#include "tessera/pipeline.h"

namespace tessera {

struct PerplexityResult {
  double perplexity = 0;
  double mean_nll = 0;
  int64_t chunks = 0;
  int64_t scored_tokens = 0;
  double seconds = 0;
};

// `tokens` is the tokenised text with BOS; throws Error when it is shorter than one chunk.
PerplexityResult perplexity(Pipeline& pipeline, std::span<const int32_t> tokens, int64_t ctx);

}  // namespace tessera
