// The CPU backend's gemm on prepared (packed) weights: what the engine relies on beyond the
// conformance suite's accuracy check — a row's result is the same bits whether it runs alone
// (decode) or inside a batch (prefill, continuous batching) and whatever the thread count, and a
// partly packed matrix (rows after the last full tile) is computed like the rest. Half-precision
// rows are converted in registers for one or two rows of x and unpacked for more: the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <cstring>
#include <string>
#include <vector>

#include "test_util.h"
#include "tessera/device_buffer.h"
#include "tessera/quantize_blocks.h"
#include "tessera/quantizer.h"

namespace tessera {
namespace {

using test::cpu_backend;
using test::random_floats;

struct Weight {
  DeviceBuffer data, scales;
  WeightView view;
};

// W as the CPU backend holds a Linear's weight: f32, f16, bf16, or int8 with per-row scales; then
// prepared.
Weight make_weight(DType t, const std::vector<float>& w, int64_t n, int64_t k) {
  Backend& b = cpu_backend();
  Weight out;
  if (t == DType::F32) {
    out.data = DeviceBuffer(b, w.size() * sizeof(float));
    out.data.upload(w.data(), w.size() * sizeof(float));
  } else if (t == DType::F16 || t == DType::BF16) {
    std::vector<uint16_t> h(w.size());
    for (size_t i = 0; i < h.size(); ++i) h[i] = t == DType::F16 ? f32_to_fp16(w[i]) : f32_to_bf16(w[i]);
    out.data = DeviceBuffer(b, h.size() * sizeof(uint16_t));
    out.data.upload(h.data(), h.size() * sizeof(uint16_t));
  } else {
    std::vector<int8_t> q(w.size());
    for (size_t i = 0; i < q.size(); ++i) q[i] = int8_t(int(w[i] * 127.0f) % 128);
    const std::vector<float> s(size_t(n), 0.01f);
    out.data = DeviceBuffer(b, q.size());
    out.data.upload(q.data(), q.size());
    out.scales = DeviceBuffer(b, s.size() * sizeof(float));
    out.scales.upload(s.data(), s.size() * sizeof(float));
  }
  out.view = WeightView{out.data.get(), t, n, k, out.scales.as<float>()};
  b.prepare_weight(out.view);
  return out;
}

std::vector<float> gemm(const WeightView& v, const float* x, int64_t m) {
  Backend& b = cpu_backend();
  DeviceBuffer xb(b, size_t(m * v.cols) * sizeof(float)), yb(b, size_t(m * v.rows) * sizeof(float));
  xb.upload(x, size_t(m * v.cols) * sizeof(float));
  b.gemm(xb.as<float>(), m, v, yb.as<float>());
  std::vector<float> y(size_t(m * v.rows));
  b.copy_to_host(y.data(), yb.get(), y.size() * sizeof(float));
  return y;
}

TEST(CpuGemm, PreparedWeightsGiveEachRowTheSameBitsAloneOrInABatchOnAnyThreadCount) {
  const int64_t m = 13;
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::I8}) {
    for (int64_t n : {16, 37, 53, 64, 1030}) {  // 1, 2, 3, 4 and 64 panels of 16
      for (int64_t k : {7, 64, 129, 300}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " n=" + std::to_string(n) + " k=" + std::to_string(k));
        const auto w = random_floats(size_t(n * k), uint32_t(n * 7 + k));
        const auto x = random_floats(size_t(m * k), uint32_t(n + k * 3), -3, 3);
        const Weight weight = make_weight(t, w, n, k);
        cpu_backend().set_threads(2);
        const auto batch = gemm(weight.view, x.data(), m);
        for (int64_t i = 0; i < m; ++i) {
          const auto alone = gemm(weight.view, x.data() + i * k, 1);
          ASSERT_EQ(0, std::memcmp(alone.data(), batch.data() + i * n, size_t(n) * sizeof(float))) << "row " << i;
        }
        cpu_backend().set_threads(1);
        EXPECT_EQ(gemm(weight.view, x.data(), m), batch) << "one thread against two";
        cpu_backend().set_threads(2);
      }
    }
  }
}

// The k-quant kernels quantize activations to int8 per 256 elements (scale amax/127). With
// activations that are whole numbers whose largest magnitude in every 256 is 127, that quantization
// is exact, so the result must match the dequantized weights' dot to float rounding: any slip in
// the nibble, high-bit, scale or min unpacking shows. Blocks are random bytes under fixed
// super-block scales.
TEST(CpuGemm, KQuantsMatchTheDequantizedWeightsWhenActivationsQuantizeExactly) {
  std::mt19937 rng(17);
  for (DType t : {DType::Q4_K, DType::Q6_K}) {
    for (int64_t m : {1, 2, 5}) {
      const int64_t n = 9, k = 512;
      SCOPED_TRACE(std::string(dtype_name(t)) + " m=" + std::to_string(m));
      std::vector<uint8_t> w(dtype_row_bytes(t, k) * size_t(n));
      for (auto& byte : w) byte = uint8_t(rng());
      const uint16_t d = f32_to_fp16(1.0f / 64), dmin = f32_to_fp16(1.0f / 32);
      for (size_t at = 0; at < w.size(); at += dtype_block_bytes(t)) {
        std::memcpy(&w[at + (t == DType::Q4_K ? 0 : 208)], &d, 2);
        if (t == DType::Q4_K) std::memcpy(&w[at + 2], &dmin, 2);
      }
      std::vector<float> x(size_t(m * k));
      for (size_t i = 0; i < x.size(); ++i) x[i] = i % 256 == 7 ? -127.0f : float(int(rng() % 255) - 127);
      std::vector<float> wd(size_t(n * k));
      for (int64_t j = 0; j < n; ++j) dequantize_row(t, w.data() + size_t(j) * dtype_row_bytes(t, k), wd.data() + j * k, k);

      DeviceBuffer wb(cpu_backend(), w.size());
      wb.upload(w.data(), w.size());
      WeightView view{wb.get(), t, n, k};
      cpu_backend().prepare_weight(view);
      const auto y = gemm(view, x.data(), m);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double want = 0, mag = 0;
          for (int64_t p = 0; p < k; ++p) {
            want += double(x[size_t(i * k + p)]) * wd[size_t(j * k + p)];
            mag += std::abs(double(x[size_t(i * k + p)]) * wd[size_t(j * k + p)]);
          }
          EXPECT_NEAR(y[size_t(i * n + j)], want, 1e-5 * mag) << "x row " << i << ", w row " << j;
        }
      }
      // A NaN or infinite activation gives non-finite outputs, not finite ones: NaN from the 8-bit
      // activation kernels, NaN or an infinity from the float path of CPUs without AVX2.
      for (const float bad : {std::nanf(""), INFINITY}) {
        std::vector<float> xb(x.begin(), x.begin() + k);
        xb[300] = bad;
        for (const float v : gemm(view, xb.data(), 1)) EXPECT_FALSE(std::isfinite(v)) << bad;
      }
    }
  }
}

// A fused weight's output dealt out to its parts (Backend::gemm_parts) is the fused gemm's columns,
// bit for bit, on one thread or two: the model relies on it for a batch's q|k|v and gate|up. Parts
// of 48 columns make four-panel tiles span two parts (computed panel by panel); k = 1000 with 40
// rows takes two passes over k.
// gemm_parts of `weight` (n rows) on x (m rows) into parts of `split` columns, at 1 and 2 threads:
// each part's rows are the bits of gemm's fused output at its columns.
void expect_parts_are_the_fused_columns(const Weight& weight, const std::vector<float>& x, int64_t m, int64_t n,
                                        const std::vector<int64_t>& split) {
  Backend& b = cpu_backend();
  const auto fused = gemm(weight.view, x.data(), m);
  DeviceBuffer xb(b, x.size() * sizeof(float));
  xb.upload(x.data(), x.size() * sizeof(float));
  for (int threads : {1, 2}) {
    b.set_threads(threads);
    std::vector<DeviceBuffer> outs;
    std::vector<OutputPart> parts;
    for (int64_t c : split) {
      outs.emplace_back(b, size_t(m * c) * sizeof(float));
      parts.push_back({outs.back().as<float>(), c});
    }
    ASSERT_TRUE(b.gemm_parts(xb.as<float>(), m, weight.view, parts.data(), parts.size()));
    int64_t at = 0;
    for (size_t p = 0; p < split.size(); ++p) {
      std::vector<float> got(size_t(m * split[p]));
      b.copy_to_host(got.data(), outs[p].get(), got.size() * sizeof(float));
      for (int64_t i = 0; i < m; ++i) {
        ASSERT_EQ(0, std::memcmp(got.data() + i * split[p], fused.data() + i * n + at, size_t(split[p]) * sizeof(float)))
            << "part " << p << ", row " << i << ", " << threads << " threads";
      }
      at += split[p];
    }
  }
  b.set_threads(2);
}

TEST(CpuGemm, GemmPartsGiveTheFusedColumnsBitForBit) {
  TESSERA_SKIP_WITHOUT_AVX2();
  const std::vector<std::vector<int64_t>> splits = {{64, 32, 32}, {128, 48, 80}, {256, 64}};
  // int8: k not a multiple of 64, so that a CPU with AMX runs the panel kernels too (AMX declines).
  const std::vector<std::pair<DType, std::vector<int64_t>>> weights = {{DType::F32, {64, 300, 1000}},
                                                                       {DType::I8, {300, 1000}}};
  for (const auto& [dtype, ks] : weights) {
    for (const auto& split : splits) {
      int64_t n = 0;
      for (int64_t c : split) n += c;
      for (int64_t m : {2, 13, 40}) {
        for (int64_t k : ks) {
          SCOPED_TRACE(std::string(dtype_name(dtype)) + " parts " + std::to_string(split.size()) + " n=" +
                       std::to_string(n) + " m=" + std::to_string(m) + " k=" + std::to_string(k));
          const Weight weight = make_weight(dtype, random_floats(size_t(n * k), uint32_t(n + k)), n, k);
          expect_parts_are_the_fused_columns(weight, random_floats(size_t(m * k), uint32_t(m + k), -3, 3), m, n, split);
        }
      }
    }
  }
}

// Where the CPU has no split kernel, gemm_parts declines and leaves the parts as they were: one
// row (decode uses the fused output in place), parts that are not whole panels of 16, parts that
// do not add up to the weight's rows, and weights that are not packed f32 or int8.
TEST(CpuGemm, GemmPartsDeclinesWhatItCannotSplitAndWritesNothing) {
  Backend& b = cpu_backend();
  const int64_t k = 64;
  const auto x = random_floats(size_t(4 * k), 2);
  DeviceBuffer xb(b, x.size() * sizeof(float));
  xb.upload(x.data(), x.size() * sizeof(float));
  const Weight f32 = make_weight(DType::F32, random_floats(size_t(96 * k), 3), 96, k);
  const Weight f16 = make_weight(DType::F16, random_floats(size_t(96 * k), 3), 96, k);
  const Weight i8 = make_weight(DType::I8, random_floats(size_t(96 * k), 3), 96, k);
  struct Case {
    const Weight* weight;
    int64_t m;
    std::vector<int64_t> split;
    const char* why;
  };
  const std::vector<Case> cases = {{&f32, 1, {64, 32}, "one row"},
                                   {&f32, 4, {72, 24}, "parts of 72 and 24 columns"},
                                   {&f32, 4, {64, 16}, "parts adding up to 80 of 96 rows"},
                                   {&f16, 4, {64, 32}, "f16 weights"},
                                   {&i8, 1, {64, 32}, "one row of int8"},
                                   {&i8, 4, {72, 24}, "int8 parts of 72 and 24 columns"}};
  for (const Case& c : cases) {
    std::vector<DeviceBuffer> outs;
    std::vector<OutputPart> parts;
    for (int64_t cols : c.split) {
      outs.emplace_back(b, size_t(c.m * cols) * sizeof(float));
      const std::vector<float> sentinel(size_t(c.m * cols), 7.0f);
      outs.back().upload(sentinel.data(), sentinel.size() * sizeof(float));
      parts.push_back({outs.back().as<float>(), cols});
    }
    EXPECT_FALSE(b.gemm_parts(xb.as<float>(), c.m, c.weight->view, parts.data(), parts.size())) << c.why;
    for (size_t p = 0; p < parts.size(); ++p) {
      std::vector<float> got(size_t(c.m * c.split[p]));
      b.copy_to_host(got.data(), outs[p].get(), got.size() * sizeof(float));
      EXPECT_EQ(got, std::vector<float>(got.size(), 7.0f)) << c.why << ": part " << p << " was written";
    }
  }
}

TEST(CpuGemm, PackedF32MatchesTheRowMajorWeight) {
  TESSERA_SKIP_WITHOUT_AVX2();
  const int64_t m = 9, n = 53, k = 100;  // three full panels of 16 and 5 row-major rows
  const auto w = random_floats(size_t(n * k), 5);
  const auto x = random_floats(size_t(m * k), 6, -3, 3);
  const Weight packed = make_weight(DType::F32, w, n, k);
  ASSERT_NE(packed.view.kernel_variant, 0) << "the CPU backend packs f32 weights (AVX2 machines)";
  DeviceBuffer plain(cpu_backend(), w.size() * sizeof(float));
  plain.upload(w.data(), w.size() * sizeof(float));
  const auto got = gemm(packed.view, x.data(), m);
  const auto want = gemm(WeightView{plain.get(), DType::F32, n, k}, x.data(), m);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4f * (1 + std::abs(want[i]))) << i;
}

// Every quantized format through its quantizer, as the engine builds Linears: the GEMMs split the
// weight over the team and let a thread that is done take the others' remaining rows, so which
// thread computes a row varies from call to call. A row's bits must not. Four threads on this
// machine's cores make the stealing frequent; 1030 rows leave tails after the last panel or band,
// and the weights are large enough (> 256 KiB) that decode forks.
TEST(CpuGemm, QuantizedFormatsGiveTheSameBitsOnOneThreadOrFourAloneOrInABatch) {
  struct Case {
    const char* quantizer;
    nlohmann::json params;
    DType stored;
  };
  const std::vector<Case> cases = {{"int8", nlohmann::json::object(), DType::F32},
                                   {"int4", {{"group_size", 32}}, DType::F32},
                                   {"int4", {{"group_size", 128}, {"scheme", "asymmetric"}}, DType::F32},
                                   {"gguf", nlohmann::json::object(), DType::Q8_0},
                                   {"gguf", nlohmann::json::object(), DType::Q4_0},
                                   {"gguf", nlohmann::json::object(), DType::Q4_K},
                                   {"gguf", nlohmann::json::object(), DType::Q6_K},
                                   {"none", {{"dtype", "f16"}}, DType::F32},
                                   {"none", nlohmann::json::object(), DType::F32}};
  const int64_t m = 13, n = 1030, k = 512;
  const auto w = random_floats(size_t(n * k), 17);
  const auto x = random_floats(size_t(m * k), 18, -3, 3);
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.quantizer) + " " + c.params.dump() + " on " + std::string(dtype_name(c.stored)));
    std::vector<uint8_t> stored(dtype_row_bytes(c.stored, k) * size_t(n));
    for (int64_t r = 0; r < n; ++r) {
      quantize_row(c.stored, w.data() + r * k, stored.data() + size_t(r) * dtype_row_bytes(c.stored, k), k);
    }
    auto quantizer = test::plugins().create<Quantizer>(c.quantizer, c.params, "test");
    auto linear =
        quantizer->make_linear(cpu_backend(), WeightSource{"blk.0.ffn_up.weight", c.stored, stored.data(), n, k});
    cpu_backend().set_threads(1);
    const auto want = test::linear_forward(*linear, x, m);
    cpu_backend().set_threads(4);
    for (int repeat = 0; repeat < 3; ++repeat) {
      EXPECT_EQ(test::linear_forward(*linear, x, m), want) << "a batch of " << m << " on four threads";
      for (int64_t i = 0; i < m; ++i) {
        const std::vector<float> row(x.begin() + i * k, x.begin() + (i + 1) * k);
        const auto alone = test::linear_forward(*linear, row, 1);
        ASSERT_EQ(0, std::memcmp(alone.data(), want.data() + i * n, size_t(n) * sizeof(float))) << "row " << i;
      }
    }
  }
  cpu_backend().set_threads(2);
}

// gemv_many runs several weights' GEMVs in one parallel region, each thread on a slice of each cut
// at whole bands or panels: every output is the bits of the weight's own gemm, whatever the rows
// left after the last whole band or panel (GGUF Q8_0's bands of 8 too), on two threads or four; one
// thread, a format it cannot slice, or weights too small to share out are declined with nothing
// written.
TEST(CpuGemm, GemvManyGivesEachWeightsOwnBitsInOneRegion) {
  TESSERA_SKIP_WITHOUT_AVX2();
  const int64_t k = 768;
  struct Part {
    const char* quantizer;
    nlohmann::json params;
    DType stored;
    int64_t rows;
  };
  const std::vector<Part> parts = {{"int4", {{"group_size", 32}, {"scheme", "asymmetric"}}, DType::F32, 1540},
                                   {"int8", nlohmann::json::object(), DType::F32, 776},
                                   {"none", nlohmann::json::object(), DType::F32, 520},
                                   {"int4", {{"group_size", 64}}, DType::F32, 96}};
  std::vector<std::unique_ptr<Linear>> linears;
  std::vector<WeightView> views;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Part& p = parts[i];
    const auto w = random_floats(size_t(p.rows * k), uint64_t(30 + i));
    auto quantizer = test::plugins().create<Quantizer>(p.quantizer, p.params, "test");
    linears.push_back(quantizer->make_linear(
        cpu_backend(), WeightSource{"blk.0.attn_q.weight", p.stored, w.data(), p.rows, k}));
    ASSERT_TRUE(linears.back()->runs_as_gemm()) << p.quantizer;
    views.push_back(linears.back()->view());
  }
  const auto x = random_floats(size_t(k), 40, -3, 3);
  DeviceBuffer xb(cpu_backend(), size_t(k) * sizeof(float));
  xb.upload(x.data(), x.size() * sizeof(float));
  auto run_many = [&](size_t n, std::vector<std::vector<float>>& got) {
    std::vector<DeviceBuffer> ys;
    std::vector<float*> outs;
    for (size_t i = 0; i < n; ++i) {
      ys.emplace_back(cpu_backend(), size_t(views[i].rows) * sizeof(float));
      cpu_backend().fill_zero(ys.back().get(), ys.back().size());
      outs.push_back(ys.back().as<float>());
    }
    const bool ran = cpu_backend().gemv_many(xb.as<float>(), views.data(), outs.data(), n);
    got.assign(n, {});
    for (size_t i = 0; i < n; ++i) {
      got[i].resize(size_t(views[i].rows));
      cpu_backend().copy_to_host(got[i].data(), ys[i].get(), got[i].size() * sizeof(float));
    }
    return ran;
  };
  std::vector<std::vector<float>> want;
  for (const auto& l : linears) want.push_back(test::linear_forward(*l, x, 1));
  for (int threads : {2, 4}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    cpu_backend().set_threads(threads);
    std::vector<std::vector<float>> got;
    ASSERT_TRUE(run_many(parts.size(), got));
    for (size_t i = 0; i < parts.size(); ++i) EXPECT_EQ(got[i], want[i]) << "weight " << i << " (" << parts[i].quantizer << ")";
  }
  cpu_backend().set_threads(1);
  std::vector<std::vector<float>> got;
  EXPECT_FALSE(run_many(2, got)) << "one thread: each gemm runs alone anyway";
  EXPECT_EQ(got[0], std::vector<float>(got[0].size(), 0.0f)) << "nothing written";
  cpu_backend().set_threads(2);
  // GGUF Q8_0 blocks in bands of 8 rows, then a tile of 4 rows: sliced at the bands.
  const int64_t q8_rows = 1028;
  const std::vector<float> q8 = random_floats(size_t(q8_rows * k), 41);
  std::vector<uint8_t> stored(dtype_row_bytes(DType::Q8_0, k) * q8_rows);
  for (int64_t r = 0; r < q8_rows; ++r) {
    quantize_row(DType::Q8_0, q8.data() + r * k, stored.data() + r * dtype_row_bytes(DType::Q8_0, k), k);
  }
  auto gguf = test::plugins().create<Quantizer>("gguf", nlohmann::json::object(), "test");
  auto q8_linear =
      gguf->make_linear(cpu_backend(), WeightSource{"blk.0.attn_v.weight", DType::Q8_0, stored.data(), q8_rows, k});
  const WeightView saved = views[1];
  views[1] = q8_linear->view();
  ASSERT_TRUE(run_many(2, got)) << "Q8_0 bands";
  EXPECT_EQ(got[1], test::linear_forward(*q8_linear, x, 1)) << "Q8_0";
  // f16 rows: not sliced.
  auto f16 = test::plugins().create<Quantizer>("none", {{"dtype", "f16"}}, "test");
  auto f16_linear = f16->make_linear(cpu_backend(), WeightSource{"blk.0.attn_v.weight", DType::F32, q8.data(), 256, k});
  views[1] = f16_linear->view();
  EXPECT_FALSE(run_many(2, got)) << "f16 rows: not sliced";
  views[1] = saved;
  views[0] = views[1] = views[3];  // two small weights
  EXPECT_FALSE(run_many(2, got)) << "too few bytes to share out";
}

}  // namespace
}  // namespace tessera
