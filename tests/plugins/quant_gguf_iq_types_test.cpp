// quantizer: gguf on the codebook formats IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S: the CPU kernels,
// reading the blocks as stored (random blocks: every codebook entry, sign code and scale), match the
// dequantized weights' dot (up to float rounding when the activations quantize exactly, within 8-bit
// activation error otherwise) on row counts that are not whole tiles, prefill and decode; the same
// bits on one thread or four, alone or in a batch; and synthetic models decode the greedy tokens of
// their weights expanded to f32 (quantizer none). ctest runs the kernel cases again with
// TESSERA_CPU_ISA=scalar (the float path CPUs without AVX2 take).
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gguf_decode_check.h"
#include "test_util.h"
#include "tessera/engine.h"
#include "tessera/quantizer.h"
#include "tessera/synth.h"

namespace tessera {
namespace {

using nlohmann::json;
using testing::HasSubstr;

const DType kTypes[] = {DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S, DType::IQ3_XXS, DType::IQ3_S};

struct Case {
  DType t;
  int64_t m, n, k;
  std::vector<uint8_t> bytes;  // n rows as stored
  std::vector<float> w;        // the same, dequantized
  std::vector<float> x;
};

// Random blocks (every bit pattern is a valid block) with scales d in [0.002, 0.02].
Case make_case(DType t, int64_t m, int64_t n, int64_t k, uint32_t seed, bool exact_x) {
  Case c{t, m, n, k, {}, {}, {}};
  std::mt19937 rng(seed);
  const size_t row = dtype_row_bytes(t, k), block = dtype_block_bytes(t);
  c.bytes.resize(row * size_t(n));
  for (auto& b : c.bytes) b = uint8_t(rng());
  for (size_t at = 0; at < c.bytes.size(); at += block) {
    const uint16_t d = f32_to_fp16(0.002f + 0.018f * float(rng() % 1000) / 1000.0f);
    std::memcpy(&c.bytes[at], &d, 2);
  }
  c.w.resize(size_t(n * k));
  for (int64_t r = 0; r < n; ++r) dequantize_row(t, c.bytes.data() + size_t(r) * row, c.w.data() + r * k, k);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  c.x.resize(size_t(m * k));
  for (size_t i = 0; i < c.x.size(); ++i) {
    // Whole numbers whose largest magnitude in every 256 is 127 quantize to int8 exactly.
    c.x[i] = exact_x ? (i % 256 == 5 ? -127.0f : float(int(rng() % 255) - 127)) : 3 * gauss(rng);
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

TEST(GgufIqTypes, KernelsMatchTheDequantizedWeights) {
  uint32_t seed = 1;
  for (DType t : kTypes) {
    for (int64_t k : {256, 768}) {
      for (int64_t m : {1, 2, 5}) {
        for (int64_t n : {1, 5, 9}) {
          SCOPED_TRACE(std::string(dtype_name(t)) + " m=" + std::to_string(m) + " n=" + std::to_string(n) +
                       " k=" + std::to_string(k));
          const Case exact = make_case(t, m, n, k, seed++, true);
          expect_reference(exact, test::linear_forward(*gguf_linear(exact), exact.x, m), 1e-5);
          const Case rough = make_case(t, m, n, k, seed++, false);
          expect_reference(rough, test::linear_forward(*gguf_linear(rough), rough.x, m), 1e-2);
        }
      }
    }
  }
}

TEST(GgufIqTypes, KernelsNonFiniteActivationsGiveNonFinite) {
  for (DType t : kTypes) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    Case c = make_case(t, 1, 5, 512, 3, false);
    for (const float bad : {std::nanf(""), INFINITY}) {
      c.x[300] = bad;
      for (float v : test::linear_forward(*gguf_linear(c), c.x, 1)) EXPECT_FALSE(std::isfinite(v)) << bad;
    }
  }
}

TEST(GgufIqTypes, KernelsSameBitsOnOneThreadOrFourAloneOrInABatch) {
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

// One IQ2 and one IQ3 type (quantizing is the slow part): the tiny preset on whole super-blocks.
TEST(GgufIqTypes, SynthModelsDecodeAsTheirWeightsInF32) {
  test::TempDir dir;
  for (const char* name : {"iq2_xxs", "iq3_s"}) {
    SCOPED_TRACE(name);
    const std::string path = dir.path() + "/" + name + ".gguf";
    const auto out = test::tessera_cmd(std::string("synth --preset tiny --dim 256 --ffn 512 --layers 1 --dtype ") + name +
                                       " -o '" + path + "'");
    ASSERT_EQ(out.status, 0) << out.text;
    const std::string f = test::cpu_pipeline(path, {{"quantizer", {{"plugin", "gguf"}}}})->model().weight_formats();
    EXPECT_THAT(f, HasSubstr(std::string(name) + " x "));
    EXPECT_THAT(f, testing::Not(HasSubstr("f32"))) << "every matrix runs on its blocks";
    test::expect_same_tokens(path, 12);
  }
}

}  // namespace
}  // namespace tessera
