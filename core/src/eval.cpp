#include "tessera/eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "tessera/engine.h"
#include "tessera/error.h"

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
    throw Error("perplexity: the text has " + std::to_string(tokens.size()) + " tokens, fewer than one chunk of " +
                std::to_string(ctx) + " (--ctx): give a longer text or a smaller --ctx");
  }
  return chunks;
}

// Chunk c's logits (ctx rows): its tokens with BOS first, in a sequence of its own.
void chunk_logits(Pipeline& pipeline, std::span<const int32_t> tokens, int64_t c, int64_t ctx,
                  std::vector<float>& logits) {
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

// log-softmax of one row of logits into `out`.
void log_softmax(const float* row, int64_t vocab, std::vector<double>& out) {
  const float mx = *std::max_element(row, row + vocab);
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - mx);
  const double log_sum = std::log(sum) + mx;
  out.resize(size_t(vocab));
  for (int64_t v = 0; v < vocab; ++v) out[size_t(v)] = double(row[v]) - log_sum;
}

}  // namespace

PerplexityResult perplexity(Pipeline& pipeline, std::span<const int32_t> tokens, int64_t ctx) {
  const int64_t vocab = pipeline.model().config().vocab;
  const int64_t chunks = chunk_count(pipeline, tokens, ctx);
  const auto start = std::chrono::steady_clock::now();
  const int64_t first = ctx / 2;
  std::vector<float> logits;
  double nll = 0;
  int64_t count = 0;
  std::vector<int32_t> predictions;
  for (int64_t c = 0; c < chunks; ++c) {
    chunk_logits(pipeline, tokens, c, ctx, logits);
    for (int64_t j = first; j < ctx - 1; ++j) {
      const float* row = logits.data() + j * vocab;
      float mx = row[0];
      for (int64_t v = 1; v < vocab; ++v) mx = std::max(mx, row[v]);
      double sum = 0;
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - mx);
      const int32_t target = tokens[static_cast<size_t>(c * ctx + j + 1)];
      nll += std::log(sum) + mx - row[target];
      ++count;
      predictions.push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
    }
  }
  PerplexityResult r;
  r.chunks = chunks;
  r.scored_tokens = count;
  r.mean_nll = nll / double(count);
  r.perplexity = std::exp(r.mean_nll);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.predictions = std::move(predictions);
  return r;
}

KlDivergence kl_divergence(Pipeline& pipeline, Pipeline& baseline, std::span<const int32_t> tokens, int64_t ctx) {
  const int64_t vocab = pipeline.model().config().vocab;
  if (baseline.model().config().vocab != vocab) {
    throw Error("KL divergence: the pipelines' vocabularies differ (" + std::to_string(vocab) + " vs " +
                std::to_string(baseline.model().config().vocab) + " tokens)");
  }
  const int64_t chunks = std::min(chunk_count(pipeline, tokens, ctx), chunk_count(baseline, tokens, ctx));
  std::vector<float> logits, base_logits;
  std::vector<double> lp, base_lp, per_position;
  for (int64_t c = 0; c < chunks; ++c) {
    chunk_logits(pipeline, tokens, c, ctx, logits);
    chunk_logits(baseline, tokens, c, ctx, base_logits);
    for (int64_t j = ctx / 2; j < ctx - 1; ++j) {
      log_softmax(logits.data() + j * vocab, vocab, lp);
      log_softmax(base_logits.data() + j * vocab, vocab, base_lp);
      double kl = 0;
      for (int64_t v = 0; v < vocab; ++v) kl += std::exp(base_lp[size_t(v)]) * (base_lp[size_t(v)] - lp[size_t(v)]);
      per_position.push_back(std::max(0.0, kl));  // rounding can leave -1e-17 for equal distributions
    }
  }
  KlDivergence k;
  k.positions = int64_t(per_position.size());
  double sum = 0;
  for (const double d : per_position) sum += d;
  k.mean = sum / double(k.positions);
  std::sort(per_position.begin(), per_position.end());
  k.p99 = per_position[std::min(per_position.size() - 1, size_t(0.99 * double(per_position.size())))];
  k.max = per_position.back();
  return k;
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

GreedyAgreement greedy_agreement(Pipeline& pipeline, Pipeline& baseline,
                                 const std::vector<std::vector<int32_t>>& prompts, int64_t n) {
  // Both must generate all n tokens: one cut short by its sequence bound would count as disagreeing.
  for (Pipeline* p : {&pipeline, &baseline}) {
    for (const auto& prompt : prompts) {
      if (int64_t(prompt.size()) + n > p->max_sequence_tokens()) {
        throw Error("greedy agreement: a prompt of " + std::to_string(prompt.size()) + " tokens and " +
                    std::to_string(n) + " generated tokens exceed " + p->sequence_limit_text() + " (" +
                    p->describe() + "); generate fewer tokens a prompt (eval --greedy-tokens, bench --accuracy-tokens) " +
                    "or give shorter prompts");
      }
    }
  }
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

}  // namespace tessera
