#include "tessera/eval.h"

#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "tessera/error.h"

namespace tessera {

PerplexityResult perplexity(Pipeline& pipeline, std::span<const int32_t> tokens, int64_t ctx) {
  Model& model = pipeline.model();
  Cache& cache = pipeline.cache();
  const int64_t vocab = model.config().vocab;
  if (ctx < 4) throw Error("perplexity: --ctx must be at least 4, got " + std::to_string(ctx));
  if (ctx > model.config().context_length) {
    throw Error("perplexity: --ctx " + std::to_string(ctx) + " exceeds the model's context of " +
                std::to_string(model.config().context_length));
  }
  const int64_t chunks = static_cast<int64_t>(tokens.size()) / ctx;
  if (chunks == 0) {
    throw Error("perplexity: the text has " + std::to_string(tokens.size()) + " tokens, fewer than one chunk of " +
                std::to_string(ctx));
  }
  const auto start = std::chrono::steady_clock::now();
  const int64_t first = ctx / 2;
  const SeqId seq = ~SeqId(0);  // reserved id, never handed to requests
  std::vector<int32_t> chunk(static_cast<size_t>(ctx));
  std::vector<float> logits;
  double nll = 0;
  int64_t count = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    std::copy(tokens.begin() + c * ctx, tokens.begin() + (c + 1) * ctx, chunk.begin());
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
    model.forward(std::span<const ForwardSeq>(&fs, 1), pipeline.attention(), cache, logits);
    cache.release(seq);
    for (int64_t j = first; j < ctx - 1; ++j) {
      const float* row = logits.data() + j * vocab;
      float mx = row[0];
      for (int64_t v = 1; v < vocab; ++v) mx = std::max(mx, row[v]);
      double sum = 0;
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - mx);
      const int32_t target = tokens[static_cast<size_t>(c * ctx + j + 1)];
      nll += std::log(sum) + mx - row[target];
      ++count;
    }
  }
  PerplexityResult r;
  r.chunks = chunks;
  r.scored_tokens = count;
  r.mean_nll = nll / double(count);
  r.perplexity = std::exp(r.mean_nll);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace tessera
