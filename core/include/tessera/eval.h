// Accuracy measurements of a pipeline, alone or against a baseline pipeline.
//
// Perplexity is measured the way the llama.cpp reference does: the token stream is cut into chunks
// of ctx tokens, each chunk starts with BOS, and the negative log-likelihood is averaged over the
// second half of every chunk.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/pipeline.h"

namespace tessera {

struct PerplexityResult {
  double perplexity = 0;
  double mean_nll = 0;
  int64_t chunks = 0;
  int64_t scored_tokens = 0;
  double seconds = 0;
  std::vector<int32_t> predictions;  // argmax at every scored position (for teacher-forced agreement)
};

// A text's ids as perplexity reads them: BOS first (where the vocabulary has one, whatever its
// add_bos_token says: every chunk starts with it), no EOS.
std::vector<int32_t> perplexity_tokens(const Tokenizer& tokenizer, std::string_view text);

// `tokens` is the tokenised text with BOS; throws Error when it is shorter than one chunk.
PerplexityResult perplexity(Pipeline& pipeline, std::span<const int32_t> tokens, int64_t ctx);

// Share of positions where two runs over the same text predict the same next token (teacher
// forcing: both see the true text, so one early difference does not spoil the rest).
double teacher_forced_agreement(const PerplexityResult& a, const PerplexityResult& b);

// KL(baseline ‖ pipeline) of the next-token distributions, in nats, at perplexity's scored
// positions (both pipelines reading the true text): how far quantization moves the whole
// distribution, which perplexity (the true token's probability alone) can hide.
struct KlDivergence {
  double mean = 0;
  double p99 = 0;  // the 99th percentile over positions
  double max = 0;
  int64_t positions = 0;
};

struct BaselineComparison {
  PerplexityResult pipeline, baseline;  // as perplexity() gives them
  KlDivergence kl;
};

// perplexity() of both pipelines and the KL divergence between them, in one pass over the chunks.
BaselineComparison compare_with_baseline(Pipeline& pipeline, Pipeline& baseline, std::span<const int32_t> tokens,
                                         int64_t ctx);

struct GreedyAgreement {
  double share = 0;                 // identical tokens before the first divergence / tokens generated
  std::vector<int64_t> prefix;      // per prompt: tokens identical before the first divergence
  int64_t tokens_per_prompt = 0;
};

// Greedy generation of `n` tokens for every prompt with both pipelines (each prompt alone).
GreedyAgreement greedy_agreement(Pipeline& pipeline, Pipeline& baseline,
                                 const std::vector<std::vector<int32_t>>& prompts, int64_t n);
// Throws Error, naming the limit, where a prompt and `n` tokens exceed either pipeline's sequence
// bound (greedy_agreement checks it too; a caller checks it before work that would be lost).
void check_greedy_agreement_fits(const Pipeline& pipeline, const Pipeline& baseline,
                                 const std::vector<std::vector<int32_t>>& prompts, int64_t n);

// Leave-one-out sensitivity of a quantized pipeline's weights: for each weight its quantizer
// quantized (a format not f32/f16/bf16), or each group of them, the perplexity with that weight
// (group) alone added to the quantizer's keep_float — which tensors are worth keeping in float,
// and at what memory cost.
enum class SensitivityGroup {
  tensor,  // each weight alone: "blk.0.ffn_up.weight"
  kind,    // the same weight of every block: "*.ffn_up.weight" (output.weight alone)
  block,   // every weight of a block: "blk.0.*" (output.weight alone)
};

struct TensorSensitivity {
  std::string tensor;              // the keep_float pattern scored: a weight's name or a group's pattern
  std::string format;              // its weights' formats in the pipeline, e.g. "int4/g32/asym+int8"
  int64_t weights = 0;             // how many quantized weights the pattern keeps in float
  double perplexity = 0;           // the pipeline's with this weight kept in float
  double kl_mean = -1;             // its mean KL divergence from the baseline, with one (else -1)
  int64_t extra_weight_bytes = 0;  // what keeping it in float adds to the resident weights
};

// `built` is the model of the pipeline built from spec and options (which weights it quantized, its
// resident bytes). Builds the pipeline again once per quantized weight or group (each build loads and
// quantizes the model) and scores it on `tokens` as perplexity() does — with a baseline, as
// compare_with_baseline() does, which adds the KL divergence (steadier than perplexity on a short
// text) at the cost of the baseline's forward passes; `on_tensor` (optional) hears each result as
// it comes, with its index and the count. Throws Error when the quantizer has no keep_float
// parameter.
std::vector<TensorSensitivity> keep_float_sensitivity(
    const PipelineSpec& spec, const Registry& registry, const PipelineOptions& options, const Model& built,
    std::span<const int32_t> tokens, int64_t ctx, SensitivityGroup group = SensitivityGroup::tensor,
    Pipeline* baseline = nullptr,
    const std::function<void(const TensorSensitivity&, size_t index, size_t count)>& on_tensor = {});

}  // namespace tessera
