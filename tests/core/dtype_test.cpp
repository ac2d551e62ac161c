// fp16/bf16 conversion and block dequantization against hand-built blocks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tessera/dtype.h"
#include "tessera/error.h"

namespace tessera {
namespace {

float bits_to_f32(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

void put_u16(std::vector<uint8_t>& buf, size_t at, uint16_t v) { std::memcpy(buf.data() + at, &v, 2); }

TEST(DtypeTest, Fp16KnownValues) {
  EXPECT_EQ(f32_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(f32_to_fp16(-2.0f), 0xC000);
  EXPECT_EQ(f32_to_fp16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_fp16(65504.0f), 0x7BFF);  // largest finite half
  EXPECT_EQ(fp16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(fp16_to_f32(0x3555), 0.333251953125f);
  EXPECT_EQ(fp16_to_f32(0x7BFF), 65504.0f);
  EXPECT_TRUE(std::signbit(fp16_to_f32(0x8000)));
}

TEST(DtypeTest, Fp16RoundsToNearestEven) {
  // 1 + 2^-11 lies halfway between 1 and the next half (1 + 2^-10): ties go to the even mantissa.
  EXPECT_EQ(f32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  EXPECT_EQ(f32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_EQ(f32_to_fp16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3C01);
  EXPECT_EQ(f32_to_fp16(65519.0f), 0x7BFF);  // below the halfway point to 65536
  EXPECT_EQ(f32_to_fp16(65520.0f), 0x7C00);  // halfway, even is "infinity"
  EXPECT_EQ(f32_to_fp16(1e6f), 0x7C00);
  EXPECT_EQ(f32_to_fp16(-1e6f), 0xFC00);
}

TEST(DtypeTest, Fp16SubnormalsInfNan) {
  const float tiny = std::ldexp(1.0f, -24);  // smallest half subnormal
  EXPECT_EQ(fp16_to_f32(0x0001), tiny);
  EXPECT_EQ(fp16_to_f32(0x03FF), 1023 * tiny);
  EXPECT_EQ(fp16_to_f32(0x8001), -tiny);
  EXPECT_EQ(f32_to_fp16(tiny), 0x0001);
  EXPECT_EQ(f32_to_fp16(0.5f * tiny), 0x0000);      // tie, rounds to even (0)
  EXPECT_EQ(f32_to_fp16(1.5f * tiny), 0x0002);      // tie, rounds to even (2)
  EXPECT_EQ(f32_to_fp16(0.51f * tiny), 0x0001);
  EXPECT_EQ(f32_to_fp16(1023.5f * tiny), 0x0400);   // carries into the smallest normal
  EXPECT_EQ(f32_to_fp16(std::ldexp(1.0f, -14)), 0x0400);
  EXPECT_EQ(f32_to_fp16(1e-10f), 0x0000);
  EXPECT_EQ(f32_to_fp16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(f32_to_fp16(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_TRUE(std::isinf(fp16_to_f32(0x7C00)));
  const uint16_t nan = f32_to_fp16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0);
  EXPECT_TRUE(std::isnan(fp16_to_f32(0x7E00)));
  EXPECT_TRUE(std::isnan(fp16_to_f32(0xFC01)));
}

TEST(DtypeTest, Fp16AllValuesRoundTrip) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_f32(f32_to_fp16(f)))) << h;
    } else {
      ASSERT_EQ(f32_to_fp16(f), h) << "half 0x" << std::hex << h;
    }
  }
}

TEST(DtypeTest, Bf16) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0xC040), -3.0f);
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);      // tie to even
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);  // tie to even (up)
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x00010000)), 0x0001);  // subnormal kept
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload sits only in the low bits must not become infinity.
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(bits_to_f32(0x7F800001)))));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(f32_to_bf16(f), h) << h;
    }
  }
}

TEST(DtypeTest, BlockSizes) {
  EXPECT_EQ(dtype_block_elems(DType::Q4_K), 256);
  EXPECT_EQ(dtype_block_bytes(DType::Q4_K), 144u);
  EXPECT_EQ(dtype_block_bytes(DType::Q6_K), 210u);
  EXPECT_EQ(dtype_row_bytes(DType::Q8_0, 64), 68u);
  EXPECT_THROW(dtype_row_bytes(DType::Q8_0, 33), Error);
}

TEST(DtypeTest, F16AndBf16Rows) {
  std::vector<uint8_t> buf(6);
  put_u16(buf, 0, 0x3C00);
  put_u16(buf, 2, 0xC000);
  put_u16(buf, 4, 0x0001);
  float out[3];
  dequantize_row(DType::F16, buf.data(), out, 3);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], std::ldexp(1.0f, -24));
  put_u16(buf, 0, 0x3F80);
  put_u16(buf, 2, 0xC040);
  dequantize_row(DType::BF16, buf.data(), out, 2);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -3.0f);
}

TEST(DtypeTest, Q8_0HandBuiltBlocks) {
  // Two blocks of 34 bytes: fp16 scale, then 32 int8.
  std::vector<uint8_t> buf(68);
  put_u16(buf, 0, 0x3800);   // 0.5
  put_u16(buf, 34, 0xC000);  // -2
  for (int i = 0; i < 32; ++i) {
    buf[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(i - 16));
    buf[36 + i] = static_cast<uint8_t>(static_cast<int8_t>(i == 0 ? -128 : 127 - i));
  }
  std::vector<float> out(64);
  dequantize_row(DType::Q8_0, buf.data(), out.data(), 64);
  EXPECT_EQ(out[0], -8.0f);
  EXPECT_EQ(out[16], 0.0f);
  EXPECT_EQ(out[31], 7.5f);
  EXPECT_EQ(out[32], 256.0f);   // -2 * -128
  EXPECT_EQ(out[33], -252.0f);  // -2 * 126
  for (int i = 1; i < 32; ++i) EXPECT_EQ(out[32 + i], -2.0f * static_cast<float>(127 - i));
  EXPECT_THROW(dequantize_row(DType::Q8_0, buf.data(), out.data(), 48), Error);
}

TEST(DtypeTest, Q4_0HandBuiltBlock) {
  // Low nibbles are elements 0..15, high nibbles 16..31, each offset by 8.
  std::vector<uint8_t> buf(18);
  put_u16(buf, 0, 0x4000);  // 2.0
  for (int j = 0; j < 16; ++j) buf[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  std::vector<float> out(32);
  dequantize_row(DType::Q4_0, buf.data(), out.data(), 32);
  EXPECT_EQ(out[0], -16.0f);   // 2 * (0 - 8)
  EXPECT_EQ(out[15], 14.0f);   // 2 * (15 - 8)
  EXPECT_EQ(out[16], 14.0f);   // high nibble of byte 0 = 15
  EXPECT_EQ(out[31], -16.0f);  // high nibble of byte 15 = 0
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 2.0f * static_cast<float>(j - 8));
    EXPECT_EQ(out[16 + j], 2.0f * static_cast<float>(7 - j));
  }
}

// Q4_K: 8 sub-blocks of 32; x = d * scale[k] * q - dmin * min[k], 6-bit scales/mins packed in 12
// bytes. The test packs them from the format description, independently of the decoder.
std::vector<uint8_t> make_q4k_block(uint16_t d, uint16_t dmin, const int sc[8], const int mn[8],
                                    int (*q_of)(int)) {
  std::vector<uint8_t> b(144, 0);
  put_u16(b, 0, d);
  put_u16(b, 2, dmin);
  uint8_t* s = b.data() + 4;
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<uint8_t>((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
  uint8_t* qs = b.data() + 16;
  for (int e = 0; e < 256; ++e) {
    const int k = e / 32, l = e % 32;
    uint8_t& byte = qs[32 * (k / 2) + l];
    byte = static_cast<uint8_t>(byte | (k % 2 == 0 ? q_of(e) : q_of(e) << 4));
  }
  return b;
}

TEST(DtypeTest, Q4_KHandBuiltBlocks) {
  const int sc[8] = {1, 63, 17, 40, 33, 50, 7, 62};
  const int mn[8] = {0, 5, 63, 12, 48, 2, 31, 60};
  auto q_of = [](int e) { return (e * 7 + 3) % 16; };
  std::vector<uint8_t> buf = make_q4k_block(0x3C00, 0x3800, sc, mn, q_of);  // d = 1, dmin = 0.5
  // Second super-block: same quants, d = 0.25, dmin = 2, scales reversed.
  const int sc2[8] = {62, 7, 50, 33, 40, 17, 63, 1};
  const int mn2[8] = {60, 31, 2, 48, 12, 63, 5, 0};
  const std::vector<uint8_t> b2 = make_q4k_block(0x3400, 0x4000, sc2, mn2, q_of);
  buf.insert(buf.end(), b2.begin(), b2.end());

  std::vector<float> out(512);
  dequantize_row(DType::Q4_K, buf.data(), out.data(), 512);
  // Worked by hand: element 0 (k=0): 1*1*3 - 0.5*0 = 3; element 32 (k=1, q=3): 63*3 - 0.5*5 = 186.5;
  // element 128 (k=4, uses the packed high bits, q=3): 33*3 - 0.5*48 = 75;
  // element 255 (k=7, q=12): 62*12 - 0.5*60 = 714.
  EXPECT_EQ(out[0], 3.0f);
  EXPECT_EQ(out[32], 186.5f);
  EXPECT_EQ(out[128], 75.0f);
  EXPECT_EQ(out[255], 714.0f);
  // Second block, element 256 (k=0, q=(256*7+3)%16=3): 0.25*62*3 - 2*60 = -73.5.
  EXPECT_EQ(out[256], -73.5f);
  for (int e = 0; e < 256; ++e) {
    const int k = e / 32;
    ASSERT_FLOAT_EQ(out[e], 1.0f * sc[k] * q_of(e) - 0.5f * mn[k]) << e;
    ASSERT_FLOAT_EQ(out[256 + e], 0.25f * sc2[k] * q_of(e) - 2.0f * mn2[k]) << e;
  }
  EXPECT_THROW(dequantize_row(DType::Q4_K, buf.data(), out.data(), 300), Error);
}

// Q6_K: 6-bit quants (low 4 bits in ql, high 2 in qh), int8 scale per 16 elements, fp16 d;
// x = d * scale[e/16] * (q - 32).
std::vector<uint8_t> make_q6k_block(uint16_t d, const int8_t scales[16], int (*q_of)(int)) {
  std::vector<uint8_t> b(210, 0);
  uint8_t* ql = b.data();
  uint8_t* qh = b.data() + 128;
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, g = (e % 128) / 32, l = e % 32;
    const int q = q_of(e);
    uint8_t& low = ql[64 * h + l + 32 * (g & 1)];
    low = static_cast<uint8_t>(low | (g < 2 ? (q & 15) : (q & 15) << 4));
    qh[32 * h + l] = static_cast<uint8_t>(qh[32 * h + l] | ((q >> 4) << (2 * g)));
  }
  std::memcpy(b.data() + 192, scales, 16);
  put_u16(b, 208, d);
  return b;
}

TEST(DtypeTest, Q6_KHandBuiltBlocks) {
  int8_t scales[16];
  for (int i = 0; i < 16; ++i) scales[i] = static_cast<int8_t>((i * 13) % 37 - 18);
  auto q_of = [](int e) { return (e * 11 + 5) % 64; };
  std::vector<uint8_t> buf = make_q6k_block(0x3400, scales, q_of);  // d = 0.25
  int8_t scales2[16];
  for (int i = 0; i < 16; ++i) scales2[i] = static_cast<int8_t>(i % 2 ? 127 : -128);
  auto q2_of = [](int e) { return 63 - e % 64; };
  const std::vector<uint8_t> b2 = make_q6k_block(0xC000, scales2, q2_of);  // d = -2
  buf.insert(buf.end(), b2.begin(), b2.end());

  std::vector<float> out(512);
  dequantize_row(DType::Q6_K, buf.data(), out.data(), 512);
  // By hand: element 0: 0.25 * (-18) * (5 - 32) = 121.5; element 255: q = 2810 % 64 = 58,
  // scale[15] = 195 % 37 - 18 = -8: 0.25 * -8 * 26 = -52.
  EXPECT_EQ(out[0], 121.5f);
  EXPECT_EQ(out[255], -52.0f);
  // Second block, element 256: -2 * -128 * (63 - 32) = 7936; element 511: -2 * 127 * (0 - 32) = 8128.
  EXPECT_EQ(out[256], 7936.0f);
  EXPECT_EQ(out[511], 8128.0f);
  for (int e = 0; e < 256; ++e) {
    ASSERT_FLOAT_EQ(out[e], 0.25f * scales[e / 16] * (q_of(e) - 32)) << e;
    ASSERT_FLOAT_EQ(out[256 + e], -2.0f * scales2[e / 16] * (q2_of(e) - 32)) << e;
  }
  EXPECT_THROW(dequantize_row(DType::Q6_K, buf.data(), out.data(), 128), Error);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// Two rows of `t` (cols elements each), zero-filled, with the 16-bit word at byte `at` of row 1 set
// to `word`: the row first_non_finite_row must name, or none when the word is finite.
int64_t non_finite_row_with(DType t, int64_t cols, size_t at, uint16_t word) {
  std::vector<uint8_t> rows(2 * dtype_row_bytes(t, cols), 0);
  std::memcpy(rows.data() + dtype_row_bytes(t, cols) + at, &word, 2);
  return first_non_finite_row(t, rows.data(), 2, cols);
}

TEST(DtypeTest, FirstNonFiniteRowFindsNanAndInfinityInElementsAndBlockScales) {
  const uint16_t fp16_inf = 0x7c00, fp16_nan = 0x7e00, bf16_nan = 0x7fc0, finite = 0x3c00;
  EXPECT_EQ(non_finite_row_with(DType::F16, 64, 2 * 9, fp16_inf), 1);
  EXPECT_EQ(non_finite_row_with(DType::F16, 64, 2 * 9, finite), -1);
  EXPECT_EQ(non_finite_row_with(DType::BF16, 64, 2 * 63, bf16_nan), 1);
  EXPECT_EQ(non_finite_row_with(DType::F32, 64, 4 * 7 + 2, bf16_nan), 1);  // the high half of a float
  EXPECT_EQ(non_finite_row_with(DType::Q8_0, 64, 34, fp16_nan), 1);        // second block's scale
  EXPECT_EQ(non_finite_row_with(DType::Q8_0, 64, 34 + 5, 0xffff), -1);     // quants are integers
  EXPECT_EQ(non_finite_row_with(DType::Q4_0, 64, 18, fp16_inf), 1);
  EXPECT_EQ(non_finite_row_with(DType::Q4_K, 256, 2, fp16_nan), 1);  // dmin
  EXPECT_EQ(non_finite_row_with(DType::Q4_K, 256, 16, 0xffff), -1);
  EXPECT_EQ(non_finite_row_with(DType::Q6_K, 512, 210 + 208, fp16_inf), 1);  // second super-block's d
  EXPECT_EQ(non_finite_row_with(DType::Q6_K, 512, 200, 0xffff), -1);         // its int8 scales
}

}  // namespace
}  // namespace tessera
