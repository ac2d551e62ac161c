// Accuracy of every GGUF type tessera writes, run by quantizer: gguf from its blocks, against the
// same synthetic weights in f32 (synth writes the same floats whatever the type) on the eval text:
// the KL divergence from f32 falls as bits per weight rise, and perplexity stays near f32's.
// docs/quantization_types.md has the full table on the 110m preset.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "test_util.h"
#include "tessera/eval.h"
#include "tessera/synth.h"

namespace tessera {
namespace {

struct Expect {
  DType t;
  double max_ppl_change;  // |ppl / ppl(f32) - 1|
};

// The k-quant ladder and Q8_0, fewest bits per weight first: each type's mean KL must be below the
// one before (measured on this model, KL nats and perplexity change: Q2_K 0.186, +6.7%; Q3_K
// 0.051, +4.8%; Q4_K 0.012, +0.85%; Q5_K 0.0031, -0.008%; Q6_K 0.00082, -0.30%; Q8_0 0.00012,
// +0.008%: KL falls 3.5-7x a step, while a random model's perplexity moves either way).
const Expect kOrder[] = {
    {DType::Q2_K, 0.15}, {DType::Q3_K, 0.10}, {DType::Q4_K, 0.03},
    {DType::Q5_K, 0.01}, {DType::Q6_K, 0.01}, {DType::Q8_0, 0.001},
};

TEST(GgufTypesAccuracy, KlDivergenceFromF32FallsAsBitsPerWeightRise) {
  const test::TempDir dir;
  SynthSpec s = synth_preset("tiny");
  s.dim = 256;  // rows of 256 and 512: whole super-blocks, every matrix takes the type
  s.ffn_dim = 512;
  s.seed = 3;
  const std::string f32_path = dir.path() + "/f32.gguf";
  write_synthetic_model(s, f32_path);
  auto base = test::cpu_pipeline(f32_path);
  const auto tokens = perplexity_tokens(base->tokenizer(), test::read_text(test::kShared + "/eval/tiny_stories_eval.txt"));
  double previous_kl = INFINITY, iq4_xs_kl = 0;
  for (const Expect& e : kOrder) {
    SCOPED_TRACE(dtype_name(e.t));
    s.dtype = e.t;
    const std::string path = dir.path() + "/" + std::string(dtype_name(e.t)) + ".gguf";
    write_synthetic_model(s, path);
    auto p = test::cpu_pipeline(path, {{"quantizer", {{"plugin", "gguf"}}}});
    const BaselineComparison c = compare_with_baseline(*p, *base, tokens, 64);
    const double change = c.pipeline.perplexity / c.baseline.perplexity - 1;
    std::printf("%-7s kl %.3g ppl %.4f (f32 %.4f, %+.3f%%)\n", std::string(dtype_name(e.t)).c_str(), c.kl.mean,
                c.pipeline.perplexity, c.baseline.perplexity, 100 * change);
    EXPECT_GT(c.kl.mean, 0.0);
    EXPECT_LT(c.kl.mean, previous_kl);
    EXPECT_LT(std::fabs(change), e.max_ppl_change);
    previous_kl = c.kl.mean;
    if (e.t == DType::Q3_K) {  // IQ4_XS (4.25 bits) sits between Q3_K and Q5_K (measured 0.0138)
      s.dtype = DType::IQ4_XS;
      const std::string iq = dir.path() + "/iq4_xs.gguf";
      write_synthetic_model(s, iq);
      auto q = test::cpu_pipeline(iq, {{"quantizer", {{"plugin", "gguf"}}}});
      const double kl = compare_with_baseline(*q, *base, tokens, 64).kl.mean;
      EXPECT_LT(kl, c.kl.mean / 2) << "iq4_xs";
      iq4_xs_kl = kl;
    }
    if (e.t == DType::Q5_K) EXPECT_LT(c.kl.mean, iq4_xs_kl / 2) << "iq4_xs";
  }
}

}  // namespace
}  // namespace tessera
