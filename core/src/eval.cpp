#include "tessera/eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "tessera/engine.h"
#include "tessera/error.h"
#include "tessera/registry.h"

namespace tessera {

namespace {

// The number of whole chunks of `ctx` tokens in `tokens`, after checking ctx against the pipeline.
int64_t chunk_count(Pipeline& pipeline, std::span<const int32_t> tokens, int64_t ctx) {
  if (ctx < 4) throw Error("perplexity: --ctx must be at least 4, got " + std::to_string(ctx));
  if (ctx > pipeline.max_sequence_tokens()) {
    throw Error("perplexity: --ctx " + std::to_string(ctx) + " exceeds " + pipeline.sequence_limit_text());
  }
  const int64_t chunks = static_cast<int64_t>(tokens.size()) / ctx;
  if (chunks == 0) {
    throw Error("perplexity: the text has " + std::to_string(tokens.size()) +
                " tokens (BOS included), fewer than one chunk of " + std::to_string(ctx) +
                " (--ctx): give a longer text or a smaller --ctx");
  }
  return chunks;
}

// Chunk c's logits (ctx rows): its tokens with BOS first, in a sequence of its own.
void chunk_logits(Pipeline& pipeline, std::span<const int32_t> tokens, int64_t c, int64_t ctx,
                  std::vector<float>& logits) {
  std::lock_guard running(pipeline.step_mutex());  // its weights may serve another pipeline too
  Cache& cache = pipeline.cache();
  const SeqId seq = ~SeqId(0);  // reserved id, never handed to requests
  std::vector<int32_t> chunk(tokens.begin() + c * ctx, tokens.begin() + (c + 1) * ctx);
  chunk[0] = pipeline.tokenizer().bos();
  CacheRequest req;
  req.seq = seq;
  req.total_tokens = ctx;
  req.tokens = chunk;
  req.retain = false;
  auto plan = cache.plan(std::span<const CacheRequest>(&req, 1));
  if (!plan) throw Error("perplexity: the cache cannot hold one chunk of " + std::to_string(ctx) + " tokens");
  cache.commit(*plan);
  ForwardSeq fs{seq, chunk, 0, ctx};
  pipeline.model().forward(std::span<const ForwardSeq>(&fs, 1), pipeline.attention(), cache, logits);
  cache.release(seq);
}

// log Σ exp(row): the softmax's normalizer, max first (a float, as the reference does).
double log_sum_exp(const float* row, int64_t vocab) {
  const float mx = *std::max_element(row, row + vocab);
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - mx);
  return std::log(sum) + mx;
}

// log_sum_exp of a row, refused where it is not finite: NaN or infinite logits (an overflow
// upstream) would make every figure NaN, and a KL divergence of max(0, NaN) = 0 would claim that
// two pipelines agree.
double finite_log_sum_exp(const float* row, int64_t vocab, int64_t position, const std::string& whose) {
  const double lse = log_sum_exp(row, vocab);
  if (!std::isfinite(lse)) {
    throw Error("perplexity: the " + whose + "logits are not finite (NaN or infinity) after token " +
                std::to_string(position) + " of the text: its weights or activations overflow");
  }
  return lse;
}

// Perplexity's running sums over scored positions.
struct Scores {
  double nll = 0;
  std::vector<int32_t> predictions;  // argmax at each position

  void add(const float* row, int64_t vocab, int32_t target, double lse) {
    nll += lse - row[target];
    predictions.push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
  }
  PerplexityResult result(int64_t chunks, double seconds) {
    PerplexityResult r;
    r.chunks = chunks;
    r.scored_tokens = int64_t(predictions.size());
    r.mean_nll = nll / double(r.scored_tokens);
    r.perplexity = std::exp(r.mean_nll);
    r.seconds = seconds;
    r.predictions = std::move(predictions);
    return r;
  }
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

PerplexityResult perplexity(Pipeline& pipeline, std::span<const int32_t> tokens, int64_t ctx) {
  const int64_t vocab = pipeline.model().config().vocab;
  const int64_t chunks = chunk_count(pipeline, tokens, ctx);
  const auto start = std::chrono::steady_clock::now();
  std::vector<float> logits;
  Scores scores;
  for (int64_t c = 0; c < chunks; ++c) {
    chunk_logits(pipeline, tokens, c, ctx, logits);
    for (int64_t j = ctx / 2; j < ctx - 1; ++j) {
      const float* row = logits.data() + j * vocab;
      const double lse = finite_log_sum_exp(row, vocab, c * ctx + j, "model's ");
      scores.add(row, vocab, tokens[size_t(c * ctx + j + 1)], lse);
    }
  }
  return scores.result(chunks, seconds_since(start));
}

BaselineComparison compare_with_baseline(Pipeline& pipeline, Pipeline& baseline, std::span<const int32_t> tokens,
                                         int64_t ctx) {
  const int64_t vocab = pipeline.model().config().vocab;
  if (baseline.model().config().vocab != vocab) {
    throw Error("perplexity: the pipelines' vocabularies differ (" + std::to_string(vocab) + " vs " +
                std::to_string(baseline.model().config().vocab) + " tokens)");
  }
  const int64_t chunks = chunk_count(pipeline, tokens, ctx);
  chunk_count(baseline, tokens, ctx);  // the baseline's sequence bound too
  std::vector<float> logits, base_logits;
  Scores scores, base_scores;
  std::vector<double> kl;  // per position
  double seconds = 0, base_seconds = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    auto t = std::chrono::steady_clock::now();
    chunk_logits(pipeline, tokens, c, ctx, logits);
    seconds += seconds_since(t);
    t = std::chrono::steady_clock::now();
    chunk_logits(baseline, tokens, c, ctx, base_logits);
    base_seconds += seconds_since(t);
    for (int64_t j = ctx / 2; j < ctx - 1; ++j) {
      const float* row = logits.data() + j * vocab;
      const float* base_row = base_logits.data() + j * vocab;
      const double lse = finite_log_sum_exp(row, vocab, c * ctx + j, "pipeline's "),
                   base_lse = finite_log_sum_exp(base_row, vocab, c * ctx + j, "baseline's ");
      const int32_t target = tokens[size_t(c * ctx + j + 1)];
      scores.add(row, vocab, target, lse);
      base_scores.add(base_row, vocab, target, base_lse);
      double d = 0;
      for (int64_t v = 0; v < vocab; ++v) {
        const double base_lp = double(base_row[v]) - base_lse;
        d += std::exp(base_lp) * (base_lp - (double(row[v]) - lse));
      }
      kl.push_back(std::max(0.0, d));  // rounding can leave -1e-17 for equal distributions
    }
  }
  BaselineComparison r;
  r.pipeline = scores.result(chunks, seconds);
  r.baseline = base_scores.result(chunks, base_seconds);
  double sum = 0;
  for (const double d : kl) sum += d;
  r.kl.positions = int64_t(kl.size());
  r.kl.mean = sum / double(kl.size());
  std::sort(kl.begin(), kl.end());
  r.kl.p99 = kl[std::min(kl.size() - 1, size_t(0.99 * double(kl.size())))];
  r.kl.max = kl.back();
  return r;
}

double teacher_forced_agreement(const PerplexityResult& a, const PerplexityResult& b) {
  if (a.predictions.size() != b.predictions.size() || a.predictions.empty()) {
    throw Error("teacher-forced agreement needs two runs over the same text and chunk length (" +
                std::to_string(a.predictions.size()) + " vs " + std::to_string(b.predictions.size()) +
                " scored positions)");
  }
  int64_t same = 0;
  for (size_t i = 0; i < a.predictions.size(); ++i) same += a.predictions[i] == b.predictions[i];
  return double(same) / double(a.predictions.size());
}

namespace {

std::vector<int32_t> greedy(Pipeline& p, const std::vector<int32_t>& prompt, int64_t n) {
  Engine engine(p);
  GenerationRequest req;
  req.prompt = prompt;
  req.max_tokens = n;
  req.ignore_eos = true;  // compare the same number of tokens whatever each model ends with
  req.sampling = SamplingParams{};
  engine.submit(std::move(req));
  engine.run_until_idle();
  return engine.take_finished().at(0).tokens;
}

}  // namespace

std::vector<int32_t> perplexity_tokens(const Tokenizer& tokenizer, std::string_view text) {
  std::vector<int32_t> tokens = tokenizer.encode(text, false);
  if (tokenizer.bos() >= 0) tokens.insert(tokens.begin(), tokenizer.bos());
  return tokens;
}

void check_greedy_agreement_fits(const Pipeline& pipeline, const Pipeline& baseline,
                                 const std::vector<std::vector<int32_t>>& prompts, int64_t n) {
  // Both must generate all n tokens: one cut short by its sequence bound would count as disagreeing.
  for (const Pipeline* p : {&pipeline, &baseline}) {
    for (const auto& prompt : prompts) {
      if (int64_t(prompt.size()) + n > p->max_sequence_tokens()) {
        throw Error("greedy agreement: a prompt of " + std::to_string(prompt.size()) + " tokens and " +
                    std::to_string(n) + " generated tokens exceed " + p->sequence_limit_text() + " (" +
                    p->describe() + "); generate fewer tokens a prompt (eval --greedy-tokens, bench --accuracy-tokens) " +
                    "or give shorter prompts");
      }
    }
  }
}

GreedyAgreement greedy_agreement(Pipeline& pipeline, Pipeline& baseline,
                                 const std::vector<std::vector<int32_t>>& prompts, int64_t n) {
  check_greedy_agreement_fits(pipeline, baseline, prompts, n);
  GreedyAgreement g;
  g.tokens_per_prompt = n;
  int64_t same = 0, total = 0;
  for (const auto& prompt : prompts) {
    const auto a = greedy(pipeline, prompt, n);
    const auto b = greedy(baseline, prompt, n);
    int64_t k = 0;
    while (size_t(k) < a.size() && size_t(k) < b.size() && a[size_t(k)] == b[size_t(k)]) ++k;
    g.prefix.push_back(k);
    same += k;
    total += int64_t(std::max(a.size(), b.size()));
  }
  g.share = total > 0 ? double(same) / double(total) : 0.0;
  return g;
}

namespace {

// The keep_float pattern of a weight's group: its name (which matches it alone), "*.<kind>" for
// the same weight of every block, "blk.<n>.*" for its block; weights outside the blocks alone.
std::string sensitivity_pattern(const std::string& name, SensitivityGroup group) {
  if (group == SensitivityGroup::tensor || name.rfind("blk.", 0) != 0) return name;
  const size_t dot = name.find('.', 4);
  if (dot == std::string::npos) return name;
  return group == SensitivityGroup::kind ? "*" + name.substr(dot) : name.substr(0, dot) + ".*";
}

}  // namespace

std::vector<TensorSensitivity> keep_float_sensitivity(
    const PipelineSpec& spec, const Registry& registry, const PipelineOptions& options, const Model& built,
    std::span<const int32_t> tokens, int64_t ctx, SensitivityGroup group, Pipeline* baseline,
    const std::function<void(const TensorSensitivity&, size_t index, size_t count)>& on_tensor) {
  const ComponentSpec& quantizer = spec.components.at(ComponentKind::quantizer);  // every kind is present
  const std::string& plugin = quantizer.plugin;
  const PluginEntry* entry = registry.find(ComponentKind::quantizer, plugin);
  const auto keep_float = [](const ParamSpec& p) { return p.name == "keep_float"; };
  if (entry == nullptr || std::none_of(entry->params.begin(), entry->params.end(), keep_float)) {
    throw Error("keep_float sensitivity: quantizer '" + plugin +
                "' has no keep_float parameter (scan a pipeline whose quantizer quantizes: int8, int4 or gguf)");
  }
  // The patterns to score, in load order of their first weight.
  std::vector<TensorSensitivity> quantized;
  for (size_t i = 0; i < built.linear_names().size(); ++i) {
    const std::string& format = built.linear_formats()[i];
    if (Model::is_float_format(format)) continue;
    const std::string pattern = sensitivity_pattern(built.linear_names()[i], group);
    const auto same = [&](const TensorSensitivity& t) { return t.tensor == pattern; };
    if (auto it = std::find_if(quantized.begin(), quantized.end(), same); it != quantized.end()) {
      ++it->weights;
      // A group of several formats lists each once ("int4/g32/asym+int8").
      const std::string listed = "+" + it->format + "+";
      if (listed.find("+" + format + "+") == std::string::npos) it->format += "+" + format;
    } else {
      quantized.push_back({pattern, format, 1});
    }
  }
  nlohmann::json kept = quantizer.params.value("keep_float", nlohmann::json::array());
  if (kept.is_string()) kept = nlohmann::json::array({kept});  // one pattern, as a string_list may be given
  for (size_t i = 0; i < quantized.size(); ++i) {
    TensorSensitivity& t = quantized[i];
    PipelineSpec one = spec;
    nlohmann::json& keep = one.components.at(ComponentKind::quantizer).params["keep_float"];
    keep = kept;
    keep.push_back(t.tensor);
    auto pipeline = Pipeline::build(one, registry, options);
    if (baseline != nullptr) {
      const BaselineComparison compared = compare_with_baseline(*pipeline, *baseline, tokens, ctx);
      t.perplexity = compared.pipeline.perplexity;
      t.kl_mean = compared.kl.mean;
    } else {
      t.perplexity = perplexity(*pipeline, tokens, ctx).perplexity;
    }
    t.extra_weight_bytes = int64_t(pipeline->model().weight_bytes()) - int64_t(built.weight_bytes());
    if (on_tensor) on_tensor(t, i, quantized.size());
  }
  return quantized;
}

}  // namespace tessera
