// The GGUF codebook formats IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S: sizes, names and ggml ids;
// hand-built blocks decoding to the values ggml's layout and codebooks define; Tessera's decoding of
// quantized blocks equal bit for bit to the independent NumPy one (tests/reference/gguf_read.py);
// quantize -> dequantize within each type's error (blocks surviving a GGUF file: gguf_block_types_test); and
// non-finite scales found.
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tessera/dtype.h"
#include "tessera/gguf.h"
#include "tessera/gguf_writer.h"
#include "tessera/iq_grids.h"
#include "tessera/quantize_blocks.h"
#include "test_util.h"

namespace tessera {
namespace {

struct TypeInfo {
  DType t;
  const char* name;
  size_t bytes;
  uint32_t ggml_id;
  double max_rel_rms;  // quantize -> dequantize error on Gaussian rows, relative to their RMS
};

// Errors measured on these rows (0.36, 0.32, 0.27, 0.21, 0.17) with margin.
const TypeInfo kTypes[] = {
    {DType::IQ2_XXS, "iq2_xxs", 66, 16, 0.40}, {DType::IQ2_XS, "iq2_xs", 74, 17, 0.35},
    {DType::IQ2_S, "iq2_s", 82, 22, 0.30},     {DType::IQ3_XXS, "iq3_xxs", 98, 18, 0.24},
    {DType::IQ3_S, "iq3_s", 110, 21, 0.19},
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

int mag(uint64_t entry, int i) { return int((entry >> (8 * i)) & 255); }

TEST(GgufIqTypes, SizesNamesAndGgmlIds) {
  for (const TypeInfo& i : kTypes) {
    SCOPED_TRACE(i.name);
    EXPECT_EQ(dtype_name(i.t), i.name);
    EXPECT_EQ(dtype_block_elems(i.t), 256);
    EXPECT_EQ(dtype_block_bytes(i.t), i.bytes);
    EXPECT_EQ(GgufWriter::ggml_type_id(i.t), i.ggml_id);
    EXPECT_TRUE(quantize_supported(i.t));
    EXPECT_THAT(test::message_of([&] { dtype_row_bytes(i.t, 257); }), testing::HasSubstr(i.name));
  }
  // The codebooks' first and last entries as ggml has them; sign codes with an even count.
  EXPECT_EQ(kIq2XxsGrid[0], 0x0808080808080808ull);
  EXPECT_EQ(kIq2XxsGrid[255], 0x2b2b2b1908081908ull);
  EXPECT_EQ(kIq2XsGrid[511], 0x2b2b2b2b2b2b2b2bull);
  EXPECT_EQ(kIq2SGrid[1023], 0x2b2b2b2b2b2b2b2bull);
  EXPECT_EQ(kIq3XxsGrid[255], 0x3e341c04u);
  EXPECT_EQ(kIq3SGrid[511], 0x0f0f0101u);
  for (int s = 0; s < 128; ++s) {
    EXPECT_EQ(kIqSigns[s] & 127, s);
    EXPECT_EQ(__builtin_popcount(kIqSigns[s]) % 2, 0) << s;
  }
}

// One group per type built from ggml's layout; expected values from the format's formula.
TEST(GgufIqTypes, HandBuiltBlocks) {
  {  // IQ2_XXS: d = 2; block of 32 #1, group 1 (elements 40-47): entry 3, sign code 5, l = 6.
    std::vector<uint8_t> b(66, 0);
    put_fp16(&b[0], 2.0f);
    b[2 + 8 + 1] = 3;
    const uint32_t aux = (5u << 7) | (6u << 28);
    std::memcpy(&b[2 + 8 + 4], &aux, 4);
    const auto y = decode(DType::IQ2_XXS, b, 256);
    const float db = 2.0f * (0.5f + 6) * 0.25f;
    EXPECT_FLOAT_EQ(y[40], -db * mag(kIq2XxsGrid[3], 0));  // code 5: elements 0 and 2 negative
    EXPECT_FLOAT_EQ(y[41], db * mag(kIq2XxsGrid[3], 1));
    EXPECT_FLOAT_EQ(y[42], -db * mag(kIq2XxsGrid[3], 2));
    EXPECT_FLOAT_EQ(y[47], db * mag(kIq2XxsGrid[3], 7));
    EXPECT_FLOAT_EQ(y[32], db * mag(kIq2XxsGrid[0], 0));  // group 0 of the same 32: entry 0
  }
  {  // IQ2_XS: d = 1; group 6 = u16 #6: entry 300, sign code 1 (-> bits 0 and 7); scales byte 1
     // = 0x94: elements 48-63 (group 6's 16) take l = 9.
    std::vector<uint8_t> b(74, 0);
    put_fp16(&b[0], 1.0f);
    const uint16_t q = uint16_t(300 | (1 << 9));
    std::memcpy(&b[2 + 12], &q, 2);
    b[66 + 1] = 0x94;
    const auto y = decode(DType::IQ2_XS, b, 256);
    const float db = (0.5f + 9) * 0.25f;
    EXPECT_FLOAT_EQ(y[48], -db * mag(kIq2XsGrid[300], 0));
    EXPECT_FLOAT_EQ(y[49], db * mag(kIq2XsGrid[300], 1));
    EXPECT_FLOAT_EQ(y[55], -db * mag(kIq2XsGrid[300], 7));
    EXPECT_FLOAT_EQ(y[32], (0.5f + 4) * 0.25f * mag(kIq2XsGrid[0], 0));  // elements 32-47: l = 4
  }
  {  // IQ2_S: d = 0.5; group 5 (block 1, group 1): low byte 0x21, high bits 3 (qh byte 1 bits 2-3)
     // -> entry 0x321; sign byte 0x80; scales byte 1 low nibble 2.
    std::vector<uint8_t> b(82, 0);
    put_fp16(&b[0], 0.5f);
    b[2 + 5] = 0x21;
    b[66 + 1] = 3 << 2;
    b[34 + 5] = 0x80;
    b[74 + 1] = 0x02;
    const auto y = decode(DType::IQ2_S, b, 256);
    const float db = 0.5f * (0.5f + 2) * 0.25f;
    EXPECT_FLOAT_EQ(y[40], db * mag(kIq2SGrid[0x321], 0));
    EXPECT_FLOAT_EQ(y[47], -db * mag(kIq2SGrid[0x321], 7));
  }
  {  // IQ3_XXS: d = 1; block 2, group 3 (elements 88-95): entries 7 and 200, sign code 64 (bits 6, 7),
     // l = 15.
    std::vector<uint8_t> b(98, 0);
    put_fp16(&b[0], 1.0f);
    b[2 + 16 + 6] = 7;
    b[2 + 16 + 7] = 200;
    const uint32_t aux = (64u << 21) | (15u << 28);
    std::memcpy(&b[66 + 8], &aux, 4);
    const auto y = decode(DType::IQ3_XXS, b, 256);
    const float db = (0.5f + 15) * 0.5f;
    EXPECT_FLOAT_EQ(y[88], db * mag(kIq3XxsGrid[7], 0));
    EXPECT_FLOAT_EQ(y[92], db * mag(kIq3XxsGrid[200], 0));
    EXPECT_FLOAT_EQ(y[94], -db * mag(kIq3XxsGrid[200], 2));
    EXPECT_FLOAT_EQ(y[95], -db * mag(kIq3XxsGrid[200], 3));
  }
  {  // IQ3_S: d = 0.25; block 3, entry 5 (elements 116-119, group 14's second half): low byte 9,
     // ninth bit = qh byte 3 bit 5 -> entry 265; sign byte 14 = 0x20 (element 117); scales byte 1
     // high nibble (block 3) = 7.
    std::vector<uint8_t> b(110, 0);
    put_fp16(&b[0], 0.25f);
    b[2 + 24 + 5] = 9;
    b[66 + 3] = 1 << 5;
    b[74 + 14] = 0x20;
    b[106 + 1] = 0x70;
    const auto y = decode(DType::IQ3_S, b, 256);
    const float db = 0.25f * (1 + 2 * 7);
    EXPECT_FLOAT_EQ(y[116], db * mag(kIq3SGrid[265], 0));
    EXPECT_FLOAT_EQ(y[117], -db * mag(kIq3SGrid[265], 1));
    EXPECT_FLOAT_EQ(y[119], db * mag(kIq3SGrid[265], 3));
  }
}

bool have_numpy() { return std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0; }

// Quantized Gaussian rows of every type (and a row with a zero sub-block and outliers) decode to the
// same floats in Tessera and in the NumPy reader.
TEST(GgufIqTypes, DequantizationMatchesNumpy) {
  if (!have_numpy()) GTEST_SKIP() << "/usr/bin/python3 with NumPy (Debian's python3-numpy) is needed";
  test::TempDir dir;
  const int64_t rows = 3, cols = 512;
  auto x = gaussian(size_t(rows * cols), 21);
  for (int i = 0; i < 32; ++i) x[size_t(cols + i)] = 0.0f;
  x[size_t(2 * cols + 7)] = 40.0f;
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  for (const TypeInfo& i : kTypes) {
    const size_t row = dtype_row_bytes(i.t, cols);
    std::vector<uint8_t> q(row * size_t(rows));
    std::vector<float> d(size_t(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
      quantize_row(i.t, x.data() + r * cols, q.data() + size_t(r) * row, cols);
      dequantize_row(i.t, q.data() + size_t(r) * row, d.data() + r * cols, cols);
    }
    std::vector<uint8_t> dbytes(d.size() * 4);
    std::memcpy(dbytes.data(), d.data(), dbytes.size());
    w.add_tensor(std::string("q.") + i.name, {cols, rows}, i.t, q);
    w.add_tensor(std::string("d.") + i.name, {cols, rows}, DType::F32, dbytes);
  }
  const std::string path = dir.path() + "/iq.gguf";
  w.write(path);
  const std::string cmd = "/usr/bin/python3 " TESSERA_SOURCE_DIR "/tests/reference/check_iq_dequant.py '" + path + "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[512];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << out;
  EXPECT_THAT(out, testing::HasSubstr("5 types agree"));
}

TEST(GgufIqTypes, QuantizeDequantizeWithinEachTypesError) {
  const int64_t n = 256 * 16;
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
    // Same input, same blocks (no state between calls).
    std::vector<uint8_t> again(q.size());
    quantize_row(i.t, x.data(), again.data(), n);
    EXPECT_EQ(again, q);
    // Zeros stay zeros; a scaled row keeps its error.
    std::vector<float> zeros(size_t(n), 0.0f);
    quantize_row(i.t, zeros.data(), q.data(), n);
    for (float v : decode(i.t, q, n)) ASSERT_EQ(v, 0.0f);
  }
}

TEST(GgufIqTypes, NonFiniteScalesAreFound) {
  for (const TypeInfo& i : kTypes) {
    SCOPED_TRACE(i.name);
    const int64_t cols = 512, rows = 3;
    const size_t row = dtype_row_bytes(i.t, cols);
    for (uint16_t bad : {uint16_t(0x7e00), uint16_t(0x7c00)}) {
      std::vector<uint8_t> data(row * rows, 0);
      std::memcpy(&data[2 * row + i.bytes], &bad, 2);  // row 2, block 1
      EXPECT_EQ(first_non_finite_row(i.t, data.data(), rows, cols), 2);
    }
    std::vector<uint8_t> data(row * rows, 0);
    EXPECT_EQ(first_non_finite_row(i.t, data.data(), rows, cols), -1);
  }
}

}  // namespace
}  // namespace tessera
