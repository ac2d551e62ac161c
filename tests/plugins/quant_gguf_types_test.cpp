// quantizer: gguf on the block formats beside Q8_0/Q4_0/Q4_K/Q6_K (Q4_1, Q5_0, Q5_1, Q2_K, Q3_K,
// Q5_K, IQ4_NL, IQ4_XS): the CPU kernels, reading the blocks as stored, match the dequantized
// weights' dot (exactly up to float rounding when the activations quantize exactly, within 8-bit
// activation error otherwise) on row counts that are not whole tiles; the same bits on one thread or
// four, alone or in a batch; and synthetic models of each type, or mixed like llama.cpp's _K_M
// recipes, decode the same greedy tokens as their weights expanded to f32 (quantizer none).
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "gguf_decode_check.h"
#include "test_util.h"
#include "tessera/engine.h"
#include "tessera/quantize_blocks.h"
#include "tessera/quantizer.h"
#include "tessera/synth.h"

namespace tessera {
namespace {

using nlohmann::json;
using testing::HasSubstr;

const DType kTypes[] = {DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q2_K,  DType::Q3_K,
                        DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS};

bool is_block32(DType t) { return dtype_block_elems(t) == 32; }

struct Case {
  DType t;
  int64_t m, n, k;
  std::vector<uint8_t> bytes;  // n rows as stored
  std::vector<float> w;        // the same, dequantized
  std::vector<float> x;
};

Case make_case(DType t, int64_t m, int64_t n, int64_t k, uint32_t seed, bool exact_x) {
  Case c{t, m, n, k, {}, {}, {}};
  std::mt19937 rng(seed);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::vector<float> src(size_t(n * k));
  for (auto& v : src) v = gauss(rng);
  const size_t row = dtype_row_bytes(t, k);
  c.bytes.resize(row * size_t(n));
  c.w.resize(size_t(n * k));
  for (int64_t r = 0; r < n; ++r) {
    quantize_row(t, src.data() + r * k, c.bytes.data() + size_t(r) * row, k);
    dequantize_row(t, c.bytes.data() + size_t(r) * row, c.w.data() + r * k, k);
  }
  c.x.resize(size_t(m * k));
  for (size_t i = 0; i < c.x.size(); ++i) {
    // Whole numbers whose largest magnitude in every 32 is 127 quantize to int8 exactly.
    c.x[i] = exact_x ? (i % 32 == 5 ? -127.0f : float(int(rng() % 255) - 127)) : 3 * gauss(rng);
  }
  return c;
}

std::unique_ptr<Linear> gguf_linear(const Case& c) {
  auto q = test::plugins().create<Quantizer>("gguf", json::object(), "test");
  return q->make_linear(test::cpu_backend(), WeightSource{"blk.0.ffn_up.weight", c.t, c.bytes.data(), c.n, c.k});
}

// y against Σ x·w in double, within tol times Σ |x·w|.
void expect_reference(const Case& c, const std::vector<float>& y, double tol) {
  ASSERT_EQ(y.size(), size_t(c.m * c.n));
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double want = 0, mag = 0;
      for (int64_t p = 0; p < c.k; ++p) {
        const double prod = double(c.x[size_t(i * c.k + p)]) * c.w[size_t(j * c.k + p)];
        want += prod;
        mag += std::abs(prod);
      }
      ASSERT_NEAR(y[size_t(i * c.n + j)], want, tol * mag) << "x row " << i << ", w row " << j;
    }
  }
}

TEST(GgufTypes, KernelsMatchTheDequantizedWeights) {
  uint32_t seed = 1;
  for (DType t : kTypes) {
    const std::vector<int64_t> ks = is_block32(t) ? std::vector<int64_t>{32, 96, 512} : std::vector<int64_t>{256, 768};
    for (int64_t k : ks) {
      for (int64_t m : {1, 2, 5}) {
        for (int64_t n : {1, 5, 9}) {
          SCOPED_TRACE(std::string(dtype_name(t)) + " m=" + std::to_string(m) + " n=" + std::to_string(n) +
                       " k=" + std::to_string(k));
          const Case exact = make_case(t, m, n, k, seed++, true);
          expect_reference(exact, test::linear_forward(*gguf_linear(exact), exact.x, m), 1e-5);
          // Float activations: 8-bit quantization's error, well under 1% of the magnitude.
          const Case rough = make_case(t, m, n, k, seed++, false);
          expect_reference(rough, test::linear_forward(*gguf_linear(rough), rough.x, m), 1e-2);
        }
      }
    }
  }
}

// The CPU backend stores whole 4-row tiles block-interleaved (row 0 block 0, row 1 block 0, ...,
// row 3 block 0, row 0 block 1, ...) where its AVX2 kernels run, a last partial tile row-major: every
// block keeps the file's bytes, only its place changes (kernels_cpu.h, prepare_weight_quant_tiles).
TEST(GgufTypes, TilesHoldEveryBlockAsStored) {
  constexpr int32_t kTilesPacked = 1 << 8;
  std::vector<DType> types(std::begin(kTypes), std::end(kTypes));
  types.insert(types.end(), {DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S, DType::IQ3_XXS, DType::IQ3_S});
  for (DType t : types) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const Case c = make_case(t, 1, 9, is_block32(t) ? 96 : 512, 7, false);
    auto l = gguf_linear(c);
    const WeightView v = l->view();
    ASSERT_EQ(l->resident_bytes(), c.bytes.size()) << "no copy beside the blocks";
    std::vector<uint8_t> held(c.bytes.size());
    test::cpu_backend().copy_to_host(held.data(), v.data, held.size());
    const bool packed = (v.kernel_variant & kTilesPacked) != 0;
    if (test::cpu_has_avx2()) EXPECT_TRUE(packed) << "AVX2 CPUs stream packed tiles";
    const size_t bb = dtype_block_bytes(t), row = dtype_row_bytes(t, c.k), blocks = row / bb;
    for (size_t r = 0; r < size_t(c.n); ++r) {
      for (size_t b = 0; b < blocks; ++b) {
        const size_t at = packed && r < 8 ? r / 4 * 4 * row + (b * 4 + r % 4) * bb : r * row + b * bb;
        ASSERT_TRUE(std::equal(held.begin() + long(at), held.begin() + long(at + bb), c.bytes.begin() + long(r * row + b * bb)))
            << "row " << r << " block " << b;
      }
    }
  }
}

TEST(GgufTypes, NonFiniteActivationsGiveNan) {
  for (DType t : kTypes) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    Case c = make_case(t, 1, 5, 512, 3, false);
    for (const float bad : {std::nanf(""), INFINITY}) {
      c.x[300] = bad;
      // NaN from the 8-bit activation kernels; NaN or an infinity from the float path without AVX2.
      for (float v : test::linear_forward(*gguf_linear(c), c.x, 1)) EXPECT_FALSE(std::isfinite(v)) << bad;
    }
  }
}

TEST(GgufTypes, SameBitsOnOneThreadOrFourAloneOrInABatch) {
  // Past the fork thresholds, with a ragged last tile.
  for (DType t : kTypes) {
    for (int64_t m : {1, 13}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " m=" + std::to_string(m));
      const Case c = make_case(t, m, 601, 1024, 40 + uint32_t(m), false);
      auto l = gguf_linear(c);
      test::cpu_backend().set_threads(1);
      const auto one = test::linear_forward(*l, c.x, m);
      test::cpu_backend().set_threads(4);
      EXPECT_EQ(test::linear_forward(*l, c.x, m), one);
      const std::vector<float> last(c.x.end() - c.k, c.x.end());
      EXPECT_EQ(test::linear_forward(*l, last, 1), std::vector<float>(one.end() - c.n, one.end()));
    }
  }
  test::cpu_backend().set_threads(2);
}


// The tiny preset with every matrix whole blocks of `t`: its rows of 64 and 172 are not whole
// super-blocks, so k-quants take dim 256 and ffn 512.
SynthSpec spec_for(DType t) {
  SynthSpec s = synth_preset("tiny");
  s.dtype = t;
  if (is_block32(t)) {
    s.ffn_dim = 192;
  } else {
    s.dim = 256;
    s.ffn_dim = 512;
  }
  return s;
}

std::string formats(const std::string& path) {
  return test::cpu_pipeline(path, {{"quantizer", {{"plugin", "gguf"}}}})->model().weight_formats();
}

TEST(GgufTypes, SynthModelsDecodeAsTheirWeightsInF32) {
  test::TempDir dir;
  for (DType t : kTypes) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const std::string path = dir.path() + "/" + std::string(dtype_name(t)) + ".gguf";
    write_synthetic_model(spec_for(t), path);
    const std::string f = formats(path);
    EXPECT_THAT(f, HasSubstr(std::string(dtype_name(t)) + " x "));
    EXPECT_THAT(f, testing::Not(HasSubstr("f32"))) << "every matrix runs on its blocks";
    test::expect_same_tokens(path);
  }
}

TEST(GgufTypes, MixedRecipesRunEachTensorInItsOwnType) {
  test::TempDir dir;
  const struct {
    const char* recipe;
    DType base;
    std::vector<const char*> types;
  } cases[] = {{"q4_k_m", DType::Q4_K, {"q4_k x ", "q6_k x "}},
               {"q5_k_m", DType::Q5_K, {"q5_k x ", "q6_k x "}},
               {"q3_k_m", DType::Q3_K, {"q3_k x ", "q4_k x ", "q5_k x ", "q6_k x "}}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.recipe);
    SynthSpec s = spec_for(c.base);
    s.recipe = c.recipe;
    s.n_layers = 3;
    const std::string path = dir.path() + "/" + c.recipe + ".gguf";
    write_synthetic_model(s, path);
    const std::string f = formats(path);
    for (const char* t : c.types) EXPECT_THAT(f, HasSubstr(t));
    test::expect_same_tokens(path);
  }
  SynthSpec wrong = spec_for(DType::Q4_K);
  wrong.recipe = "q5_k_m";
  EXPECT_THAT(test::message_of([&] { validate_synth_spec(wrong); }), HasSubstr("recipe q5_k_m needs dtype q5_k"));
}

TEST(GgufTypes, SynthCommandWritesEveryTypeAndRecipe) {
  test::TempDir dir;
  for (const char* t : {"q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q5_k", "iq4_nl", "iq4_xs", "q4_k_m"}) {
    const std::string path = dir.path() + "/" + t + ".gguf";
    const auto out = test::tessera_cmd(std::string("synth --preset tiny --dim 256 --ffn 512 --dtype ") + t + " -o '" +
                                       path + "'");
    ASSERT_EQ(out.status, 0) << out.text;
    const std::string base = std::string(t) == "q4_k_m" ? "q4_k" : t;
    EXPECT_THAT(formats(path), HasSubstr(base + " x "));
  }
}

}  // namespace
}  // namespace tessera
