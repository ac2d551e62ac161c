// The GGUF block formats beside Q8_0/Q4_0/Q4_K/Q6_K (Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL,
// IQ4_XS): sizes and names as ggml has them, hand-built blocks decoding to the values ggml's layout
// defines, quantize -> dequantize within each type's error, blocks surviving a GGUF file byte for
// byte, and non-finite scales found.
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tessera/dtype.h"
#include "tessera/error.h"
#include "tessera/gguf.h"
#include "tessera/gguf_writer.h"
#include "tessera/quantize_blocks.h"
#include "test_util.h"

namespace tessera {
namespace {

struct TypeInfo {
  DType t;
  const char* name;
  int64_t block;
  size_t bytes;
  uint32_t ggml_id;
  double max_rel_rms;  // quantize -> dequantize error on Gaussian rows, relative to their RMS
};

// Errors measured on these rows (0.078, 0.042, 0.037, 0.29, 0.15, 0.036, 0.076, 0.076) with margin.
const TypeInfo kTypes[] = {
    {DType::Q4_1, "q4_1", 32, 20, 3, 0.09},    {DType::Q5_0, "q5_0", 32, 22, 6, 0.05},
    {DType::Q5_1, "q5_1", 32, 24, 7, 0.045},   {DType::Q2_K, "q2_k", 256, 84, 10, 0.33},
    {DType::Q3_K, "q3_k", 256, 110, 11, 0.17}, {DType::Q5_K, "q5_k", 256, 176, 13, 0.042},
    {DType::IQ4_NL, "iq4_nl", 32, 18, 20, 0.09}, {DType::IQ4_XS, "iq4_xs", 256, 136, 23, 0.09},
};

void put_fp16(uint8_t* p, float v) {
  const uint16_t h = f32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

std::vector<float> gaussian(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

std::vector<float> decode(DType t, const std::vector<uint8_t>& blocks, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  dequantize_row(t, blocks.data(), out.data(), n);
  return out;
}

TEST(GgufBlockTypes, SizesNamesAndGgmlIds) {
  for (const TypeInfo& i : kTypes) {
    SCOPED_TRACE(i.name);
    EXPECT_EQ(dtype_name(i.t), i.name);
    EXPECT_EQ(dtype_block_elems(i.t), i.block);
    EXPECT_EQ(dtype_block_bytes(i.t), i.bytes);
    EXPECT_EQ(GgufWriter::ggml_type_id(i.t), i.ggml_id);
    EXPECT_TRUE(quantize_supported(i.t));
    EXPECT_THAT(test::message_of([&] { dtype_row_bytes(i.t, i.block + 1); }), testing::HasSubstr(i.name));
  }
}

// Blocks built byte by byte from ggml's layouts; expected values written out from the format.
TEST(GgufBlockTypes, HandBuiltBlocksOfThirtyTwo) {
  {  // Q4_1: d = 0.5, m = -1; byte 3 = 0xa7 -> element 3 = 7, element 19 = 10.
    std::vector<uint8_t> b(20, 0);
    put_fp16(&b[0], 0.5f);
    put_fp16(&b[2], -1.0f);
    b[4 + 3] = 0xa7;
    const auto y = decode(DType::Q4_1, b, 32);
    EXPECT_FLOAT_EQ(y[3], 0.5f * 7 - 1);
    EXPECT_FLOAT_EQ(y[19], 0.5f * 10 - 1);
    EXPECT_FLOAT_EQ(y[0], -1.0f);
  }
  {  // Q5_0: d = 0.25; fifth bits 5 and 21 set; byte 5 = 0x3c -> element 5 = 12 + 16, 21 = 3 + 16.
    std::vector<uint8_t> b(22, 0);
    put_fp16(&b[0], 0.25f);
    const uint32_t high = (1u << 5) | (1u << 21);
    std::memcpy(&b[2], &high, 4);
    b[6 + 5] = 0x3c;
    const auto y = decode(DType::Q5_0, b, 32);
    EXPECT_FLOAT_EQ(y[5], 0.25f * (28 - 16));
    EXPECT_FLOAT_EQ(y[21], 0.25f * (19 - 16));
    EXPECT_FLOAT_EQ(y[6], 0.25f * -16);
  }
  {  // Q5_1: d = 2, m = 0.5; fifth bit 31; byte 15 = 0xf0 -> element 15 = 0, element 31 = 31.
    std::vector<uint8_t> b(24, 0);
    put_fp16(&b[0], 2.0f);
    put_fp16(&b[2], 0.5f);
    const uint32_t high = 1u << 31;
    std::memcpy(&b[4], &high, 4);
    b[8 + 15] = 0xf0;
    const auto y = decode(DType::Q5_1, b, 32);
    EXPECT_FLOAT_EQ(y[15], 0.5f);
    EXPECT_FLOAT_EQ(y[31], 2.0f * 31 + 0.5f);
  }
  {  // IQ4_NL: d = 0.5; byte 2 = 0xf0 -> element 2 = table[0] = -127, element 18 = table[15] = 113.
    std::vector<uint8_t> b(18, 0x88);
    put_fp16(&b[0], 0.5f);
    b[2 + 2] = 0xf0;
    const auto y = decode(DType::IQ4_NL, b, 32);
    EXPECT_FLOAT_EQ(y[2], 0.5f * -127);
    EXPECT_FLOAT_EQ(y[18], 0.5f * 113);
    EXPECT_FLOAT_EQ(y[0], 0.5f * 1);  // level 8
  }
}

TEST(GgufBlockTypes, HandBuiltSuperBlocks) {
  {  // Q2_K: element 128 + 64 + 17 (half 1, shift 2, l 17) is bits 4-5 of quant byte 32 + 17 and
     // takes scale byte 8 + 4 + 1 (scale 5, min 3); d = 0.5, dmin = 0.25.
    std::vector<uint8_t> b(84, 0);
    b[13] = 0x35;
    b[16 + 49] = 0x20;  // bits 4-5 = 2
    put_fp16(&b[80], 0.5f);
    put_fp16(&b[82], 0.25f);
    const auto y = decode(DType::Q2_K, b, 256);
    EXPECT_FLOAT_EQ(y[209], 0.5f * 5 * 2 - 0.25f * 3);
    EXPECT_FLOAT_EQ(y[208], -0.25f * 3);  // l = 16: the same scale byte, quant 0
    EXPECT_FLOAT_EQ(y[207], 0.0f);        // l = 15: scale byte 12, all zero
  }
  {  // Q3_K: element 128 + 96 + 3 (half 1, shift 3, l 3): bits 6-7 of quant byte 32 + 3, mask bit
     // 4 + 3 of byte 3, scale 8 + 6 = 14 (low nibble: byte 6's high nibble; top bits: byte 10's
     // bits 6-7). Scale 14 stored 0x2b -> 43 - 32 = 11; quant 1 with the mask bit set -> 1; d = 0.5.
    std::vector<uint8_t> b(110, 0);
    b[32 + 35] = 0x40;
    b[3] = 0x80;
    b[96 + 6] = 0xb0;
    b[96 + 10] = 0x80;  // top bits 2 -> 0x2b
    put_fp16(&b[108], 0.5f);
    const auto y = decode(DType::Q3_K, b, 256);
    EXPECT_FLOAT_EQ(y[227], 0.5f * 11 * 1);
    // Element 4 (scale 0 = 0 - 32, quant 0, mask clear): d·(-32)·(0 - 4).
    EXPECT_FLOAT_EQ(y[4], 0.5f * -32 * -4);
  }
  {  // Q5_K: element 64·2 + 32 + 7 is the high nibble of quant byte 48 + 64 + 7 with bit 5 of
     // fifth-bit byte 7, sub-block 5: scale (byte 9 low nibble | byte 1 bits 6-7 << 4), min
     // (byte 9 high nibble | byte 5 bits 6-7 << 4).
    std::vector<uint8_t> b(176, 0);
    put_fp16(&b[0], 0.5f);
    put_fp16(&b[2], 0.25f);
    b[4 + 9] = 0x32;         // scale low 2, min low 3
    b[4 + 1] = 0x40;         // scale top bits 1 -> 18
    b[4 + 5] = 0x80;         // min top bits 2 -> 35
    b[48 + 64 + 7] = 0x90;   // high nibble 9
    b[16 + 7] = 1 << 5;      // fifth bit -> 25
    const auto y = decode(DType::Q5_K, b, 256);
    EXPECT_FLOAT_EQ(y[167], 0.5f * 18 * 25 - 0.25f * 35);
  }
  {  // IQ4_XS: sub-block 3 scale = low nibble (byte 4 + 1, high nibble) | top bits (u16 bits 6-7);
     // element 96 + 16 + 2 is the high nibble of byte 8 + 48 + 2.
    std::vector<uint8_t> b(136, 0);
    put_fp16(&b[0], 0.5f);
    b[4 + 1] = 0x50;
    const uint16_t high = 3 << 6;  // scale 0x35 = 53 -> 21
    std::memcpy(&b[2], &high, 2);
    b[8 + 48 + 2] = 0xe0;  // level 14 = 89
    const auto y = decode(DType::IQ4_XS, b, 256);
    EXPECT_FLOAT_EQ(y[114], 0.5f * 21 * 89);
    EXPECT_FLOAT_EQ(y[98], 0.5f * 21 * -127);  // low nibble 0
  }
}

TEST(GgufBlockTypes, QuantizeThenDequantizeWithinTheTypesError) {
  const int64_t n = 4096;
  const auto x = gaussian(size_t(n), 5);
  for (const TypeInfo& i : kTypes) {
    SCOPED_TRACE(i.name);
    std::vector<uint8_t> q(dtype_row_bytes(i.t, n));
    quantize_row(i.t, x.data(), q.data(), n);
    const auto y = decode(i.t, q, n);
    double err2 = 0, x2 = 0;
    for (int64_t j = 0; j < n; ++j) {
      err2 += double(y[size_t(j)] - x[size_t(j)]) * (y[size_t(j)] - x[size_t(j)]);
      x2 += double(x[size_t(j)]) * x[size_t(j)];
    }
    const double rel = std::sqrt(err2 / x2);
    EXPECT_LT(rel, i.max_rel_rms);
    EXPECT_GT(rel, i.max_rel_rms / 8) << "suspiciously exact";
    // Quantizing the dequantized row again keeps it (nearly: the scale search may move a level).
    std::vector<uint8_t> q2(q.size());
    quantize_row(i.t, y.data(), q2.data(), n);
    const auto y2 = decode(i.t, q2, n);
    double moved = 0;
    for (int64_t j = 0; j < n; ++j) moved += double(y2[size_t(j)] - y[size_t(j)]) * (y2[size_t(j)] - y[size_t(j)]);
    EXPECT_LT(std::sqrt(moved / x2), i.max_rel_rms / 2);
    // Zeros stay zeros; a constant row stays close.
    std::vector<float> zeros(size_t(n), 0.0f);
    quantize_row(i.t, zeros.data(), q.data(), n);
    for (float v : decode(i.t, q, n)) ASSERT_EQ(v, 0.0f);
  }
}

// Every block type this file and gguf_iq_types_test cover: written, read back the same bytes.
TEST(GgufBlockTypes, BlocksSurviveAGgufFileByteForByte) {
  test::TempDir dir;
  const int64_t rows = 3, cols = 512;
  const auto x = gaussian(size_t(rows * cols), 9);
  std::vector<DType> types;
  for (const TypeInfo& i : kTypes) types.push_back(i.t);
  for (DType t : {DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S, DType::IQ3_XXS, DType::IQ3_S}) types.push_back(t);
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  std::vector<std::vector<uint8_t>> written;
  for (DType t : types) {
    std::vector<uint8_t> q(dtype_row_bytes(t, cols) * size_t(rows));
    for (int64_t r = 0; r < rows; ++r) {
      quantize_row(t, x.data() + r * cols, q.data() + size_t(r) * dtype_row_bytes(t, cols), cols);
    }
    written.push_back(q);
    w.add_tensor("t." + std::string(dtype_name(t)), {cols, rows}, t, q);
  }
  const std::string path = dir.path() + "/blocks.gguf";
  w.write(path);
  auto f = GgufFile::open(path);
  for (size_t k = 0; k < types.size(); ++k) {
    SCOPED_TRACE(std::string(dtype_name(types[k])));
    const GgufTensor* t = f->find_tensor("t." + std::string(dtype_name(types[k])));
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->dtype, types[k]);
    ASSERT_EQ(t->rows(), rows);
    EXPECT_EQ(0, std::memcmp(t->data, written[k].data(), written[k].size()));
  }
}

TEST(GgufBlockTypes, NonFiniteScalesAreFound) {
  const uint16_t nan = 0x7e00, inf = 0x7c00;
  // Offsets of each type's fp16 scales within its block.
  const std::vector<std::pair<DType, std::vector<size_t>>> scales = {
      {DType::Q4_1, {0, 2}}, {DType::Q5_0, {0}},      {DType::Q5_1, {0, 2}},   {DType::Q2_K, {80, 82}},
      {DType::Q3_K, {108}},  {DType::Q5_K, {0, 2}},   {DType::IQ4_NL, {0}},    {DType::IQ4_XS, {0}}};
  for (const auto& [t, offsets] : scales) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const int64_t cols = 512, rows = 3;
    const size_t row = dtype_row_bytes(t, cols);
    for (size_t at : offsets) {
      for (uint16_t bad : {nan, inf}) {
        std::vector<uint8_t> data(row * rows, 0);
        std::memcpy(&data[2 * row + dtype_block_bytes(t) + at], &bad, 2);  // row 2, block 1
        EXPECT_EQ(first_non_finite_row(t, data.data(), rows, cols), 2) << "offset " << at;
      }
    }
    std::vector<uint8_t> data(row * rows, 0);
    EXPECT_EQ(first_non_finite_row(t, data.data(), rows, cols), -1);
  }
}

}  // namespace
}  // namespace tessera
