#include "tessera/dtype.h"

#include <cmath>
#include <cstring>
#include <string>

#include "gguf/block_formats.h"
#include "tessera/error.h"

namespace tessera {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::I8: return "int8";
    case DType::I32: return "int32";
    case DType::I4: return "int4";
    case DType::Q8_0: return "q8_0";
    case DType::Q4_0: return "q4_0";
    case DType::Q4_K: return "q4_k";
    case DType::Q6_K: return "q6_k";
    case DType::Q4_1: return "q4_1";
    case DType::Q5_0: return "q5_0";
    case DType::Q5_1: return "q5_1";
    case DType::Q2_K: return "q2_k";
    case DType::Q3_K: return "q3_k";
    case DType::Q5_K: return "q5_k";
    case DType::IQ4_NL: return "iq4_nl";
    case DType::IQ4_XS: return "iq4_xs";
    case DType::IQ2_XXS: return "iq2_xxs";
    case DType::IQ2_XS: return "iq2_xs";
    case DType::IQ2_S: return "iq2_s";
    case DType::IQ3_XXS: return "iq3_xxs";
    case DType::IQ3_S: return "iq3_s";
  }
  return "?";
}

int64_t dtype_block_elems(DType t) {
  switch (t) {
    case DType::I4: return 2;
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::IQ4_NL: return 32;
    case DType::Q4_K:
    case DType::Q6_K:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q5_K:
    case DType::IQ4_XS:
    case DType::IQ2_XXS:
    case DType::IQ2_XS:
    case DType::IQ2_S:
    case DType::IQ3_XXS:
    case DType::IQ3_S: return 256;
    default: return 1;
  }
}

size_t dtype_block_bytes(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16:
    case DType::BF16: return 2;
    case DType::I8: return 1;
    case DType::I32: return 4;
    case DType::I4: return 1;
    case DType::Q8_0: return 2 + 32;
    case DType::Q4_0: return 2 + 16;
    case DType::Q4_K: return 2 + 2 + 12 + 128;
    case DType::Q6_K: return 128 + 64 + 16 + 2;
    case DType::Q4_1: return 2 + 2 + 16;
    case DType::Q5_0: return 2 + 4 + 16;
    case DType::Q5_1: return 2 + 2 + 4 + 16;
    case DType::Q2_K: return 16 + 64 + 2 + 2;
    case DType::Q3_K: return 32 + 64 + 12 + 2;
    case DType::Q5_K: return 2 + 2 + 12 + 32 + 128;
    case DType::IQ4_NL: return 2 + 16;
    case DType::IQ4_XS: return 2 + 2 + 4 + 128;
    case DType::IQ2_XXS: return 2 + 64;
    case DType::IQ2_XS: return 2 + 64 + 8;
    case DType::IQ2_S: return 2 + 64 + 8 + 8;
    case DType::IQ3_XXS: return 2 + 96;
    case DType::IQ3_S: return 2 + 64 + 8 + 32 + 4;
  }
  return 0;
}

size_t dtype_row_bytes(DType t, int64_t n) {
  const int64_t be = dtype_block_elems(t);
  if (n < 0 || n % be != 0) {
    throw Error("a row of " + std::to_string(n) + " elements is not a whole number of " +
                std::string(dtype_name(t)) + " blocks (" + std::to_string(be) + " each)");
  }
  return static_cast<size_t>(n / be) * dtype_block_bytes(t);
}

bool dtype_is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

float fp16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: value = mant * 2^-24
      float f = std::ldexp(static_cast<float>(mant), -24);
      std::memcpy(&bits, &f, 4);
      bits |= sign;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

uint16_t f32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0));
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00);  // overflow to inf
  if (absx < 0x38800000u) {  // subnormal or zero in half precision
    float a;
    std::memcpy(&a, &absx, 4);
    const float scaled = a * 16777216.0f;  // 2^24
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
  }
  // Normal: round to nearest even on the 13 dropped bits.
  const uint32_t mant_rounded = absx + 0xfff + ((absx >> 13) & 1);
  return static_cast<uint16_t>(sign | ((mant_rounded - 0x38000000u) >> 13));
}

float bf16_to_f32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

uint16_t f32_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN
  x += 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

namespace {

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

void dequantize_q8_0(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, src += 34) {
    const float d = fp16_to_f32(load_u16(src));
    const auto* q = reinterpret_cast<const int8_t*>(src + 2);
    for (int i = 0; i < 32; ++i) dst[b * 32 + i] = d * static_cast<float>(q[i]);
  }
}

void dequantize_q4_0(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, src += 18) {
    const float d = fp16_to_f32(load_u16(src));
    const uint8_t* q = src + 2;
    for (int i = 0; i < 16; ++i) {
      dst[b * 32 + i] = d * static_cast<float>((q[i] & 0x0f) - 8);
      dst[b * 32 + i + 16] = d * static_cast<float>((q[i] >> 4) - 8);
    }
  }
}

}  // namespace

void dequantize_kquant_row(DType t, const uint8_t* src, float* dst, int64_t n);  // dtype_kquant.cpp

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  dtype_row_bytes(t, n);  // validates n against the block size
  const auto* s = static_cast<const uint8_t*>(src);
  switch (t) {
    case DType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_f32(load_u16(s + 2 * i));
      return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load_u16(s + 2 * i));
      return;
    case DType::Q8_0: dequantize_q8_0(s, dst, n); return;
    case DType::Q4_0: dequantize_q4_0(s, dst, n); return;
    case DType::Q4_K:
    case DType::Q6_K: dequantize_kquant_row(t, s, dst, n); return;
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::IQ4_NL: gguf_blocks::dequantize_block32_row(t, s, dst, n); return;
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q5_K:
    case DType::IQ4_XS: gguf_blocks::dequantize_superblock_row(t, s, dst, n); return;
    case DType::IQ2_XXS:
    case DType::IQ2_XS:
    case DType::IQ2_S:
    case DType::IQ3_XXS:
    case DType::IQ3_S: gguf_blocks::dequantize_iq23_row(t, s, dst, n); return;
    default: break;
  }
  throw Error("cannot convert " + std::string(dtype_name(t)) + " to f32");
}

namespace {

// Whether any of n 16- or 32-bit words (stride apart, starting at p) has its exponent field all
// ones: an infinity or a NaN. A bit test the compiler vectorizes, unlike std::isfinite.
template <class Word>
bool any_exponent_all_ones(const uint8_t* p, int64_t n, size_t stride, Word exponent) {
  Word hits = 0;
  for (int64_t i = 0; i < n; ++i) {
    Word w;
    std::memcpy(&w, p + size_t(i) * stride, sizeof w);
    hits |= Word((w & exponent) == exponent);
  }
  return hits != 0;
}

}  // namespace

int64_t first_non_finite_row(DType t, const void* data, int64_t rows, int64_t cols) {
  const size_t row_bytes = dtype_row_bytes(t, cols);
  const int64_t blocks = cols / dtype_block_elems(t);
  const auto* base = static_cast<const uint8_t*>(data);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = base + size_t(r) * row_bytes;
    bool bad = false;
    switch (t) {
      case DType::F32: bad = any_exponent_all_ones<uint32_t>(row, cols, 4, 0x7f800000u); break;
      case DType::F16: bad = any_exponent_all_ones<uint16_t>(row, cols, 2, 0x7c00); break;
      case DType::BF16: bad = any_exponent_all_ones<uint16_t>(row, cols, 2, 0x7f80); break;
      // Block formats: their fp16 scales (the quants are integers).
      case DType::Q8_0:
      case DType::Q4_0: bad = any_exponent_all_ones<uint16_t>(row, blocks, dtype_block_bytes(t), 0x7c00); break;
      case DType::Q4_K:  // d, then dmin
        bad = any_exponent_all_ones<uint16_t>(row, blocks, dtype_block_bytes(t), 0x7c00) ||
              any_exponent_all_ones<uint16_t>(row + 2, blocks, dtype_block_bytes(t), 0x7c00);
        break;
      case DType::Q6_K: bad = any_exponent_all_ones<uint16_t>(row + 208, blocks, dtype_block_bytes(t), 0x7c00); break;
      // One fp16 scale first, or a scale and a min (dmin) after it.
      case DType::Q5_0:
      case DType::IQ4_NL:
      case DType::IQ4_XS:
      case DType::IQ2_XXS:
      case DType::IQ2_XS:
      case DType::IQ2_S:
      case DType::IQ3_XXS:
      case DType::IQ3_S: bad = any_exponent_all_ones<uint16_t>(row, blocks, dtype_block_bytes(t), 0x7c00); break;
      case DType::Q4_1:
      case DType::Q5_1:
      case DType::Q5_K:
        bad = any_exponent_all_ones<uint16_t>(row, blocks, dtype_block_bytes(t), 0x7c00) ||
              any_exponent_all_ones<uint16_t>(row + 2, blocks, dtype_block_bytes(t), 0x7c00);
        break;
      case DType::Q2_K:  // d, dmin at the end
        bad = any_exponent_all_ones<uint16_t>(row + 80, blocks, dtype_block_bytes(t), 0x7c00) ||
              any_exponent_all_ones<uint16_t>(row + 82, blocks, dtype_block_bytes(t), 0x7c00);
        break;
      case DType::Q3_K: bad = any_exponent_all_ones<uint16_t>(row + 108, blocks, dtype_block_bytes(t), 0x7c00); break;
      default: break;  // integers are finite
    }
    if (bad) return r;
  }
  return -1;
}

}  // namespace tessera
