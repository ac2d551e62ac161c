// The model runs a layer's q|k|v and gate|up as one Linear each where the quantizer stores the
// parts alike (Quantizer::make_fused_linear). Fusing is a speed-up only: the logits must be the
// ones the separate Linears give, for a prompt (several tokens a step: the fused output is split
// per token) and for decode steps (one token: the parts are used in place). Quantized formats
// accumulate each row the same way wherever it sits: the same bits. Float weights may land in a
// different kernel tile (stories260K's ffn has 172 rows, not whole 16-row panels), which sums in
// another order: float rounding only.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tessera/gguf.h"
#include "tessera/model.h"
#include "tessera/pipeline.h"
#include "tessera/synth.h"

namespace tessera {
namespace {

// The pipeline's quantizer, declining every fusion: the model then builds each weight alone.
class Apart final : public Quantizer {
 public:
  explicit Apart(Quantizer& inner) : inner_(inner) {}
  std::unique_ptr<Linear> make_linear(Backend& backend, const WeightSource& w) override {
    return inner_.make_linear(backend, w);
  }

 private:
  Quantizer& inner_;
};

TEST(ModelFused, GivesTheBitsOfSeparateLinears) {
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 290, 313};
  for (const auto& [model, quantizer] : std::vector<std::pair<std::string, nlohmann::json>>{
           {test::kStoriesF32, {{"plugin", "int8"}}},
           {test::kStoriesF32, {{"plugin", "int4"}, {"group_size", 32}}},
           {test::kStoriesQ8, {{"plugin", "gguf"}}}}) {
    SCOPED_TRACE(model + " " + quantizer.dump());
    auto p = test::cpu_pipeline(model, {{"quantizer", quantizer}});
    Apart apart(p->quantizer());
    Model separate(GgufFile::open(model), p->backend(), apart);
    EXPECT_EQ(separate.weight_formats(), p->model().weight_formats()) << "every weight stored alike";
    EXPECT_EQ(separate.weight_bytes(), p->model().weight_bytes());
    const auto fused_logits = test::forward_steps(p->model(), *p, prompt, 3);
    const auto separate_logits = test::forward_steps(separate, *p, prompt, 3);
    ASSERT_EQ(fused_logits.size(), separate_logits.size());
    for (size_t i = 0; i < fused_logits.size(); ++i) {
      ASSERT_FALSE(fused_logits[i].empty());
      EXPECT_EQ(fused_logits[i], separate_logits[i])
          << (i == 0 ? "the prompt step" : "decode step " + std::to_string(i));
    }
  }
}

// The pipeline's quantizer, noting the weights of every fusion it made.
class Noting final : public Quantizer {
 public:
  explicit Noting(Quantizer& inner) : inner_(inner) {}
  std::unique_ptr<Linear> make_linear(Backend& backend, const WeightSource& w) override {
    return inner_.make_linear(backend, w);
  }
  std::unique_ptr<Linear> make_fused_linear(Backend& backend, std::span<const WeightSource> parts) override {
    auto l = inner_.make_fused_linear(backend, parts);
    if (l != nullptr) {
      std::string names;
      for (const WeightSource& w : parts) names += (names.empty() ? "" : "|") + w.name;
      fused.push_back(names);
    }
    return l;
  }
  std::vector<std::string> fused;

 private:
  Quantizer& inner_;
};

// With v stored otherwise than q and k (kept in float, or given int8 by an int4 override), q|k
// still run as one Linear and v alone: two GEMVs instead of three, the same bits as all apart.
TEST(ModelFused, QueryAndKeyJoinWhereTheValueIsStoredOtherwise) {
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 290, 313};
  for (const nlohmann::json& quantizer :
       {nlohmann::json{{"plugin", "int8"}, {"keep_float", {"*.attn_v.weight"}}},
        nlohmann::json{{"plugin", "int4"}, {"overrides", {{{"pattern", "*.attn_v.weight"}, {"scheme", "int8"}}}}}}) {
    SCOPED_TRACE(quantizer.dump());
    auto p = test::cpu_pipeline(test::kStoriesF32, {{"quantizer", quantizer}});
    Noting noting(p->quantizer());
    Model joined(GgufFile::open(test::kStoriesF32), p->backend(), noting);
    ASSERT_FALSE(noting.fused.empty());
    EXPECT_EQ(noting.fused.front(), "blk.0.attn_q.weight|blk.0.attn_k.weight");
    for (const std::string& f : noting.fused) EXPECT_EQ(f.find("attn_v"), std::string::npos) << f;
    Apart apart(p->quantizer());
    Model separate(GgufFile::open(test::kStoriesF32), p->backend(), apart);
    EXPECT_EQ(separate.linear_names(), joined.linear_names());
    EXPECT_EQ(separate.linear_formats(), joined.linear_formats());
    const auto joined_logits = test::forward_steps(joined, *p, prompt, 3);
    const auto separate_logits = test::forward_steps(separate, *p, prompt, 3);
    ASSERT_EQ(joined_logits.size(), separate_logits.size());
    for (size_t i = 0; i < joined_logits.size(); ++i) {
      ASSERT_FALSE(joined_logits[i].empty());
      EXPECT_EQ(joined_logits[i], separate_logits[i]) << (i == 0 ? "the prompt step" : "decode step " + std::to_string(i));
    }
  }
}

// A decode step runs weights that share their input but are stored apart (q|k and v, q, k and v,
// gate and up) in one backend call (Backend::gemv_many) where they are large enough to share out
// over the threads (stories260K's are not: a synthetic model with dim 512): the logits are the
// bits of one thread, where each Linear runs alone.
TEST(ModelFused, WeightsStoredApartRunInOneCallWithTheSameBits) {
  SynthSpec spec;
  spec.preset = "custom";
  spec.dim = 512, spec.ffn_dim = 1024, spec.n_layers = 2, spec.n_heads = 8, spec.n_kv_heads = 8;
  spec.vocab = 300, spec.context_length = 64, spec.seed = 7;
  const std::string path = testing::TempDir() + "/tessera_model_fused_512.gguf";
  write_synthetic_model(spec, path);
  const std::vector<int32_t> prompt = {1, 40, 77, 261, 99};
  const std::vector<std::pair<nlohmann::json, std::vector<std::string>>> cases = {
      {{{"plugin", "int4"}, {"overrides", {{{"pattern", "*.attn_v.weight"}, {"scheme", "int8"}}}}}, {"attn_v"}},
      {{{"plugin", "int8"}, {"keep_float", {"*.attn_v.weight"}}}, {"attn_v"}},
      {{{"plugin", "int4"}, {"keep_float", {"*.attn_k.weight", "*.ffn_up.weight"}}}, {"attn_k", "ffn_up"}}};
  for (const auto& [quantizer, kept_apart] : cases) {
    SCOPED_TRACE(quantizer.dump());
    auto p = test::cpu_pipeline(path, {{"quantizer", quantizer}});
    Noting noting(p->quantizer());
    Model model(GgufFile::open(path), p->backend(), noting);
    for (const std::string& f : noting.fused) {  // what the decode steps below run in one call instead
      for (const std::string& name : kept_apart) EXPECT_EQ(f.find(name), std::string::npos) << f;
    }
    const auto [together, alone] = test::forward_steps_on_two_and_one(p->model(), *p, prompt, 3);
    ASSERT_EQ(together.size(), alone.size());
    for (size_t i = 0; i < together.size(); ++i) {
      ASSERT_FALSE(together[i].empty());
      EXPECT_EQ(together[i], alone[i]) << (i == 0 ? "the prompt step" : "decode step " + std::to_string(i));
    }
  }
  std::filesystem::remove(path);
}

TEST(ModelFused, FloatWeightsGiveTheSeparateLogitsToFloatRounding) {
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 290, 313};
  for (const std::string dtype : {"f32", "f16"}) {
    SCOPED_TRACE(dtype);
    auto p = test::cpu_pipeline(test::kStoriesF32, {{"quantizer", {{"plugin", "none"}, {"dtype", dtype}}}});
    Apart apart(p->quantizer());
    Model separate(GgufFile::open(test::kStoriesF32), p->backend(), apart);
    const auto fused_logits = test::forward_steps(p->model(), *p, prompt, 3);
    const auto separate_logits = test::forward_steps(separate, *p, prompt, 3);
    ASSERT_EQ(fused_logits.size(), separate_logits.size());
    for (size_t i = 0; i < fused_logits.size(); ++i) {
      ASSERT_EQ(fused_logits[i].size(), separate_logits[i].size());
      for (size_t j = 0; j < fused_logits[i].size(); ++j) {
        ASSERT_NEAR(fused_logits[i][j], separate_logits[i][j], 1e-4f * (1 + std::abs(separate_logits[i][j])))
            << "step " << i << " logit " << j;
      }
    }
  }
}

}  // namespace
}  // namespace tessera
