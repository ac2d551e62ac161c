// The GPU's GGUF block decoders (kernels_cuda/kernels/gguf_blocks.cuh) compiled as host code and
// checked against the CPU's dequantize_row on random blocks: every bit layout the CUDA and HIP gemm
// and embedding read is verified on any machine, with or without a GPU. The device compilers build
// the same functions (gpu_ops_test.cpp then checks the kernels end to end where a device is lent).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../../kernels_cuda/iq_tables.h"
#include "tessera/dtype.h"

namespace tessera {
namespace {

namespace gg = gpu::gguf;

// Byte offsets of each format's fp16 scales (d, and dmin or m where the format has one).
std::vector<int> fp16_fields(DType t) {
  switch (t) {
    case DType::Q4_1:
    case DType::Q5_1:
    case DType::Q4_K:
    case DType::Q5_K: return {0, 2};
    case DType::Q2_K: return {80, 82};
    case DType::Q3_K: return {108};
    case DType::Q6_K: return {208};
    default: return {0};  // Q5_0, IQ4_NL, IQ4_XS, the IQ2/IQ3 grid formats
  }
}

// `rows` rows of n elements: random bytes, with finite random scales of either sign.
std::vector<uint8_t> random_rows(DType t, int64_t rows, int64_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> data(dtype_row_bytes(t, n) * size_t(rows));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : data) b = uint8_t(byte(rng));
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  for (size_t at = 0; at < data.size(); at += dtype_block_bytes(t)) {
    for (int off : fp16_fields(t)) {
      const uint16_t h = f32_to_fp16(scale(rng));
      std::memcpy(&data[at + size_t(off)], &h, 2);
    }
  }
  return data;
}

// The grid formats take the uploaded tables as a last argument; the others nothing.
template <class B, class... Tables>
void check_format(DType t, const Tables*... tables) {
  SCOPED_TRACE(std::string(dtype_name(t)));
  ASSERT_EQ(B::kElems, dtype_block_elems(t));
  ASSERT_EQ(size_t(B::kBytes), dtype_block_bytes(t));
  std::mt19937_64 rng(1234 + uint64_t(t));
  // A row of one block, and rows of several (for the 32-element formats, a count that is not a whole
  // number of 256-element super-blocks).
  for (int64_t n : {int64_t(B::kElems), int64_t(B::kElems) * (B::kElems == 32 ? 7 : 3)}) {
    const int64_t rows = 5;
    const auto data = random_rows(t, rows, n, rng);
    const size_t row_bytes = dtype_row_bytes(t, n);
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* row = data.data() + size_t(r) * row_bytes;
      std::vector<float> want(static_cast<size_t>(n));
      dequantize_row(t, row, want.data(), n);
      for (int64_t u = 0; u < n / 32; ++u) {
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(want[size_t(32 * u + i)]));
        // One rounding of a product apart at most (a compiler may fuse d·q - m into one fma).
        const float bound = 1e-6f * amax;
        float unit[32];
        gg::row_unit32<B>(row, u, unit, tables...);
        for (int i = 0; i < 32; ++i) {
          const int64_t c = 32 * u + i;
          ASSERT_TRUE(std::isfinite(want[size_t(c)]));
          ASSERT_NEAR(unit[i], want[size_t(c)], bound) << "sub32: row " << r << " of n=" << n << ", element " << c;
          ASSERT_NEAR(gg::row_element<B>(row, c, tables...), want[size_t(c)], bound)
              << "element: row " << r << " of n=" << n << ", element " << c;
        }
      }
    }
  }
}

TEST(GpuBlockDecode, Q4_1) { check_format<gg::Q4_1>(DType::Q4_1); }
TEST(GpuBlockDecode, Q5_0) { check_format<gg::Q5_0>(DType::Q5_0); }
TEST(GpuBlockDecode, Q5_1) { check_format<gg::Q5_1>(DType::Q5_1); }
TEST(GpuBlockDecode, Iq4Nl) { check_format<gg::Iq4Nl>(DType::IQ4_NL); }
TEST(GpuBlockDecode, Q2_K) { check_format<gg::Q2_K>(DType::Q2_K); }
TEST(GpuBlockDecode, Q3_K) { check_format<gg::Q3_K>(DType::Q3_K); }
TEST(GpuBlockDecode, Q4_K) { check_format<gg::Q4_K>(DType::Q4_K); }
TEST(GpuBlockDecode, Q5_K) { check_format<gg::Q5_K>(DType::Q5_K); }
TEST(GpuBlockDecode, Q6_K) { check_format<gg::Q6_K>(DType::Q6_K); }
TEST(GpuBlockDecode, Iq4Xs) { check_format<gg::Iq4Xs>(DType::IQ4_XS); }

class GpuGridDecode : public testing::Test {
 protected:
  const uint8_t* tables() const { return reinterpret_cast<const uint8_t*>(words_.data()); }
  std::vector<uint64_t> words_ = gpu::iq_table_bytes();
};
TEST_F(GpuGridDecode, Iq2Xxs) { check_format<gg::Iq2Xxs>(DType::IQ2_XXS, tables()); }
TEST_F(GpuGridDecode, Iq2Xs) { check_format<gg::Iq2Xs>(DType::IQ2_XS, tables()); }
TEST_F(GpuGridDecode, Iq2S) { check_format<gg::Iq2S>(DType::IQ2_S, tables()); }
TEST_F(GpuGridDecode, Iq3Xxs) { check_format<gg::Iq3Xxs>(DType::IQ3_XXS, tables()); }
TEST_F(GpuGridDecode, Iq3S) { check_format<gg::Iq3S>(DType::IQ3_S, tables()); }

TEST(GpuBlockDecode, Iq4LevelsAreGgmlsTable) {
  for (int q = 0; q < 16; ++q) EXPECT_EQ(gg::iq4_level(q), float(kIq4NlValues[q])) << "level " << q;
}

// The host half conversion the test relies on, over every bit pattern.
TEST(GpuBlockDecode, HostHalfConversionIsExact) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const uint8_t bytes[2] = {uint8_t(h & 0xff), uint8_t(h >> 8)};
    const float got = gg::fp16(bytes), want = fp16_to_f32(uint16_t(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << h;
    } else {
      EXPECT_EQ(got, want) << std::hex << h;
    }
  }
}

}  // namespace
}  // namespace tessera
