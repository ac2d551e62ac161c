// A sequence's logits do not depend on the batch around it: the same bits decoded alone as beside
// another sequence of another length, in every weight format, on one thread or two. (Elementwise
// ops see a batch's rows as one array; a scalar tail in silu_mul once gave the elements past the
// last whole vector of a 172-wide FFN row other bits alone than in a batch of two, and the
// difference grew into other logprobs and, with int4's re-quantized activations, other tokens.)
#include <gtest/gtest.h>

#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tessera/model.h"
#include "tessera/pipeline.h"

namespace tessera {
namespace {

// Logits of `prompt`'s last position, then of one decode step after it, with `companions` (other
// prompts) prefilled and decoded in the same steps.
std::vector<std::vector<float>> prefill_and_decode(Pipeline& p, const std::vector<int32_t>& prompt,
                                                   const std::vector<std::vector<int32_t>>& companions) {
  Model& model = p.model();
  Cache& cache = p.cache();
  std::vector<std::vector<int32_t>> prompts = {prompt};
  prompts.insert(prompts.end(), companions.begin(), companions.end());
  const std::vector<int32_t> next = {378};
  std::vector<ForwardSeq> prefill, decode;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const SeqId seq = 700 + i;
    CacheRequest req{seq, int64_t(prompts[i].size()) + 1, prompts[i], "test", false};
    auto plan = cache.plan(std::span<const CacheRequest>(&req, 1));
    if (!plan) throw Error("the cache cannot hold the test's prompts");
    cache.commit(*plan);
    prefill.push_back({seq, prompts[i], 0, 1});
    decode.push_back({seq, next, int64_t(prompts[i].size()), 1});
  }
  const auto vocab = size_t(model.config().vocab);
  std::vector<std::vector<float>> out;
  std::vector<float> logits;
  model.forward(prefill, p.attention(), cache, logits);
  out.emplace_back(logits.begin(), logits.begin() + ptrdiff_t(vocab));
  model.forward(decode, p.attention(), cache, logits);
  out.emplace_back(logits.begin(), logits.begin() + ptrdiff_t(vocab));
  for (size_t i = 0; i < prompts.size(); ++i) cache.release(700 + i);
  return out;
}

TEST(ModelBatch, ASequenceGetsTheSameLogitsAloneOrBesideOthers) {
  const std::vector<int32_t> prompt = {1, 403, 407, 261};
  const std::vector<std::vector<int32_t>> companions = {{1, 85, 40, 310, 97, 12, 260}, {1, 77}};
  for (const auto& [model, quantizer] : std::vector<std::pair<std::string, nlohmann::json>>{
           {test::kStoriesF32, {{"plugin", "none"}}},
           {test::kStoriesF32, {{"plugin", "int8"}}},
           {test::kStoriesF32, {{"plugin", "int4"}, {"group_size", 32}, {"scheme", "asymmetric"}}},
           {test::kStoriesQ8, {{"plugin", "gguf"}}}}) {
    auto p = test::cpu_pipeline(model, {{"quantizer", quantizer}});
    for (const int threads : {1, 2}) {
      SCOPED_TRACE(model + " " + quantizer.dump() + ", " + std::to_string(threads) + " threads");
      p->backend().set_threads(threads);
      const auto alone = prefill_and_decode(*p, prompt, {});
      for (size_t n = 1; n <= companions.size(); ++n) {
        const auto beside = prefill_and_decode(*p, prompt, {companions.begin(), companions.begin() + ptrdiff_t(n)});
        EXPECT_EQ(alone[0], beside[0]) << "prefill, beside " << n;
        EXPECT_EQ(alone[1], beside[1]) << "decode step, beside " << n;
      }
    }
  }
}

}  // namespace
}  // namespace tessera
