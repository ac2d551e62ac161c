// The GGUF quantizers of every block type tessera writes (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K,
// IQ4_NL, IQ4_XS): blocks byte-identical to an independent NumPy implementation of ggml's reference
// quantizers (tests/reference/gguf_quantize.py) on random and awkward rows and on `tessera synth
// --dtype` models, our dequantization equal to NumPy's bit for bit, and a round trip through a GGUF
// file within ggml's published error bounds (test-quantize-fns).
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tessera/dtype.h"
#include "tessera/gguf.h"
#include "tessera/gguf_writer.h"
#include "tessera/quantize_blocks.h"
#include "test_util.h"

namespace tessera {
namespace {

struct TypeBound {
  DType t;
  // ggml's test-quantize-fns bound on sqrt(Σ (x - y)²) / n for x = 0.1 + 2·cos(i), n = 4096:
  // 0.0075 for Q2_K, 0.004 for Q3_K, 0.002 for every other type here.
  float max_total_error;
};

const TypeBound kTypes[] = {
    {DType::Q8_0, 0.002f},   {DType::Q4_0, 0.002f}, {DType::Q4_1, 0.002f}, {DType::Q5_0, 0.002f},
    {DType::Q5_1, 0.002f},   {DType::Q2_K, 0.0075f}, {DType::Q3_K, 0.004f}, {DType::Q4_K, 0.002f},
    {DType::Q5_K, 0.002f},   {DType::Q6_K, 0.002f}, {DType::IQ4_NL, 0.002f}, {DType::IQ4_XS, 0.002f},
};

bool have_numpy() { return std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0; }

// Runs a command, returning its exit status and combined output.
std::pair<int, std::string> run(const std::string& cmd) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

const std::string kChecker = "/usr/bin/python3 " TESSERA_SOURCE_DIR "/tests/reference/check_quantize.py";

// Rows of 512 that reach the quantizers' corners: Gaussian at several scales, all zero, constant,
// one zero sub-block (16 and 32) inside a live block, one outlier per block, all positive, all
// negative, small integers (exact rounding ties), values near fp16's smallest steps.
std::vector<float> awkward_rows(int64_t cols, int64_t& rows) {
  std::mt19937 rng(20240521);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> out;
  for (float scale : {1.0f, 0.02f, 300.0f}) {
    for (int r = 0; r < 2; ++r) {
      std::vector<float> v(static_cast<size_t>(cols));
      for (auto& x : v) x = scale * normal(rng);
      out.push_back(v);
    }
  }
  out.emplace_back(size_t(cols), 0.0f);
  out.emplace_back(size_t(cols), 0.75f);
  std::vector<float> v(static_cast<size_t>(cols));
  for (auto& x : v) x = normal(rng);
  for (int i = 0; i < 16; ++i) v[size_t(i)] = 0.0f;          // a zero group of 16
  for (int i = 288; i < 320; ++i) v[size_t(i)] = 0.0f;       // and of 32, inside live blocks
  out.push_back(v);
  for (auto& x : v) x = 0.1f * normal(rng);
  for (int64_t b = 0; b < cols; b += 32) v[size_t(b + (b / 32) % 32)] = (b % 64 ? -4.0f : 4.0f);
  out.push_back(v);
  for (auto& x : v) x = std::fabs(normal(rng));
  out.push_back(v);
  for (auto& x : v) x = -std::fabs(normal(rng)) - 0.5f;
  out.push_back(v);
  for (int64_t i = 0; i < cols; ++i) v[size_t(i)] = float(int((i * 7) % 9) - 4);
  out.push_back(v);
  for (auto& x : v) x = 1e-6f * normal(rng);
  out.push_back(v);
  rows = int64_t(out.size());
  std::vector<float> flat;
  for (const auto& row : out) flat.insert(flat.end(), row.begin(), row.end());
  return flat;
}

std::vector<uint8_t> quantize_rows(DType t, const std::vector<float>& x, int64_t rows, int64_t cols) {
  const size_t row_bytes = dtype_row_bytes(t, cols);
  std::vector<uint8_t> q(row_bytes * size_t(rows));
  for (int64_t r = 0; r < rows; ++r) quantize_row(t, x.data() + r * cols, q.data() + size_t(r) * row_bytes, cols);
  return q;
}

std::vector<uint8_t> float_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

TEST(GgufQuantize, BlocksAndDequantizationMatchTheNumPyReference) {
  if (!have_numpy()) GTEST_SKIP() << "/usr/bin/python3 with NumPy (Debian's python3-numpy) is needed";
  const test::TempDir dir;
  const int64_t cols = 512;
  int64_t rows = 0;
  const std::vector<float> x = awkward_rows(cols, rows);
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  for (const TypeBound& b : kTypes) {
    const std::string name(dtype_name(b.t));
    const std::vector<uint8_t> q = quantize_rows(b.t, x, rows, cols);
    std::vector<float> y(x.size());
    dequantize_row(b.t, q.data(), y.data(), int64_t(x.size()));
    w.add_tensor("x." + name, {cols, rows}, DType::F32, float_bytes(x));
    w.add_tensor("q." + name, {cols, rows}, b.t, q);
    w.add_tensor("d." + name, {cols, rows}, DType::F32, float_bytes(y));
  }
  const std::string path = dir.path() + "/pairs.gguf";
  w.write(path);
  const auto [status, out] = run(kChecker + " --pairs '" + path + "'");
  EXPECT_EQ(status, 0) << out;
  EXPECT_THAT(out, testing::HasSubstr("all identical")) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), std::size(kTypes) + 1) << out;  // one line per type
}

TEST(GgufQuantize, SynthModelsOfEveryTypeMatchTheNumPyReference) {
  if (!have_numpy()) GTEST_SKIP() << "/usr/bin/python3 with NumPy (Debian's python3-numpy) is needed";
  const auto [status, out] = run(kChecker + " --tessera '" TESSERA_BINARY "'");
  EXPECT_EQ(status, 0) << out;
  EXPECT_THAT(out, testing::HasSubstr("all identical")) << out;
  EXPECT_THAT(out, testing::Not(testing::HasSubstr(": 0 tensors checked"))) << out;
}

// Quantize -> GGUF file -> read back: the blocks come back bit-identical, and their dequantization
// is within ggml's bound for the type on ggml's own test signal (measured: Q8_0 0.000074,
// Q4_0 0.0011, Q4_1 0.0011, Q5_0 0.00059, Q5_1 0.00056, Q2_K 0.0047, Q3_K 0.0025, Q4_K 0.00098,
// Q5_K 0.00053, Q6_K 0.00026, IQ4_NL 0.0012, IQ4_XS 0.0013).
TEST(GgufQuantize, RoundTripThroughAFileWithinGgmlsErrorBounds) {
  const test::TempDir dir;
  const int64_t n = 4096;
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = float(0.1 + 2.0f * std::cos(float(i)));  // generate_data(0, n)
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  std::vector<std::vector<uint8_t>> written;
  for (const TypeBound& b : kTypes) {
    written.push_back(quantize_rows(b.t, x, 2, n / 2));
    w.add_tensor("t." + std::string(dtype_name(b.t)), {n / 2, 2}, b.t, written.back());
  }
  const std::string path = dir.path() + "/round_trip.gguf";
  w.write(path);
  auto f = GgufFile::open(path);
  for (size_t k = 0; k < std::size(kTypes); ++k) {
    const TypeBound& b = kTypes[k];
    SCOPED_TRACE(dtype_name(b.t));
    const GgufTensor* t = f->find_tensor("t." + std::string(dtype_name(b.t)));
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->dtype, b.t);
    ASSERT_EQ(t->rows(), 2);
    ASSERT_EQ(0, std::memcmp(t->data, written[k].data(), written[k].size()));
    std::vector<float> y(static_cast<size_t>(n));
    dequantize_row(b.t, static_cast<const uint8_t*>(t->data), y.data(), n);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += double(x[size_t(i)] - y[size_t(i)]) * double(x[size_t(i)] - y[size_t(i)]);
    const float total_error = std::sqrt(float(sum)) / float(n);  // test-quantize-fns' array_rmse
    EXPECT_LT(total_error, b.max_total_error);
    EXPECT_GT(total_error, b.max_total_error / 100) << "suspiciously exact";
  }
}

}  // namespace
}  // namespace tessera
