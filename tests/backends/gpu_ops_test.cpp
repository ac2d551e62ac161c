// Every op of the CUDA and HIP backends against the CPU backend (the reference), on random inputs
// drawn fresh on each run (the seed is printed; TESSERA_TEST_SEED=<n> replays one), with outputs
// poisoned (NaN) before each run and a poisoned guard after them. Then the real model: stories260K
// greedy tokens on the device must equal the golden file. Without a device every test skips with the
// backend's own refusal as the message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "test_util.h"
#include "tessera/engine.h"
#include "tessera/error.h"
#include "tessera/quantize_blocks.h"

namespace tessera {
namespace {

using namespace gpu_test;  // NOLINT: the fixture and helpers of this test binary

// ---- gemm -------------------------------------------------------------------------------------------

// The GGUF formats beyond Q8_0/Q4_0 that the device decodes (kernels_cuda/kernels/gguf_blocks.cuh).
const DType kMoreGgufTypes[] = {DType::Q4_1,    DType::Q5_0,   DType::Q5_1,  DType::IQ4_NL,  DType::Q2_K,
                                DType::Q3_K,    DType::Q4_K,   DType::Q5_K,  DType::Q6_K,    DType::IQ4_XS,
                                DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S, DType::IQ3_XXS, DType::IQ3_S};

bool iq_grid_type(DType t) {
  return t == DType::IQ2_XXS || t == DType::IQ2_XS || t == DType::IQ2_S || t == DType::IQ3_XXS || t == DType::IQ3_S;
}

// A weight in one of the formats, with its exact float values (what a kernel must multiply by).
struct TestWeight {
  DType dtype;
  int64_t n, k, group = 0;
  bool asym = false;
  std::vector<uint8_t> data;
  std::vector<float> scales, zeros, values;  // values: [n][k] dequantized
};

TestWeight make_weight(DType t, int64_t n, int64_t k, std::mt19937_64& rng, int64_t group = 32, bool asym = false) {
  TestWeight w{t, n, k, group, asym, {}, {}, {}, std::vector<float>(size_t(n * k))};
  std::uniform_real_distribution<float> u(-1, 1);
  if (t == DType::I8) {
    w.data.resize(size_t(n * k));
    for (auto& b : w.data) b = uint8_t(int8_t(std::uniform_int_distribution<int>(-127, 127)(rng)));
    for (int64_t j = 0; j < n; ++j) w.scales.push_back(0.001f + 0.02f * std::fabs(u(rng)));
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t c = 0; c < k; ++c) w.values[size_t(j * k + c)] = float(int8_t(w.data[size_t(j * k + c)])) * w.scales[size_t(j)];
    }
    return w;
  }
  if (t == DType::I4) {
    w.data.resize(size_t(n * k / 2));
    for (auto& b : w.data) b = uint8_t(std::uniform_int_distribution<int>(0, 255)(rng));
    const int64_t groups = k / group;
    for (int64_t i = 0; i < n * groups; ++i) {
      w.scales.push_back(0.01f + 0.1f * std::fabs(u(rng)));
      if (asym) w.zeros.push_back(float(std::uniform_int_distribution<int>(0, 15)(rng)));
    }
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t c = 0; c < k; ++c) {
        const uint8_t byte = w.data[size_t(j * k / 2 + c / 2)];
        const int q = (c & 1) ? (byte >> 4) : (byte & 15);
        const size_t gi = size_t(j * groups + c / group);
        w.values[size_t(j * k + c)] = (float(q) - (asym ? w.zeros[gi] : 8.0f)) * w.scales[gi];
      }
    }
    return w;
  }
  const size_t row = dtype_row_bytes(t, k);
  w.data.resize(row * size_t(n));
  if (iq_grid_type(t)) {
    // Codebook formats: random blocks (every index is in range) under a small fp16 scale, so that
    // every grid entry, sign pattern and sub-scale occurs.
    for (auto& b : w.data) b = uint8_t(std::uniform_int_distribution<int>(0, 255)(rng));
    for (size_t at = 0; at < w.data.size(); at += dtype_block_bytes(t)) {
      const uint16_t d = f32_to_fp16(0.002f + 0.004f * u(rng));
      std::memcpy(&w.data[at], &d, 2);
    }
  } else {
    std::vector<float> src(size_t(n * k));
    for (float& x : src) x = u(rng);
    for (int64_t j = 0; j < n; ++j) quantize_row(t, src.data() + j * k, w.data.data() + size_t(j) * row, k);
  }
  for (int64_t j = 0; j < n; ++j) dequantize_row(t, w.data.data() + size_t(j) * row, w.values.data() + j * k, k);
  return w;
}

// Allowed error relative to sum |x * w| per output. The own kernels accumulate the exact weight
// values in f32; the cuBLAS path rounds activations (and expanded quantized weights) to f16/bf16.
// y[m][n] = x · Wᵀ in double over the weight's exact values, with the sum of |products| of each
// output (the scale a float-rounding error bound is relative to).
struct ReferenceGemm {
  std::vector<float> y;
  std::vector<double> mag;
};
ReferenceGemm reference_gemm(const std::vector<float>& x, int64_t m, const TestWeight& w) {
  ReferenceGemm r{std::vector<float>(size_t(m * w.n)), std::vector<double>(size_t(m * w.n))};
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < w.n; ++j) {
      double acc = 0, abs_acc = 0;
      for (int64_t p = 0; p < w.k; ++p) {
        const double prod = double(x[size_t(i * w.k + p)]) * w.values[size_t(j * w.k + p)];
        acc += prod;
        abs_acc += std::fabs(prod);
      }
      r.y[size_t(i * w.n + j)] = float(acc);
      r.mag[size_t(i * w.n + j)] = abs_acc;
    }
  }
  return r;
}

double gemm_tolerance(DType t, int64_t m, bool own_only) {
  const bool blas = !own_only && m >= 9;
  if (!blas || t == DType::F32) return 2e-5;
  if (t == DType::BF16) return 1e-2;
  return 3e-3;
}

TEST_P(GpuOps, GemmEveryWeightTypeEveryPathMatchesReference) {
  SCOPED_TRACE(seed_note());
  struct Case {
    DType t;
    int64_t group;
    bool asym;
  };
  std::vector<Case> cases = {{DType::F32, 0, false}, {DType::F16, 0, false}, {DType::BF16, 0, false},
                             {DType::Q8_0, 0, false}, {DType::Q4_0, 0, false}, {DType::I4, 32, false},
                             {DType::I4, 64, true},   {DType::I4, 2, true}};
  for (DType t : kMoreGgufTypes) cases.push_back({t, 0, false});
  // m: decode sizes (GEMV), 9 (first tiled / BLAS size), 64+ (quantized BLAS expansion), odd tails.
  for (const Case& c : cases) {
    ASSERT_TRUE(gpu().supports(Op::gemm, c.t)) << dtype_name(c.t);
    bool ok = true;
    for (int64_t m : {1, 3, 8, 9, 37, 70}) {
      for (int32_t variant : {0, 1}) {
        const bool blocky = !dtype_is_float(c.t);
        // Every other shape has k a multiple of 32 and up to 2048, the vector GEMV path with several
        // rounds of loads per lane; the others any k the type allows. Super-blocks: 1 to 6 of 256.
        const bool round_k = (m + variant) % 2 == 0;
        const int64_t k = dtype_block_elems(c.t) == 256 ? 256 * pick(1, 6)
                          : blocky || round_k           ? 32 * pick(1, round_k ? 64 : 12)
                                                        : pick(1, 300) * (c.t == DType::I4 ? 2 : 1);
        const int64_t n = pick(1, 200);
        if (c.t == DType::I4 && k % c.group != 0) continue;
        SCOPED_TRACE(std::string(dtype_name(c.t)) + " m=" + std::to_string(m) + " n=" + std::to_string(n) +
                     " k=" + std::to_string(k) + " group=" + std::to_string(c.group) + " variant=" +
                     std::to_string(variant));
        TestWeight w = make_weight(c.t, n, k, rng_, c.group, c.asym);
        const auto x = floats(size_t(m * k), -2, 2);
        DeviceBuffer wd = up(gpu(), w.data), sd = up(gpu(), w.scales), zd = up(gpu(), w.zeros);
        DeviceBuffer xd = up(gpu(), x), yd = poisoned(gpu(), size_t(m * n));
        WeightView view{wd.get(), c.t, n, k};
        if (c.t == DType::I4) {
          view.scales = sd.as<float>();
          view.zeros = c.asym ? zd.as<float>() : nullptr;
          view.group_size = c.group;
        }
        view.kernel_variant = variant;
        gpu().gemm(xd.as<float>(), m, view, yd.as<float>());
        const auto y = read(gpu(), yd, size_t(m * n));
        const ReferenceGemm want = reference_gemm(x, m, w);
        const double tol = gemm_tolerance(c.t, m, variant == 1);
        const testing::AssertionResult same = close(y, want.y, [&](size_t i) { return tol * want.mag[i] + 1e-6; });
        EXPECT_TRUE(same);
        ok = ok && bool(same);
      }
    }
    // Per type in the test's JSON record, for scripts/gpu_check.sh's table.
    RecordProperty("gemm_" + std::string(dtype_name(c.t)) + (c.group > 0 ? "_g" + std::to_string(c.group) : ""),
                   ok ? "ok" : "FAILED");
  }
}

// The decode GEMV's three shapes of launch: a warp per row (many rows), several warps per row (few
// rows, long ones), and short rows; one and several activation rows.
TEST_P(GpuOps, DecodeGemvPathsMatchReference) {
  SCOPED_TRACE(seed_note());
  for (DType t : {DType::F32, DType::F16, DType::I4, DType::Q5_1, DType::Q4_K, DType::IQ3_S}) {
    const int64_t block = dtype_block_elems(t) == 256 ? 256 : 32;  // k-quant rows: whole super-blocks
    for (auto [n, k] : {std::pair<int64_t, int64_t>{4100 + pick(0, 900), 1024}, {pick(100, 300), 1024 + block * pick(0, 4)},
                        {pick(100, 300), block * pick(1, 16)}}) {
      for (int64_t m : {1, 3, 8}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" +
                     std::to_string(k));
        TestWeight w = make_weight(t, n, k, rng_, 32, false);
        const auto x = floats(size_t(m * k), -2, 2);
        DeviceBuffer wd = up(gpu(), w.data), sd = up(gpu(), w.scales), xd = up(gpu(), x);
        DeviceBuffer yd = poisoned(gpu(), size_t(m * n));
        WeightView view{wd.get(), t, n, k};
        if (t == DType::I4) {
          view.scales = sd.as<float>();
          view.group_size = 32;
        }
        gpu().gemm(xd.as<float>(), m, view, yd.as<float>());
        const auto y = read(gpu(), yd, size_t(m * n));
        const ReferenceGemm want = reference_gemm(x, m, w);
        EXPECT_TRUE(close(y, want.y, [&](size_t i) { return 2e-5 * want.mag[i] + 1e-6; }));
      }
    }
  }
}

// The backend replays a repeated sequence of ops from a captured graph: every repetition must still
// read the inputs as they are now, and a sequence whose arguments change (another output buffer)
// must not replay the old one.
TEST_P(GpuOps, RepeatedOpSequencesReadFreshInputs) {
  SCOPED_TRACE(seed_note());
  const int64_t n = pick(100, 300), k = 32 * pick(4, 40);
  TestWeight w = make_weight(DType::F16, n, k, rng_);
  DeviceBuffer wd = up(gpu(), w.data), xd = up(gpu(), floats(size_t(k)));
  DeviceBuffer y1 = poisoned(gpu(), size_t(n)), y2 = poisoned(gpu(), size_t(n));
  const WeightView view{wd.get(), DType::F16, n, k};
  for (int round = 0; round < 6; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const auto x = floats(size_t(k));
    gpu().copy_to_device(xd.get(), x.data(), x.size() * 4);
    DeviceBuffer& y = round == 4 ? y2 : y1;  // round 4 writes elsewhere; round 5 is round 3's sequence again
    gpu().gemm(xd.as<float>(), 1, view, y.as<float>());
    gpu().add(y.as<float>(), y.as<float>(), y.as<float>(), n);
    const auto got = read(gpu(), y, size_t(n));
    ReferenceGemm want = reference_gemm(x, 1, w);
    for (float& v : want.y) v *= 2;  // y + y
    EXPECT_TRUE(close(got, want.y, [&](size_t i) { return 2e-5 * want.mag[i] + 1e-6; }));
  }
}

// W8A8 quantizes activations per token exactly as the CPU does and accumulates exactly in int32,
// so the device must give the CPU's results to the last bit.
TEST_P(GpuOps, GemmInt8EqualsCpuBitForBit) {
  SCOPED_TRACE(seed_note());
  ASSERT_TRUE(gpu().supports(Op::gemm, DType::I8));
  for (int64_t m : {1, 2, 8, 9, 64, 101}) {
    // m = 1 and even m: k a multiple of 16 (the 16-byte GEMV, several rounds per lane, quantizing in
    // the same launch up to m = 8); other m: any k.
    const int64_t n = pick(1, 300), k = m == 1 || m % 2 == 0 ? 16 * pick(1, 200) : pick(1, 700);
    SCOPED_TRACE("m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k));
    TestWeight w = make_weight(DType::I8, n, k, rng_);
    auto x = floats(size_t(m * k), -3, 3);
    if (m > 1) std::fill(x.begin() + k, x.begin() + 2 * k, 0.0f);  // an all-zero row: scale 0
    auto run = [&](Backend& b) {
      DeviceBuffer wd = up(b, w.data), sd = up(b, w.scales), xd = up(b, x), yd = poisoned(b, size_t(m * n));
      WeightView view{wd.get(), DType::I8, n, k, sd.as<float>()};
      b.gemm(xd.as<float>(), m, view, yd.as<float>());
      return read(b, yd, size_t(m * n));
    };
    const auto got = run(gpu()), want = run(cpu());
    EXPECT_TRUE(close(got, want, [](size_t) { return 0.0; }));
  }
  // m = 0 validates the view only (the int8 quantizer's load-time check).
  EXPECT_NO_THROW(gpu().gemm(nullptr, 0, WeightView{nullptr, DType::I8, 4, 4, reinterpret_cast<const float*>(16)}, nullptr));
}

TEST_P(GpuOps, GemmRefusesWhatItCannotDo) {
  EXPECT_FALSE(gpu().supports(Op::gemm, DType::I32));
  DeviceBuffer b(gpu(), 64);
  try {
    gpu().gemm(b.as<float>(), 1, WeightView{b.get(), DType::I32, 1, 4}, b.as<float>());
    ADD_FAILURE() << "int32 gemm should be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not support int32"), std::string::npos) << e.what();
  }
  // A k-quant row must be whole super-blocks of 256.
  try {
    gpu().gemm(b.as<float>(), 1, WeightView{b.get(), DType::Q6_K, 1, 288}, b.as<float>());
    ADD_FAILURE() << "a q6_k row of 288 elements should be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a whole number"), std::string::npos) << e.what();
  }
  WeightView bad{b.get(), DType::F32, 1, 4};
  bad.kernel_variant = 7;
  EXPECT_THROW(gpu().gemm(b.as<float>(), 1, bad, b.as<float>()), Error);
}

// ---- row ops ----------------------------------------------------------------------------------------

TEST_P(GpuOps, EmbeddingEqualsCpuForEveryTableType) {
  SCOPED_TRACE(seed_note());
  std::vector<DType> types = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0};
  types.insert(types.end(), std::begin(kMoreGgufTypes), std::end(kMoreGgufTypes));
  for (DType t : types) {
    ASSERT_TRUE(gpu().supports(Op::embedding, t));
    const int64_t vocab = pick(1, 500), dim = dtype_block_elems(t) == 256 ? 256 * pick(1, 3) : 32 * pick(1, 20);
    SCOPED_TRACE(std::string(dtype_name(t)) + " vocab " + std::to_string(vocab) + " dim " + std::to_string(dim));
    TestWeight table = make_weight(t, vocab, dim, rng_);
    std::vector<int32_t> ids(static_cast<size_t>(pick(1, 50)));
    for (auto& id : ids) id = int32_t(pick(0, vocab - 1));
    auto run = [&](Backend& b) {
      DeviceBuffer td = up(b, table.data), id = up(b, ids), od = poisoned(b, ids.size() * size_t(dim));
      b.embedding(WeightView{td.get(), t, vocab, dim}, id.as<int32_t>(), int64_t(ids.size()), od.as<float>());
      return read(b, od, ids.size() * size_t(dim));
    };
    // Exact: the device rounds each product and sum as the CPU does (no fused multiply-add).
    const testing::AssertionResult same = close(run(gpu()), run(cpu()), [](size_t) { return 0.0; });
    EXPECT_TRUE(same);
    RecordProperty("embedding_" + std::string(dtype_name(t)), same ? "ok" : "FAILED");
  }
  EXPECT_FALSE(gpu().supports(Op::embedding, DType::I8));
}

TEST_P(GpuOps, OutOfRangeTokenIsReportedAtTheNextSync) {
  std::vector<uint8_t> table(4 * 8 * 4, 0);
  DeviceBuffer td = up(gpu(), table), od = poisoned(gpu(), 16);
  DeviceBuffer id = up(gpu(), std::vector<int32_t>{1, 4});
  gpu().embedding(WeightView{td.get(), DType::F32, 4, 8}, id.as<int32_t>(), 2, od.as<float>());
  try {
    gpu().synchronize();
    ADD_FAILURE() << "token 4 of a 4-row table should be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 4 is outside the vocabulary (0..3)"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(gpu().synchronize()) << "the error is reported once";
}

TEST_P(GpuOps, RmsNormRopeSoftmaxSiluAddMatchCpu) {
  SCOPED_TRACE(seed_note());
  const int64_t rows = pick(1, 40);
  {
    const int64_t dim = pick(1, 3000);
    SCOPED_TRACE("rms_norm dim " + std::to_string(dim));
    const auto x = floats(size_t(rows * dim), -4, 4), w = floats(size_t(dim), 0.5f, 1.5f);
    auto run = [&](Backend& b, bool in_place) {
      DeviceBuffer xd = up(b, x, kGuard), wd = up(b, w), od = poisoned(b, x.size());
      if (in_place) {
        b.copy_to_device(xd.as<float>() + x.size(), std::vector<float>(kGuard, std::nanf("")).data(), kGuard * 4);
      }
      b.rms_norm(xd.as<float>(), wd.as<float>(), in_place ? xd.as<float>() : od.as<float>(), rows, dim, 1e-5f);
      return read(b, in_place ? xd : od, x.size());
    };
    const auto want = run(cpu(), false);
    EXPECT_TRUE(close(run(gpu(), false), want, [&](size_t i) { return 1e-5 * std::fabs(want[i]) + 1e-6; }));
    EXPECT_TRUE(close(run(gpu(), true), want, [&](size_t i) { return 1e-5 * std::fabs(want[i]) + 1e-6; })) << "in place";
  }
  for (RopeStyle style : {RopeStyle::adjacent, RopeStyle::neox}) {
    const int64_t head_dim = 2 * pick(1, 128), n_heads = pick(1, 8);
    const int64_t rope_dim = 2 * pick(1, head_dim / 2);
    SCOPED_TRACE("rope head_dim " + std::to_string(head_dim) + " rope_dim " + std::to_string(rope_dim));
    const auto x = floats(size_t(rows * n_heads * head_dim));
    std::vector<int32_t> pos(static_cast<size_t>(rows));
    // Positions on both sides of the backend's table of rotations (8192 positions on CUDA/HIP).
    for (size_t r = 0; r < pos.size(); ++r) pos[r] = int32_t(r % 2 == 0 ? pick(0, 8191) : pick(8192, 20000));
    auto run = [&](Backend& b) {
      DeviceBuffer xd = up(b, x, kGuard), pd = up(b, pos);
      b.copy_to_device(xd.as<float>() + x.size(), std::vector<float>(kGuard, std::nanf("")).data(), kGuard * 4);
      b.rope(xd.as<float>(), pd.as<int32_t>(), rows, n_heads, head_dim, rope_dim, 10000.0f, style);
      return read(b, xd, x.size());
    };
    EXPECT_TRUE(close(run(gpu()), run(cpu()), [](size_t) { return 2e-6; }));  // angles in double on both
  }
  {
    const int64_t cols = pick(1, 40000);
    SCOPED_TRACE("softmax cols " + std::to_string(cols));
    const auto x = floats(size_t(rows * cols), -30, 30);
    auto run = [&](Backend& b) {
      DeviceBuffer xd = up(b, x, kGuard);
      b.copy_to_device(xd.as<float>() + x.size(), std::vector<float>(kGuard, std::nanf("")).data(), kGuard * 4);
      b.softmax(xd.as<float>(), rows, cols);
      return read(b, xd, x.size());
    };
    const auto want = run(cpu());
    EXPECT_TRUE(close(run(gpu()), want, [&](size_t i) { return 1e-5 * want[i] + 1e-9; }));
  }
  {
    const size_t n = size_t(pick(1, 100000));
    const auto a = floats(n, -10, 10), c = floats(n, -10, 10);
    auto run = [&](Backend& b, bool silu) {
      DeviceBuffer ad = up(b, a), cd = up(b, c), od = poisoned(b, n);
      if (silu) {
        b.silu_mul(ad.as<float>(), cd.as<float>(), od.as<float>(), int64_t(n));
      } else {
        b.add(ad.as<float>(), cd.as<float>(), od.as<float>(), int64_t(n));
      }
      return read(b, od, n);
    };
    EXPECT_TRUE(close(run(gpu(), false), run(cpu(), false), [](size_t) { return 0.0; })) << "add";
    const auto want = run(cpu(), true);
    EXPECT_TRUE(close(run(gpu(), true), want, [&](size_t i) { return 1e-6 * std::fabs(want[i]) + 1e-7; })) << "silu_mul";
  }
}

// A decode step's neighbours the GPU backends launch as one kernel: a residual add and the norm of
// its sum (in place, the norm written over the add's second input, as the model calls them), and the
// queries' rope then the keys' at the same positions.
TEST_P(GpuOps, FusedNeighbourOpsMatchCpu) {
  SCOPED_TRACE(seed_note());
  const int64_t rows = pick(1, 8);
  for (int64_t dim : {pick(1, 600) * 4, pick(1, 3000)}) {
    SCOPED_TRACE("add + rms_norm dim " + std::to_string(dim));
    const auto a = floats(size_t(rows * dim), -2, 2), b = floats(size_t(rows * dim), -2, 2);
    const auto w = floats(size_t(dim), 0.5f, 1.5f);
    auto run = [&](Backend& be) {
      DeviceBuffer ad = up(be, a, kGuard), bd = up(be, b, kGuard), wd = up(be, w);
      be.copy_to_device(ad.as<float>() + a.size(), std::vector<float>(kGuard, std::nanf("")).data(), kGuard * 4);
      be.copy_to_device(bd.as<float>() + b.size(), std::vector<float>(kGuard, std::nanf("")).data(), kGuard * 4);
      be.add(ad.as<float>(), bd.as<float>(), ad.as<float>(), rows * dim);
      be.rms_norm(ad.as<float>(), wd.as<float>(), bd.as<float>(), rows, dim, 1e-5f);
      return std::pair{read(be, ad, a.size()), read(be, bd, b.size())};
    };
    const auto [sum, norm] = run(gpu());
    const auto [want_sum, want_norm] = run(cpu());
    EXPECT_TRUE(close(sum, want_sum, [](size_t) { return 0.0; })) << "sum";
    const auto& want = want_norm;  // clang before 16 cannot capture a structured binding
    EXPECT_TRUE(close(norm, want_norm, [&](size_t i) { return 1e-5 * std::fabs(want[i]) + 1e-6; })) << "norm";
  }
  {
    const int64_t head_dim = 2 * pick(1, 64), n_q = pick(1, 8), n_k = pick(1, 4);
    SCOPED_TRACE("two ropes, head_dim " + std::to_string(head_dim));
    const auto q = floats(size_t(rows * n_q * head_dim)), k = floats(size_t(rows * n_k * head_dim));
    std::vector<int32_t> pos(static_cast<size_t>(rows));
    for (auto& p : pos) p = int32_t(pick(0, 9000));
    auto run = [&](Backend& be) {
      DeviceBuffer qd = up(be, q, kGuard), kd = up(be, k, kGuard), pd = up(be, pos);
      be.copy_to_device(qd.as<float>() + q.size(), std::vector<float>(kGuard, std::nanf("")).data(), kGuard * 4);
      be.copy_to_device(kd.as<float>() + k.size(), std::vector<float>(kGuard, std::nanf("")).data(), kGuard * 4);
      be.rope(qd.as<float>(), pd.as<int32_t>(), rows, n_q, head_dim, head_dim, 10000.0f, RopeStyle::neox);
      be.rope(kd.as<float>(), pd.as<int32_t>(), rows, n_k, head_dim, head_dim, 10000.0f, RopeStyle::neox);
      return std::pair{read(be, qd, q.size()), read(be, kd, k.size())};
    };
    const auto [gq, gk] = run(gpu());
    const auto [cq, ck] = run(cpu());
    EXPECT_TRUE(close(gq, cq, [](size_t) { return 2e-6; })) << "queries";
    EXPECT_TRUE(close(gk, ck, [](size_t) { return 2e-6; })) << "keys";
  }
}

TEST_P(GpuOps, ArgmaxEqualsCpuIncludingTies) {
  SCOPED_TRACE(seed_note());
  const int64_t rows = pick(1, 64), cols = pick(1, 70000);
  std::vector<float> x(size_t(rows * cols));
  // Few distinct values, so rows have many tied maxima: the first must win.
  for (float& v : x) v = float(pick(-20, 20));
  for (int64_t r = 0; r < rows; r += 3) x[size_t(r * cols + pick(0, cols - 1))] = -INFINITY;
  auto run = [&](Backend& b) {
    DeviceBuffer xd = up(b, x), od = up(b, std::vector<int32_t>(size_t(rows + 4), -7));
    b.argmax(xd.as<float>(), rows, cols, od.as<int32_t>());
    b.synchronize();
    std::vector<int32_t> out(size_t(rows + 4));
    b.copy_to_host(out.data(), od.get(), out.size() * 4);
    return out;
  };
  EXPECT_EQ(run(gpu()), run(cpu()));
}

struct Golden {
  std::vector<int32_t> prompt, completion;
};

std::vector<Golden> golden(const std::string& file) {
  std::vector<Golden> out;
  for (const auto& item : test::read_json(test::kShared + "/golden/" + file)) {
    out.push_back({item.at("prompt_token_ids"), item.at("completion_token_ids")});
  }
  return out;
}

std::vector<std::vector<int32_t>> generate(Pipeline& p, const std::vector<Golden>& cases, bool together) {
  std::vector<std::vector<int32_t>> out;
  auto run = [&](size_t begin, size_t end) {
    Engine engine(p);
    for (size_t i = begin; i < end; ++i) {
      GenerationRequest req;
      req.prompt = cases[i].prompt;
      req.max_tokens = int64_t(cases[i].completion.size());
      engine.submit(std::move(req));
    }
    engine.run_until_idle();
    auto results = engine.take_finished();
    std::sort(results.begin(), results.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
    for (auto& r : results) out.push_back(r.tokens);
  };
  if (together) {
    run(0, cases.size());
  } else {
    for (size_t i = 0; i < cases.size(); ++i) run(i, i + 1);
  }
  return out;
}

std::unique_ptr<Pipeline> device_pipeline(const std::string& backend, const std::string& model,
                                          const nlohmann::json& components = nlohmann::json::object(),
                                          const nlohmann::json& backend_params = nlohmann::json::object()) {
  PipelineSpec spec = default_pipeline_spec();
  spec.model = model;
  spec.backend = backend;
  spec.backend_params = backend_params;
  for (const auto& [kind_text, value] : components.items()) {
    ComponentKind kind;
    if (!parse_kind(kind_text, &kind)) throw Error("bad kind in test: " + kind_text);
    ComponentSpec c;
    c.plugin = value.at("plugin").get<std::string>();
    c.params = value;
    c.params.erase("plugin");
    c.where = "test";
    spec.components[kind] = c;
  }
  return Pipeline::build(spec, test::plugins());
}

TEST_P(GpuOps, Stories260KGreedyTokensEqualTheGoldenFileAloneAndBatched) {
  const auto cases = golden("stories260K-f32.greedy96.json");
  ASSERT_EQ(cases.size(), 5u);
  for (const auto& [cache, graphs] : {std::pair{"contiguous", true}, {"paged", true}, {"paged", false}}) {
    SCOPED_TRACE(std::string(cache) + (graphs ? "" : ", graphs: false"));
    nlohmann::json comps = {{"cache", {{"plugin", cache}}}};
    if (std::string(cache) == "paged") comps["cache"]["memory"] = "64MiB";
    auto p = device_pipeline(GetParam(), test::kStoriesF32, comps, {{"graphs", graphs}});
    ASSERT_EQ(p->backend().name(), GetParam());
    for (bool together : {false, true}) {
      const auto got = generate(*p, cases, together);
      ASSERT_EQ(got.size(), cases.size());
      for (size_t i = 0; i < cases.size(); ++i) {
        EXPECT_EQ(got[i], cases[i].completion) << "prompt " << i << (together ? " (batched)" : " (alone)");
      }
    }
  }
}

// Every op the float model needs is supported, so `backend: auto` must choose the device (CUDA is
// tried before HIP).
TEST_P(GpuOps, AutoBackendPicksTheDevice) {
  auto p = device_pipeline("auto", test::kStoriesF32);
  if (GetParam() == "cuda") {
    EXPECT_EQ(p->backend().name(), "cuda");
  } else {
    EXPECT_NE(p->backend().name(), "cpu");
  }
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuOps, testing::Values("cuda", "hip"),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace tessera
