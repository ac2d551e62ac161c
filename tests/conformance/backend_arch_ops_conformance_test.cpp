// The backend ops architectures beyond llama use (core/src/arch): GeGLU, row biases, scaling and
// RoPE by given frequencies, against double-precision references (see backend_conformance_test.cpp
// for the suite's rules). Each op runs where the backend claims it; the cpu reference claims all.
#include <cmath>

#include "conformance/backend_conformance.h"

namespace tessera {
namespace {

using namespace conformance;

TEST_P(BackendConformance, GeluMulMatchesTheTanhApproximation) {
  if (!claims(Op::gelu_mul, DType::F32)) GTEST_SKIP() << "gelu_mul not supported";
  for (int64_t n : {1, 13, 1000}) {
    SCOPED_TRACE("n " + std::to_string(n));
    const auto g = random_floats(size_t(n), 700 + uint64_t(n), -6, 6), u = random_floats(size_t(n), 800 + uint64_t(n), -2, 2);
    std::vector<double> want(static_cast<size_t>(n));
    for (size_t i = 0; i < size_t(n); ++i) {
      const double x = g[i];
      want[i] = 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))) * u[i];
    }
    DeviceBuffer gb = upload(b(), g), ub = upload(b(), u), ob = output(size_t(n));
    b().gelu_mul(gb.as<float>(), ub.as<float>(), ob.as<float>(), n);
    b().synchronize();
    EXPECT_TRUE(all_close(read_output(ob, size_t(n)), want, [&](size_t i) { return 1e-5 * std::abs(want[i]) + 1e-6; }));
  }
}

TEST_P(BackendConformance, AddRowsAndScaleAreExact) {
  if (!claims(Op::add_rows, DType::F32) || !claims(Op::scale, DType::F32)) GTEST_SKIP() << "add_rows/scale not supported";
  const int64_t rows = 5, cols = 37;
  const auto x = random_floats(size_t(rows * cols), 900), row = random_floats(size_t(cols), 901);
  std::vector<double> want(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) want[size_t(r * cols + c)] = (x[size_t(r * cols + c)] + row[size_t(c)]) * 3.0f;  // float ops
  }
  DeviceBuffer xb = upload(b(), x, kGuard), rb = upload(b(), row);
  poison(b(), xb.as<float>() + x.size(), kGuard);
  b().add_rows(xb.as<float>(), rb.as<float>(), rows, cols);
  b().scale(xb.as<float>(), 3.0f, rows * cols);
  b().synchronize();
  EXPECT_TRUE(all_close(read_output(xb, x.size()), want, [](size_t) { return 0.0; }));
}

TEST_P(BackendConformance, RopeFreqsTurnsEachPairByItsFrequency) {
  if (!claims(Op::rope_freqs, DType::F32)) GTEST_SKIP() << "rope_freqs not supported";
  const std::vector<int32_t> positions = {0, 3, 50, 700};
  const int64_t rows = int64_t(positions.size()), n_heads = 2;
  for (RopeStyle style : {RopeStyle::adjacent, RopeStyle::neox}) {
    for (int64_t head_dim : {8, 64}) {
      const int64_t rope_dim = head_dim, half = rope_dim / 2;
      SCOPED_TRACE(std::string(style == RopeStyle::adjacent ? "adjacent" : "neox") + " head_dim " + std::to_string(head_dim));
      const auto x = random_floats(size_t(rows * n_heads * head_dim), 1000 + uint64_t(head_dim));
      const auto freqs = random_floats(size_t(half), 1100 + uint64_t(head_dim), 0.0f, 0.5f);
      const float mscale = 1.25f;
      std::vector<double> want(x.begin(), x.end());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t h = 0; h < n_heads; ++h) {
          const size_t base = size_t((r * n_heads + h) * head_dim);
          for (int64_t i = 0; i < half; ++i) {
            const double a = positions[size_t(r)] * double(freqs[size_t(i)]);
            const size_t i0 = base + size_t(style == RopeStyle::adjacent ? 2 * i : i);
            const size_t i1 = base + size_t(style == RopeStyle::adjacent ? 2 * i + 1 : i + half);
            want[i0] = mscale * (x[i0] * std::cos(a) - x[i1] * std::sin(a));
            want[i1] = mscale * (x[i0] * std::sin(a) + x[i1] * std::cos(a));
          }
        }
      }
      DeviceBuffer xb = upload(b(), x, kGuard), pb = upload(b(), positions), fb = upload(b(), freqs);
      poison(b(), xb.as<float>() + x.size(), kGuard);
      b().rope_freqs(xb.as<float>(), pb.as<int32_t>(), rows, n_heads, head_dim, rope_dim, fb.as<float>(), mscale, style);
      b().synchronize();
      EXPECT_TRUE(all_close(read_output(xb, x.size()), want, [](size_t) { return 1e-4; }));
    }
  }
}

}  // namespace
}  // namespace tessera
