// A one-token step on two or more threads runs each layer in one parallel region, its GEMVs dealt
// out by rows between barriers (model_decode.cpp), where the backend takes every layer's weights;
// the logits must be the bits of one thread, where each op runs alone. The weights must be large
// enough to be shared out (stories260K's are not): a synthetic model with dim 768 and 4 kv heads.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tessera/model.h"
#include "tessera/synth.h"

namespace tessera {
namespace {

class ModelDecode : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    for (const DType dtype : {DType::F32, DType::Q8_0, DType::Q4_0}) {
      SynthSpec spec;
      spec.preset = "custom";
      spec.dim = 768, spec.ffn_dim = 1024, spec.n_layers = 2, spec.n_heads = 12, spec.n_kv_heads = 4;
      spec.vocab = 300, spec.context_length = 64, spec.seed = 11, spec.dtype = dtype;
      write_synthetic_model(spec, path(dtype));
    }
  }
  static void TearDownTestSuite() {
    for (const DType dtype : {DType::F32, DType::Q8_0, DType::Q4_0}) std::filesystem::remove(path(dtype));
  }
  // Per process: ctest runs this suite's tests in parallel processes.
  static std::string path(DType dtype) {
    return testing::TempDir() + "/tessera_model_decode_768_" + std::string(dtype_name(dtype)) + "_" +
           std::to_string(getpid()) + ".gguf";
  }
};

TEST_F(ModelDecode, LayerRegionsGiveTheBitsOfOneThread) {
  const std::vector<int32_t> prompt = {1, 40, 77, 261, 99};
  for (const auto& [dtype, quantizer] : std::vector<std::pair<DType, nlohmann::json>>{
           // int4 q|k, v in int8 (pipelines/int4.yaml), GQA
           {DType::F32, {{"plugin", "int4"}, {"overrides", {{{"pattern", "*.attn_v.weight"}, {"scheme", "int8"}}}}}},
           {DType::F32, {{"plugin", "int8"}}},  // q|k|v and gate|up fused, int8 panels
           {DType::F32, {{"plugin", "none"}}},  // f32 panels
           // q, k and v apart, gate and up apart, in layer 0 only: each layer's outputs its own
           {DType::F32, {{"plugin", "int4"}, {"keep_float", {"blk.0.attn_k.weight", "blk.0.ffn_up.weight"}}}},
           {DType::Q8_0, {{"plugin", "gguf"}}},  // the file's blocks in bands of 8 rows
           {DType::Q4_0, {{"plugin", "gguf"}}},
       }) {
    SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + quantizer.dump());
    auto p = test::cpu_pipeline(path(dtype), {{"quantizer", quantizer}});
    EXPECT_TRUE(p->model().decodes_in_layer_regions());
    const auto [together, alone] = test::forward_steps_on_two_and_one(p->model(), *p, prompt, 3);
    ASSERT_EQ(together.size(), alone.size());
    for (size_t i = 0; i < together.size(); ++i) {
      ASSERT_FALSE(together[i].empty());
      EXPECT_EQ(together[i], alone[i]) << (i == 0 ? "the prompt step" : "decode step " + std::to_string(i));
    }
  }
}

// Formats the CPU backend cannot cut into rows (here f16; also k-quants, oneDNN's int8), or weights
// too small to share out, keep a region per op.
TEST_F(ModelDecode, OtherWeightsKeepARegionPerOp) {
  EXPECT_FALSE(test::cpu_pipeline(test::kStoriesF32)->model().decodes_in_layer_regions()) << "stories260K: small";
  EXPECT_FALSE(test::cpu_pipeline(path(DType::F32), {{"quantizer", {{"plugin", "none"}, {"dtype", "f16"}}}})
                   ->model()
                   .decodes_in_layer_regions())
      << "f16";
}

}  // namespace
}  // namespace tessera
